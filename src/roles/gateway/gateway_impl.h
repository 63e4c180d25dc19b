// SPDX-License-Identifier: Apache-2.0
//
// The gateway's private parts (never included outside src/roles/gateway/).
//
// One pcp_roles_gateway_state_t per process, owned by pcp_roles_gateway_serve
// on the main thread. Threads that touch it: libmicrohttpd's handler threads
// (routes.c, workload_routes.c handlers), the housekeeping thread
// (workload_routes.c), the workload runner's threads (its hooks) and the
// event pump thread (events.c). Everything shared is either thread-safe by
// itself (the store, the fabric endpoint, the runner, the metrics registry)
// or guarded by |mu|.

#ifndef PCP_ROLES_GATEWAY_GATEWAY_IMPL_H_
#define PCP_ROLES_GATEWAY_GATEWAY_IMPL_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "fabric/fabric.h"
#include "http/http.h"
#include "obs/obs.h"
#include "roles/roles_impl.h"
#include "services/services.h"
#include "store/store.h"
#include "workloads/workloads.h"

// Largest job submission body: programs and inputs travel in it (the
// generic job kind's limit, src/workloads/jobs/jobs.h).
#define PCP_GATEWAY_JOB_MAX_BODY_BYTES PCP_WORKLOADS_JOBS_MAX_BODY_BYTES
// Workers one GET /v1/workers lists (the fabric's registry holds up to
// options.max_workers, 1024 by default).
#define PCP_GATEWAY_MAX_LISTED_WORKERS 1024u
// Open /v1/events streams.
#define PCP_GATEWAY_MAX_EVENT_STREAMS 64

typedef struct pcp_roles_gateway_state_t pcp_roles_gateway_state_t;

// Serialized answers of GET /v1/jobs/{id}, valid while no job has been
// written since (|generation|). Slots by hash of the id.
#define PCP_GATEWAY_JOB_CACHE_SLOTS 256
typedef struct pcp_roles_gateway_job_cache_entry_t {
  char id[64];
  uint64_t generation;
  char* json;  // json_dumps's buffer (libc: pcp_libc_free)
  size_t length;
} pcp_roles_gateway_job_cache_entry_t;

typedef struct pcp_roles_gateway_event_client_t {
  pcp_http_sse_stream_t* stream;  // one reference
  int64_t cursor;                 // last store event id sent
  int64_t next_comment_ns;
} pcp_roles_gateway_event_client_t;

typedef struct pcp_roles_gateway_state_t {
  const pcp_roles_gateway_config_t* config;
  pcp_allocator_t allocator;
  pcp_clock_t clock;
  pcp_log_context_t log;
  int64_t started_at_ns;  // wall
  pcp_obs_registry_t* registry;
  pcp_obs_family_t* jobs_family;      // pcp_gateway_jobs{state}
  pcp_obs_family_t* job_runs_family;  // pcp_gateway_job_outcomes_total
  pcp_store_t* store;
  // The embedded services (src/services: graph, replication, federation,
  // proxy); they own the graph backend.
  pcp_services_t* services;
  pcp_fabric_endpoint_t* fabric;
  pcp_infer_service_t* infer;  // the OpenAI-compatible inference engine
  pcp_http_server_t* http;
  pcp_http_readyz_t readyz;
  atomic_bool draining;
  atomic_bool stopping;
  bool auth_enabled;
  int lock_fd;  // flock on <state_dir>/gateway.lock; -1 when not held

  pthread_mutex_t mu;
  pthread_cond_t cv;
  // Guarded by |mu|.
  pcp_roles_gateway_event_client_t clients[PCP_GATEWAY_MAX_EVENT_STREAMS];
  uint32_t client_count;
  uint32_t last_worker_counts[PCP_FABRIC_WORKER_STATE_COUNT_];
  // Wakes the event pump (events.c): bumped by the store's event callback
  // after every committed job event, by a new stream and by the stop. Its
  // own lock, never held across a store call: the callback runs on whatever
  // thread wrote the event, which may hold |mu|.
  pthread_mutex_t pump_mu;
  pthread_cond_t pump_cv;
  uint64_t pump_seq;  // guarded by |pump_mu|

  // Bumped after every write of a job row (create, transition): only this
  // process writes the store (the state dir lock), so an unchanged value
  // means every cached answer is current.
  atomic_uint_fast64_t job_generation;
  pthread_mutex_t cache_mu;
  pcp_roles_gateway_job_cache_entry_t job_cache[PCP_GATEWAY_JOB_CACHE_SLOTS];

  // The one compile queue (workloads/runtime/compile_queue.h) that jobs,
  // training and inference compile through; created before the inference
  // service, shut down after the runner and training stopped, destroyed
  // after the inference service.
  pcp_workloads_compile_queue_t* compile_queue;

  // The workload runner (src/workloads/runtime): every job's transitions,
  // recovery and cancel, and the kinds it runs (generic, training). Created
  // by pcp_roles_gateway_jobs_recover, started by _workloads_start, stopped
  // by _workloads_stop, released by _jobs_active_free.
  pcp_workloads_runner_t* runner;
  // The generic job kind (files, compile threads); created with the runner.
  pcp_workloads_jobs_t* jobs;
  // The training kind's state (its options are filled at _workloads_start,
  // once the fabric and the inference service exist).
  pcp_workloads_train_t train_kind;
  // The inference kind's self: the runner and store at the runner's
  // creation, the service once it exists (served versions are jobs).
  pcp_infer_kind_t infer_kind;
  pcp_diloco_metrics_t training_metrics;
  pcp_workloads_train_policy_t training_policy;
  // The RL kind's state (rl.c fills its options at _workloads_start).
  pcp_workloads_rl_t rl_kind;

  pthread_t housekeeping_thread;
  pthread_t pump_thread;
  bool housekeeping_started;
  bool pump_started;
} pcp_roles_gateway_state_t;

