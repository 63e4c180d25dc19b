// SPDX-License-Identifier: Apache-2.0
//
// Decision-map search, SMT-LIB export and Z3 (reference s.6,
// decision_search.zig and solver.zig tests, same expected numbers). The Z3
// tests run against both backends (libz3 and the z3 binary) and are never
// skipped: the set-up installs both.

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <string.h>

#include "topology/protocols_impl.h"

#define P(i) pcp_topology_make_color(PCP_TOPOLOGY_COLOR_PROCESS, (i))

static pcp_topology_vertex_t vx(uint32_t process, pcp_topology_label_kind_t k,
                                int64_t value) {
  return pcp_topology_make_vertex(P(process),
                                  pcp_topology_make_label(k, value));
}

static pcp_topology_complex_t* complex_new(void) {
  pcp_topology_complex_t* c = NULL;
  PCP_CHECK_OK(pcp_topology_complex_create(pcp_allocator_system(), &c));
  return c;
}

static void complex_add(pcp_topology_complex_t* c,
                        const pcp_topology_vertex_t* vertices, size_t count) {
  PCP_CHECK_OK(pcp_topology_complex_add(
      c, pcp_topology_make_simplex(vertices, count), NULL));
}

// Xi or Delta as a colour projection: every face F of |input| maps to the
// restrictions of the simplices listed in |choices| to F's colours.
static pcp_topology_carrier_map_t* projection_carrier(
    const pcp_topology_complex_t* input, const pcp_topology_complex_t* codomain,
    const pcp_topology_complex_t* choices) {
  pcp_topology_carrier_map_t* map = NULL;
  PCP_CHECK_OK(pcp_topology_carrier_map_create(input, codomain,
                                               pcp_allocator_system(), &map));
  pcp_topology_complex_t* faces = complex_new();
  PCP_CHECK_OK(pcp_topology_complex_faces(input, faces));
  for (size_t f = 0; f < pcp_topology_complex_count(faces); ++f) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, f);
    pcp_topology_complex_t* image = complex_new();
    for (size_t c = 0; c < pcp_topology_complex_count(choices); ++c) {
      pcp_topology_simplex_t choice = pcp_topology_complex_simplex(choices, c);
      pcp_topology_vertex_t kept[8];
      size_t count = 0;
      for (uint32_t v = 0; v < choice.count; ++v) {
        if (pcp_topology_simplex_vertex_with_color(
                face, choice.vertices[v].color) >= 0) {
          kept[count++] = choice.vertices[v];
        }
      }
      PCP_CHECK_OK(pcp_topology_complex_add(
          image, pcp_topology_make_simplex(kept, count), NULL));
    }
    PCP_CHECK_OK(pcp_topology_carrier_map_set(map, face, image));
    pcp_topology_complex_release(image);
  }
  pcp_topology_complex_release(faces);
  return map;
}

typedef struct fixture_t {
  pcp_topology_complex_t* input;
  pcp_topology_complex_t* protocol;
  pcp_topology_complex_t* output;
  pcp_topology_complex_t* output_choices;
  pcp_topology_carrier_map_t* execution;
  pcp_topology_carrier_map_t* task;
  pcp_topology_decision_problem_t problem;
} fixture_t;

// An input edge {p0, p1} whose protocol is the identity on an edge of views.
static void fixture_begin(fixture_t* f) {
  memset(f, 0, sizeof(*f));
  f->input = complex_new();
  pcp_topology_vertex_t in[2] = {vx(0, PCP_TOPOLOGY_LABEL_INPUT, 0),
                                 vx(1, PCP_TOPOLOGY_LABEL_INPUT, 1)};
  complex_add(f->input, in, 2);
  f->protocol = complex_new();
  pcp_topology_vertex_t view[2] = {vx(0, PCP_TOPOLOGY_LABEL_PROTOCOL, 0),
                                   vx(1, PCP_TOPOLOGY_LABEL_PROTOCOL, 1)};
  complex_add(f->protocol, view, 2);
  f->output = complex_new();
  f->output_choices = complex_new();
}

static void fixture_finish(fixture_t* f) {
  f->execution = projection_carrier(f->input, f->protocol, f->protocol);
  f->task = projection_carrier(f->input, f->output, f->output_choices);
  f->problem.execution = f->execution;
  f->problem.task = f->task;
}

static void fixture_end(fixture_t* f) {
  pcp_topology_carrier_map_release(f->execution);
  pcp_topology_carrier_map_release(f->task);
  pcp_topology_complex_release(f->input);
  pcp_topology_complex_release(f->protocol);
  pcp_topology_complex_release(f->output);
  pcp_topology_complex_release(f->output_choices);
}

