// SPDX-License-Identifier: Apache-2.0
// The compile driver against the real iree-compile from the .venv.

#include "compile/compile.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

static const char kAddModule[] =
    "func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {\n"
    "  %0 = stablehlo.add %a, %b : tensor<4xf32>\n"
    "  return %0 : tensor<4xf32>\n"
    "}\n";

static char g_dir[64];

static int setup(void** state) {
  (void)state;
  snprintf(g_dir, sizeof(g_dir), "/tmp/pcp-compile-test-XXXXXX");
  if (!mkdtemp(g_dir))
    return -1;
  unsetenv("PCP_IREE_COMPILE");
  return 0;
}

static int teardown(void** state) {
  (void)state;
  char command[256];
  snprintf(command, sizeof(command), "rm -rf %s", g_dir);
  return system(command) == 0 ? 0 : -1;
}

static pcp_compile_request_t request_for(const char* text, const char* cache) {
  pcp_compile_request_t r = {
      .mlir_text = text,
      .mlir_byte_length = strlen(text),
      .source_name = "add.mlir",
      .backend = PCP_COMPILE_BACKEND_CPU,
      .cache_dir = cache,
  };
  return r;
}

static bool has_flag(const pcp_compile_flags_t* f, const char* flag) {
  for (int i = 0; i < f->count; ++i) {
    if (strcmp(f->flags[i], flag) == 0)
      return true;
  }
  return false;
}

static void flag_table_rows(void** state) {
  (void)state;
  pcp_compile_flags_t f;
  assert_null(pcp_compile_flags_resolve(PCP_COMPILE_BACKEND_CPU, NULL, &f));
  assert_true(has_flag(&f, "--iree-hal-target-device=local"));
  assert_true(has_flag(&f, "--iree-llvmcpu-target-cpu=host"));
  assert_null(pcp_compile_flags_resolve(PCP_COMPILE_BACKEND_CUDA, "sm_86", &f));
  assert_true(has_flag(&f, "--iree-cuda-target=sm_86"));
  assert_string_equal(f.note, "");
  // The sm_90a caveat: IREE has no Hopper target, so sm_80 PTX is used.
  assert_null(
      pcp_compile_flags_resolve(PCP_COMPILE_BACKEND_CUDA, "sm_90a", &f));
  assert_true(has_flag(&f, "--iree-cuda-target=sm_80"));
  assert_string_equal(f.requested_target, "sm_90a");
  assert_non_null(strstr(f.note, "sm_80 PTX"));
  // The renamed ROCm flag.
  assert_null(
      pcp_compile_flags_resolve(PCP_COMPILE_BACKEND_ROCM, "gfx1101", &f));
  assert_true(has_flag(&f, "--iree-rocm-target=gfx1101"));
  assert_true(has_flag(&f, "--iree-hal-target-device=hip"));
  assert_null(pcp_compile_flags_resolve(PCP_COMPILE_BACKEND_METAL, NULL, &f));
  assert_true(has_flag(&f, "--iree-metal-compile-to-metallib=false"));
  // The SPIR-V backends keep O2 without its aggressive fusion
  // (docs/backends.md); the others keep all of O2.
  assert_true(
      has_flag(&f, "--iree-dispatch-creation-enable-aggressive-fusion=false"));
  assert_null(pcp_compile_flags_resolve(PCP_COMPILE_BACKEND_VULKAN, NULL, &f));
  assert_true(has_flag(&f, "--iree-opt-level=O2"));
  assert_true(has_flag(&f, "--iree-input-demote-i64-to-i32=true"));
  assert_true(
      has_flag(&f, "--iree-dispatch-creation-enable-aggressive-fusion=false"));
  // A named vulkan target with 64-bit integers keeps i64.
  assert_null(
      pcp_compile_flags_resolve(PCP_COMPILE_BACKEND_VULKAN, "rdna3", &f));
  assert_false(has_flag(&f, "--iree-input-demote-i64-to-i32=true"));
  assert_null(pcp_compile_flags_resolve(PCP_COMPILE_BACKEND_CUDA, NULL, &f));
  assert_false(
      has_flag(&f, "--iree-dispatch-creation-enable-aggressive-fusion=false"));
}

