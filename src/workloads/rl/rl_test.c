// SPDX-License-Identifier: Apache-2.0
// The RL core's edge cases (rl.h): advantages of hand-computed groups, the
// all-equal group (exactly zero, counted), Dr. GRPO's unscaled variant,
// in-place use, every refused input naming its field with nothing written;
// the @grpo module's text and its derivation by the autodiff. Random
// inputs against NumPy: tests/workloads/rl_advantage_numpy_test.py; the
// objective's numbers against JAX: tests/models/grpo_jax_test.py.

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "workloads/workloads.h"

static void expect_code_at(pcp_status_t status, pcp_status_code_t code,
                           const char* needle, const char* file, int line) {
  char text[1024] = "";
  pcp_status_format(status, text, sizeof(text));
  if (pcp_status_code(status) != code || (needle && !strstr(text, needle))) {
    print_error("%s:%d: want %s naming '%s', got %s\n", file, line,
                pcp_status_code_string(code), needle ? needle : "", text);
    pcp_status_ignore(status);
    fail();
  }
  pcp_status_ignore(status);
}
#define EXPECT_CODE(expr, code, needle) \
  expect_code_at((expr), (code), (needle), __FILE__, __LINE__)
#define EXPECT_OK(expr) EXPECT_CODE((expr), PCP_STATUS_OK, NULL)

static pcp_workloads_rl_advantage_options_t options_of(int64_t group_size) {
  pcp_workloads_rl_advantage_options_t options;
  pcp_workloads_rl_advantage_options_initialize(&options);
  options.group_size = group_size;
  return options;
}

static void advantages_known_values(void** state) {
  (void)state;
  // Group 1: 1, 2, 3, 4: mean 2.5, sample std sqrt(5/3).
  // Group 2: 0, 0, 0, 1: mean 0.25, sample std 0.5.
  const float rewards[8] = {1, 2, 3, 4, 0, 0, 0, 1};
  float a[8];
  pcp_workloads_rl_advantage_options_t options = options_of(4);
  pcp_workloads_rl_advantage_stats_t stats;
  EXPECT_OK(
      pcp_workloads_rl_advantages_compute(&options, rewards, 8, a, &stats));
  double s1 = sqrt(5.0 / 3.0) + 1e-4;
  assert_float_equal(a[0], -1.5 / s1, 1e-6);
  assert_float_equal(a[1], -0.5 / s1, 1e-6);
  assert_float_equal(a[2], 0.5 / s1, 1e-6);
  assert_float_equal(a[3], 1.5 / s1, 1e-6);
  double s2 = 0.5 + 1e-4;
  assert_float_equal(a[4], -0.25 / s2, 1e-6);
  assert_float_equal(a[7], 0.75 / s2, 1e-6);
  assert_int_equal(stats.group_count, 2);
  assert_int_equal(stats.degenerate_group_count, 0);
  assert_float_equal(stats.reward_mean, 11.0 / 8.0, 1e-12);
  // Population std over all 8: sum of squares 15.875 / 8.
  assert_float_equal(stats.reward_std, sqrt(15.875 / 8.0), 1e-12);
  // Each group's advantages sum to zero.
  assert_float_equal(a[0] + a[1] + a[2] + a[3], 0.0, 1e-6);
}

static void advantages_all_equal_group(void** state) {
  (void)state;
  // 0.1 three times: the mean's rounding would leave r - mean = ~1e-17,
  // which / epsilon is a fake signal. Must be exactly 0 and counted.
  const float rewards[9] = {0.1f, 0.1f, 0.1f, 1, 0, 1, -3, -3, -3};
  float a[9];
  pcp_workloads_rl_advantage_options_t options = options_of(3);
  pcp_workloads_rl_advantage_stats_t stats;
  EXPECT_OK(
      pcp_workloads_rl_advantages_compute(&options, rewards, 9, a, &stats));
  for (int i = 0; i < 3; ++i) {
    assert_true(a[i] == 0.0f && !signbit(a[i]));
    assert_true(a[6 + i] == 0.0f);
  }
  assert_true(a[3] > 0 && a[4] < 0 && a[5] > 0);
  assert_int_equal(stats.group_count, 3);
  assert_int_equal(stats.degenerate_group_count, 2);
  // Nearly equal is not equal: one ulp apart still gets advantages, and
  // epsilon keeps them bounded (|A| <= (r - mean) / epsilon).
  const float close[2] = {1.0f, nextafterf(1.0f, 2.0f)};
  pcp_workloads_rl_advantage_options_t pair = options_of(2);
  EXPECT_OK(pcp_workloads_rl_advantages_compute(&pair, close, 2, a, &stats));
  assert_int_equal(stats.degenerate_group_count, 0);
  assert_true(a[0] < 0 && a[1] > 0 && fabsf(a[1]) < 1e-2f);
}

