// SPDX-License-Identifier: Apache-2.0
// --gateway: the site control plane. This file holds its flags, its JSON
// config (--gateway-config, upstream s.2, plus state_dir, worker_fabric and
// tls) with one table per JSON object and the derived effective settings;
// server.c serves it.

#include <stdlib.h>
#include <string.h>

#include "roles/roles_impl.h"

//===----------------------------------------------------------------------===//
// Flags
//===----------------------------------------------------------------------===//

#define T pcp_roles_gateway_config_t

static const pcp_config_field_t kFlagFields[] = {
    PCP_ROLES_COMMON_FIELDS(T, "gateway", "run the gateway (the default role)"),
    {.name = "gateway-config",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, gateway_config),
     .flags = PCP_CONFIG_FLAG_REQUIRED,
     .value_name = "PATH",
     .help = "gateway config JSON file"},
    {.name = "api-host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, api_host),
     .default_value = "127.0.0.1",
     .value_name = "HOST",
     .help = "gateway API bind host"},
    {.name = "api-port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, api_port),
     .default_value = "8000",
     .min = 1,
     .max = 65535,
     .value_name = "PORT",
     .help = "gateway API bind port"},
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
    {.name = "control-host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, control_host),
     .default_value = "127.0.0.1",
     .value_name = "HOST",
     .help = "worker fabric bind host when the config has no "
             "worker_fabric.host"},
    {.name = "control-port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, control_port),
     .default_value = "8080",
     .min = 1,
     .max = 65535,
     .value_name = "PORT",
     .help = "worker fabric bind port when the config has no "
             "worker_fabric.port"},
    {.name = "api-token-env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, api_token_env),
     .flags = PCP_CONFIG_FLAG_ENV_NAME,
     .help = "environment variable holding the API token (overrides the "
             "config)"},
    {.name = "workers",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, workers),
     .default_value = "2",
     .min = 1,
     .max = 100000,
     .help = "workers an embedded training/RL controller needs when its "
             "block has no 'workers'"},
    {.name = "model-dir",
     .type = PCP_CONFIG_TYPE_STRING_LIST,
     .offset = offsetof(T, model_dirs),
     .value_name = "DIR",
     .help = "model directory (model.json + weights) to serve on the "
             "OpenAI-compatible API; repeatable or comma-separated"},
};

const pcp_config_table_t pcp_roles_gateway_table = {
    "gateway", kFlagFields, PCP_ARRAYSIZE(kFlagFields), NULL};

#undef T

//===----------------------------------------------------------------------===//
// Config file tables, innermost first
//===----------------------------------------------------------------------===//

// Every key is JSON-only (JSON_ONLY makes "missing required key" messages
// name keys, not flags).
#define J PCP_CONFIG_FLAG_JSON_ONLY

static const pcp_config_field_t kEndpointFields[] = {
    {.name = "host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(pcp_roles_endpoint_config_t, host),
     .flags = J},
    {.name = "port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(pcp_roles_endpoint_config_t, port),
     .min = 1,
     .max = 65535,
     .flags = J},
};
static const pcp_config_table_t kEndpointTable = {
    "gateway config", kEndpointFields, PCP_ARRAYSIZE(kEndpointFields), NULL};

#define WF pcp_roles_fabric_config_t
static const pcp_config_field_t kFabricFields[] = {
    {.name = "host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(WF, host),
     .flags = J},
    {.name = "port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(WF, port),
     .min = 1,
     .max = 65535,
     .flags = J},
    {.name = "join_token_env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(WF, join_token_env),
     .default_value = "PCP_WORKER_JOIN_TOKEN",
     .flags = J | PCP_CONFIG_FLAG_ENV_NAME},
    {.name = "heartbeat_ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(WF, heartbeat_ms),
     .default_value = "1000",
     .min = 50,
     .max = 600000,
     .flags = J},
};
#undef WF
static pcp_status_t validate_fabric(const void* opaque) {
  const pcp_roles_fabric_config_t* fabric = opaque;
  // The value names a variable; a typo with a space or '=' would otherwise
  // surface only as "token unset" at start.
  const char* name = fabric->join_token_env;
  bool valid = name && name[0] && !(name[0] >= '0' && name[0] <= '9');
  for (const char* p = name; valid && *p; ++p) {
    valid = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
            (*p >= '0' && *p <= '9') || *p == '_';
  }
  if (!valid) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "gateway config: key 'worker_fabric.join_token_env'"
                           ": '%s' is not an environment variable name",
                           name ? name : "");
  }
  return pcp_ok_status();
}

