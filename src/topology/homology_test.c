// SPDX-License-Identifier: Apache-2.0
//
// Homology tests: the invariants.zig cases of reference s.6 with the same
// expected numbers, Betti numbers of classic triangulations over several
// fields (where GF(2) and GF(3) differ for non-orientable surfaces), and the
// DOT export.

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <stdlib.h>
#include <string.h>

#include "topology/complex_impl.h"

#define ALLOC pcp_allocator_system()

// Vertex i of a triangulation: its own colour, so every simplex is
// chromatic.
static pcp_topology_vertex_t V(uint32_t i) {
  return pcp_topology_make_vertex(
      pcp_topology_make_color(PCP_TOPOLOGY_COLOR_PROCESS, i),
      pcp_topology_make_label(PCP_TOPOLOGY_LABEL_INPUT, 0));
}

static pcp_topology_complex_t* make_complex(void) {
  pcp_topology_complex_t* complex = NULL;
  PCP_CHECK_OK(pcp_topology_complex_create(ALLOC, &complex));
  return complex;
}

static void add_ids(pcp_topology_complex_t* complex, const uint32_t* ids,
                    size_t count) {
  pcp_topology_vertex_t vs[8];
  for (size_t i = 0; i < count; ++i) vs[i] = V(ids[i]);
  PCP_CHECK_OK(pcp_topology_complex_add(
      complex, pcp_topology_make_simplex(vs, count), NULL));
}
#define ADD(complex, ...)                             \
  add_ids((complex), (const uint32_t[]){__VA_ARGS__}, \
          sizeof((const uint32_t[]){__VA_ARGS__}) / sizeof(uint32_t))

static void expect_betti(const pcp_topology_complex_t* complex, uint32_t prime,
                         const uint64_t* expected, uint32_t count) {
  pcp_topology_betti_t betti;
  PCP_CHECK_OK(pcp_topology_complex_betti(complex, prime, &betti));
  assert_int_equal(betti.count, count);
  for (uint32_t k = 0; k < count; ++k) {
    if (betti.values[k] != expected[k]) {
      print_error("p=%u b%u = %llu, expected %llu\n", prime, k,
                  (unsigned long long)betti.values[k],
                  (unsigned long long)expected[k]);
    }
    assert_int_equal(betti.values[k], expected[k]);
  }
}
#define EXPECT_BETTI(complex, prime, ...)                           \
  expect_betti((complex), (prime), (const uint64_t[]){__VA_ARGS__}, \
               sizeof((const uint64_t[]){__VA_ARGS__}) / sizeof(uint64_t))

static void expect_error(pcp_status_t status, pcp_topology_error_t error) {
  assert_int_equal(pcp_topology_status_error(status), error);
  pcp_status_ignore(status);
}

//===----------------------------------------------------------------------===//
// invariants.zig
//===----------------------------------------------------------------------===//

static void test_one_skeleton_adjacency_components_and_path_witnesses(
    void** state) {
  (void)state;
  pcp_topology_complex_t* complex = make_complex();
  ADD(complex, 0, 1);
  ADD(complex, 1, 2);
  pcp_topology_vertex_list_t vertices;
  pcp_topology_vertex_list_initialize(ALLOC, &vertices);
  PCP_CHECK_OK(pcp_topology_complex_vertices(complex, &vertices));
  assert_int_equal(vertices.count, 3);
  size_t components = 0;
  PCP_CHECK_OK(pcp_topology_complex_component_count(complex, &components));
  assert_int_equal(components, 1);
  pcp_topology_vertex_t a = V(0), c = V(2);
  PCP_CHECK_OK(pcp_topology_complex_path(complex, &a, &c, &vertices));
  assert_int_equal(vertices.count, 3);
  assert_int_equal(vertices.items[0].color.number, 0);
  assert_int_equal(vertices.items[1].color.number, 1);
  assert_int_equal(vertices.items[2].color.number, 2);
  pcp_topology_vertex_t stray = V(9);
  expect_error(pcp_topology_complex_path(complex, &stray, &c, &vertices),
               PCP_TOPOLOGY_ERROR_SOURCE_VERTEX_OUTSIDE_COMPLEX);
  expect_error(pcp_topology_complex_path(complex, &a, &stray, &vertices),
               PCP_TOPOLOGY_ERROR_TARGET_VERTEX_OUTSIDE_COMPLEX);
  pcp_topology_vertex_list_deinitialize(&vertices);
  pcp_topology_complex_release(complex);
}

