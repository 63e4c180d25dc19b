// SPDX-License-Identifier: Apache-2.0
//
// The topology data model: errors, colours, labels, vertices, simplices and
// complexes with their closure operations (reference s.1.1-1.4).
//
// Upstream scans lists linearly everywhere (O(n^2) and worse). Here every
// complex keeps a hash index of its listed simplices (exact lookup, dedup)
// and builds, lazily, an inverted vertex -> listed-simplex index for closure
// membership, so the same operations scale to the subdivisions the homology
// benchmark needs. The *orders* of results are the upstream ones regardless.

#include <stdlib.h>
#include <string.h>

#include "topology/complex_impl.h"
#include "topology/core_impl.h"

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

static const char* const kErrorNames[PCP_TOPOLOGY_ERROR_COUNT_] = {
    "None",
#define ERROR_NAME_(suffix, name, code) #name,
    PCP_TOPOLOGY_ERROR_LIST(ERROR_NAME_)
#undef ERROR_NAME_
};

static const pcp_status_code_t kErrorCodes[PCP_TOPOLOGY_ERROR_COUNT_] = {
    PCP_STATUS_OK,
#define ERROR_CODE_(suffix, name, code) PCP_STATUS_##code,
    PCP_TOPOLOGY_ERROR_LIST(ERROR_CODE_)
#undef ERROR_CODE_
};

const char* pcp_topology_error_name(pcp_topology_error_t error) {
  if ((int)error < 0 || error >= PCP_TOPOLOGY_ERROR_COUNT_)
    return "?";
  return kErrorNames[error];
}

pcp_status_code_t pcp_topology_error_code(pcp_topology_error_t error) {
  if ((int)error <= 0 || error >= PCP_TOPOLOGY_ERROR_COUNT_) {
    return PCP_STATUS_INTERNAL;
  }
  return kErrorCodes[error];
}

pcp_status_t pcp_topology_status_allocate_f(pcp_topology_error_t error,
                                            const char* file, int line,
                                            const char* fmt, ...) {
  char details[768];
  va_list args;
  va_start(args, fmt);
  vsnprintf(details, sizeof(details), fmt, args);
  va_end(args);
  return pcp_status_allocate_f(pcp_topology_error_code(error), file, line,
                               "%s: %s", pcp_topology_error_name(error),
                               details);
}

pcp_topology_error_t pcp_topology_status_error(pcp_status_t status) {
  if (!status)
    return PCP_TOPOLOGY_ERROR_NONE;
  const char* message = pcp_status_message(status);
  if (!message)
    return PCP_TOPOLOGY_ERROR_NONE;
  const char* colon = strchr(message, ':');
  if (!colon)
    return PCP_TOPOLOGY_ERROR_NONE;
  size_t length = (size_t)(colon - message);
  for (int i = 1; i < PCP_TOPOLOGY_ERROR_COUNT_; ++i) {
    if (strlen(kErrorNames[i]) == length &&
        memcmp(kErrorNames[i], message, length) == 0) {
      return (pcp_topology_error_t)i;
    }
  }
  return PCP_TOPOLOGY_ERROR_NONE;
}

//===----------------------------------------------------------------------===//
// Colours, labels, vertices
//===----------------------------------------------------------------------===//

static const char* const kColorKindNames[PCP_TOPOLOGY_COLOR_KIND_COUNT_] = {
    "hub", "gateway", "worker", "api_caller", "job", "session", "process",
};

const char* pcp_topology_color_kind_name(pcp_topology_color_kind_t kind) {
  if ((unsigned)kind >= PCP_TOPOLOGY_COLOR_KIND_COUNT_)
    return "?";
  return kColorKindNames[kind];
}

bool pcp_topology_color_kind_parse(pcp_string_view_t name,
                                   pcp_topology_color_kind_t* out_kind) {
  for (int i = 0; i < PCP_TOPOLOGY_COLOR_KIND_COUNT_; ++i) {
    if (pcp_string_view_equal(name,
                              pcp_make_cstring_view(kColorKindNames[i]))) {
      *out_kind = (pcp_topology_color_kind_t)i;
      return true;
    }
  }
  return false;
}

int pcp_topology_color_compare(pcp_topology_color_t a, pcp_topology_color_t b) {
  if (a.kind != b.kind)
    return a.kind < b.kind ? -1 : 1;
  if (a.number != b.number)
    return a.number < b.number ? -1 : 1;
  return 0;
}

bool pcp_topology_color_equal(pcp_topology_color_t a, pcp_topology_color_t b) {
  return a.kind == b.kind && a.number == b.number;
}

static int compare_symbols(const char* a, const char* b) {
  if (!a)
    a = "";
  if (!b)
    b = "";
  size_t la = strlen(a);
  size_t lb = strlen(b);
  int c = memcmp(a, b, la < lb ? la : lb);
  if (c != 0)
    return c < 0 ? -1 : 1;
  if (la != lb)
    return la < lb ? -1 : 1;
  return 0;
}

int pcp_topology_label_compare(const pcp_topology_label_t* a,
                               const pcp_topology_label_t* b) {
  if (a->kind != b->kind)
    return a->kind < b->kind ? -1 : 1;
  if (a->kind == PCP_TOPOLOGY_LABEL_SYMBOL) {
    return compare_symbols(a->symbol, b->symbol);
  }
  if (a->kind == PCP_TOPOLOGY_LABEL_EMPTY)
    return 0;
  if (a->value != b->value)
    return a->value < b->value ? -1 : 1;
  return 0;
}

int pcp_topology_vertex_compare(const pcp_topology_vertex_t* a,
                                const pcp_topology_vertex_t* b) {
  int c = pcp_topology_color_compare(a->color, b->color);
  if (c != 0)
    return c;
  return pcp_topology_label_compare(&a->label, &b->label);
}

bool pcp_topology_vertex_equal(const pcp_topology_vertex_t* a,
                               const pcp_topology_vertex_t* b) {
  if (a->color.kind != b->color.kind || a->color.number != b->color.number ||
      a->label.kind != b->label.kind) {
    return false;
  }
  if (a->label.kind == PCP_TOPOLOGY_LABEL_SYMBOL) {
    if (a->label.symbol == b->label.symbol)
      return true;
    return compare_symbols(a->label.symbol, b->label.symbol) == 0;
  }
  return a->label.kind == PCP_TOPOLOGY_LABEL_EMPTY ||
         a->label.value == b->label.value;
}

// FNV-1a over bytes, finished with fmix64. Seeds are fixed per object kind
// so that a colour and a label with the same bytes hash differently.
static uint64_t hash_bytes(uint64_t seed, const void* data, size_t length) {
  uint64_t h = 14695981039346656037ull ^ seed;
  const uint8_t* bytes = (const uint8_t*)data;
  for (size_t i = 0; i < length; ++i) {
    h ^= bytes[i];
    h *= 1099511628211ull;
  }
  return pcp_topology_core_mix(h);
}

// Integer words are mixed directly (two fmix64 rounds) rather than fed
// byte by byte: vertex hashing is the inner loop of every index lookup.
static uint64_t hash_u64(uint64_t seed, uint64_t value) {
  return pcp_topology_core_mix(
      seed ^ pcp_topology_core_mix(value + 0x9e3779b97f4a7c15ull));
}

// ASCII "color", "label", "vertex", "simplex" as little-endian integers.
#define SEED_COLOR 0x726f6c6f63ull
#define SEED_LABEL 0x6c6562616cull
#define SEED_VERTEX 0x786574726576ull
#define SEED_SIMPLEX 0x78656c706d6973ull

