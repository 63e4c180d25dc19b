// SPDX-License-Identifier: Apache-2.0
//
// The RL experiment (experiment.c) and prompts (prompts.c): every key's range
// and its error text, the defaults, path confinement, the JSONL edge cases
// and the per-iteration selection.

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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "workloads/workloads.h"

// Every test runs in a fresh state dir (the working directory) that is the
// data and model root; outside/ is a sibling directory outside every root.
static char g_state_dir[PATH_MAX];
static char g_outside_dir[PATH_MAX];
static pcp_workloads_train_policy_t g_policy;

static void write_file(const char* path, const char* text) {
  assert_true(!pcp_file_write_atomic(path, text, strlen(text)));
}

static int setup(void** state) {
  (void)state;
  char dir[] = "/tmp/pcp-rl-experiment-test-XXXXXX";
  char outside[] = "/tmp/pcp-rl-outside-XXXXXX";
  if (!mkdtemp(dir) || !realpath(dir, g_state_dir) || chdir(g_state_dir) ||
      !mkdtemp(outside) || !realpath(outside, g_outside_dir)) {
    return -1;
  }
  mkdir("data", 0755);
  mkdir("served", 0755);
  write_file("data/p.jsonl", "{\"prompt\":\"hi\",\"answer\":\"4\"}\n");
  write_file("data/eval.jsonl", "{\"prompt\":\"ho\"}\n");
  write_file("model.safetensors", "x");
  write_file("model-00001-of-00002.safetensors", "x");
  write_file("weights.bin", "x");
  char path[PATH_MAX + 32];
  snprintf(path, sizeof(path), "%s/p.jsonl", g_outside_dir);
  write_file(path, "{\"prompt\":\"secret\"}\n");
  // A link inside the root that points outside it.
  if (symlink(path, "data/link.jsonl") != 0)
    return -1;
  pcp_workloads_train_policy_config_t file;
  memset(&file, 0, sizeof(file));
  file.state_dir = g_state_dir;
  char* roots[] = {g_state_dir};
  file.data_roots = (pcp_string_list_t){.items = roots, .count = 1};
  file.model_roots = (pcp_string_list_t){.items = roots, .count = 1};
  pcp_status_t status = pcp_workloads_train_policy_initialize(
      &file, NULL, (uint64_t)8 << 30, &g_policy);
  return !status ? 0 : -1;
}

static int teardown(void** state) {
  (void)state;
  pcp_workloads_train_policy_deinitialize(&g_policy);
  char command[2 * PATH_MAX + 32];
  snprintf(command, sizeof(command), "rm -rf '%s' '%s'", g_state_dir,
           g_outside_dir);
  return system(command) == 0 ? 0 : -1;
}

// The smallest valid experiment, with |extra| (",\"key\":value..." or "")
// appended to its keys.
#define BASE                                                                 \
  "\"prompts_path\":\"data/p.jsonl\",\"reward\":{\"type\":\"exact_match\"}," \
  "\"base_model\":{\"served_model_dir\":\"served\"}"

static pcp_status_t parse_text(const char* text,
                               pcp_workloads_rl_experiment_t* out) {
  return pcp_workloads_rl_experiment_parse(&g_policy, text, strlen(text),
                                           pcp_allocator_system(), out);
}

// Parses {BASE + extra}; expects |code| and, when not OK, |message| inside
// the status text.
static void expect(const char* extra, pcp_status_code_t code,
                   const char* message) {
  char text[4096];
  snprintf(text, sizeof(text), "{" BASE "%s}", extra);
  pcp_workloads_rl_experiment_t e;
  pcp_status_t status = parse_text(text, &e);
  if (code == PCP_STATUS_OK) {
    if (status) {
      fail_msg("%s: %s", extra, pcp_status_message(status));
    }
    pcp_workloads_rl_experiment_deinitialize(&e);
    return;
  }
  if (!status)
    fail_msg("%s: accepted", extra);
  const char* got = pcp_status_message(status);
  if (pcp_status_code(status) != code || !strstr(got, message)) {
    fail_msg("%s: got %s '%s', want %s '%s'", extra,
             pcp_status_code_string(pcp_status_code(status)), got,
             pcp_status_code_string(code), message);
  }
  pcp_status_ignore(status);
}

#define BAD(extra, message) expect(extra, PCP_STATUS_INVALID_ARGUMENT, message)
#define OK(extra) expect(extra, PCP_STATUS_OK, NULL)

