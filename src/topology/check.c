// SPDX-License-Identifier: Apache-2.0
//
// `pcp topo check`: build a model, decide whether a carried decision map
// exists (native search or Z3), hold the model's own decisions to the task,
// and explain a negative answer (obstruction report or counterexample).

#include <inttypes.h>
#include <string.h>

#include "topology/protocols_impl.h"
#include "topology/trace_impl.h"

static const char* const kVerdictNames[] = {"solvable", "decision_escape",
                                            "obstruction", "unknown"};

const char* pcp_topology_verdict_name(pcp_topology_verdict_t verdict) {
  if ((unsigned)verdict >= PCP_ARRAYSIZE(kVerdictNames))
    return "?";
  return kVerdictNames[verdict];
}

//===----------------------------------------------------------------------===//
// Carrier escapes
//===----------------------------------------------------------------------===//

void pcp_topology_carrier_escape_initialize(
    pcp_allocator_t allocator, pcp_topology_carrier_escape_t* out_escape) {
  memset(out_escape, 0, sizeof(*out_escape));
  pcp_topology_vertex_list_initialize(allocator, &out_escape->input);
  pcp_topology_vertex_list_initialize(allocator, &out_escape->offending_output);
}

void pcp_topology_carrier_escape_deinitialize(
    pcp_topology_carrier_escape_t* escape) {
  pcp_topology_vertex_list_deinitialize(&escape->input);
  pcp_topology_vertex_list_deinitialize(&escape->offending_output);
  if (escape->decided_image) {
    pcp_topology_complex_release(escape->decided_image);
  }
  if (escape->allowed_image) {
    pcp_topology_complex_release(escape->allowed_image);
  }
  escape->decided_image = NULL;
  escape->allowed_image = NULL;
  escape->found = false;
}

static pcp_status_t copy_vertices(pcp_topology_vertex_list_t* out,
                                  const pcp_topology_vertex_t* vertices,
                                  size_t count) {
  pcp_topology_vertex_list_clear(out);
  for (size_t i = 0; i < count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_vertex_list_append(out, &vertices[i]));
  }
  pcp_topology_vertices_sort(out->items, out->count);
  return pcp_ok_status();
}

// delta applied to every face of |image|, skipping unmapped vertices.
static pcp_status_t decided_faces(const pcp_topology_complex_t* image,
                                  const pcp_topology_vertex_map_t* decision,
                                  pcp_topology_complex_t* out) {
  pcp_allocator_t allocator = pcp_topology_complex_allocator(out);
  pcp_topology_complex_t* faces = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(allocator, &faces));
  pcp_status_t status = pcp_topology_complex_faces(image, faces);
  pcp_topology_vertex_t mapped[PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES + 1];
  for (size_t f = 0; !status && f < pcp_topology_complex_count(faces); ++f) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, f);
    uint32_t n = 0;
    for (uint32_t i = 0; i < face.count; ++i) {
      pcp_topology_vertex_t target;
      if (!pcp_topology_vertex_map_lookup(decision, &face.vertices[i],
                                          &target)) {
        continue;
      }
      bool seen = false;
      for (uint32_t k = 0; k < n; ++k) {
        seen |= pcp_topology_vertex_equal(&mapped[k], &target);
      }
      if (!seen)
        mapped[n++] = target;
    }
    // A collapsed image can repeat a colour; append keeps it as the
    // offending simplex instead of rejecting it.
    pcp_topology_vertices_sort(mapped, n);
    pcp_topology_simplex_t simplex = pcp_topology_make_simplex(mapped, n);
    size_t index = 0;
    if (!pcp_topology_complex_find(out, simplex, &index)) {
      status = pcp_topology_complex_append(out, simplex);
    }
  }
  pcp_topology_complex_release(faces);
  return status;
}

