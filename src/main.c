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
#include "mlir/mlir.h"
#include "models/models.h"
#include "roles/roles.h"
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
    {"chat", pcp_roles_chat_cli_main, "chat with a served model (OpenAI-compatible API), streaming"},
    {"compile", pcp_compile_cli_main, "compile StableHLO MLIR to an IREE VMFB"},
    {"inspect", pcp_mlir_inspect_main, "show a StableHLO module's functions and signatures"},
    {"model", pcp_models_cli_main, "emit a built-in model (gpt, nanochat, qwen3) as StableHLO"},
    {"run", pcp_compute_run_cli_main, "invoke a function of a VMFB (or .mlir) through IREE"},
    {"submit", pcp_roles_submit_cli_main, "submit a training experiment to a gateway and follow it"},
    {"tokenize", pcp_tokenizer_cli_main, "encode text to ids or decode ids with a tokenizer.json"},
    {"topo", pcp_topology_cli_main, "topology simulator: homology, subdivisions, protocol checks"},
    {NULL, NULL, NULL},
};

static void print_usage(FILE* out) {
  fprintf(out,
          "usage: pcp <command> [args]      run a tool\n"
          "       pcp --gateway | --federation-hub | --worker | --node-manager "
          "[flags]\n"
          "       pcp --version | --help\n\ncommands:\n");
  for (const command_t* c = kCommands; c->name; ++c) {
    fprintf(out, "  %-10s %s\n", c->name, c->summary);
  }
  fprintf(out, "\n'pcp <command> --help' and 'pcp --<role> --help' list flags.\n");
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

int main(int argc, char** argv) {
  if (argc >= 2 && strcmp(argv[1], "--version") == 0) return print_version();
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  // A flag first selects a process role (upstream style: `pcp --worker`).
  if (strncmp(argv[1], "--", 2) == 0) return pcp_roles_main(argc - 1, argv + 1);
  for (const command_t* c = kCommands; c->name; ++c) {
    if (strcmp(argv[1], c->name) == 0) return c->main(argc - 1, argv + 1);
  }
  fprintf(stderr, "pcp: unknown command '%s'\nTry 'pcp --help'.\n", argv[1]);
  return 2;
}
