// SPDX-License-Identifier: Apache-2.0
// store: jobs, the transition table, job events and job results.

#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <sqlite3.h>

#include "store/store_impl.h"

//===----------------------------------------------------------------------===//
// States and the transition table
//===----------------------------------------------------------------------===//

static const char* const kStateNames[PCP_STORE_JOB_STATE_COUNT_] = {
    "queued",    "placing", "compiling",  "running",
    "succeeded", "failed",  "cancelling", "cancelled",
};

#define BIT(s) PCP_STORE_JOB_STATE_BIT(PCP_STORE_JOB_STATE_##s)
// kAllowed[from] = the set of states |from| may move to. The single source of
// truth: pcp_store_job_transition checks nothing else.
static const pcp_store_job_state_mask_t kAllowed[PCP_STORE_JOB_STATE_COUNT_] = {
    [PCP_STORE_JOB_STATE_QUEUED] = BIT(PLACING) | BIT(FAILED) | BIT(CANCELLED),
    [PCP_STORE_JOB_STATE_PLACING] =
        BIT(COMPILING) | BIT(QUEUED) | BIT(FAILED) | BIT(CANCELLING),
    [PCP_STORE_JOB_STATE_COMPILING] = BIT(RUNNING) | BIT(PLACING) |
                                      BIT(QUEUED) | BIT(FAILED) |
                                      BIT(CANCELLING),
    [PCP_STORE_JOB_STATE_RUNNING] = BIT(SUCCEEDED) | BIT(FAILED) |
                                    BIT(CANCELLING) | BIT(PLACING) |
                                    BIT(QUEUED),
    [PCP_STORE_JOB_STATE_CANCELLING] = BIT(CANCELLED) | BIT(FAILED),
    [PCP_STORE_JOB_STATE_SUCCEEDED] = 0,
    [PCP_STORE_JOB_STATE_FAILED] = 0,
    [PCP_STORE_JOB_STATE_CANCELLED] = 0,
};
#undef BIT

const char* pcp_store_job_state_name(pcp_store_job_state_t state) {
  if ((unsigned)state >= PCP_STORE_JOB_STATE_COUNT_) {
    return "unknown";
  }
  return kStateNames[state];
}

bool pcp_store_job_state_parse(pcp_string_view_t name,
                               pcp_store_job_state_t* out_state) {
  for (int i = 0; i < PCP_STORE_JOB_STATE_COUNT_; ++i) {
    if (pcp_string_view_equal(name, pcp_make_cstring_view(kStateNames[i]))) {
      *out_state = (pcp_store_job_state_t)i;
      return true;
    }
  }
  return false;
}

bool pcp_store_job_state_is_terminal(pcp_store_job_state_t state) {
  return state == PCP_STORE_JOB_STATE_SUCCEEDED ||
         state == PCP_STORE_JOB_STATE_FAILED ||
         state == PCP_STORE_JOB_STATE_CANCELLED;
}

bool pcp_store_job_transition_is_allowed(pcp_store_job_state_t from,
                                         pcp_store_job_state_t to) {
  if ((unsigned)from >= PCP_STORE_JOB_STATE_COUNT_ ||
      (unsigned)to >= PCP_STORE_JOB_STATE_COUNT_) {
    return false;
  }
  return (kAllowed[from] & PCP_STORE_JOB_STATE_BIT(to)) != 0;
}

// A state column read back: the CHECK constraint allows only known names, so
// anything else is a damaged file.
static pcp_status_t state_column(sqlite3_stmt* stmt, int column,
                                 pcp_store_job_state_t* out_state) {
  const char* text = (const char*)sqlite3_column_text(stmt, column);
  if (!text ||
      !pcp_store_job_state_parse(pcp_make_cstring_view(text), out_state)) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS, "stored job state '%s'",
                           text ? text : "(null)");
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Records
//===----------------------------------------------------------------------===//

void pcp_store_job_deinitialize(pcp_store_job_t* job) {
  if (!job) {
    return;
  }
  json_decref(job->spec);
  json_decref(job->placement);
  memset(job, 0, sizeof(*job));
}

void pcp_store_job_list_deinitialize(pcp_store_job_list_t* list) {
  for (size_t i = 0; i < list->count; ++i) {
    pcp_store_job_deinitialize(&list->items[i]);
  }
  if (list->items) {
    pcp_allocator_free(list->allocator, list->items);
  }
  memset(list, 0, sizeof(*list));
}

void pcp_store_job_event_list_deinitialize(pcp_store_job_event_list_t* list) {
  for (size_t i = 0; i < list->count; ++i) {
    json_decref(list->items[i].payload);
  }
  if (list->items) {
    pcp_allocator_free(list->allocator, list->items);
  }
  memset(list, 0, sizeof(*list));
}

