// SPDX-License-Identifier: Apache-2.0
// --federation-hub: the cross-gateway coordinator (docs/federation.md).
// Gateways connect (registration, peers, services); clients place training
// and RL jobs across them as global jobs (jobs.c). State lives in SQLite
// under --state-dir and survives SIGKILL; the registry and placement rules
// are the pure state machine of sched.h "Federation".

#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "roles/hub/hub_impl.h"

#define T pcp_roles_hub_config_t

static const pcp_config_field_t kFields[] = {
    PCP_ROLES_COMMON_FIELDS(T, "federation-hub",
                            "run the federation hub (gateway registry, "
                            "global jobs)"),
    {.name = "api-host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, api_host),
     .default_value = "127.0.0.1",
     .value_name = "HOST",
     .help = "hub API bind host"},
    {.name = "api-port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, api_port),
     // Apart from the gateway's 8000/8080 and the node manager's 8002, so
     // all four can start with defaults on one host.
     .default_value = "8003",
     .min = 0,
     .max = 65535,
     .value_name = "PORT",
     .help = "hub API bind port (0: any free port, logged at start)"},
    {.name = "gateway-host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, api_host),
     .value_name = "HOST",
     .flags = PCP_CONFIG_FLAG_ALIAS,
     .help = "legacy name"},
    {.name = "gateway-port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, api_port),
     .min = 1,
     .max = 65535,
     .value_name = "PORT",
     .flags = PCP_CONFIG_FLAG_ALIAS,
     .help = "legacy name"},
    {.name = "api-token-env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, api_token_env),
     .flags = PCP_CONFIG_FLAG_ENV_NAME,
     .help = "environment variable holding the token clients present"},
    {.name = "federation-token-env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, federation_token_env),
     .flags = PCP_CONFIG_FLAG_ENV_NAME,
     .help = "environment variable holding the token gateways present "
             "(and the hub presents to gateways); must differ from the "
             "API token"},
    {.name = "state-dir",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, state_dir),
     .value_name = "DIR",
     .help = "directory of the hub's SQLite state (required)"},
    {.name = "heartbeat-interval-ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, heartbeat_interval_ms),
     .default_value = "5000",
     .min = 10,
     .max = 3600000,
     .value_name = "MS",
     .help = "gateways' connect interval; a gateway silent for 3 intervals "
             "is stale"},
    {.name = "gateway-timeout-ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, gateway_timeout_ms),
     .default_value = "5000",
     .min = 10,
     .max = 600000,
     .value_name = "MS",
     .help = "limit of each request the hub makes to a gateway"},
    {.name = "max-gateways",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, max_gateways),
     .default_value = "1024",
     .min = 1,
     .max = 100000,
     .value_name = "N",
     .help = "registrations the hub keeps"},
};

const pcp_config_table_t pcp_roles_hub_table = {"federation-hub", kFields,
                                                PCP_ARRAYSIZE(kFields), NULL};

