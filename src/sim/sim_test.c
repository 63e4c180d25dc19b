// SPDX-License-Identifier: Apache-2.0
//
// The deterministic simulation under `make test`: 1,000 seeds of the default
// scenario (faults and buggify on) pass every checker; a seed replays byte
// for byte; the scenario really exercises restarts, crashes and buggify.
// PCP_SIM_SEEDS=N changes the seed count, PCP_SIM_FIRST_SEED the first.

#include "sim/sim.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* value = getenv(name);
  return value && *value ? strtoull(value, NULL, 10) : fallback;
}

// On a failure: the seed, the shrunk fault schedule and its trace.
static void report_failure(const pcp_sim_options_t* options,
                           const pcp_sim_result_t* result) {
  fprintf(stderr, "sim: seed %llu FAILED: %s\n",
          (unsigned long long)options->seed, result->failure);
  pcp_sim_result_t shrunk;
  bool buggify = false;
  pcp_status_t status = pcp_sim_shrink(options, 64, &shrunk, &buggify);
  if (status) {
    pcp_status_ignore(status);
    return;
  }
  fprintf(stderr, "sim: shrunk to %zu fault(s), buggify %d:\n",
          shrunk.fault_count, (int)buggify);
  pcp_sim_faults_print(shrunk.faults, shrunk.fault_count, stderr);
  pcp_sim_options_t replay = *options;
  replay.fault_schedule = shrunk.faults;
  replay.fault_schedule_count = shrunk.fault_count;
  replay.buggify = buggify;
  replay.trace = stderr;
  pcp_sim_result_t again;
  pcp_status_ignore(pcp_sim_run(&replay, &again));
}

static void test_seeds(void** state) {
  (void)state;
  uint64_t first = env_u64("PCP_SIM_FIRST_SEED", 1);
  uint64_t count = env_u64("PCP_SIM_SEEDS", 1000);
  uint64_t events = 0, restarts = 0, crashes = 0, fired = 0, succeeded = 0,
           cancelled = 0;
  uint64_t failures = 0;
  for (uint64_t seed = first; seed < first + count; ++seed) {
    pcp_sim_options_t options;
    pcp_sim_options_initialize(seed, &options);
    pcp_sim_result_t result;
    pcp_status_t status = pcp_sim_run(&options, &result);
    assert_int_equal(pcp_status_consume_code(status), PCP_STATUS_OK);
    if (result.failed) {
      if (failures++ == 0)
        report_failure(&options, &result);
      fprintf(stderr, "sim: seed %llu: %s\n", (unsigned long long)seed,
              result.failure);
    }
    events += result.event_count;
    restarts += result.gateway_restarts;
    crashes += result.worker_crashes;
    fired += result.buggify_fired;
    succeeded += result.jobs_succeeded;
    cancelled += result.jobs_cancelled;
  }
  fprintf(stderr,
          "sim: %llu seeds, %llu failed, %llu events, %llu gateway restarts, "
          "%llu worker crashes, %llu buggify fires, %llu jobs succeeded, "
          "%llu cancelled\n",
          (unsigned long long)count, (unsigned long long)failures,
          (unsigned long long)events, (unsigned long long)restarts,
          (unsigned long long)crashes, (unsigned long long)fired,
          (unsigned long long)succeeded, (unsigned long long)cancelled);
  assert_int_equal(failures, 0);
  // The scenario must reach the faults it is for.
  if (count >= 100) {
    assert_true(restarts > 0);
    assert_true(crashes > 0);
    assert_true(fired > 0);
    assert_true(succeeded > 0);
    assert_true(cancelled > 0);
  }
}

static void test_replay_is_identical(void** state) {
  (void)state;
  pcp_sim_options_t options;
  pcp_sim_options_initialize(42, &options);
  pcp_sim_result_t a, b, c;
  assert_int_equal(pcp_status_consume_code(pcp_sim_run(&options, &a)),
                   PCP_STATUS_OK);
  assert_int_equal(pcp_status_consume_code(pcp_sim_run(&options, &b)),
                   PCP_STATUS_OK);
  assert_false(a.failed);
  assert_true(a.event_count > 100);
  assert_true(a.trace_hash == b.trace_hash);
  assert_int_equal(a.event_count, b.event_count);
  assert_true(a.end_ns == b.end_ns);
  // Replaying its own fault schedule explicitly gives the same run.
  pcp_sim_options_t replay = options;
  replay.fault_schedule = a.faults;
  replay.fault_schedule_count = a.fault_count;
  assert_int_equal(pcp_status_consume_code(pcp_sim_run(&replay, &c)),
                   PCP_STATUS_OK);
  assert_true(c.trace_hash == a.trace_hash);
  // Another seed is another run.
  options.seed = 43;
  assert_int_equal(pcp_status_consume_code(pcp_sim_run(&options, &c)),
                   PCP_STATUS_OK);
  assert_true(c.trace_hash != a.trace_hash);
}

static void test_options_are_checked(void** state) {
  (void)state;
  pcp_sim_options_t options;
  pcp_sim_options_initialize(1, &options);
  options.worker_count = 0;
  pcp_sim_result_t result;
  assert_int_equal(pcp_status_consume_code(pcp_sim_run(&options, &result)),
                   PCP_STATUS_INVALID_ARGUMENT);
  pcp_sim_options_initialize(1, &options);
  options.job_count = PCP_SIM_MAX_JOBS + 1;
  assert_int_equal(pcp_status_consume_code(pcp_sim_run(&options, &result)),
                   PCP_STATUS_INVALID_ARGUMENT);
  // Seeded bugs exist only in the test build that compiles them in.
  pcp_sim_options_initialize(1, &options);
  options.bug = PCP_SIM_BUG_CANCEL_LEAKS_LEASE;
  assert_false(pcp_sim_seeded_bugs_available());
  assert_int_equal(pcp_status_consume_code(pcp_sim_run(&options, &result)),
                   PCP_STATUS_UNIMPLEMENTED);
  // Nothing to shrink in a passing seed.
  pcp_sim_options_initialize(42, &options);
  bool buggify = false;
  assert_int_equal(
      pcp_status_consume_code(pcp_sim_shrink(&options, 4, &result, &buggify)),
      PCP_STATUS_FAILED_PRECONDITION);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_options_are_checked),
      cmocka_unit_test(test_replay_is_identical),
      cmocka_unit_test(test_seeds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
