// SPDX-License-Identifier: Apache-2.0
//
// topology: a bounded simulator for the coordination protocols, in the
// vocabulary of combinatorial topology (Herlihy, Kozlov, Rajsbaum,
// "Distributed Computing Through Combinatorial Topology").
//
// A protocol problem is three chromatic simplicial complexes and three maps:
// the input complex I, the protocol complex P (what the processes may have
// seen), the output complex O; the execution carrier Xi: I -> 2^P, the task
// carrier Delta: I -> 2^O and a decision map delta: P -> O. The protocol
// solves the task when delta o Xi(s) lies in Delta(s) for every input face s
// and processes that share a local view decide the same.
//
// This public header is what other modules, main.c and bench/ use: the
// `pcp topo` entry point and the small core a caller needs to build a
// complex, subdivide it and read its Betti numbers. Everything else lives in
// two private headers inside src/topology (never included outside it):
//   - complex_impl.h: errors, the full core (colours, labels, vertices,
//     simplices, complexes, subcomplexes, vertex maps, carrier maps and the
//     carried decision-map checks; subdivisions and their protocol-power
//     validator; homology over GF(p); DOT export).
//   - protocols_impl.h: solving and protocols (decision-map search, SMT-LIB
//     and Z3, protocol complexes, traces and the two-node simulator, models,
//     obstructions, coverage, composition, exploration, the merge oracle).
//
// Errors: every fallible function returns a pcp_status_t. Topology-specific
// failures carry the upstream error name at the front of the message
// ("NonSimplicialMap: ..."); complex_impl.h recovers it as an enum.
//
// Ownership: complexes and subdivisions are heap objects (_create /
// _release) that own their storage. Vertex *symbols* (label text) are
// borrowed: the bytes must outlive every vertex that points at them.
//
// Thread-safety: all objects are thread-compatible; distinct objects may be
// used from different threads. Read-only functions on a complex build small
// lazy indexes internally, so even const use of one complex must stay on one
// thread at a time.

#ifndef PCP_TOPOLOGY_TOPOLOGY_H_
#define PCP_TOPOLOGY_TOPOLOGY_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Vertices and simplices
//===----------------------------------------------------------------------===//

// Colour tags in rank order; the rank is the first sort key, so the numbers
// can never change.
typedef enum pcp_topology_color_kind_e {
  PCP_TOPOLOGY_COLOR_HUB = 0,
  PCP_TOPOLOGY_COLOR_GATEWAY = 1,
  PCP_TOPOLOGY_COLOR_WORKER = 2,
  PCP_TOPOLOGY_COLOR_API_CALLER = 3,
  PCP_TOPOLOGY_COLOR_JOB = 4,
  PCP_TOPOLOGY_COLOR_SESSION = 5,
  PCP_TOPOLOGY_COLOR_PROCESS = 6,
  PCP_TOPOLOGY_COLOR_KIND_COUNT_ = 7,
} pcp_topology_color_kind_t;

// A process identity. Equal when kind and number are equal; ordered by
// (kind rank, number).
typedef struct pcp_topology_color_t {
  uint32_t kind;    // pcp_topology_color_kind_t
  uint32_t number;  // u16 for most kinds upstream, u32 for job and session
} pcp_topology_color_t;

typedef enum pcp_topology_label_kind_e {
  PCP_TOPOLOGY_LABEL_EMPTY = 0,
  PCP_TOPOLOGY_LABEL_INPUT = 1,
  PCP_TOPOLOGY_LABEL_PROTOCOL = 2,
  PCP_TOPOLOGY_LABEL_OUTPUT = 3,
  PCP_TOPOLOGY_LABEL_SYMBOL = 4,
  PCP_TOPOLOGY_LABEL_KIND_COUNT_ = 5,
} pcp_topology_label_kind_t;

// A local value or view. Ordered by (kind rank, value); symbols compare as
// bytes (memcmp, a prefix sorts first). |symbol| is borrowed and
// NUL-terminated; only SYMBOL labels use it (NULL otherwise), only the other
// kinds use |value| (0 for SYMBOL and EMPTY).
typedef struct pcp_topology_label_t {
  uint32_t kind;  // pcp_topology_label_kind_t
  int64_t value;
  const char* symbol;
} pcp_topology_label_t;

// A process together with its local state. Ordered by colour, then label.
typedef struct pcp_topology_vertex_t {
  pcp_topology_color_t color;
  pcp_topology_label_t label;
} pcp_topology_vertex_t;

static inline pcp_topology_color_t pcp_topology_make_color(
    pcp_topology_color_kind_t kind, uint32_t number) {
  pcp_topology_color_t color = {(uint32_t)kind, number};
  return color;
}
static inline pcp_topology_label_t pcp_topology_make_label(
    pcp_topology_label_kind_t kind, int64_t value) {
  pcp_topology_label_t label = {(uint32_t)kind, value, NULL};
  return label;
}
static inline pcp_topology_label_t pcp_topology_make_symbol(
    const char* symbol) {
  pcp_topology_label_t label = {PCP_TOPOLOGY_LABEL_SYMBOL, 0, symbol};
  return label;
}
static inline pcp_topology_vertex_t pcp_topology_make_vertex(
    pcp_topology_color_t color, pcp_topology_label_t label) {
  pcp_topology_vertex_t vertex = {color, label};
  return vertex;
}

// Total order (<0, 0, >0): colour, then label.
int pcp_topology_vertex_compare(const pcp_topology_vertex_t* a,
                                const pcp_topology_vertex_t* b);