static pcp_status_t prepare(void* opaque) {
  T* config = opaque;
  if (!config->state_dir || !config->state_dir[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "--state-dir is required: the hub keeps its "
                           "registrations and global jobs there");
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Metrics
//===----------------------------------------------------------------------===//

static const char* const kStatusLabels[] = {"status", NULL};
static const char* const kPlacementLabels[] = {"kind", "outcome", NULL};
static const char* const kStateLabels[] = {"state", NULL};
static const char* const kRequestLabels[] = {"route", "outcome", NULL};
static const char* const kConnectLabels[] = {"outcome", NULL};

static const pcp_obs_metric_def_t kMetrics[PCP_ROLES_HUB_METRIC_COUNT] = {
    [PCP_ROLES_HUB_METRIC_GATEWAYS] =
        {.name = "pcp_hub_gateways",
         .type = PCP_OBS_METRIC_TYPE_GAUGE,
         .help = "Registered gateways per status (connected, stale)",
         .label_names = kStatusLabels},
    [PCP_ROLES_HUB_METRIC_PLACEMENTS] =
        {.name = "pcp_hub_placements_total",
         .type = PCP_OBS_METRIC_TYPE_COUNTER,
         .help = "Placement decisions per job kind and outcome (placed, "
                 "invalid, unknown_gateway, stale_gateway, unavailable)",
         .label_names = kPlacementLabels},
    [PCP_ROLES_HUB_METRIC_GLOBAL_JOBS] =
        {.name = "pcp_hub_global_jobs",
         .type = PCP_OBS_METRIC_TYPE_GAUGE,
         .help = "Global jobs per state (placing, submitted, rejected, "
                 "cancelling)",
         .label_names = kStateLabels},
    [PCP_ROLES_HUB_METRIC_GATEWAY_REQUESTS] =
        {.name = "pcp_hub_gateway_requests_total",
         .type = PCP_OBS_METRIC_TYPE_COUNTER,
         .help = "Requests the hub made to gateways, per route and outcome "
                 "(ok = any HTTP answer, failed = no answer in time)",
         .label_names = kRequestLabels},
    [PCP_ROLES_HUB_METRIC_CONNECTS] =
        {.name = "pcp_hub_connects_total",
         .type = PCP_OBS_METRIC_TYPE_COUNTER,
         .help = "Gateway connects per outcome (accepted, recovered, "
                 "rejected)",
         .label_names = kConnectLabels},
};

void pcp_roles_hub_metrics_refresh(pcp_roles_hub_t* hub) {
  int64_t now = pcp_clock_now_ns(hub->clock);
  uint32_t connected = 0, stale = 0;
  pthread_mutex_lock(&hub->mutex);
  pcp_sched_federation_status_counts(hub->registry, now, &connected, &stale);
  pthread_mutex_unlock(&hub->mutex);
  const char* c[] = {"connected"};
  const char* s[] = {"stale"};
  pcp_obs_family_set(hub->families[PCP_ROLES_HUB_METRIC_GATEWAYS], c,
                     connected);
  pcp_obs_family_set(hub->families[PCP_ROLES_HUB_METRIC_GATEWAYS], s, stale);
  int64_t counts[PCP_STORE_GLOBAL_JOB_STATE_COUNT];
  pcp_status_t status = pcp_store_global_job_counts(hub->store, counts);
  if (!status) {
    for (size_t i = 0; i < PCP_STORE_GLOBAL_JOB_STATE_COUNT; ++i) {
      const char* labels[] = {pcp_store_global_job_state_names[i]};
      pcp_obs_family_set(hub->families[PCP_ROLES_HUB_METRIC_GLOBAL_JOBS],
                         labels, (double)counts[i]);
    }
  }
  pcp_status_ignore(status);  // the gauges keep their last values
}

static pcp_status_t metrics_get(void* user_data,
                                const pcp_http_request_t* request,
                                pcp_http_response_t* response) {
  pcp_roles_hub_t* hub = user_data;
  pcp_roles_hub_metrics_refresh(hub);
  return pcp_http_metrics_handler(hub->metrics, request, response);
}

//===----------------------------------------------------------------------===//
// Shared helpers
//===----------------------------------------------------------------------===//

int64_t pcp_roles_hub_now_ms(const pcp_roles_hub_t* hub) {
  return pcp_clock_wall_ns(hub->clock) / 1000000;
}

void pcp_roles_hub_call_deinitialize(pcp_roles_hub_call_t* call) {
  json_decref(call->body);
  // An HTTP client response body: the client's allocator (src/http).
  pcp_allocator_free(call->raw_allocator, call->raw);
  memset(call, 0, sizeof(*call));
}

pcp_status_t pcp_roles_hub_gateway_call(pcp_roles_hub_t* hub,
                                        const char* method,
                                        const char* base_url, const char* path,
                                        const char* body, size_t body_length,
                                        pcp_roles_hub_call_t* out_call) {
  memset(out_call, 0, sizeof(*out_call));
  char url[PCP_SCHED_FEDERATION_URL_MAX_LENGTH + 512];
  size_t base_length = strlen(base_url);
  // "http://host:port/" and "http://host:port" name the same root.
  while (base_length && base_url[base_length - 1] == '/') {
    --base_length;
  }
  int n =
      snprintf(url, sizeof(url), "%.*s%s", (int)base_length, base_url, path);
  if (n < 0 || (size_t)n >= sizeof(url)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "gateway URL too long");
  }
  pcp_http_client_options_t options = {
      .timeout_ms = hub->config->gateway_timeout_ms,
      .max_response_bytes = 4u << 20,
  };
  pcp_http_client_t* client = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_http_client_create(&options, hub->allocator, &client));
  static const char* const kHeaders[] = {"Content-Type: application/json",
                                         "Accept: application/json", NULL};
  pcp_http_client_request_t request = {
      .method = method,
      .url = url,
      .headers = kHeaders,
      .bearer_token = hub->federation_token,
      .body = body,
      .body_length = body_length,
  };
  pcp_http_client_response_t response;
  pcp_status_t status = pcp_http_client_send(client, &request, &response);
  pcp_http_client_release(client);
  // Route label: the path's shape, not the ids in it (bounded cardinality).
  const char* route = strstr(path, "/cancel") ? "job_cancel"
                      : strncmp(path, "/v1/internal/federation/jobs/", 29) == 0
                          ? "job_get"
                          : "job_submit";
  const char* labels[] = {route, !status ? "ok" : "failed"};
  pcp_obs_family_add(hub->families[PCP_ROLES_HUB_METRIC_GATEWAY_REQUESTS],
                     labels, 1);
  if (status) {
    return pcp_status_annotate_f(status, "%s %s", method ? method : "GET", url);
  }
  out_call->http_status = response.http_status;
  out_call->raw = response.body;
  out_call->raw_length = response.body_length;
  out_call->raw_allocator = response.allocator;
  response.body = NULL;
  pcp_http_client_response_deinitialize(&response);
  if (out_call->raw && out_call->raw_length) {
    json_error_t error;
    out_call->body = json_loadb(out_call->raw, out_call->raw_length,
                                JSON_DECODE_ANY, &error);
  }
  return pcp_ok_status();
}

void pcp_roles_hub_gateway_url(pcp_roles_hub_t* hub, const char* gateway_id,
                               const char* fallback, char* out_url) {
  pcp_sched_federation_gateway_t g;
  pthread_mutex_lock(&hub->mutex);
  pcp_status_t status = pcp_sched_federation_gateway_find(
      hub->registry, gateway_id, pcp_clock_now_ns(hub->clock), &g);
  snprintf(out_url, PCP_SCHED_FEDERATION_URL_MAX_LENGTH + 1, "%s",
           !status ? g.base_url : fallback);
  pthread_mutex_unlock(&hub->mutex);
  pcp_status_ignore(status);
}

