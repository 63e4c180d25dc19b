// SPDX-License-Identifier: Apache-2.0
//
// Connections: accept, read, write queue, close, and the execution of the
// actions each connection's proto state machine returns.

#include "fabric/fabric_impl.h"

static void try_finish_close(fabric_conn_t* conn);

static void write_rec_free(write_rec_t* rec) {
  rec->conn->frames_released++;
  pcp_allocator_t a = rec->frame.allocator;
  pcp_proto_encoded_frame_deinitialize(&rec->frame);
  pcp_allocator_free(a, rec);
}

static void on_write_done(void* user_data, pcp_tcp_conn_t* tcp,
                          pcp_status_t status) {
  (void)tcp;
  pcp_status_ignore(status);  // a failed write also closes the connection
  write_rec_t* rec = user_data;
  fabric_conn_t* conn = rec->conn;
  rec->pending--;
  conn->writes_in_flight--;
  if (rec->all_submitted && rec->pending == 0)
    write_rec_free(rec);
  if (conn->tcp)
    try_finish_close(conn);
}

// Hands queued frames to net until its send queue is at the mark.
static void flush_writes(fabric_conn_t* conn) {
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  while (conn->queue_head && conn->tcp) {
    write_rec_t* rec = conn->queue_head;
    pcp_tcp_buffer_t buffers[PCP_TCP_MAX_WRITE_BUFFERS];
    size_t n = 0;
    uint64_t bytes = 0;
    while (n < PCP_TCP_MAX_WRITE_BUFFERS &&
           rec->next_segment + n < rec->frame.segment_count) {
      const pcp_proto_iovec_t* seg =
          &rec->frame.segments[rec->next_segment + n];
      buffers[n].data = seg->data;
      buffers[n].byte_length = seg->byte_length;
      bytes += seg->byte_length;
      ++n;
    }
    pcp_status_t status =
        pcp_tcp_conn_write(conn->tcp, buffers, n, on_write_done, rec);
    if (pcp_status_code(status) == PCP_STATUS_RESOURCE_EXHAUSTED) {
      pcp_status_ignore(status);  // the writable handler resumes
      return;
    }
    if (status) {
      // Shut down or closing: nothing more can be written.
      pcp_status_ignore(status);
      while (conn->queue_head) {
        write_rec_t* r = conn->queue_head;
        conn->queue_head = r->next;
        r->all_submitted = true;
        if (r->pending == 0)
          write_rec_free(r);
      }
      conn->queue_tail = NULL;
      return;
    }
    rec->pending++;
    conn->writes_in_flight++;
    rec->next_segment += n;
    atomic_fetch_add_explicit(&ep->bytes_out, bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&conn->bytes_out, bytes, memory_order_relaxed);
    counter_add(ep->m_bytes_out, (double)bytes);
    if (rec->next_segment == rec->frame.segment_count) {
      rec->all_submitted = true;
      conn->queue_head = rec->next;
      if (!conn->queue_head)
        conn->queue_tail = NULL;
    }
  }
}

// Takes ownership of |frame|.
static void conn_send(fabric_conn_t* conn, pcp_proto_encoded_frame_t* frame) {
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  pcp_fabric_frame_count(ep, 1, frame->type);
  if (!conn->tcp || conn->shutdown_started) {
    pcp_proto_encoded_frame_deinitialize(frame);
    return;
  }
  void* p = NULL;
  pcp_status_t status =
      pcp_allocator_calloc(ep->allocator, sizeof(write_rec_t), &p);
  if (status) {
    // Out of memory mid-stream: the byte stream would have a hole, so the
    // connection must end.
    log_status(ep, PCP_LOG_ERROR, status, "fabric: write queue");
    pcp_status_ignore(status);
    pcp_proto_encoded_frame_deinitialize(frame);
    if (!conn->tcp_close_called) {
      conn->tcp_close_called = true;
      pcp_tcp_conn_close(conn->tcp);
    }
    return;
  }
  write_rec_t* rec = p;
  rec->frame = *frame;
  memset(frame, 0, sizeof(*frame));
  rec->conn = conn;
  if (conn->queue_tail) {
    conn->queue_tail->next = rec;
  } else {
    conn->queue_head = rec;
  }
  conn->queue_tail = rec;
  conn->frames_queued++;
  flush_writes(conn);
}

