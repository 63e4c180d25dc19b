// SPDX-License-Identifier: Apache-2.0
//
// The DiLoCo training service's outer loop (service.h). Stateless rounds:
// a worker gets the global parameters and tau batches, runs @diloco_round
// (fresh AdamW moments, src/compile/diloco_program.c) and returns its delta;
// nothing lives on a worker between rounds. So everything a round needs is
// here: the parameter vector, the outer momentum and the outer step, which
// the checkpoint holds, and the batches are a pure function of (seed, outer
// step, shard index). A resumed run repeats an uninterrupted one bit for bit
// as long as the same number of workers report.

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data/data.h"
#include "workloads/workloads.h"

extern char** environ;

// Programs kept per job: one per (backend, target) seen.
#define MAX_PROGRAMS 16
// Workers one round uses at most.
#define MAX_ROUND_WORKERS 64
// Rounds in a row in which every task failed before the job fails.
#define MAX_EMPTY_ROUNDS 5
// Wait slice while polling tasks and the stop hook.
#define WAIT_SLICE_MS 100
// How long a round waits for the previous round's worker count.
#define WORKER_GRACE_MS 15000

//===----------------------------------------------------------------------===//
// Metrics
//===----------------------------------------------------------------------===//

static const char* const kJobLabels[] = {"job", NULL};
static const char* const kKindLabels[] = {"kind", NULL};
static const double kStepBuckets[] = {0.1, 0.25, 0.5, 1,   2.5, 5,
                                      10,  25,   60,  120, 300, 600};

static const pcp_obs_metric_def_t kMetrics[] = {
    {.name = "pcp_training_outer_step_seconds",
     .type = PCP_OBS_METRIC_TYPE_HISTOGRAM,
     .help = "Wall time of one DiLoCo outer step (broadcast, tau inner steps, "
             "average, Nesterov)",
     .buckets = kStepBuckets,
     .bucket_count = sizeof(kStepBuckets) / sizeof(kStepBuckets[0])},
    {.name = "pcp_training_loss",
     .type = PCP_OBS_METRIC_TYPE_GAUGE,
     .help = "Mean of the reporting workers' last inner-step train loss",
     .label_names = kJobLabels},
    {.name = "pcp_training_tokens_per_second",
     .type = PCP_OBS_METRIC_TYPE_GAUGE,
     .help = "Training tokens per second of the last outer step, all workers",
     .label_names = kJobLabels},
    {.name = "pcp_training_wire_bytes_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Tensor bytes on the fabric for DiLoCo: parameters down, deltas "
             "up",
     .label_names = kKindLabels},
    {.name = "pcp_training_token_bytes_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Token batch bytes sent to workers (input ids and targets)"},
    {.name = "pcp_training_outer_steps_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "DiLoCo outer steps completed"},
    {.name = "pcp_training_lost_tasks_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Worker rounds that failed and were dropped from the average"},
};

pcp_status_t pcp_diloco_metrics_register(pcp_obs_registry_t* registry,
                                         pcp_diloco_metrics_t* out_metrics) {
  memset(out_metrics, 0, sizeof(*out_metrics));
  pcp_obs_family_t* families[sizeof(kMetrics) / sizeof(kMetrics[0])];
  PCP_RETURN_IF_ERROR_BARE(pcp_obs_registry_register(
      registry, kMetrics, sizeof(kMetrics) / sizeof(kMetrics[0]), families));
  out_metrics->outer_step_seconds = families[0];
  out_metrics->loss = families[1];
  out_metrics->tokens_per_second = families[2];
  out_metrics->wire_bytes = families[3];
  out_metrics->token_bytes = families[4];
  out_metrics->outer_steps = families[5];
  out_metrics->lost_tasks = families[6];
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Model spec
//===----------------------------------------------------------------------===//

pcp_status_t pcp_diloco_model_spec_resolve(const pcp_diloco_config_t* config,
                                           pcp_models_spec_t* out_spec) {
  if (!config->model.present) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "key 'model_path': the training service trains "
                           "built-in models only for now; give 'model'");
  }
  pcp_models_architecture_t arch = PCP_MODELS_ARCHITECTURE_GPT;
  if (config->model.kind == PCP_DILOCO_MODEL_NANOCHAT) {
    arch = PCP_MODELS_ARCHITECTURE_NANOCHAT;
  } else if (config->model.kind == PCP_DILOCO_MODEL_QWEN3) {
    arch = PCP_MODELS_ARCHITECTURE_QWEN3;
  }
  pcp_models_spec_initialize(arch, out_spec);
  out_spec->layers = config->model.layers;
  out_spec->heads = config->model.heads;
  // Only Qwen3 has grouped-query attention; the others take kv = heads (0).
  out_spec->kv_heads =
      arch == PCP_MODELS_ARCHITECTURE_QWEN3 ? config->model.kv_heads : 0;
  out_spec->width = config->model.width;
  out_spec->vocab = config->model.vocab;
  out_spec->block_size = config->model.block_size;
  out_spec->batch = config->model.batch;
  out_spec->dtype = config->dtype == PCP_DILOCO_DTYPE_BF16
                        ? PCP_ELEMENT_TYPE_BF16
                        : PCP_ELEMENT_TYPE_F32;
  pcp_status_t status = pcp_models_spec_validate(out_spec);
  if (status) {
    char message[512];
    pcp_status_format(status, message, sizeof(message));
    pcp_status_code_t code = pcp_status_code(status);
    pcp_status_ignore(status);
    return pcp_make_status(code, "key 'model': %s", message);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_diloco_experiment_check(const pcp_diloco_config_t* config,
                                         int64_t micro_batch) {
  if (config->dtype == PCP_DILOCO_DTYPE_F16) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'dtype': f16 is not trained (f32 or bf16; "
                           "bf16 keeps f32's range)");
  }
  int64_t ebs = config->effective_batch_size;
  if (ebs > 0 && (ebs % micro_batch != 0 || ebs / micro_batch > 4096)) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "key 'effective_batch_size': %lld must be a multiple of the micro "
        "batch %lld, at most 4096 of them",
        (long long)ebs, (long long)micro_batch);
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Job state
//===----------------------------------------------------------------------===//

typedef struct program_t {
  char backend[16];
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];
  bool ready;
  uint8_t hash[PCP_SHA256_BYTE_LENGTH];
} program_t;

typedef struct job_t {
  const pcp_diloco_job_options_t* options;
  pcp_log_context_t log;
  pcp_diloco_config_t config;
  json_t* experiment;
  char name[256];
  uint64_t seed;
  // The built-in model's spec; for a model_path module only batch,
  // block_size and dtype are meaningful (|foreign|).
  pcp_models_spec_t spec;
  pcp_models_parameter_table_t table;
  bool table_ready;
  bool foreign;  // model_path: the table comes from the module's signature
  // Parameter element type on the workers and the wire (F32 or BF16; the
  // masters here are f32 either way) and the token ids' type (I32 or I64).
  pcp_element_type_t param_type;
  pcp_element_type_t data_type;
  // Micro-batches per inner step (effective_batch_size / micro batch; 1
  // without accumulation): the program sums their gradients before one
  // AdamW step (`pcp compile --accumulate`).
  int64_t accumulation;
  char dir[1024];  // <state_dir>/training/<job_id>
  // checkpoint_dir, a relative one taken under the state dir (the gateway's
  // working directory is nobody's business).
  char checkpoint_dir[1200];
  char* model_text;
  size_t model_length;
  char model_hash[PCP_SHA256_HEX_LENGTH + 1];
  pcp_data_dataset_t* dataset;
  pcp_data_range_t train_range;
  uint64_t train_tokens;  // tokens in train_range: one epoch
  // Classic DiLoCo ends when every worker together has trained max_epochs
  // x train_tokens tokens (upstream stops past max_epochs of its data
  // manager), or at outer_loop_steps, whichever comes first.
  bool epochs_done;
  // The global state.
  size_t parameter_count;
  float* parameters;  // one buffer; every task's sections point into it
  // bf16 models: the masters rounded to nearest even for the broadcast
  // (upstream keeps bf16 masters and truncates; f32 masters do not lose the
  // small outer updates bf16 rounds away).
  uint16_t* wire_parameters;
  uint64_t* tensor_elements;
  pcp_diloco_nesterov_t nesterov;
  bool nesterov_ready;
  pcp_diloco_accumulator_t accumulator;
  bool accumulator_ready;
  void* scratch;        // one worker's flat delta (f32 or bf16)
  uint64_t outer_step;  // completed outer steps
  pcp_rng_t rng;
  // Totals (also in checkpoints' cursor JSON so a resume continues them).
  uint64_t wire_bytes;
  uint64_t token_bytes;
  double last_loss;
  double last_loss_mean;
  // Workers whose delta the last outer step averaged (in the checkpoint's
  // cursor): a round waits up to WORKER_GRACE_MS for that many to be
  // connected, so a gateway restart does not run its first round on
  // whichever worker reconnected first (the batches and the average depend
  // on the worker count).
  uint32_t expected_workers;
  program_t programs[MAX_PROGRAMS];
  uint32_t program_count;
  uint32_t compiled_count;  // programs registered, for the log
  // Streaming: the cursor's "streaming" object the next checkpoint_write
  // stores (set by the streaming loop), and the one job_resume loaded with
  // the directory of its checkpoint file (the workers' state file is beside
  // it).
  json_t* stream_cursor;
  json_t* stream_resume;
  char stream_resume_dir[1300];
} job_t;

static pcp_status_t make_dirs(const char* path) {
  return pcp_file_make_directories(path);
}

static void job_deinitialize(job_t* job) {
  free(job->model_text);
  free(job->parameters);
  free(job->wire_parameters);
  free(job->tensor_elements);
  free(job->scratch);
  if (job->nesterov_ready) {
    pcp_diloco_nesterov_deinitialize(&job->nesterov);
  }
  if (job->accumulator_ready) {
    pcp_diloco_accumulator_deinitialize(&job->accumulator);
  }
  pcp_data_dataset_release(job->dataset);
  if (job->table_ready) {
    pcp_models_parameter_table_deinitialize(&job->table);
  }
  json_decref(job->experiment);
  json_decref(job->stream_cursor);
  json_decref(job->stream_resume);
  pcp_diloco_config_deinitialize(&job->config);
}

// JSON has no NaN: a loss not known yet (or diverged) is null.
static json_t* number_or_null(double value) {
  return isfinite(value) ? json_real(value) : json_null();
}

static bool should_stop(job_t* job) {
  const pcp_diloco_job_hooks_t* hooks = &job->options->hooks;
  return hooks->should_stop && hooks->should_stop(hooks->user_data);
}

// Tensor |i|'s start in the parameter vector.
static size_t tensor_offset(const job_t* job, size_t index) {
  size_t offset = 0;
  for (size_t i = 0; i < index; ++i) {
    offset += (size_t)job->table.parameters[i].element_count;
  }
  return offset;
}

// Passes over the train split so far: the tokens sent (token_bytes counts
// ids and targets) over the split's tokens.
static double epochs_trained(const job_t* job) {
  uint64_t per_token = 2 * (uint64_t)pcp_element_type_byte_size(job->data_type);
  return job->train_tokens ? (double)(job->token_bytes / per_token) /
                                 (double)job->train_tokens
                           : 0;
}

// Micro-batches of B x T tokens one worker consumes per round.
static size_t batches_per_round(const job_t* job) {
  return (size_t)job->config.tau * (size_t)job->accumulation;
}

//===----------------------------------------------------------------------===//
// Set-up
//===----------------------------------------------------------------------===//

static pcp_status_t job_setup(job_t* job) {
  const pcp_diloco_job_options_t* o = job->options;
  PCP_RETURN_IF_ERROR_BARE(pcp_diloco_config_parse_json(
      o->experiment_json, o->experiment_byte_length, &job->config, NULL));
  json_error_t error;
  job->experiment =
      json_loadb(o->experiment_json, o->experiment_byte_length, 0, &error);
  if (!json_is_object(job->experiment)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "experiment: %s",
                           error.text);
  }
  // "name" and "seed" are keys of ours beside upstream's (unknown to the
  // config table, which reports them as such without failing).
  json_t* name = json_object_get(job->experiment, "name");
  snprintf(job->name, sizeof(job->name), "%s",
           json_is_string(name) ? json_string_value(name) : o->job_id);
  json_t* seed = json_object_get(job->experiment, "seed");
  job->seed = json_is_integer(seed) ? (uint64_t)json_integer_value(seed) : 0;
  if (job->config.tau > 4096) {
    // The fused inner loop's bound (pcp compile --inner-steps).
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'tau': %lld inner steps; the round program "
                           "takes at most 4096",
                           (long long)job->config.tau);
  }
  job->param_type = job->config.dtype == PCP_DILOCO_DTYPE_BF16
                        ? PCP_ELEMENT_TYPE_BF16
                        : PCP_ELEMENT_TYPE_F32;
  job->data_type = PCP_ELEMENT_TYPE_I32;
  if (job->config.model.present) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_diloco_model_spec_resolve(&job->config, &job->spec));
    PCP_RETURN_IF_ERROR_BARE(pcp_models_parameter_table_initialize(
        &job->spec, pcp_allocator_system(), &job->table));
    job->table_ready = true;
  } else {
    // A module of the user's: its signature is the table.
    pcp_diloco_module_t module;
    PCP_RETURN_IF_ERROR_BARE(pcp_diloco_module_load(&job->config, &module));
    job->foreign = true;
    job->table = module.table;
    job->table_ready = true;
    job->model_text = module.text;
    job->model_length = module.length;
    job->spec.batch = module.batch;
    job->spec.block_size = module.block_size;
    job->spec.dtype = job->param_type;
    job->data_type = module.data_type;
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_diloco_experiment_check(&job->config, job->spec.batch));
  job->accumulation = job->config.effective_batch_size > 0
                          ? job->config.effective_batch_size / job->spec.batch
                          : 1;
  // One task frame carries a round's tokens: keep it within what a worker
  // takes in one frame.
  uint64_t round_token_bytes =
      2 * (uint64_t)job->config.tau * (uint64_t)job->accumulation *
      (uint64_t)job->spec.batch * (uint64_t)job->spec.block_size *
      (uint64_t)pcp_element_type_byte_size(job->data_type);
  if (round_token_bytes > ((uint64_t)256 << 20)) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "key 'tau': tau x effective batch x block size make %" PRIu64
        " MiB of tokens per worker round; the limit is 256 MiB",
        round_token_bytes >> 20);
  }

  // One task frame carries every parameter as a section (classic) or one
  // fragment's (streaming), within the fabric's per-frame section limit.
  uint32_t max_sections = pcp_proto_limits_default().max_sections;
  size_t per_frame =
      job->config.streaming.present
          ? (job->table.count + (size_t)job->config.streaming.num_fragments -
             1) / (size_t)job->config.streaming.num_fragments +
                1
          : job->table.count + 3;
  if (per_frame > max_sections) {
    return pcp_make_status(
        PCP_STATUS_FAILED_PRECONDITION,
        "key 'model': %zu tensors need %zu sections in one task frame; the "
        "fabric carries at most %u (use fewer layers%s)",
        job->table.count, per_frame, max_sections,
        job->config.streaming.present ? " or more fragments" : "");
  }
  // The dataset: the tokenizer names its format; the model's vocabulary
  // must hold every id.
  pcp_data_format_t format = PCP_DATA_FORMAT_CHAR;
  if (job->config.tokenizer == PCP_DILOCO_TOKENIZER_BYTE) {
    format = PCP_DATA_FORMAT_BYTE;
  } else if (job->config.tokenizer == PCP_DILOCO_TOKENIZER_U16) {
    format = PCP_DATA_FORMAT_U16;
  }
  pcp_data_dataset_options_t data_options;
  pcp_data_dataset_options_initialize(format, &data_options);
  pcp_status_t status =
      pcp_data_dataset_open(job->config.data_path, &data_options,
                            pcp_allocator_system(), &job->dataset);
  if (status) {
    pcp_status_t wrapped =
        pcp_make_status(pcp_status_code(status), "key 'data_path': %s",
                        pcp_status_message(status));
    pcp_status_ignore(status);
    return wrapped;
  }
  uint32_t vocab = pcp_data_dataset_vocab_size(job->dataset);
  // A module's vocabulary is not in its signature: the user vouches.
  if (!job->foreign && (int64_t)vocab > job->spec.vocab) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'model.vocab': the dataset has %u symbols, "
                           "more than the model's vocabulary of %lld",
                           vocab, (long long)job->spec.vocab);
  }
  pcp_data_range_t validation;
  PCP_RETURN_IF_ERROR_BARE(pcp_data_dataset_split(
      job->dataset, 0.1, &job->train_range, &validation));
  PCP_RETURN_IF_ERROR_BARE(pcp_data_dataset_token_count(
      job->dataset, job->train_range, &job->train_tokens));

  const char* checkpoint_dir = job->config.checkpoint_dir;
  if (checkpoint_dir && checkpoint_dir[0]) {
    snprintf(job->checkpoint_dir, sizeof(job->checkpoint_dir), "%s%s%s",
             checkpoint_dir[0] == '/' ? "" : o->state_dir,
             checkpoint_dir[0] == '/' ? "" : "/", checkpoint_dir);
  }
  // The module text (deterministic for a spec) and the job's directory.
  snprintf(job->dir, sizeof(job->dir), "%s/training/%s", o->state_dir,
           o->job_id);
  PCP_RETURN_IF_ERROR_BARE(make_dirs(job->dir));
  if (!job->foreign) {
    pcp_string_builder_t builder;
    pcp_string_builder_initialize(pcp_allocator_system(), (size_t)64 << 20,
                                  &builder);
    status = pcp_models_module_emit(&job->spec, &builder);
    if (!status) {
      job->model_length = builder.size;
      status = pcp_string_builder_take(&builder, &job->model_text);
    }
    pcp_string_builder_deinitialize(&builder);
    PCP_RETURN_IF_ERROR_BARE(status);
  }
  char path[1200];
  snprintf(path, sizeof(path), "%s/model.mlir", job->dir);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_file_write_atomic(path, job->model_text, job->model_length));

  // Global state: parameters (seeded init), velocity, accumulator.
  size_t n = (size_t)job->table.total_elements;
  job->parameter_count = n;
  job->parameters = calloc(n ? n : 1, sizeof(float));
  job->tensor_elements = calloc(job->table.count + 1, sizeof(uint64_t));
  job->scratch = calloc(n ? n : 1, sizeof(float));
  bool bf16 = job->param_type == PCP_ELEMENT_TYPE_BF16;
  if (bf16) {
    job->wire_parameters = calloc(n ? n : 1, sizeof(uint16_t));
  }
  void** buffers = calloc(job->table.count + 1, sizeof(void*));
  if (!job->parameters || !job->tensor_elements || !job->scratch || !buffers ||
      (bf16 && !job->wire_parameters)) {
    free(buffers);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "%zu parameters", n);
  }
  for (size_t i = 0; i < job->table.count; ++i) {
    // The initializer writes the table's type: bf16 goes through the wire
    // buffer and is widened, so the f32 masters start at the values the
    // workers see.
    buffers[i] = bf16 ? (void*)(job->wire_parameters + tensor_offset(job, i))
                      : (void*)(job->parameters + tensor_offset(job, i));
    job->tensor_elements[i] = (uint64_t)job->table.parameters[i].element_count;
  }
  pcp_models_parameters_initialize(&job->table, job->seed, buffers);
  free(buffers);
  if (bf16) {
    pcp_diloco_bf16_dequantize(job->wire_parameters, n, job->parameters);
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_diloco_nesterov_initialize(
      pcp_allocator_system(), n, (float)job->config.outer_learning_rate,
      (float)job->config.nesterov_momentum, &job->nesterov));
  job->nesterov_ready = true;
  PCP_RETURN_IF_ERROR_BARE(pcp_diloco_accumulator_initialize(
      pcp_allocator_system(), n, &job->accumulator));
  job->accumulator_ready = true;
  pcp_rng_initialize(job->seed, &job->rng);
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Checkpoints and the exported model
//===----------------------------------------------------------------------===//

