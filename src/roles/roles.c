// SPDX-License-Identifier: Apache-2.0
// The role driver: pick the role, refuse legacy flags, parse the role's
// table, validate, then --help / --dump-config / run. Every role goes
// through the same steps so errors and exit codes cannot drift apart.

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "roles/nodemgr/supervision_impl.h"
#include "roles/roles_impl.h"

//===----------------------------------------------------------------------===//
// Names
//===----------------------------------------------------------------------===//

// The --backend choices in the order `--help` and the "allowed:" error show
// them (pinned by roles_test and roles_cli_test, so not base's order). Each
// is a name in base's backend table; the stored value is an index here.
const char* const pcp_roles_backend_values[] = {
    "auto", "cpu", "cuda", "metal", "vulkan", "rocm", NULL};

const char* pcp_roles_backend_name(int32_t backend_index) {
  pcp_backend_kind_t kind = PCP_BACKEND_KIND_AUTO;
  if (backend_index > 0 &&
      backend_index < (int32_t)PCP_ARRAYSIZE(pcp_roles_backend_values) - 1) {
    // A value missing from base's table is a programming error.
    bool known = pcp_backend_kind_parse(
        pcp_make_cstring_view(pcp_roles_backend_values[backend_index]),
        PCP_BACKEND_PARSE_FLAG_AUTO, &kind);
    PCP_ASSERT(known);
  }
  if (kind == PCP_BACKEND_KIND_AUTO) {
    kind = pcp_backend_kind_host();
  }
  return pcp_backend_kind_name(kind);
}

const char* pcp_roles_role_name(pcp_roles_role_t role) {
  switch (role) {
    case PCP_ROLES_ROLE_GATEWAY:
      return "gateway";
    case PCP_ROLES_ROLE_FEDERATION_HUB:
      return "federation-hub";
    case PCP_ROLES_ROLE_WORKER:
      return "worker";
    case PCP_ROLES_ROLE_NODE_MANAGER:
      return "node-manager";
    case PCP_ROLES_ROLE_SUPERVISE:
      return "supervise";
  }
  return "unknown";
}

//===----------------------------------------------------------------------===//
// Selection and legacy flags
//===----------------------------------------------------------------------===//

// True for `--name` and `--name=...`.
static bool arg_is_flag(const char* arg, const char* flag) {
  size_t n = strlen(flag);
  return strncmp(arg, flag, n) == 0 && (arg[n] == 0 || arg[n] == '=');
}

static const struct {
  const char* flag;
  pcp_roles_role_t role;
} kModeFlags[] = {
    {"--gateway", PCP_ROLES_ROLE_GATEWAY},
    {"--federation-hub", PCP_ROLES_ROLE_FEDERATION_HUB},
    {"--worker", PCP_ROLES_ROLE_WORKER},
    {"--node-manager", PCP_ROLES_ROLE_NODE_MANAGER},
};

pcp_status_t pcp_roles_role_select(int argc, char* const* argv,
                                   pcp_roles_role_t* out_role) {
  *out_role = PCP_ROLES_ROLE_GATEWAY;
  for (int i = 0; i < argc && strcmp(argv[i], "--") != 0; ++i) {
    if (arg_is_flag(argv[i], "--supervise")) {
      *out_role = PCP_ROLES_ROLE_SUPERVISE;
      return pcp_ok_status();
    }
  }
  const char* chosen_flag = NULL;
  bool connect = false;
  for (int i = 0; i < argc && strcmp(argv[i], "--") != 0; ++i) {
    if (arg_is_flag(argv[i], "--connect")) {
      connect = true;
    }
    for (size_t m = 0; m < PCP_ARRAYSIZE(kModeFlags); ++m) {
      if (!arg_is_flag(argv[i], kModeFlags[m].flag)) {
        continue;
      }
      // Upstream let the last mode flag win; two different ones are far
      // more likely a broken script than a choice.
      if (chosen_flag && strcmp(chosen_flag, kModeFlags[m].flag) != 0) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "conflicting role flags '%s' and '%s'",
                               chosen_flag, kModeFlags[m].flag);
      }
      chosen_flag = kModeFlags[m].flag;
      *out_role = kModeFlags[m].role;
    }
  }
  if (!chosen_flag && connect) {
    *out_role = PCP_ROLES_ROLE_WORKER;
  }
  return pcp_ok_status();
}

