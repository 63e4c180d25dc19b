// SPDX-License-Identifier: Apache-2.0
// The gateway's side of the workloads (issue 14): the /v1/jobs handlers
// (parse the request, call the workloads JSON API, write the response), the
// workload runner's set-up with its kinds, and the housekeeping thread.
// The generic job itself (files, submission, compile threads, run) is
// src/workloads/jobs/jobs.c; its lifecycle is the runner's
// (src/workloads/runtime/runner.c).
//
// Handlers run on libmicrohttpd's threads and touch the store, the runner
// and the workloads API (all thread-safe), the answer cache under
// |cache_mu| and the gateway's atomics.

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "roles/gateway/gateway_impl.h"

//===----------------------------------------------------------------------===//
// The runner and its kinds
//===----------------------------------------------------------------------===//

// The runner's hooks: answers cached from the store are stale after every
// write; outcomes feed pcp_gateway_job_outcomes_total; no job starts while
// the gateway drains.
static void runner_changed(void* user_data, const char* job_id) {
  (void)job_id;
  pcp_roles_gateway_state_t* g = user_data;
  atomic_fetch_add(&g->job_generation, 1);
}

static void runner_outcome(void* user_data, const char* kind,
                           const char* outcome) {
  (void)kind;
  pcp_roles_gateway_state_t* g = user_data;
  pcp_obs_family_add(g->job_runs_family, (const char*[]){outcome}, 1);
}

static bool runner_draining(void* user_data) {
  pcp_roles_gateway_state_t* g = user_data;
  return atomic_load(&g->draining);
}

pcp_status_t pcp_roles_gateway_jobs_recover(pcp_roles_gateway_state_t* g) {
  pcp_workloads_jobs_options_t jobs_options = {
      .store = g->store,
      .state_dir = g->config->file.state_dir,
      .clock = g->clock,
      .log = g->log,
  };
  PCP_RETURN_IF_ERROR_BARE(
      pcp_workloads_jobs_create(&jobs_options, g->allocator, &g->jobs));
  // The kinds the runner schedules; adding one (RL, #16) is one line here.
  const pcp_workloads_kind_t kinds[] = {
      pcp_workloads_jobs_kind(g->jobs),
      pcp_workloads_train_kind(&g->train_kind),
      pcp_infer_kind(&g->infer_kind),
      pcp_workloads_rl_kind(&g->rl_kind),
  };
  pcp_workloads_runner_options_t options = {
      .store = g->store,
      .clock = g->clock,
      .log = g->log,
      .kinds = kinds,
      .kind_count = PCP_ARRAYSIZE(kinds),
      .hooks = {.changed = runner_changed,
                .outcome = runner_outcome,
                .draining = runner_draining,
                .user_data = g},
  };
  PCP_RETURN_IF_ERROR_BARE(
      pcp_workloads_runner_create(&options, g->allocator, &g->runner));
  g->infer_kind.runner = g->runner;
  g->infer_kind.store = g->store;
  // Jobs caught mid-flight by a crash or a stop: re-run or finish cancel.
  return pcp_workloads_runner_recover(g->runner);
}

pcp_status_t pcp_roles_gateway_jobs_kind_start(pcp_roles_gateway_state_t* g) {
  return pcp_workloads_jobs_start(g->jobs, g->fabric, g->compile_queue);
}

void pcp_roles_gateway_jobs_kind_stop(pcp_roles_gateway_state_t* g) {
  if (g->jobs) {
    pcp_workloads_jobs_stop(g->jobs);
  }
}

void pcp_roles_gateway_jobs_active_free(pcp_roles_gateway_state_t* g) {
  pcp_workloads_runner_release(g->runner);
  g->runner = NULL;
  pcp_workloads_jobs_release(g->jobs);
  g->jobs = NULL;
}

json_t* pcp_roles_gateway_job_json(const pcp_store_job_t* job) {
  return pcp_workloads_job_json(job);
}

//===----------------------------------------------------------------------===//
// Submission
//===----------------------------------------------------------------------===//