#define CURSOR_KIND_CLASSIC "pcp.diloco.stateless.v1"
#define CURSOR_KIND_STREAMING "pcp.diloco.streaming.v1"

// The checkpoint's opaque cursor: what a resume needs beyond params and
// velocity. The batches depend only on (seed, outer step, shard), so the
// cursor is the seed plus the running totals. A streaming job's adds its
// "streaming" object (stream_cursor_json).
static char* cursor_json(const job_t* job) {
  json_t* cursor = json_pack(
      "{s:s, s:I, s:I, s:I, s:I, s:o, s:o}", "kind",
      job->config.streaming.present ? CURSOR_KIND_STREAMING
                                    : CURSOR_KIND_CLASSIC,
      "seed", (json_int_t)job->seed, "workers",
      (json_int_t)job->expected_workers, "wire_bytes",
      (json_int_t)job->wire_bytes, "token_bytes", (json_int_t)job->token_bytes,
      "loss", number_or_null(job->last_loss), "loss_mean",
      number_or_null(job->last_loss_mean));
  if (cursor && job->stream_cursor) {
    json_object_set(cursor, "streaming", job->stream_cursor);
  }
  char* text = cursor ? json_dumps(cursor, JSON_COMPACT) : NULL;
  json_decref(cursor);
  return text;
}

static pcp_status_t checkpoint_restore(job_t* job,
                                       const pcp_diloco_checkpoint_t* c,
                                       const char* from) {
  if (c->parameter_count != job->parameter_count ||
      c->tensor_count != job->table.count) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "checkpoint %s holds %zu parameters in %u "
                           "tensors; the model has %zu in %zu",
                           from, c->parameter_count, c->tensor_count,
                           job->parameter_count, job->table.count);
  }
  json_t* cursor =
      c->cursor_byte_length
          ? json_loadb((const char*)c->cursor, c->cursor_byte_length, 0, NULL)
          : NULL;
  // A streaming checkpoint holds worker state a classic job has no use for
  // (and a classic one lacks it): each kind resumes only its own.
  const char* kind = json_string_value(json_object_get(cursor, "kind"));
  bool streaming = kind && strcmp(kind, CURSOR_KIND_STREAMING) == 0;
  json_t* stream = json_object_get(cursor, "streaming");
  if (streaming != job->config.streaming.present ||
      (streaming && !json_is_object(stream))) {
    json_decref(cursor);
    return pcp_make_status(
        PCP_STATUS_FAILED_PRECONDITION,
        "checkpoint %s is from a %s run; this job is a %s one", from,
        streaming ? "streaming DiLoCo" : "classic DiLoCo",
        job->config.streaming.present ? "streaming DiLoCo" : "classic DiLoCo");
  }
  if (streaming) {
    json_decref(job->stream_resume);
    job->stream_resume = json_incref(stream);
    snprintf(job->stream_resume_dir, sizeof(job->stream_resume_dir), "%s",
             from);
    char* slash = strrchr(job->stream_resume_dir, '/');
    if (slash) {
      *slash = 0;
    } else {
      snprintf(job->stream_resume_dir, sizeof(job->stream_resume_dir), ".");
    }
  }
  memcpy(job->parameters, c->parameters, c->parameter_count * sizeof(float));
  memcpy(job->nesterov.velocity, c->velocity,
         c->parameter_count * sizeof(float));
  job->outer_step = c->outer_step;
  job->rng = c->rng;
  if (cursor) {
    job->wire_bytes =
        (uint64_t)json_integer_value(json_object_get(cursor, "wire_bytes"));
    job->token_bytes =
        (uint64_t)json_integer_value(json_object_get(cursor, "token_bytes"));
    job->expected_workers =
        (uint32_t)json_integer_value(json_object_get(cursor, "workers"));
    json_t* loss = json_object_get(cursor, "loss");
    json_t* loss_mean = json_object_get(cursor, "loss_mean");
    job->last_loss = json_is_number(loss) ? json_number_value(loss) : NAN;
    job->last_loss_mean =
        json_is_number(loss_mean) ? json_number_value(loss_mean) : NAN;
  }
  json_decref(cursor);
  PCP_LOG(PCP_LOG_INFO, &job->log, "resumed from %s outer_step=%" PRIu64, from,
          job->outer_step);
  return pcp_ok_status();
}

static pcp_status_t checkpoint_file_restore(job_t* job, const char* path) {
  pcp_diloco_checkpoint_t c;
  PCP_RETURN_IF_ERROR_BARE(pcp_diloco_checkpoint_load(path, &c));
  pcp_status_t status = checkpoint_restore(job, &c, path);
  pcp_diloco_checkpoint_deinitialize(&c);
  return status;
}

// The job's own newest checkpoint (a restart), else with "resume" the one
// under checkpoint_dir. NOT_FOUND-free: no checkpoint is a fresh start.
static pcp_status_t job_resume(job_t* job) {
  pcp_store_checkpoint_t row;
  pcp_status_t status = pcp_store_checkpoint_get(
      job->options->store, job->options->job_id, -1, &row);
  if (!status) {
    PCP_RETURN_IF_ERROR_BARE(pcp_store_checkpoint_verify(&row));
    return checkpoint_file_restore(job, row.path);
  }
  if (pcp_status_code(status) != PCP_STATUS_NOT_FOUND) {
    return status;
  }
  pcp_status_ignore(status);
  if (job->config.resume && job->checkpoint_dir[0]) {
    char path[1300];
    snprintf(path, sizeof(path), "%s/latest.ckpt", job->checkpoint_dir);
    if (pcp_file_exists(path)) {
      return checkpoint_file_restore(job, path);
    }
    PCP_LOG(PCP_LOG_INFO, &job->log,
            "resume asked but %s has no checkpoint: fresh start", path);
  }
  return pcp_ok_status();
}

// Writes the masters in the model's dtype (bf16 rounded to nearest even)
// as |path|, named as the table names them.
static pcp_status_t weights_save(job_t* job, const char* path) {
  const void** buffers = calloc(job->table.count + 1, sizeof(void*));
  if (!buffers) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "export buffers");
  }
  bool bf16 = job->param_type == PCP_ELEMENT_TYPE_BF16;
  if (bf16) {
    pcp_diloco_bf16_quantize(job->parameters, job->parameter_count,
                             job->wire_parameters);
  }
  for (size_t i = 0; i < job->table.count; ++i) {
    buffers[i] =
        bf16 ? (const void*)(job->wire_parameters + tensor_offset(job, i))
             : (const void*)(job->parameters + tensor_offset(job, i));
  }
  pcp_status_t status = pcp_models_safetensors_save(
      &job->table, (const void* const*)buffers, path);
  free(buffers);
  return status;
}

// <state_dir>/models/<job_id>/model.safetensors then model.json (the
// inference service's layout; model.json last so a reader never sees it
// before its weights). A model_path module has no architecture the
// inference service knows: its weights go to the job's directory
// (<state_dir>/training/<job_id>/model.safetensors, "param_<i>" in
// argument order) and nothing is served.
static pcp_status_t model_export(job_t* job) {
  const pcp_diloco_job_options_t* o = job->options;
  char path[1300];
  if (job->foreign) {
    snprintf(path, sizeof(path), "%s/model.safetensors", job->dir);
    return weights_save(job, path);
  }
  char dir[1200];
  snprintf(dir, sizeof(dir), "%s/models/%s", o->state_dir, o->job_id);
  PCP_RETURN_IF_ERROR_BARE(make_dirs(dir));
  snprintf(path, sizeof(path), "%s/model.safetensors", dir);
  pcp_status_t status = weights_save(job, path);
  PCP_RETURN_IF_ERROR_BARE(status);
  json_t* tokenizer = NULL;
  if (pcp_data_dataset_format(job->dataset) == PCP_DATA_FORMAT_CHAR) {
    // The vocabulary in id order is the decoding of ids 0..count-1.
    size_t count = 0;
    pcp_data_dataset_symbols(job->dataset, &count);
    int32_t* ids = malloc((count + 1) * sizeof(int32_t));
    char* text = malloc(count * 4 + 1);
    size_t used = 0;
    pcp_status_t decoded =
        ids && text ? pcp_ok_status()
                    : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "vocab");
    for (size_t i = 0; ids && i < count; ++i) {
      ids[i] = (int32_t)i;
    }
    if (!decoded) {
      decoded = pcp_data_dataset_decode(job->dataset, ids, count, text,
                                        count * 4 + 1, &used);
    }
    free(ids);
    if (decoded) {
      free(text);
      return decoded;
    }
    tokenizer = json_pack("{s:s, s:s%}", "kind", "char", "vocab", text, used);
    free(text);
  } else if (pcp_data_dataset_format(job->dataset) == PCP_DATA_FORMAT_BYTE) {
    tokenizer = json_pack("{s:s}", "kind", "byte");
  } else {
    tokenizer = json_pack("{s:s}", "kind", "u16");
  }
  json_t* model = json_pack(
      "{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s, s:o, s:s, s:I, "
      "s:o}",
      "name", job->name, "architecture",
      pcp_models_architecture_name(job->spec.architecture), "layers",
      (json_int_t)job->spec.layers, "heads", (json_int_t)job->spec.heads,
      "kv_heads", (json_int_t)pcp_models_spec_kv_heads(&job->spec), "width",
      (json_int_t)job->spec.width, "vocab", (json_int_t)job->spec.vocab,
      "block_size", (json_int_t)job->spec.block_size, "dtype",
      pcp_element_type_name(job->param_type), "weights", "model.safetensors",
      "tokenizer", tokenizer ? tokenizer : json_object(), "job_id", o->job_id,
      "outer_step", (json_int_t)job->outer_step, "loss",
      number_or_null(job->last_loss));
  char* text = model ? json_dumps(model, JSON_INDENT(2)) : NULL;
  json_decref(model);
  if (!text) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "model.json");
  }
  snprintf(path, sizeof(path), "%s/model.json", dir);
  status = pcp_file_write_atomic(path, text, strlen(text));
  free(text);
  return status;
}

static pcp_status_t checkpoint_write(job_t* job) {
  char* cursor = cursor_json(job);
  if (!cursor) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "cursor");
  }
  pcp_diloco_checkpoint_t c = {
      .outer_step = job->outer_step,
      .rng = job->rng,
      .tensor_count = (uint32_t)job->table.count,
      .tensor_elements = job->tensor_elements,
      .parameter_count = job->parameter_count,
      .parameters = job->parameters,
      .velocity = job->nesterov.velocity,
      .cursor = (uint8_t*)cursor,
      .cursor_byte_length = strlen(cursor),
  };
  pcp_store_checkpoint_t row;
  pcp_status_t status = pcp_diloco_checkpoint_store_write(
      &c, job->options->store, job->options->job_id, &row);
  if (status && pcp_status_code(status) == PCP_STATUS_ALREADY_EXISTS) {
    // The same step again (a round repeated after a restart): the state is
    // the same by construction.
    pcp_status_ignore(status);
    status = pcp_ok_status();
  }
  if (!status && job->checkpoint_dir[0]) {
    char path[1300];
    status = make_dirs(job->checkpoint_dir);
    snprintf(path, sizeof(path), "%s/latest.ckpt", job->checkpoint_dir);
    if (!status) {
      status = pcp_diloco_checkpoint_save(&c, path);
    }
  }
  free(cursor);
  PCP_RETURN_IF_ERROR_BARE(status);
  PCP_LOG(PCP_LOG_INFO, &job->log, "checkpoint outer_step=%" PRIu64,
          job->outer_step);
  return model_export(job);
}

//===----------------------------------------------------------------------===//
// Programs
//===----------------------------------------------------------------------===//

