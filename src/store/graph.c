// SPDX-License-Identifier: Apache-2.0
// store: the knowledge graph (entities, relations, observations), its local
// queries and the mutation log.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <sqlite3.h>

#include "store/store_impl.h"

//===----------------------------------------------------------------------===//
// Names
//===----------------------------------------------------------------------===//

static const char* const kVisibilityNames[PCP_STORE_VISIBILITY_COUNT_] = {
    "local", "shared", "global"};

const char* pcp_store_visibility_name(pcp_store_visibility_t visibility) {
  if ((unsigned)visibility >= PCP_STORE_VISIBILITY_COUNT_) {
    return "unknown";
  }
  return kVisibilityNames[visibility];
}

bool pcp_store_visibility_parse(pcp_string_view_t name,
                                pcp_store_visibility_t* out_visibility) {
  for (int i = 0; i < PCP_STORE_VISIBILITY_COUNT_; ++i) {
    if (pcp_string_view_equal(name,
                              pcp_make_cstring_view(kVisibilityNames[i]))) {
      *out_visibility = (pcp_store_visibility_t)i;
      return true;
    }
  }
  return false;
}

static const char* const kMutationTypeNames[PCP_STORE_MUTATION_TYPE_COUNT_] = {
    "upsert_entity", "upsert_relation", "append_observation",
    "delete_entity", "delete_relation", "policy_update",
};

const char* pcp_store_mutation_type_name(pcp_store_mutation_type_t type) {
  if ((unsigned)type >= PCP_STORE_MUTATION_TYPE_COUNT_) {
    return "unknown";
  }
  return kMutationTypeNames[type];
}

bool pcp_store_mutation_type_parse(pcp_string_view_t name,
                                   pcp_store_mutation_type_t* out_type) {
  for (int i = 0; i < PCP_STORE_MUTATION_TYPE_COUNT_; ++i) {
    if (pcp_string_view_equal(name,
                              pcp_make_cstring_view(kMutationTypeNames[i]))) {
      *out_type = (pcp_store_mutation_type_t)i;
      return true;
    }
  }
  return false;
}

static pcp_status_t visibility_column(sqlite3_stmt* stmt, int column,
                                      pcp_store_visibility_t* out_value) {
  const char* text = (const char*)sqlite3_column_text(stmt, column);
  if (!text ||
      !pcp_store_visibility_parse(pcp_make_cstring_view(text), out_value)) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS, "stored visibility '%s'",
                           text ? text : "(null)");
  }
  return pcp_ok_status();
}

static pcp_status_t visibility_validate(pcp_store_visibility_t visibility) {
  if ((unsigned)visibility >= PCP_STORE_VISIBILITY_COUNT_) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "visibility %d is out of range", (int)visibility);
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Records
//===----------------------------------------------------------------------===//

void pcp_store_graph_entity_deinitialize(pcp_store_graph_entity_t* entity) {
  if (!entity) {
    return;
  }
  json_decref(entity->properties);
  json_decref(entity->provenance);
  memset(entity, 0, sizeof(*entity));
}

static void relation_deinitialize(pcp_store_graph_relation_t* relation) {
  json_decref(relation->properties);
  json_decref(relation->provenance);
  memset(relation, 0, sizeof(*relation));
}

static void observation_deinitialize(
    pcp_store_graph_observation_t* observation) {
  json_decref(observation->payload);
  json_decref(observation->provenance);
  memset(observation, 0, sizeof(*observation));
}

void pcp_store_graph_result_deinitialize(pcp_store_graph_result_t* result) {
  for (size_t i = 0; i < result->entity_count; ++i) {
    pcp_store_graph_entity_deinitialize(&result->entities[i]);
  }
  for (size_t i = 0; i < result->relation_count; ++i) {
    relation_deinitialize(&result->relations[i]);
  }
  for (size_t i = 0; i < result->observation_count; ++i) {
    observation_deinitialize(&result->observations[i]);
  }
  if (result->entities) {
    pcp_allocator_free(result->allocator, result->entities);
  }
  if (result->relations) {
    pcp_allocator_free(result->allocator, result->relations);
  }
  if (result->observations) {
    pcp_allocator_free(result->allocator, result->observations);
  }
  memset(result, 0, sizeof(*result));
}

void pcp_store_mutation_list_deinitialize(pcp_store_mutation_list_t* list) {
  for (size_t i = 0; i < list->count; ++i) {
    json_decref(list->items[i].payload);
    json_decref(list->items[i].provenance);
  }
  if (list->items) {
    pcp_allocator_free(list->allocator, list->items);
  }
  memset(list, 0, sizeof(*list));
}

#define ENTITY_COLUMNS                                               \
  "entity_id, namespace_id, entity_type, display_name, visibility, " \
  "properties, provenance, created_at_ns, updated_at_ns"
#define RELATION_COLUMNS                                                     \
  "relation_id, namespace_id, relation_type, from_entity_id, to_entity_id, " \
  "visibility, properties, provenance, created_at_ns, updated_at_ns"
#define OBSERVATION_COLUMNS                                             \
  "observation_id, namespace_id, subject_entity_id, observation_type, " \
  "visibility, payload, provenance, created_at_ns"

static pcp_status_t entity_from_row(sqlite3_stmt* stmt,
                                    pcp_store_graph_entity_t* e) {
  memset(e, 0, sizeof(*e));
  pcp_store_text_column(stmt, 0, e->entity_id, sizeof(e->entity_id));
  pcp_store_text_column(stmt, 1, e->namespace_id, sizeof(e->namespace_id));
  pcp_store_text_column(stmt, 2, e->entity_type, sizeof(e->entity_type));
  pcp_store_text_column(stmt, 3, e->display_name, sizeof(e->display_name));
  pcp_status_t status = visibility_column(stmt, 4, &e->visibility);
  if (!status) {
    status = pcp_store_json_column(stmt, 5, &e->properties);
  }
  if (!status) {
    status = pcp_store_json_column(stmt, 6, &e->provenance);
  }
  e->created_at_ns = sqlite3_column_int64(stmt, 7);
  e->updated_at_ns = sqlite3_column_int64(stmt, 8);
  if (status) {
    pcp_store_graph_entity_deinitialize(e);
  }
  return status;
}

static pcp_status_t relation_from_row(sqlite3_stmt* stmt,
                                      pcp_store_graph_relation_t* r) {
  memset(r, 0, sizeof(*r));
  pcp_store_text_column(stmt, 0, r->relation_id, sizeof(r->relation_id));
  pcp_store_text_column(stmt, 1, r->namespace_id, sizeof(r->namespace_id));
  pcp_store_text_column(stmt, 2, r->relation_type, sizeof(r->relation_type));
  pcp_store_text_column(stmt, 3, r->from_entity_id, sizeof(r->from_entity_id));
  pcp_store_text_column(stmt, 4, r->to_entity_id, sizeof(r->to_entity_id));
  pcp_status_t status = visibility_column(stmt, 5, &r->visibility);
  if (!status) {
    status = pcp_store_json_column(stmt, 6, &r->properties);
  }
  if (!status) {
    status = pcp_store_json_column(stmt, 7, &r->provenance);
  }
  r->created_at_ns = sqlite3_column_int64(stmt, 8);
  r->updated_at_ns = sqlite3_column_int64(stmt, 9);
  if (status) {
    relation_deinitialize(r);
  }
  return status;
}

static pcp_status_t observation_from_row(sqlite3_stmt* stmt,
                                         pcp_store_graph_observation_t* o) {
  memset(o, 0, sizeof(*o));
  pcp_store_text_column(stmt, 0, o->observation_id, sizeof(o->observation_id));
  pcp_store_text_column(stmt, 1, o->namespace_id, sizeof(o->namespace_id));
  pcp_store_text_column(stmt, 2, o->subject_entity_id,
                        sizeof(o->subject_entity_id));
  pcp_store_text_column(stmt, 3, o->observation_type,
                        sizeof(o->observation_type));
  pcp_status_t status = visibility_column(stmt, 4, &o->visibility);
  if (!status) {
    status = pcp_store_json_column(stmt, 5, &o->payload);
  }
  if (!status) {
    status = pcp_store_json_column(stmt, 6, &o->provenance);
  }
  o->created_at_ns = sqlite3_column_int64(stmt, 7);
  if (status) {
    observation_deinitialize(o);
  }
  return status;
}

