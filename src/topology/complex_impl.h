// SPDX-License-Identifier: Apache-2.0
//
// The topology core, private to src/topology (never included outside it;
// the public subset is topology/topology.h): errors, colours, labels,
// vertices, simplices, complexes, subcomplexes, vertex maps, carrier maps and
// the carried decision-map checks; subdivisions (barycentric, standard
// chromatic, iterated) and their protocol-power validator; homology over
// GF(p) (connectivity, Betti numbers by sparse elimination, induced maps,
// cycle witnesses, the fundamental-group diagnostic); DOT export.
//
// Ordering is part of the contract. faces() enumerates each listed simplex by
// bitmask over its *stored* vertex order (empty face first) and keeps the
// first occurrence of every face; every "first face" choice downstream
// (witnesses, ordinals of subdivision vertices, SMT variable numbers) depends
// on it, exactly as in the upstream Zig code.
//
// Errors: topology-specific failures carry the upstream error name at the
// front of the message ("NonSimplicialMap: ...") and
// pcp_topology_status_error() recovers it as a pcp_topology_error_t, so tests
// can assert on the precise failure.
//
// Ownership: vertex maps and carrier maps are heap objects (_create /
// _release) like complexes and subdivisions. Maps borrow their domain and
// codomain complexes, which must outlive the map.

#ifndef PCP_TOPOLOGY_COMPLEX_IMPL_H_
#define PCP_TOPOLOGY_COMPLEX_IMPL_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "topology/topology.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

