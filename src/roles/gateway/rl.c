// SPDX-License-Identifier: Apache-2.0
//
// The gateway's RL API (issue 16): POST /v1/rl/jobs takes a GRPO
// experiment (docs/rl.md "Experiment"), has the RL kind check it
// (pcp_workloads_rl_spec_build: 400 naming the key, 403 for a path outside
// the roots, 404 for a missing train_job) and records a job of kind "rl";
// GET /v1/rl/jobs/{id} answers the job with its "rl" progress. The hub's
// POST /v1/internal/federation/rl/jobs (routes.c) submits through the same
// function.
//
// The loop itself is src/workloads/rl/job.c on the shared runner. Here are
// the handlers and the kind's options (the verifier builder is the services
// module's, which the workloads may not call).
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

static atomic_uint_fast64_t g_rl_counter;

static pcp_status_t rl_job_answer(pcp_roles_gateway_state_t* g, const char* id,
                                  int http_status,
                                  pcp_http_response_t* response) {
  pcp_store_job_t job;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_get(g->store, id, &job));
  if (strcmp(job.kind, PCP_WORKLOADS_RL_KIND_NAME) != 0) {
    pcp_store_job_deinitialize(&job);
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "rl job %s", id);
  }
  json_t* out = pcp_roles_gateway_job_json(&job);
  if (out) {
    pcp_roles_gateway_training_json_merge(g, out);
  }
  if (out && !json_object_get(out, "rl")) {
    // Not run by this process (queued, or ended before a restart): its
    // newest checkpoint, else iteration 0.
    json_t* initial = pcp_workloads_rl_progress_initial(
        g->config->file.state_dir, id, job.spec);
    if (initial) {
      json_object_set_new(out, "rl", initial);
    }
  }
  pcp_store_job_deinitialize(&job);
  if (!out) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "job JSON");
  }
  return pcp_http_response_json_take(response, http_status, out);
}

pcp_status_t pcp_roles_gateway_rl_submit(void* user_data,
                                         const pcp_http_request_t* request,
                                         pcp_http_response_t* response) {
  pcp_string_view_t body = pcp_http_request_body(request);
  return pcp_roles_gateway_rl_text_submit(user_data, body.data, body.size,
                                          response);
}

pcp_status_t pcp_roles_gateway_rl_text_submit(pcp_roles_gateway_state_t* g,
                                              const char* text,
                                              size_t byte_length,
                                              pcp_http_response_t* response) {
  if (atomic_load(&g->draining)) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE,
                           "the gateway is draining; submit elsewhere");
  }
  json_t* spec = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_workloads_rl_spec_build(&g->rl_kind, text, byte_length, &spec));
  // "rl-" and 16 hex digits: the first 8 name the default served model
  // (rl-<8 hex>), so they mix the time and a counter rather than being the
  // clock's slow-moving high digits.
  uint64_t mixed = (uint64_t)pcp_clock_wall_ns(g->clock) ^
                   ((uint64_t)atomic_fetch_add(&g_rl_counter, 1) << 40);
  mixed ^= mixed >> 31;
  mixed *= UINT64_C(0x7fb5d329728ea185);
  mixed ^= mixed >> 27;
  char id[64];
  snprintf(id, sizeof(id), "rl-%016" PRIx64, mixed);
  pcp_status_t status = pcp_workloads_runner_job_submit(
      g->runner, id, PCP_WORKLOADS_RL_KIND_NAME, spec, NULL, NULL, NULL);
  json_decref(spec);
  PCP_RETURN_IF_ERROR_BARE(status);
  char location[128];
  snprintf(location, sizeof(location), "/v1/rl/jobs/%s", id);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_http_response_header_add(response, "Location", location));
  status = rl_job_answer(g, id, 202, response);
  // Only now, so the answer shows "queued".
  pcp_workloads_runner_wake(g->runner);
  return status;
}

pcp_status_t pcp_roles_gateway_rl_get(void* user_data,
                                      const pcp_http_request_t* request,
                                      pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  if (!id) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "missing job id");
  }
  return rl_job_answer(g, id, 200, response);
}

// The external verifier of a reward {"type": "verifier", ...}.
static pcp_status_t verifier_create(void* user_data, const json_t* config,
                                    pcp_allocator_t allocator,
                                    pcp_workloads_rl_verifier_t* out_verifier) {
  (void)user_data;
  return pcp_services_verifier_create(config, "reward", allocator,
                                      out_verifier);
}

void pcp_roles_gateway_rl_configure(pcp_roles_gateway_state_t* g) {
  g->rl_kind.options = (pcp_workloads_rl_options_t){
      .fabric = g->fabric,
      .infer = g->infer,
      .compile_queue = g->compile_queue,
      .store = g->store,
      .state_dir = g->config->file.state_dir,
      .policy = &g->training_policy,
      .metrics = g->registry,
      .allocator = g->allocator,
      .clock = g->clock,
      .log = g->log,
      .verifier_create = verifier_create,
      .user_data = g,
  };
}
