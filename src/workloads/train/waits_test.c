// SPDX-License-Identifier: Apache-2.0
// The training service's task waits (pcp_diloco_job_tasks_wait) on the real
// runner and a real fabric endpoint with no worker (a submitted task stays
// queued: a task that never ends by itself). With the hooks' wait/signal
// pair (the runner's job condition variable, as the training kind passes
// them) a cancel, a task's end and the deadline each end the wait; without
// it (the sliced fallback) a cancel still ends it. Prints the time from
// pcp_workloads_runner_job_cancel to the run's return for both (figures,
// not asserted: shared CI machines).

#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "workloads/train/service_impl.h"

static void expect_code_at(pcp_status_t status, pcp_status_code_t code,
                           const char* file, int line) {
  if (pcp_status_code(status) != code) {
    char text[1024] = "";
    pcp_status_format(status, text, sizeof(text));
    print_error("%s:%d: want %s, got %s\n", file, line,
                pcp_status_code_string(code), text);
    pcp_status_ignore(status);
    fail();
  }
  pcp_status_ignore(status);
}
#define EXPECT_CODE(expr, code) \
  expect_code_at((expr), (code), __FILE__, __LINE__)
#define EXPECT_OK(expr) EXPECT_CODE((expr), PCP_STATUS_OK)

#define TASKS 2

//===----------------------------------------------------------------------===//
// A kind whose run waits on fabric tasks through the service
//===----------------------------------------------------------------------===//

typedef struct waits_kind_t {
  pcp_fabric_endpoint_t* fabric;
  uint8_t program[PCP_SHA256_BYTE_LENGTH];
  bool event_driven;   // the hooks' wait/signal pair, or the sliced fallback
  int64_t timeout_ms;  // the task wait's deadline
  atomic_int waiting;  // set just before the run enters the task wait
  atomic_bool stopped;
  atomic_int cancelled_tasks;  // tasks that ended CANCELLED or past deadline
  atomic_int_least64_t returned_ns;
  _Atomic(pcp_fabric_task_t*) tasks[TASKS];
} waits_kind_t;

typedef struct waits_run_t {
  pcp_workloads_job_t* job;
} waits_run_t;

static bool run_should_stop(void* user_data) {
  return pcp_workloads_job_should_stop(((waits_run_t*)user_data)->job);
}

static bool run_wait(void* user_data, bool (*ready)(void* arg), void* arg,
                     bool stop_wakes, int64_t timeout_ms) {
  return pcp_workloads_job_wait_for(((waits_run_t*)user_data)->job, ready, arg,
                                    stop_wakes, timeout_ms);
}

static void run_signal(void* user_data) {
  pcp_workloads_job_signal(((waits_run_t*)user_data)->job);
}

static pcp_status_t waits_run(void* self, pcp_workloads_job_t* job) {
  waits_kind_t* k = self;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_workloads_job_transition(job, PCP_STORE_JOB_STATE_PLACING, NULL));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_workloads_job_transition(job, PCP_STORE_JOB_STATE_COMPILING, NULL));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_workloads_job_transition(job, PCP_STORE_JOB_STATE_RUNNING, NULL));
  waits_run_t run = {.job = job};
  pcp_diloco_job_options_t options = {
      .job_id = pcp_workloads_job_id(job),
      .fabric = k->fabric,
      .clock = pcp_clock_system(),
      .hooks = {.should_stop = run_should_stop, .user_data = &run},
  };
  if (k->event_driven) {
    options.hooks.wait = run_wait;
    options.hooks.signal = run_signal;
  }
  job_t service_job;
  memset(&service_job, 0, sizeof(service_job));
  service_job.options = &options;
  service_job.allocator = pcp_allocator_system();
  service_job.log.job_id = options.job_id;
  PCP_RETURN_IF_ERROR_BARE(pcp_diloco_job_waker_create(&service_job));
  assert_true((service_job.waker != NULL) == k->event_driven);
  pcp_fabric_task_t* tasks[TASKS] = {NULL};
  pcp_status_t status = pcp_ok_status();
  for (int i = 0; i < TASKS && !status; ++i) {
    pcp_fabric_task_params_t params;
    memset(&params, 0, sizeof(params));
    memcpy(params.program, k->program, sizeof(params.program));
    params.function = "main";
    params.max_attempts = 1;
    status = pcp_diloco_job_task_submit(&service_job, &params, &tasks[i]);
    atomic_store(&k->tasks[i], tasks[i]);
  }
  if (!status) {
    atomic_store(&k->waiting, 1);
    bool stopped = pcp_diloco_job_tasks_wait(&service_job, tasks, TASKS,
                                             k->timeout_ms, "waits test");
    atomic_store(&k->stopped, stopped);
    for (int i = 0; i < TASKS; ++i) {
      pcp_status_code_t code =
          pcp_status_code(pcp_fabric_task_status(tasks[i]));
      assert_true(pcp_fabric_task_is_done(tasks[i]));
      atomic_fetch_add(
          &k->cancelled_tasks,
          code == PCP_STATUS_CANCELLED || code == PCP_STATUS_DEADLINE_EXCEEDED);
    }
    if (stopped) {
      status = pcp_make_status(PCP_STATUS_CANCELLED, "stopped");
    }
  }
  for (int i = 0; i < TASKS; ++i) {
    atomic_store(&k->tasks[i], NULL);
    pcp_fabric_task_release(tasks[i]);
  }
  pcp_diloco_job_waker_detach(&service_job);
  atomic_store(&k->returned_ns, pcp_clock_now_ns(pcp_clock_system()));
  return status;
}

