// SPDX-License-Identifier: Apache-2.0
//
// Coverage metadata (reference s.6, coverage.zig tests, same numbers).

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <string.h>

#include "topology/protocols_impl.h"

static bool path_exists(const char* id) {
  size_t count = 0;
  const pcp_topology_coverage_path_t* paths =
      pcp_topology_coverage_default_paths(&count);
  for (size_t i = 0; i < count; ++i) {
    if (strcmp(paths[i].id, id) == 0)
      return true;
  }
  return false;
}

// default coverage metadata is strict for implemented production paths
static void test_default_coverage_is_strict(void** state) {
  (void)state;
  size_t count = 0;
  const pcp_topology_coverage_path_t* paths =
      pcp_topology_coverage_default_paths(&count);
  assert_int_equal(count, 31);
  PCP_CHECK_OK(pcp_topology_coverage_validate(paths, count, true));
}

// production message registry entries and handlers map to topology coverage
static void test_message_registry_maps_to_coverage(void** state) {
  (void)state;
  size_t count = 0;
  const pcp_topology_message_entry_t* catalog =
      pcp_topology_message_catalog(&count);
  assert_int_equal(count, 32);
  size_t handlers = 0;
  for (size_t i = 0; i < count; ++i) {
    const char* entry = pcp_topology_coverage_path_for_message(
        &catalog[i], PCP_TOPOLOGY_MESSAGE_ASPECT_ENTRY);
    const char* family = pcp_topology_coverage_path_for_message(
        &catalog[i], PCP_TOPOLOGY_MESSAGE_ASPECT_FAMILY);
    assert_true(entry && path_exists(entry));
    assert_true(family && path_exists(family));
    const char* handler = pcp_topology_coverage_path_for_message(
        &catalog[i], PCP_TOPOLOGY_MESSAGE_ASPECT_HANDLER);
    if (catalog[i].handler != PCP_TOPOLOGY_HANDLER_NONE) {
      assert_true(handler && path_exists(handler));
      handlers++;
    } else {
      assert_null(handler);
    }
  }
  // graph, transfer, regular, decoupled x2, streaming, inference x4, rl x2,
  // lifecycle.
  assert_int_equal(handlers, 13);
  assert_null(pcp_topology_coverage_path_for_message(
      pcp_topology_message_lookup(catalog, count, "pcp.unknown"),
      PCP_TOPOLOGY_MESSAGE_ASPECT_ENTRY));
}

// federation operation registry maps implemented and design-only paths
static void test_federation_operations_map(void** state) {
  (void)state;
  assert_string_equal(
      pcp_topology_coverage_path_for_federation_operation("gateway_connect"),
      "federation.operations.gateway_connect");
  assert_string_equal(
      pcp_topology_coverage_path_for_federation_operation("mutation_batch"),
      "federation.operations.mutation_batch");
  assert_string_equal(
      pcp_topology_coverage_path_for_federation_operation("reservation_commit"),
      "reservation.decision.lifecycle");
  assert_string_equal(
      pcp_topology_coverage_path_for_federation_operation("global_job_submit"),
      "federation.operations.global_job");
  assert_null(pcp_topology_coverage_path_for_federation_operation("ping"));
}

// bounded model state labels map to topology coverage
static void test_model_state_labels_map(void** state) {
  (void)state;
  for (int d = PCP_TOPOLOGY_SCHED_IDLE; d <= PCP_TOPOLOGY_SCHED_REJECTED; ++d) {
    assert_true(path_exists(pcp_topology_coverage_path_for_sched_decision(
        (pcp_topology_sched_decision_t)d)));
  }
  assert_string_equal(pcp_topology_coverage_path_for_sched_decision(
                          PCP_TOPOLOGY_SCHED_RESERVED),
                      "scheduling.decision.admission");
  assert_string_equal(
      pcp_topology_coverage_path_for_sched_decision(PCP_TOPOLOGY_SCHED_EXPIRED),
      "reservation.decision.lifecycle");
  size_t admission = 0, lifecycle = 0;
  for (int v = 0; v <= PCP_TOPOLOGY_SCHED_VIOLATION_ACTIVE_JOB_NOT_FOUND; ++v) {
    const char* path = pcp_topology_coverage_path_for_sched_violation(
        (pcp_topology_sched_violation_t)v);
    admission += strcmp(path, "scheduling.violation.admission") == 0;
    lifecycle += strcmp(path, "reservation.violation.lifecycle") == 0;
  }
  assert_int_equal(admission, 7);
  assert_int_equal(lifecycle, 6);
  assert_string_equal(pcp_topology_coverage_path_for_decoupled_action(
                          PCP_TOPOLOGY_DECOUPLED_CRASH),
                      "decoupled.crash_restart_resume");
  assert_string_equal(pcp_topology_coverage_path_for_decoupled_action(
                          PCP_TOPOLOGY_DECOUPLED_SUBMIT),
                      "decoupled.action_tag");
  assert_string_equal(
      pcp_topology_coverage_path_for_rda_violation("incompatible_local_views"),
      "rda.local_view_compatibility");
  assert_string_equal(
      pcp_topology_coverage_path_for_rda_violation("rda_norm_mismatch"),
      "rda.violation");
}