static const pcp_config_table_t kFabricTable = {"gateway config", kFabricFields,
                                                PCP_ARRAYSIZE(kFabricFields),
                                                validate_fabric};

static pcp_status_t validate_tls(const void* opaque) {
  const pcp_roles_tls_config_t* tls = opaque;
  if ((tls->cert == NULL) != (tls->key == NULL)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "gateway config: key 'tls.%s' is required when "
                           "'tls.%s' is set",
                           tls->cert ? "key" : "cert",
                           tls->cert ? "cert" : "key");
  }
  return pcp_ok_status();
}

static const pcp_config_field_t kTlsFields[] = {
    {.name = "cert",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(pcp_roles_tls_config_t, cert),
     .flags = J},
    {.name = "key",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(pcp_roles_tls_config_t, key),
     .flags = J},
};
static const pcp_config_table_t kTlsTable = {
    "gateway config", kTlsFields, PCP_ARRAYSIZE(kTlsFields), validate_tls};

#define HL pcp_roles_http_limits_config_t
static const pcp_config_field_t kHttpLimitsFields[] = {
    {.name = "header_timeout_ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(HL, header_timeout_ms),
     .min = 100,
     .max = 600000,
     .flags = J},
    {.name = "idle_timeout_s",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(HL, idle_timeout_s),
     .min = 1,
     .max = 86400,
     .flags = J},
    {.name = "max_connections",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(HL, max_connections),
     .min = 16,
     .max = 1000000,
     .flags = J},
    {.name = "max_connections_per_client",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(HL, max_connections_per_client),
     .min = 1,
     .max = 1000000,
     .flags = J},
};
#undef HL
static const pcp_config_table_t kHttpLimitsTable = {
    "gateway config", kHttpLimitsFields, PCP_ARRAYSIZE(kHttpLimitsFields),
    NULL};

static const pcp_config_table_t kOpaqueTable = {"gateway config", NULL, 0,
                                                NULL};

#define A pcp_roles_api_config_t
static const pcp_config_field_t kApiFields[] = {
    {.name = "host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(A, host),
     .flags = J},
    {.name = "port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(A, port),
     .min = 1,
     .max = 65535,
     .flags = J},
    {.name = "token_env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(A, token_env),
     .flags = J | PCP_CONFIG_FLAG_ENV_NAME},
    {.name = "internal_token_env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(A, internal_token_env),
     .flags = J | PCP_CONFIG_FLAG_ENV_NAME},
};
#undef A
static const pcp_config_table_t kApiTable = {"gateway config", kApiFields,
                                             PCP_ARRAYSIZE(kApiFields), NULL};

//===----------------------------------------------------------------------===//
// Controller blocks
//===----------------------------------------------------------------------===//

static pcp_status_t validate_controller(const pcp_roles_controller_config_t* c,
                                        const char* path) {
  // A disabled block is ignored entirely, as upstream.
  if (!c->enabled) {
    return pcp_ok_status();
  }
  if (!c->config_path || !c->config_path[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "gateway config: key '%s.config_path' is required "
                           "when '%s.enabled' is true",
                           path, path);
  }
  if (c->worker_class) {
    // Worker classes are base's backend names plus "any" and "hip".
    pcp_backend_kind_t kind;
    if (!pcp_backend_kind_parse(
            pcp_make_cstring_view(c->worker_class),
            PCP_BACKEND_PARSE_FLAG_ANY | PCP_BACKEND_PARSE_FLAG_ALIASES,
            &kind)) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "gateway config: key '%s.worker_class': invalid "
                             "value '%s' (allowed: any, cpu, cuda, rocm, hip, "
                             "metal, vulkan)",
                             path, c->worker_class);
    }
  }
  if (c->target_arch && !c->target_arch[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "gateway config: key '%s.target_arch' is empty",
                           path);
  }
  if (c->max_workers >= 0 && c->reserved_workers > c->max_workers) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "gateway config: key '%s.reserved_workers' (%lld) exceeds "
        "'%s.max_workers' (%lld)",
        path, (long long)c->reserved_workers, path, (long long)c->max_workers);
  }
  return pcp_ok_status();
}

