// SPDX-License-Identifier: Apache-2.0
//
// The obstruction catalogue (reference s.4): when no carried decision map
// exists, say *why* in topological terms, in a fixed order of increasingly
// general explanations: no candidate output at all for some local view,
// a connected protocol image that must land in a disconnected output, a
// hole the protocol has and the task lacks (or the reverse), views that
// must decide differently but are identified, and finally a bare
// "the search found nothing". The PCP name of the failure (partition,
// stale gateway, ...) is a label the caller supplies, never inferred.

#include <inttypes.h>
#include <string.h>

#include "topology/protocols_impl.h"
#include "topology/trace_impl.h"

static const char* const kKindNames[] = {
    "carrier_nonexistence",
    "disconnected_task_output",
    "hole_preservation_failure",
    "hole_creation_failure",
    "incompatible_local_view_identification",
    "solver_unsat",
    "unsupported_dimension",
};
static const char* const kInvariantNames[] = {
    "candidate_carrier",
    "connectivity",
    "betti_number",
    "induced_homology",
    "local_view_compatibility",
    "decision_search",
    "unsupported_dimension",
};
static const char* const kWitnessNames[] = {
    "generic",
    "partition",
    "stale_gateway",
    "duplicate_quorum",
    "cancellation_hole",
    "global_rollback_gap",
    "lease_owner_conflict",
};

const char* pcp_topology_obstruction_kind_name(
    pcp_topology_obstruction_kind_t kind) {
  if ((unsigned)kind >= PCP_ARRAYSIZE(kKindNames))
    return "?";
  return kKindNames[kind];
}
const char* pcp_topology_failed_invariant_name(
    pcp_topology_failed_invariant_t invariant) {
  if ((unsigned)invariant >= PCP_ARRAYSIZE(kInvariantNames))
    return "?";
  return kInvariantNames[invariant];
}
const char* pcp_topology_pcp_witness_name(pcp_topology_pcp_witness_t witness) {
  if ((unsigned)witness >= PCP_ARRAYSIZE(kWitnessNames))
    return "?";
  return kWitnessNames[witness];
}
bool pcp_topology_pcp_witness_parse(pcp_string_view_t name,
                                    pcp_topology_pcp_witness_t* out_witness) {
  for (size_t i = 0; i < PCP_ARRAYSIZE(kWitnessNames); ++i) {
    if (pcp_string_view_equal(name, pcp_make_cstring_view(kWitnessNames[i]))) {
      *out_witness = (pcp_topology_pcp_witness_t)i;
      return true;
    }
  }
  return false;
}

pcp_topology_obstruction_options_t pcp_topology_obstruction_options_default(
    void) {
  pcp_topology_obstruction_options_t options = {2, 2, 100000, 10};
  return options;
}

void pcp_topology_obstruction_report_initialize(
    pcp_allocator_t allocator, pcp_topology_obstruction_report_t* out_report) {
  memset(out_report, 0, sizeof(*out_report));
  out_report->allocator = allocator;
  pcp_topology_vertex_list_initialize(allocator, &out_report->input_face);
  pcp_topology_vertex_list_initialize(allocator,
                                      &out_report->unsat_core_vertices);
  pcp_topology_homology_witness_initialize(allocator,
                                           &out_report->homology_witness);
}

void pcp_topology_obstruction_report_deinitialize(
    pcp_topology_obstruction_report_t* report) {
  pcp_topology_vertex_list_deinitialize(&report->input_face);
  pcp_topology_vertex_list_deinitialize(&report->unsat_core_vertices);
  pcp_topology_homology_witness_deinitialize(&report->homology_witness);
  if (report->protocol_image) {
    pcp_topology_complex_release(report->protocol_image);
  }
  if (report->output_image)
    pcp_topology_complex_release(report->output_image);
  report->protocol_image = NULL;
  report->output_image = NULL;
}

static void report_reset(pcp_topology_obstruction_report_t* report) {
  pcp_allocator_t allocator = report->allocator;
  pcp_topology_obstruction_report_deinitialize(report);
  pcp_topology_obstruction_report_initialize(allocator, report);
}

