// SPDX-License-Identifier: Apache-2.0
// --supervise -- <child args>: a supervisor of one worker child
// (upstream s.7.2), running the node manager's policy (runner.c) for one
// slot: restart with jittered exponential backoff, crash-loop cap (then
// exit 1 so that whoever started us sees it), SIGTERM/SIGINT stop the child
// (SIGKILL after the grace period) and exit 0. The node manager does not
// use it (it supervises its workers itself, see nodemgr.c); it is for
// running one worker under systemd, a container runtime or by hand.

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "roles/nodemgr/supervision_impl.h"
#include "roles/roles_impl.h"

#define T pcp_roles_supervise_config_t

static const pcp_config_field_t kFields[] = {
    PCP_ROLES_COMMON_FIELDS(T, "supervise",
                            "supervise one worker child; every argument "
                            "after it (a leading -- dropped) is the child's"),
    {.name = "host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, host),
     .default_value = "127.0.0.1",
     .value_name = "HOST",
     .help = "gateway worker fabric host"},
    {.name = "port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, port),
     .default_value = "8080",
     .min = 1,
     .max = 65535,
     .value_name = "PORT",
     .help = "gateway worker fabric port"},
    {.name = "supervisor-id",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, supervisor_id),
     .default_value = "-1",
     .min = -1,
     .max = 9007199254740991.0,
     .value_name = "ID",
     .help = "id passed to the child as --supervisor-id; -1: a random "
             "one"},
    PCP_ROLES_POLICY_FIELDS(T),
    // Not a flag: filled from the arguments after --supervise, listed here
    // so --dump-config shows it and deinitialize frees it.
    {.name = "child-args",
     .type = PCP_CONFIG_TYPE_STRING_LIST,
     .offset = offsetof(T, child_args),
     .flags = PCP_CONFIG_FLAG_JSON_ONLY | PCP_CONFIG_FLAG_HIDDEN,
     .help = "the child's arguments"},
};

const pcp_config_table_t pcp_roles_supervise_table = {
    "supervise", kFields, PCP_ARRAYSIZE(kFields), NULL};

pcp_status_t pcp_roles_supervise_child_check(
    const pcp_string_list_t* child_args) {
  int argc = (int)child_args->count;
  char* const* argv = child_args->items;
  pcp_roles_role_t role = PCP_ROLES_ROLE_GATEWAY;
  PCP_RETURN_IF_ERROR(pcp_roles_role_select(argc, argv, &role),
                      "supervisor child args");
  if (argc == 0 || role != PCP_ROLES_ROLE_WORKER) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "the supervised child must be a worker: give "
                           "'--supervise -- --worker [worker flags]'");
  }
  pcp_status_t status = pcp_roles_legacy_flags_check(argc, argv);
  if (status) {
    return pcp_status_annotate_f(status, "supervisor child args");
  }
  for (int i = 0; i < argc && strcmp(argv[i], "--") != 0; ++i) {
    if (strncmp(argv[i], "--supervisor-id", 15) == 0 &&
        (argv[i][15] == 0 || argv[i][15] == '=')) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "supervisor child: '--supervisor-id' is set by "
                             "the supervisor (give it to --supervise)");
    }
  }
  // Parse the child's flags now, so a typo fails here, once, instead of in
  // a child restarted in a loop.
  pcp_roles_worker_config_t worker;
  memset(&worker, 0, sizeof(worker));
  status = pcp_config_initialize(&pcp_roles_worker_table, &worker);
  if (!status) {
    status = pcp_config_parse_argv(&pcp_roles_worker_table, argc,
                                   child_args->items, &worker, NULL);
  }
  if (!status) {
    status = pcp_config_validate(&pcp_roles_worker_table, &worker);
  }
  if (!status && worker.connect) {
    status =
        pcp_roles_connect_parse(worker.connect, &worker.host, &worker.port);
  }
  pcp_config_deinitialize(&pcp_roles_worker_table, &worker);
  if (status) {
    // Keep the message one line: prefix it rather than annotate.
    pcp_status_t wrapped =
        pcp_make_status(pcp_status_code(status), "supervisor child: %s",
                        pcp_status_message(status));
    pcp_status_ignore(status);
    return wrapped;
  }
  return pcp_ok_status();
}

static pcp_status_t prepare(void* opaque) {
  T* config = opaque;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_roles_supervise_child_check(&config->child_args));
  pcp_roles_supervision_options_t options;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_roles_policy_flags_to_options(&config->policy, 1, 0, &options));
  if (config->policy.worker_exe &&
      access(config->policy.worker_exe, X_OK) != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "flag '--worker-exe': '%s' is not an executable "
                           "file",
                           config->policy.worker_exe);
  }
  return pcp_ok_status();
}

