// SPDX-License-Identifier: Apache-2.0
//
// services: the services a gateway embeds beside its workloads, each with
// its HTTP routes (docs/federation.md, docs/api.md):
//   - the service registry (/v1/services*, registry.c);
//   - the knowledge-graph API (/v1/graph/*) over the configured graph
//     backend (graph.c);
//   - graph replication: namespace policies, event ingest, the push of
//     eligible mutations to the hub, the global query modes (replication.c),
//     and the pure parts the hub shares (replication_common.c, the last
//     section of this header);
//   - the federation client: the connect loop to the hub, what it
//     advertises, /v1/federation/* and /v1/capabilities (federation.c);
//   - the service proxy and query-then-infer
//     (/v1/inference/{,query/}chat/completions, proxy.c);
//   - OpenAI's wire shapes that more than one route writes (openai.c).
//
// Layering: above workloads, fabric, store and http, below roles. The
// gateway (src/roles/gateway) wires them: it fills pcp_services_config_t
// from its config, calls create / start / federation_start / proxy_stop /
// federation_stop / stop / release in that order, and lists the handlers
// below in its route table with the pcp_services_t as |user_data| (the
// route's token scope is the gateway's decision, not the services').
//
// Threads: the handlers run on the HTTP server's threads; the federation
// client runs one thread and replication's push runs on it; proxied calls
// run on their own threads. Lifecycle calls: the gateway's main thread.
// Ownership: every pointer in the options is borrowed and must outlive the
// services.

#ifndef PCP_SERVICES_SERVICES_H_
#define PCP_SERVICES_SERVICES_H_

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "config/config.h"
#include "fabric/fabric.h"
#include "http/http.h"
#include "store/store.h"
#include "workloads/workloads.h"

//===----------------------------------------------------------------------===//
// Configuration and lifecycle
//===----------------------------------------------------------------------===//

// Gateway config key 'falkordb' (used when graph_backend is falkordb).
typedef struct pcp_services_falkordb_config_t {
  bool present;
  const char* host;  // NULL: 127.0.0.1
  int64_t port;      // 0: 6379
  const char* password_env;
  const char* graph;  // NULL: "pcp"
  int64_t connect_timeout_ms;
  int64_t command_timeout_ms;
} pcp_services_falkordb_config_t;

// The gateway config's other service blocks, parsed by the tables below.
// Key 'neo4j': parsed and refused (graph_backend neo4j is not offered).
typedef struct pcp_services_neo4j_config_t {
  bool present;
  char* uri;
  char* http_uri;
  char* user;
  char* password_env;
  char* database;
  int64_t query_timeout_ms;
  bool bootstrap_on_connect;
} pcp_services_neo4j_config_t;

typedef struct pcp_services_federation_config_t {
  bool present;
  bool enabled;
  char* upstream;
  char* token_env;
  int64_t heartbeat_interval_ms;
  // The gateway's API URL as the hub and its peers should call it (NULL:
  // http(s)://<--api-host>:<bound port>, 127.0.0.1 for a wildcard host).
  char* advertise_url;
} pcp_services_federation_config_t;

typedef struct pcp_services_sharing_config_t {
  bool present;
  int32_t default_visibility;  // local | shared | global
} pcp_services_sharing_config_t;

// The config tables of those blocks (services/config.c): the gateway's
// file table nests them under 'neo4j', 'falkordb', 'federation' and
// 'sharing_defaults'; the services own their keys, ranges and defaults.
extern const pcp_config_table_t pcp_services_neo4j_config_table;
extern const pcp_config_table_t pcp_services_falkordb_config_table;
extern const pcp_config_table_t pcp_services_federation_config_table;
extern const pcp_config_table_t pcp_services_sharing_config_table;