//===----------------------------------------------------------------------===//
// Writes (lock held; JSON already encoded and checked)
//===----------------------------------------------------------------------===//

typedef struct encoded_json_t {
  char* first;   // properties or payload
  char* second;  // provenance
} encoded_json_t;

static void encoded_json_free(encoded_json_t* encoded) {
  pcp_allocator_free(pcp_allocator_system(), encoded->first);
  pcp_allocator_free(pcp_allocator_system(), encoded->second);
}

static pcp_status_t entity_upsert_locked(pcp_store_t* store,
                                         const pcp_store_graph_entity_t* e,
                                         const encoded_json_t* json,
                                         int64_t now_ns) {
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_ENTITY_UPSERT,
      "INSERT INTO graph_entities(" ENTITY_COLUMNS
      ")"
      " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)"
      " ON CONFLICT(entity_id) DO UPDATE SET"
      " namespace_id = excluded.namespace_id,"
      " entity_type = excluded.entity_type,"
      " display_name = excluded.display_name,"
      " visibility = excluded.visibility, properties = excluded.properties,"
      " provenance = excluded.provenance,"
      " updated_at_ns = excluded.updated_at_ns",
      &stmt));
  int brc = sqlite3_bind_text(stmt, 1, e->entity_id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 2, e->namespace_id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 3, e->entity_type, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 4,
                           e->display_name[0] ? e->display_name : e->entity_id,
                           -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 5, pcp_store_visibility_name(e->visibility),
                           -1, SQLITE_STATIC);
  brc |= sqlite3_bind_text(stmt, 6, json->first, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 7, json->second, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_int64(stmt, 8, now_ns);
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
  return pcp_store_stmt_run(store, stmt, "entity upsert");
}

static pcp_status_t relation_upsert_locked(pcp_store_t* store,
                                           const pcp_store_graph_relation_t* r,
                                           const encoded_json_t* json,
                                           int64_t now_ns) {
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_RELATION_UPSERT,
      "INSERT INTO graph_relations(" RELATION_COLUMNS
      ")"
      " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9)"
      " ON CONFLICT(relation_id) DO UPDATE SET"
      " namespace_id = excluded.namespace_id,"
      " relation_type = excluded.relation_type,"
      " from_entity_id = excluded.from_entity_id,"
      " to_entity_id = excluded.to_entity_id,"
      " visibility = excluded.visibility, properties = excluded.properties,"
      " provenance = excluded.provenance,"
      " updated_at_ns = excluded.updated_at_ns",
      &stmt));
  int brc = sqlite3_bind_text(stmt, 1, r->relation_id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 2, r->namespace_id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 3, r->relation_type, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 4, r->from_entity_id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 5, r->to_entity_id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 6, pcp_store_visibility_name(r->visibility),
                           -1, SQLITE_STATIC);
  brc |= sqlite3_bind_text(stmt, 7, json->first, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 8, json->second, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_int64(stmt, 9, now_ns);
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
  return pcp_store_stmt_run(store, stmt, "relation upsert");
}

static pcp_status_t observation_upsert_locked(
    pcp_store_t* store, const pcp_store_graph_observation_t* o,
    const encoded_json_t* json, int64_t now_ns) {
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_OBSERVATION_UPSERT,
      "INSERT OR REPLACE INTO graph_observations(" OBSERVATION_COLUMNS
      ")"
      " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
      &stmt));
  int brc = sqlite3_bind_text(stmt, 1, o->observation_id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 2, o->namespace_id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 3, o->subject_entity_id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 4, o->observation_type, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 5, pcp_store_visibility_name(o->visibility),
                           -1, SQLITE_STATIC);
  brc |= sqlite3_bind_text(stmt, 6, json->first, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 7, json->second, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_int64(stmt, 8, now_ns);
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
  return pcp_store_stmt_run(store, stmt, "observation upsert");
}

static pcp_status_t delete_by_id(pcp_store_t* store, pcp_store_stmt_id_t id,
                                 const char* sql, const char* key,
                                 int* out_changes) {
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(store, id, sql, &stmt));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(
      store, sqlite3_bind_text(stmt, 1, key, -1, SQLITE_TRANSIENT)));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_run(store, stmt, "graph delete"));
  *out_changes = sqlite3_changes(store->db);
  return pcp_ok_status();
}

static pcp_status_t entity_delete_locked(pcp_store_t* store,
                                         const char* entity_id) {
  int changes = 0;
  PCP_RETURN_IF_ERROR_BARE(delete_by_id(
      store, PCP_STORE_STMT_ENTITY_DELETE,
      "DELETE FROM graph_entities WHERE entity_id = ?1", entity_id, &changes));
  if (changes == 0) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "entity '%s'", entity_id);
  }
  PCP_RETURN_IF_ERROR_BARE(
      delete_by_id(store, PCP_STORE_STMT_ENTITY_DELETE_RELATIONS,
                   "DELETE FROM graph_relations WHERE from_entity_id = ?1"
                   " OR to_entity_id = ?1",
                   entity_id, &changes));
  return delete_by_id(
      store, PCP_STORE_STMT_ENTITY_DELETE_OBSERVATIONS,
      "DELETE FROM graph_observations WHERE subject_entity_id = ?1", entity_id,
      &changes);
}

static pcp_status_t relation_delete_locked(pcp_store_t* store,
                                           const char* relation_id) {
  int changes = 0;
  PCP_RETURN_IF_ERROR_BARE(
      delete_by_id(store, PCP_STORE_STMT_RELATION_DELETE,
                   "DELETE FROM graph_relations WHERE relation_id = ?1",
                   relation_id, &changes));
  if (changes == 0) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "relation '%s'", relation_id);
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Validation
//===----------------------------------------------------------------------===//

static pcp_status_t entity_validate(const pcp_store_graph_entity_t* e,
                                    encoded_json_t* out_json) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("entity_id", e->entity_id, true));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("namespace_id", e->namespace_id, true));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_name_validate(
      "entity_type", e->entity_type, PCP_STORE_NAME_MAX_LENGTH, false));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_name_validate(
      "display_name", e->display_name, PCP_STORE_NAME_MAX_LENGTH, true));
  PCP_RETURN_IF_ERROR_BARE(visibility_validate(e->visibility));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_json_encode(
      "entity properties", e->properties, "{}", true, &out_json->first));
  return pcp_store_json_encode("entity provenance", e->provenance, "{}", true,
                               &out_json->second);
}

static pcp_status_t relation_validate(const pcp_store_graph_relation_t* r,
                                      encoded_json_t* out_json) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("relation_id", r->relation_id, true));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("namespace_id", r->namespace_id, true));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_name_validate(
      "relation_type", r->relation_type, PCP_STORE_NAME_MAX_LENGTH, false));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("from_entity_id", r->from_entity_id, true));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("to_entity_id", r->to_entity_id, true));
  PCP_RETURN_IF_ERROR_BARE(visibility_validate(r->visibility));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_json_encode(
      "relation properties", r->properties, "{}", true, &out_json->first));
  return pcp_store_json_encode("relation provenance", r->provenance, "{}", true,
                               &out_json->second);
}

static pcp_status_t observation_validate(const pcp_store_graph_observation_t* o,
                                         encoded_json_t* out_json) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("observation_id", o->observation_id, true));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("namespace_id", o->namespace_id, true));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("subject_entity_id", o->subject_entity_id, true));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_name_validate("observation_type", o->observation_type,
                              PCP_STORE_NAME_MAX_LENGTH, false));
  PCP_RETURN_IF_ERROR_BARE(visibility_validate(o->visibility));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_json_encode(
      "observation payload", o->payload, "{}", false, &out_json->first));
  return pcp_store_json_encode("observation provenance", o->provenance, "{}",
                               true, &out_json->second);
}