static void unknown_backend_and_target_are_clear_errors(void** state) {
  (void)state;
  pcp_compile_backend_t b;
  pcp_status_t s = pcp_compile_backend_parse("tpu", &b);
  assert_int_equal(pcp_status_code(s), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(s), "unknown backend 'tpu'"));
  pcp_status_ignore(s);
  pcp_compile_flags_t f;
  s = pcp_compile_flags_resolve(PCP_COMPILE_BACKEND_CUDA, "sm_99", &f);
  assert_int_equal(pcp_status_code(s), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(s), "unknown cuda target 'sm_99'"));
  assert_non_null(strstr(pcp_status_message(s), "sm_80"));
  pcp_status_ignore(s);
  s = pcp_compile_flags_resolve(PCP_COMPILE_BACKEND_ROCM, "gfx9999", &f);
  assert_int_equal(pcp_status_consume_code(s), PCP_STATUS_INVALID_ARGUMENT);
  s = pcp_compile_flags_resolve(PCP_COMPILE_BACKEND_CPU, "host --evil", &f);
  assert_int_equal(pcp_status_consume_code(s), PCP_STATUS_INVALID_ARGUMENT);
}

static void compiles_cpu_and_serves_repeat_from_cache(void** state) {
  (void)state;
  // A wrapper compiler that records every run proves a hit runs nothing.
  char real[4096];
  assert_null(pcp_compile_compiler_path(real, sizeof(real)));
  char wrapper[128], log_path[128], cache[128];
  snprintf(wrapper, sizeof(wrapper), "%s/wrapper.sh", g_dir);
  snprintf(log_path, sizeof(log_path), "%s/runs.log", g_dir);
  snprintf(cache, sizeof(cache), "%s/cache", g_dir);
  FILE* f = fopen(wrapper, "w");
  fprintf(f, "#!/bin/sh\necho run >> %s\nexec %s \"$@\"\n", log_path, real);
  fclose(f);
  chmod(wrapper, 0755);
  setenv("PCP_IREE_COMPILE", wrapper, 1);

  pcp_compile_request_t request = request_for(kAddModule, cache);
  pcp_compile_result_t first, second;
  assert_null(pcp_compile_module(&request, &first));
  assert_false(first.cache_hit);
  assert_true(first.vmfb_byte_length > 100);
  assert_memory_equal(first.vmfb, "PK\3\4", 4);  // polyglot zip VMFB
  assert_int_equal((uintptr_t)first.vmfb % 64, 0);
  assert_null(pcp_compile_module(&request, &second));
  assert_true(second.cache_hit);
  assert_string_equal(first.cache_key, second.cache_key);
  assert_int_equal(first.vmfb_byte_length, second.vmfb_byte_length);
  assert_memory_equal(first.vmfb, second.vmfb, first.vmfb_byte_length);
  // --version probe + one compile; the hit ran nothing.
  char runs[256] = {0};
  FILE* log = fopen(log_path, "r");
  size_t n = fread(runs, 1, sizeof(runs) - 1, log);
  fclose(log);
  runs[n] = 0;
  assert_string_equal(runs, "run\nrun\n");

  // A different target is a different key.
  pcp_compile_result_t other;
  request.target = "x86-64-v2";
  assert_null(pcp_compile_module(&request, &other));
  assert_false(other.cache_hit);
  assert_string_not_equal(other.cache_key, first.cache_key);

  // A corrupted artifact is recompiled, never served.
  char artifact[256];
  snprintf(artifact, sizeof(artifact), "%s/%s.vmfb", cache, first.cache_key);
  FILE* corrupt = fopen(artifact, "r+b");
  fputc('X', corrupt);
  fclose(corrupt);
  pcp_compile_result_t third;
  request.target = NULL;
  assert_null(pcp_compile_module(&request, &third));
  assert_false(third.cache_hit);
  assert_memory_equal(third.vmfb, first.vmfb, first.vmfb_byte_length);

  pcp_compile_result_deinitialize(&first);
  pcp_compile_result_deinitialize(&second);
  pcp_compile_result_deinitialize(&other);
  pcp_compile_result_deinitialize(&third);
  unsetenv("PCP_IREE_COMPILE");
}

