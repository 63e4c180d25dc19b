// SPDX-License-Identifier: Apache-2.0
//
// mlir module tests against the real libIREECompiler.so from the .venv:
// hand-written StableHLO (pretty and generic), a module exported by JAX in
// this run, a torch-mlir shaped module, element types, and every error path.

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
// clang-format on

#include "mlir/mlir.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pcp_mlir_context_t* g_context;
static pcp_mlir_context_t* shared_context(void);

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

static char* status_text(pcp_status_t status) {
  char* text = pcp_status_to_string(status);
  assert_non_null(text);
  return text;
}

// Fails the test with the status text when |status| is not OK.
static void expect_ok(pcp_status_t status) {
  if (status) {
    char* text = status_text(status);
    pcp_status_ignore(status);
    fail_msg("%s", text);
  }
}

// Checks the code and that every needle is in the message; consumes.
static void expect_error(pcp_status_t status, pcp_status_code_t code,
                         const char* needle1, const char* needle2) {
  assert_non_null(status);
  char* text = status_text(status);
  if (pcp_status_code(status) != code) {
    fail_msg("expected %s, got: %s", pcp_status_code_string(code), text);
  }
  if (needle1 && !strstr(text, needle1)) {
    fail_msg("'%s' not in: %s", needle1, text);
  }
  if (needle2 && !strstr(text, needle2)) {
    fail_msg("'%s' not in: %s", needle2, text);
  }
  free(text);
  pcp_status_ignore(status);
}

static char* read_fixture(const char* name, size_t* out_length) {
  const char* source_dir = getenv("PCP_SOURCE_DIR");
  assert_non_null(source_dir);
  char path[4096];
  snprintf(path, sizeof(path), "%s/tests/fixtures/mlir/%s", source_dir, name);
  void* data = NULL;
  expect_ok(pcp_file_read_all(path, 1 << 20, &data, out_length));
  return (char*)data;
}

static pcp_mlir_module_t* parse_text(const char* text, size_t length,
                                     const char* name) {
  pcp_mlir_module_t* module = NULL;
  expect_ok(
      pcp_mlir_module_parse(shared_context(), text, length, name, &module));
  assert_non_null(module);
  expect_ok(pcp_mlir_module_verify(module));
  return module;
}

static pcp_mlir_module_t* parse_fixture(const char* name) {
  size_t length = 0;
  char* text = read_fixture(name, &length);
  pcp_mlir_module_t* module = parse_text(text, length, name);
  free(text);
  return module;
}

// Returns the signature of |function| formatted ("@main(arg0: ...) -> (...)"),
// heap-allocated.
static char* signature_string(pcp_mlir_module_t* module, const char* function,
                              pcp_mlir_function_signature_t* out_signature) {
  expect_ok(pcp_mlir_module_function_signature(
      module, function, pcp_allocator_system(), out_signature));
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &builder);
  expect_ok(pcp_mlir_function_signature_format(out_signature, &builder));
  char* text = NULL;
  expect_ok(pcp_string_builder_take(&builder, &text));
  pcp_string_builder_deinitialize(&builder);
  return text;
}

static char* print_module(pcp_mlir_module_t* module,
                          pcp_mlir_print_flags_t flags) {
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &builder);
  expect_ok(pcp_mlir_module_print(module, flags, &builder));
  char* text = NULL;
  expect_ok(pcp_string_builder_take(&builder, &text));
  pcp_string_builder_deinitialize(&builder);
  return text;
}

static void expect_tensor(const pcp_mlir_type_t* type,
                          pcp_element_type_t element, int32_t rank,
                          const int64_t* dims) {
  assert_int_equal(type->kind, PCP_MLIR_TYPE_KIND_RANKED_TENSOR);
  assert_int_equal(type->element_type, element);
  assert_int_equal(type->rank, rank);
  for (int32_t d = 0; d < rank; ++d) {
    assert_int_equal(type->dims[d], dims[d]);
  }
}

static int setup_context(void** state) {
  PCP_UNUSED(state);
  // Nothing is loaded yet: test_concurrent_first_use runs first and loads
  // the library from several threads at once.
  return 0;
}

// The shared context for the single-threaded tests, created on first use.
static pcp_mlir_context_t* shared_context(void) {
  if (!g_context) {
    expect_ok(
        pcp_mlir_context_create(NULL, pcp_allocator_system(), &g_context));
  }
  return g_context;
}

static int teardown_context(void** state) {
  PCP_UNUSED(state);
  pcp_mlir_context_release(g_context);
  g_context = NULL;
  return 0;
}

//===----------------------------------------------------------------------===//
// Tests
//===----------------------------------------------------------------------===//