pcp_status_t pcp_topology_carrier_escape_find(
    const pcp_topology_carrier_map_t* execution,
    const pcp_topology_carrier_map_t* task,
    const pcp_topology_vertex_map_t* decision,
    pcp_topology_carrier_escape_t* escape) {
  pcp_allocator_t allocator = escape->input.allocator;
  pcp_topology_carrier_escape_deinitialize(escape);
  pcp_topology_carrier_escape_initialize(allocator, escape);
  pcp_topology_complex_t* faces = NULL;
  pcp_topology_complex_t* decided = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(allocator, &faces));
  pcp_status_t status = pcp_topology_complex_create(allocator, &decided);
  if (!status) {
    status = pcp_topology_complex_faces(
        pcp_topology_carrier_map_domain(execution), faces);
  }
  for (size_t f = 0;
       !status && f < pcp_topology_complex_count(faces) && !escape->found;
       ++f) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, f);
    const pcp_topology_complex_t* xi =
        pcp_topology_carrier_map_lookup(execution, face);
    const pcp_topology_complex_t* allowed =
        pcp_topology_carrier_map_lookup(task, face);
    if (!xi || !allowed)
      continue;
    pcp_topology_complex_clear(decided);
    status = decided_faces(xi, decision, decided);
    for (size_t d = 0; !status && d < pcp_topology_complex_count(decided);
         ++d) {
      pcp_topology_simplex_t output = pcp_topology_complex_simplex(decided, d);
      if (output.count == 0 || pcp_topology_complex_contains(allowed, output)) {
        continue;
      }
      escape->found = true;
      status = copy_vertices(&escape->input, face.vertices, face.count);
      if (!status) {
        status = copy_vertices(&escape->offending_output, output.vertices,
                               output.count);
      }
      if (!status) {
        status = pcp_topology_complex_create(allocator, &escape->decided_image);
      }
      if (!status)
        status = pcp_topology_complex_copy(decided, escape->decided_image);
      if (!status) {
        status = pcp_topology_complex_create(allocator, &escape->allowed_image);
      }
      if (!status) {
        status =
            pcp_topology_subcomplex_closure(allowed, escape->allowed_image);
      }
      break;
    }
  }
  pcp_topology_complex_release(faces);
  if (decided)
    pcp_topology_complex_release(decided);
  return status;
}

//===----------------------------------------------------------------------===//
// The check
//===----------------------------------------------------------------------===//

pcp_topology_check_options_t pcp_topology_check_options_default(void) {
  pcp_topology_check_options_t options;
  options.solver = PCP_TOPOLOGY_SOLVER_NATIVE;
  options.z3 = pcp_topology_solver_options_default();
  return options;
}

void pcp_topology_check_report_initialize(
    pcp_allocator_t allocator, pcp_topology_check_report_t* out_report) {
  memset(out_report, 0, sizeof(*out_report));
  out_report->allocator = allocator;
  pcp_topology_obstruction_report_initialize(allocator,
                                             &out_report->obstruction);
  pcp_topology_carrier_escape_initialize(allocator, &out_report->escape);
  pcp_topology_trace_initialize(allocator, 0, &out_report->replay);
}

void pcp_topology_check_report_deinitialize(
    pcp_topology_check_report_t* report) {
  pcp_topology_obstruction_report_deinitialize(&report->obstruction);
  pcp_topology_carrier_escape_deinitialize(&report->escape);
  pcp_topology_trace_deinitialize(&report->replay);
}

static pcp_status_t face_count(const pcp_topology_complex_t* complex,
                               size_t* out_count) {
  *out_count = 0;
  if (!complex)
    return pcp_ok_status();
  pcp_topology_complex_t* faces = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(
      pcp_topology_complex_allocator(complex), &faces));
  pcp_status_t status = pcp_topology_complex_faces(complex, faces);
  *out_count = pcp_topology_complex_count(faces);
  pcp_topology_complex_release(faces);
  return status;
}

static pcp_status_t copy_trace(const pcp_topology_trace_t* source,
                               pcp_topology_trace_t* out) {
  pcp_topology_trace_deinitialize(out);
  pcp_topology_trace_initialize(out->allocator, source->seed, out);
  for (size_t i = 0; i < source->event_count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_trace_append(out, source->events[i]));
  }
  pcp_topology_trace_finish(out, &source->final_snapshot);
  return pcp_ok_status();
}