uint64_t pcp_topology_color_hash(pcp_topology_color_t color) {
  return hash_u64(SEED_COLOR, ((uint64_t)color.kind << 32) | color.number);
}

uint64_t pcp_topology_label_hash(const pcp_topology_label_t* label) {
  uint64_t h = hash_u64(SEED_LABEL, label->kind);
  if (label->kind == PCP_TOPOLOGY_LABEL_SYMBOL) {
    const char* s = label->symbol ? label->symbol : "";
    return hash_bytes(h, s, strlen(s));
  }
  if (label->kind == PCP_TOPOLOGY_LABEL_EMPTY)
    return h;
  return hash_u64(h, (uint64_t)label->value);
}

// Two mixing rounds over (colour, label kind, label payload): this is the
// innermost hash of every simplex lookup, so it avoids composing the
// separate colour and label hashes (six rounds).
uint64_t pcp_topology_vertex_hash(const pcp_topology_vertex_t* vertex) {
  uint64_t payload = 0;
  if (vertex->label.kind == PCP_TOPOLOGY_LABEL_SYMBOL) {
    const char* text = vertex->label.symbol ? vertex->label.symbol : "";
    payload = hash_bytes(SEED_LABEL, text, strlen(text));
  } else if (vertex->label.kind != PCP_TOPOLOGY_LABEL_EMPTY) {
    payload = (uint64_t)vertex->label.value;
  }
  uint64_t color = ((uint64_t)vertex->color.kind << 32) | vertex->color.number;
  uint64_t h = pcp_topology_core_mix(SEED_VERTEX ^ color ^
                                     ((uint64_t)vertex->label.kind << 61));
  return pcp_topology_core_mix(h ^ (payload + 0x9e3779b97f4a7c15ull));
}

pcp_status_t pcp_topology_color_format(pcp_topology_color_t color,
                                       pcp_string_builder_t* builder) {
  return pcp_string_builder_append_f(
      builder, "%s.%u",
      pcp_topology_color_kind_name((pcp_topology_color_kind_t)color.kind),
      color.number);
}

pcp_status_t pcp_topology_label_format(const pcp_topology_label_t* label,
                                       pcp_string_builder_t* builder) {
  switch (label->kind) {
    case PCP_TOPOLOGY_LABEL_EMPTY:
      return pcp_string_builder_append_cstring(builder, "empty");
    case PCP_TOPOLOGY_LABEL_INPUT:
      return pcp_string_builder_append_f(builder, "input.%lld",
                                         (long long)label->value);
    case PCP_TOPOLOGY_LABEL_PROTOCOL:
      return pcp_string_builder_append_f(builder, "protocol.%lld",
                                         (long long)label->value);
    case PCP_TOPOLOGY_LABEL_OUTPUT:
      return pcp_string_builder_append_f(builder, "output.%lld",
                                         (long long)label->value);
    case PCP_TOPOLOGY_LABEL_SYMBOL:
      return pcp_string_builder_append_cstring(
          builder, label->symbol ? label->symbol : "");
    default:
      return pcp_string_builder_append_cstring(builder, "?");
  }
}

pcp_status_t pcp_topology_vertex_format(const pcp_topology_vertex_t* vertex,
                                        pcp_string_builder_t* builder) {
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_color_format(vertex->color, builder));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(builder, ":"));
  return pcp_topology_label_format(&vertex->label, builder);
}

const char* pcp_topology_vertex_cstr(const pcp_topology_vertex_t* vertex,
                                     char* buffer, size_t capacity) {
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 4096, &builder);
  pcp_status_ignore(pcp_topology_vertex_format(vertex, &builder));
  snprintf(buffer, capacity, "%s", pcp_string_builder_cstring(&builder));
  pcp_string_builder_deinitialize(&builder);
  return buffer;
}

const char* pcp_topology_simplex_cstr(pcp_topology_simplex_t simplex,
                                      char* buffer, size_t capacity) {
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 4096, &builder);
  pcp_status_ignore(pcp_topology_simplex_format(simplex, &builder));
  snprintf(buffer, capacity, "%s", pcp_string_builder_cstring(&builder));
  pcp_string_builder_deinitialize(&builder);
  return buffer;
}

//===----------------------------------------------------------------------===//
// Growable arrays, vertex lists, the registry
//===----------------------------------------------------------------------===//

pcp_status_t pcp_topology_grow(pcp_allocator_t allocator, size_t element_size,
                               size_t needed, void** inout_items,
                               size_t* inout_capacity) {
  if (needed <= *inout_capacity)
    return pcp_ok_status();
  size_t capacity = *inout_capacity ? *inout_capacity : 8;
  while (capacity < needed) {
    if (capacity > SIZE_MAX / 2 / element_size) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "topology array of %zu items", needed);
    }
    capacity *= 2;
  }
  void* items = *inout_items;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_realloc(allocator, capacity * element_size, &items));
  *inout_items = items;
  *inout_capacity = capacity;
  return pcp_ok_status();
}

void pcp_topology_vertex_list_initialize(pcp_allocator_t allocator,
                                         pcp_topology_vertex_list_t* out_list) {
  memset(out_list, 0, sizeof(*out_list));
  out_list->allocator = allocator;
}

void pcp_topology_vertex_list_deinitialize(pcp_topology_vertex_list_t* list) {
  pcp_allocator_free(list->allocator, list->items);
  list->items = NULL;
  list->count = 0;
  list->capacity = 0;
}

void pcp_topology_vertex_list_clear(pcp_topology_vertex_list_t* list) {
  list->count = 0;
}

pcp_status_t pcp_topology_vertex_list_append(
    pcp_topology_vertex_list_t* list, const pcp_topology_vertex_t* vertex) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_grow(list->allocator, sizeof(*list->items), list->count + 1,
                        (void**)&list->items, &list->capacity));
  list->items[list->count++] = *vertex;
  return pcp_ok_status();
}

