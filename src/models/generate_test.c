// SPDX-License-Identifier: Apache-2.0
// Generation modules: argument rules, the KV-cache size, and for every
// architecture x dtype a deterministic text that parses and verifies (MLIR C
// API) with the documented @prefill / @decode signatures. Numerics against
// JAX and the driver live in tests/models/generate_jax_test.py.

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mlir/mlir.h"
#include "models/models.h"

static pcp_models_spec_t toy(pcp_models_architecture_t arch,
                             pcp_element_type_t dtype) {
  pcp_models_spec_t spec;
  pcp_models_spec_initialize(arch, &spec);
  spec.layers = 2;
  spec.heads = 4;
  spec.kv_heads = arch == PCP_MODELS_ARCHITECTURE_GPT ? 0 : 2;
  spec.width = 32;
  spec.vocab = 37;
  spec.block_size = 16;
  spec.dtype = dtype;
  return spec;
}

static void expect_invalid(const pcp_models_spec_t* spec,
                           const pcp_models_generation_t* gen,
                           const char* needle) {
  pcp_status_t status = pcp_models_generation_validate(spec, gen);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  if (!strstr(pcp_status_message(status), needle)) {
    fail_msg("'%s' does not mention '%s'", pcp_status_message(status), needle);
  }
  pcp_status_ignore(status);
}

static void rules_and_cache_size(void** state) {
  (void)state;
  pcp_models_spec_t q =
      toy(PCP_MODELS_ARCHITECTURE_QWEN3, PCP_ELEMENT_TYPE_F32);
  pcp_models_generation_t gen = {
      .slots = 3, .max_length = 40, .prefill_length = 8};
  assert_null(pcp_models_generation_validate(&q, &gen));
  // 2 (k, v) x 2 layers x 2 kv heads x 40 rows x 8 head_dim x 4 bytes.
  assert_int_equal(pcp_models_generation_cache_byte_length(&q, &gen),
                   2 * 2 * 2 * 40 * 8 * 4);
  q.dtype = PCP_ELEMENT_TYPE_BF16;
  assert_int_equal(pcp_models_generation_cache_byte_length(&q, &gen),
                   2 * 2 * 2 * 40 * 8 * 2);
  pcp_models_generation_t bad = gen;
  bad.slots = 0;
  expect_invalid(&q, &bad, "slots 0");
  bad = gen;
  bad.max_length = 0;
  expect_invalid(&q, &bad, "max length 0");
  bad = gen;
  bad.prefill_length = 41;
  expect_invalid(&q, &bad, "prefill length 41");
  pcp_models_spec_t g = toy(PCP_MODELS_ARCHITECTURE_GPT, PCP_ELEMENT_TYPE_F32);
  expect_invalid(&g, &gen, "position table");
  gen.max_length = 16;
  assert_null(pcp_models_generation_validate(&g, &gen));
  // A bad model spec is reported as such.
  q.width = 30;
  expect_invalid(&q, &gen, "width 30");
}

static char* emit(const pcp_models_spec_t* spec,
                  const pcp_models_generation_t* gen, size_t* out_length) {
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &builder);
  assert_null(pcp_models_generation_module_emit(spec, gen, &builder));
  *out_length = builder.size;
  char* text = strdup(pcp_string_builder_cstring(&builder));
  pcp_string_builder_deinitialize(&builder);
  return text;
}

static void every_module_parses_with_the_documented_signatures(void** state) {
  (void)state;
  const pcp_element_type_t dtypes[2] = {PCP_ELEMENT_TYPE_F32,
                                        PCP_ELEMENT_TYPE_BF16};
  for (int a = 0; a < PCP_MODELS_ARCHITECTURE_COUNT_; ++a) {
    for (int d = 0; d < 2; ++d) {
      pcp_models_spec_t spec = toy((pcp_models_architecture_t)a, dtypes[d]);
      pcp_models_generation_t gen = {
          .slots = 3, .max_length = 16, .prefill_length = 5};
      size_t length = 0, again_length = 0;
      char* text = emit(&spec, &gen, &length);
      char* again = emit(&spec, &gen, &again_length);
      assert_int_equal(length, again_length);
      assert_memory_equal(text, again, length);
      free(again);
      pcp_models_parameter_table_t table;
      assert_null(pcp_models_parameter_table_initialize(
          &spec, pcp_allocator_system(), &table));
      for (int f = 0; f < 2; ++f) {
        bool prefill = f == 0;
        pcp_mlir_function_signature_t sig;
        pcp_status_t status = pcp_mlir_text_function_signature(
            text, length, "generate.mlir", prefill ? "prefill" : "decode",
            pcp_allocator_system(), &sig);
        if (status) {
          char* message = pcp_status_to_string(status);
          fail_msg("%s %s: %.2000s",
                   pcp_models_architecture_name(spec.architecture),
                   pcp_element_type_name(spec.dtype), message);
        }
        assert_int_equal(sig.argument_count, table.count + (prefill ? 5 : 4));
        assert_int_equal(sig.result_count, 3);
        pcp_mlir_function_signature_deinitialize(&sig);
      }
      pcp_models_parameter_table_deinitialize(&table);
      free(text);
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(rules_and_cache_size),
      cmocka_unit_test(every_module_parses_with_the_documented_signatures),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