static void cross_compiles_for_absent_devices(void** state) {
  (void)state;
  const struct {
    pcp_compile_backend_t backend;
    const char* target;
  } cases[] = {{PCP_COMPILE_BACKEND_CUDA, "sm_80"},
               {PCP_COMPILE_BACKEND_ROCM, "gfx942"},
               {PCP_COMPILE_BACKEND_VULKAN, NULL}};
  for (size_t i = 0; i < PCP_ARRAYSIZE(cases); ++i) {
    pcp_compile_request_t request = request_for(kAddModule, NULL);
    request.backend = cases[i].backend;
    request.target = cases[i].target;
    request.disable_cache = true;
    pcp_compile_result_t result;
    pcp_status_t s = pcp_compile_module(&request, &result);
    if (s) {
      char text[2048];
      pcp_status_format(s, text, sizeof(text));
      fail_msg("%s: %s", pcp_compile_backend_name(cases[i].backend), text);
    }
    assert_true(result.vmfb_byte_length > 100);
    assert_memory_equal(result.vmfb, "PK\3\4", 4);
    pcp_compile_result_deinitialize(&result);
  }
}

static void malformed_mlir_returns_diagnostics(void** state) {
  (void)state;
  const char* bad =
      "func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
      "  %0 = stablehlo.add %a, %nope : tensor<4xf32>\n"
      "  return %0 : tensor<4xf32>\n}\n";
  pcp_compile_request_t request = request_for(bad, NULL);
  request.disable_cache = true;
  pcp_compile_result_t result;
  pcp_status_t s = pcp_compile_module(&request, &result);
  assert_int_equal(pcp_status_code(s), PCP_STATUS_INVALID_ARGUMENT);
  const char* message = pcp_status_message(s);
  assert_non_null(strstr(message, "iree-compile rejected add.mlir"));
  assert_non_null(strstr(message, ":2:"));  // line of the bad operand
  assert_non_null(strstr(message, "error:"));
  assert_non_null(strstr(message, "%nope"));
  pcp_status_ignore(s);
  assert_null(result.vmfb);
}

static void write_script(const char* path, const char* body) {
  FILE* f = fopen(path, "w");
  fprintf(f, "#!/bin/sh\n%s\n", body);
  fclose(f);
  chmod(path, 0755);
}

static void compiler_crash_and_hang_are_reported(void** state) {
  (void)state;
  char script[128];
  snprintf(script, sizeof(script), "%s/crash.sh", g_dir);
  // Answers --version like the real compiler, crashes on a compile.
  write_script(
      script,
      "if [ \"$1\" = --version ]; then echo 'IREE compiler version "
      "fake-crash'; exit 0; fi\necho 'about to crash' >&2\nkill -SEGV $$");
  setenv("PCP_IREE_COMPILE", script, 1);
  pcp_compile_request_t request = request_for(kAddModule, NULL);
  request.disable_cache = true;
  pcp_compile_result_t result;
  pcp_status_t s = pcp_compile_module(&request, &result);
  assert_int_equal(pcp_status_code(s), PCP_STATUS_INTERNAL);
  assert_non_null(strstr(pcp_status_message(s), "crashed (signal 11)"));
  assert_non_null(strstr(pcp_status_message(s), "about to crash"));
  pcp_status_ignore(s);

  snprintf(script, sizeof(script), "%s/hang.sh", g_dir);
  write_script(script,
               "if [ \"$1\" = --version ]; then echo 'IREE compiler version "
               "fake-hang'; exit 0; fi\nexec sleep 30");
  setenv("PCP_IREE_COMPILE", script, 1);
  request.timeout_ms = 300;
  s = pcp_compile_module(&request, &result);
  assert_int_equal(pcp_status_code(s), PCP_STATUS_DEADLINE_EXCEEDED);
  pcp_status_ignore(s);
  unsetenv("PCP_IREE_COMPILE");
}

