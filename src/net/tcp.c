// SPDX-License-Identifier: Apache-2.0
//
// TCP listeners and connections over libuv streams: connect with timeout,
// zero-copy writes behind a bounded send queue, reads from the loop's shared
// buffer, half-close and exactly-once close callbacks.

#include <stdio.h>
#include <string.h>

#include "net/net_impl.h"

//===----------------------------------------------------------------------===//
// Addresses to sockaddr
//===----------------------------------------------------------------------===//

// Literal (or "localhost") to sockaddr; INVALID_ARGUMENT for a name.
static pcp_status_t literal_sockaddr(const pcp_net_address_t* address,
                                     struct sockaddr_storage* out) {
  memset(out, 0, sizeof(*out));
  const char* host = address->host;
  if (strcmp(host, "localhost") == 0) {
    host = "127.0.0.1";
  }
  if (uv_ip4_addr(host, address->port, (struct sockaddr_in*)out) == 0) {
    return pcp_ok_status();
  }
  if (strchr(host, ':') &&
      uv_ip6_addr(host, address->port, (struct sockaddr_in6*)out) == 0) {
    return pcp_ok_status();
  }
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                         "'%s' is not an IP address literal", address->host);
}

// Formats |sa| as "host:port" / "[host]:port" into |buffer|.
static void format_sockaddr(const struct sockaddr* sa, char* buffer,
                            size_t capacity) {
  pcp_net_address_t address;
  memset(&address, 0, sizeof(address));
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in* in = (const struct sockaddr_in*)sa;
    (void)uv_ip4_name(in, address.host, sizeof(address.host));
    address.port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6* in6 = (const struct sockaddr_in6*)sa;
    (void)uv_ip6_name(in6, address.host, sizeof(address.host));
    address.port = ntohs(in6->sin6_port);
  } else {
    snprintf(buffer, capacity, "?");
    return;
  }
  (void)pcp_net_address_format(&address, buffer, capacity);
}

//===----------------------------------------------------------------------===//
// Connections
//===----------------------------------------------------------------------===//

typedef enum conn_state_e {
  CONN_CONNECTING = 0,
  CONN_OPEN = 1,
  CONN_CLOSING = 2,
} conn_state_t;

struct pcp_tcp_conn_t {
  pcp_net_object_t base;
  pcp_loop_t* loop;
  uv_tcp_t uv;
  conn_state_t state;
  pcp_tcp_conn_handlers_t handlers;
  bool started;
  bool reading;
  bool eof;
  bool shutdown_requested;

  // Send queue accounting (zero copy: these bytes live in caller buffers).
  size_t queued_bytes;
  size_t queued_writes;
  size_t high_water_bytes;
  size_t max_writes;
  bool want_writable;

  pcp_tcp_conn_stats_t stats;
  char peer[PCP_NET_ADDRESS_TEXT_CAPACITY];

  // Teardown: the struct is freed when every handle and request below is
  // done; then exactly one final callback runs (connect failure or close).
  int pending;  // open handles + in-flight getaddrinfo
  pcp_status_t final_status;
  bool final_status_set;

  // Connect phase.
  bool connect_reported;  // connect_fn has run (or never will)
  bool timed_out;
  bool aborted;
  bool resolving;
  bool timer_open;
  uint64_t timeout_ms;
  uv_timer_t timer;
  uv_connect_t connect_req;
  uv_getaddrinfo_t resolve_req;
  pcp_tcp_connect_fn_t connect_fn;
  void* connect_user_data;
};

typedef struct write_req_t {
  uv_write_t uv;
  pcp_tcp_conn_t* conn;
  pcp_tcp_write_fn_t fn;
  void* user_data;
  size_t byte_length;
} write_req_t;

typedef struct shutdown_req_t {
  uv_shutdown_t uv;
  pcp_tcp_conn_t* conn;
  pcp_tcp_write_fn_t fn;
  void* user_data;
} shutdown_req_t;

static void set_final_status(pcp_tcp_conn_t* conn, pcp_status_t status) {
  if (conn->final_status_set) {
    pcp_status_ignore(status);
    return;
  }
  conn->final_status = status;
  conn->final_status_set = true;
}

