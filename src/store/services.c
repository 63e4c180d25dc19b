// SPDX-License-Identifier: Apache-2.0
// store: services with a TTL, and the persisted mirror of the scheduler's
// leases and reservations.

#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <sqlite3.h>

#include "store/store_impl.h"

//===----------------------------------------------------------------------===//
// Services
//===----------------------------------------------------------------------===//

void pcp_store_service_deinitialize(pcp_store_service_t* service) {
  if (!service) {
    return;
  }
  json_decref(service->attributes);
  memset(service, 0, sizeof(*service));
}

void pcp_store_service_list_deinitialize(pcp_store_service_list_t* list) {
  for (size_t i = 0; i < list->count; ++i) {
    pcp_store_service_deinitialize(&list->items[i]);
  }
  if (list->items) {
    pcp_allocator_free(list->allocator, list->items);
  }
  memset(list, 0, sizeof(*list));
}

#define SERVICE_COLUMNS                                                   \
  "executor_id, service_id, service_type, base_url, attributes, ttl_ns, " \
  "registered_at_ns, updated_at_ns, heartbeat_at_ns, expires_at_ns"

static pcp_status_t service_from_row(sqlite3_stmt* stmt, int64_t now_ns,
                                     pcp_store_service_t* service) {
  memset(service, 0, sizeof(*service));
  pcp_store_text_column(stmt, 0, service->executor_id,
                        sizeof(service->executor_id));
  pcp_store_text_column(stmt, 1, service->service_id,
                        sizeof(service->service_id));
  pcp_store_text_column(stmt, 2, service->service_type,
                        sizeof(service->service_type));
  pcp_store_text_column(stmt, 3, service->base_url, sizeof(service->base_url));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_json_column(stmt, 4, &service->attributes));
  service->ttl_ns = sqlite3_column_int64(stmt, 5);
  service->registered_at_ns = sqlite3_column_int64(stmt, 6);
  service->updated_at_ns = sqlite3_column_int64(stmt, 7);
  service->heartbeat_at_ns = sqlite3_column_int64(stmt, 8);
  service->expires_at_ns = sqlite3_column_int64(stmt, 9);
  service->expired = service->expires_at_ns <= now_ns;
  return pcp_ok_status();
}

// Reads every row of a prepared, bound statement into a service list.
static pcp_status_t service_rows(pcp_store_t* store, sqlite3_stmt* stmt,
                                 pcp_store_service_list_t* out_list) {
  int64_t now = pcp_store_now_ns(store);
  size_t capacity = 0;
  pcp_status_t status = pcp_ok_status();
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    status = pcp_store_list_reserve(
        out_list->allocator, sizeof(pcp_store_service_t), out_list->count,
        &capacity, (void**)&out_list->items);
    if (!status) {
      status = service_from_row(stmt, now, &out_list->items[out_list->count]);
    }
    if (status) {
      break;
    }
    ++out_list->count;
  }
  if (!status && rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "service list");
  }
  sqlite3_reset(stmt);
  return status;
}

pcp_status_t pcp_store_service_register(pcp_store_t* store,
                                        const pcp_store_service_t* service) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("executor_id", service->executor_id, true));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("service_id", service->service_id, true));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_name_validate(
      "service_type", service->service_type, PCP_STORE_NAME_MAX_LENGTH, false));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_name_validate(
      "base_url", service->base_url, PCP_STORE_PATH_MAX_LENGTH, false));
  if (service->ttl_ns <= 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "service ttl must be positive (got %lld ns)",
                           (long long)service->ttl_ns);
  }
  char* attributes = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_json_encode(
      "service attributes", service->attributes, "{}", true, &attributes));
  pcp_store_lock(store);
  int64_t now = pcp_store_now_ns(store);
  int64_t expires = 0;
  if (__builtin_add_overflow(now, service->ttl_ns, &expires)) {
    expires = INT64_MAX;
  }
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_SERVICE_UPSERT,
      "INSERT INTO services(" SERVICE_COLUMNS
      ")"
      " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?7, ?8)"
      " ON CONFLICT(executor_id) DO UPDATE SET service_id = "
      "excluded.service_id,"
      " service_type = excluded.service_type, base_url = excluded.base_url,"
      " attributes = excluded.attributes, ttl_ns = excluded.ttl_ns,"
      " updated_at_ns = excluded.updated_at_ns,"
      " heartbeat_at_ns = excluded.heartbeat_at_ns,"
      " expires_at_ns = excluded.expires_at_ns",
      &stmt);
  if (!status) {
    int brc =
        sqlite3_bind_text(stmt, 1, service->executor_id, -1, SQLITE_TRANSIENT);
    brc |=
        sqlite3_bind_text(stmt, 2, service->service_id, -1, SQLITE_TRANSIENT);
    brc |=
        sqlite3_bind_text(stmt, 3, service->service_type, -1, SQLITE_TRANSIENT);
    brc |= sqlite3_bind_text(stmt, 4, service->base_url, -1, SQLITE_TRANSIENT);
    brc |= sqlite3_bind_text(stmt, 5, attributes, -1, SQLITE_TRANSIENT);
    brc |= sqlite3_bind_int64(stmt, 6, service->ttl_ns);
    brc |= sqlite3_bind_int64(stmt, 7, now);
    brc |= sqlite3_bind_int64(stmt, 8, expires);
    status = pcp_store_bind_check(store, brc);
  }
  if (!status) {
    status = pcp_store_stmt_run(store, stmt, "service register");
  }
  pcp_store_unlock(store);
  pcp_allocator_free(pcp_allocator_system(), attributes);
  return status;
}