static const struct {
  const char* flag;
  const char* hint;
} kLegacyFlags[] = {
    {"--shepherd",
     "the shepherd is now the gateway: run 'pcp --gateway --gateway-config "
     "FILE'"},
    {"--inference",
     "inference runs inside the gateway: enable controllers.inference in "
     "the --gateway-config file"},
    {"--inference-config",
     "set controllers.inference.config_path in the --gateway-config file"},
    {"--config",
     "set controllers.training.config_path (or controllers.rl.config_path) "
     "in the --gateway-config file"},
    {"--model",
     "the model is named in the inference config "
     "(controllers.inference.config_path)"},
    {"--resume",
     "set controllers.training.should_resume in the --gateway-config file"},
    {"--rl", "enable controllers.rl in the --gateway-config file"},
    {"--no-dashboard", "the standalone dashboard is gone; drop the flag"},
    {"--terminate", "stop a running process with SIGTERM"},
    {"--streaming",
     "streaming training is chosen in the experiment config "
     "(controllers.training.config_path)"},
};

static pcp_status_t legacy_check_range(int argc, char* const* argv) {
  for (int i = 0; i < argc && strcmp(argv[i], "--") != 0; ++i) {
    for (size_t k = 0; k < PCP_ARRAYSIZE(kLegacyFlags); ++k) {
      if (arg_is_flag(argv[i], kLegacyFlags[k].flag)) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "flag '%s' was removed with the standalone "
                               "modes: %s",
                               kLegacyFlags[k].flag, kLegacyFlags[k].hint);
      }
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_roles_legacy_flags_check(int argc, char* const* argv) {
  return legacy_check_range(argc, argv);
}

//===----------------------------------------------------------------------===//
// Logging and signals
//===----------------------------------------------------------------------===//

static size_t append_value(char* line, size_t at, size_t capacity,
                           const char* value, bool force_quote) {
  bool quote =
      force_quote || value[0] == 0 || strpbrk(value, " \"=\t\n\\") != NULL;
  if (quote && at < capacity) {
    line[at++] = '"';
  }
  for (const char* p = value; *p && at + 3 < capacity; ++p) {
    if (*p == '"' || *p == '\\') {
      line[at++] = '\\';
      line[at++] = *p;
    } else if (*p == '\n') {
      line[at++] = '\\';
      line[at++] = 'n';
    } else {
      line[at++] = *p;
    }
  }
  if (quote && at < capacity) {
    line[at++] = '"';
  }
  return at;
}

void pcp_roles_log_event(const char* role, const char* msg,
                         const char* const* pairs, size_t pair_count) {
  pcp_roles_log_event_at(PCP_LOG_INFO, role, msg, pairs, pair_count);
}

void pcp_roles_log_event_at(pcp_log_level_t level, const char* role,
                            const char* msg, const char* const* pairs,
                            size_t pair_count) {
  if (pcp_log_level() > level) {
    return;
  }
  char line[4096];
  const size_t capacity = sizeof(line) - 1;  // room for the newline
  int64_t wall_ns = pcp_clock_wall_ns(pcp_clock_system());
  time_t seconds = (time_t)(wall_ns / 1000000000LL);
  struct tm tm;
  gmtime_r(&seconds, &tm);
  int n = snprintf(line, capacity,
                   "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03dZ level=%s role=%s "
                   "msg=",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                   tm.tm_min, tm.tm_sec, (int)((wall_ns / 1000000LL) % 1000),
                   pcp_log_level_name(level), role);
  size_t at = n > 0 ? (size_t)n : 0;
  if (at > capacity) {
    at = capacity;
  }
  at = append_value(line, at, capacity, msg, true);
  for (size_t i = 0; i + 1 < pair_count * 2; i += 2) {
    if (!pairs[i + 1]) {
      continue;
    }
    n = snprintf(line + at, capacity - at, " %s=", pairs[i]);
    if (n > 0) {
      at += (size_t)n;
    }
    if (at >= capacity) {
      at = capacity;
      break;
    }
    at = append_value(line, at, capacity, pairs[i + 1], false);
  }
  line[at++] = '\n';
  ssize_t ignored = write(STDERR_FILENO, line, at);
  (void)ignored;
}

// Self-pipe: the handler only writes one byte (async-signal-safe) and the
// waiting thread blocks in read(). The pipe can later be handed to the
// event loop unchanged, which a sigwait()-based design could not.
static int g_signal_pipe[2] = {-1, -1};

static void on_signal(int signal_number) {
  int saved_errno = errno;
  unsigned char byte = (unsigned char)signal_number;
  ssize_t ignored = write(g_signal_pipe[1], &byte, 1);
  (void)ignored;
  errno = saved_errno;
}

pcp_status_t pcp_roles_signals_install(void) {
  if (g_signal_pipe[0] < 0) {
    if (pipe(g_signal_pipe) != 0) {
      return pcp_status_from_errno(errno, "creating the signal pipe");
    }
    for (int i = 0; i < 2; ++i) {
      fcntl(g_signal_pipe[i], F_SETFD, FD_CLOEXEC);
    }
    // A burst of signals must never block the handler.
    fcntl(g_signal_pipe[1], F_SETFL,
          fcntl(g_signal_pipe[1], F_GETFL) | O_NONBLOCK);
  }
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGTERM, &action, NULL) != 0 ||
      sigaction(SIGINT, &action, NULL) != 0) {
    return pcp_status_from_errno(errno, "installing signal handlers");
  }
  return pcp_ok_status();
}

