// SPDX-License-Identifier: Apache-2.0
//
// Composition of tasks (reference s.5.2): the outputs of one stage become
// the inputs of the next through a projection (a vertex map, not colour
// preserving: the hub's decision becomes a gateway's input), so a pipeline
// workload -> federation -> scheduling -> reservation -> fragment -> RDA is
// one carrier from the first inputs to the last outputs. Projected onto the
// global job's outputs, it must refine the abstract global contract.

#include <string.h>

#include "topology/protocols_impl.h"

pcp_status_t pcp_topology_projection_create(
    const pcp_topology_complex_t* from_output,
    const pcp_topology_complex_t* to_input,
    const pcp_topology_projection_pair_t* pairs, size_t pair_count,
    pcp_allocator_t allocator, pcp_topology_vertex_map_t** out_map) {
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_vertex_map_create(from_output, to_input,
                                                          allocator, out_map));
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; !status && i < pair_count; ++i) {
    pcp_topology_vertex_t from = pcp_topology_make_vertex(
        pairs[i].from_color, pcp_topology_make_symbol(pairs[i].from));
    pcp_topology_vertex_t to = pcp_topology_make_vertex(
        pairs[i].to_color, pcp_topology_make_symbol(pairs[i].to));
    if (!pcp_topology_complex_contains(from_output,
                                       pcp_topology_make_simplex(&from, 1))) {
      status = pcp_topology_make_status(PCP_TOPOLOGY_ERROR_VERTEX_REF_NOT_FOUND,
                                        "projection source %s is not a vertex",
                                        pairs[i].from);
    } else if (!pcp_topology_complex_contains(
                   to_input, pcp_topology_make_simplex(&to, 1))) {
      status = pcp_topology_make_status(PCP_TOPOLOGY_ERROR_VERTEX_REF_NOT_FOUND,
                                        "projection target %s is not a vertex",
                                        pairs[i].to);
    } else {
      status = pcp_topology_vertex_map_set(*out_map, &from, &to);
    }
  }
  if (!status) {
    pcp_topology_vertex_map_checks_t checks = {false, false};
    status = pcp_topology_vertex_map_validate(*out_map, checks);
  }
  if (status) {
    pcp_topology_vertex_map_release(*out_map);
    *out_map = NULL;
  }
  return status;
}

pcp_status_t pcp_topology_carriers_compose_projected(
    const pcp_topology_carrier_map_t* start,
    const pcp_topology_composition_link_t* links, size_t link_count,
    pcp_allocator_t allocator, pcp_topology_carrier_map_t** out_carrier) {
  *out_carrier = NULL;
  if (link_count == 0) {
    return pcp_topology_make_status(PCP_TOPOLOGY_ERROR_EMPTY_COMPOSITION,
                                    "no links to compose");
  }
  pcp_topology_carrier_map_t* current = NULL;
  for (size_t i = 0; i < link_count; ++i) {
    const pcp_topology_carrier_map_t* input = current ? current : start;
    pcp_topology_carrier_map_t* projected = NULL;
    pcp_status_t status = pcp_topology_carrier_map_compose_with_map(
        input, links[i].projection, allocator, &projected);
    pcp_topology_carrier_map_t* next = NULL;
    if (!status) {
      status = pcp_topology_carrier_map_compose_with_carrier(
          projected, links[i].next, allocator, &next);
    }
    if (projected)
      pcp_topology_carrier_map_release(projected);
    if (current)
      pcp_topology_carrier_map_release(current);
    current = next;
    if (status) {
      if (current)
        pcp_topology_carrier_map_release(current);
      return pcp_status_annotate_f(status, "composition link %zu", i);
    }
  }
  *out_carrier = current;
  return pcp_ok_status();
}

