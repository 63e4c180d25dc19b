// SPDX-License-Identifier: Apache-2.0
//
// TCP on 127.0.0.1 (and ::1): echo round trips of 1 B, 1 MiB and 64 MiB
// with content and memory checks, 200 connections at once, a peer closing
// mid-write, refused and timed-out connects, send-queue backpressure,
// counters, peer addresses and cancellation by loop release.

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "net/net.h"

//===----------------------------------------------------------------------===//
// Loop helpers
//===----------------------------------------------------------------------===//

typedef struct test_loop_t {
  pcp_allocator_counting_t counter;
  pcp_loop_t* loop;
} test_loop_t;

static void test_loop_initialize(test_loop_t* t) {
  pcp_allocator_counting_initialize(pcp_allocator_system(), &t->counter);
  pcp_loop_options_t options = pcp_loop_options_default();
  options.allocator = pcp_allocator_counting(&t->counter);
  PCP_CHECK_OK(pcp_loop_create(&options, &t->loop));
}

static void test_loop_release(test_loop_t* t) {
  pcp_loop_release(t->loop);
  // Everything the module allocated came back.
  assert_int_equal(atomic_load(&t->counter.live_bytes), 0);
}

static bool deadline_expired;

static void on_deadline(void* user_data, pcp_loop_timer_t* timer,
                        pcp_status_code_t code) {
  PCP_UNUSED(timer);
  if (code == PCP_STATUS_OK) {
    deadline_expired = true;
    pcp_loop_stop((pcp_loop_t*)user_data);
  }
}

static void run_bounded(pcp_loop_t* loop, uint64_t limit_ms) {
  deadline_expired = false;
  pcp_loop_timer_t* timer = NULL;
  PCP_CHECK_OK(
      pcp_loop_timer_start(loop, limit_ms, 0, on_deadline, loop, &timer));
  PCP_CHECK_OK(pcp_loop_run(loop));
  if (deadline_expired) {
    fail_msg("loop did not stop within %llu ms", (unsigned long long)limit_ms);
  }
  pcp_loop_timer_cancel(timer);
}

typedef struct run_for_t {
  pcp_loop_t* loop;
  bool fired;
} run_for_t;

static void on_run_for(void* user_data, pcp_loop_timer_t* timer,
                       pcp_status_code_t code) {
  PCP_UNUSED(timer);
  run_for_t* r = (run_for_t*)user_data;
  if (code == PCP_STATUS_OK) {
    r->fired = true;
    pcp_loop_stop(r->loop);
  }
}

// Runs |loop| for about |duration_ms| (or until something else stops it).
static void run_for_ms(pcp_loop_t* loop, uint64_t duration_ms) {
  static run_for_t r;
  r = (run_for_t){.loop = loop};
  pcp_loop_timer_t* timer = NULL;
  PCP_CHECK_OK(
      pcp_loop_timer_start(loop, duration_ms, 0, on_run_for, &r, &timer));
  PCP_CHECK_OK(pcp_loop_run(loop));
  // A one-shot timer is gone after its final callback.
  if (!r.fired) {
    pcp_loop_timer_cancel(timer);
  }
}

static pcp_net_address_t address_of(const char* text) {
  pcp_net_address_t address;
  PCP_CHECK_OK(pcp_net_address_parse(pcp_make_cstring_view(text), &address));
  return address;
}

static void assert_code(pcp_status_t status, pcp_status_code_t code) {
  if (pcp_status_code(status) != code) {
    char text[512];
    pcp_status_format(status, text, sizeof(text));
    fail_msg("expected %s, got %s", pcp_status_code_string(code), text);
  }
  pcp_status_ignore(status);
}

//===----------------------------------------------------------------------===//
// Echo server: copies each read into a chunk and writes it back, pausing
// reads while its send queue is over the mark (what bounds its memory).
//===----------------------------------------------------------------------===//

#define ECHO_HIGH_WATER ((size_t)1 << 20)

typedef struct echo_server_t {
  pcp_loop_t* loop;
  pcp_tcp_listener_t* listener;
  int accepted;
  int closed;
  int close_errors;
  int write_errors;
  bool close_on_first_read;  // "peer closes mid-write" mode
  pcp_tcp_conn_stats_t totals;
} echo_server_t;

typedef struct echo_chunk_t {
  pcp_loop_t* loop;
  size_t byte_length;
  uint8_t data[];
} echo_chunk_t;

static void on_echo_written(void* user_data, pcp_tcp_conn_t* conn,
                            pcp_status_t status) {
  echo_chunk_t* chunk = (echo_chunk_t*)user_data;
  echo_server_t* server = NULL;
  PCP_UNUSED(conn);
  PCP_UNUSED(server);
  pcp_status_ignore(status);
  pcp_allocator_free(pcp_loop_allocator(chunk->loop), chunk);
}

static void on_echo_read(void* user_data, pcp_tcp_conn_t* conn,
                         const void* data, size_t byte_length);

static void on_echo_shutdown(void* user_data, pcp_tcp_conn_t* conn,
                             pcp_status_t status) {
  PCP_UNUSED(user_data);
  pcp_status_ignore(status);
  pcp_tcp_conn_close(conn);
}

static void on_echo_read(void* user_data, pcp_tcp_conn_t* conn,
                         const void* data, size_t byte_length) {
  echo_server_t* server = (echo_server_t*)user_data;
  if (server->close_on_first_read) {
    pcp_tcp_conn_close(conn);
    return;
  }
  if (byte_length == 0) {
    // Peer finished: echo what is queued, then FIN, then close.
    pcp_status_t status = pcp_tcp_conn_shutdown(conn, on_echo_shutdown, NULL);
    if (status) {
      pcp_status_ignore(status);
      pcp_tcp_conn_close(conn);
    }
    return;
  }
  echo_chunk_t* chunk = NULL;
  PCP_CHECK_OK(pcp_allocator_malloc(pcp_loop_allocator(server->loop),
                                    sizeof(*chunk) + byte_length,
                                    (void**)&chunk));
  chunk->loop = server->loop;
  chunk->byte_length = byte_length;
  memcpy(chunk->data, data, byte_length);
  pcp_tcp_buffer_t buffer = {chunk->data, byte_length};
  pcp_status_t status =
      pcp_tcp_conn_write(conn, &buffer, 1, on_echo_written, chunk);
  if (status) {
    ++server->write_errors;
    pcp_status_ignore(status);
    pcp_allocator_free(pcp_loop_allocator(server->loop), chunk);
    pcp_tcp_conn_close(conn);
    return;
  }
  if (pcp_tcp_conn_send_queue_byte_length(conn) >= ECHO_HIGH_WATER) {
    pcp_tcp_conn_read_pause(conn);
  }
}

