// SPDX-License-Identifier: Apache-2.0
// Inference through the gateway to another server (upstream s.3.1, s.3.1.3):
//
//   - POST /v1/inference/chat/completions: the body goes untouched to the
//     registered inference service's {base_url}/v1/chat/completions;
//   - POST /v1/inference/query/chat/completions: a graph query (its
//     query_mode global / local_plus_global through the federation hub as
//     /v1/graph/query, replication.c), its result as a system message bounded
//     by the model's context window (counted with the model's tokenizer when
//     the gateway serves the model), then the chat completion on the gateway's
//     own served model (over its own API, loopback) or on the registered
//     inference service.
//
// Streaming is passed through event by event (upstream buffers the whole
// downstream body): a thread per call runs the downstream request; the
// handler waits for the downstream status line, then either starts an SSE
// stream that the thread feeds with every event as it is parsed, or waits
// for the (bounded) JSON body and relays it. Failures before the status
// line are 502 JSON; a failure mid-stream is an OpenAI error event.

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "services/services_impl.h"
#include "workloads/workloads.h"

// Calls in flight at once (each holds a thread, and a server thread while
// the body is not streamed).
#define PROXY_MAX_CALLS 32
// Handlers waiting on a downstream at once (for its status line, or for the
// whole body when it is not streamed). Each holds one of the gateway's 32
// HTTP threads, and a query-then-infer call on the local model a second
// one for its loopback request: 12 leaves threads for everything else
// (/healthz included) when a downstream is slow.
#define PROXY_MAX_WAITING 12
#define PROXY_MAX_REQUEST_BYTES PCP_SERVICES_PROXY_MAX_REQUEST_BYTES
// A downstream answer that is not streamed is read up to this size.
#define PROXY_MAX_RESPONSE_BYTES ((size_t)8 << 20)
#define PROXY_CONNECT_TIMEOUT_MS 5000
// Silence allowed from the downstream server (a non-streamed generation
// says nothing until it ends).
#define PROXY_IDLE_TIMEOUT_MS 300000
// Graph context for a model this gateway does not serve (no tokenizer at
// hand): bounded in bytes.
#define QUERY_CONTEXT_MAX_BYTES ((size_t)64 << 10)

static atomic_int g_proxy_calls;
static atomic_int g_proxy_waiting;
// Set at gateway stop: transfers in flight end (their clients get an error
// event or a 502).
static atomic_bool g_proxy_stopping;

//===----------------------------------------------------------------------===//
// Errors (OpenAI's shape, openai.c)
//===----------------------------------------------------------------------===//

static pcp_status_t bad_request(pcp_http_response_t* response,
                                const char* param, const char* rule) {
  return pcp_services_openai_error_reply(response, 400, "invalid_request_error",
                                         param, NULL, "%s: %s", param, rule);
}

//===----------------------------------------------------------------------===//
// One downstream call
//===----------------------------------------------------------------------===//

typedef struct proxy_call_t {
  pcp_allocator_t allocator;  // of |body| and of this call
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;  // the handler and the thread
  char url[PCP_STORE_PATH_MAX_LENGTH + 64];
  char* body;
  size_t body_length;
  char authorization[1024];  // "Authorization: ..." or ""
  // The downstream status line.
  bool head;
  int http_status;
  bool event_stream;
  // The handler's answer to it: go on (|sse| set when streaming) or stop.
  bool go;
  bool abort;
  pcp_http_sse_stream_t* sse;
  pcp_http_sse_parser_t parser;
  bool saw_done;  // the "[DONE]" event passed through
  // A body that is not streamed.
  pcp_string_builder_t collected;
  bool too_big;
  // The end.
  bool done;
  pcp_status_code_t error_code;
  char error_text[512];
} proxy_call_t;

static void call_release(proxy_call_t* c) {
  pthread_mutex_lock(&c->mu);
  bool last = --c->refs == 0;
  pthread_mutex_unlock(&c->mu);
  if (!last) {
    return;
  }
  pcp_http_sse_parser_deinitialize(&c->parser);
  pcp_string_builder_deinitialize(&c->collected);
  pcp_http_sse_stream_release(c->sse);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  pcp_allocator_t allocator = c->allocator;
  pcp_allocator_free(allocator, c->body);
  pcp_allocator_free(allocator, c);
  atomic_fetch_sub(&g_proxy_calls, 1);
}

static bool header_is_event_stream(const char* headers) {
  for (const char* line = headers; line && *line;) {
    const char* end = strpbrk(line, "\r\n");
    size_t length = end ? (size_t)(end - line) : strlen(line);
    if (length > 13 && strncasecmp(line, "content-type:", 13) == 0) {
      char value[128];
      size_t n =
          length - 13 < sizeof(value) - 1 ? length - 13 : sizeof(value) - 1;
      memcpy(value, line + 13, n);
      value[n] = 0;
      return strstr(value, "text/event-stream") != NULL;
    }
    line = end ? end + strspn(end, "\r\n") : NULL;
  }
  return false;
}