//===----------------------------------------------------------------------===//
// Direct graph API
//===----------------------------------------------------------------------===//

pcp_status_t pcp_store_graph_entity_upsert(
    pcp_store_t* store, const pcp_store_graph_entity_t* entity) {
  encoded_json_t json = {0};
  pcp_status_t status = entity_validate(entity, &json);
  if (!status) {
    pcp_store_lock(store);
    status =
        entity_upsert_locked(store, entity, &json, pcp_store_now_ns(store));
    pcp_store_unlock(store);
  }
  encoded_json_free(&json);
  return status;
}

pcp_status_t pcp_store_graph_entity_get(pcp_store_t* store,
                                        const char* entity_id,
                                        pcp_store_graph_entity_t* out_entity) {
  memset(out_entity, 0, sizeof(*out_entity));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_id_validate("entity_id", entity_id, true));
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_ENTITY_GET,
      "SELECT " ENTITY_COLUMNS " FROM graph_entities WHERE entity_id = ?1",
      &stmt);
  if (!status) {
    status = pcp_store_bind_check(
        store, sqlite3_bind_text(stmt, 1, entity_id, -1, SQLITE_TRANSIENT));
  }
  if (!status) {
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      status = entity_from_row(stmt, out_entity);
    } else if (rc == SQLITE_DONE) {
      status = pcp_make_status(PCP_STATUS_NOT_FOUND, "entity '%s'", entity_id);
    } else {
      status = pcp_store_db_status(store, rc, "entity get");
    }
    sqlite3_reset(stmt);
  }
  pcp_store_unlock(store);
  return status;
}

pcp_status_t pcp_store_graph_entity_delete(pcp_store_t* store,
                                           const char* entity_id) {
  PCP_RETURN_IF_ERROR_BARE(pcp_store_id_validate("entity_id", entity_id, true));
  pcp_store_lock(store);
  pcp_status_t status = pcp_store_tx_begin(store);
  if (!status) {
    status = pcp_store_tx_finish(store, entity_delete_locked(store, entity_id));
  }
  pcp_store_unlock(store);
  return status;
}

pcp_status_t pcp_store_graph_relation_upsert(
    pcp_store_t* store, const pcp_store_graph_relation_t* relation) {
  encoded_json_t json = {0};
  pcp_status_t status = relation_validate(relation, &json);
  if (!status) {
    pcp_store_lock(store);
    status =
        relation_upsert_locked(store, relation, &json, pcp_store_now_ns(store));
    pcp_store_unlock(store);
  }
  encoded_json_free(&json);
  return status;
}

pcp_status_t pcp_store_graph_relation_delete(pcp_store_t* store,
                                             const char* relation_id) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("relation_id", relation_id, true));
  pcp_store_lock(store);
  pcp_status_t status = relation_delete_locked(store, relation_id);
  pcp_store_unlock(store);
  return status;
}

pcp_status_t pcp_store_graph_observation_append(
    pcp_store_t* store, const pcp_store_graph_observation_t* observation) {
  encoded_json_t json = {0};
  pcp_status_t status = observation_validate(observation, &json);
  if (!status) {
    pcp_store_lock(store);
    status = observation_upsert_locked(store, observation, &json,
                                       pcp_store_now_ns(store));
    pcp_store_unlock(store);
  }
  encoded_json_free(&json);
  return status;
}

//===----------------------------------------------------------------------===//
// Queries
//===----------------------------------------------------------------------===//

// Row readers for the three arrays of a result.
static pcp_status_t read_entities(pcp_store_t* store, sqlite3_stmt* stmt,
                                  pcp_store_graph_result_t* result) {
  size_t capacity = 0;
  pcp_status_t status = pcp_ok_status();
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    status = pcp_store_list_reserve(
        result->allocator, sizeof(pcp_store_graph_entity_t),
        result->entity_count, &capacity, (void**)&result->entities);
    if (!status) {
      status = entity_from_row(stmt, &result->entities[result->entity_count]);
    }
    if (status) {
      break;
    }
    ++result->entity_count;
  }
  if (!status && rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "entity query");
  }
  sqlite3_reset(stmt);
  return status;
}

static pcp_status_t read_relations(pcp_store_t* store, sqlite3_stmt* stmt,
                                   pcp_store_graph_result_t* result) {
  size_t capacity = 0;
  pcp_status_t status = pcp_ok_status();
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    status = pcp_store_list_reserve(
        result->allocator, sizeof(pcp_store_graph_relation_t),
        result->relation_count, &capacity, (void**)&result->relations);
    if (!status) {
      status =
          relation_from_row(stmt, &result->relations[result->relation_count]);
    }
    if (status) {
      break;
    }
    ++result->relation_count;
  }
  if (!status && rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "relation query");
  }
  sqlite3_reset(stmt);
  return status;
}

static pcp_status_t read_observations(pcp_store_t* store, sqlite3_stmt* stmt,
                                      pcp_store_graph_result_t* result) {
  size_t capacity = 0;
  pcp_status_t status = pcp_ok_status();
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    status = pcp_store_list_reserve(
        result->allocator, sizeof(pcp_store_graph_observation_t),
        result->observation_count, &capacity, (void**)&result->observations);
    if (!status) {
      status = observation_from_row(
          stmt, &result->observations[result->observation_count]);
    }
    if (status) {
      break;
    }
    ++result->observation_count;
  }
  if (!status && rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "observation query");
  }
  sqlite3_reset(stmt);
  return status;
}

static int bind_optional(sqlite3_stmt* stmt, int index, const char* value) {
  return value ? sqlite3_bind_text(stmt, index, value, -1, SQLITE_TRANSIENT)
               : sqlite3_bind_null(stmt, index);
}

// Binds ?1 entity_id, ?2 namespace_id, ?3 type filter, ?4 text, ?5 limit.
static pcp_status_t bind_query(pcp_store_t* store, sqlite3_stmt* stmt,
                               const pcp_store_graph_query_t* query,
                               const char* type_filter, uint32_t limit) {
  int brc = bind_optional(stmt, 1, query->entity_id);
  brc |= bind_optional(stmt, 2, query->namespace_id);
  brc |= bind_optional(stmt, 3, type_filter);
  brc |= bind_optional(stmt, 4, query->text);
  brc |= sqlite3_bind_int64(stmt, 5, limit);
  return pcp_store_bind_check(store, brc);
}

