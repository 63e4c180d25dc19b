// SPDX-License-Identifier: Apache-2.0
//
// The task catalogue (reference s.3.1): each PCP coordination task as a
// finite list of cases "these local inputs -> these allowed outputs", from
// which the input complex I, the output complex O and the task carrier
// Delta: I -> 2^O are built. Labels are symbols naming the protocol state
// ("lease.reserved"), so a report reads in the protocol's own words.

#include <string.h>

#include "topology/protocols_impl.h"

#define HUB(n) \
  { PCP_TOPOLOGY_COLOR_HUB, (n) }
#define GW(n) \
  { PCP_TOPOLOGY_COLOR_GATEWAY, (n) }
#define WK(n) \
  { PCP_TOPOLOGY_COLOR_WORKER, (n) }
#define API(n) \
  { PCP_TOPOLOGY_COLOR_API_CALLER, (n) }
#define JOB(n) \
  { PCP_TOPOLOGY_COLOR_JOB, (n) }
#define SES(n) \
  { PCP_TOPOLOGY_COLOR_SESSION, (n) }

static const pcp_topology_task_case_t kMessageDispatchCases[] = {
    {2,
     {GW(0), WK(0)},
     {"StartDecoupledDilocoLoop", "handler.decoupled_training"},
     1,
     {{"dispatch.controller_to_worker", "accepted.decoupled_training"}}},
    {2,
     {GW(0), WK(0)},
     {"StartGeneration", "handler.inference"},
     1,
     {{"dispatch.controller_to_worker", "accepted.inference"}}},
    {2,
     {GW(0), WK(0)},
     {"queue.worker_result", "DecoupledFragmentUpdate"},
     1,
     {{"dispatch.gateway_queue_only", "rejected.worker_result_to_worker"}}},
    {2,
     {GW(0), WK(0)},
     {"message.unknown", "handler.unknown"},
     1,
     {{"dispatch.fail_closed", "rejected.unknown_message"}}},
};

static const pcp_topology_task_case_t kWorkloadCases[] = {
    {3,
     {API(0), GW(0), JOB(1)},
     {"request.regular", "parser.training.regular", "job.training.regular"},
     1,
     {{"status.accepted", "route.regular_training", "job.normalized.regular"}}},
    {3,
     {API(0), GW(0), JOB(1)},
     {"request.invalid", "parser.training.invalid", "job.training.invalid"},
     1,
     {{"status.rejected", "route.rejected", "job.rejected"}}},
};

static const pcp_topology_task_case_t kLeaseCases[] = {
    {3,
     {GW(0), JOB(10), WK(0)},
     {"pool.idle_capacity", "lease.training.request",
      "worker.cuda.idle.available"},
     1,
     {{"lease.reserved", "reservation.active", "worker.leased.training"}}},
    {3,
     {GW(0), JOB(11), WK(0)},
     {"policy.training.max_workers_reached", "lease.training.request",
      "worker.cuda.idle.maxed"},
     1,
     {{"lease.rejected.max_workers", "reservation.rejected",
       "worker.unleased"}}},
    {3,
     {GW(0), JOB(12), WK(0)},
     {"policy.inference.reserved_workers", "lease.training.request",
      "worker.cuda.last_inference_capacity"},
     1,
     {{"lease.deferred.preserve_capacity", "reservation.deferred",
       "worker.reserved_for_inference"}}},
};

static const pcp_topology_task_case_t kReservationCases[] = {
    {3,
     {GW(0), JOB(20), WK(0)},
     {"reservation.active", "reservation.commit", "worker.reserved.training"},
     1,
     {{"reservation.committed", "job.queued_reserved",
       "worker.leased.training"}}},
    {3,
     {GW(0), JOB(21), WK(0)},
     {"reservation.active.release", "reservation.release",
      "worker.reserved.training.release"},
     1,
     {{"reservation.released", "job.not_queued", "worker.idle"}}},
    {3,
     {GW(0), JOB(22), WK(0)},
     {"reservation.active.expire", "reservation.expire",
      "worker.reserved.training.expire"},
     1,
     {{"reservation.expired", "job.not_queued", "worker.idle"}}},
    {3,
     {GW(0), JOB(23), WK(0)},
     {"queue.reserved_job", "reservation.cancel", "worker.leased.queued_job"},
     1,
     {{"reservation.canceled.cleanup_complete", "job.canceled",
       "worker.idle"}}},
};

