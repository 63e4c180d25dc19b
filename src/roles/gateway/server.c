// SPDX-License-Identifier: Apache-2.0
// The gateway process: store, fabric endpoint, HTTP API, job runner, event
// pump; drains on SIGTERM. Start order puts the store first (nothing can be
// accepted that cannot be recorded) and the HTTP server last (no request
// arrives before the state it needs exists); stop runs in reverse.

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "roles/gateway/gateway_impl.h"

//===----------------------------------------------------------------------===//
// Metrics
//===----------------------------------------------------------------------===//

static const char* const kStateLabels[] = {"state", NULL};
static const char* const kOutcomeLabels[] = {"outcome", NULL};

static const pcp_obs_metric_def_t kGatewayMetrics[] = {
    {.name = "pcp_gateway_jobs",
     .type = PCP_OBS_METRIC_TYPE_GAUGE,
     .help = "Generic jobs in the store, by state",
     .label_names = kStateLabels},
    {.name = "pcp_gateway_job_outcomes_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Jobs finished by this process, by outcome",
     .label_names = kOutcomeLabels},
};

//===----------------------------------------------------------------------===//
// Readiness
//===----------------------------------------------------------------------===//

static bool ready(void* user_data, json_t* details) {
  pcp_roles_gateway_state_t* g = user_data;
  bool draining = atomic_load(&g->draining);
  json_t* missing = json_array();
  if (draining) {
    json_array_append_new(missing, json_string("draining"));
  }
  if (!g->store) {
    json_array_append_new(missing, json_string("store"));
  }
  if (!g->fabric) {
    json_array_append_new(missing, json_string("worker_fabric"));
  }
  uint32_t connected = g->fabric ? pcp_fabric_worker_count(
                                       g->fabric, PCP_FABRIC_WORKER_CONNECTED)
                                 : 0;
  // Each enabled embedded service needs its workers connected (upstream
  // s.3.1 requirements; here counted on the fabric, which is where the
  // workers are).
  json_t* requirements = json_array();
  const pcp_roles_controllers_config_t* c = &g->config->file.controllers;
  const struct {
    const char* type;
    const pcp_roles_controller_config_t* block;
  } kinds[] = {
      {"inference", &c->inference}, {"training", &c->training}, {"rl", &c->rl}};
  for (size_t i = 0; i < PCP_ARRAYSIZE(kinds); ++i) {
    const pcp_roles_controller_config_t* b = kinds[i].block;
    if (!c->present || !b->present || !b->enabled) {
      continue;
    }
    int64_t required = b->workers ? b->workers : g->config->workers;
    if (strcmp(kinds[i].type, "inference") == 0) {
      required = 1;
    }
    bool met = (int64_t)connected >= required;
    json_array_append_new(
        requirements,
        json_pack("{s:s, s:s, s:I, s:I, s:b}", "service_type", kinds[i].type,
                  "service_id", b->service_id ? b->service_id : "",
                  "required_workers", (json_int_t)required, "workers_available",
                  (json_int_t)connected, "ready", met));
    if (!met) {
      char text[96];
      snprintf(text, sizeof(text), "workers for %s", kinds[i].type);
      json_array_append_new(missing, json_string(text));
    }
  }
  if (g->infer) {
    pcp_infer_readiness_t r;
    pcp_infer_service_readiness(g->infer, &r);
    json_object_set_new(
        details, "inference",
        json_pack("{s:b, s:I, s:I, s:I, s:s}", "ready", r.ready, "models_ready",
                  (json_int_t)r.models_ready, "schedulers",
                  (json_int_t)r.schedulers, "probe_age_ms",
                  (json_int_t)r.probe_age_ms, "last_error", r.last_error));
    // Models given with --model-dir must be served through a probe that
    // passed recently (gateway -> worker -> decode); models that a training
    // job adds later do not hold readiness.
    if (!r.ready && pcp_infer_service_has_pinned_models(g->infer)) {
      json_array_append_new(missing, json_string("inference probe"));
    }
  }
  bool ok = json_array_size(missing) == 0;
  json_object_set_new(details, "mode", json_string("gateway"));
  json_object_set_new(details, "gateway_id",
                      json_string(g->config->file.gateway_id));
  json_object_set_new(details, "draining", json_boolean(draining));
  json_object_set_new(details, "store_open", json_boolean(g->store != NULL));
  json_object_set_new(details, "fabric_listening",
                      json_boolean(g->fabric != NULL));
  json_object_set_new(details, "workers_connected", json_integer(connected));
  json_object_set_new(details, "requirements", requirements);
  json_object_set_new(details, "missing", missing);
  return ok;
}

