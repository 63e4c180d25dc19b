// SPDX-License-Identifier: Apache-2.0
// store: the federation hub's durable state (store.h, "Federation hub
// state"): registrations, global jobs, acknowledged sequences, policies.

#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <sqlite3.h>

#include "store/store_impl.h"

const char* const
    pcp_store_global_job_state_names[PCP_STORE_GLOBAL_JOB_STATE_COUNT] = {
        "placing", "submitted", "rejected", "cancelling"};

static bool state_known(const char* state) {
  for (size_t i = 0; state && i < PCP_STORE_GLOBAL_JOB_STATE_COUNT; ++i) {
    if (strcmp(state, pcp_store_global_job_state_names[i]) == 0) {
      return true;
    }
  }
  return false;
}

// Binds |text| (SQLITE_TRANSIENT: callers free it right after).
static int bind_text_or_null(sqlite3_stmt* stmt, int index, const char* text) {
  return text ? sqlite3_bind_text(stmt, index, text, -1, SQLITE_TRANSIENT)
              : sqlite3_bind_null(stmt, index);
}

//===----------------------------------------------------------------------===//
// Registrations
//===----------------------------------------------------------------------===//

void pcp_store_federation_gateway_list_deinitialize(
    pcp_store_federation_gateway_list_t* list) {
  for (size_t i = 0; i < list->count; ++i) {
    json_decref(list->items[i].registration);
  }
  if (list->items) {
    pcp_allocator_free(list->allocator, list->items);
  }
  pcp_allocator_t allocator = list->allocator;
  memset(list, 0, sizeof(*list));
  list->allocator = allocator;
}

pcp_status_t pcp_store_federation_gateway_put(pcp_store_t* store,
                                              const char* gateway_id,
                                              const json_t* registration,
                                              int64_t connected_at_ns,
                                              int64_t last_seen_ns) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("gateway_id", gateway_id, false));
  if (!registration) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "registration is required");
  }
  char* text = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_json_encode("registration", registration, "{}", true, &text));
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_FED_GATEWAY_PUT,
      "INSERT INTO federation_gateways(gateway_id, registration,"
      " connected_at_ns, last_seen_ns) VALUES (?1, ?2, ?3, ?4)"
      " ON CONFLICT(gateway_id) DO UPDATE SET"
      " registration = excluded.registration,"
      " connected_at_ns = excluded.connected_at_ns,"
      " last_seen_ns = excluded.last_seen_ns",
      &stmt);
  if (!status) {
    int brc = sqlite3_bind_text(stmt, 1, gateway_id, -1, SQLITE_STATIC);
    brc |= sqlite3_bind_text(stmt, 2, text, -1, SQLITE_STATIC);
    brc |= sqlite3_bind_int64(stmt, 3, connected_at_ns);
    brc |= sqlite3_bind_int64(stmt, 4, last_seen_ns);
    status = pcp_store_bind_check(store, brc);
  }
  if (!status) {
    status = pcp_store_stmt_run(store, stmt, "federation gateway put");
  }
  if (stmt) {
    sqlite3_clear_bindings(stmt);
  }
  pcp_store_unlock(store);
  pcp_allocator_free(pcp_allocator_system(), text);
  return status;
}

