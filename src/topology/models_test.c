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

#include <string.h>

#include <jansson.h>

#include "topology/protocols_impl.h"

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
      if (!root)
        fail_msg("%s: %s", error.text, pcp_string_builder_cstring(&b));
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
    pcp_topology_carrier_checks_t checks =
        pcp_topology_carrier_checks_default();
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

static pcp_topology_vertex_t sym(pcp_topology_color_kind_t kind, uint32_t n,
                                 const char* label) {
  return pcp_topology_make_vertex(pcp_topology_make_color(kind, n),
                                  pcp_topology_make_symbol(label));
}

static pcp_topology_complex_t* listed(const pcp_topology_vertex_t* facets,
                                      size_t facet_count, size_t width) {
  pcp_topology_complex_t* c = NULL;
  PCP_CHECK_OK(pcp_topology_complex_create(pcp_allocator_system(), &c));
  for (size_t i = 0; i < facet_count; ++i) {
    PCP_CHECK_OK(pcp_topology_complex_append(
        c, pcp_topology_make_simplex(facets + i * width, width)));
  }
  return c;
}

// models/workload_contract: the default index decisions validate (the
// index API over listed simplices, reference s.3.3).
static void test_workload_contract_index_model(void** state) {
  (void)state;
  const pcp_topology_color_kind_t API = PCP_TOPOLOGY_COLOR_API_CALLER;
  const pcp_topology_color_kind_t GW = PCP_TOPOLOGY_COLOR_GATEWAY;
  const pcp_topology_color_kind_t SES = PCP_TOPOLOGY_COLOR_SESSION;
  pcp_topology_vertex_t in[4] = {
      sym(API, 0, "request.regular"), sym(GW, 0, "gateway.training"),
      sym(API, 0, "request.invalid"), sym(GW, 0, "gateway.training")};
  pcp_topology_vertex_t pr[4] = {
      sym(GW, 0, "normalized.regular"), sym(SES, 0, "session.accepted"),
      sym(GW, 0, "normalized.rejected"), sym(SES, 0, "session.rejected")};
  pcp_topology_vertex_t out[4] = {
      sym(GW, 0, "route.regular_training"), sym(SES, 0, "status.accepted"),
      sym(GW, 0, "route.rejected"), sym(SES, 0, "status.rejected")};
  pcp_topology_complex_t* input = listed(in, 2, 2);
  pcp_topology_complex_t* protocol = listed(pr, 2, 2);
  pcp_topology_complex_t* output = listed(out, 2, 2);
  static const uint32_t kZero[1] = {0}, kOne[1] = {1};
  pcp_topology_index_edge_t edges[2] = {{0, kZero, 1}, {1, kOne, 1}};
  pcp_topology_index_carrier_t carrier = {input, output, edges, 2};
  pcp_topology_decision_edge_t decisions[2] = {{0, 0, 0}, {1, 1, 1}};
  PCP_CHECK_OK(pcp_topology_index_carrier_validate(&carrier));
  PCP_CHECK_OK(
      pcp_topology_decision_map_validate(protocol, &carrier, decisions, 2));
  // The route rule the model encodes.
  assert_true(pcp_topology_workload_route_regular("{}", "run-shared"));
  assert_false(pcp_topology_workload_route_regular("{}", "invalid-session"));
  assert_false(pcp_topology_workload_route_regular(
      "{\"training_kind\":\"streaming\"}", "run-shared"));
  // Deciding "accepted" for the invalid request leaves the carrier.
  decisions[1].output_index = 0;
  pcp_status_t status =
      pcp_topology_decision_map_validate(protocol, &carrier, decisions, 2);
  assert_int_equal(pcp_topology_status_error(status),
                   PCP_TOPOLOGY_ERROR_DECISION_OUTSIDE_CARRIER);
  pcp_status_ignore(status);
  pcp_topology_complex_release(input);
  pcp_topology_complex_release(protocol);
  pcp_topology_complex_release(output);
}

// What the gateway and the worker see for one message, from running the
// catalogue's dispatch rule and the worker handler-acceptance oracle.
static const char* dispatch_view(const char* message) {
  size_t count = 0;
  const pcp_topology_message_entry_t* catalog =
      pcp_topology_message_catalog(&count);
  switch (pcp_topology_message_dispatch(catalog, count, message)) {
    case PCP_TOPOLOGY_DISPATCH_CONTROLLER_TO_WORKER:
      return "view.dispatch.controller_to_worker";
    case PCP_TOPOLOGY_DISPATCH_GATEWAY_QUEUE_ONLY:
      return "view.dispatch.gateway_queue_only";
    case PCP_TOPOLOGY_DISPATCH_GATEWAY_HANDLED:
      return "view.dispatch.gateway_handled";
    case PCP_TOPOLOGY_DISPATCH_FAIL_CLOSED:
      return "view.dispatch.fail_closed";
  }
  return "?";
}

