// SPDX-License-Identifier: Apache-2.0
//
// The workload runtime: one job runner for every workload kind (issue 14).
// Part of the workloads module's public surface: include
// "workloads/workloads.h", which includes this file under its runtime banner.
//
// A kind (training today; the generic job, inference and RL plug in the
// same way) is one pcp_workloads_kind_t: a table of functions, like an IREE
// HAL driver or an nginx module. Adding a kind is one table plus one entry
// in the runner's options. The runner owns what every kind shares:
//   - jobs live in the store (src/store): their state, their events;
//   - ONE transition function (pcp_workloads_runner_transition) that every
//     state change goes through: the store checks legality against its one
//     table and appends the event in the same transaction; then the runner
//     tells its |changed| hook (the gateway's answer cache) and wakes the
//     waiters: the scheduler, and the job's own condition variable when the
//     job is asked to stop;
//   - recovery after a restart (pcp_workloads_runner_recover): placing,
//     compiling and running jobs go back to queued ("re-run after a gateway
//     restart"), cancelling ones end cancelled; a kind may override;
//   - cancel and stop through condition variables: a cancel sets the job's
//     flag and signals its condition variable, so a job that waits in
//     pcp_workloads_job_wait wakes at once and pcp_workloads_job_should_stop
//     reads an atomic, never the store;
//   - a bounded pool: at most |max_running| jobs of a kind run at once, each
//     on one pool thread (the pool has the sum of the kinds' limits, its
//     threads made as jobs start), instead of one new thread per job.
//
// The simulation seam (helper G, issue 14 item 4): the scheduling round is
// pcp_workloads_runner_step, which takes no lock it keeps, starts no thread
// and reads time only from the injected clock. A caller that passes its own
// executor (pcp_workloads_executor_t) decides when each started job runs:
// the deterministic simulation passes one that queues the job and runs it
// from its event loop, and never calls _start (no scheduler thread, no
// pool). The gateway calls _start, which runs _step on a scheduler thread
// and jobs on the runner's own pool.
//
// Threading: every function is thread-safe unless stated. A kind's |run|
// runs on the executor's thread; its other hooks on the caller's thread.
// Ownership: the runner borrows the store, the kinds' |self| and the hooks'
// |user_data| for its lifetime; it copies the kind tables.

#ifndef PCP_WORKLOADS_RUNTIME_RUNTIME_H_
#define PCP_WORKLOADS_RUNTIME_RUNTIME_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/base.h"
#include "store/store.h"

