// SPDX-License-Identifier: Apache-2.0
// `pcp model`: emit a built-in model as StableHLO text.

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "models/models.h"

typedef struct model_cli_options_t {
  int64_t layers;
  int64_t heads;
  int64_t kv_heads;
  int64_t width;
  int64_t head_dim;
  int64_t mlp_hidden;
  int64_t vocab;
  int64_t block_size;
  int64_t batch;
  int32_t dtype;  // index into kDtypes
  bool tie_embeddings;
  double rope_theta;
  char* output;
  char* params_json;
  char* init_dir;
  int64_t seed;
  bool generate;
  int64_t max_length;
  int64_t prefill_length;
  bool help;
} model_cli_options_t;

static const char* const kDtypes[] = {"f32", "bf16", NULL};

#define OFFSET(member) offsetof(model_cli_options_t, member)

// Bounds here are the PCP_MODELS_MAX_* of models.h, so the table's range
// message is the one users see; cross-field rules come from
// pcp_models_spec_validate.
static const pcp_config_field_t kFields[] = {
    {.name = "layers",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(layers),
     .default_value = "2",
     .min = 1,
     .max = PCP_MODELS_MAX_LAYERS,
     .value_name = "N",
     .help = "transformer blocks"},
    {.name = "heads",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(heads),
     .default_value = "4",
     .min = 1,
     .max = PCP_MODELS_MAX_HEADS,
     .value_name = "N",
     .help = "attention (query) heads"},
    {.name = "kv-heads",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(kv_heads),
     .default_value = "0",
     .min = 0,
     .max = PCP_MODELS_MAX_HEADS,
     .value_name = "N",
     .help = "key/value heads for grouped-query attention (nanochat, qwen3; "
             "0: = heads)"},
    {.name = "width",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(width),
     .default_value = "128",
     .min = 1,
     .max = PCP_MODELS_MAX_WIDTH,
     .value_name = "N",
     .help = "model width d_model"},
    {.name = "head-dim",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(head_dim),
     .default_value = "0",
     .min = 0,
     .max = PCP_MODELS_MAX_HEAD_DIM,
     .value_name = "N",
     .help = "per-head size (nanochat, qwen3; 0: width / heads)"},
    {.name = "mlp-hidden",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(mlp_hidden),
     .default_value = "0",
     .min = 0,
     .max = PCP_MODELS_MAX_MLP_HIDDEN,
     .value_name = "N",
     .help = "MLP hidden size (0: 4 * width; qwen3: 3 * width)"},
    {.name = "vocab",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(vocab),
     .default_value = "65",
     .min = 1,
     .max = PCP_MODELS_MAX_VOCAB,
     .value_name = "N",
     .help = "vocabulary size"},
    {.name = "block-size",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(block_size),
     .default_value = "64",
     .min = 1,
     .max = PCP_MODELS_MAX_BLOCK_SIZE,
     .value_name = "T",
     .help = "sequence length of input_ids and targets"},
    {.name = "batch",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(batch),
     .default_value = "8",
     .min = 1,
     .max = PCP_MODELS_MAX_BATCH,
     .value_name = "B",
     .help = "batch size"},
    {.name = "dtype",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = OFFSET(dtype),
     .default_value = "f32",
     .enum_values = kDtypes,
     .help = "parameter and activation type (bf16: norms, softmax and loss "
             "in f32)"},
    {.name = "tie-embeddings",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(tie_embeddings),
     .default_value = "false",
     .help = "qwen3: LM head shares model.embed_tokens.weight (gpt is always "
             "tied, nanochat never)"},
    {.name = "rope-theta",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = OFFSET(rope_theta),
     .default_value = "0",
     .min = 0,
     .max = 1e12,
     .value_name = "X",
     .help = "RoPE base (0: 10000 for nanochat, 1000000 for qwen3)"},
    {.name = "output",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(output),
     .value_name = "PATH",
     .help = "where to write the MLIR (also -o; - for stdout)"},
    {.name = "params-json",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(params_json),
     .value_name = "PATH",
     .help = "also write the parameter table (names, shapes, dtypes) as JSON"},
    {.name = "init-dir",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = OFFSET(init_dir),
     .value_name = "DIR",
     .help = "also write seeded initial parameters, one file per tensor in "
             "argument order (NNN.NAME.npy for f32, raw NNN.NAME.bin for "
             "bf16)"},
    {.name = "seed",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(seed),
     .default_value = "0",
     .min = 0,
     .max = 9007199254740992.0,
     .value_name = "N",
     .help = "seed of the --init-dir values"},
    {.name = "generate",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(generate),
     .default_value = "false",
     .help = "emit the generation module (@prefill, @decode with a KV cache "
             "of --batch slots) instead of @main / @logits"},
    {.name = "max-length",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(max_length),
     .default_value = "0",
     .min = 0,
     .max = PCP_MODELS_MAX_BLOCK_SIZE,
     .value_name = "L",
     .help = "--generate: KV-cache rows per slot (0: --block-size)"},
    {.name = "prefill-length",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = OFFSET(prefill_length),
     .default_value = "0",
     .min = 0,
     .max = PCP_MODELS_MAX_BLOCK_SIZE,
     .value_name = "P",
     .help = "--generate: tokens per @prefill call (0: --max-length)"},
    {.name = "help",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = OFFSET(help),
     .default_value = "false",
     .help = "show this help"},
};

