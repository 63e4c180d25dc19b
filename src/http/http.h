// SPDX-License-Identifier: Apache-2.0
//
// http: the HTTP server every PCP role exposes (gateway API, federation hub,
// node-manager probes), a small libcurl client (answers collected, or
// streamed to callbacks) and a sans-I/O parser for server-sent events.
//
// Server. libmicrohttpd runs its own polling threads (epoll, a fixed pool of
// |thread_count| threads, each with its own epoll set); handlers run on those
// threads, so a handler may block only briefly (long work belongs on a worker
// pool). Connections are HTTP/1.1 keep-alive. The router is built before
// pcp_http_server_start and is immutable afterwards, so matching takes no
// lock. A plain-HTTP server accepts on its own gate thread, which holds each
// new connection until its first request's headers are in (408 and a close
// past |header_timeout_ms|, however slowly they trickle), keeps at most 64
// waiting per client address (one more evicts that address's oldest) and
// answers the limits below that libmicrohttpd would answer in HTML (414,
// 431, a malformed Content-Length: 400) with the JSON schema before handing
// the socket to libmicrohttpd (docs/decisions.md "http"). For every request
// the server, in this order:
//   1. checks the connection count (503 with Connection: close past
//      |max_connections|; 429 past |max_connections_per_client| of one
//      address; /healthz and /readyz exempt from both), the URL length
//      (414), the header count and total header bytes (431);
//   2. matches the path against the routes (404 when no pattern matches,
//      405 with an Allow header when a pattern matches but no route has the
//      method);
//   3. checks the route's scope: the Authorization header must carry a bearer
//      token of that scope (401 with WWW-Authenticate: Bearer when missing or
//      unknown, 403 when the token belongs to another scope);
//   4. checks Content-Length against the route's body cap before reading the
//      body, and the running total while a chunked body streams in (413);
//   5. calls the handler with the request view and a response builder.
// Every response carries X-Request-Id (the client's, when safe, or ours),
// and every request is logged at debug level with it.
// Every failure anywhere, the handler's included, is answered with the one
// JSON error schema {"error":{"code":"<CODE>","message":"..."}} and the
// status from pcp_http_status_from_code; a client never sees a closed socket
// in place of an answer (upstream's silent 500s and closes,
// reference/upstream-control-plane.md s.3.0).
//
// Auth. Tokens live in environment variables whose *names* are given in the
// options (never in config files); they are read once at create. Comparison
// is constant time: both sides are hashed with SHA-256 and the digests
// compared with CRYPTO_memcmp, so neither the content nor the length of a
// token leaks through timing. A scope whose variable is unset or empty
// rejects every request (fail closed) and is logged at create.
//
// Metrics (when a registry is given), labelled by server name, route pattern
// (never the raw path, so label cardinality stays bounded), method and
// status class:
//   pcp_http_requests_total, pcp_http_request_duration_seconds (histogram),
//   pcp_http_request_body_bytes_total, pcp_http_response_body_bytes_total,
//   pcp_http_connections (gauge of open connections).
//
// Ownership: options, routes and tables are copied at create/add, except
// each route's |user_data| and the registry, which are borrowed and must
// outlive the server. Request views and response builders are valid only
// during the handler call. Memory: the server and the client allocate
// through the pcp_allocator_t given at create (copies, responses, event
// streams), which must outlive them and every stream they made.
//
// Typical wiring (a role's main thread):
//   pcp_http_scope_t scopes[] = {{"api", "PCP_API_TOKEN"}};
//   pcp_http_server_options_t options = {.name = "gateway", .port = 8080,
//       .scopes = scopes, .scope_count = 1, .registry = registry};
//   PCP_RETURN_IF_ERROR(pcp_http_server_create(&options, allocator, &srv));
//   PCP_RETURN_IF_ERROR(pcp_http_server_probes_add(srv, registry, &readyz));
//   pcp_http_route_t routes[] = {
//       {"GET", "/v1/jobs/{id}", "api", job_get, state, 0, 0},
//       {"POST", "/v1/jobs", "api", job_submit, state, 64u << 20, 0}};
//   PCP_RETURN_IF_ERROR(pcp_http_server_routes_add(srv, routes, 2));
//   PCP_RETURN_IF_ERROR(pcp_http_server_start(srv));
//   ...
//   pcp_status_ignore(pcp_http_server_stop(srv, 10000));  // drain 10 s
//   pcp_http_server_release(srv);
// and a handler:
//   static pcp_status_t job_get(void* state, const pcp_http_request_t* req,
//                               pcp_http_response_t* resp) {
//     const char* id = pcp_http_request_param(req, "id");
//     if (!known(state, id)) {
//       return pcp_make_status(PCP_STATUS_NOT_FOUND, "job %s", id);  // 404
//     }
//     return pcp_http_response_json_take(resp, 200, job_json(state, id));
//   }
//
// Thread-safety: pcp_http_server_* lifecycle calls are thread-compatible
// (one controlling thread); handlers run concurrently on the server's
// threads and must be thread-safe among themselves. Request and response
// objects are confined to the handler call. pcp_http_client_t is
// thread-compatible (one thread at a time); distinct clients are
// independent. Free functions (mapping, token compare, JSON checks) are
// thread-safe.