static void advantages_unscaled_and_in_place(void** state) {
  (void)state;
  float r[4] = {2, 4, 10, 0};
  pcp_workloads_rl_advantage_options_t options = options_of(2);
  options.scale_by_std = false;  // Dr. GRPO: r - mean only
  EXPECT_OK(pcp_workloads_rl_advantages_compute(&options, r, 4, r, NULL));
  assert_float_equal(r[0], -1, 0);
  assert_float_equal(r[1], 1, 0);
  assert_float_equal(r[2], 5, 0);
  assert_float_equal(r[3], -5, 0);
  // G = 2 scaled: std = |r1 - r0| / sqrt(2), so A = -+1/sqrt(2) (eps 0).
  float s[2] = {3, 7};
  options.scale_by_std = true;
  options.epsilon = 0;
  EXPECT_OK(pcp_workloads_rl_advantages_compute(&options, s, 2, s, NULL));
  assert_float_equal(s[0], -1 / sqrt(2.0), 1e-7);
  assert_float_equal(s[1], 1 / sqrt(2.0), 1e-7);
}

static void advantages_refused(void** state) {
  (void)state;
  float r[6] = {1, 2, 3, 4, 5, 6};
  float a[6] = {42, 42, 42, 42, 42, 42};
  pcp_workloads_rl_advantage_options_t options = options_of(1);
  EXPECT_CODE(pcp_workloads_rl_advantages_compute(&options, r, 6, a, NULL),
              PCP_STATUS_INVALID_ARGUMENT, "group_size 1");
  options = options_of(PCP_RL_MAX_GROUP_SIZE + 1);
  EXPECT_CODE(pcp_workloads_rl_advantages_compute(&options, r, 6, a, NULL),
              PCP_STATUS_INVALID_ARGUMENT, "group_size 1025");
  options = options_of(4);
  EXPECT_CODE(pcp_workloads_rl_advantages_compute(&options, r, 6, a, NULL),
              PCP_STATUS_INVALID_ARGUMENT, "not a multiple of group_size 4");
  EXPECT_CODE(pcp_workloads_rl_advantages_compute(&options, r, 0, a, NULL),
              PCP_STATUS_INVALID_ARGUMENT, "reward count 0");
  EXPECT_CODE(pcp_workloads_rl_advantages_compute(&options, NULL, 4, a, NULL),
              PCP_STATUS_INVALID_ARGUMENT, "rewards");
  EXPECT_CODE(pcp_workloads_rl_advantages_compute(&options, r, 4, NULL, NULL),
              PCP_STATUS_INVALID_ARGUMENT, "out_advantages");
  options = options_of(2);
  options.epsilon = -1e-3;
  EXPECT_CODE(pcp_workloads_rl_advantages_compute(&options, r, 6, a, NULL),
              PCP_STATUS_INVALID_ARGUMENT, "epsilon");
  options.epsilon = NAN;
  EXPECT_CODE(pcp_workloads_rl_advantages_compute(&options, r, 6, a, NULL),
              PCP_STATUS_INVALID_ARGUMENT, "epsilon");
  options = options_of(2);
  r[3] = NAN;
  EXPECT_CODE(pcp_workloads_rl_advantages_compute(&options, r, 6, a, NULL),
              PCP_STATUS_INVALID_ARGUMENT, "reward 3 (group 1) is not finite");
  r[3] = INFINITY;
  EXPECT_CODE(pcp_workloads_rl_advantages_compute(&options, r, 6, a, NULL),
              PCP_STATUS_INVALID_ARGUMENT, "reward 3");
  for (int i = 0; i < 6; ++i) assert_float_equal(a[i], 42, 0);
}

static pcp_models_spec_t tiny_gpt(void) {
  pcp_models_spec_t spec;
  pcp_models_spec_initialize(PCP_MODELS_ARCHITECTURE_GPT, &spec);
  spec.layers = 1;
  spec.heads = 2;
  spec.width = 16;
  spec.vocab = 11;
  spec.block_size = 8;
  spec.batch = 2;
  return spec;
}

