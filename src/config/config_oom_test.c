// SPDX-License-Identifier: Apache-2.0
//
// OOM sweeps (SQLite style) over the config entry points that take an
// allocator: fail the Nth allocation (and every one after it) for every N
// until the call succeeds. Every failure must be RESOURCE_EXHAUSTED, never a
// crash, and once the struct and lists are deinitialized the counting
// allocator behind the failing one must hold nothing (a leak check in every
// build, not only under ASan).

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <string.h>

#include "config/config.h"

typedef struct inner_t {
  bool present;
  char* name;
  pcp_string_list_t tags;
} inner_t;

typedef struct outer_t {
  char* host;
  int64_t port;
  pcp_string_list_t inputs;
  inner_t inner;
} outer_t;

static const pcp_config_field_t kInnerFields[] = {
    {.name = "name",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(inner_t, name),
     .default_value = "inner-default",
     .help = "a string"},
    {.name = "tags",
     .type = PCP_CONFIG_TYPE_STRING_LIST,
     .offset = offsetof(inner_t, tags),
     .default_value = "x,y",
     .help = "a list"},
};
static const pcp_config_table_t kInnerTable = {
    .name = "inner",
    .fields = kInnerFields,
    .field_count = PCP_ARRAYSIZE(kInnerFields)};

static const pcp_config_field_t kOuterFields[] = {
    {.name = "host",
     .type = PCP_CONFIG_TYPE_STRING,
     .offset = offsetof(outer_t, host),
     .default_value = "127.0.0.1",
     .help = "a string"},
    {.name = "port",
     .type = PCP_CONFIG_TYPE_INT64,
     .offset = offsetof(outer_t, port),
     .default_value = "80",
     .min = 1,
     .max = 65535,
     .help = "a number"},
    {.name = "input",
     .type = PCP_CONFIG_TYPE_STRING_LIST,
     .offset = offsetof(outer_t, inputs),
     .default_value = "a,b,c",
     .help = "a list"},
    {.name = "inner",
     .type = PCP_CONFIG_TYPE_OBJECT,
     .offset = offsetof(outer_t, inner),
     .object_table = &kInnerTable,
     .help = "nested"},
};
static const pcp_config_table_t kOuterTable = {
    .name = "outer",
    .fields = kOuterFields,
    .field_count = PCP_ARRAYSIZE(kOuterFields)};

// One use of the API from start to end; the struct and the lists are
// released whatever happened, as a caller must.
typedef pcp_status_t (*scenario_fn_t)(pcp_allocator_t allocator);

static pcp_status_t argv_scenario(pcp_allocator_t allocator) {
  outer_t config;
  memset(&config, 0, sizeof(config));
  pcp_string_list_t positionals = {0};
  char* argv[] = {"--host", "example.org", "first",  "--input",
                  "p",      "--input",     "q",      "--port",
                  "8080",   "--",          "second", "--third"};
  pcp_status_t status =
      pcp_config_initialize_with_allocator(&kOuterTable, allocator, &config);
  if (!status) {
    status = pcp_config_parse_argv_with_allocator(&kOuterTable, allocator,
                                                  (int)PCP_ARRAYSIZE(argv),
                                                  argv, &config, &positionals);
  }
  if (!status) {
    status = pcp_config_set_with_allocator(&kOuterTable, allocator, &config,
                                           "host", "set.example.org");
  }
  if (!status) {
    // What was parsed is what the sweep's successful run must see.
    assert_string_equal(config.host, "set.example.org");
    assert_int_equal(config.port, 8080);
    assert_int_equal(config.inputs.count, 2);
    assert_string_equal(config.inputs.items[1], "q");
    assert_int_equal(positionals.count, 3);
    assert_string_equal(positionals.items[2], "--third");
  }
  pcp_config_deinitialize_with_allocator(&kOuterTable, allocator, &config);
  pcp_string_list_deinitialize(&positionals);
  return status;
}

