// SPDX-License-Identifier: Apache-2.0
// `pcp run`: load a VMFB (or compile a .mlir first), invoke one function,
// print or save the results the way iree-run-module does.

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/compile.h"
#include "compute/compute.h"
#include "config/config.h"

typedef struct run_options_t {
  char* function;
  pcp_string_list_t inputs;
  pcp_string_list_t outputs;
  char* device;
  int64_t print_max_elements;
  int64_t cpu_threads;
  bool help;
} run_options_t;

#define OFFSET(member) offsetof(run_options_t, member)

static const pcp_config_field_t kFields[] = {
    {.name = "function",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(function),
     .default_value = "main",
     .value_name = "NAME",
     .help = "function to invoke"},
    {.name = "input",
     .type = PCP_CONFIG_TYPE_STRING_LIST,
     .offset = OFFSET(inputs),
     .value_name = "VALUE",
     .help =
         "one per argument, in order: 2x3xf32=1,2,3,4,5,6 | 4xf32=0 (splat) "
         "| f32=1.5 | 2xbf16=@raw.bin | @x.npy"},
    {.name = "output",
     .type = PCP_CONFIG_TYPE_STRING_LIST,
     .offset = OFFSET(outputs),
     .value_name = "TARGET",
     .help = "one per result, in order: - (print) | @y.npy (write) | +y.npy "
             "(append) | empty (ignore); default: print all"},
    {.name = "device",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(device),
     .default_value = "cpu",
     .value_name = "DRIVER[:N]",
     .help =
         "cpu, local-sync, cuda, rocm, vulkan or metal, with a device ordinal"},
    {.name = "print-max-elements",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(print_max_elements),
     .default_value = "1024",
     .min = 1,
     .max = 1e12,
     .value_name = "N",
     .help = "elements printed per result"},
    {.name = "cpu-threads",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(cpu_threads),
     .default_value = "0",
     .min = 0,
     .max = 1024,
     .value_name = "N",
     .help = "CPU worker threads (0: one per core)"},
    {.name = "help",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(help),
     .default_value = "false",
     .help = "show this help"},
};

static const pcp_config_table_t kTable = {
    .name = "run", .fields = kFields, .field_count = PCP_ARRAYSIZE(kFields)};

static bool ends_with(const char* s, const char* suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

// "cuda:1" -> driver "cuda", ordinal 1. Also accepts IREE's "cuda://1".
static pcp_status_t parse_device(const char* text, char* driver,
                                 size_t capacity, int32_t* out_ordinal) {
  *out_ordinal = 0;
  const char* colon = strchr(text, ':');
  size_t n = colon ? (size_t)(colon - text) : strlen(text);
  if (n == 0 || n >= capacity) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "bad --device '%s'",
                           text);
  }
  memcpy(driver, text, n);
  driver[n] = 0;
  if (colon) {
    const char* number = colon + 1;
    if (strncmp(number, "//", 2) == 0)
      number += 2;
    int64_t ordinal = 0;
    if (!pcp_string_view_parse_int64(pcp_make_cstring_view(number), &ordinal) ||
        ordinal < 0 || ordinal > 4096) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "bad device ordinal in --device '%s'", text);
    }
    *out_ordinal = (int32_t)ordinal;
  }
  return pcp_ok_status();
}

// Which compiler backend serves a runtime driver (for `pcp run x.mlir`).
static pcp_status_t backend_for_driver(const char* driver,
                                       pcp_compile_backend_t* out_backend) {
  // Driver names ("local-task", "local-sync", "hip") resolve through the
  // backend table; anything else gets the compiler's own error message.
  pcp_backend_kind_t kind;
  if (pcp_backend_kind_parse(pcp_make_cstring_view(driver),
                             PCP_BACKEND_PARSE_FLAG_DRIVERS, &kind)) {
    *out_backend = (pcp_compile_backend_t)kind;
    return pcp_ok_status();
  }
  return pcp_compile_backend_parse(driver, out_backend);
}

