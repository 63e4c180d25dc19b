// SPDX-License-Identifier: Apache-2.0
//
// pcp_loop_t: post queue (4 threads, exactly once, bounded), timers
// (ordering, cancel, repeat), stop, signals and child processes.

#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "net/net.h"

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

static pcp_loop_t* make_loop(size_t post_capacity) {
  pcp_loop_options_t options = pcp_loop_options_default();
  options.post_queue_capacity = post_capacity;
  pcp_loop_t* loop = NULL;
  PCP_CHECK_OK(pcp_loop_create(&options, &loop));
  return loop;
}

static bool deadline_expired;

static void on_deadline(void* user_data, pcp_loop_timer_t* timer,
                        pcp_status_code_t code) {
  PCP_UNUSED(timer);
  if (code == PCP_STATUS_OK) {
    deadline_expired = true;
    pcp_loop_stop((pcp_loop_t*)user_data);
  }
}

// Runs |loop| until something stops it, failing the test if that takes
// longer than |limit_ms| (every test is bounded in time).
static void run_bounded(pcp_loop_t* loop, uint64_t limit_ms) {
  deadline_expired = false;
  pcp_loop_timer_t* timer = NULL;
  PCP_CHECK_OK(
      pcp_loop_timer_start(loop, limit_ms, 0, on_deadline, loop, &timer));
  PCP_CHECK_OK(pcp_loop_run(loop));
  if (deadline_expired) {
    fail_msg("loop did not stop within %llu ms", (unsigned long long)limit_ms);
  }
  pcp_loop_timer_cancel(timer);
}

//===----------------------------------------------------------------------===//
// Post queue
//===----------------------------------------------------------------------===//

enum { THREAD_COUNT = 4, POSTS_PER_THREAD = 5000 };

typedef struct post_fixture_t {
  pcp_loop_t* loop;
  uint8_t seen[THREAD_COUNT * POSTS_PER_THREAD];
  int total;
  int wrong_thread;
  int cancelled;
  _Atomic int exhausted;
} post_fixture_t;

typedef struct post_item_t {
  post_fixture_t* fixture;
  int id;
} post_item_t;

static post_item_t items[THREAD_COUNT * POSTS_PER_THREAD];

static void on_post(void* user_data, pcp_status_code_t code) {
  post_item_t* item = (post_item_t*)user_data;
  post_fixture_t* f = item->fixture;
  if (code != PCP_STATUS_OK) {
    ++f->cancelled;
    return;
  }
  if (!pcp_loop_is_loop_thread(f->loop)) {
    ++f->wrong_thread;
  }
  ++f->seen[item->id];
  if (++f->total == THREAD_COUNT * POSTS_PER_THREAD) {
    pcp_loop_stop(f->loop);
  }
}

typedef struct thread_arg_t {
  post_fixture_t* fixture;
  int index;
} thread_arg_t;

static void* poster(void* arg) {
  thread_arg_t* t = (thread_arg_t*)arg;
  for (int i = 0; i < POSTS_PER_THREAD; ++i) {
    int id = t->index * POSTS_PER_THREAD + i;
    items[id].fixture = t->fixture;
    items[id].id = id;
    for (;;) {
      pcp_status_t status =
          pcp_loop_post(t->fixture->loop, on_post, &items[id]);
      if (!status) {
        break;
      }
      // Bounded queue: the caller sees RESOURCE_EXHAUSTED and decides.
      PCP_ASSERT(pcp_status_consume_code(status) ==
                 PCP_STATUS_RESOURCE_EXHAUSTED);
      ++t->fixture->exhausted;
      sched_yield();
    }
  }
  return NULL;
}

