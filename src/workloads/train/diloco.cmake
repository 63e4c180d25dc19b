# SPDX-License-Identifier: Apache-2.0
# DiLoCo / streaming DiLoCo part of pcp_workloads, included by
# src/workloads/CMakeLists.txt (paths relative to src/workloads).
target_sources(pcp_workloads PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/train/diloco.c
  ${CMAKE_CURRENT_SOURCE_DIR}/train/diloco_config.c
  ${CMAKE_CURRENT_SOURCE_DIR}/train/diloco_checkpoint.c
  ${CMAKE_CURRENT_SOURCE_DIR}/train/model_path.c
  ${CMAKE_CURRENT_SOURCE_DIR}/train/service.c
  ${CMAKE_CURRENT_SOURCE_DIR}/train/service_stream.c
  ${CMAKE_CURRENT_SOURCE_DIR}/train/service_ddp.c
  ${CMAKE_CURRENT_SOURCE_DIR}/train/service_decoupled.c
  ${CMAKE_CURRENT_SOURCE_DIR}/train/waits.c)
target_link_libraries(pcp_workloads PUBLIC pcp_config pcp_store pcp_fabric
  pcp_models pcp_data pcp_mlir m)
# The outer-step arithmetic is compared bit for bit with NumPy float32: no
# FMA contraction in its loops.
set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/train/diloco.c
  PROPERTIES COMPILE_OPTIONS "-ffp-contract=off")
pcp_cmocka_test(workloads_diloco_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/train/diloco_test.c
  DEPS pcp_workloads PkgConfig::JANSSON)
# Writes the streaming fragment modules of a built-in model, the text the
# service compiles (tests/compile/backend_matrix_test.py).
add_executable(streaming_fragment_tool
  ${CMAKE_CURRENT_SOURCE_DIR}/train/streaming_fragment_tool.c)
target_link_libraries(streaming_fragment_tool PRIVATE pcp_workloads)
# Writes library results as .npy for the NumPy comparison below.
add_executable(diloco_npy_driver
  ${CMAKE_CURRENT_SOURCE_DIR}/train/diloco_npy_driver.c)
target_link_libraries(diloco_npy_driver PRIVATE pcp_workloads pcp_compute)
add_test(NAME workloads_diloco_numpy_test
  COMMAND ${PCP_VENV}/bin/python
          ${CMAKE_SOURCE_DIR}/tests/workloads/diloco_numpy_test.py
          $<TARGET_FILE:diloco_npy_driver>)
set_tests_properties(workloads_diloco_numpy_test PROPERTIES
  TIMEOUT 120 ENVIRONMENT "${PCP_TEST_ENV}" LABELS "unit;python")
# The compile module's in-graph AdamW (@apply_optimizer of a built-in GPT,
# compiled by `pcp compile --program train`) run by `pcp run` against the
# NumPy AdamW of the script (bias correction, weight decay, global clip).
add_test(NAME workloads_adamw_numpy_test
  COMMAND ${PCP_VENV}/bin/python
          ${CMAKE_SOURCE_DIR}/tests/workloads/adamw_numpy_test.py
          $<TARGET_FILE:pcp>)
set_tests_properties(workloads_adamw_numpy_test PROPERTIES
  TIMEOUT 300 ENVIRONMENT "${PCP_TEST_ENV}" LABELS "python;compute")
# The training service's control flow: a real store and fabric endpoint
# that no worker joins (rounds with workers: integration_training_e2e).
pcp_cmocka_test(workloads_training_service_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/train/service_test.c
  DEPS pcp_workloads PkgConfig::JANSSON)
target_compile_definitions(workloads_training_service_test PRIVATE
  PCP_TEST_DATA="${CMAKE_SOURCE_DIR}/data/tiny_shakespeare.txt")
# The service's task waits on the runner and a fabric with no worker: a
# cancel, a task's end and the deadline end them (the hooks' wait/signal
# pair), a cancel the sliced fallback; prints cancel -> run returned.
pcp_cmocka_test(workloads_training_waits_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/train/waits_test.c
  DEPS pcp_workloads PkgConfig::JANSSON)
# @diloco_round (`pcp compile --program diloco`, f32 and bf16 deltas, inner
# state reset and keep) run by `pcp run` against its definition: params -
# @train_steps(params, m, v, step, ...) of the same program (reset: 0, 0,
# step 1), bf16 rounded to nearest even in NumPy.
add_test(NAME workloads_diloco_round_test
  COMMAND ${PCP_VENV}/bin/python
          ${CMAKE_SOURCE_DIR}/tests/workloads/diloco_round_test.py
          $<TARGET_FILE:pcp>)
set_tests_properties(workloads_diloco_round_test PROPERTIES
  TIMEOUT 300 ENVIRONMENT "${PCP_TEST_ENV}" LABELS "python;compute")
# Per-step learning rates (@train_steps' lr vector) and the kept inner state
# (`--inner-state keep`: two rounds = one run of 2K AdamW steps with the
# moments continuing) against NumPy AdamW over jax.grad (f32) gradients, and
# the reset round; f32 and bf16. About a minute cold on 2 cores.
foreach(element f32 bf16)
  add_test(NAME workloads_inner_state_${element}_test
    COMMAND ${PCP_VENV}/bin/python
            ${CMAKE_SOURCE_DIR}/tests/workloads/inner_state_test.py
            $<TARGET_FILE:pcp> ${element})
  set_tests_properties(workloads_inner_state_${element}_test PROPERTIES
    TIMEOUT 300 ENVIRONMENT "${PCP_TEST_ENV}" LABELS "python;compute")
