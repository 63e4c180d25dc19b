// SPDX-License-Identifier: Apache-2.0
//
// The http module's memory goes through the pcp_allocator_t it is given
// (STYLE.md s.3.5): out-of-memory sweeps with the failing allocator over the
// response builders, event streams, the client and the server's option
// copies, and a real exchange whose every byte (bodies handed to
// libmicrohttpd included) is back in the counting allocator at release.

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "http/http.h"
#include "http/http_impl.h"  // the response builder outside a server

#define SWEEP_LIMIT 10000

// One step of the builder sequence; stops at the first error.
#define STEP(expr)     \
  do {                 \
    if (!status) {     \
      status = (expr); \
    }                  \
  } while (0)

// Runs every response setter and an event stream through |allocator|.
// Returns the first error; |*out_checked| is set when all steps passed and
// the results were checked.
static pcp_status_t exercise_response(pcp_allocator_t allocator,
                                      bool* out_checked) {
  *out_checked = false;
  pcp_http_response_t response;
  pcp_http_response_initialize(allocator, &response);
  pcp_status_t status = pcp_ok_status();
  STEP(pcp_http_response_header_add(&response, "X-One", "1"));
  STEP(pcp_http_response_header_add(&response, "X-Two", "two"));
  STEP(pcp_http_response_body_set(&response, 200, "text/plain", "hello", 5));
  if (!status) {
    assert_non_null(response.body_block);
    assert_memory_equal(response.body, "hello", 5);
  }
  STEP(pcp_http_response_error_set(&response, 404, "NOT_FOUND", "no \"x\""));
  if (!status) {
    assert_int_equal(response.http_status, 404);
    assert_string_equal(response.content_type, "application/json");
  }
  pcp_status_t asked = pcp_make_status(PCP_STATUS_UNAVAILABLE, "busy");
  STEP(pcp_http_response_status_set(&response, asked));
  pcp_status_ignore(asked);
  json_t* value = json_pack("{s:i}", "a", 1);
  STEP(pcp_http_response_json_set(&response, 201, value));
  json_decref(value);
  if (!status) {
    // json_dumps's buffer: libc memory, not a block of the allocator.
    assert_null(response.body_block);
    assert_string_equal(response.body, "{\"a\":1}");
  }
  pcp_http_sse_stream_t* stream = NULL;
  STEP(pcp_http_response_sse_start(&response, 0, &stream));
  if (stream) {
    STEP(pcp_http_sse_stream_send(stream, "7", "job", "line one\nline two"));
    STEP(pcp_http_sse_stream_comment(stream, "ping"));
  }
  if (!status) {
    assert_int_equal(response.http_status, 200);
    assert_int_equal(response.header_count, 3);  // + Cache-Control
    *out_checked = true;
  }
  pcp_http_response_deinitialize(&response);  // abandons the stream
  pcp_http_sse_stream_release(stream);
  return status;
}

static void response_builders_survive_every_allocation_failure(void** state) {
  PCP_UNUSED(state);
  int64_t index = 0;
  for (;; ++index) {
    assert_true(index < SWEEP_LIMIT);
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_system(), index, true,
                                     &failing);
    pcp_allocator_counting_t counting;
    pcp_allocator_counting_initialize(pcp_allocator_failing(&failing),
                                      &counting);
    bool checked = false;
    pcp_status_t status =
        exercise_response(pcp_allocator_counting(&counting), &checked);
    assert_int_equal(counting.live_bytes, 0);
    if (!status) {
      assert_true(checked);
      assert_int_equal(failing.failure_count, 0);
      break;
    }
    assert_int_equal(pcp_status_consume_code(status),
                     PCP_STATUS_RESOURCE_EXHAUSTED);
  }
  // Headers, bodies, the error builder, the stream and its queue.
  assert_true(index > 10);
}

// The free callback libmicrohttpd calls returns a copied body to the
// allocator that made it.
static void body_block_returns_to_its_allocator(void** state) {
  PCP_UNUSED(state);
  pcp_allocator_counting_t counting;
  pcp_allocator_counting_initialize(pcp_allocator_system(), &counting);
  pcp_http_response_t response;
  pcp_http_response_initialize(pcp_allocator_counting(&counting), &response);
  PCP_CHECK_OK(pcp_http_response_body_set(&response, 200, NULL, "abc", 3));
  pcp_http_body_block_t* block = response.body_block;
  assert_non_null(block);
  assert_ptr_equal(response.body, block->data);
  response.body = NULL;  // as queue_built hands it over
  response.body_block = NULL;
  pcp_http_response_deinitialize(&response);
  assert_true(counting.live_bytes > 0);
  pcp_http_body_block_free(block);
  assert_int_equal(counting.live_bytes, 0);
  pcp_http_body_block_free(NULL);  // a no-op
}

static void client_create_survives_every_allocation_failure(void** state) {
  PCP_UNUSED(state);
  pcp_http_client_options_t options = {.ca_path = "/nonexistent/ca.pem"};
  int64_t index = 0;
  for (;; ++index) {
    assert_true(index < SWEEP_LIMIT);
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_system(), index, true,
                                     &failing);
    pcp_allocator_counting_t counting;
    pcp_allocator_counting_initialize(pcp_allocator_failing(&failing),
                                      &counting);
    pcp_http_client_t* client = NULL;
    pcp_status_t status = pcp_http_client_create(
        &options, pcp_allocator_counting(&counting), &client);
    pcp_http_client_release(client);
    assert_int_equal(counting.live_bytes, 0);
    if (!status) {
      assert_int_equal(failing.failure_count, 0);
      break;
    }
    assert_null(client);
    assert_int_equal(pcp_status_consume_code(status),
                     PCP_STATUS_RESOURCE_EXHAUSTED);
  }
  assert_true(index >= 2);  // the client and its CA path
}

