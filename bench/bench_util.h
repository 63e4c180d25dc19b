// SPDX-License-Identifier: Apache-2.0
//
// Helpers every C benchmark in bench/ shares: failing loudly on an error
// status, and reading this process's memory figures from /proc. Header-only
// (each benchmark is one executable with no library of its own).

#ifndef PCP_BENCH_BENCH_UTIL_H_
#define PCP_BENCH_BENCH_UTIL_H_

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

// When |status| is an error: prints "<bench>: <what>: <message>" to stderr
// and exits 1 (a benchmark has no partial result worth printing).
static inline void pcp_bench_check(const char* bench, pcp_status_t status,
                                   const char* what) {
  if (!status) {
    return;
  }
  char text[4096];
  pcp_status_format(status, text, sizeof(text));
  fprintf(stderr, "%s: %s: %s\n", bench, what, text);
  exit(1);
}

// A field of /proc/self/status given in kB ("VmRSS:", "VmHWM:"), in KiB;
// -1 when the file or the field is missing.
static inline int64_t pcp_bench_status_kib(const char* key) {
  FILE* f = fopen("/proc/self/status", "r");
  if (!f) {
    return -1;
  }
  char line[256];
  int64_t value = -1;
  size_t length = strlen(key);
  while (fgets(line, sizeof(line), f)) {
    if (strncmp(line, key, length) == 0) {
      value = strtoll(line + length, NULL, 10);
    }
  }
  fclose(f);
  return value;
}

// Check mode: `tools/bench.sh --check` (`make bench-check`) sets
// PCP_BENCH_CHECK=1, and a bench whose goal is missed then exits non-zero.
// Without it a miss is printed but the bench exits 0 (a plain `make bench`
// run is for the figures).
static inline bool pcp_bench_check_mode(void) {
  const char* value = getenv("PCP_BENCH_CHECK");
  return value && value[0] && strcmp(value, "0") != 0;
}

// Prints "<bench> goal <what>: met" or "... MISSED" and returns |met|, so a
// bench can fold several goals: `ok &= pcp_bench_goal(...)`.
static inline bool pcp_bench_goal(const char* bench, bool met,
                                  const char* what) {
  printf("%s goal %s: %s\n", bench, what, met ? "met" : "MISSED");
  return met;
}

// The exit status of a bench whose goals are |met| (after its ratio line).
static inline int pcp_bench_exit_code(bool met) {
  return met || !pcp_bench_check_mode() ? 0 : 1;
}

#endif  // PCP_BENCH_BENCH_UTIL_H_
