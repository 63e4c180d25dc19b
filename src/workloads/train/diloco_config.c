// SPDX-License-Identifier: Apache-2.0
// The DiLoCo experiment config table (reference s.1.6 flat keys).

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "compile/compile.h"
#include "workloads/workloads.h"

#define T pcp_diloco_config_t

static const char* const kTokenizers[] = {"char", "byte", "u16", NULL};
static const char* const kSamplings[] = {"random", "fifo", NULL};
static const char* const kDtypes[] = {"f32", "bf16", "f16", NULL};
static const char* const kWireDtypes[] = {"f32", "bf16", NULL};
static const char* const kSchedules[] = {"constant", "cosine",
                                         "warmup_constant", NULL};
static const char* const kInnerStates[] = {"keep", "reset", NULL};
static const char* const kOnParamMismatch[] = {"resync", "fail", NULL};
static const char* const kModelKinds[] = {"none", "gpt", "nanochat", "qwen3",
                                          NULL};

#define S pcp_diloco_model_spec_t
#define DIM(field, def, text)                                     \
  {                                                               \
    .name = #field, .type = PCP_CONFIG_TYPE_INT64,                \
    .offset = offsetof(S, field), .default_value = def, .min = 1, \
    .max = 1 << 24, .help = text                                  \
  }
static const pcp_config_field_t kModelFields[] = {
    {.name = "kind",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(S, kind),
     .default_value = "gpt",
     .enum_values = kModelKinds,
     .help = "built-in model: gpt, nanochat or qwen3"},
    DIM(layers, "2", "transformer layers"),
    DIM(heads, "4", "attention heads"),
    DIM(kv_heads, "4", "key/value heads (qwen3 GQA)"),
    DIM(width, "128", "model width"),
    DIM(vocab, "65", "vocabulary size"),
    DIM(block_size, "64", "context length"),
    DIM(batch, "8", "micro batch"),
};
#undef DIM
#undef S

static pcp_status_t validate_model(const void* config) {
  const pcp_diloco_model_spec_t* m = config;
  if (m->kind == PCP_DILOCO_MODEL_NONE) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "diloco config: key 'model.kind': must name a "
                           "built-in model");
  }
  if (m->heads % m->kv_heads != 0 || m->width % m->heads != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "diloco config: key 'model.heads': heads must "
                           "divide width and be a multiple of kv_heads");
  }
  return pcp_ok_status();
}
static const pcp_config_table_t kModelTable = {
    "diloco model", kModelFields,
    sizeof(kModelFields) / sizeof(kModelFields[0]), validate_model};

#define S pcp_diloco_streaming_config_t
// Defaults are streaming DiLoCo's (reference s.1.2): P=4, H=100, tau=1,
// alpha=0.5.
static const pcp_config_field_t kStreamingFields[] = {
    {.name = "num_fragments",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(S, num_fragments),
     .default_value = "4",
     .min = 1,
     .max = 65536,
     .help = "P: parameter fragments (tensor i in fragment i mod P)"},
    {.name = "inner_steps",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(S, inner_steps),
     .default_value = "100",
     .min = 1,
     .max = 1e9,
     .help = "H: inner steps between two syncs of one fragment"},
    {.name = "overlap_tau",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(S, overlap_tau),
     .default_value = "1",
     .min = 0,
     .max = 1e9,
     .help = "steps between a fragment's send and its mixed receive"},
    {.name = "alpha",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = offsetof(S, alpha),
     .default_value = "0.5",
     .min = 0,
     .max = 1,
     .help = "mixing: theta = alpha*local + (1-alpha)*global"},
};
#undef S

static pcp_status_t validate_streaming(const void* config) {
  const pcp_diloco_streaming_config_t* s = config;
  if (s->overlap_tau >= s->inner_steps) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "diloco config: key 'streaming.overlap_tau': must "
                           "be below inner_steps");
  }
  return pcp_ok_status();
}
static const pcp_config_table_t kStreamingTable = {
    "diloco streaming", kStreamingFields,
    sizeof(kStreamingFields) / sizeof(kStreamingFields[0]), validate_streaming};

