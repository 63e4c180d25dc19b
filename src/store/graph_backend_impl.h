// SPDX-License-Identifier: Apache-2.0
//
// The graph backend vtable shared by graph_backend.c (dispatch, SQLite) and
// graph_falkordb.c. Never included outside src/store.

#ifndef PCP_STORE_GRAPH_BACKEND_IMPL_H_
#define PCP_STORE_GRAPH_BACKEND_IMPL_H_

#include "store/graph_backend.h"
#include "store/store_impl.h"

typedef struct pcp_store_graph_backend_vtable_t {
  const char* name;
  pcp_status_t (*mutation_apply)(pcp_store_graph_backend_t* backend,
                                 const pcp_store_mutation_t* mutation,
                                 int64_t* out_sequence_no, bool* out_duplicate);
  pcp_status_t (*query)(pcp_store_graph_backend_t* backend,
                        const pcp_store_graph_query_t* query,
                        pcp_store_graph_result_t* out_result);
  pcp_status_t (*entity_get)(pcp_store_graph_backend_t* backend,
                             const char* entity_id,
                             pcp_store_graph_entity_t* out_entity);
  pcp_status_t (*neighbors_list)(pcp_store_graph_backend_t* backend,
                                 const char* entity_id,
                                 const char* relation_type,
                                 pcp_store_graph_direction_t direction,
                                 uint32_t limit,
                                 pcp_store_graph_result_t* out_result);
  pcp_status_t (*counts_query)(pcp_store_graph_backend_t* backend,
                               pcp_store_graph_counts_t* out_counts);
  void (*close)(pcp_store_graph_backend_t* backend);
} pcp_store_graph_backend_vtable_t;

// The first member of every implementation's state.
struct pcp_store_graph_backend_t {
  const pcp_store_graph_backend_vtable_t* vtable;
  pcp_store_t* store;  // the mutation log (and the SQLite graph)
};

#endif  // PCP_STORE_GRAPH_BACKEND_IMPL_H_
