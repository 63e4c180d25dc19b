// SPDX-License-Identifier: Apache-2.0
//
// A small libcurl client: one easy handle per client so consecutive requests
// reuse the connection. Used by tests now and by the hub and services later.

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#include "http/http_impl.h"

#define PCP_HTTP_CLIENT_DEFAULT_TIMEOUT_MS 30000
#define PCP_HTTP_CLIENT_DEFAULT_MAX_RESPONSE_BYTES (64u << 20)
#define PCP_HTTP_CLIENT_MAX_HEADER_BYTES (64u << 10)

struct pcp_http_client_t {
  pcp_allocator_t allocator;
  CURL* curl;
  // Runs the requests that have a should_stop (perform_stoppable); NULL
  // until the first.
  CURLM* multi;
  char* ca_path;
  int64_t timeout_ms;
  size_t max_response_bytes;
};

// Every libcurl function the client calls, opened with dlopen at the first
// pcp_http_client_create so that subcommands without an HTTP client (`pcp
// run`, the worker) do not map libcurl and its ~30 dependencies
// (docs/decisions.md, "Lazy loading"). Fields drop the `curl_` prefix:
// curl.h defines curl_easy_setopt and friends as type-checking macros under
// GCC, which would expand inside `g_curl.curl_easy_setopt(`. The table
// stores `__typeof__(curl_fn)*`, so signatures still come from curl.h.
#define CURL_API_SYMBOLS(X) \
  X(global_init)            \
  X(easy_strerror)          \
  X(easy_init)              \
  X(easy_cleanup)           \
  X(easy_reset)             \
  X(easy_setopt)            \
  X(easy_perform)           \
  X(easy_getinfo)           \
  X(slist_append)           \
  X(slist_free_all)         \
  X(multi_init)             \
  X(multi_cleanup)          \
  X(multi_add_handle)       \
  X(multi_remove_handle)    \
  X(multi_perform)          \
  X(multi_poll)             \
  X(multi_info_read)

typedef struct curl_api_t {
#define CURL_API_FIELD(name) __typeof__(curl_##name)* name;
  CURL_API_SYMBOLS(CURL_API_FIELD)
#undef CURL_API_FIELD
} curl_api_t;

static const pcp_dynlib_symbol_t kCurlSymbols[] = {
#define CURL_API_ENTRY(name) {"curl_" #name, offsetof(curl_api_t, name)},
    CURL_API_SYMBOLS(CURL_API_ENTRY)
#undef CURL_API_ENTRY
};

static curl_api_t g_curl;
static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static pcp_status_t curl_load_status;

static void curl_init_once(void) {
  static const char* const kSonames[] = {"libcurl.so.4", "libcurl.so", NULL};
  curl_load_status =
      pcp_dynlib_load(kSonames, "the HTTP client", "libcurl4", kCurlSymbols,
                      PCP_ARRAYSIZE(kCurlSymbols), &g_curl);
  if (curl_load_status) {
    return;
  }
  // curl_global_init is not thread-safe in every libcurl build; run it once.
  CURLcode code = g_curl.global_init(CURL_GLOBAL_DEFAULT);
  if (code != CURLE_OK) {
    curl_load_status =
        pcp_make_status(PCP_STATUS_INTERNAL, "curl_global_init: %s",
                        g_curl.easy_strerror(code));
  }
}

pcp_status_t pcp_http_client_create(const pcp_http_client_options_t* options,
                                    pcp_allocator_t allocator,
                                    pcp_http_client_t** out_client) {
  *out_client = NULL;
  pthread_once(&curl_once, curl_init_once);
  if (curl_load_status) {
    return pcp_status_clone(curl_load_status);
  }
  pcp_http_client_t* client = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*client), (void**)&client));
  client->allocator = allocator;
  client->timeout_ms = options && options->timeout_ms
                           ? options->timeout_ms
                           : PCP_HTTP_CLIENT_DEFAULT_TIMEOUT_MS;
  client->max_response_bytes = options && options->max_response_bytes
                                   ? options->max_response_bytes
                                   : PCP_HTTP_CLIENT_DEFAULT_MAX_RESPONSE_BYTES;
  pcp_status_t status = pcp_ok_status();
  if (options && options->ca_path) {
    status =
        pcp_allocator_strdup(allocator, options->ca_path, &client->ca_path);
  }
  if (!status) {
    client->curl = g_curl.easy_init();
  }
  if (status || !client->curl) {
    pcp_status_ignore(status);
    pcp_http_client_release(client);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory creating an HTTP client");
  }
  *out_client = client;
  return pcp_ok_status();
}

