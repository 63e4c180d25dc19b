// SPDX-License-Identifier: Apache-2.0
//
// Protocol models (reference s.3.2-3.4): each model runs the protocol
// definitions of protocol_stubs.c on the cases of one task and turns what
// the processes end up seeing into protocol facets ("view.*" labels) and
// what they decide into output facets. From those it builds the protocol
// complex P, the execution carrier Xi: I -> P and the decision map delta
// the implementation actually uses. Because the views come from running
// the protocol code, a change to the protocol (or an injected bug) changes
// Xi, and the check below notices.
//
// The regression models run the same extractors with one upstream bug
// injected each (the regression corpus of reference s.4); the two toy
// models are the canonical partition and global rollback-gap complexes.

#include <string.h>

#include "topology/protocols_impl.h"
#include "topology/trace_impl.h"

#define MAX_RUNS PCP_TOPOLOGY_MODEL_MAX_RUNS
#define MAX_RUN_EVENTS 12

// One generated case: which task case's input it realises, the views the
// processes end with and the outputs they decide, and the schedule.
typedef struct case_run_t {
  uint32_t task_case;
  const char* views[PCP_TOPOLOGY_TASK_MAX_COLORS];
  const char* decided[PCP_TOPOLOGY_TASK_MAX_COLORS];
  pcp_topology_event_t events[MAX_RUN_EVENTS];
  uint32_t event_count;
  uint64_t state_hash;
} case_run_t;

typedef struct runs_t {
  case_run_t items[MAX_RUNS];
  uint32_t count;
} runs_t;

static case_run_t* runs_add(runs_t* runs, uint32_t task_case) {
  PCP_ASSERT(runs->count < MAX_RUNS);
  case_run_t* run = &runs->items[runs->count++];
  memset(run, 0, sizeof(*run));
  run->task_case = task_case;
  return run;
}

static void run_views(case_run_t* run, const char* a, const char* b,
                      const char* c) {
  run->views[0] = a;
  run->views[1] = b;
  run->views[2] = c;
}

static void run_decided(case_run_t* run, const char* a, const char* b,
                        const char* c) {
  run->decided[0] = a;
  run->decided[1] = b;
  run->decided[2] = c;
}

static void run_event(case_run_t* run, pcp_topology_event_tag_t tag,
                      uint16_t actor, uint16_t peer, uint32_t message) {
  if (run->event_count >= MAX_RUN_EVENTS)
    return;
  pcp_topology_event_t e = {(uint8_t)tag, actor, peer, message};
  run->events[run->event_count++] = e;
}

static uint64_t hash_words(const uint64_t* words, size_t count) {
  pcp_topology_hasher_t hasher;
  pcp_topology_hasher_initialize(pcp_topology_ascii_seed("model"), &hasher);
  for (size_t i = 0; i < count; ++i) {
    pcp_topology_hasher_update_le(&hasher, words[i], 8);
  }
  return pcp_topology_hasher_finish(&hasher);
}

#define NN PCP_TOPOLOGY_NO_NODE

//===----------------------------------------------------------------------===//
// Extractors
//===----------------------------------------------------------------------===//

static void extract_workload(bool bug, runs_t* runs) {
  (void)bug;
  static const struct {
    const char* body;
    const char* session;
  } kRequests[2] = {{"{}", "run-shared"}, {"{}", "invalid-session"}};
  for (uint32_t c = 0; c < 2; ++c) {
    bool accepted = pcp_topology_workload_route_regular(kRequests[c].body,
                                                        kRequests[c].session);
    case_run_t* run = runs_add(runs, c);
    if (accepted) {
      run_views(run, "view.request.accepted", "view.route.regular_training",
                "view.job.normalized.regular");
      run_decided(run, "status.accepted", "route.regular_training",
                  "job.normalized.regular");
      run_event(run, PCP_TOPOLOGY_EVENT_SEND, 0, 1, 10);
      run_event(run, PCP_TOPOLOGY_EVENT_DELIVER, 1, 0, 10);
    } else {
      run_views(run, "view.request.rejected", "view.route.rejected",
                "view.job.rejected");
      run_decided(run, "status.rejected", "route.rejected", "job.rejected");
      run_event(run, PCP_TOPOLOGY_EVENT_SEND, 0, 1, 12);
      run_event(run, PCP_TOPOLOGY_EVENT_DROP, 0, NN, 12);
    }
    uint64_t words[2] = {c, accepted};
    run->state_hash = hash_words(words, 2);
  }
}

static const char* dispatch_view(pcp_topology_dispatch_t d) {
  switch (d) {
    case PCP_TOPOLOGY_DISPATCH_CONTROLLER_TO_WORKER:
      return "view.dispatch.controller_to_worker";
    case PCP_TOPOLOGY_DISPATCH_GATEWAY_QUEUE_ONLY:
      return "view.dispatch.gateway_queue_only";
    case PCP_TOPOLOGY_DISPATCH_GATEWAY_HANDLED:
      return "view.dispatch.gateway_handled";
    default:
      return "view.dispatch.fail_closed";
  }
}

static const char* dispatch_output(pcp_topology_dispatch_t d) {
  switch (d) {
    case PCP_TOPOLOGY_DISPATCH_CONTROLLER_TO_WORKER:
      return "dispatch.controller_to_worker";
    case PCP_TOPOLOGY_DISPATCH_GATEWAY_QUEUE_ONLY:
      return "dispatch.gateway_queue_only";
    case PCP_TOPOLOGY_DISPATCH_GATEWAY_HANDLED:
      return "dispatch.gateway_handled";
    default:
      return "dispatch.fail_closed";
  }
}

static void handler_labels(pcp_topology_handler_verdict_t verdict,
                           pcp_topology_worker_handler_t handler,
                           const char** out_view, const char** out_output) {
  switch (verdict) {
    case PCP_TOPOLOGY_HANDLER_VERDICT_ACCEPTED:
      if (handler == PCP_TOPOLOGY_HANDLER_DECOUPLED_TRAINING) {
        *out_view = "view.handler.accepted.decoupled_training";
        *out_output = "accepted.decoupled_training";
      } else if (handler == PCP_TOPOLOGY_HANDLER_INFERENCE) {
        *out_view = "view.handler.accepted.inference";
        *out_output = "accepted.inference";
      } else {
        *out_view = "view.handler.accepted.other";
        *out_output = "accepted.other";
      }
      return;
    case PCP_TOPOLOGY_HANDLER_VERDICT_NO_WORKER_HANDLER:
      *out_view = "view.handler.no_worker_handler";
      *out_output = "rejected.worker_result_to_worker";
      return;
    case PCP_TOPOLOGY_HANDLER_VERDICT_WRONG_WORKER_HANDLER:
      *out_view = "view.handler.wrong_worker_handler";
      *out_output = "rejected.wrong_worker_handler";
      return;
    default:
      *out_view = "view.handler.unknown_message";
      *out_output = "rejected.unknown_message";
      return;
  }
}

