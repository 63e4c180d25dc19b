// SPDX-License-Identifier: Apache-2.0
//
// Native decision-map search: a finite CSP over protocol vertices (one
// variable each, domain = same-colour output vertices allowed by every task
// image that can see it), solved by depth-first search with
// fewest-candidates-first ordering and face-by-face pruning, and minimal
// unsatisfiable cores by an increasing-size subset sweep.
//
// Why not hand everything to Z3: the native search is the oracle that every
// Z3 model is re-checked against, it runs in builds without libz3, and its
// cores are minimal by construction (Z3's are not).

#include <stdlib.h>
#include <string.h>

#include "topology/solver_impl.h"

// Bound on subsets the core sweep examines. C(n, k) grows fast; past this
// the problem is reported as a global inconsistency instead of running for
// hours. Upstream has no such cap (it relies on n being small).
#define CORE_SWEEP_MAX_SUBSETS 200000u

static const char* const kSearchStatusNames[] = {"satisfiable", "unsatisfiable",
                                                 "limit_exceeded", "unknown"};
static const char* const kUnsatReasonNames[] = {
    "none",
    "empty_candidate_set",
    "local_inconsistency",
    "global_inconsistency",
    "search_limit_exceeded",
    "solver_core",
};

const char* pcp_topology_search_status_name(pcp_topology_search_status_t s) {
  if ((unsigned)s >= PCP_ARRAYSIZE(kSearchStatusNames))
    return "?";
  return kSearchStatusNames[s];
}

const char* pcp_topology_unsat_reason_name(pcp_topology_unsat_reason_t r) {
  if ((unsigned)r >= PCP_ARRAYSIZE(kUnsatReasonNames))
    return "?";
  return kUnsatReasonNames[r];
}

pcp_topology_search_options_t pcp_topology_search_options_default(void) {
  pcp_topology_search_options_t options = {1, 100000, 10};
  return options;
}

void pcp_topology_search_result_initialize(
    pcp_allocator_t allocator, pcp_topology_search_result_t* out_result) {
  memset(out_result, 0, sizeof(*out_result));
  out_result->allocator = allocator;
  pcp_topology_vertex_list_initialize(allocator, &out_result->core);
}

void pcp_topology_search_result_reset(pcp_topology_search_result_t* result) {
  for (size_t i = 0; i < result->solution_count; ++i) {
    pcp_topology_vertex_map_release(result->solutions[i]);
  }
  if (result->solutions) {
    pcp_allocator_free(result->allocator, result->solutions);
  }
  for (size_t i = 0; i < result->core_name_count; ++i) {
    pcp_allocator_free(result->allocator, result->core_names[i]);
  }
  if (result->core_names) {
    pcp_allocator_free(result->allocator, result->core_names);
  }
  result->solutions = NULL;
  result->solution_count = 0;
  result->core_names = NULL;
  result->core_name_count = 0;
  result->status = PCP_TOPOLOGY_SEARCH_UNSATISFIABLE;
  result->explored = 0;
  result->limit_exceeded = false;
  result->unsat_reason = PCP_TOPOLOGY_UNSAT_REASON_NONE;
  pcp_topology_vertex_list_clear(&result->core);
}

void pcp_topology_search_result_deinitialize(
    pcp_topology_search_result_t* result) {
  pcp_topology_search_result_reset(result);
  pcp_topology_vertex_list_deinitialize(&result->core);
}

