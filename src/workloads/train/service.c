// SPDX-License-Identifier: Apache-2.0
//
// The DiLoCo training service (service.h): the job (set-up, model_path
// modules, checkpoints, the model export, programs compiled in a child) and
// classic DiLoCo's outer loop; streaming DiLoCo is service_stream.c.
//
// A round: a worker gets the global parameters, tau batches and the tau
// learning rates of the schedule, runs @diloco_round (src/compile/
// diloco_program.c) and returns its delta. With inner_state reset nothing
// lives on a worker between rounds (fresh AdamW moments every round); with
// keep (the default) its moments stay resident in a fabric session on it
// ("Inner AdamW state kept on the workers" below). The gateway holds the
// parameter vector, the outer momentum and the outer step, which the
// checkpoint holds (plus, with keep, the workers' moments in a side file);
// the batches are a pure function of (seed, outer step, shard index). A
// resumed run repeats an uninterrupted one bit for bit as long as the same
// number of workers report. Every eval_every steps the masters are
// evaluated on one worker over fixed held-out batches (val_loss).

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compile/compile.h"
#include "workloads/train/service_impl.h"

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
    {.name = "pcp_training_val_loss",
     .type = PCP_OBS_METRIC_TYPE_GAUGE,
     .help = "Mean loss of the masters on the fixed held-out batches (last "
             "evaluation)",
     .label_names = kJobLabels},
    {.name = "pcp_training_learning_rate",
     .type = PCP_OBS_METRIC_TYPE_GAUGE,
     .help = "Inner learning rate of the last inner step (the schedule)",
     .label_names = kJobLabels},
    {.name = "pcp_training_param_hash_mismatch_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Workers whose SHA-256 of the global parameters differed from "
             "the gateway's",
     .label_names = kJobLabels},
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
  out_metrics->val_loss = families[7];
  out_metrics->learning_rate = families[8];
  out_metrics->param_hash_mismatches = families[9];
  return pcp_ok_status();
}

void pcp_diloco_metrics_job_remove(const pcp_diloco_metrics_t* metrics,
                                   const char* job_id) {
  if (!metrics || !job_id) {
    return;
  }
  const char* labels[] = {job_id};
  pcp_obs_family_t* per_job[] = {metrics->loss, metrics->tokens_per_second,
                                 metrics->val_loss, metrics->learning_rate,
                                 metrics->param_hash_mismatches};
  for (size_t i = 0; i < PCP_ARRAYSIZE(per_job); ++i) {
    if (per_job[i]) {
      pcp_obs_family_series_remove(per_job[i], labels);
    }
  }
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

uint64_t pcp_diloco_inner_step_total(const pcp_diloco_config_t* config) {
  if (config->streaming.present) {
    pcp_streaming_diloco_schedule_t schedule = {
        .fragments = (uint32_t)config->streaming.num_fragments,
        .inner_steps = (uint32_t)config->streaming.inner_steps,
        .overlap_tau = (uint32_t)config->streaming.overlap_tau,
        .max_rounds = (uint32_t)config->max_epochs};
    return pcp_streaming_diloco_max_steps(&schedule);
  }
  return (uint64_t)config->outer_loop_steps * (uint64_t)config->tau;
}

pcp_status_t pcp_diloco_experiment_check(const pcp_diloco_config_t* config,
                                         int64_t micro_batch,
                                         int64_t block_size,
                                         pcp_element_type_t id_type) {
  if (config->tau > 4096) {
    // The fused inner loop's bound (pcp compile --inner-steps).
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'tau': %lld inner steps; the round program "
                           "takes at most 4096",
                           (long long)config->tau);
  }
  if (config->dtype == PCP_DILOCO_DTYPE_F16) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'dtype': f16 is not trained (f32 or bf16; "
                           "bf16 keeps f32's range)");
  }
  // The schedule runs over the job's inner steps: a warmup longer than the
  // run never reaches learning_rate, which is a configuration mistake.
  uint64_t total_steps = pcp_diloco_inner_step_total(config);
  if (config->warmup_steps > 0 &&
      (uint64_t)config->warmup_steps > total_steps) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "key 'warmup_steps': %lld warmup steps; the run "
                           "has %llu inner steps per worker",
                           (long long)config->warmup_steps,
                           (unsigned long long)total_steps);
  }
  int64_t ebs = config->effective_batch_size;
  if (ebs > 0 && (ebs % micro_batch != 0 || ebs / micro_batch > 4096)) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "key 'effective_batch_size': %lld must be a multiple of the micro "
        "batch %lld, at most 4096 of them",
        (long long)ebs, (long long)micro_batch);
  }
  // One task frame carries a worker's round of tokens: keep it within what
  // a worker takes in one frame. In floating point: the factors' bounds
  // (tau 4096, 4096 micro batches, B and T up to 2^24) overflow 64 bits.
  double accumulation = ebs > 0 ? (double)(ebs / micro_batch) : 1.0;
  double round_token_bytes = 2.0 * (double)config->tau * accumulation *
                             (double)micro_batch * (double)block_size *
                             (double)pcp_element_type_byte_size(id_type);
  if (round_token_bytes > (double)((uint64_t)256 << 20)) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "key 'tau': tau x effective batch x block size make %.0f MiB of "
        "tokens per worker round; the limit is 256 MiB",
        round_token_bytes / (1 << 20));
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Job state
//===----------------------------------------------------------------------===//

static void job_deinitialize(job_t* job) {
  pcp_diloco_job_free(job, job->model_text);
  pcp_diloco_job_free(job, job->parameters);
  pcp_diloco_job_free(job, job->wire_parameters);
  pcp_diloco_job_free(job, job->tensor_elements);
  pcp_diloco_job_free(job, job->scratch);
  pcp_diloco_job_free(job, job->eval_tokens);
  pcp_diloco_job_free(job, job->eval_tokens64);
  pcp_allocator_free(pcp_allocator_system(), job->inner_resume);
  pcp_diloco_job_free(job, job->inner_resume_steps);
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
  json_decref(job->inner_cursor);
  pcp_diloco_config_deinitialize(&job->config);
}

// JSON has no NaN: a loss not known yet (or diverged) is null.
void* pcp_diloco_job_malloc(job_t* job, size_t byte_length) {
  void* ptr = NULL;
  pcp_status_t status = pcp_allocator_malloc(job->allocator, byte_length, &ptr);
  if (status) {
    pcp_status_ignore(status);
    return NULL;
  }
  return ptr;
}

void* pcp_diloco_job_calloc(job_t* job, size_t count, size_t size) {
  if (size != 0 && count > SIZE_MAX / size) {
    return NULL;
  }
  void* ptr = NULL;
  pcp_status_t status =
      pcp_allocator_calloc(job->allocator, count * size, &ptr);
  if (status) {
    pcp_status_ignore(status);
    return NULL;
  }
  return ptr;
}

void pcp_diloco_job_free(job_t* job, void* ptr) {
  pcp_allocator_free(job->allocator, ptr);
}

json_t* pcp_diloco_json_number_or_null(double value) {
  return isfinite(value) ? json_real(value) : json_null();
}

bool pcp_diloco_job_should_stop(job_t* job) {
  const pcp_diloco_job_hooks_t* hooks = &job->options->hooks;
  return hooks->should_stop && hooks->should_stop(hooks->user_data);
}

// Tensor |i|'s start in the parameter vector.
size_t pcp_diloco_job_tensor_offset(const job_t* job, size_t index) {
  size_t offset = 0;
  for (size_t i = 0; i < index; ++i) {
    offset += (size_t)job->table.parameters[i].element_count;
  }
  return offset;
}

// Passes over the train split so far: the tokens sent (token_bytes counts
// ids and targets) over the split's tokens.
double pcp_diloco_job_epochs_trained(const job_t* job) {
  uint64_t per_token = 2 * (uint64_t)pcp_element_type_byte_size(job->data_type);
  return job->train_tokens ? (double)(job->token_bytes / per_token) /
                                 (double)job->train_tokens
                           : 0;
}

void pcp_diloco_job_step_metrics(const job_t* job,
                                 const round_outcome_t* outcome, double seconds,
                                 double tokens_per_second) {
  const pcp_diloco_job_options_t* o = job->options;
  if (!o->metrics) {
    return;
  }
  const char* job_label[] = {o->job_id};
  pcp_obs_family_observe(o->metrics->outer_step_seconds, NULL, seconds);
  pcp_obs_family_set(o->metrics->loss, job_label, job->last_loss);
  pcp_obs_family_set(o->metrics->tokens_per_second, job_label,
                     tokens_per_second);
  pcp_obs_family_add(o->metrics->wire_bytes, (const char*[]){"parameters"},
                     (double)outcome->parameter_bytes);
  pcp_obs_family_add(o->metrics->wire_bytes, (const char*[]){"deltas"},
                     (double)outcome->delta_bytes);
  pcp_obs_family_add(o->metrics->token_bytes, NULL,
                     (double)outcome->token_bytes);
  pcp_obs_family_add(o->metrics->outer_steps, NULL, 1);
}

// Classic rounds keep each worker's inner AdamW state (inner_state keep).
static bool keeps_state(const job_t* job) {
  return !job->config.streaming.present &&
         job->config.inner_state == PCP_DILOCO_INNER_STATE_KEEP;
}

// Micro-batches of B x T tokens one worker consumes per round.
static size_t batches_per_round(const job_t* job) {
  return (size_t)job->config.tau * (size_t)job->accumulation;
}

//===----------------------------------------------------------------------===//
// Set-up
//===----------------------------------------------------------------------===//

pcp_status_t pcp_diloco_job_npy_i32_write(job_t* job, const char* file_name,
                                          const int64_t* shape, size_t rank,
                                          const int32_t* data) {
  char header[256];
  int used = snprintf(header, sizeof(header),
                      "{'descr': '<i4', 'fortran_order': False, 'shape': (");
  size_t elements = 1;
  for (size_t r = 0; r < rank && used > 0 && (size_t)used < sizeof(header);
       ++r) {
    used += snprintf(header + used, sizeof(header) - (size_t)used, "%s%lld",
                     r ? ", " : "", (long long)shape[r]);
    elements *= (size_t)shape[r];
  }
  if (used > 0 && (size_t)used < sizeof(header)) {
    // A Python tuple of one needs its comma.
    used += snprintf(header + used, sizeof(header) - (size_t)used, "%s), }",
                     rank == 1 ? "," : "");
  }
  if (rank == 0 || rank > 8 || used <= 0 || (size_t)used >= sizeof(header)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s: an npy shape of rank %zu", file_name, rank);
  }
  // NPY 1.0: magic, version, u16 header length; the header padded with
  // spaces and ended by a newline so the data starts at a multiple of 64.
  size_t total = (size_t)used + 1 + 10;
  size_t padded = (total + 63) / 64 * 64;
  size_t bytes = padded + elements * sizeof(int32_t);
  uint8_t* out = pcp_diloco_job_malloc(job, bytes);
  if (!out) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "%s", file_name);
  }
  memcpy(out, "\x93NUMPY\x01\x00", 8);
  uint16_t header_length = (uint16_t)(padded - 10);
  out[8] = (uint8_t)(header_length & 0xff);
  out[9] = (uint8_t)(header_length >> 8);
  memset(out + 10, ' ', padded - 10);
  memcpy(out + 10, header, (size_t)used);
  out[padded - 1] = '\n';
  memcpy(out + padded, data, elements * sizeof(int32_t));
  char path[1400];
  snprintf(path, sizeof(path), "%s/%s", job->dir, file_name);
  pcp_status_t status = pcp_file_write_atomic(path, out, bytes);
  pcp_diloco_job_free(job, out);
  return status;
}

// <job dir>/eval_batches.npy: the held-out batches every evaluation uses,
// int32 [2, eval_batches, B, T] (input ids, then targets), so val_loss can
// be recomputed outside PCP (tests/integration/training_schedule_test.py).
static pcp_status_t eval_batches_save(job_t* job) {
  if (!job->eval_enabled) {
    return pcp_ok_status();
  }
  int64_t shape[4] = {2, job->config.eval_batches, job->spec.batch,
                      job->spec.block_size};
  return pcp_diloco_job_npy_i32_write(job, "eval_batches.npy", shape, 4,
                                      job->eval_tokens);
}