static bool on_head(void* user_data, int http_status, const char* headers) {
  proxy_call_t* c = user_data;
  pthread_mutex_lock(&c->mu);
  c->head = true;
  c->http_status = http_status;
  c->event_stream = header_is_event_stream(headers);
  pthread_cond_broadcast(&c->cv);
  while (!c->go && !c->abort) {
    pthread_cond_wait(&c->cv, &c->mu);
  }
  bool keep = !c->abort;
  pthread_mutex_unlock(&c->mu);
  return keep;
}

// Each downstream event goes out as it is parsed (same type, same data).
static pcp_status_t on_event(void* user_data,
                             const pcp_http_sse_event_t* event) {
  proxy_call_t* c = user_data;
  if (strcmp(event->data, "[DONE]") == 0) {
    c->saw_done = true;
  }
  return pcp_http_sse_stream_send(
      c->sse, NULL, event->type[0] ? event->type : NULL, event->data);
}

static bool on_body(void* user_data, const char* data, size_t length) {
  proxy_call_t* c = user_data;
  if (atomic_load(&g_proxy_stopping)) {
    return false;
  }
  if (c->sse) {
    pcp_status_t status = pcp_http_sse_parser_feed(&c->parser, data, length);
    if (status) {
      pthread_mutex_lock(&c->mu);
      c->error_code = pcp_status_code(status);
      snprintf(c->error_text, sizeof(c->error_text), "%s",
               pcp_status_message(status));
      pthread_mutex_unlock(&c->mu);
      pcp_status_ignore(status);
      return false;
    }
    return true;
  }
  pthread_mutex_lock(&c->mu);
  bool keep = true;
  if (c->abort) {
    keep = false;  // the client left: stop reading for nobody
  } else if (c->collected.size + length > PROXY_MAX_RESPONSE_BYTES) {
    c->too_big = true;
    keep = false;
  } else {
    pcp_status_t status = pcp_string_builder_append(
        &c->collected, pcp_make_string_view(data, length));
    keep = status == 0;
    pcp_status_ignore(status);
  }
  pthread_mutex_unlock(&c->mu);
  return keep;
}

static bool should_stop(void* user_data) {
  proxy_call_t* c = user_data;
  // |abort|: the client of a call that is not streamed left (the handler
  // sets it); a downstream that trickles its body must not hold the call.
  pthread_mutex_lock(&c->mu);
  bool abort = c->abort;
  pthread_mutex_unlock(&c->mu);
  return abort || atomic_load(&g_proxy_stopping) ||
         (c->sse && !pcp_http_sse_stream_is_open(c->sse));
}

static void* call_thread(void* arg) {
  proxy_call_t* c = arg;
  pcp_http_client_options_t options = {.timeout_ms = PROXY_IDLE_TIMEOUT_MS};
  pcp_http_client_t* client = NULL;
  pcp_status_t status =
      pcp_http_client_create(&options, pcp_allocator_system(), &client);
  if (!status) {
    const char* headers[] = {"Content-Type: application/json",
                             "Accept: text/event-stream, application/json",
                             c->authorization[0] ? c->authorization : NULL,
                             NULL};
    pcp_http_client_request_t request = {.method = "POST",
                                         .url = c->url,
                                         .headers = headers,
                                         .body = c->body,
                                         .body_length = c->body_length};
    pcp_http_client_stream_t stream = {
        .on_head = on_head,
        .on_body = on_body,
        .should_stop = should_stop,
        .user_data = c,
        .connect_timeout_ms = PROXY_CONNECT_TIMEOUT_MS,
        .idle_timeout_ms = PROXY_IDLE_TIMEOUT_MS,
    };
    int http = 0;
    status = pcp_http_client_stream(client, &request, &stream, &http);
  }
  pcp_http_client_release(client);
  pthread_mutex_lock(&c->mu);
  if (status && !c->error_code) {
    c->error_code = pcp_status_code(status);
    snprintf(c->error_text, sizeof(c->error_text), "%s",
             pcp_status_message(status));
  }
  pcp_status_ignore(status);
  if (c->sse && !c->error_code && !c->saw_done) {
    // A stream whose connection simply closed (no length, no chunking)
    // ends "successfully" for libcurl; without [DONE] it was cut off.
    c->error_code = PCP_STATUS_UNAVAILABLE;
    snprintf(c->error_text, sizeof(c->error_text),
             "the inference service at %.300s ended the stream before "
             "[DONE]",
             c->url);
  }
  c->done = true;
  pcp_http_sse_stream_t* sse = c->sse;
  bool failed = c->error_code != 0 && c->error_code != PCP_STATUS_CANCELLED;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (sse) {
    if (failed && pcp_http_sse_stream_is_open(sse)) {
      // Cut off mid-stream: say so as OpenAI does, in an error event.
      pcp_status_ignore(pcp_services_openai_sse_json_send(
          sse, NULL,
          pcp_services_openai_error_json(c->error_text, "server_error", NULL,
                                         "service_proxy_failed")));
    }
    pcp_http_sse_stream_close(sse);
  }
  call_release(c);
  return NULL;
}