// O = the edge {out0, out1} plus a stray p0 vertex the task never allows.
static void fixture_single_solution(fixture_t* f) {
  fixture_begin(f);
  pcp_topology_vertex_t out[2] = {vx(0, PCP_TOPOLOGY_LABEL_OUTPUT, 0),
                                  vx(1, PCP_TOPOLOGY_LABEL_OUTPUT, 1)};
  pcp_topology_vertex_t extra = vx(0, PCP_TOPOLOGY_LABEL_OUTPUT, 9);
  complex_add(f->output, out, 2);
  complex_add(f->output, &extra, 1);
  complex_add(f->output_choices, out, 2);
  fixture_finish(f);
}

// Two allowed output edges: {a0, a1} and {b0, b1}.
static void fixture_two_solutions(fixture_t* f) {
  fixture_begin(f);
  pcp_topology_vertex_t a[2] = {vx(0, PCP_TOPOLOGY_LABEL_OUTPUT, 0),
                                vx(1, PCP_TOPOLOGY_LABEL_OUTPUT, 0)};
  pcp_topology_vertex_t b[2] = {vx(0, PCP_TOPOLOGY_LABEL_OUTPUT, 1),
                                vx(1, PCP_TOPOLOGY_LABEL_OUTPUT, 1)};
  complex_add(f->output, a, 2);
  complex_add(f->output, b, 2);
  complex_add(f->output_choices, a, 2);
  complex_add(f->output_choices, b, 2);
  fixture_finish(f);
}

// O holds two isolated vertices: the protocol edge cannot map anywhere.
static void fixture_local_unsat(fixture_t* f) {
  fixture_begin(f);
  pcp_topology_vertex_t o0 = vx(0, PCP_TOPOLOGY_LABEL_OUTPUT, 0);
  pcp_topology_vertex_t o1 = vx(1, PCP_TOPOLOGY_LABEL_OUTPUT, 1);
  complex_add(f->output, &o0, 1);
  complex_add(f->output, &o1, 1);
  complex_add(f->output_choices, &o0, 1);
  complex_add(f->output_choices, &o1, 1);
  fixture_finish(f);
}

// O has no vertex of colour p1 at all.
static void fixture_empty_candidates(fixture_t* f) {
  fixture_begin(f);
  pcp_topology_vertex_t o0 = vx(0, PCP_TOPOLOGY_LABEL_OUTPUT, 0);
  complex_add(f->output, &o0, 1);
  complex_add(f->output_choices, &o0, 1);
  fixture_finish(f);
}

// decision search finds a carried color-preserving map
static void test_search_finds_carried_map(void** state) {
  (void)state;
  fixture_t f;
  fixture_single_solution(&f);
  pcp_topology_search_result_t result;
  pcp_topology_search_result_initialize(pcp_allocator_system(), &result);
  PCP_CHECK_OK(pcp_topology_decision_map_solve(
      &f.problem, pcp_topology_search_options_default(), &result));
  assert_int_equal(result.status, PCP_TOPOLOGY_SEARCH_SATISFIABLE);
  assert_int_equal(result.solution_count, 1);
  pcp_topology_vertex_t target;
  pcp_topology_vertex_t p0 = vx(0, PCP_TOPOLOGY_LABEL_PROTOCOL, 0);
  pcp_topology_vertex_t p1 = vx(1, PCP_TOPOLOGY_LABEL_PROTOCOL, 1);
  assert_true(
      pcp_topology_vertex_map_lookup(result.solutions[0], &p0, &target));
  assert_int_equal(target.label.value, 0);
  assert_true(
      pcp_topology_vertex_map_lookup(result.solutions[0], &p1, &target));
  assert_int_equal(target.label.value, 1);
  PCP_CHECK_OK(pcp_topology_carried_decision_map_validate(f.execution, f.task,
                                                          result.solutions[0]));
  // Enumerating finds no second map: the stray vertex was pruned.
  pcp_topology_search_options_t options = pcp_topology_search_options_default();
  options.max_solutions = 8;
  PCP_CHECK_OK(
      pcp_topology_decision_maps_enumerate(&f.problem, options, &result));
  assert_int_equal(result.solution_count, 1);
  pcp_topology_search_result_deinitialize(&result);
  fixture_end(&f);
}

