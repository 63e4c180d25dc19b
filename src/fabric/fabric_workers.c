// SPDX-License-Identifier: Apache-2.0
//
// Workers: joins (the registry and sched), losses, and the public worker
// queries and drain.

#include "fabric/fabric_impl.h"

fabric_worker_t* pcp_fabric_worker_find(pcp_fabric_endpoint_t* ep,
                                        const char* worker_id) {
  for (uint32_t i = 0; i < ep->worker_count; ++i) {
    if (strcmp(ep->workers[i]->info.worker_id, worker_id) == 0) {
      return ep->workers[i];
    }
  }
  return NULL;
}

// The registry slot of the worker lost longest ago, once its resume window
// has passed (UINT32_MAX: none can go).
static uint32_t worker_recycle_victim(pcp_fabric_endpoint_t* ep, int64_t now) {
  uint32_t victim = UINT32_MAX;
  for (uint32_t i = 0; i < ep->worker_count; ++i) {
    fabric_worker_t* w = ep->workers[i];
    if (w->conn || now - w->lost_at_ns <= ep->timeouts.resume_window_ns) {
      continue;
    }
    if (victim == UINT32_MAX ||
        w->lost_at_ns < ep->workers[victim]->lost_at_ns) {
      victim = i;
    }
  }
  return victim;
}

// Frees the registry slot of worker_recycle_victim, so that a fleet whose
// ids churn (pods with new names) does not fill the registry. False when
// none can go.
static bool worker_recycle_one(pcp_fabric_endpoint_t* ep, int64_t now) {
  uint32_t victim = worker_recycle_victim(ep, now);
  if (victim == UINT32_MAX)
    return false;
  fabric_worker_t* w = ep->workers[victim];
  for (uint32_t i = 0; i < ep->session_count;) {
    if (ep->sessions[i].worker == w) {
      pcp_fabric_session_forget(ep, i);
    } else {
      ++i;
    }
  }
  for (pcp_fabric_task_t* t = ep->tasks_head; t; t = t->next) {
    if (t->worker == w)
      t->worker = NULL;
  }
  for (fabric_conn_t* c = ep->conns; c; c = c->next) {
    if (c->worker == w)
      c->worker = NULL;  // a close still flushing
  }
  pcp_status_ignore(
      pcp_sched_worker_remove(ep->sched, w->info.worker_id, now, NULL));
  pcp_allocator_free(ep->allocator, w->acked.items);
  pcp_allocator_free(ep->allocator, w->offered.items);
  pcp_allocator_free(ep->allocator, w);
  ep->workers[victim] = ep->workers[--ep->worker_count];
  return true;
}

bool pcp_fabric_worker_connected(const fabric_worker_t* w) {
  return w->conn != NULL && pcp_proto_gateway_conn_state(w->conn->proto) ==
                                PCP_PROTO_GATEWAY_ACCEPTED;
}

static void reject(fabric_conn_t* conn, pcp_proto_reject_reason_t reason,
                   const char* message) {
  pcp_status_t status = pcp_proto_gateway_conn_reject(
      conn->proto, reason, message, now_ns(conn->endpoint));
  pcp_status_ignore(status);
}