void pcp_store_job_result_list_deinitialize(pcp_store_job_result_list_t* list) {
  if (list->items) {
    pcp_allocator_free(list->allocator, list->items);
  }
  memset(list, 0, sizeof(*list));
}

#define JOB_COLUMNS                                                  \
  "id, kind, state, spec, placement, created_at_ns, updated_at_ns, " \
  "attempt, last_committed_step, error"

static pcp_status_t job_from_row(sqlite3_stmt* stmt, pcp_store_job_t* job) {
  memset(job, 0, sizeof(*job));
  pcp_store_text_column(stmt, 0, job->id, sizeof(job->id));
  pcp_store_text_column(stmt, 1, job->kind, sizeof(job->kind));
  PCP_RETURN_IF_ERROR_BARE(state_column(stmt, 2, &job->state));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_json_column(stmt, 3, &job->spec));
  pcp_status_t status = pcp_store_json_column(stmt, 4, &job->placement);
  if (status) {
    pcp_store_job_deinitialize(job);
    return status;
  }
  job->created_at_ns = sqlite3_column_int64(stmt, 5);
  job->updated_at_ns = sqlite3_column_int64(stmt, 6);
  job->attempt = (uint32_t)sqlite3_column_int64(stmt, 7);
  job->last_committed_step = sqlite3_column_int64(stmt, 8);
  pcp_store_text_column(stmt, 9, job->error, sizeof(job->error));
  return pcp_ok_status();
}

static pcp_status_t job_get_locked(pcp_store_t* store, const char* id,
                                   pcp_store_job_t* out_job) {
  memset(out_job, 0, sizeof(*out_job));
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_JOB_GET,
      "SELECT " JOB_COLUMNS " FROM jobs WHERE id = ?1", &stmt));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(
      store, sqlite3_bind_text(stmt, 1, id, -1, SQLITE_TRANSIENT)));
  int rc = sqlite3_step(stmt);
  pcp_status_t status = pcp_ok_status();
  if (rc == SQLITE_ROW) {
    status = job_from_row(stmt, out_job);
  } else if (rc == SQLITE_DONE) {
    status = pcp_make_status(PCP_STATUS_NOT_FOUND, "job '%s'", id);
  } else {
    status = pcp_store_db_status(store, rc, "job get");
  }
  sqlite3_reset(stmt);
  return status;
}

// Appends an event; |payload_text| is already validated JSON.
static pcp_status_t event_insert(pcp_store_t* store, const char* job_id,
                                 const char* type, const char* from_state,
                                 const char* to_state, const char* payload_text,
                                 int64_t* out_event_id) {
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_EVENT_INSERT,
      "INSERT INTO job_events(job_id, type, from_state, to_state, payload, "
      "created_at_ns) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
      &stmt));
  int brc = sqlite3_bind_text(stmt, 1, job_id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 2, type, -1, SQLITE_TRANSIENT);
  brc |= from_state ? sqlite3_bind_text(stmt, 3, from_state, -1, SQLITE_STATIC)
                    : sqlite3_bind_null(stmt, 3);
  brc |= to_state ? sqlite3_bind_text(stmt, 4, to_state, -1, SQLITE_STATIC)
                  : sqlite3_bind_null(stmt, 4);
  brc |= sqlite3_bind_text(stmt, 5, payload_text, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_int64(stmt, 6, pcp_store_now_ns(store));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_run(store, stmt, "event insert"));
  if (out_event_id) {
    *out_event_id = sqlite3_last_insert_rowid(store->db);
  }
  return pcp_ok_status();
}

// Encodes a payload object built here (never user-sized beyond the bounded
// error text) and appends it.
static pcp_status_t event_insert_json(pcp_store_t* store, const char* job_id,
                                      const char* type, const char* from_state,
                                      const char* to_state, json_t* payload,
                                      int64_t* out_event_id) {
  char* text = NULL;
  pcp_status_t status =
      payload
          ? pcp_store_json_encode("event payload", payload, "{}", true, &text)
          : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                            "out of memory building an event");
  json_decref(payload);
  if (!status) {
    status = event_insert(store, job_id, type, from_state, to_state, text,
                          out_event_id);
  }
  pcp_allocator_free(pcp_allocator_system(), text);
  return status;
}

pcp_status_t pcp_store_event_committed(pcp_store_t* store, pcp_status_t status,
                                       int64_t event_id,
                                       int64_t* out_event_id) {
  if (status) {
    return status;
  }
  if (out_event_id) {
    *out_event_id = event_id;
  }
  if (store->event_callback.fn && event_id > 0) {
    store->event_callback.fn(store->event_callback.user_data, event_id);
  }
  return status;
}

