// SPDX-License-Identifier: Apache-2.0
// The FalkorDB graph backend: Cypher over the Redis protocol through
// hiredis, opened with dlopen at first use so `pcp` maps libhiredis only
// when a gateway is configured with graph_backend "falkordb".
//
// Layout (the upstream Neo4j one, reference s.6.7):
//   (:KGEntity {entity_id, namespace_id, entity_type, display_name, stub,
//               visibility, properties_json, provenance_json, created_at,
//               updated_at})
//   (:KGEntity)-[:KG_RELATION {relation_id, namespace_id, relation_type,
//               from_entity_id, to_entity_id, visibility, properties_json,
//               provenance_json, created_at, updated_at}]->(:KGEntity)
//   (:KGObservation {observation_id, namespace_id, subject_entity_id,
//               observation_type, visibility, payload_json, provenance_json,
//               created_at})-[:OBSERVED_ON]->(:KGEntity)
//   (:PCPMeta {key: "meta", applied_sequence})
// Relation and observation endpoints that were never upserted are MERGEd as
// stubs (stub = true) and never returned, so queries answer exactly what the
// SQLite backend answers. Timestamps are the store's nanoseconds.
//
// Every value reaches the server as a Cypher parameter (the "CYPHER k=v"
// prefix FalkorDB parses apart from the statement): strings are written as
// double-quoted literals with '\' and '"' escaped, which the contract test
// round-trips with hostile text. Statement text is only ever built from the
// constant fragments below.

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/graph_backend_impl.h"

#if defined(PCP_STORE_HAVE_HIREDIS)
#include <hiredis/hiredis.h>

// Every hiredis function called. The table stores `__typeof__(fn)*`, so a
// signature that differs from hiredis.h is a compile error here.
#define HIREDIS_API_SYMBOLS(X) \
  X(redisConnectWithTimeout)   \
  X(redisSetTimeout)           \
  X(redisCommandArgv)          \
  X(freeReplyObject)           \
  X(redisFree)

typedef struct hiredis_api_t {
#define HIREDIS_API_FIELD(name) __typeof__(name)* name;
  HIREDIS_API_SYMBOLS(HIREDIS_API_FIELD)
#undef HIREDIS_API_FIELD
} hiredis_api_t;

static const pcp_dynlib_symbol_t kHiredisSymbols[] = {
#define HIREDIS_API_ENTRY(name) {#name, offsetof(hiredis_api_t, name)},
    HIREDIS_API_SYMBOLS(HIREDIS_API_ENTRY)
#undef HIREDIS_API_ENTRY
};

static hiredis_api_t g_hiredis;
static pcp_status_t g_hiredis_status;
static pthread_once_t g_hiredis_once = PTHREAD_ONCE_INIT;

static void hiredis_load_once(void) {
  static const char* const kSonames[] = {
      "libhiredis.so.0.14", "libhiredis.so.1.1.0", "libhiredis.so.1.0.0",
      "libhiredis.so", NULL};
  g_hiredis_status = pcp_dynlib_load(
      kSonames, "the FalkorDB graph backend", "libhiredis0.14", kHiredisSymbols,
      PCP_ARRAYSIZE(kHiredisSymbols), &g_hiredis);
}

static pcp_status_t hiredis_load(void) {
  pthread_once(&g_hiredis_once, hiredis_load_once);
  return g_hiredis_status ? pcp_status_clone(g_hiredis_status)
                          : pcp_ok_status();
}

// Longest statement sent (two 1 MiB JSON documents, escaped, plus the
// rest) and most rows read back from one reply.
#define FALKORDB_MAX_QUERY_BYTES ((size_t)5 << 20)
#define FALKORDB_MAX_ROWS PCP_STORE_LIST_LIMIT_MAX
// Log records replayed per round when catching up.
#define FALKORDB_REPLAY_BATCH 256u

typedef struct falkordb_backend_t {
  pcp_store_graph_backend_t base;  // first
  pthread_mutex_t mutex;           // guards everything below
  redisContext* context;           // NULL while disconnected
  char host[PCP_STORE_FALKORDB_HOST_MAX_LENGTH + 1];
  uint16_t port;
  char password[PCP_STORE_FALKORDB_PASSWORD_MAX_LENGTH + 1];
  char graph[PCP_STORE_FALKORDB_GRAPH_MAX_LENGTH + 1];
  uint32_t connect_timeout_ms;
  uint32_t command_timeout_ms;
  // The graph's applied_sequence as last read or written; -1 when unknown
  // (at open and after a failed write), re-read before the next write.
  int64_t applied_sequence;
} falkordb_backend_t;

//===----------------------------------------------------------------------===//
// Statement text
//===----------------------------------------------------------------------===//

typedef struct cypher_t {
  pcp_allocator_t allocator;
  char* data;
  size_t length;
  size_t capacity;
  pcp_status_t status;  // first failure; later appends do nothing
} cypher_t;

static void cypher_deinitialize(cypher_t* c) {
  pcp_allocator_free(c->allocator, c->data);
  pcp_status_ignore(c->status);
  memset(c, 0, sizeof(*c));
}

static void cypher_append(cypher_t* c, const char* text, size_t length) {
  if (c->status) {
    return;
  }
  if (c->length + length + 1 > FALKORDB_MAX_QUERY_BYTES) {
    c->status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                "graph statement is longer than %zu bytes",
                                FALKORDB_MAX_QUERY_BYTES);
    return;
  }
  if (c->length + length + 1 > c->capacity) {
    size_t capacity = c->capacity ? c->capacity : 1024;
    while (capacity < c->length + length + 1) {
      capacity *= 2;
    }
    void* data = c->data;
    c->status = pcp_allocator_realloc(c->allocator, capacity, &data);
    if (c->status) {
      return;
    }
    c->data = data;
    c->capacity = capacity;
  }
  memcpy(c->data + c->length, text, length);
  c->length += length;
  c->data[c->length] = 0;
}

static void cypher_raw(cypher_t* c, const char* text) {
  cypher_append(c, text, strlen(text));
}

// " name=<literal>"; NULL value -> null.
static void cypher_param_string(cypher_t* c, const char* name,
                                const char* value) {
  cypher_raw(c, " ");
  cypher_raw(c, name);
  if (!value) {
    cypher_raw(c, "=null");
    return;
  }
  cypher_raw(c, "=\"");
  const char* run = value;
  for (const char* p = value; *p; ++p) {
    if (*p == '\\' || *p == '"') {
      cypher_append(c, run, (size_t)(p - run));
      cypher_append(c, "\\", 1);
      run = p;
    }
  }
  cypher_raw(c, run);
  cypher_raw(c, "\"");
}

static void cypher_param_int(cypher_t* c, const char* name, int64_t value) {
  char text[96];
  snprintf(text, sizeof(text), " %s=%lld", name, (long long)value);
  cypher_raw(c, text);
}