pcp_status_t pcp_topology_projected_refinement_validate(
    const pcp_topology_carrier_map_t* detailed,
    const pcp_topology_vertex_map_t* projection,
    const pcp_topology_carrier_map_t* abstract, pcp_allocator_t allocator) {
  pcp_topology_carrier_map_t* projected = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_carrier_map_compose_with_map(
      detailed, projection, allocator, &projected));
  pcp_status_t status = pcp_ok_status();
  if (!pcp_topology_complex_equal_by_closure(
          pcp_topology_carrier_map_domain(projected),
          pcp_topology_carrier_map_domain(abstract))) {
    status = pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_REFINEMENT_DOMAIN_MISMATCH,
        "detailed and abstract carriers have different inputs");
  } else if (!pcp_topology_complex_equal_by_closure(
                 pcp_topology_carrier_map_codomain(projected),
                 pcp_topology_carrier_map_codomain(abstract))) {
    status = pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_REFINEMENT_CODOMAIN_MISMATCH,
        "the projection does not land in the abstract outputs");
  }
  pcp_topology_complex_t* faces = NULL;
  if (!status)
    status = pcp_topology_complex_create(allocator, &faces);
  if (!status) {
    status = pcp_topology_complex_faces(
        pcp_topology_carrier_map_domain(projected), faces);
  }
  for (size_t f = 0; !status && f < pcp_topology_complex_count(faces); ++f) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, f);
    const pcp_topology_complex_t* got =
        pcp_topology_carrier_map_lookup(projected, face);
    const pcp_topology_complex_t* allowed =
        pcp_topology_carrier_map_lookup(abstract, face);
    if (!got || !allowed || !pcp_topology_complex_is_subcomplex(got, allowed)) {
      pcp_string_builder_t text;
      pcp_string_builder_initialize(allocator, 0, &text);
      pcp_status_ignore(pcp_topology_simplex_format(face, &text));
      status = pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_DETAILED_CARRIER_ESCAPES_ABSTRACT_TASK,
          "input face %s reaches outputs the abstract task does not allow",
          pcp_string_builder_cstring(&text));
      pcp_string_builder_deinitialize(&text);
    }
  }
  if (faces)
    pcp_topology_complex_release(faces);
  pcp_topology_carrier_map_release(projected);
  return status;
}

//===----------------------------------------------------------------------===//
// The global training pipeline
//===----------------------------------------------------------------------===//

