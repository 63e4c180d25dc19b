// SPDX-License-Identifier: Apache-2.0
// The hub's global jobs (docs/federation.md "Global jobs"): placement through
// the registry, submission to the chosen gateway's internal federation
// route, a durable record global-job-N, lookup and cancel through the
// recorded gateway, and GET /v1/jobs fanned out in parallel.

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "roles/hub/hub_impl.h"

#define GLOBAL_JOB_PREFIX "global-job-"

//===----------------------------------------------------------------------===//
// Requests
//===----------------------------------------------------------------------===//

// Keys of a flat request that are placement, not job, keys (upstream s.6.3).
static bool flat_placement_key(const char* key) {
  return strcmp(key, "gateway_id") == 0 || strcmp(key, "worker_class") == 0 ||
         strcmp(key, "target_arch") == 0 ||
         strcmp(key, "workers_required") == 0;
}

// Reads the selector fields of |placement| (an object) into |selector|;
// strings borrow from it. |strict|: unknown keys are refused.
static pcp_status_t selector_parse(const json_t* placement, bool strict,
                                   pcp_sched_federation_selector_t* selector) {
  const char* key;
  const json_t* value;
  json_object_foreach((json_t*)placement, key, value) {
    if (!pcp_sched_federation_selector_key_known(key)) {
      if (strict) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "placement.%s is not a placement key "
                               "(gateway_id, service_id, executor_id, "
                               "worker_class, target_arch, workers_required)",
                               key);
      }
      continue;
    }
    if (json_is_null(value)) {
      continue;
    }
    if (strcmp(key, "workers_required") == 0) {
      if (!json_is_integer(value)) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "placement.workers_required must be an "
                               "integer");
      }
      // Range (negative, too large) is the registry's check.
      selector->workers_required = json_integer_value(value);
      continue;
    }
    if (!json_is_string(value)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "placement.%s must be a string", key);
    }
    const char* text = json_string_value(value);
    if (strcmp(key, "gateway_id") == 0) {
      selector->gateway_id = text;
    } else if (strcmp(key, "service_id") == 0) {
      selector->service_id = text;
    } else if (strcmp(key, "executor_id") == 0) {
      selector->executor_id = text;
    } else if (strcmp(key, "worker_class") == 0) {
      selector->worker_class = text;
    } else if (strcmp(key, "target_arch") == 0) {
      selector->target_arch = text;
    }
  }
  return pcp_ok_status();
}

// Splits a submit body into a selector and the job body (owned, returned in
// |out_job|). Shapes: {placement:{...}, job:{...}}; a flat object (placement
// keys at the top level, the rest is the job); empty.
static pcp_status_t submit_parse(const pcp_http_request_t* request,
                                 json_t** out_body,
                                 pcp_sched_federation_selector_t* selector,
                                 json_t** out_job) {
  *out_body = NULL;
  *out_job = NULL;
  json_t* body = NULL;
  if (pcp_http_request_body(request).size == 0) {
    body = json_object();
  } else {
    PCP_RETURN_IF_ERROR_BARE(pcp_http_request_json_parse(request, &body));
  }
  *out_body = body;
  if (!json_is_object(body)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "the job request must be a JSON object");
  }
  const json_t* placement = json_object_get(body, "placement");
  const json_t* job = json_object_get(body, "job");
  if (placement || job) {
    if (placement && !json_is_null(placement)) {
      if (!json_is_object(placement)) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "placement must be an object");
      }
      PCP_RETURN_IF_ERROR_BARE(selector_parse(placement, true, selector));
    }
    const char* key;
    const json_t* value;
    json_object_foreach(body, key, value) {
      if (strcmp(key, "placement") != 0 && strcmp(key, "job") != 0) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "%s: with placement/job, no other top-level "
                               "key is allowed",
                               key);
      }
    }
    if (job && !json_is_null(job) && !json_is_object(job)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "job must be an object or null");
    }
    *out_job = job && json_is_object(job) ? json_deep_copy(job) : json_object();
  } else {
    PCP_RETURN_IF_ERROR_BARE(selector_parse(body, false, selector));
    json_t* copy = json_deep_copy(body);
    const char* key;
    json_t* value;
    void* tmp;
    json_object_foreach_safe(copy, tmp, key, value) {
      if (flat_placement_key(key)) {
        json_object_del(copy, key);
      }
    }
    *out_job = copy;
  }
  if (!*out_job) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "job body");
  }
  // A flat body names service_id / executor_id at the top level: they
  // select, as upstream.
  if (!selector->service_id) {
    const json_t* v = json_object_get(*out_job, "service_id");
    selector->service_id = json_is_string(v) ? json_string_value(v) : NULL;
  }
  if (!selector->executor_id) {
    const json_t* v = json_object_get(*out_job, "executor_id");
    selector->executor_id = json_is_string(v) ? json_string_value(v) : NULL;
  }
  return pcp_ok_status();
}

