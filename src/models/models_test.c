// SPDX-License-Identifier: Apache-2.0
// Specs, parameter tables and initial values of the built-in models; every
// emitted module parses and verifies (MLIR C API) and compiles for CPU (the
// real iree-compile, cached under $PCP_CACHE_DIR). Numerics against JAX live
// in tests/models/models_jax_test.py.

#include "models/models.h"

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
#include "mlir/mlir.h"
#include "models/models_impl.h"

static pcp_models_spec_t tiny(pcp_models_architecture_t arch,
                              pcp_element_type_t dtype) {
  pcp_models_spec_t spec;
  pcp_models_spec_initialize(arch, &spec);
  // The shapes models_jax_test runs (its BASE flags): the same text, so the
  // compiled module is shared through the test cache.
  spec.layers = 2;
  spec.heads = 4;
  spec.kv_heads = arch == PCP_MODELS_ARCHITECTURE_GPT ? 0 : 2;
  spec.width = 32;
  spec.vocab = 37;
  spec.block_size = 8;
  spec.batch = 2;
  spec.dtype = dtype;
  return spec;
}

static void expect_invalid(const pcp_models_spec_t* spec, const char* needle) {
  pcp_status_t status = pcp_models_spec_validate(spec);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  if (!strstr(pcp_status_message(status), needle)) {
    fail_msg("'%s' does not mention '%s'", pcp_status_message(status), needle);
  }
  pcp_status_ignore(status);
}

static void spec_rules(void** state) {
  (void)state;
  for (int a = 0; a < PCP_MODELS_ARCHITECTURE_COUNT_; ++a) {
    pcp_models_spec_t spec;
    pcp_models_spec_initialize((pcp_models_architecture_t)a, &spec);
    assert_null(pcp_models_spec_validate(&spec));
  }
  pcp_models_spec_t s =
      tiny(PCP_MODELS_ARCHITECTURE_QWEN3, PCP_ELEMENT_TYPE_F32);
  s.width = 30;
  expect_invalid(&s, "width 30 is not a multiple of heads 4");
  s = tiny(PCP_MODELS_ARCHITECTURE_QWEN3, PCP_ELEMENT_TYPE_F32);
  s.kv_heads = 3;
  expect_invalid(&s, "heads 4 is not a multiple of kv-heads 3");
  s.kv_heads = 8;
  expect_invalid(&s, "kv-heads 8");
  s = tiny(PCP_MODELS_ARCHITECTURE_GPT, PCP_ELEMENT_TYPE_F32);
  s.kv_heads = 2;
  expect_invalid(&s, "gpt has no grouped-query attention");
  s = tiny(PCP_MODELS_ARCHITECTURE_GPT, PCP_ELEMENT_TYPE_F32);
  s.head_dim = 16;
  expect_invalid(&s, "heads * head-dim == width");
  s = tiny(PCP_MODELS_ARCHITECTURE_NANOCHAT, PCP_ELEMENT_TYPE_F32);
  s.head_dim = 7;
  expect_invalid(&s, "even head size");
  s = tiny(PCP_MODELS_ARCHITECTURE_NANOCHAT, PCP_ELEMENT_TYPE_F32);
  s.tie_embeddings = true;
  expect_invalid(&s, "untied");
  s = tiny(PCP_MODELS_ARCHITECTURE_QWEN3, PCP_ELEMENT_TYPE_F16);
  expect_invalid(&s, "dtype f16");
  s = tiny(PCP_MODELS_ARCHITECTURE_QWEN3, PCP_ELEMENT_TYPE_F32);
  s.layers = 0;
  expect_invalid(&s, "layers 0 is out of range");
  s = tiny(PCP_MODELS_ARCHITECTURE_QWEN3, PCP_ELEMENT_TYPE_F32);
  s.rope_theta = 0.5;
  expect_invalid(&s, "rope-theta");
  s = tiny(PCP_MODELS_ARCHITECTURE_QWEN3, PCP_ELEMENT_TYPE_F32);
  s.batch = PCP_MODELS_MAX_BATCH;
  s.block_size = PCP_MODELS_MAX_BLOCK_SIZE;
  s.vocab = PCP_MODELS_MAX_VOCAB;
  expect_invalid(&s, "activation of");
  // head_dim other than width/heads is fine for the RoPE models.
  s = tiny(PCP_MODELS_ARCHITECTURE_QWEN3, PCP_ELEMENT_TYPE_F32);
  s.width = 30;
  s.head_dim = 16;
  assert_null(pcp_models_spec_validate(&s));

  pcp_models_architecture_t arch;
  assert_null(pcp_models_architecture_parse("nanochat", &arch));
  assert_int_equal(arch, PCP_MODELS_ARCHITECTURE_NANOCHAT);
  pcp_status_t status = pcp_models_architecture_parse("llama", &arch);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_INVALID_ARGUMENT);
}

