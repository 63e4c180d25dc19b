// SPDX-License-Identifier: Apache-2.0
//
// Private to src/fabric (never included elsewhere): the endpoint's types
// and the functions its files share. fabric.h has the contract.
//
// Structure: every loop-thread event (accept, read, writable, close, tick,
// kick) takes the endpoint lock, feeds the connection's state machine,
// executes the actions it returns, runs a scheduling pass when something
// changed, and then releases the lock and runs the task callbacks it
// collected. Task placement uses one sched lease per task (tag = task id),
// so a lost worker's task is moved by sched's own rules: REASSIGNED (re-run
// elsewhere now), DETACHED (wait), RESUMED (the same worker came back),
// EXPIRED (give up). Tasks pinned to a worker (a named worker, or a session
// after its first task) hold no lease and wait for that worker instead.
//
// Files: fabric.c (endpoint, loop thread, config), fabric_conn.c
// (connections, writes, actions), fabric_glue.c (the sans-I/O join decision
// and action drain, shared with src/sim), fabric_workers.c (joins, losses,
// worker API), fabric_tasks.c (task handles, outcomes, task API),
// fabric_placement.c (placement and the scheduling pass),
// fabric_programs.c (programs, offers, sessions), fabric_metrics.c
// (metrics, latency histogram, stats). Every function declared here runs
// with ep->mu held unless it says otherwise.

#ifndef PCP_FABRIC_FABRIC_IMPL_H_
#define PCP_FABRIC_FABRIC_IMPL_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fabric/fabric.h"

//===----------------------------------------------------------------------===//
// Types
//===----------------------------------------------------------------------===//

typedef struct fabric_conn_t fabric_conn_t;
typedef struct fabric_worker_t fabric_worker_t;

typedef enum task_state_e {
  TASK_PENDING = 0,        // waiting for placement
  TASK_AWAIT_PROGRAM = 1,  // placed; the worker is getting the program
  TASK_RUNNING = 2,        // TASK_ASSIGN sent
  TASK_DETACHED = 3,       // lease detached by sched: waiting for an event
  TASK_DONE = 4,
} task_state_t;

struct pcp_fabric_task_t {
  _Atomic int32_t references;
  _Atomic bool done;
  pcp_fabric_endpoint_t* endpoint;
  pcp_allocator_t allocator;
  uint64_t id;
  uint8_t program[PCP_SHA256_BYTE_LENGTH];
  char* function;
  pcp_proto_section_t* inputs;
  uint32_t input_count;
  pcp_proto_tensor_ref_t* refs;
  uint32_t ref_count;
  pcp_proto_keep_resident_t* keep;
  uint32_t keep_count;
  bool return_resident;
  uint32_t hash_inputs;
  uint32_t hash_outputs;
  pcp_sched_worker_class_t worker_class;
  char* target;
  uint64_t min_device_memory_bytes;
  char* pin_worker_id;  // named worker; NULL for constraint placement
  char* class_name;     // the worker class it must run on; NULL: any
  char* session_id;     // NULL: none
  uint64_t group_id;    // gang-submitted copies share it; 0: none
  bool group_unplaced;  // the gang has not been placed yet
  uint32_t max_attempts;
  pcp_fabric_task_fn_t callback;
  void* user_data;
  // Loop-thread state (under the endpoint lock).
  task_state_t state;
  fabric_worker_t* worker;  // where it is placed / last ran
  int64_t pin_deadline_ns;  // pinned tasks give up after this
  uint64_t lease_id;
  uint64_t request_id;
  uint32_t attempts;
  bool cancel_requested;
  bool cancel_sent;
  // When TASK_CANCEL went out, on which connection, and that connection's
  // queued-frame count right after it: once that many frames are written,
  // nothing of the task's input is still being sent (frames go in order).
  int64_t cancel_sent_ns;
  uint64_t cancel_conn_id;
  uint64_t cancel_write_mark;
  pcp_proto_task_state_t progress_state;
  double progress_fraction;
  uint64_t elapsed_us;
  pcp_sched_worker_id_t last_worker_id;
  // Outcome (immutable once |done|).
  pcp_status_t status;
  pcp_proto_frame_t result_frame;
  pcp_proto_section_t* outputs;
  size_t output_count;
  pcp_proto_tensor_blob_t* blobs;  // outputs that came as chunked blobs
  size_t blob_count;
  // Live list (submit order) and pending notifications.
  pcp_fabric_task_t* next;
  pcp_fabric_task_t* prev;
  pcp_fabric_task_t* notify_next;
  bool in_notify_list;
  bool notify_progress;
  bool notify_done;
};