static void test_components_detect_disconnected_one_skeletons(void** state) {
  (void)state;
  pcp_topology_complex_t* complex = make_complex();
  ADD(complex, 0, 1);
  ADD(complex, 2, 3);
  size_t components = 0;
  PCP_CHECK_OK(pcp_topology_complex_component_count(complex, &components));
  assert_int_equal(components, 2);
  pcp_topology_vertex_list_t path;
  pcp_topology_vertex_list_initialize(ALLOC, &path);
  pcp_topology_vertex_t a = V(0), d = V(3);
  expect_error(pcp_topology_complex_path(complex, &a, &d, &path),
               PCP_TOPOLOGY_ERROR_NO_PATH);
  pcp_topology_vertex_list_deinitialize(&path);
  pcp_topology_complex_t* empty = make_complex();
  PCP_CHECK_OK(pcp_topology_complex_component_count(empty, &components));
  assert_int_equal(components, 0);
  pcp_topology_complex_release(empty);
  pcp_topology_complex_release(complex);
}

static void test_k_skeleton_extraction_returns_the_requested_subcomplex(
    void** state) {
  (void)state;
  pcp_topology_complex_t* complex = make_complex();
  ADD(complex, 0, 1, 2, 3);
  pcp_topology_complex_t* skeleton = make_complex();
  PCP_CHECK_OK(pcp_topology_complex_skeleton(complex, 1, skeleton));
  // Empty face, 4 vertices, 6 edges.
  assert_int_equal(pcp_topology_complex_count(skeleton), 11);
  assert_int_equal(pcp_topology_complex_dimension(skeleton), 1);
  EXPECT_BETTI(skeleton, 2, 1, 3);
  PCP_CHECK_OK(pcp_topology_complex_skeleton(complex, 2, skeleton));
  EXPECT_BETTI(skeleton, 2, 1, 0, 1);  // the 2-sphere
  pcp_topology_complex_release(skeleton);
  pcp_topology_complex_release(complex);
}

static void test_betti_numbers_distinguish_interval_circle_and_triangle(
    void** state) {
  (void)state;
  pcp_topology_complex_t* interval = make_complex();
  ADD(interval, 0, 1);
  EXPECT_BETTI(interval, 2, 1, 0);
  pcp_topology_complex_t* circle = make_complex();
  ADD(circle, 0, 1);
  ADD(circle, 1, 2);
  ADD(circle, 0, 2);
  EXPECT_BETTI(circle, 2, 1, 1);
  pcp_topology_complex_t* filled = make_complex();
  ADD(filled, 0, 1, 2);
  EXPECT_BETTI(filled, 2, 1, 0, 0);
  pcp_topology_complex_t* empty = make_complex();
  pcp_topology_betti_t betti;
  PCP_CHECK_OK(pcp_topology_complex_betti(empty, 2, &betti));
  assert_int_equal(betti.count, 0);
  pcp_topology_complex_release(empty);
  pcp_topology_complex_release(interval);
  pcp_topology_complex_release(circle);
  pcp_topology_complex_release(filled);
}

static void test_betti_numbers_require_a_prime_field(void** state) {
  (void)state;
  pcp_topology_complex_t* interval = make_complex();
  ADD(interval, 0, 1);
  pcp_topology_betti_t betti;
  expect_error(pcp_topology_complex_betti(interval, 1, &betti),
               PCP_TOPOLOGY_ERROR_INVALID_FIELD_PRIME);
  expect_error(pcp_topology_complex_betti(interval, 4, &betti),
               PCP_TOPOLOGY_ERROR_INVALID_FIELD_PRIME);
  expect_error(pcp_topology_complex_betti(interval, 65537, &betti),
               PCP_TOPOLOGY_ERROR_INVALID_FIELD_PRIME);
  PCP_CHECK_OK(pcp_topology_complex_betti(interval, 65521, &betti));
  pcp_topology_complex_release(interval);
}

static pcp_topology_vertex_map_t* map_by_ids(
    const pcp_topology_complex_t* domain,
    const pcp_topology_complex_t* codomain, const uint32_t* targets,
    uint32_t count) {
  pcp_topology_vertex_map_t* map = NULL;
  PCP_CHECK_OK(pcp_topology_vertex_map_create(domain, codomain, ALLOC, &map));
  for (uint32_t i = 0; i < count; ++i) {
    pcp_topology_vertex_t s = V(i), t = V(targets[i]);
    PCP_CHECK_OK(pcp_topology_vertex_map_set(map, &s, &t));
  }
  return map;
}