// What the services read of the gateway's config (strings borrowed).
typedef struct pcp_services_config_t {
  const char* gateway_id;
  const char* lab_id;
  bool graph_falkordb;  // graph_backend falkordb; else SQLite (in the store)
  pcp_services_falkordb_config_t falkordb;
  // sharing_defaults.default_visibility (local when absent).
  pcp_store_visibility_t default_visibility;
  // Key 'federation': present / enabled / advertise_url (NULL: derived from
  // the API address); the effective upstream, token env and interval.
  bool federation_present;
  bool federation_enabled;
  const char* federation_advertise_url;
  const char* federation_upstream;  // NULL: no hub
  const char* federation_token_env;
  int64_t federation_heartbeat_interval_ms;  // 0: 5000
  // The gateway's API address (query-then-infer calls it; federation
  // advertises it) and whether it serves TLS.
  const char* api_host;
  int64_t api_port;
  bool tls;
  // The service ids advertised for the embedded training and inference
  // services (controllers.<kind>.service_id or the defaults).
  const char* training_service_id;
  const char* inference_service_id;
  // The embedded RL service's id (controllers.rl.service_id; NULL:
  // "rl-main"): advertised beside training, one record per worker group.
  const char* rl_service_id;
} pcp_services_config_t;

// One structured event line (the gateway's "federation connected").
typedef void (*pcp_services_event_log_fn_t)(const char* msg,
                                            const char* const* pairs,
                                            size_t pair_count);

typedef struct pcp_services_options_t {
  pcp_services_config_t config;
  pcp_store_t* store;  // borrowed
  pcp_clock_t clock;
  pcp_log_context_t log;
  pcp_services_event_log_fn_t event_log;  // NULL: none
} pcp_services_options_t;

typedef struct pcp_services_t pcp_services_t;

// Creates the services over |options->store| and opens the graph backend
// (SQLite in the store, or FalkorDB). INVALID_ARGUMENT naming the key
// ('falkordb.password_env' unset), the backend's errors,
// RESOURCE_EXHAUSTED. |*out_services| is set before the backend opens, so
// release it after an error too.
PCP_MUST_USE_RESULT pcp_status_t
pcp_services_create(const pcp_services_options_t* options,
                    pcp_allocator_t allocator, pcp_services_t** out_services);

// What the services use once the gateway's engines exist (borrowed).
typedef struct pcp_services_links_t {
  pcp_fabric_endpoint_t* fabric;
  pcp_infer_service_t* infer;  // NULL: no inference engine
  pcp_http_server_t* http;     // the advertised URL reads its port
  atomic_bool* draining;       // the gateway's drain flag
} pcp_services_links_t;

// Starts graph replication and makes the federation state (no thread yet).
// Before the HTTP server starts. INVALID_ARGUMENT naming the key for a bad
// federation.upstream or federation.advertise_url; RESOURCE_EXHAUSTED.
PCP_MUST_USE_RESULT pcp_status_t
pcp_services_start(pcp_services_t* services, const pcp_services_links_t* links);

// Starts the federation connect thread when federation is enabled. After
// the HTTP server started (the advertised URL needs its port): the hub may
// call back as soon as it runs. FAILED_PRECONDITION before _start,
// UNAVAILABLE when the thread cannot start.
PCP_MUST_USE_RESULT pcp_status_t
pcp_services_federation_start(pcp_services_t* services);

// Ends the proxied calls in flight (waits up to |timeout_ms| for them); new
// ones are refused. Process-wide (one gateway per process). First at stop:
// a query-then-infer call waits on the gateway's own inference.
void pcp_services_proxy_stop(int64_t timeout_ms);

// Wakes and joins the federation thread (bounded by one hub request's
// timeout) and frees its state. After the HTTP server stopped (its handlers
// read that state). NULL-safe.
void pcp_services_federation_stop(pcp_services_t* services);

// Stops graph replication; after the federation thread and the HTTP server
// stopped. NULL-safe.
void pcp_services_stop(pcp_services_t* services);

// Closes the graph backend and frees the services; before the store is
// released. NULL-safe.
void pcp_services_release(pcp_services_t* services);

// The HTTP scope of the hub's calls ({"federation", token env}); false when
// no federation token env is configured. Thread-safe.
bool pcp_services_federation_scope(const pcp_services_t* services,
                                   pcp_http_scope_t* out_scope);

// The graph backend's name ("sqlite", "falkordb"). Thread-safe.
const char* pcp_services_graph_backend_name(const pcp_services_t* services);

