// SPDX-License-Identifier: Apache-2.0
//
// The server: libmicrohttpd wiring, the per-request pipeline (limits,
// routing, auth, body, handler), the error schema on every failure path, and
// the request metrics.
//
// Threading: libmicrohttpd's internal epoll threads (a pool of
// |thread_count|, each with its own epoll set) call on_access and the
// notification callbacks. Everything they touch is either immutable after
// start (router, scopes, limits), atomic (inflight, draining) or lock-free
// in the obs registry. See docs/decisions.md "http" for why this mode and
// not a thread per connection or an external select loop.

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "http/http_impl.h"

// Open connections of one client address (see on_connection).
typedef struct client_entry_t {
  uint8_t key[16];
  uint32_t count;
  struct client_entry_t* next;
} client_entry_t;

#define PCP_HTTP_CLIENT_BUCKETS 256

typedef struct scope_entry_t {
  char* name;       // owned
  char* env_var;    // owned
  bool configured;  // the variable held a non-empty token at create
  pcp_sha256_t digest;
} scope_entry_t;

enum {
  FAMILY_REQUESTS = 0,
  FAMILY_DURATION,
  FAMILY_REQUEST_BYTES,
  FAMILY_RESPONSE_BYTES,
  FAMILY_CONNECTIONS,
  FAMILY_GATE_ANSWERS,
  FAMILY_COUNT,
};

struct pcp_http_server_t {
  pcp_allocator_t allocator;
  char name[64];
  char host[64];
  uint16_t requested_port;
  char* tls_cert_path;  // owned
  char* tls_key_path;   // owned
  void* tls_cert_pem;   // read at start; kept until release
  void* tls_key_pem;
  size_t scope_count;
  scope_entry_t scopes[PCP_HTTP_MAX_SCOPES];
  size_t max_body_bytes;
  size_t max_header_bytes;
  size_t max_url_bytes;
  size_t max_json_depth;
  uint32_t max_connections;
  uint32_t max_connections_per_client;
  uint32_t connection_timeout_s;
  uint32_t header_timeout_ms;
  size_t max_header_count;
  uint32_t thread_count;
  pcp_clock_t clock;
  pcp_log_context_t log_context;
  pcp_http_router_t router;
  pcp_obs_family_t* families[FAMILY_COUNT];  // all NULL without a registry
  pcp_obs_series_t* connections_series;
  struct MHD_Daemon* daemon;
  // Plain HTTP: the thread that accepts and holds connections until their
  // headers are in (gate.c). NULL with TLS, where libmicrohttpd accepts.
  pcp_http_gate_t* gate;
  pthread_mutex_t clients_mutex;
  client_entry_t* clients[PCP_HTTP_CLIENT_BUCKETS];
  bool started;
  uint16_t bound_port;
  _Atomic int64_t inflight;
  _Atomic int64_t open_connections;
  _Atomic bool draining;
  pcp_http_sse_registry_t sse_registry;
  // Request ids made here: "<seed>-<counter>" in hex; the seed (wall clock
  // at create) keeps ids apart across restarts.
  uint64_t request_id_seed;
  _Atomic uint64_t request_id_counter;
};

// Connections libmicrohttpd accepts above max_connections, so that the
// excess gets a 503 with a JSON body rather than a silent close.
#define PCP_HTTP_CONNECTION_SLACK 64

// The body sent when even building an error fails (out of memory): static,
// so it needs no allocation.
static const char kOutOfMemoryBody[] =
    "{\"error\":{\"code\":\"RESOURCE_EXHAUSTED\",\"message\":\"out of "
    "memory\"}}";

//===----------------------------------------------------------------------===//
// Metrics
//===----------------------------------------------------------------------===//

static const char* const kRouteLabels[] = {"server", "route", "method",
                                           "status_class", NULL};
static const char* const kBytesLabels[] = {"server", "route", NULL};
static const char* const kServerLabels[] = {"server", NULL};
static const char* const kGateLabels[] = {"server", "status", NULL};
// Handlers answer in well under a millisecond to seconds: finer low buckets
// than obs's default 5 ms floor.
static const double kDurationBuckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01,
                                          0.025,  0.05,  0.1,    0.25,  0.5,
                                          1,      2.5,   5,      10};

static const pcp_obs_metric_def_t kMetricDefs[FAMILY_COUNT] = {
    {"pcp_http_requests_total", PCP_OBS_METRIC_TYPE_COUNTER,
     "HTTP requests answered, by server, route pattern, method and status "
     "class.",
     kRouteLabels, NULL, 0, 0},
    {"pcp_http_request_duration_seconds", PCP_OBS_METRIC_TYPE_HISTOGRAM,
     "Time from request headers to the queued response, by server, "
     "route pattern, method and status class.",
     kRouteLabels, kDurationBuckets, PCP_ARRAYSIZE(kDurationBuckets), 0},
    {"pcp_http_request_body_bytes_total", PCP_OBS_METRIC_TYPE_COUNTER,
     "Request body bytes received, by server and route pattern.", kBytesLabels,
     NULL, 0, 0},
    {"pcp_http_response_body_bytes_total", PCP_OBS_METRIC_TYPE_COUNTER,
     "Response body bytes queued, by server and route pattern.", kBytesLabels,
     NULL, 0, 0},
    {"pcp_http_connections", PCP_OBS_METRIC_TYPE_GAUGE,
     "Open HTTP connections, by server.", kServerLabels, NULL, 0, 0},
    {"pcp_http_gate_answers_total", PCP_OBS_METRIC_TYPE_COUNTER,
     "Connections answered and closed before their first request reached "
     "the server (408 header deadline or eviction, 400/414/431 limits, "
     "429/503 connection caps), by server and status.",
     kGateLabels, NULL, 0, 0},
};

static pcp_status_t metrics_register(pcp_http_server_t* server,
                                     pcp_obs_registry_t* registry) {
  // Several servers in one process (gateway API and probes, say) share the
  // families and tell their series apart by the "server" label.
  if (!pcp_obs_registry_find(registry, kMetricDefs[0].name)) {
    pcp_status_t status = pcp_obs_registry_register(
        registry, kMetricDefs, FAMILY_COUNT, server->families);
    if (!status) {
      goto registered;
    }
    if (pcp_status_code(status) != PCP_STATUS_ALREADY_EXISTS) {
      return status;
    }
    pcp_status_ignore(status);  // lost a race with another server
  }
  for (size_t i = 0; i < FAMILY_COUNT; ++i) {
    server->families[i] = pcp_obs_registry_find(registry, kMetricDefs[i].name);
    if (!server->families[i]) {
      return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                             "metric %s missing from a registry that has %s",
                             kMetricDefs[i].name, kMetricDefs[0].name);
    }
  }
registered:
  return pcp_obs_family_series_get(server->families[FAMILY_CONNECTIONS],
                                   (const char*[]){server->name},
                                   &server->connections_series);
}

static size_t status_class_index(int http_status) {
  if (http_status < 100 || http_status > 599) {
    return 0;  // the client left before an answer was queued
  }
  return (size_t)(http_status / 100);
}

static const char* status_class(int http_status) {
  static const char* const kClasses[] = {"aborted", "1xx", "2xx",
                                         "3xx",     "4xx", "5xx"};
  return kClasses[status_class_index(http_status)];
}

