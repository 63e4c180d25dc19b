// SPDX-License-Identifier: Apache-2.0
//
// The header gate: the thread that owns a plain-HTTP server's listening
// socket. It accepts every connection itself and holds it until the first
// request's headers have arrived (read with MSG_PEEK, so that the bytes stay
// in the kernel for libmicrohttpd), checks them against the server's limits
// and only then hands the socket over with MHD_add_connection. So:
//   - a connection that never finishes its headers never reaches
//     libmicrohttpd and never takes one of its connection slots; it is
//     answered 408 and closed at the header deadline, however slowly it
//     trickles (libmicrohttpd's own timeout is an idle timeout);
//   - at most |max_waiting_per_client| connections of one client address
//     wait here; one more evicts that client's oldest, so a flood from one
//     address cannot starve a probe or another request from the same
//     address (the newcomer sends its headers at once and passes);
//   - the limits that libmicrohttpd would answer with its own HTML pages
//     (URL too long, too many or too large headers, a malformed
//     Content-Length) are answered here with the JSON error schema, at once;
//   - past the server's connection limit a request gets a JSON 503, except
//     the probes (/healthz, /readyz), which keep the reserved slots between
//     the limit and libmicrohttpd's hard limit (docs/decisions.md).
// One thread, one epoll set, edge-triggered on the waiting sockets (each new
// segment wakes it once; the peek re-reads what is there). Nothing here
// allocates per byte: one peek buffer, one record per waiting connection.

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http/http_impl.h"

typedef struct gate_conn_t {
  int fd;
  struct sockaddr_storage address;
  socklen_t address_length;
  uint8_t client[16];  // the address bytes (IPv4 in the first 4)
  int64_t deadline_ns;
  struct gate_conn_t* prev;  // accept order: head is the oldest
  struct gate_conn_t* next;
} gate_conn_t;

struct pcp_http_gate_t {
  pcp_allocator_t allocator;
  pcp_http_gate_options_t options;
  int epoll_fd;
  int wake_fds[2];  // a pipe: stop writes one byte
  pthread_t thread;
  bool thread_started;
  gate_conn_t* head;
  gate_conn_t* tail;
  size_t count;
  char* peek_buffer;
  size_t peek_capacity;
};

// epoll tags for the two sockets that are not waiting connections.
static char listen_tag;
static char wake_tag;

// Real time: the deadlines are epoll timeouts (base/ owns clock_gettime).
static int64_t monotonic_ns(void) {
  return pcp_clock_now_ns(pcp_clock_system());
}

//===----------------------------------------------------------------------===//
// Classifying the peeked bytes
//===----------------------------------------------------------------------===//

static bool line_is_header(const char* line, size_t length, const char* name) {
  size_t name_length = strlen(name);
  return length > name_length && line[name_length] == ':' &&
         strncasecmp(line, name, name_length) == 0;
}

// A Content-Length value: 1 to 19 decimal digits between optional blanks
// (so at most 10^19 - 1, inside uint64 and libmicrohttpd's parser).
static bool content_length_is_valid(const char* value, size_t length) {
  while (length > 0 && (*value == ' ' || *value == '\t')) {
    ++value;
    --length;
  }
  while (length > 0 && (value[length - 1] == ' ' || value[length - 1] == '\t' ||
                        value[length - 1] == '\r')) {
    --length;
  }
  if (length == 0 || length > 19) {
    return false;
  }
  for (size_t i = 0; i < length; ++i) {
    if (value[i] < '0' || value[i] > '9') {
      return false;
    }
  }
  return true;
}

static pcp_http_gate_verdict_t verdict_error(pcp_http_gate_result_t* result,
                                             int http_status, const char* code,
                                             const char* message) {
  result->http_status = http_status;
  result->code = code;
  snprintf(result->message, sizeof(result->message), "%s", message);
  return PCP_HTTP_GATE_REJECT;
}