#ifndef PCP_HTTP_HTTP_H_
#define PCP_HTTP_HTTP_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/base.h"
#include "obs/obs.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Limits and defaults
//===----------------------------------------------------------------------===//

#define PCP_HTTP_DEFAULT_MAX_BODY_BYTES (1u << 20)     // 1 MiB, as upstream
#define PCP_HTTP_DEFAULT_MAX_HEADER_BYTES (64u << 10)  // 64 KiB, as upstream
#define PCP_HTTP_DEFAULT_MAX_URL_BYTES (8u << 10)
#define PCP_HTTP_DEFAULT_MAX_JSON_DEPTH 64
#define PCP_HTTP_DEFAULT_MAX_CONNECTIONS 1024
#define PCP_HTTP_DEFAULT_CONNECTION_TIMEOUT_S 60
#define PCP_HTTP_DEFAULT_THREAD_COUNT 4
// Time a new connection has to deliver its first request's headers.
#define PCP_HTTP_DEFAULT_HEADER_TIMEOUT_MS 10000
#define PCP_HTTP_DEFAULT_MAX_HEADER_COUNT 100
// Query parameters in a request target. No route takes more than a handful;
// the bound keeps libmicrohttpd's per-connection pool (one record per
// parameter) small, and the pool is cleared on every request.
#define PCP_HTTP_MAX_QUERY_PARAMS 128
#define PCP_HTTP_DEFAULT_MAX_CONNECTIONS_PER_CLIENT 256
// Path parameters per route pattern and path segments per pattern.
#define PCP_HTTP_MAX_PATH_PARAMS 8
#define PCP_HTTP_MAX_PATH_SEGMENTS 32
// Longest client X-Request-Id echoed (longer ones are replaced).
#define PCP_HTTP_MAX_REQUEST_ID_BYTES 64
// Token scopes per server and headers per response.
#define PCP_HTTP_MAX_SCOPES 8
#define PCP_HTTP_MAX_RESPONSE_HEADERS 16

//===----------------------------------------------------------------------===//
// Status mapping and errors
//===----------------------------------------------------------------------===//

// The one table from canonical codes to HTTP statuses:
// INVALID_ARGUMENT, OUT_OF_RANGE -> 400; UNAUTHENTICATED -> 401;
// PERMISSION_DENIED -> 403; NOT_FOUND -> 404; ALREADY_EXISTS, ABORTED,
// FAILED_PRECONDITION -> 409; RESOURCE_EXHAUSTED -> 429; UNIMPLEMENTED ->
// 501; UNAVAILABLE -> 503; DEADLINE_EXCEEDED -> 504; OK -> 200; anything else
// -> 500. (413 for bodies is chosen by the server, not by this table.)
// Thread-safe.
int pcp_http_status_from_code(pcp_status_code_t code);

// Reason phrase for |http_status| ("Not Found"); "Unknown" when not known.
// Thread-safe.
const char* pcp_http_status_reason(int http_status);

// Writes {"error":{"code":"<code>","message":"<message>"}} into |builder|
// (message JSON-escaped). Thread-safe (on distinct builders).
PCP_MUST_USE_RESULT pcp_status_t pcp_http_error_json_format(
    const char* code, const char* message, pcp_string_builder_t* builder);