static const pcp_topology_task_case_t kFederationCases[] = {
    {3,
     {HUB(0), GW(1), JOB(30)},
     {"registry.current", "gateway.connected.compatible",
      "job.requires.training"},
     2,
     {{"placement.placed", "gateway.route.accepted", "job.forwarded"},
      {"placement.failed_after_loss", "gateway.route_lost",
       "job.failed_retryable"}}},
    {3,
     {HUB(0), GW(1), JOB(31)},
     {"registry.stale_gateway", "gateway.stale.compatible",
      "job.requires.training"},
     1,
     {{"placement.rejected.stale", "gateway.not_selected", "job.rejected"}}},
    {3,
     {HUB(0), GW(1), JOB(32)},
     {"registry.current.incompatible", "gateway.connected.incompatible",
      "job.requires.training"},
     1,
     {{"placement.rejected.incompatible", "gateway.not_selected",
       "job.rejected"}}},
};

static const pcp_topology_task_case_t kDecoupledCases[] = {
    {3,
     {GW(0), SES(40), WK(0)},
     {"window.open.quorum", "session.active",
      "fragment.fresh.unique_sender.quorum"},
     1,
     {{"merge.committed", "session.progressed", "update.accepted"}}},
    {3,
     {GW(0), SES(41), WK(0)},
     {"window.open.below_quorum", "session.active",
      "fragment.fresh.unique_sender.below_quorum"},
     1,
     {{"merge.deferred", "session.waiting", "update.pending"}}},
    {3,
     {GW(0), SES(42), WK(0)},
     {"window.open.duplicate_sender", "session.active",
      "fragment.duplicate_update"},
     1,
     {{"merge.not_committed", "session.active", "update.rejected.duplicate"}}},
    {3,
     {GW(0), SES(43), WK(0)},
     {"window.open.context_check", "session.active",
      "fragment.context_payload_mismatch"},
     1,
     {{"merge.not_committed", "session.active", "update.rejected.context"}}},
    {3,
     {GW(0), SES(44), WK(0)},
     {"window.open.vector_clock", "session.active",
      "fragment.stale_vector_clock"},
     1,
     {{"merge.not_committed", "session.active",
       "update.rejected.vector_clock"}}},
    {3,
     {GW(0), SES(45), WK(0)},
     {"window.canceled", "session.canceled", "fragment.post_cancel"},
     1,
     {{"merge.canceled", "session.canceled", "update.rejected.post_cancel"}}},
};

static const pcp_topology_task_case_t kRdaCases[] = {
    {3,
     {GW(0), SES(50), WK(0)},
     {"merge_kind.rda.direction", "window.quorum",
      "participants.direction_nonzero"},
     1,
     {{"rda.output.direction_norm_carried", "merge.committed",
       "participants.used"}}},
    {3,
     {GW(0), SES(51), WK(0)},
     {"merge_kind.rda.degenerate", "window.quorum",
      "participants.direction_degenerate"},
     1,
     {{"rda.output.zero", "merge.committed",
       "participants.canceling_direction"}}},
    {3,
     {GW(0), SES(52), WK(0)},
     {"merge_kind.rda.below_quorum", "window.below_quorum",
      "participants.insufficient"},
     1,
     {{"rda.output.none", "merge.deferred", "participants.insufficient"}}},
};

