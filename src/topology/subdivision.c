// SPDX-License-Identifier: Apache-2.0
//
// Barycentric and standard chromatic subdivisions, iterated, with carrier
// metadata and the protocol-power validator (reference s.2.7).
//
// Orders follow upstream exactly: new vertices are numbered in faces order
// (times stored vertex order for the chromatic kind), barycentric chains are
// emitted depth first from each face through its strict supersets, and
// chromatic simplices are emitted by a depth-first walk over vertex indices.
// Upstream tests every pair of vertices at every step; here each vertex
// first collects the later vertices it is compatible with (views must be
// comparable, so only views in the same closed star are candidates), which
// keeps iterated rounds near linear without changing the emitted order.

#include <stdlib.h>
#include <string.h>

#include "topology/complex_impl.h"
#include "topology/core_impl.h"

typedef struct vertex_meta_t {
  pcp_topology_vertex_t vertex;
  bool has_source;
  pcp_topology_vertex_t source;
  uint32_t carrier_face;  // index into the round's faces complex
} vertex_meta_t;

// One round: |base| -> |complex| with metadata and carrier.
typedef struct round_t {
  pcp_allocator_t allocator;
  const pcp_topology_complex_t* base;
  pcp_topology_complex_t* faces;  // faces(base), faces order
  pcp_topology_complex_t* complex;
  pcp_topology_carrier_map_t* carrier;  // base -> complex
  vertex_meta_t* meta;
  size_t meta_count;
  size_t meta_capacity;
  pcp_topology_subdivision_kind_t kind;
} round_t;

struct pcp_topology_subdivision_t {
  pcp_allocator_t allocator;
  const pcp_topology_complex_t* input;
  pcp_topology_subdivision_kind_t kind;
  uint32_t rounds;
  // The complex the last round subdivided (the input when rounds <= 1),
  // owned when it is an intermediate result.
  pcp_topology_complex_t* previous_owned;
  round_t last;
  pcp_topology_carrier_map_t* carrier;  // input -> final complex
  bool carrier_is_last;                 // carrier aliases last.carrier
};

const char* pcp_topology_subdivision_kind_name(
    pcp_topology_subdivision_kind_t kind) {
  switch (kind) {
    case PCP_TOPOLOGY_SUBDIVISION_IDENTITY:
      return "identity";
    case PCP_TOPOLOGY_SUBDIVISION_BARYCENTRIC:
      return "barycentric";
    case PCP_TOPOLOGY_SUBDIVISION_CHROMATIC:
      return "chromatic";
    default:
      return "?";
  }
}

static void round_deinitialize(round_t* round) {
  pcp_topology_carrier_map_release(round->carrier);
  pcp_topology_complex_release(round->complex);
  pcp_topology_complex_release(round->faces);
  pcp_allocator_free(round->allocator, round->meta);
  memset(round, 0, sizeof(*round));
}

static pcp_status_t meta_push(round_t* round, const vertex_meta_t* meta) {
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_grow(
      round->allocator, sizeof(*round->meta), round->meta_count + 1,
      (void**)&round->meta, &round->meta_capacity));
  round->meta[round->meta_count++] = *meta;
  return pcp_ok_status();
}

// Per base face: the strict supersets among the faces, in faces order.
typedef struct superset_lists_t {
  uint32_t* offsets;  // face count + 1
  uint32_t* items;
} superset_lists_t;

static void superset_lists_release(pcp_allocator_t allocator,
                                   superset_lists_t* lists) {
  pcp_allocator_free(allocator, lists->offsets);
  pcp_allocator_free(allocator, lists->items);
  memset(lists, 0, sizeof(*lists));
}

typedef struct subface_context_t {
  const pcp_topology_complex_t* faces;
  uint32_t owner;
  uint32_t owner_count;
  uint32_t* counts;  // pass 1: count per subface
  uint32_t* cursor;  // pass 2: write position per subface
  uint32_t* items;
} subface_context_t;

static pcp_status_t visit_subface(void* context,
                                  const pcp_topology_vertex_t* face,
                                  uint32_t count) {
  subface_context_t* c = (subface_context_t*)context;
  if (count == 0 || count == c->owner_count)
    return pcp_ok_status();
  size_t index = 0;
  PCP_ASSERT(pcp_topology_complex_find(
      c->faces, pcp_topology_make_simplex(face, count), &index));
  if (c->items) {
    c->items[c->cursor[index]++] = c->owner;
  } else {
    c->counts[index]++;
  }
  return pcp_ok_status();
}

static pcp_status_t superset_lists_build(pcp_allocator_t allocator,
                                         const pcp_topology_complex_t* faces,
                                         superset_lists_t* out_lists) {
  memset(out_lists, 0, sizeof(*out_lists));
  size_t n = pcp_topology_complex_count(faces);
  uint32_t* counts = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      allocator, (n + 1) * sizeof(*counts), (void**)&counts));
  subface_context_t context = {faces, 0, 0, counts, NULL, NULL};
  pcp_status_t status = pcp_ok_status();
  // Owners are visited in faces order, so each list comes out ascending.
  for (size_t j = 0; !status && j < n; ++j) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, j);
    context.owner = (uint32_t)j;
    context.owner_count = face.count;
    status = pcp_topology_simplex_for_each_face(face, visit_subface, &context);
  }
  uint32_t* offsets = NULL;
  uint32_t* items = NULL;
  if (!status) {
    status = pcp_allocator_calloc(allocator, (n + 1) * sizeof(*offsets),
                                  (void**)&offsets);
  }
  if (!status) {
    for (size_t i = 0; i < n; ++i) offsets[i + 1] = offsets[i] + counts[i];
    status = pcp_allocator_malloc(
        allocator, ((size_t)offsets[n] + 1) * sizeof(*items), (void**)&items);
  }
  if (!status) {
    memcpy(counts, offsets, n * sizeof(*counts));  // reuse as cursors
    context.cursor = counts;
    context.items = items;
    for (size_t j = 0; !status && j < n; ++j) {
      pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, j);
      context.owner = (uint32_t)j;
      context.owner_count = face.count;
      status =
          pcp_topology_simplex_for_each_face(face, visit_subface, &context);
    }
  }
  pcp_allocator_free(allocator, counts);
  if (status) {
    pcp_allocator_free(allocator, offsets);
    pcp_allocator_free(allocator, items);
    return status;
  }
  out_lists->offsets = offsets;
  out_lists->items = items;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Barycentric round
//===----------------------------------------------------------------------===//

