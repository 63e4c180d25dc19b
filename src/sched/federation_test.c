// SPDX-License-Identifier: Apache-2.0
// Unit tests for the federation registry and placement (sched.h,
// "Federation"): one test per rule, the staleness boundary included.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sched/sched.h"

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

// Expects |expr| to fail with INVALID_ARGUMENT whose message names |word|.
#define EXPECT_INVALID_NAMING(expr, word)                                \
  do {                                                                   \
    pcp_status_t st_ = (expr);                                           \
    assert_int_equal(pcp_status_code(st_), PCP_STATUS_INVALID_ARGUMENT); \
    if (!strstr(pcp_status_message(st_), (word))) {                      \
      print_error("message '%s' lacks '%s'\n", pcp_status_message(st_),  \
                  (word));                                               \
      fail();                                                            \
    }                                                                    \
    pcp_status_ignore(st_);                                              \
  } while (0)

#define INTERVAL 1000  // ns

static pcp_sched_federation_t* make(void) {
  pcp_sched_federation_options_t options;
  pcp_sched_federation_options_initialize(&options);
  options.heartbeat_interval_ns = INTERVAL;
  options.max_gateways = 4;
  pcp_sched_federation_t* f = NULL;
  EXPECT_OK(pcp_sched_federation_create(&options, pcp_allocator_system(), &f));
  return f;
}

static const char* const kTrainingCaps[] = {"training.regular"};

static pcp_sched_federation_service_t training(const char* id,
                                               int64_t available) {
  pcp_sched_federation_service_t s;
  pcp_sched_federation_service_initialize(&s);
  s.service_id = id;
  s.service_type = "training";
  s.health_status = "ok";
  s.capabilities = kTrainingCaps;
  s.capability_count = 1;
  s.workers_available = available;
  return s;
}

static pcp_sched_federation_connect_t request(
    const char* gateway, const pcp_sched_federation_service_t* services,
    uint32_t count) {
  pcp_sched_federation_connect_t r = {
      .gateway_id = gateway,
      .lab_id = "lab",
      .base_url = "http://127.0.0.1:9",
      .graph_backend = "sqlite",
      .services = services,
      .service_count = count,
      .registered_services = PCP_SCHED_FEDERATION_COUNT_ABSENT,
  };
  return r;
}

static void connect1(pcp_sched_federation_t* f, const char* gateway,
                     int64_t available, int64_t now) {
  pcp_sched_federation_service_t s = training("train", available);
  pcp_sched_federation_connect_t r = request(gateway, &s, 1);
  EXPECT_OK(pcp_sched_federation_connect(f, &r, now, 1000 + now, NULL));
}

static pcp_sched_federation_selector_t train_selector(void) {
  pcp_sched_federation_selector_t sel = {.capability = "training.regular"};
  return sel;
}

// upsert keeps connected_at, replaces fields, never lowers
// last_replicated_sequence, and derives registered_services
static void test_upsert(void** state) {
  (void)state;
  pcp_sched_federation_t* f = make();
  pcp_sched_federation_service_t s = training("train", 2);
  pcp_sched_federation_connect_t r = request("gw-a", &s, 1);
  r.last_sequence_no = 10;
  r.last_replicated_sequence = 7;
  EXPECT_OK(pcp_sched_federation_connect(f, &r, 0, 5000, NULL));
  r.lab_id = "lab-2";
  r.last_sequence_no = 12;
  r.last_replicated_sequence = 3;
  r.service_count = 0;
  r.registered_services = 5;
  EXPECT_OK(pcp_sched_federation_connect(f, &r, 100, 6000, NULL));
  pcp_sched_federation_gateway_t g;
  EXPECT_OK(pcp_sched_federation_gateway_find(f, "gw-a", 100, &g));
  assert_string_equal(g.lab_id, "lab-2");
  assert_int_equal(g.connected_at_wall_ns, 5000);
  assert_int_equal(g.last_seen_wall_ns, 6000);
  assert_int_equal(g.last_sequence_no, 12);
  assert_int_equal(g.last_replicated_sequence, 7);
  assert_int_equal(g.service_count, 0);
  assert_int_equal(g.registered_services, 5);
  assert_int_equal(pcp_sched_federation_gateway_count(f), 1);
  EXPECT_CODE(pcp_sched_federation_gateway_find(f, "gw-z", 100, &g),
              PCP_STATUS_NOT_FOUND);
  pcp_sched_federation_release(f);
}

