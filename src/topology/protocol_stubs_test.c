// SPDX-License-Identifier: Apache-2.0
//
// The protocol stubs the models run (reference s.6 models/ and oracles/:
// gateway scheduling, federation placement, decoupled window, message
// registry, RDA merge), with the upstream expected values.

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "sched/sched.h"
#include "topology/protocols_impl.h"

#define TRAINING PCP_TOPOLOGY_SCHED_OWNER_TRAINING
#define INFERENCE PCP_TOPOLOGY_SCHED_OWNER_INFERENCE

static void sched_with(pcp_topology_sched_t* s, uint32_t cuda_workers) {
  pcp_topology_sched_initialize(s);
  for (uint32_t i = 0; i < cuda_workers; ++i) {
    PCP_CHECK_OK(pcp_topology_sched_add_worker(
        s, i + 1, PCP_TOPOLOGY_WORKER_CLASS_CUDA, "sm_80"));
  }
  for (uint32_t o = 0; o < PCP_TOPOLOGY_SCHED_OWNER_COUNT; ++o) {
    s->policies[o].worker_class = PCP_TOPOLOGY_WORKER_CLASS_CUDA;
  }
}

// reserves first matching idle workers deterministically
static void test_sched_reserves_first_matching(void** state) {
  (void)state;
  pcp_topology_sched_t s;
  pcp_topology_sched_initialize(&s);
  PCP_CHECK_OK(pcp_topology_sched_add_worker(
      &s, 7, PCP_TOPOLOGY_WORKER_CLASS_CPU, NULL));
  PCP_CHECK_OK(pcp_topology_sched_add_worker(
      &s, 8, PCP_TOPOLOGY_WORKER_CLASS_CUDA, "sm_80"));
  PCP_CHECK_OK(pcp_topology_sched_add_worker(
      &s, 9, PCP_TOPOLOGY_WORKER_CLASS_CUDA, "sm_80"));
  s.policies[TRAINING].worker_class = PCP_TOPOLOGY_WORKER_CLASS_CUDA;
  assert_true(pcp_topology_sched_reserve(&s, 1, TRAINING, 2) >= 0);
  assert_int_equal(s.workers[0].state, PCP_TOPOLOGY_WORKER_IDLE);
  assert_int_equal(s.workers[1].state, PCP_TOPOLOGY_WORKER_RESERVED);
  assert_int_equal(s.workers[2].state, PCP_TOPOLOGY_WORKER_RESERVED);
  assert_int_equal(s.workers[1].id, 8);
  assert_int_equal(s.workers[2].id, 9);
}

// rejects duplicate active reservation for one job; catches release
// without reservation
static void test_sched_rejects_duplicates_and_unknown(void** state) {
  (void)state;
  pcp_topology_sched_t s;
  sched_with(&s, 2);
  assert_true(pcp_topology_sched_reserve(&s, 5, TRAINING, 1) >= 0);
  assert_int_equal(pcp_topology_sched_reserve(&s, 5, TRAINING, 1), -1);
  assert_int_equal(s.violation,
                   PCP_TOPOLOGY_SCHED_VIOLATION_DUPLICATE_JOB_RESERVATION);
  pcp_topology_sched_release(&s, 77);
  assert_int_equal(s.violation,
                   PCP_TOPOLOGY_SCHED_VIOLATION_RESERVATION_NOT_FOUND);
  assert_int_equal(pcp_topology_sched_reserve(&s, 6, TRAINING, 0), -1);
  assert_int_equal(s.violation, PCP_TOPOLOGY_SCHED_VIOLATION_INVALID_REQUEST);
}

// catches assignment after worker loss
static void test_sched_assignment_after_worker_loss(void** state) {
  (void)state;
  pcp_topology_sched_t s;
  sched_with(&s, 1);
  assert_true(pcp_topology_sched_reserve(&s, 5, TRAINING, 1) >= 0);
  pcp_topology_sched_lose_worker(&s, 1);
  pcp_topology_sched_commit(&s, 5);
  assert_int_equal(s.violation,
                   PCP_TOPOLOGY_SCHED_VIOLATION_ASSIGNMENT_AFTER_WORKER_LOSS);
}

// reservation expiry releases workers
static void test_sched_expiry_releases(void** state) {
  (void)state;
  pcp_topology_sched_t s;
  sched_with(&s, 2);
  assert_true(pcp_topology_sched_reserve(&s, 5, TRAINING, 2) >= 0);
  pcp_topology_sched_expire(&s, 5);
  assert_int_equal(s.decision, PCP_TOPOLOGY_SCHED_EXPIRED);
  assert_int_equal(pcp_topology_sched_count_state(&s, PCP_TOPOLOGY_WORKER_IDLE),
                   2);
  assert_int_equal(pcp_topology_sched_active_reservations(&s), 0);
}

// owner max workers caps additional leases
static void test_sched_owner_max_workers(void** state) {
  (void)state;
  pcp_topology_sched_t s;
  sched_with(&s, 2);
  s.policies[TRAINING].max_workers = 1;
  assert_true(pcp_topology_sched_reserve(&s, 5, TRAINING, 1) >= 0);
  assert_int_equal(pcp_topology_sched_owner_leases(&s, TRAINING), 1);
  assert_int_equal(pcp_topology_sched_owner_available(&s, TRAINING), 0);
  assert_int_equal(pcp_topology_sched_reserve(&s, 6, TRAINING, 1), -1);
  assert_int_equal(s.block, PCP_TOPOLOGY_SCHED_BLOCK_MAX_WORKERS);
}

// cross owner reserved capacity is preserved
static void test_sched_cross_owner_capacity(void** state) {
  (void)state;
  pcp_topology_sched_t s;
  sched_with(&s, 2);
  s.policies[INFERENCE].reserved_workers = 1;
  assert_int_equal(pcp_topology_sched_reserve(&s, 5, TRAINING, 2), -1);
  assert_int_equal(s.block, PCP_TOPOLOGY_SCHED_BLOCK_RESERVED_CAPACITY);
  assert_int_equal(pcp_topology_sched_count_state(&s, PCP_TOPOLOGY_WORKER_IDLE),
                   2);
  assert_int_equal(pcp_topology_sched_owner_leases(&s, TRAINING), 0);
  assert_int_equal(pcp_topology_sched_owner_available(&s, TRAINING), 1);
  assert_int_equal(pcp_topology_sched_owner_capacity(&s, INFERENCE), 2);
}

// reserved job commit is queued ahead of normal jobs
static void test_sched_reserved_commit_jumps_queue(void** state) {
  (void)state;
  pcp_topology_sched_t s;
  sched_with(&s, 2);
  pcp_topology_sched_enqueue(&s, 30, TRAINING, 1);
  assert_true(pcp_topology_sched_reserve(&s, 31, TRAINING, 1) >= 0);
  pcp_topology_sched_commit_to_queue(&s, 31);
  assert_int_equal(s.queue[0].job, 31);
  assert_int_equal(s.queue_count, 2);
  assert_int_equal(pcp_topology_sched_start_next(&s), 31);
  assert_int_equal(
      pcp_topology_sched_count_state(&s, PCP_TOPOLOGY_WORKER_ASSIGNED), 1);
  // Regression: a normal queued job must not trip the duplicate-job check
  // on its own queue entry when it leases its workers.
  assert_int_equal(pcp_topology_sched_start_next(&s), 30);
  assert_int_equal(s.decision, PCP_TOPOLOGY_SCHED_STARTED);
  assert_int_equal(
      pcp_topology_sched_count_state(&s, PCP_TOPOLOGY_WORKER_ASSIGNED), 2);
  assert_int_equal(s.queue_count, 0);
}

// canceling queued reserved job releases leased workers; canceling active
// queued job releases assigned workers
static void test_sched_cancel_releases(void** state) {
  (void)state;
  pcp_topology_sched_t s;
  sched_with(&s, 1);
  assert_true(pcp_topology_sched_reserve(&s, 5, TRAINING, 1) >= 0);
  pcp_topology_sched_commit_to_queue(&s, 5);
  pcp_topology_sched_cancel_queued(&s, 5);
  assert_int_equal(pcp_topology_sched_count_state(&s, PCP_TOPOLOGY_WORKER_IDLE),
                   1);
  assert_int_equal(pcp_topology_sched_active_reservations(&s), 0);
  assert_true(pcp_topology_sched_reserve(&s, 6, TRAINING, 1) >= 0);
  pcp_topology_sched_commit_to_queue(&s, 6);
  assert_int_equal(pcp_topology_sched_start_next(&s), 6);
  pcp_topology_sched_cancel_active(&s, 6);
  assert_int_equal(s.decision, PCP_TOPOLOGY_SCHED_CANCELED);
  assert_int_equal(pcp_topology_sched_count_state(&s, PCP_TOPOLOGY_WORKER_IDLE),
                   1);
  // The injected cleanup leak keeps the worker.
  s.bug_leak_on_cancel = true;
  assert_true(pcp_topology_sched_reserve(&s, 7, TRAINING, 1) >= 0);
  pcp_topology_sched_commit_to_queue(&s, 7);
  pcp_topology_sched_cancel_queued(&s, 7);
  assert_int_equal(pcp_topology_sched_count_state(&s, PCP_TOPOLOGY_WORKER_IDLE),
                   0);
}

