// SPDX-License-Identifier: Apache-2.0
//
// Protocol-complex generation (reference s.2.5): run bounded schedules on
// every input face, collect the local views the processes end with as
// simplices of P, and record which views each input face can reach (the
// execution carrier Xi) together with the trace that reached each one.
//
// Exhaustive generation enumerates every schedule of the given depth over
// the events the face's processes can perform, pruned by partial-order
// reduction (adjacent independent events are kept in one canonical order
// only). Random generation draws schedules from a seeded pcp_rng_t; the
// seed is printed in every trace so any view can be replayed.

#include <string.h>

#include "topology/protocols_impl.h"
#include "topology/trace_impl.h"

// Bound on schedules one generation may run, whatever depth and alphabet
// ask for: 2^20 runs of a toy extractor already take seconds.
#define MAX_GENERATED_TRACES (1u << 20)

pcp_topology_generation_options_t pcp_topology_generation_options_default(
    void) {
  pcp_topology_generation_options_t options;
  memset(&options, 0, sizeof(options));
  options.depth = 1;
  options.partial_order_reduction = true;
  options.require_nonempty_inputs = true;
  options.traces_per_face = 1;
  return options;
}

pcp_status_t pcp_topology_process_set_validate(
    const pcp_topology_process_t* processes, size_t count) {
  if (count > PCP_TOPOLOGY_MAX_PROCESSES) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "process set has %zu processes; at most %u", count,
                           PCP_TOPOLOGY_MAX_PROCESSES);
  }
  for (size_t i = 0; i < count; ++i) {
    for (size_t j = i + 1; j < count; ++j) {
      if (processes[i].id == processes[j].id) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "process id %u appears twice",
                               (unsigned)processes[i].id);
      }
      if (pcp_topology_color_equal(processes[i].color, processes[j].color)) {
        return pcp_topology_make_status(PCP_TOPOLOGY_ERROR_DUPLICATE_COLOR,
                                        "processes %u and %u share a colour",
                                        (unsigned)processes[i].id,
                                        (unsigned)processes[j].id);
      }
    }
  }
  return pcp_ok_status();
}

static const pcp_topology_process_t* find_process(
    const pcp_topology_process_t* processes, size_t count, uint16_t id) {
  for (size_t i = 0; i < count; ++i) {
    if (processes[i].id == id)
      return &processes[i];
  }
  return NULL;
}

pcp_status_t pcp_topology_event_alphabet_validate(
    const pcp_topology_process_t* processes, size_t process_count,
    const pcp_topology_event_t* events, size_t event_count) {
  for (size_t i = 0; i < event_count; ++i) {
    if (!find_process(processes, process_count, events[i].actor)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "alphabet event %zu: actor %u is not a process", i,
                             (unsigned)events[i].actor);
    }
    if (events[i].peer != PCP_TOPOLOGY_NO_NODE &&
        !find_process(processes, process_count, events[i].peer)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "alphabet event %zu: peer %u is not a process", i,
                             (unsigned)events[i].peer);
    }
  }
  return pcp_ok_status();
}