static pcp_status_t query_locked(pcp_store_t* store,
                                 const pcp_store_graph_query_t* query,
                                 uint32_t limit,
                                 pcp_store_graph_result_t* result) {
  sqlite3_stmt* stmt = NULL;
  // instr() instead of LIKE: the text is matched literally (no % or _
  // wildcards from user input) and case-sensitively, like upstream.
  if (!query->relation_type) {
    PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
        store, PCP_STORE_STMT_QUERY_ENTITIES,
        "SELECT " ENTITY_COLUMNS
        " FROM graph_entities"
        " WHERE (?1 IS NULL OR entity_id = ?1)"
        " AND (?2 IS NULL OR namespace_id = ?2)"
        " AND (?3 IS NULL OR entity_type = ?3)"
        " AND (?4 IS NULL OR instr(entity_id || ' ' || entity_type || ' ' ||"
        "   display_name || ' ' || properties || ' ' || provenance, ?4) > 0)"
        " ORDER BY updated_at_ns DESC, entity_id LIMIT ?5",
        &stmt));
    PCP_RETURN_IF_ERROR_BARE(
        bind_query(store, stmt, query, query->entity_type, limit));
    PCP_RETURN_IF_ERROR_BARE(read_entities(store, stmt, result));
  }
  if (!query->entity_type) {
    PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
        store, PCP_STORE_STMT_QUERY_RELATIONS,
        "SELECT " RELATION_COLUMNS
        " FROM graph_relations"
        " WHERE (?1 IS NULL OR from_entity_id = ?1 OR to_entity_id = ?1)"
        " AND (?2 IS NULL OR namespace_id = ?2)"
        " AND (?3 IS NULL OR relation_type = ?3)"
        " AND (?4 IS NULL OR instr(relation_id || ' ' || relation_type ||"
        "   ' ' || from_entity_id || ' ' || to_entity_id || ' ' ||"
        "   properties || ' ' || provenance, ?4) > 0)"
        " ORDER BY updated_at_ns DESC, relation_id LIMIT ?5",
        &stmt));
    PCP_RETURN_IF_ERROR_BARE(
        bind_query(store, stmt, query, query->relation_type, limit));
    PCP_RETURN_IF_ERROR_BARE(read_relations(store, stmt, result));
  }
  if (!query->entity_type && !query->relation_type) {
    PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
        store, PCP_STORE_STMT_QUERY_OBSERVATIONS,
        "SELECT " OBSERVATION_COLUMNS
        " FROM graph_observations"
        " WHERE (?1 IS NULL OR subject_entity_id = ?1)"
        " AND (?2 IS NULL OR namespace_id = ?2)"
        " AND (?3 IS NULL OR observation_type = ?3)"
        " AND (?4 IS NULL OR instr(observation_id || ' ' ||"
        "   observation_type || ' ' || subject_entity_id || ' ' || payload ||"
        "   ' ' || provenance, ?4) > 0)"
        " ORDER BY created_at_ns DESC, observation_id LIMIT ?5",
        &stmt));
    PCP_RETURN_IF_ERROR_BARE(bind_query(store, stmt, query, NULL, limit));
    PCP_RETURN_IF_ERROR_BARE(read_observations(store, stmt, result));
  }
  return pcp_ok_status();
}

pcp_status_t pcp_store_graph_neighbors_validate(
    const char* entity_id, const char* relation_type,
    pcp_store_graph_direction_t direction) {
  PCP_RETURN_IF_ERROR_BARE(pcp_store_id_validate("entity_id", entity_id, true));
  if (relation_type) {
    PCP_RETURN_IF_ERROR_BARE(pcp_store_name_validate(
        "relation_type", relation_type, PCP_STORE_NAME_MAX_LENGTH, false));
  }
  if (direction < PCP_STORE_GRAPH_DIRECTION_OUT ||
      direction > PCP_STORE_GRAPH_DIRECTION_BOTH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "graph direction %d is out of range",
                           (int)direction);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_store_graph_query_validate(
    const pcp_store_graph_query_t* query) {
  if (query->entity_id) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_store_id_validate("entity_id", query->entity_id, true));
  }
  if (query->namespace_id) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_store_id_validate("namespace_id", query->namespace_id, true));
  }
  if (query->entity_type) {
    PCP_RETURN_IF_ERROR_BARE(pcp_store_name_validate(
        "entity_type", query->entity_type, PCP_STORE_NAME_MAX_LENGTH, false));
  }
  if (query->relation_type) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_store_name_validate("relation_type", query->relation_type,
                                PCP_STORE_NAME_MAX_LENGTH, false));
  }
  if (query->text) {
    PCP_RETURN_IF_ERROR_BARE(pcp_store_name_validate(
        "query text", query->text, PCP_STORE_NAME_MAX_LENGTH, false));
  }
  return pcp_ok_status();
}

pcp_status_t pcp_store_graph_query(pcp_store_t* store,
                                   const pcp_store_graph_query_t* query,
                                   pcp_store_graph_result_t* out_result) {
  memset(out_result, 0, sizeof(*out_result));
  out_result->allocator = store->allocator;
  pcp_store_graph_query_t all = {0};
  if (!query) {
    query = &all;
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_store_graph_query_validate(query));
  uint32_t limit = pcp_store_limit_normalize(query->limit, 20);
  pcp_store_lock(store);
  // One read transaction, so the three arrays come from the same snapshot.
  pcp_status_t status = pcp_store_tx_begin_read(store);
  if (!status) {
    status = query_locked(store, query, limit, out_result);
    status = pcp_store_tx_finish(store, status);
  }
  pcp_store_unlock(store);
  if (status) {
    pcp_store_graph_result_deinitialize(out_result);
  }
  return status;
}

static bool entity_listed(const pcp_store_graph_result_t* result,
                          const char* entity_id) {
  for (size_t i = 0; i < result->entity_count; ++i) {
    if (strcmp(result->entities[i].entity_id, entity_id) == 0) {
      return true;
    }
  }
  return false;
}

static pcp_status_t neighbors_locked(pcp_store_t* store, const char* entity_id,
                                     const char* relation_type,
                                     pcp_store_graph_direction_t direction,
                                     uint32_t limit,
                                     pcp_store_graph_result_t* result) {
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_NEIGHBOR_RELATIONS,
      "SELECT " RELATION_COLUMNS
      " FROM graph_relations"
      " WHERE ((?2 & 1 AND from_entity_id = ?1)"
      "   OR (?2 & 2 AND to_entity_id = ?1))"
      " AND (?3 IS NULL OR relation_type = ?3)"
      " ORDER BY updated_at_ns DESC, relation_id LIMIT ?4",
      &stmt));
  int brc = sqlite3_bind_text(stmt, 1, entity_id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_int64(stmt, 2, (int64_t)direction);
  brc |= bind_optional(stmt, 3, relation_type);
  brc |= sqlite3_bind_int64(stmt, 4, limit);
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
  PCP_RETURN_IF_ERROR_BARE(read_relations(store, stmt, result));
  size_t capacity = 0;
  for (size_t i = 0; i < result->relation_count; ++i) {
    const pcp_store_graph_relation_t* r = &result->relations[i];
    // A self-loop's neighbour is the entity itself.
    const char* other = strcmp(r->from_entity_id, entity_id) == 0
                            ? r->to_entity_id
                            : r->from_entity_id;
    if (entity_listed(result, other)) {
      continue;
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
        store, PCP_STORE_STMT_ENTITY_GET,
        "SELECT " ENTITY_COLUMNS " FROM graph_entities WHERE entity_id = ?1",
        &stmt));
    PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(
        store, sqlite3_bind_text(stmt, 1, other, -1, SQLITE_TRANSIENT)));
    int rc = sqlite3_step(stmt);
    pcp_status_t status = pcp_ok_status();
    if (rc == SQLITE_ROW) {
      status = pcp_store_list_reserve(
          result->allocator, sizeof(pcp_store_graph_entity_t),
          result->entity_count, &capacity, (void**)&result->entities);
      if (!status) {
        status = entity_from_row(stmt, &result->entities[result->entity_count]);
      }
      if (!status) {
        ++result->entity_count;
      }
    } else if (rc != SQLITE_DONE) {
      status = pcp_store_db_status(store, rc, "neighbour");
    }
    sqlite3_reset(stmt);
    PCP_RETURN_IF_ERROR_BARE(status);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_store_graph_neighbors_list(
    pcp_store_t* store, const char* entity_id, const char* relation_type,
    pcp_store_graph_direction_t direction, uint32_t limit,
    pcp_store_graph_result_t* out_result) {
  memset(out_result, 0, sizeof(*out_result));
  out_result->allocator = store->allocator;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_graph_neighbors_validate(entity_id, relation_type, direction));
  limit = pcp_store_limit_normalize(limit, 20);
  pcp_store_lock(store);
  pcp_status_t status = pcp_store_tx_begin_read(store);
  if (!status) {
    status = neighbors_locked(store, entity_id, relation_type, direction, limit,
                              out_result);
    status = pcp_store_tx_finish(store, status);
  }
  pcp_store_unlock(store);
  if (status) {
    pcp_store_graph_result_deinitialize(out_result);
  }
  return status;
}

//===----------------------------------------------------------------------===//
// Mutation log
//===----------------------------------------------------------------------===//