// X(ENUM_SUFFIX, UpstreamName, PCP_STATUS_CODE). The upstream names appear in
// messages and in the enum so tests can check the exact failure. Append new
// entries at the end of the list that owns them; the numbers are not stored
// anywhere, but keep them stable anyway so logs stay comparable.
#define PCP_TOPOLOGY_ERROR_LIST(X)                                             \
  /* Core: data model. */                                                      \
  X(DUPLICATE_COLOR, DuplicateColor, INVALID_ARGUMENT)                         \
  X(DUPLICATE_SIMPLEX, DuplicateSimplex, INVALID_ARGUMENT)                     \
  X(DUPLICATE_INTERNED_VERTEX, DuplicateInternedVertex, INVALID_ARGUMENT)      \
  X(SIMPLEX_TOO_LARGE_FOR_FACE_ENUMERATION, SimplexTooLargeForFaceEnumeration, \
    OUT_OF_RANGE)                                                              \
  X(COMPLEX_TOO_LARGE, ComplexTooLarge, RESOURCE_EXHAUSTED)                    \
  X(SUBCOMPLEX_OUTSIDE_PARENT, SubcomplexOutsideParent, INVALID_ARGUMENT)      \
  X(SUBCOMPLEX_IMAGE_OUTSIDE_TARGET, SubcomplexImageOutsideTarget,             \
    INVALID_ARGUMENT)                                                          \
  X(PARENT_COMPLEX_MISMATCH, ParentComplexMismatch, INVALID_ARGUMENT)          \
  X(COMPLEX_MISMATCH, ComplexMismatch, INVALID_ARGUMENT)                       \
  /* Core: vertex maps. */                                                     \
  X(SOURCE_VERTEX_OUTSIDE_DOMAIN, SourceVertexOutsideDomain, INVALID_ARGUMENT) \
  X(DUPLICATE_VERTEX_MAP_SOURCE, DuplicateVertexMapSource, INVALID_ARGUMENT)   \
  X(TARGET_VERTEX_OUTSIDE_CODOMAIN, TargetVertexOutsideCodomain,               \
    INVALID_ARGUMENT)                                                          \
  X(NON_COLOR_PRESERVING_MAP, NonColorPreservingMap, INVALID_ARGUMENT)         \
  X(MISSING_VERTEX_MAP_ENTRY, MissingVertexMapEntry, INVALID_ARGUMENT)         \
  X(NON_SIMPLICIAL_MAP, NonSimplicialMap, INVALID_ARGUMENT)                    \
  X(NON_RIGID_MAP, NonRigidMap, INVALID_ARGUMENT)                              \
  /* Core: carrier maps (simplex API). */                                      \
  X(CARRIER_SIMPLEX_OUTSIDE_DOMAIN, CarrierSimplexOutsideDomain,               \
    INVALID_ARGUMENT)                                                          \
  X(DUPLICATE_CARRIER_SIMPLEX, DuplicateCarrierSimplex, INVALID_ARGUMENT)      \
  X(MISSING_CARRIER_SIMPLEX, MissingCarrierSimplex, INVALID_ARGUMENT)          \
  X(NON_MONOTONIC_CARRIER, NonMonotonicCarrier, INVALID_ARGUMENT)              \
  X(NON_STRICT_CARRIER, NonStrictCarrier, INVALID_ARGUMENT)                    \
  X(NON_RIGID_CARRIER, NonRigidCarrier, INVALID_ARGUMENT)                      \
  X(NON_CHROMATIC_CARRIER, NonChromaticCarrier, INVALID_ARGUMENT)              \
  /* Core: decision maps and the index API. */                                 \
  X(DECISION_OUTSIDE_CARRIER, DecisionOutsideCarrier, INVALID_ARGUMENT)        \
  X(SHARED_VIEW_MISSING_OUTPUT_VERTEX, SharedViewMissingOutputVertex,          \
    INVALID_ARGUMENT)                                                          \
  X(INCOMPATIBLE_DECISION_ON_SHARED_VIEW, IncompatibleDecisionOnSharedView,    \
    INVALID_ARGUMENT)                                                          \
  X(MISSING_CARRIER_EDGE, MissingCarrierEdge, INVALID_ARGUMENT)                \
  X(DUPLICATE_CARRIER_EDGE, DuplicateCarrierEdge, INVALID_ARGUMENT)            \
  X(INPUT_INDEX_OUT_OF_RANGE, InputIndexOutOfRange, INVALID_ARGUMENT)          \
  X(OUTPUT_INDEX_OUT_OF_RANGE, OutputIndexOutOfRange, INVALID_ARGUMENT)        \
  X(MISSING_EXECUTION_EDGE, MissingExecutionEdge, INVALID_ARGUMENT)            \
  X(DUPLICATE_EXECUTION_EDGE, DuplicateExecutionEdge, INVALID_ARGUMENT)        \
  X(EMPTY_EXECUTION_CARRIER, EmptyExecutionCarrier, INVALID_ARGUMENT)          \
  X(PROTOCOL_INDEX_OUT_OF_RANGE, ProtocolIndexOutOfRange, INVALID_ARGUMENT)    \
  X(NON_MONOTONIC_EXECUTION_CARRIER, NonMonotonicExecutionCarrier,             \
    INVALID_ARGUMENT)                                                          \
  X(MISSING_DECISION, MissingDecision, INVALID_ARGUMENT)                       \
  X(DUPLICATE_DECISION, DuplicateDecision, INVALID_ARGUMENT)                   \
  X(PROTOCOL_OUTSIDE_EXECUTION_CARRIER, ProtocolOutsideExecutionCarrier,       \
    INVALID_ARGUMENT)                                                          \
  X(MISSING_EXECUTION_OBSERVATION, MissingExecutionObservation,                \
    INVALID_ARGUMENT)                                                          \
  /* Core: subdivisions. */                                                    \
  X(SUBDIVISION_METADATA_MISMATCH, SubdivisionMetadataMismatch,                \
    INVALID_ARGUMENT)                                                          \
  X(SUBDIVISION_SIMPLEX_MISMATCH, SubdivisionSimplexMismatch,                  \
    INVALID_ARGUMENT)                                                          \
  X(SUBDIVISION_CARRIER_MISMATCH, SubdivisionCarrierMismatch,                  \
    INVALID_ARGUMENT)                                                          \
  X(SUBDIVISION_FACE_RESTRICTION_MISMATCH, SubdivisionFaceRestrictionMismatch, \
    INVALID_ARGUMENT)                                                          \
  X(SUBDIVISION_BOUNDARY_MISMATCH, SubdivisionBoundaryMismatch,                \
    INVALID_ARGUMENT)                                                          \
  X(SUBDIVISION_LINK_MISMATCH, SubdivisionLinkMismatch, INVALID_ARGUMENT)      \
  X(SUBDIVISION_EQUIVALENCE_MISMATCH, SubdivisionEquivalenceMismatch,          \
    INVALID_ARGUMENT)                                                          \
  /* Core: homology. */                                                        \
  X(INVALID_FIELD_PRIME, InvalidFieldPrime, INVALID_ARGUMENT)                  \
  X(SOURCE_VERTEX_OUTSIDE_COMPLEX, SourceVertexOutsideComplex,                 \
    INVALID_ARGUMENT)                                                          \
  X(TARGET_VERTEX_OUTSIDE_COMPLEX, TargetVertexOutsideComplex,                 \
    INVALID_ARGUMENT)                                                          \
  X(NO_PATH, NoPath, NOT_FOUND)                                                \
  X(COMPLEX_DIMENSION_TOO_HIGH, ComplexDimensionTooHigh, INVALID_ARGUMENT)     \
  /* Solving and protocols: append below this line. */                         \
  X(UNCOVERED_TASK_FACE, UncoveredTaskFace, INVALID_ARGUMENT)                  \
  X(OUTPUT_FACET_MISSING_COLOR, OutputFacetMissingColor, INVALID_ARGUMENT)     \
  X(TASK_OUTPUT_PROJECTION_OUTSIDE_OUTPUT_COMPLEX,                             \
    TaskOutputProjectionOutsideOutputComplex, INVALID_ARGUMENT)                \
  X(UNCOVERED_EXTRACTED_INPUT_FACE, UncoveredExtractedInputFace,               \
    INVALID_ARGUMENT)                                                          \
  X(PROTOCOL_FACET_MISSING_COLOR, ProtocolFacetMissingColor, INVALID_ARGUMENT) \
  X(MISSING_DECISION_TARGET, MissingDecisionTarget, INVALID_ARGUMENT)          \
  X(PROTOCOL_SIMPLEX_MISSING_TRACE_WITNESS,                                    \
    ProtocolSimplexMissingTraceWitness, INVALID_ARGUMENT)                      \
  X(EXTRACTION_EVENT_BOUND_EXCEEDED, ExtractionEventBoundExceeded,             \
    RESOURCE_EXHAUSTED)                                                        \
  X(EXTRACTION_EVIDENCE_MISMATCH, ExtractionEvidenceMismatch,                  \
    INVALID_ARGUMENT)                                                          \
  X(VERTEX_REF_NOT_FOUND, VertexRefNotFound, NOT_FOUND)                        \
  X(EMPTY_COMPOSITION, EmptyComposition, INVALID_ARGUMENT)                     \
  X(REFINEMENT_DOMAIN_MISMATCH, RefinementDomainMismatch, INVALID_ARGUMENT)    \
  X(REFINEMENT_CODOMAIN_MISMATCH, RefinementCodomainMismatch,                  \
    INVALID_ARGUMENT)                                                          \
  X(DETAILED_CARRIER_ESCAPES_ABSTRACT_TASK,                                    \
    DetailedCarrierEscapesAbstractTask, INVALID_ARGUMENT)                      \
  X(UNCOVERED_ABSTRACT_WORKFLOW_FACE, UncoveredAbstractWorkflowFace,           \
    INVALID_ARGUMENT)                                                          \
  X(MISSING_TASK_COVERAGE_PATHS, MissingTaskCoveragePaths, INVALID_ARGUMENT)   \
  X(UNEXPECTED_DESIGN_ONLY_TASK, UnexpectedDesignOnlyTask, INVALID_ARGUMENT)   \
  X(STALE_TASK_COVERAGE_PATH, StaleTaskCoveragePath, INVALID_ARGUMENT)         \
  X(TASK_COVERAGE_PATH_UNMAPPED, TaskCoveragePathUnmapped, INVALID_ARGUMENT)   \
  X(TASK_COVERAGE_PATH_MISMATCH, TaskCoveragePathMismatch, INVALID_ARGUMENT)   \
  X(TASK_COVERAGE_DESIGN_ONLY_MISMATCH, TaskCoverageDesignOnlyMismatch,        \
    INVALID_ARGUMENT)                                                          \
  X(DUPLICATE_COVERAGE_PATH, DuplicateCoveragePath, INVALID_ARGUMENT)          \
  X(UNCOVERED_IMPLEMENTED_PRODUCTION_PATH, UncoveredImplementedProductionPath, \
    INVALID_ARGUMENT)                                                          \
  X(INVALID_WORKER_COUNT, InvalidWorkerCount, INVALID_ARGUMENT)                \
  X(INVALID_QUORUM, InvalidQuorum, INVALID_ARGUMENT)                           \
  X(INVALID_FRAGMENT_INDEX, InvalidFragmentIndex, INVALID_ARGUMENT)            \
  X(INVALID_FRAGMENT_COUNT, InvalidFragmentCount, INVALID_ARGUMENT)

