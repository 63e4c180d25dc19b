// SPDX-License-Identifier: Apache-2.0
//
// SMT-LIB 2 export of a decision problem (reference s.2.4) and the parsers
// for solver answers. Pure propositional logic (QF_BOOL) on purpose: one
// Boolean per (protocol vertex, candidate) pair is exactly the native
// search's CSP, so a Z3 answer can be translated back without
// interpretation, and any SMT solver (or a SAT solver via a trivial
// translation) can check it.

#include <inttypes.h>
#include <string.h>

#include "topology/solver_impl.h"

pcp_topology_smtlib_options_t pcp_topology_smtlib_options_default(void) {
  pcp_topology_smtlib_options_t options;
  memset(&options, 0, sizeof(options));
  options.include_check_sat = true;
  return options;
}

void pcp_topology_smt_assertions_initialize(
    pcp_allocator_t allocator, pcp_topology_smt_assertions_t* out_assertions) {
  memset(out_assertions, 0, sizeof(*out_assertions));
  out_assertions->allocator = allocator;
}

void pcp_topology_smt_assertions_deinitialize(
    pcp_topology_smt_assertions_t* assertions) {
  if (assertions->first) {
    pcp_allocator_free(assertions->allocator, assertions->first);
  }
  if (assertions->sources) {
    pcp_allocator_free(assertions->allocator, assertions->sources);
  }
  memset(assertions, 0, sizeof(*assertions));
}

static pcp_status_t assertions_record(pcp_topology_smt_assertions_t* a,
                                      const uint32_t* sources, size_t count) {
  if (!a)
    return pcp_ok_status();
  if (a->count + 2 > a->capacity) {
    size_t capacity = a->capacity ? a->capacity * 2 : 64;
    void* items = a->first;
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_realloc(
        a->allocator, capacity * sizeof(uint32_t), &items));
    a->first = items;
    a->capacity = capacity;
  }
  if (a->source_count + count > a->source_capacity) {
    size_t capacity = a->source_capacity ? a->source_capacity * 2 : 256;
    while (capacity < a->source_count + count) capacity *= 2;
    void* items = a->sources;
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_realloc(
        a->allocator, capacity * sizeof(uint32_t), &items));
    a->sources = items;
    a->source_capacity = capacity;
  }
  if (a->count == 0)
    a->first[0] = 0;
  memcpy(a->sources + a->source_count, sources, count * sizeof(uint32_t));
  a->source_count += count;
  a->count++;
  a->first[a->count] = (uint32_t)a->source_count;
  return pcp_ok_status();
}

typedef struct writer_t {
  pcp_string_builder_t* builder;
  pcp_topology_smtlib_options_t options;
  pcp_topology_smt_assertions_t* assertions;
  uint64_t next_name;
  uint64_t clauses;
} writer_t;

// Writes "(assert X)" or "(assert (! X :named c_K))" around |body|.
static pcp_status_t write_assert(writer_t* w, const char* body,
                                 const uint32_t* sources, size_t source_count,
                                 const char* trailing_comment) {
  if (++w->clauses > PCP_TOPOLOGY_MAX_SMT_CLAUSES) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "SMT encoding exceeds %u clauses",
                           PCP_TOPOLOGY_MAX_SMT_CLAUSES);
  }
  if (w->options.produce_unsat_cores) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        w->builder, "(assert (! %s :named c_%" PRIu64 "))", body,
        w->next_name++));
    PCP_RETURN_IF_ERROR_BARE(
        assertions_record(w->assertions, sources, source_count));
  } else {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_f(w->builder, "(assert %s)", body));
  }
  if (trailing_comment) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_f(w->builder, " ; %s", trailing_comment));
  }
  return pcp_string_builder_append_cstring(w->builder, "\n");
}