// routes.c: every route of the API from one static table (method, path,
// scope, handler); the scope is resolved against the tokens configured.
// After the services started, before the HTTP server starts.
PCP_MUST_USE_RESULT pcp_status_t
pcp_roles_gateway_routes_add(pcp_roles_gateway_state_t* gateway);
// Which tokens the config names (each scope is resolved against them).
typedef struct pcp_roles_gateway_route_tokens_t {
  bool api;         // an API token: the /v1 routes need it (else open)
  bool internal;    // an internal token: POST /v1/internal/events needs it
  bool federation;  // a federation token: /v1/internal/federation/* need it
} pcp_roles_gateway_route_tokens_t;
// Routes in the table (the inference routes included).
size_t pcp_roles_gateway_route_count(void);
// The table as HTTP routes under |tokens| into |out_routes| (route_count
// entries): scopes resolved, |user_data| |gateway| or |services| by the
// route's owner; without a federation token the hub's routes are open and
// answer 401. Pure; thread-safe.
void pcp_roles_gateway_routes_resolve(
    const pcp_roles_gateway_route_tokens_t* tokens, void* gateway,
    void* services, pcp_http_route_t* out_routes);

// server.c: the handlers of the static files (/, /dashboard.{css,js},
// /openapi.json), /v1/controller and /v1/workers; |user_data| the gateway.
pcp_status_t pcp_roles_gateway_static_get(void* user_data,
                                          const pcp_http_request_t* request,
                                          pcp_http_response_t* response);
pcp_status_t pcp_roles_gateway_controller_get(void* user_data,
                                              const pcp_http_request_t* request,
                                              pcp_http_response_t* response);
pcp_status_t pcp_roles_gateway_workers_list(void* user_data,
                                            const pcp_http_request_t* request,
                                            pcp_http_response_t* response);
pcp_status_t pcp_roles_gateway_worker_get(void* user_data,
                                          const pcp_http_request_t* request,
                                          pcp_http_response_t* response);

// training.c: GET /v1/training/jobs/{id}/history (the dashboard's charts;
// pcp_workloads_train_history_json).
pcp_status_t pcp_roles_gateway_training_history(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response);

// workload_routes.c: the /v1/jobs handlers over the workloads JSON API,
// the runner's set-up and the gateway's housekeeping thread.
// Creates the workload runner (gateway->runner) over the store and
// recovers the jobs a crash or stop left mid-flight (every kind).
PCP_MUST_USE_RESULT pcp_status_t
pcp_roles_gateway_jobs_recover(pcp_roles_gateway_state_t* gateway);
// The housekeeping thread: worker-count events, the job metrics and the
// sweep of expired services (the jobs themselves run on the runner).
void* pcp_roles_gateway_housekeeping_main(void* opaque);
// Starts the generic job kind (its compile threads, over the fabric and
// the compile queue; before the runner) / stops it, joining them and
// waiting for compiles in progress (after the runner has stopped).
PCP_MUST_USE_RESULT pcp_status_t
pcp_roles_gateway_jobs_kind_start(pcp_roles_gateway_state_t* gateway);
void pcp_roles_gateway_jobs_kind_stop(pcp_roles_gateway_state_t* gateway);
// Frees the jobs the runner left active and releases the workload runner;
// only after the fabric endpoint is released (its tasks borrow their input
// buffers until then).
void pcp_roles_gateway_jobs_active_free(pcp_roles_gateway_state_t* gateway);
pcp_status_t pcp_roles_gateway_job_submit(void* user_data,
                                          const pcp_http_request_t* request,
                                          pcp_http_response_t* response);
pcp_status_t pcp_roles_gateway_job_list(void* user_data,
                                        const pcp_http_request_t* request,
                                        pcp_http_response_t* response);