// decision search enumerates multiple carried vertex maps
static void test_search_enumerates_multiple_maps(void** state) {
  (void)state;
  fixture_t f;
  fixture_two_solutions(&f);
  pcp_topology_search_result_t result;
  pcp_topology_search_result_initialize(pcp_allocator_system(), &result);
  pcp_topology_search_options_t options = pcp_topology_search_options_default();
  options.max_solutions = 8;
  PCP_CHECK_OK(
      pcp_topology_decision_maps_enumerate(&f.problem, options, &result));
  assert_int_equal(result.status, PCP_TOPOLOGY_SEARCH_SATISFIABLE);
  assert_int_equal(result.solution_count, 2);
  pcp_topology_search_result_deinitialize(&result);
  fixture_end(&f);
}

// decision search reports minimal local unsat core
static void test_search_reports_local_unsat_core(void** state) {
  (void)state;
  fixture_t f;
  fixture_local_unsat(&f);
  pcp_topology_search_result_t result;
  pcp_topology_search_result_initialize(pcp_allocator_system(), &result);
  PCP_CHECK_OK(pcp_topology_decision_map_solve(
      &f.problem, pcp_topology_search_options_default(), &result));
  assert_int_equal(result.status, PCP_TOPOLOGY_SEARCH_UNSATISFIABLE);
  assert_int_equal(result.unsat_reason,
                   PCP_TOPOLOGY_UNSAT_REASON_LOCAL_INCONSISTENCY);
  assert_int_equal(result.core.count, 2);
  pcp_topology_search_result_deinitialize(&result);
  fixture_end(&f);
}

// decision search reports empty candidate unsat core
static void test_search_reports_empty_candidate_core(void** state) {
  (void)state;
  fixture_t f;
  fixture_empty_candidates(&f);
  pcp_topology_search_result_t result;
  pcp_topology_search_result_initialize(pcp_allocator_system(), &result);
  PCP_CHECK_OK(pcp_topology_decision_map_solve(
      &f.problem, pcp_topology_search_options_default(), &result));
  assert_int_equal(result.status, PCP_TOPOLOGY_SEARCH_UNSATISFIABLE);
  assert_int_equal(result.unsat_reason,
                   PCP_TOPOLOGY_UNSAT_REASON_EMPTY_CANDIDATE_SET);
  assert_int_equal(result.core.count, 1);
  assert_int_equal(result.core.items[0].color.number, 1);
  pcp_topology_search_result_deinitialize(&result);
  fixture_end(&f);
}

static void test_search_limit_is_reported(void** state) {
  (void)state;
  fixture_t f;
  fixture_local_unsat(&f);
  pcp_topology_search_result_t result;
  pcp_topology_search_result_initialize(pcp_allocator_system(), &result);
  // The isolated-vertex problem prunes before any leaf; a two-solution
  // problem with a budget of 1 leaf and 8 wanted maps runs out instead.
  fixture_end(&f);
  fixture_two_solutions(&f);
  pcp_topology_search_options_t options = pcp_topology_search_options_default();
  options.max_solutions = 8;
  options.max_assignments = 1;
  PCP_CHECK_OK(
      pcp_topology_decision_maps_enumerate(&f.problem, options, &result));
  assert_true(result.limit_exceeded);
  assert_int_equal(result.solution_count, 1);
  assert_int_equal(result.status, PCP_TOPOLOGY_SEARCH_SATISFIABLE);
  pcp_topology_search_result_deinitialize(&result);
  fixture_end(&f);
}

// decision search exports SMT friendly constraints
static void test_search_exports_smt_constraints(void** state) {
  (void)state;
  fixture_t f;
  fixture_two_solutions(&f);
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  PCP_CHECK_OK(pcp_topology_smtlib_write(
      &f.problem, pcp_topology_smtlib_options_default(), &b));
  const char* text = pcp_string_builder_cstring(&b);
  assert_non_null(strstr(text, "(set-logic QF_BOOL)"));
  assert_non_null(strstr(text, "(declare-const x_0_0 Bool)"));
  assert_non_null(strstr(text, "(assert (or x_0_0 x_0_1))"));
  assert_non_null(strstr(text, "(assert (not (and x_0_0 x_1_1)))"));
  assert_non_null(strstr(text, "(check-sat)"));
  assert_null(strstr(text, ":named"));
  pcp_string_builder_deinitialize(&b);
  fixture_end(&f);
}