static void extract_message_dispatch(bool bug, runs_t* runs) {
  size_t count = 0;
  const pcp_topology_message_entry_t* production =
      pcp_topology_message_catalog(&count);
  pcp_topology_message_entry_t catalog[64];
  PCP_ASSERT(count <= PCP_ARRAYSIZE(catalog));
  memcpy(catalog, production, count * sizeof(*catalog));
  if (bug) {
    // Injected bug: the worker's fragment result is routed like a
    // controller command, straight back to a worker handler.
    for (size_t i = 0; i < count; ++i) {
      if (strcmp(catalog[i].name, "DecoupledFragmentUpdate") == 0) {
        catalog[i].direction = PCP_TOPOLOGY_MESSAGE_CONTROLLER_TO_WORKER;
        catalog[i].queued = false;
        catalog[i].handler = PCP_TOPOLOGY_HANDLER_DECOUPLED_TRAINING;
      }
    }
  }
  static const struct {
    const char* name;
    pcp_topology_worker_handler_t claimed;
    uint32_t message;
  } kMessages[4] = {
      {"StartDecoupledDilocoLoop", PCP_TOPOLOGY_HANDLER_DECOUPLED_TRAINING, 1},
      {"StartGeneration", PCP_TOPOLOGY_HANDLER_INFERENCE, 2},
      {"DecoupledFragmentUpdate", PCP_TOPOLOGY_HANDLER_DECOUPLED_TRAINING, 4},
      {"pcp.unknown", PCP_TOPOLOGY_HANDLER_NONE, 5},
  };
  for (uint32_t c = 0; c < 4; ++c) {
    pcp_topology_dispatch_t dispatch =
        pcp_topology_message_dispatch(catalog, count, kMessages[c].name);
    pcp_topology_handler_verdict_t verdict = pcp_topology_worker_handler_check(
        catalog, count, kMessages[c].name, kMessages[c].claimed);
    case_run_t* run = runs_add(runs, c);
    const char* worker_view = NULL;
    const char* worker_output = NULL;
    handler_labels(verdict, kMessages[c].claimed, &worker_view, &worker_output);
    run->views[0] = dispatch_view(dispatch);
    run->views[1] = worker_view;
    run->decided[0] = dispatch_output(dispatch);
    run->decided[1] = worker_output;
    uint32_t m = kMessages[c].message;
    if (dispatch == PCP_TOPOLOGY_DISPATCH_CONTROLLER_TO_WORKER) {
      run_event(run, PCP_TOPOLOGY_EVENT_SEND, 0, 1, m);
      run_event(run, PCP_TOPOLOGY_EVENT_DELIVER, 1, 0, m);
    } else if (dispatch == PCP_TOPOLOGY_DISPATCH_GATEWAY_QUEUE_ONLY) {
      run_event(run, PCP_TOPOLOGY_EVENT_SEND, 1, 0, m);
      run_event(run, PCP_TOPOLOGY_EVENT_DROP, 0, NN, m);
    } else {
      run_event(run, PCP_TOPOLOGY_EVENT_SEND, 0, 1, m);
      run_event(run, PCP_TOPOLOGY_EVENT_DROP, 0, NN, m);
    }
    uint64_t words[3] = {c, (uint64_t)dispatch, (uint64_t)verdict};
    run->state_hash = hash_words(words, 3);
  }
}

static uint64_t sched_hash(const pcp_topology_sched_t* s) {
  uint64_t words[6] = {
      (uint64_t)s->decision,
      (uint64_t)s->violation,
      pcp_topology_sched_count_state(s, PCP_TOPOLOGY_WORKER_IDLE),
      pcp_topology_sched_count_state(s, PCP_TOPOLOGY_WORKER_RESERVED),
      pcp_topology_sched_count_state(s, PCP_TOPOLOGY_WORKER_ASSIGNED),
      s->queue_count,
  };
  return hash_words(words, 6);
}

static void sched_two_cuda(pcp_topology_sched_t* s, uint32_t workers,
                           bool bug) {
  pcp_topology_sched_initialize(s);
  s->bug_ignore_reserved_capacity = bug;
  for (uint32_t i = 0; i < workers; ++i) {
    pcp_status_ignore(pcp_topology_sched_add_worker(
        s, i + 1, PCP_TOPOLOGY_WORKER_CLASS_CUDA, "sm_80"));
  }
  for (uint32_t o = 0; o < PCP_TOPOLOGY_SCHED_OWNER_COUNT; ++o) {
    s->policies[o].worker_class = PCP_TOPOLOGY_WORKER_CLASS_CUDA;
  }
}

static void lease_labels(const pcp_topology_sched_t* s, int32_t slot,
                         case_run_t* run) {
  if (slot >= 0) {
    run_views(run, "view.lease.reserved", "view.reservation.active",
              "view.worker.leased");
    run_decided(run, "lease.reserved", "reservation.active",
                "worker.leased.training");
  } else if (s->block == PCP_TOPOLOGY_SCHED_BLOCK_MAX_WORKERS) {
    run_views(run, "view.lease.rejected.max_workers",
              "view.reservation.rejected", "view.worker.unleased");
    run_decided(run, "lease.rejected.max_workers", "reservation.rejected",
                "worker.unleased");
  } else if (s->block == PCP_TOPOLOGY_SCHED_BLOCK_RESERVED_CAPACITY) {
    run_views(run, "view.lease.deferred.preserve_capacity",
              "view.reservation.deferred", "view.worker.held_for_inference");
    run_decided(run, "lease.deferred.preserve_capacity", "reservation.deferred",
                "worker.reserved_for_inference");
  } else {
    run_views(run, "view.lease.rejected.no_capacity",
              "view.reservation.rejected", "view.worker.unleased");
    run_decided(run, "lease.rejected.max_workers", "reservation.rejected",
                "worker.unleased");
  }
}

static void extract_lease(bool bug, runs_t* runs) {
  pcp_topology_sched_t s;
  // j10: idle capacity.
  sched_two_cuda(&s, 1, bug);
  case_run_t* run = runs_add(runs, 0);
  int32_t slot =
      pcp_topology_sched_reserve(&s, 10, PCP_TOPOLOGY_SCHED_OWNER_TRAINING, 1);
  lease_labels(&s, slot, run);
  run_event(run, PCP_TOPOLOGY_EVENT_LEASE_RESERVE, 0, 1, 10);
  run->state_hash = sched_hash(&s);
  // j11: the training owner is at max_workers.
  sched_two_cuda(&s, 2, bug);
  s.policies[PCP_TOPOLOGY_SCHED_OWNER_TRAINING].max_workers = 1;
  run = runs_add(runs, 1);
  (void)pcp_topology_sched_reserve(&s, 9, PCP_TOPOLOGY_SCHED_OWNER_TRAINING, 1);
  slot =
      pcp_topology_sched_reserve(&s, 11, PCP_TOPOLOGY_SCHED_OWNER_TRAINING, 1);
  lease_labels(&s, slot, run);
  run_event(run, PCP_TOPOLOGY_EVENT_LEASE_RESERVE, 0, 1, 1);
  run_event(run, PCP_TOPOLOGY_EVENT_LEASE_RESERVE, 0, 1, 11);
  run->state_hash = sched_hash(&s);
  // j12: inference keeps one of two workers reserved; training wants both.
  sched_two_cuda(&s, 2, bug);
  s.policies[PCP_TOPOLOGY_SCHED_OWNER_INFERENCE].reserved_workers = 1;
  run = runs_add(runs, 2);
  slot =
      pcp_topology_sched_reserve(&s, 12, PCP_TOPOLOGY_SCHED_OWNER_TRAINING, 2);
  lease_labels(&s, slot, run);
  run_event(run, PCP_TOPOLOGY_EVENT_LEASE_RESERVE, 0, 1, 12);
  run->state_hash = sched_hash(&s);
}