static const pcp_config_table_t kTable = {
    .name = "model", .fields = kFields, .field_count = PCP_ARRAYSIZE(kFields)};

static void print_help(void) {
  printf(
      "usage: pcp model gpt|nanochat|qwen3 [--layers N] [--heads N] "
      "[--kv-heads N]\n"
      "                 [--width N] [--mlp-hidden N] [--vocab N] "
      "[--block-size T] [--batch B]\n"
      "                 [--dtype f32|bf16] -o MODEL.mlir [--params-json "
      "P.json]\n"
      "                 [--init-dir DIR [--seed N]]\n"
      "                 [--generate [--max-length L] [--prefill-length P]]\n\n"
      "Emits a built-in transformer as StableHLO: @main(params..., input_ids, "
      "targets)\n-> mean cross-entropy loss and @logits(params..., input_ids) "
      "-> BxTxV logits.\nParameters are named and ordered as in docs/models.md."
      "\n\nflags:\n");
  pcp_config_print_help(&kTable, stdout);
}

static pcp_status_t write_text(const char* path, const char* text,
                               size_t length) {
  if (strcmp(path, "-") == 0) {
    if (fwrite(text, 1, length, stdout) != length || fflush(stdout) != 0) {
      return pcp_make_status(PCP_STATUS_DATA_LOSS, "writing to stdout failed");
    }
    return pcp_ok_status();
  }
  return pcp_file_write_atomic(path, text, length);
}