// Returns the series in |slot|, looking it up on first use. NULL when the
// lookup fails (the caller then takes the uncached path).
static pcp_obs_series_t* cached_series(_Atomic(pcp_obs_series_t*)* slot,
                                       pcp_obs_family_t* family,
                                       const char* const* labels) {
  pcp_obs_series_t* series = atomic_load_explicit(slot, memory_order_acquire);
  if (series) {
    return series;
  }
  pcp_status_t status = pcp_obs_family_series_get(family, labels, &series);
  if (status) {
    pcp_status_ignore(status);
    return NULL;
  }
  // Two threads may race here; both find the same series.
  atomic_store_explicit(slot, series, memory_order_release);
  return series;
}

// Recorded when the response is queued, not when it is fully sent, so that
// a client that has read an answer finds it counted in /metrics; the
// duration is therefore the time to produce the answer.
static void metrics_record(pcp_http_server_t* server,
                           const pcp_http_request_t* request) {
  // The access log: one line per request, debug level.
  PCP_LOG(PCP_LOG_DEBUG, &server->log_context,
          "http request=%s method=%s route=%s status=%d remote=%s "
          "duration_us=%lld",
          request->request_id, request->method_label,
          request->route ? request->route->pattern : "unmatched",
          request->http_status, request->remote_address,
          (long long)((pcp_clock_now_ns(server->clock) - request->start_ns) /
                      1000));
  if (!server->families[FAMILY_REQUESTS]) {
    return;
  }
  // The pattern, never the raw path: label values must stay a bounded set.
  const char* route = request->route ? request->route->pattern : "unmatched";
  const char* labels[] = {server->name, route, request->method_label,
                          status_class(request->http_status)};
  const char* byte_labels[] = {server->name, route};
  double seconds =
      (double)(pcp_clock_now_ns(server->clock) - request->start_ns) / 1e9;
  seconds = seconds < 0 ? 0 : seconds;
  // Routes are immutable after start except for these caches.
  pcp_http_route_entry_t* entry = (pcp_http_route_entry_t*)request->route;
  pcp_obs_series_t* requests = NULL;
  pcp_obs_series_t* duration = NULL;
  pcp_obs_series_t* request_bytes = NULL;
  pcp_obs_series_t* response_bytes = NULL;
  if (entry && strcmp(entry->method, "*") != 0) {
    size_t index = status_class_index(request->http_status);
    requests = cached_series(&entry->requests_series[index],
                             server->families[FAMILY_REQUESTS], labels);
    duration = cached_series(&entry->duration_series[index],
                             server->families[FAMILY_DURATION], labels);
    request_bytes =
        cached_series(&entry->request_bytes_series,
                      server->families[FAMILY_REQUEST_BYTES], byte_labels);
    response_bytes =
        cached_series(&entry->response_bytes_series,
                      server->families[FAMILY_RESPONSE_BYTES], byte_labels);
  }
  if (requests && duration && request_bytes && response_bytes) {
    pcp_obs_counter_increment(requests);
    pcp_obs_histogram_observe(duration, seconds);
    pcp_obs_counter_add(request_bytes, (double)request->request_bytes);
    pcp_obs_counter_add(response_bytes, (double)request->response_bytes);
    return;
  }
  pcp_obs_family_add(server->families[FAMILY_REQUESTS], labels, 1);
  pcp_obs_family_observe(server->families[FAMILY_DURATION], labels, seconds);
  pcp_obs_family_add(server->families[FAMILY_REQUEST_BYTES], byte_labels,
                     (double)request->request_bytes);
  pcp_obs_family_add(server->families[FAMILY_RESPONSE_BYTES], byte_labels,
                     (double)request->response_bytes);
}

static const char* method_label(const char* method) {
  static const char* const kMethods[] = {"GET",    "HEAD",  "POST",   "PUT",
                                         "DELETE", "PATCH", "OPTIONS"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(kMethods); ++i) {
    if (strcmp(method, kMethods[i]) == 0) {
      return kMethods[i];
    }
  }
  return "OTHER";  // arbitrary tokens must not become label values
}

//===----------------------------------------------------------------------===//
// Responses
//===----------------------------------------------------------------------===//

// Queues the static out-of-memory answer. Returns libmicrohttpd's result.
static enum MHD_Result queue_out_of_memory(pcp_http_request_t* request,
                                           struct MHD_Connection* connection) {
  struct MHD_Response* response = MHD_create_response_from_buffer(
      sizeof(kOutOfMemoryBody) - 1, (void*)kOutOfMemoryBody,
      MHD_RESPMEM_PERSISTENT);
  if (!response) {
    return MHD_NO;  // nothing left to answer with
  }
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE,
                          "application/json");
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONNECTION, "close");
  enum MHD_Result result = MHD_queue_response(connection, 500, response);
  MHD_destroy_response(response);
  if (request && result == MHD_YES) {
    request->responded = true;
    request->http_status = 500;
    request->response_bytes = sizeof(kOutOfMemoryBody) - 1;
    metrics_record(request->server, request);
  }
  return result;
}

// Hands |built| to libmicrohttpd (the body moves; |built| is deinitialized).
// Returns MHD_NO only when libmicrohttpd refused the response, for example
// when called while a body is still streaming in.
static enum MHD_Result queue_built(pcp_http_server_t* server,
                                   pcp_http_request_t* request,
                                   pcp_http_response_t* built) {
  struct MHD_Response* response = NULL;
  size_t body_length = built->body_length;
  if (built->file_fd >= 0) {
    body_length = (size_t)built->file_byte_length;
    response =
        MHD_create_response_from_fd64(built->file_byte_length, built->file_fd);
    if (response) {
      built->file_fd = -1;  // libmicrohttpd closes it with the response
    }
  } else if (built->sse) {
    response = pcp_http_sse_response_create(built->sse, &server->sse_registry,
                                            request->connection);
    built->sse = NULL;  // the response (or its failure) took the reference
  } else if (built->body_block) {
    // Copied through the server's allocator: the callback returns the block
    // to it once libmicrohttpd is done with the response.
    response = MHD_create_response_from_buffer_with_free_callback_cls(
        body_length, built->body, pcp_http_body_block_free, built->body_block);
    if (response) {
      built->body = NULL;  // owned by libmicrohttpd now
      built->body_block = NULL;
    }
  } else if (built->body) {
    // libc memory (body_take's contract): libmicrohttpd free()s it.
    response = MHD_create_response_from_buffer(body_length, built->body,
                                               MHD_RESPMEM_MUST_FREE);
    if (response) {
      built->body = NULL;  // owned by libmicrohttpd now
    }
  } else {
    response =
        MHD_create_response_from_buffer(0, (void*)"", MHD_RESPMEM_PERSISTENT);
  }
  if (!response) {
    pcp_http_response_deinitialize(built);
    return queue_out_of_memory(request, request->connection);
  }
  bool ok = true;
  if (built->content_type) {
    ok = ok && MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE,
                                       built->content_type) == MHD_YES;
  }
  for (size_t i = 0; i < built->header_count; ++i) {
    ok = ok && MHD_add_response_header(response, built->header_names[i],
                                       built->header_values[i]) == MHD_YES;
  }
  ok = ok && MHD_add_response_header(response, "X-Request-Id",
                                     request->request_id) == MHD_YES;
  if (atomic_load(&server->draining) || request->close_connection) {
    // Tells keep-alive clients to go elsewhere while we stop.
    ok = ok && MHD_add_response_header(response, MHD_HTTP_HEADER_CONNECTION,
                                       "close") == MHD_YES;
  }
  int http_status = built->http_status;
  pcp_http_response_deinitialize(built);
  if (!ok) {
    MHD_destroy_response(response);
    return queue_out_of_memory(request, request->connection);
  }
  enum MHD_Result result =
      MHD_queue_response(request->connection, (unsigned)http_status, response);
  MHD_destroy_response(response);
  if (result == MHD_YES) {
    request->responded = true;
    request->http_status = http_status;
    request->response_bytes = body_length;
    metrics_record(server, request);
  }
  return result;
}