// What the handler does with a 2xx JSON answer (query-then-infer wraps
// it); NULL relays it as it is.
typedef json_t* (*wrap_fn_t)(void* user_data, json_t* completion);

static pcp_status_t proxy_run_waiting(pcp_allocator_t allocator,
                                      const pcp_http_request_t* request,
                                      pcp_http_response_t* response,
                                      const char* url, char* body,
                                      char* first_event, wrap_fn_t wrap,
                                      void* wrap_data);

// Runs one call to |url| with |body| (taken) and answers |response|.
// |first_event| (taken; may be NULL) is sent before the downstream events
// when the answer is streamed. Both come from |allocator|.
static pcp_status_t proxy_run(pcp_allocator_t allocator,
                              const pcp_http_request_t* request,
                              pcp_http_response_t* response, const char* url,
                              char* body, char* first_event, wrap_fn_t wrap,
                              void* wrap_data) {
  // Counted while this server thread waits (below): past the cap, slow
  // downstreams would hold every HTTP thread of the gateway.
  if (atomic_fetch_add(&g_proxy_waiting, 1) >= PROXY_MAX_WAITING) {
    atomic_fetch_sub(&g_proxy_waiting, 1);
    pcp_allocator_free(allocator, body);
    pcp_allocator_free(allocator, first_event);
    return pcp_services_openai_error_reply(
        response, 429, "rate_limit_error", NULL, "rate_limit_exceeded",
        "too many proxied inference calls waiting on their "
        "inference service at once (%d); retry later",
        PROXY_MAX_WAITING);
  }
  pcp_status_t status = proxy_run_waiting(allocator, request, response, url,
                                          body, first_event, wrap, wrap_data);
  atomic_fetch_sub(&g_proxy_waiting, 1);
  return status;
}

static pcp_status_t proxy_run_waiting(pcp_allocator_t allocator,
                                      const pcp_http_request_t* request,
                                      pcp_http_response_t* response,
                                      const char* url, char* body,
                                      char* first_event, wrap_fn_t wrap,
                                      void* wrap_data) {
  if (atomic_fetch_add(&g_proxy_calls, 1) >= PROXY_MAX_CALLS) {
    atomic_fetch_sub(&g_proxy_calls, 1);
    pcp_allocator_free(allocator, body);
    pcp_allocator_free(allocator, first_event);
    return pcp_services_openai_error_reply(
        response, 429, "rate_limit_error", NULL, "rate_limit_exceeded",
        "too many proxied inference calls at once (%d); retry "
        "later",
        PROXY_MAX_CALLS);
  }
  proxy_call_t* c = NULL;
  pcp_status_t status = pcp_allocator_calloc(allocator, sizeof(*c), (void**)&c);
  if (status) {
    atomic_fetch_sub(&g_proxy_calls, 1);
    pcp_allocator_free(allocator, body);
    pcp_allocator_free(allocator, first_event);
    return pcp_status_annotate_f(status, "proxy call");
  }
  c->allocator = allocator;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  c->refs = 2;
  snprintf(c->url, sizeof(c->url), "%s", url);
  c->body = body;
  c->body_length = strlen(body);
  const char* auth = pcp_http_request_header(request, "Authorization");
  if (auth && strlen(auth) < sizeof(c->authorization) - 16 &&
      !strpbrk(auth, "\r\n")) {
    snprintf(c->authorization, sizeof(c->authorization), "Authorization: %s",
             auth);
  }
  pcp_string_builder_initialize(pcp_allocator_system(),
                                PROXY_MAX_RESPONSE_BYTES, &c->collected);
  pcp_http_sse_parser_initialize(0, 0, on_event, c, &c->parser);
  pthread_t thread;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&thread, &attr, call_thread, c) != 0) {
    pthread_attr_destroy(&attr);
    c->refs = 1;
    call_release(c);
    pcp_allocator_free(allocator, first_event);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "proxy thread");
  }
  pthread_attr_destroy(&attr);

  pthread_mutex_lock(&c->mu);
  while (!c->head && !c->done) {
    struct timespec deadline = pcp_realtime_deadline_ms(200);
    pthread_cond_timedwait(&c->cv, &c->mu, &deadline);
    if (!c->head && !c->done && pcp_http_request_client_gone(request)) {
      c->abort = true;
      pthread_cond_broadcast(&c->cv);
      pthread_mutex_unlock(&c->mu);
      call_release(c);
      pcp_allocator_free(allocator, first_event);
      return pcp_make_status(PCP_STATUS_CANCELLED,
                             "the client closed the connection");
    }
  }
  if (!c->head) {
    char text[640];
    snprintf(text, sizeof(text), "%s", c->error_text);
    pthread_mutex_unlock(&c->mu);
    call_release(c);
    pcp_allocator_free(allocator, first_event);
    return pcp_services_openai_error_reply(
        response, 502, "bad_gateway", NULL, "service_proxy_failed",
        "inference service at %s did not answer: %s", url, text);
  }
  bool ok = c->http_status >= 200 && c->http_status < 300;
  if (ok && c->event_stream) {
    status = pcp_http_response_sse_start(response, 0, &c->sse);
    if (status) {
      c->abort = true;
    } else if (first_event) {
      pcp_status_ignore(
          pcp_http_sse_stream_send(c->sse, NULL, "graph_context", first_event));
    }
    c->go = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    call_release(c);
    pcp_allocator_free(allocator, first_event);
    return status;
  }
  pcp_allocator_free(allocator, first_event);
  // Not streamed: the thread collects the (bounded) body.
  c->go = true;
  pthread_cond_broadcast(&c->cv);
  while (!c->done) {
    struct timespec deadline = pcp_realtime_deadline_ms(200);
    pthread_cond_timedwait(&c->cv, &c->mu, &deadline);
    if (!c->done && pcp_http_request_client_gone(request)) {
      c->abort = true;  // on_body stops at its next call
    }
  }
  int http = c->http_status;
  bool too_big = c->too_big;
  pcp_status_code_t code = c->error_code;
  char text[640];
  snprintf(text, sizeof(text), "%s", c->error_text);
  json_error_t error;
  json_t* answer = c->collected.size ? json_loadb(c->collected.data,
                                                  c->collected.size, 0, &error)
                                     : NULL;
  pthread_mutex_unlock(&c->mu);
  call_release(c);
  if (too_big) {
    json_decref(answer);
    return pcp_services_openai_error_reply(
        response, 502, "bad_gateway", NULL, "service_proxy_failed",
        "inference service at %s answered more than %zu bytes", url,
        PROXY_MAX_RESPONSE_BYTES);
  }
  if (code || !answer) {
    json_decref(answer);
    return pcp_services_openai_error_reply(
        response, 502, "bad_gateway", NULL, "service_proxy_failed",
        "inference service at %s: %s", url,
        code ? text : "the answer is not JSON");
  }
  if (http < 200 || http > 599) {
    // Not a final status a client can act on (a 1xx as final, or a made-up
    // code): relaying it would hand the client a broken response.
    json_decref(answer);
    return pcp_services_openai_error_reply(
        response, 502, "bad_gateway", NULL, "service_proxy_failed",
        "inference service at %s answered HTTP status %d", url, http);
  }
  if (ok && wrap) {
    answer = wrap(wrap_data, answer);
  }
  // Upstream relays the downstream status with its JSON body.
  return pcp_http_response_json_take(response, http, answer);
}

