// SPDX-License-Identifier: Apache-2.0
//
// The gateway's training API: POST /v1/training/jobs takes a DiLoCo
// experiment (the workloads config table's keys), validates it there and
// records a job of kind "training" with its events; GET
// /v1/training/jobs/{id} answers the job with its training progress.
//
// What is here is the front half of the embedded training service: the
// outer loop that places the job on workers (broadcast, tau inner steps per
// worker, delta average, host Nesterov, checkpoints) is not written yet, so a
// training job stays queued; the generic job runner leaves kind "training"
// alone (jobs.c filters on kind "generic").
//
// Thread-safety: the handlers run on libmicrohttpd's threads and touch only
// the store (thread-safe) and the gateway's atomics.

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "models/models.h"
#include "roles/gateway/gateway_impl.h"
#include "workloads/workloads.h"

// Experiments are small JSON objects; the cap keeps a hostile body from
// reaching the config parser (STYLE 3.8: configs at most 1 MiB).
#define PCP_GATEWAY_TRAINING_MAX_BODY_BYTES ((size_t)1 << 20)

static atomic_uint_fast64_t g_training_counter;

static const char* wire_dtype_name(int32_t dtype) {
  return dtype == PCP_DILOCO_WIRE_BF16 ? "bf16" : "f32";
}

// The built-in model of |config| as a models spec, validated by the models
// module too (it knows rules the config table does not, e.g. GPT's fused qkv),
// and its parameter count. *out_parameter_count is 0 for a model_path
// experiment (its size is known only once the module is read).
static pcp_status_t model_parameter_count(const pcp_diloco_config_t* config,
                                          int64_t* out_parameter_count) {
  *out_parameter_count = 0;
  if (!config->model.present) {
    return pcp_ok_status();
  }
  pcp_models_architecture_t arch = PCP_MODELS_ARCHITECTURE_GPT;
  switch (config->model.kind) {
    case PCP_DILOCO_MODEL_NANOCHAT:
      arch = PCP_MODELS_ARCHITECTURE_NANOCHAT;
      break;
    case PCP_DILOCO_MODEL_QWEN3:
      arch = PCP_MODELS_ARCHITECTURE_QWEN3;
      break;
    default:
      break;
  }
  pcp_models_spec_t spec;
  pcp_models_spec_initialize(arch, &spec);
  spec.layers = config->model.layers;
  spec.heads = config->model.heads;
  // Only Qwen3 has grouped-query attention; the others take kv = heads (0).
  spec.kv_heads =
      arch == PCP_MODELS_ARCHITECTURE_QWEN3 ? config->model.kv_heads : 0;
  spec.width = config->model.width;
  spec.vocab = config->model.vocab;
  spec.block_size = config->model.block_size;
  spec.batch = config->model.batch;
  spec.dtype = config->dtype == PCP_DILOCO_DTYPE_BF16 ? PCP_ELEMENT_TYPE_BF16
                                                      : PCP_ELEMENT_TYPE_F32;
  pcp_models_parameter_table_t table;
  pcp_status_t status = pcp_models_parameter_table_initialize(
      &spec, pcp_allocator_system(), &table);
  if (status) {
    // Same code (INVALID_ARGUMENT for a bad shape), with the key prefix the
    // config table uses so the client sees where to look.
    char message[512];
    pcp_status_format(status, message, sizeof(message));
    pcp_status_code_t code = pcp_status_code(status);
    pcp_status_ignore(status);
    return pcp_make_status(code, "key 'model': %s", message);
  }
  *out_parameter_count = table.total_elements;
  pcp_models_parameter_table_deinitialize(&table);
  return pcp_ok_status();
}