static void missing_venv_is_a_clear_error(void** state) {
  (void)state;
  const char* saved = getenv("PCP_VENV");
  char* copy = saved ? strdup(saved) : NULL;
  setenv("PCP_VENV", "/nonexistent/venv", 1);
  pcp_compile_request_t request = request_for(kAddModule, NULL);
  pcp_compile_result_t result;
  pcp_status_t s = pcp_compile_module(&request, &result);
  assert_int_equal(pcp_status_code(s), PCP_STATUS_NOT_FOUND);
  assert_non_null(strstr(pcp_status_message(s), "make setup"));
  pcp_status_ignore(s);
  if (copy) {
    setenv("PCP_VENV", copy, 1);
    free(copy);
  } else {
    unsetenv("PCP_VENV");
  }
}

static void oversized_and_empty_inputs_are_refused(void** state) {
  (void)state;
  pcp_compile_request_t request = request_for(kAddModule, NULL);
  request.mlir_byte_length = PCP_COMPILE_MAX_MLIR_BYTES + 1;
  pcp_compile_result_t result;
  assert_int_equal(
      pcp_status_consume_code(pcp_compile_module(&request, &result)),
      PCP_STATUS_RESOURCE_EXHAUSTED);
  request.mlir_byte_length = 0;
  assert_int_equal(
      pcp_status_consume_code(pcp_compile_module(&request, &result)),
      PCP_STATUS_INVALID_ARGUMENT);
}

// Derives a training module from |text| with |accumulation_steps|; returns
// the status (and the text through |out_text| when non-NULL).
static pcp_status_t derive_accumulated(const char* text, int32_t inner_steps,
                                       pcp_compile_program_t program,
                                       int64_t accumulation_steps,
                                       char** out_text) {
  pcp_compile_training_options_t options;
  pcp_compile_training_options_initialize(&options);
  options.program = program;
  options.inner_steps = inner_steps;
  options.accumulation_steps = accumulation_steps;
  char* derived = NULL;
  size_t length = 0;
  pcp_status_t status = pcp_compile_training_module_build(
      text, strlen(text), "t.mlir", &options, pcp_allocator_system(), &derived,
      &length);
  if (!status) {
    assert_int_equal(strlen(derived), length);
  }
  if (out_text) {
    *out_text = derived;
  } else {
    free(derived);
  }
  return status;
}

static pcp_status_t derive(const char* text, int32_t inner_steps,
                           pcp_compile_program_t program, char** out_text) {
  return derive_accumulated(text, inner_steps, program, 0, out_text);
}

static void expect_code(pcp_status_t status, pcp_status_code_t code,
                        const char* needle) {
  assert_non_null(status);
  char* message = pcp_status_to_string(status);
  if (pcp_status_code(status) != code || !strstr(message, needle)) {
    fail_msg("expected %s with '%s', got: %s", pcp_status_code_string(code),
             needle, message);
  }
  free(message);
  pcp_status_ignore(status);
}