pcp_status_t pcp_store_service_heartbeat(pcp_store_t* store,
                                         const char* executor_id) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("executor_id", executor_id, true));
  pcp_store_lock(store);
  int64_t now = pcp_store_now_ns(store);
  sqlite3_stmt* stmt = NULL;
  // One statement both checks and extends, so a heartbeat can never revive a
  // registration that had already run out.
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_SERVICE_HEARTBEAT,
      "UPDATE services SET heartbeat_at_ns = ?2,"
      " expires_at_ns = CASE WHEN ?2 > 9223372036854775807 - ttl_ns"
      "   THEN 9223372036854775807 ELSE ?2 + ttl_ns END"
      " WHERE executor_id = ?1 AND expires_at_ns > ?2",
      &stmt);
  if (!status) {
    int brc = sqlite3_bind_text(stmt, 1, executor_id, -1, SQLITE_TRANSIENT);
    brc |= sqlite3_bind_int64(stmt, 2, now);
    status = pcp_store_bind_check(store, brc);
  }
  if (!status) {
    status = pcp_store_stmt_run(store, stmt, "service heartbeat");
  }
  if (!status && sqlite3_changes(store->db) == 0) {
    // Tell "never registered / swept" from "lapsed".
    pcp_store_service_t service;
    sqlite3_stmt* get = NULL;
    status = pcp_store_stmt_acquire(store, PCP_STORE_STMT_SERVICE_GET,
                                    "SELECT " SERVICE_COLUMNS
                                    " FROM services WHERE executor_id = ?1",
                                    &get);
    if (!status) {
      status = pcp_store_bind_check(
          store, sqlite3_bind_text(get, 1, executor_id, -1, SQLITE_TRANSIENT));
    }
    if (!status) {
      int rc = sqlite3_step(get);
      if (rc == SQLITE_ROW) {
        status = service_from_row(get, now, &service);
        if (!status) {
          pcp_store_service_deinitialize(&service);
          status = pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                                   "service '%s' expired: register it again",
                                   executor_id);
        }
      } else if (rc == SQLITE_DONE) {
        status =
            pcp_make_status(PCP_STATUS_NOT_FOUND, "service '%s'", executor_id);
      } else {
        status = pcp_store_db_status(store, rc, "service get");
      }
      sqlite3_reset(get);
    }
  }
  pcp_store_unlock(store);
  return status;
}

pcp_status_t pcp_store_service_get(pcp_store_t* store, const char* executor_id,
                                   pcp_store_service_t* out_service) {
  memset(out_service, 0, sizeof(*out_service));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("executor_id", executor_id, true));
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_SERVICE_GET,
      "SELECT " SERVICE_COLUMNS " FROM services WHERE executor_id = ?1", &stmt);
  if (!status) {
    status = pcp_store_bind_check(
        store, sqlite3_bind_text(stmt, 1, executor_id, -1, SQLITE_TRANSIENT));
  }
  if (!status) {
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      status = service_from_row(stmt, pcp_store_now_ns(store), out_service);
    } else if (rc == SQLITE_DONE) {
      status =
          pcp_make_status(PCP_STATUS_NOT_FOUND, "service '%s'", executor_id);
    } else {
      status = pcp_store_db_status(store, rc, "service get");
    }
    sqlite3_reset(stmt);
  }
  pcp_store_unlock(store);
  return status;
}

