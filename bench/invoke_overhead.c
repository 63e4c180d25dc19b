// SPDX-License-Identifier: Apache-2.0
// bench/invoke_overhead: the cost of invoking a program through pcp_backend
// (embedded CPython + iree.runtime) against IREE's own C benchmark tool,
// iree-benchmark-module, on the same VMFB, device and inputs, in one run.
//
//   tiny:   4xf32 + 4xf32        (per-call overhead dominates; goal <= 1.5x)
//   matmul: 512x512 f32 matmul   (compute dominates;           goal <= 1.05x)
//   rss:    peak RSS of `pcp run` vs `iree-run-module` on the tiny VMFB
//           (goal <= 1.3x: embedding Python must not cost more)
//
// Prints one line per measurement, a `invoke_overhead goal ...: met|MISSED`
// line per goal (a miss exits 1 under PCP_BENCH_CHECK=1) and, last,
// `invoke_overhead ratio=<x>` where x is the tiny-function ratio
// iree time / pcp time (higher is better; the goal <= 1.5x is x >= 0.667).

// wait4() (per-child peak RSS) is a BSD/Linux call outside POSIX.
#define _DEFAULT_SOURCE
#include <errno.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "bench_util.h"
#include "compile/compile.h"
#include "compute/compute.h"

extern char** environ;

static void check(pcp_status_t status, const char* what) {
  pcp_bench_check("invoke_overhead", status, what);
}

static const char kTiny[] =
    "func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {\n"
    "  %0 = stablehlo.add %a, %b : tensor<4xf32>\n"
    "  return %0 : tensor<4xf32>\n}\n";

static const char kMatmul[] =
    "func.func @main(%a: tensor<512x512xf32>, %b: tensor<512x512xf32>) -> "
    "tensor<512x512xf32> {\n"
    "  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : "
    "(tensor<512x512xf32>, tensor<512x512xf32>) -> tensor<512x512xf32>\n"
    "  return %0 : tensor<512x512xf32>\n}\n";

typedef struct bench_case_t {
  const char* name;
  const char* mlir;
  const char* input_text;  // the same literal for both inputs
  double min_seconds;
  char vmfb_path[PATH_MAX];
  double pcp_us;
  double iree_us;
} bench_case_t;

static double now_seconds(void) {
  pcp_clock_t clock = pcp_clock_system();
  return (double)pcp_clock_now_ns(clock) / 1e9;
}

static void compile_case(bench_case_t* c, const char* dir) {
  pcp_compile_request_t request = {.mlir_text = c->mlir,
                                   .mlir_byte_length = strlen(c->mlir),
                                   .source_name = c->name,
                                   .backend = PCP_COMPILE_BACKEND_CPU};
  pcp_compile_result_t result;
  check(pcp_compile_module(&request, &result), "compile");
  snprintf(c->vmfb_path, sizeof(c->vmfb_path), "%s/%s.vmfb", dir, c->name);
  check(
      pcp_file_write_atomic(c->vmfb_path, result.vmfb, result.vmfb_byte_length),
      "write vmfb");
  pcp_compile_result_deinitialize(&result);
}

#define ROUNDS 5

static double median(double* values, int n) {
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      if (values[j] < values[i]) {
        double t = values[i];
        values[i] = values[j];
        values[j] = t;
      }
    }
  }
  return values[n / 2];
}

static void measure_iree_once(bench_case_t* c, double* out_us);