static void test_defaults(void** state) {
  (void)state;
  pcp_workloads_rl_experiment_t e;
  PCP_CHECK_OK(parse_text("{" BASE "}", &e));
  assert_int_equal(e.num_iterations, 100);
  assert_int_equal(e.group_size, 8);
  assert_int_equal(e.num_prompts, 8);
  assert_int_equal(e.rollout_max_tokens, 128);
  assert_true(e.learning_rate == 1e-6);
  assert_true(e.beta == 0.04);
  assert_true(e.clip_low == 0.2 && e.clip_high == 0.2);
  assert_true(e.temperature == 1.0 && e.top_p == 1.0);
  assert_int_equal(e.max_off_policy_steps, 1);
  assert_null(e.eval_prompts_path);
  assert_int_equal(e.eval_every, 10);
  assert_int_equal(e.checkpoint_every, 10);
  assert_true(e.weight_decay == 0 && e.beta1 == 0.9 && e.beta2 == 0.999);
  assert_true(e.eps == 1e-8 && e.grad_clip == 1.0);
  assert_int_equal(e.lr_schedule, PCP_DILOCO_LR_CONSTANT);
  assert_int_equal(e.warmup_steps, 0);
  assert_true(e.min_lr == 0);
  assert_int_equal(e.seed, 0);
  assert_non_null(e.reward);
  assert_non_null(e.reward_config);
  assert_int_equal(e.base_model.source, PCP_WORKLOADS_RL_MODEL_SERVED_DIR);
  assert_int_equal(e.reference_model.source, PCP_WORKLOADS_RL_MODEL_NONE);
  // Paths come back resolved under the root.
  char want[PATH_MAX + 32];
  snprintf(want, sizeof(want), "%s/data/p.jsonl", g_state_dir);
  assert_string_equal(e.prompts_path, want);
  snprintf(want, sizeof(want), "%s/served", g_state_dir);
  assert_string_equal(e.base_model.path, want);
  pcp_workloads_rl_experiment_deinitialize(&e);
  // Deinitialize twice is safe.
  pcp_workloads_rl_experiment_deinitialize(&e);
}

static void test_every_value_set(void** state) {
  (void)state;
  pcp_workloads_rl_experiment_t e;
  PCP_CHECK_OK(parse_text(
      "{\"num_iterations\":5,\"group_size\":4,\"num_prompts\":3,"
      "\"rollout_max_tokens\":64,\"learning_rate\":1e-5,\"beta\":0,"
      "\"clip_eps\":{\"low\":0.1,\"high\":0.28},\"temperature\":0.7,"
      "\"top_p\":0.9,\"max_off_policy_steps\":0,"
      "\"prompts_path\":\"data/p.jsonl\","
      "\"eval_prompts_path\":\"data/eval.jsonl\",\"eval_every\":2,"
      "\"reward\":{\"type\":\"verifier\",\"url\":\"http://127.0.0.1:1/\"},"
      "\"base_model\":{\"train_job\":\"job-1.a_b\",\"spec\":{\"kind\":"
      "\"qwen3\",\"layers\":1,\"heads\":4,\"kv_heads\":2}},"
      "\"reference_model\":{\"safetensors\":\"model.safetensors\"},"
      "\"checkpoint_every\":3,\"weight_decay\":0.01,\"betas\":[0.8,0.95],"
      "\"eps\":1e-6,\"grad_clip\":0,\"lr_schedule\":\"cosine\","
      "\"warmup_steps\":2,\"min_lr\":1e-7,\"seed\":42}",
      &e));
  assert_int_equal(e.num_iterations, 5);
  assert_int_equal(e.group_size, 4);
  assert_int_equal(e.num_prompts, 3);
  assert_int_equal(e.rollout_max_tokens, 64);
  assert_true(e.clip_low == 0.1 && e.clip_high == 0.28);
  assert_true(e.temperature == 0.7 && e.top_p == 0.9);
  assert_int_equal(e.max_off_policy_steps, 0);
  assert_non_null(e.eval_prompts_path);
  assert_int_equal(e.eval_every, 2);
  // The verifier is the service's to build; its config is kept.
  assert_null(e.reward);
  assert_string_equal(
      json_string_value(json_object_get(e.reward_config, "type")), "verifier");
  assert_int_equal(e.base_model.source, PCP_WORKLOADS_RL_MODEL_TRAIN_JOB);
  assert_string_equal(e.base_model.train_job, "job-1.a_b");
  assert_int_equal(e.base_model.spec.kind, PCP_DILOCO_MODEL_QWEN3);
  assert_int_equal(e.base_model.spec.layers, 1);
  assert_int_equal(e.base_model.spec.kv_heads, 2);
  assert_int_equal(e.base_model.spec.width, 128);  // training's default
  assert_int_equal(e.reference_model.source,
                   PCP_WORKLOADS_RL_MODEL_SAFETENSORS);
  assert_true(e.beta1 == 0.8 && e.beta2 == 0.95);
  assert_int_equal(e.lr_schedule, PCP_DILOCO_LR_COSINE);
  assert_int_equal(e.warmup_steps, 2);
  assert_int_equal(e.seed, 42);
  pcp_workloads_rl_experiment_deinitialize(&e);
}

