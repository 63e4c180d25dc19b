// SPDX-License-Identifier: Apache-2.0
// --node-manager: supervises --scale workers, one per device slot, on a
// libuv loop (runner.c, nginx's master model), and serves /healthz, /readyz
// and /metrics on --api-host:--api-port.
//
// Departure from upstream (docs/decisions.md): the node manager supervises
// the workers itself instead of spawning one `pcp --supervise` process per
// slot. One policy instance then sees every exit, so restart counts and
// readiness are known where /readyz and /metrics are served, and there is
// no second restart policy underneath that would reset the crash-loop
// count each time the outer one restarted a supervisor. Each slot still
// has a supervisor id (passed to its worker as --supervisor-id).

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http/http.h"
#include "obs/obs.h"
#include "roles/nodemgr/supervision_impl.h"
#include "roles/roles_impl.h"
#include "sched/sched.h"

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
     // Not the gateway's 8000 (API) or 8080 (fabric): a node manager next
     // to a gateway on one host starts with the defaults of both.
     .default_value = "8002",
     .min = 0,
     .max = 65535,
     .value_name = "PORT",
     .help = "probe server bind port (0: any free port, logged)"},
    // The upstream names read as the gateway's address, which they never
    // were: refused with "renamed to --api-*".
    {.name = "gateway-host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, api_host),
     .flags = PCP_CONFIG_FLAG_RENAMED},
    {.name = "gateway-port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, api_port),
     .flags = PCP_CONFIG_FLAG_RENAMED},
    {.name = "worker-metrics-port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, worker_metrics_port),
     .default_value = "0",
     .min = 0,
     .max = 65535,
     .value_name = "PORT",
     .help = "serve each worker's /metrics on --api-host, slot i on PORT+i "
             "(0: workers serve none)"},
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
    {.name = "worker-class",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(T, worker_class),
     .value_name = "CLASS",
     .help = "scheduling class every worker reports at join "
             "(--worker-class of each child)"},
    {.name = "start-stagger-ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, start_stagger_ms),
     .default_value = "200",
     .min = 0,
     .max = 60000,
     .value_name = "MS",
     .help = "delay between the first starts of consecutive slots"},
    PCP_ROLES_POLICY_FIELDS(T),
    {.name = "http-header-timeout-ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, http_header_timeout_ms),
     .default_value = "10000",
     .min = 100,
     .max = 600000,
     .value_name = "MS",
     .help = "probe server: time a connection has to send its request "
             "headers"},
    {.name = "http-max-connections-per-client",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(T, http_max_connections_per_client),
     .default_value = "256",
     .min = 1,
     .max = 1000000,
     .value_name = "N",
     .help = "probe server: open connections of one client address"},
};

const pcp_config_table_t pcp_roles_nodemgr_table = {
    "node-manager", kFields, PCP_ARRAYSIZE(kFields), NULL};

//===----------------------------------------------------------------------===//
// Metrics (reference/upstream-control-plane.md s.3.6 names, plus per-slot
// restarts and states)
//===----------------------------------------------------------------------===//

// One label vocabulary with the fabric and the workers: `target`, "default"
// when no --target is given (upstream's s.3.6 calls it target_arch).
static const char* const kLabels[] = {"backend", "target", NULL};
static const char* const kStateLabels[] = {"backend", "target", "state", NULL};
static const char* const kSlotLabels[] = {"backend", "target", "slot", NULL};

enum {
  METRIC_INFO,
  METRIC_EXPECTED,
  METRIC_LAUNCHED,
  METRIC_RUNNING,
  METRIC_READY,
  METRIC_SLOTS,
  METRIC_RESTARTS,
  METRIC_COUNT,
};