//===----------------------------------------------------------------------===//
// Jobs
//===----------------------------------------------------------------------===//

static pcp_status_t job_create_locked(pcp_store_t* store, const char* id,
                                      const char* kind, const char* spec_text,
                                      int64_t* out_event_id) {
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_JOB_INSERT,
      "INSERT INTO jobs(id, kind, state, spec, created_at_ns, updated_at_ns) "
      "VALUES (?1, ?2, 'queued', ?3, ?4, ?4)",
      &stmt));
  int64_t now = pcp_store_now_ns(store);
  int brc = sqlite3_bind_text(stmt, 1, id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 2, kind, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 3, spec_text, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_int64(stmt, 4, now);
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
  pcp_status_t status = pcp_store_stmt_run(store, stmt, "job insert");
  if (pcp_status_code(status) == PCP_STATUS_ALREADY_EXISTS) {
    pcp_status_ignore(status);
    return pcp_make_status(PCP_STATUS_ALREADY_EXISTS, "job '%s' exists", id);
  }
  PCP_RETURN_IF_ERROR_BARE(status);
  return event_insert_json(
      store, id, "state", NULL, "queued",
      json_pack("{s:n, s:s, s:i}", "from", "to", "queued", "attempt", 0),
      out_event_id);
}

pcp_status_t pcp_store_job_create(pcp_store_t* store, const char* id,
                                  const char* kind, const json_t* spec,
                                  int64_t* out_event_id) {
  PCP_RETURN_IF_ERROR_BARE(pcp_store_id_validate("job id", id, false));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_name_validate(
      "job kind", kind, PCP_STORE_NAME_MAX_LENGTH, false));
  if (!spec) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "job spec is missing");
  }
  char* spec_text = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_json_encode("job spec", spec, "{}", true, &spec_text));
  int64_t event_id = 0;
  pcp_store_lock(store);
  pcp_status_t status = pcp_store_tx_begin(store);
  if (!status) {
    status = pcp_store_tx_finish(
        store, job_create_locked(store, id, kind, spec_text, &event_id));
  }
  pcp_store_unlock(store);
  pcp_allocator_free(pcp_allocator_system(), spec_text);
  return pcp_store_event_committed(store, status, event_id, out_event_id);
}

static pcp_status_t job_transition_locked(pcp_store_t* store, const char* id,
                                          pcp_store_job_state_t to,
                                          const char* placement_text,
                                          const char* error,
                                          int64_t* out_event_id) {
  pcp_store_job_t job;
  PCP_RETURN_IF_ERROR_BARE(job_get_locked(store, id, &job));
  pcp_store_job_state_t from = job.state;
  uint32_t attempt = job.attempt;
  pcp_store_job_deinitialize(&job);
  if (!pcp_store_job_transition_is_allowed(from, to)) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "job '%s': %s -> %s is not an allowed transition",
                           id, pcp_store_job_state_name(from),
                           pcp_store_job_state_name(to));
  }
  if (to == PCP_STORE_JOB_STATE_PLACING) {
    ++attempt;
  }
  sqlite3_stmt* stmt = NULL;
  // The WHERE on the old state makes the update a compare-and-set, though
  // the store lock already serializes writers in this process.
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_JOB_STATE_UPDATE,
      "UPDATE jobs SET state = ?2, attempt = ?3, updated_at_ns = ?4,"
      " placement = coalesce(?5, placement), error = coalesce(?6, error)"
      " WHERE id = ?1 AND state = ?7",
      &stmt));
  int brc = sqlite3_bind_text(stmt, 1, id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 2, pcp_store_job_state_name(to), -1,
                           SQLITE_STATIC);
  brc |= sqlite3_bind_int64(stmt, 3, attempt);
  brc |= sqlite3_bind_int64(stmt, 4, pcp_store_now_ns(store));
  brc |= placement_text
             ? sqlite3_bind_text(stmt, 5, placement_text, -1, SQLITE_TRANSIENT)
             : sqlite3_bind_null(stmt, 5);
  brc |= error ? sqlite3_bind_text(stmt, 6, error, -1, SQLITE_TRANSIENT)
               : sqlite3_bind_null(stmt, 6);
  brc |= sqlite3_bind_text(stmt, 7, pcp_store_job_state_name(from), -1,
                           SQLITE_STATIC);
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_run(store, stmt, "job transition"));
  if (sqlite3_changes(store->db) != 1) {
    return pcp_make_status(PCP_STATUS_ABORTED,
                           "job '%s' changed state concurrently", id);
  }
  json_t* payload =
      json_pack("{s:s, s:s, s:I}", "from", pcp_store_job_state_name(from), "to",
                pcp_store_job_state_name(to), "attempt", (json_int_t)attempt);
  if (payload && error && error[0]) {
    json_object_set_new(payload, "error", json_string(error));
  }
  return event_insert_json(store, id, "state", pcp_store_job_state_name(from),
                           pcp_store_job_state_name(to), payload, out_event_id);
}