pcp_status_t pcp_roles_hub_routes_add(pcp_roles_hub_t* hub,
                                      const pcp_http_route_t* routes,
                                      size_t route_count) {
  pcp_http_route_t copy[64];
  if (route_count > PCP_ARRAYSIZE(copy)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "at most %zu routes per table", PCP_ARRAYSIZE(copy));
  }
  memcpy(copy, routes, route_count * sizeof(*routes));
  for (size_t i = 0; i < route_count; ++i) {
    // Without a token a scope's routes are open (upstream), loudly: the
    // warning is logged at start.
    const char* scope = copy[i].scope;
    if (scope && ((strcmp(scope, PCP_ROLES_HUB_SCOPE_API) == 0 &&
                   !hub->api_auth_enabled) ||
                  (strcmp(scope, PCP_ROLES_HUB_SCOPE_FEDERATION) == 0 &&
                   !hub->federation_auth_enabled))) {
      copy[i].scope = NULL;
    }
  }
  return pcp_http_server_routes_add(hub->http, copy, route_count);
}

//===----------------------------------------------------------------------===//
// Registrations: JSON <-> the state machine
//===----------------------------------------------------------------------===//

// A connect request parsed into the state machine's input. Strings borrow
// from |body| (kept alive by the caller).
typedef struct connect_parse_t {
  pcp_sched_federation_connect_t request;
  pcp_sched_federation_service_t services[PCP_SCHED_FEDERATION_MAX_SERVICES];
  const char* capabilities[PCP_SCHED_FEDERATION_MAX_SERVICES]
                          [PCP_SCHED_FEDERATION_MAX_CAPABILITIES];
} connect_parse_t;

// Optional string |key| of |object|: NULL when absent or null; a non-string
// is INVALID_ARGUMENT naming |where|.|key|.
static pcp_status_t string_field(const json_t* object, const char* where,
                                 const char* key, const char** out_value) {
  *out_value = NULL;
  const json_t* value = json_object_get(object, key);
  if (!value || json_is_null(value)) {
    return pcp_ok_status();
  }
  if (!json_is_string(value)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s%s must be a string",
                           where, key);
  }
  *out_value = json_string_value(value);
  return pcp_ok_status();
}

// Optional non-negative integer: |absent| when missing or null.
static pcp_status_t count_field(const json_t* object, const char* where,
                                const char* key, int64_t absent,
                                int64_t* out_value) {
  *out_value = absent;
  const json_t* value = json_object_get(object, key);
  if (!value || json_is_null(value)) {
    return pcp_ok_status();
  }
  if (!json_is_integer(value) || json_integer_value(value) < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s%s must be a non-negative integer", where, key);
  }
  *out_value = json_integer_value(value);
  return pcp_ok_status();
}

static pcp_status_t service_parse(const json_t* value, uint32_t index,
                                  connect_parse_t* out) {
  char where[48];
  snprintf(where, sizeof(where), "services[%u].", index);
  if (!json_is_object(value)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "services[%u] must be an object", index);
  }
  pcp_sched_federation_service_t* s = &out->services[index];
  pcp_sched_federation_service_initialize(s);
  const struct {
    const char* key;
    const char** field;
  } strings[] = {
      {"service_id", &s->service_id},     {"executor_id", &s->executor_id},
      {"service_type", &s->service_type}, {"base_url", &s->base_url},
      {"auth_mode", &s->auth_mode},       {"health_status", &s->health_status},
      {"job_status", &s->job_status},     {"worker_class", &s->worker_class},
      {"target_arch", &s->target_arch},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(strings); ++i) {
    PCP_RETURN_IF_ERROR_BARE(
        string_field(value, where, strings[i].key, strings[i].field));
  }
  if (!s->base_url) {
    PCP_RETURN_IF_ERROR_BARE(
        string_field(value, where, "endpoint", &s->base_url));
  }
  const struct {
    const char* key;
    int64_t* field;
  } counts[] = {
      {"worker_count", &s->worker_count},
      {"ready_worker_count", &s->ready_worker_count},
      {"workers_connected", &s->workers_connected},
      {"workers_ready", &s->workers_ready},
      {"workers_available", &s->workers_available},
      {"workers_dispatchable", &s->workers_dispatchable},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(counts); ++i) {
    PCP_RETURN_IF_ERROR_BARE(count_field(value, where, counts[i].key,
                                         PCP_SCHED_FEDERATION_COUNT_ABSENT,
                                         counts[i].field));
  }
  int64_t updated_at_ms = 0;
  PCP_RETURN_IF_ERROR_BARE(
      count_field(value, where, "updated_at_ms", 0, &updated_at_ms));
  if (updated_at_ms > INT64_MAX / 1000000) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%supdated_at_ms is out of range", where);
  }
  s->updated_at_wall_ns = updated_at_ms * 1000000;
  const json_t* caps = json_object_get(value, "capabilities");
  if (caps && !json_is_null(caps)) {
    if (!json_is_array(caps) ||
        json_array_size(caps) > PCP_SCHED_FEDERATION_MAX_CAPABILITIES) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%scapabilities must be an array of at most %u "
                             "strings",
                             where, PCP_SCHED_FEDERATION_MAX_CAPABILITIES);
    }
    for (size_t c = 0; c < json_array_size(caps); ++c) {
      const json_t* cap = json_array_get(caps, c);
      if (!json_is_string(cap)) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "%scapabilities[%zu] must be a string", where,
                               c);
      }
      out->capabilities[index][c] = json_string_value(cap);
    }
    s->capabilities = out->capabilities[index];
    s->capability_count = (uint32_t)json_array_size(caps);
  }
  return pcp_ok_status();
}

