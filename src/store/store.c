// SPDX-License-Identifier: Apache-2.0
// store: opening, migrations, the statement cache, transactions, error
// mapping and the input checks every table shares.

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <sqlite3.h>

#include "store/store_impl.h"

//===----------------------------------------------------------------------===//
// Migrations
//===----------------------------------------------------------------------===//

// Append-only: a released migration never changes (databases in the field
// already ran it); a schema change is a new entry. Tables are STRICT so a
// column never silently holds the wrong type. JSON columns carry no
// CHECK (json_valid(...)): every one is written from a jansson dump, and
// SQLite 3.40's json_valid() answers false when it runs out of memory, which
// turned an allocation failure into a spurious constraint error (OOM sweep).
// Readers treat unparsable JSON as DATA_LOSS.
static const char* const kMigrations[] = {
    // 1: jobs, their events and results.
    "CREATE TABLE jobs ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  id TEXT NOT NULL UNIQUE,"
    "  kind TEXT NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('queued','placing','compiling',"
    "    'running','succeeded','failed','cancelling','cancelled')),"
    "  spec TEXT NOT NULL,"
    "  placement TEXT,"
    "  created_at_ns INTEGER NOT NULL,"
    "  updated_at_ns INTEGER NOT NULL,"
    "  attempt INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),"
    "  last_committed_step INTEGER NOT NULL DEFAULT -1,"
    "  error TEXT NOT NULL DEFAULT ''"
    ") STRICT;"
    "CREATE INDEX jobs_by_state ON jobs(state, seq);"
    "CREATE INDEX jobs_by_kind ON jobs(kind, seq);"
    "CREATE TABLE job_events ("
    "  event_id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  job_id TEXT NOT NULL REFERENCES jobs(id),"
    "  type TEXT NOT NULL,"
    "  from_state TEXT,"
    "  to_state TEXT,"
    "  payload TEXT NOT NULL,"
    "  created_at_ns INTEGER NOT NULL"
    ") STRICT;"
    "CREATE INDEX job_events_by_job ON job_events(job_id, event_id);"
    "CREATE TRIGGER job_events_append_only_update BEFORE UPDATE ON job_events"
    " BEGIN SELECT RAISE(ABORT, 'job_events is append-only'); END;"
    "CREATE TRIGGER job_events_append_only_delete BEFORE DELETE ON job_events"
    " BEGIN SELECT RAISE(ABORT, 'job_events is append-only'); END;"
    "CREATE TABLE job_results ("
    "  job_id TEXT NOT NULL REFERENCES jobs(id),"
    "  name TEXT NOT NULL,"
    "  dtype TEXT NOT NULL,"
    "  shape TEXT NOT NULL,"
    "  byte_length INTEGER NOT NULL CHECK (byte_length >= 0),"
    "  sha256 TEXT NOT NULL CHECK (length(sha256) = 64),"
    "  path TEXT NOT NULL,"
    "  created_at_ns INTEGER NOT NULL,"
    "  PRIMARY KEY (job_id, name)"
    ") STRICT;",

    // 2: services, leases, reservations and a small counter table.
    "CREATE TABLE services ("
    "  executor_id TEXT PRIMARY KEY,"
    "  service_id TEXT NOT NULL,"
    "  service_type TEXT NOT NULL,"
    "  base_url TEXT NOT NULL,"
    "  attributes TEXT NOT NULL,"
    "  ttl_ns INTEGER NOT NULL CHECK (ttl_ns > 0),"
    "  registered_at_ns INTEGER NOT NULL,"
    "  updated_at_ns INTEGER NOT NULL,"
    "  heartbeat_at_ns INTEGER NOT NULL,"
    "  expires_at_ns INTEGER NOT NULL"
    ") STRICT;"
    "CREATE INDEX services_by_expiry ON services(expires_at_ns);"
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)"
    " STRICT;"
    "CREATE TABLE leases ("
    "  lease_id INTEGER PRIMARY KEY CHECK (lease_id > 0),"
    "  owner TEXT NOT NULL,"
    "  worker_id TEXT NOT NULL,"
    "  tag INTEGER NOT NULL,"
    "  job_id TEXT NOT NULL,"
    "  deadline_ns INTEGER NOT NULL,"
    "  updated_at_ns INTEGER NOT NULL"
    ") STRICT;"
    "CREATE TABLE reservations ("
    "  reservation_id INTEGER PRIMARY KEY CHECK (reservation_id > 0),"
    "  owner TEXT NOT NULL,"
    "  tag INTEGER NOT NULL,"
    "  deadline_ns INTEGER NOT NULL,"
    "  worker_count INTEGER NOT NULL CHECK (worker_count > 0),"
    "  created_at_ns INTEGER NOT NULL"
    ") STRICT;"
    "CREATE TABLE reservation_workers ("
    "  reservation_id INTEGER NOT NULL"
    "    REFERENCES reservations(reservation_id) ON DELETE CASCADE,"
    "  position INTEGER NOT NULL,"
    "  worker_id TEXT NOT NULL,"
    "  PRIMARY KEY (reservation_id, position),"
    "  UNIQUE (reservation_id, worker_id)"
    ") STRICT;",

    // 3: the knowledge graph and its mutation log.
    "CREATE TABLE graph_entities ("
    "  entity_id TEXT PRIMARY KEY,"
    "  namespace_id TEXT NOT NULL,"
    "  entity_type TEXT NOT NULL,"
    "  display_name TEXT NOT NULL,"
    "  visibility TEXT NOT NULL CHECK (visibility IN"
    "    ('local','shared','global')),"
    "  properties TEXT NOT NULL,"
    "  provenance TEXT NOT NULL,"
    "  created_at_ns INTEGER NOT NULL,"
    "  updated_at_ns INTEGER NOT NULL"
    ") STRICT;"
    "CREATE INDEX graph_entities_by_type ON graph_entities(entity_type);"
    "CREATE TABLE graph_relations ("
    "  relation_id TEXT PRIMARY KEY,"
    "  namespace_id TEXT NOT NULL,"
    "  relation_type TEXT NOT NULL,"
    "  from_entity_id TEXT NOT NULL,"
    "  to_entity_id TEXT NOT NULL,"
    "  visibility TEXT NOT NULL CHECK (visibility IN"
    "    ('local','shared','global')),"
    "  properties TEXT NOT NULL,"
    "  provenance TEXT NOT NULL,"
    "  created_at_ns INTEGER NOT NULL,"
    "  updated_at_ns INTEGER NOT NULL"
    ") STRICT;"
    "CREATE INDEX graph_relations_by_from ON graph_relations(from_entity_id);"
    "CREATE INDEX graph_relations_by_to ON graph_relations(to_entity_id);"
    "CREATE INDEX graph_relations_by_type ON graph_relations(relation_type);"
    "CREATE TABLE graph_observations ("
    "  observation_id TEXT PRIMARY KEY,"
    "  namespace_id TEXT NOT NULL,"
    "  subject_entity_id TEXT NOT NULL,"
    "  observation_type TEXT NOT NULL,"
    "  visibility TEXT NOT NULL CHECK (visibility IN"
    "    ('local','shared','global')),"
    "  payload TEXT NOT NULL,"
    "  provenance TEXT NOT NULL,"
    "  created_at_ns INTEGER NOT NULL"
    ") STRICT;"
    "CREATE INDEX graph_observations_by_subject"
    "  ON graph_observations(subject_entity_id);"
    "CREATE TABLE mutation_log ("
    "  sequence_no INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  mutation_id TEXT UNIQUE,"
    "  namespace_id TEXT NOT NULL,"
    "  mutation_type TEXT NOT NULL,"
    "  target_id TEXT NOT NULL,"
    "  payload TEXT NOT NULL,"
    "  visibility TEXT NOT NULL CHECK (visibility IN"
    "    ('local','shared','global')),"
    "  provenance TEXT NOT NULL,"
    "  timestamp_ns INTEGER NOT NULL"
    ") STRICT;"
    // The only update allowed names an unnamed record (mut_{seq}) in the
    // transaction that inserted it.
    "CREATE TRIGGER mutation_log_append_only_update"
    " BEFORE UPDATE ON mutation_log WHEN OLD.mutation_id IS NOT NULL"
    " BEGIN SELECT RAISE(ABORT, 'mutation_log is append-only'); END;"
    "CREATE TRIGGER mutation_log_append_only_delete"
    " BEFORE DELETE ON mutation_log"
    " BEGIN SELECT RAISE(ABORT, 'mutation_log is append-only'); END;",

    // 4: the checkpoint index.
    "CREATE TABLE checkpoints ("
    "  job_id TEXT NOT NULL REFERENCES jobs(id),"
    "  step INTEGER NOT NULL CHECK (step >= 0),"
    "  path TEXT NOT NULL,"
    "  sha256 TEXT NOT NULL CHECK (length(sha256) = 64),"
    "  byte_length INTEGER NOT NULL CHECK (byte_length >= 0),"
    "  created_at_ns INTEGER NOT NULL,"
    "  PRIMARY KEY (job_id, step)"
    ") STRICT;",

    // 5: the federation hub's state (store/federation.c): gateway
    // registrations, global jobs (numbered by AUTOINCREMENT, so a number is
    // never reused, across restarts included), the sequence acknowledged
    // per gateway and the hub's graph policies.
    "CREATE TABLE federation_gateways ("
    "  gateway_id TEXT PRIMARY KEY,"
    "  registration TEXT NOT NULL,"
    "  connected_at_ns INTEGER NOT NULL,"
    "  last_seen_ns INTEGER NOT NULL"
    ") STRICT;"
    "CREATE TABLE federation_global_jobs ("
    "  number INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  kind TEXT NOT NULL CHECK (kind IN ('training','rl')),"
    "  state TEXT NOT NULL CHECK (state IN"
    "    ('placing','submitted','rejected','cancelling')),"
    "  assignment TEXT NOT NULL,"
    "  child_job_id TEXT,"
    "  child TEXT,"
    "  error TEXT,"
    "  submitted_at_ns INTEGER NOT NULL,"
    "  updated_at_ns INTEGER NOT NULL"
    ") STRICT;"
    "CREATE TABLE federation_acks ("
    "  gateway_id TEXT PRIMARY KEY,"
    "  acked_sequence INTEGER NOT NULL CHECK (acked_sequence >= 0),"
    "  updated_at_ns INTEGER NOT NULL"
    ") STRICT;"
    "CREATE TABLE federation_policies ("
    "  namespace_id TEXT PRIMARY KEY,"
    "  policy TEXT NOT NULL,"
    "  updated_at_ns INTEGER NOT NULL"
    ") STRICT;",
};
static_assert(PCP_ARRAYSIZE(kMigrations) == PCP_STORE_SCHEMA_VERSION,
              "one migration per schema version");

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