typedef enum pcp_topology_error_e {
  PCP_TOPOLOGY_ERROR_NONE = 0,
#define PCP_TOPOLOGY_ERROR_ENUM_(suffix, name, code) \
  PCP_TOPOLOGY_ERROR_##suffix,
  PCP_TOPOLOGY_ERROR_LIST(PCP_TOPOLOGY_ERROR_ENUM_)
#undef PCP_TOPOLOGY_ERROR_ENUM_
      PCP_TOPOLOGY_ERROR_COUNT_,
} pcp_topology_error_t;

// Upstream name ("DuplicateColor"); "None" for NONE, "?" out of range.
const char* pcp_topology_error_name(pcp_topology_error_t error);

// Canonical status code an error is reported with.
pcp_status_code_t pcp_topology_error_code(pcp_topology_error_t error);

// Makes a status whose message is "<UpstreamName>: <formatted details>".
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_status_allocate_f(
    pcp_topology_error_t error, const char* file, int line, const char* fmt,
    ...) PCP_PRINTF_ATTR(4, 5);
#define pcp_topology_make_status(error, ...) \
  pcp_topology_status_allocate_f((error), __FILE__, __LINE__, __VA_ARGS__)

// Recovers the topology error from |status| (borrowed, not consumed) by its
// message prefix. NONE when OK or not a topology error. Needs status mode >= 1.
pcp_topology_error_t pcp_topology_status_error(pcp_status_t status);

//===----------------------------------------------------------------------===//
// Core: colours, labels, vertices
//===----------------------------------------------------------------------===//

// Total orders (<0, 0, >0) and equality.
int pcp_topology_color_compare(pcp_topology_color_t a, pcp_topology_color_t b);
bool pcp_topology_color_equal(pcp_topology_color_t a, pcp_topology_color_t b);
int pcp_topology_label_compare(const pcp_topology_label_t* a,
                               const pcp_topology_label_t* b);
bool pcp_topology_vertex_equal(const pcp_topology_vertex_t* a,
                               const pcp_topology_vertex_t* b);

// Stable 64-bit hashes (never change between builds or platforms: they feed
// report signatures). Upstream uses seeded Wyhash; only equality matters.
uint64_t pcp_topology_color_hash(pcp_topology_color_t color);
uint64_t pcp_topology_label_hash(const pcp_topology_label_t* label);
uint64_t pcp_topology_vertex_hash(const pcp_topology_vertex_t* vertex);

// Text forms: colour "worker.3", label "empty" | "input.N" | "protocol.N" |
// "output.N" | the symbol itself, vertex "<colour>:<label>".
const char* pcp_topology_color_kind_name(pcp_topology_color_kind_t kind);
bool pcp_topology_color_kind_parse(pcp_string_view_t name,
                                   pcp_topology_color_kind_t* out_kind);
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_color_format(
    pcp_topology_color_t color, pcp_string_builder_t* builder);
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_label_format(
    const pcp_topology_label_t* label, pcp_string_builder_t* builder);
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_vertex_format(
    const pcp_topology_vertex_t* vertex, pcp_string_builder_t* builder);

void pcp_topology_vertex_list_clear(pcp_topology_vertex_list_t* list);
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_vertex_list_append(
    pcp_topology_vertex_list_t* list, const pcp_topology_vertex_t* vertex);

// Interns (colour, label) pairs into a sorted list (upstream VertexRegistry).
// Quirk kept from upstream: the returned index is the vertex's *current*
// position, so an earlier index shifts when a smaller vertex is interned.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_vertex_registry_intern(
    pcp_topology_vertex_list_t* registry, const pcp_topology_vertex_t* vertex,
    size_t* out_index);
// DuplicateInternedVertex when two entries are equal.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_vertex_registry_validate(
    const pcp_topology_vertex_list_t* registry);

//===----------------------------------------------------------------------===//
// Core: simplices
//===----------------------------------------------------------------------===//

// Largest simplex (vertex count) faces() can enumerate: the bitmask is 64
// bits wide, as upstream (SimplexTooLargeForFaceEnumeration at n >= 64).
#define PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES 63u
// Largest complex any operation builds (listed simplices); beyond it
// COMPLEX_TOO_LARGE (RESOURCE_EXHAUSTED) instead of exhausting memory.
#define PCP_TOPOLOGY_MAX_COMPLEX_SIMPLICES (1u << 24)

// DuplicateColor naming both vertices when two share a colour.
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_simplex_validate(pcp_topology_simplex_t simplex);
static inline int32_t pcp_topology_simplex_dimension(
    pcp_topology_simplex_t simplex) {
  return (int32_t)simplex.count - 1;
}
bool pcp_topology_simplex_contains_vertex(pcp_topology_simplex_t simplex,
                                          const pcp_topology_vertex_t* vertex);
// Index of the vertex with |color|, or -1.
int32_t pcp_topology_simplex_vertex_with_color(pcp_topology_simplex_t simplex,
                                               pcp_topology_color_t color);