// the hub-side count normalisation chain of s.6.1 and the default executor
static void test_count_normalisation(void** state) {
  (void)state;
  pcp_sched_federation_t* f = make();
  pcp_sched_federation_service_t s[3];
  // Only legacy names: connected from worker_count, available from
  // ready_worker_count; ready raised to available.
  s[0] = training("a", PCP_SCHED_FEDERATION_COUNT_ABSENT);
  s[0].worker_count = 4;
  s[0].ready_worker_count = 3;
  // dispatchable wins over available; connected raised to ready.
  s[1] = training("b", 1);
  s[1].workers_dispatchable = 5;
  s[1].workers_ready = 2;
  s[1].workers_connected = 1;
  // Nothing given: zeros.
  s[2] = training("c", PCP_SCHED_FEDERATION_COUNT_ABSENT);
  s[2].executor_id = "exec-c";
  pcp_sched_federation_connect_t r = request("gw", s, 3);
  EXPECT_OK(pcp_sched_federation_connect(f, &r, 0, 0, NULL));
  pcp_sched_federation_gateway_t g;
  EXPECT_OK(pcp_sched_federation_gateway_find(f, "gw", 0, &g));
  assert_int_equal(g.registered_services, 3);
  assert_int_equal(g.services[0].workers_connected, 4);
  assert_int_equal(g.services[0].workers_available, 3);
  assert_int_equal(g.services[0].workers_ready, 3);
  assert_string_equal(g.services[0].executor_id, "gw:training:a");
  assert_int_equal(g.services[1].workers_available, 5);
  assert_int_equal(g.services[1].workers_ready, 5);
  assert_int_equal(g.services[1].workers_connected, 5);
  assert_int_equal(g.services[1].workers_dispatchable, 5);
  assert_int_equal(g.services[2].workers_connected, 0);
  assert_int_equal(g.services[2].workers_available, 0);
  assert_string_equal(g.services[2].executor_id, "exec-c");
  assert_string_equal(g.services[2].auth_mode, "none");
  assert_null(g.services[2].worker_class);
  pcp_sched_federation_release(f);
}

// bad advertisements are refused with the field named and change nothing
static void test_connect_validation(void** state) {
  (void)state;
  pcp_sched_federation_t* f = make();
  connect1(f, "gw", 2, 0);
  pcp_sched_federation_service_t s = training("train", 2);
  pcp_sched_federation_connect_t r = request("gw", &s, 1);
  r.base_url = "ftp://x";
  EXPECT_INVALID_NAMING(pcp_sched_federation_connect(f, &r, 1, 1, NULL),
                        "base_url");
  r = request("gw", &s, 1);
  r.lab_id = NULL;
  EXPECT_INVALID_NAMING(pcp_sched_federation_connect(f, &r, 1, 1, NULL),
                        "lab_id");
  r = request("gw bad", &s, 1);
  EXPECT_INVALID_NAMING(pcp_sched_federation_connect(f, &r, 1, 1, NULL),
                        "gateway_id");
  s.workers_available = -2;
  r = request("gw", &s, 1);
  EXPECT_INVALID_NAMING(pcp_sched_federation_connect(f, &r, 1, 1, NULL),
                        "services[0].workers_available");
  s = training("train", 2);
  pcp_sched_federation_service_t two[2] = {s, s};
  r = request("gw", two, 2);
  EXPECT_INVALID_NAMING(pcp_sched_federation_connect(f, &r, 1, 1, NULL),
                        "repeats");
  r = request("gw", &s, 1);
  r.last_sequence_no = -1;
  EXPECT_INVALID_NAMING(pcp_sched_federation_connect(f, &r, 1, 1, NULL),
                        "last_sequence_no");
  r = request("gw", &s, PCP_SCHED_FEDERATION_MAX_SERVICES + 1);
  EXPECT_INVALID_NAMING(pcp_sched_federation_connect(f, &r, 1, 1, NULL),
                        "services");
  // The registration is the first one, untouched.
  pcp_sched_federation_gateway_t g;
  EXPECT_OK(pcp_sched_federation_gateway_find(f, "gw", 0, &g));
  assert_int_equal(g.last_seen_wall_ns, 1000);
  assert_int_equal(g.services[0].workers_available, 2);
  // Capacity.
  connect1(f, "gw-2", 1, 0);
  connect1(f, "gw-3", 1, 0);
  connect1(f, "gw-4", 1, 0);
  s = training("train", 1);
  r = request("gw-5", &s, 1);
  EXPECT_CODE(pcp_sched_federation_connect(f, &r, 0, 0, NULL),
              PCP_STATUS_RESOURCE_EXHAUSTED);
  // A known gateway still reconnects at capacity.
  connect1(f, "gw-4", 3, 1);
  pcp_sched_federation_release(f);
}

