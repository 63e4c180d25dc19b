// SPDX-License-Identifier: Apache-2.0
//
// The sans-I/O connection glue (fabric_glue.c) on its own: the join
// decision's outcomes and the action drain's order and re-entrancy guard.
// fabric_test and src/sim run it inside the endpoint and the simulation.

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "fabric/fabric.h"

#define MS INT64_C(1000000)

static const pcp_proto_timeouts_t* timeouts(void) {
  static pcp_proto_timeouts_t t;
  t = pcp_proto_timeouts_from_heartbeat(100);  // resume window 1 s
  return &t;
}

static pcp_proto_join_t join_of(const char* worker_id) {
  pcp_proto_join_t join = {
      .worker_id = worker_id,
      .backend = "cpu",
      .target = "host",
      .node_manager_id = "",
      .supervisor_id = -1,
  };
  return join;
}

static pcp_fabric_join_record_t record_known(uint64_t epoch, int64_t lost_at) {
  pcp_fabric_join_record_t r = {
      .known = true, .lease_epoch = epoch, .lost_at_ns = lost_at};
  memset(r.resume_token, 0xab, sizeof(r.resume_token));
  return r;
}

static void test_new_worker_gets_epoch_one(void** state) {
  (void)state;
  pcp_proto_join_t join = join_of("w0");
  pcp_fabric_join_record_t record = {0};
  pcp_fabric_join_decision_t d;
  pcp_fabric_join_decide(&join, &record, true, 5 * MS, timeouts(), &d);
  assert_int_equal(d.verdict, PCP_FABRIC_JOIN_ACCEPT);
  assert_true(d.new_slot);
  assert_false(d.resumed);
  assert_false(d.evict_old);
  assert_int_equal(d.lease_epoch, 1);
  assert_int_equal(d.backend, PCP_SCHED_BACKEND_CPU);
}

static void test_bad_joins_rejected(void** state) {
  (void)state;
  pcp_fabric_join_record_t record = {0};
  pcp_fabric_join_decision_t d;
  pcp_proto_join_t join = join_of("w0");
  join.backend = "abacus";
  pcp_fabric_join_decide(&join, &record, true, 0, timeouts(), &d);
  assert_int_equal(d.verdict, PCP_FABRIC_JOIN_REJECT);
  assert_int_equal(d.reject_reason, PCP_PROTO_REJECT_BAD_JOIN);
  assert_string_equal(d.message, "unknown backend");
  join = join_of("w0");
  join.device_id = -1;
  pcp_fabric_join_decide(&join, &record, true, 0, timeouts(), &d);
  assert_int_equal(d.verdict, PCP_FABRIC_JOIN_REJECT);
  assert_int_equal(d.reject_reason, PCP_PROTO_REJECT_BAD_JOIN);
  assert_non_null(strstr(d.message, "out of range"));
}

static void test_full_registry_rejects_new_ids_only(void** state) {
  (void)state;
  pcp_proto_join_t join = join_of("w9");
  pcp_fabric_join_record_t unknown = {0};
  pcp_fabric_join_decision_t d;
  pcp_fabric_join_decide(&join, &unknown, false, 0, timeouts(), &d);
  assert_int_equal(d.verdict, PCP_FABRIC_JOIN_REJECT);
  assert_int_equal(d.reject_reason, PCP_PROTO_REJECT_CAPACITY);
  assert_string_equal(d.message, "worker registry full");
  // A known id has its slot already.
  pcp_fabric_join_record_t known = record_known(3, 0);
  pcp_fabric_join_decide(&join, &known, false, 10 * 1000 * MS, timeouts(), &d);
  assert_int_equal(d.verdict, PCP_FABRIC_JOIN_ACCEPT);
  assert_int_equal(d.lease_epoch, 4);
}

static void test_live_duplicate_rejected_silent_one_evicted(void** state) {
  (void)state;
  pcp_proto_join_t join = join_of("w0");
  join.has_resume = true;
  join.lease_epoch = 2;
  memset(join.resume_token, 0xab, sizeof(join.resume_token));
  pcp_fabric_join_record_t record = record_known(2, 0);
  record.connected = true;
  record.connection_deadline_ns = 300 * MS;
  pcp_fabric_join_decision_t d;
  pcp_fabric_join_decide(&join, &record, true, 299 * MS, timeouts(), &d);
  assert_int_equal(d.verdict, PCP_FABRIC_JOIN_REJECT);
  assert_int_equal(d.reject_reason, PCP_PROTO_REJECT_DUPLICATE_WORKER);
  assert_string_equal(d.message,
                      "another live connection holds this worker id");
  // Past the deadline: evicted, and lost now, so the session resumes even
  // though the last loss (at 0) is older than the resume window.
  int64_t now = 300 * MS + timeouts()->resume_window_ns;
  record.connection_deadline_ns = 300 * MS;
  pcp_fabric_join_decide(&join, &record, true, now, timeouts(), &d);
  assert_int_equal(d.verdict, PCP_FABRIC_JOIN_ACCEPT);
  assert_true(d.evict_old);
  assert_true(d.resumed);
  assert_int_equal(d.lease_epoch, 2);
}

