// SPDX-License-Identifier: Apache-2.0
//
// Private to src/roles/worker: the pieces of the device worker runtime.
//
//   - The program cache: VMFBs on disk named by their SHA-256, verified on
//     every read and written atomically, so a crash mid-write or a flipped
//     bit on disk is a cache miss (and a refetch), never a wrong program.
//   - The session store: resident tensors per session id, with byte
//     accounting and whole-session LRU eviction under a memory limit.
//   - The job queue: the bounded queue from the loop thread (which owns the
//     fabric connection) to the compute thread (which owns the IREE
//     backend), STYLE.md s.3.6.
//   - The runtime: the two threads wired to proto's worker state machine.
//
// The store holds opaque values with a release function, so its tests need
// no device; the runtime stores pcp_tensor_t references in it.

#ifndef PCP_ROLES_WORKER_WORKER_IMPL_H_
#define PCP_ROLES_WORKER_WORKER_IMPL_H_

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "obs/obs.h"
#include "roles/roles_impl.h"

//===----------------------------------------------------------------------===//
// Program cache
//===----------------------------------------------------------------------===//

// Layout: <directory>/<sha256 hex>.vmfb, one file per program, written by
// pcp_file_write_atomic (temp file, fsync, rename). The name is the content
// hash, so two workers sharing a directory can only ever write the same
// bytes to the same name.
typedef struct pcp_roles_worker_program_cache_t {
  char* directory;  // owned (|allocator|)
  pcp_allocator_t allocator;
} pcp_roles_worker_program_cache_t;

// Largest program the cache reads back (the compute module's bound).
#define PCP_ROLES_WORKER_MAX_PROGRAM_BYTES ((size_t)4 << 30)

// Creates |directory| (and parents) if needed. Thread-compatible.
// The directory string is copied with |allocator| (file contents read by
// load are plain malloc: pcp_file_read_all's contract).
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_worker_program_cache_initialize(
    const char* directory, pcp_allocator_t allocator,
    pcp_roles_worker_program_cache_t* out_cache);
// Thread-compatible (no call may be in progress).
void pcp_roles_worker_program_cache_deinitialize(
    pcp_roles_worker_program_cache_t* cache);

// Writes "<directory>/<hex>.vmfb" into |buffer|. INVALID_ARGUMENT when it
// does not fit. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_worker_program_cache_path(
    const pcp_roles_worker_program_cache_t* cache,
    const uint8_t program[PCP_SHA256_BYTE_LENGTH], char* buffer,
    size_t capacity);

// Reads the program and checks its SHA-256. NOT_FOUND when absent;
// DATA_LOSS when the bytes do not hash to |program| (the file is removed,
// so the next offer refetches it). |*out_data| is 64-byte aligned, owned
// by the caller (free()). Thread-safe (files are replaced atomically).
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_worker_program_cache_load(
    const pcp_roles_worker_program_cache_t* cache,
    const uint8_t program[PCP_SHA256_BYTE_LENGTH], void** out_data,
    size_t* out_byte_length);

// True when a verified copy is on disk (a corrupt copy is removed and
// reported absent). Other read errors are returned. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_worker_program_cache_lookup(
    const pcp_roles_worker_program_cache_t* cache,
    const uint8_t program[PCP_SHA256_BYTE_LENGTH], bool* out_found);

// Verifies |data| hashes to |program| (DATA_LOSS otherwise, nothing
// written) and writes it atomically. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_worker_program_cache_store(
    const pcp_roles_worker_program_cache_t* cache,
    const uint8_t program[PCP_SHA256_BYTE_LENGTH], const void* data,
    size_t byte_length);

//===----------------------------------------------------------------------===//
// Session store
//===----------------------------------------------------------------------===//

// Drops one reference of a stored value (pcp_tensor_release for tensors).
typedef void (*pcp_roles_worker_value_release_fn_t)(void* value);

