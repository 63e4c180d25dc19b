// SPDX-License-Identifier: Apache-2.0
// --worker: one device worker connecting to the gateway's worker fabric.
// Flags and the stable worker id; the runtime is in runtime.c.

#include <stdlib.h>
#include <string.h>

#include "net/net.h"
#include "roles/worker/worker_impl.h"
#include "sched/sched.h"

#define T pcp_roles_worker_config_t

static const pcp_config_field_t kFields[] = {
    PCP_ROLES_COMMON_FIELDS(T, "worker",
                            "run as a device worker (implied by --connect)"),
    {.name = "connect",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, connect),
     .value_name = "HOST:PORT",
     .help = "gateway worker fabric address; sets --host and --port"},
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
    {.name = "backend",
     .type = PCP_CONFIG_TYPE_ENUM,
     .offset = offsetof(T, backend),
     .default_value = "auto",
     .enum_values = pcp_roles_backend_values,
     .help = "device backend; auto is cpu on Linux"},
    {.name = "target",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, target),
     .value_name = "ARCH",
     .help = "GPU target architecture (sm_80, gfx942)"},
    {.name = "device-id",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, device_id),
     .default_value = "0",
     .min = 0,
     .max = 1 << 20,
     .help = "device ordinal; also part of the worker id"},
    {.name = "supervisor-id",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, supervisor_id),
     .default_value = "-1",
     .min = -1,
     .max = 9007199254740991.0,
     .value_name = "ID",
     .help = "internal: set by the supervisor on its child; -1: none"},
    {.name = "join-token-env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, join_token_env),
     .default_value = "PCP_WORKER_JOIN_TOKEN",
     .flags = PCP_CONFIG_FLAG_ENV_NAME,
     .value_name = "ENV",
     .help = "environment variable holding the fabric join token (HMAC key)"},
    {.name = "cache-dir",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, cache_dir),
     .value_name = "DIR",
     .help = "program cache (default: <artifact cache>/worker-programs)"},
    {.name = "device-memory-bytes",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, device_memory_bytes),
     .default_value = "0",
     .min = 0,
     .max = 9007199254740991.0,
     .value_name = "N",
     .help = "device memory reported at join; 0: query (host RAM for cpu)"},
    {.name = "resident-memory-bytes",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, resident_memory_bytes),
     .default_value = "0",
     .min = 0,
     .max = 9007199254740991.0,
     .value_name = "N",
     .help = "cap on resident session tensors (LRU sessions evicted); "
             "0: unlimited"},
    {.name = "node-manager-id",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, node_manager_id),
     .flags = PCP_CONFIG_FLAG_HIDDEN,
     .value_name = "ID",
     .help = "internal: the node manager that started this worker"},
    {.name = "worker-class",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, worker_class),
     .value_name = "CLASS",
     .help = "scheduling class reported at join"},
    {.name = "drain-timeout-ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, drain_timeout_ms),
     .default_value = "30000",
     .min = 0,
     .max = 86400000,
     .value_name = "MS",
     .help = "on SIGTERM, how long in-flight tasks may finish"},
    {.name = "cpu-threads",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, cpu_threads),
     .default_value = "0",
     .min = 0,
     .max = 4096,
     .value_name = "N",
     .help = "cpu backend worker threads; 0: one per core"},
    {.name = "metrics-listen",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, metrics_listen),
     .value_name = "HOST:PORT",
     .help = "serve this worker's Prometheus /metrics there (device memory, "
             "tasks, bytes, program cache)"},
    {.name = "test-task-delay-ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, test_task_delay_ms),
     .default_value = "0",
     .min = 0,
     .max = 600000,
     .flags = PCP_CONFIG_FLAG_HIDDEN,
     .value_name = "MS",
     .help = "test only: sleep before each task"},
};

const pcp_config_table_t pcp_roles_worker_table = {
    "worker", kFields, PCP_ARRAYSIZE(kFields), NULL};