static int run(void* opaque) {
  T* config = opaque;
  pcp_log_context_t log_context = {.role = "supervise"};
  pcp_rng_t rng;
  pcp_rng_initialize((uint64_t)pcp_clock_wall_ns(pcp_clock_system()) ^
                         ((uint64_t)getpid() << 32),
                     &rng);
  // Upstream drew the id from a PRNG seeded with unix seconds (same-second
  // supervisors collided); ours mixes in the pid and stays JSON-safe.
  int64_t supervisor_id =
      config->supervisor_id >= 0
          ? config->supervisor_id
          : (int64_t)pcp_rng_next_below(&rng, UINT64_C(1) << 53);
  char self_exe[4096];
  const char* exe = config->policy.worker_exe;
  pcp_status_t status = pcp_ok_status();
  if (!exe) {
    status = pcp_roles_self_exe(self_exe, sizeof(self_exe));
    exe = self_exe;
  }
  // Child argv: EXE <child args...> --supervisor-id ID (upstream's order)
  // [--drain-timeout-ms D].
  char id[24];
  snprintf(id, sizeof(id), "%" PRId64, supervisor_id);
  size_t argc = config->child_args.count;
  // A drain that ends within our grace period, unless the child args set
  // one (theirs wins: they know the work).
  bool has_drain = false;
  for (size_t i = 0; i < argc; ++i) {
    const char* arg = config->child_args.items[i];
    if (strcmp(arg, "--") == 0) {
      break;
    }
    has_drain |= strncmp(arg, "--drain-timeout-ms", 18) == 0 &&
                 (arg[18] == 0 || arg[18] == '=');
  }
  char drain[24];
  snprintf(drain, sizeof(drain), "%" PRId64,
           pcp_roles_worker_drain_timeout_ms(config->policy.stop_grace_ms));
  const char** args = NULL;
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &builder);
  if (!status) {
    status =
        pcp_allocator_calloc(pcp_allocator_system(),
                             (size_t)(argc + 6) * sizeof(char*), (void**)&args);
  }
  if (!status && args) {
    args[0] = exe;
    for (size_t i = 0; i < argc; ++i) {
      args[1 + i] = config->child_args.items[i];
    }
    size_t n = 1 + argc;
    args[n++] = "--supervisor-id";
    args[n++] = id;
    if (!has_drain) {
      args[n++] = "--drain-timeout-ms";
      args[n++] = drain;
    }
    // One field with the child's command line, for the log reader.
    for (size_t i = 1; i < n && !status; ++i) {
      status = pcp_string_builder_append_f(&builder, "%s%s", i > 1 ? " " : "",
                                           args[i]);
    }
  }
  const char* const* slot_args[1] = {args};
  pcp_roles_runner_options_t runner_options = {
      .role = "supervise",
      .seed = pcp_rng_next_u64(&rng),
      .slot_args = slot_args,
      .exit_when_all_failed = true,
  };
  if (!status) {
    status = pcp_roles_policy_flags_to_options(&config->policy, 1, 0,
                                               &runner_options.policy);
  }
  if (!status) {
    char port[16];
    snprintf(port, sizeof(port), "%lld", (long long)config->port);
    const char* pairs[] = {
        "host",          config->host,
        "port",          port,
        "supervisor_id", id,
        "exe",           exe,
        "child",         pcp_string_builder_cstring(&builder),
    };
    runner_options.started_pairs = pairs;
    runner_options.started_pair_count = PCP_ARRAYSIZE(pairs) / 2;
    status = pcp_roles_runner_run(&runner_options);
  }
  int exit_code = 0;
  if (status) {
    pcp_log_status(PCP_LOG_ERROR, &log_context, status, "supervisor failed");
    pcp_status_ignore(status);
    exit_code = 1;
  } else {
    pcp_roles_log_event("supervise", "stopped", NULL, 0);
  }
  pcp_string_builder_deinitialize(&builder);
  pcp_allocator_free(pcp_allocator_system(), (void*)args);
  return exit_code;
}

const pcp_roles_def_t pcp_roles_supervise_def = {
    .role = PCP_ROLES_ROLE_SUPERVISE,
    .flag = "--supervise",
    .usage =
        "pcp [--host H] [--port P] [flags] --supervise -- --worker [worker "
        "flags]\n\n"
        "Supervises one worker child: restarts it with backoff, gives up "
        "(exit 1) after\nthe crash-loop cap; SIGTERM/SIGINT stop it and "
        "exit 0.",
    .table = &pcp_roles_supervise_table,
    .config_size = sizeof(T),
    .prepare = prepare,
    .run = run,
};
