// SPDX-License-Identifier: Apache-2.0
// Unit tests for src/sched: one test per rule in sched.h, each followed by
// the invariant checker.
#include "sched/sched.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

static void expect_code_at(pcp_status_t status, pcp_status_code_t code,
                           const char* expr, const char* file, int line) {
  pcp_status_code_t actual = pcp_status_code(status);
  if (actual != code) {
    char text[512];
    pcp_status_format(status, text, sizeof(text));
    print_error("%s:%d: %s: want %s, got %s\n", file, line, expr,
                pcp_status_code_string(code), text);
  }
  pcp_status_ignore(status);
  _assert_int_equal(actual, code, file, line);
}
#define EXPECT_CODE(expr, code) \
  expect_code_at((expr), (code), #expr, __FILE__, __LINE__)
#define EXPECT_OK(expr) EXPECT_CODE((expr), PCP_STATUS_OK)

static void check(const pcp_sched_t* s) {
  EXPECT_OK(pcp_sched_check_invariants(s));
}

static pcp_sched_t* make_sched(uint32_t max_workers) {
  pcp_sched_options_t options;
  pcp_sched_options_initialize(&options);
  options.max_workers = max_workers;
  options.heartbeat_timeout_ns = 1000;
  options.lease_rejoin_grace_ns = 500;
  pcp_sched_t* s = NULL;
  EXPECT_OK(pcp_sched_create(&options, pcp_allocator_system(), &s));
  return s;
}

static pcp_sched_worker_info_t info_of(const char* id,
                                       pcp_sched_backend_t backend,
                                       const char* target, uint64_t memory) {
  pcp_sched_worker_info_t info = {
      .id = id,
      .backend = backend,
      .target = target,
      .device_id = 0,
      .device_memory_bytes = memory,
      .node_manager_id = "nm-1",
  };
  return info;
}

// Joins and readies a worker.
static void add(pcp_sched_t* s, const char* id, pcp_sched_backend_t backend,
                const char* target, uint64_t memory) {
  pcp_sched_worker_info_t info = info_of(id, backend, target, memory);
  EXPECT_OK(pcp_sched_worker_join(s, &info, 0));
  EXPECT_OK(pcp_sched_worker_ready(s, id, 0, NULL));
  check(s);
}

static pcp_sched_constraint_t want(pcp_sched_worker_class_t c,
                                   const char* target, uint32_t count) {
  pcp_sched_constraint_t constraint = {
      .worker_class = c,
      .target = target,
      .min_device_memory_bytes = 0,
      .worker_count = count,
  };
  return constraint;
}

static pcp_sched_worker_state_t state_of(pcp_sched_t* s, const char* id) {
  pcp_sched_worker_status_t status;
  EXPECT_OK(pcp_sched_worker_query(s, id, &status));
  return status.state;
}

static void lease_worker(pcp_sched_t* s, uint64_t lease_id, char* out_id,
                         bool* out_detached) {
  pcp_sched_lease_status_t status;
  EXPECT_OK(pcp_sched_lease_query(s, lease_id, &status));
  strcpy(out_id, status.worker_id.value);
  *out_detached = status.detached;
}

//===----------------------------------------------------------------------===//
// Names and lifetime
//===----------------------------------------------------------------------===//

static void names_round_trip(void** state) {
  (void)state;
  for (int b = 0; b < PCP_SCHED_BACKEND_COUNT_; ++b) {
    pcp_sched_backend_t parsed;
    assert_true(pcp_sched_backend_parse(
        pcp_make_cstring_view(pcp_sched_backend_name(b)), &parsed));
    assert_int_equal(parsed, b);
    assert_int_equal(pcp_sched_worker_class_from_backend(b),
                     (pcp_sched_worker_class_t)(b + 1));
  }
  for (int o = 0; o < PCP_SCHED_OWNER_COUNT_; ++o) {
    pcp_sched_owner_t parsed;
    assert_true(pcp_sched_owner_parse(
        pcp_make_cstring_view(pcp_sched_owner_name(o)), &parsed));
    assert_int_equal(parsed, o);
  }
  pcp_sched_worker_class_t c;
  assert_true(pcp_sched_worker_class_parse(pcp_make_cstring_view("any"), &c));
  assert_int_equal(c, PCP_SCHED_WORKER_CLASS_ANY);
  assert_false(pcp_sched_worker_class_parse(pcp_make_cstring_view("tpu"), &c));
  assert_string_equal(pcp_sched_backend_name(99), "unknown");
  assert_string_equal(pcp_sched_worker_state_name(PCP_SCHED_WORKER_STATE_LOST),
                      "lost");
  assert_string_equal(
      pcp_sched_event_kind_name(PCP_SCHED_EVENT_RESERVATION_BROKEN),
      "reservation_broken");
}

static void create_rejects_bad_options(void** state) {
  (void)state;
  pcp_sched_options_t options;
  pcp_sched_t* s = NULL;
  pcp_sched_options_initialize(&options);
  options.max_workers = 0;
  EXPECT_CODE(pcp_sched_create(&options, pcp_allocator_system(), &s),
              PCP_STATUS_INVALID_ARGUMENT);
  options.max_workers = PCP_SCHED_REGISTRY_WORKER_COUNT_MAX + 1;
  EXPECT_CODE(pcp_sched_create(&options, pcp_allocator_system(), &s),
              PCP_STATUS_INVALID_ARGUMENT);
  pcp_sched_options_initialize(&options);
  options.max_leases = 0;
  EXPECT_CODE(pcp_sched_create(&options, pcp_allocator_system(), &s),
              PCP_STATUS_INVALID_ARGUMENT);
  pcp_sched_options_initialize(&options);
  options.lease_rejoin_grace_ns = -1;
  EXPECT_CODE(pcp_sched_create(&options, pcp_allocator_system(), &s),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(pcp_sched_create(NULL, pcp_allocator_system(), &s),
              PCP_STATUS_INVALID_ARGUMENT);
  assert_null(s);
  pcp_sched_release(NULL);
}

// SQLite-style: fail each allocation of create in turn; nothing leaks (ASan)
// and the status is RESOURCE_EXHAUSTED.
static void create_survives_every_allocation_failure(void** state) {
  (void)state;
  pcp_sched_options_t options;
  pcp_sched_options_initialize(&options);
  for (int64_t n = 0;; ++n) {
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_system(), n, false,
                                     &failing);
    pcp_sched_t* s = NULL;
    pcp_status_t status =
        pcp_sched_create(&options, pcp_allocator_failing(&failing), &s);
    if (failing.failure_count == 0) {
      EXPECT_OK(status);
      check(s);
      pcp_sched_release(s);
      assert_true(n >= 6);
      break;
    }
    EXPECT_CODE(status, PCP_STATUS_RESOURCE_EXHAUSTED);
    assert_null(s);
  }
}

//===----------------------------------------------------------------------===//
// Registry
//===----------------------------------------------------------------------===//

static void join_rejects_bad_info(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(4);
  pcp_sched_worker_info_t info = info_of("w-1", PCP_SCHED_BACKEND_CPU, NULL, 1);
  EXPECT_CODE(pcp_sched_worker_join(s, NULL, 0), PCP_STATUS_INVALID_ARGUMENT);
  info.id = "";
  EXPECT_CODE(pcp_sched_worker_join(s, &info, 0), PCP_STATUS_INVALID_ARGUMENT);
  info.id = NULL;
  EXPECT_CODE(pcp_sched_worker_join(s, &info, 0), PCP_STATUS_INVALID_ARGUMENT);
  info.id = "has space";
  EXPECT_CODE(pcp_sched_worker_join(s, &info, 0), PCP_STATUS_INVALID_ARGUMENT);
  char long_id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 2];
  memset(long_id, 'a', sizeof(long_id) - 1);
  long_id[sizeof(long_id) - 1] = 0;
  info.id = long_id;
  EXPECT_CODE(pcp_sched_worker_join(s, &info, 0), PCP_STATUS_INVALID_ARGUMENT);
  long_id[PCP_SCHED_WORKER_ID_MAX_LENGTH] = 0;  // exactly the maximum
  EXPECT_OK(pcp_sched_worker_join(s, &info, 0));
  info.id = "w-2";
  info.backend = PCP_SCHED_BACKEND_COUNT_;
  EXPECT_CODE(pcp_sched_worker_join(s, &info, 0), PCP_STATUS_INVALID_ARGUMENT);
  info.backend = PCP_SCHED_BACKEND_CUDA;
  info.target = "sm_80/../x";
  EXPECT_CODE(pcp_sched_worker_join(s, &info, 0), PCP_STATUS_INVALID_ARGUMENT);
  info.target = "sm_80";
  info.device_id = -1;
  EXPECT_CODE(pcp_sched_worker_join(s, &info, 0), PCP_STATUS_INVALID_ARGUMENT);
  info.device_id = 3;
  info.node_manager_id = "nm\n";
  EXPECT_CODE(pcp_sched_worker_join(s, &info, 0), PCP_STATUS_INVALID_ARGUMENT);
  info.node_manager_id = NULL;
  EXPECT_OK(pcp_sched_worker_join(s, &info, 0));
  EXPECT_CODE(pcp_sched_worker_join(s, &info, 0), PCP_STATUS_ALREADY_EXISTS);
  pcp_sched_worker_status_t status;
  EXPECT_OK(pcp_sched_worker_query(s, "w-2", &status));
  assert_int_equal(status.state, PCP_SCHED_WORKER_STATE_JOINING);
  assert_int_equal(status.worker_class, PCP_SCHED_WORKER_CLASS_CUDA);
  assert_string_equal(status.target, "sm_80");
  assert_int_equal(status.device_id, 3);
  assert_string_equal(status.node_manager_id.value, "");
  assert_int_equal(pcp_sched_worker_count(s, PCP_SCHED_WORKER_STATE_COUNT_), 2);
  check(s);
  pcp_sched_release(s);
}