pcp_status_t pcp_store_job_transition(
    pcp_store_t* store, const char* id, pcp_store_job_state_t to,
    const pcp_store_job_transition_params_t* params, int64_t* out_event_id) {
  PCP_RETURN_IF_ERROR_BARE(pcp_store_id_validate("job id", id, false));
  if (PCP_BUGGIFY("store.job_transition")) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE, "buggify: store write");
  }
  if ((unsigned)to >= PCP_STORE_JOB_STATE_COUNT_) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "job state %d is out of range", (int)to);
  }
  const char* error = params ? params->error : NULL;
  if (error) {
    PCP_RETURN_IF_ERROR_BARE(pcp_store_name_validate(
        "job error", error, PCP_STORE_ERROR_MAX_LENGTH, true));
  }
  char* placement_text = NULL;
  if (params && params->placement) {
    PCP_RETURN_IF_ERROR_BARE(pcp_store_json_encode(
        "job placement", params->placement, "{}", false, &placement_text));
  }
  int64_t event_id = 0;
  pcp_store_lock(store);
  pcp_status_t status = pcp_store_tx_begin(store);
  if (!status) {
    status = pcp_store_tx_finish(
        store,
        job_transition_locked(store, id, to, placement_text, error, &event_id));
  }
  pcp_store_unlock(store);
  pcp_allocator_free(pcp_allocator_system(), placement_text);
  return pcp_store_event_committed(store, status, event_id, out_event_id);
}

pcp_status_t pcp_store_job_step_commit_locked(pcp_store_t* store,
                                              const char* id, int64_t step,
                                              const char* event_type,
                                              const json_t* event_payload,
                                              int64_t* out_event_id) {
  pcp_store_job_t job;
  PCP_RETURN_IF_ERROR_BARE(job_get_locked(store, id, &job));
  pcp_store_job_state_t state = job.state;
  int64_t last = job.last_committed_step;
  pcp_store_job_deinitialize(&job);
  if (state != PCP_STORE_JOB_STATE_RUNNING &&
      state != PCP_STORE_JOB_STATE_CANCELLING) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "job '%s' is %s: steps commit only while running "
                           "or cancelling",
                           id, pcp_store_job_state_name(state));
  }
  if (step > last) {
    sqlite3_stmt* stmt = NULL;
    PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
        store, PCP_STORE_STMT_JOB_STEP_UPDATE,
        "UPDATE jobs SET last_committed_step = ?2, updated_at_ns = ?3"
        " WHERE id = ?1",
        &stmt));
    int brc = sqlite3_bind_text(stmt, 1, id, -1, SQLITE_TRANSIENT);
    brc |= sqlite3_bind_int64(stmt, 2, step);
    brc |= sqlite3_bind_int64(stmt, 3, pcp_store_now_ns(store));
    PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
    PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_run(store, stmt, "job step"));
  } else if (strcmp(event_type, "step") == 0) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "job '%s': step %lld is not after the last "
                           "committed step %lld",
                           id, (long long)step, (long long)last);
  }
  json_t* payload =
      event_payload ? json_deep_copy(event_payload) : json_object();
  if (payload) {
    json_object_set_new(payload, "step", json_integer(step));
  }
  return event_insert_json(store, id, event_type, NULL, NULL, payload,
                           out_event_id);
}

pcp_status_t pcp_store_job_step_commit(pcp_store_t* store, const char* id,
                                       int64_t step, int64_t* out_event_id) {
  PCP_RETURN_IF_ERROR_BARE(pcp_store_id_validate("job id", id, false));
  if (PCP_BUGGIFY("store.job_step_commit")) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE, "buggify: store write");
  }
  if (step < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "step %lld is negative",
                           (long long)step);
  }
  int64_t event_id = 0;
  pcp_store_lock(store);
  pcp_status_t status = pcp_store_tx_begin(store);
  if (!status) {
    status = pcp_store_tx_finish(
        store, pcp_store_job_step_commit_locked(store, id, step, "step", NULL,
                                                &event_id));
  }
  pcp_store_unlock(store);
  return pcp_store_event_committed(store, status, event_id, out_event_id);
}