// A raw body is the program itself; the rest comes from the query string.
static pcp_status_t submission_from_raw(const pcp_http_request_t* request,
                                        json_t** out_body) {
  pcp_string_view_t body = pcp_http_request_body(request);
  const char* format = pcp_http_request_query(request, "format");
  if (!format) {
    const char* type = pcp_http_request_header(request, "Content-Type");
    format = type && strncmp(type, "text/", 5) == 0 ? "stablehlo" : "vmfb";
  }
  // The raw form becomes the JSON form (the raw bytes re-encoded only in
  // memory): one validation path for both, in the workloads API.
  json_t* fake = json_object();
  json_t* program = json_object();
  json_object_set_new(fake, "program", program);
  json_object_set_new(program, "format", json_string(format));
  if (strcmp(format, "stablehlo") == 0) {
    json_object_set_new(program, "text",
                        json_stringn((const char*)body.data, body.size));
  } else {
    char* text = NULL;
    size_t n = 0;
    pcp_status_t status = pcp_base64_encode(pcp_allocator_system(), body.data,
                                            body.size, &text, &n);
    if (status) {
      json_decref(fake);
      return status;
    }
    json_object_set_new(program, "base64", json_stringn(text, n));
    pcp_allocator_free(pcp_allocator_system(), text);
  }
  const char* function = pcp_http_request_query(request, "function");
  if (function) {
    json_object_set_new(fake, "function", json_string(function));
  }
  json_t* placement = json_object();
  json_object_set_new(fake, "placement", placement);
  const char* keys[] = {"backend", "target"};
  for (size_t i = 0; i < 2; ++i) {
    const char* v = pcp_http_request_query(request, keys[i]);
    if (v) {
      json_object_set_new(placement, keys[i], json_string(v));
    }
  }
  const char* workers = pcp_http_request_query(request, "workers");
  if (workers) {
    char* end = NULL;
    long long w = strtoll(workers, &end, 10);
    json_object_set_new(placement, "workers",
                        end && *end == 0 ? json_integer(w) : json_string(""));
  }
  *out_body = fake;
  return pcp_ok_status();
}

pcp_status_t pcp_roles_gateway_job_submit(void* user_data,
                                          const pcp_http_request_t* request,
                                          pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  if (atomic_load(&g->draining)) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE,
                           "the gateway is draining; submit elsewhere");
  }
  const char* type = pcp_http_request_header(request, "Content-Type");
  // A raw body is the program itself (octet-stream: VMFB or text; text/*:
  // StableHLO); anything else is the JSON form.
  bool raw = type && (strncmp(type, "application/octet-stream", 24) == 0 ||
                      strncmp(type, "text/", 5) == 0);
  json_t* body = NULL;
  PCP_RETURN_IF_ERROR_BARE(raw ? submission_from_raw(request, &body)
                               : pcp_http_request_json_parse(request, &body));
  json_t* out = NULL;
  pcp_status_t status =
      pcp_workloads_jobs_submit(g->jobs, g->runner, body, &out);
  json_decref(body);
  PCP_RETURN_IF_ERROR_BARE(status);
  char location[128];
  snprintf(location, sizeof(location), "/v1/jobs/%s",
           json_string_value(json_object_get(out, "job_id")));
  status = pcp_http_response_header_add(response, "Location", location);
  if (status) {
    json_decref(out);
    return status;
  }
  return pcp_http_response_json_take(response, 202, out);
}

//===----------------------------------------------------------------------===//
// Queries and cancel
//===----------------------------------------------------------------------===//