//===----------------------------------------------------------------------===//
// Routes (|user_data|: the pcp_services_t; the gateway's route table)
//===----------------------------------------------------------------------===//

// Bodies of a proxied chat completion (either route).
#define PCP_SERVICES_PROXY_MAX_REQUEST_BYTES \
  (2 * (size_t)PCP_INFER_MAX_PROMPT_BYTES)
// Body of POST /v1/internal/events.
#define PCP_SERVICES_EVENTS_MAX_BODY_BYTES ((size_t)8 << 20)

// registry.c: the service registry. GET /v1/services, POST
// /v1/services/register, GET and DELETE /v1/services/{id}, POST
// /v1/services/{id}/heartbeat.
pcp_status_t pcp_services_registry_list(void* user_data,
                                        const pcp_http_request_t* request,
                                        pcp_http_response_t* response);
pcp_status_t pcp_services_registry_register(void* user_data,
                                            const pcp_http_request_t* request,
                                            pcp_http_response_t* response);
pcp_status_t pcp_services_registry_get(void* user_data,
                                       const pcp_http_request_t* request,
                                       pcp_http_response_t* response);
pcp_status_t pcp_services_registry_delete(void* user_data,
                                          const pcp_http_request_t* request,
                                          pcp_http_response_t* response);
pcp_status_t pcp_services_registry_heartbeat(void* user_data,
                                             const pcp_http_request_t* request,
                                             pcp_http_response_t* response);

// graph.c: GET /v1/graph/status, POST /v1/graph/mutate, POST
// /v1/graph/query, GET /v1/graph/entities/{id}.
pcp_status_t pcp_services_graph_status_get(void* user_data,
                                           const pcp_http_request_t* request,
                                           pcp_http_response_t* response);
pcp_status_t pcp_services_graph_mutate_post(void* user_data,
                                            const pcp_http_request_t* request,
                                            pcp_http_response_t* response);
pcp_status_t pcp_services_graph_query_post(void* user_data,
                                           const pcp_http_request_t* request,
                                           pcp_http_response_t* response);
pcp_status_t pcp_services_graph_entity_get(void* user_data,
                                           const pcp_http_request_t* request,
                                           pcp_http_response_t* response);

// replication.c: GET /v1/graph/policies, PUT /v1/graph/policies/*, GET
// /v1/graph/replication, POST /v1/internal/events.
pcp_status_t pcp_services_graph_policies_get(void* user_data,
                                             const pcp_http_request_t* request,
                                             pcp_http_response_t* response);
pcp_status_t pcp_services_graph_policy_put(void* user_data,
                                           const pcp_http_request_t* request,
                                           pcp_http_response_t* response);
pcp_status_t pcp_services_graph_replication_get(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response);
pcp_status_t pcp_services_events_ingest_post(void* user_data,
                                             const pcp_http_request_t* request,
                                             pcp_http_response_t* response);

// federation.c: GET /v1/federation/{status,peers,services,replication},
// POST /v1/federation/connect, GET /v1/capabilities.
pcp_status_t pcp_services_federation_status_get(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response);
pcp_status_t pcp_services_federation_peers_get(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response);
pcp_status_t pcp_services_federation_services_get(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response);
pcp_status_t pcp_services_federation_replication_get(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response);
pcp_status_t pcp_services_federation_connect_post(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response);
pcp_status_t pcp_services_capabilities_get(void* user_data,
                                           const pcp_http_request_t* request,
                                           pcp_http_response_t* response);

// proxy.c: POST /v1/inference/chat/completions (to a registered service)
// and POST /v1/inference/query/chat/completions (query-then-infer).
pcp_status_t pcp_services_inference_proxy_post(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response);
pcp_status_t pcp_services_query_infer_post(void* user_data,
                                           const pcp_http_request_t* request,
                                           pcp_http_response_t* response);

//===----------------------------------------------------------------------===//
// OpenAI shapes (openai.c)
//===----------------------------------------------------------------------===//

