// SPDX-License-Identifier: Apache-2.0
//
// Knowledge-graph backends: one interface, two implementations.
//
//   - "sqlite": the graph tables of the store itself (store.h), the graph
//     apply and the log append in one SQLite transaction.
//   - "falkordb": a FalkorDB server (Cypher over the Redis protocol, hiredis
//     opened with dlopen at first use) holds the graph; the mutation log
//     stays in the SQLite store so replication reads one log whatever the
//     backend.
//
// FalkorDB write order (the graph and the log must not disagree):
//   1. validate the mutation and turn it into one Cypher statement (a bad
//      payload is refused before anything is written);
//   2. duplicate check against the log (a known mutation_id applies nothing);
//   3. append to the SQLite log (durable; the log is the source of truth);
//   4. apply the Cypher statement, which also sets the graph's
//      `(:PCPMeta).applied_sequence` to the record's sequence number in the
//      same (atomic) GRAPH.QUERY.
// Recovery: every statement is idempotent (MERGE upserts, deletes that
// match nothing do nothing). Before each write (and at open) the backend
// reads applied_sequence from the server (MERGE: a vanished graph key is
// recreated with its indexes, at 0) and replays the log records after it in
// order, so an unreachable server fails the write before anything is
// logged, and a step 4 that failed (server down, timeout, process killed)
// or a server that lost its data is caught up at the next write or open. A
// failed step 4 is reported as UNAVAILABLE naming the logged sequence
// number; the record is not lost.
//
// Thread-safety: every function is thread-safe (the FalkorDB backend holds
// one connection behind a mutex; the SQLite one is the store's).

#ifndef PCP_STORE_GRAPH_BACKEND_H_
#define PCP_STORE_GRAPH_BACKEND_H_

#include <stdbool.h>
#include <stdint.h>

#include "store/store.h"

typedef struct pcp_store_graph_backend_t pcp_store_graph_backend_t;

// Backend names accepted by pcp_store_graph_backend_kind_parse, in the
// order an error message lists them.
#define PCP_STORE_GRAPH_BACKENDS_SUPPORTED "sqlite, falkordb"

typedef enum pcp_store_graph_backend_kind_e {
  PCP_STORE_GRAPH_BACKEND_SQLITE = 0,
  PCP_STORE_GRAPH_BACKEND_FALKORDB = 1,
} pcp_store_graph_backend_kind_t;

// False for anything but "sqlite" and "falkordb" (neo4j included: there is
// no Neo4j server to test against). Thread-safe.
bool pcp_store_graph_backend_kind_parse(
    const char* name, pcp_store_graph_backend_kind_t* out_kind);

typedef struct pcp_store_graph_counts_t {
  int64_t entities;  // stubs (FalkorDB endpoints never upserted) excluded
  int64_t relations;
  int64_t observations;
  int64_t namespaces;  // distinct namespace_id over the three
} pcp_store_graph_counts_t;

// Longest host name, graph key and password.
#define PCP_STORE_FALKORDB_HOST_MAX_LENGTH 255
#define PCP_STORE_FALKORDB_GRAPH_MAX_LENGTH 127
#define PCP_STORE_FALKORDB_PASSWORD_MAX_LENGTH 512

typedef struct pcp_store_falkordb_options_t {
  const char* host;             // NULL: 127.0.0.1
  uint16_t port;                // 0: 6379
  const char* password;         // NULL or "": no AUTH
  const char* graph;            // NULL: "pcp"; [A-Za-z0-9_.:-]{1,127}
  uint32_t connect_timeout_ms;  // 0: 2000
  uint32_t command_timeout_ms;  // 0: 5000 (socket and GRAPH.QUERY TIMEOUT)
} pcp_store_falkordb_options_t;

// The store's own graph tables. |store| must outlive the backend.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_graph_backend_sqlite_open(
    pcp_store_t* store, pcp_store_graph_backend_t** out_backend);

// Connects (NOT_FOUND when libhiredis cannot be loaded, UNAVAILABLE when
// the server does not answer or refuses AUTH), creates the indexes and
// replays log records the graph has not applied yet. |store| holds the log
// and must outlive the backend.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_graph_backend_falkordb_open(
    pcp_store_t* store, const pcp_store_falkordb_options_t* options,
    pcp_store_graph_backend_t** out_backend);

// "sqlite" or "falkordb".
const char* pcp_store_graph_backend_name(
    const pcp_store_graph_backend_t* backend);

// As pcp_store_graph_mutation_apply (store.h): idempotent by mutation_id,
// INVALID_ARGUMENT for a bad payload, NOT_FOUND for deleting what does not
// exist; FalkorDB adds UNAVAILABLE (see the write order above).
PCP_MUST_USE_RESULT pcp_status_t pcp_store_graph_backend_mutation_apply(
    pcp_store_graph_backend_t* backend, const pcp_store_mutation_t* mutation,
    int64_t* out_sequence_no, bool* out_duplicate);

// As pcp_store_graph_query (filters, ordering, limits).
PCP_MUST_USE_RESULT pcp_status_t pcp_store_graph_backend_query(
    pcp_store_graph_backend_t* backend, const pcp_store_graph_query_t* query,
    pcp_store_graph_result_t* out_result);

// NOT_FOUND for unknown ids (and FalkorDB stubs).
PCP_MUST_USE_RESULT pcp_status_t pcp_store_graph_backend_entity_get(
    pcp_store_graph_backend_t* backend, const char* entity_id,
    pcp_store_graph_entity_t* out_entity);

// As pcp_store_graph_neighbors_list.
PCP_MUST_USE_RESULT pcp_status_t pcp_store_graph_backend_neighbors_list(
    pcp_store_graph_backend_t* backend, const char* entity_id,
    const char* relation_type, pcp_store_graph_direction_t direction,
    uint32_t limit, pcp_store_graph_result_t* out_result);

PCP_MUST_USE_RESULT pcp_status_t pcp_store_graph_backend_counts_query(
    pcp_store_graph_backend_t* backend, pcp_store_graph_counts_t* out_counts);

// Closes the connection (if any) and frees the backend. NULL-safe.
void pcp_store_graph_backend_close(pcp_store_graph_backend_t* backend);

#endif  // PCP_STORE_GRAPH_BACKEND_H_