// Extra flags: the check's refusals, replacement of a table flag by name,
// PCP_IREE_FLAGS splitting, and the cache key following the flags.
static void extra_flags_are_checked_merged_and_keyed(void** state) {
  (void)state;
  const char* bad[] = {"",
                       "-o",
                       "--",
                       "iree-opt-level=O1",
                       "--iree-opt level=O1",
                       "--compile-to=flow",
                       "--iree-hal-target-device=cuda",
                       "--iree-hal-dump-executable-files-to=/tmp",
                       "--mlir-print-ir-tree-dir=/tmp",
                       "--iree-opt-level=O1\n"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(bad); ++i) {
    pcp_status_t status = pcp_compile_flag_check(bad[i], "--iree-flag");
    assert_int_equal(pcp_status_consume_code(status),
                     PCP_STATUS_INVALID_ARGUMENT);
  }
  char long_flag[PCP_COMPILE_MAX_FLAG_LENGTH + 8];
  memset(long_flag, 'a', sizeof(long_flag) - 1);
  long_flag[0] = long_flag[1] = '-';
  long_flag[sizeof(long_flag) - 1] = 0;
  assert_int_equal(
      pcp_status_consume_code(pcp_compile_flag_check(long_flag, NULL)),
      PCP_STATUS_INVALID_ARGUMENT);
  assert_null(pcp_compile_flag_check("--iree-opt-level=O1", NULL));

  pcp_compile_flags_t f;
  assert_null(pcp_compile_flags_resolve(PCP_COMPILE_BACKEND_CPU, NULL, &f));
  assert_true(has_flag(&f, PCP_COMPILE_CPU_STACK_ALLOCATION_LIMIT));
  int count = f.count;
  const char* extra[] = {"--iree-llvmcpu-stack-allocation-limit=65536",
                         "--iree-opt-data-tiling=false"};
  assert_null(pcp_compile_flags_add_extra(&f, extra, 2, "--iree-flag"));
  assert_int_equal(f.count, count + 1);  // one replaced, one added
  assert_false(has_flag(&f, PCP_COMPILE_CPU_STACK_ALLOCATION_LIMIT));
  assert_true(has_flag(&f, extra[0]));
  assert_true(has_flag(&f, extra[1]));
  const char* many[PCP_COMPILE_MAX_EXTRA_FLAGS + 1];
  for (size_t i = 0; i < PCP_ARRAYSIZE(many); ++i)
    many[i] = "--iree-opt-level=O1";
  assert_int_equal(pcp_status_consume_code(pcp_compile_flags_add_extra(
                       &f, many, PCP_ARRAYSIZE(many), NULL)),
                   PCP_STATUS_INVALID_ARGUMENT);

  assert_null(pcp_compile_flags_resolve(PCP_COMPILE_BACKEND_CPU, NULL, &f));
  setenv(PCP_COMPILE_FLAGS_ENV,
         "  --iree-opt-level=O1 \t--iree-opt-data-tiling=false ", 1);
  assert_null(pcp_compile_flags_add_environment(&f));
  assert_true(has_flag(&f, "--iree-opt-level=O1"));
  assert_false(has_flag(&f, "--iree-opt-level=O2"));
  assert_true(has_flag(&f, "--iree-opt-data-tiling=false"));
  setenv(PCP_COMPILE_FLAGS_ENV, "--output-format=vm-asm", 1);
  assert_int_equal(
      pcp_status_consume_code(pcp_compile_flags_add_environment(&f)),
      PCP_STATUS_INVALID_ARGUMENT);
  unsetenv(PCP_COMPILE_FLAGS_ENV);

  // Same module, another flag: another key; the same flag by the
  // environment: the same key (and a cache hit).
  char cache[128];
  snprintf(cache, sizeof(cache), "%s/flags-cache", g_dir);
  pcp_compile_request_t request = request_for(kAddModule, cache);
  pcp_compile_result_t plain, flagged, from_env;
  assert_null(pcp_compile_module(&request, &plain));
  const char* o1[] = {"--iree-opt-level=O1"};
  request.iree_flags = o1;
  request.iree_flag_count = 1;
  assert_null(pcp_compile_module(&request, &flagged));
  assert_string_not_equal(plain.cache_key, flagged.cache_key);
  request.iree_flags = NULL;
  request.iree_flag_count = 0;
  setenv(PCP_COMPILE_FLAGS_ENV, "--iree-opt-level=O1", 1);
  assert_null(pcp_compile_module(&request, &from_env));
  unsetenv(PCP_COMPILE_FLAGS_ENV);
  assert_string_equal(from_env.cache_key, flagged.cache_key);
  assert_true(from_env.cache_hit);
  pcp_compile_result_deinitialize(&plain);
  pcp_compile_result_deinitialize(&flagged);
  pcp_compile_result_deinitialize(&from_env);

  // A flag iree-compile does not know: INVALID_ARGUMENT saying where the
  // flag came from.
  const char* unknown[] = {"--iree-no-such-flag=1"};
  request.iree_flags = unknown;
  request.iree_flag_count = 1;
  pcp_compile_result_t failed;
  pcp_status_t status = pcp_compile_module(&request, &failed);
  expect_code(status, PCP_STATUS_INVALID_ARGUMENT, "--iree-no-such-flag");
}