// Acts on pcp_fabric_join_decide (fabric_glue.c, shared with src/sim): the
// registry slot, the eviction, sched, the token and ACCEPT are ours.
void pcp_fabric_join_verified(fabric_conn_t* conn) {
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  const pcp_proto_join_t* join = pcp_proto_gateway_conn_join(conn->proto);
  int64_t now = now_ns(ep);
  fabric_worker_t* w = pcp_fabric_worker_find(ep, join->worker_id);
  pcp_fabric_join_record_t record = {0};
  if (w) {
    record.known = true;
    record.connected = w->conn != NULL;
    if (w->conn) {
      record.connection_deadline_ns =
          pcp_proto_gateway_conn_deadline_ns(w->conn->proto);
    }
    record.lease_epoch = w->info.lease_epoch;
    record.lost_at_ns = w->lost_at_ns;
    memcpy(record.resume_token, w->resume_token, sizeof(record.resume_token));
  }
  bool room = w || ep->worker_count < ep->options.max_workers ||
              worker_recycle_victim(ep, now) != UINT32_MAX;
  pcp_fabric_join_decision_t decision;
  pcp_fabric_join_decide(join, &record, room, now, &ep->timeouts, &decision);
  if (decision.verdict == PCP_FABRIC_JOIN_REJECT) {
    reject(conn, decision.reject_reason, decision.message);
    return;
  }
  if (decision.evict_old) {
    fabric_conn_t* old = w->conn;
    pcp_fabric_join_evict(old->proto, now);
    pcp_fabric_conn_process_actions(old);
  }
  if (!w) {
    if (ep->worker_count >= ep->options.max_workers &&
        !worker_recycle_one(ep, now)) {
      reject(conn, PCP_PROTO_REJECT_CAPACITY, "worker registry full");
      return;
    }
    if (ep->worker_count == ep->worker_capacity) {
      uint32_t capacity = ep->worker_capacity ? ep->worker_capacity * 2 : 16;
      void* p = ep->workers;
      pcp_status_t status = pcp_allocator_realloc(
          ep->allocator, capacity * sizeof(fabric_worker_t*), &p);
      if (status) {
        pcp_status_ignore(status);
        reject(conn, PCP_PROTO_REJECT_CAPACITY, "out of memory");
        return;
      }
      ep->workers = p;
      ep->worker_capacity = capacity;
    }
    void* p = NULL;
    pcp_status_t status =
        pcp_allocator_calloc(ep->allocator, sizeof(fabric_worker_t), &p);
    if (status) {
      pcp_status_ignore(status);
      reject(conn, PCP_PROTO_REJECT_CAPACITY, "out of memory");
      return;
    }
    w = p;
    copy_text(w->info.worker_id, sizeof(w->info.worker_id), join->worker_id);
    w->info.state = PCP_FABRIC_WORKER_LOST;
    ep->workers[ep->worker_count++] = w;
  }
  bool resumed = decision.resumed;
  if (!pcp_fabric_join_sched_enter(ep->sched, join, now, &decision)) {
    reject(conn, decision.reject_reason, decision.message);
    return;
  }
  pcp_status_t status = pcp_ok_status();
  uint8_t token[PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH];
  if (!resumed) {
    status = pcp_proto_random_bytes(token, sizeof(token));
    if (status) {
      pcp_status_ignore(status);
      pcp_status_ignore(
          pcp_sched_worker_remove(ep->sched, join->worker_id, now, NULL));
      reject(conn, PCP_PROTO_REJECT_CAPACITY, "no randomness for the token");
      return;
    }
  }
  pcp_fabric_worker_info_t* wi = &w->info;
  copy_text(wi->backend, sizeof(wi->backend), join->backend);
  copy_text(wi->target, sizeof(wi->target), join->target);
  wi->device_id = join->device_id;
  wi->device_memory_bytes = join->device_memory_bytes;
  wi->driver_count = join->driver_count;
  for (uint32_t i = 0; i < join->driver_count; ++i) {
    copy_text(wi->drivers[i], sizeof(wi->drivers[i]), join->drivers[i]);
  }
  copy_text(wi->runtime_version, sizeof(wi->runtime_version),
            join->runtime_version);
  copy_text(wi->compiler_version, sizeof(wi->compiler_version),
            join->compiler_version);
  copy_text(wi->node_manager_id, sizeof(wi->node_manager_id),
            join->node_manager_id);
  wi->supervisor_id = join->supervisor_id;
  copy_text(wi->worker_class, sizeof(wi->worker_class), join->worker_class);
  w->gauge_key = pcp_fabric_gauge_key_of(ep, w);
  if (!resumed) {
    wi->lease_epoch = decision.lease_epoch;
    memcpy(w->resume_token, token, sizeof(token));
    // A different process may have a different disk cache: ask again.
    w->acked.count = 0;
  }
  w->offered.count = 0;
  pcp_proto_gateway_accept_params_t params;
  pcp_fabric_join_accept_params(&decision, w->resume_token, &params);
  status = pcp_proto_gateway_conn_accept(conn->proto, &params, now);
  if (status) {
    log_status(ep, PCP_LOG_ERROR, status, "fabric: accept");
    pcp_status_ignore(status);
    pcp_sched_event_t ev = {0};
    pcp_status_ignore(
        pcp_sched_worker_mark_lost(ep->sched, join->worker_id, now, &ev));
    return;
  }
  w->conn = conn;
  conn->worker = w;
  wi->state = PCP_FABRIC_WORKER_CONNECTED;
  pthread_cond_broadcast(&ep->cv);  // pcp_fabric_workers_wait
  wi->join_count++;
  if (resumed)
    wi->resumed_count++;
  PCP_LOG(PCP_LOG_INFO, &ep->log,
          "fabric worker joined worker=%s backend=%s target=%s device=%d "
          "peer=%s epoch=%llu resumed=%d",
          wi->worker_id, wi->backend, wi->target, (int)wi->device_id,
          conn->peer, (unsigned long long)wi->lease_epoch, (int)resumed);
  pcp_sched_event_t event = {0};
  status = pcp_sched_worker_ready(ep->sched, wi->worker_id, now, &event);
  if (status) {
    log_status(ep, PCP_LOG_ERROR, status, "fabric: sched ready");
    pcp_status_ignore(status);
  } else {
    pcp_fabric_sched_event_handle(ep, &event);
  }
  ep->schedule_wanted = true;
}

