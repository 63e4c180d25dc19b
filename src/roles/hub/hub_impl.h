// SPDX-License-Identifier: Apache-2.0
//
// Private to src/roles/hub: the running federation hub (docs/federation.md).
//
// One pcp_roles_hub_t per process, built by hub.c's run() on the main thread
// and torn down after the HTTP server has stopped. Handlers run on the HTTP
// server's threads:
//   - |registry| (the pure state machine of sched.h "Federation") is guarded
//     by |mutex|; hold it only for registry calls, never across I/O;
//   - |store| is thread-safe on its own (one SQLite connection, its mutex);
//   - metric families are lock-free.
// Calls from the hub to gateways always carry the FEDERATION token (never a
// client's bearer) and are bounded by |gateway_timeout_ms|.
//
// Extending the hub (graph replication, policies, ...): add a file under
// src/roles/hub with its own route table and register it from
// pcp_roles_hub_replication_routes_add (called by hub.c after the core
// routes, before the server starts) through pcp_roles_hub_routes_add, which
// drops scopes whose token is not configured (those routes are then open,
// as the hub's own). State a component needs goes behind |extension|.

#ifndef PCP_ROLES_HUB_HUB_IMPL_H_
#define PCP_ROLES_HUB_HUB_IMPL_H_

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "http/http.h"
#include "obs/obs.h"
#include "roles/roles_impl.h"
#include "sched/sched.h"
#include "store/store.h"

// Route scopes: clients use the hub's API token, gateways the federation
// token (a separate secret; the hub refuses to start when they are equal).
#define PCP_ROLES_HUB_SCOPE_API "api"
#define PCP_ROLES_HUB_SCOPE_FEDERATION "federation"

// Global jobs fetched by one GET /v1/jobs page (each one a gateway request,
// made in parallel by at most PCP_ROLES_HUB_FANOUT_THREADS threads).
#define PCP_ROLES_HUB_JOBS_PAGE_MAX 100u
#define PCP_ROLES_HUB_FANOUT_THREADS 16u
// Bodies: connect and job submits (1 MiB, upstream's hub cap); cancel.
#define PCP_ROLES_HUB_MAX_BODY_BYTES (1u << 20)
#define PCP_ROLES_HUB_MAX_CANCEL_BODY_BYTES (64u << 10)

enum {
  PCP_ROLES_HUB_METRIC_GATEWAYS,
  PCP_ROLES_HUB_METRIC_PLACEMENTS,
  PCP_ROLES_HUB_METRIC_GLOBAL_JOBS,
  PCP_ROLES_HUB_METRIC_GATEWAY_REQUESTS,
  PCP_ROLES_HUB_METRIC_CONNECTS,
  PCP_ROLES_HUB_METRIC_COUNT,
};

typedef struct pcp_roles_hub_t {
  const pcp_roles_hub_config_t* config;
  pcp_allocator_t allocator;
  pcp_clock_t clock;
  pcp_log_context_t log;
  pcp_store_t* store;
  pthread_mutex_t mutex;  // guards |registry|
  pcp_sched_federation_t* registry;
  pcp_http_server_t* http;
  pcp_obs_registry_t* metrics;
  pcp_obs_family_t* families[PCP_ROLES_HUB_METRIC_COUNT];
  pcp_http_readyz_t readyz;
  _Atomic bool listening;  // the server has started and not begun to stop
  bool api_auth_enabled;
  bool federation_auth_enabled;
  // The federation token's value, sent to gateways (NULL: none configured).
  char* federation_token;
  int64_t started_at_wall_ns;
  // Owned by an extension (replication.c); NULL until it sets it.
  void* extension;
} pcp_roles_hub_t;

// Adds |routes| to the hub's server, dropping each route's scope when that
// scope has no token configured (the route is then open). Before start only.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_hub_routes_add(
    pcp_roles_hub_t* hub, const pcp_http_route_t* routes, size_t route_count);

// Registers the graph replication routes (replication.c). The build links a
// stub (replication_stub.c) that adds none until replication lands.
PCP_MUST_USE_RESULT pcp_status_t
pcp_roles_hub_replication_routes_add(pcp_roles_hub_t* hub);

// Global job routes (jobs.c).
PCP_MUST_USE_RESULT pcp_status_t
pcp_roles_hub_jobs_routes_add(pcp_roles_hub_t* hub);

// Refreshes the gauges that depend on time or on the store (gateways per
// status, global jobs per state); called before /metrics renders.
void pcp_roles_hub_metrics_refresh(pcp_roles_hub_t* hub);

//===----------------------------------------------------------------------===//
// Calling gateways
//===----------------------------------------------------------------------===//

typedef struct pcp_roles_hub_call_t {
  int http_status;  // 0 when no answer came
  json_t* body;     // parsed answer (NULL when empty or not JSON); owned
  char* raw;        // the answer's bytes (NUL-terminated); owned
  size_t raw_length;
  pcp_allocator_t raw_allocator;  // made |raw| (the HTTP client's)
} pcp_roles_hub_call_t;

void pcp_roles_hub_call_deinitialize(pcp_roles_hub_call_t* call);

// |method| {base_url}{path} with |body| (may be NULL) as application/json,
// bearer = the federation token, bounded by the gateway timeout. Any HTTP
// status is OK (read it from |out_call|); UNAVAILABLE / DEADLINE_EXCEEDED
// when the gateway could not be reached in time. Counts the request in
// pcp_hub_gateway_requests_total. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_hub_gateway_call(
    pcp_roles_hub_t* hub, const char* method, const char* base_url,
    const char* path, const char* body, size_t body_length,
    pcp_roles_hub_call_t* out_call);

// Current base URL of |gateway_id| when it is registered, else |fallback|.
// Copies into |out_url| (capacity PCP_SCHED_FEDERATION_URL_MAX_LENGTH + 1).
void pcp_roles_hub_gateway_url(pcp_roles_hub_t* hub, const char* gateway_id,
                               const char* fallback, char* out_url);

// Wall-clock milliseconds for JSON.
int64_t pcp_roles_hub_now_ms(const pcp_roles_hub_t* hub);

#endif  // PCP_ROLES_HUB_HUB_IMPL_H_