// model policy behavior matches gateway scheduling worker class helpers
static void test_sched_policy_helpers(void** state) {
  (void)state;
  pcp_topology_worker_class_t c;
  assert_true(pcp_topology_worker_class_parse("hip", &c));
  assert_int_equal(c, PCP_TOPOLOGY_WORKER_CLASS_ROCM);
  assert_false(pcp_topology_worker_class_parse("tpu", &c));
  pcp_topology_sched_policy_t policy = {PCP_TOPOLOGY_WORKER_CLASS_CUDA, "sm_80",
                                        0, 0};
  assert_true(pcp_topology_sched_policy_allows(
      &policy, PCP_TOPOLOGY_WORKER_CLASS_CUDA, "sm_80"));
  assert_false(pcp_topology_sched_policy_allows(
      &policy, PCP_TOPOLOGY_WORKER_CLASS_CUDA, "sm_90"));
  assert_false(pcp_topology_sched_policy_allows(
      &policy, PCP_TOPOLOGY_WORKER_CLASS_CUDA, NULL));
  policy.worker_class = PCP_TOPOLOGY_WORKER_CLASS_ANY;
  policy.target_arch = NULL;
  assert_true(pcp_topology_sched_policy_allows(
      &policy, PCP_TOPOLOGY_WORKER_CLASS_METAL, NULL));
}

static int32_t add_gateway(pcp_topology_federation_t* f, const char* name,
                           const char* type, uint32_t available,
                           uint32_t ready) {
  int32_t g = pcp_topology_federation_register(f, name);
  pcp_topology_federation_service_t service;
  memset(&service, 0, sizeof(service));
  service.service_type = type;
  service.workers_available = available;
  service.workers_ready = ready;
  service.health_ok = true;
  assert_true(pcp_topology_federation_add_service(f, g, &service));
  return g;
}

// places deterministically; workers_required filters (the hub's registry
// never places on a service with too few available workers)
static void test_federation_places_deterministically(void** state) {
  (void)state;
  pcp_topology_federation_t f;
  pcp_topology_federation_initialize(&f);
  add_gateway(&f, "gateway-a", "training", 1, 1);
  add_gateway(&f, "gateway-b", "training", 4, 1);
  pcp_topology_federation_selector_t selector = {NULL, "training", 2};
  pcp_topology_federation_placement_t p =
      pcp_topology_federation_place(&f, &selector);
  assert_true(p.placed);
  assert_string_equal(f.gateways[p.gateway].name, "gateway-b");
  // Neither has 8 workers: nothing is placed (upstream ranked instead).
  selector.workers_required = 8;
  p = pcp_topology_federation_place(&f, &selector);
  assert_false(p.placed);
  assert_int_equal(p.violation,
                   PCP_TOPOLOGY_FEDERATION_VIOLATION_INCOMPATIBLE_GATEWAY);
}

// rejects unknown, stale and incompatible gateways
static void test_federation_rejections(void** state) {
  (void)state;
  pcp_topology_federation_t f;
  pcp_topology_federation_initialize(&f);
  int32_t a = add_gateway(&f, "gateway-a", "training", 2, 2);
  pcp_topology_federation_selector_t selector = {"gateway-z", "training", 1};
  assert_int_equal(pcp_topology_federation_place(&f, &selector).violation,
                   PCP_TOPOLOGY_FEDERATION_VIOLATION_UNKNOWN_GATEWAY);
  selector.gateway = "gateway-a";
  selector.service_type = "inference";
  assert_int_equal(pcp_topology_federation_place(&f, &selector).violation,
                   PCP_TOPOLOGY_FEDERATION_VIOLATION_INCOMPATIBLE_GATEWAY);
  selector.service_type = "";
  assert_int_equal(pcp_topology_federation_place(&f, &selector).violation,
                   PCP_TOPOLOGY_FEDERATION_VIOLATION_INVALID_REQUEST);
  selector.service_type = "training";
  pcp_topology_federation_mark_stale(&f, a);
  assert_int_equal(pcp_topology_federation_place(&f, &selector).violation,
                   PCP_TOPOLOGY_FEDERATION_VIOLATION_STALE_GATEWAY);
}

// loss and re-registration invalidate old placements
static void test_federation_loss_invalidates(void** state) {
  (void)state;
  pcp_topology_federation_t f;
  pcp_topology_federation_initialize(&f);
  int32_t a = add_gateway(&f, "gateway-a", "training", 2, 2);
  pcp_topology_federation_selector_t selector = {NULL, "training", 1};
  pcp_topology_federation_placement_t p =
      pcp_topology_federation_place(&f, &selector);
  assert_int_equal(pcp_topology_federation_complete_routed(&f, &p),
                   PCP_TOPOLOGY_FEDERATION_VIOLATION_NONE);
  (void)pcp_topology_federation_register(&f, "gateway-a");
  assert_int_equal(
      pcp_topology_federation_complete_routed(&f, &p),
      PCP_TOPOLOGY_FEDERATION_VIOLATION_FAILED_AFTER_PLACEMENT_LOSS);
  p = pcp_topology_federation_place(&f, &selector);
  pcp_topology_federation_lose_gateway(&f, a);
  assert_int_equal(
      pcp_topology_federation_complete_routed(&f, &p),
      PCP_TOPOLOGY_FEDERATION_VIOLATION_FAILED_AFTER_PLACEMENT_LOSS);
}

static pcp_topology_decoupled_action_t act(
    pcp_topology_decoupled_t* d, pcp_topology_decoupled_action_kind_t k,
    uint32_t worker, uint64_t clock) {
  pcp_topology_decoupled_action_t a;
  memset(&a, 0, sizeof(a));
  a.kind = k;
  a.worker = worker;
  a.session = d->session;
  a.fragment = d->fragment;
  a.step = d->step;
  a.clock = clock;
  return a;
}

static void apply(pcp_topology_decoupled_t* d,
                  pcp_topology_decoupled_action_kind_t k, uint32_t worker,
                  uint64_t clock) {
  pcp_topology_decoupled_action_t a = act(d, k, worker, clock);
  pcp_topology_decoupled_apply(d, &a);
}

// commits a quorum fragment and replays the tape
static void test_decoupled_quorum_commit(void** state) {
  (void)state;
  pcp_topology_decoupled_t d;
  pcp_topology_decoupled_initialize(7, 2, 2, 2, &d);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_ASSIGN, 0, 0);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_ASSIGN, 1, 0);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_SUBMIT, 0, 1);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_SUBMIT, 1, 1);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW, 0, 0);
  assert_int_equal(d.decision, PCP_TOPOLOGY_DECOUPLED_MERGE_COMMITTED);
  assert_int_equal(d.known_clock[0], 1);
  assert_int_equal(d.known_clock[1], 1);
  assert_int_equal(d.syncer_clock, 1);
  assert_int_equal(d.tape_entries, 1);
  // Clocks w0 = w1 = syncer = 1, and the tape replays the sync with both
  // participants.
  assert_int_equal(pcp_topology_vector_clock_counter(&d.vector_clock, 0), 1);
  assert_int_equal(pcp_topology_vector_clock_counter(&d.vector_clock, 1), 1);
  assert_int_equal(pcp_topology_vector_clock_counter(
                       &d.vector_clock, PCP_TOPOLOGY_VECTOR_CLOCK_SYNCER),
                   1);
  const pcp_topology_tape_entry_t* sync =
      pcp_topology_event_tape_replay_fragment_sync(&d.tape, 0, 0);
  assert_non_null(sync);
  assert_int_equal(sync->participants, 2);
  assert_int_equal(sync->merge_weight, 1);
  assert_null(pcp_topology_event_tape_replay_fragment_sync(&d.tape, 0, 1));
  pcp_topology_vector_clock_t other = {{0}};
  other.counters[0] = 9;
  pcp_topology_vector_clock_observe(&d.vector_clock, &other);
  assert_int_equal(pcp_topology_vector_clock_counter(&d.vector_clock, 0), 9);
  assert_int_equal(pcp_topology_vector_clock_counter(&d.vector_clock, 1), 1);
  assert_int_equal(d.fragment, 1);
  // An update for the old step is stale now.
  pcp_topology_decoupled_action_t old =
      act(&d, PCP_TOPOLOGY_DECOUPLED_SUBMIT, 0, 2);
  old.step = 0;
  old.fragment = 0;
  pcp_topology_decoupled_apply(&d, &old);
  assert_int_equal(d.violation, PCP_TOPOLOGY_DECOUPLED_VIOLATION_STALE_UPDATE);
}

