// SPDX-License-Identifier: Apache-2.0
//
// Metrics (the registry families and series), the handling-latency
// histogram, the workers gauge and the endpoint stats.

#include "fabric/fabric_impl.h"

static const char* const k_worker_labels[] = {"state", "backend", "target",
                                              NULL};

static const char* const k_frame_labels[] = {"direction", "type", NULL};

static const char* const k_outcome_labels[] = {"outcome", NULL};

const pcp_obs_metric_def_t pcp_fabric_metric_defs[M_COUNT_] = {
    {.name = "pcp_fabric_workers",
     .type = PCP_OBS_METRIC_TYPE_GAUGE,
     .help = "Workers known to the fabric endpoint, by state, backend and "
             "target",
     .label_names = k_worker_labels},
    {.name = "pcp_fabric_connections",
     .type = PCP_OBS_METRIC_TYPE_GAUGE,
     .help = "Open fabric TCP connections, handshakes included"},
    {.name = "pcp_fabric_received_bytes_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Bytes received on fabric connections"},
    {.name = "pcp_fabric_sent_bytes_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Bytes handed to the kernel on fabric connections"},
    {.name = "pcp_fabric_frames_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Fabric frames by direction (in, out) and message type",
     .label_names = k_frame_labels},
    {.name = "pcp_fabric_heartbeat_age_seconds",
     .type = PCP_OBS_METRIC_TYPE_GAUGE,
     .help = "Time since the last byte from the most silent connected worker"},
    {.name = "pcp_fabric_evictions_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Workers evicted for silence past the heartbeat timeout"},
    {.name = "pcp_fabric_tasks_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Fabric tasks by outcome (succeeded, failed, cancelled, aborted)",
     .label_names = k_outcome_labels},
    {.name = "pcp_fabric_task_reruns_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Task runs started again after their worker was lost"},
    {.name = "pcp_fabric_rejected_joins_total",
     .type = PCP_OBS_METRIC_TYPE_COUNTER,
     .help = "Worker joins rejected (bad token, bad join, duplicate, full)"},
};

static pcp_obs_series_t* series_or_null(pcp_obs_family_t* family,
                                        const char* const* labels) {
  pcp_obs_series_t* series = NULL;
  pcp_status_t status = pcp_obs_family_series_get(family, labels, &series);
  if (status) {
    pcp_status_ignore(status);
    return NULL;
  }
  return series;
}

static const char* k_task_outcomes[4] = {"succeeded", "failed", "cancelled",
                                         "aborted"};

void pcp_fabric_metrics_bind(pcp_fabric_endpoint_t* ep) {
  ep->m_connections = series_or_null(ep->families[M_CONNECTIONS], NULL);
  ep->m_bytes_in = series_or_null(ep->families[M_BYTES_IN], NULL);
  ep->m_bytes_out = series_or_null(ep->families[M_BYTES_OUT], NULL);
  ep->m_heartbeat_age = series_or_null(ep->families[M_HEARTBEAT_AGE], NULL);
  ep->m_evictions = series_or_null(ep->families[M_EVICTIONS], NULL);
  ep->m_reassigned = series_or_null(ep->families[M_REASSIGNED], NULL);
  ep->m_rejected = series_or_null(ep->families[M_REJECTED], NULL);
  for (int i = 0; i < 4; ++i) {
    const char* labels[] = {k_task_outcomes[i]};
    ep->m_tasks[i] = series_or_null(ep->families[M_TASKS], labels);
  }
  static const char* const k_dirs[2] = {"in", "out"};
  for (int d = 0; d < 2; ++d) {
    for (uint16_t t = 1; t < FRAME_TYPE_SLOTS - 1; ++t) {
      const char* name = pcp_proto_message_type_name(t);
      if (!name)
        continue;
      const char* labels[] = {k_dirs[d], name};
      ep->m_frames[d][t] = series_or_null(ep->families[M_FRAMES], labels);
    }
    const char* labels[] = {k_dirs[d], "UNKNOWN"};
    ep->m_frames[d][FRAME_TYPE_SLOTS - 1] =
        series_or_null(ep->families[M_FRAMES], labels);
  }
}

void pcp_fabric_frame_count(pcp_fabric_endpoint_t* ep, int direction,
                            uint16_t type) {
  size_t slot = type < FRAME_TYPE_SLOTS - 1 && pcp_proto_message_type_name(type)
                    ? type
                    : FRAME_TYPE_SLOTS - 1;
  counter_add(ep->m_frames[direction][slot], 1);
  atomic_fetch_add_explicit(direction ? &ep->frames_out : &ep->frames_in, 1,
                            memory_order_relaxed);
}

void pcp_fabric_hist_record(pcp_fabric_endpoint_t* ep, int64_t value_ns) {
  uint64_t v = value_ns > 0 ? (uint64_t)value_ns : 0;
  size_t index;
  if (v < 16) {
    index = (size_t)v;
  } else {
    int msb = 63 - __builtin_clzll(v);
    index = (size_t)(msb - 3) * 16 + (size_t)((v >> (msb - 4)) & 15);
  }
  if (index >= HIST_BUCKETS)
    index = HIST_BUCKETS - 1;
  atomic_fetch_add_explicit(&ep->hist[index], 1, memory_order_relaxed);
  int64_t max = atomic_load_explicit(&ep->hist_max_ns, memory_order_relaxed);
  while ((int64_t)v > max &&
         !atomic_compare_exchange_weak(&ep->hist_max_ns, &max, (int64_t)v)) {
  }
}