static void on_echo_writable(void* user_data, pcp_tcp_conn_t* conn) {
  PCP_UNUSED(user_data);
  PCP_CHECK_OK(pcp_tcp_conn_read_resume(conn));
}

static void on_echo_close(void* user_data, pcp_tcp_conn_t* conn,
                          pcp_status_t status) {
  echo_server_t* server = (echo_server_t*)user_data;
  pcp_tcp_conn_stats_t stats;
  pcp_tcp_conn_stats(conn, &stats);
  server->totals.bytes_in += stats.bytes_in;
  server->totals.bytes_out += stats.bytes_out;
  ++server->closed;
  if (status) {
    ++server->close_errors;
  }
  pcp_status_ignore(status);
}

static void on_echo_accept(void* user_data, pcp_tcp_listener_t* listener,
                           pcp_tcp_conn_t* conn) {
  PCP_UNUSED(listener);
  echo_server_t* server = (echo_server_t*)user_data;
  ++server->accepted;
  pcp_tcp_conn_set_send_limits(conn, ECHO_HIGH_WATER, 1024);
  pcp_tcp_conn_handlers_t handlers = {
      .read = on_echo_read,
      .writable = on_echo_writable,
      .close = on_echo_close,
      .user_data = server,
  };
  PCP_CHECK_OK(pcp_tcp_conn_start(conn, &handlers));
}

static uint16_t echo_server_start(echo_server_t* server, pcp_loop_t* loop,
                                  const char* address_text) {
  memset(server, 0, sizeof(*server));
  server->loop = loop;
  pcp_net_address_t address = address_of(address_text);
  PCP_CHECK_OK(pcp_tcp_listen(loop, &address, 0, on_echo_accept, server,
                              &server->listener));
  uint16_t port = pcp_tcp_listener_port(server->listener);
  assert_true(port != 0);
  return port;
}

//===----------------------------------------------------------------------===//
// Echo client: one zero-copy write of the whole payload, half-close, read
// the echo into a test-owned buffer, compare at EOF.
//===----------------------------------------------------------------------===//

typedef struct echo_client_t {
  pcp_loop_t* loop;
  int* clients_done;
  int clients_total;
  const uint8_t* payload;
  size_t payload_length;
  uint8_t* received;
  size_t received_length;
  bool mismatch;
  int connects;
  int writes_ok;
  int writes_done;
  int closes;
  pcp_status_code_t write_code;
  pcp_status_code_t close_code;
  pcp_tcp_conn_stats_t stats;
  char peer[PCP_NET_ADDRESS_TEXT_CAPACITY];
} echo_client_t;

static void on_client_written(void* user_data, pcp_tcp_conn_t* conn,
                              pcp_status_t status) {
  echo_client_t* client = (echo_client_t*)user_data;
  ++client->writes_done;
  client->write_code = pcp_status_code(status);
  if (!status) {
    ++client->writes_ok;
    pcp_status_t shutdown = pcp_tcp_conn_shutdown(conn, NULL, NULL);
    pcp_status_ignore(shutdown);
  }
  pcp_status_ignore(status);
}

static void on_client_read(void* user_data, pcp_tcp_conn_t* conn,
                           const void* data, size_t byte_length) {
  echo_client_t* client = (echo_client_t*)user_data;
  if (byte_length == 0) {
    pcp_tcp_conn_close(conn);
    return;
  }
  if (client->received_length + byte_length > client->payload_length) {
    client->mismatch = true;
    pcp_tcp_conn_close(conn);
    return;
  }
  memcpy(client->received + client->received_length, data, byte_length);
  client->received_length += byte_length;
}

static void on_client_close(void* user_data, pcp_tcp_conn_t* conn,
                            pcp_status_t status) {
  echo_client_t* client = (echo_client_t*)user_data;
  ++client->closes;
  client->close_code = pcp_status_code(status);
  pcp_tcp_conn_stats(conn, &client->stats);
  pcp_status_ignore(status);
  if (++*client->clients_done == client->clients_total) {
    pcp_loop_stop(client->loop);
  }
}

static void on_client_connect(void* user_data, pcp_tcp_conn_t* conn,
                              pcp_status_t status) {
  echo_client_t* client = (echo_client_t*)user_data;
  ++client->connects;
  if (status) {
    char text[256];
    pcp_status_format(status, text, sizeof(text));
    pcp_status_ignore(status);
    fail_msg("connect failed: %s", text);
  }
  snprintf(client->peer, sizeof(client->peer), "%s",
           pcp_tcp_conn_peer_address(conn));
  pcp_tcp_conn_handlers_t handlers = {
      .read = on_client_read,
      .close = on_client_close,
      .user_data = client,
  };
  PCP_CHECK_OK(pcp_tcp_conn_start(conn, &handlers));
  pcp_tcp_buffer_t buffer = {client->payload, client->payload_length};
  PCP_CHECK_OK(pcp_tcp_conn_write(conn, &buffer, 1, on_client_written, client));
}

static uint8_t* make_payload(size_t length, uint32_t seed) {
  uint8_t* payload = malloc(length ? length : 1);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < length; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    payload[i] = (uint8_t)x;
  }
  return payload;
}

