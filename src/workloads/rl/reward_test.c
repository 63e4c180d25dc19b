// SPDX-License-Identifier: Apache-2.0
// Built-in RL rewards (reward.h): every type on its edge cases, sums with
// weights and nesting, config refusals naming the key path, inputs at and
// past the limits, the verifier adapter, scoring from several threads, and
// an out-of-memory sweep over create.

#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "workloads/workloads.h"

static void expect_code_at(pcp_status_t status, pcp_status_code_t code,
                           const char* needle, const char* file, int line) {
  char text[1024] = "";
  pcp_status_format(status, text, sizeof(text));
  if (pcp_status_code(status) != code || (needle && !strstr(text, needle))) {
    print_error("%s:%d: want %s naming '%s', got %s\n", file, line,
                pcp_status_code_string(code), needle ? needle : "", text);
    pcp_status_ignore(status);
    fail();
  }
  pcp_status_ignore(status);
}
#define EXPECT_CODE(expr, code, needle) \
  expect_code_at((expr), (code), (needle), __FILE__, __LINE__)
#define EXPECT_OK(expr) EXPECT_CODE((expr), PCP_STATUS_OK, NULL)

static pcp_workloads_rl_reward_t* make(const char* config) {
  pcp_workloads_rl_reward_t* reward = NULL;
  EXPECT_OK(pcp_workloads_rl_reward_create_from_string(
      pcp_make_cstring_view(config), NULL, pcp_allocator_system(), &reward));
  assert_non_null(reward);
  return reward;
}

// Refused config: the status names |needle| (a key path, usually).
static void refuse(const char* config, const char* needle) {
  pcp_workloads_rl_reward_t* reward = NULL;
  pcp_status_t status = pcp_workloads_rl_reward_create_from_string(
      pcp_make_cstring_view(config), NULL, pcp_allocator_system(), &reward);
  char text[1024] = "";
  pcp_status_format(status, text, sizeof(text));
  if (pcp_status_code(status) != PCP_STATUS_INVALID_ARGUMENT ||
      !strstr(text, needle)) {
    print_error("config %s: want INVALID_ARGUMENT naming '%s', got %s\n",
                config, needle, text);
    pcp_status_ignore(status);
    fail();
  }
  pcp_status_ignore(status);
  assert_null(reward);
}

static pcp_workloads_rl_sample_t sample(const char* completion,
                                        const char* answer) {
  pcp_workloads_rl_sample_t s = {
      .prompt = pcp_make_cstring_view("Q"),
      .completion = pcp_make_cstring_view(completion),
      .answer = answer ? pcp_make_cstring_view(answer)
                       : pcp_make_string_view(NULL, 0),
      .completion_token_count = -1,
  };
  return s;
}

static double score(const pcp_workloads_rl_reward_t* reward,
                    const char* completion, const char* answer) {
  pcp_workloads_rl_sample_t s = sample(completion, answer);
  double value = -42.0;
  EXPECT_OK(pcp_workloads_rl_reward_score(reward, &s, &value));
  return value;
}

static void test_exact_match(void** state) {
  (void)state;
  pcp_workloads_rl_reward_t* r = make("{\"type\":\"exact_match\"}");
  assert_true(score(r, "Paris", "Paris") == 1.0);
  assert_true(score(r, "  Paris\n", "Paris ") == 1.0);  // trimmed both sides
  assert_true(score(r, "paris", "Paris") == 0.0);       // case kept
  assert_true(score(r, "Paris.", "Paris") == 0.0);
  assert_true(score(r, "", "") == 1.0);
  assert_true(score(r, "", "Paris") == 0.0);
  assert_true(score(r, " \t\n", "") == 1.0);
  // No answer: an error naming the key path, never a zero.
  pcp_workloads_rl_sample_t s = sample("Paris", NULL);
  double value = 7;
  EXPECT_CODE(pcp_workloads_rl_reward_score(r, &s, &value),
              PCP_STATUS_FAILED_PRECONDITION, "reward: exact_match needs");
  assert_true(value == 0.0);
  pcp_workloads_rl_reward_release(r);

  r = make(
      "{\"type\":\"exact_match\",\"trim\":false,"
      "\"case_insensitive\":true}");
  assert_true(score(r, "PARIS", "paris") == 1.0);
  assert_true(score(r, "Paris ", "Paris") == 0.0);
  // Case folding is ASCII only: UTF-8 bytes compare as they are.
  assert_true(score(r, "\xc3\x89t\xc3\xa9", "\xc3\xa9t\xc3\xa9") == 0.0);
  pcp_workloads_rl_reward_release(r);
}