static const pcp_topology_task_case_t kGlobalJobCases[] = {
    {4,
     {HUB(0), JOB(60), GW(1), GW(2)},
     {"global_job.accepted", "job.requires_two_gateways",
      "gateway_a.placed.commit", "gateway_b.placed.commit"},
     1,
     {{"global_job.committed", "job.running", "gateway_a.committed",
       "gateway_b.committed"}}},
    {4,
     {HUB(0), JOB(61), GW(1), GW(2)},
     {"global_job.accepted.partial_loss", "job.requires_two_gateways",
      "gateway_a.placed.partial_loss", "gateway_b.lost"},
     1,
     {{"global_job.rollback", "job.retryable", "gateway_a.release",
       "gateway_b.failed"}}},
    {4,
     {HUB(0), JOB(62), GW(1), GW(2)},
     {"global_job.cancel_requested", "job.canceling", "gateway_a.placed.cancel",
      "gateway_b.queued"},
     1,
     {{"global_job.canceled", "job.canceled", "gateway_a.cleanup",
       "gateway_b.cleanup"}}},
    {4,
     {HUB(0), JOB(63), GW(1), GW(2)},
     {"global_job.capacity_wait", "job.requires_two_gateways",
      "gateway_a.placed.capacity_wait", "gateway_b.no_capacity"},
     1,
     {{"global_job.deferred", "job.queued", "gateway_a.hold_or_release",
       "gateway_b.await_capacity"}}},
};

#define CASES(array) array, PCP_ARRAYSIZE(array)

static const pcp_topology_task_definition_t kTasks[] = {
    {PCP_TOPOLOGY_TASK_MESSAGE_DISPATCH, "message_dispatch", "message dispatch",
     "src/topology/protocol_stubs.c (message catalogue) + worker task handlers",
     PCP_TOPOLOGY_EVIDENCE_PRODUCTION_FIXTURE, false,
     CASES(kMessageDispatchCases)},
    {PCP_TOPOLOGY_TASK_WORKLOAD_NORMALIZATION, "workload_normalization",
     "workload normalization",
     "src/topology/protocol_stubs.c (training request kind and route)",
     PCP_TOPOLOGY_EVIDENCE_PRODUCTION_FIXTURE, false, CASES(kWorkloadCases)},
    {PCP_TOPOLOGY_TASK_GATEWAY_LEASE_SCHEDULING, "gateway_lease_scheduling",
     "gateway lease-owner scheduling",
     "src/topology/protocol_stubs.c (scheduler lease rules)",
     PCP_TOPOLOGY_EVIDENCE_GENERATED_XI, false, CASES(kLeaseCases)},
    {PCP_TOPOLOGY_TASK_RESERVATION_LIFECYCLE, "reservation_lifecycle",
     "reservation lifecycle",
     "src/topology/protocol_stubs.c (reservations, embedded job queue)",
     PCP_TOPOLOGY_EVIDENCE_GENERATED_XI, false, CASES(kReservationCases)},
    {PCP_TOPOLOGY_TASK_FEDERATION_PLACEMENT, "federation_placement",
     "federation placement",
     "src/topology/protocol_stubs.c (hub gateway registry)",
     PCP_TOPOLOGY_EVIDENCE_BOUNDED_MODEL, false, CASES(kFederationCases)},
    {PCP_TOPOLOGY_TASK_DECOUPLED_FRAGMENT, "decoupled_fragment",
     "gateway-local Decoupled DiLoCo fragment",
     "src/topology/protocol_stubs.c (decoupled session window, event tape)",
     PCP_TOPOLOGY_EVIDENCE_GENERATED_XI, false, CASES(kDecoupledCases)},
    {PCP_TOPOLOGY_TASK_RDA_MERGE, "rda_merge", "RDA merge",
     "src/topology/protocol_stubs.c (RDA weighted outer-gradient merge)",
     PCP_TOPOLOGY_EVIDENCE_PRODUCTION_FIXTURE, false, CASES(kRdaCases)},
    {PCP_TOPOLOGY_TASK_MULTI_GATEWAY_GLOBAL_JOB, "multi_gateway_global_job",
     "future multi-gateway global-job contract",
     "future hub -> gateway -> scheduling -> worker composition",
     PCP_TOPOLOGY_EVIDENCE_SYMBOLIC_CARRIER, true, CASES(kGlobalJobCases)},
};