// One client, one payload of |length| bytes, through an echo server on
// |host| ("127.0.0.1" or "::1"). Returns the loop allocator's peak.
static int64_t echo_round_trip(const char* listen_text, size_t length) {
  test_loop_t t;
  test_loop_initialize(&t);
  echo_server_t server;
  uint16_t port = echo_server_start(&server, t.loop, listen_text);
  int done = 0;
  echo_client_t client = {
      .loop = t.loop,
      .clients_done = &done,
      .clients_total = 1,
      .payload = make_payload(length, (uint32_t)length),
      .payload_length = length,
      .received = malloc(length ? length : 1),
  };
  pcp_net_address_t target = address_of(listen_text);
  target.port = port;
  PCP_CHECK_OK(
      pcp_tcp_connect(t.loop, &target, 5000, on_client_connect, &client));
  run_bounded(t.loop, 60000);
  assert_int_equal(client.connects, 1);
  assert_int_equal(client.writes_ok, 1);
  assert_int_equal(client.closes, 1);
  assert_int_equal(client.close_code, PCP_STATUS_OK);
  assert_false(client.mismatch);
  assert_int_equal(client.received_length, length);
  assert_true(memcmp(client.received, client.payload, length) == 0);
  assert_int_equal(client.stats.bytes_out, length);
  assert_int_equal(client.stats.bytes_in, length);
  // The server side closes after its FIN; give it the turns it needs.
  while (server.closed < 1) {
    run_for_ms(t.loop, 50);
  }
  pcp_tcp_listener_close(server.listener);
  int64_t peak = atomic_load(&t.counter.peak_bytes);
  test_loop_release(&t);
  assert_int_equal(server.accepted, 1);
  assert_int_equal(server.closed, 1);
  assert_int_equal(server.close_errors, 0);
  assert_int_equal(server.totals.bytes_in, length);
  assert_int_equal(server.totals.bytes_out, length);
  free((void*)client.payload);
  free(client.received);
  return peak;
}

//===----------------------------------------------------------------------===//
// Tests
//===----------------------------------------------------------------------===//

static void test_echo_one_byte(void** state) {
  PCP_UNUSED(state);
  (void)echo_round_trip("127.0.0.1:0", 1);
}

static void test_echo_one_mebibyte(void** state) {
  PCP_UNUSED(state);
  (void)echo_round_trip("127.0.0.1:0", (size_t)1 << 20);
}

// 64 MiB through the echo server: the client writes it from its own buffer
// (zero copy) and the server's copies are bounded by its send queue, so
// everything the module and the server allocated peaks at a few MiB, not at
// the payload size.
static void test_echo_64_mebibytes_bounded_memory(void** state) {
  PCP_UNUSED(state);
  int64_t peak = echo_round_trip("127.0.0.1:0", (size_t)64 << 20);
  print_message("64 MiB echo: loop allocator peak %lld bytes\n",
                (long long)peak);
  if (peak > (int64_t)(4 << 20)) {
    fail_msg("loop allocator peaked at %lld bytes for a 64 MiB echo",
             (long long)peak);
  }
}

static void test_echo_ipv6(void** state) {
  PCP_UNUSED(state);
  (void)echo_round_trip("[::1]:0", 4096);
}

// 200 clients at once against one server, each with its own payload.
static void test_many_connections(void** state) {
  PCP_UNUSED(state);
  enum { CLIENT_COUNT = 200, PAYLOAD_LENGTH = 4096 };
  test_loop_t t;
  test_loop_initialize(&t);
  echo_server_t server;
  uint16_t port = echo_server_start(&server, t.loop, "127.0.0.1:0");
  int done = 0;
  echo_client_t* clients = calloc(CLIENT_COUNT, sizeof(*clients));
  pcp_net_address_t target = address_of("127.0.0.1:0");
  target.port = port;
  for (int i = 0; i < CLIENT_COUNT; ++i) {
    clients[i] = (echo_client_t){
        .loop = t.loop,
        .clients_done = &done,
        .clients_total = CLIENT_COUNT,
        .payload = make_payload(PAYLOAD_LENGTH, (uint32_t)i),
        .payload_length = PAYLOAD_LENGTH,
        .received = malloc(PAYLOAD_LENGTH),
    };
    PCP_CHECK_OK(pcp_tcp_connect(t.loop, &target, 10000, on_client_connect,
                                 &clients[i]));
  }
  run_bounded(t.loop, 60000);
  assert_int_equal(done, CLIENT_COUNT);
  for (int i = 0; i < CLIENT_COUNT; ++i) {
    assert_int_equal(clients[i].connects, 1);
    assert_int_equal(clients[i].closes, 1);
    assert_int_equal(clients[i].received_length, PAYLOAD_LENGTH);
    assert_true(
        memcmp(clients[i].received, clients[i].payload, PAYLOAD_LENGTH) == 0);
    // The peer address names the server.
    char expected[64];
    snprintf(expected, sizeof(expected), "127.0.0.1:%u", (unsigned)port);
    assert_string_equal(clients[i].peer, expected);
  }
  while (server.closed < CLIENT_COUNT) {
    run_for_ms(t.loop, 50);
  }
  assert_int_equal(server.accepted, CLIENT_COUNT);
  assert_int_equal(server.close_errors, 0);
  pcp_tcp_listener_close(server.listener);
  test_loop_release(&t);
  for (int i = 0; i < CLIENT_COUNT; ++i) {
    free((void*)clients[i].payload);
    free(clients[i].received);
  }
  free(clients);
}

// The server closes as soon as bytes arrive, with 64 MiB still coming: the
// write fails (UNAVAILABLE), and the client's close handler runs once with
// that error.
static void test_peer_closes_mid_write(void** state) {
  PCP_UNUSED(state);
  test_loop_t t;
  test_loop_initialize(&t);
  echo_server_t server;
  uint16_t port = echo_server_start(&server, t.loop, "127.0.0.1:0");
  server.close_on_first_read = true;
  int done = 0;
  size_t length = (size_t)64 << 20;
  echo_client_t client = {
      .loop = t.loop,
      .clients_done = &done,
      .clients_total = 1,
      .payload = make_payload(length, 1),
      .payload_length = length,
      .received = malloc(length),
  };
  pcp_net_address_t target = address_of("127.0.0.1:0");
  target.port = port;
  PCP_CHECK_OK(
      pcp_tcp_connect(t.loop, &target, 5000, on_client_connect, &client));
  run_bounded(t.loop, 30000);
  assert_int_equal(client.writes_done, 1);
  assert_int_equal(client.writes_ok, 0);
  assert_int_equal(client.write_code, PCP_STATUS_UNAVAILABLE);
  assert_int_equal(client.closes, 1);
  assert_int_equal(client.close_code, PCP_STATUS_UNAVAILABLE);
  assert_true(client.stats.bytes_out < length);
  while (server.closed < 1) {
    run_for_ms(t.loop, 50);
  }
  pcp_tcp_listener_close(server.listener);
  test_loop_release(&t);
  assert_int_equal(client.closes, 1);
  free((void*)client.payload);
  free(client.received);
}