static pcp_status_t validate_inference(const void* config) {
  return validate_controller(config, "controllers.inference");
}
static pcp_status_t validate_training(const void* config) {
  return validate_controller(config, "controllers.training");
}
static pcp_status_t validate_rl(const void* config) {
  return validate_controller(config, "controllers.rl");
}

#define C pcp_roles_controller_config_t
// Rows every kind has; |service| is the default service_id.
#define CONTROLLER_COMMON_FIELDS(service)                                 \
  {.name = "enabled",                                                     \
   .type = PCP_CONFIG_TYPE_BOOL,                                          \
   .offset = offsetof(C, enabled),                                        \
   .flags = J},                                                           \
      {.name = "config_path",                                             \
       .type = PCP_CONFIG_TYPE_STRING,                                    \
       .offset = offsetof(C, config_path),                                \
       .flags = J},                                                       \
      {.name = "service_id",                                              \
       .type = PCP_CONFIG_TYPE_STRING,                                    \
       .offset = offsetof(C, service_id),                                 \
       .default_value = (service),                                        \
       .flags = J},                                                       \
      {.name = "api",                                                     \
       .type = PCP_CONFIG_TYPE_OBJECT,                                    \
       .offset = offsetof(C, api),                                        \
       .flags = J,                                                        \
       .object_table = &kEndpointTable},                                  \
      {.name = "worker_class",                                            \
       .type = PCP_CONFIG_TYPE_STRING,                                    \
       .offset = offsetof(C, worker_class),                               \
       .flags = J},                                                       \
      {.name = "target_arch",                                             \
       .type = PCP_CONFIG_TYPE_STRING,                                    \
       .offset = offsetof(C, target_arch),                                \
       .flags = J},                                                       \
      {.name = "reserved_workers",                                        \
       .type = PCP_CONFIG_TYPE_INT64,                                     \
       .offset = offsetof(C, reserved_workers),                           \
       .default_value = "0",                                              \
       .min = 0,                                                          \
       .max = 100000,                                                     \
       .flags = J},                                                       \
  {                                                                       \
    .name = "max_workers", .type = PCP_CONFIG_TYPE_INT64,                 \
    .offset = offsetof(C, max_workers), .default_value = "-1", .min = -1, \
    .max = 100000, .flags = J                                             \
  }

#define CONTROLLER_WORKERS_FIELD                                        \
  {                                                                     \
    .name = "workers", .type = PCP_CONFIG_TYPE_INT64,                   \
    .offset = offsetof(C, workers), .min = 1, .max = 100000, .flags = J \
  }

static const pcp_config_field_t kInferenceFields[] = {
    CONTROLLER_COMMON_FIELDS("inference-main"),
};
static const pcp_config_field_t kTrainingFields[] = {
    CONTROLLER_COMMON_FIELDS("training-main"),
    CONTROLLER_WORKERS_FIELD,
    {.name = "should_resume",
     .type = PCP_CONFIG_TYPE_BOOL,
     .offset = offsetof(C, should_resume),
     .flags = J},
};
static const pcp_config_field_t kRlFields[] = {
    CONTROLLER_COMMON_FIELDS("rl-main"),
    CONTROLLER_WORKERS_FIELD,
    {.name = "backend",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(C, backend),
     .default_value = "cpu",
     .flags = J},
};
#undef C

static const pcp_config_table_t kInferenceTable = {
    "gateway config", kInferenceFields, PCP_ARRAYSIZE(kInferenceFields),
    validate_inference};
static const pcp_config_table_t kTrainingTable = {
    "gateway config", kTrainingFields, PCP_ARRAYSIZE(kTrainingFields),
    validate_training};
