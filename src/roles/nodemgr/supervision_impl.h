// SPDX-License-Identifier: Apache-2.0
//
// Private to src/roles/nodemgr: the supervision policy of the node manager
// and of `pcp --supervise`, as a sans-I/O state machine, and the loop driver
// that runs it with real processes.
//
// Policy. N slots, each running one child at a time:
//
//   PENDING --first start, slot i at t0 + i * stagger--> STARTING
//   STARTING --alive for running_after_ms--> RUNNING
//   STARTING / RUNNING --exit--> BACKING_OFF (restart after a jittered,
//       exponentially growing delay; the delay resets when the run lasted
//       reset_after_ms) or FAILED (the crash-loop cap: more than
//       crash_loop_restarts restarts within crash_loop_window_ms)
//   BACKING_OFF --delay over--> STARTING
//   any --stop--> STOPPING (SIGTERM now, SIGKILL after stop_grace_ms) or,
//       without a child, STOPPED
//   STOPPING --exit--> STOPPED
//
// The machine does no I/O: time comes in as |now_ms| (any monotonic base),
// randomness from a borrowed pcp_rng_t, and what the driver must do comes out
// of pcp_roles_supervision_poll as actions (spawn slot i, SIGTERM it,
// SIGKILL it). Events (an exit, a failed spawn, a stop request) only change
// state; the driver calls poll after every event and at
// pcp_roles_supervision_next_deadline_ms. The unit tests drive it with
// scripted exits and a manual clock.
//
// Why STARTING before RUNNING (supervisord's startsecs): a child that dies
// at once (bad flags, missing device) must never make /readyz say ready,
// even for the instant between spawn and exit.
//
// Thread-compatible: one thread (the loop thread) owns a supervision; the
// probe server reads a snapshot the driver publishes (nodemgr.c).

#ifndef PCP_ROLES_NODEMGR_SUPERVISION_IMPL_H_
#define PCP_ROLES_NODEMGR_SUPERVISION_IMPL_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "net/net.h"
#include "roles/roles_impl.h"

//===----------------------------------------------------------------------===//
// Options
//===----------------------------------------------------------------------===//

// --scale is bounded by the config table at 1024; slot ids fit in 10 bits
// of the supervisor id (nodemgr.c).
#define PCP_ROLES_SUPERVISION_MAX_SLOTS 1024
// Upper bound of crash_loop_restarts: the per-slot ring of exit times is a
// fixed array of this size + 1.
#define PCP_ROLES_SUPERVISION_MAX_CRASH_LOOP_RESTARTS 64

// Every time is in ms; docs/decisions.md ("node manager") gives the
// defaults and why.
typedef struct pcp_roles_supervision_options_t {
  uint32_t slot_count;        // [1, PCP_ROLES_SUPERVISION_MAX_SLOTS]
  int64_t stagger_ms;         // >= 0: slot i first starts at t0 + i * this
  int64_t running_after_ms;   // >= 0: STARTING -> RUNNING after this long
  int64_t restart_min_ms;     // >= 0: first restart delay, jitter floor
  int64_t restart_max_ms;     // >= restart_min_ms: the delay's ceiling
  double restart_multiplier;  // >= 1: ceiling growth per restart
  // A run at least this long resets the delay to restart_min_ms.
  int64_t reset_after_ms;
  // More than this many restarts within the window: FAILED. 0: the first
  // exit fails the slot. [0, PCP_ROLES_SUPERVISION_MAX_CRASH_LOOP_RESTARTS].
  uint32_t crash_loop_restarts;
  int64_t crash_loop_window_ms;  // > 0
  int64_t stop_grace_ms;         // >= 0: SIGTERM to SIGKILL
} pcp_roles_supervision_options_t;

// The defaults (docs/decisions.md): stagger 200 ms (upstream), running after
// 1 s, restart delay 1 s (upstream's fixed delay) doubling to 30 s with full
// jitter, reset after 60 s up, 5 restarts within 60 s then FAILED, 10 s
// SIGTERM grace. |slot_count| is 1.
pcp_roles_supervision_options_t pcp_roles_supervision_options_default(void);

