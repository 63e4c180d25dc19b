// SPDX-License-Identifier: Apache-2.0
//
// OOM sweeps (SQLite style) over PCP's own host memory in compute: host
// tensors (text, raw files, .npy) and a backend over real IREE (CPU) with a
// program compiled by the real compiler. Allocation N fails (and every one
// after it) for every N until the scenario succeeds; each failure must be
// RESOURCE_EXHAUSTED, never a crash, and after the scenario released
// everything the counting allocator behind the failing one must hold
// nothing. IREE's own allocations are IREE's and not counted here.

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compile/compile.h"
#include "compute/compute.h"

static char g_directory[256];
static char g_npy_path[300];
static char g_raw_path[300];
static pcp_compile_result_t g_compiled;

static const char kTwice[] =
    "func.func @twice(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<f32>) {\n"
    "  %0 = stablehlo.add %x, %x : tensor<4xf32>\n"
    "  %z = stablehlo.constant dense<0.0> : tensor<f32>\n"
    "  %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across "
    "dimensions = [0]"
    " : (tensor<4xf32>, tensor<f32>) -> tensor<f32>\n"
    "  return %0, %1 : tensor<4xf32>, tensor<f32>\n}\n"
    "func.func @other(%x: tensor<f32>) -> tensor<f32> {\n"
    "  return %x : tensor<f32>\n}\n";

static void check_ok(pcp_status_t status, const char* what) {
  if (!status)
    return;
  char text[4096];
  pcp_status_format(status, text, sizeof(text));
  pcp_status_ignore(status);
  fail_msg("%s: %s", what, text);
}

typedef pcp_status_t (*scenario_fn_t)(pcp_allocator_t allocator);

static void sweep(const char* name, scenario_fn_t fn) {
  pcp_allocator_counting_t counter;
  pcp_allocator_counting_initialize(pcp_allocator_system(), &counter);
  pcp_allocator_failing_t never;
  pcp_allocator_failing_initialize(pcp_allocator_counting(&counter), -1, false,
                                   &never);
  check_ok(fn(pcp_allocator_failing(&never)), name);
  assert_int_equal(counter.live_bytes, 0);
  int64_t total = never.request_count;
  assert_true(total > 0);
  for (int64_t n = 0; n < total; ++n) {
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_counting(&counter), n, true,
                                     &failing);
    pcp_status_t status = fn(pcp_allocator_failing(&failing));
    if (counter.live_bytes != 0) {
      fail_msg("%s: allocation %lld failed; %lld bytes left behind", name,
               (long long)n, (long long)counter.live_bytes);
    }
    if (!status) {
      fail_msg("%s: allocation %lld failed, yet the call succeeded", name,
               (long long)n);
    }
    pcp_status_code_t code = pcp_status_consume_code(status);
    if (code != PCP_STATUS_RESOURCE_EXHAUSTED) {
      fail_msg("%s: allocation %lld failed with %s", name, (long long)n,
               pcp_status_code_string(code));
    }
  }
}

//===----------------------------------------------------------------------===//
// Host tensors
//===----------------------------------------------------------------------===//

static pcp_status_t host_tensor_scenario(pcp_allocator_t allocator) {
  char raw_input[320], npy_input[320];
  snprintf(raw_input, sizeof(raw_input), "2xf32=@%s", g_raw_path);
  snprintf(npy_input, sizeof(npy_input), "@%s", g_npy_path);
  const char* inputs[] = {"2x3xf32=1,2,3,4,5,6", "4xi32=7", raw_input,
                          npy_input};
  pcp_host_tensor_t tensors[PCP_ARRAYSIZE(inputs) + 1];
  memset(tensors, 0, sizeof(tensors));
  pcp_status_t status = pcp_ok_status();
  size_t parsed = 0;
  for (; !status && parsed < PCP_ARRAYSIZE(inputs); ++parsed) {
    status = pcp_host_tensor_parse_with_allocator(inputs[parsed], allocator,
                                                  &tensors[parsed]);
  }
  if (!status) {
    status = pcp_host_tensor_read_npy_with_allocator(
        g_npy_path, PCP_ELEMENT_TYPE_F32, allocator, &tensors[parsed++]);
  }
  if (!status) {
    // Storage is 64-byte aligned inside the allocator's block, zeroed
    // where nothing was parsed, and holds the values.
    for (size_t i = 0; i < parsed; ++i) {
      assert_int_equal((uintptr_t)tensors[i].data % 64, 0);
    }
    const int32_t* ints = tensors[1].data;
    assert_int_equal(ints[3], 7);
    const float* raw = tensors[2].data;
    assert_true(raw[0] == 1.5f && raw[1] == -2.0f);
    const float* npy = tensors[4].data;
    assert_true(npy[2] == 3.0f);
  }
  for (size_t i = 0; i < parsed; ++i) {
    pcp_host_tensor_deinitialize(&tensors[i]);
  }
  return status;
}