// solver parser reads statuses assignments and unsat cores
static void test_solver_parser(void** state) {
  (void)state;
  pcp_topology_search_status_t status;
  PCP_CHECK_OK(pcp_topology_solver_parse_status(
      pcp_make_cstring_view("sat\n((x_0_0 false) (x_0_1 true))\n"), &status));
  assert_int_equal(status, PCP_TOPOLOGY_SEARCH_SATISFIABLE);
  PCP_CHECK_OK(pcp_topology_solver_parse_status(
      pcp_make_cstring_view("unsat\n"), &status));
  assert_int_equal(status, PCP_TOPOLOGY_SEARCH_UNSATISFIABLE);
  assert_int_equal(pcp_status_consume_code(pcp_topology_solver_parse_status(
                       pcp_make_cstring_view("(error \"x\")"), &status)),
                   PCP_STATUS_INTERNAL);

  uint32_t counts[1] = {2};
  uint32_t assignment[1];
  size_t assigned = 0;
  PCP_CHECK_OK(pcp_topology_solver_parse_model(
      pcp_make_cstring_view("((x_0_0 false) (x_0_1 true))"), 1, counts,
      assignment, &assigned));
  assert_int_equal(assigned, 1);
  assert_int_equal(assignment[0], 1);
  assert_int_equal(pcp_status_consume_code(pcp_topology_solver_parse_model(
                       pcp_make_cstring_view("((x_0_0 true) (x_0_1 true))"), 1,
                       counts, assignment, &assigned)),
                   PCP_STATUS_INTERNAL);
  assert_int_equal(pcp_status_consume_code(pcp_topology_solver_parse_model(
                       pcp_make_cstring_view("((x_3_0 true))"), 1, counts,
                       assignment, &assigned)),
                   PCP_STATUS_INTERNAL);

  uint32_t ids[4];
  size_t count = 0;
  PCP_CHECK_OK(pcp_topology_solver_parse_core(
      pcp_make_cstring_view("unsat\n(c_0 c_12)\n"), ids, 4, &count));
  assert_int_equal(count, 2);
  assert_int_equal(ids[0], 0);
  assert_int_equal(ids[1], 12);
}

// solver SMT-LIB export supports model and unsat-core queries
static void test_smt_export_model_and_core_queries(void** state) {
  (void)state;
  fixture_t f;
  fixture_two_solutions(&f);
  pcp_topology_smtlib_options_t options = pcp_topology_smtlib_options_default();
  options.timeout_ms = 1000;
  options.produce_unsat_cores = true;
  options.include_model_query = true;
  options.include_unsat_core_query = true;
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  PCP_CHECK_OK(pcp_topology_smtlib_write(&f.problem, options, &b));
  const char* text = pcp_string_builder_cstring(&b);
  assert_non_null(strstr(text, "(set-option :timeout 1000)"));
  assert_non_null(strstr(text, "(set-option :produce-unsat-cores true)"));
  assert_non_null(strstr(text, ":named c_0"));
  assert_non_null(strstr(text, "(get-value (x_0_0 x_0_1 x_1_0 x_1_1))"));
  assert_non_null(strstr(text, "(get-unsat-core)"));
  pcp_string_builder_deinitialize(&b);
  fixture_end(&f);
}

static const pcp_topology_solver_backend_t kBackends[] = {
    PCP_TOPOLOGY_SOLVER_BACKEND_Z3_LIBRARY,
    PCP_TOPOLOGY_SOLVER_BACKEND_Z3_BINARY,
};

// z3 solver finds and natively rechecks a carried decision map
static void test_z3_finds_and_rechecks_map(void** state) {
  (void)state;
  for (size_t i = 0; i < PCP_ARRAYSIZE(kBackends); ++i) {
    assert_true(pcp_topology_solver_available(kBackends[i]));
    fixture_t f;
    fixture_single_solution(&f);
    pcp_topology_solver_options_t options =
        pcp_topology_solver_options_default();
    options.backend = kBackends[i];
    pcp_topology_search_result_t result;
    pcp_topology_search_result_initialize(pcp_allocator_system(), &result);
    PCP_CHECK_OK(
        pcp_topology_decision_map_solve_z3(&f.problem, options, &result));
    assert_int_equal(result.status, PCP_TOPOLOGY_SEARCH_SATISFIABLE);
    assert_int_equal(result.solution_count, 1);
    PCP_CHECK_OK(pcp_topology_carried_decision_map_validate(
        f.execution, f.task, result.solutions[0]));
    pcp_topology_vertex_t target;
    pcp_topology_vertex_t p0 = vx(0, PCP_TOPOLOGY_LABEL_PROTOCOL, 0);
    assert_true(
        pcp_topology_vertex_map_lookup(result.solutions[0], &p0, &target));
    assert_int_equal(target.label.value, 0);
    pcp_topology_search_result_deinitialize(&result);
    fixture_end(&f);
  }
}