#define THREAD_COUNT 4

static void* parse_on_own_context(void* arg) {
  const char* text = (const char*)arg;
  pcp_mlir_function_signature_t signature;
  pcp_status_t status = pcp_mlir_text_function_signature(
      text, strlen(text), "threaded.mlir", NULL, pcp_allocator_system(),
      &signature);
  bool ok = status == NULL && signature.argument_count == 4;
  pcp_status_ignore(status);
  pcp_mlir_function_signature_deinitialize(&signature);
  return ok ? arg : NULL;
}

// First use from several threads at once (the pthread_once load), then one
// context per thread in parallel.
static void test_concurrent_first_use(void** state) {
  PCP_UNUSED(state);
  size_t length = 0;
  char* text = read_fixture("mlp_pretty.mlir", &length);
  for (int round = 0; round < 2; ++round) {
    pthread_t threads[THREAD_COUNT];
    for (int i = 0; i < THREAD_COUNT; ++i) {
      assert_int_equal(
          pthread_create(&threads[i], NULL, parse_on_own_context, text), 0);
    }
    for (int i = 0; i < THREAD_COUNT; ++i) {
      void* result = NULL;
      assert_int_equal(pthread_join(threads[i], &result), 0);
      assert_ptr_equal(result, text);
    }
  }
  free(text);
}

static void test_library_loaded(void** state) {
  PCP_UNUSED(state);
  expect_ok(pcp_mlir_library_load());
  const char* path = pcp_mlir_library_path();
  assert_non_null(path);
  assert_non_null(strstr(path, "libIREECompiler.so"));
  assert_int_equal(pcp_mlir_library_api_version() >> 16, 1);
  assert_non_null(pcp_mlir_library_revision());
}

static void test_pretty_module(void** state) {
  PCP_UNUSED(state);
  pcp_mlir_module_t* module = parse_fixture("mlp_pretty.mlir");
  assert_string_equal(pcp_mlir_module_name(module), "mlp");
  assert_string_equal(pcp_mlir_module_buffer_name(module), "mlp_pretty.mlir");

  assert_int_equal(pcp_mlir_module_function_count(module), 3);
  pcp_mlir_function_info_t info;
  pcp_mlir_module_function_at(module, 0, &info);
  assert_string_equal(info.name, "main");
  assert_true(info.is_public);
  assert_int_equal(info.argument_count, 4);
  assert_int_equal(info.result_count, 2);
  pcp_mlir_module_function_at(module, 1, &info);
  assert_string_equal(info.name, "relu");
  assert_false(info.is_public);
  pcp_mlir_module_function_at(module, 2, &info);
  assert_string_equal(info.name, "eval");
  assert_true(info.is_public);

  pcp_mlir_function_signature_t signature;
  char* text = signature_string(module, NULL, &signature);
  assert_string_equal(text,
                      "@main(arg0: 3x4xf32, arg1: 4xf32, arg2: 2x3xf32, "
                      "arg3: 2xi64) -> (tensor<f32>, 2x4xf32)");
  assert_string_equal(signature.function_name, "main");
  assert_true(signature.is_public);
  expect_tensor(&signature.arguments[0], PCP_ELEMENT_TYPE_F32, 2,
                (const int64_t[]){3, 4});
  expect_tensor(&signature.arguments[3], PCP_ELEMENT_TYPE_I64, 1,
                (const int64_t[]){2});
  expect_tensor(&signature.results[0], PCP_ELEMENT_TYPE_F32, 0, NULL);
  assert_string_equal(signature.arguments[0].spelling, "tensor<3x4xf32>");
  assert_string_equal(signature.arguments[0].element_spelling, "f32");
  assert_string_equal(signature.results[0].spelling, "tensor<f32>");
  free(text);
  pcp_mlir_function_signature_deinitialize(&signature);

  // A named function, with or without '@'; private functions are found too.
  text = signature_string(module, "@relu", &signature);
  assert_string_equal(text, "@relu(arg0: 2x4xf32) -> (2x4xf32)");
  assert_false(signature.is_public);
  free(text);
  pcp_mlir_function_signature_deinitialize(&signature);
  text = signature_string(module, "eval", &signature);
  assert_string_equal(text, "@eval(arg0: 2x3xf32) -> (2x3xf32)");
  free(text);
  pcp_mlir_function_signature_deinitialize(&signature);
  pcp_mlir_module_release(module);
}