static const pcp_config_table_t kRlTable = {
    "gateway config", kRlFields, PCP_ARRAYSIZE(kRlFields), validate_rl};

#define CS pcp_roles_controllers_config_t
static const pcp_config_field_t kControllersFields[] = {
    {.name = "inference",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(CS, inference),
     .flags = J,
     .object_table = &kInferenceTable},
    {.name = "training",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(CS, training),
     .flags = J,
     .object_table = &kTrainingTable},
    {.name = "rl",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(CS, rl),
     .flags = J,
     .object_table = &kRlTable},
    {.name = "extensions",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(CS, extensions),
     .flags = J,
     .object_table = &kOpaqueTable},
};
#undef CS
static const pcp_config_table_t kControllersTable = {
    "gateway config", kControllersFields, PCP_ARRAYSIZE(kControllersFields),
    NULL};

//===----------------------------------------------------------------------===//
// Top level
//===----------------------------------------------------------------------===//

// "memory" is upstream's default spelling and is served by SQLite (the
// store was never in memory). "neo4j" is refused: there is no Neo4j server
// to test against (docs/decisions.md).
static const char* const kGraphBackends[] = {"memory", "sqlite", "falkordb",
                                             NULL};

static pcp_status_t validate_file(const void* opaque) {
  const pcp_roles_gateway_file_config_t* file = opaque;
  if (file->data_roots.count > PCP_ROLES_GATEWAY_MAX_ROOTS ||
      file->model_roots.count > PCP_ROLES_GATEWAY_MAX_ROOTS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "gateway config: key '%s': at most %d directories",
                           file->data_roots.count > PCP_ROLES_GATEWAY_MAX_ROOTS
                               ? "data_roots"
                               : "model_roots",
                           PCP_ROLES_GATEWAY_MAX_ROOTS);
  }
  const pcp_string_list_t* lists[] = {&file->data_roots, &file->model_roots};
  for (size_t l = 0; l < 2; ++l) {
    for (size_t i = 0; i < lists[l]->count; ++i) {
      if (!lists[l]->items[i][0]) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "gateway config: key '%s[%zu]': empty path",
                               l == 0 ? "data_roots" : "model_roots", i);
      }
    }
  }
  if (file->federation.enabled && !file->federation.upstream &&
      !file->federation_hub_endpoint) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "gateway config: key 'federation.enabled' is true "
                           "but neither 'federation.upstream' nor "
                           "'federation_hub_endpoint' is set");
  }
  return pcp_ok_status();
}