static void test_homology_map_report_detects_cycle_collapse(void** state) {
  (void)state;
  pcp_topology_complex_t* circle = make_complex();
  ADD(circle, 0, 1);
  ADD(circle, 1, 2);
  ADD(circle, 0, 2);
  pcp_topology_complex_t* point = make_complex();
  ADD(point, 7);
  const uint32_t targets[] = {7, 7, 7};
  pcp_topology_vertex_map_t* map = map_by_ids(circle, point, targets, 3);
  pcp_topology_homology_map_report_t report;
  PCP_CHECK_OK(pcp_topology_homology_map_check(map, 2, &report));
  assert_int_equal(report.source_betti.values[1], 1);
  assert_int_equal(report.image_betti.count, 1);
  assert_int_equal(report.induced_ranks[0], 1);
  assert_int_equal(report.induced_ranks[1], 0);
  assert_false(report.preserves_betti);
  assert_false(report.preserves_homology);
  pcp_topology_vertex_map_release(map);
  pcp_topology_complex_release(point);
  pcp_topology_complex_release(circle);
}

static pcp_topology_complex_t* cycle_graph(uint32_t n) {
  pcp_topology_complex_t* complex = make_complex();
  for (uint32_t i = 0; i < n; ++i) ADD(complex, i, (i + 1) % n);
  return complex;
}

static void test_homology_map_report_detects_same_betti_cycle_cancellation(
    void** state) {
  (void)state;
  // The hexagon wraps twice around the triangle: degree 2, zero over GF(2).
  pcp_topology_complex_t* hexagon = cycle_graph(6);
  pcp_topology_complex_t* triangle = cycle_graph(3);
  const uint32_t targets[] = {0, 1, 2, 0, 1, 2};
  pcp_topology_vertex_map_t* map = map_by_ids(hexagon, triangle, targets, 6);
  pcp_topology_homology_map_report_t report;
  PCP_CHECK_OK(pcp_topology_homology_map_check(map, 2, &report));
  assert_true(report.preserves_betti);
  assert_false(report.preserves_homology);
  assert_int_equal(report.induced_ranks[1], 0);
  // Over GF(3) degree 2 is invertible, so the same map preserves homology.
  PCP_CHECK_OK(pcp_topology_homology_map_check(map, 3, &report));
  assert_true(report.preserves_homology);
  assert_int_equal(report.induced_ranks[1], 1);
  pcp_topology_vertex_map_release(map);
  pcp_topology_complex_release(triangle);
  pcp_topology_complex_release(hexagon);
}

static void test_homology_map_witness_identifies_a_source_cycle_lost(
    void** state) {
  (void)state;
  // The triangle boundary projects onto one edge.
  pcp_topology_complex_t* circle = cycle_graph(3);
  pcp_topology_complex_t* edge = make_complex();
  ADD(edge, 0, 1);
  const uint32_t targets[] = {0, 1, 1};
  pcp_topology_vertex_map_t* map = map_by_ids(circle, edge, targets, 3);
  pcp_topology_homology_witness_t witness;
  pcp_topology_homology_witness_initialize(ALLOC, &witness);
  PCP_CHECK_OK(pcp_topology_homology_map_witness_find(map, 2, &witness));
  assert_int_equal(witness.kind,
                   PCP_TOPOLOGY_HOMOLOGY_WITNESS_SOURCE_CYCLE_LOST);
  assert_int_equal(witness.dimension, 1);
  assert_int_equal(witness.source_chain.count, 3);
  assert_int_equal(witness.image_chain.count, 0);
  assert_int_equal(pcp_topology_chain_simplex(&witness.source_chain, 0).count,
                   2);
  pcp_topology_homology_witness_deinitialize(&witness);
  pcp_topology_vertex_map_release(map);
  pcp_topology_complex_release(edge);
  pcp_topology_complex_release(circle);
}