// design-only global job mappings are reported outside implemented coverage
static void test_design_only_global_job(void** state) {
  (void)state;
  size_t count = 0;
  const pcp_topology_coverage_path_t* paths =
      pcp_topology_coverage_default_paths(&count);
  pcp_topology_coverage_summary_t summary;
  pcp_topology_coverage_summarize(paths, count, &summary);
  assert_int_equal(summary.total, 31);
  assert_int_equal(summary.implemented, 28);
  assert_int_equal(summary.covered, 28);
  assert_int_equal(summary.design_only, 3);
  assert_int_equal(summary.uncovered, 0);
  assert_string_equal(pcp_topology_coverage_path_for_global_job_state(
                          PCP_TOPOLOGY_GLOBAL_JOB_ROLLED_BACK),
                      "global_job.design_state");
}

// strict coverage rejects implemented paths without a topology mapping
static void test_strict_rejects_uncovered(void** state) {
  (void)state;
  size_t count = 0;
  const pcp_topology_coverage_path_t* defaults =
      pcp_topology_coverage_default_paths(&count);
  pcp_topology_coverage_path_t paths[40];
  memcpy(paths, defaults, count * sizeof(paths[0]));
  paths[count] = (pcp_topology_coverage_path_t){
      "gateway.new_endpoint", -1, "src/roles/gateway/gateway.c", false};
  pcp_status_t status = pcp_topology_coverage_validate(paths, count + 1, true);
  assert_int_equal(pcp_topology_status_error(status),
                   PCP_TOPOLOGY_ERROR_UNCOVERED_IMPLEMENTED_PRODUCTION_PATH);
  pcp_status_ignore(status);
  PCP_CHECK_OK(pcp_topology_coverage_validate(paths, count + 1, false));
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  PCP_CHECK_OK(pcp_topology_coverage_summary_format(paths, count + 1, &b));
  assert_non_null(strstr(pcp_string_builder_cstring(&b), "uncovered=1\n"));
  assert_non_null(strstr(pcp_string_builder_cstring(&b),
                         "- uncovered: gateway.new_endpoint "
                         "source=src/roles/gateway/gateway.c\n"));
  pcp_string_builder_deinitialize(&b);
  // A duplicate id is caught too.
  paths[count] = defaults[0];
  status = pcp_topology_coverage_validate(paths, count + 1, true);
  assert_int_equal(pcp_topology_status_error(status),
                   PCP_TOPOLOGY_ERROR_DUPLICATE_COVERAGE_PATH);
  pcp_status_ignore(status);
}

// coverage ci summary format is stable
static void test_ci_summary_format(void** state) {
  (void)state;
  size_t count = 0;
  const pcp_topology_coverage_path_t* paths =
      pcp_topology_coverage_default_paths(&count);
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  PCP_CHECK_OK(pcp_topology_coverage_summary_format(paths, count, &b));
  assert_string_equal(
      pcp_string_builder_cstring(&b),
      "pcp topology coverage summary: total=31 implemented=28 covered=28 "
      "design_only=3 uncovered=0\n"
      "- message_dispatch: paths=3 evidence=production_fixture\n"
      "- workload_normalization: paths=4 evidence=production_fixture\n"
      "- gateway_lease_scheduling: paths=4 evidence=generated_Xi\n"
      "- reservation_lifecycle: paths=3 evidence=generated_Xi\n"
      "- federation_placement: paths=6 evidence=bounded_model\n"
      "- decoupled_fragment: paths=5 evidence=generated_Xi\n"
      "- rda_merge: paths=3 evidence=production_fixture\n"
      "- multi_gateway_global_job: paths=3 evidence=symbolic_carrier "
      "design_only=true\n");
  pcp_string_builder_deinitialize(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_default_coverage_is_strict),
      cmocka_unit_test(test_message_registry_maps_to_coverage),
      cmocka_unit_test(test_federation_operations_map),
      cmocka_unit_test(test_model_state_labels_map),
      cmocka_unit_test(test_design_only_global_job),
      cmocka_unit_test(test_strict_rejects_uncovered),
      cmocka_unit_test(test_ci_summary_format),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
