// SPDX-License-Identifier: Apache-2.0
//
// The data model tests of reference s.6 (topology.zig), same names and
// expected numbers.

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <string.h>

#include "topology/complex_impl.h"

#define ALLOC pcp_allocator_system()

static pcp_topology_vertex_t P(uint32_t process, int64_t input) {
  return pcp_topology_make_vertex(
      pcp_topology_make_color(PCP_TOPOLOGY_COLOR_PROCESS, process),
      pcp_topology_make_label(PCP_TOPOLOGY_LABEL_INPUT, input));
}
static pcp_topology_vertex_t Q(uint32_t process, int64_t value) {
  return pcp_topology_make_vertex(
      pcp_topology_make_color(PCP_TOPOLOGY_COLOR_PROCESS, process),
      pcp_topology_make_label(PCP_TOPOLOGY_LABEL_PROTOCOL, value));
}
static pcp_topology_vertex_t O(uint32_t process, int64_t value) {
  return pcp_topology_make_vertex(
      pcp_topology_make_color(PCP_TOPOLOGY_COLOR_PROCESS, process),
      pcp_topology_make_label(PCP_TOPOLOGY_LABEL_OUTPUT, value));
}

static pcp_topology_complex_t* make_complex(void) {
  pcp_topology_complex_t* complex = NULL;
  PCP_CHECK_OK(pcp_topology_complex_create(ALLOC, &complex));
  return complex;
}

// Adds |count| vertices as one simplex with builder semantics.
static void add(pcp_topology_complex_t* complex,
                const pcp_topology_vertex_t* vertices, size_t count) {
  PCP_CHECK_OK(pcp_topology_complex_add(
      complex, pcp_topology_make_simplex(vertices, count), NULL));
}
#define ADD(complex, ...)                        \
  do {                                           \
    pcp_topology_vertex_t vs_[] = {__VA_ARGS__}; \
    add((complex), vs_, PCP_ARRAYSIZE(vs_));     \
  } while (0)
#define SIMPLEX(array) pcp_topology_make_simplex((array), PCP_ARRAYSIZE(array))

static bool has(const pcp_topology_complex_t* complex,
                const pcp_topology_vertex_t* vertices, size_t count) {
  return pcp_topology_complex_contains(
      complex, pcp_topology_make_simplex(vertices, count));
}
#define HAS(complex, ...)                                \
  has((complex), (pcp_topology_vertex_t[]){__VA_ARGS__}, \
      sizeof((pcp_topology_vertex_t[]){__VA_ARGS__}) /   \
          sizeof(pcp_topology_vertex_t))

static void expect_error(pcp_status_t status, pcp_topology_error_t error) {
  if (pcp_topology_status_error(status) != error) {
    char text[1024];
    pcp_status_format(status, text, sizeof(text));
    print_error("expected %s, got: %s\n", pcp_topology_error_name(error),
                status ? text : "OK");
  }
  assert_int_equal(pcp_topology_status_error(status), error);
  pcp_status_ignore(status);
}

static void test_simplex_rejects_duplicate_colors(void** state) {
  (void)state;
  pcp_topology_vertex_t vs[] = {P(0, 0), P(0, 1)};
  pcp_status_t status = pcp_topology_simplex_validate(SIMPLEX(vs));
  assert_non_null(strstr(pcp_status_message(status), "DuplicateColor"));
  expect_error(status, PCP_TOPOLOGY_ERROR_DUPLICATE_COLOR);
}

static void test_simplex_equality_is_order_independent(void** state) {
  (void)state;
  pcp_topology_vertex_t a[] = {P(0, 0), P(1, 1), P(2, 0)};
  pcp_topology_vertex_t b[] = {P(2, 0), P(0, 0), P(1, 1)};
  pcp_topology_vertex_t c[] = {P(2, 0), P(0, 0)};
  assert_true(pcp_topology_simplex_equal(SIMPLEX(a), SIMPLEX(b)));
  assert_false(pcp_topology_simplex_equal(SIMPLEX(a), SIMPLEX(c)));
  assert_true(pcp_topology_simplex_is_proper_subset(SIMPLEX(c), SIMPLEX(a)));
}

static void test_complex_membership_is_closed_under_faces(void** state) {
  (void)state;
  pcp_topology_complex_t* complex = make_complex();
  ADD(complex, P(0, 0), P(1, 0), P(2, 0));
  assert_true(HAS(complex, P(0, 0), P(1, 0)));
  assert_true(pcp_topology_complex_contains(
      complex, pcp_topology_make_simplex(NULL, 0)));
  assert_false(HAS(complex, P(3, 0)));
  pcp_topology_vertex_t ab[] = {P(0, 0), P(1, 0)};
  size_t index = 99;
  assert_false(pcp_topology_complex_find(complex, SIMPLEX(ab), &index));
  assert_true(
      pcp_topology_complex_find_containing(complex, SIMPLEX(ab), &index));
  assert_int_equal(index, 0);
  // No listed simplex: the empty simplex is not a member.
  pcp_topology_complex_t* empty = make_complex();
  assert_false(
      pcp_topology_complex_contains(empty, pcp_topology_make_simplex(NULL, 0)));
  pcp_topology_complex_release(empty);
  pcp_topology_complex_release(complex);
}

static void test_complex_rejects_duplicate_named_simplexes(void** state) {
  (void)state;
  pcp_topology_complex_t* complex = make_complex();
  pcp_topology_vertex_t a[] = {P(0, 0), P(1, 0)};
  pcp_topology_vertex_t b[] = {P(1, 0), P(0, 0)};
  PCP_CHECK_OK(pcp_topology_complex_append(complex, SIMPLEX(a)));
  PCP_CHECK_OK(pcp_topology_complex_append(complex, SIMPLEX(b)));
  pcp_topology_complex_witness_t witness;
  expect_error(pcp_topology_complex_validate(complex, &witness),
               PCP_TOPOLOGY_ERROR_DUPLICATE_SIMPLEX);
  assert_int_equal(witness.problem,
                   PCP_TOPOLOGY_COMPLEX_PROBLEM_DUPLICATE_SIMPLEX);
  assert_int_equal(witness.index, 1);
  assert_int_equal(witness.other_index, 0);
  // The builder drops the duplicate instead.
  pcp_topology_complex_t* built = make_complex();
  bool added = true;
  PCP_CHECK_OK(pcp_topology_complex_add(built, SIMPLEX(a), &added));
  assert_true(added);
  PCP_CHECK_OK(pcp_topology_complex_add(built, SIMPLEX(b), &added));
  assert_false(added);
  assert_int_equal(pcp_topology_complex_count(built), 1);
  pcp_topology_complex_release(built);
  pcp_topology_complex_release(complex);
}