pcp_status_t pcp_store_job_get(pcp_store_t* store, const char* id,
                               pcp_store_job_t* out_job) {
  memset(out_job, 0, sizeof(*out_job));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_id_validate("job id", id, false));
  pcp_store_lock(store);
  pcp_status_t status = job_get_locked(store, id, out_job);
  pcp_store_unlock(store);
  return status;
}

static pcp_status_t job_list_locked(pcp_store_t* store,
                                    const pcp_store_job_filter_t* filter,
                                    pcp_store_job_list_t* out_list) {
  int64_t after_seq = 0;
  sqlite3_stmt* stmt = NULL;
  if (filter->after_id) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_store_stmt_acquire(store, PCP_STORE_STMT_JOB_SEQ,
                               "SELECT seq FROM jobs WHERE id = ?1", &stmt));
    PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(
        store,
        sqlite3_bind_text(stmt, 1, filter->after_id, -1, SQLITE_TRANSIENT)));
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      after_seq = sqlite3_column_int64(stmt, 0);
    }
    sqlite3_reset(stmt);
    if (rc == SQLITE_DONE) {
      return pcp_make_status(PCP_STATUS_NOT_FOUND, "after_id job '%s'",
                             filter->after_id);
    }
    if (rc != SQLITE_ROW) {
      return pcp_store_db_status(store, rc, "job list cursor");
    }
  }
  // The state set is passed as a bit mask and tested in SQL, so one cached
  // statement serves every filter combination.
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_JOB_LIST,
      "SELECT " JOB_COLUMNS
      " FROM jobs WHERE seq > ?1"
      " AND (?2 = 0 OR (?2 >> (CASE state WHEN 'queued' THEN 0"
      "   WHEN 'placing' THEN 1 WHEN 'compiling' THEN 2 WHEN 'running' THEN 3"
      "   WHEN 'succeeded' THEN 4 WHEN 'failed' THEN 5"
      "   WHEN 'cancelling' THEN 6 ELSE 7 END)) & 1)"
      " AND (?3 IS NULL OR kind = ?3) ORDER BY seq LIMIT ?4",
      &stmt));
  uint32_t limit =
      pcp_store_limit_normalize(filter->limit, PCP_STORE_LIST_LIMIT_DEFAULT);
  int brc = sqlite3_bind_int64(stmt, 1, after_seq);
  brc |= sqlite3_bind_int64(stmt, 2, filter->states);
  brc |= filter->kind
             ? sqlite3_bind_text(stmt, 3, filter->kind, -1, SQLITE_TRANSIENT)
             : sqlite3_bind_null(stmt, 3);
  brc |= sqlite3_bind_int64(stmt, 4, limit);
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
  size_t capacity = 0;
  pcp_status_t status = pcp_ok_status();
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    status = pcp_store_list_reserve(out_list->allocator,
                                    sizeof(pcp_store_job_t), out_list->count,
                                    &capacity, (void**)&out_list->items);
    if (status) {
      break;
    }
    status = job_from_row(stmt, &out_list->items[out_list->count]);
    if (status) {
      break;
    }
    ++out_list->count;
  }
  if (!status && rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "job list");
  }
  sqlite3_reset(stmt);
  return status;
}

pcp_status_t pcp_store_job_list(pcp_store_t* store,
                                const pcp_store_job_filter_t* filter,
                                pcp_store_job_list_t* out_list) {
  memset(out_list, 0, sizeof(*out_list));
  out_list->allocator = store->allocator;
  pcp_store_job_filter_t all = {0};
  if (!filter) {
    filter = &all;
  }
  if (filter->states >> PCP_STORE_JOB_STATE_COUNT_) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "job state mask 0x%x has unknown bits",
                           (unsigned)filter->states);
  }
  if (filter->kind) {
    PCP_RETURN_IF_ERROR_BARE(pcp_store_name_validate(
        "job kind", filter->kind, PCP_STORE_NAME_MAX_LENGTH, false));
  }
  if (filter->after_id) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_store_id_validate("after_id", filter->after_id, false));
  }
  pcp_store_lock(store);
  pcp_status_t status = job_list_locked(store, filter, out_list);
  pcp_store_unlock(store);
  if (status) {
    pcp_store_job_list_deinitialize(out_list);
  }
  return status;
}

pcp_status_t pcp_store_job_resume_list(pcp_store_t* store, const char* after_id,
                                       uint32_t limit,
                                       pcp_store_job_list_t* out_list) {
  pcp_store_job_filter_t filter = {
      .states = PCP_STORE_JOB_STATE_BIT(PCP_STORE_JOB_STATE_PLACING) |
                PCP_STORE_JOB_STATE_BIT(PCP_STORE_JOB_STATE_COMPILING) |
                PCP_STORE_JOB_STATE_BIT(PCP_STORE_JOB_STATE_RUNNING) |
                PCP_STORE_JOB_STATE_BIT(PCP_STORE_JOB_STATE_CANCELLING),
      .after_id = after_id,
      .limit = limit,
  };
  return pcp_store_job_list(store, &filter, out_list);
}

