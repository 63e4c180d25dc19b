// SPDX-License-Identifier: Apache-2.0
// `pcp compile`: the iree-compile driver on the command line.

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/compile.h"
#include "config/config.h"

typedef struct compile_cli_options_t {
  char* backend;
  char* target;
  char* output;
  char* cache_dir;
  bool no_cache;
  bool print_flags;
  int64_t timeout_s;
  bool help;
  // Training programs (pcp_compile_training_module_build).
  char* program;
  int64_t inner_steps;
  int64_t accumulate;  // 0: not given
  int64_t data_args;
  char* function;
  char* emit_mlir;
  double beta1;
  double beta2;
  double epsilon;
  double weight_decay;
  double max_grad_norm;
  char* delta_dtype;
  char* inner_state;  // NULL: not given (reset)
  pcp_string_list_t iree_flags;
} compile_cli_options_t;

static pcp_status_t validate_backend(const void* config,
                                     const pcp_config_field_t* field) {
  (void)field;
  const compile_cli_options_t* o = config;
  pcp_compile_backend_t backend;
  return pcp_compile_backend_parse(o->backend, &backend);
}

#define OFFSET(member) offsetof(compile_cli_options_t, member)

static const pcp_config_field_t kFields[] = {
    {.name = "backend",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(backend),
     .default_value = "cpu",
     .value_name = "NAME",
     .help = "device kind: cpu, cuda, rocm, vulkan or metal",
     .validate = validate_backend},
    {.name = "target",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(target),
     .value_name = "NAME",
     .help = "device target: host or x86-64-v3 (cpu), sm_80 (cuda), gfx942 "
             "(rocm), ... (empty: the backend default)"},
    {.name = "output",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(output),
     .value_name = "PATH",
     .help = "where to write the VMFB (also -o)"},
    {.name = "cache-dir",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(cache_dir),
     .value_name = "DIR",
     .help =
         "artifact cache (default: $PCP_CACHE_DIR or ~/.cache/pcp/artifacts)"},
    {.name = "no-cache",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(no_cache),
     .default_value = "false",
     .help = "always run the compiler; neither read nor write the cache"},
    {.name = "print-flags",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(print_flags),
     .default_value = "false",
     .help = "print the compiler flags for this backend/target and exit"},
    {.name = "timeout-s",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(timeout_s),
     .default_value = "1800",
     .min = 1,
     .max = 86400,
     .value_name = "SECONDS",
     .help = "kill the compiler after this long"},
    {.name = "program",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(program),
     .value_name = "grad|train|diloco",
     .help = "derive a training program from a forward-loss @main first: grad "
             "(@compute_gradients), train (+ @apply_optimizer, "
             "@train_steps) or diloco (+ @diloco_round)"},
    {.name = "delta-dtype",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(delta_dtype),
     .default_value = "f32",
     .value_name = "f32|bf16",
     .help = "diloco: element type of the deltas @diloco_round returns"},
    // No default, so that giving it without --program diloco can be
    // refused; not given is reset.
    {.name = "inner-state",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(inner_state),
     .value_name = "reset|keep",
     .help = "diloco: reset (default) starts the inner AdamW afresh every "
             "round; keep makes @diloco_round take and return m, v and the "
             "step so a worker can keep them across rounds"},
    {.name = "inner-steps",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(inner_steps),
     .default_value = "0",
     .min = 0,
     .max = 4096,
     .value_name = "K",
     .help = "train: fuse K optimizer steps into @train_steps (0: none)"},
    // No default: 0 means "not given", so an explicit --accumulate 0 is
    // out of range rather than silently "none", and --accumulate without
    // --program can be refused.
    {.name = "accumulate",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(accumulate),
     .min = 1,
     .max = PCP_COMPILE_MAX_ACCUMULATION_STEPS,
     .value_name = "A",
     .help = "gradient accumulation: each optimizer step averages A "
             "micro-batches (adds @compute_gradients_accumulated; "
             "@train_steps and @diloco_round take data [K, A, ...]; 1, or 0 "
             "= not given: none)"},
    {.name = "data-args",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(data_args),
     .default_value = "-1",
     .min = -1,
     .max = 1024,
     .value_name = "N",
     .help = "trailing arguments that are data, not parameters (-1: the "
             "trailing non-float ones)"},
    {.name = "function",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(function),
     .value_name = "NAME",
     .help = "the forward-loss function (default main)"},
    {.name = "emit-mlir",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(emit_mlir),
     .value_name = "PATH",
     .help = "write the derived MLIR here (then -o is optional)"},
    {.name = "beta1",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = OFFSET(beta1),
     .default_value = "0.9",
     .min = 0,
     .max = 1,
     .help = "AdamW beta1"},
    {.name = "beta2",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = OFFSET(beta2),
     .default_value = "0.999",
     .min = 0,
     .max = 1,
     .help = "AdamW beta2"},
    {.name = "epsilon",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = OFFSET(epsilon),
     .default_value = "1e-8",
     .min = 0,
     .max = 1,
     .help = "AdamW epsilon"},
    {.name = "weight-decay",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = OFFSET(weight_decay),
     .default_value = "0.01",
     .min = 0,
     .max = 10,
     .help = "AdamW decoupled weight decay"},
    {.name = "max-grad-norm",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = OFFSET(max_grad_norm),
     .default_value = "1.0",
     .min = 0,
     .max = 1e30,
     .help = "global gradient-norm clip (0: none)"},
    {.name = "iree-flag",
     .type = PCP_CONFIG_TYPE_STRING_LIST,
     .offset = OFFSET(iree_flags),
     .value_name = "FLAG",
     .help = "pass FLAG (--name=value) to iree-compile; repeatable, after "
             "$PCP_IREE_FLAGS; replaces a default flag of the same name; "
             "part of the cache key"},
    {.name = "help",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(help),
     .default_value = "false",
     .help = "show this help"},
};