// Parses a connect body (also a stored registration). Unknown keys are
// ignored (a newer gateway may send more); known keys of the wrong type and
// the state machine's rules are INVALID_ARGUMENT naming the key.
static pcp_status_t connect_parse(const json_t* body, connect_parse_t* out) {
  memset(&out->request, 0, sizeof(out->request));
  if (!json_is_object(body)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "the connect body must be a JSON object");
  }
  pcp_sched_federation_connect_t* r = &out->request;
  PCP_RETURN_IF_ERROR_BARE(
      string_field(body, "", "gateway_id", &r->gateway_id));
  PCP_RETURN_IF_ERROR_BARE(string_field(body, "", "lab_id", &r->lab_id));
  PCP_RETURN_IF_ERROR_BARE(string_field(body, "", "base_url", &r->base_url));
  PCP_RETURN_IF_ERROR_BARE(
      string_field(body, "", "graph_backend", &r->graph_backend));
  PCP_RETURN_IF_ERROR_BARE(count_field(body, "", "registered_services",
                                       PCP_SCHED_FEDERATION_COUNT_ABSENT,
                                       &r->registered_services));
  PCP_RETURN_IF_ERROR_BARE(
      count_field(body, "", "last_sequence_no", 0, &r->last_sequence_no));
  PCP_RETURN_IF_ERROR_BARE(count_field(body, "", "last_replicated_sequence", 0,
                                       &r->last_replicated_sequence));
  const char* status = NULL;
  PCP_RETURN_IF_ERROR_BARE(string_field(body, "", "status", &status));
  const json_t* services = json_object_get(body, "services");
  if (services && !json_is_null(services)) {
    if (!json_is_array(services) ||
        json_array_size(services) > PCP_SCHED_FEDERATION_MAX_SERVICES) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "services must be an array of at most %u "
                             "objects",
                             PCP_SCHED_FEDERATION_MAX_SERVICES);
    }
    for (size_t i = 0; i < json_array_size(services); ++i) {
      PCP_RETURN_IF_ERROR_BARE(
          service_parse(json_array_get(services, i), (uint32_t)i, out));
    }
    r->services = out->services;
    r->service_count = (uint32_t)json_array_size(services);
  }
  return pcp_ok_status();
}

static json_t* string_or_null(const char* value) {
  return value ? json_string(value) : json_null();
}

static json_t* service_json(const pcp_sched_federation_service_t* s) {
  json_t* caps = json_array();
  for (uint32_t c = 0; caps && c < s->capability_count; ++c) {
    json_array_append_new(caps, json_string(s->capabilities[c]));
  }
  return json_pack(
      "{s:s,s:s,s:s,s:o,s:s,s:s,s:s,s:o,s:o,s:o*,s:I,s:I,s:I,s:I,s:I,s:I,"
      "s:I}",
      "service_id", s->service_id, "executor_id", s->executor_id,
      "service_type", s->service_type, "base_url", string_or_null(s->base_url),
      "auth_mode", s->auth_mode, "health_status", s->health_status,
      "job_status", s->job_status, "worker_class",
      string_or_null(s->worker_class), "target_arch",
      string_or_null(s->target_arch), "capabilities", caps, "worker_count",
      (json_int_t)s->worker_count, "ready_worker_count",
      (json_int_t)s->ready_worker_count, "workers_connected",
      (json_int_t)s->workers_connected, "workers_ready",
      (json_int_t)s->workers_ready, "workers_available",
      (json_int_t)s->workers_available, "workers_dispatchable",
      (json_int_t)s->workers_dispatchable, "updated_at_ms",
      (json_int_t)(s->updated_at_wall_ns / 1000000));
}

static json_t* gateway_json(const pcp_sched_federation_gateway_t* g,
                            bool with_services) {
  json_t* out = json_pack(
      "{s:s,s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I}", "gateway_id", g->gateway_id,
      "lab_id", g->lab_id, "base_url", g->base_url, "graph_backend",
      g->graph_backend, "status", pcp_sched_federation_status_name(g->status),
      "registered_services", (json_int_t)g->registered_services,
      "last_sequence_no", (json_int_t)g->last_sequence_no,
      "last_replicated_sequence", (json_int_t)g->last_replicated_sequence,
      "connected_at_ms", (json_int_t)(g->connected_at_wall_ns / 1000000),
      "last_seen_at_ms", (json_int_t)(g->last_seen_wall_ns / 1000000));
  if (out && with_services) {
    json_t* services = json_array();
    for (uint32_t i = 0; services && i < g->service_count; ++i) {
      json_array_append_new(services, service_json(&g->services[i]));
    }
    json_object_set_new(out, "services", services ? services : json_null());
  }
  return out;
}

