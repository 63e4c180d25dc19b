// SPDX-License-Identifier: Apache-2.0
// Model directories: model.json parsing (defaults, every rule names its
// key), char/byte prompts and the "plain" chat template; the service
// refuses a --model-dir without a valid model.json. The serving path itself
// is tests/integration/inference_test.py (real gateway and workers).

// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
// clang-format on

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "workloads/infer/infer_impl.h"

static char g_dir[] = "/tmp/pcp-infer-test-XXXXXX";

static void write_json(const char* text) {
  char path[256];
  snprintf(path, sizeof(path), "%s/model.json", g_dir);
  FILE* f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

#define BASE                                                               \
  "\"name\": \"m\", \"architecture\": \"gpt\", \"layers\": 1, \"heads\": " \
  "2, \"width\": 16, \"vocab\": 8, \"block_size\": 2048"

static pcp_status_t load(const char* body, pcp_infer_model_t* m) {
  char text[1024];
  snprintf(text, sizeof(text), "{%s}", body);
  write_json(text);
  memset(m, 0, sizeof(*m));
  return pcp_infer_model_json_load(g_dir, m);
}

static void model_deinit(pcp_infer_model_t* m) {
  free(m->char_offsets);
  free(m->char_text);
}

static void test_defaults(void** state) {
  (void)state;
  pcp_infer_model_t m;
  PCP_CHECK_OK(load(BASE ", \"tokenizer\": {\"kind\": \"char\", \"vocab\": "
                         "\"ab\\u00e9c\"}",
                    &m));
  assert_string_equal(m.name, "m");
  model_deinit(&m);
  // Spaces are fine in a name; no name at all: the directory's name.
  PCP_CHECK_OK(load(BASE ", \"name\": \"my model\", \"tokenizer\": "
                         "{\"kind\": \"byte\"}, \"vocab\": 256",
                    &m));
  assert_string_equal(m.name, "my model");
  model_deinit(&m);
  PCP_CHECK_OK(
      load("\"architecture\": \"gpt\", \"layers\": 1, "
           "\"heads\": 2, \"width\": 16, \"vocab\": 256, "
           "\"block_size\": 64, \"tokenizer\": {\"kind\": "
           "\"byte\"}",
           &m));
  assert_string_equal(m.name, strrchr(g_dir, '/') + 1);
  model_deinit(&m);
  PCP_CHECK_OK(load(BASE ", \"tokenizer\": {\"kind\": \"char\", "
                         "\"vocab\": \"ab\\u00e9c\"}",
                    &m));
  assert_int_equal(m.spec.architecture, PCP_MODELS_ARCHITECTURE_GPT);
  assert_int_equal(m.gen.slots, PCP_INFER_DEFAULT_SLOTS);
  assert_int_equal(m.gen.max_length, 1024);  // min(block_size, 1024)
  assert_int_equal(m.gen.prefill_length, 32);
  assert_int_equal(m.char_count, 4);  // é is one character
  assert_int_equal(m.tokenizer_kind, PCP_INFER_TOKENIZER_CHAR);
  assert_int_equal(m.chat_template, PCP_INFER_TEMPLATE_PLAIN);
  assert_non_null(strstr(m.weights_path, "/model.safetensors"));
  model_deinit(&m);
}

static void expect_error(const char* body, const char* key) {
  pcp_infer_model_t m;
  pcp_status_t status = load(body, &m);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  char text[512];
  pcp_status_format(status, text, sizeof(text));
  if (!strstr(text, key)) {
    fail_msg("'%s' does not name '%s'", text, key);
  }
  pcp_status_ignore(status);
  model_deinit(&m);
}

static void test_errors_name_the_key(void** state) {
  (void)state;
  const char* kChar =
      ", \"tokenizer\": {\"kind\": \"char\", \"vocab\": \"ab\"}";
  char body[512];
  expect_error("\"architecture\": \"gpt\"", "'layers'");
  snprintf(body, sizeof(body), "%s%s, \"name\": \"a\\u0001b\"", BASE, kChar);
  expect_error(body, "'name'");
  snprintf(body, sizeof(body), "%s%s, \"name\": 5", BASE, kChar);
  expect_error(body, "'name'");
  expect_error("\"name\": \"m\", \"architecture\": \"rnn\"", "'architecture'");
  expect_error("\"name\": \"m\", \"architecture\": \"gpt\", \"layers\": 0",
               "'layers'");
  snprintf(body, sizeof(body), "%s%s, \"dtype\": \"f16\"", BASE, kChar);
  expect_error(body, "'dtype'");
  snprintf(body, sizeof(body), "%s%s, \"weights\": \"../x\"", BASE, kChar);
  expect_error(body, "'weights'");
  snprintf(body, sizeof(body), "%s, \"tokenizer\": {\"kind\": \"wordpiece\"}",
           BASE);
  expect_error(body, "'tokenizer.kind'");
  snprintf(body, sizeof(body),
           "%s, \"tokenizer\": {\"kind\": \"char\", \"vocab\": "
           "\"abcdefghij\"}",
           BASE);
  expect_error(body, "'tokenizer.vocab'");  // 10 characters, vocab 8
  snprintf(body, sizeof(body), "%s, \"tokenizer\": {\"kind\": \"byte\"}", BASE);
  expect_error(body, "'vocab'");  // a byte tokenizer needs 256 ids
  snprintf(body, sizeof(body), "%s%s, \"chat_template\": \"qwen\"", BASE,
           kChar);
  expect_error(body, "'chat_template'");
  snprintf(body, sizeof(body), "%s%s, \"eos_token_id\": 99", BASE, kChar);
  expect_error(body, "'eos_token_id'");
  snprintf(body, sizeof(body), "%s%s, \"stop\": [\"\"]", BASE, kChar);
  expect_error(body, "'stop'");
  snprintf(body, sizeof(body), "%s%s, \"slots\": 0", BASE, kChar);
  expect_error(body, "'slots'");
  snprintf(body, sizeof(body), "%s%s, \"max_length\": 4096", BASE, kChar);
  expect_error(body, "'max_length'");  // beyond block_size
  snprintf(body, sizeof(body), "%s%s, \"weights_sha256\": \"abc\"", BASE,
           kChar);
  expect_error(body, "'weights_sha256'");
  snprintf(body, sizeof(body), "%s%s, \"weights_bytes\": -1", BASE, kChar);
  expect_error(body, "'weights_bytes'");
  snprintf(body, sizeof(body), "%s%s, \"outer_step\": \"7\"", BASE, kChar);
  expect_error(body, "'outer_step'");
  snprintf(body, sizeof(body), "%s%s, \"job_id\": 7", BASE, kChar);
  expect_error(body, "'job_id'");
  write_json("{not json");
  pcp_infer_model_t m = {0};
  pcp_status_t status = pcp_infer_model_json_load(g_dir, &m);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  pcp_status_ignore(status);
}

// A training export's keys are read; a weights file whose bytes are not the
// ones model.json names is refused before anything is loaded from it
// (FAILED_PRECONDITION), and the same bytes pass the check (the load then
// fails on the content: the file is no safetensors).
static void test_export_keys_and_weights_check(void** state) {
  (void)state;
  char weights[300];
  snprintf(weights, sizeof(weights), "%s/model.safetensors", g_dir);
  assert_null(pcp_file_write_atomic(weights, "not a safetensors file", 22));
  pcp_sha256_t digest;
  pcp_sha256_compute("not a safetensors file", 22, &digest);
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_sha256_to_hex(&digest, hex);
  const char* kByte = ", \"tokenizer\": {\"kind\": \"byte\"}, \"vocab\": 256";
  char body[768];
  snprintf(body, sizeof(body),
           "%s%s, \"job_id\": \"train-1\", \"outer_step\": 12, "
           "\"weights_bytes\": 22, \"weights_sha256\": \"%s\"",
           BASE, kByte, hex);
  pcp_infer_model_t* m = calloc(1, sizeof(*m));
  assert_non_null(m);
  PCP_CHECK_OK(load(body, m));
  assert_string_equal(m->job_id, "train-1");
  assert_int_equal(m->outer_step, 12);
  assert_int_equal(m->weights_bytes, 22);
  assert_true(m->has_weights_sha256);
  assert_memory_equal(m->weights_sha256.bytes, digest.bytes, 32);
  assert_true(m->json_inode != 0 && m->json_size > 0);
  // The hash matches: the load goes on to the file's content and fails
  // there (its first 8 bytes read as a huge header length).
  pcp_status_t status = pcp_infer_model_weights_load(m);
  assert_true(status != 0 &&
              pcp_status_code(status) != PCP_STATUS_FAILED_PRECONDITION);
  pcp_status_ignore(status);
  pcp_infer_model_free(m);
  // Other bytes under the name (the next export renamed in early).
  assert_null(pcp_file_write_atomic(weights, "Not a safetensors file", 22));
  m = calloc(1, sizeof(*m));
  assert_non_null(m);
  PCP_CHECK_OK(load(body, m));
  status = pcp_infer_model_weights_load(m);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_FAILED_PRECONDITION);
  char text[512];
  pcp_status_format(status, text, sizeof(text));
  assert_non_null(strstr(text, "not the file model.json commits to"));
  pcp_status_ignore(status);
  pcp_infer_model_free(m);
  // Without the keys: provenance unknown, no check.
  snprintf(body, sizeof(body), "%s%s", BASE, kByte);
  pcp_infer_model_t plain;
  PCP_CHECK_OK(load(body, &plain));
  assert_int_equal(plain.outer_step, -1);
  assert_int_equal(plain.weights_bytes, -1);
  assert_false(plain.has_weights_sha256);
  model_deinit(&plain);
  unlink(weights);
}