static void test_integer_ranges(void** state) {
  (void)state;
  BAD(",\"num_iterations\":0", "num_iterations: must be in [1, 1000000]");
  BAD(",\"num_iterations\":1000001", "num_iterations: must be in [1, 1000000]");
  BAD(",\"num_iterations\":1.5", "num_iterations: must be an integer");
  BAD(",\"num_iterations\":\"5\"", "num_iterations: must be an integer");
  OK(",\"num_iterations\":1000000");
  BAD(",\"group_size\":1", "group_size: must be in [2, 1024]");
  BAD(",\"group_size\":1025", "group_size: must be in [2, 1024]");
  OK(",\"group_size\":2");
  BAD(",\"num_prompts\":0", "num_prompts: must be in [1, 65536]");
  BAD(",\"num_prompts\":65536,\"group_size\":1024",
      "num_prompts: num_prompts x group_size is 67108864 rollouts; at most "
      "1048576");
  BAD(",\"rollout_max_tokens\":0", "rollout_max_tokens: must be in [1, 32768]");
  BAD(",\"rollout_max_tokens\":32769",
      "rollout_max_tokens: must be in [1, 32768]");
  BAD(",\"max_off_policy_steps\":-1",
      "max_off_policy_steps: must be in [0, 1000]");
  BAD(",\"max_off_policy_steps\":1001",
      "max_off_policy_steps: must be in [0, 1000]");
  BAD(",\"eval_every\":0", "eval_every: must be in [1, 1000000]");
  BAD(",\"checkpoint_every\":0", "checkpoint_every: must be in [1, 1000000]");
  BAD(",\"warmup_steps\":-1", "warmup_steps: must be in [0, 1000000]");
  BAD(",\"seed\":-1", "seed: must be in [0, 1000000000000000]");
  BAD(",\"seed\":1000000000000001", "seed: must be in [0, 1000000000000000]");
  OK(",\"seed\":1000000000000000");
}

static void test_number_ranges(void** state) {
  (void)state;
  BAD(",\"learning_rate\":0", "learning_rate: must be in (0, 1]");
  BAD(",\"learning_rate\":1.5", "learning_rate: must be in (0, 1]");
  BAD(",\"learning_rate\":\"x\"", "learning_rate: must be a number");
  OK(",\"learning_rate\":1");
  OK(",\"learning_rate\":1");
  BAD(",\"beta\":-0.1", "beta: must be in [0, 10]");
  BAD(",\"beta\":10.5", "beta: must be in [0, 10]");
  OK(",\"beta\":0");
  BAD(",\"temperature\":0", "temperature: must be in (0, 10]");
  BAD(",\"temperature\":11", "temperature: must be in (0, 10]");
  BAD(",\"top_p\":0", "top_p: must be in (0, 1]");
  BAD(",\"top_p\":1.01", "top_p: must be in (0, 1]");
  BAD(",\"weight_decay\":-1", "weight_decay: must be in [0, 10]");
  BAD(",\"eps\":0", "eps: must be in (0, 0.01]");
  BAD(",\"eps\":0.1", "eps: must be in (0, 0.01]");
  BAD(",\"grad_clip\":-1", "grad_clip: must be in [0, 1e+06]");
  BAD(",\"min_lr\":2", "min_lr: must be in [0, 1]");
  BAD(",\"betas\":[0.9]", "betas: must be an array [beta1, beta2]");
  BAD(",\"betas\":0.9", "betas: must be an array [beta1, beta2]");
  BAD(",\"betas\":[0.9,1]", "betas[1]: must be in [0, 0.999999]");
  BAD(",\"betas\":[-0.1,0.9]", "betas[0]: must be in [0, 0.999999]");
  BAD(",\"betas\":[\"a\",0.9]", "betas[0]: must be a number");
}

static void test_clip_eps(void** state) {
  (void)state;
  pcp_workloads_rl_experiment_t e;
  PCP_CHECK_OK(parse_text("{" BASE ",\"clip_eps\":0.3}", &e));
  assert_true(e.clip_low == 0.3 && e.clip_high == 0.3);
  pcp_workloads_rl_experiment_deinitialize(&e);
  PCP_CHECK_OK(parse_text("{" BASE ",\"clip_eps\":{\"high\":0.28}}", &e));
  assert_true(e.clip_low == 0.2 && e.clip_high == 0.28);
  pcp_workloads_rl_experiment_deinitialize(&e);
  BAD(",\"clip_eps\":0", "clip_eps: must be in (0, 10]");
  BAD(",\"clip_eps\":{\"high\":0}", "clip_eps.high: must be in (0, 10]");
  BAD(",\"clip_eps\":{\"high\":11}", "clip_eps.high: must be in (0, 10]");
  BAD(",\"clip_eps\":{\"low\":-1}", "clip_eps.low: must be in (0, 10]");
  BAD(",\"clip_eps\":{\"mid\":1}",
      "clip_eps.mid: unknown key (allowed: low high)");
  BAD(",\"clip_eps\":[0.2]", "clip_eps: must be a number or an object");
}

