// SPDX-License-Identifier: Apache-2.0
//
// Subdivision tests of reference s.6 (subdivision.zig), same names and
// expected numbers.

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "topology/complex_impl.h"

#define ALLOC pcp_allocator_system()

static pcp_topology_vertex_t P(uint32_t process) {
  return pcp_topology_make_vertex(
      pcp_topology_make_color(PCP_TOPOLOGY_COLOR_PROCESS, process),
      pcp_topology_make_label(PCP_TOPOLOGY_LABEL_INPUT, (int64_t)process));
}

// The standard simplex on processes 0..dim.
static pcp_topology_complex_t* standard_simplex(uint32_t dim) {
  pcp_topology_complex_t* complex = NULL;
  PCP_CHECK_OK(pcp_topology_complex_create(ALLOC, &complex));
  pcp_topology_vertex_t vs[8];
  for (uint32_t i = 0; i <= dim; ++i) vs[i] = P(i);
  PCP_CHECK_OK(pcp_topology_complex_add(
      complex, pcp_topology_make_simplex(vs, dim + 1), NULL));
  return complex;
}

static pcp_topology_subdivision_t* subdivide(
    const pcp_topology_complex_t* input, pcp_topology_subdivision_kind_t kind,
    uint32_t rounds) {
  pcp_topology_subdivision_t* sub = NULL;
  PCP_CHECK_OK(
      pcp_topology_subdivision_create(input, kind, rounds, ALLOC, &sub));
  return sub;
}

static void expect_counts(const pcp_topology_subdivision_t* sub,
                          size_t vertices, size_t facets) {
  size_t v = 0, f = 0;
  pcp_topology_subdivision_counts(sub, &v, &f);
  assert_int_equal(v, vertices);
  assert_int_equal(f, facets);
}

static void test_barycentric_subdivision_of_an_edge_has_two_subdivided_edges(
    void** state) {
  (void)state;
  pcp_topology_complex_t* edge = standard_simplex(1);
  pcp_topology_subdivision_t* sub =
      subdivide(edge, PCP_TOPOLOGY_SUBDIVISION_BARYCENTRIC, 1);
  expect_counts(sub, 3, 2);
  pcp_topology_carrier_checks_t checks = {true, true, true, false};
  PCP_CHECK_OK(pcp_topology_carrier_map_validate(
      pcp_topology_subdivision_carrier(sub), checks));
  pcp_topology_subdivision_release(sub);
  pcp_topology_complex_release(edge);
}

static void test_standard_chromatic_subdivision_of_an_edge_matches_the_book(
    void** state) {
  (void)state;
  pcp_topology_complex_t* edge = standard_simplex(1);
  pcp_topology_subdivision_t* sub =
      subdivide(edge, PCP_TOPOLOGY_SUBDIVISION_CHROMATIC, 1);
  expect_counts(sub, 4, 3);
  pcp_topology_carrier_checks_t checks = {true, true, true, true};
  PCP_CHECK_OK(pcp_topology_carrier_map_validate(
      pcp_topology_subdivision_carrier(sub), checks));
  pcp_topology_subdivision_release(sub);
  pcp_topology_complex_release(edge);
}

static void test_standard_chromatic_subdivision_of_a_triangle_has_12_13(
    void** state) {
  (void)state;
  pcp_topology_complex_t* triangle = standard_simplex(2);
  pcp_topology_subdivision_t* sub =
      subdivide(triangle, PCP_TOPOLOGY_SUBDIVISION_CHROMATIC, 1);
  expect_counts(sub, 12, 13);
  pcp_topology_subdivision_release(sub);
  pcp_topology_complex_release(triangle);
}

static void test_iterated_barycentric_subdivision_composes_carriers(
    void** state) {
  (void)state;
  pcp_topology_complex_t* edge = standard_simplex(1);
  pcp_topology_subdivision_t* sub =
      subdivide(edge, PCP_TOPOLOGY_SUBDIVISION_BARYCENTRIC, 2);
  expect_counts(sub, 5, 4);
  pcp_topology_carrier_checks_t checks = {true, false, true, false};
  PCP_CHECK_OK(pcp_topology_carrier_map_validate(
      pcp_topology_subdivision_carrier(sub), checks));
  pcp_topology_subdivision_vertex_info_t info;
  pcp_topology_subdivision_metadata(sub, 0, &info);
  assert_int_equal(info.round, 2);
  assert_int_equal(info.kind, PCP_TOPOLOGY_SUBDIVISION_BARYCENTRIC);
  // The carrier of the whole edge is all four small edges.
  pcp_topology_simplex_t whole = pcp_topology_complex_simplex(edge, 0);
  const pcp_topology_complex_t* image = pcp_topology_carrier_map_lookup(
      pcp_topology_subdivision_carrier(sub), whole);
  assert_non_null(image);
  size_t edges = 0;
  for (size_t i = 0; i < pcp_topology_complex_count(image); ++i) {
    if (pcp_topology_complex_simplex(image, i).count == 2)
      ++edges;
  }
  assert_int_equal(edges, 4);
  pcp_topology_subdivision_release(sub);
  pcp_topology_complex_release(edge);
}