static void registry_is_bounded_and_evicts_oldest_lost(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(2);
  add(s, "a", PCP_SCHED_BACKEND_CPU, NULL, 1);
  add(s, "b", PCP_SCHED_BACKEND_CPU, NULL, 1);
  pcp_sched_worker_info_t c = info_of("c", PCP_SCHED_BACKEND_CPU, NULL, 1);
  EXPECT_CODE(pcp_sched_worker_join(s, &c, 0), PCP_STATUS_RESOURCE_EXHAUSTED);
  EXPECT_OK(pcp_sched_worker_mark_lost(s, "b", 10, NULL));
  EXPECT_OK(pcp_sched_worker_mark_lost(s, "a", 20, NULL));
  EXPECT_OK(pcp_sched_worker_join(s, &c, 30));
  // "b" was lost first, so it went.
  pcp_sched_worker_status_t status;
  EXPECT_CODE(pcp_sched_worker_query(s, "b", &status), PCP_STATUS_NOT_FOUND);
  EXPECT_OK(pcp_sched_worker_query(s, "a", &status));
  assert_int_equal(status.state, PCP_SCHED_WORKER_STATE_LOST);
  check(s);
  pcp_sched_release(s);
}

static void worker_state_transitions(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(4);
  pcp_sched_worker_info_t info = info_of("w", PCP_SCHED_BACKEND_CPU, NULL, 8);
  EXPECT_OK(pcp_sched_worker_join(s, &info, 0));
  EXPECT_CODE(pcp_sched_worker_drain(s, "w"), PCP_STATUS_FAILED_PRECONDITION);
  EXPECT_OK(pcp_sched_worker_ready(s, "w", 0, NULL));
  assert_int_equal(state_of(s, "w"), PCP_SCHED_WORKER_STATE_READY);
  EXPECT_CODE(pcp_sched_worker_ready(s, "w", 0, NULL),
              PCP_STATUS_FAILED_PRECONDITION);
  EXPECT_OK(pcp_sched_worker_heartbeat(s, "w", 50, 300));
  EXPECT_OK(pcp_sched_worker_heartbeat(s, "w", 40, 200));  // late: ignored
  pcp_sched_worker_status_t status;
  EXPECT_OK(pcp_sched_worker_query(s, "w", &status));
  assert_int_equal(status.last_heartbeat_ns, 50);
  assert_int_equal(status.load_permille, 200);
  EXPECT_CODE(pcp_sched_worker_heartbeat(s, "w", 60, 1001),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(pcp_sched_worker_heartbeat(s, "nope", 60, 0),
              PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_sched_worker_heartbeat(s, NULL, 60, 0),
              PCP_STATUS_INVALID_ARGUMENT);
  // Update while free is fine; while leased it is refused.
  info.device_memory_bytes = 16;
  EXPECT_OK(pcp_sched_worker_update(s, &info));
  uint64_t lease = 0;
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_ANY, NULL, 1);
  EXPECT_OK(pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_JOBS, &c, 7, &lease, 1));
  assert_int_equal(state_of(s, "w"), PCP_SCHED_WORKER_STATE_BUSY);
  EXPECT_CODE(pcp_sched_worker_update(s, &info),
              PCP_STATUS_FAILED_PRECONDITION);
  // Draining keeps the lease; release leaves the worker draining and
  // unschedulable; ready undoes the drain.
  EXPECT_OK(pcp_sched_worker_drain(s, "w"));
  EXPECT_OK(pcp_sched_worker_drain(s, "w"));
  check(s);
  EXPECT_OK(pcp_sched_lease_release(s, lease));
  assert_int_equal(state_of(s, "w"), PCP_SCHED_WORKER_STATE_DRAINING);
  EXPECT_CODE(
      pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_JOBS, &c, 7, &lease, 1),
      PCP_STATUS_UNAVAILABLE);
  EXPECT_OK(pcp_sched_worker_ready(s, "w", 0, NULL));
  assert_int_equal(state_of(s, "w"), PCP_SCHED_WORKER_STATE_READY);
  // Lost: heartbeats refused, mark_lost twice refused, rejoin works.
  EXPECT_OK(pcp_sched_worker_mark_lost(s, "w", 70, NULL));
  EXPECT_CODE(pcp_sched_worker_heartbeat(s, "w", 80, 0),
              PCP_STATUS_FAILED_PRECONDITION);
  EXPECT_CODE(pcp_sched_worker_mark_lost(s, "w", 80, NULL),
              PCP_STATUS_FAILED_PRECONDITION);
  EXPECT_CODE(pcp_sched_worker_update(s, &info),
              PCP_STATUS_FAILED_PRECONDITION);
  EXPECT_CODE(pcp_sched_worker_ready(s, "w", 80, NULL),
              PCP_STATUS_FAILED_PRECONDITION);
  EXPECT_OK(pcp_sched_worker_join(s, &info, 90));
  EXPECT_OK(pcp_sched_worker_query(s, "w", &status));
  assert_int_equal(status.state, PCP_SCHED_WORKER_STATE_JOINING);
  assert_int_equal(status.lost_at_ns, 70);
  assert_int_equal(status.lease_grant_count, 1);  // history kept
  EXPECT_OK(pcp_sched_worker_remove(s, "w", 100, NULL));
  EXPECT_CODE(pcp_sched_worker_remove(s, "w", 100, NULL), PCP_STATUS_NOT_FOUND);
  assert_int_equal(pcp_sched_worker_count(s, PCP_SCHED_WORKER_STATE_COUNT_), 0);
  check(s);
  pcp_sched_release(s);
}

//===----------------------------------------------------------------------===//
// Matching
//===----------------------------------------------------------------------===//

