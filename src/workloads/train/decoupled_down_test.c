// SPDX-License-Identifier: Apache-2.0
// Decoupled DiLoCo's int4 down path on real IREE (CPU): the @mix_int4 that
// pcp_decoupled_fragment_module_emit writes, compiled by the real compiler
// and run, must set g = s + decode(q) bit for bit as the gateway computes
// it in C (pcp_decoupled_int4_decode, then one f32 add), on tensors whose
// sizes hit every packing edge (1 value, odd counts, partial last blocks,
// rank 2) and blocks of ordinary, zero, subnormal and huge values. The
// training service relies on this equality for its parameter hashes
// (docs/training.md "int4 on the down path"); this test pins it without a
// cluster. Also @mix's blend and its argument order (g first).

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "compile/compile.h"
#include "compute/compute.h"
#include "workloads/train/service_impl.h"

#define TENSORS 4
#define BLOCK 64u

static void fail_status(pcp_status_t status, const char* what) {
  if (!status)
    return;
  char text[4096];
  pcp_status_format(status, text, sizeof(text));
  pcp_status_ignore(status);
  fail_msg("%s: %s", what, text);
}

// Deterministic values in [-1, 1) (xorshift; no libc rand state).
static float next_unit(uint64_t* state) {
  uint64_t x = *state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *state = x;
  return (float)((double)(x >> 11) / (double)(1ull << 53)) * 2.0f - 1.0f;
}

