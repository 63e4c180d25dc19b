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