// OpenAI's error body {"error": {"message", "type", "param", "code"}}
// (|param| and |code| NULL: JSON null). New reference; NULL on OOM.
// Thread-safe.
json_t* pcp_services_openai_error_json(const char* message, const char* type,
                                       const char* param, const char* code);
// Answers |http_status| with that body, the message formatted from
// |format| (cut at 1 KiB). Errors as pcp_http_response_json_take.
PCP_MUST_USE_RESULT pcp_status_t pcp_services_openai_error_reply(
    pcp_http_response_t* response, int http_status, const char* type,
    const char* param, const char* code, const char* format, ...)
    PCP_PRINTF_ATTR(6, 7);
// Sends |value| (reference taken) as one compact-JSON "data:" event named
// |event| (NULL: unnamed) on |stream|. RESOURCE_EXHAUSTED when it cannot be
// serialized; errors as pcp_http_sse_stream_send.
PCP_MUST_USE_RESULT pcp_status_t pcp_services_openai_sse_json_send(
    pcp_http_sse_stream_t* stream, const char* event, json_t* value);
// The OpenAI-compatible inference routes over the services' inference
// engine (|user_data| the pcp_services_t, after pcp_services_start): GET
// /v1/models, GET /v1/models/* (404 model_not_found), POST
// /v1/chat/completions and POST /v1/completions (bodies up to
// 2 * PCP_INFER_MAX_PROMPT_BYTES; "stream": true answers SSE chunks and
// "[DONE]"). Errors are OpenAI's body, 429 past 24 requests without
// streaming at once. Thread-safe.
pcp_status_t pcp_services_openai_models_list(void* user_data,
                                             const pcp_http_request_t* request,
                                             pcp_http_response_t* response);
pcp_status_t pcp_services_openai_model_get(void* user_data,
                                           const pcp_http_request_t* request,
                                           pcp_http_response_t* response);
pcp_status_t pcp_services_openai_chat_completions_post(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response);
pcp_status_t pcp_services_openai_completions_post(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response);

//===----------------------------------------------------------------------===//
// Graph replication shared with the hub
//===----------------------------------------------------------------------===//

// Knowledge-graph replication, the parts the gateway (push, policies, event
// ingest, query modes) and the hub (apply, global query) share: namespace
// policy eligibility, the wire form of a replicated mutation, batch
// building, the visibility filter and the local-first merge of query
// results (docs/federation.md "Graph replication"). Pure functions over
// store records and JSON: no I/O, no locks, all thread-compatible.
// Log records a gateway reads per page and items it sends per POST
// (upstream s.6.4: 128 and 64).
#define PCP_SERVICES_REPLICATION_PAGE_RECORDS 128u
#define PCP_SERVICES_REPLICATION_BATCH_ITEMS 64u
// Items the hub accepts in one POST /v1/federation/mutations, and the body
// cap of that route (64 items of up to 1 MiB JSON each would not fit: a
// gateway sends fewer items when they are large, see _batch_build).
#define PCP_SERVICES_REPLICATION_MAX_ITEMS 256u
#define PCP_SERVICES_REPLICATION_MAX_BODY_BYTES ((size_t)16 << 20)
// Namespace policy snapshots in one batch.
#define PCP_SERVICES_REPLICATION_MAX_POLICIES 256u
// Events in one POST /v1/internal/events (two mutations each).
#define PCP_SERVICES_EVENTS_MAX_PER_REQUEST 256u

// The policy of a namespace without one: |default_visibility|, nothing
// replicates (upstream s.6.5).
void pcp_services_replication_policy_default(
    const char* namespace_id, pcp_store_visibility_t default_visibility,
    pcp_store_graph_policy_t* out_policy);

// |namespace_id|'s policy in |policies| (sorted by namespace id, as
// pcp_store_graph_policy_list returns them), else the default.
void pcp_services_replication_policy_lookup(
    const pcp_store_graph_policy_list_t* policies, const char* namespace_id,
    pcp_store_visibility_t default_visibility,
    pcp_store_graph_policy_t* out_policy);