typedef struct pcp_roles_worker_session_entry_t {
  char* name;  // owned
  void* value;
  size_t byte_length;
} pcp_roles_worker_session_entry_t;

typedef struct pcp_roles_worker_session_t {
  char* id;  // owned
  pcp_roles_worker_session_entry_t* entries;
  size_t entry_count;
  size_t entry_capacity;
  size_t byte_length;
  uint64_t last_used;  // store tick of the last get or put
} pcp_roles_worker_session_t;

// Thread-compatible: the compute thread owns it.
typedef struct pcp_roles_worker_session_store_t {
  pcp_roles_worker_session_t* sessions;
  size_t session_count;
  size_t session_capacity;
  size_t byte_length;        // all sessions
  size_t limit_byte_length;  // 0: unlimited
  uint64_t tick;
  pcp_roles_worker_value_release_fn_t release;
  pcp_allocator_t allocator;  // tables and names
} pcp_roles_worker_session_store_t;

// Most names per session and sessions per worker: a misbehaving gateway
// cannot grow the tables without bound (RESOURCE_EXHAUSTED beyond them).
#define PCP_ROLES_WORKER_MAX_SESSIONS 4096
#define PCP_ROLES_WORKER_MAX_SESSION_ENTRIES 4096

// Every session-store function is thread-compatible: one owner at a time
// (the compute thread in the runtime).
void pcp_roles_worker_session_store_initialize(
    size_t limit_byte_length, pcp_roles_worker_value_release_fn_t release,
    pcp_allocator_t allocator, pcp_roles_worker_session_store_t* out_store);
// Releases every value.
void pcp_roles_worker_session_store_deinitialize(
    pcp_roles_worker_session_store_t* store);

// Stores |value| (the store takes the caller's reference on success; on
// error the caller keeps it) as |name| in |session_id|, replacing (and
// releasing) an older value of that name. Does not evict: call
// enforce_limit after a task's puts. INVALID_ARGUMENT for an empty session
// id or name; RESOURCE_EXHAUSTED past the table maxima.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_worker_session_store_put(
    pcp_roles_worker_session_store_t* store, const char* session_id,
    const char* name, void* value, size_t byte_length);

// Borrowed value (NULL when absent); marks the session used.
void* pcp_roles_worker_session_store_get(
    pcp_roles_worker_session_store_t* store, const char* session_id,
    const char* name);

// Releases a whole session; false when there was none.
bool pcp_roles_worker_session_store_drop(
    pcp_roles_worker_session_store_t* store, const char* session_id);
void pcp_roles_worker_session_store_drop_all(
    pcp_roles_worker_session_store_t* store);

// Evicts whole sessions, least recently used first and never |keep_id|
// (may be NULL), until the store is within its limit. RESOURCE_EXHAUSTED
// when |keep_id| alone is over it (the caller decides what to drop).
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_worker_session_store_enforce_limit(
    pcp_roles_worker_session_store_t* store, const char* keep_id,
    size_t* out_evicted_count);

//===----------------------------------------------------------------------===//
// Job queue (loop thread -> compute thread)
//===----------------------------------------------------------------------===//

// A bounded FIFO of opaque job pointers: pushes never block (a full queue
// is RESOURCE_EXHAUSTED, which the loop thread turns into a task error),
// pops block until a job arrives or the queue is closed. Thread-safe.
typedef struct pcp_roles_worker_job_queue_t {
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  void** items;
  size_t capacity;
  size_t head;
  size_t count;
  bool closed;
  pcp_allocator_t allocator;
} pcp_roles_worker_job_queue_t;

// RESOURCE_EXHAUSTED when the ring cannot be allocated; INVALID_ARGUMENT
// for capacity 0. Thread-compatible.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_worker_job_queue_initialize(
    size_t capacity, pcp_allocator_t allocator,
    pcp_roles_worker_job_queue_t* out_queue);
