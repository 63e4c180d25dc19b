// SPDX-License-Identifier: Apache-2.0
//
// Traces, events and the two-node simulator (reference s.6, trace.zig and
// sim.zig tests, same expected numbers).

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <string.h>

#include "topology/protocols_impl.h"

static pcp_topology_event_t ev(pcp_topology_event_tag_t tag, uint16_t actor,
                               uint16_t peer, uint32_t message_id) {
  pcp_topology_event_t e = {(uint8_t)tag, actor, peer, message_id};
  return e;
}

// event text format is stable
static void test_event_text_format_is_stable(void** state) {
  (void)state;
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  PCP_CHECK_OK(
      pcp_topology_event_format(7, ev(PCP_TOPOLOGY_EVENT_SEND, 1, 2, 42), &b));
  assert_string_equal(pcp_string_builder_cstring(&b),
                      "7: send actor=1 peer=2 message=42\n");
  pcp_string_builder_reset(&b);
  PCP_CHECK_OK(pcp_topology_event_format(
      0, ev(PCP_TOPOLOGY_EVENT_TIMEOUT, 0, PCP_TOPOLOGY_NO_NODE, 0), &b));
  assert_string_equal(pcp_string_builder_cstring(&b),
                      "0: timeout actor=0 peer=- message=0\n");
  pcp_string_builder_deinitialize(&b);
}

// owned trace text includes replay fields
static void test_owned_trace_text_includes_replay_fields(void** state) {
  (void)state;
  pcp_topology_event_t events[] = {ev(PCP_TOPOLOGY_EVENT_SEND, 0, 1, 1)};
  pcp_topology_trace_t trace;
  PCP_CHECK_OK(
      pcp_topology_sim_run(99, events, 1, pcp_allocator_system(), &trace));
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  PCP_CHECK_OK(pcp_topology_trace_format(&trace, &b));
  const char* text = pcp_string_builder_cstring(&b);
  assert_non_null(strstr(text, "topology-simulator-trace v1 seed=99 events=1"));
  assert_non_null(strstr(text, "final steps=1 nodes=2"));

  // The text is also the replay fixture: it parses back to the same trace.
  pcp_topology_trace_t parsed;
  PCP_CHECK_OK(pcp_topology_trace_parse(pcp_make_cstring_view(text),
                                        pcp_allocator_system(), &parsed));
  assert_int_equal(parsed.seed, 99);
  assert_int_equal(parsed.event_count, 1);
  assert_int_equal(pcp_topology_event_hash(parsed.events[0]),
                   pcp_topology_event_hash(events[0]));
  assert_int_equal(pcp_topology_snapshot_hash(&parsed.final_snapshot),
                   pcp_topology_snapshot_hash(&trace.final_snapshot));
  pcp_topology_trace_deinitialize(&parsed);
  pcp_topology_trace_deinitialize(&trace);
  pcp_string_builder_deinitialize(&b);
}

static void test_trace_parse_rejects_malformed_text(void** state) {
  (void)state;
  static const char* const kBad[] = {
      "",
      "hello\n",
      "topology-simulator-trace v1 seed=1 events=1\nfinal steps=0 nodes=2 "
      "online_mask=3 pending=0 delivered=0 checksum=1 failure=none\n",
      "topology-simulator-trace v1 seed=1 events=1\n0: fly actor=0 peer=- "
      "message=0\n",
      "topology-simulator-trace v1 seed=x events=0\n",
      "topology-simulator-trace v1 seed=1 events=1\n0: send actor=0 peer=1 "
      "message=1\n",
      "topology-simulator-trace v1 seed=1 events=0\nfinal steps=0 nodes=2 "
      "online_mask=3 pending=0 delivered=0 checksum=1 failure=bogus\n",
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(kBad); ++i) {
    pcp_topology_trace_t trace;
    pcp_status_t status = pcp_topology_trace_parse(
        pcp_make_cstring_view(kBad[i]), pcp_allocator_system(), &trace);
    assert_int_equal(pcp_status_consume_code(status),
                     PCP_STATUS_INVALID_ARGUMENT);
  }
}