static void test_decoupled_rejections(void** state) {
  (void)state;
  pcp_topology_decoupled_t d;
  pcp_topology_decoupled_initialize(7, 2, 2, 1, &d);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_SUBMIT, 1, 1);
  assert_int_equal(d.violation,
                   PCP_TOPOLOGY_DECOUPLED_VIOLATION_UNASSIGNED_WORKER);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_ASSIGN, 0, 0);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_SUBMIT, 0, 3);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_SUBMIT, 0, 3);
  assert_int_equal(d.violation,
                   PCP_TOPOLOGY_DECOUPLED_VIOLATION_DUPLICATE_UPDATE);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_SUBMIT, 0, 2);
  assert_int_equal(d.violation,
                   PCP_TOPOLOGY_DECOUPLED_VIOLATION_STALE_VECTOR_CLOCK);
  pcp_topology_decoupled_action_t mismatch =
      act(&d, PCP_TOPOLOGY_DECOUPLED_SUBMIT, 0, 4);
  mismatch.payload_mismatch = true;
  pcp_topology_decoupled_apply(&d, &mismatch);
  assert_int_equal(d.violation,
                   PCP_TOPOLOGY_DECOUPLED_VIOLATION_CONTEXT_PAYLOAD_MISMATCH);
  // Below quorum (one of two): the window defers; forcing it is the bug.
  apply(&d, PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW, 0, 0);
  assert_int_equal(d.decision, PCP_TOPOLOGY_DECOUPLED_MERGE_DEFERRED);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_FORCE_COMMIT, 0, 0);
  assert_int_equal(d.violation,
                   PCP_TOPOLOGY_DECOUPLED_VIOLATION_BELOW_QUORUM_COMMIT);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_CANCEL_SESSION, 0, 0);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_SUBMIT, 0, 9);
  assert_int_equal(d.violation,
                   PCP_TOPOLOGY_DECOUPLED_VIOLATION_POST_CANCEL_UPDATE);
}

static const pcp_topology_decoupled_action_kind_t kAlphabet[7] = {
    PCP_TOPOLOGY_DECOUPLED_ASSIGN,
    PCP_TOPOLOGY_DECOUPLED_LOCAL_STEP_COMPLETE,
    PCP_TOPOLOGY_DECOUPLED_SUBMIT,
    PCP_TOPOLOGY_DECOUPLED_SUBMIT,
    PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW,
    PCP_TOPOLOGY_DECOUPLED_CANCEL_SESSION,
    PCP_TOPOLOGY_DECOUPLED_CRASH,
};
static const uint32_t kAlphabetWorker[7] = {0, 0, 0, 1, 0, 0, 0};

static uint64_t decoupled_state(const pcp_topology_decoupled_t* d) {
  return ((uint64_t)d->decision << 48) ^ ((uint64_t)d->step << 32) ^
         (d->accepted_mask << 16) ^ (uint64_t)d->canceled ^
         ((uint64_t)d->tape_entries << 8);
}

// exhaustive depth 3: checked 343 with some violation
static void test_decoupled_exhaustive_depth_three(void** state) {
  (void)state;
  uint64_t checked = 0, violations = 0;
  for (int a = 0; a < 7; ++a) {
    for (int b = 0; b < 7; ++b) {
      for (int c = 0; c < 7; ++c) {
        pcp_topology_decoupled_t d;
        pcp_topology_decoupled_initialize(7, 2, 2, 1, &d);
        int seq[3] = {a, b, c};
        bool violated = false;
        for (int i = 0; i < 3; ++i) {
          apply(&d, kAlphabet[seq[i]], kAlphabetWorker[seq[i]], 1);
          violated |= d.violation != PCP_TOPOLOGY_DECOUPLED_VIOLATION_NONE;
        }
        checked++;
        violations += violated;
      }
    }
  }
  assert_int_equal(checked, 343);
  assert_true(violations > 0);
}

// random seed 42 x 18 actions is deterministic
static void test_decoupled_random_is_deterministic(void** state) {
  (void)state;
  uint64_t finals[2];
  for (int run = 0; run < 2; ++run) {
    pcp_rng_t rng;
    pcp_rng_initialize(42, &rng);
    pcp_topology_decoupled_t d;
    pcp_topology_decoupled_initialize(7, 2, 2, 1, &d);
    uint64_t h = 0;
    for (int i = 0; i < 18; ++i) {
      uint64_t k = pcp_rng_next_below(&rng, 7);
      apply(&d, kAlphabet[k], kAlphabetWorker[k], 1 + (uint64_t)i);
      h = h * 31 + decoupled_state(&d);
    }
    finals[run] = h;
  }
  assert_int_equal(finals[0], finals[1]);
}

// message oracle: handler acceptance and the registry itself
static void test_message_registry_oracle(void** state) {
  (void)state;
  size_t count = 0;
  const pcp_topology_message_entry_t* catalog =
      pcp_topology_message_catalog(&count);
  assert_int_equal(count, 32);
  for (size_t i = 0; i < count; ++i) {
    for (size_t j = i + 1; j < count; ++j) {
      assert_int_not_equal(strcmp(catalog[i].name, catalog[j].name), 0);
    }
    assert_int_not_equal(
        strcmp(pcp_topology_message_family_name(catalog[i].family), "?"), 0);
  }
  assert_int_equal(
      pcp_topology_worker_handler_check(catalog, count, "StartGeneration",
                                        PCP_TOPOLOGY_HANDLER_INFERENCE),
      PCP_TOPOLOGY_HANDLER_VERDICT_ACCEPTED);
  assert_int_equal(pcp_topology_worker_handler_check(
                       catalog, count, "StartGeneration",
                       PCP_TOPOLOGY_HANDLER_DECOUPLED_TRAINING),
                   PCP_TOPOLOGY_HANDLER_VERDICT_WRONG_WORKER_HANDLER);
  assert_int_equal(
      pcp_topology_worker_handler_check(catalog, count, "pcp.unknown",
                                        PCP_TOPOLOGY_HANDLER_NONE),
      PCP_TOPOLOGY_HANDLER_VERDICT_UNKNOWN_MESSAGE);
  assert_int_equal(pcp_topology_worker_handler_check(
                       catalog, count, "DecoupledFragmentUpdate",
                       PCP_TOPOLOGY_HANDLER_DECOUPLED_TRAINING),
                   PCP_TOPOLOGY_HANDLER_VERDICT_NO_WORKER_HANDLER);
  assert_int_equal(
      pcp_topology_message_dispatch(catalog, count, "DecoupledFragmentUpdate"),
      PCP_TOPOLOGY_DISPATCH_GATEWAY_QUEUE_ONLY);
  assert_int_equal(pcp_topology_message_dispatch(catalog, count, "nope"),
                   PCP_TOPOLOGY_DISPATCH_FAIL_CLOSED);
  // The registry is in sync (upstream: the oracle's tables against the
  // production registry). Stub side: every message with a worker handler
  // is a command the gateway forwards and that handler alone accepts; every
  // other message has no worker handler; queued messages are worker
  // results; the handler registry of reference s.6 (message_registry.zig).
  size_t handled[PCP_TOPOLOGY_HANDLER_COUNT_] = {0};
  for (size_t i = 0; i < count; ++i) {
    const pcp_topology_message_entry_t* e = &catalog[i];
    handled[e->handler]++;
    if (e->handler == PCP_TOPOLOGY_HANDLER_NONE) {
      assert_int_equal(pcp_topology_worker_handler_check(
                           catalog, count, e->name, PCP_TOPOLOGY_HANDLER_NONE),
                       PCP_TOPOLOGY_HANDLER_VERDICT_NO_WORKER_HANDLER);
      continue;
    }
    assert_int_equal(e->direction, PCP_TOPOLOGY_MESSAGE_CONTROLLER_TO_WORKER);
    assert_int_equal(pcp_topology_message_dispatch(catalog, count, e->name),
                     PCP_TOPOLOGY_DISPATCH_CONTROLLER_TO_WORKER);
    for (int h = 1; h < PCP_TOPOLOGY_HANDLER_COUNT_; ++h) {
      assert_int_equal(
          pcp_topology_worker_handler_check(catalog, count, e->name,
                                            (pcp_topology_worker_handler_t)h),
          h == (int)e->handler
              ? PCP_TOPOLOGY_HANDLER_VERDICT_ACCEPTED
              : PCP_TOPOLOGY_HANDLER_VERDICT_WRONG_WORKER_HANDLER);
    }
  }
  for (size_t i = 0; i < count; ++i) {
    if (catalog[i].queued) {
      assert_int_equal(catalog[i].direction,
                       PCP_TOPOLOGY_MESSAGE_WORKER_TO_CONTROLLER);
    }
  }
  for (int h = 1; h < PCP_TOPOLOGY_HANDLER_COUNT_; ++h) {
    assert_true(handled[h] > 0);  // graph ... lifecycle all registered
  }
  assert_int_equal(handled[PCP_TOPOLOGY_HANDLER_DECOUPLED_TRAINING], 2);
  assert_int_equal(handled[PCP_TOPOLOGY_HANDLER_INFERENCE], 4);
  assert_int_equal(handled[PCP_TOPOLOGY_HANDLER_LIFECYCLE], 1);
  static const char* const kInference[] = {"LoadModel", "StartGeneration",
                                           "CancelGeneration", "FlushSession"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(kInference); ++i) {
    assert_int_equal(
        pcp_topology_message_lookup(catalog, count, kInference[i])->handler,
        PCP_TOPOLOGY_HANDLER_INFERENCE);
  }
  assert_int_equal(
      pcp_topology_message_lookup(catalog, count, "StopDecoupledDilocoLoop")
          ->handler,
      PCP_TOPOLOGY_HANDLER_DECOUPLED_TRAINING);
  assert_int_equal(
      pcp_topology_message_lookup(catalog, count, "Shutdown")->handler,
      PCP_TOPOLOGY_HANDLER_LIFECYCLE);
  // Real side: the fabric catalogue is exactly proto's message-type table
  // (every wire number proto names, same name, a direction for each).
  pcp_topology_fabric_message_t fabric[PCP_TOPOLOGY_FABRIC_MAX_MESSAGES];
  size_t fabric_count = 0;
  PCP_CHECK_OK(pcp_topology_fabric_catalog(fabric, PCP_ARRAYSIZE(fabric),
                                           &fabric_count));
  size_t named = 0;
  for (uint32_t type = 0; type <= UINT16_MAX; ++type) {
    const char* name = pcp_proto_message_type_name((uint16_t)type);
    if (!name) {
      continue;
    }
    assert_true(named < fabric_count);
    assert_int_equal(fabric[named].type, type);
    assert_string_equal(fabric[named].name, name);
    named++;
  }
  assert_int_equal(named, fabric_count);
  assert_int_equal(fabric_count, 18);  // docs/protocol.md s.3
  assert_int_equal(fabric[0].type, PCP_PROTO_MESSAGE_HELLO);
  assert_int_equal(fabric[0].direction, PCP_TOPOLOGY_FABRIC_BOTH);
  for (size_t i = 0; i < fabric_count; ++i) {
    if (fabric[i].type == PCP_PROTO_MESSAGE_TASK_ASSIGN) {
      assert_string_equal(
          pcp_topology_fabric_direction_name(fabric[i].direction), "G->W");
    }
    if (fabric[i].type == PCP_PROTO_MESSAGE_TASK_RESULT) {
      assert_int_equal(fabric[i].direction,
                       PCP_TOPOLOGY_FABRIC_WORKER_TO_GATEWAY);
    }
  }
  assert_int_equal(pcp_status_consume_code(
                       pcp_topology_fabric_catalog(fabric, 4, &fabric_count)),
                   PCP_STATUS_RESOURCE_EXHAUSTED);
  // trainingKindFromRequestBody("{}") is regular.
  assert_int_equal(pcp_topology_training_kind_from_request_body("{}"),
                   PCP_TOPOLOGY_TRAINING_REGULAR);
  assert_int_equal(pcp_topology_training_kind_from_request_body(
                       "{\"training_kind\":\"decoupled\"}"),
                   PCP_TOPOLOGY_TRAINING_DECOUPLED);
}