// Runs `pcp compile [--program KIND --inner-steps K] MLIR` for (backend,
// target) in a child process (no MLIR in the gateway), its output in a file
// named by the content hash of everything that shapes the program, so a
// restarted job (or the same experiment again) reuses it without deriving
// anything; then registers it with the fabric. |kind| NULL compiles the
// module as it is.
static pcp_status_t child_compile(job_t* job, const char* mlir_path,
                                  const char* content_hash, const char* kind,
                                  int64_t inner_steps, const char* backend,
                                  const char* target,
                                  uint8_t out_hash[PCP_SHA256_BYTE_LENGTH]) {
  const pcp_diloco_job_options_t* o = job->options;
  const char* delta =
      job->config.deltas_dtype == PCP_DILOCO_WIRE_BF16 ? "bf16" : "f32";
  char steps[32];
  snprintf(steps, sizeof(steps), "%" PRId64, inner_steps);
  char accumulate[32];
  snprintf(accumulate, sizeof(accumulate), "%" PRId64, job->accumulation);
  char key_text[512];
  snprintf(key_text, sizeof(key_text),
           "pcp.diloco.program.v2|%s|%s|%s|%s|%s|%s%s%s", content_hash,
           kind ? kind : "-", steps, delta, backend, target,
           kind && job->accumulation > 1 ? "|accumulate=" : "",
           kind && job->accumulation > 1 ? accumulate : "");
  pcp_sha256_t digest;
  pcp_sha256_compute(key_text, strlen(key_text), &digest);
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&digest, hex);
  char artifacts[1100];
  snprintf(artifacts, sizeof(artifacts), "%s/artifacts", o->state_dir);
  PCP_RETURN_IF_ERROR_BARE(make_dirs(artifacts));
  char vmfb[1300];
  snprintf(vmfb, sizeof(vmfb), "%s/diloco-%.32s.vmfb", artifacts, hex);
  if (!pcp_file_exists(vmfb)) {
    char log_path[1300];
    snprintf(log_path, sizeof(log_path), "%s/compile-%.12s.log", job->dir, hex);
    char* argv[24];
    int argc = 0;
    argv[argc++] = (char*)o->pcp_path;
    argv[argc++] = "compile";
    if (kind) {
      argv[argc++] = "--program";
      argv[argc++] = (char*)kind;
      argv[argc++] = "--inner-steps";
      argv[argc++] = steps;
      argv[argc++] = "--delta-dtype";
      argv[argc++] = (char*)delta;
      if (job->accumulation > 1) {
        argv[argc++] = "--accumulate";
        argv[argc++] = accumulate;
      }
    }
    argv[argc++] = "--backend";
    argv[argc++] = (char*)backend;
    if (target[0]) {
      argv[argc++] = "--target";
      argv[argc++] = (char*)target;
    }
    argv[argc++] = "--cache-dir";
    argv[argc++] = artifacts;
    argv[argc++] = "-o";
    argv[argc++] = vmfb;
    argv[argc++] = (char*)mlir_path;
    argv[argc] = NULL;
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      return pcp_status_from_errno(errno, "open %s", log_path);
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fd, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, fd, STDERR_FILENO);
    pid_t pid = 0;
    PCP_LOG(PCP_LOG_INFO, &job->log,
            "compiling program=%s inner_steps=%s backend=%s target=%s",
            kind ? kind : "module", steps, backend,
            target[0] ? target : "default");
    int64_t start = pcp_clock_now_ns(o->clock);
    int rc = posix_spawn(&pid, o->pcp_path, &actions, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fd);
    if (rc != 0) {
      return pcp_status_from_errno(rc, "starting %s compile", o->pcp_path);
    }
    // Polled, so a cancel (or a stopping gateway) does not wait for a
    // compile that may take minutes: the child is killed.
    int wait_status = 0;
    for (;;) {
      pid_t done = waitpid(pid, &wait_status, WNOHANG);
      if (done == pid || (done < 0 && errno != EINTR)) {
        break;
      }
      if (done == 0 && should_stop(job)) {
        kill(pid, SIGKILL);
        while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
        }
        return pcp_make_status(PCP_STATUS_CANCELLED,
                               "training stopped while compiling");
      }
      pcp_sleep_ms(WAIT_SLICE_MS);
    }
    if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
      return pcp_make_status(
          WIFEXITED(wait_status) ? PCP_STATUS_INVALID_ARGUMENT
                                 : PCP_STATUS_INTERNAL,
          "pcp compile --program %s for %s/%s failed (%s %d); see %s",
          kind ? kind : "-", backend, target,
          WIFEXITED(wait_status) ? "exit" : "signal",
          WIFEXITED(wait_status) ? WEXITSTATUS(wait_status)
                                 : WTERMSIG(wait_status),
          log_path);
    }
    PCP_LOG(PCP_LOG_INFO, &job->log, "program compiled seconds=%.1f",
            (double)(pcp_clock_now_ns(o->clock) - start) / 1e9);
  }
  void* bytes = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_file_read_all(vmfb, (size_t)1 << 30, &bytes, &length));
  pcp_status_t status = pcp_fabric_program_register(o->fabric, bytes, length,
                                                    backend, target, out_hash);
  free(bytes);
  return status;
}

static pcp_status_t program_build(job_t* job, program_t* program) {
  char model[1200];
  snprintf(model, sizeof(model), "%s/model.mlir", job->dir);
  PCP_RETURN_IF_ERROR_BARE(child_compile(job, model, job->model_hash, "diloco",
                                         job->config.tau, program->backend,
                                         program->target, program->hash));
  program->ready = true;
  ++job->compiled_count;
  return pcp_ok_status();
}

static program_t* program_find(job_t* job, const char* backend,
                               const char* target) {
  for (uint32_t i = 0; i < job->program_count; ++i) {
    if (strcmp(job->programs[i].backend, backend) == 0 &&
        strcmp(job->programs[i].target, target) == 0) {
      return &job->programs[i];
    }
  }
  return NULL;
}

//===----------------------------------------------------------------------===//
// One outer step
//===----------------------------------------------------------------------===//

typedef struct round_task_t {
  char worker_id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  program_t* program;
  int32_t* tokens;    // ids then targets, tau*B*T each
  int64_t* tokens64;  // the same widened, for a module taking i64 ids
  pcp_fabric_task_t* task;
} round_task_t;

typedef struct round_t {
  round_task_t tasks[MAX_ROUND_WORKERS];
  uint32_t count;
  pcp_proto_section_t* sections;  // shared parameter sections + per-task
  float lr;
} round_t;

static int compare_ids(const void* a, const void* b) {
  return strcmp(((const round_task_t*)a)->worker_id,
                ((const round_task_t*)b)->worker_id);
}

// Connected workers with a program, sorted by id; programs for new
// (backend, target) kinds are compiled first (the kind joins this round).
static pcp_status_t round_workers(job_t* job, round_t* round) {
  pcp_fabric_worker_info_t* infos =
      calloc(MAX_ROUND_WORKERS * 4, sizeof(*infos));
  if (!infos) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "worker list");
  }
  uint32_t count = pcp_fabric_worker_list(job->options->fabric, infos,
                                          MAX_ROUND_WORKERS * 4, NULL);
  pcp_status_t status = pcp_ok_status();
  round->count = 0;
  for (uint32_t i = 0; i < count && !status; ++i) {
    const pcp_fabric_worker_info_t* w = &infos[i];
    if (w->state != PCP_FABRIC_WORKER_CONNECTED ||
        round->count >= MAX_ROUND_WORKERS) {
      continue;
    }
    program_t* program = program_find(job, w->backend, w->target);
    if (!program) {
      if (job->program_count >= MAX_PROGRAMS) {
        continue;
      }
      program = &job->programs[job->program_count++];
      memset(program, 0, sizeof(*program));
      snprintf(program->backend, sizeof(program->backend), "%s", w->backend);
      snprintf(program->target, sizeof(program->target), "%s", w->target);
      status = program_build(job, program);
      if (status) {
        break;
      }
    }
    if (!program->ready) {
      continue;
    }
    round_task_t* t = &round->tasks[round->count++];
    memset(t, 0, sizeof(*t));
    snprintf(t->worker_id, sizeof(t->worker_id), "%s", w->worker_id);
    t->program = program;
  }
  free(infos);
  qsort(round->tasks, round->count, sizeof(round->tasks[0]), compare_ids);
  return status;
}

static void round_release(round_t* round) {
  for (uint32_t i = 0; i < round->count; ++i) {
    pcp_fabric_task_release(round->tasks[i].task);
    free(round->tasks[i].tokens);
    free(round->tasks[i].tokens64);
  }
  free(round->sections);
  memset(round, 0, sizeof(*round));
}

// Samples every worker's tau batches: shard k of the plan over the train
// range among |count| shard names (not worker ids, so the batches do not
// depend on which worker runs them), seeded from (seed, step, shard).
static pcp_status_t round_sample(job_t* job, round_t* round) {
  uint32_t w = round->count;
  const char* names[MAX_ROUND_WORKERS];
  char name_storage[MAX_ROUND_WORKERS][24];
  for (uint32_t k = 0; k < w; ++k) {
    snprintf(name_storage[k], sizeof(name_storage[k]), "shard-%04u", k);
    names[k] = name_storage[k];
  }
  pcp_data_assignment_t* plan = calloc(w, sizeof(*plan));
  if (!plan) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "shard plan");
  }
  uint32_t b = (uint32_t)job->spec.batch;
  uint32_t t = (uint32_t)job->spec.block_size;
  size_t per_step = (size_t)b * t;
  // tau inner steps of |accumulation| micro-batches each, in that order
  // ([tau, A, B, T] row-major).
  size_t tau = batches_per_round(job);
  pcp_status_t status =
      pcp_data_shard_plan(job->dataset, job->train_range, t, names, w,
                          job->outer_step, job->seed, plan);
  for (uint32_t k = 0; k < w && !status; ++k) {
    round_task_t* task = &round->tasks[k];
    task->tokens = malloc(2 * tau * per_step * sizeof(int32_t));
    if (!task->tokens) {
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "batches");
      break;
    }
    pcp_data_sampler_options_t sampler_options = {
        .sampling = job->config.sampling == PCP_DILOCO_SAMPLING_FIFO
                        ? PCP_DATA_SAMPLING_SEQUENTIAL
                        : PCP_DATA_SAMPLING_RANDOM,
        .batch_size = b,
        .block_size = t,
        .seed = plan[k].seed,
    };
    pcp_data_sampler_t* sampler = NULL;
    status =
        pcp_data_sampler_create(job->dataset, plan[k].range, &sampler_options,
                                pcp_allocator_system(), &sampler);
    if (status) {
      break;
    }
    if (sampler_options.sampling == PCP_DATA_SAMPLING_SEQUENTIAL) {
      // fifo without state on the workers: the window of outer step s is
      // where s rounds of tau batches have taken a sequential reader.
      pcp_data_cursor_t cursor;
      pcp_data_sampler_cursor(sampler, &cursor);
      uint64_t tokens = pcp_data_sampler_token_count(sampler);
      uint64_t window = per_step;
      uint64_t windows = tokens > window ? (tokens - 1) / window : 1;
      uint64_t index = job->outer_step * tau % windows;
      cursor.position = index * window;
      cursor.epoch = job->outer_step * tau / windows;
      pcp_status_ignore(pcp_data_sampler_restore(sampler, &cursor));
    }
    int32_t* ids = task->tokens;
    int32_t* targets = task->tokens + tau * per_step;
    for (size_t s = 0; s < tau; ++s) {
      pcp_data_sampler_next(sampler, ids + s * per_step, targets + s * per_step,
                            NULL);
    }
    pcp_data_sampler_release(sampler);
    if (job->data_type == PCP_ELEMENT_TYPE_I64) {
      size_t count = 2 * tau * per_step;
      task->tokens64 = malloc(count * sizeof(int64_t));
      if (!task->tokens64) {
        status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "batches");
        break;
      }
      for (size_t i = 0; i < count; ++i) {
        task->tokens64[i] = task->tokens[i];
      }
    }
  }
  free(plan);
  return status;
}

// Tensor |i| of the masters as it goes down to the workers: f32, or the
// bf16 rounding (to nearest even) in wire_parameters for a bf16 model,
// which the caller refreshed after the last master update.
static void master_section(job_t* job, size_t i, pcp_proto_section_t* s) {
  const pcp_models_parameter_t* p = &job->table.parameters[i];
  memset(s, 0, sizeof(*s));
  s->name = p->name;
  s->element_type = p->element_type;
  s->rank = (uint32_t)p->rank;
  for (int32_t d = 0; d < p->rank; ++d) {
    s->shape[d] = p->dims[d];
  }
  s->byte_length = p->byte_length;
  s->data = job->param_type == PCP_ELEMENT_TYPE_BF16
                ? (const void*)(job->wire_parameters + tensor_offset(job, i))
                : (const void*)(job->parameters + tensor_offset(job, i));
}

static pcp_status_t round_submit(job_t* job, round_t* round) {
  size_t n = job->table.count;
  // Sections: n parameters (shared), then per task lr + ids + targets.
  round->sections =
      calloc(n + 3 * (size_t)round->count + 1, sizeof(pcp_proto_section_t));
  if (!round->sections) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "sections");
  }
  round->lr = (float)job->config.learning_rate;
  bool bf16 = job->param_type == PCP_ELEMENT_TYPE_BF16;
  if (bf16) {
    pcp_diloco_bf16_quantize(job->parameters, job->parameter_count,
                             job->wire_parameters);
  }
  for (size_t i = 0; i < n; ++i) {
    master_section(job, i, &round->sections[i]);
  }
  size_t tau = batches_per_round(job);
  size_t per_step = (size_t)(job->spec.batch * job->spec.block_size);
  for (uint32_t k = 0; k < round->count; ++k) {
    round_task_t* t = &round->tasks[k];
    pcp_proto_section_t* extra = &round->sections[n + 3 * (size_t)k];
    extra[0] = (pcp_proto_section_t){.name = "lr",
                                     .element_type = PCP_ELEMENT_TYPE_F32,
                                     .rank = 0,
                                     .byte_length = sizeof(float),
                                     .data = &round->lr};
    bool wide = job->data_type == PCP_ELEMENT_TYPE_I64;
    for (int j = 0; j < 2; ++j) {
      pcp_proto_section_t* s = &extra[1 + j];
      s->name = j ? "targets" : "input_ids";
      s->element_type = job->data_type;
      // [tau, B, T], or [tau, A, B, T] with accumulation.
      uint32_t r = 0;
      s->shape[r++] = job->config.tau;
      if (job->accumulation > 1) {
        s->shape[r++] = job->accumulation;
      }
      s->shape[r++] = job->spec.batch;
      s->shape[r++] = job->spec.block_size;
      s->rank = r;
      s->byte_length =
          tau * per_step * (wide ? sizeof(int64_t) : sizeof(int32_t));
      s->data = wide ? (const void*)(t->tokens64 + (size_t)j * tau * per_step)
                     : (const void*)(t->tokens + (size_t)j * tau * per_step);
    }
    // Argument order: parameters, lr, ids, targets.
    pcp_proto_section_t* inputs = calloc(n + 3, sizeof(*inputs));
    if (!inputs) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "task inputs");
    }
    // The task params copy the section array (struct array copied, data
    // borrowed), so the data of every task still points at the one
    // parameter buffer.
    memcpy(inputs, round->sections, n * sizeof(*inputs));
    memcpy(inputs + n, extra, 3 * sizeof(*inputs));
    pcp_fabric_task_params_t params;
    memset(&params, 0, sizeof(params));
    memcpy(params.program, t->program->hash, sizeof(params.program));
    params.function = "diloco_round";
    params.inputs = inputs;
    params.input_count = (uint32_t)(n + 3);
    params.worker_id = t->worker_id;
    params.max_attempts = 1;
    pcp_status_t status =
        pcp_fabric_task_submit(job->options->fabric, &params, &t->task);
    free(inputs);
    if (status) {
      // A worker gone between the list and the submit: not in this round.
      PCP_LOG(PCP_LOG_WARN, &job->log, "round task for %s not submitted: %s",
              t->worker_id, pcp_status_message(status));
      pcp_status_ignore(status);
      t->task = NULL;
    }
  }
  return pcp_ok_status();
}