static void test_numeric(void** state) {
  (void)state;
  pcp_workloads_rl_reward_t* r = make("{\"type\":\"numeric\"}");
  assert_true(score(r, "The answer is 42.", "42") == 1.0);
  assert_true(score(r, "7 apples, then 42", "42.0") == 1.0);
  assert_true(score(r, "42 then 7", "42") == 0.0);  // the last number counts
  assert_true(score(r, "x = -3.5", "-3.5") == 1.0);
  assert_true(score(r, "5-3", "-3") == 0.0);  // a sign glued to a word is not
  assert_true(score(r, "5-3", "3") == 1.0);
  assert_true(score(r, "total: 1,234,567 units", "1234567") == 1.0);
  assert_true(score(r, "pairs 1,2", "2") == 1.0);  // not a thousands group
  assert_true(score(r, "about 6.02e23", "6.02e23") == 1.0);
  assert_true(score(r, "about 6.02e23", "602000000000000000000000") == 1.0);
  assert_true(score(r, "see .5", "0.5") == 1.0);
  assert_true(score(r, "42.0000001", "42") == 1.0);  // within 1e-6
  assert_true(score(r, "42.00001", "42") == 0.0);    // outside
  assert_true(score(r, "", "42") == 0.0);            // empty completion
  assert_true(score(r, "no number here", "1") == 0.0);
  assert_true(score(r, "1e999", "1") == 0.0);  // overflows: never matches
  assert_true(score(r, "NaN", "0") == 0.0);
  assert_true(score(r, "x\n\n#### 18", " 18\n") == 1.0);  // answer trimmed
  // A number longer than the bound never matches, even when it would.
  char* long_number = calloc(1, 600);
  memset(long_number, '0', 598);
  long_number[598] = '7';
  assert_true(score(r, long_number, "7") == 0.0);
  free(long_number);

  // Answers that are not finite numbers are the caller's error.
  const char* bad_answers[] = {"nan", "inf",       "-inf", "1e999", "",
                               "  ",  "42 apples", "four", "0x10"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(bad_answers); ++i) {
    pcp_workloads_rl_sample_t s = sample("42", bad_answers[i]);
    double value = 0;
    EXPECT_CODE(pcp_workloads_rl_reward_score(r, &s, &value),
                PCP_STATUS_INVALID_ARGUMENT, "is not a finite number");
  }
  pcp_workloads_rl_sample_t s = sample("42", NULL);
  double value = 0;
  EXPECT_CODE(pcp_workloads_rl_reward_score(r, &s, &value),
              PCP_STATUS_FAILED_PRECONDITION, "numeric needs an answer");
  pcp_workloads_rl_reward_release(r);

  r = make("{\"type\":\"numeric\",\"tolerance\":0.5}");
  assert_true(score(r, "9.6", "10") == 1.0);
  assert_true(score(r, "9.4", "10") == 0.0);
  pcp_workloads_rl_reward_release(r);
  r = make(
      "{\"type\":\"numeric\",\"tolerance\":0,\"relative_tolerance\":0.01}");
  assert_true(score(r, "1005", "1000") == 1.0);
  assert_true(score(r, "1011", "1000") == 0.0);
  assert_true(score(r, "0", "0") == 1.0);
  pcp_workloads_rl_reward_release(r);
}