// Appends "x_i_j" for every candidate combination of |c| whose mapped tuple
// is outside the constraint's target, as forbidden conjunctions.
static pcp_status_t write_forbidden_tuples(writer_t* w,
                                           const pcp_topology_encoding_t* e,
                                           const pcp_topology_constraint_t* c,
                                           pcp_string_builder_t* scratch) {
  uint32_t digits[PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES + 1];
  pcp_topology_vertex_t mapped[PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES + 1];
  const uint32_t* sources = e->constraint_sources + c->first;
  for (uint32_t k = 0; k < c->count; ++k) {
    if (pcp_topology_encoding_candidate_count(e, sources[k]) == 0) {
      return pcp_ok_status();  // the source is already asserted false
    }
    digits[k] = 0;
  }
  for (;;) {
    for (uint32_t k = 0; k < c->count; ++k) {
      uint32_t output =
          e->candidate_indices[e->candidate_first[sources[k]] + digits[k]];
      mapped[k] = e->outputs.items[output];
    }
    if (!pcp_topology_complex_contains(
            c->target, pcp_topology_make_simplex(mapped, c->count))) {
      pcp_string_builder_reset(scratch);
      PCP_RETURN_IF_ERROR_BARE(
          pcp_string_builder_append_cstring(scratch, "(not (and"));
      for (uint32_t k = 0; k < c->count; ++k) {
        PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
            scratch, " x_%" PRIu32 "_%" PRIu32, sources[k], digits[k]));
      }
      PCP_RETURN_IF_ERROR_BARE(
          pcp_string_builder_append_cstring(scratch, "))"));
      PCP_RETURN_IF_ERROR_BARE(write_assert(
          w, pcp_string_builder_cstring(scratch), sources, c->count, NULL));
    }
    // Odometer over the candidate lists, last position fastest.
    int position = (int)c->count - 1;
    while (position >= 0) {
      uint32_t source = sources[position];
      if (++digits[position] <
          pcp_topology_encoding_candidate_count(e, source)) {
        break;
      }
      digits[position] = 0;
      --position;
    }
    if (position < 0)
      break;
  }
  return pcp_ok_status();
}

static pcp_status_t write_encoding(writer_t* w,
                                   const pcp_topology_encoding_t* e,
                                   pcp_string_builder_t* scratch) {
  pcp_string_builder_t* b = w->builder;
  if (w->options.timeout_ms) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b, "(set-option :timeout %" PRIu32 ")\n", w->options.timeout_ms));
  }
  if (w->options.produce_unsat_cores) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(
        b, "(set-option :produce-unsat-cores true)\n"));
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(
      b,
      "(set-logic QF_BOOL)\n"
      "; x_i_j means protocol vertex i maps to candidate j\n"));
  size_t n = e->sources.count;
  for (size_t i = 0; i < n; ++i) {
    const pcp_topology_vertex_t* v = &e->sources.items[i];
    uint32_t k = pcp_topology_encoding_candidate_count(e, i);
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b,
        "; source %zu color=%" PRIu32 ":%" PRIu32 " candidates=%" PRIu32 "\n",
        i, v->color.kind, v->color.number, k));
    for (uint32_t j = 0; j < k; ++j) {
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
          b, "(declare-const x_%zu_%" PRIu32 " Bool)\n", i, j));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    uint32_t k = pcp_topology_encoding_candidate_count(e, i);
    uint32_t source = (uint32_t)i;
    if (k == 0) {
      PCP_RETURN_IF_ERROR_BARE(write_assert(w, "false", &source, 1,
                                            "no color-and-carrier candidate"));
      continue;
    }
    pcp_string_builder_reset(scratch);
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(scratch, "(or"));
    for (uint32_t j = 0; j < k; ++j) {
      PCP_RETURN_IF_ERROR_BARE(
          pcp_string_builder_append_f(scratch, " x_%zu_%" PRIu32, i, j));
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(scratch, ")"));
    PCP_RETURN_IF_ERROR_BARE(
        write_assert(w, pcp_string_builder_cstring(scratch), &source, 1, NULL));
    for (uint32_t a = 0; a < k; ++a) {
      for (uint32_t c = a + 1; c < k; ++c) {
        pcp_string_builder_reset(scratch);
        PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
            scratch, "(not (and x_%zu_%" PRIu32 " x_%zu_%" PRIu32 "))", i, a, i,
            c));
        PCP_RETURN_IF_ERROR_BARE(write_assert(
            w, pcp_string_builder_cstring(scratch), &source, 1, NULL));
      }
    }
  }
  for (size_t c = 0; c < e->constraint_count; ++c) {
    PCP_RETURN_IF_ERROR_BARE(
        write_forbidden_tuples(w, e, &e->constraints[c], scratch));
  }
  if (w->options.include_check_sat) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(b, "(check-sat)\n"));
  }
  if (w->options.include_model_query && n > 0) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(b, "(get-value ("));
    bool first = true;
    for (size_t i = 0; i < n; ++i) {
      uint32_t k = pcp_topology_encoding_candidate_count(e, i);
      for (uint32_t j = 0; j < k; ++j) {
        PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
            b, "%sx_%zu_%" PRIu32, first ? "" : " ", i, j));
        first = false;
      }
    }
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "))\n"));
  }
  if (w->options.include_unsat_core_query) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_string_builder_append_cstring(b, "(get-unsat-core)\n"));
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_smtlib_write_encoding(
    const pcp_topology_encoding_t* encoding,
    pcp_topology_smtlib_options_t options, pcp_string_builder_t* builder,
    pcp_topology_smt_assertions_t* assertions) {
  writer_t w;
  memset(&w, 0, sizeof(w));
  w.builder = builder;
  w.options = options;
  w.assertions = assertions;
  pcp_string_builder_t scratch;
  pcp_string_builder_initialize(builder->allocator, 0, &scratch);
  pcp_status_t status = write_encoding(&w, encoding, &scratch);
  pcp_string_builder_deinitialize(&scratch);
  return status;
}

