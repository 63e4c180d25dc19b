// SPDX-License-Identifier: Apache-2.0
//
// The services' private parts (never included outside src/services/).
//
// One pcp_services_t per gateway process, created and released by the
// gateway's main thread (services.c). Threads that touch it: the HTTP
// handler threads (the routes in services.h), the federation thread
// (federation.c) and the proxy threads (proxy.c). Everything shared is
// thread-safe by itself (the store, the graph backend, the fabric endpoint,
// the inference service) or guarded by the federation's and replication's
// own mutexes.

#ifndef PCP_SERVICES_SERVICES_IMPL_H_
#define PCP_SERVICES_SERVICES_IMPL_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "services/services.h"

// Workers one fabric snapshot lists for the advertised worker counts (the
// gateway's GET /v1/workers lists as many).
#define PCP_SERVICES_MAX_LISTED_WORKERS 1024u

typedef struct pcp_services_federation_t pcp_services_federation_t;
// replication.c (graph replication; opaque).
typedef struct pcp_services_replication_t pcp_services_replication_t;

// What one cycle's step gets (all borrowed, valid during the call).
typedef struct pcp_services_federation_link_t {
  pcp_http_client_t* client;  // the federation thread's client (keep-alive)
  const char* upstream;       // hub base URL, no trailing '/'
  const char* token;          // federation bearer token; NULL: none
  const json_t* answer;       // the hub's reply to this cycle's connect
} pcp_services_federation_link_t;

// A step run by the federation thread after every successful connect (the
// hub is reachable): graph replication (repl) plugs in here. Its error is
// recorded as the status's last_error ("replication: ...") without
// marking the link disconnected. Federation thread only.
typedef pcp_status_t (*pcp_services_federation_step_fn_t)(
    pcp_services_t* svc, const pcp_services_federation_link_t* link);

// In the files moved from the gateway (graph.c, replication.c,
// federation.c, proxy.c, registry.c) the services are still named |g|, as
// the gateway state was: the move stays a small diff for concurrent edits.
struct pcp_services_t {
  pcp_services_config_t config;  // strings borrowed from the gateway config
  pcp_allocator_t allocator;
  pcp_clock_t clock;
  pcp_log_context_t log;
  pcp_services_event_log_fn_t event_log;  // NULL: none
  pcp_store_t* store;                     // borrowed
  pcp_store_graph_backend_t* graph;       // graph.c; the log stays in |store|
  // Set by pcp_services_start (borrowed; NULL before).
  pcp_fabric_endpoint_t* fabric;
  pcp_infer_service_t* infer;
  pcp_http_server_t* http;
  atomic_bool* draining;

  // Graph replication (replication.c): policies, push thread, status.
  pcp_services_replication_t* replication;
  // Federation client (federation.c); NULL until pcp_services_start.
  pcp_services_federation_t* federation;
  pcp_services_federation_step_fn_t federation_step;  // NULL: none
};

// True while the gateway drains (false before pcp_services_start).
bool pcp_services_draining(const pcp_services_t* svc);

// graph.c: opens the configured graph backend over |store| (create) and
// closes it (release, before the store).
PCP_MUST_USE_RESULT pcp_status_t pcp_services_graph_open(pcp_services_t* svc);
void pcp_services_graph_close(pcp_services_t* svc);

// proxy.c: clears the process-wide stop flag (a test may serve several
// gateways in turn).
void pcp_services_proxy_reset(void);
// openai.c: the cap on requests without streaming at once, re-read from
// the test hook PCP_GATEWAY_TEST_INFER_MAX_BLOCKING (pcp_services_start).
void pcp_services_openai_limits_reset(void);

// replication.c: graph replication (docs/federation.md "Graph
// replication"). _start before the federation state is made (it installs
// the push as the federation step when federation is on); _stop after the
// HTTP server and the federation thread stopped. All else is thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_services_replication_start(pcp_services_t* svc);
void pcp_services_replication_stop(pcp_services_t* svc);
// One push cycle: eligible mutations after the replicated mark go to the
// hub in batches; the mark moves only past what the hub acknowledged. A
// no-op without a hub. The federation thread runs it after every connect
// (cycles never overlap).
PCP_MUST_USE_RESULT pcp_status_t
pcp_services_replication_cycle(pcp_services_t* svc);
// Applies a /v1/graph/mutate mutation (|request| its JSON) through the
// graph backend: a missing visibility becomes the namespace policy's
// default_visibility; a policy_update is validated, merged into the policy
// in force and logged as the whole snapshot (policy writes serialized).
// Errors as pcp_store_graph_backend_mutation_apply.
PCP_MUST_USE_RESULT pcp_status_t pcp_services_replication_mutation_apply(
    pcp_services_t* svc, json_t* request, pcp_store_mutation_t* mutation,
    int64_t* out_sequence_no, bool* out_duplicate);
// After a policy_update was applied (_mutation_apply calls it).
void pcp_services_replication_policies_changed(pcp_services_t* svc);
// query_mode global / local_plus_global of POST /v1/graph/query: asks the
// hub (502 FederationHubQueryFailed JSON when it fails), filters by
// visibility and merges local-first with |local_result| (ignored for
// global), cutting each array at |limit| (0: none).
PCP_MUST_USE_RESULT pcp_status_t pcp_services_replication_query(
    pcp_services_t* svc, json_t* body, const char* mode, json_t* local_result,
    size_t limit, pcp_http_response_t* response);
// The same without a response (query-then-infer may use it): |*out_result|
// a new reference; INVALID_ARGUMENT for an unknown mode or no hub,
// UNAVAILABLE "FederationHubQueryFailed: ..." when the hub fails (answer
// 502).
PCP_MUST_USE_RESULT pcp_status_t pcp_services_replication_query_run(
    pcp_services_t* svc, json_t* body, const char* mode, json_t* local_result,
    size_t limit, json_t** out_result);
// The replication status (GET /v1/graph/replication); NULL on error.
json_t* pcp_services_replication_status_json(pcp_services_t* svc);

// federation.c: the client of the federation hub (docs/federation.md
// "Gateway federation client").
//
// With `federation.enabled`, one thread POSTs {upstream}/v1/federation/
// connect every heartbeat_interval_ms with the federation token, advertising
// this gateway's services with worker counts per (backend, target); on
// failure it retries with exponential backoff and jitter (bounded). Stop
// wakes it through a condition variable (no long sleep to wait out).

// Sets the per-cycle step (NULL: none). Call before
// pcp_services_federation_start (main thread).
void pcp_services_federation_step_set(pcp_services_t* svc,
                                      pcp_services_federation_step_fn_t step);
// Creates the client state (always: without federation the routes report
// "disabled"). INVALID_ARGUMENT naming the key for a bad upstream or
// advertise_url.
PCP_MUST_USE_RESULT pcp_status_t
pcp_services_federation_create(pcp_services_t* svc);

#endif  // PCP_SERVICES_SERVICES_IMPL_H_