static void test_homology_map_witness_identifies_an_image_cycle_created(
    void** state) {
  (void)state;
  // The path a0..a3 closes up when a3 lands on a0's image.
  pcp_topology_complex_t* path = make_complex();
  ADD(path, 0, 1);
  ADD(path, 1, 2);
  ADD(path, 2, 3);
  pcp_topology_complex_t* triangle = cycle_graph(3);
  const uint32_t targets[] = {0, 1, 2, 0};
  pcp_topology_vertex_map_t* map = map_by_ids(path, triangle, targets, 4);
  pcp_topology_homology_witness_t witness;
  pcp_topology_homology_witness_initialize(ALLOC, &witness);
  PCP_CHECK_OK(pcp_topology_homology_map_witness_find(map, 2, &witness));
  assert_int_equal(witness.kind,
                   PCP_TOPOLOGY_HOMOLOGY_WITNESS_IMAGE_CYCLE_CREATED);
  assert_int_equal(witness.image_chain.count, 3);
  assert_int_equal(witness.source_chain.count, 0);
  // A homology-preserving map has no witness.
  pcp_topology_complex_t* same = cycle_graph(3);
  const uint32_t identity[] = {0, 1, 2};
  pcp_topology_vertex_map_t* iso = map_by_ids(triangle, same, identity, 3);
  PCP_CHECK_OK(pcp_topology_homology_map_witness_find(iso, 2, &witness));
  assert_int_equal(witness.kind, PCP_TOPOLOGY_HOMOLOGY_WITNESS_NONE);
  pcp_topology_vertex_map_release(iso);
  pcp_topology_complex_release(same);
  pcp_topology_homology_witness_deinitialize(&witness);
  pcp_topology_vertex_map_release(map);
  pcp_topology_complex_release(triangle);
  pcp_topology_complex_release(path);
}

static void test_fundamental_group_presentation_exposes_generators_and_relators(
    void** state) {
  (void)state;
  pcp_topology_fundamental_group_t group;
  pcp_topology_fundamental_group_initialize(ALLOC, &group);
  pcp_topology_complex_t* circle = cycle_graph(3);
  PCP_CHECK_OK(pcp_topology_fundamental_group_compute(circle, &group));
  assert_int_equal(group.generator_count, 1);
  assert_int_equal(group.relator_count, 0);
  pcp_topology_complex_t* filled = make_complex();
  ADD(filled, 0, 1, 2);
  PCP_CHECK_OK(pcp_topology_fundamental_group_compute(filled, &group));
  assert_int_equal(group.generator_count, 1);
  assert_int_equal(group.relator_count, 1);
  assert_int_equal(pcp_topology_fundamental_group_relator_length(&group, 0), 1);
  // The generator is the edge that closed the cycle, low -> high.
  assert_int_equal(group.generators[0].from.color.number, 1);
  assert_int_equal(group.generators[0].to.color.number, 2);
  pcp_topology_complex_t* solid = make_complex();
  ADD(solid, 0, 1, 2, 3);
  expect_error(pcp_topology_fundamental_group_compute(solid, &group),
               PCP_TOPOLOGY_ERROR_COMPLEX_DIMENSION_TOO_HIGH);
  pcp_topology_fundamental_group_deinitialize(&group);
  pcp_topology_complex_release(solid);
  pcp_topology_complex_release(filled);
  pcp_topology_complex_release(circle);
}

static void test_connectivity_obstruction_reports_disconnected_output(
    void** state) {
  (void)state;
  // I = P = an edge; O = two isolated decisions; Delta(edge) = both points.
  pcp_topology_complex_t* input = make_complex();
  ADD(input, 0, 1);
  pcp_topology_complex_t* output = make_complex();
  ADD(output, 0);
  ADD(output, 1);
  pcp_topology_carrier_map_t* xi = NULL;
  pcp_topology_carrier_map_t* delta = NULL;
  PCP_CHECK_OK(pcp_topology_carrier_map_create(input, input, ALLOC, &xi));
  PCP_CHECK_OK(pcp_topology_carrier_map_create(input, output, ALLOC, &delta));
  pcp_topology_complex_t* faces = make_complex();
  PCP_CHECK_OK(pcp_topology_complex_faces(input, faces));
  pcp_topology_complex_t* image = make_complex();
  for (size_t i = 0; i < pcp_topology_complex_count(faces); ++i) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, i);
    pcp_topology_complex_clear(image);
    PCP_CHECK_OK(pcp_topology_complex_add(image, face, NULL));
    PCP_CHECK_OK(pcp_topology_carrier_map_set(xi, face, image));
    pcp_topology_complex_clear(image);
    for (uint32_t v = 0; v < face.count; ++v) {
      PCP_CHECK_OK(pcp_topology_complex_add(
          image, pcp_topology_make_simplex(&face.vertices[v], 1), NULL));
    }
    if (face.count == 0) {
      PCP_CHECK_OK(pcp_topology_complex_add(image, face, NULL));
    }
    PCP_CHECK_OK(pcp_topology_carrier_map_set(delta, face, image));
  }
  pcp_topology_connectivity_obstruction_t obstruction;
  pcp_topology_vertex_list_t face;
  pcp_topology_vertex_list_initialize(ALLOC, &face);
  PCP_CHECK_OK(pcp_topology_connectivity_obstruction_find(xi, delta,
                                                          &obstruction, &face));
  assert_true(obstruction.found);
  assert_int_equal(obstruction.protocol_components, 1);
  assert_int_equal(obstruction.output_components, 2);
  assert_int_equal(face.count, 2);
  // Xi into itself has no such face.
  PCP_CHECK_OK(
      pcp_topology_connectivity_obstruction_find(xi, xi, &obstruction, NULL));
  assert_false(obstruction.found);
  pcp_topology_vertex_list_deinitialize(&face);
  pcp_topology_complex_release(image);
  pcp_topology_complex_release(faces);
  pcp_topology_carrier_map_release(delta);
  pcp_topology_carrier_map_release(xi);
  pcp_topology_complex_release(output);
  pcp_topology_complex_release(input);
}

