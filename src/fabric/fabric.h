// SPDX-License-Identifier: Apache-2.0
//
// fabric: the gateway's worker-fabric endpoint (docs/protocol.md).
//
// One endpoint listens on host:port, runs src/proto's gateway state machine
// per TCP connection on its own pcp_loop thread, authenticates workers with
// the HMAC challenge over a join token read from an environment variable
// whose NAME is configured, keeps them in the src/sched registry (stable id,
// capabilities) plus its own table of everything JOIN carries, exchanges
// heartbeats with one configured interval H from which every timeout
// derives (silence 3H, tick H/4, handshake 5H, resume window 10H), evicts a
// silent worker within two intervals of the timeout, and re-runs the work of
// a lost worker on another eligible worker (or on the same one when it
// rejoins in time, per the sched rules), at most N times.
//
// Programs are registered once (VMFB bytes, copied into the endpoint) and
// offered by SHA-256 to each worker that is about to run them; the worker
// fetches only what its disk cache lacks; chunks are written straight from
// the endpoint's copy (no per-send copy).
//
// Tasks (program hash, function, input tensors as host buffers, placement)
// are submitted from any thread; each yields a refcounted handle that can be
// waited on, and an optional callback that runs on the loop thread for
// progress and for the final outcome. Input tensor data is borrowed until the
// final outcome and written to the socket without a copy (it may be written
// more than once when the task is re-run). Results come back as tensor
// sections that point into the received frame (or, for tensors that came as
// chunked blobs, into the reassembled blob), owned by the task handle.
//
// Threading: every function here is thread-safe unless it says otherwise.
// The loop thread holds the endpoint's lock while it handles an event and
// releases it before it runs a task callback, so callbacks may call back into
// this API (submit, cancel, query) but must not block for long (they delay
// every worker on the endpoint).
//
// Ownership: options and parameters are copied or borrowed as stated per
// field; handles are released by their *_release call.

#ifndef PCP_FABRIC_FABRIC_H_
#define PCP_FABRIC_FABRIC_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "config/config.h"
#include "net/net.h"
#include "obs/obs.h"
#include "proto/proto.h"
#include "sched/sched.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Configuration
//===----------------------------------------------------------------------===//

// The part of the endpoint's settings that comes from flags or the gateway's
// JSON config (config.h table below). Strings are owned by the struct once
// parsed (pcp_config_deinitialize).
typedef struct pcp_fabric_config_t {
  char* listen;                   // "host:port"; port 0 = ephemeral
  int64_t heartbeat_interval_ms;  // H: the one setting every timeout uses
  char* join_token_env;           // NAME of the variable holding the token
  int64_t max_task_attempts;      // runs of one task, first one included
} pcp_fabric_config_t;

// Table for pcp_config_* (fabric-listen, fabric-heartbeat-interval-ms,
// fabric-join-token-env, fabric-max-task-attempts). Static; thread-safe.
const pcp_config_table_t* pcp_fabric_config_table(void);

#define PCP_FABRIC_DEFAULT_MAX_TASK_ATTEMPTS 3u
// Largest frame payload accepted before ACCEPT (HELLO, JOIN, JOIN_PROOF are
// far smaller): an unauthenticated peer gets ERROR RESOURCE_EXHAUSTED and
// is closed before the decoder allocates anything for it.
#define PCP_FABRIC_HANDSHAKE_MAX_PAYLOAD_BYTES (64u << 10)
// Session -> worker bindings kept; past it the oldest binding is dropped.
#define PCP_FABRIC_MAX_SESSIONS 4096u
#define PCP_FABRIC_MAX_TASK_ATTEMPTS 100u