static pcp_topology_error_t status_error(pcp_status_t status) {
  pcp_topology_error_t error = pcp_topology_status_error(status);
  pcp_status_ignore(status);
  return error;
}

// quorum validation and fragment validation (reference s.6,
// src/protocol/invariants.zig): (1,1) and (2,3) pass; (1,0) is an invalid
// worker count; (0,2) and (3,2) invalid quorums; fragment 8 of 8 an invalid
// index; a count of 0 an invalid fragment count
static void test_decoupled_configuration_invariants(void** state) {
  (void)state;
  PCP_CHECK_OK(pcp_topology_decoupled_quorum_validate(1, 1));
  PCP_CHECK_OK(pcp_topology_decoupled_quorum_validate(2, 3));
  assert_int_equal(status_error(pcp_topology_decoupled_quorum_validate(1, 0)),
                   PCP_TOPOLOGY_ERROR_INVALID_WORKER_COUNT);
  assert_int_equal(status_error(pcp_topology_decoupled_quorum_validate(0, 2)),
                   PCP_TOPOLOGY_ERROR_INVALID_QUORUM);
  assert_int_equal(status_error(pcp_topology_decoupled_quorum_validate(3, 2)),
                   PCP_TOPOLOGY_ERROR_INVALID_QUORUM);
  PCP_CHECK_OK(pcp_topology_decoupled_fragment_validate(7, 8));
  assert_int_equal(status_error(pcp_topology_decoupled_fragment_validate(8, 8)),
                   PCP_TOPOLOGY_ERROR_INVALID_FRAGMENT_INDEX);
  assert_int_equal(status_error(pcp_topology_decoupled_fragment_validate(0, 0)),
                   PCP_TOPOLOGY_ERROR_INVALID_FRAGMENT_COUNT);
}

// merge oracle: direct average, RDA envelope, token weights, degenerate
static void test_rda_merge_oracle(void** state) {
  (void)state;
  double a[2] = {0, 10}, b[2] = {10, 20}, out[2];
  pcp_topology_rda_update_t updates[2] = {{a, 10, 1}, {b, 10, 1}};
  pcp_topology_direct_average(updates, 2, 2, out);
  assert_true(out[0] == 5.0 && out[1] == 15.0);

  double u1[2] = {1, 1}, u2[2] = {1, -1};
  pcp_topology_rda_update_t rda[2] = {{u1, 10, 1}, {u2, 10, 1}};
  assert_true(pcp_topology_rda_merge(rda, 2, 2, out));
  // Leaves the coordinate envelope: x = sqrt(2) > max(1, 1).
  assert_true(fabs(out[0] - sqrt(2.0)) < 1e-12);
  assert_true(fabs(out[1]) < 1e-12);

  double w1[2] = {2, 0}, w2[2] = {0, 2};
  pcp_topology_rda_update_t weighted[2] = {{w1, 10, 1}, {w2, 10, 2}};
  assert_true(pcp_topology_token_step_weight(10, 1) +
                  pcp_topology_token_step_weight(10, 2) ==
              150.0);
  assert_true(pcp_topology_rda_merge(weighted, 2, 2, out));
  assert_true(fabs(out[0] - 1.78885436) < 1e-7);
  assert_true(fabs(out[1] - 0.89442718) < 1e-7);
  assert_true(fabs(sqrt(out[0] * out[0] + out[1] * out[1]) - 2.0) < 1e-12);

  double d1[2] = {1, 0}, d2[2] = {-1, 0};
  pcp_topology_rda_update_t degenerate[2] = {{d1, 10, 1}, {d2, 10, 1}};
  assert_true(pcp_topology_rda_merge(degenerate, 2, 2, out));
  assert_true(out[0] == 0.0 && out[1] == 0.0);
  assert_true(pcp_topology_token_step_weight(0, 5) == 0.0);
}

// Scheduler primitives for the hand-written schedules below.
#define SCHED_RESERVE PCP_TOPOLOGY_SCHED_ACTION_RESERVE
#define SCHED_COMMIT PCP_TOPOLOGY_SCHED_ACTION_COMMIT
#define SCHED_QUEUE PCP_TOPOLOGY_SCHED_ACTION_COMMIT_TO_QUEUE
#define SCHED_ENQUEUE PCP_TOPOLOGY_SCHED_ACTION_ENQUEUE
#define SCHED_START_NEXT PCP_TOPOLOGY_SCHED_ACTION_START_NEXT
#define SCHED_CANCEL PCP_TOPOLOGY_SCHED_ACTION_CANCEL
#define SCHED_RELEASE PCP_TOPOLOGY_SCHED_ACTION_RELEASE
#define SCHED_LOSE PCP_TOPOLOGY_SCHED_ACTION_LOSE_WORKER
#define SCHED_RESTORE PCP_TOPOLOGY_SCHED_ACTION_RESTORE_WORKER

static bool sched_bug_fails(void* user_data,
                            const pcp_topology_action_t* actions,
                            size_t count) {
  return pcp_topology_sched_bug_exposed(
      *(const pcp_topology_sched_bug_t*)user_data, true, actions, count);
}

// The correct scheduler passes |actions|; with the bug injected the
// scheduling oracle catches it, and the schedule shrinks.
static size_t sched_bug_shrink(pcp_topology_sched_bug_t bug,
                               const pcp_topology_action_t* actions,
                               size_t count,
                               pcp_topology_action_shrink_result_t* out) {
  assert_false(pcp_topology_sched_bug_exposed(bug, false, actions, count));
  PCP_CHECK_OK(pcp_topology_actions_shrink(pcp_allocator_system(), actions,
                                           count, sched_bug_fails, &bug, out));
  return out->action_count;
}