//===----------------------------------------------------------------------===//
// Classic triangulations over several fields
//===----------------------------------------------------------------------===//

static pcp_topology_complex_t* sphere_boundary(uint32_t dim) {
  // The boundary of the (dim+1)-simplex is a dim-sphere.
  pcp_topology_complex_t* complex = make_complex();
  uint32_t ids[8];
  for (uint32_t omit = 0; omit <= dim + 1; ++omit) {
    uint32_t n = 0;
    for (uint32_t i = 0; i <= dim + 1; ++i) {
      if (i != omit)
        ids[n++] = i;
    }
    add_ids(complex, ids, n);
  }
  return complex;
}

// An n x n grid of squares, each cut into two triangles, with the sides
// identified: a torus, or a Klein bottle when the vertical gluing flips.
static pcp_topology_complex_t* grid_surface(uint32_t n, bool twisted) {
  pcp_topology_complex_t* complex = make_complex();
  for (uint32_t i = 0; i < n; ++i) {
    for (uint32_t j = 0; j < n; ++j) {
      uint32_t corner[4];
      const uint32_t di[4] = {0, 1, 0, 1};
      const uint32_t dj[4] = {0, 0, 1, 1};
      for (int c = 0; c < 4; ++c) {
        uint32_t x = i + di[c];
        uint32_t y = j + dj[c];
        if (y == n) {
          y = 0;
          if (twisted)
            x = (n - x % n) % n;
        }
        x %= n;
        corner[c] = x * n + y;
      }
      ADD(complex, corner[0], corner[1], corner[3]);
      ADD(complex, corner[0], corner[2], corner[3]);
    }
  }
  return complex;
}

static pcp_topology_complex_t* projective_plane(void) {
  // The 6-vertex RP^2 (half an icosahedron).
  static const uint32_t kFacets[10][3] = {
      {1, 2, 3}, {1, 3, 4}, {1, 4, 5}, {1, 5, 6}, {1, 6, 2},
      {2, 3, 5}, {3, 4, 6}, {4, 5, 2}, {5, 6, 3}, {6, 2, 4},
  };
  pcp_topology_complex_t* complex = make_complex();
  for (int i = 0; i < 10; ++i) add_ids(complex, kFacets[i], 3);
  return complex;
}

static void test_betti_numbers_of_spheres_in_several_dimensions(void** state) {
  (void)state;
  pcp_topology_complex_t* s1 = sphere_boundary(1);
  pcp_topology_complex_t* s2 = sphere_boundary(2);
  pcp_topology_complex_t* s4 = sphere_boundary(4);
  const uint32_t primes[] = {2, 3, 5, 65521};
  for (size_t i = 0; i < PCP_ARRAYSIZE(primes); ++i) {
    EXPECT_BETTI(s1, primes[i], 1, 1);
    EXPECT_BETTI(s2, primes[i], 1, 0, 1);
    EXPECT_BETTI(s4, primes[i], 1, 0, 0, 0, 1);
  }
  pcp_topology_complex_release(s1);
  pcp_topology_complex_release(s2);
  pcp_topology_complex_release(s4);
}

static void test_betti_numbers_of_the_torus(void** state) {
  (void)state;
  pcp_topology_complex_t* torus = grid_surface(4, false);
  EXPECT_BETTI(torus, 2, 1, 2, 1);
  EXPECT_BETTI(torus, 3, 1, 2, 1);
  EXPECT_BETTI(torus, 7, 1, 2, 1);
  pcp_topology_complex_release(torus);
}

