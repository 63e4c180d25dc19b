// SPDX-License-Identifier: Apache-2.0
//
// The gateway's worker-fabric endpoint: net (sockets, one loop thread) +
// proto (one gateway state machine per connection) + sched (registry,
// leases, reassignment). See fabric.h for the contract.
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
  pcp_sched_worker_class_t worker_class;
  char* target;
  uint64_t min_device_memory_bytes;
  char* pin_worker_id;  // named worker; NULL for constraint placement
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
  // process_actions is running for this connection (up the stack): a
  // nested call leaves the queue to it (see process_actions).
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
// Metrics table
//===----------------------------------------------------------------------===//

static const char* const k_worker_labels[] = {"state", "backend", "target",
                                              NULL};
static const char* const k_frame_labels[] = {"direction", "type", NULL};
static const char* const k_outcome_labels[] = {"outcome", NULL};

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

static const pcp_obs_metric_def_t k_metric_defs[M_COUNT_] = {
    {.name = "pcp_fabric_workers",
     .type = PCP_OBS_METRIC_TYPE_GAUGE,
     .help = "Workers known to the fabric endpoint, by state, backend and "
             "target",
     .label_names = k_worker_labels},
    {.name = "pcp_fabric_connections",
     .type = PCP_OBS_METRIC_TYPE_GAUGE,
     .help = "Open fabric TCP connections, handshakes included"},
    {.name = "pcp_fabric_received_bytes_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Bytes received on fabric connections"},
    {.name = "pcp_fabric_sent_bytes_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Bytes handed to the kernel on fabric connections"},
    {.name = "pcp_fabric_frames_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Fabric frames by direction (in, out) and message type",
     .label_names = k_frame_labels},
    {.name = "pcp_fabric_heartbeat_age_seconds",
     .type = PCP_OBS_METRIC_TYPE_GAUGE,
     .help = "Time since the last frame of the most silent connected worker"},
    {.name = "pcp_fabric_evictions_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Workers evicted for silence past the heartbeat timeout"},
    {.name = "pcp_fabric_tasks_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Fabric tasks by outcome (succeeded, failed, cancelled, aborted)",
     .label_names = k_outcome_labels},
    {.name = "pcp_fabric_task_reruns_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Task runs started again after their worker was lost"},
    {.name = "pcp_fabric_rejected_joins_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Worker joins rejected (bad token, bad join, duplicate, full)"},
};

static pcp_obs_series_t* series_or_null(pcp_obs_family_t* family,
                                        const char* const* labels) {
  pcp_obs_series_t* series = NULL;
  pcp_status_t status = pcp_obs_family_series_get(family, labels, &series);
  if (status) {
    pcp_status_ignore(status);
    return NULL;
  }
  return series;
}

static void counter_add(pcp_obs_series_t* series, double delta) {
  if (series) pcp_obs_counter_add(series, delta);
}

static const char* k_task_outcomes[4] = {"succeeded", "failed", "cancelled",
                                         "aborted"};

static void metrics_bind(pcp_fabric_endpoint_t* ep) {
  ep->m_connections = series_or_null(ep->families[M_CONNECTIONS], NULL);
  ep->m_bytes_in = series_or_null(ep->families[M_BYTES_IN], NULL);
  ep->m_bytes_out = series_or_null(ep->families[M_BYTES_OUT], NULL);
  ep->m_heartbeat_age = series_or_null(ep->families[M_HEARTBEAT_AGE], NULL);
  ep->m_evictions = series_or_null(ep->families[M_EVICTIONS], NULL);
  ep->m_reassigned = series_or_null(ep->families[M_REASSIGNED], NULL);
  ep->m_rejected = series_or_null(ep->families[M_REJECTED], NULL);
  for (int i = 0; i < 4; ++i) {
    const char* labels[] = {k_task_outcomes[i]};
    ep->m_tasks[i] = series_or_null(ep->families[M_TASKS], labels);
  }
  static const char* const k_dirs[2] = {"in", "out"};
  for (int d = 0; d < 2; ++d) {
    for (uint16_t t = 1; t < FRAME_TYPE_SLOTS - 1; ++t) {
      const char* name = pcp_proto_message_type_name(t);
      if (!name) continue;
      const char* labels[] = {k_dirs[d], name};
      ep->m_frames[d][t] = series_or_null(ep->families[M_FRAMES], labels);
    }
    const char* labels[] = {k_dirs[d], "UNKNOWN"};
    ep->m_frames[d][FRAME_TYPE_SLOTS - 1] =
        series_or_null(ep->families[M_FRAMES], labels);
  }
}

static void count_frame(pcp_fabric_endpoint_t* ep, int direction,
                        uint16_t type) {
  size_t slot = type < FRAME_TYPE_SLOTS - 1 && pcp_proto_message_type_name(type)
                    ? type
                    : FRAME_TYPE_SLOTS - 1;
  counter_add(ep->m_frames[direction][slot], 1);
  atomic_fetch_add_explicit(direction ? &ep->frames_out : &ep->frames_in, 1,
                            memory_order_relaxed);
}

//===----------------------------------------------------------------------===//
// Small helpers
//===----------------------------------------------------------------------===//

static int64_t now_ns(pcp_fabric_endpoint_t* ep) {
  return pcp_clock_now_ns(ep->clock);
}

static void copy_text(char* dst, size_t capacity, const char* src) {
  if (!src) src = "";
  size_t n = strlen(src);
  if (n >= capacity) n = capacity - 1;
  memcpy(dst, src, n);
  dst[n] = 0;
}

static pcp_status_t dup_string(pcp_allocator_t allocator, const char* value,
                               char** out_value) {
  *out_value = NULL;
  if (!value) return pcp_ok_status();
  size_t n = strlen(value);
  void* p = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(allocator, n + 1, &p));
  memcpy(p, value, n + 1);
  *out_value = p;
  return pcp_ok_status();
}

static bool hash_set_contains(const hash_set_t* set, const uint8_t* hash) {
  for (uint32_t i = 0; i < set->count; ++i) {
    if (memcmp(set->items[i], hash, PCP_SHA256_BYTE_LENGTH) == 0) return true;
  }
  return false;
}

static pcp_status_t hash_set_add(pcp_allocator_t allocator, hash_set_t* set,
                                 const uint8_t* hash) {
  if (hash_set_contains(set, hash)) return pcp_ok_status();
  if (set->count == set->capacity) {
    uint32_t capacity = set->capacity ? set->capacity * 2 : 4;
    void* p = set->items;
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_realloc(
        allocator, (size_t)capacity * PCP_SHA256_BYTE_LENGTH, &p));
    set->items = p;
    set->capacity = capacity;
  }
  memcpy(set->items[set->count++], hash, PCP_SHA256_BYTE_LENGTH);
  return pcp_ok_status();
}

static void hash_set_remove(hash_set_t* set, const uint8_t* hash) {
  for (uint32_t i = 0; i < set->count; ++i) {
    if (memcmp(set->items[i], hash, PCP_SHA256_BYTE_LENGTH) == 0) {
      memcpy(set->items[i], set->items[--set->count], PCP_SHA256_BYTE_LENGTH);
      return;
    }
  }
}

static void log_status(pcp_fabric_endpoint_t* ep, pcp_log_level_t level,
                       pcp_status_t status, const char* what) {
  pcp_log_status(level, &ep->log, status, what);
}

static void hist_record(pcp_fabric_endpoint_t* ep, int64_t value_ns) {
  uint64_t v = value_ns > 0 ? (uint64_t)value_ns : 0;
  size_t index;
  if (v < 16) {
    index = (size_t)v;
  } else {
    int msb = 63 - __builtin_clzll(v);
    index = (size_t)(msb - 3) * 16 + (size_t)((v >> (msb - 4)) & 15);
  }
  if (index >= HIST_BUCKETS) index = HIST_BUCKETS - 1;
  atomic_fetch_add_explicit(&ep->hist[index], 1, memory_order_relaxed);
  int64_t max = atomic_load_explicit(&ep->hist_max_ns, memory_order_relaxed);
  while ((int64_t)v > max &&
         !atomic_compare_exchange_weak(&ep->hist_max_ns, &max, (int64_t)v)) {
  }
}

static int64_t hist_upper_bound(size_t index) {
  if (index < 16) return (int64_t)index;
  size_t msb = index / 16 + 3;
  uint64_t sub = index % 16;
  return (int64_t)(((16 + sub + 1) << (msb - 4)) - 1);
}

static int64_t hist_percentile(pcp_fabric_endpoint_t* ep, double q) {
  uint64_t total = 0;
  for (size_t i = 0; i < HIST_BUCKETS; ++i) total += ep->hist[i];
  if (total == 0) return 0;
  uint64_t rank = (uint64_t)(q * (double)total);
  if (rank >= total) rank = total - 1;
  uint64_t seen = 0;
  for (size_t i = 0; i < HIST_BUCKETS; ++i) {
    seen += ep->hist[i];
    if (seen > rank) return hist_upper_bound(i);
  }
  return hist_upper_bound(HIST_BUCKETS - 1);
}

//===----------------------------------------------------------------------===//
// Tasks: lifetime and notifications
//===----------------------------------------------------------------------===//

static void task_free(pcp_fabric_task_t* task) {
  pcp_allocator_t a = task->allocator;
  pcp_allocator_free(a, task->function);
  pcp_allocator_free(a, task->inputs);
  if (task->refs) {
    for (uint32_t i = 0; i < task->ref_count; ++i) {
      pcp_allocator_free(a, (void*)task->refs[i].name);
    }
  }
  pcp_allocator_free(a, task->refs);
  if (task->keep) {
    for (uint32_t i = 0; i < task->keep_count; ++i) {
      pcp_allocator_free(a, (void*)task->keep[i].as);
    }
  }
  pcp_allocator_free(a, task->keep);
  pcp_allocator_free(a, task->target);
  pcp_allocator_free(a, task->pin_worker_id);
  pcp_allocator_free(a, task->session_id);
  pcp_allocator_free(a, task->outputs);
  for (size_t i = 0; i < task->blob_count; ++i) {
    pcp_proto_blob_free(a, task->blobs[i].data);
  }
  pcp_allocator_free(a, task->blobs);
  pcp_proto_frame_deinitialize(&task->result_frame);
  pcp_status_ignore(task->status);
  pcp_allocator_free(a, task);
}

void pcp_fabric_task_retain(pcp_fabric_task_t* task) {
  if (task) atomic_fetch_add(&task->references, 1);
}

void pcp_fabric_task_release(pcp_fabric_task_t* task) {
  if (task && atomic_fetch_sub(&task->references, 1) == 1) task_free(task);
}

static void notify(pcp_fabric_endpoint_t* ep, pcp_fabric_task_t* task,
                   pcp_fabric_task_event_t event) {
  if (event == PCP_FABRIC_TASK_EVENT_DONE) {
    task->notify_done = true;
  } else {
    task->notify_progress = true;
  }
  if (!task->callback || task->in_notify_list) return;
  task->in_notify_list = true;
  pcp_fabric_task_retain(task);
  task->notify_next = NULL;
  if (ep->notify_tail) {
    ep->notify_tail->notify_next = task;
  } else {
    ep->notify_head = task;
  }
  ep->notify_tail = task;
}

static void schedule_pass(pcp_fabric_endpoint_t* ep);

// Ends a locked loop-thread section: runs the scheduling pass if something
// asked for it, then unlocks and runs the collected callbacks.
static void unlock_and_notify(pcp_fabric_endpoint_t* ep) {
  int guard = 0;
  while (ep->schedule_wanted && guard++ < 16) {
    ep->schedule_wanted = false;
    schedule_pass(ep);
  }
  pcp_fabric_task_t* list = ep->notify_head;
  ep->notify_head = ep->notify_tail = NULL;
  typedef struct {
    bool progress;
    bool done;
  } flags_t;
  for (pcp_fabric_task_t* t = list; t; t = t->notify_next) {
    t->in_notify_list = false;
  }
  // Take the flags while still locked: once unlocked, the loop thread (or
  // this callback) may queue the task again.
  size_t count = 0;
  for (pcp_fabric_task_t* t = list; t; t = t->notify_next) ++count;
  flags_t small[64];
  flags_t* flags = small;
  void* heap = NULL;
  if (count > PCP_ARRAYSIZE(small)) {
    pcp_status_t status =
        pcp_allocator_malloc(ep->allocator, count * sizeof(flags_t), &heap);
    if (status) {
      // Out of memory: deliver DONE only (it is also visible through wait).
      pcp_status_ignore(status);
      flags = NULL;
    } else {
      flags = heap;
    }
  }
  size_t i = 0;
  for (pcp_fabric_task_t* t = list; t; t = t->notify_next, ++i) {
    if (flags) {
      flags[i].progress = t->notify_progress;
      flags[i].done = t->notify_done;
    }
    t->notify_progress = false;
    t->notify_done = false;
  }
  pthread_mutex_unlock(&ep->mu);
  i = 0;
  pcp_fabric_task_t* t = list;
  while (t) {
    pcp_fabric_task_t* next = t->notify_next;
    bool progress = flags ? flags[i].progress : false;
    bool done = flags ? flags[i].done : atomic_load(&t->done);
    if (progress) {
      t->callback(t->user_data, t, PCP_FABRIC_TASK_EVENT_PROGRESS);
    }
    if (done) t->callback(t->user_data, t, PCP_FABRIC_TASK_EVENT_DONE);
    pcp_fabric_task_release(t);
    t = next;
    ++i;
  }
  pcp_allocator_free(ep->allocator, heap);
}