// The fixed held-out batches: a random sampler over the validation tail
// seeded from the job's seed alone, drawn once, so val_loss compares the
// same tokens at every evaluation (and in a resumed run).
static pcp_status_t eval_batches_sample(job_t* job) {
  if (job->config.eval_fraction <= 0) {
    return pcp_ok_status();
  }
  uint32_t b = (uint32_t)job->spec.batch;
  uint32_t t = (uint32_t)job->spec.block_size;
  size_t rows = (size_t)job->config.eval_batches * b * t;
  pcp_data_sampler_options_t options = {
      .sampling = PCP_DATA_SAMPLING_RANDOM,
      .batch_size = b,
      .block_size = t,
      .seed = job->seed ^ 0x6576616c5f736574ull,  // "eval_set"
  };
  pcp_data_sampler_t* sampler = NULL;
  pcp_status_t status =
      pcp_data_sampler_create(job->dataset, job->eval_range, &options,
                              pcp_allocator_system(), &sampler);
  if (status) {
    pcp_status_t wrapped = pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "key 'eval_fraction': the held-out tail does not hold one batch: %s",
        pcp_status_message(status));
    pcp_status_ignore(status);
    return wrapped;
  }
  job->eval_tokens = pcp_diloco_job_malloc(job, 2 * rows * sizeof(int32_t));
  if (job->data_type == PCP_ELEMENT_TYPE_I64) {
    job->eval_tokens64 = pcp_diloco_job_malloc(job, 2 * rows * sizeof(int64_t));
  }
  if (!job->eval_tokens ||
      (job->data_type == PCP_ELEMENT_TYPE_I64 && !job->eval_tokens64)) {
    pcp_data_sampler_release(sampler);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "eval batches");
  }
  size_t per_batch = (size_t)b * t;
  for (int64_t k = 0; k < job->config.eval_batches; ++k) {
    pcp_data_sampler_next(sampler, job->eval_tokens + (size_t)k * per_batch,
                          job->eval_tokens + rows + (size_t)k * per_batch,
                          NULL);
  }
  pcp_data_sampler_release(sampler);
  for (size_t i = 0; job->eval_tokens64 && i < 2 * rows; ++i) {
    job->eval_tokens64[i] = job->eval_tokens[i];
  }
  job->eval_enabled = true;
  return pcp_ok_status();
}

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
  PCP_RETURN_IF_ERROR_BARE(pcp_diloco_experiment_check(
      &job->config, job->spec.batch, job->spec.block_size, job->data_type));
  job->accumulation = job->config.effective_batch_size > 0
                          ? job->config.effective_batch_size / job->spec.batch
                          : 1;

  // One task frame carries every parameter as a section (classic) or one
  // fragment's (streaming), within the fabric's per-frame section limit.
  uint32_t max_sections = pcp_proto_limits_default().max_sections;
  size_t per_frame =
      job->config.streaming.present
          ? (job->table.count + (size_t)job->config.streaming.num_fragments -
             1) / (size_t)job->config.streaming.num_fragments +
                1
          : job->table.count +
                (job->config.inner_state == PCP_DILOCO_INNER_STATE_KEEP ? 4
                                                                        : 3);
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
  PCP_RETURN_IF_ERROR_BARE(
      pcp_data_dataset_split(job->dataset, job->config.eval_fraction,
                             &job->train_range, &job->eval_range));
  PCP_RETURN_IF_ERROR_BARE(pcp_data_dataset_token_count(
      job->dataset, job->train_range, &job->train_tokens));
  PCP_RETURN_IF_ERROR_BARE(eval_batches_sample(job));
  pcp_diloco_lr_schedule_initialize(
      &job->config, pcp_diloco_inner_step_total(&job->config), &job->schedule);
  job->last_lr = pcp_diloco_lr_schedule_at(&job->schedule, 0);

  const char* checkpoint_dir = job->config.checkpoint_dir;
  if (checkpoint_dir && checkpoint_dir[0]) {
    snprintf(job->checkpoint_dir, sizeof(job->checkpoint_dir), "%s%s%s",
             checkpoint_dir[0] == '/' ? "" : o->state_dir,
             checkpoint_dir[0] == '/' ? "" : "/", checkpoint_dir);
  }
  // The module text (deterministic for a spec) and the job's directory.
  snprintf(job->dir, sizeof(job->dir), "%s/training/%s", o->state_dir,
           o->job_id);
  PCP_RETURN_IF_ERROR_BARE(pcp_file_make_directories(job->dir));
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
  PCP_RETURN_IF_ERROR_BARE(eval_batches_save(job));

  // Global state: parameters (seeded init), velocity, accumulator.
  size_t n = (size_t)job->table.total_elements;
  job->parameter_count = n;
  job->parameters = pcp_diloco_job_calloc(job, n ? n : 1, sizeof(float));
  job->tensor_elements =
      pcp_diloco_job_calloc(job, job->table.count + 1, sizeof(uint64_t));
  job->scratch = pcp_diloco_job_calloc(job, n ? n : 1, sizeof(float));
  bool bf16 = job->param_type == PCP_ELEMENT_TYPE_BF16;
  if (bf16) {
    job->wire_parameters =
        pcp_diloco_job_calloc(job, n ? n : 1, sizeof(uint16_t));
  }
  void** buffers =
      pcp_diloco_job_calloc(job, job->table.count + 1, sizeof(void*));
  if (!job->parameters || !job->tensor_elements || !job->scratch || !buffers ||
      (bf16 && !job->wire_parameters)) {
    pcp_diloco_job_free(job, buffers);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "%zu parameters", n);
  }
  for (size_t i = 0; i < job->table.count; ++i) {
    // The initializer writes the table's type: bf16 goes through the wire
    // buffer and is widened, so the f32 masters start at the values the
    // workers see.
    buffers[i] =
        bf16 ? (void*)(job->wire_parameters +
                       pcp_diloco_job_tensor_offset(job, i))
             : (void*)(job->parameters + pcp_diloco_job_tensor_offset(job, i));
    job->tensor_elements[i] = (uint64_t)job->table.parameters[i].element_count;
  }
  pcp_models_parameters_initialize(&job->table, job->seed, buffers);
  pcp_diloco_job_free(job, buffers);
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
  job->inner_nonce = (uint64_t)pcp_clock_now_ns(o->clock) & 0xffffffffffull;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Checkpoints and the exported model
//===----------------------------------------------------------------------===//

// The checkpoint's opaque cursor: what a resume needs beyond params and
// velocity. The batches depend only on (seed, outer step, shard), so the
// cursor is the seed plus the running totals. A streaming job's adds its
// "streaming" object (stream_cursor_json).
static char* cursor_json(const job_t* job) {
  bool decoupled = pcp_diloco_decoupled_selected(job);
  json_t* cursor = json_pack(
      "{s:s, s:I, s:I, s:I, s:I, s:o, s:o}", "kind",
      pcp_diloco_ddp_selected(job)    ? CURSOR_KIND_DDP
      : decoupled                     ? CURSOR_KIND_DECOUPLED
      : job->config.streaming.present ? CURSOR_KIND_STREAMING
                                      : CURSOR_KIND_CLASSIC,
      "seed", (json_int_t)job->seed, "workers",
      (json_int_t)job->expected_workers, "wire_bytes",
      (json_int_t)job->wire_bytes, "token_bytes", (json_int_t)job->token_bytes,
      "loss", pcp_diloco_json_number_or_null(job->last_loss), "loss_mean",
      pcp_diloco_json_number_or_null(job->last_loss_mean));
  if (cursor && job->stream_cursor) {
    json_object_set(cursor, decoupled ? "decoupled" : "streaming",
                    job->stream_cursor);
  }
  if (cursor && job->inner_cursor) {
    json_object_set(cursor, "inner", job->inner_cursor);
  }
  if (cursor) {
    // Goodput's totals (a checkpoint without them resumes from 0).
    json_object_set_new(cursor, "tokens_computed",
                        json_integer((json_int_t)job->tokens_computed));
    json_object_set_new(cursor, "tokens_merged", json_real(job->tokens_merged));
  }
  if (cursor && isfinite(job->last_val_loss)) {
    json_object_set_new(cursor, "val_loss", json_real(job->last_val_loss));
    json_object_set_new(cursor, "val_loss_step",
                        json_integer((json_int_t)job->val_loss_step));
  }
  char* text = cursor ? json_dumps(cursor, JSON_COMPACT) : NULL;
  json_decref(cursor);
  return text;
}

// A classic checkpoint's "inner" object (inner_state keep): reads and
// verifies its side file beside |from| into job->inner_resume. DATA_LOSS
// naming the file when its length or SHA-256 differs from the cursor's.
static pcp_status_t inner_resume_load(job_t* job, json_t* inner,
                                      const char* from) {
  if (!keeps_state(job)) {
    PCP_LOG(PCP_LOG_INFO, &job->log,
            "checkpoint %s holds kept inner state; inner_state reset does "
            "not use it",
            from);
    return pcp_ok_status();
  }
  const char* name = json_string_value(json_object_get(inner, "state_file"));
  const char* want = json_string_value(json_object_get(inner, "state_sha256"));
  json_t* steps = json_object_get(inner, "steps");
  size_t count = json_array_size(steps);
  size_t N = job->parameter_count;
  if (!name || strchr(name, '/') || !want || count > MAX_ROUND_WORKERS ||
      (uint64_t)json_integer_value(json_object_get(inner, "state_bytes")) !=
          (uint64_t)count * 2 * N * sizeof(float)) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "checkpoint %s: inner state does not fit the "
                           "model",
                           from);
  }
  char dir[1300];
  snprintf(dir, sizeof(dir), "%s", from);
  char* slash = strrchr(dir, '/');
  if (slash) {
    *slash = 0;
  } else {
    snprintf(dir, sizeof(dir), ".");
  }
  char path[1700];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  size_t bytes = count * 2 * N * sizeof(float);
  void* data = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(pcp_file_read_all(path, bytes + 1, &data, &length));
  pcp_sha256_t digest;
  pcp_sha256_compute(data, length, &digest);
  char got[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&digest, got);
  if (length != bytes || strcmp(got, want) != 0) {
    pcp_allocator_free(pcp_allocator_system(), data);
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "inner state file %s: %zu bytes, SHA-256 %s; the "
                           "checkpoint expects %zu bytes, %s",
                           path, length, got, bytes, want);
  }
  job->inner_resume_steps =
      pcp_diloco_job_calloc(job, count + 1, sizeof(uint64_t));
  if (!job->inner_resume_steps) {
    pcp_allocator_free(pcp_allocator_system(), data);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "inner steps");
  }
  for (size_t k = 0; k < count; ++k) {
    job->inner_resume_steps[k] =
        (uint64_t)json_integer_value(json_array_get(steps, k));
  }
  job->inner_resume = data;
  job->inner_resume_count = (uint32_t)count;
  PCP_LOG(PCP_LOG_INFO, &job->log, "inner state of %zu workers from %s", count,
          path);
  return pcp_ok_status();
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
  // Decoupled checkpoints hold the syncer's state and tape (its own
  // object), which neither other mode can use, and the reverse.
  bool decoupled = kind && strcmp(kind, CURSOR_KIND_DECOUPLED) == 0;
  bool job_decoupled = pcp_diloco_decoupled_selected(job);
  bool streaming = kind && strcmp(kind, CURSOR_KIND_STREAMING) == 0;
  // ddp's hold parameters only; a classic one's inner state would be
  // silently ignored by a ddp job, and a ddp one is no classic run's.
  bool ddp = kind && strcmp(kind, CURSOR_KIND_DDP) == 0;
  bool job_ddp = pcp_diloco_ddp_selected(job);
  json_t* stream = json_object_get(cursor, "streaming");
  if (decoupled) {
    stream = json_object_get(cursor, "decoupled");
  }
  const char* have = ddp         ? "ddp"
                     : decoupled ? "decoupled DiLoCo"
                     : streaming ? "streaming DiLoCo"
                                 : "classic DiLoCo";
  const char* want = job_ddp                         ? "ddp"
                     : job_decoupled                 ? "decoupled DiLoCo"
                     : job->config.streaming.present ? "streaming DiLoCo"
                                                     : "classic DiLoCo";
  if (ddp != job_ddp || decoupled != job_decoupled ||
      (!decoupled && streaming != job->config.streaming.present) ||
      ((streaming || decoupled) && !json_is_object(stream))) {
    json_decref(cursor);
    return pcp_make_status(
        PCP_STATUS_FAILED_PRECONDITION,
        "checkpoint %s is from a %s run; this job is a %s one", from, have,
        want);
  }
  // The resumed object is handed on as the streaming one is (a decoupled
  // one is read by service_decoupled.c); neither holds classic inner state.
  streaming = streaming || decoupled;
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
  json_t* inner = json_object_get(cursor, "inner");
  if (!streaming && json_is_object(inner)) {
    pcp_status_t status = inner_resume_load(job, inner, from);
    if (status) {
      json_decref(cursor);
      return status;
    }
  } else if (!streaming && keeps_state(job)) {
    PCP_LOG(PCP_LOG_INFO, &job->log,
            "checkpoint %s holds no inner state: the workers start fresh "
            "moments",
            from);
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
    // Goodput's totals; absent (an older checkpoint) or not sane: from 0.
    json_int_t computed =
        json_integer_value(json_object_get(cursor, "tokens_computed"));
    double merged = json_number_value(json_object_get(cursor, "tokens_merged"));
    // (A fragment-weighted sum may pass computed by a rounding error.)
    bool sane = computed > 0 && isfinite(merged) && merged >= 0 &&
                merged <= (double)computed * (1 + 1e-9);
    job->tokens_computed = sane ? (uint64_t)computed : 0;
    job->tokens_merged = sane ? merged : 0;
    json_t* loss = json_object_get(cursor, "loss");
    json_t* loss_mean = json_object_get(cursor, "loss_mean");
    job->last_loss = json_is_number(loss) ? json_number_value(loss) : NAN;
    job->last_loss_mean =
        json_is_number(loss_mean) ? json_number_value(loss_mean) : NAN;
    json_t* val_loss = json_object_get(cursor, "val_loss");
    if (json_is_number(val_loss)) {
      job->last_val_loss = json_number_value(val_loss);
      job->val_loss_step = (uint64_t)json_integer_value(
          json_object_get(cursor, "val_loss_step"));
    }
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
  const void** buffers =
      pcp_diloco_job_calloc(job, job->table.count + 1, sizeof(void*));
  if (!buffers) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "export buffers");
  }
  bool bf16 = job->param_type == PCP_ELEMENT_TYPE_BF16;
  if (bf16) {
    pcp_diloco_bf16_quantize(job->parameters, job->parameter_count,
                             job->wire_parameters);
  }
  for (size_t i = 0; i < job->table.count; ++i) {
    buffers[i] = bf16 ? (const void*)(job->wire_parameters +
                                      pcp_diloco_job_tensor_offset(job, i))
                      : (const void*)(job->parameters +
                                      pcp_diloco_job_tensor_offset(job, i));
  }
  pcp_status_t status = pcp_models_safetensors_save(
      &job->table, (const void* const*)buffers, path);
  pcp_diloco_job_free(job, buffers);
  return status;
}