static const pcp_config_field_t kFields[] = {
    {.name = "model_path",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, model_path),
     .value_name = "PATH",
     .help = "forward-loss StableHLO .mlir (or give \"model\")"},
    {.name = "model",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(T, model),
     .flags = PCP_CONFIG_FLAG_JSON_ONLY,
     .help = "built-in model spec {kind, layers, heads, ...}",
     .object_table = &kModelTable},
    {.name = "data_path",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, data_path),
     .flags = PCP_CONFIG_FLAG_REQUIRED,
     .value_name = "PATH",
     .help = "training text"},
    {.name = "tokenizer",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(T, tokenizer),
     .default_value = "char",
     .enum_values = kTokenizers,
     .help = "char, byte or u16"},
    {.name = "sampling",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(T, sampling),
     .default_value = "random",
     .enum_values = kSamplings,
     .help = "random or fifo"},
    {.name = "learning_rate",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = offsetof(T, learning_rate),
     .default_value = "6e-4",
     .min = 0,
     .max = 10,
     .help = "inner AdamW learning rate"},
    {.name = "tau",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, tau),
     .default_value = "10",
     .min = 1,
     .max = 1e9,
     .help = "inner steps per outer round"},
    {.name = "outer_loop_steps",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, outer_loop_steps),
     .default_value = "100",
     .min = 1,
     .max = 1e9,
     .help = "outer rounds"},
    {.name = "nesterov_momentum",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = offsetof(T, nesterov_momentum),
     .default_value = "0.9",
     .min = 0,
     .max = 0.999999,
     .help = "outer Nesterov momentum mu"},
    {.name = "outer_learning_rate",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = offsetof(T, outer_learning_rate),
     .default_value = "0.7",
     .min = 0,
     .max = 10,
     .help = "outer Nesterov learning rate (upstream hardcodes 0.7)"},
    {.name = "max_epochs",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, max_epochs),
     .default_value = "10",
     .min = 1,
     .max = 1e9,
     .help = "passes over the data (streaming: rounds per fragment)"},
    {.name = "dtype",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(T, dtype),
     .default_value = "f32",
     .enum_values = kDtypes,
     .help = "parameter dtype: f32, bf16 or f16"},
    {.name = "checkpoint_dir",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, checkpoint_dir),
     .default_value = "checkpoints",
     .value_name = "DIR",
     .help = "checkpoint directory"},
    {.name = "checkpoint_every",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, checkpoint_every),
     .default_value = "10",
     .min = 1,
     .max = 1e9,
     .help = "outer steps between checkpoints (and one at the end)"},
    {.name = "resume",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = offsetof(T, resume),
     .default_value = "false",
     .help = "continue from the newest checkpoint"},
    {.name = "should_resume",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = offsetof(T, resume),
     .flags = PCP_CONFIG_FLAG_ALIAS,
     .help = "upstream name of resume"},
    {.name = "effective_batch_size",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, effective_batch_size),
     .default_value = "0",
     .min = 0,
     .max = 1 << 30,
     .help = "rows per inner step via accumulation (0: micro batch)"},
    {.name = "deltas_dtype",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(T, deltas_dtype),
     .default_value = "f32",
     .enum_values = kWireDtypes,
     .help = "worker deltas on the wire: f32 or bf16 (round to nearest even)"},
    {.name = "streaming",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(T, streaming),
     .flags = PCP_CONFIG_FLAG_JSON_ONLY,
     .help = "streaming DiLoCo {num_fragments, inner_steps, overlap_tau, "
             "alpha}",
     .object_table = &kStreamingTable},
    {.name = "iree_flags",
     .type = PCP_CONFIG_TYPE_STRING_LIST,
     .offset = offsetof(T, iree_flags),
     .flags = PCP_CONFIG_FLAG_JSON_ONLY,
     .help = "extra iree-compile flags for the job's programs "
             "([\"--name=value\", ...], at most 16; also $PCP_IREE_FLAGS in "
             "the gateway's environment)"},
    {.name = "lr_schedule",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(T, lr_schedule),
     .default_value = "constant",
     .enum_values = kSchedules,
     .help = "inner rate per step: constant, cosine (linear warmup, cosine "
             "decay to min_lr) or warmup_constant"},
    {.name = "warmup_steps",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, warmup_steps),
     .default_value = "0",
     .min = 0,
     .max = 1e9,
     .help = "inner steps of linear warmup (cosine, warmup_constant)"},
    {.name = "min_lr",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = offsetof(T, min_lr),
     .default_value = "0",
     .min = 0,
     .max = 10,
     .help = "cosine: the rate at the last inner step"},
    {.name = "inner_state",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(T, inner_state),
     .default_value = "keep",
     .enum_values = kInnerStates,
     .help = "classic rounds: keep each worker's AdamW moments across rounds "
             "(keep) or start fresh ones every round (reset)"},
    {.name = "on_param_mismatch",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(T, on_param_mismatch),
     .default_value = "resync",
     .enum_values = kOnParamMismatch,
     .help = "a worker's SHA-256 of the global parameters differs from the "
             "gateway's: drop its work and send it the gateway's copy "
             "again (resync) or fail the job naming both hashes (fail)"},
    {.name = "eval_fraction",
     .type = PCP_CONFIG_TYPE_DOUBLE,
     .offset = offsetof(T, eval_fraction),
     .default_value = "0.1",
     .min = 0,
     .max = 0.5,
     .help = "held-out tail of the data for val_loss (0: no validation)"},
    {.name = "eval_every",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, eval_every),
     .default_value = "10",
     .min = 1,
     .max = 1e9,
     .help = "outer steps (streaming: syncs) between evaluations (and one at "
             "the end)"},
    {.name = "eval_batches",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, eval_batches),
     .default_value = "16",
     .min = 1,
     .max = 1024,
     .help = "fixed held-out batches (micro batch x block size each) per "
             "evaluation"},
    {.name = "name",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, name),
     .flags = PCP_CONFIG_FLAG_JSON_ONLY,
     .help = "job name, also the served model's name (default: the job id; "
             "1..128 bytes, no control characters)"},
    {.name = "seed",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, seed),
     .default_value = "0",
     .min = 0,
     .max = 1e15,
     .flags = PCP_CONFIG_FLAG_JSON_ONLY,
     .help = "seed of the initialization, the batches and the held-out set"},
    {.name = "worker_class",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, worker_class),
     .flags = PCP_CONFIG_FLAG_JSON_ONLY,
     .help = "run only on workers started with this --worker-class (1..63 "
             "bytes of [A-Za-z0-9._-]; default: every worker)"},
    {.name = "serve_worker_class",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, serve_worker_class),
     .flags = PCP_CONFIG_FLAG_JSON_ONLY,
     .help = "the worker class that serves the job's exports (their "
             "model.json's worker_class; default: every worker)"},
};
#undef T