//===----------------------------------------------------------------------===//
// Connection and commands (mutex held)
//===----------------------------------------------------------------------===//

static void disconnect_locked(falkordb_backend_t* f) {
  if (f->context) {
    g_hiredis.redisFree(f->context);
    f->context = NULL;
  }
  f->applied_sequence = -1;
}

static pcp_status_t connect_locked(falkordb_backend_t* f) {
  if (f->context) {
    return pcp_ok_status();
  }
  struct timeval connect_timeout = {
      .tv_sec = f->connect_timeout_ms / 1000,
      .tv_usec = (f->connect_timeout_ms % 1000) * 1000};
  redisContext* context =
      g_hiredis.redisConnectWithTimeout(f->host, f->port, connect_timeout);
  if (!context || context->err) {
    pcp_status_t status = pcp_make_status(
        PCP_STATUS_UNAVAILABLE, "FalkorDB at %s:%u: connect failed: %s",
        f->host, (unsigned)f->port,
        context ? context->errstr : "out of memory");
    if (context) {
      g_hiredis.redisFree(context);
    }
    return status;
  }
  struct timeval command_timeout = {
      .tv_sec = f->command_timeout_ms / 1000,
      .tv_usec = (f->command_timeout_ms % 1000) * 1000};
  g_hiredis.redisSetTimeout(context, command_timeout);
  if (f->password[0]) {
    const char* argv[] = {"AUTH", f->password};
    redisReply* reply = g_hiredis.redisCommandArgv(context, 2, argv, NULL);
    bool ok = reply && reply->type == REDIS_REPLY_STATUS;
    pcp_status_t status =
        ok ? pcp_ok_status()
           : pcp_make_status(PCP_STATUS_UNAVAILABLE,
                             "FalkorDB at %s:%u refused AUTH: %.200s", f->host,
                             (unsigned)f->port,
                             reply && reply->type == REDIS_REPLY_ERROR
                                 ? reply->str
                                 : context->errstr);
    if (reply) {
      g_hiredis.freeReplyObject(reply);
    }
    if (status) {
      g_hiredis.redisFree(context);
      return status;
    }
  }
  f->context = context;
  return pcp_ok_status();
}

// Runs one GRAPH.QUERY (GRAPH.RO_QUERY when |read_only|) with the server-side
// TIMEOUT. The caller frees *out_reply with g_hiredis.freeReplyObject.
static pcp_status_t run_locked(falkordb_backend_t* f, const cypher_t* q,
                               bool read_only, redisReply** out_reply) {
  *out_reply = NULL;
  if (q->status) {
    return pcp_status_clone(q->status);
  }
  PCP_RETURN_IF_ERROR_BARE(connect_locked(f));
  char timeout[32];
  snprintf(timeout, sizeof(timeout), "%u", (unsigned)f->command_timeout_ms);
  const char* argv[] = {read_only ? "GRAPH.RO_QUERY" : "GRAPH.QUERY", f->graph,
                        q->data, "TIMEOUT", timeout};
  size_t lengths[] = {strlen(argv[0]), strlen(f->graph), q->length, 7,
                      strlen(timeout)};
  redisReply* reply = g_hiredis.redisCommandArgv(
      f->context, (int)PCP_ARRAYSIZE(argv), argv, lengths);
  if (!reply) {
    pcp_status_t status =
        pcp_make_status(PCP_STATUS_UNAVAILABLE, "FalkorDB at %s:%u: %s",
                        f->host, (unsigned)f->port, f->context->errstr);
    disconnect_locked(f);
    return status;
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    bool timed_out = strstr(reply->str, "timed out") != NULL;
    pcp_status_t status = pcp_make_status(
        timed_out ? PCP_STATUS_DEADLINE_EXCEEDED : PCP_STATUS_INTERNAL,
        "FalkorDB: %.300s", reply->str);
    g_hiredis.freeReplyObject(reply);
    return status;
  }
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 1) {
    g_hiredis.freeReplyObject(reply);
    return pcp_make_status(PCP_STATUS_INTERNAL,
                           "FalkorDB: unexpected GRAPH.QUERY reply");
  }
  *out_reply = reply;
  return pcp_ok_status();
}

// The rows of a reply with a RETURN clause (header, rows, statistics).
static pcp_status_t reply_rows(const redisReply* reply, size_t columns,
                               const redisReply** out_rows) {
  if (reply->elements != 3 || reply->element[1]->type != REDIS_REPLY_ARRAY) {
    return pcp_make_status(PCP_STATUS_INTERNAL,
                           "FalkorDB: a reply without rows");
  }
  const redisReply* rows = reply->element[1];
  if (rows->elements > FALKORDB_MAX_ROWS) {
    return pcp_make_status(PCP_STATUS_INTERNAL,
                           "FalkorDB: %zu rows (at most %u expected)",
                           rows->elements, FALKORDB_MAX_ROWS);
  }
  for (size_t i = 0; i < rows->elements; ++i) {
    if (rows->element[i]->type != REDIS_REPLY_ARRAY ||
        rows->element[i]->elements != columns) {
      return pcp_make_status(PCP_STATUS_INTERNAL,
                             "FalkorDB: row %zu is not %zu columns", i,
                             columns);
    }
  }
  *out_rows = rows;
  return pcp_ok_status();
}

static pcp_status_t cell_string(const redisReply* cell, const char* what,
                                char* buffer, size_t capacity) {
  buffer[0] = 0;
  if (cell->type == REDIS_REPLY_NIL) {
    return pcp_ok_status();
  }
  if (cell->type != REDIS_REPLY_STRING || cell->len >= capacity) {
    return pcp_make_status(PCP_STATUS_INTERNAL,
                           "FalkorDB: field %s is not a string under %zu "
                           "bytes",
                           what, capacity);
  }
  memcpy(buffer, cell->str, cell->len);
  buffer[cell->len] = 0;
  return pcp_ok_status();
}

static pcp_status_t cell_int(const redisReply* cell, const char* what,
                             int64_t* out_value) {
  *out_value = 0;
  if (cell->type == REDIS_REPLY_NIL) {
    return pcp_ok_status();
  }
  if (cell->type != REDIS_REPLY_INTEGER) {
    return pcp_make_status(PCP_STATUS_INTERNAL,
                           "FalkorDB: field %s is not an integer", what);
  }
  *out_value = cell->integer;
  return pcp_ok_status();
}

static pcp_status_t cell_json(const redisReply* cell, const char* what,
                              json_t** out_value) {
  *out_value = NULL;
  if (cell->type == REDIS_REPLY_NIL) {
    *out_value = json_object();
    return pcp_ok_status();
  }
  if (cell->type != REDIS_REPLY_STRING ||
      cell->len > PCP_STORE_JSON_MAX_BYTE_LENGTH) {
    return pcp_make_status(PCP_STATUS_INTERNAL,
                           "FalkorDB: field %s is not a JSON string", what);
  }
  json_error_t error;
  *out_value = json_loadb(cell->str, cell->len, JSON_DECODE_ANY, &error);
  if (!*out_value) {
    return pcp_make_status(PCP_STATUS_INTERNAL, "FalkorDB: field %s: %s", what,
                           error.text);
  }
  return pcp_ok_status();
}