int pcp_roles_signals_wait(void) {
  for (;;) {
    unsigned char byte = 0;
    ssize_t n = read(g_signal_pipe[0], &byte, 1);
    if (n == 1) {
      return byte;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    return SIGTERM;  // the pipe broke: treat it as a stop request
  }
}

int pcp_roles_run_until_signal(const char* role, const char* const* pairs,
                               size_t pair_count) {
  pcp_status_t status = pcp_roles_signals_install();
  if (status) {
    pcp_log_context_t context = {.role = role};
    pcp_log_status(PCP_LOG_ERROR, &context, status, "start failed");
    pcp_status_ignore(status);
    return 1;
  }
  pcp_roles_log_event(role, "started", pairs, pair_count);
  int signal_number = pcp_roles_signals_wait();
  const char* stop_pairs[] = {"signal",
                              signal_number == SIGINT ? "SIGINT" : "SIGTERM"};
  pcp_roles_log_event(role, "stopping", stop_pairs, 1);
  return 0;
}

//===----------------------------------------------------------------------===//
// Driver
//===----------------------------------------------------------------------===//

static const pcp_roles_def_t* def_of(pcp_roles_role_t role) {
  switch (role) {
    case PCP_ROLES_ROLE_GATEWAY:
      return &pcp_roles_gateway_def;
    case PCP_ROLES_ROLE_FEDERATION_HUB:
      return &pcp_roles_hub_def;
    case PCP_ROLES_ROLE_WORKER:
      return &pcp_roles_worker_def;
    case PCP_ROLES_ROLE_NODE_MANAGER:
      return &pcp_roles_nodemgr_def;
    case PCP_ROLES_ROLE_SUPERVISE:
      return &pcp_roles_supervise_def;
  }
  return &pcp_roles_gateway_def;
}

// True when argv names a role (a mode flag, --supervise or --connect); with
// none the gateway is implied, and a flag it does not know is reported as
// pcp's, not the gateway's (`pcp --verison`).
static bool role_flag_given(int argc, char* const* argv) {
  for (int i = 0; i < argc && strcmp(argv[i], "--") != 0; ++i) {
    if (arg_is_flag(argv[i], "--supervise") ||
        arg_is_flag(argv[i], "--connect")) {
      return true;
    }
    for (size_t m = 0; m < PCP_ARRAYSIZE(kModeFlags); ++m) {
      if (arg_is_flag(argv[i], kModeFlags[m].flag)) {
        return true;
      }
    }
  }
  return false;
}

// With no role flag: the first flag the implied gateway does not take,
// reported with the closest of pcp's own flags (--version, --help, the role
// flags) or else of the gateway's. Exit 2; 0 when every flag is known.
static int implied_role_unknown_flag(const pcp_roles_def_t* def, int argc,
                                     char* const* argv) {
  static const char* const kTopLevel[] = {
      "version",      "help",           "gateway",  "worker",
      "node-manager", "federation-hub", "supervise"};
  for (int i = 0; i < argc && strcmp(argv[i], "--") != 0; ++i) {
    const char* arg = argv[i];
    if (strncmp(arg, "--", 2) != 0) {
      continue;
    }
    char name[128];
    size_t length = strcspn(arg + 2, "=");
    snprintf(name, sizeof(name), "%.*s", (int)length, arg + 2);
    if (strcmp(name, "help") == 0 || pcp_config_has_flag(def->table, name)) {
      continue;
    }
    const char* suggestion =
        pcp_config_suggest(name, kTopLevel, PCP_ARRAYSIZE(kTopLevel));
    if (!suggestion) {
      suggestion = pcp_config_suggest_flag(def->table, name);
    }
    if (suggestion) {
      fprintf(stderr, "pcp: unknown flag '--%s' (did you mean '--%s'?)\n", name,
              suggestion);
    } else {
      fprintf(stderr, "pcp: unknown flag '--%s'\n", name);
    }
    fprintf(stderr, "Try 'pcp help'.\n");
    return 2;
  }
  return 0;
}

static bool wants_help(int argc, char* const* argv) {
  for (int i = 0; i < argc && strcmp(argv[i], "--") != 0; ++i) {
    if (arg_is_flag(argv[i], "--help") || strcmp(argv[i], "-h") == 0) {
      return true;
    }
  }
  return false;
}

static void print_role_help(const pcp_roles_def_t* def) {
  printf("usage: %s\n\nflags:\n", def->usage);
  pcp_config_print_help(def->table, stdout);
}

static int run_role(const pcp_roles_def_t* def, int role_argc, char** role_argv,
                    int child_argc, char** child_argv) {
  // The system allocator: this is the process's top, where a failure ends
  // the command (the role's own allocations take theirs from its config).
  pcp_allocator_t allocator = pcp_allocator_system();
  void* config = NULL;
  pcp_status_t alloc_status =
      pcp_allocator_calloc(allocator, def->config_size, &config);
  if (alloc_status) {
    pcp_status_ignore(alloc_status);
    fprintf(stderr, "pcp %s: out of memory\n", def->flag);
    return 1;
  }
  int exit_code = 2;
  pcp_status_t status = pcp_config_initialize(def->table, config);
  if (!status) {
    status =
        pcp_config_parse_argv(def->table, role_argc, role_argv, config, NULL);
  }
  if (!status && def->role == PCP_ROLES_ROLE_SUPERVISE) {
    pcp_roles_supervise_config_t* supervise = config;
    for (int i = 0; i < child_argc && !status; ++i) {
      status = pcp_string_list_append(&supervise->child_args, child_argv[i]);
    }
  }
  if (!status) {
    status = pcp_config_validate(def->table, config);
  }
  if (!status && def->prepare) {
    status = def->prepare(config);
  }
  if (status) {
    exit_code = pcp_config_cli_usage_error(def->flag, status);
  } else if (((pcp_roles_common_t*)config)->dump_config) {
    if (def->dump) {
      def->dump(config, stdout);
    } else {
      pcp_config_dump_json(def->table, config, stdout);
    }
    fflush(stdout);
    exit_code = 0;
  } else {
    exit_code = def->run(config);
  }
  if (def->cleanup) {
    def->cleanup(config);
  }
  pcp_config_deinitialize(def->table, config);
  pcp_allocator_free(allocator, config);
  return exit_code;
}

int pcp_roles_main(int argc, char** argv) {
  // First, while single-threaded (it edits the environment): a child of a
  // node manager or supervisor must not outlive it.
  pcp_status_t status = pcp_roles_supervisor_death_watch();
  if (status) {
    fprintf(stderr, "pcp: %s\n", pcp_status_message(status));
    pcp_status_ignore(status);
    return 1;
  }
  pcp_roles_role_t role = PCP_ROLES_ROLE_GATEWAY;
  status = pcp_roles_role_select(argc, argv, &role);
  if (status) {
    fprintf(stderr, "pcp: %s\nTry 'pcp help'.\n", pcp_status_message(status));
    pcp_status_ignore(status);
    return 2;
  }
  const pcp_roles_def_t* def = def_of(role);
  int role_argc = argc;
  int child_argc = 0;
  char** child_argv = NULL;
  if (role == PCP_ROLES_ROLE_SUPERVISE) {
    // The supervisor's own flags end at --supervise; everything after it
    // (one leading `--` dropped) is the child's command line.
    for (int i = 0; i < argc; ++i) {
      if (arg_is_flag(argv[i], "--supervise")) {
        role_argc = i + 1;
        break;
      }
    }
    child_argv = argv + role_argc;
    child_argc = argc - role_argc;
    if (child_argc > 0 && strcmp(child_argv[0], "--") == 0) {
      ++child_argv;
      --child_argc;
    }
    if (!wants_help(role_argc, argv) && child_argc == 1 &&
        (strcmp(child_argv[0], "--help") == 0 ||
         strcmp(child_argv[0], "-h") == 0)) {
      print_role_help(def);
      return 0;
    }
  }
  status = legacy_check_range(role_argc, argv);
  if (status) {
    return pcp_config_cli_usage_error(def->flag, status);
  }
  if (!role_flag_given(role_argc, argv)) {
    int exit_code = implied_role_unknown_flag(def, role_argc, argv);
    if (exit_code) {
      return exit_code;
    }
  }
  if (wants_help(role_argc, argv)) {
    print_role_help(def);
    return 0;
  }
  return run_role(def, role_argc, argv, child_argc, child_argv);
}
