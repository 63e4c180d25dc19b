// SPDX-License-Identifier: Apache-2.0
//
// Homology over GF(p): connectivity and paths, Betti numbers by sparse
// elimination, induced homology of simplicial maps, cycle witnesses, the
// fundamental-group diagnostic and DOT export (reference s.2.8-2.12, 2.15).
//
// Upstream builds dense boundary matrices and runs Gauss-Jordan on them,
// which is cubic and quadratic in memory; fine for the toy complexes of its
// tests, hopeless for an iterated subdivision. Here every boundary matrix is
// a list of sparse columns reduced by the standard column algorithm (pivot =
// the lowest non-zero row), with "clearing": a (k-1)-simplex that is the
// pivot of a reduced k-column is a boundary, so its own column in the
// (k-1)-matrix reduces to zero and is skipped. Ranks, and hence Betti
// numbers, do not depend on the elimination order, so the results match the
// dense computation exactly (the benchmark checks this on every run).

#include <stdlib.h>
#include <string.h>

#include "topology/complex_impl.h"
#include "topology/core_impl.h"

#define NONE UINT32_MAX

//===----------------------------------------------------------------------===//
// Field arithmetic
//===----------------------------------------------------------------------===//

static bool is_prime(uint32_t p) {
  if (p < 2)
    return false;
  for (uint32_t d = 2; (uint64_t)d * d <= p; ++d) {
    if (p % d == 0)
      return false;
  }
  return true;
}

pcp_status_t pcp_topology_field_prime_validate(uint32_t prime) {
  if (prime > PCP_TOPOLOGY_MAX_FIELD_PRIME || !is_prime(prime)) {
    return pcp_topology_make_status(PCP_TOPOLOGY_ERROR_INVALID_FIELD_PRIME,
                                    "%u is not a prime in [2, %u]", prime,
                                    PCP_TOPOLOGY_MAX_FIELD_PRIME);
  }
  return pcp_ok_status();
}

static uint32_t mul_mod(uint32_t a, uint32_t b, uint32_t p) {
  return (uint32_t)(((uint64_t)a * b) % p);
}

// Inverse by Fermat (p prime, a != 0).
static uint32_t inv_mod(uint32_t a, uint32_t p) {
  uint64_t result = 1;
  uint64_t base = a % p;
  uint32_t e = p - 2;
  while (e) {
    if (e & 1)
      result = (result * base) % p;
    base = (base * base) % p;
    e >>= 1;
  }
  return (uint32_t)result;
}

//===----------------------------------------------------------------------===//
// Sparse vectors and the column reducer
//===----------------------------------------------------------------------===//

// Entries sorted by index, values in [1, p).
typedef struct sparse_vec_t {
  uint32_t* index;
  uint32_t* value;
  uint32_t count;
  uint32_t capacity;
} sparse_vec_t;

static void vec_free(pcp_allocator_t allocator, sparse_vec_t* v) {
  pcp_allocator_free(allocator, v->index);
  pcp_allocator_free(allocator, v->value);
  memset(v, 0, sizeof(*v));
}

static pcp_status_t vec_reserve(pcp_allocator_t allocator, sparse_vec_t* v,
                                uint32_t capacity) {
  if (capacity <= v->capacity)
    return pcp_ok_status();
  uint32_t c = v->capacity ? v->capacity : 8;
  while (c < capacity) c *= 2;
  void* index = v->index;
  void* value = v->value;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_realloc(allocator, (size_t)c * sizeof(uint32_t), &index));
  v->index = (uint32_t*)index;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_realloc(allocator, (size_t)c * sizeof(uint32_t), &value));
  v->value = (uint32_t*)value;
  v->capacity = c;
  return pcp_ok_status();
}

static pcp_status_t vec_copy(pcp_allocator_t allocator,
                             const sparse_vec_t* from, sparse_vec_t* to) {
  PCP_RETURN_IF_ERROR_BARE(vec_reserve(allocator, to, from->count));
  if (from->count) {
    memcpy(to->index, from->index, from->count * sizeof(uint32_t));
    memcpy(to->value, from->value, from->count * sizeof(uint32_t));
  }
  to->count = from->count;
  return pcp_ok_status();
}

// a := a - factor * b, through |scratch| (swapped into |a|).
static pcp_status_t vec_axpy(pcp_allocator_t allocator, sparse_vec_t* a,
                             uint32_t factor, const sparse_vec_t* b, uint32_t p,
                             sparse_vec_t* scratch) {
  PCP_RETURN_IF_ERROR_BARE(
      vec_reserve(allocator, scratch, a->count + b->count));
  uint32_t neg = (p - factor % p) % p;
  uint32_t i = 0, j = 0, n = 0;
  while (i < a->count || j < b->count) {
    if (j >= b->count || (i < a->count && a->index[i] < b->index[j])) {
      scratch->index[n] = a->index[i];
      scratch->value[n++] = a->value[i++];
    } else if (i >= a->count || b->index[j] < a->index[i]) {
      uint32_t v = mul_mod(neg, b->value[j], p);
      if (v) {
        scratch->index[n] = b->index[j];
        scratch->value[n++] = v;
      }
      ++j;
    } else {
      uint32_t v = (a->value[i] + mul_mod(neg, b->value[j], p)) % p;
      if (v) {
        scratch->index[n] = a->index[i];
        scratch->value[n++] = v;
      }
      ++i;
      ++j;
    }
  }
  scratch->count = n;
  sparse_vec_t t = *a;
  *a = *scratch;
  *scratch = t;
  return pcp_ok_status();
}

static void vec_scale(sparse_vec_t* v, uint32_t factor, uint32_t p) {
  for (uint32_t i = 0; i < v->count; ++i) {
    v->value[i] = mul_mod(v->value[i], factor, p);
  }
}

// Column reduction over GF(p) with pivot = lowest row. Optionally tracks,
// for every stored column, the combination of input columns it came from
// (R = D V), which yields cycle bases.
typedef struct reducer_t {
  pcp_allocator_t allocator;
  uint32_t prime;
  size_t rows;
  uint32_t* pivot_of_row;  // row -> stored column, NONE
  sparse_vec_t* columns;   // stored, low coefficient normalised to 1
  sparse_vec_t* tracks;    // V columns when tracking
  size_t count;
  size_t capacity;
  size_t tracks_capacity;
  bool track;
  sparse_vec_t scratch;
} reducer_t;

static pcp_status_t reducer_initialize(pcp_allocator_t allocator,
                                       uint32_t prime, size_t rows, bool track,
                                       reducer_t* out) {
  memset(out, 0, sizeof(*out));
  out->allocator = allocator;
  out->prime = prime;
  out->rows = rows;
  out->track = track;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
      allocator, (rows + 1) * sizeof(uint32_t), (void**)&out->pivot_of_row));
  memset(out->pivot_of_row, 0xFF, (rows + 1) * sizeof(uint32_t));
  return pcp_ok_status();
}