static const char* handler_view(const char* message,
                                pcp_topology_worker_handler_t claimed) {
  size_t count = 0;
  const pcp_topology_message_entry_t* catalog =
      pcp_topology_message_catalog(&count);
  switch (pcp_topology_worker_handler_check(catalog, count, message, claimed)) {
    case PCP_TOPOLOGY_HANDLER_VERDICT_ACCEPTED:
      return claimed == PCP_TOPOLOGY_HANDLER_INFERENCE
                 ? "view.handler.accepted.inference"
                 : "view.handler.accepted.decoupled_training";
    case PCP_TOPOLOGY_HANDLER_VERDICT_WRONG_WORKER_HANDLER:
      return "view.handler.wrong_worker_handler";
    case PCP_TOPOLOGY_HANDLER_VERDICT_NO_WORKER_HANDLER:
      return "view.handler.no_worker_handler";
    case PCP_TOPOLOGY_HANDLER_VERDICT_UNKNOWN_MESSAGE:
      return "view.handler.unknown_message";
  }
  return "?";
}

// oracles/message: the index decisions validate (the two accepting cases
// share the gateway view view.dispatch.controller_to_worker) and a decision
// outside the carrier fails (accepting a worker result on the worker)
static void test_message_index_model(void** state) {
  (void)state;
  const pcp_topology_color_kind_t GW = PCP_TOPOLOGY_COLOR_GATEWAY;
  const pcp_topology_color_kind_t WK = PCP_TOPOLOGY_COLOR_WORKER;
  static const struct {
    const char* message;
    pcp_topology_worker_handler_t claimed;
  } kCases[4] = {
      {"StartDecoupledDilocoLoop", PCP_TOPOLOGY_HANDLER_DECOUPLED_TRAINING},
      {"StartGeneration", PCP_TOPOLOGY_HANDLER_INFERENCE},
      {"DecoupledFragmentUpdate", PCP_TOPOLOGY_HANDLER_DECOUPLED_TRAINING},
      {"pcp.unknown", PCP_TOPOLOGY_HANDLER_NONE},
  };
  pcp_topology_vertex_t in[8] = {sym(GW, 0, "StartDecoupledDilocoLoop"),
                                 sym(WK, 0, "handler.decoupled_training"),
                                 sym(GW, 0, "StartGeneration"),
                                 sym(WK, 0, "handler.inference"),
                                 sym(GW, 0, "queue.worker_result"),
                                 sym(WK, 0, "DecoupledFragmentUpdate"),
                                 sym(GW, 0, "message.unknown"),
                                 sym(WK, 0, "handler.unknown")};
  pcp_topology_vertex_t pr[8];
  for (size_t c = 0; c < 4; ++c) {
    pr[2 * c] = sym(GW, 0, dispatch_view(kCases[c].message));
    pr[2 * c + 1] =
        sym(WK, 0, handler_view(kCases[c].message, kCases[c].claimed));
  }
  assert_true(pcp_topology_vertex_equal(&pr[0], &pr[2]));
  pcp_topology_vertex_t out[8] = {
      sym(GW, 0, "dispatch.controller_to_worker"),
      sym(WK, 0, "accepted.decoupled_training"),
      sym(GW, 0, "dispatch.controller_to_worker"),
      sym(WK, 0, "accepted.inference"),
      sym(GW, 0, "dispatch.gateway_queue_only"),
      sym(WK, 0, "rejected.worker_result_to_worker"),
      sym(GW, 0, "dispatch.fail_closed"),
      sym(WK, 0, "rejected.unknown_message")};
  pcp_topology_complex_t* input = listed(in, 4, 2);
  pcp_topology_complex_t* protocol = listed(pr, 4, 2);
  pcp_topology_complex_t* output = listed(out, 4, 2);
  static const uint32_t kOutputs[4][1] = {{0}, {1}, {2}, {3}};
  pcp_topology_index_edge_t edges[4] = {{0, kOutputs[0], 1},
                                        {1, kOutputs[1], 1},
                                        {2, kOutputs[2], 1},
                                        {3, kOutputs[3], 1}};
  pcp_topology_index_carrier_t carrier = {input, output, edges, 4};
  pcp_topology_decision_edge_t decisions[4] = {
      {0, 0, 0}, {1, 1, 1}, {2, 2, 2}, {3, 3, 3}};
  PCP_CHECK_OK(pcp_topology_index_carrier_validate(&carrier));
  PCP_CHECK_OK(
      pcp_topology_decision_map_validate(protocol, &carrier, decisions, 4));
  // Deciding "accepted" for the worker result leaves its carrier.
  decisions[2].output_index = 0;
  pcp_status_t status =
      pcp_topology_decision_map_validate(protocol, &carrier, decisions, 4);
  assert_int_equal(pcp_topology_status_error(status),
                   PCP_TOPOLOGY_ERROR_DECISION_OUTSIDE_CARRIER);
  pcp_status_ignore(status);
  pcp_topology_complex_release(input);
  pcp_topology_complex_release(protocol);
  pcp_topology_complex_release(output);
}