// Picks the replay of the (last) generated run whose input facet contains
// the escaping input face.
static pcp_status_t attach_replay(const pcp_topology_model_instance_t* m,
                                  pcp_topology_check_report_t* r) {
  const pcp_topology_task_definition_t* def = m->task.definition;
  if (!def || m->trace_count == 0)
    return pcp_ok_status();
  pcp_topology_simplex_t input =
      pcp_topology_make_simplex(r->escape.input.items, r->escape.input.count);
  pcp_topology_vertex_t facet[PCP_TOPOLOGY_TASK_MAX_COLORS];
  size_t trace = 0;
  for (size_t t = 0; t < m->trace_count; ++t) {
    const pcp_topology_task_case_t* c = &def->cases[m->trace_task_case[t]];
    pcp_topology_task_case_vertices(c, -1, facet);
    if (pcp_topology_simplex_is_subset(
            input, pcp_topology_make_simplex(facet, c->color_count))) {
      trace = t;
    }
  }
  PCP_RETURN_IF_ERROR_BARE(copy_trace(&m->traces[trace], &r->replay));
  r->has_replay = true;
  return pcp_ok_status();
}

static pcp_status_t run_check(const pcp_topology_model_t* model,
                              pcp_topology_check_options_t options,
                              pcp_topology_model_instance_t* m,
                              pcp_topology_check_report_t* r) {
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_model_build(model, m));
  PCP_RETURN_IF_ERROR_BARE(face_count(m->task.input, &r->input_simplexes));
  PCP_RETURN_IF_ERROR_BARE(face_count(m->protocol, &r->protocol_simplexes));
  PCP_RETURN_IF_ERROR_BARE(face_count(m->task.output, &r->output_simplexes));
  r->trace_count = m->trace_count;
  pcp_topology_decision_problem_t problem = {m->execution, m->task.carrier};
  pcp_topology_search_result_t search;
  pcp_topology_search_result_initialize(r->allocator, &search);
  pcp_status_t status =
      options.solver == PCP_TOPOLOGY_SOLVER_Z3
          ? pcp_topology_decision_map_solve_z3(&problem, options.z3, &search)
          : pcp_topology_decision_map_solve(
                &problem, pcp_topology_search_options_default(), &search);
  r->search_status = search.status;
  r->explored = search.explored;
  r->z3_core_size = search.core_name_count;
  pcp_topology_search_result_deinitialize(&search);
  PCP_RETURN_IF_ERROR(status, "searching for a decision map");

  // The model's own decisions, held to the task.
  bool decision_ok = false;
  if (m->decision) {
    r->decision_checked = true;
    pcp_status_t carried = pcp_topology_carried_decision_map_validate(
        m->execution, m->task.carrier, m->decision);
    decision_ok = carried == NULL;
    if (carried) {
      snprintf(r->decision_error, sizeof(r->decision_error), "%s",
               pcp_status_message(carried));
      pcp_status_ignore(carried);
      PCP_RETURN_IF_ERROR_BARE(pcp_topology_carrier_escape_find(
          m->execution, m->task.carrier, m->decision, &r->escape));
      if (r->escape.found)
        PCP_RETURN_IF_ERROR_BARE(attach_replay(m, r));
    }
  } else if (m->decision_error[0]) {
    r->decision_checked = true;
    snprintf(r->decision_error, sizeof(r->decision_error), "%s",
             m->decision_error);
  }

  switch (r->search_status) {
    case PCP_TOPOLOGY_SEARCH_SATISFIABLE:
      r->verdict = (!r->decision_checked || decision_ok)
                       ? PCP_TOPOLOGY_VERDICT_SOLVABLE
                       : PCP_TOPOLOGY_VERDICT_DECISION_ESCAPE;
      return pcp_ok_status();
    case PCP_TOPOLOGY_SEARCH_UNSATISFIABLE: {
      r->verdict = PCP_TOPOLOGY_VERDICT_OBSTRUCTION;
      pcp_topology_obstruction_options_t diagnosis =
          pcp_topology_obstruction_options_default();
      diagnosis.max_homology_dimension = model->max_homology_dimension;
      bool found = false;
      PCP_RETURN_IF_ERROR(
          pcp_topology_obstruction_diagnose(&problem, model->pcp_witness,
                                            diagnosis, &r->obstruction, &found),
          "diagnosing the obstruction");
      r->has_obstruction = found;
      return pcp_ok_status();
    }
    default:
      r->verdict = PCP_TOPOLOGY_VERDICT_UNKNOWN;
      return pcp_ok_status();
  }
}