pcp_status_t pcp_topology_decision_problem_validate(
    const pcp_topology_decision_problem_t* problem) {
  if (!problem || !problem->execution || !problem->task) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "decision problem needs both carriers");
  }
  pcp_topology_carrier_checks_t checks = pcp_topology_carrier_checks_default();
  PCP_RETURN_IF_ERROR(
      pcp_topology_carrier_map_validate(problem->execution, checks),
      "execution carrier Xi");
  PCP_RETURN_IF_ERROR(pcp_topology_carrier_map_validate(problem->task, checks),
                      "task carrier Delta");
  if (!pcp_topology_complex_equal_by_closure(
          pcp_topology_carrier_map_domain(problem->execution),
          pcp_topology_carrier_map_domain(problem->task))) {
    return pcp_topology_make_status(
        PCP_TOPOLOGY_ERROR_COMPLEX_MISMATCH,
        "Xi and Delta have different input complexes");
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Encoding
//===----------------------------------------------------------------------===//

static bool find_vertex(const pcp_topology_vertex_list_t* sorted,
                        const pcp_topology_vertex_t* vertex,
                        uint32_t* out_index) {
  size_t lo = 0, hi = sorted->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = pcp_topology_vertex_compare(&sorted->items[mid], vertex);
    if (c == 0) {
      *out_index = (uint32_t)mid;
      return true;
    }
    if (c < 0) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return false;
}

static pcp_status_t encoding_add_constraint(
    pcp_topology_encoding_t* e, pcp_topology_simplex_t face,
    const pcp_topology_complex_t* target) {
  if (e->constraint_count >= PCP_TOPOLOGY_MAX_ENCODING_CONSTRAINTS) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "decision problem has more than %u constraints",
                           PCP_TOPOLOGY_MAX_ENCODING_CONSTRAINTS);
  }
  if (e->constraint_count == e->constraint_capacity) {
    size_t capacity = e->constraint_capacity ? e->constraint_capacity * 2 : 64;
    void* items = e->constraints;
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_realloc(
        e->allocator, capacity * sizeof(*e->constraints), &items));
    e->constraints = items;
    e->constraint_capacity = capacity;
  }
  if (e->constraint_source_count + face.count > e->constraint_source_capacity) {
    size_t capacity =
        e->constraint_source_capacity ? e->constraint_source_capacity * 2 : 256;
    while (capacity < e->constraint_source_count + face.count) capacity *= 2;
    void* items = e->constraint_sources;
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_realloc(
        e->allocator, capacity * sizeof(uint32_t), &items));
    e->constraint_sources = items;
    e->constraint_source_capacity = capacity;
  }
  pcp_topology_constraint_t* c = &e->constraints[e->constraint_count];
  c->first = (uint32_t)e->constraint_source_count;
  c->count = face.count;
  c->target = target;
  for (uint32_t i = 0; i < face.count; ++i) {
    uint32_t index = 0;
    if (!find_vertex(&e->sources, &face.vertices[i], &index)) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_COMPLEX_MISMATCH,
          "an execution image vertex is not a vertex of P");
    }
    e->constraint_sources[e->constraint_source_count++] = index;
  }
  e->constraint_count++;
  return pcp_ok_status();
}

// Adds one constraint per face (2+ vertices) of |complex| against |target|.
// Singleton faces are implied by the candidate sets (every candidate lies in
// O and in Delta(s) for each s that sees the vertex), so they are skipped.
static pcp_status_t encoding_add_faces(pcp_topology_encoding_t* e,
                                       const pcp_topology_complex_t* complex,
                                       const pcp_topology_complex_t* target) {
  pcp_topology_complex_t* faces = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_create(e->allocator, &faces));
  pcp_status_t status = pcp_topology_complex_faces(complex, faces);
  for (size_t i = 0; !status && i < pcp_topology_complex_count(faces); ++i) {
    pcp_topology_simplex_t face = pcp_topology_complex_simplex(faces, i);
    if (face.count < 2)
      continue;
    status = encoding_add_constraint(e, face, target);
  }
  pcp_topology_complex_release(faces);
  return status;
}