// {gateways:[...]} of every registration (mutex held by the caller).
static json_t* peers_json_locked(pcp_roles_hub_t* hub, int64_t now) {
  json_t* gateways = json_array();
  uint32_t count = pcp_sched_federation_gateway_count(hub->registry);
  for (uint32_t i = 0; gateways && i < count; ++i) {
    pcp_sched_federation_gateway_t g;
    pcp_status_t status =
        pcp_sched_federation_gateway_at(hub->registry, i, now, &g);
    if (!status) {
      json_array_append_new(gateways, gateway_json(&g, true));
    }
    pcp_status_ignore(status);
  }
  return json_pack("{s:o*}", "gateways", gateways);
}

//===----------------------------------------------------------------------===//
// Handlers
//===----------------------------------------------------------------------===//

static bool ready_fn(void* user_data, json_t* details) {
  pcp_roles_hub_t* hub = user_data;
  bool listening = atomic_load(&hub->listening);
  int64_t now = pcp_clock_now_ns(hub->clock);
  uint32_t connected = 0, stale = 0;
  pthread_mutex_lock(&hub->mutex);
  pcp_sched_federation_status_counts(hub->registry, now, &connected, &stale);
  pthread_mutex_unlock(&hub->mutex);
  // The store is open for the hub's whole life; a query proves the file is
  // still readable (a deleted or corrupt state dir shows here).
  int32_t version = 0;
  pcp_status_t status = pcp_store_schema_version_query(hub->store, &version);
  bool store_ok = !status;
  pcp_status_ignore(status);
  json_object_set_new(details, "mode", json_string("federation-hub"));
  json_object_set_new(details, "store", json_boolean(store_ok));
  json_object_set_new(details, "listening", json_boolean(listening));
  json_object_set_new(details, "registered_gateways",
                      json_integer(connected + stale));
  json_object_set_new(details, "connected_gateways", json_integer(connected));
  json_object_set_new(details, "stale_gateways", json_integer(stale));
  json_object_set_new(details, "auth_enabled",
                      json_boolean(hub->api_auth_enabled));
  json_object_set_new(details, "federation_auth_enabled",
                      json_boolean(hub->federation_auth_enabled));
  return listening && store_ok;
}

static pcp_status_t controller_get(void* user_data,
                                   const pcp_http_request_t* request,
                                   pcp_http_response_t* response) {
  (void)request;
  pcp_roles_hub_t* hub = user_data;
  int64_t now = pcp_clock_now_ns(hub->clock);
  uint32_t connected = 0, stale = 0;
  pthread_mutex_lock(&hub->mutex);
  pcp_sched_federation_status_counts(hub->registry, now, &connected, &stale);
  pthread_mutex_unlock(&hub->mutex);
  return pcp_http_response_json_take(
      response, 200,
      json_pack(
          "{s:s,s:s,s:I,s:I,s:I,s:I,s:b,s:b,s:I,s:I}", "mode", "federation-hub",
          "status", "running", "registered_gateways",
          (json_int_t)(connected + stale), "connected_gateways",
          (json_int_t)connected, "stale_gateways", (json_int_t)stale,
          "started_at_ms", (json_int_t)(hub->started_at_wall_ns / 1000000),
          "auth_enabled", hub->api_auth_enabled, "federation_auth_enabled",
          hub->federation_auth_enabled, "heartbeat_interval_ms",
          (json_int_t)hub->config->heartbeat_interval_ms, "stale_after_ms",
          (json_int_t)(hub->config->heartbeat_interval_ms *
                       PCP_SCHED_FEDERATION_STALE_INTERVALS)));
}

static pcp_status_t connect_post(void* user_data,
                                 const pcp_http_request_t* request,
                                 pcp_http_response_t* response) {
  pcp_roles_hub_t* hub = user_data;
  json_t* body = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_http_request_json_parse(request, &body));
  connect_parse_t* parsed = NULL;
  pcp_status_t alloc_status =
      pcp_allocator_calloc(hub->allocator, sizeof(*parsed), (void**)&parsed);
  if (alloc_status) {
    json_decref(body);
    return pcp_status_annotate_f(alloc_status, "connect");
  }
  pcp_status_t status = connect_parse(body, parsed);
  int64_t now = pcp_clock_now_ns(hub->clock);
  int64_t wall = pcp_clock_wall_ns(hub->clock);
  bool recovered = false;
  json_t* answer = NULL;
  int64_t connected_at = 0;
  if (!status) {
    pthread_mutex_lock(&hub->mutex);
    status = pcp_sched_federation_connect(hub->registry, &parsed->request, now,
                                          wall, &recovered);
    if (!status) {
      pcp_sched_federation_gateway_t g;
      status = pcp_sched_federation_gateway_find(
          hub->registry, parsed->request.gateway_id, now, &g);
      if (!status) {
        connected_at = g.connected_at_wall_ns;
        answer = json_pack("{s:b,s:o*,s:o*,s:I,s:I}", "accepted", 1, "gateway",
                           gateway_json(&g, true), "peers",
                           peers_json_locked(hub, now), "heartbeat_interval_ms",
                           (json_int_t)hub->config->heartbeat_interval_ms,
                           "stale_after_ms",
                           (json_int_t)(hub->config->heartbeat_interval_ms *
                                        PCP_SCHED_FEDERATION_STALE_INTERVALS));
      }
    }
    pthread_mutex_unlock(&hub->mutex);
  }
  if (!status) {
    // Persisted after the registry accepted it (the registry validates);
    // the registration is live in memory even if this write fails, and the
    // gateway's next connect writes it again.
    status = pcp_store_federation_gateway_put(
        hub->store, parsed->request.gateway_id, body, connected_at, wall);
    status = pcp_status_annotate_f(status, "persisting the registration");
  }
  const char* outcome = status      ? "rejected"
                        : recovered ? "recovered"
                                    : "accepted";
  const char* labels[] = {outcome};
  pcp_obs_family_add(hub->families[PCP_ROLES_HUB_METRIC_CONNECTS], labels, 1);
  if (!status && recovered) {
    PCP_LOG(PCP_LOG_INFO, &hub->log, "gateway %s is connected again",
            parsed->request.gateway_id);
  }
  pcp_allocator_free(hub->allocator, parsed);
  json_decref(body);
  if (status) {
    json_decref(answer);
    return status;
  }
  return pcp_http_response_json_take(response, 200, answer);
}