// Queues the JSON error schema with |http_status| and |code|, plus one
// optional extra header.
static enum MHD_Result queue_error(pcp_http_server_t* server,
                                   pcp_http_request_t* request, int http_status,
                                   const char* code, const char* message,
                                   const char* header_name,
                                   const char* header_value) {
  pcp_http_response_t built;
  pcp_http_response_initialize(server->allocator, &built);
  pcp_status_t status =
      pcp_http_response_error_set(&built, http_status, code, message);
  if (!status && header_name) {
    status = pcp_http_response_header_add(&built, header_name, header_value);
  }
  if (status) {
    pcp_status_ignore(status);
    pcp_http_response_deinitialize(&built);
    return queue_out_of_memory(request, request->connection);
  }
  return queue_built(server, request, &built);
}

//===----------------------------------------------------------------------===//
// The request pipeline
//===----------------------------------------------------------------------===//

static void request_free(pcp_http_server_t* server,
                         pcp_http_request_t* request) {
  for (size_t i = 0; i < request->param_count; ++i) {
    pcp_allocator_free(server->allocator, request->param_values[i]);
  }
  pcp_allocator_free(server->allocator, request->path);
  pcp_allocator_free(server->allocator, request->body);
  pcp_allocator_free(server->allocator, request);
}

static void format_remote_address(struct MHD_Connection* connection,
                                  char* buffer, size_t capacity) {
  snprintf(buffer, capacity, "unknown");
  const union MHD_ConnectionInfo* info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  if (!info || !info->client_addr) {
    return;
  }
  char host[INET6_ADDRSTRLEN] = "";
  const struct sockaddr* address = info->client_addr;
  if (address->sa_family == AF_INET) {
    struct sockaddr_in in4;
    memcpy(&in4, address, sizeof(in4));
    inet_ntop(AF_INET, &in4.sin_addr, host, sizeof(host));
    snprintf(buffer, capacity, "%s:%u", host, (unsigned)ntohs(in4.sin_port));
  } else if (address->sa_family == AF_INET6) {
    struct sockaddr_in6 in6;
    memcpy(&in6, address, sizeof(in6));
    inet_ntop(AF_INET6, &in6.sin6_addr, host, sizeof(host));
    snprintf(buffer, capacity, "[%s]:%u", host, (unsigned)ntohs(in6.sin6_port));
  }
}

typedef struct byte_count_t {
  size_t total;
} byte_count_t;

static enum MHD_Result count_pair_bytes(void* cls, enum MHD_ValueKind kind,
                                        const char* key, const char* value) {
  PCP_UNUSED(kind);
  byte_count_t* count = cls;
  // "Name: value\r\n" on the wire (query pairs: "k=v&").
  count->total += (key ? strlen(key) : 0) + (value ? strlen(value) : 0) + 4;
  return MHD_YES;
}

// Bearer token check. Returns 0 when |request| may proceed, else the HTTP
// status to answer with (and fills the code, message and challenge).
static int authenticate(const pcp_http_server_t* server,
                        const pcp_http_request_t* request,
                        const char** out_code, const char** out_message,
                        const char** out_challenge) {
  int scope_index = request->route->scope_index;
  if (scope_index < 0) {
    return 0;
  }
  const char* header = pcp_http_request_header(request, "Authorization");
  const char* token = NULL;
  size_t token_length = 0;
  if (header && strncasecmp(header, "Bearer ", 7) == 0) {
    token = header + 7;
    while (*token == ' ') {
      ++token;
    }
    token_length = strlen(token);
    while (token_length > 0 && token[token_length - 1] == ' ') {
      --token_length;
    }
  }
  if (token_length == 0) {
    *out_code = "UNAUTHENTICATED";
    *out_message = "missing bearer token";
    *out_challenge = "Bearer realm=\"pcp\"";
    return 401;
  }
  pcp_sha256_t digest;
  pcp_sha256_compute(token, token_length, &digest);
  // Every configured scope is compared, with no early exit, so the time
  // taken does not say which scope (if any) a token belongs to.
  bool matches[PCP_HTTP_MAX_SCOPES] = {false};
  bool any_match = false;
  for (size_t i = 0; i < server->scope_count; ++i) {
    const scope_entry_t* scope = &server->scopes[i];
    bool equal = CRYPTO_memcmp(digest.bytes, scope->digest.bytes,
                               sizeof(digest.bytes)) == 0;
    matches[i] = equal && scope->configured;
    any_match |= matches[i];
  }
  if (matches[scope_index]) {
    return 0;
  }
  if (any_match) {
    // Authenticated, but for another scope: 403 (RFC 6750's
    // insufficient_scope) tells the caller that retrying with the same
    // token is pointless; see docs/decisions.md.
    *out_code = "PERMISSION_DENIED";
    *out_message = "token is not valid for this route's scope";
    *out_challenge = "Bearer realm=\"pcp\", error=\"insufficient_scope\"";
    return 403;
  }
  *out_code = "UNAUTHENTICATED";
  *out_message = "invalid bearer token";
  *out_challenge = "Bearer realm=\"pcp\", error=\"invalid_token\"";
  return 401;
}

static bool request_id_is_safe(const char* value) {
  size_t length = strlen(value);
  if (length == 0 || length > PCP_HTTP_MAX_REQUEST_ID_BYTES) {
    return false;
  }
  // Only characters that are harmless in headers, logs and JSON.
  for (size_t i = 0; i < length; ++i) {
    char c = value[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) {
      return false;
    }
  }
  return true;
}

static void request_id_assign(pcp_http_server_t* server,
                              struct MHD_Connection* connection,
                              pcp_http_request_t* request) {
  const char* given =
      MHD_lookup_connection_value(connection, MHD_HEADER_KIND, "X-Request-Id");
  if (given && request_id_is_safe(given)) {
    snprintf(request->request_id, sizeof(request->request_id), "%s", given);
    return;
  }
  uint64_t counter = atomic_fetch_add(&server->request_id_counter, 1);
  snprintf(request->request_id, sizeof(request->request_id), "%llx-%llx",
           (unsigned long long)server->request_id_seed,
           (unsigned long long)counter);
}