static void test_simplex_canonicalization_and_hashing_are_order_independent(
    void** state) {
  (void)state;
  pcp_topology_vertex_t a[] = {P(2, 0), P(0, 5), P(1, 1)};
  pcp_topology_vertex_t b[] = {P(1, 1), P(2, 0), P(0, 5)};
  assert_int_equal(pcp_topology_simplex_hash(SIMPLEX(a)),
                   pcp_topology_simplex_hash(SIMPLEX(b)));
  pcp_topology_vertices_sort(a, 3);
  pcp_topology_vertices_sort(b, 3);
  for (int i = 0; i < 3; ++i) {
    assert_true(pcp_topology_vertex_equal(&a[i], &b[i]));
  }
  assert_int_equal(a[0].color.number, 0);
  pcp_topology_vertex_t c[] = {P(2, 0), P(0, 5)};
  assert_int_not_equal(pcp_topology_simplex_hash(SIMPLEX(a)),
                       pcp_topology_simplex_hash(SIMPLEX(c)));
  // Symbols: a prefix sorts first; hashes differ by label.
  pcp_topology_vertex_t s1 = pcp_topology_make_vertex(
      pcp_topology_make_color(PCP_TOPOLOGY_COLOR_GATEWAY, 0),
      pcp_topology_make_symbol("status"));
  pcp_topology_vertex_t s2 = pcp_topology_make_vertex(
      pcp_topology_make_color(PCP_TOPOLOGY_COLOR_GATEWAY, 0),
      pcp_topology_make_symbol("status.accepted"));
  assert_true(pcp_topology_vertex_compare(&s1, &s2) < 0);
  assert_int_not_equal(pcp_topology_vertex_hash(&s1),
                       pcp_topology_vertex_hash(&s2));
  // Colour rank comes first: hub < gateway < ... < process.
  pcp_topology_vertex_t hub = pcp_topology_make_vertex(
      pcp_topology_make_color(PCP_TOPOLOGY_COLOR_HUB, 9),
      pcp_topology_make_symbol("z"));
  assert_true(pcp_topology_vertex_compare(&hub, &s1) < 0);
}

static void test_vertex_registry_interns_color_label_pairs_deterministically(
    void** state) {
  (void)state;
  pcp_topology_vertex_list_t registry;
  pcp_topology_vertex_list_initialize(ALLOC, &registry);
  size_t index = 0;
  pcp_topology_vertex_t b = P(1, 0);
  pcp_topology_vertex_t a = P(0, 0);
  PCP_CHECK_OK(pcp_topology_vertex_registry_intern(&registry, &b, &index));
  assert_int_equal(index, 0);
  PCP_CHECK_OK(pcp_topology_vertex_registry_intern(&registry, &a, &index));
  assert_int_equal(index, 0);  // sorts before b, which shifts to 1
  PCP_CHECK_OK(pcp_topology_vertex_registry_intern(&registry, &b, &index));
  assert_int_equal(index, 1);
  assert_int_equal(registry.count, 2);
  PCP_CHECK_OK(pcp_topology_vertex_registry_validate(&registry));
  PCP_CHECK_OK(pcp_topology_vertex_list_append(&registry, &a));
  expect_error(pcp_topology_vertex_registry_validate(&registry),
               PCP_TOPOLOGY_ERROR_DUPLICATE_INTERNED_VERTEX);
  pcp_topology_vertex_list_deinitialize(&registry);
}

static void test_complex_enumerates_vertices_faces_dimension_and_purity(
    void** state) {
  (void)state;
  pcp_topology_complex_t* complex = make_complex();
  ADD(complex, P(0, 0), P(1, 0), P(2, 0));
  pcp_topology_vertex_list_t vertices;
  pcp_topology_vertex_list_initialize(ALLOC, &vertices);
  PCP_CHECK_OK(pcp_topology_complex_vertices(complex, &vertices));
  assert_int_equal(vertices.count, 3);
  pcp_topology_complex_t* faces = make_complex();
  PCP_CHECK_OK(pcp_topology_complex_faces(complex, faces));
  assert_int_equal(pcp_topology_complex_count(faces), 8);
  // Upstream order: masks over the stored order, empty face first.
  assert_int_equal(pcp_topology_complex_simplex(faces, 0).count, 0);
  assert_int_equal(pcp_topology_complex_simplex(faces, 1).count, 1);
  assert_int_equal(pcp_topology_complex_simplex(faces, 3).count, 2);
  assert_int_equal(pcp_topology_complex_simplex(faces, 7).count, 3);
  assert_int_equal(pcp_topology_complex_dimension(complex), 2);
  assert_true(pcp_topology_complex_is_pure(complex));
  pcp_topology_vertex_list_deinitialize(&vertices);
  pcp_topology_complex_release(faces);
  pcp_topology_complex_release(complex);
}

static void test_complex_faces_follow_the_stored_vertex_order(void** state) {
  (void)state;
  // A literal (unsorted) simplex: masks run over the stored order, so the
  // first singleton is the first stored vertex, each face comes out sorted.
  pcp_topology_complex_t* complex = make_complex();
  pcp_topology_vertex_t vs[] = {P(2, 0), P(0, 0), P(1, 0)};
  PCP_CHECK_OK(pcp_topology_complex_append(complex, SIMPLEX(vs)));
  pcp_topology_complex_t* faces = make_complex();
  PCP_CHECK_OK(pcp_topology_complex_faces(complex, faces));
  pcp_topology_simplex_t first = pcp_topology_complex_simplex(faces, 1);
  assert_int_equal(first.vertices[0].color.number, 2);
  pcp_topology_simplex_t mask3 = pcp_topology_complex_simplex(faces, 3);
  assert_int_equal(mask3.count, 2);
  assert_int_equal(mask3.vertices[0].color.number, 0);
  assert_int_equal(mask3.vertices[1].color.number, 2);
  pcp_topology_complex_release(faces);
  pcp_topology_complex_release(complex);
}

static void test_complex_purity_uses_maximal_simplexes(void** state) {
  (void)state;
  pcp_topology_complex_t* pure = make_complex();
  ADD(pure, P(0, 0), P(1, 0));
  ADD(pure, P(0, 0), P(2, 0));
  ADD(pure, P(0, 0));  // a named face does not break purity
  assert_true(pcp_topology_complex_is_pure(pure));
  pcp_topology_complex_t* impure = make_complex();
  ADD(impure, P(0, 0), P(1, 0));
  ADD(impure, P(3, 0));
  assert_false(pcp_topology_complex_is_pure(impure));
  pcp_topology_complex_release(pure);
  pcp_topology_complex_release(impure);
}

static void test_skeleton_and_boundary_are_explicit_finite_complexes(
    void** state) {
  (void)state;
  pcp_topology_complex_t* complex = make_complex();
  ADD(complex, P(0, 0), P(1, 0), P(2, 0));
  ADD(complex, P(0, 0), P(1, 0), P(3, 0));
  pcp_topology_complex_t* skeleton = make_complex();
  PCP_CHECK_OK(pcp_topology_complex_skeleton(complex, 1, skeleton));
  assert_true(HAS(skeleton, P(0, 0), P(1, 0)));
  assert_false(HAS(skeleton, P(0, 0), P(1, 0), P(2, 0)));
  pcp_topology_complex_t* boundary = make_complex();
  PCP_CHECK_OK(pcp_topology_complex_boundary(complex, boundary));
  assert_true(HAS(boundary, P(0, 0), P(2, 0)));
  assert_true(HAS(boundary, P(1, 0), P(2, 0)));
  assert_true(HAS(boundary, P(0, 0), P(3, 0)));
  assert_true(HAS(boundary, P(1, 0), P(3, 0)));
  assert_false(HAS(boundary, P(0, 0), P(1, 0)));
  assert_int_equal(pcp_topology_complex_count(boundary), 4);
  pcp_topology_complex_release(boundary);
  pcp_topology_complex_release(skeleton);
  pcp_topology_complex_release(complex);
}

