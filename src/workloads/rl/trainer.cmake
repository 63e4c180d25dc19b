# SPDX-License-Identifier: Apache-2.0
# The GRPO trainer (issue 16, Deliver 4) part of pcp_workloads, included by
# src/workloads/CMakeLists.txt: the update and the reference
# log-probabilities on workers (rl/trainer.h, docs/rl.md "The trainer").
target_sources(pcp_workloads PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/rl/trainer.c)
# The gateway side of the trainer's end-to-end test: a fabric endpoint, a
# compile queue and the trainer over a batch read from files.
add_executable(rl_trainer_tool
  ${CMAKE_CURRENT_SOURCE_DIR}/rl/rl_trainer_tool.c)
target_link_libraries(rl_trainer_tool PRIVATE pcp_workloads
                      PkgConfig::JANSSON)
# ref_logp and one update on 1 and 2 real `pcp --worker` processes against
# JAX (the whole batch's token-mean gradient, AdamW with the global-norm
# clip, the metrics), 1 vs 2 workers, a stop during the update. Release
# only ("noasan"): IREE does the work; the trainer's host paths run under
# ASan in workloads_rl_trainer_test.
add_test(NAME workloads_rl_trainer_e2e
  COMMAND ${PCP_VENV}/bin/python
          ${CMAKE_SOURCE_DIR}/tests/workloads/rl_trainer_test.py
          $<TARGET_FILE:pcp> $<TARGET_FILE:rl_trainer_tool>)
set_tests_properties(workloads_rl_trainer_e2e PROPERTIES
  ENVIRONMENT "${PCP_TEST_ENV}" TIMEOUT 900 LABELS "workloads;e2e;noasan")
# A task failing on a connected worker (a resident-memory cap) while the
# other worker's task runs 3 s: the update fails at once, nothing written.
add_test(NAME workloads_rl_trainer_fail_e2e
  COMMAND ${PCP_VENV}/bin/python
          ${CMAKE_SOURCE_DIR}/tests/workloads/rl_trainer_fail_test.py
          $<TARGET_FILE:pcp> $<TARGET_FILE:rl_trainer_tool>)
set_tests_properties(workloads_rl_trainer_fail_e2e PROPERTIES
  ENVIRONMENT "${PCP_TEST_ENV}" TIMEOUT 600 LABELS "workloads;e2e;noasan")
# create's validation of every option, the copies, reference_set, the
# refusals of ref_logp and update before any worker is asked, and an
# out-of-memory sweep over create.
pcp_cmocka_test(workloads_rl_trainer_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rl/trainer_test.c
  DEPS pcp_workloads LABELS workloads)
