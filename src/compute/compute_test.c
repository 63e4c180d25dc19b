// SPDX-License-Identifier: Apache-2.0
// pcp_backend_t over real IREE (CPU): programs compiled by the real compiler.

#include "compute/compute.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "compile/compile.h"
#include "compute/compute_impl.h"

static pcp_backend_t* g_backend;

static void fail_status(pcp_status_t status, const char* what) {
  if (!status)
    return;
  char text[4096];
  pcp_status_format(status, text, sizeof(text));
  fail_msg("%s: %s", what, text);
}

static pcp_program_t* load_module(const char* mlir) {
  pcp_compile_request_t request = {.mlir_text = mlir,
                                   .mlir_byte_length = strlen(mlir),
                                   .source_name = "test.mlir",
                                   .backend = PCP_COMPILE_BACKEND_CPU};
  pcp_compile_result_t compiled;
  fail_status(pcp_compile_module(&request, &compiled), "compile");
  pcp_program_t* program = NULL;
  fail_status(pcp_program_load(g_backend, compiled.vmfb,
                               compiled.vmfb_byte_length, &program),
              "load");
  pcp_compile_result_deinitialize(&compiled);
  return program;
}

static int setup(void** state) {
  (void)state;
  pcp_backend_options_t options = {.driver = "cpu"};
  pcp_status_t status = pcp_backend_create(&options, &g_backend);
  if (status) {
    char text[2048];
    pcp_status_format(status, text, sizeof(text));
    fprintf(stderr, "backend: %s\n", text);
    pcp_status_ignore(status);
    return -1;
  }
  return 0;
}

static int teardown(void** state) {
  (void)state;
  pcp_backend_release(g_backend);
  return 0;
}

static const char kAffine[] =
    "func.func @affine(%x: tensor<2x3xf32>, %w: tensor<3x2xf32>, %b: "
    "tensor<2xf32>)"
    " -> tensor<2x2xf32> {\n"
    "  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] :"
    " (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>\n"
    "  %1 = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<2xf32>) -> "
    "tensor<2x2xf32>\n"
    "  %2 = stablehlo.add %0, %1 : tensor<2x2xf32>\n"
    "  return %2 : tensor<2x2xf32>\n}\n"
    "func.func @twice(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<f32>) {\n"
    "  %0 = stablehlo.add %x, %x : tensor<4xf32>\n"
    "  %z = stablehlo.constant dense<0.0> : tensor<f32>\n"
    "  %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across "
    "dimensions = [0]"
    " : (tensor<4xf32>, tensor<f32>) -> tensor<f32>\n"
    "  return %0, %1 : tensor<4xf32>, tensor<f32>\n}\n";

