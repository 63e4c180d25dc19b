// SPDX-License-Identifier: Apache-2.0
// The service registry (/v1/services*, upstream s.3.1.1): services running
// outside the gateway (an inference server, a controller) register with a
// TTL and heartbeat; the store keeps them and lists them until they expire.
// The federation client advertises them to the hub and the proxy routes
// completions to them.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "services/services_impl.h"

static json_t* service_json(const pcp_store_service_t* s) {
  json_t* out = json_deep_copy(s->attributes);
  if (!out || !json_is_object(out)) {
    json_decref(out);
    out = json_object();
  }
  json_object_set_new(out, "executor_id", json_string(s->executor_id));
  json_object_set_new(out, "service_id", json_string(s->service_id));
  json_object_set_new(out, "service_type", json_string(s->service_type));
  json_object_set_new(out, "base_url", json_string(s->base_url));
  json_object_set_new(out, "ttl_ms", json_integer(s->ttl_ns / 1000000));
  json_object_set_new(out, "registered_at_ms",
                      json_integer(s->registered_at_ns / 1000000));
  json_object_set_new(out, "updated_at_ms",
                      json_integer(s->updated_at_ns / 1000000));
  json_object_set_new(out, "heartbeat_at_ms",
                      json_integer(s->heartbeat_at_ns / 1000000));
  json_object_set_new(out, "expires_at_ms",
                      json_integer(s->expires_at_ns / 1000000));
  json_object_set_new(out, "expired", json_boolean(s->expired));
  return out;
}

static const char* string_field(json_t* object, const char* key) {
  json_t* v = json_object_get(object, key);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

//===----------------------------------------------------------------------===//
// /v1/services
//===----------------------------------------------------------------------===//

#define SERVICE_DEFAULT_TTL_MS 30000
#define SERVICE_MAX_TTL_MS 86400000

// Largest worker count a service may report: far above any real pool, low
// enough that the sums and maxima below cannot overflow.
#define SERVICE_MAX_WORKER_COUNT 1000000

// An optional non-negative integer field: |*out_value| = the value, or -1
// when absent. INVALID_ARGUMENT naming the field otherwise.
static pcp_status_t count_field(json_t* body, const char* key,
                                json_int_t* out_value) {
  *out_value = -1;
  json_t* v = json_object_get(body, key);
  if (!v || json_is_null(v)) {
    return pcp_ok_status();
  }
  if (!json_is_integer(v) || json_integer_value(v) < 0 ||
      json_integer_value(v) > SERVICE_MAX_WORKER_COUNT) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "field '%s' must be an integer in [0, %d]", key,
                           SERVICE_MAX_WORKER_COUNT);
  }
  *out_value = json_integer_value(v);
  return pcp_ok_status();
}

// The first present value of |values| (-1 = absent), else |fallback|.
static json_int_t first_present(const json_int_t* values, size_t count,
                                json_int_t fallback) {
  for (size_t i = 0; i < count; ++i) {
    if (values[i] >= 0) {
      return values[i];
    }
  }
  return fallback;
}

