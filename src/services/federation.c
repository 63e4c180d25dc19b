// SPDX-License-Identifier: Apache-2.0
// The gateway's federation client (docs/federation.md "Gateway federation
// client"): the connect loop to the hub, what it advertises, the
// /v1/federation/* and /v1/capabilities routes. The internal routes the hub
// calls for the jobs it places here are the gateway's (they submit to its
// training workload).
//
// Threads: one federation thread (the connect loop) writes the link state;
// HTTP handler threads read it. Everything they share lives in
// pcp_services_federation_t under |mu|; the thread waits on |cv| so a
// stop wakes it at once instead of waiting out a backoff.
//
// Upstream's loop (reference/upstream-control-plane.md s.6.1) retried every
// interval with no backoff and ran whenever an endpoint resolved, even with
// `federation.enabled: false`. Here a disabled federation never connects,
// and failures back off exponentially with jitter, so a hub coming back
// after an outage is not met by every gateway at the same instant.

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "services/services_impl.h"

// Services advertised per connect, embedded and registered together (the
// hub refuses more: PCP_SCHED_FEDERATION_MAX_SERVICES).
#define FEDERATION_MAX_SERVICES 64u
// Distinct (backend, target) groups advertised.
#define FEDERATION_MAX_GROUPS 32u
// Largest connect reply kept (peers and their services).
#define FEDERATION_MAX_REPLY_BYTES ((size_t)4 << 20)
// Longest upstream URL / advertised URL.
#define FEDERATION_MAX_URL_BYTES 1024u
// Backoff ceiling whatever the interval.
#define FEDERATION_MAX_BACKOFF_MS 60000

struct pcp_services_federation_t {
  pcp_services_t* g;
  bool enabled;
  char* upstream;  // no trailing '/'; NULL when none configured
  char* token;     // federation token (from the environment); NULL: none
  int64_t interval_ms;
  pcp_rng_t rng;  // jitter; federation thread only

  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  bool thread_started;
  // Guarded by |mu|.
  bool stop;
  bool wake;  // POST /v1/federation/connect: connect now, skip the wait
  char advertise_url[FEDERATION_MAX_URL_BYTES];
  const char* status;  // disabled | connecting | connected | disconnected
  char last_error[512];
  char last_step_error[512];
  int64_t last_sync_at_ns;     // wall; 0: never
  int64_t last_attempt_at_ns;  // wall; 0: never
  int64_t next_attempt_at_ns;  // wall; 0: none planned
  int64_t backoff_ms;          // the wait before the next attempt
  uint32_t consecutive_failures;
  uint64_t connect_count;
  uint64_t failure_count;
  json_t* peers;  // array of gateway records from the last reply
  json_t* self;   // the hub's record of this gateway, or NULL
};

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

static json_t* ms_or_null(int64_t ns) {
  return ns ? json_integer(ns / 1000000) : json_null();
}

static const char* service_id_of(const pcp_services_t* g, const char* kind) {
  if (strcmp(kind, "rl") == 0) {
    return g->config.rl_service_id ? g->config.rl_service_id : "rl-main";
  }
  return strcmp(kind, "training") == 0 ? g->config.training_service_id
                                       : g->config.inference_service_id;
}

// Connected workers by (backend, target), from one fabric snapshot.
typedef struct worker_group_t {
  char backend[16];
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];
  uint32_t connected;  // fabric state connected
  uint32_t ready;      // connected and not draining
  uint32_t available;  // ready and idle (no lease, nothing in flight)
} worker_group_t;

static uint32_t worker_groups_query(pcp_services_t* g, worker_group_t* groups,
                                    uint32_t capacity) {
  if (!g->fabric) {
    return 0;
  }
  pcp_fabric_worker_info_t* infos = NULL;
  pcp_status_t status = pcp_allocator_calloc(
      g->allocator, PCP_SERVICES_MAX_LISTED_WORKERS * sizeof(*infos),
      (void**)&infos);
  if (status) {
    pcp_status_ignore(status);
    return 0;
  }
  uint32_t count = pcp_fabric_worker_list(
      g->fabric, infos, PCP_SERVICES_MAX_LISTED_WORKERS, NULL);
  uint32_t group_count = 0;
  for (uint32_t i = 0; i < count; ++i) {
    const pcp_fabric_worker_info_t* w = &infos[i];
    if (w->state != PCP_FABRIC_WORKER_CONNECTED) {
      continue;
    }
    uint32_t k = 0;
    while (k < group_count && (strcmp(groups[k].backend, w->backend) != 0 ||
                               strcmp(groups[k].target, w->target) != 0)) {
      ++k;
    }
    if (k == group_count) {
      if (group_count == capacity) {
        continue;  // more groups than we advertise: the first ones win
      }
      memset(&groups[k], 0, sizeof(groups[k]));
      snprintf(groups[k].backend, sizeof(groups[k].backend), "%s", w->backend);
      snprintf(groups[k].target, sizeof(groups[k].target), "%s", w->target);
      ++group_count;
    }
    ++groups[k].connected;
    if (w->sched_state == PCP_SCHED_WORKER_STATE_READY ||
        w->sched_state == PCP_SCHED_WORKER_STATE_BUSY) {
      ++groups[k].ready;
    }
    if (w->sched_state == PCP_SCHED_WORKER_STATE_READY && w->in_flight == 0) {
      ++groups[k].available;
    }
  }
  pcp_allocator_free(g->allocator, infos);
  return group_count;
}