// True when |mutation| may leave its gateway under |policy|: visibility
// shared or global, allow_global_replication, and for observations also
// allow_raw_payload_export (their payload is raw data). policy_update
// records never travel as items (the batch carries policy snapshots).
bool pcp_services_replication_eligible(const pcp_store_graph_policy_t* policy,
                                       const pcp_store_mutation_t* mutation);

// True when an item of |visibility| and |kind| ("entity", "relation",
// "observation") in a namespace under |policy| may be answered by a global
// query. NULL |policy|: visibility alone decides.
bool pcp_services_replication_visible_globally(
    const pcp_store_graph_policy_t* policy, pcp_store_visibility_t visibility,
    bool is_observation);

// {namespace_id, default_visibility, allow_global_replication,
// allow_raw_payload_export, updated_at_ms}. NULL on OOM.
json_t* pcp_services_replication_policy_json(
    const pcp_store_graph_policy_t* policy);

// Applies the keys of |update| (an object with any of default_visibility,
// allow_global_replication, allow_raw_payload_export) to |inout_policy|.
// INVALID_ARGUMENT naming the key for a wrong type, an unknown visibility or
// an unknown key. With |allow_snapshot_keys| the keys namespace_id and
// updated_at_ms are accepted and ignored (a snapshot sent by a gateway).
PCP_MUST_USE_RESULT pcp_status_t
pcp_services_replication_policy_update(json_t* update, bool allow_snapshot_keys,
                                       pcp_store_graph_policy_t* inout_policy);

// The payload of a policy_update record holding |policy| in full.
json_t* pcp_services_replication_policy_payload(
    const pcp_store_graph_policy_t* policy);

// Wire form of one replicated record: {sequence_no, mutation_id,
// namespace_id, mutation_type, target_id, payload_json, visibility,
// provenance_json, timestamp_ns}; the two *_json fields hold JSON text (as
// upstream). NULL on OOM.
json_t* pcp_services_replication_item_json(
    const pcp_store_mutation_t* mutation);

// Parses a wire item into |out_mutation| (payload and provenance are new
// references: release with pcp_services_replication_item_deinitialize, also
// after an error). INVALID_ARGUMENT naming the field.
PCP_MUST_USE_RESULT pcp_status_t pcp_services_replication_item_parse(
    json_t* item, pcp_store_mutation_t* out_mutation);
void pcp_services_replication_item_deinitialize(pcp_store_mutation_t* mutation);

// Builds one batch from |page| (log records in sequence order) starting at
// |*inout_index|: eligible records (under |policies|, namespaces without a
// policy get |default_visibility| and replicate nothing) become items, up to
// |max_items| and about |max_bytes| of item text (at least one item);
// ineligible ones are skipped. |*inout_index| moves past every record
// examined and |*out_through| is the sequence number of the last one (0 when
// none was examined), which the sender may mark replicated once the batch is
// acknowledged (or at once when nothing is to be sent). |*out_policies|
// holds the snapshot in force of each namespace with an item or with a
// policy_update record among those examined, once: a batch with policies
// but no items is still sent. New references.
PCP_MUST_USE_RESULT pcp_status_t pcp_services_replication_batch_build(
    const pcp_store_mutation_list_t* page, size_t* inout_index,
    const pcp_store_graph_policy_list_t* policies,
    pcp_store_visibility_t default_visibility, size_t max_items,
    size_t max_bytes, json_t** out_items, json_t** out_policies,
    int64_t* out_through);

// Removes from |result| ({entities, relations, observations} as the graph
// query routes answer) every item a global query must not answer (see
// _visible_globally; |policies| NULL: visibility alone). An item whose
// visibility is missing or unknown is removed.
void pcp_services_replication_result_filter(
    json_t* result, const pcp_store_graph_policy_list_t* policies);

// local_plus_global: a new result with |local|'s items first, then
// |global|'s items whose id (entity_id, relation_id, observation_id) is not
// already there, each array cut at |limit| (0: no cut). NULL on OOM.
json_t* pcp_services_replication_result_merge(json_t* local, json_t* global,
                                              size_t limit);