static pcp_status_t request_create(pcp_http_server_t* server,
                                   struct MHD_Connection* connection,
                                   const char* url, const char* method,
                                   pcp_http_request_t** out_request) {
  pcp_http_request_t* request = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      server->allocator, sizeof(*request), (void**)&request));
  request->server = server;
  request->connection = connection;
  request->method = method;
  request->method_label = method_label(method);
  request->start_ns = pcp_clock_now_ns(server->clock);
  format_remote_address(connection, request->remote_address,
                        sizeof(request->remote_address));
  request_id_assign(server, connection, request);
  size_t length = strlen(url);
  pcp_status_t status = pcp_allocator_malloc(server->allocator, length + 1,
                                             (void**)&request->path);
  if (status) {
    pcp_allocator_free(server->allocator, request);
    return status;
  }
  memcpy(request->path, url, length + 1);
  *out_request = request;
  return pcp_ok_status();
}

// True when the request announces a body (Content-Length > 0 or a
// Transfer-Encoding).
static bool request_has_body(const pcp_http_request_t* request) {
  const char* length = pcp_http_request_header(request, "Content-Length");
  if (length && strcmp(length, "0") != 0) {
    return true;
  }
  return pcp_http_request_header(request, "Transfer-Encoding") != NULL;
}

// An error found from the headers alone. Without a body it is kept until
// libmicrohttpd's final call, because a response queued on the first call
// makes it close the connection, and a 404 should not cost a keep-alive
// client its connection. With a body it goes out at once, so that the body
// is never read (the connection then closes, which is what a refused
// upload wants).
static enum MHD_Result early_error(pcp_http_server_t* server,
                                   pcp_http_request_t* request, int http_status,
                                   const char* code, const char* message,
                                   const char* header_name,
                                   const char* header_value) {
  if (request_has_body(request)) {
    return queue_error(server, request, http_status, code, message, header_name,
                       header_value);
  }
  request->deferred_status = http_status;
  request->deferred_code = code;
  snprintf(request->deferred_message, sizeof(request->deferred_message), "%s",
           message);
  request->deferred_header_name = header_name;
  snprintf(request->deferred_header_value,
           sizeof(request->deferred_header_value), "%s",
           header_value ? header_value : "");
  return MHD_YES;
}

// Runs once the headers are in: limits, routing, auth, the declared body
// length. Either queues an error or lets the body (if any) stream in.
static enum MHD_Result on_headers(pcp_http_server_t* server,
                                  pcp_http_request_t* request) {
  struct MHD_Connection* connection = request->connection;
  char message[256];

  if (atomic_load(&server->open_connections) >
          (int64_t)server->max_connections &&
      !pcp_http_path_is_probe(request->path, strlen(request->path))) {
    // Over our limit but inside libmicrohttpd's (which has slack above
    // ours): answer 503 and close, instead of the silent close that
    // libmicrohttpd's own limit gives. The probes keep the slack: a
    // liveness check must not fail because the API is busy.
    request->close_connection = true;
    snprintf(message, sizeof(message),
             "server is at its limit of %u connections",
             (unsigned)server->max_connections);
    return early_error(server, request, 503, "UNAVAILABLE", message,
                       "Retry-After", "1");
  }

  byte_count_t url_bytes = {strlen(request->path)};
  MHD_get_connection_values(connection, MHD_GET_ARGUMENT_KIND, count_pair_bytes,
                            &url_bytes);
  if (url_bytes.total > server->max_url_bytes) {
    snprintf(message, sizeof(message), "URL exceeds %zu bytes",
             server->max_url_bytes);
    return early_error(server, request, 414, "RESOURCE_EXHAUSTED", message,
                       NULL, NULL);
  }
  byte_count_t header_bytes = {0};
  int header_count = MHD_get_connection_values(connection, MHD_HEADER_KIND,
                                               count_pair_bytes, &header_bytes);
  if (header_count > 0 && (size_t)header_count > server->max_header_count) {
    snprintf(message, sizeof(message), "more than %zu request headers",
             server->max_header_count);
    return early_error(server, request, 431, "RESOURCE_EXHAUSTED", message,
                       NULL, NULL);
  }
  if (header_bytes.total > server->max_header_bytes) {
    snprintf(message, sizeof(message), "request headers exceed %zu bytes",
             server->max_header_bytes);
    return early_error(server, request, 431, "RESOURCE_EXHAUSTED", message,
                       NULL, NULL);
  }

  pcp_http_route_match_t match;
  pcp_http_router_match(&server->router, request->method, request->path,
                        &match);
  if (!match.route) {
    if (match.path_matched) {
      snprintf(message, sizeof(message),
               "method %.16s not allowed; allowed: %s", request->method,
               match.allow);
      return early_error(server, request, 405, "METHOD_NOT_ALLOWED", message,
                         MHD_HTTP_HEADER_ALLOW, match.allow);
    }
    snprintf(message, sizeof(message), "no route for %.16s %.200s",
             request->method, request->path);
    return early_error(server, request, 404, "NOT_FOUND", message, NULL, NULL);
  }
  request->route = match.route;
  for (size_t i = 0; i < match.param_count; ++i) {
    size_t length = match.param_end[i] - match.param_begin[i];
    char* value = NULL;
    pcp_status_t status =
        pcp_allocator_malloc(server->allocator, length + 1, (void**)&value);
    if (status) {
      pcp_status_ignore(status);
      return queue_out_of_memory(request, connection);
    }
    memcpy(value, request->path + match.param_begin[i], length);
    value[length] = '\0';
    request->param_names[i] = match.param_names[i];
    request->param_values[i] = value;
    request->param_count = i + 1;
  }

  const char* code = NULL;
  const char* auth_message = NULL;
  const char* challenge = NULL;
  int auth_status =
      authenticate(server, request, &code, &auth_message, &challenge);
  if (auth_status) {
    return early_error(server, request, auth_status, code, auth_message,
                       MHD_HTTP_HEADER_WWW_AUTHENTICATE, challenge);
  }

  request->body_limit = request->route->max_body_bytes
                            ? request->route->max_body_bytes
                            : server->max_body_bytes;
  const char* content_length =
      pcp_http_request_header(request, "Content-Length");
  if (content_length) {
    uint64_t declared = 0;
    if (!pcp_string_view_parse_uint64(pcp_make_cstring_view(content_length),
                                      &declared)) {
      return early_error(server, request, 400, "INVALID_ARGUMENT",
                         "bad Content-Length", NULL, NULL);
    }
    if (declared > request->body_limit) {
      // Refused before a byte of the body is read.
      snprintf(message, sizeof(message),
               "request body of %llu bytes exceeds the limit of %zu bytes",
               (unsigned long long)declared, request->body_limit);
      return early_error(server, request, 413, "RESOURCE_EXHAUSTED", message,
                         NULL, NULL);
    }
  }
  return MHD_YES;
}

// Appends streamed body bytes. Returns false (and sets the flag) when the
// running total passes the limit; nothing past the limit is stored.
static bool body_append(pcp_http_server_t* server, pcp_http_request_t* request,
                        const char* data, size_t size, bool* out_oom) {
  *out_oom = false;
  if (size > request->body_limit - request->body_length) {
    request->body_too_large = true;
    return false;
  }
  size_t needed = request->body_length + size + 1;
  if (needed > request->body_capacity) {
    size_t capacity = request->body_capacity ? request->body_capacity : 1024;
    while (capacity < needed) {
      capacity *= 2;
    }
    if (capacity > request->body_limit + 1) {
      capacity = request->body_limit + 1;
    }
    void* body = request->body;
    pcp_status_t status =
        pcp_allocator_realloc(server->allocator, capacity, &body);
    if (status) {
      pcp_status_ignore(status);
      *out_oom = true;
      return false;
    }
    request->body = body;
    request->body_capacity = capacity;
  }
  memcpy(request->body + request->body_length, data, size);
  request->body_length += size;
  request->body[request->body_length] = '\0';
  request->request_bytes = request->body_length;
  return true;
}