typedef struct program_t {
  uint8_t hash[PCP_SHA256_BYTE_LENGTH];
  uint8_t* raw;   // allocation
  uint8_t* data;  // 64-byte aligned inside |raw|
  size_t byte_length;
  char backend[16];
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];
} program_t;

typedef struct hash_set_t {
  uint8_t (*items)[PCP_SHA256_BYTE_LENGTH];
  uint32_t count;
  uint32_t capacity;
} hash_set_t;

struct fabric_worker_t {
  pcp_fabric_worker_info_t info;
  fabric_conn_t* conn;  // accepted connection, NULL when lost
  uint8_t resume_token[PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH];
  int64_t lost_at_ns;
  hash_set_t acked;    // programs the worker holds
  hash_set_t offered;  // offers awaiting an answer
  uint32_t gauge_key;  // slot in the workers gauge (UINT32_MAX: none)
};

// One encoded frame being written (up to 16 buffers per write call).
typedef struct write_rec_t {
  pcp_proto_encoded_frame_t frame;
  fabric_conn_t* conn;
  size_t next_segment;
  uint32_t pending;
  bool all_submitted;
  struct write_rec_t* next;
} write_rec_t;

struct fabric_conn_t {
  pcp_fabric_endpoint_t* endpoint;
  pcp_tcp_conn_t* tcp;  // NULL once its close handler ran
  pcp_proto_gateway_conn_t* proto;
  fabric_worker_t* worker;
  uint64_t id;
  char peer[PCP_NET_ADDRESS_TEXT_CAPACITY];
  write_rec_t* queue_head;  // frames not fully handed to net yet
  write_rec_t* queue_tail;
  uint32_t writes_in_flight;
  bool close_requested;
  int64_t close_requested_ns;
  bool shutdown_started;
  bool tcp_close_called;
  bool ended;  // loss handled
  // The drain guard of pcp_fabric_conn_actions_drain: it runs for this
  // connection up the stack, so a nested call leaves the queue to it.
  bool in_actions;
  // Bytes read from / handed to net on this connection (the handshake
  // included); the worker's info adds them up over its connections.
  _Atomic uint64_t bytes_in;
  _Atomic uint64_t bytes_out;
  // Frames handed to the write queue / no longer referenced by it (written
  // or dropped); both only grow, in queue order.
  uint64_t frames_queued;
  uint64_t frames_released;
  // Frame counter by type (a light header scan beside the real decoder).
  uint8_t scan_header[PCP_PROTO_HEADER_BYTE_LENGTH];
  size_t scan_filled;
  uint64_t scan_skip;
  fabric_conn_t* next;
  fabric_conn_t* prev;
};

typedef struct session_t {
  char* id;
  fabric_worker_t* worker;
} session_t;

// Log-linear latency histogram: 16 sub-buckets per power of two.
#define HIST_BUCKETS 1024

// Message types counted per direction: index by type (<= 35) + 1 unknown.
#define FRAME_TYPE_SLOTS 37

struct pcp_fabric_endpoint_t {
  pcp_allocator_t allocator;
  pcp_fabric_options_t options;
  pcp_proto_timeouts_t timeouts;
  int64_t cancel_answer_timeout_ns;  // options.cancel_answer_timeout_ms
  pcp_clock_t clock;
  pcp_log_context_t log;
  char software[64];
  uint8_t* token;
  size_t token_length;

  pcp_loop_t* loop;
  pcp_tcp_listener_t* listener;
  pcp_loop_timer_t* tick_timer;
  uint16_t port;
  pthread_t thread;
  bool thread_started;

  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool stopping;
  uint64_t wake_count;  // pcp_fabric_endpoint_wake calls
  atomic_bool kick_pending;
  int64_t last_tick_ns;
  bool tick_skipped;
  uint64_t tick_count;
  bool schedule_wanted;

  pcp_sched_t* sched;

  fabric_conn_t* conns;
  uint32_t conn_count;
  uint64_t next_conn_id;
  fabric_worker_t** workers;
  uint32_t worker_count;
  uint32_t worker_capacity;
  program_t* programs;
  uint32_t program_count;
  uint32_t program_capacity;
  session_t* sessions;
  uint32_t session_count;
  uint32_t session_capacity;

  pcp_fabric_task_t* tasks_head;  // live tasks in submit order
  pcp_fabric_task_t* tasks_tail;
  pcp_fabric_task_t* notify_head;
  pcp_fabric_task_t* notify_tail;
  uint64_t next_task_id;