static void task_unlink(pcp_fabric_endpoint_t* ep, pcp_fabric_task_t* task) {
  if (task->prev) {
    task->prev->next = task->next;
  } else {
    ep->tasks_head = task->next;
  }
  if (task->next) {
    task->next->prev = task->prev;
  } else {
    ep->tasks_tail = task->prev;
  }
  task->next = task->prev = NULL;
}

// Final outcome. |status| is consumed (OK for a result).
static void task_finish(pcp_fabric_endpoint_t* ep, pcp_fabric_task_t* task,
                        pcp_status_t status) {
  if (task->state == TASK_DONE) {
    pcp_status_ignore(status);
    return;
  }
  if (task->lease_id) {
    pcp_status_ignore(pcp_sched_lease_release(ep->sched, task->lease_id));
    task->lease_id = 0;
  }
  task->state = TASK_DONE;
  task->worker = NULL;
  task->status = status;
  int outcome = 0;
  switch (pcp_status_code(status)) {
    case PCP_STATUS_OK:
      outcome = 0;
      break;
    case PCP_STATUS_CANCELLED:
      outcome = 2;
      break;
    case PCP_STATUS_ABORTED:
      outcome = 3;
      break;
    default:
      outcome = 1;
      break;
  }
  counter_add(ep->m_tasks[outcome], 1);
  task_unlink(ep, task);
  notify(ep, task, PCP_FABRIC_TASK_EVENT_DONE);
  atomic_store(&task->done, true);
  pthread_cond_broadcast(&ep->cv);
  pcp_fabric_task_release(task);  // the live list's reference
}

static pcp_fabric_task_t* task_find(pcp_fabric_endpoint_t* ep,
                                    uint64_t task_id) {
  for (pcp_fabric_task_t* t = ep->tasks_head; t; t = t->next) {
    if (t->id == task_id) return t;
  }
  return NULL;
}

//===----------------------------------------------------------------------===//
// Workers, programs, sessions
//===----------------------------------------------------------------------===//

static fabric_worker_t* worker_find(pcp_fabric_endpoint_t* ep,
                                    const char* worker_id) {
  for (uint32_t i = 0; i < ep->worker_count; ++i) {
    if (strcmp(ep->workers[i]->info.worker_id, worker_id) == 0) {
      return ep->workers[i];
    }
  }
  return NULL;
}

static program_t* program_find(pcp_fabric_endpoint_t* ep,
                               const uint8_t* hash) {
  for (uint32_t i = 0; i < ep->program_count; ++i) {
    if (memcmp(ep->programs[i].hash, hash, PCP_SHA256_BYTE_LENGTH) == 0) {
      return &ep->programs[i];
    }
  }
  return NULL;
}

static session_t* session_find(pcp_fabric_endpoint_t* ep, const char* id) {
  for (uint32_t i = 0; i < ep->session_count; ++i) {
    if (strcmp(ep->sessions[i].id, id) == 0) return &ep->sessions[i];
  }
  return NULL;
}

static void session_bind(pcp_fabric_endpoint_t* ep, const char* id,
                         fabric_worker_t* worker) {
  session_t* s = session_find(ep, id);
  if (s) {
    s->worker = worker;
    return;
  }
  if (ep->session_count == PCP_FABRIC_MAX_SESSIONS) {
    // Bounded: the oldest binding goes (its next task is placed by its
    // constraint, and the worker reports missing resident tensors).
    pcp_allocator_free(ep->allocator, ep->sessions[0].id);
    memmove(&ep->sessions[0], &ep->sessions[1],
            (ep->session_count - 1) * sizeof(session_t));
    ep->session_count--;
  }
  if (ep->session_count == ep->session_capacity) {
    uint32_t capacity = ep->session_capacity ? ep->session_capacity * 2 : 16;
    void* p = ep->sessions;
    pcp_status_t status = pcp_allocator_realloc(
        ep->allocator, capacity * sizeof(session_t), &p);
    if (status) {
      // Without the binding the next task of the session is placed by its
      // constraint; the worker then reports the missing resident tensors.
      pcp_status_ignore(status);
      return;
    }
    ep->sessions = p;
    ep->session_capacity = capacity;
  }
  char* copy = NULL;
  pcp_status_t status = dup_string(ep->allocator, id, &copy);
  if (status) {
    pcp_status_ignore(status);
    return;
  }
  ep->sessions[ep->session_count++] = (session_t){.id = copy, .worker = worker};
}

static void session_forget(pcp_fabric_endpoint_t* ep, uint32_t index) {
  pcp_allocator_free(ep->allocator, ep->sessions[index].id);
  ep->sessions[index] = ep->sessions[--ep->session_count];
}

// Frees the registry slot of the worker lost longest ago, once its resume
// window has passed, so that a fleet whose ids churn (pods with new names)
// does not fill the registry. False when none can go.
static bool worker_recycle_one(pcp_fabric_endpoint_t* ep, int64_t now) {
  uint32_t victim = UINT32_MAX;
  for (uint32_t i = 0; i < ep->worker_count; ++i) {
    fabric_worker_t* w = ep->workers[i];
    if (w->conn || now - w->lost_at_ns <= ep->timeouts.resume_window_ns) {
      continue;
    }
    if (victim == UINT32_MAX ||
        w->lost_at_ns < ep->workers[victim]->lost_at_ns) {
      victim = i;
    }
  }
  if (victim == UINT32_MAX) return false;
  fabric_worker_t* w = ep->workers[victim];
  for (uint32_t i = 0; i < ep->session_count;) {
    if (ep->sessions[i].worker == w) {
      session_forget(ep, i);
    } else {
      ++i;
    }
  }
  for (pcp_fabric_task_t* t = ep->tasks_head; t; t = t->next) {
    if (t->worker == w) t->worker = NULL;
  }
  for (fabric_conn_t* c = ep->conns; c; c = c->next) {
    if (c->worker == w) c->worker = NULL;  // a close still flushing
  }
  pcp_status_ignore(
      pcp_sched_worker_remove(ep->sched, w->info.worker_id, now, NULL));
  pcp_allocator_free(ep->allocator, w->acked.items);
  pcp_allocator_free(ep->allocator, w->offered.items);
  pcp_allocator_free(ep->allocator, w);
  ep->workers[victim] = ep->workers[--ep->worker_count];
  return true;
}

static bool worker_connected(const fabric_worker_t* w) {
  return w->conn != NULL &&
         pcp_proto_gateway_conn_state(w->conn->proto) ==
             PCP_PROTO_GATEWAY_ACCEPTED;
}

//===----------------------------------------------------------------------===//
// Writing
//===----------------------------------------------------------------------===//

static void try_finish_close(fabric_conn_t* conn);

static void write_rec_free(write_rec_t* rec) {
  rec->conn->frames_released++;
  pcp_allocator_t a = rec->frame.allocator;
  pcp_proto_encoded_frame_deinitialize(&rec->frame);
  pcp_allocator_free(a, rec);
}

static void on_write_done(void* user_data, pcp_tcp_conn_t* tcp,
                          pcp_status_t status) {
  (void)tcp;
  pcp_status_ignore(status);  // a failed write also closes the connection
  write_rec_t* rec = user_data;
  fabric_conn_t* conn = rec->conn;
  rec->pending--;
  conn->writes_in_flight--;
  if (rec->all_submitted && rec->pending == 0) write_rec_free(rec);
  if (conn->tcp) try_finish_close(conn);
}

// Hands queued frames to net until its send queue is at the mark.
static void flush_writes(fabric_conn_t* conn) {
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  while (conn->queue_head && conn->tcp) {
    write_rec_t* rec = conn->queue_head;
    pcp_tcp_buffer_t buffers[PCP_TCP_MAX_WRITE_BUFFERS];
    size_t n = 0;
    uint64_t bytes = 0;
    while (n < PCP_TCP_MAX_WRITE_BUFFERS &&
           rec->next_segment + n < rec->frame.segment_count) {
      const pcp_proto_iovec_t* seg =
          &rec->frame.segments[rec->next_segment + n];
      buffers[n].data = seg->data;
      buffers[n].byte_length = seg->byte_length;
      bytes += seg->byte_length;
      ++n;
    }
    pcp_status_t status = pcp_tcp_conn_write(conn->tcp, buffers, n,
                                             on_write_done, rec);
    if (pcp_status_code(status) == PCP_STATUS_RESOURCE_EXHAUSTED) {
      pcp_status_ignore(status);  // the writable handler resumes
      return;
    }
    if (status) {
      // Shut down or closing: nothing more can be written.
      pcp_status_ignore(status);
      while (conn->queue_head) {
        write_rec_t* r = conn->queue_head;
        conn->queue_head = r->next;
        r->all_submitted = true;
        if (r->pending == 0) write_rec_free(r);
      }
      conn->queue_tail = NULL;
      return;
    }
    rec->pending++;
    conn->writes_in_flight++;
    rec->next_segment += n;
    atomic_fetch_add_explicit(&ep->bytes_out, bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&conn->bytes_out, bytes, memory_order_relaxed);
    counter_add(ep->m_bytes_out, (double)bytes);
    if (rec->next_segment == rec->frame.segment_count) {
      rec->all_submitted = true;
      conn->queue_head = rec->next;
      if (!conn->queue_head) conn->queue_tail = NULL;
    }
  }
}

// Takes ownership of |frame|.
static void conn_send(fabric_conn_t* conn, pcp_proto_encoded_frame_t* frame) {
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  count_frame(ep, 1, frame->type);
  if (!conn->tcp || conn->shutdown_started) {
    pcp_proto_encoded_frame_deinitialize(frame);
    return;
  }
  void* p = NULL;
  pcp_status_t status = pcp_allocator_calloc(ep->allocator, sizeof(write_rec_t),
                                             &p);
  if (status) {
    // Out of memory mid-stream: the byte stream would have a hole, so the
    // connection must end.
    log_status(ep, PCP_LOG_ERROR, status, "fabric: write queue");
    pcp_status_ignore(status);
    pcp_proto_encoded_frame_deinitialize(frame);
    if (!conn->tcp_close_called) {
      conn->tcp_close_called = true;
      pcp_tcp_conn_close(conn->tcp);
    }
    return;
  }
  write_rec_t* rec = p;
  rec->frame = *frame;
  memset(frame, 0, sizeof(*frame));
  rec->conn = conn;
  if (conn->queue_tail) {
    conn->queue_tail->next = rec;
  } else {
    conn->queue_head = rec;
  }
  conn->queue_tail = rec;
  conn->frames_queued++;
  flush_writes(conn);
}

static void on_shutdown_done(void* user_data, pcp_tcp_conn_t* tcp,
                             pcp_status_t status) {
  (void)user_data;
  (void)tcp;
  // Keep reading until the peer closes (closing now with unread bytes would
  // reset the connection and could destroy the ERROR frame in flight); the
  // tick forces the close after 2H.
  pcp_status_ignore(status);
}

static void try_finish_close(fabric_conn_t* conn) {
  if (!conn->close_requested || conn->shutdown_started || !conn->tcp ||
      conn->queue_head) {
    return;
  }
  conn->shutdown_started = true;
  pcp_status_t status =
      pcp_tcp_conn_shutdown(conn->tcp, on_shutdown_done, conn);
  if (status) {
    pcp_status_ignore(status);
    if (!conn->tcp_close_called) {
      conn->tcp_close_called = true;
      pcp_tcp_conn_close(conn->tcp);
    }
  }
}

//===----------------------------------------------------------------------===//
// Placement
//===----------------------------------------------------------------------===//

static void process_actions(fabric_conn_t* conn);

// |task| was answered by |w| (a result or, |failed|, an error of its own):
// counted, and no longer its current task. ep->mu held.
static void worker_task_answered(fabric_worker_t* w,
                                 const pcp_fabric_task_t* task, bool failed) {
  if (!w)
    return;
  w->info.tasks_done++;
  if (failed)
    w->info.tasks_failed++;
  if (w->info.current_task_id == task->id) {
    w->info.current_task_id = 0;
    w->info.current_function[0] = '\0';
  }
}

static void task_assign(pcp_fabric_endpoint_t* ep, pcp_fabric_task_t* task) {
  fabric_worker_t* w = task->worker;
  pcp_proto_task_assign_t assign = {
      .task_id = task->id,
      .session_id = task->session_id ? task->session_id : "",
      .function = task->function,
      .inputs = task->refs,
      .input_count = task->ref_count,
      .keep_resident = task->keep,
      .keep_resident_count = task->keep_count,
      .return_resident = task->return_resident,
  };
  memcpy(assign.program, task->program, sizeof(assign.program));
  uint64_t request_id = 0;
  pcp_status_t status = pcp_proto_gateway_conn_assign_task(
      w->conn->proto, &assign, task->inputs, task->input_count, now_ns(ep),
      &request_id);
  if (pcp_status_code(status) == PCP_STATUS_RESOURCE_EXHAUSTED &&
      pcp_proto_gateway_conn_in_flight_count(w->conn->proto) >=
          ep->options.limits.max_in_flight) {
    // The connection's in-flight limit: wait for a slot (a pinned task stays
    // pinned; a leased one gives its lease back and is placed again). Any
    // other RESOURCE_EXHAUSTED is the frame itself (more sections than a
    // frame carries): no slot would ever fit it, so it fails below instead
    // of waiting forever.
    pcp_status_ignore(status);
    task->state = TASK_PENDING;
    if (task->lease_id) {
      pcp_status_ignore(pcp_sched_lease_release(ep->sched, task->lease_id));
      task->lease_id = 0;
      task->worker = NULL;
    }
    return;
  }
  if (status) {
    task_finish(ep, task, pcp_status_annotate_f(status, "task %llu on '%s'",
                                                (unsigned long long)task->id,
                                                w->info.worker_id));
    return;
  }
  task->state = TASK_RUNNING;
  task->request_id = request_id;
  task->attempts++;
  task->cancel_sent = false;
  copy_text(task->last_worker_id.value, sizeof(task->last_worker_id.value),
            w->info.worker_id);
  w->info.current_task_id = task->id;
  copy_text(w->info.current_function, sizeof(w->info.current_function),
            task->function ? task->function : "");
  process_actions(w->conn);
}