void pcp_http_client_release(pcp_http_client_t* client) {
  if (!client) {
    return;
  }
  if (client->multi) {
    g_curl.multi_cleanup(client->multi);
  }
  if (client->curl) {
    g_curl.easy_cleanup(client->curl);
  }
  pcp_allocator_free(client->allocator, client->ca_path);
  pcp_allocator_free(client->allocator, client);
}

typedef struct transfer_t {
  pcp_string_builder_t body;
  pcp_string_builder_t headers;
  bool too_large;
  const char* upload;
  size_t upload_length;
  size_t upload_offset;
} transfer_t;

static size_t on_write(char* data, size_t size, size_t count, void* cls) {
  transfer_t* transfer = cls;
  size_t length = size * count;
  pcp_status_t status = pcp_string_builder_append(
      &transfer->body, pcp_make_string_view(data, length));
  if (status) {
    pcp_status_ignore(status);
    transfer->too_large = true;
    return 0;  // makes libcurl stop with CURLE_WRITE_ERROR
  }
  return length;
}

static size_t on_header(char* data, size_t size, size_t count, void* cls) {
  transfer_t* transfer = cls;
  size_t length = size * count;
  // A new status line starts a new header block (after 100 Continue or a
  // redirect): keep only the final response's headers.
  if (length >= 5 && memcmp(data, "HTTP/", 5) == 0) {
    pcp_string_builder_reset(&transfer->headers);
  }
  pcp_status_t status = pcp_string_builder_append(
      &transfer->headers, pcp_make_string_view(data, length));
  if (status) {
    pcp_status_ignore(status);
    return 0;
  }
  return length;
}

static size_t on_read(char* buffer, size_t size, size_t count, void* cls) {
  transfer_t* transfer = cls;
  size_t capacity = size * count;
  size_t left = transfer->upload_length - transfer->upload_offset;
  // Small pieces, so a chunked upload really arrives in several chunks.
  size_t length = left < capacity ? left : capacity;
  if (length > 16384) {
    length = 16384;
  }
  memcpy(buffer, transfer->upload + transfer->upload_offset, length);
  transfer->upload_offset += length;
  return length;
}

// Sets the options |request| needs on the client's handle (after a reset:
// the connection cache survives it) and builds its header list into
// |*out_headers| (the caller frees it with curl_slist_free_all after the
// transfer, even on failure). Body uploads read from |transfer|.
static pcp_status_t request_prepare(pcp_http_client_t* client,
                                    const pcp_http_client_request_t* request,
                                    transfer_t* transfer,
                                    struct curl_slist** out_headers) {
  *out_headers = NULL;
  if (!client->curl) {
    // A stopped stream dropped the handle and could not make a new one.
    client->curl = g_curl.easy_init();
    if (!client->curl) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "out of memory creating an HTTP handle");
    }
  }
  CURL* curl = client->curl;
  g_curl.easy_reset(curl);
  struct curl_slist* headers = NULL;
  bool ok = true;
  for (const char* const* h = request->headers; h && *h; ++h) {
    struct curl_slist* next = g_curl.slist_append(headers, *h);
    ok = ok && next;
    headers = next ? next : headers;
  }
  if (request->bearer_token) {
    char authorization[1024];
    snprintf(authorization, sizeof(authorization), "Authorization: Bearer %s",
             request->bearer_token);
    struct curl_slist* next = g_curl.slist_append(headers, authorization);
    ok = ok && next;
    headers = next ? next : headers;
  }
  // libcurl adds "Expect: 100-continue" to large uploads; the server answers
  // early errors without it, so it only costs a round trip.
  struct curl_slist* next = g_curl.slist_append(headers, "Expect:");
  ok = ok && next;
  headers = next ? next : headers;
  const char* method = request->method ? request->method : "GET";
  g_curl.easy_setopt(curl, CURLOPT_URL, request->url);
  g_curl.easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
  g_curl.easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  if (client->ca_path) {
    g_curl.easy_setopt(curl, CURLOPT_CAINFO, client->ca_path);
  }
  if (request->chunked) {
    transfer->upload = request->body;
    transfer->upload_length = request->body_length;
    next = g_curl.slist_append(headers, "Transfer-Encoding: chunked");
    ok = ok && next;
    headers = next ? next : headers;
    g_curl.easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    g_curl.easy_setopt(curl, CURLOPT_READFUNCTION, on_read);
    g_curl.easy_setopt(curl, CURLOPT_READDATA, transfer);
  } else if (request->body) {
    g_curl.easy_setopt(curl, CURLOPT_POSTFIELDS, request->body);
    g_curl.easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                       (curl_off_t)request->body_length);
  }
  // CUSTOMREQUEST keeps the method after UPLOAD/POSTFIELDS set theirs.
  g_curl.easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
  if (strcmp(method, "HEAD") == 0) {
    g_curl.easy_setopt(curl, CURLOPT_NOBODY, 1L);
  }
  g_curl.easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  *out_headers = headers;
  if (!ok) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory building request headers");
  }
  return pcp_ok_status();
}