static void test_betti_numbers_of_the_klein_bottle_depend_on_the_field(
    void** state) {
  (void)state;
  // H_1 = Z + Z/2: GF(2) sees the torsion (and, by duality, b2 = 1).
  pcp_topology_complex_t* klein = grid_surface(4, true);
  EXPECT_BETTI(klein, 2, 1, 2, 1);
  EXPECT_BETTI(klein, 3, 1, 1, 0);
  EXPECT_BETTI(klein, 5, 1, 1, 0);
  pcp_topology_complex_release(klein);
}

static void test_betti_numbers_of_the_projective_plane_depend_on_the_field(
    void** state) {
  (void)state;
  // H_1 = Z/2: invisible over GF(3), b1 = b2 = 1 over GF(2).
  pcp_topology_complex_t* rp2 = projective_plane();
  EXPECT_BETTI(rp2, 2, 1, 1, 1);
  EXPECT_BETTI(rp2, 3, 1, 0, 0);
  EXPECT_BETTI(rp2, 65521, 1, 0, 0);
  pcp_topology_complex_release(rp2);
}

static void test_betti_numbers_of_iterated_subdivisions(void** state) {
  (void)state;
  // Subdivisions keep the homotopy type: a disc stays acyclic, the boundary
  // of the subdivided tetrahedron is still a 2-sphere.
  pcp_topology_complex_t* triangle = make_complex();
  ADD(triangle, 0, 1, 2);
  pcp_topology_subdivision_t* sub = NULL;
  PCP_CHECK_OK(pcp_topology_subdivision_create(
      triangle, PCP_TOPOLOGY_SUBDIVISION_CHROMATIC, 2, ALLOC, &sub));
  EXPECT_BETTI(pcp_topology_subdivision_complex(sub), 2, 1, 0, 0);
  EXPECT_BETTI(pcp_topology_subdivision_complex(sub), 3, 1, 0, 0);
  pcp_topology_subdivision_release(sub);
  pcp_topology_complex_t* tetrahedron = make_complex();
  ADD(tetrahedron, 0, 1, 2, 3);
  PCP_CHECK_OK(pcp_topology_subdivision_create(
      tetrahedron, PCP_TOPOLOGY_SUBDIVISION_CHROMATIC, 1, ALLOC, &sub));
  pcp_topology_complex_t* boundary = make_complex();
  PCP_CHECK_OK(pcp_topology_complex_boundary(
      pcp_topology_subdivision_complex(sub), boundary));
  EXPECT_BETTI(boundary, 2, 1, 0, 1);
  EXPECT_BETTI(boundary, 3, 1, 0, 1);
  pcp_topology_complex_release(boundary);
  pcp_topology_subdivision_release(sub);
  pcp_topology_complex_release(tetrahedron);
  pcp_topology_complex_release(triangle);
}

//===----------------------------------------------------------------------===//
// Seeded random complexes against a dense reference
//===----------------------------------------------------------------------===//

// Rank of a dense rows x cols matrix over GF(p) (row echelon). Destroys it.
static uint64_t dense_rank(uint32_t* m, size_t rows, size_t cols, uint32_t p) {
  uint64_t rank = 0;
  for (size_t c = 0; c < cols && rank < rows; ++c) {
    size_t pivot = rows;
    for (size_t r = rank; r < rows && pivot == rows; ++r) {
      if (m[r * cols + c])
        pivot = r;
    }
    if (pivot == rows)
      continue;
    for (size_t k = 0; k < cols; ++k) {
      uint32_t t = m[pivot * cols + k];
      m[pivot * cols + k] = m[rank * cols + k];
      m[rank * cols + k] = t;
    }
    // Normalise by brute-force inverse, as upstream does.
    uint32_t a = m[rank * cols + c], inverse = 1;
    while ((uint64_t)a * inverse % p != 1) ++inverse;
    for (size_t k = 0; k < cols; ++k) {
      m[rank * cols + k] =
          (uint32_t)((uint64_t)m[rank * cols + k] * inverse % p);
    }
    for (size_t r = rank + 1; r < rows; ++r) {
      uint32_t f = m[r * cols + c];
      if (!f)
        continue;
      for (size_t k = 0; k < cols; ++k) {
        m[r * cols + k] = (uint32_t)((m[r * cols + k] +
                                      (uint64_t)(p - f) * m[rank * cols + k]) %
                                     p);
      }
    }
    ++rank;
  }
  return rank;
}