// a gateway is CONNECTED through exactly 3 intervals after its last connect
// and STALE one nanosecond later; its next connect recovers it
static void test_staleness_boundary(void** state) {
  (void)state;
  pcp_sched_federation_t* f = make();
  const int64_t t0 = 5000;
  connect1(f, "gw", 2, t0);
  pcp_sched_federation_gateway_t g;
  const int64_t edge = t0 + PCP_SCHED_FEDERATION_STALE_INTERVALS * INTERVAL;
  EXPECT_OK(pcp_sched_federation_gateway_find(f, "gw", edge, &g));
  assert_int_equal(g.status, PCP_SCHED_FEDERATION_STATUS_CONNECTED);
  EXPECT_OK(pcp_sched_federation_gateway_find(f, "gw", edge + 1, &g));
  assert_int_equal(g.status, PCP_SCHED_FEDERATION_STATUS_STALE);
  assert_string_equal(pcp_sched_federation_status_name(g.status), "stale");
  uint32_t connected, stale;
  pcp_sched_federation_status_counts(f, edge, &connected, &stale);
  assert_int_equal(connected, 1);
  assert_int_equal(stale, 0);
  pcp_sched_federation_status_counts(f, edge + 1, &connected, &stale);
  assert_int_equal(connected, 0);
  assert_int_equal(stale, 1);
  // Placement follows the status on both sides of the edge.
  pcp_sched_federation_selector_t sel = train_selector();
  pcp_sched_federation_placement_t p;
  EXPECT_OK(pcp_sched_federation_place(f, &sel, edge, &p));
  uint64_t epoch = p.epoch;
  EXPECT_CODE(pcp_sched_federation_place(f, &sel, edge + 1, &p),
              PCP_STATUS_UNAVAILABLE);
  sel.gateway_id = "gw";
  EXPECT_CODE(pcp_sched_federation_place(f, &sel, edge + 1, &p),
              PCP_STATUS_FAILED_PRECONDITION);
  // Recovery on the next connect, with a new epoch.
  pcp_sched_federation_service_t s = training("train", 2);
  pcp_sched_federation_connect_t r = request("gw", &s, 1);
  bool recovered = false;
  EXPECT_OK(
      pcp_sched_federation_connect(f, &r, edge + 10, edge + 10, &recovered));
  assert_true(recovered);
  EXPECT_OK(pcp_sched_federation_place(f, &sel, edge + 10, &p));
  assert_true(p.epoch != epoch);
  // A connect while still connected is no recovery and keeps the epoch.
  EXPECT_OK(
      pcp_sched_federation_connect(f, &r, edge + 20, edge + 20, &recovered));
  assert_false(recovered);
  pcp_sched_federation_placement_t again;
  EXPECT_OK(pcp_sched_federation_place(f, &sel, edge + 20, &again));
  assert_int_equal(again.epoch, p.epoch);
  pcp_sched_federation_release(f);
}