static void test_generic_roundtrip(void** state) {
  PCP_UNUSED(state);
  pcp_mlir_module_t* module = parse_fixture("mlp_pretty.mlir");
  pcp_mlir_function_signature_t signature;
  char* expected = signature_string(module, "main", &signature);
  pcp_mlir_function_signature_deinitialize(&signature);

  char* generic = print_module(module, PCP_MLIR_PRINT_FLAG_GENERIC);
  assert_non_null(strstr(generic, "\"stablehlo.dot_general\""));
  assert_non_null(strstr(generic, "\"func.func\""));
  char* pretty = print_module(module, PCP_MLIR_PRINT_FLAG_NONE);
  assert_non_null(strstr(pretty, "stablehlo.dot_general %"));
  assert_null(strstr(pretty, "\"stablehlo.dot_general\""));
  pcp_mlir_module_release(module);

  // Both forms parse back to the same signature; the generic text parses
  // back to the same generic text.
  pcp_mlir_module_t* reparsed =
      parse_text(generic, strlen(generic), "generic.mlir");
  char* actual = signature_string(reparsed, "main", &signature);
  assert_string_equal(actual, expected);
  assert_int_equal(pcp_mlir_module_function_count(reparsed), 3);
  char* generic_again = print_module(reparsed, PCP_MLIR_PRINT_FLAG_GENERIC);
  assert_string_equal(generic_again, generic);
  free(actual);
  free(generic_again);
  pcp_mlir_function_signature_deinitialize(&signature);
  pcp_mlir_module_release(reparsed);

  reparsed = parse_text(pretty, strlen(pretty), "pretty.mlir");
  actual = signature_string(reparsed, "main", &signature);
  assert_string_equal(actual, expected);
  free(actual);
  pcp_mlir_function_signature_deinitialize(&signature);
  pcp_mlir_module_release(reparsed);

  free(expected);
  free(generic);
  free(pretty);
}

static void test_jax_module(void** state) {
  PCP_UNUSED(state);
  const char* venv = getenv("PCP_VENV");
  const char* source_dir = getenv("PCP_SOURCE_DIR");
  assert_non_null(venv);
  assert_non_null(source_dir);
  char command[8192];
  snprintf(command, sizeof(command),
           "'%s/bin/python' '%s/tests/fixtures/mlir/jax_export.py'", venv,
           source_dir);
  FILE* pipe = popen(command, "r");
  assert_non_null(pipe);
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 1 << 20, &builder);
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), pipe)) > 0) {
    expect_ok(
        pcp_string_builder_append(&builder, pcp_make_string_view(chunk, n)));
  }
  int exit_status = pclose(pipe);
  if (exit_status != 0) {
    fail_msg("'%s' failed (%d)", command, exit_status);
  }
  const char* text = pcp_string_builder_cstring(&builder);
  assert_non_null(strstr(text, "stablehlo.dot_general"));
  assert_non_null(strstr(text, "stablehlo.reduce"));

  pcp_mlir_module_t* module = parse_text(text, builder.size, "jax_loss.mlir");
  assert_string_equal(pcp_mlir_module_name(module), "jit_loss");
  pcp_mlir_function_signature_t signature;
  char* formatted = signature_string(module, NULL, &signature);
  assert_string_equal(formatted,
                      "@main(arg0: 8x4xf32, arg1: 4xf32, arg2: 2x8xf32, "
                      "arg3: 2x4xf32) -> (tensor<f32>, 2x4xbf16)");
  expect_tensor(&signature.results[1], PCP_ELEMENT_TYPE_BF16, 2,
                (const int64_t[]){2, 4});
  free(formatted);
  pcp_mlir_function_signature_deinitialize(&signature);

  // The generic form of a JAX module also round-trips.
  char* generic = print_module(module, PCP_MLIR_PRINT_FLAG_GENERIC);
  pcp_mlir_module_t* reparsed =
      parse_text(generic, strlen(generic), "jax_generic.mlir");
  formatted = signature_string(reparsed, NULL, &signature);
  assert_string_equal(formatted,
                      "@main(arg0: 8x4xf32, arg1: 4xf32, arg2: 2x8xf32, "
                      "arg3: 2x4xf32) -> (tensor<f32>, 2x4xbf16)");
  free(formatted);
  free(generic);
  pcp_mlir_function_signature_deinitialize(&signature);
  pcp_mlir_module_release(reparsed);
  pcp_mlir_module_release(module);
  pcp_string_builder_deinitialize(&builder);
}

