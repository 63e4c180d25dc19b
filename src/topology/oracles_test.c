// SPDX-License-Identifier: Apache-2.0
//
// The merge oracle (reference s.6, oracles/decoupled_merge tests, same
// values).

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <math.h>
#include <stdlib.h>

#include "topology/protocols_impl.h"

#define DIRECT PCP_TOPOLOGY_MERGE_DIRECT_AVERAGE
#define TOKEN PCP_TOPOLOGY_MERGE_TOKEN_WEIGHTED
#define RDA PCP_TOPOLOGY_MERGE_RDA

static pcp_topology_merge_update_t up(uint32_t learner, const double* values,
                                      uint64_t tokens, uint64_t steps) {
  pcp_topology_merge_update_t u = {learner, 0,     false,   values,
                                   tokens,  steps, learner, 0};
  return u;
}

static pcp_topology_merge_result_t run(pcp_topology_merge_kind_t kind,
                                       uint32_t quorum,
                                       const pcp_topology_merge_update_t* u,
                                       size_t count, size_t dimension) {
  pcp_topology_merge_result_t r;
  PCP_CHECK_OK(
      pcp_topology_merge_oracle_run(kind, 0, quorum, u, count, dimension, &r));
  return r;
}

static void test_direct_and_token_weighted(void** state) {
  (void)state;
  double a[2] = {0, 10}, b[2] = {10, 20};
  pcp_topology_merge_update_t u[2] = {up(0, a, 10, 1), up(1, b, 10, 1)};
  pcp_topology_merge_result_t r = run(DIRECT, 2, u, 2, 2);
  assert_true(r.output[0] == 5.0 && r.output[1] == 15.0);
  double x0[1] = {0}, x1[1] = {10};
  pcp_topology_merge_update_t w[2] = {up(0, x0, 10, 1), up(1, x1, 10, 2)};
  r = run(TOKEN, 2, w, 2, 1);
  assert_true(r.total_weight == 150.0);
  assert_true(r.output[0] == 3.3333333333333335);
}

static void test_rda_envelope_and_rejections(void** state) {
  (void)state;
  double a[2] = {1, 1}, b[2] = {1, -1};
  pcp_topology_merge_update_t u[2] = {up(0, a, 10, 1), up(1, b, 10, 1)};
  pcp_topology_merge_result_t r = run(RDA, 2, u, 2, 2);
  assert_true(fabs(r.output[0] - sqrt(2.0)) < 1e-12 &&
              fabs(r.output[1]) < 1e-12);
  assert_int_equal(pcp_topology_merge_oracle_check_claim(RDA, &r, r.output),
                   PCP_TOPOLOGY_MERGE_VIOLATION_NONE);
  double average[2] = {1, 0}, wrong[2] = {0, sqrt(2.0)};
  assert_int_equal(pcp_topology_merge_oracle_check_claim(RDA, &r, average),
                   PCP_TOPOLOGY_MERGE_VIOLATION_RDA_NORM_MISMATCH);
  assert_int_equal(pcp_topology_merge_oracle_check_claim(RDA, &r, wrong),
                   PCP_TOPOLOGY_MERGE_VIOLATION_RDA_DIRECTION_MISMATCH);
  // The same output is outside a direct average's envelope.
  pcp_topology_merge_result_t d = run(DIRECT, 2, u, 2, 2);
  assert_int_equal(pcp_topology_merge_oracle_check_claim(DIRECT, &d, r.output),
                   PCP_TOPOLOGY_MERGE_VIOLATION_OUTSIDE_ENVELOPE);
}

static void test_rda_token_weights(void** state) {
  (void)state;
  double a[2] = {2, 0}, b[2] = {0, 2};
  pcp_topology_merge_update_t u[2] = {up(0, a, 10, 1), up(1, b, 10, 2)};
  pcp_topology_merge_result_t r = run(RDA, 2, u, 2, 2);
  assert_true(r.total_weight == 150.0);
  assert_true(r.direction_weight == 150.0);
  assert_true(fabs(r.mean_norm - 2.0) < 1e-12);
  assert_true(fabs(r.output_norm - 2.0) < 1e-12);
  assert_true(fabs(r.output[0] - 1.78885436) < 1e-7);
  assert_true(fabs(r.output[1] - 0.89442718) < 1e-7);
}

static void test_degenerate_direction(void** state) {
  (void)state;
  double a[2] = {1, 0}, b[2] = {-1, 0}, zero[2] = {0, 0};
  pcp_topology_merge_update_t u[2] = {up(0, a, 10, 1), up(1, b, 10, 1)};
  pcp_topology_merge_result_t r = run(RDA, 2, u, 2, 2);
  assert_int_equal(pcp_topology_merge_oracle_check_claim(RDA, &r, zero),
                   PCP_TOPOLOGY_MERGE_VIOLATION_NONE);
  assert_int_equal(pcp_topology_merge_oracle_check_claim(RDA, &r, a),
                   PCP_TOPOLOGY_MERGE_VIOLATION_RDA_DIRECTION_MISMATCH);
}

