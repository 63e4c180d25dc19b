// SPDX-License-Identifier: Apache-2.0
//
// Review artifacts: the analysis report that puts a counterexample next to
// the objects it refutes (I, P, O, Xi, Delta, delta), stable signatures of
// carriers and decision maps for CI diffs, and the regression corpus of
// known-invalid protocol designs.

#include <inttypes.h>
#include <string.h>

#include "topology/protocols_impl.h"
#include "topology/trace_impl.h"

// Seeds spell "crrr_sig" and "map_sig": fixed forever, since CI compares
// signatures across builds.
#define CARRIER_SIGNATURE_SEED 0x637272725f736967ull
#define MAP_SIGNATURE_SEED 0x6d61705f736967ull

static void hash_face(pcp_topology_hasher_t* hasher,
                      pcp_topology_simplex_t face) {
  pcp_topology_vertex_t sorted[PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES + 1];
  uint32_t count = face.count;
  if (count > PCP_ARRAYSIZE(sorted))
    count = PCP_ARRAYSIZE(sorted);
  if (count)
    memcpy(sorted, face.vertices, count * sizeof(*sorted));
  pcp_topology_vertices_sort(sorted, count);
  pcp_topology_hasher_update_le(hasher, count, 8);
  for (uint32_t i = 0; i < count; ++i) {
    pcp_topology_hasher_update_le(hasher,
                                  pcp_topology_color_hash(sorted[i].color), 8);
    pcp_topology_hasher_update_le(hasher,
                                  pcp_topology_label_hash(&sorted[i].label), 8);
  }
}

pcp_status_t pcp_topology_carrier_signature(
    const pcp_topology_carrier_map_t* carrier, uint64_t* out_signature) {
  *out_signature = 0;
  PCP_RETURN_IF_ERROR(pcp_topology_carrier_map_validate(
                          carrier, pcp_topology_carrier_checks_default()),
                      "signing a carrier");
  pcp_allocator_t allocator =
      pcp_topology_complex_allocator(pcp_topology_carrier_map_domain(carrier));
  pcp_topology_complex_t* faces = NULL;
  pcp_topology_complex_t* image_faces = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(allocator, &faces));
  pcp_status_t status = pcp_topology_complex_create(allocator, &image_faces);
  if (!status) {
    status = pcp_topology_complex_faces(
        pcp_topology_carrier_map_domain(carrier), faces);
  }
  pcp_topology_hasher_t hasher;
  pcp_topology_hasher_initialize(CARRIER_SIGNATURE_SEED, &hasher);
  for (size_t f = 0; !status && f < pcp_topology_complex_count(faces); ++f) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, f);
    hash_face(&hasher, face);
    const pcp_topology_complex_t* image =
        pcp_topology_carrier_map_lookup(carrier, face);
    if (!image)
      continue;
    status = pcp_topology_complex_faces(image, image_faces);
    for (size_t i = 0; !status && i < pcp_topology_complex_count(image_faces);
         ++i) {
      hash_face(&hasher, pcp_topology_complex_simplex(image_faces, i));
    }
  }
  pcp_topology_complex_release(faces);
  if (image_faces)
    pcp_topology_complex_release(image_faces);
  if (!status)
    *out_signature = pcp_topology_hasher_finish(&hasher);
  return status;
}

pcp_status_t pcp_topology_map_signature(const pcp_topology_vertex_map_t* map,
                                        uint64_t* out_signature) {
  *out_signature = 0;
  pcp_topology_vertex_list_t vertices;
  pcp_topology_vertex_list_initialize(
      pcp_topology_complex_allocator(pcp_topology_vertex_map_domain(map)),
      &vertices);
  pcp_status_t status = pcp_topology_complex_vertices(
      pcp_topology_vertex_map_domain(map), &vertices);
  pcp_topology_hasher_t hasher;
  pcp_topology_hasher_initialize(MAP_SIGNATURE_SEED, &hasher);
  for (size_t i = 0; !status && i < vertices.count; ++i) {
    pcp_topology_vertex_t target;
    if (!pcp_topology_vertex_map_lookup(map, &vertices.items[i], &target)) {
      status =
          pcp_topology_make_status(PCP_TOPOLOGY_ERROR_MISSING_VERTEX_MAP_ENTRY,
                                   "signing a map with an unmapped vertex");
      break;
    }
    pcp_topology_hasher_update_le(
        &hasher, pcp_topology_vertex_hash(&vertices.items[i]), 8);
    pcp_topology_hasher_update_le(&hasher, pcp_topology_vertex_hash(&target),
                                  8);
  }
  pcp_topology_vertex_list_deinitialize(&vertices);
  if (!status)
    *out_signature = pcp_topology_hasher_finish(&hasher);
  return status;
}