static void reducer_deinitialize(reducer_t* r) {
  for (size_t i = 0; i < r->count; ++i) {
    vec_free(r->allocator, &r->columns[i]);
    if (r->track)
      vec_free(r->allocator, &r->tracks[i]);
  }
  pcp_allocator_free(r->allocator, r->columns);
  pcp_allocator_free(r->allocator, r->tracks);
  pcp_allocator_free(r->allocator, r->pivot_of_row);
  vec_free(r->allocator, &r->scratch);
  memset(r, 0, sizeof(*r));
}

// Reduces |v| (and |track|) against the stored pivots in place.
static pcp_status_t reducer_reduce(reducer_t* r, sparse_vec_t* v,
                                   sparse_vec_t* track) {
  while (v->count) {
    uint32_t low = v->index[v->count - 1];
    uint32_t pivot = r->pivot_of_row[low];
    if (pivot == NONE)
      break;
    uint32_t factor = v->value[v->count - 1];
    PCP_RETURN_IF_ERROR_BARE(vec_axpy(
        r->allocator, v, factor, &r->columns[pivot], r->prime, &r->scratch));
    if (track) {
      PCP_RETURN_IF_ERROR_BARE(vec_axpy(r->allocator, track, factor,
                                        &r->tracks[pivot], r->prime,
                                        &r->scratch));
    }
  }
  return pcp_ok_status();
}

// Reduces and, if anything is left, stores it (taking |v| and |track|;
// both are left empty). |out_added| tells whether the rank grew.
static pcp_status_t reducer_insert(reducer_t* r, sparse_vec_t* v,
                                   sparse_vec_t* track, bool* out_added) {
  *out_added = false;
  PCP_RETURN_IF_ERROR_BARE(reducer_reduce(r, v, track));
  if (!v->count)
    return pcp_ok_status();
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_grow(r->allocator, sizeof(*r->columns),
                                             r->count + 1, (void**)&r->columns,
                                             &r->capacity));
  if (r->track) {
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_grow(r->allocator, sizeof(*r->tracks),
                                               r->count + 1, (void**)&r->tracks,
                                               &r->tracks_capacity));
  }
  uint32_t inverse = inv_mod(v->value[v->count - 1], r->prime);
  vec_scale(v, inverse, r->prime);
  if (track)
    vec_scale(track, inverse, r->prime);
  r->pivot_of_row[v->index[v->count - 1]] = (uint32_t)r->count;
  r->columns[r->count] = *v;
  memset(v, 0, sizeof(*v));
  if (r->track) {
    r->tracks[r->count] = *track;
    memset(track, 0, sizeof(*track));
  }
  r->count++;
  *out_added = true;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Chain complexes: simplices as sorted vertex-id tuples, per dimension
//===----------------------------------------------------------------------===//

typedef struct dim_cells_t {
  uint32_t width;  // vertices per simplex (dimension + 1)
  uint32_t* ids;   // count * width, each tuple ascending
  size_t count;
  size_t capacity;
  pcp_topology_index_table_t table;
} dim_cells_t;

typedef struct chain_complex_t {
  pcp_allocator_t allocator;
  pcp_topology_vertex_index_t vertices;
  int32_t top;  // dimension; -1 when empty
  dim_cells_t cells[PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION + 1];
} chain_complex_t;

typedef struct cell_key_t {
  const dim_cells_t* cells;
  const uint32_t* ids;
} cell_key_t;

static bool cell_eq(const void* context, uint32_t value, const void* key) {
  const dim_cells_t* cells = (const dim_cells_t*)context;
  const uint32_t* ids = (const uint32_t*)key;
  return memcmp(cells->ids + (size_t)value * cells->width, ids,
                cells->width * sizeof(uint32_t)) == 0;
}

static uint64_t hash_ids(const uint32_t* ids, uint32_t width) {
  uint64_t h = 0x6a09e667f3bcc909ull ^ width;
  for (uint32_t i = 0; i < width; ++i) {
    h = pcp_topology_core_mix(h ^ (ids[i] + 0x9e3779b97f4a7c15ull));
  }
  return h;
}

static bool cells_find(const dim_cells_t* cells, const uint32_t* ids,
                       uint32_t* out_index) {
  return pcp_topology_index_table_find(&cells->table,
                                       hash_ids(ids, cells->width), cell_eq,
                                       cells, ids, out_index);
}

static pcp_status_t cells_insert(pcp_allocator_t allocator, dim_cells_t* cells,
                                 const uint32_t* ids) {
  uint32_t existing = 0;
  uint64_t hash = hash_ids(ids, cells->width);
  if (pcp_topology_index_table_find(&cells->table, hash, cell_eq, cells, ids,
                                    &existing)) {
    return pcp_ok_status();
  }
  if (cells->count >= PCP_TOPOLOGY_MAX_COMPLEX_SIMPLICES) {
    return pcp_topology_make_status(PCP_TOPOLOGY_ERROR_COMPLEX_TOO_LARGE,
                                    "more than %u simplices of dimension %u",
                                    PCP_TOPOLOGY_MAX_COMPLEX_SIMPLICES,
                                    cells->width - 1);
  }
  size_t needed = (cells->count + 1) * cells->width;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_grow(allocator, sizeof(uint32_t),
                                             needed, (void**)&cells->ids,
                                             &cells->capacity));
  memcpy(cells->ids + cells->count * cells->width, ids,
         cells->width * sizeof(uint32_t));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_index_table_insert(
      &cells->table, hash, (uint32_t)cells->count));
  cells->count++;
  return pcp_ok_status();
}

static void chain_complex_deinitialize(chain_complex_t* cc) {
  for (int i = 0; i <= PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION; ++i) {
    pcp_allocator_free(cc->allocator, cc->cells[i].ids);
    pcp_topology_index_table_deinitialize(&cc->cells[i].table);
  }
  pcp_topology_vertex_index_deinitialize(&cc->vertices);
  memset(cc, 0, sizeof(*cc));
}

static void sort_ids(uint32_t* ids, uint32_t n) {
  for (uint32_t i = 1; i < n; ++i) {
    uint32_t v = ids[i];
    uint32_t j = i;
    while (j > 0 && ids[j - 1] > v) {
      ids[j] = ids[j - 1];
      --j;
    }
    ids[j] = v;
  }
}

