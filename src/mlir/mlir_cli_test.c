// SPDX-License-Identifier: Apache-2.0
//
// `pcp inspect` through the real binary ($PCP_BINARY): output, JSON, printing
// back, and exit codes (0 ok, 1 bad module, 2 usage).

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
// clang-format on

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "base/base.h"

typedef struct run_result_t {
  int exit_code;
  char* out;  // stdout
  char* err;  // stderr
} run_result_t;

static char g_fixtures[4096];
static char g_scratch[4096];

static char* read_stream(FILE* stream) {
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 16 << 20, &builder);
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), stream)) > 0) {
    PCP_CHECK_OK(
        pcp_string_builder_append(&builder, pcp_make_string_view(chunk, n)));
  }
  // Not pcp_string_builder_take: on a builder that never grew it hands back
  // an unterminated block (base bug, reported), and empty output is common.
  char* text = strdup(pcp_string_builder_cstring(&builder));
  assert_non_null(text);
  pcp_string_builder_deinitialize(&builder);
  return text;
}

// Runs `[env] $PCP_BINARY inspect <args>`; |env| may be NULL.
static run_result_t run_inspect(const char* env, const char* args) {
  const char* binary = getenv("PCP_BINARY");
  assert_non_null(binary);
  char err_path[4200];
  snprintf(err_path, sizeof(err_path), "%s/stderr.txt", g_scratch);
  char command[20480];
  snprintf(command, sizeof(command), "%s '%s' inspect %s 2>'%s'",
           env ? env : "", binary, args, err_path);
  FILE* pipe = popen(command, "r");
  assert_non_null(pipe);
  run_result_t result;
  result.out = read_stream(pipe);
  int status = pclose(pipe);
  assert_true(WIFEXITED(status));  // never a crash
  result.exit_code = WEXITSTATUS(status);
  FILE* err = fopen(err_path, "r");
  assert_non_null(err);
  result.err = read_stream(err);
  fclose(err);
  return result;
}

static void run_result_free(run_result_t* result) {
  free(result->out);
  free(result->err);
}

static void expect_contains(const char* haystack, const char* needle) {
  if (!strstr(haystack, needle)) {
    fail_msg("'%s' not in:\n%s", needle, haystack);
  }
}

static int setup(void** state) {
  PCP_UNUSED(state);
  const char* source_dir = getenv("PCP_SOURCE_DIR");
  if (!source_dir) {
    return -1;
  }
  snprintf(g_fixtures, sizeof(g_fixtures), "%s/tests/fixtures/mlir",
           source_dir);
  snprintf(g_scratch, sizeof(g_scratch), "/tmp/pcp_mlir_cli_test.XXXXXX");
  return mkdtemp(g_scratch) ? 0 : -1;
}

static int teardown(void** state) {
  PCP_UNUSED(state);
  char path[4200];
  snprintf(path, sizeof(path), "%s/stderr.txt", g_scratch);
  unlink(path);
  snprintf(path, sizeof(path), "%s/printed.mlir", g_scratch);
  unlink(path);
  rmdir(g_scratch);
  return 0;
}