pcp_status_t pcp_roles_connect_parse(const char* value, char** inout_host,
                                     int64_t* inout_port) {
  const char* host = value;
  size_t host_length = strlen(value);
  const char* port_text = NULL;
  if (value[0] == '[') {
    // [v6addr]:port, so the colons inside the address are not separators.
    const char* close = strchr(value, ']');
    if (!close) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "flag '--connect': missing ']' in '%s'", value);
    }
    host = value + 1;
    host_length = (size_t)(close - host);
    if (close[1] == ':') {
      port_text = close + 2;
    } else if (close[1] != 0) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "flag '--connect': expected HOST:PORT, got '%s'",
                             value);
    }
  } else {
    const char* colon = strrchr(value, ':');
    if (colon) {
      host_length = (size_t)(colon - value);
      port_text = colon + 1;
    }
  }
  if (host_length == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "flag '--connect': no host in '%s'", value);
  }
  int64_t port = *inout_port;
  if (port_text) {
    // Upstream fell back to 8080 on a bad port; a typo should not send a
    // worker to a different gateway port.
    if (!(port_text[0] >= '0' && port_text[0] <= '9') ||
        !pcp_string_view_parse_int64(pcp_make_cstring_view(port_text), &port) ||
        port < 1 || port > 65535) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "flag '--connect': port '%s' is not in "
                             "[1, 65535]",
                             port_text);
    }
  }
  // Config strings live in the system allocator (src/config).
  char* copy = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
      pcp_allocator_system(), host_length + 1, (void**)&copy));
  memcpy(copy, host, host_length);
  copy[host_length] = 0;
  pcp_allocator_free(pcp_allocator_system(), *inout_host);
  *inout_host = copy;
  *inout_port = port;
  return pcp_ok_status();
}

static pcp_status_t prepare(void* opaque) {
  T* config = opaque;
  if (config->connect) {
    // --connect wins over --host/--port wherever it appears: it is the
    // one-flag form, and its order relative to them carries no intent.
    PCP_RETURN_IF_ERROR_BARE(
        pcp_roles_connect_parse(config->connect, &config->host, &config->port));
  }
  if (config->target && !config->target[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "flag '--target': value is empty");
  }
  if (config->worker_class && config->worker_class[0] &&
      !pcp_sched_class_name_is_valid(config->worker_class)) {
    // The gateway would reject the JOIN; say why before connecting.
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "flag '--worker-class': '%s' is not 1..%d bytes "
                           "of [A-Za-z0-9._-]",
                           config->worker_class,
                           PCP_SCHED_CLASS_NAME_MAX_LENGTH);
  }
  if (config->metrics_listen) {
    // A usage error at start, not a failed worker later.
    char host[PCP_NET_MAX_HOST_LENGTH + 1];
    uint16_t port = 0;
    PCP_RETURN_IF_ERROR_BARE(pcp_roles_worker_metrics_listen_parse(
        config->metrics_listen, host, sizeof(host), &port));
  }
  return pcp_roles_worker_id_build(
      pcp_roles_backend_name(config->backend), config->target,
      config->device_id, pcp_roles_getenv_process, NULL, &config->worker_id);
}

typedef struct effective_t {
  const char* worker_id;
  const char* backend;
  const char* host;
  int64_t port;
} effective_t;

static const pcp_config_field_t kEffectiveFields[] = {
    {.name = "worker-id",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(effective_t, worker_id)},
    {.name = "backend",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(effective_t, backend)},
    {.name = "host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(effective_t, host)},
    {.name = "port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(effective_t, port)},
};
static const pcp_config_table_t kEffectiveTable = {
    "worker (effective)", kEffectiveFields, PCP_ARRAYSIZE(kEffectiveFields),
    NULL};

static void dump(const void* opaque, FILE* out) {
  const T* config = opaque;
  effective_t effective = {config->worker_id,
                           pcp_roles_backend_name(config->backend),
                           config->host, config->port};
  pcp_config_section_t sections[] = {
      {"flags", &pcp_roles_worker_table, config},
      {"effective", &kEffectiveTable, &effective},
  };
  pcp_config_dump_json_sections(sections, PCP_ARRAYSIZE(sections), out);
}

static int run(void* opaque) {
  return pcp_roles_worker_runtime_run(opaque);
}

static void cleanup(void* opaque) {
  T* config = opaque;
  pcp_allocator_free(pcp_allocator_system(), config->worker_id);
  config->worker_id = NULL;
}

const pcp_roles_def_t pcp_roles_worker_def = {
    .role = PCP_ROLES_ROLE_WORKER,
    .flag = "--worker",
    .usage =
        "pcp --worker [--connect HOST:PORT] [flags]\n\n"
        "Runs one device worker that joins a gateway's worker fabric.",
    .table = &pcp_roles_worker_table,
    .config_size = sizeof(T),
    .prepare = prepare,
    .dump = dump,
    .run = run,
    .cleanup = cleanup,
};