static const char* worker_state_view(const pcp_topology_sched_t* s) {
  return pcp_topology_sched_count_state(s, PCP_TOPOLOGY_WORKER_IDLE) ==
                 s->worker_count
             ? "view.worker.idle"
             : "view.worker.leased";
}

static const char* worker_state_output(const pcp_topology_sched_t* s) {
  return pcp_topology_sched_count_state(s, PCP_TOPOLOGY_WORKER_IDLE) ==
                 s->worker_count
             ? "worker.idle"
             : "worker.leased.training";
}

static void extract_reservation(bool bug, runs_t* runs) {
  for (uint32_t c = 0; c < 4; ++c) {
    pcp_topology_sched_t s;
    sched_two_cuda(&s, 1, false);
    s.bug_leak_on_cancel = bug;
    uint32_t job = 20 + c;
    case_run_t* run = runs_add(runs, c);
    (void)pcp_topology_sched_reserve(&s, job, PCP_TOPOLOGY_SCHED_OWNER_TRAINING,
                                     1);
    run_event(run, PCP_TOPOLOGY_EVENT_LEASE_RESERVE, 0, 1, job);
    switch (c) {
      case 0:
        pcp_topology_sched_commit_to_queue(&s, job);
        run_event(run, PCP_TOPOLOGY_EVENT_LEASE_COMMIT, 0, 1, job);
        run->views[0] = "view.reservation.committed";
        run->views[1] = "view.job.queued_reserved";
        run->decided[0] = "reservation.committed";
        run->decided[1] = "job.queued_reserved";
        break;
      case 1:
        pcp_topology_sched_release(&s, job);
        run_event(run, PCP_TOPOLOGY_EVENT_LEASE_RELEASE, 0, 1, job);
        run->views[0] = "view.reservation.released";
        run->views[1] = "view.job.not_queued";
        run->decided[0] = "reservation.released";
        run->decided[1] = "job.not_queued";
        break;
      case 2:
        pcp_topology_sched_expire(&s, job);
        run_event(run, PCP_TOPOLOGY_EVENT_LEASE_EXPIRE, 0, NN, job);
        run->views[0] = "view.reservation.expired";
        run->views[1] = "view.job.not_queued";
        run->decided[0] = "reservation.expired";
        run->decided[1] = "job.not_queued";
        break;
      default:
        pcp_topology_sched_commit_to_queue(&s, job);
        pcp_topology_sched_cancel_queued(&s, job);
        run_event(run, PCP_TOPOLOGY_EVENT_LEASE_COMMIT, 0, 1, job);
        run_event(run, PCP_TOPOLOGY_EVENT_CANCEL, 0, NN, job);
        run->views[0] = "view.reservation.canceled";
        run->views[1] = "view.job.canceled";
        run->decided[0] = "reservation.canceled.cleanup_complete";
        run->decided[1] = "job.canceled";
        break;
    }
    // The worker reports only what it can observe: held or idle.
    run->views[2] = worker_state_view(&s);
    run->decided[2] = worker_state_output(&s);
    run->state_hash = sched_hash(&s);
  }
}

static void federation_setup(pcp_topology_federation_t* f, bool compatible,
                             bool bug) {
  pcp_topology_federation_initialize(f);
  f->bug_accept_stale = bug;
  int32_t g = pcp_topology_federation_register(f, "gateway-a");
  pcp_topology_federation_service_t service;
  memset(&service, 0, sizeof(service));
  service.service_type = compatible ? "training" : "inference";
  service.workers_available = 2;
  service.workers_ready = 2;
  service.health_ok = true;
  service.updated_at = 1;
  (void)pcp_topology_federation_add_service(f, g, &service);
}

static void extract_federation(bool bug, runs_t* runs) {
  pcp_topology_federation_selector_t selector = {"gateway-a", "training", 1};
  for (uint32_t c = 0; c < 4; ++c) {
    pcp_topology_federation_t f;
    federation_setup(&f, c != 3, bug);
    // Case runs 0 and 1 both realise task case 0 (placed, or lost after
    // routing); runs 2 and 3 are the stale and incompatible inputs.
    case_run_t* run = runs_add(runs, c == 0 ? 0 : c - 1);
    if (c == 2)
      pcp_topology_federation_mark_stale(&f, 0);
    pcp_topology_federation_placement_t placement =
        pcp_topology_federation_place(&f, &selector);
    if (c == 1)
      pcp_topology_federation_lose_gateway(&f, 0);
    pcp_topology_federation_violation_t outcome =
        pcp_topology_federation_complete_routed(&f, &placement);
    switch (outcome) {
      case PCP_TOPOLOGY_FEDERATION_VIOLATION_NONE:
        run_views(run, "view.placement.selected", "view.route.forwarded",
                  "view.job.forwarded");
        run_decided(run, "placement.placed", "gateway.route.accepted",
                    "job.forwarded");
        break;
      case PCP_TOPOLOGY_FEDERATION_VIOLATION_FAILED_AFTER_PLACEMENT_LOSS:
        run_views(run, "view.placement.lost", "view.gateway.lost_after_route",
                  "view.job.retry");
        run_decided(run, "placement.failed_after_loss", "gateway.route_lost",
                    "job.failed_retryable");
        break;
      case PCP_TOPOLOGY_FEDERATION_VIOLATION_STALE_GATEWAY:
        run_views(run, "view.placement.rejected.stale",
                  "view.gateway.not_selected", "view.job.not_forwarded");
        run_decided(run, "placement.rejected.stale", "gateway.not_selected",
                    "job.rejected");
        break;
      default:
        run_views(run, "view.placement.rejected.incompatible",
                  "view.gateway.not_selected", "view.job.not_forwarded");
        run_decided(run, "placement.rejected.incompatible",
                    "gateway.not_selected", "job.rejected");
        break;
    }
    switch (c) {
      case 0:
        run_event(run, PCP_TOPOLOGY_EVENT_JOIN, 1, NN, 0);
        run_event(run, PCP_TOPOLOGY_EVENT_SEND, 0, 1, 30);
        run_event(run, PCP_TOPOLOGY_EVENT_DELIVER, 1, 0, 30);
        break;
      case 1:
        run_event(run, PCP_TOPOLOGY_EVENT_JOIN, 1, NN, 0);
        run_event(run, PCP_TOPOLOGY_EVENT_SEND, 0, 1, 30);
        run_event(run, PCP_TOPOLOGY_EVENT_CRASH, 1, NN, 0);
        run_event(run, PCP_TOPOLOGY_EVENT_TIMEOUT, 0, NN, 0);
        break;
      case 2:
        run_event(run, PCP_TOPOLOGY_EVENT_HEARTBEAT, 1, 0, 0);
        run_event(run, PCP_TOPOLOGY_EVENT_TIMEOUT, 0, NN, 0);
        break;
      default:
        run_event(run, PCP_TOPOLOGY_EVENT_JOIN, 1, NN, 0);
        run_event(run, PCP_TOPOLOGY_EVENT_DROP, 0, 1, 32);
        break;
    }
    uint64_t words[3] = {c, (uint64_t)outcome, f.gateways[0].generation};
    run->state_hash = hash_words(words, 3);
  }
}