typedef struct pcp_fabric_options_t {
  pcp_net_address_t listen_address;  // IP literal; port 0 = ephemeral
  // H in ms, clamped to [PCP_PROTO_HEARTBEAT_MIN_MS, MAX] as proto does.
  uint32_t heartbeat_interval_ms;
  // Name of the environment variable holding the join token (borrowed for
  // the create call; the token is read once, at create, and kept).
  const char* join_token_env;
  // Frame and blob limits (validated). Tensors over limits.chunk_bytes
  // travel as chunked blobs (proto), so no frame limit bounds a tensor.
  pcp_proto_limits_t limits;
  // Runs of one task before it fails with ABORTED (1..100).
  uint32_t max_task_attempts;
  // Registry size (sched max_workers) and open connections (handshakes
  // included); a connection past the cap is closed at accept.
  uint32_t max_workers;
  uint32_t max_connections;
  // Metrics go here when set (borrowed; must outlive the endpoint);
  // otherwise the endpoint makes its own (pcp_fabric_endpoint_metrics).
  pcp_obs_registry_t* metrics;
  // How long a running task's worker, still connected, may stay silent
  // after TASK_CANCEL before the task ends DEADLINE_EXCEEDED. 0: the
  // default, the larger of the resume window (10H) and 5 minutes: a worker
  // inside one long IREE call (a training round) answers only when the
  // call returns, and a cancel answered late is still a cancel.
  uint32_t cancel_answer_timeout_ms;
  pcp_clock_t clock;      // {0}: the system clock
  const char* software;   // HELLO text; borrowed; NULL: "pcp"
  pcp_log_context_t log;  // role/node fields for log lines; borrowed
} pcp_fabric_options_t;

// 127.0.0.1:0, H = 1000 ms, token env PCP_WORKER_JOIN_TOKEN, proto default
// limits, 3 attempts, 1024 workers, 4096 connections. |out_options| is
// overwritten. Thread-safe.
void pcp_fabric_options_initialize(pcp_fabric_options_t* out_options);

// Applies a parsed config onto |options| (listen parsed as an address).
// INVALID_ARGUMENT naming the field. Strings in |options| borrow from
// |config|. Thread-compatible.
PCP_MUST_USE_RESULT pcp_status_t pcp_fabric_options_apply_config(
    const pcp_fabric_config_t* config, pcp_fabric_options_t* options);

//===----------------------------------------------------------------------===//
// Endpoint
//===----------------------------------------------------------------------===//

typedef struct pcp_fabric_endpoint_t pcp_fabric_endpoint_t;

// Reads the join token from getenv(options->join_token_env), listens, and
// starts the loop thread. Errors: INVALID_ARGUMENT (options; an unset or
// empty token variable, named in the message), ALREADY_EXISTS (address in
// use), RESOURCE_EXHAUSTED, UNAVAILABLE (thread). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_fabric_endpoint_create(
    const pcp_fabric_options_t* options, pcp_allocator_t allocator,
    pcp_fabric_endpoint_t** out_endpoint);

// Stops the loop thread, closes every connection and fails every unfinished
// task with CANCELLED (callbacks run, on the calling thread), then frees the
// endpoint. Task handles still held stay valid until released. Must not be
// called from a task callback, nor concurrently with other calls on the
// same endpoint (the one thread that owns it). NULL is a no-op.
void pcp_fabric_endpoint_release(pcp_fabric_endpoint_t* endpoint);

// The bound port (the ephemeral one when listening on port 0). Thread-safe.
uint16_t pcp_fabric_endpoint_port(const pcp_fabric_endpoint_t* endpoint);

// The registry the metrics live in (the one from the options, or the
// endpoint's own). Borrowed; valid until release. Thread-safe.
pcp_obs_registry_t* pcp_fabric_endpoint_metrics(
    pcp_fabric_endpoint_t* endpoint);

// The derived timeouts (H, 3H, ...). Thread-safe.
pcp_proto_timeouts_t pcp_fabric_endpoint_timeouts(
    const pcp_fabric_endpoint_t* endpoint);

typedef struct pcp_fabric_endpoint_stats_t {
  uint32_t connections;        // open TCP connections
  uint32_t workers_connected;  // accepted and not closed
  uint64_t bytes_in;
  uint64_t bytes_out;
  uint64_t frames_in;
  uint64_t frames_out;
  uint64_t evictions;
  uint64_t rejected_joins;
  uint64_t protocol_errors;  // connections closed for a peer error
  uint64_t events_handled;   // read events handled on the loop thread
  // Loop-thread time spent handling one read event (decode, state machine,
  // actions): percentiles in ns from a log-linear histogram (upper bounds,
  // within 1/16 of the true value).
  int64_t handling_p50_ns;
  int64_t handling_p99_ns;
  int64_t handling_max_ns;
} pcp_fabric_endpoint_stats_t;