static void test_star_closed_star_and_link_follow_face_closure(void** state) {
  (void)state;
  pcp_topology_complex_t* complex = make_complex();
  ADD(complex, P(0, 0), P(1, 0), P(2, 0));
  pcp_topology_vertex_t center[] = {P(0, 0)};
  pcp_topology_complex_t* out = make_complex();
  PCP_CHECK_OK(pcp_topology_complex_star(complex, SIMPLEX(center), out));
  assert_true(pcp_topology_complex_find(out, SIMPLEX(center), NULL));
  pcp_topology_vertex_t abc[] = {P(0, 0), P(1, 0), P(2, 0)};
  pcp_topology_vertex_t bc[] = {P(1, 0), P(2, 0)};
  assert_true(pcp_topology_complex_find(out, SIMPLEX(abc), NULL));
  assert_false(pcp_topology_complex_find(out, SIMPLEX(bc), NULL));
  PCP_CHECK_OK(pcp_topology_complex_closed_star(complex, SIMPLEX(center), out));
  assert_true(pcp_topology_complex_find(out, SIMPLEX(bc), NULL));
  PCP_CHECK_OK(pcp_topology_complex_link(complex, SIMPLEX(center), out));
  assert_true(pcp_topology_complex_find(out, SIMPLEX(bc), NULL));
  assert_false(pcp_topology_complex_find(out, SIMPLEX(center), NULL));
  pcp_topology_complex_release(out);
  pcp_topology_complex_release(complex);
}

static void test_subcomplex_operations_keep_outputs_closed_inside_the_parent(
    void** state) {
  (void)state;
  pcp_topology_complex_t* parent = make_complex();
  ADD(parent, P(0, 0), P(1, 0), P(2, 0));
  pcp_topology_complex_t* left = make_complex();
  ADD(left, P(0, 0), P(1, 0));
  pcp_topology_complex_t* right = make_complex();
  ADD(right, P(0, 0), P(2, 0));
  PCP_CHECK_OK(pcp_topology_subcomplex_validate(parent, left));
  pcp_topology_complex_t* out = make_complex();
  PCP_CHECK_OK(pcp_topology_subcomplex_union(left, right, out));
  assert_true(HAS(out, P(0, 0), P(1, 0)));
  assert_true(HAS(out, P(0, 0), P(2, 0)));
  PCP_CHECK_OK(pcp_topology_subcomplex_validate(parent, out));
  PCP_CHECK_OK(pcp_topology_subcomplex_intersection(left, right, out));
  assert_true(HAS(out, P(0, 0)));
  assert_false(HAS(out, P(1, 0)));
  PCP_CHECK_OK(pcp_topology_subcomplex_difference(left, right, out));
  assert_true(HAS(out, P(1, 0)));
  assert_false(HAS(out, P(0, 0), P(1, 0)));
  PCP_CHECK_OK(pcp_topology_subcomplex_closure(left, out));
  assert_int_equal(pcp_topology_complex_count(out), 4);
  // Outside the parent.
  pcp_topology_complex_t* stray = make_complex();
  ADD(stray, P(3, 0));
  expect_error(pcp_topology_subcomplex_validate(parent, stray),
               PCP_TOPOLOGY_ERROR_SUBCOMPLEX_OUTSIDE_PARENT);
  expect_error(pcp_topology_subcomplex_check_same_parent(parent, stray),
               PCP_TOPOLOGY_ERROR_PARENT_COMPLEX_MISMATCH);
  pcp_topology_complex_release(stray);
  pcp_topology_complex_release(out);
  pcp_topology_complex_release(left);
  pcp_topology_complex_release(right);
  pcp_topology_complex_release(parent);
}

static void test_subcomplex_image_maps_closed_faces_into_a_target_parent(
    void** state) {
  (void)state;
  pcp_topology_complex_t* domain = make_complex();
  ADD(domain, P(0, 0), P(1, 0));
  pcp_topology_complex_t* target = make_complex();
  ADD(target, O(0, 1), O(1, 1));
  pcp_topology_vertex_map_t* map = NULL;
  PCP_CHECK_OK(pcp_topology_vertex_map_create(domain, target, ALLOC, &map));
  pcp_topology_vertex_t a = P(0, 0), b = P(1, 0), x = O(0, 1), y = O(1, 1);
  PCP_CHECK_OK(pcp_topology_vertex_map_set(map, &a, &x));
  PCP_CHECK_OK(pcp_topology_vertex_map_set(map, &b, &y));
  pcp_topology_complex_t* out = make_complex();
  PCP_CHECK_OK(pcp_topology_subcomplex_image(domain, map, target, out));
  assert_int_equal(pcp_topology_complex_count(out), 4);
  assert_true(HAS(out, O(0, 1), O(1, 1)));
  // A target without the edge rejects the image.
  pcp_topology_complex_t* points = make_complex();
  ADD(points, O(0, 1));
  ADD(points, O(1, 1));
  expect_error(pcp_topology_subcomplex_image(domain, map, points, out),
               PCP_TOPOLOGY_ERROR_SUBCOMPLEX_IMAGE_OUTSIDE_TARGET);
  pcp_topology_complex_release(points);
  pcp_topology_complex_release(out);
  pcp_topology_vertex_map_release(map);
  pcp_topology_complex_release(target);
  pcp_topology_complex_release(domain);
}

static void test_join_builds_the_face_closed_product_over_disjoint_colors(
    void** state) {
  (void)state;
  pcp_topology_complex_t* left = make_complex();
  ADD(left, P(0, 0));
  pcp_topology_complex_t* right = make_complex();
  ADD(right, P(1, 0));
  pcp_topology_complex_t* out = make_complex();
  PCP_CHECK_OK(pcp_topology_complex_join(left, right, out));
  assert_int_equal(pcp_topology_complex_count(out), 4);
  assert_true(HAS(out, P(0, 0), P(1, 0)));
  pcp_topology_complex_t* clash = make_complex();
  ADD(clash, P(0, 1));
  expect_error(pcp_topology_complex_join(left, clash, out),
               PCP_TOPOLOGY_ERROR_DUPLICATE_COLOR);
  pcp_topology_complex_release(clash);
  pcp_topology_complex_release(out);
  pcp_topology_complex_release(left);
  pcp_topology_complex_release(right);
}