static pcp_status_t peers_get(void* user_data,
                              const pcp_http_request_t* request,
                              pcp_http_response_t* response) {
  (void)request;
  pcp_roles_hub_t* hub = user_data;
  pthread_mutex_lock(&hub->mutex);
  json_t* peers = peers_json_locked(hub, pcp_clock_now_ns(hub->clock));
  pthread_mutex_unlock(&hub->mutex);
  return pcp_http_response_json_take(response, 200, peers);
}

static pcp_status_t services_get(void* user_data,
                                 const pcp_http_request_t* request,
                                 pcp_http_response_t* response) {
  (void)request;
  pcp_roles_hub_t* hub = user_data;
  json_t* services = json_array();
  int64_t now = pcp_clock_now_ns(hub->clock);
  pthread_mutex_lock(&hub->mutex);
  uint32_t count = pcp_sched_federation_gateway_count(hub->registry);
  for (uint32_t i = 0; services && i < count; ++i) {
    pcp_sched_federation_gateway_t g;
    pcp_status_t status =
        pcp_sched_federation_gateway_at(hub->registry, i, now, &g);
    for (uint32_t s = 0; !status && s < g.service_count; ++s) {
      json_t* entry = service_json(&g.services[s]);
      if (entry) {
        json_object_set_new(entry, "gateway_id", json_string(g.gateway_id));
        json_object_set_new(entry, "lab_id", json_string(g.lab_id));
        json_object_set_new(entry, "gateway_base_url", json_string(g.base_url));
        json_object_set_new(
            entry, "gateway_status",
            json_string(pcp_sched_federation_status_name(g.status)));
        json_array_append_new(services, entry);
      }
    }
    pcp_status_ignore(status);
  }
  pthread_mutex_unlock(&hub->mutex);
  return pcp_http_response_json_take(response, 200,
                                     json_pack("{s:o*}", "services", services));
}

#include "hub/openapi_json.h"

static pcp_status_t openapi_get(void* user_data,
                                const pcp_http_request_t* request,
                                pcp_http_response_t* response) {
  (void)user_data;
  (void)request;
  return pcp_http_response_body_set(response, 200, "application/json",
                                    kHubOpenapiJson, strlen(kHubOpenapiJson));
}

static pcp_status_t core_routes_add(pcp_roles_hub_t* hub) {
  const pcp_http_route_t probes[] = {
      {"GET", "/healthz", NULL, pcp_http_healthz_handler, NULL, 0, 0},
      {"GET", "/readyz", NULL, pcp_http_readyz_handler, &hub->readyz, 0, 0},
      {"GET", "/metrics", NULL, metrics_get, hub, 0, 0},
      {"GET", "/openapi.json", NULL, openapi_get, hub, 0, 0},
  };
  PCP_RETURN_IF_ERROR_BARE(
      pcp_http_server_routes_add(hub->http, probes, PCP_ARRAYSIZE(probes)));
  const pcp_http_route_t routes[] = {
      {"GET", "/v1/controller", PCP_ROLES_HUB_SCOPE_API, controller_get, hub, 0,
       0},
      {"POST", "/v1/federation/connect", PCP_ROLES_HUB_SCOPE_FEDERATION,
       connect_post, hub, PCP_ROLES_HUB_MAX_BODY_BYTES, 0},
      {"GET", "/v1/federation/peers", PCP_ROLES_HUB_SCOPE_API, peers_get, hub,
       0, 0},
      {"GET", "/v1/federation/services", PCP_ROLES_HUB_SCOPE_API, services_get,
       hub, 0, 0},
  };
  return pcp_roles_hub_routes_add(hub, routes, PCP_ARRAYSIZE(routes));
}

//===----------------------------------------------------------------------===//
// Lifetime
//===----------------------------------------------------------------------===//

