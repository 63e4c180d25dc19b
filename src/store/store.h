// SPDX-License-Identifier: Apache-2.0
//
// store: the gateway's durable state in one SQLite database under
// |state_dir| (ARCHITECTURE.md s.6): jobs and their events and results,
// services with a TTL, the scheduler's leases and reservations, the knowledge
// graph (entities, relations, observations), the graph mutation log and the
// checkpoint index. Upstream keeps all of it in memory and loses it on
// restart (reference/upstream-control-plane.md s.9.2); a gateway that opens
// the same state dir after a SIGKILL finds every committed change.
//
// Durability. The database runs in WAL mode with foreign keys on and
// synchronous=FULL by default (docs/decisions.md "store:"): a call that
// returned OK is on disk, even across a power loss (with NORMAL: across the
// death of the process, not of the machine). Every multi-row change is
// one transaction: a job transition and its event, a checkpoint's index row
// and its step, a graph mutation and its log record commit together or not
// at all. Checkpoint files are written beside the database with
// rename-into-place and fsync of the file and its directory before the index
// row commits, so an indexed checkpoint always has its whole file.
//
// Schema. Numbered migrations, each in its own transaction, recorded in the
// table schema_version; opening a database written by a newer binary is
// FAILED_PRECONDITION (nothing is changed).
//
// Threading. A pcp_store_t is thread-safe: it owns one SQLite connection and
// every call holds the store's mutex for its whole duration (reads included),
// so calls from several threads serialize. One writer is all SQLite allows
// anyway (WAL has one writer at a time); the gateway's write rate (job
// transitions, steps, heartbeats) is far below what one connection sustains,
// and one connection means no SQLITE_BUSY between our own threads.
// A second process on the same state dir is not supported; SQLite's locks keep
// it from corrupting the file, and its writes may fail with UNAVAILABLE.
// The optional event callback runs after the commit, outside the mutex.
// Not fork-safe (SQLite's rule): a forked child opens its own store and never
// touches its parent's.
//
// Ownership. Strings and JSON passed in are borrowed for the call (copied into
// the database). Records written into caller structs are owned by the caller:
// ids and names are inline arrays; json_t* fields hold one reference each and
// are released by the record's _deinitialize (or the list's). Lists are
// allocated by the store's allocator and released with their _deinitialize.
//
// Errors. Bad input is INVALID_ARGUMENT (an id too long, JSON too deep) and
// never an assert. SQLite errors keep SQLite's message and map to: BUSY and
// LOCKED -> UNAVAILABLE, FULL and NOMEM -> RESOURCE_EXHAUSTED, a primary-key or
// unique violation -> ALREADY_EXISTS, other constraints (foreign key, check,
// trigger) -> FAILED_PRECONDITION, CORRUPT and NOTADB -> DATA_LOSS, I/O
// errors -> UNAVAILABLE, permission errors -> PERMISSION_DENIED, anything
// else -> INTERNAL.

#ifndef PCP_STORE_STORE_H_
#define PCP_STORE_STORE_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Limits
//===----------------------------------------------------------------------===//

// Ids (job, executor, service, entity, worker, mutation ...): 1..255 bytes of
// [A-Za-z0-9._:@/-], not "." or "..". Job ids name checkpoint directories, so
// for them '/' is refused too.
#define PCP_STORE_ID_MAX_LENGTH 255
// Kinds, types, names, owners, display names: 1..127 printable bytes.
#define PCP_STORE_NAME_MAX_LENGTH 127
// URLs and file paths.
#define PCP_STORE_PATH_MAX_LENGTH 1023
// A job's error text (longer input is INVALID_ARGUMENT, never truncated).
#define PCP_STORE_ERROR_MAX_LENGTH 1023
// Any JSON value stored: serialized size and nesting depth.
#define PCP_STORE_JSON_MAX_BYTE_LENGTH (1u << 20)
#define PCP_STORE_JSON_MAX_DEPTH 32
// List calls: limit 0 means the default; larger limits are capped at the max.
#define PCP_STORE_LIST_LIMIT_DEFAULT 100u
#define PCP_STORE_LIST_LIMIT_MAX 1000u
// Workers in one reservation (upstream worker_count_max, s.5.8).
#define PCP_STORE_RESERVATION_WORKER_COUNT_MAX 1024u
// Largest checkpoint file the helper writes or verifies.
#define PCP_STORE_CHECKPOINT_MAX_BYTE_LENGTH (UINT64_C(1) << 40)
// The schema version this binary writes.
#define PCP_STORE_SCHEMA_VERSION 5

//===----------------------------------------------------------------------===//
// Store lifetime
//===----------------------------------------------------------------------===//

typedef struct pcp_store_t pcp_store_t;

// What "committed" survives. FULL (default): the WAL is fsynced at every
// commit, so a commit survives power loss. NORMAL: the WAL is fsynced only at
// checkpoints; a commit survives the death of the process (SIGKILL) but the
// last commits may roll back on power loss or a kernel crash.
typedef enum pcp_store_sync_mode_e {
  PCP_STORE_SYNC_FULL = 0,
  PCP_STORE_SYNC_NORMAL = 1,
} pcp_store_sync_mode_t;

// Told the id of every job event right after the transaction that wrote it
// committed (the SSE stream wakes its waiting clients with it instead of
// polling). Runs on the thread that made the store call, with no store lock
// held, so it may call back into the store; it must be quick and must not
// block. Event ids may reach it out of order when several threads write.
typedef struct pcp_store_event_callback_t {
  void (*fn)(void* user_data, int64_t event_id);
  void* user_data;
} pcp_store_event_callback_t;

typedef struct pcp_store_options_t {
  // Directory holding pcp.db (+ -wal, -shm) and checkpoints/. Created with
  // its parents when missing. Required.
  const char* state_dir;
  // Timestamps (created_at, heartbeats, TTLs) use |clock.wall_ns|: they are
  // persisted and compared across restarts, which monotonic time is not.
  pcp_clock_t clock;
  pcp_store_sync_mode_t sync_mode;
  // How long a statement waits for a lock held by another connection before
  // failing with UNAVAILABLE.
  int32_t busy_timeout_ms;
  // Tests only: migrate no further than this version (0: latest).
  int32_t schema_version_limit;
  // Optional ({NULL, NULL}: none).
  pcp_store_event_callback_t event_callback;
} pcp_store_options_t;