// The capability a training job needs, from training_kind / model_type
// (upstream s.3.1.2), looked up in the job body then in its nested "job".
static pcp_status_t training_capability(const json_t* job,
                                        const char** out_capability) {
  *out_capability = "training.regular";
  for (int depth = 0; job && depth < 2; ++depth) {
    const json_t* kind = json_object_get(job, "training_kind");
    if (!kind) {
      kind = json_object_get(job, "model_type");
    }
    if (kind) {
      const char* name = json_is_string(kind) ? json_string_value(kind) : "";
      if (strcmp(name, "regular") == 0 || strcmp(name, "supervised") == 0 ||
          strcmp(name, "nanochat") == 0) {
        return pcp_ok_status();
      }
      if (strcmp(name, "decoupled_diloco") == 0) {
        *out_capability = "training.decoupled_diloco";
        return pcp_ok_status();
      }
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "training_kind must be regular, supervised, "
                             "nanochat or decoupled_diloco");
    }
    job = json_object_get(job, "job");
    if (job && !json_is_object(job)) {
      break;
    }
  }
  return pcp_ok_status();
}

static const char* placement_outcome(pcp_status_t status) {
  switch (pcp_status_code(status)) {
    case PCP_STATUS_OK:
      return "placed";
    case PCP_STATUS_NOT_FOUND:
      return "unknown_gateway";
    case PCP_STATUS_FAILED_PRECONDITION:
      return "stale_gateway";
    case PCP_STATUS_UNAVAILABLE:
      return "unavailable";
    default:
      return "invalid";
  }
}

//===----------------------------------------------------------------------===//
// Global job records
//===----------------------------------------------------------------------===//

static bool global_job_number_parse(const char* id, int64_t* out_number) {
  *out_number = 0;
  size_t prefix = strlen(GLOBAL_JOB_PREFIX);
  if (!id || strncmp(id, GLOBAL_JOB_PREFIX, prefix) != 0) {
    return false;
  }
  const char* digits = id + prefix;
  size_t length = strlen(digits);
  if (length == 0 || length > 18 || digits[0] == '0') {
    return false;
  }
  int64_t n = 0;
  for (size_t i = 0; i < length; ++i) {
    if (digits[i] < '0' || digits[i] > '9') {
      return false;
    }
    n = n * 10 + (digits[i] - '0');
  }
  *out_number = n;
  return true;
}

static json_t* global_job_json(const pcp_store_global_job_t* job) {
  char id[48];
  snprintf(id, sizeof(id), GLOBAL_JOB_PREFIX "%lld", (long long)job->number);
  json_t* assignment = json_deep_copy(job->assignment);
  if (assignment && job->child_job_id[0]) {
    json_object_set_new(assignment, "child_job_id",
                        json_string(job->child_job_id));
  }
  json_t* out = json_pack(
      "{s:s,s:s,s:s,s:o*,s:I,s:I,s:O?}", "global_job_id", id, "kind", job->kind,
      "state", job->state, "assignment", assignment, "submitted_at_ms",
      (json_int_t)(job->submitted_at_ns / 1000000), "updated_at_ms",
      (json_int_t)(job->updated_at_ns / 1000000), "child", job->child);
  if (out && job->error[0]) {
    json_object_set_new(out, "error", json_string(job->error));
  }
  return out;
}