// Runs |task| on |w| (connected): program first if the worker lacks it.
static void task_dispatch(pcp_fabric_endpoint_t* ep, pcp_fabric_task_t* task,
                          fabric_worker_t* w) {
  if (task->cancel_requested) {
    task_finish(ep, task, pcp_make_status(PCP_STATUS_CANCELLED,
                                          "task %llu cancelled",
                                          (unsigned long long)task->id));
    return;
  }
  if (task->attempts >= task->max_attempts) {
    task_finish(ep, task,
                pcp_make_status(PCP_STATUS_ABORTED,
                                "task %llu: ran %u times and lost its worker "
                                "each time (limit %u)",
                                (unsigned long long)task->id, task->attempts,
                                task->max_attempts));
    return;
  }
  if (!worker_connected(w)) {
    // sched handed us a worker whose connection is already gone; wait.
    task->state = TASK_PENDING;
    task->worker = task->pin_worker_id ? w : NULL;
    if (task->lease_id) {
      pcp_status_ignore(pcp_sched_lease_release(ep->sched, task->lease_id));
      task->lease_id = 0;
    }
    ep->schedule_wanted = true;
    return;
  }
  task->worker = w;
  if (task->session_id && !session_find(ep, task->session_id)) {
    session_bind(ep, task->session_id, w);
  }
  if (hash_set_contains(&w->acked, task->program)) {
    task_assign(ep, task);
    return;
  }
  task->state = TASK_AWAIT_PROGRAM;
  if (hash_set_contains(&w->offered, task->program)) return;
  program_t* p = program_find(ep, task->program);
  if (!p) {  // programs are never removed; submit checked it
    task_finish(ep, task, pcp_make_status(PCP_STATUS_INTERNAL,
                                          "program vanished"));
    return;
  }
  pcp_proto_program_offer_t offer = {
      .byte_length = p->byte_length,
      .backend = p->backend,
      .target = p->target,
  };
  memcpy(offer.program, p->hash, sizeof(offer.program));
  uint64_t request_id = 0;
  pcp_status_t status = hash_set_add(ep->allocator, &w->offered, p->hash);
  if (!status) {
    status = pcp_proto_gateway_conn_offer_program(w->conn->proto, &offer,
                                                  now_ns(ep), &request_id);
    if (status) hash_set_remove(&w->offered, p->hash);
  }
  if (status) {
    task_finish(ep, task, status);
    return;
  }
  process_actions(w->conn);
}

static void task_place(pcp_fabric_endpoint_t* ep, pcp_fabric_task_t* task) {
  int64_t now = now_ns(ep);
  const char* pin = task->pin_worker_id;
  if (!pin && task->session_id) {
    session_t* s = session_find(ep, task->session_id);
    if (s) pin = s->worker->info.worker_id;
  }
  if (pin) {
    fabric_worker_t* w = worker_find(ep, pin);
    if (w && worker_connected(w) &&
        w->info.state == PCP_FABRIC_WORKER_CONNECTED) {
      task->pin_deadline_ns = 0;
      task_dispatch(ep, task, w);
      return;
    }
    // The worker is away: wait for it for one resume window.
    if (task->pin_deadline_ns == 0) {
      task->pin_deadline_ns = now + ep->timeouts.resume_window_ns;
    } else if (now >= task->pin_deadline_ns) {
      task_finish(ep, task,
                  pcp_make_status(PCP_STATUS_UNAVAILABLE,
                                  "task %llu: worker '%s' not connected "
                                  "within %lld ms",
                                  (unsigned long long)task->id, pin,
                                  (long long)(ep->timeouts.resume_window_ns /
                                              1000000)));
    }
    return;
  }
  pcp_sched_constraint_t constraint = {
      .worker_class = task->worker_class,
      .target = task->target,
      .min_device_memory_bytes = task->min_device_memory_bytes,
      .worker_count = 1,
  };
  uint64_t lease_id = 0;
  pcp_status_t status = pcp_sched_lease_acquire(
      ep->sched, PCP_SCHED_OWNER_JOBS, &constraint, task->id, &lease_id, 1);
  if (status) {
    pcp_status_code_t code = pcp_status_code(status);
    if (code == PCP_STATUS_UNAVAILABLE ||
        code == PCP_STATUS_RESOURCE_EXHAUSTED) {
      pcp_status_ignore(status);  // no eligible worker yet: stay queued
      return;
    }
    task_finish(ep, task, status);
    return;
  }
  pcp_sched_lease_status_t lease;
  status = pcp_sched_lease_query(ep->sched, lease_id, &lease);
  if (status) {
    pcp_status_ignore(pcp_sched_lease_release(ep->sched, lease_id));
    task_finish(ep, task, status);
    return;
  }
  task->lease_id = lease_id;
  fabric_worker_t* w = worker_find(ep, lease.worker_id.value);
  if (!w) {
    task_finish(ep, task,
                pcp_make_status(PCP_STATUS_INTERNAL,
                                "sched leased unknown worker '%s'",
                                lease.worker_id.value));
    return;
  }
  task_dispatch(ep, task, w);
}

static void handle_sched_event(pcp_fabric_endpoint_t* ep,
                               const pcp_sched_event_t* event) {
  if (event->kind == PCP_SCHED_EVENT_NONE ||
      event->kind == PCP_SCHED_EVENT_WORKER_LOST ||
      event->owner != PCP_SCHED_OWNER_JOBS) {
    return;
  }
  // By lease id, not tag: the leases of a gang share one tag.
  pcp_fabric_task_t* task = NULL;
  for (pcp_fabric_task_t* t = ep->tasks_head; t && event->lease_id;
       t = t->next) {
    if (t->lease_id == event->lease_id) {
      task = t;
      break;
    }
  }
  if (!task) {
    if (event->kind != PCP_SCHED_EVENT_LEASE_EXPIRED && event->lease_id) {
      pcp_status_ignore(pcp_sched_lease_release(ep->sched, event->lease_id));
    }
    return;
  }
  switch (event->kind) {
    case PCP_SCHED_EVENT_LEASE_REASSIGNED:
    case PCP_SCHED_EVENT_LEASE_RESUMED: {
      fabric_worker_t* w = worker_find(ep, event->new_worker_id.value);
      if (!w) break;
      if (event->kind == PCP_SCHED_EVENT_LEASE_REASSIGNED) {
        counter_add(ep->m_reassigned, 1);
      }
      PCP_LOG(PCP_LOG_INFO, &ep->log,
              "fabric task %llu %s from worker=%s to worker=%s attempt=%u",
              (unsigned long long)task->id,
              pcp_sched_event_kind_name(event->kind), event->worker_id.value,
              event->new_worker_id.value, task->attempts + 1);
      task_dispatch(ep, task, w);
      break;
    }
    case PCP_SCHED_EVENT_LEASE_DETACHED:
      task->state = TASK_DETACHED;
      task->worker = NULL;
      break;
    case PCP_SCHED_EVENT_LEASE_EXPIRED:
      task->lease_id = 0;
      task_finish(ep, task,
                  pcp_make_status(PCP_STATUS_UNAVAILABLE,
                                  "task %llu: no eligible worker within the "
                                  "rejoin grace (%lld ms)",
                                  (unsigned long long)task->id,
                                  (long long)(ep->timeouts.resume_window_ns /
                                              1000000)));
      break;
    default:
      break;
  }
}

// Places the copies of a gang all at once on distinct workers (sched's
// all-or-nothing acquire), or leaves them all queued.
static void group_place(pcp_fabric_endpoint_t* ep, pcp_fabric_task_t* first) {
  // The whole gang, wherever the pass met it first.
  uint32_t count = 0;
  for (pcp_fabric_task_t* t = ep->tasks_head; t; t = t->next) {
    if (t->group_id == first->group_id && t->group_unplaced) ++count;
  }
  void* p = NULL;
  pcp_status_t status = pcp_allocator_calloc(
      ep->allocator, count * (sizeof(uint64_t) + sizeof(void*)), &p);
  if (status) {
    pcp_status_ignore(status);  // retried on the next pass
    return;
  }
  uint64_t* lease_ids = p;
  pcp_fabric_task_t** members = (pcp_fabric_task_t**)(lease_ids + count);
  uint32_t n = 0;
  for (pcp_fabric_task_t* t = ep->tasks_head; t && n < count; t = t->next) {
    if (t->group_id == first->group_id && t->group_unplaced) members[n++] = t;
  }
  pcp_sched_constraint_t constraint = {
      .worker_class = first->worker_class,
      .target = first->target,
      .min_device_memory_bytes = first->min_device_memory_bytes,
      .worker_count = count,
  };
  status = pcp_sched_lease_acquire(ep->sched, PCP_SCHED_OWNER_JOBS,
                                   &constraint, first->group_id, lease_ids,
                                   count);
  pcp_status_code_t code = pcp_status_code(status);
  if (code == PCP_STATUS_UNAVAILABLE || code == PCP_STATUS_RESOURCE_EXHAUSTED) {
    pcp_status_ignore(status);  // not enough free workers yet
  } else if (status) {
    for (uint32_t i = 0; i < n; ++i) {
      members[i]->group_unplaced = false;
      task_finish(ep, members[i], pcp_status_clone(status));
    }
    pcp_status_ignore(status);
  } else {
    for (uint32_t i = 0; i < n; ++i) {
      members[i]->group_unplaced = false;
      members[i]->lease_id = lease_ids[i];
    }
    for (uint32_t i = 0; i < n; ++i) {
      pcp_fabric_task_t* task = members[i];
      if (task->state != TASK_PENDING) continue;  // finished meanwhile
      pcp_sched_lease_status_t lease;
      fabric_worker_t* w = NULL;
      pcp_status_t query = pcp_sched_lease_query(ep->sched, task->lease_id,
                                                 &lease);
      if (!query) w = worker_find(ep, lease.worker_id.value);
      pcp_status_ignore(query);
      if (!w) {
        task_finish(ep, task, pcp_make_status(PCP_STATUS_INTERNAL,
                                              "gang lease without worker"));
        continue;
      }
      task_dispatch(ep, task, w);
    }
  }
  pcp_allocator_free(ep->allocator, p);
}

static void schedule_pass(pcp_fabric_endpoint_t* ep) {
  // Placement can finish any task (a failed program offer ends every task
  // waiting for it), so hold a reference on the successor while working.
  pcp_fabric_task_t* task = ep->tasks_head;
  if (task) pcp_fabric_task_retain(task);
  uint64_t group_tried = 0;  // a gang is tried once per pass, as a whole
  while (task) {
    pcp_fabric_task_t* next = task->next;
    if (next) pcp_fabric_task_retain(next);
    if (task->state == TASK_DONE) {
      // Finished by an earlier step of this pass.
    } else if (task->cancel_requested) {
      if (task->state == TASK_RUNNING) {
        fabric_conn_t* conn = task->worker ? task->worker->conn : NULL;
        if (!task->cancel_sent && conn) {
          task->cancel_sent = true;
          pcp_status_t status = pcp_proto_gateway_conn_cancel_task(
              conn->proto, task->id, "cancelled by the gateway", now_ns(ep));
          pcp_status_ignore(status);
          process_actions(conn);
          task->cancel_sent_ns = now_ns(ep);
          task->cancel_conn_id = conn->id;
          task->cancel_write_mark = conn->frames_queued;
        } else if (task->cancel_sent && conn &&
                   conn->id == task->cancel_conn_id &&
                   conn->frames_released >= task->cancel_write_mark &&
                   now_ns(ep) - task->cancel_sent_ns >=
                       ep->timeouts.resume_window_ns) {
          // The worker is connected but has not answered the cancel for a
          // resume window (a wedged compute thread): the caller must not
          // wait forever. Its inputs are no longer being written, so the
          // borrowed buffers can go; a late answer is dropped (the task is
          // gone), and it frees the connection's in-flight slot then.
          task_finish(ep, task,
                      pcp_make_status(
                          PCP_STATUS_DEADLINE_EXCEEDED,
                          "task %llu: worker '%s' did not answer the cancel "
                          "within %lld ms",
                          (unsigned long long)task->id,
                          task->worker->info.worker_id,
                          (long long)(ep->timeouts.resume_window_ns /
                                      1000000)));
        }
      } else {
        task_finish(ep, task,
                    pcp_make_status(PCP_STATUS_CANCELLED,
                                    "task %llu cancelled",
                                    (unsigned long long)task->id));
      }
    } else if (task->state == TASK_PENDING) {
      if (task->group_unplaced) {
        if (task->group_id != group_tried) {
          group_tried = task->group_id;
          group_place(ep, task);
        }
      } else {
        task_place(ep, task);
      }
    }
    pcp_fabric_task_release(task);
    if (next && next->state == TASK_DONE) {
      // The list changed under us; start over on the next pass.
      pcp_fabric_task_release(next);
      ep->schedule_wanted = true;
      return;
    }
    task = next;
  }
}

