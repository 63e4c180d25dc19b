// SPDX-License-Identifier: Apache-2.0
//
// Vertex maps, simplicial carrier maps, the carried decision-map check and
// the index-based carrier API (reference s.1.5-1.7, s.2.1-2.2).

#include <stdlib.h>
#include <string.h>

#include "topology/complex_impl.h"
#include "topology/core_impl.h"

//===----------------------------------------------------------------------===//
// Vertex maps
//===----------------------------------------------------------------------===//

struct pcp_topology_vertex_map_t {
  pcp_allocator_t allocator;
  const pcp_topology_complex_t* domain;
  const pcp_topology_complex_t* codomain;
  pcp_topology_vertex_t* sources;
  pcp_topology_vertex_t* targets;
  size_t count;
  size_t capacity;
  // source -> first entry with that source.
  pcp_topology_index_table_t lookup;
};

pcp_status_t pcp_topology_vertex_map_create(
    const pcp_topology_complex_t* domain,
    const pcp_topology_complex_t* codomain, pcp_allocator_t allocator,
    pcp_topology_vertex_map_t** out_map) {
  *out_map = NULL;
  pcp_topology_vertex_map_t* map = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*map), (void**)&map));
  map->allocator = allocator;
  map->domain = domain;
  map->codomain = codomain;
  pcp_topology_index_table_initialize(allocator, &map->lookup);
  *out_map = map;
  return pcp_ok_status();
}

void pcp_topology_vertex_map_release(pcp_topology_vertex_map_t* map) {
  if (!map)
    return;
  pcp_topology_index_table_deinitialize(&map->lookup);
  pcp_allocator_free(map->allocator, map->sources);
  pcp_allocator_free(map->allocator, map->targets);
  pcp_allocator_free(map->allocator, map);
}

const pcp_topology_complex_t* pcp_topology_vertex_map_domain(
    const pcp_topology_vertex_map_t* map) {
  return map->domain;
}

const pcp_topology_complex_t* pcp_topology_vertex_map_codomain(
    const pcp_topology_vertex_map_t* map) {
  return map->codomain;
}

static bool source_eq(const void* context, uint32_t value, const void* key) {
  const pcp_topology_vertex_map_t* map =
      (const pcp_topology_vertex_map_t*)context;
  return pcp_topology_vertex_equal(&map->sources[value],
                                   (const pcp_topology_vertex_t*)key);
}

static bool find_source(const pcp_topology_vertex_map_t* map,
                        const pcp_topology_vertex_t* source,
                        uint32_t* out_index) {
  return pcp_topology_index_table_find(&map->lookup,
                                       pcp_topology_vertex_hash(source),
                                       source_eq, map, source, out_index);
}

pcp_status_t pcp_topology_vertex_map_set(pcp_topology_vertex_map_t* map,
                                         const pcp_topology_vertex_t* source,
                                         const pcp_topology_vertex_t* target) {
  size_t needed = map->count + 1;
  if (needed > map->capacity) {
    size_t c1 = map->capacity, c2 = map->capacity;
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_grow(map->allocator,
                                               sizeof(*map->sources), needed,
                                               (void**)&map->sources, &c1));
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_grow(map->allocator,
                                               sizeof(*map->targets), needed,
                                               (void**)&map->targets, &c2));
    map->capacity = c1;
  }
  uint32_t existing = 0;
  bool seen = find_source(map, source, &existing);
  size_t index = map->count;
  map->sources[index] = *source;
  map->targets[index] = *target;
  map->count = needed;
  if (!seen) {
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_index_table_insert(
        &map->lookup, pcp_topology_vertex_hash(source), (uint32_t)index));
  }
  return pcp_ok_status();
}

size_t pcp_topology_vertex_map_count(const pcp_topology_vertex_map_t* map) {
  return map->count;
}

void pcp_topology_vertex_map_entry(const pcp_topology_vertex_map_t* map,
                                   size_t index,
                                   pcp_topology_vertex_t* out_source,
                                   pcp_topology_vertex_t* out_target) {
  PCP_ASSERT(index < map->count);
  if (out_source)
    *out_source = map->sources[index];
  if (out_target)
    *out_target = map->targets[index];
}

bool pcp_topology_vertex_map_lookup(const pcp_topology_vertex_map_t* map,
                                    const pcp_topology_vertex_t* source,
                                    pcp_topology_vertex_t* out_target) {
  uint32_t index = 0;
  if (!find_source(map, source, &index))
    return false;
  if (out_target)
    *out_target = map->targets[index];
  return true;
}

pcp_status_t pcp_topology_vertex_map_apply(
    const pcp_topology_vertex_map_t* map, pcp_topology_simplex_t simplex,
    pcp_topology_vertex_list_t* out_image) {
  pcp_topology_vertex_list_clear(out_image);
  for (uint32_t i = 0; i < simplex.count; ++i) {
    pcp_topology_vertex_t target;
    if (!pcp_topology_vertex_map_lookup(map, &simplex.vertices[i], &target)) {
      char text[256];
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_MISSING_VERTEX_MAP_ENTRY,
          "vertex %s is not mapped",
          pcp_topology_vertex_cstr(&simplex.vertices[i], text, sizeof(text)));
    }
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_vertex_list_append(out_image, &target));
  }
  pcp_topology_vertices_sort(out_image->items, out_image->count);
  size_t kept = 0;
  for (size_t i = 0; i < out_image->count; ++i) {
    if (kept && pcp_topology_vertex_equal(&out_image->items[kept - 1],
                                          &out_image->items[i])) {
      continue;
    }
    out_image->items[kept++] = out_image->items[i];
  }
  out_image->count = kept;
  return pcp_ok_status();
}

static bool complex_has_vertex(const pcp_topology_complex_t* complex,
                               const pcp_topology_vertex_t* vertex) {
  return pcp_topology_complex_contains(complex,
                                       pcp_topology_make_simplex(vertex, 1));
}