static void match_filters_and_orders(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(16);
  add(s, "cpu-b", PCP_SCHED_BACKEND_CPU, "host", 64);
  add(s, "cpu-a", PCP_SCHED_BACKEND_CPU, "host", 64);
  add(s, "cuda-big", PCP_SCHED_BACKEND_CUDA, "sm_80", 80);
  add(s, "cuda-small", PCP_SCHED_BACKEND_CUDA, "sm_80", 40);
  add(s, "cuda-h", PCP_SCHED_BACKEND_CUDA, "sm_90", 80);
  add(s, "rocm-none", PCP_SCHED_BACKEND_ROCM, NULL, 64);
  pcp_sched_worker_info_t joining =
      info_of("cuda-joining", PCP_SCHED_BACKEND_CUDA, "sm_80", 80);
  EXPECT_OK(pcp_sched_worker_join(s, &joining, 0));
  pcp_sched_worker_id_t ids[16];
  size_t count = 0;

  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_CUDA, "sm_80", 1);
  EXPECT_OK(pcp_sched_worker_match(s, &c, ids, 16, &count));
  // JOINING is not eligible; smallest memory that fits first.
  assert_int_equal(count, 2);
  assert_string_equal(ids[0].value, "cuda-small");
  assert_string_equal(ids[1].value, "cuda-big");
  c.min_device_memory_bytes = 50;
  EXPECT_OK(pcp_sched_worker_match(s, &c, ids, 16, &count));
  assert_int_equal(count, 1);
  assert_string_equal(ids[0].value, "cuda-big");

  // Any class, any target: load first, then memory, then id.
  EXPECT_OK(pcp_sched_worker_heartbeat(s, "cuda-small", 1, 900));
  c = want(PCP_SCHED_WORKER_CLASS_ANY, NULL, 1);
  EXPECT_OK(pcp_sched_worker_match(s, &c, ids, 16, &count));
  assert_int_equal(count, 6);
  assert_string_equal(ids[0].value, "cpu-a");
  assert_string_equal(ids[1].value, "cpu-b");
  assert_string_equal(ids[2].value, "rocm-none");
  assert_string_equal(ids[3].value, "cuda-big");
  assert_string_equal(ids[4].value, "cuda-h");
  assert_string_equal(ids[5].value, "cuda-small");

  // A worker without a target never matches a named target.
  c = want(PCP_SCHED_WORKER_CLASS_ROCM, "gfx942", 1);
  EXPECT_OK(pcp_sched_worker_match(s, &c, ids, 16, &count));
  assert_int_equal(count, 0);
  c.target = "";
  EXPECT_OK(pcp_sched_worker_match(s, &c, ids, 16, &count));
  assert_int_equal(count, 1);

  // Capacity too small: the count and the first ids are still reported.
  c = want(PCP_SCHED_WORKER_CLASS_ANY, NULL, 1);
  EXPECT_CODE(pcp_sched_worker_match(s, &c, ids, 2, &count),
              PCP_STATUS_RESOURCE_EXHAUSTED);
  assert_int_equal(count, 6);
  assert_string_equal(ids[0].value, "cpu-a");
  c.worker_class = (pcp_sched_worker_class_t)42;
  EXPECT_CODE(pcp_sched_worker_match(s, &c, ids, 16, &count),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(pcp_sched_worker_match(s, NULL, ids, 16, &count),
              PCP_STATUS_INVALID_ARGUMENT);
  check(s);
  pcp_sched_release(s);
}

// The same workers joined in another order (so in other slots) give the
// same match order and the same lease placement.
static void results_do_not_depend_on_join_order(void** state) {
  (void)state;
  static const char* const kIds[] = {"n3", "n1", "n4", "n0", "n2"};
  static const uint64_t kMemory[] = {40, 80, 40, 80, 40};
  pcp_sched_t* forward = make_sched(8);
  pcp_sched_t* backward = make_sched(8);
  for (int i = 0; i < 5; ++i) {
    add(forward, kIds[i], PCP_SCHED_BACKEND_CUDA, "sm_80", kMemory[i]);
    add(backward, kIds[4 - i], PCP_SCHED_BACKEND_CUDA, "sm_80", kMemory[4 - i]);
  }
  // A hole in the slot table of one of them.
  EXPECT_OK(pcp_sched_worker_remove(forward, "n4", 0, NULL));
  EXPECT_OK(pcp_sched_worker_remove(backward, "n4", 0, NULL));
  add(forward, "n5", PCP_SCHED_BACKEND_CUDA, "sm_80", 40);
  add(backward, "n5", PCP_SCHED_BACKEND_CUDA, "sm_80", 40);
  pcp_sched_worker_id_t a[8];
  pcp_sched_worker_id_t b[8];
  size_t count_a = 0;
  size_t count_b = 0;
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_ANY, NULL, 1);
  EXPECT_OK(pcp_sched_worker_match(forward, &c, a, 8, &count_a));
  EXPECT_OK(pcp_sched_worker_match(backward, &c, b, 8, &count_b));
  assert_int_equal(count_a, 5);
  assert_int_equal(count_b, 5);
  for (size_t i = 0; i < count_a; ++i) {
    assert_string_equal(a[i].value, b[i].value);
  }
  assert_string_equal(a[0].value, "n2");  // 40 bytes, smallest id
  assert_string_equal(a[4].value, "n1");
  uint64_t ids_a[3];
  uint64_t ids_b[3];
  c.worker_count = 3;
  EXPECT_OK(
      pcp_sched_lease_acquire(forward, PCP_SCHED_OWNER_RL, &c, 0, ids_a, 3));
  EXPECT_OK(
      pcp_sched_lease_acquire(backward, PCP_SCHED_OWNER_RL, &c, 0, ids_b, 3));
  for (int i = 0; i < 3; ++i) {
    pcp_sched_lease_status_t la;
    pcp_sched_lease_status_t lb;
    EXPECT_OK(pcp_sched_lease_query(forward, ids_a[i], &la));
    EXPECT_OK(pcp_sched_lease_query(backward, ids_b[i], &lb));
    assert_string_equal(la.worker_id.value, lb.worker_id.value);
  }
  check(forward);
  check(backward);
  pcp_sched_release(forward);
  pcp_sched_release(backward);
}

//===----------------------------------------------------------------------===//
// Leases
//===----------------------------------------------------------------------===//

static void acquire_is_all_or_nothing(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(8);
  add(s, "a", PCP_SCHED_BACKEND_CPU, NULL, 1);
  add(s, "b", PCP_SCHED_BACKEND_CPU, NULL, 1);
  add(s, "g", PCP_SCHED_BACKEND_CUDA, "sm_80", 1);
  uint64_t ids[4] = {0};
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_CPU, NULL, 3);
  EXPECT_CODE(
      pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_TRAINING, &c, 1, ids, 4),
      PCP_STATUS_UNAVAILABLE);
  assert_int_equal(pcp_sched_worker_count(s, PCP_SCHED_WORKER_STATE_READY), 3);
  c.worker_count = 0;
  EXPECT_CODE(
      pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_TRAINING, &c, 1, ids, 4),
      PCP_STATUS_INVALID_ARGUMENT);
  c.worker_count = PCP_SCHED_REQUEST_WORKER_COUNT_MAX + 1;
  EXPECT_CODE(
      pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_TRAINING, &c, 1, ids, 4),
      PCP_STATUS_INVALID_ARGUMENT);
  c.worker_count = 2;
  EXPECT_CODE(
      pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_TRAINING, &c, 1, ids, 1),
      PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(
      pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_TRAINING, &c, 1, NULL, 4),
      PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(pcp_sched_lease_acquire(s, (pcp_sched_owner_t)9, &c, 1, ids, 4),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_OK(
      pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_TRAINING, &c, 42, ids, 4));
  assert_true(ids[0] < ids[1]);
  char worker[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  bool detached = true;
  lease_worker(s, ids[0], worker, &detached);
  assert_false(detached);
  assert_string_equal(worker, "a");
  pcp_sched_lease_status_t status;
  EXPECT_OK(pcp_sched_lease_query(s, ids[1], &status));
  assert_int_equal(status.owner, PCP_SCHED_OWNER_TRAINING);
  assert_int_equal(status.tag, 42);
  assert_string_equal(status.worker_id.value, "b");
  pcp_sched_worker_status_t ws;
  EXPECT_OK(pcp_sched_worker_query(s, "a", &ws));
  assert_int_equal(ws.lease_id, ids[0]);
  assert_int_equal(ws.owner, PCP_SCHED_OWNER_TRAINING);
  // A leased worker is never leased again.
  c.worker_count = 1;
  uint64_t more = 0;
  EXPECT_CODE(pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_JOBS, &c, 1, &more, 1),
              PCP_STATUS_UNAVAILABLE);
  check(s);
  pcp_sched_release(s);
}