static json_t* groups_json(const worker_group_t* groups, uint32_t count) {
  json_t* out = json_array();
  for (uint32_t i = 0; out && i < count; ++i) {
    json_array_append_new(
        out, json_pack("{s:s, s:s, s:i, s:i, s:i}", "backend",
                       groups[i].backend, "target", groups[i].target,
                       "workers_connected", (int)groups[i].connected,
                       "workers_ready", (int)groups[i].ready,
                       "workers_available", (int)groups[i].available));
  }
  return out;
}

// One embedded-service advertisement: the upstream Service record shape
// (s.3.1), counts for one (backend, target) group or for |group| NULL (no
// worker: zero counts, no class or target, so placement by target never
// picks it).
static json_t* advertisement_json(pcp_services_t* g, const char* base_url,
                                  const char* kind, const worker_group_t* group,
                                  json_t* capabilities) {
  const char* service_id = service_id_of(g, kind);
  char executor_id[512];
  if (group) {
    snprintf(executor_id, sizeof(executor_id), "%s:%s:%s:%s%s%s",
             g->config.gateway_id, kind, service_id, group->backend,
             group->target[0] ? ":" : "", group->target);
  } else {
    snprintf(executor_id, sizeof(executor_id), "%s:%s:%s", g->config.gateway_id,
             kind, service_id);
  }
  uint32_t connected = group ? group->connected : 0;
  uint32_t ready = group ? group->ready : 0;
  uint32_t available = group ? group->available : 0;
  bool draining = pcp_services_draining(g);
  json_t* out = json_pack(
      "{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, "
      "s:o, s:b}",
      "service_id", service_id, "executor_id", executor_id, "service_type",
      kind, "base_url", base_url, "auth_mode", "federation_token",
      "health_status", draining ? "draining" : "ok", "job_status", "running",
      "worker_count", (int)connected, "ready_worker_count", (int)available,
      "workers_connected", (int)connected, "workers_ready", (int)ready,
      "workers_available", (int)available, "workers_dispatchable",
      (int)available, "capabilities", capabilities, "embedded", true);
  if (out && group) {
    json_object_set_new(out, "worker_class", json_string(group->backend));
    // Workers that joined without a target have none: no target_arch, so a
    // placement that names one never picks them (the worker scheduler's
    // rule, sched.h).
    if (group->target[0]) {
      json_object_set_new(out, "target_arch", json_string(group->target));
    }
  }
  return out;
}

static json_t* training_capabilities(void) {
  return json_pack("[s, s, s]", "training.regular", "training.decoupled_diloco",
                   "training.streaming_diloco");
}

