// SPDX-License-Identifier: Apache-2.0
//
// Private: the finite encoding of a decision problem shared by the native
// search, the SMT-LIB writer and the Z3 driver, so that all three number
// variables, candidates and constraints identically (variable x_i_j is
// protocol vertex i -> candidate j in every backend).

#ifndef PCP_TOPOLOGY_SOLVER_IMPL_H_
#define PCP_TOPOLOGY_SOLVER_IMPL_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "topology/protocols_impl.h"

// Bound on forbidden-tuple clauses the SMT writer emits and on constraints
// the encoding keeps, so that no model can make the solver input unbounded.
#define PCP_TOPOLOGY_MAX_ENCODING_CONSTRAINTS (1u << 20)
#define PCP_TOPOLOGY_MAX_SMT_CLAUSES (1u << 22)

// A constraint: once every listed source is assigned, the mapped tuple must
// lie in |target| (O for faces of P; Delta(s) for faces of Xi(s)).
typedef struct pcp_topology_constraint_t {
  uint32_t first;  // offset into encoding.constraint_sources
  uint32_t count;  // number of sources (face size)
  const pcp_topology_complex_t* target;  // borrowed
} pcp_topology_constraint_t;

typedef struct pcp_topology_encoding_t {
  pcp_allocator_t allocator;
  pcp_topology_vertex_list_t sources;  // sorted vertices of P
  pcp_topology_vertex_list_t outputs;  // sorted vertices of O
  // Candidates of source i: candidate_indices[candidate_first[i] ..
  // candidate_first[i+1]) index |outputs|.
  uint32_t* candidate_first;
  uint32_t* candidate_indices;
  pcp_topology_constraint_t* constraints;
  size_t constraint_count;
  size_t constraint_capacity;
  uint32_t* constraint_sources;
  size_t constraint_source_count;
  size_t constraint_source_capacity;
  // Per-source lists of constraint ids (for incremental pruning).
  uint32_t* source_constraint_first;
  uint32_t* source_constraint_ids;
  // Owned complexes the constraints point into (faces of P).
  pcp_topology_complex_t* protocol_faces;
} pcp_topology_encoding_t;

PCP_MUST_USE_RESULT pcp_status_t pcp_topology_encoding_initialize(
    const pcp_topology_decision_problem_t* problem, pcp_allocator_t allocator,
    pcp_topology_encoding_t* out_encoding);
void pcp_topology_encoding_deinitialize(pcp_topology_encoding_t* encoding);

static inline uint32_t pcp_topology_encoding_candidate_count(
    const pcp_topology_encoding_t* encoding, size_t source) {
  return encoding->candidate_first[source + 1] -
         encoding->candidate_first[source];
}

// True when every constraint whose sources are all assigned holds.
// |assignment[i]| is an index into |outputs| or UINT32_MAX when unassigned.
// Checks only the constraints of |source| when |source| != SIZE_MAX.
bool pcp_topology_encoding_consistent(const pcp_topology_encoding_t* encoding,
                                      const uint32_t* assignment,
                                      size_t source);

// Builds the P -> O vertex map of a complete |assignment| (indices into
// |outputs|).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_encoding_build_map(
    const pcp_topology_encoding_t* encoding,
    const pcp_topology_decision_problem_t* problem, const uint32_t* assignment,
    pcp_allocator_t allocator, pcp_topology_vertex_map_t** out_map);

// Frees solutions and core names and clears the verdict fields.
void pcp_topology_search_result_reset(pcp_topology_search_result_t* result);

// Fills |result|'s unsat core and reason the native way (reference s.2.3).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_encoding_unsat_core(
    const pcp_topology_encoding_t* encoding,
    pcp_topology_search_options_t options, bool limit_exceeded,
    pcp_topology_search_result_t* result);

// Which sources each named assertion c_K mentions, so that an imported
// unsat core maps back to protocol vertices.
typedef struct pcp_topology_smt_assertions_t {
  pcp_allocator_t allocator;
  size_t count;  // assertions
  size_t capacity;
  uint32_t* first;  // count + 1 offsets into |sources|
  uint32_t* sources;
  size_t source_count;
  size_t source_capacity;
} pcp_topology_smt_assertions_t;

void pcp_topology_smt_assertions_initialize(
    pcp_allocator_t allocator, pcp_topology_smt_assertions_t* out_assertions);
void pcp_topology_smt_assertions_deinitialize(
    pcp_topology_smt_assertions_t* assertions);

// Writes the SMT-LIB text of |encoding|; records each assertion's sources
// into |assertions| when not NULL.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_smtlib_write_encoding(
    const pcp_topology_encoding_t* encoding,
    pcp_topology_smtlib_options_t options, pcp_string_builder_t* builder,
    pcp_topology_smt_assertions_t* assertions);

// Tokens of a solver answer: split on whitespace and parentheses.
// Calls |fn| for each token; stops early when it returns false.
void pcp_topology_solver_tokens_for_each(pcp_string_view_t text,
                                         bool (*fn)(void* user_data,
                                                    pcp_string_view_t token),
                                         void* user_data);

#endif  // PCP_TOPOLOGY_SOLVER_IMPL_H_
