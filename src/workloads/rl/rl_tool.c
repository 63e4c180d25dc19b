// SPDX-License-Identifier: Apache-2.0
// Test driver for the RL core, used by
// tests/workloads/rl_advantage_numpy_test.py and tests/models/grpo_jax_test.py
// (which recompute everything independently with NumPy / JAX):
//
//   rl_tool advantages G EPSILON SCALE(0|1) IN.f32 OUT.f32
//       raw little-endian f32 rewards in, advantages out; prints
//       "groups=N degenerate=N mean=X std=X" (or the error, exit 1)
//   rl_tool objective ARCH LAYERS HEADS KV_HEADS WIDTH VOCAB T B OUT.mlir
//                     DERIVED.mlir
//       the @grpo module (pcp_workloads_rl_objective_module_emit) and the
//       module pcp_compile_training_module_build derives from it with
//       pcp_workloads_rl_objective_training_options_initialize

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workloads/workloads.h"

static int fail(pcp_status_t status) {
  char text[1024];
  pcp_status_format(status, text, sizeof(text));
  fprintf(stderr, "rl_tool: %s\n", text);
  pcp_status_ignore(status);
  return 1;
}

static int run_advantages(char** argv) {
  pcp_workloads_rl_advantage_options_t options;
  pcp_workloads_rl_advantage_options_initialize(&options);
  options.group_size = strtoll(argv[0], NULL, 10);
  options.epsilon = strtod(argv[1], NULL);
  options.scale_by_std = strcmp(argv[2], "0") != 0;
  void* data = NULL;
  size_t length = 0;
  pcp_status_t status =
      pcp_file_read_all(argv[3], (size_t)1 << 28, &data, &length);
  if (status) {
    return fail(status);
  }
  size_t count = length / sizeof(float);
  float* out = NULL;
  status = pcp_allocator_calloc(pcp_allocator_system(),
                                (count + 1) * sizeof(float), (void**)&out);
  pcp_workloads_rl_advantage_stats_t stats;
  if (!status) {
    status = pcp_workloads_rl_advantages_compute(&options, (const float*)data,
                                                 count, out, &stats);
  }
  if (!status) {
    status = pcp_file_write_atomic(argv[4], out, count * sizeof(float));
  }
  if (!status) {
    printf("groups=%lld degenerate=%lld mean=%.17g std=%.17g\n",
           (long long)stats.group_count,
           (long long)stats.degenerate_group_count, stats.reward_mean,
           stats.reward_std);
  }
  pcp_allocator_free(pcp_allocator_system(), out);
  pcp_libc_free(data);  // pcp_file_read_all returns a malloc()ed buffer
  return status ? fail(status) : 0;
}

static int run_objective(char** argv) {
  pcp_models_architecture_t arch;
  pcp_status_t status = pcp_models_architecture_parse(argv[0], &arch);
  if (status) {
    return fail(status);
  }
  pcp_models_spec_t spec;
  pcp_models_spec_initialize(arch, &spec);
  spec.layers = strtoll(argv[1], NULL, 10);
  spec.heads = strtoll(argv[2], NULL, 10);
  spec.kv_heads = strtoll(argv[3], NULL, 10);
  spec.width = strtoll(argv[4], NULL, 10);
  spec.vocab = strtoll(argv[5], NULL, 10);
  spec.block_size = strtoll(argv[6], NULL, 10);
  spec.batch = strtoll(argv[7], NULL, 10);
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &builder);
  status = pcp_workloads_rl_objective_module_emit(&spec, &builder);
  const char* text = pcp_string_builder_cstring(&builder);
  if (!status) {
    status = pcp_file_write_atomic(argv[8], text, strlen(text));
  }
  char* derived = NULL;
  size_t derived_length = 0;
  if (!status) {
    pcp_compile_training_options_t options;
    pcp_workloads_rl_objective_training_options_initialize(&options);
    status = pcp_compile_training_module_build(text, strlen(text), argv[8],
                                               &options, pcp_allocator_system(),
                                               &derived, &derived_length);
  }
  if (!status) {
    status = pcp_file_write_atomic(argv[9], derived, derived_length);
  }
  pcp_allocator_free(pcp_allocator_system(), derived);
  pcp_string_builder_deinitialize(&builder);
  return status ? fail(status) : 0;
}

int main(int argc, char** argv) {
  if (argc == 7 && strcmp(argv[1], "advantages") == 0) {
    return run_advantages(argv + 2);
  }
  if (argc == 12 && strcmp(argv[1], "objective") == 0) {
    return run_objective(argv + 2);
  }
  fprintf(stderr,
          "usage: rl_tool advantages G EPSILON SCALE IN.f32 OUT.f32\n"
          "       rl_tool objective ARCH LAYERS HEADS KV_HEADS WIDTH VOCAB T "
          "B OUT.mlir DERIVED.mlir\n");
  return 2;
}