pcp_http_gate_verdict_t pcp_http_gate_classify(
    const char* data, size_t length, const pcp_http_gate_limits_t* limits,
    pcp_http_gate_result_t* out_result) {
  memset(out_result, 0, sizeof(*out_result));
  char message[160];
  // The request line: METHOD SP target SP version. Its target is what
  // max_url_bytes bounds; the slack covers the method and version.
  const size_t kLineSlack = 64;
  const char* line_end = memchr(data, '\n', length);
  if (!line_end) {
    if (length > limits->max_url_bytes + kLineSlack) {
      snprintf(message, sizeof(message), "URL exceeds %zu bytes",
               limits->max_url_bytes);
      return verdict_error(out_result, 414, "RESOURCE_EXHAUSTED", message);
    }
    return PCP_HTTP_GATE_NEED_MORE;
  }
  size_t line_length = (size_t)(line_end - data);
  if (line_length > limits->max_url_bytes + kLineSlack) {
    // Whatever its target, a line this long was already refused while it
    // arrived (above): the same verdict however the bytes were split.
    snprintf(message, sizeof(message), "URL exceeds %zu bytes",
             limits->max_url_bytes);
    return verdict_error(out_result, 414, "RESOURCE_EXHAUSTED", message);
  }
  const char* target = memchr(data, ' ', line_length);
  if (target) {
    ++target;
    const char* target_end =
        memchr(target, ' ', line_length - (size_t)(target - data));
    size_t target_length = target_end ? (size_t)(target_end - target)
                                      : line_length - (size_t)(target - data);
    if (target_length > limits->max_url_bytes) {
      snprintf(message, sizeof(message), "URL exceeds %zu bytes",
               limits->max_url_bytes);
      return verdict_error(out_result, 414, "RESOURCE_EXHAUSTED", message);
    }
    const char* query = memchr(target, '?', target_length);
    if (query) {
      size_t params = 1;
      for (const char* c = query + 1; c < target + target_length; ++c) {
        params += *c == '&';
      }
      if (params > PCP_HTTP_MAX_QUERY_PARAMS) {
        snprintf(message, sizeof(message), "more than %d query parameters",
                 PCP_HTTP_MAX_QUERY_PARAMS);
        return verdict_error(out_result, 414, "RESOURCE_EXHAUSTED", message);
      }
    }
    size_t path_length = query ? (size_t)(query - target) : target_length;
    out_result->is_probe = pcp_http_path_is_probe(target, path_length);
  }
  // The header lines, up to the empty line. libmicrohttpd parses the
  // request itself once we pass it; this scan only enforces limits.
  size_t header_count = 0;
  size_t header_bytes = 0;
  bool has_length = false;
  const char* cursor = line_end + 1;
  const char* end = data + length;
  while (cursor < end) {
    const char* next = memchr(cursor, '\n', (size_t)(end - cursor));
    size_t available = next ? (size_t)(next - cursor) : (size_t)(end - cursor);
    if (header_bytes + available > limits->max_header_bytes) {
      snprintf(message, sizeof(message), "request headers exceed %zu bytes",
               limits->max_header_bytes);
      return verdict_error(out_result, 431, "RESOURCE_EXHAUSTED", message);
    }
    if (!next) {
      return PCP_HTTP_GATE_NEED_MORE;
    }
    size_t line = available;
    if (line == 0 || (line == 1 && cursor[0] == '\r')) {
      return PCP_HTTP_GATE_PASS;  // the empty line: headers complete
    }
    header_bytes += line + 1;
    if (++header_count > limits->max_header_count) {
      snprintf(message, sizeof(message), "more than %zu request headers",
               limits->max_header_count);
      return verdict_error(out_result, 431, "RESOURCE_EXHAUSTED", message);
    }
    if (line_is_header(cursor, line, "Content-Length")) {
      size_t name_length = strlen("Content-Length") + 1;
      if (has_length ||
          !content_length_is_valid(cursor + name_length, line - name_length)) {
        return verdict_error(out_result, 400, "INVALID_ARGUMENT",
                             "bad Content-Length: one header of 1 to 19 "
                             "decimal digits expected");
      }
      has_length = true;
    }
    cursor = next + 1;
  }
  return PCP_HTTP_GATE_NEED_MORE;
}

//===----------------------------------------------------------------------===//
// Waiting connections
//===----------------------------------------------------------------------===//

bool pcp_http_path_is_probe(const char* path, size_t length) {
  static const char* const kProbes[] = {"/healthz", "/readyz"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(kProbes); ++i) {
    if (length == strlen(kProbes[i]) && memcmp(path, kProbes[i], length) == 0) {
      return true;
    }
  }
  return false;
}

void pcp_http_client_key(const struct sockaddr* address, uint8_t out_key[16]) {
  memset(out_key, 0, 16);
  if (address->sa_family == AF_INET) {
    struct sockaddr_in in4;
    memcpy(&in4, address, sizeof(in4));
    memcpy(out_key, &in4.sin_addr, 4);
  } else if (address->sa_family == AF_INET6) {
    struct sockaddr_in6 in6;
    memcpy(&in6, address, sizeof(in6));
    memcpy(out_key, &in6.sin6_addr, 16);
  }
}