static pcp_status_t cell_visibility(const redisReply* cell,
                                    pcp_store_visibility_t* out_visibility) {
  char name[32];
  PCP_RETURN_IF_ERROR_BARE(cell_string(cell, "visibility", name, sizeof(name)));
  if (!pcp_store_visibility_parse(pcp_make_cstring_view(name),
                                  out_visibility)) {
    return pcp_make_status(PCP_STATUS_INTERNAL,
                           "FalkorDB: unknown visibility '%s'", name);
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Rows -> records
//===----------------------------------------------------------------------===//

#define ENTITY_RETURN                                                   \
  " RETURN e.entity_id, e.namespace_id, e.entity_type, e.display_name," \
  " e.visibility, e.properties_json, e.provenance_json, e.created_at,"  \
  " e.updated_at"
#define ENTITY_COLUMNS 9
#define RELATION_RETURN                                                 \
  " RETURN r.relation_id, r.namespace_id, r.relation_type,"             \
  " r.from_entity_id, r.to_entity_id, r.visibility, r.properties_json," \
  " r.provenance_json, r.created_at, r.updated_at"
#define RELATION_COLUMNS 10
#define OBSERVATION_RETURN                                                \
  " RETURN o.observation_id, o.namespace_id, o.subject_entity_id,"        \
  " o.observation_type, o.visibility, o.payload_json, o.provenance_json," \
  " o.created_at"
#define OBSERVATION_COLUMNS 8

static pcp_status_t entity_from_row(redisReply** c,
                                    pcp_store_graph_entity_t* e) {
  memset(e, 0, sizeof(*e));
  pcp_status_t status =
      cell_string(c[0], "entity_id", e->entity_id, sizeof(e->entity_id));
  if (!status) {
    status = cell_string(c[1], "namespace_id", e->namespace_id,
                         sizeof(e->namespace_id));
  }
  if (!status) {
    status = cell_string(c[2], "entity_type", e->entity_type,
                         sizeof(e->entity_type));
  }
  if (!status) {
    status = cell_string(c[3], "display_name", e->display_name,
                         sizeof(e->display_name));
  }
  if (!status)
    status = cell_visibility(c[4], &e->visibility);
  if (!status)
    status = cell_json(c[5], "properties", &e->properties);
  if (!status)
    status = cell_json(c[6], "provenance", &e->provenance);
  if (!status)
    status = cell_int(c[7], "created_at", &e->created_at_ns);
  if (!status)
    status = cell_int(c[8], "updated_at", &e->updated_at_ns);
  if (status) {
    pcp_store_graph_entity_deinitialize(e);
  }
  return status;
}

static pcp_status_t relation_from_row(redisReply** c,
                                      pcp_store_graph_relation_t* r) {
  memset(r, 0, sizeof(*r));
  pcp_status_t status =
      cell_string(c[0], "relation_id", r->relation_id, sizeof(r->relation_id));
  if (!status) {
    status = cell_string(c[1], "namespace_id", r->namespace_id,
                         sizeof(r->namespace_id));
  }
  if (!status) {
    status = cell_string(c[2], "relation_type", r->relation_type,
                         sizeof(r->relation_type));
  }
  if (!status) {
    status = cell_string(c[3], "from_entity_id", r->from_entity_id,
                         sizeof(r->from_entity_id));
  }
  if (!status) {
    status = cell_string(c[4], "to_entity_id", r->to_entity_id,
                         sizeof(r->to_entity_id));
  }
  if (!status)
    status = cell_visibility(c[5], &r->visibility);
  if (!status)
    status = cell_json(c[6], "properties", &r->properties);
  if (!status)
    status = cell_json(c[7], "provenance", &r->provenance);
  if (!status)
    status = cell_int(c[8], "created_at", &r->created_at_ns);
  if (!status)
    status = cell_int(c[9], "updated_at", &r->updated_at_ns);
  if (status) {
    json_decref(r->properties);
    json_decref(r->provenance);
    memset(r, 0, sizeof(*r));
  }
  return status;
}

static pcp_status_t observation_from_row(redisReply** c,
                                         pcp_store_graph_observation_t* o) {
  memset(o, 0, sizeof(*o));
  pcp_status_t status = cell_string(c[0], "observation_id", o->observation_id,
                                    sizeof(o->observation_id));
  if (!status) {
    status = cell_string(c[1], "namespace_id", o->namespace_id,
                         sizeof(o->namespace_id));
  }
  if (!status) {
    status = cell_string(c[2], "subject_entity_id", o->subject_entity_id,
                         sizeof(o->subject_entity_id));
  }
  if (!status) {
    status = cell_string(c[3], "observation_type", o->observation_type,
                         sizeof(o->observation_type));
  }
  if (!status)
    status = cell_visibility(c[4], &o->visibility);
  if (!status)
    status = cell_json(c[5], "payload", &o->payload);
  if (!status)
    status = cell_json(c[6], "provenance", &o->provenance);
  if (!status)
    status = cell_int(c[7], "created_at", &o->created_at_ns);
  if (status) {
    json_decref(o->payload);
    json_decref(o->provenance);
    memset(o, 0, sizeof(*o));
  }
  return status;
}

// Runs |q| and appends its rows to the matching array of |result|.
typedef enum row_kind_e {
  ROW_ENTITY,
  ROW_RELATION,
  ROW_OBSERVATION
} row_kind_t;

static pcp_status_t read_rows_locked(falkordb_backend_t* f, const cypher_t* q,
                                     row_kind_t kind,
                                     pcp_store_graph_result_t* result) {
  static const size_t kColumns[] = {ENTITY_COLUMNS, RELATION_COLUMNS,
                                    OBSERVATION_COLUMNS};
  static const size_t kSizes[] = {sizeof(pcp_store_graph_entity_t),
                                  sizeof(pcp_store_graph_relation_t),
                                  sizeof(pcp_store_graph_observation_t)};
  redisReply* reply = NULL;
  PCP_RETURN_IF_ERROR_BARE(run_locked(f, q, true, &reply));
  const redisReply* rows = NULL;
  pcp_status_t status = reply_rows(reply, kColumns[kind], &rows);
  void** items = kind == ROW_ENTITY     ? (void**)&result->entities
                 : kind == ROW_RELATION ? (void**)&result->relations
                                        : (void**)&result->observations;
  size_t* count = kind == ROW_ENTITY     ? &result->entity_count
                  : kind == ROW_RELATION ? &result->relation_count
                                         : &result->observation_count;
  size_t capacity = *count;
  for (size_t i = 0; !status && i < rows->elements; ++i) {
    status = pcp_store_list_reserve(result->allocator, kSizes[kind], *count,
                                    &capacity, items);
    if (status) {
      break;
    }
    redisReply** cells = rows->element[i]->element;
    char* slot = (char*)*items + *count * kSizes[kind];
    switch (kind) {
      case ROW_ENTITY:
        status = entity_from_row(cells, (pcp_store_graph_entity_t*)slot);
        break;
      case ROW_RELATION:
        status = relation_from_row(cells, (pcp_store_graph_relation_t*)slot);
        break;
      case ROW_OBSERVATION:
        status =
            observation_from_row(cells, (pcp_store_graph_observation_t*)slot);
        break;
    }
    if (!status) {
      ++*count;
    }
  }
  g_hiredis.freeReplyObject(reply);
  return status;
}

// Runs a statement that returns one integer (count, applied_sequence).
static pcp_status_t read_int_locked(falkordb_backend_t* f, const cypher_t* q,
                                    bool read_only, int64_t* out_value) {
  *out_value = 0;
  redisReply* reply = NULL;
  PCP_RETURN_IF_ERROR_BARE(run_locked(f, q, read_only, &reply));
  const redisReply* rows = NULL;
  pcp_status_t status = reply_rows(reply, 1, &rows);
  if (!status && rows->elements > 0) {
    status = cell_int(rows->element[0]->element[0], "count", out_value);
  }
  g_hiredis.freeReplyObject(reply);
  return status;
}

//===----------------------------------------------------------------------===//
// Mutations -> statements
//===----------------------------------------------------------------------===//

// Reads a string key of a mutation payload into |buffer| (|fallback| when
// absent, INVALID_ARGUMENT when required and absent), as graph.c does.
static pcp_status_t payload_field(const json_t* payload, const char* key,
                                  const char* fallback, char* buffer,
                                  size_t capacity) {
  const json_t* value = json_object_get(payload, key);
  const char* text = NULL;
  if (!value && fallback) {
    text = fallback;
  } else if (json_is_string(value)) {
    text = json_string_value(value);
  } else {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "mutation payload needs a string '%s'", key);
  }
  if (strlen(text) >= capacity) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "mutation %s is longer than %zu bytes", key,
                           capacity - 1);
  }
  snprintf(buffer, capacity, "%s", text);
  return pcp_ok_status();
}