// A growable vertex array (results of vertices(), paths, mapped simplices).
// Caller-embedded; owns |items|.
typedef struct pcp_topology_vertex_list_t {
  pcp_allocator_t allocator;
  pcp_topology_vertex_t* items;
  size_t count;
  size_t capacity;
} pcp_topology_vertex_list_t;

void pcp_topology_vertex_list_initialize(pcp_allocator_t allocator,
                                         pcp_topology_vertex_list_t* out_list);
void pcp_topology_vertex_list_deinitialize(pcp_topology_vertex_list_t* list);

// A simplex is a borrowed, unordered view of vertices. The empty simplex
// (count 0) is legal and has dimension -1. The chromatic property (no two
// vertices of one colour) is enforced by validation, not by construction.
typedef struct pcp_topology_simplex_t {
  const pcp_topology_vertex_t* vertices;
  uint32_t count;
} pcp_topology_simplex_t;

static inline pcp_topology_simplex_t pcp_topology_make_simplex(
    const pcp_topology_vertex_t* vertices, size_t count) {
  pcp_topology_simplex_t simplex = {vertices, (uint32_t)count};
  return simplex;
}

//===----------------------------------------------------------------------===//
// Complexes
//===----------------------------------------------------------------------===//

// A finite list of "maximal or named" simplices. Membership is by closure:
// a simplex belongs when some listed simplex contains it, so the empty
// simplex belongs to every non-empty complex and to no empty one.
typedef struct pcp_topology_complex_t pcp_topology_complex_t;

PCP_MUST_USE_RESULT pcp_status_t pcp_topology_complex_create(
    pcp_allocator_t allocator, pcp_topology_complex_t** out_complex);
void pcp_topology_complex_release(pcp_topology_complex_t* complex);

// Appends a copy of |simplex| in its given vertex order, with no validation
// and no deduplication (a literal upstream Complex{...}; validate() reports
// problems). COMPLEX_TOO_LARGE past the cap.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_complex_append(
    pcp_topology_complex_t* complex, pcp_topology_simplex_t simplex);
// Builder semantics: validates the chromatic property, drops a duplicate
// (|out_added| false; may be NULL) and stores a sorted copy.
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_complex_add(pcp_topology_complex_t* complex,
                         pcp_topology_simplex_t simplex, bool* out_added);

// Number of listed simplices and the i-th one. The view borrows the
// complex's storage: valid until the complex is next modified.
size_t pcp_topology_complex_count(const pcp_topology_complex_t* complex);
pcp_topology_simplex_t pcp_topology_complex_simplex(
    const pcp_topology_complex_t* complex, size_t index);

// Largest listed dimension, -1 when nothing is listed.
int32_t pcp_topology_complex_dimension(const pcp_topology_complex_t* complex);

// Deduplicated, sorted vertices (cleared first).
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_complex_vertices(const pcp_topology_complex_t* complex,
                              pcp_topology_vertex_list_t* out_vertices);

//===----------------------------------------------------------------------===//
// Subdivisions
//===----------------------------------------------------------------------===//

typedef enum pcp_topology_subdivision_kind_e {
  PCP_TOPOLOGY_SUBDIVISION_IDENTITY = 0,
  PCP_TOPOLOGY_SUBDIVISION_BARYCENTRIC = 1,
  PCP_TOPOLOGY_SUBDIVISION_CHROMATIC = 2,
} pcp_topology_subdivision_kind_t;

// A subdivided complex, its carrier (input face -> subdivided faces) and
// per-vertex metadata (last round only). Borrows the input complex.
typedef struct pcp_topology_subdivision_t pcp_topology_subdivision_t;

// |rounds| 0 or kind IDENTITY gives the identity subdivision. Labels of new
// vertices are protocol(ordinal); barycentric colours are process(dim f).
// COMPLEX_TOO_LARGE when a round would exceed the complex cap.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_subdivision_create(
    const pcp_topology_complex_t* input, pcp_topology_subdivision_kind_t kind,
    uint32_t rounds, pcp_allocator_t allocator,
    pcp_topology_subdivision_t** out_subdivision);
void pcp_topology_subdivision_release(pcp_topology_subdivision_t* subdivision);

// The subdivided complex (borrowed from the subdivision).
const pcp_topology_complex_t* pcp_topology_subdivision_complex(
    const pcp_topology_subdivision_t* subdivision);

//===----------------------------------------------------------------------===//
// Homology over GF(p)
//===----------------------------------------------------------------------===//

// Betti vectors have one entry per dimension 0..dim (unreduced: b0 counts
// components). Face enumeration bounds the dimension.
#define PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION 63

typedef struct pcp_topology_betti_t {
  uint32_t count;  // dimension + 1; 0 for the empty complex
  uint64_t values[PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION + 1];
} pcp_topology_betti_t;

// Betti numbers over GF(|prime|) by sparse elimination of the boundary
// matrices, any dimension.
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_complex_betti(const pcp_topology_complex_t* complex,
                           uint32_t prime, pcp_topology_betti_t* out_betti);

//===----------------------------------------------------------------------===//
// CLI
//===----------------------------------------------------------------------===//

// `pcp topo <subcommand> ...` with argv[0] = "topo". Subcommands come from one
// table in topology_cli.c. Exit codes: 0 success, 1 a negative verdict, 2 a
// usage or input error.
int pcp_topology_cli_main(int argc, char** argv);

#ifdef __cplusplus
}
#endif

#endif  // PCP_TOPOLOGY_TOPOLOGY_H_
