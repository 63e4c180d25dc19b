// SPDX-License-Identifier: Apache-2.0
// --supervise -- <child args>: a supervisor of one worker child, started
// by the node manager. Wiring only for now (spawn and restart come later).

#include <stdlib.h>
#include <string.h>

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
     .help = "internal: slot number given by the node manager; -1: none"},
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
  return pcp_roles_supervise_child_check(&config->child_args);
}

static int run(void* opaque) {
  T* config = opaque;
  char port[16], id[32];
  snprintf(port, sizeof(port), "%lld", (long long)config->port);
  snprintf(id, sizeof(id), "%lld", (long long)config->supervisor_id);
  // One field with the child's command line, for the log reader.
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &builder);
  pcp_status_t status = pcp_ok_status();
  for (size_t i = 0; i < config->child_args.count && !status; ++i) {
    status = pcp_string_builder_append_f(&builder, "%s%s", i ? " " : "",
                                         config->child_args.items[i]);
  }
  if (status) {
    pcp_status_ignore(status);
    pcp_string_builder_deinitialize(&builder);
    return 1;
  }
  const char* child = pcp_string_builder_cstring(&builder);
  const char* pairs[] = {
      "host",  config->host,    "port",
      port,    "supervisor_id", config->supervisor_id >= 0 ? id : NULL,
      "child", child,
  };
  int rc =
      pcp_roles_run_until_signal("supervise", pairs, PCP_ARRAYSIZE(pairs) / 2);
  pcp_string_builder_deinitialize(&builder);
  return rc;
}

const pcp_roles_def_t pcp_roles_supervise_def = {
    .role = PCP_ROLES_ROLE_SUPERVISE,
    .flag = "--supervise",
    .usage =
        "pcp [--host H] [--port P] --supervise -- --worker [worker "
        "flags]\n\n"
        "Supervises one worker child (started by the node manager).",
    .table = &pcp_roles_supervise_table,
    .config_size = sizeof(T),
    .prepare = prepare,
    .run = run,
};