//===----------------------------------------------------------------------===//
// Regression corpus
//===----------------------------------------------------------------------===//

static const pcp_topology_regression_entry_t kCorpus[] = {
    {"message.worker_result_to_worker", "message_dispatch",
     "worker results must stay in the gateway queue",
     "a worker result (DecoupledFragmentUpdate) dispatched back to a worker "
     "handler shares the controller-command view"},
    {"scheduling.cross_owner_capacity", "gateway_lease_scheduling",
     "a lease must not starve another owner's reserved_workers",
     "training leases the worker inference keeps in reserve"},
    {"reservation.cancel_cleanup", "reservation_lifecycle",
     "canceling a queued reserved job releases its workers",
     "the canceled job's worker still looks leased"},
    {"federation.stale_gateway", "federation_placement",
     "a stale gateway is never selected",
     "the hub places on a disconnected gateway as if it were current"},
    {"diloco.duplicate_quorum", "decoupled_fragment",
     "each sender counts once towards the merge quorum",
     "a duplicate fragment update completes the quorum and commits"},
    {"rda.direct_average_escape", "rda_merge",
     "below quorum the RDA merge publishes nothing",
     "a direct average published below quorum escapes the RDA carrier"},
    {"global.partial_loss_without_rollback", "multi_gateway_global_job",
     "a global job that loses a gateway must roll back",
     "committing across two gateways without rollback leaves a 2-dimensional "
     "hole in the output complex"},
};

const pcp_topology_regression_entry_t* pcp_topology_regression_corpus(
    size_t* out_count) {
  *out_count = PCP_ARRAYSIZE(kCorpus);
  return kCorpus;
}

//===----------------------------------------------------------------------===//
// Analysis report
//===----------------------------------------------------------------------===//

static pcp_status_t face_count(const pcp_topology_complex_t* complex,
                               size_t* out_count) {
  pcp_topology_complex_t* faces = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(
      pcp_topology_complex_allocator(complex), &faces));
  pcp_status_t status = pcp_topology_complex_faces(complex, faces);
  *out_count = pcp_topology_complex_count(faces);
  pcp_topology_complex_release(faces);
  return status;
}

static pcp_status_t format_carrier_excerpt(
    const char* name, const pcp_topology_carrier_map_t* carrier,
    pcp_string_builder_t* b) {
  size_t count = pcp_topology_carrier_map_count(carrier);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_f(b, "%s: carrier_entries=%zu\n", name, count));
  size_t shown = 0;
  for (size_t i = 0; i < count && shown < PCP_TOPOLOGY_EXCERPT_LINES;
       ++i, ++shown) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(b, "  %zu: ", i));
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_simplex_format(
        pcp_topology_carrier_map_entry_simplex(carrier, i), b));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, " -> ["));
    const pcp_topology_complex_t* image =
        pcp_topology_carrier_map_entry_image(carrier, i);
    for (size_t k = 0; k < pcp_topology_complex_count(image); ++k) {
      if (k)
        PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, ", "));
      PCP_RETURN_IF_ERROR_BARE(pcp_topology_simplex_format(
          pcp_topology_complex_simplex(image, k), b));
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "]\n"));
  }
  if (count > shown) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_f(b, "  ... %zu more\n", count - shown));
  }
  return pcp_ok_status();
}

