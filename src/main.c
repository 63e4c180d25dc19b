// SPDX-License-Identifier: Apache-2.0
//
// pcp: one binary. The first argument picks a tool subcommand
// (`pcp compile ...`) or, when it is a flag, a process role (`pcp --worker
// ...`, upstream style). This file only dispatches; every command lives in
// its module and has the signature `int main(int argc, char** argv)` with
// argv[0] = the command name.

#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "compile/compile.h"
#include "compute/compute.h"
#include "config/config.h"
#include "mlir/mlir.h"
#include "models/models.h"
#include "roles/roles.h"
#include "sim/sim.h"
#include "tokenizer/tokenizer.h"
#include "topology/topology.h"

typedef int (*command_main_fn_t)(int argc, char** argv);

typedef struct command_t {
  const char* name;
  command_main_fn_t main;
  const char* summary;
} command_t;

// Tool subcommands, one line each. Keep sorted by name.
static const command_t kCommands[] = {
    {"chat", pcp_roles_chat_cli_main,
     "chat with a served model (OpenAI-compatible API), streaming"},
    {"compile", pcp_compile_cli_main, "compile StableHLO MLIR to an IREE VMFB"},
    {"inspect", pcp_mlir_inspect_main,
     "show a StableHLO module's functions and signatures"},
    {"model", pcp_models_cli_main,
     "emit a built-in model (gpt, nanochat, qwen3) as StableHLO"},
    {"run", pcp_compute_run_cli_main,
     "invoke a function of a VMFB (or .mlir) through IREE"},
    {"sim", pcp_sim_cli_main,
     "deterministic simulation of gateway, workers and job runner: seeds, "
     "replay, shrink"},
    {"submit", pcp_roles_submit_cli_main,
     "submit a training experiment to a gateway and follow it"},
    {"tokenize", pcp_tokenizer_cli_main,
     "encode text to ids or decode ids with a tokenizer.json"},
    {"topo", pcp_topology_cli_main,
     "topology simulator: homology, subdivisions, protocol checks"},
    {NULL, NULL, NULL},
};

// Process roles, by the name `pcp help NAME` accepts and their flag.
static const struct {
  const char* name;
  const char* flag;
} kRoles[] = {
    {"gateway", "--gateway"},           {"worker", "--worker"},
    {"node-manager", "--node-manager"}, {"federation-hub", "--federation-hub"},
    {"supervise", "--supervise"},
};

static void print_usage(FILE* out) {
  fprintf(out,
          "usage: pcp <command> [args]      run a tool\n"
          "       pcp --gateway | --federation-hub | --worker | --node-manager "
          "[flags]\n"
          "       pcp help [COMMAND|ROLE]   this text, or a command's flags\n"
          "       pcp version               pcp's and IREE's versions\n"
          "\ncommands:\n");
  for (const command_t* c = kCommands; c->name; ++c) {
    fprintf(out, "  %-10s %s\n", c->name, c->summary);
  }
  fprintf(out,
          "\n'pcp help <command>' (or 'pcp <command> --help') and "
          "'pcp help <role>'\n(or 'pcp --<role> --help') list flags. Exit "
          "codes: 0 done, 1 the work\nfailed, 2 usage (unknown flag, bad "
          "value).\n");
}

// "pcp: unknown command 'compil' (did you mean 'compile'?)", exit 2.
static int unknown_command(const char* what, const char* name) {
  const char* candidates[PCP_ARRAYSIZE(kCommands) + PCP_ARRAYSIZE(kRoles) + 2];
  size_t count = 0;
  for (const command_t* c = kCommands; c->name; ++c) {
    candidates[count++] = c->name;
  }
  candidates[count++] = "help";
  candidates[count++] = "version";
  size_t first_role = count;
  for (size_t i = 0; i < PCP_ARRAYSIZE(kRoles); ++i) {
    candidates[count++] = kRoles[i].name;
  }
  const char* suggestion = pcp_config_suggest(name, candidates, count);
  // Roles are flags (`pcp worker` means `pcp --worker`), except after help.
  bool role_flag = false;
  for (size_t i = first_role; suggestion && i < count; ++i) {
    role_flag |= suggestion == candidates[i] && strcmp(what, "command") == 0;
  }
  if (suggestion) {
    fprintf(stderr, "pcp: unknown %s '%s' (did you mean '%s%s'?)\n", what, name,
            role_flag ? "--" : "", suggestion);
  } else {
    fprintf(stderr, "pcp: unknown %s '%s'\n", what, name);
  }
  fprintf(stderr, "Try 'pcp help'.\n");
  return 2;
}