static void test_schedule(void** state) {
  (void)state;
  OK(",\"lr_schedule\":\"warmup_constant\",\"warmup_steps\":3");
  BAD(",\"lr_schedule\":\"linear\"",
      "lr_schedule: must be one of constant cosine warmup_constant");
  BAD(",\"lr_schedule\":1", "lr_schedule: must be one of");
  BAD(",\"warmup_steps\":3", "warmup_steps: needs lr_schedule cosine");
  BAD(",\"lr_schedule\":\"cosine\",\"warmup_steps\":100",
      "warmup_steps: must be below num_iterations");
  BAD(",\"min_lr\":1e-9", "min_lr: only the cosine schedule decays to it");
  BAD(",\"lr_schedule\":\"cosine\",\"min_lr\":1e-3",
      "min_lr: must be at most learning_rate");
}

static void test_required_and_unknown(void** state) {
  (void)state;
  pcp_workloads_rl_experiment_t e;
  const struct {
    const char* text;
    const char* message;
  } kCases[] = {
      {"{\"reward\":{\"type\":\"exact_match\"},\"base_model\":{"
       "\"served_model_dir\":\"served\"}}",
       "prompts_path: required"},
      {"{\"prompts_path\":\"data/p.jsonl\",\"base_model\":{"
       "\"served_model_dir\":\"served\"}}",
       "reward: required"},
      {"{\"prompts_path\":\"data/p.jsonl\",\"reward\":{\"type\":"
       "\"exact_match\"}}",
       "base_model: required"},
      {"{" BASE ",\"num_iteration\":3}", "num_iteration: unknown key"},
      {"{" BASE ",\"x\":1,\"x\":2}", "duplicate"},
      {"[1]", "rl experiment: must be a JSON object"},
      {"{", "rl experiment: line 1"},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(kCases); ++i) {
    pcp_status_t status = parse_text(kCases[i].text, &e);
    if (!status)
      fail_msg("case %zu accepted", i);
    if (!strstr(pcp_status_message(status), kCases[i].message)) {
      fail_msg("case %zu: '%s' lacks '%s'", i, pcp_status_message(status),
               kCases[i].message);
    }
    assert_int_equal(pcp_status_consume_code(status),
                     PCP_STATUS_INVALID_ARGUMENT);
  }
  BAD(",\"eval_every\":5", "eval_every: needs eval_prompts_path");
  OK(",\"eval_every\":null");
  // Over the size cap, refused before parsing.
  size_t big = PCP_WORKLOADS_RL_EXPERIMENT_MAX_BYTES + 1;
  char* text = NULL;
  PCP_CHECK_OK(
      pcp_allocator_malloc(pcp_allocator_system(), big, (void**)&text));
  memset(text, ' ', big);
  pcp_status_t status = pcp_workloads_rl_experiment_parse(
      &g_policy, text, big, pcp_allocator_system(), &e);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_INVALID_ARGUMENT);
  pcp_allocator_free(pcp_allocator_system(), text);
}

static void test_reward_reuses_its_validation(void** state) {
  (void)state;
  pcp_workloads_rl_experiment_t e;
  pcp_status_t status = parse_text(
      "{\"prompts_path\":\"data/p.jsonl\",\"reward\":{\"type\":\"regex\"},"
      "\"base_model\":{\"served_model_dir\":\"served\"}}",
      &e);
  assert_true(status != NULL);
  // The reward module's own message, under the key path "reward".
  assert_non_null(strstr(pcp_status_message(status), "reward.pattern"));
  pcp_status_ignore(status);
  status = parse_text(
      "{\"prompts_path\":\"data/p.jsonl\",\"reward\":[1],"
      "\"base_model\":{\"served_model_dir\":\"served\"}}",
      &e);
  assert_non_null(strstr(pcp_status_message(status), "reward: must be an "));
  pcp_status_ignore(status);
}