// INVALID_ARGUMENT naming the first field out of range.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_supervision_options_check(
    const pcp_roles_supervision_options_t* options);

//===----------------------------------------------------------------------===//
// Slots
//===----------------------------------------------------------------------===//

typedef enum pcp_roles_slot_state_e {
  PCP_ROLES_SLOT_STATE_PENDING = 0,      // first start not yet due
  PCP_ROLES_SLOT_STATE_STARTING = 1,     // child alive, not yet long enough
  PCP_ROLES_SLOT_STATE_RUNNING = 2,      // child alive >= running_after_ms
  PCP_ROLES_SLOT_STATE_BACKING_OFF = 3,  // exited; restart scheduled
  PCP_ROLES_SLOT_STATE_FAILED = 4,       // crash-loop cap hit; no restart
  PCP_ROLES_SLOT_STATE_STOPPING = 5,     // SIGTERM sent (SIGKILL later)
  PCP_ROLES_SLOT_STATE_STOPPED = 6,      // stopped, no child
} pcp_roles_slot_state_t;

// "pending", "starting", "running", "backing_off", "failed", "stopping",
// "stopped" (the /readyz and metric label values).
const char* pcp_roles_slot_state_name(pcp_roles_slot_state_t state);

// True for the states in which the slot has a child process.
bool pcp_roles_slot_state_has_child(pcp_roles_slot_state_t state);

// One slot, read-only for everyone but supervision.c.
typedef struct pcp_roles_slot_t {
  pcp_roles_slot_state_t state;
  // PENDING / BACKING_OFF: when to spawn; STARTING: when it counts as
  // RUNNING; STOPPING: when to SIGKILL (INT64_MAX once sent); else
  // INT64_MAX.
  int64_t deadline_ms;
  int64_t started_ms;      // last spawn; -1 before the first
  uint64_t start_count;    // spawns issued (first start included)
  uint64_t restart_count;  // spawns after the first
  uint64_t exit_count;     // exits and failed spawns while not stopping
  // Last exit: exit code, or the signal that killed the child (0: none);
  // spawn_failed is set when the last "exit" was a spawn that failed.
  int64_t last_exit_status;
  int32_t last_term_signal;
  bool last_spawn_failed;
  bool term_pending;      // STOPPING: SIGTERM not yet handed out
  int64_t last_delay_ms;  // the last restart delay drawn
  pcp_backoff_t backoff;
  // Ring of the times of recent exits (crash-loop window).
  int64_t exit_ring_ms[PCP_ROLES_SUPERVISION_MAX_CRASH_LOOP_RESTARTS + 1];
  uint32_t exit_ring_head;   // next write position
  uint32_t exit_ring_count;  // valid entries
} pcp_roles_slot_t;

//===----------------------------------------------------------------------===//
// pcp_roles_supervision_t
//===----------------------------------------------------------------------===//

typedef enum pcp_roles_supervision_action_kind_e {
  PCP_ROLES_SUPERVISION_ACTION_SPAWN = 0,      // start the slot's child
  PCP_ROLES_SUPERVISION_ACTION_TERMINATE = 1,  // SIGTERM to it
  PCP_ROLES_SUPERVISION_ACTION_KILL = 2,       // SIGKILL to it
} pcp_roles_supervision_action_kind_t;

typedef struct pcp_roles_supervision_action_t {
  pcp_roles_supervision_action_kind_t kind;
  uint32_t slot;
} pcp_roles_supervision_action_t;

typedef struct pcp_roles_supervision_t pcp_roles_supervision_t;