#define C(kind, n) \
  { PCP_TOPOLOGY_COLOR_##kind, (n) }
#define PAIR(fk, fn, from, tk, tn, to) \
  { C(fk, fn), from, C(tk, tn), to }

// workload O -> federation I: accepted requests meet a compatible current
// gateway (job 30); rejected ones an incompatible gateway (job 32).
static const pcp_topology_projection_pair_t kWorkloadToFederation[] = {
    PAIR(API_CALLER, 0, "status.accepted", HUB, 0, "registry.current"),
    PAIR(GATEWAY, 0, "route.regular_training", GATEWAY, 1,
         "gateway.connected.compatible"),
    PAIR(JOB, 1, "job.normalized.regular", JOB, 30, "job.requires.training"),
    PAIR(API_CALLER, 0, "status.rejected", HUB, 0,
         "registry.current.incompatible"),
    PAIR(GATEWAY, 0, "route.rejected", GATEWAY, 1,
         "gateway.connected.incompatible"),
    PAIR(JOB, 1, "job.rejected", JOB, 32, "job.requires.training"),
};

// federation O -> lease I: placed -> idle pool (j10); lost after routing ->
// the inference reservation case (j12); stale/incompatible -> the capped
// owner (j11).
static const pcp_topology_projection_pair_t kFederationToLease[] = {
    PAIR(HUB, 0, "placement.placed", GATEWAY, 0, "pool.idle_capacity"),
    PAIR(GATEWAY, 1, "gateway.route.accepted", WORKER, 0,
         "worker.cuda.idle.available"),
    PAIR(JOB, 30, "job.forwarded", JOB, 10, "lease.training.request"),
    PAIR(HUB, 0, "placement.failed_after_loss", GATEWAY, 0,
         "policy.inference.reserved_workers"),
    PAIR(GATEWAY, 1, "gateway.route_lost", WORKER, 0,
         "worker.cuda.last_inference_capacity"),
    PAIR(JOB, 30, "job.failed_retryable", JOB, 12, "lease.training.request"),
    PAIR(HUB, 0, "placement.rejected.stale", GATEWAY, 0,
         "policy.training.max_workers_reached"),
    PAIR(HUB, 0, "placement.rejected.incompatible", GATEWAY, 0,
         "policy.training.max_workers_reached"),
    PAIR(GATEWAY, 1, "gateway.not_selected", WORKER, 0,
         "worker.cuda.idle.maxed"),
    PAIR(JOB, 31, "job.rejected", JOB, 11, "lease.training.request"),
    PAIR(JOB, 32, "job.rejected", JOB, 11, "lease.training.request"),
};

// lease O -> reservation I: reserved -> commit (j20); capped -> expiry
// (j22); deferred -> release (j21).
static const pcp_topology_projection_pair_t kLeaseToReservation[] = {
    PAIR(GATEWAY, 0, "lease.reserved", GATEWAY, 0, "reservation.active"),
    PAIR(JOB, 10, "reservation.active", JOB, 20, "reservation.commit"),
    PAIR(WORKER, 0, "worker.leased.training", WORKER, 0,
         "worker.reserved.training"),
    PAIR(GATEWAY, 0, "lease.rejected.max_workers", GATEWAY, 0,
         "reservation.active.expire"),
    PAIR(JOB, 11, "reservation.rejected", JOB, 22, "reservation.expire"),
    PAIR(WORKER, 0, "worker.unleased", WORKER, 0,
         "worker.reserved.training.expire"),
    PAIR(GATEWAY, 0, "lease.deferred.preserve_capacity", GATEWAY, 0,
         "reservation.active.release"),
    PAIR(JOB, 12, "reservation.deferred", JOB, 21, "reservation.release"),
    PAIR(WORKER, 0, "worker.reserved_for_inference", WORKER, 0,
         "worker.reserved.training.release"),
};

// reservation O -> fragment I: committed -> an open quorum window (s40);
// released, expired and canceled -> the canceled window (s45).
static const pcp_topology_projection_pair_t kReservationToFragment[] = {
    PAIR(GATEWAY, 0, "reservation.committed", GATEWAY, 0, "window.open.quorum"),
    PAIR(JOB, 20, "job.queued_reserved", SESSION, 40, "session.active"),
    PAIR(WORKER, 0, "worker.leased.training", WORKER, 0,
         "fragment.fresh.unique_sender.quorum"),
    PAIR(GATEWAY, 0, "reservation.released", GATEWAY, 0, "window.canceled"),
    PAIR(GATEWAY, 0, "reservation.expired", GATEWAY, 0, "window.canceled"),
    PAIR(GATEWAY, 0, "reservation.canceled.cleanup_complete", GATEWAY, 0,
         "window.canceled"),
    PAIR(JOB, 21, "job.not_queued", SESSION, 45, "session.canceled"),
    PAIR(JOB, 22, "job.not_queued", SESSION, 45, "session.canceled"),
    PAIR(JOB, 23, "job.canceled", SESSION, 45, "session.canceled"),
    PAIR(WORKER, 0, "worker.idle", WORKER, 0, "fragment.post_cancel"),
};

// fragment O -> RDA I: a committed merge is the direction case (s50);
// every deferred, rejected or canceled outcome is below quorum (s52).
static const pcp_topology_projection_pair_t kFragmentToRda[] = {
    PAIR(GATEWAY, 0, "merge.committed", GATEWAY, 0, "merge_kind.rda.direction"),
    PAIR(SESSION, 40, "session.progressed", SESSION, 50, "window.quorum"),
    PAIR(WORKER, 0, "update.accepted", WORKER, 0,
         "participants.direction_nonzero"),
    PAIR(GATEWAY, 0, "merge.deferred", GATEWAY, 0,
         "merge_kind.rda.below_quorum"),
    PAIR(GATEWAY, 0, "merge.not_committed", GATEWAY, 0,
         "merge_kind.rda.below_quorum"),
    PAIR(GATEWAY, 0, "merge.canceled", GATEWAY, 0,
         "merge_kind.rda.below_quorum"),
    PAIR(SESSION, 41, "session.waiting", SESSION, 52, "window.below_quorum"),
    PAIR(SESSION, 42, "session.active", SESSION, 52, "window.below_quorum"),
    PAIR(SESSION, 43, "session.active", SESSION, 52, "window.below_quorum"),
    PAIR(SESSION, 44, "session.active", SESSION, 52, "window.below_quorum"),
    PAIR(SESSION, 45, "session.canceled", SESSION, 52, "window.below_quorum"),
    PAIR(WORKER, 0, "update.pending", WORKER, 0, "participants.insufficient"),
    PAIR(WORKER, 0, "update.rejected.duplicate", WORKER, 0,
         "participants.insufficient"),
    PAIR(WORKER, 0, "update.rejected.context", WORKER, 0,
         "participants.insufficient"),
    PAIR(WORKER, 0, "update.rejected.vector_clock", WORKER, 0,
         "participants.insufficient"),
    PAIR(WORKER, 0, "update.rejected.post_cancel", WORKER, 0,
         "participants.insufficient"),
};

// RDA O -> global O: a carried direction commits the global job; zero or
// no output defers it.
static const pcp_topology_projection_pair_t kRdaToGlobal[] = {
    PAIR(GATEWAY, 0, "rda.output.direction_norm_carried", GATEWAY, 1,
         "gateway_a.committed"),
    PAIR(SESSION, 50, "merge.committed", JOB, 60, "job.running"),
    PAIR(WORKER, 0, "participants.used", HUB, 0, "global_job.committed"),
    PAIR(GATEWAY, 0, "rda.output.zero", GATEWAY, 1,
         "gateway_a.hold_or_release"),
    PAIR(GATEWAY, 0, "rda.output.none", GATEWAY, 1,
         "gateway_a.hold_or_release"),
    PAIR(SESSION, 51, "merge.committed", JOB, 63, "job.queued"),
    PAIR(SESSION, 52, "merge.deferred", JOB, 63, "job.queued"),
    PAIR(WORKER, 0, "participants.canceling_direction", HUB, 0,
         "global_job.deferred"),
    PAIR(WORKER, 0, "participants.insufficient", HUB, 0, "global_job.deferred"),
};

static const pcp_topology_task_kind_t kStages[PCP_TOPOLOGY_PIPELINE_STAGES] = {
    PCP_TOPOLOGY_TASK_WORKLOAD_NORMALIZATION,
    PCP_TOPOLOGY_TASK_FEDERATION_PLACEMENT,
    PCP_TOPOLOGY_TASK_GATEWAY_LEASE_SCHEDULING,
    PCP_TOPOLOGY_TASK_RESERVATION_LIFECYCLE,
    PCP_TOPOLOGY_TASK_DECOUPLED_FRAGMENT,
    PCP_TOPOLOGY_TASK_RDA_MERGE,
};

typedef struct projection_table_t {
  const pcp_topology_projection_pair_t* pairs;
  size_t count;
} projection_table_t;

static const projection_table_t kProjections[PCP_TOPOLOGY_PIPELINE_STAGES] = {
    {kWorkloadToFederation, PCP_ARRAYSIZE(kWorkloadToFederation)},
    {kFederationToLease, PCP_ARRAYSIZE(kFederationToLease)},
    {kLeaseToReservation, PCP_ARRAYSIZE(kLeaseToReservation)},
    {kReservationToFragment, PCP_ARRAYSIZE(kReservationToFragment)},
    {kFragmentToRda, PCP_ARRAYSIZE(kFragmentToRda)},
    {kRdaToGlobal, PCP_ARRAYSIZE(kRdaToGlobal)},
};

void pcp_topology_global_composition_initialize(
    pcp_allocator_t allocator, pcp_topology_global_composition_t* out) {
  memset(out, 0, sizeof(*out));
  out->allocator = allocator;
}

void pcp_topology_global_composition_deinitialize(
    pcp_topology_global_composition_t* c) {
  if (c->abstract)
    pcp_topology_carrier_map_release(c->abstract);
  if (c->detailed)
    pcp_topology_carrier_map_release(c->detailed);
  for (size_t i = 0; i < PCP_TOPOLOGY_PIPELINE_STAGES; ++i) {
    if (c->projections[i])
      pcp_topology_vertex_map_release(c->projections[i]);
  }
  for (size_t i = 0; i < PCP_TOPOLOGY_PIPELINE_STAGES; ++i) {
    pcp_topology_task_deinitialize(&c->stages[i]);
  }
  pcp_topology_task_deinitialize(&c->global);
  pcp_allocator_t allocator = c->allocator;
  memset(c, 0, sizeof(*c));
  c->allocator = allocator;
}

// Faces of the regular request may end committed or deferred; faces of the
// invalid request only deferred.
static pcp_status_t build_abstract(pcp_topology_global_composition_t* c) {
  pcp_allocator_t a = c->allocator;
  const pcp_topology_complex_t* input = c->stages[0].input;
  static const pcp_topology_color_t kGlobal[3] = {C(HUB, 0), C(JOB, 60),
                                                  C(GATEWAY, 1)};
  pcp_topology_vertex_t committed[3] = {
      pcp_topology_make_vertex(
          kGlobal[0], pcp_topology_make_symbol("global_job.committed")),
      pcp_topology_make_vertex(kGlobal[1],
                               pcp_topology_make_symbol("job.running")),
      pcp_topology_make_vertex(
          kGlobal[2], pcp_topology_make_symbol("gateway_a.committed"))};
  pcp_topology_vertex_t deferred[3] = {
      pcp_topology_make_vertex(kGlobal[0],
                               pcp_topology_make_symbol("global_job.deferred")),
      pcp_topology_make_vertex(
          pcp_topology_make_color(PCP_TOPOLOGY_COLOR_JOB, 63),
          pcp_topology_make_symbol("job.queued")),
      pcp_topology_make_vertex(
          kGlobal[2], pcp_topology_make_symbol("gateway_a.hold_or_release"))};
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_carrier_map_create(
      input, c->global.output, a, &c->abstract));
  const pcp_topology_task_case_t* cases = c->stages[0].definition->cases;
  pcp_topology_vertex_t regular[PCP_TOPOLOGY_TASK_MAX_COLORS];
  pcp_topology_vertex_t invalid[PCP_TOPOLOGY_TASK_MAX_COLORS];
  pcp_topology_task_case_vertices(&cases[0], -1, regular);
  pcp_topology_task_case_vertices(&cases[1], -1, invalid);
  pcp_topology_complex_t* faces = NULL;
  pcp_topology_complex_t* image = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(a, &faces));
  pcp_status_t status = pcp_topology_complex_create(a, &image);
  if (!status)
    status = pcp_topology_complex_faces(input, faces);
  for (size_t f = 0; !status && f < pcp_topology_complex_count(faces); ++f) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, f);
    pcp_topology_complex_clear(image);
    if (face.count == 0) {
      status = pcp_topology_complex_append(image, face);
    } else if (pcp_topology_simplex_is_subset(
                   face,
                   pcp_topology_make_simplex(regular, cases[0].color_count))) {
      status = pcp_topology_complex_add(
          image, pcp_topology_make_simplex(committed, 3), NULL);
      if (!status) {
        status = pcp_topology_complex_add(
            image, pcp_topology_make_simplex(deferred, 3), NULL);
      }
    } else if (pcp_topology_simplex_is_subset(
                   face,
                   pcp_topology_make_simplex(invalid, cases[1].color_count))) {
      status = pcp_topology_complex_add(
          image, pcp_topology_make_simplex(deferred, 3), NULL);
    } else {
      status = pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_UNCOVERED_ABSTRACT_WORKFLOW_FACE,
          "workload face %zu is in neither request", f);
    }
    if (!status)
      status = pcp_topology_carrier_map_set(c->abstract, face, image);
  }
  pcp_topology_complex_release(faces);
  if (image)
    pcp_topology_complex_release(image);
  if (status)
    return status;
  return pcp_topology_carrier_map_validate(
      c->abstract, pcp_topology_carrier_checks_default());
}

