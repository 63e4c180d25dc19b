// SPDX-License-Identifier: Apache-2.0
// --node-manager: spawns --scale supervisors, one per device slot, and
// serves probes. Wiring only for now (the libuv master loop comes later).

#include "roles/roles_impl.h"

#define T pcp_roles_nodemgr_config_t

static const pcp_config_field_t kFields[] = {
    PCP_ROLES_COMMON_FIELDS(T, "node-manager",
                            "run the node manager (one supervisor per "
                            "device slot)"),
    {.name = "host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, host),
     .default_value = "127.0.0.1",
     .value_name = "HOST",
     .help = "gateway worker fabric host, passed to "
             "the workers"},
    {.name = "port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, port),
     .default_value = "8080",
     .min = 1,
     .max = 65535,
     .value_name = "PORT",
     .help = "gateway worker fabric port, passed to the workers"},
    {.name = "api-host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, api_host),
     .default_value = "127.0.0.1",
     .value_name = "HOST",
     .help = "probe server bind host"},
    {.name = "api-port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, api_port),
     .default_value = "8000",
     .min = 1,
     .max = 65535,
     .value_name = "PORT",
     .help = "probe server bind port"},
    {.name = "gateway-host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, api_host),
     .value_name = "HOST",
     .flags = PCP_CONFIG_FLAG_ALIAS,
     .help = "legacy name"},
    {.name = "gateway-port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, api_port),
     .min = 1,
     .max = 65535,
     .value_name = "PORT",
     .flags = PCP_CONFIG_FLAG_ALIAS,
     .help = "legacy name"},
    {.name = "scale",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, scale),
     .default_value = "1",
     .min = 1,
     .max = 1024,
     .help = "number of supervisor slots"},
    {.name = "backend",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(T, backend),
     .default_value = "auto",
     .enum_values = pcp_roles_backend_values,
     .help = "device backend of the workers; auto is cpu on Linux"},
    {.name = "target",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, target),
     .value_name = "ARCH",
     .help = "GPU target architecture of the workers"},
};

const pcp_config_table_t pcp_roles_nodemgr_table = {
    "node-manager", kFields, PCP_ARRAYSIZE(kFields), NULL};

static int run(void* opaque) {
  T* config = opaque;
  char port[16], api_port[16], scale[16];
  snprintf(port, sizeof(port), "%lld", (long long)config->port);
  snprintf(api_port, sizeof(api_port), "%lld", (long long)config->api_port);
  snprintf(scale, sizeof(scale), "%lld", (long long)config->scale);
  const char* pairs[] = {
      "host",     config->host,   "port",
      port,       "api_host",     config->api_host,
      "api_port", api_port,       "scale",
      scale,      "backend",      pcp_roles_backend_name(config->backend),
      "target",   config->target,
  };
  return pcp_roles_run_until_signal("node-manager", pairs,
                                    PCP_ARRAYSIZE(pairs) / 2);
}

const pcp_roles_def_t pcp_roles_nodemgr_def = {
    .role = PCP_ROLES_ROLE_NODE_MANAGER,
    .flag = "--node-manager",
    .usage =
        "pcp --node-manager [flags]\n\n"
        "Runs the node manager: one supervised worker per device slot.",
    .table = &pcp_roles_nodemgr_table,
    .config_size = sizeof(T),
    .run = run,
};