// <state_dir>/models/<job_id>/model.safetensors then model.json (the
// inference service's layout; model.json last so a reader never sees it
// before its weights). A model_path module has no architecture the
// inference service knows: its weights go to the job's directory
// (<state_dir>/training/<job_id>/model.safetensors, "param_<i>" in
// argument order) and nothing is served.
pcp_status_t pcp_diloco_job_model_export(job_t* job) {
  const pcp_diloco_job_options_t* o = job->options;
  char path[1300];
  if (job->foreign) {
    snprintf(path, sizeof(path), "%s/model.safetensors", job->dir);
    return weights_save(job, path);
  }
  char dir[1200];
  snprintf(dir, sizeof(dir), "%s/models/%s", o->state_dir, o->job_id);
  PCP_RETURN_IF_ERROR_BARE(pcp_file_make_directories(dir));
  snprintf(path, sizeof(path), "%s/model.safetensors", dir);
  pcp_status_t status = weights_save(job, path);
  PCP_RETURN_IF_ERROR_BARE(status);
  // model.json commits to these exact bytes: a reader that finds another
  // file under the name (the next export's, renamed in meanwhile) knows it
  // is not the one described and waits for the next model.json.
  pcp_sha256_t digest;
  uint64_t weights_bytes = 0;
  PCP_RETURN_IF_ERROR_BARE(pcp_file_sha256(path, &digest, &weights_bytes));
  char digest_hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&digest, digest_hex);
  json_t* tokenizer = NULL;
  if (pcp_data_dataset_format(job->dataset) == PCP_DATA_FORMAT_CHAR) {
    // The vocabulary in id order is the decoding of ids 0..count-1.
    size_t count = 0;
    pcp_data_dataset_symbols(job->dataset, &count);
    int32_t* ids = pcp_diloco_job_malloc(job, (count + 1) * sizeof(int32_t));
    char* text = pcp_diloco_job_malloc(job, count * 4 + 1);
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
    pcp_diloco_job_free(job, ids);
    if (decoded) {
      pcp_diloco_job_free(job, text);
      return decoded;
    }
    tokenizer = json_pack("{s:s, s:s%}", "kind", "char", "vocab", text, used);
    pcp_diloco_job_free(job, text);
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
      pcp_diloco_json_number_or_null(job->last_loss));
  if (model) {
    json_object_set_new(model, "weights_bytes",
                        json_integer((json_int_t)weights_bytes));
    json_object_set_new(model, "weights_sha256", json_string(digest_hex));
    json_object_set_new(model, "val_loss",
                        pcp_diloco_json_number_or_null(job->last_val_loss));
    if (job->config.serve_worker_class) {
      // Served only there (docs/api.md), away from the training workers.
      json_object_set_new(model, "worker_class",
                          json_string(job->config.serve_worker_class));
    }
  }
  char* text = model ? json_dumps(model, JSON_INDENT(2)) : NULL;
  json_decref(model);
  if (!text) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "model.json");
  }
  snprintf(path, sizeof(path), "%s/model.json", dir);
  status = pcp_file_write_atomic(path, text, strlen(text));
  pcp_libc_free(text);
  if (!status && o->hooks.exported) {
    o->hooks.exported(o->hooks.user_data, dir);
  }
  return status;
}

pcp_status_t pcp_diloco_job_checkpoint_write(job_t* job) {
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
    status = pcp_file_make_directories(job->checkpoint_dir);
    snprintf(path, sizeof(path), "%s/latest.ckpt", job->checkpoint_dir);
    if (!status) {
      status = pcp_diloco_checkpoint_save(&c, path);
    }
  }
  pcp_libc_free(cursor);
  PCP_RETURN_IF_ERROR_BARE(status);
  PCP_LOG(PCP_LOG_INFO, &job->log, "checkpoint outer_step=%" PRIu64,
          job->outer_step);
  return pcp_diloco_job_model_export(job);
}

//===----------------------------------------------------------------------===//
// Programs
//===----------------------------------------------------------------------===//

// A compile waited on through the hooks' waiter (pcp_diloco_job_child_compile).
typedef struct compile_wait_t {
  const pcp_diloco_job_hooks_t* hooks;
  _Atomic bool finished;
} compile_wait_t;

// The queue's notification (under its lock, any thread): the job's thread
// sleeps until the request finished, so |wait| and the hooks are alive.
static void compile_finished(void* user_data) {
  compile_wait_t* wait = user_data;
  atomic_store(&wait->finished, true);
  wait->hooks->signal(wait->hooks->user_data);
}

// Under the waiter's lock: an atomic read.
static bool compile_ready(void* arg) {
  return atomic_load(&((compile_wait_t*)arg)->finished);
}

// Compiles `pcp compile [--program KIND --inner-steps K] MLIR` for (backend,
// target) through the compile queue (a child process: no MLIR in the
// gateway), whose one artifact key covers everything that shapes the
// program, so a restarted job (or the same experiment again) reuses it
// without deriving anything; then registers it with the fabric. |kind| NULL
// compiles the module as it is. The job's own queue (options.compile_queue)
// or, without one, a queue of one slot for this compile.
pcp_status_t pcp_diloco_job_child_compile(
    job_t* job, const char* mlir_path, const char* content_hash,
    const char* kind, int64_t inner_steps, const char* backend,
    const char* target, uint8_t out_hash[PCP_SHA256_BYTE_LENGTH]) {
  const pcp_diloco_job_options_t* o = job->options;
  // Extra compiler flags: the experiment's iree_flags (validated at
  // submit); $PCP_IREE_FLAGS is in the key through the queue. The DiLoCo
  // round of a keep job carries the inner state in and out (`--inner-state
  // keep`: another program, so another key).
  const pcp_string_list_t* extra = &job->config.iree_flags;
  pcp_workloads_compile_spec_t spec = {
      .mlir_path = mlir_path,
      .content_hash = content_hash,
      .program = kind,
      .inner_steps = inner_steps,
      .delta_dtype =
          job->config.deltas_dtype == PCP_DILOCO_WIRE_BF16 ? "bf16" : "f32",
      .accumulation = job->accumulation,
      .inner_state_keep = kind && !strcmp(kind, "diloco") && keeps_state(job),
      .iree_flags = (const char* const*)extra->items,
      .iree_flag_count = extra->count < PCP_COMPILE_MAX_EXTRA_FLAGS
                             ? extra->count
                             : PCP_COMPILE_MAX_EXTRA_FLAGS,
      .backend = backend,
      .target = target,
      .log_dir = job->dir,
      .label = o->job_id,
  };
  pcp_workloads_compile_queue_t* queue = o->compile_queue;
  pcp_workloads_compile_queue_t* own = NULL;
  if (!queue) {
    char artifacts[1100];
    snprintf(artifacts, sizeof(artifacts), "%s/artifacts", o->state_dir);
    pcp_workloads_compile_queue_options_t queue_options = {
        .pcp_path = o->pcp_path,
        .artifact_dir = artifacts,
        .slot_count = 1,
        .clock = o->clock,
        .log = job->log,
    };
    PCP_RETURN_IF_ERROR_BARE(pcp_workloads_compile_queue_create(
        &queue_options, pcp_allocator_system(), &own));
    queue = own;
  }
  pcp_workloads_compile_request_t* request = NULL;
  pcp_status_t status =
      pcp_workloads_compile_queue_submit(queue, &spec, &request);
  bool stopped = false;
  if (!status && job->waker) {
    // One wait on the hooks' waiter: the compile's end signals it (the
    // queue's notification) and so does a stop, which kills the child.
    compile_wait_t wait = {.hooks = &job->options->hooks};
    atomic_init(&wait.finished, false);
    pcp_workloads_compile_request_notify(request, compile_finished, &wait);
    if (!wait.hooks->wait(wait.hooks->user_data, compile_ready, &wait, true,
                          -1)) {
      stopped = true;
      pcp_workloads_compile_request_cancel(request);
    }
  }
  // Without a waiter the stop hook is polled (its contract), so the wait
  // is sliced; the compile's end wakes it at once, and a stop kills the
  // child (cancel).
  while (!status && !job->waker &&
         !pcp_workloads_compile_request_wait_for(request, WAIT_SLICE_MS)) {
    if (pcp_diloco_job_should_stop(job)) {
      stopped = true;
      pcp_workloads_compile_request_cancel(request);
    }
  }
  if (!status) {
    status = pcp_workloads_compile_request_wait(request);
  }
  if (stopped && pcp_status_code(status) == PCP_STATUS_CANCELLED) {
    pcp_status_ignore(status);
    status = pcp_make_status(PCP_STATUS_CANCELLED,
                             "training stopped while compiling");
  }
  void* bytes = NULL;
  size_t length = 0;
  if (!status) {
    status = pcp_file_read_all(pcp_workloads_compile_request_vmfb_path(request),
                               (size_t)1 << 30, &bytes, &length);
  }
  pcp_workloads_compile_request_release(request);
  pcp_workloads_compile_queue_destroy(own);
  PCP_RETURN_IF_ERROR_BARE(status);
  status = pcp_fabric_program_register(o->fabric, bytes, length, backend,
                                       target, out_hash);
  pcp_allocator_free(pcp_allocator_system(), bytes);
  return status;
}

