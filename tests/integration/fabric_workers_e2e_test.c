// SPDX-License-Identifier: Apache-2.0
//
// Issue 3 item 7, end to end with real processes on 127.0.0.1: the
// gateway's fabric endpoint (src/fabric, in this process) and
// `pcp --node-manager --scale 2` supervising two real CPU workers.
//   1. both workers join (ids from upstream's stable-id rule, device 0, 1);
//   2. each runs a task of a real VMFB (matmul + add, compiled here) and
//      returns the values computed in C; a 20 MiB input and output travel
//      as chunked tensor blobs;
//   3. SIGKILL of a worker in the middle of its task: the supervisor
//      restarts it, it rejoins with the same id, and the task is re-run and
//      completes;
//   4. SIGSTOP of a worker for half the silence timeout: no eviction;
//   5. SIGSTOP past the timeout: the worker is evicted and its running task
//      is reassigned to the other worker, which completes it.
// Then SIGTERM to the node manager stops both workers (exit 0).
//
// A wrapper (--worker-exe) records each worker's pid per device id and adds
// a per-task delay (--test-task-delay-ms), so a task is reliably running
// when the test kills or stops its worker.

// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compile/compile.h"
#include "fabric/fabric.h"
#include "roles/roles.h"

#define HEARTBEAT_MS 300
#define TASK_DELAY_MS 1200
#define TOKEN "fabric-e2e-token"

static const char kProgramMlir[] =
    "func.func @main(%x: tensor<2x3xf32>, %w: tensor<3x2xf32>,"
    " %b: tensor<2x2xf32>) -> tensor<2x2xf32> {\n"
    "  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] :"
    " (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>\n"
    "  %1 = stablehlo.add %0, %b : tensor<2x2xf32>\n"
    "  return %1 : tensor<2x2xf32>\n}\n";

// Over the 16 MiB chunk size both ways: the input reaches the worker as a
// chunked tensor blob and the output comes back as one.
#define LARGE_ELEMENTS (5 << 20)
static const char kLargeMlir[] =
    "func.func @twice(%x: tensor<5242880xf32>) -> tensor<5242880xf32> {\n"
    "  %0 = stablehlo.add %x, %x : tensor<5242880xf32>\n"
    "  return %0 : tensor<5242880xf32>\n}\n";

static const float kX[6] = {1, 2, 3, 4, 5, 6};
static const float kW[6] = {0.5f, -1, 2, 0.25f, -3, 1};
static const float kB[4] = {10, 20, 30, 40};

static struct {
  char dir[512];
  char log_path[600];
  pcp_fabric_endpoint_t* endpoint;
  uint8_t program[PCP_SHA256_BYTE_LENGTH];
  uint8_t large_program[PCP_SHA256_BYTE_LENGTH];
  pid_t node_manager;
  char* worker_ids[2];
} g;

static int64_t now_ms(void) {
  return pcp_clock_now_ns(pcp_clock_system()) / 1000000;
}

static void print_log(void) {
  FILE* f = fopen(g.log_path, "r");
  if (!f)
    return;
  char line[4096];
  fprintf(stderr, "---- node manager + workers log ----\n");
  while (fgets(line, sizeof(line), f)) fputs(line, stderr);
  fclose(f);
}

#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      print_log();                                                    \
      fail_msg("%s:%d: check failed: %s", __FILE__, __LINE__, #cond); \
    }                                                                 \
  } while (0)

static void check_ok(pcp_status_t status) {
  if (status) {
    char text[2048];
    pcp_status_format(status, text, sizeof(text));
    pcp_status_ignore(status);
    print_log();
    fail_msg("unexpected status: %s", text);
  }
}

// The pid the wrapper recorded for |device| (0 when none yet).
static pid_t worker_pid(int device) {
  char path[640];
  snprintf(path, sizeof(path), "%s/pid-%d", g.dir, device);
  FILE* f = fopen(path, "r");
  if (!f)
    return 0;
  long pid = 0;
  if (fscanf(f, "%ld", &pid) != 1)
    pid = 0;
  fclose(f);
  return (pid_t)pid;
}

static bool query(int device, pcp_fabric_worker_info_t* info) {
  pcp_status_t status =
      pcp_fabric_worker_query(g.endpoint, g.worker_ids[device], info);
  if (status) {
    pcp_status_ignore(status);
    return false;
  }
  return true;
}

static bool connected(int device) {
  pcp_fabric_worker_info_t info;
  return query(device, &info) && info.state == PCP_FABRIC_WORKER_CONNECTED;
}