static enum MHD_Result body_too_large(pcp_http_server_t* server,
                                      pcp_http_request_t* request) {
  char message[128];
  snprintf(message, sizeof(message),
           "request body exceeds the limit of %zu bytes", request->body_limit);
  return queue_error(server, request, 413, "RESOURCE_EXHAUSTED", message, NULL,
                     NULL);
}

// Writes the 413 straight onto the socket, for the one case libmicrohttpd
// cannot answer: a chunked body that passes the limit while it streams in
// (MHD_queue_response is refused until the body has ended). The client sees
// the JSON answer at once; the rest of its body is read and dropped up to
// the discard cap, then the connection closes. False with TLS, where the
// socket carries records only libmicrohttpd can write.
static bool body_too_large_raw(pcp_http_server_t* server,
                               pcp_http_request_t* request) {
  if (server->tls_cert_path) {
    return false;
  }
  const union MHD_ConnectionInfo* info = MHD_get_connection_info(
      request->connection, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!info) {
    return false;
  }
  char message[128];
  snprintf(message, sizeof(message),
           "request body exceeds the limit of %zu bytes", request->body_limit);
  char request_id_header[160];
  snprintf(request_id_header, sizeof(request_id_header), "X-Request-Id: %s\r\n",
           request->request_id);
  size_t body_bytes = 0;
  bool ok = pcp_http_raw_error_send(info->connect_fd, 413, "RESOURCE_EXHAUSTED",
                                    message, request_id_header, &body_bytes);
  if (ok) {
    request->responded = true;
    request->answered_raw = true;
    request->http_status = 413;
    request->response_bytes = body_bytes;
    metrics_record(server, request);
  }
  return ok;
}

static enum MHD_Result run_handler(pcp_http_server_t* server,
                                   pcp_http_request_t* request) {
  const pcp_http_route_entry_t* route = request->route;
  pcp_http_response_t built;
  pcp_http_response_initialize(server->allocator, &built);
  pcp_status_t status = route->handler(route->user_data, request, &built);
  if (!status && built.http_status == 0) {
    status = pcp_make_status(PCP_STATUS_INTERNAL,
                             "handler for %s %s set no response",
                             request->method, route->pattern);
  }
  if (status) {
    // The handler's partial response is dropped: the status is the answer.
    pcp_http_response_deinitialize(&built);
    pcp_http_response_initialize(server->allocator, &built);
    int http_status = pcp_http_status_from_code(pcp_status_code(status));
    if (http_status >= 500) {
      pcp_log_status(PCP_LOG_WARN, &server->log_context, status,
                     route->pattern);
    }
    pcp_status_t set_status = pcp_http_response_status_set(&built, status);
    pcp_status_ignore(status);
    if (set_status) {
      pcp_status_ignore(set_status);
      pcp_http_response_deinitialize(&built);
      return queue_out_of_memory(request, request->connection);
    }
    if (http_status == 401) {
      pcp_status_ignore(pcp_http_response_header_add(
          &built, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"pcp\""));
    }
  }
  return queue_built(server, request, &built);
}