pcp_status_t pcp_store_service_list(pcp_store_t* store,
                                    const char* after_executor_id,
                                    uint32_t limit,
                                    pcp_store_service_list_t* out_list) {
  memset(out_list, 0, sizeof(*out_list));
  out_list->allocator = store->allocator;
  if (after_executor_id) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_store_id_validate("after executor_id", after_executor_id, true));
  }
  limit = pcp_store_limit_normalize(limit, PCP_STORE_LIST_LIMIT_DEFAULT);
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_SERVICE_LIST,
      "SELECT " SERVICE_COLUMNS
      " FROM services"
      " WHERE ?1 IS NULL OR executor_id > ?1 ORDER BY executor_id LIMIT ?2",
      &stmt);
  if (!status) {
    int brc = after_executor_id ? sqlite3_bind_text(stmt, 1, after_executor_id,
                                                    -1, SQLITE_TRANSIENT)
                                : sqlite3_bind_null(stmt, 1);
    brc |= sqlite3_bind_int64(stmt, 2, limit);
    status = pcp_store_bind_check(store, brc);
  }
  if (!status) {
    status = service_rows(store, stmt, out_list);
  }
  pcp_store_unlock(store);
  if (status) {
    pcp_store_service_list_deinitialize(out_list);
  }
  return status;
}

static pcp_status_t service_delete_locked(pcp_store_t* store,
                                          const char* executor_id) {
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_SERVICE_DELETE,
      "DELETE FROM services WHERE executor_id = ?1", &stmt));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(
      store, sqlite3_bind_text(stmt, 1, executor_id, -1, SQLITE_TRANSIENT)));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_run(store, stmt, "service delete"));
  if (sqlite3_changes(store->db) == 0) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "service '%s'", executor_id);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_store_service_delete(pcp_store_t* store,
                                      const char* executor_id) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("executor_id", executor_id, true));
  pcp_store_lock(store);
  pcp_status_t status = service_delete_locked(store, executor_id);
  pcp_store_unlock(store);
  return status;
}

pcp_status_t pcp_store_service_expired_sweep(
    pcp_store_t* store, pcp_store_service_list_t* out_expired) {
  memset(out_expired, 0, sizeof(*out_expired));
  out_expired->allocator = store->allocator;
  pcp_store_lock(store);
  pcp_status_t status = pcp_store_tx_begin(store);
  if (!status) {
    sqlite3_stmt* stmt = NULL;
    status =
        pcp_store_stmt_acquire(store, PCP_STORE_STMT_SERVICE_EXPIRED,
                               "SELECT " SERVICE_COLUMNS
                               " FROM services WHERE expires_at_ns <= ?1"
                               " ORDER BY expires_at_ns, executor_id LIMIT ?2",
                               &stmt);
    if (!status) {
      int brc = sqlite3_bind_int64(stmt, 1, pcp_store_now_ns(store));
      brc |= sqlite3_bind_int64(stmt, 2, PCP_STORE_LIST_LIMIT_MAX);
      status = pcp_store_bind_check(store, brc);
    }
    if (!status) {
      status = service_rows(store, stmt, out_expired);
    }
    for (size_t i = 0; !status && i < out_expired->count; ++i) {
      status = service_delete_locked(store, out_expired->items[i].executor_id);
    }
    status = pcp_store_tx_finish(store, status);
  }
  pcp_store_unlock(store);
  if (status) {
    pcp_store_service_list_deinitialize(out_expired);
  }
  return status;
}

//===----------------------------------------------------------------------===//
// Leases
//===----------------------------------------------------------------------===//

void pcp_store_lease_list_deinitialize(pcp_store_lease_list_t* list) {
  if (list->items) {
    pcp_allocator_free(list->allocator, list->items);
  }
  memset(list, 0, sizeof(*list));
}