// Waits for every task; on stop cancels them and waits for them still (they
// borrow the round's buffers). Returns true when stopped.
static bool round_wait(job_t* job, round_t* round) {
  bool stopped = false;
  for (uint32_t k = 0; k < round->count; ++k) {
    pcp_fabric_task_t* task = round->tasks[k].task;
    while (task && !pcp_fabric_task_wait(task, WAIT_SLICE_MS)) {
      if (!stopped && should_stop(job)) {
        stopped = true;
        for (uint32_t j = 0; j < round->count; ++j) {
          if (round->tasks[j].task) {
            pcp_fabric_task_cancel(round->tasks[j].task);
          }
        }
      }
    }
  }
  return stopped;
}

typedef struct round_outcome_t {
  uint32_t reporters;
  double loss_last;
  double loss_mean;
  uint64_t parameter_bytes;
  uint64_t delta_bytes;
  uint64_t token_bytes;
  char last_error[256];
} round_outcome_t;

// Adds every successful task's delta to the accumulator (in worker-id
// order, so the sum is the same in a replay).
static pcp_status_t round_collect(job_t* job, round_t* round,
                                  round_outcome_t* out) {
  memset(out, 0, sizeof(*out));
  pcp_diloco_accumulator_reset(&job->accumulator);
  size_t n = job->table.count;
  size_t tau = (size_t)job->config.tau;
  bool bf16 = job->config.deltas_dtype == PCP_DILOCO_WIRE_BF16;
  size_t element_size = bf16 ? 2 : 4;
  for (uint32_t k = 0; k < round->count; ++k) {
    round_task_t* t = &round->tasks[k];
    if (!t->task) {
      continue;
    }
    pcp_status_t task_status = pcp_fabric_task_status(t->task);
    const pcp_proto_section_t* outputs = NULL;
    size_t count = 0;
    pcp_status_t status = pcp_ok_status();
    if (task_status) {
      snprintf(out->last_error, sizeof(out->last_error), "worker %s: %s",
               t->worker_id, pcp_status_message(task_status));
    } else {
      status = pcp_fabric_task_outputs(t->task, &outputs, &count);
    }
    if (!task_status && !status && count != n + 1) {
      status = pcp_make_status(PCP_STATUS_INTERNAL,
                               "worker %s returned %zu outputs, expected %zu",
                               t->worker_id, count, n + 1);
    }
    // Check every delta's size before copying any.
    for (size_t i = 0; !task_status && !status && i < n; ++i) {
      uint64_t want =
          (uint64_t)job->table.parameters[i].element_count * element_size;
      if (outputs[i].byte_length != want) {
        status = pcp_make_status(PCP_STATUS_INTERNAL,
                                 "worker %s: delta %zu has %" PRIu64
                                 " bytes, expected %" PRIu64,
                                 t->worker_id, i, outputs[i].byte_length, want);
      }
    }
    if (!task_status && !status &&
        outputs[n].byte_length != tau * sizeof(float)) {
      status = pcp_make_status(PCP_STATUS_INTERNAL,
                               "worker %s: losses of %" PRIu64 " bytes",
                               t->worker_id, outputs[n].byte_length);
    }
    if (status) {
      snprintf(out->last_error, sizeof(out->last_error), "%s",
               pcp_status_message(status));
      pcp_status_ignore(status);
      continue;
    }
    if (task_status) {
      if (job->options->metrics) {
        pcp_obs_family_add(job->options->metrics->lost_tasks, NULL, 1);
      }
      PCP_LOG(PCP_LOG_WARN, &job->log,
              "worker round lost outer_step=%" PRIu64 " %s",
              job->outer_step + 1, out->last_error);
      continue;
    }
    uint8_t* flat = job->scratch;
    size_t offset = 0;
    for (size_t i = 0; i < n; ++i) {
      memcpy(flat + offset, outputs[i].data, (size_t)outputs[i].byte_length);
      offset += (size_t)outputs[i].byte_length;
      out->delta_bytes += outputs[i].byte_length;
      out->parameter_bytes += job->table.parameters[i].byte_length;
    }
    PCP_RETURN_IF_ERROR_BARE(
        bf16 ? pcp_diloco_accumulator_add_bf16(&job->accumulator, job->scratch,
                                               job->parameter_count)
             : pcp_diloco_accumulator_add_f32(&job->accumulator, job->scratch,
                                              job->parameter_count));
    // Sections are 64-byte aligned in the received frame.
    const float* losses = outputs[n].data;
    double sum = 0;
    for (size_t s = 0; s < tau; ++s) {
      sum += losses[s];
    }
    out->loss_last += losses[tau - 1];
    out->loss_mean += sum / (double)tau;
    out->token_bytes += 2 * batches_per_round(job) * (size_t)job->spec.batch *
                        (size_t)job->spec.block_size *
                        pcp_element_type_byte_size(job->data_type);
    ++out->reporters;
  }
  if (out->reporters) {
    out->loss_last /= out->reporters;
    out->loss_mean /= out->reporters;
  }
  return pcp_ok_status();
}

static json_t* progress_json(const job_t* job, const round_outcome_t* outcome,
                             double seconds, double tokens_per_second) {
  json_t* progress = json_pack(
      "{s:I, s:I, s:o, s:o, s:f, s:I, s:I, s:I, s:I, s:f, s:I, s:s}",
      "outer_step", (json_int_t)job->outer_step, "outer_loop_steps",
      (json_int_t)job->config.outer_loop_steps, "loss",
      number_or_null(job->last_loss), "loss_mean",
      number_or_null(job->last_loss_mean), "tokens_per_second",
      tokens_per_second, "wire_bytes", (json_int_t)job->wire_bytes,
      "step_wire_bytes",
      (json_int_t)(outcome ? outcome->parameter_bytes + outcome->delta_bytes
                           : 0),
      "token_bytes", (json_int_t)job->token_bytes, "workers",
      (json_int_t)(outcome ? outcome->reporters : 0), "seconds", seconds,
      "parameter_count", (json_int_t)job->parameter_count, "deltas_dtype",
      job->config.deltas_dtype == PCP_DILOCO_WIRE_BF16 ? "bf16" : "f32");
  if (progress) {
    // The submit-time progress object (and `pcp submit train`) spell it
    // tokens_per_s.
    json_object_set_new(progress, "tokens_per_s", json_real(tokens_per_second));
  }
  return progress;
}

static void progress_report(job_t* job, json_t* progress) {
  const pcp_diloco_job_hooks_t* hooks = &job->options->hooks;
  if (progress && hooks->progress) {
    hooks->progress(hooks->user_data, progress);
  }
}

// One outer step. *out_stopped when the stop hook fired; *out_advanced
// when the step completed (somebody reported).
static pcp_status_t outer_step_run(job_t* job, bool* out_stopped,
                                   bool* out_advanced, char* last_error,
                                   size_t last_error_capacity) {
  *out_stopped = false;
  *out_advanced = false;
  const pcp_diloco_job_options_t* o = job->options;
  int64_t start = pcp_clock_now_ns(o->clock);
  // Wait (bounded) for as many workers as the last step averaged.
  int64_t grace_end = start + (int64_t)WORKER_GRACE_MS * 1000000;
  while (job->expected_workers > 1 &&
         pcp_fabric_worker_count(o->fabric, PCP_FABRIC_WORKER_CONNECTED) <
             job->expected_workers &&
         pcp_clock_now_ns(o->clock) < grace_end && !should_stop(job)) {
    pcp_sleep_ms(WAIT_SLICE_MS);
  }
  round_t round;
  memset(&round, 0, sizeof(round));
  pcp_status_t status = round_workers(job, &round);
  if (!status && round.count == 0) {
    round_release(&round);
    pcp_sleep_ms(200);  // nobody to train on yet
    return pcp_ok_status();
  }
  if (!status) {
    status = round_sample(job, &round);
  }
  if (!status) {
    status = round_submit(job, &round);
  }
  if (status) {
    // Tasks submitted before the failure still borrow the buffers.
    round_wait(job, &round);
    round_release(&round);
    return status;
  }
  *out_stopped = round_wait(job, &round);
  round_outcome_t outcome;
  status = round_collect(job, &round, &outcome);
  uint32_t submitted = round.count;
  round_release(&round);
  PCP_RETURN_IF_ERROR_BARE(status);
  if (*out_stopped) {
    return pcp_ok_status();
  }
  snprintf(last_error, last_error_capacity, "%s", outcome.last_error);
  if (outcome.reporters == 0) {
    PCP_LOG(PCP_LOG_WARN, &job->log,
            "no worker reported outer_step=%" PRIu64 "; repeating it",
            job->outer_step + 1);
    return pcp_ok_status();
  }
  size_t nonfinite = 0;
  float* average = job->scratch;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_diloco_accumulator_average(&job->accumulator, average, &nonfinite));
  PCP_RETURN_IF_ERROR_BARE(pcp_diloco_nesterov_step(
      &job->nesterov, 0, job->parameter_count, average, job->parameters));
  ++job->outer_step;
  *out_advanced = true;
  job->expected_workers = outcome.reporters;
  job->last_loss = outcome.loss_last;
  job->last_loss_mean = outcome.loss_mean;
  job->wire_bytes += outcome.parameter_bytes + outcome.delta_bytes;
  job->token_bytes += outcome.token_bytes;
  double seconds = (double)(pcp_clock_now_ns(o->clock) - start) / 1e9;
  double tokens = (double)outcome.reporters * (double)batches_per_round(job) *
                  (double)(job->spec.batch * job->spec.block_size);
  double tokens_per_second = seconds > 0 ? tokens / seconds : 0;
  if (o->metrics) {
    const char* job_label[] = {o->job_id};
    pcp_obs_family_observe(o->metrics->outer_step_seconds, NULL, seconds);
    pcp_obs_family_set(o->metrics->loss, job_label, job->last_loss);
    pcp_obs_family_set(o->metrics->tokens_per_second, job_label,
                       tokens_per_second);
    pcp_obs_family_add(o->metrics->wire_bytes, (const char*[]){"parameters"},
                       (double)outcome.parameter_bytes);
    pcp_obs_family_add(o->metrics->wire_bytes, (const char*[]){"deltas"},
                       (double)outcome.delta_bytes);
    pcp_obs_family_add(o->metrics->token_bytes, NULL,
                       (double)outcome.token_bytes);
    pcp_obs_family_add(o->metrics->outer_steps, NULL, 1);
  }
  PCP_LOG(PCP_LOG_INFO, &job->log,
          "outer_step=%" PRIu64 "/%" PRId64
          " loss=%.4f loss_mean=%.4f workers=%u/%u seconds=%.2f "
          "tokens_per_s=%.0f wire_bytes=%" PRIu64 " nonfinite=%zu",
          job->outer_step, job->config.outer_loop_steps, job->last_loss,
          job->last_loss_mean, outcome.reporters, submitted, seconds,
          tokens_per_second, outcome.parameter_bytes + outcome.delta_bytes,
          nonfinite);
  double epoch = epochs_trained(job);
  job->epochs_done = epoch >= (double)job->config.max_epochs;
  json_t* progress = progress_json(job, &outcome, seconds, tokens_per_second);
  if (progress) {
    json_object_set_new(progress, "workers_submitted", json_integer(submitted));
    json_object_set_new(progress, "epoch", json_real(epoch));
    pcp_status_ignore(pcp_store_job_event_append(
        o->store, o->job_id, "training.step", progress, NULL));
  }
  progress_report(job, progress);
  json_decref(progress);
  bool last = (int64_t)job->outer_step >= job->config.outer_loop_steps ||
              job->epochs_done;
  if (job->epochs_done) {
    PCP_LOG(PCP_LOG_INFO, &job->log,
            "max_epochs=%" PRId64 " reached at outer_step=%" PRIu64
            " (%.2f passes over %" PRIu64 " train tokens): done",
            job->config.max_epochs, job->outer_step, epoch, job->train_tokens);
  }
  if (last || (job->config.checkpoint_every > 0 &&
               job->outer_step % (uint64_t)job->config.checkpoint_every == 0)) {
    PCP_RETURN_IF_ERROR_BARE(checkpoint_write(job));
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Streaming DiLoCo (reference s.1.2)
//===----------------------------------------------------------------------===//
//
// Worker-resident state in one fabric session per worker: the local
// parameters "p<i>", AdamW moments "m<i>"/"v<i>" (kept across steps, as
// upstream) and the fragment snapshots "s<i>". The gateway drives every
// worker in lock step, one local step per task (@train_steps with K=1 of
// `pcp compile --program train`, state in and out as resident refs, only the
// batch and the loss on the wire), and per fragment two small element-wise
// programs emitted here as StableHLO text:
//   @delta(s..., c...) -> (s - c in the wire dtype..., c...)   send: the
//       delta comes back, the current values stay as the new snapshot;
//   @mix(alpha, g..., l...) -> (b..., b...)  receive: b = alpha*l +
//       (1-alpha)*g becomes both the local values and the snapshot.
// The master parameters and the outer Nesterov state stay on the gateway,
// updated per fragment when its deltas are in. The schedule is diloco.h's.
// A worker lost mid-run is dropped for the rest of the run (its state was on
// it). Checkpoints and resume: "Streaming checkpoints" below.

#define MAX_FRAGMENTS 64

typedef struct stream_worker_t {
  char worker_id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  char session[PCP_STORE_ID_MAX_LENGTH + 48];
  bool alive;
  pcp_data_sampler_t* sampler;
  int32_t* tokens;    // ids then targets, A*B*T each ([1, A, B, T])
  int64_t* tokens64;  // the same widened, for a module taking i64 ids
  pcp_fabric_task_t* task;
  float last_loss;
  uint32_t shard;  // its sampler's shard of the plan (kept by a resume)
} stream_worker_t;

typedef struct stream_t {
  job_t* job;
  pcp_streaming_diloco_schedule_t schedule;
  uint8_t train_hash[PCP_SHA256_BYTE_LENGTH];
  uint8_t fragment_hash[MAX_FRAGMENTS][PCP_SHA256_BYTE_LENGTH];
  stream_worker_t workers[MAX_ROUND_WORKERS];
  uint32_t worker_count;
  uint32_t shard_count;  // workers of the first start: the plan's shards
  char backend[16];
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];
  char (*names)[24];  // "p0", "m0", "v0", "s0" ... per tensor: 4 each
  float* zeros;       // parameter_count zeros: the first moments
  float alpha;
  float lr;
  float step_value;
  uint64_t syncs;
  uint64_t sync_total;
  bool bf16;         // deltas on the wire in bf16 (deltas_dtype)
  bool bf16_params;  // the model's parameters (p, s, masters down) are bf16
} stream_t;

static const char* resident_name(stream_t* st, char kind, size_t tensor) {
  size_t slot = kind == 'p' ? 0 : kind == 'm' ? 1 : kind == 'v' ? 2 : 3;
  return st->names[4 * tensor + slot];
}

static void type_text(const pcp_models_parameter_t* p, const char* element,
                      char* out, size_t capacity) {
  int used = snprintf(out, capacity, "tensor<");
  for (int32_t d = 0; d < p->rank; ++d) {
    used += snprintf(out + used, capacity - (size_t)used, "%lldx",
                     (long long)p->dims[d]);
  }
  snprintf(out + used, capacity - (size_t)used, "%s>", element);
}