static enum MHD_Result on_access(void* cls, struct MHD_Connection* connection,
                                 const char* url, const char* method,
                                 const char* version, const char* upload_data,
                                 size_t* upload_data_size, void** con_cls) {
  PCP_UNUSED(version);
  pcp_http_server_t* server = cls;
  pcp_http_request_t* request = *con_cls;
  if (!request) {
    pcp_status_t status =
        request_create(server, connection, url, method, &request);
    if (status) {
      pcp_status_ignore(status);
      return queue_out_of_memory(NULL, connection);
    }
    atomic_fetch_add(&server->inflight, 1);
    *con_cls = request;
    return on_headers(server, request);
  }
  if (request->answered_raw) {
    // The 413 went out on the socket: drop the body up to the discard cap,
    // then (or when it ends) close.
    request->discarded_bytes += *upload_data_size;
    bool more = *upload_data_size > 0 &&
                request->discarded_bytes <= PCP_HTTP_MAX_DISCARD_BYTES;
    *upload_data_size = 0;
    return more ? MHD_YES : MHD_NO;
  }
  if (request->responded ||
      (request->deferred_status && *upload_data_size > 0)) {
    // An early answer (413, 401, ...) is queued; drop whatever body comes.
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (*upload_data_size > 0) {
    if (request->body_too_large) {
      // libmicrohttpd will not take a response while a body streams in, so
      // the rest of an oversized chunked body is read and dropped until the
      // 413 can go out. A sender that keeps going past the discard cap is
      // cut off: reading without end is worse than a closed socket.
      request->discarded_bytes += *upload_data_size;
      if (request->discarded_bytes > PCP_HTTP_MAX_DISCARD_BYTES) {
        PCP_LOG(PCP_LOG_WARN, &server->log_context,
                "closing %s: body kept coming %zu bytes past the limit of "
                "%zu",
                request->remote_address, request->discarded_bytes,
                request->body_limit);
        return MHD_NO;
      }
    } else {
      bool oom = false;
      if (!body_append(server, request, upload_data, *upload_data_size, &oom)) {
        if (oom) {
          *upload_data_size = 0;
          return queue_out_of_memory(request, connection);
        }
        // Try to answer at once; libmicrohttpd refuses a response while
        // the body is still arriving, in which case the rest is read and
        // dropped and the 413 goes out at the end (below).
        if (body_too_large(server, request) == MHD_YES ||
            body_too_large_raw(server, request)) {
          *upload_data_size = 0;
          return MHD_YES;
        }
      }
    }
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (request->deferred_status) {
    return queue_error(server, request, request->deferred_status,
                       request->deferred_code, request->deferred_message,
                       request->deferred_header_name,
                       request->deferred_header_value);
  }
  if (request->body_too_large) {
    return body_too_large(server, request);
  }
  return run_handler(server, request);
}

static void on_completed(void* cls, struct MHD_Connection* connection,
                         void** con_cls,
                         enum MHD_RequestTerminationCode termination) {
  PCP_UNUSED(connection);
  PCP_UNUSED(termination);
  pcp_http_server_t* server = cls;
  pcp_http_request_t* request = *con_cls;
  if (!request) {
    return;
  }
  *con_cls = NULL;
  if (!request->responded) {
    metrics_record(server, request);  // the client left before an answer
  }
  request_free(server, request);
  atomic_fetch_sub(&server->inflight, 1);
}

static size_t client_bucket(const uint8_t key[16]) {
  uint32_t hash = 2166136261u;  // FNV-1a
  for (int i = 0; i < 16; ++i) {
    hash = (hash ^ key[i]) * 16777619u;
  }
  return hash % PCP_HTTP_CLIENT_BUCKETS;
}

static client_entry_t* client_find(pcp_http_server_t* server,
                                   const uint8_t key[16]) {
  for (client_entry_t* e = server->clients[client_bucket(key)]; e;
       e = e->next) {
    if (memcmp(e->key, key, 16) == 0) {
      return e;
    }
  }
  return NULL;
}

static uint32_t client_open_count(void* user_data, const uint8_t key[16]) {
  pcp_http_server_t* server = user_data;
  pthread_mutex_lock(&server->clients_mutex);
  client_entry_t* entry = client_find(server, key);
  uint32_t count = entry ? entry->count : 0;
  pthread_mutex_unlock(&server->clients_mutex);
  return count;
}

// Counts the connection under its client's address; the entry goes into
// |socket_context| so that the close finds it without a lookup.
static void client_opened(pcp_http_server_t* server,
                          struct MHD_Connection* connection,
                          void** socket_context) {
  *socket_context = NULL;
  const union MHD_ConnectionInfo* info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  if (!info || !info->client_addr) {
    return;
  }
  uint8_t key[16];
  pcp_http_client_key(info->client_addr, key);
  pthread_mutex_lock(&server->clients_mutex);
  client_entry_t* entry = client_find(server, key);
  if (!entry) {
    // Out of memory: the connection goes uncounted (it is served; only the
    // per-client limit cannot see it).
    pcp_status_t status =
        pcp_allocator_calloc(server->allocator, sizeof(*entry), (void**)&entry);
    pcp_status_ignore(status);
    if (entry) {
      memcpy(entry->key, key, 16);
      size_t bucket = client_bucket(key);
      entry->next = server->clients[bucket];
      server->clients[bucket] = entry;
    }
  }
  if (entry) {
    ++entry->count;
  }
  pthread_mutex_unlock(&server->clients_mutex);
  *socket_context = entry;
}

static void client_closed(pcp_http_server_t* server, void** socket_context) {
  client_entry_t* entry = *socket_context;
  *socket_context = NULL;
  if (!entry) {
    return;
  }
  pthread_mutex_lock(&server->clients_mutex);
  if (--entry->count == 0) {
    client_entry_t** link = &server->clients[client_bucket(entry->key)];
    while (*link != entry) {
      link = &(*link)->next;
    }
    *link = entry->next;
    pcp_allocator_free(server->allocator, entry);
  }
  pthread_mutex_unlock(&server->clients_mutex);
}

static void on_connection(void* cls, struct MHD_Connection* connection,
                          void** socket_context,
                          enum MHD_ConnectionNotificationCode code) {
  pcp_http_server_t* server = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    client_opened(server, connection, socket_context);
  } else {
    client_closed(server, socket_context);
  }
  int64_t delta = code == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1;
  atomic_fetch_add(&server->open_connections, delta);
  if (server->connections_series) {
    pcp_obs_gauge_add(server->connections_series, (double)delta);
  }
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
static void on_mhd_log(void* cls, const char* fmt, va_list args) {
  pcp_http_server_t* server = cls;
  char line[512];
  vsnprintf(line, sizeof(line), fmt, args);
  size_t length = strlen(line);
  while (length > 0 && (line[length - 1] == '\n' || line[length - 1] == '\r')) {
    line[--length] = '\0';
  }
  PCP_LOG(PCP_LOG_WARN, &server->log_context, "libmicrohttpd: %s", line);
}
#pragma GCC diagnostic pop

//===----------------------------------------------------------------------===//
// Lifecycle
//===----------------------------------------------------------------------===//

size_t pcp_http_server_json_depth_limit(const pcp_http_server_t* server) {
  return server->max_json_depth;
}

static pcp_status_t copy_option_string(pcp_allocator_t allocator,
                                       const char* value, char** out_value) {
  *out_value = NULL;
  if (!value) {
    return pcp_ok_status();
  }
  pcp_status_t status = pcp_allocator_strdup(allocator, value, out_value);
  if (status) {
    pcp_status_ignore(status);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory copying options");
  }
  return pcp_ok_status();
}

static pcp_status_t scopes_load(pcp_http_server_t* server,
                                const pcp_http_server_options_t* options) {
  if (options->scope_count > PCP_HTTP_MAX_SCOPES) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%zu token scopes; at most %d", options->scope_count,
                           PCP_HTTP_MAX_SCOPES);
  }
  for (size_t i = 0; i < options->scope_count; ++i) {
    const pcp_http_scope_t* scope = &options->scopes[i];
    if (!scope->name || !scope->name[0] || !scope->env_var ||
        !scope->env_var[0]) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "token scope %zu needs a name and an "
                             "environment variable name",
                             i);
    }
    for (size_t j = 0; j < i; ++j) {
      if (strcmp(server->scopes[j].name, scope->name) == 0) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "token scope '%s' given twice", scope->name);
      }
    }
    scope_entry_t* entry = &server->scopes[i];
    PCP_RETURN_IF_ERROR_BARE(
        copy_option_string(server->allocator, scope->name, &entry->name));
    server->scope_count = i + 1;
    PCP_RETURN_IF_ERROR_BARE(
        copy_option_string(server->allocator, scope->env_var, &entry->env_var));
    // Read once, here: only the digest is kept, so the token itself never
    // sits in this process's heap beyond the environment block.
    const char* token = getenv(scope->env_var);
    entry->configured = token && token[0];
    if (entry->configured) {
      pcp_sha256_compute(token, strlen(token), &entry->digest);
    } else {
      PCP_LOG(PCP_LOG_WARN, &server->log_context,
              "token scope %s: environment variable %s is unset or empty; "
              "every request to this scope will get 401",
              scope->name, scope->env_var);
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_http_server_create(const pcp_http_server_options_t* options,
                                    pcp_allocator_t allocator,
                                    pcp_http_server_t** out_server) {
  *out_server = NULL;
  if (!options->tls_cert_path != !options->tls_key_path) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "TLS needs both a certificate and a key path");
  }
  pcp_http_server_t* server = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*server), (void**)&server));
  server->allocator = allocator;
  snprintf(server->name, sizeof(server->name), "%s",
           options->name ? options->name : "http");
  snprintf(server->host, sizeof(server->host), "%s",
           options->host ? options->host : "127.0.0.1");
  server->requested_port = options->port;
  // An option left 0 takes its default.
#define OPTION_OR_DEFAULT(field, fallback) \
  server->field = options->field ? options->field : (fallback)
  OPTION_OR_DEFAULT(max_body_bytes, PCP_HTTP_DEFAULT_MAX_BODY_BYTES);
  OPTION_OR_DEFAULT(max_header_bytes, PCP_HTTP_DEFAULT_MAX_HEADER_BYTES);
  OPTION_OR_DEFAULT(max_url_bytes, PCP_HTTP_DEFAULT_MAX_URL_BYTES);
  OPTION_OR_DEFAULT(max_json_depth, PCP_HTTP_DEFAULT_MAX_JSON_DEPTH);
  OPTION_OR_DEFAULT(max_connections, PCP_HTTP_DEFAULT_MAX_CONNECTIONS);
  OPTION_OR_DEFAULT(max_connections_per_client,
                    PCP_HTTP_DEFAULT_MAX_CONNECTIONS_PER_CLIENT);
  OPTION_OR_DEFAULT(header_timeout_ms, PCP_HTTP_DEFAULT_HEADER_TIMEOUT_MS);
  OPTION_OR_DEFAULT(max_header_count, PCP_HTTP_DEFAULT_MAX_HEADER_COUNT);
  OPTION_OR_DEFAULT(connection_timeout_s,
                    PCP_HTTP_DEFAULT_CONNECTION_TIMEOUT_S);
  OPTION_OR_DEFAULT(thread_count, PCP_HTTP_DEFAULT_THREAD_COUNT);