uint64_t pcp_topology_mix_seed(uint64_t seed, uint64_t face, uint64_t k) {
  uint64_t x = seed ^ (face * 0x9e3779b97f4a7c15ull);
  x ^= k * 0xbf58476d1ce4e5b9ull;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

void pcp_topology_protocol_complex_initialize(
    pcp_allocator_t allocator, pcp_topology_protocol_complex_t* out_result) {
  memset(out_result, 0, sizeof(*out_result));
  out_result->allocator = allocator;
}

void pcp_topology_protocol_complex_deinitialize(
    pcp_topology_protocol_complex_t* result) {
  if (result->execution)
    pcp_topology_carrier_map_release(result->execution);
  if (result->protocol)
    pcp_topology_complex_release(result->protocol);
  if (result->input_faces)
    pcp_topology_complex_release(result->input_faces);
  for (size_t i = 0; i < result->trace_count; ++i) {
    pcp_topology_trace_deinitialize(&result->traces[i]);
  }
  if (result->traces)
    pcp_allocator_free(result->allocator, result->traces);
  if (result->witnesses) {
    pcp_allocator_free(result->allocator, result->witnesses);
  }
  pcp_allocator_t allocator = result->allocator;
  memset(result, 0, sizeof(*result));
  result->allocator = allocator;
}

typedef struct generator_t {
  const pcp_topology_complex_t* input;
  const pcp_topology_process_t* processes;
  size_t process_count;
  const pcp_topology_event_t* alphabet;
  size_t alphabet_count;
  pcp_topology_generation_options_t options;
  pcp_topology_view_fn_t view_fn;
  void* user_data;
  pcp_topology_protocol_complex_t* result;
  // Per face:
  pcp_topology_simplex_t face;
  uint32_t face_index;
  pcp_topology_event_t supported[256];
  size_t supported_count;
  pcp_topology_complex_t* face_image;  // simplices recorded for this face
  size_t face_records;
  pcp_topology_event_t prefix[PCP_TOPOLOGY_MAX_GENERATION_DEPTH];
  pcp_topology_vertex_list_t view;
} generator_t;

static bool color_in_face(pcp_topology_simplex_t face,
                          pcp_topology_color_t color) {
  return pcp_topology_simplex_vertex_with_color(face, color) >= 0;
}

static void collect_supported(generator_t* g) {
  g->supported_count = 0;
  for (size_t i = 0; i < g->alphabet_count; ++i) {
    const pcp_topology_event_t* e = &g->alphabet[i];
    const pcp_topology_process_t* actor =
        find_process(g->processes, g->process_count, e->actor);
    if (!actor || !color_in_face(g->face, actor->color))
      continue;
    if (e->peer != PCP_TOPOLOGY_NO_NODE) {
      const pcp_topology_process_t* peer =
          find_process(g->processes, g->process_count, e->peer);
      if (!peer || !color_in_face(g->face, peer->color))
        continue;
    }
    if (g->supported_count < PCP_ARRAYSIZE(g->supported)) {
      g->supported[g->supported_count++] = *e;
    }
  }
}

static pcp_status_t append_trace(pcp_topology_protocol_complex_t* r,
                                 uint64_t seed,
                                 const pcp_topology_event_t* events,
                                 size_t count, uint64_t state_hash,
                                 uint32_t* out_index) {
  if (r->trace_count >= MAX_GENERATED_TRACES) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "protocol-complex generation exceeds %u traces",
                           MAX_GENERATED_TRACES);
  }
  if (r->trace_count == r->trace_capacity) {
    size_t capacity = r->trace_capacity ? r->trace_capacity * 2 : 16;
    void* traces = r->traces;
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_realloc(
        r->allocator, capacity * sizeof(*r->traces), &traces));
    r->traces = traces;
    void* witnesses = r->witnesses;
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_realloc(
        r->allocator, capacity * sizeof(*r->witnesses), &witnesses));
    r->witnesses = witnesses;
    r->trace_capacity = capacity;
  }
  pcp_topology_trace_t* trace = &r->traces[r->trace_count];
  pcp_topology_trace_initialize(r->allocator, seed, trace);
  r->trace_count++;
  for (size_t i = 0; i < count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_trace_append(trace, events[i]));
  }
  pcp_topology_snapshot_t snapshot;
  memset(&snapshot, 0, sizeof(snapshot));
  snapshot.steps = (uint32_t)count;
  snapshot.checksum = state_hash;
  pcp_topology_trace_finish(trace, &snapshot);
  *out_index = (uint32_t)(r->trace_count - 1);
  return pcp_ok_status();
}

// Runs one schedule on the current face and records its view.
static pcp_status_t record_leaf(generator_t* g, uint64_t seed,
                                const pcp_topology_event_t* events,
                                size_t count) {
  pcp_topology_vertex_list_clear(&g->view);
  uint64_t state_hash = 0;
  PCP_RETURN_IF_ERROR(g->view_fn(g->user_data, g->face, seed, events, count,
                                 &g->view, &state_hash),
                      "extracting the local views of input face %u",
                      g->face_index);
  pcp_topology_simplex_t view =
      pcp_topology_make_simplex(g->view.items, g->view.count);
  PCP_RETURN_IF_ERROR(pcp_topology_simplex_validate(view),
                      "local views of input face %u", g->face_index);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_complex_add(g->result->protocol, view, NULL));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_add(g->face_image, view, NULL));
  size_t protocol_index = 0;
  if (!pcp_topology_complex_find(g->result->protocol, view, &protocol_index)) {
    return pcp_make_status(PCP_STATUS_INTERNAL, "view vanished from P");
  }
  uint32_t trace_index = 0;
  PCP_RETURN_IF_ERROR_BARE(
      append_trace(g->result, seed, events, count, state_hash, &trace_index));
  pcp_topology_generation_witness_t* w = &g->result->witnesses[trace_index];
  w->input_index = g->face_index;
  w->protocol_index = (uint32_t)protocol_index;
  w->trace_index = trace_index;
  w->event_count = (uint32_t)count;
  w->state_hash = state_hash;
  g->face_records++;
  return pcp_ok_status();
}