static pcp_status_code_t code_from_sqlite(int result_code) {
  switch (result_code) {
    case SQLITE_CONSTRAINT_PRIMARYKEY:
    case SQLITE_CONSTRAINT_UNIQUE:
      return PCP_STATUS_ALREADY_EXISTS;
    case SQLITE_IOERR_NOMEM:
      return PCP_STATUS_RESOURCE_EXHAUSTED;
    default:
      break;
  }
  switch (result_code & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_IOERR:
    case SQLITE_CANTOPEN:
    case SQLITE_PROTOCOL:
      return PCP_STATUS_UNAVAILABLE;
    case SQLITE_FULL:
    case SQLITE_NOMEM:
    case SQLITE_TOOBIG:
      return PCP_STATUS_RESOURCE_EXHAUSTED;
    case SQLITE_CONSTRAINT:
      return PCP_STATUS_FAILED_PRECONDITION;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return PCP_STATUS_DATA_LOSS;
    case SQLITE_PERM:
    case SQLITE_READONLY:
    case SQLITE_AUTH:
      return PCP_STATUS_PERMISSION_DENIED;
    case SQLITE_INTERRUPT:
    case SQLITE_ABORT:
      return PCP_STATUS_ABORTED;
    case SQLITE_RANGE:
    case SQLITE_MISMATCH:
      return PCP_STATUS_INVALID_ARGUMENT;
    default:
      return PCP_STATUS_INTERNAL;
  }
}