// snapshot hash is stable for canonical state comparison
static void test_snapshot_hash_is_stable(void** state) {
  (void)state;
  pcp_topology_snapshot_t a = {3, 2, 3, 0, 1, 0x1234, 0};
  pcp_topology_snapshot_t b = a;
  assert_int_equal(pcp_topology_snapshot_hash(&a),
                   pcp_topology_snapshot_hash(&b));
  b.online_mask = 1;
  assert_int_not_equal(pcp_topology_snapshot_hash(&a),
                       pcp_topology_snapshot_hash(&b));
}

// two node valid trace replays to the same final snapshot
static void test_two_node_valid_trace_replays(void** state) {
  (void)state;
  pcp_topology_event_t events[] = {ev(PCP_TOPOLOGY_EVENT_SEND, 0, 1, 1),
                                   ev(PCP_TOPOLOGY_EVENT_DELIVER, 1, 0, 1)};
  pcp_topology_trace_t first, second;
  PCP_CHECK_OK(
      pcp_topology_sim_run(1234, events, 2, pcp_allocator_system(), &first));
  PCP_CHECK_OK(
      pcp_topology_sim_run(1234, events, 2, pcp_allocator_system(), &second));
  assert_int_equal(first.final_snapshot.failure, PCP_TOPOLOGY_FAILURE_NONE);
  assert_int_equal(first.final_snapshot.delivered, 1);
  assert_int_equal(first.final_snapshot.pending, 0);
  assert_int_equal(pcp_topology_snapshot_hash(&first.final_snapshot),
                   pcp_topology_snapshot_hash(&second.final_snapshot));
  pcp_topology_trace_deinitialize(&first);
  pcp_topology_trace_deinitialize(&second);
}

// seeded random two node traces are deterministic
static void test_seeded_random_traces_are_deterministic(void** state) {
  (void)state;
  pcp_topology_trace_t a, b;
  PCP_CHECK_OK(
      pcp_topology_sim_random_trace(777, 5, false, pcp_allocator_system(), &a));
  PCP_CHECK_OK(
      pcp_topology_sim_random_trace(777, 5, false, pcp_allocator_system(), &b));
  assert_int_equal(a.event_count, 5);
  assert_int_equal(b.event_count, 5);
  for (size_t i = 0; i < 5; ++i) {
    assert_int_equal(pcp_topology_event_hash(a.events[i]),
                     pcp_topology_event_hash(b.events[i]));
  }
  assert_int_equal(pcp_topology_snapshot_hash(&a.final_snapshot),
                   pcp_topology_snapshot_hash(&b.final_snapshot));
  pcp_topology_trace_deinitialize(&a);
  pcp_topology_trace_deinitialize(&b);
}

// exhaustive two node schedules produce replayable failure traces
static void test_exhaustive_two_node_schedules_replayable(void** state) {
  (void)state;
  pcp_topology_sim_exploration_t result;
  PCP_CHECK_OK(pcp_topology_sim_explore_exhaustive(
      2026, 2, true, pcp_allocator_system(), &result));
  assert_int_equal(result.checked, 9);
  assert_true(result.has_failure);
  const pcp_topology_trace_t* failing = &result.first_failure;
  pcp_topology_trace_t replay;
  PCP_CHECK_OK(pcp_topology_sim_run(failing->seed, failing->events,
                                    failing->event_count,
                                    pcp_allocator_system(), &replay));
  assert_int_equal(pcp_topology_snapshot_hash(&replay.final_snapshot),
                   pcp_topology_snapshot_hash(&failing->final_snapshot));
  assert_int_not_equal(replay.final_snapshot.failure,
                       PCP_TOPOLOGY_FAILURE_NONE);
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  PCP_CHECK_OK(pcp_topology_trace_format(failing, &b));
  assert_non_null(strstr(pcp_string_builder_cstring(&b), "seed=2026"));
  assert_non_null(strstr(pcp_string_builder_cstring(&b), "failure="));
  pcp_string_builder_deinitialize(&b);
  pcp_topology_trace_deinitialize(&replay);
  pcp_topology_sim_exploration_deinitialize(&result);
}

