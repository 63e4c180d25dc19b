// SPDX-License-Identifier: Apache-2.0
// pcp_sampler_sample_logprobs: hand-computed log-probabilities of the
// distribution the token is drawn from (temperature, top-k, top-p,
// penalties), greedy as a point mass, the same draws as pcp_sampler_sample,
// the top count limit. Random logits against NumPy:
// tests/workloads/sampling_logprobs_numpy_test.py.

// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
// clang-format on

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "workloads/workloads.h"

static pcp_sampler_t make_sampler(double temperature, int64_t top_k,
                                  double top_p, uint64_t seed, int64_t vocab) {
  pcp_sampling_params_t params;
  pcp_sampling_params_initialize(&params);
  params.temperature = temperature;
  params.top_k = top_k;
  params.top_p = top_p;
  params.seed = seed;
  pcp_sampler_t sampler;
  PCP_CHECK_OK(
      pcp_sampler_initialize(&params, vocab, pcp_allocator_system(), &sampler));
  return sampler;
}

// Logits whose softmax at T = 1 is {1, 2, 3, 4} / 10.
static const float kLogits[] = {0.0f, 0.69314718f, 1.09861229f, 1.38629436f};

static float expected(int32_t token, const double* probs) {
  return (float)log(probs[token]);
}

static void test_plain_temperature(void** state) {
  (void)state;
  pcp_sampler_t sampler = make_sampler(1.0, 0, 1.0, 3, 4);
  const double probs[] = {0.1, 0.2, 0.3, 0.4};
  for (int i = 0; i < 50; ++i) {
    int32_t token = -1;
    pcp_sampler_logprobs_t lp;
    PCP_CHECK_OK(pcp_sampler_sample_logprobs(&sampler, kLogits, NULL, 0, 3,
                                             &token, &lp));
    assert_true(token >= 0 && token < 4);
    assert_float_equal(lp.logprob, expected(token, probs), 1e-6);
    assert_int_equal(lp.top_count, 3);
    assert_int_equal(lp.top[0].token, 3);
    assert_int_equal(lp.top[1].token, 2);
    assert_int_equal(lp.top[2].token, 1);
    assert_float_equal(lp.top[0].logprob, log(0.4), 1e-6);
    assert_float_equal(lp.top[2].logprob, log(0.2), 1e-6);
  }
  pcp_sampler_deinitialize(&sampler);
  // T = 0.5 squares the weights: {1, 4, 9, 16} / 30.
  sampler = make_sampler(0.5, 0, 1.0, 3, 4);
  const double squared[] = {1 / 30.0, 4 / 30.0, 9 / 30.0, 16 / 30.0};
  int32_t token = -1;
  pcp_sampler_logprobs_t lp;
  PCP_CHECK_OK(
      pcp_sampler_sample_logprobs(&sampler, kLogits, NULL, 0, 20, &token, &lp));
  assert_float_equal(lp.logprob, expected(token, squared), 1e-6);
  // Fewer tokens than asked for: all of them.
  assert_int_equal(lp.top_count, 4);
  pcp_sampler_deinitialize(&sampler);
}

static void test_filtered_sets_renormalised(void** state) {
  (void)state;
  // top_k 2 keeps {3, 2}: 4/7 and 3/7.
  pcp_sampler_t top_k = make_sampler(1.0, 2, 1.0, 5, 4);
  const double two[] = {0, 0, 3 / 7.0, 4 / 7.0};
  for (int i = 0; i < 50; ++i) {
    int32_t token = -1;
    pcp_sampler_logprobs_t lp;
    PCP_CHECK_OK(
        pcp_sampler_sample_logprobs(&top_k, kLogits, NULL, 0, 5, &token, &lp));
    assert_true(token == 2 || token == 3);
    assert_float_equal(lp.logprob, expected(token, two), 1e-6);
    assert_int_equal(lp.top_count, 2);
  }
  pcp_sampler_deinitialize(&top_k);
  // top_p 0.6: 0.4 then 0.3 reaches it: {3, 2} again, as 4/7 and 3/7.
  pcp_sampler_t top_p = make_sampler(1.0, 0, 0.6, 5, 4);
  for (int i = 0; i < 50; ++i) {
    int32_t token = -1;
    pcp_sampler_logprobs_t lp;
    PCP_CHECK_OK(
        pcp_sampler_sample_logprobs(&top_p, kLogits, NULL, 0, 5, &token, &lp));
    assert_float_equal(lp.logprob, expected(token, two), 1e-6);
    double mass = 0;
    for (size_t j = 0; j < lp.top_count; ++j) {
      mass += exp(lp.top[j].logprob);
    }
    assert_float_equal(mass, 1.0, 1e-6);
  }
  pcp_sampler_deinitialize(&top_p);
  // top_p 0.35: the most likely token alone, probability 1.
  pcp_sampler_t one = make_sampler(1.0, 0, 0.35, 5, 4);
  int32_t token = -1;
  pcp_sampler_logprobs_t lp;
  PCP_CHECK_OK(
      pcp_sampler_sample_logprobs(&one, kLogits, NULL, 0, 2, &token, &lp));
  assert_int_equal(token, 3);
  assert_float_equal(lp.logprob, 0.0, 1e-7);
  assert_int_equal(lp.top_count, 1);
  pcp_sampler_deinitialize(&one);
}