static void decoupled_do(pcp_topology_decoupled_t* d, case_run_t* run,
                         pcp_topology_decoupled_action_kind_t kind,
                         uint32_t worker, uint64_t clock, bool mismatch,
                         bool* inout_rejected) {
  pcp_topology_decoupled_action_t a;
  memset(&a, 0, sizeof(a));
  a.kind = kind;
  a.worker = worker;
  a.session = d->session;
  a.fragment = d->fragment;
  a.step = d->step;
  a.clock = clock;
  a.payload_mismatch = mismatch;
  bool duplicate_before = kind == PCP_TOPOLOGY_DECOUPLED_SUBMIT &&
                          ((d->accepted_mask >> worker) & 1u);
  pcp_topology_decoupled_apply(d, &a);
  if (d->decision == PCP_TOPOLOGY_DECOUPLED_UPDATE_REJECTED) {
    *inout_rejected = true;
  }
  pcp_topology_event_tag_t tag = PCP_TOPOLOGY_EVENT_NOOP;
  uint16_t peer = NN;
  switch (kind) {
    case PCP_TOPOLOGY_DECOUPLED_ASSIGN:
      tag = PCP_TOPOLOGY_EVENT_JOIN;
      break;
    case PCP_TOPOLOGY_DECOUPLED_LOCAL_STEP_COMPLETE:
      tag = PCP_TOPOLOGY_EVENT_LOCAL_STEP_COMPLETE;
      break;
    case PCP_TOPOLOGY_DECOUPLED_SUBMIT:
      tag = duplicate_before ? PCP_TOPOLOGY_EVENT_DUPLICATE
                             : PCP_TOPOLOGY_EVENT_DELIVER;
      peer = 0;
      break;
    case PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW:
      tag = PCP_TOPOLOGY_EVENT_TIMEOUT;
      break;
    case PCP_TOPOLOGY_DECOUPLED_CANCEL_SESSION:
      tag = PCP_TOPOLOGY_EVENT_CANCEL;
      break;
    case PCP_TOPOLOGY_DECOUPLED_CRASH:
      tag = PCP_TOPOLOGY_EVENT_CRASH;
      break;
    case PCP_TOPOLOGY_DECOUPLED_RESTART:
      tag = PCP_TOPOLOGY_EVENT_RESTART;
      break;
    case PCP_TOPOLOGY_DECOUPLED_FORCE_COMMIT:
      tag = PCP_TOPOLOGY_EVENT_TIMEOUT;
      break;
  }
  uint16_t actor = kind == PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW ||
                           kind == PCP_TOPOLOGY_DECOUPLED_CANCEL_SESSION
                       ? 0
                       : (uint16_t)(worker + 1);
  run_event(run, tag, actor, peer, d->session);
}

static void extract_decoupled(bool bug, runs_t* runs) {
  const pcp_topology_decoupled_action_kind_t A = PCP_TOPOLOGY_DECOUPLED_ASSIGN;
  const pcp_topology_decoupled_action_kind_t L =
      PCP_TOPOLOGY_DECOUPLED_LOCAL_STEP_COMPLETE;
  const pcp_topology_decoupled_action_kind_t S = PCP_TOPOLOGY_DECOUPLED_SUBMIT;
  const pcp_topology_decoupled_action_kind_t T =
      PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW;
  const pcp_topology_decoupled_action_kind_t C =
      PCP_TOPOLOGY_DECOUPLED_CANCEL_SESSION;
  for (uint32_t c = 0; c < 6; ++c) {
    pcp_topology_decoupled_t d;
    pcp_topology_decoupled_initialize(40 + c, 2, 2, 1, &d);
    d.bug_count_duplicates = bug;
    case_run_t* run = runs_add(runs, c);
    bool rejected = false;
    pcp_topology_decoupled_violation_t worker_violation =
        PCP_TOPOLOGY_DECOUPLED_VIOLATION_NONE;
    switch (c) {
      case 0:  // quorum commit
        decoupled_do(&d, run, A, 0, 0, false, &rejected);
        decoupled_do(&d, run, A, 1, 0, false, &rejected);
        decoupled_do(&d, run, L, 0, 0, false, &rejected);
        decoupled_do(&d, run, L, 1, 0, false, &rejected);
        decoupled_do(&d, run, S, 0, 1, false, &rejected);
        decoupled_do(&d, run, S, 1, 1, false, &rejected);
        break;
      case 1:  // below quorum
        decoupled_do(&d, run, A, 0, 0, false, &rejected);
        decoupled_do(&d, run, A, 1, 0, false, &rejected);
        decoupled_do(&d, run, S, 0, 1, false, &rejected);
        break;
      case 2:  // duplicate sender
        decoupled_do(&d, run, A, 0, 0, false, &rejected);
        decoupled_do(&d, run, A, 1, 0, false, &rejected);
        decoupled_do(&d, run, L, 0, 0, false, &rejected);
        decoupled_do(&d, run, S, 0, 1, false, &rejected);
        decoupled_do(&d, run, S, 0, 1, false, &rejected);
        break;
      case 3:  // payload disagrees with its envelope
        decoupled_do(&d, run, A, 0, 0, false, &rejected);
        decoupled_do(&d, run, S, 0, 1, true, &rejected);
        break;
      case 4:  // vector clock goes backwards
        decoupled_do(&d, run, A, 0, 0, false, &rejected);
        // Observed from the worker's metadata (the real clock's max).
        pcp_topology_decoupled_observe_metadata(&d, 0, 2);
        decoupled_do(&d, run, S, 0, 1, false, &rejected);
        break;
      default:  // update after cancellation
        decoupled_do(&d, run, C, 0, 0, false, &rejected);
        decoupled_do(&d, run, S, 0, 1, false, &rejected);
        break;
    }
    worker_violation = d.violation;
    decoupled_do(&d, run, T, 0, 0, false, &rejected);
    switch (d.decision) {
      case PCP_TOPOLOGY_DECOUPLED_MERGE_COMMITTED:
        run_views(run, "view.merge.committed", "view.session.progressed",
                  "view.update.accepted");
        run_decided(run, "merge.committed", "session.progressed",
                    "update.accepted");
        break;
      case PCP_TOPOLOGY_DECOUPLED_CANCELED:
        run_views(run, "view.merge.canceled", "view.session.canceled",
                  "view.update.rejected.post_cancel");
        run_decided(run, "merge.canceled", "session.canceled",
                    "update.rejected.post_cancel");
        break;
      default:
        if (!rejected) {
          run_views(run, "view.merge.deferred", "view.session.waiting",
                    "view.update.pending");
          run_decided(run, "merge.deferred", "session.waiting",
                      "update.pending");
          break;
        }
        run->views[0] = "view.merge.not_committed";
        run->views[1] = "view.session.active";
        run->decided[0] = "merge.not_committed";
        run->decided[1] = "session.active";
        if (worker_violation ==
            PCP_TOPOLOGY_DECOUPLED_VIOLATION_CONTEXT_PAYLOAD_MISMATCH) {
          run->views[2] = "view.update.rejected.context";
          run->decided[2] = "update.rejected.context";
        } else if (worker_violation ==
                   PCP_TOPOLOGY_DECOUPLED_VIOLATION_STALE_VECTOR_CLOCK) {
          run->views[2] = "view.update.rejected.vector_clock";
          run->decided[2] = "update.rejected.vector_clock";
        } else {
          run->views[2] = "view.update.rejected.duplicate";
          run->decided[2] = "update.rejected.duplicate";
        }
        break;
    }
    uint64_t words[4] = {c, (uint64_t)d.decision, d.step, d.tape_entries};
    run->state_hash = hash_words(words, 4);
  }
}