pcp_status_t pcp_store_federation_gateway_list(
    pcp_store_t* store, pcp_store_federation_gateway_list_t* out_list) {
  pcp_allocator_t allocator = out_list->allocator;
  memset(out_list, 0, sizeof(*out_list));
  out_list->allocator = allocator;
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_FED_GATEWAY_LIST,
      "SELECT gateway_id, registration, connected_at_ns, last_seen_ns"
      " FROM federation_gateways ORDER BY connected_at_ns, gateway_id",
      &stmt);
  size_t capacity = 0;
  int rc = SQLITE_DONE;
  while (!status && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    status = pcp_store_list_reserve(
        allocator, sizeof(pcp_store_federation_gateway_t), out_list->count,
        &capacity, (void**)&out_list->items);
    if (status) {
      break;
    }
    pcp_store_federation_gateway_t* g = &out_list->items[out_list->count];
    memset(g, 0, sizeof(*g));
    pcp_store_text_column(stmt, 0, g->gateway_id, sizeof(g->gateway_id));
    status = pcp_store_json_column(stmt, 1, &g->registration);
    if (status) {
      break;
    }
    g->connected_at_ns = sqlite3_column_int64(stmt, 2);
    g->last_seen_ns = sqlite3_column_int64(stmt, 3);
    ++out_list->count;
  }
  if (!status && rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "federation gateway list");
  }
  if (stmt) {
    sqlite3_reset(stmt);
  }
  pcp_store_unlock(store);
  if (status) {
    pcp_store_federation_gateway_list_deinitialize(out_list);
  }
  return status;
}

pcp_status_t pcp_store_federation_gateway_delete(pcp_store_t* store,
                                                 const char* gateway_id) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("gateway_id", gateway_id, false));
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_FED_GATEWAY_DELETE,
      "DELETE FROM federation_gateways WHERE gateway_id = ?1", &stmt);
  if (!status) {
    status = pcp_store_bind_check(
        store, sqlite3_bind_text(stmt, 1, gateway_id, -1, SQLITE_STATIC));
  }
  if (!status) {
    status = pcp_store_stmt_run(store, stmt, "federation gateway delete");
  }
  if (!status && sqlite3_changes(store->db) == 0) {
    status = pcp_make_status(PCP_STATUS_NOT_FOUND, "gateway %s", gateway_id);
  }
  pcp_store_unlock(store);
  return status;
}

//===----------------------------------------------------------------------===//
// Global jobs
//===----------------------------------------------------------------------===//

void pcp_store_global_job_deinitialize(pcp_store_global_job_t* job) {
  if (!job) {
    return;
  }
  json_decref(job->assignment);
  json_decref(job->child);
  memset(job, 0, sizeof(*job));
}

void pcp_store_global_job_list_deinitialize(pcp_store_global_job_list_t* list) {
  for (size_t i = 0; i < list->count; ++i) {
    pcp_store_global_job_deinitialize(&list->items[i]);
  }
  if (list->items) {
    pcp_allocator_free(list->allocator, list->items);
  }
  pcp_allocator_t allocator = list->allocator;
  memset(list, 0, sizeof(*list));
  list->allocator = allocator;
}

#define GLOBAL_JOB_COLUMNS                                        \
  "number, kind, state, child_job_id, assignment, child, error, " \
  "submitted_at_ns, updated_at_ns"

static pcp_status_t global_job_from_row(sqlite3_stmt* stmt,
                                        pcp_store_global_job_t* job) {
  memset(job, 0, sizeof(*job));
  job->number = sqlite3_column_int64(stmt, 0);
  pcp_store_text_column(stmt, 1, job->kind, sizeof(job->kind));
  pcp_store_text_column(stmt, 2, job->state, sizeof(job->state));
  pcp_store_text_column(stmt, 3, job->child_job_id, sizeof(job->child_job_id));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_json_column(stmt, 4, &job->assignment));
  pcp_status_t status = pcp_store_json_column(stmt, 5, &job->child);
  if (status) {
    pcp_store_global_job_deinitialize(job);
    return status;
  }
  pcp_store_text_column(stmt, 6, job->error, sizeof(job->error));
  job->submitted_at_ns = sqlite3_column_int64(stmt, 7);
  job->updated_at_ns = sqlite3_column_int64(stmt, 8);
  return pcp_ok_status();
}

