// SPDX-License-Identifier: Apache-2.0
//
// The solving half of `pcp topo`: `check` and `models`, registered as one
// line each in topology_cli.c's kSubcommands.
//
//   pcp topo check --model NAME [--solver native|z3]
//                  [--z3-backend library|binary] [--json]
//     exit 0: solvable; 1: obstruction, decision escape or unknown;
//     2: usage, input or solver error.
//   pcp topo check --all [...]: every model against its expected verdict;
//     exit 0 when all match, 1 otherwise.
//   pcp topo models [--json]
//   pcp topo sim [--seed N] [--events K] [--invalid] [--exhaustive --depth D]
//                [--replay FILE] [--shrink]
//     exit 0: no failure (or the replay matches); 1: the schedule fails (or
//     the replay differs); 2: usage or input error.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "topology/protocols_impl.h"
#include "topology/trace_impl.h"

typedef struct check_options_t {
  char* model;
  bool all;
  int32_t solver;   // index into kSolverNames
  int32_t backend;  // index into kBackendNames
  bool json;
  bool help;
} check_options_t;

static const char* const kSolverNames[] = {"native", "z3", NULL};
static const char* const kBackendNames[] = {"library", "binary", NULL};

#define CHECK_OFFSET(member) offsetof(check_options_t, member)

static const pcp_config_field_t kCheckFields[] = {
    {.name = "model",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = CHECK_OFFSET(model),
     .value_name = "NAME",
     .help = "model to check ('pcp topo models' lists them)"},
    {.name = "all",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = CHECK_OFFSET(all),
     .default_value = "false",
     .help = "check every model against its expected verdict (for CI)"},
    {.name = "solver",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = CHECK_OFFSET(solver),
     .default_value = "native",
     .enum_values = kSolverNames,
     .help = "native search or Z3 (models are re-checked natively)"},
    {.name = "z3-backend",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = CHECK_OFFSET(backend),
     .default_value = "library",
     .enum_values = kBackendNames,
     .help = "libz3 in process, or the z3 executable on SMT-LIB text"},
    {.name = "json",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = CHECK_OFFSET(json),
     .default_value = "false",
     .help = "print the report as one JSON object"},
    {.name = "help",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = CHECK_OFFSET(help),
     .default_value = "false",
     .help = "show this help"},
};

static const pcp_config_table_t kCheckTable = {
    .name = "topo check",
    .fields = kCheckFields,
    .field_count = PCP_ARRAYSIZE(kCheckFields),
};

static void print_model_names(FILE* out) {
  size_t count = 0;
  const pcp_topology_model_t* models = pcp_topology_model_catalog(&count);
  fprintf(out, "models:");
  for (size_t i = 0; i < count; ++i) fprintf(out, " %s", models[i].name);
  fprintf(out, "\n");
}

static int check_fail(pcp_status_t status) {
  char buffer[1024];
  pcp_status_format_for_user(status, buffer, sizeof(buffer));
  fprintf(stderr, "pcp topo check: %s\n", buffer);
  pcp_status_ignore(status);
  return 2;
}