static void test_torch_mlir_style_module(void** state) {
  PCP_UNUSED(state);
  pcp_mlir_module_t* module = parse_fixture("torch_mlir_style.mlir");
  assert_string_equal(pcp_mlir_module_name(module), "");
  assert_int_equal(pcp_mlir_module_function_count(module), 1);
  pcp_mlir_function_signature_t signature;
  char* text = signature_string(module, "forward", &signature);
  assert_string_equal(text, "@forward(arg0: ?x8xf32) -> (?x4xf32)");
  expect_tensor(&signature.arguments[0], PCP_ELEMENT_TYPE_F32, 2,
                (const int64_t[]){PCP_MLIR_DYNAMIC_DIM, 8});
  free(text);
  pcp_mlir_function_signature_deinitialize(&signature);

  // torch-mlir names its entry point @forward: asking for @main says so.
  expect_error(pcp_mlir_module_function_signature(
                   module, NULL, pcp_allocator_system(), &signature),
               PCP_STATUS_NOT_FOUND, "@main", "available: @forward");
  pcp_mlir_module_release(module);
}

static void test_signature_types(void** state) {
  PCP_UNUSED(state);
  pcp_mlir_module_t* module = parse_fixture("types.mlir");
  pcp_mlir_function_signature_t signature;
  char* text = signature_string(module, NULL, &signature);
  assert_string_equal(
      text,
      "@main(arg0: 4x?xbf16, arg1: ?x?x8xi1, arg2: tensor<i64>, arg3: *xf16, "
      "arg4: 16xui8, arg5: i32, arg6: f64, arg7: index, arg8: "
      "!stablehlo.token, arg9: 2xsi32, arg10: 3xf8E4M3FN) -> (4x?xbf16, "
      "?x?x8xi1)");
  free(text);
  assert_int_equal(signature.argument_count, 11);
  assert_int_equal(signature.result_count, 2);
  const pcp_mlir_type_t* args = signature.arguments;
  expect_tensor(&args[0], PCP_ELEMENT_TYPE_BF16, 2,
                (const int64_t[]){4, PCP_MLIR_DYNAMIC_DIM});
  expect_tensor(
      &args[1], PCP_ELEMENT_TYPE_I1, 3,
      (const int64_t[]){PCP_MLIR_DYNAMIC_DIM, PCP_MLIR_DYNAMIC_DIM, 8});
  expect_tensor(&args[2], PCP_ELEMENT_TYPE_I64, 0, NULL);
  assert_int_equal(args[3].kind, PCP_MLIR_TYPE_KIND_UNRANKED_TENSOR);
  assert_int_equal(args[3].element_type, PCP_ELEMENT_TYPE_F16);
  assert_int_equal(args[3].rank, -1);
  expect_tensor(&args[4], PCP_ELEMENT_TYPE_U8, 1, (const int64_t[]){16});
  assert_int_equal(args[5].kind, PCP_MLIR_TYPE_KIND_SCALAR);
  assert_int_equal(args[5].element_type, PCP_ELEMENT_TYPE_I32);
  assert_int_equal(args[5].rank, 0);
  assert_string_equal(args[5].spelling, "i32");
  assert_int_equal(args[6].kind, PCP_MLIR_TYPE_KIND_SCALAR);
  assert_int_equal(args[6].element_type, PCP_ELEMENT_TYPE_F64);
  assert_int_equal(args[7].kind, PCP_MLIR_TYPE_KIND_SCALAR);
  assert_int_equal(args[7].element_type, PCP_ELEMENT_TYPE_UNKNOWN);
  assert_string_equal(args[7].element_spelling, "index");
  assert_int_equal(args[8].kind, PCP_MLIR_TYPE_KIND_OTHER);
  assert_int_equal(args[8].element_type, PCP_ELEMENT_TYPE_UNKNOWN);
  assert_int_equal(args[8].rank, -1);
  assert_string_equal(args[8].spelling, "!stablehlo.token");
  assert_string_equal(args[8].element_spelling, "");
  expect_tensor(&args[9], PCP_ELEMENT_TYPE_I32, 1, (const int64_t[]){2});
  assert_string_equal(args[9].element_spelling, "si32");
  expect_tensor(&args[10], PCP_ELEMENT_TYPE_UNKNOWN, 1, (const int64_t[]){3});
  assert_string_equal(args[10].element_spelling, "f8E4M3FN");
  expect_tensor(
      &signature.results[1], PCP_ELEMENT_TYPE_I1, 3,
      (const int64_t[]){PCP_MLIR_DYNAMIC_DIM, PCP_MLIR_DYNAMIC_DIM, 8});
  pcp_mlir_function_signature_deinitialize(&signature);
  pcp_mlir_module_release(module);
}

