// SPDX-License-Identifier: Apache-2.0
//
// Real HTTP on 127.0.0.1 (ephemeral ports) with libcurl as the client.

#include "http/http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "http/http_impl.h"  // pcp_http_gate_classify

#define API_TOKEN_ENV "PCP_HTTP_TEST_API_TOKEN"
#define INTERNAL_TOKEN_ENV "PCP_HTTP_TEST_INTERNAL_TOKEN"
#define FEDERATION_TOKEN_ENV "PCP_HTTP_TEST_FEDERATION_TOKEN"
#define API_TOKEN "api-secret-1"
#define INTERNAL_TOKEN "internal-secret-2"

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

static void assert_contains(const char* text, const char* needle) {
  if (!text || !strstr(text, needle)) {
    fail_msg("'%s' not in:\n%s", needle, text ? text : "(null)");
  }
}

static void assert_status(pcp_status_t status, pcp_status_code_t code,
                          const char* substring) {
  assert_non_null(status);
  assert_int_equal(pcp_status_code(status), code);
  assert_contains(pcp_status_message(status), substring);
  pcp_status_ignore(status);
}

// Checks the one error schema and returns nothing; fails the test otherwise.
static void assert_error_body(const pcp_http_client_response_t* response,
                              int http_status, const char* code) {
  if (response->http_status != http_status) {
    fail_msg("status %d, expected %d; body %s", response->http_status,
             http_status, response->body);
  }
  char content_type[128];
  assert_true(pcp_http_client_response_header(
      response, "Content-Type", content_type, sizeof(content_type)));
  assert_string_equal(content_type, "application/json");
  json_error_t error;
  json_t* root = json_loads(response->body, 0, &error);
  if (!root) {
    fail_msg("error body is not JSON: %s", response->body);
  }
  json_t* inner = json_object_get(root, "error");
  assert_true(json_is_object(inner));
  assert_int_equal(json_object_size(root), 1);
  assert_string_equal(json_string_value(json_object_get(inner, "code")), code);
  assert_true(json_is_string(json_object_get(inner, "message")));
  json_decref(root);
}

//===----------------------------------------------------------------------===//
// Handlers
//===----------------------------------------------------------------------===//

// Echoes what the server saw, as JSON.
static pcp_status_t echo_handler(void* user_data,
                                 const pcp_http_request_t* request,
                                 pcp_http_response_t* response) {
  PCP_UNUSED(user_data);
  const char* id = pcp_http_request_param(request, "id");
  const char* rest = pcp_http_request_param(request, "*");
  const char* limit = pcp_http_request_query(request, "limit");
  const char* flag = pcp_http_request_query(request, "flag");
  const char* header = pcp_http_request_header(request, "x-test");
  json_t* body = json_pack(
      "{s:s,s:s,s:s,s:s?,s:s?,s:s?,s:s?,s:s?,s:I,s:s?}", "method",
      pcp_http_request_method(request), "path", pcp_http_request_path(request),
      "route", pcp_http_request_route(request), "id", id, "rest", rest, "limit",
      limit, "flag", flag, "header", header, "body_length",
      (json_int_t)pcp_http_request_body(request).size, "remote",
      pcp_http_request_remote_address(request));
  pcp_status_t status = pcp_http_response_json_set(response, 200, body);
  json_decref(body);
  return status;
}

// Returns the status named by the {code} parameter ("NOT_FOUND").
static pcp_status_t status_handler(void* user_data,
                                   const pcp_http_request_t* request,
                                   pcp_http_response_t* response) {
  PCP_UNUSED(user_data);
  // A response set before failing is discarded: the status is the answer.
  PCP_CHECK_OK(pcp_http_response_body_set(response, 200, "text/plain", "x", 1));
  pcp_status_code_t code = PCP_STATUS_OK;
  if (!pcp_status_code_from_string(pcp_http_request_param(request, "code"),
                                   &code) ||
      code == PCP_STATUS_OK) {
    return pcp_ok_status();
  }
  return pcp_make_status(code, "asked for %s", pcp_status_code_string(code));
}

static pcp_status_t silent_handler(void* user_data,
                                   const pcp_http_request_t* request,
                                   pcp_http_response_t* response) {
  PCP_UNUSED(user_data);
  PCP_UNUSED(request);
  PCP_UNUSED(response);
  return pcp_ok_status();  // forgot to answer
}

static pcp_status_t json_handler(void* user_data,
                                 const pcp_http_request_t* request,
                                 pcp_http_response_t* response) {
  PCP_UNUSED(user_data);
  json_t* value = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_http_request_json_parse(request, &value));
  return pcp_http_response_json_take(response, 201,
                                     json_pack("{s:o}", "got", value));
}

typedef struct slow_state_t {
  int64_t delay_ms;
  _Atomic int entered;  // handler calls started
} slow_state_t;

static pcp_status_t slow_handler(void* user_data,
                                 const pcp_http_request_t* request,
                                 pcp_http_response_t* response) {
  PCP_UNUSED(request);
  slow_state_t* slow = user_data;
  atomic_fetch_add(&slow->entered, 1);
  pcp_sleep_ms(slow->delay_ms);
  return pcp_http_response_body_set(response, 200, "text/plain", "done", 4);
}

// The watch handler: polls pcp_http_request_client_gone until it says gone
// (or 5 s), counting the polls that saw the client still there.
typedef struct watch_state_t {
  _Atomic int entered;
  _Atomic int alive_polls;
  _Atomic int outcome;  // 0 running, 1 saw the client go, 2 timed out
} watch_state_t;

static pcp_status_t watch_handler(void* user_data,
                                  const pcp_http_request_t* request,
                                  pcp_http_response_t* response) {
  watch_state_t* watch = user_data;
  atomic_store(&watch->entered, 1);
  for (int i = 0; i < 1000; ++i) {
    if (pcp_http_request_client_gone(request)) {
      atomic_store(&watch->outcome, 1);
      return pcp_http_response_body_set(response, 200, "text/plain", "x", 1);
    }
    atomic_fetch_add(&watch->alive_polls, 1);
    pcp_sleep_ms(5);
  }
  atomic_store(&watch->outcome, 2);
  return pcp_http_response_body_set(response, 200, "text/plain", "x", 1);
}

typedef struct sse_state_t {
  _Atomic(pcp_http_sse_stream_t*) stream;  // handed to the test
  size_t max_queued_bytes;
  _Atomic int fill_result;  // status code of the send that filled the queue
} sse_state_t;

// Starts an event stream. It greets with the Last-Event-ID it was given;
// with ?fill it first checks that a client that does not read is bounded.
static pcp_status_t events_handler(void* user_data,
                                   const pcp_http_request_t* request,
                                   pcp_http_response_t* response) {
  sse_state_t* state = user_data;
  pcp_http_sse_stream_t* stream = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_http_response_sse_start(response, state->max_queued_bytes, &stream));
  if (pcp_http_request_query(request, "fill")) {
    pcp_status_t status = pcp_ok_status();
    for (int i = 0; i < 1000 && !status; ++i) {
      status = pcp_http_sse_stream_send(stream, NULL, NULL, "0123456789");
    }
    atomic_store(&state->fill_result, (int)pcp_status_consume_code(status));
    pcp_http_sse_stream_close(stream);
    pcp_http_sse_stream_release(stream);
    return pcp_ok_status();
  }
  const char* last = pcp_http_request_header(request, "Last-Event-ID");
  pcp_status_t status =
      pcp_http_sse_stream_send(stream, "0", "hello", last ? last : "start");
  if (status) {
    pcp_http_sse_stream_release(stream);
    return status;
  }
  atomic_store(&state->stream, stream);  // the test owns this reference
  return pcp_ok_status();
}

typedef struct ready_state_t {
  _Atomic bool ready;
} ready_state_t;

static bool ready_check(void* user_data, json_t* details) {
  ready_state_t* state = user_data;
  bool ready = atomic_load(&state->ready);
  json_object_set_new(
      details, "missing",
      ready ? json_array() : json_pack("[s]", "fabric listener"));
  return ready;
}

//===----------------------------------------------------------------------===//
// Fixture
//===----------------------------------------------------------------------===//

typedef struct fixture_t {
  pcp_obs_registry_t* registry;
  pcp_http_server_t* server;
  pcp_http_client_t* client;
  ready_state_t ready_state;
  pcp_http_readyz_t readyz;
  slow_state_t slow;
  watch_state_t watch;
  sse_state_t sse;
  char base_url[64];
  char tls_dir[64];
} fixture_t;

static const pcp_http_scope_t kScopes[] = {
    {"api", API_TOKEN_ENV},
    {"internal", INTERNAL_TOKEN_ENV},
    {"federation", FEDERATION_TOKEN_ENV},
};

static void add_routes(fixture_t* f) {
  const pcp_http_route_t routes[] = {
      {"GET", "/v1/jobs", NULL, echo_handler, NULL, 0, 0},
      {"*", "/any", NULL, echo_handler, NULL, 0, 0},
      {"GET", "/events", NULL, events_handler, &f->sse, 0, 0},
      {"POST", "/v1/jobs", NULL, echo_handler, NULL, 1024, 0},
      {"GET", "/v1/jobs/{id}", NULL, echo_handler, NULL, 0, 0},
      {"DELETE", "/v1/jobs/{id}", NULL, echo_handler, NULL, 0, 0},
      {"GET", "/v1/jobs/special", NULL, echo_handler, NULL, 0, 0},
      {"POST", "/v1/jobs/{id}/cancel", NULL, echo_handler, NULL, 0, 0},
      {"GET", "/static/*", NULL, echo_handler, NULL, 0, 0},
      {"GET", "/status/{code}", NULL, status_handler, NULL, 0, 0},
      {"GET", "/silent", NULL, silent_handler, NULL, 0, 0},
      {"POST", "/json", NULL, json_handler, NULL, 0, 0},
      {"POST", "/json/shallow", NULL, json_handler, NULL, 0, 4},
      {"GET", "/slow", NULL, slow_handler, &f->slow, 0, 0},
      {"GET", "/watch", NULL, watch_handler, &f->watch, 0, 0},
      {"GET", "/v1/secure", "api", echo_handler, NULL, 0, 0},
      {"GET", "/v1/internal/x", "internal", echo_handler, NULL, 0, 0},
      {"GET", "/v1/federation/x", "federation", echo_handler, NULL, 0, 0},
  };
  PCP_CHECK_OK(pcp_http_server_probes_add(f->server, f->registry, &f->readyz));
  PCP_CHECK_OK(
      pcp_http_server_routes_add(f->server, routes, PCP_ARRAYSIZE(routes)));
}

static int start_server(fixture_t* f, const char* cert, const char* key) {
  setenv(API_TOKEN_ENV, API_TOKEN, 1);
  setenv(INTERNAL_TOKEN_ENV, INTERNAL_TOKEN, 1);
  unsetenv(FEDERATION_TOKEN_ENV);
  PCP_CHECK_OK(pcp_obs_registry_create(pcp_allocator_system(), &f->registry));
  pcp_http_server_options_t options = {0};
  options.name = "test";
  options.host = "127.0.0.1";
  options.port = 0;
  options.scopes = kScopes;
  options.scope_count = PCP_ARRAYSIZE(kScopes);
  options.registry = f->registry;
  options.tls_cert_path = cert;
  options.tls_key_path = key;
  PCP_CHECK_OK(
      pcp_http_server_create(&options, pcp_allocator_system(), &f->server));
  f->readyz.ready = ready_check;
  f->readyz.user_data = &f->ready_state;
  add_routes(f);
  PCP_CHECK_OK(pcp_http_server_start(f->server));
  snprintf(f->base_url, sizeof(f->base_url), "%s://127.0.0.1:%u",
           cert ? "https" : "http", (unsigned)pcp_http_server_port(f->server));
  pcp_http_client_options_t client_options = {0};
  client_options.ca_path = cert;
  client_options.timeout_ms = 10000;
  PCP_CHECK_OK(pcp_http_client_create(&client_options, pcp_allocator_system(),
                                      &f->client));
  return 0;
}