// What one mutation turns into: the parameters (without $seq, known only
// after the log append) and the statement body.
typedef struct statement_t {
  cypher_t params;
  cypher_t body;
  // For deletes: the existence check run before anything is logged.
  const char* exists_body;
} statement_t;

static void statement_deinitialize(statement_t* s) {
  cypher_deinitialize(&s->params);
  cypher_deinitialize(&s->body);
}

// A stub endpoint MERGE for parameter |id| bound to |var|.
static void stub_merge(cypher_t* body, const char* var, const char* id) {
  char text[512];
  snprintf(text, sizeof(text),
           " MERGE (%s:KGEntity {entity_id: $%s}) ON CREATE SET"
           " %s.stub = true, %s.namespace_id = $ns, %s.entity_type = "
           "'unknown', %s.display_name = $%s, %s.visibility = $vis,"
           " %s.properties_json = '{}', %s.provenance_json = '{}',"
           " %s.created_at = $now, %s.updated_at = $now",
           var, id, var, var, var, var, id, var, var, var, var, var);
  cypher_raw(body, text);
}

static const char kMetaSet[] =
    " WITH count(*) AS done MERGE (m:PCPMeta {key: 'meta'})"
    " SET m.applied_sequence = $seq RETURN m.applied_sequence";

static pcp_status_t statement_build(pcp_store_t* store,
                                    const pcp_store_mutation_t* m,
                                    statement_t* out) {
  memset(out, 0, sizeof(*out));
  out->params.allocator = out->body.allocator = store->allocator;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("namespace_id", m->namespace_id, true));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_id_validate("target_id", m->target_id, true));
  if (m->visibility < 0 || m->visibility >= PCP_STORE_VISIBILITY_COUNT_) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "visibility %d is out of range", (int)m->visibility);
  }
  json_t* empty = json_object();
  const json_t* payload = m->payload ? m->payload : empty;
  char* properties = NULL;
  char* provenance = NULL;
  pcp_status_t status = pcp_store_json_encode(
      "mutation provenance", m->provenance, "{}", true, &provenance);
  cypher_t* p = &out->params;
  cypher_t* b = &out->body;
  int64_t now = m->timestamp_ns ? m->timestamp_ns : pcp_store_now_ns(store);
  cypher_param_string(p, "id", m->target_id);
  cypher_param_string(p, "ns", m->namespace_id);
  cypher_param_string(p, "vis", pcp_store_visibility_name(m->visibility));
  cypher_param_string(p, "prov", provenance);
  cypher_param_int(p, "now", now);
  switch (status ? PCP_STORE_MUTATION_TYPE_COUNT_ : m->mutation_type) {
    case PCP_STORE_MUTATION_UPSERT_ENTITY: {
      char type[PCP_STORE_NAME_MAX_LENGTH + 1];
      char name[PCP_STORE_NAME_MAX_LENGTH + 1];
      status = payload_field(payload, "entity_type", NULL, type, sizeof(type));
      if (!status) {
        status = payload_field(payload, "display_name", m->target_id, name,
                               sizeof(name));
      }
      if (!status) {
        status = pcp_store_name_validate("entity_type", type,
                                         PCP_STORE_NAME_MAX_LENGTH, false);
      }
      if (!status) {
        status = pcp_store_name_validate("display_name", name,
                                         PCP_STORE_NAME_MAX_LENGTH, true);
      }
      if (!status) {
        status = pcp_store_json_encode("entity properties",
                                       json_object_get(payload, "properties"),
                                       "{}", true, &properties);
      }
      cypher_param_string(p, "ty", type);
      cypher_param_string(p, "dn", name[0] ? name : m->target_id);
      cypher_param_string(p, "props", properties);
      // A stub becomes a real entity created now (SQLite had no row).
      cypher_raw(b,
                 " MERGE (e:KGEntity {entity_id: $id})"
                 " ON CREATE SET e.stub = true"
                 " SET e.created_at = CASE WHEN e.stub THEN $now"
                 " ELSE e.created_at END"
                 " SET e.stub = false, e.namespace_id = $ns,"
                 " e.entity_type = $ty, e.display_name = $dn,"
                 " e.visibility = $vis, e.properties_json = $props,"
                 " e.provenance_json = $prov, e.updated_at = $now");
      break;
    }
    case PCP_STORE_MUTATION_UPSERT_RELATION: {
      char type[PCP_STORE_NAME_MAX_LENGTH + 1];
      char from[PCP_STORE_ID_MAX_LENGTH + 1];
      char to[PCP_STORE_ID_MAX_LENGTH + 1];
      status =
          payload_field(payload, "relation_type", NULL, type, sizeof(type));
      if (!status) {
        status =
            payload_field(payload, "from_entity_id", NULL, from, sizeof(from));
      }
      if (!status) {
        status = payload_field(payload, "to_entity_id", NULL, to, sizeof(to));
      }
      if (!status) {
        status = pcp_store_name_validate("relation_type", type,
                                         PCP_STORE_NAME_MAX_LENGTH, false);
      }
      if (!status)
        status = pcp_store_id_validate("from_entity_id", from, true);
      if (!status)
        status = pcp_store_id_validate("to_entity_id", to, true);
      if (!status) {
        status = pcp_store_json_encode("relation properties",
                                       json_object_get(payload, "properties"),
                                       "{}", true, &properties);
      }
      cypher_param_string(p, "ty", type);
      cypher_param_string(p, "src", from);
      cypher_param_string(p, "dst", to);
      cypher_param_string(p, "props", properties);
      stub_merge(b, "a", "src");
      stub_merge(b, "b", "dst");
      // An upsert may move the edge: drop the old one, keep its created_at.
      cypher_raw(b,
                 " WITH a, b OPTIONAL MATCH ()-[old:KG_RELATION"
                 " {relation_id: $id}]->()"
                 " WITH a, b, old, coalesce(old.created_at, $now) AS created"
                 " DELETE old"
                 " CREATE (a)-[r:KG_RELATION {relation_id: $id,"
                 " namespace_id: $ns, relation_type: $ty,"
                 " from_entity_id: $src, to_entity_id: $dst,"
                 " visibility: $vis, properties_json: $props,"
                 " provenance_json: $prov, created_at: created,"
                 " updated_at: $now}]->(b)");
      break;
    }
    case PCP_STORE_MUTATION_APPEND_OBSERVATION: {
      char type[PCP_STORE_NAME_MAX_LENGTH + 1];
      char subject[PCP_STORE_ID_MAX_LENGTH + 1];
      status =
          payload_field(payload, "observation_type", NULL, type, sizeof(type));
      if (!status) {
        status = payload_field(payload, "subject_entity_id", NULL, subject,
                               sizeof(subject));
      }
      if (!status) {
        status = pcp_store_name_validate("observation_type", type,
                                         PCP_STORE_NAME_MAX_LENGTH, false);
      }
      if (!status) {
        status = pcp_store_id_validate("subject_entity_id", subject, true);
      }
      const json_t* inner = json_object_get(payload, "payload");
      if (!status) {
        status = pcp_store_json_encode("observation payload",
                                       inner ? inner : payload, "{}", false,
                                       &properties);
      }
      cypher_param_string(p, "ty", type);
      cypher_param_string(p, "subj", subject);
      cypher_param_string(p, "payload", properties);
      stub_merge(b, "s", "subj");
      // An upsert by id, created_at = now (SQLite's INSERT OR REPLACE).
      cypher_raw(b,
                 " MERGE (o:KGObservation {observation_id: $id})"
                 " SET o.namespace_id = $ns, o.subject_entity_id = $subj,"
                 " o.observation_type = $ty, o.visibility = $vis,"
                 " o.payload_json = $payload, o.provenance_json = $prov,"
                 " o.created_at = $now"
                 " WITH s, o OPTIONAL MATCH (o)-[old:OBSERVED_ON]->()"
                 " DELETE old"
                 " WITH DISTINCT s, o CREATE (o)-[:OBSERVED_ON]->(s)");
      break;
    }
    case PCP_STORE_MUTATION_DELETE_ENTITY:
      // The entity, its relations (DETACH) and its observations, as the
      // SQLite store does.
      cypher_raw(b,
                 " OPTIONAL MATCH (o:KGObservation {subject_entity_id: $id})"
                 " DELETE o WITH count(*) AS gone"
                 " OPTIONAL MATCH (e:KGEntity {entity_id: $id})"
                 " WHERE e.stub = false DETACH DELETE e");
      out->exists_body =
          " MATCH (e:KGEntity {entity_id: $id}) WHERE e.stub = false"
          " RETURN count(e)";
      break;
    case PCP_STORE_MUTATION_DELETE_RELATION:
      cypher_raw(b,
                 " OPTIONAL MATCH ()-[r:KG_RELATION {relation_id: $id}]->()"
                 " DELETE r");
      out->exists_body =
          " MATCH ()-[r:KG_RELATION {relation_id: $id}]->() RETURN count(r)";
      break;
    case PCP_STORE_MUTATION_POLICY_UPDATE:
      // Policies live with the federation code; the log records the change
      // and the graph only advances its applied sequence.
      cypher_raw(b, " WITH 1 AS policy");
      break;
    default:
      if (!status) {
        status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "mutation type %d is out of range",
                                 (int)m->mutation_type);
      }
      break;
  }
  cypher_raw(b, kMetaSet);
  pcp_allocator_free(pcp_allocator_system(), properties);
  pcp_allocator_free(pcp_allocator_system(), provenance);
  json_decref(empty);
  if (!status && out->params.status)
    status = pcp_status_clone(out->params.status);
  if (!status && out->body.status)
    status = pcp_status_clone(out->body.status);
  if (status) {
    statement_deinitialize(out);
  }
  return status;
}

