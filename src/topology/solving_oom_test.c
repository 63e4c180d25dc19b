// SPDX-License-Identifier: Apache-2.0
//
// OOM sweeps (SQLite style) over the solving half's entry points: fail the
// Nth allocation for every N until the call succeeds; every failure must be
// a RESOURCE_EXHAUSTED status (never a crash), and under the ASan build
// nothing may leak.

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <string.h>

#include "topology/protocols_impl.h"

typedef pcp_status_t (*sweep_fn_t)(pcp_allocator_t allocator);

// Fails allocation n for n = 0, stride, 2*stride, ... where the stride keeps
// the sweep near |max_runs| runs: exhaustive for small calls, sampled for
// the large ones (a model check makes thousands of allocations and each run
// repeats all of them, so an exhaustive sweep there takes minutes under
// ASan).
static void sweep(const char* name, sweep_fn_t fn, int64_t max_runs) {
  pcp_allocator_failing_t counting;
  pcp_allocator_failing_initialize(pcp_allocator_system(), -1, false,
                                   &counting);
  PCP_CHECK_OK(fn(pcp_allocator_failing(&counting)));
  int64_t total = counting.request_count;
  assert_true(total > 0);
  int64_t stride = total / max_runs + 1;
  for (int64_t n = 0; n < total; n += stride) {
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_system(), n, true, &failing);
    pcp_status_t status = fn(pcp_allocator_failing(&failing));
    if (!status) {
      // Allocation n was not on the path after all (some allocations are
      // optional); the call must still have succeeded cleanly.
      continue;
    }
    pcp_status_code_t code = pcp_status_consume_code(status);
    if (code != PCP_STATUS_RESOURCE_EXHAUSTED) {
      fail_msg("%s: allocation %lld failed with %s", name, (long long)n,
               pcp_status_code_string(code));
    }
  }
}

static pcp_status_t trace_parse(pcp_allocator_t allocator) {
  static const char kText[] =
      "topology-simulator-trace v1 seed=7 events=2\n"
      "0: send actor=0 peer=1 message=1\n"
      "1: deliver actor=1 peer=0 message=1\n"
      "final steps=2 nodes=2 online_mask=3 pending=0 delivered=1 "
      "checksum=5 failure=none\n";
  pcp_topology_trace_t trace;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_trace_parse(
      pcp_make_cstring_view(kText), allocator, &trace));
  pcp_topology_trace_deinitialize(&trace);
  return pcp_ok_status();
}

static pcp_status_t sim_explore(pcp_allocator_t allocator) {
  pcp_topology_sim_exploration_t result;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_sim_explore_exhaustive(2026, 2, true, allocator, &result));
  pcp_topology_sim_exploration_deinitialize(&result);
  return pcp_ok_status();
}

static pcp_status_t task_build(pcp_allocator_t allocator) {
  pcp_topology_task_t task;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_task_build(
      PCP_TOPOLOGY_TASK_FEDERATION_PLACEMENT, allocator, &task));
  pcp_topology_task_deinitialize(&task);
  return pcp_ok_status();
}

static pcp_status_t model_check(pcp_allocator_t allocator) {
  const pcp_topology_model_t* model = pcp_topology_model_find(
      pcp_make_cstring_view("reservation.cancel_cleanup"));
  pcp_topology_check_report_t report;
  pcp_topology_check_report_initialize(allocator, &report);
  pcp_status_t status = pcp_topology_model_check(
      model, pcp_topology_check_options_default(), &report);
  pcp_string_builder_t text;
  pcp_string_builder_initialize(allocator, 0, &text);
  if (!status)
    status = pcp_topology_check_report_format_json(&report, &text);
  pcp_string_builder_deinitialize(&text);
  pcp_topology_check_report_deinitialize(&report);
  return status;
}

static pcp_status_t global_composition(pcp_allocator_t allocator) {
  pcp_topology_global_composition_t c;
  pcp_topology_global_composition_initialize(allocator, &c);
  pcp_status_t status = pcp_topology_global_composition_build(&c);
  pcp_topology_global_composition_deinitialize(&c);
  return status;
}

static void test_oom_trace_and_sim(void** state) {
  (void)state;
  sweep("trace_parse", trace_parse, 1000);
  sweep("sim_explore", sim_explore, 1000);
}

static void test_oom_tasks_and_models(void** state) {
  (void)state;
  sweep("task_build", task_build, 300);
  sweep("model_check", model_check, 150);
}

static void test_oom_composition(void** state) {
  (void)state;
  sweep("global_composition", global_composition, 100);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_oom_trace_and_sim),
      cmocka_unit_test(test_oom_tasks_and_models),
      cmocka_unit_test(test_oom_composition),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