static void test_subdivision_metadata_explains_chromatic_views(void** state) {
  (void)state;
  pcp_topology_complex_t* edge = standard_simplex(1);
  pcp_topology_subdivision_t* sub =
      subdivide(edge, PCP_TOPOLOGY_SUBDIVISION_CHROMATIC, 1);
  bool found = false;
  for (size_t i = 0; i < pcp_topology_subdivision_metadata_count(sub); ++i) {
    pcp_topology_subdivision_vertex_info_t info;
    pcp_topology_subdivision_metadata(sub, i, &info);
    assert_int_equal(info.ordinal, i);
    assert_true(info.has_source);
    assert_true(pcp_topology_color_equal(info.vertex.color, info.source.color));
    if (info.carrier.count == 2 &&
        pcp_topology_simplex_contains_vertex(info.carrier, &info.source)) {
      found = true;
    }
  }
  assert_true(found);
  pcp_topology_subdivision_release(sub);
  pcp_topology_complex_release(edge);
}

static void test_protocol_power_validator_accepts_chromatic_subdivisions(
    void** state) {
  (void)state;
  const size_t expected[3][2] = {{4, 3}, {12, 13}, {32, 75}};
  for (uint32_t dim = 1; dim <= 3; ++dim) {
    pcp_topology_complex_t* input = standard_simplex(dim);
    pcp_topology_subdivision_t* sub =
        subdivide(input, PCP_TOPOLOGY_SUBDIVISION_CHROMATIC, 1);
    pcp_topology_subdivision_options_t options =
        pcp_topology_subdivision_options_default();
    options.chromatic = true;
    options.check_kind = true;
    options.expected_kind = PCP_TOPOLOGY_SUBDIVISION_CHROMATIC;
    options.check_round = true;
    options.expected_round = 1;
    pcp_topology_subdivision_report_t report;
    PCP_CHECK_OK(pcp_topology_subdivision_validate(sub, options, &report));
    assert_int_equal(report.vertex_count, expected[dim - 1][0]);
    assert_int_equal(report.top_facet_count, expected[dim - 1][1]);
    assert_int_equal(report.metadata_count, report.vertex_count);
    assert_true(report.face_restriction_checks > 0);
    assert_true(report.boundary_checks > 0);
    assert_true(report.link_checks > 0);
    pcp_topology_subdivision_release(sub);
    pcp_topology_complex_release(input);
  }
}

static void test_protocol_power_validator_checks_barycentric_tetrahedron(
    void** state) {
  (void)state;
  pcp_topology_complex_t* input = standard_simplex(3);
  pcp_topology_subdivision_t* sub =
      subdivide(input, PCP_TOPOLOGY_SUBDIVISION_BARYCENTRIC, 1);
  pcp_topology_subdivision_report_t report;
  PCP_CHECK_OK(pcp_topology_subdivision_validate(
      sub, pcp_topology_subdivision_options_default(), &report));
  assert_int_equal(report.vertex_count, 15);
  assert_int_equal(report.top_facet_count, 24);
  assert_true(report.boundary_checks >= 11);
  assert_true(report.link_checks > 0);
  // A wrong expectation is reported, not ignored.
  pcp_topology_subdivision_options_t options =
      pcp_topology_subdivision_options_default();
  options.check_kind = true;
  options.expected_kind = PCP_TOPOLOGY_SUBDIVISION_CHROMATIC;
  pcp_status_t status =
      pcp_topology_subdivision_validate(sub, options, &report);
  assert_int_equal(pcp_topology_status_error(status),
                   PCP_TOPOLOGY_ERROR_SUBDIVISION_METADATA_MISMATCH);
  pcp_status_ignore(status);
  pcp_topology_subdivision_release(sub);
  pcp_topology_complex_release(input);
}