static void mix_int4_matches_the_gateway(void** state) {
  (void)state;
  // n = 1 (one code, one byte, a block of 1), 63 (one partial block,
  // odd), 130 (two whole blocks and a partial one of 2), 3x64 (rank 2,
  // whole blocks).
  static const int64_t dims[TENSORS][2] = {{1, 0}, {7, 9}, {130, 0}, {3, 64}};
  static const int32_t ranks[TENSORS] = {1, 2, 1, 2};
  pcp_models_parameter_t parameters[TENSORS];
  memset(parameters, 0, sizeof(parameters));
  pcp_decoupled_tensor_spec_t specs[TENSORS];
  int64_t total = 0;
  for (int t = 0; t < TENSORS; ++t) {
    pcp_models_parameter_t* p = &parameters[t];
    snprintf(p->name, sizeof(p->name), "t%d", t);
    p->rank = ranks[t];
    p->element_count = 1;
    for (int r = 0; r < ranks[t]; ++r) {
      p->dims[r] = dims[t][r];
      p->element_count *= dims[t][r];
    }
    p->element_type = PCP_ELEMENT_TYPE_F32;
    p->byte_length = (size_t)p->element_count * sizeof(float);
    specs[t] =
        (pcp_decoupled_tensor_spec_t){.name = p->name,
                                      .value_count = (uint64_t)p->element_count,
                                      .role = PCP_DECOUPLED_ROLE_UNKNOWN};
    total += p->element_count;
  }
  pcp_models_parameter_table_t table = {
      .count = TENSORS, .parameters = parameters, .total_elements = total};
  pcp_decoupled_plan_t plan;
  fail_status(pcp_decoupled_plan_initialize(
                  pcp_allocator_system(), PCP_DECOUPLED_FRAGMENTS_STRIDED,
                  specs, TENSORS, NULL, 0, 1, 1, &plan),
              "plan");
  assert_int_equal(plan.fragments[0].tensor_count, TENSORS);
  pcp_string_builder_t text;
  pcp_string_builder_initialize(pcp_allocator_system(), (size_t)16 << 20,
                                &text);
  fail_status(pcp_decoupled_fragment_module_emit(&table, &plan, 0, false, true,
                                                 BLOCK, &text),
              "emit");
  assert_non_null(strstr(text.data, "func.func @mix_int4("));
  pcp_compile_request_t request = {.mlir_text = text.data,
                                   .mlir_byte_length = text.size,
                                   .source_name = "decoupled-fragment.mlir",
                                   .backend = PCP_COMPILE_BACKEND_CPU};
  pcp_compile_result_t compiled;
  fail_status(pcp_compile_module(&request, &compiled), "compile");
  pcp_string_builder_deinitialize(&text);
  pcp_backend_options_t options = {.driver = "cpu"};
  pcp_backend_t* backend = NULL;
  fail_status(pcp_backend_create(&options, &backend), "backend");
  pcp_program_t* program = NULL;
  fail_status(pcp_program_load(backend, compiled.vmfb,
                               compiled.vmfb_byte_length, &program),
              "load");
  pcp_compile_result_deinitialize(&compiled);

  // Per tensor: s (the broadcast copy held), the residual encoded as q,
  // l (local values); the C result s + decode(q).
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  float* s[TENSORS];
  float* l[TENSORS];
  float* want[TENSORS];
  uint8_t* q[TENSORS];
  size_t q_bytes[TENSORS];
  pcp_host_tensor_t hosts[3 * TENSORS + 1];
  pcp_value_t inputs[3 * TENSORS + 1];
  float alpha = 0.25f;
  for (int t = 0; t < TENSORS; ++t) {
    size_t n = (size_t)parameters[t].element_count;
    s[t] = malloc(n * sizeof(float));
    l[t] = malloc(n * sizeof(float));
    want[t] = malloc(n * sizeof(float));
    float* residual = malloc(n * sizeof(float));
    q_bytes[t] = pcp_decoupled_int4_encoded_size(n, BLOCK);
    q[t] = malloc(q_bytes[t]);
    assert_non_null(s[t]);
    assert_non_null(l[t]);
    assert_non_null(want[t]);
    assert_non_null(residual);
    assert_non_null(q[t]);
    for (size_t e = 0; e < n; ++e) {
      s[t][e] = 0.1f * next_unit(&seed);
      l[t][e] = 0.1f * next_unit(&seed);
      // Block kinds by block index: ordinary, zero, subnormal, huge.
      size_t kind = (e / BLOCK + (size_t)t) % 4;
      float u = next_unit(&seed);
      residual[e] = kind == 0   ? 1e-3f * u
                    : kind == 1 ? 0.0f
                    : kind == 2 ? 1e-39f * u
                                : 1e30f * u;
    }
    fail_status(pcp_decoupled_int4_encode(residual, n, BLOCK, q[t], q_bytes[t]),
                "encode");
    fail_status(pcp_decoupled_int4_decode(q[t], q_bytes[t], n, BLOCK, residual),
                "decode");
    for (size_t e = 0; e < n; ++e) {
      want[t][e] = s[t][e] + residual[e];
    }
    free(residual);
    pcp_tensor_shape_t shape = {.element_type = PCP_ELEMENT_TYPE_F32,
                                .rank = ranks[t]};
    for (int r = 0; r < ranks[t]; ++r) {
      shape.dims[r] = dims[t][r];
    }
    fail_status(
        pcp_host_tensor_wrap(&shape, s[t], n * sizeof(float), &hosts[t]),
        "wrap s");
    pcp_tensor_shape_t q_shape = {.element_type = PCP_ELEMENT_TYPE_U8,
                                  .rank = 1,
                                  .dims = {(int64_t)q_bytes[t]}};
    fail_status(
        pcp_host_tensor_wrap(&q_shape, q[t], q_bytes[t], &hosts[TENSORS + t]),
        "wrap q");
    fail_status(pcp_host_tensor_wrap(&shape, l[t], n * sizeof(float),
                                     &hosts[2 * TENSORS + 1 + t]),
                "wrap l");
  }
  pcp_tensor_shape_t scalar = {.element_type = PCP_ELEMENT_TYPE_F32};
  fail_status(
      pcp_host_tensor_wrap(&scalar, &alpha, sizeof(alpha), &hosts[2 * TENSORS]),
      "wrap alpha");
  for (int i = 0; i < 3 * TENSORS + 1; ++i) {
    inputs[i] = pcp_value_host(&hosts[i]);
  }
  pcp_tensor_t* results[2 * TENSORS];
  size_t count = 0;
  fail_status(pcp_program_invoke(program, "mix_int4", inputs, 3 * TENSORS + 1,
                                 results, 2 * TENSORS, &count),
              "mix_int4");
  assert_int_equal(count, 2 * TENSORS);
  size_t differing = 0;
  for (int t = 0; t < TENSORS; ++t) {
    size_t n = (size_t)parameters[t].element_count;
    float* g = malloc(n * sizeof(float));
    float* b = malloc(n * sizeof(float));
    assert_non_null(g);
    assert_non_null(b);
    fail_status(pcp_tensor_download(results[TENSORS + t], g, n * sizeof(float)),
                "download g");
    fail_status(pcp_tensor_download(results[t], b, n * sizeof(float)),
                "download b");
    for (size_t e = 0; e < n; ++e) {
      if (memcmp(&g[e], &want[t][e], sizeof(float)) != 0) {
        if (differing++ < 8) {
          print_error("tensor %d element %zu: worker %a, gateway %a\n", t, e,
                      (double)g[e], (double)want[t][e]);
        }
      }
      // The blend itself may be contracted (FMA) on the worker: compared
      // within float rounding, it is the learner's own state.
      double blend = 0.25 * (double)l[t][e] + 0.75 * (double)g[e];
      assert_true(fabs((double)b[e] - blend) <= 1e-6 * fabs(blend) + 1e-30);
    }
    free(g);
    free(b);
  }
  assert_int_equal(differing, 0);
  for (size_t i = 0; i < count; ++i) {
    pcp_tensor_release(results[i]);
  }
  for (int i = 0; i < 3 * TENSORS + 1; ++i) {
    pcp_host_tensor_deinitialize(&hosts[i]);
  }
  for (int t = 0; t < TENSORS; ++t) {
    free(s[t]);
    free(l[t]);
    free(want[t]);
    free(q[t]);
  }
  pcp_program_release(program);
  pcp_backend_release(backend);
  pcp_decoupled_plan_deinitialize(&plan);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(mix_int4_matches_the_gateway),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