static void invokes_with_host_and_resident_inputs(void** state) {
  (void)state;
  pcp_program_t* program = load_module(kAffine);
  assert_int_equal(pcp_program_function_count(program), 2);
  pcp_function_signature_t sig;
  fail_status(pcp_program_function_signature(program, "affine", &sig), "sig");
  assert_int_equal(sig.input_count, 3);
  assert_int_equal(sig.result_count, 1);
  assert_int_equal(sig.inputs[0].rank, 2);
  assert_int_equal(sig.inputs[0].dims[1], 3);
  assert_int_equal(sig.inputs[0].element_type, PCP_ELEMENT_TYPE_F32);

  float x[6] = {1, 2, 3, 4, 5, 6}, w[6] = {1, 0, 0, 1, 1, 1}, b[2] = {10, 20};
  pcp_tensor_shape_t sx = {PCP_ELEMENT_TYPE_F32, 2, {2, 3}};
  pcp_tensor_shape_t sw = {PCP_ELEMENT_TYPE_F32, 2, {3, 2}};
  pcp_tensor_shape_t sb = {PCP_ELEMENT_TYPE_F32, 1, {2}};
  pcp_host_tensor_t hx, hw, hb;
  fail_status(pcp_host_tensor_wrap(&sx, x, sizeof(x), &hx), "wrap");
  fail_status(pcp_host_tensor_wrap(&sw, w, sizeof(w), &hw), "wrap");
  fail_status(pcp_host_tensor_wrap(&sb, b, sizeof(b), &hb), "wrap");
  pcp_tensor_t* resident_w = NULL;
  fail_status(pcp_tensor_upload(g_backend, &hw, &resident_w), "upload");
  pcp_value_t inputs[3] = {pcp_value_host(&hx), pcp_value_resident(resident_w),
                           pcp_value_host(&hb)};
  pcp_tensor_t* results[4];
  size_t count = 0;
  fail_status(
      pcp_program_invoke(program, "affine", inputs, 3, results, 4, &count),
      "invoke");
  assert_int_equal(count, 1);
  float y[4];
  fail_status(pcp_tensor_download(results[0], y, sizeof(y)), "download");
  // x @ w + b: rows [1+3, 2+3] and [4+6, 5+6] plus [10, 20].
  const float expected[4] = {14, 25, 20, 31};
  for (int i = 0; i < 4; ++i) assert_true(y[i] == expected[i]);

  // A result fed back as a resident input, no host round trip.
  pcp_tensor_t* twice[2];
  float v[4] = {1, 2, 3, 4};
  pcp_tensor_shape_t sv = {PCP_ELEMENT_TYPE_F32, 1, {4}};
  pcp_host_tensor_t hv;
  fail_status(pcp_host_tensor_wrap(&sv, v, sizeof(v), &hv), "wrap");
  pcp_value_t in1 = pcp_value_host(&hv);
  fail_status(pcp_program_invoke(program, "twice", &in1, 1, twice, 2, &count),
              "twice");
  pcp_value_t in2 = pcp_value_resident(twice[0]);
  pcp_tensor_t* again[2];
  fail_status(pcp_program_invoke(program, "twice", &in2, 1, again, 2, &count),
              "again");
  float sum = 0;
  fail_status(pcp_tensor_download(again[1], &sum, sizeof(sum)), "sum");
  assert_true(sum == 40.0f);
  assert_int_equal(pcp_tensor_shape(again[1])->rank, 0);
  for (int i = 0; i < 2; ++i) {
    pcp_tensor_release(twice[i]);
    pcp_tensor_release(again[i]);
  }
  pcp_tensor_release(results[0]);
  pcp_tensor_release(resident_w);
  pcp_program_release(program);
}

static const char kIdentities[] =
    "func.func @ids(%a: tensor<3xbf16>, %b: tensor<2xf16>, %c: tensor<4xi1>,"
    " %d: tensor<2xi32>, %e: tensor<2xi64>, %f: tensor<?x2xf32>) ->"
    " (tensor<3xbf16>, tensor<2xf16>, tensor<4xi1>, tensor<2xi32>, "
    "tensor<2xi64>,"
    " tensor<?x2xf32>) {\n"
    "  %0 = stablehlo.not %c : tensor<4xi1>\n"
    "  return %a, %b, %0, %d, %e, %f : tensor<3xbf16>, tensor<2xf16>, "
    "tensor<4xi1>,"
    " tensor<2xi32>, tensor<2xi64>, tensor<?x2xf32>\n}\n";

static void every_dtype_round_trips(void** state) {
  (void)state;
  pcp_program_t* program = load_module(kIdentities);
  const char* texts[6] = {"3xbf16=1.5,-2,0.25",  "2xf16=0.5,-65504",
                          "4xi1=1,0,true,false", "2xi32=-7,2147483647",
                          "2xi64=-9000000000,5", "3x2xf32=1,2,3,4,5,6"};
  pcp_host_tensor_t hosts[6];
  pcp_value_t values[6];
  for (int i = 0; i < 6; ++i) {
    fail_status(pcp_host_tensor_parse(texts[i], &hosts[i]), texts[i]);
    values[i] = pcp_value_host(&hosts[i]);
  }
  pcp_tensor_t* results[6];
  size_t count = 0;
  fail_status(pcp_program_invoke(program, "ids", values, 6, results, 6, &count),
              "ids");
  assert_int_equal(count, 6);
  for (int i = 0; i < 6; ++i) {
    pcp_host_tensor_t out;
    fail_status(pcp_tensor_download_host(results[i], &out), "download");
    assert_true(pcp_tensor_shape_equal(&out.shape, &hosts[i].shape));
    if (i == 2) {
      const uint8_t negated[4] = {0, 1, 0, 1};
      assert_memory_equal(out.data, negated, 4);
    } else {
      assert_memory_equal(out.data, hosts[i].data, hosts[i].byte_length);
    }
    pcp_host_tensor_deinitialize(&out);
    pcp_tensor_release(results[i]);
    pcp_host_tensor_deinitialize(&hosts[i]);
  }
  pcp_program_release(program);
}