//===----------------------------------------------------------------------===//
// Helpers shared by the handlers
//===----------------------------------------------------------------------===//

// The one decoder lives in base (pcp_base64_decode); malloc'd result.
pcp_status_t pcp_roles_gateway_base64_decode(const char* text, size_t length,
                                             uint8_t** out_data,
                                             size_t* out_length) {
  return pcp_base64_decode(pcp_allocator_system(), text, length, out_data,
                           out_length);
}

//===----------------------------------------------------------------------===//
// /v1/controller, /v1/workers
//===----------------------------------------------------------------------===//

pcp_status_t pcp_roles_gateway_controller_get(void* user_data,
                                              const pcp_http_request_t* request,
                                              pcp_http_response_t* response) {
  (void)request;
  pcp_roles_gateway_state_t* g = user_data;
  const pcp_roles_gateway_config_t* c = g->config;
  json_t* controllers = json_array();
  for (size_t i = 0; i < c->effective.controllers.count; ++i) {
    json_array_append_new(controllers,
                          json_string(c->effective.controllers.items[i]));
  }
  char fabric[320];
  snprintf(fabric, sizeof(fabric), "%s:%u", c->effective.worker_fabric_host,
           (unsigned)pcp_fabric_endpoint_port(g->fabric));
  return pcp_http_response_json_take(
      response, 200,
      json_pack("{s:s, s:s, s:s, s:s, s:s, s:I, s:b, s:s, s:s?, s:o, s:b}",
                "mode", "gateway", "status",
                atomic_load(&g->draining) ? "draining" : "running",
                "gateway_id", c->file.gateway_id, "lab_id", c->file.lab_id,
                "graph_backend", pcp_services_graph_backend_name(g->services),
                "started_at_ms", (json_int_t)(g->started_at_ns / 1000000),
                "auth_enabled", g->auth_enabled, "worker_fabric", fabric,
                "federation_hub_endpoint", c->effective.federation_upstream,
                "controllers", controllers, "tls",
                c->file.tls.present && c->file.tls.cert != NULL));
}

// The full fabric record of one worker (everything its JOIN carried plus
// what the endpoint knows now).
static json_t* worker_json(const pcp_fabric_worker_info_t* w) {
  json_t* drivers = json_array();
  for (uint32_t i = 0; i < w->driver_count && i < PCP_ARRAYSIZE(w->drivers);
       ++i) {
    json_array_append_new(drivers, json_string(w->drivers[i]));
  }
  json_t* out = json_pack(
      "{s:s, s:s, s:s, s:s, s:s, s:i, s:I, s:o, s:s, s:s, s:s, s:I, s:s}",
      "worker_id", w->worker_id, "state",
      pcp_fabric_worker_state_name(w->state), "sched_state",
      pcp_sched_worker_state_name(w->sched_state), "backend", w->backend,
      "target", w->target, "device_id", w->device_id, "device_memory_bytes",
      (json_int_t)w->device_memory_bytes, "drivers", drivers, "runtime_version",
      w->runtime_version, "compiler_version", w->compiler_version,
      "node_manager_id", w->node_manager_id, "supervisor_id",
      (json_int_t)w->supervisor_id, "worker_class", w->worker_class);
  if (!out) {
    return NULL;
  }
  // A lost worker has no heartbeat to age: null, not a stale number.
  json_object_set_new(out, "heartbeat_age_seconds",
                      w->state == PCP_FABRIC_WORKER_LOST
                          ? json_null()
                          : json_real((double)w->heartbeat_age_ns / 1e9));
  json_object_set_new(
      out, "lost_at_ms",
      w->lost_at_ns ? json_integer(w->lost_at_ns / 1000000) : json_null());
  json_object_set_new(out, "lease_epoch",
                      json_integer((json_int_t)w->lease_epoch));
  json_object_set_new(
      out, "lease_id",
      w->lease_id ? json_integer((json_int_t)w->lease_id) : json_null());
  json_object_set_new(out, "in_flight", json_integer(w->in_flight));
  json_object_set_new(out, "program_count", json_integer(w->program_count));
  json_object_set_new(out, "join_count", json_integer(w->join_count));
  json_object_set_new(out, "resumed_count", json_integer(w->resumed_count));
  json_object_set_new(out, "eviction_count",
                      json_integer((json_int_t)w->eviction_count));
  // The fabric's real byte counters of the link to this worker.
  json_object_set_new(out, "bytes_from_worker",
                      json_integer((json_int_t)w->bytes_in));
  json_object_set_new(out, "bytes_to_worker",
                      json_integer((json_int_t)w->bytes_out));
  // What it works on (the dashboard's overview): tasks it answered, and the
  // task it was last handed while that is unanswered (null: idle).
  json_object_set_new(out, "tasks_done",
                      json_integer((json_int_t)w->tasks_done));
  json_object_set_new(out, "tasks_failed",
                      json_integer((json_int_t)w->tasks_failed));
  json_object_set_new(
      out, "current_task",
      w->current_task_id
          ? json_pack("{s:I, s:s}", "task_id", (json_int_t)w->current_task_id,
                      "function", w->current_function)
          : json_null());
  return out;
}