static void test_post_from_four_threads(void** state) {
  PCP_UNUSED(state);
  post_fixture_t* f = calloc(1, sizeof(*f));
  f->loop = make_loop(64);
  pthread_t threads[THREAD_COUNT];
  thread_arg_t args[THREAD_COUNT];
  for (int i = 0; i < THREAD_COUNT; ++i) {
    args[i] = (thread_arg_t){.fixture = f, .index = i};
    assert_int_equal(pthread_create(&threads[i], NULL, poster, &args[i]), 0);
  }
  run_bounded(f->loop, 30000);
  for (int i = 0; i < THREAD_COUNT; ++i) {
    pthread_join(threads[i], NULL);
  }
  assert_int_equal(f->total, THREAD_COUNT * POSTS_PER_THREAD);
  for (int i = 0; i < THREAD_COUNT * POSTS_PER_THREAD; ++i) {
    if (f->seen[i] != 1) {
      fail_msg("post %d ran %d times", i, f->seen[i]);
    }
  }
  assert_int_equal(f->wrong_thread, 0);
  assert_int_equal(pcp_loop_post_queue_length(f->loop), 0);
  pcp_loop_release(f->loop);
  assert_int_equal(f->cancelled, 0);
  free(f);
}

typedef struct cancel_fixture_t {
  pcp_loop_t* loop;
  int ok;
  int cancelled;
  pcp_status_code_t post_during_release;
} cancel_fixture_t;

static void on_cancel_post(void* user_data, pcp_status_code_t code) {
  cancel_fixture_t* f = (cancel_fixture_t*)user_data;
  if (code == PCP_STATUS_OK) {
    ++f->ok;
    return;
  }
  assert_int_equal(code, PCP_STATUS_CANCELLED);
  ++f->cancelled;
  // A post made while the loop is being released is refused.
  f->post_during_release =
      pcp_status_consume_code(pcp_loop_post(f->loop, on_cancel_post, f));
}

static void test_post_queue_bounded_and_cancelled(void** state) {
  PCP_UNUSED(state);
  cancel_fixture_t f = {0};
  f.loop = make_loop(4);
  for (int i = 0; i < 4; ++i) {
    PCP_CHECK_OK(pcp_loop_post(f.loop, on_cancel_post, &f));
  }
  pcp_status_t status = pcp_loop_post(f.loop, on_cancel_post, &f);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_RESOURCE_EXHAUSTED);
  pcp_status_ignore(status);
  assert_int_equal(pcp_loop_post_queue_length(f.loop), 4);
  // Queued work never ran: release cancels each entry exactly once.
  pcp_loop_release(f.loop);
  assert_int_equal(f.ok, 0);
  assert_int_equal(f.cancelled, 4);
  assert_int_equal(f.post_during_release, PCP_STATUS_FAILED_PRECONDITION);
}

static void test_stop_before_run(void** state) {
  PCP_UNUSED(state);
  pcp_loop_t* loop = make_loop(0);
  pcp_loop_stop(loop);
  // Returns without anything else stopping it.
  PCP_CHECK_OK(pcp_loop_run(loop));
  pcp_loop_release(loop);
}

//===----------------------------------------------------------------------===//
// Timers
//===----------------------------------------------------------------------===//

typedef struct timer_fixture_t {
  pcp_loop_t* loop;
  char order[32];
  int order_length;
  int repeat_ok;
  int repeat_cancelled;
  int repeat_ok_after_cancel;
  int e_ok;
  int e_cancelled;
  int long_cancelled;
} timer_fixture_t;

// Stops once A (the last one-shot) fired and the repeating timer finished:
// on a loaded machine a late loop turn can find every timer due at once.
static void timers_maybe_stop(timer_fixture_t* f) {
  if (f->order_length == 4 && f->repeat_cancelled == 1) {
    pcp_loop_stop(f->loop);
  }
}

typedef struct named_timer_t {
  timer_fixture_t* fixture;
  char name;
} named_timer_t;

static void on_named(void* user_data, pcp_loop_timer_t* timer,
                     pcp_status_code_t code) {
  PCP_UNUSED(timer);
  named_timer_t* n = (named_timer_t*)user_data;
  timer_fixture_t* f = n->fixture;
  if (n->name == 'E') {
    if (code == PCP_STATUS_OK) {
      ++f->e_ok;
    }
    if (code == PCP_STATUS_CANCELLED) {
      ++f->e_cancelled;
    }
    return;
  }
  if (n->name == 'L') {
    if (code == PCP_STATUS_CANCELLED) {
      ++f->long_cancelled;
    }
    return;
  }
  assert_int_equal(code, PCP_STATUS_OK);
  f->order[f->order_length++] = n->name;
  timers_maybe_stop(f);
}