static void test_resume_needs_window_epoch_and_token(void** state) {
  (void)state;
  pcp_proto_join_t join = join_of("w0");
  join.has_resume = true;
  join.lease_epoch = 5;
  memset(join.resume_token, 0xab, sizeof(join.resume_token));
  pcp_fabric_join_record_t record = record_known(5, 100 * MS);
  int64_t window = timeouts()->resume_window_ns;
  pcp_fabric_join_decision_t d;
  pcp_fabric_join_decide(&join, &record, true, 100 * MS + window, timeouts(),
                         &d);
  assert_true(d.resumed);
  assert_int_equal(d.lease_epoch, 5);
  pcp_fabric_join_decide(&join, &record, true, 100 * MS + window + 1,
                         timeouts(), &d);
  assert_false(d.resumed);
  assert_int_equal(d.lease_epoch, 6);
  join.resume_token[0] ^= 1;
  pcp_fabric_join_decide(&join, &record, true, 200 * MS, timeouts(), &d);
  assert_false(d.resumed);
  assert_int_equal(d.lease_epoch, 6);
  join.resume_token[0] ^= 1;
  join.lease_epoch = 4;
  pcp_fabric_join_decide(&join, &record, true, 200 * MS, timeouts(), &d);
  assert_false(d.resumed);
  assert_int_equal(d.lease_epoch, 6);
}

static void test_sched_full_becomes_capacity_reject(void** state) {
  (void)state;
  pcp_sched_options_t options;
  pcp_sched_options_initialize(&options);
  options.max_workers = 1;
  pcp_sched_t* sched = NULL;
  assert_null(pcp_sched_create(&options, pcp_allocator_system(), &sched));
  pcp_proto_join_t a = join_of("a");
  pcp_proto_join_t b = join_of("b");
  pcp_fabric_join_record_t record = {0};
  pcp_fabric_join_decision_t d;
  pcp_fabric_join_decide(&a, &record, true, 0, timeouts(), &d);
  assert_true(pcp_fabric_join_sched_enter(sched, &a, 0, &d));
  pcp_sched_event_t event = {0};
  assert_null(pcp_sched_worker_ready(sched, "a", 0, &event));
  pcp_fabric_join_decide(&b, &record, true, 0, timeouts(), &d);
  assert_false(pcp_fabric_join_sched_enter(sched, &b, 0, &d));
  assert_int_equal(d.verdict, PCP_FABRIC_JOIN_REJECT);
  assert_int_equal(d.reject_reason, PCP_PROTO_REJECT_CAPACITY);
  assert_true(d.message[0] != '\0');
  pcp_sched_release(sched);
}

typedef struct drain_log_t {
  pcp_proto_gateway_conn_t* proto;
  bool draining;
  int order[8];
  int count;
  int nested_results[8];
  int nested_count;
} drain_log_t;

static const pcp_fabric_action_handlers_t* handlers(void);

static void log_send(void* context, pcp_proto_action_t* a) {
  (void)a;
  drain_log_t* log = context;
  log->order[log->count++] = PCP_PROTO_ACTION_SEND;
  // A handler that issues a command drains again: that call must leave the
  // rest of the queue (the CLOSE) to this loop.
  log->nested_results[log->nested_count++] = pcp_fabric_conn_actions_drain(
      log->proto, &log->draining, handlers(), log);
  log->order[log->count++] = -1;  // back in the outer handler
}

static void log_close(void* context, pcp_proto_action_t* a) {
  (void)a;
  drain_log_t* log = context;
  log->order[log->count++] = PCP_PROTO_ACTION_CLOSE;
}

static const pcp_fabric_action_handlers_t* handlers(void) {
  static const pcp_fabric_action_handlers_t h = {.send = log_send,
                                                 .close = log_close};
  return &h;
}

static void test_drain_in_order_nested_call_returns(void** state) {
  (void)state;
  static const uint8_t token[] = "secret";
  pcp_proto_gateway_config_t config = {
      .limits = pcp_proto_limits_default(),
      .heartbeat_interval_ms = 100,
      .join_token = token,
      .join_token_length = sizeof(token) - 1,
  };
  drain_log_t log = {0};
  assert_null(pcp_proto_gateway_conn_create(&config, 0, pcp_allocator_system(),
                                            &log.proto));
  // Nothing queued: nothing runs, and the connection is open.
  assert_false(pcp_fabric_conn_actions_drain(log.proto, &log.draining,
                                             handlers(), &log));
  assert_int_equal(log.count, 0);
  pcp_status_t why = pcp_make_status(PCP_STATUS_INTERNAL, "test");
  assert_null(pcp_proto_gateway_conn_fail(log.proto, why, 0));
  pcp_status_ignore(why);
  // SEND (the error frame), then CLOSE: the nested drain inside the SEND's
  // handler returns false at once, and CLOSE comes after the handler.
  assert_true(pcp_fabric_conn_actions_drain(log.proto, &log.draining,
                                            handlers(), &log));
  assert_false(log.draining);
  assert_int_equal(log.nested_count, 1);
  assert_int_equal(log.nested_results[0], 0);
  assert_int_equal(log.count, 3);
  assert_int_equal(log.order[0], PCP_PROTO_ACTION_SEND);
  assert_int_equal(log.order[1], -1);
  assert_int_equal(log.order[2], PCP_PROTO_ACTION_CLOSE);
  pcp_proto_gateway_conn_release(log.proto);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_new_worker_gets_epoch_one),
      cmocka_unit_test(test_bad_joins_rejected),
      cmocka_unit_test(test_full_registry_rejects_new_ids_only),
      cmocka_unit_test(test_live_duplicate_rejected_silent_one_evicted),
      cmocka_unit_test(test_resume_needs_window_epoch_and_token),
      cmocka_unit_test(test_sched_full_becomes_capacity_reject),
      cmocka_unit_test(test_drain_in_order_nested_call_returns),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