pcp_status_t pcp_roles_gateway_workers_list(void* user_data,
                                            const pcp_http_request_t* request,
                                            pcp_http_response_t* response) {
  (void)request;
  pcp_roles_gateway_state_t* g = user_data;
  json_t* counts = json_object();
  for (int s = 0; s < PCP_FABRIC_WORKER_STATE_COUNT_; ++s) {
    json_object_set_new(
        counts, pcp_fabric_worker_state_name((pcp_fabric_worker_state_t)s),
        json_integer(
            pcp_fabric_worker_count(g->fabric, (pcp_fabric_worker_state_t)s)));
  }
  // One snapshot of the fabric's registry: every joined worker, lost ones
  // included, in id order. The buffer is per request (a record is a few KiB)
  // and capped, so a huge registry cannot make one request allocate without
  // bound; |truncated| says when the cap cut the list.
  pcp_fabric_worker_info_t* infos = NULL;
  pcp_status_t status = pcp_allocator_calloc(
      g->allocator, PCP_GATEWAY_MAX_LISTED_WORKERS * sizeof(*infos),
      (void**)&infos);
  if (status) {
    pcp_status_ignore(status);
    json_decref(counts);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "worker list");
  }
  uint32_t total = 0;
  uint32_t count = pcp_fabric_worker_list(
      g->fabric, infos, PCP_GATEWAY_MAX_LISTED_WORKERS, &total);
  json_t* workers = json_array();
  for (uint32_t i = 0; i < count; ++i) {
    json_array_append_new(workers, worker_json(&infos[i]));
  }
  pcp_allocator_free(g->allocator, infos);
  return pcp_http_response_json_take(
      response, 200,
      json_pack("{s:o, s:o, s:i, s:b}", "counts", counts, "workers", workers,
                "total", (int)total, "truncated", total > count));
}

pcp_status_t pcp_roles_gateway_worker_get(void* user_data,
                                          const pcp_http_request_t* request,
                                          pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  pcp_fabric_worker_info_t info;
  // NOT_FOUND maps to the 404 JSON error.
  PCP_RETURN_IF_ERROR_BARE(pcp_fabric_worker_query(g->fabric, id, &info));
  return pcp_http_response_json_take(response, 200, worker_json(&info));
}

//===----------------------------------------------------------------------===//
// /openapi.json and the dashboard
//===----------------------------------------------------------------------===//

#include "gateway/dashboard_css.h"
#include "gateway/dashboard_html.h"
#include "gateway/dashboard_js.h"
#include "gateway/openapi_json.h"

pcp_status_t pcp_roles_gateway_static_get(void* user_data,
                                          const pcp_http_request_t* request,
                                          pcp_http_response_t* response) {
  (void)user_data;
  const char* path = pcp_http_request_path(request);
  const char* type = "text/html; charset=utf-8";
  const char* body = kDashboardHtml;
  if (strcmp(path, "/openapi.json") == 0) {
    type = "application/json";
    body = kOpenapiJson;
  } else if (strcmp(path, "/dashboard.css") == 0) {
    type = "text/css; charset=utf-8";
    body = kDashboardCss;
  } else if (strcmp(path, "/dashboard.js") == 0) {
    type = "text/javascript; charset=utf-8";
    body = kDashboardJs;
  }
  // Compiled into the binary: a browser revalidates on every load (no-cache)
  // so a new build's page is never mixed with an old cached script.
  PCP_RETURN_IF_ERROR_BARE(
      pcp_http_response_header_add(response, "Cache-Control", "no-cache"));
  // Static text: the builder copies; a few KiB per request.
  return pcp_http_response_body_set(response, 200, type, body, strlen(body));
}