// The allocator's statistics see a real device buffer: uploading 1 MiB
// raises the live device bytes by at least that much (the allocation, not
// a shape product) and releasing it gives them back.
static void allocator_statistics_count_real_buffers(void** state) {
  (void)state;
  pcp_backend_memory_t before, during, after;
  fail_status(pcp_backend_memory_query(g_backend, &before), "memory");
  pcp_host_tensor_t host;
  pcp_tensor_shape_t shape = {
      .element_type = PCP_ELEMENT_TYPE_F32, .rank = 2, .dims = {512, 512}};
  fail_status(pcp_host_tensor_allocate(&shape, &host), "allocate");
  memset(host.data, 0, host.byte_length);
  pcp_tensor_t* tensor = NULL;
  fail_status(pcp_tensor_upload(g_backend, &host, &tensor), "upload");
  fail_status(pcp_backend_memory_query(g_backend, &during), "memory");
  assert_true(during.device_bytes_live >=
              before.device_bytes_live + (1u << 20));
  assert_true(during.device_bytes_live < before.device_bytes_live + (2u << 20));
  assert_true(during.device_bytes_peak >= during.device_bytes_live);
  assert_true(during.device_bytes_allocated >=
              before.device_bytes_allocated + (1u << 20));
  pcp_tensor_release(tensor);
  pcp_host_tensor_deinitialize(&host);
  fail_status(pcp_backend_memory_query(g_backend, &after), "memory");
  assert_int_equal(after.device_bytes_live, before.device_bytes_live);
}

static long rss_kib(void) {
  FILE* f = fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;
  while (f && fgets(line, sizeof(line), f)) {
    if (strncmp(line, "VmRSS:", 6) == 0)
      kib = strtol(line + 6, NULL, 10);
  }
  if (f)
    fclose(f);
  return kib;
}

static void resident_tensors_survive_1000_calls_with_flat_memory(void** state) {
  (void)state;
  pcp_program_t* program = load_module(
      "func.func @step(%p: tensor<256x256xf32>, %g: tensor<256x256xf32>) ->"
      " tensor<256x256xf32> {\n"
      "  %0 = stablehlo.subtract %p, %g : tensor<256x256xf32>\n"
      "  return %0 : tensor<256x256xf32>\n}\n");
  pcp_tensor_shape_t shape = {PCP_ELEMENT_TYPE_F32, 2, {256, 256}};
  pcp_host_tensor_t ones;
  fail_status(pcp_host_tensor_allocate(&shape, &ones), "alloc");
  float* data = ones.data;
  for (int i = 0; i < 256 * 256; ++i) data[i] = 1.0f / 1024.0f;
  pcp_tensor_t* gradient = NULL;
  pcp_tensor_t* params = NULL;
  fail_status(pcp_tensor_upload(g_backend, &ones, &gradient), "upload");
  for (int i = 0; i < 256 * 256; ++i) data[i] = 2.0f;
  fail_status(pcp_tensor_upload(g_backend, &ones, &params), "upload");
  long rss_after_warmup = 0;
  for (int step = 0; step < 1000; ++step) {
    pcp_value_t inputs[2] = {pcp_value_resident(params),
                             pcp_value_resident(gradient)};
    pcp_tensor_t* next = NULL;
    size_t count = 0;
    fail_status(
        pcp_program_invoke(program, "step", inputs, 2, &next, 1, &count),
        "step");
    pcp_tensor_release(params);  // the old parameters die here
    params = next;
    if (step == 99)
      rss_after_warmup = rss_kib();
  }
  long rss_end = rss_kib();
  pcp_host_tensor_t out;
  fail_status(pcp_tensor_download_host(params, &out), "download");
  // 2 - 1000/1024, exactly representable at every step.
  float expected = 2.0f - 1000.0f / 1024.0f;
  for (int i = 0; i < 256 * 256; i += 4097) {
    assert_true(((float*)out.data)[i] == expected);
  }
  // Each leaked step would hold a 256 KiB buffer: 900 of them is 225 MiB.
  // Allow 8 MiB of allocator noise.
  fprintf(stderr, "rss after 100 steps %ld KiB, after 1000 %ld KiB\n",
          rss_after_warmup, rss_end);
  assert_true(rss_end - rss_after_warmup < 8 * 1024);
  pcp_host_tensor_deinitialize(&out);
  pcp_host_tensor_deinitialize(&ones);
  pcp_tensor_release(params);
  pcp_tensor_release(gradient);
  pcp_program_release(program);
}