pcp_status_t pcp_store_global_job_create(pcp_store_t* store, const char* kind,
                                         const json_t* assignment,
                                         int64_t* out_number) {
  *out_number = 0;
  if (!kind || (strcmp(kind, "training") != 0 && strcmp(kind, "rl") != 0)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "global job kind must be training or rl");
  }
  char* text = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_json_encode("assignment", assignment, "{}", true, &text));
  pcp_store_lock(store);
  int64_t now = pcp_store_now_ns(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_FED_JOB_INSERT,
      "INSERT INTO federation_global_jobs(kind, state, assignment,"
      " submitted_at_ns, updated_at_ns) VALUES (?1, 'placing', ?2, ?3, ?3)",
      &stmt);
  if (!status) {
    int brc = sqlite3_bind_text(stmt, 1, kind, -1, SQLITE_STATIC);
    brc |= sqlite3_bind_text(stmt, 2, text, -1, SQLITE_STATIC);
    brc |= sqlite3_bind_int64(stmt, 3, now);
    status = pcp_store_bind_check(store, brc);
  }
  if (!status) {
    status = pcp_store_stmt_run(store, stmt, "global job insert");
  }
  if (!status) {
    *out_number = sqlite3_last_insert_rowid(store->db);
  }
  if (stmt) {
    sqlite3_clear_bindings(stmt);
  }
  pcp_store_unlock(store);
  pcp_allocator_free(pcp_allocator_system(), text);
  return status;
}

pcp_status_t pcp_store_global_job_update(pcp_store_t* store, int64_t number,
                                         const char* state,
                                         const char* child_job_id,
                                         const json_t* child,
                                         const char* error) {
  if (!state_known(state)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "unknown global job state %s",
                           state ? state : "(null)");
  }
  if (child_job_id) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_store_id_validate("child_job_id", child_job_id, true));
  }
  if (error && strlen(error) > PCP_STORE_ERROR_MAX_LENGTH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "global job error is longer than %d bytes",
                           PCP_STORE_ERROR_MAX_LENGTH);
  }
  char* text = NULL;
  if (child) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_store_json_encode("child", child, "null", false, &text));
  }
  pcp_store_lock(store);
  int64_t now = pcp_store_now_ns(store);
  sqlite3_stmt* stmt = NULL;
  // NULL arguments keep the stored value.
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_FED_JOB_UPDATE,
      "UPDATE federation_global_jobs SET state = ?2,"
      " child_job_id = coalesce(?3, child_job_id),"
      " child = coalesce(?4, child), error = coalesce(?5, error),"
      " updated_at_ns = ?6 WHERE number = ?1",
      &stmt);
  if (!status) {
    int brc = sqlite3_bind_int64(stmt, 1, number);
    brc |= sqlite3_bind_text(stmt, 2, state, -1, SQLITE_STATIC);
    brc |= bind_text_or_null(stmt, 3, child_job_id);
    brc |= bind_text_or_null(stmt, 4, text);
    brc |= bind_text_or_null(stmt, 5, error);
    brc |= sqlite3_bind_int64(stmt, 6, now);
    status = pcp_store_bind_check(store, brc);
  }
  if (!status) {
    status = pcp_store_stmt_run(store, stmt, "global job update");
  }
  if (!status && sqlite3_changes(store->db) == 0) {
    status = pcp_make_status(PCP_STATUS_NOT_FOUND, "global-job-%lld",
                             (long long)number);
  }
  pcp_store_unlock(store);
  pcp_allocator_free(pcp_allocator_system(), text);
  return status;
}

pcp_status_t pcp_store_global_job_get(pcp_store_t* store, int64_t number,
                                      pcp_store_global_job_t* out_job) {
  memset(out_job, 0, sizeof(*out_job));
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status =
      pcp_store_stmt_acquire(store, PCP_STORE_STMT_FED_JOB_GET,
                             "SELECT " GLOBAL_JOB_COLUMNS
                             " FROM federation_global_jobs WHERE number = ?1",
                             &stmt);
  if (!status) {
    status = pcp_store_bind_check(store, sqlite3_bind_int64(stmt, 1, number));
  }
  if (!status) {
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      status = global_job_from_row(stmt, out_job);
    } else if (rc == SQLITE_DONE) {
      status = pcp_make_status(PCP_STATUS_NOT_FOUND, "global-job-%lld",
                               (long long)number);
    } else {
      status = pcp_store_db_status(store, rc, "global job get");
    }
    sqlite3_reset(stmt);
  }
  pcp_store_unlock(store);
  return status;
}