static void objective_module_text(void** state) {
  (void)state;
  pcp_models_spec_t spec = tiny_gpt();
  pcp_string_builder_t a, b, model;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &a);
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &model);
  EXPECT_OK(pcp_workloads_rl_objective_module_emit(&spec, &a));
  EXPECT_OK(pcp_workloads_rl_objective_module_emit(&spec, &b));
  EXPECT_OK(pcp_models_module_emit(&spec, &model));
  const char* text = pcp_string_builder_cstring(&a);
  // Deterministic, and the model's functions are there unchanged.
  assert_string_equal(text, pcp_string_builder_cstring(&b));
  size_t model_length = strlen(pcp_string_builder_cstring(&model));
  assert_memory_equal(text, pcp_string_builder_cstring(&model),
                      model_length - 2);
  assert_non_null(strstr(text, "func.func @grpo(%p0: tensor<"));
  assert_non_null(strstr(text, "func.func @grpo_metrics("));
  assert_non_null(strstr(text,
                         "%advantages: tensor<2xf32>, %clip_low: "
                         "tensor<f32>, %clip_high: tensor<f32>, "
                         "%beta: tensor<f32>, %token_normalizer: "
                         "tensor<f32>, %temperature: tensor<f32>) -> "
                         "tensor<f32> {"));
  assert_non_null(strstr(text, "= func.call @logits(%p0, "));
  assert_int_equal(text[strlen(text) - 2], '}');

  // The autodiff derives the gradient of @grpo.
  pcp_compile_training_options_t options;
  pcp_workloads_rl_objective_training_options_initialize(&options);
  assert_string_equal(options.function_name, "grpo");
  assert_int_equal(options.data_argument_count, 11);
  char* derived = NULL;
  size_t length = 0;
  EXPECT_OK(pcp_compile_training_module_build(text, strlen(text), "grpo.mlir",
                                              &options, pcp_allocator_system(),
                                              &derived, &length));
  assert_non_null(strstr(derived, "func.func @compute_gradients("));
  assert_null(strstr(derived, "func.call"));  // inlined
  pcp_allocator_free(pcp_allocator_system(), derived);

  // A bad spec is the models module's error, nothing appended.
  pcp_string_builder_reset(&b);
  spec.width = 15;
  EXPECT_CODE(pcp_workloads_rl_objective_module_emit(&spec, &b),
              PCP_STATUS_INVALID_ARGUMENT, "width");
  assert_int_equal(strlen(pcp_string_builder_cstring(&b)), 0);
  // A capped builder: RESOURCE_EXHAUSTED, not a truncated module.
  pcp_string_builder_t small;
  pcp_string_builder_initialize(pcp_allocator_system(), model_length + 100,
                                &small);
  spec = tiny_gpt();
  EXPECT_CODE(pcp_workloads_rl_objective_module_emit(&spec, &small),
              PCP_STATUS_RESOURCE_EXHAUSTED, NULL);
  pcp_string_builder_deinitialize(&small);
  pcp_string_builder_deinitialize(&a);
  pcp_string_builder_deinitialize(&b);
  pcp_string_builder_deinitialize(&model);
}

// Every built-in architecture, f32 and bf16 parameters: the module parses
// and the autodiff derives its gradient (bf16 logits are converted to f32
// inside @logits, so the objective itself is always f32).
static void objective_every_architecture(void** state) {
  (void)state;
  static const pcp_models_architecture_t kArchs[3] = {
      PCP_MODELS_ARCHITECTURE_GPT, PCP_MODELS_ARCHITECTURE_NANOCHAT,
      PCP_MODELS_ARCHITECTURE_QWEN3};
  for (int a = 0; a < 3; ++a) {
    for (int bf16 = 0; bf16 < 2; ++bf16) {
      pcp_models_spec_t spec;
      pcp_models_spec_initialize(kArchs[a], &spec);
      spec.layers = 1;
      spec.width = 32;
      spec.vocab = 17;
      spec.block_size = 8;
      spec.batch = 2;
      spec.dtype = bf16 ? PCP_ELEMENT_TYPE_BF16 : PCP_ELEMENT_TYPE_F32;
      pcp_string_builder_t builder;
      pcp_string_builder_initialize(pcp_allocator_system(), 0, &builder);
      EXPECT_OK(pcp_workloads_rl_objective_module_emit(&spec, &builder));
      const char* text = pcp_string_builder_cstring(&builder);
      assert_non_null(strstr(text, bf16 ? "xbf16>" : "xf32>"));
      pcp_compile_training_options_t options;
      pcp_workloads_rl_objective_training_options_initialize(&options);
      char* derived = NULL;
      size_t length = 0;
      EXPECT_OK(pcp_compile_training_module_build(
          text, strlen(text), "grpo.mlir", &options, pcp_allocator_system(),
          &derived, &length));
      assert_non_null(strstr(derived, "func.func @compute_gradients("));
      pcp_allocator_free(pcp_allocator_system(), derived);
      pcp_string_builder_deinitialize(&builder);
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(advantages_known_values),
      cmocka_unit_test(advantages_all_equal_group),
      cmocka_unit_test(advantages_unscaled_and_in_place),
      cmocka_unit_test(advantages_refused),
      cmocka_unit_test(objective_module_text),
      cmocka_unit_test(objective_every_architecture),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