// Every service this gateway has: the embedded training service (one
// record per (backend, target) of the connected workers), the embedded
// inference engine when it serves a model, and the registry's services.
static json_t* services_json(pcp_services_t* g, const char* base_url,
                             json_t** out_groups) {
  worker_group_t groups[FEDERATION_MAX_GROUPS];
  uint32_t group_count = worker_groups_query(g, groups, FEDERATION_MAX_GROUPS);
  if (out_groups) {
    *out_groups = groups_json(groups, group_count);
  }
  json_t* services = json_array();
  if (!services) {
    return NULL;
  }
  if (group_count == 0) {
    json_array_append_new(services,
                          advertisement_json(g, base_url, "training", NULL,
                                             training_capabilities()));
  }
  for (uint32_t i = 0; i < group_count; ++i) {
    json_array_append_new(
        services, advertisement_json(g, base_url, "training", &groups[i],
                                     training_capabilities()));
  }
  // The embedded RL service (GRPO jobs, POST /v1/internal/federation/rl/
  // jobs): the same workers as training, so the same records (at most
  // half the groups', so training, inference and registered services
  // stay under FEDERATION_MAX_SERVICES).
  if (group_count == 0) {
    json_array_append_new(services,
                          advertisement_json(g, base_url, "rl", NULL,
                                             json_pack("[s]", "rl.grpo")));
  }
  for (uint32_t i = 0; i < group_count && i < FEDERATION_MAX_GROUPS / 2; ++i) {
    json_array_append_new(services,
                          advertisement_json(g, base_url, "rl", &groups[i],
                                             json_pack("[s]", "rl.grpo")));
  }
  if (g->infer) {
    pcp_infer_readiness_t r;
    pcp_infer_service_readiness(g->infer, &r);
    if (r.models_ready > 0) {
      // One record over every group: the engine schedules a model on any
      // worker it was compiled for.
      worker_group_t all = {0};
      for (uint32_t i = 0; i < group_count; ++i) {
        all.connected += groups[i].connected;
        all.ready += groups[i].ready;
        all.available += groups[i].available;
      }
      json_t* ad =
          advertisement_json(g, base_url, "inference", NULL,
                             json_pack("[s]", "inference.chat_completions"));
      if (ad) {
        json_object_set_new(ad, "workers_connected",
                            json_integer(all.connected));
        json_object_set_new(ad, "worker_count", json_integer(all.connected));
        json_object_set_new(ad, "workers_ready", json_integer(all.ready));
        json_object_set_new(ad, "models_ready", json_integer(r.models_ready));
      }
      json_array_append_new(services, ad);
    }
  }
  // Services registered through /v1/services/register (not expired).
  pcp_store_service_list_t list = {0};
  size_t room = FEDERATION_MAX_SERVICES - json_array_size(services);
  if (g->store && room > 0 &&
      !pcp_store_service_list(g->store, NULL, (uint32_t)room, &list)) {
    for (size_t i = 0; i < list.count; ++i) {
      const pcp_store_service_t* s = &list.items[i];
      if (s->expired) {
        continue;
      }
      json_t* out = json_deep_copy(s->attributes);
      if (!json_is_object(out)) {
        json_decref(out);
        out = json_object();
      }
      json_object_set_new(out, "service_id", json_string(s->service_id));
      json_object_set_new(out, "executor_id", json_string(s->executor_id));
      json_object_set_new(out, "service_type", json_string(s->service_type));
      json_object_set_new(out, "base_url", json_string(s->base_url));
      json_object_set_new(out, "embedded", json_false());
      json_array_append_new(services, out);
    }
  }
  pcp_store_service_list_deinitialize(&list);
  return services;
}

// The upstream connect body (s.6.1) with our additions: the worker groups,
// and heartbeat_interval_ms so the hub can tell when we are late.
static json_t* connect_body(pcp_services_federation_t* f,
                            const char* base_url) {
  pcp_services_t* g = f->g;
  json_t* groups = NULL;
  json_t* services = services_json(g, base_url, &groups);
  if (!services) {
    json_decref(groups);
    return NULL;
  }
  pcp_store_mutation_log_stats_t stats = {0};
  if (g->store) {
    pcp_status_ignore(pcp_store_mutation_log_stats_query(g->store, &stats));
  }
  json_t* body = json_pack(
      "{s:s, s:s, s:s, s:s, s:I, s:O, s:o, s:I, s:I, s:s, s:I}", "gateway_id",
      g->config.gateway_id, "lab_id", g->config.lab_id, "base_url", base_url,
      "graph_backend",
      g->graph ? pcp_store_graph_backend_name(g->graph) : "sqlite",
      "registered_services", (json_int_t)json_array_size(services), "services",
      services, "workers", groups ? groups : json_array(), "last_sequence_no",
      (json_int_t)stats.last_sequence_no, "last_replicated_sequence",
      (json_int_t)stats.last_replicated_sequence, "status", "connected",
      "heartbeat_interval_ms", (json_int_t)f->interval_ms);
  json_decref(services);
  return body;
}

//===----------------------------------------------------------------------===//
// The connect loop
//===----------------------------------------------------------------------===//

// The wait before retry |failures| (1, 2, ...): half the interval, doubled
// per failure, capped at max(interval, min(8 x interval, 60 s)), then
// scaled by a random factor in [0.5, 1] ("equal jitter"), so it never drops
// to zero and gateways that failed together spread out.
static int64_t backoff_ms(pcp_services_federation_t* f, uint32_t failures) {
  int64_t cap = f->interval_ms * 8;
  if (cap > FEDERATION_MAX_BACKOFF_MS) {
    cap = FEDERATION_MAX_BACKOFF_MS;
  }
  if (cap < f->interval_ms) {
    cap = f->interval_ms;
  }
  int64_t delay = f->interval_ms / 2;
  if (delay < 1) {
    delay = 1;
  }
  for (uint32_t i = 1; i < failures && delay < cap; ++i) {
    delay *= 2;
  }
  if (delay > cap) {
    delay = cap;
  }
  double factor = 0.5 + 0.5 * pcp_rng_next_double(&f->rng);
  int64_t jittered = (int64_t)((double)delay * factor);
  return jittered < 1 ? 1 : jittered;
}

