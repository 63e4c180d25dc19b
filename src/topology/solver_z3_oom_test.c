// SPDX-License-Identifier: Apache-2.0
//
// The Z3 library backend under memory pressure: its copy of the SMT-LIB text
// without the core option (which the library rejects) comes from the
// caller's allocator (the search result's), so an OOM sweep over a model
// check with that backend reaches it. Every failure must be
// RESOURCE_EXHAUSTED, never a crash; under ASan nothing may leak.

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <string.h>

#include "topology/protocols_impl.h"

// The smallest obstruction model (a few hundred allocations): its Z3 check
// ends with the unsat-core run, the one whose text is copied.
static pcp_status_t model_check_z3(pcp_allocator_t allocator) {
  const pcp_topology_model_t* model =
      pcp_topology_model_find(pcp_make_cstring_view("partition.split_brain"));
  assert_non_null(model);
  pcp_topology_check_options_t options = pcp_topology_check_options_default();
  options.solver = PCP_TOPOLOGY_SOLVER_Z3;
  options.z3.backend = PCP_TOPOLOGY_SOLVER_BACKEND_Z3_LIBRARY;
  pcp_topology_check_report_t report;
  pcp_topology_check_report_initialize(allocator, &report);
  pcp_status_t status = pcp_topology_model_check(model, options, &report);
  if (!status) {
    assert_int_equal(report.verdict, PCP_TOPOLOGY_VERDICT_OBSTRUCTION);
    assert_true(report.z3_core_size > 0);
  }
  pcp_topology_check_report_deinitialize(&report);
  return status;
}

// Fails allocation n (and every later one) for every n until the call
// succeeds; exhaustive, so the text copy is among the failures.
static void test_z3_library_oom_sweep(void** state) {
  (void)state;
  // Not a skip: this build has PCP_ENABLE_Z3, so libz3 must load.
  assert_true(
      pcp_topology_solver_available(PCP_TOPOLOGY_SOLVER_BACKEND_Z3_LIBRARY));
  pcp_allocator_failing_t counting;
  pcp_allocator_failing_initialize(pcp_allocator_system(), -1, false,
                                   &counting);
  PCP_CHECK_OK(model_check_z3(pcp_allocator_failing(&counting)));
  int64_t total = counting.request_count;
  assert_true(total > 0 && total < 5000);
  bool saw_text_copy = false;
  for (int64_t n = 0; n < total; ++n) {
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_system(), n, true, &failing);
    pcp_status_t status = model_check_z3(pcp_allocator_failing(&failing));
    if (!status)
      continue;  // allocation n was optional; the call still succeeded
    char text[1024];
    pcp_status_format(status, text, sizeof(text));
    saw_text_copy |= strstr(text, "solver text") != NULL;
    pcp_status_code_t code = pcp_status_consume_code(status);
    if (code != PCP_STATUS_RESOURCE_EXHAUSTED) {
      fail_msg("allocation %lld of %lld failed with %s: %s", (long long)n,
               (long long)total, pcp_status_code_string(code), text);
    }
  }
  assert_true(saw_text_copy);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_z3_library_oom_sweep),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