static void bad_calls_are_clear_errors(void** state) {
  (void)state;
  pcp_program_t* program = load_module(kAffine);
  pcp_tensor_t* results[4];
  size_t count = 0;
  pcp_status_t s =
      pcp_program_invoke(program, "nope", NULL, 0, results, 4, &count);
  assert_int_equal(pcp_status_code(s), PCP_STATUS_NOT_FOUND);
  assert_non_null(
      strstr(pcp_status_message(s), "affine"));  // lists what exists
  pcp_status_ignore(s);

  pcp_host_tensor_t v;
  fail_status(pcp_host_tensor_parse("4xf32=1", &v), "parse");
  pcp_value_t one = pcp_value_host(&v);
  s = pcp_program_invoke(program, "affine", &one, 1, results, 4, &count);
  assert_int_equal(pcp_status_code(s), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(s), "takes 3 inputs, got 1"));
  pcp_status_ignore(s);

  pcp_host_tensor_t wrong_shape, wrong_type;
  fail_status(pcp_host_tensor_parse("3xf32=1", &wrong_shape), "parse");
  fail_status(pcp_host_tensor_parse("4xi32=1", &wrong_type), "parse");
  pcp_value_t in = pcp_value_host(&wrong_shape);
  s = pcp_program_invoke(program, "twice", &in, 1, results, 4, &count);
  assert_int_equal(pcp_status_code(s), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(s), "expected 4xf32, got 3xf32"));
  pcp_status_ignore(s);
  in = pcp_value_host(&wrong_type);
  s = pcp_program_invoke(program, "twice", &in, 1, results, 4, &count);
  assert_int_equal(pcp_status_code(s), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(s), "expected 4xf32, got 4xi32"));
  pcp_status_ignore(s);
  pcp_host_tensor_deinitialize(&v);
  pcp_host_tensor_deinitialize(&wrong_shape);
  pcp_host_tensor_deinitialize(&wrong_type);

  // Garbage instead of a VMFB.
  pcp_program_t* bad = NULL;
  char garbage[256];
  memset(garbage, 'x', sizeof(garbage));
  s = pcp_program_load(g_backend, garbage, sizeof(garbage), &bad);
  assert_int_equal(pcp_status_code(s), PCP_STATUS_INVALID_ARGUMENT);
  assert_null(bad);
  pcp_status_ignore(s);
  pcp_program_release(program);
}

static void unknown_or_absent_devices_are_clear_errors(void** state) {
  (void)state;
  pcp_backend_t* backend = NULL;
  pcp_backend_options_t options = {.driver = "tpu"};
  pcp_status_t s = pcp_backend_create(&options, &backend);
  assert_int_equal(pcp_status_code(s), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(s), "unknown device driver 'tpu'"));
  pcp_status_ignore(s);
  options = (pcp_backend_options_t){.driver = "cpu", .device_ordinal = 3};
  s = pcp_backend_create(&options, &backend);
  assert_int_equal(pcp_status_code(s), PCP_STATUS_NOT_FOUND);
  pcp_status_ignore(s);
  // No GPU on this machine: a clear UNAVAILABLE or NOT_FOUND, no crash. (If
  // a machine has one, creating it must work.)
  options = (pcp_backend_options_t){.driver = "cuda", .device_ordinal = 0};
  s = pcp_backend_create(&options, &backend);
  if (s) {
    pcp_status_code_t code = pcp_status_code(s);
    assert_true(code == PCP_STATUS_UNAVAILABLE || code == PCP_STATUS_NOT_FOUND);
    pcp_status_ignore(s);
  } else {
    pcp_backend_release(backend);
  }
}