pcp_status_t pcp_store_global_job_list(pcp_store_t* store, int64_t after_number,
                                       uint32_t limit,
                                       pcp_store_global_job_list_t* out_list) {
  pcp_allocator_t allocator = out_list->allocator;
  memset(out_list, 0, sizeof(*out_list));
  out_list->allocator = allocator;
  limit = pcp_store_limit_normalize(limit, PCP_STORE_LIST_LIMIT_DEFAULT);
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_FED_JOB_LIST,
      "SELECT " GLOBAL_JOB_COLUMNS
      " FROM federation_global_jobs WHERE number > ?1 ORDER BY number"
      " LIMIT ?2",
      &stmt);
  if (!status) {
    int brc = sqlite3_bind_int64(stmt, 1, after_number);
    brc |= sqlite3_bind_int64(stmt, 2, limit);
    status = pcp_store_bind_check(store, brc);
  }
  size_t capacity = 0;
  int rc = SQLITE_DONE;
  while (!status && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    status = pcp_store_list_reserve(allocator, sizeof(pcp_store_global_job_t),
                                    out_list->count, &capacity,
                                    (void**)&out_list->items);
    if (!status) {
      status = global_job_from_row(stmt, &out_list->items[out_list->count]);
    }
    if (status) {
      break;
    }
    ++out_list->count;
  }
  if (!status && rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "global job list");
  }
  if (stmt) {
    sqlite3_reset(stmt);
  }
  pcp_store_unlock(store);
  if (status) {
    pcp_store_global_job_list_deinitialize(out_list);
  }
  return status;
}

pcp_status_t pcp_store_global_job_counts(
    pcp_store_t* store, int64_t out_counts[PCP_STORE_GLOBAL_JOB_STATE_COUNT]) {
  memset(out_counts, 0, sizeof(int64_t) * PCP_STORE_GLOBAL_JOB_STATE_COUNT);
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_FED_JOB_COUNT,
      "SELECT state, count(*) FROM federation_global_jobs GROUP BY state",
      &stmt);
  int rc = SQLITE_DONE;
  while (!status && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    const char* state = (const char*)sqlite3_column_text(stmt, 0);
    for (size_t i = 0; state && i < PCP_STORE_GLOBAL_JOB_STATE_COUNT; ++i) {
      if (strcmp(state, pcp_store_global_job_state_names[i]) == 0) {
        out_counts[i] = sqlite3_column_int64(stmt, 1);
      }
    }
  }
  if (!status && rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "global job counts");
  }
  if (stmt) {
    sqlite3_reset(stmt);
  }
  pcp_store_unlock(store);
  return status;
}

//===----------------------------------------------------------------------===//
// Acknowledged sequences
//===----------------------------------------------------------------------===//

pcp_status_t pcp_store_federation_ack_get(pcp_store_t* store,
                                          const char* gateway_id,
                                          int64_t* out_sequence) {
  *out_sequence = 0;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("gateway_id", gateway_id, false));
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_FED_ACK_GET,
      "SELECT acked_sequence FROM federation_acks WHERE gateway_id = ?1",
      &stmt);
  if (!status) {
    status = pcp_store_bind_check(
        store, sqlite3_bind_text(stmt, 1, gateway_id, -1, SQLITE_STATIC));
  }
  if (!status) {
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      *out_sequence = sqlite3_column_int64(stmt, 0);
    } else if (rc != SQLITE_DONE) {
      status = pcp_store_db_status(store, rc, "federation ack get");
    }
    sqlite3_reset(stmt);
  }
  pcp_store_unlock(store);
  return status;
}