// What list_append writes per tensor of a fragment.
typedef enum list_mode_e {
  LIST_ARGS = 0,   // "%s3: tensor<...>"
  LIST_NAMES = 1,  // "%s3"
  LIST_TYPES = 2,  // "tensor<...>"
} list_mode_t;

// Appends, for each of |group_count| groups and each tensor of |fragment|,
// one comma-separated item: group g's names use prefix[g] and its types
// element[g]. |*first| says whether a separator is due.
static pcp_status_t list_append(pcp_string_builder_t* b, const stream_t* st,
                                uint32_t fragment, list_mode_t mode,
                                const char* const* prefix,
                                const char* const* element, int group_count,
                                bool* first) {
  const pcp_models_parameter_table_t* table = &st->job->table;
  pcp_status_t status = pcp_ok_status();
  char t[128];
  for (int g = 0; g < group_count && !status; ++g) {
    for (size_t i = fragment; i < table->count && !status;
         i += st->schedule.fragments) {
      type_text(&table->parameters[i], element[g], t, sizeof(t));
      const char* sep = *first ? "" : ", ";
      *first = false;
      if (mode == LIST_ARGS) {
        status = pcp_string_builder_append_f(b, "%s%%%s%zu: %s", sep, prefix[g],
                                             i, t);
      } else if (mode == LIST_NAMES) {
        status = pcp_string_builder_append_f(b, "%s%%%s%zu", sep, prefix[g], i);
      } else {
        status = pcp_string_builder_append_f(b, "%s%s", sep, t);
      }
    }
  }
  return status;
}

// "return NAMES : TYPES\n  }\n" of one function.
static pcp_status_t return_append(pcp_string_builder_t* b, const stream_t* st,
                                  uint32_t fragment, const char* const* prefix,
                                  const char* const* element, int group_count) {
  bool first = true;
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "    return "));
  PCP_RETURN_IF_ERROR_BARE(list_append(b, st, fragment, LIST_NAMES, prefix,
                                       element, group_count, &first));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, " : "));
  first = true;
  PCP_RETURN_IF_ERROR_BARE(list_append(b, st, fragment, LIST_TYPES, prefix,
                                       element, group_count, &first));
  return pcp_string_builder_append_cstring(b, "\n  }\n");
}

// "  func.func @NAME(ARGS) -> (TYPES) {\n" of one function; |lead| is
// pasted before the tensor arguments ("" or "%alpha: tensor<f32>").
static pcp_status_t signature_append(
    pcp_string_builder_t* b, const stream_t* st, uint32_t fragment,
    const char* name, const char* lead, const char* const* arg_prefix,
    const char* const* arg_element, int arg_groups,
    const char* const* result_element, int result_groups) {
  bool first = !lead[0];
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_f(b, "  func.func @%s(%s", name, lead));
  PCP_RETURN_IF_ERROR_BARE(list_append(b, st, fragment, LIST_ARGS, arg_prefix,
                                       arg_element, arg_groups, &first));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, ") -> ("));
  first = true;
  PCP_RETURN_IF_ERROR_BARE(list_append(b, st, fragment, LIST_TYPES, arg_prefix,
                                       result_element, result_groups, &first));
  return pcp_string_builder_append_cstring(b, ") {\n");
}

// Appends "%<out><i> = stablehlo.convert %<in><i> : (A) -> B" for tensor
// |i| from element |from| to |to|.
static pcp_status_t convert_append(pcp_string_builder_t* b,
                                   const pcp_models_parameter_t* p, size_t i,
                                   const char* out, const char* in,
                                   const char* from, const char* to) {
  char a[128], c[128];
  type_text(p, from, a, sizeof(a));
  type_text(p, to, c, sizeof(c));
  return pcp_string_builder_append_f(
      b, "    %%%s%zu = stablehlo.convert %%%s%zu : (%s) -> %s\n", out, i, in,
      i, a, c);
}

// The @init / @delta / @mix / @copy module of fragment |fragment|. The
// local parameters p and snapshots s have the model's element type (f32 or
// bf16), the moments m and v are f32 (the optimizer's master type), and the
// arithmetic of @delta and @mix runs in f32 whatever the model's type: a
// bf16 subtract of two nearby weights would lose most of the delta's bits.
static pcp_status_t fragment_module_emit(stream_t* st, uint32_t fragment,
                                         pcp_string_builder_t* b) {
  const pcp_models_parameter_table_t* table = &st->job->table;
  uint32_t P = st->schedule.fragments;
  bool low = st->bf16_params;
  const char* pe = low ? "bf16" : "f32";  // p, s and the masters sent down
  const char* wire = st->bf16 ? "bf16" : "f32";
  const char* const pe2[] = {pe, pe};
  const char* const f32x4[] = {"f32", "f32", "f32", "f32"};
  char t[128];
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "module {\n"));
  // @delta(s..., c...) -> (s - c in the wire dtype..., c...)
  const char* const delta_args[] = {"s", "c"};
  const char* const delta_results[] = {wire, pe};
  PCP_RETURN_IF_ERROR_BARE(signature_append(
      b, st, fragment, "delta", "", delta_args, pe2, 2, delta_results, 2));
  for (size_t i = fragment; i < table->count; i += P) {
    const pcp_models_parameter_t* p = &table->parameters[i];
    type_text(p, "f32", t, sizeof(t));
    if (low) {
      PCP_RETURN_IF_ERROR_BARE(convert_append(b, p, i, "sf", "s", pe, "f32"));
      PCP_RETURN_IF_ERROR_BARE(convert_append(b, p, i, "cf", "c", pe, "f32"));
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, "    %%d%zu = stablehlo.subtract %%%s%zu, %%%s%zu : %s\n", i,
        low ? "sf" : "s", i, low ? "cf" : "c", i, t));
    if (st->bf16) {
      PCP_RETURN_IF_ERROR_BARE(convert_append(b, p, i, "w", "d", "f32", wire));
    }
  }
  const char* const delta_out[] = {st->bf16 ? "w" : "d", "c"};
  PCP_RETURN_IF_ERROR_BARE(
      return_append(b, st, fragment, delta_out, delta_results, 2));
  // @mix(alpha, g..., l...) -> (b..., b...), b = alpha*l + (1-alpha)*g.
  const char* const mix_args[] = {"g", "l"};
  PCP_RETURN_IF_ERROR_BARE(signature_append(
      b, st, fragment, "mix", "%alpha: tensor<f32>", mix_args, pe2, 2, pe2, 2));
  for (size_t i = fragment; i < table->count; i += P) {
    const pcp_models_parameter_t* p = &table->parameters[i];
    type_text(p, "f32", t, sizeof(t));
    if (low) {
      PCP_RETURN_IF_ERROR_BARE(convert_append(b, p, i, "gf", "g", pe, "f32"));
      PCP_RETURN_IF_ERROR_BARE(convert_append(b, p, i, "lf", "l", pe, "f32"));
    }
    const char* g = low ? "gf" : "g";
    const char* l = low ? "lf" : "l";
    const char* out = low ? "bf" : "b";
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b,
        "    %%a%zu = stablehlo.broadcast_in_dim %%alpha, dims = [] : "
        "(tensor<f32>) -> %s\n"
        "    %%one%zu = stablehlo.constant dense<1.000000e+00> : %s\n"
        "    %%r%zu = stablehlo.subtract %%one%zu, %%a%zu : %s\n"
        "    %%x%zu = stablehlo.multiply %%a%zu, %%%s%zu : %s\n"
        "    %%y%zu = stablehlo.multiply %%r%zu, %%%s%zu : %s\n"
        "    %%%s%zu = stablehlo.add %%x%zu, %%y%zu : %s\n",
        i, t, i, t, i, i, i, t, i, i, l, i, t, i, i, g, i, t, out, i, i, i, t));
    if (low) {
      PCP_RETURN_IF_ERROR_BARE(convert_append(b, p, i, "b", "bf", "f32", pe));
    }
  }
  const char* const mix_out[] = {"b", "b"};
  PCP_RETURN_IF_ERROR_BARE(return_append(b, st, fragment, mix_out, pe2, 2));
  // @init(p...) -> (p..., 0..., 0..., p...): the local parameters, zero
  // AdamW moments and the snapshot, made on the worker from the fragment's
  // masters (the frame carries only this fragment's tensors).
  const char* const init_args[] = {"p"};
  const char* const init_results[] = {pe, "f32", "f32", pe};
  PCP_RETURN_IF_ERROR_BARE(signature_append(
      b, st, fragment, "init", "", init_args, pe2, 1, init_results, 4));
  for (size_t i = fragment; i < table->count; i += P) {
    type_text(&table->parameters[i], "f32", t, sizeof(t));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, "    %%z%zu = stablehlo.constant dense<0.000000e+00> : %s\n", i, t));
  }
  const char* const init_out[] = {"p", "z", "z", "p"};
  PCP_RETURN_IF_ERROR_BARE(
      return_append(b, st, fragment, init_out, init_results, 4));
  // @copy(x...) -> (x...): moves one kind (p, m, v or s) of the fragment's
  // resident tensors to the gateway for a checkpoint (resident refs in,
  // outputs returned) and back after a resume (sections in, outputs kept).
  // With bf16 parameters the f32 moments have their own, @copy_moments.
  const char* const copy_args[] = {"x"};
  PCP_RETURN_IF_ERROR_BARE(
      signature_append(b, st, fragment, "copy", "", copy_args, pe2, 1, pe2, 1));
  PCP_RETURN_IF_ERROR_BARE(return_append(b, st, fragment, copy_args, pe2, 1));
  if (low) {
    PCP_RETURN_IF_ERROR_BARE(signature_append(
        b, st, fragment, "copy_moments", "", copy_args, f32x4, 1, f32x4, 1));
    PCP_RETURN_IF_ERROR_BARE(
        return_append(b, st, fragment, copy_args, f32x4, 1));
  }
  return pcp_string_builder_append_cstring(b, "}\n");
}

static pcp_status_t stream_programs(stream_t* st, const char* backend,
                                    const char* target) {
  job_t* job = st->job;
  char model[1200];
  snprintf(model, sizeof(model), "%s/model.mlir", job->dir);
  PCP_RETURN_IF_ERROR_BARE(child_compile(job, model, job->model_hash, "train",
                                         1, backend, target, st->train_hash));
  for (uint32_t p = 0; p < st->schedule.fragments; ++p) {
    pcp_string_builder_t b;
    pcp_string_builder_initialize(pcp_allocator_system(), (size_t)16 << 20, &b);
    pcp_status_t status = fragment_module_emit(st, p, &b);
    char path[1200];
    snprintf(path, sizeof(path), "%s/fragment-%u.mlir", job->dir, p);
    char hex[PCP_SHA256_HEX_LENGTH + 1] = "";
    if (!status) {
      pcp_sha256_t digest;
      pcp_sha256_compute(b.data, b.size, &digest);
      pcp_sha256_to_hex(&digest, hex);
      status = pcp_file_write_atomic(path, b.data, b.size);
    }
    pcp_string_builder_deinitialize(&b);
    PCP_RETURN_IF_ERROR_BARE(status);
    PCP_RETURN_IF_ERROR_BARE(child_compile(job, path, hex, NULL, 0, backend,
                                           target, st->fragment_hash[p]));
  }
  return pcp_ok_status();
}

// Rounds fragment |fragment|'s masters into wire_parameters (bf16 models).
static void masters_round(stream_t* st, uint32_t fragment) {
  job_t* job = st->job;
  if (job->param_type != PCP_ELEMENT_TYPE_BF16) {
    return;
  }
  for (size_t i = fragment; i < job->table.count; i += st->schedule.fragments) {
    size_t offset = tensor_offset(job, i);
    pcp_diloco_bf16_quantize(job->parameters + offset,
                             (size_t)job->table.parameters[i].element_count,
                             job->wire_parameters + offset);
  }
}

// Waits for the current task of every live worker; a failed one marks its
// worker lost. Returns true when the stop hook fired (tasks cancelled).
static bool stream_wait(stream_t* st) {
  bool stopped = false;
  for (uint32_t k = 0; k < st->worker_count; ++k) {
    stream_worker_t* w = &st->workers[k];
    while (w->task && !pcp_fabric_task_wait(w->task, WAIT_SLICE_MS)) {
      if (!stopped && should_stop(st->job)) {
        stopped = true;
        for (uint32_t j = 0; j < st->worker_count; ++j) {
          if (st->workers[j].task) {
            pcp_fabric_task_cancel(st->workers[j].task);
          }
        }
      }
    }
    if (w->task && pcp_fabric_task_status(w->task)) {
      PCP_LOG(PCP_LOG_WARN, &st->job->log,
              "streaming worker %s lost: %s; dropped for the rest of the run",
              w->worker_id,
              pcp_status_message(pcp_fabric_task_status(w->task)));
      w->alive = false;
      if (st->job->options->metrics) {
        pcp_obs_family_add(st->job->options->metrics->lost_tasks, NULL, 1);
      }
    }
  }
  return stopped;
}

static void stream_tasks_release(stream_t* st) {
  for (uint32_t k = 0; k < st->worker_count; ++k) {
    pcp_fabric_task_release(st->workers[k].task);
    st->workers[k].task = NULL;
  }
}

static void stream_submit(
    stream_t* st, stream_worker_t* w,
    const uint8_t program[PCP_SHA256_BYTE_LENGTH], const char* function,
    const pcp_proto_section_t* sections, uint32_t section_count,
    const pcp_proto_tensor_ref_t* refs, uint32_t ref_count,
    const pcp_proto_keep_resident_t* keep, uint32_t keep_count) {
  pcp_fabric_task_params_t params;
  memset(&params, 0, sizeof(params));
  memcpy(params.program, program, sizeof(params.program));
  params.function = function;
  params.inputs = sections;
  params.input_count = section_count;
  params.input_refs = refs;
  params.input_ref_count = ref_count;
  params.keep_resident = keep;
  params.keep_resident_count = keep_count;
  params.worker_id = w->worker_id;
  params.session_id = w->session;
  params.max_attempts = 1;
  pcp_status_t status =
      pcp_fabric_task_submit(st->job->options->fabric, &params, &w->task);
  if (status) {
    PCP_LOG(PCP_LOG_WARN, &st->job->log, "streaming task for %s: %s",
            w->worker_id, pcp_status_message(status));
    pcp_status_ignore(status);
    w->task = NULL;
    w->alive = false;
  }
}

static uint32_t stream_alive(const stream_t* st) {
  uint32_t n = 0;
  for (uint32_t k = 0; k < st->worker_count; ++k) {
    n += st->workers[k].alive;
  }
  return n;
}