//===----------------------------------------------------------------------===//
// Worker joins and losses
//===----------------------------------------------------------------------===//

static void reject(fabric_conn_t* conn, pcp_proto_reject_reason_t reason,
                   const char* message) {
  pcp_status_t status = pcp_proto_gateway_conn_reject(conn->proto, reason,
                                                      message,
                                                      now_ns(conn->endpoint));
  pcp_status_ignore(status);
}

static void conn_ended(fabric_conn_t* conn);
static uint32_t gauge_key_of(pcp_fabric_endpoint_t* ep,
                             const fabric_worker_t* w);

static void on_join_verified(fabric_conn_t* conn) {
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  const pcp_proto_join_t* join = pcp_proto_gateway_conn_join(conn->proto);
  int64_t now = now_ns(ep);
  pcp_sched_backend_t backend;
  if (!pcp_sched_backend_parse(pcp_make_cstring_view(join->backend),
                               &backend)) {
    reject(conn, PCP_PROTO_REJECT_BAD_JOIN, "unknown backend");
    return;
  }
  if (strlen(join->worker_id) > PCP_SCHED_WORKER_ID_MAX_LENGTH ||
      strlen(join->target) > PCP_SCHED_TARGET_MAX_LENGTH ||
      strlen(join->node_manager_id) > PCP_SCHED_WORKER_ID_MAX_LENGTH ||
      join->device_id < 0) {
    reject(conn, PCP_PROTO_REJECT_BAD_JOIN,
           "worker id, target, node manager id or device id out of range");
    return;
  }
  fabric_worker_t* w = worker_find(ep, join->worker_id);
  if (w && w->conn) {
    fabric_conn_t* old = w->conn;
    if (now < pcp_proto_gateway_conn_deadline_ns(old->proto)) {
      reject(conn, PCP_PROTO_REJECT_DUPLICATE_WORKER,
             "another live connection holds this worker id");
      return;
    }
    // The old connection is past its silence deadline: the worker lost it
    // without us noticing. Evict it first (protocol s.5).
    pcp_status_ignore(pcp_proto_gateway_conn_fail(
        old->proto,
        pcp_make_status(PCP_STATUS_DEADLINE_EXCEEDED,
                        "replaced by a new connection of the same worker"),
        now));
    process_actions(old);
  }
  if (!w) {
    if (ep->worker_count >= ep->options.max_workers &&
        !worker_recycle_one(ep, now)) {
      reject(conn, PCP_PROTO_REJECT_CAPACITY, "worker registry full");
      return;
    }
    if (ep->worker_count == ep->worker_capacity) {
      uint32_t capacity = ep->worker_capacity ? ep->worker_capacity * 2 : 16;
      void* p = ep->workers;
      pcp_status_t status = pcp_allocator_realloc(
          ep->allocator, capacity * sizeof(fabric_worker_t*), &p);
      if (status) {
        pcp_status_ignore(status);
        reject(conn, PCP_PROTO_REJECT_CAPACITY, "out of memory");
        return;
      }
      ep->workers = p;
      ep->worker_capacity = capacity;
    }
    void* p = NULL;
    pcp_status_t status =
        pcp_allocator_calloc(ep->allocator, sizeof(fabric_worker_t), &p);
    if (status) {
      pcp_status_ignore(status);
      reject(conn, PCP_PROTO_REJECT_CAPACITY, "out of memory");
      return;
    }
    w = p;
    copy_text(w->info.worker_id, sizeof(w->info.worker_id), join->worker_id);
    w->info.state = PCP_FABRIC_WORKER_LOST;
    ep->workers[ep->worker_count++] = w;
  }
  bool resumed = w->info.lease_epoch != 0 &&
                 now - w->lost_at_ns <= ep->timeouts.resume_window_ns &&
                 pcp_proto_join_resume_matches(join, w->info.lease_epoch,
                                               w->resume_token);
  pcp_sched_worker_info_t info = {
      .id = join->worker_id,
      .backend = backend,
      .target = join->target,
      .device_id = join->device_id,
      .device_memory_bytes = join->device_memory_bytes,
      .node_manager_id = join->node_manager_id,
  };
  pcp_status_t status = pcp_sched_worker_join(ep->sched, &info, now);
  if (status) {
    char message[256];
    pcp_status_format(status, message, sizeof(message));
    reject(conn,
           pcp_status_code(status) == PCP_STATUS_RESOURCE_EXHAUSTED
               ? PCP_PROTO_REJECT_CAPACITY
               : PCP_PROTO_REJECT_BAD_JOIN,
           message);
    pcp_status_ignore(status);
    return;
  }
  uint8_t token[PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH];
  if (!resumed) {
    status = pcp_proto_random_bytes(token, sizeof(token));
    if (status) {
      pcp_status_ignore(status);
      pcp_status_ignore(pcp_sched_worker_remove(ep->sched, join->worker_id,
                                                now, NULL));
      reject(conn, PCP_PROTO_REJECT_CAPACITY, "no randomness for the token");
      return;
    }
  }
  pcp_fabric_worker_info_t* wi = &w->info;
  copy_text(wi->backend, sizeof(wi->backend), join->backend);
  copy_text(wi->target, sizeof(wi->target), join->target);
  wi->device_id = join->device_id;
  wi->device_memory_bytes = join->device_memory_bytes;
  wi->driver_count = join->driver_count;
  for (uint32_t i = 0; i < join->driver_count; ++i) {
    copy_text(wi->drivers[i], sizeof(wi->drivers[i]), join->drivers[i]);
  }
  copy_text(wi->runtime_version, sizeof(wi->runtime_version),
            join->runtime_version);
  copy_text(wi->compiler_version, sizeof(wi->compiler_version),
            join->compiler_version);
  copy_text(wi->node_manager_id, sizeof(wi->node_manager_id),
            join->node_manager_id);
  wi->supervisor_id = join->supervisor_id;
  copy_text(wi->worker_class, sizeof(wi->worker_class), join->worker_class);
  w->gauge_key = gauge_key_of(ep, w);
  if (!resumed) {
    wi->lease_epoch++;
    memcpy(w->resume_token, token, sizeof(token));
    // A different process may have a different disk cache: ask again.
    w->acked.count = 0;
  }
  w->offered.count = 0;
  pcp_proto_gateway_accept_params_t params = {
      .lease_epoch = wi->lease_epoch,
      .resumed = resumed,
  };
  memcpy(params.resume_token, w->resume_token, sizeof(params.resume_token));
  status = pcp_proto_gateway_conn_accept(conn->proto, &params, now);
  if (status) {
    log_status(ep, PCP_LOG_ERROR, status, "fabric: accept");
    pcp_status_ignore(status);
    pcp_sched_event_t ev = {0};
    pcp_status_ignore(
        pcp_sched_worker_mark_lost(ep->sched, join->worker_id, now, &ev));
    return;
  }
  w->conn = conn;
  conn->worker = w;
  wi->state = PCP_FABRIC_WORKER_CONNECTED;
  wi->join_count++;
  if (resumed) wi->resumed_count++;
  PCP_LOG(PCP_LOG_INFO, &ep->log,
          "fabric worker joined worker=%s backend=%s target=%s device=%d "
          "peer=%s epoch=%llu resumed=%d",
          wi->worker_id, wi->backend, wi->target, (int)wi->device_id,
          conn->peer, (unsigned long long)wi->lease_epoch, (int)resumed);
  pcp_sched_event_t event = {0};
  status = pcp_sched_worker_ready(ep->sched, wi->worker_id, now, &event);
  if (status) {
    log_status(ep, PCP_LOG_ERROR, status, "fabric: sched ready");
    pcp_status_ignore(status);
  } else {
    handle_sched_event(ep, &event);
  }
  ep->schedule_wanted = true;
}

// The connection's state machine is CLOSED: the worker (if it was accepted on
// this connection) is lost; its tasks move per the sched rules.
static void conn_ended(fabric_conn_t* conn) {
  if (conn->ended) return;
  conn->ended = true;
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  fabric_worker_t* w = conn->worker;
  if (!w || w->conn != conn) return;
  int64_t now = now_ns(ep);
  w->info.bytes_in += atomic_load(&conn->bytes_in);
  w->info.bytes_out += atomic_load(&conn->bytes_out);
  w->conn = NULL;
  w->info.state = PCP_FABRIC_WORKER_LOST;
  w->lost_at_ns = now;
  w->offered.count = 0;
  for (pcp_fabric_task_t* t = ep->tasks_head; t; t = t->next) {
    if (t->worker != w || t->state == TASK_PENDING) continue;
    if (t->lease_id) {
      t->state = TASK_DETACHED;  // sched's event below decides
    } else {
      t->state = TASK_PENDING;  // pinned: wait for this worker
      t->pin_deadline_ns = 0;
    }
  }
  pcp_sched_event_t event = {0};
  pcp_status_t status =
      pcp_sched_worker_mark_lost(ep->sched, w->info.worker_id, now, &event);
  if (status) {
    pcp_status_ignore(status);
  } else {
    handle_sched_event(ep, &event);
  }
  PCP_LOG(PCP_LOG_INFO, &ep->log, "fabric worker lost worker=%s peer=%s",
          w->info.worker_id, conn->peer);
  ep->schedule_wanted = true;
}

//===----------------------------------------------------------------------===//
// Actions
//===----------------------------------------------------------------------===//

static bool is_peer_fault(pcp_status_code_t code) {
  switch (code) {
    case PCP_STATUS_INVALID_ARGUMENT:
    case PCP_STATUS_DATA_LOSS:
    case PCP_STATUS_RESOURCE_EXHAUSTED:
    case PCP_STATUS_FAILED_PRECONDITION:
    case PCP_STATUS_UNAUTHENTICATED:
    case PCP_STATUS_INCOMPATIBLE:
    case PCP_STATUS_OUT_OF_RANGE:
      return true;
    default:
      return false;
  }
}

static void on_task_result(fabric_conn_t* conn, pcp_proto_action_t* action) {
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  pcp_fabric_task_t* task = task_find(ep, action->task_id);
  if (!task || task->state != TASK_RUNNING || task->worker != conn->worker) {
    return;  // reassigned meanwhile: never double-complete
  }
  worker_task_answered(conn->worker, task, false);
  pcp_proto_task_result_t result;
  pcp_status_t status = pcp_proto_task_result_parse(&action->received, &result);
  if (status) {
    task_finish(ep, task, status);
    return;
  }
  void* p = NULL;
  if (result.output_count) {
    status = pcp_allocator_calloc(
        ep->allocator, result.output_count * sizeof(pcp_proto_section_t), &p);
    if (status) {
      task_finish(ep, task, status);
      return;
    }
  }
  pcp_proto_section_t* outputs = p;
  for (uint32_t i = 0; i < result.output_count; ++i) {
    const pcp_proto_tensor_ref_t* ref = &result.outputs[i];
    if (ref->kind == PCP_PROTO_TENSOR_REF_SECTION) {
      outputs[i] = action->received.sections[ref->section];
    } else if (ref->kind == PCP_PROTO_TENSOR_REF_BLOB) {
      // proto checked that the blob exists and matches dtype and shape.
      const pcp_proto_tensor_blob_t* blob =
          pcp_proto_action_tensor_blob(action, ref->name);
      outputs[i].name = ref->name;
      outputs[i].element_type = ref->element_type;
      outputs[i].rank = ref->rank;
      memcpy(outputs[i].shape, ref->shape, sizeof(outputs[i].shape));
      outputs[i].data = blob ? blob->data : NULL;
      outputs[i].byte_length = blob ? blob->byte_length : 0;
    } else {
      outputs[i].name = ref->name;
      outputs[i].element_type = ref->element_type;
      outputs[i].rank = ref->rank;
      memcpy(outputs[i].shape, ref->shape, sizeof(outputs[i].shape));
    }
  }
  task->outputs = outputs;
  task->output_count = result.output_count;
  task->elapsed_us = result.elapsed_us;
  // The sections point into the frame's payload and JSON, and the blobs'
  // bytes into their own buffers: both move to the task without a copy.
  pcp_proto_frame_move(&action->received, &task->result_frame);
  task->blobs = action->tensor_blobs;
  task->blob_count = action->tensor_blob_count;
  action->tensor_blobs = NULL;
  action->tensor_blob_count = 0;
  task_finish(ep, task, pcp_ok_status());
}

static void on_program_answer(fabric_conn_t* conn, const uint8_t* program,
                              pcp_status_t failure) {
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  fabric_worker_t* w = conn->worker;
  if (!w) {
    pcp_status_ignore(failure);
    return;
  }
  hash_set_remove(&w->offered, program);
  if (!failure) {
    pcp_status_t status = hash_set_add(ep->allocator, &w->acked, program);
    if (status) failure = status;
  }
  // Each step moves one waiting task out of TASK_AWAIT_PROGRAM (assigned,
  // back to pending at the in-flight limit, or finished), and the walk
  // starts over from the head, so it never follows a |next| pointer that
  // the step may have unlinked.
  bool connected = worker_connected(w);
  for (;;) {
    pcp_fabric_task_t* t = ep->tasks_head;
    while (t && !(t->worker == w && t->state == TASK_AWAIT_PROGRAM &&
                  memcmp(t->program, program, PCP_SHA256_BYTE_LENGTH) == 0)) {
      t = t->next;
    }
    if (!t) break;
    if (failure) {
      task_finish(ep, t, pcp_status_clone(failure));
    } else if (connected) {
      task_assign(ep, t);
    } else {
      break;  // conn_ended puts them back to pending
    }
  }
  pcp_status_ignore(failure);
}