pcp_status_t pcp_topology_global_composition_build(
    pcp_topology_global_composition_t* c) {
  pcp_allocator_t a = c->allocator;
  pcp_topology_global_composition_deinitialize(c);
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; !status && i < PCP_TOPOLOGY_PIPELINE_STAGES; ++i) {
    status = pcp_topology_task_build(kStages[i], a, &c->stages[i]);
  }
  if (!status) {
    status = pcp_topology_task_build(PCP_TOPOLOGY_TASK_MULTI_GATEWAY_GLOBAL_JOB,
                                     a, &c->global);
  }
  for (size_t i = 0; !status && i < PCP_TOPOLOGY_PIPELINE_STAGES; ++i) {
    const pcp_topology_complex_t* to = i + 1 < PCP_TOPOLOGY_PIPELINE_STAGES
                                           ? c->stages[i + 1].input
                                           : c->global.output;
    status = pcp_topology_projection_create(
        c->stages[i].output, to, kProjections[i].pairs, kProjections[i].count,
        a, &c->projections[i]);
    if (status)
      status = pcp_status_annotate_f(status, "projection %zu", i);
  }
  if (!status) {
    pcp_topology_composition_link_t links[PCP_TOPOLOGY_PIPELINE_STAGES - 1];
    for (size_t i = 0; i + 1 < PCP_TOPOLOGY_PIPELINE_STAGES; ++i) {
      links[i].projection = c->projections[i];
      links[i].next = c->stages[i + 1].carrier;
    }
    status = pcp_topology_carriers_compose_projected(
        c->stages[0].carrier, links, PCP_TOPOLOGY_PIPELINE_STAGES - 1, a,
        &c->detailed);
  }
  if (!status)
    status = build_abstract(c);
  if (status)
    pcp_topology_global_composition_deinitialize(c);
  return status;
}
