// SPDX-License-Identifier: Apache-2.0
//
// The endpoint: options and config, create and release, the loop thread and
// its timer (ticks: connection deadlines, sched ticks, gauges) and kicks.

#include "fabric/fabric_impl.h"

static void on_tick(void* user_data, pcp_loop_timer_t* timer,
                    pcp_status_code_t code) {
  (void)timer;
  if (code != PCP_STATUS_OK)
    return;
  pcp_fabric_endpoint_t* ep = user_data;
  pthread_mutex_lock(&ep->mu);
  int64_t now = now_ns(ep);
  // After a stall of the loop thread (a long task callback, a large tensor
  // hashed by proto on this thread, the process descheduled) every peer's
  // frames wait unread in the kernel, and libuv runs timers before I/O:
  // judging silence now would evict workers that did talk. Skip the
  // connection ticks once so the I/O phase reads first; never twice in a
  // row, so a loop that is merely slow still ticks.
  bool stalled = !ep->tick_skipped &&
                 now - ep->last_tick_ns > 2 * ep->timeouts.tick_interval_ns;
  ep->tick_skipped = stalled;
  ep->last_tick_ns = now;
  fabric_conn_t* conn = stalled ? NULL : ep->conns;
  while (conn) {
    fabric_conn_t* next = conn->next;
    pcp_status_t status = pcp_proto_gateway_conn_on_tick(conn->proto, now);
    pcp_fabric_conn_process_actions(conn);
    if (status)
      pcp_fabric_conn_local_failure(conn, status, "fabric: tick");
    if (conn->close_requested && conn->tcp && !conn->tcp_close_called &&
        now - conn->close_requested_ns >=
            2 * ep->timeouts.heartbeat_interval_ns) {
      conn->tcp_close_called = true;
      pcp_tcp_conn_close(conn->tcp);
    }
    conn = next;
  }
  pcp_sched_event_t events[16];
  for (int round = 0; round < 64; ++round) {
    size_t count = 0;
    pcp_status_t status =
        pcp_sched_tick(ep->sched, now, events, PCP_ARRAYSIZE(events), &count);
    if (status) {
      pcp_status_ignore(status);
      break;
    }
    for (size_t i = 0; i < count; ++i)
      pcp_fabric_sched_event_handle(ep, &events[i]);
    if (count < PCP_ARRAYSIZE(events))
      break;
  }
  // Gauges once per H: they are read by scrapes, not by the loop.
  if (++ep->tick_count % 4 == 0)
    pcp_fabric_worker_gauges_refresh(ep, now);
  ep->schedule_wanted = true;
  pcp_fabric_unlock_and_notify(ep);
}

static void on_kick(void* user_data, pcp_status_code_t code) {
  pcp_fabric_endpoint_t* ep = user_data;
  atomic_store(&ep->kick_pending, false);
  if (code != PCP_STATUS_OK)
    return;
  pthread_mutex_lock(&ep->mu);
  ep->schedule_wanted = true;
  pcp_fabric_unlock_and_notify(ep);
}

void pcp_fabric_kick(pcp_fabric_endpoint_t* ep) {
  if (atomic_exchange(&ep->kick_pending, true))
    return;
  pcp_status_t status = pcp_loop_post(ep->loop, on_kick, ep);
  if (status) {
    // Queue full or shutting down: the next tick (H/4) schedules anyway.
    pcp_status_ignore(status);
    atomic_store(&ep->kick_pending, false);
  }
}

static void on_stop(void* user_data, pcp_status_code_t code) {
  pcp_fabric_endpoint_t* ep = user_data;
  if (code != PCP_STATUS_OK)
    return;
  pthread_mutex_lock(&ep->mu);
  if (ep->listener) {
    pcp_tcp_listener_close(ep->listener);
    ep->listener = NULL;
  }
  for (fabric_conn_t* c = ep->conns; c; c = c->next) {
    if (c->tcp && !c->tcp_close_called) {
      c->tcp_close_called = true;
      pcp_tcp_conn_close(c->tcp);
    }
  }
  pthread_mutex_unlock(&ep->mu);
  pcp_loop_stop(ep->loop);
}