endforeach()
# Decoupled DiLoCo, sans-I/O core (issue 17): fragment plans, schedule,
# merges, quorum/grace, outer Nesterov per fragment, clocks, event tape,
# recovery plan, int4 codec. A library of its own under pcp_workloads so that
# the topology simulator explores this very code (src/topology/
# decoupled_model.c) without linking the rest of workloads (fabric, IREE):
# it needs only base, config (the key table), proto (CRC32C) and jansson
# (the clock's wire form). docs/decisions.md, "decoupled core library".
add_library(pcp_decoupled_core STATIC
  ${CMAKE_CURRENT_SOURCE_DIR}/train/decoupled_plan.c
  ${CMAKE_CURRENT_SOURCE_DIR}/train/decoupled_merge.c
  ${CMAKE_CURRENT_SOURCE_DIR}/train/decoupled_quorum.c
  ${CMAKE_CURRENT_SOURCE_DIR}/train/decoupled_tape.c
  ${CMAKE_CURRENT_SOURCE_DIR}/train/decoupled_int4.c
  ${CMAKE_CURRENT_SOURCE_DIR}/train/decoupled_config.c)
target_include_directories(pcp_decoupled_core PUBLIC ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(pcp_decoupled_core PUBLIC pcp_base pcp_config pcp_proto
  PkgConfig::JANSSON m)
target_link_libraries(pcp_workloads PUBLIC pcp_decoupled_core)
# Compared with NumPy float32 element by element: no FMA contraction.
set_source_files_properties(
  ${CMAKE_CURRENT_SOURCE_DIR}/train/decoupled_merge.c
  ${CMAKE_CURRENT_SOURCE_DIR}/train/decoupled_int4.c
  PROPERTIES COMPILE_OPTIONS "-ffp-contract=off")
# The reference's worked examples number for number, plus hand-computed
# cases: plans and their rules, schedule, merges, quorum/grace/adaptive
# grace and the round machine, Nesterov, blending, clocks, tape encode/
# decode/corruption/replay, recovery plan, int4 bytes and bound.
pcp_cmocka_test(workloads_decoupled_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/train/decoupled_test.c
  DEPS pcp_workloads PkgConfig::JANSSON LABELS workloads)
target_compile_definitions(workloads_decoupled_test PRIVATE
  PCP_DECOUPLED_SEED_DIR="${CMAKE_SOURCE_DIR}/tests/fuzz/decoupled")
# The int4 down path's @mix_int4 (emitted, compiled by IREE, run on the CPU
# backend) sets g = s + decode(q) bit for bit as the gateway does in C, on
# every packing edge and on zero, subnormal and huge blocks.
pcp_cmocka_test(workloads_decoupled_down_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/train/decoupled_down_test.c
  DEPS pcp_workloads PkgConfig::JANSSON LABELS "workloads;compute"
  TIMEOUT 300)
# Merges, Nesterov, blending and the int4 codec on seeded random data
# against an independent NumPy implementation.
add_executable(decoupled_npy_driver
  ${CMAKE_CURRENT_SOURCE_DIR}/train/decoupled_npy_driver.c)
target_link_libraries(decoupled_npy_driver PRIVATE pcp_workloads pcp_compute)
add_test(NAME workloads_decoupled_numpy_test
  COMMAND ${PCP_VENV}/bin/python
          ${CMAKE_SOURCE_DIR}/tests/workloads/decoupled_numpy_test.py
          $<TARGET_FILE:decoupled_npy_driver>)
set_tests_properties(workloads_decoupled_numpy_test PROPERTIES
  TIMEOUT 120 ENVIRONMENT "${PCP_TEST_ENV}" LABELS "unit;python")
# Fuzz target for the decoupled decoders (train/decoupled_fuzz.c: the
# event tape, replayed and planned; int4 payloads, re-encoded under the
# bound): libFuzzer under clang with -DPCP_FUZZ=ON, otherwise a replay tool
# that ctest runs over tests/fuzz/decoupled.
add_executable(decoupled_fuzz
  ${CMAKE_CURRENT_SOURCE_DIR}/train/decoupled_fuzz.c)
target_link_libraries(decoupled_fuzz PRIVATE pcp_workloads)
if(PCP_FUZZ AND CMAKE_C_COMPILER_ID MATCHES "Clang")
  target_compile_definitions(decoupled_fuzz PRIVATE PCP_FUZZ_LIBFUZZER)
  target_compile_options(decoupled_fuzz PRIVATE
    -fsanitize=fuzzer,address,undefined)
  target_link_options(decoupled_fuzz PRIVATE
    -fsanitize=fuzzer,address,undefined)
else()
  file(GLOB PCP_DECOUPLED_FUZZ_SEEDS
    ${CMAKE_SOURCE_DIR}/tests/fuzz/decoupled/*)
  add_test(NAME workloads_decoupled_fuzz_replay
    COMMAND decoupled_fuzz ${PCP_DECOUPLED_FUZZ_SEEDS})
  set_tests_properties(workloads_decoupled_fuzz_replay PROPERTIES
    ENVIRONMENT "${PCP_TEST_ENV}" TIMEOUT 120 LABELS "unit;fuzz;workloads")
endif()