static void on_shutdown_done(void* user_data, pcp_tcp_conn_t* tcp,
                             pcp_status_t status) {
  (void)user_data;
  (void)tcp;
  // Keep reading until the peer closes (closing now with unread bytes would
  // reset the connection and could destroy the ERROR frame in flight); the
  // tick forces the close after 2H.
  pcp_status_ignore(status);
}

static void try_finish_close(fabric_conn_t* conn) {
  if (!conn->close_requested || conn->shutdown_started || !conn->tcp ||
      conn->queue_head) {
    return;
  }
  conn->shutdown_started = true;
  pcp_status_t status =
      pcp_tcp_conn_shutdown(conn->tcp, on_shutdown_done, conn);
  if (status) {
    pcp_status_ignore(status);
    if (!conn->tcp_close_called) {
      conn->tcp_close_called = true;
      pcp_tcp_conn_close(conn->tcp);
    }
  }
}

static bool is_peer_fault(pcp_status_code_t code) {
  switch (code) {
    case PCP_STATUS_INVALID_ARGUMENT:
    case PCP_STATUS_DATA_LOSS:
    case PCP_STATUS_RESOURCE_EXHAUSTED:
    case PCP_STATUS_FAILED_PRECONDITION:
    case PCP_STATUS_UNAUTHENTICATED:
    case PCP_STATUS_INCOMPATIBLE:
    case PCP_STATUS_OUT_OF_RANGE:
      return true;
    default:
      return false;
  }
}

// The handlers of pcp_fabric_conn_actions_drain (fabric_glue.c, shared with
// src/sim); |context| is the fabric_conn_t.

static void on_send(void* context, pcp_proto_action_t* a) {
  conn_send(context, &a->frame);
}

static void on_close_action(void* context, pcp_proto_action_t* a) {
  fabric_conn_t* conn = context;
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  pcp_status_code_t code = pcp_status_code(a->status);
  const char* worker = conn->worker ? conn->worker->info.worker_id : "-";
  char reason[512];
  pcp_status_format(a->status, reason, sizeof(reason));
  bool rejected = code == PCP_STATUS_UNAUTHENTICATED ||
                  code == PCP_STATUS_PERMISSION_DENIED ||
                  (!conn->worker && code == PCP_STATUS_INVALID_ARGUMENT);
  if (rejected) {
    atomic_fetch_add(&ep->rejected_joins, 1);
    counter_add(ep->m_rejected, 1);
  }
  if (is_peer_fault(code))
    atomic_fetch_add(&ep->protocol_errors, 1);
  PCP_LOG(code == PCP_STATUS_OK || code == PCP_STATUS_CANCELLED ? PCP_LOG_INFO
                                                                : PCP_LOG_WARN,
          &ep->log,
          "fabric connection closed conn=%llu peer=%s worker=%s "
          "code=%s reason=%s",
          (unsigned long long)conn->id, conn->peer, worker,
          pcp_status_code_string(code), reason);
  conn->close_requested = true;
  conn->close_requested_ns = now_ns(ep);
  try_finish_close(conn);
}

static void on_join_verified(void* context, pcp_proto_action_t* a) {
  (void)a;
  pcp_fabric_join_verified(context);
}

static void on_evict(void* context, pcp_proto_action_t* a) {
  (void)a;
  fabric_conn_t* conn = context;
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  atomic_fetch_add(&ep->evictions, 1);
  counter_add(ep->m_evictions, 1);
  if (conn->worker)
    conn->worker->info.eviction_count++;
  PCP_LOG(PCP_LOG_WARN, &ep->log,
          "fabric worker evicted worker=%s peer=%s silence_limit_ms=%lld",
          conn->worker ? conn->worker->info.worker_id : "-", conn->peer,
          (long long)(ep->timeouts.silence_timeout_ns / 1000000));
}