static pcp_status_t validate_config(const void* config) {
  const pcp_diloco_config_t* c = config;
  bool has_path = c->model_path != NULL && c->model_path[0] != '\0';
  if (has_path == c->model.present) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "diloco config: key 'model_path': give exactly one "
                           "of model_path and model");
  }
  if (c->name) {
    // The served model's id (infer model_dir.c's rule): checked here so a
    // job does not train for hours towards an export nothing can serve.
    size_t n = strlen(c->name);
    bool control = false;
    for (size_t i = 0; i < n; ++i) {
      unsigned char ch = (unsigned char)c->name[i];
      control |= ch < 0x20 || ch == 0x7f;
    }
    if (n == 0 || n > 128 || control) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "diloco config: key 'name': 1..128 bytes "
                             "without control characters (it names the "
                             "served model)");
    }
  }
  if (c->worker_class && !pcp_sched_class_name_is_valid(c->worker_class)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "diloco config: key 'worker_class': 1..%d bytes of "
                           "[A-Za-z0-9._-] (a worker's --worker-class)",
                           PCP_SCHED_CLASS_NAME_MAX_LENGTH);
  }
  if (c->serve_worker_class &&
      !pcp_sched_class_name_is_valid(c->serve_worker_class)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "diloco config: key 'serve_worker_class': 1..%d "
                           "bytes of [A-Za-z0-9._-] (a worker's "
                           "--worker-class)",
                           PCP_SCHED_CLASS_NAME_MAX_LENGTH);
  }
  if (c->iree_flags.count > PCP_COMPILE_MAX_EXTRA_FLAGS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "diloco config: key 'iree_flags': %zu flags; at "
                           "most %d",
                           c->iree_flags.count, PCP_COMPILE_MAX_EXTRA_FLAGS);
  }
  for (size_t i = 0; i < c->iree_flags.count; ++i) {
    char origin[64];
    snprintf(origin, sizeof(origin), "diloco config: key 'iree_flags[%zu]'", i);
    PCP_RETURN_IF_ERROR_BARE(
        pcp_compile_flag_check(c->iree_flags.items[i], origin));
  }
  if (c->effective_batch_size > 0 && c->model.present &&
      c->effective_batch_size % c->model.batch != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "diloco config: key 'effective_batch_size': must "
                           "be a multiple of model.batch");
  }
  bool warms = c->lr_schedule != PCP_DILOCO_LR_CONSTANT;
  if (c->warmup_steps > 0 && !warms) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "diloco config: key 'warmup_steps': needs "
                           "lr_schedule cosine or warmup_constant");
  }
  if (c->min_lr > 0 && c->lr_schedule != PCP_DILOCO_LR_COSINE) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "diloco config: key 'min_lr': only the cosine "
                           "schedule decays to it");
  }
  if (c->min_lr > c->learning_rate) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "diloco config: key 'min_lr': %g is above "
                           "learning_rate %g",
                           c->min_lr, c->learning_rate);
  }
  return pcp_ok_status();
}

static const pcp_config_table_t kTable = {"diloco config", kFields,
                                          sizeof(kFields) / sizeof(kFields[0]),
                                          validate_config};

const pcp_config_table_t* pcp_diloco_config_table(void) {
  return &kTable;
}

pcp_status_t pcp_diloco_config_parse_json(const char* text, size_t byte_length,
                                          pcp_diloco_config_t* out_config,
                                          pcp_string_list_t* out_unknown_keys) {
  memset(out_config, 0, sizeof(*out_config));
  pcp_status_t status = pcp_config_initialize(&kTable, out_config);
  if (!status) {
    status = pcp_config_parse_json(&kTable, text, byte_length, out_config,
                                   out_unknown_keys);
  }
  if (!status)
    status = pcp_config_validate(&kTable, out_config);
  if (status)
    pcp_diloco_config_deinitialize(out_config);
  return status;
}

void pcp_diloco_config_deinitialize(pcp_diloco_config_t* config) {
  pcp_config_deinitialize(&kTable, config);
}
