# SPDX-License-Identifier: Apache-2.0
# GRPO core (issue 16) of pcp_workloads, included by
# src/workloads/CMakeLists.txt: group-normalised advantages and the @grpo
# objective module (rl/rl.h, docs/rl.md).
target_sources(pcp_workloads PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/rl/advantage.c
  ${CMAKE_CURRENT_SOURCE_DIR}/rl/objective.c)
# Edge cases: hand-computed groups, the all-equal group, refused inputs,
# the @grpo module text and its derivation.
pcp_cmocka_test(workloads_rl_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rl/rl_test.c
  DEPS pcp_workloads LABELS workloads)
# Writes advantages and the @grpo modules for the Python tests below.
add_executable(rl_tool ${CMAKE_CURRENT_SOURCE_DIR}/rl/rl_tool.c)
target_link_libraries(rl_tool PRIVATE pcp_workloads)
# Advantages on random groups against NumPy (sample std, epsilon, the
# unscaled variant, all-equal groups counted).
add_test(NAME workloads_rl_advantage_numpy_test
  COMMAND ${PCP_VENV}/bin/python
          ${CMAKE_SOURCE_DIR}/tests/workloads/rl_advantage_numpy_test.py
          $<TARGET_FILE:rl_tool>)
set_tests_properties(workloads_rl_advantage_numpy_test PROPERTIES
  TIMEOUT 120 ENVIRONMENT "${PCP_TEST_ENV}" LABELS "unit;python")
# @grpo and its autodiff gradient (`pcp compile --program grad --function
# grpo`) and @grpo_metrics run by `pcp run` on IREE's CPU backend against an
# independent JAX objective and jax.value_and_grad: ratio != 1, clipping on
# both sides, beta 0 and > 0, masked prompt and padding, an all-equal group;
# a tiny GPT and a tiny Qwen3. Release only ("noasan"): its C paths (emit,
# derive) run under ASan in workloads_rl_test; here IREE does the work.
add_test(NAME models_grpo_jax_test
  COMMAND ${PCP_VENV}/bin/python
          ${CMAKE_SOURCE_DIR}/tests/models/grpo_jax_test.py
          $<TARGET_FILE:pcp> $<TARGET_FILE:rl_tool>)
set_tests_properties(models_grpo_jax_test PROPERTIES
  ENVIRONMENT "${PCP_TEST_ENV}" TIMEOUT 900 LABELS "models;e2e;noasan")
# The RL job kind (rl/job.c: the GRPO loop on the runner; rl/job_state.c:
# its state, checkpoints and served directory, docs/rl.md "The job").
target_sources(pcp_workloads PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/rl/job.c
  ${CMAKE_CURRENT_SOURCE_DIR}/rl/job_state.c)
# The job's parts that need no worker: checkpoint round trip (and pruning,
# a half-written one ignored), state.json, the progress JSON's keys, stale
# groups, batch rows, the block-size check, the served directory, the
# served_model_name key.
pcp_cmocka_test(workloads_rl_job_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rl/job_test.c
  DEPS pcp_workloads PkgConfig::JANSSON LABELS workloads)
