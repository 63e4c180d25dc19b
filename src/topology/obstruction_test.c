// SPDX-License-Identifier: Apache-2.0
//
// The obstruction catalogue (reference s.6, obstruction.zig tests).

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

static void build(const char* name, pcp_topology_model_instance_t* m) {
  const pcp_topology_model_t* model =
      pcp_topology_model_find(pcp_make_cstring_view(name));
  assert_non_null(model);
  pcp_topology_model_instance_initialize(pcp_allocator_system(), m);
  PCP_CHECK_OK(pcp_topology_model_build(model, m));
}

static void diagnose(const pcp_topology_model_instance_t* m,
                     pcp_topology_pcp_witness_t witness,
                     pcp_topology_obstruction_options_t options,
                     pcp_topology_obstruction_report_t* report) {
  pcp_topology_decision_problem_t problem = {m->execution, m->task.carrier};
  bool found = false;
  PCP_CHECK_OK(pcp_topology_obstruction_diagnose(&problem, witness, options,
                                                 report, &found));
  assert_true(found);
}

// bounded obstruction report explains canonical disconnected-output toy task
static void test_disconnected_output_toy(void** state) {
  (void)state;
  pcp_topology_model_instance_t m;
  build("partition.split_brain", &m);
  pcp_topology_obstruction_report_t report;
  pcp_topology_obstruction_report_initialize(pcp_allocator_system(), &report);
  diagnose(&m, PCP_TOPOLOGY_PCP_WITNESS_PARTITION,
           pcp_topology_obstruction_options_default(), &report);
  assert_int_equal(report.kind,
                   PCP_TOPOLOGY_OBSTRUCTION_DISCONNECTED_TASK_OUTPUT);
  assert_int_equal(report.failed_invariant,
                   PCP_TOPOLOGY_INVARIANT_CONNECTIVITY);
  assert_int_equal(report.pcp_witness, PCP_TOPOLOGY_PCP_WITNESS_PARTITION);
  // The face is the input edge.
  assert_true(pcp_topology_simplex_equal(
      pcp_topology_make_simplex(report.input_face.items,
                                report.input_face.count),
      pcp_topology_complex_simplex(m.task.input, 0)));
  assert_int_equal(report.output_betti.values[0], 2);
  assert_int_equal(report.protocol_betti.values[0], 1);
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  PCP_CHECK_OK(pcp_topology_obstruction_report_format(&report, &b));
  const char* text = pcp_string_builder_cstring(&b);
  assert_non_null(strstr(text, "bounded topology obstruction\n"));
  assert_non_null(strstr(text, "input_face:"));
  assert_non_null(strstr(text, "protocol_carrier_image"));
  assert_non_null(strstr(text, "output_carrier_image"));
  assert_non_null(strstr(text, "failed_invariant: connectivity"));
  pcp_string_builder_reset(&b);
  PCP_CHECK_OK(pcp_topology_obstruction_report_format_json(&report, &b));
  json_error_t error;
  json_t* root = json_loads(pcp_string_builder_cstring(&b), 0, &error);
  assert_non_null(root);
  assert_string_equal(json_string_value(json_object_get(root, "kind")),
                      "disconnected_task_output");
  json_decref(root);
  pcp_string_builder_deinitialize(&b);
  pcp_topology_obstruction_report_deinitialize(&report);
  pcp_topology_model_instance_deinitialize(&m);
}

// bounded obstruction report names PCP global rollback gap under partial
// gateway loss
static void test_global_rollback_gap(void** state) {
  (void)state;
  pcp_topology_model_instance_t m;
  build("global.partial_loss_without_rollback", &m);
  pcp_topology_obstruction_report_t report;
  pcp_topology_obstruction_report_initialize(pcp_allocator_system(), &report);
  pcp_topology_obstruction_options_t options =
      pcp_topology_obstruction_options_default();
  options.max_homology_dimension = 3;
  diagnose(&m, PCP_TOPOLOGY_PCP_WITNESS_GLOBAL_ROLLBACK_GAP, options, &report);
  assert_int_equal(report.kind, PCP_TOPOLOGY_OBSTRUCTION_HOLE_CREATION_FAILURE);
  assert_int_equal(report.failed_invariant,
                   PCP_TOPOLOGY_INVARIANT_BETTI_NUMBER);
  assert_int_equal(report.pcp_witness,
                   PCP_TOPOLOGY_PCP_WITNESS_GLOBAL_ROLLBACK_GAP);
  assert_int_equal(report.protocol_betti.values[2], 0);
  assert_int_equal(report.output_betti.values[2], 1);
  assert_int_equal(report.input_face.count, 4);
  // With the default bound (2) the 3-simplex is beyond the diagnosis.
  diagnose(&m, PCP_TOPOLOGY_PCP_WITNESS_GLOBAL_ROLLBACK_GAP,
           pcp_topology_obstruction_options_default(), &report);
  assert_int_equal(report.kind, PCP_TOPOLOGY_OBSTRUCTION_UNSUPPORTED_DIMENSION);
  assert_true(report.has_unsupported_dimension);
  assert_int_equal(report.unsupported_dimension, 3);
  pcp_topology_obstruction_report_deinitialize(&report);
  pcp_topology_model_instance_deinitialize(&m);
}