pcp_status_t pcp_topology_vertex_registry_intern(
    pcp_topology_vertex_list_t* registry, const pcp_topology_vertex_t* vertex,
    size_t* out_index) {
  for (size_t i = 0; i < registry->count; ++i) {
    if (pcp_topology_vertex_equal(&registry->items[i], vertex)) {
      *out_index = i;
      return pcp_ok_status();
    }
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_vertex_list_append(registry, vertex));
  pcp_topology_vertices_sort(registry->items, registry->count);
  for (size_t i = 0; i < registry->count; ++i) {
    if (pcp_topology_vertex_equal(&registry->items[i], vertex)) {
      *out_index = i;
      break;
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_vertex_registry_validate(
    const pcp_topology_vertex_list_t* registry) {
  for (size_t i = 0; i < registry->count; ++i) {
    for (size_t j = i + 1; j < registry->count; ++j) {
      if (pcp_topology_vertex_equal(&registry->items[i], &registry->items[j])) {
        char text[256];
        return pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_DUPLICATE_INTERNED_VERTEX,
            "vertex %s at %zu and %zu",
            pcp_topology_vertex_cstr(&registry->items[i], text, sizeof(text)),
            i, j);
      }
    }
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Simplices
//===----------------------------------------------------------------------===//

pcp_status_t pcp_topology_simplex_validate(pcp_topology_simplex_t simplex) {
  for (uint32_t i = 0; i < simplex.count; ++i) {
    for (uint32_t j = i + 1; j < simplex.count; ++j) {
      if (pcp_topology_color_equal(simplex.vertices[i].color,
                                   simplex.vertices[j].color)) {
        char a[256], b[256];
        return pcp_topology_make_status(
            PCP_TOPOLOGY_ERROR_DUPLICATE_COLOR,
            "vertices %s and %s share a colour",
            pcp_topology_vertex_cstr(&simplex.vertices[i], a, sizeof(a)),
            pcp_topology_vertex_cstr(&simplex.vertices[j], b, sizeof(b)));
      }
    }
  }
  return pcp_ok_status();
}

bool pcp_topology_simplex_contains_vertex(pcp_topology_simplex_t simplex,
                                          const pcp_topology_vertex_t* vertex) {
  for (uint32_t i = 0; i < simplex.count; ++i) {
    if (pcp_topology_vertex_equal(&simplex.vertices[i], vertex))
      return true;
  }
  return false;
}

int32_t pcp_topology_simplex_vertex_with_color(pcp_topology_simplex_t simplex,
                                               pcp_topology_color_t color) {
  for (uint32_t i = 0; i < simplex.count; ++i) {
    if (pcp_topology_color_equal(simplex.vertices[i].color, color)) {
      return (int32_t)i;
    }
  }
  return -1;
}

bool pcp_topology_simplex_is_subset(pcp_topology_simplex_t a,
                                    pcp_topology_simplex_t b) {
  if (a.count > b.count)
    return false;
  for (uint32_t i = 0; i < a.count; ++i) {
    if (!pcp_topology_simplex_contains_vertex(b, &a.vertices[i]))
      return false;
  }
  return true;
}

bool pcp_topology_simplex_equal(pcp_topology_simplex_t a,
                                pcp_topology_simplex_t b) {
  return a.count == b.count && pcp_topology_simplex_is_subset(a, b);
}

bool pcp_topology_simplex_is_proper_subset(pcp_topology_simplex_t a,
                                           pcp_topology_simplex_t b) {
  return a.count < b.count && pcp_topology_simplex_is_subset(a, b);
}

bool pcp_topology_simplex_disjoint(pcp_topology_simplex_t a,
                                   pcp_topology_simplex_t b) {
  for (uint32_t i = 0; i < a.count; ++i) {
    if (pcp_topology_simplex_contains_vertex(b, &a.vertices[i]))
      return false;
  }
  return true;
}

// Order independent without sorting: a sum and an xor of mixed vertex
// hashes, then the count. Equality is always confirmed by comparison, so a
// commutative combination is enough.
uint64_t pcp_topology_simplex_hash(pcp_topology_simplex_t simplex) {
  uint64_t sum = 0;
  uint64_t xor_part = 0;
  for (uint32_t i = 0; i < simplex.count; ++i) {
    uint64_t h = pcp_topology_vertex_hash(&simplex.vertices[i]);
    sum += pcp_topology_core_mix(h);
    xor_part ^= pcp_topology_core_mix(h ^ 0x9e3779b97f4a7c15ull);
  }
  return pcp_topology_core_mix(SEED_SIMPLEX ^ sum ^
                               ((xor_part << 29) | (xor_part >> 35)) ^
                               ((uint64_t)simplex.count << 56));
}

static int vertex_qsort_compare(const void* a, const void* b) {
  return pcp_topology_vertex_compare((const pcp_topology_vertex_t*)a,
                                     (const pcp_topology_vertex_t*)b);
}

void pcp_topology_vertices_sort(pcp_topology_vertex_t* vertices, size_t count) {
  // Insertion sort for the common tiny simplices; qsort beyond.
  if (count > 16) {
    qsort(vertices, count, sizeof(*vertices), vertex_qsort_compare);
    return;
  }
  for (size_t i = 1; i < count; ++i) {
    pcp_topology_vertex_t v = vertices[i];
    size_t j = i;
    while (j > 0 && pcp_topology_vertex_compare(&vertices[j - 1], &v) > 0) {
      vertices[j] = vertices[j - 1];
      --j;
    }
    vertices[j] = v;
  }
}

pcp_status_t pcp_topology_simplex_format(pcp_topology_simplex_t simplex,
                                         pcp_string_builder_t* builder) {
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(builder, "{"));
  for (uint32_t i = 0; i < simplex.count; ++i) {
    if (i) {
      PCP_RETURN_IF_ERROR_BARE(
          pcp_string_builder_append_cstring(builder, ", "));
    }
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_vertex_format(&simplex.vertices[i], builder));
  }
  return pcp_string_builder_append_cstring(builder, "}");
}

//===----------------------------------------------------------------------===//
// Index table
//===----------------------------------------------------------------------===//

void pcp_topology_index_table_initialize(pcp_allocator_t allocator,
                                         pcp_topology_index_table_t* table) {
  memset(table, 0, sizeof(*table));
  table->allocator = allocator;
}

void pcp_topology_index_table_deinitialize(pcp_topology_index_table_t* table) {
  pcp_allocator_free(table->allocator, table->slots);
  pcp_allocator_free(table->allocator, table->hashes);
  table->slots = NULL;
  table->hashes = NULL;
  table->capacity = 0;
  table->used = 0;
}

void pcp_topology_index_table_clear(pcp_topology_index_table_t* table) {
  if (table->capacity) {
    memset(table->slots, 0, table->capacity * sizeof(*table->slots));
  }
  table->used = 0;
}

bool pcp_topology_index_table_find(const pcp_topology_index_table_t* table,
                                   uint64_t hash, pcp_topology_index_eq_fn_t eq,
                                   const void* context, const void* key,
                                   uint32_t* out_value) {
  if (!table->capacity)
    return false;
  size_t mask = table->capacity - 1;
  for (size_t i = (size_t)hash & mask;; i = (i + 1) & mask) {
    uint32_t slot = table->slots[i];
    if (!slot)
      return false;
    if (table->hashes[i] == hash && eq(context, slot - 1, key)) {
      *out_value = slot - 1;
      return true;
    }
  }
}

static void table_place(uint32_t* slots, uint64_t* hashes, size_t capacity,
                        uint64_t hash, uint32_t slot) {
  size_t mask = capacity - 1;
  size_t i = (size_t)hash & mask;
  while (slots[i]) i = (i + 1) & mask;
  slots[i] = slot;
  hashes[i] = hash;
}

pcp_status_t pcp_topology_index_table_insert(pcp_topology_index_table_t* table,
                                             uint64_t hash, uint32_t value) {
  if ((table->used + 1) * 2 > table->capacity) {
    size_t capacity = table->capacity ? table->capacity * 2 : 16;
    uint32_t* slots = NULL;
    uint64_t* hashes = NULL;
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
        table->allocator, capacity * sizeof(*slots), (void**)&slots));
    pcp_status_t status = pcp_allocator_malloc(
        table->allocator, capacity * sizeof(*hashes), (void**)&hashes);
    if (status) {
      pcp_allocator_free(table->allocator, slots);
      return status;
    }
    for (size_t i = 0; i < table->capacity; ++i) {
      if (table->slots[i]) {
        table_place(slots, hashes, capacity, table->hashes[i], table->slots[i]);
      }
    }
    pcp_allocator_free(table->allocator, table->slots);
    pcp_allocator_free(table->allocator, table->hashes);
    table->slots = slots;
    table->hashes = hashes;
    table->capacity = capacity;
  }
  table_place(table->slots, table->hashes, table->capacity, hash, value + 1);
  ++table->used;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Complexes
//===----------------------------------------------------------------------===//

struct pcp_topology_complex_t {
  pcp_allocator_t allocator;
  // All listed simplices' vertices back to back.
  pcp_topology_vertex_t* pool;
  size_t pool_count;
  size_t pool_capacity;
  // Per listed simplex: offset into |pool|, count, hash, sorted flag.
  size_t* offsets;
  uint32_t* counts;
  uint64_t* hashes;
  uint8_t* sorted;
  size_t count;
  size_t capacity;
  // Exact index: canonical hash -> first listed index with that set.
  pcp_topology_index_table_t exact;
  // The list is exactly faces() of something, in faces order. faces() is
  // idempotent in content and order (a face's subfaces have smaller masks,
  // so they are listed before it), so faces() and filters of such a complex
  // can walk the list instead of re-enumerating 2^n subsets per simplex.
  bool faces_closed;
  // Lazy inverted index for closure membership, rebuilt after changes:
  // vertex id -> listed simplices containing it (CSR).
  bool incidence_valid;
  pcp_topology_vertex_index_t* incidence_vertices;
  uint32_t* incidence_offsets;  // vertex count + 1
  uint32_t* incidence_items;
  size_t incidence_items_capacity;
};

// Vertices of listed simplex |index|. The pool is NULL while only empty
// simplices are listed; never offset a NULL pointer (UB even by zero).
static const pcp_topology_vertex_t* listed_vertices(
    const pcp_topology_complex_t* complex, size_t index) {
  return complex->pool ? complex->pool + complex->offsets[index] : NULL;
}

static pcp_topology_simplex_t listed(const pcp_topology_complex_t* complex,
                                     size_t index) {
  return pcp_topology_make_simplex(listed_vertices(complex, index),
                                   complex->counts[index]);
}

static void incidence_drop(pcp_topology_complex_t* complex) {
  if (complex->incidence_vertices) {
    pcp_topology_vertex_index_deinitialize(complex->incidence_vertices);
    pcp_allocator_free(complex->allocator, complex->incidence_vertices);
    complex->incidence_vertices = NULL;
  }
  pcp_allocator_free(complex->allocator, complex->incidence_offsets);
  pcp_allocator_free(complex->allocator, complex->incidence_items);
  complex->incidence_offsets = NULL;
  complex->incidence_items = NULL;
  complex->incidence_valid = false;
}

pcp_status_t pcp_topology_complex_create(pcp_allocator_t allocator,
                                         pcp_topology_complex_t** out_complex) {
  *out_complex = NULL;
  pcp_topology_complex_t* complex = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*complex), (void**)&complex));
  complex->allocator = allocator;
  pcp_topology_index_table_initialize(allocator, &complex->exact);
  *out_complex = complex;
  return pcp_ok_status();
}