static void test_vertex_maps_validate_simplicial_color_preserving_rigid_images(
    void** state) {
  (void)state;
  pcp_topology_complex_t* domain = make_complex();
  ADD(domain, P(0, 0), P(1, 0));
  pcp_topology_complex_t* codomain = make_complex();
  ADD(codomain, O(0, 0), O(1, 1));
  pcp_topology_vertex_map_t* map = NULL;
  PCP_CHECK_OK(pcp_topology_vertex_map_create(domain, codomain, ALLOC, &map));
  pcp_topology_vertex_t a = P(0, 0), b = P(1, 0), x = O(0, 0), y = O(1, 1);
  PCP_CHECK_OK(pcp_topology_vertex_map_set(map, &a, &x));
  PCP_CHECK_OK(pcp_topology_vertex_map_set(map, &b, &y));
  pcp_topology_vertex_map_checks_t checks = {true, true};
  PCP_CHECK_OK(pcp_topology_vertex_map_validate(map, checks));
  pcp_topology_complex_t* image = make_complex();
  PCP_CHECK_OK(pcp_topology_vertex_map_image(map, NULL, image));
  assert_int_equal(pcp_topology_complex_count(image), 4);
  pcp_topology_complex_release(image);
  pcp_topology_vertex_map_release(map);

  // Colour changes, strays, duplicates and gaps are each named.
  PCP_CHECK_OK(pcp_topology_vertex_map_create(domain, codomain, ALLOC, &map));
  PCP_CHECK_OK(pcp_topology_vertex_map_set(map, &a, &y));
  PCP_CHECK_OK(pcp_topology_vertex_map_set(map, &b, &x));
  expect_error(pcp_topology_vertex_map_validate(map, checks),
               PCP_TOPOLOGY_ERROR_NON_COLOR_PRESERVING_MAP);
  pcp_topology_vertex_map_release(map);
  PCP_CHECK_OK(pcp_topology_vertex_map_create(domain, codomain, ALLOC, &map));
  PCP_CHECK_OK(pcp_topology_vertex_map_set(map, &a, &x));
  expect_error(pcp_topology_vertex_map_validate(map, checks),
               PCP_TOPOLOGY_ERROR_MISSING_VERTEX_MAP_ENTRY);
  PCP_CHECK_OK(pcp_topology_vertex_map_set(map, &a, &x));
  expect_error(pcp_topology_vertex_map_validate(map, checks),
               PCP_TOPOLOGY_ERROR_DUPLICATE_VERTEX_MAP_SOURCE);
  pcp_topology_vertex_map_release(map);
  PCP_CHECK_OK(pcp_topology_vertex_map_create(domain, codomain, ALLOC, &map));
  pcp_topology_vertex_t stray = P(5, 0);
  PCP_CHECK_OK(pcp_topology_vertex_map_set(map, &stray, &x));
  expect_error(pcp_topology_vertex_map_validate(map, checks),
               PCP_TOPOLOGY_ERROR_SOURCE_VERTEX_OUTSIDE_DOMAIN);
  pcp_topology_vertex_map_release(map);
  PCP_CHECK_OK(pcp_topology_vertex_map_create(domain, codomain, ALLOC, &map));
  pcp_topology_vertex_t nowhere = O(0, 7);
  PCP_CHECK_OK(pcp_topology_vertex_map_set(map, &a, &nowhere));
  expect_error(pcp_topology_vertex_map_validate(map, checks),
               PCP_TOPOLOGY_ERROR_TARGET_VERTEX_OUTSIDE_CODOMAIN);
  pcp_topology_vertex_map_release(map);
  pcp_topology_complex_release(codomain);
  pcp_topology_complex_release(domain);
}

static void test_vertex_maps_reject_non_simplicial_images_and_rigid_collapses(
    void** state) {
  (void)state;
  pcp_topology_complex_t* domain = make_complex();
  ADD(domain, P(0, 0), P(1, 0));
  pcp_topology_complex_t* isolated = make_complex();
  ADD(isolated, O(0, 0));
  ADD(isolated, O(1, 1));
  pcp_topology_vertex_map_t* map = NULL;
  PCP_CHECK_OK(pcp_topology_vertex_map_create(domain, isolated, ALLOC, &map));
  pcp_topology_vertex_t a = P(0, 0), b = P(1, 0), x = O(0, 0), y = O(1, 1);
  PCP_CHECK_OK(pcp_topology_vertex_map_set(map, &a, &x));
  PCP_CHECK_OK(pcp_topology_vertex_map_set(map, &b, &y));
  pcp_topology_vertex_map_checks_t plain = {false, false};
  expect_error(pcp_topology_vertex_map_validate(map, plain),
               PCP_TOPOLOGY_ERROR_NON_SIMPLICIAL_MAP);
  pcp_topology_vertex_map_release(map);

  pcp_topology_complex_t* point = make_complex();
  ADD(point, O(0, 0));
  PCP_CHECK_OK(pcp_topology_vertex_map_create(domain, point, ALLOC, &map));
  PCP_CHECK_OK(pcp_topology_vertex_map_set(map, &a, &x));
  PCP_CHECK_OK(pcp_topology_vertex_map_set(map, &b, &x));
  PCP_CHECK_OK(pcp_topology_vertex_map_validate(map, plain));
  pcp_topology_vertex_map_checks_t rigid = {false, true};
  expect_error(pcp_topology_vertex_map_validate(map, rigid),
               PCP_TOPOLOGY_ERROR_NON_RIGID_MAP);
  pcp_topology_vertex_map_release(map);
  pcp_topology_complex_release(point);
  pcp_topology_complex_release(isolated);
  pcp_topology_complex_release(domain);
}

// Identity-like carrier over the edge {p0, p1}: each face to its copy in
// |codomain| with protocol labels.
static pcp_topology_carrier_map_t* edge_carrier(
    const pcp_topology_complex_t* domain,
    const pcp_topology_complex_t* codomain,
    pcp_topology_vertex_t (*relabel)(uint32_t, int64_t), int64_t value) {
  pcp_topology_carrier_map_t* carrier = NULL;
  PCP_CHECK_OK(
      pcp_topology_carrier_map_create(domain, codomain, ALLOC, &carrier));
  pcp_topology_complex_t* faces = make_complex();
  PCP_CHECK_OK(pcp_topology_complex_faces(domain, faces));
  pcp_topology_complex_t* image = make_complex();
  for (size_t i = 0; i < pcp_topology_complex_count(faces); ++i) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, i);
    pcp_topology_vertex_t mapped[8];
    for (uint32_t k = 0; k < face.count; ++k) {
      mapped[k] = relabel(face.vertices[k].color.number, value);
    }
    pcp_topology_complex_clear(image);
    add(image, mapped, face.count);
    PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, face, image));
  }
  pcp_topology_complex_release(image);
  pcp_topology_complex_release(faces);
  return carrier;
}

static void test_simplicial_carrier_maps_validate_strict_rigid_chromatic(
    void** state) {
  (void)state;
  pcp_topology_complex_t* input = make_complex();
  ADD(input, P(0, 0), P(1, 0));
  pcp_topology_complex_t* protocol = make_complex();
  ADD(protocol, Q(0, 1), Q(1, 1));
  pcp_topology_carrier_map_t* carrier = edge_carrier(input, protocol, Q, 1);
  pcp_topology_carrier_checks_t all = {true, true, true, true};
  PCP_CHECK_OK(pcp_topology_carrier_map_validate(carrier, all));
  // The restriction to {a} is chromatic too.
  pcp_topology_complex_t* sub = make_complex();
  ADD(sub, P(0, 0));
  pcp_topology_carrier_map_t* restricted = NULL;
  PCP_CHECK_OK(
      pcp_topology_carrier_map_restrict(carrier, sub, ALLOC, &restricted));
  assert_int_equal(pcp_topology_carrier_map_count(restricted), 2);
  PCP_CHECK_OK(pcp_topology_carrier_map_validate(restricted, all));
  pcp_topology_carrier_map_release(restricted);
  pcp_topology_complex_release(sub);
  pcp_topology_carrier_map_release(carrier);

  // A missing face entry is named, and a colour-changing image is not
  // chromatic.
  PCP_CHECK_OK(
      pcp_topology_carrier_map_create(input, protocol, ALLOC, &carrier));
  pcp_topology_vertex_t a[] = {P(0, 0)};
  pcp_topology_complex_t* image = make_complex();
  ADD(image, Q(1, 1));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(a), image));
  expect_error(pcp_topology_carrier_map_validate(carrier, all),
               PCP_TOPOLOGY_ERROR_MISSING_CARRIER_SIMPLEX);
  pcp_topology_carrier_map_release(carrier);
  pcp_topology_complex_release(image);
  pcp_topology_complex_release(protocol);
  pcp_topology_complex_release(input);
}