// Defaults: system clock, FULL, 5000 ms busy timeout, latest schema.
// Thread-safe (writes only |out_options|).
void pcp_store_options_initialize(pcp_store_options_t* out_options);

// Opens (creating when needed) the database under |options->state_dir|,
// applies pending migrations and removes half-written checkpoint temp files.
// |allocator| serves the store and every list it returns. Returns
// INVALID_ARGUMENT for bad options, FAILED_PRECONDITION for a database newer
// than this binary, DATA_LOSS for a file that is not a database, or a mapped
// SQLite/errno code. Thread-safe (opens a new connection).
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_create(const pcp_store_options_t* options, pcp_allocator_t allocator,
                 pcp_store_t** out_store);

// Closes the connection (finalizing cached statements) and frees |store|.
// NULL is a no-op. No other call on |store| may be running or follow.
void pcp_store_release(pcp_store_t* store);

// The schema version of the open database. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_schema_version_query(pcp_store_t* store, int32_t* out_version);

// Runs PRAGMA integrity_check and foreign_key_check: DATA_LOSS naming the
// first problem, else OK. Thread-safe; O(database size).
PCP_MUST_USE_RESULT pcp_status_t pcp_store_integrity_check(pcp_store_t* store);

// Borrowed path of the state dir. Thread-safe.
const char* pcp_store_state_dir(const pcp_store_t* store);

//===----------------------------------------------------------------------===//
// Jobs (issue 4 item 5)
//===----------------------------------------------------------------------===//

// Stored by name (the numbers are not persisted and may be renumbered).
typedef enum pcp_store_job_state_e {
  PCP_STORE_JOB_STATE_QUEUED = 0,
  PCP_STORE_JOB_STATE_PLACING = 1,
  PCP_STORE_JOB_STATE_COMPILING = 2,
  PCP_STORE_JOB_STATE_RUNNING = 3,
  PCP_STORE_JOB_STATE_SUCCEEDED = 4,
  PCP_STORE_JOB_STATE_FAILED = 5,
  PCP_STORE_JOB_STATE_CANCELLING = 6,
  PCP_STORE_JOB_STATE_CANCELLED = 7,
  PCP_STORE_JOB_STATE_COUNT_ = 8,
} pcp_store_job_state_t;

// A set of states for list filters: bit (1u << state).
typedef uint32_t pcp_store_job_state_mask_t;
#define PCP_STORE_JOB_STATE_BIT(state) (1u << (state))

// "queued", "running" ...; "unknown" out of range. Thread-safe.
const char* pcp_store_job_state_name(pcp_store_job_state_t state);
// False when |name| is not a state name. Thread-safe.
bool pcp_store_job_state_parse(pcp_string_view_t name,
                               pcp_store_job_state_t* out_state);
// succeeded, failed, cancelled. Thread-safe.
bool pcp_store_job_state_is_terminal(pcp_store_job_state_t state);

// The one transition table (every transition goes through it):
//   queued     -> placing, failed, cancelled
//   placing    -> compiling, queued, failed, cancelling
//   compiling  -> running, placing, queued, failed, cancelling
//   running    -> succeeded, failed, cancelling, placing, queued
//   cancelling -> cancelled, failed
//   succeeded, failed, cancelled -> nothing (terminal)
// A queued job is cancelled at once (nothing runs); a placed job passes
// through cancelling until its workers confirm. Back-edges to placing/queued
// re-run a job after worker loss or a gateway restart (attempt + 1 on every
// entry into placing). Same-state "transitions" are not allowed.
// Thread-safe.
bool pcp_store_job_transition_is_allowed(pcp_store_job_state_t from,
                                         pcp_store_job_state_t to);

typedef struct pcp_store_job_t {
  char id[PCP_STORE_ID_MAX_LENGTH + 1];
  char kind[PCP_STORE_NAME_MAX_LENGTH + 1];
  pcp_store_job_state_t state;
  json_t* spec;           // owned reference; never NULL in a read record
  json_t* placement;      // owned reference; NULL until a transition sets it
  int64_t created_at_ns;  // wall clock
  int64_t updated_at_ns;
  uint32_t attempt;                            // entries into placing so far
  int64_t last_committed_step;                 // -1: none
  char error[PCP_STORE_ERROR_MAX_LENGTH + 1];  // "" when none
} pcp_store_job_t;

// Drops the JSON references and clears |job|. Thread-compatible.
void pcp_store_job_deinitialize(pcp_store_job_t* job);

typedef struct pcp_store_job_list_t {
  pcp_allocator_t allocator;
  pcp_store_job_t* items;
  size_t count;
} pcp_store_job_list_t;
// Releases what the record/list owns and clears it (NULL-safe fields).
// Thread-compatible: one owner at a time.
void pcp_store_job_list_deinitialize(pcp_store_job_list_t* list);

// Inserts job |id| of |kind| with |spec| (any JSON object, bounded) in state
// queued, and its first event (type "state", to "queued") in the same
// transaction. |out_event_id| (optional) receives the event id.
// ALREADY_EXISTS for a known id; INVALID_ARGUMENT for bad ids/JSON.
// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_job_create(pcp_store_t* store,
                                                      const char* id,
                                                      const char* kind,
                                                      const json_t* spec,
                                                      int64_t* out_event_id);

// Optional parts of a transition. Zero-initialize.
typedef struct pcp_store_job_transition_params_t {
  // Replaces the job's placement when non-NULL (bounded JSON).
  const json_t* placement;
  // Replaces the job's error text when non-NULL ("" clears it).
  const char* error;
} pcp_store_job_transition_params_t;