static void test_models(void** state) {
  (void)state;
  char text[4096];
  pcp_workloads_rl_experiment_t e;
  const struct {
    const char* model;
    const char* message;  // NULL: accepted
  } kCases[] = {
      {"{\"safetensors\":\"model.safetensors\"}", NULL},
      {"{\"safetensors\":\"model-00001-of-00002.safetensors\"}", NULL},
      {"{\"train_job\":\"j1\",\"spec\":{\"kind\":\"gpt\"}}", NULL},
      {"{\"safetensors\":\"weights.bin\"}",
       "base_model.safetensors: must name a .safetensors file"},
      {"{\"safetensors\":\"served\"}",
       "base_model.safetensors: '"},  // a directory
      {"{\"served_model_dir\":\"model.safetensors\"}", "is not a directory"},
      {"{\"served_model_dir\":\"missing\"}", "no such file"},
      {"{}", "base_model: give exactly one of"},
      {"{\"served_model_dir\":\"served\",\"safetensors\":\"model."
       "safetensors\"}",
       "base_model: give exactly one of"},
      {"{\"served_model_dir\":\"served\",\"spec\":{}}",
       "base_model.spec: only with train_job"},
      {"{\"train_job\":\"j1\"}", "base_model.spec: required with train_job"},
      {"{\"train_job\":\"a/b\",\"spec\":{}}",
       "base_model.train_job: must be a job id"},
      {"{\"train_job\":\"\",\"spec\":{}}",
       "base_model.train_job: must be a job id"},
      {"{\"train_job\":7,\"spec\":{}}", "base_model.train_job: must be a job"},
      {"{\"train_job\":\"j\",\"spec\":{\"kind\":\"llama\"}}",
       "base_model.spec: "},
      {"{\"train_job\":\"j\",\"spec\":{\"layers\":0}}", "base_model.spec: "},
      {"{\"train_job\":\"j\",\"spec\":{\"heads\":3}}",
       "base_model.spec: diloco config: key 'model.heads'"},
      {"{\"train_job\":\"j\",\"spec\":{\"depth\":3}}",
       "base_model.spec.depth: unknown key"},
      {"{\"train_job\":\"j\",\"spec\":[]}", "base_model.spec: must be an obj"},
      {"{\"path\":\"served\"}", "base_model.path: unknown key"},
      {"\"served\"", "base_model: must be an object"},
      {"{\"served_model_dir\":3}",
       "base_model.served_model_dir: must be a "
       "string"},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(kCases); ++i) {
    snprintf(text, sizeof(text),
             "{\"prompts_path\":\"data/p.jsonl\",\"reward\":{\"type\":"
             "\"exact_match\"},\"base_model\":%s}",
             kCases[i].model);
    pcp_status_t status = parse_text(text, &e);
    if (!kCases[i].message) {
      if (status)
        fail_msg("case %zu: %s", i, pcp_status_message(status));
      pcp_workloads_rl_experiment_deinitialize(&e);
      continue;
    }
    if (!status)
      fail_msg("case %zu accepted", i);
    if (!strstr(pcp_status_message(status), kCases[i].message)) {
      fail_msg("case %zu: '%s' lacks '%s'", i, pcp_status_message(status),
               kCases[i].message);
    }
    pcp_status_ignore(status);
  }
  BAD(",\"reference_model\":{\"train_job\":\"j\"}",
      "reference_model.spec: required with train_job");
  OK(",\"reference_model\":null");
}

static void test_paths_confined(void** state) {
  (void)state;
  char text[2 * PATH_MAX + 512];
  pcp_workloads_rl_experiment_t e;
  char absolute[PATH_MAX + 32], dotdot[PATH_MAX + 32];
  snprintf(absolute, sizeof(absolute), "%s/p.jsonl", g_outside_dir);
  snprintf(dotdot, sizeof(dotdot), "../%s/p.jsonl",
           strrchr(g_outside_dir, '/') + 1);
  const struct {
    const char* key;
    const char* value;
  } kOutside[] = {
      {"prompts_path", absolute},
      {"prompts_path", "data/link.jsonl"},  // a link leading out
      {"prompts_path", dotdot},
      {"eval_prompts_path", absolute},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(kOutside); ++i) {
    bool eval = strcmp(kOutside[i].key, "eval_prompts_path") == 0;
    snprintf(text, sizeof(text),
             "{\"prompts_path\":\"%s\",\"reward\":{\"type\":"
             "\"exact_match\"},\"base_model\":{\"served_model_dir\":"
             "\"served\"}%s%s%s}",
             eval ? "data/p.jsonl" : kOutside[i].value,
             eval ? ",\"eval_prompts_path\":\"" : "",
             eval ? kOutside[i].value : "", eval ? "\"" : "");
    pcp_status_t status = parse_text(text, &e);
    if (!status)
      fail_msg("case %zu accepted", i);
    const char* message = pcp_status_message(status);
    char want[128];
    snprintf(want, sizeof(want),
             "key '%s': the path must lie under the data roots",
             kOutside[i].key);
    if (!strstr(message, want))
      fail_msg("case %zu: '%s' lacks '%s'", i, message, want);
    // Nothing about the file itself leaks.
    assert_null(strstr(message, "secret"));
    assert_int_equal(pcp_status_consume_code(status),
                     PCP_STATUS_PERMISSION_DENIED);
  }
  // Models are confined to the model roots.
  snprintf(text, sizeof(text),
           "{\"prompts_path\":\"data/p.jsonl\",\"reward\":{\"type\":"
           "\"exact_match\"},\"base_model\":{\"served_model_dir\":\"%s\"}}",
           g_outside_dir);
  pcp_status_t status = parse_text(text, &e);
  assert_non_null(strstr(pcp_status_message(status),
                         "key 'base_model.served_model_dir': the path must "
                         "lie under the model roots"));
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_PERMISSION_DENIED);
  BAD(",\"eval_prompts_path\":\"data\"", "is not a regular file");
  BAD(",\"eval_prompts_path\":\"data/none.jsonl\"", "no such file");
  BAD(",\"eval_prompts_path\":\"\"", "key 'eval_prompts_path': empty path");
  BAD(",\"eval_prompts_path\":5", "eval_prompts_path: must be a string");
}

//===----------------------------------------------------------------------===//
// Prompts
//===----------------------------------------------------------------------===//