//===----------------------------------------------------------------------===//
// Token comparison
//===----------------------------------------------------------------------===//

// Constant-time equality of two byte strings of any lengths: compares the
// SHA-256 digests with CRYPTO_memcmp, so the time depends on neither the
// position of the first difference nor on whether the lengths differ (only
// on the lengths themselves, through hashing). Thread-safe.
bool pcp_http_token_equal(const void* a, size_t a_length, const void* b,
                          size_t b_length);

//===----------------------------------------------------------------------===//
// JSON input checks
//===----------------------------------------------------------------------===//

// Returns INVALID_ARGUMENT when |text| nests arrays/objects deeper than
// |max_depth| (0: PCP_HTTP_DEFAULT_MAX_JSON_DEPTH). Strings are skipped, so
// brackets inside them do not count. Runs before any parser allocates, so a
// body of a million '[' costs one linear scan. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_http_json_depth_check(const char* text,
                                                           size_t length,
                                                           size_t max_depth);

//===----------------------------------------------------------------------===//
// Requests (views, valid during the handler call only)
//===----------------------------------------------------------------------===//

typedef struct pcp_http_request_t pcp_http_request_t;

// "GET", "POST", ... Borrowed.
const char* pcp_http_request_method(const pcp_http_request_t* request);
// Percent-decoded path without the query string. Borrowed.
const char* pcp_http_request_path(const pcp_http_request_t* request);
// The matched route pattern ("/v1/jobs/{id}"). Borrowed.
const char* pcp_http_request_route(const pcp_http_request_t* request);
// Value of path parameter |name| ("id" for "{id}"; "*" for the rest of a
// prefix route), or NULL. Borrowed.
const char* pcp_http_request_param(const pcp_http_request_t* request,
                                   const char* name);
// Value of query parameter |name| (decoded; the first occurrence), or NULL.
// A parameter given without '=' yields "". Borrowed.
const char* pcp_http_request_query(const pcp_http_request_t* request,
                                   const char* name);
// Value of header |name| (case-insensitive), or NULL. Borrowed.
const char* pcp_http_request_header(const pcp_http_request_t* request,
                                    const char* name);
// The body (possibly empty; data is NUL-terminated after |size|). Borrowed.
pcp_string_view_t pcp_http_request_body(const pcp_http_request_t* request);
// "127.0.0.1:54321" or "[::1]:54321". Borrowed.
const char* pcp_http_request_remote_address(const pcp_http_request_t* request);
// True when the client has closed (or reset) its connection while the
// handler is still working on the request: a blocking handler polls it to
// stop work nobody will read. Reads nothing from the socket. A client that
// only half-closes (shutdown(SHUT_WR) after its request) reads as gone too;
// HTTP clients do not do that. Thread-safe for the handler's own request.
bool pcp_http_request_client_gone(const pcp_http_request_t* request);
// The request id: the client's X-Request-Id when it is 1..64 characters of
// [A-Za-z0-9._-], else one made by the server. Echoed as X-Request-Id on
// every response. Borrowed.
const char* pcp_http_request_id(const pcp_http_request_t* request);

// The scope the request was authenticated for (the route's), or NULL for an
// open route. Borrowed.
const char* pcp_http_request_scope(const pcp_http_request_t* request);

// Parses the body as JSON after the depth check (the route's or server's
// limit). Missing body, malformed JSON and too-deep JSON are
// INVALID_ARGUMENT (400 when returned from a handler) with line and column.
// The caller owns |*out_value| (json_decref).
PCP_MUST_USE_RESULT pcp_status_t pcp_http_request_json_parse(
    const pcp_http_request_t* request, json_t** out_value);

//===----------------------------------------------------------------------===//
// Responses (builders, valid during the handler call only)
//===----------------------------------------------------------------------===//

typedef struct pcp_http_response_t pcp_http_response_t;