// A child job id goes into a URL path: the store's id alphabet, no '/'.
static bool child_job_id_ok(const char* id) {
  size_t length = id ? strlen(id) : 0;
  if (length == 0 || length > PCP_STORE_ID_MAX_LENGTH || strcmp(id, ".") == 0 ||
      strcmp(id, "..") == 0) {
    return false;
  }
  for (size_t i = 0; i < length; ++i) {
    char c = id[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-' ||
              c == ':' || c == '@';
    if (!ok) {
      return false;
    }
  }
  return true;
}

// Answers |http_status| with the gateway's JSON body relayed, or the error
// schema when the gateway's body is not JSON.
static pcp_status_t relay(pcp_http_response_t* response,
                          const pcp_roles_hub_call_t* call) {
  int http_status = call->http_status;
  if (http_status == 401 || http_status == 403) {
    // The gateway refused the hub's federation credential: relaying 401
    // would tell the client its own (valid) token is wrong.
    return pcp_http_response_error_set(
        response, 502, "GATEWAY_AUTH_FAILED",
        "the gateway refused the hub's federation token (check that "
        "--federation-token-env and the gateway's federation.token_env hold "
        "the same secret)");
  }
  if (http_status < 200 || http_status > 599) {
    http_status = 502;
  }
  if (call->body) {
    return pcp_http_response_json_set(response, http_status, call->body);
  }
  char message[256];
  snprintf(message, sizeof(message), "the gateway answered HTTP %d: %.160s",
           call->http_status, call->raw ? call->raw : "");
  return pcp_http_response_error_set(response, http_status, "GATEWAY_ERROR",
                                     message);
}

//===----------------------------------------------------------------------===//
// Submit
//===----------------------------------------------------------------------===//

static pcp_status_t submit(pcp_roles_hub_t* hub, const char* kind,
                           const pcp_http_request_t* request,
                           pcp_http_response_t* response) {
  json_t* body = NULL;
  json_t* job = NULL;
  pcp_sched_federation_selector_t selector;
  memset(&selector, 0, sizeof(selector));
  pcp_status_t status = submit_parse(request, &body, &selector, &job);
  bool training = strcmp(kind, "training") == 0;
  if (!status) {
    if (training) {
      status = training_capability(job, &selector.capability);
    } else {
      selector.service_type = "rl";
    }
  }
  pcp_sched_federation_placement_t placement;
  memset(&placement, 0, sizeof(placement));
  if (!status) {
    pthread_mutex_lock(&hub->mutex);
    status = pcp_sched_federation_place(
        hub->registry, &selector, pcp_clock_now_ns(hub->clock), &placement);
    pthread_mutex_unlock(&hub->mutex);
    const char* labels[] = {kind, placement_outcome(status)};
    pcp_obs_family_add(hub->families[PCP_ROLES_HUB_METRIC_PLACEMENTS], labels,
                       1);
  }
  json_decref(body);  // |selector| borrowed from it; placement is copied
  if (status) {
    json_decref(job);
    return status;
  }
  // The job body sent on: without the client's service/executor choice,
  // with the chosen one.
  json_object_set_new(job, "service_id", json_string(placement.service_id));
  json_object_set_new(job, "executor_id", json_string(placement.executor_id));
  json_t* assignment = json_pack(
      "{s:s,s:s,s:s,s:s,s:s,s:s}", "gateway_id", placement.gateway_id, "lab_id",
      placement.lab_id, "gateway_base_url", placement.base_url, "service_id",
      placement.service_id, "executor_id", placement.executor_id,
      "service_type", placement.service_type);
  int64_t number = 0;
  status = pcp_store_global_job_create(hub->store, kind, assignment, &number);
  json_decref(assignment);
  char* text = NULL;
  if (!status) {
    text = json_dumps(job, JSON_COMPACT);
    if (!text) {
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "job body");
    }
  }
  json_decref(job);
  if (status) {
    pcp_libc_free(text);  // json_dumps
    return status;
  }
  char path[64];
  snprintf(path, sizeof(path), "/v1/internal/federation/%s/jobs",
           training ? "training" : "rl");
  pcp_roles_hub_call_t call;
  status = pcp_roles_hub_gateway_call(hub, "POST", placement.base_url, path,
                                      text, strlen(text), &call);
  pcp_libc_free(text);  // json_dumps
  const char* child_id = NULL;
  if (!status && call.http_status >= 200 && call.http_status < 300) {
    const json_t* id = json_object_get(call.body, "job_id");
    child_id = json_is_string(id) ? json_string_value(id) : NULL;
    if (!child_job_id_ok(child_id)) {
      status = pcp_make_status(PCP_STATUS_INTERNAL,
                               "gateway %s accepted the job but its answer "
                               "has no usable job_id",
                               placement.gateway_id);
      child_id = NULL;
    }
  }
  pcp_status_t record = pcp_ok_status();
  if (child_id) {
    record = pcp_store_global_job_update(hub->store, number, "submitted",
                                         child_id, call.body, NULL);
  } else {
    char error[512];
    if (status) {
      pcp_status_format_for_user(status, error, sizeof(error));
    } else {
      snprintf(error, sizeof(error), "gateway %s answered HTTP %d",
               placement.gateway_id, call.http_status);
    }
    record = pcp_store_global_job_update(hub->store, number, "rejected", NULL,
                                         call.body, error);
  }
  if (record) {
    pcp_log_status(PCP_LOG_ERROR, &hub->log, record,
                   "recording global job state");
  }
  pcp_status_ignore(record);
  if (status) {
    pcp_roles_hub_call_deinitialize(&call);
    char message[512];
    pcp_status_format_for_user(status, message, sizeof(message));
    pcp_status_ignore(status);
    char full[700];
    snprintf(full, sizeof(full), GLOBAL_JOB_PREFIX "%lld rejected: %s",
             (long long)number, message);
    return pcp_http_response_error_set(response, 502, "GATEWAY_REQUEST_FAILED",
                                       full);
  }
  if (!child_id) {
    // The gateway refused it: its answer is relayed unchanged.
    status = relay(response, &call);
    pcp_roles_hub_call_deinitialize(&call);
    return status;
  }
  pcp_roles_hub_call_deinitialize(&call);
  pcp_store_global_job_t stored;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_global_job_get(hub->store, number, &stored));
  json_t* out = global_job_json(&stored);
  pcp_store_global_job_deinitialize(&stored);
  return pcp_http_response_json_take(response, 202, out);
}

