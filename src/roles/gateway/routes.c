// SPDX-License-Identifier: Apache-2.0
// The gateway's HTTP API in one table: every route with its method, path
// pattern, token scope, handler and whose state the handler gets (the
// gateway's or the embedded services'). The probes (/healthz, /readyz) are
// the http module's. The OpenAI inference routes are the table's last rows
// (their handlers are services/openai.c's).
//
// Scopes are declared by intent and resolved once against the tokens the
// config names, so a route never names a scope the server does not have:
// without an API token the /v1 routes are open (as upstream, with a warning
// at start); POST /v1/internal/events takes the internal token when one is
// configured, else the API one; the hub's /v1/internal/federation/* routes
// take the federation token, and without one every such route answers 401
// (an open internal route would let anyone place work as the hub).
//
// Order is registration order: the router breaks ties between equally
// specific patterns by it, and a 405's Allow header lists methods in it.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "roles/gateway/gateway_impl.h"

// Body of an internal job submission (an experiment is small).
#define GATEWAY_FEDERATION_MAX_JOB_BODY_BYTES ((size_t)1 << 20)

//===----------------------------------------------------------------------===//
// /v1/internal/federation/* (the hub's calls, federation token)
//===----------------------------------------------------------------------===//

// Keys the hub adds to a job body for its own bookkeeping; not part of the
// experiment.
static const char* const kPlacementKeys[] = {
    "service_id",
    "executor_id",
    "global_job_id",
    "placement",
    "gateway_id",
    "worker_class",
    "target_arch",
    "workers_required",
    // The hub reads the training kind to choose the capability.
    "training_kind",
    "model_type",
};

// The experiment of a hub job body ({"job": {...}}, the hub's wrapped
// form, or the experiment itself) as JSON text without the hub's
// placement keys; |global_copy| (128 bytes) gets its global_job_id.
static pcp_status_t internal_experiment_text(const pcp_http_request_t* request,
                                             const char* route_hint,
                                             char** out_text,
                                             char* global_copy) {
  *out_text = NULL;
  global_copy[0] = 0;
  json_t* body = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_http_request_json_parse(request, &body));
  if (!json_is_object(body)) {
    json_decref(body);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "the body must be a JSON object (an experiment, "
                           "as for %s)",
                           route_hint);
  }
  json_t* job = json_object_get(body, "job");
  json_t* experiment =
      json_is_object(job) ? json_deep_copy(job) : json_deep_copy(body);
  json_t* global_job_id = json_object_get(body, "global_job_id");
  const char* global_id =
      json_is_string(global_job_id) ? json_string_value(global_job_id) : NULL;
  if (global_id) {
    snprintf(global_copy, 128, "%s", global_id);
  }
  json_decref(body);
  if (!experiment) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "job body");
  }
  for (size_t i = 0; i < PCP_ARRAYSIZE(kPlacementKeys); ++i) {
    json_object_del(experiment, kPlacementKeys[i]);
  }
  char* text = json_dumps(experiment, JSON_COMPACT);
  json_decref(experiment);
  if (!text) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "job body");
  }
  *out_text = text;
  return pcp_ok_status();
}

static void internal_accepted_log(const char* global_copy) {
  const char* pairs[] = {"global_job_id",
                         global_copy[0] ? global_copy : "(none)"};
  pcp_roles_log_event("gateway", "federation job accepted", pairs, 1);
}

static pcp_status_t internal_training_submit(void* user_data,
                                             const pcp_http_request_t* request,
                                             pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  char global_copy[128];
  char* text = NULL;
  PCP_RETURN_IF_ERROR_BARE(internal_experiment_text(
      request, "POST /v1/training/jobs", &text, global_copy));
  pcp_status_t status =
      pcp_roles_gateway_training_text_submit(g, text, strlen(text), response);
  pcp_libc_free(text);
  if (!status) {
    internal_accepted_log(global_copy);
  }
  return status;
}