// Moves job |id| to |to| if pcp_store_job_transition_is_allowed(current, to),
// and appends its event {"from","to","attempt"[,"error"]} in the same
// transaction. |params| may be NULL. NOT_FOUND for an unknown job,
// FAILED_PRECONDITION for an illegal transition (message names both states),
// INVALID_ARGUMENT for bad params. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_job_transition(
    pcp_store_t* store, const char* id, pcp_store_job_state_t to,
    const pcp_store_job_transition_params_t* params, int64_t* out_event_id);

// Records that job |id| finished step |step| (>= 0) durably: the job must be
// running or cancelling and |step| greater than its last committed step
// (FAILED_PRECONDITION otherwise). Appends a "step" event in the same
// transaction. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_job_step_commit(
    pcp_store_t* store, const char* id, int64_t step, int64_t* out_event_id);

// Reads job |id| into |out_job| (cleared first). NOT_FOUND. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_job_get(pcp_store_t* store,
                                                   const char* id,
                                                   pcp_store_job_t* out_job);

typedef struct pcp_store_job_filter_t {
  pcp_store_job_state_mask_t states;  // 0: any state
  const char* kind;                   // NULL: any kind
  const char* after_id;  // NULL: from the oldest; else jobs created after it
  uint32_t limit;        // 0: default; capped at PCP_STORE_LIST_LIMIT_MAX
} pcp_store_job_filter_t;

// Lists jobs in creation order matching |filter| (NULL: all, default limit).
// NOT_FOUND when |after_id| is not a job. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_job_list(pcp_store_t* store, const pcp_store_job_filter_t* filter,
                   pcp_store_job_list_t* out_list);

// Jobs that were placing, compiling, running or cancelling when the store was
// last written: after a restart the gateway re-places them (resuming from
// last_committed_step and its checkpoint) or, for cancelling ones, finishes
// them as cancelled. Paged like pcp_store_job_list. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_job_resume_list(pcp_store_t* store, const char* after_id,
                          uint32_t limit, pcp_store_job_list_t* out_list);

//===----------------------------------------------------------------------===//
// Job events (the SSE stream; ids usable as Last-Event-ID)
//===----------------------------------------------------------------------===//

// Event ids are assigned by the database in commit order, start at 1, grow
// strictly and are never reused, across restarts included (AUTOINCREMENT).
// The table is append-only (triggers refuse UPDATE and DELETE).
typedef struct pcp_store_job_event_t {
  int64_t event_id;
  char job_id[PCP_STORE_ID_MAX_LENGTH + 1];
  char type[PCP_STORE_NAME_MAX_LENGTH + 1];  // "state", "step", "checkpoint"..
  bool has_states;                           // a "state" event
  pcp_store_job_state_t from_state;          // "state" events except the first
  bool has_from_state;
  pcp_store_job_state_t to_state;  // "state" events
  json_t* payload;                 // owned reference; never NULL when read
  int64_t created_at_ns;
} pcp_store_job_event_t;

typedef struct pcp_store_job_event_list_t {
  pcp_allocator_t allocator;
  pcp_store_job_event_t* items;
  size_t count;
} pcp_store_job_event_list_t;
// Releases what the record/list owns and clears it (NULL-safe fields).
// Thread-compatible: one owner at a time.
void pcp_store_job_event_list_deinitialize(pcp_store_job_event_list_t* list);

// Appends a custom event (progress, logs) of |type| to job |id|. The types
// "state", "step" and "checkpoint" are reserved for the store
// (INVALID_ARGUMENT). |payload| NULL means {}. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_job_event_append(pcp_store_t* store, const char* id, const char* type,
                           const json_t* payload, int64_t* out_event_id);

// Events with id > |after_event_id| in id order, of job |job_id| or of all
// jobs (NULL), at most |limit| (0: default; capped). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_job_event_list(
    pcp_store_t* store, int64_t after_event_id, const char* job_id,
    uint32_t limit, pcp_store_job_event_list_t* out_list);

// The highest event id ever assigned (0 when none). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_job_event_last_id(pcp_store_t* store, int64_t* out_event_id);

//===----------------------------------------------------------------------===//
// Job results (metadata; the bytes are files)
//===----------------------------------------------------------------------===//

typedef struct pcp_store_job_result_t {
  char job_id[PCP_STORE_ID_MAX_LENGTH + 1];
  char name[PCP_STORE_NAME_MAX_LENGTH + 1];
  pcp_element_type_t dtype;            // not UNKNOWN
  uint32_t rank;                       // <= PCP_MAX_TENSOR_RANK
  int64_t shape[PCP_MAX_TENSOR_RANK];  // each >= 0
  uint64_t byte_length;                // == product(shape) * element size
  pcp_sha256_t sha256;
  char path[PCP_STORE_PATH_MAX_LENGTH + 1];
  int64_t created_at_ns;  // set by the store
} pcp_store_job_result_t;

typedef struct pcp_store_job_result_list_t {
  pcp_allocator_t allocator;
  pcp_store_job_result_t* items;
  size_t count;
} pcp_store_job_result_list_t;
// Releases what the record/list owns and clears it (NULL-safe fields).
// Thread-compatible: one owner at a time.
void pcp_store_job_result_list_deinitialize(pcp_store_job_result_list_t* list);

// Records a result of |result->job_id|. NOT_FOUND for an unknown job (the
// foreign key), ALREADY_EXISTS for a repeated name, INVALID_ARGUMENT for a
// shape/dtype/byte_length that disagree. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_job_result_put(
    pcp_store_t* store, const pcp_store_job_result_t* result);

// NOT_FOUND. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_job_result_get(pcp_store_t* store, const char* job_id,
                         const char* name, pcp_store_job_result_t* out_result);

// All results of |job_id| in name order (capped at the list max).
// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_job_result_list(pcp_store_t* store, const char* job_id,
                          pcp_store_job_result_list_t* out_list);

//===----------------------------------------------------------------------===//
// Services (registered with a TTL; upstream s.3.1.1 never expires them)
//===----------------------------------------------------------------------===//