static void on_program_fetch(void* context, pcp_proto_action_t* a) {
  fabric_conn_t* conn = context;
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  program_t* p = pcp_fabric_program_find(ep, a->program);
  pcp_status_t status =
      p ? pcp_proto_gateway_conn_send_program(
              conn->proto, a->request_id, p->data, p->byte_length, now_ns(ep))
        : pcp_make_status(PCP_STATUS_NOT_FOUND, "program not registered");
  if (status) {
    pcp_status_ignore(
        pcp_proto_gateway_conn_fail(conn->proto, status, now_ns(ep)));
    pcp_status_ignore(status);
  }
}

static void on_program_ready(void* context, pcp_proto_action_t* a) {
  pcp_fabric_program_answer(context, a->program, pcp_ok_status());
}

static void on_program_failed(void* context, pcp_proto_action_t* a) {
  pcp_fabric_program_answer(context, a->program, a->status);
  a->status = pcp_ok_status();
}

static void on_task_progress(void* context, pcp_proto_action_t* a) {
  fabric_conn_t* conn = context;
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  pcp_fabric_task_t* task = pcp_fabric_task_find(ep, a->task_id);
  pcp_proto_task_progress_t progress;
  pcp_status_t status = pcp_proto_task_progress_parse(&a->received, &progress);
  if (status) {
    pcp_status_ignore(status);
    return;
  }
  if (task && task->state == TASK_RUNNING && task->worker == conn->worker) {
    task->progress_state = progress.state;
    if (progress.has_fraction)
      task->progress_fraction = progress.fraction;
    pcp_fabric_task_notify(ep, task, PCP_FABRIC_TASK_EVENT_PROGRESS);
  }
}

static void on_task_result(void* context, pcp_proto_action_t* a) {
  pcp_fabric_task_result_receive(context, a);
}

static void on_task_failed(void* context, pcp_proto_action_t* a) {
  fabric_conn_t* conn = context;
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  pcp_fabric_task_t* task = pcp_fabric_task_find(ep, a->task_id);
  if (task && task->state == TASK_RUNNING && task->worker == conn->worker) {
    pcp_fabric_worker_task_answered(conn->worker, task, true);
    pcp_fabric_task_finish(ep, task, a->status);
    a->status = pcp_ok_status();
  }
}

static void on_peer_draining(void* context, pcp_proto_action_t* a) {
  (void)a;
  fabric_conn_t* conn = context;
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  if (conn->worker) {
    conn->worker->info.state = PCP_FABRIC_WORKER_DRAINING;
    pthread_cond_broadcast(&ep->cv);  // pcp_fabric_workers_wait
    pcp_status_ignore(
        pcp_sched_worker_drain(ep->sched, conn->worker->info.worker_id));
  }
}

static const pcp_fabric_action_handlers_t kConnHandlers = {
    .send = on_send,
    .close = on_close_action,
    .join_verified = on_join_verified,
    .evict = on_evict,
    .program_fetch = on_program_fetch,
    .program_ready = on_program_ready,
    .program_failed = on_program_failed,
    .task_progress = on_task_progress,
    .task_result = on_task_result,
    .task_failed = on_task_failed,
    .task_lost = NULL,  // conn_ended moves every task of the worker
    .peer_draining = on_peer_draining,
};

// The drain, its order and its re-entrancy guard are
// pcp_fabric_conn_actions_drain's (fabric.h).
void pcp_fabric_conn_process_actions(fabric_conn_t* conn) {
  if (pcp_fabric_conn_actions_drain(conn->proto, &conn->in_actions,
                                    &kConnHandlers, conn)) {
    pcp_fabric_conn_ended(conn);
  }
}

// A command or event failed on our side (out of memory): end the connection.
void pcp_fabric_conn_local_failure(fabric_conn_t* conn, pcp_status_t status,
                                   const char* what) {
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  log_status(ep, PCP_LOG_ERROR, status, what);
  pcp_status_ignore(status);
  if (conn->tcp && !conn->tcp_close_called) {
    conn->tcp_close_called = true;
    pcp_tcp_conn_close(conn->tcp);
  }
}