#undef OPTION_OR_DEFAULT
  server->clock = options->clock.now_ns ? options->clock : pcp_clock_system();
  server->log_context.role = server->name;
  atomic_init(&server->inflight, 0);
  atomic_init(&server->open_connections, 0);
  atomic_init(&server->draining, false);
  pthread_mutex_init(&server->clients_mutex, NULL);
  pcp_http_sse_registry_initialize(&server->sse_registry);
  server->request_id_seed =
      (uint64_t)pcp_clock_wall_ns(server->clock) / 1000000;  // ms
  atomic_init(&server->request_id_counter, 1);
  pcp_http_router_initialize(allocator, &server->router);

  pcp_status_t status = copy_option_string(allocator, options->tls_cert_path,
                                           &server->tls_cert_path);
  if (!status) {
    status = copy_option_string(allocator, options->tls_key_path,
                                &server->tls_key_path);
  }
  if (!status) {
    status = scopes_load(server, options);
  }
  if (!status && options->registry) {
    status = metrics_register(server, options->registry);
  }
  if (status) {
    pcp_http_server_release(server);
    return status;
  }
  *out_server = server;
  return pcp_ok_status();
}

pcp_status_t pcp_http_server_routes_add(pcp_http_server_t* server,
                                        const pcp_http_route_t* routes,
                                        size_t route_count) {
  if (server->started) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "routes are fixed once the server has started");
  }
  for (size_t i = 0; i < route_count; ++i) {
    int scope_index = -1;
    if (routes[i].scope) {
      for (size_t j = 0; j < server->scope_count; ++j) {
        if (strcmp(server->scopes[j].name, routes[i].scope) == 0) {
          scope_index = (int)j;
        }
      }
      if (scope_index < 0) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "route %s %s: unknown token scope '%s'",
                               routes[i].method ? routes[i].method : "",
                               routes[i].pattern ? routes[i].pattern : "",
                               routes[i].scope);
      }
    }
    PCP_RETURN_IF_ERROR_BARE(
        pcp_http_router_add(&server->router, &routes[i], scope_index));
  }
  return pcp_ok_status();
}

static pcp_status_t tls_load(pcp_http_server_t* server) {
  if (!MHD_is_feature_supported(MHD_FEATURE_TLS)) {
    return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                           "libmicrohttpd was built without TLS");
  }
  size_t length = 0;
  PCP_RETURN_IF_ERROR(pcp_file_read_all(server->tls_cert_path, 1u << 20,
                                        &server->tls_cert_pem, &length),
                      "TLS certificate");
  PCP_RETURN_IF_ERROR(pcp_file_read_all(server->tls_key_path, 1u << 20,
                                        &server->tls_key_pem, &length),
                      "TLS key");
  return pcp_ok_status();
}

// The gate's listening socket: bound and listening, non-blocking. Its
// receive buffer (inherited by accepted sockets) must hold a whole request
// head of the largest allowed size, since the gate peeks at it in place.
static pcp_status_t listen_socket_open(const pcp_http_server_t* server,
                                       const struct sockaddr* address,
                                       socklen_t address_length, int* out_fd) {
  *out_fd = -1;
  int fd = socket(address->sa_family, SOCK_STREAM, 0);
  if (fd < 0) {
    return pcp_status_from_errno(errno, "%s: socket", server->name);
  }
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int needed = (int)(server->max_url_bytes + server->max_header_bytes + 1024);
  int current = 0;
  socklen_t length = sizeof(current);
  // The kernel reports twice what it was asked for and keeps part of it
  // for bookkeeping: ask for twice the head when the default is short.
  if (getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &current, &length) == 0 &&
      current < 4 * needed) {
    int wanted = 2 * needed;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &wanted, sizeof(wanted));
  }
  if (bind(fd, address, address_length) != 0 || listen(fd, 4096) != 0) {
    int error = errno;
    close(fd);
    return pcp_make_status(
        PCP_STATUS_UNAVAILABLE, "%s: cannot listen on %s:%u: %s", server->name,
        server->host, (unsigned)server->requested_port, strerror(error));
  }
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  *out_fd = fd;
  return pcp_ok_status();
}