static pcp_status_t training_submit(void* user_data,
                                    const pcp_http_request_t* request,
                                    pcp_http_response_t* response) {
  return submit(user_data, "training", request, response);
}

static pcp_status_t rl_submit(void* user_data,
                              const pcp_http_request_t* request,
                              pcp_http_response_t* response) {
  return submit(user_data, "rl", request, response);
}

//===----------------------------------------------------------------------===//
// Lookup, cancel
//===----------------------------------------------------------------------===//

static pcp_status_t job_load(pcp_roles_hub_t* hub,
                             const pcp_http_request_t* request,
                             pcp_store_global_job_t* out_job) {
  memset(out_job, 0, sizeof(*out_job));
  const char* id = pcp_http_request_param(request, "id");
  int64_t number = 0;
  if (!global_job_number_parse(id, &number)) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND,
                           "%s is not a global job id (global-job-N)", id);
  }
  return pcp_store_global_job_get(hub->store, number, out_job);
}

// Asks the job's gateway about it. OK with |out_call| filled when the
// gateway answered (any status); the transport error otherwise.
static pcp_status_t child_fetch(pcp_roles_hub_t* hub,
                                const pcp_store_global_job_t* job,
                                const char* suffix, const char* method,
                                const char* body, size_t body_length,
                                pcp_roles_hub_call_t* out_call) {
  const char* gateway_id =
      json_string_value(json_object_get(job->assignment, "gateway_id"));
  const char* recorded =
      json_string_value(json_object_get(job->assignment, "gateway_base_url"));
  char url[PCP_SCHED_FEDERATION_URL_MAX_LENGTH + 1];
  pcp_roles_hub_gateway_url(hub, gateway_id ? gateway_id : "",
                            recorded ? recorded : "", url);
  char path[PCP_STORE_ID_MAX_LENGTH + 64];
  snprintf(path, sizeof(path), "/v1/internal/federation/jobs/%s%s",
           job->child_job_id, suffix);
  return pcp_roles_hub_gateway_call(hub, method, url, path, body, body_length,
                                    out_call);
}