// Adds a response header (copied). Content-Type and Content-Length are set
// by the body setters and the server; adding them here is INVALID_ARGUMENT.
// RESOURCE_EXHAUSTED past PCP_HTTP_MAX_RESPONSE_HEADERS.
PCP_MUST_USE_RESULT pcp_status_t pcp_http_response_header_add(
    pcp_http_response_t* response, const char* name, const char* value);

// Sets status, content type and body (copied; |content_type| NULL means no
// body type, e.g. for 204). Replaces any previous body.
PCP_MUST_USE_RESULT pcp_status_t pcp_http_response_body_set(
    pcp_http_response_t* response, int http_status, const char* content_type,
    const void* data, size_t byte_length);

// Same, taking ownership of |data| instead of copying. |data| must come from
// libc's malloc (json_dumps output, for one), not from a pcp_allocator_t:
// the server frees it with free() (libmicrohttpd's MUST_FREE), even on
// error. Copies made by the other setters go through the server's allocator.
PCP_MUST_USE_RESULT pcp_status_t pcp_http_response_body_take(
    pcp_http_response_t* response, int http_status, const char* content_type,
    char* data, size_t byte_length);

// Sends the file at |path| as the body (libmicrohttpd reads it, with
// sendfile where it can, so large results and checkpoints are never held in
// memory). The file is opened now; its size is fixed at this call.
// NOT_FOUND / PERMISSION_DENIED from open, INVALID_ARGUMENT when it is not
// a regular file.
PCP_MUST_USE_RESULT pcp_status_t
pcp_http_response_file_set(pcp_http_response_t* response, int http_status,
                           const char* content_type, const char* path);

// Serializes |value| (borrowed) compactly as application/json.
PCP_MUST_USE_RESULT pcp_status_t pcp_http_response_json_set(
    pcp_http_response_t* response, int http_status, const json_t* value);

// Same, taking the caller's reference to |value| (json_decref'd here, on
// error too), so `json_pack(...)` can be passed directly. A NULL |value|
// (a failed json_pack) is RESOURCE_EXHAUSTED.
PCP_MUST_USE_RESULT pcp_status_t pcp_http_response_json_take(
    pcp_http_response_t* response, int http_status, json_t* value);

// Sets the error schema body with an explicit HTTP status and code string
// (for statuses outside the mapping table, such as 405 or 413).
PCP_MUST_USE_RESULT pcp_status_t
pcp_http_response_error_set(pcp_http_response_t* response, int http_status,
                            const char* code, const char* message);

// Sets the error schema body from |status| (borrowed, not consumed):
// pcp_http_status_from_code, the code name and the status message.
PCP_MUST_USE_RESULT pcp_status_t pcp_http_response_status_set(
    pcp_http_response_t* response, pcp_status_t status);

//===----------------------------------------------------------------------===//
// Server-sent events
//===----------------------------------------------------------------------===//

// An open text/event-stream response. The handler starts it and returns;
// the connection stays open and any thread queues events into it. While the
// queue is empty the connection is suspended (no thread polls it), so a
// suspended stream does not notice a client that left until something is
// written: send a comment now and then (a heartbeat) to find out.
// Reference counted: the caller's reference from sse_start must be
// released; the server holds its own until the connection ends. All
// pcp_http_sse_stream_* functions are thread-safe.
typedef struct pcp_http_sse_stream_t pcp_http_sse_stream_t;

#define PCP_HTTP_SSE_DEFAULT_MAX_QUEUED_BYTES (1u << 20)

// Makes |response| a 200 text/event-stream (Cache-Control: no-cache) and
// returns a retained stream. |max_queued_bytes| bounds the bytes waiting for
// a slow client (0: 1 MiB). Setting another body afterwards, or failing the
// handler, ends the stream before it starts.
PCP_MUST_USE_RESULT pcp_status_t pcp_http_response_sse_start(
    pcp_http_response_t* response, size_t max_queued_bytes,
    pcp_http_sse_stream_t** out_stream);

// Queues one event: "id: |id|", "event: |event|" (each optional: NULL
// omits it), one "data:" line per line of |data|, a blank line.
// INVALID_ARGUMENT for a newline in |id| or |event|; RESOURCE_EXHAUSTED when
// the queue is full (the client is not reading: drop the event or close);
// UNAVAILABLE once the stream is closed or the client has gone.
PCP_MUST_USE_RESULT pcp_status_t
pcp_http_sse_stream_send(pcp_http_sse_stream_t* stream, const char* id,
                         const char* event, const char* data);