pcp_status_t pcp_store_status_from_sqlite(int result_code, const char* message,
                                          const char* what) {
  if (result_code == SQLITE_OK || result_code == SQLITE_DONE ||
      result_code == SQLITE_ROW) {
    return pcp_ok_status();
  }
  return pcp_make_status(code_from_sqlite(result_code),
                         "%s: sqlite error %d (%s): %s", what, result_code,
                         sqlite3_errstr(result_code), message ? message : "");
}

pcp_status_t pcp_store_db_status(pcp_store_t* store, int result_code,
                                 const char* what) {
  return pcp_store_status_from_sqlite(result_code, sqlite3_errmsg(store->db),
                                      what);
}

//===----------------------------------------------------------------------===//
// Statements and transactions
//===----------------------------------------------------------------------===//

void pcp_store_lock(pcp_store_t* store) {
  PCP_ASSERT(pthread_mutex_lock(&store->mutex) == 0);
}

void pcp_store_unlock(pcp_store_t* store) {
  PCP_ASSERT(pthread_mutex_unlock(&store->mutex) == 0);
}

int64_t pcp_store_now_ns(pcp_store_t* store) {
  return pcp_clock_wall_ns(store->clock);
}

pcp_status_t pcp_store_stmt_acquire(pcp_store_t* store, pcp_store_stmt_id_t id,
                                    const char* sql, sqlite3_stmt** out_stmt) {
  *out_stmt = NULL;
  sqlite3_stmt* stmt = store->stmts[id];
  if (!stmt) {
    int rc = sqlite3_prepare_v3(store->db, sql, -1, SQLITE_PREPARE_PERSISTENT,
                                &stmt, NULL);
    if (rc != SQLITE_OK) {
      return pcp_store_db_status(store, rc, "prepare");
    }
    store->stmts[id] = stmt;
  }
  // Statements are reset after every use (so no read snapshot outlives a
  // call and blocks WAL checkpoints); resetting again here is cheap and
  // covers an early return that forgot.
  sqlite3_reset(stmt);
  sqlite3_clear_bindings(stmt);
  *out_stmt = stmt;
  return pcp_ok_status();
}