// Reads the registrations back: each one STALE until its gateway connects.
// A row that no longer parses (written by a newer hub, say) is logged and
// skipped, never fatal.
static pcp_status_t registrations_restore(pcp_roles_hub_t* hub) {
  pcp_store_federation_gateway_list_t list = {.allocator = hub->allocator};
  PCP_RETURN_IF_ERROR(pcp_store_federation_gateway_list(hub->store, &list),
                      "reading registrations");
  connect_parse_t* parsed = NULL;
  pcp_status_t alloc_status =
      pcp_allocator_calloc(hub->allocator, sizeof(*parsed), (void**)&parsed);
  if (alloc_status) {
    pcp_store_federation_gateway_list_deinitialize(&list);
    return pcp_status_annotate_f(alloc_status, "restore");
  }
  size_t restored = 0;
  for (size_t i = 0; i < list.count; ++i) {
    pcp_store_federation_gateway_t* row = &list.items[i];
    pcp_status_t status = connect_parse(row->registration, parsed);
    if (!status) {
      pthread_mutex_lock(&hub->mutex);
      status =
          pcp_sched_federation_restore(hub->registry, &parsed->request,
                                       row->connected_at_ns, row->last_seen_ns);
      pthread_mutex_unlock(&hub->mutex);
    }
    if (!status) {
      ++restored;
    } else {
      pcp_log_status(PCP_LOG_WARN, &hub->log, status,
                     "skipping a stored registration");
    }
    pcp_status_ignore(status);
  }
  pcp_allocator_free(hub->allocator, parsed);
  pcp_store_federation_gateway_list_deinitialize(&list);
  PCP_LOG(PCP_LOG_INFO, &hub->log,
          "restored %zu registration(s), stale until they connect", restored);
  return pcp_ok_status();
}

// Global jobs still "placing" were being forwarded when the previous hub
// process died: whether the gateway accepted them is unknown. They keep
// their state (the hub cannot tell "refused" from "accepted, answer lost")
// and get an error that says so, instead of looking in flight forever.
static pcp_status_t interrupted_jobs_mark(pcp_roles_hub_t* hub) {
  static const char kError[] =
      "the hub restarted before the gateway answered; the gateway may hold "
      "a child job the hub does not track";
  int64_t after = 0;
  size_t marked = 0;
  for (;;) {
    pcp_store_global_job_list_t page = {.allocator = hub->allocator};
    PCP_RETURN_IF_ERROR(pcp_store_global_job_list(
                            hub->store, after, PCP_STORE_LIST_LIMIT_MAX, &page),
                        "reading global jobs");
    pcp_status_t status = pcp_ok_status();
    for (size_t i = 0; !status && i < page.count; ++i) {
      const pcp_store_global_job_t* job = &page.items[i];
      if (strcmp(job->state, "placing") == 0 && !job->error[0]) {
        status = pcp_store_global_job_update(hub->store, job->number, "placing",
                                             NULL, NULL, kError);
        ++marked;
      }
    }
    size_t count = page.count;
    if (count) {
      after = page.items[count - 1].number;
    }
    pcp_store_global_job_list_deinitialize(&page);
    PCP_RETURN_IF_ERROR_BARE(status);
    if (count < PCP_STORE_LIST_LIMIT_MAX) {
      break;
    }
  }
  if (marked) {
    PCP_LOG(PCP_LOG_WARN, &hub->log,
            "%zu global job(s) were being forwarded when the hub stopped; "
            "marked with an error",
            marked);
  }
  return pcp_ok_status();
}

// Reads the variable |name| (NULL: none). Empty counts as unset.
static const char* token_of(const char* name) {
  const char* value = name ? getenv(name) : NULL;
  return value && value[0] ? value : NULL;
}