// One .npy (v1.0) file: magic, header dict padded to 64 bytes, data.
static pcp_status_t write_npy_f32(const char* path,
                                  const pcp_models_parameter_t* p,
                                  const void* data, pcp_allocator_t allocator) {
  char dict[128];
  int n = p->rank == 2 ? snprintf(dict, sizeof(dict),
                                  "{'descr': '<f4', 'fortran_order': False, "
                                  "'shape': (%lld, %lld), }",
                                  (long long)p->dims[0], (long long)p->dims[1])
                       : snprintf(dict, sizeof(dict),
                                  "{'descr': '<f4', 'fortran_order': False, "
                                  "'shape': (%lld,), }",
                                  (long long)p->dims[0]);
  PCP_ASSERT(n > 0 && n < (int)sizeof(dict));
  size_t header = 10 + (size_t)n + 1;  // magic+version+length, dict, '\n'
  size_t padded = (header + 63) / 64 * 64;
  size_t total = padded + p->byte_length;
  uint8_t* buffer = NULL;
  PCP_RETURN_IF_ERROR(pcp_allocator_malloc(allocator, total, (void**)&buffer),
                      "%zu bytes for %s", total, path);
  static const uint8_t kMagic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  memcpy(buffer, kMagic, sizeof(kMagic));
  size_t dict_length = padded - 10;
  buffer[8] = (uint8_t)(dict_length & 0xFF);
  buffer[9] = (uint8_t)(dict_length >> 8);
  memcpy(buffer + 10, dict, (size_t)n);
  memset(buffer + 10 + n, ' ', dict_length - (size_t)n - 1);
  buffer[padded - 1] = '\n';
  memcpy(buffer + padded, data, p->byte_length);
  pcp_status_t status = pcp_file_write_atomic(path, buffer, total);
  pcp_allocator_free(allocator, buffer);
  return status;
}

// Writes the seeded initial values of every parameter under |dir|.
static pcp_status_t write_initial_values(
    const pcp_models_parameter_table_t* table, const char* dir, uint64_t seed,
    pcp_allocator_t allocator) {
  PCP_RETURN_IF_ERROR(pcp_file_make_directories(dir), "creating %s", dir);
  // The table's count is bounded by the validated spec: no overflow.
  void** buffers = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(allocator, table->count * sizeof(void*),
                           (void**)&buffers),
      "buffer table");
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; i < table->count && !status; ++i) {
    status = pcp_allocator_malloc(allocator, table->parameters[i].byte_length,
                                  &buffers[i]);
    if (status) {
      status = pcp_status_annotate_f(status, "%zu bytes for %s",
                                     table->parameters[i].byte_length,
                                     table->parameters[i].name);
    }
  }
  if (!status)
    pcp_models_parameters_initialize(table, seed, buffers);
  for (size_t i = 0; i < table->count && !status; ++i) {
    const pcp_models_parameter_t* p = &table->parameters[i];
    char path[4096];
    bool bf16 = p->element_type == PCP_ELEMENT_TYPE_BF16;
    int n = snprintf(path, sizeof(path), "%s/%03zu.%s.%s", dir, i, p->name,
                     bf16 ? "bin" : "npy");
    if (n < 0 || n >= (int)sizeof(path)) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "--init-dir path too long");
    } else if (bf16) {
      // NumPy has no bf16 type; `pcp run` takes SHAPExbf16=@file.bin.
      status = pcp_file_write_atomic(path, buffers[i], p->byte_length);
    } else {
      status = write_npy_f32(path, p, buffers[i], allocator);
    }
  }
  for (size_t i = 0; i < table->count; ++i) {
    pcp_allocator_free(allocator, buffers[i]);
  }
  pcp_allocator_free(allocator, buffers);
  return status;
}

