// SPDX-License-Identifier: Apache-2.0
//
// Z3 driver for decision problems. Both backends consume the same SMT-LIB
// text (reference s.2.4): the library backend evaluates it with
// Z3_eval_smtlib2_string in a fresh context per run, the binary backend
// writes it to a temporary file and runs `z3 -smt2 <file>`. Using text for
// the library too (instead of building ASTs through the C API) keeps one
// encoding, one parser and one set of failure modes for both, and makes
// every library run reproducible with the binary from the dumped text.
//
// Nothing a solver says is trusted: a model is translated back into a
// vertex map and re-checked with the native carried-decision-map check.

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "topology/solver_impl.h"

#if defined(PCP_TOPOLOGY_HAVE_Z3)
// Declarations only: libz3 is opened with dlopen at the first library-backend
// run, so the subcommands that never solve do not map it (docs/decisions.md,
// "Lazy loading").
#include <z3.h>
#endif

pcp_topology_solver_options_t pcp_topology_solver_options_default(void) {
  pcp_topology_solver_options_t options;
  memset(&options, 0, sizeof(options));
#if defined(PCP_TOPOLOGY_HAVE_Z3)
  options.backend = PCP_TOPOLOGY_SOLVER_BACKEND_Z3_LIBRARY;
#else
  options.backend = PCP_TOPOLOGY_SOLVER_BACKEND_Z3_BINARY;
#endif
  options.timeout_ms = 30000;
  options.max_output_bytes = 1u << 20;
  options.request_unsat_core = true;
  return options;
}

//===----------------------------------------------------------------------===//
// Backends: text in, answer text out
//===----------------------------------------------------------------------===//

#if defined(PCP_TOPOLOGY_HAVE_Z3)
// Every libz3 function the library backend calls. The table stores
// `__typeof__(fn)*`, so a signature that differs from z3.h is a compile
// error here, not an ABI break at a call site.
#define Z3_API_SYMBOLS(X)   \
  X(Z3_global_param_set)    \
  X(Z3_mk_config)           \
  X(Z3_del_config)          \
  X(Z3_set_param_value)     \
  X(Z3_mk_context)          \
  X(Z3_del_context)         \
  X(Z3_set_error_handler)   \
  X(Z3_eval_smtlib2_string) \
  X(Z3_get_error_code)      \
  X(Z3_get_error_msg)

typedef struct z3_api_t {
#define Z3_API_FIELD(name) __typeof__(name)* name;
  Z3_API_SYMBOLS(Z3_API_FIELD)
#undef Z3_API_FIELD
} z3_api_t;

static const pcp_dynlib_symbol_t kZ3Symbols[] = {
#define Z3_API_ENTRY(name) {#name, offsetof(z3_api_t, name)},
    Z3_API_SYMBOLS(Z3_API_ENTRY)
#undef Z3_API_ENTRY
};

static z3_api_t g_z3;
static pcp_status_t g_z3_load_status;
static pthread_once_t g_z3_once = PTHREAD_ONCE_INIT;

// The command context behind Z3_eval_smtlib2_string is initialised with the
// API context, so neither the config parameter nor the in-text set-option
// can switch core production on afterwards; only the global parameter does.
// It is process-wide and only matters for core queries, which name their
// assertions; set it once, right after loading.
static void z3_load_once(void) {
  static const char* const kSonames[] = {"libz3.so.4", "libz3.so", NULL};
  g_z3_load_status =
      pcp_dynlib_load(kSonames, "the Z3 library solver backend", "libz3-4",
                      kZ3Symbols, PCP_ARRAYSIZE(kZ3Symbols), &g_z3);
  if (!g_z3_load_status)
    g_z3.Z3_global_param_set("unsat_core", "true");
}

// Loads libz3 once per process; every caller gets its own copy of a failure.
static pcp_status_t z3_load(void) {
  pthread_once(&g_z3_once, z3_load_once);
  return g_z3_load_status ? pcp_status_clone(g_z3_load_status)
                          : pcp_ok_status();
}

static const char kCoreOption[] = "(set-option :produce-unsat-cores true)\n";

// Z3's default handler exits the process on an error; input must never do
// that, so errors are read back with Z3_get_error_code instead.
static void z3_ignore_error(Z3_context context, Z3_error_code code) {
  (void)context;
  (void)code;
}
#endif