static void test_carrier_map_validation_names_each_broken_rule(void** state) {
  (void)state;
  pcp_topology_complex_t* input = make_complex();
  ADD(input, P(0, 0), P(1, 0));
  pcp_topology_complex_t* protocol = make_complex();
  ADD(protocol, Q(0, 1), Q(1, 1));
  ADD(protocol, Q(0, 2), Q(1, 2));
  pcp_topology_carrier_checks_t all = {true, true, true, true};
  pcp_topology_complex_t* image = make_complex();
  pcp_topology_vertex_t empty_face[1];
  pcp_topology_simplex_t empty = pcp_topology_make_simplex(empty_face, 0);
  pcp_topology_vertex_t a[] = {P(0, 0)}, b[] = {P(1, 0)};
  pcp_topology_vertex_t ab[] = {P(0, 0), P(1, 0)};
  pcp_topology_vertex_t stray[] = {P(5, 0)};

  // A simplex outside the domain, and a duplicate entry.
  pcp_topology_carrier_map_t* carrier = edge_carrier(input, protocol, Q, 1);
  ADD(image, Q(0, 1));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(stray), image));
  expect_error(pcp_topology_carrier_map_validate(carrier, all),
               PCP_TOPOLOGY_ERROR_CARRIER_SIMPLEX_OUTSIDE_DOMAIN);
  pcp_topology_carrier_map_release(carrier);
  carrier = edge_carrier(input, protocol, Q, 1);
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(a), image));
  expect_error(pcp_topology_carrier_map_validate(carrier, all),
               PCP_TOPOLOGY_ERROR_DUPLICATE_CARRIER_SIMPLEX);
  pcp_topology_carrier_map_release(carrier);

  // An image outside the codomain.
  PCP_CHECK_OK(
      pcp_topology_carrier_map_create(input, protocol, ALLOC, &carrier));
  pcp_topology_complex_clear(image);
  ADD(image, Q(0, 9));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(a), image));
  expect_error(pcp_topology_carrier_map_validate(carrier, all),
               PCP_TOPOLOGY_ERROR_COMPLEX_MISMATCH);
  pcp_topology_carrier_map_release(carrier);

  // {a} -> two points (q0:1, q0:2), {b} -> q1:1, {a,b} -> both edges:
  // monotone, and rigid (each image is pure of the simplex's dimension).
  PCP_CHECK_OK(
      pcp_topology_carrier_map_create(input, protocol, ALLOC, &carrier));
  pcp_topology_complex_clear(image);
  PCP_CHECK_OK(pcp_topology_complex_add(image, empty, NULL));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, empty, image));
  pcp_topology_complex_clear(image);
  ADD(image, Q(0, 1));
  ADD(image, Q(0, 2));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(a), image));
  pcp_topology_complex_clear(image);
  ADD(image, Q(1, 1));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(b), image));
  pcp_topology_complex_clear(image);
  ADD(image, Q(0, 1), Q(1, 1));
  ADD(image, Q(0, 2), Q(1, 2));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(ab), image));
  pcp_topology_carrier_checks_t monotone = {true, false, false, false};
  PCP_CHECK_OK(pcp_topology_carrier_map_validate(carrier, monotone));
  pcp_topology_carrier_checks_t rigid = {true, false, true, false};
  PCP_CHECK_OK(pcp_topology_carrier_map_validate(carrier, rigid));
  pcp_topology_carrier_map_release(carrier);

  // Not monotone: {a} reaches q0:2, which {a,b}'s image lacks.
  PCP_CHECK_OK(
      pcp_topology_carrier_map_create(input, protocol, ALLOC, &carrier));
  pcp_topology_complex_clear(image);
  PCP_CHECK_OK(pcp_topology_complex_add(image, empty, NULL));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, empty, image));
  pcp_topology_complex_clear(image);
  ADD(image, Q(0, 2));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(a), image));
  pcp_topology_complex_clear(image);
  ADD(image, Q(1, 1));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(b), image));
  pcp_topology_complex_clear(image);
  ADD(image, Q(0, 1), Q(1, 1));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(ab), image));
  expect_error(pcp_topology_carrier_map_validate(carrier, monotone),
               PCP_TOPOLOGY_ERROR_NON_MONOTONIC_CARRIER);
  pcp_topology_carrier_map_release(carrier);

  // Not rigid: the edge maps to a single point. Not chromatic (though
  // rigid): {b} maps to a point of a's colour.
  PCP_CHECK_OK(
      pcp_topology_carrier_map_create(input, protocol, ALLOC, &carrier));
  pcp_topology_complex_clear(image);
  PCP_CHECK_OK(pcp_topology_complex_add(image, empty, NULL));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, empty, image));
  pcp_topology_complex_clear(image);
  ADD(image, Q(0, 1));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(a), image));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(b), image));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(ab), image));
  expect_error(pcp_topology_carrier_map_validate(carrier, rigid),
               PCP_TOPOLOGY_ERROR_NON_RIGID_CARRIER);
  pcp_topology_carrier_map_release(carrier);
  PCP_CHECK_OK(
      pcp_topology_carrier_map_create(input, protocol, ALLOC, &carrier));
  pcp_topology_complex_clear(image);
  PCP_CHECK_OK(pcp_topology_complex_add(image, empty, NULL));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, empty, image));
  pcp_topology_complex_clear(image);
  ADD(image, Q(0, 1));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(a), image));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(b), image));
  pcp_topology_complex_clear(image);
  ADD(image, Q(0, 1), Q(1, 1));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(ab), image));
  PCP_CHECK_OK(pcp_topology_carrier_map_validate(carrier, rigid));
  pcp_topology_carrier_checks_t chromatic = {true, false, false, true};
  expect_error(pcp_topology_carrier_map_validate(carrier, chromatic),
               PCP_TOPOLOGY_ERROR_NON_CHROMATIC_CARRIER);
  pcp_topology_carrier_map_release(carrier);

  // Not strict: img(a) and img(b) share q0:1 but img(empty) is {empty}.
  PCP_CHECK_OK(
      pcp_topology_carrier_map_create(input, protocol, ALLOC, &carrier));
  pcp_topology_complex_clear(image);
  PCP_CHECK_OK(pcp_topology_complex_add(image, empty, NULL));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, empty, image));
  pcp_topology_complex_clear(image);
  ADD(image, Q(0, 1));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(a), image));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(b), image));
  pcp_topology_complex_clear(image);
  ADD(image, Q(0, 1), Q(1, 1));
  PCP_CHECK_OK(pcp_topology_carrier_map_set(carrier, SIMPLEX(ab), image));
  pcp_topology_carrier_checks_t strict = {true, true, false, false};
  expect_error(pcp_topology_carrier_map_validate(carrier, strict),
               PCP_TOPOLOGY_ERROR_NON_STRICT_CARRIER);
  pcp_topology_carrier_map_release(carrier);

  // Composition needs an entry for every face of the first image.
  carrier = edge_carrier(input, protocol, Q, 1);
  pcp_topology_carrier_map_t* partial = NULL;
  PCP_CHECK_OK(
      pcp_topology_carrier_map_create(protocol, protocol, ALLOC, &partial));
  pcp_topology_carrier_map_t* composed = NULL;
  expect_error(pcp_topology_carrier_map_compose_with_carrier(carrier, partial,
                                                             ALLOC, &composed),
               PCP_TOPOLOGY_ERROR_MISSING_CARRIER_SIMPLEX);
  assert_null(composed);
  pcp_topology_carrier_map_release(partial);
  pcp_topology_carrier_map_release(carrier);
  pcp_topology_complex_release(image);
  pcp_topology_complex_release(protocol);
  pcp_topology_complex_release(input);
}