// models/federation_placement: the default index decisions validate;
// oracles/federation: stale -> placed gives DecisionOutsideCarrier.
static void test_federation_index_model(void** state) {
  (void)state;
  const pcp_topology_color_kind_t HUB = PCP_TOPOLOGY_COLOR_HUB;
  const pcp_topology_color_kind_t GW = PCP_TOPOLOGY_COLOR_GATEWAY;
  const pcp_topology_color_kind_t JOB = PCP_TOPOLOGY_COLOR_JOB;
  pcp_topology_vertex_t in[9] = {sym(HUB, 0, "hub.registry"),
                                 sym(GW, 1, "connected.compatible"),
                                 sym(JOB, 1, "job.requires.training"),
                                 sym(HUB, 0, "hub.registry"),
                                 sym(GW, 1, "stale.compatible"),
                                 sym(JOB, 1, "job.requires.training"),
                                 sym(HUB, 0, "hub.registry"),
                                 sym(GW, 1, "connected.incompatible"),
                                 sym(JOB, 1, "job.requires.training")};
  pcp_topology_vertex_t pr[6] = {sym(HUB, 0, "placement.selected"),
                                 sym(JOB, 1, "route.forwarded"),
                                 sym(HUB, 0, "placement.rejected"),
                                 sym(JOB, 1, "job.not_forwarded"),
                                 sym(HUB, 0, "placement.lost"),
                                 sym(JOB, 1, "gateway.lost_after_route")};
  pcp_topology_vertex_t out[6] = {sym(HUB, 0, "output.placed"),
                                  sym(GW, 1, "gateway.compatible"),
                                  sym(HUB, 0, "output.rejected"),
                                  sym(JOB, 1, "job.no_compatible_gateway"),
                                  sym(HUB, 0, "output.failed_after_loss"),
                                  sym(GW, 1, "gateway.unavailable")};
  pcp_topology_complex_t* input = listed(in, 3, 3);
  pcp_topology_complex_t* protocol = listed(pr, 3, 2);
  pcp_topology_complex_t* output = listed(out, 3, 2);
  static const uint32_t kPlacedOrLost[2] = {0, 2}, kRejected[1] = {1};
  pcp_topology_index_edge_t edges[3] = {
      {0, kPlacedOrLost, 2}, {1, kRejected, 1}, {2, kRejected, 1}};
  pcp_topology_index_carrier_t carrier = {input, output, edges, 3};
  pcp_topology_index_carrier_t execution = {input, protocol, edges, 3};
  PCP_CHECK_OK(pcp_topology_index_carrier_validate(&carrier));
  PCP_CHECK_OK(pcp_topology_execution_carrier_validate(&execution));
  pcp_topology_protocol_decision_t decisions[3] = {{0, 0}, {1, 1}, {2, 2}};
  PCP_CHECK_OK(pcp_topology_execution_decision_map_validate(
      &execution, &carrier, decisions, 3));
  // A stale gateway (input 1) reaches view 1; deciding "placed" there
  // escapes its carrier.
  decisions[1].output_index = 0;
  pcp_status_t status = pcp_topology_execution_decision_map_validate(
      &execution, &carrier, decisions, 3);
  assert_true(pcp_topology_status_error(status) ==
                  PCP_TOPOLOGY_ERROR_DECISION_OUTSIDE_CARRIER ||
              pcp_topology_status_error(status) ==
                  PCP_TOPOLOGY_ERROR_INCOMPATIBLE_DECISION_ON_SHARED_VIEW);
  pcp_status_ignore(status);
  pcp_topology_complex_release(input);
  pcp_topology_complex_release(protocol);
  pcp_topology_complex_release(output);
}