// The C API end to end without running anything: the derived module holds
// the four functions; bad forward functions and ops without a rule are
// errors that say why.
static void training_module_functions_and_errors(void** state) {
  (void)state;
  static const char kLoss[] =
      "func.func @main(%w: tensor<3xf32>, %ids: tensor<3xi32>) -> tensor<f32> "
      "{\n"
      "  %z = stablehlo.constant dense<0.0> : tensor<f32>\n"
      "  %0 = stablehlo.multiply %w, %w : tensor<3xf32>\n"
      "  %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across "
      "dimensions = [0] : (tensor<3xf32>, tensor<f32>) -> tensor<f32>\n"
      "  return %1 : tensor<f32>\n}\n";
  char* text = NULL;
  pcp_status_t status = derive(kLoss, 3, PCP_COMPILE_PROGRAM_TRAIN, &text);
  if (status) {
    char* message = pcp_status_to_string(status);
    fail_msg("%s", message);
  }
  assert_non_null(strstr(text, "func.func @main("));
  assert_non_null(strstr(text, "func.func @compute_gradients("));
  assert_non_null(strstr(text, "func.func @apply_optimizer("));
  assert_non_null(strstr(text, "func.func @train_steps("));
  assert_non_null(strstr(text, "\"stablehlo.while\""));
  // One rate per fused step in; the next step number and the K losses out.
  assert_non_null(strstr(text,
                         "%step: tensor<f32>, %lr: tensor<3xf32>, %d0: "
                         "tensor<3x3xi32>) -> (tensor<3xf32>, tensor<3xf32>, "
                         "tensor<3xf32>, tensor<f32>, tensor<3xf32>) {"));
  // The i32 ids are data: one gradient, for %w.
  assert_non_null(strstr(text, "-> (tensor<f32>, tensor<3xf32>) {"));
  free(text);
  assert_null(derive(kLoss, 0, PCP_COMPILE_PROGRAM_GRAD, &text));
  assert_null(strstr(text, "@apply_optimizer"));
  free(text);

  static const char kTwoResults[] =
      "func.func @main(%w: tensor<3xf32>) -> (tensor<3xf32>, tensor<3xf32>) {\n"
      "  return %w, %w : tensor<3xf32>, tensor<3xf32>\n}\n";
  expect_code(derive(kTwoResults, 0, PCP_COMPILE_PROGRAM_GRAD, NULL),
              PCP_STATUS_INVALID_ARGUMENT, "exactly one value");
  static const char kNotScalar[] =
      "func.func @main(%w: tensor<3xf32>) -> tensor<3xf32> {\n"
      "  return %w : tensor<3xf32>\n}\n";
  expect_code(derive(kNotScalar, 0, PCP_COMPILE_PROGRAM_GRAD, NULL),
              PCP_STATUS_INVALID_ARGUMENT, "rank-0 float");
  static const char kNoRule[] =
      "func.func @main(%w: tensor<f32>) -> tensor<f32> {\n"
      "  %0 = stablehlo.remainder %w, %w : tensor<f32>\n"
      "  return %0 : tensor<f32>\n}\n";
  expect_code(derive(kNoRule, 0, PCP_COMPILE_PROGRAM_GRAD, NULL),
              PCP_STATUS_UNIMPLEMENTED, "stablehlo.remainder at t.mlir:2:");
  expect_code(derive(kLoss, -1, PCP_COMPILE_PROGRAM_TRAIN, NULL),
              PCP_STATUS_INVALID_ARGUMENT, "inner steps");
  expect_code(derive("func.func @main(", 0, PCP_COMPILE_PROGRAM_GRAD, NULL),
              PCP_STATUS_INVALID_ARGUMENT, "t.mlir:1:");
}