// ROUNDS rounds, each one timed pcp batch then one iree-benchmark-module run
// of the same length, so load changes on the machine hit both sides alike;
// the medians are compared.
static void measure_pcp(bench_case_t* c, pcp_backend_t* backend) {
  void* vmfb = NULL;
  size_t length = 0;
  check(pcp_file_read_all(c->vmfb_path, PCP_MAX_PROGRAM_BYTES, &vmfb, &length),
        "read");
  pcp_program_t* program = NULL;
  check(pcp_program_load(backend, vmfb, length, &program), "load");
  free(vmfb);
  pcp_host_tensor_t host;
  check(pcp_host_tensor_parse(c->input_text, &host), "input");
  pcp_tensor_t* input = NULL;
  check(pcp_tensor_upload(backend, &host, &input), "upload");
  pcp_value_t inputs[2] = {pcp_value_resident(input),
                           pcp_value_resident(input)};
  pcp_tensor_t* result = NULL;
  size_t count = 0;
  for (int i = 0; i < 20; ++i) {  // warm up
    check(pcp_program_invoke(program, "main", inputs, 2, &result, 1, &count),
          "invoke");
    pcp_tensor_release(result);
  }
  double batches[ROUNDS], iree[ROUNDS];
  for (int b = 0; b < ROUNDS; ++b) {
    long iterations = 0;
    double start = now_seconds(), elapsed = 0;
    while (elapsed < c->min_seconds / ROUNDS) {
      for (int i = 0; i < 10; ++i) {
        check(
            pcp_program_invoke(program, "main", inputs, 2, &result, 1, &count),
            "invoke");
        pcp_tensor_release(result);
      }
      iterations += 10;
      elapsed = now_seconds() - start;
    }
    batches[b] = elapsed / (double)iterations * 1e6;
    measure_iree_once(c, &iree[b]);
  }
  c->pcp_us = median(batches, ROUNDS);
  c->iree_us = median(iree, ROUNDS);
  pcp_tensor_release(input);
  pcp_host_tensor_deinitialize(&host);
  pcp_program_release(program);
}

// Runs |argv| to completion, capturing stdout; returns its peak RSS in KiB.
static long run_tool(char* const* argv, char** out_stdout) {
  char path[] = "/tmp/pcp-bench-out-XXXXXX";
  int fd = mkstemp(path);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fd, STDOUT_FILENO);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &actions, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    fprintf(stderr, "invoke_overhead: cannot start %s: %s\n", argv[0],
            strerror(rc));
    exit(1);
  }
  int status = 0;
  struct rusage usage;
  while (wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "invoke_overhead: %s failed (status %d)\n", argv[0],
            status);
    exit(1);
  }
  if (out_stdout) {
    size_t n = 0;
    void* data = NULL;
    check(pcp_file_read_all(path, 64 << 20, &data, &n), "tool output");
    *out_stdout = data;
  }
  close(fd);
  unlink(path);
  return usage.ru_maxrss;
}

static void tool_path(const char* name, char* out, size_t capacity) {
  char site[PATH_MAX - 64];
  check(pcp_venv_site_packages(site, sizeof(site)), "venv");
  snprintf(out, capacity, "%s/iree/_runtime_libs/%s", site, name);
}

static void measure_iree_once(bench_case_t* c, double* out_us) {
  char tool[PATH_MAX], module[PATH_MAX + 16], input[256], min_time[64];
  tool_path("iree-benchmark-module", tool, sizeof(tool));
  snprintf(module, sizeof(module), "--module=%s", c->vmfb_path);
  snprintf(input, sizeof(input), "--input=%s", c->input_text);
  snprintf(min_time, sizeof(min_time), "--benchmark_min_time=%.2fs",
           c->min_seconds / ROUNDS);
  char* argv[] = {tool,     "--device=local-task",
                  module,   "--function=main",
                  input,    input,
                  min_time, "--benchmark_format=json",
                  NULL};
  char* out = NULL;
  run_tool(argv, &out);
  json_error_t error;
  json_t* root = json_loads(out, 0, &error);
  free(out);
  json_t* list = json_object_get(root, "benchmarks");
  double measured = -1;
  size_t i;
  json_t* entry;
  json_array_foreach(list, i, entry) {
    const char* run_type =
        json_string_value(json_object_get(entry, "run_type"));
    if (run_type && strcmp(run_type, "iteration") == 0) {
      double t = json_number_value(json_object_get(entry, "real_time"));
      const char* unit = json_string_value(json_object_get(entry, "time_unit"));
      double scale = !unit                 ? 1
                     : !strcmp(unit, "ns") ? 1e-3
                     : !strcmp(unit, "ms") ? 1e3
                                           : 1;
      measured = t * scale;
    }
  }
  json_decref(root);
  if (measured <= 0) {
    fprintf(stderr,
            "invoke_overhead: could not read iree-benchmark-module's time\n");
    exit(1);
  }
  *out_us = measured;
}