static void* loop_thread_main(void* arg) {
  pcp_fabric_endpoint_t* ep = arg;
  pcp_status_t status = pcp_loop_run(ep->loop);
  if (status) {
    log_status(ep, PCP_LOG_ERROR, status, "fabric: loop");
    pcp_status_ignore(status);
  }
  return NULL;
}

static const pcp_config_field_t k_config_fields[] = {
    {.name = "fabric-listen",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(pcp_fabric_config_t, listen),
     .default_value = "127.0.0.1:0",
     .value_name = "HOST:PORT",
     .help = "Worker-fabric listen address (port 0: ephemeral)"},
    {.name = "fabric-heartbeat-interval-ms",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(pcp_fabric_config_t, heartbeat_interval_ms),
     .default_value = "1000",
     .min = PCP_PROTO_HEARTBEAT_MIN_MS,
     .max = PCP_PROTO_HEARTBEAT_MAX_MS,
     .value_name = "MS",
     .help = "Heartbeat interval H; eviction after 3H of silence"},
    {.name = "fabric-join-token-env",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(pcp_fabric_config_t, join_token_env),
     .default_value = "PCP_WORKER_JOIN_TOKEN",
     .flags = PCP_CONFIG_FLAG_ENV_NAME,
     .value_name = "VAR",
     .help = "Environment variable holding the worker join token"},
    {.name = "fabric-max-task-attempts",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(pcp_fabric_config_t, max_task_attempts),
     .default_value = "3",
     .min = 1,
     .max = PCP_FABRIC_MAX_TASK_ATTEMPTS,
     .value_name = "N",
     .help = "Runs of one task before it fails when its workers are lost"},
};

static const pcp_config_table_t k_config_table = {
    .name = "fabric",
    .fields = k_config_fields,
    .field_count = PCP_ARRAYSIZE(k_config_fields),
};

const pcp_config_table_t* pcp_fabric_config_table(void) {
  return &k_config_table;
}

void pcp_fabric_options_initialize(pcp_fabric_options_t* out_options) {
  memset(out_options, 0, sizeof(*out_options));
  copy_text(out_options->listen_address.host,
            sizeof(out_options->listen_address.host), "127.0.0.1");
  out_options->heartbeat_interval_ms = PCP_PROTO_HEARTBEAT_DEFAULT_MS;
  out_options->join_token_env = "PCP_WORKER_JOIN_TOKEN";
  out_options->limits = pcp_proto_limits_default();
  out_options->max_task_attempts = PCP_FABRIC_DEFAULT_MAX_TASK_ATTEMPTS;
  out_options->max_workers = 1024;
  out_options->max_connections = 4096;
}

pcp_status_t pcp_fabric_options_apply_config(const pcp_fabric_config_t* config,
                                             pcp_fabric_options_t* options) {
  if (config->listen) {
    PCP_RETURN_IF_ERROR(
        pcp_net_address_parse(pcp_make_cstring_view(config->listen),
                              &options->listen_address),
        "fabric-listen");
  }
  if (config->heartbeat_interval_ms < PCP_PROTO_HEARTBEAT_MIN_MS ||
      config->heartbeat_interval_ms > PCP_PROTO_HEARTBEAT_MAX_MS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric-heartbeat-interval-ms: %lld not in "
                           "[%u, %u]",
                           (long long)config->heartbeat_interval_ms,
                           PCP_PROTO_HEARTBEAT_MIN_MS,
                           PCP_PROTO_HEARTBEAT_MAX_MS);
  }
  options->heartbeat_interval_ms = (uint32_t)config->heartbeat_interval_ms;
  if (config->join_token_env && config->join_token_env[0]) {
    options->join_token_env = config->join_token_env;
  }
  if (config->max_task_attempts < 1 ||
      config->max_task_attempts > PCP_FABRIC_MAX_TASK_ATTEMPTS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric-max-task-attempts: %lld not in [1, %u]",
                           (long long)config->max_task_attempts,
                           PCP_FABRIC_MAX_TASK_ATTEMPTS);
  }
  options->max_task_attempts = (uint32_t)config->max_task_attempts;
  return pcp_ok_status();
}