static void expected(float out[4]) {
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      float sum = 0;
      for (int k = 0; k < 3; ++k) sum += kX[i * 3 + k] * kW[k * 2 + j];
      out[i * 2 + j] = sum + kB[i * 2 + j];
    }
  }
}

static pcp_proto_section_t section_f32(const char* name, const float* data,
                                       int64_t rows, int64_t cols) {
  pcp_proto_section_t s;
  memset(&s, 0, sizeof(s));
  s.name = name;
  s.element_type = PCP_ELEMENT_TYPE_F32;
  s.rank = 2;
  s.shape[0] = rows;
  s.shape[1] = cols;
  s.data = data;
  return s;
}

static const pcp_proto_section_t* inputs(void) {
  static pcp_proto_section_t sections[3];
  sections[0] = section_f32("x", kX, 2, 3);
  sections[1] = section_f32("w", kW, 3, 2);
  sections[2] = section_f32("b", kB, 2, 2);
  return sections;
}

// Submits main(x, w, b) on |worker_id| (NULL: any cpu worker).
static pcp_fabric_task_t* submit(const char* worker_id) {
  pcp_fabric_task_params_t params;
  memset(&params, 0, sizeof(params));
  memcpy(params.program, g.program, sizeof(params.program));
  params.function = "main";
  params.inputs = inputs();
  params.input_count = 3;
  params.worker_class = PCP_SCHED_WORKER_CLASS_CPU;
  params.worker_id = worker_id;
  params.max_attempts = 5;
  pcp_fabric_task_t* task = NULL;
  check_ok(pcp_fabric_task_submit(g.endpoint, &params, &task));
  return task;
}

static void check_result(pcp_fabric_task_t* task) {
  CHECK(pcp_fabric_task_wait(task, 30000));
  check_ok(pcp_status_clone(pcp_fabric_task_status(task)));
  const pcp_proto_section_t* outputs = NULL;
  size_t count = 0;
  check_ok(pcp_fabric_task_outputs(task, &outputs, &count));
  CHECK(count == 1);
  CHECK(outputs[0].element_type == PCP_ELEMENT_TYPE_F32);
  CHECK(outputs[0].rank == 2 && outputs[0].shape[0] == 2 &&
        outputs[0].shape[1] == 2);
  float want[4];
  expected(want);
  const float* got = outputs[0].data;
  for (int i = 0; i < 4; ++i) {
    if (got[i] < want[i] - 1e-4f || got[i] > want[i] + 1e-4f) {
      print_log();
      fail_msg("output[%d] = %g, expected %g", i, got[i], want[i]);
    }
  }
}

// Polls |cond(device)| for up to |timeout_ms|.
static bool wait_until(bool (*cond)(int), int device, int timeout_ms) {
  int64_t deadline = now_ms() + timeout_ms;
  while (now_ms() < deadline) {
    if (cond(device))
      return true;
    pcp_sleep_ms(20);
  }
  return cond(device);
}

static bool task_running(pcp_fabric_task_t* task, int timeout_ms) {
  int64_t deadline = now_ms() + timeout_ms;
  while (now_ms() < deadline) {
    pcp_fabric_task_info_t info;
    pcp_fabric_task_info_query(task, &info);
    if (info.progress_state == PCP_PROTO_TASK_RUNNING)
      return true;
    pcp_sleep_ms(10);
  }
  return false;
}

static int device_of(const char* worker_id) {
  for (int d = 0; d < 2; ++d) {
    if (strcmp(worker_id, g.worker_ids[d]) == 0)
      return d;
  }
  return -1;
}

//===----------------------------------------------------------------------===//
// Setup: compile, endpoint, node manager
//===----------------------------------------------------------------------===//

// Temporary directories live under the build tree ($PCP_CACHE_DIR, set by
// ctest), not directly in /tmp, where other jobs clean up by pattern.
static bool make_test_dir(const char* name, char* out, size_t capacity) {
  const char* base = getenv("PCP_CACHE_DIR");
  char parent[512];
  snprintf(parent, sizeof(parent), "%s/tmp", base && base[0] ? base : "/tmp");
  pcp_status_t status = pcp_file_make_directories(parent);
  if (status) {
    pcp_status_ignore(status);
    return false;
  }
  int n = snprintf(out, capacity, "%s/%s-XXXXXX", parent, name);
  return n > 0 && (size_t)n < capacity && mkdtemp(out) != NULL;
}

