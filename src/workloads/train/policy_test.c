// SPDX-License-Identifier: Apache-2.0
//
// The training API's spec builder: experiments validated through the
// workloads config table, errors naming the key, progress starting at zero.

// realpath(3), mkdtemp(3), symlink(2) need XSI.
#define _XOPEN_SOURCE 700

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
// clang-format on

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "workloads/workloads.h"

// Every test runs in a fresh state dir (the working directory, so relative
// data paths resolve there) whose data/ holds the files the experiments
// name; data and model roots are the state dir itself.
static char g_state_dir[PATH_MAX];
static pcp_workloads_train_policy_t g_policy;

static void write_file(const char* path, const char* text) {
  assert_true(
      pcp_status_is_ok(pcp_file_write_atomic(path, text, strlen(text))));
}

static int setup(void** state) {
  (void)state;
  char dir[] = "/tmp/pcp-training-test-XXXXXX";
  if (!mkdtemp(dir) || !realpath(dir, g_state_dir) || chdir(g_state_dir)) {
    return -1;
  }
  mkdir("data", 0755);
  write_file("data/tiny_shakespeare.txt", "First Citizen:\n");
  write_file("d", "hello\n");
  pcp_workloads_train_policy_config_t file;
  memset(&file, 0, sizeof(file));
  file.state_dir = g_state_dir;
  char* roots[] = {g_state_dir};
  file.data_roots = (pcp_string_list_t){.items = roots, .count = 1};
  file.model_roots = (pcp_string_list_t){.items = roots, .count = 1};
  pcp_status_t status = pcp_workloads_train_policy_initialize(
      &file, NULL, (uint64_t)8 << 30, &g_policy);
  return pcp_status_is_ok(status) ? 0 : -1;
}

static int teardown(void** state) {
  (void)state;
  pcp_workloads_train_policy_deinitialize(&g_policy);
  char command[PATH_MAX + 16];
  snprintf(command, sizeof(command), "rm -rf '%s'", g_state_dir);
  return system(command) == 0 ? 0 : -1;
}

static pcp_status_t build(const char* text, json_t** out_spec) {
  return pcp_workloads_train_spec_build(&g_policy, text, strlen(text),
                                        out_spec);
}

static void test_valid_experiment(void** state) {
  (void)state;
  json_t* spec = NULL;
  pcp_status_t status = build(
      "{\"model\":{\"kind\":\"gpt\",\"layers\":1,\"batch\":4},"
      "\"data_path\":\"data/tiny_shakespeare.txt\",\"tokenizer\":"
      "\"char\",\"tau\":3,\"outer_loop_steps\":5,"
      "\"deltas_dtype\":\"bf16\",\"color\":\"blue\",\"name\":\"n\","
      "\"seed\":7}",
      &spec);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_OK);
  assert_non_null(spec);
  json_t* training = json_object_get(spec, "training");
  assert_int_equal(json_integer_value(json_object_get(training, "tau")), 3);
  assert_int_equal(
      json_integer_value(json_object_get(training, "outer_loop_steps")), 5);
  assert_int_equal(json_integer_value(json_object_get(training, "outer_step")),
                   0);
  assert_true(json_is_null(json_object_get(training, "loss")));
  assert_string_equal(
      json_string_value(json_object_get(training, "deltas_dtype")), "bf16");
  // Analytic wire bytes per worker and outer step: a bf16 delta up (2 B)
  // and f32 parameters down (4 B) per parameter.
  json_int_t parameters =
      json_integer_value(json_object_get(training, "parameter_count"));
  assert_true(parameters > 0);
  assert_int_equal(json_integer_value(json_object_get(
                       training, "wire_bytes_per_worker_outer_step")),
                   parameters * 6);
  // The experiment is kept as sent but for its paths, resolved (a resume
  // re-reads it); unknown keys are reported, not fatal (upstream ignores
  // them), and name and seed are known keys.
  json_t* experiment = json_object_get(spec, "experiment");
  char expect[PATH_MAX + 32];
  snprintf(expect, sizeof(expect), "%s/data/tiny_shakespeare.txt", g_state_dir);
  assert_string_equal(
      json_string_value(json_object_get(experiment, "data_path")), expect);
  json_t* unknown = json_object_get(spec, "unknown_keys");
  assert_int_equal(json_array_size(unknown), 1);
  assert_string_equal(json_string_value(json_array_get(unknown, 0)), "color");
  json_decref(spec);
}