// injected bugs (reference s.6 extract/scheduling): duplicate worker
// reservation <= 2 actions, assignment after worker loss 3, cancellation
// cleanup leak 2; each shrunk from a longer schedule
static void test_sched_injected_bugs_shrink(void** state) {
  (void)state;
  pcp_topology_action_shrink_result_t r;
  // Two training jobs and an inference job around a queued one; the bug
  // lets the inference reservation take a worker training still holds.
  static const pcp_topology_action_t kDuplicate[] = {
      {SCHED_ENQUEUE, {90, TRAINING, 1}}, {SCHED_RESERVE, {5, TRAINING, 1}},
      {SCHED_QUEUE, {5, 0, 0}},           {SCHED_RESERVE, {6, TRAINING, 1}},
      {SCHED_RELEASE, {6, 0, 0}},         {SCHED_RESERVE, {7, INFERENCE, 2}},
      {SCHED_START_NEXT, {0, 0, 0}}};
  assert_true(
      sched_bug_shrink(PCP_TOPOLOGY_SCHED_BUG_DUPLICATE_WORKER_RESERVATION,
                       kDuplicate, PCP_ARRAYSIZE(kDuplicate), &r) <= 2);
  assert_int_equal(r.action_count, 2);
  assert_int_equal(r.actions[0].kind, SCHED_RESERVE);
  assert_int_equal(r.actions[1].kind, SCHED_RESERVE);
  pcp_topology_action_shrink_result_deinitialize(pcp_allocator_system(), &r);

  static const pcp_topology_action_t kLoss[] = {
      {SCHED_ENQUEUE, {90, TRAINING, 1}},
      {SCHED_RESERVE, {6, INFERENCE, 1}},
      {SCHED_RESERVE, {5, TRAINING, 1}},
      {SCHED_RESTORE, {2, 0, 0}},
      {SCHED_LOSE, {1, 0, 0}},
      {SCHED_ENQUEUE, {91, TRAINING, 1}},
      {SCHED_COMMIT, {5, 0, 0}}};
  assert_int_equal(
      sched_bug_shrink(PCP_TOPOLOGY_SCHED_BUG_ASSIGNMENT_AFTER_WORKER_LOSS,
                       kLoss, PCP_ARRAYSIZE(kLoss), &r),
      3);
  assert_int_equal(r.actions[0].kind, SCHED_RESERVE);
  assert_int_equal(r.actions[1].kind, SCHED_LOSE);
  assert_int_equal(r.actions[2].kind, SCHED_COMMIT);
  pcp_topology_action_shrink_result_deinitialize(pcp_allocator_system(), &r);

  // Reserve, queue, lose a worker, cancel: the leak needs neither the queue
  // nor the loss, only a reservation and its cancellation.
  static const pcp_topology_action_t kLeak[] = {
      {SCHED_ENQUEUE, {90, TRAINING, 1}}, {SCHED_RESERVE, {6, INFERENCE, 1}},
      {SCHED_RESERVE, {5, TRAINING, 1}},  {SCHED_LOSE, {1, 0, 0}},
      {SCHED_QUEUE, {5, 0, 0}},           {SCHED_CANCEL, {5, 0, 0}}};
  assert_int_equal(
      sched_bug_shrink(PCP_TOPOLOGY_SCHED_BUG_CANCELLATION_CLEANUP_LEAK, kLeak,
                       PCP_ARRAYSIZE(kLeak), &r),
      2);
  assert_int_equal(r.actions[0].kind, SCHED_RESERVE);
  assert_int_equal(r.actions[1].kind, SCHED_CANCEL);
  assert_true(r.rounds >= 1);
  pcp_topology_action_shrink_result_deinitialize(pcp_allocator_system(), &r);
}

// metadata collection; duplicate queued responses; envelope and payload
// mismatches; resume with another session
static void test_decoupled_collectors_and_resume(void** state) {
  (void)state;
  pcp_topology_decoupled_t d;
  pcp_topology_decoupled_initialize(12, 2, 2, 1, &d);
  pcp_topology_decoupled_response_t metadata[4] = {{0, 12, 0, 0, true},
                                                   {1, 12, 0, 0, true},
                                                   {0, 12, 0, 0, true},
                                                   {1, 13, 0, 0, true}};
  pcp_topology_decoupled_collection_t c;
  pcp_topology_decoupled_collect(&d, false, metadata, 4, &c);
  assert_int_equal(c.matched, 3);
  assert_int_equal(c.accepted, 2);
  assert_int_equal(c.unique, 2);
  assert_int_equal(c.duplicates, 1);
  assert_int_equal(c.ignored, 1);
  // Duplicate fragment responses: one accepted, so the window defers.
  pcp_topology_decoupled_response_t twice[2] = {{0, 12, 0, 1, true},
                                                {0, 12, 0, 1, true}};
  pcp_topology_decoupled_collect(&d, true, twice, 2, &c);
  assert_int_equal(c.accepted, 1);
  assert_int_equal(c.duplicates, 1);
  assert_true(c.accepted < d.quorum);
  // A wrong envelope (task 2 for fragment 0) is ignored; a payload that
  // disagrees with its envelope is a context mismatch.
  pcp_topology_decoupled_response_t envelope[1] = {{0, 12, 0, 2, true}};
  pcp_topology_decoupled_collect(&d, true, envelope, 1, &c);
  assert_int_equal(c.ignored, 1);
  assert_int_equal(c.violation, PCP_TOPOLOGY_DECOUPLED_VIOLATION_NONE);
  pcp_topology_decoupled_response_t payload[1] = {{0, 12, 0, 1, false}};
  pcp_topology_decoupled_collect(&d, true, payload, 1, &c);
  assert_int_equal(c.violation,
                   PCP_TOPOLOGY_DECOUPLED_VIOLATION_CONTEXT_PAYLOAD_MISMATCH);
  // Crash, then resume: session 99 is rejected, 12 is accepted.
  apply(&d, PCP_TOPOLOGY_DECOUPLED_CRASH, 1, 0);
  pcp_topology_decoupled_resume(&d, 1, 99);
  assert_int_equal(d.violation,
                   PCP_TOPOLOGY_DECOUPLED_VIOLATION_INCOMPATIBLE_RESUME);
  assert_false(d.online[1]);
  pcp_topology_decoupled_resume(&d, 1, 12);
  assert_int_equal(d.violation, PCP_TOPOLOGY_DECOUPLED_VIOLATION_NONE);
  assert_int_equal(d.decision, PCP_TOPOLOGY_DECOUPLED_RESUMABLE);
  assert_true(d.online[1]);
}

// recovery: commit, crash, restart, resume, commit again: the tape holds
// both fragment syncs
static void test_decoupled_recovery_tape(void** state) {
  (void)state;
  pcp_topology_decoupled_t d;
  pcp_topology_decoupled_initialize(46, 2, 2, 2, &d);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_ASSIGN, 0, 0);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_ASSIGN, 1, 0);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_SUBMIT, 0, 1);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_SUBMIT, 1, 1);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW, 0, 0);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_CRASH, 1, 0);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_SUBMIT, 1, 2);
  assert_int_equal(d.violation,
                   PCP_TOPOLOGY_DECOUPLED_VIOLATION_UNAVAILABLE_WORKER);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_RESTART, 1, 0);
  pcp_topology_decoupled_resume(&d, 1, 46);
  assert_int_equal(d.violation, PCP_TOPOLOGY_DECOUPLED_VIOLATION_NONE);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_SUBMIT, 0, 2);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_SUBMIT, 1, 2);
  apply(&d, PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW, 0, 0);
  assert_int_equal(d.decision, PCP_TOPOLOGY_DECOUPLED_MERGE_COMMITTED);
  assert_true(d.tape_entries >= 2);
  assert_int_equal(d.step, 2);
}

// The scheduling oracle: the invariants hold on correct runs and catch the
// injected bugs.
static void test_sched_invariants(void** state) {
  (void)state;
  pcp_topology_sched_t s;
  sched_with(&s, 2);
  s.policies[INFERENCE].reserved_workers = 1;
  assert_int_equal(pcp_topology_sched_check_invariants(&s),
                   PCP_TOPOLOGY_SCHED_INVARIANT_OK);
  assert_true(pcp_topology_sched_reserve(&s, 5, TRAINING, 1) >= 0);
  pcp_topology_sched_commit_to_queue(&s, 5);
  assert_int_equal(pcp_topology_sched_check_invariants(&s),
                   PCP_TOPOLOGY_SCHED_INVARIANT_OK);
  pcp_topology_sched_cancel_queued(&s, 5);
  assert_int_equal(pcp_topology_sched_check_invariants(&s),
                   PCP_TOPOLOGY_SCHED_INVARIANT_OK);
  // Cleanup leak.
  s.bug_leak_on_cancel = true;
  assert_true(pcp_topology_sched_reserve(&s, 6, TRAINING, 1) >= 0);
  pcp_topology_sched_commit_to_queue(&s, 6);
  pcp_topology_sched_cancel_queued(&s, 6);
  assert_int_equal(pcp_topology_sched_check_invariants(&s),
                   PCP_TOPOLOGY_SCHED_INVARIANT_ORPHAN_RESERVED_WORKER);
  assert_string_equal(pcp_topology_sched_invariant_name(
                          PCP_TOPOLOGY_SCHED_INVARIANT_ORPHAN_RESERVED_WORKER),
                      "orphan_reserved_worker");
  // Reserved capacity ignored.
  sched_with(&s, 2);
  s.policies[INFERENCE].reserved_workers = 1;
  s.bug_ignore_reserved_capacity = true;
  assert_true(pcp_topology_sched_reserve(&s, 7, TRAINING, 2) >= 0);
  assert_int_equal(pcp_topology_sched_check_invariants(&s),
                   PCP_TOPOLOGY_SCHED_INVARIANT_RESERVED_CAPACITY_STARVED);
  // Duplicate worker reservation: the second reservation takes the worker
  // the first one holds.
  sched_with(&s, 1);
  assert_true(pcp_topology_sched_reserve(&s, 5, TRAINING, 1) >= 0);
  assert_true(pcp_topology_sched_reserve(&s, 6, INFERENCE, 1) < 0);
  s.bug_duplicate_worker_reservation = true;
  assert_true(pcp_topology_sched_reserve(&s, 6, INFERENCE, 1) >= 0);
  assert_int_equal(pcp_topology_sched_check_invariants(&s),
                   PCP_TOPOLOGY_SCHED_INVARIANT_DUPLICATE_WORKER_RESERVATION);
  assert_string_equal(
      pcp_topology_sched_invariant_name(
          PCP_TOPOLOGY_SCHED_INVARIANT_DUPLICATE_WORKER_RESERVATION),
      "duplicate_worker_reservation");
  // A lost and restored worker leaves its reservation (short, not
  // duplicated) and may be reserved again.
  sched_with(&s, 1);
  assert_true(pcp_topology_sched_reserve(&s, 5, TRAINING, 1) >= 0);
  pcp_topology_sched_lose_worker(&s, 1);
  pcp_topology_sched_restore_worker(&s, 1);
  assert_true(pcp_topology_sched_reserve(&s, 6, TRAINING, 1) >= 0);
  assert_int_equal(pcp_topology_sched_check_invariants(&s),
                   PCP_TOPOLOGY_SCHED_INVARIANT_OK);
  pcp_topology_sched_commit(&s, 5);
  assert_int_equal(s.violation,
                   PCP_TOPOLOGY_SCHED_VIOLATION_ASSIGNMENT_AFTER_WORKER_LOSS);
}