// "CYPHER <params> seq=N <body>".
static void statement_text(const statement_t* s, int64_t sequence_no,
                           const char* body, cypher_t* out) {
  cypher_raw(out, "CYPHER");
  if (s->params.data) {
    cypher_raw(out, s->params.data);
  }
  cypher_param_int(out, "seq", sequence_no);
  cypher_raw(out, body);
}

static pcp_status_t statement_apply_locked(falkordb_backend_t* f,
                                           const statement_t* s,
                                           int64_t sequence_no) {
  cypher_t q = {.allocator = f->base.store->allocator};
  statement_text(s, sequence_no, s->body.data, &q);
  int64_t applied = 0;
  pcp_status_t status = read_int_locked(f, &q, false, &applied);
  cypher_deinitialize(&q);
  if (!status && applied != sequence_no) {
    status = pcp_make_status(PCP_STATUS_INTERNAL,
                             "FalkorDB: applied_sequence %lld after applying "
                             "%lld",
                             (long long)applied, (long long)sequence_no);
  }
  f->applied_sequence = status ? -1 : sequence_no;
  return status;
}

// Lookup indexes; creating one that exists is an error FalkorDB reports
// and that is fine to ignore (a connection failure is not).
static pcp_status_t indexes_create_locked(falkordb_backend_t* f) {
  static const char* const kIndexes[] = {
      "CREATE INDEX FOR (e:KGEntity) ON (e.entity_id)",
      "CREATE INDEX FOR (o:KGObservation) ON (o.observation_id)",
      "CREATE INDEX FOR (o:KGObservation) ON (o.subject_entity_id)",
      "CREATE INDEX FOR ()-[r:KG_RELATION]-() ON (r.relation_id)",
  };
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; !status && i < PCP_ARRAYSIZE(kIndexes); ++i) {
    cypher_t q = {.allocator = f->base.store->allocator};
    cypher_raw(&q, kIndexes[i]);
    redisReply* reply = NULL;
    status = run_locked(f, &q, false, &reply);
    cypher_deinitialize(&q);
    if (reply) {
      g_hiredis.freeReplyObject(reply);
    }
    if (status && pcp_status_code(status) != PCP_STATUS_UNAVAILABLE) {
      pcp_status_ignore(status);
      status = pcp_ok_status();
    }
  }
  return status;
}