static void on_repeat(void* user_data, pcp_loop_timer_t* timer,
                      pcp_status_code_t code) {
  timer_fixture_t* f = (timer_fixture_t*)user_data;
  if (code == PCP_STATUS_CANCELLED) {
    ++f->repeat_cancelled;
    timers_maybe_stop(f);
    return;
  }
  if (f->repeat_cancelled) {
    ++f->repeat_ok_after_cancel;
  }
  if (++f->repeat_ok == 3) {
    pcp_loop_timer_cancel(timer);
    pcp_loop_timer_cancel(timer);  // idempotent
  }
}

static void test_timers_order_and_cancel(void** state) {
  PCP_UNUSED(state);
  timer_fixture_t f = {0};
  f.loop = make_loop(0);
  named_timer_t a = {&f, 'A'}, b = {&f, 'B'}, c = {&f, 'C'}, d = {&f, 'D'},
                e = {&f, 'E'}, l = {&f, 'L'};
  PCP_CHECK_OK(pcp_loop_timer_start(f.loop, 60, 0, on_named, &a, NULL));
  PCP_CHECK_OK(pcp_loop_timer_start(f.loop, 10, 0, on_named, &b, NULL));
  PCP_CHECK_OK(pcp_loop_timer_start(f.loop, 30, 0, on_named, &c, NULL));
  // Same deadline as C, started later: fires after C.
  PCP_CHECK_OK(pcp_loop_timer_start(f.loop, 30, 0, on_named, &d, NULL));
  pcp_loop_timer_t* timer_e = NULL;
  PCP_CHECK_OK(pcp_loop_timer_start(f.loop, 20, 0, on_named, &e, &timer_e));
  pcp_loop_timer_cancel(timer_e);
  // Cancellation is reported later, never from inside the cancel call.
  assert_int_equal(f.e_cancelled, 0);
  PCP_CHECK_OK(pcp_loop_timer_start(f.loop, 5, 5, on_repeat, &f, NULL));
  PCP_CHECK_OK(pcp_loop_timer_start(f.loop, 100000, 0, on_named, &l, NULL));
  run_bounded(f.loop, 5000);
  f.order[f.order_length] = '\0';
  assert_string_equal(f.order, "BCDA");
  assert_int_equal(f.e_ok, 0);
  assert_int_equal(f.e_cancelled, 1);
  assert_int_equal(f.repeat_ok, 3);
  assert_int_equal(f.repeat_cancelled, 1);
  assert_int_equal(f.repeat_ok_after_cancel, 0);
  // The long timer is still armed: releasing the loop cancels it, once.
  assert_int_equal(f.long_cancelled, 0);
  pcp_loop_release(f.loop);
  assert_int_equal(f.long_cancelled, 1);
}

typedef struct zero_fixture_t {
  pcp_loop_t* loop;
  int calls;
} zero_fixture_t;

static void on_zero_timer(void* user_data, pcp_loop_timer_t* timer,
                          pcp_status_code_t code) {
  zero_fixture_t* f = (zero_fixture_t*)user_data;
  assert_int_equal(code, PCP_STATUS_OK);
  // Cancelling a one-shot timer from its own final callback is a no-op.
  pcp_loop_timer_cancel(timer);
  if (++f->calls == 3) {
    pcp_loop_stop(f->loop);
  }
}