// Faces of every listed simplex, in faces order (masks over the stored
// order), deduplicated per dimension: the same per-dimension order as
// filtering faces() by dimension, without materialising the face complex.
static pcp_status_t chain_complex_initialize(
    const pcp_topology_complex_t* complex, pcp_allocator_t allocator,
    chain_complex_t* out) {
  memset(out, 0, sizeof(*out));
  out->allocator = allocator;
  // Empty but valid first, so every early return can be deinitialized.
  pcp_topology_vertex_list_initialize(allocator, &out->vertices.vertices);
  pcp_topology_index_table_initialize(allocator, &out->vertices.table);
  out->top = pcp_topology_complex_dimension(complex);
  for (int i = 0; i <= PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION; ++i) {
    out->cells[i].width = (uint32_t)i + 1;
    pcp_topology_index_table_initialize(allocator, &out->cells[i].table);
  }
  if (out->top > PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION) {
    return pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_SIMPLEX_TOO_LARGE_FOR_FACE_ENUMERATION,
        "dimension %d (at most %d)", (int)out->top,
        PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION);
  }
  pcp_status_t status =
      pcp_topology_vertex_index_initialize(complex, allocator, &out->vertices);
  if (status) {
    pcp_topology_vertex_list_initialize(allocator, &out->vertices.vertices);
    pcp_topology_index_table_initialize(allocator, &out->vertices.table);
    return status;
  }
  size_t count = pcp_topology_complex_count(complex);
  uint32_t stored[PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION + 1];
  uint32_t face[PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION + 1];
  for (size_t s = 0; !status && s < count; ++s) {
    pcp_topology_simplex_t simplex = pcp_topology_complex_simplex(complex, s);
    if (simplex.count > 24) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_COMPLEX_TOO_LARGE,
          "a simplex of %u vertices has too many faces", simplex.count);
    }
    for (uint32_t i = 0; i < simplex.count; ++i) {
      PCP_ASSERT(pcp_topology_vertex_index_find(
          &out->vertices, &simplex.vertices[i], &stored[i]));
    }
    uint64_t total = (uint64_t)1 << simplex.count;
    for (uint64_t mask = 1; !status && mask < total; ++mask) {
      uint32_t n = 0;
      for (uint32_t i = 0; i < simplex.count; ++i) {
        if (mask & ((uint64_t)1 << i))
          face[n++] = stored[i];
      }
      sort_ids(face, n);
      // A non-chromatic literal could repeat a vertex; such a tuple is not
      // a simplex of that dimension.
      bool distinct = true;
      for (uint32_t i = 1; i < n && distinct; ++i)
        distinct = face[i] != face[i - 1];
      if (!distinct)
        continue;
      status = cells_insert(allocator, &out->cells[n - 1], face);
    }
  }
  return status;
}

// Column of the boundary of cell |j| in dimension |k| >= 1, sorted by row.
static pcp_status_t boundary_column(const chain_complex_t* cc, int32_t k,
                                    size_t j, uint32_t prime,
                                    sparse_vec_t* out) {
  const dim_cells_t* cells = &cc->cells[k];
  const dim_cells_t* rows = &cc->cells[k - 1];
  const uint32_t* ids = cells->ids + j * cells->width;
  uint32_t face[PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION + 1];
  PCP_RETURN_IF_ERROR_BARE(vec_reserve(cc->allocator, out, (uint32_t)k + 1));
  out->count = 0;
  for (int32_t omit = 0; omit <= k; ++omit) {
    uint32_t n = 0;
    for (int32_t i = 0; i <= k; ++i) {
      if (i != omit)
        face[n++] = ids[i];
    }
    uint32_t row = 0;
    PCP_ASSERT(cells_find(rows, face, &row));
    // Keep entries sorted by row (insertion; k is small).
    uint32_t value = (omit % 2 == 0) ? 1 : prime - 1;
    uint32_t pos = out->count;
    while (pos > 0 && out->index[pos - 1] > row) {
      out->index[pos] = out->index[pos - 1];
      out->value[pos] = out->value[pos - 1];
      --pos;
    }
    out->index[pos] = row;
    out->value[pos] = value;
    out->count++;
  }
  return pcp_ok_status();
}

// Ranks of every boundary map, top down with clearing. |ranks[k]| is the
// rank of the map from k-chains to (k-1)-chains; ranks[0] = 0.
static pcp_status_t boundary_ranks(const chain_complex_t* cc, uint32_t prime,
                                   uint64_t* ranks) {
  memset(ranks, 0,
         sizeof(uint64_t) * (PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION + 2));
  pcp_allocator_t allocator = cc->allocator;
  uint8_t* cleared = NULL;       // over the k-cells, from the k+1 pass
  uint8_t* next_cleared = NULL;  // over the (k-1)-cells
  sparse_vec_t column = {0};
  pcp_status_t status = pcp_ok_status();
  for (int32_t k = cc->top; !status && k >= 1; --k) {
    size_t n = cc->cells[k].count;
    size_t rows = cc->cells[k - 1].count;
    status = pcp_allocator_calloc(allocator, rows + 1, (void**)&next_cleared);
    if (status)
      break;
    reducer_t reducer;
    status = reducer_initialize(allocator, prime, rows, false, &reducer);
    if (status)
      break;
    uint64_t rank = 0;
    for (size_t j = 0; !status && j < n; ++j) {
      if (cleared && cleared[j])
        continue;
      status = boundary_column(cc, k, j, prime, &column);
      if (status)
        break;
      bool added = false;
      status = reducer_insert(&reducer, &column, NULL, &added);
      if (added) {
        ++rank;
      }
    }
    for (size_t c = 0; !status && c < reducer.count; ++c) {
      const sparse_vec_t* v = &reducer.columns[c];
      next_cleared[v->index[v->count - 1]] = 1;
    }
    reducer_deinitialize(&reducer);
    ranks[k] = rank;
    pcp_allocator_free(allocator, cleared);
    cleared = next_cleared;
    next_cleared = NULL;
  }
  pcp_allocator_free(allocator, cleared);
  pcp_allocator_free(allocator, next_cleared);
  vec_free(allocator, &column);
  return status;
}

static void betti_from_ranks(const chain_complex_t* cc, const uint64_t* ranks,
                             pcp_topology_betti_t* out_betti) {
  memset(out_betti, 0, sizeof(*out_betti));
  if (cc->top < 0)
    return;
  out_betti->count = (uint32_t)cc->top + 1;
  for (int32_t k = 0; k <= cc->top; ++k) {
    uint64_t upper = k + 1 <= cc->top ? ranks[k + 1] : 0;
    out_betti->values[k] = cc->cells[k].count - ranks[k] - upper;
  }
}

pcp_status_t pcp_topology_complex_betti(const pcp_topology_complex_t* complex,
                                        uint32_t prime,
                                        pcp_topology_betti_t* out_betti) {
  memset(out_betti, 0, sizeof(*out_betti));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_field_prime_validate(prime));
  chain_complex_t cc;
  pcp_status_t status = chain_complex_initialize(
      complex, pcp_topology_complex_allocator(complex), &cc);
  uint64_t ranks[PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION + 2];
  if (!status)
    status = boundary_ranks(&cc, prime, ranks);
  if (!status)
    betti_from_ranks(&cc, ranks, out_betti);
  chain_complex_deinitialize(&cc);
  return status;
}

//===----------------------------------------------------------------------===//
// Connectivity
//===----------------------------------------------------------------------===//

// Adjacency lists of the 1-skeleton over sorted vertex ids, each ascending:
// BFS over them visits neighbours in the order a dense row scan would.
typedef struct graph_t {
  size_t vertex_count;
  uint32_t* offsets;
  uint32_t* items;
} graph_t;