static pcp_status_t start(pcp_roles_hub_t* hub) {
  const T* c = hub->config;
  const char* api_token = token_of(c->api_token_env);
  const char* federation_token = token_of(c->federation_token_env);
  if (c->api_token_env && !api_token) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "--api-token-env names %s, which is unset or empty",
                           c->api_token_env);
  }
  if (c->federation_token_env && !federation_token) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "--federation-token-env names %s, which is unset "
                           "or empty",
                           c->federation_token_env);
  }
  if (api_token && federation_token &&
      pcp_http_token_equal(api_token, strlen(api_token), federation_token,
                           strlen(federation_token))) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "the API token (%s) and the federation token (%s) "
                           "must differ: clients and gateways hold separate "
                           "credentials",
                           c->api_token_env, c->federation_token_env);
  }
  hub->api_auth_enabled = api_token != NULL;
  hub->federation_auth_enabled = federation_token != NULL;
  if (federation_token) {
    PCP_RETURN_IF_ERROR(pcp_allocator_strdup(hub->allocator, federation_token,
                                             &hub->federation_token),
                        "token copy");
  }
  if (!hub->api_auth_enabled) {
    PCP_LOG(PCP_LOG_WARN, &hub->log,
            "no API token configured: client routes are open");
  }
  if (!hub->federation_auth_enabled) {
    PCP_LOG(PCP_LOG_WARN, &hub->log,
            "no federation token configured: gateway routes are open and "
            "calls to gateways carry no credential");
  }

  pcp_store_options_t store_options;
  pcp_store_options_initialize(&store_options);
  store_options.state_dir = c->state_dir;
  store_options.clock = hub->clock;
  PCP_RETURN_IF_ERROR(
      pcp_store_create(&store_options, hub->allocator, &hub->store),
      "opening the hub state in %s", c->state_dir);

  pcp_sched_federation_options_t registry_options;
  pcp_sched_federation_options_initialize(&registry_options);
  registry_options.heartbeat_interval_ns = c->heartbeat_interval_ms * 1000000;
  registry_options.max_gateways = (uint32_t)c->max_gateways;
  PCP_RETURN_IF_ERROR_BARE(pcp_sched_federation_create(
      &registry_options, hub->allocator, &hub->registry));
  PCP_RETURN_IF_ERROR_BARE(registrations_restore(hub));
  PCP_RETURN_IF_ERROR_BARE(interrupted_jobs_mark(hub));

  PCP_RETURN_IF_ERROR_BARE(
      pcp_obs_registry_create(hub->allocator, &hub->metrics));
  PCP_RETURN_IF_ERROR_BARE(pcp_obs_registry_register(
      hub->metrics, kMetrics, PCP_ROLES_HUB_METRIC_COUNT, hub->families));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_roles_process_metrics_register(hub->metrics, "federation-hub"));

  pcp_http_scope_t scopes[2];
  size_t scope_count = 0;
  if (api_token) {
    scopes[scope_count++] =
        (pcp_http_scope_t){PCP_ROLES_HUB_SCOPE_API, c->api_token_env};
  }
  if (federation_token) {
    scopes[scope_count++] = (pcp_http_scope_t){PCP_ROLES_HUB_SCOPE_FEDERATION,
                                               c->federation_token_env};
  }
  pcp_http_server_options_t http_options = {
      .name = "federation-hub",
      .host = c->api_host,
      .port = (uint16_t)c->api_port,
      .scopes = scopes,
      .scope_count = scope_count,
      .max_body_bytes = PCP_ROLES_HUB_MAX_BODY_BYTES,
      .registry = hub->metrics,
      .clock = hub->clock,
      // GET /v1/jobs and job routes wait on gateways (bounded by
      // --gateway-timeout-ms): more threads than the default four.
      .thread_count = 16,
  };
  PCP_RETURN_IF_ERROR_BARE(
      pcp_http_server_create(&http_options, hub->allocator, &hub->http));
  hub->readyz.ready = ready_fn;
  hub->readyz.user_data = hub;
  PCP_RETURN_IF_ERROR_BARE(core_routes_add(hub));
  PCP_RETURN_IF_ERROR_BARE(pcp_roles_hub_jobs_routes_add(hub));
  PCP_RETURN_IF_ERROR_BARE(pcp_roles_hub_replication_routes_add(hub));
  PCP_RETURN_IF_ERROR(pcp_http_server_start(hub->http),
                      "the hub API (--api-host/--api-port)");
  atomic_store(&hub->listening, true);
  return pcp_ok_status();
}

static int run(void* opaque) {
  T* config = opaque;
  pcp_roles_hub_t hub;
  memset(&hub, 0, sizeof(hub));
  hub.config = config;
  hub.allocator = pcp_allocator_system();
  hub.clock = pcp_clock_system();
  hub.log.role = "federation-hub";
  hub.started_at_wall_ns = pcp_clock_wall_ns(hub.clock);
  pthread_mutex_init(&hub.mutex, NULL);
  pcp_status_t status = pcp_roles_signals_install();
  if (!status) {
    status = start(&hub);
  }
  int exit_code = 0;
  if (!status) {
    char port[16], interval[24];
    snprintf(port, sizeof(port), "%u",
             (unsigned)pcp_http_server_port(hub.http));
    snprintf(interval, sizeof(interval), "%" PRId64,
             config->heartbeat_interval_ms);
    const char* pairs[] = {
        "api_host",
        config->api_host,
        "api_port",
        port,
        "state_dir",
        config->state_dir,
        "api_token_env",
        config->api_token_env,
        "federation_token_env",
        config->federation_token_env,
        "heartbeat_interval_ms",
        interval,
    };
    pcp_roles_log_event("federation-hub", "started", pairs,
                        PCP_ARRAYSIZE(pairs) / 2);
    int signal_number = pcp_roles_signals_wait();
    const char* stop_pairs[] = {"signal",
                                signal_number == SIGINT ? "SIGINT" : "SIGTERM"};
    pcp_roles_log_event("federation-hub", "stopping", stop_pairs, 1);
  } else {
    pcp_log_status(PCP_LOG_ERROR, &hub.log, status, "start failed");
    pcp_status_ignore(status);
    exit_code = 1;
  }
  atomic_store(&hub.listening, false);
  if (hub.http) {
    pcp_status_ignore(pcp_http_server_stop(hub.http, 5000));
    pcp_http_server_release(hub.http);
  }
  pcp_sched_federation_release(hub.registry);
  pcp_store_release(hub.store);
  pcp_obs_registry_release(hub.metrics);
  pcp_allocator_free(hub.allocator, hub.federation_token);
  pthread_mutex_destroy(&hub.mutex);
  return exit_code;
}

const pcp_roles_def_t pcp_roles_hub_def = {
    .role = PCP_ROLES_ROLE_FEDERATION_HUB,
    .flag = "--federation-hub",
    .usage =
        "pcp --federation-hub --state-dir DIR [flags]\n\n"
        "Runs the federation hub that gateways connect to: the gateway\n"
        "registry (stale after 3 missed heartbeats), placement of training\n"
        "and RL jobs across gateways as global jobs, state in SQLite under\n"
        "--state-dir (docs/federation.md).",
    .table = &pcp_roles_hub_table,
    .config_size = sizeof(T),
    .prepare = prepare,
    .run = run,
};