pcp_status_t pcp_roles_gateway_training_spec_build(const char* text,
                                                   size_t byte_length,
                                                   json_t** out_spec) {
  *out_spec = NULL;
  if (byte_length > PCP_GATEWAY_TRAINING_MAX_BODY_BYTES) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "experiment of %zu bytes; the limit is %zu",
                           byte_length, PCP_GATEWAY_TRAINING_MAX_BODY_BYTES);
  }
  pcp_diloco_config_t config;
  pcp_string_list_t unknown = {0};
  // The config table is the one validator: its message names the key, and
  // the HTTP layer maps INVALID_ARGUMENT to 400.
  PCP_RETURN_IF_ERROR_BARE(
      pcp_diloco_config_parse_json(text, byte_length, &config, &unknown));
  int64_t parameter_count = 0;
  pcp_status_t model_status = model_parameter_count(&config, &parameter_count);
  if (model_status) {
    pcp_string_list_deinitialize(&unknown);
    pcp_diloco_config_deinitialize(&config);
    return model_status;
  }
  // Analytic bytes one worker moves per outer step (its delta up in the
  // wire dtype, the parameters down in f32): what the outer loop's measured
  // wire_bytes must add up to.
  uint64_t worker_step_bytes = pcp_diloco_outer_step_wire_bytes(
      (uint64_t)parameter_count, 1,
      (pcp_diloco_wire_dtype_t)config.deltas_dtype, PCP_DILOCO_WIRE_F32);
  json_error_t error;
  json_t* experiment =
      json_loadb(text, byte_length, JSON_REJECT_DUPLICATES, &error);
  json_t* unknown_json = json_array();
  for (size_t i = 0; unknown_json && i < unknown.count; ++i) {
    json_array_append_new(unknown_json, json_string(unknown.items[i]));
  }
  pcp_status_t status = pcp_ok_status();
  if (!experiment || !json_is_object(experiment)) {
    // The config parser accepted it, so this is a jansson disagreement (or
    // OOM), not the client's fault.
    status = pcp_make_status(PCP_STATUS_INTERNAL,
                             "experiment re-parse failed: %s", error.text);
  }
  json_t* spec = NULL;
  if (!status) {
    // "training" is the progress the outer loop updates; it starts at zero
    // so clients can render it before the first round.
    spec = json_pack(
        "{s:O, s:o, s:{s:I, s:I, s:I, s:n, s:n, s:I, s:s, s:b, s:I, s:I}}",
        "experiment", experiment, "unknown_keys",
        unknown_json ? unknown_json : json_array(), "training", "outer_step",
        (json_int_t)0, "outer_loop_steps", (json_int_t)config.outer_loop_steps,
        "tau", (json_int_t)config.tau, "loss", "tokens_per_s", "wire_bytes",
        (json_int_t)0, "deltas_dtype", wire_dtype_name(config.deltas_dtype),
        "streaming", config.streaming.present, "parameter_count",
        (json_int_t)parameter_count, "wire_bytes_per_worker_outer_step",
        (json_int_t)worker_step_bytes);
    unknown_json = NULL;  // json_pack's "o" took it
    if (!spec) {
      status =
          pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "training job spec");
    }
  }
  json_decref(unknown_json);
  json_decref(experiment);
  pcp_string_list_deinitialize(&unknown);
  pcp_diloco_config_deinitialize(&config);
  *out_spec = spec;
  return status;
}

static pcp_status_t training_job_answer(pcp_roles_gateway_state_t* g,
                                        const char* id, int http_status,
                                        pcp_http_response_t* response) {
  pcp_store_job_t job;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_get(g->store, id, &job));
  if (strcmp(job.kind, "training") != 0) {
    pcp_store_job_deinitialize(&job);
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "training job %s", id);
  }
  json_t* out = pcp_roles_gateway_job_json(&job);
  json_t* training = json_object_get(job.spec, "training");
  if (out && training) {
    // Progress at the top level too, so `pcp submit train` reads one object.
    json_object_set(out, "training", training);
  }
  pcp_store_job_deinitialize(&job);
  if (!out) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "job JSON");
  }
  return pcp_http_response_json_take(response, http_status, out);
}

pcp_status_t pcp_roles_gateway_training_submit(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  if (atomic_load(&g->draining)) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE,
                           "the gateway is draining; submit elsewhere");
  }
  pcp_string_view_t body = pcp_http_request_body(request);
  json_t* spec = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_roles_gateway_training_spec_build(body.data, body.size, &spec));
  char id[64];
  snprintf(id, sizeof(id), "train-%" PRIx64 "-%" PRIu64,
           (uint64_t)pcp_clock_wall_ns(g->clock),
           (uint64_t)atomic_fetch_add(&g_training_counter, 1));
  pcp_status_t status =
      pcp_store_job_create(g->store, id, "training", spec, NULL);
  atomic_fetch_add(&g->job_generation, 1);
  if (!status) {
    json_t* payload = json_deep_copy(json_object_get(spec, "training"));
    status = pcp_store_job_event_append(g->store, id, "training.accepted",
                                        payload, NULL);
    json_decref(payload);
  }
  json_decref(spec);
  PCP_RETURN_IF_ERROR_BARE(status);
  char location[128];
  snprintf(location, sizeof(location), "/v1/training/jobs/%s", id);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_http_response_header_add(response, "Location", location));
  return training_job_answer(g, id, 202, response);
}

pcp_status_t pcp_roles_gateway_training_get(void* user_data,
                                            const pcp_http_request_t* request,
                                            pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  if (!id) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "missing job id");
  }
  return training_job_answer(g, id, 200, response);
}
