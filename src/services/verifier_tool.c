// SPDX-License-Identifier: Apache-2.0
//
// verifier_score_tool: drives the external reward verifier (services.h) for
// tests/integration/rl_verifier_test.py, which plays the verifier with
// Python's http.server. usage: verifier_score_tool CONFIG_JSON < batches.
// Each stdin line is a JSON array of items {"prompt", "completion",
// "answer" (optional), "metadata" (optional)}; each stdout line is
// {"rewards":[...]} or {"error": CODE, "message": text}. Lines are at most
// 4 MiB.

#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "services/services.h"

static json_t* score_line(pcp_workloads_rl_verifier_t* verifier,
                          const char* line, size_t length) {
  json_error_t error;
  json_t* batch = json_loadb(line, length, 0, &error);
  if (!json_is_array(batch) || json_array_size(batch) > 1024) {
    json_decref(batch);
    return json_pack("{s:s, s:s}", "error", "INVALID_ARGUMENT", "message",
                     "a line must be a JSON array of at most 1024 items");
  }
  size_t count = json_array_size(batch);
  pcp_workloads_rl_sample_t items[1024];
  double rewards[1024];
  for (size_t i = 0; i < count; ++i) {
    json_t* item = json_array_get(batch, i);
    json_t* prompt = json_object_get(item, "prompt");
    json_t* completion = json_object_get(item, "completion");
    json_t* answer = json_object_get(item, "answer");
    items[i] = (pcp_workloads_rl_sample_t){
        .prompt = pcp_make_string_view(json_string_value(prompt),
                                       json_string_length(prompt)),
        .completion = pcp_make_string_view(json_string_value(completion),
                                           json_string_length(completion)),
        .answer = json_is_string(answer)
                      ? pcp_make_string_view(json_string_value(answer),
                                             json_string_length(answer))
                      : pcp_make_string_view(NULL, 0),
        .completion_token_count = -1,
        .metadata = json_object_get(item, "metadata"),
    };
  }
  pcp_status_t status =
      pcp_workloads_rl_verifier_score_batch(verifier, items, count, rewards);
  json_t* result = NULL;
  if (status) {
    char text[2048];
    pcp_status_format_for_user(status, text, sizeof(text));
    result = json_pack("{s:s, s:s}", "error",
                       pcp_status_code_string(pcp_status_code(status)),
                       "message", text);
    pcp_status_ignore(status);
  } else {
    json_t* array = json_array();
    for (size_t i = 0; i < count; ++i) {
      json_array_append_new(array, json_real(rewards[i]));
    }
    result = json_pack("{s:o}", "rewards", array);
  }
  json_decref(batch);
  return result;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: verifier_score_tool CONFIG_JSON < batches\n");
    return 2;
  }
  json_error_t error;
  json_t* config = json_loads(argv[1], 0, &error);
  pcp_workloads_rl_verifier_t verifier;
  pcp_status_t status = pcp_services_verifier_create(
      config, NULL, pcp_allocator_system(), &verifier);
  json_decref(config);
  if (status) {
    char text[1024];
    pcp_status_format_for_user(status, text, sizeof(text));
    printf("{\"error\": \"%s\", \"create\": true}\n",
           pcp_status_code_string(pcp_status_code(status)));
    fprintf(stderr, "verifier_score_tool: %s\n", text);
    pcp_status_ignore(status);
    return 1;
  }
  size_t capacity = 4u << 20;
  char* line = NULL;
  PCP_CHECK_OK(
      pcp_allocator_malloc(pcp_allocator_system(), capacity, (void**)&line));
  while (fgets(line, (int)capacity, stdin)) {
    size_t length = strlen(line);
    if (length > 0 && line[length - 1] == '\n')
      line[--length] = '\0';
    if (length == 0)
      continue;
    json_t* result = score_line(&verifier, line, length);
    char* text = json_dumps(result, JSON_COMPACT);
    printf("%s\n", text ? text : "{\"error\":\"RESOURCE_EXHAUSTED\"}");
    fflush(stdout);
    pcp_libc_free(text);
    json_decref(result);
  }
  pcp_allocator_free(pcp_allocator_system(), line);
  pcp_workloads_rl_verifier_release(&verifier);
  return 0;
}
