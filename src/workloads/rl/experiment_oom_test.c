// SPDX-License-Identifier: Apache-2.0
//
// OOM sweeps (SQLite style) over the RL experiment and prompts parsers: fail
// the Nth allocation (and every one after it) for every N until the call
// succeeds. Every failure must be RESOURCE_EXHAUSTED, never a crash or
// another error, and the counting allocator behind the failing one must hold
// nothing afterwards (a leak check in every build, not only under ASan).

// mkdtemp(3), realpath(3) need XSI.
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

static char g_state_dir[PATH_MAX];
static pcp_workloads_train_policy_t g_policy;

static void write_file(const char* path, const char* text) {
  assert_true(!pcp_file_write_atomic(path, text, strlen(text)));
}

static int setup(void** state) {
  (void)state;
  char dir[] = "/tmp/pcp-rl-experiment-oom-XXXXXX";
  if (!mkdtemp(dir) || !realpath(dir, g_state_dir) || chdir(g_state_dir))
    return -1;
  mkdir("data", 0755);
  mkdir("served", 0755);
  write_file("data/p.jsonl",
             "{\"prompt\":\"a\",\"answer\":1.5,\"metadata\":{\"k\":1}}\n"
             "{\"prompt\":\"b\",\"answer\":\"x\"}\n");
  write_file("model.safetensors", "x");
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
  char command[PATH_MAX + 16];
  snprintf(command, sizeof(command), "rm -rf '%s'", g_state_dir);
  return system(command) == 0 ? 0 : -1;
}

typedef pcp_status_t (*scenario_fn_t)(pcp_allocator_t allocator);

static pcp_status_t experiment_scenario(pcp_allocator_t allocator) {
  static const char kText[] =
      "{\"prompts_path\":\"data/p.jsonl\",\"eval_prompts_path\":"
      "\"data/p.jsonl\",\"reward\":{\"type\":\"sum\",\"terms\":["
      "{\"weight\":1,\"reward\":{\"type\":\"contains\",\"text\":\"ab\"}},"
      "{\"weight\":0.5,\"reward\":{\"type\":\"regex\",\"pattern\":\"[0-9]+\"}}"
      "]},\"base_model\":{\"train_job\":\"j1\",\"spec\":{\"kind\":\"gpt\"}},"
      "\"reference_model\":{\"safetensors\":\"model.safetensors\"},"
      "\"clip_eps\":{\"low\":0.1}}";
  pcp_workloads_rl_experiment_t e;
  pcp_status_t status = pcp_workloads_rl_experiment_parse(
      &g_policy, kText, sizeof(kText) - 1, allocator, &e);
  if (!status) {
    assert_string_equal(e.base_model.train_job, "j1");
    assert_non_null(e.reward);
    pcp_workloads_rl_experiment_deinitialize(&e);
  }
  return status;
}

static pcp_status_t prompts_scenario(pcp_allocator_t allocator) {
  pcp_workloads_rl_prompts_t prompts;
  pcp_status_t status =
      pcp_workloads_rl_prompts_load("data/p.jsonl", allocator, &prompts);
  if (!status) {
    assert_int_equal(prompts.count, 2);
    assert_string_equal(prompts.items[0].answer, "1.5");
    pcp_workloads_rl_prompts_deinitialize(&prompts);
  }
  return status;
}

// Enough prompts that the items array grows more than once.
static pcp_status_t many_prompts_scenario(pcp_allocator_t allocator) {
  char text[200 * 24];
  size_t used = 0;
  for (int i = 0; i < 200; ++i) {
    used += (size_t)snprintf(text + used, sizeof(text) - used,
                             "{\"prompt\":\"p%d\"}\n", i);
  }
  pcp_workloads_rl_prompts_t prompts;
  pcp_status_t status = pcp_workloads_rl_prompts_parse(
      pcp_make_string_view(text, used), "many", allocator, &prompts);
  if (!status) {
    assert_int_equal(prompts.count, 200);
    pcp_workloads_rl_prompts_deinitialize(&prompts);
  }
  return status;
}

static pcp_status_t select_scenario(pcp_allocator_t allocator) {
  uint32_t out[4];
  return pcp_workloads_rl_prompts_select(10, 1, 3, 4, allocator, out);
}

static void sweep(const char* name, scenario_fn_t fn, int64_t min_total) {
  pcp_allocator_counting_t counter;
  pcp_allocator_counting_initialize(pcp_allocator_system(), &counter);
  pcp_allocator_failing_t never;
  pcp_allocator_failing_initialize(pcp_allocator_counting(&counter), -1, false,
                                   &never);
  PCP_CHECK_OK(fn(pcp_allocator_failing(&never)));
  assert_int_equal(counter.live_bytes, 0);
  int64_t total = never.request_count;
  assert_true(total >= min_total);  // the scenario does allocate
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
    pcp_status_code_t code = pcp_status_code(status);
    if (code != PCP_STATUS_RESOURCE_EXHAUSTED) {
      fail_msg("%s: allocation %lld failed with %s", name, (long long)n,
               pcp_status_message(status));
    }
    pcp_status_ignore(status);
  }
}

static void test_experiment_oom(void** state) {
  (void)state;
  sweep("experiment", experiment_scenario, 6);
}

static void test_prompts_oom(void** state) {
  (void)state;
  sweep("prompts", prompts_scenario, 5);
  sweep("many prompts", many_prompts_scenario, 200);
  sweep("select", select_scenario, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_experiment_oom),
      cmocka_unit_test(test_prompts_oom),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