// SQLite integers are signed 64-bit; ids and tags above INT64_MAX would come
// back negative, so they are refused instead of wrapping.
static pcp_status_t u64_validate(const char* field, uint64_t value,
                                 bool allow_zero) {
  if (value > (uint64_t)INT64_MAX || (!allow_zero && value == 0)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%s %llu is out of range (1..2^63-1)", field,
                           (unsigned long long)value);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_store_meta_raise_locked(pcp_store_t* store, const char* key,
                                         int64_t value) {
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_META_MAX,
      "INSERT INTO meta(key, value) VALUES (?1, ?2) ON CONFLICT(key)"
      " DO UPDATE SET value = max(value, excluded.value)",
      &stmt));
  int brc = sqlite3_bind_text(stmt, 1, key, -1, SQLITE_STATIC);
  brc |= sqlite3_bind_int64(stmt, 2, value);
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
  return pcp_store_stmt_run(store, stmt, "meta update");
}

pcp_status_t pcp_store_meta_get_locked(pcp_store_t* store, const char* key,
                                       int64_t* out_value) {
  *out_value = 0;
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_stmt_acquire(store, PCP_STORE_STMT_META_GET,
                             "SELECT value FROM meta WHERE key = ?1", &stmt));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(
      store, sqlite3_bind_text(stmt, 1, key, -1, SQLITE_STATIC)));
  int rc = sqlite3_step(stmt);
  pcp_status_t status = pcp_ok_status();
  if (rc == SQLITE_ROW) {
    *out_value = sqlite3_column_int64(stmt, 0);
  } else if (rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "meta get");
  }
  sqlite3_reset(stmt);
  return status;
}

static pcp_status_t lease_validate(const pcp_store_lease_t* lease) {
  PCP_RETURN_IF_ERROR_BARE(u64_validate("lease id", lease->lease_id, false));
  PCP_RETURN_IF_ERROR_BARE(u64_validate("lease tag", lease->tag, true));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_name_validate(
      "lease owner", lease->owner, PCP_STORE_NAME_MAX_LENGTH, false));
  if (lease->worker_id[0]) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_store_id_validate("lease worker_id", lease->worker_id, true));
  }
  if (lease->job_id[0]) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_store_id_validate("lease job_id", lease->job_id, false));
  }
  return pcp_ok_status();
}

static pcp_status_t lease_put_locked(pcp_store_t* store,
                                     const pcp_store_lease_t* lease) {
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_LEASE_UPSERT,
      "INSERT OR REPLACE INTO leases(lease_id, owner, worker_id, tag, job_id,"
      " deadline_ns, updated_at_ns) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
      &stmt));
  int brc = sqlite3_bind_int64(stmt, 1, (int64_t)lease->lease_id);
  brc |= sqlite3_bind_text(stmt, 2, lease->owner, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 3, lease->worker_id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_int64(stmt, 4, (int64_t)lease->tag);
  brc |= sqlite3_bind_text(stmt, 5, lease->job_id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_int64(stmt, 6, lease->deadline_ns);
  brc |= sqlite3_bind_int64(stmt, 7, pcp_store_now_ns(store));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_run(store, stmt, "lease put"));
  return pcp_store_meta_raise_locked(store, "lease_id_high_water",
                                     (int64_t)lease->lease_id);
}

pcp_status_t pcp_store_lease_put(pcp_store_t* store,
                                 const pcp_store_lease_t* lease) {
  PCP_RETURN_IF_ERROR_BARE(lease_validate(lease));
  pcp_store_lock(store);
  pcp_status_t status = pcp_store_tx_begin(store);
  if (!status) {
    status = pcp_store_tx_finish(store, lease_put_locked(store, lease));
  }
  pcp_store_unlock(store);
  return status;
}

pcp_status_t pcp_store_lease_delete(pcp_store_t* store, uint64_t lease_id) {
  PCP_RETURN_IF_ERROR_BARE(u64_validate("lease id", lease_id, false));
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status =
      pcp_store_stmt_acquire(store, PCP_STORE_STMT_LEASE_DELETE,
                             "DELETE FROM leases WHERE lease_id = ?1", &stmt);
  if (!status) {
    status = pcp_store_bind_check(
        store, sqlite3_bind_int64(stmt, 1, (int64_t)lease_id));
  }
  if (!status) {
    status = pcp_store_stmt_run(store, stmt, "lease delete");
  }
  if (!status && sqlite3_changes(store->db) == 0) {
    status = pcp_make_status(PCP_STATUS_NOT_FOUND, "lease %llu",
                             (unsigned long long)lease_id);
  }
  pcp_store_unlock(store);
  return status;
}