#define G pcp_roles_gateway_file_config_t
static const pcp_config_field_t kFileFields[] = {
    {.name = "gateway_id",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(G, gateway_id),
     .flags = J | PCP_CONFIG_FLAG_REQUIRED},
    {.name = "lab_id",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(G, lab_id),
     .flags = J | PCP_CONFIG_FLAG_REQUIRED},
    {.name = "graph_backend",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(G, graph_backend),
     .default_value = "memory",
     .enum_values = kGraphBackends,
     .flags = J},
    {.name = "policy_store_path",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(G, policy_store_path),
     .flags = J},
    {.name = "neo4j",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(G, neo4j),
     .flags = J,
     .object_table = &pcp_services_neo4j_config_table},
    {.name = "falkordb",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(G, falkordb),
     .flags = J,
     .object_table = &pcp_services_falkordb_config_table},
    {.name = "api",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(G, api),
     .flags = J,
     .object_table = &kApiTable},
    {.name = "api_token_env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(G, api_token_env),
     .flags = J | PCP_CONFIG_FLAG_ENV_NAME},
    {.name = "internal_api_token_env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(G, internal_api_token_env),
     .flags = J | PCP_CONFIG_FLAG_ENV_NAME},
    {.name = "federation",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(G, federation),
     .flags = J,
     .object_table = &pcp_services_federation_config_table},
    {.name = "federation_hub_endpoint",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(G, federation_hub_endpoint),
     .flags = J},
    {.name = "worker_fabric",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(G, worker_fabric),
     .flags = J,
     .object_table = &kFabricTable},
    {.name = "sharing_defaults",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(G, sharing_defaults),
     .flags = J,
     .object_table = &pcp_services_sharing_config_table},
    {.name = "controllers",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(G, controllers),
     .flags = J,
     .object_table = &kControllersTable},
    {.name = "state_dir",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(G, state_dir),
     .flags = J},
    {.name = "tls",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(G, tls),
     .flags = J,
     .object_table = &kTlsTable},
    {.name = "http",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(G, http),
     .flags = J,
     .object_table = &kHttpLimitsTable},
    {.name = "data_roots",
     .type = PCP_CONFIG_TYPE_STRING_LIST,
     .offset = offsetof(G, data_roots),
     .flags = J,
     .help = "directories experiment data files must lie under (at most "
             "16; default: <state_dir>/data and the project's data/)"},
    {.name = "model_roots",
     .type = PCP_CONFIG_TYPE_STRING_LIST,
     .offset = offsetof(G, model_roots),
     .flags = J,
     .help = "directories model_path modules must lie under (at most 16; "
             "default: <state_dir>/models and the project's data/)"},
    {.name = "max_job_parameters",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(G, max_job_parameters),
     .default_value = "0",
     .min = 0,
     .max = 1099511627776.0,
     .flags = J,
     .help = "most parameters of one training job (0: what "
             "max_job_gateway_bytes allows)"},
    {.name = "max_job_gateway_bytes",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(G, max_job_gateway_bytes),
     .default_value = "0",
     .min = 0,
     .max = 4611686018427387904.0,
     .flags = J,
     .help = "most gateway memory one training job may need (0: half of "
             "MemTotal)"},
};
#undef G

const pcp_config_table_t pcp_roles_gateway_file_table = {
    "gateway config", kFileFields, PCP_ARRAYSIZE(kFileFields), validate_file};

