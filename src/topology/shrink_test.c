// SPDX-License-Identifier: Apache-2.0
//
// Shrinking, replay fixtures and review artifacts (reference s.6,
// shrink.zig and the data-model-free parts of reporting.zig).

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <string.h>

#include <jansson.h>

#include "topology/protocols_impl.h"

static pcp_topology_event_t ev(pcp_topology_event_tag_t tag, uint16_t actor,
                               uint16_t peer, uint32_t message_id) {
  pcp_topology_event_t e = {(uint8_t)tag, actor, peer, message_id};
  return e;
}

// The failure to keep: the two-node simulator rejects the schedule.
static bool sim_fails(void* user_data, uint64_t seed,
                      const pcp_topology_event_t* events, size_t count) {
  (void)user_data;
  pcp_topology_sim_t sim;
  pcp_topology_sim_initialize(seed, &sim);
  for (size_t i = 0; i < count; ++i) {
    if (!pcp_topology_sim_step(&sim, events[i]))
      return true;
  }
  return false;
}

// event deletion shrinking keeps the minimal replayable failure
static void test_event_deletion_shrinking(void** state) {
  (void)state;
  pcp_topology_event_t events[] = {
      ev(PCP_TOPOLOGY_EVENT_TIMEOUT, 0, PCP_TOPOLOGY_NO_NODE, 0),
      ev(PCP_TOPOLOGY_EVENT_HEARTBEAT, 1, 0, 0),
      ev(PCP_TOPOLOGY_EVENT_DELIVER, 1, 0, 1),
      ev(PCP_TOPOLOGY_EVENT_SEND, 0, 1, 1),
  };
  pcp_topology_shrink_result_t result;
  PCP_CHECK_OK(pcp_topology_events_shrink(pcp_allocator_system(), 777, events,
                                          4, sim_fails, NULL, &result));
  assert_int_equal(result.seed, 0);
  assert_int_equal(result.event_count, 1);
  assert_int_equal(result.events[0].tag, PCP_TOPOLOGY_EVENT_DELIVER);
  assert_int_equal(result.deleted, 3);
  // The shrunk trace still replays to the failure.
  assert_true(sim_fails(NULL, result.seed, result.events, result.event_count));
  pcp_topology_shrink_result_deinitialize(pcp_allocator_system(), &result);

  pcp_topology_event_t ok[] = {
      ev(PCP_TOPOLOGY_EVENT_TIMEOUT, 0, PCP_TOPOLOGY_NO_NODE, 0)};
  assert_int_equal(
      pcp_status_consume_code(pcp_topology_events_shrink(
          pcp_allocator_system(), 1, ok, 1, sim_fails, NULL, &result)),
      PCP_STATUS_FAILED_PRECONDITION);
}

// A model with an injected bug: it commits a merge as soon as one valid
// participant arrived, while the rule needs |quorum|.
typedef struct quorum_ctx_t {
  const bool* valid;
  uint32_t quorum;
} quorum_ctx_t;

static bool below_quorum_commit(void* user_data, const uint32_t* retained,
                                size_t count) {
  const quorum_ctx_t* ctx = (const quorum_ctx_t*)user_data;
  uint32_t valid = 0;
  for (size_t i = 0; i < count; ++i) valid += ctx->valid[retained[i]];
  bool buggy_commit = valid >= 1;
  return buggy_commit && valid < ctx->quorum;
}

// participant shrinking minimizes a deliberately injected below quorum bug
static void test_participant_shrinking_below_quorum(void** state) {
  (void)state;
  const bool valid[] = {true, false, false, false};
  quorum_ctx_t ctx = {valid, 2};
  uint32_t* retained = NULL;
  size_t count = 0;
  PCP_CHECK_OK(pcp_topology_indices_shrink(
      pcp_allocator_system(), 4, below_quorum_commit, &ctx, &retained, &count));
  assert_int_equal(count, 1);
  assert_int_equal(4 - count, 3);
  assert_int_equal(retained[0], 0);
  free(retained);
}

static bool duplicate_worker(void* user_data, const uint32_t* retained,
                             size_t count) {
  const uint32_t* workers = (const uint32_t*)user_data;
  for (size_t i = 0; i < count; ++i) {
    for (size_t j = i + 1; j < count; ++j) {
      if (workers[retained[i]] == workers[retained[j]])
        return true;
    }
  }
  return false;
}

// participant shrinking minimizes a duplicate reservation counterexample
static void test_participant_shrinking_duplicate_reservation(void** state) {
  (void)state;
  const uint32_t workers[] = {7, 8, 7, 9};
  uint32_t* retained = NULL;
  size_t count = 0;
  PCP_CHECK_OK(pcp_topology_indices_shrink(pcp_allocator_system(), 4,
                                           duplicate_worker, (void*)workers,
                                           &retained, &count));
  assert_int_equal(count, 2);
  assert_int_equal(retained[0], 0);
  assert_int_equal(retained[1], 2);
  free(retained);
}