static void test_regex(void** state) {
  (void)state;
  pcp_workloads_rl_reward_t* r =
      make("{\"type\":\"regex\",\"pattern\":\"^answer: [0-9]+$\"}");
  assert_true(score(r, "answer: 12", NULL) == 1.0);
  assert_true(score(r, "Answer: 12", NULL) == 0.0);
  assert_true(score(r, "so\nanswer: 12", NULL) == 0.0);  // ^ is the start
  assert_true(score(r, "", NULL) == 0.0);
  pcp_workloads_rl_reward_release(r);

  r = make(
      "{\"type\":\"regex\",\"pattern\":\"^answer: [0-9]+$\","
      "\"flags\":\"im\"}");
  assert_true(score(r, "so\nANSWER: 12\nbye", NULL) == 1.0);
  pcp_workloads_rl_reward_release(r);

  r = make("{\"type\":\"regex\",\"pattern\":\"(cat|dog)s?\\\\b\"}");
  assert_true(score(r, "two dogs", NULL) == 1.0);
  assert_true(score(r, "a catalogue", NULL) == 0.0);
  pcp_workloads_rl_reward_release(r);

  // The match is bounded by the view: a NUL inside does not end the text,
  // and bytes past the view are not read.
  r = make("{\"type\":\"regex\",\"pattern\":\"end$\"}");
  pcp_workloads_rl_sample_t s = sample("", NULL);
  s.completion = pcp_make_string_view("a\0b end", 7);
  double value = 0;
  EXPECT_OK(pcp_workloads_rl_reward_score(r, &s, &value));
  assert_true(value == 1.0);
  s.completion = pcp_make_string_view("the end!", 6);  // "the en"
  EXPECT_OK(pcp_workloads_rl_reward_score(r, &s, &value));
  assert_true(value == 0.0);
  pcp_workloads_rl_reward_release(r);
  // Past max_input_bytes (16 KiB by default) a regex refuses the text.
  r = make("{\"type\":\"regex\",\"pattern\":\"b$\"}");
  char* text = calloc(1, 16385);
  memset(text, 'a', 16384);
  text[16383] = 'b';
  s.completion = pcp_make_string_view(text, 16384);
  EXPECT_OK(pcp_workloads_rl_reward_score(r, &s, &value));
  assert_true(value == 1.0);
  text[16384] = 'b';
  s.completion = pcp_make_string_view(text, 16385);
  EXPECT_CODE(pcp_workloads_rl_reward_score(r, &s, &value),
              PCP_STATUS_INVALID_ARGUMENT,
              "reward: the completion is 16385 bytes, longer than "
              "max_input_bytes 16384");
  pcp_workloads_rl_reward_release(r);
  r = make("{\"type\":\"regex\",\"pattern\":\"b$\",\"max_input_bytes\":16385}");
  EXPECT_OK(pcp_workloads_rl_reward_score(r, &s, &value));
  assert_true(value == 1.0);
  pcp_workloads_rl_reward_release(r);
  free(text);
  refuse("{\"type\":\"regex\",\"pattern\":\"b\",\"max_input_bytes\":0}",
         "reward.max_input_bytes: must be an integer in [1, 1048576]");
  // The empty pattern is refused, an empty completion matches ".*"-likes.
  r = make("{\"type\":\"regex\",\"pattern\":\"^$\"}");
  assert_true(score(r, "", NULL) == 1.0);
  pcp_workloads_rl_reward_release(r);
}

static void test_contains(void** state) {
  (void)state;
  pcp_workloads_rl_reward_t* r =
      make("{\"type\":\"contains\",\"text\":\"abab\"}");
  assert_true(score(r, "xxabaabab", NULL) == 1.0);  // needs the failure table
  assert_true(score(r, "xxabaaba", NULL) == 0.0);
  assert_true(score(r, "ABAB", NULL) == 0.0);
  assert_true(score(r, "", NULL) == 0.0);
  assert_true(score(r, "aba", NULL) == 0.0);
  pcp_workloads_rl_reward_release(r);
  r = make(
      "{\"type\":\"contains\",\"text\":\"Hello\","
      "\"case_insensitive\":true}");
  assert_true(score(r, "oh, hELLo there", NULL) == 1.0);
  assert_true(score(r, "oh, hELL there", NULL) == 0.0);
  pcp_workloads_rl_reward_release(r);
  r = make("{\"type\":\"not_contains\",\"text\":\"sorry\"}");
  assert_true(score(r, "", NULL) == 1.0);
  assert_true(score(r, "I am sorry", NULL) == 0.0);
  assert_true(score(r, "I am Sorry", NULL) == 1.0);
  pcp_workloads_rl_reward_release(r);
}