static void test_malformed_module(void** state) {
  PCP_UNUSED(state);
  size_t length = 0;
  char* text = read_fixture("malformed.mlir", &length);
  pcp_mlir_module_t* module = NULL;
  expect_error(pcp_mlir_module_parse(shared_context(), text, length,
                                     "malformed.mlir", &module),
               PCP_STATUS_INVALID_ARGUMENT,
               "malformed.mlir:3:31: error: ", "undeclared SSA value");
  assert_null(module);
  free(text);

  // A syntax error on line 2.
  const char* broken = "func.func @main() {\n  %0 = stablehlo.add %x,\n}\n";
  expect_error(pcp_mlir_module_parse(shared_context(), broken, strlen(broken),
                                     "broken.mlir", &module),
               PCP_STATUS_INVALID_ARGUMENT, "broken.mlir:", "error:");
  // An unknown op from a registered dialect.
  const char* unknown_op =
      "func.func @main(%x: tensor<f32>) -> tensor<f32> {\n"
      "  %y = stablehlo.frobnicate %x : tensor<f32>\n"
      "  return %y : tensor<f32>\n}\n";
  expect_error(
      pcp_mlir_module_parse(shared_context(), unknown_op, strlen(unknown_op),
                            "unknown_op.mlir", &module),
      PCP_STATUS_INVALID_ARGUMENT,
      "unknown_op.mlir:2:", "stablehlo.frobnicate");
  // The context stays usable after errors.
  pcp_mlir_module_release(parse_fixture("mlp_pretty.mlir"));
}

static void test_invalid_module(void** state) {
  PCP_UNUSED(state);
  size_t length = 0;
  char* text = read_fixture("invalid.mlir", &length);
  pcp_mlir_module_t* module = NULL;
  // Parsing runs the verifier: the return type does not match.
  expect_error(pcp_mlir_module_parse(shared_context(), text, length,
                                     "invalid.mlir", &module),
               PCP_STATUS_INVALID_ARGUMENT,
               "invalid.mlir:3:3: error: ", "return");
  assert_null(module);
  free(text);

  // A verifier error at an op carrying a JAX-style location reports the
  // Python file and line inside the name location.
  const char* located =
      "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
      "  %y = stablehlo.add %x, %x : (tensor<2xf32>, tensor<2xf32>) -> "
      "tensor<3xf32> loc(#loc2)\n"
      "  return %x : tensor<2xf32>\n}\n"
      "#loc1 = loc(\"/tmp/model.py\":12:4)\n"
      "#loc2 = loc(\"jit(f)/add\"(#loc1))\n";
  expect_error(pcp_mlir_module_parse(shared_context(), located, strlen(located),
                                     "located.mlir", &module),
               PCP_STATUS_INVALID_ARGUMENT,
               "/tmp/model.py:12:4: error: ", NULL);

  // Call-site and fused locations are unwrapped the same way; a location
  // without any file position is printed as MLIR spells it.
  static const struct {
    const char* location;
    const char* expected;
  } kCases[] = {
      {"loc(callsite(\"/tmp/a.py\":3:1 at \"/tmp/b.py\":9:2))",
       "/tmp/a.py:3:1: error: "},
      {"loc(fused[\"f\", \"/tmp/c.py\":7:5])", "/tmp/c.py:7:5: error: "},
      {"loc(\"only_a_name\")", "named.mlir: loc(\"only_a_name\"): error: "},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(kCases); ++i) {
    char source[1024];
    snprintf(source, sizeof(source),
             "func.func @main(%%x: tensor<2xf32>) -> tensor<2xf32> {\n"
             "  %%y = stablehlo.add %%x, %%x : (tensor<2xf32>, tensor<2xf32>) "
             "-> tensor<3xf32> %s\n"
             "  return %%x : tensor<2xf32>\n}\n",
             kCases[i].location);
    expect_error(pcp_mlir_module_parse(shared_context(), source, strlen(source),
                                       "named.mlir", &module),
                 PCP_STATUS_INVALID_ARGUMENT, kCases[i].expected, NULL);
  }
}

static void test_unknown_function(void** state) {
  PCP_UNUSED(state);
  pcp_mlir_module_t* module = parse_fixture("mlp_pretty.mlir");
  pcp_mlir_function_signature_t signature;
  expect_error(pcp_mlir_module_function_signature(
                   module, "predict", pcp_allocator_system(), &signature),
               PCP_STATUS_NOT_FOUND, "@predict",
               "available: @main, @relu (private), @eval");
  assert_null(signature.arguments);
  pcp_mlir_module_release(module);

  const char* empty = "module {}";
  module = parse_text(empty, strlen(empty), "empty.mlir");
  assert_int_equal(pcp_mlir_module_function_count(module), 0);
  expect_error(pcp_mlir_module_function_signature(
                   module, NULL, pcp_allocator_system(), &signature),
               PCP_STATUS_NOT_FOUND, "@main", "no func.func");
  pcp_mlir_module_release(module);

  // A long list of candidates is cut, with a count of the rest.
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &builder);
  for (int i = 0; i < 1000; ++i) {
    expect_ok(pcp_string_builder_append_f(
        &builder, "func.func @function_number_%d() {\n  return\n}\n", i));
  }
  module = parse_text(pcp_string_builder_cstring(&builder), builder.size,
                      "thousand.mlir");
  assert_int_equal(pcp_mlir_module_function_count(module), 1000);
  expect_error(pcp_mlir_module_function_signature(
                   module, NULL, pcp_allocator_system(), &signature),
               PCP_STATUS_NOT_FOUND, "available: @function_number_0, ",
               " more)");
  pcp_mlir_module_release(module);
  pcp_string_builder_deinitialize(&builder);
}