typedef struct connect_result_t {
  pcp_loop_t* loop;
  int calls;
  bool got_conn;
  pcp_status_code_t code;
  char message[256];
} connect_result_t;

static void on_connect_result(void* user_data, pcp_tcp_conn_t* conn,
                              pcp_status_t status) {
  connect_result_t* r = (connect_result_t*)user_data;
  ++r->calls;
  r->got_conn = conn != NULL;
  r->code = pcp_status_code(status);
  snprintf(r->message, sizeof(r->message), "%s", pcp_status_message(status));
  pcp_status_ignore(status);
  if (conn) {
    pcp_tcp_conn_close(conn);
  }
  pcp_loop_stop(r->loop);
}

// A port nobody listens on: bound then closed again.
static uint16_t free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(fd, (struct sockaddr*)&sa, sizeof(sa)), 0);
  socklen_t length = sizeof(sa);
  assert_int_equal(getsockname(fd, (struct sockaddr*)&sa, &length), 0);
  close(fd);
  return ntohs(sa.sin_port);
}

static void test_connect_refused(void** state) {
  PCP_UNUSED(state);
  test_loop_t t;
  test_loop_initialize(&t);
  connect_result_t r = {.loop = t.loop};
  pcp_net_address_t target = address_of("127.0.0.1:0");
  target.port = free_port();
  PCP_CHECK_OK(pcp_tcp_connect(t.loop, &target, 5000, on_connect_result, &r));
  run_bounded(t.loop, 10000);
  assert_int_equal(r.calls, 1);
  assert_false(r.got_conn);
  assert_int_equal(r.code, PCP_STATUS_UNAVAILABLE);
  assert_non_null(strstr(r.message, "127.0.0.1:"));
  test_loop_release(&t);
  assert_int_equal(r.calls, 1);
}

// A listener whose accept queue is full drops new SYNs, so the connect
// neither succeeds nor fails until the timeout.
static void test_connect_timeout(void** state) {
  PCP_UNUSED(state);
  int listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(listen_fd, (struct sockaddr*)&sa, sizeof(sa)), 0);
  assert_int_equal(listen(listen_fd, 0), 0);
  socklen_t length = sizeof(sa);
  assert_int_equal(getsockname(listen_fd, (struct sockaddr*)&sa, &length), 0);
  int fillers[4];
  for (int i = 0; i < 4; ++i) {
    fillers[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    (void)connect(fillers[i], (struct sockaddr*)&sa, sizeof(sa));
  }
  // The queue is full once a filler's handshake completed (writable, no
  // error): waited for, bounded, instead of a fixed sleep.
  bool queue_full = false;
  for (int waited_ms = 0; !queue_full && waited_ms < 5000; waited_ms += 10) {
    struct pollfd fds[4];
    for (int i = 0; i < 4; ++i) {
      fds[i] = (struct pollfd){.fd = fillers[i], .events = POLLOUT};
    }
    assert_true(poll(fds, 4, 10) >= 0);
    for (int i = 0; i < 4; ++i) {
      int error = 0;
      socklen_t size = sizeof(error);
      if ((fds[i].revents & POLLOUT) &&
          getsockopt(fillers[i], SOL_SOCKET, SO_ERROR, &error, &size) == 0 &&
          error == 0) {
        queue_full = true;
      }
    }
  }
  assert_true(queue_full);

  test_loop_t t;
  test_loop_initialize(&t);
  connect_result_t r = {.loop = t.loop};
  pcp_net_address_t target = address_of("127.0.0.1:0");
  target.port = ntohs(sa.sin_port);
  PCP_CHECK_OK(pcp_tcp_connect(t.loop, &target, 200, on_connect_result, &r));
  uint64_t start = pcp_loop_now_ms(t.loop);
  run_bounded(t.loop, 10000);
  uint64_t elapsed = pcp_loop_now_ms(t.loop) - start;
  assert_int_equal(r.calls, 1);
  assert_false(r.got_conn);
  assert_int_equal(r.code, PCP_STATUS_DEADLINE_EXCEEDED);
  assert_true(elapsed >= 190 && elapsed < 5000);
  test_loop_release(&t);
  assert_int_equal(r.calls, 1);
  for (int i = 0; i < 4; ++i) {
    close(fillers[i]);
  }
  close(listen_fd);
}

static void test_bad_arguments(void** state) {
  PCP_UNUSED(state);
  test_loop_t t;
  test_loop_initialize(&t);
  connect_result_t r = {.loop = t.loop};
  // Port 0 cannot be connected to; the callback never runs.
  pcp_net_address_t target = address_of("127.0.0.1:0");
  assert_code(pcp_tcp_connect(t.loop, &target, 100, on_connect_result, &r),
              PCP_STATUS_INVALID_ARGUMENT);
  // Listening needs a literal.
  pcp_net_address_t name = address_of("example.invalid:0");
  pcp_tcp_listener_t* listener = NULL;
  assert_code(pcp_tcp_listen(t.loop, &name, 0, on_echo_accept, NULL, &listener),
              PCP_STATUS_INVALID_ARGUMENT);
  // A port in use.
  echo_server_t server;
  uint16_t port = echo_server_start(&server, t.loop, "127.0.0.1:0");
  pcp_net_address_t same = address_of("127.0.0.1:0");
  same.port = port;
  assert_code(pcp_tcp_listen(t.loop, &same, 0, on_echo_accept, NULL, &listener),
              PCP_STATUS_ALREADY_EXISTS);
  assert_null(listener);
  pcp_tcp_listener_close(server.listener);
  test_loop_release(&t);
  assert_int_equal(r.calls, 0);
}

//===----------------------------------------------------------------------===//
// Backpressure: a server that does not read; the client's writes fill its
// send queue to the mark, get RESOURCE_EXHAUSTED, and get the writable
// callback once the server starts reading.
//===----------------------------------------------------------------------===//