static bool has_child(const pcp_store_global_job_t* job) {
  return job->child_job_id[0] && (strcmp(job->state, "submitted") == 0 ||
                                  strcmp(job->state, "cancelling") == 0);
}

static pcp_status_t job_get(void* user_data, const pcp_http_request_t* request,
                            pcp_http_response_t* response) {
  pcp_roles_hub_t* hub = user_data;
  pcp_store_global_job_t job;
  PCP_RETURN_IF_ERROR_BARE(job_load(hub, request, &job));
  if (!has_child(&job)) {
    json_t* out = global_job_json(&job);
    pcp_store_global_job_deinitialize(&job);
    return pcp_http_response_json_take(response, 200, out);
  }
  pcp_roles_hub_call_t call;
  pcp_status_t status = child_fetch(hub, &job, "", "GET", NULL, 0, &call);
  if (status) {
    char message[512];
    pcp_status_format_for_user(status, message, sizeof(message));
    pcp_status_ignore(status);
    pcp_store_global_job_deinitialize(&job);
    return pcp_http_response_error_set(response, 502, "GATEWAY_REQUEST_FAILED",
                                       message);
  }
  if (call.http_status == 404) {
    pcp_roles_hub_call_deinitialize(&call);
    status = pcp_make_status(PCP_STATUS_NOT_FOUND,
                             "child job %s is unknown to its gateway",
                             job.child_job_id);
    pcp_store_global_job_deinitialize(&job);
    return status;
  }
  if (call.http_status != 200 || !call.body) {
    status = relay(response, &call);
    pcp_roles_hub_call_deinitialize(&call);
    pcp_store_global_job_deinitialize(&job);
    return status;
  }
  // The latest child answer is kept, so a lookup while the gateway is down
  // (GET /v1/jobs) still shows the last known state.
  pcp_status_ignore(pcp_store_global_job_update(
      hub->store, job.number, job.state, NULL, call.body, NULL));
  json_decref(job.child);
  job.child = json_incref(call.body);
  pcp_roles_hub_call_deinitialize(&call);
  json_t* out = global_job_json(&job);
  pcp_store_global_job_deinitialize(&job);
  return pcp_http_response_json_take(response, 200, out);
}

static pcp_status_t job_cancel(void* user_data,
                               const pcp_http_request_t* request,
                               pcp_http_response_t* response) {
  pcp_roles_hub_t* hub = user_data;
  pcp_store_global_job_t job;
  PCP_RETURN_IF_ERROR_BARE(job_load(hub, request, &job));
  if (!has_child(&job)) {
    pcp_status_t status = pcp_make_status(
        PCP_STATUS_FAILED_PRECONDITION,
        GLOBAL_JOB_PREFIX "%lld is %s: there is no child job to cancel",
        (long long)job.number, job.state);
    pcp_store_global_job_deinitialize(&job);
    return status;
  }
  pcp_string_view_t body = pcp_http_request_body(request);
  if (body.size) {
    json_t* parsed = NULL;
    pcp_status_t status = pcp_http_request_json_parse(request, &parsed);
    json_decref(parsed);
    if (status) {
      pcp_store_global_job_deinitialize(&job);
      return status;
    }
  }
  pcp_roles_hub_call_t call;
  pcp_status_t status =
      child_fetch(hub, &job, "/cancel", "POST", body.data, body.size, &call);
  if (status) {
    char message[512];
    pcp_status_format_for_user(status, message, sizeof(message));
    pcp_status_ignore(status);
    pcp_store_global_job_deinitialize(&job);
    return pcp_http_response_error_set(response, 502, "GATEWAY_REQUEST_FAILED",
                                       message);
  }
  if (call.http_status < 200 || call.http_status >= 300) {
    status = relay(response, &call);
    pcp_roles_hub_call_deinitialize(&call);
    pcp_store_global_job_deinitialize(&job);
    return status;
  }
  pcp_status_ignore(pcp_store_global_job_update(
      hub->store, job.number, "cancelling", NULL, call.body, NULL));
  int http_status = call.http_status;
  pcp_roles_hub_call_deinitialize(&call);
  pcp_store_global_job_t stored;
  status = pcp_store_global_job_get(hub->store, job.number, &stored);
  pcp_store_global_job_deinitialize(&job);
  PCP_RETURN_IF_ERROR_BARE(status);
  json_t* out = global_job_json(&stored);
  pcp_store_global_job_deinitialize(&stored);
  return pcp_http_response_json_take(response, http_status, out);
}