// The queue must be empty or its jobs owned elsewhere; no thread may wait.
// Thread-compatible.
void pcp_roles_worker_job_queue_deinitialize(
    pcp_roles_worker_job_queue_t* queue);
// RESOURCE_EXHAUSTED when full, FAILED_PRECONDITION after close. Never
// blocks. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t
pcp_roles_worker_job_queue_push(pcp_roles_worker_job_queue_t* queue, void* job);
// Blocks for the next job; NULL once the queue is closed and empty.
// Thread-safe.
void* pcp_roles_worker_job_queue_pop(pcp_roles_worker_job_queue_t* queue);
// Wakes every waiter; later pushes fail; queued jobs can still be popped.
// Thread-safe.
void pcp_roles_worker_job_queue_close(pcp_roles_worker_job_queue_t* queue);
// Jobs queued now (a snapshot). Thread-safe.
size_t pcp_roles_worker_job_queue_count(pcp_roles_worker_job_queue_t* queue);

//===----------------------------------------------------------------------===//
// Metrics (--metrics-listen)
//===----------------------------------------------------------------------===//

// The worker's own /metrics: the worker is the process that holds the
// device allocator, the program cache and the fabric socket, so it serves
// them itself (docs/decisions.md). Every series carries backend, target and
// worker labels. Series handles are looked up once; updates are lock-free
// from any thread.
typedef struct pcp_roles_worker_metrics_t {
  pcp_obs_registry_t* registry;
  void* server;  // pcp_http_server_t*; NULL when not listening
  pcp_obs_series_t* device_memory;       // gauge, allocator live bytes
  pcp_obs_series_t* device_memory_peak;  // gauge
  pcp_obs_series_t* session_bytes;       // gauge, resident session tensors
  pcp_obs_series_t* tasks_succeeded;     // counter
  pcp_obs_series_t* tasks_failed;        // counter
  pcp_obs_series_t* received_bytes;      // counter
  pcp_obs_series_t* sent_bytes;          // counter
  pcp_obs_series_t* cache_hits;          // counter, program offers cached
  pcp_obs_series_t* cache_misses;        // counter, program offers fetched
} pcp_roles_worker_metrics_t;

// Creates the registry and series. |target| NULL or "": "default".
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_worker_metrics_initialize(
    const char* backend, const char* target, const char* worker_id,
    pcp_roles_worker_metrics_t* out_metrics);

// Splits --metrics-listen's "HOST:PORT" or "[V6]:PORT" (port 1..65535)
// into |host| and |out_port|. INVALID_ARGUMENT naming the flag otherwise.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_worker_metrics_listen_parse(
    const char* value, char* host, size_t host_capacity, uint16_t* out_port);

// Serves GET /metrics and /healthz on |listen| ("HOST:PORT", port 0:
// ephemeral) until deinitialize. UNAVAILABLE when it cannot bind.
PCP_MUST_USE_RESULT pcp_status_t
pcp_roles_worker_metrics_listen(pcp_roles_worker_metrics_t* metrics,
                                const char* listen, uint16_t* out_port);

// Stops the server and frees everything. Safe on a zeroed struct.
void pcp_roles_worker_metrics_deinitialize(pcp_roles_worker_metrics_t* metrics);

// Counter/gauge helpers that accept a NULL series.
void pcp_roles_worker_metrics_add(pcp_obs_series_t* series, double delta);
void pcp_roles_worker_metrics_set(pcp_obs_series_t* series, double value);

//===----------------------------------------------------------------------===//
// Runtime
//===----------------------------------------------------------------------===//

// Runs the worker until SIGTERM/SIGINT (drain, then exit 0) or a gateway
// SHUTDOWN (exit 0). Returns 1 when the worker cannot start (no backend,
// no join token, cache directory not writable). Call from main's thread,
// once; it becomes the loop thread.
int pcp_roles_worker_runtime_run(const pcp_roles_worker_config_t* config);

#endif  // PCP_ROLES_WORKER_WORKER_IMPL_H_