// A snapshot of the counters (|out_stats| overwritten). Thread-safe.
void pcp_fabric_endpoint_stats_query(pcp_fabric_endpoint_t* endpoint,
                                     pcp_fabric_endpoint_stats_t* out_stats);

// Clears the handling-latency histogram (and its max), so that a benchmark
// or an operator can measure one window. Thread-safe (events recorded while
// it runs may survive it).
void pcp_fabric_endpoint_stats_reset_latency(pcp_fabric_endpoint_t* endpoint);

//===----------------------------------------------------------------------===//
// Workers
//===----------------------------------------------------------------------===//

typedef enum pcp_fabric_worker_state_e {
  PCP_FABRIC_WORKER_CONNECTED = 0,  // accepted, connection open
  PCP_FABRIC_WORKER_DRAINING = 1,   // the worker asked to drain
  PCP_FABRIC_WORKER_LOST = 2,       // closed or evicted; identity kept
  PCP_FABRIC_WORKER_STATE_COUNT_ = 3,
} pcp_fabric_worker_state_t;

// "connected", "draining", "lost"; "unknown" otherwise. Static; thread-safe.
const char* pcp_fabric_worker_state_name(pcp_fabric_worker_state_t state);

// Everything a JOIN carried, plus what the endpoint knows. Plain value.
typedef struct pcp_fabric_worker_info_t {
  char worker_id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  char backend[16];
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];
  int32_t device_id;
  uint64_t device_memory_bytes;
  char drivers[PCP_PROTO_MAX_LIST_ITEMS][64];
  uint32_t driver_count;
  char runtime_version[PCP_PROTO_MAX_STRING_BYTES + 1];
  char compiler_version[PCP_PROTO_MAX_STRING_BYTES + 1];
  char node_manager_id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  int64_t supervisor_id;
  char worker_class[64];
  pcp_fabric_worker_state_t state;
  pcp_sched_worker_state_t sched_state;
  uint64_t lease_epoch;
  uint32_t join_count;       // accepted joins under this id
  uint32_t resumed_count;    // joins that resumed the lease
  uint64_t eviction_count;   // silences that ended a connection
  int64_t heartbeat_age_ns;  // since the last frame (connected only)
  int64_t lost_at_ns;        // when last lost (endpoint clock); 0: never
  uint32_t in_flight;        // tasks assigned and unanswered
  uint64_t lease_id;         // sched lease the worker holds; 0: none
  uint32_t program_count;    // programs the worker acknowledged
  // Bytes read from (in) and handed to the socket for (out) this worker,
  // over every connection it was accepted on, handshake and framing
  // included: the real traffic of the gateway's link to it.
  uint64_t bytes_in;
  uint64_t bytes_out;
  // Tasks this worker answered (a result or a failure of its own), over
  // every connection, and the task it was last handed that is still
  // unanswered (0 / "": none): its id and the program function it runs.
  uint64_t tasks_done;
  uint64_t tasks_failed;
  uint64_t current_task_id;
  char current_function[64];
} pcp_fabric_worker_info_t;

// Copies what the endpoint knows about |worker_id| into |out_info|
// (overwritten). NOT_FOUND for an id never accepted (or whose registry slot
// was recycled). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_fabric_worker_query(pcp_fabric_endpoint_t* endpoint, const char* worker_id,
                        pcp_fabric_worker_info_t* out_info);

// A snapshot of every known worker (connected, draining and lost ones whose
// registry slot is kept), each as pcp_fabric_worker_query fills it, taken
// under one hold of the endpoint's lock so the records are consistent with
// each other. Copies at most |capacity| records into |out_infos| (caller
// storage, |capacity| entries; nothing allocated), sorted by worker id, and
// returns how many it copied; |out_total| (optional) receives how many the
// endpoint knows, so a caller can tell that the copy was cut short (at most
// options.max_workers). Thread-safe.
uint32_t pcp_fabric_worker_list(pcp_fabric_endpoint_t* endpoint,
                                pcp_fabric_worker_info_t* out_infos,
                                uint32_t capacity, uint32_t* out_total);