typedef struct pcp_store_service_t {
  char executor_id[PCP_STORE_ID_MAX_LENGTH + 1];  // the key
  char service_id[PCP_STORE_ID_MAX_LENGTH + 1];
  char service_type[PCP_STORE_NAME_MAX_LENGTH + 1];
  char base_url[PCP_STORE_PATH_MAX_LENGTH + 1];
  // The rest of the upstream Service record (health, counts, capabilities):
  // an open shape owned by the HTTP layer. Owned reference; {} when read.
  json_t* attributes;
  int64_t ttl_ns;  // > 0
  // Set by the store (ignored on register):
  int64_t registered_at_ns;  // kept across re-registration (upsert)
  int64_t updated_at_ns;
  int64_t heartbeat_at_ns;
  int64_t expires_at_ns;  // heartbeat_at_ns + ttl_ns
  bool expired;           // expires_at_ns <= now at the time of the read
} pcp_store_service_t;

// Releases what the record/list owns and clears it (NULL-safe fields).
// Thread-compatible: one owner at a time.
void pcp_store_service_deinitialize(pcp_store_service_t* service);

typedef struct pcp_store_service_list_t {
  pcp_allocator_t allocator;
  pcp_store_service_t* items;
  size_t count;
} pcp_store_service_list_t;
// Releases what the record/list owns and clears it (NULL-safe fields).
// Thread-compatible: one owner at a time.
void pcp_store_service_list_deinitialize(pcp_store_service_list_t* list);

// Upserts by executor_id (every field replaced, registered_at kept) and
// starts a new TTL from now. |service->attributes| may be NULL ({}).
// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_service_register(
    pcp_store_t* store, const pcp_store_service_t* service);

// Extends the TTL of |executor_id| from now. NOT_FOUND when unknown;
// FAILED_PRECONDITION when it already expired (register again: the record
// may be stale). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_service_heartbeat(pcp_store_t* store, const char* executor_id);

// NOT_FOUND. Expired-but-not-swept services are returned with |expired|.
// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_service_get(pcp_store_t* store, const char* executor_id,
                      pcp_store_service_t* out_service);

// Services in executor_id order after |after_executor_id| (NULL: first).
// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_service_list(pcp_store_t* store, const char* after_executor_id,
                       uint32_t limit, pcp_store_service_list_t* out_list);

// NOT_FOUND. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_service_delete(pcp_store_t* store, const char* executor_id);

// Deletes every service whose TTL ran out (expires_at <= now) and returns
// them (at most the list max per call; call again while count == max) so
// the caller can publish their removal. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_service_expired_sweep(
    pcp_store_t* store, pcp_store_service_list_t* out_expired);

//===----------------------------------------------------------------------===//
// Leases and reservations (a mirror of src/sched's decisions)
//===----------------------------------------------------------------------===//

// The scheduler is the authority; the store only remembers what it decided so
// that a restarted gateway can rebuild it. Owners are stored by name
// ("training"), deadlines in wall-clock ns (monotonic time does not survive a
// restart; the caller converts).
typedef struct pcp_store_lease_t {
  uint64_t lease_id;  // > 0, the scheduler's id
  char owner[PCP_STORE_NAME_MAX_LENGTH + 1];
  char worker_id[PCP_STORE_ID_MAX_LENGTH + 1];  // "" while detached
  uint64_t tag;                                 // the caller's tag
  char job_id[PCP_STORE_ID_MAX_LENGTH + 1];     // "" when not a job's
  int64_t deadline_ns;    // detached: expiry (wall); 0 when none
  int64_t updated_at_ns;  // set by the store
} pcp_store_lease_t;

typedef struct pcp_store_lease_list_t {
  pcp_allocator_t allocator;
  pcp_store_lease_t* items;
  size_t count;
} pcp_store_lease_list_t;
// Releases what the record/list owns and clears it (NULL-safe fields).
// Thread-compatible: one owner at a time.
void pcp_store_lease_list_deinitialize(pcp_store_lease_list_t* list);

// Inserts or replaces lease |lease->lease_id|. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_lease_put(pcp_store_t* store, const pcp_store_lease_t* lease);
// NOT_FOUND. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_lease_delete(pcp_store_t* store,
                                                        uint64_t lease_id);
// NOT_FOUND. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_lease_get(
    pcp_store_t* store, uint64_t lease_id, pcp_store_lease_t* out_lease);
// Leases with id > |after_lease_id| in id order. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_lease_list(pcp_store_t* store, uint64_t after_lease_id,
                     uint32_t limit, pcp_store_lease_list_t* out_list);
// The highest lease id ever put (deleted ones included; 0 when none), so a
// restarted scheduler never reuses an id. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_lease_id_high_water_query(pcp_store_t* store, uint64_t* out_lease_id);

typedef struct pcp_store_worker_id_t {
  char value[PCP_STORE_ID_MAX_LENGTH + 1];
} pcp_store_worker_id_t;

typedef struct pcp_store_reservation_t {
  uint64_t reservation_id;  // > 0
  char owner[PCP_STORE_NAME_MAX_LENGTH + 1];
  uint64_t tag;
  int64_t deadline_ns;  // wall clock
  // 1..PCP_STORE_RESERVATION_WORKER_COUNT_MAX worker ids, unique. In a read
  // record the array is owned (store allocator) and freed by _deinitialize.
  pcp_store_worker_id_t* worker_ids;
  uint32_t worker_count;
  int64_t created_at_ns;  // set by the store
} pcp_store_reservation_t;

typedef struct pcp_store_reservation_list_t {
  pcp_allocator_t allocator;
  pcp_store_reservation_t* items;
  size_t count;
} pcp_store_reservation_list_t;
// Releases what the record/list owns and clears it (NULL-safe fields).
// Thread-compatible: one owner at a time.
void pcp_store_reservation_list_deinitialize(
    pcp_store_reservation_list_t* list);

// Inserts reservation |reservation| (ALREADY_EXISTS for a known id).
// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_reservation_put(
    pcp_store_t* store, const pcp_store_reservation_t* reservation);
// Deletes it with its workers (commit, release, expiry). NOT_FOUND.
// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_reservation_delete(pcp_store_t* store, uint64_t reservation_id);
// Reservations in id order after |after_reservation_id|. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_reservation_list(
    pcp_store_t* store, uint64_t after_reservation_id, uint32_t limit,
    pcp_store_reservation_list_t* out_list);

