# SPDX-License-Identifier: Apache-2.0
# RL rewards (issue 16) part of pcp_workloads, included by
# src/workloads/CMakeLists.txt (paths relative to src/workloads).
target_sources(pcp_workloads PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/rl/reward.c)
# Every built-in reward type on its edge cases (empty completion, no
# number, NaN/inf answers, inputs at the limits) and every config refusal
# naming its key path.
pcp_cmocka_test(workloads_rl_reward_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rl/reward_test.c
  DEPS pcp_workloads PkgConfig::JANSSON LABELS workloads)
# The regex and numeric rewards against Python's re and float on a shared
# table of cases kept in the test, scored by the C library through
# reward_score_tool.
add_executable(reward_score_tool
  ${CMAKE_CURRENT_SOURCE_DIR}/rl/reward_score_tool.c)
target_link_libraries(reward_score_tool PRIVATE pcp_workloads)
add_test(NAME workloads_rl_reward_python_test
  COMMAND ${PCP_VENV}/bin/python
          ${CMAKE_SOURCE_DIR}/tests/workloads/rl_reward_test.py
          $<TARGET_FILE:reward_score_tool>)
set_tests_properties(workloads_rl_reward_python_test PROPERTIES
  ENVIRONMENT "${PCP_TEST_ENV}" TIMEOUT 120 LABELS "unit;workloads")
# Fuzz target (rl/reward_fuzz.c): libFuzzer under clang with -DPCP_FUZZ=ON,
# otherwise a replay tool that ctest runs over tests/fuzz/rl_reward.
add_executable(rl_reward_fuzz ${CMAKE_CURRENT_SOURCE_DIR}/rl/reward_fuzz.c)
target_link_libraries(rl_reward_fuzz PRIVATE pcp_workloads)
if(PCP_FUZZ AND CMAKE_C_COMPILER_ID MATCHES "Clang")
  target_compile_definitions(rl_reward_fuzz PRIVATE PCP_FUZZ_LIBFUZZER)
  target_compile_options(rl_reward_fuzz PRIVATE
    -fsanitize=fuzzer,address,undefined)
  target_link_options(rl_reward_fuzz PRIVATE
    -fsanitize=fuzzer,address,undefined)
else()
  file(GLOB PCP_RL_REWARD_FUZZ_SEEDS ${CMAKE_SOURCE_DIR}/tests/fuzz/rl_reward/*)
  add_test(NAME workloads_rl_reward_fuzz_replay
    COMMAND rl_reward_fuzz ${PCP_RL_REWARD_FUZZ_SEEDS})
  set_tests_properties(workloads_rl_reward_fuzz_replay PROPERTIES
    ENVIRONMENT "${PCP_TEST_ENV}" TIMEOUT 120 LABELS "unit;fuzz;workloads")
endif()