// Copies |face| (canonical order) and closed copies of both images; fills
// the Betti vectors over the options' field.
static pcp_status_t report_set_face(
    pcp_topology_obstruction_report_t* report, pcp_topology_simplex_t face,
    const pcp_topology_complex_t* protocol,
    const pcp_topology_complex_t* output,
    pcp_topology_obstruction_options_t options) {
  pcp_topology_vertex_list_clear(&report->input_face);
  for (uint32_t i = 0; i < face.count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_vertex_list_append(
        &report->input_face, &face.vertices[i]));
  }
  pcp_topology_vertices_sort(report->input_face.items,
                             report->input_face.count);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_complex_create(report->allocator, &report->protocol_image));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_complex_create(report->allocator, &report->output_image));
  if (protocol) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_subcomplex_closure(protocol, report->protocol_image));
  }
  if (output) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_subcomplex_closure(output, report->output_image));
  }
  report->prime = options.prime;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_betti(
      report->protocol_image, options.prime, &report->protocol_betti));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_betti(
      report->output_image, options.prime, &report->output_betti));
  // Reports show max_homology_dimension + 1 entries (zeros past the top).
  uint32_t count = options.max_homology_dimension + 1;
  if (count > PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION + 1) {
    count = PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION + 1;
  }
  for (uint32_t k = report->protocol_betti.count; k < count; ++k) {
    report->protocol_betti.values[k] = 0;
  }
  for (uint32_t k = report->output_betti.count; k < count; ++k) {
    report->output_betti.values[k] = 0;
  }
  if (report->protocol_betti.count < count)
    report->protocol_betti.count = count;
  if (report->output_betti.count < count)
    report->output_betti.count = count;
  return pcp_ok_status();
}

static bool image_contains_vertex(const pcp_topology_complex_t* image,
                                  const pcp_topology_vertex_t* vertex) {
  return pcp_topology_complex_contains(image,
                                       pcp_topology_make_simplex(vertex, 1));
}

// The face a core is reported on: the first non-empty input face whose Xi
// image holds every core vertex, else any of them, else the first face.
static size_t core_face(const pcp_topology_carrier_map_t* execution,
                        const pcp_topology_complex_t* faces,
                        const pcp_topology_vertex_list_t* core) {
  size_t first_nonempty = SIZE_MAX;
  size_t first_any = SIZE_MAX;
  for (size_t f = 0; f < pcp_topology_complex_count(faces); ++f) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, f);
    if (face.count == 0)
      continue;
    if (first_nonempty == SIZE_MAX)
      first_nonempty = f;
    const pcp_topology_complex_t* image =
        pcp_topology_carrier_map_lookup(execution, face);
    if (!image)
      continue;
    size_t hits = 0;
    for (size_t i = 0; i < core->count; ++i) {
      hits += image_contains_vertex(image, &core->items[i]);
    }
    if (core->count > 0 && hits == core->count)
      return f;
    if (hits > 0 && first_any == SIZE_MAX)
      first_any = f;
  }
  if (first_any != SIZE_MAX)
    return first_any;
  return first_nonempty == SIZE_MAX ? 0 : first_nonempty;
}

static pcp_status_t report_on_face(pcp_topology_obstruction_report_t* report,
                                   const pcp_topology_decision_problem_t* p,
                                   pcp_topology_simplex_t face,
                                   pcp_topology_obstruction_options_t options) {
  return report_set_face(
      report, face, pcp_topology_carrier_map_lookup(p->execution, face),
      pcp_topology_carrier_map_lookup(p->task, face), options);
}

static int32_t betti_at(const pcp_topology_betti_t* betti, uint32_t k,
                        uint64_t* out_value) {
  *out_value = k < betti->count ? betti->values[k] : 0;
  return 0;
}