// bounded obstruction report distinguishes carrier nonexistence
static void test_carrier_nonexistence(void** state) {
  (void)state;
  pcp_topology_model_instance_t m;
  build("federation.stale_gateway", &m);
  pcp_topology_obstruction_report_t report;
  pcp_topology_obstruction_report_initialize(pcp_allocator_system(), &report);
  diagnose(&m, PCP_TOPOLOGY_PCP_WITNESS_STALE_GATEWAY,
           pcp_topology_obstruction_options_default(), &report);
  assert_int_equal(report.kind, PCP_TOPOLOGY_OBSTRUCTION_CARRIER_NONEXISTENCE);
  assert_true(report.has_unsat_reason);
  assert_int_equal(report.unsat_reason,
                   PCP_TOPOLOGY_UNSAT_REASON_EMPTY_CANDIDATE_SET);
  assert_int_equal(report.unsat_core_vertices.count, 1);
  pcp_topology_obstruction_report_deinitialize(&report);
  pcp_topology_model_instance_deinitialize(&m);
}

// map-induced obstruction report carries a concrete lost cycle witness
static void test_map_induced_lost_cycle(void** state) {
  (void)state;
  // The boundary of a triangle (a circle) collapsed to one point: the
  // cancellation path identifies every state, the cycle is lost.
  pcp_topology_vertex_t v[3];
  for (uint32_t i = 0; i < 3; ++i) {
    v[i] = pcp_topology_make_vertex(
        pcp_topology_make_color(PCP_TOPOLOGY_COLOR_PROCESS, i),
        pcp_topology_make_label(PCP_TOPOLOGY_LABEL_PROTOCOL, 0));
  }
  pcp_topology_vertex_t point = pcp_topology_make_vertex(
      pcp_topology_make_color(PCP_TOPOLOGY_COLOR_SESSION, 0),
      pcp_topology_make_symbol("session.canceled"));
  pcp_topology_complex_t* circle = NULL;
  pcp_topology_complex_t* target = NULL;
  PCP_CHECK_OK(pcp_topology_complex_create(pcp_allocator_system(), &circle));
  PCP_CHECK_OK(pcp_topology_complex_create(pcp_allocator_system(), &target));
  for (uint32_t i = 0; i < 3; ++i) {
    pcp_topology_vertex_t edge[2] = {v[i], v[(i + 1) % 3]};
    PCP_CHECK_OK(pcp_topology_complex_add(
        circle, pcp_topology_make_simplex(edge, 2), NULL));
  }
  PCP_CHECK_OK(pcp_topology_complex_add(
      target, pcp_topology_make_simplex(&point, 1), NULL));
  pcp_topology_vertex_map_t* map = NULL;
  PCP_CHECK_OK(pcp_topology_vertex_map_create(circle, target,
                                              pcp_allocator_system(), &map));
  for (uint32_t i = 0; i < 3; ++i) {
    PCP_CHECK_OK(pcp_topology_vertex_map_set(map, &v[i], &point));
  }
  pcp_topology_obstruction_report_t report;
  pcp_topology_obstruction_report_initialize(pcp_allocator_system(), &report);
  bool found = false;
  PCP_CHECK_OK(pcp_topology_obstruction_diagnose_map(
      pcp_topology_make_simplex(v, 3), map,
      PCP_TOPOLOGY_PCP_WITNESS_CANCELLATION_HOLE,
      pcp_topology_obstruction_options_default(), &report, &found));
  assert_true(found);
  assert_int_equal(report.kind,
                   PCP_TOPOLOGY_OBSTRUCTION_HOLE_PRESERVATION_FAILURE);
  assert_int_equal(report.failed_invariant,
                   PCP_TOPOLOGY_INVARIANT_INDUCED_HOMOLOGY);
  assert_int_equal(report.pcp_witness,
                   PCP_TOPOLOGY_PCP_WITNESS_CANCELLATION_HOLE);
  assert_int_equal(report.homology_witness.kind,
                   PCP_TOPOLOGY_HOMOLOGY_WITNESS_SOURCE_CYCLE_LOST);
  assert_int_equal(report.homology_witness.source_chain.count, 3);
  assert_true(report.induced_rank_count >= 2);
  assert_int_equal(report.induced_ranks[1], 0);
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  PCP_CHECK_OK(pcp_topology_obstruction_report_format(&report, &b));
  assert_non_null(
      strstr(pcp_string_builder_cstring(&b), "source_cycle_simplexes: 3"));
  pcp_string_builder_deinitialize(&b);
  pcp_topology_obstruction_report_deinitialize(&report);
  pcp_topology_vertex_map_release(map);
  pcp_topology_complex_release(circle);
  pcp_topology_complex_release(target);
}

// A solvable problem has no obstruction.
static void test_solvable_problem_has_no_obstruction(void** state) {
  (void)state;
  pcp_topology_model_instance_t m;
  build("reservation_lifecycle", &m);
  pcp_topology_decision_problem_t problem = {m.execution, m.task.carrier};
  pcp_topology_obstruction_report_t report;
  pcp_topology_obstruction_report_initialize(pcp_allocator_system(), &report);
  bool found = true;
  PCP_CHECK_OK(pcp_topology_obstruction_diagnose(
      &problem, PCP_TOPOLOGY_PCP_WITNESS_GENERIC,
      pcp_topology_obstruction_options_default(), &report, &found));
  assert_false(found);
  pcp_topology_obstruction_report_deinitialize(&report);
  pcp_topology_model_instance_deinitialize(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_disconnected_output_toy),
      cmocka_unit_test(test_global_rollback_gap),
      cmocka_unit_test(test_carrier_nonexistence),
      cmocka_unit_test(test_map_induced_lost_cycle),
      cmocka_unit_test(test_solvable_problem_has_no_obstruction),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