// The hub places RL jobs here since this gateway advertises an "rl"
// service (services/federation.c): the experiment as for POST /v1/rl/jobs.
static pcp_status_t internal_rl_submit(void* user_data,
                                       const pcp_http_request_t* request,
                                       pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  char global_copy[128];
  char* text = NULL;
  PCP_RETURN_IF_ERROR_BARE(internal_experiment_text(request, "POST /v1/rl/jobs",
                                                    &text, global_copy));
  pcp_status_t status =
      pcp_roles_gateway_rl_text_submit(g, text, strlen(text), response);
  pcp_libc_free(text);
  if (!status) {
    internal_accepted_log(global_copy);
  }
  return status;
}

// Every /v1/internal/federation/* route when no federation token is set.
static pcp_status_t internal_unconfigured(void* user_data,
                                          const pcp_http_request_t* request,
                                          pcp_http_response_t* response) {
  (void)user_data;
  (void)request;
  (void)response;
  return pcp_make_status(PCP_STATUS_UNAUTHENTICATED,
                         "no federation token is configured on this gateway "
                         "(gateway config key 'federation.token_env')");
}

//===----------------------------------------------------------------------===//
// The table
//===----------------------------------------------------------------------===//

typedef enum route_scope_e {
  ROUTE_OPEN = 0,    // no token (the static files)
  ROUTE_API,         // "api" when an API token is configured, else open
  ROUTE_EVENTS,      // "internal" when configured, else as ROUTE_API
  ROUTE_FEDERATION,  // "federation"; without the token: 401 (see above)
} route_scope_t;

// Whose state the handler gets as |user_data|.
typedef enum route_owner_e {
  ROUTE_GATEWAY = 0,   // pcp_roles_gateway_state_t
  ROUTE_SERVICES = 1,  // pcp_services_t (src/services)
} route_owner_t;

typedef struct route_t {
  const char* method;
  const char* pattern;
  route_scope_t scope;
  pcp_http_handler_fn_t handler;
  route_owner_t owner;
  size_t max_body_bytes;  // 0: the server's default
} route_t;

#define GW ROUTE_GATEWAY
#define SV ROUTE_SERVICES