pcp_status_t pcp_topology_vertex_map_validate(
    const pcp_topology_vertex_map_t* map,
    pcp_topology_vertex_map_checks_t checks) {
  PCP_RETURN_IF_ERROR(pcp_topology_complex_validate(map->domain, NULL),
                      "vertex map domain");
  PCP_RETURN_IF_ERROR(pcp_topology_complex_validate(map->codomain, NULL),
                      "vertex map codomain");
  char a[256], b[256];
  for (size_t i = 0; i < map->count; ++i) {
    const pcp_topology_vertex_t* source = &map->sources[i];
    const pcp_topology_vertex_t* target = &map->targets[i];
    if (!complex_has_vertex(map->domain, source)) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_SOURCE_VERTEX_OUTSIDE_DOMAIN,
          "source %s is not a domain vertex",
          pcp_topology_vertex_cstr(source, a, sizeof(a)));
    }
    uint32_t first = 0;
    if (find_source(map, source, &first) && first != i) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_DUPLICATE_VERTEX_MAP_SOURCE,
          "source %s is mapped by entries %u and %zu",
          pcp_topology_vertex_cstr(source, a, sizeof(a)), first, i);
    }
    if (!complex_has_vertex(map->codomain, target)) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_TARGET_VERTEX_OUTSIDE_CODOMAIN,
          "target %s of %s is not a codomain vertex",
          pcp_topology_vertex_cstr(target, a, sizeof(a)),
          pcp_topology_vertex_cstr(source, b, sizeof(b)));
    }
    if (checks.require_color_preserving &&
        !pcp_topology_color_equal(source->color, target->color)) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_NON_COLOR_PRESERVING_MAP, "%s maps to %s",
          pcp_topology_vertex_cstr(source, a, sizeof(a)),
          pcp_topology_vertex_cstr(target, b, sizeof(b)));
    }
  }
  pcp_allocator_t allocator = map->allocator;
  pcp_topology_vertex_list_t vertices;
  pcp_topology_vertex_list_initialize(allocator, &vertices);
  pcp_status_t status = pcp_topology_complex_vertices(map->domain, &vertices);
  for (size_t i = 0; !status && i < vertices.count; ++i) {
    if (!pcp_topology_vertex_map_lookup(map, &vertices.items[i], NULL)) {
      status = pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_MISSING_VERTEX_MAP_ENTRY,
          "domain vertex %s has no entry",
          pcp_topology_vertex_cstr(&vertices.items[i], a, sizeof(a)));
    }
  }
  pcp_topology_vertex_list_deinitialize(&vertices);
  if (status)
    return status;

  pcp_topology_complex_t* faces = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(allocator, &faces));
  pcp_topology_vertex_list_t image;
  pcp_topology_vertex_list_initialize(allocator, &image);
  status = pcp_topology_complex_faces(map->domain, faces);
  size_t face_count = pcp_topology_complex_count(faces);
  for (size_t i = 0; !status && i < face_count; ++i) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, i);
    status = pcp_topology_vertex_map_apply(map, face, &image);
    if (status)
      break;
    pcp_topology_simplex_t mapped =
        pcp_topology_make_simplex(image.items, image.count);
    if (!pcp_topology_complex_contains(map->codomain, mapped)) {
      char c[512], d[512];
      status = pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_NON_SIMPLICIAL_MAP,
          "face %s maps to %s, which is not a codomain simplex",
          pcp_topology_simplex_cstr(face, c, sizeof(c)),
          pcp_topology_simplex_cstr(mapped, d, sizeof(d)));
    } else if (checks.require_rigid && mapped.count != face.count) {
      char c[512], d[512];
      status = pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_NON_RIGID_MAP, "face %s collapses to %s",
          pcp_topology_simplex_cstr(face, c, sizeof(c)),
          pcp_topology_simplex_cstr(mapped, d, sizeof(d)));
    }
  }
  pcp_topology_vertex_list_deinitialize(&image);
  pcp_topology_complex_release(faces);
  return status;
}

// Lists the images of the faces of |source| into |out|, optionally checking
// each against |target|.
static pcp_status_t map_faces(const pcp_topology_vertex_map_t* map,
                              const pcp_topology_complex_t* source,
                              const pcp_topology_complex_t* target,
                              pcp_topology_complex_t* out_complex) {
  pcp_topology_complex_clear(out_complex);
  pcp_topology_complex_t* faces = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(map->allocator, &faces));
  pcp_topology_vertex_list_t image;
  pcp_topology_vertex_list_initialize(map->allocator, &image);
  pcp_status_t status = pcp_topology_complex_faces(source, faces);
  size_t face_count = pcp_topology_complex_count(faces);
  for (size_t i = 0; !status && i < face_count; ++i) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, i);
    status = pcp_topology_vertex_map_apply(map, face, &image);
    if (status)
      break;
    pcp_topology_simplex_t mapped =
        pcp_topology_make_simplex(image.items, image.count);
    if (target && !pcp_topology_complex_contains(target, mapped)) {
      char c[512], d[512];
      status = pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_SUBCOMPLEX_IMAGE_OUTSIDE_TARGET,
          "face %s maps to %s outside the target",
          pcp_topology_simplex_cstr(face, c, sizeof(c)),
          pcp_topology_simplex_cstr(mapped, d, sizeof(d)));
      break;
    }
    status = pcp_topology_complex_insert_sorted(out_complex, image.items,
                                                (uint32_t)image.count, NULL);
  }
  pcp_topology_vertex_list_deinitialize(&image);
  pcp_topology_complex_release(faces);
  return status;
}

pcp_status_t pcp_topology_vertex_map_image(
    const pcp_topology_vertex_map_t* map, const pcp_topology_complex_t* source,
    pcp_topology_complex_t* out_complex) {
  if (!source)
    source = map->domain;
  if (source != map->domain &&
      !pcp_topology_complex_is_subcomplex(source, map->domain)) {
    return pcp_topology_make_status(PCP_TOPOLOGY_ERROR_COMPLEX_MISMATCH,
                                    "mapped complex is not inside the domain");
  }
  return map_faces(map, source, NULL, out_complex);
}

pcp_status_t pcp_topology_subcomplex_image(
    const pcp_topology_complex_t* sub, const pcp_topology_vertex_map_t* map,
    const pcp_topology_complex_t* target, pcp_topology_complex_t* out_complex) {
  return map_faces(map, sub, target, out_complex);
}