// milestone4: every extractor within its bound and with its evidence
static void test_extractions_within_bounds(void** state) {
  (void)state;
  static const struct {
    const char* model;
    pcp_topology_extraction_bound_t bound;
    pcp_topology_evidence_t evidence;
  } kBounds[] = {
      {"workload_contract",
       {2, 2, 3, 3},
       PCP_TOPOLOGY_EVIDENCE_PRODUCTION_FIXTURE},
      {"message_dispatch",
       {4, 4, 2, 2},
       PCP_TOPOLOGY_EVIDENCE_PRODUCTION_FIXTURE},
      {"gateway_lease_scheduling",
       {3, 3, 2, 2},
       PCP_TOPOLOGY_EVIDENCE_GENERATED_XI},
      {"reservation_lifecycle",
       {4, 4, 3, 3},
       PCP_TOPOLOGY_EVIDENCE_GENERATED_XI},
      {"federation_placement",
       {4, 4, 4, 4},
       PCP_TOPOLOGY_EVIDENCE_BOUNDED_MODEL},
      {"decoupled_fragment", {6, 6, 7, 7}, PCP_TOPOLOGY_EVIDENCE_GENERATED_XI},
      {"rda_merge", {3, 3, 3, 3}, PCP_TOPOLOGY_EVIDENCE_PRODUCTION_FIXTURE},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(kBounds); ++i) {
    pcp_topology_model_instance_t m;
    pcp_topology_model_instance_initialize(pcp_allocator_system(), &m);
    PCP_CHECK_OK(pcp_topology_model_build(model(kBounds[i].model), &m));
    PCP_CHECK_OK(pcp_topology_model_instance_check_bound(&m, kBounds[i].bound,
                                                         kBounds[i].evidence));
    // One event fewer than the longest trace is an overflow.
    pcp_topology_extraction_bound_t tight = kBounds[i].bound;
    tight.max_events = 1;
    tight.max_depth = 1;
    pcp_status_t status =
        pcp_topology_model_instance_check_bound(&m, tight, kBounds[i].evidence);
    assert_int_equal(pcp_topology_status_error(status),
                     PCP_TOPOLOGY_ERROR_EXTRACTION_EVENT_BOUND_EXCEEDED);
    pcp_status_ignore(status);
    status = pcp_topology_model_instance_check_bound(
        &m, kBounds[i].bound, PCP_TOPOLOGY_EVIDENCE_SMOKE_REPLAY);
    assert_int_equal(pcp_topology_status_error(status),
                     PCP_TOPOLOGY_ERROR_EXTRACTION_EVIDENCE_MISMATCH);
    pcp_status_ignore(status);
    pcp_topology_model_instance_deinitialize(&m);
  }
}

// extract/decoupled: the RDA bridge
static void test_rda_bridge(void** state) {
  (void)state;
  pcp_topology_model_instance_t m;
  pcp_topology_model_instance_initialize(pcp_allocator_system(), &m);
  PCP_CHECK_OK(pcp_topology_model_build(model("decoupled_fragment"), &m));
  pcp_topology_rda_bridge_t bridge;
  PCP_CHECK_OK(pcp_topology_rda_bridge_find(&m, &bridge));
  assert_int_equal(bridge.decoupled_case, 0);  // the quorum commit case
  assert_int_equal(bridge.protocol_index, 0);
  assert_int_equal(bridge.rda_input_index, 0);
  assert_int_not_equal(bridge.state_hash, 0);
  pcp_topology_model_instance_deinitialize(&m);
  PCP_CHECK_OK(pcp_topology_model_build(model("rda_merge"), &m));
  assert_int_equal(
      pcp_status_consume_code(pcp_topology_rda_bridge_find(&m, &bridge)),
      PCP_STATUS_INVALID_ARGUMENT);
  pcp_topology_model_instance_deinitialize(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_model_gives_its_verdict),
      cmocka_unit_test(test_extracted_carriers_validate),
      cmocka_unit_test(test_federation_execution_carrier),
      cmocka_unit_test(test_regression_models_name_their_failure),
      cmocka_unit_test(test_workload_contract_index_model),
      cmocka_unit_test(test_message_index_model),
      cmocka_unit_test(test_federation_index_model),
      cmocka_unit_test(test_extractions_within_bounds),
      cmocka_unit_test(test_rda_bridge),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