//===----------------------------------------------------------------------===//
// GET /v1/jobs: parallel fan-out
//===----------------------------------------------------------------------===//

typedef struct fanout_t {
  pcp_roles_hub_t* hub;
  pcp_store_global_job_list_t* jobs;
  json_t** fetch;  // one per job: {ok, http_status?, error?}
  json_t** child;  // one per job: the fresh answer or NULL
  pthread_mutex_t mutex;
  size_t next;
} fanout_t;

static void* fanout_main(void* opaque) {
  fanout_t* f = opaque;
  for (;;) {
    pthread_mutex_lock(&f->mutex);
    size_t i = f->next++;
    pthread_mutex_unlock(&f->mutex);
    if (i >= f->jobs->count) {
      return NULL;
    }
    const pcp_store_global_job_t* job = &f->jobs->items[i];
    if (!has_child(job)) {
      f->fetch[i] = json_pack("{s:b,s:s}", "ok", 1, "source", "hub");
      continue;
    }
    pcp_roles_hub_call_t call;
    pcp_status_t status = child_fetch(f->hub, job, "", "GET", NULL, 0, &call);
    if (status) {
      char message[512];
      pcp_status_format_for_user(status, message, sizeof(message));
      f->fetch[i] = json_pack("{s:b,s:s}", "ok", 0, "error", message);
    } else if (call.http_status != 200 || !call.body) {
      f->fetch[i] = json_pack(
          "{s:b,s:i,s:s}", "ok", 0, "http_status", call.http_status, "error",
          call.http_status == 404 ? "the gateway does not know the child job"
                                  : "the gateway did not answer 200 JSON");
    } else {
      f->fetch[i] = json_pack("{s:b,s:s}", "ok", 1, "source", "gateway");
      f->child[i] = json_incref(call.body);
    }
    pcp_status_ignore(status);
    pcp_roles_hub_call_deinitialize(&call);
  }
}