static int setup(void** state) {
  fixture_t* f = calloc(1, sizeof(*f));
  f->slow.delay_ms = 300;
  *state = f;
  return start_server(f, NULL, NULL);
}

static int teardown(void** state) {
  fixture_t* f = *state;
  pcp_http_client_release(f->client);
  pcp_http_server_release(f->server);
  pcp_obs_registry_release(f->registry);
  if (f->tls_dir[0]) {
    char command[128];
    snprintf(command, sizeof(command), "rm -rf %s", f->tls_dir);
    assert_int_equal(system(command), 0);
  }
  free(f);
  return 0;
}

// Sends |method| |path| (relative to the server) and returns the response.
static pcp_http_client_response_t send_request(
    fixture_t* f, const char* method, const char* path, const char* token,
    const char* body, size_t body_length, bool chunked) {
  char url[8192 + 128];
  snprintf(url, sizeof(url), "%s%s", f->base_url, path);
  pcp_http_client_request_t request = {0};
  request.method = method;
  request.url = url;
  request.bearer_token = token;
  request.body = body;
  request.body_length = body_length;
  request.chunked = chunked;
  pcp_http_client_response_t response;
  PCP_CHECK_OK(pcp_http_client_send(f->client, &request, &response));
  return response;
}

static pcp_http_client_response_t get(fixture_t* f, const char* path) {
  return send_request(f, "GET", path, NULL, NULL, 0, false);
}

static json_t* body_json(const pcp_http_client_response_t* response) {
  json_error_t error;
  json_t* value = json_loads(response->body, 0, &error);
  if (!value) {
    fail_msg("not JSON (%s): %s", error.text, response->body);
  }
  return value;
}

static const char* field(json_t* object, const char* key) {
  return json_string_value(json_object_get(object, key));
}

//===----------------------------------------------------------------------===//
// Pure functions
//===----------------------------------------------------------------------===//

static void status_mapping_table(void** state) {
  PCP_UNUSED(state);
  static const struct {
    pcp_status_code_t code;
    int http_status;
  } kCases[] = {
      {PCP_STATUS_OK, 200},
      {PCP_STATUS_CANCELLED, 500},
      {PCP_STATUS_UNKNOWN, 500},
      {PCP_STATUS_INVALID_ARGUMENT, 400},
      {PCP_STATUS_DEADLINE_EXCEEDED, 504},
      {PCP_STATUS_NOT_FOUND, 404},
      {PCP_STATUS_ALREADY_EXISTS, 409},
      {PCP_STATUS_PERMISSION_DENIED, 403},
      {PCP_STATUS_RESOURCE_EXHAUSTED, 429},
      {PCP_STATUS_FAILED_PRECONDITION, 409},
      {PCP_STATUS_ABORTED, 409},
      {PCP_STATUS_OUT_OF_RANGE, 400},
      {PCP_STATUS_UNIMPLEMENTED, 501},
      {PCP_STATUS_INTERNAL, 500},
      {PCP_STATUS_UNAVAILABLE, 503},
      {PCP_STATUS_DATA_LOSS, 500},
      {PCP_STATUS_UNAUTHENTICATED, 401},
      {PCP_STATUS_DEFERRED, 500},
      {PCP_STATUS_INCOMPATIBLE, 500},
  };
  assert_int_equal(PCP_ARRAYSIZE(kCases), PCP_STATUS_CODE_COUNT_);
  for (size_t i = 0; i < PCP_ARRAYSIZE(kCases); ++i) {
    assert_int_equal(pcp_http_status_from_code(kCases[i].code),
                     kCases[i].http_status);
  }
  assert_string_equal(pcp_http_status_reason(413), "Content Too Large");
}

static void error_json_escapes_message(void** state) {
  PCP_UNUSED(state);
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &builder);
  PCP_CHECK_OK(
      pcp_http_error_json_format("NOT_FOUND", "job \"a\\b\"\n", &builder));
  assert_string_equal(pcp_string_builder_cstring(&builder),
                      "{\"error\":{\"code\":\"NOT_FOUND\",\"message\":\"job "
                      "\\\"a\\\\b\\\"\\n\"}}");
  pcp_string_builder_deinitialize(&builder);
}

static void token_equal_is_exact(void** state) {
  PCP_UNUSED(state);
  assert_true(pcp_http_token_equal("secret", 6, "secret", 6));
  assert_false(pcp_http_token_equal("secret", 6, "secreT", 6));
  assert_false(pcp_http_token_equal("secret", 6, "secret2", 7));
  assert_false(pcp_http_token_equal("secret", 6, "", 0));
  assert_true(pcp_http_token_equal("", 0, "", 0));
  // Prefixes must not match (a memcmp over the shorter length would).
  assert_false(pcp_http_token_equal("sec", 3, "secret", 6));
}

static void json_depth_check_counts_only_structure(void** state) {
  PCP_UNUSED(state);
  const char* ok = "{\"a\":[[\"[[[[[\",{\"b\":\"}}}]]\\\"[[[\"}]]}";
  PCP_CHECK_OK(pcp_http_json_depth_check(ok, strlen(ok), 4));
  assert_status(pcp_http_json_depth_check(ok, strlen(ok), 3),
                PCP_STATUS_INVALID_ARGUMENT, "deeper than 3");
  char deep[200];
  memset(deep, '[', 64);
  memset(deep + 64, ']', 64);
  PCP_CHECK_OK(pcp_http_json_depth_check(deep, 128, 0));  // 64 levels
  memset(deep, '[', 65);
  memset(deep + 65, ']', 65);
  assert_status(pcp_http_json_depth_check(deep, 130, 0),
                PCP_STATUS_INVALID_ARGUMENT, "deeper than 64");
}

static void route_and_option_errors(void** state) {
  fixture_t* f = *state;
  pcp_http_server_t* server = NULL;
  pcp_http_server_options_t options = {0};
  options.tls_cert_path = "/nonexistent.pem";
  assert_status(
      pcp_http_server_create(&options, pcp_allocator_system(), &server),
      PCP_STATUS_INVALID_ARGUMENT, "both");
  options.tls_cert_path = NULL;
  options.scopes = (const pcp_http_scope_t[]){{"api", "A"}, {"api", "B"}};
  options.scope_count = 2;
  assert_status(
      pcp_http_server_create(&options, pcp_allocator_system(), &server),
      PCP_STATUS_INVALID_ARGUMENT, "twice");
  options.scope_count = 1;
  PCP_CHECK_OK(
      pcp_http_server_create(&options, pcp_allocator_system(), &server));
  static const struct {
    const char* pattern;
    const char* scope;
    const char* message;
  } kBad[] = {
      {"v1/jobs", NULL, "start with '/'"},
      {"/v1/{}", NULL, "bad parameter name"},
      {"/v1/*/x", NULL, "must be last"},
      {"/v1/a{b}", NULL, "whole segments"},
      {"/v1/x", "nope", "unknown token scope"},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(kBad); ++i) {
    pcp_http_route_t route = {
        "GET", kBad[i].pattern, kBad[i].scope, echo_handler, NULL, 0, 0};
    assert_status(pcp_http_server_routes_add(server, &route, 1),
                  PCP_STATUS_INVALID_ARGUMENT, kBad[i].message);
  }
  pcp_http_route_t route = {"GET", "/x", "api", echo_handler, NULL, 0, 0};
  PCP_CHECK_OK(pcp_http_server_routes_add(server, &route, 1));
  assert_status(pcp_http_server_routes_add(server, &route, 1),
                PCP_STATUS_INVALID_ARGUMENT, "twice");
  pcp_http_server_release(server);
  // Routes are fixed once started.
  assert_status(pcp_http_server_routes_add(f->server, &route, 1),
                PCP_STATUS_FAILED_PRECONDITION, "fixed");
  // Unreadable TLS material fails start, naming the file.
  options.scope_count = 0;
  options.tls_cert_path = "/nonexistent/cert.pem";
  options.tls_key_path = "/nonexistent/key.pem";
  PCP_CHECK_OK(
      pcp_http_server_create(&options, pcp_allocator_system(), &server));
  assert_status(pcp_http_server_start(server), PCP_STATUS_NOT_FOUND,
                "/nonexistent/cert.pem");
  pcp_http_server_release(server);
  options.tls_cert_path = NULL;
  options.tls_key_path = NULL;
  // A port already bound is UNAVAILABLE.
  options.scope_count = 0;
  options.port = pcp_http_server_port(f->server);
  PCP_CHECK_OK(
      pcp_http_server_create(&options, pcp_allocator_system(), &server));
  assert_status(pcp_http_server_start(server), PCP_STATUS_UNAVAILABLE,
                "cannot listen");
  pcp_http_server_release(server);
}

// Creates a server, adds routes and releases it through |allocator|.
static pcp_status_t exercise_create(pcp_allocator_t allocator) {
  pcp_http_server_options_t options = {0};
  options.scopes = kScopes;
  options.scope_count = PCP_ARRAYSIZE(kScopes);
  pcp_http_server_t* server = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_http_server_create(&options, allocator, &server));
  const pcp_http_route_t routes[] = {
      {"GET", "/v1/jobs/{id}/results/{name}", "api", echo_handler, NULL, 0, 0},
      {"POST", "/v1/jobs", "api", echo_handler, NULL, 0, 0},
      {"GET", "/static/*", NULL, echo_handler, NULL, 0, 0},
  };
  pcp_status_t status = pcp_http_server_probes_add(server, NULL, NULL);
  for (size_t i = 0; i < 20 && !status; ++i) {
    // Enough routes to grow the table past its first allocation.
    char pattern[32];
    snprintf(pattern, sizeof(pattern), "/r%zu/{x}", i);
    pcp_http_route_t route = {"GET", pattern, NULL, echo_handler, NULL, 0, 0};
    status = pcp_http_server_routes_add(server, &route, 1);
  }
  if (!status) {
    status = pcp_http_server_routes_add(server, routes, PCP_ARRAYSIZE(routes));
  }
  pcp_http_server_release(server);
  return status;
}

static void create_survives_every_allocation_failure(void** state) {
  PCP_UNUSED(state);
  setenv(API_TOKEN_ENV, API_TOKEN, 1);
  int64_t index = 0;
  for (;; ++index) {
    assert_true(index < 10000);
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_system(), index, true,
                                     &failing);
    pcp_allocator_counting_t counting;
    pcp_allocator_counting_initialize(pcp_allocator_failing(&failing),
                                      &counting);
    pcp_status_t status = exercise_create(pcp_allocator_counting(&counting));
    assert_int_equal(counting.live_bytes, 0);
    if (!status) {
      assert_int_equal(failing.failure_count, 0);
      break;
    }
    assert_int_equal(pcp_status_consume_code(status),
                     PCP_STATUS_RESOURCE_EXHAUSTED);
  }
  assert_true(index > 20);  // the sweep really covered the allocations
}

