// SPDX-License-Identifier: Apache-2.0
//
// `pcp topo betti|subdivide` through the real binary ($PCP_BINARY, set by
// ctest): outputs, exit codes and the messages for malformed input.

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"

static char g_dir[256];

typedef struct run_result_t {
  int exit_code;
  char output[16384];  // stdout and stderr together
} run_result_t;

// Runs `$PCP_BINARY <args>` through the shell, capturing both streams.
static void run(const char* args, run_result_t* out) {
  const char* binary = getenv("PCP_BINARY");
  assert_non_null(binary);
  char command[2048];
  snprintf(command, sizeof(command), "cd '%s' && '%s' %s 2>&1", g_dir, binary,
           args);
  FILE* pipe = popen(command, "r");
  assert_non_null(pipe);
  size_t n = fread(out->output, 1, sizeof(out->output) - 1, pipe);
  out->output[n] = 0;
  int status = pclose(pipe);
  out->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void write_file(const char* name, const char* text) {
  char path[512];
  snprintf(path, sizeof(path), "%s/%s", g_dir, name);
  FILE* f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void expect(const char* args, int exit_code, const char* needle) {
  run_result_t* result = malloc(sizeof(*result));
  assert_non_null(result);
  run(args, result);
  if (result->exit_code != exit_code || !strstr(result->output, needle)) {
    print_error("pcp %s -> exit %d:\n%s\n(expected exit %d and '%s')\n", args,
                result->exit_code, result->output, exit_code, needle);
  }
  assert_int_equal(result->exit_code, exit_code);
  assert_non_null(strstr(result->output, needle));
  free(result);
}

static int setup(void** state) {
  (void)state;
  snprintf(g_dir, sizeof(g_dir), "/tmp/pcp-topo-cli-XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void** state) {
  (void)state;
  char command[512];
  snprintf(command, sizeof(command), "rm -rf '%s'", g_dir);
  return system(command) == 0 ? 0 : -1;
}

static void test_betti_prints_the_vector(void** state) {
  (void)state;
  write_file("circle.json", "{\"facets\": [[1, 2], [2, 3], [1, 3]]}");
  expect("topo betti circle.json", 0, "betti=[1,1]\n");
  write_file("disc.json", "{\"facets\": [[\"a\", \"b\", \"c\"]]}");
  expect("topo betti disc.json", 0, "betti=[1,0,0]\n");
  // Strings and integers are different names.
  write_file("two.json", "{\"facets\": [[\"1\"], [1]]}");
  expect("topo betti two.json", 0, "betti=[2]\n");
  write_file("empty.json", "{\"facets\": []}");
  expect("topo betti empty.json", 0, "betti=[]\n");
  // Unknown keys are ignored.
  write_file("extra.json", "{\"name\": \"x\", \"facets\": [[0, 1]]}");
  expect("topo betti extra.json", 0, "betti=[1,0]\n");
}

static void test_betti_field_changes_the_answer_for_rp2(void** state) {
  (void)state;
  write_file("rp2.json",
             "{\"facets\": [[1,2,3],[1,3,4],[1,4,5],[1,5,6],[1,6,2],"
             "[2,3,5],[3,4,6],[4,5,2],[5,6,3],[6,2,4]]}");
  expect("topo betti rp2.json", 0, "betti=[1,1,1]\n");
  expect("topo betti rp2.json --field 2", 0, "betti=[1,1,1]\n");
  expect("topo betti rp2.json --field=3", 0, "betti=[1,0,0]\n");
}

static void test_betti_rejects_bad_fields(void** state) {
  (void)state;
  write_file("edge.json", "{\"facets\": [[0, 1]]}");
  expect("topo betti edge.json --field 4", 2, "not a prime field");
  expect("topo betti edge.json --field 1", 2, "not a prime field");
  expect("topo betti edge.json --field 65537", 2, "not a prime field");
  expect("topo betti edge.json --field x", 2, "--field");
}

static void test_betti_rejects_malformed_files(void** state) {
  (void)state;
  write_file("bad.json", "{\"facets\": [[1, 2],");
  expect("topo betti bad.json", 1, "invalid JSON");
  write_file("array.json", "[[1, 2]]");
  expect("topo betti array.json", 1, "expected a JSON object");
  write_file("nokey.json", "{\"simplices\": []}");
  expect("topo betti nokey.json", 1, "missing the \"facets\" key");
  write_file("notarray.json", "{\"facets\": 3}");
  expect("topo betti notarray.json", 1, "\"facets\" must be an array");
  write_file("facet.json", "{\"facets\": [[1, 2], 7]}");
  expect("topo betti facet.json", 1, "facet 1 is not an array");
  write_file("emptyfacet.json", "{\"facets\": [[]]}");
  expect("topo betti emptyfacet.json", 1, "facet 0 is empty");
  write_file("float.json", "{\"facets\": [[1, 2.5]]}");
  expect("topo betti float.json", 1, "neither a string nor an integer");
  write_file("dup.json", "{\"facets\": [[\"a\", \"b\", \"a\"]]}");
  expect("topo betti dup.json", 1, "DuplicateColor");
  expect("topo betti dup.json", 1, "repeats vertex \"a\"");
  write_file("dupkey.json", "{\"facets\": [], \"facets\": []}");
  expect("topo betti dupkey.json", 1, "invalid JSON");
  expect("topo betti missing.json", 1, "missing.json");
  expect("topo betti", 2, "missing the FILE");
  expect("topo betti a.json b.json", 2, "expected one FILE");
  expect("topo betti edge.json --frobnicate", 2, "--frobnicate");
}

static void test_betti_enforces_its_limits(void** state) {
  (void)state;
  // 17 vertices in one facet: over the per-facet limit.
  write_file("wide.json",
             "{\"facets\": [[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]]}");
  expect("topo betti wide.json", 1, "limit 16");
  // 80 facets of 16 vertices: 80 * 2^16 faces, over the total-face limit.
  char* text = malloc(64 * 1024);
  assert_non_null(text);
  size_t n = (size_t)sprintf(text, "{\"facets\": [");
  for (int f = 0; f < 80; ++f) {
    n += (size_t)sprintf(text + n, "%s[", f ? "," : "");
    for (int v = 0; v < 16; ++v) {
      n += (size_t)sprintf(text + n, "%s%d", v ? "," : "", f * 16 + v);
    }
    n += (size_t)sprintf(text + n, "]");
  }
  sprintf(text + n, "]}");
  write_file("huge.json", text);
  free(text);
  expect("topo betti huge.json", 1, "faces in total");
}

static void test_subdivide_prints_counts_and_dot(void** state) {
  (void)state;
  expect("topo subdivide --kind chromatic --dim 1", 0, "vertices=4 facets=3\n");
  expect("topo subdivide --kind chromatic --dim 2", 0,
         "vertices=12 facets=13\n");
  expect("topo subdivide --kind chromatic --dim 3", 0,
         "vertices=32 facets=75\n");
  expect("topo subdivide --kind barycentric --dim 3", 0,
         "vertices=15 facets=24\n");
  expect("topo subdivide --kind barycentric --dim 1 --rounds 2", 0,
         "vertices=5 facets=4\n");
  expect("topo subdivide --kind chromatic --dim 2 --rounds 2", 0,
         "vertices=99 facets=169\n");
  expect("topo subdivide --kind chromatic --dim 2 --rounds 0", 0,
         "vertices=3 facets=1\n");
  expect("topo subdivide --kind barycentric --dim 1 --dot", 0,
         "graph \"barycentric-dim1-rounds1\" {");
  expect("topo subdivide --kind barycentric --dim 1 --dot", 0, "v0 -- v2;");
}

static void test_subdivide_rejects_bad_usage(void** state) {
  (void)state;
  expect("topo subdivide --dim 2", 2, "kind");
  expect("topo subdivide --kind chromatic", 2, "dim");
  expect("topo subdivide --kind simplicial --dim 2", 2,
         "allowed: barycentric, chromatic");
  expect("topo subdivide --kind chromatic --dim 9", 2, "--dim");
  expect("topo subdivide --kind chromatic --dim 6 --rounds 5", 2,
         "simplices (the limit)");
  expect("topo subdivide --kind barycentric --dim 5 --rounds 2", 2,
         "simplices (the limit)");
  expect("topo subdivide --kind chromatic --dim 2 stray", 2, "stray");
}

static void test_topo_dispatch(void** state) {
  (void)state;
  expect("topo --help", 0, "betti");
  expect("topo --help", 0, "subdivide");
  expect("topo", 2, "usage: pcp topo");
  expect("topo frobnicate", 2, "unknown subcommand 'frobnicate'");
  expect("topo betti --help", 0, "--field");
  expect("--help", 0, "topo");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_betti_prints_the_vector),
      cmocka_unit_test(test_betti_field_changes_the_answer_for_rp2),
      cmocka_unit_test(test_betti_rejects_bad_fields),
      cmocka_unit_test(test_betti_rejects_malformed_files),
      cmocka_unit_test(test_betti_enforces_its_limits),
      cmocka_unit_test(test_subdivide_prints_counts_and_dot),
      cmocka_unit_test(test_subdivide_rejects_bad_usage),
      cmocka_unit_test(test_topo_dispatch),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