static pcp_status_t encoding_build_candidates(
    pcp_topology_encoding_t* e,
    const pcp_topology_decision_problem_t* problem) {
  size_t n = e->sources.count;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      e->allocator, (n + 1) * sizeof(uint32_t), (void**)&e->candidate_first));
  size_t capacity = n * (e->outputs.count ? e->outputs.count : 1);
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
      e->allocator, (capacity ? capacity : 1) * sizeof(uint32_t),
      (void**)&e->candidate_indices));
  size_t entry_count = pcp_topology_carrier_map_count(problem->execution);
  uint32_t used = 0;
  for (size_t i = 0; i < n; ++i) {
    e->candidate_first[i] = used;
    const pcp_topology_vertex_t* v = &e->sources.items[i];
    pcp_topology_simplex_t v_simplex = pcp_topology_make_simplex(v, 1);
    for (size_t j = 0; j < e->outputs.count; ++j) {
      const pcp_topology_vertex_t* o = &e->outputs.items[j];
      if (!pcp_topology_color_equal(v->color, o->color))
        continue;
      pcp_topology_simplex_t o_simplex = pcp_topology_make_simplex(o, 1);
      bool allowed = true;
      for (size_t k = 0; allowed && k < entry_count; ++k) {
        const pcp_topology_complex_t* image =
            pcp_topology_carrier_map_entry_image(problem->execution, k);
        if (!pcp_topology_complex_contains(image, v_simplex))
          continue;
        const pcp_topology_complex_t* allowed_image =
            pcp_topology_carrier_map_lookup(
                problem->task,
                pcp_topology_carrier_map_entry_simplex(problem->execution, k));
        allowed = allowed_image &&
                  pcp_topology_complex_contains(allowed_image, o_simplex);
      }
      if (allowed)
        e->candidate_indices[used++] = (uint32_t)j;
    }
  }
  e->candidate_first[n] = used;
  return pcp_ok_status();
}

static pcp_status_t encoding_index_constraints(pcp_topology_encoding_t* e) {
  size_t n = e->sources.count;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(e->allocator, (n + 2) * sizeof(uint32_t),
                           (void**)&e->source_constraint_first));
  size_t total = e->constraint_source_count ? e->constraint_source_count : 1;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_malloc(e->allocator, total * sizeof(uint32_t),
                           (void**)&e->source_constraint_ids));
  // Counting sort: count per source, prefix sums, then place.
  uint32_t* counts = e->source_constraint_first + 1;
  for (size_t i = 0; i < e->constraint_source_count; ++i) {
    counts[e->constraint_sources[i]]++;
  }
  for (size_t i = 1; i <= n; ++i) {
    e->source_constraint_first[i] += e->source_constraint_first[i - 1];
  }
  // source_constraint_first[i] is now the start of source i; use a cursor
  // copy shifted by one slot to place ids.
  uint32_t* cursor = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
      e->allocator, (n + 1) * sizeof(uint32_t), (void**)&cursor));
  memcpy(cursor, e->source_constraint_first, (n + 1) * sizeof(uint32_t));
  for (size_t c = 0; c < e->constraint_count; ++c) {
    const pcp_topology_constraint_t* constraint = &e->constraints[c];
    for (uint32_t k = 0; k < constraint->count; ++k) {
      uint32_t source = e->constraint_sources[constraint->first + k];
      e->source_constraint_ids[cursor[source]++] = (uint32_t)c;
    }
  }
  pcp_allocator_free(e->allocator, cursor);
  return pcp_ok_status();
}