//===----------------------------------------------------------------------===//
// Service choice
//===----------------------------------------------------------------------===//

// The registered inference service to call: not expired, with a base_url,
// optionally the one named by X-PCP-Executor-Id / X-PCP-Service-Id; the
// most recently updated wins. |out_url| gets "{base_url}/v1/chat/completions".
static pcp_status_t service_url(pcp_services_t* g,
                                const pcp_http_request_t* request,
                                char* out_url, size_t capacity,
                                bool* out_found) {
  *out_found = false;
  const char* executor = pcp_http_request_header(request, "X-PCP-Executor-Id");
  const char* service = pcp_http_request_header(request, "X-PCP-Service-Id");
  pcp_store_service_list_t list;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_service_list(g->store, NULL, PCP_STORE_LIST_LIMIT_MAX, &list));
  const pcp_store_service_t* best = NULL;
  for (size_t i = 0; i < list.count; ++i) {
    const pcp_store_service_t* s = &list.items[i];
    if (s->expired || strcmp(s->service_type, "inference") != 0 ||
        (strncmp(s->base_url, "http://", 7) != 0 &&
         strncmp(s->base_url, "https://", 8) != 0) ||
        (executor && strcmp(executor, s->executor_id) != 0) ||
        (service && strcmp(service, s->service_id) != 0)) {
      continue;
    }
    if (!best || s->updated_at_ns > best->updated_at_ns) {
      best = s;
    }
  }
  if (best) {
    size_t length = strlen(best->base_url);
    while (length > 0 && best->base_url[length - 1] == '/') {
      --length;
    }
    snprintf(out_url, capacity, "%.*s/v1/chat/completions", (int)length,
             best->base_url);
    *out_found = true;
  }
  pcp_store_service_list_deinitialize(&list);
  return pcp_ok_status();
}

