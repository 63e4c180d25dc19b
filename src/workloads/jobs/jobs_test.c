// SPDX-License-Identifier: Apache-2.0
// The generic job kind's JSON API without HTTP (jobs.h): submissions
// refused with the field named and nothing left on disk; an accepted one
// stored queued through the runner with its files in the job directory
// layout (<state_dir>/jobs/<id>/program.mlir, input0.bin). Runs end to end
// (compile, workers) in tests/integration/gateway_workers_test.py.

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "workloads/workloads.h"

static void expect_code_at(pcp_status_t status, pcp_status_code_t code,
                           const char* needle, const char* file, int line) {
  char text[1024] = "";
  pcp_status_format(status, text, sizeof(text));
  if (pcp_status_code(status) != code || (needle && !strstr(text, needle))) {
    print_error("%s:%d: want %s naming '%s', got %s\n", file, line,
                pcp_status_code_string(code), needle ? needle : "", text);
    pcp_status_ignore(status);
    fail();
  }
  pcp_status_ignore(status);
}
#define EXPECT_CODE(expr, code, needle) \
  expect_code_at((expr), (code), (needle), __FILE__, __LINE__)
#define EXPECT_OK(expr) EXPECT_CODE((expr), PCP_STATUS_OK, NULL)

// Nothing runs: the test only looks at what a submit stores.
static pcp_status_t refuse(void* self, void (*fn)(void*), void* arg) {
  (void)self;
  (void)fn;
  (void)arg;
  return pcp_make_status(PCP_STATUS_UNAVAILABLE, "no executor");
}

static size_t dir_entries(const char* path) {
  char command[512];
  snprintf(command, sizeof(command), "ls -A %s 2>/dev/null | wc -l", path);
  FILE* p = popen(command, "r");
  size_t n = 0;
  if (p) {
    if (fscanf(p, "%zu", &n) != 1) {
      n = 0;
    }
    pclose(p);
  }
  return n;
}

static void submit_json_api(void** state) {
  (void)state;
  char dir[] = "/tmp/pcp-jobs-test-XXXXXX";
  assert_non_null(mkdtemp(dir));
  pcp_store_options_t store_options;
  pcp_store_options_initialize(&store_options);
  store_options.state_dir = dir;
  pcp_store_t* store = NULL;
  EXPECT_OK(pcp_store_create(&store_options, pcp_allocator_system(), &store));
  pcp_workloads_jobs_options_t jobs_options = {.store = store,
                                               .state_dir = dir};
  pcp_workloads_jobs_t* jobs = NULL;
  EXPECT_OK(
      pcp_workloads_jobs_create(&jobs_options, pcp_allocator_system(), &jobs));
  pcp_workloads_kind_t kind = pcp_workloads_jobs_kind(jobs);
  assert_string_equal(kind.name, "generic");
  pcp_workloads_runner_options_t options = {
      .store = store,
      .kinds = &kind,
      .kind_count = 1,
      .executor = {.submit = refuse},
  };
  pcp_workloads_runner_t* runner = NULL;
  EXPECT_OK(
      pcp_workloads_runner_create(&options, pcp_allocator_system(), &runner));

  char jobs_dir[256];
  snprintf(jobs_dir, sizeof(jobs_dir), "%s/jobs", dir);
  struct {
    const char* body;
    const char* needle;
  } bad[] = {
      {"[]", "JSON object"},
      {"{}", "field 'program'"},
      {"{\"program\": {\"format\": \"x\", \"text\": \"a\"}}", "program.format"},
      {"{\"program\": {\"format\": \"vmfb\", \"base64\": \"@@\"}}",
       "program.base64"},
      {"{\"program\": {\"format\": \"stablehlo\", \"text\": \"m\"}, "
       "\"placement\": {\"backend\": \"abacus\"}}",
       "placement.backend"},
      {"{\"program\": {\"format\": \"stablehlo\", \"text\": \"m\"}, "
       "\"inputs\": [{\"data_base64\": \"AAAA\", \"dtype\": \"f32\", "
       "\"shape\": [2]}]}",
       "inputs[0]"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
    json_t* body = json_loads(bad[i].body, 0, NULL);
    assert_non_null(body);
    json_t* out = NULL;
    EXPECT_CODE(pcp_workloads_jobs_submit(jobs, runner, body, &out),
                PCP_STATUS_INVALID_ARGUMENT, bad[i].needle);
    assert_null(out);
    json_decref(body);
    // A refused submission leaves no job directory behind.
    assert_int_equal(dir_entries(jobs_dir), 0);
  }

  // Two f32 values: 8 bytes, "AACAPwAAAEA=" is 1.0, 2.0.
  json_t* body = json_pack(
      "{s:{s:s, s:s}, s:s, s:[{s:s, s:s, s:[i]}], s:{s:s, s:i}}", "program",
      "format", "stablehlo", "text", "module {}", "function", "add", "inputs",
      "data_base64", "AACAPwAAAEA=", "dtype", "f32", "shape", 2, "placement",
      "backend", "cpu", "workers", 1);
  json_t* out = NULL;
  EXPECT_OK(pcp_workloads_jobs_submit(jobs, runner, body, &out));
  json_decref(body);
  assert_string_equal(json_string_value(json_object_get(out, "state")),
                      "queued");
  assert_string_equal(json_string_value(json_object_get(out, "kind")),
                      "generic");
  json_t* spec = json_object_get(out, "spec");
  assert_string_equal(json_string_value(json_object_get(spec, "function")),
                      "add");
  assert_int_equal(
      json_integer_value(json_object_get(
          json_array_get(json_object_get(spec, "inputs"), 0), "byte_length")),
      8);
  const char* id = json_string_value(json_object_get(out, "job_id"));
  char path[512];
  struct stat st;
  snprintf(path, sizeof(path), "%s/jobs/%s/program.mlir", dir, id);
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_size, 9);
  snprintf(path, sizeof(path), "%s/jobs/%s/input0.bin", dir, id);
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_size, 8);
  json_decref(out);

  pcp_workloads_runner_release(runner);
  pcp_workloads_jobs_release(jobs);
  pcp_store_release(store);
  char command[128];
  snprintf(command, sizeof(command), "rm -rf %s", dir);
  assert_int_equal(system(command), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(submit_json_api),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