static const char* const kEvidenceNames[] = {
    "symbolic_carrier", "production_fixture", "bounded_model",
    "generated_Xi",     "solver_checked",     "smoke_replay",
};

const char* pcp_topology_evidence_name(pcp_topology_evidence_t evidence) {
  if ((unsigned)evidence >= PCP_ARRAYSIZE(kEvidenceNames))
    return "?";
  return kEvidenceNames[evidence];
}

const pcp_topology_task_definition_t* pcp_topology_task_catalog(
    size_t* out_count) {
  *out_count = PCP_ARRAYSIZE(kTasks);
  return kTasks;
}

const pcp_topology_task_definition_t* pcp_topology_task_definition(
    pcp_topology_task_kind_t kind) {
  for (size_t i = 0; i < PCP_ARRAYSIZE(kTasks); ++i) {
    if (kTasks[i].kind == kind)
      return &kTasks[i];
  }
  return NULL;
}

const pcp_topology_task_definition_t* pcp_topology_task_find(
    pcp_string_view_t name) {
  for (size_t i = 0; i < PCP_ARRAYSIZE(kTasks); ++i) {
    if (pcp_string_view_equal(name, pcp_make_cstring_view(kTasks[i].name))) {
      return &kTasks[i];
    }
  }
  return NULL;
}

void pcp_topology_task_case_vertices(const pcp_topology_task_case_t* task_case,
                                     int output, pcp_topology_vertex_t* out) {
  for (uint32_t i = 0; i < task_case->color_count; ++i) {
    const char* label =
        output < 0 ? task_case->input[i] : task_case->outputs[output][i];
    out[i] = pcp_topology_make_vertex(task_case->colors[i],
                                      pcp_topology_make_symbol(label));
  }
}

pcp_status_t pcp_topology_project_to_colors(pcp_topology_simplex_t simplex,
                                            pcp_topology_simplex_t colors,
                                            pcp_topology_vertex_t* out_vertices,
                                            bool* out_complete) {
  *out_complete = true;
  for (uint32_t i = 0; i < colors.count; ++i) {
    int32_t index = pcp_topology_simplex_vertex_with_color(
        simplex, colors.vertices[i].color);
    if (index < 0) {
      *out_complete = false;
      return pcp_ok_status();
    }
    out_vertices[i] = simplex.vertices[index];
  }
  return pcp_ok_status();
}

void pcp_topology_task_deinitialize(pcp_topology_task_t* task) {
  if (task->carrier)
    pcp_topology_carrier_map_release(task->carrier);
  if (task->input)
    pcp_topology_complex_release(task->input);
  if (task->output)
    pcp_topology_complex_release(task->output);
  memset(task, 0, sizeof(*task));
}