static void test_timer_zero_timeout(void** state) {
  PCP_UNUSED(state);
  zero_fixture_t f = {.loop = make_loop(0)};
  PCP_CHECK_OK(pcp_loop_timer_start(f.loop, 0, 0, on_zero_timer, &f, NULL));
  assert_int_equal(f.calls, 0);  // never inside the submit call
  PCP_CHECK_OK(pcp_loop_timer_start(f.loop, 20, 0, on_zero_timer, &f, NULL));
  PCP_CHECK_OK(pcp_loop_timer_start(f.loop, 0, 0, on_zero_timer, &f, NULL));
  uint64_t start = pcp_loop_now_ms(f.loop);
  run_bounded(f.loop, 5000);
  assert_int_equal(f.calls, 3);
  assert_true(pcp_loop_now_ms(f.loop) - start >= 20);
  pcp_loop_release(f.loop);
  assert_int_equal(f.calls, 3);
}

// Regression: libuv timers count from the loop's cached time, which goes
// stale during long work outside the loop. A timer started after such work
// must still wait its whole timeout (it used to fire on the next iteration).
static void on_stale_timer(void* user_data, pcp_loop_timer_t* timer,
                           pcp_status_code_t code) {
  PCP_UNUSED(timer);
  zero_fixture_t* f = (zero_fixture_t*)user_data;
  assert_int_equal(code, PCP_STATUS_OK);
  f->calls++;
  pcp_loop_stop(f->loop);
}

static void test_timer_counts_from_its_start_after_long_work(void** state) {
  PCP_UNUSED(state);
  zero_fixture_t f = {.loop = make_loop(0)};
  pcp_sleep_ms(300);  // the loop's cached time is now 300 ms old
  pcp_clock_t clock = pcp_clock_system();
  int64_t start_ns = pcp_clock_now_ns(clock);
  PCP_CHECK_OK(pcp_loop_timer_start(f.loop, 200, 0, on_stale_timer, &f, NULL));
  run_bounded(f.loop, 5000);
  int64_t waited_ms = (pcp_clock_now_ns(clock) - start_ns) / 1000000;
  assert_int_equal(f.calls, 1);
  assert_true(waited_ms >= 190);
  pcp_loop_release(f.loop);
}

// The heartbeat pattern: a silence deadline pushed back by each heartbeat
// never fires while heartbeats come, and fires once after they stop.
typedef struct restart_fixture_t {
  pcp_loop_t* loop;
  pcp_loop_timer_t* deadline;
  int beats;
  int deadline_ok;
  int deadline_cancelled;
  int beat_cancelled;
  uint64_t last_beat_ms;
  uint64_t fired_ms;
  pcp_status_code_t restart_after_expiry;
} restart_fixture_t;

static void on_silence(void* user_data, pcp_loop_timer_t* timer,
                       pcp_status_code_t code) {
  restart_fixture_t* f = (restart_fixture_t*)user_data;
  if (code != PCP_STATUS_OK) {
    ++f->deadline_cancelled;
    return;
  }
  ++f->deadline_ok;
  f->fired_ms = pcp_loop_now_ms(f->loop);
  // Expired one-shot: no longer restartable.
  f->restart_after_expiry =
      pcp_status_consume_code(pcp_loop_timer_restart(timer, 10));
  pcp_loop_stop(f->loop);
}

static void on_beat(void* user_data, pcp_loop_timer_t* timer,
                    pcp_status_code_t code) {
  restart_fixture_t* f = (restart_fixture_t*)user_data;
  if (code != PCP_STATUS_OK) {
    ++f->beat_cancelled;
    return;
  }
  f->last_beat_ms = pcp_loop_now_ms(f->loop);
  PCP_CHECK_OK(pcp_loop_timer_restart(f->deadline, 60));
  if (++f->beats == 10) {
    pcp_loop_timer_cancel(timer);
  }
}