typedef struct chain_walk_t {
  round_t* round;
  const superset_lists_t* supersets;
  const uint32_t* vertex_of_face;  // face index -> meta index
  pcp_topology_vertex_t chain[PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES + 1];
  pcp_topology_vertex_t sorted[PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES + 1];
} chain_walk_t;

static pcp_status_t emit(pcp_topology_complex_t* complex,
                         const pcp_topology_vertex_t* vertices, uint32_t count,
                         pcp_topology_vertex_t* scratch) {
  memcpy(scratch, vertices, count * sizeof(*scratch));
  pcp_topology_vertices_sort(scratch, count);
  return pcp_topology_complex_insert_sorted(complex, scratch, count, NULL);
}

static pcp_status_t chain_walk(chain_walk_t* walk, uint32_t face,
                               uint32_t depth) {
  walk->chain[depth] = walk->round->meta[walk->vertex_of_face[face]].vertex;
  PCP_RETURN_IF_ERROR_BARE(
      emit(walk->round->complex, walk->chain, depth + 1, walk->sorted));
  if (depth + 1 >= PCP_ARRAYSIZE(walk->chain))
    return pcp_ok_status();
  const superset_lists_t* s = walk->supersets;
  for (uint32_t k = s->offsets[face]; k < s->offsets[face + 1]; ++k) {
    PCP_RETURN_IF_ERROR_BARE(chain_walk(walk, s->items[k], depth + 1));
  }
  return pcp_ok_status();
}

static pcp_status_t barycentric_round(round_t* round, uint32_t round_number) {
  (void)round_number;
  size_t n = pcp_topology_complex_count(round->faces);
  uint32_t* vertex_of_face = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(round->allocator, (n + 1) * sizeof(*vertex_of_face),
                           (void**)&vertex_of_face));
  pcp_status_t status = pcp_ok_status();
  for (size_t f = 0; !status && f < n; ++f) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(round->faces, f);
    if (face.count == 0)
      continue;
    vertex_meta_t meta;
    memset(&meta, 0, sizeof(meta));
    uint32_t ordinal = (uint32_t)round->meta_count;
    // Colour = dimension of the carrier face keeps every chain chromatic.
    meta.vertex = pcp_topology_make_vertex(
        pcp_topology_make_color(PCP_TOPOLOGY_COLOR_PROCESS, face.count - 1),
        pcp_topology_make_label(PCP_TOPOLOGY_LABEL_PROTOCOL, ordinal));
    meta.carrier_face = (uint32_t)f;
    vertex_of_face[f] = ordinal;
    status = meta_push(round, &meta);
  }
  superset_lists_t supersets = {0};
  if (!status) {
    status = superset_lists_build(round->allocator, round->faces, &supersets);
  }
  chain_walk_t* walk = NULL;
  if (!status) {
    status =
        pcp_allocator_malloc(round->allocator, sizeof(*walk), (void**)&walk);
  }
  if (!status) {
    walk->round = round;
    walk->supersets = &supersets;
    walk->vertex_of_face = vertex_of_face;
    for (size_t f = 0; !status && f < n; ++f) {
      if (pcp_topology_complex_simplex(round->faces, f).count == 0)
        continue;
      status = chain_walk(walk, (uint32_t)f, 0);
    }
  }
  pcp_allocator_free(round->allocator, walk);
  superset_lists_release(round->allocator, &supersets);
  pcp_allocator_free(round->allocator, vertex_of_face);
  return status;
}

//===----------------------------------------------------------------------===//
// Standard chromatic round
//===----------------------------------------------------------------------===//

// The immediate-snapshot rules for a pair of chromatic vertices.
static bool chromatic_compatible(const round_t* round, uint32_t a, uint32_t b) {
  const vertex_meta_t* ma = &round->meta[a];
  const vertex_meta_t* mb = &round->meta[b];
  if (pcp_topology_color_equal(ma->vertex.color, mb->vertex.color)) {
    return false;
  }
  pcp_topology_simplex_t va =
      pcp_topology_complex_simplex(round->faces, ma->carrier_face);
  pcp_topology_simplex_t vb =
      pcp_topology_complex_simplex(round->faces, mb->carrier_face);
  bool a_in_b = pcp_topology_simplex_is_subset(va, vb);
  bool b_in_a = pcp_topology_simplex_is_subset(vb, va);
  if (!a_in_b && !b_in_a)
    return false;
  // If a's process is seen by b, b saw everything a saw (and vice versa).
  if (pcp_topology_simplex_contains_vertex(vb, &ma->source) && !a_in_b) {
    return false;
  }
  if (pcp_topology_simplex_contains_vertex(va, &mb->source) && !b_in_a) {
    return false;
  }
  return true;
}

typedef struct adjacency_t {
  uint32_t* offsets;
  uint32_t* items;
  size_t item_capacity;
} adjacency_t;

static int compare_u32(const void* a, const void* b) {
  uint32_t x = *(const uint32_t*)a;
  uint32_t y = *(const uint32_t*)b;
  return x < y ? -1 : (x > y ? 1 : 0);
}

typedef struct group_context_t {
  const pcp_topology_complex_t* faces;
  const uint32_t* group_offsets;  // face -> first vertex with that view
  const round_t* round;
  uint32_t self;
  uint32_t* scratch;
  size_t scratch_count;
} group_context_t;

static void collect_group(group_context_t* c, size_t face) {
  for (uint32_t v = c->group_offsets[face]; v < c->group_offsets[face + 1];
       ++v) {
    if (v > c->self && chromatic_compatible(c->round, c->self, v)) {
      c->scratch[c->scratch_count++] = v;
    }
  }
}

static pcp_status_t visit_view_subface(void* context,
                                       const pcp_topology_vertex_t* face,
                                       uint32_t count) {
  group_context_t* c = (group_context_t*)context;
  if (count == 0)
    return pcp_ok_status();
  size_t index = 0;
  PCP_ASSERT(pcp_topology_complex_find(
      c->faces, pcp_topology_make_simplex(face, count), &index));
  collect_group(c, index);
  return pcp_ok_status();
}

typedef struct snapshot_walk_t {
  round_t* round;
  const adjacency_t* adjacency;
  uint32_t max_size;
  uint32_t members[PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES + 1];
  pcp_topology_vertex_t
      vertices[PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES + 1];
  pcp_topology_vertex_t sorted[PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES + 1];
} snapshot_walk_t;