// easy_perform with a stop check: libcurl's own loop calls the progress
// callback only about once a second while it waits for an answer, too late
// for a job's cancel, so a stoppable request runs on the client's multi
// handle, waking every PCP_HTTP_CLIENT_STOP_POLL_MS. The multi handle keeps
// its own connection cache (keep-alive between stoppable requests).
// *out_stopped: should_stop turned true (the transfer was dropped, which
// closes its connection).
static CURLcode perform_stoppable(pcp_http_client_t* client,
                                  const pcp_http_client_request_t* request,
                                  bool* out_stopped) {
  *out_stopped = false;
  if (!client->multi) {
    client->multi = g_curl.multi_init();
    if (!client->multi) {
      return CURLE_OUT_OF_MEMORY;
    }
  }
  CURLM* multi = client->multi;
  CURL* curl = client->curl;
  if (g_curl.multi_add_handle(multi, curl) != CURLM_OK) {
    return CURLE_FAILED_INIT;
  }
  CURLcode result = CURLE_OK;
  for (;;) {
    if (request->should_stop(request->stop_user_data)) {
      *out_stopped = true;
      result = CURLE_ABORTED_BY_CALLBACK;
      break;
    }
    int running = 0;
    if (g_curl.multi_perform(multi, &running) != CURLM_OK) {
      result = CURLE_FAILED_INIT;
      break;
    }
    bool done = false;
    int queued = 0;
    for (CURLMsg* message = g_curl.multi_info_read(multi, &queued); message;
         message = g_curl.multi_info_read(multi, &queued)) {
      if (message->msg == CURLMSG_DONE && message->easy_handle == curl) {
        result = message->data.result;
        done = true;
      }
    }
    if (done) {
      break;
    }
    if (g_curl.multi_poll(multi, NULL, 0, PCP_HTTP_CLIENT_STOP_POLL_MS, NULL) !=
        CURLM_OK) {
      result = CURLE_FAILED_INIT;
      break;
    }
  }
  g_curl.multi_remove_handle(multi, curl);
  return result;
}

static pcp_status_code_t code_of_curl_result(CURLcode result) {
  return result == CURLE_OPERATION_TIMEDOUT ? PCP_STATUS_DEADLINE_EXCEEDED
                                            : PCP_STATUS_UNAVAILABLE;
}

