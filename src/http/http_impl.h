// SPDX-License-Identifier: Apache-2.0
//
// Internals shared by the files of src/http; never included elsewhere.

#ifndef PCP_HTTP_HTTP_IMPL_H_
#define PCP_HTTP_HTTP_IMPL_H_

#include <pthread.h>
#include <stdatomic.h>

#include <microhttpd.h>

#include "http/http.h"

// Body bytes read and dropped after a chunked body passed its limit before
// the connection is closed instead of answered (see on_access).
#define PCP_HTTP_MAX_DISCARD_BYTES (16u << 20)

//===----------------------------------------------------------------------===//
// Router
//===----------------------------------------------------------------------===//

typedef struct pcp_http_route_entry_t {
  char* method;     // owned; "*" for any
  char* pattern;    // owned
  char* scope;      // owned; NULL: open
  int scope_index;  // into the server's scopes; -1: open
  pcp_http_handler_fn_t handler;
  void* user_data;
  size_t max_body_bytes;
  size_t max_json_depth;
  // Compiled pattern: segment i is a literal, or a parameter when
  // |segment_is_param[i]|; |prefix| when the pattern ends in "*".
  size_t segment_count;
  char* segments[PCP_HTTP_MAX_PATH_SEGMENTS];  // owned (param: its name)
  bool segment_is_param[PCP_HTTP_MAX_PATH_SEGMENTS];
  bool prefix;
  // Metric series looked up once and kept (the families' lookups take a
  // mutex): requests and duration per status class (index http_status /
  // 100; 0: aborted), bytes per route. Only for routes with a fixed method,
  // whose method label is then fixed too.
  _Atomic(pcp_obs_series_t*) requests_series[6];
  _Atomic(pcp_obs_series_t*) duration_series[6];
  _Atomic(pcp_obs_series_t*) request_bytes_series;
  _Atomic(pcp_obs_series_t*) response_bytes_series;
} pcp_http_route_entry_t;

typedef struct pcp_http_router_t {
  pcp_allocator_t allocator;
  pcp_http_route_entry_t* entries;
  size_t count;
  size_t capacity;
} pcp_http_router_t;

// Result of matching a path.
typedef struct pcp_http_route_match_t {
  const pcp_http_route_entry_t* route;  // NULL: no route for the method
  // Some pattern matched the path (so a missing route means 405, not 404).
  bool path_matched;
  // "GET, POST" for the Allow header when path_matched && !route.
  char allow[128];
  size_t param_count;
  const char* param_names[PCP_HTTP_MAX_PATH_PARAMS];
  // Offsets of each value in the path: [begin, end).
  size_t param_begin[PCP_HTTP_MAX_PATH_PARAMS];
  size_t param_end[PCP_HTTP_MAX_PATH_PARAMS];
} pcp_http_route_match_t;

void pcp_http_router_initialize(pcp_allocator_t allocator,
                                pcp_http_router_t* out_router);
void pcp_http_router_deinitialize(pcp_http_router_t* router);
// Copies |route|; |scope_index| resolved by the caller.
PCP_MUST_USE_RESULT pcp_status_t pcp_http_router_add(
    pcp_http_router_t* router, const pcp_http_route_t* route, int scope_index);
void pcp_http_router_match(const pcp_http_router_t* router, const char* method,
                           const char* path, pcp_http_route_match_t* out_match);

//===----------------------------------------------------------------------===//
// Requests and responses
//===----------------------------------------------------------------------===//

// A body copied through the server's allocator: one block with the
// allocator in front, because libmicrohttpd's free callback is handed only a
// closure pointer (the block), not the allocator.
typedef struct pcp_http_body_block_t {
  pcp_allocator_t allocator;
  char data[];
} pcp_http_body_block_t;

// libmicrohttpd's free callback for a body in a pcp_http_body_block_t
// (|block|; NULL is a no-op).
void pcp_http_body_block_free(void* block);