//===----------------------------------------------------------------------===//
// Knowledge graph (upstream s.6.6)
//===----------------------------------------------------------------------===//

typedef enum pcp_store_visibility_e {
  PCP_STORE_VISIBILITY_LOCAL = 0,
  PCP_STORE_VISIBILITY_SHARED = 1,
  PCP_STORE_VISIBILITY_GLOBAL = 2,
  PCP_STORE_VISIBILITY_COUNT_ = 3,
} pcp_store_visibility_t;
// "local", "shared", "global" ("unknown" out of range); parse is false for
// anything else. Thread-safe.
const char* pcp_store_visibility_name(pcp_store_visibility_t visibility);
bool pcp_store_visibility_parse(pcp_string_view_t name,
                                pcp_store_visibility_t* out_visibility);

// In records read back, json_t* fields are owned references and never NULL
// ({} for properties/provenance). On input NULL means {}.
typedef struct pcp_store_graph_entity_t {
  char entity_id[PCP_STORE_ID_MAX_LENGTH + 1];
  char namespace_id[PCP_STORE_ID_MAX_LENGTH + 1];
  char entity_type[PCP_STORE_NAME_MAX_LENGTH + 1];
  char display_name[PCP_STORE_NAME_MAX_LENGTH + 1];  // "" -> entity_id
  pcp_store_visibility_t visibility;
  json_t* properties;     // an object
  json_t* provenance;     // an object
  int64_t created_at_ns;  // set by the store (kept on upsert)
  int64_t updated_at_ns;
} pcp_store_graph_entity_t;

typedef struct pcp_store_graph_relation_t {
  char relation_id[PCP_STORE_ID_MAX_LENGTH + 1];
  char namespace_id[PCP_STORE_ID_MAX_LENGTH + 1];
  char relation_type[PCP_STORE_NAME_MAX_LENGTH + 1];
  char from_entity_id[PCP_STORE_ID_MAX_LENGTH + 1];
  char to_entity_id[PCP_STORE_ID_MAX_LENGTH + 1];
  pcp_store_visibility_t visibility;
  json_t* properties;
  json_t* provenance;
  int64_t created_at_ns;
  int64_t updated_at_ns;
} pcp_store_graph_relation_t;

typedef struct pcp_store_graph_observation_t {
  char observation_id[PCP_STORE_ID_MAX_LENGTH + 1];
  char namespace_id[PCP_STORE_ID_MAX_LENGTH + 1];
  char subject_entity_id[PCP_STORE_ID_MAX_LENGTH + 1];
  char observation_type[PCP_STORE_NAME_MAX_LENGTH + 1];
  pcp_store_visibility_t visibility;
  json_t* payload;  // any JSON value
  json_t* provenance;
  int64_t created_at_ns;
} pcp_store_graph_observation_t;

// Releases what the record/list owns and clears it (NULL-safe fields).
// Thread-compatible: one owner at a time.
void pcp_store_graph_entity_deinitialize(pcp_store_graph_entity_t* entity);

// The three arrays a graph query returns.
typedef struct pcp_store_graph_result_t {
  pcp_allocator_t allocator;
  pcp_store_graph_entity_t* entities;
  size_t entity_count;
  pcp_store_graph_relation_t* relations;
  size_t relation_count;
  pcp_store_graph_observation_t* observations;
  size_t observation_count;
} pcp_store_graph_result_t;
// Releases what the record/list owns and clears it (NULL-safe fields).
// Thread-compatible: one owner at a time.
void pcp_store_graph_result_deinitialize(pcp_store_graph_result_t* result);

// Entities, relations and observations are keyed by their own id. Relations
// and observations may name entities that do not exist (yet): replication
// delivers in any order, and upstream's Neo4j backend creates stubs for them.
// Deleting an entity deletes its relations (either end) and observations in
// the same transaction, as upstream's memory store does.

// Upserts by entity_id (created_at kept). INVALID_ARGUMENT for bad ids or
// non-object properties/provenance. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_graph_entity_upsert(
    pcp_store_t* store, const pcp_store_graph_entity_t* entity);
// NOT_FOUND. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_graph_entity_get(pcp_store_t* store, const char* entity_id,
                           pcp_store_graph_entity_t* out_entity);
// NOT_FOUND. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_graph_entity_delete(pcp_store_t* store, const char* entity_id);
// Upserts by relation_id (created_at kept). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_graph_relation_upsert(
    pcp_store_t* store, const pcp_store_graph_relation_t* relation);
// NOT_FOUND. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_graph_relation_delete(pcp_store_t* store, const char* relation_id);
// Upsert by observation_id (upstream append_observation). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_graph_observation_append(
    pcp_store_t* store, const pcp_store_graph_observation_t* observation);

// A local query. Every filter is optional (NULL) and they combine with AND;
// each array applies the filters that name its own fields:
//   - entities: |entity_id|, |namespace_id|, |entity_type|, |text|;
//   - relations: |entity_id| (either end), |namespace_id|, |relation_type|,
//     |text|;
//   - observations: |entity_id| (subject), |namespace_id|, |text|.
// A query by |relation_type| is about edges and returns no entities or
// observations; a query by |entity_type| returns no relations or
// observations. So {entity_id} alone gives the entity, the relations touching
// it and its observations. |text| is a literal, case-sensitive substring of
// ids, types, names, properties, payloads and provenance (upstream s.6.6).
// Each array is ordered newest first (updated_at, created_at for
// observations) and holds at most |limit| items (0: upstream's 20; capped
// at the list max). The three arrays come from one read snapshot.
typedef struct pcp_store_graph_query_t {
  const char* entity_id;
  const char* namespace_id;
  const char* entity_type;
  const char* relation_type;
  const char* text;
  uint32_t limit;
} pcp_store_graph_query_t;

// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_graph_query(pcp_store_t* store, const pcp_store_graph_query_t* query,
                      pcp_store_graph_result_t* out_result);