// Workers in |state|, or all known for PCP_FABRIC_WORKER_STATE_COUNT_.
// Thread-safe.
uint32_t pcp_fabric_worker_count(pcp_fabric_endpoint_t* endpoint,
                                 pcp_fabric_worker_state_t state);

// Asks a connected worker to drain (DRAIN frame with |deadline_ms|; it gets
// no new task, running ones finish). Queued to the loop thread: the frame
// leaves shortly after the call. NOT_FOUND, FAILED_PRECONDITION when not
// connected, RESOURCE_EXHAUSTED when the loop's post queue is full.
// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_fabric_worker_drain(pcp_fabric_endpoint_t* endpoint, const char* worker_id,
                        uint64_t deadline_ms);

// A caller's stop request, read (without the endpoint's lock) on every wake
// of a wait. True: stop waiting.
typedef bool (*pcp_fabric_stop_fn_t)(void* user_data);

// The longest a wait sleeps before it looks at its deadline and stop
// request again when nothing wakes it (an injected clock is not the
// condition variable's).
#define PCP_FABRIC_WAIT_SLICE_NS (INT64_C(100) * 1000000)

// Waits until at least |count| workers of |backend| ("" or NULL: any) and
// |target| (NULL: any; "": the default target) are connected and not
// draining: OK, with *out_count (optional) the number seen. Woken by every
// join, loss and drain, not by polling. DEADLINE_EXCEEDED once the
// endpoint clock (pcp_fabric_endpoint_now_ns) passes |deadline_ns|;
// CANCELLED as soon as |stop| (optional) returns true, which is checked on
// every wake: whoever sets what |stop| reads calls pcp_fabric_endpoint_wake
// to end the wait at once (otherwise it ends within
// PCP_FABRIC_WAIT_SLICE_NS); FAILED_PRECONDITION when the endpoint is
// being released. Thread-safe; not from a task callback.
PCP_MUST_USE_RESULT pcp_status_t pcp_fabric_workers_wait(
    pcp_fabric_endpoint_t* endpoint, const char* backend, const char* target,
    uint32_t count, int64_t deadline_ns, pcp_fabric_stop_fn_t stop,
    void* stop_user_data, uint32_t* out_count);

// pcp_fabric_workers_wait restricted to workers that joined with the worker
// class |class_name| (NULL or "": any class, exactly as
// pcp_fabric_workers_wait). INVALID_ARGUMENT for a malformed class name.
// Thread-safe; not from a task callback.
PCP_MUST_USE_RESULT pcp_status_t pcp_fabric_workers_wait_class(
    pcp_fabric_endpoint_t* endpoint, const char* backend, const char* target,
    const char* class_name, uint32_t count, int64_t deadline_ns,
    pcp_fabric_stop_fn_t stop, void* stop_user_data, uint32_t* out_count);

// Connected (not draining) workers of |backend| ("" or NULL: any), |target|
// (NULL: any) and worker class |class_name| (NULL or "": any): what the
// waits above count, now. Thread-safe.
uint32_t pcp_fabric_workers_count(pcp_fabric_endpoint_t* endpoint,
                                  const char* backend, const char* target,
                                  const char* class_name);

// Wakes every pcp_fabric_workers_wait (and pcp_fabric_task_wait) of the
// endpoint so it looks at its stop request now. Thread-safe.
void pcp_fabric_endpoint_wake(pcp_fabric_endpoint_t* endpoint);

// The endpoint's clock (options.clock), the one deadlines are on.
// Thread-safe.
int64_t pcp_fabric_endpoint_now_ns(const pcp_fabric_endpoint_t* endpoint);

//===----------------------------------------------------------------------===//
// Programs
//===----------------------------------------------------------------------===//

// Registers a program (its bytes are copied into a 64-byte aligned buffer
// owned by the endpoint until release) and returns its SHA-256, the id tasks
// name. Registering the same bytes again is a no-op. |data| is borrowed for
// the call. INVALID_ARGUMENT for an empty program or backend, or a backend
// or target too long; RESOURCE_EXHAUSTED above limits.max_blob_bytes or out
// of memory. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_fabric_program_register(
    pcp_fabric_endpoint_t* endpoint, const void* data, size_t byte_length,
    const char* backend, const char* target,
    uint8_t out_program[PCP_SHA256_BYTE_LENGTH]);