//===----------------------------------------------------------------------===//
// Routing
//===----------------------------------------------------------------------===//

static void routing_with_params_and_query(void** state) {
  fixture_t* f = *state;
  pcp_http_client_response_t response = get(f, "/v1/jobs/job-42?limit=10&flag");
  assert_int_equal(response.http_status, 200);
  json_t* body = body_json(&response);
  assert_string_equal(field(body, "route"), "/v1/jobs/{id}");
  assert_string_equal(field(body, "id"), "job-42");
  assert_string_equal(field(body, "limit"), "10");
  assert_string_equal(field(body, "flag"), "");
  assert_string_equal(field(body, "path"), "/v1/jobs/job-42");
  assert_string_equal(field(body, "method"), "GET");
  assert_contains(field(body, "remote"), "127.0.0.1:");
  json_decref(body);
  pcp_http_client_response_deinitialize(&response);

  // A literal segment beats a parameter in the same position.
  response = get(f, "/v1/jobs/special");
  body = body_json(&response);
  assert_string_equal(field(body, "route"), "/v1/jobs/special");
  json_decref(body);
  pcp_http_client_response_deinitialize(&response);

  // Exact route without parameters.
  response = get(f, "/v1/jobs");
  body = body_json(&response);
  assert_string_equal(field(body, "route"), "/v1/jobs");
  assert_true(json_is_null(json_object_get(body, "id")));
  json_decref(body);
  pcp_http_client_response_deinitialize(&response);

  // Nested parameter route, POST.
  response =
      send_request(f, "POST", "/v1/jobs/abc/cancel", NULL, NULL, 0, false);
  body = body_json(&response);
  assert_string_equal(field(body, "route"), "/v1/jobs/{id}/cancel");
  assert_string_equal(field(body, "id"), "abc");
  json_decref(body);
  pcp_http_client_response_deinitialize(&response);

  // Prefix route binds the rest of the path.
  response = get(f, "/static/css/site.css");
  body = body_json(&response);
  assert_string_equal(field(body, "route"), "/static/*");
  assert_string_equal(field(body, "rest"), "css/site.css");
  json_decref(body);
  pcp_http_client_response_deinitialize(&response);
  response = get(f, "/static");
  body = body_json(&response);
  assert_string_equal(field(body, "rest"), "");
  json_decref(body);
  pcp_http_client_response_deinitialize(&response);

  // Percent-encoded query values arrive decoded.
  response = get(f, "/v1/jobs?limit=a%20b");
  body = body_json(&response);
  assert_string_equal(field(body, "limit"), "a b");
  json_decref(body);
  pcp_http_client_response_deinitialize(&response);
}

static void head_is_served_by_get_routes(void** state) {
  fixture_t* f = *state;
  pcp_http_client_response_t response =
      send_request(f, "HEAD", "/healthz", NULL, NULL, 0, false);
  assert_int_equal(response.http_status, 200);
  assert_int_equal(response.body_length, 0);
  char length[32];
  assert_true(pcp_http_client_response_header(&response, "Content-Length",
                                              length, sizeof(length)));
  assert_string_equal(length, "15");  // {"status":"ok"}
  pcp_http_client_response_deinitialize(&response);
  response = send_request(f, "HEAD", "/json", NULL, NULL, 0, false);
  assert_int_equal(response.http_status, 405);
  pcp_http_client_response_deinitialize(&response);
}

static int get_url(pcp_http_client_t* client, const char* url,
                   pcp_http_client_response_t* out_response);

static pcp_status_t file_handler(void* user_data,
                                 const pcp_http_request_t* request,
                                 pcp_http_response_t* response) {
  PCP_UNUSED(request);
  return pcp_http_response_file_set(response, 200, "application/octet-stream",
                                    (const char*)user_data);
}

static void files_are_streamed(void** state) {
  fixture_t* f = *state;
  char path[] = "/tmp/pcp_http_file_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  size_t length = 300 * 1024 + 7;
  char* data = malloc(length);
  for (size_t i = 0; i < length; ++i) {
    data[i] = (char)(i * 131 % 251);
  }
  assert_int_equal(write(fd, data, length), (ssize_t)length);
  close(fd);
  pcp_http_server_options_t options = {0};
  options.name = "files";
  pcp_http_server_t* server = NULL;
  PCP_CHECK_OK(
      pcp_http_server_create(&options, pcp_allocator_system(), &server));
  const pcp_http_route_t routes[] = {
      {"GET", "/file", NULL, file_handler, path, 0, 0},
      {"GET", "/missing", NULL, file_handler, "/nonexistent/file", 0, 0},
      {"GET", "/dir", NULL, file_handler, "/tmp", 0, 0},
  };
  PCP_CHECK_OK(pcp_http_server_routes_add(server, routes, 3));
  PCP_CHECK_OK(pcp_http_server_start(server));
  char url[128];
  snprintf(url, sizeof(url), "http://127.0.0.1:%u/file",
           (unsigned)pcp_http_server_port(server));
  pcp_http_client_response_t response;
  assert_int_equal(get_url(f->client, url, &response), 200);
  assert_int_equal(response.body_length, length);
  assert_memory_equal(response.body, data, length);
  pcp_http_client_response_deinitialize(&response);
  snprintf(url, sizeof(url), "http://127.0.0.1:%u/missing",
           (unsigned)pcp_http_server_port(server));
  get_url(f->client, url, &response);
  assert_error_body(&response, 404, "NOT_FOUND");
  pcp_http_client_response_deinitialize(&response);
  snprintf(url, sizeof(url), "http://127.0.0.1:%u/dir",
           (unsigned)pcp_http_server_port(server));
  get_url(f->client, url, &response);
  assert_error_body(&response, 400, "INVALID_ARGUMENT");
  pcp_http_client_response_deinitialize(&response);
  PCP_CHECK_OK(pcp_http_server_stop(server, 1000));
  pcp_http_server_release(server);
  unlink(path);
  free(data);
}

static void request_ids_are_echoed_or_made(void** state) {
  fixture_t* f = *state;
  char url[128];
  snprintf(url, sizeof(url), "%s/nope", f->base_url);
  const char* headers[] = {"X-Request-Id: client-id_1.2", NULL};
  pcp_http_client_request_t request = {0};
  request.url = url;
  request.headers = headers;
  pcp_http_client_response_t response;
  PCP_CHECK_OK(pcp_http_client_send(f->client, &request, &response));
  char id[128];
  assert_true(pcp_http_client_response_header(&response, "X-Request-Id", id,
                                              sizeof(id)));
  assert_string_equal(id, "client-id_1.2");
  pcp_http_client_response_deinitialize(&response);
  // An unsafe id is replaced by one of ours; ours differ per request.
  const char* unsafe[] = {"X-Request-Id: a b\"c", NULL};
  request.headers = unsafe;
  char first[128];
  PCP_CHECK_OK(pcp_http_client_send(f->client, &request, &response));
  assert_true(pcp_http_client_response_header(&response, "X-Request-Id", first,
                                              sizeof(first)));
  assert_null(strchr(first, '"'));
  assert_non_null(strchr(first, '-'));
  pcp_http_client_response_deinitialize(&response);
  response = get(f, "/healthz");
  assert_true(pcp_http_client_response_header(&response, "X-Request-Id", id,
                                              sizeof(id)));
  assert_string_not_equal(id, first);
  pcp_http_client_response_deinitialize(&response);
}

static void not_found_and_method_not_allowed(void** state) {
  fixture_t* f = *state;
  const char* paths[] = {"/nope", "/v1/jobs/a/b/c", "/v1/jobs/", "/"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(paths); ++i) {
    pcp_http_client_response_t response = get(f, paths[i]);
    assert_error_body(&response, 404, "NOT_FOUND");
    pcp_http_client_response_deinitialize(&response);
  }
  pcp_http_client_response_t response =
      send_request(f, "PUT", "/v1/jobs/7", NULL, NULL, 0, false);
  assert_error_body(&response, 405, "METHOD_NOT_ALLOWED");
  char allow[128];
  assert_true(pcp_http_client_response_header(&response, "Allow", allow,
                                              sizeof(allow)));
  assert_string_equal(allow, "GET, DELETE");
  pcp_http_client_response_deinitialize(&response);
  response = send_request(f, "DELETE", "/healthz", NULL, NULL, 0, false);
  assert_error_body(&response, 405, "METHOD_NOT_ALLOWED");
  assert_true(pcp_http_client_response_header(&response, "Allow", allow,
                                              sizeof(allow)));
  assert_string_equal(allow, "GET");
  pcp_http_client_response_deinitialize(&response);
}

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

static void every_status_code_maps_to_json_error(void** state) {
  fixture_t* f = *state;
  for (int code = 1; code < PCP_STATUS_CODE_COUNT_; ++code) {
    const char* name = pcp_status_code_string((pcp_status_code_t)code);
    char path[64];
    snprintf(path, sizeof(path), "/status/%s", name);
    pcp_http_client_response_t response = get(f, path);
    assert_error_body(&response,
                      pcp_http_status_from_code((pcp_status_code_t)code), name);
    assert_contains(response.body, "asked for");
    if (code == PCP_STATUS_UNAUTHENTICATED) {
      char challenge[128];
      assert_true(pcp_http_client_response_header(
          &response, "WWW-Authenticate", challenge, sizeof(challenge)));
      assert_contains(challenge, "Bearer");
    }
    pcp_http_client_response_deinitialize(&response);
  }
  // OK from the same handler keeps its response.
  pcp_http_client_response_t response = get(f, "/status/OK");
  assert_int_equal(response.http_status, 200);
  assert_string_equal(response.body, "x");
  pcp_http_client_response_deinitialize(&response);
}

static void handler_without_response_gets_json_500(void** state) {
  fixture_t* f = *state;
  pcp_http_client_response_t response = get(f, "/silent");
  assert_error_body(&response, 500, "INTERNAL");
  assert_contains(response.body, "set no response");
  pcp_http_client_response_deinitialize(&response);
  // The connection is still good afterwards.
  response = get(f, "/healthz");
  assert_int_equal(response.http_status, 200);
  assert_int_equal(response.new_connection_count, 0);
  pcp_http_client_response_deinitialize(&response);
}

//===----------------------------------------------------------------------===//
// Limits
//===----------------------------------------------------------------------===//

static void body_limit_with_content_length(void** state) {
  fixture_t* f = *state;
  char body[2048];
  memset(body, 'x', sizeof(body));
  pcp_http_client_response_t response =
      send_request(f, "POST", "/v1/jobs", NULL, body, 1024, false);
  assert_int_equal(response.http_status, 200);
  json_t* json = body_json(&response);
  assert_int_equal(json_integer_value(json_object_get(json, "body_length")),
                   1024);
  json_decref(json);
  pcp_http_client_response_deinitialize(&response);
  response = send_request(f, "POST", "/v1/jobs", NULL, body, 1025, false);
  assert_error_body(&response, 413, "RESOURCE_EXHAUSTED");
  assert_contains(response.body, "1025 bytes exceeds the limit of 1024");
  pcp_http_client_response_deinitialize(&response);
  // The server default (1 MiB) on a route without its own cap.
  size_t big_length = (1u << 20) + 1;
  char* big = calloc(1, big_length);
  memset(big, ' ', big_length);
  response = send_request(f, "POST", "/json", NULL, big, big_length, false);
  assert_error_body(&response, 413, "RESOURCE_EXHAUSTED");
  pcp_http_client_response_deinitialize(&response);
  free(big);
}