struct pcp_http_response_t {
  // The server's: header copies, the content type and copied bodies.
  pcp_allocator_t allocator;
  int http_status;  // 0: nothing set yet
  // Set by pcp_http_response_sse_start; holds the response's reference.
  pcp_http_sse_stream_t* sse;
  // Set by pcp_http_response_file_set: an open fd (-1: none) whose first
  // |file_byte_length| bytes are the body; handed to libmicrohttpd.
  int file_fd;
  uint64_t file_byte_length;
  char* content_type;  // |allocator|
  // The body bytes: inside |body_block| when the response copied them (a
  // libmicrohttpd free callback returns it to the allocator), else memory
  // from libc's malloc taken by body_take (json_dumps output; handed to
  // libmicrohttpd with MUST_FREE, which free()s it).
  char* body;
  pcp_http_body_block_t* body_block;
  size_t body_length;
  size_t header_count;
  char* header_names[PCP_HTTP_MAX_RESPONSE_HEADERS];   // |allocator|
  char* header_values[PCP_HTTP_MAX_RESPONSE_HEADERS];  // |allocator|
};

// |allocator| (the server's) makes everything the response copies.
void pcp_http_response_initialize(pcp_allocator_t allocator,
                                  pcp_http_response_t* out_response);
void pcp_http_response_deinitialize(pcp_http_response_t* response);

struct pcp_http_request_t {
  struct pcp_http_server_t* server;
  struct MHD_Connection* connection;
  const pcp_http_route_entry_t* route;  // NULL: unmatched
  const char* method;                   // libmicrohttpd's, request lifetime
  const char* method_label;             // bounded set for metrics
  char* path;                           // owned copy
  size_t param_count;
  const char* param_names[PCP_HTTP_MAX_PATH_PARAMS];
  char* param_values[PCP_HTTP_MAX_PATH_PARAMS];  // owned
  char* body;                                    // owned; NUL-terminated
  size_t body_length;
  size_t body_capacity;
  size_t body_limit;
  bool body_too_large;
  size_t discarded_bytes;  // body bytes dropped after body_too_large
  bool responded;          // a response was queued
  bool answered_raw;       // the 413 was written on the socket directly
  bool close_connection;   // answer with Connection: close
  // An error found from the headers, answered at the final call (see
  // early_error in server.c); 0: none.
  int deferred_status;
  const char* deferred_code;         // static string
  const char* deferred_header_name;  // static string or NULL
  char deferred_message[256];
  char deferred_header_value[160];
  int http_status;
  uint64_t request_bytes;
  uint64_t response_bytes;
  int64_t start_ns;
  char remote_address[64];
  // The client's X-Request-Id when it is safe to echo, else one of ours;
  // sent back on every response and put in log lines.
  char request_id[PCP_HTTP_MAX_REQUEST_ID_BYTES + 1];
};

//===----------------------------------------------------------------------===//
// Event streams (sse.c)
//===----------------------------------------------------------------------===//

// The live streams of one server, so that stop can end them (libmicrohttpd
// must not be stopped with suspended connections).
typedef struct pcp_http_sse_registry_t {
  pthread_mutex_t mutex;
  pcp_http_sse_stream_t* head;
  bool closing;  // set by close_all: streams attached later start closed
} pcp_http_sse_registry_t;

void pcp_http_sse_registry_initialize(pcp_http_sse_registry_t* out_registry);
void pcp_http_sse_registry_deinitialize(pcp_http_sse_registry_t* registry);
// Closes every stream (each ends once its queue drains) and makes streams
// attached from now on start closed.
void pcp_http_sse_registry_close_all(pcp_http_sse_registry_t* registry);
// Creates the streaming response for |stream| (taking the response's
// reference) and lists it in |registry|. NULL when out of memory.
struct MHD_Response* pcp_http_sse_response_create(
    pcp_http_sse_stream_t* stream, pcp_http_sse_registry_t* registry,
    struct MHD_Connection* connection);
// Drops the response's reference of a stream that never reached
// libmicrohttpd (the handler failed or replaced the body).
void pcp_http_sse_stream_abandon(pcp_http_sse_stream_t* stream);