static const pcp_obs_metric_def_t kMetrics[METRIC_COUNT] = {
    [METRIC_INFO] = {.name = "pcp_node_manager_info",
                     .type = PCP_OBS_METRIC_TYPE_GAUGE,
                     .help = "Node manager present (always 1), with its "
                             "backend and target architecture",
                     .label_names = kLabels},
    [METRIC_EXPECTED] = {.name = "pcp_node_manager_expected_supervisors",
                         .type = PCP_OBS_METRIC_TYPE_GAUGE,
                         .help = "Worker slots configured (--scale)",
                         .label_names = kLabels},
    [METRIC_LAUNCHED] = {.name = "pcp_node_manager_launched_supervisors",
                         .type = PCP_OBS_METRIC_TYPE_GAUGE,
                         .help = "Slots whose worker has been started at "
                                 "least once",
                         .label_names = kLabels},
    [METRIC_RUNNING] = {.name = "pcp_node_manager_running_supervisors",
                        .type = PCP_OBS_METRIC_TYPE_GAUGE,
                        .help = "Slots whose worker has been up for at least "
                                "--running-after-ms",
                        .label_names = kLabels},
    [METRIC_READY] = {.name = "pcp_node_manager_ready",
                      .type = PCP_OBS_METRIC_TYPE_GAUGE,
                      .help = "1 when every slot is running and no stop has "
                              "begun",
                      .label_names = kLabels},
    [METRIC_SLOTS] = {.name = "pcp_node_manager_slots",
                      .type = PCP_OBS_METRIC_TYPE_GAUGE,
                      .help = "Slots per supervision state",
                      .label_names = kStateLabels},
    [METRIC_RESTARTS] = {.name = "pcp_node_manager_supervisor_restarts_total",
                         .type = PCP_OBS_METRIC_TYPE_COUNTER,
                         .help = "Worker restarts per slot",
                         .label_names = kSlotLabels,
                         .max_series = PCP_ROLES_SUPERVISION_MAX_SLOTS + 1},
};

//===----------------------------------------------------------------------===//
// The running node manager
//===----------------------------------------------------------------------===//

// What the probe threads see: copied from the policy on the loop thread
// after every change, under |mutex|.
typedef struct slot_snapshot_t {
  pcp_roles_slot_state_t state;
  int64_t pid;
  uint64_t restart_count;
  uint64_t exit_count;
  bool launched;
  bool last_spawn_failed;
  int64_t last_exit_status;
  int32_t last_term_signal;
  int64_t restart_in_ms;  // BACKING_OFF: from publish time
} slot_snapshot_t;

typedef struct nodemgr_t {
  // Every allocation of the node manager's own (slots, argument vectors).
  pcp_allocator_t allocator;
  const T* config;
  const char* backend;
  const char* target_arch;  // "default" when --target is not given
  int64_t supervisor_id_base;
  uint32_t slot_count;
  pthread_mutex_t mutex;
  bool stopping;
  slot_snapshot_t* slots;
  pcp_obs_registry_t* registry;
  pcp_obs_family_t* families[METRIC_COUNT];
  pcp_obs_series_t** restart_series;  // one per slot
  uint64_t* restarts_published;       // loop thread only
} nodemgr_t;

static const char* const kAllStates[] = {
    "pending", "starting", "running", "backing_off",
    "failed",  "stopping", "stopped",
};