static bool failing_window_present(void* user_data, const uint32_t* retained,
                                   size_t count) {
  const bool* failing = (const bool*)user_data;
  for (size_t i = 0; i < count; ++i) {
    if (failing[retained[i]])
      return true;
  }
  return false;
}

// window shrinking keeps only the failing window
static void test_window_shrinking(void** state) {
  (void)state;
  const bool failing[] = {false, false, true, false};
  uint32_t* retained = NULL;
  size_t count = 0;
  PCP_CHECK_OK(pcp_topology_indices_shrink(pcp_allocator_system(), 4,
                                           failing_window_present,
                                           (void*)failing, &retained, &count));
  assert_int_equal(count, 1);
  assert_int_equal(retained[0], 2);
  free(retained);
}

// counterexample report includes topology decision and replay fixture fields
static void test_counterexample_report_fields(void** state) {
  (void)state;
  pcp_topology_event_t events[] = {
      ev(PCP_TOPOLOGY_EVENT_DELIVER, 1, 0, 1),
      ev(PCP_TOPOLOGY_EVENT_TIMEOUT, 0, PCP_TOPOLOGY_NO_NODE, 0)};
  pcp_topology_counterexample_t report = {
      "{gateway.0:input.0, worker.0:input.1}",
      "{gateway.0:protocol.1, worker.0:protocol.0}",
      "{gateway.0:output.1, worker.0:output.0}",
      "decision_outside_task_carrier",
      0,
      events,
      2,
  };
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  PCP_CHECK_OK(pcp_topology_counterexample_format(&report, &b));
  const char* text = pcp_string_builder_cstring(&b);
  assert_non_null(strstr(text, "topology simulator counterexample\n"));
  assert_non_null(strstr(text, "input_simplex: {gateway.0:input.0"));
  assert_non_null(strstr(text, "final_protocol_simplex: "));
  assert_non_null(strstr(text, "output_decision: "));
  assert_non_null(strstr(text, "violated_rule: decision_outside"));
  assert_non_null(strstr(text, "seed: 0\n"));
  assert_non_null(strstr(text, "events: 2\n0: deliver actor=1 peer=0"));

  pcp_string_builder_reset(&b);
  PCP_CHECK_OK(pcp_topology_counterexample_format_json(&report, &b));
  json_error_t error;
  json_t* root = json_loads(pcp_string_builder_cstring(&b), 0, &error);
  assert_non_null(root);
  assert_string_equal(json_string_value(json_object_get(root, "schema")),
                      "pcp.topology.replay.v1");
  json_t* events_json = json_object_get(root, "events");
  assert_int_equal(json_array_size(events_json), 2);
  json_t* first = json_array_get(events_json, 0);
  assert_string_equal(json_string_value(json_object_get(first, "tag")),
                      "deliver");
  assert_int_equal(json_integer_value(json_object_get(first, "peer")), 0);
  assert_true(
      json_is_null(json_object_get(json_array_get(events_json, 1), "peer")));
  json_decref(root);
  pcp_string_builder_deinitialize(&b);
}

static const char kSmokeReplay[] =
    "{\"schema\":\"pcp.topology.smoke_replay.v1\",\"trace_id\":\"t1\","
    "\"seed\":42,\"input\":\"request.regular\",\"output\":\"status.accepted\","
    "\"events\":[{\"tag\":\"send\",\"actor\":0,\"peer\":1,\"message_id\":10},"
    "{\"tag\":\"deliver\",\"actor\":1,\"peer\":0,\"message_id\":10}]}";

// import preserves metadata and bounds (extract/common)
static void test_smoke_replay_import(void** state) {
  (void)state;
  pcp_topology_smoke_replay_t replay;
  PCP_CHECK_OK(pcp_topology_smoke_replay_parse(
      pcp_make_cstring_view(kSmokeReplay), 8, pcp_allocator_system(), &replay));
  assert_string_equal(replay.trace_id, "t1");
  assert_string_equal(replay.input, "request.regular");
  assert_int_equal(replay.trace.seed, 42);
  assert_int_equal(replay.trace.event_count, 2);
  assert_int_equal(replay.trace.events[0].tag, PCP_TOPOLOGY_EVENT_SEND);
  assert_int_equal(replay.trace.final_snapshot.steps, 2);
  uint64_t checksum = replay.trace.final_snapshot.checksum;
  assert_int_not_equal(checksum, 0);
  pcp_topology_smoke_replay_deinitialize(&replay);
  // Same input, same checksum.
  PCP_CHECK_OK(pcp_topology_smoke_replay_parse(
      pcp_make_cstring_view(kSmokeReplay), 8, pcp_allocator_system(), &replay));
  assert_int_equal(replay.trace.final_snapshot.checksum, checksum);
  pcp_topology_smoke_replay_deinitialize(&replay);
}