static void conn_unlink(pcp_http_gate_t* gate, gate_conn_t* conn) {
  if (conn->prev) {
    conn->prev->next = conn->next;
  } else {
    gate->head = conn->next;
  }
  if (conn->next) {
    conn->next->prev = conn->prev;
  } else {
    gate->tail = conn->prev;
  }
  --gate->count;
}

// Closes a waiting connection that is not handed over.
static void conn_drop(pcp_http_gate_t* gate, gate_conn_t* conn) {
  conn_unlink(gate, conn);
  epoll_ctl(gate->epoll_fd, EPOLL_CTL_DEL, conn->fd, NULL);
  close(conn->fd);
  pcp_allocator_free(gate->allocator, conn);
}

bool pcp_http_raw_error_send(int fd, int http_status, const char* code,
                             const char* message, const char* extra_headers,
                             size_t* out_body_bytes) {
  *out_body_bytes = 0;
  pcp_string_builder_t body;
  pcp_string_builder_initialize(pcp_allocator_system(), 4096, &body);
  pcp_status_t status = pcp_http_error_json_format(code, message, &body);
  if (status) {
    pcp_status_ignore(status);
    pcp_string_builder_deinitialize(&body);
    return false;
  }
  const char* text = pcp_string_builder_cstring(&body);
  size_t text_length = strlen(text);
  char head[512];
  int head_length =
      snprintf(head, sizeof(head),
               "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
               "Content-Length: %zu\r\nConnection: close\r\n%s\r\n",
               http_status, pcp_http_status_reason(http_status), text_length,
               extra_headers);
  bool ok = head_length > 0 && (size_t)head_length < sizeof(head);
  // A few hundred bytes on a socket that has sent nothing for this request:
  // the send buffer takes them whole; a peer that does not read them loses
  // them.
  ok = ok && send(fd, head, (size_t)head_length,
                  MSG_NOSIGNAL | MSG_DONTWAIT | MSG_MORE) == head_length;
  ok = ok && send(fd, text, text_length, MSG_NOSIGNAL | MSG_DONTWAIT) ==
                 (ssize_t)text_length;
  *out_body_bytes = text_length;
  pcp_string_builder_deinitialize(&body);
  return ok;
}

// Writes the JSON error answer on |conn| and closes it. What the client sent
// is read and dropped first, so that the close does not turn into a reset
// that could cost the client our answer.
static void conn_answer(pcp_http_gate_t* gate, gate_conn_t* conn,
                        int http_status, const char* code, const char* message,
                        const char* extra_header) {
  char drain[4096];
  for (size_t total = 0; total < (1u << 20);) {
    ssize_t n = recv(conn->fd, drain, sizeof(drain), MSG_DONTWAIT);
    if (n <= 0) {
      break;
    }
    total += (size_t)n;
  }
  size_t body_bytes = 0;
  pcp_http_raw_error_send(conn->fd, http_status, code, message,
                          extra_header ? extra_header : "", &body_bytes);
  shutdown(conn->fd, SHUT_WR);
  PCP_LOG(PCP_LOG_DEBUG, gate->options.log_context,
          "http gate: answered %d (%s) before the request reached the server",
          http_status, message);
  if (gate->options.answers) {
    char status_label[8];
    snprintf(status_label, sizeof(status_label), "%d", http_status);
    pcp_obs_family_add(gate->options.answers,
                       (const char*[]){gate->options.server_name, status_label},
                       1);
  }
  conn_drop(gate, conn);
}

static void conn_hand_over(pcp_http_gate_t* gate, gate_conn_t* conn) {
  conn_unlink(gate, conn);
  epoll_ctl(gate->epoll_fd, EPOLL_CTL_DEL, conn->fd, NULL);
  // libmicrohttpd closes the socket itself when it cannot take it.
  if (MHD_add_connection(gate->options.daemon, conn->fd,
                         (const struct sockaddr*)&conn->address,
                         conn->address_length) != MHD_YES) {
    PCP_LOG(PCP_LOG_WARN, gate->options.log_context,
            "http gate: libmicrohttpd refused a connection (errno %d)", errno);
  }
  pcp_allocator_free(gate->allocator, conn);
}