static void error_set(char* slot, size_t capacity, const char* prefix,
                      pcp_status_t status) {
  snprintf(slot, capacity, "%s%s: %s", prefix,
           pcp_status_code_string(pcp_status_code(status)),
           pcp_status_message(status));
}

// One connect: POST the advertisement, keep the reply's peers. The reply
// (new reference) goes to |out_answer| for the step.
static pcp_status_t connect_once(pcp_services_federation_t* f,
                                 pcp_http_client_t* client,
                                 json_t** out_answer) {
  *out_answer = NULL;
  char base_url[FEDERATION_MAX_URL_BYTES];
  pthread_mutex_lock(&f->mu);
  snprintf(base_url, sizeof(base_url), "%s", f->advertise_url);
  pthread_mutex_unlock(&f->mu);
  json_t* body = connect_body(f, base_url);
  char* text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  if (!text) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "connect body");
  }
  char url[FEDERATION_MAX_URL_BYTES + 64];
  snprintf(url, sizeof(url), "%s/v1/federation/connect", f->upstream);
  const char* headers[] = {"Content-Type: application/json",
                           "Accept: application/json", NULL};
  pcp_http_client_request_t request = {
      .method = "POST",
      .url = url,
      .headers = headers,
      .bearer_token = f->token,
      .body = text,
      .body_length = strlen(text),
  };
  pcp_http_client_response_t response;
  pcp_status_t status = pcp_http_client_send(client, &request, &response);
  pcp_libc_free(text);
  if (status) {
    return pcp_status_annotate_f(status, "POST %s", url);
  }
  json_t* answer = NULL;
  if (response.http_status < 200 || response.http_status > 299) {
    // The hub's JSON error message when there is one, else the status.
    json_t* err = json_loads(response.body ? response.body : "", 0, NULL);
    const char* message = json_string_value(
        json_object_get(json_object_get(err, "error"), "message"));
    status = pcp_make_status(
        response.http_status == 401 || response.http_status == 403
            ? PCP_STATUS_UNAUTHENTICATED
            : PCP_STATUS_UNAVAILABLE,
        "hub answered %d to POST %s%s%s", response.http_status, url,
        message ? ": " : "", message ? message : "");
    json_decref(err);
  } else {
    json_error_t error;
    answer = json_loadb(response.body ? response.body : "",
                        response.body_length, 0, &error);
    if (!json_is_object(answer)) {
      status = pcp_make_status(PCP_STATUS_UNAVAILABLE,
                               "hub answered POST %s with no JSON object", url);
    }
  }
  pcp_http_client_response_deinitialize(&response);
  if (status) {
    json_decref(answer);
    return status;
  }
  // Peers: {peers:{gateways:[...]}} (upstream) or {gateways:[...]}.
  json_t* peers = json_object_get(json_object_get(answer, "peers"), "gateways");
  if (!json_is_array(peers)) {
    peers = json_object_get(answer, "gateways");
  }
  json_t* self = json_object_get(answer, "gateway");
  // Copies, not references: the handlers read these under |mu| while the
  // step reads |answer| without it, so the two never share a value.
  json_t* peers_kept = json_is_array(peers) ? json_deep_copy(peers) : NULL;
  json_t* self_kept = json_is_object(self) ? json_deep_copy(self) : NULL;
  pthread_mutex_lock(&f->mu);
  json_decref(f->peers);
  f->peers = peers_kept ? peers_kept : json_array();
  json_decref(f->self);
  f->self = self_kept;
  pthread_mutex_unlock(&f->mu);
  *out_answer = answer;
  return pcp_ok_status();
}