static int setup(void** state) {
  (void)state;
  if (!make_test_dir("fabric-e2e", g.dir, sizeof(g.dir))) {
    return -1;
  }
  snprintf(g.log_path, sizeof(g.log_path), "%s/node-manager.log", g.dir);
  setenv("PCP_WORKER_JOIN_TOKEN", TOKEN, 1);
  unsetenv("PCP_WORKER_ID");

  pcp_compile_request_t request = {.mlir_text = kProgramMlir,
                                   .mlir_byte_length = strlen(kProgramMlir),
                                   .source_name = "fabric_e2e.mlir",
                                   .backend = PCP_COMPILE_BACKEND_CPU};
  pcp_compile_result_t compiled;
  pcp_status_t status = pcp_compile_module(&request, &compiled);
  if (status) {
    char text[4096];
    pcp_status_format(status, text, sizeof(text));
    pcp_status_ignore(status);
    fprintf(stderr, "compile: %s\n", text);
    return -1;
  }

  pcp_fabric_options_t options;
  pcp_fabric_options_initialize(&options);
  options.heartbeat_interval_ms = HEARTBEAT_MS;
  options.join_token_env = "PCP_WORKER_JOIN_TOKEN";
  PCP_CHECK_OK(pcp_fabric_endpoint_create(&options, pcp_allocator_system(),
                                          &g.endpoint));
  PCP_CHECK_OK(pcp_fabric_program_register(g.endpoint, compiled.vmfb,
                                           compiled.vmfb_byte_length, "cpu", "",
                                           g.program));
  pcp_compile_result_deinitialize(&compiled);
  request.mlir_text = kLargeMlir;
  request.mlir_byte_length = strlen(kLargeMlir);
  PCP_CHECK_OK(pcp_compile_module(&request, &compiled));
  PCP_CHECK_OK(pcp_fabric_program_register(g.endpoint, compiled.vmfb,
                                           compiled.vmfb_byte_length, "cpu", "",
                                           g.large_program));
  pcp_compile_result_deinitialize(&compiled);

  for (int d = 0; d < 2; ++d) {
    PCP_CHECK_OK(pcp_roles_worker_id_build(
        "cpu", NULL, d, pcp_roles_getenv_process, NULL, &g.worker_ids[d]));
  }

  // The wrapper: records the pid (exec keeps it) and adds the test flags.
  const char* pcp = getenv("PCP_BINARY");
  if (!pcp)
    return -1;
  char wrapper[640];
  snprintf(wrapper, sizeof(wrapper), "%s/worker.sh", g.dir);
  FILE* f = fopen(wrapper, "w");
  if (!f)
    return -1;
  fprintf(f,
          "#!/bin/sh\n"
          "dev=x; prev=\n"
          "for a in \"$@\"; do\n"
          "  [ \"$prev\" = --device-id ] && dev=$a\n"
          "  prev=$a\n"
          "done\n"
          "echo $$ > '%s/pid-'$dev.tmp && mv '%s/pid-'$dev.tmp '%s/pid-'$dev\n"
          "exec '%s' \"$@\" --cache-dir '%s/cache' --cpu-threads 1 "
          "--test-task-delay-ms %d\n",
          g.dir, g.dir, g.dir, pcp, g.dir, TASK_DELAY_MS);
  fclose(f);
  chmod(wrapper, 0755);

  char port[16];
  snprintf(port, sizeof(port), "%u", pcp_fabric_endpoint_port(g.endpoint));
  g.node_manager = fork();
  if (g.node_manager < 0)
    return -1;
  if (g.node_manager == 0) {
    FILE* log = freopen(g.log_path, "w", stderr);
    (void)log;
    const char* args[] = {pcp,
                          "--node-manager",
                          "--scale",
                          "2",
                          "--host",
                          "127.0.0.1",
                          "--port",
                          port,
                          "--backend",
                          "cpu",
                          "--api-port",
                          "0",
                          "--worker-exe",
                          wrapper,
                          "--start-stagger-ms",
                          "50",
                          "--running-after-ms",
                          "200",
                          "--restart-min-ms",
                          "100",
                          "--restart-max-ms",
                          "200",
                          "--stop-grace-ms",
                          "5000",
                          NULL};
    execv(pcp, (char* const*)args);
    _exit(127);
  }
  return 0;
}

