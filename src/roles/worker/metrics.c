// SPDX-License-Identifier: Apache-2.0
// The worker's /metrics (--metrics-listen): device memory, tasks, fabric
// bytes and program cache lookups, labelled backend, target and worker.

#include <stdlib.h>
#include <string.h>

#include "http/http.h"
#include "net/net.h"
#include "roles/worker/worker_impl.h"

static const char* const kLabels[] = {"backend", "target", "worker", NULL};
static const char* const kOutcomeLabels[] = {"backend", "target", "worker",
                                             "outcome", NULL};

enum {
  W_DEVICE_MEMORY = 0,
  W_DEVICE_MEMORY_PEAK,
  W_SESSION_BYTES,
  W_TASKS,
  W_RECEIVED,
  W_SENT,
  W_CACHE_HITS,
  W_CACHE_MISSES,
  W_COUNT_,
};

static const pcp_obs_metric_def_t kWorkerMetrics[W_COUNT_] = {
    [W_DEVICE_MEMORY] = {.name = "pcp_worker_device_memory_bytes",
                         .type = PCP_OBS_METRIC_TYPE_GAUGE,
                         .help = "Device memory the IREE allocator holds now "
                                 "(after the last task)",
                         .label_names = kLabels},
    [W_DEVICE_MEMORY_PEAK] = {.name = "pcp_worker_device_memory_peak_bytes",
                              .type = PCP_OBS_METRIC_TYPE_GAUGE,
                              .help = "Most device memory the IREE allocator "
                                      "held at once so far",
                              .label_names = kLabels},
    [W_SESSION_BYTES] = {.name = "pcp_worker_session_bytes",
                         .type = PCP_OBS_METRIC_TYPE_GAUGE,
                         .help = "Bytes of resident session tensors "
                                 "(weights, optimizer state, KV caches)",
                         .label_names = kLabels},
    [W_TASKS] = {.name = "pcp_worker_tasks_total",
                 .type = PCP_OBS_METRIC_TYPE_COUNTER,
                 .help = "Fabric tasks run by this worker, by outcome "
                         "(succeeded, failed)",
                 .label_names = kOutcomeLabels},
    [W_RECEIVED] = {.name = "pcp_worker_received_bytes_total",
                    .type = PCP_OBS_METRIC_TYPE_COUNTER,
                    .help = "Bytes received from the gateway's fabric",
                    .label_names = kLabels},
    [W_SENT] = {.name = "pcp_worker_sent_bytes_total",
                .type = PCP_OBS_METRIC_TYPE_COUNTER,
                .help = "Bytes handed to the kernel for the gateway's fabric",
                .label_names = kLabels},
    [W_CACHE_HITS] = {.name = "pcp_worker_program_cache_hits_total",
                      .type = PCP_OBS_METRIC_TYPE_COUNTER,
                      .help = "Program offers answered from the on-disk "
                              "program cache",
                      .label_names = kLabels},
    [W_CACHE_MISSES] = {.name = "pcp_worker_program_cache_misses_total",
                        .type = PCP_OBS_METRIC_TYPE_COUNTER,
                        .help = "Program offers the worker had to fetch",
                        .label_names = kLabels},
};

void pcp_roles_worker_metrics_add(pcp_obs_series_t* series, double delta) {
  if (series) {
    pcp_obs_counter_add(series, delta);
  }
}

void pcp_roles_worker_metrics_set(pcp_obs_series_t* series, double value) {
  if (series) {
    pcp_obs_gauge_set(series, value);
  }
}

