// SPDX-License-Identifier: Apache-2.0
//
// State-space exploration of the protocol stubs (reference s.6, extract/
// scheduling and decoupled exploration tests, same counts).

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "topology/protocols_impl.h"

#define SEEN(mask, bit) (((mask) >> (bit)) & 1u)

// scheduling exploration: exhaustive pairs and seeded runs
static void test_sched_exploration(void** state) {
  (void)state;
  pcp_topology_exploration_stats_t stats;
  pcp_topology_sched_explore_exhaustive(&stats);
  assert_int_equal(stats.checked, 121);
  assert_true(SEEN(stats.decisions_seen, PCP_TOPOLOGY_SCHED_RESERVED));
  assert_true(SEEN(stats.decisions_seen, PCP_TOPOLOGY_SCHED_QUEUED));
  assert_true(SEEN(stats.decisions_seen, PCP_TOPOLOGY_SCHED_STARTED));
  assert_true(SEEN(stats.decisions_seen, PCP_TOPOLOGY_SCHED_COMPLETED));
  assert_true(SEEN(stats.decisions_seen, PCP_TOPOLOGY_SCHED_CANCELED));
  assert_true(SEEN(stats.decisions_seen, PCP_TOPOLOGY_SCHED_REJECTED));
  assert_true(SEEN(stats.violations_seen,
                   PCP_TOPOLOGY_SCHED_VIOLATION_ASSIGNMENT_AFTER_WORKER_LOSS));
  // The scheduling oracle holds after every explored step.
  assert_int_equal(stats.invariant_failures, 0);

  pcp_topology_exploration_stats_t a, b;
  pcp_topology_sched_explore_seeded(0x5151, 64, 4, &a);
  pcp_topology_sched_explore_seeded(0x5151, 64, 4, &b);
  assert_int_equal(a.checked, 64);
  assert_int_equal(a.fingerprint, b.fingerprint);
  assert_int_equal(a.failed, b.failed);
  assert_true(a.failed > 0);
  assert_int_equal(a.seed, 0x5151);
  assert_int_equal(a.invariant_failures, 0);
}

// decoupled exploration: exhaustive depth 3 and seeded runs
static void test_decoupled_exploration(void** state) {
  (void)state;
  pcp_topology_exploration_stats_t stats;
  PCP_CHECK_OK(pcp_topology_decoupled_explore_exhaustive(3, &stats));
  assert_int_equal(stats.checked, 1331);
  assert_true(SEEN(stats.decisions_seen, PCP_TOPOLOGY_DECOUPLED_ASSIGNED));
  assert_true(
      SEEN(stats.decisions_seen, PCP_TOPOLOGY_DECOUPLED_UPDATE_ACCEPTED));
  assert_true(
      SEEN(stats.decisions_seen, PCP_TOPOLOGY_DECOUPLED_UPDATE_REJECTED));
  assert_true(SEEN(stats.decisions_seen, PCP_TOPOLOGY_DECOUPLED_CANCELED));
  assert_true(SEEN(stats.decisions_seen, PCP_TOPOLOGY_DECOUPLED_RESUMABLE));
  assert_true(SEEN(stats.violations_seen,
                   PCP_TOPOLOGY_DECOUPLED_VIOLATION_UNASSIGNED_WORKER));
  assert_true(SEEN(stats.violations_seen,
                   PCP_TOPOLOGY_DECOUPLED_VIOLATION_POST_CANCEL_UPDATE));
  assert_int_equal(pcp_status_consume_code(
                       pcp_topology_decoupled_explore_exhaustive(6, &stats)),
                   PCP_STATUS_INVALID_ARGUMENT);

  pcp_topology_exploration_stats_t a, b;
  PCP_CHECK_OK(pcp_topology_decoupled_explore_seeded(0xdec0, 64, 18, &a));
  PCP_CHECK_OK(pcp_topology_decoupled_explore_seeded(0xdec0, 64, 18, &b));
  assert_int_equal(a.checked, 64);
  assert_int_equal(a.fingerprint, b.fingerprint);
  assert_true(a.failed > 0);
  assert_true(SEEN(a.violations_seen,
                   PCP_TOPOLOGY_DECOUPLED_VIOLATION_UNASSIGNED_WORKER));
}