static void test_length(void** state) {
  (void)state;
  pcp_workloads_rl_reward_t* r =
      make("{\"type\":\"length\",\"min_tokens\":2,\"max_tokens\":4}");
  pcp_workloads_rl_sample_t s = sample("whatever", NULL);
  double value = 0;
  int64_t counts[] = {0, 1, 2, 3, 4, 5};
  double want[] = {0, 0, 1, 1, 1, 0};
  for (size_t i = 0; i < PCP_ARRAYSIZE(counts); ++i) {
    s.completion_token_count = counts[i];
    EXPECT_OK(pcp_workloads_rl_reward_score(r, &s, &value));
    assert_true(value == want[i]);
  }
  s.completion_token_count = -1;
  EXPECT_CODE(pcp_workloads_rl_reward_score(r, &s, &value),
              PCP_STATUS_FAILED_PRECONDITION, "token count");
  pcp_workloads_rl_reward_release(r);

  // Characters are code points: "été" is 3, not 5 bytes.
  r = make("{\"type\":\"length\",\"min_chars\":3,\"max_chars\":3}");
  assert_true(score(r, "\xc3\xa9t\xc3\xa9", NULL) == 1.0);
  assert_true(score(r, "ab", NULL) == 0.0);
  assert_true(score(r, "abcd", NULL) == 0.0);
  assert_true(score(r, "", NULL) == 0.0);
  pcp_workloads_rl_reward_release(r);
  r = make("{\"type\":\"length\",\"max_chars\":0}");
  assert_true(score(r, "", NULL) == 1.0);
  assert_true(score(r, "a", NULL) == 0.0);
  pcp_workloads_rl_reward_release(r);
}

static void test_sum(void** state) {
  (void)state;
  pcp_workloads_rl_reward_t* r = make(
      "{\"type\":\"sum\",\"terms\":["
      "{\"weight\":1.0,\"reward\":{\"type\":\"numeric\"}},"
      "{\"weight\":0.25,\"reward\":{\"type\":\"regex\",\"pattern\":"
      "\"#### [0-9]+$\"}},"
      "{\"weight\":-0.5,\"reward\":{\"type\":\"contains\",\"text\":\"sorry\"}},"
      "{\"reward\":{\"type\":\"sum\",\"terms\":[{\"weight\":0.125,\"reward\":"
      "{\"type\":\"length\",\"max_chars\":20}}]}}]}");
  assert_true(score(r, "#### 18", "18") == 1.0 + 0.25 + 0.125);
  assert_true(score(r, "sorry, 17", "18") == -0.5 + 0.125);
  assert_true(score(r, "a very long answer that is 18", "18") == 1.0);
  // An error inside names the full key path.
  pcp_workloads_rl_sample_t s = sample("18", NULL);
  double value = 0;
  EXPECT_CODE(pcp_workloads_rl_reward_score(r, &s, &value),
              PCP_STATUS_FAILED_PRECONDITION, "reward.terms[0].reward:");
  pcp_workloads_rl_reward_release(r);
}