// Queues a comment line (": |text|"), which clients ignore: a heartbeat.
// Errors as send.
PCP_MUST_USE_RESULT pcp_status_t
pcp_http_sse_stream_comment(pcp_http_sse_stream_t* stream, const char* text);

// Ends the stream once the queued events are sent. Idempotent. The server
// closes every stream when it stops.
void pcp_http_sse_stream_close(pcp_http_sse_stream_t* stream);

// False once closed or once the client is known to have gone.
bool pcp_http_sse_stream_is_open(pcp_http_sse_stream_t* stream);

void pcp_http_sse_stream_retain(pcp_http_sse_stream_t* stream);
// Frees the stream with its last reference. NULL is a no-op.
void pcp_http_sse_stream_release(pcp_http_sse_stream_t* stream);

//===----------------------------------------------------------------------===//
// Routes
//===----------------------------------------------------------------------===//

// A handler answers through |response| and returns OK, or returns an error
// status that the server turns into the JSON error (anything it put in
// |response| is then discarded). Returning OK without setting a body is a
// bug answered with a JSON 500. Called on a server thread.
typedef pcp_status_t (*pcp_http_handler_fn_t)(void* user_data,
                                              const pcp_http_request_t* request,
                                              pcp_http_response_t* response);

// Pattern grammar: '/'-separated segments; "{name}" matches one non-empty
// segment and binds it; a final "*" matches the rest of the path (possibly
// empty) and binds it to "*" (a prefix route). HEAD requests are also
// matched by GET routes. Everything else matches
// literally. When several patterns match, the one with more literal
// segments before the first difference wins, then the non-prefix one, then
// the first added.
typedef struct pcp_http_route_t {
  const char* method;   // "GET", "POST", ...; "*": any method
  const char* pattern;  // "/v1/jobs/{id}"
  // Token scope required ("api", "internal", ...); NULL: open (probes).
  const char* scope;
  pcp_http_handler_fn_t handler;
  void* user_data;        // borrowed; outlives the server
  size_t max_body_bytes;  // 0: the server's default
  size_t max_json_depth;  // 0: the server's default
} pcp_http_route_t;

//===----------------------------------------------------------------------===//
// Server
//===----------------------------------------------------------------------===//

typedef struct pcp_http_scope_t {
  const char* name;     // "api", "internal", "federation"
  const char* env_var;  // name of the variable holding the token
} pcp_http_scope_t;

typedef struct pcp_http_server_options_t {
  const char* name;  // metrics label "server" and log role; NULL: "http"
  const char* host;  // numeric address to bind; NULL: "127.0.0.1"
  uint16_t port;     // 0: ephemeral (read it with pcp_http_server_port)
  // TLS: both paths or neither (PEM files, read at start).
  const char* tls_cert_path;
  const char* tls_key_path;
  const pcp_http_scope_t* scopes;  // copied at create
  size_t scope_count;
  size_t max_body_bytes;    // 0: PCP_HTTP_DEFAULT_MAX_BODY_BYTES
  size_t max_header_bytes;  // 0: PCP_HTTP_DEFAULT_MAX_HEADER_BYTES
  size_t max_url_bytes;     // 0: PCP_HTTP_DEFAULT_MAX_URL_BYTES
  size_t max_json_depth;    // 0: PCP_HTTP_DEFAULT_MAX_JSON_DEPTH
  // Open connections; past it requests get 503 and a close, except the
  // probes, which keep 64 more slots (beyond those libmicrohttpd refuses
  // silently).
  uint32_t max_connections;       // 0: PCP_HTTP_DEFAULT_MAX_CONNECTIONS
  uint32_t connection_timeout_s;  // idle timeout; 0: default (60)
  // A new connection that has not sent its first request's headers within
  // this is answered 408 and closed, however slowly it trickles bytes.
  // 0: PCP_HTTP_DEFAULT_HEADER_TIMEOUT_MS. Plain HTTP only (TLS: the idle
  // timeout alone).
  uint32_t header_timeout_ms;
  size_t max_header_count;  // 0: PCP_HTTP_DEFAULT_MAX_HEADER_COUNT
  // Open connections of one client address; past it 429 (probes exempt).
  // 0: PCP_HTTP_DEFAULT_MAX_CONNECTIONS_PER_CLIENT.
  uint32_t max_connections_per_client;
  uint32_t thread_count;         // 0: PCP_HTTP_DEFAULT_THREAD_COUNT
  pcp_obs_registry_t* registry;  // borrowed; NULL: no metrics
  pcp_clock_t clock;             // {0}: the system clock
} pcp_http_server_options_t;