pcp_status_t pcp_store_stmt_run(pcp_store_t* store, sqlite3_stmt* stmt,
                                const char* what) {
  int rc = sqlite3_step(stmt);
  pcp_status_t status = pcp_ok_status();
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
    status = pcp_store_db_status(store, rc, what);
  }
  sqlite3_reset(stmt);
  return status;
}

pcp_status_t pcp_store_bind_check(pcp_store_t* store, int bind_result) {
  if (bind_result == SQLITE_OK) {
    return pcp_ok_status();
  }
  // Call sites OR several bind results together, so |bind_result| is only
  // "not OK". The connection's error code names the failure, except after an
  // out-of-memory bind, which SQLite does not always leave there (the OOM
  // sweep found a NOMEM bind reported as OK and a NULL bound instead).
  int code = sqlite3_errcode(store->db);
  if (code == SQLITE_OK || code == SQLITE_ROW || code == SQLITE_DONE) {
    code = bind_result == SQLITE_TOOBIG ? SQLITE_TOOBIG : SQLITE_NOMEM;
    return pcp_store_status_from_sqlite(code, "binding a parameter failed",
                                        "bind");
  }
  return pcp_store_db_status(store, code, "bind");
}

pcp_status_t pcp_store_tx_begin(pcp_store_t* store) {
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(store, PCP_STORE_STMT_BEGIN,
                                                  "BEGIN IMMEDIATE", &stmt));
  return pcp_store_stmt_run(store, stmt, "begin");
}

pcp_status_t pcp_store_tx_begin_read(pcp_store_t* store) {
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_BEGIN_READ, "BEGIN DEFERRED", &stmt));
  return pcp_store_stmt_run(store, stmt, "begin");
}

static void tx_rollback(pcp_store_t* store) {
  // After some errors (SQLITE_FULL, IOERR) SQLite has already rolled back;
  // ROLLBACK then fails with "no transaction is active", which is fine.
  if (sqlite3_get_autocommit(store->db)) {
    return;
  }
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status =
      pcp_store_stmt_acquire(store, PCP_STORE_STMT_ROLLBACK, "ROLLBACK", &stmt);
  if (!status) {
    status = pcp_store_stmt_run(store, stmt, "rollback");
  }
  pcp_status_ignore(status);
}

pcp_status_t pcp_store_tx_finish(pcp_store_t* store, pcp_status_t status) {
  if (!status) {
    sqlite3_stmt* stmt = NULL;
    status =
        pcp_store_stmt_acquire(store, PCP_STORE_STMT_COMMIT, "COMMIT", &stmt);
    if (!status) {
      status = pcp_store_stmt_run(store, stmt, "commit");
    }
  }
  if (status) {
    tx_rollback(store);
  }
  return status;
}

//===----------------------------------------------------------------------===//
// Input checks and JSON
//===----------------------------------------------------------------------===//

pcp_status_t pcp_store_id_validate(const char* field, const char* value,
                                   bool allow_slash) {
  if (!value || !value[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s is empty", field);
  }
  size_t length = strnlen(value, PCP_STORE_ID_MAX_LENGTH + 1);
  if (length > PCP_STORE_ID_MAX_LENGTH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s is longer than %d bytes", field,
                           PCP_STORE_ID_MAX_LENGTH);
  }
  if (strcmp(value, ".") == 0 || strcmp(value, "..") == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s '%s' is reserved",
                           field, value);
  }
  for (size_t i = 0; i < length; ++i) {
    char c = value[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-' ||
              c == ':' || c == '@' || (allow_slash && c == '/');
    if (!ok) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%s has a byte 0x%02x outside [A-Za-z0-9._:@%s-]",
                             field, (unsigned)(unsigned char)c,
                             allow_slash ? "/" : "");
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_store_name_validate(const char* field, const char* value,
                                     size_t max_length, bool allow_empty) {
  if (!value) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s is missing", field);
  }
  size_t length = strnlen(value, max_length + 1);
  if (length == 0 && !allow_empty) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s is empty", field);
  }
  if (length > max_length) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s is longer than %zu bytes", field, max_length);
  }
  for (size_t i = 0; i < length; ++i) {
    unsigned char c = (unsigned char)value[i];
    if (c < 0x20 || c == 0x7f) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "%s has a control byte 0x%02x", field, c);
    }
  }
  return pcp_ok_status();
}

