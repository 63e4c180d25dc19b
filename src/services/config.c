// SPDX-License-Identifier: Apache-2.0
// The config tables of the embedded services' blocks in the gateway's JSON
// config (graph backends, federation, sharing): the services own their keys,
// ranges and defaults; the gateway's file table (roles/gateway/gateway.c)
// nests them under its keys. Types in services.h.

#include <stddef.h>

#include "services/services.h"

// Every key is JSON-only (JSON_ONLY makes "missing required key" messages
// name keys, not flags).
#define J PCP_CONFIG_FLAG_JSON_ONLY

#define N pcp_services_neo4j_config_t
static const pcp_config_field_t kNeo4jFields[] = {
    {.name = "uri",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(N, uri),
     .flags = J | PCP_CONFIG_FLAG_REQUIRED},
    {.name = "http_uri",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(N, http_uri),
     .flags = J},
    {.name = "user",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(N, user),
     .flags = J | PCP_CONFIG_FLAG_REQUIRED},
    {.name = "password_env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(N, password_env),
     .flags = J | PCP_CONFIG_FLAG_ENV_NAME},
    {.name = "database",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(N, database),
     .flags = J},
    {.name = "query_timeout_ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(N, query_timeout_ms),
     .default_value = "5000",
     .min = 0,
     .max = 4294967295.0,
     .flags = J},
    {.name = "bootstrap_on_connect",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = offsetof(N, bootstrap_on_connect),
     .default_value = "true",
     .flags = J},
};
#undef N
const pcp_config_table_t pcp_services_neo4j_config_table = {
    "gateway config", kNeo4jFields, PCP_ARRAYSIZE(kNeo4jFields), NULL};

#define FK pcp_services_falkordb_config_t
static const pcp_config_field_t kFalkordbFields[] = {
    {.name = "host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(FK, host),
     .default_value = "127.0.0.1",
     .flags = J},
    {.name = "port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(FK, port),
     .default_value = "6379",
     .min = 1,
     .max = 65535,
     .flags = J},
    {.name = "password_env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(FK, password_env),
     .flags = J | PCP_CONFIG_FLAG_ENV_NAME},
    {.name = "graph",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(FK, graph),
     .default_value = "pcp",
     .flags = J},
    {.name = "connect_timeout_ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(FK, connect_timeout_ms),
     .default_value = "2000",
     .min = 1,
     .max = 600000,
     .flags = J},
    {.name = "command_timeout_ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(FK, command_timeout_ms),
     .default_value = "5000",
     .min = 1,
     .max = 600000,
     .flags = J},
};
#undef FK
const pcp_config_table_t pcp_services_falkordb_config_table = {
    "gateway config", kFalkordbFields, PCP_ARRAYSIZE(kFalkordbFields), NULL};

#define F pcp_services_federation_config_t
static const pcp_config_field_t kFederationFields[] = {
    {.name = "enabled",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = offsetof(F, enabled),
     .flags = J},
    {.name = "upstream",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(F, upstream),
     .flags = J},
    {.name = "token_env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(F, token_env),
     .flags = J | PCP_CONFIG_FLAG_ENV_NAME},
    {.name = "heartbeat_interval_ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(F, heartbeat_interval_ms),
     .default_value = "5000",
     .min = 100,
     .max = 86400000,
     .flags = J},
    {.name = "advertise_url",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(F, advertise_url),
     .flags = J,
     .help = "the gateway API URL the hub calls back (default: from "
             "--api-host and the bound port)"},
};
#undef F
const pcp_config_table_t pcp_services_federation_config_table = {
    "gateway config", kFederationFields, PCP_ARRAYSIZE(kFederationFields),
    NULL};

static const char* const kVisibilities[] = {"local", "shared", "global", NULL};
static const pcp_config_field_t kSharingFields[] = {
    {.name = "default_visibility",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(pcp_services_sharing_config_t, default_visibility),
     .default_value = "local",
     .enum_values = kVisibilities,
     .flags = J},
};
const pcp_config_table_t pcp_services_sharing_config_table = {
    "gateway config", kSharingFields, PCP_ARRAYSIZE(kSharingFields), NULL};

#undef J