// Steps 3a-3c: dimension bound, then lost or created holes, face by face.
static pcp_status_t find_homology_obstruction(
    const pcp_topology_decision_problem_t* p,
    const pcp_topology_complex_t* faces,
    pcp_topology_obstruction_options_t options,
    pcp_topology_obstruction_report_t* report, bool* out_found) {
  *out_found = false;
  for (size_t f = 0; f < pcp_topology_complex_count(faces); ++f) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, f);
    if (face.count == 0)
      continue;
    const pcp_topology_complex_t* xi =
        pcp_topology_carrier_map_lookup(p->execution, face);
    const pcp_topology_complex_t* delta =
        pcp_topology_carrier_map_lookup(p->task, face);
    if (!xi || !delta)
      continue;
    int32_t dim = pcp_topology_complex_dimension(xi);
    int32_t delta_dim = pcp_topology_complex_dimension(delta);
    if (delta_dim > dim)
      dim = delta_dim;
    if (dim > (int32_t)options.max_homology_dimension) {
      report->kind = PCP_TOPOLOGY_OBSTRUCTION_UNSUPPORTED_DIMENSION;
      report->failed_invariant = PCP_TOPOLOGY_INVARIANT_UNSUPPORTED_DIMENSION;
      report->has_unsupported_dimension = true;
      report->unsupported_dimension = dim;
      *out_found = true;
      return report_on_face(report, p, face, options);
    }
    pcp_topology_betti_t xi_betti, delta_betti;
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_complex_betti(xi, options.prime, &xi_betti));
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_complex_betti(delta, options.prime, &delta_betti));
    for (uint32_t k = 1; k <= options.max_homology_dimension; ++k) {
      uint64_t a = 0, b = 0;
      betti_at(&xi_betti, k, &a);
      betti_at(&delta_betti, k, &b);
      if (a == b)
        continue;
      report->kind = a > b ? PCP_TOPOLOGY_OBSTRUCTION_HOLE_PRESERVATION_FAILURE
                           : PCP_TOPOLOGY_OBSTRUCTION_HOLE_CREATION_FAILURE;
      report->failed_invariant = PCP_TOPOLOGY_INVARIANT_BETTI_NUMBER;
      *out_found = true;
      return report_on_face(report, p, face, options);
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_obstruction_diagnose(
    const pcp_topology_decision_problem_t* problem,
    pcp_topology_pcp_witness_t witness,
    pcp_topology_obstruction_options_t options,
    pcp_topology_obstruction_report_t* inout_report, bool* out_found) {
  *out_found = false;
  report_reset(inout_report);
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_field_prime_validate(options.prime));
  pcp_topology_obstruction_report_t* report = inout_report;
  report->pcp_witness = witness;
  pcp_topology_search_options_t search = pcp_topology_search_options_default();
  search.max_assignments = options.max_assignments;
  search.max_unsat_core_vertices = options.max_unsat_core_vertices;
  pcp_topology_search_result_t result;
  pcp_topology_search_result_initialize(report->allocator, &result);
  pcp_topology_complex_t* faces = NULL;
  pcp_status_t status =
      pcp_topology_decision_map_solve(problem, search, &result);
  if (!status && result.status == PCP_TOPOLOGY_SEARCH_SATISFIABLE) {
    pcp_topology_search_result_deinitialize(&result);
    return pcp_ok_status();
  }
  if (!status) {
    status = pcp_topology_complex_create(report->allocator, &faces);
  }
  if (!status) {
    status = pcp_topology_complex_faces(
        pcp_topology_carrier_map_domain(problem->execution), faces);
  }
  for (size_t i = 0; !status && i < result.core.count; ++i) {
    status = pcp_topology_vertex_list_append(&report->unsat_core_vertices,
                                             &result.core.items[i]);
  }
  if (status)
    goto done;
  report->has_unsat_reason = true;
  report->unsat_reason = result.unsat_reason;
  *out_found = true;
  // 1. Some local view has no admissible output at all.
  if (result.unsat_reason == PCP_TOPOLOGY_UNSAT_REASON_EMPTY_CANDIDATE_SET) {
    report->kind = PCP_TOPOLOGY_OBSTRUCTION_CARRIER_NONEXISTENCE;
    report->failed_invariant = PCP_TOPOLOGY_INVARIANT_CANDIDATE_CARRIER;
    status = report_on_face(
        report, problem,
        pcp_topology_complex_simplex(
            faces, core_face(problem->execution, faces, &result.core)),
        options);
    goto done;
  }
  // 2. A connected protocol image must map into a disconnected output.
  {
    pcp_topology_connectivity_obstruction_t connectivity;
    pcp_topology_vertex_list_t face;
    pcp_topology_vertex_list_initialize(report->allocator, &face);
    status = pcp_topology_connectivity_obstruction_find(
        problem->execution, problem->task, &connectivity, &face);
    if (!status && connectivity.found) {
      report->kind = PCP_TOPOLOGY_OBSTRUCTION_DISCONNECTED_TASK_OUTPUT;
      report->failed_invariant = PCP_TOPOLOGY_INVARIANT_CONNECTIVITY;
      status = report_on_face(report, problem,
                              pcp_topology_make_simplex(face.items, face.count),
                              options);
      pcp_topology_vertex_list_deinitialize(&face);
      goto done;
    }
    pcp_topology_vertex_list_deinitialize(&face);
    if (status)
      goto done;
  }
  // 3. Dimension bound, then holes lost or created.
  {
    bool found = false;
    status = find_homology_obstruction(problem, faces, options, report, &found);
    if (status || found)
      goto done;
  }
  // 4./5. The search's own verdict.
  if (result.unsat_reason == PCP_TOPOLOGY_UNSAT_REASON_LOCAL_INCONSISTENCY) {
    report->kind =
        PCP_TOPOLOGY_OBSTRUCTION_INCOMPATIBLE_LOCAL_VIEW_IDENTIFICATION;
    report->failed_invariant = PCP_TOPOLOGY_INVARIANT_LOCAL_VIEW_COMPATIBILITY;
  } else {
    report->kind = PCP_TOPOLOGY_OBSTRUCTION_SOLVER_UNSAT;
    report->failed_invariant = PCP_TOPOLOGY_INVARIANT_DECISION_SEARCH;
  }
  status = report_on_face(
      report, problem,
      pcp_topology_complex_simplex(
          faces, core_face(problem->execution, faces, &result.core)),
      options);
done:
  if (faces)
    pcp_topology_complex_release(faces);
  pcp_topology_search_result_deinitialize(&result);
  if (status)
    *out_found = false;
  return status;
}