// Betti numbers from the faces with dense signed boundary matrices.
static void dense_betti(const pcp_topology_complex_t* complex, uint32_t p,
                        pcp_topology_betti_t* out) {
  pcp_topology_complex_t* faces = make_complex();
  PCP_CHECK_OK(pcp_topology_complex_faces(complex, faces));
  size_t n = pcp_topology_complex_count(faces);
  size_t counts[16] = {0};
  size_t* index = calloc(n + 1, sizeof(size_t));
  assert_non_null(index);
  for (size_t i = 0; i < n; ++i) {
    uint32_t c = pcp_topology_complex_simplex(faces, i).count;
    if (c)
      index[i] = counts[c - 1]++;
  }
  int32_t top = pcp_topology_complex_dimension(complex);
  uint64_t ranks[17] = {0};
  for (int32_t k = 1; k <= top; ++k) {
    size_t rows = counts[k - 1], cols = counts[k];
    uint32_t* m = calloc(rows * cols + 1, sizeof(uint32_t));
    assert_non_null(m);
    for (size_t i = 0; i < n; ++i) {
      pcp_topology_simplex_t s = pcp_topology_complex_simplex(faces, i);
      if (s.count != (uint32_t)k + 1)
        continue;
      for (uint32_t omit = 0; omit < s.count; ++omit) {
        pcp_topology_vertex_t face[16];
        uint32_t c = 0;
        for (uint32_t v = 0; v < s.count; ++v) {
          if (v != omit)
            face[c++] = s.vertices[v];
        }
        size_t found = 0;
        assert_true(pcp_topology_complex_find(
            faces, pcp_topology_make_simplex(face, c), &found));
        m[index[found] * cols + index[i]] = omit % 2 ? p - 1 : 1;
      }
    }
    ranks[k] = dense_rank(m, rows, cols, p);
    free(m);
  }
  memset(out, 0, sizeof(*out));
  out->count = top < 0 ? 0 : (uint32_t)top + 1;
  for (int32_t k = 0; k <= top; ++k) {
    out->values[k] = counts[k] - ranks[k] - (k < top ? ranks[k + 1] : 0);
  }
  free(index);
  pcp_topology_complex_release(faces);
}

// A random complex on up to 8 vertices: 1-7 facets of 1-|max_size|
// vertices.
static pcp_topology_complex_t* random_complex(pcp_rng_t* rng,
                                              uint32_t max_size) {
  pcp_topology_complex_t* complex = make_complex();
  uint32_t vertex_count = 3 + (uint32_t)pcp_rng_next_below(rng, 6);
  uint32_t facets = 1 + (uint32_t)pcp_rng_next_below(rng, 7);
  for (uint32_t f = 0; f < facets; ++f) {
    uint32_t ids[8];
    uint32_t size = 1 + (uint32_t)pcp_rng_next_below(rng, max_size);
    uint32_t n = 0;
    for (uint32_t v = 0; v < vertex_count && n < size; ++v) {
      if (pcp_rng_next_below(rng, vertex_count) < size)
        ids[n++] = v;
    }
    if (n == 0)
      ids[n++] = (uint32_t)pcp_rng_next_below(rng, vertex_count);
    add_ids(complex, ids, n);
  }
  return complex;
}

static void expect_same_betti(const pcp_topology_betti_t* a,
                              const pcp_topology_betti_t* b, uint64_t seed,
                              uint32_t p) {
  bool same = a->count == b->count;
  for (uint32_t k = 0; same && k < a->count; ++k) {
    same = a->values[k] == b->values[k];
  }
  if (!same)
    print_error("seed %llu p=%u: Betti vectors differ\n",
                (unsigned long long)seed, p);
  assert_true(same);
}

static void test_betti_matches_a_dense_reference_on_random_complexes(
    void** state) {
  (void)state;
  const uint32_t primes[] = {2, 3, 5, 7};
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    pcp_rng_t rng;
    pcp_rng_initialize(seed, &rng);
    pcp_topology_complex_t* complex = random_complex(&rng, 5);
    for (size_t i = 0; i < PCP_ARRAYSIZE(primes); ++i) {
      pcp_topology_betti_t sparse, dense;
      PCP_CHECK_OK(pcp_topology_complex_betti(complex, primes[i], &sparse));
      dense_betti(complex, primes[i], &dense);
      expect_same_betti(&sparse, &dense, seed, primes[i]);
      // Euler-Poincare: the alternating sums agree over every field.
      pcp_topology_complex_t* faces = make_complex();
      PCP_CHECK_OK(pcp_topology_complex_faces(complex, faces));
      int64_t chi_faces = 0, chi_betti = 0;
      for (size_t f = 0; f < pcp_topology_complex_count(faces); ++f) {
        uint32_t c = pcp_topology_complex_simplex(faces, f).count;
        if (c)
          chi_faces += (c % 2) ? 1 : -1;
      }
      for (uint32_t k = 0; k < sparse.count; ++k) {
        chi_betti += (k % 2 ? -1 : 1) * (int64_t)sparse.values[k];
      }
      assert_int_equal(chi_faces, chi_betti);
      pcp_topology_complex_release(faces);
    }
    pcp_topology_complex_release(complex);
  }
}