static void test_char_prompts_and_plain_chat(void** state) {
  (void)state;
  pcp_infer_model_t m;
  PCP_CHECK_OK(load(BASE ", \"tokenizer\": {\"kind\": \"char\", \"vocab\": "
                         "\"\\nab\\u00e9c \"}",
                    &m));
  pcp_tokenizer_id_list_t ids;
  pcp_tokenizer_id_list_initialize(pcp_allocator_system(), &ids);
  pcp_infer_request_params_t params = {.prompt =
                                           pcp_make_cstring_view("ab\xc3\xa9"
                                                                 "c a")};
  PCP_CHECK_OK(pcp_infer_model_encode(&m, &params, &ids));
  static const int32_t kWant[] = {1, 2, 3, 4, 5, 1};
  assert_int_equal(ids.count, PCP_ARRAYSIZE(kWant));
  assert_memory_equal(ids.values, kWant, sizeof(kWant));
  // A character outside the vocabulary: 400 naming the parameter.
  ids.count = 0;
  params.prompt = pcp_make_cstring_view("abz");
  pcp_status_t status = pcp_infer_model_encode(&m, &params, &ids);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(status), "prompt: "));
  pcp_status_ignore(status);
  // "plain": contents joined by "\n", no roles.
  pcp_infer_message_t messages[2] = {
      {pcp_make_cstring_view("system"), pcp_make_cstring_view("a")},
      {pcp_make_cstring_view("user"), pcp_make_cstring_view("bc")}};
  params = (pcp_infer_request_params_t){
      .chat = true, .messages = messages, .message_count = 2};
  ids.count = 0;
  PCP_CHECK_OK(pcp_infer_model_encode(&m, &params, &ids));
  static const int32_t kChat[] = {1, 0, 2, 4};
  assert_int_equal(ids.count, PCP_ARRAYSIZE(kChat));
  assert_memory_equal(ids.values, kChat, sizeof(kChat));
  messages[1].role = pcp_make_cstring_view("wizard");
  ids.count = 0;
  status = pcp_infer_model_encode(&m, &params, &ids);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(status), "messages[1].role: "));
  pcp_status_ignore(status);
  pcp_tokenizer_id_list_deinitialize(&ids);
  model_deinit(&m);
}