static void test_carrier_calculus_composes_carrier_maps_and_decision_maps(
    void** state) {
  (void)state;
  pcp_topology_complex_t* input = make_complex();
  ADD(input, P(0, 0), P(1, 0));
  pcp_topology_complex_t* protocol = make_complex();
  ADD(protocol, Q(0, 1), Q(1, 1));
  pcp_topology_complex_t* output = make_complex();
  ADD(output, O(0, 2), O(1, 2));
  pcp_topology_carrier_map_t* xi = edge_carrier(input, protocol, Q, 1);
  pcp_topology_carrier_map_t* delta = edge_carrier(input, output, O, 2);
  pcp_topology_carrier_map_t* phi = edge_carrier(protocol, output, O, 2);
  pcp_topology_carrier_map_t* composed = NULL;
  PCP_CHECK_OK(
      pcp_topology_carrier_map_compose_with_carrier(xi, phi, ALLOC, &composed));
  pcp_topology_carrier_checks_t checks = pcp_topology_carrier_checks_default();
  PCP_CHECK_OK(pcp_topology_carrier_map_validate(composed, checks));
  pcp_topology_vertex_t e[] = {P(0, 0), P(1, 0)};
  pcp_topology_vertex_t oe[] = {O(0, 2), O(1, 2)};
  assert_true(
      pcp_topology_carrier_map_carries(composed, SIMPLEX(e), SIMPLEX(oe)));

  pcp_topology_vertex_map_t* decision = NULL;
  PCP_CHECK_OK(
      pcp_topology_vertex_map_create(protocol, output, ALLOC, &decision));
  for (uint32_t p = 0; p < 2; ++p) {
    pcp_topology_vertex_t s = Q(p, 1), t = O(p, 2);
    PCP_CHECK_OK(pcp_topology_vertex_map_set(decision, &s, &t));
  }
  pcp_topology_carrier_map_t* decided = NULL;
  PCP_CHECK_OK(
      pcp_topology_carrier_map_compose_with_map(xi, decision, ALLOC, &decided));
  assert_true(
      pcp_topology_carrier_map_carries(decided, SIMPLEX(e), SIMPLEX(oe)));
  PCP_CHECK_OK(pcp_topology_carried_decision_map_validate(xi, delta, decision));
  pcp_topology_complex_t* image = make_complex();
  PCP_CHECK_OK(pcp_topology_carrier_map_image(decided, image));
  assert_int_equal(pcp_topology_complex_count(image), 4);
  pcp_topology_complex_release(image);
  pcp_topology_carrier_map_release(decided);
  pcp_topology_vertex_map_release(decision);
  pcp_topology_carrier_map_release(composed);
  pcp_topology_carrier_map_release(phi);
  pcp_topology_carrier_map_release(delta);
  pcp_topology_carrier_map_release(xi);
  pcp_topology_complex_release(output);
  pcp_topology_complex_release(protocol);
  pcp_topology_complex_release(input);
}

static void test_carried_decision_maps_reject_task_carrier_escapes(
    void** state) {
  (void)state;
  pcp_topology_complex_t* input = make_complex();
  ADD(input, P(0, 0), P(1, 0));
  pcp_topology_complex_t* protocol = make_complex();
  ADD(protocol, Q(0, 1), Q(1, 1));
  pcp_topology_complex_t* output = make_complex();
  ADD(output, O(0, 2), O(1, 2));
  ADD(output, O(0, 3), O(1, 3));
  pcp_topology_carrier_map_t* xi = edge_carrier(input, protocol, Q, 1);
  // Delta allows only the "2" outputs; the decision picks "3".
  pcp_topology_carrier_map_t* delta = edge_carrier(input, output, O, 2);
  pcp_topology_vertex_map_t* decision = NULL;
  PCP_CHECK_OK(
      pcp_topology_vertex_map_create(protocol, output, ALLOC, &decision));
  for (uint32_t p = 0; p < 2; ++p) {
    pcp_topology_vertex_t s = Q(p, 1), t = O(p, 3);
    PCP_CHECK_OK(pcp_topology_vertex_map_set(decision, &s, &t));
  }
  pcp_status_t status =
      pcp_topology_carried_decision_map_validate(xi, delta, decision);
  assert_non_null(strstr(pcp_status_message(status), "DecisionOutsideCarrier"));
  expect_error(status, PCP_TOPOLOGY_ERROR_DECISION_OUTSIDE_CARRIER);
  pcp_topology_vertex_map_release(decision);
  pcp_topology_carrier_map_release(delta);
  pcp_topology_carrier_map_release(xi);
  pcp_topology_complex_release(output);
  pcp_topology_complex_release(protocol);
  pcp_topology_complex_release(input);
}

// Index API fixtures: input {a}, {b}, {a,b}; outputs listed.
static void test_carrier_map_validates_monotonic_output_sets(void** state) {
  (void)state;
  pcp_topology_complex_t* input = make_complex();
  ADD(input, P(0, 0));
  ADD(input, P(1, 0));
  ADD(input, P(0, 0), P(1, 0));
  pcp_topology_complex_t* output = make_complex();
  ADD(output, O(0, 0));
  ADD(output, O(1, 0));
  ADD(output, O(0, 0), O(1, 0));
  const uint32_t t0[] = {0}, t1[] = {1}, t2[] = {0, 1, 2};
  pcp_topology_index_edge_t edges[] = {{0, t0, 1}, {1, t1, 1}, {2, t2, 3}};
  pcp_topology_index_carrier_t carrier = {input, output, edges, 3};
  PCP_CHECK_OK(pcp_topology_index_carrier_validate(&carrier));
  // Dropping output 0 from the edge input breaks monotonicity.
  const uint32_t t2_bad[] = {1, 2};
  edges[2].target_indices = t2_bad;
  edges[2].target_count = 2;
  expect_error(pcp_topology_index_carrier_validate(&carrier),
               PCP_TOPOLOGY_ERROR_NON_MONOTONIC_CARRIER);
  carrier.edge_count = 2;
  expect_error(pcp_topology_index_carrier_validate(&carrier),
               PCP_TOPOLOGY_ERROR_MISSING_CARRIER_EDGE);
  const uint32_t t_far[] = {9};
  pcp_topology_index_edge_t far_edges[] = {{0, t_far, 1}};
  pcp_topology_index_carrier_t far = {input, output, far_edges, 1};
  expect_error(pcp_topology_index_carrier_validate(&far),
               PCP_TOPOLOGY_ERROR_OUTPUT_INDEX_OUT_OF_RANGE);
  pcp_topology_index_edge_t dup_edges[] = {{0, t0, 1}, {0, t0, 1}};
  pcp_topology_index_carrier_t dup = {input, output, dup_edges, 2};
  expect_error(pcp_topology_index_carrier_validate(&dup),
               PCP_TOPOLOGY_ERROR_DUPLICATE_CARRIER_EDGE);
  pcp_topology_complex_release(output);
  pcp_topology_complex_release(input);
}

typedef struct execution_fixture_t {
  pcp_topology_complex_t* input;
  pcp_topology_complex_t* protocol;
  pcp_topology_complex_t* output;
} execution_fixture_t;

// Two inputs {a0,b0} and {a0,b1} share a0; the protocol lists one view per
// input; outputs o0 (for input 0) and o1 (for input 1).
static execution_fixture_t make_execution_fixture(void) {
  execution_fixture_t f = {make_complex(), make_complex(), make_complex()};
  ADD(f.input, P(0, 0), P(1, 0));
  ADD(f.input, P(0, 0), P(1, 1));
  ADD(f.protocol, Q(0, 0), Q(1, 0));
  ADD(f.protocol, Q(0, 1), Q(1, 1));
  ADD(f.output, O(0, 0), O(1, 0));
  ADD(f.output, O(0, 1), O(1, 1));
  return f;
}