static void test_penalties_are_part_of_the_policy(void** state) {
  (void)state;
  // frequency_penalty 1 with token 3 twice in the history: its logit drops
  // by 2, so the weights are {1, 2, 3, 4 e^-2}.
  pcp_sampling_params_t params;
  pcp_sampling_params_initialize(&params);
  params.temperature = 1.0;
  params.frequency_penalty = 1.0;
  params.seed = 9;
  pcp_sampler_t sampler;
  PCP_CHECK_OK(
      pcp_sampler_initialize(&params, 4, pcp_allocator_system(), &sampler));
  const int32_t history[] = {3, 3};
  double w[] = {1, 2, 3, 4 * exp(-2.0)};
  double total = w[0] + w[1] + w[2] + w[3];
  for (int i = 0; i < 20; ++i) {
    int32_t token = -1;
    pcp_sampler_logprobs_t lp;
    PCP_CHECK_OK(pcp_sampler_sample_logprobs(&sampler, kLogits, history, 2, 1,
                                             &token, &lp));
    assert_float_equal(lp.logprob, log(w[token] / total), 1e-6);
    assert_int_equal(lp.top[0].token, 2);
  }
  pcp_sampler_deinitialize(&sampler);
}

static void test_greedy_point_mass(void** state) {
  (void)state;
  pcp_sampler_t greedy = make_sampler(0, 0, 1.0, 1, 4);
  int32_t token = -1;
  pcp_sampler_logprobs_t lp;
  PCP_CHECK_OK(
      pcp_sampler_sample_logprobs(&greedy, kLogits, NULL, 0, 5, &token, &lp));
  assert_int_equal(token, 3);
  assert_true(lp.logprob == 0.0f);
  assert_int_equal(lp.top_count, 1);
  assert_int_equal(lp.top[0].token, 3);
  PCP_CHECK_OK(
      pcp_sampler_sample_logprobs(&greedy, kLogits, NULL, 0, 0, &token, &lp));
  assert_int_equal(lp.top_count, 0);
  pcp_sampler_deinitialize(&greedy);
}

// The log-probabilities change nothing about the draws: the same seed
// draws the same tokens with and without them, on every path.
static void test_same_draws_as_sample(void** state) {
  (void)state;
  enum { kVocab = 1000 };
  float* logits = NULL;
  PCP_CHECK_OK(pcp_allocator_malloc(pcp_allocator_system(),
                                    kVocab * sizeof(float), (void**)&logits));
  pcp_rng_t rng;
  pcp_rng_initialize(17, &rng);
  for (int i = 0; i < kVocab; ++i) {
    logits[i] = (float)(4.0 * pcp_rng_next_double(&rng) - 2.0);
  }
  const struct {
    double t;
    int64_t k;
    double p;
  } cases[] = {{1.0, 0, 1.0}, {0.7, 0, 0.9}, {1.3, 50, 1.0}, {1.0, 40, 0.8}};
  for (size_t c = 0; c < PCP_ARRAYSIZE(cases); ++c) {
    pcp_sampler_t a =
        make_sampler(cases[c].t, cases[c].k, cases[c].p, 77, kVocab);
    pcp_sampler_t b =
        make_sampler(cases[c].t, cases[c].k, cases[c].p, 77, kVocab);
    for (int i = 0; i < 200; ++i) {
      int32_t x = -1;
      int32_t y = -2;
      pcp_sampler_logprobs_t lp;
      PCP_CHECK_OK(
          pcp_sampler_sample_logprobs(&a, logits, NULL, 0, 20, &x, &lp));
      PCP_CHECK_OK(pcp_sampler_sample(&b, logits, NULL, 0, &y));
      assert_int_equal(x, y);
      assert_true(lp.logprob <= 0 && isfinite(lp.logprob));
      assert_true(lp.top_count >= 1 && lp.top_count <= 20);
      double mass = 0;
      for (size_t j = 0; j < lp.top_count; ++j) {
        mass += exp(lp.top[j].logprob);
        if (j > 0) {
          assert_true(lp.top[j].logprob <= lp.top[j - 1].logprob);
        }
      }
      assert_true(mass <= 1.0 + 1e-6);
    }
    pcp_sampler_deinitialize(&a);
    pcp_sampler_deinitialize(&b);
  }
  pcp_allocator_free(pcp_allocator_system(), logits);
}

static void test_top_count_limit(void** state) {
  (void)state;
  pcp_sampler_t sampler = make_sampler(1.0, 0, 1.0, 1, 4);
  int32_t token = 0;
  pcp_sampler_logprobs_t lp;
  pcp_status_t status = pcp_sampler_sample_logprobs(
      &sampler, kLogits, NULL, 0, PCP_SAMPLER_MAX_TOP_LOGPROBS + 1, &token,
      &lp);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(token, -1);
  pcp_sampler_deinitialize(&sampler);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plain_temperature),
      cmocka_unit_test(test_filtered_sets_renormalised),
      cmocka_unit_test(test_penalties_are_part_of_the_policy),
      cmocka_unit_test(test_greedy_point_mass),
      cmocka_unit_test(test_same_draws_as_sample),
      cmocka_unit_test(test_top_count_limit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