pcp_status_t pcp_roles_worker_metrics_initialize(
    const char* backend, const char* target, const char* worker_id,
    pcp_roles_worker_metrics_t* out_metrics) {
  memset(out_metrics, 0, sizeof(*out_metrics));
  pcp_roles_worker_metrics_t* m = out_metrics;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_obs_registry_create(pcp_allocator_system(), &m->registry));
  pcp_obs_family_t* f[W_COUNT_];
  pcp_status_t status =
      pcp_obs_registry_register(m->registry, kWorkerMetrics, W_COUNT_, f);
  if (!status) {
    status = pcp_roles_process_metrics_register(m->registry, "worker");
  }
  const char* labels[] = {backend, target && target[0] ? target : "default",
                          worker_id ? worker_id : "", NULL};
  struct {
    int family;
    const char* outcome;
    pcp_obs_series_t** out;
  } bindings[] = {
      {W_DEVICE_MEMORY, NULL, &m->device_memory},
      {W_DEVICE_MEMORY_PEAK, NULL, &m->device_memory_peak},
      {W_SESSION_BYTES, NULL, &m->session_bytes},
      {W_TASKS, "succeeded", &m->tasks_succeeded},
      {W_TASKS, "failed", &m->tasks_failed},
      {W_RECEIVED, NULL, &m->received_bytes},
      {W_SENT, NULL, &m->sent_bytes},
      {W_CACHE_HITS, NULL, &m->cache_hits},
      {W_CACHE_MISSES, NULL, &m->cache_misses},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(bindings) && !status; ++i) {
    labels[3] = bindings[i].outcome;
    status = pcp_obs_family_series_get(f[bindings[i].family], labels,
                                       bindings[i].out);
  }
  if (status) {
    pcp_roles_worker_metrics_deinitialize(m);
  }
  return status;
}

pcp_status_t pcp_roles_worker_metrics_listen_parse(const char* value,
                                                   char* host,
                                                   size_t host_capacity,
                                                   uint16_t* out_port) {
  *out_port = 0;
  host[0] = 0;
  const char* h = value;
  const char* colon = strrchr(value, ':');
  size_t host_length = colon ? (size_t)(colon - value) : 0;
  if (value[0] == '[') {
    // [v6addr]:port: the address's own colons are not the separator.
    const char* close = strchr(value, ']');
    colon = close && close[1] == ':' ? close + 1 : NULL;
    h = value + 1;
    host_length = close ? (size_t)(close - h) : 0;
  }
  if (!colon || host_length == 0 || host_length >= host_capacity) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "flag '--metrics-listen': expected HOST:PORT (or "
                           "[V6]:PORT), got '%s'",
                           value);
  }
  int64_t port = 0;
  const char* port_text = colon + 1;
  if (!(port_text[0] >= '0' && port_text[0] <= '9') ||
      !pcp_string_view_parse_int64(pcp_make_cstring_view(port_text), &port) ||
      port < 1 || port > 65535) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "flag '--metrics-listen': port '%s' is not in "
                           "[1, 65535]",
                           port_text);
  }
  memcpy(host, h, host_length);
  host[host_length] = 0;
  *out_port = (uint16_t)port;
  return pcp_ok_status();
}

pcp_status_t pcp_roles_worker_metrics_listen(
    pcp_roles_worker_metrics_t* metrics, const char* listen,
    uint16_t* out_port) {
  *out_port = 0;
  char host[PCP_NET_MAX_HOST_LENGTH + 1];
  uint16_t port = 0;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_roles_worker_metrics_listen_parse(listen, host, sizeof(host), &port));
  pcp_http_server_options_t options = {
      .name = "worker-metrics",
      .host = host,
      .port = port,
      .registry = metrics->registry,
  };
  pcp_http_server_t* server = NULL;
  pcp_status_t status =
      pcp_http_server_create(&options, pcp_allocator_system(), &server);
  if (!status) {
    status = pcp_http_server_probes_add(server, metrics->registry, NULL);
  }
  if (!status) {
    status = pcp_http_server_start(server);
  }
  if (status) {
    pcp_http_server_release(server);
    return pcp_status_annotate_f(status, "flag '--metrics-listen' %s", listen);
  }
  metrics->server = server;
  *out_port = pcp_http_server_port(server);
  return pcp_ok_status();
}

void pcp_roles_worker_metrics_deinitialize(
    pcp_roles_worker_metrics_t* metrics) {
  if (metrics->server) {
    pcp_http_server_t* server = metrics->server;
    pcp_status_ignore(pcp_http_server_stop(server, 1000));
    pcp_http_server_release(server);
  }
  pcp_obs_registry_release(metrics->registry);
  memset(metrics, 0, sizeof(*metrics));
}