typedef struct pressure_t {
  pcp_loop_t* loop;
  pcp_tcp_conn_t* server_conn;
  pcp_tcp_conn_t* client_conn;
  uint8_t* block;
  size_t block_length;
  int accepted_writes;
  int completed_writes;
  int cancelled_writes;
  int refused;
  int writable_calls;
  size_t server_bytes;
  size_t expected_bytes;
  int server_closes;
  int client_closes;
  pcp_status_code_t client_close_code;
  pcp_status_code_t write_after_close;
} pressure_t;

static void on_pressure_server_read(void* user_data, pcp_tcp_conn_t* conn,
                                    const void* data, size_t byte_length) {
  PCP_UNUSED(conn);
  PCP_UNUSED(data);
  pressure_t* p = (pressure_t*)user_data;
  p->server_bytes += byte_length;
  if (p->expected_bytes && p->server_bytes == p->expected_bytes) {
    pcp_loop_stop(p->loop);
  }
}

static void on_pressure_server_close(void* user_data, pcp_tcp_conn_t* conn,
                                     pcp_status_t status) {
  PCP_UNUSED(conn);
  pressure_t* p = (pressure_t*)user_data;
  ++p->server_closes;
  pcp_status_ignore(status);
}

static void on_pressure_accept(void* user_data, pcp_tcp_listener_t* listener,
                               pcp_tcp_conn_t* conn) {
  PCP_UNUSED(listener);
  pressure_t* p = (pressure_t*)user_data;
  p->server_conn = conn;
  pcp_tcp_conn_handlers_t handlers = {
      .read = on_pressure_server_read,
      .close = on_pressure_server_close,
      .user_data = p,
  };
  PCP_CHECK_OK(pcp_tcp_conn_start(conn, &handlers));
  // Not reading yet: the kernel buffers fill, then the client's queue.
  pcp_tcp_conn_read_pause(conn);
  if (p->client_conn) {
    pcp_loop_stop(p->loop);
  }
}

static void on_pressure_written(void* user_data, pcp_tcp_conn_t* conn,
                                pcp_status_t status) {
  PCP_UNUSED(conn);
  pressure_t* p = (pressure_t*)user_data;
  if (pcp_status_code(status) == PCP_STATUS_CANCELLED) {
    ++p->cancelled_writes;
  }
  if (!status) {
    ++p->completed_writes;
  }
  pcp_status_ignore(status);
}

static void on_pressure_writable(void* user_data, pcp_tcp_conn_t* conn) {
  PCP_UNUSED(conn);
  pressure_t* p = (pressure_t*)user_data;
  ++p->writable_calls;
}

static void on_pressure_client_read(void* user_data, pcp_tcp_conn_t* conn,
                                    const void* data, size_t byte_length) {
  PCP_UNUSED(user_data);
  PCP_UNUSED(conn);
  PCP_UNUSED(data);
  PCP_UNUSED(byte_length);
}

static void on_pressure_client_close(void* user_data, pcp_tcp_conn_t* conn,
                                     pcp_status_t status) {
  pressure_t* p = (pressure_t*)user_data;
  ++p->client_closes;
  p->client_close_code = pcp_status_code(status);
  pcp_status_ignore(status);
  PCP_UNUSED(conn);
}

static void on_pressure_connect(void* user_data, pcp_tcp_conn_t* conn,
                                pcp_status_t status) {
  pressure_t* p = (pressure_t*)user_data;
  PCP_CHECK_OK(status);
  p->client_conn = conn;
  pcp_tcp_conn_handlers_t handlers = {
      .read = on_pressure_client_read,
      .writable = on_pressure_writable,
      .close = on_pressure_client_close,
      .user_data = p,
  };
  PCP_CHECK_OK(pcp_tcp_conn_start(conn, &handlers));
  PCP_CHECK_OK(pcp_tcp_conn_set_keepalive(conn, true, 30));
  PCP_CHECK_OK(pcp_tcp_conn_set_nodelay(conn, true));
  if (p->server_conn) {
    pcp_loop_stop(p->loop);
  }
}