static pcp_status_t run_library(const char* text,
                                pcp_topology_solver_options_t options,
                                pcp_string_builder_t* out_answer) {
#if defined(PCP_TOPOLOGY_HAVE_Z3)
  PCP_RETURN_IF_ERROR_BARE(z3_load());
  // The in-text core option would be reported as an error here (see above).
  // The copy comes from the answer builder's allocator: the caller's.
  pcp_allocator_t allocator = out_answer->allocator;
  char* stripped = NULL;
  const char* option = strstr(text, kCoreOption);
  if (option) {
    size_t length = strlen(text);
    size_t skip = sizeof(kCoreOption) - 1;
    PCP_RETURN_IF_ERROR(
        pcp_allocator_malloc(allocator, length - skip + 1, (void**)&stripped),
        "solver text");
    size_t head = (size_t)(option - text);
    memcpy(stripped, text, head);
    memcpy(stripped + head, option + skip, length - head - skip + 1);
    text = stripped;
  }
  Z3_config config = g_z3.Z3_mk_config();
  if (!config) {
    pcp_allocator_free(allocator, stripped);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "Z3_mk_config");
  }
  if (options.timeout_ms) {
    char timeout[24];
    snprintf(timeout, sizeof(timeout), "%" PRIu32, options.timeout_ms);
    g_z3.Z3_set_param_value(config, "timeout", timeout);
  }
  Z3_context context = g_z3.Z3_mk_context(config);
  g_z3.Z3_del_config(config);
  if (!context) {
    pcp_allocator_free(allocator, stripped);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "Z3_mk_context");
  }
  g_z3.Z3_set_error_handler(context, z3_ignore_error);
  Z3_string answer = g_z3.Z3_eval_smtlib2_string(context, text);
  Z3_error_code code = g_z3.Z3_get_error_code(context);
  pcp_status_t status = pcp_ok_status();
  if (code != Z3_OK) {
    status = pcp_make_status(PCP_STATUS_INTERNAL,
                             "SolverProcessFailed: libz3 error %d: %s",
                             (int)code, g_z3.Z3_get_error_msg(context, code));
  } else if (answer && strlen(answer) > options.max_output_bytes) {
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "Z3 answer exceeds %zu bytes",
                             options.max_output_bytes);
  } else {
    status =
        pcp_string_builder_append_cstring(out_answer, answer ? answer : "");
  }
  // |answer| belongs to |context| (Z3 frees it with the context).
  g_z3.Z3_del_context(context);
  pcp_allocator_free(allocator, stripped);
  return status;
#else
  (void)text;
  (void)options;
  (void)out_answer;
  return pcp_make_status(PCP_STATUS_UNAVAILABLE,
                         "this build has no libz3 (PCP_ENABLE_Z3=OFF); use "
                         "the z3 binary backend");
#endif
}