static void handle_action(fabric_conn_t* conn, pcp_proto_action_t* a) {
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  switch (a->type) {
    case PCP_PROTO_ACTION_SEND:
      conn_send(conn, &a->frame);
      break;
    case PCP_PROTO_ACTION_CLOSE: {
      pcp_status_code_t code = pcp_status_code(a->status);
      const char* worker = conn->worker ? conn->worker->info.worker_id : "-";
      char reason[512];
      pcp_status_format(a->status, reason, sizeof(reason));
      bool rejected = code == PCP_STATUS_UNAUTHENTICATED ||
                      code == PCP_STATUS_PERMISSION_DENIED ||
                      (!conn->worker &&
                       code == PCP_STATUS_INVALID_ARGUMENT);
      if (rejected) {
        atomic_fetch_add(&ep->rejected_joins, 1);
        counter_add(ep->m_rejected, 1);
      }
      if (is_peer_fault(code)) atomic_fetch_add(&ep->protocol_errors, 1);
      PCP_LOG(code == PCP_STATUS_OK || code == PCP_STATUS_CANCELLED
                  ? PCP_LOG_INFO
                  : PCP_LOG_WARN,
              &ep->log,
              "fabric connection closed conn=%llu peer=%s worker=%s "
              "code=%s reason=%s",
              (unsigned long long)conn->id, conn->peer, worker,
              pcp_status_code_string(code), reason);
      conn->close_requested = true;
      conn->close_requested_ns = now_ns(ep);
      try_finish_close(conn);
      break;
    }
    case PCP_PROTO_ACTION_JOIN_VERIFIED:
      on_join_verified(conn);
      break;
    case PCP_PROTO_ACTION_EVICT:
      atomic_fetch_add(&ep->evictions, 1);
      counter_add(ep->m_evictions, 1);
      if (conn->worker) conn->worker->info.eviction_count++;
      PCP_LOG(PCP_LOG_WARN, &ep->log,
              "fabric worker evicted worker=%s peer=%s silence_limit_ms=%lld",
              conn->worker ? conn->worker->info.worker_id : "-", conn->peer,
              (long long)(ep->timeouts.silence_timeout_ns / 1000000));
      break;
    case PCP_PROTO_ACTION_PROGRAM_FETCH: {
      program_t* p = program_find(ep, a->program);
      pcp_status_t status =
          p ? pcp_proto_gateway_conn_send_program(conn->proto, a->request_id,
                                                  p->data, p->byte_length,
                                                  now_ns(ep))
            : pcp_make_status(PCP_STATUS_NOT_FOUND, "program not registered");
      if (status) {
        pcp_status_ignore(pcp_proto_gateway_conn_fail(conn->proto, status,
                                                      now_ns(ep)));
        pcp_status_ignore(status);
      }
      break;
    }
    case PCP_PROTO_ACTION_PROGRAM_READY:
      on_program_answer(conn, a->program, pcp_ok_status());
      break;
    case PCP_PROTO_ACTION_PROGRAM_FAILED:
      on_program_answer(conn, a->program, a->status);
      a->status = pcp_ok_status();
      break;
    case PCP_PROTO_ACTION_TASK_PROGRESS: {
      pcp_fabric_task_t* task = task_find(ep, a->task_id);
      pcp_proto_task_progress_t progress;
      pcp_status_t status =
          pcp_proto_task_progress_parse(&a->received, &progress);
      if (status) {
        pcp_status_ignore(status);
        break;
      }
      if (task && task->state == TASK_RUNNING && task->worker == conn->worker) {
        task->progress_state = progress.state;
        if (progress.has_fraction) task->progress_fraction = progress.fraction;
        notify(ep, task, PCP_FABRIC_TASK_EVENT_PROGRESS);
      }
      break;
    }
    case PCP_PROTO_ACTION_TASK_RESULT:
      on_task_result(conn, a);
      break;
    case PCP_PROTO_ACTION_TASK_FAILED: {
      pcp_fabric_task_t* task = task_find(ep, a->task_id);
      if (task && task->state == TASK_RUNNING &&
          task->worker == conn->worker) {
        worker_task_answered(conn->worker, task, true);
        task_finish(ep, task, a->status);
        a->status = pcp_ok_status();
      }
      break;
    }
    case PCP_PROTO_ACTION_TASK_LOST:
      break;  // conn_ended moves every task of the worker
    case PCP_PROTO_ACTION_PEER_DRAINING:
      if (conn->worker) {
        conn->worker->info.state = PCP_FABRIC_WORKER_DRAINING;
        pcp_status_ignore(
            pcp_sched_worker_drain(ep->sched, conn->worker->info.worker_id));
      }
      break;
    default:
      break;
  }
}

// Executes the connection's queued actions in order. Commands issued while
// handling one (an assignment, say) queue more and call this again; such a
// nested call returns at once and the running loop takes them next, in the
// same order. Were the nested call to run the queue itself, an action that
// arrived in the same read (another task's result) would be handled in the
// middle of the handler that issued the command, and a handler walking the
// task list would see tasks finish and leave the list under it (the CI hang:
// on_program_answer lost its place and never assigned the tasks behind).
static void process_actions(fabric_conn_t* conn) {
  if (conn->in_actions) return;
  conn->in_actions = true;
  pcp_proto_action_t action;
  while (pcp_proto_gateway_conn_next_action(conn->proto, &action)) {
    handle_action(conn, &action);
    pcp_proto_action_deinitialize(&action);
  }
  conn->in_actions = false;
  if (pcp_proto_gateway_conn_state(conn->proto) ==
      PCP_PROTO_GATEWAY_CLOSED) {
    conn_ended(conn);
  }
}

// A command or event failed on our side (out of memory): end the connection.
static void conn_local_failure(fabric_conn_t* conn, pcp_status_t status,
                               const char* what) {
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  log_status(ep, PCP_LOG_ERROR, status, what);
  pcp_status_ignore(status);
  if (conn->tcp && !conn->tcp_close_called) {
    conn->tcp_close_called = true;
    pcp_tcp_conn_close(conn->tcp);
  }
}

//===----------------------------------------------------------------------===//
// Loop-thread events
//===----------------------------------------------------------------------===//

