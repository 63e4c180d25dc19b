// SPDX-License-Identifier: Apache-2.0
//
// pcp_compile_training_module_build under memory pressure (SQLite-style
// sweeps): every allocation, the emitters' scratch included, comes from the
// caller's allocator, so failing allocation n gives RESOURCE_EXHAUSTED (never
// a crash; under ASan nothing leaks), and the text is the same whatever the
// allocator.

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <string.h>

#include "compile/compile.h"

static const char kLoss[] =
    "func.func @main(%w: tensor<3xbf16>, %ids: tensor<4xi32>) -> "
    "tensor<f32> {\n"
    "  %z = stablehlo.constant dense<0.0> : tensor<f32>\n"
    "  %0 = stablehlo.convert %w : (tensor<3xbf16>) -> tensor<3xf32>\n"
    "  %1 = stablehlo.multiply %0, %0 : tensor<3xf32>\n"
    "  %2 = stablehlo.reduce(%1 init: %z) applies stablehlo.add across "
    "dimensions = [0] : (tensor<3xf32>, tensor<f32>) -> tensor<f32>\n"
    "  return %2 : tensor<f32>\n}\n";

static pcp_status_t build(const pcp_compile_training_options_t* options,
                          pcp_allocator_t allocator, char** out_text,
                          size_t* out_length) {
  return pcp_compile_training_module_build(
      kLoss, strlen(kLoss), "t.mlir", options, allocator, out_text, out_length);
}

// Fails allocation n (and every later one) for every n: exhaustive, a
// derivation makes a few hundred allocations.
static void sweep(const pcp_compile_training_options_t* options) {
  char* expected = NULL;
  size_t expected_length = 0;
  pcp_allocator_counting_t counting;
  pcp_allocator_counting_initialize(pcp_allocator_system(), &counting);
  PCP_CHECK_OK(build(options, pcp_allocator_counting(&counting), &expected,
                     &expected_length));
  int64_t total = counting.allocation_count;
  assert_true(total > 0);
  int64_t failures = 0;
  for (int64_t n = 0; n < total; ++n) {
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_system(), n, true, &failing);
    char* text = NULL;
    size_t length = 0;
    pcp_status_t status =
        build(options, pcp_allocator_failing(&failing), &text, &length);
    if (status) {
      pcp_status_code_t code = pcp_status_consume_code(status);
      if (code != PCP_STATUS_RESOURCE_EXHAUSTED) {
        fail_msg("allocation %lld of %lld failed with %s", (long long)n,
                 (long long)total, pcp_status_code_string(code));
      }
      assert_null(text);
      ++failures;
    } else {
      assert_int_equal(length, expected_length);
      assert_memory_equal(text, expected, length);
      pcp_allocator_free(pcp_allocator_system(), text);
    }
  }
  assert_true(failures > 0);
  pcp_allocator_free(pcp_allocator_counting(&counting), expected);
  assert_int_equal(counting.live_bytes, 0);
}

static void test_grad_program_oom(void** state) {
  (void)state;
  pcp_compile_training_options_t options;
  pcp_compile_training_options_initialize(&options);
  options.program = PCP_COMPILE_PROGRAM_GRAD;
  sweep(&options);
}

static void test_train_program_oom(void** state) {
  (void)state;
  pcp_compile_training_options_t options;
  pcp_compile_training_options_initialize(&options);
  options.program = PCP_COMPILE_PROGRAM_TRAIN;
  options.inner_steps = 3;
  options.accumulation_steps = 2;
  sweep(&options);
}

static void test_diloco_program_oom(void** state) {
  (void)state;
  pcp_compile_training_options_t options;
  pcp_compile_training_options_initialize(&options);
  options.program = PCP_COMPILE_PROGRAM_DILOCO;
  options.inner_steps = 2;
  options.inner_state = PCP_COMPILE_INNER_STATE_KEEP;
  options.accumulation_steps = 2;
  sweep(&options);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grad_program_oom),
      cmocka_unit_test(test_train_program_oom),
      cmocka_unit_test(test_diloco_program_oom),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