// oracles/scheduling: the eight post-conditions, each broken on its own
// from a valid state (two cuda workers, one training reservation of one
// worker), and each named by the oracle
static void test_sched_eight_post_conditions(void** state) {
  (void)state;
  static const pcp_topology_sched_invariant_t kAll[] = {
      PCP_TOPOLOGY_SCHED_INVARIANT_ORPHAN_RESERVED_WORKER,
      PCP_TOPOLOGY_SCHED_INVARIANT_RESERVATION_OVERFULL,
      PCP_TOPOLOGY_SCHED_INVARIANT_ORPHAN_ASSIGNED_WORKER,
      PCP_TOPOLOGY_SCHED_INVARIANT_MAX_WORKERS_EXCEEDED,
      PCP_TOPOLOGY_SCHED_INVARIANT_RESERVED_CAPACITY_STARVED,
      PCP_TOPOLOGY_SCHED_INVARIANT_QUEUED_RESERVATION_MISSING,
      PCP_TOPOLOGY_SCHED_INVARIANT_IDLE_WORKER_OWNED,
      PCP_TOPOLOGY_SCHED_INVARIANT_DUPLICATE_WORKER_RESERVATION,
  };
  for (size_t k = 0; k < PCP_ARRAYSIZE(kAll); ++k) {
    pcp_topology_sched_t s;
    sched_with(&s, 2);
    int32_t slot = pcp_topology_sched_reserve(&s, 5, TRAINING, 1);
    assert_int_equal(slot, 0);
    assert_int_equal(pcp_topology_sched_check_invariants(&s),
                     PCP_TOPOLOGY_SCHED_INVARIANT_OK);
    pcp_topology_sched_worker_t* free_worker = &s.workers[1];
    switch (kAll[k]) {
      case PCP_TOPOLOGY_SCHED_INVARIANT_ORPHAN_RESERVED_WORKER:
        s.reservations[slot].active = false;  // gone, worker still held
        break;
      case PCP_TOPOLOGY_SCHED_INVARIANT_RESERVATION_OVERFULL:
        free_worker->state = PCP_TOPOLOGY_WORKER_RESERVED;
        free_worker->owner = TRAINING;
        free_worker->reservation = slot;
        free_worker->job = 5;
        break;
      case PCP_TOPOLOGY_SCHED_INVARIANT_ORPHAN_ASSIGNED_WORKER:
        free_worker->state = PCP_TOPOLOGY_WORKER_ASSIGNED;
        free_worker->owner = TRAINING;
        free_worker->job = 77;  // no such active job
        break;
      case PCP_TOPOLOGY_SCHED_INVARIANT_MAX_WORKERS_EXCEEDED:
        assert_true(pcp_topology_sched_reserve(&s, 6, TRAINING, 1) >= 0);
        s.policies[TRAINING].max_workers = 1;
        break;
      case PCP_TOPOLOGY_SCHED_INVARIANT_RESERVED_CAPACITY_STARVED:
        assert_true(pcp_topology_sched_reserve(&s, 6, TRAINING, 1) >= 0);
        s.policies[INFERENCE].reserved_workers = 1;
        break;
      case PCP_TOPOLOGY_SCHED_INVARIANT_QUEUED_RESERVATION_MISSING:
        s.queue[0] = (pcp_topology_sched_queued_t){9, TRAINING, 1, 3};
        s.queue_count = 1;
        break;
      case PCP_TOPOLOGY_SCHED_INVARIANT_IDLE_WORKER_OWNED:
        free_worker->owner = INFERENCE;
        break;
      case PCP_TOPOLOGY_SCHED_INVARIANT_DUPLICATE_WORKER_RESERVATION:
        assert_true(pcp_topology_sched_reserve(&s, 6, INFERENCE, 1) >= 0);
        s.reservations[1].worker_mask |= 1u;  // also claims worker 0
        break;
      default:
        fail();
    }
    assert_int_equal(pcp_topology_sched_check_invariants(&s), kAll[k]);
    assert_string_not_equal(pcp_topology_sched_invariant_name(kAll[k]), "?");
  }
  assert_string_equal(
      pcp_topology_sched_invariant_name(PCP_TOPOLOGY_SCHED_INVARIANT_OK), "ok");
}

// the gateway's cancel frees an open reservation, a queued reserved job and
// an active job; an unknown job is not found
static void test_sched_cancel_any_state(void** state) {
  (void)state;
  pcp_topology_sched_t s;
  sched_with(&s, 2);
  assert_true(pcp_topology_sched_reserve(&s, 5, TRAINING, 1) >= 0);
  pcp_topology_sched_cancel(&s, 5);
  assert_int_equal(s.decision, PCP_TOPOLOGY_SCHED_CANCELED);
  assert_int_equal(pcp_topology_sched_count_state(&s, PCP_TOPOLOGY_WORKER_IDLE),
                   2);
  assert_int_equal(pcp_topology_sched_active_reservations(&s), 0);
  assert_true(pcp_topology_sched_reserve(&s, 6, TRAINING, 1) >= 0);
  pcp_topology_sched_commit_to_queue(&s, 6);
  pcp_topology_sched_cancel(&s, 6);
  assert_int_equal(s.queue_count, 0);
  assert_int_equal(pcp_topology_sched_count_state(&s, PCP_TOPOLOGY_WORKER_IDLE),
                   2);
  assert_true(pcp_topology_sched_reserve(&s, 7, TRAINING, 2) >= 0);
  pcp_topology_sched_commit(&s, 7);
  pcp_topology_sched_cancel(&s, 7);
  assert_int_equal(pcp_topology_sched_count_state(&s, PCP_TOPOLOGY_WORKER_IDLE),
                   2);
  assert_int_equal(pcp_topology_sched_check_invariants(&s),
                   PCP_TOPOLOGY_SCHED_INVARIANT_OK);
  pcp_topology_sched_cancel(&s, 8);
  assert_int_equal(s.violation,
                   PCP_TOPOLOGY_SCHED_VIOLATION_QUEUED_JOB_NOT_FOUND);
  // The cleanup leak on an open reservation: the worker stays reserved.
  s.bug_leak_on_cancel = true;
  assert_true(pcp_topology_sched_reserve(&s, 9, TRAINING, 1) >= 0);
  pcp_topology_sched_cancel(&s, 9);
  assert_int_equal(pcp_topology_sched_check_invariants(&s),
                   PCP_TOPOLOGY_SCHED_INVARIANT_ORPHAN_RESERVED_WORKER);
}

typedef struct decoupled_script_t {
  uint32_t quorum;
  bool accept_stale_clock;
} decoupled_script_t;

// The oracle over (kind, worker, clock) actions on session 7 with two
// workers: a commit with fewer than quorum accepted senders, or an accepted
// update whose clock is below the one the syncer already knew.
static bool decoupled_script_fails(void* user_data,
                                   const pcp_topology_action_t* actions,
                                   size_t count) {
  const decoupled_script_t* script = (const decoupled_script_t*)user_data;
  pcp_topology_decoupled_t d;
  pcp_topology_decoupled_initialize(7, 2, script->quorum, 1, &d);
  d.bug_accept_stale_clock = script->accept_stale_clock;
  for (size_t i = 0; i < count; ++i) {
    const pcp_topology_action_t* s = &actions[i];
    uint32_t worker = (uint32_t)s->parameters[0];
    pcp_topology_decoupled_action_t a =
        act(&d, (pcp_topology_decoupled_action_kind_t)s->kind, worker,
            s->parameters[1]);
    uint32_t accepted_before = 0;
    for (uint32_t w = 0; w < 2; ++w) {
      accepted_before += (d.accepted_mask >> w) & 1u;
    }
    uint64_t known = worker < 2 ? d.known_clock[worker] : 0;
    pcp_topology_decoupled_apply(&d, &a);
    if (s->kind == PCP_TOPOLOGY_DECOUPLED_FORCE_COMMIT &&
        accepted_before < script->quorum) {
      return true;
    }
    if (s->kind == PCP_TOPOLOGY_DECOUPLED_SUBMIT &&
        d.decision == PCP_TOPOLOGY_DECOUPLED_UPDATE_ACCEPTED && worker < 2 &&
        s->parameters[1] < known) {
      return true;
    }
  }
  return false;
}