int main(int argc, char** argv) {
  double min_seconds = argc > 1 ? atof(argv[1]) : 3.0;
  char dir[] = "/tmp/pcp-bench-XXXXXX";
  if (!mkdtemp(dir))
    return 1;
  bench_case_t cases[2] = {
      {.name = "tiny",
       .mlir = kTiny,
       .input_text = "4xf32=1,2,3,4",
       .min_seconds = min_seconds},
      {.name = "matmul",
       .mlir = kMatmul,
       .input_text = "512x512xf32=0.5",
       .min_seconds = min_seconds},
  };
  for (int i = 0; i < 2; ++i) compile_case(&cases[i], dir);
  // RSS first, while this process is still small: a spawned child's
  // ru_maxrss starts from its parent's RSS (vfork shares the address space
  // until exec), so measuring after Python is loaded here would inflate
  // both sides equally and hide the difference.
  char pcp_path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", pcp_path, sizeof(pcp_path) - 1);
  pcp_path[n > 0 ? n : 0] = 0;
  char* slash = strrchr(pcp_path, '/');
  if (slash)
    *slash = 0;
  strncat(pcp_path, "/../pcp", sizeof(pcp_path) - strlen(pcp_path) - 1);
  char run_module[PATH_MAX], module_flag[PATH_MAX + 16];
  tool_path("iree-run-module", run_module, sizeof(run_module));
  snprintf(module_flag, sizeof(module_flag), "--module=%s", cases[0].vmfb_path);
  char* pcp_argv[] = {pcp_path,        "run",     cases[0].vmfb_path, "--input",
                      "4xf32=1,2,3,4", "--input", "4xf32=1,2,3,4",    NULL};
  char* iree_argv[] = {run_module,
                       "--device=local-task",
                       module_flag,
                       "--function=main",
                       "--input=4xf32=1,2,3,4",
                       "--input=4xf32=1,2,3,4",
                       NULL};
  long pcp_rss = run_tool(pcp_argv, NULL);
  long iree_rss = run_tool(iree_argv, NULL);
  pcp_backend_options_t options = {.driver = "cpu"};
  pcp_backend_t* backend = NULL;
  check(pcp_backend_create(&options, &backend), "backend");
  for (int i = 0; i < 2; ++i) {
    measure_pcp(&cases[i], backend);
    printf(
        "%-7s pcp_backend %10.2f us/call  iree-benchmark-module %10.2f us/call "
        " "
        "pcp/iree %.3f\n",
        cases[i].name, cases[i].pcp_us, cases[i].iree_us,
        cases[i].pcp_us / cases[i].iree_us);
  }
  pcp_backend_release(backend);

  char command[PATH_MAX + 16];
  snprintf(command, sizeof(command), "rm -rf %s", dir);
  if (system(command) != 0)
    fprintf(stderr, "could not remove %s\n", dir);
  printf("rss     pcp run %ld KiB  iree-run-module %ld KiB  pcp/iree %.3f\n",
         pcp_rss, iree_rss, (double)pcp_rss / (double)iree_rss);
  // Goals as pcp / iree (lower is better), one line each.
  static const double kGoals[2] = {1.5, 1.05};
  bool met = true;
  char goal[128];
  for (int i = 0; i < 2; ++i) {
    double ratio = cases[i].pcp_us / cases[i].iree_us;
    snprintf(goal, sizeof(goal), "%s pcp / iree time <= %.2fx (%.3fx)",
             cases[i].name, kGoals[i], ratio);
    met &= pcp_bench_goal("invoke_overhead", ratio <= kGoals[i], goal);
  }
  double rss_ratio = (double)pcp_rss / (double)iree_rss;
  snprintf(goal, sizeof(goal),
           "peak RSS pcp run / iree-run-module <= 1.30x (%.3fx)", rss_ratio);
  met &= pcp_bench_goal("invoke_overhead",
                        pcp_rss > 0 && iree_rss > 0 && rss_ratio <= 1.3, goal);
  printf("invoke_overhead ratio=%.3f\n", cases[0].iree_us / cases[0].pcp_us);
  return pcp_bench_exit_code(met);
}