static pcp_status_t exhaustive_dfs(generator_t* g, uint32_t depth) {
  if (depth == g->options.depth) {
    return record_leaf(g, g->options.seed, g->prefix, depth);
  }
  for (size_t i = 0; i < g->supported_count; ++i) {
    pcp_topology_event_t next = g->supported[i];
    if (g->options.partial_order_reduction &&
        !pcp_topology_partial_order_allows(g->prefix, depth, next)) {
      continue;
    }
    g->prefix[depth] = next;
    PCP_RETURN_IF_ERROR_BARE(exhaustive_dfs(g, depth + 1));
  }
  return pcp_ok_status();
}

static pcp_status_t generate(generator_t* g, bool random) {
  pcp_topology_protocol_complex_t* r = g->result;
  if (g->options.depth > PCP_TOPOLOGY_MAX_GENERATION_DEPTH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "DepthTooLarge: depth %u exceeds %u",
                           g->options.depth, PCP_TOPOLOGY_MAX_GENERATION_DEPTH);
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_process_set_validate(g->processes, g->process_count));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_event_alphabet_validate(
      g->processes, g->process_count, g->alphabet, g->alphabet_count));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_validate(g->input, NULL));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_complex_create(r->allocator, &r->protocol));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_complex_create(r->allocator, &r->input_faces));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_complex_faces(g->input, r->input_faces));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_complex_create(r->allocator, &g->face_image));
  // Images are collected first and the carrier built afterwards, because P
  // grows while faces are visited and the carrier borrows its codomain.
  size_t face_count = pcp_topology_complex_count(r->input_faces);
  pcp_topology_complex_t** images = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      r->allocator, (face_count ? face_count : 1) * sizeof(*images),
      (void**)&images));
  pcp_status_t status = pcp_ok_status();
  pcp_rng_t rng;
  pcp_rng_initialize(g->options.seed, &rng);
  for (size_t f = 0; !status && f < face_count; ++f) {
    g->face = pcp_topology_complex_simplex(r->input_faces, f);
    g->face_index = (uint32_t)f;
    g->face_records = 0;
    pcp_topology_complex_clear(g->face_image);
    collect_supported(g);
    if (g->options.depth == 0) {
      status = record_leaf(g, g->options.seed, NULL, 0);
    } else if (!random) {
      status = exhaustive_dfs(g, 0);
    } else if (g->supported_count > 0) {
      for (uint32_t k = 0; !status && k < g->options.traces_per_face; ++k) {
        for (uint32_t d = 0; d < g->options.depth; ++d) {
          g->prefix[d] =
              g->supported[pcp_rng_next_below(&rng, g->supported_count)];
        }
        status = record_leaf(g, pcp_topology_mix_seed(g->options.seed, f, k),
                             g->prefix, g->options.depth);
      }
    }
    if (!status && g->face.count > 0 && g->face_records == 0 &&
        g->options.require_nonempty_inputs) {
      status = pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_EMPTY_EXECUTION_CARRIER,
          "input face %zu reaches no protocol simplex (no supported events)",
          f);
    }
    if (!status) {
      status = pcp_topology_complex_create(r->allocator, &images[f]);
    }
    if (!status)
      status = pcp_topology_complex_copy(g->face_image, images[f]);
  }
  if (!status) {
    status = pcp_topology_carrier_map_create(g->input, r->protocol,
                                             r->allocator, &r->execution);
  }
  for (size_t f = 0; !status && f < face_count; ++f) {
    status = pcp_topology_carrier_map_set(
        r->execution, pcp_topology_complex_simplex(r->input_faces, f),
        images[f]);
  }
  for (size_t f = 0; f < face_count; ++f) {
    if (images[f])
      pcp_topology_complex_release(images[f]);
  }
  pcp_allocator_free(r->allocator, images);
  pcp_topology_complex_release(g->face_image);
  g->face_image = NULL;
  // A random sample need not be monotone (a face can draw a view its
  // cofaces never draw), so only the exhaustive carrier is held to it.
  if (!status && !random) {
    status = pcp_topology_carrier_map_validate(
        r->execution, pcp_topology_carrier_checks_default());
    if (status)
      status = pcp_status_annotate_f(status, "generated Xi");
  }
  return status;
}