typedef struct encoded_mutation_t {
  char* payload;
  char* provenance;
  int64_t timestamp_ns;
} encoded_mutation_t;

static pcp_status_t mutation_validate(pcp_store_t* store,
                                      const pcp_store_mutation_t* m,
                                      encoded_mutation_t* out) {
  if (m->mutation_id[0]) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_store_id_validate("mutation_id", m->mutation_id, true));
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("namespace_id", m->namespace_id, true));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("target_id", m->target_id, true));
  if ((unsigned)m->mutation_type >= PCP_STORE_MUTATION_TYPE_COUNT_) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "mutation type %d is out of range",
                           (int)m->mutation_type);
  }
  PCP_RETURN_IF_ERROR_BARE(visibility_validate(m->visibility));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_json_encode("mutation payload", m->payload,
                                                 "{}", true, &out->payload));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_json_encode(
      "mutation provenance", m->provenance, "{}", true, &out->provenance));
  out->timestamp_ns =
      m->timestamp_ns ? m->timestamp_ns : pcp_store_now_ns(store);
  return pcp_ok_status();
}

static void encoded_mutation_free(encoded_mutation_t* encoded) {
  pcp_allocator_free(pcp_allocator_system(), encoded->payload);
  pcp_allocator_free(pcp_allocator_system(), encoded->provenance);
}

// Finds a record by mutation_id: *out_sequence_no 0 when absent.
static pcp_status_t mutation_find_locked(pcp_store_t* store,
                                         const char* mutation_id,
                                         int64_t* out_sequence_no) {
  *out_sequence_no = 0;
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_MUTATION_FIND,
      "SELECT sequence_no FROM mutation_log WHERE mutation_id = ?1", &stmt));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(
      store, sqlite3_bind_text(stmt, 1, mutation_id, -1, SQLITE_TRANSIENT)));
  int rc = sqlite3_step(stmt);
  pcp_status_t status = pcp_ok_status();
  if (rc == SQLITE_ROW) {
    *out_sequence_no = sqlite3_column_int64(stmt, 0);
  } else if (rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "mutation find");
  }
  sqlite3_reset(stmt);
  return status;
}

static pcp_status_t mutation_insert_locked(pcp_store_t* store,
                                           const pcp_store_mutation_t* m,
                                           const encoded_mutation_t* encoded,
                                           int64_t* out_sequence_no) {
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_MUTATION_INSERT,
      "INSERT INTO mutation_log(mutation_id, namespace_id, mutation_type,"
      " target_id, payload, visibility, provenance, timestamp_ns)"
      " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
      &stmt));
  int brc = m->mutation_id[0] ? sqlite3_bind_text(stmt, 1, m->mutation_id, -1,
                                                  SQLITE_TRANSIENT)
                              : sqlite3_bind_null(stmt, 1);
  brc |= sqlite3_bind_text(stmt, 2, m->namespace_id, -1, SQLITE_TRANSIENT);
  brc |=
      sqlite3_bind_text(stmt, 3, pcp_store_mutation_type_name(m->mutation_type),
                        -1, SQLITE_STATIC);
  brc |= sqlite3_bind_text(stmt, 4, m->target_id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 5, encoded->payload, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 6, pcp_store_visibility_name(m->visibility),
                           -1, SQLITE_STATIC);
  brc |= sqlite3_bind_text(stmt, 7, encoded->provenance, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_int64(stmt, 8, encoded->timestamp_ns);
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_run(store, stmt, "mutation insert"));
  int64_t sequence_no = sqlite3_last_insert_rowid(store->db);
  if (!m->mutation_id[0]) {
    // Upstream names unnamed records mut_{seq}; the number is known only
    // after the insert, so the name is set in the same transaction.
    char name[32];
    snprintf(name, sizeof(name), "mut_%lld", (long long)sequence_no);
    PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
        store, PCP_STORE_STMT_MUTATION_NAME,
        "UPDATE mutation_log SET mutation_id = ?2 WHERE sequence_no = ?1",
        &stmt));
    brc = sqlite3_bind_int64(stmt, 1, sequence_no);
    brc |= sqlite3_bind_text(stmt, 2, name, -1, SQLITE_TRANSIENT);
    PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
    PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_run(store, stmt, "mutation name"));
  }
  *out_sequence_no = sequence_no;
  return pcp_ok_status();
}

// A required string key of a mutation payload (upstream InvalidPayload).
static pcp_status_t payload_string(const json_t* payload, const char* key,
                                   const char* fallback, const char** out) {
  const json_t* value = json_object_get(payload, key);
  if (!value && fallback) {
    *out = fallback;
    return pcp_ok_status();
  }
  if (!json_is_string(value)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "mutation payload needs a string '%s'", key);
  }
  *out = json_string_value(value);
  return pcp_ok_status();
}

static pcp_status_t copy_field(const char* field, const char* value,
                               char* buffer, size_t capacity) {
  if (!value || strlen(value) >= capacity) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "mutation %s is longer than %zu bytes", field,
                           capacity - 1);
  }
  snprintf(buffer, capacity, "%s", value);
  return pcp_ok_status();
}

// Reads string |key| of a mutation payload (or |fallback| when absent) into
// a fixed-size field; both checks of payload_string and copy_field apply.
static pcp_status_t payload_field(const json_t* payload, const char* key,
                                  const char* fallback, char* buffer,
                                  size_t capacity) {
  const char* value = NULL;
  PCP_RETURN_IF_ERROR_BARE(payload_string(payload, key, fallback, &value));
  return copy_field(key, value, buffer, capacity);
}

static pcp_status_t mutation_apply_locked(pcp_store_t* store,
                                          const pcp_store_mutation_t* m,
                                          int64_t timestamp_ns) {
  const json_t* payload = m->payload;
  json_t* empty = NULL;
  if (!payload) {
    payload = empty = json_object();
  }
  const json_t* properties = json_object_get(payload, "properties");
  pcp_status_t status = pcp_ok_status();
  encoded_json_t json = {0};
  switch (m->mutation_type) {
    case PCP_STORE_MUTATION_UPSERT_ENTITY: {
      pcp_store_graph_entity_t e = {.visibility = m->visibility,
                                    .properties = (json_t*)properties,
                                    .provenance = m->provenance};
      status = payload_field(payload, "entity_type", NULL, e.entity_type,
                             sizeof(e.entity_type));
      if (!status) {
        status = payload_field(payload, "display_name", m->target_id,
                               e.display_name, sizeof(e.display_name));
      }
      snprintf(e.entity_id, sizeof(e.entity_id), "%s", m->target_id);
      snprintf(e.namespace_id, sizeof(e.namespace_id), "%s", m->namespace_id);
      if (!status) {
        status = entity_validate(&e, &json);
      }
      if (!status) {
        status = entity_upsert_locked(store, &e, &json, timestamp_ns);
      }
      break;
    }
    case PCP_STORE_MUTATION_UPSERT_RELATION: {
      pcp_store_graph_relation_t r = {.visibility = m->visibility,
                                      .properties = (json_t*)properties,
                                      .provenance = m->provenance};
      status = payload_field(payload, "relation_type", NULL, r.relation_type,
                             sizeof(r.relation_type));
      if (!status) {
        status = payload_field(payload, "from_entity_id", NULL,
                               r.from_entity_id, sizeof(r.from_entity_id));
      }
      if (!status) {
        status = payload_field(payload, "to_entity_id", NULL, r.to_entity_id,
                               sizeof(r.to_entity_id));
      }
      snprintf(r.relation_id, sizeof(r.relation_id), "%s", m->target_id);
      snprintf(r.namespace_id, sizeof(r.namespace_id), "%s", m->namespace_id);
      if (!status) {
        status = relation_validate(&r, &json);
      }
      if (!status) {
        status = relation_upsert_locked(store, &r, &json, timestamp_ns);
      }
      break;
    }
    case PCP_STORE_MUTATION_APPEND_OBSERVATION: {
      const json_t* inner = json_object_get(payload, "payload");
      pcp_store_graph_observation_t o = {
          .visibility = m->visibility,
          .payload = (json_t*)(inner ? inner : payload),
          .provenance = m->provenance};
      status = payload_field(payload, "observation_type", NULL,
                             o.observation_type, sizeof(o.observation_type));
      if (!status) {
        status =
            payload_field(payload, "subject_entity_id", NULL,
                          o.subject_entity_id, sizeof(o.subject_entity_id));
      }
      snprintf(o.observation_id, sizeof(o.observation_id), "%s", m->target_id);
      snprintf(o.namespace_id, sizeof(o.namespace_id), "%s", m->namespace_id);
      if (!status) {
        status = observation_validate(&o, &json);
      }
      if (!status) {
        status = observation_upsert_locked(store, &o, &json, timestamp_ns);
      }
      break;
    }
    case PCP_STORE_MUTATION_DELETE_ENTITY:
      status = entity_delete_locked(store, m->target_id);
      break;
    case PCP_STORE_MUTATION_DELETE_RELATION:
      status = relation_delete_locked(store, m->target_id);
      break;
    case PCP_STORE_MUTATION_POLICY_UPDATE:
    default:
      // Policies live with the federation code; the log records the change.
      break;
  }
  encoded_json_free(&json);
  json_decref(empty);
  return status;
}

