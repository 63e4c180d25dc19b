// SPDX-License-Identifier: Apache-2.0
//
// reward_score_tool: scores JSON lines with the built-in rewards, for the
// Python reference test (tests/workloads/rl_reward_test.py). Each stdin line
// is {"reward": {...}, "completion": "...", "answer": "..." (optional),
// "tokens": n (optional)}; each stdout line is the reward (%.17g) or
// "error <CODE> <message>". Lines are at most 4 MiB.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "workloads/workloads.h"

static void score_line(const char* line, size_t length) {
  json_error_t error;
  json_t* input = json_loadb(line, length, 0, &error);
  if (!json_is_object(input)) {
    printf("error INVALID_ARGUMENT bad line: %s\n", error.text);
    json_decref(input);
    return;
  }
  pcp_workloads_rl_reward_t* reward = NULL;
  pcp_status_t status = pcp_workloads_rl_reward_create(
      json_object_get(input, "reward"), NULL, pcp_allocator_system(), &reward);
  double value = 0;
  if (!status) {
    json_t* completion = json_object_get(input, "completion");
    json_t* answer = json_object_get(input, "answer");
    json_t* tokens = json_object_get(input, "tokens");
    pcp_workloads_rl_sample_t sample = {
        .prompt = pcp_make_cstring_view(""),
        .completion = pcp_make_string_view(json_string_value(completion),
                                           json_string_length(completion)),
        .answer = answer ? pcp_make_string_view(json_string_value(answer),
                                                json_string_length(answer))
                         : pcp_make_string_view(NULL, 0),
        .completion_token_count =
            tokens ? (int64_t)json_integer_value(tokens) : -1,
    };
    status = pcp_workloads_rl_reward_score(reward, &sample, &value);
  }
  if (status) {
    char text[512];
    pcp_status_format_for_user(status, text, sizeof(text));
    printf("error %s %s\n", pcp_status_code_string(pcp_status_code(status)),
           text);
    pcp_status_ignore(status);
  } else {
    printf("%.17g\n", value);
  }
  pcp_workloads_rl_reward_release(reward);
  json_decref(input);
}

int main(void) {
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
    score_line(line, length);
    fflush(stdout);
  }
  pcp_allocator_free(pcp_allocator_system(), line);
  return 0;
}