static pcp_status_t snapshot_walk(snapshot_walk_t* walk, uint32_t size) {
  round_t* round = walk->round;
  for (uint32_t i = 0; i < size; ++i) {
    walk->vertices[i] = round->meta[walk->members[i]].vertex;
  }
  PCP_RETURN_IF_ERROR_BARE(
      emit(round->complex, walk->vertices, size, walk->sorted));
  if (size >= walk->max_size)
    return pcp_ok_status();
  uint32_t last = walk->members[size - 1];
  const adjacency_t* adj = walk->adjacency;
  for (uint32_t k = adj->offsets[last]; k < adj->offsets[last + 1]; ++k) {
    uint32_t candidate = adj->items[k];
    bool ok = true;
    for (uint32_t i = 0; ok && i + 1 < size; ++i) {
      ok = chromatic_compatible(round, walk->members[i], candidate);
    }
    if (!ok)
      continue;
    walk->members[size] = candidate;
    PCP_RETURN_IF_ERROR_BARE(snapshot_walk(walk, size + 1));
  }
  return pcp_ok_status();
}

static pcp_status_t chromatic_round(round_t* round) {
  pcp_allocator_t allocator = round->allocator;
  size_t n = pcp_topology_complex_count(round->faces);
  uint32_t* group_offsets = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      allocator, (n + 1) * sizeof(*group_offsets), (void**)&group_offsets));
  pcp_status_t status = pcp_ok_status();
  // One vertex per (view, process in the view); grouped by view because the
  // ordinals run over faces order.
  for (size_t f = 0; !status && f < n; ++f) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(round->faces, f);
    group_offsets[f] = (uint32_t)round->meta_count;
    for (uint32_t u = 0; !status && u < face.count; ++u) {
      vertex_meta_t meta;
      memset(&meta, 0, sizeof(meta));
      meta.vertex = pcp_topology_make_vertex(
          face.vertices[u].color,
          pcp_topology_make_label(PCP_TOPOLOGY_LABEL_PROTOCOL,
                                  (int64_t)round->meta_count));
      meta.has_source = true;
      meta.source = face.vertices[u];
      meta.carrier_face = (uint32_t)f;
      status = meta_push(round, &meta);
    }
  }
  if (status) {
    pcp_allocator_free(allocator, group_offsets);
    return status;
  }
  group_offsets[n] = (uint32_t)round->meta_count;
  superset_lists_t supersets = {0};
  status = superset_lists_build(allocator, round->faces, &supersets);
  adjacency_t adjacency = {0};
  uint32_t* scratch = NULL;
  size_t scratch_capacity = 0;
  size_t v_count = round->meta_count;
  if (!status) {
    status = pcp_allocator_calloc(allocator,
                                  (v_count + 1) * sizeof(*adjacency.offsets),
                                  (void**)&adjacency.offsets);
  }
  // Compatible later vertices of each vertex: views comparable with its own
  // are its view's faces and supersets.
  for (uint32_t v = 0; !status && v < v_count; ++v) {
    uint32_t face = round->meta[v].carrier_face;
    pcp_topology_simplex_t view =
        pcp_topology_complex_simplex(round->faces, face);
    size_t bound = 0;
    for (size_t k = supersets.offsets[face]; k < supersets.offsets[face + 1];
         ++k) {
      uint32_t g = supersets.items[k];
      bound += group_offsets[g + 1] - group_offsets[g];
    }
    bound += ((size_t)1 << view.count) * view.count;
    status = pcp_topology_grow(allocator, sizeof(*scratch), bound + 1,
                               (void**)&scratch, &scratch_capacity);
    if (status)
      break;
    group_context_t context = {
        round->faces, group_offsets, round, v, scratch, 0};
    status =
        pcp_topology_simplex_for_each_face(view, visit_view_subface, &context);
    for (size_t k = supersets.offsets[face];
         !status && k < supersets.offsets[face + 1]; ++k) {
      collect_group(&context, supersets.items[k]);
    }
    if (status)
      break;
    qsort(scratch, context.scratch_count, sizeof(*scratch), compare_u32);
    size_t base = adjacency.offsets[v];
    status = pcp_topology_grow(
        allocator, sizeof(*adjacency.items), base + context.scratch_count + 1,
        (void**)&adjacency.items, &adjacency.item_capacity);
    if (status)
      break;
    if (context.scratch_count) {
      memcpy(adjacency.items + base, scratch,
             context.scratch_count * sizeof(*scratch));
    }
    adjacency.offsets[v + 1] = (uint32_t)(base + context.scratch_count);
  }
  pcp_allocator_free(allocator, scratch);
  snapshot_walk_t* walk = NULL;
  if (!status) {
    status = pcp_allocator_malloc(allocator, sizeof(*walk), (void**)&walk);
  }
  if (!status) {
    walk->round = round;
    walk->adjacency = &adjacency;
    int32_t dimension = pcp_topology_complex_dimension(round->base);
    uint32_t max_size = dimension < 0 ? 0 : (uint32_t)dimension + 1;
    if (max_size > PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES) {
      max_size = PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES;
    }
    walk->max_size = max_size;
    for (uint32_t v = 0; !status && v < v_count && max_size > 0; ++v) {
      walk->members[0] = v;
      status = snapshot_walk(walk, 1);
    }
  }
  pcp_allocator_free(allocator, walk);
  pcp_allocator_free(allocator, adjacency.offsets);
  pcp_allocator_free(allocator, adjacency.items);
  superset_lists_release(allocator, &supersets);
  pcp_allocator_free(allocator, group_offsets);
  return status;
}

//===----------------------------------------------------------------------===//
// Carriers of one round
//===----------------------------------------------------------------------===//

typedef struct meta_lookup_t {
  pcp_topology_index_table_t table;  // vertex -> meta index
  const round_t* round;
} meta_lookup_t;

static bool meta_eq(const void* context, uint32_t value, const void* key) {
  const round_t* round = (const round_t*)context;
  return pcp_topology_vertex_equal(&round->meta[value].vertex,
                                   (const pcp_topology_vertex_t*)key);
}

static pcp_status_t meta_lookup_build(const round_t* round,
                                      meta_lookup_t* out_lookup) {
  out_lookup->round = round;
  pcp_topology_index_table_initialize(round->allocator, &out_lookup->table);
  for (size_t i = 0; i < round->meta_count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_index_table_insert(
        &out_lookup->table, pcp_topology_vertex_hash(&round->meta[i].vertex),
        (uint32_t)i));
  }
  return pcp_ok_status();
}

static bool meta_find(const meta_lookup_t* lookup,
                      const pcp_topology_vertex_t* vertex,
                      uint32_t* out_index) {
  return pcp_topology_index_table_find(
      &lookup->table, pcp_topology_vertex_hash(vertex), meta_eq, lookup->round,
      vertex, out_index);
}