static void extract_rda(bool bug, runs_t* runs) {
  static const double kDirection[2][2] = {{1.0, 1.0}, {1.0, -1.0}};
  static const double kDegenerate[2][2] = {{1.0, 0.0}, {-1.0, 0.0}};
  const uint32_t quorum = 2;
  for (uint32_t c = 0; c < 3; ++c) {
    pcp_topology_rda_update_t updates[2];
    const double(*values)[2] = c == 1 ? kDegenerate : kDirection;
    size_t count = c == 2 ? 1 : 2;
    for (size_t i = 0; i < 2; ++i) {
      updates[i].values = values[i];
      updates[i].tokens = 10;
      updates[i].steps = 1;
    }
    double out[2] = {0.0, 0.0};
    case_run_t* run = runs_add(runs, c);
    bool below_quorum = count < quorum;
    if (below_quorum && bug) {
      // Injected bug: the merge path averages whatever arrived and
      // publishes it, ignoring the quorum the session still enforces.
      pcp_topology_direct_average(updates, count, 2, out);
      run_views(run, "view.rda.output.direct_average", "view.merge.deferred",
                "view.participants.averaged");
      run_decided(run, "rda.output.direction_norm_carried", "merge.deferred",
                  "participants.used");
    } else if (below_quorum) {
      run_views(run, "view.rda.output.none", "view.merge.deferred",
                "view.participants.insufficient");
      run_decided(run, "rda.output.none", "merge.deferred",
                  "participants.insufficient");
    } else {
      // The published values are the library's merge (f32); the referee
      // (oracles.c) keeps its own double formula.
      (void)pcp_topology_rda_merge_real(updates, count, 2, out);
      bool zero = out[0] == 0.0 && out[1] == 0.0;
      if (zero) {
        run_views(run, "view.rda.output.zero", "view.merge.committed",
                  "view.participants.canceling");
        run_decided(run, "rda.output.zero", "merge.committed",
                    "participants.canceling_direction");
      } else {
        run_views(run, "view.rda.output.direction", "view.merge.committed",
                  "view.participants.used");
        run_decided(run, "rda.output.direction_norm_carried", "merge.committed",
                    "participants.used");
      }
    }
    for (size_t i = 0; i < count; ++i) {
      run_event(run, PCP_TOPOLOGY_EVENT_DELIVER, (uint16_t)(i + 1), 0, 50 + c);
    }
    run_event(run,
              below_quorum ? PCP_TOPOLOGY_EVENT_TIMEOUT
                           : PCP_TOPOLOGY_EVENT_LOCAL_STEP_COMPLETE,
              0, NN, 50 + c);
    uint64_t words[3] = {c, (uint64_t)(out[0] * 1e6), (uint64_t)(out[1] * 1e6)};
    run->state_hash = hash_words(words, 3);
  }
}

//===----------------------------------------------------------------------===//
// Building an instance from runs
//===----------------------------------------------------------------------===//

void pcp_topology_model_instance_initialize(
    pcp_allocator_t allocator, pcp_topology_model_instance_t* out_instance) {
  memset(out_instance, 0, sizeof(*out_instance));
  out_instance->allocator = allocator;
}

void pcp_topology_model_instance_deinitialize(
    pcp_topology_model_instance_t* instance) {
  if (instance->decision)
    pcp_topology_vertex_map_release(instance->decision);
  if (instance->execution)
    pcp_topology_carrier_map_release(instance->execution);
  if (instance->protocol)
    pcp_topology_complex_release(instance->protocol);
  pcp_topology_task_deinitialize(&instance->task);
  for (size_t i = 0; i < instance->trace_count; ++i) {
    pcp_topology_trace_deinitialize(&instance->traces[i]);
  }
  if (instance->traces) {
    pcp_allocator_free(instance->allocator, instance->traces);
  }
  pcp_allocator_t allocator = instance->allocator;
  memset(instance, 0, sizeof(*instance));
  instance->allocator = allocator;
}

static void run_vertices(const pcp_topology_task_case_t* task_case,
                         const char* const* labels,
                         pcp_topology_vertex_t* out) {
  for (uint32_t i = 0; i < task_case->color_count; ++i) {
    out[i] = pcp_topology_make_vertex(task_case->colors[i],
                                      pcp_topology_make_symbol(labels[i]));
  }
}

static pcp_status_t instance_build_execution(pcp_topology_model_instance_t* m,
                                             const runs_t* runs) {
  const pcp_topology_task_definition_t* def = m->task.definition;
  pcp_allocator_t a = m->allocator;
  pcp_topology_vertex_t facet[PCP_TOPOLOGY_TASK_MAX_COLORS];
  pcp_topology_vertex_t view[PCP_TOPOLOGY_TASK_MAX_COLORS];
  pcp_topology_vertex_t projected[PCP_TOPOLOGY_TASK_MAX_COLORS];
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(a, &m->protocol));
  for (uint32_t r = 0; r < runs->count; ++r) {
    const pcp_topology_task_case_t* tc = &def->cases[runs->items[r].task_case];
    run_vertices(tc, runs->items[r].views, view);
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_add(
        m->protocol, pcp_topology_make_simplex(view, tc->color_count), NULL));
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_carrier_map_create(
      m->task.input, m->protocol, a, &m->execution));
  pcp_topology_complex_t* faces = NULL;
  pcp_topology_complex_t* image = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(a, &faces));
  pcp_status_t status = pcp_topology_complex_create(a, &image);
  if (!status)
    status = pcp_topology_complex_faces(m->task.input, faces);
  for (size_t f = 0; !status && f < pcp_topology_complex_count(faces); ++f) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, f);
    pcp_topology_complex_clear(image);
    size_t covering = 0;
    if (face.count == 0) {
      status = pcp_topology_complex_append(image, face);
      covering = 1;
    }
    for (uint32_t r = 0; !status && face.count && r < runs->count; ++r) {
      const pcp_topology_task_case_t* tc =
          &def->cases[runs->items[r].task_case];
      pcp_topology_task_case_vertices(tc, -1, facet);
      if (!pcp_topology_simplex_is_subset(
              face, pcp_topology_make_simplex(facet, tc->color_count))) {
        continue;
      }
      covering++;
      run_vertices(tc, runs->items[r].views, view);
      bool complete = false;
      status = pcp_topology_project_to_colors(
          pcp_topology_make_simplex(view, tc->color_count), face, projected,
          &complete);
      if (!status && !complete) {
        status = pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_PROTOCOL_FACET_MISSING_COLOR,
            "run %u lacks a colour of input face %zu", r, f);
      }
      if (!status) {
        status = pcp_topology_complex_add(
            image, pcp_topology_make_simplex(projected, face.count), NULL);
      }
    }
    if (!status && covering == 0) {
      status = pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_UNCOVERED_EXTRACTED_INPUT_FACE,
          "no generated case covers input face %zu", f);
    }
    if (!status) {
      status = pcp_topology_carrier_map_set(m->execution, face, image);
    }
  }
  pcp_topology_complex_release(faces);
  if (image)
    pcp_topology_complex_release(image);
  if (status)
    return status;
  pcp_topology_carrier_checks_t checks = pcp_topology_carrier_checks_default();
  checks.chromatic = true;
  return pcp_topology_carrier_map_validate(m->execution, checks);
}