// The server's copies of the TLS paths and scopes go through its allocator
// (create only: start would read the files).
static void server_option_copies_survive_every_allocation_failure(
    void** state) {
  PCP_UNUSED(state);
  static const pcp_http_scope_t kScopes[] = {
      {"api", "PCP_HTTP_ALLOC_TEST_TOKEN"},
      {"internal", "PCP_HTTP_ALLOC_TEST_INTERNAL"},
  };
  setenv("PCP_HTTP_ALLOC_TEST_TOKEN", "secret", 1);
  pcp_http_server_options_t options = {0};
  options.tls_cert_path = "/nonexistent/cert.pem";
  options.tls_key_path = "/nonexistent/key.pem";
  options.scopes = kScopes;
  options.scope_count = PCP_ARRAYSIZE(kScopes);
  int64_t index = 0;
  for (;; ++index) {
    assert_true(index < SWEEP_LIMIT);
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_system(), index, true,
                                     &failing);
    pcp_allocator_counting_t counting;
    pcp_allocator_counting_initialize(pcp_allocator_failing(&failing),
                                      &counting);
    pcp_http_server_t* server = NULL;
    pcp_status_t status = pcp_http_server_create(
        &options, pcp_allocator_counting(&counting), &server);
    pcp_http_server_release(server);
    assert_int_equal(counting.live_bytes, 0);
    if (!status) {
      assert_int_equal(failing.failure_count, 0);
      break;
    }
    assert_int_equal(pcp_status_consume_code(status),
                     PCP_STATUS_RESOURCE_EXHAUSTED);
  }
  assert_true(index >= 7);  // server, 2 paths, 2 x (name, variable)
}

//===----------------------------------------------------------------------===//
// A real exchange on 127.0.0.1
//===----------------------------------------------------------------------===//

static pcp_status_t copy_handler(void* user_data,
                                 const pcp_http_request_t* request,
                                 pcp_http_response_t* response) {
  PCP_UNUSED(user_data);
  PCP_UNUSED(request);
  PCP_RETURN_IF_ERROR_BARE(
      pcp_http_response_header_add(response, "X-Copied", "yes"));
  return pcp_http_response_body_set(response, 200, "text/plain", "copied body",
                                    11);
}

static pcp_status_t fail_handler(void* user_data,
                                 const pcp_http_request_t* request,
                                 pcp_http_response_t* response) {
  PCP_UNUSED(user_data);
  PCP_UNUSED(request);
  PCP_UNUSED(response);
  return pcp_make_status(PCP_STATUS_NOT_FOUND, "no such thing");
}

static void exchange_returns_every_byte(void** state) {
  PCP_UNUSED(state);
  pcp_allocator_counting_t counting;
  pcp_allocator_counting_initialize(pcp_allocator_system(), &counting);
  pcp_allocator_t allocator = pcp_allocator_counting(&counting);
  pcp_http_server_options_t options = {0};
  options.name = "alloc_test";
  pcp_http_server_t* server = NULL;
  PCP_CHECK_OK(pcp_http_server_create(&options, allocator, &server));
  const pcp_http_route_t routes[] = {
      {"GET", "/copy", NULL, copy_handler, NULL, 0, 0},
      {"GET", "/fail", NULL, fail_handler, NULL, 0, 0},
  };
  PCP_CHECK_OK(
      pcp_http_server_routes_add(server, routes, PCP_ARRAYSIZE(routes)));
  PCP_CHECK_OK(pcp_http_server_start(server));
  pcp_http_client_t* client = NULL;
  PCP_CHECK_OK(pcp_http_client_create(NULL, allocator, &client));
  char url[128];
  const char* const paths[] = {"/copy", "/fail", "/missing"};
  const int expected[] = {200, 404, 404};
  for (size_t round = 0; round < 3; ++round) {
    for (size_t i = 0; i < PCP_ARRAYSIZE(paths); ++i) {
      snprintf(url, sizeof(url), "http://127.0.0.1:%u%s",
               (unsigned)pcp_http_server_port(server), paths[i]);
      pcp_http_client_request_t request = {.url = url};
      pcp_http_client_response_t response;
      PCP_CHECK_OK(pcp_http_client_send(client, &request, &response));
      assert_int_equal(response.http_status, expected[i]);
      if (i == 0) {
        assert_string_equal(response.body, "copied body");
        char value[16];
        assert_true(pcp_http_client_response_header(&response, "X-Copied",
                                                    value, sizeof(value)));
      } else {
        assert_non_null(strstr(response.body, "\"NOT_FOUND\""));
      }
      pcp_http_client_response_deinitialize(&response);
    }
  }
  pcp_http_client_release(client);
  PCP_CHECK_OK(pcp_http_server_stop(server, 1000));
  pcp_http_server_release(server);
  // Bodies went to libmicrohttpd in blocks of |allocator|; its free
  // callback returned each one.
  assert_true(counting.allocation_count > 10);
  assert_int_equal(counting.live_bytes, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(response_builders_survive_every_allocation_failure),
      cmocka_unit_test(body_block_returns_to_its_allocator),
      cmocka_unit_test(client_create_survives_every_allocation_failure),
      cmocka_unit_test(server_option_copies_survive_every_allocation_failure),
      cmocka_unit_test(exchange_returns_every_byte),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