bool pcp_topology_simplex_is_subset(pcp_topology_simplex_t a,
                                    pcp_topology_simplex_t b);
bool pcp_topology_simplex_is_proper_subset(pcp_topology_simplex_t a,
                                           pcp_topology_simplex_t b);
// Same vertex set (order independent).
bool pcp_topology_simplex_equal(pcp_topology_simplex_t a,
                                pcp_topology_simplex_t b);
bool pcp_topology_simplex_disjoint(pcp_topology_simplex_t a,
                                   pcp_topology_simplex_t b);
// Order-independent stable hash (over the canonical order).
uint64_t pcp_topology_simplex_hash(pcp_topology_simplex_t simplex);
// Sorts |count| vertices in place into the canonical (vertex) order.
void pcp_topology_vertices_sort(pcp_topology_vertex_t* vertices, size_t count);
// Appends "{v, w}" in stored order ("{}" for the empty simplex).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_simplex_format(
    pcp_topology_simplex_t simplex, pcp_string_builder_t* builder);

//===----------------------------------------------------------------------===//
// Core: complexes
//===----------------------------------------------------------------------===//

pcp_allocator_t pcp_topology_complex_allocator(
    const pcp_topology_complex_t* complex);
// Removes every listed simplex (storage is kept for reuse).
void pcp_topology_complex_clear(pcp_topology_complex_t* complex);
// Replaces |out_complex|'s contents with a copy of |source| (same order).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_complex_copy(
    const pcp_topology_complex_t* source, pcp_topology_complex_t* out_complex);

// Adds every listed simplex of |source| with add().
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_complex_add_all(
    pcp_topology_complex_t* complex, const pcp_topology_complex_t* source);

// Membership by closure.
bool pcp_topology_complex_contains(const pcp_topology_complex_t* complex,
                                   pcp_topology_simplex_t simplex);
// Exact (set-equal) match among the listed simplices.
bool pcp_topology_complex_find(const pcp_topology_complex_t* complex,
                               pcp_topology_simplex_t simplex,
                               size_t* out_index);
// First listed superset.
bool pcp_topology_complex_find_containing(const pcp_topology_complex_t* complex,
                                          pcp_topology_simplex_t simplex,
                                          size_t* out_index);
// Every listed simplex of |a| lies in |b| by closure.
bool pcp_topology_complex_is_subcomplex(const pcp_topology_complex_t* a,
                                        const pcp_topology_complex_t* b);
// Same closure (each is a subcomplex of the other).
bool pcp_topology_complex_equal_by_closure(const pcp_topology_complex_t* a,
                                           const pcp_topology_complex_t* b);
// Same listed simplices index by index (upstream "same parent").
bool pcp_topology_complex_same_listing(const pcp_topology_complex_t* a,
                                       const pcp_topology_complex_t* b);

// Which rule validate() found broken, and where.
typedef enum pcp_topology_complex_problem_e {
  PCP_TOPOLOGY_COMPLEX_PROBLEM_NONE = 0,
  PCP_TOPOLOGY_COMPLEX_PROBLEM_DUPLICATE_COLOR = 1,
  PCP_TOPOLOGY_COMPLEX_PROBLEM_DUPLICATE_SIMPLEX = 2,
} pcp_topology_complex_problem_t;
typedef struct pcp_topology_complex_witness_t {
  pcp_topology_complex_problem_t problem;
  size_t index;        // offending listed simplex
  size_t other_index;  // the earlier equal simplex (DUPLICATE_SIMPLEX)
} pcp_topology_complex_witness_t;

// Every listed simplex is chromatic (DuplicateColor) and no two are equal
// (DuplicateSimplex). |out_witness| (may be NULL) is cleared first.
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_complex_validate(const pcp_topology_complex_t* complex,
                              pcp_topology_complex_witness_t* out_witness);

// All maximal listed simplices have the same dimension (true when empty).
bool pcp_topology_complex_is_pure(const pcp_topology_complex_t* complex);

// The operations below clear |out_complex| first and fill it; it must not be
// |complex| itself. Results list sorted copies of their simplices.

// Every face of every listed simplex, in the upstream order: listed simplices
// in order, bitmasks 0..2^n-1 over the stored vertex order (empty face
// first), first occurrence kept. SimplexTooLargeForFaceEnumeration at
// n > PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES (as upstream), and
// ComplexTooLarge above 24 vertices (2^24 faces from one simplex is past
// the complex cap anyway).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_complex_faces(
    const pcp_topology_complex_t* complex, pcp_topology_complex_t* out_complex);
// Faces of dimension <= k (faces order).
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_complex_skeleton(const pcp_topology_complex_t* complex, int32_t k,
                              pcp_topology_complex_t* out_complex);
// With top dimension d <= 0: empty. Otherwise the (d-1)-faces contained in
// exactly one listed d-simplex.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_complex_boundary(
    const pcp_topology_complex_t* complex, pcp_topology_complex_t* out_complex);
// Faces containing |center| (not closed).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_complex_star(
    const pcp_topology_complex_t* complex, pcp_topology_simplex_t center,
    pcp_topology_complex_t* out_complex);
// Closure of the star.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_complex_closed_star(
    const pcp_topology_complex_t* complex, pcp_topology_simplex_t center,
    pcp_topology_complex_t* out_complex);
// Faces disjoint from |center| whose union with it lies in the complex.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_complex_link(
    const pcp_topology_complex_t* complex, pcp_topology_simplex_t center,
    pcp_topology_complex_t* out_complex);
// All pairwise unions of faces; each union must be chromatic (DuplicateColor
// when the colour sets of |left| and |right| meet).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_complex_join(
    const pcp_topology_complex_t* left, const pcp_topology_complex_t* right,
    pcp_topology_complex_t* out_complex);

//===----------------------------------------------------------------------===//
// Core: subcomplexes
//===----------------------------------------------------------------------===//

// A subcomplex is a complex |sub| read against a |parent|. The operations
// return closed results (all faces listed) that stay inside the parent.