static void lease_from_row(sqlite3_stmt* stmt, pcp_store_lease_t* lease) {
  memset(lease, 0, sizeof(*lease));
  lease->lease_id = (uint64_t)sqlite3_column_int64(stmt, 0);
  pcp_store_text_column(stmt, 1, lease->owner, sizeof(lease->owner));
  pcp_store_text_column(stmt, 2, lease->worker_id, sizeof(lease->worker_id));
  lease->tag = (uint64_t)sqlite3_column_int64(stmt, 3);
  pcp_store_text_column(stmt, 4, lease->job_id, sizeof(lease->job_id));
  lease->deadline_ns = sqlite3_column_int64(stmt, 5);
  lease->updated_at_ns = sqlite3_column_int64(stmt, 6);
}

#define LEASE_COLUMNS \
  "lease_id, owner, worker_id, tag, job_id, deadline_ns, updated_at_ns"

pcp_status_t pcp_store_lease_get(pcp_store_t* store, uint64_t lease_id,
                                 pcp_store_lease_t* out_lease) {
  memset(out_lease, 0, sizeof(*out_lease));
  PCP_RETURN_IF_ERROR_BARE(u64_validate("lease id", lease_id, false));
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_LEASE_GET,
      "SELECT " LEASE_COLUMNS " FROM leases WHERE lease_id = ?1", &stmt);
  if (!status) {
    status = pcp_store_bind_check(
        store, sqlite3_bind_int64(stmt, 1, (int64_t)lease_id));
  }
  if (!status) {
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      lease_from_row(stmt, out_lease);
    } else if (rc == SQLITE_DONE) {
      status = pcp_make_status(PCP_STATUS_NOT_FOUND, "lease %llu",
                               (unsigned long long)lease_id);
    } else {
      status = pcp_store_db_status(store, rc, "lease get");
    }
    sqlite3_reset(stmt);
  }
  pcp_store_unlock(store);
  return status;
}

pcp_status_t pcp_store_lease_list(pcp_store_t* store, uint64_t after_lease_id,
                                  uint32_t limit,
                                  pcp_store_lease_list_t* out_list) {
  memset(out_list, 0, sizeof(*out_list));
  out_list->allocator = store->allocator;
  PCP_RETURN_IF_ERROR_BARE(
      u64_validate("after lease id", after_lease_id, true));
  limit = pcp_store_limit_normalize(limit, PCP_STORE_LIST_LIMIT_DEFAULT);
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status =
      pcp_store_stmt_acquire(store, PCP_STORE_STMT_LEASE_LIST,
                             "SELECT " LEASE_COLUMNS
                             " FROM leases WHERE lease_id > ?1"
                             " ORDER BY lease_id LIMIT ?2",
                             &stmt);
  if (!status) {
    int brc = sqlite3_bind_int64(stmt, 1, (int64_t)after_lease_id);
    brc |= sqlite3_bind_int64(stmt, 2, limit);
    status = pcp_store_bind_check(store, brc);
  }
  size_t capacity = 0;
  int rc = SQLITE_DONE;
  while (!status && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    status = pcp_store_list_reserve(out_list->allocator,
                                    sizeof(pcp_store_lease_t), out_list->count,
                                    &capacity, (void**)&out_list->items);
    if (!status) {
      lease_from_row(stmt, &out_list->items[out_list->count++]);
    }
  }
  if (!status && rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "lease list");
  }
  if (stmt) {
    sqlite3_reset(stmt);
  }
  pcp_store_unlock(store);
  if (status) {
    pcp_store_lease_list_deinitialize(out_list);
  }
  return status;
}

pcp_status_t pcp_store_lease_id_high_water_query(pcp_store_t* store,
                                                 uint64_t* out_lease_id) {
  int64_t value = 0;
  pcp_store_lock(store);
  pcp_status_t status =
      pcp_store_meta_get_locked(store, "lease_id_high_water", &value);
  pcp_store_unlock(store);
  *out_lease_id = (uint64_t)value;
  return status;
}

//===----------------------------------------------------------------------===//
// Reservations
//===----------------------------------------------------------------------===//

void pcp_store_reservation_list_deinitialize(
    pcp_store_reservation_list_t* list) {
  for (size_t i = 0; i < list->count; ++i) {
    if (list->items[i].worker_ids) {
      pcp_allocator_free(list->allocator, list->items[i].worker_ids);
    }
  }
  if (list->items) {
    pcp_allocator_free(list->allocator, list->items);
  }
  memset(list, 0, sizeof(*list));
}