// Every model against its expected verdict: one line each (or one JSON
// object), exit 0 when all match, 1 when any differs.
static int check_all(pcp_topology_check_options_t check, bool json,
                     pcp_allocator_t allocator) {
  size_t count = 0;
  const pcp_topology_model_t* models = pcp_topology_model_catalog(&count);
  size_t mismatches = 0;
  if (json)
    printf("{\"schema\":\"pcp.topology.check_all.v1\",\"models\":[");
  for (size_t i = 0; i < count; ++i) {
    pcp_topology_check_report_t report;
    pcp_topology_check_report_initialize(allocator, &report);
    pcp_status_t status = pcp_topology_model_check(&models[i], check, &report);
    if (status) {
      pcp_topology_check_report_deinitialize(&report);
      if (json)
        printf("]}\n");
      return check_fail(status);
    }
    bool ok = report.verdict == models[i].expected;
    mismatches += !ok;
    const char* witness =
        report.has_obstruction
            ? pcp_topology_obstruction_kind_name(report.obstruction.kind)
            : "-";
    if (json) {
      printf(
          "%s{\"model\":\"%s\",\"verdict\":\"%s\",\"expected\":\"%s\","
          "\"obstruction\":\"%s\",\"ok\":%s}",
          i ? "," : "", models[i].name,
          pcp_topology_verdict_name(report.verdict),
          pcp_topology_verdict_name(models[i].expected), witness,
          ok ? "true" : "false");
    } else {
      printf("%-38s %-15s expected=%-15s %-40s %s\n", models[i].name,
             pcp_topology_verdict_name(report.verdict),
             pcp_topology_verdict_name(models[i].expected), witness,
             ok ? "ok" : "UNEXPECTED");
    }
    pcp_topology_check_report_deinitialize(&report);
  }
  if (json) {
    printf("],\"mismatches\":%zu}\n", mismatches);
  } else {
    printf("pcp topology check: %zu model(s), %zu unexpected\n", count,
           mismatches);
  }
  return mismatches ? 1 : 0;
}

int pcp_topology_cli_check_main(int argc, char** argv) {
  pcp_allocator_t allocator = pcp_allocator_system();
  check_options_t options;
  pcp_status_t status = pcp_config_initialize(&kCheckTable, &options);
  if (!status) {
    status =
        pcp_config_parse_argv(&kCheckTable, argc - 1, argv + 1, &options, NULL);
  }
  if (!status && options.help) {
    printf(
        "usage: pcp topo check --model NAME|--all [--solver native|z3] "
        "[--z3-backend library|binary] [--json]\n\n"
        "Searches for a decision map that solves the model's task and\n"
        "holds the model's own decisions to it. Exit 0 when solvable, 1\n"
        "for an obstruction or a decision escape (the report explains\n"
        "it), 2 for a usage or input error.\n\nflags:\n");
    pcp_config_print_help(&kCheckTable, stdout);
    print_model_names(stdout);
    pcp_config_deinitialize(&kCheckTable, &options);
    return 0;
  }
  if (!status)
    status = pcp_config_validate(&kCheckTable, &options);
  if (!status && !options.model == !options.all) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "give exactly one of --model NAME and --all");
  }
  const pcp_topology_model_t* model = NULL;
  if (!status && options.model) {
    model = pcp_topology_model_find(pcp_make_cstring_view(options.model));
    if (!model) {
      status = pcp_make_status(PCP_STATUS_NOT_FOUND,
                               "unknown model '%s' (see 'pcp topo models')",
                               options.model);
    }
  }
  if (status) {
    pcp_config_deinitialize(&kCheckTable, &options);
    return pcp_config_cli_usage_error("topo check", status);
  }
  pcp_topology_check_options_t check = pcp_topology_check_options_default();
  check.solver =
      options.solver == 1 ? PCP_TOPOLOGY_SOLVER_Z3 : PCP_TOPOLOGY_SOLVER_NATIVE;
  check.z3.backend = options.backend == 1
                         ? PCP_TOPOLOGY_SOLVER_BACKEND_Z3_BINARY
                         : PCP_TOPOLOGY_SOLVER_BACKEND_Z3_LIBRARY;
  bool json = options.json;
  bool all = options.all;
  pcp_config_deinitialize(&kCheckTable, &options);
  if (check.solver == PCP_TOPOLOGY_SOLVER_Z3 &&
      !pcp_topology_solver_available(check.z3.backend)) {
    return check_fail(pcp_make_status(
        PCP_STATUS_UNAVAILABLE, "Z3 %s backend is not available in this build",
        check.z3.backend == PCP_TOPOLOGY_SOLVER_BACKEND_Z3_BINARY ? "binary"
                                                                  : "library"));
  }
  if (all)
    return check_all(check, json, allocator);
  pcp_topology_check_report_t report;
  pcp_topology_check_report_initialize(allocator, &report);
  status = pcp_topology_model_check(model, check, &report);
  pcp_string_builder_t text;
  pcp_string_builder_initialize(allocator, 0, &text);
  if (!status) {
    status = json ? pcp_topology_check_report_format_json(&report, &text)
                  : pcp_topology_check_report_format(&report, &text);
  }
  int exit_code = 2;
  if (!status) {
    fputs(pcp_string_builder_cstring(&text), stdout);
    if (json)
      fputc('\n', stdout);
    exit_code = report.verdict == PCP_TOPOLOGY_VERDICT_SOLVABLE ? 0 : 1;
  } else {
    exit_code = check_fail(status);
  }
  pcp_string_builder_deinitialize(&text);
  pcp_topology_check_report_deinitialize(&report);
  return exit_code;
}

