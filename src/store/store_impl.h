// SPDX-License-Identifier: Apache-2.0
//
// store internals shared by the .c files of src/store (never included from
// outside the folder). Every helper here expects the store mutex to be held
// by the caller unless it says otherwise.

#ifndef PCP_STORE_STORE_IMPL_H_
#define PCP_STORE_STORE_IMPL_H_

#include <pthread.h>
#include <stdatomic.h>

#include <sqlite3.h>

#include "store/store.h"

// One slot per cached statement. Statements are prepared on first use with
// SQLITE_PREPARE_PERSISTENT and kept until pcp_store_release.
typedef enum pcp_store_stmt_id_e {
  PCP_STORE_STMT_BEGIN,
  PCP_STORE_STMT_BEGIN_READ,
  PCP_STORE_STMT_COMMIT,
  PCP_STORE_STMT_ROLLBACK,
  PCP_STORE_STMT_JOB_INSERT,
  PCP_STORE_STMT_JOB_GET,
  PCP_STORE_STMT_JOB_STATE_UPDATE,
  PCP_STORE_STMT_JOB_STEP_UPDATE,
  PCP_STORE_STMT_JOB_LIST,
  PCP_STORE_STMT_JOB_SEQ,
  PCP_STORE_STMT_EVENT_INSERT,
  PCP_STORE_STMT_EVENT_LIST,
  PCP_STORE_STMT_EVENT_LAST,
  PCP_STORE_STMT_RESULT_INSERT,
  PCP_STORE_STMT_RESULT_GET,
  PCP_STORE_STMT_RESULT_LIST,
  PCP_STORE_STMT_SERVICE_UPSERT,
  PCP_STORE_STMT_SERVICE_GET,
  PCP_STORE_STMT_SERVICE_HEARTBEAT,
  PCP_STORE_STMT_SERVICE_LIST,
  PCP_STORE_STMT_SERVICE_DELETE,
  PCP_STORE_STMT_SERVICE_EXPIRED,
  PCP_STORE_STMT_LEASE_UPSERT,
  PCP_STORE_STMT_LEASE_DELETE,
  PCP_STORE_STMT_LEASE_GET,
  PCP_STORE_STMT_LEASE_LIST,
  PCP_STORE_STMT_META_GET,
  PCP_STORE_STMT_META_MAX,
  PCP_STORE_STMT_RESERVATION_INSERT,
  PCP_STORE_STMT_RESERVATION_WORKER_INSERT,
  PCP_STORE_STMT_RESERVATION_DELETE,
  PCP_STORE_STMT_RESERVATION_LIST,
  PCP_STORE_STMT_RESERVATION_WORKERS,
  PCP_STORE_STMT_ENTITY_UPSERT,
  PCP_STORE_STMT_ENTITY_GET,
  PCP_STORE_STMT_ENTITY_DELETE,
  PCP_STORE_STMT_ENTITY_DELETE_RELATIONS,
  PCP_STORE_STMT_ENTITY_DELETE_OBSERVATIONS,
  PCP_STORE_STMT_RELATION_UPSERT,
  PCP_STORE_STMT_RELATION_DELETE,
  PCP_STORE_STMT_OBSERVATION_UPSERT,
  PCP_STORE_STMT_QUERY_ENTITIES,
  PCP_STORE_STMT_QUERY_RELATIONS,
  PCP_STORE_STMT_QUERY_OBSERVATIONS,
  PCP_STORE_STMT_NEIGHBOR_RELATIONS,
  PCP_STORE_STMT_MUTATION_FIND,
  PCP_STORE_STMT_MUTATION_INSERT,
  PCP_STORE_STMT_MUTATION_NAME,
  PCP_STORE_STMT_MUTATION_LIST,
  PCP_STORE_STMT_MUTATION_LAST,
  PCP_STORE_STMT_MUTATION_PENDING,
  PCP_STORE_STMT_CHECKPOINT_INSERT,
  PCP_STORE_STMT_CHECKPOINT_GET,
  PCP_STORE_STMT_CHECKPOINT_LATEST,
  PCP_STORE_STMT_CHECKPOINT_LIST,
  PCP_STORE_STMT_FED_GATEWAY_PUT,
  PCP_STORE_STMT_FED_GATEWAY_LIST,
  PCP_STORE_STMT_FED_GATEWAY_DELETE,
  PCP_STORE_STMT_FED_JOB_INSERT,
  PCP_STORE_STMT_FED_JOB_UPDATE,
  PCP_STORE_STMT_FED_JOB_GET,
  PCP_STORE_STMT_FED_JOB_LIST,
  PCP_STORE_STMT_FED_JOB_COUNT,
  PCP_STORE_STMT_FED_ACK_GET,
  PCP_STORE_STMT_FED_ACK_RAISE,
  PCP_STORE_STMT_FED_POLICY_PUT,
  PCP_STORE_STMT_FED_POLICY_LIST,
  PCP_STORE_STMT_COUNT_,
} pcp_store_stmt_id_t;

// Longest state dir: leaves room for checkpoints/<job id>/step-<n>.bin.tmp
// inside PCP_STORE_PATH_MAX_LENGTH.
#define PCP_STORE_STATE_DIR_MAX_LENGTH 512

struct pcp_store_t {
  pcp_allocator_t allocator;
  pcp_clock_t clock;
  pthread_mutex_t mutex;
  sqlite3* db;
  sqlite3_stmt* stmts[PCP_STORE_STMT_COUNT_];
  char state_dir[PCP_STORE_STATE_DIR_MAX_LENGTH + 1];
  // Makes checkpoint temp names unique per write (two threads writing the
  // same step never share a temp file).
  _Atomic uint64_t temp_counter;
  pcp_store_event_callback_t event_callback;
};