static pcp_status_t run(const pcp_models_spec_t* spec,
                        const model_cli_options_t* options,
                        pcp_allocator_t allocator) {
  PCP_ASSERT(options->output);  // checked by the caller
  pcp_models_parameter_table_t table;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_models_parameter_table_initialize(spec, allocator, &table));
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(allocator, 0, &builder);
  pcp_status_t status;
  if (options->generate) {
    pcp_models_generation_t gen = {
        .slots = spec->batch,
        .max_length =
            options->max_length ? options->max_length : spec->block_size,
    };
    gen.prefill_length =
        options->prefill_length ? options->prefill_length : gen.max_length;
    status = pcp_models_generation_module_emit(spec, &gen, &builder);
  } else {
    status = pcp_models_module_emit(spec, &builder);
  }
  if (!status) {
    status = write_text(options->output, pcp_string_builder_cstring(&builder),
                        builder.size);
    if (status) {
      status = pcp_status_annotate_f(status, "writing %s", options->output);
    }
  }
  size_t mlir_bytes = builder.size;
  if (!status && options->params_json) {
    pcp_string_builder_reset(&builder);
    status = pcp_models_parameter_table_format_json(spec, &table, &builder);
    if (!status) {
      status = write_text(options->params_json,
                          pcp_string_builder_cstring(&builder), builder.size);
      if (status) {
        status =
            pcp_status_annotate_f(status, "writing %s", options->params_json);
      }
    }
  }
  if (!status && options->init_dir) {
    status = write_initial_values(&table, options->init_dir,
                                  (uint64_t)options->seed, allocator);
  }
  if (!status) {
    // With -o - the MLIR owns stdout, so the summary goes to stderr.
    FILE* out = strcmp(options->output, "-") == 0 ? stderr : stdout;
    fprintf(out, "%s: %zu tensors, %lld parameters (%s)\n",
            pcp_models_architecture_name(spec->architecture), table.count,
            (long long)table.total_elements,
            pcp_element_type_name(spec->dtype));
    if (out == stdout) {
      fprintf(stderr, "pcp model: wrote %s (%zu bytes)\n", options->output,
              mlir_bytes);
    }
  }
  pcp_string_builder_deinitialize(&builder);
  pcp_models_parameter_table_deinitialize(&table);
  return status;
}

int pcp_models_cli_main(int argc, char** argv) {
  pcp_allocator_t allocator = pcp_allocator_system();
  // -o is the one short flag, as in `pcp compile`.
  char** args = NULL;
  pcp_status_t alloc_status = pcp_allocator_calloc(
      allocator, ((size_t)argc + 1) * sizeof(char*), (void**)&args);
  if (alloc_status) {
    return pcp_config_cli_failure("model", alloc_status);
  }
  for (int i = 1; i < argc; ++i) {
    args[i - 1] = strcmp(argv[i], "-o") == 0 ? "--output" : argv[i];
  }
  model_cli_options_t options;
  memset(&options, 0, sizeof(options));
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
  if (!status) {
    status = pcp_config_validate(&kTable, &options);
  }
  pcp_models_spec_t spec;
  pcp_models_spec_initialize(PCP_MODELS_ARCHITECTURE_GPT, &spec);
  if (!status && positionals.count != 1) {
    status = pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        positionals.count ? "expected one architecture, got %zu"
                          : "missing the architecture (gpt, nanochat or qwen3)",
        positionals.count);
  }
  if (!status) {
    status =
        pcp_models_architecture_parse(positionals.items[0], &spec.architecture);
  }
  if (!status && !options.output) {
    status =
        pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                        "missing -o MODEL.mlir (where to write the module)");
  }
  if (!status) {
    spec.layers = options.layers;
    spec.heads = options.heads;
    spec.kv_heads = options.kv_heads;
    spec.width = options.width;
    spec.head_dim = options.head_dim;
    spec.mlp_hidden = options.mlp_hidden;
    spec.vocab = options.vocab;
    spec.block_size = options.block_size;
    spec.batch = options.batch;
    spec.dtype =
        options.dtype == 1 ? PCP_ELEMENT_TYPE_BF16 : PCP_ELEMENT_TYPE_F32;
    spec.tie_embeddings = spec.architecture == PCP_MODELS_ARCHITECTURE_GPT ||
                          options.tie_embeddings;
    spec.rope_theta = options.rope_theta;
    status = pcp_models_spec_validate(&spec);
  }
  if (status) {
    pcp_config_deinitialize(&kTable, &options);
    pcp_string_list_deinitialize(&positionals);
    return pcp_config_cli_usage_error("model", status);
  }
  status = run(&spec, &options, allocator);
  int exit_code = 0;
  if (status) {
    exit_code = pcp_config_cli_failure("model", status);
  }
  pcp_config_deinitialize(&kTable, &options);
  pcp_string_list_deinitialize(&positionals);
  return exit_code;
}