static pcp_status_t mutation_write(pcp_store_t* store,
                                   const pcp_store_mutation_t* mutation,
                                   bool apply, int64_t* out_sequence_no,
                                   bool* out_duplicate) {
  if (out_sequence_no) {
    *out_sequence_no = 0;
  }
  if (out_duplicate) {
    *out_duplicate = false;
  }
  encoded_mutation_t encoded = {0};
  pcp_status_t status = mutation_validate(store, mutation, &encoded);
  if (status) {
    encoded_mutation_free(&encoded);
    return status;
  }
  pcp_store_lock(store);
  status = pcp_store_tx_begin(store);
  if (!status) {
    int64_t sequence_no = 0;
    if (mutation->mutation_id[0]) {
      status = mutation_find_locked(store, mutation->mutation_id, &sequence_no);
    }
    bool duplicate = sequence_no != 0;
    if (!status && !duplicate && apply) {
      status = mutation_apply_locked(store, mutation, encoded.timestamp_ns);
    }
    if (!status && !duplicate) {
      status = mutation_insert_locked(store, mutation, &encoded, &sequence_no);
    }
    status = pcp_store_tx_finish(store, status);
    if (!status) {
      if (out_sequence_no) {
        *out_sequence_no = sequence_no;
      }
      if (out_duplicate) {
        *out_duplicate = duplicate;
      }
    }
  }
  pcp_store_unlock(store);
  encoded_mutation_free(&encoded);
  return status;
}

pcp_status_t pcp_store_mutation_append(pcp_store_t* store,
                                       const pcp_store_mutation_t* mutation,
                                       int64_t* out_sequence_no,
                                       bool* out_duplicate) {
  return mutation_write(store, mutation, false, out_sequence_no, out_duplicate);
}

pcp_status_t pcp_store_graph_mutation_apply(
    pcp_store_t* store, const pcp_store_mutation_t* mutation,
    int64_t* out_sequence_no, bool* out_duplicate) {
  return mutation_write(store, mutation, true, out_sequence_no, out_duplicate);
}

pcp_status_t pcp_store_mutation_list(pcp_store_t* store,
                                     int64_t after_sequence_no, uint32_t limit,
                                     pcp_store_mutation_list_t* out_list) {
  memset(out_list, 0, sizeof(*out_list));
  out_list->allocator = store->allocator;
  limit = pcp_store_limit_normalize(limit, PCP_STORE_LIST_LIMIT_DEFAULT);
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_MUTATION_LIST,
      "SELECT sequence_no, mutation_id, namespace_id, mutation_type,"
      " target_id, payload, visibility, provenance, timestamp_ns"
      " FROM mutation_log WHERE sequence_no > ?1 ORDER BY sequence_no"
      " LIMIT ?2",
      &stmt);
  if (!status) {
    int brc = sqlite3_bind_int64(stmt, 1, after_sequence_no);
    brc |= sqlite3_bind_int64(stmt, 2, limit);
    status = pcp_store_bind_check(store, brc);
  }
  size_t capacity = 0;
  int rc = SQLITE_DONE;
  while (!status && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    status = pcp_store_list_reserve(
        out_list->allocator, sizeof(pcp_store_mutation_t), out_list->count,
        &capacity, (void**)&out_list->items);
    if (status) {
      break;
    }
    pcp_store_mutation_t* m = &out_list->items[out_list->count];
    m->sequence_no = sqlite3_column_int64(stmt, 0);
    pcp_store_text_column(stmt, 1, m->mutation_id, sizeof(m->mutation_id));
    pcp_store_text_column(stmt, 2, m->namespace_id, sizeof(m->namespace_id));
    const char* type = (const char*)sqlite3_column_text(stmt, 3);
    if (!type || !pcp_store_mutation_type_parse(pcp_make_cstring_view(type),
                                                &m->mutation_type)) {
      status =
          pcp_make_status(PCP_STATUS_DATA_LOSS, "stored mutation type '%s'",
                          type ? type : "(null)");
      break;
    }
    pcp_store_text_column(stmt, 4, m->target_id, sizeof(m->target_id));
    m->timestamp_ns = sqlite3_column_int64(stmt, 8);
    // Counted before the JSON reads so a failure below frees what was read.
    ++out_list->count;
    status = pcp_store_json_column(stmt, 5, &m->payload);
    if (!status) {
      status = visibility_column(stmt, 6, &m->visibility);
    }
    if (!status) {
      status = pcp_store_json_column(stmt, 7, &m->provenance);
    }
  }
  if (!status && rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "mutation list");
  }
  if (stmt) {
    sqlite3_reset(stmt);
  }
  pcp_store_unlock(store);
  if (status) {
    pcp_store_mutation_list_deinitialize(out_list);
  }
  return status;
}

static pcp_status_t last_sequence_locked(pcp_store_t* store,
                                         int64_t* out_sequence_no) {
  *out_sequence_no = 0;
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_MUTATION_LAST,
      "SELECT coalesce(max(sequence_no), 0) FROM mutation_log", &stmt));
  int rc = sqlite3_step(stmt);
  pcp_status_t status = pcp_ok_status();
  if (rc == SQLITE_ROW) {
    *out_sequence_no = sqlite3_column_int64(stmt, 0);
  } else {
    status = pcp_store_db_status(store, rc, "last sequence");
  }
  sqlite3_reset(stmt);
  return status;
}

pcp_status_t pcp_store_mutation_log_stats_query(
    pcp_store_t* store, pcp_store_mutation_log_stats_t* out_stats) {
  memset(out_stats, 0, sizeof(*out_stats));
  pcp_store_lock(store);
  pcp_status_t status =
      last_sequence_locked(store, &out_stats->last_sequence_no);
  if (!status) {
    status = pcp_store_meta_get_locked(store, "last_replicated_sequence",
                                       &out_stats->last_replicated_sequence);
  }
  if (!status) {
    sqlite3_stmt* stmt = NULL;
    status = pcp_store_stmt_acquire(
        store, PCP_STORE_STMT_MUTATION_PENDING,
        "SELECT count(*) FROM mutation_log WHERE sequence_no > ?1", &stmt);
    if (!status) {
      status = pcp_store_bind_check(
          store,
          sqlite3_bind_int64(stmt, 1, out_stats->last_replicated_sequence));
    }
    if (!status) {
      int rc = sqlite3_step(stmt);
      if (rc == SQLITE_ROW) {
        out_stats->pending_count = sqlite3_column_int64(stmt, 0);
      } else {
        status = pcp_store_db_status(store, rc, "pending mutations");
      }
      sqlite3_reset(stmt);
    }
  }
  pcp_store_unlock(store);
  return status;
}