static void graph_release(pcp_allocator_t allocator, graph_t* g) {
  pcp_allocator_free(allocator, g->offsets);
  pcp_allocator_free(allocator, g->items);
  memset(g, 0, sizeof(*g));
}

static pcp_status_t graph_build(const chain_complex_t* cc, graph_t* out) {
  memset(out, 0, sizeof(*out));
  pcp_allocator_t allocator = cc->allocator;
  size_t n = cc->vertices.vertices.count;
  const dim_cells_t* edges = &cc->cells[1];
  out->vertex_count = n;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      allocator, (n + 2) * sizeof(uint32_t), (void**)&out->offsets));
  pcp_status_t status =
      pcp_allocator_malloc(allocator, (2 * edges->count + 1) * sizeof(uint32_t),
                           (void**)&out->items);
  if (status) {
    graph_release(allocator, out);
    return status;
  }
  size_t edge_count = cc->top >= 1 ? edges->count : 0;
  for (size_t e = 0; e < edge_count; ++e) {
    out->offsets[edges->ids[2 * e] + 2]++;
    out->offsets[edges->ids[2 * e + 1] + 2]++;
  }
  for (size_t i = 2; i < n + 2; ++i) out->offsets[i] += out->offsets[i - 1];
  for (size_t e = 0; e < edge_count; ++e) {
    uint32_t a = edges->ids[2 * e];
    uint32_t b = edges->ids[2 * e + 1];
    out->items[out->offsets[a + 1]++] = b;
    out->items[out->offsets[b + 1]++] = a;
  }
  for (size_t v = 0; v < n; ++v) {
    uint32_t begin = out->offsets[v];
    uint32_t end = out->offsets[v + 1];
    sort_ids(out->items + begin, end - begin);
  }
  return pcp_ok_status();
}

// BFS from |root|; |parent| gets NONE for unvisited, the root itself for the
// root. Returns the visit queue length.
static size_t graph_bfs(const graph_t* g, uint32_t root, uint32_t* parent,
                        uint32_t* queue) {
  size_t head = 0, tail = 0;
  parent[root] = root;
  queue[tail++] = root;
  while (head < tail) {
    uint32_t v = queue[head++];
    for (uint32_t k = g->offsets[v]; k < g->offsets[v + 1]; ++k) {
      uint32_t w = g->items[k];
      if (parent[w] == NONE) {
        parent[w] = v;
        queue[tail++] = w;
      }
    }
  }
  return tail;
}

static pcp_status_t count_components(const chain_complex_t* cc,
                                     size_t* out_count) {
  *out_count = 0;
  graph_t g;
  PCP_RETURN_IF_ERROR_BARE(graph_build(cc, &g));
  size_t n = g.vertex_count;
  uint32_t* parent = NULL;
  uint32_t* queue = NULL;
  pcp_status_t status = pcp_allocator_malloc(
      cc->allocator, (n + 1) * sizeof(uint32_t), (void**)&parent);
  if (!status) {
    status = pcp_allocator_malloc(cc->allocator, (n + 1) * sizeof(uint32_t),
                                  (void**)&queue);
  }
  if (!status) {
    memset(parent, 0xFF, (n + 1) * sizeof(uint32_t));
    for (uint32_t v = 0; v < n; ++v) {
      if (parent[v] != NONE)
        continue;
      graph_bfs(&g, v, parent, queue);
      ++*out_count;
    }
  }
  pcp_allocator_free(cc->allocator, parent);
  pcp_allocator_free(cc->allocator, queue);
  graph_release(cc->allocator, &g);
  return status;
}

pcp_status_t pcp_topology_complex_component_count(
    const pcp_topology_complex_t* complex, size_t* out_count) {
  *out_count = 0;
  chain_complex_t cc;
  pcp_status_t status = chain_complex_initialize(
      complex, pcp_topology_complex_allocator(complex), &cc);
  if (!status)
    status = count_components(&cc, out_count);
  chain_complex_deinitialize(&cc);
  return status;
}

pcp_status_t pcp_topology_complex_path(const pcp_topology_complex_t* complex,
                                       const pcp_topology_vertex_t* source,
                                       const pcp_topology_vertex_t* target,
                                       pcp_topology_vertex_list_t* out_path) {
  pcp_topology_vertex_list_clear(out_path);
  chain_complex_t cc;
  pcp_allocator_t allocator = pcp_topology_complex_allocator(complex);
  pcp_status_t status = chain_complex_initialize(complex, allocator, &cc);
  uint32_t from = 0, to = 0;
  char text[256];
  if (!status && !pcp_topology_vertex_index_find(&cc.vertices, source, &from)) {
    status = pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_SOURCE_VERTEX_OUTSIDE_COMPLEX, "%s",
        pcp_topology_vertex_cstr(source, text, sizeof(text)));
  }
  if (!status && !pcp_topology_vertex_index_find(&cc.vertices, target, &to)) {
    status = pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_TARGET_VERTEX_OUTSIDE_COMPLEX, "%s",
        pcp_topology_vertex_cstr(target, text, sizeof(text)));
  }
  graph_t g = {0};
  uint32_t* parent = NULL;
  uint32_t* queue = NULL;
  if (!status)
    status = graph_build(&cc, &g);
  size_t n = g.vertex_count;
  if (!status) {
    status = pcp_allocator_malloc(allocator, (n + 1) * sizeof(uint32_t),
                                  (void**)&parent);
  }
  if (!status) {
    status = pcp_allocator_malloc(allocator, (n + 1) * sizeof(uint32_t),
                                  (void**)&queue);
  }
  if (!status) {
    memset(parent, 0xFF, (n + 1) * sizeof(uint32_t));
    graph_bfs(&g, from, parent, queue);
    if (parent[to] == NONE) {
      char other[256];
      status = pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_NO_PATH, "no edge path from %s to %s",
          pcp_topology_vertex_cstr(source, text, sizeof(text)),
          pcp_topology_vertex_cstr(target, other, sizeof(other)));
    }
  }
  if (!status) {
    // Walk back from the target, then reverse.
    size_t length = 0;
    for (uint32_t v = to;; v = parent[v]) {
      queue[length++] = v;
      if (v == from)
        break;
    }
    for (size_t i = length; !status && i > 0; --i) {
      status = pcp_topology_vertex_list_append(
          out_path, &cc.vertices.vertices.items[queue[i - 1]]);
    }
  }
  pcp_allocator_free(allocator, parent);
  pcp_allocator_free(allocator, queue);
  graph_release(allocator, &g);
  chain_complex_deinitialize(&cc);
  return status;
}

