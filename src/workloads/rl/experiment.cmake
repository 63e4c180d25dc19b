# SPDX-License-Identifier: Apache-2.0
# RL experiment and prompts (issue 16, Deliver 1) part of pcp_workloads,
# included by src/workloads/CMakeLists.txt (paths relative to src/workloads).
target_sources(pcp_workloads PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/rl/experiment.c
  ${CMAKE_CURRENT_SOURCE_DIR}/rl/prompts.c)
# Every key's range and error text, the defaults, path confinement, the
# prompts JSONL edge cases and the per-iteration selection.
pcp_cmocka_test(workloads_rl_experiment_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rl/experiment_test.c
  DEPS pcp_workloads PkgConfig::JANSSON LABELS workloads)
# Failing-allocator sweeps of both parsers: every failure RESOURCE_EXHAUSTED,
# nothing left behind.
pcp_cmocka_test(workloads_rl_experiment_oom_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rl/experiment_oom_test.c
  DEPS pcp_workloads PkgConfig::JANSSON LABELS workloads)