void pcp_topology_complex_release(pcp_topology_complex_t* complex) {
  if (!complex)
    return;
  pcp_allocator_t allocator = complex->allocator;
  incidence_drop(complex);
  pcp_topology_index_table_deinitialize(&complex->exact);
  pcp_allocator_free(allocator, complex->pool);
  pcp_allocator_free(allocator, complex->offsets);
  pcp_allocator_free(allocator, complex->counts);
  pcp_allocator_free(allocator, complex->hashes);
  pcp_allocator_free(allocator, complex->sorted);
  pcp_allocator_free(allocator, complex);
}

pcp_allocator_t pcp_topology_complex_allocator(
    const pcp_topology_complex_t* complex) {
  return complex->allocator;
}

void pcp_topology_complex_clear(pcp_topology_complex_t* complex) {
  complex->pool_count = 0;
  complex->count = 0;
  complex->faces_closed = false;
  pcp_topology_index_table_clear(&complex->exact);
  incidence_drop(complex);
}

size_t pcp_topology_complex_count(const pcp_topology_complex_t* complex) {
  return complex->count;
}

pcp_topology_simplex_t pcp_topology_complex_simplex(
    const pcp_topology_complex_t* complex, size_t index) {
  PCP_ASSERT(index < complex->count);
  return listed(complex, index);
}

typedef struct exact_key_t {
  pcp_topology_simplex_t simplex;
  bool sorted;
} exact_key_t;

static bool vertices_equal_in_order(const pcp_topology_vertex_t* a,
                                    const pcp_topology_vertex_t* b,
                                    uint32_t count) {
  for (uint32_t i = 0; i < count; ++i) {
    if (!pcp_topology_vertex_equal(&a[i], &b[i]))
      return false;
  }
  return true;
}

static bool exact_eq(const void* context, uint32_t value, const void* key) {
  const pcp_topology_complex_t* complex =
      (const pcp_topology_complex_t*)context;
  const exact_key_t* k = (const exact_key_t*)key;
  if (complex->counts[value] != k->simplex.count)
    return false;
  // Both sorted: the element-wise comparison decides. Otherwise sets.
  if (k->sorted && complex->sorted[value]) {
    return vertices_equal_in_order(listed_vertices(complex, value),
                                   k->simplex.vertices, k->simplex.count);
  }
  return pcp_topology_simplex_equal(listed(complex, value), k->simplex);
}

static bool is_sorted_run(const pcp_topology_vertex_t* vertices,
                          uint32_t count) {
  for (uint32_t i = 1; i < count; ++i) {
    if (pcp_topology_vertex_compare(&vertices[i - 1], &vertices[i]) > 0) {
      return false;
    }
  }
  return true;
}

static bool find_exact(const pcp_topology_complex_t* complex,
                       pcp_topology_simplex_t simplex, uint64_t hash,
                       bool sorted, size_t* out_index) {
  exact_key_t key = {simplex, sorted};
  uint32_t value = 0;
  if (pcp_topology_index_table_find(&complex->exact, hash, exact_eq, complex,
                                    &key, &value)) {
    if (out_index)
      *out_index = value;
    return true;
  }
  return false;
}

// Appends without any check; |hash| is the simplex hash.
static pcp_status_t append_raw(pcp_topology_complex_t* complex,
                               const pcp_topology_vertex_t* vertices,
                               uint32_t count, uint64_t hash, bool sorted,
                               bool index_it) {
  if (complex->count >= PCP_TOPOLOGY_MAX_COMPLEX_SIMPLICES) {
    return pcp_topology_make_status(PCP_TOPOLOGY_ERROR_COMPLEX_TOO_LARGE,
                                    "a complex may list at most %u simplices",
                                    PCP_TOPOLOGY_MAX_COMPLEX_SIMPLICES);
  }
  pcp_allocator_t a = complex->allocator;
  size_t needed = complex->count + 1;
  if (needed > complex->capacity) {
    size_t capacity = complex->capacity;
    size_t c1 = capacity, c2 = capacity, c3 = capacity, c4 = capacity;
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_grow(
        a, sizeof(*complex->offsets), needed, (void**)&complex->offsets, &c1));
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_grow(
        a, sizeof(*complex->counts), needed, (void**)&complex->counts, &c2));
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_grow(
        a, sizeof(*complex->hashes), needed, (void**)&complex->hashes, &c3));
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_grow(
        a, sizeof(*complex->sorted), needed, (void**)&complex->sorted, &c4));
    complex->capacity = c1;
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_grow(a, sizeof(*complex->pool), complex->pool_count + count,
                        (void**)&complex->pool, &complex->pool_capacity));
  size_t index = complex->count;
  // The last step that can fail: nothing is committed before it, so a
  // failed append leaves the complex exactly as it was.
  if (index_it) {
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_index_table_insert(
        &complex->exact, hash, (uint32_t)index));
  }
  if (count) {
    memcpy(complex->pool + complex->pool_count, vertices,
           count * sizeof(*vertices));
  }
  complex->offsets[index] = complex->pool_count;
  complex->counts[index] = count;
  complex->hashes[index] = hash;
  complex->sorted[index] = sorted ? 1 : 0;
  complex->pool_count += count;
  complex->count = index + 1;
  complex->faces_closed = false;
  if (complex->incidence_valid)
    incidence_drop(complex);
  return pcp_ok_status();
}