static void host_tensors_survive_every_failed_allocation(void** state) {
  (void)state;
  sweep("host tensors", host_tensor_scenario);
}

//===----------------------------------------------------------------------===//
// Backend
//===----------------------------------------------------------------------===//

static pcp_status_t backend_scenario(pcp_allocator_t allocator) {
  pcp_backend_options_t options = {.driver = "cpu", .allocator = allocator};
  pcp_backend_t* backend = NULL;
  pcp_program_t* program = NULL;
  pcp_tensor_t* resident = NULL;
  pcp_tensor_t* results[2] = {NULL, NULL};
  size_t result_count = 0;
  pcp_host_tensor_t input, sum;
  memset(&input, 0, sizeof(input));
  memset(&sum, 0, sizeof(sum));
  pcp_status_t status = pcp_backend_create(&options, &backend);
  if (!status) {
    status = pcp_program_load(backend, g_compiled.vmfb,
                              g_compiled.vmfb_byte_length, &program);
  }
  if (!status) {
    assert_int_equal(pcp_program_function_count(program), 2);
    status = pcp_host_tensor_parse_with_allocator("4xf32=1,2,3,4", allocator,
                                                  &input);
  }
  if (!status)
    status = pcp_tensor_upload(backend, &input, &resident);
  if (!status) {
    pcp_function_signature_t signature;
    status = pcp_program_function_signature(program, "other", &signature);
  }
  if (!status) {
    pcp_value_t value = pcp_value_resident(resident);
    status = pcp_program_invoke(program, "twice", &value, 1, results, 2,
                                &result_count);
  }
  if (!status)
    status = pcp_tensor_download_host(results[1], &sum);
  if (!status) {
    assert_true(*(const float*)sum.data == 20.0f);
  }
  pcp_host_tensor_deinitialize(&sum);
  for (size_t i = 0; i < result_count; ++i) pcp_tensor_release(results[i]);
  pcp_tensor_release(resident);
  pcp_host_tensor_deinitialize(&input);
  pcp_program_release(program);
  pcp_backend_release(backend);
  return status;
}

static void backend_survives_every_failed_allocation(void** state) {
  (void)state;
  sweep("backend", backend_scenario);
}

//===----------------------------------------------------------------------===//
// Fixtures
//===----------------------------------------------------------------------===//

static int setup(void** state) {
  (void)state;
  snprintf(g_directory, sizeof(g_directory), "/tmp/pcp_compute_oom_XXXXXX");
  if (!mkdtemp(g_directory))
    return -1;
  snprintf(g_raw_path, sizeof(g_raw_path), "%s/in.bin", g_directory);
  snprintf(g_npy_path, sizeof(g_npy_path), "%s/in.npy", g_directory);
  const float raw[2] = {1.5f, -2.0f};
  FILE* f = fopen(g_raw_path, "wb");
  if (!f || fwrite(raw, sizeof(raw), 1, f) != 1)
    return -1;
  fclose(f);
  float values[3] = {1, 2, 3};
  pcp_tensor_shape_t shape = {PCP_ELEMENT_TYPE_F32, 1, {3}};
  pcp_host_tensor_t tensor;
  pcp_status_t status =
      pcp_host_tensor_wrap(&shape, values, sizeof(values), &tensor);
  if (!status)
    status = pcp_host_tensor_write_npy(&tensor, g_npy_path, false);
  if (!status) {
    pcp_compile_request_t request = {.mlir_text = kTwice,
                                     .mlir_byte_length = strlen(kTwice),
                                     .source_name = "oom.mlir",
                                     .backend = PCP_COMPILE_BACKEND_CPU};
    status = pcp_compile_module(&request, &g_compiled);
  }
  if (status) {
    char text[4096];
    pcp_status_format(status, text, sizeof(text));
    fprintf(stderr, "setup: %s\n", text);
    pcp_status_ignore(status);
    return -1;
  }
  return 0;
}

static int teardown(void** state) {
  (void)state;
  pcp_compile_result_deinitialize(&g_compiled);
  unlink(g_raw_path);
  unlink(g_npy_path);
  rmdir(g_directory);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(host_tensors_survive_every_failed_allocation),
      cmocka_unit_test(backend_survives_every_failed_allocation),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