static pcp_status_t prompts_parse(const char* text, size_t length,
                                  pcp_workloads_rl_prompts_t* out) {
  return pcp_workloads_rl_prompts_parse(pcp_make_string_view(text, length),
                                        "p.jsonl", pcp_allocator_system(), out);
}

static void prompts_expect_error(const char* text, size_t length,
                                 const char* message) {
  pcp_workloads_rl_prompts_t prompts;
  pcp_status_t status = prompts_parse(text, length, &prompts);
  if (!status)
    fail_msg("accepted: %s", text);
  if (!strstr(pcp_status_message(status), message)) {
    fail_msg("'%s' lacks '%s'", pcp_status_message(status), message);
  }
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_null(prompts.items);
  assert_int_equal(prompts.count, 0);
}

#define PROMPTS_BAD(text, message) \
  prompts_expect_error(text, sizeof(text) - 1, message)

static void test_prompts_valid(void** state) {
  (void)state;
  static const char kText[] =
      "\xef\xbb\xbf{\"prompt\":\"a\",\"answer\":\"x\"}\r\n"
      "\r\n"
      "   \n"
      "{\"prompt\":\"b\",\"answer\":42,\"metadata\":{\"k\":[1,2]}}\n"
      "{\"prompt\":\"\xc3\xa9t\xc3\xa9\",\"answer\":0.1}\n"
      "{\"prompt\":\"d\",\"answer\":null,\"metadata\":null}";
  pcp_workloads_rl_prompts_t prompts;
  PCP_CHECK_OK(prompts_parse(kText, sizeof(kText) - 1, &prompts));
  assert_int_equal(prompts.count, 4);
  assert_string_equal(prompts.items[0].prompt, "a");
  assert_string_equal(prompts.items[0].answer, "x");
  assert_null(prompts.items[0].metadata);
  assert_string_equal(prompts.items[1].answer, "42");
  assert_int_equal(prompts.items[1].answer_length, 2);
  assert_true(json_is_array(json_object_get(prompts.items[1].metadata, "k")));
  assert_string_equal(prompts.items[2].prompt, "\xc3\xa9t\xc3\xa9");
  assert_int_equal(prompts.items[2].prompt_length, 5);
  assert_string_equal(prompts.items[2].answer, "0.1");
  assert_null(prompts.items[3].answer);
  assert_null(prompts.items[3].metadata);
  pcp_workloads_rl_prompts_deinitialize(&prompts);
  pcp_workloads_rl_prompts_deinitialize(&prompts);
}

static void test_prompts_errors(void** state) {
  (void)state;
  PROMPTS_BAD("{\"prompt\":\"a\"}\n\n{\"answer\":\"x\"}\n",
              "p.jsonl:3: prompt: required");
  PROMPTS_BAD("{\"prompt\":5}", "p.jsonl:1: prompt: must be a string");
  PROMPTS_BAD("{\"prompt\":\"\"}", "p.jsonl:1: prompt: must not be empty");
  // jansson refuses \u0000 itself (no JSON_ALLOW_NUL); the line is named.
  PROMPTS_BAD("{\"prompt\":\"a\\u0000b\"}", "p.jsonl:1: column");
  PROMPTS_BAD("{\"prompt\":\"a\",\"answer\":[1]}",
              "p.jsonl:1: answer: must be a string or a number");
  PROMPTS_BAD("{\"prompt\":\"a\",\"answer\":true}",
              "p.jsonl:1: answer: must be a string or a number");
  PROMPTS_BAD("{\"prompt\":\"a\",\"metadata\":\"m\"}",
              "p.jsonl:1: metadata: must be an object");
  PROMPTS_BAD("{\"prompt\":\"a\",\"extra\":1}",
              "p.jsonl:1: extra: unknown key");
  PROMPTS_BAD("{\"prompt\":\"a\",\"prompt\":\"b\"}", "p.jsonl:1: column");
  PROMPTS_BAD("\"just a string\"", "p.jsonl:1: column 15");
  PROMPTS_BAD("{\"prompt\":\"a\"}\r\n{\"prompt\":", "p.jsonl:2: column");
  PROMPTS_BAD("{\"prompt\":\"a\xff\"}", "p.jsonl:1: invalid UTF-8 at byte 13");
  // An overlong encoding and a UTF-16 surrogate are not UTF-8 either.
  PROMPTS_BAD("\n{\"prompt\":\"\xc0\xaf\"}", "p.jsonl:2: invalid UTF-8");
  PROMPTS_BAD("{\"prompt\":\"\xed\xa0\x80\"}", "p.jsonl:1: invalid UTF-8");
  PROMPTS_BAD("{\"prompt\":\"\xe2\x82\"}", "p.jsonl:1: invalid UTF-8");
  PROMPTS_BAD("", "p.jsonl: no prompt");
  PROMPTS_BAD("\n\r\n  \n", "p.jsonl: no prompt");
  PROMPTS_BAD("\xef\xbb\xbf", "p.jsonl: no prompt");
  // A BOM anywhere but the start is a parse error of its line.
  PROMPTS_BAD("{\"prompt\":\"a\"}\n\xef\xbb\xbf{\"prompt\":\"b\"}",
              "p.jsonl:2: column");
}