pcp_status_t pcp_topology_vertex_map_compose(
    const pcp_topology_vertex_map_t* first,
    const pcp_topology_vertex_map_t* second, pcp_allocator_t allocator,
    pcp_topology_vertex_map_t** out_map) {
  *out_map = NULL;
  pcp_topology_vertex_map_t* map = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_vertex_map_create(
      first->domain, second->codomain, allocator, &map));
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; !status && i < first->count; ++i) {
    pcp_topology_vertex_t target;
    if (!pcp_topology_vertex_map_lookup(second, &first->targets[i], &target)) {
      char text[256];
      status = pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_MISSING_VERTEX_MAP_ENTRY,
          "%s is not mapped by the second map",
          pcp_topology_vertex_cstr(&first->targets[i], text, sizeof(text)));
      break;
    }
    status = pcp_topology_vertex_map_set(map, &first->sources[i], &target);
  }
  if (status) {
    pcp_topology_vertex_map_release(map);
    return status;
  }
  *out_map = map;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Carrier maps
//===----------------------------------------------------------------------===//

struct pcp_topology_carrier_map_t {
  pcp_allocator_t allocator;
  const pcp_topology_complex_t* domain;
  const pcp_topology_complex_t* codomain;
  pcp_topology_complex_t* keys;  // entry simplices, sorted copies, in order
  pcp_topology_complex_t** images;
  size_t image_capacity;
};

pcp_status_t pcp_topology_carrier_map_create(
    const pcp_topology_complex_t* domain,
    const pcp_topology_complex_t* codomain, pcp_allocator_t allocator,
    pcp_topology_carrier_map_t** out_map) {
  *out_map = NULL;
  pcp_topology_carrier_map_t* map = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*map), (void**)&map));
  map->allocator = allocator;
  map->domain = domain;
  map->codomain = codomain;
  pcp_status_t status = pcp_topology_complex_create(allocator, &map->keys);
  if (status) {
    pcp_allocator_free(allocator, map);
    return status;
  }
  *out_map = map;
  return pcp_ok_status();
}

void pcp_topology_carrier_map_release(pcp_topology_carrier_map_t* map) {
  if (!map)
    return;
  size_t count = pcp_topology_complex_count(map->keys);
  for (size_t i = 0; i < count; ++i) {
    pcp_topology_complex_release(map->images[i]);
  }
  pcp_allocator_free(map->allocator, map->images);
  pcp_topology_complex_release(map->keys);
  pcp_allocator_free(map->allocator, map);
}

const pcp_topology_complex_t* pcp_topology_carrier_map_domain(
    const pcp_topology_carrier_map_t* map) {
  return map->domain;
}

const pcp_topology_complex_t* pcp_topology_carrier_map_codomain(
    const pcp_topology_carrier_map_t* map) {
  return map->codomain;
}

// Takes ownership of |closed_image| (already closed) on success and failure.
static pcp_status_t carrier_push(pcp_topology_carrier_map_t* map,
                                 pcp_topology_simplex_t simplex,
                                 pcp_topology_complex_t* closed_image) {
  size_t count = pcp_topology_complex_count(map->keys);
  pcp_status_t status =
      pcp_topology_grow(map->allocator, sizeof(*map->images), count + 1,
                        (void**)&map->images, &map->image_capacity);
  pcp_topology_vertex_t small[16];
  pcp_topology_vertex_t* sorted = small;
  if (!status && simplex.count > PCP_ARRAYSIZE(small)) {
    status = pcp_allocator_malloc(
        map->allocator, simplex.count * sizeof(*sorted), (void**)&sorted);
  }
  if (status) {
    pcp_topology_complex_release(closed_image);
    return status;
  }
  if (simplex.count) {
    memcpy(sorted, simplex.vertices, simplex.count * sizeof(*sorted));
  }
  pcp_topology_vertices_sort(sorted, simplex.count);
  status = pcp_topology_complex_append(
      map->keys, pcp_topology_make_simplex(sorted, simplex.count));
  if (sorted != small)
    pcp_allocator_free(map->allocator, sorted);
  if (status) {
    pcp_topology_complex_release(closed_image);
    return status;
  }
  map->images[count] = closed_image;
  return pcp_ok_status();
}

pcp_status_t pcp_topology_carrier_map_set(pcp_topology_carrier_map_t* map,
                                          pcp_topology_simplex_t simplex,
                                          const pcp_topology_complex_t* image) {
  pcp_topology_complex_t* closed = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_complex_create(map->allocator, &closed));
  pcp_status_t status = pcp_topology_complex_faces(image, closed);
  if (status) {
    pcp_topology_complex_release(closed);
    return status;
  }
  return carrier_push(map, simplex, closed);
}

size_t pcp_topology_carrier_map_count(const pcp_topology_carrier_map_t* map) {
  return pcp_topology_complex_count(map->keys);
}

pcp_topology_simplex_t pcp_topology_carrier_map_entry_simplex(
    const pcp_topology_carrier_map_t* map, size_t index) {
  return pcp_topology_complex_simplex(map->keys, index);
}

const pcp_topology_complex_t* pcp_topology_carrier_map_entry_image(
    const pcp_topology_carrier_map_t* map, size_t index) {
  PCP_ASSERT(index < pcp_topology_complex_count(map->keys));
  return map->images[index];
}

const pcp_topology_complex_t* pcp_topology_carrier_map_lookup(
    const pcp_topology_carrier_map_t* map, pcp_topology_simplex_t simplex) {
  size_t index = 0;
  if (!pcp_topology_complex_find(map->keys, simplex, &index))
    return NULL;
  return map->images[index];
}

bool pcp_topology_carrier_map_carries(const pcp_topology_carrier_map_t* map,
                                      pcp_topology_simplex_t input,
                                      pcp_topology_simplex_t output) {
  const pcp_topology_complex_t* image =
      pcp_topology_carrier_map_lookup(map, input);
  return image && pcp_topology_complex_contains(image, output);
}

typedef struct color_set_t {
  pcp_topology_color_t* items;
  size_t count;
  size_t capacity;
} color_set_t;

static pcp_status_t color_set_add(pcp_allocator_t allocator, color_set_t* set,
                                  pcp_topology_color_t color) {
  for (size_t i = 0; i < set->count; ++i) {
    if (pcp_topology_color_equal(set->items[i], color))
      return pcp_ok_status();
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_grow(allocator, sizeof(*set->items), set->count + 1,
                        (void**)&set->items, &set->capacity));
  set->items[set->count++] = color;
  return pcp_ok_status();
}