pcp_status_t pcp_topology_connectivity_obstruction_find(
    const pcp_topology_carrier_map_t* execution,
    const pcp_topology_carrier_map_t* task,
    pcp_topology_connectivity_obstruction_t* out_obstruction,
    pcp_topology_vertex_list_t* out_face) {
  memset(out_obstruction, 0, sizeof(*out_obstruction));
  if (out_face)
    pcp_topology_vertex_list_clear(out_face);
  const pcp_topology_complex_t* input =
      pcp_topology_carrier_map_domain(execution);
  pcp_allocator_t allocator = pcp_topology_complex_allocator(input);
  pcp_topology_complex_t* faces = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(allocator, &faces));
  pcp_status_t status = pcp_topology_complex_faces(input, faces);
  size_t count = status ? 0 : pcp_topology_complex_count(faces);
  for (size_t i = 0; !status && i < count; ++i) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, i);
    if (face.count == 0)
      continue;
    const pcp_topology_complex_t* xi =
        pcp_topology_carrier_map_lookup(execution, face);
    const pcp_topology_complex_t* delta =
        pcp_topology_carrier_map_lookup(task, face);
    if (!xi || !delta) {
      char text[512];
      status = pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_MISSING_CARRIER_SIMPLEX,
          "input face %s has no carrier entry",
          pcp_topology_simplex_cstr(face, text, sizeof(text)));
      break;
    }
    size_t protocol_components = 0, output_components = 0;
    status = pcp_topology_complex_component_count(xi, &protocol_components);
    if (!status) {
      status = pcp_topology_complex_component_count(delta, &output_components);
    }
    if (status)
      break;
    if (protocol_components == 1 && output_components > 1) {
      out_obstruction->found = true;
      out_obstruction->protocol_components = protocol_components;
      out_obstruction->output_components = output_components;
      for (uint32_t v = 0; out_face && !status && v < face.count; ++v) {
        status = pcp_topology_vertex_list_append(out_face, &face.vertices[v]);
      }
      break;
    }
  }
  pcp_topology_complex_release(faces);
  return status;
}

//===----------------------------------------------------------------------===//
// Induced homology
//===----------------------------------------------------------------------===//

// Everything needed to compare H_k(source) with H_k(image) under a map.
typedef struct map_homology_t {
  pcp_allocator_t allocator;
  uint32_t prime;
  chain_complex_t source;
  chain_complex_t image;
  pcp_topology_complex_t* image_complex;
  // Vertex id in source -> vertex id in image.
  uint32_t* vertex_map;
  uint64_t source_ranks[PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION + 2];
  uint64_t image_ranks[PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION + 2];
} map_homology_t;

static void map_homology_deinitialize(map_homology_t* m) {
  chain_complex_deinitialize(&m->source);
  chain_complex_deinitialize(&m->image);
  pcp_topology_complex_release(m->image_complex);
  pcp_allocator_free(m->allocator, m->vertex_map);
  memset(m, 0, sizeof(*m));
}

static pcp_status_t map_homology_initialize(
    const pcp_topology_vertex_map_t* map, uint32_t prime, map_homology_t* out) {
  memset(out, 0, sizeof(*out));
  const pcp_topology_complex_t* domain = pcp_topology_vertex_map_domain(map);
  pcp_allocator_t allocator = pcp_topology_complex_allocator(domain);
  out->allocator = allocator;
  out->prime = prime;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_field_prime_validate(prime));
  pcp_topology_vertex_map_checks_t checks = {false, false};
  PCP_RETURN_IF_ERROR(pcp_topology_vertex_map_validate(map, checks),
                      "induced homology");
  pcp_status_t status =
      pcp_topology_complex_create(allocator, &out->image_complex);
  if (!status) {
    status = pcp_topology_vertex_map_image(map, NULL, out->image_complex);
  }
  if (!status)
    status = chain_complex_initialize(domain, allocator, &out->source);
  if (!status) {
    status =
        chain_complex_initialize(out->image_complex, allocator, &out->image);
  }
  size_t n = out->source.vertices.vertices.count;
  if (!status) {
    status = pcp_allocator_malloc(allocator, (n + 1) * sizeof(uint32_t),
                                  (void**)&out->vertex_map);
  }
  for (size_t v = 0; !status && v < n; ++v) {
    pcp_topology_vertex_t target;
    PCP_ASSERT(pcp_topology_vertex_map_lookup(
        map, &out->source.vertices.vertices.items[v], &target));
    PCP_ASSERT(pcp_topology_vertex_index_find(&out->image.vertices, &target,
                                              &out->vertex_map[v]));
  }
  if (!status)
    status = boundary_ranks(&out->source, prime, out->source_ranks);
  if (!status)
    status = boundary_ranks(&out->image, prime, out->image_ranks);
  return status;
}

// Basis of Z_k(cc) as sparse vectors over the k-cells (caller frees each).
static pcp_status_t cycle_basis(const chain_complex_t* cc, int32_t k,
                                uint32_t prime, sparse_vec_t** out_basis,
                                size_t* out_count) {
  *out_basis = NULL;
  *out_count = 0;
  pcp_allocator_t allocator = cc->allocator;
  size_t n = cc->cells[k].count;
  sparse_vec_t* basis = NULL;
  size_t capacity = 0, count = 0;
  pcp_status_t status = pcp_ok_status();
  if (k == 0) {
    // Every 0-chain is a cycle: the identity basis.
    for (size_t j = 0; !status && j < n; ++j) {
      status = pcp_topology_grow(allocator, sizeof(*basis), count + 1,
                                 (void**)&basis, &capacity);
      if (status)
        break;
      memset(&basis[count], 0, sizeof(basis[count]));
      status = vec_reserve(allocator, &basis[count], 1);
      if (status) {
        vec_free(allocator, &basis[count]);
        break;
      }
      basis[count].index[0] = (uint32_t)j;
      basis[count].value[0] = 1;
      basis[count].count = 1;
      ++count;
    }
  } else {
    reducer_t reducer;
    status = reducer_initialize(allocator, prime, cc->cells[k - 1].count, true,
                                &reducer);
    sparse_vec_t column = {0};
    sparse_vec_t track = {0};
    for (size_t j = 0; !status && j < n; ++j) {
      status = boundary_column(cc, k, j, prime, &column);
      if (!status)
        status = vec_reserve(allocator, &track, 1);
      if (status)
        break;
      track.index[0] = (uint32_t)j;
      track.value[0] = 1;
      track.count = 1;
      bool added = false;
      status = reducer_insert(&reducer, &column, &track, &added);
      if (status || added)
        continue;
      // The column reduced to zero: its combination is a cycle.
      status = pcp_topology_grow(allocator, sizeof(*basis), count + 1,
                                 (void**)&basis, &capacity);
      if (status)
        break;
      memset(&basis[count], 0, sizeof(basis[count]));
      status = vec_copy(allocator, &track, &basis[count]);
      if (status) {
        vec_free(allocator, &basis[count]);
      } else {
        ++count;
      }
    }
    vec_free(allocator, &column);
    vec_free(allocator, &track);
    if (reducer.pivot_of_row)
      reducer_deinitialize(&reducer);
  }
  if (status) {
    for (size_t i = 0; i < count; ++i) vec_free(allocator, &basis[i]);
    pcp_allocator_free(allocator, basis);
    return status;
  }
  *out_basis = basis;
  *out_count = count;
  return pcp_ok_status();
}