static pcp_status_t encoding_fill(
    const pcp_topology_decision_problem_t* problem,
    pcp_topology_encoding_t* e) {
  const pcp_topology_complex_t* protocol =
      pcp_topology_carrier_map_codomain(problem->execution);
  const pcp_topology_complex_t* output =
      pcp_topology_carrier_map_codomain(problem->task);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_topology_complex_vertices(protocol, &e->sources));
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_complex_vertices(output, &e->outputs));
  PCP_RETURN_IF_ERROR_BARE(encoding_build_candidates(e, problem));
  PCP_RETURN_IF_ERROR(encoding_add_faces(e, protocol, output), "faces of P");
  size_t entry_count = pcp_topology_carrier_map_count(problem->execution);
  for (size_t k = 0; k < entry_count; ++k) {
    const pcp_topology_complex_t* allowed = pcp_topology_carrier_map_lookup(
        problem->task,
        pcp_topology_carrier_map_entry_simplex(problem->execution, k));
    if (!allowed) {
      return pcp_topology_make_status(
          PCP_TOPOLOGY_ERROR_MISSING_CARRIER_SIMPLEX,
          "Delta has no entry for an input face of Xi");
    }
    PCP_RETURN_IF_ERROR(
        encoding_add_faces(
            e, pcp_topology_carrier_map_entry_image(problem->execution, k),
            allowed),
        "faces of Xi entry %zu", k);
  }
  return encoding_index_constraints(e);
}

pcp_status_t pcp_topology_encoding_initialize(
    const pcp_topology_decision_problem_t* problem, pcp_allocator_t allocator,
    pcp_topology_encoding_t* out_encoding) {
  memset(out_encoding, 0, sizeof(*out_encoding));
  out_encoding->allocator = allocator;
  pcp_topology_vertex_list_initialize(allocator, &out_encoding->sources);
  pcp_topology_vertex_list_initialize(allocator, &out_encoding->outputs);
  pcp_status_t status = encoding_fill(problem, out_encoding);
  if (status)
    pcp_topology_encoding_deinitialize(out_encoding);
  return status;
}

void pcp_topology_encoding_deinitialize(pcp_topology_encoding_t* e) {
  pcp_allocator_t a = e->allocator;
  pcp_topology_vertex_list_deinitialize(&e->sources);
  pcp_topology_vertex_list_deinitialize(&e->outputs);
  if (e->candidate_first)
    pcp_allocator_free(a, e->candidate_first);
  if (e->candidate_indices)
    pcp_allocator_free(a, e->candidate_indices);
  if (e->constraints)
    pcp_allocator_free(a, e->constraints);
  if (e->constraint_sources)
    pcp_allocator_free(a, e->constraint_sources);
  if (e->source_constraint_first) {
    pcp_allocator_free(a, e->source_constraint_first);
  }
  if (e->source_constraint_ids)
    pcp_allocator_free(a, e->source_constraint_ids);
  memset(e, 0, sizeof(*e));
}

static bool constraint_holds(const pcp_topology_encoding_t* e,
                             const pcp_topology_constraint_t* c,
                             const uint32_t* assignment) {
  pcp_topology_vertex_t mapped[PCP_TOPOLOGY_MAX_FACE_ENUMERATION_VERTICES + 1];
  for (uint32_t k = 0; k < c->count; ++k) {
    uint32_t value = assignment[e->constraint_sources[c->first + k]];
    if (value == UINT32_MAX)
      return true;  // not fully assigned yet
    mapped[k] = e->outputs.items[value];
  }
  return pcp_topology_complex_contains(
      c->target, pcp_topology_make_simplex(mapped, c->count));
}

bool pcp_topology_encoding_consistent(const pcp_topology_encoding_t* e,
                                      const uint32_t* assignment,
                                      size_t source) {
  if (source == SIZE_MAX) {
    for (size_t c = 0; c < e->constraint_count; ++c) {
      if (!constraint_holds(e, &e->constraints[c], assignment))
        return false;
    }
    return true;
  }
  for (uint32_t k = e->source_constraint_first[source];
       k < e->source_constraint_first[source + 1]; ++k) {
    if (!constraint_holds(e, &e->constraints[e->source_constraint_ids[k]],
                          assignment)) {
      return false;
    }
  }
  return true;
}