// SubcomplexOutsideParent when a listed simplex of |sub| is not in |parent|.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_subcomplex_validate(
    const pcp_topology_complex_t* parent, const pcp_topology_complex_t* sub);
// ParentComplexMismatch unless |a| and |b| list the same simplices.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_subcomplex_check_same_parent(
    const pcp_topology_complex_t* a, const pcp_topology_complex_t* b);
// Faces of |sub| (the closure).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_subcomplex_closure(
    const pcp_topology_complex_t* sub, pcp_topology_complex_t* out_complex);
// Faces of either.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_subcomplex_union(
    const pcp_topology_complex_t* a, const pcp_topology_complex_t* b,
    pcp_topology_complex_t* out_complex);
// Faces common to both closures (order: faces of |a|).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_subcomplex_intersection(
    const pcp_topology_complex_t* a, const pcp_topology_complex_t* b,
    pcp_topology_complex_t* out_complex);
// Faces of |a| with no non-empty face in |b|: the largest closed subcomplex
// of |a| disjoint from |b|. The empty face stays when |a| is non-empty.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_subcomplex_difference(
    const pcp_topology_complex_t* a, const pcp_topology_complex_t* b,
    pcp_topology_complex_t* out_complex);

//===----------------------------------------------------------------------===//
// Core: vertex maps
//===----------------------------------------------------------------------===//

// A map on vertices (decision maps delta, projections). Borrows |domain| and
// |codomain|. Entries are kept in insertion order.
typedef struct pcp_topology_vertex_map_t pcp_topology_vertex_map_t;

typedef struct pcp_topology_vertex_map_checks_t {
  bool require_color_preserving;
  bool require_rigid;
} pcp_topology_vertex_map_checks_t;

PCP_MUST_USE_RESULT pcp_status_t pcp_topology_vertex_map_create(
    const pcp_topology_complex_t* domain,
    const pcp_topology_complex_t* codomain, pcp_allocator_t allocator,
    pcp_topology_vertex_map_t** out_map);
void pcp_topology_vertex_map_release(pcp_topology_vertex_map_t* map);
const pcp_topology_complex_t* pcp_topology_vertex_map_domain(
    const pcp_topology_vertex_map_t* map);
const pcp_topology_complex_t* pcp_topology_vertex_map_codomain(
    const pcp_topology_vertex_map_t* map);
// Appends an entry (no checks; validate() finds duplicates and strays).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_vertex_map_set(
    pcp_topology_vertex_map_t* map, const pcp_topology_vertex_t* source,
    const pcp_topology_vertex_t* target);
size_t pcp_topology_vertex_map_count(const pcp_topology_vertex_map_t* map);
void pcp_topology_vertex_map_entry(const pcp_topology_vertex_map_t* map,
                                   size_t index,
                                   pcp_topology_vertex_t* out_source,
                                   pcp_topology_vertex_t* out_target);
// First entry for |source|; false when unmapped.
bool pcp_topology_vertex_map_lookup(const pcp_topology_vertex_map_t* map,
                                    const pcp_topology_vertex_t* source,
                                    pcp_topology_vertex_t* out_target);

// Upstream validate: both complexes valid; coverage (SourceVertexOutsideDomain,
// DuplicateVertexMapSource, TargetVertexOutsideCodomain, NonColorPreservingMap
// when asked, MissingVertexMapEntry); simplicial (NonSimplicialMap) and, when
// asked, rigid (NonRigidMap) on every domain face.
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_vertex_map_validate(const pcp_topology_vertex_map_t* map,
                                 pcp_topology_vertex_map_checks_t checks);
// Deduplicated, sorted image of |simplex| (cleared first).
// MissingVertexMapEntry for an unmapped vertex.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_vertex_map_apply(
    const pcp_topology_vertex_map_t* map, pcp_topology_simplex_t simplex,
    pcp_topology_vertex_list_t* out_image);
// Images of the faces of |source| (closed; NULL = the domain), faces order.
// ComplexMismatch when |source| is not inside the domain.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_vertex_map_image(
    const pcp_topology_vertex_map_t* map, const pcp_topology_complex_t* source,
    pcp_topology_complex_t* out_complex);
// Like image(), and every mapped face must lie in |target|
// (SubcomplexImageOutsideTarget).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_subcomplex_image(
    const pcp_topology_complex_t* sub, const pcp_topology_vertex_map_t* map,
    const pcp_topology_complex_t* target, pcp_topology_complex_t* out_complex);
// |second| o |first|: domain of |first|, codomain of |second|. MissingVertexMap
// Entry when an image of |first| is not mapped by |second|.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_vertex_map_compose(
    const pcp_topology_vertex_map_t* first,
    const pcp_topology_vertex_map_t* second, pcp_allocator_t allocator,
    pcp_topology_vertex_map_t** out_map);

//===----------------------------------------------------------------------===//
// Core: carrier maps
//===----------------------------------------------------------------------===//

// A simplicial carrier map: each face of |domain| to a closed subcomplex of
// |codomain| (Xi execution carriers, Delta task carriers, subdivision
// carriers). Borrows the two complexes; owns closed copies of the images.
typedef struct pcp_topology_carrier_map_t pcp_topology_carrier_map_t;

typedef struct pcp_topology_carrier_checks_t {
  bool monotone;   // s subset t => img s subset img t (default on)
  bool strict;     // img(s n t) = img s n img t
  bool rigid;      // img s pure of dim s (also run by chromatic)
  bool chromatic;  // colours of s = colours of img s
} pcp_topology_carrier_checks_t;

// Upstream defaults: monotone only.
static inline pcp_topology_carrier_checks_t pcp_topology_carrier_checks_default(
    void) {
  pcp_topology_carrier_checks_t checks = {true, false, false, false};
  return checks;
}

PCP_MUST_USE_RESULT pcp_status_t pcp_topology_carrier_map_create(
    const pcp_topology_complex_t* domain,
    const pcp_topology_complex_t* codomain, pcp_allocator_t allocator,
    pcp_topology_carrier_map_t** out_map);