// Depth of |value|, stopping as soon as it passes |limit| (so a hostile
// value costs at most limit frames of recursion).
static bool json_depth_within(const json_t* value, int depth, int limit) {
  if (depth > limit) {
    return false;
  }
  if (json_is_object(value)) {
    const char* key;
    json_t* child;
    json_object_foreach((json_t*)value, key, child) {
      if (!json_depth_within(child, depth + 1, limit)) {
        return false;
      }
    }
  } else if (json_is_array(value)) {
    size_t index;
    json_t* child;
    json_array_foreach(value, index, child) {
      if (!json_depth_within(child, depth + 1, limit)) {
        return false;
      }
    }
  }
  return true;
}

pcp_status_t pcp_store_json_encode(const char* field, const json_t* value,
                                   const char* default_text,
                                   bool require_object, char** out_text) {
  *out_text = NULL;
  if (!value) {
    pcp_status_t status =
        pcp_allocator_strdup(pcp_allocator_system(), default_text, out_text);
    if (status) {
      pcp_status_ignore(status);
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "%s: out of memory",
                             field);
    }
    return pcp_ok_status();
  }
  if (require_object && !json_is_object(value)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s must be a JSON object", field);
  }
  if (!json_depth_within(value, 1, PCP_STORE_JSON_MAX_DEPTH)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s is nested deeper than %d levels", field,
                           PCP_STORE_JSON_MAX_DEPTH);
  }
  // json_dumpb with a NULL buffer measures without building the text, so an
  // oversized value is refused before any copy is made.
  size_t size = json_dumpb(value, NULL, 0, JSON_COMPACT | JSON_ENCODE_ANY);
  if (size == 0) {
    // jansson refuses NaN and invalid UTF-8 when values are built and the
    // depth (so cycles too) is bounded above, so a failed dump is an
    // allocation failure (found by the OOM sweep; it was INVALID_ARGUMENT).
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "%s: out of memory serializing JSON", field);
  }
  if (size > PCP_STORE_JSON_MAX_BYTE_LENGTH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s is %zu bytes of JSON, over the %u byte limit",
                           field, size, PCP_STORE_JSON_MAX_BYTE_LENGTH);
  }
  // Dumped into a buffer of the measured size rather than with json_dumps:
  // jansson 2.14 ignores a failed append of an object key inside json_dumps
  // and returns text with the key missing (`{"from":null,":"queued"}`), which
  // the OOM sweep caught being stored. Dumping into a fixed buffer needs no
  // growth, so that append cannot fail, and the length is checked anyway.
  char* text = NULL;
  pcp_status_t allocated =
      pcp_allocator_malloc(pcp_allocator_system(), size + 1, (void**)&text);
  if (allocated) {
    pcp_status_ignore(allocated);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "%s: out of memory serializing JSON", field);
  }
  size_t written =
      json_dumpb(value, text, size, JSON_COMPACT | JSON_ENCODE_ANY);
  if (written != size) {
    pcp_allocator_free(pcp_allocator_system(), text);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "%s: out of memory serializing JSON", field);
  }
  text[size] = '\0';
  *out_text = text;
  return pcp_ok_status();
}

pcp_status_t pcp_store_json_column(sqlite3_stmt* stmt, int column,
                                   json_t** out_value) {
  *out_value = NULL;
  if (sqlite3_column_type(stmt, column) == SQLITE_NULL) {
    return pcp_ok_status();
  }
  const char* text = (const char*)sqlite3_column_text(stmt, column);
  int size = sqlite3_column_bytes(stmt, column);
  if (!text) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory reading a JSON column");
  }
  // Zeroed first: on some allocation failures jansson returns NULL without
  // touching |error| (the OOM sweep saw stack garbage as the error code).
  json_error_t error;
  memset(&error, 0, sizeof(error));
  json_t* value = json_loadb(text, (size_t)size, JSON_DECODE_ANY, &error);
  if (!value) {
    // jansson's lexer reports some allocation failures as syntax errors
    // ("string or '}' expected", OOM sweep). Stored JSON was produced by
    // jansson, so one retry tells a transient allocation failure from bytes
    // that are really bad; under lasting memory pressure the message below
    // says both are possible.
    memset(&error, 0, sizeof(error));
    value = json_loadb(text, (size_t)size, JSON_DECODE_ANY, &error);
  }
  if (!value) {
    // jansson leaves some allocation failures unlabelled (code unknown,
    // empty text; seen in the OOM sweep): only a labelled syntax problem
    // means the stored bytes are bad.
    enum json_error_code code = json_error_code(&error);
    if (code == json_error_out_of_memory || code == json_error_unknown) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "out of memory decoding a JSON column");
    }
    // Every JSON column is written from a jansson dump: a damaged file.
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "stored JSON in column %d does not parse: %s "
                           "(jansson error %d; a damaged file, or memory ran "
                           "out twice)",
                           column, error.text, (int)code);
  }
  *out_value = value;
  return pcp_ok_status();
}

