// SPDX-License-Identifier: Apache-2.0
// Leaks one block on purpose. Under the ASan suite's environment
// (ASAN_OPTIONS and LSAN_OPTIONS of PCP_TEST_ENV, tools/lsan.supp) the
// LeakSanitizer must report it: the proof that leak checking is on and that
// the suppressions do not hide a leak in our own code.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void* volatile g_block;

int main(void) {
  g_block = malloc(4096);
  if (!g_block) {
    return 2;
  }
  memset(g_block, 0x5a, 4096);
  g_block = NULL;  // the only reference gone: a definite leak
  puts("lsan_probe: leaked 4096 bytes");
  return 0;
}