typedef struct pcp_http_server_t pcp_http_server_t;

// Validates |options|, reads the scope tokens from the environment and
// registers the metrics (reusing the families when another server already
// registered them in the same registry). Nothing is bound yet.
// INVALID_ARGUMENT for bad options (one TLS path without the other, too many
// scopes, a duplicate scope name); errors from the registry.
PCP_MUST_USE_RESULT pcp_status_t pcp_http_server_create(
    const pcp_http_server_options_t* options, pcp_allocator_t allocator,
    pcp_http_server_t** out_server);

// Adds routes (copied; user_data borrowed). Only before start.
// INVALID_ARGUMENT for a malformed pattern, an unknown scope or a duplicate
// (method, pattern); FAILED_PRECONDITION after start.
PCP_MUST_USE_RESULT pcp_status_t
pcp_http_server_routes_add(pcp_http_server_t* server,
                           const pcp_http_route_t* routes, size_t route_count);

// Binds and starts the threads. A server starts once (stop is final).
// UNAVAILABLE when the address cannot be bound; INVALID_ARGUMENT for a bad
// host; NOT_FOUND / RESOURCE_EXHAUSTED for unreadable TLS files; UNIMPLEMENTED
// when libmicrohttpd lacks TLS.
PCP_MUST_USE_RESULT pcp_status_t
pcp_http_server_start(pcp_http_server_t* server);

// The bound port (the ephemeral one when options.port was 0); 0 before
// start.
uint16_t pcp_http_server_port(const pcp_http_server_t* server);

// Requests currently being handled (accepted, not yet answered and
// completed; open event streams included). Thread-safe.
int64_t pcp_http_server_inflight_count(const pcp_http_server_t* server);

// Graceful stop: stops accepting, ends every event stream (after its queued
// events), lets requests in flight finish (their responses carry
// Connection: close) for up to |deadline_ms|, then closes
// every connection (idle keep-alive ones included) and joins the threads.
// Returns DEADLINE_EXCEEDED when requests were still in flight at the
// deadline (they are cut off), OK otherwise. Idempotent.
PCP_MUST_USE_RESULT pcp_status_t pcp_http_server_stop(pcp_http_server_t* server,
                                                      int64_t deadline_ms);

// Stops (deadline 0) if running and frees. NULL is a no-op.
void pcp_http_server_release(pcp_http_server_t* server);

//===----------------------------------------------------------------------===//
// Ready-made probe handlers
//===----------------------------------------------------------------------===//

typedef struct pcp_http_readyz_t pcp_http_readyz_t;

// Adds the open probe routes: GET /healthz always, GET /readyz when
// |readyz| is not NULL, GET /metrics when |registry| is not NULL (both
// borrowed; they must outlive the server). Errors as routes_add.
PCP_MUST_USE_RESULT pcp_status_t pcp_http_server_probes_add(
    pcp_http_server_t* server, pcp_obs_registry_t* registry,
    pcp_http_readyz_t* readyz);

// GET /healthz: 200 {"status":"ok"}. user_data unused.
pcp_status_t pcp_http_healthz_handler(void* user_data,
                                      const pcp_http_request_t* request,
                                      pcp_http_response_t* response);

// GET /metrics: renders the pcp_obs_registry_t* passed as user_data as
// Prometheus text (text/plain; version=0.0.4).
pcp_status_t pcp_http_metrics_handler(void* user_data,
                                      const pcp_http_request_t* request,
                                      pcp_http_response_t* response);

// Decides readiness. Fills |details| (an empty object it does not own) with
// what is ready and what is missing, and returns true when ready. Called on
// a server thread: must be thread-safe.
typedef bool (*pcp_http_ready_fn_t)(void* user_data, json_t* details);