  // Stats (atomics: read by stats_query from any thread).
  _Atomic uint64_t bytes_in;
  _Atomic uint64_t bytes_out;
  _Atomic uint64_t frames_in;
  _Atomic uint64_t frames_out;
  _Atomic uint64_t evictions;
  _Atomic uint64_t rejected_joins;
  _Atomic uint64_t protocol_errors;
  _Atomic uint64_t events_handled;
  _Atomic uint64_t hist[HIST_BUCKETS];
  _Atomic int64_t hist_max_ns;

  // Metrics.
  pcp_obs_registry_t* own_metrics;
  pcp_obs_registry_t* metrics;
  pcp_obs_family_t* families[10];
  pcp_obs_series_t* m_bytes_in;
  pcp_obs_series_t* m_bytes_out;
  pcp_obs_series_t* m_connections;
  pcp_obs_series_t* m_heartbeat_age;
  pcp_obs_series_t* m_evictions;
  pcp_obs_series_t* m_rejected;
  pcp_obs_series_t* m_reassigned;
  pcp_obs_series_t* m_frames[2][FRAME_TYPE_SLOTS];
  pcp_obs_series_t* m_tasks[4];  // succeeded, failed, cancelled, aborted
  // (backend, target) pairs seen, for the workers gauge.
  struct {
    char backend[16];
    char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];
  } gauge_keys[64];
  uint32_t gauge_key_count;
};

//===----------------------------------------------------------------------===//
// Shared helpers
//===----------------------------------------------------------------------===//

enum {
  M_WORKERS = 0,
  M_CONNECTIONS,
  M_BYTES_IN,
  M_BYTES_OUT,
  M_FRAMES,
  M_HEARTBEAT_AGE,
  M_EVICTIONS,
  M_TASKS,
  M_REASSIGNED,
  M_REJECTED,
  M_COUNT_,
};

static inline void counter_add(pcp_obs_series_t* series, double delta) {
  if (series)
    pcp_obs_counter_add(series, delta);
}

static inline int64_t now_ns(pcp_fabric_endpoint_t* ep) {
  return pcp_clock_now_ns(ep->clock);
}

static inline void copy_text(char* dst, size_t capacity, const char* src) {
  if (!src)
    src = "";
  size_t n = strlen(src);
  if (n >= capacity)
    n = capacity - 1;
  memcpy(dst, src, n);
  dst[n] = 0;
}

static inline pcp_status_t dup_string(pcp_allocator_t allocator,
                                      const char* value, char** out_value) {
  *out_value = NULL;
  if (!value)
    return pcp_ok_status();
  size_t n = strlen(value);
  void* p = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(allocator, n + 1, &p));
  memcpy(p, value, n + 1);
  *out_value = p;
  return pcp_ok_status();
}

static inline void log_status(pcp_fabric_endpoint_t* ep, pcp_log_level_t level,
                              pcp_status_t status, const char* what) {
  pcp_log_status(level, &ep->log, status, what);
}

//===----------------------------------------------------------------------===//
// Endpoint (fabric.c)
//===----------------------------------------------------------------------===//

void pcp_fabric_kick(pcp_fabric_endpoint_t* ep);

//===----------------------------------------------------------------------===//
// Connections (fabric_conn.c)
//===----------------------------------------------------------------------===//

// Executes the connection's queued actions in order through
// pcp_fabric_conn_actions_drain (fabric_glue.c, shared with src/sim), whose
// guard makes a nested call (a command issued while handling an action)
// return at once and leave the queue to the running loop (the CI hang:
// on_program_answer lost its place and never assigned the tasks behind).
// Ends the connection when its state machine is CLOSED.
void pcp_fabric_conn_process_actions(fabric_conn_t* conn);

// A command or event failed on our side (out of memory): end the connection.
void pcp_fabric_conn_local_failure(fabric_conn_t* conn, pcp_status_t status,
                                   const char* what);

void pcp_fabric_conn_accept(void* user_data, pcp_tcp_listener_t* listener,
                            pcp_tcp_conn_t* tcp);

//===----------------------------------------------------------------------===//
// Workers (fabric_workers.c)
//===----------------------------------------------------------------------===//

fabric_worker_t* pcp_fabric_worker_find(pcp_fabric_endpoint_t* ep,
                                        const char* worker_id);

bool pcp_fabric_worker_connected(const fabric_worker_t* w);

