// SPDX-License-Identifier: Apache-2.0
//
// pcp_allocator_strdup goes through the allocator it is given: the counting
// allocator sees the copy and the failing allocator's sweep reaches it.

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"

static void strdup_copies_through_the_allocator(void** state) {
  (void)state;
  pcp_allocator_counting_t counter;
  pcp_allocator_counting_initialize(pcp_allocator_system(), &counter);
  pcp_allocator_t allocator = pcp_allocator_counting(&counter);
  const char* text = "rocm";
  char* copy = NULL;
  assert_null(pcp_allocator_strdup(allocator, text, &copy));
  assert_string_equal(copy, "rocm");
  assert_ptr_not_equal(copy, text);
  assert_int_equal(counter.live_bytes, 5);
  pcp_allocator_free(allocator, copy);
  assert_int_equal(counter.live_bytes, 0);
}

static void strdup_reports_exhaustion(void** state) {
  (void)state;
  pcp_allocator_failing_t failing;
  pcp_allocator_failing_initialize(pcp_allocator_system(), 0, true, &failing);
  char* copy = (char*)"untouched";
  pcp_status_t status =
      pcp_allocator_strdup(pcp_allocator_failing(&failing), "x", &copy);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_RESOURCE_EXHAUSTED);
  pcp_status_ignore(status);
  assert_null(copy);
  assert_int_equal(failing.failure_count, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(strdup_copies_through_the_allocator),
      cmocka_unit_test(strdup_reports_exhaustion),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