static void release_twice_is_not_found(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(4);
  add(s, "a", PCP_SCHED_BACKEND_CPU, NULL, 1);
  uint64_t id = 0;
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_ANY, NULL, 1);
  EXPECT_OK(pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_JOBS, &c, 0, &id, 1));
  EXPECT_OK(pcp_sched_lease_release(s, id));
  assert_int_equal(state_of(s, "a"), PCP_SCHED_WORKER_STATE_READY);
  EXPECT_CODE(pcp_sched_lease_release(s, id), PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_sched_lease_release(s, 0), PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_sched_lease_release(s, 999), PCP_STATUS_NOT_FOUND);
  pcp_sched_lease_status_t status;
  EXPECT_CODE(pcp_sched_lease_query(s, id, &status), PCP_STATUS_NOT_FOUND);
  // Ids are never reused.
  uint64_t next = 0;
  EXPECT_OK(pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_JOBS, &c, 0, &next, 1));
  assert_true(next > id);
  check(s);
  pcp_sched_release(s);
}

static void owner_max_and_lease_table_bound(void** state) {
  (void)state;
  pcp_sched_options_t options;
  pcp_sched_options_initialize(&options);
  options.max_workers = 8;
  options.max_leases = 3;
  pcp_sched_t* s = NULL;
  EXPECT_OK(pcp_sched_create(&options, pcp_allocator_system(), &s));
  for (int i = 0; i < 5; ++i) {
    char id[8];
    snprintf(id, sizeof(id), "w%d", i);
    add(s, id, PCP_SCHED_BACKEND_CPU, NULL, 1);
  }
  pcp_sched_owner_policy_t p = {PCP_SCHED_WORKER_CLASS_ANY, NULL, 0, 2};
  EXPECT_OK(pcp_sched_owner_policy_set(s, PCP_SCHED_OWNER_INFERENCE, &p));
  uint64_t ids[4];
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_ANY, NULL, 3);
  EXPECT_CODE(
      pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_INFERENCE, &c, 0, ids, 4),
      PCP_STATUS_RESOURCE_EXHAUSTED);
  c.worker_count = 2;
  EXPECT_OK(
      pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_INFERENCE, &c, 0, ids, 4));
  c.worker_count = 1;
  EXPECT_CODE(
      pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_INFERENCE, &c, 0, ids, 4),
      PCP_STATUS_RESOURCE_EXHAUSTED);
  EXPECT_OK(pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_JOBS, &c, 0, ids, 4));
  // Table holds 3 leases.
  EXPECT_CODE(pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_RL, &c, 0, ids, 4),
              PCP_STATUS_RESOURCE_EXHAUSTED);
  pcp_sched_owner_stats_t stats;
  EXPECT_OK(pcp_sched_owner_stats_query(s, PCP_SCHED_OWNER_INFERENCE, &stats));
  assert_int_equal(stats.leased_workers, 2);
  assert_int_equal(stats.max_workers, 2);
  assert_int_equal(stats.available_workers, 0);
  EXPECT_OK(pcp_sched_owner_stats_query(s, PCP_SCHED_OWNER_RL, &stats));
  assert_int_equal(stats.available_workers, 2);
  uint64_t listed[4];
  size_t count = 0;
  EXPECT_OK(pcp_sched_owner_leases_list(s, PCP_SCHED_OWNER_INFERENCE, listed, 4,
                                        &count));
  assert_int_equal(count, 2);
  assert_true(listed[0] < listed[1]);
  EXPECT_CODE(pcp_sched_owner_leases_list(s, PCP_SCHED_OWNER_INFERENCE, listed,
                                          1, &count),
              PCP_STATUS_RESOURCE_EXHAUSTED);
  assert_int_equal(count, 2);
  check(s);
  pcp_sched_release(s);
}

static void policy_set_validates(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(4);
  add(s, "c", PCP_SCHED_BACKEND_CPU, NULL, 1);
  pcp_sched_owner_policy_t p = {PCP_SCHED_WORKER_CLASS_ANY, NULL, 3, 2};
  EXPECT_CODE(pcp_sched_owner_policy_set(s, PCP_SCHED_OWNER_RL, &p),
              PCP_STATUS_INVALID_ARGUMENT);
  p.reserved_workers = 0;
  p.worker_class = (pcp_sched_worker_class_t)17;
  EXPECT_CODE(pcp_sched_owner_policy_set(s, PCP_SCHED_OWNER_RL, &p),
              PCP_STATUS_INVALID_ARGUMENT);
  p.worker_class = PCP_SCHED_WORKER_CLASS_ANY;
  EXPECT_CODE(pcp_sched_owner_policy_set(s, (pcp_sched_owner_t)-1, &p),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(pcp_sched_owner_policy_set(s, PCP_SCHED_OWNER_RL, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  uint64_t id = 0;
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_ANY, NULL, 1);
  EXPECT_OK(pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_RL, &c, 0, &id, 1));
  p.max_workers = 0;
  EXPECT_CODE(pcp_sched_owner_policy_set(s, PCP_SCHED_OWNER_RL, &p),
              PCP_STATUS_FAILED_PRECONDITION);
  p.max_workers = 1;
  p.worker_class = PCP_SCHED_WORKER_CLASS_CUDA;
  EXPECT_CODE(pcp_sched_owner_policy_set(s, PCP_SCHED_OWNER_RL, &p),
              PCP_STATUS_FAILED_PRECONDITION);
  p.worker_class = PCP_SCHED_WORKER_CLASS_CPU;
  EXPECT_OK(pcp_sched_owner_policy_set(s, PCP_SCHED_OWNER_RL, &p));
  check(s);
  pcp_sched_release(s);
}

static void transfer_moves_ownership(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(4);
  add(s, "c", PCP_SCHED_BACKEND_CPU, NULL, 1);
  add(s, "g", PCP_SCHED_BACKEND_CUDA, "sm_80", 1);
  uint64_t ids[2];
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_ANY, NULL, 2);
  EXPECT_OK(pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_JOBS, &c, 5, ids, 2));
  pcp_sched_owner_policy_t cuda_only = {PCP_SCHED_WORKER_CLASS_CUDA, "sm_80", 0,
                                        1};
  EXPECT_OK(
      pcp_sched_owner_policy_set(s, PCP_SCHED_OWNER_INFERENCE, &cuda_only));
  // ids[0] is on "c" (ids order), which the inference policy refuses.
  EXPECT_CODE(pcp_sched_lease_transfer(s, ids[0], PCP_SCHED_OWNER_INFERENCE),
              PCP_STATUS_FAILED_PRECONDITION);
  EXPECT_OK(pcp_sched_lease_transfer(s, ids[1], PCP_SCHED_OWNER_INFERENCE));
  EXPECT_OK(pcp_sched_lease_transfer(s, ids[1], PCP_SCHED_OWNER_INFERENCE));
  pcp_sched_lease_status_t status;
  EXPECT_OK(pcp_sched_lease_query(s, ids[1], &status));
  assert_int_equal(status.owner, PCP_SCHED_OWNER_INFERENCE);
  assert_int_equal(status.tag, 5);
  assert_string_equal(status.worker_id.value, "g");
  // Inference is at its max of 1 now.
  cuda_only.worker_class = PCP_SCHED_WORKER_CLASS_ANY;
  cuda_only.target = NULL;
  EXPECT_OK(
      pcp_sched_owner_policy_set(s, PCP_SCHED_OWNER_INFERENCE, &cuda_only));
  EXPECT_CODE(pcp_sched_lease_transfer(s, ids[0], PCP_SCHED_OWNER_INFERENCE),
              PCP_STATUS_RESOURCE_EXHAUSTED);
  EXPECT_CODE(pcp_sched_lease_transfer(s, 77, PCP_SCHED_OWNER_INFERENCE),
              PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_sched_lease_transfer(s, ids[0], PCP_SCHED_OWNER_COUNT_),
              PCP_STATUS_INVALID_ARGUMENT);
  pcp_sched_owner_stats_t stats;
  EXPECT_OK(pcp_sched_owner_stats_query(s, PCP_SCHED_OWNER_JOBS, &stats));
  assert_int_equal(stats.leased_workers, 1);
  check(s);
  pcp_sched_release(s);
}