// The connection's state machine is CLOSED: the worker (if it was accepted on
// this connection) is lost; its tasks move per the sched rules.
void pcp_fabric_conn_ended(fabric_conn_t* conn) {
  if (conn->ended)
    return;
  conn->ended = true;
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  fabric_worker_t* w = conn->worker;
  if (!w || w->conn != conn)
    return;
  int64_t now = now_ns(ep);
  w->info.bytes_in += atomic_load(&conn->bytes_in);
  w->info.bytes_out += atomic_load(&conn->bytes_out);
  w->conn = NULL;
  w->info.state = PCP_FABRIC_WORKER_LOST;
  pthread_cond_broadcast(&ep->cv);  // pcp_fabric_workers_wait
  w->lost_at_ns = now;
  w->offered.count = 0;
  for (pcp_fabric_task_t* t = ep->tasks_head; t; t = t->next) {
    if (t->worker != w || t->state == TASK_PENDING)
      continue;
    if (t->lease_id) {
      t->state = TASK_DETACHED;  // sched's event below decides
    } else {
      t->state = TASK_PENDING;  // pinned: wait for this worker
      t->pin_deadline_ns = 0;
    }
  }
  pcp_sched_event_t event = {0};
  pcp_status_t status =
      pcp_sched_worker_mark_lost(ep->sched, w->info.worker_id, now, &event);
  if (status) {
    pcp_status_ignore(status);
  } else {
    pcp_fabric_sched_event_handle(ep, &event);
  }
  PCP_LOG(PCP_LOG_INFO, &ep->log, "fabric worker lost worker=%s peer=%s",
          w->info.worker_id, conn->peer);
  ep->schedule_wanted = true;
}

const char* pcp_fabric_worker_state_name(pcp_fabric_worker_state_t state) {
  switch (state) {
    case PCP_FABRIC_WORKER_CONNECTED:
      return "connected";
    case PCP_FABRIC_WORKER_DRAINING:
      return "draining";
    case PCP_FABRIC_WORKER_LOST:
      return "lost";
    default:
      return "unknown";
  }
}

// Fills |out_info| from |w|; the caller holds ep->mu.
static void worker_info_fill(pcp_fabric_endpoint_t* ep, fabric_worker_t* w,
                             pcp_fabric_worker_info_t* out_info) {
  *out_info = w->info;
  out_info->program_count = w->acked.count;
  out_info->lost_at_ns = w->lost_at_ns;
  out_info->heartbeat_age_ns = 0;
  out_info->in_flight = 0;
  out_info->lease_id = 0;
  if (w->conn) {
    int64_t last = pcp_proto_gateway_conn_deadline_ns(w->conn->proto) -
                   ep->timeouts.silence_timeout_ns;
    out_info->heartbeat_age_ns = now_ns(ep) - last;
    out_info->in_flight =
        (uint32_t)pcp_proto_gateway_conn_in_flight_count(w->conn->proto);
    out_info->bytes_in += atomic_load(&w->conn->bytes_in);
    out_info->bytes_out += atomic_load(&w->conn->bytes_out);
  }
  if (out_info->in_flight == 0) {
    // Cancelled, reassigned or lost with the connection: nothing runs.
    out_info->current_task_id = 0;
    out_info->current_function[0] = '\0';
  }
  pcp_sched_worker_status_t status;
  pcp_status_t s =
      pcp_sched_worker_query(ep->sched, w->info.worker_id, &status);
  if (!s) {
    out_info->sched_state = status.state;
    out_info->lease_id = status.lease_id;
  } else {
    pcp_status_ignore(s);
    out_info->sched_state = PCP_SCHED_WORKER_STATE_LOST;
  }
}

pcp_status_t pcp_fabric_worker_query(pcp_fabric_endpoint_t* ep,
                                     const char* worker_id,
                                     pcp_fabric_worker_info_t* out_info) {
  memset(out_info, 0, sizeof(*out_info));
  pthread_mutex_lock(&ep->mu);
  fabric_worker_t* w = pcp_fabric_worker_find(ep, worker_id);
  if (!w) {
    pthread_mutex_unlock(&ep->mu);
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "worker '%s'", worker_id);
  }
  worker_info_fill(ep, w, out_info);
  pthread_mutex_unlock(&ep->mu);
  return pcp_ok_status();
}

