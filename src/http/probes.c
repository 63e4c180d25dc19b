// SPDX-License-Identifier: Apache-2.0
//
// Ready-made /healthz, /readyz and /metrics handlers, shared by the
// gateway, the federation hub and the node manager.

#include <string.h>

#include "http/http_impl.h"

// Prometheus text of a busy gateway is tens of KiB; the cap only stops a
// runaway registry from taking the process with it.
#define PCP_HTTP_MAX_METRICS_BYTES (64u << 20)

pcp_status_t pcp_http_healthz_handler(void* user_data,
                                      const pcp_http_request_t* request,
                                      pcp_http_response_t* response) {
  PCP_UNUSED(user_data);
  PCP_UNUSED(request);
  static const char kBody[] = "{\"status\":\"ok\"}";
  return pcp_http_response_body_set(response, 200, "application/json", kBody,
                                    sizeof(kBody) - 1);
}

pcp_status_t pcp_http_metrics_handler(void* user_data,
                                      const pcp_http_request_t* request,
                                      pcp_http_response_t* response) {
  PCP_UNUSED(request);
  pcp_obs_registry_t* registry = user_data;
  if (!registry) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "no metrics registry configured");
  }
  // Rendered through the server's allocator and copied into the body (a
  // builder's buffer is not libc memory, which body_take needs).
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(response->allocator, PCP_HTTP_MAX_METRICS_BYTES,
                                &builder);
  pcp_status_t status = pcp_obs_registry_render(registry, &builder);
  if (!status) {
    status = pcp_http_response_body_set(response, 200, PCP_OBS_CONTENT_TYPE,
                                        pcp_string_builder_cstring(&builder),
                                        builder.size);
  }
  pcp_string_builder_deinitialize(&builder);
  PCP_RETURN_IF_ERROR(status, "rendering metrics");
  return pcp_ok_status();
}

pcp_status_t pcp_http_readyz_handler(void* user_data,
                                     const pcp_http_request_t* request,
                                     pcp_http_response_t* response) {
  PCP_UNUSED(request);
  const pcp_http_readyz_t* readyz = user_data;
  json_t* details = json_object();
  if (!details) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory building /readyz");
  }
  bool ready =
      readyz && readyz->ready && readyz->ready(readyz->user_data, details);
  json_t* body = json_pack("{s:b}", "ready", ready);
  if (!body || json_object_update_missing(body, details) != 0) {
    json_decref(body);
    json_decref(details);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory building /readyz");
  }
  json_decref(details);
  pcp_status_t status =
      pcp_http_response_json_set(response, ready ? 200 : 503, body);
  json_decref(body);
  return status;
}

pcp_status_t pcp_http_server_probes_add(pcp_http_server_t* server,
                                        pcp_obs_registry_t* registry,
                                        pcp_http_readyz_t* readyz) {
  const pcp_http_route_t routes[] = {
      {"GET", "/healthz", NULL, pcp_http_healthz_handler, NULL, 0, 0},
      {"GET", "/readyz", NULL, pcp_http_readyz_handler, readyz, 0, 0},
      {"GET", "/metrics", NULL, pcp_http_metrics_handler, registry, 0, 0},
  };
  PCP_RETURN_IF_ERROR_BARE(pcp_http_server_routes_add(server, &routes[0], 1));
  if (readyz) {
    PCP_RETURN_IF_ERROR_BARE(pcp_http_server_routes_add(server, &routes[1], 1));
  }
  if (registry) {
    PCP_RETURN_IF_ERROR_BARE(pcp_http_server_routes_add(server, &routes[2], 1));
  }
  return pcp_ok_status();
}
