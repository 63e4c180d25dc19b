// SPDX-License-Identifier: Apache-2.0
// The supervision policy driven by a pcp_loop (nginx's master model): the
// loop thread owns every child, spawns only from itself, learns of exits
// through exit callbacks and of stop requests through signal watchers, and
// sleeps on one timer set to the policy's next deadline.

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "roles/nodemgr/supervision_impl.h"
#include "roles/roles_impl.h"

extern char** environ;

typedef struct runner_slot_t {
  pcp_roles_runner_t* runner;
  uint32_t index;
  pcp_loop_process_t* process;  // NULL when the slot has no child
  int64_t pid;                  // -1 when none
} runner_slot_t;

struct pcp_roles_runner_t {
  const pcp_roles_runner_options_t* options;
  pcp_allocator_t allocator;
  pcp_loop_t* loop;
  pcp_rng_t rng;
  pcp_roles_supervision_t* supervision;
  pcp_loop_timer_t* timer;  // the armed deadline timer, or NULL
  int64_t timer_due_ms;
  pcp_loop_signal_t* signals[3];
  runner_slot_t* slots;
  pcp_roles_supervision_action_t* actions;
  // Our environment plus PCP_SUPERVISOR_PID=<our pid> (parent_death.c);
  // entries borrowed from environ except |supervisor_pid_entry|.
  const char** child_env;
  char supervisor_pid_entry[64];
  bool loop_stopped;
  bool all_failed;  // stopped because every slot failed
};

const pcp_roles_supervision_t* pcp_roles_runner_supervision(
    const pcp_roles_runner_t* runner) {
  return runner->supervision;
}

int64_t pcp_roles_runner_slot_pid(const pcp_roles_runner_t* runner,
                                  uint32_t slot) {
  PCP_ASSERT(slot < pcp_roles_supervision_slot_count(runner->supervision));
  return runner->slots[slot].pid;
}

static int64_t now_ms(pcp_roles_runner_t* runner) {
  return (int64_t)pcp_loop_now_ms(runner->loop);
}

// log_slot(runner, msg, slot, "k", "v", ...): one line with role and slot.
static void log_slot(pcp_roles_runner_t* runner, const char* msg, uint32_t slot,
                     const char* const* pairs, size_t pair_count) {
  const char* all[2 + 16];
  char slot_text[16];
  snprintf(slot_text, sizeof(slot_text), "%" PRIu32, slot);
  all[0] = "slot";
  all[1] = slot_text;
  PCP_ASSERT(pair_count <= 8);
  if (pair_count) {
    memcpy(all + 2, pairs, pair_count * 2 * sizeof(*pairs));
  }
  pcp_roles_log_event(runner->options->role, msg, all, pair_count + 1);
}

static void pump(pcp_roles_runner_t* runner);

// "SIGKILL" for the signals a child usually dies of, else "signal N".
static const char* signal_name(int signum, char* buffer, size_t capacity) {
  switch (signum) {
    case SIGTERM:
      return "SIGTERM";
    case SIGKILL:
      return "SIGKILL";
    case SIGINT:
      return "SIGINT";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    default:
      snprintf(buffer, capacity, "signal %d", signum);
      return buffer;
  }
}

static void on_timer(void* user_data, pcp_loop_timer_t* timer,
                     pcp_status_code_t code) {
  pcp_roles_runner_t* runner = user_data;
  if (timer != runner->timer) {
    return;  // a replaced timer's cancellation
  }
  runner->timer = NULL;
  if (code == PCP_STATUS_OK) {
    pump(runner);
  }
}

// Sets the one timer to the policy's next deadline.
static void timer_arm(pcp_roles_runner_t* runner) {
  int64_t due_ms = pcp_roles_supervision_next_deadline_ms(runner->supervision);
  if (runner->timer && runner->timer_due_ms == due_ms) {
    return;
  }
  if (runner->timer) {
    pcp_loop_timer_cancel(runner->timer);
    runner->timer = NULL;
  }
  if (due_ms == INT64_MAX) {
    return;
  }
  int64_t now = now_ms(runner);
  uint64_t timeout_ms = due_ms > now ? (uint64_t)(due_ms - now) : 0;
  pcp_status_t status = pcp_loop_timer_start(runner->loop, timeout_ms, 0,
                                             on_timer, runner, &runner->timer);
  if (status) {
    // Out of memory for a timer: retry on the next event rather than lose
    // the deadline silently; a stop still works through the signals.
    pcp_log_context_t context = {.role = runner->options->role};
    pcp_log_status(PCP_LOG_ERROR, &context, status, "arming the timer");
    pcp_status_ignore(status);
    runner->timer = NULL;
    return;
  }
  runner->timer_due_ms = due_ms;
}