pcp_status_t pcp_topology_complex_append(pcp_topology_complex_t* complex,
                                         pcp_topology_simplex_t simplex) {
  uint64_t hash = pcp_topology_simplex_hash(simplex);
  bool sorted = is_sorted_run(simplex.vertices, simplex.count);
  // Only the first of equal simplices enters the exact index, so find()
  // returns the first occurrence and validate() can name both.
  bool seen = find_exact(complex, simplex, hash, sorted, NULL);
  return append_raw(complex, simplex.vertices, simplex.count, hash, sorted,
                    !seen);
}

pcp_status_t pcp_topology_complex_insert_sorted(
    pcp_topology_complex_t* complex, const pcp_topology_vertex_t* vertices,
    uint32_t count, bool* out_added) {
  if (out_added)
    *out_added = false;
  pcp_topology_simplex_t simplex = pcp_topology_make_simplex(vertices, count);
  uint64_t hash = pcp_topology_simplex_hash(simplex);
  if (find_exact(complex, simplex, hash, true, NULL))
    return pcp_ok_status();
  PCP_RETURN_IF_ERROR_BARE(
      append_raw(complex, vertices, count, hash, true, true));
  if (out_added)
    *out_added = true;
  return pcp_ok_status();
}

pcp_status_t pcp_topology_complex_add(pcp_topology_complex_t* complex,
                                      pcp_topology_simplex_t simplex,
                                      bool* out_added) {
  if (out_added)
    *out_added = false;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_simplex_validate(simplex));
  pcp_topology_vertex_t small[16];
  pcp_topology_vertex_t* sorted = small;
  if (simplex.count > PCP_ARRAYSIZE(small)) {
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
        complex->allocator, simplex.count * sizeof(*sorted), (void**)&sorted));
  }
  if (simplex.count) {
    memcpy(sorted, simplex.vertices, simplex.count * sizeof(*sorted));
  }
  pcp_topology_vertices_sort(sorted, simplex.count);
  pcp_status_t status = pcp_topology_complex_insert_sorted(
      complex, sorted, simplex.count, out_added);
  if (sorted != small)
    pcp_allocator_free(complex->allocator, sorted);
  return status;
}

pcp_status_t pcp_topology_complex_add_all(
    pcp_topology_complex_t* complex, const pcp_topology_complex_t* source) {
  for (size_t i = 0; i < source->count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_complex_add(complex, listed(source, i), NULL));
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_complex_copy(const pcp_topology_complex_t* source,
                                       pcp_topology_complex_t* out_complex) {
  PCP_ASSERT(source != out_complex);
  pcp_topology_complex_clear(out_complex);
  for (size_t i = 0; i < source->count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_complex_append(out_complex, listed(source, i)));
  }
  out_complex->faces_closed = source->faces_closed;
  return pcp_ok_status();
}

bool pcp_topology_complex_find(const pcp_topology_complex_t* complex,
                               pcp_topology_simplex_t simplex,
                               size_t* out_index) {
  return find_exact(complex, simplex, pcp_topology_simplex_hash(simplex),
                    is_sorted_run(simplex.vertices, simplex.count), out_index);
}

bool pcp_topology_complex_find_containing(const pcp_topology_complex_t* complex,
                                          pcp_topology_simplex_t simplex,
                                          size_t* out_index) {
  for (size_t i = 0; i < complex->count; ++i) {
    if (pcp_topology_simplex_is_subset(simplex, listed(complex, i))) {
      if (out_index)
        *out_index = i;
      return true;
    }
  }
  return false;
}

// Builds the vertex -> listed simplices index. On allocation failure the
// caller falls back to a linear scan, so membership never fails.
static bool incidence_build(pcp_topology_complex_t* complex) {
  if (complex->incidence_valid)
    return true;
  incidence_drop(complex);
  pcp_allocator_t allocator = complex->allocator;
  pcp_topology_vertex_index_t* index = NULL;
  pcp_status_t status =
      pcp_allocator_calloc(allocator, sizeof(*index), (void**)&index);
  if (!status) {
    status = pcp_topology_vertex_index_initialize(complex, allocator, index);
    if (status) {
      pcp_allocator_free(allocator, index);
      index = NULL;
    }
  }
  complex->incidence_vertices = index;
  size_t n = index ? index->vertices.count : 0;
  uint32_t* offsets = NULL;
  uint32_t* items = NULL;
  if (!status) {
    status = pcp_allocator_calloc(allocator, (n + 2) * sizeof(*offsets),
                                  (void**)&offsets);
  }
  complex->incidence_offsets = offsets;
  if (!status && complex->pool_count) {
    status = pcp_allocator_malloc(
        allocator, complex->pool_count * sizeof(*items), (void**)&items);
  }
  complex->incidence_items = items;
  if (status) {
    // Callers fall back to a linear scan; the failure is not theirs to see.
    pcp_status_ignore(status);
    incidence_drop(complex);
    return false;
  }
  // Two passes: count per vertex, then fill (listed order, so each list is
  // increasing and "first listed superset" stays cheap).
  for (size_t s = 0; s < complex->count; ++s) {
    const pcp_topology_vertex_t* v = listed_vertices(complex, s);
    for (uint32_t i = 0; i < complex->counts[s]; ++i) {
      uint32_t id = 0;
      PCP_ASSERT(pcp_topology_vertex_index_find(index, &v[i], &id));
      offsets[id + 2]++;
    }
  }
  for (size_t i = 2; i < n + 2; ++i) offsets[i] += offsets[i - 1];
  for (size_t s = 0; s < complex->count; ++s) {
    const pcp_topology_vertex_t* v = listed_vertices(complex, s);
    for (uint32_t i = 0; i < complex->counts[s]; ++i) {
      uint32_t id = 0;
      pcp_topology_vertex_index_find(index, &v[i], &id);
      // A non-chromatic literal may repeat a vertex; the list then holds the
      // simplex twice, which scans tolerate.
      items[offsets[id + 1]++] = (uint32_t)s;
    }
  }
  // offsets[id+1] now marks the end of id's list; offsets[id] its start.
  complex->incidence_valid = true;
  return true;
}

bool pcp_topology_complex_contains(const pcp_topology_complex_t* complex,
                                   pcp_topology_simplex_t simplex) {
  if (complex->count == 0)
    return false;
  if (simplex.count == 0)
    return true;
  size_t index = 0;
  if (find_exact(complex, simplex, pcp_topology_simplex_hash(simplex),
                 is_sorted_run(simplex.vertices, simplex.count), &index)) {
    return true;
  }
  pcp_topology_complex_t* mutable_complex = (pcp_topology_complex_t*)complex;
  if (!incidence_build(mutable_complex)) {
    return pcp_topology_complex_find_containing(complex, simplex, NULL);
  }
  // Scan the shortest incidence list among the simplex's vertices.
  const uint32_t* best = NULL;
  uint32_t best_count = UINT32_MAX;
  for (uint32_t i = 0; i < simplex.count; ++i) {
    uint32_t id = 0;
    if (!pcp_topology_vertex_index_find(complex->incidence_vertices,
                                        &simplex.vertices[i], &id)) {
      return false;
    }
    uint32_t begin = complex->incidence_offsets[id];
    uint32_t end = complex->incidence_offsets[id + 1];
    if (end - begin < best_count) {
      best_count = end - begin;
      best = complex->incidence_items + begin;
    }
  }
  for (uint32_t i = 0; i < best_count; ++i) {
    if (pcp_topology_simplex_is_subset(simplex, listed(complex, best[i]))) {
      return true;
    }
  }
  return false;
}