pcp_status_t pcp_topology_obstruction_diagnose_map(
    pcp_topology_simplex_t input_face, const pcp_topology_vertex_map_t* map,
    pcp_topology_pcp_witness_t witness,
    pcp_topology_obstruction_options_t options,
    pcp_topology_obstruction_report_t* inout_report, bool* out_found) {
  *out_found = false;
  report_reset(inout_report);
  pcp_topology_obstruction_report_t* report = inout_report;
  report->pcp_witness = witness;
  pcp_topology_homology_map_report_t homology;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_homology_map_check(map, options.prime, &homology));
  if (homology.preserves_homology)
    return pcp_ok_status();
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_homology_map_witness_find(
      map, options.prime, &report->homology_witness));
  report->kind = report->homology_witness.kind ==
                         PCP_TOPOLOGY_HOMOLOGY_WITNESS_IMAGE_CYCLE_CREATED
                     ? PCP_TOPOLOGY_OBSTRUCTION_HOLE_CREATION_FAILURE
                     : PCP_TOPOLOGY_OBSTRUCTION_HOLE_PRESERVATION_FAILURE;
  report->failed_invariant = PCP_TOPOLOGY_INVARIANT_INDUCED_HOMOLOGY;
  report->induced_rank_count = homology.induced_rank_count;
  memcpy(report->induced_ranks, homology.induced_ranks,
         sizeof(report->induced_ranks));
  pcp_topology_complex_t* image = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_complex_create(report->allocator, &image));
  pcp_status_t status = pcp_topology_vertex_map_image(map, NULL, image);
  if (!status) {
    status =
        report_set_face(report, input_face, pcp_topology_vertex_map_domain(map),
                        image, options);
  }
  pcp_topology_complex_release(image);
  if (!status)
    *out_found = true;
  return status;
}

//===----------------------------------------------------------------------===//
// Rendering
//===----------------------------------------------------------------------===//

pcp_status_t pcp_topology_simplex_format_canonical(
    pcp_topology_simplex_t simplex, pcp_string_builder_t* builder) {
  pcp_topology_vertex_t sorted[PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES + 1];
  uint32_t count = simplex.count;
  if (count > PCP_ARRAYSIZE(sorted))
    count = PCP_ARRAYSIZE(sorted);
  memcpy(sorted, simplex.vertices, count * sizeof(*sorted));
  pcp_topology_vertices_sort(sorted, count);
  return pcp_topology_simplex_format(pcp_topology_make_simplex(sorted, count),
                                     builder);
}

