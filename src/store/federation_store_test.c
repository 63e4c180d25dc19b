// SPDX-License-Identifier: Apache-2.0
// Unit tests for the federation hub tables (store/federation.c): every call,
// and what a reopen (the hub's restart) must keep.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "store/store.h"

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

typedef struct fixture_t {
  char dir[256];
  pcp_clock_manual_t clock;
  pcp_store_t* store;
} fixture_t;

static pcp_store_t* open_store(fixture_t* f) {
  pcp_store_options_t options;
  pcp_store_options_initialize(&options);
  options.state_dir = f->dir;
  options.clock = pcp_clock_manual(&f->clock);
  options.sync_mode = PCP_STORE_SYNC_NORMAL;
  pcp_store_t* store = NULL;
  EXPECT_OK(pcp_store_create(&options, pcp_allocator_system(), &store));
  return store;
}

static void reopen(fixture_t* f) {
  pcp_store_release(f->store);
  f->store = open_store(f);
}

static int setup(void** state) {
  fixture_t* f = calloc(1, sizeof(*f));
  const char* tmp = getenv("TMPDIR");
  snprintf(f->dir, sizeof(f->dir), "%s/pcp-fedstore-XXXXXX",
           tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(f->dir)) {
    free(f);
    return -1;
  }
  f->clock.now_ns = 1;
  f->clock.wall_ns = 1700000000000000000;
  f->store = open_store(f);
  *state = f;
  return 0;
}

static int teardown(void** state) {
  fixture_t* f = *state;
  EXPECT_OK(pcp_store_integrity_check(f->store));
  pcp_store_release(f->store);
  char command[512];
  snprintf(command, sizeof(command), "rm -rf '%s'", f->dir);
  int rc = system(command);
  free(f);
  return rc == 0 ? 0 : -1;
}

// registrations: upsert, list in registration order, delete, survive a
// reopen
static void test_gateways(void** state) {
  fixture_t* f = *state;
  json_t* reg = json_pack("{s:s,s:i}", "lab_id", "lab", "n", 1);
  EXPECT_OK(pcp_store_federation_gateway_put(f->store, "gw-b", reg, 10, 20));
  EXPECT_OK(pcp_store_federation_gateway_put(f->store, "gw-a", reg, 11, 21));
  json_object_set_new(reg, "n", json_integer(2));
  EXPECT_OK(pcp_store_federation_gateway_put(f->store, "gw-b", reg, 10, 30));
  EXPECT_CODE(pcp_store_federation_gateway_put(f->store, "bad id", reg, 1, 1),
              PCP_STATUS_INVALID_ARGUMENT);
  json_t* array = json_array();
  EXPECT_CODE(pcp_store_federation_gateway_put(f->store, "gw-c", array, 1, 1),
              PCP_STATUS_INVALID_ARGUMENT);
  json_decref(array);
  json_decref(reg);
  reopen(f);
  pcp_store_federation_gateway_list_t list = {.allocator =
                                                  pcp_allocator_system()};
  EXPECT_OK(pcp_store_federation_gateway_list(f->store, &list));
  // First registered first: gw-b (connected at 10) before gw-a (11).
  assert_int_equal(list.count, 2);
  assert_string_equal(list.items[0].gateway_id, "gw-b");
  assert_string_equal(list.items[1].gateway_id, "gw-a");
  assert_int_equal(list.items[0].last_seen_ns, 30);
  assert_int_equal(
      json_integer_value(json_object_get(list.items[0].registration, "n")), 2);
  pcp_store_federation_gateway_list_deinitialize(&list);
  EXPECT_OK(pcp_store_federation_gateway_delete(f->store, "gw-a"));
  EXPECT_CODE(pcp_store_federation_gateway_delete(f->store, "gw-a"),
              PCP_STATUS_NOT_FOUND);
  EXPECT_OK(pcp_store_federation_gateway_list(f->store, &list));
  assert_int_equal(list.count, 1);
  pcp_store_federation_gateway_list_deinitialize(&list);
}