static void* federation_main(void* opaque) {
  pcp_services_federation_t* f = opaque;
  pcp_services_t* g = f->g;
  // One request is bounded by twice the interval (1..5 s), so a stop never
  // waits longer than that for a hub that accepts and stays silent.
  int64_t timeout_ms = f->interval_ms * 2;
  if (timeout_ms < 1000) {
    timeout_ms = 1000;
  }
  if (timeout_ms > 5000) {
    timeout_ms = 5000;
  }
  pcp_http_client_options_t options = {
      .timeout_ms = timeout_ms,
      .max_response_bytes = FEDERATION_MAX_REPLY_BYTES,
  };
  pcp_http_client_t* client = NULL;
  pcp_status_t status =
      pcp_http_client_create(&options, pcp_allocator_system(), &client);
  if (status) {
    pthread_mutex_lock(&f->mu);
    f->status = "disconnected";
    error_set(f->last_error, sizeof(f->last_error), "", status);
    pthread_mutex_unlock(&f->mu);
    pcp_log_status(PCP_LOG_ERROR, &g->log, status, "federation client");
    pcp_status_ignore(status);
    return NULL;
  }
  bool was_connected = false;
  for (;;) {
    pthread_mutex_lock(&f->mu);
    bool stop = f->stop;
    f->last_attempt_at_ns = pcp_clock_wall_ns(g->clock);
    pthread_mutex_unlock(&f->mu);
    if (stop) {
      break;
    }
    json_t* answer = NULL;
    status = connect_once(f, client, &answer);
    int64_t wait_ms;
    pthread_mutex_lock(&f->mu);
    if (!status) {
      f->status = "connected";
      f->last_error[0] = '\0';
      f->last_sync_at_ns = pcp_clock_wall_ns(g->clock);
      f->consecutive_failures = 0;
      ++f->connect_count;
      wait_ms = f->interval_ms;
    } else {
      f->status = "disconnected";
      error_set(f->last_error, sizeof(f->last_error), "", status);
      ++f->consecutive_failures;
      ++f->failure_count;
      wait_ms = backoff_ms(f, f->consecutive_failures);
    }
    f->backoff_ms = wait_ms;
    uint32_t failures = f->consecutive_failures;
    pthread_mutex_unlock(&f->mu);
    if (!status && !was_connected) {
      const char* pairs[] = {"upstream", f->upstream};
      if (g->event_log) {
        g->event_log("federation connected", pairs, 1);
      }
    } else if (status && (was_connected || failures == 1)) {
      // Logged on the transition (and the first failure), not per retry.
      pcp_log_status(PCP_LOG_WARN, &g->log, status,
                     "federation: hub unreachable, retrying with backoff");
    }
    was_connected = !status;
    pcp_status_ignore(status);
    if (answer && g->federation_step) {
      pcp_services_federation_link_t link = {
          .client = client,
          .upstream = f->upstream,
          .token = f->token,
          .answer = answer,
      };
      pcp_status_t step = g->federation_step(g, &link);
      pthread_mutex_lock(&f->mu);
      if (step) {
        error_set(f->last_step_error, sizeof(f->last_step_error),
                  "replication: ", step);
      } else {
        f->last_step_error[0] = '\0';
      }
      pthread_mutex_unlock(&f->mu);
      pcp_status_ignore(step);
    }
    json_decref(answer);
    // Wait |wait_ms| or until stop, in slices (the condition variable
    // waits on the realtime clock; the deadline is kept on the monotonic
    // one so a clock step cannot stretch the wait).
    int64_t until_ns = pcp_clock_now_ns(g->clock) + wait_ms * 1000000;
    pthread_mutex_lock(&f->mu);
    f->next_attempt_at_ns = pcp_clock_wall_ns(g->clock) + wait_ms * 1000000;
    while (!f->stop && !f->wake) {
      int64_t left_ms = (until_ns - pcp_clock_now_ns(g->clock)) / 1000000;
      if (left_ms <= 0) {
        break;
      }
      struct timespec deadline =
          pcp_realtime_deadline_ms(left_ms < 1000 ? left_ms : 1000);
      pthread_cond_timedwait(&f->cv, &f->mu, &deadline);
    }
    f->next_attempt_at_ns = 0;
    f->wake = false;
    pthread_mutex_unlock(&f->mu);
  }
  pcp_http_client_release(client);
  return NULL;
}

//===----------------------------------------------------------------------===//
// Lifecycle
//===----------------------------------------------------------------------===//

void pcp_services_federation_step_set(pcp_services_t* g,
                                      pcp_services_federation_step_fn_t step) {
  g->federation_step = step;
}

bool pcp_services_federation_scope(const pcp_services_t* g,
                                   pcp_http_scope_t* out_scope) {
  const char* env = g->config.federation_token_env;
  if (!env || !env[0]) {
    return false;
  }
  *out_scope = (pcp_http_scope_t){"federation", env};
  return true;
}