static void publish(void* user_data, const pcp_roles_runner_t* runner) {
  nodemgr_t* nm = user_data;
  const pcp_roles_supervision_t* sup = pcp_roles_runner_supervision(runner);
  const char* labels[] = {nm->backend, nm->target_arch};
  uint32_t launched = 0, running = 0;
  uint32_t per_state[PCP_ARRAYSIZE(kAllStates)] = {0};
  pthread_mutex_lock(&nm->mutex);
  nm->stopping = pcp_roles_supervision_is_stopping(sup);
  for (uint32_t i = 0; i < nm->slot_count; ++i) {
    const pcp_roles_slot_t* slot = pcp_roles_supervision_slot(sup, i);
    slot_snapshot_t* snap = &nm->slots[i];
    snap->state = slot->state;
    snap->pid = pcp_roles_runner_slot_pid(runner, i);
    snap->restart_count = slot->restart_count;
    snap->exit_count = slot->exit_count;
    snap->launched = slot->start_count > 0;
    snap->last_spawn_failed = slot->last_spawn_failed;
    snap->last_exit_status = slot->last_exit_status;
    snap->last_term_signal = slot->last_term_signal;
    snap->restart_in_ms = slot->last_delay_ms;
    launched += snap->launched;
    running += slot->state == PCP_ROLES_SLOT_STATE_RUNNING;
    ++per_state[slot->state];
  }
  pthread_mutex_unlock(&nm->mutex);
  pcp_obs_family_set(nm->families[METRIC_LAUNCHED], labels, launched);
  pcp_obs_family_set(nm->families[METRIC_RUNNING], labels, running);
  pcp_obs_family_set(nm->families[METRIC_READY], labels,
                     pcp_roles_supervision_is_ready(sup) ? 1 : 0);
  for (size_t s = 0; s < PCP_ARRAYSIZE(kAllStates); ++s) {
    const char* state_labels[] = {nm->backend, nm->target_arch, kAllStates[s]};
    pcp_obs_family_set(nm->families[METRIC_SLOTS], state_labels, per_state[s]);
  }
  for (uint32_t i = 0; i < nm->slot_count; ++i) {
    uint64_t restarts = pcp_roles_supervision_slot(sup, i)->restart_count;
    if (restarts > nm->restarts_published[i]) {
      pcp_obs_counter_add(nm->restart_series[i],
                          (double)(restarts - nm->restarts_published[i]));
      nm->restarts_published[i] = restarts;
    }
  }
}

// Why a slot is not running, for /readyz.
static void slot_reason(const nodemgr_t* nm, const slot_snapshot_t* snap,
                        char* buffer, size_t capacity) {
  char last[64];
  if (snap->last_spawn_failed) {
    snprintf(last, sizeof(last), "its last start failed");
  } else if (snap->last_term_signal) {
    snprintf(last, sizeof(last), "it was killed by signal %d",
             (int)snap->last_term_signal);
  } else {
    snprintf(last, sizeof(last), "it exited with status %" PRId64,
             snap->last_exit_status);
  }
  switch (snap->state) {
    case PCP_ROLES_SLOT_STATE_PENDING:
      snprintf(buffer, capacity, "not started yet (staggered start)");
      break;
    case PCP_ROLES_SLOT_STATE_STARTING:
      snprintf(buffer, capacity, "started, up for less than %" PRId64 " ms",
               nm->config->policy.running_after_ms);
      break;
    case PCP_ROLES_SLOT_STATE_BACKING_OFF:
      snprintf(buffer, capacity, "restarting within %" PRId64 " ms: %s",
               snap->restart_in_ms, last);
      break;
    case PCP_ROLES_SLOT_STATE_FAILED:
      snprintf(buffer, capacity,
               "failed: crash loop (%" PRId64 " exits within %" PRId64
               " ms), not restarted; %s; SIGHUP retries",
               nm->config->policy.crash_loop_restarts + 1,
               nm->config->policy.crash_loop_window_ms, last);
      break;
    case PCP_ROLES_SLOT_STATE_STOPPING:
    case PCP_ROLES_SLOT_STATE_STOPPED:
      snprintf(buffer, capacity, "the node manager is stopping");
      break;
    case PCP_ROLES_SLOT_STATE_RUNNING:
      buffer[0] = 0;
      break;
  }
}