// The implementation's own delta: each view maps to the same-colour vertex
// of what the run decided. A view reached by runs that decide differently,
// or a decision that is not an output vertex, leaves delta unset and is
// recorded in |decision_error|.
static pcp_status_t instance_build_decision(pcp_topology_model_instance_t* m,
                                            const runs_t* runs) {
  const pcp_topology_task_definition_t* def = m->task.definition;
  pcp_topology_vertex_list_t sources;
  pcp_topology_vertex_list_initialize(m->allocator, &sources);
  pcp_status_t status = pcp_topology_complex_vertices(m->protocol, &sources);
  pcp_topology_vertex_map_t* map = NULL;
  if (!status) {
    status = pcp_topology_vertex_map_create(m->protocol, m->task.output,
                                            m->allocator, &map);
  }
  for (size_t i = 0; !status && i < sources.count && !m->decision_error[0];
       ++i) {
    const pcp_topology_vertex_t* v = &sources.items[i];
    bool have = false;
    pcp_topology_vertex_t target;
    for (uint32_t r = 0; r < runs->count; ++r) {
      const pcp_topology_task_case_t* tc =
          &def->cases[runs->items[r].task_case];
      for (uint32_t k = 0; k < tc->color_count; ++k) {
        pcp_topology_vertex_t view = pcp_topology_make_vertex(
            tc->colors[k], pcp_topology_make_symbol(runs->items[r].views[k]));
        if (!pcp_topology_vertex_equal(&view, v))
          continue;
        pcp_topology_vertex_t decided = pcp_topology_make_vertex(
            tc->colors[k], pcp_topology_make_symbol(runs->items[r].decided[k]));
        if (have && !pcp_topology_vertex_equal(&decided, &target)) {
          snprintf(m->decision_error, sizeof(m->decision_error),
                   "MissingDecisionTarget: view %s decides both %s and %s",
                   runs->items[r].views[k], target.label.symbol,
                   decided.label.symbol);
        }
        target = decided;
        have = true;
      }
    }
    if (m->decision_error[0])
      break;
    if (!have)
      continue;
    if (!pcp_topology_complex_contains(m->task.output,
                                       pcp_topology_make_simplex(&target, 1))) {
      snprintf(m->decision_error, sizeof(m->decision_error),
               "TargetVertexOutsideCodomain: view %s decides %s, which is not "
               "an output of the task",
               v->label.symbol, target.label.symbol);
      break;
    }
    status = pcp_topology_vertex_map_set(map, v, &target);
  }
  pcp_topology_vertex_list_deinitialize(&sources);
  if (!status && !m->decision_error[0]) {
    m->decision = map;
    map = NULL;
  }
  if (map)
    pcp_topology_vertex_map_release(map);
  return status;
}

static pcp_status_t instance_record_traces(pcp_topology_model_instance_t* m,
                                           const runs_t* runs) {
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      m->allocator, (runs->count ? runs->count : 1) * sizeof(*m->traces),
      (void**)&m->traces));
  for (uint32_t r = 0; r < runs->count; ++r) {
    const case_run_t* run = &runs->items[r];
    if (run->event_count == 0) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_PROTOCOL_SIMPLEX_MISSING_TRACE_WITNESS,
          "generated case %u has no events", r);
    }
    // The trace seed is the case ordinal; the snapshot carries the model's
    // state hash so a replay can be compared with the recorded run.
    pcp_topology_trace_initialize(m->allocator, r, &m->traces[r]);
    m->trace_count = r + 1;
    m->trace_task_case[r] = run->task_case;
    for (uint32_t e = 0; e < run->event_count; ++e) {
      PCP_RETURN_IF_ERROR_BARE(
          pcp_topology_trace_append(&m->traces[r], run->events[e]));
    }
    pcp_topology_snapshot_t snapshot;
    memset(&snapshot, 0, sizeof(snapshot));
    snapshot.steps = run->event_count;
    snapshot.checksum = run->state_hash;
    pcp_topology_trace_finish(&m->traces[r], &snapshot);
  }
  return pcp_ok_status();
}

static pcp_status_t instance_from_runs(pcp_topology_task_kind_t kind,
                                       const runs_t* runs,
                                       pcp_topology_model_instance_t* m) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_task_build(kind, m->allocator, &m->task));
  PCP_RETURN_IF_ERROR(instance_build_execution(m, runs), "generated Xi");
  PCP_RETURN_IF_ERROR(instance_build_decision(m, runs), "extracted delta");
  return instance_record_traces(m, runs);
}

//===----------------------------------------------------------------------===//
// The toy complexes
//===----------------------------------------------------------------------===//

// Split brain after a partition: the gateway revokes the lease and the
// worker keeps it. Each outcome is allowed alone, the pair is not, yet the
// two views stay connected: no decision map exists.
static pcp_status_t build_partition(pcp_topology_model_instance_t* m) {
  pcp_allocator_t a = m->allocator;
  pcp_topology_color_t gw = {PCP_TOPOLOGY_COLOR_GATEWAY, 0};
  pcp_topology_color_t wk = {PCP_TOPOLOGY_COLOR_WORKER, 0};
  pcp_topology_vertex_t in[2] = {
      pcp_topology_make_vertex(gw, pcp_topology_make_symbol("lease.holder")),
      pcp_topology_make_vertex(wk, pcp_topology_make_symbol("lease.held"))};
  pcp_topology_vertex_t view[2] = {
      pcp_topology_make_vertex(gw,
                               pcp_topology_make_symbol("view.heartbeat_lost")),
      pcp_topology_make_vertex(
          wk, pcp_topology_make_symbol("view.gateway_unreachable"))};
  pcp_topology_vertex_t out[2] = {
      pcp_topology_make_vertex(gw, pcp_topology_make_symbol("lease.revoked")),
      pcp_topology_make_vertex(wk, pcp_topology_make_symbol("lease.kept"))};
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(a, &m->task.input));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(a, &m->task.output));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(a, &m->protocol));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_add(
      m->task.input, pcp_topology_make_simplex(in, 2), NULL));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_add(
      m->protocol, pcp_topology_make_simplex(view, 2), NULL));
  for (int i = 0; i < 2; ++i) {
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_add(
        m->task.output, pcp_topology_make_simplex(&out[i], 1), NULL));
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_carrier_map_create(
      m->task.input, m->task.output, a, &m->task.carrier));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_carrier_map_create(
      m->task.input, m->protocol, a, &m->execution));
  pcp_topology_complex_t* faces = NULL;
  pcp_topology_complex_t* image = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(a, &faces));
  pcp_status_t status = pcp_topology_complex_create(a, &image);
  if (!status)
    status = pcp_topology_complex_faces(m->task.input, faces);
  for (size_t f = 0; !status && f < pcp_topology_complex_count(faces); ++f) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, f);
    pcp_topology_vertex_t projected[2];
    // Xi: the colour projection of the one view facet.
    pcp_topology_complex_clear(image);
    uint32_t n = 0;
    for (uint32_t i = 0; i < 2; ++i) {
      if (pcp_topology_simplex_vertex_with_color(face, view[i].color) >= 0) {
        projected[n++] = view[i];
      }
    }
    status = pcp_topology_complex_add(
        image, pcp_topology_make_simplex(projected, n), NULL);
    if (!status)
      status = pcp_topology_carrier_map_set(m->execution, face, image);
    // Delta: each process's outcome alone; never the pair.
    pcp_topology_complex_clear(image);
    if (!status && face.count == 0) {
      status = pcp_topology_complex_append(image, face);
    }
    for (uint32_t i = 0; !status && i < 2; ++i) {
      if (pcp_topology_simplex_vertex_with_color(face, out[i].color) >= 0) {
        status = pcp_topology_complex_add(
            image, pcp_topology_make_simplex(&out[i], 1), NULL);
      }
    }
    if (!status) {
      status = pcp_topology_carrier_map_set(m->task.carrier, face, image);
    }
  }
  pcp_topology_complex_release(faces);
  if (image)
    pcp_topology_complex_release(image);
  return status;
}