static const route_t kRoutes[] = {
    // Static files (server.c): the dashboard and the OpenAPI document.
    {"GET", "/", ROUTE_OPEN, pcp_roles_gateway_static_get, GW, 0},
    {"GET", "/dashboard.css", ROUTE_OPEN, pcp_roles_gateway_static_get, GW, 0},
    {"GET", "/dashboard.js", ROUTE_OPEN, pcp_roles_gateway_static_get, GW, 0},
    {"GET", "/openapi.json", ROUTE_OPEN, pcp_roles_gateway_static_get, GW, 0},
    // Controller and workers (server.c).
    {"GET", "/v1/controller", ROUTE_API, pcp_roles_gateway_controller_get, GW,
     0},
    {"GET", "/v1/workers", ROUTE_API, pcp_roles_gateway_workers_list, GW, 0},
    {"GET", "/v1/workers/{id}", ROUTE_API, pcp_roles_gateway_worker_get, GW, 0},
    // Service registry (services/registry.c).
    {"GET", "/v1/services", ROUTE_API, pcp_services_registry_list, SV, 0},
    {"POST", "/v1/services/register", ROUTE_API, pcp_services_registry_register,
     SV, 0},
    {"GET", "/v1/services/{id}", ROUTE_API, pcp_services_registry_get, SV, 0},
    {"DELETE", "/v1/services/{id}", ROUTE_API, pcp_services_registry_delete, SV,
     0},
    {"POST", "/v1/services/{id}/heartbeat", ROUTE_API,
     pcp_services_registry_heartbeat, SV, 0},
    // Generic jobs (jobs.c).
    {"POST", "/v1/jobs", ROUTE_API, pcp_roles_gateway_job_submit, GW,
     PCP_GATEWAY_JOB_MAX_BODY_BYTES},
    {"GET", "/v1/jobs", ROUTE_API, pcp_roles_gateway_job_list, GW, 0},
    {"GET", "/v1/jobs/{id}", ROUTE_API, pcp_roles_gateway_job_get, GW, 0},
    {"POST", "/v1/jobs/{id}/cancel", ROUTE_API, pcp_roles_gateway_job_cancel,
     GW, 0},
    {"GET", "/v1/jobs/{id}/events", ROUTE_API, pcp_roles_gateway_job_events, GW,
     0},
    {"GET", "/v1/jobs/{id}/results", ROUTE_API, pcp_roles_gateway_job_results,
     GW, 0},
    {"GET", "/v1/jobs/{id}/results/{name}", ROUTE_API,
     pcp_roles_gateway_job_result_get, GW, 0},
    // Training (training.c).
    {"POST", "/v1/training/jobs", ROUTE_API, pcp_roles_gateway_training_submit,
     GW, 0},
    {"GET", "/v1/training/jobs/{id}", ROUTE_API, pcp_roles_gateway_training_get,
     GW, 0},
    // RL (rl.c; the GRPO job kind, workloads/rl/job.c).
    {"POST", "/v1/rl/jobs", ROUTE_API, pcp_roles_gateway_rl_submit, GW,
     GATEWAY_FEDERATION_MAX_JOB_BODY_BYTES},
    {"GET", "/v1/rl/jobs/{id}", ROUTE_API, pcp_roles_gateway_rl_get, GW, 0},
    // Event stream (events.c).
    {"GET", "/v1/events", ROUTE_API, pcp_roles_gateway_events_stream, GW, 0},
    // Knowledge graph (services/graph.c).
    {"GET", "/v1/graph/status", ROUTE_API, pcp_services_graph_status_get, SV,
     0},
    {"POST", "/v1/graph/mutate", ROUTE_API, pcp_services_graph_mutate_post, SV,
     0},
    {"POST", "/v1/graph/query", ROUTE_API, pcp_services_graph_query_post, SV,
     0},
    {"GET", "/v1/graph/entities/{id}", ROUTE_API, pcp_services_graph_entity_get,
     SV, 0},
    // Graph replication (services/replication.c).
    {"GET", "/v1/graph/policies", ROUTE_API, pcp_services_graph_policies_get,
     SV, 0},
    {"PUT", "/v1/graph/policies/*", ROUTE_API, pcp_services_graph_policy_put,
     SV, 0},
    {"GET", "/v1/graph/replication", ROUTE_API,
     pcp_services_graph_replication_get, SV, 0},
    {"POST", "/v1/internal/events", ROUTE_EVENTS,
     pcp_services_events_ingest_post, SV, PCP_SERVICES_EVENTS_MAX_BODY_BYTES},
    // Federation client (services/federation.c).
    {"GET", "/v1/federation/status", ROUTE_API,
     pcp_services_federation_status_get, SV, 0},
    {"GET", "/v1/federation/peers", ROUTE_API,
     pcp_services_federation_peers_get, SV, 0},
    {"GET", "/v1/federation/services", ROUTE_API,
     pcp_services_federation_services_get, SV, 0},
    {"GET", "/v1/federation/replication", ROUTE_API,
     pcp_services_federation_replication_get, SV, 0},
    {"POST", "/v1/federation/connect", ROUTE_API,
     pcp_services_federation_connect_post, SV, 0},
    {"GET", "/v1/capabilities", ROUTE_API, pcp_services_capabilities_get, SV,
     0},
    // The hub's calls for the jobs it places here (above; jobs.c).
    {"POST", "/v1/internal/federation/training/jobs", ROUTE_FEDERATION,
     internal_training_submit, GW, GATEWAY_FEDERATION_MAX_JOB_BODY_BYTES},
    {"POST", "/v1/internal/federation/rl/jobs", ROUTE_FEDERATION,
     internal_rl_submit, GW, GATEWAY_FEDERATION_MAX_JOB_BODY_BYTES},
    {"GET", "/v1/internal/federation/jobs/{id}", ROUTE_FEDERATION,
     pcp_roles_gateway_job_get, GW, 0},
    {"POST", "/v1/internal/federation/jobs/{id}/cancel", ROUTE_FEDERATION,
     pcp_roles_gateway_job_cancel, GW, 0},
    // Service proxy and query-then-infer (services/proxy.c).
    {"POST", "/v1/inference/chat/completions", ROUTE_API,
     pcp_services_inference_proxy_post, SV,
     PCP_SERVICES_PROXY_MAX_REQUEST_BYTES},
    {"POST", "/v1/inference/query/chat/completions", ROUTE_API,
     pcp_services_query_infer_post, SV, PCP_SERVICES_PROXY_MAX_REQUEST_BYTES},
    // The dashboard's charts (training.c; workloads/train/history.c).
    {"GET", "/v1/training/jobs/{id}/history", ROUTE_API,
     pcp_roles_gateway_training_history, GW, 0},
    // OpenAI-compatible inference (services/openai.c); last, as they were
    // registered after the table before (no pattern above overlaps them).
    {"GET", "/v1/models", ROUTE_API, pcp_services_openai_models_list, SV, 0},
    {"GET", "/v1/models/*", ROUTE_API, pcp_services_openai_model_get, SV, 0},
    {"POST", "/v1/chat/completions", ROUTE_API,
     pcp_services_openai_chat_completions_post, SV,
     2 * PCP_INFER_MAX_PROMPT_BYTES},
    {"POST", "/v1/completions", ROUTE_API, pcp_services_openai_completions_post,
     SV, 2 * PCP_INFER_MAX_PROMPT_BYTES},
};