// injected bugs (reference s.6 extract/decoupled): a forced below-quorum
// commit shrinks to <= 4 actions, an accepted stale vector clock to <= 3
static void test_decoupled_injected_bugs_shrink(void** state) {
  (void)state;
  const uint32_t A = PCP_TOPOLOGY_DECOUPLED_ASSIGN;
  const uint32_t L = PCP_TOPOLOGY_DECOUPLED_LOCAL_STEP_COMPLETE;
  const uint32_t S = PCP_TOPOLOGY_DECOUPLED_SUBMIT;
  const uint32_t T = PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW;
  const uint32_t F = PCP_TOPOLOGY_DECOUPLED_FORCE_COMMIT;
  const pcp_topology_action_t below[] = {{A, {0, 0, 0}}, {A, {1, 0, 0}},
                                         {L, {0, 0, 0}}, {S, {0, 1, 0}},
                                         {L, {1, 0, 0}}, {F, {0, 0, 0}}};
  decoupled_script_t script = {2, false};
  pcp_topology_action_shrink_result_t r;
  PCP_CHECK_OK(pcp_topology_actions_shrink(
      pcp_allocator_system(), below, PCP_ARRAYSIZE(below),
      decoupled_script_fails, &script, &r));
  assert_true(r.action_count <= 4);
  assert_int_equal(r.actions[r.action_count - 1].kind, F);
  pcp_topology_action_shrink_result_deinitialize(pcp_allocator_system(), &r);

  // Both learners step and sync; learner 0 steps twice more, then a
  // retransmission of its first update (clock 1) arrives.
  const pcp_topology_action_t stale[] = {
      {A, {0, 0, 0}}, {A, {1, 0, 0}}, {L, {0, 0, 0}}, {L, {1, 0, 0}},
      {S, {0, 1, 0}}, {S, {1, 1, 0}}, {T, {0, 0, 0}}, {L, {0, 0, 0}},
      {L, {0, 0, 0}}, {S, {0, 1, 0}}};
  script = (decoupled_script_t){2, true};
  PCP_CHECK_OK(pcp_topology_actions_shrink(
      pcp_allocator_system(), stale, PCP_ARRAYSIZE(stale),
      decoupled_script_fails, &script, &r));
  assert_true(r.action_count <= 3);
  // assign, one observed local step, an update with clock 0.
  assert_int_equal(r.action_count, 3);
  assert_int_equal(r.actions[0].kind, A);
  assert_int_equal(r.actions[1].kind, L);
  assert_int_equal(r.actions[2].kind, S);
  assert_int_equal(r.actions[2].parameters[1], 0);
  assert_true(r.parameters_reduced >= 1);
  pcp_topology_action_shrink_result_deinitialize(pcp_allocator_system(), &r);
  // The correct model rejects the stale clock: nothing to shrink.
  script.accept_stale_clock = false;
  assert_int_equal(pcp_status_consume_code(pcp_topology_actions_shrink(
                       pcp_allocator_system(), stale, PCP_ARRAYSIZE(stale),
                       decoupled_script_fails, &script, &r)),
                   PCP_STATUS_FAILED_PRECONDITION);
}

// lease rules agree with src/sched where the semantics match: on 300
// seeded pools (cpu/cuda/rocm workers with or without a target) and owner
// policies (class, target, max_workers; reserved_workers 0, where the real
// scheduler's narrowed protection rule and upstream's coincide), random
// reserve/release sequences succeed or fail alike and take the same
// workers (first fit in join order = the real matching order when load and
// memory are equal)
static void test_sched_lease_rules_match_real_scheduler(void** state) {
  (void)state;
  static const pcp_sched_backend_t kBackends[] = {
      PCP_SCHED_BACKEND_CPU, PCP_SCHED_BACKEND_CUDA, PCP_SCHED_BACKEND_ROCM};
  static const char* const kTargets[] = {NULL, "sm_80", "sm_90"};
  static const char* const kIds[] = {"w0", "w1", "w2", "w3", "w4"};
  static const pcp_topology_worker_class_t kClasses[] = {
      PCP_TOPOLOGY_WORKER_CLASS_ANY, PCP_TOPOLOGY_WORKER_CLASS_CUDA,
      PCP_TOPOLOGY_WORKER_CLASS_ROCM};
  static const pcp_sched_worker_class_t kRealClasses[] = {
      PCP_SCHED_WORKER_CLASS_ANY, PCP_SCHED_WORKER_CLASS_CUDA,
      PCP_SCHED_WORKER_CLASS_ROCM};
  pcp_rng_t rng;
  pcp_rng_initialize(0x5c4ed, &rng);
  uint32_t reserved = 0, refused = 0;
  for (uint32_t round = 0; round < 300; ++round) {
    pcp_sched_options_t options;
    pcp_sched_options_initialize(&options);
    options.max_workers = 8;
    options.max_reservations = 8;
    options.heartbeat_timeout_ns = 0;
    pcp_sched_t* real = NULL;
    PCP_CHECK_OK(pcp_sched_create(&options, pcp_allocator_system(), &real));
    pcp_topology_sched_t model;
    pcp_topology_sched_initialize(&model);
    uint32_t workers = 1 + (uint32_t)pcp_rng_next_below(&rng, 5);
    for (uint32_t w = 0; w < workers; ++w) {
      size_t backend = (size_t)pcp_rng_next_below(&rng, 3);
      const char* target = kTargets[pcp_rng_next_below(&rng, 3)];
      pcp_sched_worker_info_t info = {kIds[w], kBackends[backend], target,
                                      0,       1u << 30,           NULL};
      PCP_CHECK_OK(pcp_sched_worker_join(real, &info, 0));
      PCP_CHECK_OK(pcp_sched_worker_ready(real, kIds[w], 0, NULL));
      // Backend b is class b + 1 in both enums (cpu 1, cuda 2, rocm 3).
      PCP_CHECK_OK(pcp_topology_sched_add_worker(
          &model, w, (pcp_topology_worker_class_t)(backend + 1), target));
    }
    for (uint32_t o = 0; o < 2; ++o) {
      size_t c = (size_t)pcp_rng_next_below(&rng, 3);
      const char* target = pcp_rng_next_below(&rng, 3) == 0 ? "sm_80" : NULL;
      uint32_t max = (uint32_t)pcp_rng_next_below(&rng, 4);  // 0: unlimited
      pcp_sched_owner_policy_t policy = {kRealClasses[c], target, 0,
                                         max ? max : PCP_SCHED_UNLIMITED};
      PCP_CHECK_OK(
          pcp_sched_owner_policy_set(real, (pcp_sched_owner_t)o, &policy));
      model.policies[o].worker_class = kClasses[c];
      model.policies[o].target_arch = target;
      model.policies[o].max_workers = max;
    }
    uint64_t real_ids[8] = {0};
    int32_t slots[8];
    uint32_t live = 0;
    uint32_t jobs[8];
    for (uint32_t step = 0; step < 6; ++step) {
      if (live > 0 && pcp_rng_next_below(&rng, 3) == 0) {
        uint32_t k = (uint32_t)pcp_rng_next_below(&rng, live);
        PCP_CHECK_OK(pcp_sched_reservation_release(real, real_ids[k]));
        pcp_topology_sched_release(&model, jobs[k]);
        assert_int_equal(model.decision, PCP_TOPOLOGY_SCHED_RELEASED);
        real_ids[k] = real_ids[live - 1];
        slots[k] = slots[live - 1];
        jobs[k] = jobs[live - 1];
        live--;
        continue;
      }
      uint32_t owner = (uint32_t)pcp_rng_next_below(&rng, 2);
      uint32_t count = 1 + (uint32_t)pcp_rng_next_below(&rng, 3);
      uint32_t job = 100 + round * 10 + step;
      pcp_sched_constraint_t constraint = {PCP_SCHED_WORKER_CLASS_ANY, NULL, 0,
                                           count};
      uint64_t id = 0;
      pcp_status_t status = pcp_sched_reservation_reserve(
          real, (pcp_sched_owner_t)owner, &constraint, job, 0, INT64_MAX, &id);
      bool real_ok = status == NULL;
      pcp_status_ignore(status);
      int32_t slot = pcp_topology_sched_reserve(&model, job, owner, count);
      assert_int_equal(real_ok, slot >= 0);
      if (!real_ok) {
        refused++;
        continue;
      }
      reserved++;
      real_ids[live] = id;
      slots[live] = slot;
      jobs[live] = job;
      live++;
      // The same workers, worker by worker.
      for (uint32_t w = 0; w < workers; ++w) {
        pcp_sched_worker_status_t st;
        PCP_CHECK_OK(pcp_sched_worker_query(real, kIds[w], &st));
        assert_int_equal(st.reservation_id == id,
                         model.workers[w].reservation == slot);
      }
    }
    PCP_CHECK_OK(pcp_sched_check_invariants(real));
    assert_int_equal(pcp_topology_sched_check_invariants(&model),
                     PCP_TOPOLOGY_SCHED_INVARIANT_OK);
    pcp_sched_release(real);
  }
  // Both outcomes occur, so the comparison is not vacuous.
  assert_true(reserved > 100);
  assert_true(refused > 100);
}