void pcp_topology_carrier_map_release(pcp_topology_carrier_map_t* map);
const pcp_topology_complex_t* pcp_topology_carrier_map_domain(
    const pcp_topology_carrier_map_t* map);
const pcp_topology_complex_t* pcp_topology_carrier_map_codomain(
    const pcp_topology_carrier_map_t* map);
// Appends {simplex -> closure of |image|} (sorted copy of |simplex|). No
// duplicate check here; validate() reports DuplicateCarrierSimplex.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_carrier_map_set(
    pcp_topology_carrier_map_t* map, pcp_topology_simplex_t simplex,
    const pcp_topology_complex_t* image);
size_t pcp_topology_carrier_map_count(const pcp_topology_carrier_map_t* map);
// Entry accessors (borrowed, valid until the map is modified).
pcp_topology_simplex_t pcp_topology_carrier_map_entry_simplex(
    const pcp_topology_carrier_map_t* map, size_t index);
const pcp_topology_complex_t* pcp_topology_carrier_map_entry_image(
    const pcp_topology_carrier_map_t* map, size_t index);
// Closed image of |simplex| (exact entry), NULL when it has no entry.
const pcp_topology_complex_t* pcp_topology_carrier_map_lookup(
    const pcp_topology_carrier_map_t* map, pcp_topology_simplex_t simplex);

// Entries (CarrierSimplexOutsideDomain, DuplicateCarrierSimplex,
// ComplexMismatch for an image outside the codomain, MissingCarrierSimplex for
// any domain face, the empty one included) and then the asked checks
// (NonMonotonicCarrier, NonStrictCarrier, NonRigidCarrier,
// NonChromaticCarrier).
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_carrier_map_validate(const pcp_topology_carrier_map_t* map,
                                  pcp_topology_carrier_checks_t checks);
// s -> delta(Xi(s)); codomain = delta's codomain.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_carrier_map_compose_with_map(
    const pcp_topology_carrier_map_t* carrier,
    const pcp_topology_vertex_map_t* map, pcp_allocator_t allocator,
    pcp_topology_carrier_map_t** out_map);
// s -> union over the faces f of Xi(s) of Phi(f); codomain = Phi's codomain.
// MissingCarrierSimplex when Phi has no entry for such an f.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_carrier_map_compose_with_carrier(
    const pcp_topology_carrier_map_t* carrier,
    const pcp_topology_carrier_map_t* next, pcp_allocator_t allocator,
    pcp_topology_carrier_map_t** out_map);
// The entries whose simplex lies in |sub| (by closure), over domain |sub|.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_carrier_map_restrict(
    const pcp_topology_carrier_map_t* map, const pcp_topology_complex_t* sub,
    pcp_allocator_t allocator, pcp_topology_carrier_map_t** out_map);
// Union of all images (closed).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_carrier_map_image(
    const pcp_topology_carrier_map_t* map, pcp_topology_complex_t* out_complex);
// |output| lies in the image of |input| (false when |input| has no entry).
bool pcp_topology_carrier_map_carries(const pcp_topology_carrier_map_t* map,
                                      pcp_topology_simplex_t input,
                                      pcp_topology_simplex_t output);

//===----------------------------------------------------------------------===//
// Core: carried decision maps
//===----------------------------------------------------------------------===//

// delta o Xi subset Delta: validates Xi and Delta (default checks) and delta
// (colour preserving); requires Xi.domain = Delta.domain, Xi.codomain =
// delta.domain, Delta.codomain = delta.codomain by closure (ComplexMismatch);
// then for every input face s (faces order) every face of delta(Xi(s)) must
// lie in Delta(s) (DecisionOutsideCarrier, naming s and the output).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_carried_decision_map_validate(
    const pcp_topology_carrier_map_t* execution,
    const pcp_topology_carrier_map_t* task,
    const pcp_topology_vertex_map_t* decision);

//===----------------------------------------------------------------------===//
// Core: index-based carriers (the older upstream API used by the models)
//===----------------------------------------------------------------------===//

// All arrays are borrowed and caller-built; nothing here allocates.

// One carrier edge: listed input simplex -> listed target simplices.
typedef struct pcp_topology_index_edge_t {
  uint32_t input_index;
  const uint32_t* target_indices;
  uint32_t target_count;
} pcp_topology_index_edge_t;

// Task carrier I -> O (target = output indices) or execution carrier I -> P
// (target = protocol indices), over the *listed* simplices of each complex.
typedef struct pcp_topology_index_carrier_t {
  const pcp_topology_complex_t* input;
  const pcp_topology_complex_t* target;
  const pcp_topology_index_edge_t* edges;
  size_t edge_count;
} pcp_topology_index_carrier_t;

typedef struct pcp_topology_decision_edge_t {
  uint32_t input_index;
  uint32_t protocol_index;
  uint32_t output_index;
} pcp_topology_decision_edge_t;

typedef struct pcp_topology_protocol_decision_t {
  uint32_t protocol_index;
  uint32_t output_index;
} pcp_topology_protocol_decision_t;

typedef struct pcp_topology_execution_observation_t {
  uint32_t input_index;
  uint32_t protocol_index;
} pcp_topology_execution_observation_t;

// Task carrier: edges cover exactly the listed inputs (MissingCarrierEdge,
// DuplicateCarrierEdge, InputIndexOutOfRange, OutputIndexOutOfRange) and are
// monotone between listed simplices (NonMonotonicCarrier).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_index_carrier_validate(
    const pcp_topology_index_carrier_t* carrier);
// Execution carrier: the same with MissingExecutionEdge,
// DuplicateExecutionEdge, EmptyExecutionCarrier, ProtocolIndexOutOfRange and
// NonMonotonicExecutionCarrier.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_execution_carrier_validate(
    const pcp_topology_index_carrier_t* execution);