#undef GW
#undef SV

size_t pcp_roles_gateway_route_count(void) {
  return PCP_ARRAYSIZE(kRoutes);
}

void pcp_roles_gateway_routes_resolve(
    const pcp_roles_gateway_route_tokens_t* tokens, void* gateway,
    void* services, pcp_http_route_t* out_routes) {
  const char* api = tokens->api ? "api" : NULL;
  const char* events = tokens->internal ? "internal" : api;
  for (size_t i = 0; i < PCP_ARRAYSIZE(kRoutes); ++i) {
    const route_t* r = &kRoutes[i];
    pcp_http_route_t* out = &out_routes[i];
    *out = (pcp_http_route_t){
        .method = r->method,
        .pattern = r->pattern,
        .handler = r->handler,
        .user_data = r->owner == ROUTE_SERVICES ? services : gateway,
        .max_body_bytes = r->max_body_bytes,
    };
    switch (r->scope) {
      case ROUTE_OPEN:
        out->scope = NULL;
        break;
      case ROUTE_API:
        out->scope = api;
        break;
      case ROUTE_EVENTS:
        out->scope = events;
        break;
      case ROUTE_FEDERATION:
        out->scope = tokens->federation ? "federation" : NULL;
        if (!tokens->federation) {
          out->handler = internal_unconfigured;
        }
        break;
    }
  }
}

pcp_status_t pcp_roles_gateway_routes_add(pcp_roles_gateway_state_t* g) {
  pcp_http_scope_t federation_scope;
  const pcp_roles_gateway_route_tokens_t tokens = {
      .api = g->auth_enabled,
      .internal = g->config->effective.internal_api_token_env != NULL,
      .federation =
          pcp_services_federation_scope(g->services, &federation_scope),
  };
  pcp_http_route_t routes[PCP_ARRAYSIZE(kRoutes)];
  pcp_roles_gateway_routes_resolve(&tokens, g, g->services, routes);
  return pcp_http_server_routes_add(g->http, routes, PCP_ARRAYSIZE(routes));
}