pcp_status_t pcp_store_mutation_replicated_mark(pcp_store_t* store,
                                                int64_t sequence_no) {
  if (sequence_no < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "sequence number %lld is negative",
                           (long long)sequence_no);
  }
  pcp_store_lock(store);
  int64_t last = 0;
  pcp_status_t status = last_sequence_locked(store, &last);
  if (!status && sequence_no > last) {
    status = pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                             "sequence %lld is past the last record %lld",
                             (long long)sequence_no, (long long)last);
  }
  if (!status) {
    status = pcp_store_meta_raise_locked(store, "last_replicated_sequence",
                                         sequence_no);
  }
  pcp_store_unlock(store);
  return status;
}

pcp_status_t pcp_store_mutation_find(pcp_store_t* store,
                                     const char* mutation_id,
                                     int64_t* out_sequence_no) {
  *out_sequence_no = 0;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("mutation_id", mutation_id, true));
  pcp_store_lock(store);
  pcp_status_t status =
      mutation_find_locked(store, mutation_id, out_sequence_no);
  pcp_store_unlock(store);
  return status;
}

//===----------------------------------------------------------------------===//
// Graph replication: policies, per-namespace counters, peer acks
//===----------------------------------------------------------------------===//

// These run on status routes and at startup, not per request on a hot
// path, so they prepare their statement each time instead of taking a slot
// in the statement cache.
static pcp_status_t prepare_once(pcp_store_t* store, const char* sql,
                                 sqlite3_stmt** out_stmt) {
  *out_stmt = NULL;
  int rc = sqlite3_prepare_v2(store->db, sql, -1, out_stmt, NULL);
  if (rc != SQLITE_OK) {
    return pcp_store_db_status(store, rc, "prepare");
  }
  return pcp_ok_status();
}

void pcp_store_graph_policy_list_deinitialize(
    pcp_store_graph_policy_list_t* list) {
  if (list->items) {
    pcp_allocator_free(list->allocator, list->items);
  }
  memset(list, 0, sizeof(*list));
}

void pcp_store_namespace_stats_list_deinitialize(
    pcp_store_namespace_stats_list_t* list) {
  if (list->items) {
    pcp_allocator_free(list->allocator, list->items);
  }
  memset(list, 0, sizeof(*list));
}

void pcp_store_replication_peer_list_deinitialize(
    pcp_store_replication_peer_list_t* list) {
  if (list->items) {
    pcp_allocator_free(list->allocator, list->items);
  }
  memset(list, 0, sizeof(*list));
}

static void policy_from_payload(const json_t* payload,
                                pcp_store_graph_policy_t* policy) {
  const json_t* v = json_object_get(payload, "default_visibility");
  pcp_store_visibility_t visibility = PCP_STORE_VISIBILITY_LOCAL;
  if (json_is_string(v) &&
      pcp_store_visibility_parse(pcp_make_cstring_view(json_string_value(v)),
                                 &visibility)) {
    policy->default_visibility = visibility;
  }
  policy->allow_global_replication =
      json_is_true(json_object_get(payload, "allow_global_replication"));
  policy->allow_raw_payload_export =
      json_is_true(json_object_get(payload, "allow_raw_payload_export"));
}

pcp_status_t pcp_store_graph_policy_list(
    pcp_store_t* store, pcp_store_graph_policy_list_t* out_list) {
  memset(out_list, 0, sizeof(*out_list));
  out_list->allocator = store->allocator;
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  // Ordered so the last row of each namespace is the policy in force.
  pcp_status_t status = prepare_once(
      store,
      "SELECT namespace_id, payload, timestamp_ns FROM mutation_log"
      " WHERE mutation_type = 'policy_update'"
      " ORDER BY namespace_id, timestamp_ns, sequence_no",
      &stmt);
  size_t capacity = 0;
  int rc = SQLITE_DONE;
  while (!status && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    char namespace_id[PCP_STORE_ID_MAX_LENGTH + 1];
    pcp_store_text_column(stmt, 0, namespace_id, sizeof(namespace_id));
    pcp_store_graph_policy_t* policy = NULL;
    if (out_list->count > 0 &&
        strcmp(out_list->items[out_list->count - 1].namespace_id,
               namespace_id) == 0) {
      policy = &out_list->items[out_list->count - 1];
    } else {
      if (out_list->count >= PCP_STORE_LIST_LIMIT_MAX) {
        break;
      }
      status = pcp_store_list_reserve(
          out_list->allocator, sizeof(pcp_store_graph_policy_t),
          out_list->count, &capacity, (void**)&out_list->items);
      if (status) {
        break;
      }
      policy = &out_list->items[out_list->count++];
      memcpy(policy->namespace_id, namespace_id, sizeof(namespace_id));
    }
    json_t* payload = NULL;
    status = pcp_store_json_column(stmt, 1, &payload);
    if (status) {
      break;
    }
    policy->default_visibility = PCP_STORE_VISIBILITY_LOCAL;
    policy_from_payload(payload, policy);
    policy->updated_at_ns = sqlite3_column_int64(stmt, 2);
    json_decref(payload);
  }
  if (!status && rc != SQLITE_DONE && rc != SQLITE_ROW) {
    status = pcp_store_db_status(store, rc, "policy list");
  }
  sqlite3_finalize(stmt);
  pcp_store_unlock(store);
  if (status) {
    pcp_store_graph_policy_list_deinitialize(out_list);
  }
  return status;
}

pcp_status_t pcp_store_namespace_stats_list(
    pcp_store_t* store, pcp_store_namespace_stats_list_t* out_list) {
  memset(out_list, 0, sizeof(*out_list));
  out_list->allocator = store->allocator;
  pcp_store_lock(store);
  int64_t replicated = 0;
  pcp_status_t status =
      pcp_store_meta_get_locked(store, "last_replicated_sequence", &replicated);
  sqlite3_stmt* stmt = NULL;
  if (!status) {
    status = prepare_once(
        store,
        "SELECT namespace_id, count(*), sum(sequence_no > ?1),"
        " sum(visibility = 'local'), sum(visibility = 'shared'),"
        " sum(visibility = 'global'),"
        " sum(mutation_type IN ('upsert_entity', 'delete_entity')),"
        " sum(mutation_type IN ('upsert_relation', 'delete_relation')),"
        " sum(mutation_type = 'append_observation'),"
        " sum(mutation_type = 'policy_update'), max(sequence_no)"
        " FROM mutation_log GROUP BY namespace_id ORDER BY namespace_id"
        " LIMIT ?2",
        &stmt);
  }
  if (!status) {
    int brc = sqlite3_bind_int64(stmt, 1, replicated);
    brc |= sqlite3_bind_int64(stmt, 2, PCP_STORE_LIST_LIMIT_MAX);
    status = pcp_store_bind_check(store, brc);
  }
  size_t capacity = 0;
  int rc = SQLITE_DONE;
  while (!status && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    status = pcp_store_list_reserve(
        out_list->allocator, sizeof(pcp_store_namespace_stats_t),
        out_list->count, &capacity, (void**)&out_list->items);
    if (status) {
      break;
    }
    pcp_store_namespace_stats_t* s = &out_list->items[out_list->count++];
    pcp_store_text_column(stmt, 0, s->namespace_id, sizeof(s->namespace_id));
    s->total_count = sqlite3_column_int64(stmt, 1);
    s->pending_count = sqlite3_column_int64(stmt, 2);
    for (int v = 0; v < PCP_STORE_VISIBILITY_COUNT_; ++v) {
      s->visibility_counts[v] = sqlite3_column_int64(stmt, 3 + v);
    }
    s->entity_count = sqlite3_column_int64(stmt, 6);
    s->relation_count = sqlite3_column_int64(stmt, 7);
    s->observation_count = sqlite3_column_int64(stmt, 8);
    s->policy_count = sqlite3_column_int64(stmt, 9);
    s->last_sequence_no = sqlite3_column_int64(stmt, 10);
  }
  if (!status && rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "namespace stats");
  }
  sqlite3_finalize(stmt);
  pcp_store_unlock(store);
  if (status) {
    pcp_store_namespace_stats_list_deinitialize(out_list);
  }
  return status;
}

