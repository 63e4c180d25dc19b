// SPDX-License-Identifier: Apache-2.0
//
// The checkers against known bugs: built with PCP_SIM_SEEDED_BUGS, each
// seeded bug must make some seed fail within the 1,000-seed budget of
// `make test`, with the failure the right checker reports; the failing
// seed replays identically and shrinks to a schedule that still fails.

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "sim/sim.h"

#define BUDGET 1000u

static void expect_caught(pcp_sim_bug_t bug, const char* needle) {
  assert_true(pcp_sim_seeded_bugs_available());
  for (uint64_t seed = 1; seed <= BUDGET; ++seed) {
    pcp_sim_options_t options;
    pcp_sim_options_initialize(seed, &options);
    options.bug = bug;
    pcp_sim_result_t result;
    assert_int_equal(pcp_status_consume_code(pcp_sim_run(&options, &result)),
                     PCP_STATUS_OK);
    if (!result.failed)
      continue;
    fprintf(stderr, "sim: bug %s caught by seed %llu: %s\n",
            pcp_sim_bug_name(bug), (unsigned long long)seed, result.failure);
    assert_non_null(strstr(result.failure, needle));
    // Byte-identical replay.
    pcp_sim_result_t again;
    assert_int_equal(pcp_status_consume_code(pcp_sim_run(&options, &again)),
                     PCP_STATUS_OK);
    assert_true(again.failed);
    assert_true(again.trace_hash == result.trace_hash);
    assert_string_equal(again.failure, result.failure);
    // Shrinks to no more faults than it had, and still fails.
    pcp_sim_result_t shrunk;
    bool buggify = true;
    assert_int_equal(pcp_status_consume_code(
                         pcp_sim_shrink(&options, 64, &shrunk, &buggify)),
                     PCP_STATUS_OK);
    assert_true(shrunk.failed);
    assert_true(shrunk.fault_count <= result.fault_count);
    fprintf(stderr, "sim: shrunk from %zu to %zu fault(s), buggify %d:\n",
            result.fault_count, shrunk.fault_count, (int)buggify);
    pcp_sim_faults_print(shrunk.faults, shrunk.fault_count, stderr);
    return;
  }
  fail_msg("bug %s not caught in %u seeds", pcp_sim_bug_name(bug), BUDGET);
}

static void test_cancel_leaks_lease(void** state) {
  (void)state;
  expect_caught(PCP_SIM_BUG_CANCEL_LEAKS_LEASE, "lease");
}

static void test_recovery_drops_running(void** state) {
  (void)state;
  expect_caught(PCP_SIM_BUG_RECOVERY_DROPS_RUNNING, "lost");
}

static void test_double_assign_on_reconnect(void** state) {
  (void)state;
  expect_caught(PCP_SIM_BUG_DOUBLE_ASSIGN_ON_RECONNECT, "running twice");
}

// The bug lives in fabric's own join decision (fabric_glue.c), not in the
// simulation: the simulation runs that code rather than a copy of it.
static void test_epoch_kept_on_rejoin(void** state) {
  (void)state;
  expect_caught(PCP_SIM_BUG_EPOCH_KEPT_ON_REJOIN, "lease epoch");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cancel_leaks_lease),
      cmocka_unit_test(test_recovery_drops_running),
      cmocka_unit_test(test_double_assign_on_reconnect),
      cmocka_unit_test(test_epoch_kept_on_rejoin),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