static void test_participation_rules(void** state) {
  (void)state;
  double x0[1] = {0}, x1[1] = {10}, x2[1] = {99}, x3[1] = {-50};
  // Late and stale updates are excluded.
  pcp_topology_merge_update_t u[4] = {up(0, x0, 10, 1), up(1, x1, 10, 1),
                                      up(2, x2, 10, 1), up(3, x3, 10, 1)};
  u[2].late = true;
  u[3].step = 7;
  pcp_topology_merge_result_t r = run(DIRECT, 2, u, 4, 1);
  assert_int_equal(r.participants, 2);
  assert_int_equal(r.non_participants, 2);
  assert_true(r.output[0] == 5.0);
  // Quorum 3 with one update past the grace window.
  pcp_topology_merge_update_t g[3] = {up(0, x0, 10, 1), up(1, x1, 10, 1),
                                      up(2, x2, 10, 1)};
  g[2].late = true;
  r = run(DIRECT, 3, g, 3, 1);
  assert_int_equal(r.violation, PCP_TOPOLOGY_MERGE_VIOLATION_BELOW_QUORUM);
  assert_int_equal(r.participants, 2);
  assert_int_equal(r.non_participants, 1);
  // The same learner twice.
  pcp_topology_merge_update_t dup[2] = {up(4, x0, 10, 1), up(4, x1, 10, 1)};
  r = run(DIRECT, 1, dup, 2, 1);
  assert_int_equal(r.violation, PCP_TOPOLOGY_MERGE_VIOLATION_DUPLICATE_UPDATE);
}

static void test_claimed_output_and_local_views(void** state) {
  (void)state;
  double x0[1] = {0}, x1[1] = {10};
  pcp_topology_merge_update_t u[2] = {up(0, x0, 10, 1), up(1, x1, 10, 1)};
  pcp_topology_merge_result_t r = run(DIRECT, 2, u, 2, 1);
  double c100[1] = {100}, c4[1] = {4}, c5[1] = {5};
  assert_int_equal(pcp_topology_merge_oracle_check_claim(DIRECT, &r, c100),
                   PCP_TOPOLOGY_MERGE_VIOLATION_OUTSIDE_ENVELOPE);
  assert_int_equal(pcp_topology_merge_oracle_check_claim(DIRECT, &r, c4),
                   PCP_TOPOLOGY_MERGE_VIOLATION_AVERAGE_MISMATCH);
  assert_int_equal(pcp_topology_merge_oracle_check_claim(DIRECT, &r, c5),
                   PCP_TOPOLOGY_MERGE_VIOLATION_NONE);
  // Two learners with one local view decide differently.
  u[1].view = u[0].view;
  u[1].decision = 1;
  assert_int_equal(pcp_topology_merge_local_views_check(u, 2),
                   PCP_TOPOLOGY_MERGE_VIOLATION_INCOMPATIBLE_LOCAL_VIEWS);
}

// A claimed output outside the envelope, shrunk to the fewest participants
// a merge needs (quorum 2).
typedef struct shrink_ctx_t {
  const pcp_topology_merge_update_t* updates;
  double claimed;
} shrink_ctx_t;

static bool claim_outside(void* user_data, const uint32_t* retained,
                          size_t count) {
  const shrink_ctx_t* ctx = (const shrink_ctx_t*)user_data;
  pcp_topology_merge_update_t subset[PCP_TOPOLOGY_MERGE_MAX_UPDATES];
  for (size_t i = 0; i < count; ++i) subset[i] = ctx->updates[retained[i]];
  pcp_topology_merge_result_t r;
  if (pcp_topology_merge_oracle_run(DIRECT, 0, 2, subset, count, 1, &r)) {
    return false;
  }
  return pcp_topology_merge_oracle_check_claim(DIRECT, &r, &ctx->claimed) ==
         PCP_TOPOLOGY_MERGE_VIOLATION_OUTSIDE_ENVELOPE;
}

static void test_shrink_claim_outside_envelope(void** state) {
  (void)state;
  double v[4][1] = {{0}, {10}, {4}, {6}};
  pcp_topology_merge_update_t u[4] = {up(0, v[0], 10, 1), up(1, v[1], 10, 1),
                                      up(2, v[2], 10, 1), up(3, v[3], 10, 1)};
  shrink_ctx_t ctx = {u, 100.0};
  uint32_t* retained = NULL;
  size_t count = 0;
  PCP_CHECK_OK(pcp_topology_indices_shrink(
      pcp_allocator_system(), 4, claim_outside, &ctx, &retained, &count));
  assert_int_equal(count, 2);
  assert_true(claim_outside(&ctx, retained, count));
  free(retained);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_direct_and_token_weighted),
      cmocka_unit_test(test_rda_envelope_and_rejections),
      cmocka_unit_test(test_rda_token_weights),
      cmocka_unit_test(test_degenerate_direction),
      cmocka_unit_test(test_participation_rules),
      cmocka_unit_test(test_claimed_output_and_local_views),
      cmocka_unit_test(test_shrink_claim_outside_envelope),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