#define E pcp_roles_gateway_effective_t
static const pcp_config_field_t kEffectiveFields[] = {
    {.name = "api_host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(E, api_host)},
    {.name = "api_port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(E, api_port)},
    {.name = "api_token_env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(E, api_token_env),
     .flags = PCP_CONFIG_FLAG_ENV_NAME},
    {.name = "internal_api_token_env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(E, internal_api_token_env),
     .flags = PCP_CONFIG_FLAG_ENV_NAME},
    {.name = "federation_upstream",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(E, federation_upstream)},
    {.name = "federation_token_env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(E, federation_token_env),
     .flags = PCP_CONFIG_FLAG_ENV_NAME},
    {.name = "federation_heartbeat_interval_ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(E, federation_heartbeat_interval_ms)},
    {.name = "worker_fabric_host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(E, worker_fabric_host)},
    {.name = "worker_fabric_port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(E, worker_fabric_port)},
    {.name = "controllers",
     .type = PCP_CONFIG_TYPE_STRING_LIST,
     .offset = offsetof(E, controllers)},
    {.name = "worker_join_token_env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(E, worker_join_token_env),
     .flags = PCP_CONFIG_FLAG_ENV_NAME},
    {.name = "worker_heartbeat_ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(E, worker_heartbeat_ms)},
};
#undef E

const pcp_config_table_t pcp_roles_gateway_effective_table = {
    "gateway (effective)", kEffectiveFields, PCP_ARRAYSIZE(kEffectiveFields),
    NULL};

#undef J

//===----------------------------------------------------------------------===//
// Deriving the effective settings
//===----------------------------------------------------------------------===//

// |slot| is a string field of the effective table: the config module owns
// it and frees it (pcp_config_deinitialize) as it frees the strings it
// parses, with the system allocator.
static pcp_status_t set_copy(char** slot, const char* value) {
  pcp_allocator_free(pcp_allocator_system(), *slot);
  *slot = NULL;
  if (!value) {
    return pcp_ok_status();
  }
  pcp_status_t status =
      pcp_allocator_strdup(pcp_allocator_system(), value, slot);
  if (status) {
    pcp_status_ignore(status);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "oom");
  }
  return pcp_ok_status();
}

typedef struct listener_t {
  const char* what;
  int64_t port;
} listener_t;

static pcp_status_t derive_effective(pcp_roles_gateway_config_t* config) {
  pcp_roles_gateway_file_config_t* file = &config->file;
  pcp_roles_gateway_effective_t* e = &config->effective;
  PCP_RETURN_IF_ERROR_BARE(set_copy(&e->api_host, config->api_host));
  e->api_port = config->api_port;
  // Token env precedence (upstream): --api-token-env, then api.token_env,
  // then the top-level api_token_env.
  const char* token_env = config->api_token_env;
  if (!token_env && file->api.present) {
    token_env = file->api.token_env;
  }
  if (!token_env) {
    token_env = file->api_token_env;
  }
  PCP_RETURN_IF_ERROR_BARE(set_copy(&e->api_token_env, token_env));
  const char* internal_env =
      file->api.present ? file->api.internal_token_env : NULL;
  if (!internal_env) {
    internal_env = file->internal_api_token_env;
  }
  PCP_RETURN_IF_ERROR_BARE(set_copy(&e->internal_api_token_env, internal_env));
  const char* upstream =
      file->federation.present ? file->federation.upstream : NULL;
  if (!upstream) {
    upstream = file->federation_hub_endpoint;
  }
  PCP_RETURN_IF_ERROR_BARE(set_copy(&e->federation_upstream, upstream));
  PCP_RETURN_IF_ERROR_BARE(
      set_copy(&e->federation_token_env,
               file->federation.present ? file->federation.token_env : NULL));
  e->federation_heartbeat_interval_ms = file->federation.heartbeat_interval_ms;
  const pcp_roles_fabric_config_t* fabric = &file->worker_fabric;
  PCP_RETURN_IF_ERROR_BARE(set_copy(
      &e->worker_fabric_host,
      fabric->present && fabric->host ? fabric->host : config->control_host));
  e->worker_fabric_port =
      fabric->present && fabric->port ? fabric->port : config->control_port;
  PCP_RETURN_IF_ERROR_BARE(set_copy(&e->worker_join_token_env,
                                    fabric->present && fabric->join_token_env
                                        ? fabric->join_token_env
                                        : "PCP_WORKER_JOIN_TOKEN"));
  e->worker_heartbeat_ms =
      fabric->present && fabric->heartbeat_ms ? fabric->heartbeat_ms : 1000;

  // Controllers listen on api.port, else api_port + 1 (upstream). Upstream
  // let two enabled controllers collide on that default; here every
  // listener must have its own port.
  listener_t listeners[5] = {
      {"--api-port", e->api_port},
      {"the worker fabric", e->worker_fabric_port},
  };
  size_t listener_count = 2;
  if (listeners[0].port == listeners[1].port) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "the gateway API and the worker fabric both use "
                           "port %lld",
                           (long long)e->api_port);
  }
  const struct {
    const char* name;
    const pcp_roles_controller_config_t* block;
  } kinds[] = {
      {"inference", &file->controllers.inference},
      {"training", &file->controllers.training},
      {"rl", &file->controllers.rl},
  };
  pcp_string_list_deinitialize(&e->controllers);
  for (size_t i = 0; i < PCP_ARRAYSIZE(kinds); ++i) {
    const pcp_roles_controller_config_t* c = kinds[i].block;
    if (!file->controllers.present || !c->present || !c->enabled) {
      continue;
    }
    int64_t workers = c->workers ? c->workers : config->workers;
    if (strcmp(kinds[i].name, "inference") == 0) {
      workers = 1;
    }
    if (c->max_workers >= 0 && workers > c->max_workers) {
      return pcp_make_status(
          PCP_STATUS_INVALID_ARGUMENT,
          "gateway config: controllers.%s needs %lld workers but "
          "'controllers.%s.max_workers' is %lld",
          kinds[i].name, (long long)workers, kinds[i].name,
          (long long)c->max_workers);
    }
    const char* host =
        c->api.present && c->api.host ? c->api.host : "127.0.0.1";
    int64_t port =
        c->api.present && c->api.port ? c->api.port : e->api_port + 1;
    if (port > 65535) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "gateway config: set 'controllers.%s.api.port' "
                             "(the default --api-port + 1 is past 65535)",
                             kinds[i].name);
    }
    for (size_t l = 0; l < listener_count; ++l) {
      if (listeners[l].port == port) {
        return pcp_make_status(
            PCP_STATUS_INVALID_ARGUMENT,
            "gateway config: controllers.%s would listen on port %lld, "
            "already used by %s; set 'controllers.%s.api.port'",
            kinds[i].name, (long long)port, listeners[l].what, kinds[i].name);
      }
    }
    listeners[listener_count].what = kinds[i].name;
    listeners[listener_count].port = port;
    ++listener_count;
    char text[320];
    snprintf(text, sizeof(text), "%s@%s:%lld", kinds[i].name, host,
             (long long)port);
    PCP_RETURN_IF_ERROR_BARE(pcp_string_list_append(&e->controllers, text));
  }
  return pcp_ok_status();
}

pcp_status_t pcp_roles_gateway_prepare_config(
    pcp_roles_gateway_config_t* config) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_config_initialize(&pcp_roles_gateway_file_table, &config->file));
  PCP_RETURN_IF_ERROR_BARE(pcp_config_initialize(
      &pcp_roles_gateway_effective_table, &config->effective));
  config->file_loaded = true;
  pcp_string_list_t unknown = {0};
  pcp_status_t status = pcp_config_load_json_file(&pcp_roles_gateway_file_table,
                                                  config->gateway_config,
                                                  &config->file, &unknown);
  if (status) {
    pcp_string_list_deinitialize(&unknown);
    // One line that names the flag and the file; the loader's message
    // already carries the path or the key.
    pcp_status_t wrapped =
        pcp_make_status(pcp_status_code(status), "flag '--gateway-config': %s",
                        pcp_status_message(status));
    pcp_status_ignore(status);
    return wrapped;
  }
  // Upstream ignores unknown keys; they stay accepted, but a typo in a key
  // name should not pass unnoticed.
  pcp_log_context_t context = {.role = "gateway"};
  for (size_t i = 0; i < unknown.count; ++i) {
    PCP_LOG(PCP_LOG_WARN, &context, "gateway config: unknown key '%s' ignored",
            unknown.items[i]);
  }
  pcp_string_list_deinitialize(&unknown);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_config_validate(&pcp_roles_gateway_file_table, &config->file));
  return derive_effective(config);
}