static void test_protocol_power_validator_accepts_mixed_complex_subdivisions(
    void** state) {
  (void)state;
  pcp_topology_complex_t* input = NULL;
  PCP_CHECK_OK(pcp_topology_complex_create(ALLOC, &input));
  pcp_topology_vertex_t abc[] = {P(0), P(1), P(2)};
  pcp_topology_vertex_t cd[] = {P(2), P(3)};
  PCP_CHECK_OK(
      pcp_topology_complex_add(input, pcp_topology_make_simplex(abc, 3), NULL));
  PCP_CHECK_OK(
      pcp_topology_complex_add(input, pcp_topology_make_simplex(cd, 2), NULL));
  pcp_topology_subdivision_t* sub =
      subdivide(input, PCP_TOPOLOGY_SUBDIVISION_CHROMATIC, 1);
  pcp_topology_subdivision_report_t report;
  PCP_CHECK_OK(pcp_topology_subdivision_validate(
      sub, pcp_topology_subdivision_options_default(), &report));
  assert_true(report.vertex_count > 12);
  assert_true(report.top_facet_count >= 13);
  assert_true(report.boundary_checks > 0);
  pcp_topology_subdivision_release(sub);
  pcp_topology_complex_release(input);
}

static void test_iterated_subdivision_equivalence_checks_bounded_rounds(
    void** state) {
  (void)state;
  pcp_topology_complex_t* triangle = standard_simplex(2);
  PCP_CHECK_OK(pcp_topology_subdivision_validate_iterated(
      triangle, PCP_TOPOLOGY_SUBDIVISION_BARYCENTRIC, 2, ALLOC));
  PCP_CHECK_OK(pcp_topology_subdivision_validate_iterated(
      triangle, PCP_TOPOLOGY_SUBDIVISION_CHROMATIC, 2, ALLOC));
  pcp_topology_subdivision_t* sub =
      subdivide(triangle, PCP_TOPOLOGY_SUBDIVISION_CHROMATIC, 2);
  expect_counts(sub, 99, 169);
  pcp_topology_subdivision_release(sub);
  pcp_topology_complex_release(triangle);
}

static void test_identity_subdivision_keeps_the_input(void** state) {
  (void)state;
  pcp_topology_complex_t* triangle = standard_simplex(2);
  pcp_topology_subdivision_t* sub =
      subdivide(triangle, PCP_TOPOLOGY_SUBDIVISION_CHROMATIC, 0);
  assert_int_equal(pcp_topology_subdivision_kind(sub),
                   PCP_TOPOLOGY_SUBDIVISION_IDENTITY);
  expect_counts(sub, 3, 1);
  pcp_topology_subdivision_report_t report;
  pcp_topology_subdivision_options_t options =
      pcp_topology_subdivision_options_default();
  options.chromatic = true;
  PCP_CHECK_OK(pcp_topology_subdivision_validate(sub, options, &report));
  pcp_topology_subdivision_release(sub);
  pcp_topology_complex_release(triangle);
}