// Creates the machine with every slot PENDING, slot i due at
// |now_ms| + i * stagger_ms. |rng| is borrowed (outlives the machine) and
// draws the restart jitter. INVALID_ARGUMENT (options), RESOURCE_EXHAUSTED.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_supervision_create(
    const pcp_roles_supervision_options_t* options, int64_t now_ms,
    pcp_rng_t* rng, pcp_allocator_t allocator,
    pcp_roles_supervision_t** out_supervision);

// NULL is a no-op.
void pcp_roles_supervision_release(pcp_roles_supervision_t* supervision);

// Hands out every action due at |now_ms| into |out_actions| (room for at
// least slot_count entries: each slot yields at most one per call) and
// returns how many. A SPAWN moves the slot to STARTING (the driver reports
// a spawn that fails with pcp_roles_supervision_spawn_failed); a KILL is
// handed out once per stop. Also moves STARTING slots whose time has come
// to RUNNING.
size_t pcp_roles_supervision_poll(pcp_roles_supervision_t* supervision,
                                  int64_t now_ms,
                                  pcp_roles_supervision_action_t* out_actions,
                                  size_t capacity);

// The earliest time poll has something to do (INT64_MAX: nothing until the
// next event).
int64_t pcp_roles_supervision_next_deadline_ms(
    const pcp_roles_supervision_t* supervision);

// The child of |slot| exited (|term_signal| != 0 when a signal killed it;
// |exit_status| is then ignored). The slot must have a child. Returns the
// new state: BACKING_OFF, FAILED, or STOPPED (when stopping).
pcp_roles_slot_state_t pcp_roles_supervision_child_exited(
    pcp_roles_supervision_t* supervision, uint32_t slot, int64_t now_ms,
    int64_t exit_status, int32_t term_signal);

// The SPAWN just handed out for |slot| failed (the executable is missing,
// fork failed): counted as an exit at |now_ms|. Returns the new state.
pcp_roles_slot_state_t pcp_roles_supervision_spawn_failed(
    pcp_roles_supervision_t* supervision, uint32_t slot, int64_t now_ms);

// Begins the stop: slots with a child go STOPPING (SIGTERM at the next
// poll, SIGKILL at |now_ms| + stop_grace_ms), the others STOPPED.
// Idempotent.
void pcp_roles_supervision_stop(pcp_roles_supervision_t* supervision,
                                int64_t now_ms);

// Hurries a stop already begun: children not yet SIGKILLed get it at the
// next poll instead of after the grace period (a second SIGTERM/SIGINT, as
// an operator who will not wait). No-op before a stop.
void pcp_roles_supervision_stop_now(pcp_roles_supervision_t* supervision,
                                    int64_t now_ms);

// Gives a FAILED slot a fresh start (crash-loop history and delay cleared,
// spawn due at the next poll). FAILED_PRECONDITION when the slot is not
// FAILED or a stop has begun.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_supervision_slot_revive(
    pcp_roles_supervision_t* supervision, uint32_t slot, int64_t now_ms);

uint32_t pcp_roles_supervision_slot_count(
    const pcp_roles_supervision_t* supervision);

// Borrowed view of slot |slot| (< slot_count).
const pcp_roles_slot_t* pcp_roles_supervision_slot(
    const pcp_roles_supervision_t* supervision, uint32_t slot);

// Slots in |state|.
uint32_t pcp_roles_supervision_count_in_state(
    const pcp_roles_supervision_t* supervision, pcp_roles_slot_state_t state);

// True when no stop has begun and every slot is RUNNING.
bool pcp_roles_supervision_is_ready(const pcp_roles_supervision_t* supervision);

// True once a stop began.
bool pcp_roles_supervision_is_stopping(
    const pcp_roles_supervision_t* supervision);

// True once a stop began and every slot is STOPPED (no child left).
bool pcp_roles_supervision_is_stopped(
    const pcp_roles_supervision_t* supervision);

//===----------------------------------------------------------------------===//
// Flags (pcp_roles_policy_flags_t rows of the role tables)
//===----------------------------------------------------------------------===//