// Checks the optional fields of a registration (reference s.3.1.1) and
// writes their normalised form into |attributes|: defaults for auth_mode,
// health_status and job_status, and the worker counts reduced to upstream's
// (connected, ready, available) under every name a reader may look for, so
// that a service reporting only `worker_count` and one reporting only
// `workers_available` read the same way. Each error names its field.
static pcp_status_t service_fields_normalize(json_t* body, json_t* attributes) {
  const char* const kStrings[] = {
      "auth_mode",   "health_status", "job_status", "worker_class",
      "target_arch", "executor_id",   "base_url",   "endpoint"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(kStrings); ++i) {
    json_t* v = json_object_get(body, kStrings[i]);
    if (v && !json_is_null(v) &&
        (!json_is_string(v) || json_string_length(v) > 1024)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "field '%s' must be a string (at most 1024 "
                             "bytes)",
                             kStrings[i]);
    }
  }
  json_t* capabilities = json_object_get(body, "capabilities");
  if (capabilities && !json_is_null(capabilities)) {
    if (!json_is_array(capabilities) || json_array_size(capabilities) > 256) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "field 'capabilities' must be an array of at "
                             "most 256 strings");
    }
    for (size_t i = 0; i < json_array_size(capabilities); ++i) {
      if (!json_is_string(json_array_get(capabilities, i))) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "field 'capabilities[%zu]' must be a string", i);
      }
    }
  } else {
    json_object_set_new(attributes, "capabilities", json_array());
  }
  const char* const kDefaults[][2] = {{"auth_mode", "none"},
                                      {"health_status", "ok"},
                                      {"job_status", "running"}};
  for (size_t i = 0; i < PCP_ARRAYSIZE(kDefaults); ++i) {
    if (!json_is_string(json_object_get(body, kDefaults[i][0]))) {
      json_object_set_new(attributes, kDefaults[i][0],
                          json_string(kDefaults[i][1]));
    }
  }
  enum {
    WORKER_COUNT,
    READY_WORKER_COUNT,
    WORKERS_CONNECTED,
    WORKERS_READY,
    WORKERS_AVAILABLE,
    WORKERS_DISPATCHABLE,
    RESERVED_WORKERS,
    MAX_WORKERS,
    COUNT_FIELDS,
  };
  const char* const kCounts[COUNT_FIELDS] = {
      "worker_count",     "ready_worker_count", "workers_connected",
      "workers_ready",    "workers_available",  "workers_dispatchable",
      "reserved_workers", "max_workers"};
  json_int_t c[COUNT_FIELDS];
  for (int i = 0; i < COUNT_FIELDS; ++i) {
    PCP_RETURN_IF_ERROR_BARE(count_field(body, kCounts[i], &c[i]));
  }
  // Upstream's precedence, name by name (s.3.1.1).
  json_int_t connected = first_present(
      (json_int_t[]){c[WORKERS_CONNECTED], c[WORKER_COUNT]}, 2, 0);
  json_int_t ready = first_present(
      (json_int_t[]){c[WORKERS_READY], c[READY_WORKER_COUNT],
                     c[WORKERS_AVAILABLE], c[WORKERS_DISPATCHABLE]},
      4, connected);
  json_int_t available = first_present(
      (json_int_t[]){c[WORKERS_DISPATCHABLE], c[WORKERS_AVAILABLE],
                     c[READY_WORKER_COUNT], c[WORKERS_READY]},
      4, connected);
  // Exactly upstream's two steps, in its order, so that a client sees the
  // numbers it saw there (connected can end below available when only
  // workers_ready < workers_available were reported; upstream keeps that).
  connected = connected > ready ? connected : ready;
  ready = ready > available ? ready : available;
  json_object_set_new(attributes, "worker_count", json_integer(connected));
  json_object_set_new(attributes, "workers_connected", json_integer(connected));
  json_object_set_new(attributes, "workers_ready", json_integer(ready));
  json_object_set_new(attributes, "ready_worker_count",
                      json_integer(available));
  json_object_set_new(attributes, "workers_available", json_integer(available));
  json_object_set_new(attributes, "workers_dispatchable",
                      json_integer(available));
  return pcp_ok_status();
}

// service_type: 1..PCP_STORE_NAME_MAX_LENGTH of [A-Za-z0-9_.-] (upstream
// allows 128; the store's name column holds 127).
static bool service_type_valid(const char* type) {
  size_t n = strlen(type);
  if (n < 1 || n > PCP_STORE_NAME_MAX_LENGTH) {
    return false;
  }
  for (size_t i = 0; i < n; ++i) {
    char ch = type[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
          (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == '-')) {
      return false;
    }
  }
  return true;
}