// restored registrations are stale until their gateway connects
static void test_restore(void** state) {
  (void)state;
  pcp_sched_federation_t* f = make();
  pcp_sched_federation_service_t s = training("train", 4);
  pcp_sched_federation_connect_t r = request("gw", &s, 1);
  r.last_replicated_sequence = 9;
  EXPECT_OK(pcp_sched_federation_restore(f, &r, 111, 222));
  EXPECT_CODE(pcp_sched_federation_restore(f, &r, 111, 222),
              PCP_STATUS_ALREADY_EXISTS);
  pcp_sched_federation_gateway_t g;
  EXPECT_OK(pcp_sched_federation_gateway_find(f, "gw", 0, &g));
  assert_int_equal(g.status, PCP_SCHED_FEDERATION_STATUS_STALE);
  assert_int_equal(g.connected_at_wall_ns, 111);
  pcp_sched_federation_selector_t sel = train_selector();
  pcp_sched_federation_placement_t p;
  EXPECT_CODE(pcp_sched_federation_place(f, &sel, 0, &p),
              PCP_STATUS_UNAVAILABLE);
  r.last_replicated_sequence = 2;
  bool recovered = false;
  EXPECT_OK(pcp_sched_federation_connect(f, &r, 50, 333, &recovered));
  assert_true(recovered);
  EXPECT_OK(pcp_sched_federation_gateway_find(f, "gw", 50, &g));
  assert_int_equal(g.status, PCP_SCHED_FEDERATION_STATUS_CONNECTED);
  assert_int_equal(g.connected_at_wall_ns, 111);
  assert_int_equal(g.last_replicated_sequence, 9);
  EXPECT_OK(pcp_sched_federation_place(f, &sel, 50, &p));
  assert_string_equal(p.gateway_id, "gw");
  pcp_sched_federation_release(f);
}

// workers_required filters: a service with fewer available workers is never
// chosen, even when it is the only one (upstream only ranked)
static void test_workers_required_filters(void** state) {
  (void)state;
  pcp_sched_federation_t* f = make();
  connect1(f, "small", 1, 0);
  pcp_sched_federation_selector_t sel = train_selector();
  sel.workers_required = 2;
  pcp_sched_federation_placement_t p;
  pcp_status_t st = pcp_sched_federation_place(f, &sel, 0, &p);
  assert_int_equal(pcp_status_code(st), PCP_STATUS_UNAVAILABLE);
  assert_non_null(strstr(pcp_status_message(st), "workers available"));
  pcp_status_ignore(st);
  connect1(f, "big", 3, 0);
  EXPECT_OK(pcp_sched_federation_place(f, &sel, 0, &p));
  assert_string_equal(p.gateway_id, "big");
  assert_int_equal(p.candidate_count, 1);
  sel.workers_required = 3;
  EXPECT_OK(pcp_sched_federation_place(f, &sel, 0, &p));
  assert_string_equal(p.gateway_id, "big");
  sel.workers_required = 4;
  EXPECT_CODE(pcp_sched_federation_place(f, &sel, 0, &p),
              PCP_STATUS_UNAVAILABLE);
  pcp_sched_federation_release(f);
}

// ranking: health ok first, then available, ready, newer; then first seen
static void test_ranking(void** state) {
  (void)state;
  pcp_sched_federation_t* f = make();
  pcp_sched_federation_service_t s[4];
  s[0] = training("sick", 9);
  s[0].health_status = "degraded";
  s[1] = training("old", 2);
  s[1].workers_ready = 2;
  s[1].updated_at_wall_ns = 10;
  s[2] = training("new", 2);
  s[2].workers_ready = 2;
  s[2].updated_at_wall_ns = 20;
  s[3] = training("ready", 2);
  s[3].workers_ready = 3;
  s[3].updated_at_wall_ns = 1;
  pcp_sched_federation_connect_t r = request("gw", s, 4);
  EXPECT_OK(pcp_sched_federation_connect(f, &r, 0, 0, NULL));
  pcp_sched_federation_selector_t sel = train_selector();
  pcp_sched_federation_placement_t p;
  EXPECT_OK(pcp_sched_federation_place(f, &sel, 0, &p));
  assert_string_equal(p.service_id, "ready");  // ok beats 9 available
  assert_int_equal(p.candidate_count, 4);
  sel.service_id = "sick";
  EXPECT_OK(pcp_sched_federation_place(f, &sel, 0, &p));
  assert_string_equal(p.service_id, "sick");  // the only one named
  // Without the ready edge, newer wins.
  r.services = &s[1];
  r.service_count = 2;
  EXPECT_OK(pcp_sched_federation_connect(f, &r, 0, 0, NULL));
  sel = train_selector();
  EXPECT_OK(pcp_sched_federation_place(f, &sel, 0, &p));
  assert_string_equal(p.service_id, "new");
  // Full tie across gateways: the earlier registered one.
  pcp_sched_federation_release(f);
  f = make();
  connect1(f, "first", 2, 0);
  connect1(f, "second", 2, 0);
  EXPECT_OK(pcp_sched_federation_place(f, &sel, 0, &p));
  assert_string_equal(p.gateway_id, "first");
  pcp_sched_federation_release(f);
}

