// SPDX-License-Identifier: Apache-2.0
//
// Task composition (reference s.6, composition.zig tests).

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <string.h>

#include "topology/protocols_impl.h"

static pcp_topology_vertex_t sv(pcp_topology_color_kind_t kind, uint32_t n,
                                const char* symbol) {
  return pcp_topology_make_vertex(pcp_topology_make_color(kind, n),
                                  pcp_topology_make_symbol(symbol));
}

static bool carries(const pcp_topology_carrier_map_t* carrier,
                    const pcp_topology_task_case_t* input_case,
                    const pcp_topology_vertex_t* output, size_t count) {
  pcp_topology_vertex_t in[PCP_TOPOLOGY_TASK_MAX_COLORS];
  pcp_topology_task_case_vertices(input_case, -1, in);
  return pcp_topology_carrier_map_carries(
      carrier, pcp_topology_make_simplex(in, input_case->color_count),
      pcp_topology_make_simplex(output, count));
}

static const pcp_topology_vertex_t* rda_direction(void) {
  static pcp_topology_vertex_t v[3];
  v[0] = sv(PCP_TOPOLOGY_COLOR_GATEWAY, 0, "rda.output.direction_norm_carried");
  v[1] = sv(PCP_TOPOLOGY_COLOR_SESSION, 50, "merge.committed");
  v[2] = sv(PCP_TOPOLOGY_COLOR_WORKER, 0, "participants.used");
  return v;
}

static const pcp_topology_vertex_t* rda_none(void) {
  static pcp_topology_vertex_t v[3];
  v[0] = sv(PCP_TOPOLOGY_COLOR_GATEWAY, 0, "rda.output.none");
  v[1] = sv(PCP_TOPOLOGY_COLOR_SESSION, 52, "merge.deferred");
  v[2] = sv(PCP_TOPOLOGY_COLOR_WORKER, 0, "participants.insufficient");
  return v;
}

// projected carrier composition validates workload to RDA chain
static void test_workload_to_rda_chain(void** state) {
  (void)state;
  pcp_topology_global_composition_t c;
  pcp_topology_global_composition_initialize(pcp_allocator_system(), &c);
  PCP_CHECK_OK(pcp_topology_global_composition_build(&c));
  PCP_CHECK_OK(pcp_topology_carrier_map_validate(
      c.detailed, pcp_topology_carrier_checks_default()));
  const pcp_topology_task_case_t* workload = c.stages[0].definition->cases;
  // The regular request reaches both the committed and the deferred RDA
  // output (through the federation loss branch).
  assert_true(carries(c.detailed, &workload[0], rda_direction(), 3));
  assert_true(carries(c.detailed, &workload[0], rda_none(), 3));
  // Composing nothing is an error.
  pcp_topology_carrier_map_t* out = NULL;
  pcp_status_t status = pcp_topology_carriers_compose_projected(
      c.stages[0].carrier, NULL, 0, pcp_allocator_system(), &out);
  assert_int_equal(pcp_topology_status_error(status),
                   PCP_TOPOLOGY_ERROR_EMPTY_COMPOSITION);
  pcp_status_ignore(status);
  pcp_topology_global_composition_deinitialize(&c);
}

// invalid workload cannot refine to committed RDA output
static void test_invalid_workload_never_commits(void** state) {
  (void)state;
  pcp_topology_global_composition_t c;
  pcp_topology_global_composition_initialize(pcp_allocator_system(), &c);
  PCP_CHECK_OK(pcp_topology_global_composition_build(&c));
  const pcp_topology_task_case_t* workload = c.stages[0].definition->cases;
  assert_false(carries(c.detailed, &workload[1], rda_direction(), 3));
  assert_true(carries(c.detailed, &workload[1], rda_none(), 3));
  // An abstract contract that demands a commit for every request is not
  // refined: the invalid request only ever defers.
  pcp_topology_carrier_map_t* committed_only = NULL;
  PCP_CHECK_OK(
      pcp_topology_carrier_map_create(c.stages[0].input, c.global.output,
                                      pcp_allocator_system(), &committed_only));
  pcp_topology_complex_t* faces = NULL;
  pcp_topology_complex_t* image = NULL;
  PCP_CHECK_OK(pcp_topology_complex_create(pcp_allocator_system(), &faces));
  PCP_CHECK_OK(pcp_topology_complex_create(pcp_allocator_system(), &image));
  PCP_CHECK_OK(pcp_topology_complex_faces(c.stages[0].input, faces));
  pcp_topology_vertex_t committed[3] = {
      sv(PCP_TOPOLOGY_COLOR_HUB, 0, "global_job.committed"),
      sv(PCP_TOPOLOGY_COLOR_JOB, 60, "job.running"),
      sv(PCP_TOPOLOGY_COLOR_GATEWAY, 1, "gateway_a.committed")};
  for (size_t f = 0; f < pcp_topology_complex_count(faces); ++f) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, f);
    pcp_topology_complex_clear(image);
    if (face.count == 0) {
      PCP_CHECK_OK(pcp_topology_complex_append(image, face));
    } else {
      PCP_CHECK_OK(pcp_topology_complex_add(
          image, pcp_topology_make_simplex(committed, 3), NULL));
    }
    PCP_CHECK_OK(pcp_topology_carrier_map_set(committed_only, face, image));
  }
  pcp_status_t status = pcp_topology_projected_refinement_validate(
      c.detailed, c.projections[5], committed_only, pcp_allocator_system());
  assert_int_equal(pcp_topology_status_error(status),
                   PCP_TOPOLOGY_ERROR_DETAILED_CARRIER_ESCAPES_ABSTRACT_TASK);
  pcp_status_ignore(status);
  pcp_topology_complex_release(faces);
  pcp_topology_complex_release(image);
  pcp_topology_carrier_map_release(committed_only);
  pcp_topology_global_composition_deinitialize(&c);
}