// STUB of the production hub registry's selectServiceByCapability
// (reference upstream-control-plane.md s.6.2), restated here from that text
// and not from the model: this project has no hub registry yet (the hub
// role does not place jobs). Candidates: services of gateways whose status
// is connected, of the named gateway if one is named, whose type equals the
// request or whose capabilities contain it, with at least workers_required
// available workers. Ranking, first candidate wins ties: health ok, then
// more available, more ready, newer updated_at. Returns false when nothing
// matches. (Written independently of sched/federation.c, which the model
// now runs.)
static uint32_t ready_of(const pcp_topology_federation_service_t* s) {
  return s->workers_ready > s->workers_available ? s->workers_ready
                                                 : s->workers_available;
}

static bool production_registry_select(
    const pcp_topology_federation_t* f,
    const pcp_topology_federation_selector_t* selector, int32_t* out_gateway,
    int32_t* out_service) {
  const pcp_topology_federation_service_t* best = NULL;
  for (uint32_t g = 0; g < f->gateway_count; ++g) {
    const pcp_topology_federation_gateway_t* gateway = &f->gateways[g];
    if (!gateway->connected) {
      continue;
    }
    if (selector->gateway && strcmp(selector->gateway, gateway->name) != 0) {
      continue;
    }
    for (uint32_t i = 0; i < gateway->service_count; ++i) {
      const pcp_topology_federation_service_t* c = &gateway->services[i];
      bool match = strcmp(c->service_type, selector->service_type) == 0;
      for (size_t k = 0; k < PCP_TOPOLOGY_FEDERATION_MAX_CAPABILITIES; ++k) {
        match |= c->capabilities[k] &&
                 strcmp(c->capabilities[k], selector->service_type) == 0;
      }
      if (!match || c->workers_available < selector->workers_required) {
        continue;
      }
      bool wins = !best;
      if (best && c->health_ok != best->health_ok) {
        wins = c->health_ok;
      } else if (best && c->workers_available != best->workers_available) {
        wins = c->workers_available > best->workers_available;
      } else if (best && ready_of(c) != ready_of(best)) {
        // The hub normalises counts at connect (ready >= available).
        wins = ready_of(c) > ready_of(best);
      } else if (best) {
        wins = c->updated_at > best->updated_at;
      }
      if (wins) {
        best = c;
        *out_gateway = (int32_t)g;
        *out_service = (int32_t)i;
      }
    }
  }
  return best != NULL;
}

// selection matches the production registry: the model's placement and the
// registry stub choose the same (gateway, service) on 500 seeded random
// registries (connected and stale gateways, types, capabilities, health,
// counts, ties), with and without workers_required and a named gateway
static void test_federation_selection_matches_registry(void** state) {
  (void)state;
  static const char* const kNames[] = {"gw-a", "gw-b", "gw-c", "gw-d"};
  static const char* const kTypes[] = {"training", "rl", "inference"};
  pcp_rng_t rng;
  pcp_rng_initialize(0xfed, &rng);
  uint32_t placed = 0, compared = 0;
  for (uint32_t round = 0; round < 500; ++round) {
    pcp_topology_federation_t f;
    pcp_topology_federation_initialize(&f);
    uint32_t gateways = 1 + (uint32_t)pcp_rng_next_below(&rng, 4);
    for (uint32_t g = 0; g < gateways; ++g) {
      int32_t id = pcp_topology_federation_register(&f, kNames[g]);
      if (pcp_rng_next_below(&rng, 4) == 0) {
        pcp_topology_federation_mark_stale(&f, id);
      }
      uint32_t services = (uint32_t)pcp_rng_next_below(&rng, 4);
      for (uint32_t i = 0; i < services; ++i) {
        pcp_topology_federation_service_t svc;
        memset(&svc, 0, sizeof(svc));
        svc.service_type = kTypes[pcp_rng_next_below(&rng, 3)];
        if (pcp_rng_next_below(&rng, 2)) {
          svc.capabilities[0] = kTypes[pcp_rng_next_below(&rng, 3)];
        }
        // Small ranges so that ties happen.
        svc.workers_available = (uint32_t)pcp_rng_next_below(&rng, 4);
        svc.workers_ready = (uint32_t)pcp_rng_next_below(&rng, 3);
        svc.health_ok = pcp_rng_next_below(&rng, 3) != 0;
        svc.updated_at = pcp_rng_next_below(&rng, 3);
        assert_true(pcp_topology_federation_add_service(&f, id, &svc));
      }
    }
    pcp_topology_federation_selector_t selector = {
        NULL, kTypes[pcp_rng_next_below(&rng, 3)],
        (uint32_t)pcp_rng_next_below(&rng, 4)};
    if (pcp_rng_next_below(&rng, 4) == 0) {
      selector.gateway = kNames[pcp_rng_next_below(&rng, gateways)];
    }
    int32_t gateway = -1, service = -1;
    bool found = production_registry_select(&f, &selector, &gateway, &service);
    pcp_topology_federation_placement_t p =
        pcp_topology_federation_place(&f, &selector);
    assert_int_equal(p.placed, found);
    if (found) {
      assert_int_equal(p.gateway, gateway);
      assert_int_equal(p.service, service);
      placed++;
    }
    compared++;
  }
  assert_int_equal(compared, 500);
  assert_true(placed > 100);  // the comparison is not vacuous
}

// federation oracle: the selected service is compatible (type or
// capability), unhealthy services lose to healthy ones, and the compatible
// input may end placed or lost (the task's two alternatives)
static void test_federation_oracle(void** state) {
  (void)state;
  pcp_topology_federation_t f;
  pcp_topology_federation_initialize(&f);
  int32_t a = pcp_topology_federation_register(&f, "gateway-a");
  int32_t b = pcp_topology_federation_register(&f, "gateway-b");
  pcp_topology_federation_service_t sick = {"training", {NULL}, 8, 8, false, 9};
  pcp_topology_federation_service_t capable = {
      "rl", {"training", "inference"}, 2, 2, true, 1};
  assert_true(pcp_topology_federation_add_service(&f, a, &sick));
  assert_true(pcp_topology_federation_add_service(&f, b, &capable));
  pcp_topology_federation_selector_t selector = {NULL, "training", 1};
  pcp_topology_federation_placement_t p =
      pcp_topology_federation_place(&f, &selector);
  assert_true(p.placed);
  // Healthy beats more workers; compatibility through a capability.
  assert_int_equal(p.gateway, b);
  const pcp_topology_federation_service_t* chosen =
      &f.gateways[p.gateway].services[p.service];
  bool compatible = strcmp(chosen->service_type, selector.service_type) == 0;
  for (size_t i = 0; i < PCP_TOPOLOGY_FEDERATION_MAX_CAPABILITIES; ++i) {
    compatible |= chosen->capabilities[i] &&
                  strcmp(chosen->capabilities[i], selector.service_type) == 0;
  }
  assert_true(compatible);
  // Rejection classes are distinct.
  selector.service_type = "vision";
  assert_int_equal(pcp_topology_federation_place(&f, &selector).violation,
                   PCP_TOPOLOGY_FEDERATION_VIOLATION_INCOMPATIBLE_GATEWAY);
  selector.service_type = "training";
  selector.gateway = "gateway-b";
  pcp_topology_federation_mark_stale(&f, b);
  assert_int_equal(pcp_topology_federation_place(&f, &selector).violation,
                   PCP_TOPOLOGY_FEDERATION_VIOLATION_STALE_GATEWAY);
  // The injected bug places on the stale gateway anyway.
  f.bug_accept_stale = true;
  assert_true(pcp_topology_federation_place(&f, &selector).placed);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sched_reserves_first_matching),
      cmocka_unit_test(test_sched_rejects_duplicates_and_unknown),
      cmocka_unit_test(test_sched_assignment_after_worker_loss),
      cmocka_unit_test(test_sched_expiry_releases),
      cmocka_unit_test(test_sched_owner_max_workers),
      cmocka_unit_test(test_sched_cross_owner_capacity),
      cmocka_unit_test(test_sched_reserved_commit_jumps_queue),
      cmocka_unit_test(test_sched_cancel_releases),
      cmocka_unit_test(test_sched_policy_helpers),
      cmocka_unit_test(test_sched_injected_bugs_shrink),
      cmocka_unit_test(test_sched_invariants),
      cmocka_unit_test(test_sched_eight_post_conditions),
      cmocka_unit_test(test_sched_lease_rules_match_real_scheduler),
      cmocka_unit_test(test_sched_cancel_any_state),
      cmocka_unit_test(test_federation_places_deterministically),
      cmocka_unit_test(test_federation_rejections),
      cmocka_unit_test(test_federation_loss_invalidates),
      cmocka_unit_test(test_federation_oracle),
      cmocka_unit_test(test_federation_selection_matches_registry),
      cmocka_unit_test(test_decoupled_quorum_commit),
      cmocka_unit_test(test_decoupled_rejections),
      cmocka_unit_test(test_decoupled_collectors_and_resume),
      cmocka_unit_test(test_decoupled_recovery_tape),
      cmocka_unit_test(test_decoupled_injected_bugs_shrink),
      cmocka_unit_test(test_decoupled_exhaustive_depth_three),
      cmocka_unit_test(test_decoupled_random_is_deterministic),
      cmocka_unit_test(test_message_registry_oracle),
      cmocka_unit_test(test_rda_merge_oracle),
      cmocka_unit_test(test_decoupled_configuration_invariants),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