struct pcp_http_readyz_t {
  pcp_http_ready_fn_t ready;
  void* user_data;
};

// GET /readyz: user_data is a pcp_http_readyz_t* (borrowed). Answers
// {"ready":true|false, ...details} with 200 when ready, 503 otherwise.
pcp_status_t pcp_http_readyz_handler(void* user_data,
                                     const pcp_http_request_t* request,
                                     pcp_http_response_t* response);

//===----------------------------------------------------------------------===//
// Client (libcurl)
//===----------------------------------------------------------------------===//

typedef struct pcp_http_client_options_t {
  const char* ca_path;        // PEM CA bundle for https; NULL: system CAs
  int64_t timeout_ms;         // whole request; 0: 30 s
  size_t max_response_bytes;  // 0: 64 MiB
} pcp_http_client_options_t;

typedef struct pcp_http_client_request_t {
  const char* method;  // NULL: GET
  const char* url;
  const char* const* headers;  // "Name: value" strings; NULL-terminated
  const char* bearer_token;    // adds Authorization: Bearer <token>
  const void* body;
  size_t body_length;
  // Sends the body with Transfer-Encoding: chunked (no Content-Length).
  bool chunked;
  // pcp_http_client_send only: polled at least every
  // PCP_HTTP_CLIENT_STOP_POLL_MS while the request runs; true abandons it
  // (the connection is closed) with CANCELLED. NULL: the request runs to
  // its answer or timeout. The streaming API has its own should_stop.
  bool (*should_stop)(void* user_data);
  void* stop_user_data;
} pcp_http_client_request_t;

// Longest wait between two polls of a request's should_stop.
#define PCP_HTTP_CLIENT_STOP_POLL_MS 50

typedef struct pcp_http_client_response_t {
  int http_status;
  char* body;  // NUL-terminated; owned
  size_t body_length;
  char* headers;  // raw header block of the final response; owned
  // Connections libcurl opened for this request (0 when one was reused).
  int64_t new_connection_count;
  // Made |body| and |headers| (the client's, set by send); a caller that
  // takes one of them frees it with pcp_allocator_free on this allocator.
  pcp_allocator_t allocator;
} pcp_http_client_response_t;

typedef struct pcp_http_client_t pcp_http_client_t;

// One client holds one libcurl easy handle, so consecutive requests to the
// same host reuse the connection (keep-alive).
PCP_MUST_USE_RESULT pcp_status_t pcp_http_client_create(
    const pcp_http_client_options_t* options, pcp_allocator_t allocator,
    pcp_http_client_t** out_client);
void pcp_http_client_release(pcp_http_client_t* client);

// Performs |request|. Any HTTP status is OK (read it from the response);
// UNAVAILABLE for connection failures, DEADLINE_EXCEEDED on timeout,
// RESOURCE_EXHAUSTED past max_response_bytes, CANCELLED when the request's
// should_stop turned true. |out_response| is cleared
// first; release it with pcp_http_client_response_deinitialize.
PCP_MUST_USE_RESULT pcp_status_t pcp_http_client_send(
    pcp_http_client_t* client, const pcp_http_client_request_t* request,
    pcp_http_client_response_t* out_response);

// Value of response header |name| (case-insensitive, first occurrence)
// copied into |buffer|; false when absent.
bool pcp_http_client_response_header(const pcp_http_client_response_t* response,
                                     const char* name, char* buffer,
                                     size_t capacity);

void pcp_http_client_response_deinitialize(
    pcp_http_client_response_t* response);