static void test_send_queue_backpressure(void** state) {
  PCP_UNUSED(state);
  test_loop_t t;
  test_loop_initialize(&t);
  pressure_t p = {.loop = t.loop};
  p.block_length = (size_t)1 << 20;
  p.block = make_payload(p.block_length, 9);
  pcp_net_address_t address = address_of("127.0.0.1:0");
  pcp_tcp_listener_t* listener = NULL;
  PCP_CHECK_OK(
      pcp_tcp_listen(t.loop, &address, 0, on_pressure_accept, &p, &listener));
  address.port = pcp_tcp_listener_port(listener);
  PCP_CHECK_OK(
      pcp_tcp_connect(t.loop, &address, 5000, on_pressure_connect, &p));
  run_bounded(t.loop, 10000);
  assert_non_null(p.client_conn);
  assert_non_null(p.server_conn);

  // 4 MiB mark; 1 MiB writes. The kernel takes a few MiB on loopback,
  // then the queue fills; 64 writes (64 MiB) is far beyond both.
  pcp_tcp_conn_set_send_limits(p.client_conn, (size_t)4 << 20, 1024);
  for (int i = 0; i < 64; ++i) {
    pcp_tcp_buffer_t buffers[2] = {
        {p.block, p.block_length / 2},
        {p.block + p.block_length / 2, p.block_length / 2}};
    pcp_status_t status =
        pcp_tcp_conn_write(p.client_conn, buffers, 2, on_pressure_written, &p);
    if (status) {
      assert_code(status, PCP_STATUS_RESOURCE_EXHAUSTED);
      ++p.refused;
      break;
    }
    ++p.accepted_writes;
    // Let libuv push what the kernel takes.
    run_for_ms(t.loop, 1);
  }
  assert_int_equal(p.refused, 1);
  assert_true(pcp_tcp_conn_send_queue_byte_length(p.client_conn) >=
              ((size_t)4 << 20));
  assert_true(p.accepted_writes < 64);
  // Too many buffers is an argument error.
  pcp_tcp_buffer_t many[PCP_TCP_MAX_WRITE_BUFFERS + 1];
  for (size_t i = 0; i < PCP_ARRAYSIZE(many); ++i) {
    many[i] = (pcp_tcp_buffer_t){p.block, 1};
  }
  assert_code(pcp_tcp_conn_write(p.client_conn, many, PCP_ARRAYSIZE(many),
                                 on_pressure_written, &p),
              PCP_STATUS_INVALID_ARGUMENT);
  assert_int_equal(p.writable_calls, 0);

  // The server reads everything: the queue drains, writable fires once.
  p.expected_bytes = (size_t)p.accepted_writes * p.block_length;
  PCP_CHECK_OK(pcp_tcp_conn_read_resume(p.server_conn));
  run_bounded(t.loop, 20000);
  assert_int_equal(p.server_bytes, p.expected_bytes);
  assert_int_equal(p.completed_writes, p.accepted_writes);
  assert_int_equal(p.writable_calls, 1);
  assert_int_equal(pcp_tcp_conn_send_queue_byte_length(p.client_conn), 0);
  pcp_tcp_conn_stats_t stats;
  pcp_tcp_conn_stats(p.client_conn, &stats);
  assert_int_equal(stats.bytes_out, p.expected_bytes);
  pcp_tcp_conn_stats(p.server_conn, &stats);
  assert_int_equal(stats.bytes_in, p.expected_bytes);

  // A write still queued when the connection closes completes with
  // CANCELLED; writes after close are refused; close runs once.
  pcp_tcp_conn_read_pause(p.server_conn);
  int before = p.cancelled_writes;
  pcp_status_t status =
      pcp_tcp_conn_write(p.client_conn, &(pcp_tcp_buffer_t){p.block, 1}, 1,
                         on_pressure_written, &p);
  PCP_CHECK_OK(status);
  pcp_tcp_conn_close(p.client_conn);
  pcp_tcp_conn_close(p.client_conn);  // idempotent until the close handler
  p.write_after_close = pcp_status_consume_code(pcp_tcp_conn_write(
      p.client_conn, &(pcp_tcp_buffer_t){p.block, 1}, 1, NULL, NULL));
  assert_int_equal(p.write_after_close, PCP_STATUS_FAILED_PRECONDITION);
  // The 1-byte write may already have reached the kernel (OK) or be
  // cancelled; either way exactly one completion.
  int completed_before = p.completed_writes;
  run_for_ms(t.loop, 50);
  assert_int_equal(p.completed_writes + p.cancelled_writes,
                   completed_before + before + 1);
  assert_int_equal(p.client_closes, 1);
  assert_int_equal(p.client_close_code, PCP_STATUS_OK);

  // The server connection is still open: releasing the loop cancels it.
  assert_int_equal(p.server_closes, 0);
  pcp_tcp_listener_close(listener);
  test_loop_release(&t);
  assert_int_equal(p.server_closes, 1);
  free(p.block);
}

// Releasing the loop with a connect in flight reports CANCELLED once.
static void test_release_cancels_connect(void** state) {
  PCP_UNUSED(state);
  test_loop_t t;
  test_loop_initialize(&t);
  connect_result_t r = {.loop = t.loop};
  echo_server_t server;
  uint16_t port = echo_server_start(&server, t.loop, "127.0.0.1:0");
  pcp_net_address_t target = address_of("127.0.0.1:0");
  target.port = port;
  PCP_CHECK_OK(pcp_tcp_connect(t.loop, &target, 5000, on_connect_result, &r));
  test_loop_release(&t);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.code, PCP_STATUS_CANCELLED);
  assert_false(r.got_conn);
}

// Names go through the resolver; "localhost" works everywhere.
static void test_connect_by_name(void** state) {
  PCP_UNUSED(state);
  test_loop_t t;
  test_loop_initialize(&t);
  echo_server_t server;
  uint16_t port = echo_server_start(&server, t.loop, "127.0.0.1:0");
  connect_result_t r = {.loop = t.loop};
  pcp_net_address_t target = address_of("localhost:0");
  target.port = port;
  PCP_CHECK_OK(pcp_tcp_connect(t.loop, &target, 5000, on_connect_result, &r));
  run_bounded(t.loop, 10000);
  assert_int_equal(r.calls, 1);
  assert_true(r.got_conn);
  assert_int_equal(r.code, PCP_STATUS_OK);
  pcp_tcp_listener_close(server.listener);
  test_loop_release(&t);
}

//===----------------------------------------------------------------------===//
// OOM sweep (SQLite style): allocation N fails, for every N the scenario
// makes. Whatever fails, every submitted operation completes exactly once,
// nothing hangs and the loop gives back every byte.
//===----------------------------------------------------------------------===//

#define OOM_PAYLOAD_LENGTH 65536

typedef struct oom_scenario_t {
  pcp_loop_t* loop;
  uint8_t payload[OOM_PAYLOAD_LENGTH];
  size_t received;
  int connect_calls;
  int connected;
  int client_closes;
  int client_write_calls;
  int client_writes_submitted;
  int accepted;
  int server_closes;
  int server_write_calls;
  int server_writes_submitted;
  bool done;
} oom_scenario_t;

static void oom_finish(oom_scenario_t* o) {
  o->done = true;
  pcp_loop_stop(o->loop);
}

static void on_oom_server_written(void* user_data, pcp_tcp_conn_t* conn,
                                  pcp_status_t status) {
  PCP_UNUSED(conn);
  void** slot = (void**)user_data;
  oom_scenario_t* o = (oom_scenario_t*)slot[0];
  ++o->server_write_calls;
  free(slot);
  pcp_status_ignore(status);
}

static void on_oom_server_read(void* user_data, pcp_tcp_conn_t* conn,
                               const void* data, size_t byte_length) {
  oom_scenario_t* o = (oom_scenario_t*)user_data;
  if (byte_length == 0) {
    pcp_tcp_conn_close(conn);
    return;
  }
  // The echo copy comes from malloc, not the loop's allocator: the sweep is
  // about the module's allocations.
  void** slot = malloc(sizeof(void*) + byte_length);
  slot[0] = o;
  memcpy(slot + 1, data, byte_length);
  pcp_tcp_buffer_t buffer = {slot + 1, byte_length};
  pcp_status_t status =
      pcp_tcp_conn_write(conn, &buffer, 1, on_oom_server_written, slot);
  if (status) {
    pcp_status_ignore(status);
    free(slot);
    pcp_tcp_conn_close(conn);
    return;
  }
  ++o->server_writes_submitted;
}