// One local step on every live worker, all state resident.
static pcp_status_t stream_compute(stream_t* st, uint64_t step,
                                   bool* out_stopped) {
  job_t* job = st->job;
  size_t n = job->table.count;
  uint32_t B = (uint32_t)job->spec.batch, T = (uint32_t)job->spec.block_size;
  pcp_proto_tensor_ref_t* refs = calloc(3 * n + 4, sizeof(*refs));
  pcp_proto_section_t* sections = calloc(3 * n + 4, sizeof(*sections));
  pcp_proto_keep_resident_t* keep = calloc(3 * n, sizeof(*keep));
  if (!refs || !sections || !keep) {
    free(refs);
    free(sections);
    free(keep);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "step refs");
  }
  st->step_value = (float)step;
  for (uint32_t k = 0; k < st->worker_count; ++k) {
    stream_worker_t* w = &st->workers[k];
    if (!w->alive) {
      continue;
    }
    // A micro batches (effective_batch_size), ids then targets:
    // [1, A, B, T] each.
    size_t A = (size_t)job->accumulation;
    size_t rows = A * B * T;
    for (size_t a = 0; a < A; ++a) {
      pcp_data_sampler_next(w->sampler, w->tokens + a * B * T,
                            w->tokens + rows + a * B * T, NULL);
    }
    bool wide = job->data_type == PCP_ELEMENT_TYPE_I64;
    if (wide) {
      for (size_t e = 0; e < 2 * rows; ++e) {
        w->tokens64[e] = w->tokens[e];
      }
    }
    uint32_t section_count = 0;
    for (int g = 0; g < 3; ++g) {
      for (size_t i = 0; i < n; ++i) {
        pcp_proto_tensor_ref_t* r = &refs[g * n + i];
        memset(r, 0, sizeof(*r));
        keep[g * n + i] =
            (pcp_proto_keep_resident_t){.output = (uint32_t)(g * n + i),
                                        .as = resident_name(st, "pmv"[g], i)};
        r->kind = PCP_PROTO_TENSOR_REF_RESIDENT;
        r->name = resident_name(st, "pmv"[g], i);
      }
    }
    pcp_proto_section_t* extra = &sections[section_count];
    extra[0] = (pcp_proto_section_t){.name = "step",
                                     .element_type = PCP_ELEMENT_TYPE_F32,
                                     .byte_length = sizeof(float),
                                     .data = &st->step_value};
    extra[1] = (pcp_proto_section_t){.name = "lr",
                                     .element_type = PCP_ELEMENT_TYPE_F32,
                                     .byte_length = sizeof(float),
                                     .data = &st->lr};
    size_t id_size = pcp_element_type_byte_size(job->data_type);
    for (int j = 0; j < 2; ++j) {
      pcp_proto_section_t* s = &extra[2 + j];
      *s = (pcp_proto_section_t){
          .name = j ? "targets" : "input_ids",
          .element_type = job->data_type,
          .byte_length = (uint64_t)(rows * id_size),
          .data = wide ? (const void*)(w->tokens64 + (size_t)j * rows)
                       : (const void*)(w->tokens + (size_t)j * rows)};
      uint32_t r = 0;
      s->shape[r++] = 1;
      if (A > 1) {
        s->shape[r++] = (int64_t)A;
      }
      s->shape[r++] = B;
      s->shape[r++] = T;
      s->rank = r;
    }
    for (int j = 0; j < 4; ++j) {
      refs[3 * n + j] = (pcp_proto_tensor_ref_t){
          .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = section_count + j};
    }
    job->token_bytes += 2ull * rows * id_size;
    stream_submit(st, w, st->train_hash, "train_steps", sections,
                  section_count + 4, refs, (uint32_t)(3 * n + 4), keep,
                  (uint32_t)(3 * n));
    // The struct arrays were copied by the submit; the data (the shared
    // parameters, zeros and scalars, this worker's tokens) stays borrowed
    // until stream_wait below.
  }
  *out_stopped = stream_wait(st);
  for (uint32_t k = 0; k < st->worker_count; ++k) {
    stream_worker_t* w = &st->workers[k];
    if (w->alive && w->task && !pcp_fabric_task_status(w->task)) {
      const pcp_proto_section_t* outputs = NULL;
      size_t count = 0;
      pcp_status_t status = pcp_fabric_task_outputs(w->task, &outputs, &count);
      if (!status && count >= 1 && outputs[count - 1].byte_length == 4) {
        w->last_loss = *(const float*)outputs[count - 1].data;
      }
      pcp_status_ignore(status);
    }
  }
  stream_tasks_release(st);
  free(refs);
  free(sections);
  free(keep);
  return pcp_ok_status();
}

// The workers' state at start: @init(masters of the fragment) kept as the
// local parameters p<i>, zero moments m<i>/v<i> and the snapshot s<i>.
static pcp_status_t stream_init_call(stream_t* st, uint32_t fragment,
                                     bool* out_stopped) {
  job_t* job = st->job;
  uint32_t P = st->schedule.fragments;
  size_t count = 0;
  for (size_t i = fragment; i < job->table.count; i += P) {
    ++count;
  }
  masters_round(st, fragment);
  pcp_proto_section_t* sections = calloc(count + 1, sizeof(*sections));
  pcp_proto_keep_resident_t* keep = calloc(4 * count + 1, sizeof(*keep));
  if (!sections || !keep) {
    free(sections);
    free(keep);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "init refs");
  }
  size_t j = 0;
  for (size_t i = fragment; i < job->table.count; i += P, ++j) {
    pcp_proto_section_t* s = &sections[j];
    master_section(job, i, s);
    for (int g = 0; g < 4; ++g) {
      keep[g * count + j] =
          (pcp_proto_keep_resident_t){.output = (uint32_t)(g * count + j),
                                      .as = resident_name(st, "pmvs"[g], i)};
    }
  }
  for (uint32_t k = 0; k < st->worker_count; ++k) {
    stream_worker_t* w = &st->workers[k];
    if (w->alive) {
      stream_submit(st, w, st->fragment_hash[fragment], "init", sections,
                    (uint32_t)count, NULL, 0, keep, (uint32_t)(4 * count));
    }
  }
  *out_stopped = stream_wait(st);
  stream_tasks_release(st);
  free(sections);
  free(keep);
  return pcp_ok_status();
}

// A fragment's send (@delta) or receive (@mix) on every live worker.
static pcp_status_t stream_fragment_call(stream_t* st, uint32_t fragment,
                                         bool mix, bool init, bool* out_stopped,
                                         uint64_t* out_bytes) {
  job_t* job = st->job;
  uint32_t P = st->schedule.fragments;
  size_t count = 0;
  for (size_t i = fragment; i < job->table.count; i += P) {
    ++count;
  }
  pcp_proto_tensor_ref_t* refs = calloc(2 * count + 1, sizeof(*refs));
  pcp_proto_section_t* sections = calloc(2 * count + 1, sizeof(*sections));
  pcp_proto_keep_resident_t* keep = calloc(2 * count, sizeof(*keep));
  if (!refs || !sections || !keep) {
    free(refs);
    free(sections);
    free(keep);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "fragment refs");
  }
  uint32_t section_count = 0;
  uint32_t ref_count = 0;
  uint32_t keep_count = 0;
  uint64_t master_bytes = 0;
  if (mix) {
    masters_round(st, fragment);
    sections[section_count] =
        (pcp_proto_section_t){.name = "alpha",
                              .element_type = PCP_ELEMENT_TYPE_F32,
                              .byte_length = sizeof(float),
                              .data = &st->alpha};
    refs[ref_count++] = (pcp_proto_tensor_ref_t){
        .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = section_count++};
  }
  // First group: mix -> the masters (sections); delta -> s<i> (resident, or
  // the params for the initial snapshot).
  for (int pass = 0; pass < 2; ++pass) {
    size_t j = 0;
    for (size_t i = fragment; i < job->table.count; i += P, ++j) {
      bool section = mix && pass == 0;
      if (section) {
        pcp_proto_section_t* s = &sections[section_count];
        master_section(job, i, s);
        if (mix) {
          master_bytes += s->byte_length;
        }
        refs[ref_count++] = (pcp_proto_tensor_ref_t){
            .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = section_count++};
      } else {
        refs[ref_count++] = (pcp_proto_tensor_ref_t){
            .kind = PCP_PROTO_TENSOR_REF_RESIDENT,
            .name = resident_name(st, (mix || pass == 1) ? 'p' : 's', i)};
      }
      // Outputs: delta -> (deltas..., copies...): keep copies as s<i>;
      // mix -> (b..., b...): keep as p<i> and s<i>.
      if (pass == 0 && mix) {
        keep[keep_count++] = (pcp_proto_keep_resident_t){
            .output = (uint32_t)j, .as = resident_name(st, 'p', i)};
      }
      if (pass == 1) {
        keep[keep_count++] = (pcp_proto_keep_resident_t){
            .output = (uint32_t)(count + j), .as = resident_name(st, 's', i)};
      }
    }
  }
  uint64_t up_bytes = 0;
  uint32_t reporters = 0;
  for (uint32_t k = 0; k < st->worker_count && !*out_stopped; ++k) {
    stream_worker_t* w = &st->workers[k];
    if (!w->alive) {
      continue;
    }
    stream_submit(st, w, st->fragment_hash[fragment], mix ? "mix" : "delta",
                  sections, section_count, refs, ref_count, keep, keep_count);
  }
  *out_stopped = stream_wait(st);
  bool* stopped = out_stopped;
  (void)stopped;
  pcp_status_t status = pcp_ok_status();
  if (!mix && !init && !*out_stopped) {
    // Sum the deltas of the fragment's tensors over the reporters.
    float* sum = job->accumulator.sum;
    for (size_t i = fragment; i < job->table.count; i += P) {
      memset(sum + tensor_offset(job, i), 0,
             (size_t)job->table.parameters[i].element_count * sizeof(float));
    }
    for (uint32_t k = 0; k < st->worker_count && !status; ++k) {
      stream_worker_t* w = &st->workers[k];
      if (!w->alive || !w->task) {
        continue;
      }
      const pcp_proto_section_t* outputs = NULL;
      size_t n_out = 0;
      status = pcp_fabric_task_outputs(w->task, &outputs, &n_out);
      if (status) {
        break;
      }
      size_t j = 0;
      for (size_t i = fragment; i < job->table.count && j < n_out;
           i += P, ++j) {
        size_t elements = (size_t)job->table.parameters[i].element_count;
        float* dst = sum + tensor_offset(job, i);
        float* tmp = (float*)job->scratch;
        size_t want = elements * (st->bf16 ? 2 : 4);
        if (outputs[j].byte_length != want) {
          status = pcp_make_status(PCP_STATUS_INTERNAL,
                                   "fragment delta of %" PRIu64 " bytes",
                                   outputs[j].byte_length);
          break;
        }
        if (st->bf16) {
          pcp_diloco_bf16_dequantize(outputs[j].data, elements, tmp);
        } else {
          memcpy(tmp, outputs[j].data, elements * sizeof(float));
        }
        for (size_t e = 0; e < elements; ++e) {
          dst[e] += tmp[e];
        }
        up_bytes += outputs[j].byte_length;
      }
      ++reporters;
    }
    for (size_t i = fragment; i < job->table.count && !status && reporters;
         i += P) {
      size_t elements = (size_t)job->table.parameters[i].element_count;
      float* g = job->accumulator.sum + tensor_offset(job, i);
      for (size_t e = 0; e < elements; ++e) {
        g[e] = isfinite(g[e]) ? g[e] / (float)reporters : 0.0f;
      }
      status = pcp_diloco_nesterov_step(
          &job->nesterov, tensor_offset(job, i), elements, g,
          job->parameters + tensor_offset(job, i));
    }
  }
  if (mix && !*out_stopped) {
    for (uint32_t k = 0; k < st->worker_count; ++k) {
      if (st->workers[k].alive && st->workers[k].task) {
        ++reporters;
      }
    }
    up_bytes = master_bytes * reporters;
  }
  stream_tasks_release(st);
  free(refs);
  free(sections);
  free(keep);
  *out_bytes = init ? 0 : up_bytes;
  return status;
}

//===----------------------------------------------------------------------===//
// Streaming checkpoints
//===----------------------------------------------------------------------===//
//
// A streaming checkpoint is taken at a step boundary (after step t's sends)
// and holds, besides the masters and the outer velocity of every classic
// one, what lives on the workers and in the loop: the cursor's "streaming"
// object (schedule, t, syncs, per-fragment in-flight bytes and senders, per
// worker its shard, sampler cursor and last loss) and a side file
// stream-<sync>.workers beside the checkpoint with every live worker's
// resident p/m/v/s (4 f32 parameter vectors per worker, in the cursor's
// worker order), named in the cursor with its SHA-256. The side file is
// written before the checkpoint row, so an indexed checkpoint always has it.

// Moves kind |kind| (0..3: p, m, v, s) of |fragment|'s tensors between
// every live worker's session and |state| (per worker in |slots| order, 4
// parameter vectors p, m, v, s): |upload| false runs @copy on the resident
// tensors and reads the outputs; true sends the sections and keeps the
// outputs resident. One fragment's tensors of one kind per task keep the
// frame within the fabric's section limit, as for @delta / @mix.
static pcp_status_t stream_copy_call(stream_t* st, uint32_t fragment, int kind,
                                     bool upload, float* state,
                                     bool* out_stopped) {
  job_t* job = st->job;
  uint32_t P = st->schedule.fragments;
  size_t N = job->parameter_count;
  size_t count = 0;
  for (size_t i = fragment; i < job->table.count; i += P) {
    ++count;
  }
  pcp_proto_tensor_ref_t* refs = calloc(count + 1, sizeof(*refs));
  pcp_proto_section_t* sections = calloc(count + 1, sizeof(*sections));
  pcp_proto_keep_resident_t* keep = calloc(count + 1, sizeof(*keep));
  uint32_t* slots = calloc(st->worker_count + 1, sizeof(*slots));
  if (!refs || !sections || !keep || !slots) {
    free(refs);
    free(sections);
    free(keep);
    free(slots);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "copy refs");
  }
  const char k = "pmvs"[kind];
  // A bf16 model's p and s are bf16 on the worker (widened here, exactly;
  // rounded back exactly on upload); the moments are f32 either way.
  bool low = st->bf16_params && (kind == 0 || kind == 3);
  const char* function = st->bf16_params && !low ? "copy_moments" : "copy";
  uint16_t* narrow = NULL;
  if (low && upload) {
    narrow = calloc((size_t)st->worker_count * N + 1, sizeof(uint16_t));
    if (!narrow) {
      free(refs);
      free(sections);
      free(keep);
      free(slots);
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "copy buffer");
    }
  }
  uint32_t slot = 0;
  for (uint32_t w = 0; w < st->worker_count; ++w) {
    stream_worker_t* worker = &st->workers[w];
    if (!worker->alive) {
      continue;
    }
    slots[w] = slot++;
    const float* base = state + ((size_t)slots[w] * 4 + (size_t)kind) * N;
    size_t j = 0;
    for (size_t i = fragment; i < job->table.count; i += P, ++j) {
      const pcp_models_parameter_t* p = &job->table.parameters[i];
      if (upload) {
        pcp_proto_section_t* s = &sections[j];
        memset(s, 0, sizeof(*s));
        s->name = resident_name(st, k, i);
        s->element_type = low ? PCP_ELEMENT_TYPE_BF16 : PCP_ELEMENT_TYPE_F32;
        s->rank = (uint32_t)p->rank;
        for (int32_t d = 0; d < p->rank; ++d) {
          s->shape[d] = p->dims[d];
        }
        s->byte_length = (uint64_t)p->element_count * (low ? 2 : 4);
        s->data = base + tensor_offset(job, i);
        if (low) {
          uint16_t* out = narrow + (size_t)slots[w] * N + tensor_offset(job, i);
          pcp_diloco_bf16_quantize(base + tensor_offset(job, i),
                                   (size_t)p->element_count, out);
          s->data = out;
        }
        keep[j] = (pcp_proto_keep_resident_t){.output = (uint32_t)j,
                                              .as = resident_name(st, k, i)};
      } else {
        refs[j] =
            (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                                     .name = resident_name(st, k, i)};
      }
    }
    // The struct arrays are copied by the submit; the data stays borrowed
    // until stream_wait.
    if (upload) {
      stream_submit(st, worker, st->fragment_hash[fragment], function, sections,
                    (uint32_t)count, NULL, 0, keep, (uint32_t)count);
    } else {
      stream_submit(st, worker, st->fragment_hash[fragment], function, NULL, 0,
                    refs, (uint32_t)count, NULL, 0);
    }
  }
  *out_stopped = stream_wait(st);
  pcp_status_t status = pcp_ok_status();
  for (uint32_t w = 0;
       w < st->worker_count && !upload && !*out_stopped && !status; ++w) {
    stream_worker_t* worker = &st->workers[w];
    if (!worker->alive || !worker->task) {
      continue;
    }
    const pcp_proto_section_t* outputs = NULL;
    size_t n_out = 0;
    status = pcp_fabric_task_outputs(worker->task, &outputs, &n_out);
    if (!status && n_out != count) {
      status =
          pcp_make_status(PCP_STATUS_INTERNAL,
                          "@copy returned %zu tensors, not %zu", n_out, count);
    }
    float* base = state + ((size_t)slots[w] * 4 + (size_t)kind) * N;
    size_t j = 0;
    for (size_t i = fragment; i < job->table.count && !status; i += P, ++j) {
      size_t elements = (size_t)job->table.parameters[i].element_count;
      size_t bytes = elements * (low ? 2 : 4);
      if (outputs[j].byte_length != bytes) {
        status = pcp_make_status(PCP_STATUS_INTERNAL,
                                 "@copy returned %" PRIu64 " bytes, not %zu",
                                 outputs[j].byte_length, bytes);
        break;
      }
      if (low) {
        pcp_diloco_bf16_dequantize(outputs[j].data, elements,
                                   base + tensor_offset(job, i));
      } else {
        memcpy(base + tensor_offset(job, i), outputs[j].data, bytes);
      }
    }
  }
  stream_tasks_release(st);
  free(narrow);
  free(refs);
  free(sections);
  free(keep);
  free(slots);
  return status;
}