// Streams |request|'s answer instead of collecting it (SSE, long replies):
// body bytes reach |on_body| as libcurl reads them, nothing is buffered and
// there is no whole-request timeout (|idle_timeout_ms| bounds the silence
// instead). The connection is closed, never returned to the client's cache,
// when a callback stops the transfer or the idle timeout ends it, so the
// server sees the disconnect at once.
typedef struct pcp_http_client_stream_t {
  // Called once, before the first body byte (or at the end when the body is
  // empty), with the final response's status and raw header block (borrowed
  // for the call). Returns false to stop the transfer.
  bool (*on_head)(void* user_data, int http_status, const char* headers);
  // Body bytes as they arrive. Returns false to stop the transfer.
  bool (*on_body)(void* user_data, const char* data, size_t length);
  // Polled while the transfer runs (libcurl: about once a second when idle,
  // and as soon as a signal interrupts its wait); returns true to stop it.
  // May be NULL.
  bool (*should_stop)(void* user_data);
  void* user_data;
  int64_t connect_timeout_ms;  // 0: the client's timeout_ms
  // No body byte for this long (checked about once a second): the transfer
  // ends with DEADLINE_EXCEEDED. 0: no limit.
  int64_t idle_timeout_ms;
} pcp_http_client_stream_t;

// Performs |request| and feeds the answer to |stream|'s callbacks.
// CANCELLED when a callback stopped the transfer; UNAVAILABLE for connection
// failures, including a server that closes before the body is complete;
// DEADLINE_EXCEEDED on the idle or connect timeout. |out_http_status| is the
// final status (0 when no response arrived).
PCP_MUST_USE_RESULT pcp_status_t pcp_http_client_stream(
    pcp_http_client_t* client, const pcp_http_client_request_t* request,
    const pcp_http_client_stream_t* stream, int* out_http_status);

//===----------------------------------------------------------------------===//
// Server-sent events, client side
//===----------------------------------------------------------------------===//

// An incremental parser for a text/event-stream body (the WHATWG "event
// stream interpretation"): lines end in CRLF, LF or CR (split anywhere
// across feeds); `data:` lines join with '\n'; a blank line dispatches;
// `:` lines are comments; one space after the colon is dropped; a leading
// UTF-8 BOM is skipped; unknown fields are ignored. Sans I/O: bytes in,
// events out through |on_event|. A line over |max_line_bytes| or an event
// whose data passes |max_event_bytes| is RESOURCE_EXHAUSTED, so a server
// cannot make the client buffer without bound. Thread-compatible.

typedef struct pcp_http_sse_event_t {
  const char* type;  // the `event:` field; "" when none was given
  const char* data;  // NUL-terminated, without the last '\n'
  size_t data_length;
  const char* last_event_id;  // the last `id:` seen on the stream; ""
} pcp_http_sse_event_t;

// Returns non-OK to stop parsing; pcp_http_sse_parser_feed returns it.
// Event fields are borrowed for the call.
typedef pcp_status_t (*pcp_http_sse_event_fn_t)(
    void* user_data, const pcp_http_sse_event_t* event);

typedef struct pcp_http_sse_parser_t {
  pcp_http_sse_event_fn_t on_event;
  void* user_data;
  size_t max_line_bytes;
  pcp_string_builder_t line;
  pcp_string_builder_t data;
  pcp_string_builder_t type;
  pcp_string_builder_t id;
  bool after_cr;     // the last byte fed was CR: a following LF is its pair
  bool has_data;     // a data: field was seen since the last dispatch
  bool at_start;     // nothing fed yet (BOM check)
  uint8_t bom_seen;  // BOM bytes matched so far
} pcp_http_sse_parser_t;

// Caps of 0 mean 64 KiB (line) and 1 MiB (event data).
void pcp_http_sse_parser_initialize(size_t max_line_bytes,
                                    size_t max_event_bytes,
                                    pcp_http_sse_event_fn_t on_event,
                                    void* user_data,
                                    pcp_http_sse_parser_t* out_parser);
void pcp_http_sse_parser_deinitialize(pcp_http_sse_parser_t* parser);

// Parses |length| more bytes, calling on_event for each complete event.
// Returns the first failure (a cap, or on_event's status); the parser must
// not be fed again after a failure.
PCP_MUST_USE_RESULT pcp_status_t pcp_http_sse_parser_feed(
    pcp_http_sse_parser_t* parser, const char* data, size_t length);

// True when bytes of an unfinished line or event are pending: at the end of
// the body, an event that was never dispatched (the spec drops it).
bool pcp_http_sse_parser_has_partial(const pcp_http_sse_parser_t* parser);

#ifdef __cplusplus
}
#endif

#endif  // PCP_HTTP_HTTP_H_