// Reference s.3.4: I = P = one 3-simplex {hub, job61, gateway a, gateway b};
// O = the boundary of the tetrahedron on *_without_rollback labels: any
// three parties can finish without a rollback, all four cannot.
static pcp_status_t build_global_rollback_gap(
    pcp_topology_model_instance_t* m) {
  pcp_allocator_t a = m->allocator;
  static const pcp_topology_color_t kColors[4] = {
      {PCP_TOPOLOGY_COLOR_HUB, 0},
      {PCP_TOPOLOGY_COLOR_GATEWAY, 1},
      {PCP_TOPOLOGY_COLOR_GATEWAY, 2},
      {PCP_TOPOLOGY_COLOR_JOB, 61}};
  static const char* const kInputs[4] = {
      "global_job.accepted.partial_loss", "gateway_a.placed.partial_loss",
      "gateway_b.lost", "job.requires_two_gateways"};
  static const char* const kOutputs[4] = {
      "global_job.committed_without_rollback",
      "gateway_a.committed_without_rollback",
      "gateway_b.failed_without_rollback", "job.running_without_rollback"};
  pcp_topology_vertex_t in[4], out[4];
  for (int i = 0; i < 4; ++i) {
    in[i] = pcp_topology_make_vertex(kColors[i],
                                     pcp_topology_make_symbol(kInputs[i]));
    out[i] = pcp_topology_make_vertex(kColors[i],
                                      pcp_topology_make_symbol(kOutputs[i]));
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(a, &m->task.input));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(a, &m->task.output));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(a, &m->protocol));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_add(
      m->task.input, pcp_topology_make_simplex(in, 4), NULL));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_add(
      m->protocol, pcp_topology_make_simplex(in, 4), NULL));
  for (int skip = 0; skip < 4; ++skip) {
    pcp_topology_vertex_t triangle[3];
    int n = 0;
    for (int i = 0; i < 4; ++i) {
      if (i != skip)
        triangle[n++] = out[i];
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_add(
        m->task.output, pcp_topology_make_simplex(triangle, 3), NULL));
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_carrier_map_create(
      m->task.input, m->task.output, a, &m->task.carrier));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_carrier_map_create(
      m->task.input, m->protocol, a, &m->execution));
  pcp_topology_complex_t* faces = NULL;
  pcp_topology_complex_t* image = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(a, &faces));
  pcp_status_t status = pcp_topology_complex_create(a, &image);
  if (!status)
    status = pcp_topology_complex_faces(m->task.input, faces);
  for (size_t f = 0; !status && f < pcp_topology_complex_count(faces); ++f) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, f);
    pcp_topology_complex_clear(image);
    status = pcp_topology_complex_add(image, face, NULL);
    if (!status)
      status = pcp_topology_carrier_map_set(m->execution, face, image);
    // Delta: the colour projection when it is an output simplex, else all
    // of O.
    pcp_topology_vertex_t projected[4];
    bool complete = false;
    if (!status) {
      status = pcp_topology_project_to_colors(pcp_topology_make_simplex(out, 4),
                                              face, projected, &complete);
    }
    pcp_topology_simplex_t projection =
        pcp_topology_make_simplex(projected, face.count);
    pcp_topology_complex_clear(image);
    if (!status && complete &&
        pcp_topology_complex_contains(m->task.output, projection)) {
      status = pcp_topology_complex_add(image, projection, NULL);
    } else if (!status) {
      status = pcp_topology_complex_copy(m->task.output, image);
    }
    if (!status) {
      status = pcp_topology_carrier_map_set(m->task.carrier, face, image);
    }
  }
  pcp_topology_complex_release(faces);
  if (image)
    pcp_topology_complex_release(image);
  return status;
}

//===----------------------------------------------------------------------===//
// The model registry
//===----------------------------------------------------------------------===//

typedef void (*extract_fn_t)(bool bug, runs_t* runs);

static extract_fn_t extractor_for(pcp_topology_task_kind_t kind) {
  switch (kind) {
    case PCP_TOPOLOGY_TASK_MESSAGE_DISPATCH:
      return extract_message_dispatch;
    case PCP_TOPOLOGY_TASK_WORKLOAD_NORMALIZATION:
      return extract_workload;
    case PCP_TOPOLOGY_TASK_GATEWAY_LEASE_SCHEDULING:
      return extract_lease;
    case PCP_TOPOLOGY_TASK_RESERVATION_LIFECYCLE:
      return extract_reservation;
    case PCP_TOPOLOGY_TASK_FEDERATION_PLACEMENT:
      return extract_federation;
    case PCP_TOPOLOGY_TASK_DECOUPLED_FRAGMENT:
      return extract_decoupled;
    case PCP_TOPOLOGY_TASK_RDA_MERGE:
      return extract_rda;
    default:
      return NULL;
  }
}

#define W(x) PCP_TOPOLOGY_PCP_WITNESS_##x
#define T(x) PCP_TOPOLOGY_TASK_##x
#define SOLVABLE PCP_TOPOLOGY_VERDICT_SOLVABLE
#define ESCAPE PCP_TOPOLOGY_VERDICT_DECISION_ESCAPE
#define OBSTRUCTED PCP_TOPOLOGY_VERDICT_OBSTRUCTION