static int64_t hist_upper_bound(size_t index) {
  if (index < 16)
    return (int64_t)index;
  size_t msb = index / 16 + 3;
  uint64_t sub = index % 16;
  return (int64_t)(((16 + sub + 1) << (msb - 4)) - 1);
}

static int64_t hist_percentile(pcp_fabric_endpoint_t* ep, double q) {
  uint64_t total = 0;
  for (size_t i = 0; i < HIST_BUCKETS; ++i) total += ep->hist[i];
  if (total == 0)
    return 0;
  uint64_t rank = (uint64_t)(q * (double)total);
  if (rank >= total)
    rank = total - 1;
  uint64_t seen = 0;
  for (size_t i = 0; i < HIST_BUCKETS; ++i) {
    seen += ep->hist[i];
    if (seen > rank)
      return hist_upper_bound(i);
  }
  return hist_upper_bound(HIST_BUCKETS - 1);
}

// The (backend, target) slot of the workers gauge for |w|, added on first
// sight; UINT32_MAX past the 64 kept (those workers are not in the gauge).
uint32_t pcp_fabric_gauge_key_of(pcp_fabric_endpoint_t* ep,
                                 const fabric_worker_t* w) {
  for (uint32_t k = 0; k < ep->gauge_key_count; ++k) {
    if (strcmp(ep->gauge_keys[k].backend, w->info.backend) == 0 &&
        strcmp(ep->gauge_keys[k].target, w->info.target) == 0) {
      return k;
    }
  }
  if (ep->gauge_key_count == PCP_ARRAYSIZE(ep->gauge_keys))
    return UINT32_MAX;
  uint32_t k = ep->gauge_key_count++;
  copy_text(ep->gauge_keys[k].backend, sizeof(ep->gauge_keys[k].backend),
            w->info.backend);
  copy_text(ep->gauge_keys[k].target, sizeof(ep->gauge_keys[k].target),
            w->info.target);
  return k;
}

// One pass over the workers (the slot is cached on the worker at join), so
// a large fleet costs one loop per refresh, not one per label set.
void pcp_fabric_worker_gauges_refresh(pcp_fabric_endpoint_t* ep, int64_t now) {
  int64_t oldest = 0;
  uint32_t counts[PCP_ARRAYSIZE(ep->gauge_keys)]
                 [PCP_FABRIC_WORKER_STATE_COUNT_];
  memset(counts, 0, sizeof(counts));
  for (uint32_t i = 0; i < ep->worker_count; ++i) {
    fabric_worker_t* w = ep->workers[i];
    if (w->conn) {
      int64_t last = pcp_proto_gateway_conn_deadline_ns(w->conn->proto) -
                     ep->timeouts.silence_timeout_ns;
      if (now - last > oldest)
        oldest = now - last;
    }
    if (w->gauge_key < ep->gauge_key_count) {
      counts[w->gauge_key][w->info.state]++;
    }
  }
  if (ep->m_heartbeat_age) {
    pcp_obs_gauge_set(ep->m_heartbeat_age, (double)oldest / 1e9);
  }
  for (uint32_t k = 0; k < ep->gauge_key_count; ++k) {
    for (int st = 0; st < PCP_FABRIC_WORKER_STATE_COUNT_; ++st) {
      // A worker without --target reports ""; the label says "default",
      // as the node manager's and the worker's own metrics do.
      const char* target =
          ep->gauge_keys[k].target[0] ? ep->gauge_keys[k].target : "default";
      const char* labels[] = {
          pcp_fabric_worker_state_name((pcp_fabric_worker_state_t)st),
          ep->gauge_keys[k].backend, target};
      pcp_obs_family_set(ep->families[M_WORKERS], labels, counts[k][st]);
    }
  }
}

void pcp_fabric_endpoint_stats_query(pcp_fabric_endpoint_t* ep,
                                     pcp_fabric_endpoint_stats_t* out_stats) {
  memset(out_stats, 0, sizeof(*out_stats));
  pthread_mutex_lock(&ep->mu);
  out_stats->connections = ep->conn_count;
  for (uint32_t i = 0; i < ep->worker_count; ++i) {
    if (ep->workers[i]->conn)
      out_stats->workers_connected++;
  }
  pthread_mutex_unlock(&ep->mu);
  out_stats->bytes_in = atomic_load(&ep->bytes_in);
  out_stats->bytes_out = atomic_load(&ep->bytes_out);
  out_stats->frames_in = atomic_load(&ep->frames_in);
  out_stats->frames_out = atomic_load(&ep->frames_out);
  out_stats->evictions = atomic_load(&ep->evictions);
  out_stats->rejected_joins = atomic_load(&ep->rejected_joins);
  out_stats->protocol_errors = atomic_load(&ep->protocol_errors);
  out_stats->events_handled = atomic_load(&ep->events_handled);
  out_stats->handling_p50_ns = hist_percentile(ep, 0.50);
  out_stats->handling_p99_ns = hist_percentile(ep, 0.99);
  out_stats->handling_max_ns = atomic_load(&ep->hist_max_ns);
}

void pcp_fabric_endpoint_stats_reset_latency(pcp_fabric_endpoint_t* ep) {
  for (size_t i = 0; i < HIST_BUCKETS; ++i) atomic_store(&ep->hist[i], 0);
  atomic_store(&ep->hist_max_ns, 0);
}
