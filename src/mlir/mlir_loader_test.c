// SPDX-License-Identifier: Apache-2.0
//
// The loader's failure paths. The library is loaded once per process, so
// each case is its own ctest entry running this executable with
// PCP_IREE_COMPILER_LIB pointing at something that is not a usable
// libIREECompiler.so, and PCP_TEST_EXPECTED_CODE naming the status code it
// must produce (NOT_FOUND, FAILED_PRECONDITION, INCOMPATIBLE).

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
// clang-format on

#include <stdlib.h>
#include <string.h>

#include "mlir/mlir.h"

static void expect_load_error(pcp_status_t status) {
  const char* path = getenv(PCP_MLIR_COMPILER_LIB_ENV);
  const char* expected_name = getenv("PCP_TEST_EXPECTED_CODE");
  assert_non_null(path);
  assert_non_null(expected_name);
  pcp_status_code_t expected = PCP_STATUS_OK;
  assert_true(pcp_status_code_from_string(expected_name, &expected));
  assert_non_null(status);
  char* text = pcp_status_to_string(status);
  assert_non_null(text);
  if (pcp_status_code(status) != expected) {
    fail_msg("expected %s, got: %s", expected_name, text);
  }
  // The message says which file and how to point PCP elsewhere.
  if (!strstr(text, path)) {
    fail_msg("'%s' not in: %s", path, text);
  }
  if (!strstr(text, PCP_MLIR_COMPILER_LIB_ENV)) {
    fail_msg("'%s' not in: %s", PCP_MLIR_COMPILER_LIB_ENV, text);
  }
  free(text);
  pcp_status_ignore(status);
}

static void test_load_fails_cleanly(void** state) {
  PCP_UNUSED(state);
  expect_load_error(pcp_mlir_library_load());
  // The failure is cached and reported again, not retried or crashed on.
  expect_load_error(pcp_mlir_library_load());
  assert_null(pcp_mlir_library_path());
  assert_int_equal(pcp_mlir_library_api_version(), 0);
  assert_string_equal(pcp_mlir_library_revision(), "");
}

static void test_every_entry_point_reports_it(void** state) {
  PCP_UNUSED(state);
  pcp_mlir_context_t* context = NULL;
  expect_load_error(
      pcp_mlir_context_create(NULL, pcp_allocator_system(), &context));
  assert_null(context);
  const char* text = "func.func @main() { return }";
  pcp_mlir_function_signature_t signature;
  expect_load_error(pcp_mlir_text_function_signature(
      text, strlen(text), "x.mlir", NULL, pcp_allocator_system(), &signature));
  assert_int_equal(signature.argument_count, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_load_fails_cleanly),
      cmocka_unit_test(test_every_entry_point_reports_it),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