static pcp_status_t load_program_bytes(const char* path, const char* driver,
                                       void** out_data, size_t* out_length) {
  if (!ends_with(path, ".mlir")) {
    return pcp_file_read_all(path, PCP_MAX_PROGRAM_BYTES, out_data, out_length);
  }
  pcp_compile_backend_t backend;
  PCP_RETURN_IF_ERROR_BARE(backend_for_driver(driver, &backend));
  void* text = NULL;
  size_t text_length = 0;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_file_read_all(path, PCP_COMPILE_MAX_MLIR_BYTES, &text, &text_length));
  pcp_compile_request_t request = {.mlir_text = text,
                                   .mlir_byte_length = text_length,
                                   .source_name = path,
                                   .backend = backend};
  pcp_compile_result_t result;
  pcp_status_t status = pcp_compile_module(&request, &result);
  pcp_libc_free(text);  // pcp_file_read_all's buffer: posix_memalign
  if (status)
    return status;
  *out_data = result.vmfb;
  *out_length = result.vmfb_byte_length;
  return pcp_ok_status();
}

static pcp_status_t emit_result(pcp_allocator_t allocator, size_t index,
                                pcp_tensor_t* tensor, const char* target,
                                int64_t print_max) {
  if (target && !target[0])
    return pcp_ok_status();  // ignored
  pcp_host_tensor_t host;
  PCP_RETURN_IF_ERROR(pcp_tensor_download_host(tensor, &host), "result %zu",
                      index);
  pcp_status_t status = pcp_ok_status();
  if (target && (target[0] == '@' || target[0] == '+')) {
    status = pcp_host_tensor_write_npy(&host, target + 1, target[0] == '+');
  } else if (target && strcmp(target, "-") != 0) {
    status = pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "--output '%s': expected -, @file.npy, +file.npy or empty", target);
  } else {
    pcp_string_builder_t text;
    pcp_string_builder_initialize(allocator, 0, &text);
    status = pcp_host_tensor_format(&host, (size_t)print_max, &text);
    if (!status) {
      printf("result[%zu]: hal.buffer_view\n%s\n", index,
             pcp_string_builder_cstring(&text));
    }
    pcp_string_builder_deinitialize(&text);
  }
  pcp_host_tensor_deinitialize(&host);
  return status;
}

static pcp_status_t run(pcp_allocator_t allocator, const char* path,
                        const run_options_t* options) {
  char driver[32];
  int32_t ordinal = 0;
  PCP_RETURN_IF_ERROR_BARE(
      parse_device(options->device, driver, sizeof(driver), &ordinal));
  // --input is a string list (at most PCP_CONFIG_MAX_LIST_ITEMS), so the
  // products cannot overflow.
  size_t slots = options->inputs.count + 1;
  pcp_host_tensor_t* inputs = NULL;
  pcp_value_t* values = NULL;
  pcp_tensor_t* results[PCP_MAX_FUNCTION_ARITY];
  size_t result_count = 0, parsed = 0;
  void* vmfb = NULL;
  size_t vmfb_length = 0;
  pcp_backend_t* backend = NULL;
  pcp_program_t* program = NULL;
  pcp_status_t status =
      pcp_allocator_calloc(allocator, slots * sizeof(*inputs), (void**)&inputs);
  if (!status) {
    status = pcp_allocator_calloc(allocator, slots * sizeof(*values),
                                  (void**)&values);
  }
  if (status)
    status = pcp_status_annotate_f(status, "inputs");
  for (; !status && parsed < options->inputs.count; ++parsed) {
    status = pcp_host_tensor_parse_with_allocator(options->inputs.items[parsed],
                                                  allocator, &inputs[parsed]);
    if (status)
      status = pcp_status_annotate_f(status, "--input %zu", parsed);
    else
      values[parsed] = pcp_value_host(&inputs[parsed]);
  }
  if (!status)
    status = load_program_bytes(path, driver, &vmfb, &vmfb_length);
  if (!status) {
    pcp_backend_options_t backend_options = {
        .driver = driver,
        .device_ordinal = ordinal,
        .cpu_threads = (int32_t)options->cpu_threads,
        .allocator = allocator};
    status = pcp_backend_create(&backend_options, &backend);
  }
  if (!status)
    status = pcp_program_load(backend, vmfb, vmfb_length, &program);
  if (!status) {
    status = pcp_program_invoke(program, options->function, values,
                                options->inputs.count, results,
                                PCP_ARRAYSIZE(results), &result_count);
  }
  if (!status && options->outputs.count > result_count) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%zu --output flags for %zu results",
                             options->outputs.count, result_count);
  }
  if (!status) {
    printf("EXEC @%s\n", options->function);
    for (size_t i = 0; !status && i < result_count; ++i) {
      const char* target = NULL;
      if (options->outputs.count) {
        target = i < options->outputs.count ? options->outputs.items[i] : "";
      }
      status = emit_result(allocator, i, results[i], target,
                           options->print_max_elements);
    }
    fflush(stdout);
  }
  for (size_t i = 0; i < result_count; ++i) pcp_tensor_release(results[i]);
  pcp_program_release(program);
  pcp_backend_release(backend);
  // The file's or the compiler's VMFB: pcp_file_read_all (posix_memalign).
  pcp_libc_free(vmfb);
  for (size_t i = 0; i < parsed; ++i) pcp_host_tensor_deinitialize(&inputs[i]);
  pcp_allocator_free(allocator, inputs);
  pcp_allocator_free(allocator, values);
  return status;
}