static void test_config_refusals(void** state) {
  (void)state;
  refuse("[]", "reward: must be an object");
  refuse("{", "reward: not JSON");
  refuse("{}", "reward.type: is required");
  refuse("{\"type\":3}", "reward.type: must be a string");
  refuse("{\"type\":\"bleu\"}", "reward.type: unknown reward type");
  refuse("{\"type\":\"verifier\",\"url\":\"http://x\"}",
         "pcp_services_verifier_create");
  refuse("{\"type\":\"exact_match\",\"trimm\":true}",
         "reward.trimm: unknown key");
  refuse("{\"type\":\"exact_match\",\"trim\":1}",
         "reward.trim: must be true or false");
  refuse("{\"type\":\"numeric\",\"tolerance\":-1}",
         "reward.tolerance: -1 is out of range");
  refuse("{\"type\":\"numeric\",\"tolerance\":\"1\"}",
         "reward.tolerance: must be a number");
  refuse("{\"type\":\"numeric\",\"relative_tolerance\":2}",
         "reward.relative_tolerance");
  refuse("{\"type\":\"regex\"}", "reward.pattern: is required");
  refuse("{\"type\":\"regex\",\"pattern\":\"\"}",
         "reward.pattern: must not be empty");
  refuse("{\"type\":\"regex\",\"pattern\":\"(a\"}",
         "reward.pattern: does not compile");
  refuse("{\"type\":\"regex\",\"pattern\":\"(a)\\\\1\"}", "back-references");
  refuse("{\"type\":\"regex\",\"pattern\":\"\\\\d+\"}", "no \\d");
  // Nested counts multiply the automaton glibc builds: refused before
  // regcomp spends seconds and GiBs on it.
  refuse("{\"type\":\"regex\",\"pattern\":\"((a{100}){100}){100}\"}",
         "reward.pattern: expands to more than 100000 states");
  refuse("{\"type\":\"regex\",\"pattern\":\"(a{32767}){32767}\"}",
         "expands to more than 100000 states");
  refuse("{\"type\":\"regex\",\"pattern\":\"(((x|[a-z]{9}){400,}){30})+\"}",
         "expands to more than 100000 states");
  pcp_workloads_rl_reward_release(
      make("{\"type\":\"regex\",\"pattern\":\"(a{100}){100}\"}"));
  // Adjacent repetition operators: undefined in POSIX, exponential in glibc.
  refuse("{\"type\":\"regex\",\"pattern\":\"^e*+++++++e\"}",
         "reward.pattern: adjacent repetition operators");
  refuse("{\"type\":\"regex\",\"pattern\":\"a{2}{3}\"}",
         "adjacent repetition operators");
  refuse("{\"type\":\"regex\",\"pattern\":\"a?*\"}",
         "adjacent repetition operators");
  pcp_workloads_rl_reward_release(
      make("{\"type\":\"regex\",\"pattern\":\"(a*)+[*+]\\\\+x{2}\"}"));
  pcp_workloads_rl_reward_release(
      make("{\"type\":\"regex\",\"pattern\":\"[]{}[:digit:]]{3}x{2,}\"}"));
  refuse("{\"type\":\"regex\",\"pattern\":\"a\",\"flags\":\"x\"}",
         "reward.flags: unknown flag");
  refuse("{\"type\":\"regex\",\"pattern\":\"a\",\"flags\":\"ii\"}",
         "reward.flags");
  refuse("{\"type\":\"regex\",\"pattern\":\"a\\u0000b\"}", "NUL");
  refuse("{\"type\":\"contains\"}", "reward.text: is required");
  refuse("{\"type\":\"not_contains\",\"text\":\"\"}",
         "reward.text: must not be empty");
  refuse("{\"type\":\"length\"}", "needs at least one of");
  refuse("{\"type\":\"length\",\"min_tokens\":-1}", "reward.min_tokens");
  refuse("{\"type\":\"length\",\"max_chars\":1.5}", "reward.max_chars");
  refuse("{\"type\":\"length\",\"min_tokens\":5,\"max_tokens\":4}",
         "reward.min_tokens: is greater than max_tokens");
  refuse("{\"type\":\"sum\"}", "reward.terms: is required");
  refuse("{\"type\":\"sum\",\"terms\":[]}", "reward.terms: must have 1 to 16");
  refuse("{\"type\":\"sum\",\"terms\":[1]}",
         "reward.terms[0]: must be an object");
  refuse("{\"type\":\"sum\",\"terms\":[{\"weight\":1}]}",
         "reward.terms[0].reward: is required");
  refuse(
      "{\"type\":\"sum\",\"terms\":[{\"reward\":{\"type\":\"exact_match\"},"
      "\"wieght\":1}]}",
      "reward.terms[0].wieght: unknown key");
  refuse(
      "{\"type\":\"sum\",\"terms\":[{\"weight\":1e7,\"reward\":{\"type\":"
      "\"exact_match\"}}]}",
      "reward.terms[0].weight");
  refuse(
      "{\"type\":\"sum\",\"terms\":[{\"reward\":{\"type\":\"exact_match\"}},"
      "{\"reward\":{\"type\":\"regex\",\"pattern\":\"[\"}}]}",
      "reward.terms[1].reward.pattern: does not compile");
  refuse("{\"type\":\"exact_match\",\"type\":\"numeric\"}", "not JSON");

  // Depth: four nested sums are fine, five are not.
  char config[1024] = "";
  for (int depth = 1; depth <= 5; ++depth) {
    snprintf(config, sizeof(config), "%s", "");
    for (int i = 0; i < depth; ++i) {
      strcat(config, "{\"type\":\"sum\",\"terms\":[{\"reward\":");
    }
    strcat(config, "{\"type\":\"exact_match\"}");
    for (int i = 0; i < depth; ++i) strcat(config, "}]}");
    pcp_workloads_rl_reward_t* r = NULL;
    pcp_status_t status = pcp_workloads_rl_reward_create_from_string(
        pcp_make_cstring_view(config), NULL, pcp_allocator_system(), &r);
    if (depth <= 4) {
      EXPECT_OK(status);
      assert_true(score(r, "a", "a") == 1.0);
    } else {
      EXPECT_CODE(status, PCP_STATUS_INVALID_ARGUMENT,
                  "reward.terms[0].reward.terms[0].reward.terms[0].reward."
                  "terms[0].reward: sums nest deeper than 4");
    }
    pcp_workloads_rl_reward_release(r);
  }
  // Terms: 16 fine, 17 refused; and the node bound across a tree.
  json_t* sum = json_pack("{s:s, s:[]}", "type", "sum", "terms");
  for (int i = 0; i < 17; ++i) {
    json_array_append_new(
        json_object_get(sum, "terms"),
        json_pack("{s:{s:s}}", "reward", "type", "exact_match"));
  }
  pcp_workloads_rl_reward_t* r = NULL;
  EXPECT_CODE(pcp_workloads_rl_reward_create(sum, "exp.reward",
                                             pcp_allocator_system(), &r),
              PCP_STATUS_INVALID_ARGUMENT, "exp.reward.terms: must have 1");
  json_array_remove(json_object_get(sum, "terms"), 16);
  EXPECT_OK(pcp_workloads_rl_reward_create(sum, "exp.reward",
                                           pcp_allocator_system(), &r));
  pcp_workloads_rl_reward_release(r);
  json_t* outer = json_pack("{s:s, s:[]}", "type", "sum", "terms");
  for (int i = 0; i < 4; ++i) {
    json_array_append_new(json_object_get(outer, "terms"),
                          json_pack("{s:O}", "reward", sum));
  }
  EXPECT_CODE(
      pcp_workloads_rl_reward_create(outer, NULL, pcp_allocator_system(), &r),
      PCP_STATUS_INVALID_ARGUMENT, "more than 64 rewards");
  assert_null(r);
  json_decref(outer);
  json_decref(sum);
  // Config text past its cap.
  size_t big = PCP_WORKLOADS_RL_REWARD_MAX_CONFIG_BYTES + 1;
  char* text = calloc(1, big + 1);
  memset(text, ' ', big);
  text[0] = '{';
  text[big - 1] = '}';
  EXPECT_CODE(
      pcp_workloads_rl_reward_create_from_string(
          pcp_make_string_view(text, big), NULL, pcp_allocator_system(), &r),
      PCP_STATUS_INVALID_ARGUMENT, "longer than 65536");
  free(text);
  // Pattern and text at and past their caps.
  char* pattern = calloc(1, PCP_WORKLOADS_RL_REWARD_MAX_PATTERN_BYTES + 64);
  strcpy(pattern, "{\"type\":\"regex\",\"pattern\":\"");
  size_t at = strlen(pattern);
  memset(pattern + at, 'a', PCP_WORKLOADS_RL_REWARD_MAX_PATTERN_BYTES);
  strcpy(pattern + at + PCP_WORKLOADS_RL_REWARD_MAX_PATTERN_BYTES, "\"}");
  r = make(pattern);
  pcp_workloads_rl_reward_release(r);
  memset(pattern + at, 'a', PCP_WORKLOADS_RL_REWARD_MAX_PATTERN_BYTES + 1);
  strcpy(pattern + at + PCP_WORKLOADS_RL_REWARD_MAX_PATTERN_BYTES + 1, "\"}");
  refuse(pattern, "reward.pattern: is 1025 bytes, longer than 1024");
  free(pattern);
}