#ifdef __cplusplus
extern "C" {
#endif

// Kinds one runner holds, and jobs of one kind running at once.
#define PCP_WORKLOADS_MAX_KINDS 8
// 128: inference runs one job per served model version (current and next
// of up to 64 models); the pool makes its threads lazily.
#define PCP_WORKLOADS_MAX_RUNNING_PER_KIND 128

typedef struct pcp_workloads_runner_t pcp_workloads_runner_t;
// One job while the runner knows it: the context a kind's functions get.
// Owned by the runner; valid while its run runs (a job that published
// progress is kept until the runner is released, so its API JSON keeps the
// last progress; others are freed when their run ends).
typedef struct pcp_workloads_job_t pcp_workloads_job_t;

//===----------------------------------------------------------------------===//
// Kinds
//===----------------------------------------------------------------------===//

typedef struct pcp_workloads_kind_t {
  // The store's job kind ("training"); at most PCP_STORE_NAME_MAX_LENGTH.
  const char* name;
  // Jobs of this kind running at once (1..PCP_WORKLOADS_MAX_RUNNING_PER_KIND).
  uint32_t max_running;
  void* self;  // passed to every function below; borrowed
  // Optional. Checks a job's |spec| before it is stored: INVALID_ARGUMENT
  // naming the key.
  pcp_status_t (*validate)(void* self, const json_t* spec);
  // Optional. Asked in each scheduling round before queued |job| starts:
  // false keeps it (and this kind's younger jobs) queued for this round,
  // e.g. while a resource the kind bounds is taken. Must not block.
  bool (*admit)(void* self, const pcp_store_job_t* job);
  // Required. Runs one job to its end on the calling thread. Moves the job
  // out of queued with pcp_workloads_job_transition (placing, compiling,
  // running); returns OK when the work is done (the runner records
  // succeeded) or the error that ended it (the runner records failed, or
  // cancelled when a cancel was asked; an error of code CANCELLED while the
  // runner stops leaves the job where it is, for the next start to resume).
  // Must return soon after pcp_workloads_job_should_stop turns true.
  pcp_status_t (*run)(void* self, pcp_workloads_job_t* job);
  // Optional. After a restart, for a job of this kind found placing,
  // compiling, running or cancelling: the state it goes to and the error
  // text to record (NULL: none). NULL function: the default (cancelling ->
  // cancelled, the rest -> queued).
  pcp_store_job_state_t (*recover)(void* self, const pcp_store_job_t* job,
                                   const char** out_error);
  // Optional. Folds the job's live progress |published| (what its run
  // published last) into |job_json| (the API's job object).
  void (*progress)(void* self, const json_t* published, json_t* job_json);
  // Optional. Told once when a running job is asked to stop (cancel or
  // runner stop), after its flag is set and its condition variable
  // signalled; for work the flag cannot reach (e.g. tasks on workers).
  void (*cancel)(void* self, pcp_workloads_job_t* job);
  // Optional. Told when a client's cancel ends job |id| of this kind while
  // it is still queued (queued -> cancelled; its run never starts, or sees
  // the cancel at once), for state the kind keeps outside the store: e.g.
  // the inference kind's served version, which exists before its job runs.
  // Caller's thread; must not call back into the runner.
  void (*cancel_queued)(void* self, const char* id);
} pcp_workloads_kind_t;

//===----------------------------------------------------------------------===//
// Runner
//===----------------------------------------------------------------------===//

// Where started jobs run. |submit| runs fn(arg) exactly once, now or later,
// on any thread; an error means fn never runs (libuv's rule). |arg| is the
// started job (a pcp_workloads_job_t*, valid until fn returns), so an
// executor may name it (pcp_workloads_job_id) and order the jobs it holds:
// the simulation runs fn once the job's outcome is known.
typedef struct pcp_workloads_executor_t {
  void* self;
  pcp_status_t (*submit)(void* self, void (*fn)(void* arg), void* arg);
} pcp_workloads_executor_t;

typedef struct pcp_workloads_runner_hooks_t {
  // After every store write of the runner's (create, transition, progress
  // publish): answers cached from the store are stale. Any thread.
  void (*changed)(void* user_data, const char* job_id);
  // A job ended here: |outcome| "succeeded", "failed" or "cancelled".
  void (*outcome)(void* user_data, const char* kind, const char* outcome);
  // Optional: true while the owner drains (no job starts), read at every
  // scheduling round, like pcp_workloads_runner_draining_set.
  bool (*draining)(void* user_data);
  void* user_data;
} pcp_workloads_runner_hooks_t;

typedef struct pcp_workloads_runner_options_t {
  pcp_store_t* store;  // borrowed; required
  pcp_clock_t clock;   // {0}: pcp_clock_system()
  pcp_log_context_t log;
  const pcp_workloads_kind_t* kinds;  // copied
  size_t kind_count;                  // <= PCP_WORKLOADS_MAX_KINDS
  // {0}: the runner's own pool (_start creates its threads).
  pcp_workloads_executor_t executor;
  pcp_workloads_runner_hooks_t hooks;
} pcp_workloads_runner_options_t;

// INVALID_ARGUMENT naming the field (no store, a kind without a name or a
// run function, a limit out of range, two kinds of one name),
// RESOURCE_EXHAUSTED. Starts nothing.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_runner_create(
    const pcp_workloads_runner_options_t* options, pcp_allocator_t allocator,
    pcp_workloads_runner_t** out_runner);
// Stops (as _stop) and frees. NULL-safe.
void pcp_workloads_runner_release(pcp_workloads_runner_t* runner);

// Jobs caught mid-flight by a crash or a stop, of every kind (a job of a
// kind this runner does not know gets the default): queued again or
// cancelled, through the transition function. Call before _start.
PCP_MUST_USE_RESULT pcp_status_t
pcp_workloads_runner_recover(pcp_workloads_runner_t* runner);

// One scheduling round: for each kind with room, its oldest queued jobs
// (not already running here) go to the executor. |out_started| (optional)
// counts them. Nothing starts while draining or stopping. Runs on the
// caller's thread; no thread is created.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_runner_step(
    pcp_workloads_runner_t* runner, uint32_t* out_started);

// Starts the pool (when the runner has no injected executor) and the
// scheduler thread, which runs _step whenever it is woken (a submit, a job
// ending, a transition) and at least every 200 ms. UNAVAILABLE when a
// thread cannot start. Main thread, once.
PCP_MUST_USE_RESULT pcp_status_t
pcp_workloads_runner_start(pcp_workloads_runner_t* runner);
// Asks every running job to stop (flag + condition variable + kind
// cancel), then joins the scheduler and the pool: the jobs stay in their
// store state and the next start resumes them. Idempotent; main thread.
void pcp_workloads_runner_stop(pcp_workloads_runner_t* runner);

// While draining, no job starts (running ones go on).
void pcp_workloads_runner_draining_set(pcp_workloads_runner_t* runner,
                                       bool draining);
// Wakes the scheduler (e.g. after a job was stored by other means).
void pcp_workloads_runner_wake(pcp_workloads_runner_t* runner);

// True while a recovery pass could not write some job's recovery (a store
// write failed): that job is still in the state the crash left it, and
// every scheduling round runs the pass again until it succeeds. For the
// simulation's "no job lost" checker and tests.
bool pcp_workloads_runner_recovery_pending(pcp_workloads_runner_t* runner);

// Waits until no job runs here or |timeout_ms| passed (real time; tests
// and shutdown). True when idle.
bool pcp_workloads_runner_idle_wait(pcp_workloads_runner_t* runner,
                                    int64_t timeout_ms);

//===----------------------------------------------------------------------===//
// Jobs through the runner
//===----------------------------------------------------------------------===//