static pcp_status_t jobs_list(void* user_data,
                              const pcp_http_request_t* request,
                              pcp_http_response_t* response) {
  pcp_roles_hub_t* hub = user_data;
  int64_t after = 0;
  int64_t limit = PCP_ROLES_HUB_JOBS_PAGE_MAX;
  const char* after_text = pcp_http_request_query(request, "after");
  const char* limit_text = pcp_http_request_query(request, "limit");
  if (after_text && !(global_job_number_parse(after_text, &after) ||
                      (pcp_string_view_parse_int64(
                           pcp_make_cstring_view(after_text), &after) &&
                       after >= 0))) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "after must be a global job id or a number >= 0");
  }
  if (limit_text && (!pcp_string_view_parse_int64(
                         pcp_make_cstring_view(limit_text), &limit) ||
                     limit < 1 || limit > PCP_ROLES_HUB_JOBS_PAGE_MAX)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "limit must be 1..%u",
                           PCP_ROLES_HUB_JOBS_PAGE_MAX);
  }
  pcp_store_global_job_list_t jobs = {.allocator = hub->allocator};
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_global_job_list(hub->store, after, (uint32_t)limit, &jobs));
  fanout_t f = {.hub = hub, .jobs = &jobs};
  pthread_mutex_init(&f.mutex, NULL);
  pcp_status_t status = pcp_allocator_calloc(
      hub->allocator, (jobs.count + 1) * sizeof(json_t*), (void**)&f.fetch);
  if (!status) {
    status = pcp_allocator_calloc(
        hub->allocator, (jobs.count + 1) * sizeof(json_t*), (void**)&f.child);
  }
  if (status) {
    status = pcp_status_annotate_f(status, "job list");
  }
  if (!status) {
    // Every gateway request runs at once (up to the thread cap), each
    // bounded by --gateway-timeout-ms: the page takes about one timeout in
    // the worst case, not one per job (upstream asks one after another).
    pthread_t threads[PCP_ROLES_HUB_FANOUT_THREADS];
    size_t thread_count = 0;
    size_t wanted = jobs.count < PCP_ROLES_HUB_FANOUT_THREADS
                        ? jobs.count
                        : PCP_ROLES_HUB_FANOUT_THREADS;
    for (; thread_count < wanted; ++thread_count) {
      if (pthread_create(&threads[thread_count], NULL, fanout_main, &f) != 0) {
        break;
      }
    }
    if (thread_count == 0) {
      fanout_main(&f);  // no thread could start: fetch here, one by one
    }
    for (size_t t = 0; t < thread_count; ++t) {
      pthread_join(threads[t], NULL);
    }
  }
  json_t* list = json_array();
  int64_t failures = 0;
  for (size_t i = 0; !status && list && i < jobs.count; ++i) {
    pcp_store_global_job_t* job = &jobs.items[i];
    if (f.child[i]) {
      pcp_status_ignore(pcp_store_global_job_update(
          hub->store, job->number, job->state, NULL, f.child[i], NULL));
      json_decref(job->child);
      job->child = json_incref(f.child[i]);
    }
    json_t* entry = global_job_json(job);
    if (entry) {
      failures += !json_is_true(json_object_get(f.fetch[i], "ok"));
      json_object_set(entry, "fetch", f.fetch[i] ? f.fetch[i] : json_null());
      json_array_append_new(list, entry);
    }
  }
  for (size_t i = 0; i < jobs.count; ++i) {
    json_decref(f.fetch ? f.fetch[i] : NULL);
    json_decref(f.child ? f.child[i] : NULL);
  }
  int64_t next_after =
      jobs.count == (size_t)limit ? jobs.items[jobs.count - 1].number : 0;
  pcp_allocator_free(hub->allocator, f.fetch);
  pcp_allocator_free(hub->allocator, f.child);
  pthread_mutex_destroy(&f.mutex);
  pcp_store_global_job_list_deinitialize(&jobs);
  if (status) {
    json_decref(list);
    return status;
  }
  json_t* out = json_pack("{s:o*,s:I}", "jobs", list, "failed_fetches",
                          (json_int_t)failures);
  if (out && next_after) {
    json_object_set_new(out, "next_after", json_integer(next_after));
  }
  return pcp_http_response_json_take(response, 200, out);
}

pcp_status_t pcp_roles_hub_jobs_routes_add(pcp_roles_hub_t* hub) {
  const pcp_http_route_t routes[] = {
      {"POST", "/v1/training/jobs", PCP_ROLES_HUB_SCOPE_API, training_submit,
       hub, PCP_ROLES_HUB_MAX_BODY_BYTES, 0},
      {"POST", "/v1/rl/jobs", PCP_ROLES_HUB_SCOPE_API, rl_submit, hub,
       PCP_ROLES_HUB_MAX_BODY_BYTES, 0},
      {"GET", "/v1/jobs", PCP_ROLES_HUB_SCOPE_API, jobs_list, hub, 0, 0},
      {"GET", "/v1/jobs/{id}", PCP_ROLES_HUB_SCOPE_API, job_get, hub, 0, 0},
      {"POST", "/v1/jobs/{id}/cancel", PCP_ROLES_HUB_SCOPE_API, job_cancel, hub,
       PCP_ROLES_HUB_MAX_CANCEL_BODY_BYTES, 0},
  };
  return pcp_roles_hub_routes_add(hub, routes, PCP_ARRAYSIZE(routes));
}