static void test_prompts_limits(void** state) {
  (void)state;
  // Nesting: 16 levels pass, 17 are refused before jansson parses them.
  char nested[256];
  for (int depth = 16; depth <= 17; ++depth) {
    int levels = depth - 1;  // the line object is level 1
    char* p = nested;
    p += sprintf(p, "{\"prompt\":\"a\",\"metadata\":");
    for (int i = 0; i < levels; ++i)
      p += sprintf(p, i == levels - 1 ? "{" : "{\"k\":");
    for (int i = 0; i < levels; ++i) *p++ = '}';
    *p++ = '}';
    *p = '\0';
    pcp_workloads_rl_prompts_t prompts;
    pcp_status_t status = prompts_parse(nested, strlen(nested), &prompts);
    if (depth == 16) {
      PCP_CHECK_OK(status);
      pcp_workloads_rl_prompts_deinitialize(&prompts);
    } else {
      assert_non_null(
          strstr(pcp_status_message(status), "nesting deeper than 16"));
      pcp_status_ignore(status);
    }
  }
  // Brackets inside strings do not count.
  PCP_CHECK_OK(pcp_ok_status());
  {
    static const char kText[] =
        "{\"prompt\":\"[[[[[[[[[[[[[[[[[[[[[[[[{{{{{{{{{{{{\\\"\"}";
    pcp_workloads_rl_prompts_t prompts;
    PCP_CHECK_OK(prompts_parse(kText, sizeof(kText) - 1, &prompts));
    pcp_workloads_rl_prompts_deinitialize(&prompts);
  }
  // A huge line: refused naming its line, whatever its content.
  size_t n = PCP_WORKLOADS_RL_PROMPTS_MAX_LINE_BYTES + 16;
  char* text = NULL;
  PCP_CHECK_OK(pcp_allocator_malloc(pcp_allocator_system(), n, (void**)&text));
  memset(text, 'x', n);
  memcpy(text, "{\"prompt\":\"a\"}\n", 15);
  pcp_workloads_rl_prompts_t prompts;
  pcp_status_t status = prompts_parse(text, n, &prompts);
  assert_non_null(strstr(pcp_status_message(status), "p.jsonl:2: line of"));
  pcp_status_ignore(status);
  // Too many lines (blank ones count: they are lines of the file).
  size_t lines = PCP_WORKLOADS_RL_PROMPTS_MAX_LINES + 1;
  assert_true(lines * 1 <= n);
  memset(text, '\n', lines);
  status = prompts_parse(text, lines, &prompts);
  assert_non_null(strstr(pcp_status_message(status), "more than 1048576"));
  pcp_status_ignore(status);
  pcp_allocator_free(pcp_allocator_system(), text);
  // The file size cap is checked before anything is read.
  status = pcp_workloads_rl_prompts_parse(
      pcp_make_string_view("", PCP_WORKLOADS_RL_PROMPTS_MAX_FILE_BYTES + 1),
      "p.jsonl", pcp_allocator_system(), &prompts);
  assert_non_null(strstr(pcp_status_message(status), "at most 268435456"));
  pcp_status_ignore(status);
}

static void test_prompts_load(void** state) {
  (void)state;
  write_file("data/load.jsonl", "{\"prompt\":\"x\"}\n{\"prompt\":\"y\"}\n");
  pcp_workloads_rl_prompts_t prompts;
  PCP_CHECK_OK(pcp_workloads_rl_prompts_load("data/load.jsonl",
                                             pcp_allocator_system(), &prompts));
  assert_int_equal(prompts.count, 2);
  assert_string_equal(prompts.items[1].prompt, "y");
  pcp_workloads_rl_prompts_deinitialize(&prompts);
  pcp_status_t status = pcp_workloads_rl_prompts_load(
      "data/none.jsonl", pcp_allocator_system(), &prompts);
  assert_non_null(strstr(pcp_status_message(status), "data/none.jsonl"));
  pcp_status_ignore(status);
  status =
      pcp_workloads_rl_prompts_load("data", pcp_allocator_system(), &prompts);
  assert_non_null(strstr(pcp_status_message(status), "not a regular file"));
  pcp_status_ignore(status);
  write_file("data/bad.jsonl", "{\"prompt\":\"x\"}\n{\"prompt\":1}\n");
  status = pcp_workloads_rl_prompts_load("data/bad.jsonl",
                                         pcp_allocator_system(), &prompts);
  assert_non_null(strstr(pcp_status_message(status),
                         "data/bad.jsonl:2: prompt: must be a string"));
  pcp_status_ignore(status);
}