static void abi_declarations_parse(void** state) {
  (void)state;
  pcp_function_signature_t sig = {.input_count = 2, .result_count = 1};
  fail_status(pcp_compute_parse_abi_declaration(
                  "sync func @f(%input0: tensor<?x4xbf16>, %input1: i32) -> "
                  "(%output0: tensor<f32>)",
                  &sig),
              "parse");
  assert_int_equal(sig.inputs[0].rank, 2);
  assert_int_equal(sig.inputs[0].dims[0], -1);
  assert_int_equal(sig.inputs[0].element_type, PCP_ELEMENT_TYPE_BF16);
  assert_int_equal(sig.inputs[1].rank, -1);
  assert_int_equal(sig.results[0].rank, 0);
}

static void host_tensor_text_and_npy(void** state) {
  (void)state;
  pcp_host_tensor_t t;
  fail_status(pcp_host_tensor_parse("2x2xi32=[[1 2][3 4]]", &t), "parse");
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &b);
  fail_status(pcp_host_tensor_format(&t, 100, &b), "format");
  assert_string_equal(pcp_string_builder_cstring(&b), "2x2xi32=[1 2][3 4]");
  char path[] = "/tmp/pcp-npy-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  fail_status(pcp_host_tensor_write_npy(&t, path, false), "write");
  pcp_host_tensor_t back;
  fail_status(pcp_host_tensor_read_npy(path, PCP_ELEMENT_TYPE_UNKNOWN, &back),
              "read");
  assert_true(pcp_tensor_shape_equal(&t.shape, &back.shape));
  assert_memory_equal(t.data, back.data, t.byte_length);
  pcp_host_tensor_deinitialize(&back);
  // A truncated file is refused before any large allocation.
  assert_int_equal(truncate(path, 80), 0);
  pcp_status_t s =
      pcp_host_tensor_read_npy(path, PCP_ELEMENT_TYPE_UNKNOWN, &back);
  assert_int_equal(pcp_status_consume_code(s), PCP_STATUS_INVALID_ARGUMENT);
  unlink(path);
  close(fd);
  // Text errors.
  const char* bad[] = {"2x2xi32=1,2,3",    "4xf99=1", "2xi8=1,300",
                       "4xf32=1,x,2,3",    "1x2",     "-1xf32=1",
                       "@/nonexistent.npy"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(bad); ++i) {
    s = pcp_host_tensor_parse(bad[i], &back);
    assert_true(s != NULL);
    pcp_status_ignore(s);
  }
  // f16 / bf16 conversions against known bit patterns.
  assert_int_equal(pcp_f32_to_f16(1.0f), 0x3C00);
  assert_int_equal(pcp_f32_to_f16(65504.0f), 0x7BFF);
  assert_int_equal(pcp_f32_to_f16(1e-7f), 0x0002);  // subnormal
  assert_true(pcp_f16_to_f32(0x3555) > 0.333f &&
              pcp_f16_to_f32(0x3555) < 0.3334f);
  assert_int_equal(pcp_f32_to_bf16(1.0f), 0x3F80);
  assert_true(pcp_bf16_to_f32(0x4049) == 3.140625f);
  pcp_string_builder_deinitialize(&b);
  pcp_host_tensor_deinitialize(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(abi_declarations_parse),
      cmocka_unit_test(host_tensor_text_and_npy),
      cmocka_unit_test(invokes_with_host_and_resident_inputs),
      cmocka_unit_test(every_dtype_round_trips),
      cmocka_unit_test(allocator_statistics_count_real_buffers),
      cmocka_unit_test(resident_tensors_survive_1000_calls_with_flat_memory),
      cmocka_unit_test(bad_calls_are_clear_errors),
      cmocka_unit_test(unknown_or_absent_devices_are_clear_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