uint32_t pcp_fabric_worker_list(pcp_fabric_endpoint_t* ep,
                                pcp_fabric_worker_info_t* out_infos,
                                uint32_t capacity, uint32_t* out_total) {
  pthread_mutex_lock(&ep->mu);
  uint32_t total = ep->worker_count;
  uint32_t count = total < capacity ? total : capacity;
  for (uint32_t i = 0; i < count; ++i) {
    worker_info_fill(ep, ep->workers[i], &out_infos[i]);
  }
  pthread_mutex_unlock(&ep->mu);
  if (out_total)
    *out_total = total;
  // Registry order is not stable (removal swaps in the last slot), so the
  // copy is sorted by id: a paging client sees one order.
  for (uint32_t i = 1; i < count; ++i) {
    pcp_fabric_worker_info_t item = out_infos[i];
    uint32_t j = i;
    while (j > 0 && strcmp(out_infos[j - 1].worker_id, item.worker_id) > 0) {
      out_infos[j] = out_infos[j - 1];
      --j;
    }
    out_infos[j] = item;
  }
  return count;
}

uint32_t pcp_fabric_worker_count(pcp_fabric_endpoint_t* ep,
                                 pcp_fabric_worker_state_t state) {
  pthread_mutex_lock(&ep->mu);
  uint32_t count = 0;
  for (uint32_t i = 0; i < ep->worker_count; ++i) {
    if (state == PCP_FABRIC_WORKER_STATE_COUNT_ ||
        ep->workers[i]->info.state == state) {
      ++count;
    }
  }
  pthread_mutex_unlock(&ep->mu);
  return count;
}

typedef struct drain_request_t {
  pcp_fabric_endpoint_t* endpoint;
  char worker_id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  uint64_t deadline_ms;
} drain_request_t;

static void on_drain(void* user_data, pcp_status_code_t code) {
  drain_request_t* request = user_data;
  pcp_fabric_endpoint_t* ep = request->endpoint;
  if (code == PCP_STATUS_OK) {
    pthread_mutex_lock(&ep->mu);
    fabric_worker_t* w = pcp_fabric_worker_find(ep, request->worker_id);
    if (w && pcp_fabric_worker_connected(w)) {
      pcp_status_ignore(pcp_proto_gateway_conn_drain(
          w->conn->proto, request->deadline_ms, now_ns(ep)));
      w->info.state = PCP_FABRIC_WORKER_DRAINING;
      pthread_cond_broadcast(&ep->cv);  // pcp_fabric_workers_wait
      pcp_status_ignore(pcp_sched_worker_drain(ep->sched, w->info.worker_id));
      pcp_fabric_conn_process_actions(w->conn);
    }
    pcp_fabric_unlock_and_notify(ep);
  }
  pcp_allocator_free(ep->allocator, request);
}

pcp_status_t pcp_fabric_worker_drain(pcp_fabric_endpoint_t* ep,
                                     const char* worker_id,
                                     uint64_t deadline_ms) {
  pthread_mutex_lock(&ep->mu);
  fabric_worker_t* w = pcp_fabric_worker_find(ep, worker_id);
  bool connected = w && pcp_fabric_worker_connected(w);
  pthread_mutex_unlock(&ep->mu);
  if (!w)
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "worker '%s'", worker_id);
  if (!connected) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "worker '%s' is not connected", worker_id);
  }
  void* p = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(ep->allocator, sizeof(drain_request_t), &p));
  drain_request_t* request = p;
  request->endpoint = ep;
  copy_text(request->worker_id, sizeof(request->worker_id), worker_id);
  request->deadline_ms = deadline_ms;
  pcp_status_t status = pcp_loop_post(ep->loop, on_drain, request);
  if (status)
    pcp_allocator_free(ep->allocator, request);
  return status;
}

//===----------------------------------------------------------------------===//
// Waiting for workers (public)
//===----------------------------------------------------------------------===//

// Connected (not draining) workers of (|backend|, |target|, |class_name|).
// ep->mu held.
static uint32_t workers_matching(pcp_fabric_endpoint_t* ep, const char* backend,
                                 const char* target, const char* class_name) {
  uint32_t count = 0;
  for (uint32_t i = 0; i < ep->worker_count; ++i) {
    const pcp_fabric_worker_info_t* info = &ep->workers[i]->info;
    if (info->state == PCP_FABRIC_WORKER_CONNECTED &&
        (!backend || !backend[0] || strcmp(info->backend, backend) == 0) &&
        (!target || strcmp(info->target, target) == 0) &&
        (!class_name || !class_name[0] ||
         strcmp(info->worker_class, class_name) == 0)) {
      ++count;
    }
  }
  return count;
}