// Runs |argv| with stdout captured into |out_answer| (stderr discarded).
// Returns the exit status in |out_exit_code| (-1 if signalled).
static pcp_status_t run_process(char* const argv[], size_t max_output_bytes,
                                pcp_string_builder_t* out_answer,
                                int* out_exit_code) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) {
    return pcp_status_from_errno(errno, "pipe for the solver");
  }
  pid_t pid = fork();
  if (pid < 0) {
    int error = errno;
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return pcp_status_from_errno(error, "fork for the solver");
  }
  if (pid == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    int null_fd = open("/dev/null", O_WRONLY);
    if (null_fd >= 0)
      dup2(null_fd, STDERR_FILENO);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(pipe_fds[1]);
  pcp_status_t status = pcp_ok_status();
  char buffer[4096];
  size_t total = 0;
  for (;;) {
    ssize_t n = read(pipe_fds[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    total += (size_t)n;
    if (!status && total > max_output_bytes) {
      status =
          pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                          "solver output exceeds %zu bytes", max_output_bytes);
      kill(pid, SIGKILL);
    }
    if (!status) {
      status = pcp_string_builder_append(
          out_answer, pcp_make_string_view(buffer, (size_t)n));
    }
  }
  close(pipe_fds[0]);
  int wait_status = 0;
  while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  *out_exit_code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
  return status;
}

static const char* binary_name(const pcp_topology_solver_options_t* options) {
  return options->executable ? options->executable : "z3";
}

static pcp_status_t run_binary(const char* text,
                               pcp_topology_solver_options_t options,
                               pcp_string_builder_t* out_answer) {
  const char* tmp = getenv("TMPDIR");
  char path[512];
  int written = snprintf(path, sizeof(path), "%s/pcp-topology-solver-XXXXXX",
                         tmp && *tmp ? tmp : "/tmp");
  if (written < 0 || (size_t)written >= sizeof(path)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "TMPDIR too long");
  }
  int fd = mkstemp(path);
  if (fd < 0)
    return pcp_status_from_errno(errno, "creating %s", path);
  size_t length = strlen(text);
  size_t offset = 0;
  pcp_status_t status = pcp_ok_status();
  while (offset < length) {
    ssize_t n = write(fd, text + offset, length - offset);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      status = pcp_status_from_errno(errno, "writing %s", path);
      break;
    }
    offset += (size_t)n;
  }
  close(fd);
  if (!status) {
    // -T is Z3's hard wall-clock limit in seconds, a backstop for the soft
    // :timeout option inside the text.
    char timeout_flag[32];
    snprintf(timeout_flag, sizeof(timeout_flag), "-T:%" PRIu32,
             options.timeout_ms ? (options.timeout_ms + 999) / 1000 + 1 : 3600);
    char* argv[] = {(char*)binary_name(&options), "-smt2", timeout_flag, path,
                    NULL};
    int exit_code = 0;
    status =
        run_process(argv, options.max_output_bytes, out_answer, &exit_code);
    if (!status && exit_code != 0) {
      status = pcp_make_status(PCP_STATUS_INTERNAL,
                               "SolverProcessFailed: %s exited with %d",
                               argv[0], exit_code);
    }
  }
  unlink(path);
  return status;
}

static pcp_status_t run_solver(const char* text,
                               pcp_topology_solver_options_t options,
                               pcp_string_builder_t* out_answer) {
  pcp_string_builder_reset(out_answer);
  pcp_status_t status =
      options.backend == PCP_TOPOLOGY_SOLVER_BACKEND_Z3_LIBRARY
          ? run_library(text, options, out_answer)
          : run_binary(text, options, out_answer);
  if (status)
    return status;
  // Both backends report command errors inline as (error "...").
  const char* answer = pcp_string_builder_cstring(out_answer);
  const char* error = strstr(answer, "(error");
  if (error) {
    return pcp_make_status(PCP_STATUS_INTERNAL,
                           "SolverProcessFailed: solver reported %.200s",
                           error);
  }
  return pcp_ok_status();
}

bool pcp_topology_solver_available(pcp_topology_solver_backend_t backend) {
  if (backend == PCP_TOPOLOGY_SOLVER_BACKEND_Z3_LIBRARY) {
#if defined(PCP_TOPOLOGY_HAVE_Z3)
    pcp_status_t status = z3_load();
    bool ok = !status;
    pcp_status_ignore(status);
    return ok;
#else
    return false;
#endif
  }
  pcp_string_builder_t answer;
  pcp_string_builder_initialize(pcp_allocator_system(), 4096, &answer);
  char* argv[] = {"z3", "-version", NULL};
  int exit_code = -1;
  pcp_status_t status = run_process(argv, 4096, &answer, &exit_code);
  bool ok = !status && exit_code == 0 &&
            strstr(pcp_string_builder_cstring(&answer), "Z3") != NULL;
  pcp_status_ignore(status);
  pcp_string_builder_deinitialize(&answer);
  return ok;
}

//===----------------------------------------------------------------------===//
// The three runs
//===----------------------------------------------------------------------===//

typedef struct z3_session_t {
  const pcp_topology_decision_problem_t* problem;
  pcp_topology_solver_options_t options;
  pcp_topology_encoding_t encoding;
  pcp_topology_smt_assertions_t assertions;
  pcp_string_builder_t text;
  pcp_string_builder_t answer;
  pcp_topology_search_result_t* result;
} z3_session_t;

static pcp_status_t session_run(z3_session_t* s,
                                pcp_topology_smtlib_options_t smt) {
  smt.timeout_ms = s->options.timeout_ms;
  pcp_string_builder_reset(&s->text);
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_smtlib_write_encoding(
      &s->encoding, smt, &s->text,
      smt.produce_unsat_cores ? &s->assertions : NULL));
  return run_solver(pcp_string_builder_cstring(&s->text), s->options,
                    &s->answer);
}