// Counts inbound frames by type from their headers and returns the largest
// payload length announced by a header completed in |data|.
static uint64_t scan_frames(fabric_conn_t* conn, const uint8_t* data,
                            size_t length) {
  uint64_t largest = 0;
  while (length > 0) {
    if (conn->scan_skip > 0) {
      size_t n = conn->scan_skip < length ? (size_t)conn->scan_skip : length;
      conn->scan_skip -= n;
      data += n;
      length -= n;
      continue;
    }
    size_t need = PCP_PROTO_HEADER_BYTE_LENGTH - conn->scan_filled;
    size_t n = need < length ? need : length;
    memcpy(conn->scan_header + conn->scan_filled, data, n);
    conn->scan_filled += n;
    data += n;
    length -= n;
    if (conn->scan_filled == PCP_PROTO_HEADER_BYTE_LENGTH) {
      const uint8_t* h = conn->scan_header;
      uint16_t type = (uint16_t)(h[6] | (h[7] << 8));
      uint64_t payload = 0;
      for (int i = 7; i >= 0; --i) payload = (payload << 8) | h[24 + i];
      count_frame(conn->endpoint, 0, type);
      conn->scan_skip = payload;
      conn->scan_filled = 0;
      // Only a real header counts (garbage is proto's to refuse, with its
      // own error: bad magic, bad checksum).
      uint32_t magic = (uint32_t)h[0] | (uint32_t)h[1] << 8 |
                       (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
      if (magic == PCP_PROTO_MAGIC && payload > largest) largest = payload;
    }
  }
  return largest;
}

static void on_read(void* user_data, pcp_tcp_conn_t* tcp, const void* data,
                    size_t byte_length) {
  fabric_conn_t* conn = user_data;
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  int64_t start = now_ns(ep);
  pthread_mutex_lock(&ep->mu);
  if (byte_length == 0) {
    pcp_status_t status = pcp_proto_gateway_conn_on_closed(conn->proto, start);
    pcp_status_ignore(status);
    process_actions(conn);
    if (!conn->tcp_close_called) {
      conn->tcp_close_called = true;
      pcp_tcp_conn_close(tcp);
    }
  } else {
    atomic_fetch_add_explicit(&ep->bytes_in, byte_length,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&conn->bytes_in, byte_length,
                              memory_order_relaxed);
    counter_add(ep->m_bytes_in, (double)byte_length);
    pcp_proto_gateway_state_t state =
        pcp_proto_gateway_conn_state(conn->proto);
    uint64_t largest = 0;
    if (state != PCP_PROTO_GATEWAY_CLOSED) {
      largest = scan_frames(conn, data, byte_length);
    }
    pcp_status_t status = pcp_ok_status();
    if (state < PCP_PROTO_GATEWAY_ACCEPTED &&
        largest > PCP_FABRIC_HANDSHAKE_MAX_PAYLOAD_BYTES) {
      // Before ACCEPT a peer is nobody: it must not make the decoder
      // allocate a payload of the full frame limit (80 MiB by default) per
      // connection. Handshake frames are a few hundred bytes. The answer
      // is the handshake's error frame, REJECT reason 5 (protocol.md s.3),
      // not ERROR: a peer that has not joined only understands REJECT.
      char message[128];
      snprintf(message, sizeof(message),
               "a %llu-byte frame before the handshake finished (limit %u)",
               (unsigned long long)largest,
               PCP_FABRIC_HANDSHAKE_MAX_PAYLOAD_BYTES);
      status = pcp_proto_gateway_conn_reject(
          conn->proto, PCP_PROTO_REJECT_PROTOCOL_VIOLATION, message, start);
      // A REJECT closes as PERMISSION_DENIED, which is not counted as a
      // peer fault; this one is the peer's protocol error.
      atomic_fetch_add(&ep->protocol_errors, 1);
    } else {
      status = pcp_proto_gateway_conn_on_bytes(conn->proto, data, byte_length,
                                               start);
    }
    process_actions(conn);
    if (status) conn_local_failure(conn, status, "fabric: on_bytes");
  }
  unlock_and_notify(ep);
  atomic_fetch_add_explicit(&ep->events_handled, 1, memory_order_relaxed);
  hist_record(ep, now_ns(ep) - start);
}

static void on_writable(void* user_data, pcp_tcp_conn_t* tcp) {
  (void)tcp;
  fabric_conn_t* conn = user_data;
  flush_writes(conn);
  try_finish_close(conn);
}

static void conn_free(fabric_conn_t* conn) {
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  while (conn->queue_head) {
    write_rec_t* r = conn->queue_head;
    conn->queue_head = r->next;
    r->all_submitted = true;
    if (r->pending == 0) write_rec_free(r);
  }
  pcp_proto_gateway_conn_release(conn->proto);
  if (conn->prev) {
    conn->prev->next = conn->next;
  } else {
    ep->conns = conn->next;
  }
  if (conn->next) conn->next->prev = conn->prev;
  ep->conn_count--;
  if (ep->m_connections) pcp_obs_gauge_set(ep->m_connections, ep->conn_count);
  pcp_allocator_free(ep->allocator, conn);
}

static void on_close(void* user_data, pcp_tcp_conn_t* tcp,
                     pcp_status_t status) {
  (void)tcp;
  fabric_conn_t* conn = user_data;
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  pthread_mutex_lock(&ep->mu);
  conn->tcp = NULL;
  if (pcp_proto_gateway_conn_state(conn->proto) !=
      PCP_PROTO_GATEWAY_CLOSED) {
    pcp_status_ignore(pcp_proto_gateway_conn_on_closed(conn->proto,
                                                       now_ns(ep)));
  }
  process_actions(conn);
  conn_ended(conn);
  pcp_status_ignore(status);
  conn_free(conn);
  unlock_and_notify(ep);
}

static void on_accept(void* user_data, pcp_tcp_listener_t* listener,
                      pcp_tcp_conn_t* tcp) {
  (void)listener;
  pcp_fabric_endpoint_t* ep = user_data;
  pthread_mutex_lock(&ep->mu);
  if (ep->stopping || ep->conn_count >= ep->options.max_connections) {
    PCP_LOG(PCP_LOG_WARN, &ep->log,
            "fabric connection refused peer=%s reason=%s",
            pcp_tcp_conn_peer_address(tcp),
            ep->stopping ? "stopping" : "connection limit");
    pcp_tcp_conn_close(tcp);
    pthread_mutex_unlock(&ep->mu);
    return;
  }
  void* p = NULL;
  pcp_status_t status =
      pcp_allocator_calloc(ep->allocator, sizeof(fabric_conn_t), &p);
  fabric_conn_t* conn = p;
  pcp_proto_gateway_config_t config = {
      .limits = ep->options.limits,
      .heartbeat_interval_ms = ep->options.heartbeat_interval_ms,
      .join_token = ep->token,
      .join_token_length = ep->token_length,
      .software = ep->software,
  };
  if (!status) status = pcp_proto_random_bytes(config.nonce,
                                               sizeof(config.nonce));
  if (!status) {
    status = pcp_proto_gateway_conn_create(&config, now_ns(ep), ep->allocator,
                                           &conn->proto);
  }
  if (!status) {
    conn->endpoint = ep;
    conn->tcp = tcp;
    conn->id = ++ep->next_conn_id;
    copy_text(conn->peer, sizeof(conn->peer), pcp_tcp_conn_peer_address(tcp));
    pcp_tcp_conn_handlers_t handlers = {
        .read = on_read,
        .writable = on_writable,
        .close = on_close,
        .user_data = conn,
    };
    status = pcp_tcp_conn_start(tcp, &handlers);
  }
  if (status) {
    log_status(ep, PCP_LOG_WARN, status, "fabric: accept");
    pcp_status_ignore(status);
    if (conn) {
      pcp_proto_gateway_conn_release(conn->proto);
      pcp_allocator_free(ep->allocator, conn);
    }
    pcp_tcp_conn_close(tcp);
    pthread_mutex_unlock(&ep->mu);
    return;
  }
  conn->next = ep->conns;
  if (ep->conns) ep->conns->prev = conn;
  ep->conns = conn;
  ep->conn_count++;
  if (ep->m_connections) pcp_obs_gauge_set(ep->m_connections, ep->conn_count);
  pthread_mutex_unlock(&ep->mu);
}

// The (backend, target) slot of the workers gauge for |w|, added on first
// sight; UINT32_MAX past the 64 kept (those workers are not in the gauge).
static uint32_t gauge_key_of(pcp_fabric_endpoint_t* ep,
                             const fabric_worker_t* w) {
  for (uint32_t k = 0; k < ep->gauge_key_count; ++k) {
    if (strcmp(ep->gauge_keys[k].backend, w->info.backend) == 0 &&
        strcmp(ep->gauge_keys[k].target, w->info.target) == 0) {
      return k;
    }
  }
  if (ep->gauge_key_count == PCP_ARRAYSIZE(ep->gauge_keys)) return UINT32_MAX;
  uint32_t k = ep->gauge_key_count++;
  copy_text(ep->gauge_keys[k].backend, sizeof(ep->gauge_keys[k].backend),
            w->info.backend);
  copy_text(ep->gauge_keys[k].target, sizeof(ep->gauge_keys[k].target),
            w->info.target);
  return k;
}

// One pass over the workers (the slot is cached on the worker at join), so
// a large fleet costs one loop per refresh, not one per label set.
static void refresh_worker_gauges(pcp_fabric_endpoint_t* ep, int64_t now) {
  int64_t oldest = 0;
  uint32_t counts[PCP_ARRAYSIZE(ep->gauge_keys)]
                 [PCP_FABRIC_WORKER_STATE_COUNT_];
  memset(counts, 0, sizeof(counts));
  for (uint32_t i = 0; i < ep->worker_count; ++i) {
    fabric_worker_t* w = ep->workers[i];
    if (w->conn) {
      int64_t last = pcp_proto_gateway_conn_deadline_ns(w->conn->proto) -
                     ep->timeouts.silence_timeout_ns;
      if (now - last > oldest) oldest = now - last;
    }
    if (w->gauge_key < ep->gauge_key_count) {
      counts[w->gauge_key][w->info.state]++;
    }
  }
  if (ep->m_heartbeat_age) {
    pcp_obs_gauge_set(ep->m_heartbeat_age, (double)oldest / 1e9);
  }
  for (uint32_t k = 0; k < ep->gauge_key_count; ++k) {
    for (int st = 0; st < PCP_FABRIC_WORKER_STATE_COUNT_; ++st) {
      // A worker without --target reports ""; the label says "default",
      // as the node manager's and the worker's own metrics do.
      const char* target =
          ep->gauge_keys[k].target[0] ? ep->gauge_keys[k].target : "default";
      const char* labels[] = {
          pcp_fabric_worker_state_name((pcp_fabric_worker_state_t)st),
          ep->gauge_keys[k].backend, target};
      pcp_obs_family_set(ep->families[M_WORKERS], labels, counts[k][st]);
    }
  }
}

static void on_tick(void* user_data, pcp_loop_timer_t* timer,
                    pcp_status_code_t code) {
  (void)timer;
  if (code != PCP_STATUS_OK) return;
  pcp_fabric_endpoint_t* ep = user_data;
  pthread_mutex_lock(&ep->mu);
  int64_t now = now_ns(ep);
  // After a stall of the loop thread (a long task callback, a large tensor
  // hashed by proto on this thread, the process descheduled) every peer's
  // frames wait unread in the kernel, and libuv runs timers before I/O:
  // judging silence now would evict workers that did talk. Skip the
  // connection ticks once so the I/O phase reads first; never twice in a
  // row, so a loop that is merely slow still ticks.
  bool stalled = !ep->tick_skipped &&
                 now - ep->last_tick_ns > 2 * ep->timeouts.tick_interval_ns;
  ep->tick_skipped = stalled;
  ep->last_tick_ns = now;
  fabric_conn_t* conn = stalled ? NULL : ep->conns;
  while (conn) {
    fabric_conn_t* next = conn->next;
    pcp_status_t status = pcp_proto_gateway_conn_on_tick(conn->proto, now);
    process_actions(conn);
    if (status) conn_local_failure(conn, status, "fabric: tick");
    if (conn->close_requested && conn->tcp && !conn->tcp_close_called &&
        now - conn->close_requested_ns >=
            2 * ep->timeouts.heartbeat_interval_ns) {
      conn->tcp_close_called = true;
      pcp_tcp_conn_close(conn->tcp);
    }
    conn = next;
  }
  pcp_sched_event_t events[16];
  for (int round = 0; round < 64; ++round) {
    size_t count = 0;
    pcp_status_t status = pcp_sched_tick(ep->sched, now, events,
                                         PCP_ARRAYSIZE(events), &count);
    if (status) {
      pcp_status_ignore(status);
      break;
    }
    for (size_t i = 0; i < count; ++i) handle_sched_event(ep, &events[i]);
    if (count < PCP_ARRAYSIZE(events)) break;
  }
  // Gauges once per H: they are read by scrapes, not by the loop.
  if (++ep->tick_count % 4 == 0) refresh_worker_gauges(ep, now);
  ep->schedule_wanted = true;
  unlock_and_notify(ep);
}

static void on_kick(void* user_data, pcp_status_code_t code) {
  pcp_fabric_endpoint_t* ep = user_data;
  atomic_store(&ep->kick_pending, false);
  if (code != PCP_STATUS_OK) return;
  pthread_mutex_lock(&ep->mu);
  ep->schedule_wanted = true;
  unlock_and_notify(ep);
}

static void kick(pcp_fabric_endpoint_t* ep) {
  if (atomic_exchange(&ep->kick_pending, true)) return;
  pcp_status_t status = pcp_loop_post(ep->loop, on_kick, ep);
  if (status) {
    // Queue full or shutting down: the next tick (H/4) schedules anyway.
    pcp_status_ignore(status);
    atomic_store(&ep->kick_pending, false);
  }
}

static void on_stop(void* user_data, pcp_status_code_t code) {
  pcp_fabric_endpoint_t* ep = user_data;
  if (code != PCP_STATUS_OK) return;
  pthread_mutex_lock(&ep->mu);
  if (ep->listener) {
    pcp_tcp_listener_close(ep->listener);
    ep->listener = NULL;
  }
  for (fabric_conn_t* c = ep->conns; c; c = c->next) {
    if (c->tcp && !c->tcp_close_called) {
      c->tcp_close_called = true;
      pcp_tcp_conn_close(c->tcp);
    }
  }
  pthread_mutex_unlock(&ep->mu);
  pcp_loop_stop(ep->loop);
}

static void* loop_thread_main(void* arg) {
  pcp_fabric_endpoint_t* ep = arg;
  pcp_status_t status = pcp_loop_run(ep->loop);
  if (status) {
    log_status(ep, PCP_LOG_ERROR, status, "fabric: loop");
    pcp_status_ignore(status);
  }
  return NULL;
}

//===----------------------------------------------------------------------===//
// Config and options
//===----------------------------------------------------------------------===//

static const pcp_config_field_t k_config_fields[] = {
    {.name = "fabric-listen",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(pcp_fabric_config_t, listen),
     .default_value = "127.0.0.1:0",
     .value_name = "HOST:PORT",
     .help = "Worker-fabric listen address (port 0: ephemeral)"},
    {.name = "fabric-heartbeat-interval-ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(pcp_fabric_config_t, heartbeat_interval_ms),
     .default_value = "1000",
     .min = PCP_PROTO_HEARTBEAT_MIN_MS,
     .max = PCP_PROTO_HEARTBEAT_MAX_MS,
     .value_name = "MS",
     .help = "Heartbeat interval H; eviction after 3H of silence"},
    {.name = "fabric-join-token-env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(pcp_fabric_config_t, join_token_env),
     .default_value = "PCP_WORKER_JOIN_TOKEN",
     .flags = PCP_CONFIG_FLAG_ENV_NAME,
     .value_name = "VAR",
     .help = "Environment variable holding the worker join token"},
    {.name = "fabric-max-task-attempts",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(pcp_fabric_config_t, max_task_attempts),
     .default_value = "3",
     .min = 1,
     .max = PCP_FABRIC_MAX_TASK_ATTEMPTS,
     .value_name = "N",
     .help = "Runs of one task before it fails when its workers are lost"},
};

static const pcp_config_table_t k_config_table = {
    .name = "fabric",
    .fields = k_config_fields,
    .field_count = PCP_ARRAYSIZE(k_config_fields),
};

const pcp_config_table_t* pcp_fabric_config_table(void) {
  return &k_config_table;
}

void pcp_fabric_options_initialize(pcp_fabric_options_t* out_options) {
  memset(out_options, 0, sizeof(*out_options));
  copy_text(out_options->listen_address.host,
            sizeof(out_options->listen_address.host), "127.0.0.1");
  out_options->heartbeat_interval_ms = PCP_PROTO_HEARTBEAT_DEFAULT_MS;
  out_options->join_token_env = "PCP_WORKER_JOIN_TOKEN";
  out_options->limits = pcp_proto_limits_default();
  out_options->max_task_attempts = PCP_FABRIC_DEFAULT_MAX_TASK_ATTEMPTS;
  out_options->max_workers = 1024;
  out_options->max_connections = 4096;
}

pcp_status_t pcp_fabric_options_apply_config(const pcp_fabric_config_t* config,
                                             pcp_fabric_options_t* options) {
  if (config->listen) {
    PCP_RETURN_IF_ERROR(
        pcp_net_address_parse(pcp_make_cstring_view(config->listen),
                              &options->listen_address),
        "fabric-listen");
  }
  if (config->heartbeat_interval_ms < PCP_PROTO_HEARTBEAT_MIN_MS ||
      config->heartbeat_interval_ms > PCP_PROTO_HEARTBEAT_MAX_MS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric-heartbeat-interval-ms: %lld not in "
                           "[%u, %u]",
                           (long long)config->heartbeat_interval_ms,
                           PCP_PROTO_HEARTBEAT_MIN_MS,
                           PCP_PROTO_HEARTBEAT_MAX_MS);
  }
  options->heartbeat_interval_ms = (uint32_t)config->heartbeat_interval_ms;
  if (config->join_token_env && config->join_token_env[0]) {
    options->join_token_env = config->join_token_env;
  }
  if (config->max_task_attempts < 1 ||
      config->max_task_attempts > PCP_FABRIC_MAX_TASK_ATTEMPTS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric-max-task-attempts: %lld not in [1, %u]",
                           (long long)config->max_task_attempts,
                           PCP_FABRIC_MAX_TASK_ATTEMPTS);
  }
  options->max_task_attempts = (uint32_t)config->max_task_attempts;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Endpoint lifetime
//===----------------------------------------------------------------------===//

static void endpoint_free(pcp_fabric_endpoint_t* ep) {
  pcp_allocator_t a = ep->allocator;
  for (uint32_t i = 0; i < ep->worker_count; ++i) {
    pcp_allocator_free(a, ep->workers[i]->acked.items);
    pcp_allocator_free(a, ep->workers[i]->offered.items);
    pcp_allocator_free(a, ep->workers[i]);
  }
  pcp_allocator_free(a, ep->workers);
  for (uint32_t i = 0; i < ep->program_count; ++i) {
    pcp_allocator_free(a, ep->programs[i].raw);
  }
  pcp_allocator_free(a, ep->programs);
  for (uint32_t i = 0; i < ep->session_count; ++i) {
    pcp_allocator_free(a, ep->sessions[i].id);
  }
  pcp_allocator_free(a, ep->sessions);
  pcp_sched_release(ep->sched);
  pcp_obs_registry_release(ep->own_metrics);
  if (ep->token) {
    memset(ep->token, 0, ep->token_length);
    pcp_allocator_free(a, ep->token);
  }
  pthread_mutex_destroy(&ep->mu);
  pthread_cond_destroy(&ep->cv);
  pcp_allocator_free(a, ep);
}