static void basis_free(pcp_allocator_t allocator, sparse_vec_t* basis,
                       size_t count) {
  for (size_t i = 0; i < count; ++i) vec_free(allocator, &basis[i]);
  pcp_allocator_free(allocator, basis);
}

// Pushes a source k-chain to the image: collapsed simplices vanish; the
// others land on their image simplex with the sign of the permutation that
// sorts the mapped vertices.
static pcp_status_t push_forward(const map_homology_t* m, int32_t k,
                                 const sparse_vec_t* chain, sparse_vec_t* out) {
  out->count = 0;
  const dim_cells_t* cells = &m->source.cells[k];
  uint32_t mapped[PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION + 1];
  sparse_vec_t acc = {0};
  sparse_vec_t unit = {0};
  sparse_vec_t scratch = {0};
  pcp_status_t status = vec_reserve(m->allocator, &unit, 1);
  for (uint32_t e = 0; !status && e < chain->count; ++e) {
    const uint32_t* ids = cells->ids + (size_t)chain->index[e] * cells->width;
    for (uint32_t i = 0; i < cells->width; ++i) {
      mapped[i] = m->vertex_map[ids[i]];
    }
    // Parity of the sorting permutation by counting inversions; a repeated
    // vertex means the simplex collapses.
    uint32_t inversions = 0;
    bool collapsed = false;
    for (uint32_t i = 0; i < cells->width && !collapsed; ++i) {
      for (uint32_t j = i + 1; j < cells->width; ++j) {
        if (mapped[i] == mapped[j]) {
          collapsed = true;
          break;
        }
        if (mapped[i] > mapped[j])
          ++inversions;
      }
    }
    if (collapsed)
      continue;
    sort_ids(mapped, cells->width);
    uint32_t row = 0;
    if (k > m->image.top || !cells_find(&m->image.cells[k], mapped, &row)) {
      status = pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_NON_SIMPLICIAL_MAP,
          "a %d-simplex maps outside the image complex", (int)k);
      break;
    }
    uint32_t value = chain->value[e];
    if (inversions % 2)
      value = (m->prime - value) % m->prime;
    unit.index[0] = row;
    unit.value[0] = 1;
    unit.count = 1;
    // acc += value * unit, i.e. acc - (p - value) * unit.
    status = vec_axpy(m->allocator, &acc, (m->prime - value) % m->prime, &unit,
                      m->prime, &scratch);
  }
  if (!status)
    status = vec_copy(m->allocator, &acc, out);
  vec_free(m->allocator, &acc);
  vec_free(m->allocator, &unit);
  vec_free(m->allocator, &scratch);
  return status;
}

// A reducer preloaded with the boundary columns of dimension k + 1 of |cc|.
static pcp_status_t boundary_reducer(const chain_complex_t* cc, int32_t k,
                                     uint32_t prime, reducer_t* out) {
  PCP_RETURN_IF_ERROR_BARE(reducer_initialize(
      cc->allocator, prime, k <= cc->top ? cc->cells[k].count : 0, false, out));
  if (k + 1 > cc->top)
    return pcp_ok_status();
  sparse_vec_t column = {0};
  pcp_status_t status = pcp_ok_status();
  for (size_t j = 0; !status && j < cc->cells[k + 1].count; ++j) {
    status = boundary_column(cc, k + 1, j, prime, &column);
    bool added = false;
    if (!status)
      status = reducer_insert(out, &column, NULL, &added);
  }
  vec_free(cc->allocator, &column);
  return status;
}

// Is |v| in the span of the reducer's columns? (Does not modify |r|.)
static pcp_status_t in_span(reducer_t* r, const sparse_vec_t* v,
                            bool* out_in_span) {
  sparse_vec_t copy = {0};
  pcp_status_t status = vec_copy(r->allocator, v, &copy);
  if (!status)
    status = reducer_reduce(r, &copy, NULL);
  *out_in_span = copy.count == 0;
  vec_free(r->allocator, &copy);
  return status;
}

pcp_status_t pcp_topology_homology_map_check(
    const pcp_topology_vertex_map_t* map, uint32_t prime,
    pcp_topology_homology_map_report_t* out_report) {
  memset(out_report, 0, sizeof(*out_report));
  out_report->prime = prime;
  map_homology_t m;
  pcp_status_t status = map_homology_initialize(map, prime, &m);
  if (status) {
    map_homology_deinitialize(&m);
    return status;
  }
  betti_from_ranks(&m.source, m.source_ranks, &out_report->source_betti);
  betti_from_ranks(&m.image, m.image_ranks, &out_report->image_betti);
  out_report->induced_rank_count = out_report->source_betti.count;
  bool preserves = true;
  for (int32_t k = 0; !status && k <= m.source.top; ++k) {
    // rank(H_k f) = rank[f(Z_k) | B_k(image)] - rank B_k(image).
    reducer_t r;
    status = boundary_reducer(&m.image, k, prime, &r);
    size_t base_rank = r.count;
    sparse_vec_t* basis = NULL;
    size_t basis_count = 0;
    if (!status)
      status = cycle_basis(&m.source, k, prime, &basis, &basis_count);
    sparse_vec_t pushed = {0};
    for (size_t i = 0; !status && i < basis_count; ++i) {
      status = push_forward(&m, k, &basis[i], &pushed);
      bool added = false;
      if (!status)
        status = reducer_insert(&r, &pushed, NULL, &added);
    }
    vec_free(m.allocator, &pushed);
    uint64_t induced = status ? 0 : r.count - base_rank;
    out_report->induced_ranks[k] = induced;
    uint64_t image_betti = k < (int32_t)out_report->image_betti.count
                               ? out_report->image_betti.values[k]
                               : 0;
    if (induced != out_report->source_betti.values[k] ||
        induced != image_betti) {
      preserves = false;
    }
    basis_free(m.allocator, basis, basis_count);
    reducer_deinitialize(&r);
  }
  // Dimensions the image has beyond the source carry no induced classes.
  for (uint32_t k = out_report->source_betti.count;
       k < out_report->image_betti.count; ++k) {
    if (out_report->image_betti.values[k] != 0)
      preserves = false;
  }
  bool same_betti = true;
  uint32_t longest =
      out_report->source_betti.count > out_report->image_betti.count
          ? out_report->source_betti.count
          : out_report->image_betti.count;
  for (uint32_t k = 0; k < longest; ++k) {
    if (out_report->source_betti.values[k] !=
        out_report->image_betti.values[k]) {
      same_betti = false;
    }
  }
  out_report->preserves_betti = same_betti;
  out_report->preserves_homology = preserves;
  map_homology_deinitialize(&m);
  return status;
}

//===----------------------------------------------------------------------===//
// Cycle witnesses
//===----------------------------------------------------------------------===//

void pcp_topology_chain_initialize(pcp_allocator_t allocator,
                                   pcp_topology_chain_t* out_chain) {
  memset(out_chain, 0, sizeof(*out_chain));
  out_chain->allocator = allocator;
}