static void on_exit(void* user_data, pcp_loop_process_t* process,
                    pcp_status_code_t code, int64_t exit_status,
                    int term_signal) {
  runner_slot_t* slot = user_data;
  pcp_roles_runner_t* runner = slot->runner;
  (void)process;
  if (code != PCP_STATUS_OK) {
    return;  // loop released: only at the end of run, every child gone
  }
  char pid_text[24], status_text[24], delay_text[24];
  snprintf(pid_text, sizeof(pid_text), "%" PRId64, slot->pid);
  snprintf(status_text, sizeof(status_text), "%" PRId64, exit_status);
  slot->process = NULL;
  slot->pid = -1;
  pcp_roles_slot_state_t next = pcp_roles_supervision_child_exited(
      runner->supervision, slot->index, now_ms(runner), exit_status,
      term_signal);
  const pcp_roles_slot_t* view =
      pcp_roles_supervision_slot(runner->supervision, slot->index);
  snprintf(delay_text, sizeof(delay_text), "%" PRId64, view->last_delay_ms);
  char signal_text[24];
  const char* signal_text_or_null =
      term_signal ? signal_name(term_signal, signal_text, sizeof(signal_text))
                  : NULL;
  const char* pairs[] = {
      "pid",
      pid_text,
      "exit_status",
      term_signal ? NULL : status_text,
      "signal",
      signal_text_or_null,
      "next",
      pcp_roles_slot_state_name(next),
      "restart_in_ms",
      next == PCP_ROLES_SLOT_STATE_BACKING_OFF ? delay_text : NULL,
  };
  log_slot(runner, "child exited", slot->index, pairs,
           PCP_ARRAYSIZE(pairs) / 2);
  if (next == PCP_ROLES_SLOT_STATE_FAILED) {
    char reason[128];
    snprintf(reason, sizeof(reason),
             "crash loop: %" PRIu32 " exits within %" PRId64 " ms",
             runner->options->policy.crash_loop_restarts + 1,
             runner->options->policy.crash_loop_window_ms);
    const char* failed_pairs[] = {"reason", reason};
    log_slot(runner, "slot failed", slot->index, failed_pairs, 1);
  }
  pump(runner);
}

static void spawn(pcp_roles_runner_t* runner, runner_slot_t* slot) {
  const char* const* args = runner->options->slot_args[slot->index];
  pcp_loop_process_options_t options = {
      .file = args[0],
      .args = args,
      .stdout_mode = PCP_LOOP_STDIO_INHERIT,
      .stderr_mode = PCP_LOOP_STDIO_INHERIT,
      // Own process group: a terminal's Ctrl-C reaches only us (we stop
      // the children in order), and our SIGTERM/SIGKILL reaches the
      // child's own children too.
      .new_process_group = true,
      .env = runner->child_env,
      .exit_fn = on_exit,
      .user_data = slot,
  };
  const pcp_roles_slot_t* view =
      pcp_roles_supervision_slot(runner->supervision, slot->index);
  char count_text[24];
  snprintf(count_text, sizeof(count_text), "%" PRIu64, view->restart_count);
  pcp_status_t status =
      pcp_loop_process_spawn(runner->loop, &options, &slot->process);
  if (status) {
    slot->process = NULL;
    pcp_roles_slot_state_t next = pcp_roles_supervision_spawn_failed(
        runner->supervision, slot->index, now_ms(runner));
    const char* pairs[] = {"error", pcp_status_message(status), "next",
                           pcp_roles_slot_state_name(next)};
    log_slot(runner, "child spawn failed", slot->index, pairs, 2);
    pcp_status_ignore(status);
    return;
  }
  slot->pid = pcp_loop_process_pid(slot->process);
  char pid_text[24];
  snprintf(pid_text, sizeof(pid_text), "%" PRId64, slot->pid);
  const char* pairs[] = {"pid", pid_text, "restarts", count_text};
  log_slot(runner, "child started", slot->index, pairs, 2);
}