static void test_input_limits(void** state) {
  (void)state;
  pcp_workloads_rl_reward_t* r = make(
      "{\"type\":\"sum\",\"terms\":["
      "{\"reward\":{\"type\":\"contains\",\"text\":\"needle\","
      "\"case_insensitive\":true}},"
      "{\"reward\":{\"type\":\"regex\",\"pattern\":\"NEEDLE [0-9]+$\","
      "\"max_input_bytes\":1048576}},"
      "{\"reward\":{\"type\":\"numeric\"}},"
      "{\"reward\":{\"type\":\"length\",\"min_chars\":1048576}}]}");
  size_t n = PCP_WORKLOADS_RL_REWARD_MAX_INPUT_BYTES;
  char* text = malloc(n + 2);
  // A completion of exactly the cap, "aaaa...NEEDLE 9" at its end.
  memset(text, 'a', n);
  memcpy(text + n - 8, "NEEDLE 9", 8);
  text[n] = '\0';
  pcp_workloads_rl_sample_t s = sample("", "9");
  s.completion = pcp_make_string_view(text, n);
  double value = 0;
  EXPECT_OK(pcp_workloads_rl_reward_score(r, &s, &value));
  assert_true(value == 4.0);
  // One byte more: refused before any work, naming what and the limit.
  s.completion = pcp_make_string_view(text, n + 1);
  EXPECT_CODE(pcp_workloads_rl_reward_score(r, &s, &value),
              PCP_STATUS_INVALID_ARGUMENT,
              "reward: the completion is 1048577 bytes, longer than 1048576");
  s.completion = pcp_make_string_view("x", 1);
  s.prompt = pcp_make_string_view(text, n + 1);
  EXPECT_CODE(pcp_workloads_rl_reward_score(r, &s, &value),
              PCP_STATUS_INVALID_ARGUMENT, "the prompt is");
  s.prompt = pcp_make_string_view("", 0);
  s.answer = pcp_make_string_view(text, n + 1);
  EXPECT_CODE(pcp_workloads_rl_reward_score(r, &s, &value),
              PCP_STATUS_INVALID_ARGUMENT, "the answer is");
  // A completion of a million digits: one number past the bound.
  memset(text, '9', n);
  s.answer = pcp_make_cstring_view("9");
  s.completion = pcp_make_string_view(text, n);
  EXPECT_OK(pcp_workloads_rl_reward_score(r, &s, &value));
  assert_true(value == 1.0);  // only the length window holds
  free(text);
  pcp_workloads_rl_reward_release(r);
}