// selector fields match exactly; a service lacking a named field never
// matches; rl selects by type; the message says which filter emptied the set
static void test_selector_fields(void** state) {
  (void)state;
  pcp_sched_federation_t* f = make();
  pcp_sched_federation_service_t s[2];
  s[0] = training("cpu-train", 2);
  s[0].worker_class = "cpu";
  s[0].target_arch = "x86_64";
  pcp_sched_federation_service_initialize(&s[1]);
  s[1].service_id = "rl-main";
  s[1].service_type = "rl";
  s[1].workers_available = 1;
  pcp_sched_federation_connect_t r = request("gw", s, 2);
  EXPECT_OK(pcp_sched_federation_connect(f, &r, 0, 0, NULL));
  pcp_sched_federation_placement_t p;
  pcp_sched_federation_selector_t sel = train_selector();
  sel.worker_class = "cpu";
  sel.target_arch = "x86_64";
  EXPECT_OK(pcp_sched_federation_place(f, &sel, 0, &p));
  assert_string_equal(p.executor_id, "gw:training:cpu-train");
  sel.worker_class = "cuda";
  pcp_status_t st = pcp_sched_federation_place(f, &sel, 0, &p);
  assert_int_equal(pcp_status_code(st), PCP_STATUS_UNAVAILABLE);
  assert_non_null(strstr(pcp_status_message(st), "placement fields"));
  pcp_status_ignore(st);
  pcp_sched_federation_selector_t rl = {.service_type = "rl"};
  EXPECT_OK(pcp_sched_federation_place(f, &rl, 0, &p));
  assert_string_equal(p.service_id, "rl-main");
  rl.worker_class = "cpu";  // rl-main has no worker class: never matches
  EXPECT_CODE(pcp_sched_federation_place(f, &rl, 0, &p),
              PCP_STATUS_UNAVAILABLE);
  pcp_sched_federation_selector_t none = {.capability = "inference.chat"};
  st = pcp_sched_federation_place(f, &none, 0, &p);
  assert_non_null(strstr(pcp_status_message(st), "no connected gateway"));
  pcp_status_ignore(st);
  sel = train_selector();
  sel.gateway_id = "nope";
  EXPECT_CODE(pcp_sched_federation_place(f, &sel, 0, &p), PCP_STATUS_NOT_FOUND);
  pcp_sched_federation_release(f);
}

// bad selectors: negative or huge workers_required, both or neither of
// capability / service_type, unknown keys
static void test_bad_selectors(void** state) {
  (void)state;
  pcp_sched_federation_t* f = make();
  connect1(f, "gw", 2, 0);
  pcp_sched_federation_placement_t p;
  pcp_sched_federation_selector_t sel = train_selector();
  sel.workers_required = -1;
  EXPECT_INVALID_NAMING(pcp_sched_federation_place(f, &sel, 0, &p),
                        "workers_required");
  sel.workers_required = PCP_SCHED_FEDERATION_MAX_WORKERS + 1;
  EXPECT_INVALID_NAMING(pcp_sched_federation_place(f, &sel, 0, &p),
                        "workers_required");
  sel = train_selector();
  sel.service_type = "rl";
  EXPECT_INVALID_NAMING(pcp_sched_federation_place(f, &sel, 0, &p),
                        "exactly one");
  pcp_sched_federation_selector_t empty = {0};
  EXPECT_INVALID_NAMING(pcp_sched_federation_place(f, &empty, 0, &p),
                        "exactly one");
  sel = train_selector();
  sel.gateway_id = "";
  EXPECT_INVALID_NAMING(pcp_sched_federation_place(f, &sel, 0, &p),
                        "placement.gateway_id");
  assert_true(pcp_sched_federation_selector_key_known("workers_required"));
  assert_true(pcp_sched_federation_selector_key_known("gateway_id"));
  assert_false(pcp_sched_federation_selector_key_known("workers"));
  assert_false(pcp_sched_federation_selector_key_known(NULL));
  pcp_sched_federation_release(f);
}