static bool color_sets_equal(const color_set_t* a, const color_set_t* b) {
  if (a->count != b->count)
    return false;
  for (size_t i = 0; i < a->count; ++i) {
    bool found = false;
    for (size_t j = 0; j < b->count && !found; ++j) {
      found = pcp_topology_color_equal(a->items[i], b->items[j]);
    }
    if (!found)
      return false;
  }
  return true;
}

static pcp_status_t check_chromatic_entry(pcp_allocator_t allocator,
                                          pcp_topology_simplex_t simplex,
                                          const pcp_topology_complex_t* image) {
  color_set_t from = {0};
  color_set_t to = {0};
  pcp_status_t status = pcp_ok_status();
  for (uint32_t i = 0; !status && i < simplex.count; ++i) {
    status = color_set_add(allocator, &from, simplex.vertices[i].color);
  }
  size_t count = pcp_topology_complex_count(image);
  for (size_t s = 0; !status && s < count; ++s) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(image, s);
    for (uint32_t i = 0; !status && i < face.count; ++i) {
      status = color_set_add(allocator, &to, face.vertices[i].color);
    }
  }
  if (!status && !color_sets_equal(&from, &to)) {
    char text[512];
    status = pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_NON_CHROMATIC_CARRIER,
        "the image of %s has %zu colours, the simplex %zu",
        pcp_topology_simplex_cstr(simplex, text, sizeof(text)), to.count,
        from.count);
  }
  pcp_allocator_free(allocator, from.items);
  pcp_allocator_free(allocator, to.items);
  return status;
}

typedef struct monotone_context_t {
  const pcp_topology_carrier_map_t* map;
  const pcp_topology_complex_t* outer_image;
  pcp_topology_simplex_t outer;
} monotone_context_t;

static pcp_status_t check_monotone_face(void* context,
                                        const pcp_topology_vertex_t* face,
                                        uint32_t count) {
  const monotone_context_t* c = (const monotone_context_t*)context;
  pcp_topology_simplex_t inner = pcp_topology_make_simplex(face, count);
  const pcp_topology_complex_t* image =
      pcp_topology_carrier_map_lookup(c->map, inner);
  if (!image)
    return pcp_ok_status();  // reported as missing elsewhere
  if (!pcp_topology_complex_is_subcomplex(image, c->outer_image)) {
    char a[512], b[512];
    return pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_NON_MONOTONIC_CARRIER,
        "the image of %s is not inside the image of %s",
        pcp_topology_simplex_cstr(inner, a, sizeof(a)),
        pcp_topology_simplex_cstr(c->outer, b, sizeof(b)));
  }
  return pcp_ok_status();
}

// Vertices of |a| that are also in |b|, into |out| (capacity a.count).
static uint32_t intersect_simplices(pcp_topology_simplex_t a,
                                    pcp_topology_simplex_t b,
                                    pcp_topology_vertex_t* out) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < a.count; ++i) {
    if (pcp_topology_simplex_contains_vertex(b, &a.vertices[i])) {
      out[n++] = a.vertices[i];
    }
  }
  return n;
}

pcp_status_t pcp_topology_carrier_map_validate(
    const pcp_topology_carrier_map_t* map,
    pcp_topology_carrier_checks_t checks) {
  size_t count = pcp_topology_complex_count(map->keys);
  char a[512];
  for (size_t i = 0; i < count; ++i) {
    pcp_topology_simplex_t simplex = pcp_topology_complex_simplex(map->keys, i);
    if (!pcp_topology_complex_contains(map->domain, simplex) &&
        !(simplex.count == 0 && pcp_topology_complex_count(map->domain) == 0)) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_CARRIER_SIMPLEX_OUTSIDE_DOMAIN,
          "carrier entry %zu %s is not a domain face", i,
          pcp_topology_simplex_cstr(simplex, a, sizeof(a)));
    }
    size_t first = 0;
    if (pcp_topology_complex_find(map->keys, simplex, &first) && first != i) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_DUPLICATE_CARRIER_SIMPLEX,
          "carrier entries %zu and %zu both map %s", first, i,
          pcp_topology_simplex_cstr(simplex, a, sizeof(a)));
    }
    if (!pcp_topology_complex_is_subcomplex(map->images[i], map->codomain)) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_COMPLEX_MISMATCH,
          "the image of %s is not inside the codomain",
          pcp_topology_simplex_cstr(simplex, a, sizeof(a)));
    }
  }
  pcp_topology_complex_t* faces = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(map->allocator, &faces));
  pcp_status_t status = pcp_topology_complex_faces(map->domain, faces);
  size_t face_count = pcp_topology_complex_count(faces);
  for (size_t i = 0; !status && i < face_count; ++i) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, i);
    if (!pcp_topology_carrier_map_lookup(map, face)) {
      status = pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_MISSING_CARRIER_SIMPLEX,
          "domain face %s has no carrier entry",
          pcp_topology_simplex_cstr(face, a, sizeof(a)));
    }
  }
  pcp_topology_complex_release(faces);
  if (status)
    return status;

  if (checks.monotone) {
    for (size_t i = 0; i < count; ++i) {
      monotone_context_t context = {map, map->images[i],
                                    pcp_topology_complex_simplex(map->keys, i)};
      PCP_RETURN_IF_ERROR_BARE(pcp_topology_simplex_for_each_face(
          context.outer, check_monotone_face, &context));
    }
  }
  if (checks.strict) {
    pcp_topology_complex_t* meet = NULL;
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_complex_create(map->allocator, &meet));
    pcp_topology_vertex_t* common = NULL;
    size_t common_capacity = 0;
    for (size_t i = 0; !status && i < count; ++i) {
      for (size_t j = i + 1; !status && j < count; ++j) {
        pcp_topology_simplex_t s = pcp_topology_complex_simplex(map->keys, i);
        pcp_topology_simplex_t t = pcp_topology_complex_simplex(map->keys, j);
        status = pcp_topology_grow(map->allocator, sizeof(*common), s.count + 1,
                                   (void**)&common, &common_capacity);
        if (status)
          break;
        uint32_t n = intersect_simplices(s, t, common);
        const pcp_topology_complex_t* image = pcp_topology_carrier_map_lookup(
            map, pcp_topology_make_simplex(common, n));
        if (!image)
          continue;
        status = pcp_topology_subcomplex_intersection(map->images[i],
                                                      map->images[j], meet);
        if (status)
          break;
        if (!pcp_topology_complex_equal_by_closure(image, meet)) {
          char b[512];
          status = pcp_topology_make_status(
              PCP_TOPOLOGY_ERROR_NON_STRICT_CARRIER,
              "img(%s n %s) differs from the meet of their images",
              pcp_topology_simplex_cstr(s, a, sizeof(a)),
              pcp_topology_simplex_cstr(t, b, sizeof(b)));
        }
      }
    }
    pcp_allocator_free(map->allocator, common);
    pcp_topology_complex_release(meet);
    if (status)
      return status;
  }
  if (checks.rigid || checks.chromatic) {
    for (size_t i = 0; i < count; ++i) {
      pcp_topology_simplex_t s = pcp_topology_complex_simplex(map->keys, i);
      const pcp_topology_complex_t* image = map->images[i];
      if (!pcp_topology_complex_is_pure(image) ||
          pcp_topology_complex_dimension(image) !=
              pcp_topology_simplex_dimension(s)) {
        return pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_NON_RIGID_CARRIER,
            "the image of %s has dimension %d (pure: %s)",
            pcp_topology_simplex_cstr(s, a, sizeof(a)),
            (int)pcp_topology_complex_dimension(image),
            pcp_topology_complex_is_pure(image) ? "yes" : "no");
      }
    }
  }
  if (checks.chromatic) {
    for (size_t i = 0; i < count; ++i) {
      PCP_RETURN_IF_ERROR_BARE(check_chromatic_entry(
          map->allocator, pcp_topology_complex_simplex(map->keys, i),
          map->images[i]));
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_carrier_map_compose_with_map(
    const pcp_topology_carrier_map_t* carrier,
    const pcp_topology_vertex_map_t* map, pcp_allocator_t allocator,
    pcp_topology_carrier_map_t** out_map) {
  *out_map = NULL;
  pcp_topology_carrier_map_t* result = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_carrier_map_create(
      carrier->domain, pcp_topology_vertex_map_codomain(map), allocator,
      &result));
  size_t count = pcp_topology_carrier_map_count(carrier);
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; !status && i < count; ++i) {
    pcp_topology_complex_t* image = NULL;
    status = pcp_topology_complex_create(allocator, &image);
    if (status)
      break;
    status = map_faces(map, carrier->images[i], NULL, image);
    if (status) {
      pcp_topology_complex_release(image);
      break;
    }
    status = carrier_push(
        result, pcp_topology_complex_simplex(carrier->keys, i), image);
  }
  if (status) {
    pcp_topology_carrier_map_release(result);
    return status;
  }
  *out_map = result;
  return pcp_ok_status();
}

