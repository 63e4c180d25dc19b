// SPDX-License-Identifier: Apache-2.0
//
// Private helpers of the topology core (complex.c, subdivision.c,
// homology.c, topology_cli.c). Never included outside src/topology.

#ifndef PCP_TOPOLOGY_CORE_IMPL_H_
#define PCP_TOPOLOGY_CORE_IMPL_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "topology/complex_impl.h"

// murmur3 fmix64 finaliser: cheap avalanche for the stable hashes.
static inline uint64_t pcp_topology_core_mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

// Open-addressing table of uint32 values keyed by caller-computed hashes;
// equality is decided by the caller through |eq|. Values are stored +1 so
// zero marks an empty slot. Linear probing, power-of-two capacity, grown at
// 50% load. No removal (the users only ever grow their sets).
typedef struct pcp_topology_index_table_t {
  pcp_allocator_t allocator;
  uint32_t* slots;
  uint64_t* hashes;
  size_t capacity;  // 0 or a power of two
  size_t used;
} pcp_topology_index_table_t;

typedef bool (*pcp_topology_index_eq_fn_t)(const void* context, uint32_t value,
                                           const void* key);

void pcp_topology_index_table_initialize(pcp_allocator_t allocator,
                                         pcp_topology_index_table_t* table);
void pcp_topology_index_table_deinitialize(pcp_topology_index_table_t* table);
void pcp_topology_index_table_clear(pcp_topology_index_table_t* table);
// Finds a value whose key equals |key|; false when absent.
bool pcp_topology_index_table_find(const pcp_topology_index_table_t* table,
                                   uint64_t hash, pcp_topology_index_eq_fn_t eq,
                                   const void* context, const void* key,
                                   uint32_t* out_value);
// Inserts |value| without checking for an equal key (callers find first).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_index_table_insert(
    pcp_topology_index_table_t* table, uint64_t hash, uint32_t value);

// Grows |*inout_items| (|element_size| bytes each) to hold |needed| items.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_grow(pcp_allocator_t allocator,
                                                   size_t element_size,
                                                   size_t needed,
                                                   void** inout_items,
                                                   size_t* inout_capacity);

// Appends |simplex| sorted and deduplicated (no chromatic check): the shared
// path of faces(), skeletons and every derived complex. |out_added| may be
// NULL.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_complex_insert_sorted(
    pcp_topology_complex_t* complex, const pcp_topology_vertex_t* vertices,
    uint32_t count, bool* out_added);

// Faces of |simplex| in upstream mask order, each sorted, passed to |fn|.
// |scratch| must hold simplex.count vertices.
typedef pcp_status_t (*pcp_topology_face_fn_t)(
    void* context, const pcp_topology_vertex_t* face, uint32_t count);
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_simplex_for_each_face(
    pcp_topology_simplex_t simplex, pcp_topology_face_fn_t fn, void* context);

// Vertex interning for the numeric algorithms: the sorted distinct vertices
// of a complex and a lookup from vertex to its index.
typedef struct pcp_topology_vertex_index_t {
  pcp_topology_vertex_list_t vertices;  // sorted, distinct
  pcp_topology_index_table_t table;
} pcp_topology_vertex_index_t;

PCP_MUST_USE_RESULT pcp_status_t pcp_topology_vertex_index_initialize(
    const pcp_topology_complex_t* complex, pcp_allocator_t allocator,
    pcp_topology_vertex_index_t* out_index);
void pcp_topology_vertex_index_deinitialize(pcp_topology_vertex_index_t* index);
bool pcp_topology_vertex_index_find(const pcp_topology_vertex_index_t* index,
                                    const pcp_topology_vertex_t* vertex,
                                    uint32_t* out_id);

// "{v, w}" of a simplex into a fixed buffer, truncated; for error messages.
const char* pcp_topology_simplex_cstr(pcp_topology_simplex_t simplex,
                                      char* buffer, size_t capacity);
const char* pcp_topology_vertex_cstr(const pcp_topology_vertex_t* vertex,
                                     char* buffer, size_t capacity);

#endif  // PCP_TOPOLOGY_CORE_IMPL_H_