// Direction of pcp_store_graph_neighbors_list.
typedef enum pcp_store_graph_direction_e {
  PCP_STORE_GRAPH_DIRECTION_OUT = 1,  // entity -> neighbour
  PCP_STORE_GRAPH_DIRECTION_IN = 2,   // neighbour -> entity
  PCP_STORE_GRAPH_DIRECTION_BOTH = 3,
} pcp_store_graph_direction_t;

// The entities one relation away from |entity_id| (optionally only over
// |relation_type|), each once, plus the relations used. Neighbours that do
// not exist as entities are left out of |entities| (their relations are
// kept). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_graph_neighbors_list(
    pcp_store_t* store, const char* entity_id, const char* relation_type,
    pcp_store_graph_direction_t direction, uint32_t limit,
    pcp_store_graph_result_t* out_result);

//===----------------------------------------------------------------------===//
// Graph mutation log (for replication, upstream s.6.4 and s.6.6)
//===----------------------------------------------------------------------===//

typedef enum pcp_store_mutation_type_e {
  PCP_STORE_MUTATION_UPSERT_ENTITY = 0,
  PCP_STORE_MUTATION_UPSERT_RELATION = 1,
  PCP_STORE_MUTATION_APPEND_OBSERVATION = 2,
  PCP_STORE_MUTATION_DELETE_ENTITY = 3,
  PCP_STORE_MUTATION_DELETE_RELATION = 4,
  PCP_STORE_MUTATION_POLICY_UPDATE = 5,
  PCP_STORE_MUTATION_TYPE_COUNT_ = 6,
} pcp_store_mutation_type_t;
// Upstream spellings ("upsert_entity" ...); parse is false for anything
// else. Thread-safe.
const char* pcp_store_mutation_type_name(pcp_store_mutation_type_t type);
bool pcp_store_mutation_type_parse(pcp_string_view_t name,
                                   pcp_store_mutation_type_t* out_type);

typedef struct pcp_store_mutation_t {
  int64_t sequence_no;  // set by the store: 1, 2, ... never reused
  // "" on input: the store names it "mut_{sequence_no}" (upstream).
  char mutation_id[PCP_STORE_ID_MAX_LENGTH + 1];
  char namespace_id[PCP_STORE_ID_MAX_LENGTH + 1];
  pcp_store_mutation_type_t mutation_type;
  char target_id[PCP_STORE_ID_MAX_LENGTH + 1];
  json_t* payload;  // object; NULL on input means {}
  pcp_store_visibility_t visibility;
  json_t* provenance;    // object; NULL on input means {}
  int64_t timestamp_ns;  // 0 on input: now
} pcp_store_mutation_t;

typedef struct pcp_store_mutation_list_t {
  pcp_allocator_t allocator;
  pcp_store_mutation_t* items;
  size_t count;
} pcp_store_mutation_list_t;
// Releases what the record/list owns and clears it (NULL-safe fields).
// Thread-compatible: one owner at a time.
void pcp_store_mutation_list_deinitialize(pcp_store_mutation_list_t* list);

// Appends |mutation| to the log only (records replicated from elsewhere that
// are applied by other means). Idempotent by mutation_id: a known id returns
// its existing sequence number with |out_duplicate| true and writes nothing.
// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_mutation_append(
    pcp_store_t* store, const pcp_store_mutation_t* mutation,
    int64_t* out_sequence_no, bool* out_duplicate);

// Applies |mutation| to the graph tables (payload keys as upstream s.6.6:
// entity_type, display_name, properties; relation_type, from_entity_id,
// to_entity_id; observation_type, subject_entity_id, payload) and appends it
// to the log in ONE transaction, so the graph and the log never disagree
// (upstream appends after applying and can lose either). Duplicates as
// _append (nothing applied). INVALID_ARGUMENT for a missing payload key,
// NOT_FOUND for deleting what does not exist. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_graph_mutation_apply(
    pcp_store_t* store, const pcp_store_mutation_t* mutation,
    int64_t* out_sequence_no, bool* out_duplicate);

// Records with sequence_no > |after_sequence_no| in order. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_mutation_list(pcp_store_t* store, int64_t after_sequence_no,
                        uint32_t limit, pcp_store_mutation_list_t* out_list);

typedef struct pcp_store_mutation_log_stats_t {
  int64_t last_sequence_no;          // 0 when empty
  int64_t last_replicated_sequence;  // highest acknowledged
  int64_t pending_count;             // records after last_replicated
} pcp_store_mutation_log_stats_t;

// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_mutation_log_stats_query(
    pcp_store_t* store, pcp_store_mutation_log_stats_t* out_stats);

// Raises last_replicated_sequence to |sequence_no| (never lowers it).
// OUT_OF_RANGE beyond the last sequence number. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_mutation_replicated_mark(pcp_store_t* store, int64_t sequence_no);

// The sequence number of the record named |mutation_id| (0 when there is
// none). Lets a graph backend outside SQLite (graph_backend.h) tell a
// duplicate before it applies anything. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_mutation_find(
    pcp_store_t* store, const char* mutation_id, int64_t* out_sequence_no);

//===----------------------------------------------------------------------===//
// Graph replication: namespace policies, per-namespace lag, peer acks
//===----------------------------------------------------------------------===//

// A namespace policy (upstream s.6.5). Policies are not a table of their
// own: a policy change is a policy_update record in the mutation log whose
// payload is the whole snapshot {default_visibility, allow_global_replication,
// allow_raw_payload_export}, and the policy in force is the newest record of
// its namespace (by timestamp, then sequence number). So a policy and the
// mutations written under it share one history and one durability rule.
typedef struct pcp_store_graph_policy_t {
  char namespace_id[PCP_STORE_ID_MAX_LENGTH + 1];
  pcp_store_visibility_t default_visibility;
  bool allow_global_replication;
  bool allow_raw_payload_export;
  int64_t updated_at_ns;  // the record's timestamp; 0 for a default policy
} pcp_store_graph_policy_t;

typedef struct pcp_store_graph_policy_list_t {
  pcp_allocator_t allocator;
  pcp_store_graph_policy_t* items;
  size_t count;
} pcp_store_graph_policy_list_t;
// Thread-compatible: one owner at a time.
void pcp_store_graph_policy_list_deinitialize(
    pcp_store_graph_policy_list_t* list);