static int teardown(void** state) {
  (void)state;
  if (g.node_manager > 0 && waitpid(g.node_manager, NULL, WNOHANG) == 0) {
    kill(g.node_manager, SIGTERM);
    for (int i = 0; i < 200; ++i) {
      if (waitpid(g.node_manager, NULL, WNOHANG) != 0) {
        g.node_manager = -1;
        break;
      }
      pcp_sleep_ms(50);
    }
    if (g.node_manager > 0) {
      kill(g.node_manager, SIGKILL);
      waitpid(g.node_manager, NULL, 0);
    }
  }
  // Workers stopped by SIGSTOP and orphaned by a failed check must not
  // linger: continue and kill whatever the pid files name, if still ours.
  for (int d = 0; d < 2; ++d) {
    pid_t pid = worker_pid(d);
    if (pid > 0 && kill(pid, 0) == 0) {
      kill(pid, SIGCONT);
    }
  }
  pcp_fabric_endpoint_release(g.endpoint);
  for (int d = 0; d < 2; ++d) free(g.worker_ids[d]);
  char command[700];
  snprintf(command, sizeof(command), "rm -rf '%s'", g.dir);
  int ignored = system(command);
  (void)ignored;
  return 0;
}

//===----------------------------------------------------------------------===//
// The scenario
//===----------------------------------------------------------------------===//

static void both_workers_join(void** state) {
  (void)state;
  CHECK(wait_until(connected, 0, 30000));
  CHECK(wait_until(connected, 1, 30000));
  for (int d = 0; d < 2; ++d) {
    pcp_fabric_worker_info_t info;
    CHECK(query(d, &info));
    CHECK(strcmp(info.backend, "cpu") == 0);
    CHECK(info.device_id == d);
    CHECK(info.supervisor_id >= 0);
    CHECK(info.join_count == 1);
    CHECK(worker_pid(d) > 0);
  }
}

static void each_worker_runs_a_task(void** state) {
  (void)state;
  pcp_fabric_task_t* tasks[2] = {submit(g.worker_ids[0]),
                                 submit(g.worker_ids[1])};
  for (int d = 0; d < 2; ++d) {
    check_result(tasks[d]);
    pcp_fabric_task_info_t info;
    pcp_fabric_task_info_query(tasks[d], &info);
    CHECK(strcmp(info.worker_id.value, g.worker_ids[d]) == 0);
    CHECK(info.attempts == 1);
    pcp_fabric_task_release(tasks[d]);
  }
}

static void large_tensors_travel_as_chunked_blobs(void** state) {
  (void)state;
  float* x = malloc((size_t)LARGE_ELEMENTS * sizeof(float));
  CHECK(x != NULL);
  for (int i = 0; i < LARGE_ELEMENTS; ++i) x[i] = (float)(i % 1000) - 500.0f;
  pcp_proto_section_t input;
  memset(&input, 0, sizeof(input));
  input.name = "x";
  input.element_type = PCP_ELEMENT_TYPE_F32;
  input.rank = 1;
  input.shape[0] = LARGE_ELEMENTS;
  input.data = x;
  pcp_fabric_task_params_t params;
  memset(&params, 0, sizeof(params));
  memcpy(params.program, g.large_program, sizeof(params.program));
  params.function = "twice";
  params.inputs = &input;
  params.input_count = 1;
  params.worker_id = g.worker_ids[1];
  pcp_fabric_task_t* task = NULL;
  check_ok(pcp_fabric_task_submit(g.endpoint, &params, &task));
  CHECK(pcp_fabric_task_wait(task, 60000));
  check_ok(pcp_status_clone(pcp_fabric_task_status(task)));
  const pcp_proto_section_t* outputs = NULL;
  size_t count = 0;
  check_ok(pcp_fabric_task_outputs(task, &outputs, &count));
  CHECK(count == 1);
  CHECK(outputs[0].rank == 1 && outputs[0].shape[0] == LARGE_ELEMENTS);
  CHECK(outputs[0].byte_length == (uint64_t)LARGE_ELEMENTS * sizeof(float));
  const float* y = outputs[0].data;
  int wrong = 0;
  for (int i = 0; i < LARGE_ELEMENTS; ++i) wrong += y[i] != 2 * x[i];
  CHECK(wrong == 0);
  pcp_fabric_task_release(task);
  free(x);
}

static void killed_worker_rejoins_and_its_task_reruns(void** state) {
  (void)state;
  pid_t old_pid = worker_pid(0);
  pcp_fabric_task_t* task = submit(g.worker_ids[0]);
  CHECK(task_running(task, 10000));
  CHECK(kill(old_pid, SIGKILL) == 0);
  check_result(task);
  pcp_fabric_task_info_t info;
  pcp_fabric_task_info_query(task, &info);
  CHECK(info.attempts == 2);
  CHECK(strcmp(info.worker_id.value, g.worker_ids[0]) == 0);
  pcp_fabric_task_release(task);
  pcp_fabric_worker_info_t worker;
  CHECK(query(0, &worker));
  CHECK(worker.state == PCP_FABRIC_WORKER_CONNECTED);
  CHECK(worker.join_count == 2);  // the same id, rejoined
  pid_t new_pid = worker_pid(0);
  CHECK(new_pid > 0 && new_pid != old_pid);  // restarted by the supervisor
}