pcp_status_t pcp_diloco_job_module_compile(
    job_t* job, const char* file_name, const char* text, size_t length,
    const char* backend, const char* target,
    uint8_t out_hash[PCP_SHA256_BYTE_LENGTH]) {
  char path[1200];
  int n = snprintf(path, sizeof(path), "%s/%s", job->dir, file_name);
  if (n < 0 || (size_t)n >= sizeof(path)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "module path %s/%s too long", job->dir, file_name);
  }
  pcp_sha256_t digest;
  pcp_sha256_compute(text, length, &digest);
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&digest, hex);
  PCP_RETURN_IF_ERROR_BARE(pcp_file_write_atomic(path, text, length));
  return pcp_diloco_job_child_compile(job, path, hex, NULL, 0, backend, target,
                                      out_hash);
}

static pcp_status_t program_build(job_t* job, program_t* program) {
  char model[1200];
  snprintf(model, sizeof(model), "%s/model.mlir", job->dir);
  PCP_RETURN_IF_ERROR_BARE(pcp_diloco_job_child_compile(
      job, model, job->model_hash, "diloco", job->config.tau, program->backend,
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
// Evaluation on the held-out batches
//===----------------------------------------------------------------------===//

bool pcp_diloco_job_eval_due(const job_t* job, uint64_t step, bool last) {
  return job->eval_enabled &&
         (last || (job->config.eval_every > 0 &&
                   step % (uint64_t)job->config.eval_every == 0));
}

// The forward program for (backend, target): the job's module compiled as
// it is (`pcp compile`, no --program), whose @main is the loss.
static pcp_status_t eval_program_get(job_t* job, const char* backend,
                                     const char* target,
                                     const uint8_t** out_hash) {
  for (uint32_t i = 0; i < job->eval_program_count; ++i) {
    eval_program_t* e = &job->eval_programs[i];
    if (!strcmp(e->backend, backend) && !strcmp(e->target, target)) {
      *out_hash = e->hash;
      return pcp_ok_status();
    }
  }
  if (job->eval_program_count >= MAX_PROGRAMS) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "more than %d worker kinds", MAX_PROGRAMS);
  }
  eval_program_t* e = &job->eval_programs[job->eval_program_count];
  memset(e, 0, sizeof(*e));
  snprintf(e->backend, sizeof(e->backend), "%s", backend);
  snprintf(e->target, sizeof(e->target), "%s", target);
  char model[1200];
  snprintf(model, sizeof(model), "%s/model.mlir", job->dir);
  PCP_RETURN_IF_ERROR_BARE(pcp_diloco_job_child_compile(
      job, model, job->model_hash, NULL, 0, backend, target, e->hash));
  ++job->eval_program_count;
  *out_hash = e->hash;
  return pcp_ok_status();
}

int64_t pcp_diloco_job_wait_timeout_ms(const job_t* job, int64_t floor_ms) {
  int64_t scaled = job->last_step_ns / 1000000 * WAIT_STEP_MULTIPLE;
  return scaled > floor_ms ? scaled : floor_ms;
}

pcp_status_t pcp_diloco_job_evaluate(job_t* job, const char* worker_id,
                                     const char* backend, const char* target) {
  if (!job->eval_enabled) {
    return pcp_ok_status();
  }
  const uint8_t* hash = NULL;
  PCP_RETURN_IF_ERROR_BARE(eval_program_get(job, backend, target, &hash));
  size_t n = job->table.count;
  size_t batches = (size_t)job->config.eval_batches;
  size_t per_batch = (size_t)(job->spec.batch * job->spec.block_size);
  size_t rows = batches * per_batch;
  bool wide = job->data_type == PCP_ELEMENT_TYPE_I64;
  size_t id_size = pcp_element_type_byte_size(job->data_type);
  if (job->param_type == PCP_ELEMENT_TYPE_BF16) {
    pcp_diloco_bf16_quantize(job->parameters, job->parameter_count,
                             job->wire_parameters);
  }
  pcp_proto_section_t* inputs =
      pcp_diloco_job_calloc(job, n + 2, sizeof(*inputs));
  pcp_fabric_task_t** tasks =
      pcp_diloco_job_calloc(job, batches, sizeof(*tasks));
  if (!inputs || !tasks) {
    pcp_diloco_job_free(job, inputs);
    pcp_diloco_job_free(job, tasks);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "eval tasks");
  }
  for (size_t i = 0; i < n; ++i) {
    pcp_diloco_job_master_section(job, i, &inputs[i]);
  }
  int64_t start = pcp_clock_now_ns(job->options->clock);
  char error[256] = "";
  for (size_t k = 0; k < batches; ++k) {
    for (int j = 0; j < 2; ++j) {
      size_t offset = (size_t)j * rows + k * per_batch;
      inputs[n + (size_t)j] = (pcp_proto_section_t){
          .name = j ? "targets" : "input_ids",
          .element_type = job->data_type,
          .rank = 2,
          .shape = {job->spec.batch, job->spec.block_size},
          .byte_length = per_batch * id_size,
          .data = wide ? (const void*)(job->eval_tokens64 + offset)
                       : (const void*)(job->eval_tokens + offset)};
    }
    pcp_fabric_task_params_t params;
    memset(&params, 0, sizeof(params));
    memcpy(params.program, hash, sizeof(params.program));
    params.function = "main";
    params.inputs = inputs;
    params.input_count = (uint32_t)(n + 2);
    params.worker_id = worker_id;
    params.max_attempts = 1;
    pcp_status_t status = pcp_diloco_job_task_submit(job, &params, &tasks[k]);
    if (status) {
      snprintf(error, sizeof(error), "%s", pcp_status_message(status));
      pcp_status_ignore(status);
      tasks[k] = NULL;
      break;
    }
  }
  // Every task borrows |inputs|' data: wait for all, cancelling on stop
  // or past the deadline (then the evaluation fails below, logged).
  bool stopped = pcp_diloco_job_tasks_wait(
      job, tasks, batches,
      pcp_diloco_job_wait_timeout_ms(job, SHORT_WAIT_MIN_MS), "evaluation");
  double sum = 0;
  size_t done = 0;
  for (size_t k = 0; k < batches; ++k) {
    if (!tasks[k]) {
      continue;
    }
    pcp_status_t task_status = pcp_fabric_task_status(tasks[k]);
    const pcp_proto_section_t* outputs = NULL;
    size_t count = 0;
    if (task_status) {
      snprintf(error, sizeof(error), "%s", pcp_status_message(task_status));
    } else {
      pcp_status_t status = pcp_fabric_task_outputs(tasks[k], &outputs, &count);
      if (!status && count == 1 && outputs[0].byte_length == sizeof(float)) {
        sum += *(const float*)outputs[0].data;
        ++done;
      } else {
        snprintf(error, sizeof(error), "@main returned %zu outputs", count);
      }
      pcp_status_ignore(status);
    }
    pcp_fabric_task_release(tasks[k]);
  }
  pcp_diloco_job_free(job, tasks);
  pcp_diloco_job_free(job, inputs);
  if (stopped) {
    return pcp_make_status(PCP_STATUS_CANCELLED,
                           "training stopped while evaluating");
  }
  if (done != batches) {
    PCP_LOG(PCP_LOG_WARN, &job->log,
            "evaluation on %s failed (%zu of %zu batches): %s", worker_id, done,
            batches, error);
    return pcp_ok_status();
  }
  job->last_val_loss = sum / (double)batches;
  job->val_loss_step = job->outer_step;
  PCP_LOG(PCP_LOG_INFO, &job->log,
          "val_loss=%.4f outer_step=%" PRIu64
          " batches=%zu worker=%s seconds=%.2f",
          job->last_val_loss, job->outer_step, batches, worker_id,
          (double)(pcp_clock_now_ns(job->options->clock) - start) / 1e9);
  if (job->options->metrics && job->options->metrics->val_loss) {
    const char* job_label[] = {job->options->job_id};
    pcp_obs_family_set(job->options->metrics->val_loss, job_label,
                       job->last_val_loss);
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// One outer step
//===----------------------------------------------------------------------===//

typedef struct round_task_t {
  char worker_id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  program_t* program;
  // inner_state keep: the worker's slot, whether its moments start fresh
  // this round, and the step number sent (the data of a section).
  inner_slot_t* slot;
  uint32_t lost_joins;
  bool fresh;
  float step_value;
  int32_t* tokens;    // ids then targets, tau*B*T each
  int64_t* tokens64;  // the same widened, for a module taking i64 ids
  pcp_fabric_task_t* task;
} round_task_t;

typedef struct round_t {
  round_task_t tasks[MAX_ROUND_WORKERS];
  uint32_t count;
  pcp_proto_section_t* sections;  // shared parameter sections + per-task
  float* lr;  // tau rates, the schedule at this round's inner steps
  // The gateway's SHA-256 of the parameters every task carries (the global
  // parameters after outer step |outer_step|), each worker's to match.
  uint8_t param_sha256[PCP_SHA256_BYTE_LENGTH];
} round_t;

static int compare_ids(const void* a, const void* b) {
  return strcmp(((const round_task_t*)a)->worker_id,
                ((const round_task_t*)b)->worker_id);
}

// Connected workers with a program, sorted by id; programs for new
// (backend, target) kinds are compiled first (the kind joins this round).
static pcp_status_t round_workers(job_t* job, round_t* round) {
  pcp_fabric_worker_info_t* infos =
      pcp_diloco_job_calloc(job, MAX_ROUND_WORKERS * 4, sizeof(*infos));
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
        round->count >= MAX_ROUND_WORKERS ||
        (job->config.worker_class &&
         strcmp(w->worker_class, job->config.worker_class) != 0)) {
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
    t->lost_joins = w->join_count - w->resumed_count;
  }
  pcp_diloco_job_free(job, infos);
  qsort(round->tasks, round->count, sizeof(round->tasks[0]), compare_ids);
  return status;
}

static void round_release(job_t* job, round_t* round) {
  for (uint32_t i = 0; i < round->count; ++i) {
    pcp_fabric_task_release(round->tasks[i].task);
    pcp_diloco_job_free(job, round->tasks[i].tokens);
    pcp_diloco_job_free(job, round->tasks[i].tokens64);
  }
  pcp_diloco_job_free(job, round->sections);
  pcp_diloco_job_free(job, round->lr);
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
  pcp_data_assignment_t* plan = pcp_diloco_job_calloc(job, w, sizeof(*plan));
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
    task->tokens =
        pcp_diloco_job_malloc(job, 2 * tau * per_step * sizeof(int32_t));
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
      task->tokens64 = pcp_diloco_job_malloc(job, count * sizeof(int64_t));
      if (!task->tokens64) {
        status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "batches");
        break;
      }
      for (size_t i = 0; i < count; ++i) {
        task->tokens64[i] = task->tokens[i];
      }
    }
  }
  pcp_diloco_job_free(job, plan);
  return status;
}

// Tensor |i| of the masters as it goes down to the workers: f32, or the
// bf16 rounding (to nearest even) in wire_parameters for a bf16 model,
// which the caller refreshed after the last master update.
void pcp_diloco_job_master_section(job_t* job, size_t i,
                                   pcp_proto_section_t* s) {
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
                ? (const void*)(job->wire_parameters +
                                pcp_diloco_job_tensor_offset(job, i))
                : (const void*)(job->parameters +
                                pcp_diloco_job_tensor_offset(job, i));
}

//===----------------------------------------------------------------------===//
// Inner AdamW state kept on the workers (inner_state keep)
//===----------------------------------------------------------------------===//
//
// Each worker's m<i>/v<i> live in a fabric session on it between rounds,
// the streaming loop's mechanism (keep_resident outputs, RESIDENT refs in):
// the round takes them as refs and keeps its new moments under the same
// names. A worker that joins, or returns (a join that did not resume its
// lease drops its sessions), or whose round failed, gets a new session
// whose moments are uploaded first: zeros and step 1 (counted in the step
// event's fresh_inner_state), or after a resume the checkpoint's.