// One decision per listed protocol simplex (MissingDecision,
// DuplicateDecision, range errors); the decided output is carried by the
// decision's input (DecisionOutsideCarrier); then the shared-view check.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_decision_map_validate(
    const pcp_topology_complex_t* protocol,
    const pcp_topology_index_carrier_t* carrier,
    const pcp_topology_decision_edge_t* decisions, size_t decision_count);
// The two carriers share the input (listed index by index, ComplexMismatch);
// each decided protocol simplex is reached by an execution edge
// (ProtocolOutsideExecutionCarrier) and every input reaching it carries the
// output (DecisionOutsideCarrier); then the shared-view check.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_execution_decision_map_validate(
    const pcp_topology_index_carrier_t* execution,
    const pcp_topology_index_carrier_t* carrier,
    const pcp_topology_protocol_decision_t* decisions, size_t decision_count);
// Shared local view => same decision: for each pair of decisions and each
// vertex their protocol simplices share, both outputs have a vertex of that
// colour (SharedViewMissingOutputVertex) and it is the same vertex
// (IncompatibleDecisionOnSharedView). |protocol_indices[i]| and
// |output_indices[i]| form decision i.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_decisions_check_shared_views(
    const pcp_topology_complex_t* protocol,
    const pcp_topology_complex_t* output, const uint32_t* protocol_indices,
    const uint32_t* output_indices, size_t decision_count);
// Every observation is an edge of |execution| (ProtocolOutsideExecution
// Carrier) and every edge pair is observed (MissingExecutionObservation).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_execution_observations_validate(
    const pcp_topology_index_carrier_t* execution,
    const pcp_topology_execution_observation_t* observations,
    size_t observation_count);

//===----------------------------------------------------------------------===//
// Core: subdivisions
//===----------------------------------------------------------------------===//

const char* pcp_topology_subdivision_kind_name(
    pcp_topology_subdivision_kind_t kind);

// Where a subdivided vertex came from. |carrier| is the face of the previous
// round's complex (the input for round 1) the vertex sits in; for chromatic
// vertices |source| is the process whose view |carrier| is.
typedef struct pcp_topology_subdivision_vertex_info_t {
  pcp_topology_vertex_t vertex;
  pcp_topology_subdivision_kind_t kind;
  uint32_t round;
  uint32_t ordinal;
  bool has_source;
  pcp_topology_vertex_t source;
  pcp_topology_simplex_t carrier;  // borrowed from the subdivision
} pcp_topology_subdivision_vertex_info_t;

const pcp_topology_complex_t* pcp_topology_subdivision_input(
    const pcp_topology_subdivision_t* subdivision);
const pcp_topology_carrier_map_t* pcp_topology_subdivision_carrier(
    const pcp_topology_subdivision_t* subdivision);
pcp_topology_subdivision_kind_t pcp_topology_subdivision_kind(
    const pcp_topology_subdivision_t* subdivision);
uint32_t pcp_topology_subdivision_rounds(
    const pcp_topology_subdivision_t* subdivision);
size_t pcp_topology_subdivision_metadata_count(
    const pcp_topology_subdivision_t* subdivision);
void pcp_topology_subdivision_metadata(
    const pcp_topology_subdivision_t* subdivision, size_t index,
    pcp_topology_subdivision_vertex_info_t* out_info);
// Counts of the subdivided complex: distinct vertices and top-dimensional
// faces (facets of a pure subdivision).
void pcp_topology_subdivision_counts(
    const pcp_topology_subdivision_t* subdivision, size_t* out_vertex_count,
    size_t* out_facet_count);

typedef struct pcp_topology_subdivision_options_t {
  bool check_kind;  // compare metadata kind against |expected_kind|
  pcp_topology_subdivision_kind_t expected_kind;
  bool check_round;
  uint32_t expected_round;
  bool strict;
  bool rigid;
  bool chromatic;
  bool boundary;
  bool links;
} pcp_topology_subdivision_options_t;

// Upstream defaults: strict, rigid, boundary and links on; chromatic off; no
// kind or round expectation.
pcp_topology_subdivision_options_t pcp_topology_subdivision_options_default(
    void);

typedef struct pcp_topology_subdivision_report_t {
  size_t vertex_count;
  size_t metadata_count;
  size_t top_facet_count;
  size_t face_restriction_checks;
  size_t boundary_checks;
  size_t link_checks;
} pcp_topology_subdivision_report_t;

// The protocol-power validator (reference s.2.7): carrier flags, metadata,
// per-simplex view rules, images = faces carried inside s, face
// restrictions, boundaries of images, links of metadata vertices.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_subdivision_validate(
    const pcp_topology_subdivision_t* subdivision,
    pcp_topology_subdivision_options_t options,
    pcp_topology_subdivision_report_t* out_report);
// The iterated result equals the (rounds-1) prefix followed by one round:
// complexes and carriers compared by closure, metadata against the prefix.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_subdivision_validate_iterated(
    const pcp_topology_complex_t* input, pcp_topology_subdivision_kind_t kind,
    uint32_t rounds, pcp_allocator_t allocator);

//===----------------------------------------------------------------------===//
// Core: homology over GF(p)
//===----------------------------------------------------------------------===//

// Largest prime accepted (entries are stored in 32 bits, products in 64).
#define PCP_TOPOLOGY_MAX_FIELD_PRIME 65521u

// InvalidFieldPrime unless 2 <= |prime| <= PCP_TOPOLOGY_MAX_FIELD_PRIME and
// prime.
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_field_prime_validate(uint32_t prime);

// Connected components of the 1-skeleton (0 for the empty complex).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_complex_component_count(
    const pcp_topology_complex_t* complex, size_t* out_count);
// Shortest edge path (BFS, neighbours in sorted-vertex order), endpoints
// included (cleared first). SourceVertexOutsideComplex,
// TargetVertexOutsideComplex, NoPath.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_complex_path(
    const pcp_topology_complex_t* complex, const pcp_topology_vertex_t* source,
    const pcp_topology_vertex_t* target, pcp_topology_vertex_list_t* out_path);