pcp_status_t pcp_services_inference_proxy_post(
    void* user_data, const pcp_http_request_t* request,
    pcp_http_response_t* response) {
  pcp_services_t* g = user_data;
  pcp_string_view_t body = pcp_http_request_body(request);
  if (body.size == 0) {
    return bad_request(response, "body",
                       "a chat completion request is "
                       "required");
  }
  char url[PCP_STORE_PATH_MAX_LENGTH + 64];
  bool found = false;
  PCP_RETURN_IF_ERROR_BARE(service_url(g, request, url, sizeof(url), &found));
  if (!found) {
    return pcp_services_openai_error_reply(
        response, 404, "invalid_request_error", NULL, "service_unavailable",
        "no inference service with a base_url is registered "
        "(POST /v1/services/register)");
  }
  char* copy = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_malloc(g->allocator, body.size + 1, (void**)&copy), "body");
  memcpy(copy, body.data, body.size);
  copy[body.size] = 0;
  if (strlen(copy) != body.size) {
    pcp_allocator_free(g->allocator, copy);
    return bad_request(response, "body", "must not contain NUL bytes");
  }
  return proxy_run(g->allocator, request, response, url, copy, NULL, NULL,
                   NULL);
}

//===----------------------------------------------------------------------===//
// Query-then-infer
//===----------------------------------------------------------------------===//

static const char kContextHeader[] = "Graph context:\n";

// |key| of |item| as a string, "" when absent (a hub's item is not this
// store's row).
static const char* item_string(json_t* item, const char* key) {
  const char* v = json_string_value(json_object_get(item, key));
  return v ? v : "";
}

// One line per graph item of a graph result JSON (local, global or merged),
// in the result's order (local first, then newest first).
static json_t* context_lines(json_t* result) {
  json_t* lines = json_array();
  size_t i;
  json_t* e;
  json_array_foreach(json_object_get(result, "entities"), i, e) {
    json_t* properties = json_object_get(e, "properties");
    char* props = properties
                      ? json_dumps(properties, JSON_COMPACT | JSON_ENCODE_ANY |
                                                   JSON_SORT_KEYS)
                      : NULL;
    json_array_append_new(
        lines,
        json_sprintf("entity %s (%s) \"%s\" %s", item_string(e, "entity_id"),
                     item_string(e, "entity_type"),
                     item_string(e, "display_name"), props ? props : "{}"));
    pcp_libc_free(props);
  }
  json_array_foreach(json_object_get(result, "relations"), i, e) {
    json_array_append_new(lines, json_sprintf("relation %s -%s-> %s",
                                              item_string(e, "from_entity_id"),
                                              item_string(e, "relation_type"),
                                              item_string(e, "to_entity_id")));
  }
  json_array_foreach(json_object_get(result, "observations"), i, e) {
    char* payload = json_dumps(json_object_get(e, "payload"),
                               JSON_COMPACT | JSON_ENCODE_ANY | JSON_SORT_KEYS);
    json_array_append_new(lines,
                          json_sprintf("observation %s on %s %s",
                                       item_string(e, "observation_type"),
                                       item_string(e, "subject_entity_id"),
                                       payload ? payload : "null"));
    pcp_libc_free(payload);
  }
  return lines;
}

// |value| as compact JSON text in memory from |allocator| (what proxy_run
// takes); NULL when it cannot be encoded or allocated.
static char* dumps(pcp_allocator_t allocator, const json_t* value) {
  size_t size = json_dumpb(value, NULL, 0, JSON_COMPACT);
  char* text = NULL;
  if (size == 0) {
    return NULL;
  }
  pcp_status_t status =
      pcp_allocator_malloc(allocator, size + 1, (void**)&text);
  if (status) {
    pcp_status_ignore(status);
    return NULL;
  }
  json_dumpb(value, text, size, JSON_COMPACT);
  text[size] = '\0';
  return text;
}

// The system message with the first |k| of |lines| (a note when k < n), from
// |allocator|.
static char* context_text(pcp_allocator_t allocator, json_t* lines, size_t k) {
  size_t n = json_array_size(lines);
  pcp_string_builder_t b;
  pcp_string_builder_initialize(allocator, 0, &b);
  pcp_status_t status =
      pcp_string_builder_append(&b, pcp_make_cstring_view(kContextHeader));
  for (size_t i = 0; !status && i < k; ++i) {
    json_t* line = json_array_get(lines, i);
    status = pcp_string_builder_append(
        &b, pcp_make_string_view(json_string_value(line),
                                 json_string_length(line)));
    if (!status) {
      status = pcp_string_builder_append(&b, pcp_make_cstring_view("\n"));
    }
  }
  if (!status && k < n) {
    char note[96];
    snprintf(note, sizeof(note), "[truncated: %zu of %zu graph items]\n", k, n);
    status = pcp_string_builder_append(&b, pcp_make_cstring_view(note));
  }
  char* text = NULL;
  if (!status) {
    status = pcp_string_builder_take(&b, &text);
  }
  pcp_status_ignore(status);
  pcp_string_builder_deinitialize(&b);
  return text;
}

typedef struct query_answer_t {
  json_t* graph_query;  // the graph result JSON
  char* prompt;
  bool truncated;
  json_t* stats;
} query_answer_t;