static void signal_child(pcp_roles_runner_t* runner, runner_slot_t* slot,
                         int signum) {
  if (!slot->process) {
    return;
  }
  pcp_status_t status = pcp_loop_process_kill(slot->process, signum);
  if (signum == SIGKILL) {
    char pid_text[24];
    snprintf(pid_text, sizeof(pid_text), "%" PRId64, slot->pid);
    const char* pairs[] = {"pid", pid_text};
    log_slot(runner, "child killed (SIGKILL)", slot->index, pairs, 1);
  }
  // FAILED_PRECONDITION: it exited already and its exit callback is on the
  // way, which is all a stop waits for.
  pcp_status_ignore(status);
}

// Hands the due actions to the OS, publishes, and re-arms the timer;
// stops the loop once the stop has completed. Called after every event.
static void pump(pcp_roles_runner_t* runner) {
  uint32_t slot_count = pcp_roles_supervision_slot_count(runner->supervision);
  // A failed spawn changes the deadline (its restart), so poll again until
  // nothing is due now; each round makes progress on a slot.
  for (;;) {
    size_t count = pcp_roles_supervision_poll(
        runner->supervision, now_ms(runner), runner->actions, slot_count);
    for (size_t i = 0; i < count; ++i) {
      runner_slot_t* slot = &runner->slots[runner->actions[i].slot];
      switch (runner->actions[i].kind) {
        case PCP_ROLES_SUPERVISION_ACTION_SPAWN:
          spawn(runner, slot);
          break;
        case PCP_ROLES_SUPERVISION_ACTION_TERMINATE:
          signal_child(runner, slot, SIGTERM);
          break;
        case PCP_ROLES_SUPERVISION_ACTION_KILL:
          signal_child(runner, slot, SIGKILL);
          break;
      }
    }
    if (count == 0 || pcp_roles_supervision_next_deadline_ms(
                          runner->supervision) > now_ms(runner)) {
      break;
    }
  }
  if (runner->options->publish) {
    runner->options->publish(runner->options->user_data, runner);
  }
  uint32_t failed = pcp_roles_supervision_count_in_state(
      runner->supervision, PCP_ROLES_SLOT_STATE_FAILED);
  if (runner->options->exit_when_all_failed && failed == slot_count &&
      !pcp_roles_supervision_is_stopping(runner->supervision)) {
    runner->all_failed = true;
    pcp_roles_supervision_stop(runner->supervision, now_ms(runner));
  }
  if (pcp_roles_supervision_is_stopped(runner->supervision)) {
    if (runner->timer) {
      pcp_loop_timer_cancel(runner->timer);
      runner->timer = NULL;
    }
    if (!runner->loop_stopped) {
      runner->loop_stopped = true;
      pcp_loop_stop(runner->loop);
    }
    return;
  }
  timer_arm(runner);
}

static void on_signal(void* user_data, int signum) {
  pcp_roles_runner_t* runner = user_data;
  if (signum == SIGHUP) {
    // Operator's "try again": revive the slots the crash-loop cap stopped.
    uint32_t count = pcp_roles_supervision_slot_count(runner->supervision);
    for (uint32_t i = 0; i < count; ++i) {
      if (pcp_roles_supervision_slot(runner->supervision, i)->state ==
          PCP_ROLES_SLOT_STATE_FAILED) {
        pcp_status_ignore(pcp_roles_supervision_slot_revive(runner->supervision,
                                                            i, now_ms(runner)));
        log_slot(runner, "slot revived (SIGHUP)", i, NULL, 0);
      }
    }
    pump(runner);
    return;
  }
  const char* signal_text = signum == SIGINT ? "SIGINT" : "SIGTERM";
  if (pcp_roles_supervision_is_stopping(runner->supervision)) {
    // A second request: the operator will not wait for the grace period.
    const char* pairs[] = {"signal", signal_text};
    pcp_roles_log_event(runner->options->role,
                        "stopping now (SIGKILL to the children left)", pairs,
                        1);
    pcp_roles_supervision_stop_now(runner->supervision, now_ms(runner));
  } else {
    uint32_t children = 0;
    uint32_t count = pcp_roles_supervision_slot_count(runner->supervision);
    for (uint32_t i = 0; i < count; ++i) {
      children += runner->slots[i].process != NULL;
    }
    char children_text[16];
    snprintf(children_text, sizeof(children_text), "%" PRIu32, children);
    const char* pairs[] = {"signal", signal_text, "children", children_text};
    pcp_roles_log_event(runner->options->role, "stopping", pairs, 2);
    pcp_roles_supervision_stop(runner->supervision, now_ms(runner));
  }
  pump(runner);
}