static void test_timer_restart_as_heartbeat_deadline(void** state) {
  PCP_UNUSED(state);
  restart_fixture_t f = {.loop = make_loop(0)};
  uint64_t start = pcp_loop_now_ms(f.loop);
  PCP_CHECK_OK(
      pcp_loop_timer_start(f.loop, 60, 0, on_silence, &f, &f.deadline));
  PCP_CHECK_OK(pcp_loop_timer_start(f.loop, 20, 20, on_beat, &f, NULL));
  run_bounded(f.loop, 5000);
  assert_int_equal(f.beats, 10);
  assert_int_equal(f.beat_cancelled, 1);
  assert_int_equal(f.deadline_ok, 1);
  assert_true(f.fired_ms - start >= 200);
  assert_true(f.fired_ms - f.last_beat_ms >= 60);
  assert_int_equal(f.restart_after_expiry, PCP_STATUS_FAILED_PRECONDITION);
  pcp_loop_release(f.loop);
  assert_int_equal(f.deadline_ok, 1);
  assert_int_equal(f.deadline_cancelled, 0);
}

//===----------------------------------------------------------------------===//
// Signals
//===----------------------------------------------------------------------===//

typedef struct signal_fixture_t {
  pcp_loop_t* loop;
  int sigterms;
  int sigints;
} signal_fixture_t;

// SIGINT first, then SIGTERM: the graceful-shutdown pair. Each delivery
// reaches its own watcher; the process survives both.
static void on_shutdown_signal(void* user_data, int signum) {
  signal_fixture_t* f = (signal_fixture_t*)user_data;
  if (signum == SIGINT) {
    ++f->sigints;
    kill(getpid(), SIGTERM);
    return;
  }
  assert_int_equal(signum, SIGTERM);
  ++f->sigterms;
  pcp_loop_stop(f->loop);
}

static void raise_sigint(void* user_data, pcp_loop_timer_t* timer,
                         pcp_status_code_t code) {
  PCP_UNUSED(user_data);
  PCP_UNUSED(timer);
  if (code == PCP_STATUS_OK) {
    kill(getpid(), SIGINT);
  }
}

static void test_signal_sigint_sigterm(void** state) {
  PCP_UNUSED(state);
  signal_fixture_t f = {0};
  f.loop = make_loop(0);
  pcp_loop_signal_t* term = NULL;
  pcp_loop_signal_t* interrupt = NULL;
  PCP_CHECK_OK(
      pcp_loop_signal_watch(f.loop, SIGTERM, on_shutdown_signal, &f, &term));
  PCP_CHECK_OK(pcp_loop_signal_watch(f.loop, SIGINT, on_shutdown_signal, &f,
                                     &interrupt));
  pcp_loop_signal_t* bad = NULL;
  assert_int_equal(pcp_status_consume_code(pcp_loop_signal_watch(
                       f.loop, SIGKILL, on_shutdown_signal, &f, &bad)),
                   PCP_STATUS_INVALID_ARGUMENT);
  assert_null(bad);
  PCP_CHECK_OK(pcp_loop_timer_start(f.loop, 10, 0, raise_sigint, NULL, NULL));
  run_bounded(f.loop, 5000);
  assert_int_equal(f.sigints, 1);
  assert_int_equal(f.sigterms, 1);
  pcp_loop_signal_release(interrupt);
  // The SIGTERM watcher is left for the release to close.
  pcp_loop_release(f.loop);
}

//===----------------------------------------------------------------------===//
// Child processes
//===----------------------------------------------------------------------===//

typedef struct child_fixture_t {
  pcp_loop_t* loop;
  int exits;
  pcp_status_code_t code;
  int64_t exit_status;
  int term_signal;
  char out[256];
  size_t out_length;
  char err[256];
  size_t err_length;
  int eofs;
  int eofs_at_exit;
  int64_t pid;
} child_fixture_t;

static void on_child_exit(void* user_data, pcp_loop_process_t* process,
                          pcp_status_code_t code, int64_t exit_status,
                          int term_signal) {
  child_fixture_t* f = (child_fixture_t*)user_data;
  ++f->exits;
  f->code = code;
  f->exit_status = exit_status;
  f->term_signal = term_signal;
  f->eofs_at_exit = f->eofs;
  if (code == PCP_STATUS_OK) {
    // Kill after exit is refused: the pid may be reused.
    assert_int_equal(
        pcp_status_consume_code(pcp_loop_process_kill(process, SIGTERM)),
        PCP_STATUS_FAILED_PRECONDITION);
    pcp_loop_stop(f->loop);
  }
}