pcp_status_t pcp_topology_model_check(const pcp_topology_model_t* model,
                                      pcp_topology_check_options_t options,
                                      pcp_topology_check_report_t* report) {
  pcp_allocator_t allocator = report->allocator;
  pcp_topology_check_report_deinitialize(report);
  pcp_topology_check_report_initialize(allocator, report);
  report->model = model;
  report->solver = options.solver;
  pcp_topology_model_instance_t instance;
  pcp_topology_model_instance_initialize(allocator, &instance);
  pcp_status_t status = run_check(model, options, &instance, report);
  pcp_topology_model_instance_deinitialize(&instance);
  return status;
}

//===----------------------------------------------------------------------===//
// Rendering
//===----------------------------------------------------------------------===//

static const char* task_name(const pcp_topology_model_t* model) {
  const pcp_topology_task_definition_t* def =
      pcp_topology_task_definition(model->task);
  return def ? def->name : "partition_toy";
}

static pcp_status_t format_vertex_list(const pcp_topology_vertex_list_t* list,
                                       pcp_string_builder_t* b) {
  return pcp_topology_simplex_format(
      pcp_topology_make_simplex(list->items, list->count), b);
}

static pcp_status_t format_escape(const pcp_topology_check_report_t* r,
                                  pcp_string_builder_t* b) {
  const pcp_topology_carrier_escape_t* e = &r->escape;
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
      b,
      "\npcp topology counterexample\n"
      "violated_rule: %s\n"
      "seed: %" PRIu64
      "\n"
      "events: %zu\n\n",
      r->model->violated_rule ? r->model->violated_rule
                              : "decision_outside_task_carrier",
      r->has_replay ? r->replay.seed : 0,
      r->has_replay ? r->replay.event_count : (size_t)0));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(
      b, "minimal_offending_simplex:\n  input: "));
  PCP_RETURN_IF_ERROR_BARE(format_vertex_list(&e->input, b));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append_cstring(b, "\n  offending_output: "));
  PCP_RETURN_IF_ERROR_BARE(format_vertex_list(&e->offending_output, b));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "\n"));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_format_excerpt(
      "decided_image", e->decided_image, b));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_format_excerpt(
      "allowed_image", e->allowed_image, b));
  if (r->has_replay) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(b, "replay_events:\n"));
    for (size_t i = 0; i < r->replay.event_count; ++i) {
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "  "));
      PCP_RETURN_IF_ERROR_BARE(
          pcp_topology_event_format(i, r->replay.events[i], b));
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_check_report_format(
    const pcp_topology_check_report_t* r, pcp_string_builder_t* b) {
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
      b,
      "pcp topology check\n"
      "model: %s\n"
      "task: %s\n"
      "description: %s\n"
      "solver: %s\n"
      "verdict: %s\n"
      "search: %s explored=%" PRIu64
      "\n"
      "counts: input_simplexes=%zu protocol_simplexes=%zu "
      "output_simplexes=%zu traces=%zu\n",
      r->model->name, task_name(r->model), r->model->description,
      r->solver == PCP_TOPOLOGY_SOLVER_Z3 ? "z3" : "native",
      pcp_topology_verdict_name(r->verdict),
      pcp_topology_search_status_name(r->search_status), r->explored,
      r->input_simplexes, r->protocol_simplexes, r->output_simplexes,
      r->trace_count));
  if (r->z3_core_size) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, "z3_unsat_core_assertions: %zu\n", r->z3_core_size));
  }
  if (r->decision_checked) {
    if (r->decision_error[0]) {
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
          b, "model_decision: rejected (%s)\n", r->decision_error));
    } else {
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(
          b, "model_decision: carried (delta o Xi inside Delta)\n"));
    }
  }
  if (r->has_obstruction) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "\n"));
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_obstruction_report_format(&r->obstruction, b));
  }
  if (r->escape.found)
    PCP_RETURN_IF_ERROR_BARE(format_escape(r, b));
  return pcp_ok_status();
}