static void body_limit_with_chunked_upload(void** state) {
  fixture_t* f = *state;
  char body[64 << 10];
  memset(body, 'y', sizeof(body));
  pcp_http_client_response_t response =
      send_request(f, "POST", "/v1/jobs", NULL, body, 1000, true);
  assert_int_equal(response.http_status, 200);
  json_t* json = body_json(&response);
  assert_int_equal(json_integer_value(json_object_get(json, "body_length")),
                   1000);
  json_decref(json);
  pcp_http_client_response_deinitialize(&response);
  response =
      send_request(f, "POST", "/v1/jobs", NULL, body, sizeof(body), true);
  assert_error_body(&response, 413, "RESOURCE_EXHAUSTED");
  assert_contains(response.body, "exceeds the limit of 1024");
  pcp_http_client_response_deinitialize(&response);
  // Still serving afterwards.
  response = get(f, "/healthz");
  assert_int_equal(response.http_status, 200);
  pcp_http_client_response_deinitialize(&response);
  // A sender that keeps streaming far past the limit gets the 413 while it
  // sends (written on the socket, since libmicrohttpd refuses a response
  // during an upload), then the close; others are unaffected.
  size_t huge_length = (size_t)PCP_HTTP_DEFAULT_MAX_BODY_BYTES * 20;
  char* huge = calloc(1, huge_length);
  char url[128];
  snprintf(url, sizeof(url), "%s/v1/jobs", f->base_url);
  pcp_http_client_request_t request = {0};
  request.method = "POST";
  request.url = url;
  request.body = huge;
  request.body_length = huge_length;
  request.chunked = true;
  PCP_CHECK_OK(pcp_http_client_send(f->client, &request, &response));
  assert_error_body(&response, 413, "RESOURCE_EXHAUSTED");
  assert_contains(response.body, "exceeds the limit of 1024");
  pcp_http_client_response_deinitialize(&response);
  free(huge);
  response = get(f, "/healthz");
  assert_int_equal(response.http_status, 200);
  pcp_http_client_response_deinitialize(&response);
}

static void bad_and_deep_json_get_400(void** state) {
  fixture_t* f = *state;
  const char* good = "{\"a\":[1,2,{\"b\":null}]}";
  pcp_http_client_response_t response =
      send_request(f, "POST", "/json", NULL, good, strlen(good), false);
  assert_int_equal(response.http_status, 201);
  assert_string_equal(response.body, "{\"got\":{\"a\":[1,2,{\"b\":null}]}}");
  pcp_http_client_response_deinitialize(&response);

  const char* bad[] = {"{\"a\":", "not json", "{\"a\":1,\"a\":2}"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(bad); ++i) {
    response =
        send_request(f, "POST", "/json", NULL, bad[i], strlen(bad[i]), false);
    assert_error_body(&response, 400, "INVALID_ARGUMENT");
    assert_contains(response.body, "invalid JSON");
    pcp_http_client_response_deinitialize(&response);
  }
  response = send_request(f, "POST", "/json", NULL, NULL, 0, false);
  assert_error_body(&response, 400, "INVALID_ARGUMENT");
  assert_contains(response.body, "empty");
  pcp_http_client_response_deinitialize(&response);

  // 64 levels pass, 65 do not (server default); 5 fail on a route capped
  // at 4.
  char deep[256];
  for (int levels = 64; levels <= 65; ++levels) {
    memset(deep, '[', (size_t)levels);
    memset(deep + levels, ']', (size_t)levels);
    response =
        send_request(f, "POST", "/json", NULL, deep, (size_t)levels * 2, false);
    if (levels == 64) {
      assert_int_equal(response.http_status, 201);
    } else {
      assert_error_body(&response, 400, "INVALID_ARGUMENT");
      assert_contains(response.body, "deeper than 64");
    }
    pcp_http_client_response_deinitialize(&response);
  }
  const char* five = "[[[[[1]]]]]";
  response =
      send_request(f, "POST", "/json/shallow", NULL, five, strlen(five), false);
  assert_error_body(&response, 400, "INVALID_ARGUMENT");
  assert_contains(response.body, "deeper than 4");
  pcp_http_client_response_deinitialize(&response);
}

static void url_and_header_limits(void** state) {
  fixture_t* f = *state;
  char path[8192 + 64];
  int n = snprintf(path, sizeof(path), "/v1/jobs?limit=");
  memset(path + n, 'a', PCP_HTTP_DEFAULT_MAX_URL_BYTES);
  path[n + PCP_HTTP_DEFAULT_MAX_URL_BYTES] = '\0';
  pcp_http_client_response_t response = get(f, path);
  assert_error_body(&response, 414, "RESOURCE_EXHAUSTED");
  pcp_http_client_response_deinitialize(&response);

  // Eight 9 KiB headers: 72 KiB in all, over the 64 KiB cap.
  enum { HEADER_COUNT = 8, VALUE_LENGTH = 9 * 1024 };
  char* headers[HEADER_COUNT + 1];
  for (int i = 0; i < HEADER_COUNT; ++i) {
    headers[i] = malloc(VALUE_LENGTH + 32);
    int prefix = snprintf(headers[i], 32, "X-Big-%d: ", i);
    memset(headers[i] + prefix, 'h', VALUE_LENGTH);
    headers[i][prefix + VALUE_LENGTH] = '\0';
  }
  headers[HEADER_COUNT] = NULL;
  char url[128];
  snprintf(url, sizeof(url), "%s/healthz", f->base_url);
  pcp_http_client_request_t request = {0};
  request.url = url;
  request.headers = (const char* const*)headers;
  PCP_CHECK_OK(pcp_http_client_send(f->client, &request, &response));
  assert_error_body(&response, 431, "RESOURCE_EXHAUSTED");
  pcp_http_client_response_deinitialize(&response);
  for (int i = 0; i < HEADER_COUNT; ++i) {
    free(headers[i]);
  }
}

//===----------------------------------------------------------------------===//
// Auth
//===----------------------------------------------------------------------===//

static void bearer_tokens_per_scope(void** state) {
  fixture_t* f = *state;
  char challenge[128];
  // Missing token.
  pcp_http_client_response_t response = get(f, "/v1/secure");
  assert_error_body(&response, 401, "UNAUTHENTICATED");
  assert_true(pcp_http_client_response_header(&response, "WWW-Authenticate",
                                              challenge, sizeof(challenge)));
  assert_contains(challenge, "Bearer");
  pcp_http_client_response_deinitialize(&response);
  // Wrong token.
  response =
      send_request(f, "GET", "/v1/secure", "api-secret-x", NULL, 0, false);
  assert_error_body(&response, 401, "UNAUTHENTICATED");
  assert_true(pcp_http_client_response_header(&response, "WWW-Authenticate",
                                              challenge, sizeof(challenge)));
  assert_contains(challenge, "invalid_token");
  pcp_http_client_response_deinitialize(&response);
  // A prefix of the right token is wrong too.
  response = send_request(f, "GET", "/v1/secure", "api-secret", NULL, 0, false);
  assert_error_body(&response, 401, "UNAUTHENTICATED");
  pcp_http_client_response_deinitialize(&response);
  // Token of another scope: 403.
  response =
      send_request(f, "GET", "/v1/secure", INTERNAL_TOKEN, NULL, 0, false);
  assert_error_body(&response, 403, "PERMISSION_DENIED");
  pcp_http_client_response_deinitialize(&response);
  // Right token, and the scheme is case-insensitive.
  response = send_request(f, "GET", "/v1/secure", API_TOKEN, NULL, 0, false);
  assert_int_equal(response.http_status, 200);
  pcp_http_client_response_deinitialize(&response);
  char url[128];
  snprintf(url, sizeof(url), "%s/v1/internal/x", f->base_url);
  const char* headers[] = {"Authorization: bearer " INTERNAL_TOKEN, NULL};
  pcp_http_client_request_t request = {0};
  request.url = url;
  request.headers = headers;
  PCP_CHECK_OK(pcp_http_client_send(f->client, &request, &response));
  assert_int_equal(response.http_status, 200);
  pcp_http_client_response_deinitialize(&response);
  // Another scheme is a missing bearer token.
  const char* basic[] = {"Authorization: Basic " API_TOKEN, NULL};
  snprintf(url, sizeof(url), "%s/v1/secure", f->base_url);
  request.headers = basic;
  PCP_CHECK_OK(pcp_http_client_send(f->client, &request, &response));
  assert_error_body(&response, 401, "UNAUTHENTICATED");
  assert_contains(response.body, "missing");
  pcp_http_client_response_deinitialize(&response);
  // A scope whose variable is unset fails closed, whatever the token.
  response = send_request(f, "GET", "/v1/federation/x", "", NULL, 0, false);
  assert_error_body(&response, 401, "UNAUTHENTICATED");
  pcp_http_client_response_deinitialize(&response);
  response =
      send_request(f, "GET", "/v1/federation/x", API_TOKEN, NULL, 0, false);
  assert_error_body(&response, 403, "PERMISSION_DENIED");
  pcp_http_client_response_deinitialize(&response);
  // Probes are open.
  response = get(f, "/healthz");
  assert_int_equal(response.http_status, 200);
  pcp_http_client_response_deinitialize(&response);
}

//===----------------------------------------------------------------------===//
// Connections
//===----------------------------------------------------------------------===//

static void keep_alive_reuses_one_connection(void** state) {
  fixture_t* f = *state;
  for (int i = 0; i < 5; ++i) {
    pcp_http_client_response_t response = get(f, "/v1/jobs/k");
    assert_int_equal(response.http_status, 200);
    assert_int_equal(response.new_connection_count, i == 0 ? 1 : 0);
    pcp_http_client_response_deinitialize(&response);
  }
  // Errors keep the connection too (no silent close).
  pcp_http_client_response_t response = get(f, "/nope");
  assert_int_equal(response.http_status, 404);
  pcp_http_client_response_deinitialize(&response);
  response = get(f, "/v1/jobs/k");
  assert_int_equal(response.new_connection_count, 0);
  pcp_http_client_response_deinitialize(&response);
}

// Starts a server with |options| (name "limits") and the probe routes.
static pcp_http_server_t* start_limits_server(
    fixture_t* f, pcp_http_server_options_t* options, char* base_url,
    size_t capacity) {
  options->name = "limits";
  options->registry = f->registry;
  pcp_http_server_t* server = NULL;
  PCP_CHECK_OK(
      pcp_http_server_create(options, pcp_allocator_system(), &server));
  PCP_CHECK_OK(pcp_http_server_probes_add(server, NULL, NULL));
  // A route that is not a probe (probes are exempt from connection limits).
  const pcp_http_route_t route = {
      "GET", "/limited", NULL, pcp_http_healthz_handler, NULL, 0, 0};
  PCP_CHECK_OK(pcp_http_server_routes_add(server, &route, 1));
  PCP_CHECK_OK(pcp_http_server_start(server));
  snprintf(base_url, capacity, "http://127.0.0.1:%u/limited",
           (unsigned)pcp_http_server_port(server));
  return server;
}