pcp_status_t pcp_topology_complex_format_excerpt(
    const char* name, const pcp_topology_complex_t* complex,
    pcp_string_builder_t* builder) {
  pcp_topology_complex_t* faces = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_complex_create(builder->allocator, &faces));
  pcp_status_t status = pcp_topology_complex_faces(complex, faces);
  size_t count = pcp_topology_complex_count(faces);
  if (!status) {
    status = pcp_string_builder_append_f(
        builder, "%s: simplexes=%zu dimension=%" PRId32 "\n", name, count,
        pcp_topology_complex_dimension(complex));
  }
  size_t shown = 0;
  for (size_t i = 0; !status && i < pcp_topology_complex_count(complex) &&
                     shown < PCP_TOPOLOGY_EXCERPT_LINES;
       ++i, ++shown) {
    status = pcp_string_builder_append_f(builder, "  %zu: ", i);
    if (!status) {
      status = pcp_topology_simplex_format(
          pcp_topology_complex_simplex(complex, i), builder);
    }
    if (!status)
      status = pcp_string_builder_append_cstring(builder, "\n");
  }
  if (!status && pcp_topology_complex_count(complex) > shown) {
    status = pcp_string_builder_append_f(
        builder, "  ... %zu more\n",
        pcp_topology_complex_count(complex) - shown);
  }
  pcp_topology_complex_release(faces);
  return status;
}

static pcp_status_t format_betti(const char* name,
                                 const pcp_topology_betti_t* betti,
                                 uint32_t count, pcp_string_builder_t* b) {
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(b, "%s: [", name));
  for (uint32_t k = 0; k < count; ++k) {
    uint64_t value = k < betti->count ? betti->values[k] : 0;
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_f(b, "%s%" PRIu64, k ? ", " : "", value));
  }
  return pcp_string_builder_append_cstring(b, "]\n");
}

pcp_status_t pcp_topology_obstruction_report_format(
    const pcp_topology_obstruction_report_t* r, pcp_string_builder_t* b) {
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
      b,
      "bounded topology obstruction\n"
      "kind: %s\n"
      "pcp_witness: %s\n"
      "failed_invariant: %s\n",
      pcp_topology_obstruction_kind_name(r->kind),
      pcp_topology_pcp_witness_name(r->pcp_witness),
      pcp_topology_failed_invariant_name(r->failed_invariant)));
  if (r->has_unsat_reason) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, "unsat_reason: %s\n",
        pcp_topology_unsat_reason_name(r->unsat_reason)));
  }
  if (r->has_unsupported_dimension) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, "unsupported_dimension: %" PRId32 "\n", r->unsupported_dimension));
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_cstring(b, "input_face: "));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_simplex_format(
      pcp_topology_make_simplex(r->input_face.items, r->input_face.count), b));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "\n"));
  uint32_t count = r->protocol_betti.count > r->output_betti.count
                       ? r->protocol_betti.count
                       : r->output_betti.count;
  PCP_RETURN_IF_ERROR_BARE(
      format_betti("protocol_betti", &r->protocol_betti, count, b));
  PCP_RETURN_IF_ERROR_BARE(
      format_betti("output_betti", &r->output_betti, count, b));
  if (r->induced_rank_count) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(b, "induced_ranks: ["));
    for (uint32_t k = 0; k < r->induced_rank_count; ++k) {
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
          b, "%s%" PRIu64, k ? ", " : "", r->induced_ranks[k]));
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "]\n"));
  }
  if (r->unsat_core_vertices.count) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(b, "unsat_core_vertices:"));
    for (size_t i = 0; i < r->unsat_core_vertices.count; ++i) {
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, " "));
      PCP_RETURN_IF_ERROR_BARE(pcp_topology_simplex_format(
          pcp_topology_make_simplex(&r->unsat_core_vertices.items[i], 1), b));
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "\n"));
  }
  const pcp_topology_homology_witness_t* w = &r->homology_witness;
  if (w->kind != PCP_TOPOLOGY_HOMOLOGY_WITNESS_NONE) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, "homology_witness: %s dim=%" PRId32 " prime=%" PRIu32 "\n",
        pcp_topology_homology_witness_kind_name(w->kind), w->dimension,
        w->prime));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, " source_cycle_simplexes: %zu / image_cycle_simplexes: %zu\n",
        w->source_chain.count, w->image_chain.count));
  }
  if (r->protocol_image) {
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_format_excerpt(
        "protocol_carrier_image", r->protocol_image, b));
  }
  if (r->output_image) {
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_format_excerpt(
        "output_carrier_image", r->output_image, b));
  }
  return pcp_ok_status();
}