static void test_prompts_select(void** state) {
  (void)state;
  pcp_allocator_t a = pcp_allocator_system();
  // One epoch of 10 prompts in iterations of 5 is a permutation.
  uint32_t first[5], second[5];
  PCP_CHECK_OK(pcp_workloads_rl_prompts_select(10, 7, 0, 5, a, first));
  PCP_CHECK_OK(pcp_workloads_rl_prompts_select(10, 7, 1, 5, a, second));
  bool seen[10] = {false};
  for (int i = 0; i < 5; ++i) {
    assert_true(first[i] < 10 && second[i] < 10);
    assert_false(seen[first[i]]);
    seen[first[i]] = true;
    assert_false(seen[second[i]]);
    seen[second[i]] = true;
  }
  // Deterministic: the same arguments give the same prompts (resume).
  uint32_t again[5];
  PCP_CHECK_OK(pcp_workloads_rl_prompts_select(10, 7, 1, 5, a, again));
  assert_memory_equal(again, second, sizeof(again));
  // Another seed gives another order (for these fixed values).
  uint32_t other[10], mine[10];
  PCP_CHECK_OK(pcp_workloads_rl_prompts_select(10, 8, 0, 10, a, other));
  PCP_CHECK_OK(pcp_workloads_rl_prompts_select(10, 7, 0, 10, a, mine));
  assert_true(memcmp(other, mine, sizeof(mine)) != 0);
  // More prompts than the set: whole epochs, each a permutation.
  uint32_t many[9];
  PCP_CHECK_OK(pcp_workloads_rl_prompts_select(3, 1, 0, 9, a, many));
  for (int epoch = 0; epoch < 3; ++epoch) {
    int sum = 0;
    for (int i = 0; i < 3; ++i) sum += 1 << many[epoch * 3 + i];
    assert_int_equal(sum, 7);
  }
  // A shuffle, not the identity, for a larger set (fixed seed).
  uint32_t big[64];
  PCP_CHECK_OK(pcp_workloads_rl_prompts_select(64, 3, 0, 64, a, big));
  int fixed = 0;
  for (uint32_t i = 0; i < 64; ++i) fixed += big[i] == i;
  assert_true(fixed < 8);
  uint32_t one;
  pcp_status_t status = pcp_workloads_rl_prompts_select(0, 1, 0, 1, a, &one);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_INVALID_ARGUMENT);
  status = pcp_workloads_rl_prompts_select(3, 1, 0, 0, a, &one);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_INVALID_ARGUMENT);
  status = pcp_workloads_rl_prompts_select(3, 1, UINT64_MAX / 2, 4, a, &one);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_INVALID_ARGUMENT);
}

static void test_worker_classes(void** state) {
  (void)state;
  pcp_workloads_rl_experiment_t e;
  PCP_CHECK_OK(parse_text("{" BASE "}", &e));
  assert_null(e.rollout_worker_class);  // every worker
  assert_null(e.trainer_worker_class);
  pcp_workloads_rl_experiment_deinitialize(&e);
  PCP_CHECK_OK(parse_text("{" BASE ",\"rollout_worker_class\":\"gen\","
                          "\"trainer_worker_class\":\"train.h100-1\"}",
                          &e));
  assert_string_equal(e.rollout_worker_class, "gen");
  assert_string_equal(e.trainer_worker_class, "train.h100-1");
  pcp_workloads_rl_experiment_deinitialize(&e);
  OK(",\"rollout_worker_class\":null,\"trainer_worker_class\":null");
  // One class for both is allowed (a pool of one kind of worker).
  OK(",\"rollout_worker_class\":\"a\",\"trainer_worker_class\":\"a\"");
  const char* kRule = "must be a worker class: 1..63 bytes of [A-Za-z0-9._-]";
  char want[128];
  snprintf(want, sizeof(want), "rollout_worker_class: %s", kRule);
  BAD(",\"rollout_worker_class\":\"\"", want);
  BAD(",\"rollout_worker_class\":\"gen pool\"", want);
  BAD(",\"rollout_worker_class\":7", want);
  snprintf(want, sizeof(want), "trainer_worker_class: %s", kRule);
  BAD(",\"trainer_worker_class\":\"a/b\"", want);
  BAD(",\"trainer_worker_class\":[\"x\"]", want);
  BAD(",\"trainer_worker_class\":"
      "\"0123456789012345678901234567890123456789012345678901234567890123\"",
      want);
  OK(",\"trainer_worker_class\":"
     "\"012345678901234567890123456789012345678901234567890123456789012\"");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_every_value_set),
      cmocka_unit_test(test_integer_ranges),
      cmocka_unit_test(test_number_ranges),
      cmocka_unit_test(test_clip_eps),
      cmocka_unit_test(test_schedule),
      cmocka_unit_test(test_required_and_unknown),
      cmocka_unit_test(test_reward_reuses_its_validation),
      cmocka_unit_test(test_models),
      cmocka_unit_test(test_paths_confined),
      cmocka_unit_test(test_prompts_valid),
      cmocka_unit_test(test_prompts_errors),
      cmocka_unit_test(test_prompts_limits),
      cmocka_unit_test(test_prompts_load),
      cmocka_unit_test(test_prompts_select),
      cmocka_unit_test(test_worker_classes),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