// The loop's own state beside stream_t, as a checkpoint holds it.
typedef struct stream_loop_t {
  uint64_t step;  // the last completed local step
  uint64_t pending_up[MAX_FRAGMENTS];
  uint32_t pending_senders[MAX_FRAGMENTS];
  uint64_t last_event_step;
} stream_loop_t;

// Writes a checkpoint at the boundary after step loop->step (see above).
// A checkpoint already indexed at this sync (a restarted run repeating
// what the dead gateway wrote) is the same state by construction: only the
// model is exported again. A worker lost while its state is read skips
// the checkpoint (the next one is complete).
static pcp_status_t stream_checkpoint(stream_t* st, const stream_loop_t* loop,
                                      bool* out_stopped) {
  job_t* job = st->job;
  const pcp_diloco_job_options_t* o = job->options;
  pcp_store_checkpoint_t row;
  pcp_status_t status = pcp_store_checkpoint_get(
      o->store, o->job_id, (int64_t)job->outer_step, &row);
  if (!status) {
    return model_export(job);
  }
  if (pcp_status_code(status) != PCP_STATUS_NOT_FOUND) {
    return status;
  }
  pcp_status_ignore(status);
  status = pcp_ok_status();
  uint32_t alive = stream_alive(st);
  size_t N = job->parameter_count;
  size_t bytes = (size_t)alive * 4 * N * sizeof(float);
  float* state = malloc(bytes ? bytes : 1);
  if (!state) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "%zu bytes of worker state", bytes);
  }
  int64_t start_ns = pcp_clock_now_ns(o->clock);
  for (uint32_t p = 0; p < st->schedule.fragments && !status && !*out_stopped;
       ++p) {
    for (int kind = 0; kind < 4 && !status && !*out_stopped; ++kind) {
      status = stream_copy_call(st, p, kind, false, state, out_stopped);
    }
  }
  if (status || *out_stopped) {
    free(state);
    return status;
  }
  if (stream_alive(st) != alive) {
    PCP_LOG(PCP_LOG_WARN, &job->log,
            "a worker was lost while the state was read: no checkpoint at "
            "sync %" PRIu64,
            job->outer_step);
    free(state);
    return pcp_ok_status();
  }
  pcp_sha256_t digest;
  pcp_sha256_compute(state, bytes, &digest);
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&digest, hex);
  char name[64];
  snprintf(name, sizeof(name), "stream-%020" PRIu64 ".workers",
           job->outer_step);
  char dir[1200], path[1600];
  snprintf(dir, sizeof(dir), "%s/checkpoints/%s", pcp_store_state_dir(o->store),
           o->job_id);
  status = make_dirs(dir);
  if (!status) {
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    status = pcp_file_write_atomic(path, state, bytes);
  }
  if (!status && job->checkpoint_dir[0]) {
    // Beside checkpoint_dir/latest.ckpt too (a "resume": true job).
    status = make_dirs(job->checkpoint_dir);
    snprintf(path, sizeof(path), "%s/%s", job->checkpoint_dir, name);
    if (!status) {
      status = pcp_file_write_atomic(path, state, bytes);
    }
  }
  free(state);
  PCP_RETURN_IF_ERROR_BARE(status);
  PCP_LOG(PCP_LOG_INFO, &job->log,
          "streaming worker state for sync %" PRIu64
          ": %zu bytes from %u workers read and written in %.2f s",
          job->outer_step, bytes, alive,
          (double)(pcp_clock_now_ns(o->clock) - start_ns) / 1e9);
  json_t* workers = json_array();
  char cursor_text[PCP_DATA_MAX_CURSOR_JSON_LENGTH + 1];
  for (uint32_t k = 0; k < st->worker_count && workers; ++k) {
    const stream_worker_t* w = &st->workers[k];
    if (!w->alive) {
      continue;
    }
    pcp_data_cursor_t cursor;
    pcp_data_sampler_cursor(w->sampler, &cursor);
    pcp_data_cursor_format(&cursor, cursor_text, sizeof(cursor_text));
    json_array_append_new(
        workers,
        json_pack("{s:s, s:I, s:o, s:s}", "worker_id", w->worker_id, "shard",
                  (json_int_t)w->shard, "loss", number_or_null(w->last_loss),
                  "sampler", cursor_text));
  }
  json_t* up = json_array();
  json_t* senders = json_array();
  for (uint32_t p = 0; p < st->schedule.fragments && up && senders; ++p) {
    json_array_append_new(up, json_integer((json_int_t)loop->pending_up[p]));
    json_array_append_new(senders,
                          json_integer((json_int_t)loop->pending_senders[p]));
  }
  job->stream_cursor = json_pack(
      "{s:I, s:I, s:I, s:f, s:s, s:I, s:I, s:I, s:I, s:s, s:s, s:I, s:o, "
      "s:o, s:o, s:s, s:s, s:I}",
      "fragments", (json_int_t)st->schedule.fragments, "inner_steps",
      (json_int_t)st->schedule.inner_steps, "overlap_tau",
      (json_int_t)st->schedule.overlap_tau, "alpha", (double)st->alpha,
      "deltas_dtype", st->bf16 ? "bf16" : "f32", "max_rounds",
      (json_int_t)st->schedule.max_rounds, "step", (json_int_t)loop->step,
      "syncs", (json_int_t)st->syncs, "last_event_step",
      (json_int_t)loop->last_event_step, "backend", st->backend, "target",
      st->target, "shards", (json_int_t)st->shard_count, "pending_up",
      up ? up : json_array(), "pending_senders",
      senders ? senders : json_array(), "workers",
      workers ? workers : json_array(), "state_file", name, "state_sha256", hex,
      "state_bytes", (json_int_t)bytes);
  if (!job->stream_cursor) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "streaming cursor");
  }
  json_object_set_new(job->stream_cursor, "dtype",
                      json_string(st->bf16_params ? "bf16" : "f32"));
  status = checkpoint_write(job);
  json_decref(job->stream_cursor);
  job->stream_cursor = NULL;
  if (!status && job->checkpoint_dir[0]) {
    // checkpoint_dir keeps latest.ckpt only: its older state files go.
    DIR* entries = opendir(job->checkpoint_dir);
    struct dirent* entry;
    while (entries && (entry = readdir(entries)) != NULL) {
      size_t length = strlen(entry->d_name);
      if (strncmp(entry->d_name, "stream-", 7) == 0 && length > 8 &&
          strcmp(entry->d_name + length - 8, ".workers") == 0 &&
          strcmp(entry->d_name, name) != 0) {
        snprintf(path, sizeof(path), "%s/%s", job->checkpoint_dir,
                 entry->d_name);
        unlink(path);
      }
    }
    if (entries) {
      closedir(entries);
    }
  }
  return status;
}

static pcp_status_t resume_error(const char* what) {
  return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                         "streaming checkpoint: %s", what);
}

// Checks the resumed cursor against this job and reads its worker state
// file (verified against the cursor's SHA-256): *out_state holds
// *out_workers workers' p/m/v/s (caller frees).
static pcp_status_t stream_resume_load(stream_t* st, stream_loop_t* loop,
                                       float** out_state,
                                       uint32_t* out_workers) {
  job_t* job = st->job;
  json_t* c = job->stream_resume;
  *out_state = NULL;
  *out_workers = 0;
  uint32_t P = st->schedule.fragments;
  json_int_t fragments = json_integer_value(json_object_get(c, "fragments"));
  json_int_t inner = json_integer_value(json_object_get(c, "inner_steps"));
  json_int_t tau = json_integer_value(json_object_get(c, "overlap_tau"));
  double alpha = json_number_value(json_object_get(c, "alpha"));
  const char* dtype = json_string_value(json_object_get(c, "deltas_dtype"));
  // Older streaming checkpoints (f32 models only) have no "dtype".
  const char* model_dtype = json_string_value(json_object_get(c, "dtype"));
  const char* want_dtype = st->bf16_params ? "bf16" : "f32";
  if (strcmp(model_dtype ? model_dtype : "f32", want_dtype) != 0) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "streaming checkpoint of a %s model; this job "
                           "trains %s (key 'dtype')",
                           model_dtype, want_dtype);
  }
  if (fragments != (json_int_t)P ||
      inner != (json_int_t)st->schedule.inner_steps ||
      tau != (json_int_t)st->schedule.overlap_tau ||
      (float)alpha != st->alpha || !dtype ||
      strcmp(dtype, st->bf16 ? "bf16" : "f32") != 0) {
    return pcp_make_status(
        PCP_STATUS_FAILED_PRECONDITION,
        "streaming checkpoint of P=%lld H=%lld overlap_tau=%lld alpha=%g "
        "deltas_dtype=%s; this job has P=%u H=%u overlap_tau=%u alpha=%g "
        "deltas_dtype=%s",
        (long long)fragments, (long long)inner, (long long)tau, alpha,
        dtype ? dtype : "?", P, st->schedule.inner_steps,
        st->schedule.overlap_tau, (double)st->alpha, st->bf16 ? "bf16" : "f32");
  }
  json_t* workers = json_object_get(c, "workers");
  json_t* up = json_object_get(c, "pending_up");
  json_t* senders = json_object_get(c, "pending_senders");
  const char* backend = json_string_value(json_object_get(c, "backend"));
  const char* target = json_string_value(json_object_get(c, "target"));
  const char* name = json_string_value(json_object_get(c, "state_file"));
  const char* hex = json_string_value(json_object_get(c, "state_sha256"));
  json_int_t shards = json_integer_value(json_object_get(c, "shards"));
  json_int_t syncs = json_integer_value(json_object_get(c, "syncs"));
  size_t count = json_array_size(workers);
  if (count < 1 || count > MAX_ROUND_WORKERS || shards < (json_int_t)count ||
      shards > MAX_ROUND_WORKERS || json_array_size(up) != P ||
      json_array_size(senders) != P || !backend || !target ||
      strlen(backend) >= sizeof(st->backend) ||
      strlen(target) >= sizeof(st->target) || !hex ||
      strlen(hex) != PCP_SHA256_HEX_LENGTH ||
      (uint64_t)syncs != job->outer_step) {
    return resume_error(
        "malformed cursor (workers, shards, pending, kind "
        "or syncs)");
  }
  // A plain file name beside the checkpoint, nothing else.
  if (!name || !name[0] || name[0] == '.' || strchr(name, '/') ||
      strlen(name) > 128) {
    return resume_error("bad worker state file name");
  }
  snprintf(st->backend, sizeof(st->backend), "%s", backend);
  snprintf(st->target, sizeof(st->target), "%s", target);
  st->shard_count = (uint32_t)shards;
  loop->step = (uint64_t)json_integer_value(json_object_get(c, "step"));
  loop->last_event_step =
      (uint64_t)json_integer_value(json_object_get(c, "last_event_step"));
  for (uint32_t p = 0; p < P; ++p) {
    loop->pending_up[p] = (uint64_t)json_integer_value(json_array_get(up, p));
    loop->pending_senders[p] =
        (uint32_t)json_integer_value(json_array_get(senders, p));
  }
  st->syncs = (uint64_t)syncs;
  for (size_t k = 0; k < count; ++k) {
    json_t* w = json_array_get(workers, k);
    json_int_t shard = json_integer_value(json_object_get(w, "shard"));
    const char* sampler = json_string_value(json_object_get(w, "sampler"));
    if (shard < 0 || shard >= shards || !sampler) {
      return resume_error("malformed worker entry");
    }
  }
  size_t N = job->parameter_count;
  size_t want = count * 4 * N * sizeof(float);
  if (json_integer_value(json_object_get(c, "state_bytes")) !=
      (json_int_t)want) {
    return resume_error(
        "its worker state size is not workers x 4 x the "
        "model's parameters x 4 bytes");
  }
  char path[1500];
  snprintf(path, sizeof(path), "%s/%s", job->stream_resume_dir, name);
  void* data = NULL;
  size_t length = 0;
  pcp_status_t status = pcp_file_read_all(path, want, &data, &length);
  if (status) {
    pcp_status_t wrapped = pcp_make_status(
        PCP_STATUS_DATA_LOSS, "streaming checkpoint's worker state %s: %s",
        path, pcp_status_message(status));
    pcp_status_ignore(status);
    return wrapped;
  }
  pcp_sha256_t digest;
  pcp_sha256_compute(data, length, &digest);
  char got[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&digest, got);
  if (length != want || strcmp(got, hex) != 0) {
    free(data);
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "streaming checkpoint's worker state %s does not "
                           "match its checkpoint (%zu bytes, SHA-256 %s; "
                           "expected %zu bytes, %s)",
                           path, length, got, want, hex);
  }
  *out_state = data;
  *out_workers = (uint32_t)count;
  return pcp_ok_status();
}

