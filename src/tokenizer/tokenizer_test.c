// SPDX-License-Identifier: Apache-2.0
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tokenizer/tokenizer.h"

static void placeholder(void** state) { (void)state; }

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(placeholder)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