// Applies every log record after the graph's applied_sequence (in order).
// Records whose statement cannot be built (appended to the log by other
// means with a payload this backend refuses) only advance the sequence.
static pcp_status_t catch_up_locked(falkordb_backend_t* f) {
  pcp_store_t* store = f->base.store;
  // Read from the server before every write: an unreachable server fails
  // here, before anything is logged, and one that lost its data (restarted
  // without persistence) answers 0 and gets the whole log replayed.
  // A write (MERGE), so that a graph key that is gone is created again.
  f->applied_sequence = -1;
  {
    cypher_t q = {.allocator = store->allocator};
    cypher_raw(&q,
               "MERGE (m:PCPMeta {key: 'meta'}) ON CREATE SET"
               " m.applied_sequence = 0 RETURN m.applied_sequence");
    int64_t applied = 0;
    pcp_status_t status = read_int_locked(f, &q, false, &applied);
    cypher_deinitialize(&q);
    PCP_RETURN_IF_ERROR_BARE(status);
    if (applied == 0) {
      // A new (or wiped) graph: its lookup indexes first.
      PCP_RETURN_IF_ERROR_BARE(indexes_create_locked(f));
    }
    f->applied_sequence = applied;
  }
  for (;;) {
    pcp_store_mutation_list_t list;
    PCP_RETURN_IF_ERROR_BARE(pcp_store_mutation_list(
        store, f->applied_sequence, FALKORDB_REPLAY_BATCH, &list));
    pcp_status_t status = pcp_ok_status();
    for (size_t i = 0; !status && i < list.count; ++i) {
      statement_t s;
      pcp_status_t built = statement_build(store, &list.items[i], &s);
      if (built) {
        PCP_LOG(PCP_LOG_WARN, NULL,
                "graph: log record %lld cannot be applied to FalkorDB "
                "(%s); skipped",
                (long long)list.items[i].sequence_no,
                pcp_status_message(built));
        pcp_status_ignore(built);
        memset(&s, 0, sizeof(s));
        s.params.allocator = s.body.allocator = store->allocator;
        cypher_raw(&s.body, " WITH 1 AS skipped");
        cypher_raw(&s.body, kMetaSet);
      }
      status = statement_apply_locked(f, &s, list.items[i].sequence_no);
      statement_deinitialize(&s);
    }
    bool more = list.count == FALKORDB_REPLAY_BATCH;
    pcp_store_mutation_list_deinitialize(&list);
    PCP_RETURN_IF_ERROR_BARE(status);
    if (!more) {
      return pcp_ok_status();
    }
  }
}

//===----------------------------------------------------------------------===//
// Vtable
//===----------------------------------------------------------------------===//

static pcp_status_t falkordb_mutation_apply(
    pcp_store_graph_backend_t* backend, const pcp_store_mutation_t* mutation,
    int64_t* out_sequence_no, bool* out_duplicate) {
  falkordb_backend_t* f = (falkordb_backend_t*)backend;
  pcp_store_t* store = backend->store;
  if (out_sequence_no)
    *out_sequence_no = 0;
  if (out_duplicate)
    *out_duplicate = false;
  statement_t s;
  PCP_RETURN_IF_ERROR_BARE(statement_build(store, mutation, &s));
  pthread_mutex_lock(&f->mutex);
  int64_t sequence_no = 0;
  pcp_status_t status = pcp_ok_status();
  if (mutation->mutation_id[0]) {
    status =
        pcp_store_mutation_find(store, mutation->mutation_id, &sequence_no);
  }
  bool duplicate = sequence_no != 0;
  // Anything logged but not applied goes first, so the graph applies the
  // log in order; an unreachable server fails here, before logging.
  if (!status && !duplicate) {
    status = catch_up_locked(f);
  }
  if (!status && !duplicate && s.exists_body) {
    cypher_t q = {.allocator = store->allocator};
    statement_text(&s, 0, s.exists_body, &q);
    int64_t count = 0;
    status = read_int_locked(f, &q, true, &count);
    cypher_deinitialize(&q);
    if (!status && count == 0) {
      status = pcp_make_status(
          PCP_STATUS_NOT_FOUND, "%s '%s' not found",
          mutation->mutation_type == PCP_STORE_MUTATION_DELETE_ENTITY
              ? "entity"
              : "relation",
          mutation->target_id);
    }
  }
  if (!status && !duplicate) {
    bool appended_duplicate = false;
    status = pcp_store_mutation_append(store, mutation, &sequence_no,
                                       &appended_duplicate);
    duplicate = appended_duplicate;
  }
  if (!status && !duplicate) {
    status = statement_apply_locked(f, &s, sequence_no);
    if (status) {
      pcp_status_t wrapped = pcp_make_status(
          PCP_STATUS_UNAVAILABLE,
          "mutation logged as sequence %lld but not yet applied to the "
          "graph (replayed before the next write): %s",
          (long long)sequence_no, pcp_status_message(status));
      pcp_status_ignore(status);
      status = wrapped;
    }
  }
  pthread_mutex_unlock(&f->mutex);
  statement_deinitialize(&s);
  if (!status) {
    if (out_sequence_no)
      *out_sequence_no = sequence_no;
    if (out_duplicate)
      *out_duplicate = duplicate;
  }
  return status;
}

static void query_params(cypher_t* q, const pcp_store_graph_query_t* query,
                         uint32_t limit) {
  cypher_raw(q, "CYPHER");
  cypher_param_string(q, "id", query->entity_id);
  cypher_param_string(q, "ns", query->namespace_id);
  cypher_param_string(q, "ety", query->entity_type);
  cypher_param_string(q, "rty", query->relation_type);
  cypher_param_string(q, "text", query->text);
  cypher_param_int(q, "limit", limit);
}