//===----------------------------------------------------------------------===//
// Events
//===----------------------------------------------------------------------===//

pcp_status_t pcp_store_job_event_append(pcp_store_t* store, const char* id,
                                        const char* type, const json_t* payload,
                                        int64_t* out_event_id) {
  PCP_RETURN_IF_ERROR_BARE(pcp_store_id_validate("job id", id, false));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_name_validate(
      "event type", type, PCP_STORE_NAME_MAX_LENGTH, false));
  if (strcmp(type, "state") == 0 || strcmp(type, "step") == 0 ||
      strcmp(type, "checkpoint") == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "event type '%s' is reserved for the store", type);
  }
  char* text = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_json_encode("event payload", payload, "{}", false, &text));
  int64_t event_id = 0;
  pcp_store_lock(store);
  pcp_status_t status =
      event_insert(store, id, type, NULL, NULL, text, &event_id);
  pcp_store_unlock(store);
  pcp_allocator_free(pcp_allocator_system(), text);
  if (pcp_status_code(status) == PCP_STATUS_FAILED_PRECONDITION) {
    // The only constraint an append can break is the job's foreign key.
    pcp_status_ignore(status);
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "job '%s'", id);
  }
  return pcp_store_event_committed(store, status, event_id, out_event_id);
}

pcp_status_t pcp_store_job_event_list(pcp_store_t* store,
                                      int64_t after_event_id,
                                      const char* job_id, uint32_t limit,
                                      pcp_store_job_event_list_t* out_list) {
  memset(out_list, 0, sizeof(*out_list));
  out_list->allocator = store->allocator;
  if (job_id) {
    PCP_RETURN_IF_ERROR_BARE(pcp_store_id_validate("job id", job_id, false));
  }
  limit = pcp_store_limit_normalize(limit, PCP_STORE_LIST_LIMIT_DEFAULT);
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_EVENT_LIST,
      "SELECT event_id, job_id, type, from_state, to_state, payload,"
      " created_at_ns FROM job_events WHERE event_id > ?1"
      " AND (?2 IS NULL OR job_id = ?2) ORDER BY event_id LIMIT ?3",
      &stmt);
  if (!status) {
    int brc = sqlite3_bind_int64(stmt, 1, after_event_id);
    brc |= job_id ? sqlite3_bind_text(stmt, 2, job_id, -1, SQLITE_TRANSIENT)
                  : sqlite3_bind_null(stmt, 2);
    brc |= sqlite3_bind_int64(stmt, 3, limit);
    status = pcp_store_bind_check(store, brc);
  }
  size_t capacity = 0;
  int rc = SQLITE_DONE;
  while (!status && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    status = pcp_store_list_reserve(
        out_list->allocator, sizeof(pcp_store_job_event_t), out_list->count,
        &capacity, (void**)&out_list->items);
    if (status) {
      break;
    }
    pcp_store_job_event_t* event = &out_list->items[out_list->count];
    event->event_id = sqlite3_column_int64(stmt, 0);
    pcp_store_text_column(stmt, 1, event->job_id, sizeof(event->job_id));
    pcp_store_text_column(stmt, 2, event->type, sizeof(event->type));
    if (sqlite3_column_type(stmt, 3) != SQLITE_NULL) {
      status = state_column(stmt, 3, &event->from_state);
      event->has_from_state = true;
    }
    if (!status && sqlite3_column_type(stmt, 4) != SQLITE_NULL) {
      status = state_column(stmt, 4, &event->to_state);
      event->has_states = true;
    }
    if (!status) {
      status = pcp_store_json_column(stmt, 5, &event->payload);
    }
    if (status) {
      break;
    }
    event->created_at_ns = sqlite3_column_int64(stmt, 6);
    ++out_list->count;
  }
  if (!status && rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "event list");
  }
  if (stmt) {
    sqlite3_reset(stmt);
  }
  pcp_store_unlock(store);
  if (status) {
    pcp_store_job_event_list_deinitialize(out_list);
  }
  return status;
}