static inner_slot_t* inner_slot_get(job_t* job, const char* worker_id) {
  for (uint32_t i = 0; i < job->inner_count; ++i) {
    if (!strcmp(job->inner[i].worker_id, worker_id)) {
      return &job->inner[i];
    }
  }
  if (job->inner_count >= sizeof(job->inner) / sizeof(job->inner[0])) {
    // Slots of workers long gone are reused (oldest report first).
    uint32_t oldest = 0;
    for (uint32_t i = 1; i < job->inner_count; ++i) {
      if (job->inner[i].reported_step < job->inner[oldest].reported_step) {
        oldest = i;
      }
    }
    memset(&job->inner[oldest], 0, sizeof(job->inner[oldest]));
    snprintf(job->inner[oldest].worker_id, sizeof(job->inner[oldest].worker_id),
             "%s", worker_id);
    return &job->inner[oldest];
  }
  inner_slot_t* slot = &job->inner[job->inner_count++];
  memset(slot, 0, sizeof(*slot));
  snprintf(slot->worker_id, sizeof(slot->worker_id), "%s", worker_id);
  return slot;
}

static const char* moment_function(const job_t* job) {
  return job->param_type == PCP_ELEMENT_TYPE_BF16 ? "copy_moments" : "copy";
}

// Section |i| of a moment vector |data| (f32, the parameter's shape).
static void moment_section(const job_t* job, size_t i, const char* name,
                           const float* data, pcp_proto_section_t* s) {
  const pcp_models_parameter_t* p = &job->table.parameters[i];
  memset(s, 0, sizeof(*s));
  s->name = name;
  s->element_type = PCP_ELEMENT_TYPE_F32;
  s->rank = (uint32_t)p->rank;
  for (int32_t d = 0; d < p->rank; ++d) {
    s->shape[d] = p->dims[d];
  }
  s->byte_length = (uint64_t)p->element_count * sizeof(float);
  s->data = data + pcp_diloco_job_tensor_offset(job, i);
}

// The resident name of moment |kind| ('m' or 'v') of tensor |i|.
static void moment_name(char kind, size_t i, char* out, size_t capacity) {
  snprintf(out, capacity, "%c%zu", kind, i);
}

static pcp_status_t state_program_ready(job_t* job, program_t* program) {
  if (!program->state_ready) {
    PCP_RETURN_IF_ERROR_BARE(pcp_diloco_state_program_build(
        job, program->backend, program->target, program->state_hash));
    program->state_ready = true;
  }
  return pcp_ok_status();
}

// Moves the moments of the workers |tasks| between the gateway and their
// sessions with @copy: |upload| sends vectors[k] (m then v, each
// parameter_count f32) and keeps them resident; otherwise reads the
// resident ones into vectors[k]. One task per worker and kind (n tensors,
// within the frame's section limit). A worker whose copy fails gets
// *failed[k] = true. CANCELLED on stop.
static pcp_status_t moments_copy(job_t* job, round_task_t** tasks,
                                 uint32_t count, bool upload,
                                 float* const* vectors, bool* failed) {
  size_t n = job->table.count;
  size_t N = job->parameter_count;
  char(*names)[24] = pcp_diloco_job_calloc(job, 2 * n + 1, sizeof(*names));
  pcp_proto_section_t* sections =
      pcp_diloco_job_calloc(job, n + 1, sizeof(*sections));
  pcp_proto_tensor_ref_t* refs =
      pcp_diloco_job_calloc(job, n + 1, sizeof(*refs));
  pcp_proto_keep_resident_t* keep =
      pcp_diloco_job_calloc(job, n + 1, sizeof(*keep));
  pcp_fabric_task_t** handles =
      pcp_diloco_job_calloc(job, 2 * (size_t)count + 1, sizeof(*handles));
  if (!names || !sections || !refs || !keep || !handles) {
    pcp_diloco_job_free(job, names), pcp_diloco_job_free(job, sections),
        pcp_diloco_job_free(job, refs), pcp_diloco_job_free(job, keep),
        pcp_diloco_job_free(job, handles);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "moment copies");
  }
  for (size_t i = 0; i < n; ++i) {
    moment_name('m', i, names[i], sizeof(names[i]));
    moment_name('v', i, names[n + i], sizeof(names[n + i]));
  }
  pcp_status_t status = pcp_ok_status();
  for (uint32_t k = 0; k < count && !status; ++k) {
    round_task_t* t = tasks[k];
    failed[k] = false;
    status = state_program_ready(job, t->program);
    for (int g = 0; g < 2 && !status; ++g) {
      for (size_t i = 0; i < n; ++i) {
        const char* name = names[(size_t)g * n + i];
        if (upload) {
          moment_section(job, i, name, vectors[k] + (size_t)g * N,
                         &sections[i]);
          keep[i] =
              (pcp_proto_keep_resident_t){.output = (uint32_t)i, .as = name};
        } else {
          refs[i] = (pcp_proto_tensor_ref_t){
              .kind = PCP_PROTO_TENSOR_REF_RESIDENT, .name = name};
        }
      }
      pcp_fabric_task_params_t params;
      memset(&params, 0, sizeof(params));
      memcpy(params.program, t->program->state_hash, sizeof(params.program));
      params.function = moment_function(job);
      params.inputs = upload ? sections : NULL;
      params.input_count = upload ? (uint32_t)n : 0;
      params.input_refs = upload ? NULL : refs;
      params.input_ref_count = upload ? 0 : (uint32_t)n;
      params.keep_resident = upload ? keep : NULL;
      params.keep_resident_count = upload ? (uint32_t)n : 0;
      params.worker_id = t->worker_id;
      params.session_id = t->slot->session;
      params.max_attempts = 1;
      pcp_status_t submitted = pcp_diloco_job_task_submit(
          job, &params, &handles[2 * k + (uint32_t)g]);
      if (submitted) {
        PCP_LOG(PCP_LOG_WARN, &job->log, "moment copy for %s: %s", t->worker_id,
                pcp_status_message(submitted));
        pcp_status_ignore(submitted);
        handles[2 * k + (uint32_t)g] = NULL;
        failed[k] = true;
      }
    }
  }
  bool stopped = pcp_diloco_job_tasks_wait(
      job, handles, 2 * (size_t)count,
      pcp_diloco_job_wait_timeout_ms(job, SHORT_WAIT_MIN_MS), "moment copy");
  for (uint32_t k = 0; k < count; ++k) {
    for (uint32_t g = 0; g < 2; ++g) {
      pcp_fabric_task_t* h = handles[2 * k + g];
      if (!h) {
        continue;
      }
      pcp_status_t task_status = pcp_fabric_task_status(h);
      if (task_status) {
        PCP_LOG(PCP_LOG_WARN, &job->log, "moment copy on %s failed: %s",
                tasks[k]->worker_id, pcp_status_message(task_status));
        failed[k] = true;
        continue;
      }
      if (upload) {
        continue;
      }
      const pcp_proto_section_t* outputs = NULL;
      size_t out_count = 0;
      pcp_status_t read = pcp_fabric_task_outputs(h, &outputs, &out_count);
      for (size_t i = 0; !read && i < n; ++i) {
        size_t bytes =
            (size_t)job->table.parameters[i].element_count * sizeof(float);
        if (out_count != n || outputs[i].byte_length != bytes) {
          read = pcp_make_status(PCP_STATUS_INTERNAL,
                                 "@copy returned %zu tensors or a wrong size",
                                 out_count);
          break;
        }
        memcpy(vectors[k] + g * N + pcp_diloco_job_tensor_offset(job, i),
               outputs[i].data, bytes);
      }
      if (read) {
        PCP_LOG(PCP_LOG_WARN, &job->log, "moment copy from %s: %s",
                tasks[k]->worker_id, pcp_status_message(read));
        pcp_status_ignore(read);
        failed[k] = true;
      }
    }
  }
  for (uint32_t h = 0; h < 2 * count; ++h) {
    pcp_fabric_task_release(handles[h]);
  }
  pcp_diloco_job_free(job, names), pcp_diloco_job_free(job, sections),
      pcp_diloco_job_free(job, refs), pcp_diloco_job_free(job, keep),
      pcp_diloco_job_free(job, handles);
  if (!status && stopped) {
    status = pcp_make_status(PCP_STATUS_CANCELLED,
                             "training stopped while moving inner state");
  }
  return status;
}

// Before a keep round: binds every task to its slot; workers without live
// state get a new session with fresh moments (zeros, step 1), or the
// resumed checkpoint's (the k-th saved worker's state for the k-th worker
// by id). A worker whose upload fails sits the round out (task NULL is
// what round_submit skips: it is marked by |slot| NULL).
static pcp_status_t round_inner_prepare(job_t* job, round_t* round) {
  if (!keeps_state(job)) {
    return pcp_ok_status();
  }
  size_t N = job->parameter_count;
  round_task_t* uploads[MAX_ROUND_WORKERS];
  float* vectors[MAX_ROUND_WORKERS];
  bool failed[MAX_ROUND_WORKERS];
  uint32_t count = 0;
  float* zeros = NULL;
  for (uint32_t k = 0; k < round->count; ++k) {
    round_task_t* t = &round->tasks[k];
    inner_slot_t* slot = inner_slot_get(job, t->worker_id);
    t->slot = slot;
    slot->program = t->program;
    if (slot->live && slot->lost_joins == t->lost_joins) {
      continue;
    }
    snprintf(slot->session, sizeof(slot->session),
             "%s-inner-%" PRIu64 "-%" PRIx64, job->options->job_id,
             ++job->inner_generation, job->inner_nonce);
    slot->lost_joins = t->lost_joins;
    slot->live = false;
    if (k < job->inner_resume_count) {
      vectors[count] = job->inner_resume + (size_t)k * 2 * N;
      slot->step = job->inner_resume_steps[k];
    } else {
      if (!zeros) {
        zeros = pcp_diloco_job_calloc(job, 2 * N + 1, sizeof(float));
        if (!zeros) {
          return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "moments");
        }
      }
      vectors[count] = zeros;
      slot->step = 1;
      t->fresh = true;
    }
    uploads[count++] = t;
  }
  pcp_status_t status = pcp_ok_status();
  if (count) {
    status = moments_copy(job, uploads, count, true, vectors, failed);
    for (uint32_t k = 0; k < count && !status; ++k) {
      uploads[k]->slot->live = !failed[k];
      if (failed[k]) {
        uploads[k]->slot = NULL;  // sits this round out
      }
    }
  }
  // The resumed state is handed out once (to the first round's workers).
  pcp_allocator_free(pcp_allocator_system(), job->inner_resume);
  pcp_diloco_job_free(job, job->inner_resume_steps);
  job->inner_resume = NULL;
  job->inner_resume_steps = NULL;
  job->inner_resume_count = 0;
  pcp_diloco_job_free(job, zeros);
  return status;
}