static pcp_status_t json_betti(const char* key, const pcp_topology_betti_t* b,
                               uint32_t count, pcp_string_builder_t* out) {
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(out, ",\"%s\":[", key));
  for (uint32_t k = 0; k < count; ++k) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        out, "%s%" PRIu64, k ? "," : "", k < b->count ? b->values[k] : 0));
  }
  return pcp_string_builder_append_cstring(out, "]");
}

static pcp_status_t json_simplex(pcp_topology_simplex_t simplex,
                                 pcp_string_builder_t* out) {
  pcp_string_builder_t text;
  pcp_string_builder_initialize(out->allocator, 0, &text);
  pcp_status_t status = pcp_topology_simplex_format(simplex, &text);
  if (!status) {
    status =
        pcp_topology_json_append_string(out, pcp_string_builder_cstring(&text));
  }
  pcp_string_builder_deinitialize(&text);
  return status;
}

pcp_status_t pcp_topology_obstruction_report_format_json(
    const pcp_topology_obstruction_report_t* r, pcp_string_builder_t* b) {
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
      b,
      "{\"schema\":\"pcp.topology.obstruction.v1\",\"kind\":\"%s\","
      "\"pcp_witness\":\"%s\",\"failed_invariant\":\"%s\"",
      pcp_topology_obstruction_kind_name(r->kind),
      pcp_topology_pcp_witness_name(r->pcp_witness),
      pcp_topology_failed_invariant_name(r->failed_invariant)));
  if (r->has_unsat_reason) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, ",\"unsat_reason\":\"%s\"",
        pcp_topology_unsat_reason_name(r->unsat_reason)));
  }
  if (r->has_unsupported_dimension) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, ",\"unsupported_dimension\":%" PRId32, r->unsupported_dimension));
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_cstring(b, ",\"input_face\":"));
  PCP_RETURN_IF_ERROR_BARE(json_simplex(
      pcp_topology_make_simplex(r->input_face.items, r->input_face.count), b));
  uint32_t count = r->protocol_betti.count > r->output_betti.count
                       ? r->protocol_betti.count
                       : r->output_betti.count;
  PCP_RETURN_IF_ERROR_BARE(
      json_betti("protocol_betti", &r->protocol_betti, count, b));
  PCP_RETURN_IF_ERROR_BARE(
      json_betti("output_betti", &r->output_betti, count, b));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_cstring(b, ",\"induced_ranks\":["));
  for (uint32_t k = 0; k < r->induced_rank_count; ++k) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, "%s%" PRIu64, k ? "," : "", r->induced_ranks[k]));
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_cstring(b, "],\"unsat_core_vertices\":["));
  for (size_t i = 0; i < r->unsat_core_vertices.count; ++i) {
    if (i)
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, ","));
    PCP_RETURN_IF_ERROR_BARE(json_simplex(
        pcp_topology_make_simplex(&r->unsat_core_vertices.items[i], 1), b));
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "]"));
  const pcp_topology_homology_witness_t* w = &r->homology_witness;
  if (w->kind != PCP_TOPOLOGY_HOMOLOGY_WITNESS_NONE) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b,
        ",\"homology_witness\":{\"kind\":\"%s\",\"dimension\":%" PRId32
        ",\"prime\":%" PRIu32
        ",\"source_cycle_simplexes\":%zu,"
        "\"image_cycle_simplexes\":%zu}",
        pcp_topology_homology_witness_kind_name(w->kind), w->dimension,
        w->prime, w->source_chain.count, w->image_chain.count));
  }
  return pcp_string_builder_append_cstring(b, "}");
}