typedef struct thread_arg_t {
  const pcp_workloads_rl_reward_t* reward;
  int failures;
} thread_arg_t;

static void* score_loop(void* opaque) {
  thread_arg_t* arg = opaque;
  char completion[64];
  for (int i = 0; i < 2000; ++i) {
    snprintf(completion, sizeof(completion), "HeLLo, result %d", i % 10);
    pcp_workloads_rl_sample_t s = sample(completion, "3");
    double value = 0;
    pcp_status_t status =
        pcp_workloads_rl_reward_score(arg->reward, &s, &value);
    double want = 1.0 + (i % 10 == 3 ? 2.0 : 0.0);
    if (status || value != want)
      arg->failures++;
    pcp_status_ignore(status);
  }
  return NULL;
}

static void test_threads_and_verifier(void** state) {
  (void)state;
  pcp_workloads_rl_reward_t* r = make(
      "{\"type\":\"sum\",\"terms\":["
      "{\"reward\":{\"type\":\"contains\",\"text\":\"hello\","
      "\"case_insensitive\":true}},"
      "{\"weight\":2,\"reward\":{\"type\":\"regex\",\"pattern\":"
      "\"result 3$\",\"flags\":\"i\"}}]}");
  pthread_t threads[4];
  thread_arg_t args[4];
  for (int i = 0; i < 4; ++i) {
    args[i] = (thread_arg_t){.reward = r};
    assert_int_equal(pthread_create(&threads[i], NULL, score_loop, &args[i]),
                     0);
  }
  for (int i = 0; i < 4; ++i) {
    pthread_join(threads[i], NULL);
    assert_int_equal(args[i].failures, 0);
  }
  // The verifier adapter scores a batch and stops at the first bad item.
  pcp_workloads_rl_verifier_t v = pcp_workloads_rl_reward_verifier(r);
  pcp_workloads_rl_sample_t items[3] = {sample("hello result 3", NULL),
                                        sample("bye", NULL),
                                        sample("HELLO", NULL)};
  double rewards[3];
  EXPECT_OK(pcp_workloads_rl_verifier_score_batch(&v, items, 3, rewards));
  assert_true(rewards[0] == 3.0 && rewards[1] == 0.0 && rewards[2] == 1.0);
  items[1].completion =
      pcp_make_string_view("x", PCP_WORKLOADS_RL_REWARD_MAX_INPUT_BYTES + 1);
  EXPECT_CODE(pcp_workloads_rl_verifier_score_batch(&v, items, 3, rewards),
              PCP_STATUS_INVALID_ARGUMENT, "item 1");
  pcp_workloads_rl_verifier_release(&v);
  assert_null(v.score_batch);
  EXPECT_CODE(pcp_workloads_rl_verifier_score_batch(&v, items, 3, rewards),
              PCP_STATUS_FAILED_PRECONDITION, "no reward verifier");
  pcp_workloads_rl_reward_release(r);
}