// The policy flags as config table rows, for a role struct |T| with a
// `policy` member. Defaults are pcp_roles_supervision_options_default's.
#define PCP_ROLES_POLICY_FIELDS(T)                                          \
  {.name = "running-after-ms",                                              \
   .type = PCP_CONFIG_TYPE_INT64,                                           \
   .offset = offsetof(T, policy.running_after_ms),                          \
   .default_value = "1000",                                                 \
   .min = 0,                                                                \
   .max = 86400000,                                                         \
   .value_name = "MS",                                                      \
   .help = "a child up this long counts as running (readiness)"},           \
      {.name = "restart-min-ms",                                            \
       .type = PCP_CONFIG_TYPE_INT64,                                       \
       .offset = offsetof(T, policy.restart_min_ms),                        \
       .default_value = "1000",                                             \
       .min = 0,                                                            \
       .max = 86400000,                                                     \
       .value_name = "MS",                                                  \
       .help = "first restart delay after a child exits"},                  \
      {.name = "restart-max-ms",                                            \
       .type = PCP_CONFIG_TYPE_INT64,                                       \
       .offset = offsetof(T, policy.restart_max_ms),                        \
       .default_value = "30000",                                            \
       .min = 0,                                                            \
       .max = 86400000,                                                     \
       .value_name = "MS",                                                  \
       .help = "restart delay ceiling (doubles per restart, full jitter)"}, \
      {.name = "restart-reset-after-ms",                                    \
       .type = PCP_CONFIG_TYPE_INT64,                                       \
       .offset = offsetof(T, policy.restart_reset_after_ms),                \
       .default_value = "60000",                                            \
       .min = 0,                                                            \
       .max = 86400000,                                                     \
       .value_name = "MS",                                                  \
       .help = "a run this long resets the restart delay"},                 \
      {.name = "crash-loop-restarts",                                       \
       .type = PCP_CONFIG_TYPE_INT64,                                       \
       .offset = offsetof(T, policy.crash_loop_restarts),                   \
       .default_value = "5",                                                \
       .min = 0,                                                            \
       .max = PCP_ROLES_SUPERVISION_MAX_CRASH_LOOP_RESTARTS,                \
       .value_name = "N",                                                   \
       .help =                                                              \
           "restarts allowed within the window; one more exit marks "       \
           "the slot failed"},                                              \
      {.name = "crash-loop-window-ms",                                      \
       .type = PCP_CONFIG_TYPE_INT64,                                       \
       .offset = offsetof(T, policy.crash_loop_window_ms),                  \
       .default_value = "60000",                                            \
       .min = 1,                                                            \
       .max = 86400000,                                                     \
       .value_name = "MS",                                                  \
       .help = "window of the crash-loop cap"},                             \
      {.name = "stop-grace-ms",                                             \
       .type = PCP_CONFIG_TYPE_INT64,                                       \
       .offset = offsetof(T, policy.stop_grace_ms),                         \
       .default_value = "10000",                                            \
       .min = 0,                                                            \
       .max = 86400000,                                                     \
       .value_name = "MS",                                                  \
       .help = "SIGTERM to SIGKILL on stop"},                               \
  {                                                                         \
    .name = "worker-exe", .type = PCP_CONFIG_TYPE_STRING,                   \
    .offset = offsetof(T, policy.worker_exe), .value_name = "PATH",         \
    .help =                                                                 \
        "program run as each worker instead of this pcp binary (same "      \
        "arguments; wrappers, tests)"                                       \
  }

// Options from the flags, for |slot_count| slots and |stagger_ms|.
// INVALID_ARGUMENT (restart-max-ms below restart-min-ms, ...).
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_policy_flags_to_options(
    const pcp_roles_policy_flags_t* flags, uint32_t slot_count,
    int64_t stagger_ms, pcp_roles_supervision_options_t* out_options);