//===----------------------------------------------------------------------===//
// Tasks
//===----------------------------------------------------------------------===//

typedef struct pcp_fabric_task_t pcp_fabric_task_t;

typedef enum pcp_fabric_task_event_e {
  PCP_FABRIC_TASK_EVENT_PROGRESS = 0,  // the worker reported progress
  PCP_FABRIC_TASK_EVENT_DONE = 1,      // final: result or error (once)
} pcp_fabric_task_event_t;

// Runs on the loop thread (or on the releasing thread at endpoint release),
// without the endpoint's lock. |task| is borrowed for the call (retain it to
// keep it).
typedef void (*pcp_fabric_task_fn_t)(void* user_data, pcp_fabric_task_t* task,
                                     pcp_fabric_task_event_t event);

typedef struct pcp_fabric_task_params_t {
  uint8_t program[PCP_SHA256_BYTE_LENGTH];  // a registered program
  const char* function;                     // copied
  // Input tensors (struct array copied; |name| and |data| borrowed until the
  // DONE event). With |input_refs| NULL the task's arguments are the
  // sections in order; otherwise |input_refs| (copied, names copied) lists
  // the arguments (SECTION refs index |inputs|, RESIDENT refs name session
  // tensors).
  const pcp_proto_section_t* inputs;
  uint32_t input_count;
  const pcp_proto_tensor_ref_t* input_refs;
  uint32_t input_ref_count;
  // Outputs to keep in the session on the worker (copied).
  const pcp_proto_keep_resident_t* keep_resident;
  uint32_t keep_resident_count;
  bool return_resident;
  // Inputs 0..hash_inputs-1 (argument order) whose SHA-256 the worker
  // returns as one extra last output, u8[32] (TASK_ASSIGN "hash_inputs",
  // docs/protocol.md); 0: none.
  uint32_t hash_inputs;
  // Outputs 0..hash_outputs-1 whose SHA-256 the worker returns as one more
  // output after that, u8[32] (TASK_ASSIGN "hash_outputs"); 0: none.
  uint32_t hash_outputs;
  // Placement: class (ANY or a backend), target ("" any), minimum device
  // memory; or one named worker (|worker_id|, then the rest is ignored,
  // except |worker_class_name|). A worker count is
  // pcp_fabric_task_submit_group (one copy per worker).
  pcp_sched_worker_class_t worker_class;
  const char* target;
  uint64_t min_device_memory_bytes;
  const char* worker_id;
  // The operator's worker class (copied; NULL or "": any): the task runs
  // only on a worker that joined with exactly this --worker-class (1..63
  // bytes of [A-Za-z0-9._-], pcp_sched_class_name_is_valid), and waits
  // queued until one is free, also as a gang, a session's first task and a
  // re-run after a loss. A named worker or a session's worker of another
  // class fails the task with FAILED_PRECONDITION (at submit when the
  // named worker is known then, else when it connects).
  const char* worker_class_name;
  // Session on the worker ("" or NULL: none). The first task of a session is
  // placed by the constraint; later ones go to the same worker.
  const char* session_id;
  uint32_t max_attempts;          // 0: the endpoint's default
  pcp_fabric_task_fn_t callback;  // optional
  void* user_data;
} pcp_fabric_task_params_t;

// Queues a task. |params| is copied except what its fields say is borrowed.
// |out_task| (optional) receives a retained handle (release it). Errors:
// INVALID_ARGUMENT (bad params), NOT_FOUND (program not registered),
// FAILED_PRECONDITION (endpoint shutting down), RESOURCE_EXHAUSTED. On
// error no callback runs; otherwise DONE runs exactly once. Thread-safe
// (also from a task callback).
PCP_MUST_USE_RESULT pcp_status_t pcp_fabric_task_submit(
    pcp_fabric_endpoint_t* endpoint, const pcp_fabric_task_params_t* params,
    pcp_fabric_task_t** out_task);