static json_t* query_wrap(void* user_data, json_t* completion) {
  query_answer_t* a = user_data;
  json_t* usage = json_object_get(completion, "usage");
  return json_pack("{s:O, s:s, s:b, s:O, s:o, s:O}", "graph_query",
                   a->graph_query, "graph_context_prompt", a->prompt,
                   "graph_context_truncated", a->truncated, "graph_context",
                   a->stats, "completion", completion, "usage",
                   usage ? usage : json_null());
}

static json_t* graph_result_json(const pcp_store_graph_result_t* r) {
  json_t* entities = json_array();
  for (size_t i = 0; i < r->entity_count; ++i) {
    const pcp_store_graph_entity_t* e = &r->entities[i];
    json_array_append_new(
        entities,
        json_pack("{s:s, s:s, s:s, s:s, s:s, s:O}", "entity_id", e->entity_id,
                  "namespace_id", e->namespace_id, "entity_type",
                  e->entity_type, "display_name", e->display_name, "visibility",
                  pcp_store_visibility_name(e->visibility), "properties",
                  e->properties));
  }
  json_t* relations = json_array();
  for (size_t i = 0; i < r->relation_count; ++i) {
    const pcp_store_graph_relation_t* e = &r->relations[i];
    json_array_append_new(
        relations,
        json_pack("{s:s, s:s, s:s, s:s, s:s}", "relation_id", e->relation_id,
                  "namespace_id", e->namespace_id, "relation_type",
                  e->relation_type, "from_entity_id", e->from_entity_id,
                  "to_entity_id", e->to_entity_id));
  }
  json_t* observations = json_array();
  for (size_t i = 0; i < r->observation_count; ++i) {
    const pcp_store_graph_observation_t* e = &r->observations[i];
    json_array_append_new(
        observations,
        json_pack("{s:s, s:s, s:s, s:s, s:O}", "observation_id",
                  e->observation_id, "namespace_id", e->namespace_id,
                  "subject_entity_id", e->subject_entity_id, "observation_type",
                  e->observation_type, "payload", e->payload));
  }
  return json_pack("{s:o, s:o, s:o}", "entities", entities, "relations",
                   relations, "observations", observations);
}

// Fits the first k lines into the local model's window: the largest k for
// which the prompt's tokens plus |reserve| fit (binary search; the count
// grows with k). Sets *out_tokens to the prompt's tokens at that k.
static pcp_status_t fit_tokens(pcp_services_t* g, const char* model,
                               json_t* messages, json_t* lines,
                               int64_t max_tokens, size_t* out_k,
                               int64_t* out_tokens, int64_t* out_window) {
  size_t count = json_array_size(messages);
  pcp_infer_message_t* m = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(g->allocator, (count + 1) * sizeof(*m), (void**)&m),
      "messages");
  for (size_t i = 0; i < count; ++i) {
    json_t* message = json_array_get(messages, i);
    json_t* role = json_object_get(message, "role");
    json_t* content = json_object_get(message, "content");
    m[i + 1].role = pcp_make_cstring_view(json_string_value(role));
    m[i + 1].content = pcp_make_string_view(json_string_value(content),
                                            json_string_length(content));
  }
  m[0].role = pcp_make_cstring_view("system");
  pcp_infer_request_params_t params = {
      .model = model, .chat = true, .messages = m, .message_count = count + 1};
  size_t lo = 0;
  size_t hi = json_array_size(lines);
  int64_t tokens = 0;
  int64_t window = 0;
  int64_t reserve = 0;
  pcp_status_t status = pcp_ok_status();
  // Invariant: lo fits (or is 0); every k > hi does not.
  while (!status) {
    size_t k = lo == hi ? lo : lo + (hi - lo + 1) / 2;
    char* text = context_text(g->allocator, lines, k);
    if (!text) {
      status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "context");
      break;
    }
    m[0].content = pcp_make_cstring_view(text);
    int64_t n = 0;
    status = pcp_infer_prompt_tokens_count(g->infer, &params, &n, &window);
    pcp_allocator_free(g->allocator, text);
    if (status) {
      break;
    }
    reserve = max_tokens > 0 ? max_tokens : (window / 4 > 0 ? window / 4 : 1);
    bool fits = n + reserve <= window;
    if (lo == hi) {
      tokens = n;
      break;
    }
    if (fits) {
      lo = k;
    } else {
      hi = k - 1;
    }
  }
  pcp_allocator_free(g->allocator, m);
  *out_k = lo;
  *out_tokens = tokens;
  *out_window = window;
  return status;
}