// placement_check sees staleness, removal and a new epoch; the test-only
// bug option really places on stale gateways
static void test_placement_check_and_bug_option(void** state) {
  (void)state;
  pcp_sched_federation_t* f = make();
  connect1(f, "gw", 2, 0);
  pcp_sched_federation_selector_t sel = train_selector();
  pcp_sched_federation_placement_t p;
  EXPECT_OK(pcp_sched_federation_place(f, &sel, 0, &p));
  EXPECT_OK(pcp_sched_federation_placement_check(f, &p, 3 * INTERVAL));
  EXPECT_CODE(pcp_sched_federation_placement_check(f, &p, 3 * INTERVAL + 1),
              PCP_STATUS_FAILED_PRECONDITION);
  connect1(f, "gw", 2, 10 * INTERVAL);  // back, new epoch
  EXPECT_CODE(pcp_sched_federation_placement_check(f, &p, 10 * INTERVAL),
              PCP_STATUS_FAILED_PRECONDITION);
  EXPECT_OK(pcp_sched_federation_remove(f, "gw"));
  EXPECT_CODE(pcp_sched_federation_remove(f, "gw"), PCP_STATUS_NOT_FOUND);
  EXPECT_CODE(pcp_sched_federation_placement_check(f, &p, 10 * INTERVAL),
              PCP_STATUS_FAILED_PRECONDITION);
  pcp_sched_federation_release(f);

  pcp_sched_federation_options_t options;
  pcp_sched_federation_options_initialize(&options);
  options.heartbeat_interval_ns = INTERVAL;
  options.bug_accept_stale = true;
  EXPECT_OK(pcp_sched_federation_create(&options, pcp_allocator_system(), &f));
  connect1(f, "gw", 2, 0);
  EXPECT_OK(pcp_sched_federation_place(f, &sel, 100 * INTERVAL, &p));
  pcp_sched_federation_release(f);

  options.heartbeat_interval_ns = 0;
  EXPECT_CODE(pcp_sched_federation_create(&options, pcp_allocator_system(), &f),
              PCP_STATUS_INVALID_ARGUMENT);
  assert_null(f);
}

// allocation failures at every point of a connect leave the registry as it
// was and leak nothing
static void test_connect_oom_sweep(void** state) {
  (void)state;
  for (int64_t fail_at = 0; fail_at < 200; ++fail_at) {
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_system(), fail_at, false,
                                     &failing);
    pcp_sched_federation_options_t options;
    pcp_sched_federation_options_initialize(&options);
    pcp_sched_federation_t* f = NULL;
    pcp_status_t st = pcp_sched_federation_create(
        &options, pcp_allocator_failing(&failing), &f);
    if (!pcp_status_is_ok(st)) {
      pcp_status_ignore(st);
      continue;
    }
    pcp_sched_federation_service_t s = training("train", 2);
    pcp_sched_federation_connect_t r = request("gw", &s, 1);
    st = pcp_sched_federation_connect(f, &r, 0, 0, NULL);
    uint32_t count = pcp_sched_federation_gateway_count(f);
    assert_int_equal(count, pcp_status_is_ok(st) ? 1 : 0);
    pcp_status_ignore(st);
    pcp_sched_federation_release(f);
    if (failing.failure_count == 0) {
      return;  // every allocation of the sequence has been failed once
    }
  }
  fail_msg("the sweep did not reach the end of the connect");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_upsert),
      cmocka_unit_test(test_count_normalisation),
      cmocka_unit_test(test_connect_validation),
      cmocka_unit_test(test_staleness_boundary),
      cmocka_unit_test(test_restore),
      cmocka_unit_test(test_workers_required_filters),
      cmocka_unit_test(test_ranking),
      cmocka_unit_test(test_selector_fields),
      cmocka_unit_test(test_bad_selectors),
      cmocka_unit_test(test_placement_check_and_bug_option),
      cmocka_unit_test(test_connect_oom_sweep),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