//===----------------------------------------------------------------------===//
// The header gate (gate.c)
//===----------------------------------------------------------------------===//

// Connections waiting for their first request's headers, in all and per
// client address; one more evicts the oldest (with a 408).
#define PCP_HTTP_GATE_MAX_WAITING 4096
#define PCP_HTTP_GATE_MAX_WAITING_PER_CLIENT 64

typedef struct pcp_http_gate_limits_t {
  size_t max_url_bytes;
  size_t max_header_bytes;
  size_t max_header_count;
} pcp_http_gate_limits_t;

typedef enum pcp_http_gate_verdict_e {
  PCP_HTTP_GATE_NEED_MORE = 0,  // headers incomplete, within the limits
  PCP_HTTP_GATE_PASS,           // headers complete, within the limits
  PCP_HTTP_GATE_REJECT,         // answer |http_status| and close
} pcp_http_gate_verdict_t;

typedef struct pcp_http_gate_result_t {
  int http_status;   // REJECT: 400, 414 or 431
  const char* code;  // REJECT: static error code
  char message[160];
  bool is_probe;  // the target is /healthz or /readyz
} pcp_http_gate_result_t;

// Checks the start of a request (request line and headers, as far as they
// have arrived) against |limits|. Pure; exposed for tests.
pcp_http_gate_verdict_t pcp_http_gate_classify(
    const char* data, size_t length, const pcp_http_gate_limits_t* limits,
    pcp_http_gate_result_t* out_result);

// Whether |path| (|length| bytes, without the query) is a probe, /healthz
// or /readyz: these keep the slots past the connection limits.
bool pcp_http_path_is_probe(const char* path, size_t length);

// The 16 address bytes a client is counted under (IPv4 in the first 4;
// zeros for other families).
void pcp_http_client_key(const struct sockaddr* address, uint8_t out_key[16]);

// Writes a whole JSON error response with Connection: close on socket |fd|
// without blocking, for the answers given outside libmicrohttpd (plain HTTP
// only). |extra_headers| is "" or CRLF-terminated header lines. Nothing is
// written when the body cannot be formatted. True when head and body went
// out whole; |out_body_bytes| is the body's length.
bool pcp_http_raw_error_send(int fd, int http_status, const char* code,
                             const char* message, const char* extra_headers,
                             size_t* out_body_bytes);

typedef struct pcp_http_gate_options_t {
  int listen_fd;  // listening, non-blocking; the gate closes it at stop
  struct MHD_Daemon* daemon;
  pcp_http_gate_limits_t limits;
  int64_t header_timeout_ms;
  uint32_t max_waiting;
  uint32_t max_waiting_per_client;
  // Past |max_connections| open in libmicrohttpd, requests other than the
  // probes get 503; past |max_connections_per_client| of one address, 429.
  _Atomic int64_t* open_connections;
  uint32_t max_connections;
  uint32_t max_connections_per_client;
  // Open connections of the client whose address bytes are |client|.
  uint32_t (*client_open_count)(void* user_data, const uint8_t client[16]);
  void* client_open_user_data;
  pcp_log_context_t* log_context;
  // pcp_http_gate_answers_total (labels server, status); NULL: no metrics.
  pcp_obs_family_t* answers;
  const char* server_name;
} pcp_http_gate_options_t;

typedef struct pcp_http_gate_t pcp_http_gate_t;

// Starts the gate thread on |options->listen_fd| (taken on success).
PCP_MUST_USE_RESULT pcp_status_t
pcp_http_gate_start(const pcp_http_gate_options_t* options,
                    pcp_allocator_t allocator, pcp_http_gate_t** out_gate);
// Stops accepting, closes the waiting connections and the listening socket,
// joins the thread and frees. NULL is a no-op.
void pcp_http_gate_stop(pcp_http_gate_t* gate);

// The server's JSON depth limit (options, defaulted).
size_t pcp_http_server_json_depth_limit(const struct pcp_http_server_t* server);

#endif  // PCP_HTTP_HTTP_IMPL_H_
