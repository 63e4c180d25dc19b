// SPDX-License-Identifier: Apache-2.0
// Unit tests of the decoupled DiLoCo core (decoupled.h). Where the reference
// digest (s.1.3, s.8) gives a worked example the test asserts its numbers:
// merge weight 10^2/2 = 50, the weighted average 2.6667, the two RDA
// examples (0.7071, 0.7071) and (1.8974, 0.6325), balanced bytes 112/100,
// the schedule with P = H, quorum/grace with arrivals 0/4/9 ms and grace 5
// (participants 2, grace 1, skipped 1), int4 error <= scale/2. The rest are
// hand-computed here. NumPy comparisons: decoupled_numpy_test.

#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "proto/proto.h"
#include "workloads/workloads.h"

static void expect_code_at(pcp_status_t status, pcp_status_code_t code,
                           const char* needle, const char* expr,
                           const char* file, int line) {
  pcp_status_code_t actual = pcp_status_code(status);
  char text[1024] = "";
  pcp_status_format(status, text, sizeof(text));
  if (actual != code) {
    print_error("%s:%d: %s: want %s, got %s\n", file, line, expr,
                pcp_status_code_string(code), text);
  }
  pcp_status_ignore(status);
  _assert_int_equal(actual, code, file, line);
  if (needle != NULL && strstr(text, needle) == NULL) {
    print_error("%s:%d: %s: message lacks '%s': %s\n", file, line, expr, needle,
                text);
    _fail(file, line);
  }
}
#define EXPECT_CODE(expr, code) \
  expect_code_at((expr), (code), NULL, #expr, __FILE__, __LINE__)
#define EXPECT_ERROR(expr, code, needle) \
  expect_code_at((expr), (code), (needle), #expr, __FILE__, __LINE__)
#define EXPECT_OK(expr) EXPECT_CODE((expr), PCP_STATUS_OK)

static pcp_allocator_t sys(void) {
  return pcp_allocator_system();
}

//===----------------------------------------------------------------------===//
// Fragment plans
//===----------------------------------------------------------------------===//

static void spec_fill(pcp_decoupled_tensor_spec_t* specs,
                      const uint64_t* values, uint32_t n) {
  static const char* names[] = {"t0", "t1", "t2", "t3", "t4",
                                "t5", "t6", "t7", "t8", "t9"};
  for (uint32_t i = 0; i < n; ++i) {
    specs[i].name = names[i % 10];
    specs[i].value_count = values[i];
    specs[i].role = PCP_DECOUPLED_ROLE_TRANSFORMER;
  }
}

static void test_plan_strided(void** state) {
  (void)state;
  uint64_t values[5] = {3, 5, 7, 11, 13};
  pcp_decoupled_tensor_spec_t specs[5];
  spec_fill(specs, values, 5);
  pcp_decoupled_plan_t plan;
  EXPECT_OK(pcp_decoupled_plan_initialize(
      sys(), PCP_DECOUPLED_FRAGMENTS_STRIDED, specs, 5, NULL, 0, 2, 3, &plan));
  // Tensor i -> fragment i mod 2.
  assert_int_equal(plan.fragments[0].tensor_count, 3);
  assert_int_equal(plan.fragments[0].tensor_indices[0], 0);
  assert_int_equal(plan.fragments[0].tensor_indices[1], 2);
  assert_int_equal(plan.fragments[0].tensor_indices[2], 4);
  assert_int_equal(plan.fragments[0].offset_bytes[1], 12);  // after 3 values
  assert_int_equal(plan.fragments[0].offset_bytes[2], 40);  // 12 + 28
  assert_int_equal(plan.fragments[0].byte_count, 92);       // 4*(3+7+13)
  assert_int_equal(plan.fragments[1].tensor_count, 2);
  assert_int_equal(plan.fragments[1].tensor_indices[0], 1);
  assert_int_equal(plan.fragments[1].tensor_indices[1], 3);
  assert_int_equal(plan.fragments[1].byte_count, 64);
  assert_int_equal(plan.fragments[1].offset, 1);  // id mod H
  assert_int_equal(plan.tensor_value_offset[3], 15);
  pcp_decoupled_plan_deinitialize(&plan);
}

static void test_plan_balanced_digest(void** state) {
  (void)state;
  // 100, 64 and 48 bytes: the largest goes to fragment 0, 64 to fragment 1
  // (the emptier), then 48 to fragment 1 (64 < 100): 100 / 112 bytes.
  uint64_t values[3] = {16, 25, 12};  // 64, 100, 48 bytes
  pcp_decoupled_tensor_spec_t specs[3];
  spec_fill(specs, values, 3);
  pcp_decoupled_plan_t plan;
  EXPECT_OK(pcp_decoupled_plan_initialize(
      sys(), PCP_DECOUPLED_FRAGMENTS_BALANCED_TENSOR, specs, 3, NULL, 0, 2, 2,
      &plan));
  assert_int_equal(plan.fragments[0].byte_count, 100);
  assert_int_equal(plan.fragments[0].tensor_count, 1);
  assert_int_equal(plan.fragments[0].tensor_indices[0], 1);
  assert_int_equal(plan.fragments[1].byte_count, 112);
  assert_int_equal(plan.fragments[1].tensor_indices[0], 0);
  assert_int_equal(plan.fragments[1].tensor_indices[1], 2);
  assert_int_equal(plan.fragments[1].offset_bytes[1], 64);
  pcp_decoupled_plan_deinitialize(&plan);

  // Ties: equal sizes go by index to the lowest fragment among the
  // lightest. 40 | 10 10 10 10 over P = 3: 40 -> f0; 10(t0) -> f1;
  // 10(t1) -> f2; 10(t2) -> f1 (f1 = f2, lower id); 10(t3) -> f2.
  uint64_t tie[5] = {10, 10, 10, 10, 40};
  pcp_decoupled_tensor_spec_t tie_specs[5];
  spec_fill(tie_specs, tie, 5);
  EXPECT_OK(pcp_decoupled_plan_initialize(
      sys(), PCP_DECOUPLED_FRAGMENTS_BALANCED_TENSOR, tie_specs, 5, NULL, 0, 3,
      3, &plan));
  assert_int_equal(plan.tensor_fragment[4], 0);
  assert_int_equal(plan.tensor_fragment[0], 1);
  assert_int_equal(plan.tensor_fragment[1], 2);
  assert_int_equal(plan.tensor_fragment[2], 1);
  assert_int_equal(plan.tensor_fragment[3], 2);
  assert_int_equal(plan.fragments[1].byte_count, 80);
  pcp_decoupled_plan_deinitialize(&plan);
}

static void test_plan_roles_and_gather(void** state) {
  (void)state;
  uint64_t values[4] = {2, 3, 1, 2};
  pcp_decoupled_tensor_spec_t specs[4];
  spec_fill(specs, values, 4);
  uint32_t embeddings[1] = {2};
  pcp_decoupled_plan_t plan;
  EXPECT_OK(
      pcp_decoupled_plan_initialize(sys(), PCP_DECOUPLED_FRAGMENTS_STRIDED,
                                    specs, 4, embeddings, 1, 2, 2, &plan));
  assert_int_equal(plan.tensor_role[2], PCP_DECOUPLED_ROLE_EMBEDDING);
  assert_int_equal(plan.tensor_role[0], PCP_DECOUPLED_ROLE_TRANSFORMER);
  // Parameter vector 0..7; fragment 0 = tensors 0 (0,1) and 2 (5).
  float params[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  float frag[3] = {0};
  EXPECT_OK(pcp_decoupled_plan_gather(&plan, 0, params, frag));
  assert_true(frag[0] == 0.0f && frag[1] == 1.0f && frag[2] == 5.0f);
  float back[3] = {10, 11, 15};
  EXPECT_OK(pcp_decoupled_plan_scatter(&plan, 0, back, params));
  assert_true(params[0] == 10.0f && params[1] == 11.0f && params[5] == 15.0f);
  assert_true(params[2] == 2.0f && params[7] == 7.0f);
  EXPECT_CODE(pcp_decoupled_plan_gather(&plan, 2, params, frag),
              PCP_STATUS_OUT_OF_RANGE);
  pcp_decoupled_plan_deinitialize(&plan);
}

static void test_plan_errors(void** state) {
  (void)state;
  uint64_t values[3] = {4, 4, 4};
  pcp_decoupled_tensor_spec_t specs[3];
  spec_fill(specs, values, 3);
  pcp_decoupled_plan_t plan;
  EXPECT_ERROR(
      pcp_decoupled_plan_initialize(sys(), PCP_DECOUPLED_FRAGMENTS_STRIDED,
                                    specs, 3, NULL, 0, 0, 2, &plan),
      PCP_STATUS_INVALID_ARGUMENT, "num_fragments 0");
  EXPECT_ERROR(
      pcp_decoupled_plan_initialize(sys(), PCP_DECOUPLED_FRAGMENTS_STRIDED,
                                    specs, 3, NULL, 0, 1, 0, &plan),
      PCP_STATUS_INVALID_ARGUMENT, "sync_interval_h 0");
  EXPECT_ERROR(
      pcp_decoupled_plan_initialize(sys(), PCP_DECOUPLED_FRAGMENTS_STRIDED,
                                    specs, 3, NULL, 0, 3, 2, &plan),
      PCP_STATUS_INVALID_ARGUMENT, "rule: P <= H");
  EXPECT_ERROR(
      pcp_decoupled_plan_initialize(sys(), PCP_DECOUPLED_FRAGMENTS_STRIDED,
                                    specs, 3, NULL, 0, 4, 4, &plan),
      PCP_STATUS_INVALID_ARGUMENT, "every fragment holds a tensor");
  EXPECT_ERROR(
      pcp_decoupled_plan_initialize(sys(), PCP_DECOUPLED_FRAGMENTS_STRIDED,
                                    specs, 0, NULL, 0, 1, 1, &plan),
      PCP_STATUS_INVALID_ARGUMENT, "0 tensors");
  uint32_t bad_embedding[1] = {3};
  EXPECT_ERROR(
      pcp_decoupled_plan_initialize(sys(), PCP_DECOUPLED_FRAGMENTS_STRIDED,
                                    specs, 3, bad_embedding, 1, 1, 1, &plan),
      PCP_STATUS_INVALID_ARGUMENT, "embedding_tensor_indices[0] = 3");
  specs[1].value_count = 0;
  EXPECT_ERROR(
      pcp_decoupled_plan_initialize(sys(), PCP_DECOUPLED_FRAGMENTS_STRIDED,
                                    specs, 3, NULL, 0, 1, 1, &plan),
      PCP_STATUS_INVALID_ARGUMENT, "tensor 1 't1'");
}

static void test_plan_check_rules(void** state) {
  (void)state;
  uint64_t values[4] = {100, 1, 100, 1};
  pcp_decoupled_tensor_spec_t specs[4];
  spec_fill(specs, values, 4);
  pcp_decoupled_plan_t plan;
  EXPECT_OK(pcp_decoupled_plan_initialize(
      sys(), PCP_DECOUPLED_FRAGMENTS_STRIDED, specs, 4, NULL, 0, 2, 2, &plan));
  // Strided puts both big tensors in fragment 0 (800 vs 8 bytes): fine for
  // strided, a broken balance bound if it claimed to be balanced.
  plan.strategy = PCP_DECOUPLED_FRAGMENTS_BALANCED_TENSOR;
  EXPECT_ERROR(pcp_decoupled_plan_check(&plan), PCP_STATUS_INVALID_ARGUMENT,
               "rule: balance bound");
  plan.strategy = PCP_DECOUPLED_FRAGMENTS_STRIDED;
  EXPECT_OK(pcp_decoupled_plan_check(&plan));
  // Tensor 2 listed twice (fragment 1 claims it instead of tensor 3).
  uint32_t saved = plan.fragments[1].tensor_indices[1];
  plan.fragments[1].tensor_indices[1] = 2;
  EXPECT_ERROR(pcp_decoupled_plan_check(&plan), PCP_STATUS_INVALID_ARGUMENT,
               "rule: every tensor in exactly one fragment, no duplicate");
  plan.fragments[1].tensor_indices[1] = saved;
  // A tensor in no fragment.
  plan.fragments[1].tensor_count = 1;
  plan.fragments[1].byte_count = 4;
  EXPECT_ERROR(pcp_decoupled_plan_check(&plan), PCP_STATUS_INVALID_ARGUMENT,
               "tensor 3 is in no fragment");
  plan.fragments[1].tensor_count = 2;
  plan.fragments[1].byte_count = 8;
  plan.fragments[0].offset_bytes[1] = 4;
  EXPECT_ERROR(pcp_decoupled_plan_check(&plan), PCP_STATUS_INVALID_ARGUMENT,
               "rule: cumulative offsets");
  plan.fragments[0].offset_bytes[1] = 400;
  plan.fragments[1].offset = 0;
  EXPECT_ERROR(pcp_decoupled_plan_check(&plan), PCP_STATUS_INVALID_ARGUMENT,
               "offset = id mod H");
  plan.fragments[1].offset = 1;
  EXPECT_OK(pcp_decoupled_plan_check(&plan));
  pcp_decoupled_plan_deinitialize(&plan);
}

static void test_plan_allocation_failures(void** state) {
  (void)state;
  uint64_t values[6] = {5, 9, 2, 7, 7, 1};
  pcp_decoupled_tensor_spec_t specs[6];
  spec_fill(specs, values, 6);
  // Fail every allocation index in turn: a clean RESOURCE_EXHAUSTED, no
  // leak (ASan builds check), until one run succeeds.
  for (int64_t k = 0;; ++k) {
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(sys(), k, false, &failing);
    pcp_decoupled_plan_t plan;
    pcp_status_t status =
        pcp_decoupled_plan_initialize(pcp_allocator_failing(&failing),
                                      PCP_DECOUPLED_FRAGMENTS_BALANCED_TENSOR,
                                      specs, 6, NULL, 0, 3, 4, &plan);
    if (failing.failure_count == 0) {
      EXPECT_OK(status);
      pcp_decoupled_plan_deinitialize(&plan);
      break;
    }
    EXPECT_CODE(status, PCP_STATUS_RESOURCE_EXHAUSTED);
    assert_true(k < 100);
  }
}

//===----------------------------------------------------------------------===//
// Schedule
//===----------------------------------------------------------------------===//

static void test_schedule_table(void** state) {
  (void)state;
  // P = H = 4: every step syncs; fragment 0 when s = 0 mod 4.
  pcp_decoupled_schedule_t full = {4, 4, 2};
  EXPECT_OK(pcp_decoupled_schedule_check(&full));
  static const int32_t want_full[9] = {-1, 1, 2, 3, 0, 1, 2, 3, 0};
  for (uint64_t s = 1; s <= 8; ++s) {
    uint32_t f = 99;
    assert_true(pcp_decoupled_schedule_fragment_at(&full, s, &f));
    assert_int_equal(f, want_full[s]);
  }
  // P = 2 < H = 4: steps with residue 2 and 3 are skipped.
  pcp_decoupled_schedule_t sparse = {2, 4, 1};
  static const int32_t want_sparse[9] = {-1, 1, -1, -1, 0, 1, -1, -1, 0};
  for (uint64_t s = 1; s <= 8; ++s) {
    uint32_t f = 99;
    bool synced = pcp_decoupled_schedule_fragment_at(&sparse, s, &f);
    assert_int_equal(synced, want_sparse[s] >= 0);
    if (synced)
      assert_int_equal(f, want_sparse[s]);
  }
  // The paper profile (P = H = 24, tau 2): step 24 syncs fragment 0 and is
  // blended by learner step 26.
  pcp_decoupled_schedule_t paper = {24, 24, 2};
  uint32_t f = 99;
  assert_true(pcp_decoupled_schedule_fragment_at(&paper, 24, &f));
  assert_int_equal(f, 0);
  assert_int_equal(pcp_decoupled_schedule_apply_deadline(&paper, 24), 26);
  pcp_decoupled_schedule_t bad = {5, 4, 1};
  EXPECT_ERROR(pcp_decoupled_schedule_check(&bad), PCP_STATUS_INVALID_ARGUMENT,
               "P <= H");
  bad = (pcp_decoupled_schedule_t){2, 4, 0};
  EXPECT_ERROR(pcp_decoupled_schedule_check(&bad), PCP_STATUS_INVALID_ARGUMENT,
               "overlap_tau 0");
}

// The final sync against its definition, by brute force over small
// schedules: a fragment gets a final round iff its last scheduled step in
// 1..S is before S (or it has none), and the virtual steps S+1..last name
// exactly those fragments, once each.
static void test_schedule_final_sync(void** state) {
  (void)state;
  pcp_decoupled_schedule_t brief = {2, 16, 1};
  uint32_t rounds = 99;
  // H 16, P 2, S 32: fragment 1 last at 17, one final round at 33.
  assert_int_equal(pcp_decoupled_schedule_last_step(&brief, 32, true, &rounds),
                   33);
  assert_int_equal(rounds, 1);
  assert_int_equal(pcp_decoupled_schedule_last_step(&brief, 32, false, &rounds),
                   32);
  assert_int_equal(rounds, 0);
  // H 100, P 2, S 400 (fragment 1 last at 301): 401.
  pcp_decoupled_schedule_t bench = {2, 100, 2};
  assert_int_equal(pcp_decoupled_schedule_last_step(&bench, 400, true, &rounds),
                   401);
  assert_int_equal(rounds, 1);
  for (uint32_t h = 1; h <= 7; ++h) {
    for (uint32_t p = 1; p <= h; ++p) {
      pcp_decoupled_schedule_t sc = {p, h, 1};
      for (uint64_t steps = 1; steps <= 3 * h + 2; ++steps) {
        uint64_t last_sync[8] = {0};
        for (uint64_t s = 1; s <= steps; ++s) {
          uint32_t f = 0;
          if (pcp_decoupled_schedule_fragment_at(&sc, s, &f))
            last_sync[f] = s;
        }
        uint64_t end =
            pcp_decoupled_schedule_last_step(&sc, steps, true, &rounds);
        assert_true(end >= steps && end < steps + h);
        uint32_t seen[8] = {0};
        uint32_t count = 0;
        for (uint64_t s = steps + 1; s <= end; ++s) {
          uint32_t f = 0;
          if (pcp_decoupled_schedule_fragment_at(&sc, s, &f)) {
            ++seen[f];
            ++count;
          }
        }
        uint32_t want = 0;
        for (uint32_t f = 0; f < p; ++f) {
          bool behind = last_sync[f] < steps;
          want += behind;
          assert_int_equal(seen[f], behind ? 1 : 0);
        }
        assert_int_equal(rounds, want);
        assert_int_equal(count, want);
        // The last virtual step is a round (none wasted past it).
        uint32_t f = 0;
        assert_true(end == steps ||
                    pcp_decoupled_schedule_fragment_at(&sc, end, &f));
      }
    }
  }
}

//===----------------------------------------------------------------------===//
// Merges
//===----------------------------------------------------------------------===//

static void test_merge_weight(void** state) {
  (void)state;
  assert_true(pcp_decoupled_merge_weight(10, 2) == 50.0);  // digest: 10^2/2
  assert_true(pcp_decoupled_merge_weight(0, 7) == 0.0);
  assert_true(pcp_decoupled_merge_weight(6, 0) == 36.0);  // max(steps, 1)
  assert_true(pcp_decoupled_merge_weight(UINT64_MAX, 1) == (double)FLT_MAX);
}

// A round whose participants all trained nothing since their last receipt
// (resumed learners in a final sync, joiners) has no usable weight: the
// service skips it (dec_finalize). Why it must: the merge's gradient is 0,
// yet an outer Nesterov step with momentum still moves the masters.
static void test_merge_no_usable_weight_is_skipped(void** state) {
  (void)state;
  double none[4] = {pcp_decoupled_merge_weight(0, 0),
                    pcp_decoupled_merge_weight(0, 9), NAN, -1.0};
  assert_int_equal(pcp_decoupled_merge_usable_count(none, 4), 0);
  assert_int_equal(pcp_decoupled_merge_usable_count(none, 0), 0);
  double some[3] = {0.0, pcp_decoupled_merge_weight(4, 2), INFINITY};
  assert_int_equal(pcp_decoupled_merge_usable_count(some, 3), 1);
}

static void test_merge_weighted_average(void** state) {
  (void)state;
  // Digest: 2.6667. Outer gradients 2 and 4 weighted 2:1 -> 8/3 (the digest
  // gives only the result; these inputs are ours). Learners send params:
  // global 0 minus delta.
  float global[1] = {0.0f};
  float l0[1] = {-2.0f};
  float l1[1] = {-4.0f};
  float l2[1] = {-100.0f};  // weight 0: left out
  const float* learners[3] = {l0, l1, l2};
  double weights[3] = {2.0, 1.0, 0.0};
  float out[1];
  pcp_decoupled_merge_stats_t stats;
  EXPECT_OK(pcp_decoupled_merge_tensor(PCP_DECOUPLED_MERGE_WEIGHTED_AVERAGE,
                                       global, learners, weights, 3, 1, out,
                                       &stats));
  assert_float_equal(out[0], 2.6667f, 1e-4);
  assert_true(out[0] == (float)(8.0 / 3.0));
  assert_int_equal(stats.used_learners, 2);
  // NaN weight and no usable weight -> zero output.
  double none[3] = {0.0, NAN, -1.0};
  EXPECT_OK(pcp_decoupled_merge_tensor(PCP_DECOUPLED_MERGE_WEIGHTED_AVERAGE,
                                       global, learners, none, 3, 1, out,
                                       &stats));
  assert_true(out[0] == 0.0f);
  assert_int_equal(stats.used_learners, 0);
  // A non-finite learner element reads as a zero delta and is counted.
  float bad[2] = {INFINITY, 1.0f};
  float good[2] = {1.0f, 1.0f};
  float g2[2] = {3.0f, 3.0f};
  const float* mixed[2] = {bad, good};
  double equal[2] = {1.0, 1.0};
  float out2[2];
  EXPECT_OK(pcp_decoupled_merge_tensor(PCP_DECOUPLED_MERGE_WEIGHTED_AVERAGE, g2,
                                       mixed, equal, 2, 2, out2, &stats));
  assert_true(out2[0] == 1.0f);  // (0 + 2) / 2
  assert_true(out2[1] == 2.0f);
  assert_int_equal(stats.sanitized_count, 1);
  EXPECT_CODE(
      pcp_decoupled_merge_tensor(PCP_DECOUPLED_MERGE_AVG_EMBEDDING_RDA_MODEL,
                                 g2, mixed, equal, 2, 2, out2, &stats),
      PCP_STATUS_INVALID_ARGUMENT);
}

static void test_merge_rda_examples(void** state) {
  (void)state;
  float global[2] = {0.0f, 0.0f};
  float out[2];
  pcp_decoupled_merge_stats_t stats;
  // Orthogonal unit deltas, equal weights -> 0.7071 each.
  float a[2] = {-1.0f, 0.0f};
  float b[2] = {0.0f, -1.0f};
  const float* unit[2] = {a, b};
  double equal[2] = {1.0, 1.0};
  EXPECT_OK(pcp_decoupled_merge_tensor(PCP_DECOUPLED_MERGE_RDA, global, unit,
                                       equal, 2, 2, out, &stats));
  assert_float_equal(out[0], 0.7071f, 1e-4);
  assert_float_equal(out[1], 0.7071f, 1e-4);
  assert_true(out[0] == (float)(1.0 / sqrt(2.0)));
  // Norm-2 deltas weighted 3:1 -> dir (3, 1), mean norm 2 ->
  // (6, 2)/sqrt(10) = (1.8974, 0.6325).
  float c[2] = {-2.0f, 0.0f};
  float d[2] = {0.0f, -2.0f};
  const float* two[2] = {c, d};
  double w31[2] = {3.0, 1.0};
  EXPECT_OK(pcp_decoupled_merge_tensor(PCP_DECOUPLED_MERGE_RDA, global, two,
                                       w31, 2, 2, out, &stats));
  assert_float_equal(out[0], 1.8974f, 1e-4);
  assert_float_equal(out[1], 0.6325f, 1e-4);
  assert_true(out[0] == (float)(6.0 / sqrt(10.0)));
  assert_true(out[1] == (float)(2.0 / sqrt(10.0)));
  assert_float_equal(stats.output_norm, 2.0, 1e-6);  // the mean norm
  // A zero-norm learner has no direction but counts in the mean norm:
  // dir = (1, 0), mean = (2 + 0) / 2 = 1 -> (1, 0).
  float zero[2] = {0.0f, 0.0f};
  const float* with_zero[2] = {c, zero};
  EXPECT_OK(pcp_decoupled_merge_tensor(PCP_DECOUPLED_MERGE_RDA, global,
                                       with_zero, equal, 2, 2, out, &stats));
  assert_true(out[0] == 1.0f && out[1] == 0.0f);
  // Opposite deltas cancel: |dir| = 0 -> zero output.
  float e[2] = {2.0f, 0.0f};
  const float* opposite[2] = {c, e};
  EXPECT_OK(pcp_decoupled_merge_tensor(PCP_DECOUPLED_MERGE_RDA, global,
                                       opposite, equal, 2, 2, out, &stats));
  assert_true(out[0] == 0.0f && out[1] == 0.0f);
}

static void test_merge_fragment_roles(void** state) {
  (void)state;
  // Tensor 0 (embedding) and tensor 1, one fragment: avg_embedding_rda_model
  // averages tensor 0 and RDA-merges tensor 1; the reverse strategy swaps.
  uint64_t values[2] = {2, 2};
  pcp_decoupled_tensor_spec_t specs[2];
  spec_fill(specs, values, 2);
  specs[0].role = PCP_DECOUPLED_ROLE_EMBEDDING;
  pcp_decoupled_plan_t plan;
  EXPECT_OK(pcp_decoupled_plan_initialize(
      sys(), PCP_DECOUPLED_FRAGMENTS_STRIDED, specs, 2, NULL, 0, 1, 1, &plan));
  float global[4] = {0, 0, 0, 0};
  float a[4] = {-2, 0, -2, 0};
  float b[4] = {0, -2, 0, -2};
  const float* learners[2] = {a, b};
  double w[2] = {3.0, 1.0};
  float out[4];
  EXPECT_OK(pcp_decoupled_merge_fragment(
      &plan, 0, PCP_DECOUPLED_MERGE_AVG_EMBEDDING_RDA_MODEL, global, learners,
      w, 2, out, NULL));
  assert_true(out[0] == 1.5f && out[1] == 0.5f);  // (3*2, 1*2) / 4
  assert_true(out[2] == (float)(6.0 / sqrt(10.0)));
  assert_true(out[3] == (float)(2.0 / sqrt(10.0)));
  EXPECT_OK(pcp_decoupled_merge_fragment(
      &plan, 0, PCP_DECOUPLED_MERGE_RDA_EMBEDDING_AVG_MODEL, global, learners,
      w, 2, out, NULL));
  assert_true(out[0] == (float)(6.0 / sqrt(10.0)));
  assert_true(out[2] == 1.5f && out[3] == 0.5f);
  pcp_decoupled_merge_strategy_t parsed;
  EXPECT_OK(
      pcp_decoupled_merge_strategy_parse("rda_embedding_avg_model", &parsed));
  assert_int_equal(parsed, PCP_DECOUPLED_MERGE_RDA_EMBEDDING_AVG_MODEL);
  EXPECT_ERROR(pcp_decoupled_merge_strategy_parse("mean", &parsed),
               PCP_STATUS_INVALID_ARGUMENT, "want weighted_average");
  pcp_decoupled_plan_deinitialize(&plan);
}

//===----------------------------------------------------------------------===//
// Nesterov per fragment, learner counters, blending
//===----------------------------------------------------------------------===//

static void test_nesterov_fragment(void** state) {
  (void)state;
  uint64_t values[3] = {1, 1, 1};
  pcp_decoupled_tensor_spec_t specs[3];
  spec_fill(specs, values, 3);
  pcp_decoupled_plan_t plan;
  EXPECT_OK(pcp_decoupled_plan_initialize(
      sys(), PCP_DECOUPLED_FRAGMENTS_STRIDED, specs, 3, NULL, 0, 2, 2, &plan));
  pcp_decoupled_nesterov_t nesterov;
  EXPECT_OK(pcp_decoupled_nesterov_initialize(sys(), 3, 0.7f, 0.9f, &nesterov));
  float theta[3] = {1.0f, 1.0f, 1.0f};
  float g[2] = {0.5f, 0.5f};  // fragment 0 = tensors 0 and 2
  EXPECT_OK(
      pcp_decoupled_nesterov_step_fragment(&nesterov, &plan, 0, g, theta));
  // v = 0.5; theta = 1 - 0.7 (0.5 + 0.9*0.5) = 0.335 (f32 arithmetic).
  float v1 = 0.9f * 0.0f + 0.5f;
  float t1 = 1.0f - 0.7f * (0.5f + 0.9f * v1);
  assert_true(theta[0] == t1 && theta[2] == t1);
  assert_float_equal(theta[0], 0.335f, 1e-6);
  assert_true(theta[1] == 1.0f);  // fragment 1 untouched
  assert_true(nesterov.velocity[1] == 0.0f);
  EXPECT_OK(
      pcp_decoupled_nesterov_step_fragment(&nesterov, &plan, 0, g, theta));
  // v = 0.95; theta = 0.335 - 0.7 (0.5 + 0.855) = -0.6135.
  assert_float_equal(nesterov.velocity[0], 0.95f, 1e-6);
  assert_float_equal(theta[0], -0.6135f, 1e-5);
  EXPECT_CODE(
      pcp_decoupled_nesterov_step_fragment(&nesterov, &plan, 2, g, theta),
      PCP_STATUS_OUT_OF_RANGE);
  pcp_decoupled_nesterov_deinitialize(&nesterov);
  EXPECT_OK(pcp_decoupled_nesterov_initialize(sys(), 4, 0.7f, 0.9f, &nesterov));
  EXPECT_CODE(
      pcp_decoupled_nesterov_step_fragment(&nesterov, &plan, 0, g, theta),
      PCP_STATUS_INVALID_ARGUMENT);
  pcp_decoupled_nesterov_deinitialize(&nesterov);
  pcp_decoupled_plan_deinitialize(&plan);
}

static void test_learner_counters_and_blend(void** state) {
  (void)state;
  pcp_decoupled_learner_t learner;
  EXPECT_CODE(pcp_decoupled_learner_initialize(sys(), 0, 3, &learner),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_OK(pcp_decoupled_learner_initialize(sys(), 4, 3, &learner));
  pcp_decoupled_learner_record_step(&learner, 128);
  pcp_decoupled_learner_record_step(&learner, 128);
  pcp_decoupled_learner_record_step(&learner, 64);
  assert_int_equal(learner.learner_step, 3);
  for (uint32_t f = 0; f < 3; ++f) {
    assert_int_equal(learner.steps_since[f], 3);
    assert_int_equal(learner.tokens_since[f], 320);
  }
  // Its merge weight for any fragment: 320^2 / 3.
  assert_float_equal(pcp_decoupled_merge_weight(learner.tokens_since[1],
                                                learner.steps_since[1]),
                     102400.0 / 3.0, 1e-9);
  EXPECT_OK(pcp_decoupled_learner_apply_fragment(&learner, 1, 7));
  assert_int_equal(learner.steps_since[1], 0);
  assert_int_equal(learner.tokens_since[1], 0);
  assert_int_equal(learner.steps_since[0], 3);
  assert_int_equal(learner.observed_global_step, 7);
  EXPECT_OK(pcp_decoupled_learner_apply_fragment(&learner, 0, 5));
  assert_int_equal(learner.observed_global_step, 7);  // max
  // Its clock: own entry = 3 local steps, the syncer's = newest step seen.
  assert_int_equal(pcp_decoupled_clock_get(&learner.clock, 4), 3);
  assert_int_equal(pcp_decoupled_clock_get(&learner.clock, 0), 7);
  assert_true(pcp_decoupled_learner_should_continue(&learner, 0));
  assert_true(pcp_decoupled_learner_should_continue(&learner, 8));
  assert_false(pcp_decoupled_learner_should_continue(&learner, 7));
  EXPECT_CODE(pcp_decoupled_learner_apply_fragment(&learner, 3, 9),
              PCP_STATUS_OUT_OF_RANGE);
  pcp_decoupled_learner_deinitialize(&learner);

  float global[3] = {1.0f, 2.0f, 3.0f};
  float local[3] = {3.0f, NAN, 5.0f};
  uint64_t bad = 0;
  EXPECT_OK(pcp_decoupled_blend(0.25f, global, local, 3, &bad));
  // 0.25*3 + 0.75*1 = 1.5; NaN -> 0 counted; 0.25*5 + 0.75*3 = 3.5.
  assert_true(local[0] == 1.5f && local[1] == 0.0f && local[2] == 3.5f);
  assert_int_equal(bad, 1);
  float over[2] = {INFINITY, 9.0f};
  EXPECT_OK(pcp_decoupled_blend(0.0f, global, over, 2, &bad));
  assert_true(over[0] == 1.0f && over[1] == 2.0f);  // alpha 0 overwrites
  assert_int_equal(bad, 0);
  EXPECT_ERROR(pcp_decoupled_blend(1.5f, global, over, 2, &bad),
               PCP_STATUS_INVALID_ARGUMENT, "learner_alpha");
}

//===----------------------------------------------------------------------===//
// Quorum, grace, adaptive grace, the round machine
//===----------------------------------------------------------------------===//

static void test_select_digest_example(void** state) {
  (void)state;
  // Digest: arrivals 0/4/9 ms, grace 5, min_quorum 1 -> participants 2,
  // grace inclusions 1, skipped 1.
  pcp_decoupled_arrival_t arrivals[3] = {{7, 9}, {3, 0}, {5, 4}};
  pcp_decoupled_selection_t sel;
  EXPECT_OK(pcp_decoupled_select(arrivals, 3, NULL, 0, 1, 5, &sel));
  assert_int_equal(sel.participant_count, 2);
  assert_int_equal(sel.grace_inclusion_count, 1);
  assert_int_equal(sel.skipped_count, 1);
  assert_int_equal(sel.participants[0], 3);
  assert_int_equal(sel.participants[1], 5);
  assert_int_equal(sel.quorum_wait_ms, 0);
  assert_int_equal(sel.deadline_ms, 5);
  // Grace 0 with min_quorum 2: quorum at 4 ms, only the two earliest.
  EXPECT_OK(pcp_decoupled_select(arrivals, 3, NULL, 0, 2, 0, &sel));
  assert_int_equal(sel.participant_count, 2);
  assert_int_equal(sel.grace_inclusion_count, 0);
  assert_int_equal(sel.quorum_wait_ms, 4);
  // Learner 3 inactive: quorum 2 from 5 and 7 (wait 9), 3 skipped.
  uint32_t active[2] = {5, 7};
  EXPECT_OK(pcp_decoupled_select(arrivals, 3, active, 2, 2, 0, &sel));
  assert_int_equal(sel.participant_count, 2);
  assert_int_equal(sel.quorum_wait_ms, 9);
  assert_int_equal(sel.skipped_count, 1);
  EXPECT_ERROR(pcp_decoupled_select(arrivals, 3, active, 2, 3, 100, &sel),
               PCP_STATUS_FAILED_PRECONDITION, "quorum not met");
  // The earliest update of a learner counts; ties go by learner id.
  pcp_decoupled_arrival_t dup[4] = {{2, 10}, {1, 10}, {2, 3}, {9, 11}};
  EXPECT_OK(pcp_decoupled_select(dup, 4, NULL, 0, 2, 0, &sel));
  assert_int_equal(sel.participants[0], 2);  // at 3
  assert_int_equal(sel.participants[1], 1);  // at 10
  assert_int_equal(sel.participant_count, 2);
  assert_int_equal(sel.skipped_count, 1);  // learner 9 at 11 > 10
  EXPECT_CODE(pcp_decoupled_select(dup, 4, NULL, 0, 0, 0, &sel),
              PCP_STATUS_INVALID_ARGUMENT);
}

static void test_adaptive_grace(void** state) {
  (void)state;
  pcp_decoupled_ema_t ema = {0};
  pcp_decoupled_ema_update(&ema, 0.125, 100.0);
  assert_true(ema.value == 100.0);  // first sample replaces
  pcp_decoupled_ema_update(&ema, 0.125, 200.0);
  assert_true(ema.value == 112.5);  // 0.125*200 + 0.875*100

  pcp_decoupled_grace_t grace;
  memset(&grace, 0, sizeof(grace));
  grace.config = (pcp_decoupled_grace_config_t){250, false, 1.0, 1, 2, 1.0};
  EXPECT_OK(pcp_decoupled_grace_config_check(&grace.config));
  assert_int_equal(pcp_decoupled_grace_ms(&grace), 250);  // fixed
  grace.config.adaptive = true;
  assert_int_equal(pcp_decoupled_grace_ms(&grace), 0);  // no step EMA yet
  // EMA alpha 1: each sample replaces, so the figures are exact.
  pcp_decoupled_grace_observe_step(&grace, 100.0);
  // slack = 2*100 - 0 = 200, capped at 1*100.
  assert_int_equal(pcp_decoupled_grace_ms(&grace), 100);
  pcp_decoupled_grace_observe_quorum_wait(&grace, 150.0);
  // slack = 200 - 150 = 50 < cap.
  assert_int_equal(pcp_decoupled_grace_ms(&grace), 50);
  pcp_decoupled_grace_observe_sync_send(&grace, 20.5);
  // slack = 200 - 170.5 = 29.5 -> floor 29.
  assert_int_equal(pcp_decoupled_grace_ms(&grace), 29);
  grace.config.gamma = 0.5;
  assert_int_equal(pcp_decoupled_grace_ms(&grace), 14);  // floor(14.75)
  pcp_decoupled_grace_observe_quorum_wait(&grace, 250.0);
  assert_int_equal(pcp_decoupled_grace_ms(&grace), 0);  // slack < 0
  // Slower steps give room again: step 400 -> slack 800 - 270.5 = 529.5,
  // gamma 0.5 -> 264.75, cap 400 -> 264.
  pcp_decoupled_grace_observe_step(&grace, 400.0);
  assert_int_equal(pcp_decoupled_grace_ms(&grace), 264);
  pcp_decoupled_grace_config_t bad = grace.config;
  bad.ema_alpha = 0.0;
  EXPECT_ERROR(pcp_decoupled_grace_config_check(&bad),
               PCP_STATUS_INVALID_ARGUMENT, "timing_ema_alpha");
  bad = grace.config;
  bad.gamma = -1.0;
  EXPECT_ERROR(pcp_decoupled_grace_config_check(&bad),
               PCP_STATUS_INVALID_ARGUMENT, "grace_gamma");
  bad = grace.config;
  bad.max_grace_steps = 0;
  EXPECT_ERROR(pcp_decoupled_grace_config_check(&bad),
               PCP_STATUS_INVALID_ARGUMENT, "max_grace_steps");
}

static void test_round_machine(void** state) {
  (void)state;
  static pcp_decoupled_round_t round;
  uint32_t expected[3] = {1, 2, 3};
  // Quorum 2, grace 5, opened at t = 1000.
  EXPECT_OK(pcp_decoupled_round_open(1000, expected, 3, 2, 5, 30000, &round));
  assert_int_equal(pcp_decoupled_round_next_deadline_ms(&round), 31000);
  pcp_decoupled_round_arrive(&round, 1, 1000);
  pcp_decoupled_round_arrive(&round, 1, 1001);  // duplicate
  pcp_decoupled_round_arrive(&round, 8, 1002);  // not expected
  assert_int_equal(pcp_decoupled_round_poll(&round, 1003),
                   PCP_DECOUPLED_ROUND_COLLECTING);
  pcp_decoupled_round_arrive(&round, 2, 1004);  // quorum at +4
  assert_int_equal(pcp_decoupled_round_next_deadline_ms(&round), 1009);
  assert_int_equal(pcp_decoupled_round_poll(&round, 1008),
                   PCP_DECOUPLED_ROUND_COLLECTING);
  // Learner 3 lands at 1010: the window closed at 1009 first (at exactly
  // 1009 it would have been in: see the boundary case below).
  pcp_decoupled_round_arrive(&round, 3, 1010);
  assert_int_equal(round.state, PCP_DECOUPLED_ROUND_CLOSED);
  assert_int_equal(round.closed_at_ms, 1009);
  assert_int_equal(round.selection.participant_count, 2);
  assert_int_equal(round.selection.grace_inclusion_count, 0);
  assert_int_equal(round.selection.skipped_count, 1);
  assert_int_equal(round.late_count, 1);
  assert_int_equal(round.duplicate_count, 1);
  assert_int_equal(round.unexpected_count, 1);
  assert_int_equal(pcp_decoupled_round_next_deadline_ms(&round), UINT64_MAX);

  // Boundary: an update at exactly quorum_wait + grace is in the window,
  // as pcp_decoupled_select keeps arrival <= deadline.
  EXPECT_OK(pcp_decoupled_round_open(1000, expected, 3, 2, 5, 30000, &round));
  pcp_decoupled_round_arrive(&round, 1, 1000);
  pcp_decoupled_round_arrive(&round, 2, 1004);
  pcp_decoupled_round_arrive(&round, 3, 1009);
  assert_int_equal(round.state, PCP_DECOUPLED_ROUND_CLOSED);
  assert_int_equal(round.selection.participant_count, 3);
  assert_int_equal(round.selection.grace_inclusion_count, 1);
  assert_int_equal(round.late_count, 0);
  // A bare poll at the deadline closes it.
  EXPECT_OK(pcp_decoupled_round_open(1000, expected, 3, 2, 5, 30000, &round));
  pcp_decoupled_round_arrive(&round, 1, 1000);
  pcp_decoupled_round_arrive(&round, 2, 1004);
  assert_int_equal(pcp_decoupled_round_poll(&round, 1009),
                   PCP_DECOUPLED_ROUND_CLOSED);

  // Inside the grace window a late learner is included (grace inclusion);
  // once everyone is in, the round closes without waiting out the window.
  EXPECT_OK(pcp_decoupled_round_open(0, expected, 3, 1, 100, 30000, &round));
  pcp_decoupled_round_arrive(&round, 2, 10);
  pcp_decoupled_round_arrive(&round, 3, 60);
  assert_int_equal(round.state, PCP_DECOUPLED_ROUND_COLLECTING);
  pcp_decoupled_round_arrive(&round, 1, 70);
  assert_int_equal(round.state, PCP_DECOUPLED_ROUND_CLOSED);
  assert_int_equal(round.closed_at_ms, 70);
  assert_int_equal(round.selection.participant_count, 3);
  assert_int_equal(round.selection.grace_inclusion_count, 2);
  assert_int_equal(round.selection.participants[0], 2);

  // No quorum within the collection timeout.
  EXPECT_OK(pcp_decoupled_round_open(0, expected, 3, 2, 0, 30000, &round));
  pcp_decoupled_round_arrive(&round, 1, 5);
  assert_int_equal(pcp_decoupled_round_poll(&round, 29999),
                   PCP_DECOUPLED_ROUND_COLLECTING);
  assert_int_equal(pcp_decoupled_round_poll(&round, 30000),
                   PCP_DECOUPLED_ROUND_TIMED_OUT);
  pcp_decoupled_round_arrive(&round, 2, 30001);
  assert_int_equal(round.late_count, 1);

  EXPECT_CODE(pcp_decoupled_round_open(0, expected, 3, 4, 0, 10, &round),
              PCP_STATUS_INVALID_ARGUMENT);
  uint32_t twice[2] = {4, 4};
  EXPECT_ERROR(pcp_decoupled_round_open(0, twice, 2, 1, 0, 10, &round),
               PCP_STATUS_INVALID_ARGUMENT, "listed twice");
}

//===----------------------------------------------------------------------===//
// Vector clocks
//===----------------------------------------------------------------------===//

static void test_vector_clock(void** state) {
  (void)state;
  static pcp_decoupled_clock_t a;
  static pcp_decoupled_clock_t b;
  pcp_decoupled_clock_initialize(&a);
  pcp_decoupled_clock_initialize(&b);
  assert_int_equal(pcp_decoupled_clock_compare(&a, &b),
                   PCP_DECOUPLED_CLOCK_EQUAL);
  EXPECT_OK(pcp_decoupled_clock_tick(&a, 3));
  EXPECT_OK(pcp_decoupled_clock_tick(&a, 0));
  EXPECT_OK(pcp_decoupled_clock_tick(&a, 3));
  assert_int_equal(a.count, 2);
  assert_int_equal(a.entries[0].node_id, 0);  // sorted
  assert_int_equal(pcp_decoupled_clock_get(&a, 3), 2);
  assert_int_equal(pcp_decoupled_clock_get(&a, 9), 0);  // missing = 0
  // b = {} is before a.
  assert_int_equal(pcp_decoupled_clock_compare(&b, &a),
                   PCP_DECOUPLED_CLOCK_BEFORE);
  assert_int_equal(pcp_decoupled_clock_compare(&a, &b),
                   PCP_DECOUPLED_CLOCK_AFTER);
  EXPECT_OK(pcp_decoupled_clock_observe(&b, 5, 1));
  assert_int_equal(pcp_decoupled_clock_compare(&a, &b),
                   PCP_DECOUPLED_CLOCK_CONCURRENT);
  EXPECT_OK(pcp_decoupled_clock_observe(&b, 3, 1));  // max keeps 1
  EXPECT_OK(pcp_decoupled_clock_merge(&b, &a));
  assert_int_equal(pcp_decoupled_clock_get(&b, 3), 2);
  assert_int_equal(pcp_decoupled_clock_get(&b, 5), 1);
  assert_int_equal(pcp_decoupled_clock_get(&b, 0), 1);
  assert_int_equal(pcp_decoupled_clock_compare(&a, &b),
                   PCP_DECOUPLED_CLOCK_BEFORE);
  EXPECT_OK(pcp_decoupled_clock_observe(&b, 3, 1));
  assert_int_equal(pcp_decoupled_clock_get(&b, 3), 2);
  // A zero entry equals a missing one.
  static pcp_decoupled_clock_t c;
  pcp_decoupled_clock_initialize(&c);
  EXPECT_OK(pcp_decoupled_clock_observe(&c, 7, 0));
  pcp_decoupled_clock_initialize(&a);
  assert_int_equal(pcp_decoupled_clock_compare(&a, &c),
                   PCP_DECOUPLED_CLOCK_EQUAL);
  // The wire form, both ways, and its rules.
  json_t* json = pcp_decoupled_clock_to_json(&b);
  assert_non_null(json);
  char* text = json_dumps(json, JSON_COMPACT);
  assert_string_equal(text,
                      "[{\"node_id\":0,\"counter\":1},"
                      "{\"node_id\":3,\"counter\":2},"
                      "{\"node_id\":5,\"counter\":1}]");
  pcp_libc_free(text);
  static pcp_decoupled_clock_t parsed;
  EXPECT_OK(pcp_decoupled_clock_from_json(json, &parsed));
  assert_int_equal(pcp_decoupled_clock_compare(&parsed, &b),
                   PCP_DECOUPLED_CLOCK_EQUAL);
  json_decref(json);
  static const struct {
    const char* text;
    const char* error;
  } kBad[] = {
      {"{}", "want an array"},
      {"[1]", "vector_clock[0]: want an object"},
      {"[{\"node_id\":70000,\"counter\":1}]", "[0].node_id"},
      {"[{\"node_id\":1,\"counter\":-1}]", "[0].counter"},
      {"[{\"node_id\":1}]", "[0].counter"},
      {"[{\"node_id\":2,\"counter\":1},{\"node_id\":2,\"counter\":3}]",
       "node 2 listed twice"},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(kBad); ++i) {
    json_t* bad_json = json_loads(kBad[i].text, 0, NULL);
    assert_non_null(bad_json);
    EXPECT_ERROR(pcp_decoupled_clock_from_json(bad_json, &parsed),
                 PCP_STATUS_INVALID_ARGUMENT, kBad[i].error);
    assert_int_equal(parsed.count, 0);
    json_decref(bad_json);
  }
  // Any order is accepted and sorted.
  json_t* unsorted = json_loads(
      "[{\"node_id\":9,\"counter\":4},{\"node_id\":1,"
      "\"counter\":2}]",
      0, NULL);
  EXPECT_OK(pcp_decoupled_clock_from_json(unsorted, &parsed));
  assert_int_equal(parsed.entries[0].node_id, 1);
  assert_int_equal(parsed.entries[1].counter, 4);
  json_decref(unsorted);

  // Capacity.
  pcp_decoupled_clock_initialize(&a);
  for (uint32_t n = 0; n < PCP_DECOUPLED_CLOCK_MAX_ENTRIES; ++n) {
    EXPECT_OK(pcp_decoupled_clock_tick(&a, (uint16_t)n));
  }
  EXPECT_CODE(pcp_decoupled_clock_tick(&a, 60000),
              PCP_STATUS_RESOURCE_EXHAUSTED);
}

//===----------------------------------------------------------------------===//
// Event tape, replay, recovery
//===----------------------------------------------------------------------===//

// A syncer run on the live path: P = 3, learners 1..3. Steps 1..5 sync
// fragments 1, 2, 0, 1, 2 with learners {1,2,3}, {1,2}, {1,2,3}, {2,3},
// {1,2}; learner 3 fails after step 4 and the pull of fragment 0 at step 6
// is still in flight; a snapshot marker waits on learner 2.
static void run_live(pcp_decoupled_syncer_state_t* live,
                     pcp_decoupled_tape_t* tape) {
  EXPECT_OK(pcp_decoupled_syncer_state_initialize(sys(), 3, live));
  pcp_decoupled_tape_initialize(sys(), tape);
  static const uint32_t who[5][3] = {
      {1, 2, 3}, {1, 2, 0}, {1, 2, 3}, {2, 3, 0}, {1, 2, 0}};
  static const uint32_t n[5] = {3, 2, 3, 2, 2};
  pcp_decoupled_schedule_t schedule = {3, 3, 2};
  for (uint64_t s = 1; s <= 5; ++s) {
    uint32_t f = 0;
    assert_true(pcp_decoupled_schedule_fragment_at(&schedule, s, &f));
    pcp_decoupled_participant_t parts[3];
    for (uint32_t p = 0; p < n[s - 1]; ++p) {
      parts[p].learner_id = who[s - 1][p];
      parts[p].learner_step = 10 * s + p;
      parts[p].steps_since = s;
      parts[p].tokens_since = 64 * s;
      parts[p].merge_weight = pcp_decoupled_merge_weight(64 * s, s);
    }
    EXPECT_OK(
        pcp_decoupled_syncer_record_sync(live, tape, s, f, parts, n[s - 1]));
    pcp_decoupled_event_t apply = {0};
    apply.kind = PCP_DECOUPLED_EVENT_LEARNER_APPLY;
    apply.learner_id = who[s - 1][0];
    apply.fragment_id = f;
    apply.syncer_step = s;
    EXPECT_OK(pcp_decoupled_syncer_record_event(live, tape, &apply));
    if (s == 4) {
      pcp_decoupled_event_t failure = {0};
      failure.kind = PCP_DECOUPLED_EVENT_LEARNER_FAILURE;
      failure.learner_id = 3;
      failure.syncer_step = 4;
      EXPECT_OK(pcp_decoupled_syncer_record_event(live, tape, &failure));
    }
  }
  pcp_decoupled_participant_t pending[2] = {{1, 0, 0, 0, 0}, {2, 1, 0, 0, 0}};
  pcp_decoupled_event_t marker = {0};
  marker.kind = PCP_DECOUPLED_EVENT_SNAPSHOT_MARKER;
  marker.snapshot_id = 77;
  marker.syncer_step = 5;
  marker.participants = pending;
  marker.participant_count = 2;
  EXPECT_OK(pcp_decoupled_syncer_record_event(live, tape, &marker));
  pcp_decoupled_event_t in_flight = {0};
  in_flight.kind = PCP_DECOUPLED_EVENT_IN_FLIGHT_MESSAGE;
  in_flight.fragment_id = 0;
  in_flight.learner_id = 1;
  in_flight.syncer_step = 6;
  EXPECT_OK(pcp_decoupled_syncer_record_event(live, tape, &in_flight));
}

static void test_tape_replay_matches_live(void** state) {
  (void)state;
  static pcp_decoupled_syncer_state_t live;
  static pcp_decoupled_syncer_state_t replayed;
  pcp_decoupled_tape_t tape;
  run_live(&live, &tape);
  assert_int_equal(live.global_step, 5);
  assert_int_equal(live.fragment_versions[0], 1);
  assert_int_equal(live.fragment_versions[1], 2);
  assert_int_equal(live.fragment_versions[2], 2);
  assert_int_equal(live.participants_total, 12);
  assert_int_equal(pcp_decoupled_clock_get(&live.clock, 0), 5);
  assert_int_equal(live.learners[3].status, PCP_DECOUPLED_LEARNER_FAILED);
  assert_true(live.snapshot_pending);
  assert_int_equal(tape.count, 5 + 5 + 1 + 1 + 1);
  assert_int_equal(tape.events[0].id, 1);

  uint8_t* bytes = NULL;
  size_t length = 0;
  EXPECT_OK(pcp_decoupled_tape_encode(&tape, &bytes, &length));
  pcp_decoupled_tape_t decoded;
  pcp_decoupled_tape_initialize(sys(), &decoded);
  EXPECT_OK(pcp_decoupled_tape_decode(bytes, length, &decoded));
  assert_int_equal(decoded.count, tape.count);
  EXPECT_OK(pcp_decoupled_syncer_state_replay(sys(), 3, &decoded, &replayed));
  assert_true(pcp_decoupled_syncer_state_equal(&live, &replayed));
  // Negative control: one more live sync and they differ.
  pcp_decoupled_participant_t one = {2, 99, 1, 1, 1.0};
  EXPECT_OK(pcp_decoupled_syncer_record_sync(&live, &tape, 6, 0, &one, 1));
  assert_false(pcp_decoupled_syncer_state_equal(&live, &replayed));

  // Replaying the rounds picks the same learners, in order.
  const pcp_decoupled_event_t* e = NULL;
  EXPECT_OK(pcp_decoupled_tape_replay_fragment_sync(&decoded, 1, 1, &e));
  assert_int_equal(e->participant_count, 3);
  EXPECT_OK(pcp_decoupled_tape_replay_fragment_sync(&decoded, 2, 2, &e));
  assert_int_equal(e->participant_count, 2);
  assert_int_equal(e->participants[1].learner_id, 2);
  assert_float_equal(e->participants[1].merge_weight, 128.0 * 128.0 / 2.0, 0.0);
  EXPECT_ERROR(pcp_decoupled_tape_replay_fragment_sync(&decoded, 3, 1, &e),
               PCP_STATUS_FAILED_PRECONDITION, "step 3 fragment 0");
  EXPECT_OK(pcp_decoupled_tape_replay_fragment_sync(&decoded, 3, 0, &e));
  EXPECT_OK(pcp_decoupled_tape_replay_fragment_sync(&decoded, 4, 1, &e));
  EXPECT_OK(pcp_decoupled_tape_replay_fragment_sync(&decoded, 5, 2, &e));
  EXPECT_CODE(pcp_decoupled_tape_replay_fragment_sync(&decoded, 6, 0, &e),
              PCP_STATUS_NOT_FOUND);

  pcp_allocator_free(sys(), bytes);
  pcp_decoupled_tape_deinitialize(&decoded);
  pcp_decoupled_tape_deinitialize(&tape);
  pcp_decoupled_syncer_state_deinitialize(&live);
  pcp_decoupled_syncer_state_deinitialize(&replayed);
}

// The writer's append path (finding 9): the header and the first records,
// then the later records appended round by round through a real file,
// decode as the whole tape, byte for byte what a full rewrite gives.
static void test_tape_append_matches_rewrite(void** state) {
  (void)state;
  static pcp_decoupled_syncer_state_t live;
  pcp_decoupled_tape_t tape;
  run_live(&live, &tape);
  uint8_t* whole = NULL;
  size_t whole_length = 0;
  EXPECT_OK(pcp_decoupled_tape_encode(&tape, &whole, &whole_length));
  char path[] = "/tmp/pcp_tape_append_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  // Three writes: records 0..3 with the header, 4..8, then 9..end.
  const uint64_t cuts[] = {0, 4, 9, tape.count};
  for (int c = 0; c + 1 < 4; ++c) {
    pcp_decoupled_tape_t part;
    pcp_decoupled_tape_initialize(sys(), &part);
    for (uint64_t i = 0; i < cuts[c + 1]; ++i) {
      EXPECT_OK(pcp_decoupled_tape_append(&part, &tape.events[i], NULL));
    }
    uint8_t* bytes = NULL;
    size_t length = 0;
    EXPECT_OK(pcp_decoupled_tape_encode_records(&part, cuts[c], c == 0, &bytes,
                                                &length));
    if (c == 0) {
      EXPECT_OK(pcp_file_write_atomic(path, bytes, length));
    } else {
      EXPECT_OK(pcp_file_append(path, bytes, length));
    }
    pcp_allocator_free(sys(), bytes);
    pcp_decoupled_tape_deinitialize(&part);
  }
  void* data = NULL;
  size_t length = 0;
  EXPECT_OK(
      pcp_file_read_all(path, PCP_DECOUPLED_TAPE_MAX_BYTES, &data, &length));
  unlink(path);
  assert_int_equal(length, whole_length);
  assert_memory_equal(data, whole, length);
  pcp_decoupled_tape_t decoded;
  pcp_decoupled_tape_initialize(sys(), &decoded);
  EXPECT_OK(pcp_decoupled_tape_decode(data, length, &decoded));
  assert_int_equal(decoded.count, tape.count);
  free(data);
  // Nothing new: an empty encoding, no header. Past the end: refused.
  uint8_t* none = NULL;
  EXPECT_OK(pcp_decoupled_tape_encode_records(&tape, tape.count, false, &none,
                                              &length));
  assert_int_equal(length, 0);
  pcp_allocator_free(sys(), none);
  EXPECT_CODE(pcp_decoupled_tape_encode_records(&tape, tape.count + 1, false,
                                                &none, &length),
              PCP_STATUS_OUT_OF_RANGE);
  assert_null(none);
  pcp_allocator_free(sys(), whole);
  pcp_decoupled_tape_deinitialize(&decoded);
  pcp_decoupled_tape_deinitialize(&tape);
  pcp_decoupled_syncer_state_deinitialize(&live);
}

static void test_tape_corruption(void** state) {
  (void)state;
  static pcp_decoupled_syncer_state_t live;
  pcp_decoupled_tape_t tape;
  run_live(&live, &tape);
  uint8_t* bytes = NULL;
  size_t length = 0;
  EXPECT_OK(pcp_decoupled_tape_encode(&tape, &bytes, &length));
  pcp_decoupled_tape_t out;
  pcp_decoupled_tape_initialize(sys(), &out);
  // Truncated anywhere but on a record boundary (where it is a shorter,
  // valid tape): DATA_LOSS naming the record.
  size_t next_boundary = 16;
  for (size_t cut = 16; cut < length; ++cut) {
    if (cut == next_boundary) {
      uint32_t record = 0;
      for (int i = 0; i < 4; ++i) record |= (uint32_t)bytes[cut + i] << (8 * i);
      next_boundary = cut + 8 + record;
      EXPECT_OK(pcp_decoupled_tape_decode(bytes, cut, &out));
      pcp_decoupled_tape_deinitialize(&out);
      continue;
    }
    EXPECT_ERROR(pcp_decoupled_tape_decode(bytes, cut, &out),
                 PCP_STATUS_DATA_LOSS, "event tape truncated in record");
    assert_int_equal(out.count, 0);
  }
  EXPECT_ERROR(pcp_decoupled_tape_decode(bytes, length - 1, &out),
               PCP_STATUS_DATA_LOSS, "truncated in record 13");
  EXPECT_ERROR(pcp_decoupled_tape_decode(bytes, 10, &out), PCP_STATUS_DATA_LOSS,
               "no PCPTAPE1 header");
  // A flipped bit in a payload: CRC mismatch.
  bytes[40] ^= 0x10;
  EXPECT_ERROR(pcp_decoupled_tape_decode(bytes, length, &out),
               PCP_STATUS_DATA_LOSS, "record 1 at byte 16: CRC mismatch");
  bytes[40] ^= 0x10;
  // Magic, header CRC and version.
  bytes[3] ^= 1;
  EXPECT_ERROR(pcp_decoupled_tape_decode(bytes, length, &out),
               PCP_STATUS_DATA_LOSS, "no PCPTAPE1 header");
  bytes[3] ^= 1;
  bytes[9] ^= 1;
  EXPECT_ERROR(pcp_decoupled_tape_decode(bytes, length, &out),
               PCP_STATUS_DATA_LOSS, "header CRC mismatch");
  bytes[9] ^= 1;
  bytes[8] = 2;  // version 2, header CRC recomputed
  uint32_t crc = pcp_proto_crc32c(bytes, 12);
  for (int i = 0; i < 4; ++i) bytes[12 + i] = (uint8_t)(crc >> (8 * i));
  EXPECT_ERROR(pcp_decoupled_tape_decode(bytes, length, &out),
               PCP_STATUS_INCOMPATIBLE, "version 2");
  assert_int_equal(out.count, 0);
  pcp_allocator_free(sys(), bytes);

  // A well-formed tape whose records do not fit: a sync with a clock that
  // skips a tick.
  pcp_decoupled_tape_t odd;
  pcp_decoupled_tape_initialize(sys(), &odd);
  pcp_decoupled_clock_entry_t jump[1] = {{0, 2}};
  pcp_decoupled_event_t sync = {0};
  sync.kind = PCP_DECOUPLED_EVENT_FRAGMENT_SYNC;
  sync.syncer_step = 1;
  sync.clock_entries = jump;
  sync.clock_entry_count = 1;
  EXPECT_OK(pcp_decoupled_tape_append(&odd, &sync, NULL));
  static pcp_decoupled_syncer_state_t bad;
  EXPECT_ERROR(pcp_decoupled_syncer_state_replay(sys(), 3, &odd, &bad),
               PCP_STATUS_DATA_LOSS, "syncer clock 2, replay is at 0");
  pcp_decoupled_tape_deinitialize(&odd);
  pcp_decoupled_tape_initialize(sys(), &odd);
  sync.fragment_id = 3;  // of 3
  jump[0].counter = 1;
  EXPECT_OK(pcp_decoupled_tape_append(&odd, &sync, NULL));
  EXPECT_ERROR(pcp_decoupled_syncer_state_replay(sys(), 3, &odd, &bad),
               PCP_STATUS_DATA_LOSS, "record 1 syncs fragment 3");
  pcp_decoupled_tape_deinitialize(&odd);
  // A learner_apply of a fragment the syncer does not have.
  pcp_decoupled_tape_initialize(sys(), &odd);
  pcp_decoupled_event_t apply = {0};
  apply.kind = PCP_DECOUPLED_EVENT_LEARNER_APPLY;
  apply.learner_id = 1;
  apply.fragment_id = 5;
  EXPECT_OK(pcp_decoupled_tape_append(&odd, &apply, NULL));
  EXPECT_ERROR(pcp_decoupled_syncer_state_replay(sys(), 3, &odd, &bad),
               PCP_STATUS_DATA_LOSS,
               "record 1 does not apply: learner_apply of fragment 5 of 3");
  pcp_decoupled_tape_deinitialize(&odd);
  pcp_decoupled_tape_deinitialize(&tape);
  pcp_decoupled_syncer_state_deinitialize(&live);
}

// The seed tape of tests/fuzz/decoupled was written by a Python script
// from the layout documented in decoupled.h, not by this encoder: decoding
// it checks the documentation and the code agree, byte for byte.
static void test_tape_seed_from_spec(void** state) {
  (void)state;
  void* data = NULL;
  size_t size = 0;
  EXPECT_OK(pcp_file_read_all(PCP_DECOUPLED_SEED_DIR "/tape_valid", 1u << 20,
                              &data, &size));
  const uint8_t* bytes = (const uint8_t*)data + 1;  // the fuzz mode byte
  pcp_decoupled_tape_t tape;
  pcp_decoupled_tape_initialize(sys(), &tape);
  EXPECT_OK(pcp_decoupled_tape_decode(bytes, size - 1, &tape));
  assert_int_equal(tape.count, 6);
  assert_int_equal(tape.events[0].kind, PCP_DECOUPLED_EVENT_FRAGMENT_SYNC);
  assert_int_equal(tape.events[0].participant_count, 2);
  assert_int_equal(tape.events[0].participants[1].learner_id, 2);
  assert_true(tape.events[0].participants[1].merge_weight == 4096.0);
  assert_int_equal(tape.events[2].clock_entry_count, 2);
  assert_int_equal(tape.events[2].clock_entries[1].counter, 20);
  assert_int_equal(tape.events[4].snapshot_id, 9);
  uint8_t* again = NULL;
  size_t again_size = 0;
  EXPECT_OK(pcp_decoupled_tape_encode(&tape, &again, &again_size));
  assert_int_equal(again_size, size - 1);
  assert_memory_equal(again, bytes, again_size);
  static pcp_decoupled_syncer_state_t replayed;
  EXPECT_OK(pcp_decoupled_syncer_state_replay(sys(), 3, &tape, &replayed));
  assert_int_equal(replayed.global_step, 2);
  assert_int_equal(replayed.fragment_versions[1], 1);
  assert_int_equal(replayed.fragment_versions[2], 1);
  assert_int_equal(replayed.learners[2].status, PCP_DECOUPLED_LEARNER_FAILED);
  assert_int_equal(replayed.learners[1].last_applied_step, 1);
  assert_int_equal(pcp_decoupled_clock_get(&replayed.clock, 1), 20);
  assert_true(replayed.snapshot_pending);
  assert_int_equal(replayed.in_flight_count, 1);
  pcp_decoupled_syncer_state_deinitialize(&replayed);
  pcp_allocator_free(sys(), again);
  pcp_decoupled_tape_deinitialize(&tape);
  pcp_libc_free(data);
}

static void test_recovery_plan(void** state) {
  (void)state;
  static pcp_decoupled_syncer_state_t live;
  static pcp_decoupled_syncer_state_t replayed;
  pcp_decoupled_tape_t tape;
  run_live(&live, &tape);
  EXPECT_OK(pcp_decoupled_syncer_state_replay(sys(), 3, &tape, &replayed));
  // The tape at restart: global step 5; fragment last steps f0 = 3,
  // f1 = 4, f2 = 5; learners 1, 2 ACTIVE, 3 FAILED; a pull of fragment 0
  // at step 6 in flight; the snapshot still waits on learner 2. One more
  // sync at step 7 of fragment 1 by learner 5, who is then gone: global 7,
  // f1 last synced at 7, learner 5 ACTIVE and not alive.
  pcp_decoupled_participant_t five = {5, 1, 1, 1, 1.0};
  EXPECT_OK(pcp_decoupled_syncer_record_sync(&replayed, &tape, 7, 1, &five, 1));
  // Alive now: 1 (saw step 7), 2 (saw step 3), 3 (marked FAILED, says 7),
  // 4 (new).
  pcp_decoupled_live_learner_t alive[4] = {{1, 7}, {2, 3}, {4, 0}, {3, 7}};
  pcp_decoupled_recovery_plan_t plan;
  EXPECT_OK(pcp_decoupled_recovery_plan_initialize(sys(), &replayed, &tape,
                                                   alive, 4, 3, &plan));
  assert_int_equal(plan.window.target_step, 7);
  assert_false(plan.snapshot_complete);
  assert_int_equal(plan.action_count, 1 + 1 + 4);
  assert_int_equal(plan.actions[0].kind, PCP_DECOUPLED_RECOVERY_MARK_FAILED);
  assert_int_equal(plan.actions[0].learner_id, 5);
  // The in-flight pull of fragment 0 at step 6 postdates f0's last sync (3).
  assert_int_equal(plan.actions[1].kind, PCP_DECOUPLED_RECOVERY_REPULL);
  assert_int_equal(plan.actions[1].fragment_id, 0);
  // Learner 1 up to date.
  assert_int_equal(plan.actions[2].learner_id, 1);
  assert_int_equal(plan.actions[2].kind, PCP_DECOUPLED_RECOVERY_RESUME);
  // Learner 2 saw step 3, 4 behind with max 3: full resync.
  assert_int_equal(plan.actions[3].learner_id, 2);
  assert_int_equal(plan.actions[3].kind, PCP_DECOUPLED_RECOVERY_FULL_RESYNC);
  assert_int_equal(plan.actions[3].fragment_count, 3);
  // Learner 3 was marked FAILED: full resync whatever it says.
  assert_int_equal(plan.actions[4].learner_id, 3);
  assert_int_equal(plan.actions[4].kind, PCP_DECOUPLED_RECOVERY_FULL_RESYNC);
  // Learner 4 is new.
  assert_int_equal(plan.actions[5].learner_id, 4);
  assert_int_equal(plan.actions[5].kind, PCP_DECOUPLED_RECOVERY_FULL_RESYNC);
  pcp_decoupled_recovery_plan_deinitialize(&plan);

  // With max 4, learner 2 catches up: the fragments synced after step 3
  // are f1 (7) and f2 (5).
  EXPECT_OK(pcp_decoupled_recovery_plan_initialize(sys(), &replayed, &tape,
                                                   alive, 4, 4, &plan));
  assert_int_equal(plan.actions[3].kind, PCP_DECOUPLED_RECOVERY_CATCH_UP);
  assert_int_equal(plan.actions[3].fragment_count, 2);
  assert_int_equal(plan.actions[3].fragments[0], 1);
  assert_int_equal(plan.actions[3].fragments[1], 2);
  // The window: accepts steps >= 7; restart once past 7 + 4.
  assert_true(pcp_decoupled_recovery_accepts(&plan.window, 7));
  assert_false(pcp_decoupled_recovery_accepts(&plan.window, 6));
  assert_false(pcp_decoupled_recovery_restart_required(&plan.window, 11));
  assert_true(pcp_decoupled_recovery_restart_required(&plan.window, 12));
  pcp_decoupled_recovery_plan_deinitialize(&plan);

  pcp_decoupled_live_learner_t twice[2] = {{1, 7}, {1, 7}};
  EXPECT_ERROR(pcp_decoupled_recovery_plan_initialize(sys(), &replayed, &tape,
                                                      twice, 2, 4, &plan),
               PCP_STATUS_INVALID_ARGUMENT, "listed twice");
  pcp_decoupled_tape_deinitialize(&tape);
  pcp_decoupled_syncer_state_deinitialize(&live);
  pcp_decoupled_syncer_state_deinitialize(&replayed);
}

// The pieces driven together as the service will drive them, over
// simulated time: three learners with step times 10, 11 and 30 ms train
// without stopping; at each syncer step (P = H = 3, overlap_tau 2) a round
// opens, each learner's reply lands when its current step ends, the round
// machine closes it with adaptive grace (gamma 1, cap 1 step, EMA alpha
// 0.5), the participants' outer gradients travel as int4, are merged
// (weighted_average, token weights) and applied by Nesterov, every learner
// overwrites the fragment (alpha 0), and the tape records it all.
// Asserted: the first round has no grace (no step time known yet) and
// leaves the slow learner out; grace is later positive and within one
// step; each selection is exactly the learners within quorum_wait + grace;
// the int4 merge is within half a scale of the exact merge; after every
// sync every learner's copy of the fragment is bit-identical to the
// global one; the tape replays to the live state.
static void test_simulated_syncer(void** state) {
  (void)state;
  enum { kLearners = 3, kSteps = 9, kN = 12, kFragValues = 4 };
  uint64_t values[3] = {4, 4, 4};
  pcp_decoupled_tensor_spec_t specs[3];
  spec_fill(specs, values, 3);
  pcp_decoupled_plan_t plan;
  EXPECT_OK(pcp_decoupled_plan_initialize(
      sys(), PCP_DECOUPLED_FRAGMENTS_STRIDED, specs, 3, NULL, 0, 3, 3, &plan));
  pcp_decoupled_schedule_t schedule = {3, 3, 2};
  pcp_decoupled_nesterov_t nesterov;
  EXPECT_OK(
      pcp_decoupled_nesterov_initialize(sys(), kN, 0.7f, 0.9f, &nesterov));
  static pcp_decoupled_syncer_state_t live;
  static pcp_decoupled_syncer_state_t replayed;
  EXPECT_OK(pcp_decoupled_syncer_state_initialize(sys(), 3, &live));
  pcp_decoupled_tape_t tape;
  pcp_decoupled_tape_initialize(sys(), &tape);
  pcp_decoupled_grace_t grace;
  memset(&grace, 0, sizeof(grace));
  grace.config = (pcp_decoupled_grace_config_t){0, true, 1.0, 1, 2, 0.5};

  static const uint32_t ids[kLearners] = {1, 2, 3};
  static const uint64_t step_ms[kLearners] = {10, 11, 30};
  float global[kN];
  float local[kLearners][kN];
  pcp_decoupled_learner_t counters[kLearners];
  uint64_t next_step_end[kLearners];
  for (int j = 0; j < kN; ++j) global[j] = 0.01f * (float)j;
  for (int l = 0; l < kLearners; ++l) {
    memcpy(local[l], global, sizeof(global));
    EXPECT_OK(pcp_decoupled_learner_initialize(sys(), (uint16_t)ids[l], 3,
                                               &counters[l]));
    next_step_end[l] = step_ms[l];
  }
  static pcp_decoupled_round_t round;
  uint64_t now = 0;
  uint64_t participants_total = 0;
  uint64_t wire_bytes = 0;
  bool slow_learner_ever_in = false;
  for (uint64_t s = 1; s <= kSteps; ++s) {
    uint32_t f = 0;
    assert_true(pcp_decoupled_schedule_fragment_at(&schedule, s, &f));
    uint64_t grace_ms = pcp_decoupled_grace_ms(&grace);
    if (s == 1) {
      assert_int_equal(grace_ms, 0);
    } else {
      assert_true(grace_ms > 0);
      assert_true((double)grace_ms <= grace.step_ema.value);
    }
    EXPECT_OK(pcp_decoupled_round_open(now, ids, kLearners, 2, grace_ms, 30000,
                                       &round));
    // The pull reads each learner's values now; the reply lands when the
    // learner's current step ends.
    float sent[kLearners][kFragValues];
    for (int l = 0; l < kLearners; ++l) {
      EXPECT_OK(pcp_decoupled_plan_gather(&plan, f, local[l], sent[l]));
    }
    uint64_t arrival[kLearners];
    int order[kLearners] = {0, 1, 2};
    for (int l = 0; l < kLearners; ++l) arrival[l] = next_step_end[l];
    for (int a = 0; a < kLearners; ++a) {
      for (int b = a + 1; b < kLearners; ++b) {
        if (arrival[order[b]] < arrival[order[a]]) {
          int t = order[a];
          order[a] = order[b];
          order[b] = t;
        }
      }
    }
    for (int k = 0; k < kLearners; ++k) {
      pcp_decoupled_round_arrive(&round, ids[order[k]], arrival[order[k]]);
    }
    if (round.state == PCP_DECOUPLED_ROUND_COLLECTING) {
      (void)pcp_decoupled_round_poll(
          &round, pcp_decoupled_round_next_deadline_ms(&round));
    }
    assert_int_equal(round.state, PCP_DECOUPLED_ROUND_CLOSED);
    const pcp_decoupled_selection_t* sel = &round.selection;
    for (int l = 0; l < kLearners; ++l) {
      bool in = false;
      for (uint32_t p = 0; p < sel->participant_count; ++p) {
        in = in || sel->participants[p] == ids[l];
      }
      assert_int_equal(in, arrival[l] - now <= sel->deadline_ms);
      if (in && l == 2)
        slow_learner_ever_in = true;
    }
    if (s == 1) {
      assert_int_equal(sel->participant_count, 2);  // 10 and 11 ms, not 30
      assert_int_equal(sel->skipped_count, 1);
    }
    print_message(
        "simulated step %llu: fragment %u grace %llu ms quorum "
        "wait %llu ms participants %u skipped %u\n",
        (unsigned long long)s, f, (unsigned long long)grace_ms,
        (unsigned long long)sel->quorum_wait_ms, sel->participant_count,
        sel->skipped_count);
    pcp_decoupled_grace_observe_quorum_wait(&grace,
                                            (double)sel->quorum_wait_ms);

    // Learner side: outer gradient against the global fragment, int4 on
    // the wire. Syncer side: decode, rebuild the learner's values, merge.
    float global_frag[kFragValues];
    EXPECT_OK(pcp_decoupled_plan_gather(&plan, f, global, global_frag));
    float rebuilt[kLearners][kFragValues];
    const float* views[kLearners];
    const float* exact_views[kLearners];
    double weights[kLearners];
    pcp_decoupled_participant_t parts[kLearners];
    double max_scale = 0.0;
    for (uint32_t p = 0; p < sel->participant_count; ++p) {
      int l = (int)sel->participants[p] - 1;
      float delta[kFragValues];
      for (int j = 0; j < kFragValues; ++j) {
        delta[j] = global_frag[j] - sent[l][j];
      }
      uint8_t payload[16];
      size_t bytes = pcp_decoupled_int4_encoded_size(kFragValues, 64);
      EXPECT_OK(pcp_decoupled_int4_encode(delta, kFragValues, 64, payload,
                                          sizeof(payload)));
      wire_bytes += bytes;
      float scale = 0;
      memcpy(&scale, payload, 4);
      if (scale > max_scale)
        max_scale = scale;
      float decoded[kFragValues];
      EXPECT_OK(
          pcp_decoupled_int4_decode(payload, bytes, kFragValues, 64, decoded));
      for (int j = 0; j < kFragValues; ++j) {
        rebuilt[p][j] = global_frag[j] - decoded[j];
      }
      views[p] = rebuilt[p];
      exact_views[p] = sent[l];
      weights[p] = pcp_decoupled_merge_weight(counters[l].tokens_since[f],
                                              counters[l].steps_since[f]);
      parts[p] = (pcp_decoupled_participant_t){
          ids[l], counters[l].learner_step, counters[l].steps_since[f],
          counters[l].tokens_since[f], weights[p]};
    }
    float merged[kFragValues];
    float exact[kFragValues];
    EXPECT_OK(pcp_decoupled_merge_tensor(
        PCP_DECOUPLED_MERGE_WEIGHTED_AVERAGE, global_frag, views, weights,
        sel->participant_count, kFragValues, merged, NULL));
    EXPECT_OK(pcp_decoupled_merge_tensor(
        PCP_DECOUPLED_MERGE_WEIGHTED_AVERAGE, global_frag, exact_views, weights,
        sel->participant_count, kFragValues, exact, NULL));
    for (int j = 0; j < kFragValues; ++j) {
      // A weighted mean of values each within s/2 (plus the f32 rounding
      // of rebuilding global - decoded).
      assert_true(fabs((double)merged[j] - (double)exact[j]) <=
                  max_scale / 2 + 1e-6);
    }
    EXPECT_OK(pcp_decoupled_nesterov_step_fragment(&nesterov, &plan, f, merged,
                                                   global));
    EXPECT_OK(pcp_decoupled_syncer_record_sync(&live, &tape, s, f, parts,
                                               sel->participant_count));
    participants_total += sel->participant_count;
    // Ready goes to every learner; alpha 0: the fragment is overwritten.
    EXPECT_OK(pcp_decoupled_plan_gather(&plan, f, global, global_frag));
    for (int l = 0; l < kLearners; ++l) {
      float frag[kFragValues];
      EXPECT_OK(pcp_decoupled_plan_gather(&plan, f, local[l], frag));
      EXPECT_OK(
          pcp_decoupled_blend(0.0f, global_frag, frag, kFragValues, NULL));
      EXPECT_OK(pcp_decoupled_plan_scatter(&plan, f, frag, local[l]));
      assert_memory_equal(frag, global_frag, sizeof(frag));
      EXPECT_OK(pcp_decoupled_learner_apply_fragment(&counters[l], f, s));
      pcp_decoupled_event_t apply = {0};
      apply.kind = PCP_DECOUPLED_EVENT_LEARNER_APPLY;
      apply.learner_id = ids[l];
      apply.fragment_id = f;
      apply.syncer_step = s;
      EXPECT_OK(pcp_decoupled_syncer_record_event(&live, &tape, &apply));
    }
    now = round.closed_at_ms + 1;  // the ready message leaves
    pcp_decoupled_grace_observe_sync_send(&grace, 1.0);
    // Learners keep training up to the next round: every finished step
    // drifts the parameters, counts 64 tokens and feeds the step EMA.
    for (int l = 0; l < kLearners; ++l) {
      while (next_step_end[l] <= now) {
        for (int j = 0; j < kN; ++j) {
          local[l][j] += 0.001f * (float)((l + 1) * (j % 5 + 1));
        }
        pcp_decoupled_learner_record_step(&counters[l], 64);
        pcp_decoupled_grace_observe_step(&grace, (double)step_ms[l]);
        next_step_end[l] += step_ms[l];
      }
    }
  }
  assert_true(slow_learner_ever_in);  // grace let the 30 ms learner in
  assert_int_equal(wire_bytes, participants_total * (4 + 2));
  assert_int_equal(live.participants_total, participants_total);
  EXPECT_OK(pcp_decoupled_syncer_state_replay(sys(), 3, &tape, &replayed));
  assert_true(pcp_decoupled_syncer_state_equal(&live, &replayed));
  for (int l = 0; l < kLearners; ++l) {
    pcp_decoupled_learner_deinitialize(&counters[l]);
  }
  pcp_decoupled_syncer_state_deinitialize(&replayed);
  pcp_decoupled_syncer_state_deinitialize(&live);
  pcp_decoupled_tape_deinitialize(&tape);
  pcp_decoupled_nesterov_deinitialize(&nesterov);
  pcp_decoupled_plan_deinitialize(&plan);
}

// Every allocation of decode, replay, encode, the recovery plan and the
// live recording failed in turn: a clean RESOURCE_EXHAUSTED each time, the
// outputs left empty, nothing leaked (the ASan build checks), and the run
// that fails nothing gives the same state as the system allocator's.
static void test_tape_allocation_failures(void** state) {
  (void)state;
  static pcp_decoupled_syncer_state_t live;
  pcp_decoupled_tape_t tape;
  run_live(&live, &tape);
  uint8_t* bytes = NULL;
  size_t length = 0;
  EXPECT_OK(pcp_decoupled_tape_encode(&tape, &bytes, &length));
  pcp_decoupled_live_learner_t alive[2] = {{1, 5}, {4, 0}};
  bool finished = false;
  for (int64_t k = 0; !finished; ++k) {
    assert_true(k < 1000);
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(sys(), k, false, &failing);
    pcp_allocator_t a = pcp_allocator_failing(&failing);
    pcp_decoupled_tape_t decoded;
    pcp_decoupled_tape_initialize(a, &decoded);
    static pcp_decoupled_syncer_state_t replayed;
    pcp_decoupled_recovery_plan_t plan;
    uint8_t* again = NULL;
    size_t again_length = 0;
    pcp_status_t status = pcp_decoupled_tape_decode(bytes, length, &decoded);
    bool decoded_ok = status == NULL;
    bool have_state = false;
    bool have_plan = false;
    if (status == NULL) {
      status = pcp_decoupled_syncer_state_replay(a, 3, &decoded, &replayed);
      have_state = status == NULL;
    }
    if (status == NULL) {
      status = pcp_decoupled_recovery_plan_initialize(a, &replayed, &decoded,
                                                      alive, 2, 24, &plan);
      have_plan = status == NULL;
    }
    if (status == NULL) {
      status = pcp_decoupled_tape_encode(&decoded, &again, &again_length);
    }
    if (status == NULL) {
      pcp_decoupled_participant_t one = {1, 50, 1, 1, 1.0};
      status =
          pcp_decoupled_syncer_record_sync(&replayed, &decoded, 6, 0, &one, 1);
    }
    if (failing.failure_count == 0) {
      EXPECT_OK(status);
      assert_int_equal(again_length, length);
      assert_memory_equal(again, bytes, length);
      assert_int_equal(decoded.count, tape.count + 1);
      finished = true;
    } else {
      EXPECT_CODE(status, PCP_STATUS_RESOURCE_EXHAUSTED);
      if (!decoded_ok)
        assert_int_equal(decoded.count, 0);
    }
    pcp_allocator_free(a, again);
    if (have_plan)
      pcp_decoupled_recovery_plan_deinitialize(&plan);
    if (have_state)
      pcp_decoupled_syncer_state_deinitialize(&replayed);
    pcp_decoupled_tape_deinitialize(&decoded);
  }
  pcp_allocator_free(sys(), bytes);
  pcp_decoupled_tape_deinitialize(&tape);
  pcp_decoupled_syncer_state_deinitialize(&live);
}

//===----------------------------------------------------------------------===//
// int4
//===----------------------------------------------------------------------===//

static float block_scale_of(const uint8_t* data, size_t block) {
  float s = 0;
  memcpy(&s, data + block * 4, 4);  // little-endian host
  return s;
}

// Round trip of |n| values: every element within its block's scale / 2.
static void check_round_trip(const float* x, size_t n, uint32_t block) {
  size_t bytes = pcp_decoupled_int4_encoded_size(n, block);
  static uint8_t data[16384];
  static float back[2048];
  assert_true(bytes <= sizeof(data) && n <= 2048);
  EXPECT_OK(pcp_decoupled_int4_encode(x, n, block, data, bytes));
  EXPECT_OK(pcp_decoupled_int4_decode(data, bytes, n, block, back));
  for (size_t i = 0; i < n; ++i) {
    double s = block_scale_of(data, i / block);
    double err = fabs((double)x[i] - (double)back[i]);
    if (!(err <= s / 2)) {
      print_error("element %zu: x=%a dec=%a err=%g scale=%g\n", i, (double)x[i],
                  (double)back[i], err, s);
      fail();
    }
    assert_true(isfinite(back[i]));
  }
}

static void test_int4_bytes_and_bound(void** state) {
  (void)state;
  // 64k values: 1024 scales (4 KiB) + 32 KiB of codes = 36,864 bytes
  // against 262,144 for f32: 7.11x.
  size_t n = 65536;
  assert_int_equal(pcp_decoupled_int4_encoded_size(n, 64), 36864);
  double ratio =
      (double)(n * 4) / (double)pcp_decoupled_int4_encoded_size(n, 64);
  assert_true(ratio > 7.1 && ratio < 7.2);
  assert_int_equal(pcp_decoupled_int4_encoded_size(5, 64), 4 + 3);
  assert_int_equal(pcp_decoupled_int4_encoded_size(130, 64), 12 + 65);
  assert_int_equal(pcp_decoupled_int4_encoded_size(3, 0), 0);

  // Hand case: block of 4 with max 7 -> scale 1, codes exact.
  float hand[4] = {7.0f, -3.2f, 0.5f, -7.0f};
  uint8_t data[4 + 2];
  EXPECT_OK(pcp_decoupled_int4_encode(hand, 4, 4, data, sizeof(data)));
  assert_true(block_scale_of(data, 0) == 1.0f);
  assert_int_equal(data[4], (uint8_t)((15) | ((8 - 3) << 4)));  // 7, -3
  assert_int_equal(data[5], (uint8_t)((8) | ((8 - 7) << 4)));   // 0 (0.5
                                                                // ties even)
  float back[4];
  EXPECT_OK(pcp_decoupled_int4_decode(data, sizeof(data), 4, 4, back));
  assert_true(back[0] == 7.0f && back[1] == -3.0f && back[2] == 0.0f &&
              back[3] == -7.0f);

  // Random data, seeded; odd count, several blocks.
  pcp_rng_t rng;
  pcp_rng_initialize(42, &rng);
  static float x[2048];
  for (size_t i = 0; i < 2001; ++i) {
    x[i] = (float)(pcp_rng_next_normal(&rng) * 0.01);
  }
  check_round_trip(x, 2001, 64);
  check_round_trip(x, 2001, 1);
  check_round_trip(x, 2001, 333);
  // Huge ranges: blocks at 1e30, 1e-30, FLT_MAX, subnormals, mixed signs.
  for (size_t i = 0; i < 256; ++i) {
    double u = pcp_rng_next_double(&rng) * 2.0 - 1.0;
    if (i < 64) {
      x[i] = (float)(u * 1e30);
    } else if (i < 128) {
      x[i] = (float)(u * 1e-30);
    } else if (i < 192) {
      x[i] = (float)(u * FLT_MAX);
    } else {
      x[i] = (float)(u * 1e-42);  // subnormal
    }
  }
  x[130] = FLT_MAX;
  x[131] = -FLT_MAX;
  x[200] = 1.4e-45f;  // the smallest subnormal
  check_round_trip(x, 256, 64);
  // One block spanning 1e30 and 1e-30: the small ones decode to 0, within
  // the bound of the large scale.
  check_round_trip(x, 128, 128);
  // Zeros (and negative zero): scale 0, exact.
  float zeros[65] = {0};
  zeros[3] = -0.0f;
  check_round_trip(zeros, 65, 64);
  uint8_t zdata[8 + 33];
  EXPECT_OK(pcp_decoupled_int4_encode(zeros, 65, 64, zdata, sizeof(zdata)));
  assert_true(block_scale_of(zdata, 0) == 0.0f);
}

static void test_int4_refusals(void** state) {
  (void)state;
  float x[4] = {1.0f, 2.0f, NAN, 3.0f};
  uint8_t data[16];
  EXPECT_ERROR(pcp_decoupled_int4_encode(x, 4, 64, data, sizeof(data)),
               PCP_STATUS_INVALID_ARGUMENT, "element 2 is NaN");
  x[2] = -INFINITY;
  EXPECT_ERROR(pcp_decoupled_int4_encode(x, 4, 64, data, sizeof(data)),
               PCP_STATUS_INVALID_ARGUMENT, "element 2 is infinite");
  x[2] = 0.0f;
  EXPECT_ERROR(pcp_decoupled_int4_encode(x, 4, 64, data, 5),
               PCP_STATUS_INVALID_ARGUMENT, "needs 6 bytes");
  EXPECT_CODE(pcp_decoupled_int4_encode(x, 4, 0, data, sizeof(data)),
              PCP_STATUS_INVALID_ARGUMENT);
  EXPECT_ERROR(pcp_decoupled_int4_encode(x, PCP_DECOUPLED_INT4_MAX_VALUES + 1,
                                         64, data, sizeof(data)),
               PCP_STATUS_INVALID_ARGUMENT, "limit");
  assert_int_equal(
      pcp_decoupled_int4_encoded_size(PCP_DECOUPLED_INT4_MAX_VALUES + 1, 64),
      0);
  EXPECT_OK(pcp_decoupled_int4_encode(x, 4, 64, data, sizeof(data)));
  float back[4];
  EXPECT_ERROR(pcp_decoupled_int4_decode(data, 7, 4, 64, back),
               PCP_STATUS_DATA_LOSS, "need 6");
  uint8_t bad[6];
  memcpy(bad, data, 6);
  float neg = -1.0f;
  memcpy(bad, &neg, 4);
  EXPECT_ERROR(pcp_decoupled_int4_decode(bad, 6, 4, 64, back),
               PCP_STATUS_DATA_LOSS, "scale");
  float huge = FLT_MAX / 6.0f;  // 7 * huge overflows: never encoded
  memcpy(bad, &huge, 4);
  EXPECT_ERROR(pcp_decoupled_int4_decode(bad, 6, 4, 64, back),
               PCP_STATUS_DATA_LOSS, "scale");
  memcpy(bad, data, 6);
  bad[5] &= 0xF0;  // code 0 in element 2
  EXPECT_ERROR(pcp_decoupled_int4_decode(bad, 6, 4, 64, back),
               PCP_STATUS_DATA_LOSS, "element 2 has code 0");
}

//===----------------------------------------------------------------------===//
// Experiment keys
//===----------------------------------------------------------------------===//

static pcp_status_t parse_config(const char* json,
                                 pcp_decoupled_config_t* config) {
  return pcp_decoupled_config_parse_json(json, strlen(json), config, NULL);
}

static void test_config(void** state) {
  (void)state;
  pcp_decoupled_config_t c;
  // Defaults: the syncer's (reference s.1.3), outer lr 0.7.
  EXPECT_OK(parse_config("{}", &c));
  assert_true(c.present);
  assert_int_equal(c.num_fragments, 24);
  assert_int_equal(c.sync_interval_h, 0);
  assert_int_equal(c.overlap_tau, 2);
  assert_int_equal(c.min_quorum, 1);
  assert_int_equal(c.merge_strategy,
                   PCP_DECOUPLED_MERGE_AVG_EMBEDDING_RDA_MODEL);
  assert_int_equal(c.fragment_strategy,
                   PCP_DECOUPLED_FRAGMENTS_BALANCED_TENSOR);
  assert_true(c.outer_learning_rate == 0.7);
  assert_true(c.timing_ema_alpha == 0.125);
  assert_int_equal(c.max_recovery_syncer_steps, 24);
  assert_int_equal(c.int4_block_size, 64);
  assert_int_equal(c.steps_per_task, 1);
  assert_int_equal(c.seeded_init, 0);  // auto
  assert_true(c.final_sync);
  // H from tau (24 here), the paper profile's P = H = 24.
  pcp_decoupled_schedule_t schedule;
  pcp_decoupled_grace_config_t grace;
  EXPECT_OK(pcp_decoupled_config_resolve(&c, 2, 24, &schedule, &grace));
  assert_int_equal(schedule.sync_interval_h, 24);
  assert_int_equal(grace.overlap_tau, 2);
  EXPECT_ERROR(pcp_decoupled_config_resolve(&c, 2, 10, &schedule, &grace),
               PCP_STATUS_INVALID_ARGUMENT, "P <= H");
  pcp_decoupled_config_deinitialize(&c);

  EXPECT_OK(parse_config(
      "{\"num_fragments\": 2, \"sync_interval_h\": 2, \"min_quorum\": 2,"
      " \"grace_window_ms\": 250, \"merge_strategy\": \"rda\","
      " \"fragment_strategy\": \"strided\", \"adaptive_grace_enabled\":"
      " true, \"outer_gradient_compression\": \"int4\"}",
      &c));
  assert_int_equal(c.merge_strategy, PCP_DECOUPLED_MERGE_RDA);
  assert_int_equal(c.outer_gradient_compression, 1);
  EXPECT_OK(pcp_decoupled_config_resolve(&c, 2, 100, &schedule, &grace));
  assert_int_equal(schedule.sync_interval_h, 2);  // the key wins over tau
  assert_int_equal(grace.grace_window_ms, 250);
  assert_true(grace.adaptive);
  EXPECT_ERROR(pcp_decoupled_config_resolve(&c, 1, 100, &schedule, &grace),
               PCP_STATUS_INVALID_ARGUMENT, "min_quorum");
  pcp_decoupled_config_deinitialize(&c);
  EXPECT_OK(parse_config("{\"steps_per_task\": 64}", &c));
  assert_int_equal(c.steps_per_task, 64);
  EXPECT_OK(parse_config("{\"seeded_init\": \"off\"}", &c));
  assert_int_equal(c.seeded_init, 1);
  pcp_decoupled_config_deinitialize(&c);
  EXPECT_OK(parse_config("{\"final_sync\": false}", &c));
  assert_false(c.final_sync);
  pcp_decoupled_config_deinitialize(&c);

  static const struct {
    const char* json;
    const char* error;
  } kBad[] = {
      {"{\"num_fragments\": 0}", "num_fragments"},
      {"{\"num_fragments\": 4, \"sync_interval_h\": 3}", "P <= H"},
      {"{\"learner_alpha\": 1.5}", "learner_alpha"},
      {"{\"timing_ema_alpha\": 0}", "timing_ema_alpha"},
      {"{\"grace_gamma\": -1}", "grace_gamma"},
      {"{\"max_grace_steps\": 0}", "max_grace_steps"},
      {"{\"overlap_tau\": 0}", "overlap_tau"},
      {"{\"merge_strategy\": \"mean\"}", "merge_strategy"},
      {"{\"outer_gradient_compression\": \"int8\"}",
       "outer_gradient_compression"},
      {"{\"steps_per_task\": 0}", "steps_per_task"},
      {"{\"steps_per_task\": 65}", "steps_per_task"},
      {"{\"steps_per_task\": 2.5}", "steps_per_task"},
      {"{\"seeded_init\": \"on\"}", "seeded_init"},
      {"{\"seeded_init\": true}", "seeded_init"},
      {"{\"final_sync\": 1}", "final_sync"},
      {"{\"final_sync\": \"no\"}", "final_sync"},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(kBad); ++i) {
    EXPECT_ERROR(parse_config(kBad[i].json, &c), PCP_STATUS_INVALID_ARGUMENT,
                 kBad[i].error);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan_strided),
      cmocka_unit_test(test_plan_balanced_digest),
      cmocka_unit_test(test_plan_roles_and_gather),
      cmocka_unit_test(test_plan_errors),
      cmocka_unit_test(test_plan_check_rules),
      cmocka_unit_test(test_plan_allocation_failures),
      cmocka_unit_test(test_schedule_table),
      cmocka_unit_test(test_schedule_final_sync),
      cmocka_unit_test(test_merge_weight),
      cmocka_unit_test(test_merge_no_usable_weight_is_skipped),
      cmocka_unit_test(test_merge_weighted_average),
      cmocka_unit_test(test_merge_rda_examples),
      cmocka_unit_test(test_merge_fragment_roles),
      cmocka_unit_test(test_nesterov_fragment),
      cmocka_unit_test(test_learner_counters_and_blend),
      cmocka_unit_test(test_select_digest_example),
      cmocka_unit_test(test_adaptive_grace),
      cmocka_unit_test(test_round_machine),
      cmocka_unit_test(test_vector_clock),
      cmocka_unit_test(test_tape_replay_matches_live),
      cmocka_unit_test(test_tape_append_matches_rewrite),
      cmocka_unit_test(test_tape_corruption),
      cmocka_unit_test(test_tape_seed_from_spec),
      cmocka_unit_test(test_recovery_plan),
      cmocka_unit_test(test_tape_allocation_failures),
      cmocka_unit_test(test_simulated_syncer),
      cmocka_unit_test(test_int4_bytes_and_bound),
      cmocka_unit_test(test_int4_refusals),
      cmocka_unit_test(test_config),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