pcp_status_t pcp_store_federation_ack_raise_locked(pcp_store_t* store,
                                                   const char* gateway_id,
                                                   int64_t sequence) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("gateway_id", gateway_id, false));
  if (sequence < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "acknowledged sequence must not be negative");
  }
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_FED_ACK_RAISE,
      "INSERT INTO federation_acks(gateway_id, acked_sequence, updated_at_ns)"
      " VALUES (?1, ?2, ?3) ON CONFLICT(gateway_id) DO UPDATE SET"
      " acked_sequence = max(acked_sequence, excluded.acked_sequence),"
      " updated_at_ns = excluded.updated_at_ns",
      &stmt));
  int brc = sqlite3_bind_text(stmt, 1, gateway_id, -1, SQLITE_STATIC);
  brc |= sqlite3_bind_int64(stmt, 2, sequence);
  brc |= sqlite3_bind_int64(stmt, 3, pcp_store_now_ns(store));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
  return pcp_store_stmt_run(store, stmt, "federation ack raise");
}

pcp_status_t pcp_store_federation_ack_raise(pcp_store_t* store,
                                            const char* gateway_id,
                                            int64_t sequence) {
  pcp_store_lock(store);
  pcp_status_t status =
      pcp_store_federation_ack_raise_locked(store, gateway_id, sequence);
  pcp_store_unlock(store);
  return status;
}

//===----------------------------------------------------------------------===//
// Policies
//===----------------------------------------------------------------------===//

pcp_status_t pcp_store_federation_policy_put(pcp_store_t* store,
                                             const char* namespace_id,
                                             const json_t* policy) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("namespace_id", namespace_id, true));
  if (!policy) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "policy is required");
  }
  char* text = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_json_encode("policy", policy, "{}", true, &text));
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_FED_POLICY_PUT,
      "INSERT INTO federation_policies(namespace_id, policy, updated_at_ns)"
      " VALUES (?1, ?2, ?3) ON CONFLICT(namespace_id) DO UPDATE SET"
      " policy = excluded.policy, updated_at_ns = excluded.updated_at_ns",
      &stmt);
  if (!status) {
    int brc = sqlite3_bind_text(stmt, 1, namespace_id, -1, SQLITE_STATIC);
    brc |= sqlite3_bind_text(stmt, 2, text, -1, SQLITE_STATIC);
    brc |= sqlite3_bind_int64(stmt, 3, pcp_store_now_ns(store));
    status = pcp_store_bind_check(store, brc);
  }
  if (!status) {
    status = pcp_store_stmt_run(store, stmt, "federation policy put");
  }
  if (stmt) {
    sqlite3_clear_bindings(stmt);
  }
  pcp_store_unlock(store);
  pcp_allocator_free(pcp_allocator_system(), text);
  return status;
}

pcp_status_t pcp_store_federation_policy_list(pcp_store_t* store,
                                              json_t** out_policies) {
  *out_policies = NULL;
  json_t* policies = json_object();
  if (!policies) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "policy list");
  }
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_FED_POLICY_LIST,
      "SELECT namespace_id, policy FROM federation_policies"
      " ORDER BY namespace_id",
      &stmt);
  int rc = SQLITE_DONE;
  while (!status && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    char namespace_id[PCP_STORE_ID_MAX_LENGTH + 1];
    pcp_store_text_column(stmt, 0, namespace_id, sizeof(namespace_id));
    json_t* policy = NULL;
    status = pcp_store_json_column(stmt, 1, &policy);
    if (!status && json_object_set_new(policies, namespace_id, policy) != 0) {
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "policy list");
    }
  }
  if (!status && rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "federation policy list");
  }
  if (stmt) {
    sqlite3_reset(stmt);
  }
  pcp_store_unlock(store);
  if (status) {
    json_decref(policies);
    return status;
  }
  *out_policies = policies;
  return pcp_ok_status();
}