// The support of a subdivided simplex: the union of its vertex carriers.
// For both kinds the carriers of one simplex form a chain, so the union is
// the largest carrier; returns its face index.
static uint32_t support_of(const round_t* round, const meta_lookup_t* lookup,
                           pcp_topology_simplex_t simplex) {
  uint32_t best = 0;
  uint32_t best_count = 0;
  for (uint32_t i = 0; i < simplex.count; ++i) {
    uint32_t m = 0;
    PCP_ASSERT(meta_find(lookup, &simplex.vertices[i], &m));
    uint32_t face = round->meta[m].carrier_face;
    uint32_t count = pcp_topology_complex_simplex(round->faces, face).count;
    if (i == 0 || count > best_count) {
      best = face;
      best_count = count;
    }
  }
  return best;
}

typedef struct carrier_context_t {
  const pcp_topology_complex_t* faces;
  const uint32_t* group_offsets;  // support face -> simplices (CSR)
  const uint32_t* group_items;
  const pcp_topology_complex_t* complex;
  pcp_topology_complex_t* image;
} carrier_context_t;

static pcp_status_t add_supported(void* context,
                                  const pcp_topology_vertex_t* face,
                                  uint32_t count) {
  carrier_context_t* c = (carrier_context_t*)context;
  if (count == 0)
    return pcp_ok_status();
  size_t index = 0;
  if (!pcp_topology_complex_find(
          c->faces, pcp_topology_make_simplex(face, count), &index)) {
    return pcp_ok_status();
  }
  for (uint32_t k = c->group_offsets[index]; k < c->group_offsets[index + 1];
       ++k) {
    pcp_topology_simplex_t s =
        pcp_topology_complex_simplex(c->complex, c->group_items[k]);
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_insert_sorted(
        c->image, s.vertices, s.count, NULL));
  }
  return pcp_ok_status();
}

// sigma -> every subdivided simplex whose vertex carriers all lie in sigma;
// the empty sigma -> {empty}.
static pcp_status_t round_build_carrier(round_t* round) {
  pcp_allocator_t allocator = round->allocator;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_carrier_map_create(
      round->base, round->complex, allocator, &round->carrier));
  meta_lookup_t lookup;
  pcp_status_t status = meta_lookup_build(round, &lookup);
  size_t face_count = pcp_topology_complex_count(round->faces);
  size_t simplex_count = pcp_topology_complex_count(round->complex);
  uint32_t* support = NULL;
  uint32_t* offsets = NULL;
  uint32_t* items = NULL;
  if (!status) {
    status = pcp_allocator_malloc(
        allocator, (simplex_count + 1) * sizeof(*support), (void**)&support);
  }
  if (!status) {
    status = pcp_allocator_calloc(
        allocator, (face_count + 2) * sizeof(*offsets), (void**)&offsets);
  }
  if (!status) {
    status = pcp_allocator_malloc(
        allocator, (simplex_count + 1) * sizeof(*items), (void**)&items);
  }
  if (!status) {
    for (size_t s = 0; s < simplex_count; ++s) {
      support[s] = support_of(round, &lookup,
                              pcp_topology_complex_simplex(round->complex, s));
      offsets[support[s] + 2]++;
    }
    for (size_t i = 2; i < face_count + 2; ++i) offsets[i] += offsets[i - 1];
    for (size_t s = 0; s < simplex_count; ++s) {
      items[offsets[support[s] + 1]++] = (uint32_t)s;
    }
  }
  pcp_topology_complex_t* image = NULL;
  if (!status)
    status = pcp_topology_complex_create(allocator, &image);
  carrier_context_t context = {round->faces, offsets, items, round->complex,
                               image};
  for (size_t f = 0; !status && f < face_count; ++f) {
    pcp_topology_simplex_t sigma =
        pcp_topology_complex_simplex(round->faces, f);
    pcp_topology_complex_clear(image);
    if (sigma.count == 0 || round->kind == PCP_TOPOLOGY_SUBDIVISION_IDENTITY) {
      // The identity carrier is f -> {f}; it may list only facets, so the
      // support grouping below (which needs every simplex listed) is skipped.
      status = pcp_topology_complex_insert_sorted(image, sigma.vertices,
                                                  sigma.count, NULL);
    } else {
      status =
          pcp_topology_simplex_for_each_face(sigma, add_supported, &context);
    }
    if (!status) {
      status = pcp_topology_carrier_map_set(round->carrier, sigma, image);
    }
  }
  pcp_topology_complex_release(image);
  pcp_allocator_free(allocator, support);
  pcp_allocator_free(allocator, offsets);
  pcp_allocator_free(allocator, items);
  pcp_topology_index_table_deinitialize(&lookup.table);
  return status;
}

static pcp_status_t identity_round(round_t* round) {
  size_t count = pcp_topology_complex_count(round->base);
  for (size_t i = 0; i < count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_append(
        round->complex, pcp_topology_complex_simplex(round->base, i)));
  }
  pcp_topology_vertex_list_t vertices;
  pcp_topology_vertex_list_initialize(round->allocator, &vertices);
  pcp_status_t status = pcp_topology_complex_vertices(round->base, &vertices);
  for (size_t i = 0; !status && i < vertices.count; ++i) {
    vertex_meta_t meta;
    memset(&meta, 0, sizeof(meta));
    meta.vertex = vertices.items[i];
    meta.has_source = true;
    meta.source = vertices.items[i];
    size_t face = 0;
    PCP_ASSERT(pcp_topology_complex_find(
        round->faces, pcp_topology_make_simplex(&vertices.items[i], 1), &face));
    meta.carrier_face = (uint32_t)face;
    status = meta_push(round, &meta);
  }
  pcp_topology_vertex_list_deinitialize(&vertices);
  return status;
}

static pcp_status_t round_run(const pcp_topology_complex_t* base,
                              pcp_topology_subdivision_kind_t kind,
                              uint32_t round_number, pcp_allocator_t allocator,
                              round_t* out_round) {
  memset(out_round, 0, sizeof(*out_round));
  out_round->allocator = allocator;
  out_round->base = base;
  out_round->kind = kind;
  pcp_status_t status =
      pcp_topology_complex_create(allocator, &out_round->faces);
  if (!status)
    status = pcp_topology_complex_create(allocator, &out_round->complex);
  if (!status)
    status = pcp_topology_complex_faces(base, out_round->faces);
  if (!status) {
    switch (kind) {
      case PCP_TOPOLOGY_SUBDIVISION_IDENTITY:
        status = identity_round(out_round);
        break;
      case PCP_TOPOLOGY_SUBDIVISION_BARYCENTRIC:
        status = barycentric_round(out_round, round_number);
        break;
      case PCP_TOPOLOGY_SUBDIVISION_CHROMATIC:
        status = chromatic_round(out_round);
        break;
      default:
        status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                                 "unknown subdivision kind %d", (int)kind);
    }
  }
  if (!status)
    status = round_build_carrier(out_round);
  if (status)
    round_deinitialize(out_round);
  return status;
}