static bool ready_fn(void* user_data, json_t* details) {
  nodemgr_t* nm = user_data;
  json_t* slots = json_array();
  json_t* not_ready = json_array();
  uint32_t launched = 0, running = 0;
  bool stopping;
  pthread_mutex_lock(&nm->mutex);
  stopping = nm->stopping;
  for (uint32_t i = 0; i < nm->slot_count; ++i) {
    const slot_snapshot_t* snap = &nm->slots[i];
    launched += snap->launched;
    running += snap->state == PCP_ROLES_SLOT_STATE_RUNNING;
    json_t* entry = json_pack(
        "{s:I, s:I, s:I, s:s, s:I, s:I}", "slot", (json_int_t)i, "device_id",
        (json_int_t)i, "supervisor_id",
        (json_int_t)nm->supervisor_id_base + (json_int_t)i, "state",
        pcp_roles_slot_state_name(snap->state), "restarts",
        (json_int_t)snap->restart_count, "exits", (json_int_t)snap->exit_count);
    if (entry) {
      json_object_set_new(
          entry, "pid", snap->pid >= 0 ? json_integer(snap->pid) : json_null());
      json_array_append_new(slots, entry);
    }
    if (snap->state != PCP_ROLES_SLOT_STATE_RUNNING) {
      char reason[256];
      slot_reason(nm, snap, reason, sizeof(reason));
      json_array_append_new(
          not_ready,
          json_pack("{s:I, s:s, s:s}", "slot", (json_int_t)i, "state",
                    pcp_roles_slot_state_name(snap->state), "reason", reason));
    }
  }
  pthread_mutex_unlock(&nm->mutex);
  bool ready = !stopping && running == nm->slot_count;
  json_object_set_new(details, "mode", json_string("node-manager"));
  json_object_set_new(details, "stopping", json_boolean(stopping));
  json_object_set_new(details, "expected_supervisors",
                      json_integer(nm->slot_count));
  json_object_set_new(details, "launched_supervisors", json_integer(launched));
  json_object_set_new(details, "running_supervisors", json_integer(running));
  json_object_set_new(details, "not_ready", not_ready);
  json_object_set_new(details, "slots", slots);
  return ready;
}