// global jobs: numbers from 1, never reused across a reopen, updates keep
// unset fields, counts per state
static void test_global_jobs(void** state) {
  fixture_t* f = *state;
  json_t* assignment = json_pack("{s:s}", "gateway_id", "gw-a");
  int64_t n1 = 0, n2 = 0, n3 = 0;
  EXPECT_OK(pcp_store_global_job_create(f->store, "training", assignment, &n1));
  EXPECT_OK(pcp_store_global_job_create(f->store, "rl", assignment, &n2));
  assert_int_equal(n1, 1);
  assert_int_equal(n2, 2);
  EXPECT_CODE(pcp_store_global_job_create(f->store, "batch", assignment, &n3),
              PCP_STATUS_INVALID_ARGUMENT);
  json_t* child = json_pack("{s:s}", "status", "queued");
  EXPECT_OK(pcp_store_global_job_update(f->store, n1, "submitted", "job-7",
                                        child, NULL));
  EXPECT_OK(pcp_store_global_job_update(f->store, n2, "rejected", NULL, NULL,
                                        "gateway said 409"));
  EXPECT_CODE(
      pcp_store_global_job_update(f->store, n1, "done", NULL, NULL, NULL),
      PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_CODE(
      pcp_store_global_job_update(f->store, 99, "submitted", NULL, NULL, NULL),
      PCP_STATUS_NOT_FOUND);
  // A state change alone keeps the child id and answer.
  EXPECT_OK(pcp_store_global_job_update(f->store, n1, "cancelling", NULL, NULL,
                                        NULL));
  json_decref(child);
  reopen(f);
  EXPECT_OK(pcp_store_global_job_create(f->store, "training", assignment, &n3));
  assert_int_equal(n3, 3);
  json_decref(assignment);
  pcp_store_global_job_t job;
  EXPECT_OK(pcp_store_global_job_get(f->store, n1, &job));
  assert_string_equal(job.kind, "training");
  assert_string_equal(job.state, "cancelling");
  assert_string_equal(job.child_job_id, "job-7");
  assert_string_equal(json_string_value(json_object_get(job.child, "status")),
                      "queued");
  assert_string_equal(
      json_string_value(json_object_get(job.assignment, "gateway_id")), "gw-a");
  pcp_store_global_job_deinitialize(&job);
  EXPECT_CODE(pcp_store_global_job_get(f->store, 42, &job),
              PCP_STATUS_NOT_FOUND);
  pcp_store_global_job_list_t list = {.allocator = pcp_allocator_system()};
  EXPECT_OK(pcp_store_global_job_list(f->store, 1, 0, &list));
  assert_int_equal(list.count, 2);
  assert_int_equal(list.items[0].number, 2);
  assert_string_equal(list.items[0].error, "gateway said 409");
  assert_string_equal(list.items[1].state, "placing");
  pcp_store_global_job_list_deinitialize(&list);
  int64_t counts[PCP_STORE_GLOBAL_JOB_STATE_COUNT];
  EXPECT_OK(pcp_store_global_job_counts(f->store, counts));
  assert_int_equal(counts[0], 1);  // placing
  assert_int_equal(counts[1], 0);  // submitted
  assert_int_equal(counts[2], 1);  // rejected
  assert_int_equal(counts[3], 1);  // cancelling
}

// acknowledged sequences never go down and survive a reopen
static void test_acks(void** state) {
  fixture_t* f = *state;
  int64_t seq = -1;
  EXPECT_OK(pcp_store_federation_ack_get(f->store, "gw-a", &seq));
  assert_int_equal(seq, 0);
  EXPECT_OK(pcp_store_federation_ack_raise(f->store, "gw-a", 7));
  EXPECT_OK(pcp_store_federation_ack_raise(f->store, "gw-a", 3));
  EXPECT_CODE(pcp_store_federation_ack_raise(f->store, "gw-a", -1),
              PCP_STATUS_INVALID_ARGUMENT);
  reopen(f);
  EXPECT_OK(pcp_store_federation_ack_get(f->store, "gw-a", &seq));
  assert_int_equal(seq, 7);
}

// policies: upsert and list as one object
static void test_policies(void** state) {
  fixture_t* f = *state;
  json_t* p = json_pack("{s:s}", "default_visibility", "global");
  EXPECT_OK(pcp_store_federation_policy_put(f->store, "ns-b", p));
  EXPECT_OK(pcp_store_federation_policy_put(f->store, "ns-a", p));
  json_object_set_new(p, "default_visibility", json_string("local"));
  EXPECT_OK(pcp_store_federation_policy_put(f->store, "ns-b", p));
  json_decref(p);
  reopen(f);
  json_t* all = NULL;
  EXPECT_OK(pcp_store_federation_policy_list(f->store, &all));
  assert_int_equal(json_object_size(all), 2);
  assert_string_equal(json_string_value(json_object_get(
                          json_object_get(all, "ns-b"), "default_visibility")),
                      "local");
  json_decref(all);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_gateways, setup, teardown),
      cmocka_unit_test_setup_teardown(test_global_jobs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_acks, setup, teardown),
      cmocka_unit_test_setup_teardown(test_policies, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