typedef struct compose_context_t {
  const pcp_topology_carrier_map_t* next;
  pcp_topology_complex_t* out;
} compose_context_t;

static pcp_status_t compose_face(void* context,
                                 const pcp_topology_vertex_t* face,
                                 uint32_t count) {
  compose_context_t* c = (compose_context_t*)context;
  pcp_topology_simplex_t simplex = pcp_topology_make_simplex(face, count);
  const pcp_topology_complex_t* image =
      pcp_topology_carrier_map_lookup(c->next, simplex);
  if (!image) {
    char text[512];
    return pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_MISSING_CARRIER_SIMPLEX,
        "the second carrier has no entry for %s",
        pcp_topology_simplex_cstr(simplex, text, sizeof(text)));
  }
  size_t n = pcp_topology_complex_count(image);
  for (size_t i = 0; i < n; ++i) {
    pcp_topology_simplex_t s = pcp_topology_complex_simplex(image, i);
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_complex_insert_sorted(c->out, s.vertices, s.count, NULL));
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_carrier_map_compose_with_carrier(
    const pcp_topology_carrier_map_t* carrier,
    const pcp_topology_carrier_map_t* next, pcp_allocator_t allocator,
    pcp_topology_carrier_map_t** out_map) {
  *out_map = NULL;
  pcp_topology_carrier_map_t* result = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_carrier_map_create(
      carrier->domain, next->codomain, allocator, &result));
  size_t count = pcp_topology_carrier_map_count(carrier);
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; !status && i < count; ++i) {
    pcp_topology_complex_t* image = NULL;
    status = pcp_topology_complex_create(allocator, &image);
    if (status)
      break;
    // Images are closed, so every face of Xi(s) is listed in it.
    const pcp_topology_complex_t* first = carrier->images[i];
    size_t n = pcp_topology_complex_count(first);
    compose_context_t context = {next, image};
    for (size_t k = 0; !status && k < n; ++k) {
      pcp_topology_simplex_t face = pcp_topology_complex_simplex(first, k);
      status = compose_face(&context, face.vertices, face.count);
    }
    if (status) {
      pcp_topology_complex_release(image);
      break;
    }
    status = carrier_push(
        result, pcp_topology_complex_simplex(carrier->keys, i), image);
  }
  if (status) {
    pcp_topology_carrier_map_release(result);
    return status;
  }
  *out_map = result;
  return pcp_ok_status();
}

pcp_status_t pcp_topology_carrier_map_restrict(
    const pcp_topology_carrier_map_t* map, const pcp_topology_complex_t* sub,
    pcp_allocator_t allocator, pcp_topology_carrier_map_t** out_map) {
  *out_map = NULL;
  pcp_topology_carrier_map_t* result = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_carrier_map_create(sub, map->codomain, allocator, &result));
  size_t count = pcp_topology_carrier_map_count(map);
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; !status && i < count; ++i) {
    pcp_topology_simplex_t s = pcp_topology_complex_simplex(map->keys, i);
    bool inside = pcp_topology_complex_contains(sub, s) ||
                  (s.count == 0 && pcp_topology_complex_count(sub) == 0);
    if (!inside)
      continue;
    status = pcp_topology_carrier_map_set(result, s, map->images[i]);
  }
  if (status) {
    pcp_topology_carrier_map_release(result);
    return status;
  }
  *out_map = result;
  return pcp_ok_status();
}