static void conn_finalize(pcp_tcp_conn_t* conn) {
  pcp_status_t status = conn->final_status;
  if (!conn->connect_reported) {
    conn->connect_reported = true;
    if (!status) {
      status = pcp_make_status(PCP_STATUS_CANCELLED, "connect cancelled");
    }
    conn->connect_fn(conn->connect_user_data, NULL, status);
  } else if (conn->handlers.close) {
    conn->handlers.close(conn->handlers.user_data, conn, status);
  } else {
    pcp_status_ignore(status);
  }
  pcp_net_free(conn->loop, conn);
}

static void conn_release_pending(pcp_tcp_conn_t* conn) {
  if (--conn->pending == 0) {
    conn_finalize(conn);
  }
}

static void on_conn_handle_closed(uv_handle_t* handle) {
  conn_release_pending((pcp_tcp_conn_t*)handle->data);
}

// Starts closing every handle of |conn|; |status| (consumed) becomes the
// final status unless one was already recorded.
static void conn_begin_close(pcp_tcp_conn_t* conn, pcp_status_t status) {
  set_final_status(conn, status);
  conn->state = CONN_CLOSING;
  if (conn->timer_open && !uv_is_closing((uv_handle_t*)&conn->timer)) {
    (void)uv_timer_stop(&conn->timer);
    uv_close((uv_handle_t*)&conn->timer, on_conn_handle_closed);
  }
  if (!uv_is_closing((uv_handle_t*)&conn->uv)) {
    uv_close((uv_handle_t*)&conn->uv, on_conn_handle_closed);
  }
}

static void abort_conn(pcp_net_object_t* object) {
  pcp_tcp_conn_t* conn = (pcp_tcp_conn_t*)object;
  if (conn->aborted) {
    return;
  }
  conn->aborted = true;
  if (conn->resolving) {
    (void)uv_cancel((uv_req_t*)&conn->resolve_req);
  }
  conn_begin_close(
      conn, pcp_make_status(PCP_STATUS_CANCELLED, "the loop was released"));
}

// Returns NULL when out of memory.
static pcp_tcp_conn_t* conn_allocate(pcp_loop_t* loop) {
  pcp_tcp_conn_t* conn = NULL;
  pcp_status_t status = pcp_net_calloc(loop, sizeof(*conn), (void**)&conn);
  if (status || !conn) {
    pcp_status_ignore(status);
    return NULL;
  }
  conn->base.abort = abort_conn;
  conn->loop = loop;
  conn->high_water_bytes = PCP_TCP_DEFAULT_SEND_HIGH_WATER_BYTES;
  conn->max_writes = PCP_TCP_DEFAULT_SEND_MAX_WRITES;
  snprintf(conn->peer, sizeof(conn->peer), "?");
  PCP_ASSERT(uv_tcp_init(&loop->uv, &conn->uv) == 0);
  conn->uv.data = conn;
  conn->pending = 1;
  return conn;
}

static void conn_fill_peer(pcp_tcp_conn_t* conn) {
  struct sockaddr_storage storage;
  int length = (int)sizeof(storage);
  if (uv_tcp_getpeername(&conn->uv, (struct sockaddr*)&storage, &length) == 0) {
    format_sockaddr((struct sockaddr*)&storage, conn->peer, sizeof(conn->peer));
  }
}

//===----------------------------------------------------------------------===//
// Reading
//===----------------------------------------------------------------------===//

static void on_read(uv_stream_t* stream, ssize_t nread,
                    const uv_buf_t* buffer) {
  pcp_tcp_conn_t* conn = (pcp_tcp_conn_t*)stream->data;
  if (nread > 0) {
    conn->stats.bytes_in += (uint64_t)nread;
    conn->handlers.read(conn->handlers.user_data, conn, buffer->base,
                        (size_t)nread);
  }
  pcp_net_read_buffer_release(conn->loop, buffer);
  if (nread == UV_EOF) {
    // libuv stops reading by itself at EOF.
    conn->eof = true;
    conn->reading = false;
    conn->handlers.read(conn->handlers.user_data, conn, NULL, 0);
  } else if (nread < 0 && conn->state != CONN_CLOSING) {
    char what[PCP_NET_ADDRESS_TEXT_CAPACITY + 32];
    snprintf(what, sizeof(what), "reading from %s", conn->peer);
    conn->reading = false;
    conn_begin_close(conn, pcp_net_status_from_uv((int)nread, what));
  }
}