static pcp_status_t metrics_register(nodemgr_t* nm) {
  PCP_RETURN_IF_ERROR_BARE(
      pcp_obs_registry_create(pcp_allocator_system(), &nm->registry));
  PCP_RETURN_IF_ERROR_BARE(pcp_obs_registry_register(
      nm->registry, kMetrics, METRIC_COUNT, nm->families));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_roles_process_metrics_register(nm->registry, "node-manager"));
  const char* labels[] = {nm->backend, nm->target_arch};
  pcp_obs_family_set(nm->families[METRIC_INFO], labels, 1);
  pcp_obs_family_set(nm->families[METRIC_EXPECTED], labels, nm->slot_count);
  for (uint32_t i = 0; i < nm->slot_count; ++i) {
    char slot_text[16];
    snprintf(slot_text, sizeof(slot_text), "%" PRIu32, i);
    const char* slot_labels[] = {nm->backend, nm->target_arch, slot_text};
    // Created at 0 so every slot has a series before its first restart.
    PCP_RETURN_IF_ERROR_BARE(pcp_obs_family_series_get(
        nm->families[METRIC_RESTARTS], slot_labels, &nm->restart_series[i]));
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Worker command lines
//===----------------------------------------------------------------------===//

// The argv of every slot: one allocation of pointers per slot, strings
// owned by |strings|.
typedef struct slot_args_t {
  pcp_string_list_t strings;
  const char*** args;  // [slot_count] NULL-terminated arrays
} slot_args_t;

static void slot_args_deinitialize(pcp_allocator_t allocator, slot_args_t* sa,
                                   uint32_t slot_count) {
  if (sa->args) {
    for (uint32_t i = 0; i < slot_count; ++i) {
      pcp_allocator_free(allocator, (void*)sa->args[i]);
    }
    pcp_allocator_free(allocator, (void*)sa->args);
  }
  pcp_string_list_deinitialize(&sa->strings);
}

enum { MAX_WORKER_ARGS = 20 };

// `EXE --worker --connect H:P --backend B --device-id I [--target T]
//  [--worker-class C] --supervisor-id ID --drain-timeout-ms D`, as upstream's
//  node manager
// builds for its supervisors' children, plus a drain that ends within our
// stop grace period.
static pcp_status_t slot_args_build(const nodemgr_t* nm, const char* exe,
                                    slot_args_t* sa) {
  const T* config = nm->config;
  char connect[PCP_NET_ADDRESS_TEXT_CAPACITY + 8];
  // Brackets for an IPv6 literal, so the worker splits host and port at
  // the right colon.
  bool v6 = strchr(config->host, ':') != NULL;
  bool v6_api = strchr(config->api_host, ':') != NULL;
  snprintf(connect, sizeof(connect), "%s%s%s:%lld", v6 ? "[" : "", config->host,
           v6 ? "]" : "", (long long)config->port);
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      nm->allocator, nm->slot_count * sizeof(*sa->args), (void**)&sa->args));
  // Collect every string first: the list may move its storage as it grows,
  // so the pointers are taken after.
  size_t per_slot = 0;
  for (uint32_t i = 0; i < nm->slot_count; ++i) {
    char device[24], id[24], drain[24];
    snprintf(device, sizeof(device), "%" PRIu32, i);
    snprintf(drain, sizeof(drain), "%" PRId64,
             pcp_roles_worker_drain_timeout_ms(config->policy.stop_grace_ms));
    snprintf(id, sizeof(id), "%" PRId64, nm->supervisor_id_base + i);
    const char* argv[MAX_WORKER_ARGS];
    size_t n = 0;
    argv[n++] = exe;
    argv[n++] = "--worker";
    argv[n++] = "--connect";
    argv[n++] = connect;
    argv[n++] = "--backend";
    argv[n++] = nm->backend;
    argv[n++] = "--device-id";
    argv[n++] = device;
    if (config->target) {
      argv[n++] = "--target";
      argv[n++] = config->target;
    }
    if (config->worker_class && config->worker_class[0]) {
      argv[n++] = "--worker-class";
      argv[n++] = config->worker_class;
    }
    argv[n++] = "--supervisor-id";
    argv[n++] = id;
    argv[n++] = "--drain-timeout-ms";
    argv[n++] = drain;
    char metrics[PCP_NET_ADDRESS_TEXT_CAPACITY + 8];
    if (config->worker_metrics_port > 0) {
      snprintf(metrics, sizeof(metrics), "%s%s%s:%lld", v6_api ? "[" : "",
               config->api_host, v6_api ? "]" : "",
               (long long)(config->worker_metrics_port + i));
      argv[n++] = "--metrics-listen";
      argv[n++] = metrics;
    }
    per_slot = n;
    for (size_t k = 0; k < n; ++k) {
      PCP_RETURN_IF_ERROR_BARE(pcp_string_list_append(&sa->strings, argv[k]));
    }
  }
  for (uint32_t i = 0; i < nm->slot_count; ++i) {
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
        nm->allocator, (per_slot + 1) * sizeof(char*), (void**)&sa->args[i]));
    for (size_t k = 0; k < per_slot; ++k) {
      sa->args[i][k] = sa->strings.items[i * per_slot + k];
    }
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Role
//===----------------------------------------------------------------------===//