pcp_status_t pcp_services_federation_create(pcp_services_t* g) {
  const pcp_services_config_t* c = &g->config;
  pcp_services_federation_t* f = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(g->allocator, sizeof(*f), (void**)&f),
      "federation state");
  f->g = g;
  pthread_mutex_init(&f->mu, NULL);
  pthread_cond_init(&f->cv, NULL);
  f->enabled = c->federation_present && c->federation_enabled;
  f->interval_ms = c->federation_heartbeat_interval_ms > 0
                       ? c->federation_heartbeat_interval_ms
                       : 5000;
  f->status = f->enabled ? "connecting" : "disabled";
  f->peers = json_array();
  // Seeded from the wall clock and the gateway id: two gateways started in
  // the same instant still draw different jitter.
  uint64_t seed = (uint64_t)pcp_clock_wall_ns(g->clock);
  for (const char* p = c->gateway_id; p && *p; ++p) {
    seed = seed * 1099511628211ull ^ (uint8_t)*p;
  }
  pcp_rng_initialize(seed, &f->rng);
  g->federation = f;  // before any early return: stop frees it
  const char* upstream = c->federation_upstream;
  if (upstream && upstream[0]) {
    size_t n = strlen(upstream);
    if (n >= FEDERATION_MAX_URL_BYTES ||
        (strncmp(upstream, "http://", 7) != 0 &&
         strncmp(upstream, "https://", 8) != 0)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "gateway config: key 'federation.upstream' must "
                             "be an http:// or https:// URL under %u bytes",
                             FEDERATION_MAX_URL_BYTES);
    }
    while (n > 0 && upstream[n - 1] == '/') {
      --n;
    }
    PCP_RETURN_IF_ERROR(
        pcp_allocator_malloc(g->allocator, n + 1, (void**)&f->upstream),
        "upstream");
    memcpy(f->upstream, upstream, n);
    f->upstream[n] = '\0';
  }
  const char* advertise =
      c->federation_present ? c->federation_advertise_url : NULL;
  if (advertise && (strlen(advertise) >= FEDERATION_MAX_URL_BYTES ||
                    (strncmp(advertise, "http://", 7) != 0 &&
                     strncmp(advertise, "https://", 8) != 0))) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "gateway config: key 'federation.advertise_url' "
                           "must be an http:// or https:// URL under %u "
                           "bytes",
                           FEDERATION_MAX_URL_BYTES);
  }
  const char* env = c->federation_token_env;
  const char* token = env ? getenv(env) : NULL;
  if (token && token[0]) {
    PCP_RETURN_IF_ERROR(pcp_allocator_strdup(g->allocator, token, &f->token),
                        "token");
  } else if (f->enabled) {
    // The hub will most likely refuse us; say why here, once.
    PCP_LOG(PCP_LOG_WARN, &g->log,
            "federation: no token (gateway config key 'federation.token_env' "
            "%s%s%s): connecting without one, and the internal federation "
            "routes answer 401",
            env ? "names " : "is not set", env ? env : "",
            env ? ", which is unset or empty" : "");
  }
  return pcp_ok_status();
}

pcp_status_t pcp_services_federation_start(pcp_services_t* g) {
  pcp_services_federation_t* f = g->federation;
  if (!f) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "the services were not started");
  }
  const pcp_services_config_t* c = &g->config;
  const char* advertise =
      c->federation_present ? c->federation_advertise_url : NULL;
  pthread_mutex_lock(&f->mu);
  if (advertise) {
    snprintf(f->advertise_url, sizeof(f->advertise_url), "%s", advertise);
    size_t n = strlen(f->advertise_url);
    while (n > 0 && f->advertise_url[n - 1] == '/') {
      f->advertise_url[--n] = '\0';
    }
  } else {
    const char* host = c->api_host;
    if (!host || !host[0] || strcmp(host, "0.0.0.0") == 0) {
      host = "127.0.0.1";
    } else if (strcmp(host, "::") == 0) {
      host = "::1";
    }
    bool v6 = strchr(host, ':') != NULL;
    bool tls = c->tls;
    snprintf(f->advertise_url, sizeof(f->advertise_url), "%s://%s%s%s:%u",
             tls ? "https" : "http", v6 ? "[" : "", host, v6 ? "]" : "",
             (unsigned)pcp_http_server_port(g->http));
  }
  pthread_mutex_unlock(&f->mu);
  if (!f->enabled) {
    return pcp_ok_status();
  }
  if (!f->upstream) {
    // validate_file refuses enabled without an upstream; kept as a guard.
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "gateway config: 'federation.enabled' needs "
                           "'federation.upstream'");
  }
  if (pthread_create(&f->thread, NULL, federation_main, f)) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE, "federation thread");
  }
  f->thread_started = true;
  return pcp_ok_status();
}

void pcp_services_federation_stop(pcp_services_t* g) {
  if (!g) {
    return;
  }
  pcp_services_federation_t* f = g->federation;
  if (!f) {
    return;
  }
  pthread_mutex_lock(&f->mu);
  f->stop = true;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  if (f->thread_started) {
    pthread_join(f->thread, NULL);
  }
  g->federation = NULL;
  json_decref(f->peers);
  json_decref(f->self);
  pcp_allocator_free(g->allocator, f->upstream);
  pcp_allocator_free(g->allocator, f->token);
  pthread_cond_destroy(&f->cv);
  pthread_mutex_destroy(&f->mu);
  pcp_allocator_free(g->allocator, f);
}