// The --drain-timeout-ms given to each worker: the stop grace period less
// a fifth of it (at most 2 s), so a draining worker exits on its own before
// the SIGKILL that ends the grace period.
int64_t pcp_roles_worker_drain_timeout_ms(int64_t stop_grace_ms);

// The path of this executable (/proc/self/exe), for spawning workers.
// |buffer| receives it NUL-terminated. NOT_FOUND / OUT_OF_RANGE.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_self_exe(char* buffer,
                                                    size_t capacity);

//===----------------------------------------------------------------------===//
// Children end with their supervisor (parent_death.c)
//===----------------------------------------------------------------------===//

// Set by the runner in every child's environment: the supervisor's pid.
#define PCP_ROLES_SUPERVISOR_PID_ENV "PCP_SUPERVISOR_PID"

// Called first thing in main (pcp_roles_main). When PCP_SUPERVISOR_PID names
// our parent, asks for SIGTERM on its death (PR_SET_PDEATHSIG), so a worker
// never outlives a node manager that was SIGKILLed. Removes the variable
// from the environment. UNAVAILABLE when the supervisor is already gone
// (exit: nobody wants this worker); OK when the variable is absent, is not a
// pid, or names a live process other than our parent (a wrapper that did
// not exec).
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_supervisor_death_watch(void);

//===----------------------------------------------------------------------===//
// Runner: the policy on a pcp_loop with real processes (runner.c)
//===----------------------------------------------------------------------===//

typedef struct pcp_roles_runner_t pcp_roles_runner_t;

// Called on the loop thread after every change of a slot (state, pid,
// counters), to publish a snapshot for the probe threads.
typedef void (*pcp_roles_runner_publish_fn_t)(void* user_data,
                                              const pcp_roles_runner_t* runner);

typedef struct pcp_roles_runner_options_t {
  const char* role;  // log role ("node-manager", "supervise")
  pcp_roles_supervision_options_t policy;
  uint64_t seed;  // restart jitter
  // Child command line of each slot: policy.slot_count NULL-terminated
  // arrays, args[0] the executable (a path, or a name looked up in PATH).
  // Borrowed for the duration of pcp_roles_runner_run.
  const char* const* const* slot_args;
  // Return ABORTED once every slot is FAILED (after stopping nothing: no
  // child is left). For --supervise, whose one child is its only purpose:
  // its own parent then sees the failure. The node manager keeps running
  // (and serving /readyz 503) instead.
  bool exit_when_all_failed;
  pcp_roles_runner_publish_fn_t publish;  // optional
  void* user_data;
  // Logged once the signal watchers are installed and before the first
  // spawn (the "started" line), so a SIGTERM sent after it is never fatal.
  const char* const* started_pairs;
  size_t started_pair_count;
} pcp_roles_runner_options_t;

// Runs the policy until SIGTERM or SIGINT has stopped every child: creates a
// loop, watches SIGTERM/SIGINT (stop: SIGTERM to each child's process group,
// SIGKILL after the grace period, or at once on a second SIGTERM/SIGINT)
// and SIGHUP (revive FAILED slots), spawns
// and restarts the children (each in its own process group, stdin
// /dev/null, stdout and stderr inherited), and returns OK once all have
// exited. Errors are those of the loop set-up (RESOURCE_EXHAUSTED,
// INTERNAL) and ABORTED (exit_when_all_failed); spawn failures are handled
// by the policy, not returned.
// Blocks the calling thread, which becomes the loop thread.
PCP_MUST_USE_RESULT pcp_status_t
pcp_roles_runner_run(const pcp_roles_runner_options_t* options);

// For publish callbacks (loop thread): the machine and the pid of each
// slot's child (-1 when it has none).
const pcp_roles_supervision_t* pcp_roles_runner_supervision(
    const pcp_roles_runner_t* runner);
int64_t pcp_roles_runner_slot_pid(const pcp_roles_runner_t* runner,
                                  uint32_t slot);

#endif  // PCP_ROLES_NODEMGR_SUPERVISION_IMPL_H_
