// SPDX-License-Identifier: Apache-2.0
//
// The gateway's training API: POST /v1/training/jobs takes a DiLoCo
// experiment, has the training kind validate it
// (pcp_workloads_train_spec_build, src/workloads/train/policy.c) and
// records a job of kind "training" with its events; GET
// /v1/training/jobs/{id} answers the job with its training progress.
//
// The outer loop is src/workloads/train/service.c and the job's lifecycle
// the training kind on the shared workload runner (src/workloads/train/
// job.c, runtime.h). Here are the HTTP handlers and the hooks the kind
// calls back (the policy re-check at placing, the inference reload on
// export). A gateway stopped (or killed) mid-run leaves the job running in
// the store; the restart re-queues it (the runner's recovery) and the
// service resumes it from its newest checkpoint.
//
// Thread-safety: the handlers run on libmicrohttpd's threads and touch only
// the store and the runner (both thread-safe) and the gateway's atomics.

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "roles/gateway/gateway_impl.h"
#include "workloads/workloads.h"

static atomic_uint_fast64_t g_training_counter;

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
  if (out) {
    pcp_roles_gateway_training_json_merge(g, out);
  }
  if (!out) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "job JSON");
  }
  return pcp_http_response_json_take(response, http_status, out);
}

pcp_status_t pcp_roles_gateway_training_submit(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response) {
  pcp_string_view_t body = pcp_http_request_body(request);
  return pcp_roles_gateway_training_text_submit(user_data, body.data, body.size,
                                                response);
}

pcp_status_t pcp_roles_gateway_training_text_submit(
    pcp_roles_gateway_state_t* g, const char* text, size_t byte_length,
    pcp_http_response_t* response) {
  if (atomic_load(&g->draining)) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE,
                           "the gateway is draining; submit elsewhere");
  }
  json_t* spec = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_workloads_train_spec_build(
      &g->training_policy, text, byte_length, &spec));
  char id[64];
  snprintf(id, sizeof(id), "train-%" PRIx64 "-%" PRIu64,
           (uint64_t)pcp_clock_wall_ns(g->clock),
           (uint64_t)atomic_fetch_add(&g_training_counter, 1));
  // "training.accepted" follows "queued" before the job can start.
  pcp_status_t status = pcp_workloads_runner_job_submit(
      g->runner, id, "training", spec, "training.accepted",
      json_object_get(spec, "training"), NULL);
  json_decref(spec);
  PCP_RETURN_IF_ERROR_BARE(status);
  char location[128];
  snprintf(location, sizeof(location), "/v1/training/jobs/%s", id);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_http_response_header_add(response, "Location", location));
  status = training_job_answer(g, id, 202, response);
  // Only now, so the answer shows "queued".
  pcp_workloads_runner_wake(g->runner);
  return status;
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

pcp_status_t pcp_roles_gateway_training_history(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  if (!id) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "missing job id");
  }
  json_t* history = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_workloads_train_history_json(g->store, id, &history));
  return pcp_http_response_json_take(response, 200, history);
}

//===----------------------------------------------------------------------===//
// The training kind's hooks (the kind itself: src/workloads/train/job.c)
//===----------------------------------------------------------------------===//

// The submit-time checks again, at placing, under today's policy.
static pcp_status_t experiment_check(void* user_data, const char* experiment,
                                     char** out_checked) {
  pcp_roles_gateway_state_t* g = user_data;
  *out_checked = NULL;
  json_t* spec = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_workloads_train_spec_build(
      &g->training_policy, experiment, strlen(experiment), &spec));
  *out_checked = json_dumps(json_object_get(spec, "experiment"), JSON_COMPACT);
  json_decref(spec);
  if (!*out_checked) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "experiment");
  }
  return pcp_ok_status();
}

// A checkpoint's export was written: the inference service reloads the
// model now rather than at its next periodic scan.
static void model_exported(void* user_data, const char* model_dir) {
  pcp_roles_gateway_state_t* g = user_data;
  pcp_infer_service_dir_notify(g->infer, model_dir);
}

pcp_status_t pcp_roles_gateway_workloads_start(pcp_roles_gateway_state_t* g) {
  const pcp_roles_gateway_file_config_t* file = &g->config->file;
  pcp_workloads_train_policy_config_t policy_config = {
      .state_dir = file->state_dir,
      .data_roots = file->data_roots,
      .model_roots = file->model_roots,
      .max_job_parameters = file->max_job_parameters,
      .max_job_gateway_bytes = file->max_job_gateway_bytes,
      .allocator = g->allocator,
  };
  PCP_RETURN_IF_ERROR_BARE(pcp_workloads_train_policy_initialize(
      &policy_config, "/proc/self/exe",
      pcp_workloads_train_memory_total_bytes(), &g->training_policy));
  {
    // One line an operator can check: where experiments may point, and the
    // size caps.
    char line[2300];
    pcp_workloads_train_policy_describe(&g->training_policy, line,
                                        sizeof(line));
    PCP_LOG(PCP_LOG_INFO, &g->log, "training paths and caps %s", line);
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_diloco_metrics_register(g->registry, &g->training_metrics));
  g->train_kind.options = (pcp_workloads_train_options_t){
      .fabric = g->fabric,
      .state_dir = g->config->file.state_dir,
      .metrics = &g->training_metrics,
      .compile_queue = g->compile_queue,
      .allocator = g->allocator,
      .store = g->store,
      .clock = g->clock,
      .log = g->log,
      .experiment_check = experiment_check,
      .exported = model_exported,
      .user_data = g,
  };
  pcp_roles_gateway_rl_configure(g);
  return pcp_workloads_runner_start(g->runner);
}

void pcp_roles_gateway_workloads_stop(pcp_roles_gateway_state_t* g) {
  // Every run sees should_stop and returns; its job stays running in the
  // store and resumes from a checkpoint at the next start.
  if (g->runner) {
    pcp_workloads_runner_stop(g->runner);
  }
  pcp_workloads_train_policy_deinitialize(&g->training_policy);
}

void pcp_roles_gateway_training_json_merge(pcp_roles_gateway_state_t* g,
                                           json_t* job_json) {
  if (g->runner) {
    pcp_workloads_runner_job_json_merge(g->runner, job_json);
  }
}