//===----------------------------------------------------------------------===//
// Serve
//===----------------------------------------------------------------------===//

// How long /readyz answers 503 before the listener closes on SIGTERM.
#define PCP_GATEWAY_DRAIN_NOTICE_MS 1000

// The part of the gateway config the services read (strings borrowed from
// |c|, which outlives them).
static void services_config_fill(const pcp_roles_gateway_config_t* c,
                                 pcp_services_config_t* out) {
  const pcp_roles_gateway_file_config_t* file = &c->file;
  const pcp_services_falkordb_config_t* falkordb = &file->falkordb;
  const pcp_roles_controllers_config_t* controllers = &file->controllers;
  // controllers.<kind>.service_id when set, else the kind's default.
  const pcp_roles_controller_config_t* training = &controllers->training;
  const pcp_roles_controller_config_t* inference = &controllers->inference;
  bool training_id = controllers->present && training->present &&
                     training->service_id && training->service_id[0];
  bool inference_id = controllers->present && inference->present &&
                      inference->service_id && inference->service_id[0];
  *out = (pcp_services_config_t){
      .gateway_id = file->gateway_id,
      .lab_id = file->lab_id,
      // kGraphBackends in gateway.c: memory (= sqlite), sqlite, falkordb.
      .graph_falkordb = file->graph_backend == 2,
      .falkordb =
          {
              .present = falkordb->present,
              .host = falkordb->host,
              .port = falkordb->port,
              .password_env = falkordb->password_env,
              .graph = falkordb->graph,
              .connect_timeout_ms = falkordb->connect_timeout_ms,
              .command_timeout_ms = falkordb->command_timeout_ms,
          },
      .default_visibility = file->sharing_defaults.present
                                ? (pcp_store_visibility_t)
                                      file->sharing_defaults.default_visibility
                                : PCP_STORE_VISIBILITY_LOCAL,
      .federation_present = file->federation.present,
      .federation_enabled = file->federation.enabled,
      .federation_advertise_url = file->federation.advertise_url,
      .federation_upstream = c->effective.federation_upstream,
      .federation_token_env = c->effective.federation_token_env,
      .federation_heartbeat_interval_ms =
          c->effective.federation_heartbeat_interval_ms,
      .api_host = c->effective.api_host,
      .api_port = c->effective.api_port,
      .tls = file->tls.present && file->tls.cert != NULL,
      .training_service_id =
          training_id ? training->service_id : "training-main",
      .inference_service_id =
          inference_id ? inference->service_id : "inference-main",
      .rl_service_id = controllers->present && controllers->rl.present &&
                               controllers->rl.service_id &&
                               controllers->rl.service_id[0]
                           ? controllers->rl.service_id
                           : "rl-main",
  };
}

static void services_event_log(const char* msg, const char* const* pairs,
                               size_t pair_count) {
  pcp_roles_log_event("gateway", msg, pairs, pair_count);
}