static void test_oversized_input(void** state) {
  PCP_UNUSED(state);
  // The default limit: nothing of the buffer is read (malloc does not touch
  // the pages), so this costs no real memory.
  size_t too_big = PCP_MLIR_MAX_MODULE_BYTES + 1;
  char* huge = malloc(too_big);
  assert_non_null(huge);
  pcp_mlir_module_t* module = NULL;
  expect_error(pcp_mlir_module_parse(shared_context(), huge, too_big,
                                     "huge.mlir", &module),
               PCP_STATUS_RESOURCE_EXHAUSTED, "huge.mlir", "limit");
  assert_null(module);
  free(huge);

  // A smaller configured limit.
  pcp_mlir_context_options_t options;
  pcp_mlir_context_options_initialize(&options);
  options.max_module_byte_length = 64;
  pcp_mlir_context_t* context = NULL;
  expect_ok(
      pcp_mlir_context_create(&options, pcp_allocator_system(), &context));
  const char* text =
      "func.func @main(%x: tensor<f32>) -> tensor<f32> {\n"
      "  return %x : tensor<f32>\n}\n";
  expect_error(
      pcp_mlir_module_parse(context, text, strlen(text), "small.mlir", &module),
      PCP_STATUS_RESOURCE_EXHAUSTED, "the limit is 64", NULL);
  pcp_mlir_context_release(context);
}

static void test_text_not_nul_terminated(void** state) {
  PCP_UNUSED(state);
  // Only |byte_length| bytes are the module; what follows must be ignored.
  const char* text =
      "func.func @main(%x: tensor<f32>) -> tensor<f32> {\n"
      "  return %x : tensor<f32>\n}\n"
      "this is not MLIR }}} %%%";
  size_t length = (size_t)(strstr(text, "this is") - text);
  pcp_mlir_module_t* module = parse_text(text, length, "prefix.mlir");
  assert_int_equal(pcp_mlir_module_function_count(module), 1);
  pcp_mlir_module_release(module);
}

