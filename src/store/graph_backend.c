// SPDX-License-Identifier: Apache-2.0
// Graph backend dispatch and the SQLite implementation (the store's own
// graph tables; graph.c does the work).

#include <stdlib.h>
#include <string.h>

#include "store/graph_backend_impl.h"

bool pcp_store_graph_backend_kind_parse(
    const char* name, pcp_store_graph_backend_kind_t* out_kind) {
  if (name && strcmp(name, "sqlite") == 0) {
    *out_kind = PCP_STORE_GRAPH_BACKEND_SQLITE;
    return true;
  }
  if (name && strcmp(name, "falkordb") == 0) {
    *out_kind = PCP_STORE_GRAPH_BACKEND_FALKORDB;
    return true;
  }
  return false;
}

//===----------------------------------------------------------------------===//
// Dispatch
//===----------------------------------------------------------------------===//

const char* pcp_store_graph_backend_name(
    const pcp_store_graph_backend_t* backend) {
  return backend->vtable->name;
}

pcp_status_t pcp_store_graph_backend_mutation_apply(
    pcp_store_graph_backend_t* backend, const pcp_store_mutation_t* mutation,
    int64_t* out_sequence_no, bool* out_duplicate) {
  return backend->vtable->mutation_apply(backend, mutation, out_sequence_no,
                                         out_duplicate);
}

pcp_status_t pcp_store_graph_backend_query(
    pcp_store_graph_backend_t* backend, const pcp_store_graph_query_t* query,
    pcp_store_graph_result_t* out_result) {
  return backend->vtable->query(backend, query, out_result);
}

pcp_status_t pcp_store_graph_backend_entity_get(
    pcp_store_graph_backend_t* backend, const char* entity_id,
    pcp_store_graph_entity_t* out_entity) {
  return backend->vtable->entity_get(backend, entity_id, out_entity);
}

pcp_status_t pcp_store_graph_backend_neighbors_list(
    pcp_store_graph_backend_t* backend, const char* entity_id,
    const char* relation_type, pcp_store_graph_direction_t direction,
    uint32_t limit, pcp_store_graph_result_t* out_result) {
  return backend->vtable->neighbors_list(backend, entity_id, relation_type,
                                         direction, limit, out_result);
}

pcp_status_t pcp_store_graph_backend_counts_query(
    pcp_store_graph_backend_t* backend, pcp_store_graph_counts_t* out_counts) {
  memset(out_counts, 0, sizeof(*out_counts));
  return backend->vtable->counts_query(backend, out_counts);
}

void pcp_store_graph_backend_close(pcp_store_graph_backend_t* backend) {
  if (backend) {
    backend->vtable->close(backend);
  }
}

//===----------------------------------------------------------------------===//
// SQLite
//===----------------------------------------------------------------------===//

static pcp_status_t sqlite_mutation_apply(pcp_store_graph_backend_t* backend,
                                          const pcp_store_mutation_t* mutation,
                                          int64_t* out_sequence_no,
                                          bool* out_duplicate) {
  return pcp_store_graph_mutation_apply(backend->store, mutation,
                                        out_sequence_no, out_duplicate);
}

static pcp_status_t sqlite_query(pcp_store_graph_backend_t* backend,
                                 const pcp_store_graph_query_t* query,
                                 pcp_store_graph_result_t* out_result) {
  return pcp_store_graph_query(backend->store, query, out_result);
}

static pcp_status_t sqlite_entity_get(pcp_store_graph_backend_t* backend,
                                      const char* entity_id,
                                      pcp_store_graph_entity_t* out_entity) {
  return pcp_store_graph_entity_get(backend->store, entity_id, out_entity);
}

static pcp_status_t sqlite_neighbors_list(
    pcp_store_graph_backend_t* backend, const char* entity_id,
    const char* relation_type, pcp_store_graph_direction_t direction,
    uint32_t limit, pcp_store_graph_result_t* out_result) {
  return pcp_store_graph_neighbors_list(
      backend->store, entity_id, relation_type, direction, limit, out_result);
}

static pcp_status_t sqlite_counts_query(pcp_store_graph_backend_t* backend,
                                        pcp_store_graph_counts_t* out_counts) {
  pcp_store_t* store = backend->store;
  // Rare (the status route): prepared per call, not cached.
  static const char kSql[] =
      "SELECT (SELECT count(*) FROM graph_entities),"
      " (SELECT count(*) FROM graph_relations),"
      " (SELECT count(*) FROM graph_observations),"
      " (SELECT count(*) FROM (SELECT namespace_id FROM graph_entities"
      "  UNION SELECT namespace_id FROM graph_relations"
      "  UNION SELECT namespace_id FROM graph_observations))";
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  int rc = sqlite3_prepare_v2(store->db, kSql, -1, &stmt, NULL);
  pcp_status_t status = pcp_ok_status();
  if (rc == SQLITE_OK) {
    rc = sqlite3_step(stmt);
  }
  if (rc == SQLITE_ROW) {
    out_counts->entities = sqlite3_column_int64(stmt, 0);
    out_counts->relations = sqlite3_column_int64(stmt, 1);
    out_counts->observations = sqlite3_column_int64(stmt, 2);
    out_counts->namespaces = sqlite3_column_int64(stmt, 3);
  } else {
    status = pcp_store_db_status(store, rc, "graph counts");
  }
  sqlite3_finalize(stmt);
  pcp_store_unlock(store);
  return status;
}

static void sqlite_close(pcp_store_graph_backend_t* backend) {
  pcp_allocator_free(backend->store->allocator, backend);
}

static const pcp_store_graph_backend_vtable_t kSqliteVtable = {
    .name = "sqlite",
    .mutation_apply = sqlite_mutation_apply,
    .query = sqlite_query,
    .entity_get = sqlite_entity_get,
    .neighbors_list = sqlite_neighbors_list,
    .counts_query = sqlite_counts_query,
    .close = sqlite_close,
};

pcp_status_t pcp_store_graph_backend_sqlite_open(
    pcp_store_t* store, pcp_store_graph_backend_t** out_backend) {
  *out_backend = NULL;
  pcp_store_graph_backend_t* backend = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      store->allocator, sizeof(*backend), (void**)&backend));
  backend->vtable = &kSqliteVtable;
  backend->store = store;
  *out_backend = backend;
  return pcp_ok_status();
}