pcp_status_t pcp_tcp_conn_start(pcp_tcp_conn_t* conn,
                                const pcp_tcp_conn_handlers_t* handlers) {
  if (!handlers->read) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "pcp_tcp_conn_start: no read handler");
  }
  if (conn->started || conn->state != CONN_OPEN) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "pcp_tcp_conn_start: %s",
                           conn->started ? "already started" : "not open");
  }
  conn->handlers = *handlers;
  conn->started = true;
  return pcp_tcp_conn_read_resume(conn);
}

void pcp_tcp_conn_read_pause(pcp_tcp_conn_t* conn) {
  if (!conn->reading) {
    return;
  }
  conn->reading = false;
  (void)uv_read_stop((uv_stream_t*)&conn->uv);
}

pcp_status_t pcp_tcp_conn_read_resume(pcp_tcp_conn_t* conn) {
  if (!conn->started || conn->state != CONN_OPEN) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "resume reading from %s: not started or closing",
                           conn->peer);
  }
  if (conn->reading || conn->eof) {
    return pcp_ok_status();
  }
  int err = uv_read_start((uv_stream_t*)&conn->uv, pcp_net_read_buffer_alloc,
                          on_read);
  if (err != 0) {
    return pcp_net_status_from_uv(err, "uv_read_start");
  }
  conn->reading = true;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Writing
//===----------------------------------------------------------------------===//

static pcp_status_t status_from_completion(int uv_status, const char* what,
                                           const char* peer) {
  if (uv_status == 0) {
    return pcp_ok_status();
  }
  if (uv_status == UV_ECANCELED) {
    return pcp_make_status(PCP_STATUS_CANCELLED,
                           "%s %s: the connection closed first", what, peer);
  }
  char text[PCP_NET_ADDRESS_TEXT_CAPACITY + 32];
  snprintf(text, sizeof(text), "%s %s", what, peer);
  return pcp_net_status_from_uv(uv_status, text);
}

static void maybe_notify_writable(pcp_tcp_conn_t* conn) {
  if (!conn->want_writable || conn->state != CONN_OPEN) {
    return;
  }
  if (conn->queued_bytes > conn->high_water_bytes / 2 ||
      conn->queued_writes >= conn->max_writes) {
    return;
  }
  conn->want_writable = false;
  if (conn->handlers.writable) {
    conn->handlers.writable(conn->handlers.user_data, conn);
  }
}

static void on_write(uv_write_t* uv_req, int uv_status) {
  write_req_t* req = (write_req_t*)uv_req;
  pcp_tcp_conn_t* conn = req->conn;
  conn->queued_bytes -= req->byte_length;
  --conn->queued_writes;
  if (uv_status == 0) {
    conn->stats.bytes_out += req->byte_length;
  }
  pcp_status_t status;
  if (uv_status == UV_ECANCELED && conn->final_status_set &&
      conn->final_status) {
    // Cancelled because an I/O error closed the connection: report that
    // error, which says more than CANCELLED.
    status = pcp_status_clone(conn->final_status);
  } else {
    status = status_from_completion(uv_status, "writing to", conn->peer);
  }
  // A failed write (reset, broken pipe) ends the connection: the close
  // handler reports the same error. Recorded before the write callback so
  // that a pcp_tcp_conn_close from inside it does not turn it into OK.
  if (status && uv_status != UV_ECANCELED && conn->state != CONN_CLOSING) {
    conn_begin_close(conn, pcp_status_clone(status));
  }
  if (req->fn) {
    req->fn(req->user_data, conn, status);
  } else {
    pcp_status_ignore(status);
  }
  pcp_net_free(conn->loop, req);
  maybe_notify_writable(conn);
}