// Upstream s.5.3 rule 4, as narrowed in sched.h.
static void reserved_workers_are_protected(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(8);
  add(s, "c1", PCP_SCHED_BACKEND_CPU, NULL, 1);
  add(s, "c2", PCP_SCHED_BACKEND_CPU, NULL, 1);
  add(s, "c3", PCP_SCHED_BACKEND_CPU, NULL, 1);
  add(s, "g1", PCP_SCHED_BACKEND_CUDA, "sm_80", 1);
  pcp_sched_owner_policy_t training = {PCP_SCHED_WORKER_CLASS_CPU, NULL, 2,
                                       PCP_SCHED_UNLIMITED};
  EXPECT_OK(pcp_sched_owner_policy_set(s, PCP_SCHED_OWNER_TRAINING, &training));
  uint64_t ids[4];
  // Inference (any class) takes the CUDA worker first: no reservation needs
  // it.
  pcp_sched_constraint_t one = want(PCP_SCHED_WORKER_CLASS_ANY, NULL, 1);
  EXPECT_OK(
      pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_INFERENCE, &one, 0, ids, 4));
  char worker[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  bool detached = false;
  lease_worker(s, ids[0], worker, &detached);
  assert_string_equal(worker, "g1");
  // One CPU worker is spare beyond training's two.
  EXPECT_OK(
      pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_INFERENCE, &one, 0, ids, 4));
  EXPECT_CODE(
      pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_INFERENCE, &one, 0, ids, 4),
      PCP_STATUS_UNAVAILABLE);
  EXPECT_CODE(pcp_sched_reservation_reserve(s, PCP_SCHED_OWNER_JOBS, &one, 0, 0,
                                            10, ids),
              PCP_STATUS_UNAVAILABLE);
  pcp_sched_owner_stats_t stats;
  EXPECT_OK(pcp_sched_owner_stats_query(s, PCP_SCHED_OWNER_JOBS, &stats));
  assert_int_equal(stats.available_workers, 0);
  // Training itself can take both.
  pcp_sched_constraint_t two = want(PCP_SCHED_WORKER_CLASS_CPU, NULL, 2);
  EXPECT_OK(
      pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_TRAINING, &two, 0, ids, 4));
  check(s);

  // Where we differ from upstream: with the fleet below the reservation,
  // workers the reserving owner cannot use stay available to others.
  EXPECT_OK(pcp_sched_lease_release(s, ids[0]));
  EXPECT_OK(pcp_sched_lease_release(s, ids[1]));
  EXPECT_OK(pcp_sched_worker_remove(s, "c1", 0, NULL));
  EXPECT_OK(pcp_sched_worker_remove(s, "c2", 0, NULL));
  EXPECT_OK(pcp_sched_worker_remove(s, "c3", 0, NULL));
  add(s, "c4", PCP_SCHED_BACKEND_CPU, NULL, 1);
  add(s, "g2", PCP_SCHED_BACKEND_CUDA, "sm_80", 1);
  EXPECT_OK(pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_JOBS, &one, 0, ids, 4));
  lease_worker(s, ids[0], worker, &detached);
  assert_string_equal(worker, "g2");
  EXPECT_CODE(pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_JOBS, &one, 0, ids, 4),
              PCP_STATUS_UNAVAILABLE);
  check(s);
  pcp_sched_release(s);
}

//===----------------------------------------------------------------------===//
// Reservations
//===----------------------------------------------------------------------===//

static void reservation_commit_makes_leases(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(4);
  add(s, "b", PCP_SCHED_BACKEND_CPU, NULL, 1);
  add(s, "a", PCP_SCHED_BACKEND_CPU, NULL, 1);
  add(s, "x", PCP_SCHED_BACKEND_CPU, NULL, 1);
  uint64_t rid = 0;
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_CPU, NULL, 2);
  EXPECT_OK(pcp_sched_reservation_reserve(s, PCP_SCHED_OWNER_TRAINING, &c, 9,
                                          100, 200, &rid));
  assert_int_not_equal(rid, 0);
  pcp_sched_worker_status_t ws;
  EXPECT_OK(pcp_sched_worker_query(s, "a", &ws));
  assert_int_equal(ws.state, PCP_SCHED_WORKER_STATE_BUSY);
  assert_int_equal(ws.reservation_id, rid);
  assert_int_equal(ws.owner, PCP_SCHED_OWNER_TRAINING);
  pcp_sched_reservation_status_t rs;
  EXPECT_OK(pcp_sched_reservation_query(s, rid, &rs));
  assert_int_equal(rs.worker_count, 2);
  assert_int_equal(rs.deadline_ns, 200);
  pcp_sched_owner_stats_t stats;
  EXPECT_OK(pcp_sched_owner_stats_query(s, PCP_SCHED_OWNER_TRAINING, &stats));
  assert_int_equal(stats.reserved_slots, 2);
  check(s);
  uint64_t ids[2];
  EXPECT_CODE(pcp_sched_reservation_commit(s, rid, 150, ids, 1),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_OK(pcp_sched_reservation_commit(s, rid, 150, ids, 2));
  char worker[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  bool detached = true;
  lease_worker(s, ids[0], worker, &detached);
  assert_string_equal(worker, "a");  // id order
  pcp_sched_lease_status_t ls;
  EXPECT_OK(pcp_sched_lease_query(s, ids[1], &ls));
  assert_int_equal(ls.tag, 9);
  assert_int_equal(ls.owner, PCP_SCHED_OWNER_TRAINING);
  EXPECT_OK(pcp_sched_owner_stats_query(s, PCP_SCHED_OWNER_TRAINING, &stats));
  assert_int_equal(stats.reserved_slots, 0);
  assert_int_equal(stats.leased_workers, 2);
  EXPECT_CODE(pcp_sched_reservation_commit(s, rid, 150, ids, 2),
              PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_sched_reservation_release(s, rid), PCP_STATUS_NOT_FOUND);
  check(s);
  pcp_sched_release(s);
}

static void reservation_expires_on_tick(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(4);
  add(s, "a", PCP_SCHED_BACKEND_CPU, NULL, 1);
  uint64_t rid = 0;
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_ANY, NULL, 1);
  EXPECT_CODE(pcp_sched_reservation_reserve(s, PCP_SCHED_OWNER_RL, &c, 3, 100,
                                            100, &rid),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_OK(pcp_sched_reservation_reserve(s, PCP_SCHED_OWNER_RL, &c, 3, 0, 100,
                                          &rid));
  pcp_sched_event_t events[4];
  size_t count = 0;
  EXPECT_OK(pcp_sched_worker_heartbeat(s, "a", 99, 0));
  EXPECT_OK(pcp_sched_tick(s, 99, events, 4, &count));
  assert_int_equal(count, 0);
  EXPECT_OK(pcp_sched_tick(s, 100, events, 4, &count));
  assert_int_equal(count, 1);
  assert_int_equal(events[0].kind, PCP_SCHED_EVENT_RESERVATION_EXPIRED);
  assert_int_equal(events[0].reservation_id, rid);
  assert_int_equal(events[0].owner, PCP_SCHED_OWNER_RL);
  assert_int_equal(events[0].tag, 3);
  assert_int_equal(state_of(s, "a"), PCP_SCHED_WORKER_STATE_READY);
  uint64_t ids[1];
  EXPECT_CODE(pcp_sched_reservation_commit(s, rid, 100, ids, 1),
              PCP_STATUS_NOT_FOUND);
  check(s);

  // A commit that arrives after the deadline but before the tick is refused
  // and frees the workers at once.
  EXPECT_OK(pcp_sched_reservation_reserve(s, PCP_SCHED_OWNER_RL, &c, 3, 100,
                                          150, &rid));
  EXPECT_CODE(pcp_sched_reservation_commit(s, rid, 150, ids, 1),
              PCP_STATUS_DEADLINE_EXCEEDED);
  assert_int_equal(state_of(s, "a"), PCP_SCHED_WORKER_STATE_READY);
  EXPECT_CODE(pcp_sched_reservation_release(s, rid), PCP_STATUS_NOT_FOUND);
  // Release frees them too.
  EXPECT_OK(pcp_sched_reservation_reserve(s, PCP_SCHED_OWNER_RL, &c, 3, 100,
                                          150, &rid));
  EXPECT_OK(pcp_sched_reservation_release(s, rid));
  assert_int_equal(state_of(s, "a"), PCP_SCHED_WORKER_STATE_READY);
  EXPECT_CODE(pcp_sched_tick(s, 0, NULL, 0, &count),
              PCP_STATUS_INVALID_ARGUMENT);
  check(s);
  pcp_sched_release(s);
}

static void reservation_table_is_bounded(void** state) {
  (void)state;
  pcp_sched_options_t options;
  pcp_sched_options_initialize(&options);
  options.max_workers = 4;
  options.max_reservations = 1;
  pcp_sched_t* s = NULL;
  EXPECT_OK(pcp_sched_create(&options, pcp_allocator_system(), &s));
  add(s, "a", PCP_SCHED_BACKEND_CPU, NULL, 1);
  add(s, "b", PCP_SCHED_BACKEND_CPU, NULL, 1);
  uint64_t rid = 0;
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_ANY, NULL, 1);
  EXPECT_OK(pcp_sched_reservation_reserve(s, PCP_SCHED_OWNER_JOBS, &c, 0, 0, 9,
                                          &rid));
  EXPECT_CODE(
      pcp_sched_reservation_reserve(s, PCP_SCHED_OWNER_JOBS, &c, 0, 0, 9, &rid),
      PCP_STATUS_RESOURCE_EXHAUSTED);
  EXPECT_CODE(
      pcp_sched_reservation_reserve(s, PCP_SCHED_OWNER_JOBS, &c, 0, 0, 9, NULL),
      PCP_STATUS_INVALID_ARGUMENT);
  c.worker_count = 0;
  EXPECT_CODE(
      pcp_sched_reservation_reserve(s, PCP_SCHED_OWNER_JOBS, &c, 0, 0, 9, &rid),
      PCP_STATUS_INVALID_ARGUMENT);
  check(s);
  pcp_sched_release(s);
}