void pcp_fabric_join_verified(fabric_conn_t* conn);

// The connection's state machine is CLOSED: the worker (if it was accepted on
// this connection) is lost; its tasks move per the sched rules.
void pcp_fabric_conn_ended(fabric_conn_t* conn);

//===----------------------------------------------------------------------===//
// Tasks (fabric_tasks.c)
//===----------------------------------------------------------------------===//

void pcp_fabric_task_notify(pcp_fabric_endpoint_t* ep, pcp_fabric_task_t* task,
                            pcp_fabric_task_event_t event);

// Ends a locked loop-thread section: runs the scheduling pass if something
// asked for it, then unlocks and runs the collected callbacks.
void pcp_fabric_unlock_and_notify(pcp_fabric_endpoint_t* ep);

// Final outcome. |status| is consumed (OK for a result).
void pcp_fabric_task_finish(pcp_fabric_endpoint_t* ep, pcp_fabric_task_t* task,
                            pcp_status_t status);

pcp_fabric_task_t* pcp_fabric_task_find(pcp_fabric_endpoint_t* ep,
                                        uint64_t task_id);

void pcp_fabric_task_result_receive(fabric_conn_t* conn,
                                    pcp_proto_action_t* action);

//===----------------------------------------------------------------------===//
// Placement (fabric_placement.c)
//===----------------------------------------------------------------------===//

// |task| was answered by |w| (a result or, |failed|, an error of its own):
// counted, and no longer its current task. ep->mu held.
void pcp_fabric_worker_task_answered(fabric_worker_t* w,
                                     const pcp_fabric_task_t* task,
                                     bool failed);

// OK when |task| may run on |w| by worker class (it names none, or |w|
// joined with that name), else FAILED_PRECONDITION naming both: a named
// worker or a session's worker of another class never runs it. ep->mu held.
PCP_MUST_USE_RESULT pcp_status_t pcp_fabric_task_class_check(
    const pcp_fabric_task_t* task, const fabric_worker_t* w);

void pcp_fabric_task_assign(pcp_fabric_endpoint_t* ep, pcp_fabric_task_t* task);

void pcp_fabric_sched_event_handle(pcp_fabric_endpoint_t* ep,
                                   const pcp_sched_event_t* event);

void pcp_fabric_schedule_pass(pcp_fabric_endpoint_t* ep);

//===----------------------------------------------------------------------===//
// Programs and sessions (fabric_programs.c)
//===----------------------------------------------------------------------===//

bool pcp_fabric_hash_set_contains(const hash_set_t* set, const uint8_t* hash);

pcp_status_t pcp_fabric_hash_set_add(pcp_allocator_t allocator, hash_set_t* set,
                                     const uint8_t* hash);

void pcp_fabric_hash_set_remove(hash_set_t* set, const uint8_t* hash);

program_t* pcp_fabric_program_find(pcp_fabric_endpoint_t* ep,
                                   const uint8_t* hash);

session_t* pcp_fabric_session_find(pcp_fabric_endpoint_t* ep, const char* id);

void pcp_fabric_session_bind(pcp_fabric_endpoint_t* ep, const char* id,
                             fabric_worker_t* worker);

void pcp_fabric_session_forget(pcp_fabric_endpoint_t* ep, uint32_t index);

void pcp_fabric_program_answer(fabric_conn_t* conn, const uint8_t* program,
                               pcp_status_t failure);

//===----------------------------------------------------------------------===//
// Metrics (fabric_metrics.c)
//===----------------------------------------------------------------------===//

extern const pcp_obs_metric_def_t pcp_fabric_metric_defs[M_COUNT_];

void pcp_fabric_metrics_bind(pcp_fabric_endpoint_t* ep);

void pcp_fabric_frame_count(pcp_fabric_endpoint_t* ep, int direction,
                            uint16_t type);

void pcp_fabric_hist_record(pcp_fabric_endpoint_t* ep, int64_t value_ns);

// The (backend, target) slot of the workers gauge for |w|, added on first
// sight; UINT32_MAX past the 64 kept (those workers are not in the gauge).
uint32_t pcp_fabric_gauge_key_of(pcp_fabric_endpoint_t* ep,
                                 const fabric_worker_t* w);

// One pass over the workers (the slot is cached on the worker at join), so
// a large fleet costs one loop per refresh, not one per label set.
void pcp_fabric_worker_gauges_refresh(pcp_fabric_endpoint_t* ep, int64_t now);

#endif  // PCP_FABRIC_FABRIC_IMPL_H_