// Gradient accumulation: A = 0 and 1 emit the same module; A = 2 adds
// @compute_gradients_accumulated over [2, ...] data and @train_steps and
// @diloco_round take [K, 2, ...]; out-of-range counts are errors. (Numerics:
// tests/compile/accumulate_test.py.)
static void training_module_accumulation(void** state) {
  (void)state;
  static const char kLoss[] =
      "func.func @main(%w: tensor<3xf32>, %ids: tensor<4xi32>) -> tensor<f32> "
      "{\n"
      "  %z = stablehlo.constant dense<0.0> : tensor<f32>\n"
      "  %0 = stablehlo.multiply %w, %w : tensor<3xf32>\n"
      "  %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across "
      "dimensions = [0] : (tensor<3xf32>, tensor<f32>) -> tensor<f32>\n"
      "  return %1 : tensor<f32>\n}\n";
  char* none = NULL;
  char* one = NULL;
  char* two = NULL;
  assert_null(
      derive_accumulated(kLoss, 3, PCP_COMPILE_PROGRAM_DILOCO, 0, &none));
  assert_null(
      derive_accumulated(kLoss, 3, PCP_COMPILE_PROGRAM_DILOCO, 1, &one));
  assert_string_equal(none, one);
  assert_null(strstr(none, "@compute_gradients_accumulated"));
  assert_null(
      derive_accumulated(kLoss, 3, PCP_COMPILE_PROGRAM_DILOCO, 2, &two));
  assert_non_null(
      strstr(two,
             "func.func @compute_gradients_accumulated(%p0: tensor<3xf32>, "
             "%d0: tensor<2x4xi32>) -> (tensor<f32>, tensor<3xf32>) {"));
  assert_non_null(strstr(two, "%d0: tensor<3x2x4xi32>) -> ("));
  assert_non_null(strstr(two,
                         "func.func @diloco_round(%p0: tensor<3xf32>, %lr: "
                         "tensor<3xf32>, %d0: tensor<3x2x4xi32>) -> "
                         "(tensor<3xf32>, tensor<3xf32>) {"));
  assert_non_null(strstr(two, "{callee = @compute_gradients_accumulated}"));
  free(none);
  free(one);
  free(two);
  // GRAD with A > 1: the accumulated function and no optimizer.
  assert_null(derive_accumulated(kLoss, 0, PCP_COMPILE_PROGRAM_GRAD, 4, &two));
  assert_non_null(strstr(two, "%d0: tensor<4x4xi32>) -> (tensor<f32>"));
  assert_null(strstr(two, "@apply_optimizer"));
  free(two);
  expect_code(derive_accumulated(kLoss, 3, PCP_COMPILE_PROGRAM_TRAIN, -1, NULL),
              PCP_STATUS_INVALID_ARGUMENT,
              "accumulation steps must be within 0..4096");
  expect_code(
      derive_accumulated(kLoss, 3, PCP_COMPILE_PROGRAM_TRAIN, 4097, NULL),
      PCP_STATUS_INVALID_ARGUMENT, "got 4097");
}