static pcp_status_t start(pcp_roles_gateway_state_t* g) {
  const pcp_roles_gateway_config_t* c = g->config;
  if (!c->file.state_dir || !c->file.state_dir[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "gateway config: key 'state_dir' is required to "
                           "serve");
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_obs_registry_create(g->allocator, &g->registry));
  pcp_obs_family_t* families[PCP_ARRAYSIZE(kGatewayMetrics)];
  PCP_RETURN_IF_ERROR_BARE(pcp_obs_registry_register(
      g->registry, kGatewayMetrics, PCP_ARRAYSIZE(kGatewayMetrics), families));
  g->jobs_family = families[0];
  g->job_runs_family = families[1];
  PCP_RETURN_IF_ERROR_BARE(
      pcp_roles_process_metrics_register(g->registry, "gateway"));

  // One gateway per state dir: a second one would re-queue the first one's
  // running jobs at its start. An flock dies with the process (SIGKILL too).
  if (mkdir(c->file.state_dir, 0755) != 0 && errno != EEXIST) {
    return pcp_status_from_errno(errno, "gateway config key 'state_dir': %s",
                                 c->file.state_dir);
  }
  char lock_path[4096];
  snprintf(lock_path, sizeof(lock_path), "%s/gateway.lock", c->file.state_dir);
  g->lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (g->lock_fd < 0) {
    return pcp_status_from_errno(errno, "opening %s", lock_path);
  }
  if (flock(g->lock_fd, LOCK_EX | LOCK_NB) != 0) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "another gateway uses state_dir %s",
                           c->file.state_dir);
  }
  pcp_store_options_t store_options;
  pcp_store_options_initialize(&store_options);
  store_options.state_dir = c->file.state_dir;
  store_options.clock = g->clock;
  // Every committed job event wakes the SSE pump (events.c) at once.
  store_options.event_callback = (pcp_store_event_callback_t){
      .fn = pcp_roles_gateway_events_wake, .user_data = g};
  PCP_RETURN_IF_ERROR(pcp_store_create(&store_options, g->allocator, &g->store),
                      "opening the state dir (gateway config key 'state_dir')");
  {
    pcp_services_options_t services_options = {
        .store = g->store,
        .clock = g->clock,
        .log = g->log,
        .event_log = services_event_log,
    };
    services_config_fill(c, &services_options.config);
    PCP_RETURN_IF_ERROR_BARE(
        pcp_services_create(&services_options, g->allocator, &g->services));
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_roles_gateway_jobs_recover(g));

  pcp_fabric_options_t fabric_options;
  pcp_fabric_options_initialize(&fabric_options);
  char listen[320];
  snprintf(listen, sizeof(listen), "%s:%lld", c->effective.worker_fabric_host,
           (long long)c->effective.worker_fabric_port);
  PCP_RETURN_IF_ERROR(pcp_net_address_parse(pcp_make_cstring_view(listen),
                                            &fabric_options.listen_address),
                      "gateway config: key 'worker_fabric.host'");
  fabric_options.heartbeat_interval_ms =
      (uint32_t)c->effective.worker_heartbeat_ms;
  fabric_options.join_token_env = c->effective.worker_join_token_env;
  fabric_options.metrics = g->registry;
  fabric_options.clock = g->clock;
  fabric_options.log = g->log;
  PCP_RETURN_IF_ERROR(
      pcp_fabric_endpoint_create(&fabric_options, g->allocator, &g->fabric),
      "starting the worker fabric (gateway config key 'worker_fabric')");

  // One compile queue for every workload: child `pcp compile`s (this
  // binary), two at a time, artifacts under <state_dir>/artifacts.
  {
    char artifacts[PCP_STORE_PATH_MAX_LENGTH + 16];
    snprintf(artifacts, sizeof(artifacts), "%s/artifacts", c->file.state_dir);
    pcp_workloads_compile_queue_options_t queue_options = {
        .pcp_path = "/proc/self/exe",
        .artifact_dir = artifacts,
        .slot_count = 2,
        .clock = g->clock,
        .log = g->log,
    };
    PCP_RETURN_IF_ERROR(pcp_workloads_compile_queue_create(
                            &queue_options, g->allocator, &g->compile_queue),
                        "the compile queue");
  }

  // The inference engine: models under <state_dir>/models (training jobs
  // write them there) and the --model-dir ones.
  const pcp_infer_service_options_t infer_options = {
      .fabric = g->fabric,
      .metrics = g->registry,
      .compile_queue = g->compile_queue,
      .log = g->log,
      .kind = &g->infer_kind,  // served versions are inference jobs
  };
  PCP_RETURN_IF_ERROR(pcp_infer_service_create_in_state_dir(
                          &infer_options, c->file.state_dir,
                          (const char* const*)c->model_dirs.items,
                          c->model_dirs.count, g->allocator, &g->infer),
                      "the inference service (--model-dir)");

  pcp_http_scope_t scopes[3];
  size_t scope_count = 0;
  // The hub's calls (/v1/internal/federation/*): the federation token.
  if (pcp_services_federation_scope(g->services, &scopes[scope_count])) {
    ++scope_count;
  }
  if (c->effective.api_token_env) {
    scopes[scope_count++] =
        (pcp_http_scope_t){"api", c->effective.api_token_env};
  }
  if (c->effective.internal_api_token_env) {
    scopes[scope_count++] =
        (pcp_http_scope_t){"internal", c->effective.internal_api_token_env};
  }
  // Without a token the API stays open, as upstream, but loudly: a gateway
  // reachable from a network should always have one.
  g->auth_enabled = c->effective.api_token_env != NULL;
  if (!g->auth_enabled) {
    PCP_LOG(PCP_LOG_WARN, &g->log,
            "no API token configured: /v1 routes are open");
  }
  pcp_roles_http_limits_config_t limits = {0};
  if (c->file.http.present) {
    limits = c->file.http;
  }
  pcp_http_server_options_t http_options = {
      .name = "gateway",
      .host = c->effective.api_host,
      .port = (uint16_t)c->effective.api_port,
      .tls_cert_path = c->file.tls.present ? c->file.tls.cert : NULL,
      .tls_key_path = c->file.tls.present ? c->file.tls.key : NULL,
      .scopes = scopes,
      .scope_count = scope_count,
      .registry = g->registry,
      .clock = g->clock,
      // A completion that is not streamed holds its thread until the
      // generation ends (docs/decisions.md): more threads than the default.
      .thread_count = 32,
      // Config "http" (0: the http module's defaults, docs/api.md).
      .header_timeout_ms = (uint32_t)limits.header_timeout_ms,
      .connection_timeout_s = (uint32_t)limits.idle_timeout_s,
      .max_connections = (uint32_t)limits.max_connections,
      .max_connections_per_client = (uint32_t)limits.max_connections_per_client,
  };
  PCP_RETURN_IF_ERROR_BARE(
      pcp_http_server_create(&http_options, g->allocator, &g->http));
  g->readyz.ready = ready;
  g->readyz.user_data = g;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_http_server_probes_add(g->http, g->registry, &g->readyz));
  // Replication and the federation state exist before any route can run.
  const pcp_services_links_t links = {
      .fabric = g->fabric,
      .infer = g->infer,
      .http = g->http,
      .draining = &g->draining,
  };
  PCP_RETURN_IF_ERROR_BARE(pcp_services_start(g->services, &links));
  PCP_RETURN_IF_ERROR_BARE(pcp_roles_gateway_routes_add(g));

  PCP_RETURN_IF_ERROR_BARE(pcp_roles_gateway_jobs_kind_start(g));
  if (pthread_create(&g->housekeeping_thread, NULL,
                     pcp_roles_gateway_housekeeping_main, g)) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE, "housekeeping thread");
  }
  g->housekeeping_started = true;
  PCP_RETURN_IF_ERROR_BARE(pcp_roles_gateway_workloads_start(g));
  if (pthread_create(&g->pump_thread, NULL, pcp_roles_gateway_events_pump_main,
                     g)) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE, "event pump thread");
  }
  g->pump_started = true;
  PCP_RETURN_IF_ERROR(pcp_http_server_start(g->http),
                      "the gateway API (--api-host/--api-port)");
  // Last: the hub may call back as soon as we advertise.
  PCP_RETURN_IF_ERROR_BARE(pcp_services_federation_start(g->services));
  return pcp_ok_status();
}