static pcp_status_t falkordb_query(pcp_store_graph_backend_t* backend,
                                   const pcp_store_graph_query_t* query,
                                   pcp_store_graph_result_t* out_result) {
  falkordb_backend_t* f = (falkordb_backend_t*)backend;
  pcp_store_t* store = backend->store;
  memset(out_result, 0, sizeof(*out_result));
  out_result->allocator = store->allocator;
  pcp_store_graph_query_t all = {0};
  if (!query) {
    query = &all;
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_store_graph_query_validate(query));
  uint32_t limit = pcp_store_limit_normalize(query->limit, 20);
  pthread_mutex_lock(&f->mutex);
  pcp_status_t status = pcp_ok_status();
  // Three statements: each array is ordered and limited on its own, as the
  // SQLite backend's three SELECTs are. The fragments are constants; the
  // values are parameters.
  if (!query->relation_type) {
    cypher_t q = {.allocator = store->allocator};
    query_params(&q, query, limit);
    cypher_raw(&q, query->entity_id ? " MATCH (e:KGEntity {entity_id: $id})"
                                    : " MATCH (e:KGEntity)");
    cypher_raw(&q,
               " WHERE e.stub = false"
               " AND ($ns IS NULL OR e.namespace_id = $ns)"
               " AND ($ety IS NULL OR e.entity_type = $ety)"
               " AND ($text IS NULL OR (e.entity_id + ' ' + e.entity_type"
               " + ' ' + e.display_name + ' ' + e.properties_json + ' ' +"
               " e.provenance_json) CONTAINS $text)" ENTITY_RETURN
               " ORDER BY e.updated_at DESC, e.entity_id LIMIT $limit");
    status = read_rows_locked(f, &q, ROW_ENTITY, out_result);
    cypher_deinitialize(&q);
  }
  if (!status && !query->entity_type) {
    cypher_t q = {.allocator = store->allocator};
    query_params(&q, query, limit);
    // By entity: from its node over the entity_id index (a stub when it
    // was never upserted), either direction, each edge once.
    cypher_raw(&q, query->entity_id ? " MATCH (n:KGEntity {entity_id: $id})"
                                      "-[r:KG_RELATION]-() WITH DISTINCT r"
                                    : " MATCH ()-[r:KG_RELATION]->()");
    cypher_raw(&q,
               " WHERE ($id IS NULL OR r.from_entity_id = $id"
               " OR r.to_entity_id = $id)"
               " AND ($ns IS NULL OR r.namespace_id = $ns)"
               " AND ($rty IS NULL OR r.relation_type = $rty)"
               " AND ($text IS NULL OR (r.relation_id + ' ' + r.relation_type"
               " + ' ' + r.from_entity_id + ' ' + r.to_entity_id + ' ' +"
               " r.properties_json + ' ' + r.provenance_json) CONTAINS "
               "$text)" RELATION_RETURN
               " ORDER BY r.updated_at DESC, r.relation_id LIMIT $limit");
    status = read_rows_locked(f, &q, ROW_RELATION, out_result);
    cypher_deinitialize(&q);
  }
  if (!status && !query->entity_type && !query->relation_type) {
    cypher_t q = {.allocator = store->allocator};
    query_params(&q, query, limit);
    cypher_raw(&q, query->entity_id
                       ? " MATCH (o:KGObservation {subject_entity_id: $id})"
                       : " MATCH (o:KGObservation)");
    cypher_raw(&q,
               " WHERE ($id IS NULL OR o.subject_entity_id = $id)"
               " AND ($ns IS NULL OR o.namespace_id = $ns)"
               " AND ($text IS NULL OR (o.observation_id + ' ' +"
               " o.observation_type + ' ' + o.subject_entity_id + ' ' +"
               " o.payload_json + ' ' + o.provenance_json) CONTAINS "
               "$text)" OBSERVATION_RETURN
               " ORDER BY o.created_at DESC, o.observation_id LIMIT $limit");
    status = read_rows_locked(f, &q, ROW_OBSERVATION, out_result);
    cypher_deinitialize(&q);
  }
  pthread_mutex_unlock(&f->mutex);
  if (status) {
    pcp_store_graph_result_deinitialize(out_result);
  }
  return status;
}

static pcp_status_t falkordb_entity_get(pcp_store_graph_backend_t* backend,
                                        const char* entity_id,
                                        pcp_store_graph_entity_t* out_entity) {
  memset(out_entity, 0, sizeof(*out_entity));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_id_validate("entity_id", entity_id, true));
  falkordb_backend_t* f = (falkordb_backend_t*)backend;
  pcp_store_graph_result_t result = {.allocator = backend->store->allocator};
  cypher_t q = {.allocator = backend->store->allocator};
  cypher_raw(&q, "CYPHER");
  cypher_param_string(&q, "id", entity_id);
  cypher_raw(
      &q,
      " MATCH (e:KGEntity {entity_id: $id}) WHERE e.stub = false" ENTITY_RETURN
      " LIMIT 1");
  pthread_mutex_lock(&f->mutex);
  pcp_status_t status = read_rows_locked(f, &q, ROW_ENTITY, &result);
  pthread_mutex_unlock(&f->mutex);
  cypher_deinitialize(&q);
  if (!status && result.entity_count == 0) {
    status = pcp_make_status(PCP_STATUS_NOT_FOUND, "entity '%s' not found",
                             entity_id);
  }
  if (!status) {
    *out_entity = result.entities[0];
    memset(&result.entities[0], 0, sizeof(result.entities[0]));
  }
  pcp_store_graph_result_deinitialize(&result);
  return status;
}

static pcp_status_t falkordb_neighbors_list(
    pcp_store_graph_backend_t* backend, const char* entity_id,
    const char* relation_type, pcp_store_graph_direction_t direction,
    uint32_t limit, pcp_store_graph_result_t* out_result) {
  falkordb_backend_t* f = (falkordb_backend_t*)backend;
  pcp_store_t* store = backend->store;
  memset(out_result, 0, sizeof(*out_result));
  out_result->allocator = store->allocator;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_graph_neighbors_validate(entity_id, relation_type, direction));
  limit = pcp_store_limit_normalize(limit, 20);
  cypher_t q = {.allocator = store->allocator};
  cypher_raw(&q, "CYPHER");
  cypher_param_string(&q, "id", entity_id);
  cypher_param_string(&q, "rty", relation_type);
  cypher_param_int(&q, "dir", (int64_t)direction);
  cypher_param_int(&q, "limit", limit);
  cypher_raw(&q,
             " MATCH ()-[r:KG_RELATION]->()"
             " WHERE ((($dir = 1 OR $dir = 3) AND r.from_entity_id = $id)"
             " OR (($dir = 2 OR $dir = 3) AND r.to_entity_id = $id))"
             " AND ($rty IS NULL OR r.relation_type = $rty)" RELATION_RETURN
             " ORDER BY r.updated_at DESC, r.relation_id LIMIT $limit");
  pthread_mutex_lock(&f->mutex);
  pcp_status_t status = read_rows_locked(f, &q, ROW_RELATION, out_result);
  cypher_deinitialize(&q);
  // The other ends, each once, in relation order; stubs are left out.
  for (size_t i = 0; !status && i < out_result->relation_count; ++i) {
    const pcp_store_graph_relation_t* r = &out_result->relations[i];
    const char* other = strcmp(r->from_entity_id, entity_id) == 0
                            ? r->to_entity_id
                            : r->from_entity_id;
    bool listed = false;
    for (size_t j = 0; j < out_result->entity_count; ++j) {
      listed |= strcmp(out_result->entities[j].entity_id, other) == 0;
    }
    if (listed) {
      continue;
    }
    cypher_t e = {.allocator = store->allocator};
    cypher_raw(&e, "CYPHER");
    cypher_param_string(&e, "id", other);
    cypher_raw(&e,
               " MATCH (e:KGEntity {entity_id: $id}) WHERE e.stub = "
               "false" ENTITY_RETURN " LIMIT 1");
    status = read_rows_locked(f, &e, ROW_ENTITY, out_result);
    cypher_deinitialize(&e);
  }
  pthread_mutex_unlock(&f->mutex);
  if (status) {
    pcp_store_graph_result_deinitialize(out_result);
  }
  return status;
}

