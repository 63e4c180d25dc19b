// SPDX-License-Identifier: Apache-2.0
//
// Protocol models and `check` (reference s.3.2-3.4 and the regression
// corpus of s.4): every model gives its known verdict with both solvers,
// the extracted carriers validate, and the injected bugs are caught.

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <jansson.h>
#include <string.h>

#include "topology/topology.h"

static void check_model(const pcp_topology_model_t* model,
                        pcp_topology_solver_kind_t solver,
                        pcp_topology_check_report_t* report) {
  pcp_topology_check_options_t options = pcp_topology_check_options_default();
  options.solver = solver;
  PCP_CHECK_OK(pcp_topology_model_check(model, options, report));
}

static void test_every_model_gives_its_verdict(void** state) {
  (void)state;
  size_t count = 0;
  const pcp_topology_model_t* models = pcp_topology_model_catalog(&count);
  assert_true(count >= 15);
  for (size_t i = 0; i < count; ++i) {
    for (int solver = 0; solver < 2; ++solver) {
      pcp_topology_check_report_t report;
      pcp_topology_check_report_initialize(pcp_allocator_system(), &report);
      check_model(&models[i], (pcp_topology_solver_kind_t)solver, &report);
      if (report.verdict != models[i].expected) {
        fail_msg("model %s (%s): verdict %s, expected %s", models[i].name,
                 solver ? "z3" : "native",
                 pcp_topology_verdict_name(report.verdict),
                 pcp_topology_verdict_name(models[i].expected));
      }
      if (report.verdict == PCP_TOPOLOGY_VERDICT_OBSTRUCTION) {
        assert_true(report.has_obstruction);
        assert_int_equal(report.obstruction.pcp_witness, models[i].pcp_witness);
      }
      if (report.verdict == PCP_TOPOLOGY_VERDICT_DECISION_ESCAPE) {
        assert_true(report.escape.found);
        assert_true(report.has_replay);
      }
      pcp_string_builder_t b;
      pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
      PCP_CHECK_OK(pcp_topology_check_report_format_json(&report, &b));
      json_error_t error;
      json_t* root = json_loads(pcp_string_builder_cstring(&b), 0, &error);
      if (!root) fail_msg("%s: %s", error.text, pcp_string_builder_cstring(&b));
      json_decref(root);
      pcp_string_builder_reset(&b);
      PCP_CHECK_OK(pcp_topology_check_report_format(&report, &b));
      assert_non_null(strstr(pcp_string_builder_cstring(&b), "verdict: "));
      pcp_string_builder_deinitialize(&b);
      pcp_topology_check_report_deinitialize(&report);
    }
  }
}

// Every solvable task model: Xi chromatic and monotone, the extracted
// delta carried, one witness trace per generated case with events.
static void test_extracted_carriers_validate(void** state) {
  (void)state;
  size_t count = 0;
  const pcp_topology_model_t* models = pcp_topology_model_catalog(&count);
  for (size_t i = 0; i < count; ++i) {
    if (models[i].inject_bug ||
        models[i].expected != PCP_TOPOLOGY_VERDICT_SOLVABLE) {
      continue;
    }
    pcp_topology_model_instance_t m;
    pcp_topology_model_instance_initialize(pcp_allocator_system(), &m);
    PCP_CHECK_OK(pcp_topology_model_build(&models[i], &m));
    pcp_topology_carrier_checks_t checks = pcp_topology_carrier_checks_default();
    checks.chromatic = true;
    PCP_CHECK_OK(pcp_topology_carrier_map_validate(m.execution, checks));
    assert_non_null(m.decision);
    PCP_CHECK_OK(pcp_topology_carried_decision_map_validate(
        m.execution, m.task.carrier, m.decision));
    assert_true(m.trace_count >= m.task.definition->case_count);
    for (size_t t = 0; t < m.trace_count; ++t) {
      assert_true(m.traces[t].event_count > 0);
      assert_int_equal(m.traces[t].final_snapshot.steps,
                       m.traces[t].event_count);
    }
    pcp_topology_model_instance_deinitialize(&m);
  }
}

static const pcp_topology_model_t* model(const char* name) {
  const pcp_topology_model_t* m =
      pcp_topology_model_find(pcp_make_cstring_view(name));
  assert_non_null(m);
  return m;
}

// The federation extractor: two generated cases share the compatible input
// (placed and lost after routing); stale and incompatible share the
// gateway's not-selected view.
static void test_federation_execution_carrier(void** state) {
  (void)state;
  pcp_topology_model_instance_t m;
  pcp_topology_model_instance_initialize(pcp_allocator_system(), &m);
  PCP_CHECK_OK(pcp_topology_model_build(model("federation_placement"), &m));
  assert_int_equal(m.trace_count, 4);
  assert_int_equal(pcp_topology_complex_count(m.protocol), 4);
  pcp_topology_vertex_t not_selected = pcp_topology_make_vertex(
      pcp_topology_make_color(PCP_TOPOLOGY_COLOR_GATEWAY, 1),
      pcp_topology_make_symbol("view.gateway.not_selected"));
  size_t facets_with_view = 0;
  for (size_t i = 0; i < pcp_topology_complex_count(m.protocol); ++i) {
    facets_with_view += pcp_topology_simplex_contains_vertex(
        pcp_topology_complex_simplex(m.protocol, i), &not_selected);
  }
  assert_int_equal(facets_with_view, 2);
  pcp_topology_model_instance_deinitialize(&m);
}

static void test_regression_models_name_their_failure(void** state) {
  (void)state;
  pcp_topology_check_report_t report;
  pcp_topology_check_report_initialize(pcp_allocator_system(), &report);
  check_model(model("federation.stale_gateway"), PCP_TOPOLOGY_SOLVER_NATIVE,
              &report);
  assert_int_equal(report.obstruction.kind,
                   PCP_TOPOLOGY_OBSTRUCTION_CARRIER_NONEXISTENCE);
  assert_int_equal(report.obstruction.unsat_reason,
                   PCP_TOPOLOGY_UNSAT_REASON_EMPTY_CANDIDATE_SET);
  check_model(model("global.partial_loss_without_rollback"),
              PCP_TOPOLOGY_SOLVER_NATIVE, &report);
  assert_int_equal(report.obstruction.kind,
                   PCP_TOPOLOGY_OBSTRUCTION_HOLE_CREATION_FAILURE);
  assert_int_equal(report.obstruction.protocol_betti.values[2], 0);
  assert_int_equal(report.obstruction.output_betti.values[2], 1);
  check_model(model("partition.split_brain"), PCP_TOPOLOGY_SOLVER_NATIVE,
              &report);
  assert_int_equal(report.obstruction.kind,
                   PCP_TOPOLOGY_OBSTRUCTION_DISCONNECTED_TASK_OUTPUT);
  check_model(model("rda.direct_average_escape"), PCP_TOPOLOGY_SOLVER_NATIVE,
              &report);
  assert_true(report.escape.found);
  assert_int_equal(report.escape.input.count, 1);
  pcp_topology_check_report_deinitialize(&report);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_model_gives_its_verdict),
      cmocka_unit_test(test_extracted_carriers_validate),
      cmocka_unit_test(test_federation_execution_carrier),
      cmocka_unit_test(test_regression_models_name_their_failure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