static int get_url(pcp_http_client_t* client, const char* url,
                   pcp_http_client_response_t* out_response) {
  pcp_http_client_request_t request = {0};
  request.url = url;
  PCP_CHECK_OK(pcp_http_client_send(client, &request, out_response));
  return out_response->http_status;
}

static void connection_limit_answers_503(void** state) {
  fixture_t* f = *state;
  pcp_http_server_options_t options = {0};
  options.max_connections = 2;
  char url[128];
  pcp_http_server_t* server =
      start_limits_server(f, &options, url, sizeof(url));
  pcp_http_client_t* clients[3];
  for (int i = 0; i < 3; ++i) {
    PCP_CHECK_OK(
        pcp_http_client_create(NULL, pcp_allocator_system(), &clients[i]));
  }
  pcp_http_client_response_t response;
  // Two keep-alive connections stay open...
  assert_int_equal(get_url(clients[0], url, &response), 200);
  pcp_http_client_response_deinitialize(&response);
  assert_int_equal(get_url(clients[1], url, &response), 200);
  pcp_http_client_response_deinitialize(&response);
  // ...so a third gets a JSON 503, not a silent close...
  get_url(clients[2], url, &response);
  assert_error_body(&response, 503, "UNAVAILABLE");
  char retry[16];
  assert_true(pcp_http_client_response_header(&response, "Retry-After", retry,
                                              sizeof(retry)));
  pcp_http_client_response_deinitialize(&response);
  // ...while the probes keep their reserved slots: never 503 for a count.
  char probe_url[128];
  snprintf(probe_url, sizeof(probe_url), "%.*s/healthz",
           (int)(strlen(url) - strlen("/limited")), url);
  assert_int_equal(get_url(clients[2], probe_url, &response), 200);
  pcp_http_client_response_deinitialize(&response);
  // Once one closes, the third is served.
  pcp_http_client_release(clients[0]);
  int http_status = 0;
  for (int i = 0; i < 100 && http_status != 200; ++i) {
    pcp_sleep_ms(10);
    http_status = get_url(clients[2], url, &response);
    pcp_http_client_response_deinitialize(&response);
  }
  assert_int_equal(http_status, 200);
  pcp_http_client_release(clients[1]);
  pcp_http_client_release(clients[2]);
  PCP_CHECK_OK(pcp_http_server_stop(server, 1000));
  pcp_http_server_release(server);
}

//===----------------------------------------------------------------------===//
// Raw sockets: what a well-behaved client cannot send
//===----------------------------------------------------------------------===//

static int64_t now_ms(void) {
  return pcp_clock_now_ns(pcp_clock_system()) / 1000000;
}

// strcasestr is a GNU extension.
static const char* find_nocase(const char* text, const char* needle) {
  size_t n = strlen(needle);
  for (; *text; ++text) {
    if (strncasecmp(text, needle, n) == 0) {
      return text;
    }
  }
  return NULL;
}

static int raw_connect(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  PCP_ASSERT(fd >= 0);
  struct sockaddr_in address = {0};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr*)&address, sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static bool raw_send(int fd, const void* data, size_t length) {
  const char* bytes = data;
  while (length > 0) {
    ssize_t n = send(fd, bytes, length, MSG_NOSIGNAL);
    if (n <= 0) {
      return false;
    }
    bytes += n;
    length -= (size_t)n;
  }
  return true;
}

// Reads one response (headers plus Content-Length bytes) or until the peer
// closes or |timeout_ms| passes. Returns the bytes read (|buffer| is
// NUL-terminated); *out_closed tells whether the peer closed.
static size_t raw_read_response(int fd, char* buffer, size_t capacity,
                                int timeout_ms, bool* out_closed) {
  size_t length = 0;
  *out_closed = false;
  int64_t deadline = now_ms() + timeout_ms;
  buffer[0] = '\0';
  while (length + 1 < capacity) {
    int64_t left = deadline - now_ms();
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (left <= 0 || poll(&p, 1, (int)left) <= 0) {
      break;
    }
    ssize_t n = recv(fd, buffer + length, capacity - 1 - length, 0);
    if (n <= 0) {
      *out_closed = true;
      break;
    }
    length += (size_t)n;
    buffer[length] = '\0';
    const char* end = strstr(buffer, "\r\n\r\n");
    const char* cl = find_nocase(buffer, "Content-Length:");
    if (end && cl && cl < end &&
        length >= (size_t)(end + 4 - buffer) + strtoull(cl + 15, NULL, 10)) {
      break;
    }
  }
  return length;
}

// Checks a raw response: status line, JSON content type, the one error
// schema with |code|.
static void assert_raw_json_error(const char* response, int http_status,
                                  const char* code) {
  int status = 0;
  if (sscanf(response, "HTTP/1.1 %d", &status) != 1 || status != http_status) {
    fail_msg("expected HTTP %d with a JSON body, got: %.300s", http_status,
             response);
  }
  assert_non_null(find_nocase(response, "Content-Type: application/json"));
  const char* body = strstr(response, "\r\n\r\n");
  assert_non_null(body);
  json_error_t error;
  json_t* root = json_loads(body + 4, 0, &error);
  if (!root) {
    fail_msg("body is not JSON: %.300s", body + 4);
  }
  json_t* inner = json_object_get(root, "error");
  assert_true(json_is_object(inner));
  assert_string_equal(json_string_value(json_object_get(inner, "code")), code);
  assert_true(json_is_string(json_object_get(inner, "message")));
  json_decref(root);
}

// Sends |request| on a fresh connection and returns the answer in |buffer|.
static void raw_exchange(uint16_t port, const char* request, size_t length,
                         char* buffer, size_t capacity, int timeout_ms) {
  int fd = raw_connect(port);
  assert_true(fd >= 0);
  raw_send(fd, request, length);  // the server may answer before the end
  bool closed = false;
  raw_read_response(fd, buffer, capacity, timeout_ms, &closed);
  close(fd);
}

static void gate_classify_checks_limits(void** state) {
  PCP_UNUSED(state);
  pcp_http_gate_limits_t limits = {
      .max_url_bytes = 32, .max_header_bytes = 128, .max_header_count = 4};
  pcp_http_gate_result_t r;
#define CLASSIFY(text) pcp_http_gate_classify((text), strlen(text), &limits, &r)
  assert_int_equal(CLASSIFY("GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
                   PCP_HTTP_GATE_PASS);
  assert_false(r.is_probe);
  assert_int_equal(CLASSIFY("GET /healthz?x=1 HTTP/1.1\r\n\r\n"),
                   PCP_HTTP_GATE_PASS);
  assert_true(r.is_probe);
  assert_int_equal(CLASSIFY("GET /readyz HTTP/1.1\n\n"), PCP_HTTP_GATE_PASS);
  assert_true(r.is_probe);
  assert_int_equal(CLASSIFY("GET /healthzz HTTP/1.1\r\n\r\n"),
                   PCP_HTTP_GATE_PASS);
  assert_false(r.is_probe);
  // Incomplete but within the limits: wait.
  assert_int_equal(CLASSIFY("GET / HTTP/1.1\r\nHost: a\r\n"),
                   PCP_HTTP_GATE_NEED_MORE);
  assert_int_equal(CLASSIFY("GET /abc"), PCP_HTTP_GATE_NEED_MORE);
  // URL limits: a complete long line, and a line that cannot end in time.
  assert_int_equal(
      CLASSIFY("GET /aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa HTTP/1.1\r\n"),
      PCP_HTTP_GATE_REJECT);
  assert_int_equal(r.http_status, 414);
  char line[256];
  memset(line, 'a', sizeof(line) - 1);
  line[sizeof(line) - 1] = '\0';
  memcpy(line, "GET /", 5);
  assert_int_equal(CLASSIFY(line), PCP_HTTP_GATE_REJECT);
  assert_int_equal(r.http_status, 414);
  // Header count and bytes (the latter even before the headers end).
  assert_int_equal(
      CLASSIFY(
          "GET / HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\nd: 4\r\ne: 5\r\n\r\n"),
      PCP_HTTP_GATE_REJECT);
  assert_int_equal(r.http_status, 431);
  char big[512];
  int n = snprintf(big, sizeof(big), "GET / HTTP/1.1\r\nX: ");
  memset(big + n, 'v', 200);
  big[n + 200] = '\0';
  assert_int_equal(CLASSIFY(big), PCP_HTTP_GATE_REJECT);
  assert_int_equal(r.http_status, 431);
  // Content-Length: what libmicrohttpd would answer with its own page.
  const char* bad_lengths[] = {"-1",   "18446744073709551616", "12a", "",
                               "0x10", "99999999999999999999"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(bad_lengths); ++i) {
    char request[128];
    snprintf(request, sizeof(request),
             "POST / HTTP/1.1\r\nContent-Length: %s\r\n\r\n", bad_lengths[i]);
    assert_int_equal(CLASSIFY(request), PCP_HTTP_GATE_REJECT);
    assert_int_equal(r.http_status, 400);
    assert_string_equal(r.code, "INVALID_ARGUMENT");
  }
  assert_int_equal(CLASSIFY("POST / HTTP/1.1\r\ncontent-length:  42 \r\n\r\n"),
                   PCP_HTTP_GATE_PASS);
  assert_int_equal(CLASSIFY("POST / HTTP/1.1\r\nContent-Length: 1\r\n"
                            "Content-Length: 1\r\n\r\n"),
                   PCP_HTTP_GATE_REJECT);
#undef CLASSIFY
}

// The errors libmicrohttpd used to answer itself (HTML, or nothing for a
// minute) are the JSON schema, at once.
static void protocol_errors_are_json_and_prompt(void** state) {
  fixture_t* f = *state;
  uint16_t port = pcp_http_server_port(f->server);
  size_t capacity = 1 << 20;
  char* request = malloc(capacity);
  char response[8192];

  // ~5,000 query parameters (about 44 KiB of URL): 414 within a second.
  int n = snprintf(request, capacity, "GET /v1/jobs?");
  for (int i = 0; i < 5000; ++i) {
    n += snprintf(request + n, capacity - (size_t)n, "p%d=%d&", i, i);
  }
  n += snprintf(request + n, capacity - (size_t)n,
                " HTTP/1.1\r\nHost: x\r\n\r\n");
  int64_t start = now_ms();
  raw_exchange(port, request, (size_t)n, response, sizeof(response), 5000);
  int64_t took = now_ms() - start;
  assert_raw_json_error(response, 414, "RESOURCE_EXHAUSTED");
  if (took > 1000) {
    fail_msg("414 took %lld ms", (long long)took);
  }

  // Within the URL's bytes but past PCP_HTTP_MAX_QUERY_PARAMS: 414 from
  // the gate; exactly at the cap, with 100 headers of 600 bytes (about the
  // largest head the limits admit), the request is served: it fits
  // libmicrohttpd's pool, which is sized for the cap.
  for (int params = PCP_HTTP_MAX_QUERY_PARAMS;
       params <= PCP_HTTP_MAX_QUERY_PARAMS + 1; ++params) {
    n = snprintf(request, capacity, "GET /healthz?");
    for (int i = 0; i < params; ++i) {
      n += snprintf(request + n, capacity - (size_t)n, "%sq%d=%d", i ? "&" : "",
                    i, i);
    }
    n +=
        snprintf(request + n, capacity - (size_t)n, " HTTP/1.1\r\nHost: x\r\n");
    for (int i = 0; i < 98; ++i) {
      n += snprintf(request + n, capacity - (size_t)n, "X-H-%02d: ", i);
      memset(request + n, 'v', 600);
      n += 600;
      n += snprintf(request + n, capacity - (size_t)n, "\r\n");
    }
    n += snprintf(request + n, capacity - (size_t)n, "\r\n");
    raw_exchange(port, request, (size_t)n, response, sizeof(response), 5000);
    if (params > PCP_HTTP_MAX_QUERY_PARAMS) {
      assert_raw_json_error(response, 414, "RESOURCE_EXHAUSTED");
    } else if (strncmp(response, "HTTP/1.1 200", 12) != 0) {
      fail_msg("a head at the limits was not served: %.200s", response);
    }
  }

  // 2,000 headers: 431.
  n = snprintf(request, capacity, "GET /v1/jobs HTTP/1.1\r\nHost: x\r\n");
  for (int i = 0; i < 2000; ++i) {
    n += snprintf(request + n, capacity - (size_t)n, "X-H-%d: v\r\n", i);
  }
  n += snprintf(request + n, capacity - (size_t)n, "\r\n");
  raw_exchange(port, request, (size_t)n, response, sizeof(response), 5000);
  assert_raw_json_error(response, 431, "RESOURCE_EXHAUSTED");

  // One header far larger than the pool libmicrohttpd parses in: 431.
  n = snprintf(request, capacity, "GET /v1/jobs HTTP/1.1\r\nX-Big: ");
  memset(request + n, 'b', 512 << 10);
  n += 512 << 10;
  n += snprintf(request + n, capacity - (size_t)n, "\r\n\r\n");
  raw_exchange(port, request, (size_t)n, response, sizeof(response), 5000);
  assert_raw_json_error(response, 431, "RESOURCE_EXHAUSTED");

  // Content-Length of -1 and of 2^64: 400.
  const char* lengths[] = {"-1", "18446744073709551616"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(lengths); ++i) {
    n = snprintf(request, capacity,
                 "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: "
                 "%s\r\n\r\n{}",
                 lengths[i]);
    raw_exchange(port, request, (size_t)n, response, sizeof(response), 5000);
    assert_raw_json_error(response, 400, "INVALID_ARGUMENT");
  }

  // The server still serves a normal request on a fresh connection.
  n = snprintf(request, capacity, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  raw_exchange(port, request, (size_t)n, response, sizeof(response), 5000);
  assert_non_null(strstr(response, "HTTP/1.1 200"));
  free(request);
}

// A client that trickles its headers (a byte every 50 ms, so an idle
// timeout never fires) is answered 408 and closed at the header deadline.
static void slow_headers_are_cut_at_the_deadline(void** state) {
  fixture_t* f = *state;
  pcp_http_server_options_t options = {0};
  options.header_timeout_ms = 500;
  char url[128];
  pcp_http_server_t* server =
      start_limits_server(f, &options, url, sizeof(url));
  int fd = raw_connect(pcp_http_server_port(server));
  assert_true(fd >= 0);
  const char* head = "GET /limited HTTP/1.1\r\nX-Slow: ";
  assert_true(raw_send(fd, head, strlen(head)));
  int64_t start = now_ms();
  char response[4096] = "";
  size_t length = 0;
  bool closed = false;
  // Poll the observable outcome (an answer and a close) with a deadline.
  while (!closed && now_ms() - start < 5000) {
    raw_send(fd, "a", 1);  // fails once the server has closed
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 50) > 0) {
      ssize_t n = recv(fd, response + length, sizeof(response) - 1 - length, 0);
      if (n <= 0) {
        closed = true;
      } else {
        length += (size_t)n;
        response[length] = '\0';
      }
    }
  }
  int64_t took = now_ms() - start;
  close(fd);
  assert_true(closed);
  assert_raw_json_error(response, 408, "DEADLINE_EXCEEDED");
  // Not before the deadline; well before the 60 s idle timeout.
  if (took < 400 || took > 4000) {
    fail_msg("cut after %lld ms; the deadline is 500 ms", (long long)took);
  }
  PCP_CHECK_OK(pcp_http_server_stop(server, 1000));
  pcp_http_server_release(server);
}