// z3 solver reports unsat and imports an unsat core
static void test_z3_reports_unsat_with_core(void** state) {
  (void)state;
  for (size_t i = 0; i < PCP_ARRAYSIZE(kBackends); ++i) {
    fixture_t f;
    fixture_local_unsat(&f);
    pcp_topology_solver_options_t options =
        pcp_topology_solver_options_default();
    options.backend = kBackends[i];
    pcp_topology_search_result_t result;
    pcp_topology_search_result_initialize(pcp_allocator_system(), &result);
    PCP_CHECK_OK(
        pcp_topology_decision_map_solve_z3(&f.problem, options, &result));
    assert_int_equal(result.status, PCP_TOPOLOGY_SEARCH_UNSATISFIABLE);
    assert_int_equal(result.unsat_reason,
                     PCP_TOPOLOGY_UNSAT_REASON_SOLVER_CORE);
    assert_true(result.core_name_count > 0);
    assert_int_equal(strncmp(result.core_names[0], "c_", 2), 0);
    assert_int_equal(result.core.count, 2);
    pcp_topology_search_result_deinitialize(&result);
    fixture_end(&f);

    // Empty candidates: the core is the one vertex asserted false.
    fixture_empty_candidates(&f);
    pcp_topology_search_result_initialize(pcp_allocator_system(), &result);
    PCP_CHECK_OK(
        pcp_topology_decision_map_solve_z3(&f.problem, options, &result));
    assert_int_equal(result.status, PCP_TOPOLOGY_SEARCH_UNSATISFIABLE);
    assert_int_equal(result.core.count, 1);
    assert_int_equal(result.core.items[0].color.number, 1);
    pcp_topology_search_result_deinitialize(&result);
    fixture_end(&f);
  }
}

// Z3 and the native search agree on every fixture.
static void test_z3_agrees_with_native_search(void** state) {
  (void)state;
  void (*fixtures[])(fixture_t*) = {fixture_single_solution,
                                    fixture_two_solutions, fixture_local_unsat,
                                    fixture_empty_candidates};
  for (size_t i = 0; i < PCP_ARRAYSIZE(fixtures); ++i) {
    fixture_t f;
    fixtures[i](&f);
    pcp_topology_search_result_t native, z3;
    pcp_topology_search_result_initialize(pcp_allocator_system(), &native);
    pcp_topology_search_result_initialize(pcp_allocator_system(), &z3);
    PCP_CHECK_OK(pcp_topology_decision_map_solve(
        &f.problem, pcp_topology_search_options_default(), &native));
    PCP_CHECK_OK(pcp_topology_decision_map_solve_z3(
        &f.problem, pcp_topology_solver_options_default(), &z3));
    assert_int_equal(native.status, z3.status);
    pcp_topology_search_result_deinitialize(&native);
    pcp_topology_search_result_deinitialize(&z3);
    fixture_end(&f);
  }
}

static void test_z3_binary_failure_is_a_status(void** state) {
  (void)state;
  fixture_t f;
  fixture_single_solution(&f);
  pcp_topology_solver_options_t options = pcp_topology_solver_options_default();
  options.backend = PCP_TOPOLOGY_SOLVER_BACKEND_Z3_BINARY;
  options.executable = "/nonexistent/z3";
  pcp_topology_search_result_t result;
  pcp_topology_search_result_initialize(pcp_allocator_system(), &result);
  assert_int_equal(pcp_status_consume_code(pcp_topology_decision_map_solve_z3(
                       &f.problem, options, &result)),
                   PCP_STATUS_INTERNAL);
  pcp_topology_search_result_deinitialize(&result);
  fixture_end(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_search_finds_carried_map),
      cmocka_unit_test(test_search_enumerates_multiple_maps),
      cmocka_unit_test(test_search_reports_local_unsat_core),
      cmocka_unit_test(test_search_reports_empty_candidate_core),
      cmocka_unit_test(test_search_limit_is_reported),
      cmocka_unit_test(test_search_exports_smt_constraints),
      cmocka_unit_test(test_solver_parser),
      cmocka_unit_test(test_smt_export_model_and_core_queries),
      cmocka_unit_test(test_z3_finds_and_rechecks_map),
      cmocka_unit_test(test_z3_reports_unsat_with_core),
      cmocka_unit_test(test_z3_agrees_with_native_search),
      cmocka_unit_test(test_z3_binary_failure_is_a_status),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