pcp_status_t pcp_tcp_conn_write(pcp_tcp_conn_t* conn,
                                const pcp_tcp_buffer_t* buffers,
                                size_t buffer_count,
                                pcp_tcp_write_fn_t write_fn, void* user_data) {
  if (buffer_count == 0 || buffer_count > PCP_TCP_MAX_WRITE_BUFFERS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "write of %zu buffers (1 to %d allowed)",
                           buffer_count, PCP_TCP_MAX_WRITE_BUFFERS);
  }
  if (conn->state != CONN_OPEN || conn->shutdown_requested) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "write to %s: connection %s", conn->peer,
                           conn->state == CONN_OPEN ? "shut down" : "closing");
  }
  if (conn->queued_bytes >= conn->high_water_bytes ||
      conn->queued_writes >= conn->max_writes) {
    conn->want_writable = true;
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "write to %s: send queue full (%zu bytes in %zu "
                           "writes; high water %zu bytes, %zu writes)",
                           conn->peer, conn->queued_bytes, conn->queued_writes,
                           conn->high_water_bytes, conn->max_writes);
  }
  uv_buf_t uv_buffers[PCP_TCP_MAX_WRITE_BUFFERS];
  size_t total = 0;
  for (size_t i = 0; i < buffer_count; ++i) {
    if (buffers[i].byte_length > (size_t)UINT32_MAX * 4 ||
        total + buffers[i].byte_length < total) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "write to %s: buffer too large", conn->peer);
    }
    total += buffers[i].byte_length;
    // uv_buf_t is {char* base; size_t len} on Unix; libuv never writes
    // through |base| for a write.
    uv_buffers[i].base = pcp_net_drop_const(buffers[i].data);
    uv_buffers[i].len = buffers[i].byte_length;
  }
  write_req_t* req = NULL;
  PCP_RETURN_IF_ERROR(pcp_net_calloc(conn->loop, sizeof(*req), (void**)&req),
                      "allocating a write request");
  req->conn = conn;
  req->fn = write_fn;
  req->user_data = user_data;
  req->byte_length = total;
  int err = uv_write(&req->uv, (uv_stream_t*)&conn->uv, uv_buffers,
                     (unsigned)buffer_count, on_write);
  if (err != 0) {
    pcp_net_free(conn->loop, req);
    return status_from_completion(err, "writing to", conn->peer);
  }
  conn->queued_bytes += total;
  ++conn->queued_writes;
  if (conn->queued_bytes >= conn->high_water_bytes) {
    conn->want_writable = true;
  }
  return pcp_ok_status();
}

size_t pcp_tcp_conn_send_queue_byte_length(pcp_tcp_conn_t* conn) {
  return conn->queued_bytes;
}

void pcp_tcp_conn_set_send_limits(pcp_tcp_conn_t* conn, size_t high_water_bytes,
                                  size_t max_writes) {
  conn->high_water_bytes = high_water_bytes ? high_water_bytes : 1;
  conn->max_writes = max_writes ? max_writes : 1;
}

static void on_shutdown(uv_shutdown_t* uv_req, int uv_status) {
  shutdown_req_t* req = (shutdown_req_t*)uv_req;
  pcp_tcp_conn_t* conn = req->conn;
  pcp_status_t status =
      status_from_completion(uv_status, "shutting down", conn->peer);
  if (req->fn) {
    req->fn(req->user_data, conn, status);
  } else {
    pcp_status_ignore(status);
  }
  pcp_net_free(conn->loop, req);
}

pcp_status_t pcp_tcp_conn_shutdown(pcp_tcp_conn_t* conn, pcp_tcp_write_fn_t fn,
                                   void* user_data) {
  if (conn->state != CONN_OPEN || conn->shutdown_requested) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "shutdown of %s: already shut down or closing",
                           conn->peer);
  }
  shutdown_req_t* req = NULL;
  PCP_RETURN_IF_ERROR(pcp_net_calloc(conn->loop, sizeof(*req), (void**)&req),
                      "allocating a shutdown request");
  req->conn = conn;
  req->fn = fn;
  req->user_data = user_data;
  int err = uv_shutdown(&req->uv, (uv_stream_t*)&conn->uv, on_shutdown);
  if (err != 0) {
    pcp_net_free(conn->loop, req);
    return status_from_completion(err, "shutting down", conn->peer);
  }
  conn->shutdown_requested = true;
  return pcp_ok_status();
}

void pcp_tcp_conn_close(pcp_tcp_conn_t* conn) {
  if (conn->state == CONN_CLOSING) {
    return;
  }
  conn->reading = false;
  conn_begin_close(conn, pcp_ok_status());
}

pcp_status_t pcp_tcp_conn_set_nodelay(pcp_tcp_conn_t* conn, bool enable) {
  int err = uv_tcp_nodelay(&conn->uv, enable ? 1 : 0);
  return err ? pcp_net_status_from_uv(err, "TCP_NODELAY") : pcp_ok_status();
}