static void release_execution_fixture(execution_fixture_t* f) {
  pcp_topology_complex_release(f->input);
  pcp_topology_complex_release(f->protocol);
  pcp_topology_complex_release(f->output);
}

static void test_execution_carrier_validates_reachable_protocol_decisions(
    void** state) {
  (void)state;
  execution_fixture_t f = make_execution_fixture();
  const uint32_t p0[] = {0}, p1[] = {1};
  pcp_topology_index_edge_t xi_edges[] = {{0, p0, 1}, {1, p1, 1}};
  pcp_topology_index_carrier_t xi = {f.input, f.protocol, xi_edges, 2};
  pcp_topology_index_edge_t delta_edges[] = {{0, p0, 1}, {1, p1, 1}};
  pcp_topology_index_carrier_t delta = {f.input, f.output, delta_edges, 2};
  PCP_CHECK_OK(pcp_topology_execution_carrier_validate(&xi));
  pcp_topology_protocol_decision_t decisions[] = {{0, 0}, {1, 1}};
  PCP_CHECK_OK(
      pcp_topology_execution_decision_map_validate(&xi, &delta, decisions, 2));
  // A protocol simplex no input reaches.
  pcp_topology_index_edge_t partial_edges[] = {{0, p0, 1}, {1, p0, 1}};
  pcp_topology_index_carrier_t partial = {f.input, f.protocol, partial_edges,
                                          2};
  expect_error(pcp_topology_execution_decision_map_validate(&partial, &delta,
                                                            &decisions[1], 1),
               PCP_TOPOLOGY_ERROR_PROTOCOL_OUTSIDE_EXECUTION_CARRIER);
  pcp_topology_index_edge_t empty_edges[] = {{0, p0, 0}, {1, p1, 1}};
  pcp_topology_index_carrier_t empty = {f.input, f.protocol, empty_edges, 2};
  expect_error(pcp_topology_execution_carrier_validate(&empty),
               PCP_TOPOLOGY_ERROR_EMPTY_EXECUTION_CARRIER);
  release_execution_fixture(&f);
}

static void test_execution_observations_stay_inside_the_execution_carrier(
    void** state) {
  (void)state;
  execution_fixture_t f = make_execution_fixture();
  const uint32_t p0[] = {0}, p1[] = {1};
  pcp_topology_index_edge_t xi_edges[] = {{0, p0, 1}, {1, p1, 1}};
  pcp_topology_index_carrier_t xi = {f.input, f.protocol, xi_edges, 2};
  pcp_topology_execution_observation_t good[] = {{0, 0}, {1, 1}};
  PCP_CHECK_OK(pcp_topology_execution_observations_validate(&xi, good, 2));
  pcp_topology_execution_observation_t stray[] = {{0, 0}, {1, 1}, {0, 1}};
  expect_error(pcp_topology_execution_observations_validate(&xi, stray, 3),
               PCP_TOPOLOGY_ERROR_PROTOCOL_OUTSIDE_EXECUTION_CARRIER);
  expect_error(pcp_topology_execution_observations_validate(&xi, good, 1),
               PCP_TOPOLOGY_ERROR_MISSING_EXECUTION_OBSERVATION);
  release_execution_fixture(&f);
}

static void test_execution_decision_map_rejects_task_carrier_escapes(
    void** state) {
  (void)state;
  execution_fixture_t f = make_execution_fixture();
  const uint32_t p0[] = {0}, p1[] = {1}, p01[] = {0, 1};
  pcp_topology_index_edge_t xi_edges[] = {{0, p0, 1}, {1, p1, 1}};
  pcp_topology_index_carrier_t xi = {f.input, f.protocol, xi_edges, 2};
  pcp_topology_index_edge_t delta_edges[] = {{0, p0, 1}, {1, p1, 1}};
  pcp_topology_index_carrier_t delta = {f.input, f.output, delta_edges, 2};
  // Protocol 0 decides output 1, which input 0 does not carry.
  pcp_topology_protocol_decision_t escape[] = {{0, 1}, {1, 1}};
  expect_error(
      pcp_topology_execution_decision_map_validate(&xi, &delta, escape, 2),
      PCP_TOPOLOGY_ERROR_DECISION_OUTSIDE_CARRIER);
  // One protocol decision must satisfy every input carrying that execution:
  // protocol 0 is reachable from both inputs, input 1 forbids output 0.
  pcp_topology_index_edge_t shared_edges[] = {{0, p0, 1}, {1, p01, 2}};
  pcp_topology_index_carrier_t shared = {f.input, f.protocol, shared_edges, 2};
  pcp_topology_protocol_decision_t decisions[] = {{0, 0}, {1, 1}};
  expect_error(pcp_topology_execution_decision_map_validate(&shared, &delta,
                                                            decisions, 2),
               PCP_TOPOLOGY_ERROR_DECISION_OUTSIDE_CARRIER);
  release_execution_fixture(&f);
}

static void test_decision_map_rejects_outputs_outside_the_carrier(
    void** state) {
  (void)state;
  execution_fixture_t f = make_execution_fixture();
  const uint32_t p0[] = {0}, p1[] = {1};
  pcp_topology_index_edge_t delta_edges[] = {{0, p0, 1}, {1, p1, 1}};
  pcp_topology_index_carrier_t delta = {f.input, f.output, delta_edges, 2};
  pcp_topology_decision_edge_t good[] = {{0, 0, 0}, {1, 1, 1}};
  PCP_CHECK_OK(pcp_topology_decision_map_validate(f.protocol, &delta, good, 2));
  pcp_topology_decision_edge_t bad[] = {{0, 0, 1}, {1, 1, 1}};
  expect_error(pcp_topology_decision_map_validate(f.protocol, &delta, bad, 2),
               PCP_TOPOLOGY_ERROR_DECISION_OUTSIDE_CARRIER);
  expect_error(pcp_topology_decision_map_validate(f.protocol, &delta, good, 1),
               PCP_TOPOLOGY_ERROR_MISSING_DECISION);
  pcp_topology_decision_edge_t twice[] = {{0, 0, 0}, {0, 0, 0}};
  expect_error(pcp_topology_decision_map_validate(f.protocol, &delta, twice, 2),
               PCP_TOPOLOGY_ERROR_DUPLICATE_DECISION);
  release_execution_fixture(&f);
}

static void test_decision_map_rejects_incompatible_outputs_for_a_shared_view(
    void** state) {
  (void)state;
  // Protocol simplices share the view q0:0; their outputs disagree on p0.
  pcp_topology_complex_t* input = make_complex();
  ADD(input, P(0, 0), P(1, 0));
  ADD(input, P(0, 0), P(1, 1));
  pcp_topology_complex_t* protocol = make_complex();
  ADD(protocol, Q(0, 0), Q(1, 0));
  ADD(protocol, Q(0, 0), Q(1, 1));
  pcp_topology_complex_t* output = make_complex();
  ADD(output, O(0, 0), O(1, 0));
  ADD(output, O(0, 1), O(1, 1));
  ADD(output, O(1, 5));
  const uint32_t o0[] = {0}, o1[] = {1, 2};
  pcp_topology_index_edge_t edges[] = {{0, o0, 1}, {1, o1, 2}};
  pcp_topology_index_carrier_t delta = {input, output, edges, 2};
  pcp_topology_decision_edge_t decisions[] = {{0, 0, 0}, {1, 1, 1}};
  pcp_status_t status =
      pcp_topology_decision_map_validate(protocol, &delta, decisions, 2);
  assert_non_null(
      strstr(pcp_status_message(status), "IncompatibleDecisionOnSharedView"));
  expect_error(status, PCP_TOPOLOGY_ERROR_INCOMPATIBLE_DECISION_ON_SHARED_VIEW);
  // An output without the shared view's colour.
  pcp_topology_decision_edge_t missing[] = {{0, 0, 0}, {1, 1, 2}};
  expect_error(pcp_topology_decision_map_validate(protocol, &delta, missing, 2),
               PCP_TOPOLOGY_ERROR_SHARED_VIEW_MISSING_OUTPUT_VERTEX);
  pcp_topology_complex_release(output);
  pcp_topology_complex_release(protocol);
  pcp_topology_complex_release(input);
}