static void stop(pcp_roles_gateway_state_t* g) {
  atomic_store(&g->draining, true);
  // Generations in flight get 8 s to finish (new ones are refused), then
  // end with an error: a completion that is not streamed holds a server
  // thread, which the HTTP stop below must be able to join.
  // Proxied calls first: a query-then-infer call waits on this gateway's
  // own inference, and their threads write to the server's streams.
  pcp_services_proxy_stop(5000);
  pcp_infer_service_shutdown(g->infer, 8000);
  if (g->http) {
    // Requests in flight finish; event streams end after what they queued.
    pcp_status_ignore(pcp_http_server_stop(g->http, 10000));
  }
  // After the HTTP stop: its handlers read the federation state. Until
  // then the hub is told "draining" and places nothing here.
  pcp_services_federation_stop(g->services);
  atomic_store(&g->stopping, true);
  pthread_mutex_lock(&g->mu);
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
  pcp_roles_gateway_events_wake(g, 0);
  if (g->pump_started) {
    pthread_join(g->pump_thread, NULL);
  }
  if (g->housekeeping_started) {
    pthread_join(g->housekeeping_thread, NULL);
  }
  // The runner leaves running jobs as they are in the store: the next start
  // re-runs them (a drain does not wait for long jobs); training runs
  // cancel their round's tasks and resume from a checkpoint then.
  pcp_roles_gateway_workloads_stop(g);
  pcp_services_stop(g->services);
  // A compile in progress is killed (the queue's shutdown); its job stays
  // compiling and re-runs next start.
  pcp_workloads_compile_queue_shutdown(g->compile_queue);
  pcp_roles_gateway_jobs_kind_stop(g);
  for (uint32_t i = 0; i < g->client_count; ++i) {
    pcp_http_sse_stream_release(g->clients[i].stream);
  }
  g->client_count = 0;
  pcp_http_server_release(g->http);
  // Before the fabric: its schedulers wait on fabric tasks.
  pcp_infer_service_release(g->infer);
  pcp_workloads_compile_queue_destroy(g->compile_queue);
  pcp_fabric_endpoint_release(g->fabric);
  pcp_roles_gateway_jobs_active_free(g);
  pcp_services_release(g->services);
  g->services = NULL;
  pcp_store_release(g->store);
  pcp_obs_registry_release(g->registry);
  if (g->lock_fd >= 0) {
    close(g->lock_fd);
  }
}