static void test_byte_prompts(void** state) {
  (void)state;
  pcp_infer_model_t m;
  PCP_CHECK_OK(
      load("\"name\": \"b\", \"architecture\": \"qwen3\", "
           "\"layers\": 1, \"heads\": 2, \"kv_heads\": 1, \"width\": "
           "16, \"vocab\": 260, \"block_size\": 64, \"tokenizer\": "
           "{\"kind\": \"byte\"}, \"eos_token_id\": [256, 257], "
           "\"stop\": [\"END\"]",
           &m));
  assert_int_equal(m.eos_count, 2);
  assert_int_equal(m.stop_count, 1);
  assert_int_equal(m.gen.max_length, 64);
  pcp_tokenizer_id_list_t ids;
  pcp_tokenizer_id_list_initialize(pcp_allocator_system(), &ids);
  pcp_infer_request_params_t params = {.prompt =
                                           pcp_make_string_view("A\xff", 2)};
  PCP_CHECK_OK(pcp_infer_model_encode(&m, &params, &ids));
  assert_int_equal(ids.count, 2);
  assert_int_equal(ids.values[0], 65);
  assert_int_equal(ids.values[1], 255);
  pcp_tokenizer_id_list_deinitialize(&ids);
  model_deinit(&m);
}

static void test_service_refuses_a_bad_model_dir(void** state) {
  (void)state;
  setenv("PCP_INFER_TEST_JOIN", "join", 1);
  pcp_fabric_options_t fabric_options;
  pcp_fabric_options_initialize(&fabric_options);
  fabric_options.join_token_env = "PCP_INFER_TEST_JOIN";
  pcp_fabric_endpoint_t* fabric = NULL;
  PCP_CHECK_OK(pcp_fabric_endpoint_create(&fabric_options,
                                          pcp_allocator_system(), &fabric));
  write_json("{\"name\": 5}");
  const char* dirs[] = {g_dir};
  pcp_infer_service_options_t options = {
      .fabric = fabric, .model_dirs = dirs, .model_dir_count = 1};
  pcp_infer_service_t* service = NULL;
  pcp_status_t status =
      pcp_infer_service_create(&options, pcp_allocator_system(), &service);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_null(service);
  pcp_status_ignore(status);
  // A directory without model.json at all.
  const char* missing[] = {"/nonexistent-pcp-model"};
  options.model_dirs = missing;
  status = pcp_infer_service_create(&options, pcp_allocator_system(), &service);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_NOT_FOUND);
  pcp_status_ignore(status);
  // No models at all: a service that serves nothing yet, never ready.
  options.model_dir_count = 0;
  PCP_CHECK_OK(
      pcp_infer_service_create(&options, pcp_allocator_system(), &service));
  pcp_infer_readiness_t readiness;
  pcp_infer_service_readiness(service, &readiness);
  assert_false(readiness.ready);
  assert_false(pcp_infer_service_has_pinned_models(service));
  pcp_infer_model_info_t info;
  assert_int_equal(pcp_infer_service_model_list(service, &info, 1, NULL), 0);
  pcp_infer_request_params_t params = {
      .model = "none", .on_text = NULL, .on_done = NULL};
  status = pcp_infer_request_submit(service, &params, NULL);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  pcp_status_ignore(status);
  pcp_infer_service_release(service);
  pcp_fabric_endpoint_release(fabric);
}

int main(void) {
  if (!mkdtemp(g_dir)) {
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_errors_name_the_key),
      cmocka_unit_test(test_export_keys_and_weights_check),
      cmocka_unit_test(test_char_prompts_and_plain_chat),
      cmocka_unit_test(test_byte_prompts),
      cmocka_unit_test(test_service_refuses_a_bad_model_dir),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  char path[256];
  snprintf(path, sizeof(path), "%s/model.json", g_dir);
  unlink(path);
  rmdir(g_dir);
  return failed;
}
