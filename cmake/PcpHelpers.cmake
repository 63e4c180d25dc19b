# SPDX-License-Identifier: Apache-2.0
# pcp_module(NAME SOURCES ... DEPS ...): one static library per src/ module.
function(pcp_module name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(pcp_${name} STATIC ${ARG_SOURCES})
  target_include_directories(pcp_${name} PUBLIC ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(pcp_${name} PUBLIC ${ARG_DEPS})
endfunction()

# pcp_cmocka_test(NAME SOURCES ... DEPS ... [LABELS ...] [TIMEOUT s]):
# a cmocka executable registered with ctest.
function(pcp_cmocka_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} PkgConfig::CMOCKA)
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/src
                                             ${CMAKE_SOURCE_DIR}/tests)
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT}
                       ENVIRONMENT "${PCP_TEST_ENV}" LABELS "unit;${ARG_LABELS}")
endfunction()