pcp_status_t pcp_roles_gateway_job_get(void* user_data,
                                       const pcp_http_request_t* request,
                                       pcp_http_response_t* response);
pcp_status_t pcp_roles_gateway_job_cancel(void* user_data,
                                          const pcp_http_request_t* request,
                                          pcp_http_response_t* response);
pcp_status_t pcp_roles_gateway_job_events(void* user_data,
                                          const pcp_http_request_t* request,
                                          pcp_http_response_t* response);
pcp_status_t pcp_roles_gateway_job_results(void* user_data,
                                           const pcp_http_request_t* request,
                                           pcp_http_response_t* response);
pcp_status_t pcp_roles_gateway_job_result_get(void* user_data,
                                              const pcp_http_request_t* request,
                                              pcp_http_response_t* response);
// Frees the job cache (at stop, no handler running).
void pcp_roles_gateway_jobs_cache_free(pcp_roles_gateway_state_t* gateway);
// Jobs by state into the metrics (housekeeping thread).
void pcp_roles_gateway_jobs_metrics_update(pcp_roles_gateway_state_t* gateway);
// A job record as API JSON (new reference; NULL on OOM).
json_t* pcp_roles_gateway_job_json(const pcp_store_job_t* job);

// training.c: the DiLoCo training API's handlers (the validation is the
// training kind's: pcp_workloads_train_spec_build).

pcp_status_t pcp_roles_gateway_training_submit(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response);
// The submit of experiment JSON |text| (POST /v1/training/jobs's body;
// the federation's internal route passes its own): 202 with the job.
pcp_status_t pcp_roles_gateway_training_text_submit(
    pcp_roles_gateway_state_t* gateway, const char* text, size_t byte_length,
    pcp_http_response_t* response);
pcp_status_t pcp_roles_gateway_training_get(void* user_data,
                                            const pcp_http_request_t* request,
                                            pcp_http_response_t* response);
// Starts the workload runner with the training kind's options (the policy,
// the metrics, the hooks): its scheduler starts queued jobs of every kind
// on its pool (training: up to PCP_WORKLOADS_TRAIN_MAX_RUNNING at once,
// src/workloads/train/job.c). _stop asks the runs to stop and joins them
// (their jobs stay running in the store).
PCP_MUST_USE_RESULT pcp_status_t
pcp_roles_gateway_workloads_start(pcp_roles_gateway_state_t* gateway);
void pcp_roles_gateway_workloads_stop(pcp_roles_gateway_state_t* gateway);
// Replaces "training" (top level and in "spec") of a job's API JSON with
// the live progress of a training job this process ran. Thread-safe.
void pcp_roles_gateway_training_json_merge(pcp_roles_gateway_state_t* gateway,
                                           json_t* job_json);

// rl.c: the GRPO API (POST /v1/rl/jobs, GET /v1/rl/jobs/{id}; the check
// is the RL kind's: pcp_workloads_rl_spec_build).
pcp_status_t pcp_roles_gateway_rl_submit(void* user_data,
                                         const pcp_http_request_t* request,
                                         pcp_http_response_t* response);
// The submit of experiment JSON |text| (POST /v1/rl/jobs's body; the
// federation's internal route passes its own): 202 with the job.
pcp_status_t pcp_roles_gateway_rl_text_submit(
    pcp_roles_gateway_state_t* gateway, const char* text, size_t byte_length,
    pcp_http_response_t* response);
pcp_status_t pcp_roles_gateway_rl_get(void* user_data,
                                      const pcp_http_request_t* request,
                                      pcp_http_response_t* response);
// Fills the RL kind's options (fabric, inference service, compile queue,
// policy, metrics, the verifier builder); before the runner starts.
void pcp_roles_gateway_rl_configure(pcp_roles_gateway_state_t* gateway);

// events.c
void* pcp_roles_gateway_events_pump_main(void* opaque);
// The store's event callback (pcp_store_event_callback_t): wakes the pump.
void pcp_roles_gateway_events_wake(void* user_data, int64_t event_id);
pcp_status_t pcp_roles_gateway_events_stream(void* user_data,
                                             const pcp_http_request_t* request,
                                             pcp_http_response_t* response);
// Sends a live (not stored, so not resumable) worker event to every stream.
void pcp_roles_gateway_events_broadcast(pcp_roles_gateway_state_t* gateway,
                                        const char* event, const char* data);

// Base64 (RFC 4648, padding optional on input). decode: INVALID_ARGUMENT for
// a bad character; |*out_data| is made by pcp_allocator_system() (the
// caller frees it with pcp_allocator_free on that allocator).
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_gateway_base64_decode(
    const char* text, size_t length, uint8_t** out_data, size_t* out_length);

#endif  // PCP_ROLES_GATEWAY_GATEWAY_IMPL_H_