static void test_text_function_signature(void** state) {
  PCP_UNUSED(state);
  size_t length = 0;
  char* text = read_fixture("mlp_pretty.mlir", &length);
  pcp_mlir_function_signature_t signature;
  expect_ok(pcp_mlir_text_function_signature(
      text, length, "mlp.mlir", NULL, pcp_allocator_system(), &signature));
  assert_int_equal(signature.argument_count, 4);

  // Input checks against the signature.
  const pcp_mlir_type_t* w1 = &signature.arguments[0];
  expect_ok(pcp_mlir_type_check_tensor(w1, PCP_ELEMENT_TYPE_F32, 2,
                                       (const int64_t[]){3, 4}, "argument 0"));
  expect_error(
      pcp_mlir_type_check_tensor(w1, PCP_ELEMENT_TYPE_F32, 2,
                                 (const int64_t[]){3, 5}, "argument 0"),
      PCP_STATUS_INVALID_ARGUMENT, "argument 0: expected 3x4xf32, got 3x5xf32",
      NULL);
  expect_error(pcp_mlir_type_check_tensor(w1, PCP_ELEMENT_TYPE_BF16, 2,
                                          (const int64_t[]){3, 4}, "w1"),
               PCP_STATUS_INVALID_ARGUMENT,
               "w1: expected 3x4xf32, got 3x4xbf16", NULL);
  expect_error(pcp_mlir_type_check_tensor(w1, PCP_ELEMENT_TYPE_F32, 1,
                                          (const int64_t[]){12}, "w1"),
               PCP_STATUS_INVALID_ARGUMENT, "got 12xf32", NULL);
  expect_ok(pcp_mlir_type_check_tensor(&signature.results[0],
                                       PCP_ELEMENT_TYPE_F32, 0, NULL, "loss"));
  pcp_mlir_function_signature_deinitialize(&signature);

  // Dynamic and unranked dimensions match any size.
  free(text);
  text = read_fixture("types.mlir", &length);
  expect_ok(pcp_mlir_text_function_signature(
      text, length, "types.mlir", "main", pcp_allocator_system(), &signature));
  expect_ok(pcp_mlir_type_check_tensor(&signature.arguments[0],
                                       PCP_ELEMENT_TYPE_BF16, 2,
                                       (const int64_t[]){4, 77}, "a"));
  expect_error(
      pcp_mlir_type_check_tensor(&signature.arguments[0], PCP_ELEMENT_TYPE_BF16,
                                 2, (const int64_t[]){5, 77}, "a"),
      PCP_STATUS_INVALID_ARGUMENT, "expected 4x?xbf16, got 5x77xbf16", NULL);
  expect_ok(pcp_mlir_type_check_tensor(&signature.arguments[3],
                                       PCP_ELEMENT_TYPE_F16, 3,
                                       (const int64_t[]){1, 2, 3}, "d"));
  // A scalar argument is not a tensor.
  expect_error(pcp_mlir_type_check_tensor(&signature.arguments[5],
                                          PCP_ELEMENT_TYPE_I32, 0, NULL, "f"),
               PCP_STATUS_INVALID_ARGUMENT, "f: expected i32", NULL);
  pcp_mlir_function_signature_deinitialize(&signature);

  // Errors come through the convenience unchanged.
  expect_error(
      pcp_mlir_text_function_signature(text, length, "types.mlir", "nope",
                                       pcp_allocator_system(), &signature),
      PCP_STATUS_NOT_FOUND, "@nope", NULL);
  const char* broken = "func.func @main( {";
  expect_error(pcp_mlir_text_function_signature(
                   broken, strlen(broken), "broken.mlir", NULL,
                   pcp_allocator_system(), &signature),
               PCP_STATUS_INVALID_ARGUMENT, "broken.mlir:1:", NULL);
  free(text);
}

static void test_print_respects_builder_cap(void** state) {
  PCP_UNUSED(state);
  pcp_mlir_module_t* module = parse_fixture("mlp_pretty.mlir");
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 100, &builder);
  expect_error(
      pcp_mlir_module_print(module, PCP_MLIR_PRINT_FLAG_NONE, &builder),
      PCP_STATUS_RESOURCE_EXHAUSTED, NULL, NULL);
  assert_true(builder.size <= 100);
  pcp_string_builder_deinitialize(&builder);
  pcp_mlir_module_release(module);
}

// dense_resource blobs: the file-metadata section comes back as MLIR prints
// it (and nothing for a module without resources), for a derived module to
// carry.
static void test_print_resources(void** state) {
  PCP_UNUSED(state);
  static const char kText[] =
      "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n"
      "  %0 = stablehlo.constant dense_resource<torch_tensor_2_torch.float32>"
      " : tensor<2xf32>\n"
      "  %1 = stablehlo.add %a, %0 : tensor<2xf32>\n"
      "  return %1 : tensor<2xf32>\n}\n"
      "{-#\n  dialect_resources: {\n    builtin: {\n"
      "      torch_tensor_2_torch.float32: \"0x040000000000803F00000040\"\n"
      "    }\n  }\n#-}\n";
  pcp_mlir_module_t* module =
      parse_text(kText, sizeof(kText) - 1, "resources.mlir");
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 1 << 20, &builder);
  expect_ok(pcp_mlir_module_print_resources(module, &builder));
  const char* text = pcp_string_builder_cstring(&builder);
  assert_true(strncmp(text, "{-#", 3) == 0);
  assert_non_null(strstr(text, "dialect_resources"));
  assert_non_null(strstr(text,
                         "torch_tensor_2_torch.float32: "
                         "\"0x040000000000803F00000040\""));
  assert_non_null(strstr(text, "#-}"));
  assert_null(strstr(text, "stablehlo"));  // the ops are not kept
  pcp_string_builder_deinitialize(&builder);
  pcp_mlir_module_release(module);

  module = parse_fixture("mlp_pretty.mlir");
  pcp_string_builder_initialize(pcp_allocator_system(), 1 << 20, &builder);
  expect_ok(pcp_mlir_module_print_resources(module, &builder));
  assert_int_equal(builder.size, 0);
  pcp_string_builder_deinitialize(&builder);
  pcp_mlir_module_release(module);
}