typedef struct models_options_t {
  bool json;
  bool help;
} models_options_t;

static const pcp_config_field_t kModelsFields[] = {
    {.name = "json",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = offsetof(models_options_t, json),
     .default_value = "false",
     .help = "print the list as one JSON object"},
    {.name = "help",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = offsetof(models_options_t, help),
     .default_value = "false",
     .help = "show this help"},
};

static const pcp_config_table_t kModelsTable = {
    .name = "topo models",
    .fields = kModelsFields,
    .field_count = PCP_ARRAYSIZE(kModelsFields),
};

static const char* model_task_name(const pcp_topology_model_t* model) {
  const pcp_topology_task_definition_t* def =
      pcp_topology_task_definition(model->task);
  return def ? def->name : "partition_toy";
}

static pcp_status_t format_models(bool json, pcp_string_builder_t* b) {
  size_t count = 0;
  const pcp_topology_model_t* models = pcp_topology_model_catalog(&count);
  if (!json) {
    for (size_t i = 0; i < count; ++i) {
      PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
          b, "%-38s %-26s expect=%-15s %s\n", models[i].name,
          model_task_name(&models[i]),
          pcp_topology_verdict_name(models[i].expected),
          models[i].description));
    }
    return pcp_ok_status();
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(
      b, "{\"schema\":\"pcp.topology.models.v1\",\"models\":["));
  for (size_t i = 0; i < count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_f(
        b,
        "%s{\"name\":\"%s\",\"task\":\"%s\",\"expected\":\"%s\","
        "\"pcp_witness\":\"%s\",\"injected_bug\":%s,\"description\":",
        i ? "," : "", models[i].name, model_task_name(&models[i]),
        pcp_topology_verdict_name(models[i].expected),
        pcp_topology_pcp_witness_name(models[i].pcp_witness),
        models[i].inject_bug ? "true" : "false"));
    PCP_RETURN_IF_ERROR_BARE(
        pcp_topology_json_append_string(b, models[i].description));
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append_cstring(b, "}"));
  }
  return pcp_string_builder_append_cstring(b, "]}\n");
}

int pcp_topology_cli_models_main(int argc, char** argv) {
  pcp_allocator_t allocator = pcp_allocator_system();
  models_options_t options;
  pcp_status_t status = pcp_config_initialize(&kModelsTable, &options);
  if (!status) {
    status = pcp_config_parse_argv(&kModelsTable, argc - 1, argv + 1, &options,
                                   NULL);
  }
  if (status) {
    pcp_config_deinitialize(&kModelsTable, &options);
    return pcp_config_cli_usage_error("topo models", status);
  }
  if (options.help) {
    printf(
        "usage: pcp topo models [--json]\n\nLists the protocol models "
        "'pcp topo check' accepts.\n\nflags:\n");
    pcp_config_print_help(&kModelsTable, stdout);
    pcp_config_deinitialize(&kModelsTable, &options);
    return 0;
  }
  pcp_string_builder_t text;
  pcp_string_builder_initialize(allocator, 0, &text);
  status = format_models(options.json, &text);
  pcp_config_deinitialize(&kModelsTable, &options);
  if (status) {
    pcp_string_builder_deinitialize(&text);
    return check_fail(status);
  }
  fputs(pcp_string_builder_cstring(&text), stdout);
  pcp_string_builder_deinitialize(&text);
  return 0;
}

//===----------------------------------------------------------------------===//
// pcp topo sim
//===----------------------------------------------------------------------===//