pcp_status_t pcp_store_graph_log_counts_query(
    pcp_store_t* store, pcp_store_graph_log_counts_t* out_counts) {
  memset(out_counts, 0, sizeof(*out_counts));
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = prepare_once(
      store,
      "SELECT (SELECT count(DISTINCT namespace_id) FROM mutation_log),"
      " (SELECT count(*) FROM graph_entities),"
      " (SELECT count(*) FROM graph_relations),"
      " (SELECT count(*) FROM graph_observations),"
      " (SELECT count(*) FROM mutation_log)",
      &stmt);
  if (!status) {
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      out_counts->namespace_count = sqlite3_column_int64(stmt, 0);
      out_counts->entity_count = sqlite3_column_int64(stmt, 1);
      out_counts->relation_count = sqlite3_column_int64(stmt, 2);
      out_counts->observation_count = sqlite3_column_int64(stmt, 3);
      out_counts->mutation_count = sqlite3_column_int64(stmt, 4);
    } else {
      status = pcp_store_db_status(store, rc, "graph counts");
    }
  }
  sqlite3_finalize(stmt);
  pcp_store_unlock(store);
  return status;
}

// The acknowledged sequence lives in the hub's federation_acks table; the
// peer's reported last sequence (for the lag) in meta under this prefix.
#define REPLICATION_LAST_PREFIX "replication_last:"

pcp_status_t pcp_store_graph_mutation_batch_apply(
    pcp_store_t* store, const char* peer_id, const pcp_store_mutation_t* items,
    size_t count, int64_t acked_sequence_no, int64_t peer_last_sequence_no,
    size_t* out_applied_count, size_t* out_duplicate_count) {
  *out_applied_count = 0;
  *out_duplicate_count = 0;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_id_validate("peer_id", peer_id, false));
  if (acked_sequence_no < 0 || peer_last_sequence_no < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "sequence numbers must not be negative");
  }
  if (count > PCP_STORE_LIST_LIMIT_MAX) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "a batch holds at most %u mutations",
                           PCP_STORE_LIST_LIMIT_MAX);
  }
  encoded_mutation_t* encoded = NULL;
  if (count > 0) {
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
        store->allocator, count * sizeof(*encoded), (void**)&encoded));
    memset(encoded, 0, count * sizeof(*encoded));
  }
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; !status && i < count; ++i) {
    if (!items[i].mutation_id[0]) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "mutations[%zu]: mutation_id is required", i);
    } else {
      status = mutation_validate(store, &items[i], &encoded[i]);
      if (status) {
        pcp_status_t wrapped =
            pcp_make_status(pcp_status_code(status), "mutations[%zu]: %s", i,
                            pcp_status_message(status));
        pcp_status_ignore(status);
        status = wrapped;
      }
    }
  }
  char last_key[sizeof(REPLICATION_LAST_PREFIX) + PCP_STORE_ID_MAX_LENGTH];
  snprintf(last_key, sizeof(last_key), REPLICATION_LAST_PREFIX "%s", peer_id);
  size_t applied = 0, duplicates = 0;
  if (!status) {
    pcp_store_lock(store);
    status = pcp_store_tx_begin(store);
    if (!status) {
      for (size_t i = 0; !status && i < count; ++i) {
        int64_t sequence_no = 0;
        status =
            mutation_find_locked(store, items[i].mutation_id, &sequence_no);
        if (!status && sequence_no != 0) {
          ++duplicates;
          continue;
        }
        if (!status) {
          status =
              mutation_apply_locked(store, &items[i], encoded[i].timestamp_ns);
          // A replicated delete of what this store never held (its upsert
          // was not eligible, or came from elsewhere) has nothing to do; a
          // refusal would stop the sender's replication for good.
          if (pcp_status_code(status) == PCP_STATUS_NOT_FOUND &&
              (items[i].mutation_type == PCP_STORE_MUTATION_DELETE_ENTITY ||
               items[i].mutation_type == PCP_STORE_MUTATION_DELETE_RELATION)) {
            pcp_status_ignore(status);
            status = pcp_ok_status();
          }
        }
        if (!status) {
          status = mutation_insert_locked(store, &items[i], &encoded[i],
                                          &sequence_no);
        }
        if (!status) {
          ++applied;
        } else {
          pcp_status_t wrapped = pcp_make_status(
              pcp_status_code(status), "mutations[%zu] (%s): %s", i,
              items[i].mutation_id, pcp_status_message(status));
          pcp_status_ignore(status);
          status = wrapped;
        }
      }
      if (!status) {
        // The hub's ack table (store/federation.c), in this transaction.
        status = pcp_store_federation_ack_raise_locked(store, peer_id,
                                                       acked_sequence_no);
      }
      if (!status) {
        status =
            pcp_store_meta_raise_locked(store, last_key, peer_last_sequence_no);
      }
      status = pcp_store_tx_finish(store, status);
    }
    pcp_store_unlock(store);
  }
  for (size_t i = 0; i < count; ++i) {
    encoded_mutation_free(&encoded[i]);
  }
  if (encoded) {
    pcp_allocator_free(store->allocator, encoded);
  }
  if (!status) {
    *out_applied_count = applied;
    *out_duplicate_count = duplicates;
  }
  return status;
}

pcp_status_t pcp_store_replication_peer_get(
    pcp_store_t* store, const char* peer_id,
    pcp_store_replication_peer_t* out_peer) {
  memset(out_peer, 0, sizeof(*out_peer));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_federation_ack_get(
      store, peer_id, &out_peer->acked_sequence_no));
  snprintf(out_peer->peer_id, sizeof(out_peer->peer_id), "%s", peer_id);
  char key[sizeof(REPLICATION_LAST_PREFIX) + PCP_STORE_ID_MAX_LENGTH];
  snprintf(key, sizeof(key), REPLICATION_LAST_PREFIX "%s", peer_id);
  pcp_store_lock(store);
  pcp_status_t status =
      pcp_store_meta_get_locked(store, key, &out_peer->last_sequence_no);
  pcp_store_unlock(store);
  return status;
}

pcp_status_t pcp_store_replication_peer_list(
    pcp_store_t* store, pcp_store_replication_peer_list_t* out_list) {
  memset(out_list, 0, sizeof(*out_list));
  out_list->allocator = store->allocator;
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status =
      prepare_once(store,
                   "SELECT a.gateway_id, a.acked_sequence, coalesce(l.value, 0)"
                   " FROM federation_acks a LEFT JOIN meta l"
                   " ON l.key = '" REPLICATION_LAST_PREFIX
                   "' || a.gateway_id"
                   " ORDER BY a.gateway_id LIMIT ?1",
                   &stmt);
  if (!status) {
    status = pcp_store_bind_check(
        store, sqlite3_bind_int64(stmt, 1, PCP_STORE_LIST_LIMIT_MAX));
  }
  size_t capacity = 0;
  int rc = SQLITE_DONE;
  while (!status && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    status = pcp_store_list_reserve(
        out_list->allocator, sizeof(pcp_store_replication_peer_t),
        out_list->count, &capacity, (void**)&out_list->items);
    if (status) {
      break;
    }
    pcp_store_replication_peer_t* p = &out_list->items[out_list->count++];
    pcp_store_text_column(stmt, 0, p->peer_id, sizeof(p->peer_id));
    p->acked_sequence_no = sqlite3_column_int64(stmt, 1);
    p->last_sequence_no = sqlite3_column_int64(stmt, 2);
  }
  if (!status && rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "replication peers");
  }
  sqlite3_finalize(stmt);
  pcp_store_unlock(store);
  if (status) {
    pcp_store_replication_peer_list_deinitialize(out_list);
  }
  return status;
}
