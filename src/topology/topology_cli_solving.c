// SPDX-License-Identifier: Apache-2.0
//
// The solving half of `pcp topo`: `check` and `models`, registered as one
// line each in topology_cli.c's kSubcommands.
//
//   pcp topo check --model NAME [--solver native|z3]
//                  [--z3-backend library|binary] [--json]
//     exit 0: solvable; 1: obstruction, decision escape or unknown;
//     2: usage, input or solver error.
//   pcp topo models [--json]

#include <stdio.h>
#include <string.h>

#include "config/config.h"
#include "topology/topology.h"
#include "topology/trace_impl.h"

typedef struct check_options_t {
  char* model;
  int32_t solver;   // index into kSolverNames
  int32_t backend;  // index into kBackendNames
  bool json;
  bool help;
} check_options_t;

static const char* const kSolverNames[] = {"native", "z3", NULL};
static const char* const kBackendNames[] = {"library", "binary", NULL};

#define CHECK_OFFSET(member) offsetof(check_options_t, member)

static const pcp_config_field_t kCheckFields[] = {
    {.name = "model", .type = PCP_CONFIG_TYPE_STRING,
     .offset = CHECK_OFFSET(model), .flags = PCP_CONFIG_FLAG_REQUIRED,
     .value_name = "NAME", .help = "model to check ('pcp topo models' lists them)"},
    {.name = "solver", .type = PCP_CONFIG_TYPE_ENUM,
     .offset = CHECK_OFFSET(solver), .default_value = "native",
     .enum_values = kSolverNames,
     .help = "native search or Z3 (models are re-checked natively)"},
    {.name = "z3-backend", .type = PCP_CONFIG_TYPE_ENUM,
     .offset = CHECK_OFFSET(backend), .default_value = "library",
     .enum_values = kBackendNames,
     .help = "libz3 in process, or the z3 executable on SMT-LIB text"},
    {.name = "json", .type = PCP_CONFIG_TYPE_BOOL, .offset = CHECK_OFFSET(json),
     .default_value = "false", .help = "print the report as one JSON object"},
    {.name = "help", .type = PCP_CONFIG_TYPE_BOOL, .offset = CHECK_OFFSET(help),
     .default_value = "false", .help = "show this help"},
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
  pcp_status_format(status, buffer, sizeof(buffer));
  fprintf(stderr, "pcp topo check: %s\n", buffer);
  pcp_status_ignore(status);
  return 2;
}

int pcp_topology_cli_check_main(int argc, char** argv) {
  check_options_t options;
  pcp_status_t status = pcp_config_initialize(&kCheckTable, &options);
  if (!status) {
    status = pcp_config_parse_argv(&kCheckTable, argc - 1, argv + 1, &options,
                                   NULL);
  }
  if (!status && options.help) {
    printf("usage: pcp topo check --model NAME [--solver native|z3] "
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
  if (!status) status = pcp_config_validate(&kCheckTable, &options);
  const pcp_topology_model_t* model = NULL;
  if (!status) {
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
  check.solver = options.solver == 1 ? PCP_TOPOLOGY_SOLVER_Z3
                                     : PCP_TOPOLOGY_SOLVER_NATIVE;
  check.z3.backend = options.backend == 1
                         ? PCP_TOPOLOGY_SOLVER_BACKEND_Z3_BINARY
                         : PCP_TOPOLOGY_SOLVER_BACKEND_Z3_LIBRARY;
  bool json = options.json;
  pcp_config_deinitialize(&kCheckTable, &options);
  if (check.solver == PCP_TOPOLOGY_SOLVER_Z3 &&
      !pcp_topology_solver_available(check.z3.backend)) {
    return check_fail(pcp_make_status(
        PCP_STATUS_UNAVAILABLE, "Z3 %s backend is not available in this build",
        check.z3.backend == PCP_TOPOLOGY_SOLVER_BACKEND_Z3_BINARY ? "binary"
                                                                  : "library"));
  }
  pcp_topology_check_report_t report;
  pcp_topology_check_report_initialize(pcp_allocator_system(), &report);
  status = pcp_topology_model_check(model, check, &report);
  pcp_string_builder_t text;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &text);
  if (!status) {
    status = json ? pcp_topology_check_report_format_json(&report, &text)
                  : pcp_topology_check_report_format(&report, &text);
  }
  int exit_code = 2;
  if (!status) {
    fputs(pcp_string_builder_cstring(&text), stdout);
    if (json) fputc('\n', stdout);
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
    {.name = "json", .type = PCP_CONFIG_TYPE_BOOL,
     .offset = offsetof(models_options_t, json), .default_value = "false",
     .help = "print the list as one JSON object"},
    {.name = "help", .type = PCP_CONFIG_TYPE_BOOL,
     .offset = offsetof(models_options_t, help), .default_value = "false",
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
        b, "%s{\"name\":\"%s\",\"task\":\"%s\",\"expected\":\"%s\","
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
    printf("usage: pcp topo models [--json]\n\nLists the protocol models "
           "'pcp topo check' accepts.\n\nflags:\n");
    pcp_config_print_help(&kModelsTable, stdout);
    pcp_config_deinitialize(&kModelsTable, &options);
    return 0;
  }
  pcp_string_builder_t text;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &text);
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