static pcp_status_t runner_setup(pcp_roles_runner_t* runner) {
  const pcp_roles_runner_options_t* options = runner->options;
  uint32_t slot_count = options->policy.slot_count;
  pcp_loop_options_t loop_options = pcp_loop_options_default();
  runner->allocator = loop_options.allocator;
  PCP_RETURN_IF_ERROR(pcp_loop_create(&loop_options, &runner->loop),
                      "creating the loop");
  pcp_rng_initialize(options->seed, &runner->rng);
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      runner->allocator, slot_count * sizeof(*runner->slots),
      (void**)&runner->slots));
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      runner->allocator, slot_count * sizeof(*runner->actions),
      (void**)&runner->actions));
  for (uint32_t i = 0; i < slot_count; ++i) {
    runner->slots[i] = (runner_slot_t){.runner = runner, .index = i, .pid = -1};
  }
  size_t env_count = 0;
  while (environ[env_count]) {
    ++env_count;
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      runner->allocator, (env_count + 2) * sizeof(*runner->child_env),
      (void**)&runner->child_env));
  static const char kPrefix[] = PCP_ROLES_SUPERVISOR_PID_ENV "=";
  size_t used = 0;
  for (size_t i = 0; i < env_count; ++i) {
    if (strncmp(environ[i], kPrefix, sizeof(kPrefix) - 1) != 0) {
      runner->child_env[used++] = environ[i];
    }
  }
  snprintf(runner->supervisor_pid_entry, sizeof(runner->supervisor_pid_entry),
           "%s%lld", kPrefix, (long long)getpid());
  runner->child_env[used++] = runner->supervisor_pid_entry;
  runner->child_env[used] = NULL;
  const int signums[3] = {SIGTERM, SIGINT, SIGHUP};
  for (int i = 0; i < 3; ++i) {
    PCP_RETURN_IF_ERROR(
        pcp_loop_signal_watch(runner->loop, signums[i], on_signal, runner,
                              &runner->signals[i]),
        "watching signal %d", signums[i]);
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_roles_supervision_create(
      &options->policy, now_ms(runner), &runner->rng, runner->allocator,
      &runner->supervision));
  return pcp_ok_status();
}

static void runner_teardown(pcp_roles_runner_t* runner) {
  for (int i = 0; i < 3; ++i) {
    if (runner->signals[i]) {
      pcp_loop_signal_release(runner->signals[i]);
    }
  }
  if (runner->loop) {
    // Every child has exited when run returns normally; on a set-up error
    // none was spawned. Release runs the pending timer's CANCELLED call.
    pcp_loop_release(runner->loop);
  }
  pcp_roles_supervision_release(runner->supervision);
  pcp_allocator_free(runner->allocator, runner->slots);
  pcp_allocator_free(runner->allocator, runner->actions);
  pcp_allocator_free(runner->allocator, (void*)runner->child_env);
}

pcp_status_t pcp_roles_runner_run(const pcp_roles_runner_options_t* options) {
  pcp_roles_runner_t runner;
  memset(&runner, 0, sizeof(runner));
  runner.options = options;
  pcp_status_t status = runner_setup(&runner);
  if (!status) {
    pcp_roles_log_event(options->role, "started", options->started_pairs,
                        options->started_pair_count);
    pump(&runner);
    status = pcp_loop_run(runner.loop);
    if (!status && runner.all_failed) {
      status = pcp_make_status(PCP_STATUS_ABORTED,
                               "every child hit the crash-loop cap");
    }
  }
  runner_teardown(&runner);
  return status;
}