pcp_status_t pcp_topology_smtlib_write(
    const pcp_topology_decision_problem_t* problem,
    pcp_topology_smtlib_options_t options, pcp_string_builder_t* builder) {
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_decision_problem_validate(problem));
  pcp_topology_encoding_t encoding;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_encoding_initialize(problem, builder->allocator, &encoding));
  pcp_status_t status =
      pcp_topology_smtlib_write_encoding(&encoding, options, builder, NULL);
  pcp_topology_encoding_deinitialize(&encoding);
  return status;
}

//===----------------------------------------------------------------------===//
// Answer parsing
//===----------------------------------------------------------------------===//

static bool is_separator(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '(' ||
         c == ')';
}

void pcp_topology_solver_tokens_for_each(pcp_string_view_t text,
                                         bool (*fn)(void* user_data,
                                                    pcp_string_view_t token),
                                         void* user_data) {
  size_t i = 0;
  while (i < text.size) {
    while (i < text.size && is_separator(text.data[i])) ++i;
    size_t start = i;
    while (i < text.size && !is_separator(text.data[i])) ++i;
    if (i > start) {
      if (!fn(user_data, pcp_make_string_view(text.data + start, i - start))) {
        return;
      }
    }
  }
}

typedef struct status_scan_t {
  bool found;
  pcp_topology_search_status_t status;
} status_scan_t;

static bool scan_status(void* user_data, pcp_string_view_t token) {
  status_scan_t* scan = (status_scan_t*)user_data;
  if (pcp_string_view_equal(token, pcp_make_cstring_view("sat"))) {
    scan->status = PCP_TOPOLOGY_SEARCH_SATISFIABLE;
  } else if (pcp_string_view_equal(token, pcp_make_cstring_view("unsat"))) {
    scan->status = PCP_TOPOLOGY_SEARCH_UNSATISFIABLE;
  } else if (pcp_string_view_equal(token, pcp_make_cstring_view("unknown"))) {
    scan->status = PCP_TOPOLOGY_SEARCH_UNKNOWN;
  } else {
    return true;
  }
  scan->found = true;
  return false;
}

pcp_status_t pcp_topology_solver_parse_status(
    pcp_string_view_t answer, pcp_topology_search_status_t* out_status) {
  status_scan_t scan = {false, PCP_TOPOLOGY_SEARCH_UNKNOWN};
  pcp_topology_solver_tokens_for_each(answer, scan_status, &scan);
  if (!scan.found) {
    return pcp_make_status(PCP_STATUS_INTERNAL,
                           "SolverStatusMissing: no sat/unsat/unknown in the "
                           "solver answer");
  }
  *out_status = scan.status;
  return pcp_ok_status();
}