void pcp_topology_chain_deinitialize(pcp_topology_chain_t* chain) {
  pcp_allocator_free(chain->allocator, chain->vertices);
  pcp_allocator_free(chain->allocator, chain->coefficients);
  chain->vertices = NULL;
  chain->coefficients = NULL;
  chain->count = 0;
}

static pcp_status_t chain_fill(const chain_complex_t* cc, int32_t k,
                               uint32_t prime, const sparse_vec_t* v,
                               pcp_topology_chain_t* out) {
  pcp_topology_chain_deinitialize(out);
  out->dimension = k;
  out->prime = prime;
  if (!v->count)
    return pcp_ok_status();
  size_t width = (size_t)k + 1;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
      out->allocator, v->count * width * sizeof(*out->vertices),
      (void**)&out->vertices));
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
      out->allocator, v->count * sizeof(*out->coefficients),
      (void**)&out->coefficients));
  const dim_cells_t* cells = &cc->cells[k];
  for (uint32_t e = 0; e < v->count; ++e) {
    const uint32_t* ids = cells->ids + (size_t)v->index[e] * width;
    for (size_t i = 0; i < width; ++i) {
      out->vertices[e * width + i] = cc->vertices.vertices.items[ids[i]];
    }
    out->coefficients[e] = v->value[e];
  }
  out->count = v->count;
  return pcp_ok_status();
}

const char* pcp_topology_homology_witness_kind_name(
    pcp_topology_homology_witness_kind_t kind) {
  switch (kind) {
    case PCP_TOPOLOGY_HOMOLOGY_WITNESS_NONE:
      return "none";
    case PCP_TOPOLOGY_HOMOLOGY_WITNESS_SOURCE_CYCLE_LOST:
      return "source_cycle_lost";
    case PCP_TOPOLOGY_HOMOLOGY_WITNESS_IMAGE_CYCLE_CREATED:
      return "image_cycle_created";
    default:
      return "?";
  }
}

void pcp_topology_homology_witness_initialize(
    pcp_allocator_t allocator, pcp_topology_homology_witness_t* out_witness) {
  memset(out_witness, 0, sizeof(*out_witness));
  pcp_topology_chain_initialize(allocator, &out_witness->source_chain);
  pcp_topology_chain_initialize(allocator, &out_witness->image_chain);
}

void pcp_topology_homology_witness_deinitialize(
    pcp_topology_homology_witness_t* witness) {
  pcp_topology_chain_deinitialize(&witness->source_chain);
  pcp_topology_chain_deinitialize(&witness->image_chain);
}

static pcp_status_t witness_in_dimension(const map_homology_t* m, int32_t k,
                                         pcp_topology_homology_witness_t* out) {
  uint32_t p = m->prime;
  reducer_t source_b, image_b, span;
  memset(&source_b, 0, sizeof(source_b));
  memset(&image_b, 0, sizeof(image_b));
  memset(&span, 0, sizeof(span));
  sparse_vec_t* basis = NULL;
  size_t basis_count = 0;
  sparse_vec_t* image_basis = NULL;
  size_t image_basis_count = 0;
  sparse_vec_t pushed = {0};
  pcp_status_t status = boundary_reducer(&m->source, k, p, &source_b);
  if (!status)
    status = boundary_reducer(&m->image, k, p, &image_b);
  if (!status)
    status = boundary_reducer(&m->image, k, p, &span);
  if (!status && k <= m->source.top) {
    status = cycle_basis(&m->source, k, p, &basis, &basis_count);
  }
  // 1. A source cycle that is not a boundary but maps to one is lost.
  for (size_t i = 0; !status && i < basis_count; ++i) {
    bool boundary = false;
    status = in_span(&source_b, &basis[i], &boundary);
    if (status)
      break;
    status = push_forward(m, k, &basis[i], &pushed);
    if (status)
      break;
    if (!boundary) {
      bool image_boundary = false;
      status = in_span(&image_b, &pushed, &image_boundary);
      if (status)
        break;
      if (image_boundary) {
        out->kind = PCP_TOPOLOGY_HOMOLOGY_WITNESS_SOURCE_CYCLE_LOST;
        out->dimension = k;
        out->prime = p;
        status = chain_fill(&m->source, k, p, &basis[i], &out->source_chain);
        if (!status) {
          status = chain_fill(&m->image, k, p, &pushed, &out->image_chain);
        }
        goto done;
      }
    }
    bool added = false;
    status = reducer_insert(&span, &pushed, NULL, &added);
  }
  // 2. An image cycle outside boundaries + mapped source cycles is created.
  if (!status && k <= m->image.top) {
    status = cycle_basis(&m->image, k, p, &image_basis, &image_basis_count);
  }
  for (size_t i = 0; !status && i < image_basis_count; ++i) {
    bool covered = false;
    status = in_span(&span, &image_basis[i], &covered);
    if (status || covered)
      continue;
    out->kind = PCP_TOPOLOGY_HOMOLOGY_WITNESS_IMAGE_CYCLE_CREATED;
    out->dimension = k;
    out->prime = p;
    out->source_chain.dimension = k;
    out->source_chain.prime = p;
    status = chain_fill(&m->image, k, p, &image_basis[i], &out->image_chain);
    break;
  }
done:
  vec_free(m->allocator, &pushed);
  basis_free(m->allocator, basis, basis_count);
  basis_free(m->allocator, image_basis, image_basis_count);
  if (source_b.pivot_of_row)
    reducer_deinitialize(&source_b);
  if (image_b.pivot_of_row)
    reducer_deinitialize(&image_b);
  if (span.pivot_of_row)
    reducer_deinitialize(&span);
  return status;
}

pcp_status_t pcp_topology_homology_map_witness_find(
    const pcp_topology_vertex_map_t* map, uint32_t prime,
    pcp_topology_homology_witness_t* out_witness) {
  out_witness->kind = PCP_TOPOLOGY_HOMOLOGY_WITNESS_NONE;
  out_witness->dimension = 0;
  out_witness->prime = prime;
  pcp_topology_chain_deinitialize(&out_witness->source_chain);
  pcp_topology_chain_deinitialize(&out_witness->image_chain);
  map_homology_t m;
  pcp_status_t status = map_homology_initialize(map, prime, &m);
  int32_t top = m.source.top > m.image.top ? m.source.top : m.image.top;
  for (int32_t k = 1; !status && k <= top; ++k) {
    bool source_has = k <= m.source.top && m.source.cells[k].count > 0;
    bool image_has = k <= m.image.top && m.image.cells[k].count > 0;
    if (!source_has && !image_has)
      continue;
    status = witness_in_dimension(&m, k, out_witness);
    if (out_witness->kind != PCP_TOPOLOGY_HOMOLOGY_WITNESS_NONE)
      break;
  }
  map_homology_deinitialize(&m);
  return status;
}

//===----------------------------------------------------------------------===//
// Fundamental group diagnostic
//===----------------------------------------------------------------------===//

void pcp_topology_fundamental_group_initialize(
    pcp_allocator_t allocator, pcp_topology_fundamental_group_t* out_group) {
  memset(out_group, 0, sizeof(*out_group));
  out_group->allocator = allocator;
}