static pcp_status_t round_submit(job_t* job, round_t* round) {
  size_t n = job->table.count;
  bool keep = keeps_state(job);
  // Sections: n parameters (shared), then per task [step +] lr + ids +
  // targets.
  size_t per_task = keep ? 4 : 3;
  round->sections =
      pcp_diloco_job_calloc(job, n + per_task * (size_t)round->count + 1,
                            sizeof(pcp_proto_section_t));
  if (!round->sections) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "sections");
  }
  // One rate per fused inner step: step i of outer step s is the job's
  // inner step s * tau + i (the same on every worker).
  size_t steps = (size_t)job->config.tau;
  round->lr = pcp_diloco_job_calloc(job, steps, sizeof(float));
  if (!round->lr) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "rates");
  }
  pcp_diloco_lr_schedule_fill(&job->schedule, job->outer_step * steps, steps,
                              round->lr);
  bool bf16 = job->param_type == PCP_ELEMENT_TYPE_BF16;
  if (bf16) {
    pcp_diloco_bf16_quantize(job->parameters, job->parameter_count,
                             job->wire_parameters);
  }
  for (size_t i = 0; i < n; ++i) {
    pcp_diloco_job_master_section(job, i, &round->sections[i]);
  }
  pcp_diloco_param_hash(round->sections, n, round->param_sha256);
  size_t tau = batches_per_round(job);
  size_t per_step = (size_t)(job->spec.batch * job->spec.block_size);
  char(*names)[24] =
      keep ? pcp_diloco_job_calloc(job, 2 * n + 1, sizeof(*names)) : NULL;
  pcp_proto_tensor_ref_t* refs =
      keep ? pcp_diloco_job_calloc(job, 3 * n + per_task, sizeof(*refs)) : NULL;
  pcp_proto_keep_resident_t* kept =
      keep ? pcp_diloco_job_calloc(job, 2 * n + 1, sizeof(*kept)) : NULL;
  if (keep && (!names || !refs || !kept)) {
    pcp_diloco_job_free(job, names), pcp_diloco_job_free(job, refs),
        pcp_diloco_job_free(job, kept);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "task refs");
  }
  for (size_t i = 0; keep && i < n; ++i) {
    moment_name('m', i, names[i], sizeof(names[i]));
    moment_name('v', i, names[n + i], sizeof(names[n + i]));
    kept[i] = (pcp_proto_keep_resident_t){.output = (uint32_t)(n + i),
                                          .as = names[i]};
    kept[n + i] = (pcp_proto_keep_resident_t){.output = (uint32_t)(2 * n + i),
                                              .as = names[n + i]};
  }
  for (uint32_t k = 0; k < round->count; ++k) {
    round_task_t* t = &round->tasks[k];
    if (keep && !t->slot) {
      continue;  // its state could not be set up: not in this round
    }
    pcp_proto_section_t* all = &round->sections[n + per_task * (size_t)k];
    pcp_proto_section_t* extra = keep ? all + 1 : all;
    if (keep) {
      t->step_value = (float)t->slot->step;
      all[0] = (pcp_proto_section_t){.name = "step",
                                     .element_type = PCP_ELEMENT_TYPE_F32,
                                     .byte_length = sizeof(float),
                                     .data = &t->step_value};
    }
    extra[0] = (pcp_proto_section_t){.name = "lr",
                                     .element_type = PCP_ELEMENT_TYPE_F32,
                                     .rank = 1,
                                     .shape = {(int64_t)steps},
                                     .byte_length = steps * sizeof(float),
                                     .data = round->lr};
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
    // Argument order: parameters, [m, v, step,] lr, ids, targets.
    pcp_proto_section_t* inputs =
        pcp_diloco_job_calloc(job, n + per_task, sizeof(*inputs));
    if (!inputs) {
      pcp_diloco_job_free(job, names), pcp_diloco_job_free(job, refs),
          pcp_diloco_job_free(job, kept);
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "task inputs");
    }
    // The task params copy the section array (struct array copied, data
    // borrowed), so the data of every task still points at the one
    // parameter buffer.
    memcpy(inputs, round->sections, n * sizeof(*inputs));
    memcpy(inputs + n, all, per_task * sizeof(*inputs));
    pcp_fabric_task_params_t params;
    memset(&params, 0, sizeof(params));
    memcpy(params.program, t->program->hash, sizeof(params.program));
    params.function = "diloco_round";
    params.inputs = inputs;
    params.input_count = (uint32_t)(n + per_task);
    params.worker_id = t->worker_id;
    params.max_attempts = 1;
    // The worker returns its SHA-256 of the parameters it received (the
    // global parameters): bit-identity checked with no extra round trip.
    params.hash_inputs = (uint32_t)n;
    if (keep) {
      // params (sections 0..n-1), m and v (resident), then the sections
      // step, lr, ids, targets; the new m and v stay resident.
      for (size_t i = 0; i < n; ++i) {
        refs[i] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_SECTION,
                                           .section = (uint32_t)i};
        refs[n + i] = (pcp_proto_tensor_ref_t){
            .kind = PCP_PROTO_TENSOR_REF_RESIDENT, .name = names[i]};
        refs[2 * n + i] = (pcp_proto_tensor_ref_t){
            .kind = PCP_PROTO_TENSOR_REF_RESIDENT, .name = names[n + i]};
      }
      for (size_t j = 0; j < per_task; ++j) {
        refs[3 * n + j] = (pcp_proto_tensor_ref_t){
            .kind = PCP_PROTO_TENSOR_REF_SECTION, .section = (uint32_t)(n + j)};
      }
      params.input_refs = refs;
      params.input_ref_count = (uint32_t)(3 * n + per_task);
      params.keep_resident = kept;
      params.keep_resident_count = (uint32_t)(2 * n);
      params.session_id = t->slot->session;
    }
    pcp_status_t status = pcp_diloco_job_task_submit(job, &params, &t->task);
    pcp_diloco_job_free(job, inputs);
    if (status) {
      // A worker gone between the list and the submit: not in this round.
      PCP_LOG(PCP_LOG_WARN, &job->log, "round task for %s not submitted: %s",
              t->worker_id, pcp_status_message(status));
      pcp_status_ignore(status);
      t->task = NULL;
      if (t->slot) {
        t->slot->live = false;
      }
    }
  }
  pcp_diloco_job_free(job, names), pcp_diloco_job_free(job, refs),
      pcp_diloco_job_free(job, kept);
  return pcp_ok_status();
}

// Waits for every task; on stop cancels them and waits for them still (they
// borrow the round's buffers). Returns true when stopped.
static bool round_wait(job_t* job, round_t* round) {
  pcp_fabric_task_t* tasks[MAX_ROUND_WORKERS];
  for (uint32_t k = 0; k < round->count; ++k) {
    tasks[k] = round->tasks[k].task;
  }
  char what[64];
  snprintf(what, sizeof(what), "round of outer_step=%" PRIu64,
           job->outer_step + 1);
  return pcp_diloco_job_tasks_wait(
      job, tasks, round->count,
      pcp_diloco_job_wait_timeout_ms(job, ROUND_WAIT_MIN_MS), what);
}

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
  // Goodput: a submitted task counts what it was assigned (a round is one
  // task, answered at its end: how far a lost one got is not known), an
  // averaged one counts as merged too.
  uint64_t task_tokens = (uint64_t)batches_per_round(job) *
                         (uint64_t)job->spec.batch *
                         (uint64_t)job->spec.block_size;
  for (uint32_t k = 0; k < round->count; ++k) {
    round_task_t* t = &round->tasks[k];
    if (!t->task) {
      continue;
    }
    out->tokens_computed += task_tokens;
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
    // Outputs: deltas, [m, v (resident), step,] losses, the worker's
    // SHA-256 of the parameters it received.
    bool keep = keeps_state(job);
    size_t want_count = keep ? 3 * n + 3 : n + 2;
    size_t losses_at = want_count - 2;
    size_t hash_at = want_count - 1;
    if (!task_status && !status && count != want_count) {
      status = pcp_make_status(PCP_STATUS_INTERNAL,
                               "worker %s returned %zu outputs, expected %zu",
                               t->worker_id, count, want_count);
    }
    if (!task_status && !status && keep &&
        outputs[3 * n].byte_length != sizeof(float)) {
      status = pcp_make_status(PCP_STATUS_INTERNAL,
                               "worker %s: step of %" PRIu64 " bytes",
                               t->worker_id, outputs[3 * n].byte_length);
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
        outputs[losses_at].byte_length != tau * sizeof(float)) {
      status = pcp_make_status(PCP_STATUS_INTERNAL,
                               "worker %s: losses of %" PRIu64 " bytes",
                               t->worker_id, outputs[losses_at].byte_length);
    }
    if (!task_status && !status &&
        outputs[hash_at].byte_length != PCP_SHA256_BYTE_LENGTH) {
      status = pcp_make_status(PCP_STATUS_INTERNAL,
                               "worker %s: parameter hash of %" PRIu64 " bytes",
                               t->worker_id, outputs[hash_at].byte_length);
    }
    bool hash_match = true;
    if (!task_status && !status) {
      // A failure (on_param_mismatch fail) fails the job.
      PCP_RETURN_IF_ERROR_BARE(pcp_diloco_param_hash_check(
          job, t->worker_id, job->outer_step, round->param_sha256,
          outputs[hash_at].data, &hash_match));
    }
    if (!hash_match) {
      // resync: its delta was computed from a copy that is not the global
      // parameters, so it stays out of the average; its resident state is
      // dropped too (fresh next round), and its next task carries the
      // gateway's copy again as every round's does.
      if (t->slot) {
        t->slot->live = false;
      }
      snprintf(out->last_error, sizeof(out->last_error),
               "worker %s: parameter hash mismatch", t->worker_id);
      ++out->param_mismatches;
      continue;
    }
    if ((status || task_status) && t->slot) {
      // Its resident state is not known to be the round's: fresh next time.
      t->slot->live = false;
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
    if (keep && t->slot) {
      float next = *(const float*)outputs[3 * n].data;
      t->slot->step = (uint64_t)next;
      t->slot->reported_step = job->outer_step + 1;
      out->fresh_inner_state += t->fresh;
    }
    // Sections are 64-byte aligned in the received frame.
    const float* losses = outputs[losses_at].data;
    double sum = 0;
    for (size_t s = 0; s < tau; ++s) {
      sum += losses[s];
    }
    out->loss_last += losses[tau - 1];
    out->loss_mean += sum / (double)tau;
    out->token_bytes += 2 * batches_per_round(job) * (size_t)job->spec.batch *
                        (size_t)job->spec.block_size *
                        pcp_element_type_byte_size(job->data_type);
    out->tokens_merged += task_tokens;
    ++out->reporters;
  }
  if (out->reporters) {
    out->loss_last /= out->reporters;
    out->loss_mean /= out->reporters;
  }
  return pcp_ok_status();
}

json_t* pcp_diloco_job_progress_json(const job_t* job,
                                     const round_outcome_t* outcome,
                                     double seconds, double tokens_per_second) {
  json_t* progress = json_pack(
      "{s:I, s:I, s:o, s:o, s:f, s:I, s:I, s:I, s:I, s:f, s:I, s:s}",
      "outer_step", (json_int_t)job->outer_step, "outer_loop_steps",
      (json_int_t)job->config.outer_loop_steps, "loss",
      pcp_diloco_json_number_or_null(job->last_loss), "loss_mean",
      pcp_diloco_json_number_or_null(job->last_loss_mean), "tokens_per_second",
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
    // The rate of the last inner step run, and the last evaluation (null
    // before the first; val_loss_step says which outer step it measured).
    json_object_set_new(progress, "lr", json_real(job->last_lr));
    json_object_set_new(progress, "val_loss",
                        pcp_diloco_json_number_or_null(job->last_val_loss));
    json_object_set_new(progress, "val_loss_step",
                        isfinite(job->last_val_loss)
                            ? json_integer((json_int_t)job->val_loss_step)
                            : json_null());
  }
  return progress;
}

void pcp_diloco_job_progress_report(job_t* job, json_t* progress) {
  const pcp_diloco_job_hooks_t* hooks = &job->options->hooks;
  if (progress && hooks->progress) {
    hooks->progress(hooks->user_data, progress);
  }
}

static void bytes_snapshot(job_t* job, pcp_diloco_bytes_meter_t* m) {
  memset(m, 0, sizeof(*m));
  pcp_fabric_endpoint_stats_t stats;
  pcp_fabric_endpoint_stats_query(job->options->fabric, &stats);
  m->gateway_in = stats.bytes_in;
  m->gateway_out = stats.bytes_out;
  pcp_fabric_worker_info_t* infos =
      pcp_diloco_job_calloc(job, BYTES_METER_WORKERS, sizeof(*infos));
  if (!infos) {
    return;  // no per-worker figures this step (the gateway's stay)
  }
  uint32_t count = pcp_fabric_worker_list(job->options->fabric, infos,
                                          BYTES_METER_WORKERS, NULL);
  for (uint32_t i = 0; i < count; ++i) {
    snprintf(m->workers[i].worker_id, sizeof(m->workers[i].worker_id), "%s",
             infos[i].worker_id);
    m->workers[i].in = infos[i].bytes_in;
    m->workers[i].out = infos[i].bytes_out;
  }
  m->count = count;
  pcp_diloco_job_free(job, infos);
}

void pcp_diloco_job_bytes_mark(job_t* job) {
  bytes_snapshot(job, &job->bytes_start);
}

void pcp_diloco_job_bytes_stop(job_t* job) {
  bytes_snapshot(job, &job->bytes_end);
}