// Counts inbound frames by type from their headers and returns the largest
// payload length announced by a header completed in |data|.
static uint64_t scan_frames(fabric_conn_t* conn, const uint8_t* data,
                            size_t length) {
  uint64_t largest = 0;
  while (length > 0) {
    if (conn->scan_skip > 0) {
      size_t n = conn->scan_skip < length ? (size_t)conn->scan_skip : length;
      conn->scan_skip -= n;
      data += n;
      length -= n;
      continue;
    }
    size_t need = PCP_PROTO_HEADER_BYTE_LENGTH - conn->scan_filled;
    size_t n = need < length ? need : length;
    memcpy(conn->scan_header + conn->scan_filled, data, n);
    conn->scan_filled += n;
    data += n;
    length -= n;
    if (conn->scan_filled == PCP_PROTO_HEADER_BYTE_LENGTH) {
      const uint8_t* h = conn->scan_header;
      uint16_t type = (uint16_t)(h[6] | (h[7] << 8));
      uint64_t payload = 0;
      for (int i = 7; i >= 0; --i) payload = (payload << 8) | h[24 + i];
      pcp_fabric_frame_count(conn->endpoint, 0, type);
      conn->scan_skip = payload;
      conn->scan_filled = 0;
      // Only a real header counts (garbage is proto's to refuse, with its
      // own error: bad magic, bad checksum).
      uint32_t magic = (uint32_t)h[0] | (uint32_t)h[1] << 8 |
                       (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
      if (magic == PCP_PROTO_MAGIC && payload > largest)
        largest = payload;
    }
  }
  return largest;
}

static void on_read(void* user_data, pcp_tcp_conn_t* tcp, const void* data,
                    size_t byte_length) {
  fabric_conn_t* conn = user_data;
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  int64_t start = now_ns(ep);
  pthread_mutex_lock(&ep->mu);
  if (byte_length == 0) {
    pcp_status_t status = pcp_proto_gateway_conn_on_closed(conn->proto, start);
    pcp_status_ignore(status);
    pcp_fabric_conn_process_actions(conn);
    if (!conn->tcp_close_called) {
      conn->tcp_close_called = true;
      pcp_tcp_conn_close(tcp);
    }
  } else {
    atomic_fetch_add_explicit(&ep->bytes_in, byte_length, memory_order_relaxed);
    atomic_fetch_add_explicit(&conn->bytes_in, byte_length,
                              memory_order_relaxed);
    counter_add(ep->m_bytes_in, (double)byte_length);
    pcp_proto_gateway_state_t state = pcp_proto_gateway_conn_state(conn->proto);
    uint64_t largest = 0;
    if (state != PCP_PROTO_GATEWAY_CLOSED) {
      largest = scan_frames(conn, data, byte_length);
    }
    pcp_status_t status = pcp_ok_status();
    if (state < PCP_PROTO_GATEWAY_ACCEPTED &&
        largest > PCP_FABRIC_HANDSHAKE_MAX_PAYLOAD_BYTES) {
      // Before ACCEPT a peer is nobody: it must not make the decoder
      // allocate a payload of the full frame limit (80 MiB by default) per
      // connection. Handshake frames are a few hundred bytes. The answer
      // is the handshake's error frame, REJECT reason 5 (protocol.md s.3),
      // not ERROR: a peer that has not joined only understands REJECT.
      char message[128];
      snprintf(message, sizeof(message),
               "a %llu-byte frame before the handshake finished (limit %u)",
               (unsigned long long)largest,
               PCP_FABRIC_HANDSHAKE_MAX_PAYLOAD_BYTES);
      status = pcp_proto_gateway_conn_reject(
          conn->proto, PCP_PROTO_REJECT_PROTOCOL_VIOLATION, message, start);
      // A REJECT closes as PERMISSION_DENIED, which is not counted as a
      // peer fault; this one is the peer's protocol error.
      atomic_fetch_add(&ep->protocol_errors, 1);
    } else {
      status = pcp_proto_gateway_conn_on_bytes(conn->proto, data, byte_length,
                                               start);
    }
    pcp_fabric_conn_process_actions(conn);
    if (status)
      pcp_fabric_conn_local_failure(conn, status, "fabric: on_bytes");
  }
  pcp_fabric_unlock_and_notify(ep);
  atomic_fetch_add_explicit(&ep->events_handled, 1, memory_order_relaxed);
  pcp_fabric_hist_record(ep, now_ns(ep) - start);
}

static void on_writable(void* user_data, pcp_tcp_conn_t* tcp) {
  (void)tcp;
  fabric_conn_t* conn = user_data;
  flush_writes(conn);
  try_finish_close(conn);
}

static void conn_free(fabric_conn_t* conn) {
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  while (conn->queue_head) {
    write_rec_t* r = conn->queue_head;
    conn->queue_head = r->next;
    r->all_submitted = true;
    if (r->pending == 0)
      write_rec_free(r);
  }
  pcp_proto_gateway_conn_release(conn->proto);
  if (conn->prev) {
    conn->prev->next = conn->next;
  } else {
    ep->conns = conn->next;
  }
  if (conn->next)
    conn->next->prev = conn->prev;
  ep->conn_count--;
  if (ep->m_connections)
    pcp_obs_gauge_set(ep->m_connections, ep->conn_count);
  pcp_allocator_free(ep->allocator, conn);
}

static void on_close(void* user_data, pcp_tcp_conn_t* tcp,
                     pcp_status_t status) {
  (void)tcp;
  fabric_conn_t* conn = user_data;
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  pthread_mutex_lock(&ep->mu);
  conn->tcp = NULL;
  if (pcp_proto_gateway_conn_state(conn->proto) != PCP_PROTO_GATEWAY_CLOSED) {
    pcp_status_ignore(
        pcp_proto_gateway_conn_on_closed(conn->proto, now_ns(ep)));
  }
  pcp_fabric_conn_process_actions(conn);
  pcp_fabric_conn_ended(conn);
  pcp_status_ignore(status);
  conn_free(conn);
  pcp_fabric_unlock_and_notify(ep);
}

void pcp_fabric_conn_accept(void* user_data, pcp_tcp_listener_t* listener,
                            pcp_tcp_conn_t* tcp) {
  (void)listener;
  pcp_fabric_endpoint_t* ep = user_data;
  pthread_mutex_lock(&ep->mu);
  if (ep->stopping || ep->conn_count >= ep->options.max_connections) {
    PCP_LOG(PCP_LOG_WARN, &ep->log,
            "fabric connection refused peer=%s reason=%s",
            pcp_tcp_conn_peer_address(tcp),
            ep->stopping ? "stopping" : "connection limit");
    pcp_tcp_conn_close(tcp);
    pthread_mutex_unlock(&ep->mu);
    return;
  }
  void* p = NULL;
  pcp_status_t status =
      pcp_allocator_calloc(ep->allocator, sizeof(fabric_conn_t), &p);
  fabric_conn_t* conn = p;
  pcp_proto_gateway_config_t config = {
      .limits = ep->options.limits,
      .heartbeat_interval_ms = ep->options.heartbeat_interval_ms,
      .join_token = ep->token,
      .join_token_length = ep->token_length,
      .software = ep->software,
  };
  if (!status)
    status = pcp_proto_random_bytes(config.nonce, sizeof(config.nonce));
  if (!status) {
    status = pcp_proto_gateway_conn_create(&config, now_ns(ep), ep->allocator,
                                           &conn->proto);
  }
  if (!status) {
    conn->endpoint = ep;
    conn->tcp = tcp;
    conn->id = ++ep->next_conn_id;
    copy_text(conn->peer, sizeof(conn->peer), pcp_tcp_conn_peer_address(tcp));
    pcp_tcp_conn_handlers_t handlers = {
        .read = on_read,
        .writable = on_writable,
        .close = on_close,
        .user_data = conn,
    };
    status = pcp_tcp_conn_start(tcp, &handlers);
  }
  if (status) {
    log_status(ep, PCP_LOG_WARN, status, "fabric: accept");
    pcp_status_ignore(status);
    if (conn) {
      pcp_proto_gateway_conn_release(conn->proto);
      pcp_allocator_free(ep->allocator, conn);
    }
    pcp_tcp_conn_close(tcp);
    pthread_mutex_unlock(&ep->mu);
    return;
  }
  conn->next = ep->conns;
  if (ep->conns)
    ep->conns->prev = conn;
  ep->conns = conn;
  ep->conn_count++;
  if (ep->m_connections)
    pcp_obs_gauge_set(ep->m_connections, ep->conn_count);
  pthread_mutex_unlock(&ep->mu);
}
