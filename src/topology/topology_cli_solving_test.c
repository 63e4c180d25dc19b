// SPDX-License-Identifier: Apache-2.0
//
// `pcp topo check|models|sim` through the real binary ($PCP_BINARY, set by
// ctest): exit codes 0/1/2, the reports, and JSON that parses.

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

#include <jansson.h>

#include "base/base.h"

typedef struct run_result_t {
  int exit_code;
  char output[65536];  // stdout (stderr appended when asked)
} run_result_t;

static void run(const char* args, bool with_stderr, run_result_t* out) {
  const char* binary = getenv("PCP_BINARY");
  assert_non_null(binary);
  char command[2048];
  snprintf(command, sizeof(command), "'%s' %s %s", binary, args,
           with_stderr ? "2>&1" : "2>/dev/null");
  FILE* pipe = popen(command, "r");
  assert_non_null(pipe);
  size_t n = fread(out->output, 1, sizeof(out->output) - 1, pipe);
  out->output[n] = 0;
  int status = pclose(pipe);
  out->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void expect(const char* args, int exit_code, const char* needle) {
  run_result_t* result = malloc(sizeof(*result));
  assert_non_null(result);
  run(args, true, result);
  if (result->exit_code != exit_code || !strstr(result->output, needle)) {
    print_error("pcp %s -> exit %d:\n%s\n(expected exit %d and '%s')\n", args,
                result->exit_code, result->output, exit_code, needle);
  }
  assert_int_equal(result->exit_code, exit_code);
  assert_non_null(strstr(result->output, needle));
  free(result);
}

// Runs with --json and returns the parsed stdout (caller decrefs).
static json_t* run_json(const char* args, int exit_code) {
  run_result_t* result = malloc(sizeof(*result));
  assert_non_null(result);
  run(args, false, result);
  assert_int_equal(result->exit_code, exit_code);
  json_error_t error;
  json_t* root = json_loads(result->output, 0, &error);
  if (!root)
    print_error("not JSON (%s):\n%s\n", error.text, result->output);
  assert_non_null(root);
  free(result);
  return root;
}

static void test_models_lists_every_model(void** state) {
  (void)state;
  expect("topo models", 0, "gateway_lease_scheduling");
  expect("topo models", 0, "global.partial_loss_without_rollback");
  json_t* root = run_json("topo models --json", 0);
  json_t* models = json_object_get(root, "models");
  assert_true(json_array_size(models) >= 15);
  assert_string_equal(
      json_string_value(json_object_get(json_array_get(models, 0), "name")),
      "workload_contract");
  json_decref(root);
  expect("topo models --bogus", 2, "--bogus");
}

static void test_check_solvable_models_exit_zero(void** state) {
  (void)state;
  expect("topo check --model message_dispatch", 0, "verdict: solvable");
  expect("topo check --model federation_placement --solver z3", 0,
         "solver: z3");
  expect(
      "topo check --model decoupled_fragment --solver z3 --z3-backend "
      "binary",
      0, "verdict: solvable");
  json_t* root = run_json("topo check --model rda_merge --json", 0);
  assert_string_equal(json_string_value(json_object_get(root, "verdict")),
                      "solvable");
  assert_true(json_is_true(json_object_get(root, "solvable")));
  json_decref(root);
}

static void test_check_obstructions_exit_one(void** state) {
  (void)state;
  expect("topo check --model partition.split_brain", 1,
         "failed_invariant: connectivity");
  expect("topo check --model partition.split_brain", 1,
         "pcp_witness: partition");
  expect("topo check --model global.partial_loss_without_rollback", 1,
         "kind: hole_creation_failure");
  expect("topo check --model federation.stale_gateway --solver z3", 1,
         "pcp_witness: stale_gateway");
  expect("topo check --model rda.direct_average_escape", 1,
         "pcp topology counterexample");
  json_t* root = run_json(
      "topo check --model diloco.duplicate_quorum --solver z3 --json", 1);
  assert_string_equal(json_string_value(json_object_get(root, "verdict")),
                      "obstruction");
  json_t* obstruction = json_object_get(root, "obstruction");
  assert_string_equal(
      json_string_value(json_object_get(obstruction, "pcp_witness")),
      "duplicate_quorum");
  json_decref(root);
  root = run_json("topo check --model rda.direct_average_escape --json", 1);
  assert_non_null(json_object_get(root, "counterexample"));
  json_decref(root);
}

static void test_check_usage_errors_exit_two(void** state) {
  (void)state;
  expect("topo check", 2, "--model NAME and --all");
  expect("topo check --all --model rda_merge", 2, "exactly one");
  expect("topo check --model", 2, "model");
  expect("topo check --model no.such.model", 2, "unknown model");
  expect("topo check --model rda_merge --solver cvc5", 2, "solver");
  expect("topo check --model rda_merge --unknown-flag", 2, "unknown-flag");
  expect("topo check --help", 0, "usage: pcp topo check");
}

static void write_text(const char* path, const char* text) {
  FILE* f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void test_sim_runs_replays_and_shrinks(void** state) {
  (void)state;
  expect("topo sim --seed 777 --events 5", 0,
         "topology-simulator-trace v1 seed=777 events=5");
  expect("topo sim --exhaustive --depth 3", 0, "checked=27 failed=0");
  expect("topo sim --invalid --exhaustive --depth 2 --seed 2026", 1,
         "checked=9");
  expect("topo sim --invalid --exhaustive --depth 2 --seed 2026 --shrink", 1,
         "shrunk: deleted=0 seed=0");
  // Record a failing trace, then replay it from the file.
  char dir[] = "/tmp/pcp-topo-sim-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256], args[512];
  snprintf(path, sizeof(path), "%s/trace.txt", dir);
  run_result_t* result = malloc(sizeof(*result));
  assert_non_null(result);
  run("topo sim --invalid --seed 5 --events 6", false, result);
  assert_int_equal(result->exit_code, 1);
  write_text(path, result->output);
  snprintf(args, sizeof(args), "topo sim --replay %s", path);
  expect(args, 0, "replay: match");
  // A tampered snapshot no longer matches.
  char* delivered = strstr(result->output, "delivered=0");
  assert_non_null(delivered);
  delivered[10] = '7';
  write_text(path, result->output);
  expect(args, 1, "replay: MISMATCH");
  write_text(path, "topology-simulator-trace v1 seed=1 events=2\n");
  expect(args, 2, "no 'final ...' line");
  write_text(path, "garbage\n");
  expect(args, 2, "header");
  free(result);
  snprintf(args, sizeof(args), "rm -rf '%s'", dir);
  assert_int_equal(system(args), 0);
  expect("topo sim --replay /nonexistent/trace.txt", 2, "trace.txt");
  expect("topo sim --exhaustive --depth 9", 2, "depth");
  expect("topo sim --events -1", 2, "events");
}

static void test_check_all_models_match_expectations(void** state) {
  (void)state;
  expect("topo check --all", 0, "15 model(s), 0 unexpected");
  expect("topo check --all --solver z3", 0, "0 unexpected");
  json_t* root = run_json("topo check --all --json", 0);
  assert_int_equal(json_integer_value(json_object_get(root, "mismatches")), 0);
  assert_int_equal(json_array_size(json_object_get(root, "models")), 15);
  json_decref(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_models_lists_every_model),
      cmocka_unit_test(test_check_solvable_models_exit_zero),
      cmocka_unit_test(test_check_obstructions_exit_one),
      cmocka_unit_test(test_check_usage_errors_exit_two),
      cmocka_unit_test(test_check_all_models_match_expectations),
      cmocka_unit_test(test_sim_runs_replays_and_shrinks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