// The shapes of upstream's nanochat_small artifact (upstream-workloads.md
// s.7): 14 tensors, 106,624 parameters.
static void nanochat_small_matches_upstream(void** state) {
  (void)state;
  pcp_models_spec_t spec;
  pcp_models_spec_initialize(PCP_MODELS_ARCHITECTURE_NANOCHAT, &spec);
  spec.width = 64;
  spec.block_size = 32;
  spec.batch = 64;
  pcp_models_parameter_table_t table;
  assert_null(pcp_models_parameter_table_initialize(
      &spec, pcp_allocator_system(), &table));
  assert_int_equal(table.count, 14);
  assert_int_equal(table.total_elements, 106624);
  assert_string_equal(table.parameters[0].name, "transformer.wte.weight");
  assert_string_equal(table.parameters[1].name,
                      "transformer.h.0.attn.c_q.weight");
  assert_string_equal(table.parameters[5].name,
                      "transformer.h.0.mlp.c_fc.weight");
  assert_int_equal(table.parameters[5].dims[0], 256);
  assert_int_equal(table.parameters[5].dims[1], 64);
  assert_string_equal(table.parameters[13].name, "lm_head.weight");
  pcp_models_parameter_table_deinitialize(&table);
}

// Qwen3-8B (upstream-workloads.md s.7): 399 tensors, shapes as listed.
static void qwen3_8b_table(void** state) {
  (void)state;
  pcp_models_spec_t spec;
  pcp_models_spec_initialize(PCP_MODELS_ARCHITECTURE_QWEN3, &spec);
  spec.layers = 36;
  spec.heads = 32;
  spec.kv_heads = 8;
  spec.width = 4096;
  spec.mlp_hidden = 12288;
  spec.vocab = 151936;
  spec.block_size = 1024;
  spec.batch = 1;
  spec.dtype = PCP_ELEMENT_TYPE_BF16;
  pcp_models_parameter_table_t table;
  assert_null(pcp_models_parameter_table_initialize(
      &spec, pcp_allocator_system(), &table));
  assert_int_equal(table.count, 399);
  assert_int_equal(table.total_elements, 8190735360LL);
  assert_int_equal(table.total_byte_length, 2 * 8190735360ULL);
  int64_t k = pcp_models_parameter_table_find(
      &table, "model.layers.35.self_attn.k_proj.weight");
  assert_true(k > 0);
  assert_int_equal(table.parameters[k].dims[0], 1024);
  assert_int_equal(table.parameters[k].dims[1], 4096);
  int64_t qn = pcp_models_parameter_table_find(
      &table, "model.layers.0.self_attn.q_norm.weight");
  assert_int_equal(qn, 5);
  assert_int_equal(table.parameters[qn].rank, 1);
  assert_int_equal(table.parameters[qn].dims[0], 128);
  assert_int_equal(table.parameters[qn].init, PCP_MODELS_INIT_ONES);
  assert_string_equal(table.parameters[398].name, "lm_head.weight");
  assert_int_equal(pcp_models_parameter_table_find(&table, "nope"), -1);
  pcp_models_parameter_table_deinitialize(&table);
  // Tied: no lm_head.
  spec.tie_embeddings = true;
  assert_null(pcp_models_parameter_table_initialize(
      &spec, pcp_allocator_system(), &table));
  assert_int_equal(table.count, 398);
  assert_int_equal(pcp_models_parameter_table_find(&table, "lm_head.weight"),
                   -1);
  pcp_models_parameter_table_deinitialize(&table);
}