pcp_status_t pcp_http_client_send(pcp_http_client_t* client,
                                  const pcp_http_client_request_t* request,
                                  pcp_http_client_response_t* out_response) {
  memset(out_response, 0, sizeof(*out_response));
  out_response->allocator = client->allocator;
  transfer_t transfer;
  memset(&transfer, 0, sizeof(transfer));
  pcp_string_builder_initialize(client->allocator, client->max_response_bytes,
                                &transfer.body);
  pcp_string_builder_initialize(
      client->allocator, PCP_HTTP_CLIENT_MAX_HEADER_BYTES, &transfer.headers);
  struct curl_slist* headers = NULL;
  pcp_status_t status = request_prepare(client, request, &transfer, &headers);
  CURL* curl = client->curl;
  const char* method = request->method ? request->method : "GET";
  g_curl.easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)client->timeout_ms);
  g_curl.easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_write);
  g_curl.easy_setopt(curl, CURLOPT_WRITEDATA, &transfer);
  g_curl.easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
  g_curl.easy_setopt(curl, CURLOPT_HEADERDATA, &transfer);
  CURLcode result = CURLE_OK;
  bool stopped = false;
  if (!status) {
    result = request->should_stop ? perform_stoppable(client, request, &stopped)
                                  : g_curl.easy_perform(curl);
  }
  if (!status && stopped) {
    status = pcp_make_status(PCP_STATUS_CANCELLED, "%s %s: stopped", method,
                             request->url);
  } else if (!status && result != CURLE_OK) {
    pcp_status_code_t code = code_of_curl_result(result);
    if (transfer.too_large) {
      code = PCP_STATUS_RESOURCE_EXHAUSTED;
    }
    status = pcp_make_status(code, "%s %s: %s", method, request->url,
                             g_curl.easy_strerror(result));
  }
  if (!status) {
    long http_status = 0;
    long connects = 0;
    g_curl.easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http_status);
    g_curl.easy_getinfo(curl, CURLINFO_NUM_CONNECTS, &connects);
    out_response->http_status = (int)http_status;
    out_response->new_connection_count = connects;
    out_response->body_length = transfer.body.size;
    status = pcp_string_builder_take(&transfer.body, &out_response->body);
    if (!status) {
      status =
          pcp_string_builder_take(&transfer.headers, &out_response->headers);
    }
  }
  g_curl.easy_setopt(curl, CURLOPT_HTTPHEADER, NULL);
  g_curl.slist_free_all(headers);
  pcp_string_builder_deinitialize(&transfer.body);
  pcp_string_builder_deinitialize(&transfer.headers);
  if (status) {
    pcp_http_client_response_deinitialize(out_response);
  }
  return status;
}

//===----------------------------------------------------------------------===//
// Streaming
//===----------------------------------------------------------------------===//

typedef struct stream_transfer_t {
  transfer_t base;  // headers (and the upload); |body| unused
  CURL* curl;
  const pcp_http_client_stream_t* stream;
  int http_status;
  bool head_sent;
  bool stopped;    // a callback stopped the transfer
  bool timed_out;  // idle for longer than the stream's idle_timeout_ms
  pcp_clock_t clock;
  int64_t last_byte_ns;  // the request's start, then the last body byte
} stream_transfer_t;

static bool stream_head(stream_transfer_t* transfer) {
  if (transfer->head_sent) {
    return true;
  }
  transfer->head_sent = true;
  long http_status = 0;
  g_curl.easy_getinfo(transfer->curl, CURLINFO_RESPONSE_CODE, &http_status);
  transfer->http_status = (int)http_status;
  if (transfer->stream->on_head &&
      !transfer->stream->on_head(
          transfer->stream->user_data, transfer->http_status,
          pcp_string_builder_cstring(&transfer->base.headers))) {
    transfer->stopped = true;
    return false;
  }
  return true;
}

static size_t on_stream_write(char* data, size_t size, size_t count,
                              void* cls) {
  stream_transfer_t* transfer = cls;
  size_t length = size * count;
  transfer->last_byte_ns = pcp_clock_now_ns(transfer->clock);
  if (!stream_head(transfer)) {
    return 0;
  }
  if (!transfer->stream->on_body(transfer->stream->user_data, data, length)) {
    transfer->stopped = true;
    return 0;  // CURLE_WRITE_ERROR
  }
  return length;
}

static int on_stream_progress(void* cls, curl_off_t dltotal, curl_off_t dlnow,
                              curl_off_t ultotal, curl_off_t ulnow) {
  (void)dltotal;
  (void)dlnow;
  (void)ultotal;
  (void)ulnow;
  stream_transfer_t* transfer = cls;
  if (transfer->stream->should_stop &&
      transfer->stream->should_stop(transfer->stream->user_data)) {
    transfer->stopped = true;
    return 1;  // CURLE_ABORTED_BY_CALLBACK
  }
  int64_t idle_ns = pcp_clock_now_ns(transfer->clock) - transfer->last_byte_ns;
  if (transfer->stream->idle_timeout_ms > 0 &&
      idle_ns > transfer->stream->idle_timeout_ms * 1000000) {
    transfer->timed_out = true;
    return 1;
  }
  return 0;
}

