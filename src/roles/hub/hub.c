// SPDX-License-Identifier: Apache-2.0
// --federation-hub: the cross-gateway coordinator. Wiring only for now.

#include "roles/roles_impl.h"

#define T pcp_roles_hub_config_t

static const pcp_config_field_t kFields[] = {
    PCP_ROLES_COMMON_FIELDS(T, "federation-hub",
                            "run the federation hub (gateway registry, "
                            "global jobs)"),
    {.name = "api-host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, api_host),
     .default_value = "127.0.0.1",
     .value_name = "HOST",
     .help = "hub API bind host"},
    {.name = "api-port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, api_port),
     // Apart from the gateway's 8000/8080 and the node manager's 8002, so
     // all four can start with defaults on one host.
     .default_value = "8003",
     .min = 1,
     .max = 65535,
     .value_name = "PORT",
     .help = "hub API bind port"},
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
    {.name = "api-token-env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, api_token_env),
     .flags = PCP_CONFIG_FLAG_ENV_NAME,
     .help = "environment variable holding the hub bearer token"},
};

const pcp_config_table_t pcp_roles_hub_table = {"federation-hub", kFields,
                                                PCP_ARRAYSIZE(kFields), NULL};

static int run(void* opaque) {
  T* config = opaque;
  char port[16];
  snprintf(port, sizeof(port), "%lld", (long long)config->api_port);
  const char* pairs[] = {
      "api_host", config->api_host, "api_port",
      port,       "api_token_env",  config->api_token_env,
  };
  return pcp_roles_run_until_signal("federation-hub", pairs,
                                    PCP_ARRAYSIZE(pairs) / 2);
}

const pcp_roles_def_t pcp_roles_hub_def = {
    .role = PCP_ROLES_ROLE_FEDERATION_HUB,
    .flag = "--federation-hub",
    .usage =
        "pcp --federation-hub [flags]\n\n"
        "Runs the federation hub that gateways connect to.",
    .table = &pcp_roles_hub_table,
    .config_size = sizeof(T),
    .run = run,
};