static void gpt_table(void** state) {
  (void)state;
  pcp_models_spec_t spec =
      tiny(PCP_MODELS_ARCHITECTURE_GPT, PCP_ELEMENT_TYPE_F32);
  spec.layers = 3;
  pcp_models_parameter_table_t table;
  assert_null(pcp_models_parameter_table_initialize(
      &spec, pcp_allocator_system(), &table));
  assert_int_equal(table.count, 2 + 12 * 3 + 2);
  const int64_t d = 32, v = 37, t = 8, f = 128;
  int64_t per_layer =
      4 * d + 3 * d * d + 3 * d + d * d + d + f * d + f + d * f + d;
  assert_int_equal(table.total_elements, v * d + t * d + 3 * per_layer + 2 * d);
  assert_string_equal(table.parameters[1].name, "transformer.wpe.weight");
  assert_string_equal(table.parameters[4].name,
                      "transformer.h.0.attn.c_attn.weight");
  assert_int_equal(table.parameters[4].dims[0], 3 * d);
  assert_int_equal(table.parameters[5].init, PCP_MODELS_INIT_ZEROS);
  assert_string_equal(table.parameters[table.count - 1].name,
                      "transformer.ln_f.bias");
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  assert_null(pcp_models_parameter_table_format_json(&spec, &table, &b));
  const char* json = pcp_string_builder_cstring(&b);
  assert_non_null(strstr(json,
                         "\"name\": \"transformer.h.2.mlp.c_proj.bias\", "
                         "\"shape\": [32], \"dtype\": \"f32\""));
  assert_non_null(strstr(json,
                         "\"name\": \"input_ids\", \"shape\": [2, 8], "
                         "\"dtype\": \"i32\""));
  pcp_string_builder_deinitialize(&b);
  pcp_models_parameter_table_deinitialize(&table);
}

static void init_is_deterministic(void** state) {
  (void)state;
  pcp_models_spec_t spec =
      tiny(PCP_MODELS_ARCHITECTURE_QWEN3, PCP_ELEMENT_TYPE_F32);
  pcp_models_parameter_table_t table;
  assert_null(pcp_models_parameter_table_initialize(
      &spec, pcp_allocator_system(), &table));
  void* a[64];
  void* b[64];
  void* c[64];
  assert_true(table.count <= 64);
  for (size_t i = 0; i < table.count; ++i) {
    a[i] = malloc(table.parameters[i].byte_length);
    b[i] = malloc(table.parameters[i].byte_length);
    c[i] = malloc(table.parameters[i].byte_length);
  }
  pcp_models_parameters_initialize(&table, 7, a);
  pcp_models_parameters_initialize(&table, 7, b);
  pcp_models_parameters_initialize(&table, 8, c);
  double sum = 0, sum_sq = 0;
  int64_t normals = 0;
  for (size_t i = 0; i < table.count; ++i) {
    const pcp_models_parameter_t* p = &table.parameters[i];
    assert_memory_equal(a[i], b[i], p->byte_length);
    const float* x = a[i];
    if (p->init == PCP_MODELS_INIT_NORMAL) {
      assert_memory_not_equal(a[i], c[i], p->byte_length);
      for (int64_t j = 0; j < p->element_count; ++j) {
        sum += x[j];
        sum_sq += (double)x[j] * x[j];
      }
      normals += p->element_count;
    } else {
      for (int64_t j = 0; j < p->element_count; ++j) {
        assert_true(x[j] == (p->init == PCP_MODELS_INIT_ONES ? 1.0f : 0.0f));
      }
    }
  }
  double mean = sum / (double)normals;
  double stddev = sqrt(sum_sq / (double)normals - mean * mean);
  assert_true(fabs(mean) < 0.002);
  assert_true(fabs(stddev - PCP_MODELS_INIT_STDDEV) < 0.002);
  // bf16 tables hold the same draws rounded to nearest even.
  pcp_models_spec_t bspec = spec;
  bspec.dtype = PCP_ELEMENT_TYPE_BF16;
  pcp_models_parameter_table_t btable;
  assert_null(pcp_models_parameter_table_initialize(
      &bspec, pcp_allocator_system(), &btable));
  pcp_models_parameters_initialize(&btable, 7, c);
  for (size_t i = 0; i < table.count; ++i) {
    const float* x = a[i];
    const uint16_t* y = c[i];
    for (int64_t j = 0; j < table.parameters[i].element_count; ++j) {
      assert_int_equal(y[j], pcp_models_f32_to_bf16(x[j]));
    }
  }
  assert_int_equal(pcp_models_f32_to_bf16(1.0f), 0x3F80);
  assert_int_equal(pcp_models_f32_to_bf16(1.00390625f), 0x3F80);  // tie: even
  assert_int_equal(pcp_models_f32_to_bf16(1.01171875f), 0x3F82);  // tie: up
  for (size_t i = 0; i < table.count; ++i) {
    free(a[i]);
    free(b[i]);
    free(c[i]);
  }
  pcp_models_parameter_table_deinitialize(&btable);
  pcp_models_parameter_table_deinitialize(&table);
}