// RDA to global projection refines detailed pipeline to abstract global
// carrier
static void test_rda_to_global_refines(void** state) {
  (void)state;
  pcp_topology_global_composition_t c;
  pcp_topology_global_composition_initialize(pcp_allocator_system(), &c);
  PCP_CHECK_OK(pcp_topology_global_composition_build(&c));
  PCP_CHECK_OK(pcp_topology_projected_refinement_validate(
      c.detailed, c.projections[5], c.abstract, pcp_allocator_system()));
  // The abstract carrier has the workload inputs as domain: a carrier on
  // another input complex is a domain mismatch.
  pcp_status_t status = pcp_topology_projected_refinement_validate(
      c.stages[5].carrier, c.projections[5], c.abstract,
      pcp_allocator_system());
  assert_int_equal(pcp_topology_status_error(status),
                   PCP_TOPOLOGY_ERROR_REFINEMENT_DOMAIN_MISMATCH);
  pcp_status_ignore(status);
  pcp_topology_global_composition_deinitialize(&c);
}

// reservation cleanup composes through fragment rejection into deferred
// merge
static void test_reservation_cleanup_composes_to_deferred_merge(void** state) {
  (void)state;
  pcp_topology_global_composition_t c;
  pcp_topology_global_composition_initialize(pcp_allocator_system(), &c);
  PCP_CHECK_OK(pcp_topology_global_composition_build(&c));
  pcp_topology_composition_link_t links[2] = {
      {c.projections[3], c.stages[4].carrier},
      {c.projections[4], c.stages[5].carrier},
  };
  pcp_topology_carrier_map_t* composed = NULL;
  PCP_CHECK_OK(pcp_topology_carriers_compose_projected(
      c.stages[3].carrier, links, 2, pcp_allocator_system(), &composed));
  const pcp_topology_task_case_t* cancel = &c.stages[3].definition->cases[3];
  assert_true(carries(composed, cancel, rda_none(), 3));
  assert_false(carries(composed, cancel, rda_direction(), 3));
  pcp_topology_vertex_t in[PCP_TOPOLOGY_TASK_MAX_COLORS];
  pcp_topology_task_case_vertices(cancel, -1, in);
  const pcp_topology_complex_t* image = pcp_topology_carrier_map_lookup(
      composed, pcp_topology_make_simplex(in, cancel->color_count));
  assert_non_null(image);
  assert_int_equal(pcp_topology_complex_dimension(image), 2);
  pcp_topology_carrier_map_release(composed);
  pcp_topology_global_composition_deinitialize(&c);
}

static void test_projection_rejects_unknown_vertices(void** state) {
  (void)state;
  pcp_topology_task_t a, b;
  PCP_CHECK_OK(pcp_topology_task_build(PCP_TOPOLOGY_TASK_RDA_MERGE,
                                       pcp_allocator_system(), &a));
  PCP_CHECK_OK(pcp_topology_task_build(
      PCP_TOPOLOGY_TASK_MULTI_GATEWAY_GLOBAL_JOB, pcp_allocator_system(), &b));
  pcp_topology_projection_pair_t bad = {{PCP_TOPOLOGY_COLOR_GATEWAY, 0},
                                        "rda.output.nope",
                                        {PCP_TOPOLOGY_COLOR_HUB, 0},
                                        "global_job.committed"};
  pcp_topology_vertex_map_t* map = NULL;
  pcp_status_t status = pcp_topology_projection_create(
      a.output, b.output, &bad, 1, pcp_allocator_system(), &map);
  assert_int_equal(pcp_topology_status_error(status),
                   PCP_TOPOLOGY_ERROR_VERTEX_REF_NOT_FOUND);
  pcp_status_ignore(status);
  pcp_topology_task_deinitialize(&a);
  pcp_topology_task_deinitialize(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_workload_to_rda_chain),
      cmocka_unit_test(test_invalid_workload_never_commits),
      cmocka_unit_test(test_rda_to_global_refines),
      cmocka_unit_test(test_reservation_cleanup_composes_to_deferred_merge),
      cmocka_unit_test(test_projection_rejects_unknown_vertices),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