static pcp_status_t session_model(z3_session_t* s) {
  pcp_topology_smtlib_options_t smt = pcp_topology_smtlib_options_default();
  smt.include_model_query = true;
  PCP_RETURN_IF_ERROR_BARE(session_run(s, smt));
  pcp_string_view_t answer =
      pcp_make_cstring_view(pcp_string_builder_cstring(&s->answer));
  pcp_topology_search_status_t status;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_solver_parse_status(answer, &status));
  if (status != PCP_TOPOLOGY_SEARCH_SATISFIABLE) {
    return pcp_make_status(PCP_STATUS_INTERNAL,
                           "SolverModelQueryNotSatisfiable: second run said %s",
                           pcp_topology_search_status_name(status));
  }
  size_t n = s->encoding.sources.count;
  pcp_allocator_t allocator = s->result->allocator;
  uint32_t* counts = NULL;
  uint32_t* choice = NULL;
  size_t bytes = (n ? n : 1) * sizeof(uint32_t);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_malloc(allocator, bytes, (void**)&counts));
  pcp_status_t result = pcp_allocator_malloc(allocator, bytes, (void**)&choice);
  if (result) {
    pcp_allocator_free(allocator, counts);
    return result;
  }
  for (size_t i = 0; i < n; ++i) {
    counts[i] = pcp_topology_encoding_candidate_count(&s->encoding, i);
  }
  size_t assigned = 0;
  result =
      pcp_topology_solver_parse_model(answer, n, counts, choice, &assigned);
  if (!result && assigned != n) {
    result = pcp_make_status(PCP_STATUS_INTERNAL,
                             "SolverModelIncompleteAssignment: %zu of %zu "
                             "sources assigned",
                             assigned, n);
  }
  // Translate candidate numbers into output-vertex indices.
  for (size_t i = 0; !result && i < n; ++i) {
    choice[i] =
        s->encoding
            .candidate_indices[s->encoding.candidate_first[i] + choice[i]];
  }
  pcp_topology_vertex_map_t* map = NULL;
  if (!result) {
    result = pcp_topology_encoding_build_map(&s->encoding, s->problem, choice,
                                             allocator, &map);
  }
  pcp_allocator_free(allocator, counts);
  pcp_allocator_free(allocator, choice);
  if (result)
    return result;
  pcp_status_t check = pcp_topology_carried_decision_map_validate(
      s->problem->execution, s->problem->task, map);
  if (check) {
    pcp_topology_vertex_map_release(map);
    return pcp_status_annotate_f(
        check,
        "SolverModelFailsNativeCheck: the Z3 model is not a carried "
        "decision map");
  }
  void* items = NULL;
  result =
      pcp_allocator_malloc(allocator, sizeof(*s->result->solutions), &items);
  if (result) {
    pcp_topology_vertex_map_release(map);
    return result;
  }
  s->result->solutions = items;
  s->result->solutions[0] = map;
  s->result->solution_count = 1;
  s->result->explored = 1;
  s->result->status = PCP_TOPOLOGY_SEARCH_SATISFIABLE;
  return pcp_ok_status();
}

static int compare_u32(const void* a, const void* b) {
  uint32_t x = *(const uint32_t*)a, y = *(const uint32_t*)b;
  return x < y ? -1 : (x > y ? 1 : 0);
}