// The policy in force of every namespace that has one, by namespace id (at
// most PCP_STORE_LIST_LIMIT_MAX). A payload key that is absent or of the
// wrong type reads as its default (local, false, false). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_graph_policy_list(
    pcp_store_t* store, pcp_store_graph_policy_list_t* out_list);

// Mutation log counters of one namespace (upstream
// NamespaceReplicationStatus). |pending_count| counts records after the
// log's last_replicated_sequence: the namespace's replication lag.
typedef struct pcp_store_namespace_stats_t {
  char namespace_id[PCP_STORE_ID_MAX_LENGTH + 1];
  int64_t total_count;
  int64_t pending_count;
  int64_t visibility_counts[PCP_STORE_VISIBILITY_COUNT_];
  int64_t entity_count;       // upsert_entity + delete_entity
  int64_t relation_count;     // upsert_relation + delete_relation
  int64_t observation_count;  // append_observation
  int64_t policy_count;       // policy_update
  int64_t last_sequence_no;
} pcp_store_namespace_stats_t;

typedef struct pcp_store_namespace_stats_list_t {
  pcp_allocator_t allocator;
  pcp_store_namespace_stats_t* items;
  size_t count;
} pcp_store_namespace_stats_list_t;
// Thread-compatible: one owner at a time.
void pcp_store_namespace_stats_list_deinitialize(
    pcp_store_namespace_stats_list_t* list);

// Counters of every namespace in the log, by namespace id (at most
// PCP_STORE_LIST_LIMIT_MAX). One scan of the log. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_namespace_stats_list(
    pcp_store_t* store, pcp_store_namespace_stats_list_t* out_list);

// Row counts of the graph tables (namespaces: distinct namespace ids in the
// log). Thread-safe.
typedef struct pcp_store_graph_log_counts_t {
  int64_t namespace_count;
  int64_t entity_count;
  int64_t relation_count;
  int64_t observation_count;
  int64_t mutation_count;
} pcp_store_graph_log_counts_t;
PCP_MUST_USE_RESULT pcp_status_t pcp_store_graph_log_counts_query(
    pcp_store_t* store, pcp_store_graph_log_counts_t* out_counts);

// What the receiving side (the hub) knows of one sender (a gateway): the
// highest sequence number it acknowledged and the sender's own last
// sequence number as last reported (lag = last - acked).
typedef struct pcp_store_replication_peer_t {
  char peer_id[PCP_STORE_ID_MAX_LENGTH + 1];
  int64_t acked_sequence_no;
  int64_t last_sequence_no;
} pcp_store_replication_peer_t;

typedef struct pcp_store_replication_peer_list_t {
  pcp_allocator_t allocator;
  pcp_store_replication_peer_t* items;
  size_t count;
} pcp_store_replication_peer_list_t;
// Thread-compatible: one owner at a time.
void pcp_store_replication_peer_list_deinitialize(
    pcp_store_replication_peer_list_t* list);

// Applies a replicated batch from |peer_id| exactly once, in ONE
// transaction: every item (each must carry a mutation_id) is applied and
// logged as pcp_store_graph_mutation_apply does, an id already in the log
// is skipped and counted in |out_duplicate_count|, and the peer's
// acknowledged sequence (pcp_store_federation_ack_get; |peer_id| is a
// gateway id, no '/') is raised to |acked_sequence_no| (and its reported
// last sequence to |peer_last_sequence_no|; both never lowered). Either
// everything commits or nothing does, so an ack the sender receives always
// names applied records, and a batch re-sent after a crash before the
// commit applies in full. Items keep their timestamps (the sender's). A
// delete of what the store does not hold is logged and counts as applied
// (unlike pcp_store_graph_mutation_apply's NOT_FOUND).
// INVALID_ARGUMENT (naming the item) for a bad item. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_graph_mutation_batch_apply(
    pcp_store_t* store, const char* peer_id, const pcp_store_mutation_t* items,
    size_t count, int64_t acked_sequence_no, int64_t peer_last_sequence_no,
    size_t* out_applied_count, size_t* out_duplicate_count);

// The acknowledged sequence of |peer_id| (0 when it never sent). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_replication_peer_get(pcp_store_t* store, const char* peer_id,
                               pcp_store_replication_peer_t* out_peer);

// Every peer that sent a batch, by id (at most PCP_STORE_LIST_LIMIT_MAX).
// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_replication_peer_list(
    pcp_store_t* store, pcp_store_replication_peer_list_t* out_list);

//===----------------------------------------------------------------------===//
// Checkpoints
//===----------------------------------------------------------------------===//

typedef struct pcp_store_checkpoint_t {
  char job_id[PCP_STORE_ID_MAX_LENGTH + 1];
  int64_t step;
  // Absolute path (the index stores it relative to the state dir).
  char path[PCP_STORE_PATH_MAX_LENGTH + 1];
  pcp_sha256_t sha256;
  uint64_t byte_length;
  int64_t created_at_ns;
} pcp_store_checkpoint_t;

typedef struct pcp_store_checkpoint_list_t {
  pcp_allocator_t allocator;
  pcp_store_checkpoint_t* items;
  size_t count;
} pcp_store_checkpoint_list_t;
// Releases what the record/list owns and clears it (NULL-safe fields).
// Thread-compatible: one owner at a time.
void pcp_store_checkpoint_list_deinitialize(pcp_store_checkpoint_list_t* list);

// Writes |data| as the checkpoint of |job_id| at |step|:
//   1. <state_dir>/checkpoints/<job_id>/step-<step>.bin.tmp, written and
//      fsynced (no store lock held while writing);
//   2. renamed into place, then the directory fsynced;
//   3. one transaction: the index row (with the SHA-256 of |data|), the job's
//      last_committed_step raised to |step| and a "checkpoint" event.
// A crash before 3 leaves at most a file that no row names (temp files are
// removed at the next open). The job must be running or cancelling;
// ALREADY_EXISTS when |step| already has a checkpoint. |out_checkpoint|
// (optional) receives the row. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_checkpoint_write(
    pcp_store_t* store, const char* job_id, int64_t step, const void* data,
    size_t byte_length, pcp_store_checkpoint_t* out_checkpoint);