static pcp_status_t stream_run(job_t* job) {
  const pcp_diloco_job_options_t* o = job->options;
  stream_t st;
  memset(&st, 0, sizeof(st));
  st.job = job;
  st.schedule.fragments = (uint32_t)job->config.streaming.num_fragments;
  st.schedule.inner_steps = (uint32_t)job->config.streaming.inner_steps;
  st.schedule.overlap_tau = (uint32_t)job->config.streaming.overlap_tau;
  st.schedule.max_rounds = (uint32_t)job->config.max_epochs;
  st.alpha = (float)job->config.streaming.alpha;
  st.lr = (float)job->config.learning_rate;
  st.bf16 = job->config.deltas_dtype == PCP_DILOCO_WIRE_BF16;
  st.bf16_params = job->param_type == PCP_ELEMENT_TYPE_BF16;
  if (st.schedule.fragments > MAX_FRAGMENTS ||
      st.schedule.fragments > job->table.count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'streaming.num_fragments': %u fragments for "
                           "%zu tensors (at most %d, one tensor each)",
                           st.schedule.fragments, job->table.count,
                           MAX_FRAGMENTS);
  }
  if (st.schedule.overlap_tau < 1) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'streaming.overlap_tau': the service needs "
                           "at least 1 (a receive after its send)");
  }
  // The loop's state: fresh, or the resumed checkpoint's (checked against
  // the job, its worker state file read and verified).
  stream_loop_t loop;
  memset(&loop, 0, sizeof(loop));
  float* resume_state = NULL;
  uint32_t resume_workers = 0;
  if (job->stream_resume) {
    PCP_RETURN_IF_ERROR_BARE(
        stream_resume_load(&st, &loop, &resume_state, &resume_workers));
  }
  st.sync_total = (uint64_t)st.schedule.fragments * st.schedule.max_rounds;
  st.names = calloc(4 * job->table.count, sizeof(*st.names));
  st.zeros = calloc(job->parameter_count + 1, sizeof(float));
  if (!st.names || !st.zeros) {
    free(st.names);
    free(st.zeros);
    free(resume_state);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "streaming state");
  }
  for (size_t i = 0; i < job->table.count; ++i) {
    snprintf(st.names[4 * i + 0], 24, "p%u", (unsigned)i);
    snprintf(st.names[4 * i + 1], 24, "m%u", (unsigned)i);
    snprintf(st.names[4 * i + 2], 24, "v%u", (unsigned)i);
    snprintf(st.names[4 * i + 3], 24, "s%u", (unsigned)i);
  }
  pcp_status_t status = pcp_ok_status();
  // The workers: those connected at the start, of the first worker's kind
  // (one program set); the run waits for one. A resume waits up to
  // WORKER_GRACE_MS for the checkpoint's worker count of its kind, then
  // goes on with those there (the others' state is dropped, as a worker
  // lost mid-run).
  pcp_fabric_worker_info_t* infos = calloc(MAX_ROUND_WORKERS, sizeof(*infos));
  int64_t wait_start = pcp_clock_now_ns(o->clock);
  // Session ids of this run only: a restarted gateway's must not meet what
  // a worker may still hold of the dead one's.
  uint64_t nonce = (uint64_t)pcp_clock_now_ns(o->clock) & 0xffffffffffull;
  while (!status && !st.worker_count) {
    if (should_stop(job)) {
      status = pcp_make_status(PCP_STATUS_CANCELLED,
                               "training stopped at outer step %" PRIu64,
                               job->outer_step);
      break;
    }
    uint32_t count = infos ? pcp_fabric_worker_list(o->fabric, infos,
                                                    MAX_ROUND_WORKERS, NULL)
                           : 0;
    uint32_t matching = 0;
    for (uint32_t i = 0; i < count; ++i) {
      if (infos[i].state != PCP_FABRIC_WORKER_CONNECTED) {
        continue;
      }
      if (!st.backend[0]) {
        snprintf(st.backend, sizeof(st.backend), "%s", infos[i].backend);
        snprintf(st.target, sizeof(st.target), "%s", infos[i].target);
      }
      matching += !strcmp(infos[i].backend, st.backend) &&
                  !strcmp(infos[i].target, st.target);
    }
    bool graced =
        (pcp_clock_now_ns(o->clock) - wait_start) / 1000000 >= WORKER_GRACE_MS;
    if (resume_workers && matching < resume_workers && !graced) {
      matching = 0;  // wait for the rest
    }
    if (resume_workers && matching > resume_workers) {
      matching = resume_workers;
    }
    for (uint32_t i = 0; i < count && st.worker_count < matching; ++i) {
      if (infos[i].state != PCP_FABRIC_WORKER_CONNECTED ||
          strcmp(infos[i].backend, st.backend) ||
          strcmp(infos[i].target, st.target)) {
        continue;
      }
      stream_worker_t* w = &st.workers[st.worker_count++];
      snprintf(w->worker_id, sizeof(w->worker_id), "%s", infos[i].worker_id);
      snprintf(w->session, sizeof(w->session), "%s-stream-%u-%" PRIx64,
               o->job_id, st.worker_count - 1, nonce);
      w->shard = st.worker_count - 1;
      w->alive = true;
    }
    if (!st.worker_count) {
      pcp_sleep_ms(200);
    }
  }
  free(infos);
  if (!status && resume_workers && st.worker_count < resume_workers) {
    PCP_LOG(PCP_LOG_WARN, &job->log,
            "resuming with %u of the checkpoint's %u streaming workers",
            st.worker_count, resume_workers);
  }
  if (!status && !resume_workers) {
    st.shard_count = st.worker_count;
  }
  if (!status) {
    status = stream_programs(&st, st.backend, st.target);
  }
  // Samplers: shard k of the plan over the train split (step 0); a resume
  // rebuilds the first start's plan and continues each worker's cursor.
  if (!status) {
    const char* names[MAX_ROUND_WORKERS];
    char storage[MAX_ROUND_WORKERS][24];
    for (uint32_t k = 0; k < st.shard_count; ++k) {
      snprintf(storage[k], sizeof(storage[k]), "shard-%04u", k);
      names[k] = storage[k];
    }
    pcp_data_assignment_t* plan = calloc(st.shard_count, sizeof(*plan));
    status = plan ? pcp_data_shard_plan(job->dataset, job->train_range,
                                        (uint32_t)job->spec.block_size, names,
                                        st.shard_count, 0, job->seed, plan)
                  : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "plan");
    for (uint32_t k = 0; k < st.worker_count && !status; ++k) {
      stream_worker_t* w = &st.workers[k];
      json_t* saved =
          resume_workers
              ? json_array_get(json_object_get(job->stream_resume, "workers"),
                               k)
              : NULL;
      if (saved) {
        w->shard =
            (uint32_t)json_integer_value(json_object_get(saved, "shard"));
        json_t* loss = json_object_get(saved, "loss");
        w->last_loss =
            json_is_number(loss) ? (float)json_number_value(loss) : NAN;
      }
      pcp_data_sampler_options_t so = {
          .sampling = job->config.sampling == PCP_DILOCO_SAMPLING_FIFO
                          ? PCP_DATA_SAMPLING_SEQUENTIAL
                          : PCP_DATA_SAMPLING_RANDOM,
          .batch_size = (uint32_t)job->spec.batch,
          .block_size = (uint32_t)job->spec.block_size,
          .seed = plan[w->shard].seed};
      status = pcp_data_sampler_create(job->dataset, plan[w->shard].range, &so,
                                       pcp_allocator_system(), &w->sampler);
      if (!status && saved) {
        const char* text = json_string_value(json_object_get(saved, "sampler"));
        pcp_data_cursor_t cursor;
        status = pcp_data_cursor_parse(pcp_make_string_view(text, strlen(text)),
                                       &cursor);
        if (!status) {
          status = pcp_data_sampler_restore(w->sampler, &cursor);
        }
      }
      size_t rows = (size_t)job->accumulation *
                    (size_t)(job->spec.batch * job->spec.block_size);
      w->tokens = status ? NULL : malloc(2 * rows * sizeof(int32_t));
      if (!status && job->data_type == PCP_ELEMENT_TYPE_I64) {
        w->tokens64 = malloc(2 * rows * sizeof(int64_t));
        if (!w->tokens64) {
          free(w->tokens);
          w->tokens = NULL;
        }
      }
      if (!status && !w->tokens) {
        status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "tokens");
      }
    }
    free(plan);
  }
  const pcp_diloco_job_hooks_t* hooks = &o->hooks;
  if (!status && hooks->phase) {
    status = hooks->phase(hooks->user_data, PCP_DILOCO_JOB_PHASE_RUNNING);
  }
  bool stopped = false;
  for (uint32_t p = 0; p < st.schedule.fragments && !status && !stopped; ++p) {
    if (!resume_state) {
      status = stream_init_call(&st, p, &stopped);
      continue;
    }
    for (int kind = 0; kind < 4 && !status && !stopped; ++kind) {
      status = stream_copy_call(&st, p, kind, true, resume_state, &stopped);
    }
  }
  free(resume_state);
  if (!status && resume_workers) {
    PCP_LOG(PCP_LOG_INFO, &job->log,
            "streaming resumed at step %" PRIu64 " sync %" PRIu64
            " on %u workers",
            loop.step + 1, st.syncs, st.worker_count);
  }
  uint64_t max_steps = pcp_streaming_diloco_max_steps(&st.schedule);
  // Per fragment: the send of the round in flight (its deltas' bytes and
  // senders, in loop), completed by its receive tau steps later, where the
  // sync's event is written (deltas up + masters down of the same round).
  int64_t pending_start[MAX_FRAGMENTS];
  for (uint32_t p = 0; p < MAX_FRAGMENTS; ++p) {
    pending_start[p] = pcp_clock_now_ns(o->clock);
  }
  // tokens_per_second: local steps and wall time since the previous event.
  int64_t last_event_ns = pcp_clock_now_ns(o->clock);
  uint64_t checkpointed = st.syncs;  // syncs at the last checkpoint
  uint64_t every = job->config.checkpoint_every > 0
                       ? (uint64_t)job->config.checkpoint_every
                       : 0;
  for (uint64_t t = loop.step + 1; t <= max_steps && !status && !stopped; ++t) {
    if (!stream_alive(&st)) {
      status = pcp_make_status(
          PCP_STATUS_ABORTED,
          "every streaming worker was lost by step %" PRIu64, t);
      break;
    }
    if (should_stop(job)) {
      stopped = true;
      break;
    }
    for (uint32_t p = 0; p < st.schedule.fragments && !status && !stopped;
         ++p) {
      uint32_t round = 0;
      if (!pcp_streaming_diloco_receives_at(&st.schedule, p, t, &round)) {
        continue;
      }
      uint64_t down = 0;
      status = stream_fragment_call(&st, p, true, false, &stopped, &down);
      if (status || stopped) {
        break;
      }
      if (o->metrics) {
        pcp_obs_family_add(o->metrics->wire_bytes,
                           (const char*[]){"parameters"}, (double)down);
      }
      uint64_t sync_bytes = loop.pending_up[p] + down;
      job->wire_bytes += sync_bytes;
      ++st.syncs;
      job->outer_step = st.syncs;
      double loss = 0;
      uint32_t alive = 0;
      for (uint32_t k = 0; k < st.worker_count; ++k) {
        if (st.workers[k].alive) {
          loss += st.workers[k].last_loss;
          ++alive;
        }
      }
      job->last_loss = alive ? loss / alive : NAN;
      job->last_loss_mean = job->last_loss;
      double seconds =
          (double)(pcp_clock_now_ns(o->clock) - pending_start[p]) / 1e9;
      round_outcome_t outcome = {.reporters = loop.pending_senders[p],
                                 .parameter_bytes = sync_bytes};
      int64_t now = pcp_clock_now_ns(o->clock);
      double window = (double)(now - last_event_ns) / 1e9;
      double tokens_per_second =
          window > 0 ? (double)alive * (double)job->spec.batch *
                           (double)job->spec.block_size *
                           (double)(t - 1 - loop.last_event_step) / window
                     : 0;
      last_event_ns = now;
      loop.last_event_step = t - 1;
      json_t* progress =
          progress_json(job, &outcome, seconds, tokens_per_second);
      if (progress) {
        json_object_set_new(progress, "outer_loop_steps",
                            json_integer((json_int_t)st.sync_total));
        json_object_set_new(progress, "fragment", json_integer(p));
        json_object_set_new(progress, "fragment_round", json_integer(round));
        json_object_set_new(progress, "local_step",
                            json_integer((json_int_t)t));
        json_object_set_new(progress, "workers_received", json_integer(alive));
        json_object_set_new(progress, "streaming", json_true());
        pcp_status_ignore(pcp_store_job_event_append(
            o->store, o->job_id, "training.step", progress, NULL));
      }
      progress_report(job, progress);
      json_decref(progress);
      if (o->metrics) {
        const char* job_label[] = {o->job_id};
        pcp_obs_family_observe(o->metrics->outer_step_seconds, NULL, seconds);
        pcp_obs_family_set(o->metrics->loss, job_label, job->last_loss);
        pcp_obs_family_add(o->metrics->outer_steps, NULL, 1);
      }
      PCP_LOG(PCP_LOG_INFO, &job->log,
              "streaming sync=%" PRIu64 "/%" PRIu64
              " fragment=%u round=%u step=%" PRIu64
              " loss=%.4f workers=%u wire_bytes=%" PRIu64,
              st.syncs, st.sync_total, p, round, t, job->last_loss, alive,
              sync_bytes);
    }
    if (!status && !stopped) {
      status = stream_compute(&st, t, &stopped);
    }
    for (uint32_t p = 0; p < st.schedule.fragments && !status && !stopped;
         ++p) {
      if (!pcp_streaming_diloco_sends_at(&st.schedule, p, t, NULL)) {
        continue;
      }
      loop.pending_senders[p] = stream_alive(&st);
      pending_start[p] = pcp_clock_now_ns(o->clock);
      uint64_t up = 0;
      status = stream_fragment_call(&st, p, false, false, &stopped, &up);
      loop.pending_up[p] = up;
      if (o->metrics) {
        pcp_obs_family_add(o->metrics->wire_bytes, (const char*[]){"deltas"},
                           (double)up);
      }
    }
    loop.step = t;
    // Every checkpoint_every syncs, at this step boundary (the end-of-run
    // one follows the loop).
    if (!status && !stopped && every && t < max_steps &&
        st.syncs / every > checkpointed / every) {
      status = stream_checkpoint(&st, &loop, &stopped);
      checkpointed = st.syncs;
    }
  }
  if (!status && stopped) {
    status = pcp_make_status(PCP_STATUS_CANCELLED,
                             "training stopped at sync %" PRIu64, st.syncs);
  }
  if (!status) {
    status = stream_checkpoint(&st, &loop, &stopped);
    if (!status && stopped) {
      status = pcp_make_status(PCP_STATUS_CANCELLED,
                               "training stopped at its last checkpoint");
    }
  }
  for (uint32_t k = 0; k < st.worker_count; ++k) {
    pcp_fabric_task_release(st.workers[k].task);
    pcp_data_sampler_release(st.workers[k].sampler);
    free(st.workers[k].tokens);
    free(st.workers[k].tokens64);
  }
  free(st.names);
  free(st.zeros);
  return status;
}

//===----------------------------------------------------------------------===//
// The job
//===----------------------------------------------------------------------===//

pcp_status_t pcp_diloco_job_run(const pcp_diloco_job_options_t* options) {
  job_t job;
  memset(&job, 0, sizeof(job));
  job.options = options;
  job.log = options->log;
  job.log.job_id = options->job_id;
  job.last_loss = NAN;
  job.last_loss_mean = NAN;
  pcp_status_t status = job_setup(&job);
  if (!status) {
    pcp_sha256_t digest;
    pcp_sha256_compute(job.model_text, job.model_length, &digest);
    pcp_sha256_to_hex(&digest, job.model_hash);
    status = job_resume(&job);
    // A checkpoint written when the data ran out ends the job again.
    job.epochs_done = epochs_trained(&job) >= (double)job.config.max_epochs;
  }
  if (!status && job.config.streaming.present) {
    status = stream_run(&job);
    job_deinitialize(&job);
    return status;
  }
  const pcp_diloco_job_hooks_t* hooks = &options->hooks;
  if (!status && hooks->phase) {
    status = hooks->phase(hooks->user_data, PCP_DILOCO_JOB_PHASE_RUNNING);
  }
  if (!status) {
    json_t* progress = progress_json(&job, NULL, 0, 0);
    progress_report(&job, progress);
    json_decref(progress);
  }
  uint32_t empty_rounds = 0;
  char last_error[256] = "";
  while (!status && (int64_t)job.outer_step < job.config.outer_loop_steps &&
         !job.epochs_done) {
    if (should_stop(&job)) {
      status = pcp_make_status(PCP_STATUS_CANCELLED,
                               "training stopped at "
                               "outer step %" PRIu64,
                               job.outer_step);
      break;
    }
    bool stopped = false, advanced = false;
    uint64_t before = job.outer_step;
    status = outer_step_run(&job, &stopped, &advanced, last_error,
                            sizeof(last_error));
    if (status) {
      break;
    }
    if (stopped) {
      status = pcp_make_status(PCP_STATUS_CANCELLED,
                               "training stopped at outer step %" PRIu64,
                               job.outer_step);
      break;
    }
    if (advanced || job.outer_step != before) {
      empty_rounds = 0;
    } else if (last_error[0] && ++empty_rounds >= MAX_EMPTY_ROUNDS) {
      status = pcp_make_status(PCP_STATUS_ABORTED,
                               "%u rounds in a row without a delta; last "
                               "error: %s",
                               empty_rounds, last_error);
    }
    last_error[0] = 0;
  }
  if (!status && job.outer_step == 0) {
    // outer_loop_steps reached with nothing run (0 steps): still export.
    status = model_export(&job);
  }
  job_deinitialize(&job);
  return status;
}