pcp_status_t pcp_topology_carrier_map_image(
    const pcp_topology_carrier_map_t* map,
    pcp_topology_complex_t* out_complex) {
  pcp_topology_complex_clear(out_complex);
  size_t count = pcp_topology_carrier_map_count(map);
  for (size_t i = 0; i < count; ++i) {
    size_t n = pcp_topology_complex_count(map->images[i]);
    for (size_t k = 0; k < n; ++k) {
      pcp_topology_simplex_t s =
          pcp_topology_complex_simplex(map->images[i], k);
      PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_insert_sorted(
          out_complex, s.vertices, s.count, NULL));
    }
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Carried decision maps
//===----------------------------------------------------------------------===//

pcp_status_t pcp_topology_carried_decision_map_validate(
    const pcp_topology_carrier_map_t* execution,
    const pcp_topology_carrier_map_t* task,
    const pcp_topology_vertex_map_t* decision) {
  pcp_topology_carrier_checks_t defaults =
      pcp_topology_carrier_checks_default();
  PCP_RETURN_IF_ERROR(pcp_topology_carrier_map_validate(execution, defaults),
                      "execution carrier");
  PCP_RETURN_IF_ERROR(pcp_topology_carrier_map_validate(task, defaults),
                      "task carrier");
  pcp_topology_vertex_map_checks_t map_checks = {true, false};
  PCP_RETURN_IF_ERROR(pcp_topology_vertex_map_validate(decision, map_checks),
                      "decision map");
  if (!pcp_topology_complex_equal_by_closure(execution->domain, task->domain)) {
    return pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_COMPLEX_MISMATCH,
        "execution and task carriers have different input complexes");
  }
  if (!pcp_topology_complex_equal_by_closure(execution->codomain,
                                             decision->domain)) {
    return pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_COMPLEX_MISMATCH,
        "the decision map's domain is not the protocol complex");
  }
  if (!pcp_topology_complex_equal_by_closure(task->codomain,
                                             decision->codomain)) {
    return pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_COMPLEX_MISMATCH,
        "the decision map's codomain is not the output complex");
  }
  pcp_allocator_t allocator = decision->allocator;
  pcp_topology_carrier_map_t* decided = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_carrier_map_compose_with_map(
      execution, decision, allocator, &decided));
  pcp_topology_complex_t* faces = NULL;
  pcp_status_t status = pcp_topology_complex_create(allocator, &faces);
  if (!status)
    status = pcp_topology_complex_faces(execution->domain, faces);
  size_t face_count = faces ? pcp_topology_complex_count(faces) : 0;
  for (size_t i = 0; !status && i < face_count; ++i) {
    pcp_topology_simplex_t input = pcp_topology_complex_simplex(faces, i);
    const pcp_topology_complex_t* image =
        pcp_topology_carrier_map_lookup(decided, input);
    const pcp_topology_complex_t* allowed =
        pcp_topology_carrier_map_lookup(task, input);
    if (!image || !allowed)
      continue;  // validation above rules this out
    size_t n = pcp_topology_complex_count(image);
    for (size_t k = 0; k < n; ++k) {
      pcp_topology_simplex_t output = pcp_topology_complex_simplex(image, k);
      if (!pcp_topology_complex_contains(allowed, output)) {
        char a[512], b[512];
        status = pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_DECISION_OUTSIDE_CARRIER,
            "input %s decides %s, which the task does not allow",
            pcp_topology_simplex_cstr(input, a, sizeof(a)),
            pcp_topology_simplex_cstr(output, b, sizeof(b)));
        break;
      }
    }
  }
  pcp_topology_complex_release(faces);
  pcp_topology_carrier_map_release(decided);
  return status;
}

//===----------------------------------------------------------------------===//
// Index-based carriers
//===----------------------------------------------------------------------===//

typedef struct index_errors_t {
  pcp_topology_error_t missing;
  pcp_topology_error_t duplicate;
  pcp_topology_error_t target_range;
  pcp_topology_error_t non_monotonic;
  bool reject_empty;
  const char* what;
} index_errors_t;

static const pcp_topology_index_edge_t* find_edge(
    const pcp_topology_index_carrier_t* carrier, uint32_t input_index) {
  for (size_t i = 0; i < carrier->edge_count; ++i) {
    if (carrier->edges[i].input_index == input_index)
      return &carrier->edges[i];
  }
  return NULL;
}

static bool edge_has_target(const pcp_topology_index_edge_t* edge,
                            uint32_t target) {
  for (uint32_t i = 0; i < edge->target_count; ++i) {
    if (edge->target_indices[i] == target)
      return true;
  }
  return false;
}