// Trace files are small text; 1 MiB is thousands of events past the trace
// cap, so the cap is the real limit.
#define SIM_MAX_FILE_BYTES (1u << 20)

typedef struct sim_options_t {
  int64_t seed;
  int64_t events;
  int64_t depth;
  bool invalid;
  bool exhaustive;
  bool shrink;
  char* replay;
  bool help;
} sim_options_t;

#define SIM_OFFSET(member) offsetof(sim_options_t, member)

static const pcp_config_field_t kSimFields[] = {
    {.name = "seed",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = SIM_OFFSET(seed),
     .default_value = "1",
     .min = 0,
     .max = 9007199254740991.0,
     .help = "seed of the schedule (printed in the trace header)"},
    {.name = "events",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = SIM_OFFSET(events),
     .default_value = "8",
     .min = 0,
     .max = PCP_TOPOLOGY_TRACE_MAX_EVENTS,
     .help = "events in a seeded random schedule"},
    {.name = "depth",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = SIM_OFFSET(depth),
     .default_value = "2",
     .min = 0,
     .max = PCP_TOPOLOGY_SIM_MAX_DEPTH,
     .help = "schedule length for --exhaustive"},
    {.name = "invalid",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = SIM_OFFSET(invalid),
     .default_value = "false",
     .help = "use the send/deliver alphabet that can fail"},
    {.name = "exhaustive",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = SIM_OFFSET(exhaustive),
     .default_value = "false",
     .help = "run every schedule of --depth events"},
    {.name = "shrink",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = SIM_OFFSET(shrink),
     .default_value = "false",
     .help = "shrink a failing schedule before printing it"},
    {.name = "replay",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = SIM_OFFSET(replay),
     .value_name = "FILE",
     .help = "replay a trace file and compare its final snapshot"},
    {.name = "help",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = SIM_OFFSET(help),
     .default_value = "false",
     .help = "show this help"},
};

static const pcp_config_table_t kSimTable = {
    .name = "topo sim",
    .fields = kSimFields,
    .field_count = PCP_ARRAYSIZE(kSimFields),
};

static bool sim_fails(void* user_data, uint64_t seed,
                      const pcp_topology_event_t* events, size_t count) {
  (void)user_data;
  pcp_topology_sim_t sim;
  pcp_topology_sim_initialize(seed, &sim);
  for (size_t i = 0; i < count; ++i) {
    if (!pcp_topology_sim_step(&sim, events[i]))
      return true;
  }
  return false;
}

// Prints |trace| (shrunk first when asked and failing); returns 1 when it
// fails, 0 otherwise, 2 on error.
static int sim_print(const pcp_topology_trace_t* trace, bool shrink,
                     pcp_allocator_t allocator) {
  pcp_topology_trace_t shrunk;
  const pcp_topology_trace_t* shown = trace;
  bool failing = trace->final_snapshot.failure != PCP_TOPOLOGY_FAILURE_NONE;
  pcp_status_t status = pcp_ok_status();
  if (shrink && failing) {
    pcp_topology_shrink_result_t result;
    status = pcp_topology_events_shrink(allocator, trace->seed, trace->events,
                                        trace->event_count, sim_fails, NULL,
                                        &result);
    if (!status) {
      status = pcp_topology_sim_run(result.seed, result.events,
                                    result.event_count, allocator, &shrunk);
      if (!status) {
        printf("shrunk: deleted=%zu seed=%llu\n", result.deleted,
               (unsigned long long)result.seed);
        shown = &shrunk;
      }
      pcp_topology_shrink_result_deinitialize(allocator, &result);
    }
  }
  pcp_string_builder_t text;
  pcp_string_builder_initialize(allocator, 0, &text);
  if (!status)
    status = pcp_topology_trace_format(shown, &text);
  if (!status)
    fputs(pcp_string_builder_cstring(&text), stdout);
  pcp_string_builder_deinitialize(&text);
  if (shown == &shrunk)
    pcp_topology_trace_deinitialize(&shrunk);
  if (status) {
    fprintf(stderr, "pcp topo sim: %s\n", pcp_status_message(status));
    pcp_status_ignore(status);
    return 2;
  }
  return failing ? 1 : 0;
}