pcp_status_t pcp_tcp_conn_set_keepalive(pcp_tcp_conn_t* conn, bool enable,
                                        uint32_t idle_s) {
  int err = uv_tcp_keepalive(&conn->uv, enable ? 1 : 0, idle_s ? idle_s : 60);
  return err ? pcp_net_status_from_uv(err, "SO_KEEPALIVE") : pcp_ok_status();
}

void pcp_tcp_conn_stats(pcp_tcp_conn_t* conn, pcp_tcp_conn_stats_t* out_stats) {
  *out_stats = conn->stats;
}

const char* pcp_tcp_conn_peer_address(pcp_tcp_conn_t* conn) {
  return conn->peer;
}

pcp_loop_t* pcp_tcp_conn_loop(pcp_tcp_conn_t* conn) {
  return conn->loop;
}

//===----------------------------------------------------------------------===//
// Connecting
//===----------------------------------------------------------------------===//

static void connect_fail(pcp_tcp_conn_t* conn, int uv_status) {
  char target[PCP_NET_ADDRESS_TEXT_CAPACITY + 16];
  snprintf(target, sizeof(target), "connect to %s", conn->peer);
  pcp_status_t status;
  if (conn->aborted) {
    status = pcp_make_status(PCP_STATUS_CANCELLED, "%s: the loop was released",
                             target);
  } else if (conn->timed_out) {
    status = pcp_make_status(PCP_STATUS_DEADLINE_EXCEEDED,
                             "%s: no answer within %llu ms", target,
                             (unsigned long long)conn->timeout_ms);
  } else {
    status = pcp_net_status_from_uv(uv_status, target);
  }
  conn_begin_close(conn, status);
}

static void on_connect(uv_connect_t* req, int uv_status) {
  pcp_tcp_conn_t* conn = (pcp_tcp_conn_t*)req->data;
  if (uv_status != 0 || conn->timed_out || conn->aborted) {
    // Also the path of a timeout or an abort, which closed the socket and
    // so completed the connect with ECANCELED; connect_fail names the
    // real reason. A status recorded earlier (the abort's) wins.
    connect_fail(conn, uv_status ? uv_status : UV_ECANCELED);
    return;
  }
  if (conn->timer_open) {
    (void)uv_timer_stop(&conn->timer);
    uv_close((uv_handle_t*)&conn->timer, on_conn_handle_closed);
    conn->timer_open = false;
  }
  conn->state = CONN_OPEN;
  conn_fill_peer(conn);
  (void)uv_tcp_nodelay(&conn->uv, 1);
  conn->connect_reported = true;
  conn->connect_fn(conn->connect_user_data, conn, pcp_ok_status());
}

static void on_connect_timeout(uv_timer_t* timer) {
  pcp_tcp_conn_t* conn = (pcp_tcp_conn_t*)timer->data;
  conn->timed_out = true;
  if (conn->resolving) {
    // The resolver callback reports it (cancelled or not, it runs once).
    (void)uv_cancel((uv_req_t*)&conn->resolve_req);
    return;
  }
  // Closing the socket makes libuv complete the connect with ECANCELED;
  // on_connect turns that into DEADLINE_EXCEEDED.
  if (!uv_is_closing((uv_handle_t*)&conn->uv)) {
    conn->state = CONN_CLOSING;
    uv_close((uv_handle_t*)&conn->uv, on_conn_handle_closed);
  }
}

static int start_connect(pcp_tcp_conn_t* conn, const struct sockaddr* sa) {
  conn->connect_req.data = conn;
  return uv_tcp_connect(&conn->connect_req, &conn->uv, sa, on_connect);
}

static void on_resolved(uv_getaddrinfo_t* req, int uv_status,
                        struct addrinfo* result) {
  pcp_tcp_conn_t* conn = (pcp_tcp_conn_t*)req->data;
  conn->resolving = false;
  if (conn->aborted || conn->timed_out || uv_status != 0 || !result) {
    connect_fail(conn, uv_status ? uv_status : UV_EAI_NONAME);
  } else {
    int err = start_connect(conn, result->ai_addr);
    if (err != 0) {
      connect_fail(conn, err);
    }
  }
  if (result) {
    uv_freeaddrinfo(result);
  }
  conn_release_pending(conn);
}