// A worker materializes a seeded @init input with pcp_models_parameter_fill
// from (init, seed, index, dtype, count) alone: it must give the bytes the
// gateway's table-wide initializer gives its masters, in f32 and bf16.
static void parameter_fill_matches_table(void** state) {
  (void)state;
  for (int bf16 = 0; bf16 < 2; ++bf16) {
    pcp_models_spec_t spec =
        tiny(PCP_MODELS_ARCHITECTURE_QWEN3,
             bf16 ? PCP_ELEMENT_TYPE_BF16 : PCP_ELEMENT_TYPE_F32);
    pcp_models_parameter_table_t table;
    assert_null(pcp_models_parameter_table_initialize(
        &spec, pcp_allocator_system(), &table));
    void* all[64];
    assert_true(table.count <= 64);
    for (size_t i = 0; i < table.count; ++i) {
      all[i] = malloc(table.parameters[i].byte_length);
    }
    pcp_models_parameters_initialize(&table, 0x1234abcdull, all);
    bool kinds[3] = {false, false, false};
    for (size_t i = 0; i < table.count; ++i) {
      const pcp_models_parameter_t* p = &table.parameters[i];
      void* one = malloc(p->byte_length);
      memset(one, 0xA5, p->byte_length);
      pcp_models_parameter_fill(p->init, 0x1234abcdull, i, p->element_type,
                                p->element_count, one);
      assert_memory_equal(one, all[i], p->byte_length);
      kinds[p->init] = true;
      if (p->init == PCP_MODELS_INIT_NORMAL) {
        // Another index or seed draws other values.
        pcp_models_parameter_fill(p->init, 0x1234abcdull, i + 1,
                                  p->element_type, p->element_count, one);
        assert_memory_not_equal(one, all[i], p->byte_length);
        pcp_models_parameter_fill(p->init, 0x1234abcdeull, i, p->element_type,
                                  p->element_count, one);
        assert_memory_not_equal(one, all[i], p->byte_length);
      }
      free(one);
    }
    assert_true(kinds[PCP_MODELS_INIT_NORMAL] && kinds[PCP_MODELS_INIT_ONES]);
    for (size_t i = 0; i < table.count; ++i) {
      free(all[i]);
    }
    pcp_models_parameter_table_deinitialize(&table);
  }
}

static char* emit(const pcp_models_spec_t* spec, size_t* out_length) {
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  PCP_CHECK_OK(pcp_models_module_emit(spec, &b));
  *out_length = b.size;
  char* text = NULL;
  PCP_CHECK_OK(pcp_string_builder_take(&b, &text));
  pcp_string_builder_deinitialize(&b);
  return text;
}

static void emit_is_deterministic_and_refuses_bad_specs(void** state) {
  (void)state;
  pcp_models_spec_t spec =
      tiny(PCP_MODELS_ARCHITECTURE_QWEN3, PCP_ELEMENT_TYPE_BF16);
  size_t n1, n2;
  char* a = emit(&spec, &n1);
  char* b = emit(&spec, &n2);
  assert_int_equal(n1, n2);
  assert_memory_equal(a, b, n1);
  assert_non_null(strstr(a,
                         "func.func @main(%model.embed_tokens.weight: "
                         "tensor<37x32xbf16>"));
  free(a);
  free(b);
  // Golden digest of the default Qwen3 bf16 module, the same under gcc and
  // clang (checked when it was recorded): a build whose text differs would
  // miss every cached artifact. Update it when the emitter changes on
  // purpose (last: bf16 dots accumulated in f32, docs/backends.md).
  pcp_models_spec_t golden;
  pcp_models_spec_initialize(PCP_MODELS_ARCHITECTURE_QWEN3, &golden);
  golden.dtype = PCP_ELEMENT_TYPE_BF16;
  char* text = emit(&golden, &n1);
  pcp_sha256_t digest;
  pcp_sha256_compute(text, n1, &digest);
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&digest, hex);
  assert_string_equal(
      hex, "e973f186ee4872b2464a75113ee09d737fd1deb9fa322eff98c2d53d8a5bbf49");
  free(text);
  spec.width = 33;
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &builder);
  pcp_status_t status = pcp_models_module_emit(&spec, &builder);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_INVALID_ARGUMENT);
  // A capped builder reports RESOURCE_EXHAUSTED instead of truncating.
  pcp_string_builder_deinitialize(&builder);
  spec.width = 32;
  pcp_string_builder_initialize(pcp_allocator_system(), 1000, &builder);
  status = pcp_models_module_emit(&spec, &builder);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_RESOURCE_EXHAUSTED);
  pcp_string_builder_deinitialize(&builder);
}