// aggregation_strategy: the three modes' names pass, anything else (or a
// mode with a block of another) is a 400 naming the key.
static void test_aggregation_strategy(void** state) {
  (void)state;
  static const char kHead[] =
      "{\"model\":{\"kind\":\"gpt\",\"layers\":1,\"batch\":4},"
      "\"data_path\":\"data/tiny_shakespeare.txt\",\"tau\":3,"
      "\"outer_loop_steps\":5";
  static const struct {
    const char* tail;
    const char* message;  // NULL: accepted
  } kCases[] = {
      {"}", NULL},
      {",\"aggregation_strategy\":\"diloco\"}", NULL},
      {",\"aggregation_strategy\":\"ddp\"}", NULL},
      {",\"aggregation_strategy\":\"decoupled_diloco\","
       "\"decoupled_diloco\":{}}",
       NULL},
      {",\"aggregation_strategy\":\"dpp\"}",
       "key 'aggregation_strategy': 'dpp' is not one of 'diloco', "
       "'decoupled_diloco' or 'ddp'"},
      {",\"aggregation_strategy\":3}", "must be a string"},
      {",\"aggregation_strategy\":\"ddp\",\"streaming\":{"
       "\"num_fragments\":1,\"inner_steps\":3}}",
       "'ddp' and a 'streaming' block"},
      {",\"aggregation_strategy\":\"decoupled_diloco\",\"streaming\":{"
       "\"num_fragments\":1,\"inner_steps\":3}}",
       "'decoupled_diloco' and a 'streaming' block"},
      {",\"aggregation_strategy\":\"ddp\",\"decoupled_diloco\":{}}",
       "'ddp' and a 'decoupled_diloco' block"},
      // The block's keys are checked at submit too.
      {",\"aggregation_strategy\":\"decoupled_diloco\","
       "\"decoupled_diloco\":{\"seeded_init\":\"on\"}}",
       "seeded_init"},
      {",\"aggregation_strategy\":\"decoupled_diloco\","
       "\"decoupled_diloco\":{\"seeded_init\":\"off\"}}",
       NULL},
      {",\"aggregation_strategy\":\"decoupled_diloco\","
       "\"decoupled_diloco\":{\"num_fragments\":0}}",
       "num_fragments"},
      {",\"aggregation_strategy\":\"decoupled_diloco\","
       "\"decoupled_diloco\":3}",
       "must be an object"},
      {",\"aggregation_strategy\":\"ddp\",\"dtype\":\"bf16\"}",
       "'ddp' trains f32 models only"},
      // A decoupled_diloco block without the strategy that reads it would
      // train classic DiLoCo and ignore the block.
      {",\"decoupled_diloco\":{}}",
       "a 'decoupled_diloco' block needs aggregation_strategy "
       "'decoupled_diloco'"},
      {",\"aggregation_strategy\":\"diloco\",\"decoupled_diloco\":{}}",
       "a 'decoupled_diloco' block needs aggregation_strategy "
       "'decoupled_diloco'"},
  };
  for (size_t k = 0; k < sizeof(kCases) / sizeof(kCases[0]); ++k) {
    char text[1024];
    snprintf(text, sizeof(text), "%s%s", kHead, kCases[k].tail);
    json_t* spec = NULL;
    pcp_status_t status = build(text, &spec);
    if (!kCases[k].message) {
      if (!pcp_status_is_ok(status)) {
        print_error("case %zu: %s\n", k, pcp_status_message(status));
      }
      assert_int_equal(pcp_status_code(status), PCP_STATUS_OK);
      json_t* training = json_object_get(spec, "training");
      json_int_t parameters =
          json_integer_value(json_object_get(training, "parameter_count"));
      // Analytic bytes per worker and reported step: ddp moves 8 P per
      // inner step (tau 3), DiLoCo 8 P per outer step (f32).
      assert_int_equal(json_integer_value(json_object_get(
                           training, "wire_bytes_per_worker_outer_step")),
                       parameters * (strstr(kCases[k].tail, "ddp") ? 24 : 8));
      json_decref(spec);
      continue;
    }
    assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
    const char* message = pcp_status_message(status);
    if (!strstr(message, kCases[k].message)) {
      print_error("case %zu: %s\n", k, message);
    }
    assert_non_null(strstr(message, kCases[k].message));
    assert_null(spec);
    pcp_status_ignore(status);
  }
}