// exhaustive control schedules stay inside the valid state space
static void test_exhaustive_control_schedules_stay_valid(void** state) {
  (void)state;
  pcp_topology_sim_exploration_t result;
  PCP_CHECK_OK(pcp_topology_sim_explore_exhaustive(
      2026, 3, false, pcp_allocator_system(), &result));
  assert_int_equal(result.checked, 27);
  assert_false(result.has_failure);
  assert_int_equal(result.failed, 0);
  pcp_topology_sim_exploration_deinitialize(&result);
  assert_int_equal(pcp_status_consume_code(pcp_topology_sim_explore_exhaustive(
                       1, PCP_TOPOLOGY_SIM_MAX_DEPTH + 1, false,
                       pcp_allocator_system(), &result)),
                   PCP_STATUS_INVALID_ARGUMENT);
}

static void test_sim_failures_are_sticky(void** state) {
  (void)state;
  pcp_topology_sim_t sim;
  pcp_topology_sim_initialize(5, &sim);
  assert_false(pcp_topology_sim_step(
      &sim, ev(PCP_TOPOLOGY_EVENT_TIMEOUT, 2, PCP_TOPOLOGY_NO_NODE, 0)));
  assert_int_equal(sim.failure, PCP_TOPOLOGY_FAILURE_INVALID_ACTOR);
  assert_false(pcp_topology_sim_step(
      &sim, ev(PCP_TOPOLOGY_EVENT_TIMEOUT, 0, PCP_TOPOLOGY_NO_NODE, 0)));
  assert_int_equal(sim.steps, 1);

  pcp_topology_sim_initialize(5, &sim);
  assert_true(pcp_topology_sim_step(
      &sim, ev(PCP_TOPOLOGY_EVENT_CRASH, 1, PCP_TOPOLOGY_NO_NODE, 0)));
  assert_false(
      pcp_topology_sim_step(&sim, ev(PCP_TOPOLOGY_EVENT_HEARTBEAT, 1, 0, 0)));
  assert_int_equal(sim.failure, PCP_TOPOLOGY_FAILURE_EVENT_ON_CRASHED_NODE);

  pcp_topology_sim_initialize(5, &sim);
  assert_true(
      pcp_topology_sim_step(&sim, ev(PCP_TOPOLOGY_EVENT_SEND, 0, 1, 1)));
  assert_false(
      pcp_topology_sim_step(&sim, ev(PCP_TOPOLOGY_EVENT_SEND, 0, 1, 1)));
  assert_int_equal(sim.failure, PCP_TOPOLOGY_FAILURE_DUPLICATE_SEND);
}

static void test_partial_order_rule(void** state) {
  (void)state;
  pcp_topology_event_t lsc0 =
      ev(PCP_TOPOLOGY_EVENT_LOCAL_STEP_COMPLETE, 0, PCP_TOPOLOGY_NO_NODE, 0);
  pcp_topology_event_t lsc1 =
      ev(PCP_TOPOLOGY_EVENT_LOCAL_STEP_COMPLETE, 1, PCP_TOPOLOGY_NO_NODE, 0);
  assert_true(pcp_topology_events_independent(lsc0, lsc1));
  assert_true(pcp_topology_partial_order_allows(&lsc0, 1, lsc1));
  assert_false(pcp_topology_partial_order_allows(&lsc1, 1, lsc0));
  assert_true(pcp_topology_partial_order_allows(NULL, 0, lsc0));
  // Sharing a message id makes events dependent: both orders stay.
  pcp_topology_event_t send = ev(PCP_TOPOLOGY_EVENT_SEND, 0, 1, 1);
  pcp_topology_event_t deliver = ev(PCP_TOPOLOGY_EVENT_DELIVER, 1, 0, 1);
  assert_false(pcp_topology_events_independent(send, deliver));
  assert_true(pcp_topology_partial_order_allows(&deliver, 1, send));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_event_text_format_is_stable),
      cmocka_unit_test(test_owned_trace_text_includes_replay_fields),
      cmocka_unit_test(test_trace_parse_rejects_malformed_text),
      cmocka_unit_test(test_snapshot_hash_is_stable),
      cmocka_unit_test(test_two_node_valid_trace_replays),
      cmocka_unit_test(test_seeded_random_traces_are_deterministic),
      cmocka_unit_test(test_exhaustive_two_node_schedules_replayable),
      cmocka_unit_test(test_exhaustive_control_schedules_stay_valid),
      cmocka_unit_test(test_sim_failures_are_sticky),
      cmocka_unit_test(test_partial_order_rule),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