//===----------------------------------------------------------------------===//
// Subdivisions
//===----------------------------------------------------------------------===//

pcp_status_t pcp_topology_subdivision_create(
    const pcp_topology_complex_t* input, pcp_topology_subdivision_kind_t kind,
    uint32_t rounds, pcp_allocator_t allocator,
    pcp_topology_subdivision_t** out_subdivision) {
  *out_subdivision = NULL;
  if ((unsigned)kind > PCP_TOPOLOGY_SUBDIVISION_CHROMATIC) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "unknown subdivision kind %d", (int)kind);
  }
  PCP_RETURN_IF_ERROR(pcp_topology_complex_validate(input, NULL),
                      "subdivision input");
  if (rounds == 0 || kind == PCP_TOPOLOGY_SUBDIVISION_IDENTITY) {
    kind = PCP_TOPOLOGY_SUBDIVISION_IDENTITY;
    rounds = 0;
  }
  pcp_topology_subdivision_t* sub = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*sub), (void**)&sub));
  sub->allocator = allocator;
  sub->input = input;
  sub->kind = kind;
  sub->rounds = rounds;
  pcp_status_t status =
      round_run(input, kind, rounds ? 1 : 0, allocator, &sub->last);
  if (!status) {
    sub->carrier = sub->last.carrier;
    sub->carrier_is_last = true;
  }
  for (uint32_t r = 2; !status && r <= rounds; ++r) {
    // The last round's complex becomes the base of the next one; keep it
    // alive because the new round's metadata points into it.
    round_t next;
    pcp_topology_complex_t* base = sub->last.complex;
    status = round_run(base, kind, r, allocator, &next);
    if (status)
      break;
    pcp_topology_carrier_map_t* composed = NULL;
    status = pcp_topology_carrier_map_compose_with_carrier(
        sub->carrier, next.carrier, allocator, &composed);
    if (status) {
      round_deinitialize(&next);
      break;
    }
    // Retire the previous round but keep its complex as |previous_owned|.
    if (!sub->carrier_is_last)
      pcp_topology_carrier_map_release(sub->carrier);
    sub->last.complex = NULL;
    round_deinitialize(&sub->last);
    pcp_topology_complex_release(sub->previous_owned);
    sub->previous_owned = base;
    sub->last = next;
    sub->carrier = composed;
    sub->carrier_is_last = false;
  }
  if (status) {
    pcp_topology_subdivision_release(sub);
    return status;
  }
  *out_subdivision = sub;
  return pcp_ok_status();
}

void pcp_topology_subdivision_release(pcp_topology_subdivision_t* subdivision) {
  if (!subdivision)
    return;
  if (!subdivision->carrier_is_last) {
    pcp_topology_carrier_map_release(subdivision->carrier);
  }
  round_deinitialize(&subdivision->last);
  pcp_topology_complex_release(subdivision->previous_owned);
  pcp_allocator_free(subdivision->allocator, subdivision);
}

const pcp_topology_complex_t* pcp_topology_subdivision_input(
    const pcp_topology_subdivision_t* subdivision) {
  return subdivision->input;
}

const pcp_topology_complex_t* pcp_topology_subdivision_complex(
    const pcp_topology_subdivision_t* subdivision) {
  return subdivision->last.complex;
}

const pcp_topology_carrier_map_t* pcp_topology_subdivision_carrier(
    const pcp_topology_subdivision_t* subdivision) {
  return subdivision->carrier;
}

pcp_topology_subdivision_kind_t pcp_topology_subdivision_kind(
    const pcp_topology_subdivision_t* subdivision) {
  return subdivision->kind;
}

uint32_t pcp_topology_subdivision_rounds(
    const pcp_topology_subdivision_t* subdivision) {
  return subdivision->rounds;
}

size_t pcp_topology_subdivision_metadata_count(
    const pcp_topology_subdivision_t* subdivision) {
  return subdivision->last.meta_count;
}

void pcp_topology_subdivision_metadata(
    const pcp_topology_subdivision_t* subdivision, size_t index,
    pcp_topology_subdivision_vertex_info_t* out_info) {
  PCP_ASSERT(index < subdivision->last.meta_count);
  const vertex_meta_t* meta = &subdivision->last.meta[index];
  memset(out_info, 0, sizeof(*out_info));
  out_info->vertex = meta->vertex;
  out_info->kind = subdivision->kind;
  out_info->round = subdivision->rounds;
  out_info->ordinal = (uint32_t)index;
  out_info->has_source = meta->has_source;
  out_info->source = meta->source;
  out_info->carrier =
      pcp_topology_complex_simplex(subdivision->last.faces, meta->carrier_face);
}

void pcp_topology_subdivision_counts(
    const pcp_topology_subdivision_t* subdivision, size_t* out_vertex_count,
    size_t* out_facet_count) {
  const pcp_topology_complex_t* complex = subdivision->last.complex;
  int32_t dimension = pcp_topology_complex_dimension(complex);
  size_t facets = 0;
  size_t count = pcp_topology_complex_count(complex);
  size_t vertices = 0;
  for (size_t i = 0; i < count; ++i) {
    int32_t d = pcp_topology_simplex_dimension(
        pcp_topology_complex_simplex(complex, i));
    if (d == dimension)
      ++facets;
    if (d == 0)
      ++vertices;
  }
  // Subdivisions list every simplex, so the listed 0-simplices are the
  // vertices; the identity subdivision lists the input as given.
  if (subdivision->kind == PCP_TOPOLOGY_SUBDIVISION_IDENTITY) {
    vertices = subdivision->last.meta_count;
  }
  if (out_vertex_count)
    *out_vertex_count = vertices;
  if (out_facet_count)
    *out_facet_count = facets;
}

pcp_topology_subdivision_options_t pcp_topology_subdivision_options_default(
    void) {
  pcp_topology_subdivision_options_t options;
  memset(&options, 0, sizeof(options));
  options.strict = true;
  options.rigid = true;
  options.chromatic = false;
  options.boundary = true;
  options.links = true;
  return options;
}