static void on_oom_server_close(void* user_data, pcp_tcp_conn_t* conn,
                                pcp_status_t status) {
  PCP_UNUSED(conn);
  oom_scenario_t* o = (oom_scenario_t*)user_data;
  ++o->server_closes;
  pcp_status_ignore(status);
}

static void on_oom_accept(void* user_data, pcp_tcp_listener_t* listener,
                          pcp_tcp_conn_t* conn) {
  PCP_UNUSED(listener);
  oom_scenario_t* o = (oom_scenario_t*)user_data;
  ++o->accepted;
  pcp_tcp_conn_handlers_t handlers = {
      .read = on_oom_server_read,
      .close = on_oom_server_close,
      .user_data = o,
  };
  PCP_CHECK_OK(pcp_tcp_conn_start(conn, &handlers));
}

static void on_oom_client_written(void* user_data, pcp_tcp_conn_t* conn,
                                  pcp_status_t status) {
  oom_scenario_t* o = (oom_scenario_t*)user_data;
  ++o->client_write_calls;
  if (!status) {
    pcp_status_t shutdown = pcp_tcp_conn_shutdown(conn, NULL, NULL);
    if (shutdown) {
      pcp_status_ignore(shutdown);
      pcp_tcp_conn_close(conn);
    }
  }
  pcp_status_ignore(status);
}

static void on_oom_client_read(void* user_data, pcp_tcp_conn_t* conn,
                               const void* data, size_t byte_length) {
  PCP_UNUSED(data);
  oom_scenario_t* o = (oom_scenario_t*)user_data;
  o->received += byte_length;
  if (byte_length == 0) {
    pcp_tcp_conn_close(conn);
  }
}

static void on_oom_client_close(void* user_data, pcp_tcp_conn_t* conn,
                                pcp_status_t status) {
  PCP_UNUSED(conn);
  oom_scenario_t* o = (oom_scenario_t*)user_data;
  ++o->client_closes;
  pcp_status_ignore(status);
  oom_finish(o);
}

static void on_oom_connect(void* user_data, pcp_tcp_conn_t* conn,
                           pcp_status_t status) {
  oom_scenario_t* o = (oom_scenario_t*)user_data;
  ++o->connect_calls;
  if (status) {
    pcp_status_ignore(status);
    oom_finish(o);
    return;
  }
  ++o->connected;
  pcp_tcp_conn_handlers_t handlers = {
      .read = on_oom_client_read,
      .close = on_oom_client_close,
      .user_data = o,
  };
  PCP_CHECK_OK(pcp_tcp_conn_start(conn, &handlers));
  pcp_tcp_buffer_t buffer = {o->payload, sizeof(o->payload)};
  pcp_status_t write_status =
      pcp_tcp_conn_write(conn, &buffer, 1, on_oom_client_written, o);
  if (write_status) {
    pcp_status_ignore(write_status);
    pcp_tcp_conn_close(conn);
    return;
  }
  ++o->client_writes_submitted;
}

static void test_oom_sweep(void** state) {
  PCP_UNUSED(state);
  int completed_runs = 0;
  for (int64_t fail_at = 0; fail_at < 1000; ++fail_at) {
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_system(), fail_at, false,
                                     &failing);
    pcp_allocator_counting_t counter;
    pcp_allocator_counting_initialize(pcp_allocator_failing(&failing),
                                      &counter);
    pcp_loop_options_t options = pcp_loop_options_default();
    options.allocator = pcp_allocator_counting(&counter);
    oom_scenario_t* o = calloc(1, sizeof(*o));
    pcp_status_t status = pcp_loop_create(&options, &o->loop);
    if (status) {
      assert_code(status, PCP_STATUS_RESOURCE_EXHAUSTED);
      assert_int_equal(atomic_load(&counter.live_bytes), 0);
      free(o);
      continue;
    }
    pcp_net_address_t address = address_of("127.0.0.1:0");
    pcp_tcp_listener_t* listener = NULL;
    bool connect_submitted = false;
    status = pcp_tcp_listen(o->loop, &address, 0, on_oom_accept, o, &listener);
    if (!status) {
      address.port = pcp_tcp_listener_port(listener);
      status = pcp_tcp_connect(o->loop, &address, 5000, on_oom_connect, o);
      connect_submitted = status == NULL;
    }
    if (status) {
      assert_code(status, PCP_STATUS_RESOURCE_EXHAUSTED);
    }
    if (connect_submitted) {
      // The harness's own deadline timer must not take the injected
      // failure: disarm the allocator around it.
      int64_t saved = failing.fail_at_index;
      int64_t before = failing.request_count;
      failing.fail_at_index = -1;
      pcp_loop_timer_t* deadline = NULL;
      PCP_CHECK_OK(pcp_loop_timer_start(o->loop, 10000, 0, on_deadline, o->loop,
                                        &deadline));
      if (saved >= before) {
        saved += failing.request_count - before;
      }
      failing.fail_at_index = saved;
      deadline_expired = false;
      PCP_CHECK_OK(pcp_loop_run(o->loop));
      if (deadline_expired) {
        fail_msg("OOM at allocation %lld: scenario hung", (long long)fail_at);
      }
      pcp_loop_timer_cancel(deadline);
    }
    if (listener) {
      pcp_tcp_listener_close(listener);
    }
    pcp_loop_release(o->loop);
    assert_int_equal(atomic_load(&counter.live_bytes), 0);
    // Exactly once, whatever failed.
    assert_int_equal(o->connect_calls, connect_submitted ? 1 : 0);
    // A connected client gets its close callback once (at the latest from
    // the release, as CANCELLED).
    assert_int_equal(o->client_closes, o->connected);
    assert_int_equal(o->client_write_calls, o->client_writes_submitted);
    assert_int_equal(o->server_write_calls, o->server_writes_submitted);
    assert_int_equal(o->server_closes, o->accepted);
    bool clean = failing.failure_count == 0;
    if (clean) {
      // Nothing failed: the scenario ran to the end, with the full echo.
      assert_int_equal(o->received, OOM_PAYLOAD_LENGTH);
      assert_int_equal(o->client_closes, 1);
      ++completed_runs;
    }
    free(o);
    if (clean) {
      print_message("OOM sweep: %lld allocation sites failed one by one\n",
                    (long long)fail_at);
      break;
    }
  }
  assert_int_equal(completed_runs, 1);
}