//===----------------------------------------------------------------------===//
// Loss and reassignment
//===----------------------------------------------------------------------===//

static void lost_lease_moves_to_a_free_worker(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(4);
  add(s, "a", PCP_SCHED_BACKEND_CUDA, "sm_80", 10);
  add(s, "b", PCP_SCHED_BACKEND_CUDA, "sm_80", 20);
  add(s, "c", PCP_SCHED_BACKEND_CUDA, "sm_90", 20);
  uint64_t id = 0;
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_CUDA, "sm_80", 1);
  EXPECT_OK(
      pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_TRAINING, &c, 11, &id, 1));
  pcp_sched_event_t event;
  EXPECT_OK(pcp_sched_worker_mark_lost(s, "a", 5, &event));
  assert_int_equal(event.kind, PCP_SCHED_EVENT_LEASE_REASSIGNED);
  assert_true(event.worker_lost);
  assert_int_equal(event.lease_id, id);
  assert_int_equal(event.owner, PCP_SCHED_OWNER_TRAINING);
  assert_int_equal(event.tag, 11);
  assert_string_equal(event.worker_id.value, "a");
  assert_string_equal(event.new_worker_id.value, "b");  // sm_90 never fits
  pcp_sched_worker_status_t ws;
  EXPECT_OK(pcp_sched_worker_query(s, "a", &ws));
  assert_int_equal(ws.state, PCP_SCHED_WORKER_STATE_LOST);
  assert_int_equal(ws.lease_id, 0);
  EXPECT_OK(pcp_sched_worker_query(s, "b", &ws));
  assert_int_equal(ws.lease_id, id);
  // Losing a worker that holds nothing reports nothing.
  EXPECT_OK(pcp_sched_worker_mark_lost(s, "c", 6, &event));
  assert_int_equal(event.kind, PCP_SCHED_EVENT_NONE);
  assert_true(event.worker_lost);
  check(s);
  pcp_sched_release(s);
}

static void class_name_filters_leases_and_reassignment(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(8);
  const char* classes[4] = {"gen", "train", "gen", NULL};
  const char* ids[4] = {"g0", "t0", "g1", "none"};
  for (int i = 0; i < 4; ++i) {
    pcp_sched_worker_info_t info =
        info_of(ids[i], PCP_SCHED_BACKEND_CPU, NULL, 1);
    EXPECT_OK(pcp_sched_worker_join(s, &info, 0));
    EXPECT_OK(pcp_sched_worker_class_name_set(s, ids[i], classes[i]));
    EXPECT_OK(pcp_sched_worker_ready(s, ids[i], 0, NULL));
  }
  pcp_sched_worker_status_t ws;
  EXPECT_OK(pcp_sched_worker_query(s, "t0", &ws));
  assert_string_equal(ws.class_name, "train");
  EXPECT_OK(pcp_sched_worker_query(s, "none", &ws));
  assert_string_equal(ws.class_name, "");
  // Three "gen" workers are not there: nothing leased.
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_ANY, NULL, 3);
  uint64_t leases[4] = {0};
  EXPECT_CODE(pcp_sched_lease_acquire_class(s, PCP_SCHED_OWNER_JOBS, &c, "gen",
                                            1, leases, 3),
              PCP_STATUS_UNAVAILABLE);
  EXPECT_CODE(pcp_sched_lease_acquire_class(s, PCP_SCHED_OWNER_JOBS, &c,
                                            "absent", 1, leases, 3),
              PCP_STATUS_UNAVAILABLE);
  // One lease on "gen"; its worker's loss moves it to the other "gen"
  // worker, never to the free "train" or unclassed one; losing that one
  // too detaches it.
  c.worker_count = 1;
  EXPECT_OK(pcp_sched_lease_acquire_class(s, PCP_SCHED_OWNER_JOBS, &c, "gen", 2,
                                          leases, 1));
  pcp_sched_lease_status_t ls;
  EXPECT_OK(pcp_sched_lease_query(s, leases[0], &ls));
  const char* first = ls.worker_id.value[1] == '0' ? "g0" : "g1";
  const char* second = strcmp(first, "g0") == 0 ? "g1" : "g0";
  pcp_sched_event_t event;
  EXPECT_OK(pcp_sched_worker_mark_lost(s, first, 5, &event));
  assert_int_equal(event.kind, PCP_SCHED_EVENT_LEASE_REASSIGNED);
  assert_string_equal(event.new_worker_id.value, second);
  EXPECT_OK(pcp_sched_worker_mark_lost(s, second, 6, &event));
  assert_int_equal(event.kind, PCP_SCHED_EVENT_LEASE_DETACHED);
  // No class name: any worker, the unclassed and "train" ones included.
  c.worker_count = 2;
  EXPECT_OK(pcp_sched_lease_acquire_class(s, PCP_SCHED_OWNER_JOBS, &c, "", 3,
                                          leases + 1, 2));
  // A held worker's class cannot change; a rejoin clears it.
  EXPECT_CODE(pcp_sched_worker_class_name_set(s, "t0", "gen"),
              PCP_STATUS_FAILED_PRECONDITION);
  pcp_sched_worker_info_t again =
      info_of(first, PCP_SCHED_BACKEND_CPU, NULL, 1);
  EXPECT_OK(pcp_sched_worker_join(s, &again, 8));
  EXPECT_OK(pcp_sched_worker_query(s, first, &ws));
  assert_string_equal(ws.class_name, "");
  check(s);
  // Malformed names: INVALID_ARGUMENT.
  EXPECT_CODE(pcp_sched_worker_class_name_set(s, first, "two words"),
              PCP_STATUS_INVALID_ARGUMENT);
  c.worker_count = 1;
  EXPECT_CODE(pcp_sched_lease_acquire_class(s, PCP_SCHED_OWNER_JOBS, &c, "x/y",
                                            4, leases, 1),
              PCP_STATUS_INVALID_ARGUMENT);
  assert_true(pcp_sched_class_name_is_valid("gen.v2_A-1"));
  assert_false(pcp_sched_class_name_is_valid(""));
  assert_false(pcp_sched_class_name_is_valid(NULL));
  char long_name[65];
  memset(long_name, 'a', 64);
  long_name[64] = 0;
  assert_false(pcp_sched_class_name_is_valid(long_name));
  long_name[63] = 0;
  assert_true(pcp_sched_class_name_is_valid(long_name));
  check(s);
  pcp_sched_release(s);
}