// Parses (which verifies) and checks both signatures against the table.
static void check_module(pcp_mlir_context_t* context,
                         const pcp_models_spec_t* spec, bool compile) {
  size_t length;
  char* text = emit(spec, &length);
  pcp_mlir_module_t* module = NULL;
  pcp_status_t status =
      pcp_mlir_module_parse(context, text, length, "model.mlir", &module);
  if (status) {
    char* message = pcp_status_to_string(status);
    fail_msg("%s %s does not parse: %.2000s",
             pcp_models_architecture_name(spec->architecture),
             pcp_element_type_name(spec->dtype), message);
  }
  assert_null(pcp_mlir_module_verify(module));
  pcp_models_parameter_table_t table;
  assert_null(pcp_models_parameter_table_initialize(
      spec, pcp_allocator_system(), &table));
  for (int f = 0; f < 2; ++f) {
    pcp_mlir_function_signature_t sig;
    assert_null(pcp_mlir_module_function_signature(
        module, f == 0 ? "main" : "logits", pcp_allocator_system(), &sig));
    assert_int_equal(sig.argument_count, table.count + (f == 0 ? 2 : 1));
    for (size_t i = 0; i < table.count; ++i) {
      const pcp_models_parameter_t* p = &table.parameters[i];
      assert_null(pcp_mlir_type_check_tensor(&sig.arguments[i], p->element_type,
                                             p->rank, p->dims, p->name));
    }
    int64_t bt[2] = {spec->batch, spec->block_size};
    assert_null(pcp_mlir_type_check_tensor(
        &sig.arguments[table.count], PCP_ELEMENT_TYPE_I32, 2, bt, "input_ids"));
    assert_int_equal(sig.result_count, 1);
    if (f == 0) {
      assert_null(pcp_mlir_type_check_tensor(
          &sig.results[0], PCP_ELEMENT_TYPE_F32, 0, NULL, "loss"));
    } else {
      int64_t btv[3] = {spec->batch, spec->block_size, spec->vocab};
      assert_null(pcp_mlir_type_check_tensor(
          &sig.results[0], PCP_ELEMENT_TYPE_F32, 3, btv, "logits"));
    }
    pcp_mlir_function_signature_deinitialize(&sig);
  }
  pcp_models_parameter_table_deinitialize(&table);
  pcp_mlir_module_release(module);
  if (compile) {
    pcp_compile_request_t request = {
        .mlir_text = text,
        .mlir_byte_length = length,
        .source_name = "model.mlir",
        .backend = PCP_COMPILE_BACKEND_CPU,
    };
    pcp_compile_result_t result;
    status = pcp_compile_module(&request, &result);
    if (status) {
      char* message = pcp_status_to_string(status);
      fail_msg("compile failed: %.2000s", message);
    }
    assert_true(result.vmfb_byte_length > 0);
    pcp_compile_result_deinitialize(&result);
  }
  free(text);
}

static void every_module_parses_verifies_and_compiles(void** state) {
  (void)state;
  pcp_mlir_context_t* context = NULL;
  assert_null(pcp_mlir_context_create(NULL, pcp_allocator_system(), &context));
  const pcp_element_type_t dtypes[2] = {PCP_ELEMENT_TYPE_F32,
                                        PCP_ELEMENT_TYPE_BF16};
  for (int a = 0; a < PCP_MODELS_ARCHITECTURE_COUNT_; ++a) {
    for (int d = 0; d < 2; ++d) {
      pcp_models_architecture_t arch = (pcp_models_architecture_t)a;
      // Size 1: tiny, compiled for CPU.
      pcp_models_spec_t spec = tiny(arch, dtypes[d]);
      check_module(context, &spec, true);
      // Size 2: one layer, MHA, other dims; parsed and verified only
      // (compiling is the slow part and the op set is the same).
      spec.layers = 1;
      spec.heads = 2;
      spec.kv_heads = 0;
      spec.width = 48;
      spec.mlp_hidden = 80;
      spec.vocab = 67;
      spec.block_size = 12;
      spec.batch = 3;
      if (arch == PCP_MODELS_ARCHITECTURE_QWEN3) {
        spec.tie_embeddings = true;
      }
      check_module(context, &spec, false);
    }
  }
  pcp_mlir_context_release(context);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(spec_rules),
      cmocka_unit_test(nanochat_small_matches_upstream),
      cmocka_unit_test(qwen3_8b_table),
      cmocka_unit_test(gpt_table),
      cmocka_unit_test(init_is_deterministic),
      cmocka_unit_test(parameter_fill_matches_table),
      cmocka_unit_test(emit_is_deterministic_and_refuses_bad_specs),
      cmocka_unit_test(every_module_parses_verifies_and_compiles),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