static pcp_status_t validate_index_carrier(
    const pcp_topology_index_carrier_t* carrier, const index_errors_t* errors) {
  size_t inputs = pcp_topology_complex_count(carrier->input);
  size_t targets = pcp_topology_complex_count(carrier->target);
  if (errors->reject_empty && carrier->edge_count == 0) {
    return pcp_topology_make_status(PCP_TOPOLOGY_ERROR_EMPTY_EXECUTION_CARRIER,
                                    "the %s has no edges", errors->what);
  }
  for (size_t i = 0; i < carrier->edge_count; ++i) {
    const pcp_topology_index_edge_t* edge = &carrier->edges[i];
    if (edge->input_index >= inputs) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_INPUT_INDEX_OUT_OF_RANGE,
          "%s edge %zu names input %u of %zu", errors->what, i,
          edge->input_index, inputs);
    }
    for (size_t j = 0; j < i; ++j) {
      if (carrier->edges[j].input_index == edge->input_index) {
        return pcp_topology_make_status(errors->duplicate,
                                        "%s edges %zu and %zu share input %u",
                                        errors->what, j, i, edge->input_index);
      }
    }
    if (errors->reject_empty && edge->target_count == 0) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_EMPTY_EXECUTION_CARRIER,
          "%s edge %zu (input %u) reaches no protocol simplex", errors->what, i,
          edge->input_index);
    }
    for (uint32_t k = 0; k < edge->target_count; ++k) {
      if (edge->target_indices[k] >= targets) {
        return pcp_topology_make_status(
            errors->target_range, "%s edge %zu names target %u of %zu",
            errors->what, i, edge->target_indices[k], targets);
      }
    }
  }
  for (size_t input = 0; input < inputs; ++input) {
    if (!find_edge(carrier, (uint32_t)input)) {
      return pcp_topology_make_status(
          errors->missing, "%s has no edge for input %zu", errors->what, input);
    }
  }
  // Monotone between listed simplices: a subset b => targets(a) subset
  // targets(b), as index sets.
  for (size_t a = 0; a < inputs; ++a) {
    for (size_t b = 0; b < inputs; ++b) {
      if (a == b)
        continue;
      if (!pcp_topology_simplex_is_subset(
              pcp_topology_complex_simplex(carrier->input, a),
              pcp_topology_complex_simplex(carrier->input, b))) {
        continue;
      }
      const pcp_topology_index_edge_t* ea = find_edge(carrier, (uint32_t)a);
      const pcp_topology_index_edge_t* eb = find_edge(carrier, (uint32_t)b);
      for (uint32_t k = 0; k < ea->target_count; ++k) {
        if (!edge_has_target(eb, ea->target_indices[k])) {
          return pcp_topology_make_status(
              errors->non_monotonic,
              "input %zu is a face of input %zu but carries target %u that "
              "input %zu does not",
              a, b, ea->target_indices[k], b);
        }
      }
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_index_carrier_validate(
    const pcp_topology_index_carrier_t* carrier) {
  static const index_errors_t kErrors = {
      PCP_TOPOLOGY_ERROR_MISSING_CARRIER_EDGE,
      PCP_TOPOLOGY_ERROR_DUPLICATE_CARRIER_EDGE,
      PCP_TOPOLOGY_ERROR_OUTPUT_INDEX_OUT_OF_RANGE,
      PCP_TOPOLOGY_ERROR_NON_MONOTONIC_CARRIER,
      false,
      "task carrier",
  };
  return validate_index_carrier(carrier, &kErrors);
}

pcp_status_t pcp_topology_execution_carrier_validate(
    const pcp_topology_index_carrier_t* execution) {
  static const index_errors_t kErrors = {
      PCP_TOPOLOGY_ERROR_MISSING_EXECUTION_EDGE,
      PCP_TOPOLOGY_ERROR_DUPLICATE_EXECUTION_EDGE,
      PCP_TOPOLOGY_ERROR_PROTOCOL_INDEX_OUT_OF_RANGE,
      PCP_TOPOLOGY_ERROR_NON_MONOTONIC_EXECUTION_CARRIER,
      true,
      "execution carrier",
  };
  return validate_index_carrier(execution, &kErrors);
}

pcp_status_t pcp_topology_decisions_check_shared_views(
    const pcp_topology_complex_t* protocol,
    const pcp_topology_complex_t* output, const uint32_t* protocol_indices,
    const uint32_t* output_indices, size_t decision_count) {
  char a[256], b[512];
  for (size_t i = 0; i < decision_count; ++i) {
    for (size_t j = i + 1; j < decision_count; ++j) {
      pcp_topology_simplex_t pi =
          pcp_topology_complex_simplex(protocol, protocol_indices[i]);
      pcp_topology_simplex_t pj =
          pcp_topology_complex_simplex(protocol, protocol_indices[j]);
      pcp_topology_simplex_t oi =
          pcp_topology_complex_simplex(output, output_indices[i]);
      pcp_topology_simplex_t oj =
          pcp_topology_complex_simplex(output, output_indices[j]);
      for (uint32_t v = 0; v < pi.count; ++v) {
        const pcp_topology_vertex_t* shared = &pi.vertices[v];
        if (!pcp_topology_simplex_contains_vertex(pj, shared))
          continue;
        int32_t ki = pcp_topology_simplex_vertex_with_color(oi, shared->color);
        int32_t kj = pcp_topology_simplex_vertex_with_color(oj, shared->color);
        if (ki < 0 || kj < 0) {
          return pcp_topology_make_status(
              PCP_TOPOLOGY_ERROR_SHARED_VIEW_MISSING_OUTPUT_VERTEX,
              "decisions %zu and %zu share view %s but output %s has no "
              "vertex of its colour",
              i, j, pcp_topology_vertex_cstr(shared, a, sizeof(a)),
              pcp_topology_simplex_cstr(ki < 0 ? oi : oj, b, sizeof(b)));
        }
        if (!pcp_topology_vertex_equal(&oi.vertices[ki], &oj.vertices[kj])) {
          char c[256], d[256];
          return pcp_topology_make_status(
              PCP_TOPOLOGY_ERROR_INCOMPATIBLE_DECISION_ON_SHARED_VIEW,
              "view %s decides %s in decision %zu and %s in decision %zu",
              pcp_topology_vertex_cstr(shared, a, sizeof(a)),
              pcp_topology_vertex_cstr(&oi.vertices[ki], c, sizeof(c)), i,
              pcp_topology_vertex_cstr(&oj.vertices[kj], d, sizeof(d)), j);
        }
      }
    }
  }
  return pcp_ok_status();
}

// Copies the (protocol, output) columns of decisions for the shared-view
// check.
static pcp_status_t shared_views(pcp_allocator_t allocator,
                                 const pcp_topology_complex_t* protocol,
                                 const pcp_topology_complex_t* output,
                                 const uint32_t* protocol_column,
                                 const uint32_t* output_column, size_t stride,
                                 size_t count) {
  if (count == 0)
    return pcp_ok_status();
  uint32_t* columns = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
      allocator, 2 * count * sizeof(*columns), (void**)&columns));
  for (size_t i = 0; i < count; ++i) {
    columns[i] = *(const uint32_t*)((const char*)protocol_column + i * stride);
    columns[count + i] =
        *(const uint32_t*)((const char*)output_column + i * stride);
  }
  pcp_status_t status = pcp_topology_decisions_check_shared_views(
      protocol, output, columns, columns + count, count);
  pcp_allocator_free(allocator, columns);
  return status;
}

