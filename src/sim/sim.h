// SPDX-License-Identifier: Apache-2.0
//
// sim: a deterministic simulation of the gateway, its workers and the job
// runner (FoundationDB / TigerBeetle style; docs/simulation.md).
//
// One process, one thread, one seed. A discrete-event scheduler keeps a
// priority queue of events in virtual time (a manual pcp_clock_t); ties are
// broken by the seeded RNG. It drives the real code that the fabric drives:
//   - the gateway: one proto gateway_conn per connection, the sched
//     scheduler, and the real workload runner (src/workloads/runtime) with a
//     "sim" kind (sim_runner.c), over a real SQLite store in a temporary
//     directory;
//   - N workers: proto worker state machines plus a fake compute that
//     "runs" a task for a seeded time and returns deterministic bytes.
// Every byte between them goes through the event queue with a seeded delay;
// a connection is FIFO (TCP), different connections interleave freely.
// Faults, all from the seed: worker crashes and rejoins, connection resets,
// gateway restarts (the runner rebuilds its state from the store: recovery),
// job cancels, and BUGGIFY sites (base.h) that fail store writes, reset
// connections on send and fail task completions.
//
// After every event the invariant checkers run (docs/simulation.md lists
// them): the scheduler's own invariants, legal job transitions only, at most
// one lease and one task in flight per job, no job lost, step numbers
// strictly increasing, every acknowledged result durable across gateway
// restarts and, at quiescence, every lease released and every job finished.
// A run whose checker fails reports the first failure; rerunning the same
// options replays it byte for byte (the trace hash is equal), and
// pcp_sim_shrink reduces its fault schedule to a short failing one.
//
// Threading: a run is single-threaded and installs the process-wide BUGGIFY
// hook for its duration, so two runs may not overlap in one process.
// Ownership: options are borrowed for the call; results are written into
// caller storage.

#ifndef PCP_SIM_SIM_H_
#define PCP_SIM_SIM_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Limits
//===----------------------------------------------------------------------===//

#define PCP_SIM_MAX_WORKERS 16u
#define PCP_SIM_MAX_JOBS 64u
#define PCP_SIM_MAX_STEPS_PER_JOB 8u
#define PCP_SIM_MAX_FAULTS 64u
// Connections over a whole run (every reconnect opens one).
#define PCP_SIM_MAX_CONNECTIONS 4096u
// Events over a whole run (a run past it fails as a livelock).
#define PCP_SIM_MAX_EVENTS_DEFAULT 200000u

//===----------------------------------------------------------------------===//
// Faults
//===----------------------------------------------------------------------===//

typedef enum pcp_sim_fault_kind_e {
  PCP_SIM_FAULT_NONE = 0,
  // Worker |target| dies (its process is gone) and restarts |arg_ns| later
  // with a new session (no resume).
  PCP_SIM_FAULT_WORKER_CRASH = 1,
  // The connection of worker |target| is reset (both sides see a close).
  PCP_SIM_FAULT_CONNECTION_RESET = 2,
  // The gateway dies and comes back |arg_ns| later: connections drop, the
  // scheduler and the runner start empty and recover from the store.
  PCP_SIM_FAULT_GATEWAY_RESTART = 3,
  // A client cancels job |target|.
  PCP_SIM_FAULT_JOB_CANCEL = 4,
  PCP_SIM_FAULT_COUNT_ = 5,
} pcp_sim_fault_kind_t;

// "worker_crash", "connection_reset", ...; "unknown" out of range.
const char* pcp_sim_fault_kind_name(pcp_sim_fault_kind_t kind);

typedef struct pcp_sim_fault_t {
  int64_t at_ns;  // virtual time
  pcp_sim_fault_kind_t kind;
  uint32_t target;  // worker or job index
  int64_t arg_ns;   // downtime (crash, restart)
} pcp_sim_fault_t;

//===----------------------------------------------------------------------===//
// Seeded bugs (test builds only)
//===----------------------------------------------------------------------===//

// Known bugs the checkers must catch. Compiled in only where the build
// defines PCP_SIM_SEEDED_BUGS (the sim_seeded_bugs_test target); elsewhere a
// run asking for one fails with UNIMPLEMENTED.
typedef enum pcp_sim_bug_e {
  PCP_SIM_BUG_NONE = 0,
  // Cancelling a placed job forgets to release its lease.
  PCP_SIM_BUG_CANCEL_LEAKS_LEASE = 1,
  // Recovery after a gateway restart skips the jobs that were running.
  PCP_SIM_BUG_RECOVERY_DROPS_RUNNING = 2,
  // A rejoining worker is handed the job it ran last again, although the
  // job was requeued (and may be placed elsewhere) meanwhile.
  PCP_SIM_BUG_DOUBLE_ASSIGN_ON_RECONNECT = 3,
  // fabric's join decision (pcp_fabric_join_decide, the shared code itself,
  // built again with PCP_FABRIC_GLUE_SEEDED_BUGS) keeps the lease epoch on
  // a new, not resumed, session, so the old session is not fenced off.
  PCP_SIM_BUG_EPOCH_KEPT_ON_REJOIN = 4,
  PCP_SIM_BUG_COUNT_ = 5,
} pcp_sim_bug_t;