static pcp_status_t reservation_put_locked(
    pcp_store_t* store, const pcp_store_reservation_t* reservation) {
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_RESERVATION_INSERT,
      "INSERT INTO reservations(reservation_id, owner, tag, deadline_ns,"
      " worker_count, created_at_ns) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
      &stmt));
  int brc = sqlite3_bind_int64(stmt, 1, (int64_t)reservation->reservation_id);
  brc |= sqlite3_bind_text(stmt, 2, reservation->owner, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_int64(stmt, 3, (int64_t)reservation->tag);
  brc |= sqlite3_bind_int64(stmt, 4, reservation->deadline_ns);
  brc |= sqlite3_bind_int64(stmt, 5, reservation->worker_count);
  brc |= sqlite3_bind_int64(stmt, 6, pcp_store_now_ns(store));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
  pcp_status_t status = pcp_store_stmt_run(store, stmt, "reservation put");
  if (pcp_status_code(status) == PCP_STATUS_ALREADY_EXISTS) {
    pcp_status_ignore(status);
    return pcp_make_status(PCP_STATUS_ALREADY_EXISTS, "reservation %llu",
                           (unsigned long long)reservation->reservation_id);
  }
  PCP_RETURN_IF_ERROR_BARE(status);
  for (uint32_t i = 0; i < reservation->worker_count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
        store, PCP_STORE_STMT_RESERVATION_WORKER_INSERT,
        "INSERT INTO reservation_workers(reservation_id, position, worker_id)"
        " VALUES (?1, ?2, ?3)",
        &stmt));
    brc = sqlite3_bind_int64(stmt, 1, (int64_t)reservation->reservation_id);
    brc |= sqlite3_bind_int64(stmt, 2, i);
    brc |= sqlite3_bind_text(stmt, 3, reservation->worker_ids[i].value, -1,
                             SQLITE_TRANSIENT);
    PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
    status = pcp_store_stmt_run(store, stmt, "reservation worker");
    if (pcp_status_code(status) == PCP_STATUS_ALREADY_EXISTS) {
      pcp_status_ignore(status);
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "reservation %llu names worker '%s' twice",
                             (unsigned long long)reservation->reservation_id,
                             reservation->worker_ids[i].value);
    }
    PCP_RETURN_IF_ERROR_BARE(status);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_store_reservation_put(
    pcp_store_t* store, const pcp_store_reservation_t* reservation) {
  PCP_RETURN_IF_ERROR_BARE(
      u64_validate("reservation id", reservation->reservation_id, false));
  PCP_RETURN_IF_ERROR_BARE(
      u64_validate("reservation tag", reservation->tag, true));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_name_validate("reservation owner", reservation->owner,
                              PCP_STORE_NAME_MAX_LENGTH, false));
  if (reservation->worker_count == 0 ||
      reservation->worker_count > PCP_STORE_RESERVATION_WORKER_COUNT_MAX ||
      !reservation->worker_ids) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "reservation worker_count %u is not in 1..%u",
                           (unsigned)reservation->worker_count,
                           PCP_STORE_RESERVATION_WORKER_COUNT_MAX);
  }
  for (uint32_t i = 0; i < reservation->worker_count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(pcp_store_id_validate(
        "reservation worker id", reservation->worker_ids[i].value, true));
  }
  pcp_store_lock(store);
  pcp_status_t status = pcp_store_tx_begin(store);
  if (!status) {
    status =
        pcp_store_tx_finish(store, reservation_put_locked(store, reservation));
  }
  pcp_store_unlock(store);
  return status;
}

pcp_status_t pcp_store_reservation_delete(pcp_store_t* store,
                                          uint64_t reservation_id) {
  PCP_RETURN_IF_ERROR_BARE(
      u64_validate("reservation id", reservation_id, false));
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  // reservation_workers rows go with it (ON DELETE CASCADE).
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_RESERVATION_DELETE,
      "DELETE FROM reservations WHERE reservation_id = ?1", &stmt);
  if (!status) {
    status = pcp_store_bind_check(
        store, sqlite3_bind_int64(stmt, 1, (int64_t)reservation_id));
  }
  if (!status) {
    status = pcp_store_stmt_run(store, stmt, "reservation delete");
  }
  if (!status && sqlite3_changes(store->db) == 0) {
    status = pcp_make_status(PCP_STATUS_NOT_FOUND, "reservation %llu",
                             (unsigned long long)reservation_id);
  }
  pcp_store_unlock(store);
  return status;
}