uint32_t pcp_fabric_workers_count(pcp_fabric_endpoint_t* ep,
                                  const char* backend, const char* target,
                                  const char* class_name) {
  pthread_mutex_lock(&ep->mu);
  uint32_t count = workers_matching(ep, backend, target, class_name);
  pthread_mutex_unlock(&ep->mu);
  return count;
}

pcp_status_t pcp_fabric_workers_wait(pcp_fabric_endpoint_t* ep,
                                     const char* backend, const char* target,
                                     uint32_t count, int64_t deadline_ns,
                                     pcp_fabric_stop_fn_t stop,
                                     void* stop_user_data,
                                     uint32_t* out_count) {
  return pcp_fabric_workers_wait_class(ep, backend, target, NULL, count,
                                       deadline_ns, stop, stop_user_data,
                                       out_count);
}

pcp_status_t pcp_fabric_workers_wait_class(
    pcp_fabric_endpoint_t* ep, const char* backend, const char* target,
    const char* class_name, uint32_t count, int64_t deadline_ns,
    pcp_fabric_stop_fn_t stop, void* stop_user_data, uint32_t* out_count) {
  if (out_count)
    *out_count = 0;
  if (class_name && class_name[0] &&
      !pcp_sched_class_name_is_valid(class_name)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "worker class name must be 1..%d bytes of "
                           "[A-Za-z0-9._-]",
                           PCP_SCHED_CLASS_NAME_MAX_LENGTH);
  }
  uint32_t matching = 0;
  pcp_status_t status = pcp_ok_status();
  pthread_mutex_lock(&ep->mu);
  for (;;) {
    matching = workers_matching(ep, backend, target, class_name);
    if (matching >= count)
      break;
    if (ep->stopping) {
      status = pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                               "fabric endpoint is shutting down");
      break;
    }
    if (stop) {
      // Outside the lock: the request may be slow to read (a store), and
      // the loop thread needs the lock meanwhile.
      uint64_t wakes = ep->wake_count;
      pthread_mutex_unlock(&ep->mu);
      bool stopped = stop(stop_user_data);
      pthread_mutex_lock(&ep->mu);
      if (stopped) {
        status = pcp_make_status(PCP_STATUS_CANCELLED,
                                 "stopped while waiting for %u workers", count);
        break;
      }
      // A wake while the lock was dropped: look at the request again.
      if (ep->wake_count != wakes)
        continue;
      if (workers_matching(ep, backend, target, class_name) >= count)
        continue;
    }
    int64_t left_ns = deadline_ns - now_ns(ep);
    if (left_ns <= 0) {
      status = pcp_make_status(
          PCP_STATUS_DEADLINE_EXCEEDED,
          "%u of %u workers of backend '%s' target '%s' "
          "worker class '%s' connected",
          matching, count, backend ? backend : "", target ? target : "(any)",
          class_name && class_name[0] ? class_name : "(any)");
      break;
    }
    // Woken by joins, losses, drains, pcp_fabric_endpoint_wake and the
    // endpoint's release. The endpoint clock may not be the condition's
    // (an injected one): wait at most a slice of it and look again.
    if (left_ns > PCP_FABRIC_WAIT_SLICE_NS)
      left_ns = PCP_FABRIC_WAIT_SLICE_NS;
    struct timespec now_ts;
    clock_gettime(CLOCK_MONOTONIC, &now_ts);
    int64_t until =
        (int64_t)now_ts.tv_sec * 1000000000 + now_ts.tv_nsec + left_ns;
    struct timespec ts = {.tv_sec = (time_t)(until / 1000000000),
                          .tv_nsec = (long)(until % 1000000000)};
    pthread_cond_timedwait(&ep->cv, &ep->mu, &ts);
  }
  pthread_mutex_unlock(&ep->mu);
  if (out_count)
    *out_count = matching;
  return status;
}

void pcp_fabric_endpoint_wake(pcp_fabric_endpoint_t* ep) {
  pthread_mutex_lock(&ep->mu);
  ep->wake_count++;
  pthread_cond_broadcast(&ep->cv);
  pthread_mutex_unlock(&ep->mu);
}

int64_t pcp_fabric_endpoint_now_ns(const pcp_fabric_endpoint_t* ep) {
  return pcp_clock_now_ns(ep->clock);
}