json_t* pcp_diloco_job_bytes_json(job_t* job) {
  const pcp_diloco_bytes_meter_t* now = &job->bytes_end;
  const pcp_diloco_bytes_meter_t* start = &job->bytes_start;
  json_t* per_worker = json_object();
  uint64_t sum_in = 0;
  uint64_t sum_out = 0;
  uint32_t counted = 0;
  // Workers in both snapshots (one that joined during the step is
  // measured from the next); the counters only grow per worker id.
  for (uint32_t i = 0; per_worker && i < now->count; ++i) {
    for (uint32_t j = 0; j < start->count; ++j) {
      if (strcmp(now->workers[i].worker_id, start->workers[j].worker_id)) {
        continue;
      }
      uint64_t in = now->workers[i].in - start->workers[j].in;
      uint64_t out = now->workers[i].out - start->workers[j].out;
      if (in || out) {
        json_object_set_new(per_worker, now->workers[i].worker_id,
                            json_pack("{s:I, s:I}", "in", (json_int_t)in, "out",
                                      (json_int_t)out));
        sum_in += in;
        sum_out += out;
        ++counted;
      }
      break;
    }
  }
  uint64_t gateway_in = now->gateway_in - start->gateway_in;
  uint64_t gateway_out = now->gateway_out - start->gateway_out;
  job->measured_gateway_in += gateway_in;
  job->measured_gateway_out += gateway_out;
  job->measured_workers_in += sum_in;
  job->measured_workers_out += sum_out;
  if (!per_worker) {
    return NULL;
  }
  return json_pack("{s:o, s:I, s:I, s:{s:f, s:f}}", "per_worker", per_worker,
                   "gateway_in", (json_int_t)gateway_in, "gateway_out",
                   (json_int_t)gateway_out, "per_worker_mean", "in",
                   counted ? (double)sum_in / counted : 0.0, "out",
                   counted ? (double)sum_out / counted : 0.0);
}

json_t* pcp_diloco_job_bytes_total_json(const job_t* job) {
  return json_pack("{s:I, s:I, s:I, s:I}", "gateway_in",
                   (json_int_t)job->measured_gateway_in, "gateway_out",
                   (json_int_t)job->measured_gateway_out, "workers_in",
                   (json_int_t)job->measured_workers_in, "workers_out",
                   (json_int_t)job->measured_workers_out);
}

void pcp_diloco_job_goodput_json(const job_t* job, json_t* progress) {
  if (!progress) {
    return;
  }
  json_object_set_new(progress, "tokens_computed",
                      json_integer((json_int_t)job->tokens_computed));
  json_object_set_new(progress, "tokens_merged",
                      json_integer((json_int_t)llround(job->tokens_merged)));
  json_object_set_new(
      progress, "goodput",
      json_real(job->tokens_computed
                    ? job->tokens_merged / (double)job->tokens_computed
                    : 0.0));
}

void pcp_diloco_param_hash(const pcp_proto_section_t* sections, size_t count,
                           uint8_t out[PCP_SHA256_BYTE_LENGTH]) {
  pcp_sha256_stream_t* stream = NULL;
  pcp_status_t status = pcp_sha256_stream_create(&stream);
  if (status) {
    // Cannot happen short of memory: an all-zero hash then fails every
    // comparison loudly rather than passing one.
    pcp_status_ignore(status);
    memset(out, 0, PCP_SHA256_BYTE_LENGTH);
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    pcp_sha256_stream_update(stream, sections[i].data,
                             (size_t)sections[i].byte_length);
  }
  pcp_sha256_t digest;
  pcp_sha256_stream_finish(stream, &digest);
  memcpy(out, digest.bytes, PCP_SHA256_BYTE_LENGTH);
}

pcp_status_t pcp_diloco_param_hash_check(
    job_t* job, const char* worker_id, uint64_t step,
    const uint8_t want[PCP_SHA256_BYTE_LENGTH],
    const uint8_t got[PCP_SHA256_BYTE_LENGTH], bool* out_match) {
  return pcp_diloco_param_hash_check_against(job, worker_id, step, NULL, want,
                                             got, out_match);
}

pcp_status_t pcp_diloco_param_hash_check_against(
    job_t* job, const char* worker_id, uint64_t step,
    const char* reference_worker, const uint8_t want[PCP_SHA256_BYTE_LENGTH],
    const uint8_t got[PCP_SHA256_BYTE_LENGTH], bool* out_match) {
  pcp_sha256_t w;
  pcp_sha256_t g;
  memcpy(w.bytes, want, PCP_SHA256_BYTE_LENGTH);
  memcpy(g.bytes, got, PCP_SHA256_BYTE_LENGTH);
  char want_hex[PCP_SHA256_HEX_LENGTH + 1];
  char got_hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&w, want_hex);
  pcp_sha256_to_hex(&g, got_hex);
  *out_match = memcmp(want, got, PCP_SHA256_BYTE_LENGTH) == 0;
  if (*out_match) {
    job->param_hash_verified = true;
    job->param_hash_step = step;
    memcpy(job->param_hash_hex, want_hex, sizeof(want_hex));
    return pcp_ok_status();
  }
  const pcp_diloco_job_options_t* o = job->options;
  ++job->param_hash_mismatches;
  bool fail =
      job->config.on_param_mismatch == PCP_DILOCO_ON_PARAM_MISMATCH_FAIL;
  // Against a worker (ddp) "resync" drops the mismatching worker: nothing
  // is sent again, so the words say so.
  const char* policy = fail ? "fail" : reference_worker ? "drop" : "resync";
  if (reference_worker) {
    PCP_LOG(PCP_LOG_WARN, &job->log,
            "parameter hash mismatch step=%" PRIu64
            " worker=%s worker_sha256=%s reference_worker=%s "
            "reference_sha256=%s policy=%s",
            step, worker_id, got_hex, reference_worker, want_hex, policy);
  } else {
    PCP_LOG(PCP_LOG_WARN, &job->log,
            "parameter hash mismatch step=%" PRIu64
            " worker=%s worker_sha256=%s gateway_sha256=%s policy=%s",
            step, worker_id, got_hex, want_hex, policy);
  }
  if (o->metrics && o->metrics->param_hash_mismatches) {
    const char* job_label[] = {o->job_id};
    pcp_obs_family_add(o->metrics->param_hash_mismatches, job_label, 1);
  }
  json_t* event =
      reference_worker
          ? json_pack("{s:I, s:s, s:s, s:s, s:s, s:s}", "step",
                      (json_int_t)step, "worker_id", worker_id, "worker_sha256",
                      got_hex, "reference_worker", reference_worker,
                      "reference_sha256", want_hex, "policy", policy)
          : json_pack("{s:I, s:s, s:s, s:s, s:s}", "step", (json_int_t)step,
                      "worker_id", worker_id, "worker_sha256", got_hex,
                      "gateway_sha256", want_hex, "policy", policy);
  if (event) {
    pcp_status_ignore(pcp_store_job_event_append(
        o->store, o->job_id, "training.param_hash_mismatch", event, NULL));
    json_decref(event);
  }
  if (fail && reference_worker) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "worker %s holds global parameters of step %" PRIu64
                           " with SHA-256 %s, reference worker %s's (the "
                           "workers' majority) are %s "
                           "(on_param_mismatch: fail)",
                           worker_id, step, got_hex, reference_worker,
                           want_hex);
  }
  if (fail) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "worker %s holds global parameters of step %" PRIu64
                           " with SHA-256 %s, the gateway's are %s "
                           "(on_param_mismatch: fail)",
                           worker_id, step, got_hex, want_hex);
  }
  return pcp_ok_status();
}

void pcp_diloco_param_hash_json(const job_t* job, json_t* progress) {
  json_t* o = json_pack(
      "{s:o, s:o, s:I}", "verified_step",
      job->param_hash_verified ? json_integer((json_int_t)job->param_hash_step)
                               : json_null(),
      "sha256",
      job->param_hash_verified ? json_string(job->param_hash_hex) : json_null(),
      "mismatches", (json_int_t)job->param_hash_mismatches);
  if (o) {
    json_object_set_new(progress, "param_hash", o);
  }
}

// Writes the workers' state image of a checkpoint (|prefix|-<step>.workers)
// under the state dir's checkpoints/<job>/ and beside checkpoint_dir's
// latest.ckpt (a "resume": true job reads it there); |out_name| (64 bytes)
// and |out_hex| receive the file name and its SHA-256 for the cursor.
pcp_status_t pcp_diloco_job_state_file_write(
    job_t* job, const char* prefix, const void* state, size_t bytes,
    char* out_name, char out_hex[PCP_SHA256_HEX_LENGTH + 1]) {
  const pcp_diloco_job_options_t* o = job->options;
  pcp_sha256_t digest;
  pcp_sha256_compute(state, bytes, &digest);
  pcp_sha256_to_hex(&digest, out_hex);
  snprintf(out_name, 64, "%s-%020" PRIu64 ".workers", prefix, job->outer_step);
  char dir[1200], path[1600];
  snprintf(dir, sizeof(dir), "%s/checkpoints/%s", pcp_store_state_dir(o->store),
           o->job_id);
  pcp_status_t status = pcp_file_make_directories(dir);
  if (!status) {
    snprintf(path, sizeof(path), "%s/%s", dir, out_name);
    status = pcp_file_write_atomic(path, state, bytes);
  }
  if (!status && job->checkpoint_dir[0]) {
    status = pcp_file_make_directories(job->checkpoint_dir);
    snprintf(path, sizeof(path), "%s/%s", job->checkpoint_dir, out_name);
    if (!status) {
      status = pcp_file_write_atomic(path, state, bytes);
    }
  }
  return status;
}

static int compare_slots(const void* a, const void* b) {
  return strcmp((*(inner_slot_t* const*)a)->worker_id,
                (*(inner_slot_t* const*)b)->worker_id);
}