static pcp_status_t generate_entry(
    const pcp_topology_complex_t* input,
    const pcp_topology_process_t* processes, size_t process_count,
    const pcp_topology_event_t* alphabet, size_t alphabet_count,
    pcp_topology_generation_options_t options, pcp_topology_view_fn_t view_fn,
    void* user_data, bool random, pcp_topology_protocol_complex_t* result) {
  pcp_topology_protocol_complex_deinitialize(result);
  generator_t g;
  memset(&g, 0, sizeof(g));
  g.input = input;
  g.processes = processes;
  g.process_count = process_count;
  g.alphabet = alphabet;
  g.alphabet_count = alphabet_count;
  g.options = options;
  g.view_fn = view_fn;
  g.user_data = user_data;
  g.result = result;
  pcp_topology_vertex_list_initialize(result->allocator, &g.view);
  pcp_status_t status = generate(&g, random);
  pcp_topology_vertex_list_deinitialize(&g.view);
  if (g.face_image)
    pcp_topology_complex_release(g.face_image);
  if (status)
    pcp_topology_protocol_complex_deinitialize(result);
  return status;
}

pcp_status_t pcp_topology_protocol_complex_generate_exhaustive(
    const pcp_topology_complex_t* input,
    const pcp_topology_process_t* processes, size_t process_count,
    const pcp_topology_event_t* alphabet, size_t alphabet_count,
    pcp_topology_generation_options_t options, pcp_topology_view_fn_t view_fn,
    void* user_data, pcp_topology_protocol_complex_t* inout_result) {
  return generate_entry(input, processes, process_count, alphabet,
                        alphabet_count, options, view_fn, user_data, false,
                        inout_result);
}

pcp_status_t pcp_topology_protocol_complex_generate_random(
    const pcp_topology_complex_t* input,
    const pcp_topology_process_t* processes, size_t process_count,
    const pcp_topology_event_t* alphabet, size_t alphabet_count,
    pcp_topology_generation_options_t options, pcp_topology_view_fn_t view_fn,
    void* user_data, pcp_topology_protocol_complex_t* inout_result) {
  return generate_entry(input, processes, process_count, alphabet,
                        alphabet_count, options, view_fn, user_data, true,
                        inout_result);
}

//===----------------------------------------------------------------------===//
// Shrinking to the same protocol simplex
//===----------------------------------------------------------------------===//

typedef struct same_view_t {
  pcp_topology_view_fn_t view_fn;
  void* user_data;
  pcp_topology_simplex_t face;
  pcp_topology_simplex_t target;
  pcp_topology_vertex_list_t view;
} same_view_t;

static bool ends_at_target(void* user_data, uint64_t seed,
                           const pcp_topology_event_t* events, size_t count) {
  same_view_t* s = (same_view_t*)user_data;
  pcp_topology_vertex_list_clear(&s->view);
  uint64_t hash = 0;
  pcp_status_t status =
      s->view_fn(s->user_data, s->face, seed, events, count, &s->view, &hash);
  if (status) {
    pcp_status_ignore(status);
    return false;
  }
  return pcp_topology_simplex_equal(
      pcp_topology_make_simplex(s->view.items, s->view.count), s->target);
}

pcp_status_t pcp_topology_trace_shrink_to_protocol_simplex(
    pcp_topology_view_fn_t view_fn, void* user_data,
    pcp_topology_simplex_t input_face, pcp_topology_simplex_t target,
    uint64_t seed, const pcp_topology_event_t* events, size_t event_count,
    pcp_allocator_t allocator, pcp_topology_shrink_result_t* out_result) {
  same_view_t s;
  memset(&s, 0, sizeof(s));
  s.view_fn = view_fn;
  s.user_data = user_data;
  s.face = input_face;
  s.target = target;
  pcp_topology_vertex_list_initialize(allocator, &s.view);
  pcp_status_t status = pcp_topology_events_shrink(
      allocator, seed, events, event_count, ends_at_target, &s, out_result);
  pcp_topology_vertex_list_deinitialize(&s.view);
  if (pcp_status_code(status) == PCP_STATUS_FAILED_PRECONDITION) {
    return pcp_status_annotate_f(
        status,
        "PredicateDoesNotHold: the trace does not end at the target "
        "protocol simplex");
  }
  return status;
}