// Runs the whole core pipeline on an edge with |allocator|: subdivision
// (carrier, metadata), validation, Betti numbers, a vertex map check.
static pcp_status_t pipeline(pcp_allocator_t allocator) {
  pcp_topology_complex_t* edge = NULL;
  pcp_topology_subdivision_t* sub = NULL;
  pcp_topology_vertex_map_t* map = NULL;
  pcp_status_t status = pcp_topology_complex_create(allocator, &edge);
  if (!status) {
    pcp_topology_vertex_t vs[] = {P(0), P(1), P(2)};
    status =
        pcp_topology_complex_add(edge, pcp_topology_make_simplex(vs, 3), NULL);
  }
  if (!status) {
    status = pcp_topology_subdivision_create(
        edge, PCP_TOPOLOGY_SUBDIVISION_CHROMATIC, 1, allocator, &sub);
  }
  pcp_topology_subdivision_report_t report;
  if (!status) {
    status = pcp_topology_subdivision_validate(
        sub, pcp_topology_subdivision_options_default(), &report);
  }
  pcp_topology_betti_t betti;
  if (!status) {
    status = pcp_topology_complex_betti(pcp_topology_subdivision_complex(sub),
                                        3, &betti);
  }
  if (!status) {
    // The carrier map (vertex -> its first metadata source) as a vertex map.
    status = pcp_topology_vertex_map_create(
        pcp_topology_subdivision_complex(sub), edge, allocator, &map);
  }
  for (size_t i = 0;
       !status && i < pcp_topology_subdivision_metadata_count(sub); ++i) {
    pcp_topology_subdivision_vertex_info_t info;
    pcp_topology_subdivision_metadata(sub, i, &info);
    status = pcp_topology_vertex_map_set(map, &info.vertex, &info.source);
  }
  if (!status) {
    pcp_topology_vertex_map_checks_t checks = {true, false};
    status = pcp_topology_vertex_map_validate(map, checks);
  }
  // Homology of the collapse onto the input, with its witness.
  pcp_topology_homology_map_report_t homology;
  if (!status)
    status = pcp_topology_homology_map_check(map, 2, &homology);
  pcp_topology_homology_witness_t witness;
  pcp_topology_homology_witness_initialize(allocator, &witness);
  if (!status)
    status = pcp_topology_homology_map_witness_find(map, 2, &witness);
  pcp_topology_homology_witness_deinitialize(&witness);
  // delta o Xi subset Delta with Xi = Delta = the subdivision carrier and
  // delta the identity on the subdivided complex.
  pcp_topology_vertex_map_t* identity = NULL;
  const pcp_topology_complex_t* complex =
      sub ? pcp_topology_subdivision_complex(sub) : NULL;
  if (!status) {
    status =
        pcp_topology_vertex_map_create(complex, complex, allocator, &identity);
  }
  for (size_t i = 0;
       !status && i < pcp_topology_subdivision_metadata_count(sub); ++i) {
    pcp_topology_subdivision_vertex_info_t info;
    pcp_topology_subdivision_metadata(sub, i, &info);
    status = pcp_topology_vertex_map_set(identity, &info.vertex, &info.vertex);
  }
  if (!status) {
    status = pcp_topology_carried_decision_map_validate(
        pcp_topology_subdivision_carrier(sub),
        pcp_topology_subdivision_carrier(sub), identity);
  }
  // Paths, the edge-path group, DOT, boundary, link, join.
  pcp_topology_vertex_list_t path;
  pcp_topology_vertex_list_initialize(allocator, &path);
  if (!status) {
    pcp_topology_subdivision_vertex_info_t first, last;
    pcp_topology_subdivision_metadata(sub, 0, &first);
    pcp_topology_subdivision_metadata(
        sub, pcp_topology_subdivision_metadata_count(sub) - 1, &last);
    status =
        pcp_topology_complex_path(complex, &first.vertex, &last.vertex, &path);
  }
  pcp_topology_vertex_list_deinitialize(&path);
  pcp_topology_fundamental_group_t group;
  pcp_topology_fundamental_group_initialize(allocator, &group);
  if (!status)
    status = pcp_topology_fundamental_group_compute(complex, &group);
  pcp_topology_fundamental_group_deinitialize(&group);
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(allocator, 0, &builder);
  if (!status)
    status = pcp_topology_complex_format_dot(complex, "x", &builder);
  pcp_string_builder_deinitialize(&builder);
  pcp_topology_complex_t* out = NULL;
  if (!status)
    status = pcp_topology_complex_create(allocator, &out);
  if (!status)
    status = pcp_topology_complex_boundary(complex, out);
  if (!status) {
    pcp_topology_subdivision_vertex_info_t first;
    pcp_topology_subdivision_metadata(sub, 0, &first);
    status = pcp_topology_complex_link(
        complex, pcp_topology_make_simplex(&first.vertex, 1), out);
  }
  pcp_topology_complex_t* point = NULL;
  if (!status)
    status = pcp_topology_complex_create(allocator, &point);
  if (!status) {
    pcp_topology_vertex_t far = P(7);
    status = pcp_topology_complex_add(point, pcp_topology_make_simplex(&far, 1),
                                      NULL);
  }
  if (!status)
    status = pcp_topology_complex_join(edge, point, out);
  pcp_topology_complex_release(point);
  pcp_topology_complex_release(out);
  pcp_topology_vertex_map_release(identity);
  pcp_topology_vertex_map_release(map);
  pcp_topology_subdivision_release(sub);
  pcp_topology_complex_release(edge);
  return status;
}