// First non-empty input face F (faces order) whose Xi(F) has one component
// and Delta(F) more than one. |out_found| false when none. |out_face| gets F
// (cleared first; may be NULL).
typedef struct pcp_topology_connectivity_obstruction_t {
  bool found;
  size_t protocol_components;
  size_t output_components;
} pcp_topology_connectivity_obstruction_t;
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_connectivity_obstruction_find(
    const pcp_topology_carrier_map_t* execution,
    const pcp_topology_carrier_map_t* task,
    pcp_topology_connectivity_obstruction_t* out_obstruction,
    pcp_topology_vertex_list_t* out_face);

// Induced homology of a simplicial map, onto its image subcomplex.
typedef struct pcp_topology_homology_map_report_t {
  uint32_t prime;
  pcp_topology_betti_t source_betti;
  pcp_topology_betti_t image_betti;
  // Rank of H_k(source) -> H_k(image), one per source dimension.
  uint32_t induced_rank_count;
  uint64_t induced_ranks[PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION + 1];
  bool preserves_betti;     // the two Betti vectors are equal
  bool preserves_homology;  // induced rank = both Betti numbers, every k
} pcp_topology_homology_map_report_t;

// Validates |map| as simplicial and computes the report over GF(|prime|).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_homology_map_check(
    const pcp_topology_vertex_map_t* map, uint32_t prime,
    pcp_topology_homology_map_report_t* out_report);

// A k-chain: canonical k-simplices with non-zero GF(p) coefficients. Owns its
// storage; caller-embedded.
typedef struct pcp_topology_chain_t {
  pcp_allocator_t allocator;
  int32_t dimension;
  uint32_t prime;
  size_t count;                     // simplices
  pcp_topology_vertex_t* vertices;  // count * (dimension + 1), canonical
  uint32_t* coefficients;           // count
} pcp_topology_chain_t;

void pcp_topology_chain_initialize(pcp_allocator_t allocator,
                                   pcp_topology_chain_t* out_chain);
void pcp_topology_chain_deinitialize(pcp_topology_chain_t* chain);
static inline pcp_topology_simplex_t pcp_topology_chain_simplex(
    const pcp_topology_chain_t* chain, size_t index) {
  size_t width = (size_t)(chain->dimension + 1);
  return pcp_topology_make_simplex(chain->vertices + index * width, width);
}

typedef enum pcp_topology_homology_witness_kind_e {
  PCP_TOPOLOGY_HOMOLOGY_WITNESS_NONE = 0,
  PCP_TOPOLOGY_HOMOLOGY_WITNESS_SOURCE_CYCLE_LOST = 1,
  PCP_TOPOLOGY_HOMOLOGY_WITNESS_IMAGE_CYCLE_CREATED = 2,
} pcp_topology_homology_witness_kind_t;

const char* pcp_topology_homology_witness_kind_name(
    pcp_topology_homology_witness_kind_t kind);

// Initialize with pcp_topology_homology_witness_initialize, release with
// _deinitialize (owns the chains).
typedef struct pcp_topology_homology_witness_t {
  pcp_topology_homology_witness_kind_t kind;
  int32_t dimension;
  uint32_t prime;
  pcp_topology_chain_t source_chain;  // empty for IMAGE_CYCLE_CREATED
  pcp_topology_chain_t image_chain;   // empty (0) when the image is a boundary
} pcp_topology_homology_witness_t;

void pcp_topology_homology_witness_initialize(
    pcp_allocator_t allocator, pcp_topology_homology_witness_t* out_witness);
void pcp_topology_homology_witness_deinitialize(
    pcp_topology_homology_witness_t* witness);
// First lost source cycle, else first created image cycle (reference s.2.11);
// kind NONE when the map preserves homology in every dimension >= 1.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_homology_map_witness_find(
    const pcp_topology_vertex_map_t* map, uint32_t prime,
    pcp_topology_homology_witness_t* out_witness);

// Edge-path group presentation relative to a spanning forest: one generator
// per non-tree edge, one relator per triangle (tree edges dropped). Caller-
// embedded; owns its arrays.
typedef struct pcp_topology_fundamental_group_generator_t {
  uint32_t name;               // generator index
  pcp_topology_vertex_t from;  // lower vertex
  pcp_topology_vertex_t to;    // higher vertex
} pcp_topology_fundamental_group_generator_t;

typedef struct pcp_topology_fundamental_group_letter_t {
  uint32_t generator;
  bool inverse;
} pcp_topology_fundamental_group_letter_t;

typedef struct pcp_topology_fundamental_group_t {
  pcp_allocator_t allocator;
  size_t generator_count;
  pcp_topology_fundamental_group_generator_t* generators;
  size_t relator_count;
  size_t* relator_offsets;  // relator i = letters[offsets[i], offsets[i+1])
  size_t letter_count;
  pcp_topology_fundamental_group_letter_t* letters;
} pcp_topology_fundamental_group_t;

void pcp_topology_fundamental_group_initialize(
    pcp_allocator_t allocator, pcp_topology_fundamental_group_t* out_group);
void pcp_topology_fundamental_group_deinitialize(
    pcp_topology_fundamental_group_t* group);
// ComplexDimensionTooHigh above dimension 2.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_fundamental_group_compute(
    const pcp_topology_complex_t* complex,
    pcp_topology_fundamental_group_t* out_group);
static inline size_t pcp_topology_fundamental_group_relator_length(
    const pcp_topology_fundamental_group_t* group, size_t index) {
  return group->relator_offsets[index + 1] - group->relator_offsets[index];
}

//===----------------------------------------------------------------------===//
// Core: DOT export
//===----------------------------------------------------------------------===//

// Appends `graph "<name>" {`, one `  v<i> [label="<vertex>"];` per sorted
// vertex, one `  v<i> -- v<j>;` per edge (i < j), then `}`. 1-skeleton only.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_complex_format_dot(
    const pcp_topology_complex_t* complex, const char* name,
    pcp_string_builder_t* builder);

#ifdef __cplusplus
}
#endif

#endif  // PCP_TOPOLOGY_COMPLEX_IMPL_H_