bool pcp_topology_complex_is_subcomplex(const pcp_topology_complex_t* a,
                                        const pcp_topology_complex_t* b) {
  for (size_t i = 0; i < a->count; ++i) {
    if (!pcp_topology_complex_contains(b, listed(a, i)))
      return false;
  }
  return true;
}

bool pcp_topology_complex_equal_by_closure(const pcp_topology_complex_t* a,
                                           const pcp_topology_complex_t* b) {
  return pcp_topology_complex_is_subcomplex(a, b) &&
         pcp_topology_complex_is_subcomplex(b, a);
}

bool pcp_topology_complex_same_listing(const pcp_topology_complex_t* a,
                                       const pcp_topology_complex_t* b) {
  if (a->count != b->count)
    return false;
  for (size_t i = 0; i < a->count; ++i) {
    if (!pcp_topology_simplex_equal(listed(a, i), listed(b, i)))
      return false;
  }
  return true;
}

pcp_status_t pcp_topology_complex_validate(
    const pcp_topology_complex_t* complex,
    pcp_topology_complex_witness_t* out_witness) {
  if (out_witness)
    memset(out_witness, 0, sizeof(*out_witness));
  for (size_t i = 0; i < complex->count; ++i) {
    pcp_status_t status = pcp_topology_simplex_validate(listed(complex, i));
    if (status) {
      if (out_witness) {
        out_witness->problem = PCP_TOPOLOGY_COMPLEX_PROBLEM_DUPLICATE_COLOR;
        out_witness->index = i;
        out_witness->other_index = i;
      }
      return pcp_status_annotate_f(status, "listed simplex %zu", i);
    }
    size_t first = 0;
    if (find_exact(complex, listed(complex, i), complex->hashes[i],
                   complex->sorted[i], &first) &&
        first != i) {
      if (out_witness) {
        out_witness->problem = PCP_TOPOLOGY_COMPLEX_PROBLEM_DUPLICATE_SIMPLEX;
        out_witness->index = i;
        out_witness->other_index = first;
      }
      char text[512];
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_DUPLICATE_SIMPLEX,
          "listed simplex %zu %s repeats simplex %zu", i,
          pcp_topology_simplex_cstr(listed(complex, i), text, sizeof(text)),
          first);
    }
  }
  return pcp_ok_status();
}

int32_t pcp_topology_complex_dimension(const pcp_topology_complex_t* complex) {
  int32_t dimension = -1;
  for (size_t i = 0; i < complex->count; ++i) {
    int32_t d = (int32_t)complex->counts[i] - 1;
    if (d > dimension)
      dimension = d;
  }
  return dimension;
}

// A listed simplex is maximal when no listed simplex strictly contains it.
static bool is_maximal(const pcp_topology_complex_t* complex, size_t index) {
  pcp_topology_simplex_t s = listed(complex, index);
  pcp_topology_complex_t* mutable_complex = (pcp_topology_complex_t*)complex;
  if (s.count == 0 || !incidence_build(mutable_complex)) {
    for (size_t j = 0; j < complex->count; ++j) {
      if (pcp_topology_simplex_is_proper_subset(s, listed(complex, j))) {
        return false;
      }
    }
    return true;
  }
  uint32_t id = 0;
  pcp_topology_vertex_index_find(complex->incidence_vertices, &s.vertices[0],
                                 &id);
  for (uint32_t k = complex->incidence_offsets[id];
       k < complex->incidence_offsets[id + 1]; ++k) {
    if (pcp_topology_simplex_is_proper_subset(
            s, listed(complex, complex->incidence_items[k]))) {
      return false;
    }
  }
  return true;
}

bool pcp_topology_complex_is_pure(const pcp_topology_complex_t* complex) {
  int32_t dimension = -2;
  for (size_t i = 0; i < complex->count; ++i) {
    if (!is_maximal(complex, i))
      continue;
    int32_t d = (int32_t)complex->counts[i] - 1;
    if (dimension == -2) {
      dimension = d;
    } else if (d != dimension) {
      return false;
    }
  }
  return true;
}

//===----------------------------------------------------------------------===//
// Face enumeration
//===----------------------------------------------------------------------===//

// Faces beyond 2^24 per simplex would exceed the complex cap anyway.
#define MAX_ENUMERATED_FACE_BITS 24u

pcp_status_t pcp_topology_simplex_for_each_face(pcp_topology_simplex_t simplex,
                                                pcp_topology_face_fn_t fn,
                                                void* context) {
  uint32_t n = simplex.count;
  if (n > PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES) {
    return pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_SIMPLEX_TOO_LARGE_FOR_FACE_ENUMERATION,
        "a simplex of %u vertices (at most %u)", n,
        PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES);
  }
  if (n > MAX_ENUMERATED_FACE_BITS) {
    return pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_COMPLEX_TOO_LARGE,
        "a simplex of %u vertices has 2^%u faces (at most 2^%u enumerated)", n,
        n, MAX_ENUMERATED_FACE_BITS);
  }
  // Sort once; remember where each stored position lands, so each mask over
  // the stored order becomes a mask over the canonical order and the face
  // comes out sorted without a per-face sort.
  pcp_topology_vertex_t canonical[MAX_ENUMERATED_FACE_BITS];
  uint32_t rank[MAX_ENUMERATED_FACE_BITS];
  if (n)
    memcpy(canonical, simplex.vertices, n * sizeof(*canonical));
  pcp_topology_vertices_sort(canonical, n);
  for (uint32_t i = 0; i < n; ++i) {
    rank[i] = 0;
    for (uint32_t j = 0; j < n; ++j) {
      if (pcp_topology_vertex_equal(&canonical[j], &simplex.vertices[i])) {
        rank[i] = j;
        break;
      }
    }
  }
  pcp_topology_vertex_t face[MAX_ENUMERATED_FACE_BITS];
  uint64_t total = (uint64_t)1 << n;
  for (uint64_t mask = 0; mask < total; ++mask) {
    uint64_t canonical_mask = 0;
    for (uint32_t i = 0; i < n; ++i) {
      if (mask & ((uint64_t)1 << i))
        canonical_mask |= (uint64_t)1 << rank[i];
    }
    uint32_t count = 0;
    for (uint32_t j = 0; j < n; ++j) {
      if (canonical_mask & ((uint64_t)1 << j))
        face[count++] = canonical[j];
    }
    PCP_RETURN_IF_ERROR_BARE(fn(context, face, count));
  }
  return pcp_ok_status();
}

static pcp_status_t insert_face(void* context,
                                const pcp_topology_vertex_t* face,
                                uint32_t count) {
  return pcp_topology_complex_insert_sorted((pcp_topology_complex_t*)context,
                                            face, count, NULL);
}