int pcp_roles_gateway_serve(const pcp_roles_gateway_config_t* config) {
  // The process's allocator: the state and everything the gateway makes.
  pcp_allocator_t allocator = pcp_allocator_system();
  pcp_roles_gateway_state_t* g = NULL;
  pcp_status_t status = pcp_allocator_calloc(allocator, sizeof(*g), (void**)&g);
  if (status) {
    pcp_log_status(PCP_LOG_ERROR, NULL, status, "gateway state");
    pcp_status_ignore(status);
    return 1;
  }
  g->config = config;
  g->lock_fd = -1;
  g->allocator = allocator;
  g->clock = pcp_clock_system();
  g->log.role = "gateway";
  g->log.node_id = config->file.gateway_id;
  g->started_at_ns = pcp_clock_wall_ns(g->clock);
  pthread_mutex_init(&g->mu, NULL);
  pthread_mutex_init(&g->cache_mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  pthread_mutex_init(&g->pump_mu, NULL);
  pthread_cond_init(&g->pump_cv, NULL);
  int exit_code = 0;
  status = pcp_roles_signals_install();
  if (!status) {
    status = start(g);
  }
  if (status) {
    pcp_log_status(PCP_LOG_ERROR, &g->log, status, "start failed");
    pcp_status_ignore(status);
    exit_code = 1;
  } else {
    char api[320], fabric[320];
    snprintf(api, sizeof(api), "%s:%u", config->effective.api_host,
             (unsigned)pcp_http_server_port(g->http));
    snprintf(fabric, sizeof(fabric), "%s:%u",
             config->effective.worker_fabric_host,
             (unsigned)pcp_fabric_endpoint_port(g->fabric));
    const char* pairs[] = {
        "gateway_id", config->file.gateway_id,
        "lab_id",     config->file.lab_id,
        "api",        api,
        "fabric",     fabric,
        "state_dir",  config->file.state_dir,
    };
    pcp_roles_log_event("gateway", "started", pairs, PCP_ARRAYSIZE(pairs) / 2);
    int signal_number = pcp_roles_signals_wait();
    const char* stop_pairs[] = {"signal",
                                signal_number == SIGINT ? "SIGINT" : "SIGTERM"};
    pcp_roles_log_event("gateway", "stopping", stop_pairs, 1);
    // Drain: /readyz answers 503 for a moment before the listener closes,
    // so a load balancer stops sending before connections are refused.
    atomic_store(&g->draining, true);
    pcp_sleep_ms(PCP_GATEWAY_DRAIN_NOTICE_MS);
  }
  stop(g);
  pcp_roles_gateway_jobs_cache_free(g);
  pthread_cond_destroy(&g->pump_cv);
  pthread_mutex_destroy(&g->pump_mu);
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->cache_mu);
  pthread_mutex_destroy(&g->mu);
  pcp_allocator_free(allocator, g);
  return exit_code;
}