pcp_status_t pcp_roles_gateway_job_list(void* user_data,
                                        const pcp_http_request_t* request,
                                        pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  pcp_store_job_filter_t filter = {0};
  const char* states = pcp_http_request_query(request, "state");
  if (states) {
    const char* p = states;
    while (*p) {
      const char* comma = strchr(p, ',');
      size_t n = comma ? (size_t)(comma - p) : strlen(p);
      pcp_store_job_state_t state;
      if (!pcp_store_job_state_parse((pcp_string_view_t){p, n}, &state)) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "query 'state': unknown state '%.*s'", (int)n,
                               p);
      }
      filter.states |= PCP_STORE_JOB_STATE_BIT(state);
      p += n + (comma ? 1 : 0);
    }
  }
  filter.kind = pcp_http_request_query(request, "kind");
  filter.after_id = pcp_http_request_query(request, "after");
  const char* limit = pcp_http_request_query(request, "limit");
  if (limit) {
    char* end = NULL;
    long long v = strtoll(limit, &end, 10);
    if (!end || *end || v < 1 || v > PCP_STORE_LIST_LIMIT_MAX) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "query 'limit' must be an integer in [1, %u]",
                             PCP_STORE_LIST_LIMIT_MAX);
    }
    filter.limit = (uint32_t)v;
  }
  pcp_store_job_list_t list = {0};
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_list(g->store, &filter, &list));
  json_t* jobs = json_array();
  for (size_t i = 0; i < list.count; ++i) {
    json_t* one = pcp_workloads_job_json(&list.items[i]);
    if (one) {
      pcp_roles_gateway_training_json_merge(g, one);
    }
    json_array_append_new(jobs, one);
  }
  pcp_store_job_list_deinitialize(&list);
  return pcp_http_response_json_take(response, 200,
                                     json_pack("{s:o}", "jobs", jobs));
}

static size_t cache_slot(const char* id) {
  // FNV-1a: ids are short and this runs per request.
  uint64_t h = UINT64_C(1469598103934665603);
  for (const char* p = id; *p; ++p) {
    h = (h ^ (uint8_t)*p) * UINT64_C(1099511628211);
  }
  return (size_t)(h % PCP_GATEWAY_JOB_CACHE_SLOTS);
}

pcp_status_t pcp_roles_gateway_job_get(void* user_data,
                                       const pcp_http_request_t* request,
                                       pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  // Job polling is the hot read: the answer is served from memory while no
  // job was written since it was built (bench/http), else from the store.
  bool cacheable = strlen(id) < sizeof(g->job_cache[0].id);
  size_t slot = cacheable ? cache_slot(id) : 0;
  uint64_t generation = atomic_load(&g->job_generation);
  if (cacheable) {
    pthread_mutex_lock(&g->cache_mu);
    pcp_roles_gateway_job_cache_entry_t* e = &g->job_cache[slot];
    if (e->json && e->generation == generation && strcmp(e->id, id) == 0) {
      pcp_status_t status = pcp_http_response_body_set(
          response, 200, "application/json", e->json, e->length);
      pthread_mutex_unlock(&g->cache_mu);
      return status;
    }
    pthread_mutex_unlock(&g->cache_mu);
  }
  pcp_store_job_t job;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_get(g->store, id, &job));
  // An inference job's live numbers (requests, tokens) change without a
  // job write: never cached.
  cacheable = cacheable && strcmp(job.kind, "inference") != 0;
  json_t* out = pcp_workloads_job_json(&job);
  pcp_store_job_deinitialize(&job);
  if (out) {
    pcp_roles_gateway_training_json_merge(g, out);
  }
  char* text = out ? json_dumps(out, JSON_COMPACT) : NULL;
  json_decref(out);
  if (!text) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "oom");
  }
  size_t length = strlen(text);
  pcp_status_t status = pcp_http_response_body_set(
      response, 200, "application/json", text, length);
  if (cacheable) {
    // Tagged with the generation read BEFORE the store read: a write in
    // between makes the entry stale at once, never wrongly fresh.
    pthread_mutex_lock(&g->cache_mu);
    pcp_roles_gateway_job_cache_entry_t* e = &g->job_cache[slot];
    pcp_libc_free(e->json);
    snprintf(e->id, sizeof(e->id), "%s", id);
    e->generation = generation;
    e->json = text;
    e->length = length;
    text = NULL;
    pthread_mutex_unlock(&g->cache_mu);
  }
  pcp_libc_free(text);
  return status;
}

void pcp_roles_gateway_jobs_cache_free(pcp_roles_gateway_state_t* g) {
  for (size_t i = 0; i < PCP_GATEWAY_JOB_CACHE_SLOTS; ++i) {
    pcp_libc_free(g->job_cache[i].json);
    g->job_cache[i].json = NULL;
  }
}