// Submits |worker_count| copies of one task as a gang: they are placed all
// at once on |worker_count| distinct eligible workers (sched's all-or-nothing
// acquire), or all stay queued until that many are free. After placement
// each copy is a task of its own (result, re-runs, cancel). |out_tasks|
// (|worker_count| entries) receives retained handles. INVALID_ARGUMENT also
// for a named worker or a session (a gang spans workers), or a count outside
// 1..PCP_SCHED_REQUEST_WORKER_COUNT_MAX; otherwise as pcp_fabric_task_submit.
// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_fabric_task_submit_group(
    pcp_fabric_endpoint_t* endpoint, const pcp_fabric_task_params_t* params,
    uint32_t worker_count, pcp_fabric_task_t** out_tasks);

// Reference counting; the last release frees the handle and its outputs.
// NULL is a no-op. Thread-safe.
void pcp_fabric_task_retain(pcp_fabric_task_t* task);
void pcp_fabric_task_release(pcp_fabric_task_t* task);

// Asks for cancellation: a queued task ends CANCELLED at once; a running one
// gets TASK_CANCEL on its worker and ends with the worker's answer (CANCELLED
// or its result), or DEADLINE_EXCEEDED when the worker, still connected,
// has not answered within the options' cancel_answer_timeout_ms once its
// inputs are written, so a wait after a cancel is bounded. No-op once done.
// Thread-safe (also from a callback).
void pcp_fabric_task_cancel(pcp_fabric_task_t* task);

// Waits until the task is done or |timeout_ms| passes (-1: forever).
// Returns true when done. Thread-safe, but not from a task callback of the
// same endpoint (the loop thread would wait on itself).
bool pcp_fabric_task_wait(pcp_fabric_task_t* task, int64_t timeout_ms);

// The gateway-wide task id (also on the wire). Thread-safe.
uint64_t pcp_fabric_task_id(const pcp_fabric_task_t* task);
// True once the outcome is set. Thread-safe.
bool pcp_fabric_task_is_done(pcp_fabric_task_t* task);

// The final status once done (borrowed from the handle: do not ignore or
// join it; OK for a result), else OK. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_fabric_task_status(pcp_fabric_task_t* task);

// Outputs once done with a result: one section per output in order, |data|
// pointing into the received frame (64-byte aligned) and valid while the
// handle lives; a RESIDENT output has |name| = the session name and no data.
// FAILED_PRECONDITION before the result or after a failure. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_fabric_task_outputs(
    pcp_fabric_task_t* task, const pcp_proto_section_t** out_outputs,
    size_t* out_count);

typedef struct pcp_fabric_task_info_t {
  uint64_t task_id;
  uint32_t attempts;  // assignments sent so far
  bool done;
  pcp_sched_worker_id_t worker_id;  // last worker it ran on ("" if none)
  // Last progress report.
  pcp_proto_task_state_t progress_state;  // 0 before any
  double progress_fraction;
  uint64_t elapsed_us;  // from the result
} pcp_fabric_task_info_t;

// A snapshot of the task's progress (|out_info| overwritten). Thread-safe.
void pcp_fabric_task_info_query(pcp_fabric_task_t* task,
                                pcp_fabric_task_info_t* out_info);

//===----------------------------------------------------------------------===//
// Connection glue (sans I/O)
//===----------------------------------------------------------------------===//

// The endpoint's decisions about one connection, with no sockets, libuv,
// threads or clock (time is an argument): what a verified JOIN leads to and
// the drain of a proto gateway connection's actions. fabric_workers.c and
// fabric_conn.c call them for real connections and src/sim for its simulated
// ones, so the deterministic simulation runs this code, not a copy of it
// (docs/simulation.md). Everything that changes the endpoint's own tables or
// writes to a socket stays with the caller. Not thread-safe: the caller
// serializes (the endpoint lock, or the simulation's one thread).

// What the registry holds for the worker id a JOIN names.
typedef struct pcp_fabric_join_record_t {
  bool known;  // the registry has a slot for this id (else the rest is unused)
  // A connection holds the id (accepted, its end not handled yet), silent
  // for good once |connection_deadline_ns| has passed.
  bool connected;
  int64_t connection_deadline_ns;
  uint64_t lease_epoch;  // 0: never accepted
  int64_t lost_at_ns;    // when the last connection was lost
  uint8_t resume_token[PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH];
} pcp_fabric_join_record_t;

typedef enum pcp_fabric_join_verdict_e {
  PCP_FABRIC_JOIN_REJECT = 0,
  PCP_FABRIC_JOIN_ACCEPT = 1,
} pcp_fabric_join_verdict_t;