// The body walk: value numbering, operands, printed attributes, one-block
// regions (reduce) and locations.
static void test_function_body(void** state) {
  (void)state;
  static const char kText[] =
      "func.func @main(%x: tensor<2x3xf32>, %i: tensor<2xi32>) -> "
      "tensor<2xf32> {\n"
      "  %z = stablehlo.constant dense<0.0> : tensor<f32>\n"
      "  %0 = stablehlo.reduce(%x init: %z) applies stablehlo.add across "
      "dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>\n"
      "  return %0 : tensor<2xf32>\n"
      "}\n";
  pcp_mlir_module_t* module = parse_text(kText, sizeof(kText) - 1, "body.mlir");
  pcp_mlir_function_body_t body;
  expect_ok(pcp_mlir_module_function_body(module, NULL, pcp_allocator_system(),
                                          &body));
  // Entry block: 2 args, 3 ops (constant, reduce, return); the reduce's
  // region is block 1 with 2 args and 2 ops (add, return).
  assert_int_equal(body.block_count, 2);
  assert_int_equal(body.blocks[0].argument_count, 2);
  assert_int_equal(body.blocks[0].first_argument, 0);
  assert_int_equal(body.blocks[0].op_count, 3);
  const pcp_mlir_op_t* constant = &body.ops[body.blocks[0].first_op];
  const pcp_mlir_op_t* reduce = constant + 1;
  const pcp_mlir_op_t* ret = constant + 2;
  assert_string_equal(constant->name, "stablehlo.constant");
  assert_non_null(strstr(constant->properties, "dense<0.000000e+00>"));
  assert_string_equal(reduce->name, "stablehlo.reduce");
  assert_int_equal(strncmp(reduce->location, "body.mlir:3:", 12), 0);
  assert_non_null(strstr(reduce->properties, "dimensions = array<i64: 1>"));
  assert_string_equal(reduce->attributes, "");
  assert_int_equal(reduce->operand_count, 2);
  assert_int_equal(body.operands[reduce->first_operand], 0);
  assert_int_equal(body.operands[reduce->first_operand + 1],
                   constant->first_result);
  assert_int_equal(reduce->region_count, 1);
  const pcp_mlir_block_t* region = &body.blocks[reduce->first_block];
  assert_int_equal(region->argument_count, 2);
  assert_int_equal(region->op_count, 2);
  assert_string_equal(body.ops[region->first_op].name, "stablehlo.add");
  assert_string_equal(ret->name, "func.return");
  assert_int_equal(body.operands[ret->first_operand], reduce->first_result);
  static const int64_t kDims[] = {2};
  expect_tensor(&body.values[reduce->first_result], PCP_ELEMENT_TYPE_F32, 1,
                kDims);
  assert_string_equal(body.values[1].spelling, "tensor<2xi32>");
  pcp_mlir_function_body_deinitialize(&body);
  expect_error(pcp_mlir_module_function_body(module, "nope",
                                             pcp_allocator_system(), &body),
               PCP_STATUS_NOT_FOUND, "nope", "main");
  pcp_mlir_function_body_deinitialize(&body);
  pcp_mlir_module_release(module);
}

static void test_many_diagnostics_are_capped(void** state) {
  PCP_UNUSED(state);
  // Thousands of verifier errors: the message stays bounded.
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &builder);
  for (int i = 0; i < 3000; ++i) {
    expect_ok(pcp_string_builder_append_f(
        &builder,
        "func.func @f%d(%%x: tensor<2xf32>) -> tensor<3xf32> {\n"
        "  return %%x : tensor<2xf32>\n}\n",
        i));
  }
  pcp_mlir_module_t* module = NULL;
  pcp_status_t status = pcp_mlir_module_parse(
      shared_context(), pcp_string_builder_cstring(&builder), builder.size,
      "many.mlir", &module);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_true(strlen(pcp_status_message(status)) < (80u << 10));
  pcp_status_ignore(status);
  pcp_string_builder_deinitialize(&builder);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_concurrent_first_use),
      cmocka_unit_test(test_library_loaded),
      cmocka_unit_test(test_pretty_module),
      cmocka_unit_test(test_generic_roundtrip),
      cmocka_unit_test(test_jax_module),
      cmocka_unit_test(test_torch_mlir_style_module),
      cmocka_unit_test(test_signature_types),
      cmocka_unit_test(test_malformed_module),
      cmocka_unit_test(test_invalid_module),
      cmocka_unit_test(test_unknown_function),
      cmocka_unit_test(test_oversized_input),
      cmocka_unit_test(test_text_not_nul_terminated),
      cmocka_unit_test(test_text_function_signature),
      cmocka_unit_test(test_print_respects_builder_cap),
      cmocka_unit_test(test_many_diagnostics_are_capped),
      cmocka_unit_test(test_function_body),
      cmocka_unit_test(test_print_resources),
  };
  return cmocka_run_group_tests(tests, setup_context, teardown_context);
}