static int sim_replay(const char* path, bool shrink,
                      pcp_allocator_t allocator) {
  void* data = NULL;
  size_t length = 0;
  pcp_status_t status =
      pcp_file_read_all(path, SIM_MAX_FILE_BYTES, &data, &length);
  pcp_topology_trace_t recorded, replayed;
  if (!status) {
    status = pcp_topology_trace_parse(pcp_make_string_view(data, length),
                                      allocator, &recorded);
  }
  pcp_libc_free(data);  // pcp_file_read_all's buffer
  if (status) {
    fprintf(stderr, "pcp topo sim: %s: %s\n", path, pcp_status_message(status));
    pcp_status_ignore(status);
    return 2;
  }
  status = pcp_topology_sim_run(recorded.seed, recorded.events,
                                recorded.event_count, allocator, &replayed);
  if (status) {
    pcp_topology_trace_deinitialize(&recorded);
    return check_fail(status);
  }
  int exit_code = sim_print(&replayed, shrink, allocator);
  bool match = pcp_topology_snapshot_hash(&recorded.final_snapshot) ==
               pcp_topology_snapshot_hash(&replayed.final_snapshot);
  printf("replay: %s\n", match ? "match"
                               : "MISMATCH (the recorded final "
                                 "snapshot differs)");
  pcp_topology_trace_deinitialize(&recorded);
  pcp_topology_trace_deinitialize(&replayed);
  if (exit_code == 2)
    return 2;
  return match ? 0 : 1;
}

int pcp_topology_cli_sim_main(int argc, char** argv) {
  pcp_allocator_t allocator = pcp_allocator_system();
  sim_options_t options;
  pcp_status_t status = pcp_config_initialize(&kSimTable, &options);
  if (!status) {
    status =
        pcp_config_parse_argv(&kSimTable, argc - 1, argv + 1, &options, NULL);
  }
  if (!status)
    status = pcp_config_validate(&kSimTable, &options);
  if (status) {
    pcp_config_deinitialize(&kSimTable, &options);
    return pcp_config_cli_usage_error("topo sim", status);
  }
  if (options.help) {
    printf(
        "usage: pcp topo sim [--seed N] [--events K] [--invalid] "
        "[--exhaustive --depth D] [--replay FILE] [--shrink]\n\n"
        "The two-node trace simulator (gateway 0, worker 1). Prints the\n"
        "trace in its replay format; exit 1 when the schedule fails (or a\n"
        "replay differs from the recorded snapshot).\n\nflags:\n");
    pcp_config_print_help(&kSimTable, stdout);
    pcp_config_deinitialize(&kSimTable, &options);
    return 0;
  }
  int exit_code = 0;
  if (options.replay) {
    exit_code = sim_replay(options.replay, options.shrink, allocator);
  } else if (options.exhaustive) {
    pcp_topology_sim_exploration_t result;
    status = pcp_topology_sim_explore_exhaustive(
        (uint64_t)options.seed, (uint32_t)options.depth, options.invalid,
        allocator, &result);
    if (status) {
      exit_code = check_fail(status);
    } else {
      printf("checked=%llu failed=%llu\n", (unsigned long long)result.checked,
             (unsigned long long)result.failed);
      exit_code = result.has_failure ? sim_print(&result.first_failure,
                                                 options.shrink, allocator)
                                     : 0;
      pcp_topology_sim_exploration_deinitialize(&result);
    }
  } else {
    pcp_topology_trace_t trace;
    status = pcp_topology_sim_random_trace((uint64_t)options.seed,
                                           (size_t)options.events,
                                           options.invalid, allocator, &trace);
    if (status) {
      exit_code = check_fail(status);
    } else {
      exit_code = sim_print(&trace, options.shrink, allocator);
      pcp_topology_trace_deinitialize(&trace);
    }
  }
  pcp_config_deinitialize(&kSimTable, &options);
  return exit_code;
}