pcp_status_t pcp_topology_encoding_build_map(
    const pcp_topology_encoding_t* e,
    const pcp_topology_decision_problem_t* problem, const uint32_t* assignment,
    pcp_allocator_t allocator, pcp_topology_vertex_map_t** out_map) {
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_vertex_map_create(
      pcp_topology_carrier_map_codomain(problem->execution),
      pcp_topology_carrier_map_codomain(problem->task), allocator, out_map));
  for (size_t i = 0; i < e->sources.count; ++i) {
    if (assignment[i] >= e->outputs.count) {
      pcp_topology_vertex_map_release(*out_map);
      *out_map = NULL;
      return pcp_make_status(PCP_STATUS_INTERNAL,
                             "assignment of source %zu out of range", i);
    }
    pcp_status_t status = pcp_topology_vertex_map_set(
        *out_map, &e->sources.items[i], &e->outputs.items[assignment[i]]);
    if (status) {
      pcp_topology_vertex_map_release(*out_map);
      *out_map = NULL;
      return status;
    }
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Search
//===----------------------------------------------------------------------===//

typedef struct search_t {
  const pcp_topology_encoding_t* encoding;
  const pcp_topology_decision_problem_t* problem;  // NULL in the core sweep
  pcp_topology_search_options_t options;
  pcp_topology_search_result_t* result;  // NULL in the core sweep
  uint32_t* assignment;
  const uint32_t* order;
  size_t order_count;
  uint64_t leaves;
  uint64_t leaf_budget;
  bool found;
  bool stop;
  bool budget_exhausted;
  pcp_status_t status;
} search_t;

static pcp_status_t search_store_solution(search_t* s) {
  pcp_topology_search_result_t* r = s->result;
  pcp_topology_vertex_map_t* map = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_encoding_build_map(
      s->encoding, s->problem, s->assignment, r->allocator, &map));
  // The pruning already implies delta o Xi inside Delta; the full check is
  // the independent referee that keeps the search honest.
  pcp_status_t check = pcp_topology_carried_decision_map_validate(
      s->problem->execution, s->problem->task, map);
  if (check) {
    pcp_status_ignore(check);
    pcp_topology_vertex_map_release(map);
    return pcp_ok_status();
  }
  void* items = r->solutions;
  pcp_status_t status = pcp_allocator_realloc(
      r->allocator, (r->solution_count + 1) * sizeof(*r->solutions), &items);
  if (status) {
    pcp_topology_vertex_map_release(map);
    return status;
  }
  r->solutions = items;
  r->solutions[r->solution_count++] = map;
  s->found = true;
  if (r->solution_count >= s->options.max_solutions)
    s->stop = true;
  return pcp_ok_status();
}

static void search_dfs(search_t* s, size_t depth) {
  if (s->stop)
    return;
  if (depth == s->order_count) {
    s->leaves++;
    if (s->leaves > s->leaf_budget) {
      s->budget_exhausted = true;
      s->stop = true;
      return;
    }
    if (s->result) {
      s->status = search_store_solution(s);
      if (s->status)
        s->stop = true;
    } else {
      s->found = true;
      s->stop = true;
    }
    return;
  }
  const pcp_topology_encoding_t* e = s->encoding;
  uint32_t source = s->order[depth];
  for (uint32_t k = e->candidate_first[source];
       k < e->candidate_first[source + 1] && !s->stop; ++k) {
    s->assignment[source] = e->candidate_indices[k];
    if (pcp_topology_encoding_consistent(e, s->assignment, source)) {
      search_dfs(s, depth + 1);
    }
  }
  s->assignment[source] = UINT32_MAX;
}

// Fewest candidates first, ties by vertex order (source index). Insertion
// sort: the orders are short, and qsort would need a global for context.
static void order_by_mrv(const pcp_topology_encoding_t* e, uint32_t* order,
                         size_t count) {
  for (size_t i = 1; i < count; ++i) {
    uint32_t value = order[i];
    size_t j = i;
    while (j > 0) {
      uint32_t prev = order[j - 1];
      uint32_t cp = pcp_topology_encoding_candidate_count(e, prev);
      uint32_t cv = pcp_topology_encoding_candidate_count(e, value);
      if (cp < cv || (cp == cv && prev < value))
        break;
      order[j] = prev;
      --j;
    }
    order[j] = value;
  }
}

