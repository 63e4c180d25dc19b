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
# Fuzz target (rl/experiment_fuzz.c): libFuzzer under clang with
# -DPCP_FUZZ=ON, otherwise a replay tool that ctest runs over
# tests/fuzz/rl_experiment.
add_executable(rl_experiment_fuzz
  ${CMAKE_CURRENT_SOURCE_DIR}/rl/experiment_fuzz.c)
target_link_libraries(rl_experiment_fuzz PRIVATE pcp_workloads)
if(PCP_FUZZ AND CMAKE_C_COMPILER_ID MATCHES "Clang")
  target_compile_definitions(rl_experiment_fuzz PRIVATE PCP_FUZZ_LIBFUZZER)
  target_compile_options(rl_experiment_fuzz PRIVATE
    -fsanitize=fuzzer,address,undefined)
  target_link_options(rl_experiment_fuzz PRIVATE
    -fsanitize=fuzzer,address,undefined)
else()
  file(GLOB PCP_RL_EXPERIMENT_FUZZ_SEEDS
    ${CMAKE_SOURCE_DIR}/tests/fuzz/rl_experiment/*)
  add_test(NAME workloads_rl_experiment_fuzz_replay
    COMMAND rl_experiment_fuzz ${PCP_RL_EXPERIMENT_FUZZ_SEEDS})
  set_tests_properties(workloads_rl_experiment_fuzz_replay PROPERTIES
    ENVIRONMENT "${PCP_TEST_ENV}" TIMEOUT 120 LABELS "unit;fuzz;workloads")
endif()