pcp_status_t pcp_services_query_infer_post(void* user_data,
                                           const pcp_http_request_t* request,
                                           pcp_http_response_t* response) {
  pcp_services_t* g = user_data;
  json_t* body = NULL;
  pcp_status_t status = pcp_http_request_json_parse(request, &body);
  if (status) {
    pcp_status_ignore(status);
    return bad_request(response, "body", "must be a JSON object");
  }
  json_t* inference = json_object_get(body, "inference");
  json_t* messages = json_object_get(inference, "messages");
  json_t* model = json_object_get(inference, "model");
  json_t* stream = json_object_get(inference, "stream");
  json_t* max_tokens = json_object_get(inference, "max_tokens");
  if (!max_tokens) {
    max_tokens = json_object_get(inference, "max_completion_tokens");
  }
  const char* rule = NULL;
  const char* param = NULL;
  char param_buffer[64];
  // No graph_query: every item of the local graph, up to the default limit.
  json_t* graph_query = json_object_get(body, "graph_query");
  pcp_store_graph_query_t q = {0};
  const char* mode = "local";
  const char* key = NULL;
  if (!json_is_object(body) || !json_is_object(inference)) {
    param = "inference", rule =
                             "must be an object with 'model' and "
                             "'messages'";
  } else if (!json_is_string(model) || json_string_length(model) == 0 ||
             json_string_length(model) > PCP_INFER_MAX_MODEL_NAME) {
    param = "inference.model", rule = "must be a model name";
  } else if (!json_is_array(messages) || json_array_size(messages) == 0 ||
             json_array_size(messages) > PCP_INFER_MAX_MESSAGES) {
    param = "inference.messages",
    rule = "must be a non-empty array of at most 1024 messages";
  } else if (stream && !json_is_boolean(stream)) {
    param = "inference.stream", rule = "must be a boolean";
  } else if (max_tokens && (!json_is_integer(max_tokens) ||
                            json_integer_value(max_tokens) < 1)) {
    param = "inference.max_tokens", rule = "must be a positive integer";
  } else if (graph_query && (rule = pcp_services_graph_query_parse(
                                 graph_query, &q, &mode, &key)) != NULL) {
    snprintf(param_buffer, sizeof(param_buffer), "graph_query%s%s",
             key ? "." : "", key ? key : "");
    param = param_buffer;
  }
  for (size_t i = 0; !rule && i < json_array_size(messages); ++i) {
    json_t* m = json_array_get(messages, i);
    if (!json_is_string(json_object_get(m, "role")) ||
        !json_is_string(json_object_get(m, "content"))) {
      param = "inference.messages",
      rule = "each message needs a string 'role' and a string 'content'";
    }
  }
  if (rule) {
    pcp_status_t reply = bad_request(response, param, rule);
    json_decref(body);
    return reply;
  }
  json_t* graph_json = NULL;
  bool global_only = strcmp(mode, "global") == 0;
  if (!global_only) {
    pcp_store_graph_result_t result = {0};
    status = pcp_store_graph_backend_query(g->graph, &q, &result);
    if (status) {
      json_decref(body);
      return status;  // 400 for a bad filter, 503 when the graph is down
    }
    graph_json = graph_result_json(&result);
    pcp_store_graph_result_deinitialize(&result);
  }
  if (strcmp(mode, "local") != 0) {
    // The hub's answer filtered by visibility (merged local-first), as
    // /v1/graph/query gives it (replication.c).
    json_t* merged = NULL;
    status = pcp_services_replication_query_run(
        g, json_object_get(body, "graph_query"), mode, graph_json,
        q.limit ? q.limit : 20, &merged);
    json_decref(graph_json);
    graph_json = merged;
    if (status) {
      json_decref(body);
      int http = pcp_status_code(status) == PCP_STATUS_UNAVAILABLE        ? 502
                 : pcp_status_code(status) == PCP_STATUS_INVALID_ARGUMENT ? 400
                                                                          : 500;
      // No completion without the context asked for: the hub's failure is
      // the answer.
      pcp_status_t reply = pcp_services_openai_error_reply(
          response, http,
          http == 502   ? "bad_gateway"
          : http == 400 ? "invalid_request_error"
                        : "server_error",
          "graph_query.query_mode",
          http == 502 ? "FederationHubQueryFailed" : NULL, "%s",
          pcp_status_message(status));
      pcp_status_ignore(status);
      return reply;
    }
  }
  json_t* lines = context_lines(graph_json);
  size_t n = json_array_size(lines);

  // The gateway's own model: tokens counted with its tokenizer. Otherwise
  // a registered inference service: bytes.
  const char* model_name = json_string_value(model);
  size_t k = n;
  int64_t tokens = -1;
  int64_t window = -1;
  char url[PCP_STORE_PATH_MAX_LENGTH + 64];
  const char* target = "local";
  status = fit_tokens(g, model_name, messages, lines,
                      max_tokens ? json_integer_value(max_tokens) : 0, &k,
                      &tokens, &window);
  if (!status) {
    const pcp_services_config_t* c = &g->config;
    const char* host = c->api_host;
    if (!host || !host[0] || strcmp(host, "0.0.0.0") == 0 ||
        strcmp(host, "::") == 0) {
      host = "127.0.0.1";
    }
    bool tls = c->tls;
    snprintf(url, sizeof(url), "%s://%s%s%s:%lld/v1/chat/completions",
             tls ? "https" : "http", strchr(host, ':') ? "[" : "", host,
             strchr(host, ':') ? "]" : "", (long long)c->api_port);
  } else if (pcp_status_code(status) == PCP_STATUS_NOT_FOUND) {
    pcp_status_ignore(status);
    bool found = false;
    status = service_url(g, request, url, sizeof(url), &found);
    if (!status && !found) {
      status = pcp_make_status(PCP_STATUS_NOT_FOUND,
                               "inference.model: `%s` is not served by this "
                               "gateway and no inference service is "
                               "registered",
                               model_name);
    }
    target = "service";
    size_t bytes = sizeof(kContextHeader);
    for (k = 0; k < n; ++k) {
      bytes += json_string_length(json_array_get(lines, k)) + 1;
      if (bytes > QUERY_CONTEXT_MAX_BYTES) {
        break;
      }
    }
  }
  if (status) {
    json_decref(lines);
    json_decref(graph_json);
    json_decref(body);
    int http = pcp_status_code(status) == PCP_STATUS_NOT_FOUND     ? 404
               : pcp_status_code(status) == PCP_STATUS_UNAVAILABLE ? 503
                                                                   : 500;
    pcp_status_t reply = pcp_services_openai_error_reply(
        response, http,
        http == 404 ? "invalid_request_error" : "service_unavailable_error",
        http == 404 ? "inference.model" : NULL,
        http == 404 ? "model_not_found" : NULL, "%s",
        pcp_status_message(status));
    pcp_status_ignore(status);
    return reply;
  }
  query_answer_t answer = {.graph_query = graph_json,
                           .prompt = context_text(g->allocator, lines, k),
                           .truncated = k < n};
  answer.stats = json_pack(
      "{s:s, s:I, s:I, s:o, s:o, s:I}", "target", target, "items_total",
      (json_int_t)n, "items_included", (json_int_t)k, "prompt_tokens",
      tokens >= 0 ? json_integer(tokens) : json_null(), "context_window",
      window >= 0 ? json_integer(window) : json_null(), "max_context_bytes",
      (json_int_t)QUERY_CONTEXT_MAX_BYTES);
  json_decref(lines);
  // The downstream body: every key of |inference|, the context first.
  json_t* downstream = json_deep_copy(inference);
  json_t* all = json_array();
  json_array_append_new(all,
                        json_pack("{s:s, s:s}", "role", "system", "content",
                                  answer.prompt ? answer.prompt : ""));
  json_array_extend(all, messages);
  json_object_set_new(downstream, "messages", all);
  bool streamed = json_is_true(stream);
  if (streamed && !json_object_get(downstream, "stream_options")) {
    // Usage arrives in the last chunk before [DONE].
    json_object_set_new(downstream, "stream_options",
                        json_pack("{s:b}", "include_usage", 1));
  }
  char* text = dumps(g->allocator, downstream);
  json_decref(downstream);
  json_decref(body);
  char* first = NULL;
  if (streamed) {
    json_t* event =
        json_pack("{s:s, s:O, s:s, s:b, s:O}", "object", "graph.context",
                  "graph_query", answer.graph_query, "graph_context_prompt",
                  answer.prompt ? answer.prompt : "", "graph_context_truncated",
                  answer.truncated, "graph_context", answer.stats);
    first = event ? dumps(g->allocator, event) : NULL;
    json_decref(event);
  }
  if (!text || !answer.prompt || (streamed && !first)) {
    pcp_allocator_free(g->allocator, text);
    pcp_allocator_free(g->allocator, first);
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "request");
  } else if (strlen(text) > PROXY_MAX_REQUEST_BYTES) {
    pcp_allocator_free(g->allocator, text);
    pcp_allocator_free(g->allocator, first);
    status = bad_request(response, "inference.messages",
                         "longer than 2 MiB with the graph context");
  } else {
    status = proxy_run(g->allocator, request, response, url, text, first,
                       query_wrap, &answer);
  }
  pcp_allocator_free(g->allocator, answer.prompt);
  json_decref(answer.graph_query);
  json_decref(answer.stats);
  return status;
}

//===----------------------------------------------------------------------===//
// Routes
//===----------------------------------------------------------------------===//

void pcp_services_proxy_stop(int64_t timeout_ms) {
  atomic_store(&g_proxy_stopping, true);
  // The threads notice within about a second (libcurl polls should_stop).
  for (int64_t waited = 0;
       atomic_load(&g_proxy_calls) > 0 && waited < timeout_ms; waited += 20) {
    pcp_sleep_ms(20);
  }
}

void pcp_services_proxy_reset(void) {
  // One gateway per process; a test may serve several in turn.
  atomic_store(&g_proxy_stopping, false);
}