// --inner-state: keep makes @diloco_round take and return the inner AdamW
// state (m and v in the moment type, step), reset is the default and the
// text of before; the two texts differ, so their artifact keys (hashes of
// the text) do. Keep without the diloco program is an error. (Numerics:
// tests/workloads/inner_state_test.py.)
static void training_module_inner_state(void** state) {
  (void)state;
  static const char kLoss[] =
      "func.func @main(%w: tensor<3xbf16>, %ids: tensor<4xi32>) -> "
      "tensor<f32> {\n"
      "  %z = stablehlo.constant dense<0.0> : tensor<f32>\n"
      "  %0 = stablehlo.convert %w : (tensor<3xbf16>) -> tensor<3xf32>\n"
      "  %1 = stablehlo.multiply %0, %0 : tensor<3xf32>\n"
      "  %2 = stablehlo.reduce(%1 init: %z) applies stablehlo.add across "
      "dimensions = [0] : (tensor<3xf32>, tensor<f32>) -> tensor<f32>\n"
      "  return %2 : tensor<f32>\n}\n";
  pcp_compile_training_options_t options;
  pcp_compile_training_options_initialize(&options);
  assert_int_equal(options.inner_state, PCP_COMPILE_INNER_STATE_RESET);
  options.program = PCP_COMPILE_PROGRAM_DILOCO;
  options.inner_steps = 5;
  char* texts[2] = {NULL, NULL};
  for (int keep = 0; keep < 2; ++keep) {
    options.inner_state =
        keep ? PCP_COMPILE_INNER_STATE_KEEP : PCP_COMPILE_INNER_STATE_RESET;
    size_t length = 0;
    pcp_status_t status = pcp_compile_training_module_build(
        kLoss, strlen(kLoss), "t.mlir", &options, pcp_allocator_system(),
        &texts[keep], &length);
    if (status) {
      char* message = pcp_status_to_string(status);
      fail_msg("%s", message);
    }
  }
  assert_non_null(strstr(texts[0],
                         "func.func @diloco_round(%p0: tensor<3xbf16>, %lr: "
                         "tensor<5xf32>, %d0: tensor<5x4xi32>) -> "
                         "(tensor<3xf32>, tensor<5xf32>) {"));
  assert_non_null(strstr(
      texts[1],
      "func.func @diloco_round(%p0: tensor<3xbf16>, %m0: tensor<3xf32>, "
      "%s0: tensor<3xf32>, %step: tensor<f32>, %lr: tensor<5xf32>, %d0: "
      "tensor<5x4xi32>) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, "
      "tensor<f32>, tensor<5xf32>) {"));
  assert_string_not_equal(texts[0], texts[1]);
  free(texts[0]);
  free(texts[1]);
  // With gradient accumulation the kept round takes data [K, A, ...].
  options.inner_state = PCP_COMPILE_INNER_STATE_KEEP;
  options.accumulation_steps = 2;
  size_t length = 0;
  assert_null(pcp_compile_training_module_build(
      kLoss, strlen(kLoss), "t.mlir", &options, pcp_allocator_system(),
      &texts[0], &length));
  assert_non_null(strstr(texts[0],
                         "%step: tensor<f32>, %lr: tensor<5xf32>, %d0: "
                         "tensor<5x2x4xi32>) -> (tensor<3xf32>, "
                         "tensor<3xf32>, tensor<3xf32>, tensor<f32>, "
                         "tensor<5xf32>) {"));
  free(texts[0]);
  options.accumulation_steps = 0;

  pcp_compile_inner_state_t parsed = PCP_COMPILE_INNER_STATE_RESET;
  assert_null(pcp_compile_inner_state_parse("keep", &parsed));
  assert_int_equal(parsed, PCP_COMPILE_INNER_STATE_KEEP);
  assert_null(pcp_compile_inner_state_parse("reset", &parsed));
  assert_int_equal(parsed, PCP_COMPILE_INNER_STATE_RESET);
  expect_code(pcp_compile_inner_state_parse("kept", &parsed),
              PCP_STATUS_INVALID_ARGUMENT, "got 'kept'");
  options.inner_state = (pcp_compile_inner_state_t)7;
  expect_code(pcp_compile_training_module_build(
                  kLoss, strlen(kLoss), "t.mlir", &options,
                  pcp_allocator_system(), &texts[0], &(size_t){0}),
              PCP_STATUS_INVALID_ARGUMENT, "got 7");
  options.inner_state = PCP_COMPILE_INNER_STATE_KEEP;
  options.program = PCP_COMPILE_PROGRAM_TRAIN;
  expect_code(pcp_compile_training_module_build(
                  kLoss, strlen(kLoss), "t.mlir", &options,
                  pcp_allocator_system(), &texts[0], &(size_t){0}),
              PCP_STATUS_INVALID_ARGUMENT, "diloco program");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(flag_table_rows),
      cmocka_unit_test(unknown_backend_and_target_are_clear_errors),
      cmocka_unit_test(compiles_cpu_and_serves_repeat_from_cache),
      cmocka_unit_test(cross_compiles_for_absent_devices),
      cmocka_unit_test(malformed_mlir_returns_diagnostics),
      cmocka_unit_test(compiler_crash_and_hang_are_reported),
      cmocka_unit_test(missing_venv_is_a_clear_error),
      cmocka_unit_test(oversized_and_empty_inputs_are_refused),
      cmocka_unit_test(training_module_functions_and_errors),
      cmocka_unit_test(training_module_accumulation),
      cmocka_unit_test(training_module_inner_state),
      cmocka_unit_test(extra_flags_are_checked_merged_and_keyed),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