//===----------------------------------------------------------------------===//
// 256 MiB one way, zero copy: the sender's buffer goes to the kernel as is
// and the receiver checksums the bytes where they land, so the loop's
// allocator stays far below the tensor size.
//===----------------------------------------------------------------------===//

typedef struct fletcher_t {
  uint64_t sum;
  uint64_t weighted;
} fletcher_t;

static void fletcher_update(fletcher_t* f, const uint8_t* data, size_t n) {
  uint64_t sum = f->sum;
  uint64_t weighted = f->weighted;
  for (size_t i = 0; i < n; ++i) {
    sum += data[i];
    weighted += sum;
  }
  f->sum = sum;
  f->weighted = weighted;
}

typedef struct bulk_t {
  pcp_loop_t* loop;
  const uint8_t* payload;
  size_t length;
  fletcher_t received;
  uint64_t server_bytes;
  int write_calls;
  pcp_status_code_t write_code;
  int closes;
} bulk_t;

static void on_bulk_server_read(void* user_data, pcp_tcp_conn_t* conn,
                                const void* data, size_t byte_length) {
  bulk_t* b = (bulk_t*)user_data;
  if (byte_length == 0) {
    pcp_tcp_conn_stats_t stats;
    pcp_tcp_conn_stats(conn, &stats);
    b->server_bytes = stats.bytes_in;
    pcp_tcp_conn_close(conn);
    return;
  }
  fletcher_update(&b->received, data, byte_length);
}

static void on_bulk_close(void* user_data, pcp_tcp_conn_t* conn,
                          pcp_status_t status) {
  PCP_UNUSED(conn);
  bulk_t* b = (bulk_t*)user_data;
  PCP_CHECK_OK(status);
  if (++b->closes == 2) {
    pcp_loop_stop(b->loop);
  }
}

static void on_bulk_accept(void* user_data, pcp_tcp_listener_t* listener,
                           pcp_tcp_conn_t* conn) {
  PCP_UNUSED(listener);
  pcp_tcp_conn_handlers_t handlers = {
      .read = on_bulk_server_read,
      .close = on_bulk_close,
      .user_data = user_data,
  };
  PCP_CHECK_OK(pcp_tcp_conn_start(conn, &handlers));
}

static void on_bulk_client_read(void* user_data, pcp_tcp_conn_t* conn,
                                const void* data, size_t byte_length) {
  PCP_UNUSED(user_data);
  PCP_UNUSED(data);
  if (byte_length == 0) {
    pcp_tcp_conn_close(conn);
  }
}

static void on_bulk_written(void* user_data, pcp_tcp_conn_t* conn,
                            pcp_status_t status) {
  bulk_t* b = (bulk_t*)user_data;
  ++b->write_calls;
  b->write_code = pcp_status_code(status);
  pcp_status_ignore(status);
  PCP_CHECK_OK(pcp_tcp_conn_shutdown(conn, NULL, NULL));
}

static void on_bulk_connect(void* user_data, pcp_tcp_conn_t* conn,
                            pcp_status_t status) {
  bulk_t* b = (bulk_t*)user_data;
  PCP_CHECK_OK(status);
  pcp_tcp_conn_handlers_t handlers = {
      .read = on_bulk_client_read,
      .close = on_bulk_close,
      .user_data = b,
  };
  PCP_CHECK_OK(pcp_tcp_conn_start(conn, &handlers));
  // One write of the whole tensor: larger than the 16 MiB mark, accepted
  // because the queue is empty.
  pcp_tcp_buffer_t buffer = {b->payload, b->length};
  PCP_CHECK_OK(pcp_tcp_conn_write(conn, &buffer, 1, on_bulk_written, b));
  assert_int_equal(pcp_tcp_conn_send_queue_byte_length(conn), b->length);
}

static void test_zero_copy_256_mebibytes(void** state) {
  PCP_UNUSED(state);
  test_loop_t t;
  test_loop_initialize(&t);
  bulk_t b = {.loop = t.loop, .length = (size_t)256 << 20};
  uint8_t* payload = malloc(b.length);
  for (size_t i = 0; i < b.length; ++i) {
    payload[i] = (uint8_t)(i * 2654435761u >> 13);
  }
  b.payload = payload;
  fletcher_t expected = {0, 0};
  fletcher_update(&expected, payload, b.length);
  pcp_net_address_t address = address_of("127.0.0.1:0");
  pcp_tcp_listener_t* listener = NULL;
  PCP_CHECK_OK(
      pcp_tcp_listen(t.loop, &address, 0, on_bulk_accept, &b, &listener));
  address.port = pcp_tcp_listener_port(listener);
  PCP_CHECK_OK(pcp_tcp_connect(t.loop, &address, 5000, on_bulk_connect, &b));
  run_bounded(t.loop, 60000);
  assert_int_equal(b.write_calls, 1);
  assert_int_equal(b.write_code, PCP_STATUS_OK);
  assert_int_equal(b.server_bytes, b.length);
  assert_true(b.received.sum == expected.sum);
  assert_true(b.received.weighted == expected.weighted);
  int64_t peak = atomic_load(&t.counter.peak_bytes);
  print_message("256 MiB zero-copy: loop allocator peak %lld bytes\n",
                (long long)peak);
  assert_true(peak < (int64_t)(1 << 20));
  pcp_tcp_listener_close(listener);
  test_loop_release(&t);
  free(payload);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_echo_one_byte),
      cmocka_unit_test(test_echo_one_mebibyte),
      cmocka_unit_test(test_echo_64_mebibytes_bounded_memory),
      cmocka_unit_test(test_echo_ipv6),
      cmocka_unit_test(test_zero_copy_256_mebibytes),
      cmocka_unit_test(test_many_connections),
      cmocka_unit_test(test_peer_closes_mid_write),
      cmocka_unit_test(test_connect_refused),
      cmocka_unit_test(test_connect_timeout),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_send_queue_backpressure),
      cmocka_unit_test(test_release_cancels_connect),
      cmocka_unit_test(test_connect_by_name),
      cmocka_unit_test(test_oom_sweep),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