// A verifier that breaks the contract (a NaN reward) is caught.
static pcp_status_t nan_batch(void* self,
                              const pcp_workloads_rl_sample_t* items,
                              size_t count, double* out_rewards) {
  (void)self;
  (void)items;
  for (size_t i = 0; i < count; ++i) out_rewards[i] = i == 1 ? NAN : 1.0;
  return NULL;
}

static void test_verifier_contract(void** state) {
  (void)state;
  pcp_workloads_rl_verifier_t v = {.score_batch = nan_batch};
  pcp_workloads_rl_sample_t items[2] = {sample("a", NULL), sample("b", NULL)};
  double rewards[2];
  EXPECT_CODE(pcp_workloads_rl_verifier_score_batch(&v, items, 2, rewards),
              PCP_STATUS_INTERNAL, "item 1");
}

// Every allocation of create and score fails once in turn: a clean error,
// no leak (the counting allocator ends at zero bytes).
static void test_oom_sweep(void** state) {
  (void)state;
  const char* config =
      "{\"type\":\"sum\",\"terms\":["
      "{\"reward\":{\"type\":\"contains\",\"text\":\"x\"}},"
      "{\"reward\":{\"type\":\"regex\",\"pattern\":\"a+\"}},"
      "{\"reward\":{\"type\":\"sum\",\"terms\":[{\"reward\":"
      "{\"type\":\"not_contains\",\"text\":\"y\"}}]}}]}";
  bool succeeded = false;
  for (int64_t fail_at = 0; fail_at < 64 && !succeeded; ++fail_at) {
    pcp_allocator_counting_t counting;
    pcp_allocator_counting_initialize(pcp_allocator_system(), &counting);
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_counting(&counting), fail_at,
                                     false, &failing);
    pcp_workloads_rl_reward_t* r = NULL;
    pcp_status_t status = pcp_workloads_rl_reward_create_from_string(
        pcp_make_cstring_view(config), NULL, pcp_allocator_failing(&failing),
        &r);
    if (status) {
      assert_int_equal(pcp_status_code(status), PCP_STATUS_RESOURCE_EXHAUSTED);
      pcp_status_ignore(status);
      assert_null(r);
    } else {
      // Scoring allocates too (the regex's copy of the text): the same
      // failure there is a status, not a wrong reward.
      pcp_workloads_rl_sample_t s = sample("aaa x", NULL);
      double value = -1;
      status = pcp_workloads_rl_reward_score(r, &s, &value);
      if (status) {
        assert_int_equal(pcp_status_code(status),
                         PCP_STATUS_RESOURCE_EXHAUSTED);
        assert_true(value == 0.0);
        pcp_status_ignore(status);
      } else {
        assert_true(value == 3.0);
        succeeded = true;
      }
      pcp_workloads_rl_reward_release(r);
    }
    assert_int_equal(atomic_load(&counting.live_bytes), 0);
  }
  assert_true(succeeded);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exact_match),
      cmocka_unit_test(test_numeric),
      cmocka_unit_test(test_regex),
      cmocka_unit_test(test_contains),
      cmocka_unit_test(test_length),
      cmocka_unit_test(test_sum),
      cmocka_unit_test(test_config_refusals),
      cmocka_unit_test(test_input_limits),
      cmocka_unit_test(test_threads_and_verifier),
      cmocka_unit_test(test_verifier_contract),
      cmocka_unit_test(test_oom_sweep),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
