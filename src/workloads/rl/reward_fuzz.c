// SPDX-License-Identifier: Apache-2.0
//
// Fuzz target for the built-in RL rewards (reward.h): libFuzzer under clang
// with -DPCP_FUZZ=ON, otherwise a replay tool that ctest runs over
// tests/fuzz/rl_reward. The first byte picks a mode:
//   even: "<config JSON>\0<completion>\0<answer>": create must succeed or
//         fail with a status (never crash), and a created reward scores
//         every sample to a finite value or a status;
//   odd:  "<needle>\0<haystack>": contains / not_contains (both cases)
//         against a naive search, and the two always sum to 1.

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "workloads/workloads.h"

// libFuzzer fixes this name.
int LLVMFuzzerTestOneInput(  // NOLINT(readability-identifier-naming)
    const uint8_t* data, size_t size);

static pcp_string_view_t next_part(const char** cursor, const char* end) {
  const char* start = *cursor;
  const char* nul = memchr(start, '\0', (size_t)(end - start));
  const char* stop = nul ? nul : end;
  *cursor = nul ? nul + 1 : end;
  return pcp_make_string_view(start, (size_t)(stop - start));
}

static void score_all(const pcp_workloads_rl_reward_t* reward,
                      pcp_string_view_t completion, pcp_string_view_t answer) {
  pcp_workloads_rl_sample_t sample = {
      .prompt = pcp_make_cstring_view("p"),
      .completion = completion,
      .answer = answer,
      .completion_token_count = (int64_t)completion.size / 4,
  };
  for (int variant = 0; variant < 2; ++variant) {
    if (variant == 1) {
      sample.answer = pcp_make_string_view(NULL, 0);
      sample.completion_token_count = -1;
    }
    double value = NAN;
    pcp_status_t status =
        pcp_workloads_rl_reward_score(reward, &sample, &value);
    PCP_ASSERT(status || isfinite(value));
    PCP_ASSERT(!status || value == 0.0);
    pcp_status_ignore(status);
  }
}

static bool naive_contains(pcp_string_view_t hay, pcp_string_view_t needle,
                           bool fold) {
  for (size_t i = 0; i + needle.size <= hay.size; ++i) {
    size_t j = 0;
    for (; j < needle.size; ++j) {
      char a = hay.data[i + j], b = needle.data[j];
      if (fold && a >= 'A' && a <= 'Z')
        a = (char)(a - 'A' + 'a');
      if (fold && b >= 'A' && b <= 'Z')
        b = (char)(b - 'A' + 'a');
      if (a != b)
        break;
    }
    if (j == needle.size)
      return true;
  }
  return false;
}

static void fuzz_contains(pcp_string_view_t needle, pcp_string_view_t hay) {
  if (needle.size == 0 ||
      needle.size > PCP_WORKLOADS_RL_REWARD_MAX_TEXT_BYTES) {
    return;
  }
  for (int fold = 0; fold < 2; ++fold) {
    double sum = 0;
    for (int negate = 0; negate < 2; ++negate) {
      json_t* text = json_stringn(needle.data, needle.size);
      if (!text)
        return;  // not UTF-8: not a config JSON can hold
      json_t* config = json_pack("{s:s, s:o, s:b}", "type",
                                 negate ? "not_contains" : "contains", "text",
                                 text, "case_insensitive", fold);
      pcp_workloads_rl_reward_t* reward = NULL;
      PCP_CHECK_OK(pcp_workloads_rl_reward_create(
          config, NULL, pcp_allocator_system(), &reward));
      json_decref(config);
      pcp_workloads_rl_sample_t sample = {.completion = hay,
                                          .completion_token_count = -1};
      double value = NAN;
      PCP_CHECK_OK(pcp_workloads_rl_reward_score(reward, &sample, &value));
      bool want = naive_contains(hay, needle, fold) != (negate == 1);
      PCP_ASSERT(value == (want ? 1.0 : 0.0));
      sum += value;
      pcp_workloads_rl_reward_release(reward);
    }
    PCP_ASSERT(sum == 1.0);
  }
}

int LLVMFuzzerTestOneInput(  // NOLINT(readability-identifier-naming)
    const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  const char* cursor = (const char*)data + 1;
  const char* end = (const char*)data + size;
  pcp_string_view_t first = next_part(&cursor, end);
  if (data[0] % 2 == 1) {
    fuzz_contains(first, pcp_make_string_view(cursor, (size_t)(end - cursor)));
    return 0;
  }
  pcp_string_view_t completion = next_part(&cursor, end);
  pcp_string_view_t answer =
      pcp_make_string_view(cursor, (size_t)(end - cursor));
  pcp_workloads_rl_reward_t* reward = NULL;
  pcp_status_t status = pcp_workloads_rl_reward_create_from_string(
      first, NULL, pcp_allocator_system(), &reward);
  PCP_ASSERT(!status == (reward != NULL));
  pcp_status_ignore(status);
  if (reward)
    score_all(reward, completion, answer);
  pcp_workloads_rl_reward_release(reward);
  return 0;
}

#ifndef PCP_FUZZ_LIBFUZZER
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    void* data = NULL;
    size_t size = 0;
    pcp_status_t status = pcp_file_read_all(argv[i], 1u << 22, &data, &size);
    if (status) {
      char text[512];
      pcp_status_format(status, text, sizeof(text));
      fprintf(stderr, "rl_reward_fuzz: %s\n", text);
      pcp_status_ignore(status);
      return 1;
    }
    LLVMFuzzerTestOneInput(data, size);
    pcp_libc_free(data);
  }
  printf("rl_reward_fuzz: replayed %d input(s)\n", argc - 1);
  return 0;
}
#endif