static pcp_status_t build_carrier(const pcp_topology_task_case_t* cases,
                                  size_t case_count, pcp_topology_task_t* task,
                                  pcp_allocator_t allocator) {
  pcp_topology_complex_t* faces = NULL;
  pcp_topology_complex_t* image = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(allocator, &faces));
  pcp_status_t status = pcp_topology_complex_create(allocator, &image);
  if (!status)
    status = pcp_topology_complex_faces(task->input, faces);
  if (!status) {
    status = pcp_topology_carrier_map_create(task->input, task->output,
                                             allocator, &task->carrier);
  }
  pcp_topology_vertex_t facet[PCP_TOPOLOGY_TASK_MAX_COLORS];
  pcp_topology_vertex_t projected[PCP_TOPOLOGY_TASK_MAX_COLORS];
  for (size_t f = 0; !status && f < pcp_topology_complex_count(faces); ++f) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, f);
    pcp_topology_complex_clear(image);
    if (face.count == 0) {
      status = pcp_topology_complex_append(image, face);
    } else {
      const pcp_topology_task_case_t* owner = NULL;
      size_t owners = 0;
      for (size_t c = 0; c < case_count; ++c) {
        pcp_topology_task_case_vertices(&cases[c], -1, facet);
        if (pcp_topology_simplex_is_subset(
                face, pcp_topology_make_simplex(facet, cases[c].color_count))) {
          owner = &cases[c];
          owners++;
        }
      }
      if (owners != 1) {
        status = pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_UNCOVERED_TASK_FACE,
            "input face %zu lies in %zu cases (needs exactly one)", f, owners);
        break;
      }
      for (uint32_t o = 0; !status && o < owner->output_count; ++o) {
        pcp_topology_task_case_vertices(owner, (int)o, facet);
        bool complete = false;
        status = pcp_topology_project_to_colors(
            pcp_topology_make_simplex(facet, owner->color_count), face,
            projected, &complete);
        if (!status && !complete) {
          status = pcp_topology_make_status(
              PCP_TOPOLOGY_ERROR_OUTPUT_FACET_MISSING_COLOR,
              "an output of the case owning input face %zu lacks a colour", f);
        }
        pcp_topology_simplex_t projection =
            pcp_topology_make_simplex(projected, face.count);
        if (!status &&
            !pcp_topology_complex_contains(task->output, projection)) {
          status = pcp_topology_make_status(
              PCP_TOPOLOGY_ERROR_TASK_OUTPUT_PROJECTION_OUTSIDE_OUTPUT_COMPLEX,
              "projection for input face %zu is not in O", f);
        }
        if (!status)
          status = pcp_topology_complex_add(image, projection, NULL);
      }
    }
    if (!status)
      status = pcp_topology_carrier_map_set(task->carrier, face, image);
  }
  pcp_topology_complex_release(faces);
  if (image)
    pcp_topology_complex_release(image);
  return status;
}

pcp_status_t pcp_topology_task_build_from_cases(
    const pcp_topology_task_case_t* cases, size_t case_count,
    pcp_allocator_t allocator, pcp_topology_task_t* out_task) {
  memset(out_task, 0, sizeof(*out_task));
  pcp_status_t status =
      pcp_topology_complex_create(allocator, &out_task->input);
  if (!status)
    status = pcp_topology_complex_create(allocator, &out_task->output);
  pcp_topology_vertex_t facet[PCP_TOPOLOGY_TASK_MAX_COLORS];
  for (size_t c = 0; !status && c < case_count; ++c) {
    if (cases[c].color_count == 0 ||
        cases[c].color_count > PCP_TOPOLOGY_TASK_MAX_COLORS ||
        cases[c].output_count == 0 ||
        cases[c].output_count > PCP_TOPOLOGY_TASK_MAX_OUTPUTS) {
      status =
          pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                          "task case %zu has bad colour or output counts", c);
      break;
    }
    pcp_topology_task_case_vertices(&cases[c], -1, facet);
    status = pcp_topology_complex_add(
        out_task->input, pcp_topology_make_simplex(facet, cases[c].color_count),
        NULL);
    for (uint32_t o = 0; !status && o < cases[c].output_count; ++o) {
      pcp_topology_task_case_vertices(&cases[c], (int)o, facet);
      status = pcp_topology_complex_add(
          out_task->output,
          pcp_topology_make_simplex(facet, cases[c].color_count), NULL);
    }
  }
  if (!status)
    status = build_carrier(cases, case_count, out_task, allocator);
  if (!status) {
    pcp_topology_carrier_checks_t checks =
        pcp_topology_carrier_checks_default();
    checks.chromatic = true;
    status = pcp_topology_carrier_map_validate(out_task->carrier, checks);
  }
  if (status)
    pcp_topology_task_deinitialize(out_task);
  return status;
}

pcp_status_t pcp_topology_task_build(pcp_topology_task_kind_t kind,
                                     pcp_allocator_t allocator,
                                     pcp_topology_task_t* out_task) {
  const pcp_topology_task_definition_t* definition =
      pcp_topology_task_definition(kind);
  if (!definition) {
    memset(out_task, 0, sizeof(*out_task));
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "no task of kind %d",
                           (int)kind);
  }
  PCP_RETURN_IF_ERROR(
      pcp_topology_task_build_from_cases(
          definition->cases, definition->case_count, allocator, out_task),
      "task %s", definition->name);
  out_task->definition = definition;
  return pcp_ok_status();
}