// extract/scheduling injected bugs: found by seeded exploration (0x5151,
// schedules of 8 primitives) with the bug injected, then shrunk:
// duplicate worker reservation <= 2 events, assignment after worker loss 3,
// cancellation cleanup leak 2; the correct scheduler passes the shrunk
// schedules
static void test_sched_injected_bugs(void** state) {
  (void)state;
  static const size_t kExpected[PCP_TOPOLOGY_SCHED_BUG_COUNT_] = {2, 3, 2};
  for (uint32_t b = 0; b < PCP_TOPOLOGY_SCHED_BUG_COUNT_; ++b) {
    pcp_topology_sched_bug_t bug = (pcp_topology_sched_bug_t)b;
    pcp_topology_action_shrink_result_t r;
    PCP_CHECK_OK(pcp_topology_sched_injected_bug_find(
        bug, 0x5151, 256, 8, pcp_allocator_system(), &r));
    assert_true(r.action_count <= kExpected[b]);
    assert_int_equal(r.action_count, kExpected[b]);
    assert_true(
        pcp_topology_sched_bug_exposed(bug, true, r.actions, r.action_count));
    assert_false(
        pcp_topology_sched_bug_exposed(bug, false, r.actions, r.action_count));
    assert_int_equal(r.actions[0].kind, PCP_TOPOLOGY_SCHED_ACTION_RESERVE);
    pcp_topology_action_shrink_result_deinitialize(pcp_allocator_system(), &r);
  }
  assert_string_equal(pcp_topology_sched_bug_name(
                          PCP_TOPOLOGY_SCHED_BUG_CANCELLATION_CLEANUP_LEAK),
                      "cancellation_cleanup_leak");
}

// extract/decoupled injected bugs: found by seeded exploration (0xdec0,
// 4096 schedules of 10 actions) with the bug injected, then shrunk: a
// below-quorum commit to <= 4 events, a stale vector clock accepted to <= 4;
// the correct window passes the shrunk schedules
static void test_decoupled_injected_bugs(void** state) {
  (void)state;
  // The stale clock's bound was 3 for the hand-written window, which kept a
  // below-quorum window's updates across a timeout. The real round machine
  // (decoupled_model.c) ends such a round TIMED_OUT and the step is skipped,
  // as the service skips it, so "assign, submit c1, timeout, submit c0" now
  // exposes the bug (a fresh round takes the stale update) and is the first
  // schedule the seeded search finds; the shrinker keeps its 4 actions (the
  // 3-action "assign, step, submit c0" is not a sub-sequence of it).
  static const size_t kBound[PCP_TOPOLOGY_DECOUPLED_BUG_COUNT_] = {4, 4};
  for (uint32_t b = 0; b < PCP_TOPOLOGY_DECOUPLED_BUG_COUNT_; ++b) {
    pcp_topology_decoupled_bug_t bug = (pcp_topology_decoupled_bug_t)b;
    pcp_topology_action_shrink_result_t r;
    PCP_CHECK_OK(pcp_topology_decoupled_injected_bug_find(
        bug, 0xdec0, 4096, 10, pcp_allocator_system(), &r));
    assert_true(r.action_count <= kBound[b]);
    assert_true(pcp_topology_decoupled_bug_exposed(bug, true, r.actions,
                                                   r.action_count));
    assert_false(pcp_topology_decoupled_bug_exposed(bug, false, r.actions,
                                                    r.action_count));
    pcp_topology_action_shrink_result_deinitialize(pcp_allocator_system(), &r);
  }
  assert_string_equal(
      pcp_topology_decoupled_bug_name(
          PCP_TOPOLOGY_DECOUPLED_BUG_STALE_VECTOR_CLOCK_ACCEPTANCE),
      "stale_vector_clock_acceptance");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sched_exploration),
      cmocka_unit_test(test_decoupled_exploration),
      cmocka_unit_test(test_sched_injected_bugs),
      cmocka_unit_test(test_decoupled_injected_bugs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