pcp_status_t pcp_roles_gateway_job_cancel(void* user_data,
                                          const pcp_http_request_t* request,
                                          pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  // The runner's cancel: the store arbitrates a race with the job's own
  // moves; a running job is woken through its condition variable.
  pcp_store_job_state_t state = PCP_STORE_JOB_STATE_QUEUED;
  bool changed = false;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_workloads_runner_job_cancel(g->runner, id, &state, &changed));
  if (!changed) {
    return pcp_http_response_json_take(
        response, 200,
        json_pack("{s:b, s:s, s:s}", "accepted",
                  state == PCP_STORE_JOB_STATE_CANCELLING, "status",
                  pcp_store_job_state_name(state), "job_id", id));
  }
  return pcp_http_response_json_take(
      response, state == PCP_STORE_JOB_STATE_CANCELLING ? 202 : 200,
      json_pack("{s:b, s:s, s:s}", "accepted", 1, "status",
                pcp_store_job_state_name(state), "job_id", id));
}

pcp_status_t pcp_roles_gateway_job_events(void* user_data,
                                          const pcp_http_request_t* request,
                                          pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  pcp_store_job_t job;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_get(g->store, id, &job));
  pcp_store_job_deinitialize(&job);
  // ?after=EVENT_ID pages on: one answer holds at most
  // PCP_STORE_LIST_LIMIT_MAX events ("more" says another page follows).
  int64_t after = 0;
  const char* after_text = pcp_http_request_query(request, "after");
  if (after_text) {
    char* end = NULL;
    errno = 0;
    long long v = strtoll(after_text, &end, 10);
    if (!after_text[0] || !end || *end || v < 0 || errno == ERANGE) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "query 'after' must be an event id in [0, "
                             "9223372036854775807]");
    }
    after = v;
  }
  pcp_store_job_event_list_t list = {0};
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_event_list(
      g->store, after, id, PCP_STORE_LIST_LIMIT_MAX, &list));
  json_t* events = json_array();
  for (size_t i = 0; i < list.count; ++i) {
    json_array_append_new(events, pcp_workloads_job_event_json(&list.items[i]));
  }
  bool more = list.count == PCP_STORE_LIST_LIMIT_MAX;
  pcp_store_job_event_list_deinitialize(&list);
  return pcp_http_response_json_take(
      response, 200, json_pack("{s:o, s:b}", "events", events, "more", more));
}

pcp_status_t pcp_roles_gateway_job_results(void* user_data,
                                           const pcp_http_request_t* request,
                                           pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  pcp_store_job_t job;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_get(g->store, id, &job));
  pcp_store_job_deinitialize(&job);
  pcp_store_job_result_list_t list = {0};
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_result_list(g->store, id, &list));
  json_t* results = json_array();
  for (size_t i = 0; i < list.count; ++i) {
    json_array_append_new(results,
                          pcp_workloads_job_result_json(&list.items[i]));
  }
  pcp_store_job_result_list_deinitialize(&list);
  return pcp_http_response_json_take(response, 200,
                                     json_pack("{s:o}", "results", results));
}

pcp_status_t pcp_roles_gateway_job_result_get(void* user_data,
                                              const pcp_http_request_t* request,
                                              pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  const char* name = pcp_http_request_param(request, "name");
  const char* format = pcp_http_request_query(request, "format");
  if (format && strcmp(format, "raw") != 0 && strcmp(format, "npy") != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "query 'format' must be raw or npy");
  }
  pcp_store_job_result_t r;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_result_get(g->store, id, name, &r));
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&r.sha256, hex);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_http_response_header_add(response, "X-Content-SHA256", hex));
  if (!format || strcmp(format, "raw") == 0) {
    return pcp_http_response_file_set(response, 200, "application/octet-stream",
                                      r.path);
  }
  // The .npy file is unlinked once opened for the response (the open
  // descriptor keeps it readable).
  char path[4096];
  pcp_status_t status =
      pcp_workloads_jobs_result_npy_write(g->jobs, &r, path, sizeof(path));
  if (!status) {
    status = pcp_http_response_file_set(response, 200,
                                        "application/octet-stream", path);
  }
  unlink(path);
  return status;
}

//===----------------------------------------------------------------------===//
// Housekeeping
//===----------------------------------------------------------------------===//