static void on_child_output(void* user_data, pcp_loop_process_t* process,
                            int stream_fd, const void* data,
                            size_t byte_length) {
  PCP_UNUSED(process);
  child_fixture_t* f = (child_fixture_t*)user_data;
  if (byte_length == 0) {
    ++f->eofs;
    return;
  }
  char* target = stream_fd == 1 ? f->out : f->err;
  size_t* length = stream_fd == 1 ? &f->out_length : &f->err_length;
  size_t room = 255 - *length;
  size_t n = byte_length < room ? byte_length : room;
  memcpy(target + *length, data, n);
  *length += n;
}

static pcp_loop_process_options_t sh_options(child_fixture_t* f,
                                             const char* const* args) {
  pcp_loop_process_options_t options = {
      .file = "/bin/sh",
      .args = args,
      .stdout_mode = PCP_LOOP_STDIO_INHERIT,
      .stderr_mode = PCP_LOOP_STDIO_INHERIT,
      .exit_fn = on_child_exit,
      .output_fn = on_child_output,
      .user_data = f,
  };
  return options;
}

static void test_spawn_exit_status(void** state) {
  PCP_UNUSED(state);
  child_fixture_t f = {0};
  f.loop = make_loop(0);
  const char* const args[] = {"sh", "-c", "exit 3", NULL};
  pcp_loop_process_options_t options = sh_options(&f, args);
  pcp_loop_process_t* process = NULL;
  PCP_CHECK_OK(pcp_loop_process_spawn(f.loop, &options, &process));
  assert_true(pcp_loop_process_pid(process) > 0);
  assert_int_equal(f.exits, 0);
  run_bounded(f.loop, 10000);
  assert_int_equal(f.exits, 1);
  assert_int_equal(f.code, PCP_STATUS_OK);
  assert_int_equal(f.exit_status, 3);
  assert_int_equal(f.term_signal, 0);
  pcp_loop_release(f.loop);
  assert_int_equal(f.exits, 1);
}

static void on_kill_timer(void* user_data, pcp_loop_timer_t* timer,
                          pcp_status_code_t code) {
  PCP_UNUSED(timer);
  if (code != PCP_STATUS_OK) {
    return;
  }
  PCP_CHECK_OK(pcp_loop_process_kill((pcp_loop_process_t*)user_data, SIGTERM));
}

static void test_spawn_kill(void** state) {
  PCP_UNUSED(state);
  child_fixture_t f = {0};
  f.loop = make_loop(0);
  const char* const args[] = {"sh", "-c", "exec sleep 30", NULL};
  pcp_loop_process_options_t options = sh_options(&f, args);
  pcp_loop_process_t* process = NULL;
  PCP_CHECK_OK(pcp_loop_process_spawn(f.loop, &options, &process));
  PCP_CHECK_OK(
      pcp_loop_timer_start(f.loop, 50, 0, on_kill_timer, process, NULL));
  run_bounded(f.loop, 10000);
  assert_int_equal(f.exits, 1);
  assert_int_equal(f.code, PCP_STATUS_OK);
  assert_int_equal(f.term_signal, SIGTERM);
  pcp_loop_release(f.loop);
}

// A supervisor kills a child's whole group: the grandchild (a sleep holding
// the stdout pipe) dies too, so the exit callback, which waits for EOF,
// comes at once instead of after 30 s.
static void on_group_output(void* user_data, pcp_loop_process_t* process,
                            int stream_fd, const void* data,
                            size_t byte_length) {
  child_fixture_t* f = (child_fixture_t*)user_data;
  on_child_output(user_data, process, stream_fd, data, byte_length);
  if (byte_length > 0 && strstr(f->out, "started") && f->pid == 0) {
    f->pid = pcp_loop_process_pid(process);
    PCP_CHECK_OK(pcp_loop_process_kill(process, SIGTERM));
  }
}