void pcp_store_text_column(sqlite3_stmt* stmt, int column, char* buffer,
                           size_t capacity) {
  const char* text = (const char*)sqlite3_column_text(stmt, column);
  size_t size = text ? (size_t)sqlite3_column_bytes(stmt, column) : 0;
  if (size >= capacity) {
    size = capacity - 1;
  }
  if (size) {
    memcpy(buffer, text, size);
  }
  buffer[size] = '\0';
}

pcp_status_t pcp_store_list_reserve(pcp_allocator_t allocator,
                                    size_t element_size, size_t count,
                                    size_t* inout_capacity,
                                    void** inout_items) {
  if (count < *inout_capacity) {
    return pcp_ok_status();
  }
  size_t capacity = *inout_capacity ? *inout_capacity * 2 : 16;
  void* items = *inout_items;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_realloc(allocator, capacity * element_size, &items),
      "growing a store list");
  memset((char*)items + count * element_size, 0,
         (capacity - count) * element_size);
  *inout_items = items;
  *inout_capacity = capacity;
  return pcp_ok_status();
}

uint32_t pcp_store_limit_normalize(uint32_t limit, uint32_t default_limit) {
  if (limit == 0) {
    limit = default_limit;
  }
  return limit > PCP_STORE_LIST_LIMIT_MAX ? PCP_STORE_LIST_LIMIT_MAX : limit;
}

void pcp_store_sha256_to_hex(const pcp_sha256_t* digest,
                             char out_hex[PCP_SHA256_HEX_LENGTH + 1]) {
  pcp_sha256_to_hex(digest, out_hex);
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1;
}

bool pcp_store_sha256_from_hex(const char* hex, pcp_sha256_t* out_digest) {
  if (!hex || strlen(hex) != PCP_SHA256_HEX_LENGTH) {
    return false;
  }
  for (size_t i = 0; i < PCP_SHA256_BYTE_LENGTH; ++i) {
    int high = hex_value(hex[2 * i]);
    int low = hex_value(hex[2 * i + 1]);
    if (high < 0 || low < 0) {
      return false;
    }
    out_digest->bytes[i] = (uint8_t)(high * 16 + low);
  }
  return true;
}

//===----------------------------------------------------------------------===//
// Opening
//===----------------------------------------------------------------------===//

void pcp_store_options_initialize(pcp_store_options_t* out_options) {
  memset(out_options, 0, sizeof(*out_options));
  out_options->clock = pcp_clock_system();
  out_options->sync_mode = PCP_STORE_SYNC_FULL;
  out_options->busy_timeout_ms = 5000;
}

static pcp_status_t exec_sql(pcp_store_t* store, const char* sql,
                             const char* what) {
  char* message = NULL;
  int rc = sqlite3_exec(store->db, sql, NULL, NULL, &message);
  if (rc == SQLITE_OK) {
    return pcp_ok_status();
  }
  pcp_status_t status = pcp_store_status_from_sqlite(
      rc, message ? message : sqlite3_errmsg(store->db), what);
  sqlite3_free(message);
  return status;
}

// Runs a one-row, one-column query and returns its integer (0 when no row
// or NULL).
static pcp_status_t query_int64(pcp_store_t* store, const char* sql,
                                int64_t* out_value) {
  *out_value = 0;
  sqlite3_stmt* stmt = NULL;
  int rc = sqlite3_prepare_v2(store->db, sql, -1, &stmt, NULL);
  if (rc != SQLITE_OK) {
    return pcp_store_db_status(store, rc, sql);
  }
  rc = sqlite3_step(stmt);
  pcp_status_t status = pcp_ok_status();
  if (rc == SQLITE_ROW) {
    *out_value = sqlite3_column_int64(stmt, 0);
  } else if (rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, sql);
  }
  sqlite3_finalize(stmt);
  return status;
}

static pcp_status_t schema_version_read(pcp_store_t* store,
                                        int32_t* out_version) {
  int64_t version = 0;
  PCP_RETURN_IF_ERROR_BARE(query_int64(
      store, "SELECT coalesce(max(version), 0) FROM schema_version", &version));
  *out_version = (int32_t)version;
  return pcp_ok_status();
}

