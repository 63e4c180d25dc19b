// SPDX-License-Identifier: Apache-2.0
//
// Fuzz target for the RL experiment and prompts parsers (experiment.h):
// libFuzzer under clang with -DPCP_FUZZ=ON, otherwise a replay tool that
// ctest runs over tests/fuzz/rl_experiment. The first byte picks a mode:
//   even: the rest is a prompts JSONL: parse must succeed or fail with a
//         status (never crash); parsed prompts are non-empty NUL-free text,
//         and a selection of them stays in range;
//   odd:  the rest is an experiment JSON, parsed under a policy whose roots
//         are a fresh temporary directory (the working directory, holding
//         p.jsonl and served/, removed at exit): a status or a parsed
//         experiment whose values lie in their documented ranges.

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "workloads/workloads.h"

// libFuzzer fixes this name.
int LLVMFuzzerTestOneInput(  // NOLINT(readability-identifier-naming)
    const uint8_t* data, size_t size);

static int g_accepted;  // inputs either parser accepted (replay prints it)

static void fuzz_prompts(const char* text, size_t size) {
  pcp_workloads_rl_prompts_t prompts;
  pcp_status_t status =
      pcp_workloads_rl_prompts_parse(pcp_make_string_view(text, size), "fuzz",
                                     pcp_allocator_system(), &prompts);
  if (status) {
    PCP_ASSERT(prompts.count == 0 && prompts.items == NULL);
    pcp_status_ignore(status);
    return;
  }
  PCP_ASSERT(prompts.count > 0);
  for (size_t i = 0; i < prompts.count; ++i) {
    const pcp_workloads_rl_prompt_t* p = &prompts.items[i];
    PCP_ASSERT(p->prompt_length > 0 && strlen(p->prompt) == p->prompt_length);
    PCP_ASSERT(!p->answer || strlen(p->answer) == p->answer_length);
    PCP_ASSERT(!p->metadata || json_is_object(p->metadata));
  }
  uint32_t indices[8];
  PCP_CHECK_OK(pcp_workloads_rl_prompts_select(
      prompts.count, size, prompts.count, 8, pcp_allocator_system(), indices));
  for (size_t i = 0; i < 8; ++i) PCP_ASSERT(indices[i] < prompts.count);
  ++g_accepted;
  pcp_workloads_rl_prompts_deinitialize(&prompts);
}

static char g_dir[64];

static void fuzz_cleanup(void) {
  if (chdir(g_dir) != 0)
    return;
  unlink("p.jsonl");
  rmdir("served");
  if (chdir("/") == 0)
    rmdir(g_dir);
}

static pcp_workloads_train_policy_t* fuzz_policy(void) {
  static pcp_workloads_train_policy_t policy;
  static bool ready = false;
  if (ready)
    return &policy;
  char dir[] = "/tmp/pcp-rl-experiment-fuzz-XXXXXX";
  PCP_ASSERT(mkdtemp(dir) != NULL);
  snprintf(g_dir, sizeof(g_dir), "%s", dir);
  atexit(fuzz_cleanup);
  // Relative paths resolve in the temporary directory, which holds a
  // prompts file and a served model directory, so an input can pass.
  PCP_ASSERT(chdir(dir) == 0);
  PCP_ASSERT(mkdir("served", 0755) == 0);
  static const char kPrompts[] = "{\"prompt\":\"a\"}\n";
  PCP_CHECK_OK(
      pcp_file_write_atomic("p.jsonl", kPrompts, sizeof(kPrompts) - 1));
  pcp_workloads_train_policy_config_t file;
  memset(&file, 0, sizeof(file));
  file.state_dir = dir;
  char* roots[] = {dir};
  file.data_roots = (pcp_string_list_t){.items = roots, .count = 1};
  file.model_roots = (pcp_string_list_t){.items = roots, .count = 1};
  PCP_CHECK_OK(pcp_workloads_train_policy_initialize(
      &file, NULL, (uint64_t)8 << 30, &policy));
  ready = true;
  return &policy;
}

static void fuzz_experiment(const char* text, size_t size) {
  pcp_workloads_rl_experiment_t e;
  pcp_status_t status = pcp_workloads_rl_experiment_parse(
      fuzz_policy(), text, size, pcp_allocator_system(), &e);
  if (status) {
    pcp_status_ignore(status);
    return;
  }
  PCP_ASSERT(e.group_size >= 2 && e.num_iterations >= 1);
  PCP_ASSERT(e.clip_low > 0 && e.clip_high > 0 && e.temperature > 0);
  PCP_ASSERT(e.prompts_path != NULL);
  PCP_ASSERT(e.base_model.source != PCP_WORKLOADS_RL_MODEL_NONE);
  ++g_accepted;
  pcp_workloads_rl_experiment_deinitialize(&e);
}

int LLVMFuzzerTestOneInput(  // NOLINT(readability-identifier-naming)
    const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  const char* text = (const char*)data + 1;
  if (data[0] % 2 == 0)
    fuzz_prompts(text, size - 1);
  else
    fuzz_experiment(text, size - 1);
  return 0;
}

#ifndef PCP_FUZZ_LIBFUZZER
int main(int argc, char** argv) {
  // The experiment mode changes the working directory: inputs are opened by
  // the path they had from the directory the tool started in.
  char start[4096];
  PCP_ASSERT(getcwd(start, sizeof(start)) != NULL);
  for (int i = 1; i < argc; ++i) {
    char input[8192];
    snprintf(input, sizeof(input), "%s%s%s", argv[i][0] == '/' ? "" : start,
             argv[i][0] == '/' ? "" : "/", argv[i]);
    void* data = NULL;
    size_t size = 0;
    pcp_status_t status = pcp_file_read_all(input, 1u << 22, &data, &size);
    if (status) {
      char text[512];
      pcp_status_format(status, text, sizeof(text));
      fprintf(stderr, "rl_experiment_fuzz: %s\n", text);
      pcp_status_ignore(status);
      return 1;
    }
    LLVMFuzzerTestOneInput(data, size);
    pcp_libc_free(data);
  }
  printf("rl_experiment_fuzz: replayed %d input(s), %d accepted\n", argc - 1,
         g_accepted);
  return 0;
}
#endif
