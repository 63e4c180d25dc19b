// SPDX-License-Identifier: Apache-2.0
// The gateway's own config keys (state_dir, worker_fabric, tls) and its
// base64 decoder. The HTTP behaviour is covered end to end by
// tests/integration/gateway_test.py.

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
#include <unistd.h>

#include "roles/gateway/gateway_impl.h"

static pcp_status_t load(pcp_roles_gateway_config_t* config, const char* json) {
  char path[] = "/tmp/pcp_gateway_test_XXXXXX";
  int fd = mkstemp(path);
  PCP_ASSERT(fd >= 0);
  PCP_ASSERT(write(fd, json, strlen(json)) == (ssize_t)strlen(json));
  close(fd);
  memset(config, 0, sizeof(*config));
  pcp_status_t status = pcp_config_initialize(&pcp_roles_gateway_table, config);
  if (!status) {
    status = pcp_config_set(&pcp_roles_gateway_table, config, "gateway-config",
                            path);
  }
  if (!status) {
    status = pcp_roles_gateway_prepare_config(config);
  }
  unlink(path);
  return status;
}

static void cleanup(pcp_roles_gateway_config_t* config) {
  if (config->file_loaded) {
    pcp_config_deinitialize(&pcp_roles_gateway_file_table, &config->file);
    pcp_config_deinitialize(&pcp_roles_gateway_effective_table,
                            &config->effective);
  }
  pcp_config_deinitialize(&pcp_roles_gateway_table, config);
}

static void new_keys_load(void** state) {
  (void)state;
  pcp_roles_gateway_config_t c;
  pcp_status_t status =
      load(&c,
           "{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"state_dir\": \"/s\","
           " \"worker_fabric\": {\"host\": \"127.0.0.1\", \"port\": 9100,"
           " \"join_token_env\": \"MY_JOIN\", \"heartbeat_ms\": 250},"
           " \"tls\": {\"cert\": \"/c.pem\", \"key\": \"/k.pem\"}}");
  assert_null(status);
  assert_string_equal(c.file.state_dir, "/s");
  assert_string_equal(c.effective.worker_join_token_env, "MY_JOIN");
  assert_int_equal(c.effective.worker_heartbeat_ms, 250);
  assert_int_equal(c.effective.worker_fabric_port, 9100);
  assert_string_equal(c.file.tls.cert, "/c.pem");
  cleanup(&c);
}

static void defaults(void** state) {
  (void)state;
  pcp_roles_gateway_config_t c;
  assert_null(load(&c, "{\"gateway_id\": \"g\", \"lab_id\": \"l\"}"));
  assert_string_equal(c.effective.worker_join_token_env,
                      "PCP_WORKER_JOIN_TOKEN");
  assert_int_equal(c.effective.worker_heartbeat_ms, 1000);
  assert_null(c.file.state_dir);  // required only to serve
  cleanup(&c);
}

static void errors_name_the_key(void** state) {
  (void)state;
  static const struct {
    const char* json;
    const char* message;
  } kCases[] = {
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"tls\": {\"cert\": "
       "\"/c\"}}",
       "key 'tls.key' is required when 'tls.cert' is set"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"tls\": {\"key\": "
       "\"/k\"}}",
       "key 'tls.cert' is required when 'tls.key' is set"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"worker_fabric\": "
       "{\"heartbeat_ms\": 10}}",
       "key 'worker_fabric.heartbeat_ms': 10 is out of range"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"worker_fabric\": "
       "{\"join_token_env\": \"not a name\"}}",
       "worker_fabric.join_token_env"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"state_dir\": 5}",
       "key 'state_dir': expected a string, got a number"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"federation\": "
       "{\"upstream\": \"http://h:1\", \"heartbeat_interval_ms\": 50}}",
       "key 'federation.heartbeat_interval_ms': 50 is out of range"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"federation\": "
       "{\"enabled\": true}}",
       "'federation.enabled' is true"},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(kCases); ++i) {
    pcp_roles_gateway_config_t c;
    pcp_status_t status = load(&c, kCases[i].json);
    if (!status) {
      fail_msg("case %zu loaded without an error", i);
    }
    const char* message = pcp_status_message(status);
    if (!strstr(message, kCases[i].message)) {
      fail_msg("case %zu: '%s' lacks '%s'", i, message, kCases[i].message);
    }
    pcp_status_ignore(status);
    cleanup(&c);
  }
}

static void federation_keys_load(void** state) {
  (void)state;
  pcp_roles_gateway_config_t c;
  assert_null(load(&c,
                   "{\"gateway_id\": \"g\", \"lab_id\": \"l\", "
                   "\"federation\": {\"enabled\": true, \"upstream\": "
                   "\"http://hub:9\", \"token_env\": \"FED_TOKEN\", "
                   "\"heartbeat_interval_ms\": 250, \"advertise_url\": "
                   "\"http://gw.example:8000\"}}"));
  assert_true(c.file.federation.enabled);
  assert_string_equal(c.effective.federation_upstream, "http://hub:9");
  assert_string_equal(c.effective.federation_token_env, "FED_TOKEN");
  assert_int_equal(c.effective.federation_heartbeat_interval_ms, 250);
  assert_string_equal(c.file.federation.advertise_url,
                      "http://gw.example:8000");
  cleanup(&c);
  // The legacy key stands in for federation.upstream.
  assert_null(load(&c,
                   "{\"gateway_id\": \"g\", \"lab_id\": \"l\", "
                   "\"federation_hub_endpoint\": \"http://old:1\"}"));
  assert_string_equal(c.effective.federation_upstream, "http://old:1");
  assert_int_equal(c.effective.federation_heartbeat_interval_ms, 5000);
  cleanup(&c);
}

static void base64_vectors(void** state) {
  (void)state;
  static const struct {
    const char* text;
    const char* bytes;
  } kVectors[] = {
      {"", ""},
      {"Zg==", "f"},
      {"Zm8=", "fo"},
      {"Zm9v", "foo"},
      {"Zm9vYg==", "foob"},
      {"Zm9vYmE", "fooba"},
      {"Zm9vYmFy", "foobar"},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(kVectors); ++i) {
    uint8_t* data = NULL;
    size_t length = 0;
    assert_null(pcp_roles_gateway_base64_decode(
        kVectors[i].text, strlen(kVectors[i].text), &data, &length));
    assert_int_equal(length, strlen(kVectors[i].bytes));
    assert_memory_equal(data, kVectors[i].bytes, length);
    free(data);
  }
  const char* bad[] = {"Zm9v!", "Z", "Zm 9v", "Zm9v\n"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(bad); ++i) {
    uint8_t* data = NULL;
    size_t length = 0;
    pcp_status_t status =
        pcp_roles_gateway_base64_decode(bad[i], strlen(bad[i]), &data, &length);
    assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
    assert_null(data);
    pcp_status_ignore(status);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(new_keys_load),
      cmocka_unit_test(defaults),
      cmocka_unit_test(errors_name_the_key),
      cmocka_unit_test(federation_keys_load),
      cmocka_unit_test(base64_vectors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