// The example of docs/api.md ("Training jobs"), kept valid here.
static void test_documented_example(void** state) {
  (void)state;
  json_t* spec = NULL;
  pcp_status_t status = build(
      "{\"model\": {\"kind\": \"gpt\", \"layers\": 2, \"heads\": 4, "
      "\"width\": 128, \"vocab\": 65, \"block_size\": 64, \"batch\": 8},"
      " \"data_path\": \"data/tiny_shakespeare.txt\", \"tokenizer\": "
      "\"char\", \"learning_rate\": 0.001, \"tau\": 10, "
      "\"outer_loop_steps\": 20, \"outer_learning_rate\": 0.7, "
      "\"nesterov_momentum\": 0.9, \"deltas_dtype\": \"bf16\", "
      "\"checkpoint_dir\": \"ckpt\", \"checkpoint_every\": 5}",
      &spec);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_OK);
  assert_int_equal(json_array_size(json_object_get(spec, "unknown_keys")), 0);
  json_decref(spec);
}

// A model_path experiment: the module is read at submit, so its size is in
// the progress (a bf16 one: parameters down in bf16) and a module the
// gateway cannot read, or one that is not a forward-loss module, is a 400.
static void test_model_path_is_read_at_submit(void** state) {
  (void)state;
  char path[PATH_MAX + 16];
  snprintf(path, sizeof(path), "%s/m.mlir", g_state_dir);
  static const char kModule[] =
      "module {\n  func.func @main(%w: tensor<65x8xbf16>, %b: "
      "tensor<8xbf16>, %x: tensor<2x16xi32>, %y: tensor<2x16xi32>) -> "
      "tensor<bf16> {\n    %c = stablehlo.constant dense<0.0> : "
      "tensor<bf16>\n    return %c : tensor<bf16>\n  }\n}\n";
  assert_true(
      pcp_status_is_ok(pcp_file_write_atomic(path, kModule, strlen(kModule))));
  char text[PATH_MAX + 256];
  snprintf(text, sizeof(text),
           "{\"model_path\":\"%s\",\"data_path\":\"d\","
           "\"dtype\":\"bf16\"}",
           path);
  json_t* spec = NULL;
  pcp_status_t status = build(text, &spec);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_OK);
  json_t* training = json_object_get(spec, "training");
  assert_int_equal(
      json_integer_value(json_object_get(training, "parameter_count")),
      65 * 8 + 8);
  // f32 deltas up (4) + bf16 parameters down (2).
  assert_int_equal(json_integer_value(json_object_get(
                       training, "wire_bytes_per_worker_outer_step")),
                   (65 * 8 + 8) * 6);
  json_decref(spec);
  // The same module as f32: the dtype key disagrees with it.
  snprintf(text, sizeof(text), "{\"model_path\":\"%s\",\"data_path\":\"d\"}",
           path);
  spec = NULL;
  status = build(text, &spec);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(status), "dtype"));
  pcp_status_ignore(status);
  assert_null(spec);
  unlink(path);
  // Gone: a 400 naming model_path, not a job that fails later.
  status = build(text, &spec);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(status), "model_path"));
  pcp_status_ignore(status);
  assert_null(spec);
}