static void test_summary(void** state) {
  PCP_UNUSED(state);
  char args[12288];
  snprintf(args, sizeof(args), "'%s/mlp_pretty.mlir'", g_fixtures);
  run_result_t r = run_inspect(NULL, args);
  assert_int_equal(r.exit_code, 0);
  expect_contains(r.out, "module @mlp (");
  expect_contains(r.out, "public functions: @main, @eval\n");
  expect_contains(r.out, "private functions: @relu\n");
  expect_contains(r.out,
                  "@main(arg0: 3x4xf32, arg1: 4xf32, arg2: 2x3xf32, arg3: "
                  "2xi64) -> (tensor<f32>, 2x4xf32)\n");
  assert_string_equal(r.err, "");
  run_result_free(&r);

  snprintf(args, sizeof(args), "'%s/mlp_pretty.mlir' --function eval",
           g_fixtures);
  r = run_inspect(NULL, args);
  assert_int_equal(r.exit_code, 0);
  expect_contains(r.out, "@eval(arg0: 2x3xf32) -> (2x3xf32)\n");
  run_result_free(&r);

  // No @main: the only public function is shown.
  snprintf(args, sizeof(args), "--function=forward '%s/torch_mlir_style.mlir'",
           g_fixtures);
  r = run_inspect(NULL, args);
  assert_int_equal(r.exit_code, 0);
  expect_contains(r.out, "@forward(arg0: ?x8xf32) -> (?x4xf32)\n");
  run_result_free(&r);
  snprintf(args, sizeof(args), "'%s/torch_mlir_style.mlir'", g_fixtures);
  r = run_inspect(NULL, args);
  assert_int_equal(r.exit_code, 0);
  expect_contains(r.out, "@forward(arg0: ?x8xf32) -> (?x4xf32)\n");
  run_result_free(&r);
}

static void test_json(void** state) {
  PCP_UNUSED(state);
  char args[12288];
  snprintf(args, sizeof(args), "'%s/types.mlir' --json", g_fixtures);
  run_result_t r = run_inspect(NULL, args);
  assert_int_equal(r.exit_code, 0);
  json_error_t error;
  json_t* root = json_loads(r.out, 0, &error);
  if (!root) {
    fail_msg("not JSON (%s):\n%s", error.text, r.out);
  }
  assert_true(json_is_null(json_object_get(root, "module")));
  json_t* functions = json_object_get(root, "functions");
  assert_int_equal(json_array_size(functions), 1);
  json_t* function = json_object_get(root, "function");
  assert_string_equal(json_string_value(json_object_get(function, "name")),
                      "main");
  json_t* arguments = json_object_get(function, "arguments");
  assert_int_equal(json_array_size(arguments), 11);
  json_t* a0 = json_array_get(arguments, 0);
  assert_string_equal(json_string_value(json_object_get(a0, "type")),
                      "tensor<4x?xbf16>");
  assert_string_equal(json_string_value(json_object_get(a0, "kind")), "tensor");
  assert_string_equal(json_string_value(json_object_get(a0, "element_type")),
                      "bf16");
  json_t* shape = json_object_get(a0, "shape");
  assert_int_equal(json_array_size(shape), 2);
  assert_int_equal(json_integer_value(json_array_get(shape, 0)), 4);
  assert_int_equal(json_integer_value(json_array_get(shape, 1)), -1);
  json_t* a5 = json_array_get(arguments, 5);
  assert_string_equal(json_string_value(json_object_get(a5, "kind")), "scalar");
  assert_string_equal(json_string_value(json_object_get(a5, "type")), "i32");
  json_t* a8 = json_array_get(arguments, 8);
  assert_string_equal(json_string_value(json_object_get(a8, "kind")), "other");
  assert_null(json_object_get(a8, "element_type"));
  assert_int_equal(json_array_size(json_object_get(function, "results")), 2);
  json_decref(root);
  run_result_free(&r);
}

// --print and --generic write text that `pcp inspect` reads back.
static void test_print_roundtrip(void** state) {
  PCP_UNUSED(state);
  const char* modes[] = {"--print", "--generic"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(modes); ++i) {
    char args[12288];
    snprintf(args, sizeof(args), "'%s/mlp_pretty.mlir' %s", g_fixtures,
             modes[i]);
    run_result_t r = run_inspect(NULL, args);
    assert_int_equal(r.exit_code, 0);
    if (i == 0) {
      expect_contains(r.out, "stablehlo.dot_general %");
    } else {
      expect_contains(r.out, "\"stablehlo.dot_general\"(");
    }
    char path[4200];
    snprintf(path, sizeof(path), "%s/printed.mlir", g_scratch);
    PCP_CHECK_OK(pcp_file_write_atomic(path, r.out, strlen(r.out)));
    run_result_free(&r);

    snprintf(args, sizeof(args), "'%s'", path);
    r = run_inspect(NULL, args);
    assert_int_equal(r.exit_code, 0);
    expect_contains(r.out,
                    "@main(arg0: 3x4xf32, arg1: 4xf32, arg2: 2x3xf32, arg3: "
                    "2xi64) -> (tensor<f32>, 2x4xf32)\n");
    run_result_free(&r);
  }
}