// inner_state keep, before a classic checkpoint: reads the moments of the
// workers that reported this outer step (in worker-id order, the order a
// resume hands them out) with @copy into a side file
// classic-<step>.workers beside the checkpoint (per worker m then v, f32
// parameter vectors), named with its SHA-256 in job->inner_cursor with the
// workers' steps. A worker lost while its state is read leaves the
// checkpoint without moments (a resume starts those fresh, logged).
static pcp_status_t inner_checkpoint_prepare(job_t* job) {
  json_decref(job->inner_cursor);
  job->inner_cursor = NULL;
  if (!keeps_state(job)) {
    return pcp_ok_status();
  }
  inner_slot_t* slots[MAX_ROUND_WORKERS];
  uint32_t count = 0;
  for (uint32_t i = 0; i < job->inner_count && count < MAX_ROUND_WORKERS; ++i) {
    inner_slot_t* slot = &job->inner[i];
    if (slot->live && slot->program && slot->reported_step == job->outer_step) {
      slots[count++] = slot;
    }
  }
  qsort(slots, count, sizeof(slots[0]), compare_slots);
  size_t N = job->parameter_count;
  size_t bytes = (size_t)count * 2 * N * sizeof(float);
  float* state = pcp_diloco_job_malloc(job, bytes ? bytes : 1);
  round_task_t* tasks = pcp_diloco_job_calloc(job, count + 1, sizeof(*tasks));
  if (!state || !tasks) {
    pcp_diloco_job_free(job, state);
    pcp_diloco_job_free(job, tasks);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "%zu bytes of inner state", bytes);
  }
  round_task_t* pointers[MAX_ROUND_WORKERS];
  float* vectors[MAX_ROUND_WORKERS];
  bool failed[MAX_ROUND_WORKERS];
  for (uint32_t k = 0; k < count; ++k) {
    snprintf(tasks[k].worker_id, sizeof(tasks[k].worker_id), "%s",
             slots[k]->worker_id);
    tasks[k].program = slots[k]->program;
    tasks[k].slot = slots[k];
    pointers[k] = &tasks[k];
    vectors[k] = state + (size_t)k * 2 * N;
  }
  const pcp_diloco_job_options_t* o = job->options;
  int64_t start = pcp_clock_now_ns(o->clock);
  pcp_status_t status =
      count ? moments_copy(job, pointers, count, false, vectors, failed)
            : pcp_ok_status();
  pcp_diloco_job_free(job, tasks);
  bool complete = true;
  for (uint32_t k = 0; k < count && !status; ++k) {
    if (failed[k]) {
      slots[k]->live = false;
      complete = false;
    }
  }
  if (status || !complete) {
    pcp_diloco_job_free(job, state);
    if (!status) {
      PCP_LOG(PCP_LOG_WARN, &job->log,
              "inner state of a worker could not be read: the checkpoint at "
              "outer_step=%" PRIu64 " has no moments",
              job->outer_step);
    }
    return status;
  }
  char name[64];
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  status =
      pcp_diloco_job_state_file_write(job, "classic", state, bytes, name, hex);
  pcp_diloco_job_free(job, state);
  PCP_RETURN_IF_ERROR_BARE(status);
  json_t* steps = json_array();
  json_t* ids = json_array();
  for (uint32_t k = 0; k < count && steps && ids; ++k) {
    json_array_append_new(steps, json_integer((json_int_t)slots[k]->step));
    json_array_append_new(ids, json_string(slots[k]->worker_id));
  }
  job->inner_cursor = json_pack(
      "{s:s, s:s, s:I, s:o, s:o}", "state_file", name, "state_sha256", hex,
      "state_bytes", (json_int_t)bytes, "steps", steps ? steps : json_array(),
      "workers", ids ? ids : json_array());
  if (!job->inner_cursor) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "inner cursor");
  }
  PCP_LOG(PCP_LOG_INFO, &job->log,
          "inner state for outer_step=%" PRIu64
          ": %zu bytes from %u workers read and written in %.2f s",
          job->outer_step, bytes, count,
          (double)(pcp_clock_now_ns(o->clock) - start) / 1e9);
  return pcp_ok_status();
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
  // Wait (bounded) for as many workers as the last step averaged: woken
  // by the fabric's joins, not by polling. Short of them at the deadline,
  // the round goes on with those there; a stop is seen by the caller.
  if (job->expected_workers > 1) {
    pcp_status_ignore(pcp_diloco_job_workers_wait(job, job->expected_workers,
                                                  WORKER_GRACE_MS));
  }
  // Measured bytes: the fabric's counters from here to the deltas'
  // arrival (the evaluation after the step is not part of it).
  pcp_diloco_job_bytes_mark(job);
  round_t round;
  memset(&round, 0, sizeof(round));
  pcp_status_t status = round_workers(job, &round);
  if (!status && round.count == 0) {
    round_release(job, &round);
    // Nobody to train on yet: back to the job loop (which looks at the stop
    // request, once per pass) as soon as one more worker joins, or after
    // NOBODY_WAIT_MS. With a waker the stop ends the wait too (the training
    // kind's cancel wakes the fabric's waits); without one the stop hook is
    // polled only by the loop, as its fake in service_test counts.
    const char* worker_class = job->config.worker_class;
    uint32_t connected =
        worker_class
            ? pcp_fabric_workers_count(o->fabric, NULL, NULL, worker_class)
            : pcp_fabric_worker_count(o->fabric, PCP_FABRIC_WORKER_CONNECTED);
    pcp_fabric_endpoint_t* fabric = o->fabric;
    pcp_status_t waited = pcp_fabric_workers_wait_class(
        fabric, NULL, NULL, worker_class, connected + 1,
        pcp_fabric_endpoint_now_ns(fabric) + (int64_t)NOBODY_WAIT_MS * 1000000,
        job->waker ? pcp_diloco_job_stop_fn : NULL, job->waker ? job : NULL,
        NULL);
    if (pcp_status_code(waited) == PCP_STATUS_FAILED_PRECONDITION) {
      return waited;  // the fabric is going away
    }
    pcp_status_ignore(waited);
    return pcp_ok_status();
  }
  if (!status) {
    status = round_sample(job, &round);
  }
  if (!status) {
    status = round_inner_prepare(job, &round);
    if (status && pcp_status_code(status) == PCP_STATUS_CANCELLED) {
      pcp_status_ignore(status);
      round_release(job, &round);
      *out_stopped = true;
      return pcp_ok_status();
    }
  }
  if (!status) {
    status = round_submit(job, &round);
  }
  if (status) {
    // Tasks submitted before the failure still borrow the buffers.
    round_wait(job, &round);
    round_release(job, &round);
    return status;
  }
  *out_stopped = round_wait(job, &round);
  round_outcome_t outcome;
  status = round_collect(job, &round, &outcome);
  pcp_diloco_job_bytes_stop(job);
  uint32_t submitted = round.count;
  // The evaluator: the first worker (by id) whose round succeeded.
  char eval_worker[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1] = "";
  program_t* eval_kind = NULL;
  for (uint32_t k = 0; k < round.count && !eval_worker[0]; ++k) {
    if (round.tasks[k].task && !pcp_fabric_task_status(round.tasks[k].task)) {
      snprintf(eval_worker, sizeof(eval_worker), "%s",
               round.tasks[k].worker_id);
      eval_kind = round.tasks[k].program;
    }
  }
  round_release(job, &round);
  PCP_RETURN_IF_ERROR_BARE(status);
  // Before the returns below: a round that is repeated (no reporter) or
  // stopped still computed its tasks' tokens.
  job->tokens_computed += outcome.tokens_computed;
  job->tokens_merged += (double)outcome.tokens_merged;
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
  job->last_step_ns = pcp_clock_now_ns(o->clock) - start;
  job->last_lr = pcp_diloco_lr_schedule_at(
      &job->schedule, job->outer_step * (uint64_t)job->config.tau - 1);
  job->expected_workers = outcome.reporters;
  job->last_loss = outcome.loss_last;
  job->last_loss_mean = outcome.loss_mean;
  job->wire_bytes += outcome.parameter_bytes + outcome.delta_bytes;
  job->token_bytes += outcome.token_bytes;
  double seconds = (double)(pcp_clock_now_ns(o->clock) - start) / 1e9;
  double tokens = (double)outcome.reporters * (double)batches_per_round(job) *
                  (double)(job->spec.batch * job->spec.block_size);
  double tokens_per_second = seconds > 0 ? tokens / seconds : 0;
  pcp_diloco_job_step_metrics(job, &outcome, seconds, tokens_per_second);
  PCP_LOG(PCP_LOG_INFO, &job->log,
          "outer_step=%" PRIu64 "/%" PRId64
          " loss=%.4f loss_mean=%.4f workers=%u/%u seconds=%.2f "
          "tokens_per_s=%.0f wire_bytes=%" PRIu64 " nonfinite=%zu",
          job->outer_step, job->config.outer_loop_steps, job->last_loss,
          job->last_loss_mean, outcome.reporters, submitted, seconds,
          tokens_per_second, outcome.parameter_bytes + outcome.delta_bytes,
          nonfinite);
  double epoch = pcp_diloco_job_epochs_trained(job);
  job->epochs_done = epoch >= (double)job->config.max_epochs;
  bool last = (int64_t)job->outer_step >= job->config.outer_loop_steps ||
              job->epochs_done;
  bool evaluated = false;
  if (eval_kind && pcp_diloco_job_eval_due(job, job->outer_step, last)) {
    status = pcp_diloco_job_evaluate(job, eval_worker, eval_kind->backend,
                                     eval_kind->target);
    if (status && pcp_status_code(status) == PCP_STATUS_CANCELLED) {
      pcp_status_ignore(status);
      *out_stopped = true;
      return pcp_ok_status();
    }
    PCP_RETURN_IF_ERROR_BARE(status);
    evaluated = job->val_loss_step == job->outer_step;
  }
  if (o->metrics && o->metrics->learning_rate) {
    const char* job_label[] = {o->job_id};
    pcp_obs_family_set(o->metrics->learning_rate, job_label, job->last_lr);
  }
  json_t* progress =
      pcp_diloco_job_progress_json(job, &outcome, seconds, tokens_per_second);
  if (progress) {
    json_object_set_new(progress, "workers_submitted", json_integer(submitted));
    json_object_set_new(progress, "epoch", json_real(epoch));
    json_object_set_new(progress, "evaluated", json_boolean(evaluated));
    json_object_set_new(
        progress, "inner_state",
        json_string(job->config.inner_state == PCP_DILOCO_INNER_STATE_RESET
                        ? "reset"
                        : "keep"));
    json_object_set_new(progress, "fresh_inner_state",
                        json_integer(outcome.fresh_inner_state));
    json_object_set_new(progress, "param_mismatches",
                        json_integer(outcome.param_mismatches));
    pcp_diloco_job_goodput_json(job, progress);
    json_t* bytes = pcp_diloco_job_bytes_json(job);
    if (bytes) {
      json_object_set_new(progress, "bytes", bytes);
    }
    json_t* totals = pcp_diloco_job_bytes_total_json(job);
    if (totals) {
      json_object_set_new(progress, "bytes_total", totals);
    }
    pcp_diloco_param_hash_json(job, progress);
    pcp_status_ignore(pcp_store_job_event_append(
        o->store, o->job_id, "training.step", progress, NULL));
  }
  pcp_diloco_job_progress_report(job, progress);
  json_decref(progress);
  if (job->epochs_done) {
    PCP_LOG(PCP_LOG_INFO, &job->log,
            "max_epochs=%" PRId64 " reached at outer_step=%" PRIu64
            " (%.2f passes over %" PRIu64 " train tokens): done",
            job->config.max_epochs, job->outer_step, epoch, job->train_tokens);
  }
  if (last || (job->config.checkpoint_every > 0 &&
               job->outer_step % (uint64_t)job->config.checkpoint_every == 0)) {
    status = inner_checkpoint_prepare(job);
    if (status && pcp_status_code(status) == PCP_STATUS_CANCELLED) {
      pcp_status_ignore(status);
      *out_stopped = true;
      return pcp_ok_status();
    }
    PCP_RETURN_IF_ERROR_BARE(status);
    status = pcp_diloco_job_checkpoint_write(job);
    json_decref(job->inner_cursor);
    job->inner_cursor = NULL;
    PCP_RETURN_IF_ERROR_BARE(status);
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// The job
//===----------------------------------------------------------------------===//

static pcp_status_t job_run(const pcp_diloco_job_options_t* options) {
  job_t job;
  memset(&job, 0, sizeof(job));
  job.options = options;
  job.allocator =
      options->allocator.ctl ? options->allocator : pcp_allocator_system();
  job.log = options->log;
  job.log.job_id = options->job_id;
  job.last_loss = NAN;
  job.last_loss_mean = NAN;
  job.last_val_loss = NAN;
  pcp_status_t status = pcp_diloco_job_waker_create(&job);
  if (!status) {
    status = job_setup(&job);
  }
  if (!status) {
    pcp_sha256_t digest;
    pcp_sha256_compute(job.model_text, job.model_length, &digest);
    pcp_sha256_to_hex(&digest, job.model_hash);
    status = job_resume(&job);
    // A checkpoint written when the data ran out ends the job again.
    job.epochs_done =
        pcp_diloco_job_epochs_trained(&job) >= (double)job.config.max_epochs;
  }
  if (!status && pcp_diloco_ddp_selected(&job)) {
    status = pcp_diloco_ddp_run(&job);
    pcp_diloco_job_waker_detach(&job);
    job_deinitialize(&job);
    return status;
  }
  if (!status && pcp_diloco_decoupled_selected(&job)) {
    status = pcp_diloco_decoupled_run(&job);
    pcp_diloco_job_waker_detach(&job);
    job_deinitialize(&job);
    return status;
  }
  if (!status && job.config.streaming.present) {
    status = pcp_diloco_stream_run(&job);
    pcp_diloco_job_waker_detach(&job);
    job_deinitialize(&job);
    return status;
  }
  const pcp_diloco_job_hooks_t* hooks = &options->hooks;
  if (!status && hooks->phase) {
    status = hooks->phase(hooks->user_data, PCP_DILOCO_JOB_PHASE_RUNNING);
  }
  if (!status) {
    json_t* progress = pcp_diloco_job_progress_json(&job, NULL, 0, 0);
    pcp_diloco_job_progress_report(&job, progress);
    json_decref(progress);
  }
  uint32_t empty_rounds = 0;
  char last_error[256] = "";
  while (!status && (int64_t)job.outer_step < job.config.outer_loop_steps &&
         !job.epochs_done) {
    if (pcp_diloco_job_should_stop(&job)) {
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
    status = pcp_diloco_job_model_export(&job);
  }
  pcp_diloco_job_waker_detach(&job);
  job_deinitialize(&job);
  return status;
}

pcp_status_t pcp_diloco_job_run(const pcp_diloco_job_options_t* options) {
  pcp_status_t status = job_run(options);
  // The job's series end with it, however it ended (its last values stay
  // in the job's record and in the scrapes already taken).
  pcp_diloco_metrics_job_remove(options->metrics, options->job_id);
  return status;
}