static void expect_error_naming(const char* text, pcp_status_code_t code,
                                const char* key) {
  json_t sentinel;
  json_t* spec = &sentinel;  // must be cleared on failure
  pcp_status_t status = build(text, &spec);
  assert_null(spec);
  assert_int_equal(pcp_status_code(status), code);
  char* message = pcp_status_to_string(status);
  assert_non_null(message);
  if (!strstr(message, key)) {
    fail_msg("error \"%s\" does not name \"%s\"", message, key);
  }
  free(message);
  pcp_status_ignore(status);
}

static void test_errors_name_the_key(void** state) {
  (void)state;
  expect_error_naming("{\"model_path\":\"m\",\"data_path\":\"d\",\"tau\":0}",
                      PCP_STATUS_INVALID_ARGUMENT, "tau");
  expect_error_naming("{\"model_path\":\"m\"}", PCP_STATUS_INVALID_ARGUMENT,
                      "data_path");
  expect_error_naming(
      "{\"model_path\":\"m\",\"data_path\":\"d\","
      "\"nesterov_momentum\":\"high\"}",
      PCP_STATUS_INVALID_ARGUMENT, "nesterov_momentum");
  expect_error_naming("[1,2]", PCP_STATUS_INVALID_ARGUMENT, "object");
  // name is the served model's id: 1..128 bytes, no control characters.
  expect_error_naming(
      "{\"model_path\":\"m\",\"data_path\":\"d\",\"name\":\"a\\nb\"}",
      PCP_STATUS_INVALID_ARGUMENT, "name");
  expect_error_naming(
      "{\"model_path\":\"m\",\"data_path\":\"d\",\"name\":\"\"}",
      PCP_STATUS_INVALID_ARGUMENT, "name");
}

// Paths outside their roots are a 403 naming the key and the roots and
// nothing about the file; inside a root, a missing data file is a 400 at
// submit; a module that does not parse gets a message that quotes none of
// it.
static void expect_denied(const char* text, const char* key) {
  json_t* spec = NULL;
  pcp_status_t status = build(text, &spec);
  assert_null(spec);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_PERMISSION_DENIED);
  const char* message = pcp_status_message(status);
  if (!strstr(message, key) || !strstr(message, g_state_dir) ||
      strstr(message, "exist") || strstr(message, "root:") ||
      strstr(message, "bytes")) {
    fail_msg("403 for %s: \"%s\"", key, message);
  }
  pcp_status_ignore(status);
}

static void test_paths_are_confined(void** state) {
  (void)state;
  expect_denied("{\"model_path\":\"m\",\"data_path\":\"/etc/passwd\"}",
                "data_path");
  expect_denied("{\"model_path\":\"m\",\"data_path\":\"/no/such/file\"}",
                "data_path");
  expect_denied("{\"model_path\":\"/etc/shadow\",\"data_path\":\"d\"}",
                "model_path");
  expect_denied("{\"model_path\":\"../../etc/shadow\",\"data_path\":\"d\"}",
                "model_path");
  assert_int_equal(symlink("/etc/passwd", "data/link.txt"), 0);
  expect_denied("{\"model_path\":\"m\",\"data_path\":\"data/link.txt\"}",
                "data_path");
  static const char kBuiltIn[] =
      "{\"model\":{\"kind\":\"gpt\",\"layers\":1,\"batch\":4},"
      "\"data_path\":\"d\",\"checkpoint_dir\":\"%s\"}";
  char text[512];
  snprintf(text, sizeof(text), kBuiltIn, "../../ckpt");
  expect_denied(text, "checkpoint_dir");
  snprintf(text, sizeof(text), kBuiltIn, "/tmp/pcp-elsewhere");
  expect_denied(text, "checkpoint_dir");
  // Inside: a relative checkpoint_dir is taken under the state dir.
  snprintf(text, sizeof(text), kBuiltIn, "ckpt/a");
  json_t* spec = NULL;
  assert_true(pcp_status_is_ok(build(text, &spec)));
  char expect[PATH_MAX + 16];
  snprintf(expect, sizeof(expect), "%s/ckpt/a", g_state_dir);
  assert_string_equal(
      json_string_value(json_object_get(json_object_get(spec, "experiment"),
                                        "checkpoint_dir")),
      expect);
  json_decref(spec);
  // A missing data file under a root: 400 at submit, naming data_path.
  expect_error_naming(
      "{\"model\":{\"kind\":\"gpt\",\"layers\":1,\"batch\":4},"
      "\"data_path\":\"data/missing.txt\"}",
      PCP_STATUS_INVALID_ARGUMENT, "data_path");
  // A module that is not MLIR: the message quotes none of its text.
  write_file("secret.mlir", "s3cr3t-token:$6$salt$hash\n");
  spec = NULL;
  pcp_status_t status =
      build("{\"model_path\":\"secret.mlir\",\"data_path\":\"d\"}", &spec);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(status), "model_path"));
  assert_null(strstr(pcp_status_message(status), "s3cr3t"));
  assert_null(strstr(pcp_status_message(status), "salt"));
  pcp_status_ignore(status);
}