// Is the sub-problem on the sources in |mask| satisfiable? Only constraints
// whose sources all lie in the mask can fire, because the others never
// become fully assigned.
static bool subset_satisfiable(const pcp_topology_encoding_t* e, uint64_t mask,
                               uint64_t leaf_budget, uint32_t* assignment,
                               uint32_t* order) {
  size_t count = 0;
  for (size_t i = 0; i < e->sources.count; ++i) {
    assignment[i] = UINT32_MAX;
    if (mask & (1ull << i))
      order[count++] = (uint32_t)i;
  }
  order_by_mrv(e, order, count);
  search_t s;
  memset(&s, 0, sizeof(s));
  s.encoding = e;
  s.assignment = assignment;
  s.order = order;
  s.order_count = count;
  s.leaf_budget = leaf_budget;
  search_dfs(&s, 0);
  // An exhausted budget counts as satisfiable: a core must be proven.
  return s.found || s.budget_exhausted;
}

static pcp_status_t core_set_all(const pcp_topology_encoding_t* e,
                                 pcp_topology_search_result_t* result) {
  pcp_topology_vertex_list_clear(&result->core);
  for (size_t i = 0; i < e->sources.count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_vertex_list_append(&result->core, &e->sources.items[i]));
  }
  return pcp_ok_status();
}

pcp_status_t pcp_topology_encoding_unsat_core(
    const pcp_topology_encoding_t* e, pcp_topology_search_options_t options,
    bool limit_exceeded, pcp_topology_search_result_t* result) {
  pcp_topology_vertex_list_clear(&result->core);
  size_t n = e->sources.count;
  if (limit_exceeded) {
    result->unsat_reason = PCP_TOPOLOGY_UNSAT_REASON_SEARCH_LIMIT_EXCEEDED;
    return core_set_all(e, result);
  }
  for (size_t i = 0; i < n; ++i) {
    if (pcp_topology_encoding_candidate_count(e, i) == 0) {
      result->unsat_reason = PCP_TOPOLOGY_UNSAT_REASON_EMPTY_CANDIDATE_SET;
      return pcp_topology_vertex_list_append(&result->core,
                                             &e->sources.items[i]);
    }
  }
  result->unsat_reason = PCP_TOPOLOGY_UNSAT_REASON_GLOBAL_INCONSISTENCY;
  if (n >= 64 || n == 0)
    return core_set_all(e, result);
  uint32_t* assignment = NULL;
  uint32_t* order = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
      result->allocator, n * sizeof(uint32_t), (void**)&assignment));
  pcp_status_t status = pcp_allocator_malloc(
      result->allocator, n * sizeof(uint32_t), (void**)&order);
  if (status) {
    pcp_allocator_free(result->allocator, assignment);
    return status;
  }
  size_t max_k =
      n < options.max_unsat_core_vertices ? n : options.max_unsat_core_vertices;
  uint64_t examined = 0;
  uint64_t core_mask = 0;
  uint64_t limit = n == 63 ? (1ull << 63) : (1ull << n);
  for (size_t k = 1; k <= max_k && !core_mask; ++k) {
    // Gosper's hack walks the k-subsets in increasing numeric order.
    uint64_t mask = (k == 64) ? UINT64_MAX : ((1ull << k) - 1);
    while (mask < limit && !core_mask) {
      if (++examined > CORE_SWEEP_MAX_SUBSETS)
        break;
      if (!subset_satisfiable(e, mask, options.max_assignments, assignment,
                              order)) {
        core_mask = mask;
        break;
      }
      uint64_t c = mask & (~mask + 1);
      uint64_t r = mask + c;
      if (r == 0)
        break;
      mask = (((r ^ mask) >> 2) / c) | r;
    }
    if (examined > CORE_SWEEP_MAX_SUBSETS)
      break;
  }
  pcp_allocator_free(result->allocator, assignment);
  pcp_allocator_free(result->allocator, order);
  if (!core_mask)
    return core_set_all(e, result);
  result->unsat_reason = PCP_TOPOLOGY_UNSAT_REASON_LOCAL_INCONSISTENCY;
  for (size_t i = 0; i < n; ++i) {
    if (core_mask & (1ull << i)) {
      PCP_RETURN_IF_ERROR_BARE(
          pcp_topology_vertex_list_append(&result->core, &e->sources.items[i]));
    }
  }
  return pcp_ok_status();
}