static void test_spawn_kill_process_group(void** state) {
  PCP_UNUSED(state);
  child_fixture_t f = {0};
  f.loop = make_loop(0);
  const char* const args[] = {"sh", "-c", "sleep 30 & echo started; wait",
                              NULL};
  pcp_loop_process_options_t options = sh_options(&f, args);
  options.stdout_mode = PCP_LOOP_STDIO_PIPE;
  options.output_fn = on_group_output;
  options.new_process_group = true;
  pcp_loop_process_t* process = NULL;
  uint64_t start = pcp_loop_now_ms(f.loop);
  PCP_CHECK_OK(pcp_loop_process_spawn(f.loop, &options, &process));
  run_bounded(f.loop, 10000);
  assert_int_equal(f.exits, 1);
  assert_int_equal(f.code, PCP_STATUS_OK);
  assert_int_equal(f.term_signal, SIGTERM);
  assert_int_equal(f.eofs_at_exit, 1);
  // The sleep held the pipe: the EOF (and so the exit callback, well
  // within the bound) proves the grandchild died with the group. kill(2)
  // cannot check it: an orphaned zombie answers until init reaps it.
  assert_true(pcp_loop_now_ms(f.loop) - start < 10000);
  pcp_loop_release(f.loop);
}

static void test_spawn_pipes_env_and_output_before_exit(void** state) {
  PCP_UNUSED(state);
  child_fixture_t f = {0};
  f.loop = make_loop(0);
  const char* const args[] = {
      "sh", "-c", "echo \"out $PCP_NET_TEST\"; echo err 1>&2; exit 0", NULL};
  const char* const env[] = {"PCP_NET_TEST=42", "PATH=/usr/bin:/bin", NULL};
  pcp_loop_process_options_t options = sh_options(&f, args);
  options.env = env;
  options.stdout_mode = PCP_LOOP_STDIO_PIPE;
  options.stderr_mode = PCP_LOOP_STDIO_PIPE;
  pcp_loop_process_t* process = NULL;
  PCP_CHECK_OK(pcp_loop_process_spawn(f.loop, &options, &process));
  run_bounded(f.loop, 10000);
  assert_int_equal(f.exits, 1);
  assert_int_equal(f.exit_status, 0);
  assert_string_equal(f.out, "out 42\n");
  assert_string_equal(f.err, "err\n");
  // Both streams ended before the exit callback.
  assert_int_equal(f.eofs_at_exit, 2);
  pcp_loop_release(f.loop);
}

static void test_spawn_failures(void** state) {
  PCP_UNUSED(state);
  child_fixture_t f = {0};
  f.loop = make_loop(0);
  const char* const args[] = {"nope", NULL};
  pcp_loop_process_options_t options = sh_options(&f, args);
  options.file = "/nonexistent/pcp-net-test";
  pcp_loop_process_t* process = NULL;
  pcp_status_t status = pcp_loop_process_spawn(f.loop, &options, &process);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_NOT_FOUND);
  assert_non_null(strstr(pcp_status_message(status), "pcp-net-test"));
  pcp_status_ignore(status);
  assert_null(process);
  options.file = "/bin/sh";
  options.stdout_mode = PCP_LOOP_STDIO_PIPE;
  options.output_fn = NULL;
  assert_int_equal(pcp_status_consume_code(
                       pcp_loop_process_spawn(f.loop, &options, &process)),
                   PCP_STATUS_INVALID_ARGUMENT);
  pcp_loop_release(f.loop);
  // A failed submit never calls back.
  assert_int_equal(f.exits, 0);
}

static void test_spawn_cancelled_by_release(void** state) {
  PCP_UNUSED(state);
  child_fixture_t f = {0};
  f.loop = make_loop(0);
  const char* const args[] = {"sh", "-c", "exec sleep 30", NULL};
  pcp_loop_process_options_t options = sh_options(&f, args);
  options.stdout_mode = PCP_LOOP_STDIO_PIPE;
  pcp_loop_process_t* process = NULL;
  PCP_CHECK_OK(pcp_loop_process_spawn(f.loop, &options, &process));
  pid_t pid = (pid_t)pcp_loop_process_pid(process);
  pcp_loop_release(f.loop);
  assert_int_equal(f.exits, 1);
  assert_int_equal(f.code, PCP_STATUS_CANCELLED);
  // The child outlives the loop (as documented); clean it up here.
  assert_int_equal(kill(pid, SIGKILL), 0);
  int wstatus = 0;
  assert_int_equal(waitpid(pid, &wstatus, 0), pid);
}