pcp_status_t pcp_http_server_start(pcp_http_server_t* server) {
  if (server->started) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "server %s already started", server->name);
  }
  struct sockaddr_in in4;
  struct sockaddr_in6 in6;
  memset(&in4, 0, sizeof(in4));
  memset(&in6, 0, sizeof(in6));
  const struct sockaddr* address = NULL;
  // Suspend/resume parks idle event streams (sse.c); it implies ITC, which
  // MHD_quiesce_daemon also needs with a thread pool.
  unsigned int flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ITC |
                       MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
  const char* host =
      strcmp(server->host, "localhost") == 0 ? "127.0.0.1" : server->host;
  if (inet_pton(AF_INET, host, &in4.sin_addr) == 1) {
    in4.sin_family = AF_INET;
    in4.sin_port = htons(server->requested_port);
    address = (const struct sockaddr*)&in4;
  } else if (inet_pton(AF_INET6, host, &in6.sin6_addr) == 1) {
    in6.sin6_family = AF_INET6;
    in6.sin6_port = htons(server->requested_port);
    address = (const struct sockaddr*)&in6;
    flags |= MHD_USE_IPv6;
  } else {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "host '%s' is not a numeric IPv4 or IPv6 address",
                           server->host);
  }
  socklen_t address_length = address == (const struct sockaddr*)&in4
                                 ? (socklen_t)sizeof(in4)
                                 : (socklen_t)sizeof(in6);
  struct MHD_OptionItem extra_options[5] = {
      {MHD_OPTION_END, 0, NULL}, {MHD_OPTION_END, 0, NULL},
      {MHD_OPTION_END, 0, NULL}, {MHD_OPTION_END, 0, NULL},
      {MHD_OPTION_END, 0, NULL},
  };
  int listen_fd = -1;
  if (server->tls_cert_path) {
    // With TLS the gate cannot read the request head (it is encrypted):
    // libmicrohttpd accepts itself, with its own per-address limit (a
    // silent close past it) and its idle timeout only (docs/decisions.md).
    PCP_RETURN_IF_ERROR_BARE(tls_load(server));
    flags |= MHD_USE_TLS;
    extra_options[0] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0,
                                               server->tls_key_pem};
    extra_options[1] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0,
                                               server->tls_cert_pem};
    extra_options[2] =
        (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, (void*)address};
    extra_options[3] = (struct MHD_OptionItem){
        MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (intptr_t)server->max_connections_per_client, NULL};
  } else {
    PCP_RETURN_IF_ERROR_BARE(
        listen_socket_open(server, address, address_length, &listen_fd));
    flags |= MHD_USE_NO_LISTEN_SOCKET;
  }
  atomic_store(&server->draining, false);
  // The per-connection pool holds the request line and headers plus the
  // read buffer; sized so that our own 431 (with the JSON body) fires
  // before libmicrohttpd runs out of pool and answers on its own.
  // Every request that passes the gate's limits must also fit the pool, or
  // libmicrohttpd answers with its own page: the head itself, plus one
  // header record (about 64 bytes) per header and per query argument (the
  // gate admits at most PCP_HTTP_MAX_QUERY_PARAMS), plus the read buffer's
  // working room. Kept small on purpose: libmicrohttpd clears the pool
  // between the requests of a keep-alive connection, so its size is a cost
  // per request (a 400 KiB pool, sized for 4,096 query arguments, took
  // /healthz from ~0.95 to 0.57 of a bare libmicrohttpd server's rate).
  size_t pool_bytes =
      server->max_header_bytes + server->max_url_bytes +
      (PCP_HTTP_MAX_QUERY_PARAMS + server->max_header_count) * 64 + (32u << 10);
  server->daemon = MHD_start_daemon(
      flags, 0, NULL, NULL, on_access, server,
      // The logger must come first to catch messages about later options.
      MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, server,
      MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)server->thread_count,
      MHD_OPTION_CONNECTION_LIMIT,
      (unsigned int)(server->max_connections + PCP_HTTP_CONNECTION_SLACK),
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)server->connection_timeout_s,
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, pool_bytes,
      MHD_OPTION_NOTIFY_COMPLETED, on_completed, server,
      MHD_OPTION_NOTIFY_CONNECTION, on_connection, server, MHD_OPTION_ARRAY,
      extra_options, MHD_OPTION_END);
  if (!server->daemon) {
    if (listen_fd >= 0) {
      close(listen_fd);
    }
    return pcp_make_status(PCP_STATUS_UNAVAILABLE,
                           "%s: cannot listen on %s:%u (address in use, not "
                           "local, or bad TLS material; see the log)",
                           server->name, server->host,
                           (unsigned)server->requested_port);
  }
  if (listen_fd >= 0) {
    struct sockaddr_storage bound;
    socklen_t bound_length = sizeof(bound);
    server->bound_port = server->requested_port;
    if (getsockname(listen_fd, (struct sockaddr*)&bound, &bound_length) == 0) {
      server->bound_port =
          bound.ss_family == AF_INET
              ? ntohs(((struct sockaddr_in*)&bound)->sin_port)
              : ntohs(((struct sockaddr_in6*)&bound)->sin6_port);
    }
    pcp_http_gate_options_t gate_options = {
        .listen_fd = listen_fd,
        .daemon = server->daemon,
        .limits = {server->max_url_bytes, server->max_header_bytes,
                   server->max_header_count},
        .header_timeout_ms = server->header_timeout_ms,
        .max_waiting = PCP_HTTP_GATE_MAX_WAITING,
        .max_waiting_per_client = PCP_HTTP_GATE_MAX_WAITING_PER_CLIENT,
        .open_connections = &server->open_connections,
        .max_connections = server->max_connections,
        .max_connections_per_client = server->max_connections_per_client,
        .client_open_count = client_open_count,
        .client_open_user_data = server,
        .log_context = &server->log_context,
        .answers = server->families[FAMILY_GATE_ANSWERS],
        .server_name = server->name,
    };
    pcp_status_t status =
        pcp_http_gate_start(&gate_options, server->allocator, &server->gate);
    if (status) {
      close(listen_fd);
      MHD_stop_daemon(server->daemon);
      server->daemon = NULL;
      return status;
    }
  } else {
    const union MHD_DaemonInfo* info =
        MHD_get_daemon_info(server->daemon, MHD_DAEMON_INFO_BIND_PORT);
    server->bound_port = info ? info->port : server->requested_port;
  }
  server->started = true;
  PCP_LOG(PCP_LOG_INFO, &server->log_context, "listening on %s:%u%s",
          server->host, (unsigned)server->bound_port,
          server->tls_cert_path ? " (TLS)" : "");
  return pcp_ok_status();
}

uint16_t pcp_http_server_port(const pcp_http_server_t* server) {
  return server->daemon ? server->bound_port : 0;
}

int64_t pcp_http_server_inflight_count(const pcp_http_server_t* server) {
  return atomic_load(&((pcp_http_server_t*)server)->inflight);
}

pcp_status_t pcp_http_server_stop(pcp_http_server_t* server,
                                  int64_t deadline_ms) {
  if (!server->daemon) {
    return pcp_ok_status();
  }
  atomic_store(&server->draining, true);
  // The gate owns the listening socket of a plain-HTTP server: stopping it
  // stops accepting and closes the connections still sending headers.
  MHD_socket listen_fd = MHD_INVALID_SOCKET;
  if (server->gate) {
    pcp_http_gate_stop(server->gate);
    server->gate = NULL;
  } else {
    // Quiesce closes nothing: it stops accept() on every thread. The socket
    // stays ours to close, after the threads are gone.
    listen_fd = MHD_quiesce_daemon(server->daemon);
  }
  // Event streams never finish on their own: end them (each drains its
  // queue first) so that they leave the in-flight count.
  pcp_http_sse_registry_close_all(&server->sse_registry);
  // Real time on purpose: a drain waits for real sockets even when the
  // server's clock is simulated.
  pcp_clock_t real_clock = pcp_clock_system();
  int64_t deadline_ns = pcp_clock_now_ns(real_clock) + deadline_ms * 1000000;
  while (atomic_load(&server->inflight) > 0 &&
         pcp_clock_now_ns(real_clock) < deadline_ns) {
    pcp_sleep_ms(2);
  }
  int64_t left = atomic_load(&server->inflight);
  // Closes idle keep-alive connections and cuts off whatever is left.
  MHD_stop_daemon(server->daemon);
  server->daemon = NULL;
  if (listen_fd != MHD_INVALID_SOCKET) {
    close(listen_fd);
  }
  PCP_LOG(PCP_LOG_INFO, &server->log_context, "stopped (%lld requests cut off)",
          (long long)left);
  if (left > 0) {
    return pcp_make_status(PCP_STATUS_DEADLINE_EXCEEDED,
                           "%lld requests still in flight after %lld ms",
                           (long long)left, (long long)deadline_ms);
  }
  return pcp_ok_status();
}

void pcp_http_server_release(pcp_http_server_t* server) {
  if (!server) {
    return;
  }
  pcp_status_ignore(pcp_http_server_stop(server, 0));
  pcp_http_router_deinitialize(&server->router);
  pcp_http_sse_registry_deinitialize(&server->sse_registry);
  for (size_t i = 0; i < PCP_HTTP_CLIENT_BUCKETS; ++i) {
    while (server->clients[i]) {
      client_entry_t* next = server->clients[i]->next;
      pcp_allocator_free(server->allocator, server->clients[i]);
      server->clients[i] = next;
    }
  }
  pthread_mutex_destroy(&server->clients_mutex);
  for (size_t i = 0; i < server->scope_count; ++i) {
    pcp_allocator_free(server->allocator, server->scopes[i].name);
    pcp_allocator_free(server->allocator, server->scopes[i].env_var);
  }
  pcp_allocator_free(server->allocator, server->tls_cert_path);
  pcp_allocator_free(server->allocator, server->tls_key_path);
  // pcp_file_read_all's buffers: libc memory (its contract).
  pcp_libc_free(server->tls_cert_pem);
  pcp_libc_free(server->tls_key_pem);
  pcp_allocator_free(server->allocator, server);
}