pcp_status_t pcp_topology_complex_faces(const pcp_topology_complex_t* complex,
                                        pcp_topology_complex_t* out_complex) {
  PCP_ASSERT(complex != out_complex);
  pcp_topology_complex_clear(out_complex);
  for (size_t i = 0; i < complex->count; ++i) {
    if (complex->faces_closed) {
      pcp_topology_simplex_t face = listed(complex, i);
      PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_insert_sorted(
          out_complex, face.vertices, face.count, NULL));
    } else {
      PCP_RETURN_IF_ERROR_BARE(pcp_topology_simplex_for_each_face(
          listed(complex, i), insert_face, out_complex));
    }
  }
  out_complex->faces_closed = true;
  return pcp_ok_status();
}

// Runs |keep| over faces(|complex|) and lists the kept ones in |out|.
typedef bool (*face_filter_fn_t)(const void* context,
                                 pcp_topology_simplex_t face);

static pcp_status_t filter_faces(const pcp_topology_complex_t* complex,
                                 face_filter_fn_t keep, const void* context,
                                 pcp_topology_complex_t* out_complex) {
  PCP_ASSERT(complex != out_complex);
  pcp_topology_complex_clear(out_complex);
  pcp_topology_complex_t* faces = NULL;
  const pcp_topology_complex_t* source = complex;
  pcp_status_t status = pcp_ok_status();
  if (!complex->faces_closed) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_complex_create(complex->allocator, &faces));
    status = pcp_topology_complex_faces(complex, faces);
    source = faces;
  }
  for (size_t i = 0; !status && i < source->count; ++i) {
    pcp_topology_simplex_t face = listed(source, i);
    if (keep(context, face)) {
      status = pcp_topology_complex_insert_sorted(out_complex, face.vertices,
                                                  face.count, NULL);
    }
  }
  pcp_topology_complex_release(faces);
  return status;
}

pcp_status_t pcp_topology_complex_vertices(
    const pcp_topology_complex_t* complex,
    pcp_topology_vertex_list_t* out_vertices) {
  pcp_topology_vertex_list_clear(out_vertices);
  pcp_topology_vertex_index_t index;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_vertex_index_initialize(
      complex, out_vertices->allocator, &index));
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; !status && i < index.vertices.count; ++i) {
    status =
        pcp_topology_vertex_list_append(out_vertices, &index.vertices.items[i]);
  }
  pcp_topology_vertex_index_deinitialize(&index);
  return status;
}

static bool keep_skeleton(const void* context, pcp_topology_simplex_t face) {
  return (int32_t)face.count - 1 <= *(const int32_t*)context;
}

pcp_status_t pcp_topology_complex_skeleton(
    const pcp_topology_complex_t* complex, int32_t k,
    pcp_topology_complex_t* out_complex) {
  return filter_faces(complex, keep_skeleton, &k, out_complex);
}

typedef struct boundary_context_t {
  uint32_t face_count;                        // d vertices (dimension d - 1)
  const pcp_topology_complex_t* codim_faces;  // (d-1)-faces of d-simplices
  const uint32_t* multiplicity;
} boundary_context_t;

static bool keep_boundary(const void* context, pcp_topology_simplex_t face) {
  const boundary_context_t* c = (const boundary_context_t*)context;
  if (face.count != c->face_count)
    return false;
  size_t index = 0;
  if (!pcp_topology_complex_find(c->codim_faces, face, &index))
    return false;
  return c->multiplicity[index] == 1;
}

pcp_status_t pcp_topology_complex_boundary(
    const pcp_topology_complex_t* complex,
    pcp_topology_complex_t* out_complex) {
  pcp_topology_complex_clear(out_complex);
  int32_t d = pcp_topology_complex_dimension(complex);
  if (d <= 0)
    return pcp_ok_status();
  // Count, for every (d-1)-face, the listed d-simplices containing it.
  pcp_topology_complex_t* codim = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_complex_create(complex->allocator, &codim));
  uint32_t* multiplicity = NULL;
  size_t multiplicity_capacity = 0;
  pcp_status_t status = pcp_ok_status();
  pcp_topology_vertex_t face[PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES + 1];
  for (size_t s = 0; !status && s < complex->count; ++s) {
    if ((int32_t)complex->counts[s] - 1 != d)
      continue;
    pcp_topology_simplex_t simplex = listed(complex, s);
    if (simplex.count > PCP_ARRAYSIZE(face)) {
      status = pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_SIMPLEX_TOO_LARGE_FOR_FACE_ENUMERATION,
          "a simplex of %u vertices", simplex.count);
      break;
    }
    for (uint32_t omit = 0; !status && omit < simplex.count; ++omit) {
      uint32_t n = 0;
      for (uint32_t i = 0; i < simplex.count; ++i) {
        if (i != omit)
          face[n++] = simplex.vertices[i];
      }
      pcp_topology_vertices_sort(face, n);
      size_t before = codim->count;
      status = pcp_topology_complex_insert_sorted(codim, face, n, NULL);
      if (status)
        break;
      size_t index = 0;
      pcp_topology_complex_find(codim, pcp_topology_make_simplex(face, n),
                                &index);
      if (codim->count > before) {
        status = pcp_topology_grow(complex->allocator, sizeof(*multiplicity),
                                   codim->count, (void**)&multiplicity,
                                   &multiplicity_capacity);
        if (status)
          break;
        multiplicity[index] = 0;
      }
      multiplicity[index]++;
    }
  }
  if (!status) {
    boundary_context_t context = {(uint32_t)d, codim, multiplicity};
    status = filter_faces(complex, keep_boundary, &context, out_complex);
  }
  pcp_allocator_free(complex->allocator, multiplicity);
  pcp_topology_complex_release(codim);
  return status;
}

typedef struct center_context_t {
  const pcp_topology_complex_t* complex;
  pcp_topology_simplex_t center;
} center_context_t;

static bool keep_star(const void* context, pcp_topology_simplex_t face) {
  const center_context_t* c = (const center_context_t*)context;
  return pcp_topology_simplex_is_subset(c->center, face);
}

pcp_status_t pcp_topology_complex_star(const pcp_topology_complex_t* complex,
                                       pcp_topology_simplex_t center,
                                       pcp_topology_complex_t* out_complex) {
  center_context_t context = {complex, center};
  return filter_faces(complex, keep_star, &context, out_complex);
}

pcp_status_t pcp_topology_complex_closed_star(
    const pcp_topology_complex_t* complex, pcp_topology_simplex_t center,
    pcp_topology_complex_t* out_complex) {
  pcp_topology_complex_t* star = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_complex_create(complex->allocator, &star));
  pcp_status_t status = pcp_topology_complex_star(complex, center, star);
  if (!status)
    status = pcp_topology_complex_faces(star, out_complex);
  pcp_topology_complex_release(star);
  return status;
}

static bool keep_link(const void* context, pcp_topology_simplex_t face) {
  const center_context_t* c = (const center_context_t*)context;
  if (!pcp_topology_simplex_disjoint(face, c->center))
    return false;
  pcp_topology_vertex_t
      joined[2 * (PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES + 1)];
  if (face.count + c->center.count > PCP_ARRAYSIZE(joined))
    return false;
  if (face.count)
    memcpy(joined, face.vertices, face.count * sizeof(*joined));
  if (c->center.count) {
    memcpy(joined + face.count, c->center.vertices,
           c->center.count * sizeof(*joined));
  }
  return pcp_topology_complex_contains(
      c->complex,
      pcp_topology_make_simplex(joined, face.count + c->center.count));
}