pcp_status_t pcp_http_client_stream(pcp_http_client_t* client,
                                    const pcp_http_client_request_t* request,
                                    const pcp_http_client_stream_t* stream,
                                    int* out_http_status) {
  *out_http_status = 0;
  stream_transfer_t transfer;
  memset(&transfer, 0, sizeof(transfer));
  transfer.stream = stream;
  pcp_string_builder_initialize(client->allocator,
                                PCP_HTTP_CLIENT_MAX_HEADER_BYTES,
                                &transfer.base.headers);
  struct curl_slist* headers = NULL;
  pcp_status_t status =
      request_prepare(client, request, &transfer.base, &headers);
  CURL* curl = client->curl;
  transfer.curl = curl;
  const char* method = request->method ? request->method : "GET";
  int64_t connect_timeout_ms = stream->connect_timeout_ms
                                   ? stream->connect_timeout_ms
                                   : client->timeout_ms;
  g_curl.easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, (long)connect_timeout_ms);
  // The idle timeout is checked in the progress callback, not with
  // CURLOPT_LOW_SPEED_*: libcurl averages speed over about five seconds and
  // counts the upload, so its window overshoots a short limit by seconds.
  transfer.clock = pcp_clock_system();
  transfer.last_byte_ns = pcp_clock_now_ns(transfer.clock);
  g_curl.easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_stream_write);
  g_curl.easy_setopt(curl, CURLOPT_WRITEDATA, &transfer);
  g_curl.easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
  g_curl.easy_setopt(curl, CURLOPT_HEADERDATA, &transfer.base);
  g_curl.easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  g_curl.easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_stream_progress);
  g_curl.easy_setopt(curl, CURLOPT_XFERINFODATA, &transfer);
  // Small receive buffer: an SSE chunk is handed on as soon as it arrives
  // either way, this only bounds what one callback sees.
  g_curl.easy_setopt(curl, CURLOPT_BUFFERSIZE, 16384L);
  CURLcode result = CURLE_OK;
  if (!status) {
    result = g_curl.easy_perform(curl);
  }
  if (!status && result == CURLE_OK && !stream_head(&transfer)) {
    result = CURLE_WRITE_ERROR;  // on_head refused an empty body
  }
  if (!status && result != CURLE_OK) {
    if (transfer.stopped) {
      status = pcp_make_status(PCP_STATUS_CANCELLED, "%s %s: stopped", method,
                               request->url);
    } else if (transfer.timed_out) {
      status = pcp_make_status(
          PCP_STATUS_DEADLINE_EXCEEDED, "%s %s: nothing received for %lld ms",
          method, request->url, (long long)stream->idle_timeout_ms);
    } else {
      status = pcp_make_status(code_of_curl_result(result), "%s %s: %s", method,
                               request->url, g_curl.easy_strerror(result));
    }
  }
  *out_http_status = transfer.http_status;
  if (!*out_http_status) {
    long http_status = 0;
    g_curl.easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http_status);
    *out_http_status = (int)http_status;
  }
  if (transfer.stopped || transfer.timed_out) {
    // The server must see the disconnect now (a generation stops with it),
    // not when the cached connection is next reused or evicted.
    // (request_prepare makes a new handle for the next request.)
    g_curl.easy_cleanup(curl);
    client->curl = NULL;
  } else if (curl) {
    g_curl.easy_setopt(curl, CURLOPT_HTTPHEADER, NULL);
  }
  g_curl.slist_free_all(headers);
  pcp_string_builder_deinitialize(&transfer.base.headers);
  return status;
}

bool pcp_http_client_response_header(const pcp_http_client_response_t* response,
                                     const char* name, char* buffer,
                                     size_t capacity) {
  if (!response->headers) {
    return false;
  }
  size_t name_length = strlen(name);
  for (const char* line = response->headers; *line;) {
    const char* end = strstr(line, "\r\n");
    size_t length = end ? (size_t)(end - line) : strlen(line);
    if (length > name_length && line[name_length] == ':' &&
        strncasecmp(line, name, name_length) == 0) {
      const char* value = line + name_length + 1;
      while (*value == ' ') {
        ++value;
      }
      size_t value_length = (size_t)(line + length - value);
      if (capacity > 0) {
        size_t n = value_length < capacity - 1 ? value_length : capacity - 1;
        memcpy(buffer, value, n);
        buffer[n] = '\0';
      }
      return true;
    }
    line = end ? end + 2 : line + length;
  }
  return false;
}

void pcp_http_client_response_deinitialize(
    pcp_http_client_response_t* response) {
  pcp_allocator_free(response->allocator, response->body);
  pcp_allocator_free(response->allocator, response->headers);
  memset(response, 0, sizeof(*response));
}