void pcp_topology_fundamental_group_deinitialize(
    pcp_topology_fundamental_group_t* group) {
  pcp_allocator_free(group->allocator, group->generators);
  pcp_allocator_free(group->allocator, group->relator_offsets);
  pcp_allocator_free(group->allocator, group->letters);
  pcp_allocator_t allocator = group->allocator;
  memset(group, 0, sizeof(*group));
  group->allocator = allocator;
}

static uint32_t find_root(uint32_t* parent, uint32_t v) {
  while (parent[v] != v) {
    parent[v] = parent[parent[v]];
    v = parent[v];
  }
  return v;
}

pcp_status_t pcp_topology_fundamental_group_compute(
    const pcp_topology_complex_t* complex,
    pcp_topology_fundamental_group_t* out_group) {
  pcp_topology_fundamental_group_deinitialize(out_group);
  int32_t dimension = pcp_topology_complex_dimension(complex);
  if (dimension > 2) {
    return pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_COMPLEX_DIMENSION_TOO_HIGH,
        "the edge-path diagnostic needs dimension <= 2, got %d",
        (int)dimension);
  }
  pcp_allocator_t allocator = out_group->allocator;
  chain_complex_t cc;
  pcp_status_t status = chain_complex_initialize(complex, allocator, &cc);
  size_t n = cc.vertices.vertices.count;
  size_t edge_count = cc.top >= 1 ? cc.cells[1].count : 0;
  size_t triangle_count = cc.top >= 2 ? cc.cells[2].count : 0;
  uint32_t* parent = NULL;
  uint32_t* generator_of_edge = NULL;
  if (!status) {
    status = pcp_allocator_malloc(allocator, (n + 1) * sizeof(uint32_t),
                                  (void**)&parent);
  }
  if (!status) {
    status =
        pcp_allocator_malloc(allocator, (edge_count + 1) * sizeof(uint32_t),
                             (void**)&generator_of_edge);
  }
  if (!status) {
    status = pcp_allocator_calloc(
        allocator, (edge_count + 1) * sizeof(*out_group->generators),
        (void**)&out_group->generators);
  }
  if (!status) {
    status = pcp_allocator_calloc(
        allocator, (triangle_count + 1) * sizeof(*out_group->relator_offsets),
        (void**)&out_group->relator_offsets);
  }
  if (!status) {
    status = pcp_allocator_calloc(
        allocator, (3 * triangle_count + 1) * sizeof(*out_group->letters),
        (void**)&out_group->letters);
  }
  if (!status) {
    // Spanning forest over the edges in faces order; every edge that would
    // close a cycle becomes a generator.
    for (uint32_t v = 0; v < n; ++v) parent[v] = v;
    for (size_t e = 0; e < edge_count; ++e) {
      uint32_t a = cc.cells[1].ids[2 * e];
      uint32_t b = cc.cells[1].ids[2 * e + 1];
      uint32_t ra = find_root(parent, a);
      uint32_t rb = find_root(parent, b);
      if (ra != rb) {
        parent[rb] = ra;
        generator_of_edge[e] = NONE;
        continue;
      }
      uint32_t g = (uint32_t)out_group->generator_count++;
      generator_of_edge[e] = g;
      out_group->generators[g].name = g;
      out_group->generators[g].from = cc.vertices.vertices.items[a];
      out_group->generators[g].to = cc.vertices.vertices.items[b];
    }
    // One relator per triangle over its edges (v0,v1), (v1,v2), (v0,v2),
    // tree edges dropped. Upstream appends the third edge un-inverted, so
    // the word is not an oriented boundary; only counts are meaningful.
    for (size_t t = 0; t < triangle_count; ++t) {
      const uint32_t* ids = cc.cells[2].ids + 3 * t;
      const uint32_t pairs[3][2] = {
          {ids[0], ids[1]}, {ids[1], ids[2]}, {ids[0], ids[2]}};
      for (int i = 0; i < 3; ++i) {
        uint32_t e = 0;
        PCP_ASSERT(cells_find(&cc.cells[1], pairs[i], &e));
        if (generator_of_edge[e] == NONE)
          continue;
        pcp_topology_fundamental_group_letter_t* letter =
            &out_group->letters[out_group->letter_count++];
        letter->generator = generator_of_edge[e];
        letter->inverse = false;  // edges are stored low -> high
      }
      out_group->relator_offsets[++out_group->relator_count] =
          out_group->letter_count;
    }
  }
  pcp_allocator_free(allocator, parent);
  pcp_allocator_free(allocator, generator_of_edge);
  chain_complex_deinitialize(&cc);
  if (status)
    pcp_topology_fundamental_group_deinitialize(out_group);
  return status;
}

//===----------------------------------------------------------------------===//
// DOT export
//===----------------------------------------------------------------------===//

static int compare_edge(const void* a, const void* b) {
  const uint32_t* x = (const uint32_t*)a;
  const uint32_t* y = (const uint32_t*)b;
  if (x[0] != y[0])
    return x[0] < y[0] ? -1 : 1;
  if (x[1] != y[1])
    return x[1] < y[1] ? -1 : 1;
  return 0;
}

pcp_status_t pcp_topology_complex_format_dot(
    const pcp_topology_complex_t* complex, const char* name,
    pcp_string_builder_t* builder) {
  pcp_allocator_t allocator = pcp_topology_complex_allocator(complex);
  chain_complex_t cc;
  pcp_status_t status = chain_complex_initialize(complex, allocator, &cc);
  if (!status) {
    status = pcp_string_builder_append_f(builder, "graph \"%s\" {\n",
                                         name ? name : "complex");
  }
  for (size_t v = 0; !status && v < cc.vertices.vertices.count; ++v) {
    status = pcp_string_builder_append_f(builder, "  v%zu [label=\"", v);
    if (!status) {
      status =
          pcp_topology_vertex_format(&cc.vertices.vertices.items[v], builder);
    }
    if (!status)
      status = pcp_string_builder_append_cstring(builder, "\"];\n");
  }
  size_t edge_count = cc.top >= 1 ? cc.cells[1].count : 0;
  uint32_t* edges = NULL;
  if (!status && edge_count) {
    status = pcp_allocator_malloc(allocator, edge_count * 2 * sizeof(uint32_t),
                                  (void**)&edges);
    if (!status) {
      memcpy(edges, cc.cells[1].ids, edge_count * 2 * sizeof(uint32_t));
      qsort(edges, edge_count, 2 * sizeof(uint32_t), compare_edge);
    }
  }
  for (size_t e = 0; !status && e < edge_count; ++e) {
    status = pcp_string_builder_append_f(builder, "  v%u -- v%u;\n",
                                         edges[2 * e], edges[2 * e + 1]);
  }
  if (!status)
    status = pcp_string_builder_append_cstring(builder, "}\n");
  pcp_allocator_free(allocator, edges);
  chain_complex_deinitialize(&cc);
  return status;
}