pcp_status_t pcp_tcp_connect(pcp_loop_t* loop, const pcp_net_address_t* address,
                             uint64_t timeout_ms,
                             pcp_tcp_connect_fn_t connect_fn, void* user_data) {
  char text[PCP_NET_ADDRESS_TEXT_CAPACITY];
  (void)pcp_net_address_format(address, text, sizeof(text));
  if (!connect_fn) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "connect to %s: no callback", text);
  }
  if (address->port == 0 || address->host[0] == '\0') {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "connect to %s: needs a host and a non-zero port",
                           text);
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_net_check_not_releasing(loop, "pcp_tcp_connect"));
  bool literal = pcp_net_host_is_literal(address->host) ||
                 strcmp(address->host, "localhost") == 0;
  struct sockaddr_storage storage;
  if (literal) {
    PCP_RETURN_IF_ERROR_BARE(literal_sockaddr(address, &storage));
  }

  pcp_tcp_conn_t* conn = conn_allocate(loop);
  if (!conn) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "connect to %s: allocating the connection", text);
  }
  conn->state = CONN_CONNECTING;
  conn->connect_fn = connect_fn;
  conn->connect_user_data = user_data;
  conn->timeout_ms = timeout_ms;
  snprintf(conn->peer, sizeof(conn->peer), "%s", text);

  int err = 0;
  if (literal) {
    err = start_connect(conn, (const struct sockaddr*)&storage);
  } else {
    char port[8];
    snprintf(port, sizeof(port), "%u", (unsigned)address->port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    conn->resolve_req.data = conn;
    err = uv_getaddrinfo(&loop->uv, &conn->resolve_req, on_resolved,
                         address->host, port, &hints);
    if (err == 0) {
      conn->resolving = true;
      ++conn->pending;
    }
  }
  if (err != 0) {
    // Nothing started: free silently, the callback never runs.
    conn->connect_reported = true;
    conn_begin_close(conn, pcp_ok_status());
    char what[PCP_NET_ADDRESS_TEXT_CAPACITY + 16];
    snprintf(what, sizeof(what), "connect to %s", text);
    return pcp_net_status_from_uv(err, what);
  }
  if (timeout_ms > 0) {
    PCP_ASSERT(uv_timer_init(&loop->uv, &conn->timer) == 0);
    conn->timer.data = conn;
    conn->timer_open = true;
    ++conn->pending;
    // Count the timeout from now, not from the loop's cached time: that is
    // stale when this is called after long work (regression: a connect made
    // after filling a 256 MiB buffer under ASan timed out at once).
    uv_update_time(&loop->uv);
    PCP_ASSERT(
        uv_timer_start(&conn->timer, on_connect_timeout, timeout_ms, 0) == 0);
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Listening
//===----------------------------------------------------------------------===//

struct pcp_tcp_listener_t {
  pcp_net_object_t base;
  pcp_loop_t* loop;
  uv_tcp_t uv;
  uint16_t port;
  pcp_tcp_accept_fn_t accept_fn;
  void* user_data;
  int pending;  // open handles: |uv| and, while busy, |reject|
  // Out of memory at accept: the peer is accepted into this embedded handle
  // and closed at once, so the listener keeps going (libuv stops polling a
  // listener until its pending connection is accepted). Rejected: leaving
  // it pending, which stalls the listener for every later peer.
  uv_tcp_t reject;
  bool reject_busy;
  bool accept_waiting;  // a connection arrived while |reject| was closing
};

static void listener_release_pending(pcp_tcp_listener_t* listener) {
  if (--listener->pending == 0) {
    pcp_net_free(listener->loop, listener);
  }
}

static void on_listener_closed(uv_handle_t* handle) {
  listener_release_pending((pcp_tcp_listener_t*)handle->data);
}

void pcp_tcp_listener_close(pcp_tcp_listener_t* listener) {
  if (!listener || uv_is_closing((uv_handle_t*)&listener->uv)) {
    return;
  }
  uv_close((uv_handle_t*)&listener->uv, on_listener_closed);
}

static void abort_listener(pcp_net_object_t* object) {
  pcp_tcp_listener_close((pcp_tcp_listener_t*)object);
}

static void on_connection(uv_stream_t* server, int uv_status);

static void on_reject_closed(uv_handle_t* handle) {
  pcp_tcp_listener_t* listener = (pcp_tcp_listener_t*)handle->data;
  listener->reject_busy = false;
  bool retry =
      listener->accept_waiting && !uv_is_closing((uv_handle_t*)&listener->uv);
  listener->accept_waiting = false;
  if (retry) {
    on_connection((uv_stream_t*)&listener->uv, 0);
  }
  listener_release_pending(listener);
}

static void reject_connection(pcp_tcp_listener_t* listener) {
  if (listener->reject_busy) {
    listener->accept_waiting = true;
    return;
  }
  PCP_ASSERT(uv_tcp_init(&listener->loop->uv, &listener->reject) == 0);
  listener->reject.data = listener;
  listener->reject_busy = true;
  ++listener->pending;
  (void)uv_accept((uv_stream_t*)&listener->uv, (uv_stream_t*)&listener->reject);
  uv_close((uv_handle_t*)&listener->reject, on_reject_closed);
}

static void on_connection(uv_stream_t* server, int uv_status) {
  pcp_tcp_listener_t* listener = (pcp_tcp_listener_t*)server->data;
  pcp_loop_t* loop = listener->loop;
  if (uv_status != 0) {
    // EMFILE and friends: the listener stays up, the peer waits in the
    // backlog until descriptors free up.
    pcp_status_t status = pcp_net_status_from_uv(uv_status, "accept");
    pcp_log_status(PCP_LOG_WARN, NULL, status, "tcp listener");
    pcp_status_ignore(status);
    return;
  }
  pcp_tcp_conn_t* conn = conn_allocate(loop);
  if (!conn) {
    PCP_LOG(PCP_LOG_WARN, NULL,
            "tcp accept on port %u: out of memory, connection dropped",
            (unsigned)listener->port);
    reject_connection(listener);
    return;
  }
  conn->connect_reported = true;
  int err = uv_accept(server, (uv_stream_t*)&conn->uv);
  if (err != 0) {
    // No handlers yet: the connection goes away without a callback.
    conn_begin_close(conn, pcp_ok_status());
    return;
  }
  conn->state = CONN_OPEN;
  (void)uv_tcp_nodelay(&conn->uv, 1);
  conn_fill_peer(conn);
  listener->accept_fn(listener->user_data, listener, conn);
}

pcp_status_t pcp_tcp_listen(pcp_loop_t* loop, const pcp_net_address_t* address,
                            int32_t backlog, pcp_tcp_accept_fn_t accept_fn,
                            void* user_data,
                            pcp_tcp_listener_t** out_listener) {
  *out_listener = NULL;
  if (!accept_fn) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "pcp_tcp_listen: no accept callback");
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_net_check_not_releasing(loop, "pcp_tcp_listen"));
  struct sockaddr_storage storage;
  PCP_RETURN_IF_ERROR_BARE(literal_sockaddr(address, &storage));
  char text[PCP_NET_ADDRESS_TEXT_CAPACITY];
  (void)pcp_net_address_format(address, text, sizeof(text));

  pcp_tcp_listener_t* listener = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_net_calloc(loop, sizeof(*listener), (void**)&listener),
      "allocating a listener");
  listener->base.abort = abort_listener;
  listener->loop = loop;
  listener->accept_fn = accept_fn;
  listener->user_data = user_data;
  PCP_ASSERT(uv_tcp_init(&loop->uv, &listener->uv) == 0);
  listener->uv.data = listener;
  listener->pending = 1;
  // libuv may report EADDRINUSE from bind or defer it to listen.
  int err = uv_tcp_bind(&listener->uv, (const struct sockaddr*)&storage, 0);
  if (err == 0) {
    err = uv_listen((uv_stream_t*)&listener->uv, backlog > 0 ? backlog : 511,
                    on_connection);
  }
  struct sockaddr_storage bound;
  int length = (int)sizeof(bound);
  if (err == 0) {
    err = uv_tcp_getsockname(&listener->uv, (struct sockaddr*)&bound, &length);
  }
  if (err != 0) {
    uv_close((uv_handle_t*)&listener->uv, on_listener_closed);
    char what[PCP_NET_ADDRESS_TEXT_CAPACITY + 16];
    snprintf(what, sizeof(what), "listen on %s", text);
    return pcp_net_status_from_uv(err, what);
  }
  listener->port = ntohs(bound.ss_family == AF_INET6
                             ? ((struct sockaddr_in6*)&bound)->sin6_port
                             : ((struct sockaddr_in*)&bound)->sin_port);
  *out_listener = listener;
  return pcp_ok_status();
}

uint16_t pcp_tcp_listener_port(pcp_tcp_listener_t* listener) {
  return listener->port;
}