static pcp_status_t json_vertex_list(const pcp_topology_vertex_list_t* list,
                                     pcp_string_builder_t* b) {
  pcp_string_builder_t text;
  pcp_string_builder_initialize(b->allocator, 0, &text);
  pcp_status_t status = format_vertex_list(list, &text);
  if (!status) {
    status =
        pcp_topology_json_append_string(b, pcp_string_builder_cstring(&text));
  }
  pcp_string_builder_deinitialize(&text);
  return status;
}

pcp_status_t pcp_topology_check_report_format_json(
    const pcp_topology_check_report_t* r, pcp_string_builder_t* b) {
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(
      b, "{\"schema\":\"pcp.topology.check.v1\",\"model\":"));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_json_append_string(b, r->model->name));
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
      b,
      ",\"task\":\"%s\",\"solver\":\"%s\",\"verdict\":\"%s\","
      "\"solvable\":%s,\"search\":{\"status\":\"%s\",\"explored\":%" PRIu64
      ",\"z3_unsat_core_assertions\":%zu},\"counts\":{\"input_simplexes\":%zu,"
      "\"protocol_simplexes\":%zu,\"output_simplexes\":%zu,\"traces\":%zu}",
      task_name(r->model),
      r->solver == PCP_TOPOLOGY_SOLVER_Z3 ? "z3" : "native",
      pcp_topology_verdict_name(r->verdict),
      r->verdict == PCP_TOPOLOGY_VERDICT_SOLVABLE ? "true" : "false",
      pcp_topology_search_status_name(r->search_status), r->explored,
      r->z3_core_size, r->input_simplexes, r->protocol_simplexes,
      r->output_simplexes, r->trace_count));
  if (r->decision_checked) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_f(b, ",\"model_decision_carried\":%s",
                                    r->decision_error[0] ? "false" : "true"));
    if (r->decision_error[0]) {
      PCP_RETURN_IF_ERROR_BARE(
          pcp_string_builder_append_cstring(b, ",\"model_decision_error\":"));
      PCP_RETURN_IF_ERROR_BARE(
          pcp_topology_json_append_string(b, r->decision_error));
    }
  }
  if (r->has_obstruction) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(b, ",\"obstruction\":"));
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_obstruction_report_format_json(&r->obstruction, b));
  }
  if (r->escape.found) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(
        b,
        ",\"counterexample\":{\"schema\":\"pcp.topology.analysis.v1\","
        "\"violated_rule\":"));
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_json_append_string(
        b, r->model->violated_rule ? r->model->violated_rule
                                   : "decision_outside_task_carrier"));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, ",\"seed\":%" PRIu64 ",\"witness\":{\"input_simplex\":",
        r->has_replay ? r->replay.seed : 0));
    PCP_RETURN_IF_ERROR_BARE(json_vertex_list(&r->escape.input, b));
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(b, ",\"offending_output\":"));
    PCP_RETURN_IF_ERROR_BARE(json_vertex_list(&r->escape.offending_output, b));
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(b, "},\"events\":"));
    PCP_RETURN_IF_ERROR_BARE(pcp_topology_json_append_events(
        b, r->has_replay ? r->replay.events : NULL,
        r->has_replay ? r->replay.event_count : 0));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "}"));
  }
  return pcp_string_builder_append_cstring(b, "}");
}