static void conn_check(pcp_http_gate_t* gate, gate_conn_t* conn) {
  ssize_t n = recv(conn->fd, gate->peek_buffer, gate->peek_capacity,
                   MSG_PEEK | MSG_DONTWAIT);
  if (n == 0 ||
      (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    conn_drop(gate, conn);  // the client left
    return;
  }
  if (n < 0) {
    return;
  }
  pcp_http_gate_result_t result;
  pcp_http_gate_verdict_t verdict = pcp_http_gate_classify(
      gate->peek_buffer, (size_t)n, &gate->options.limits, &result);
  if (verdict == PCP_HTTP_GATE_NEED_MORE && (size_t)n == gate->peek_capacity) {
    // The buffer holds more than both limits together: cannot be valid.
    verdict = verdict_error(&result, 431, "RESOURCE_EXHAUSTED",
                            "request line and headers too large");
  }
  switch (verdict) {
    case PCP_HTTP_GATE_NEED_MORE:
      return;
    case PCP_HTTP_GATE_REJECT:
      conn_answer(gate, conn, result.http_status, result.code, result.message,
                  NULL);
      return;
    case PCP_HTTP_GATE_PASS:
      break;
  }
  const pcp_http_gate_options_t* o = &gate->options;
  int64_t open = atomic_load(o->open_connections);
  if (!result.is_probe && open >= (int64_t)o->max_connections) {
    char message[128];
    snprintf(message, sizeof(message),
             "server is at its limit of %u connections",
             (unsigned)o->max_connections);
    conn_answer(gate, conn, 503, "UNAVAILABLE", message, "Retry-After: 1\r\n");
    return;
  }
  if (!result.is_probe && o->client_open_count &&
      o->client_open_count(o->client_open_user_data, conn->client) >=
          o->max_connections_per_client) {
    char message[128];
    snprintf(message, sizeof(message),
             "this client already has %u open connections",
             (unsigned)o->max_connections_per_client);
    conn_answer(gate, conn, 429, "RESOURCE_EXHAUSTED", message,
                "Retry-After: 1\r\n");
    return;
  }
  conn_hand_over(gate, conn);
}

// Makes room for one more connection from |client|: the oldest waiting
// connection of that client when it has its share, else the oldest of all
// when the gate is full.
static void make_room(pcp_http_gate_t* gate, const uint8_t client[16]) {
  size_t same = 0;
  gate_conn_t* oldest_same = NULL;
  for (gate_conn_t* c = gate->head; c; c = c->next) {
    if (memcmp(c->client, client, 16) == 0) {
      if (!oldest_same) {
        oldest_same = c;
      }
      ++same;
    }
  }
  if (oldest_same && same >= gate->options.max_waiting_per_client) {
    conn_answer(gate, oldest_same, 408, "DEADLINE_EXCEEDED",
                "request headers not received; this client has too many "
                "connections waiting",
                NULL);
  } else if (gate->head && gate->count >= gate->options.max_waiting) {
    conn_answer(gate, gate->head, 408, "DEADLINE_EXCEEDED",
                "request headers not received; too many connections waiting",
                NULL);
  }
}

static void accept_all(pcp_http_gate_t* gate) {
  for (;;) {
    struct sockaddr_storage address;
    socklen_t address_length = sizeof(address);
    int fd = accept(gate->options.listen_fd, (struct sockaddr*)&address,
                    &address_length);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) {
        continue;
      }
      if ((errno == EMFILE || errno == ENFILE) && gate->head) {
        conn_drop(gate, gate->head);  // out of descriptors: oldest goes
        continue;
      }
      if (errno == EMFILE || errno == ENFILE) {
        pcp_sleep_ms(10);  // nothing of ours to free; do not spin
      }
      return;
    }
    int flags = fcntl(fd, F_GETFL, 0);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    gate_conn_t* conn = NULL;
    pcp_status_t status =
        pcp_allocator_calloc(gate->allocator, sizeof(*conn), (void**)&conn);
    if (status) {
      pcp_status_ignore(status);
      close(fd);
      continue;
    }
    conn->fd = fd;
    memcpy(&conn->address, &address, sizeof(address));
    conn->address_length = address_length;
    pcp_http_client_key((const struct sockaddr*)&address, conn->client);
    conn->deadline_ns =
        monotonic_ns() + gate->options.header_timeout_ms * 1000000;
    make_room(gate, conn->client);
    conn->prev = gate->tail;
    if (gate->tail) {
      gate->tail->next = conn;
    } else {
      gate->head = conn;
    }
    gate->tail = conn;
    ++gate->count;
    struct epoll_event event = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET,
                                .data.ptr = conn};
    if (epoll_ctl(gate->epoll_fd, EPOLL_CTL_ADD, fd, &event) != 0) {
      conn_drop(gate, conn);
      continue;
    }
    // Edge-triggered: bytes that came with the connection may never raise
    // another edge, so look now.
    conn_check(gate, conn);
  }
}