static pcp_status_t session_core(z3_session_t* s) {
  pcp_topology_smtlib_options_t smt = pcp_topology_smtlib_options_default();
  smt.produce_unsat_cores = true;
  smt.include_unsat_core_query = true;
  PCP_RETURN_IF_ERROR_BARE(session_run(s, smt));
  pcp_string_view_t answer =
      pcp_make_cstring_view(pcp_string_builder_cstring(&s->answer));
  pcp_topology_search_status_t status;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_solver_parse_status(answer, &status));
  if (status != PCP_TOPOLOGY_SEARCH_UNSATISFIABLE) {
    return pcp_make_status(PCP_STATUS_INTERNAL,
                           "SolverCoreQueryNotUnsatisfiable: third run said %s",
                           pcp_topology_search_status_name(status));
  }
  pcp_topology_search_result_t* r = s->result;
  size_t capacity = s->assertions.count ? s->assertions.count : 1;
  uint32_t* ids = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
      r->allocator, capacity * sizeof(uint32_t), (void**)&ids));
  size_t id_count = 0;
  pcp_status_t result =
      pcp_topology_solver_parse_core(answer, ids, capacity, &id_count);
  if (!result && id_count > 0) {
    result = pcp_allocator_calloc(r->allocator, id_count * sizeof(char*),
                                  (void**)&r->core_names);
  }
  // Sources mentioned by the core assertions, deduplicated and sorted.
  uint32_t* sources = NULL;
  size_t source_count = 0;
  if (!result) {
    size_t source_capacity = s->assertions.source_count + 1;
    result = pcp_allocator_malloc(
        r->allocator, source_capacity * sizeof(uint32_t), (void**)&sources);
  }
  for (size_t i = 0; !result && i < id_count; ++i) {
    char name[24];
    snprintf(name, sizeof(name), "c_%" PRIu32, ids[i]);
    size_t length = strlen(name) + 1;
    result =
        pcp_allocator_malloc(r->allocator, length, (void**)&r->core_names[i]);
    if (result)
      break;
    memcpy(r->core_names[i], name, length);
    r->core_name_count = i + 1;
    if (ids[i] >= s->assertions.count) {
      result = pcp_make_status(PCP_STATUS_INTERNAL,
                               "solver core names unknown assertion %s", name);
      break;
    }
    for (uint32_t k = s->assertions.first[ids[i]];
         k < s->assertions.first[ids[i] + 1]; ++k) {
      sources[source_count++] = s->assertions.sources[k];
    }
  }
  if (!result) {
    qsort(sources, source_count, sizeof(uint32_t), compare_u32);
    for (size_t i = 0; !result && i < source_count; ++i) {
      if (i > 0 && sources[i] == sources[i - 1])
        continue;
      result = pcp_topology_vertex_list_append(
          &r->core, &s->encoding.sources.items[sources[i]]);
    }
  }
  if (sources)
    pcp_allocator_free(r->allocator, sources);
  pcp_allocator_free(r->allocator, ids);
  r->unsat_reason = PCP_TOPOLOGY_UNSAT_REASON_SOLVER_CORE;
  return result;
}

static pcp_status_t session_solve(z3_session_t* s) {
  PCP_RETURN_IF_ERROR_BARE(
      session_run(s, pcp_topology_smtlib_options_default()));
  pcp_topology_search_status_t status;
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_solver_parse_status(
      pcp_make_cstring_view(pcp_string_builder_cstring(&s->answer)), &status));
  s->result->status = status;
  switch (status) {
    case PCP_TOPOLOGY_SEARCH_SATISFIABLE:
      return session_model(s);
    case PCP_TOPOLOGY_SEARCH_UNSATISFIABLE:
      if (!s->options.request_unsat_core)
        return pcp_ok_status();
      return session_core(s);
    default:
      return pcp_ok_status();
  }
}

pcp_status_t pcp_topology_decision_map_solve_z3(
    const pcp_topology_decision_problem_t* problem,
    pcp_topology_solver_options_t options,
    pcp_topology_search_result_t* inout_result) {
  pcp_topology_search_result_reset(inout_result);
  PCP_RETURN_IF_ERROR_BARE(pcp_topology_decision_problem_validate(problem));
  if (options.backend == PCP_TOPOLOGY_SOLVER_BACKEND_Z3_BINARY &&
      !options.executable && !pcp_topology_solver_available(options.backend)) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE,
                           "the z3 executable is not on PATH");
  }
  z3_session_t s;
  memset(&s, 0, sizeof(s));
  s.problem = problem;
  s.options = options;
  s.result = inout_result;
  pcp_allocator_t allocator = inout_result->allocator;
  PCP_RETURN_IF_ERROR(
      pcp_topology_encoding_initialize(problem, allocator, &s.encoding),
      "encoding the decision problem");
  pcp_topology_smt_assertions_initialize(allocator, &s.assertions);
  pcp_string_builder_initialize(allocator, 0, &s.text);
  pcp_string_builder_initialize(allocator, options.max_output_bytes + 1,
                                &s.answer);
  pcp_status_t status = session_solve(&s);
  pcp_string_builder_deinitialize(&s.answer);
  pcp_string_builder_deinitialize(&s.text);
  pcp_topology_smt_assertions_deinitialize(&s.assertions);
  pcp_topology_encoding_deinitialize(&s.encoding);
  return status;
}