pcp_status_t pcp_topology_complex_link(const pcp_topology_complex_t* complex,
                                       pcp_topology_simplex_t center,
                                       pcp_topology_complex_t* out_complex) {
  center_context_t context = {complex, center};
  return filter_faces(complex, keep_link, &context, out_complex);
}

pcp_status_t pcp_topology_complex_join(const pcp_topology_complex_t* left,
                                       const pcp_topology_complex_t* right,
                                       pcp_topology_complex_t* out_complex) {
  PCP_ASSERT(left != out_complex && right != out_complex);
  pcp_topology_complex_clear(out_complex);
  pcp_topology_complex_t* lf = NULL;
  pcp_topology_complex_t* rf = NULL;
  pcp_status_t status = pcp_topology_complex_create(left->allocator, &lf);
  if (!status)
    status = pcp_topology_complex_create(left->allocator, &rf);
  if (!status)
    status = pcp_topology_complex_faces(left, lf);
  if (!status)
    status = pcp_topology_complex_faces(right, rf);
  pcp_topology_vertex_t* joined = NULL;
  size_t joined_capacity = 0;
  for (size_t i = 0; !status && i < lf->count; ++i) {
    for (size_t j = 0; !status && j < rf->count; ++j) {
      pcp_topology_simplex_t a = listed(lf, i);
      pcp_topology_simplex_t b = listed(rf, j);
      status =
          pcp_topology_grow(left->allocator, sizeof(*joined), a.count + b.count,
                            (void**)&joined, &joined_capacity);
      if (status)
        break;
      if (a.count)
        memcpy(joined, a.vertices, a.count * sizeof(*joined));
      if (b.count) {
        memcpy(joined + a.count, b.vertices, b.count * sizeof(*joined));
      }
      status = pcp_topology_complex_add(
          out_complex, pcp_topology_make_simplex(joined, a.count + b.count),
          NULL);
      if (status)
        status = pcp_status_annotate_f(status, "join of complexes");
    }
  }
  pcp_allocator_free(left->allocator, joined);
  pcp_topology_complex_release(lf);
  pcp_topology_complex_release(rf);
  return status;
}

//===----------------------------------------------------------------------===//
// Subcomplexes
//===----------------------------------------------------------------------===//

pcp_status_t pcp_topology_subcomplex_validate(
    const pcp_topology_complex_t* parent, const pcp_topology_complex_t* sub) {
  for (size_t i = 0; i < sub->count; ++i) {
    if (!pcp_topology_complex_contains(parent, listed(sub, i))) {
      char text[512];
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_SUBCOMPLEX_OUTSIDE_PARENT,
          "simplex %s is not in the parent complex",
          pcp_topology_simplex_cstr(listed(sub, i), text, sizeof(text)));
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_subcomplex_check_same_parent(
    const pcp_topology_complex_t* a, const pcp_topology_complex_t* b) {
  if (!pcp_topology_complex_same_listing(a, b)) {
    return pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_PARENT_COMPLEX_MISMATCH,
        "parents list %zu and %zu simplices that differ", a->count, b->count);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_subcomplex_closure(
    const pcp_topology_complex_t* sub, pcp_topology_complex_t* out_complex) {
  return pcp_topology_complex_faces(sub, out_complex);
}

pcp_status_t pcp_topology_subcomplex_union(
    const pcp_topology_complex_t* a, const pcp_topology_complex_t* b,
    pcp_topology_complex_t* out_complex) {
  PCP_ASSERT(a != out_complex && b != out_complex);
  pcp_topology_complex_clear(out_complex);
  for (size_t i = 0; i < a->count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_simplex_for_each_face(
        listed(a, i), insert_face, out_complex));
  }
  for (size_t i = 0; i < b->count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_simplex_for_each_face(
        listed(b, i), insert_face, out_complex));
  }
  return pcp_ok_status();
}

static bool keep_in(const void* context, pcp_topology_simplex_t face) {
  return pcp_topology_complex_contains((const pcp_topology_complex_t*)context,
                                       face);
}

pcp_status_t pcp_topology_subcomplex_intersection(
    const pcp_topology_complex_t* a, const pcp_topology_complex_t* b,
    pcp_topology_complex_t* out_complex) {
  return filter_faces(a, keep_in, b, out_complex);
}

static bool keep_difference(const void* context, pcp_topology_simplex_t face) {
  // A face of |a| has a non-empty face in the closed |b| exactly when one of
  // its vertices is a vertex of |b|.
  const pcp_topology_complex_t* b = (const pcp_topology_complex_t*)context;
  for (uint32_t i = 0; i < face.count; ++i) {
    if (pcp_topology_complex_contains(
            b, pcp_topology_make_simplex(&face.vertices[i], 1))) {
      return false;
    }
  }
  return true;
}

pcp_status_t pcp_topology_subcomplex_difference(
    const pcp_topology_complex_t* a, const pcp_topology_complex_t* b,
    pcp_topology_complex_t* out_complex) {
  return filter_faces(a, keep_difference, b, out_complex);
}

//===----------------------------------------------------------------------===//
// Vertex index
//===----------------------------------------------------------------------===//

static bool vertex_index_eq(const void* context, uint32_t value,
                            const void* key) {
  const pcp_topology_vertex_list_t* list =
      (const pcp_topology_vertex_list_t*)context;
  return pcp_topology_vertex_equal(&list->items[value],
                                   (const pcp_topology_vertex_t*)key);
}

pcp_status_t pcp_topology_vertex_index_initialize(
    const pcp_topology_complex_t* complex, pcp_allocator_t allocator,
    pcp_topology_vertex_index_t* out_index) {
  pcp_topology_vertex_list_initialize(allocator, &out_index->vertices);
  pcp_topology_index_table_initialize(allocator, &out_index->table);
  pcp_status_t status = pcp_ok_status();
  // Collect distinct vertices, sort, then index by final position.
  for (size_t i = 0; !status && i < complex->pool_count; ++i) {
    const pcp_topology_vertex_t* v = &complex->pool[i];
    uint64_t hash = pcp_topology_vertex_hash(v);
    uint32_t found = 0;
    if (pcp_topology_index_table_find(&out_index->table, hash, vertex_index_eq,
                                      &out_index->vertices, v, &found)) {
      continue;
    }
    status = pcp_topology_index_table_insert(
        &out_index->table, hash, (uint32_t)out_index->vertices.count);
    if (!status)
      status = pcp_topology_vertex_list_append(&out_index->vertices, v);
  }
  if (!status) {
    pcp_topology_vertices_sort(out_index->vertices.items,
                               out_index->vertices.count);
    pcp_topology_index_table_clear(&out_index->table);
    for (size_t i = 0; !status && i < out_index->vertices.count; ++i) {
      status = pcp_topology_index_table_insert(
          &out_index->table,
          pcp_topology_vertex_hash(&out_index->vertices.items[i]), (uint32_t)i);
    }
  }
  if (status)
    pcp_topology_vertex_index_deinitialize(out_index);
  return status;
}

void pcp_topology_vertex_index_deinitialize(
    pcp_topology_vertex_index_t* index) {
  pcp_topology_vertex_list_deinitialize(&index->vertices);
  pcp_topology_index_table_deinitialize(&index->table);
}

bool pcp_topology_vertex_index_find(const pcp_topology_vertex_index_t* index,
                                    const pcp_topology_vertex_t* vertex,
                                    uint32_t* out_id) {
  return pcp_topology_index_table_find(
      &index->table, pcp_topology_vertex_hash(vertex), vertex_index_eq,
      &index->vertices, vertex, out_id);
}