// ~1,100 connections from one address that never finish their headers:
// the probes and other requests from the same address are still answered
// at once (the flood waits in the gate; each newcomer evicts its oldest).
static void header_flood_leaves_probes_answerable(void** state) {
  fixture_t* f = *state;
  pcp_http_server_options_t options = {0};
  char url[128];
  pcp_http_server_t* server =
      start_limits_server(f, &options, url, sizeof(url));
  uint16_t port = pcp_http_server_port(server);
  enum { FLOOD = 1100 };
  int* fds = malloc(sizeof(int) * FLOOD);
  int opened = 0;
  for (int i = 0; i < FLOOD; ++i) {
    fds[i] = raw_connect(port);
    if (fds[i] >= 0) {
      ++opened;
      raw_send(fds[i], "GET /limited HTTP/1.1\r\n", 23);
    }
  }
  assert_int_equal(opened, FLOOD);
  char response[4096];
  const char* probe = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  int64_t start = now_ms();
  raw_exchange(port, probe, strlen(probe), response, sizeof(response), 5000);
  int64_t took = now_ms() - start;
  if (strncmp(response, "HTTP/1.1 200", 12) != 0 || took > 1000) {
    fail_msg("/healthz under the flood: %lld ms, %.200s", (long long)took,
             response);
  }
  // A route that is not a probe, through libcurl, from the same address.
  pcp_http_client_response_t answer;
  assert_int_equal(get_url(f->client, url, &answer), 200);
  pcp_http_client_response_deinitialize(&answer);
  // Every flood connection past the 64 a client may have waiting was
  // evicted with a 408, and counted.
  answer = get(f, "/metrics");
  const char* kSeries =
      "pcp_http_gate_answers_total{server=\"limits\",status=\"408\"} ";
  const char* line = strstr(answer.body, kSeries);
  if (!line) {
    fail_msg("no %s in /metrics", kSeries);
  }
  double evicted = strtod(line + strlen(kSeries), NULL);
  if (evicted < FLOOD - PCP_HTTP_GATE_MAX_WAITING_PER_CLIENT) {
    fail_msg("%.0f evictions counted; expected at least %d", evicted,
             FLOOD - PCP_HTTP_GATE_MAX_WAITING_PER_CLIENT);
  }
  pcp_http_client_response_deinitialize(&answer);
  for (int i = 0; i < FLOOD; ++i) {
    if (fds[i] >= 0) {
      close(fds[i]);
    }
  }
  free(fds);
  PCP_CHECK_OK(pcp_http_server_stop(server, 1000));
  pcp_http_server_release(server);
}

// Past the per-client cap of open connections a request gets a JSON 429;
// the probes are exempt.
static void per_client_cap_answers_429(void** state) {
  fixture_t* f = *state;
  pcp_http_server_options_t options = {0};
  options.max_connections_per_client = 2;
  char url[128];
  pcp_http_server_t* server =
      start_limits_server(f, &options, url, sizeof(url));
  pcp_http_client_t* clients[3];
  for (int i = 0; i < 3; ++i) {
    PCP_CHECK_OK(
        pcp_http_client_create(NULL, pcp_allocator_system(), &clients[i]));
  }
  pcp_http_client_response_t response;
  assert_int_equal(get_url(clients[0], url, &response), 200);
  pcp_http_client_response_deinitialize(&response);
  assert_int_equal(get_url(clients[1], url, &response), 200);
  pcp_http_client_response_deinitialize(&response);
  get_url(clients[2], url, &response);
  assert_error_body(&response, 429, "RESOURCE_EXHAUSTED");
  pcp_http_client_response_deinitialize(&response);
  char probe_url[128];
  snprintf(probe_url, sizeof(probe_url), "%.*s/healthz",
           (int)(strlen(url) - strlen("/limited")), url);
  assert_int_equal(get_url(clients[2], probe_url, &response), 200);
  pcp_http_client_response_deinitialize(&response);
  for (int i = 0; i < 3; ++i) {
    pcp_http_client_release(clients[i]);
  }
  PCP_CHECK_OK(pcp_http_server_stop(server, 1000));
  pcp_http_server_release(server);
}

static void idle_connections_time_out(void** state) {
  fixture_t* f = *state;
  pcp_http_server_options_t options = {0};
  options.connection_timeout_s = 1;
  char url[128];
  pcp_http_server_t* server =
      start_limits_server(f, &options, url, sizeof(url));
  pcp_http_client_response_t response;
  assert_int_equal(get_url(f->client, url, &response), 200);
  assert_int_equal(response.new_connection_count, 1);
  pcp_http_client_response_deinitialize(&response);
  assert_int_equal(get_url(f->client, url, &response), 200);
  assert_int_equal(response.new_connection_count, 0);
  pcp_http_client_response_deinitialize(&response);
  pcp_sleep_ms(2200);  // past the 1 s idle timeout, with slack
  assert_int_equal(get_url(f->client, url, &response), 200);
  assert_int_equal(response.new_connection_count, 1);
  pcp_http_client_response_deinitialize(&response);
  PCP_CHECK_OK(pcp_http_server_stop(server, 1000));
  pcp_http_server_release(server);
}

typedef struct slow_call_t {
  fixture_t* fixture;
  pcp_http_client_t* client;
  int http_status;
  char body[32];
} slow_call_t;

static void* slow_call_main(void* arg) {
  slow_call_t* call = arg;
  char url[128];
  snprintf(url, sizeof(url), "%s/slow", call->fixture->base_url);
  pcp_http_client_request_t request = {0};
  request.url = url;
  pcp_http_client_response_t response;
  pcp_status_t status = pcp_http_client_send(call->client, &request, &response);
  if (status) {
    call->http_status = -1;
    pcp_status_ignore(status);
    return NULL;
  }
  call->http_status = response.http_status;
  snprintf(call->body, sizeof(call->body), "%s", response.body);
  pcp_http_client_response_deinitialize(&response);
  return NULL;
}

// Waits until the slow handler is running (the in-flight count alone could
// still include an earlier request whose completion is being reported).
static void wait_for_slow_handler(fixture_t* f) {
  for (int i = 0; i < 1000 && atomic_load(&f->slow.entered) == 0; ++i) {
    pcp_sleep_ms(2);
  }
  assert_int_equal(atomic_load(&f->slow.entered), 1);
  assert_true(pcp_http_server_inflight_count(f->server) > 0);
}

// A handler still working on a request sees its client close the
// connection (and not before).
static void client_gone_seen_by_a_blocked_handler(void** state) {
  fixture_t* f = *state;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in address = {
      .sin_family = AF_INET,
      .sin_port = htons(pcp_http_server_port(f->server))};
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(
      connect(fd, (const struct sockaddr*)&address, sizeof(address)), 0);
  static const char kRequest[] =
      "GET /watch HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  assert_int_equal(send(fd, kRequest, sizeof(kRequest) - 1, 0),
                   (ssize_t)(sizeof(kRequest) - 1));
  for (int i = 0; i < 1000 && !atomic_load(&f->watch.entered); ++i) {
    pcp_sleep_ms(2);
  }
  assert_true(atomic_load(&f->watch.entered));
  // Connected: the handler keeps seeing the client. Wait for five polls
  // (not a fixed 100 ms, which a loaded machine may not fill), none of
  // which may report the client gone.
  for (int i = 0; i < 5000 && atomic_load(&f->watch.alive_polls) < 5 &&
                  atomic_load(&f->watch.outcome) == 0;
       ++i) {
    pcp_sleep_ms(2);
  }
  assert_int_equal(atomic_load(&f->watch.outcome), 0);
  assert_true(atomic_load(&f->watch.alive_polls) >= 5);
  close(fd);
  for (int i = 0; i < 1000 && atomic_load(&f->watch.outcome) == 0; ++i) {
    pcp_sleep_ms(2);
  }
  assert_int_equal(atomic_load(&f->watch.outcome), 1);
}

