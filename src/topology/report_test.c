// SPDX-License-Identifier: Apache-2.0
//
// Review artifacts (reference s.6, reporting.zig tests).

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

// carrier escape report includes book objects and replay fixture fields
static void test_carrier_escape_report(void** state) {
  (void)state;
  pcp_topology_model_instance_t m;
  build("rda.direct_average_escape", &m);
  assert_non_null(m.decision);
  pcp_topology_carrier_escape_t escape;
  pcp_topology_carrier_escape_initialize(pcp_allocator_system(), &escape);
  PCP_CHECK_OK(pcp_topology_carrier_escape_find(m.execution, m.task.carrier,
                                                m.decision, &escape));
  assert_true(escape.found);
  pcp_topology_analysis_report_t report = {
      "below quorum the RDA merge publishes nothing",
      m.execution,
      m.task.carrier,
      m.decision,
      &escape,
      &m.traces[2]};
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  PCP_CHECK_OK(pcp_topology_analysis_report_format(&report, &b));
  const char* text = pcp_string_builder_cstring(&b);
  static const char* const kNeedles[] = {
      "pcp topology counterexample\n",
      "violated_rule: below quorum",
      "seed: 2\n",
      "I: simplexes=",
      "P: simplexes=",
      "O: simplexes=",
      "Xi: carrier_entries=",
      "Delta: carrier_entries=",
      "delta: vertex_map_entries=",
      "minimal_offending_simplex:",
      "offending_output: {gateway.0:rda.output.direction_norm_carried}",
      "replay_events:",
      "deliver actor=1 peer=0 message=52"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(kNeedles); ++i) {
    if (!strstr(text, kNeedles[i]))
      fail_msg("missing '%s' in:\n%s", kNeedles[i], text);
  }
  pcp_string_builder_reset(&b);
  PCP_CHECK_OK(pcp_topology_analysis_report_format_json(&report, &b));
  json_error_t error;
  json_t* root = json_loads(pcp_string_builder_cstring(&b), 0, &error);
  assert_non_null(root);
  assert_string_equal(json_string_value(json_object_get(root, "schema")),
                      "pcp.topology.analysis.v1");
  json_t* counts = json_object_get(root, "counts");
  assert_true(json_integer_value(json_object_get(counts, "input_simplexes")) >
              3);
  assert_non_null(
      json_object_get(json_object_get(root, "witness"), "offending_output"));
  assert_int_equal(json_array_size(json_object_get(root, "events")), 2);
  json_decref(root);
  pcp_string_builder_deinitialize(&b);
  pcp_topology_carrier_escape_deinitialize(&escape);
  pcp_topology_model_instance_deinitialize(&m);
}

// carrier escape finder returns null for carried decision maps
static void test_escape_finder_null_for_carried_maps(void** state) {
  (void)state;
  pcp_topology_model_instance_t m;
  build("rda_merge", &m);
  pcp_topology_carrier_escape_t escape;
  pcp_topology_carrier_escape_initialize(pcp_allocator_system(), &escape);
  PCP_CHECK_OK(pcp_topology_carrier_escape_find(m.execution, m.task.carrier,
                                                m.decision, &escape));
  assert_false(escape.found);
  pcp_topology_carrier_escape_deinitialize(&escape);
  pcp_topology_model_instance_deinitialize(&m);
}

// CI summary and signatures are stable review artifacts
static void test_signatures_are_stable(void** state) {
  (void)state;
  pcp_topology_model_instance_t a, b, bug;
  build("reservation_lifecycle", &a);
  build("reservation_lifecycle", &b);
  build("reservation.cancel_cleanup", &bug);
  uint64_t sa = 0, sb = 0, sbug = 0, ma = 0, mb = 0;
  PCP_CHECK_OK(pcp_topology_carrier_signature(a.execution, &sa));
  PCP_CHECK_OK(pcp_topology_carrier_signature(b.execution, &sb));
  PCP_CHECK_OK(pcp_topology_carrier_signature(bug.execution, &sbug));
  assert_int_equal(sa, sb);
  assert_int_not_equal(sa, sbug);
  PCP_CHECK_OK(pcp_topology_map_signature(a.decision, &ma));
  PCP_CHECK_OK(pcp_topology_map_signature(b.decision, &mb));
  assert_int_equal(ma, mb);
  uint64_t delta = 0;
  PCP_CHECK_OK(pcp_topology_carrier_signature(a.task.carrier, &delta));
  assert_int_not_equal(delta, sa);
  pcp_topology_artifact_t artifacts[] = {
      {"reservation_lifecycle.Delta", true, delta, true, delta},
      {"reservation_lifecycle.Xi", true, sa, true, sbug},
  };
  pcp_string_builder_t text;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &text);
  PCP_CHECK_OK(pcp_topology_artifact_summary_format(artifacts, 2, &text));
  assert_non_null(strstr(pcp_string_builder_cstring(&text),
                         "pcp topology artifact summary: 2 item(s)\n"
                         "- reservation_lifecycle.Delta: unchanged"));
  assert_non_null(strstr(pcp_string_builder_cstring(&text),
                         "- reservation_lifecycle.Xi: changed before="));
  pcp_string_builder_deinitialize(&text);
  pcp_topology_model_instance_deinitialize(&a);
  pcp_topology_model_instance_deinitialize(&b);
  pcp_topology_model_instance_deinitialize(&bug);
}

// regression corpus names known invalid protocol designs
static void test_regression_corpus(void** state) {
  (void)state;
  size_t count = 0;
  const pcp_topology_regression_entry_t* corpus =
      pcp_topology_regression_corpus(&count);
  assert_true(count >= 7);
  bool rda = false, global = false;
  for (size_t i = 0; i < count; ++i) {
    rda |= strcmp(corpus[i].name, "rda.direct_average_escape") == 0;
    global |=
        strcmp(corpus[i].name, "global.partial_loss_without_rollback") == 0;
    // Every entry is backed by a model whose verdict is negative.
    const pcp_topology_model_t* model =
        pcp_topology_model_find(pcp_make_cstring_view(corpus[i].name));
    assert_non_null(model);
    assert_int_not_equal(model->expected, PCP_TOPOLOGY_VERDICT_SOLVABLE);
    assert_non_null(
        pcp_topology_task_find(pcp_make_cstring_view(corpus[i].task)));
  }
  assert_true(rda);
  assert_true(global);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_carrier_escape_report),
      cmocka_unit_test(test_escape_finder_null_for_carried_maps),
      cmocka_unit_test(test_signatures_are_stable),
      cmocka_unit_test(test_regression_corpus),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