static void endpoint_free(pcp_fabric_endpoint_t* ep) {
  pcp_allocator_t a = ep->allocator;
  for (uint32_t i = 0; i < ep->worker_count; ++i) {
    pcp_allocator_free(a, ep->workers[i]->acked.items);
    pcp_allocator_free(a, ep->workers[i]->offered.items);
    pcp_allocator_free(a, ep->workers[i]);
  }
  pcp_allocator_free(a, ep->workers);
  for (uint32_t i = 0; i < ep->program_count; ++i) {
    pcp_allocator_free(a, ep->programs[i].raw);
  }
  pcp_allocator_free(a, ep->programs);
  for (uint32_t i = 0; i < ep->session_count; ++i) {
    pcp_allocator_free(a, ep->sessions[i].id);
  }
  pcp_allocator_free(a, ep->sessions);
  pcp_sched_release(ep->sched);
  pcp_obs_registry_release(ep->own_metrics);
  if (ep->token) {
    memset(ep->token, 0, ep->token_length);
    pcp_allocator_free(a, ep->token);
  }
  pthread_mutex_destroy(&ep->mu);
  pthread_cond_destroy(&ep->cv);
  pcp_allocator_free(a, ep);
}

pcp_status_t pcp_fabric_endpoint_create(const pcp_fabric_options_t* options,
                                        pcp_allocator_t allocator,
                                        pcp_fabric_endpoint_t** out_endpoint) {
  *out_endpoint = NULL;
  PCP_RETURN_IF_ERROR(pcp_proto_limits_validate(&options->limits),
                      "fabric endpoint limits");
  if (options->max_task_attempts < 1 ||
      options->max_task_attempts > PCP_FABRIC_MAX_TASK_ATTEMPTS ||
      options->max_workers < 1 ||
      options->max_workers > PCP_SCHED_REGISTRY_WORKER_COUNT_MAX ||
      options->max_connections < 1) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric endpoint: max_task_attempts, max_workers "
                           "or max_connections out of range");
  }
  const char* env_name = options->join_token_env;
  const char* token = env_name && env_name[0] ? getenv(env_name) : NULL;
  if (!token || !token[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric endpoint: the join token variable '%s' is "
                           "unset or empty",
                           env_name ? env_name : "");
  }
  void* p = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(pcp_fabric_endpoint_t), &p));
  pcp_fabric_endpoint_t* ep = p;
  ep->allocator = allocator;
  ep->options = *options;
  ep->options.join_token_env = NULL;  // borrowed for the call only
  ep->options.software = NULL;
  copy_text(ep->software, sizeof(ep->software),
            options->software ? options->software : "pcp");
  ep->log = options->log;
  ep->clock = options->clock.now_ns ? options->clock : pcp_clock_system();
  ep->timeouts =
      pcp_proto_timeouts_from_heartbeat(options->heartbeat_interval_ms);
  ep->options.heartbeat_interval_ms =
      (uint32_t)(ep->timeouts.heartbeat_interval_ns / 1000000);
  ep->cancel_answer_timeout_ns =
      (int64_t)options->cancel_answer_timeout_ms * 1000000;
  if (ep->cancel_answer_timeout_ns == 0) {
    const int64_t five_minutes_ns = (int64_t)300 * 1000000000;
    ep->cancel_answer_timeout_ns =
        ep->timeouts.resume_window_ns > five_minutes_ns
            ? ep->timeouts.resume_window_ns
            : five_minutes_ns;
  }
  ep->next_task_id = 1;
  pthread_mutex_init(&ep->mu, NULL);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&ep->cv, &attr);
  pthread_condattr_destroy(&attr);

  pcp_status_t status = pcp_ok_status();
  ep->token_length = strlen(token);
  status = pcp_allocator_malloc(allocator, ep->token_length, &p);
  if (!status) {
    ep->token = p;
    memcpy(ep->token, token, ep->token_length);
  }
  if (!status) {
    pcp_sched_options_t sched_options;
    pcp_sched_options_initialize(&sched_options);
    sched_options.max_workers = options->max_workers;
    sched_options.max_leases = options->max_workers * 2 + 16;
    // The state machines detect silence (3H); sched only hears the verdict.
    sched_options.heartbeat_timeout_ns = 0;
    sched_options.lease_rejoin_grace_ns = ep->timeouts.resume_window_ns;
    status = pcp_sched_create(&sched_options, allocator, &ep->sched);
  }
  if (!status) {
    ep->metrics = options->metrics;
    if (!ep->metrics) {
      status = pcp_obs_registry_create(allocator, &ep->own_metrics);
      ep->metrics = ep->own_metrics;
    }
  }
  if (!status) {
    status = pcp_obs_registry_register(ep->metrics, pcp_fabric_metric_defs,
                                       M_COUNT_, ep->families);
  }
  if (!status) {
    pcp_fabric_metrics_bind(ep);
    pcp_loop_options_t loop_options = pcp_loop_options_default();
    loop_options.allocator = allocator;
    status = pcp_loop_create(&loop_options, &ep->loop);
  }
  if (!status) {
    status = pcp_tcp_listen(ep->loop, &options->listen_address, 0,
                            pcp_fabric_conn_accept, ep, &ep->listener);
  }
  if (!status) {
    ep->port = pcp_tcp_listener_port(ep->listener);
    uint64_t tick_ms = (uint64_t)(ep->timeouts.tick_interval_ns / 1000000);
    if (tick_ms == 0)
      tick_ms = 1;
    status = pcp_loop_timer_start(ep->loop, tick_ms, tick_ms, on_tick, ep,
                                  &ep->tick_timer);
  }
  if (!status) {
    ep->last_tick_ns = now_ns(ep);
    int err = pthread_create(&ep->thread, NULL, loop_thread_main, ep);
    if (err) {
      status = pcp_status_from_errno(err, "fabric loop thread");
    } else {
      ep->thread_started = true;
    }
  }
  if (status) {
    if (ep->loop)
      pcp_loop_release(ep->loop);
    endpoint_free(ep);
    return status;
  }
  PCP_LOG(PCP_LOG_INFO, &ep->log,
          "fabric listening host=%s port=%u heartbeat_ms=%u",
          options->listen_address.host, (unsigned)ep->port,
          ep->options.heartbeat_interval_ms);
  *out_endpoint = ep;
  return pcp_ok_status();
}