void pcp_store_lock(pcp_store_t* store);
void pcp_store_unlock(pcp_store_t* store);
int64_t pcp_store_now_ns(pcp_store_t* store);

// Maps a SQLite (extended) result code to a status carrying |message| and
// |what|. Exposed for the error-mapping test. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_status_from_sqlite(
    int result_code, const char* message, const char* what);
// Same, with the connection's current message.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_db_status(pcp_store_t* store,
                                                     int result_code,
                                                     const char* what);

// Returns the cached statement |id|, prepared from |sql| on first use, reset
// and with its bindings cleared.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_stmt_acquire(pcp_store_t* store, pcp_store_stmt_id_t id,
                       const char* sql, sqlite3_stmt** out_stmt);
// Steps a statement that returns no rows to completion and resets it.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_stmt_run(pcp_store_t* store,
                                                    sqlite3_stmt* stmt,
                                                    const char* what);
// Checks a chain of sqlite3_bind_* results (OR-ed together).
PCP_MUST_USE_RESULT pcp_status_t pcp_store_bind_check(pcp_store_t* store,
                                                      int bind_result);

// BEGIN IMMEDIATE: the write lock up front, so a transaction never fails
// half way with a lock upgrade.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_tx_begin(pcp_store_t* store);
// BEGIN DEFERRED: a read snapshot for queries that read several tables,
// without taking the write lock.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_tx_begin_read(pcp_store_t* store);
// COMMIT when |status| is OK (rolling back if the commit fails), else
// ROLLBACK; returns the first error.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_tx_finish(pcp_store_t* store,
                                                     pcp_status_t status);

// Input checks (INVALID_ARGUMENT naming |field|).
PCP_MUST_USE_RESULT pcp_status_t pcp_store_id_validate(const char* field,
                                                       const char* value,
                                                       bool allow_slash);
PCP_MUST_USE_RESULT pcp_status_t pcp_store_name_validate(const char* field,
                                                         const char* value,
                                                         size_t max_length,
                                                         bool allow_empty);
// Serializes |value| (NULL -> |default_text|) after checking size and depth;
// |require_object| refuses non-objects. The text comes from the system
// allocator: the caller frees it with
// pcp_allocator_free(pcp_allocator_system()).
PCP_MUST_USE_RESULT pcp_status_t pcp_store_json_encode(const char* field,
                                                       const json_t* value,
                                                       const char* default_text,
                                                       bool require_object,
                                                       char** out_text);
// Decodes a JSON column (NULL column -> *out_value NULL).
PCP_MUST_USE_RESULT pcp_status_t pcp_store_json_column(sqlite3_stmt* stmt,
                                                       int column,
                                                       json_t** out_value);
// Copies a text column into |buffer| (always NUL-terminated; "" for NULL).
void pcp_store_text_column(sqlite3_stmt* stmt, int column, char* buffer,
                           size_t capacity);

// Makes room for one more element of |element_size| in a list array.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_list_reserve(
    pcp_allocator_t allocator, size_t element_size, size_t count,
    size_t* inout_capacity, void** inout_items);
// 0 -> |default_limit|; capped at PCP_STORE_LIST_LIMIT_MAX.
uint32_t pcp_store_limit_normalize(uint32_t limit, uint32_t default_limit);

// Hex form of SHA-256 digests in the database.
void pcp_store_sha256_to_hex(const pcp_sha256_t* digest,
                             char out_hex[PCP_SHA256_HEX_LENGTH + 1]);
bool pcp_store_sha256_from_hex(const char* hex, pcp_sha256_t* out_digest);

// Raises jobs.last_committed_step and appends an event (tx held).
PCP_MUST_USE_RESULT pcp_status_t pcp_store_job_step_commit_locked(
    pcp_store_t* store, const char* id, int64_t step, const char* event_type,
    const json_t* event_payload, int64_t* out_event_id);

// The meta table: named integers (high-water marks). raise keeps the max.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_meta_raise_locked(pcp_store_t* store,
                                                             const char* key,
                                                             int64_t value);
PCP_MUST_USE_RESULT pcp_status_t pcp_store_meta_get_locked(pcp_store_t* store,
                                                           const char* key,
                                                           int64_t* out_value);

// After a public call that appended a job event: on success stores
// |event_id| in |out_event_id| (optional) and runs the event callback. Called
// with the store lock released. Returns |status|.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_event_committed(pcp_store_t* store, pcp_status_t status,
                          int64_t event_id, int64_t* out_event_id);

// Removes crash leftovers under <state_dir>/checkpoints/<job>/: temp files,
// and checkpoint files that no index row names (renamed into place by a
// writer that died before its commit). Called at open, before any writer.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_checkpoint_leftovers_remove(pcp_store_t* store);

// Raises gateway |gateway_id|'s acknowledged sequence to |sequence| (never
// lowers it) inside the caller's transaction, so an apply and its ack commit
// together (store/federation.c).
PCP_MUST_USE_RESULT pcp_status_t pcp_store_federation_ack_raise_locked(
    pcp_store_t* store, const char* gateway_id, int64_t sequence);

// Checks the filters of a graph query (ids, type names, text) by the
// rules the graph tables hold them to; both graph backends call it.
PCP_MUST_USE_RESULT pcp_status_t
pcp_store_graph_query_validate(const pcp_store_graph_query_t* query);
// The same for a neighbours request: the entity id, the optional relation
// type and the direction.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_graph_neighbors_validate(
    const char* entity_id, const char* relation_type,
    pcp_store_graph_direction_t direction);

#endif  // PCP_STORE_STORE_IMPL_H_