const char* pcp_sim_bug_name(pcp_sim_bug_t bug);
// True when this build has the seeded bugs compiled in.
bool pcp_sim_seeded_bugs_available(void);

//===----------------------------------------------------------------------===//
// Runs
//===----------------------------------------------------------------------===//

typedef struct pcp_sim_options_t {
  uint64_t seed;
  uint32_t worker_count;       // 1..PCP_SIM_MAX_WORKERS
  uint32_t job_count;          // 1..PCP_SIM_MAX_JOBS
  uint32_t max_steps_per_job;  // 1..PCP_SIM_MAX_STEPS_PER_JOB
  // Draw a fault schedule from the seed (false: no scheduled faults).
  bool faults;
  // Let BUGGIFY sites fire (each site is switched on for a run with
  // probability 1/2, then fires with probability 1/20 per visit).
  bool buggify;
  // When non-NULL, this schedule replaces the drawn one (shrinking,
  // replaying a printed schedule). Borrowed for the call.
  const pcp_sim_fault_t* fault_schedule;
  size_t fault_schedule_count;
  pcp_sim_bug_t bug;
  // Every trace line is written here when non-NULL (the trace hash is
  // computed either way).
  FILE* trace;
  // Where the store's temporary directory goes; NULL: /dev/shm, or when
  // that fails $TMPDIR (else /tmp). The directory is removed at the end.
  const char* temp_root;
  uint64_t max_events;  // 0: PCP_SIM_MAX_EVENTS_DEFAULT
} pcp_sim_options_t;

// 4 workers, 6 jobs of up to 3 steps, faults and buggify on, no bug.
void pcp_sim_options_initialize(uint64_t seed, pcp_sim_options_t* out_options);

typedef struct pcp_sim_result_t {
  bool failed;
  char failure[512];  // the first checker failure ("" when none)
  // FNV-1a 64 over every trace line: equal for equal options.
  uint64_t trace_hash;
  uint64_t event_count;
  int64_t end_ns;  // virtual time at the end
  uint32_t jobs_succeeded;
  uint32_t jobs_failed;
  uint32_t jobs_cancelled;
  uint32_t gateway_restarts;
  uint32_t worker_crashes;
  uint32_t buggify_fired;
  // The fault schedule the run used (drawn or given).
  pcp_sim_fault_t faults[PCP_SIM_MAX_FAULTS];
  size_t fault_count;
} pcp_sim_result_t;

// Runs one simulation. A checker failure is a result (|out_result->failed|),
// not a status: the status is for setting up (INVALID_ARGUMENT for options
// out of range, UNIMPLEMENTED for a seeded bug in a build without them,
// errno statuses for the temporary directory, store open failures).
PCP_MUST_USE_RESULT pcp_status_t pcp_sim_run(const pcp_sim_options_t* options,
                                             pcp_sim_result_t* out_result);

// Shrinks a failing run: starting from |options| (which must fail), drops
// faults one at a time while the run still fails (until no single drop
// keeps it failing), then tries without buggify. Writes the smallest failing
// schedule into |out_result->faults| and that run's result; |out_buggify|
// says whether it still needs buggify. Each attempt is one full run, at most
// |max_runs| of them. FAILED_PRECONDITION when |options| does not fail.
PCP_MUST_USE_RESULT pcp_status_t
pcp_sim_shrink(const pcp_sim_options_t* options, uint32_t max_runs,
               pcp_sim_result_t* out_result, bool* out_buggify);

// Writes |faults| one per line ("at_ms=12.345 fault=worker_crash target=1
// arg_ms=40.000") to |sink|.
void pcp_sim_faults_print(const pcp_sim_fault_t* faults, size_t count,
                          FILE* sink);

// `pcp sim [--seeds N] [--seed S] [--shrink] [--trace] ...` (tools/sim.sh):
// runs seeds of the default scenario, or replays / shrinks one. Returns the
// exit status: 0 every seed passed, 1 one failed, 2 usage.
int pcp_sim_cli_main(int argc, char** argv);

#ifdef __cplusplus
}
#endif

#endif  // PCP_SIM_SIM_H_