static pcp_status_t json_scenario(pcp_allocator_t allocator) {
  static const char kJson[] =
      "{\"host\": \"json.example.org\", \"input\": [\"j1\", \"j2\"],"
      " \"inner\": {\"name\": \"n\", \"tags\": [\"t1\", \"t2\", \"t3\"],"
      " \"unknown_inner\": 1},"
      " \"unknown\": true, \"port\": null}";
  outer_t config;
  memset(&config, 0, sizeof(config));
  pcp_string_list_t unknown = {0};
  pcp_status_t status =
      pcp_config_initialize_with_allocator(&kOuterTable, allocator, &config);
  if (!status) {
    status = pcp_config_parse_json_with_allocator(
        &kOuterTable, allocator, kJson, strlen(kJson), &config, &unknown);
  }
  if (!status) {
    assert_string_equal(config.host, "json.example.org");
    assert_int_equal(config.port, 80);
    assert_true(config.inner.present);
    assert_string_equal(config.inner.name, "n");
    assert_int_equal(config.inner.tags.count, 3);
    assert_int_equal(unknown.count, 2);
  }
  pcp_config_deinitialize_with_allocator(&kOuterTable, allocator, &config);
  pcp_string_list_deinitialize(&unknown);
  return status;
}

static void sweep(const char* name, scenario_fn_t fn) {
  pcp_allocator_counting_t counter;
  pcp_allocator_counting_initialize(pcp_allocator_system(), &counter);
  pcp_allocator_failing_t never;
  pcp_allocator_failing_initialize(pcp_allocator_counting(&counter), -1, false,
                                   &never);
  PCP_CHECK_OK(fn(pcp_allocator_failing(&never)));
  assert_int_equal(counter.live_bytes, 0);
  int64_t total = never.request_count;
  assert_true(total > 10);  // the scenario does allocate
  for (int64_t n = 0; n < total; ++n) {
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_counting(&counter), n, true,
                                     &failing);
    pcp_status_t status = fn(pcp_allocator_failing(&failing));
    if (counter.live_bytes != 0) {
      fail_msg("%s: allocation %lld failed; %lld bytes left behind", name,
               (long long)n, (long long)counter.live_bytes);
    }
    if (!status) {
      fail_msg("%s: allocation %lld failed, yet the call succeeded", name,
               (long long)n);
    }
    pcp_status_code_t code = pcp_status_consume_code(status);
    if (code != PCP_STATUS_RESOURCE_EXHAUSTED) {
      fail_msg("%s: allocation %lld failed with %s", name, (long long)n,
               pcp_status_code_string(code));
    }
  }
}

static void argv_paths_survive_every_failed_allocation(void** state) {
  (void)state;
  sweep("argv", argv_scenario);
}

static void json_paths_survive_every_failed_allocation(void** state) {
  (void)state;
  sweep("json", json_scenario);
}

// The forms without an allocator and a zeroed list use the system
// allocator, so existing callers that free with it keep working.
static void unset_list_allocator_is_the_system_allocator(void** state) {
  (void)state;
  pcp_string_list_t list = {0};
  PCP_CHECK_OK(pcp_string_list_append(&list, "one"));
  assert_null(list.allocator.ctl);
  pcp_allocator_free(pcp_allocator_system(), list.items[0]);
  list.items[0] = NULL;
  pcp_string_list_deinitialize(&list);

  pcp_allocator_counting_t counter;
  pcp_allocator_counting_initialize(pcp_allocator_system(), &counter);
  pcp_string_list_t counted = {.allocator = pcp_allocator_counting(&counter)};
  PCP_CHECK_OK(pcp_string_list_append(&counted, "two"));
  assert_true(counter.live_bytes > 0);
  pcp_string_list_deinitialize(&counted);
  assert_int_equal(counter.live_bytes, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(argv_paths_survive_every_failed_allocation),
      cmocka_unit_test(json_paths_survive_every_failed_allocation),
      cmocka_unit_test(unset_list_allocator_is_the_system_allocator),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