static void detached_lease_resumes_on_rejoin(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(4);  // grace 500
  add(s, "a", PCP_SCHED_BACKEND_CPU, NULL, 1);
  uint64_t id = 0;
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_ANY, NULL, 1);
  EXPECT_OK(pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_JOBS, &c, 4, &id, 1));
  pcp_sched_event_t event;
  EXPECT_OK(pcp_sched_worker_mark_lost(s, "a", 100, &event));
  assert_int_equal(event.kind, PCP_SCHED_EVENT_LEASE_DETACHED);
  assert_int_equal(event.lease_id, id);
  pcp_sched_lease_status_t ls;
  EXPECT_OK(pcp_sched_lease_query(s, id, &ls));
  assert_true(ls.detached);
  assert_int_equal(ls.detached_deadline_ns, 600);
  assert_string_equal(ls.worker_id.value, "a");
  pcp_sched_owner_stats_t stats;
  EXPECT_OK(pcp_sched_owner_stats_query(s, PCP_SCHED_OWNER_JOBS, &stats));
  assert_int_equal(stats.detached_leases, 1);
  check(s);
  // Rejoining is not enough: the lease comes back when it is ready.
  pcp_sched_worker_info_t info = info_of("a", PCP_SCHED_BACKEND_CPU, NULL, 1);
  EXPECT_OK(pcp_sched_worker_join(s, &info, 300));
  check(s);
  EXPECT_OK(pcp_sched_worker_ready(s, "a", 599, &event));
  assert_int_equal(event.kind, PCP_SCHED_EVENT_LEASE_RESUMED);
  assert_int_equal(event.lease_id, id);
  assert_string_equal(event.new_worker_id.value, "a");
  assert_int_equal(state_of(s, "a"), PCP_SCHED_WORKER_STATE_BUSY);
  EXPECT_OK(pcp_sched_lease_query(s, id, &ls));
  assert_false(ls.detached);
  check(s);
  pcp_sched_release(s);
}

static void detached_lease_expires_after_grace(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(4);
  add(s, "a", PCP_SCHED_BACKEND_CPU, NULL, 1);
  uint64_t id = 0;
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_ANY, NULL, 1);
  EXPECT_OK(pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_JOBS, &c, 4, &id, 1));
  pcp_sched_event_t event;
  EXPECT_OK(pcp_sched_worker_mark_lost(s, "a", 100, &event));
  pcp_sched_worker_info_t info = info_of("a", PCP_SCHED_BACKEND_CPU, NULL, 1);
  EXPECT_OK(pcp_sched_worker_join(s, &info, 550));
  // Ready at the deadline: too late; the worker is plain READY.
  EXPECT_OK(pcp_sched_worker_ready(s, "a", 600, &event));
  assert_int_equal(event.kind, PCP_SCHED_EVENT_NONE);
  assert_int_equal(state_of(s, "a"), PCP_SCHED_WORKER_STATE_READY);
  pcp_sched_event_t events[4];
  size_t count = 0;
  EXPECT_OK(pcp_sched_tick(s, 600, events, 4, &count));
  assert_int_equal(count, 1);
  assert_int_equal(events[0].kind, PCP_SCHED_EVENT_LEASE_EXPIRED);
  assert_int_equal(events[0].lease_id, id);
  assert_int_equal(events[0].tag, 4);
  EXPECT_CODE(pcp_sched_lease_release(s, id), PCP_STATUS_NOT_FOUND);
  check(s);
  pcp_sched_release(s);
}

static void detached_lease_does_not_resume_on_changed_worker(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(4);
  add(s, "a", PCP_SCHED_BACKEND_CUDA, "sm_80", 1);
  uint64_t id = 0;
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_CUDA, "sm_80", 1);
  EXPECT_OK(pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_JOBS, &c, 4, &id, 1));
  pcp_sched_event_t event;
  EXPECT_OK(pcp_sched_worker_mark_lost(s, "a", 100, &event));
  pcp_sched_worker_info_t info =
      info_of("a", PCP_SCHED_BACKEND_CUDA, "sm_90", 1);
  EXPECT_OK(pcp_sched_worker_join(s, &info, 200));
  EXPECT_OK(pcp_sched_worker_ready(s, "a", 200, &event));
  assert_int_equal(event.kind, PCP_SCHED_EVENT_NONE);
  // A fitting worker appears: the next tick moves the lease there.
  add(s, "b", PCP_SCHED_BACKEND_CUDA, "sm_80", 1);
  pcp_sched_event_t events[4];
  size_t count = 0;
  EXPECT_OK(pcp_sched_worker_heartbeat(s, "a", 300, 0));
  EXPECT_OK(pcp_sched_worker_heartbeat(s, "b", 300, 0));
  EXPECT_OK(pcp_sched_tick(s, 300, events, 4, &count));
  assert_int_equal(count, 1);
  assert_int_equal(events[0].kind, PCP_SCHED_EVENT_LEASE_REASSIGNED);
  assert_false(events[0].worker_lost);
  assert_string_equal(events[0].worker_id.value, "a");
  assert_string_equal(events[0].new_worker_id.value, "b");
  check(s);
  pcp_sched_release(s);
}

static void removed_worker_cannot_resume(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(4);
  add(s, "a", PCP_SCHED_BACKEND_CPU, NULL, 1);
  uint64_t id = 0;
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_ANY, NULL, 1);
  EXPECT_OK(pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_JOBS, &c, 4, &id, 1));
  pcp_sched_event_t event;
  EXPECT_OK(pcp_sched_worker_remove(s, "a", 100, &event));
  assert_int_equal(event.kind, PCP_SCHED_EVENT_LEASE_DETACHED);
  pcp_sched_worker_info_t info = info_of("a", PCP_SCHED_BACKEND_CPU, NULL, 1);
  EXPECT_OK(pcp_sched_worker_join(s, &info, 150));
  EXPECT_OK(pcp_sched_worker_ready(s, "a", 150, &event));
  assert_int_equal(event.kind, PCP_SCHED_EVENT_NONE);
  check(s);
  pcp_sched_release(s);
}