pcp_status_t pcp_fabric_endpoint_create(const pcp_fabric_options_t* options,
                                        pcp_allocator_t allocator,
                                        pcp_fabric_endpoint_t** out_endpoint) {
  *out_endpoint = NULL;
  PCP_RETURN_IF_ERROR(pcp_proto_limits_validate(&options->limits),
                      "fabric endpoint limits");
  if (options->max_task_attempts < 1 ||
      options->max_task_attempts > PCP_FABRIC_MAX_TASK_ATTEMPTS ||
      options->max_workers < 1 ||
      options->max_workers > PCP_SCHED_REGISTRY_WORKER_COUNT_MAX ||
      options->max_connections < 1) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric endpoint: max_task_attempts, max_workers "
                           "or max_connections out of range");
  }
  const char* env_name = options->join_token_env;
  const char* token = env_name && env_name[0] ? getenv(env_name) : NULL;
  if (!token || !token[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric endpoint: the join token variable '%s' is "
                           "unset or empty",
                           env_name ? env_name : "");
  }
  void* p = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(pcp_fabric_endpoint_t), &p));
  pcp_fabric_endpoint_t* ep = p;
  ep->allocator = allocator;
  ep->options = *options;
  ep->options.join_token_env = NULL;  // borrowed for the call only
  ep->options.software = NULL;
  copy_text(ep->software, sizeof(ep->software),
            options->software ? options->software : "pcp");
  ep->log = options->log;
  ep->clock = options->clock.now_ns ? options->clock : pcp_clock_system();
  ep->timeouts =
      pcp_proto_timeouts_from_heartbeat(options->heartbeat_interval_ms);
  ep->options.heartbeat_interval_ms =
      (uint32_t)(ep->timeouts.heartbeat_interval_ns / 1000000);
  ep->next_task_id = 1;
  pthread_mutex_init(&ep->mu, NULL);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&ep->cv, &attr);
  pthread_condattr_destroy(&attr);

  pcp_status_t status = pcp_ok_status();
  ep->token_length = strlen(token);
  status = pcp_allocator_malloc(allocator, ep->token_length, &p);
  if (!status) {
    ep->token = p;
    memcpy(ep->token, token, ep->token_length);
  }
  if (!status) {
    pcp_sched_options_t sched_options;
    pcp_sched_options_initialize(&sched_options);
    sched_options.max_workers = options->max_workers;
    sched_options.max_leases = options->max_workers * 2 + 16;
    // The state machines detect silence (3H); sched only hears the verdict.
    sched_options.heartbeat_timeout_ns = 0;
    sched_options.lease_rejoin_grace_ns = ep->timeouts.resume_window_ns;
    status = pcp_sched_create(&sched_options, allocator, &ep->sched);
  }
  if (!status) {
    ep->metrics = options->metrics;
    if (!ep->metrics) {
      status = pcp_obs_registry_create(allocator, &ep->own_metrics);
      ep->metrics = ep->own_metrics;
    }
  }
  if (!status) {
    status = pcp_obs_registry_register(ep->metrics, k_metric_defs, M_COUNT_,
                                       ep->families);
  }
  if (!status) {
    metrics_bind(ep);
    pcp_loop_options_t loop_options = pcp_loop_options_default();
    loop_options.allocator = allocator;
    status = pcp_loop_create(&loop_options, &ep->loop);
  }
  if (!status) {
    status = pcp_tcp_listen(ep->loop, &options->listen_address, 0, on_accept,
                            ep, &ep->listener);
  }
  if (!status) {
    ep->port = pcp_tcp_listener_port(ep->listener);
    uint64_t tick_ms = (uint64_t)(ep->timeouts.tick_interval_ns / 1000000);
    if (tick_ms == 0) tick_ms = 1;
    status = pcp_loop_timer_start(ep->loop, tick_ms, tick_ms, on_tick, ep,
                                  &ep->tick_timer);
  }
  if (!status) {
    ep->last_tick_ns = now_ns(ep);
    int err = pthread_create(&ep->thread, NULL, loop_thread_main, ep);
    if (err) {
      status = pcp_status_from_errno(err, "fabric loop thread");
    } else {
      ep->thread_started = true;
    }
  }
  if (status) {
    if (ep->loop) pcp_loop_release(ep->loop);
    endpoint_free(ep);
    return status;
  }
  PCP_LOG(PCP_LOG_INFO, &ep->log,
          "fabric listening host=%s port=%u heartbeat_ms=%u",
          options->listen_address.host, (unsigned)ep->port,
          ep->options.heartbeat_interval_ms);
  *out_endpoint = ep;
  return pcp_ok_status();
}

void pcp_fabric_endpoint_release(pcp_fabric_endpoint_t* ep) {
  if (!ep) return;
  pthread_mutex_lock(&ep->mu);
  ep->stopping = true;
  pthread_mutex_unlock(&ep->mu);
  pcp_status_t status = pcp_loop_post(ep->loop, on_stop, ep);
  if (status) {
    pcp_status_ignore(status);
    pcp_loop_stop(ep->loop);
  }
  if (ep->thread_started) pthread_join(ep->thread, NULL);
  // Close callbacks of the connections still open run here, on this thread.
  ep->listener = NULL;
  pcp_loop_release(ep->loop);
  ep->loop = NULL;
  pthread_mutex_lock(&ep->mu);
  while (ep->tasks_head) {
    task_finish(ep, ep->tasks_head,
                pcp_make_status(PCP_STATUS_CANCELLED,
                                "fabric endpoint shutting down"));
  }
  ep->schedule_wanted = false;
  unlock_and_notify(ep);
  endpoint_free(ep);
}

uint16_t pcp_fabric_endpoint_port(const pcp_fabric_endpoint_t* ep) {
  return ep->port;
}

pcp_obs_registry_t* pcp_fabric_endpoint_metrics(pcp_fabric_endpoint_t* ep) {
  return ep->metrics;
}

pcp_proto_timeouts_t pcp_fabric_endpoint_timeouts(
    const pcp_fabric_endpoint_t* ep) {
  return ep->timeouts;
}

void pcp_fabric_endpoint_stats_query(pcp_fabric_endpoint_t* ep,
                                     pcp_fabric_endpoint_stats_t* out_stats) {
  memset(out_stats, 0, sizeof(*out_stats));
  pthread_mutex_lock(&ep->mu);
  out_stats->connections = ep->conn_count;
  for (uint32_t i = 0; i < ep->worker_count; ++i) {
    if (ep->workers[i]->conn) out_stats->workers_connected++;
  }
  pthread_mutex_unlock(&ep->mu);
  out_stats->bytes_in = atomic_load(&ep->bytes_in);
  out_stats->bytes_out = atomic_load(&ep->bytes_out);
  out_stats->frames_in = atomic_load(&ep->frames_in);
  out_stats->frames_out = atomic_load(&ep->frames_out);
  out_stats->evictions = atomic_load(&ep->evictions);
  out_stats->rejected_joins = atomic_load(&ep->rejected_joins);
  out_stats->protocol_errors = atomic_load(&ep->protocol_errors);
  out_stats->events_handled = atomic_load(&ep->events_handled);
  out_stats->handling_p50_ns = hist_percentile(ep, 0.50);
  out_stats->handling_p99_ns = hist_percentile(ep, 0.99);
  out_stats->handling_max_ns = atomic_load(&ep->hist_max_ns);
}

void pcp_fabric_endpoint_stats_reset_latency(pcp_fabric_endpoint_t* ep) {
  for (size_t i = 0; i < HIST_BUCKETS; ++i) atomic_store(&ep->hist[i], 0);
  atomic_store(&ep->hist_max_ns, 0);
}

//===----------------------------------------------------------------------===//
// Workers (public)
//===----------------------------------------------------------------------===//

const char* pcp_fabric_worker_state_name(pcp_fabric_worker_state_t state) {
  switch (state) {
    case PCP_FABRIC_WORKER_CONNECTED:
      return "connected";
    case PCP_FABRIC_WORKER_DRAINING:
      return "draining";
    case PCP_FABRIC_WORKER_LOST:
      return "lost";
    default:
      return "unknown";
  }
}

// Fills |out_info| from |w|; the caller holds ep->mu.
static void worker_info_fill(pcp_fabric_endpoint_t* ep, fabric_worker_t* w,
                             pcp_fabric_worker_info_t* out_info) {
  *out_info = w->info;
  out_info->program_count = w->acked.count;
  out_info->lost_at_ns = w->lost_at_ns;
  out_info->heartbeat_age_ns = 0;
  out_info->in_flight = 0;
  out_info->lease_id = 0;
  if (w->conn) {
    int64_t last = pcp_proto_gateway_conn_deadline_ns(w->conn->proto) -
                   ep->timeouts.silence_timeout_ns;
    out_info->heartbeat_age_ns = now_ns(ep) - last;
    out_info->in_flight =
        (uint32_t)pcp_proto_gateway_conn_in_flight_count(w->conn->proto);
    out_info->bytes_in += atomic_load(&w->conn->bytes_in);
    out_info->bytes_out += atomic_load(&w->conn->bytes_out);
  }
  if (out_info->in_flight == 0) {
    // Cancelled, reassigned or lost with the connection: nothing runs.
    out_info->current_task_id = 0;
    out_info->current_function[0] = '\0';
  }
  pcp_sched_worker_status_t status;
  pcp_status_t s = pcp_sched_worker_query(ep->sched, w->info.worker_id, &status);
  if (!s) {
    out_info->sched_state = status.state;
    out_info->lease_id = status.lease_id;
  } else {
    pcp_status_ignore(s);
    out_info->sched_state = PCP_SCHED_WORKER_STATE_LOST;
  }
}

pcp_status_t pcp_fabric_worker_query(pcp_fabric_endpoint_t* ep,
                                     const char* worker_id,
                                     pcp_fabric_worker_info_t* out_info) {
  memset(out_info, 0, sizeof(*out_info));
  pthread_mutex_lock(&ep->mu);
  fabric_worker_t* w = worker_find(ep, worker_id);
  if (!w) {
    pthread_mutex_unlock(&ep->mu);
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "worker '%s'", worker_id);
  }
  worker_info_fill(ep, w, out_info);
  pthread_mutex_unlock(&ep->mu);
  return pcp_ok_status();
}

uint32_t pcp_fabric_worker_list(pcp_fabric_endpoint_t* ep,
                                pcp_fabric_worker_info_t* out_infos,
                                uint32_t capacity, uint32_t* out_total) {
  pthread_mutex_lock(&ep->mu);
  uint32_t total = ep->worker_count;
  uint32_t count = total < capacity ? total : capacity;
  for (uint32_t i = 0; i < count; ++i) {
    worker_info_fill(ep, ep->workers[i], &out_infos[i]);
  }
  pthread_mutex_unlock(&ep->mu);
  if (out_total) *out_total = total;
  // Registry order is not stable (removal swaps in the last slot), so the
  // copy is sorted by id: a paging client sees one order.
  for (uint32_t i = 1; i < count; ++i) {
    pcp_fabric_worker_info_t item = out_infos[i];
    uint32_t j = i;
    while (j > 0 && strcmp(out_infos[j - 1].worker_id, item.worker_id) > 0) {
      out_infos[j] = out_infos[j - 1];
      --j;
    }
    out_infos[j] = item;
  }
  return count;
}

uint32_t pcp_fabric_worker_count(pcp_fabric_endpoint_t* ep,
                                 pcp_fabric_worker_state_t state) {
  pthread_mutex_lock(&ep->mu);
  uint32_t count = 0;
  for (uint32_t i = 0; i < ep->worker_count; ++i) {
    if (state == PCP_FABRIC_WORKER_STATE_COUNT_ ||
        ep->workers[i]->info.state == state) {
      ++count;
    }
  }
  pthread_mutex_unlock(&ep->mu);
  return count;
}

typedef struct drain_request_t {
  pcp_fabric_endpoint_t* endpoint;
  char worker_id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  uint64_t deadline_ms;
} drain_request_t;

static void on_drain(void* user_data, pcp_status_code_t code) {
  drain_request_t* request = user_data;
  pcp_fabric_endpoint_t* ep = request->endpoint;
  if (code == PCP_STATUS_OK) {
    pthread_mutex_lock(&ep->mu);
    fabric_worker_t* w = worker_find(ep, request->worker_id);
    if (w && worker_connected(w)) {
      pcp_status_ignore(pcp_proto_gateway_conn_drain(
          w->conn->proto, request->deadline_ms, now_ns(ep)));
      w->info.state = PCP_FABRIC_WORKER_DRAINING;
      pcp_status_ignore(pcp_sched_worker_drain(ep->sched, w->info.worker_id));
      process_actions(w->conn);
    }
    unlock_and_notify(ep);
  }
  pcp_allocator_free(ep->allocator, request);
}

pcp_status_t pcp_fabric_worker_drain(pcp_fabric_endpoint_t* ep,
                                     const char* worker_id,
                                     uint64_t deadline_ms) {
  pthread_mutex_lock(&ep->mu);
  fabric_worker_t* w = worker_find(ep, worker_id);
  bool connected = w && worker_connected(w);
  pthread_mutex_unlock(&ep->mu);
  if (!w) return pcp_make_status(PCP_STATUS_NOT_FOUND, "worker '%s'", worker_id);
  if (!connected) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "worker '%s' is not connected", worker_id);
  }
  void* p = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(ep->allocator, sizeof(drain_request_t), &p));
  drain_request_t* request = p;
  request->endpoint = ep;
  copy_text(request->worker_id, sizeof(request->worker_id), worker_id);
  request->deadline_ms = deadline_ms;
  pcp_status_t status = pcp_loop_post(ep->loop, on_drain, request);
  if (status) pcp_allocator_free(ep->allocator, request);
  return status;
}

//===----------------------------------------------------------------------===//
// Programs (public)
//===----------------------------------------------------------------------===//