static void short_sigstop_is_not_an_eviction(void** state) {
  (void)state;
  pid_t pid = worker_pid(1);
  pcp_fabric_worker_info_t before;
  // Stop right after the gateway heard from the worker, so the silence the
  // gateway sees is the stop itself (plus scheduling), not up to H more.
  int64_t deadline = now_ms() + 5000;
  for (;;) {
    CHECK(query(1, &before));
    if (before.heartbeat_age_ns < 20 * 1000000LL || now_ms() > deadline) {
      break;
    }
    pcp_sleep_ms(2);
  }
  // Half the silence timeout (3H).
  CHECK(kill(pid, SIGSTOP) == 0);
  pcp_sleep_ms(3 * HEARTBEAT_MS / 2);
  CHECK(kill(pid, SIGCONT) == 0);
  // The stop's length is the test; what follows waits on an observation:
  // a heartbeat heard after SIGCONT (its age is below the time since).
  int64_t continued_at = now_ms();
  pcp_fabric_worker_info_t after;
  for (;;) {
    CHECK(query(1, &after));
    int64_t since_ns = (now_ms() - continued_at) * 1000000LL;
    if (after.heartbeat_age_ns < since_ns)
      break;
    CHECK(now_ms() - continued_at < 10000);  // heard from within 10 s
    pcp_sleep_ms(5);
  }
  CHECK(after.state == PCP_FABRIC_WORKER_CONNECTED);
  CHECK(after.eviction_count == before.eviction_count);
  CHECK(after.join_count == before.join_count);
}

static void long_sigstop_evicts_and_reassigns(void** state) {
  (void)state;
  // Placed by class: whichever worker gets it is the one stopped.
  pcp_fabric_task_t* task = submit(NULL);
  CHECK(task_running(task, 10000));
  pcp_fabric_task_info_t info;
  pcp_fabric_task_info_query(task, &info);
  int stopped = device_of(info.worker_id.value);
  CHECK(stopped >= 0);
  pid_t pid = worker_pid(stopped);
  pcp_fabric_worker_info_t before;
  CHECK(query(stopped, &before));
  int64_t stopped_at = now_ms();
  CHECK(kill(pid, SIGSTOP) == 0);
  // Evicted within two heartbeat intervals of the 3H timeout.
  pcp_fabric_worker_info_t during;
  bool evicted = false;
  while (now_ms() - stopped_at < 3 * HEARTBEAT_MS + 2 * HEARTBEAT_MS + 500) {
    CHECK(query(stopped, &during));
    if (during.eviction_count > before.eviction_count) {
      evicted = true;
      break;
    }
    pcp_sleep_ms(10);
  }
  CHECK(evicted);
  CHECK(during.state == PCP_FABRIC_WORKER_LOST);
  // The task moves to the other worker and completes there.
  check_result(task);
  pcp_fabric_task_info_query(task, &info);
  CHECK(info.attempts >= 2);
  CHECK(device_of(info.worker_id.value) == 1 - stopped);
  pcp_fabric_task_release(task);
  // Resumed, the stopped worker comes back under its id.
  CHECK(kill(pid, SIGCONT) == 0);
  CHECK(wait_until(connected, stopped, 15000));
  pcp_fabric_worker_info_t back;
  CHECK(query(stopped, &back));
  CHECK(back.join_count == before.join_count + 1);
}

static void node_manager_stops_its_workers(void** state) {
  (void)state;
  pid_t pids[2] = {worker_pid(0), worker_pid(1)};
  CHECK(kill(g.node_manager, SIGTERM) == 0);
  int status = -1;
  for (int i = 0; i < 300; ++i) {
    if (waitpid(g.node_manager, &status, WNOHANG) == g.node_manager)
      break;
    status = -1;
    pcp_sleep_ms(50);
  }
  CHECK(status != -1);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  g.node_manager = -1;
  for (int d = 0; d < 2; ++d) {
    CHECK(kill(pids[d], 0) != 0);  // gone (reaped by the node manager)
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(both_workers_join),
      cmocka_unit_test(each_worker_runs_a_task),
      cmocka_unit_test(large_tensors_travel_as_chunked_blobs),
      cmocka_unit_test(killed_worker_rejoins_and_its_task_reruns),
      cmocka_unit_test(short_sigstop_is_not_an_eviction),
      cmocka_unit_test(long_sigstop_evicts_and_reassigns),
      cmocka_unit_test(node_manager_stops_its_workers),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