static pcp_status_t reservation_workers_read(
    pcp_store_t* store, pcp_allocator_t allocator,
    pcp_store_reservation_t* reservation) {
  uint32_t count = reservation->worker_count;
  if (count == 0 || count > PCP_STORE_RESERVATION_WORKER_COUNT_MAX) {
    return pcp_make_status(
        PCP_STATUS_DATA_LOSS, "reservation %llu has worker_count %u",
        (unsigned long long)reservation->reservation_id, (unsigned)count);
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, count * sizeof(pcp_store_worker_id_t),
                           (void**)&reservation->worker_ids));
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_RESERVATION_WORKERS,
      "SELECT worker_id FROM reservation_workers WHERE reservation_id = ?1"
      " ORDER BY position",
      &stmt));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(
      store,
      sqlite3_bind_int64(stmt, 1, (int64_t)reservation->reservation_id)));
  uint32_t seen = 0;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW && seen < count) {
    pcp_store_text_column(stmt, 0, reservation->worker_ids[seen].value,
                          sizeof(reservation->worker_ids[seen].value));
    ++seen;
  }
  pcp_status_t status = pcp_ok_status();
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
    status = pcp_store_db_status(store, rc, "reservation workers");
  } else if (rc == SQLITE_ROW || seen != count) {
    status = pcp_make_status(PCP_STATUS_DATA_LOSS,
                             "reservation %llu lists %u workers, not %u",
                             (unsigned long long)reservation->reservation_id,
                             (unsigned)seen, (unsigned)count);
  }
  sqlite3_reset(stmt);
  return status;
}

pcp_status_t pcp_store_reservation_list(
    pcp_store_t* store, uint64_t after_reservation_id, uint32_t limit,
    pcp_store_reservation_list_t* out_list) {
  memset(out_list, 0, sizeof(*out_list));
  out_list->allocator = store->allocator;
  PCP_RETURN_IF_ERROR_BARE(
      u64_validate("after reservation id", after_reservation_id, true));
  limit = pcp_store_limit_normalize(limit, PCP_STORE_LIST_LIMIT_DEFAULT);
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  // Headers and workers from one snapshot.
  bool in_transaction = false;
  pcp_status_t status = pcp_store_tx_begin_read(store);
  if (!status) {
    in_transaction = true;
    status = pcp_store_stmt_acquire(
        store, PCP_STORE_STMT_RESERVATION_LIST,
        "SELECT reservation_id, owner, tag, deadline_ns, worker_count,"
        " created_at_ns FROM reservations WHERE reservation_id > ?1"
        " ORDER BY reservation_id LIMIT ?2",
        &stmt);
  }
  if (!status) {
    int brc = sqlite3_bind_int64(stmt, 1, (int64_t)after_reservation_id);
    brc |= sqlite3_bind_int64(stmt, 2, limit);
    status = pcp_store_bind_check(store, brc);
  }
  size_t capacity = 0;
  int rc = SQLITE_DONE;
  // Headers first, then the workers of each (the worker query reuses the
  // connection, so the outer statement is finished before it runs).
  while (!status && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    status = pcp_store_list_reserve(
        out_list->allocator, sizeof(pcp_store_reservation_t), out_list->count,
        &capacity, (void**)&out_list->items);
    if (status) {
      break;
    }
    pcp_store_reservation_t* r = &out_list->items[out_list->count++];
    r->reservation_id = (uint64_t)sqlite3_column_int64(stmt, 0);
    pcp_store_text_column(stmt, 1, r->owner, sizeof(r->owner));
    r->tag = (uint64_t)sqlite3_column_int64(stmt, 2);
    r->deadline_ns = sqlite3_column_int64(stmt, 3);
    r->worker_count = (uint32_t)sqlite3_column_int64(stmt, 4);
    r->created_at_ns = sqlite3_column_int64(stmt, 5);
  }
  if (!status && rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "reservation list");
  }
  if (stmt) {
    sqlite3_reset(stmt);
  }
  for (size_t i = 0; !status && i < out_list->count; ++i) {
    status = reservation_workers_read(store, out_list->allocator,
                                      &out_list->items[i]);
  }
  if (in_transaction) {
    status = pcp_store_tx_finish(store, status);
  }
  pcp_store_unlock(store);
  if (status) {
    pcp_store_reservation_list_deinitialize(out_list);
  }
  return status;
}