//===----------------------------------------------------------------------===//
// Role
//===----------------------------------------------------------------------===//

static pcp_status_t prepare(void* opaque) {
  return pcp_roles_gateway_prepare_config(opaque);
}

static void dump(const void* opaque, FILE* out) {
  const pcp_roles_gateway_config_t* config = opaque;
  pcp_config_section_t sections[] = {
      {"flags", &pcp_roles_gateway_table, config},
      {"gateway_config", &pcp_roles_gateway_file_table, &config->file},
      {"effective", &pcp_roles_gateway_effective_table, &config->effective},
  };
  pcp_config_dump_json_sections(sections, PCP_ARRAYSIZE(sections), out);
}

static void cleanup(void* opaque) {
  pcp_roles_gateway_config_t* config = opaque;
  if (!config->file_loaded) {
    return;
  }
  pcp_config_deinitialize(&pcp_roles_gateway_file_table, &config->file);
  pcp_config_deinitialize(&pcp_roles_gateway_effective_table,
                          &config->effective);
  config->file_loaded = false;
}

static int run(void* opaque) {
  return pcp_roles_gateway_serve(opaque);
}

const pcp_roles_def_t pcp_roles_gateway_def = {
    .role = PCP_ROLES_ROLE_GATEWAY,
    .flag = "--gateway",
    .usage =
        "pcp [--gateway] --gateway-config PATH [flags]\n\n"
        "Runs the site gateway: API, embedded services, worker fabric.",
    .table = &pcp_roles_gateway_table,
    .config_size = sizeof(pcp_roles_gateway_config_t),
    .prepare = prepare,
    .dump = dump,
    .run = run,
    .cleanup = cleanup,
};