// One ingested event (upstream s.6.6) as its two mutations:
// "{event_id}:subject" (upsert_entity of job:{job_id} or
// service:{service_id}) and "{event_id}:observation" (append_observation).
// |namespace_id| is the event's or "{lab_id}/shared"; |visibility| is
// filled by the caller afterwards (the namespace's default). The mutations
// own their payload and provenance (release both with
// pcp_services_replication_item_deinitialize, also after an error).
// INVALID_ARGUMENT naming the field for a bad event.
PCP_MUST_USE_RESULT pcp_status_t pcp_services_replication_event_mutations(
    json_t* event, const char* gateway_id, const char* lab_id,
    pcp_store_mutation_t out_mutations[2]);

// The JSON answer of a graph query (/v1/graph/query on a gateway,
// /v1/global-graph/query on the hub): {entities, relations, observations}
// with every field of each item. New reference.
json_t* pcp_services_graph_result_json(const pcp_store_graph_result_t* result);

// Reads a graph query body (upstream s.6.6 QueryRequest: entity_id,
// namespace_id, entity_type, relation_type, text, query_mode, limit) into
// |out_query| (strings borrowed from |body|) and |out_mode| ("local" when
// absent). Every filter is a string of at most PCP_STORE_ID_MAX_LENGTH
// bytes, query_mode one of local, global, local_plus_global, limit an
// integer in [1, PCP_STORE_LIST_LIMIT_MAX]. NULL when valid; else the rule
// broken, with the field in |out_key| (NULL: the body itself).
const char* pcp_services_graph_query_parse(json_t* body,
                                           pcp_store_graph_query_t* out_query,
                                           const char** out_mode,
                                           const char** out_key);
// The same, with a broken rule as an INVALID_ARGUMENT status naming the
// field (the HTTP routes answer it as a 400).
PCP_MUST_USE_RESULT pcp_status_t pcp_services_graph_query_read(
    json_t* body, pcp_store_graph_query_t* out_query, const char** out_mode);

//===----------------------------------------------------------------------===//
// External reward verifier (verifier.c, issue 16; docs/rl.md "Rewards")
//===----------------------------------------------------------------------===//

// Items in one POST; a larger batch is sent in slices of max_batch.
#define PCP_SERVICES_VERIFIER_MAX_BATCH 1024
// Largest max_response_bytes a config may set.
#define PCP_SERVICES_VERIFIER_MAX_RESPONSE_BYTES (64 << 20)

// Builds the external verifier of an RL experiment's reward config
// {"type":"verifier", "url", "timeout_ms", "max_retries", "backoff_ms",
// "max_batch", "max_response_bytes", "token_env", "ca_path",
// "insecure_http"} (|config| borrowed; |key_path| prefixes errors, "reward"
// when NULL). Its score_batch POSTs {"items":[{"prompt","completion",
// "answer","metadata"}...]} and reads {"rewards":[...]} of the same length;
// it retries connection failures, timeouts, 5xx and 429 with doubling
// backoff and fails on anything else, never answering a zero it did not get.
// The bearer token is read from the environment variable token_env here,
// once. Release with pcp_workloads_rl_verifier_release.
// INVALID_ARGUMENT naming the key for a bad config (plain http:// to a host
// other than loopback without insecure_http); FAILED_PRECONDITION when
// token_env names an unset variable. score_batch: thread-safe (calls are
// serialised on one keep-alive connection); UNAVAILABLE /
// DEADLINE_EXCEEDED after the last retry; FAILED_PRECONDITION for a 4xx;
// DATA_LOSS for a body that is not the expected JSON; RESOURCE_EXHAUSTED past
// max_response_bytes. Messages quote the first 200 bytes of a bad body.
// Its score_batch_stoppable (pcp_workloads_rl_verifier_score_batch_until)
// also watches the caller's stop before each slice and attempt, during the
// backoff (50 ms pieces) and while a request waits (polled every 50 ms):
// CANCELLED "<key_path>: scoring cancelled" within about 100 ms of it.
PCP_MUST_USE_RESULT pcp_status_t pcp_services_verifier_create(
    const json_t* config, const char* key_path, pcp_allocator_t allocator,
    pcp_workloads_rl_verifier_t* out_verifier);

#endif  // PCP_SERVICES_SERVICES_H_