// The one transition function: moves job |id| to |to| in the store (which
// checks the transition table and appends the event; FAILED_PRECONDITION
// for an illegal move, NOT_FOUND), then calls the |changed| hook, and when
// |to| is cancelling or terminal asks the job to stop if it runs here
// (flag, condition variable, the kind's cancel). Finally wakes the
// scheduler. |params| may be NULL.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_runner_transition(
    pcp_workloads_runner_t* runner, const char* id, pcp_store_job_state_t to,
    const pcp_store_job_transition_params_t* params);

// Checks |spec| with the kind's validate, stores job |id| queued, appends
// the event |event_type| with |event_payload| when |event_type| is not NULL
// (so it follows "queued" in the job's events). Does not wake the
// scheduler: the caller reads its answer first (so it shows "queued"), then
// calls _wake (else the next round, within 200 ms, starts it).
// |out_event_id| (optional): the "queued" event.
// NOT_FOUND naming an unknown kind; validate's errors; the store's.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_runner_job_submit(
    pcp_workloads_runner_t* runner, const char* id, const char* kind,
    const json_t* spec, const char* event_type, const json_t* event_payload,
    int64_t* out_event_id);

// Cancel, with the store as the arbiter (a race with the job's own moves
// has exactly one winner; the loser re-reads): a queued job ends cancelled
// at once, a started one goes cancelling (its run is asked to stop), a
// terminal or cancelling one is left. |*out_state| the state after the
// call, |*out_changed| whether this call moved it. NOT_FOUND; ABORTED when
// the job kept changing state.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_runner_job_cancel(
    pcp_workloads_runner_t* runner, const char* id,
    pcp_store_job_state_t* out_state, bool* out_changed);

// Folds the live progress of the job |job_json| describes (its "job_id"
// and "kind") into it, through its kind's progress function. A no-op for a
// job this process has not run or a kind without progress.
void pcp_workloads_runner_job_json_merge(pcp_workloads_runner_t* runner,
                                         json_t* job_json);

//===----------------------------------------------------------------------===//
// The job context (a kind's run)
//===----------------------------------------------------------------------===//

// Borrowed; valid while the runner lives.
const char* pcp_workloads_job_id(const pcp_workloads_job_t* job);
pcp_workloads_runner_t* pcp_workloads_job_runner(
    const pcp_workloads_job_t* job);
// The runner's clock (the simulation's when it drives the runner).
pcp_clock_t pcp_workloads_job_clock(const pcp_workloads_job_t* job);

// pcp_workloads_runner_transition of this job; |error| NULL: unchanged.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_job_transition(
    pcp_workloads_job_t* job, pcp_store_job_state_t to, const char* error);

// True once the job was cancelled or the runner stops. An atomic read.
bool pcp_workloads_job_should_stop(const pcp_workloads_job_t* job);
// True once a cancel reached this job (not a runner stop).
bool pcp_workloads_job_cancel_requested(const pcp_workloads_job_t* job);
// Waits on the job's condition variable until it should stop or
// |timeout_ms| passed (real time). Returns pcp_workloads_job_should_stop.
bool pcp_workloads_job_wait(pcp_workloads_job_t* job, int64_t timeout_ms);

// Wakes pcp_workloads_job_wait / _wait_for of this job (takes the runner's
// lock briefly; never call it with a lock that a kind's run holds while
// waiting). Only while the job's run runs (the context may be freed after).
void pcp_workloads_job_signal(pcp_workloads_job_t* job);
// The same by id, safe from any thread at any time (a fabric task callback,
// a compile thread): a no-op when the job does not run here.
void pcp_workloads_runner_job_signal(pcp_workloads_runner_t* runner,
                                     const char* id);
// Waits on the job's condition variable until |ready|(|arg|) (evaluated
// under the runner's lock: whoever makes it true sets its state first, then
// calls pcp_workloads_job_signal), the job should stop (when |stop_wakes|),
// or |timeout_ms| passed (-1: no limit). Returns |ready|(|arg|).
bool pcp_workloads_job_wait_for(pcp_workloads_job_t* job,
                                bool (*ready)(void* arg), void* arg,
                                bool stop_wakes, int64_t timeout_ms);
// True once the runner stops (not a cancel). An atomic read.
bool pcp_workloads_job_runner_stopping(const pcp_workloads_job_t* job);

// The placement recorded with the job's succeeded transition (a copy;
// NULL: none). Call from run before it returns OK.
void pcp_workloads_job_placement_set(pcp_workloads_job_t* job,
                                     const json_t* placement);

// One pointer a kind keeps with the job while it runs (e.g. what its cancel
// function must reach); NULL at every start. Thread-safe.
void pcp_workloads_job_user_data_set(pcp_workloads_job_t* job, void* user_data);
void* pcp_workloads_job_user_data(const pcp_workloads_job_t* job);

// Keeps a copy of |progress| as the job's live progress (merged into its
// API JSON by the kind's progress function) and calls |changed|.
void pcp_workloads_job_progress_publish(pcp_workloads_job_t* job,
                                        const json_t* progress);

#ifdef __cplusplus
}
#endif

#endif  // PCP_WORKLOADS_RUNTIME_RUNTIME_H_