// Iterated barycentric rounds, their equivalence check, carrier calculus and
// the subcomplex operations.
static pcp_status_t pipeline_iterated(pcp_allocator_t allocator) {
  pcp_topology_complex_t* edge = NULL;
  pcp_topology_subdivision_t* sub = NULL;
  pcp_topology_carrier_map_t* restricted = NULL;
  pcp_topology_complex_t* a = NULL;
  pcp_topology_complex_t* b = NULL;
  pcp_topology_complex_t* out = NULL;
  pcp_status_t status = pcp_topology_complex_create(allocator, &edge);
  if (!status)
    status = pcp_topology_complex_create(allocator, &a);
  if (!status)
    status = pcp_topology_complex_create(allocator, &b);
  if (!status)
    status = pcp_topology_complex_create(allocator, &out);
  pcp_topology_vertex_t vs[] = {P(0), P(1), P(2)};
  if (!status) {
    status =
        pcp_topology_complex_add(edge, pcp_topology_make_simplex(vs, 3), NULL);
  }
  if (!status) {
    status = pcp_topology_subdivision_create(
        edge, PCP_TOPOLOGY_SUBDIVISION_BARYCENTRIC, 2, allocator, &sub);
  }
  if (!status) {
    status = pcp_topology_subdivision_validate_iterated(
        edge, PCP_TOPOLOGY_SUBDIVISION_CHROMATIC, 2, allocator);
  }
  pcp_topology_connectivity_obstruction_t obstruction;
  if (!status) {
    status = pcp_topology_connectivity_obstruction_find(
        pcp_topology_subdivision_carrier(sub),
        pcp_topology_subdivision_carrier(sub), &obstruction, NULL);
  }
  if (!status) {
    status =
        pcp_topology_complex_add(a, pcp_topology_make_simplex(vs, 2), NULL);
  }
  if (!status) {
    status =
        pcp_topology_complex_add(b, pcp_topology_make_simplex(vs + 1, 2), NULL);
  }
  if (!status) {
    status = pcp_topology_carrier_map_restrict(
        pcp_topology_subdivision_carrier(sub), a, allocator, &restricted);
  }
  if (!status)
    status = pcp_topology_carrier_map_image(restricted, out);
  if (!status)
    status = pcp_topology_subcomplex_union(a, b, out);
  if (!status)
    status = pcp_topology_subcomplex_intersection(a, b, out);
  if (!status)
    status = pcp_topology_subcomplex_difference(a, b, out);
  if (!status) {
    status = pcp_topology_complex_closed_star(
        edge, pcp_topology_make_simplex(vs, 1), out);
  }
  pcp_topology_carrier_map_release(restricted);
  pcp_topology_subdivision_release(sub);
  pcp_topology_complex_release(out);
  pcp_topology_complex_release(b);
  pcp_topology_complex_release(a);
  pcp_topology_complex_release(edge);
  return status;
}

typedef pcp_status_t (*pipeline_fn_t)(pcp_allocator_t allocator);

// Fails every allocation index of |fn| in turn (SQLite-style OOM sweep):
// each run must end in a status, never a crash, and leave nothing allocated.
static void sweep(pipeline_fn_t fn) {
  pcp_allocator_counting_t counter;
  pcp_allocator_counting_initialize(pcp_allocator_system(), &counter);
  PCP_CHECK_OK(fn(pcp_allocator_counting(&counter)));
  int64_t total = counter.allocation_count;
  assert_int_equal(counter.live_bytes, 0);
  for (int64_t n = 0; n < total; ++n) {
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_system(), n, true, &failing);
    pcp_allocator_counting_t live;
    pcp_allocator_counting_initialize(pcp_allocator_failing(&failing), &live);
    pcp_status_t status = fn(pcp_allocator_counting(&live));
    assert_true(status != NULL);
    pcp_status_ignore(status);
    assert_int_equal(live.live_bytes, 0);
  }
}

static void test_allocation_failures_anywhere_in_the_pipeline(void** state) {
  (void)state;
  sweep(pipeline);
  sweep(pipeline_iterated);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(
          test_barycentric_subdivision_of_an_edge_has_two_subdivided_edges),
      cmocka_unit_test(
          test_standard_chromatic_subdivision_of_an_edge_matches_the_book),
      cmocka_unit_test(
          test_standard_chromatic_subdivision_of_a_triangle_has_12_13),
      cmocka_unit_test(test_iterated_barycentric_subdivision_composes_carriers),
      cmocka_unit_test(test_subdivision_metadata_explains_chromatic_views),
      cmocka_unit_test(
          test_protocol_power_validator_accepts_chromatic_subdivisions),
      cmocka_unit_test(
          test_protocol_power_validator_checks_barycentric_tetrahedron),
      cmocka_unit_test(
          test_protocol_power_validator_accepts_mixed_complex_subdivisions),
      cmocka_unit_test(
          test_iterated_subdivision_equivalence_checks_bounded_rounds),
      cmocka_unit_test(test_identity_subdivision_keeps_the_input),
      cmocka_unit_test(test_allocation_failures_anywhere_in_the_pipeline),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