static void test_subdivisions_preserve_betti_numbers_of_random_complexes(
    void** state) {
  (void)state;
  // Subdivision does not change the space, so it cannot change homology.
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    pcp_rng_t rng;
    pcp_rng_initialize(seed * 7919, &rng);
    // Facets of at most 4 vertices keep the validator's cost (links and
    // face restrictions of every carrier image) under a second.
    pcp_topology_complex_t* complex = random_complex(&rng, 4);
    pcp_topology_subdivision_kind_t kind =
        seed % 2 ? PCP_TOPOLOGY_SUBDIVISION_CHROMATIC
                 : PCP_TOPOLOGY_SUBDIVISION_BARYCENTRIC;
    pcp_topology_subdivision_t* sub = NULL;
    PCP_CHECK_OK(
        pcp_topology_subdivision_create(complex, kind, 1, ALLOC, &sub));
    for (uint32_t p = 2; p <= 3; ++p) {
      pcp_topology_betti_t before, after;
      PCP_CHECK_OK(pcp_topology_complex_betti(complex, p, &before));
      PCP_CHECK_OK(pcp_topology_complex_betti(
          pcp_topology_subdivision_complex(sub), p, &after));
      expect_same_betti(&before, &after, seed, p);
    }
    pcp_topology_subdivision_report_t report;
    PCP_CHECK_OK(pcp_topology_subdivision_validate(
        sub, pcp_topology_subdivision_options_default(), &report));
    pcp_topology_subdivision_release(sub);
    pcp_topology_complex_release(complex);
  }
}

static void test_dot_export_renders_the_one_skeleton(void** state) {
  (void)state;
  pcp_topology_complex_t* interval = make_complex();
  ADD(interval, 0, 1);
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(ALLOC, 0, &builder);
  PCP_CHECK_OK(pcp_topology_complex_format_dot(interval, "interval", &builder));
  const char* text = pcp_string_builder_cstring(&builder);
  assert_non_null(strstr(text, "graph \"interval\" {"));
  assert_non_null(strstr(text, "v0 [label=\"process.0:input.0\"]"));
  assert_non_null(strstr(text, "v0 -- v1"));
  pcp_string_builder_deinitialize(&builder);
  pcp_topology_complex_release(interval);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(
          test_one_skeleton_adjacency_components_and_path_witnesses),
      cmocka_unit_test(test_components_detect_disconnected_one_skeletons),
      cmocka_unit_test(
          test_k_skeleton_extraction_returns_the_requested_subcomplex),
      cmocka_unit_test(
          test_betti_numbers_distinguish_interval_circle_and_triangle),
      cmocka_unit_test(test_betti_numbers_require_a_prime_field),
      cmocka_unit_test(test_homology_map_report_detects_cycle_collapse),
      cmocka_unit_test(
          test_homology_map_report_detects_same_betti_cycle_cancellation),
      cmocka_unit_test(
          test_homology_map_witness_identifies_a_source_cycle_lost),
      cmocka_unit_test(
          test_homology_map_witness_identifies_an_image_cycle_created),
      cmocka_unit_test(
          test_fundamental_group_presentation_exposes_generators_and_relators),
      cmocka_unit_test(
          test_connectivity_obstruction_reports_disconnected_output),
      cmocka_unit_test(test_betti_numbers_of_spheres_in_several_dimensions),
      cmocka_unit_test(test_betti_numbers_of_the_torus),
      cmocka_unit_test(
          test_betti_numbers_of_the_klein_bottle_depend_on_the_field),
      cmocka_unit_test(
          test_betti_numbers_of_the_projective_plane_depend_on_the_field),
      cmocka_unit_test(test_betti_numbers_of_iterated_subdivisions),
      cmocka_unit_test(
          test_betti_matches_a_dense_reference_on_random_complexes),
      cmocka_unit_test(
          test_subdivisions_preserve_betti_numbers_of_random_complexes),
      cmocka_unit_test(test_dot_export_renders_the_one_skeleton),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