// event bound overflow
static void test_smoke_replay_rejects_bad_input(void** state) {
  (void)state;
  pcp_topology_smoke_replay_t replay;
  assert_int_equal(pcp_status_consume_code(pcp_topology_smoke_replay_parse(
                       pcp_make_cstring_view(kSmokeReplay), 1,
                       pcp_allocator_system(), &replay)),
                   PCP_STATUS_RESOURCE_EXHAUSTED);
  static const char* const kBad[] = {
      "not json",
      "[]",
      "{\"schema\":\"other\"}",
      "{\"schema\":\"pcp.topology.smoke_replay.v1\",\"trace_id\":\"t\","
      "\"seed\":-1,\"input\":\"a\",\"output\":\"b\",\"events\":[]}",
      "{\"schema\":\"pcp.topology.smoke_replay.v1\",\"trace_id\":\"t\","
      "\"seed\":1,\"input\":\"a\",\"output\":\"b\",\"events\":[{\"tag\":"
      "\"send\",\"actor\":0,\"message_id\":1}]}",
      "{\"schema\":\"pcp.topology.smoke_replay.v1\",\"trace_id\":\"t\","
      "\"seed\":1,\"input\":\"a\",\"output\":\"b\",\"events\":[{\"tag\":"
      "\"fly\",\"actor\":0,\"peer\":null,\"message_id\":1}]}",
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(kBad); ++i) {
    assert_int_equal(pcp_status_consume_code(pcp_topology_smoke_replay_parse(
                         pcp_make_cstring_view(kBad[i]), 8,
                         pcp_allocator_system(), &replay)),
                     PCP_STATUS_INVALID_ARGUMENT);
  }
}

// CI summary (the signature half is in the solver tests)
static void test_artifact_summary_is_stable(void** state) {
  (void)state;
  pcp_topology_artifact_t artifacts[] = {
      {"xi.workload", true, 0xabc, true, 0xabc},
      {"delta.rda", true, 0x1, true, 0x2},
      {"xi.new", false, 0, true, 0xff},
      {"xi.old", true, 0x10, false, 0},
  };
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  PCP_CHECK_OK(pcp_topology_artifact_summary_format(artifacts, 4, &b));
  assert_string_equal(pcp_string_builder_cstring(&b),
                      "pcp topology artifact summary: 4 item(s)\n"
                      "- xi.workload: unchanged before=abc after=abc\n"
                      "- delta.rda: changed before=1 after=2\n"
                      "- xi.new: added after=ff\n"
                      "- xi.old: removed before=10\n");
  pcp_string_builder_deinitialize(&b);
}

// Holds when more "step" actions (kind 0) precede the first "check" action
// (kind 1) than the check's parameter: a failure that needs a particular
// number, like a stale clock.
static bool steps_beat_check(void* user_data,
                             const pcp_topology_action_t* actions,
                             size_t count) {
  (void)user_data;
  uint64_t steps = 0;
  for (size_t i = 0; i < count; ++i) {
    if (actions[i].kind == 0) {
      steps++;
    }
    if (actions[i].kind == 1) {
      return steps > actions[i].parameters[0];
    }
  }
  return false;
}

// action shrinking alternates deletion (chunks, then single actions) with
// parameter minimisation to a fixed point: deletion alone stops at 4
// actions here, the check's parameter going to 0 lets two steps go
static void test_action_shrinking_reaches_fixed_point(void** state) {
  (void)state;
  static const pcp_topology_action_t kActions[] = {
      {2, {9, 9, 9}}, {2, {1, 0, 0}}, {2, {0, 0, 0}}, {2, {4, 0, 0}},
      {0, {0, 0, 0}}, {0, {0, 0, 0}}, {0, {0, 0, 0}}, {1, {2, 0, 0}}};
  pcp_topology_action_shrink_result_t r;
  PCP_CHECK_OK(pcp_topology_actions_shrink(pcp_allocator_system(), kActions,
                                           PCP_ARRAYSIZE(kActions),
                                           steps_beat_check, NULL, &r));
  assert_int_equal(r.action_count, 2);
  assert_int_equal(r.actions[0].kind, 0);
  assert_int_equal(r.actions[1].kind, 1);
  assert_int_equal(r.actions[1].parameters[0], 0);
  assert_int_equal(r.deleted, 6);
  assert_int_equal(r.parameters_reduced, 1);
  assert_true(r.rounds >= 2);
  pcp_topology_action_shrink_result_deinitialize(pcp_allocator_system(), &r);
  // The predicate must hold on the input.
  assert_int_equal(
      pcp_status_consume_code(pcp_topology_actions_shrink(
          pcp_allocator_system(), kActions, 4, steps_beat_check, NULL, &r)),
      PCP_STATUS_FAILED_PRECONDITION);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_event_deletion_shrinking),
      cmocka_unit_test(test_participant_shrinking_below_quorum),
      cmocka_unit_test(test_participant_shrinking_duplicate_reservation),
      cmocka_unit_test(test_window_shrinking),
      cmocka_unit_test(test_action_shrinking_reaches_fixed_point),
      cmocka_unit_test(test_counterexample_report_fields),
      cmocka_unit_test(test_smoke_replay_import),
      cmocka_unit_test(test_smoke_replay_rejects_bad_input),
      cmocka_unit_test(test_artifact_summary_is_stable),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