pcp_status_t pcp_services_registry_register(void* user_data,
                                            const pcp_http_request_t* request,
                                            pcp_http_response_t* response) {
  pcp_services_t* g = user_data;
  json_t* body = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_http_request_json_parse(request, &body));
  pcp_status_t status = pcp_ok_status();
  pcp_store_service_t s;
  memset(&s, 0, sizeof(s));
  const char* service_id = string_field(body, "service_id");
  const char* service_type = string_field(body, "service_type");
  const char* base_url = string_field(body, "base_url");
  if (!base_url) {
    base_url = string_field(body, "endpoint");
  }
  const char* executor_id = string_field(body, "executor_id");
  json_t* ttl = json_object_get(body, "ttl_ms");
  if (!json_is_object(body)) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "the body must be a JSON object");
  } else if (!service_id || !service_id[0]) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "field 'service_id' (string) is required");
  } else if (!service_type || !service_type[0]) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "field 'service_type' (string) is required");
  } else if (!service_type_valid(service_type)) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "field 'service_type' must be 1..%d characters "
                             "of [A-Za-z0-9_.-]",
                             PCP_STORE_NAME_MAX_LENGTH);
  } else if (json_object_get(body, "base_url") &&
             !json_is_string(json_object_get(body, "base_url"))) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "field 'base_url' must be a string");
  } else if (!base_url || !base_url[0]) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "field 'base_url' (or 'endpoint') is required");
  } else if (ttl && (!json_is_integer(ttl) || json_integer_value(ttl) < 1000 ||
                     json_integer_value(ttl) > SERVICE_MAX_TTL_MS)) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "field 'ttl_ms' must be an integer in [1000, %d]",
                             SERVICE_MAX_TTL_MS);
  }
  if (!status && service_id && service_type && base_url) {
    int n =
        executor_id
            ? snprintf(s.executor_id, sizeof(s.executor_id), "%s", executor_id)
            : snprintf(s.executor_id, sizeof(s.executor_id), "%s:%s:%s",
                       g->config.gateway_id, service_type, service_id);
    if (n < 0 || (size_t)n >= sizeof(s.executor_id) ||
        strlen(service_id) >= sizeof(s.service_id) ||
        strlen(service_type) >= sizeof(s.service_type) ||
        strlen(base_url) >= sizeof(s.base_url)) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "an id, type or base_url is too long");
    }
  }
  if (!status && service_id && service_type && base_url) {
    snprintf(s.service_id, sizeof(s.service_id), "%s", service_id);
    snprintf(s.service_type, sizeof(s.service_type), "%s", service_type);
    snprintf(s.base_url, sizeof(s.base_url), "%s", base_url);
    s.ttl_ns = (ttl ? json_integer_value(ttl) : SERVICE_DEFAULT_TTL_MS) *
               INT64_C(1000000);
    json_t* attributes = json_deep_copy(body);
    const char* const kOwn[] = {"service_id", "service_type", "base_url",
                                "endpoint",   "executor_id",  "ttl_ms"};
    for (size_t i = 0; attributes && i < PCP_ARRAYSIZE(kOwn); ++i) {
      json_object_del(attributes, kOwn[i]);
    }
    status = attributes ? service_fields_normalize(body, attributes)
                        : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                                          "service attributes");
    s.attributes = attributes;
    if (!status) {
      status = pcp_store_service_register(g->store, &s);
    }
    json_decref(attributes);
    s.attributes = NULL;
  }
  json_decref(body);
  PCP_RETURN_IF_ERROR_BARE(status);
  pcp_store_service_t stored;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_service_get(g->store, s.executor_id, &stored));
  json_t* out =
      json_pack("{s:b, s:o}", "accepted", 1, "service", service_json(&stored));
  pcp_store_service_deinitialize(&stored);
  return pcp_http_response_json_take(response, 200, out);
}

pcp_status_t pcp_services_registry_heartbeat(void* user_data,
                                             const pcp_http_request_t* request,
                                             pcp_http_response_t* response) {
  pcp_services_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  PCP_RETURN_IF_ERROR_BARE(pcp_store_service_heartbeat(g->store, id));
  pcp_store_service_t stored;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_service_get(g->store, id, &stored));
  json_t* out = service_json(&stored);
  pcp_store_service_deinitialize(&stored);
  return pcp_http_response_json_take(response, 200, out);
}

pcp_status_t pcp_services_registry_list(void* user_data,
                                        const pcp_http_request_t* request,
                                        pcp_http_response_t* response) {
  pcp_services_t* g = user_data;
  const char* type = pcp_http_request_query(request, "service_type");
  pcp_store_service_list_t list = {0};
  PCP_RETURN_IF_ERROR_BARE(pcp_store_service_list(
      g->store, pcp_http_request_query(request, "after"), 0, &list));
  json_t* services = json_array();
  for (size_t i = 0; i < list.count; ++i) {
    // Expired services are gone for clients even before the sweep runs.
    if (list.items[i].expired ||
        (type && strcmp(type, list.items[i].service_type) != 0)) {
      continue;
    }
    json_array_append_new(services, service_json(&list.items[i]));
  }
  pcp_store_service_list_deinitialize(&list);
  return pcp_http_response_json_take(response, 200,
                                     json_pack("{s:o}", "services", services));
}

pcp_status_t pcp_services_registry_get(void* user_data,
                                       const pcp_http_request_t* request,
                                       pcp_http_response_t* response) {
  pcp_services_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  pcp_store_service_t stored;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_service_get(g->store, id, &stored));
  bool expired = stored.expired;
  json_t* out = service_json(&stored);
  pcp_store_service_deinitialize(&stored);
  if (expired) {
    json_decref(out);
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "service %s expired", id);
  }
  return pcp_http_response_json_take(response, 200, out);
}

pcp_status_t pcp_services_registry_delete(void* user_data,
                                          const pcp_http_request_t* request,
                                          pcp_http_response_t* response) {
  pcp_services_t* g = user_data;
  const char* id = pcp_http_request_param(request, "id");
  PCP_RETURN_IF_ERROR_BARE(pcp_store_service_delete(g->store, id));
  return pcp_http_response_json_take(
      response, 200, json_pack("{s:b, s:s}", "deleted", 1, "executor_id", id));
}