static void test_bad_module_exits_1(void** state) {
  PCP_UNUSED(state);
  char args[12288];
  snprintf(args, sizeof(args), "'%s/malformed.mlir'", g_fixtures);
  run_result_t r = run_inspect(NULL, args);
  assert_int_equal(r.exit_code, 1);
  assert_string_equal(r.out, "");
  expect_contains(r.err, "malformed.mlir:3:31: error: ");
  expect_contains(r.err, "undeclared SSA value");
  run_result_free(&r);

  snprintf(args, sizeof(args), "'%s/invalid.mlir' --json", g_fixtures);
  r = run_inspect(NULL, args);
  assert_int_equal(r.exit_code, 1);
  expect_contains(r.err, "invalid.mlir:3:3: error: ");
  run_result_free(&r);

  snprintf(args, sizeof(args), "'%s/mlp_pretty.mlir' --function predict",
           g_fixtures);
  r = run_inspect(NULL, args);
  assert_int_equal(r.exit_code, 1);
  expect_contains(r.err, "function @predict not found");
  expect_contains(r.err, "available: @main, @relu (private), @eval");
  run_result_free(&r);

  snprintf(args, sizeof(args), "'%s/no_such_file.mlir'", g_fixtures);
  r = run_inspect(NULL, args);
  assert_int_equal(r.exit_code, 1);
  expect_contains(r.err, "no_such_file.mlir");
  run_result_free(&r);

  // No compiler library: a clear message, exit 1, no crash.
  snprintf(args, sizeof(args), "'%s/mlp_pretty.mlir'", g_fixtures);
  r = run_inspect("PCP_IREE_COMPILER_LIB=/nonexistent/libIREECompiler.so",
                  args);
  assert_int_equal(r.exit_code, 1);
  expect_contains(r.err, "/nonexistent/libIREECompiler.so");
  expect_contains(r.err, "PCP_IREE_COMPILER_LIB");
  run_result_free(&r);
}

static void test_usage_errors_exit_2(void** state) {
  PCP_UNUSED(state);
  run_result_t r = run_inspect(NULL, "");
  assert_int_equal(r.exit_code, 2);
  expect_contains(r.err, "missing the MLIR file");
  run_result_free(&r);

  char args[12288];
  snprintf(args, sizeof(args), "'%s/mlp_pretty.mlir' --bogus", g_fixtures);
  r = run_inspect(NULL, args);
  assert_int_equal(r.exit_code, 2);
  expect_contains(r.err, "--bogus");
  run_result_free(&r);

  snprintf(args, sizeof(args), "'%s/mlp_pretty.mlir' '%s/types.mlir'",
           g_fixtures, g_fixtures);
  r = run_inspect(NULL, args);
  assert_int_equal(r.exit_code, 2);
  expect_contains(r.err, "expected one MLIR file");
  run_result_free(&r);

  r = run_inspect(NULL, "--function");
  assert_int_equal(r.exit_code, 2);
  run_result_free(&r);

  r = run_inspect(NULL, "--help");
  assert_int_equal(r.exit_code, 0);
  expect_contains(r.out, "usage: pcp inspect");
  expect_contains(r.out, "--generic");
  run_result_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_summary),
      cmocka_unit_test(test_json),
      cmocka_unit_test(test_print_roundtrip),
      cmocka_unit_test(test_bad_module_exits_1),
      cmocka_unit_test(test_usage_errors_exit_2),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