// Parses "<prefix><a>" or "<prefix><a>_<b>" with decimal numbers.
static bool parse_name(pcp_string_view_t token, const char* prefix,
                       bool two_numbers, uint64_t* out_a, uint64_t* out_b) {
  size_t prefix_length = strlen(prefix);
  if (token.size <= prefix_length ||
      memcmp(token.data, prefix, prefix_length) != 0) {
    return false;
  }
  pcp_string_view_t rest = pcp_make_string_view(token.data + prefix_length,
                                                token.size - prefix_length);
  if (!two_numbers)
    return pcp_string_view_parse_uint64(rest, out_a);
  pcp_string_view_t a, b;
  if (!pcp_string_view_split(rest, '_', &a, &b))
    return false;
  return pcp_string_view_parse_uint64(a, out_a) &&
         pcp_string_view_parse_uint64(b, out_b);
}

typedef struct model_scan_t {
  size_t source_count;
  const uint32_t* candidate_counts;
  uint32_t* assignment;
  bool have_pending;
  uint64_t pending_source;
  uint64_t pending_candidate;
  size_t assigned;
  pcp_status_t status;
} model_scan_t;

static bool scan_model(void* user_data, pcp_string_view_t token) {
  model_scan_t* scan = (model_scan_t*)user_data;
  if (scan->have_pending) {
    scan->have_pending = false;
    if (pcp_string_view_equal(token, pcp_make_cstring_view("true"))) {
      uint64_t i = scan->pending_source, j = scan->pending_candidate;
      if (i >= scan->source_count || j >= scan->candidate_counts[i]) {
        scan->status = pcp_make_status(
            PCP_STATUS_INTERNAL,
            "SolverModelOutOfRange: x_%" PRIu64 "_%" PRIu64, i, j);
        return false;
      }
      if (scan->assignment[i] != UINT32_MAX) {
        scan->status = pcp_make_status(
            PCP_STATUS_INTERNAL,
            "SolverModelDuplicateAssignment: source %" PRIu64, i);
        return false;
      }
      scan->assignment[i] = (uint32_t)j;
      scan->assigned++;
      return true;
    }
  }
  uint64_t a = 0, b = 0;
  if (parse_name(token, "x_", true, &a, &b)) {
    scan->have_pending = true;
    scan->pending_source = a;
    scan->pending_candidate = b;
  }
  return true;
}

pcp_status_t pcp_topology_solver_parse_model(pcp_string_view_t answer,
                                             size_t source_count,
                                             const uint32_t* candidate_counts,
                                             uint32_t* out_assignment,
                                             size_t* out_assigned_count) {
  for (size_t i = 0; i < source_count; ++i) out_assignment[i] = UINT32_MAX;
  model_scan_t scan;
  memset(&scan, 0, sizeof(scan));
  scan.source_count = source_count;
  scan.candidate_counts = candidate_counts;
  scan.assignment = out_assignment;
  pcp_topology_solver_tokens_for_each(answer, scan_model, &scan);
  *out_assigned_count = scan.assigned;
  return scan.status;
}

typedef struct core_scan_t {
  uint32_t* ids;
  size_t capacity;
  size_t count;
  pcp_status_t status;
} core_scan_t;

static bool scan_core(void* user_data, pcp_string_view_t token) {
  core_scan_t* scan = (core_scan_t*)user_data;
  uint64_t id = 0;
  if (!parse_name(token, "c_", false, &id, NULL))
    return true;
  if (id > UINT32_MAX) {
    scan->status = pcp_make_status(
        PCP_STATUS_INTERNAL, "solver core name c_%" PRIu64 " out of range", id);
    return false;
  }
  if (scan->count >= scan->capacity) {
    scan->status =
        pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                        "solver core has more than %zu names", scan->capacity);
    return false;
  }
  scan->ids[scan->count++] = (uint32_t)id;
  return true;
}

pcp_status_t pcp_topology_solver_parse_core(pcp_string_view_t answer,
                                            uint32_t* out_ids, size_t capacity,
                                            size_t* out_count) {
  core_scan_t scan = {out_ids, capacity, 0, pcp_ok_status()};
  pcp_topology_solver_tokens_for_each(answer, scan_core, &scan);
  *out_count = scan.count;
  return scan.status;
}