//===----------------------------------------------------------------------===//
// Protocol-power validator
//===----------------------------------------------------------------------===//

#define META_ERROR(...)                                                      \
  pcp_topology_make_status(PCP_TOPOLOGY_ERROR_SUBDIVISION_METADATA_MISMATCH, \
                           __VA_ARGS__)

static pcp_status_t validate_metadata(
    const pcp_topology_subdivision_t* sub,
    pcp_topology_subdivision_options_t options, size_t* out_vertex_count) {
  const round_t* round = &sub->last;
  pcp_topology_vertex_list_t vertices;
  pcp_topology_vertex_list_initialize(sub->allocator, &vertices);
  pcp_status_t status =
      pcp_topology_complex_vertices(round->complex, &vertices);
  size_t vertex_count = vertices.count;
  pcp_topology_vertex_list_deinitialize(&vertices);
  PCP_RETURN_IF_ERROR_BARE(status);
  *out_vertex_count = vertex_count;
  if (round->meta_count != vertex_count) {
    return META_ERROR("%zu metadata entries for %zu vertices",
                      round->meta_count, vertex_count);
  }
  if (options.check_kind && options.expected_kind != sub->kind) {
    return META_ERROR(
        "kind %s, expected %s", pcp_topology_subdivision_kind_name(sub->kind),
        pcp_topology_subdivision_kind_name(options.expected_kind));
  }
  if (options.check_round && options.expected_round != sub->rounds) {
    return META_ERROR("round %u, expected %u", sub->rounds,
                      options.expected_round);
  }
  char text[512];
  for (size_t i = 0; i < round->meta_count; ++i) {
    const vertex_meta_t* meta = &round->meta[i];
    // Ordinals are positions, unique by construction; the label carries it.
    if (sub->kind != PCP_TOPOLOGY_SUBDIVISION_IDENTITY &&
        (meta->vertex.label.kind != PCP_TOPOLOGY_LABEL_PROTOCOL ||
         meta->vertex.label.value != (int64_t)i)) {
      return META_ERROR("vertex %zu does not carry ordinal %zu", i, i);
    }
    pcp_topology_simplex_t carrier =
        pcp_topology_complex_simplex(round->faces, meta->carrier_face);
    if (carrier.count == 0 ||
        !pcp_topology_complex_contains(round->base, carrier)) {
      return META_ERROR(
          "vertex %zu has carrier %s outside the subdivided "
          "complex",
          i, pcp_topology_simplex_cstr(carrier, text, sizeof(text)));
    }
    switch (sub->kind) {
      case PCP_TOPOLOGY_SUBDIVISION_IDENTITY:
        if (!meta->has_source ||
            !pcp_topology_vertex_equal(&meta->vertex, &meta->source) ||
            carrier.count != 1 ||
            !pcp_topology_vertex_equal(&carrier.vertices[0], &meta->source)) {
          return META_ERROR("identity vertex %zu is not its own source", i);
        }
        break;
      case PCP_TOPOLOGY_SUBDIVISION_BARYCENTRIC:
        if (meta->has_source ||
            !pcp_topology_color_equal(
                meta->vertex.color,
                pcp_topology_make_color(PCP_TOPOLOGY_COLOR_PROCESS,
                                        carrier.count - 1))) {
          return META_ERROR(
              "barycentric vertex %zu: colour is not "
              "process(dim carrier)",
              i);
        }
        break;
      case PCP_TOPOLOGY_SUBDIVISION_CHROMATIC:
        if (!meta->has_source ||
            !pcp_topology_simplex_contains_vertex(carrier, &meta->source) ||
            !pcp_topology_color_equal(meta->vertex.color, meta->source.color)) {
          return META_ERROR(
              "chromatic vertex %zu: source outside its view or "
              "colour changed",
              i);
        }
        break;
    }
  }
  return pcp_ok_status();
}

static pcp_status_t validate_simplices(const round_t* round,
                                       const meta_lookup_t* lookup) {
  size_t count = pcp_topology_complex_count(round->complex);
  char text[512];
  for (size_t s = 0; s < count; ++s) {
    pcp_topology_simplex_t simplex =
        pcp_topology_complex_simplex(round->complex, s);
    for (uint32_t i = 0; i < simplex.count; ++i) {
      uint32_t a = 0;
      if (!meta_find(lookup, &simplex.vertices[i], &a)) {
        return META_ERROR(
            "vertex of %s has no metadata",
            pcp_topology_simplex_cstr(simplex, text, sizeof(text)));
      }
      for (uint32_t j = i + 1; j < simplex.count; ++j) {
        uint32_t b = 0;
        if (!meta_find(lookup, &simplex.vertices[j], &b)) {
          return META_ERROR(
              "vertex of %s has no metadata",
              pcp_topology_simplex_cstr(simplex, text, sizeof(text)));
        }
        bool ok = true;
        if (round->kind == PCP_TOPOLOGY_SUBDIVISION_BARYCENTRIC) {
          pcp_topology_simplex_t ca = pcp_topology_complex_simplex(
              round->faces, round->meta[a].carrier_face);
          pcp_topology_simplex_t cb = pcp_topology_complex_simplex(
              round->faces, round->meta[b].carrier_face);
          ok = round->meta[a].carrier_face != round->meta[b].carrier_face &&
               (pcp_topology_simplex_is_subset(ca, cb) ||
                pcp_topology_simplex_is_subset(cb, ca));
        } else if (round->kind == PCP_TOPOLOGY_SUBDIVISION_CHROMATIC) {
          ok = chromatic_compatible(round, a, b);
        }
        if (!ok) {
          return pcp_topology_make_status(
              PCP_TOPOLOGY_ERROR_SUBDIVISION_SIMPLEX_MISMATCH,
              "simplex %s breaks the %s view rules",
              pcp_topology_simplex_cstr(simplex, text, sizeof(text)),
              pcp_topology_subdivision_kind_name(round->kind));
        }
      }
    }
  }
  return pcp_ok_status();
}