static pcp_status_t migrate(pcp_store_t* store, int32_t target_version) {
  PCP_RETURN_IF_ERROR(exec_sql(store,
                               "CREATE TABLE IF NOT EXISTS schema_version ("
                               "  version INTEGER PRIMARY KEY,"
                               "  applied_at_ns INTEGER NOT NULL) STRICT",
                               "create schema_version"),
                      "opening the store");
  int32_t version = 0;
  PCP_RETURN_IF_ERROR_BARE(schema_version_read(store, &version));
  if (version > PCP_STORE_SCHEMA_VERSION) {
    return pcp_make_status(
        PCP_STATUS_FAILED_PRECONDITION,
        "the state database has schema version %d, newer than this binary's "
        "%d: run a newer pcp on this state dir (nothing was changed)",
        (int)version, PCP_STORE_SCHEMA_VERSION);
  }
  for (int32_t next = version + 1; next <= target_version; ++next) {
    // Each migration and its schema_version row commit together, so a crash
    // mid-migration leaves the previous version intact and the next open
    // runs it again.
    pcp_status_t status = exec_sql(store, "BEGIN IMMEDIATE", "begin migration");
    if (!status) {
      status = exec_sql(store, kMigrations[next - 1], "migration");
    }
    if (!status) {
      char sql[128];
      snprintf(sql, sizeof(sql),
               "INSERT INTO schema_version(version, applied_at_ns) "
               "VALUES (%d, %lld)",
               (int)next, (long long)pcp_store_now_ns(store));
      status = exec_sql(store, sql, "record migration");
    }
    if (!status) {
      status = exec_sql(store, "COMMIT", "commit migration");
    }
    if (status) {
      if (!sqlite3_get_autocommit(store->db)) {
        pcp_status_ignore(exec_sql(store, "ROLLBACK", "rollback migration"));
      }
      return pcp_status_annotate_f(status, "migrating the store to version %d",
                                   (int)next);
    }
  }
  return pcp_ok_status();
}

static pcp_status_t open_database(pcp_store_t* store,
                                  const pcp_store_options_t* options) {
  char path[PCP_STORE_PATH_MAX_LENGTH + 1];
  snprintf(path, sizeof(path), "%s/pcp.db", store->state_dir);
  // NOMUTEX: the store's own mutex serializes every use of the connection.
  int rc = sqlite3_open_v2(
      path, &store->db,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
  if (rc != SQLITE_OK) {
    pcp_status_t status =
        store->db ? pcp_store_db_status(store, rc, "open")
                  : pcp_store_status_from_sqlite(rc, "out of memory", "open");
    return pcp_status_annotate_f(status, "opening %s", path);
  }
  sqlite3_extended_result_codes(store->db, 1);
  sqlite3_busy_timeout(store->db, options->busy_timeout_ms);
  // journal_mode answers with the mode it ended in; anything but "wal" (a
  // read-only file system, say) is an error rather than a silent downgrade.
  sqlite3_stmt* stmt = NULL;
  rc =
      sqlite3_prepare_v2(store->db, "PRAGMA journal_mode=WAL", -1, &stmt, NULL);
  if (rc != SQLITE_OK) {
    return pcp_status_annotate_f(pcp_store_db_status(store, rc, "journal_mode"),
                                 "opening %s", path);
  }
  rc = sqlite3_step(stmt);
  char mode[16] = "";
  if (rc == SQLITE_ROW) {
    pcp_store_text_column(stmt, 0, mode, sizeof(mode));
  }
  pcp_status_t status = rc == SQLITE_ROW
                            ? pcp_ok_status()
                            : pcp_store_db_status(store, rc, "journal_mode");
  sqlite3_finalize(stmt);
  PCP_RETURN_IF_ERROR(status, "opening %s", path);
  if (strcmp(mode, "wal") != 0) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "%s: journal mode is '%s', WAL is required", path,
                           mode);
  }
  PCP_RETURN_IF_ERROR(exec_sql(store,
                               options->sync_mode == PCP_STORE_SYNC_NORMAL
                                   ? "PRAGMA synchronous=NORMAL"
                                   : "PRAGMA synchronous=FULL",
                               "synchronous"),
                      "opening %s", path);
  // Foreign keys are per connection and off by default; the pragma is a
  // no-op inside a transaction, so it runs before any.
  PCP_RETURN_IF_ERROR(exec_sql(store, "PRAGMA foreign_keys=ON", "foreign_keys"),
                      "opening %s", path);
  int32_t target = options->schema_version_limit > 0
                       ? options->schema_version_limit
                       : PCP_STORE_SCHEMA_VERSION;
  PCP_RETURN_IF_ERROR(migrate(store, target), "opening %s", path);
  return pcp_ok_status();
}