void pcp_roles_gateway_jobs_metrics_update(pcp_roles_gateway_state_t* g) {
  int64_t counts[PCP_STORE_JOB_STATE_COUNT_] = {0};
  char after[PCP_STORE_ID_MAX_LENGTH + 1] = "";
  for (;;) {
    pcp_store_job_filter_t filter = {.after_id = after[0] ? after : NULL,
                                     .limit = PCP_STORE_LIST_LIMIT_MAX};
    pcp_store_job_list_t list = {0};
    pcp_status_t status = pcp_store_job_list(g->store, &filter, &list);
    if (status) {
      pcp_status_ignore(status);
      return;
    }
    for (size_t i = 0; i < list.count; ++i) {
      ++counts[list.items[i].state];
    }
    size_t count = list.count;
    if (count) {
      snprintf(after, sizeof(after), "%s", list.items[count - 1].id);
    }
    pcp_store_job_list_deinitialize(&list);
    if (count < PCP_STORE_LIST_LIMIT_MAX) {
      break;
    }
  }
  for (int s = 0; s < PCP_STORE_JOB_STATE_COUNT_; ++s) {
    const char* labels[] = {pcp_store_job_state_name((pcp_store_job_state_t)s)};
    pcp_obs_family_set(g->jobs_family, labels, (double)counts[s]);
  }
}

static void worker_counts_watch(pcp_roles_gateway_state_t* g) {
  char data[256];
  uint32_t counts[PCP_FABRIC_WORKER_STATE_COUNT_];
  bool changed = false;
  for (int s = 0; s < PCP_FABRIC_WORKER_STATE_COUNT_; ++s) {
    counts[s] =
        pcp_fabric_worker_count(g->fabric, (pcp_fabric_worker_state_t)s);
    changed = changed || counts[s] != g->last_worker_counts[s];
    g->last_worker_counts[s] = counts[s];
  }
  if (changed) {
    snprintf(
        data, sizeof(data), "{\"connected\":%u,\"draining\":%u,\"lost\":%u}",
        counts[PCP_FABRIC_WORKER_CONNECTED], counts[PCP_FABRIC_WORKER_DRAINING],
        counts[PCP_FABRIC_WORKER_LOST]);
    pcp_roles_gateway_events_broadcast(g, "workers", data);
  }
}

// Deletes services whose TTL ran out (reads already hide them) and tells
// event streams, so registrations do not pile up in the store.
static void services_sweep(pcp_roles_gateway_state_t* g) {
  for (int round = 0; round < 16; ++round) {
    pcp_store_service_list_t expired = {0};
    pcp_status_t status = pcp_store_service_expired_sweep(g->store, &expired);
    if (status) {
      pcp_status_ignore(status);
      return;
    }
    for (size_t i = 0; i < expired.count; ++i) {
      json_t* data = json_pack(
          "{s:s, s:s, s:s}", "executor_id", expired.items[i].executor_id,
          "service_type", expired.items[i].service_type, "status", "expired");
      char* text = data ? json_dumps(data, JSON_COMPACT) : NULL;
      if (text) {
        pcp_roles_gateway_events_broadcast(g, "service", text);
      }
      pcp_libc_free(text);
      json_decref(data);
    }
    size_t count = expired.count;
    pcp_store_service_list_deinitialize(&expired);
    if (count < PCP_STORE_LIST_LIMIT_MAX) {
      return;
    }
  }
}

void* pcp_roles_gateway_housekeeping_main(void* opaque) {
  pcp_roles_gateway_state_t* g = opaque;
  int64_t next_metrics_ns = 0;
  while (!atomic_load(&g->stopping)) {
    worker_counts_watch(g);
    int64_t now = pcp_clock_now_ns(g->clock);
    if (now >= next_metrics_ns) {
      pcp_roles_gateway_jobs_metrics_update(g);
      services_sweep(g);
      next_metrics_ns = now + INT64_C(1000000000);
    }
    pthread_mutex_lock(&g->mu);
    if (!atomic_load(&g->stopping)) {
      struct timespec deadline = pcp_realtime_deadline_ms(50);
      pthread_cond_timedwait(&g->cv, &g->mu, &deadline);
    }
    pthread_mutex_unlock(&g->mu);
  }
  return NULL;
}