pcp_status_t pcp_store_job_event_last_id(pcp_store_t* store,
                                         int64_t* out_event_id) {
  *out_event_id = 0;
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  // sqlite_sequence holds the AUTOINCREMENT high-water mark, which is what
  // a client resuming with Last-Event-ID compares against.
  pcp_status_t status =
      pcp_store_stmt_acquire(store, PCP_STORE_STMT_EVENT_LAST,
                             "SELECT coalesce((SELECT seq FROM sqlite_sequence"
                             " WHERE name = 'job_events'), 0)",
                             &stmt);
  if (!status) {
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      *out_event_id = sqlite3_column_int64(stmt, 0);
    } else {
      status = pcp_store_db_status(store, rc, "last event id");
    }
    sqlite3_reset(stmt);
  }
  pcp_store_unlock(store);
  return status;
}

//===----------------------------------------------------------------------===//
// Results
//===----------------------------------------------------------------------===//

static pcp_status_t result_validate(const pcp_store_job_result_t* result) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("result job id", result->job_id, false));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_name_validate(
      "result name", result->name, PCP_STORE_NAME_MAX_LENGTH, false));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_name_validate(
      "result path", result->path, PCP_STORE_PATH_MAX_LENGTH, false));
  size_t element_size = pcp_element_type_byte_size(result->dtype);
  if ((unsigned)result->dtype >= PCP_ELEMENT_TYPE_COUNT_ || element_size == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "result '%s' has no known dtype", result->name);
  }
  if (result->rank > PCP_MAX_TENSOR_RANK) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "result '%s' has rank %u, over %d", result->name,
                           (unsigned)result->rank, PCP_MAX_TENSOR_RANK);
  }
  uint64_t bytes = element_size;
  for (uint32_t i = 0; i < result->rank; ++i) {
    if (result->shape[i] < 0) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "result '%s' has a negative dimension",
                             result->name);
    }
    if (__builtin_mul_overflow(bytes, (uint64_t)result->shape[i], &bytes)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "result '%s' shape overflows 64 bits",
                             result->name);
    }
  }
  if (bytes != result->byte_length || bytes > (uint64_t)INT64_MAX) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "result '%s': byte_length %llu does not match its shape (%llu)",
        result->name, (unsigned long long)result->byte_length,
        (unsigned long long)bytes);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_store_job_result_put(pcp_store_t* store,
                                      const pcp_store_job_result_t* result) {
  PCP_RETURN_IF_ERROR_BARE(result_validate(result));
  if (PCP_BUGGIFY("store.job_result_put")) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE, "buggify: store write");
  }
  json_t* shape = json_array();
  for (uint32_t i = 0; shape && i < result->rank; ++i) {
    json_array_append_new(shape, json_integer(result->shape[i]));
  }
  char* shape_text = shape ? json_dumps(shape, JSON_COMPACT) : NULL;
  json_decref(shape);
  if (!shape_text) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory encoding a shape");
  }
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_store_sha256_to_hex(&result->sha256, hex);
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_RESULT_INSERT,
      "INSERT INTO job_results(job_id, name, dtype, shape, byte_length, "
      "sha256, path, created_at_ns) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
      &stmt);
  if (!status) {
    int brc = sqlite3_bind_text(stmt, 1, result->job_id, -1, SQLITE_TRANSIENT);
    brc |= sqlite3_bind_text(stmt, 2, result->name, -1, SQLITE_TRANSIENT);
    brc |= sqlite3_bind_text(stmt, 3, pcp_element_type_name(result->dtype), -1,
                             SQLITE_STATIC);
    brc |= sqlite3_bind_text(stmt, 4, shape_text, -1, SQLITE_TRANSIENT);
    brc |= sqlite3_bind_int64(stmt, 5, (int64_t)result->byte_length);
    brc |= sqlite3_bind_text(stmt, 6, hex, -1, SQLITE_TRANSIENT);
    brc |= sqlite3_bind_text(stmt, 7, result->path, -1, SQLITE_TRANSIENT);
    brc |= sqlite3_bind_int64(stmt, 8, pcp_store_now_ns(store));
    status = pcp_store_bind_check(store, brc);
  }
  if (!status) {
    status = pcp_store_stmt_run(store, stmt, "result insert");
  }
  pcp_store_unlock(store);
  pcp_libc_free(shape_text);
  switch (pcp_status_code(status)) {
    case PCP_STATUS_ALREADY_EXISTS:
      pcp_status_ignore(status);
      return pcp_make_status(PCP_STATUS_ALREADY_EXISTS,
                             "job '%s' already has a result '%s'",
                             result->job_id, result->name);
    case PCP_STATUS_FAILED_PRECONDITION:
      pcp_status_ignore(status);
      return pcp_make_status(PCP_STATUS_NOT_FOUND, "job '%s'", result->job_id);
    default:
      return status;
  }
}