// Faces of |image| whose vertex carriers all lie in |tau|, into |out|.
static pcp_status_t carried_part(const round_t* round,
                                 const meta_lookup_t* lookup,
                                 const pcp_topology_complex_t* image,
                                 pcp_topology_simplex_t tau,
                                 pcp_topology_complex_t* out) {
  pcp_topology_complex_clear(out);
  size_t count = pcp_topology_complex_count(image);
  for (size_t s = 0; s < count; ++s) {
    pcp_topology_simplex_t simplex = pcp_topology_complex_simplex(image, s);
    bool inside = true;
    for (uint32_t i = 0; inside && i < simplex.count; ++i) {
      uint32_t m = 0;
      inside = meta_find(lookup, &simplex.vertices[i], &m) &&
               pcp_topology_simplex_is_subset(
                   pcp_topology_complex_simplex(round->faces,
                                                round->meta[m].carrier_face),
                   tau);
    }
    if (simplex.count == 0 || inside) {
      PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_insert_sorted(
          out, simplex.vertices, simplex.count, NULL));
    }
  }
  return pcp_ok_status();
}

typedef struct power_context_t {
  const round_t* round;
  const meta_lookup_t* lookup;
  const pcp_topology_complex_t* sigma_image;
  pcp_topology_simplex_t sigma;
  pcp_topology_complex_t* scratch;
  pcp_topology_complex_t* boundary_union;
  pcp_topology_subdivision_report_t* report;
} power_context_t;

static pcp_status_t check_face_restriction(void* context,
                                           const pcp_topology_vertex_t* face,
                                           uint32_t count) {
  power_context_t* c = (power_context_t*)context;
  pcp_topology_simplex_t tau = pcp_topology_make_simplex(face, count);
  const pcp_topology_complex_t* tau_image =
      pcp_topology_carrier_map_lookup(c->round->carrier, tau);
  char a[512], b[512];
  if (!tau_image ||
      !pcp_topology_complex_is_subcomplex(tau_image, c->sigma_image)) {
    return pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_SUBDIVISION_FACE_RESTRICTION_MISMATCH,
        "img %s is not inside img %s",
        pcp_topology_simplex_cstr(tau, a, sizeof(a)),
        pcp_topology_simplex_cstr(c->sigma, b, sizeof(b)));
  }
  PCP_RETURN_IF_ERROR_BARE(
      carried_part(c->round, c->lookup, c->sigma_image, tau, c->scratch));
  if (!pcp_topology_complex_equal_by_closure(tau_image, c->scratch)) {
    return pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_SUBDIVISION_FACE_RESTRICTION_MISMATCH,
        "img %s differs from the part of img %s it carries",
        pcp_topology_simplex_cstr(tau, a, sizeof(a)),
        pcp_topology_simplex_cstr(c->sigma, b, sizeof(b)));
  }
  c->report->face_restriction_checks++;
  // Codimension-1 faces feed the boundary check.
  if (count + 1 == c->sigma.count) {
    size_t n = pcp_topology_complex_count(tau_image);
    for (size_t s = 0; s < n; ++s) {
      pcp_topology_simplex_t simplex =
          pcp_topology_complex_simplex(tau_image, s);
      PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_insert_sorted(
          c->boundary_union, simplex.vertices, simplex.count, NULL));
    }
  }
  return pcp_ok_status();
}

static pcp_status_t check_links(power_context_t* c) {
  // Each metadata vertex of the image: its link in the image is a valid
  // complex, misses the centre, and joins back into the image.
  pcp_topology_vertex_list_t vertices;
  pcp_topology_vertex_list_initialize(c->round->allocator, &vertices);
  pcp_topology_complex_t* link = NULL;
  pcp_status_t status =
      pcp_topology_complex_vertices(c->sigma_image, &vertices);
  if (!status)
    status = pcp_topology_complex_create(c->round->allocator, &link);
  pcp_topology_vertex_t joined[PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES + 2];
  char text[256];
  for (size_t v = 0; !status && v < vertices.count; ++v) {
    uint32_t m = 0;
    if (!meta_find(c->lookup, &vertices.items[v], &m))
      continue;
    pcp_topology_simplex_t center =
        pcp_topology_make_simplex(&vertices.items[v], 1);
    status = pcp_topology_complex_link(c->sigma_image, center, link);
    if (!status)
      status = pcp_topology_complex_validate(link, NULL);
    size_t n = status ? 0 : pcp_topology_complex_count(link);
    for (size_t s = 0; !status && s < n; ++s) {
      pcp_topology_simplex_t face = pcp_topology_complex_simplex(link, s);
      if (!pcp_topology_simplex_disjoint(face, center) ||
          face.count + 1 > PCP_ARRAYSIZE(joined)) {
        status = pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_SUBDIVISION_LINK_MISMATCH,
            "the link of %s meets its centre",
            pcp_topology_vertex_cstr(&vertices.items[v], text, sizeof(text)));
        break;
      }
      if (face.count) {
        memcpy(joined, face.vertices, face.count * sizeof(*joined));
      }
      joined[face.count] = vertices.items[v];
      if (!pcp_topology_complex_contains(
              c->sigma_image,
              pcp_topology_make_simplex(joined, face.count + 1))) {
        status = pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_SUBDIVISION_LINK_MISMATCH,
            "a link face of %s does not join back into the image",
            pcp_topology_vertex_cstr(&vertices.items[v], text, sizeof(text)));
      }
    }
    if (!status)
      c->report->link_checks++;
  }
  pcp_topology_complex_release(link);
  pcp_topology_vertex_list_deinitialize(&vertices);
  return status;
}