// Flag values that need no program or file: a bad one is a usage error
// (exit 2) before any work, like every flag (docs/cli.md). Inputs from files
// (@x.npy, =@raw.bin) and the match against the program are checked by the
// run (exit 1).
static pcp_status_t check_flag_values(pcp_allocator_t allocator,
                                      const run_options_t* options) {
  char driver[32];
  int32_t ordinal = 0;
  PCP_RETURN_IF_ERROR_BARE(
      parse_device(options->device, driver, sizeof(driver), &ordinal));
  // Every runtime driver has a compiler backend; the same list.
  pcp_compile_backend_t backend;
  pcp_status_t status = backend_for_driver(driver, &backend);
  if (status) {
    pcp_status_ignore(status);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "--device: unknown device driver '%s' (expected "
                           "cpu, local-sync, cuda, rocm, vulkan or metal)",
                           driver);
  }
  for (size_t i = 0; i < options->inputs.count; ++i) {
    const char* text = options->inputs.items[i];
    if (text[0] == '@' || strstr(text, "=@"))
      continue;
    pcp_host_tensor_t tensor;
    status = pcp_host_tensor_parse_with_allocator(text, allocator, &tensor);
    if (status) {
      pcp_status_t named = pcp_make_status(
          pcp_status_code(status), "--input '%.40s%s': %s", text,
          strlen(text) > 40 ? "..." : "", pcp_status_message(status));
      pcp_status_ignore(status);
      return named;
    }
    pcp_host_tensor_deinitialize(&tensor);
  }
  for (size_t i = 0; i < options->outputs.count; ++i) {
    const char* target = options->outputs.items[i];
    if (target[0] && strcmp(target, "-") != 0 && target[0] != '@' &&
        target[0] != '+') {
      return pcp_make_status(
          PCP_STATUS_INVALID_ARGUMENT,
          "--output '%s': expected -, @file.npy, +file.npy or empty", target);
    }
  }
  return pcp_ok_status();
}

int pcp_compute_run_cli_main(int argc, char** argv) {
  // A command's memory: one allocator for all of it (STYLE.md s.3.5).
  pcp_allocator_t allocator = pcp_allocator_system();
  run_options_t options;
  pcp_string_list_t positionals = {.allocator = allocator};
  pcp_status_t status =
      pcp_config_initialize_with_allocator(&kTable, allocator, &options);
  if (!status) {
    status = pcp_config_parse_argv_with_allocator(
        &kTable, allocator, argc - 1, argv + 1, &options, &positionals);
  }
  if (!status && options.help) {
    printf(
        "usage: pcp run PROGRAM.vmfb|MODEL.mlir [--function F] [--input V]... "
        "[--device D] [--output T]...\n\nInvokes one function of a compiled "
        "program through the IREE runtime and prints\nits results like "
        "iree-run-module (a .mlir is compiled for the device "
        "first).\n\nflags:\n");
    pcp_config_print_help(&kTable, stdout);
    pcp_config_deinitialize_with_allocator(&kTable, allocator, &options);
    pcp_string_list_deinitialize(&positionals);
    return 0;
  }
  if (!status && positionals.count != 1) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             positionals.count
                                 ? "expected one program, got %zu"
                                 : "missing the program (.vmfb or .mlir)",
                             positionals.count);
  }
  if (!status)
    status = check_flag_values(allocator, &options);
  if (status) {
    pcp_config_deinitialize_with_allocator(&kTable, allocator, &options);
    pcp_string_list_deinitialize(&positionals);
    return pcp_config_cli_usage_error("run", status);
  }
  status = run(allocator, positionals.items[0], &options);
  int exit_code = 0;
  if (status) {
    exit_code = pcp_config_cli_failure("run", status);
  }
  pcp_config_deinitialize_with_allocator(&kTable, allocator, &options);
  pcp_string_list_deinitialize(&positionals);
  return exit_code;
}