static void test_toy_approximate_agreement_task_is_representable_and_decidable(
    void** state) {
  (void)state;
  // Inputs p0 = 0 and p1 = 2; outputs {p0:0}, {p1:2}, {p0:1, p1:1}.
  pcp_topology_complex_t* input = make_complex();
  ADD(input, P(0, 0));
  ADD(input, P(1, 2));
  ADD(input, P(0, 0), P(1, 2));
  pcp_topology_complex_t* output = make_complex();
  ADD(output, O(0, 0));
  ADD(output, O(1, 2));
  ADD(output, O(0, 1), O(1, 1));
  pcp_topology_complex_t* protocol = make_complex();
  ADD(protocol, Q(0, 0));
  ADD(protocol, Q(1, 2));
  ADD(protocol, Q(0, 1), Q(1, 1));
  PCP_CHECK_OK(pcp_topology_complex_validate(output, NULL));
  const uint32_t t0[] = {0}, t1[] = {1}, t2[] = {0, 1, 2};
  pcp_topology_index_edge_t edges[] = {{0, t0, 1}, {1, t1, 1}, {2, t2, 3}};
  pcp_topology_index_carrier_t delta = {input, output, edges, 3};
  PCP_CHECK_OK(pcp_topology_index_carrier_validate(&delta));
  pcp_topology_decision_edge_t decisions[] = {{0, 0, 0}, {1, 1, 1}, {2, 2, 2}};
  PCP_CHECK_OK(
      pcp_topology_decision_map_validate(protocol, &delta, decisions, 3));
  pcp_topology_complex_release(protocol);
  pcp_topology_complex_release(output);
  pcp_topology_complex_release(input);
}

static void test_text_forms_and_error_names(void** state) {
  (void)state;
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(ALLOC, 0, &builder);
  pcp_topology_vertex_t vs[] = {
      P(0, 3),
      pcp_topology_make_vertex(
          pcp_topology_make_color(PCP_TOPOLOGY_COLOR_GATEWAY, 1),
          pcp_topology_make_symbol("status.accepted")),
  };
  PCP_CHECK_OK(pcp_topology_simplex_format(SIMPLEX(vs), &builder));
  assert_string_equal(pcp_string_builder_cstring(&builder),
                      "{process.0:input.3, gateway.1:status.accepted}");
  pcp_string_builder_deinitialize(&builder);
  assert_string_equal(
      pcp_topology_error_name(PCP_TOPOLOGY_ERROR_NON_SIMPLICIAL_MAP),
      "NonSimplicialMap");
  assert_int_equal(pcp_topology_error_code(PCP_TOPOLOGY_ERROR_DUPLICATE_COLOR),
                   PCP_STATUS_INVALID_ARGUMENT);
  // Annotations do not hide the error name.
  pcp_status_t status = pcp_status_annotate_f(
      pcp_topology_make_status(PCP_TOPOLOGY_ERROR_NO_PATH, "x"), "outer");
  expect_error(status, PCP_TOPOLOGY_ERROR_NO_PATH);
  assert_int_equal(pcp_topology_status_error(pcp_ok_status()),
                   PCP_TOPOLOGY_ERROR_NONE);
}

static void test_allocation_failures_are_statuses(void** state) {
  (void)state;
  // Fail each allocation in turn while building faces of a triangle: every
  // failure must come back as a status, never a crash or a leak.
  for (int64_t n = 0; n < 64; ++n) {
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_system(), n, true, &failing);
    pcp_allocator_t allocator = pcp_allocator_failing(&failing);
    pcp_topology_complex_t* complex = NULL;
    pcp_topology_complex_t* faces = NULL;
    pcp_status_t status = pcp_topology_complex_create(allocator, &complex);
    if (!status)
      status = pcp_topology_complex_create(allocator, &faces);
    if (!status) {
      pcp_topology_vertex_t vs[] = {P(0, 0), P(1, 0), P(2, 0)};
      status = pcp_topology_complex_add(complex, SIMPLEX(vs), NULL);
    }
    if (!status)
      status = pcp_topology_complex_faces(complex, faces);
    if (!status)
      assert_int_equal(pcp_topology_complex_count(faces), 8);
    pcp_status_ignore(status);
    pcp_topology_complex_release(faces);
    pcp_topology_complex_release(complex);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_simplex_rejects_duplicate_colors),
      cmocka_unit_test(test_simplex_equality_is_order_independent),
      cmocka_unit_test(test_complex_membership_is_closed_under_faces),
      cmocka_unit_test(test_complex_rejects_duplicate_named_simplexes),
      cmocka_unit_test(
          test_simplex_canonicalization_and_hashing_are_order_independent),
      cmocka_unit_test(
          test_vertex_registry_interns_color_label_pairs_deterministically),
      cmocka_unit_test(
          test_complex_enumerates_vertices_faces_dimension_and_purity),
      cmocka_unit_test(test_complex_faces_follow_the_stored_vertex_order),
      cmocka_unit_test(test_complex_purity_uses_maximal_simplexes),
      cmocka_unit_test(
          test_skeleton_and_boundary_are_explicit_finite_complexes),
      cmocka_unit_test(test_star_closed_star_and_link_follow_face_closure),
      cmocka_unit_test(
          test_subcomplex_operations_keep_outputs_closed_inside_the_parent),
      cmocka_unit_test(
          test_subcomplex_image_maps_closed_faces_into_a_target_parent),
      cmocka_unit_test(
          test_join_builds_the_face_closed_product_over_disjoint_colors),
      cmocka_unit_test(
          test_vertex_maps_validate_simplicial_color_preserving_rigid_images),
      cmocka_unit_test(
          test_vertex_maps_reject_non_simplicial_images_and_rigid_collapses),
      cmocka_unit_test(
          test_simplicial_carrier_maps_validate_strict_rigid_chromatic),
      cmocka_unit_test(test_carrier_map_validation_names_each_broken_rule),
      cmocka_unit_test(
          test_carrier_calculus_composes_carrier_maps_and_decision_maps),
      cmocka_unit_test(test_carried_decision_maps_reject_task_carrier_escapes),
      cmocka_unit_test(test_carrier_map_validates_monotonic_output_sets),
      cmocka_unit_test(
          test_execution_carrier_validates_reachable_protocol_decisions),
      cmocka_unit_test(
          test_execution_observations_stay_inside_the_execution_carrier),
      cmocka_unit_test(
          test_execution_decision_map_rejects_task_carrier_escapes),
      cmocka_unit_test(test_decision_map_rejects_outputs_outside_the_carrier),
      cmocka_unit_test(
          test_decision_map_rejects_incompatible_outputs_for_a_shared_view),
      cmocka_unit_test(
          test_toy_approximate_agreement_task_is_representable_and_decidable),
      cmocka_unit_test(test_text_forms_and_error_names),
      cmocka_unit_test(test_allocation_failures_are_statuses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