//===----------------------------------------------------------------------===//
// /v1/federation/*, /v1/capabilities
//===----------------------------------------------------------------------===//

// Fields of the status that every /v1/federation answer starts with.
static json_t* link_json(pcp_services_federation_t* f) {
  pcp_services_t* g = f->g;
  pthread_mutex_lock(&f->mu);
  int64_t now_ns = pcp_clock_wall_ns(g->clock);
  json_t* out = json_pack(
      "{s:s, s:s, s:b, s:b, s:s, s:s?, s:s?, s:s, s:I, s:o, s:o, s:o, s:I, "
      "s:I, s:I, s:i}",
      "gateway_id", g->config.gateway_id, "lab_id", g->config.lab_id, "enabled",
      f->enabled, "connected", strcmp(f->status, "connected") == 0, "status",
      f->status, "upstream", f->upstream, "federation_hub_endpoint",
      f->upstream, "advertise_url", f->advertise_url, "heartbeat_interval_ms",
      (json_int_t)f->interval_ms, "last_sync_at_ms",
      ms_or_null(f->last_sync_at_ns), "last_attempt_at_ms",
      ms_or_null(f->last_attempt_at_ns), "last_error",
      f->last_error[0] ? json_string(f->last_error) : json_null(),
      "connect_count", (json_int_t)f->connect_count, "failure_count",
      (json_int_t)f->failure_count, "backoff_ms", (json_int_t)f->backoff_ms,
      "consecutive_failures", (int)f->consecutive_failures);
  if (out) {
    json_object_set_new(
        out, "next_attempt_in_ms",
        f->next_attempt_at_ns
            ? json_integer((f->next_attempt_at_ns - now_ns) / 1000000)
            : json_null());
    json_object_set_new(
        out, "last_step_error",
        f->last_step_error[0] ? json_string(f->last_step_error) : json_null());
    json_object_set_new(out, "peer_count",
                        json_integer((json_int_t)json_array_size(f->peers)));
    json_object_set_new(out, "token_configured", json_boolean(f->token));
    json_object_set_new(out, "hub_record",
                        f->self ? json_deep_copy(f->self) : json_null());
  }
  pthread_mutex_unlock(&f->mu);
  return out;
}

static void stats_set(pcp_services_t* g, json_t* out) {
  pcp_store_mutation_log_stats_t stats = {0};
  pcp_status_ignore(pcp_store_mutation_log_stats_query(g->store, &stats));
  json_object_set_new(out, "replication_enabled",
                      json_boolean(g->federation->enabled));
  json_object_set_new(out, "last_sequence_no",
                      json_integer(stats.last_sequence_no));
  json_object_set_new(out, "last_replicated_sequence",
                      json_integer(stats.last_replicated_sequence));
  json_object_set_new(out, "pending_mutations",
                      json_integer(stats.pending_count));
}

pcp_status_t pcp_services_federation_status_get(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response) {
  (void)request;
  pcp_services_t* g = user_data;
  json_t* out = link_json(g->federation);
  if (out) {
    stats_set(g, out);
  }
  return pcp_http_response_json_take(response, 200, out);
}

// Wakes the loop for a connect now (upstream's route only reported). The
// answer is the status before that connect; poll /status for its outcome.
pcp_status_t pcp_services_federation_connect_post(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response) {
  (void)request;
  pcp_services_t* g = user_data;
  pcp_services_federation_t* f = g->federation;
  if (!f->enabled) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "federation is not enabled on this gateway "
                           "(gateway config key 'federation.enabled')");
  }
  pthread_mutex_lock(&f->mu);
  f->wake = true;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  return pcp_http_response_json_take(response, 202, link_json(f));
}

static json_t* peers_copy(pcp_services_federation_t* f) {
  pthread_mutex_lock(&f->mu);
  json_t* peers = json_deep_copy(f->peers);
  pthread_mutex_unlock(&f->mu);
  return peers ? peers : json_array();
}

pcp_status_t pcp_services_federation_peers_get(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response) {
  (void)request;
  pcp_services_t* g = user_data;
  pcp_services_federation_t* f = g->federation;
  pthread_mutex_lock(&f->mu);
  int64_t synced = f->last_sync_at_ns;
  pthread_mutex_unlock(&f->mu);
  // As of the last successful connect (the hub's view then).
  return pcp_http_response_json_take(
      response, 200,
      json_pack("{s:o, s:o}", "gateways", peers_copy(f), "as_of_ms",
                ms_or_null(synced)));
}