static void graceful_stop_finishes_inflight_requests(void** state) {
  fixture_t* f = *state;
  // An idle keep-alive connection must not hold the stop up.
  pcp_http_client_response_t response = get(f, "/healthz");
  assert_int_equal(response.http_status, 200);
  pcp_http_client_response_deinitialize(&response);

  slow_call_t call = {.fixture = f};
  PCP_CHECK_OK(
      pcp_http_client_create(NULL, pcp_allocator_system(), &call.client));
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, slow_call_main, &call), 0);
  wait_for_slow_handler(f);
  PCP_CHECK_OK(pcp_http_server_stop(f->server, 5000));
  pthread_join(thread, NULL);
  assert_int_equal(call.http_status, 200);
  assert_string_equal(call.body, "done");
  assert_int_equal(pcp_http_server_port(f->server), 0);
  // Nothing listens any more.
  char url[128];
  snprintf(url, sizeof(url), "%s/healthz", f->base_url);
  pcp_http_client_request_t request = {0};
  request.url = url;
  assert_status(pcp_http_client_send(call.client, &request, &response),
                PCP_STATUS_UNAVAILABLE, "");
  pcp_http_client_release(call.client);
  PCP_CHECK_OK(pcp_http_server_stop(f->server, 0));  // idempotent
}

static void stop_deadline_cuts_off_slow_requests(void** state) {
  fixture_t* f = *state;
  f->slow.delay_ms = 1500;
  slow_call_t call = {.fixture = f};
  PCP_CHECK_OK(
      pcp_http_client_create(NULL, pcp_allocator_system(), &call.client));
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, slow_call_main, &call), 0);
  wait_for_slow_handler(f);
  assert_status(pcp_http_server_stop(f->server, 100),
                PCP_STATUS_DEADLINE_EXCEEDED, "in flight");
  pthread_join(thread, NULL);
  pcp_http_client_release(call.client);
}

//===----------------------------------------------------------------------===//
// Server-sent events
//===----------------------------------------------------------------------===//

typedef struct stream_call_t {
  const char* url;
  const char* last_event_id;  // NULL: none
  int64_t timeout_ms;
  pcp_status_code_t code;
  pcp_http_client_response_t response;
} stream_call_t;

static void* stream_call_main(void* arg) {
  stream_call_t* call = arg;
  pcp_http_client_options_t options = {0};
  options.timeout_ms = call->timeout_ms;
  pcp_http_client_t* client = NULL;
  PCP_CHECK_OK(
      pcp_http_client_create(&options, pcp_allocator_system(), &client));
  char header[64];
  snprintf(header, sizeof(header), "Last-Event-ID: %s",
           call->last_event_id ? call->last_event_id : "");
  const char* headers[] = {header, NULL};
  pcp_http_client_request_t request = {0};
  request.url = call->url;
  request.headers = call->last_event_id ? headers : NULL;
  call->code = pcp_status_consume_code(
      pcp_http_client_send(client, &request, &call->response));
  pcp_http_client_release(client);
  return NULL;
}

// Waits for the events handler to hand over its stream; takes it.
static pcp_http_sse_stream_t* take_stream(fixture_t* f) {
  pcp_http_sse_stream_t* stream = NULL;
  for (int i = 0; i < 1000 && !stream; ++i) {
    stream = atomic_exchange(&f->sse.stream, NULL);
    if (!stream) {
      pcp_sleep_ms(2);
    }
  }
  assert_non_null(stream);
  return stream;
}

static void sse_stream_delivers_events(void** state) {
  fixture_t* f = *state;
  char url[128];
  snprintf(url, sizeof(url), "%s/events", f->base_url);
  stream_call_t call = {.url = url, .last_event_id = "7", .timeout_ms = 10000};
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, stream_call_main, &call), 0);
  pcp_http_sse_stream_t* stream = take_stream(f);
  pcp_sleep_ms(50);  // let the connection go idle (suspended) first
  PCP_CHECK_OK(pcp_http_sse_stream_send(stream, "8", "job", "line1\nline2"));
  PCP_CHECK_OK(pcp_http_sse_stream_comment(stream, "heartbeat"));
  PCP_CHECK_OK(pcp_http_sse_stream_send(stream, "9", NULL, "x"));
  assert_status(pcp_http_sse_stream_send(stream, "1\n2", NULL, "x"),
                PCP_STATUS_INVALID_ARGUMENT, "one line");
  assert_true(pcp_http_sse_stream_is_open(stream));
  pcp_http_sse_stream_close(stream);
  assert_false(pcp_http_sse_stream_is_open(stream));
  assert_status(pcp_http_sse_stream_send(stream, NULL, NULL, "late"),
                PCP_STATUS_UNAVAILABLE, "closed");
  pthread_join(thread, NULL);
  pcp_http_sse_stream_release(stream);
  assert_int_equal(call.code, PCP_STATUS_OK);
  assert_int_equal(call.response.http_status, 200);
  char content_type[64];
  assert_true(pcp_http_client_response_header(
      &call.response, "Content-Type", content_type, sizeof(content_type)));
  assert_string_equal(content_type, "text/event-stream");
  assert_string_equal(call.response.body,
                      "id: 0\nevent: hello\ndata: 7\n\n"
                      "id: 8\nevent: job\ndata: line1\ndata: line2\n\n"
                      ": heartbeat\n\n"
                      "id: 9\ndata: x\n\n");
  pcp_http_client_response_deinitialize(&call.response);
  // The server still answers plain requests afterwards.
  pcp_http_client_response_t response = get(f, "/healthz");
  assert_int_equal(response.http_status, 200);
  pcp_http_client_response_deinitialize(&response);
}

static void sse_queue_is_bounded(void** state) {
  fixture_t* f = *state;
  f->sse.max_queued_bytes = 100;
  pcp_http_client_response_t response = get(f, "/events?fill");
  assert_int_equal(atomic_load(&f->sse.fill_result),
                   PCP_STATUS_RESOURCE_EXHAUSTED);
  // What fit in the queue was still delivered: 100 bytes of 18-byte events.
  assert_int_equal(response.http_status, 200);
  assert_int_equal(response.body_length, 5 * strlen("data: 0123456789\n\n"));
  pcp_http_client_response_deinitialize(&response);
}

static void sse_notices_a_client_that_left(void** state) {
  fixture_t* f = *state;
  char url[128];
  snprintf(url, sizeof(url), "%s/events", f->base_url);
  stream_call_t call = {.url = url, .timeout_ms = 300};
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, stream_call_main, &call), 0);
  pcp_http_sse_stream_t* stream = take_stream(f);
  pthread_join(thread, NULL);  // the client gives up after 300 ms
  assert_int_equal(call.code, PCP_STATUS_DEADLINE_EXCEEDED);
  // Heartbeats find out: a write to the closed socket fails and the
  // server drops the stream.
  pcp_status_code_t code = PCP_STATUS_OK;
  for (int i = 0; i < 200 && code == PCP_STATUS_OK; ++i) {
    code = pcp_status_consume_code(
        pcp_http_sse_stream_comment(stream, "heartbeat"));
    pcp_sleep_ms(10);
  }
  assert_int_equal(code, PCP_STATUS_UNAVAILABLE);
  assert_false(pcp_http_sse_stream_is_open(stream));
  pcp_http_sse_stream_release(stream);
}

static void stop_ends_open_streams(void** state) {
  fixture_t* f = *state;
  char url[128];
  snprintf(url, sizeof(url), "%s/events", f->base_url);
  stream_call_t call = {.url = url, .timeout_ms = 10000};
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, stream_call_main, &call), 0);
  pcp_http_sse_stream_t* stream = take_stream(f);
  PCP_CHECK_OK(pcp_http_sse_stream_send(stream, "1", NULL, "before stop"));
  pcp_sleep_ms(50);
  int64_t start_ns = pcp_clock_now_ns(pcp_clock_system());
  PCP_CHECK_OK(pcp_http_server_stop(f->server, 5000));
  int64_t stop_ms = (pcp_clock_now_ns(pcp_clock_system()) - start_ns) / 1000000;
  assert_true(stop_ms < 2000);  // the stream ended; no wait for the deadline
  pthread_join(thread, NULL);
  assert_int_equal(call.code, PCP_STATUS_OK);
  assert_string_equal(call.response.body,
                      "id: 0\nevent: hello\ndata: start\n\n"
                      "id: 1\ndata: before stop\n\n");
  pcp_http_client_response_deinitialize(&call.response);
  assert_false(pcp_http_sse_stream_is_open(stream));
  pcp_http_sse_stream_release(stream);
}

// pcp_http_client_stream + the SSE parser against the server's own writer:
// events arrive while the stream is open (not at its end), and a stop from
// the client drops the connection so the server notices at its next write.
typedef struct live_call_t {
  const char* url;
  pcp_http_client_t* client;
  _Atomic int events;
  _Atomic bool stop;
  pcp_http_sse_parser_t parser;
  char last_data[64];
  int http_status;
  bool head_is_sse;
  pcp_status_code_t code;
} live_call_t;

static pcp_status_t live_on_event(void* user_data,
                                  const pcp_http_sse_event_t* event) {
  live_call_t* call = user_data;
  snprintf(call->last_data, sizeof(call->last_data), "%s:%s", event->type,
           event->data);
  atomic_fetch_add(&call->events, 1);
  return pcp_ok_status();
}

static bool live_on_head(void* user_data, int http_status,
                         const char* headers) {
  live_call_t* call = user_data;
  call->head_is_sse = strstr(headers, "text/event-stream") != NULL;
  return http_status == 200;
}

static bool live_should_stop(void* user_data) {
  live_call_t* call = user_data;
  return atomic_load(&call->stop);
}

static bool live_on_body(void* user_data, const char* data, size_t length) {
  live_call_t* call = user_data;
  pcp_status_t status = pcp_http_sse_parser_feed(&call->parser, data, length);
  bool ok = status == NULL;
  pcp_status_ignore(status);
  return ok;
}

static void* live_call_main(void* arg) {
  live_call_t* call = arg;
  pcp_http_client_request_t request = {0};
  request.url = call->url;
  pcp_http_client_stream_t stream = {
      .on_head = live_on_head,
      .on_body = live_on_body,
      .should_stop = live_should_stop,
      .user_data = call,
      .idle_timeout_ms = 10000,
  };
  call->code = pcp_status_consume_code(pcp_http_client_stream(
      call->client, &request, &stream, &call->http_status));
  return NULL;
}

static void wait_events(live_call_t* call, int count) {
  for (int i = 0; i < 1000 && atomic_load(&call->events) < count; ++i) {
    pcp_sleep_ms(5);
  }
  assert_int_equal(atomic_load(&call->events), count);
}