static pcp_status_t prepare(void* opaque) {
  T* config = opaque;
  if (config->target && !config->target[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "flag '--target': value is empty");
  }
  if (config->worker_class && config->worker_class[0] &&
      !pcp_sched_class_name_is_valid(config->worker_class)) {
    // Every child would exit with the same usage error, in a restart loop.
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "flag '--worker-class': '%s' is not 1..%d bytes "
                           "of [A-Za-z0-9._-]",
                           config->worker_class,
                           PCP_SCHED_CLASS_NAME_MAX_LENGTH);
  }
  if (config->worker_metrics_port > 0 &&
      config->worker_metrics_port + config->scale - 1 > 65535) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "flag '--worker-metrics-port': %lld + --scale %lld "
                           "goes past port 65535",
                           (long long)config->worker_metrics_port,
                           (long long)config->scale);
  }
  pcp_roles_supervision_options_t options;
  PCP_RETURN_IF_ERROR_BARE(pcp_roles_policy_flags_to_options(
      &config->policy, (uint32_t)config->scale, config->start_stagger_ms,
      &options));
  if (config->policy.worker_exe &&
      access(config->policy.worker_exe, X_OK) != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "flag '--worker-exe': '%s' is not an executable "
                           "file",
                           config->policy.worker_exe);
  }
  return pcp_ok_status();
}

// Runs the node manager; returns the exit code.
static int nodemgr_run(nodemgr_t* nm, pcp_rng_t* rng) {
  const T* config = nm->config;
  pcp_log_context_t log_context = {.role = "node-manager"};
  char self_exe[4096];
  const char* exe = config->policy.worker_exe;
  pcp_status_t status = pcp_ok_status();
  if (!exe) {
    status = pcp_roles_self_exe(self_exe, sizeof(self_exe));
    exe = self_exe;
  }
  slot_args_t slot_args = {0};
  if (!status) {
    status = slot_args_build(nm, exe, &slot_args);
  }
  pcp_roles_runner_options_t runner_options = {
      .role = "node-manager",
      .seed = pcp_rng_next_u64(rng),
      .slot_args = (const char* const* const*)slot_args.args,
      .publish = publish,
      .user_data = nm,
  };
  if (!status) {
    status = pcp_roles_policy_flags_to_options(&config->policy, nm->slot_count,
                                               config->start_stagger_ms,
                                               &runner_options.policy);
  }
  if (!status) {
    status = metrics_register(nm);
  }
  pcp_http_server_t* server = NULL;
  pcp_http_readyz_t readyz = {ready_fn, nm};
  if (!status) {
    // Probes are tiny and rare: two threads, upstream's 64 KiB body cap.
    pcp_http_server_options_t http_options = {
        .name = "node-manager",
        .host = config->api_host,
        .port = (uint16_t)config->api_port,
        .max_body_bytes = 64u << 10,
        .thread_count = 2,
        .header_timeout_ms = (uint32_t)config->http_header_timeout_ms,
        .max_connections_per_client =
            (uint32_t)config->http_max_connections_per_client,
        .registry = nm->registry,
    };
    status =
        pcp_http_server_create(&http_options, pcp_allocator_system(), &server);
  }
  if (!status) {
    // Any method, as upstream's probe server.
    const pcp_http_route_t routes[] = {
        {.method = "*",
         .pattern = "/healthz",
         .handler = pcp_http_healthz_handler},
        {.method = "*",
         .pattern = "/readyz",
         .handler = pcp_http_readyz_handler,
         .user_data = &readyz},
        {.method = "*",
         .pattern = "/metrics",
         .handler = pcp_http_metrics_handler,
         .user_data = nm->registry},
    };
    status = pcp_http_server_routes_add(server, routes, PCP_ARRAYSIZE(routes));
  }
  if (!status) {
    status = pcp_http_server_start(server);
  }
  if (!status) {
    char port[16], api_port[16], scale[16], base[24];
    snprintf(port, sizeof(port), "%lld", (long long)config->port);
    snprintf(api_port, sizeof(api_port), "%u",
             (unsigned)pcp_http_server_port(server));
    snprintf(scale, sizeof(scale), "%lld", (long long)config->scale);
    snprintf(base, sizeof(base), "%" PRId64, nm->supervisor_id_base);
    const char* pairs[] = {
        "host",
        config->host,
        "port",
        port,
        "api_host",
        config->api_host,
        "api_port",
        api_port,
        "scale",
        scale,
        "backend",
        nm->backend,
        "target",
        config->target,
        "worker_exe",
        exe,
        "supervisor_id_base",
        base,
    };
    runner_options.started_pairs = pairs;
    runner_options.started_pair_count = PCP_ARRAYSIZE(pairs) / 2;
    status = pcp_roles_runner_run(&runner_options);
    pcp_roles_log_event("node-manager", "stopped", NULL, 0);
  }
  int exit_code = 0;
  if (status) {
    pcp_log_status(PCP_LOG_ERROR, &log_context, status, "node manager failed");
    pcp_status_ignore(status);
    exit_code = 1;
  }
  if (server) {
    pcp_status_ignore(pcp_http_server_stop(server, 1000));
    pcp_http_server_release(server);
  }
  slot_args_deinitialize(nm->allocator, &slot_args, nm->slot_count);
  return exit_code;
}