static pcp_status_t result_from_row(sqlite3_stmt* stmt,
                                    pcp_store_job_result_t* result) {
  memset(result, 0, sizeof(*result));
  pcp_store_text_column(stmt, 0, result->job_id, sizeof(result->job_id));
  pcp_store_text_column(stmt, 1, result->name, sizeof(result->name));
  const char* dtype = (const char*)sqlite3_column_text(stmt, 2);
  if (!dtype ||
      !pcp_element_type_parse(pcp_make_cstring_view(dtype), &result->dtype)) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS, "stored dtype '%s'",
                           dtype ? dtype : "(null)");
  }
  json_t* shape = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_json_column(stmt, 3, &shape));
  if (!json_is_array(shape) || json_array_size(shape) > PCP_MAX_TENSOR_RANK) {
    json_decref(shape);
    return pcp_make_status(PCP_STATUS_DATA_LOSS, "stored shape of '%s'",
                           result->name);
  }
  result->rank = (uint32_t)json_array_size(shape);
  for (uint32_t i = 0; i < result->rank; ++i) {
    result->shape[i] = json_integer_value(json_array_get(shape, i));
  }
  json_decref(shape);
  result->byte_length = (uint64_t)sqlite3_column_int64(stmt, 4);
  const char* hex = (const char*)sqlite3_column_text(stmt, 5);
  if (!pcp_store_sha256_from_hex(hex, &result->sha256)) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS, "stored SHA-256 of '%s'",
                           result->name);
  }
  pcp_store_text_column(stmt, 6, result->path, sizeof(result->path));
  result->created_at_ns = sqlite3_column_int64(stmt, 7);
  return pcp_ok_status();
}

#define RESULT_COLUMNS \
  "job_id, name, dtype, shape, byte_length, sha256, path, created_at_ns"

pcp_status_t pcp_store_job_result_get(pcp_store_t* store, const char* job_id,
                                      const char* name,
                                      pcp_store_job_result_t* out_result) {
  memset(out_result, 0, sizeof(*out_result));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_id_validate("job id", job_id, false));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_name_validate(
      "result name", name, PCP_STORE_NAME_MAX_LENGTH, false));
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status =
      pcp_store_stmt_acquire(store, PCP_STORE_STMT_RESULT_GET,
                             "SELECT " RESULT_COLUMNS
                             " FROM job_results"
                             " WHERE job_id = ?1 AND name = ?2",
                             &stmt);
  if (!status) {
    int brc = sqlite3_bind_text(stmt, 1, job_id, -1, SQLITE_TRANSIENT);
    brc |= sqlite3_bind_text(stmt, 2, name, -1, SQLITE_TRANSIENT);
    status = pcp_store_bind_check(store, brc);
  }
  if (!status) {
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      status = result_from_row(stmt, out_result);
    } else if (rc == SQLITE_DONE) {
      status = pcp_make_status(PCP_STATUS_NOT_FOUND, "result '%s' of job '%s'",
                               name, job_id);
    } else {
      status = pcp_store_db_status(store, rc, "result get");
    }
    sqlite3_reset(stmt);
  }
  pcp_store_unlock(store);
  return status;
}

pcp_status_t pcp_store_job_result_list(pcp_store_t* store, const char* job_id,
                                       pcp_store_job_result_list_t* out_list) {
  memset(out_list, 0, sizeof(*out_list));
  out_list->allocator = store->allocator;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_id_validate("job id", job_id, false));
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status =
      pcp_store_stmt_acquire(store, PCP_STORE_STMT_RESULT_LIST,
                             "SELECT " RESULT_COLUMNS
                             " FROM job_results WHERE job_id = ?1"
                             " ORDER BY name LIMIT ?2",
                             &stmt);
  if (!status) {
    int brc = sqlite3_bind_text(stmt, 1, job_id, -1, SQLITE_TRANSIENT);
    brc |= sqlite3_bind_int64(stmt, 2, PCP_STORE_LIST_LIMIT_MAX);
    status = pcp_store_bind_check(store, brc);
  }
  size_t capacity = 0;
  int rc = SQLITE_DONE;
  while (!status && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    status = pcp_store_list_reserve(
        out_list->allocator, sizeof(pcp_store_job_result_t), out_list->count,
        &capacity, (void**)&out_list->items);
    if (!status) {
      status = result_from_row(stmt, &out_list->items[out_list->count]);
    }
    if (!status) {
      ++out_list->count;
    }
  }
  if (!status && rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "result list");
  }
  if (stmt) {
    sqlite3_reset(stmt);
  }
  pcp_store_unlock(store);
  if (status) {
    pcp_store_job_result_list_deinitialize(out_list);
  }
  return status;
}