// The checkpoint of |job_id| at |step|, or the newest one when |step| < 0.
// NOT_FOUND. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_checkpoint_get(pcp_store_t* store, const char* job_id, int64_t step,
                         pcp_store_checkpoint_t* out_checkpoint);

// Every checkpoint of |job_id| in step order (capped at the list max).
// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_checkpoint_list(pcp_store_t* store, const char* job_id,
                          pcp_store_checkpoint_list_t* out_list);

// Re-reads |checkpoint|'s file and compares its length and SHA-256 with the
// index. DATA_LOSS when the file is missing, shorter, longer or different.
// Takes no store lock (pure file I/O). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_checkpoint_verify(const pcp_store_checkpoint_t* checkpoint);

//===----------------------------------------------------------------------===//
// Federation hub state (store/federation.c; docs/federation.md)
//===----------------------------------------------------------------------===//
//
// What the hub must not lose on a SIGKILL: the gateway registrations (read
// back as stale until each gateway connects), the global jobs with their
// numbers (global-job-N; AUTOINCREMENT never reuses a number), the mutation
// sequence acknowledged per gateway and the hub's namespace policies.

typedef struct pcp_store_federation_gateway_t {
  char gateway_id[PCP_STORE_ID_MAX_LENGTH + 1];
  json_t* registration;     // the connect request as accepted (one reference)
  int64_t connected_at_ns;  // wall
  int64_t last_seen_ns;     // wall
} pcp_store_federation_gateway_t;

typedef struct pcp_store_federation_gateway_list_t {
  pcp_allocator_t allocator;
  pcp_store_federation_gateway_t* items;
  size_t count;
} pcp_store_federation_gateway_list_t;

// Releases what the list owns and clears it. Thread-compatible.
void pcp_store_federation_gateway_list_deinitialize(
    pcp_store_federation_gateway_list_t* list);

// Inserts or replaces the registration of |gateway_id| (an id) with
// |registration| (a JSON object, bounded like every stored JSON). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_federation_gateway_put(
    pcp_store_t* store, const char* gateway_id, const json_t* registration,
    int64_t connected_at_ns, int64_t last_seen_ns);

// Every registration, first registered first (connected_at, then id: the
// registry's tie-break order survives a restart); |out_list->allocator| must
// be set.
// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_federation_gateway_list(
    pcp_store_t* store, pcp_store_federation_gateway_list_t* out_list);

// NOT_FOUND. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_federation_gateway_delete(pcp_store_t* store, const char* gateway_id);

// Global job states: "placing" (number taken, the gateway not answered yet),
// "submitted" (the gateway accepted it: child_job_id set), "rejected" (the
// gateway refused it or could not be reached: error set), "cancelling"
// (a cancel was accepted by the gateway).
#define PCP_STORE_GLOBAL_JOB_STATE_COUNT 4
extern const char* const
    pcp_store_global_job_state_names[PCP_STORE_GLOBAL_JOB_STATE_COUNT];

typedef struct pcp_store_global_job_t {
  int64_t number;  // N of "global-job-N"
  char kind[16];   // "training" | "rl"
  char state[16];
  char child_job_id[PCP_STORE_ID_MAX_LENGTH + 1];  // "" until submitted
  json_t* assignment;                              // object (one reference)
  json_t* child;  // the gateway's last answer, or NULL
  char error[PCP_STORE_ERROR_MAX_LENGTH + 1];
  int64_t submitted_at_ns;  // wall
  int64_t updated_at_ns;    // wall
} pcp_store_global_job_t;

typedef struct pcp_store_global_job_list_t {
  pcp_allocator_t allocator;
  pcp_store_global_job_t* items;
  size_t count;
} pcp_store_global_job_list_t;

void pcp_store_global_job_deinitialize(pcp_store_global_job_t* job);
void pcp_store_global_job_list_deinitialize(pcp_store_global_job_list_t* list);

// Records a new global job of |kind| in state "placing" and returns its
// number (1, 2, ...; never reused). INVALID_ARGUMENT for a bad kind or
// assignment. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_global_job_create(pcp_store_t* store, const char* kind,
                            const json_t* assignment, int64_t* out_number);

// Sets job |number|'s |state| and, when not NULL, its |child_job_id| (an id),
// |child| answer and |error| text. NOT_FOUND; INVALID_ARGUMENT for an
// unknown state or bad fields. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_global_job_update(
    pcp_store_t* store, int64_t number, const char* state,
    const char* child_job_id, const json_t* child, const char* error);

// NOT_FOUND. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_global_job_get(
    pcp_store_t* store, int64_t number, pcp_store_global_job_t* out_job);

// Jobs with number > |after_number| in number order, at most |limit|
// (normalised like every list). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_global_job_list(
    pcp_store_t* store, int64_t after_number, uint32_t limit,
    pcp_store_global_job_list_t* out_list);

// Jobs per state, in pcp_store_global_job_state_names order. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_global_job_counts(
    pcp_store_t* store, int64_t out_counts[PCP_STORE_GLOBAL_JOB_STATE_COUNT]);

// The mutation sequence acknowledged to |gateway_id| (0 when none).
// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_federation_ack_get(
    pcp_store_t* store, const char* gateway_id, int64_t* out_sequence);
// Raises it to |sequence| (>= 0; never lowers). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_federation_ack_raise(
    pcp_store_t* store, const char* gateway_id, int64_t sequence);

// The hub's namespace policies: |policy| a JSON object per namespace id.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_federation_policy_put(
    pcp_store_t* store, const char* namespace_id, const json_t* policy);
// Every policy as {namespace_id: policy} in id order (caller owns
// |*out_policies|). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_federation_policy_list(pcp_store_t* store, json_t** out_policies);

#ifdef __cplusplus
}
#endif

// The knowledge-graph backends over this store (SQLite, FalkorDB) are part
// of the public API; their header is kept apart for size.
#include "store/graph_backend.h"  // IWYU pragma: export

#endif  // PCP_STORE_STORE_H_