static void* gate_main(void* arg) {
  pcp_http_gate_t* gate = arg;
  struct epoll_event events[64];
  for (;;) {
    int timeout_ms = 1000;
    if (gate->head) {
      int64_t wait_ns = gate->head->deadline_ns - monotonic_ns();
      timeout_ms = wait_ns <= 0 ? 0 : (int)((wait_ns + 999999) / 1000000);
      timeout_ms = timeout_ms > 1000 ? 1000 : timeout_ms;
    }
    int n =
        epoll_wait(gate->epoll_fd, events, PCP_ARRAYSIZE(events), timeout_ms);
    // A check frees at most its own connection, and each socket appears
    // once per batch, so the tags stay valid; accepting may evict others
    // (make_room, EMFILE), so it runs after the batch.
    bool accept_pending = false;
    for (int i = 0; i < n; ++i) {
      void* tag = events[i].data.ptr;
      if (tag == &wake_tag) {
        return NULL;
      }
      if (tag == &listen_tag) {
        accept_pending = true;
      } else {
        conn_check(gate, tag);
      }
    }
    if (accept_pending) {
      accept_all(gate);
    }
    // Headers not complete by their deadline: 408 and close. The list is in
    // accept order, which is deadline order.
    int64_t now = monotonic_ns();
    while (gate->head && gate->head->deadline_ns <= now) {
      char message[128];
      snprintf(message, sizeof(message),
               "request headers not complete within %lld ms",
               (long long)gate->options.header_timeout_ms);
      conn_answer(gate, gate->head, 408, "DEADLINE_EXCEEDED", message, NULL);
    }
  }
}

//===----------------------------------------------------------------------===//
// Lifecycle
//===----------------------------------------------------------------------===//

pcp_status_t pcp_http_gate_start(const pcp_http_gate_options_t* options,
                                 pcp_allocator_t allocator,
                                 pcp_http_gate_t** out_gate) {
  *out_gate = NULL;
  pcp_http_gate_t* gate = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*gate), (void**)&gate));
  gate->allocator = allocator;
  gate->options = *options;
  gate->epoll_fd = -1;
  gate->wake_fds[0] = gate->wake_fds[1] = -1;
  // Room for the longest valid request line and header block plus one
  // byte, so that "more than fits" is itself the over-limit signal.
  gate->peek_capacity =
      options->limits.max_url_bytes + options->limits.max_header_bytes + 1024;
  pcp_status_t status = pcp_allocator_malloc(allocator, gate->peek_capacity,
                                             (void**)&gate->peek_buffer);
  if (!status) {
    gate->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (gate->epoll_fd < 0 || pipe(gate->wake_fds) != 0) {
      status = pcp_status_from_errno(errno, "http gate: epoll or pipe");
    }
  }
  if (!status) {
    struct epoll_event listen_event = {.events = EPOLLIN,
                                       .data.ptr = &listen_tag};
    struct epoll_event wake_event = {.events = EPOLLIN, .data.ptr = &wake_tag};
    if (epoll_ctl(gate->epoll_fd, EPOLL_CTL_ADD, options->listen_fd,
                  &listen_event) != 0 ||
        epoll_ctl(gate->epoll_fd, EPOLL_CTL_ADD, gate->wake_fds[0],
                  &wake_event) != 0) {
      status = pcp_status_from_errno(errno, "http gate: epoll_ctl");
    }
  }
  if (!status) {
    if (pthread_create(&gate->thread, NULL, gate_main, gate) != 0) {
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                               "http gate: cannot start its thread");
    } else {
      gate->thread_started = true;
    }
  }
  if (status) {
    gate->options.listen_fd = -1;  // still the caller's on failure
    pcp_http_gate_stop(gate);
    return status;
  }
  *out_gate = gate;
  return pcp_ok_status();
}

void pcp_http_gate_stop(pcp_http_gate_t* gate) {
  if (!gate) {
    return;
  }
  if (gate->thread_started) {
    char byte = 1;
    ssize_t written = write(gate->wake_fds[1], &byte, 1);
    PCP_UNUSED(written);
    pthread_join(gate->thread, NULL);
  }
  while (gate->head) {
    conn_drop(gate, gate->head);
  }
  if (gate->options.listen_fd >= 0) {
    close(gate->options.listen_fd);
  }
  if (gate->epoll_fd >= 0) {
    close(gate->epoll_fd);
  }
  for (int i = 0; i < 2; ++i) {
    if (gate->wake_fds[i] >= 0) {
      close(gate->wake_fds[i]);
    }
  }
  pcp_allocator_free(gate->allocator, gate->peek_buffer);
  pcp_allocator_free(gate->allocator, gate);
}