pcp_status_t pcp_topology_decision_map_validate(
    const pcp_topology_complex_t* protocol,
    const pcp_topology_index_carrier_t* carrier,
    const pcp_topology_decision_edge_t* decisions, size_t decision_count) {
  PCP_RETURN_IF_ERROR(pcp_topology_index_carrier_validate(carrier),
                      "decision map carrier");
  size_t protocols = pcp_topology_complex_count(protocol);
  size_t inputs = pcp_topology_complex_count(carrier->input);
  size_t outputs = pcp_topology_complex_count(carrier->target);
  for (size_t i = 0; i < decision_count; ++i) {
    const pcp_topology_decision_edge_t* d = &decisions[i];
    if (d->protocol_index >= protocols) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_PROTOCOL_INDEX_OUT_OF_RANGE,
          "decision %zu names protocol simplex %u of %zu", i, d->protocol_index,
          protocols);
    }
    if (d->input_index >= inputs) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_INPUT_INDEX_OUT_OF_RANGE,
          "decision %zu names input %u of %zu", i, d->input_index, inputs);
    }
    if (d->output_index >= outputs) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_OUTPUT_INDEX_OUT_OF_RANGE,
          "decision %zu names output %u of %zu", i, d->output_index, outputs);
    }
    for (size_t j = 0; j < i; ++j) {
      if (decisions[j].protocol_index == d->protocol_index) {
        return pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_DUPLICATE_DECISION,
            "decisions %zu and %zu both decide protocol simplex %u", j, i,
            d->protocol_index);
      }
    }
  }
  for (size_t p = 0; p < protocols; ++p) {
    bool found = false;
    for (size_t i = 0; i < decision_count && !found; ++i) {
      found = decisions[i].protocol_index == p;
    }
    if (!found) {
      return pcp_topology_make_status(PCP_TOPOLOGY_ERROR_MISSING_DECISION,
                                      "protocol simplex %zu has no decision",
                                      p);
    }
  }
  for (size_t i = 0; i < decision_count; ++i) {
    const pcp_topology_decision_edge_t* d = &decisions[i];
    const pcp_topology_index_edge_t* edge = find_edge(carrier, d->input_index);
    if (!edge || !edge_has_target(edge, d->output_index)) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_DECISION_OUTSIDE_CARRIER,
          "decision %zu: input %u does not carry output %u", i, d->input_index,
          d->output_index);
    }
  }
  if (decision_count == 0)
    return pcp_ok_status();
  return shared_views(pcp_topology_complex_allocator(protocol), protocol,
                      carrier->target, &decisions[0].protocol_index,
                      &decisions[0].output_index, sizeof(*decisions),
                      decision_count);
}

pcp_status_t pcp_topology_execution_decision_map_validate(
    const pcp_topology_index_carrier_t* execution,
    const pcp_topology_index_carrier_t* carrier,
    const pcp_topology_protocol_decision_t* decisions, size_t decision_count) {
  PCP_RETURN_IF_ERROR(pcp_topology_execution_carrier_validate(execution),
                      "execution carrier");
  PCP_RETURN_IF_ERROR(pcp_topology_index_carrier_validate(carrier),
                      "task carrier");
  if (!pcp_topology_complex_same_listing(execution->input, carrier->input)) {
    return pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_COMPLEX_MISMATCH,
        "the execution and task carriers list different input simplices");
  }
  size_t protocols = pcp_topology_complex_count(execution->target);
  size_t outputs = pcp_topology_complex_count(carrier->target);
  for (size_t i = 0; i < decision_count; ++i) {
    const pcp_topology_protocol_decision_t* d = &decisions[i];
    if (d->protocol_index >= protocols) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_PROTOCOL_INDEX_OUT_OF_RANGE,
          "decision %zu names protocol simplex %u of %zu", i, d->protocol_index,
          protocols);
    }
    if (d->output_index >= outputs) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_OUTPUT_INDEX_OUT_OF_RANGE,
          "decision %zu names output %u of %zu", i, d->output_index, outputs);
    }
    for (size_t j = 0; j < i; ++j) {
      if (decisions[j].protocol_index == d->protocol_index) {
        return pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_DUPLICATE_DECISION,
            "decisions %zu and %zu both decide protocol simplex %u", j, i,
            d->protocol_index);
      }
    }
    bool reached = false;
    for (size_t e = 0; e < execution->edge_count; ++e) {
      const pcp_topology_index_edge_t* edge = &execution->edges[e];
      if (!edge_has_target(edge, d->protocol_index))
        continue;
      reached = true;
      // Every input that can reach this execution must allow the decision:
      // the process cannot tell those inputs apart.
      const pcp_topology_index_edge_t* task =
          find_edge(carrier, edge->input_index);
      if (!task || !edge_has_target(task, d->output_index)) {
        return pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_DECISION_OUTSIDE_CARRIER,
            "protocol simplex %u is reachable from input %u, which does not "
            "carry output %u",
            d->protocol_index, edge->input_index, d->output_index);
      }
    }
    if (!reached) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_PROTOCOL_OUTSIDE_EXECUTION_CARRIER,
          "protocol simplex %u is not reached by any execution edge",
          d->protocol_index);
    }
  }
  if (decision_count == 0)
    return pcp_ok_status();
  return shared_views(pcp_topology_complex_allocator(execution->target),
                      execution->target, carrier->target,
                      &decisions[0].protocol_index, &decisions[0].output_index,
                      sizeof(*decisions), decision_count);
}

pcp_status_t pcp_topology_execution_observations_validate(
    const pcp_topology_index_carrier_t* execution,
    const pcp_topology_execution_observation_t* observations,
    size_t observation_count) {
  for (size_t i = 0; i < observation_count; ++i) {
    const pcp_topology_index_edge_t* edge =
        find_edge(execution, observations[i].input_index);
    if (!edge || !edge_has_target(edge, observations[i].protocol_index)) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_PROTOCOL_OUTSIDE_EXECUTION_CARRIER,
          "observation %zu (input %u, protocol %u) is not in the execution "
          "carrier",
          i, observations[i].input_index, observations[i].protocol_index);
    }
  }
  for (size_t e = 0; e < execution->edge_count; ++e) {
    const pcp_topology_index_edge_t* edge = &execution->edges[e];
    for (uint32_t k = 0; k < edge->target_count; ++k) {
      bool seen = false;
      for (size_t i = 0; i < observation_count && !seen; ++i) {
        seen = observations[i].input_index == edge->input_index &&
               observations[i].protocol_index == edge->target_indices[k];
      }
      if (!seen) {
        return pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_MISSING_EXECUTION_OBSERVATION,
            "no observation of input %u reaching protocol simplex %u",
            edge->input_index, edge->target_indices[k]);
      }
    }
  }
  return pcp_ok_status();
}