static pcp_status_t falkordb_counts_query(
    pcp_store_graph_backend_t* backend, pcp_store_graph_counts_t* out_counts) {
  falkordb_backend_t* f = (falkordb_backend_t*)backend;
  static const char* const kStatements[] = {
      "MATCH (e:KGEntity) WHERE e.stub = false RETURN count(e)",
      "MATCH ()-[r:KG_RELATION]->() RETURN count(r)",
      "MATCH (o:KGObservation) RETURN count(o)",
      "MATCH (e:KGEntity) WHERE e.stub = false RETURN e.namespace_id AS ns"
      " UNION MATCH ()-[r:KG_RELATION]->() RETURN r.namespace_id AS ns"
      " UNION MATCH (o:KGObservation) RETURN o.namespace_id AS ns",
  };
  int64_t* targets[] = {&out_counts->entities, &out_counts->relations,
                        &out_counts->observations, &out_counts->namespaces};
  pthread_mutex_lock(&f->mutex);
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; !status && i < 3; ++i) {
    cypher_t q = {.allocator = backend->store->allocator};
    cypher_raw(&q, kStatements[i]);
    status = read_int_locked(f, &q, true, targets[i]);
    cypher_deinitialize(&q);
  }
  if (!status) {
    // The distinct namespaces: count the rows of the UNION.
    cypher_t q = {.allocator = backend->store->allocator};
    cypher_raw(&q, "CALL {");
    cypher_raw(&q, kStatements[3]);
    cypher_raw(&q, "} RETURN count(DISTINCT ns)");
    status = read_int_locked(f, &q, true, targets[3]);
    cypher_deinitialize(&q);
  }
  pthread_mutex_unlock(&f->mutex);
  return status;
}

static void falkordb_close(pcp_store_graph_backend_t* backend) {
  falkordb_backend_t* f = (falkordb_backend_t*)backend;
  pthread_mutex_lock(&f->mutex);
  disconnect_locked(f);
  pthread_mutex_unlock(&f->mutex);
  pthread_mutex_destroy(&f->mutex);
  memset(f->password, 0, sizeof(f->password));
  pcp_allocator_free(backend->store->allocator, f);
}

static const pcp_store_graph_backend_vtable_t kFalkordbVtable = {
    .name = "falkordb",
    .mutation_apply = falkordb_mutation_apply,
    .query = falkordb_query,
    .entity_get = falkordb_entity_get,
    .neighbors_list = falkordb_neighbors_list,
    .counts_query = falkordb_counts_query,
    .close = falkordb_close,
};

static bool graph_key_valid(const char* key) {
  size_t length = strlen(key);
  if (length == 0 || length > PCP_STORE_FALKORDB_GRAPH_MAX_LENGTH) {
    return false;
  }
  for (const char* p = key; *p; ++p) {
    char c = *p;
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '.' || c == ':' ||
              c == '-';
    if (!ok) {
      return false;
    }
  }
  return true;
}

pcp_status_t pcp_store_graph_backend_falkordb_open(
    pcp_store_t* store, const pcp_store_falkordb_options_t* options,
    pcp_store_graph_backend_t** out_backend) {
  *out_backend = NULL;
  const char* host =
      options->host && options->host[0] ? options->host : "127.0.0.1";
  const char* graph =
      options->graph && options->graph[0] ? options->graph : "pcp";
  const char* password = options->password ? options->password : "";
  if (strlen(host) > PCP_STORE_FALKORDB_HOST_MAX_LENGTH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "falkordb.host is longer than %d bytes",
                           PCP_STORE_FALKORDB_HOST_MAX_LENGTH);
  }
  if (!graph_key_valid(graph)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "falkordb.graph must be 1..%d characters of "
                           "[A-Za-z0-9_.:-]",
                           PCP_STORE_FALKORDB_GRAPH_MAX_LENGTH);
  }
  if (strlen(password) > PCP_STORE_FALKORDB_PASSWORD_MAX_LENGTH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "the FalkorDB password is longer than %d bytes",
                           PCP_STORE_FALKORDB_PASSWORD_MAX_LENGTH);
  }
  PCP_RETURN_IF_ERROR_BARE(hiredis_load());
  falkordb_backend_t* f = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(store->allocator, sizeof(*f), (void**)&f));
  f->base.vtable = &kFalkordbVtable;
  f->base.store = store;
  pthread_mutex_init(&f->mutex, NULL);
  snprintf(f->host, sizeof(f->host), "%s", host);
  f->port = options->port ? options->port : 6379;
  snprintf(f->password, sizeof(f->password), "%s", password);
  snprintf(f->graph, sizeof(f->graph), "%s", graph);
  f->connect_timeout_ms =
      options->connect_timeout_ms ? options->connect_timeout_ms : 2000;
  f->command_timeout_ms =
      options->command_timeout_ms ? options->command_timeout_ms : 5000;
  f->applied_sequence = -1;
  pthread_mutex_lock(&f->mutex);
  pcp_status_t status = connect_locked(f);
  if (!status) {
    status = catch_up_locked(f);
  }
  pthread_mutex_unlock(&f->mutex);
  if (status) {
    falkordb_close(&f->base);
    return status;
  }
  *out_backend = &f->base;
  return pcp_ok_status();
}

#else  // !PCP_STORE_HAVE_HIREDIS

pcp_status_t pcp_store_graph_backend_falkordb_open(
    pcp_store_t* store, const pcp_store_falkordb_options_t* options,
    pcp_store_graph_backend_t** out_backend) {
  (void)store;
  (void)options;
  *out_backend = NULL;
  return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                         "this pcp was built without hiredis.h (Debian "
                         "libhiredis-dev): graph_backend \"falkordb\" is not "
                         "available");
}

#endif  // PCP_STORE_HAVE_HIREDIS