pcp_status_t pcp_services_federation_services_get(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response) {
  (void)request;
  pcp_services_t* g = user_data;
  json_t* peers = peers_copy(g->federation);
  json_t* out = json_array();
  size_t i;
  json_t* peer;
  json_array_foreach(peers, i, peer) {
    json_t* services = json_object_get(peer, "services");
    size_t k;
    json_t* s;
    json_array_foreach(services, k, s) {
      if (!json_is_object(s))
        continue;
      json_t* row = json_deep_copy(s);
      if (!row)
        continue;
      json_object_set(row, "gateway_id", json_object_get(peer, "gateway_id"));
      json_object_set(row, "lab_id", json_object_get(peer, "lab_id"));
      json_object_set(row, "gateway_base_url",
                      json_object_get(peer, "base_url"));
      json_object_set(row, "gateway_status", json_object_get(peer, "status"));
      json_array_append_new(out, row);
    }
  }
  json_decref(peers);
  return pcp_http_response_json_take(response, 200,
                                     json_pack("{s:o}", "services", out));
}

pcp_status_t pcp_services_federation_replication_get(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response) {
  (void)request;
  pcp_services_t* g = user_data;
  json_t* out = link_json(g->federation);
  if (!out) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "replication");
  }
  pcp_store_mutation_log_stats_t stats = {0};
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_mutation_log_stats_query(g->store, &stats));
  json_object_set_new(
      out, "summary",
      json_pack("{s:I, s:I, s:I, s:I}", "last_sequence_no",
                (json_int_t)stats.last_sequence_no, "last_replicated_sequence",
                (json_int_t)stats.last_replicated_sequence, "pending_mutations",
                (json_int_t)stats.pending_count, "replication_lag",
                (json_int_t)(stats.last_sequence_no -
                             stats.last_replicated_sequence)));
  // Per namespace (upstream NamespaceReplicationStatus): replication.c.
  json_t* graph = pcp_services_replication_status_json(g);
  if (graph) {
    json_object_set(out, "namespaces", json_object_get(graph, "namespaces"));
    json_object_set_new(json_object_get(out, "summary"), "namespace_count",
                        json_integer((json_int_t)json_array_size(
                            json_object_get(graph, "namespaces"))));
    json_decref(graph);
  }
  return pcp_http_response_json_take(response, 200, out);
}

// What GET /v1/capabilities lists: only what this gateway serves. A name
// is listed when its predicate holds (NULL: always). Add a row with the
// route that implements it (docs/federation.md lists them).
typedef struct capability_t {
  const char* name;
  bool (*present)(pcp_services_t* g);
} capability_t;

static bool federation_on(pcp_services_t* g) {
  return g->federation && g->federation->enabled;
}
static bool federation_jobs_on(pcp_services_t* g) {
  pcp_http_scope_t scope;
  return pcp_services_federation_scope(g, &scope);
}
static bool inference_on(pcp_services_t* g) {
  return g->infer != NULL;
}

static const capability_t kCapabilities[] = {
    {"graph.query", NULL},                // POST /v1/graph/query (local)
    {"graph.mutate", NULL},               // POST /v1/graph/mutate
    {"service.registry", NULL},           // /v1/services*
    {"jobs.stablehlo", NULL},             // POST /v1/jobs
    {"events.stream", NULL},              // GET /v1/events (SSE)
    {"training.regular", NULL},           // POST /v1/training/jobs
    {"training.decoupled_diloco", NULL},  // the same, DiLoCo rounds
    {"training.streaming_diloco", NULL},  // the same, "streaming": {...}
    {"inference.chat_completions", inference_on},  // POST /v1/chat/completions
    {"federation.status", NULL},                   // GET /v1/federation/status
    {"federation.replication.inspect", NULL},  // GET /v1/federation/replication
    {"federation.connect", federation_on},     // the connect loop runs
    {"federation.training.jobs", federation_jobs_on},  // internal routes
    {"rl.grpo", NULL},                                 // POST /v1/rl/jobs
    {"federation.rl.jobs", federation_jobs_on},        // the internal rl route
};

pcp_status_t pcp_services_capabilities_get(void* user_data,
                                           const pcp_http_request_t* request,
                                           pcp_http_response_t* response) {
  (void)request;
  pcp_services_t* g = user_data;
  json_t* names = json_array();
  for (size_t i = 0; i < PCP_ARRAYSIZE(kCapabilities); ++i) {
    if (!kCapabilities[i].present || kCapabilities[i].present(g)) {
      json_array_append_new(names, json_string(kCapabilities[i].name));
    }
  }
  worker_group_t groups[FEDERATION_MAX_GROUPS];
  uint32_t count = worker_groups_query(g, groups, FEDERATION_MAX_GROUPS);
  return pcp_http_response_json_take(
      response, 200,
      json_pack("{s:s, s:s, s:o, s:o}", "gateway_id", g->config.gateway_id,
                "lab_id", g->config.lab_id, "capabilities", names, "workers",
                groups_json(groups, count)));
}