void pcp_fabric_endpoint_release(pcp_fabric_endpoint_t* ep) {
  if (!ep)
    return;
  pthread_mutex_lock(&ep->mu);
  ep->stopping = true;
  pthread_cond_broadcast(&ep->cv);  // waits return
  pthread_mutex_unlock(&ep->mu);
  pcp_status_t status = pcp_loop_post(ep->loop, on_stop, ep);
  if (status) {
    pcp_status_ignore(status);
    pcp_loop_stop(ep->loop);
  }
  if (ep->thread_started)
    pthread_join(ep->thread, NULL);
  // Close callbacks of the connections still open run here, on this thread.
  ep->listener = NULL;
  pcp_loop_release(ep->loop);
  ep->loop = NULL;
  pthread_mutex_lock(&ep->mu);
  while (ep->tasks_head) {
    pcp_fabric_task_finish(
        ep, ep->tasks_head,
        pcp_make_status(PCP_STATUS_CANCELLED, "fabric endpoint shutting down"));
  }
  ep->schedule_wanted = false;
  pcp_fabric_unlock_and_notify(ep);
  endpoint_free(ep);
}

uint16_t pcp_fabric_endpoint_port(const pcp_fabric_endpoint_t* ep) {
  return ep->port;
}

pcp_obs_registry_t* pcp_fabric_endpoint_metrics(pcp_fabric_endpoint_t* ep) {
  return ep->metrics;
}

pcp_proto_timeouts_t pcp_fabric_endpoint_timeouts(
    const pcp_fabric_endpoint_t* ep) {
  return ep->timeouts;
}