pcp_status_t pcp_store_create(const pcp_store_options_t* options,
                              pcp_allocator_t allocator,
                              pcp_store_t** out_store) {
  *out_store = NULL;
  if (!options || !options->state_dir || !options->state_dir[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "store options need a state_dir");
  }
  if (strlen(options->state_dir) > PCP_STORE_STATE_DIR_MAX_LENGTH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "state_dir is longer than %d bytes",
                           PCP_STORE_STATE_DIR_MAX_LENGTH);
  }
  if (!options->clock.wall_ns) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "store options need a clock");
  }
  if (options->busy_timeout_ms < 0 ||
      (options->sync_mode != PCP_STORE_SYNC_FULL &&
       options->sync_mode != PCP_STORE_SYNC_NORMAL) ||
      options->schema_version_limit < 0 ||
      options->schema_version_limit > PCP_STORE_SCHEMA_VERSION) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "store options out of range (busy_timeout_ms %d, "
                           "sync_mode %d, schema_version_limit %d)",
                           (int)options->busy_timeout_ms,
                           (int)options->sync_mode,
                           (int)options->schema_version_limit);
  }
  PCP_RETURN_IF_ERROR(pcp_file_make_directories(options->state_dir),
                      "creating state_dir %s", options->state_dir);
  pcp_store_t* store = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(allocator, sizeof(*store), (void**)&store),
      "allocating the store");
  store->allocator = allocator;
  store->clock = options->clock;
  store->event_callback = options->event_callback;
  snprintf(store->state_dir, sizeof(store->state_dir), "%s",
           options->state_dir);
  if (pthread_mutex_init(&store->mutex, NULL) != 0) {
    pcp_allocator_free(allocator, store);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "cannot initialize the store mutex");
  }
  pcp_status_t status = open_database(store, options);
  if (!status) {
    status = pcp_store_checkpoint_leftovers_remove(store);
  }
  if (status) {
    pcp_store_release(store);
    return status;
  }
  *out_store = store;
  return pcp_ok_status();
}

void pcp_store_release(pcp_store_t* store) {
  if (!store) {
    return;
  }
  for (size_t i = 0; i < PCP_STORE_STMT_COUNT_; ++i) {
    sqlite3_finalize(store->stmts[i]);
  }
  // sqlite3_close (not _v2) fails loudly if a statement were still open; all
  // are finalized above. Closing the last connection checkpoints the WAL.
  if (store->db) {
    sqlite3_close(store->db);
  }
  pthread_mutex_destroy(&store->mutex);
  pcp_allocator_free(store->allocator, store);
}

const char* pcp_store_state_dir(const pcp_store_t* store) {
  return store->state_dir;
}

pcp_status_t pcp_store_schema_version_query(pcp_store_t* store,
                                            int32_t* out_version) {
  pcp_store_lock(store);
  pcp_status_t status = schema_version_read(store, out_version);
  pcp_store_unlock(store);
  return status;
}

pcp_status_t pcp_store_integrity_check(pcp_store_t* store) {
  pcp_store_lock(store);
  pcp_status_t status = pcp_ok_status();
  sqlite3_stmt* stmt = NULL;
  int rc =
      sqlite3_prepare_v2(store->db, "PRAGMA integrity_check", -1, &stmt, NULL);
  if (rc != SQLITE_OK) {
    status = pcp_store_db_status(store, rc, "integrity_check");
  } else {
    rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      const char* answer = (const char*)sqlite3_column_text(stmt, 0);
      if (!answer || strcmp(answer, "ok") != 0) {
        status = pcp_make_status(PCP_STATUS_DATA_LOSS, "integrity_check: %s",
                                 answer ? answer : "?");
      }
    } else {
      status = pcp_store_db_status(store, rc, "integrity_check");
    }
    sqlite3_finalize(stmt);
  }
  if (!status) {
    rc = sqlite3_prepare_v2(store->db, "PRAGMA foreign_key_check", -1, &stmt,
                            NULL);
    if (rc != SQLITE_OK) {
      status = pcp_store_db_status(store, rc, "foreign_key_check");
    } else {
      rc = sqlite3_step(stmt);
      if (rc == SQLITE_ROW) {
        status = pcp_make_status(
            PCP_STATUS_DATA_LOSS,
            "foreign_key_check: table %s row %lld has no parent in %s",
            (const char*)sqlite3_column_text(stmt, 0),
            (long long)sqlite3_column_int64(stmt, 1),
            (const char*)sqlite3_column_text(stmt, 2));
      } else if (rc != SQLITE_DONE) {
        status = pcp_store_db_status(store, rc, "foreign_key_check");
      }
      sqlite3_finalize(stmt);
    }
  }
  pcp_store_unlock(store);
  return status;
}