typedef struct pcp_fabric_join_decision_t {
  pcp_fabric_join_verdict_t verdict;
  // REJECT: what the REJECT frame carries.
  pcp_proto_reject_reason_t reject_reason;
  char message[256];
  // ACCEPT:
  bool evict_old;  // fail the old connection first (pcp_fabric_join_evict)
  bool new_slot;   // the id is new: the caller makes its registry slot
  bool resumed;    // the session resumes: keep the epoch and the token
  uint64_t lease_epoch;  // the epoch ACCEPT carries (the next one if new)
  pcp_sched_backend_t backend;
} pcp_fabric_join_decision_t;

// Decides a verified JOIN: REJECT (bad backend or field ranges, a duplicate
// worker id while the old connection is within its silence deadline, a new
// id with no room in the registry: |registry_has_room| says whether a slot
// is free or can be freed), or ACCEPT, evicting a silent old connection
// first, resumed when the worker was lost at most the resume window ago and
// the JOIN carries the record's epoch and token. |out_decision| overwritten.
void pcp_fabric_join_decide(const pcp_proto_join_t* join,
                            const pcp_fabric_join_record_t* record,
                            bool registry_has_room, int64_t now_ns,
                            const pcp_proto_timeouts_t* timeouts,
                            pcp_fabric_join_decision_t* out_decision);

// Fails |old|, the connection an accepted JOIN replaces (ERROR, then
// CLOSE); the caller drains its actions next.
void pcp_fabric_join_evict(pcp_proto_gateway_conn_t* old, int64_t now_ns);

// Enters the accepted worker into |sched|. On failure turns |decision| into
// the REJECT to send (CAPACITY when sched is full, else BAD_JOIN; the
// status as the message) and returns false.
bool pcp_fabric_join_sched_enter(pcp_sched_t* sched,
                                 const pcp_proto_join_t* join, int64_t now_ns,
                                 pcp_fabric_join_decision_t* decision);

// The ACCEPT parameters of |decision| with the session's |resume_token|
// (the kept one when resumed, a fresh one otherwise).
void pcp_fabric_join_accept_params(const pcp_fabric_join_decision_t* decision,
                                   const uint8_t* resume_token,
                                   pcp_proto_gateway_accept_params_t* out);

// One handler per gateway-side action; NULL ignores that action. |action|
// is the caller's to use during the call (a handler may take |frame| or
// |status|, leaving the field empty); the drain deinitializes it after.
typedef void (*pcp_fabric_action_fn_t)(void* context,
                                       pcp_proto_action_t* action);

typedef struct pcp_fabric_action_handlers_t {
  pcp_fabric_action_fn_t send;
  pcp_fabric_action_fn_t close;
  pcp_fabric_action_fn_t join_verified;
  pcp_fabric_action_fn_t evict;
  pcp_fabric_action_fn_t program_fetch;
  pcp_fabric_action_fn_t program_ready;
  pcp_fabric_action_fn_t program_failed;
  pcp_fabric_action_fn_t task_progress;
  pcp_fabric_action_fn_t task_result;
  pcp_fabric_action_fn_t task_failed;
  pcp_fabric_action_fn_t task_lost;
  pcp_fabric_action_fn_t peer_draining;
} pcp_fabric_action_handlers_t;

// Executes |proto|'s queued actions in order through |handlers|.
// |*draining| is the connection's own flag (false when idle): a handler
// that issues a command (an assignment, say) queues more actions and may
// drain again; that nested call returns false at once and the running loop
// takes them next, in the same order. Were the nested call to run the queue
// itself, an action that arrived in the same read (another task's result)
// would be handled in the middle of the handler that issued the command,
// and a handler walking a task list would see tasks finish and leave the
// list under it (run B's CI hang, docs/decisions.md). Returns true when this
// call drained the queue and the state machine is CLOSED: the caller ends
// the connection. Handlers must not release |proto|.
bool pcp_fabric_conn_actions_drain(pcp_proto_gateway_conn_t* proto,
                                   bool* draining,
                                   const pcp_fabric_action_handlers_t* handlers,
                                   void* context);

#ifdef __cplusplus
}
#endif

#endif  // PCP_FABRIC_FABRIC_H_