static pcp_status_t format_map_excerpt(const pcp_topology_vertex_map_t* map,
                                       pcp_string_builder_t* b) {
  size_t count = pcp_topology_vertex_map_count(map);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_f(b, "delta: vertex_map_entries=%zu\n", count));
  size_t shown = 0;
  for (size_t i = 0; i < count && shown < PCP_TOPOLOGY_EXCERPT_LINES;
       ++i, ++shown) {
    pcp_topology_vertex_t source, target;
    pcp_topology_vertex_map_entry(map, i, &source, &target);
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(b, "  %zu: ", i));
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_vertex_format(&source, b));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, " -> "));
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_vertex_format(&target, b));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "\n"));
  }
  if (count > shown) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_f(b, "  ... %zu more\n", count - shown));
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_analysis_report_format(
    const pcp_topology_analysis_report_t* r, pcp_string_builder_t* b) {
  size_t events = r->replay ? r->replay->event_count : 0;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_f(b,
                                  "pcp topology counterexample\n"
                                  "violated_rule: %s\n"
                                  "seed: %" PRIu64 "\n"
                                  "events: %zu\n\n",
                                  r->violated_rule ? r->violated_rule : "",
                                  r->replay ? r->replay->seed : 0, events));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_format_excerpt(
      "I", pcp_topology_carrier_map_domain(r->execution), b));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_format_excerpt(
      "P", pcp_topology_carrier_map_codomain(r->execution), b));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_format_excerpt(
      "O", pcp_topology_carrier_map_codomain(r->task), b));
  PCP_RETURN_IF_ERROR_BARE(format_carrier_excerpt("Xi", r->execution, b));
  PCP_RETURN_IF_ERROR_BARE(format_carrier_excerpt("Delta", r->task, b));
  if (r->decision)
    PCP_RETURN_IF_ERROR_BARE(format_map_excerpt(r->decision, b));
  if (r->escape && r->escape->found) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(
        b, "minimal_offending_simplex:\n  input: "));
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_simplex_format(
        pcp_topology_make_simplex(r->escape->input.items,
                                  r->escape->input.count),
        b));
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(b, "\n  offending_output: "));
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_simplex_format(
        pcp_topology_make_simplex(r->escape->offending_output.items,
                                  r->escape->offending_output.count),
        b));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "\n"));
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_format_excerpt(
        "  decided_image", r->escape->decided_image, b));
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_format_excerpt(
        "  allowed_image", r->escape->allowed_image, b));
  }
  if (r->replay) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(b, "replay_events:\n"));
    for (size_t i = 0; i < events; ++i) {
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "  "));
      PCP_RETURN_IF_ERROR_BARE(
          pcp_topology_event_format(i, r->replay->events[i], b));
    }
  }
  return pcp_ok_status();
}

static pcp_status_t json_simplex(const pcp_topology_vertex_list_t* list,
                                 pcp_string_builder_t* b) {
  pcp_string_builder_t text;
  pcp_string_builder_initialize(b->allocator, 0, &text);
  pcp_status_t status = pcp_topology_simplex_format(
      pcp_topology_make_simplex(list->items, list->count), &text);
  if (!status) {
    status =
        pcp_topology_json_append_string(b, pcp_string_builder_cstring(&text));
  }
  pcp_string_builder_deinitialize(&text);
  return status;
}

pcp_status_t pcp_topology_analysis_report_format_json(
    const pcp_topology_analysis_report_t* r, pcp_string_builder_t* b) {
  size_t input = 0, protocol = 0, output = 0;
  PCP_RETURN_IF_ERROR_BARE(
      face_count(pcp_topology_carrier_map_domain(r->execution), &input));
  PCP_RETURN_IF_ERROR_BARE(
      face_count(pcp_topology_carrier_map_codomain(r->execution), &protocol));
  PCP_RETURN_IF_ERROR_BARE(
      face_count(pcp_topology_carrier_map_codomain(r->task), &output));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(
      b,
      "{\"schema\":\"pcp.topology.analysis.v1\",\"title\":\"pcp topology "
      "counterexample\",\"violated_rule\":"));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_json_append_string(b, r->violated_rule));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
      b,
      ",\"seed\":%" PRIu64
      ",\"counts\":{\"input_simplexes\":%zu,"
      "\"protocol_simplexes\":%zu,\"output_simplexes\":%zu}",
      r->replay ? r->replay->seed : 0, input, protocol, output));
  if (r->escape && r->escape->found) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(
        b, ",\"witness\":{\"input_simplex\":"));
    PCP_RETURN_IF_ERROR_BARE(json_simplex(&r->escape->input, b));
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(b, ",\"offending_output\":"));
    PCP_RETURN_IF_ERROR_BARE(json_simplex(&r->escape->offending_output, b));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "}"));
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_cstring(b, ",\"events\":"));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_json_append_events(b, r->replay ? r->replay->events : NULL,
                                      r->replay ? r->replay->event_count : 0));
  return pcp_string_builder_append_cstring(b, "}");
}