// With every allocation after the loop's own failing, each submit fails at
// the call and its callback never runs; posting allocates nothing and still
// works.
static void on_never(void* user_data, pcp_loop_timer_t* timer,
                     pcp_status_code_t code) {
  PCP_UNUSED(timer);
  PCP_UNUSED(code);
  ++*(int*)user_data;
}

static void on_never_signal(void* user_data, int signum) {
  PCP_UNUSED(signum);
  ++*(int*)user_data;
}

static void on_never_exit(void* user_data, pcp_loop_process_t* process,
                          pcp_status_code_t code, int64_t exit_status,
                          int term_signal) {
  PCP_UNUSED(process);
  PCP_UNUSED(code);
  PCP_UNUSED(exit_status);
  PCP_UNUSED(term_signal);
  ++*(int*)user_data;
}

static void on_counted_post(void* user_data, pcp_status_code_t code) {
  PCP_UNUSED(code);
  ++*(int*)user_data;
}

static void test_out_of_memory_submits(void** state) {
  PCP_UNUSED(state);
  pcp_allocator_failing_t failing;
  pcp_allocator_failing_initialize(pcp_allocator_system(), -1, true, &failing);
  pcp_loop_options_t options = pcp_loop_options_default();
  options.allocator = pcp_allocator_failing(&failing);
  pcp_loop_t* loop = NULL;
  PCP_CHECK_OK(pcp_loop_create(&options, &loop));
  failing.fail_at_index = failing.request_count;
  int calls = 0;
  pcp_loop_timer_t* timer = NULL;
  pcp_status_t status =
      pcp_loop_timer_start(loop, 1, 0, on_never, &calls, &timer);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_RESOURCE_EXHAUSTED);
  assert_null(timer);
  pcp_loop_signal_t* watch = NULL;
  status =
      pcp_loop_signal_watch(loop, SIGUSR1, on_never_signal, &calls, &watch);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_RESOURCE_EXHAUSTED);
  const char* const args[] = {"sh", "-c", "exit 0", NULL};
  pcp_loop_process_options_t spawn = {
      .file = "/bin/sh",
      .args = args,
      .exit_fn = on_never_exit,
      .user_data = &calls,
  };
  pcp_loop_process_t* process = NULL;
  status = pcp_loop_process_spawn(loop, &spawn, &process);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_RESOURCE_EXHAUSTED);
  int posts = 0;
  PCP_CHECK_OK(pcp_loop_post(loop, on_counted_post, &posts));
  pcp_loop_release(loop);
  assert_int_equal(calls, 0);
  assert_int_equal(posts, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_post_from_four_threads),
      cmocka_unit_test(test_post_queue_bounded_and_cancelled),
      cmocka_unit_test(test_stop_before_run),
      cmocka_unit_test(test_timers_order_and_cancel),
      cmocka_unit_test(test_timer_zero_timeout),
      cmocka_unit_test(test_timer_counts_from_its_start_after_long_work),
      cmocka_unit_test(test_timer_restart_as_heartbeat_deadline),
      cmocka_unit_test(test_signal_sigint_sigterm),
      cmocka_unit_test(test_spawn_exit_status),
      cmocka_unit_test(test_spawn_kill),
      cmocka_unit_test(test_spawn_kill_process_group),
      cmocka_unit_test(test_spawn_pipes_env_and_output_before_exit),
      cmocka_unit_test(test_spawn_failures),
      cmocka_unit_test(test_spawn_cancelled_by_release),
      cmocka_unit_test(test_out_of_memory_submits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