static pcp_status_t run_search(const pcp_topology_decision_problem_t* problem,
                               pcp_topology_search_options_t options,
                               const pcp_topology_encoding_t* e,
                               pcp_topology_search_result_t* result) {
  size_t n = e->sources.count;
  bool any_empty = false;
  for (size_t i = 0; i < n; ++i) {
    if (pcp_topology_encoding_candidate_count(e, i) == 0)
      any_empty = true;
  }
  if (!any_empty && options.max_solutions > 0) {
    uint32_t* assignment = NULL;
    uint32_t* order = NULL;
    size_t bytes = (n ? n : 1) * sizeof(uint32_t);
    PCP_RETURN_IF_ERROR_BARE(
        pcp_allocator_malloc(result->allocator, bytes, (void**)&assignment));
    pcp_status_t status =
        pcp_allocator_malloc(result->allocator, bytes, (void**)&order);
    if (status) {
      pcp_allocator_free(result->allocator, assignment);
      return status;
    }
    for (size_t i = 0; i < n; ++i) {
      assignment[i] = UINT32_MAX;
      order[i] = (uint32_t)i;
    }
    order_by_mrv(e, order, n);
    search_t s;
    memset(&s, 0, sizeof(s));
    s.encoding = e;
    s.problem = problem;
    s.options = options;
    s.result = result;
    s.assignment = assignment;
    s.order = order;
    s.order_count = n;
    s.leaf_budget = options.max_assignments;
    search_dfs(&s, 0);
    pcp_allocator_free(result->allocator, assignment);
    pcp_allocator_free(result->allocator, order);
    PCP_RETURN_IF_ERROR_BARE(s.status);
    result->explored = s.leaves > s.leaf_budget ? s.leaf_budget : s.leaves;
    result->limit_exceeded = s.budget_exhausted;
  }
  if (result->solution_count > 0) {
    result->status = PCP_TOPOLOGY_SEARCH_SATISFIABLE;
    return pcp_ok_status();
  }
  result->status = result->limit_exceeded ? PCP_TOPOLOGY_SEARCH_LIMIT_EXCEEDED
                                          : PCP_TOPOLOGY_SEARCH_UNSATISFIABLE;
  return pcp_topology_encoding_unsat_core(e, options, result->limit_exceeded,
                                          result);
}

pcp_status_t pcp_topology_decision_maps_enumerate(
    const pcp_topology_decision_problem_t* problem,
    pcp_topology_search_options_t options,
    pcp_topology_search_result_t* inout_result) {
  pcp_topology_search_result_reset(inout_result);
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_decision_problem_validate(problem));
  pcp_topology_encoding_t encoding;
  PCP_RETURN_IF_ERROR(pcp_topology_encoding_initialize(
                          problem, inout_result->allocator, &encoding),
                      "encoding the decision problem");
  pcp_status_t status = run_search(problem, options, &encoding, inout_result);
  pcp_topology_encoding_deinitialize(&encoding);
  return status;
}

pcp_status_t pcp_topology_decision_map_solve(
    const pcp_topology_decision_problem_t* problem,
    pcp_topology_search_options_t options,
    pcp_topology_search_result_t* inout_result) {
  options.max_solutions = 1;
  return pcp_topology_decision_maps_enumerate(problem, options, inout_result);
}