// `pcp --version`: pcp's own version and the pinned IREE compiler and
// runtime it will use (a missing .venv is reported, not fatal).
static int print_version(void) {
  printf("pcp %s\n", PCP_VERSION_STRING);
  char version[256];
  pcp_status_t status = pcp_compile_compiler_version(version, sizeof(version));
  if (status) {
    printf("iree-compiler: unavailable (%s)\n", pcp_status_message(status));
    pcp_status_ignore(status);
  } else {
    printf("iree-compiler: %s\n", version);
  }
  status = pcp_compute_runtime_version(version, sizeof(version));
  if (status) {
    printf("iree-runtime: unavailable (%s)\n", pcp_status_message(status));
    pcp_status_ignore(status);
  } else {
    printf("iree-runtime: %s\n", version);
  }
  printf("venv: %s\n", pcp_venv_directory());
  return 0;
}

// `pcp help [COMMAND|ROLE]`: the same text as `pcp COMMAND --help` and
// `pcp --ROLE --help`.
static int help_main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stdout);
    return 0;
  }
  if (argc > 2) {
    fprintf(stderr, "pcp help: expected one command, got %d\nTry 'pcp help'.\n",
            argc - 1);
    return 2;
  }
  const char* name = argv[1];
  if (strcmp(name, "help") == 0) {
    print_usage(stdout);
    return 0;
  }
  if (strcmp(name, "version") == 0) {
    printf(
        "usage: pcp version (or pcp --version)\n\nPrints pcp's version "
        "and the IREE compiler and runtime it uses.\n");
    return 0;
  }
  char help_flag[] = "--help";
  for (const command_t* c = kCommands; c->name; ++c) {
    if (strcmp(name, c->name) == 0) {
      char* args[] = {(char*)c->name, help_flag, NULL};
      return c->main(2, args);
    }
  }
  // Roles by name ("worker") or by flag ("--worker").
  const char* bare = strncmp(name, "--", 2) == 0 ? name + 2 : name;
  for (size_t i = 0; i < PCP_ARRAYSIZE(kRoles); ++i) {
    if (strcmp(bare, kRoles[i].name) == 0) {
      char* args[] = {(char*)kRoles[i].flag, help_flag, NULL};
      return pcp_roles_main(2, args);
    }
  }
  return unknown_command("command or role", name);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  const char* first = argv[1];
  if (strcmp(first, "--help") == 0 || strcmp(first, "-h") == 0) {
    print_usage(stdout);
    return 0;
  }
  if (strcmp(first, "--version") == 0 || strcmp(first, "version") == 0) {
    if (argc > 2) {
      fprintf(stderr,
              "pcp version: unexpected argument '%s'\nTry 'pcp help'.\n",
              argv[2]);
      return 2;
    }
    return print_version();
  }
  if (strcmp(first, "help") == 0)
    return help_main(argc - 1, argv + 1);
  // A flag first selects a process role (upstream style: `pcp --worker`);
  // the role driver also reports flags that are no role's ("--verison").
  if (strncmp(first, "--", 2) == 0)
    return pcp_roles_main(argc - 1, argv + 1);
  for (const command_t* c = kCommands; c->name; ++c) {
    if (strcmp(first, c->name) == 0)
      return c->main(argc - 1, argv + 1);
  }
  return unknown_command("command", first);
}
