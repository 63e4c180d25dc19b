# SPDX-License-Identifier: Apache-2.0
# The compile queue part of pcp_workloads (runtime/compile_queue*), included
# by src/workloads/CMakeLists.txt.
target_sources(pcp_workloads PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/runtime/compile_queue.c)
target_link_libraries(pcp_workloads PUBLIC pcp_compile Threads::Threads)
# Control flow with a fake `pcp` (a shell script: the slots, sharing, cancel,
# a failing child's log, the key), then one real `pcp compile` of a tiny
# module through the queue.
pcp_cmocka_test(workloads_compile_queue_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/runtime/compile_queue_test.c
  DEPS pcp_workloads LABELS workloads)
target_compile_definitions(workloads_compile_queue_test PRIVATE
  PCP_BINARY="$<TARGET_FILE:pcp>")
add_dependencies(workloads_compile_queue_test pcp)
# The request notification (pcp_workloads_compile_request_notify) with the
# same kind of fake `pcp`: once per request, at the finish, a cancel, a
# release or shutdown, at once for an artifact that exists.
pcp_cmocka_test(workloads_compile_notify_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/runtime/compile_notify_test.c
  DEPS pcp_workloads LABELS workloads)