static void lost_reserved_worker_is_replaced_or_breaks(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(4);
  add(s, "a", PCP_SCHED_BACKEND_CPU, NULL, 1);
  add(s, "b", PCP_SCHED_BACKEND_CPU, NULL, 1);
  add(s, "c", PCP_SCHED_BACKEND_CPU, NULL, 1);
  uint64_t rid = 0;
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_ANY, NULL, 2);
  EXPECT_OK(pcp_sched_reservation_reserve(s, PCP_SCHED_OWNER_TRAINING, &c, 8, 0,
                                          1000, &rid));
  pcp_sched_event_t event;
  EXPECT_OK(pcp_sched_worker_mark_lost(s, "a", 10, &event));
  assert_int_equal(event.kind, PCP_SCHED_EVENT_NONE);  // "c" took the slot
  pcp_sched_worker_status_t ws;
  EXPECT_OK(pcp_sched_worker_query(s, "c", &ws));
  assert_int_equal(ws.reservation_id, rid);
  check(s);
  EXPECT_OK(pcp_sched_worker_mark_lost(s, "b", 20, &event));
  assert_int_equal(event.kind, PCP_SCHED_EVENT_RESERVATION_BROKEN);
  assert_int_equal(event.reservation_id, rid);
  assert_int_equal(event.tag, 8);
  assert_int_equal(state_of(s, "c"), PCP_SCHED_WORKER_STATE_READY);
  uint64_t ids[2];
  EXPECT_CODE(pcp_sched_reservation_commit(s, rid, 30, ids, 2),
              PCP_STATUS_NOT_FOUND);
  check(s);
  pcp_sched_release(s);
}

static void tick_evicts_silent_workers(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(8);  // heartbeat timeout 1000
  add(s, "a", PCP_SCHED_BACKEND_CPU, NULL, 1);
  add(s, "b", PCP_SCHED_BACKEND_CPU, NULL, 1);
  add(s, "c", PCP_SCHED_BACKEND_CPU, NULL, 1);
  uint64_t id = 0;
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_ANY, NULL, 1);
  EXPECT_OK(pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_JOBS, &c, 4, &id, 1));
  // Half the timeout: nobody is evicted.
  pcp_sched_event_t events[8];
  size_t count = 0;
  EXPECT_OK(pcp_sched_tick(s, 500, events, 8, &count));
  assert_int_equal(count, 0);
  EXPECT_OK(pcp_sched_worker_heartbeat(s, "c", 900, 0));
  // Past the timeout: "a" (leased) and "b" are lost; the lease moves to "c".
  // Capacity 1: the tick stops after each event and resumes.
  EXPECT_OK(pcp_sched_tick(s, 1000, events, 1, &count));
  assert_int_equal(count, 1);
  assert_int_equal(events[0].kind, PCP_SCHED_EVENT_LEASE_REASSIGNED);
  assert_true(events[0].worker_lost);
  assert_string_equal(events[0].worker_id.value, "a");
  assert_string_equal(events[0].new_worker_id.value, "c");
  check(s);
  EXPECT_OK(pcp_sched_tick(s, 1000, events, 1, &count));
  assert_int_equal(count, 1);
  assert_int_equal(events[0].kind, PCP_SCHED_EVENT_WORKER_LOST);
  assert_string_equal(events[0].worker_id.value, "b");
  EXPECT_OK(pcp_sched_tick(s, 1000, events, 1, &count));
  assert_int_equal(count, 0);
  // Disabled sweep: nothing is ever lost by a tick.
  pcp_sched_options_t options;
  pcp_sched_options_initialize(&options);
  options.heartbeat_timeout_ns = 0;
  pcp_sched_t* quiet = NULL;
  EXPECT_OK(pcp_sched_create(&options, pcp_allocator_system(), &quiet));
  add(quiet, "z", PCP_SCHED_BACKEND_CPU, NULL, 1);
  EXPECT_OK(pcp_sched_tick(quiet, INT64_MAX, events, 8, &count));
  assert_int_equal(count, 0);
  check(s);
  check(quiet);
  pcp_sched_release(quiet);
  pcp_sched_release(s);
}

// Every entry point with NULL or garbage: statuses, never an abort.
static void bad_input_gets_statuses(void** state) {
  (void)state;
  pcp_sched_t* s = make_sched(2);
  pcp_sched_event_t event;
  pcp_sched_worker_status_t ws;
  pcp_sched_lease_status_t ls;
  pcp_sched_reservation_status_t rs;
  size_t count = 0;
  EXPECT_CODE(pcp_sched_create(NULL, pcp_allocator_system(), NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(pcp_sched_worker_ready(s, NULL, 0, &event),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(pcp_sched_worker_ready(s, "ghost", 0, &event),
              PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_sched_worker_update(s, NULL), PCP_STATUS_INVALID_ARGUMENT);
  pcp_sched_worker_info_t ghost =
      info_of("ghost", PCP_SCHED_BACKEND_CPU, NULL, 1);
  EXPECT_CODE(pcp_sched_worker_update(s, &ghost), PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_sched_worker_drain(s, "ghost"), PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_sched_worker_mark_lost(s, "ghost", 0, &event),
              PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_sched_worker_mark_lost(s, NULL, 0, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(pcp_sched_worker_remove(s, "ghost", 0, &event),
              PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_sched_worker_query(s, "ghost", &ws), PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_sched_worker_query(s, "ghost", NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(pcp_sched_lease_query(s, 1, &ls), PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_sched_lease_query(s, 1, NULL), PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(pcp_sched_reservation_query(s, 1, &rs), PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_sched_reservation_release(s, 0), PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_sched_reservation_commit(s, 1, 0, NULL, 0),
              PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_sched_owner_stats_query(s, PCP_SCHED_OWNER_COUNT_, NULL),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(
      pcp_sched_owner_leases_list(s, PCP_SCHED_OWNER_JOBS, NULL, 4, &count),
      PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_OK(
      pcp_sched_owner_leases_list(s, PCP_SCHED_OWNER_JOBS, NULL, 0, &count));
  assert_int_equal(count, 0);
  pcp_sched_constraint_t c = want(PCP_SCHED_WORKER_CLASS_ANY, "bad target!", 1);
  uint64_t id = 0;
  EXPECT_CODE(pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_JOBS, &c, 0, &id, 1),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(pcp_sched_lease_acquire(s, PCP_SCHED_OWNER_JOBS, NULL, 0, &id, 1),
              PCP_STATUS_INVALID_ARGUMENT);
  check(s);
  pcp_sched_release(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(names_round_trip),
      cmocka_unit_test(create_rejects_bad_options),
      cmocka_unit_test(create_survives_every_allocation_failure),
      cmocka_unit_test(join_rejects_bad_info),
      cmocka_unit_test(registry_is_bounded_and_evicts_oldest_lost),
      cmocka_unit_test(worker_state_transitions),
      cmocka_unit_test(match_filters_and_orders),
      cmocka_unit_test(results_do_not_depend_on_join_order),
      cmocka_unit_test(acquire_is_all_or_nothing),
      cmocka_unit_test(release_twice_is_not_found),
      cmocka_unit_test(owner_max_and_lease_table_bound),
      cmocka_unit_test(policy_set_validates),
      cmocka_unit_test(transfer_moves_ownership),
      cmocka_unit_test(reserved_workers_are_protected),
      cmocka_unit_test(reservation_commit_makes_leases),
      cmocka_unit_test(reservation_expires_on_tick),
      cmocka_unit_test(reservation_table_is_bounded),
      cmocka_unit_test(lost_lease_moves_to_a_free_worker),
      cmocka_unit_test(class_name_filters_leases_and_reassignment),
      cmocka_unit_test(detached_lease_resumes_on_rejoin),
      cmocka_unit_test(detached_lease_expires_after_grace),
      cmocka_unit_test(detached_lease_does_not_resume_on_changed_worker),
      cmocka_unit_test(removed_worker_cannot_resume),
      cmocka_unit_test(lost_reserved_worker_is_replaced_or_breaks),
      cmocka_unit_test(tick_evicts_silent_workers),
      cmocka_unit_test(bad_input_gets_statuses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
