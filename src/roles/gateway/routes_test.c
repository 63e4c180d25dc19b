// SPDX-License-Identifier: Apache-2.0
// The gateway's route table (routes.c): no (method, pattern) twice, every
// /v1 route behind a token whenever one is configured, the hub's routes
// behind the federation token or answering 401, each handler given the
// state of its owner.

// clang-format off: cmocka needs these first, in this order.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
// clang-format on

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "roles/gateway/gateway_impl.h"

static int g_gateway;
static int g_services;

static pcp_http_route_t* resolve(bool api, bool internal, bool federation,
                                 size_t* out_count) {
  size_t count = pcp_roles_gateway_route_count();
  pcp_http_route_t* routes = calloc(count, sizeof(*routes));
  PCP_ASSERT(routes);
  const pcp_roles_gateway_route_tokens_t tokens = {api, internal, federation};
  pcp_roles_gateway_routes_resolve(&tokens, &g_gateway, &g_services, routes);
  *out_count = count;
  return routes;
}

static const pcp_http_route_t* find(const pcp_http_route_t* routes,
                                    size_t count, const char* method,
                                    const char* pattern) {
  for (size_t i = 0; i < count; ++i) {
    if (strcmp(routes[i].method, method) == 0 &&
        strcmp(routes[i].pattern, pattern) == 0) {
      return &routes[i];
    }
  }
  fail_msg("no route %s %s", method, pattern);
  return NULL;
}

static bool is_federation_internal(const char* pattern) {
  return strncmp(pattern, "/v1/internal/federation/", 24) == 0;
}

static void no_duplicates(void** state) {
  (void)state;
  size_t count = 0;
  pcp_http_route_t* routes = resolve(true, true, true, &count);
  assert_true(count >= 40);
  for (size_t i = 0; i < count; ++i) {
    assert_non_null(routes[i].handler);
    for (size_t j = i + 1; j < count; ++j) {
      if (strcmp(routes[i].method, routes[j].method) == 0 &&
          strcmp(routes[i].pattern, routes[j].pattern) == 0) {
        fail_msg("%s %s twice", routes[i].method, routes[i].pattern);
      }
    }
  }
  free(routes);
}

static void api_token_guards_every_v1_route(void** state) {
  (void)state;
  size_t count = 0;
  pcp_http_route_t* routes = resolve(true, false, true, &count);
  for (size_t i = 0; i < count; ++i) {
    const pcp_http_route_t* r = &routes[i];
    if (strncmp(r->pattern, "/v1/", 4) == 0) {
      if (!r->scope) {
        fail_msg("%s %s is open with an API token", r->method, r->pattern);
      }
      const char* want =
          is_federation_internal(r->pattern) ? "federation" : "api";
      assert_string_equal(r->scope, want);
    } else {
      assert_null(r->scope);  // the dashboard and /openapi.json
    }
  }
  free(routes);
}

static void no_token_leaves_v1_open(void** state) {
  (void)state;
  size_t count = 0;
  pcp_http_route_t* routes = resolve(false, false, false, &count);
  for (size_t i = 0; i < count; ++i) {
    assert_null(routes[i].scope);
  }
  free(routes);
}

static void events_take_the_internal_token(void** state) {
  (void)state;
  size_t count = 0;
  pcp_http_route_t* routes = resolve(true, true, false, &count);
  assert_string_equal(find(routes, count, "POST", "/v1/internal/events")->scope,
                      "internal");
  free(routes);
  routes = resolve(true, false, false, &count);
  assert_string_equal(find(routes, count, "POST", "/v1/internal/events")->scope,
                      "api");
  free(routes);
  routes = resolve(false, true, false, &count);
  assert_string_equal(find(routes, count, "POST", "/v1/internal/events")->scope,
                      "internal");
  free(routes);
}

static void federation_routes_without_token_answer_401(void** state) {
  (void)state;
  size_t count = 0;
  pcp_http_route_t* with = resolve(true, false, true, &count);
  pcp_http_route_t* without = resolve(true, false, false, &count);
  size_t internal = 0;
  for (size_t i = 0; i < count; ++i) {
    if (!is_federation_internal(without[i].pattern)) {
      assert_ptr_equal(with[i].handler, without[i].handler);
      continue;
    }
    ++internal;
    assert_null(without[i].scope);
    assert_ptr_not_equal(with[i].handler, without[i].handler);
    // The gate reads nothing of the request.
    pcp_status_t status = without[i].handler(without[i].user_data, NULL, NULL);
    assert_int_equal(pcp_status_code(status), PCP_STATUS_UNAUTHENTICATED);
    pcp_status_ignore(status);
  }
  assert_int_equal(internal, 4);
  free(with);
  free(without);
}

static void owners_get_their_state(void** state) {
  (void)state;
  size_t count = 0;
  pcp_http_route_t* routes = resolve(true, true, true, &count);
  const char* const kServices[][2] = {
      {"GET", "/v1/services"},
      {"POST", "/v1/graph/query"},
      {"PUT", "/v1/graph/policies/*"},
      {"POST", "/v1/internal/events"},
      {"GET", "/v1/federation/status"},
      {"GET", "/v1/capabilities"},
      {"POST", "/v1/inference/query/chat/completions"},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(kServices); ++i) {
    assert_ptr_equal(
        find(routes, count, kServices[i][0], kServices[i][1])->user_data,
        &g_services);
  }
  const char* const kGateway[][2] = {
      {"GET", "/"},
      {"POST", "/v1/jobs"},
      {"GET", "/v1/training/jobs/{id}/history"},
      {"GET", "/v1/internal/federation/jobs/{id}"},
      {"POST", "/v1/internal/federation/training/jobs"},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(kGateway); ++i) {
    assert_ptr_equal(
        find(routes, count, kGateway[i][0], kGateway[i][1])->user_data,
        &g_gateway);
  }
  // Body caps the table carries: job submissions, proxied completions.
  assert_int_equal(find(routes, count, "POST", "/v1/jobs")->max_body_bytes,
                   PCP_GATEWAY_JOB_MAX_BODY_BYTES);
  assert_int_equal(find(routes, count, "POST", "/v1/inference/chat/completions")
                       ->max_body_bytes,
                   PCP_SERVICES_PROXY_MAX_REQUEST_BYTES);
  free(routes);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(no_duplicates),
      cmocka_unit_test(api_token_guards_every_v1_route),
      cmocka_unit_test(no_token_leaves_v1_open),
      cmocka_unit_test(events_take_the_internal_token),
      cmocka_unit_test(federation_routes_without_token_answer_401),
      cmocka_unit_test(owners_get_their_state),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
