# SPDX-License-Identifier: Apache-2.0
# RL rollouts (issue 16, Deliver 2) part of pcp_workloads, included by
# src/workloads/CMakeLists.txt: generate through the inference service,
# score through a verifier, pack into the @grpo tensors (rl/rollout.h).
target_sources(pcp_workloads PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/rl/rollout.c)
# batch_pack on hand-made rollouts (every field, truncation of the prompt's
# front and of the completion's end, padding rows, refusals naming the
# field, an OOM sweep); score with a built-in reward and a fake verifier
# (slices, the sample's fields, a failure leaves the rewards alone);
# generate's refusals against a service without workers.
pcp_cmocka_test(workloads_rl_rollout_pack_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/rl/rollout_pack_test.c
  DEPS pcp_workloads PkgConfig::JANSSON LABELS workloads)