static pcp_status_t waits_validate(void* self, const json_t* spec) {
  (void)self;
  (void)spec;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Harness
//===----------------------------------------------------------------------===//

typedef struct harness_t {
  char dir[64];
  pcp_store_t* store;
  pcp_fabric_endpoint_t* fabric;
  pcp_workloads_runner_t* runner;
  waits_kind_t kind;
  pcp_workloads_kind_t kind_table;
  int jobs;
} harness_t;

static int harness_setup(void** state) {
  harness_t* h = calloc(1, sizeof(*h));
  snprintf(h->dir, sizeof(h->dir), "/tmp/pcp-waits-test-XXXXXX");
  assert_non_null(mkdtemp(h->dir));
  pcp_store_options_t store_options;
  pcp_store_options_initialize(&store_options);
  store_options.state_dir = h->dir;
  EXPECT_OK(
      pcp_store_create(&store_options, pcp_allocator_system(), &h->store));
  setenv("PCP_WAITS_TEST_JOIN", "token", 1);
  pcp_fabric_options_t fabric_options;
  pcp_fabric_options_initialize(&fabric_options);
  fabric_options.join_token_env = "PCP_WAITS_TEST_JOIN";
  EXPECT_OK(pcp_fabric_endpoint_create(&fabric_options, pcp_allocator_system(),
                                       &h->fabric));
  static const char kProgram[] = "not a real program: no worker runs it";
  EXPECT_OK(pcp_fabric_program_register(h->fabric, kProgram, sizeof(kProgram),
                                        "cpu", "", h->kind.program));
  h->kind.fabric = h->fabric;
  h->kind_table = (pcp_workloads_kind_t){.name = "waits",
                                         .max_running = 1,
                                         .self = &h->kind,
                                         .validate = waits_validate,
                                         .run = waits_run};
  pcp_workloads_runner_options_t options = {
      .store = h->store,
      .kinds = &h->kind_table,
      .kind_count = 1,
  };
  EXPECT_OK(pcp_workloads_runner_create(&options, pcp_allocator_system(),
                                        &h->runner));
  EXPECT_OK(pcp_workloads_runner_start(h->runner));
  *state = h;
  return 0;
}

static int harness_teardown(void** state) {
  harness_t* h = *state;
  pcp_workloads_runner_release(h->runner);
  pcp_fabric_endpoint_release(h->fabric);
  pcp_store_release(h->store);
  char command[128];
  snprintf(command, sizeof(command), "rm -rf %s", h->dir);
  if (system(command) != 0) {
    print_error("could not remove %s\n", h->dir);
  }
  free(h);
  return 0;
}

static pcp_store_job_state_t state_of(harness_t* h, const char* id) {
  pcp_store_job_t job;
  EXPECT_OK(pcp_store_job_get(h->store, id, &job));
  pcp_store_job_state_t state = job.state;
  pcp_store_job_deinitialize(&job);
  return state;
}

// Submits a job and returns once its run is inside the task wait.
static void job_start(harness_t* h, bool event_driven, int64_t timeout_ms,
                      char* out_id, size_t id_size) {
  waits_kind_t* k = &h->kind;
  k->event_driven = event_driven;
  k->timeout_ms = timeout_ms;
  atomic_store(&k->waiting, 0);
  atomic_store(&k->stopped, false);
  atomic_store(&k->cancelled_tasks, 0);
  atomic_store(&k->returned_ns, 0);
  snprintf(out_id, id_size, "waits-%d", h->jobs++);
  json_t* spec = json_object();
  EXPECT_OK(pcp_workloads_runner_job_submit(h->runner, out_id, "waits", spec,
                                            NULL, NULL, NULL));
  json_decref(spec);
  pcp_workloads_runner_wake(h->runner);
  for (int i = 0; i < 10000 && !atomic_load(&k->waiting); ++i) {
    pcp_sleep_ms(1);
  }
  assert_int_equal(atomic_load(&k->waiting), 1);
}

// pcp_workloads_runner_job_cancel of a job waiting on its tasks, |delay_ms|
// after it entered the wait; the milliseconds until its run returned.
static double cancel_and_time(harness_t* h, bool event_driven, int64_t delay_ms,
                              double* out_after_call_ms) {
  char id[32];
  job_start(h, event_driven, 60000, id, sizeof(id));
  pcp_sleep_ms(delay_ms);
  int64_t t0 = pcp_clock_now_ns(pcp_clock_system());
  pcp_store_job_state_t after;
  bool moved = false;
  EXPECT_OK(pcp_workloads_runner_job_cancel(h->runner, id, &after, &moved));
  int64_t t1 = pcp_clock_now_ns(pcp_clock_system());
  assert_true(moved);
  // Generous: the wait's own deadline is 60 s.
  assert_true(pcp_workloads_runner_idle_wait(h->runner, 20000));
  assert_true(atomic_load(&h->kind.stopped));
  assert_int_equal(atomic_load(&h->kind.cancelled_tasks), TASKS);
  assert_int_equal(state_of(h, id), PCP_STORE_JOB_STATE_CANCELLED);
  *out_after_call_ms = (double)(atomic_load(&h->kind.returned_ns) - t1) / 1e6;
  return (double)(atomic_load(&h->kind.returned_ns) - t0) / 1e6;
}

//===----------------------------------------------------------------------===//
// Tests
//===----------------------------------------------------------------------===//

// The cancel reaches the wait both ways; printed: cancel -> run returned.
static void cancel_ends_task_wait(void** state) {
  harness_t* h = *state;
  enum { kRounds = 8 };
  for (int mode = 0; mode < 2; ++mode) {
    bool event_driven = mode == 1;
    double sum = 0, min = 1e18, max = 0, after_call = 0;
    for (int r = 0; r < kRounds; ++r) {
      // Spread over the 100 ms slice of the fallback.
      double call_ms = 0;
      double ms =
          cancel_and_time(h, event_driven, 5 + (r * 37) % 100, &call_ms);
      sum += ms;
      after_call += call_ms;
      min = ms < min ? ms : min;
      max = ms > max ? ms : max;
    }
    printf(
        "cancel -> run returned (%s): mean %.2f ms, min %.2f ms, max %.2f ms "
        "over %d jobs; from the cancel call's return: mean %.2f ms\n",
        event_driven ? "event-driven wait" : "sliced fallback, WAIT_SLICE_MS",
        sum / kRounds, min, max, kRounds, after_call / kRounds);
  }
}

// With the waiter, a task's end alone wakes the wait (the DONE callback
// signals the job's condition variable): the test ends the queued tasks
// from outside, and the run returns long before its 60 s deadline, not
// stopped.
static void task_end_wakes_wait(void** state) {
  harness_t* h = *state;
  char id[32];
  job_start(h, true, 60000, id, sizeof(id));
  pcp_sleep_ms(20);
  for (int i = 0; i < TASKS; ++i) {
    pcp_fabric_task_t* task = atomic_load(&h->kind.tasks[i]);
    assert_non_null(task);
    pcp_fabric_task_cancel(task);
  }
  assert_true(pcp_workloads_runner_idle_wait(h->runner, 20000));
  assert_false(atomic_load(&h->kind.stopped));
  assert_int_equal(atomic_load(&h->kind.cancelled_tasks), TASKS);
  assert_int_equal(state_of(h, id), PCP_STORE_JOB_STATE_SUCCEEDED);
}

// The deadline still holds with the waiter: past it the tasks are cancelled
// (not before) and the run goes on, not stopped.
static void deadline_cancels_tasks(void** state) {
  harness_t* h = *state;
  char id[32];
  int64_t t0 = pcp_clock_now_ns(pcp_clock_system());
  job_start(h, true, 300, id, sizeof(id));
  assert_true(pcp_workloads_runner_idle_wait(h->runner, 20000));
  int64_t waited_ms = (atomic_load(&h->kind.returned_ns) - t0) / 1000000;
  assert_true(waited_ms >= 300);
  assert_false(atomic_load(&h->kind.stopped));
  assert_int_equal(atomic_load(&h->kind.cancelled_tasks), TASKS);
  assert_int_equal(state_of(h, id), PCP_STORE_JOB_STATE_SUCCEEDED);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(cancel_ends_task_wait, harness_setup,
                                      harness_teardown),
      cmocka_unit_test_setup_teardown(task_end_wakes_wait, harness_setup,
                                      harness_teardown),
      cmocka_unit_test_setup_teardown(deadline_cancels_tasks, harness_setup,
                                      harness_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