static void client_stream_reads_events_live(void** state) {
  fixture_t* f = *state;
  char url[128];
  snprintf(url, sizeof(url), "%s/events", f->base_url);
  live_call_t call = {.url = url, .client = f->client};
  pcp_http_sse_parser_initialize(0, 0, live_on_event, &call, &call.parser);
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, live_call_main, &call), 0);
  pcp_http_sse_stream_t* stream = take_stream(f);
  wait_events(&call, 1);  // the greeting, while the stream stays open
  assert_string_equal(call.last_data, "hello:start");
  PCP_CHECK_OK(pcp_http_sse_stream_send(stream, "1", "delta", "a\nb"));
  wait_events(&call, 2);
  assert_string_equal(call.last_data, "delta:a\nb");
  assert_true(pcp_http_sse_stream_is_open(stream));
  atomic_store(&call.stop, true);
  pthread_join(thread, NULL);
  assert_int_equal(call.code, PCP_STATUS_CANCELLED);
  assert_int_equal(call.http_status, 200);
  assert_true(call.head_is_sse);
  // The connection is gone: a heartbeat or two finds out.
  pcp_status_code_t code = PCP_STATUS_OK;
  for (int i = 0; i < 200 && code == PCP_STATUS_OK; ++i) {
    code = pcp_status_consume_code(
        pcp_http_sse_stream_comment(stream, "heartbeat"));
    pcp_sleep_ms(10);
  }
  assert_int_equal(code, PCP_STATUS_UNAVAILABLE);
  pcp_http_sse_stream_release(stream);
  pcp_http_sse_parser_deinitialize(&call.parser);
  // The same client serves the next request on a fresh handle.
  pcp_http_client_response_t response = get(f, "/healthz");
  assert_int_equal(response.http_status, 200);
  pcp_http_client_response_deinitialize(&response);
}

//===----------------------------------------------------------------------===//
// Probes and metrics
//===----------------------------------------------------------------------===//

static void healthz_and_readyz(void** state) {
  fixture_t* f = *state;
  pcp_http_client_response_t response = get(f, "/healthz");
  assert_int_equal(response.http_status, 200);
  assert_string_equal(response.body, "{\"status\":\"ok\"}");
  pcp_http_client_response_deinitialize(&response);

  response = get(f, "/readyz");
  assert_int_equal(response.http_status, 503);
  assert_string_equal(response.body,
                      "{\"ready\":false,\"missing\":[\"fabric listener\"]}");
  pcp_http_client_response_deinitialize(&response);
  atomic_store(&f->ready_state.ready, true);
  response = get(f, "/readyz");
  assert_int_equal(response.http_status, 200);
  assert_string_equal(response.body, "{\"ready\":true,\"missing\":[]}");
  pcp_http_client_response_deinitialize(&response);
}

static void metrics_render_and_pass_promtool(void** state) {
  fixture_t* f = *state;
  pcp_http_client_response_t response = get(f, "/v1/jobs/m1");
  pcp_http_client_response_deinitialize(&response);
  response = get(f, "/v1/jobs/m2");
  pcp_http_client_response_deinitialize(&response);
  response = get(f, "/nope/at/all");
  pcp_http_client_response_deinitialize(&response);
  response = get(f, "/status/INTERNAL");
  pcp_http_client_response_deinitialize(&response);
  response = send_request(f, "BREW", "/v1/jobs", NULL, NULL, 0, false);
  pcp_http_client_response_deinitialize(&response);
  response = send_request(f, "PATCH", "/any", NULL, NULL, 0, false);
  assert_int_equal(response.http_status, 200);
  pcp_http_client_response_deinitialize(&response);

  response = get(f, "/metrics");
  assert_int_equal(response.http_status, 200);
  char content_type[128];
  assert_true(pcp_http_client_response_header(
      &response, "Content-Type", content_type, sizeof(content_type)));
  assert_contains(content_type, "text/plain; version=0.0.4");
  const char* text = response.body;
  assert_contains(text,
                  "pcp_http_requests_total{server=\"test\",route=\"/v1/jobs/"
                  "{id}\",method=\"GET\",status_class=\"2xx\"} 2");
  assert_contains(text,
                  "pcp_http_requests_total{server=\"test\",route=\"unmatched\","
                  "method=\"GET\",status_class=\"4xx\"} 1");
  assert_contains(text,
                  "pcp_http_requests_total{server=\"test\",route=\"/status/"
                  "{code}\",method=\"GET\",status_class=\"5xx\"} 1");
  assert_contains(text, "method=\"OTHER\",status_class=\"4xx\"");
  assert_contains(text,
                  "pcp_http_requests_total{server=\"test\",route=\"/any\","
                  "method=\"PATCH\",status_class=\"2xx\"} 1");
  assert_contains(text,
                  "pcp_http_request_duration_seconds_bucket{server="
                  "\"test\",route=\"/v1/jobs/{id}\"");
  assert_contains(text, "pcp_http_response_body_bytes_total{server=\"test\"");
  assert_contains(text, "pcp_http_connections{server=\"test\"} 1");
  // The raw paths never become label values.
  assert_null(strstr(text, "m1"));
  assert_null(strstr(text, "/nope"));

  int found = system("command -v promtool >/dev/null 2>&1");
  if (found != 0) {
    fail_msg(
        "promtool not found: run tools/setup/setup.sh (package "
        "'prometheus')");
  }
  char path[] = "/tmp/pcp_http_metrics_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, response.body_length),
                   (ssize_t)response.body_length);
  close(fd);
  char command[256];
  snprintf(command, sizeof(command), "promtool check metrics < %s", path);
  int rc = system(command);
  unlink(path);
  if (rc != 0) {
    fail_msg("promtool check metrics failed on:\n%s", text);
  }
  pcp_http_client_response_deinitialize(&response);
}

static void two_servers_share_one_registry(void** state) {
  fixture_t* f = *state;
  pcp_http_server_options_t options = {0};
  options.name = "second";
  options.registry = f->registry;
  pcp_http_server_t* server = NULL;
  PCP_CHECK_OK(
      pcp_http_server_create(&options, pcp_allocator_system(), &server));
  pcp_http_route_t route = {"GET", "/healthz", NULL, pcp_http_healthz_handler,
                            NULL,  0,          0};
  PCP_CHECK_OK(pcp_http_server_routes_add(server, &route, 1));
  PCP_CHECK_OK(pcp_http_server_start(server));
  char url[128];
  snprintf(url, sizeof(url), "http://127.0.0.1:%u/healthz",
           (unsigned)pcp_http_server_port(server));
  pcp_http_client_request_t request = {0};
  request.url = url;
  pcp_http_client_response_t response;
  PCP_CHECK_OK(pcp_http_client_send(f->client, &request, &response));
  assert_int_equal(response.http_status, 200);
  pcp_http_client_response_deinitialize(&response);
  PCP_CHECK_OK(pcp_http_server_stop(server, 1000));
  pcp_http_server_release(server);
  response = get(f, "/metrics");
  assert_contains(response.body,
                  "pcp_http_requests_total{server=\"second\",route="
                  "\"/healthz\",method=\"GET\",status_class=\"2xx\"} 1");
  pcp_http_client_response_deinitialize(&response);
}

//===----------------------------------------------------------------------===//
// TLS
//===----------------------------------------------------------------------===//

static int setup_tls(void** state) {
  fixture_t* f = calloc(1, sizeof(*f));
  f->slow.delay_ms = 300;
  *state = f;
  snprintf(f->tls_dir, sizeof(f->tls_dir), "/tmp/pcp_http_tls_XXXXXX");
  if (!mkdtemp(f->tls_dir)) {
    return -1;
  }
  char command[1024];
  snprintf(command, sizeof(command),
           "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
           "-nodes -days 1 -subj /CN=localhost "
           "-addext subjectAltName=IP:127.0.0.1,DNS:localhost "
           "-keyout %s/key.pem -out %s/cert.pem >/dev/null 2>&1",
           f->tls_dir, f->tls_dir);
  if (system(command) != 0) {
    fprintf(stderr, "openssl req failed (package openssl)\n");
    return -1;
  }
  char cert[128];
  char key[128];
  snprintf(cert, sizeof(cert), "%s/cert.pem", f->tls_dir);
  snprintf(key, sizeof(key), "%s/key.pem", f->tls_dir);
  return start_server(f, cert, key);
}

static void tls_round_trip(void** state) {
  fixture_t* f = *state;
  assert_contains(f->base_url, "https://");
  for (int i = 0; i < 3; ++i) {
    pcp_http_client_response_t response = get(f, "/healthz");
    assert_int_equal(response.http_status, 200);
    assert_string_equal(response.body, "{\"status\":\"ok\"}");
    assert_int_equal(response.new_connection_count, i == 0 ? 1 : 0);
    pcp_http_client_response_deinitialize(&response);
  }
  pcp_http_client_response_t response =
      send_request(f, "GET", "/v1/secure", API_TOKEN, NULL, 0, false);
  assert_int_equal(response.http_status, 200);
  pcp_http_client_response_deinitialize(&response);
  // A client that does not trust the certificate fails the handshake.
  pcp_http_client_t* untrusting = NULL;
  PCP_CHECK_OK(
      pcp_http_client_create(NULL, pcp_allocator_system(), &untrusting));
  char url[128];
  snprintf(url, sizeof(url), "%s/healthz", f->base_url);
  pcp_http_client_request_t request = {0};
  request.url = url;
  assert_status(pcp_http_client_send(untrusting, &request, &response),
                PCP_STATUS_UNAVAILABLE, "");
  pcp_http_client_release(untrusting);
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(status_mapping_table),
      cmocka_unit_test(error_json_escapes_message),
      cmocka_unit_test(token_equal_is_exact),
      cmocka_unit_test(json_depth_check_counts_only_structure),
      cmocka_unit_test(create_survives_every_allocation_failure),
      T(route_and_option_errors),
      T(routing_with_params_and_query),
      T(not_found_and_method_not_allowed),
      T(head_is_served_by_get_routes),
      T(request_ids_are_echoed_or_made),
      T(files_are_streamed),
      T(every_status_code_maps_to_json_error),
      T(handler_without_response_gets_json_500),
      T(body_limit_with_content_length),
      T(body_limit_with_chunked_upload),
      T(bad_and_deep_json_get_400),
      T(url_and_header_limits),
      T(bearer_tokens_per_scope),
      T(keep_alive_reuses_one_connection),
      T(connection_limit_answers_503),
      cmocka_unit_test(gate_classify_checks_limits),
      T(protocol_errors_are_json_and_prompt),
      T(slow_headers_are_cut_at_the_deadline),
      T(header_flood_leaves_probes_answerable),
      T(per_client_cap_answers_429),
      T(idle_connections_time_out),
      T(client_gone_seen_by_a_blocked_handler),
      T(graceful_stop_finishes_inflight_requests),
      T(stop_deadline_cuts_off_slow_requests),
      T(sse_stream_delivers_events),
      T(client_stream_reads_events_live),
      T(sse_queue_is_bounded),
      T(sse_notices_a_client_that_left),
      T(stop_ends_open_streams),
      T(healthz_and_readyz),
      T(metrics_render_and_pass_promtool),
      T(two_servers_share_one_registry),
      cmocka_unit_test_setup_teardown(tls_round_trip, setup_tls, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