pcp_status_t pcp_topology_subdivision_validate(
    const pcp_topology_subdivision_t* subdivision,
    pcp_topology_subdivision_options_t options,
    pcp_topology_subdivision_report_t* out_report) {
  memset(out_report, 0, sizeof(*out_report));
  const round_t* round = &subdivision->last;
  pcp_allocator_t allocator = subdivision->allocator;
  // 1. The carrier (input -> result, composed across rounds).
  pcp_topology_carrier_checks_t checks = {true, options.strict, options.rigid,
                                          options.chromatic};
  PCP_RETURN_IF_ERROR(
      pcp_topology_carrier_map_validate(subdivision->carrier, checks),
      "subdivision carrier");
  // 2. Metadata.
  size_t vertex_count = 0;
  PCP_RETURN_IF_ERROR_BARE(
      validate_metadata(subdivision, options, &vertex_count));
  out_report->vertex_count = vertex_count;
  out_report->metadata_count = round->meta_count;
  size_t count = pcp_topology_complex_count(round->complex);
  int32_t dimension = pcp_topology_complex_dimension(round->complex);
  for (size_t s = 0; s < count; ++s) {
    if (pcp_topology_simplex_dimension(
            pcp_topology_complex_simplex(round->complex, s)) == dimension) {
      out_report->top_facet_count++;
    }
  }
  // 3. Per-simplex view rules (last round).
  meta_lookup_t lookup;
  pcp_status_t status = meta_lookup_build(round, &lookup);
  if (!status)
    status = validate_simplices(round, &lookup);
  // 4-7 over the last round's carrier (base -> result).
  pcp_topology_complex_t* expected = NULL;
  pcp_topology_complex_t* scratch = NULL;
  pcp_topology_complex_t* boundary = NULL;
  pcp_topology_complex_t* boundary_union = NULL;
  pcp_topology_complex_t* closed = NULL;
  if (!status)
    status = pcp_topology_complex_create(allocator, &closed);
  if (!status)
    status = pcp_topology_complex_faces(round->complex, closed);
  if (!status)
    status = pcp_topology_complex_create(allocator, &expected);
  if (!status)
    status = pcp_topology_complex_create(allocator, &scratch);
  if (!status)
    status = pcp_topology_complex_create(allocator, &boundary);
  if (!status)
    status = pcp_topology_complex_create(allocator, &boundary_union);
  size_t entries = pcp_topology_carrier_map_count(round->carrier);
  char text[512];
  for (size_t e = 0; !status && e < entries; ++e) {
    pcp_topology_simplex_t sigma =
        pcp_topology_carrier_map_entry_simplex(round->carrier, e);
    const pcp_topology_complex_t* image =
        pcp_topology_carrier_map_entry_image(round->carrier, e);
    // 4. The image is exactly the faces carried inside sigma.
    if (sigma.count == 0) {
      pcp_topology_complex_clear(expected);
      status = pcp_topology_complex_insert_sorted(expected, NULL, 0, NULL);
    } else {
      status = carried_part(round, &lookup, closed, sigma, expected);
    }
    if (status)
      break;
    if (!pcp_topology_complex_equal_by_closure(image, expected)) {
      status = pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_SUBDIVISION_CARRIER_MISMATCH,
          "img %s is not the set of faces carried inside it",
          pcp_topology_simplex_cstr(sigma, text, sizeof(text)));
      break;
    }
    // 5. Face restrictions (and the codim-1 union for 6).
    pcp_topology_complex_clear(boundary_union);
    power_context_t context = {round,   &lookup,        image,     sigma,
                               scratch, boundary_union, out_report};
    status = pcp_topology_simplex_for_each_face(sigma, check_face_restriction,
                                                &context);
    if (status)
      break;
    // 6. Boundary of the image = union of the codim-1 face images.
    if (options.boundary && sigma.count >= 2) {
      status = pcp_topology_complex_boundary(image, boundary);
      if (status)
        break;
      if (!pcp_topology_complex_equal_by_closure(boundary, boundary_union)) {
        status = pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_SUBDIVISION_BOUNDARY_MISMATCH,
            "the boundary of img %s is not the union of its facets' images",
            pcp_topology_simplex_cstr(sigma, text, sizeof(text)));
        break;
      }
      out_report->boundary_checks++;
    }
    // 7. Links.
    if (options.links && sigma.count > 0)
      status = check_links(&context);
  }
  pcp_topology_complex_release(closed);
  pcp_topology_complex_release(expected);
  pcp_topology_complex_release(scratch);
  pcp_topology_complex_release(boundary);
  pcp_topology_complex_release(boundary_union);
  pcp_topology_index_table_deinitialize(&lookup.table);
  return status;
}

pcp_status_t pcp_topology_subdivision_validate_iterated(
    const pcp_topology_complex_t* input, pcp_topology_subdivision_kind_t kind,
    uint32_t rounds, pcp_allocator_t allocator) {
  if (rounds == 0)
    return pcp_ok_status();
  pcp_topology_subdivision_t* full = NULL;
  pcp_topology_subdivision_t* prefix = NULL;
  pcp_topology_subdivision_t* step = NULL;
  pcp_topology_carrier_map_t* composed = NULL;
  pcp_status_t status =
      pcp_topology_subdivision_create(input, kind, rounds, allocator, &full);
  if (!status) {
    status = pcp_topology_subdivision_create(input, kind, rounds - 1, allocator,
                                             &prefix);
  }
  if (!status) {
    status = pcp_topology_subdivision_create(
        pcp_topology_subdivision_complex(prefix), kind, 1, allocator, &step);
  }
  if (!status) {
    status = pcp_topology_carrier_map_compose_with_carrier(
        prefix->carrier, step->carrier, allocator, &composed);
  }
  if (!status && !pcp_topology_complex_equal_by_closure(full->last.complex,
                                                        step->last.complex)) {
    status = pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_SUBDIVISION_EQUIVALENCE_MISMATCH,
        "%u rounds differ from %u rounds plus one", rounds, rounds - 1);
  }
  size_t entries = status ? 0 : pcp_topology_carrier_map_count(full->carrier);
  for (size_t e = 0; !status && e < entries; ++e) {
    pcp_topology_simplex_t sigma =
        pcp_topology_carrier_map_entry_simplex(full->carrier, e);
    const pcp_topology_complex_t* other =
        pcp_topology_carrier_map_lookup(composed, sigma);
    if (!other ||
        !pcp_topology_complex_equal_by_closure(
            pcp_topology_carrier_map_entry_image(full->carrier, e), other)) {
      char text[512];
      status = pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_SUBDIVISION_EQUIVALENCE_MISMATCH,
          "the iterated carrier of %s differs from prefix then one round",
          pcp_topology_simplex_cstr(sigma, text, sizeof(text)));
    }
  }
  // Metadata of the last round is carried by faces of the prefix complex.
  if (!status && full->last.meta_count != step->last.meta_count) {
    status = pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_SUBDIVISION_EQUIVALENCE_MISMATCH,
        "%zu metadata entries, %zu after prefix then one round",
        full->last.meta_count, step->last.meta_count);
  }
  for (size_t i = 0; !status && i < full->last.meta_count; ++i) {
    pcp_topology_simplex_t carrier = pcp_topology_complex_simplex(
        full->last.faces, full->last.meta[i].carrier_face);
    if (!pcp_topology_complex_contains(prefix->last.complex, carrier) ||
        !pcp_topology_vertex_equal(&full->last.meta[i].vertex,
                                   &step->last.meta[i].vertex)) {
      status = pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_SUBDIVISION_EQUIVALENCE_MISMATCH,
          "metadata %zu disagrees with the prefix complex", i);
    }
  }
  pcp_topology_carrier_map_release(composed);
  pcp_topology_subdivision_release(step);
  pcp_topology_subdivision_release(prefix);
  pcp_topology_subdivision_release(full);
  return status;
}