static const pcp_config_table_t kTable = {
    .name = "compile",
    .fields = kFields,
    .field_count = PCP_ARRAYSIZE(kFields),
};

static void print_help(void) {
  printf(
      "usage: pcp compile MODEL.mlir [--backend B] [--target T] -o OUT.vmfb\n"
      "       pcp compile --program grad|train|diloco MODEL.mlir "
      "[--inner-steps K]\n"
      "               [--accumulate A] [--inner-state reset|keep]\n"
      "               [--emit-mlir OUT.mlir] [-o OUT.vmfb]\n"
      "       ... [--iree-flag=--name=value]...   (also $PCP_IREE_FLAGS)\n\n"
      "Compiles a StableHLO module to an IREE VMFB with the wheel's "
      "iree-compile "
      "(in a child\nprocess), reusing the artifact cache when the same module "
      "was compiled before.\n\nflags:\n");
  pcp_config_print_help(&kTable, stdout);
}

int pcp_compile_cli_main(int argc, char** argv) {
  pcp_allocator_t allocator = pcp_allocator_system();
  // -o is the one short flag, kept for iree-compile muscle memory.
  char** args = NULL;
  pcp_status_t alloc_status = pcp_allocator_calloc(
      allocator, ((size_t)argc + 1) * sizeof(char*), (void**)&args);
  if (alloc_status)
    return pcp_config_cli_failure("compile", alloc_status);
  for (int i = 1; i < argc; ++i) {
    args[i - 1] = strcmp(argv[i], "-o") == 0 ? "--output" : argv[i];
  }
  compile_cli_options_t options;
  pcp_string_list_t positionals = {0};
  pcp_status_t status = pcp_config_initialize(&kTable, &options);
  if (!status) {
    status =
        pcp_config_parse_argv(&kTable, argc - 1, args, &options, &positionals);
  }
  pcp_allocator_free(allocator, args);
  if (!status && options.help) {
    print_help();
    pcp_config_deinitialize(&kTable, &options);
    pcp_string_list_deinitialize(&positionals);
    return 0;
  }
  if (!status)
    status = pcp_config_validate(&kTable, &options);
  if (!status && !options.print_flags && positionals.count != 1) {
    status =
        pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                        positionals.count ? "expected one MLIR file, got %zu"
                                          : "missing the MLIR file to compile",
                        positionals.count);
  }
  if (!status && options.program && strcmp(options.program, "grad") != 0 &&
      strcmp(options.program, "train") != 0 &&
      strcmp(options.program, "diloco") != 0) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "--program must be grad, train or diloco, got "
                             "'%s'",
                             options.program);
  }
  if (!status && options.program && strcmp(options.program, "diloco") == 0 &&
      options.inner_steps < 1) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "--program diloco needs --inner-steps K >= 1");
  }
  if (!status && strcmp(options.delta_dtype, "f32") != 0 &&
      strcmp(options.delta_dtype, "bf16") != 0) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "--delta-dtype must be f32 or bf16, got '%s'",
                             options.delta_dtype);
  }
  if (!status && options.program && strcmp(options.program, "grad") == 0 &&
      options.inner_steps > 0) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "--inner-steps needs --program train");
  }
  pcp_compile_inner_state_t inner_state = PCP_COMPILE_INNER_STATE_RESET;
  if (!status && options.inner_state) {
    if (!options.program || strcmp(options.program, "diloco") != 0) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "--inner-state needs --program diloco");
    } else {
      status = pcp_compile_inner_state_parse(options.inner_state, &inner_state);
    }
  }
  if (!status && options.accumulate && !options.program) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "--accumulate needs --program grad|train|diloco");
  }
  if (!status && options.emit_mlir && !options.program) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "--emit-mlir needs --program grad|train|diloco");
  }
  if (!status && !options.print_flags && !options.output &&
      !options.emit_mlir) {
    status =
        pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                        "missing -o OUT.vmfb (where to write the program)");
  }
  pcp_compile_backend_t backend = PCP_COMPILE_BACKEND_CPU;
  if (!status)
    status = pcp_compile_backend_parse(options.backend, &backend);
  if (!status) {
    // --target and --iree-flag are flag values: a bad one is a usage error
    // (exit 2) before any work, like every other flag.
    static pcp_compile_flags_t checked;
    status = pcp_compile_flags_resolve(backend, options.target, &checked);
    if (!status) {
      status = pcp_compile_flags_add_extra(
          &checked, (const char* const*)options.iree_flags.items,
          options.iree_flags.count, "--iree-flag");
    }
  }
  if (status) {
    pcp_config_deinitialize(&kTable, &options);
    pcp_string_list_deinitialize(&positionals);
    return pcp_config_cli_usage_error("compile", status);
  }

  int exit_code = 0;
  if (options.print_flags) {
    pcp_compile_flags_t flags;
    status = pcp_compile_flags_resolve(backend, options.target, &flags);
    if (!status)
      status = pcp_compile_flags_add_environment(&flags);
    if (!status) {
      status = pcp_compile_flags_add_extra(
          &flags, (const char* const*)options.iree_flags.items,
          options.iree_flags.count, "--iree-flag");
    }
    if (!status) {
      for (int i = 0; i < flags.count; ++i) printf("%s\n", flags.flags[i]);
      if (flags.note[0])
        fprintf(stderr, "note: %s\n", flags.note);
    }
  } else {
    const char* path = positionals.items[0];
    // |text| is the file (pcp_file_read_all: libc memory) until a training
    // program replaces it with the derived module (from |allocator|).
    void* text = NULL;
    size_t length = 0;
    bool text_is_derived = false;
    status =
        pcp_file_read_all(path, PCP_COMPILE_MAX_MLIR_BYTES, &text, &length);
    if (!status && options.program) {
      pcp_compile_training_options_t training;
      pcp_compile_training_options_initialize(&training);
      training.program =
          strcmp(options.program, "train") == 0    ? PCP_COMPILE_PROGRAM_TRAIN
          : strcmp(options.program, "diloco") == 0 ? PCP_COMPILE_PROGRAM_DILOCO
                                                   : PCP_COMPILE_PROGRAM_GRAD;
      training.delta_element = options.delta_dtype;
      training.inner_state = inner_state;
      training.function_name = options.function;
      training.data_argument_count = (int32_t)options.data_args;
      training.inner_steps = (int32_t)options.inner_steps;
      training.accumulation_steps = options.accumulate;
      training.beta1 = options.beta1;
      training.beta2 = options.beta2;
      training.epsilon = options.epsilon;
      training.weight_decay = options.weight_decay;
      training.max_grad_norm = options.max_grad_norm;
      char* derived = NULL;
      size_t derived_length = 0;
      status = pcp_compile_training_module_build(
          text, length, path, &training, allocator, &derived, &derived_length);
      if (!status) {
        pcp_libc_free(text);  // pcp_file_read_all's buffer
        text = derived;
        length = derived_length;
        text_is_derived = true;
        if (options.emit_mlir) {
          status = pcp_file_write_atomic(options.emit_mlir, text, length);
          if (!status) {
            fprintf(stderr, "pcp compile: wrote %s (%zu bytes)\n",
                    options.emit_mlir, length);
          }
        }
      }
    }
    if (!status && options.output) {
      pcp_compile_request_t request = {
          .mlir_text = text,
          .mlir_byte_length = length,
          .source_name = path,
          .backend = backend,
          .target = options.target,
          .cache_dir = options.cache_dir,
          .disable_cache = options.no_cache,
          .timeout_ms = options.timeout_s * 1000,
          .iree_flags = (const char* const*)options.iree_flags.items,
          .iree_flag_count = options.iree_flags.count,
          .derived_program = options.program,
      };
      pcp_compile_result_t result;
      fprintf(stderr, "pcp compile: %s for %s/%s ...\n", path,
              pcp_compile_backend_name(backend),
              options.target ? options.target
                             : pcp_compile_backend_default_target(backend));
      status = pcp_compile_module(&request, &result);
      if (status && result.derived_path[0]) {
        fprintf(stderr, "pcp compile: the derived module is %s\n",
                result.derived_path);
      }
      if (!status) {
        if (result.flags.note[0])
          fprintf(stderr, "note: %s\n", result.flags.note);
        status = pcp_file_write_atomic(options.output, result.vmfb,
                                       result.vmfb_byte_length);
        if (!status) {
          fprintf(stderr, "pcp compile: wrote %s (%zu bytes, %s, key %.12s)\n",
                  options.output, result.vmfb_byte_length,
                  result.cache_hit ? "cache hit" : "compiled",
                  result.cache_key);
          if (!result.cache_hit) {
            fprintf(stderr, "pcp compile: compiled in %.2f s\n",
                    result.compile_seconds);
          }
        }
        pcp_compile_result_deinitialize(&result);
      }
    }
    if (text_is_derived) {
      pcp_allocator_free(allocator, text);
    } else {
      pcp_libc_free(text);  // pcp_file_read_all's buffer
    }
  }
  if (status) {
    // Bad input (the module, the target) is the user's to fix: exit 1;
    // usage errors exit 2 above.
    exit_code = pcp_config_cli_failure("compile", status);
  }
  pcp_config_deinitialize(&kTable, &options);
  pcp_string_list_deinitialize(&positionals);
  return exit_code;
}