static const pcp_topology_model_t kModels[] = {
    {"workload_contract", T(WORKLOAD_NORMALIZATION), false, W(GENERIC),
     SOLVABLE, 2, NULL,
     "training request normalization: a regular request is accepted and "
     "routed, an invalid one rejected"},
    {"message_dispatch", T(MESSAGE_DISPATCH), false, W(GENERIC), SOLVABLE, 2,
     NULL,
     "gateway dispatch of fabric messages: commands reach their worker "
     "handler, worker results stay queued, unknown messages fail closed"},
    {"gateway_lease_scheduling", T(GATEWAY_LEASE_SCHEDULING), false, W(GENERIC),
     SOLVABLE, 2, NULL,
     "lease-owner scheduling: idle capacity is leased, max_workers and "
     "other owners' reserved_workers are respected"},
    {"reservation_lifecycle", T(RESERVATION_LIFECYCLE), false, W(GENERIC),
     SOLVABLE, 2, NULL,
     "reservation commit, release, expiry and cancellation cleanup"},
    {"federation_placement", T(FEDERATION_PLACEMENT), false, W(GENERIC),
     SOLVABLE, 2, NULL,
     "hub placement on connected compatible gateways, with loss after "
     "routing; stale and incompatible gateways rejected"},
    {"decoupled_fragment", T(DECOUPLED_FRAGMENT), false, W(GENERIC), SOLVABLE,
     2, NULL,
     "Decoupled DiLoCo fragment window: quorum commit, deferral, duplicate, "
     "context, vector-clock and post-cancel rejections"},
    {"rda_merge", T(RDA_MERGE), false, W(GENERIC), SOLVABLE, 2, NULL,
     "RDA merge: norm-carried direction, zero for a cancelling direction, "
     "nothing below quorum"},
    {"message.worker_result_to_worker", T(MESSAGE_DISPATCH), true, W(GENERIC),
     OBSTRUCTED, 2, "worker results must stay in the gateway queue",
     "regression: DecoupledFragmentUpdate routed back to a worker handler"},
    {"scheduling.cross_owner_capacity", T(GATEWAY_LEASE_SCHEDULING), true,
     W(LEASE_OWNER_CONFLICT), OBSTRUCTED, 2,
     "a lease must not starve another owner's reserved_workers",
     "regression: training leases the last worker inference reserved"},
    {"reservation.cancel_cleanup", T(RESERVATION_LIFECYCLE), true,
     W(CANCELLATION_HOLE), OBSTRUCTED, 2,
     "canceling a queued reserved job releases its workers",
     "regression: cancellation leaves the reserved worker leased"},
    {"federation.stale_gateway", T(FEDERATION_PLACEMENT), true,
     W(STALE_GATEWAY), OBSTRUCTED, 2, "a stale gateway is never selected",
     "regression: the hub places a job on a disconnected gateway"},
    {"diloco.duplicate_quorum", T(DECOUPLED_FRAGMENT), true,
     W(DUPLICATE_QUORUM), OBSTRUCTED, 2,
     "each sender counts once towards the merge quorum",
     "regression: a duplicate fragment update completes the quorum"},
    {"rda.direct_average_escape", T(RDA_MERGE), true, W(GENERIC), ESCAPE, 2,
     "below quorum the RDA merge publishes nothing",
     "regression: the merge averages directly and publishes below quorum"},
    {"global.partial_loss_without_rollback", T(MULTI_GATEWAY_GLOBAL_JOB), false,
     W(GLOBAL_ROLLBACK_GAP), OBSTRUCTED, 3,
     "a global job that loses a gateway must roll back",
     "design: a two-gateway job committing without rollback (reference "
     "s.3.4)"},
    {"partition.split_brain", T(KIND_COUNT_), false, W(PARTITION), OBSTRUCTED,
     2, "after a partition the lease has one holder",
     "toy: gateway revokes and worker keeps the lease over connected views"},
};

const pcp_topology_model_t* pcp_topology_model_catalog(size_t* out_count) {
  *out_count = PCP_ARRAYSIZE(kModels);
  return kModels;
}

const pcp_topology_model_t* pcp_topology_model_find(pcp_string_view_t name) {
  for (size_t i = 0; i < PCP_ARRAYSIZE(kModels); ++i) {
    if (pcp_string_view_equal(name, pcp_make_cstring_view(kModels[i].name))) {
      return &kModels[i];
    }
  }
  return NULL;
}

pcp_status_t pcp_topology_model_build(const pcp_topology_model_t* model,
                                      pcp_topology_model_instance_t* instance) {
  pcp_topology_model_instance_deinitialize(instance);
  pcp_status_t status;
  if (model->pcp_witness == PCP_TOPOLOGY_PCP_WITNESS_PARTITION) {
    status = build_partition(instance);
  } else if (model->task == PCP_TOPOLOGY_TASK_MULTI_GATEWAY_GLOBAL_JOB) {
    status = build_global_rollback_gap(instance);
  } else {
    extract_fn_t extract = extractor_for(model->task);
    if (!extract) {
      return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                             "model %s has no extractor", model->name);
    }
    runs_t runs;
    memset(&runs, 0, sizeof(runs));
    extract(model->inject_bug, &runs);
    status = instance_from_runs(model->task, &runs, instance);
  }
  if (status) {
    pcp_topology_model_instance_deinitialize(instance);
    return pcp_status_annotate_f(status, "model %s", model->name);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_model_instance_check_bound(
    const pcp_topology_model_instance_t* m,
    pcp_topology_extraction_bound_t bound, pcp_topology_evidence_t expected) {
  if (bound.max_cases == 0 || bound.max_traces == 0 || bound.max_events == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "extraction bounds must be positive");
  }
  const pcp_topology_task_definition_t* def = m->task.definition;
  if (!def) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "the model has no task definition");
  }
  if (def->evidence != expected) {
    return pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_EXTRACTION_EVIDENCE_MISMATCH,
        "task %s has evidence %s, expected %s", def->name,
        pcp_topology_evidence_name(def->evidence),
        pcp_topology_evidence_name(expected));
  }
  if (def->case_count > bound.max_cases || m->trace_count > bound.max_traces) {
    return pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_EXTRACTION_EVENT_BOUND_EXCEEDED,
        "%zu cases / %zu traces exceed the bound %u / %u", def->case_count,
        m->trace_count, bound.max_cases, bound.max_traces);
  }
  for (size_t t = 0; t < m->trace_count; ++t) {
    size_t events = m->traces[t].event_count;
    if (events > bound.max_events ||
        (bound.max_depth && events > bound.max_depth)) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_EXTRACTION_EVENT_BOUND_EXCEEDED,
          "trace %zu has %zu events; the bound is %u (depth %u)", t, events,
          bound.max_events, bound.max_depth);
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_rda_bridge_find(
    const pcp_topology_model_instance_t* m,
    pcp_topology_rda_bridge_t* out_bridge) {
  memset(out_bridge, 0, sizeof(*out_bridge));
  const pcp_topology_task_definition_t* def = m->task.definition;
  if (!def || def->kind != PCP_TOPOLOGY_TASK_DECOUPLED_FRAGMENT ||
      !m->decision) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "the RDA bridge needs a decoupled_fragment model "
                           "with its decision map");
  }
  // A run committed when its gateway view decides merge.committed.
  pcp_topology_vertex_t committed = pcp_topology_make_vertex(
      pcp_topology_make_color(PCP_TOPOLOGY_COLOR_GATEWAY, 0),
      pcp_topology_make_symbol("merge.committed"));
  for (size_t p = 0; p < pcp_topology_complex_count(m->protocol); ++p) {
    pcp_topology_simplex_t facet = pcp_topology_complex_simplex(m->protocol, p);
    for (uint32_t v = 0; v < facet.count; ++v) {
      pcp_topology_vertex_t target;
      if (!pcp_topology_vertex_map_lookup(m->decision, &facet.vertices[v],
                                          &target) ||
          !pcp_topology_vertex_equal(&target, &committed)) {
        continue;
      }
      for (size_t t = 0; t < m->trace_count; ++t) {
        const pcp_topology_task_case_t* c = &def->cases[m->trace_task_case[t]];
        // The run of this facet is the one whose case colours it carries.
        if (pcp_topology_simplex_vertex_with_color(facet, c->colors[1]) < 0) {
          continue;
        }
        out_bridge->decoupled_case = m->trace_task_case[t];
        out_bridge->protocol_index = p;
        out_bridge->rda_input_index = 0;  // RDA case 0: direction, quorum
        out_bridge->state_hash = m->traces[t].final_snapshot.checksum;
        return pcp_ok_status();
      }
    }
  }
  return pcp_make_status(PCP_STATUS_NOT_FOUND,
                         "no generated decoupled run committed its window");
}