pcp_status_t pcp_fabric_program_register(
    pcp_fabric_endpoint_t* ep, const void* data, size_t byte_length,
    const char* backend, const char* target,
    uint8_t out_program[PCP_SHA256_BYTE_LENGTH]) {
  memset(out_program, 0, PCP_SHA256_BYTE_LENGTH);
  if (!data || byte_length == 0 || !backend || !backend[0] ||
      strlen(backend) >= sizeof(((program_t*)0)->backend) ||
      (target && strlen(target) > PCP_SCHED_TARGET_MAX_LENGTH)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric program: empty bytes, or bad backend or "
                           "target");
  }
  if (byte_length > ep->options.limits.max_blob_bytes) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "fabric program of %zu bytes over the blob limit "
                           "%llu",
                           byte_length,
                           (unsigned long long)ep->options.limits
                               .max_blob_bytes);
  }
  pcp_sha256_t digest;
  pcp_sha256_compute(data, byte_length, &digest);
  memcpy(out_program, digest.bytes, PCP_SHA256_BYTE_LENGTH);
  pthread_mutex_lock(&ep->mu);
  if (program_find(ep, digest.bytes)) {
    pthread_mutex_unlock(&ep->mu);
    return pcp_ok_status();
  }
  pcp_status_t status = pcp_ok_status();
  if (ep->program_count == ep->program_capacity) {
    uint32_t capacity = ep->program_capacity ? ep->program_capacity * 2 : 8;
    void* p = ep->programs;
    status = pcp_allocator_realloc(ep->allocator, capacity * sizeof(program_t),
                                   &p);
    if (!status) {
      ep->programs = p;
      ep->program_capacity = capacity;
    }
  }
  void* raw = NULL;
  if (!status) {
    status = pcp_allocator_malloc(ep->allocator, byte_length + 64, &raw);
  }
  if (status) {
    pthread_mutex_unlock(&ep->mu);
    return status;
  }
  program_t* prog = &ep->programs[ep->program_count++];
  memset(prog, 0, sizeof(*prog));
  memcpy(prog->hash, digest.bytes, sizeof(prog->hash));
  prog->raw = raw;
  prog->data = (uint8_t*)raw + ((64 - ((uintptr_t)raw & 63)) & 63);
  memcpy(prog->data, data, byte_length);
  prog->byte_length = byte_length;
  copy_text(prog->backend, sizeof(prog->backend), backend);
  copy_text(prog->target, sizeof(prog->target), target);
  pthread_mutex_unlock(&ep->mu);
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Tasks (public)
//===----------------------------------------------------------------------===//

static pcp_status_t task_copy_params(pcp_fabric_task_t* task,
                                     const pcp_fabric_task_params_t* params) {
  pcp_allocator_t a = task->allocator;
  memcpy(task->program, params->program, sizeof(task->program));
  PCP_RETURN_IF_ERROR_BARE(dup_string(a, params->function, &task->function));
  void* p = NULL;
  if (params->input_count) {
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
        a, params->input_count * sizeof(pcp_proto_section_t), &p));
    memcpy(p, params->inputs,
           params->input_count * sizeof(pcp_proto_section_t));
    task->inputs = p;
    task->input_count = params->input_count;
  }
  uint32_t ref_count =
      params->input_refs ? params->input_ref_count : params->input_count;
  if (ref_count) {
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
        a, ref_count * sizeof(pcp_proto_tensor_ref_t), &p));
    task->refs = p;
    task->ref_count = ref_count;
    for (uint32_t i = 0; i < ref_count; ++i) {
      if (params->input_refs) {
        task->refs[i] = params->input_refs[i];
        task->refs[i].name = NULL;
        PCP_RETURN_IF_ERROR_BARE(dup_string(a, params->input_refs[i].name,
                                            (char**)&task->refs[i].name));
      } else {
        task->refs[i].kind = PCP_PROTO_TENSOR_REF_SECTION;
        task->refs[i].section = i;
      }
    }
  }
  if (params->keep_resident_count) {
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
        a, params->keep_resident_count * sizeof(pcp_proto_keep_resident_t),
        &p));
    task->keep = p;
    task->keep_count = params->keep_resident_count;
    for (uint32_t i = 0; i < task->keep_count; ++i) {
      task->keep[i].output = params->keep_resident[i].output;
      PCP_RETURN_IF_ERROR_BARE(dup_string(a, params->keep_resident[i].as,
                                          (char**)&task->keep[i].as));
    }
  }
  task->return_resident = params->return_resident;
  task->worker_class = params->worker_class;
  if (params->target && params->target[0]) {
    PCP_RETURN_IF_ERROR_BARE(dup_string(a, params->target, &task->target));
  }
  task->min_device_memory_bytes = params->min_device_memory_bytes;
  if (params->worker_id && params->worker_id[0]) {
    PCP_RETURN_IF_ERROR_BARE(
        dup_string(a, params->worker_id, &task->pin_worker_id));
  }
  if (params->session_id && params->session_id[0]) {
    PCP_RETURN_IF_ERROR_BARE(
        dup_string(a, params->session_id, &task->session_id));
  }
  task->callback = params->callback;
  task->user_data = params->user_data;
  return pcp_ok_status();
}

static pcp_status_t task_params_validate(
    const pcp_fabric_task_params_t* params) {
  if (!params->function || !params->function[0] ||
      strlen(params->function) > PCP_PROTO_MAX_STRING_BYTES ||
      (params->input_count && !params->inputs) ||
      params->input_count > PCP_PROTO_MAX_TASK_TENSORS ||
      params->input_ref_count > PCP_PROTO_MAX_TASK_TENSORS ||
      params->keep_resident_count > PCP_PROTO_MAX_TASK_TENSORS ||
      params->max_attempts > PCP_FABRIC_MAX_TASK_ATTEMPTS ||
      params->worker_class >= PCP_SCHED_WORKER_CLASS_COUNT_ ||
      (params->session_id &&
       strlen(params->session_id) > PCP_PROTO_MAX_STRING_BYTES) ||
      (params->target && strlen(params->target) > PCP_SCHED_TARGET_MAX_LENGTH)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric task: missing function, or a count, "
                           "string or class out of range");
  }
  for (uint32_t i = 0; params->input_refs && i < params->input_ref_count;
       ++i) {
    const pcp_proto_tensor_ref_t* ref = &params->input_refs[i];
    if ((ref->kind == PCP_PROTO_TENSOR_REF_SECTION &&
         ref->section >= params->input_count) ||
        (ref->kind == PCP_PROTO_TENSOR_REF_RESIDENT && !ref->name) ||
        ref->kind == PCP_PROTO_TENSOR_REF_BLOB) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "fabric task: input ref %u is not a valid "
                             "section or resident reference",
                             i);
    }
  }
  return pcp_ok_status();
}

static pcp_status_t task_create(pcp_fabric_endpoint_t* ep,
                                const pcp_fabric_task_params_t* params,
                                pcp_fabric_task_t** out_task) {
  *out_task = NULL;
  void* p = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(ep->allocator, sizeof(pcp_fabric_task_t), &p));
  pcp_fabric_task_t* task = p;
  task->allocator = ep->allocator;
  task->endpoint = ep;
  atomic_init(&task->references, 1);
  pcp_status_t status = task_copy_params(task, params);
  if (status) {
    task_free(task);
    return status;
  }
  task->max_attempts =
      params->max_attempts ? params->max_attempts : ep->options.max_task_attempts;
  task->state = TASK_PENDING;
  *out_task = task;
  return pcp_ok_status();
}

// Checks the endpoint and the program under the lock. Caller holds it.
static pcp_status_t submit_check_locked(pcp_fabric_endpoint_t* ep,
                                        const uint8_t* program) {
  if (ep->stopping) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "fabric endpoint is shutting down");
  }
  if (!program_find(ep, program)) {
    char hex[PCP_SHA256_HEX_LENGTH + 1];
    pcp_proto_hex_encode(program, PCP_SHA256_BYTE_LENGTH, hex);
    return pcp_make_status(PCP_STATUS_NOT_FOUND,
                           "fabric task: program %s is not registered", hex);
  }
  return pcp_ok_status();
}

static void task_link_locked(pcp_fabric_endpoint_t* ep,
                             pcp_fabric_task_t* task) {
  task->id = ep->next_task_id++;
  task->prev = ep->tasks_tail;
  if (ep->tasks_tail) {
    ep->tasks_tail->next = task;
  } else {
    ep->tasks_head = task;
  }
  ep->tasks_tail = task;
}

pcp_status_t pcp_fabric_task_submit(pcp_fabric_endpoint_t* ep,
                                    const pcp_fabric_task_params_t* params,
                                    pcp_fabric_task_t** out_task) {
  if (out_task) *out_task = NULL;
  PCP_RETURN_IF_ERROR_BARE(task_params_validate(params));
  pcp_fabric_task_t* task = NULL;
  PCP_RETURN_IF_ERROR_BARE(task_create(ep, params, &task));
  pthread_mutex_lock(&ep->mu);
  pcp_status_t status = submit_check_locked(ep, params->program);
  if (status) {
    pthread_mutex_unlock(&ep->mu);
    task_free(task);
    return status;
  }
  task_link_locked(ep, task);
  if (out_task) {
    pcp_fabric_task_retain(task);
    *out_task = task;
  }
  pthread_mutex_unlock(&ep->mu);
  kick(ep);
  return pcp_ok_status();
}

pcp_status_t pcp_fabric_task_submit_group(
    pcp_fabric_endpoint_t* ep, const pcp_fabric_task_params_t* params,
    uint32_t worker_count, pcp_fabric_task_t** out_tasks) {
  if (worker_count == 0 || worker_count > PCP_SCHED_REQUEST_WORKER_COUNT_MAX ||
      (params->worker_id && params->worker_id[0]) ||
      (params->session_id && params->session_id[0]) || !out_tasks) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric task group: 1..%u copies, no named worker "
                           "or session, and an output array",
                           PCP_SCHED_REQUEST_WORKER_COUNT_MAX);
  }
  for (uint32_t i = 0; i < worker_count; ++i) out_tasks[i] = NULL;
  PCP_RETURN_IF_ERROR_BARE(task_params_validate(params));
  pcp_status_t status = pcp_ok_status();
  for (uint32_t i = 0; i < worker_count && !status; ++i) {
    status = task_create(ep, params, &out_tasks[i]);
  }
  if (!status) {
    pthread_mutex_lock(&ep->mu);
    status = submit_check_locked(ep, params->program);
    if (!status) {
      uint64_t group_id = ep->next_task_id;
      for (uint32_t i = 0; i < worker_count; ++i) {
        task_link_locked(ep, out_tasks[i]);
        out_tasks[i]->group_id = group_id;
        out_tasks[i]->group_unplaced = true;
        pcp_fabric_task_retain(out_tasks[i]);
      }
    }
    pthread_mutex_unlock(&ep->mu);
  }
  if (status) {
    for (uint32_t i = 0; i < worker_count; ++i) {
      if (out_tasks[i]) task_free(out_tasks[i]);
      out_tasks[i] = NULL;
    }
    return status;
  }
  kick(ep);
  return pcp_ok_status();
}

void pcp_fabric_task_cancel(pcp_fabric_task_t* task) {
  if (atomic_load(&task->done)) return;
  pcp_fabric_endpoint_t* ep = task->endpoint;
  pthread_mutex_lock(&ep->mu);
  bool live = !atomic_load(&task->done);
  if (live) task->cancel_requested = true;
  pthread_mutex_unlock(&ep->mu);
  if (live) kick(ep);
}

bool pcp_fabric_task_wait(pcp_fabric_task_t* task, int64_t timeout_ms) {
  if (atomic_load(&task->done)) return true;
  pcp_fabric_endpoint_t* ep = task->endpoint;
  int64_t deadline =
      timeout_ms < 0 ? 0 : pcp_clock_now_ns(pcp_clock_system()) +
                               timeout_ms * 1000000;
  struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000),
                        .tv_nsec = (long)(deadline % 1000000000)};
  pthread_mutex_lock(&ep->mu);
  while (!atomic_load(&task->done)) {
    if (timeout_ms < 0) {
      pthread_cond_wait(&ep->cv, &ep->mu);
    } else if (pthread_cond_timedwait(&ep->cv, &ep->mu, &ts) != 0) {
      break;
    }
  }
  bool done = atomic_load(&task->done);
  pthread_mutex_unlock(&ep->mu);
  return done;
}

uint64_t pcp_fabric_task_id(const pcp_fabric_task_t* task) { return task->id; }

bool pcp_fabric_task_is_done(pcp_fabric_task_t* task) {
  return atomic_load(&task->done);
}

pcp_status_t pcp_fabric_task_status(pcp_fabric_task_t* task) {
  return atomic_load(&task->done) ? task->status : pcp_ok_status();
}

pcp_status_t pcp_fabric_task_outputs(pcp_fabric_task_t* task,
                                     const pcp_proto_section_t** out_outputs,
                                     size_t* out_count) {
  *out_outputs = NULL;
  *out_count = 0;
  if (!atomic_load(&task->done) || task->status) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "task %llu has no result",
                           (unsigned long long)task->id);
  }
  *out_outputs = task->outputs;
  *out_count = task->output_count;
  return pcp_ok_status();
}

void pcp_fabric_task_info_query(pcp_fabric_task_t* task,
                                pcp_fabric_task_info_t* out_info) {
  memset(out_info, 0, sizeof(*out_info));
  bool done = atomic_load(&task->done);
  pcp_fabric_endpoint_t* ep = task->endpoint;
  if (!done) pthread_mutex_lock(&ep->mu);
  out_info->task_id = task->id;
  out_info->attempts = task->attempts;
  out_info->done = task->state == TASK_DONE;
  out_info->worker_id = task->last_worker_id;
  out_info->progress_state = task->progress_state;
  out_info->progress_fraction = task->progress_fraction;
  out_info->elapsed_us = task->elapsed_us;
  if (!done) pthread_mutex_unlock(&ep->mu);
}