static int run(void* opaque) {
  T* config = opaque;
  nodemgr_t nm;
  memset(&nm, 0, sizeof(nm));
  nm.config = config;
  nm.backend = pcp_roles_backend_name(config->backend);
  nm.target_arch = config->target ? config->target : "default";
  nm.slot_count = (uint32_t)config->scale;
  pcp_rng_t rng;
  pcp_rng_initialize((uint64_t)pcp_clock_wall_ns(pcp_clock_system()) ^
                         ((uint64_t)getpid() << 32),
                     &rng);
  // Slot i's supervisor id is base + i with base a random multiple of 1024
  // below 2^53 (JSON-safe): stable across the worker's restarts, distinct
  // across slots and, with high probability, across node managers (upstream
  // seeded its ids with unix seconds, so supervisors started in the same
  // second collided).
  nm.supervisor_id_base = (int64_t)pcp_rng_next_below(&rng, UINT64_C(1) << 43)
                          << 10;
  pthread_mutex_init(&nm.mutex, NULL);
  nm.allocator = pcp_allocator_system();
  pcp_status_t status = pcp_allocator_calloc(
      nm.allocator, nm.slot_count * sizeof(*nm.slots), (void**)&nm.slots);
  if (!status) {
    status = pcp_allocator_calloc(nm.allocator,
                                  nm.slot_count * sizeof(pcp_obs_series_t*),
                                  (void**)&nm.restart_series);
  }
  if (!status) {
    status = pcp_allocator_calloc(
        nm.allocator, nm.slot_count * sizeof(*nm.restarts_published),
        (void**)&nm.restarts_published);
  }
  pcp_status_ignore(status);  // exit code 1, as before
  int exit_code = 1;
  if (nm.slots && nm.restart_series && nm.restarts_published) {
    for (uint32_t i = 0; i < nm.slot_count; ++i) {
      nm.slots[i].pid = -1;
    }
    exit_code = nodemgr_run(&nm, &rng);
  }
  pcp_obs_registry_release(nm.registry);
  pcp_allocator_free(nm.allocator, nm.slots);
  pcp_allocator_free(nm.allocator, nm.restart_series);
  pcp_allocator_free(nm.allocator, nm.restarts_published);
  pthread_mutex_destroy(&nm.mutex);
  return exit_code;
}

const pcp_roles_def_t pcp_roles_nodemgr_def = {
    .role = PCP_ROLES_ROLE_NODE_MANAGER,
    .flag = "--node-manager",
    .usage =
        "pcp --node-manager --scale N --host H --port P --backend B "
        "[--target T] [flags]\n\n"
        "Runs the node manager: one supervised worker per device slot "
        "(device ids 0..N-1),\nrestarted with backoff up to a crash-loop cap; "
        "probes on --api-host:--api-port.\nSIGTERM/SIGINT stop every worker "
        "and exit 0; SIGHUP retries failed slots.",
    .table = &pcp_roles_nodemgr_table,
    .config_size = sizeof(T),
    .prepare = prepare,
    .run = run,
};