// A built-in spec of 2.6e13 parameters is refused at submit with the bytes
// it would need; so is a small one over a small cap.
static void test_job_size_is_capped(void** state) {
  (void)state;
  json_t* spec = NULL;
  pcp_status_t status = build(
      "{\"model\":{\"kind\":\"gpt\",\"layers\":512,\"heads\":64,"
      "\"width\":65536,\"vocab\":65,\"block_size\":1,\"batch\":1},"
      "\"data_path\":\"d\"}",
      &spec);
  assert_null(spec);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  const char* message = pcp_status_message(status);
  if (!strstr(message, "key 'model'") || !strstr(message, "bytes") ||
      !strstr(message, "422219515691008 bytes") ||
      !strstr(message, "max_job_gateway_bytes")) {
    fail_msg("over the cap: \"%s\"", message);
  }
  pcp_status_ignore(status);
  pcp_workloads_train_policy_t small = g_policy;
  small.max_job_bytes = 1 << 20;
  status = pcp_workloads_train_spec_build(
      &small,
      "{\"model\":{\"kind\":\"gpt\",\"layers\":2,\"batch\":4},"
      "\"data_path\":\"d\"}",
      strlen("{\"model\":{\"kind\":\"gpt\",\"layers\":2,\"batch\":4},"
             "\"data_path\":\"d\"}"),
      &spec);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(status), "max_job_gateway_bytes"));
  assert_non_null(strstr(pcp_status_message(status), "1048576 bytes"));
  pcp_status_ignore(status);
  // The default caps come from the machine's memory: half of it.
  assert_int_equal(g_policy.max_job_bytes, (int64_t)4 << 30);
  assert_int_equal(g_policy.max_parameters, ((int64_t)4 << 30) / 16);
  // A parameter cap set on its own is named when it is the one exceeded.
  small = g_policy;
  small.max_parameters = 1000;
  static const char kSmall[] =
      "{\"model\":{\"kind\":\"gpt\",\"layers\":1,\"batch\":4},"
      "\"data_path\":\"d\"}";
  status =
      pcp_workloads_train_spec_build(&small, kSmall, strlen(kSmall), &spec);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(status), "max_job_parameters"));
  pcp_status_ignore(status);
}

static void test_oversized_body(void** state) {
  (void)state;
  size_t length = ((size_t)1 << 20) + 1;
  char* text = malloc(length + 1);
  assert_non_null(text);
  memset(text, ' ', length);
  text[length] = '\0';
  json_t* spec = NULL;
  pcp_status_t status =
      pcp_workloads_train_spec_build(&g_policy, text, length, &spec);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_RESOURCE_EXHAUSTED);
  assert_null(spec);
  pcp_status_ignore(status);
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_experiment),
      cmocka_unit_test(test_documented_example),
      cmocka_unit_test(test_aggregation_strategy),
      cmocka_unit_test(test_model_path_is_read_at_submit),
      cmocka_unit_test(test_errors_name_the_key),
      cmocka_unit_test(test_paths_are_confined),
      cmocka_unit_test(test_job_size_is_capped),
      cmocka_unit_test(test_oversized_body),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
