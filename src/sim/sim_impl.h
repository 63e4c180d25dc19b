// SPDX-License-Identifier: Apache-2.0
//
// sim_impl.h: what the files of src/sim share (never included outside this
// folder). sim.c: the event engine, the network, faults, the run and the
// shrinker; sim_nodes.c: the simulated gateway and workers; sim_runner.c:
// the "sim" kind on the real workload runner; sim_check.c: the checkers. One
// struct, sim_t, holds a whole run; everything here is single-threaded.

#ifndef PCP_SIM_SIM_IMPL_H_
#define PCP_SIM_SIM_IMPL_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "fabric/fabric.h"
#include "proto/proto.h"
#include "sched/sched.h"
#include "sim/sim.h"
#include "store/store.h"
#include "workloads/workloads.h"

//===----------------------------------------------------------------------===//
// Constants of the scenario
//===----------------------------------------------------------------------===//

// H = 100 ms: silence 300 ms, ticks every 25 ms, backoff 10..500 ms.
#define SIM_HEARTBEAT_MS 100u
#define SIM_MS INT64_C(1000000)
// Faults and submissions happen in the first seconds; the run then goes on
// until every job is finished, plus a settling time, or fails for liveness.
#define SIM_SUBMIT_WINDOW_NS (600 * SIM_MS)
#define SIM_FAULT_WINDOW_NS (2000 * SIM_MS)
#define SIM_SETTLE_NS (500 * SIM_MS)
#define SIM_LIVENESS_LIMIT_NS (120000 * SIM_MS)
// A job whose task fails this often fails for good.
#define SIM_TASK_FAILURES_MAX 4u
#define SIM_WORKER_TASKS_MAX 16u
#define SIM_INFLIGHT_MAX 256u
#define SIM_BUGGIFY_SITES_MAX 16u
#define SIM_OUTPUT_BYTES 8u
// The one program every task names: offered, fetched in chunks of
// SIM_CHUNK_BYTES (several BLOB_CHUNK frames), verified, cached by workers.
#define SIM_PROGRAM_BYTES 5000u
#define SIM_CHUNK_BYTES 1024u

typedef enum sim_program_state_e {
  SIM_PROGRAM_NONE = 0,     // not offered on this connection yet
  SIM_PROGRAM_OFFERED = 1,  // PROGRAM_OFFER sent, waiting for the ACK
  SIM_PROGRAM_READY = 2,    // the worker holds it: tasks may be assigned
} sim_program_state_t;

// True when the run has |bug| on. Compiles to false without the seeded bugs,
// so production-shaped code paths carry none of them.
#if defined(PCP_SIM_SEEDED_BUGS)
#define SIM_BUG(sim, which) ((sim)->options.bug == (which))
// The switch of fabric_glue.c's seeded bug; only the seeded-bug build of the
// simulation compiles that file with it (src/sim/CMakeLists.txt).
extern bool pcp_fabric_glue_seeded_epoch_kept;
#else
#define SIM_BUG(sim, which) ((void)(sim), false)
#endif

//===----------------------------------------------------------------------===//
// State
//===----------------------------------------------------------------------===//

typedef enum ev_kind_e {
  EV_TO_GATEWAY = 1,        // bytes on connection |id|
  EV_TO_WORKER = 2,         // bytes on connection |id|
  EV_CLOSE_AT_GATEWAY = 3,  // the gateway side of |id| sees the close
  EV_CLOSE_AT_WORKER = 4,   // the worker side of |id| sees the close
  EV_CONNECT_DONE = 5,      // worker |index| reaches the gateway on |id|
  EV_GATEWAY_TICK = 6,
  EV_WORKER_TICK = 7,   // worker |index|, |incarnation|
  EV_TASK_DONE = 8,     // worker |index|, |incarnation|, task |id|
  EV_FAULT = 9,         // schedule entry |index|
  EV_WORKER_BOOT = 10,  // worker |index| starts again
  EV_GATEWAY_BOOT = 11,
  EV_SUBMIT = 12,  // a client submits job |index|
} ev_kind_t;

typedef struct event_t {
  int64_t at_ns;
  uint64_t tie;  // seeded: orders events at the same instant
  uint64_t seq;  // insertion order: total order, never equal
  ev_kind_t kind;
  uint32_t index;
  uint32_t incarnation;
  uint64_t id;
  uint8_t* bytes;  // owned (EV_TO_*)
  size_t byte_length;
} event_t;

typedef struct conn_t {
  uint64_t id;
  uint32_t worker;
  uint32_t worker_incarnation;
  uint32_t gateway_incarnation;
  pcp_proto_gateway_conn_t* gw;  // while the gateway side is open
  bool gw_open;
  bool wk_open;
  bool ended;  // the gateway ran conn_ended for it
  // pcp_fabric_conn_actions_drain runs for it up the stack (its guard).
  bool gw_draining;
  int64_t to_gw_last_ns;  // FIFO: the last delivery time each way
  int64_t to_wk_last_ns;
  sim_program_state_t program_state;  // the gateway's view, per connection
} conn_t;

typedef struct wtask_t {
  uint64_t task_id;
  bool live;
} wtask_t;

typedef struct sim_worker_t {
  char id[16];
  bool alive;
  uint32_t incarnation;
  pcp_proto_worker_t* proto;
  pcp_proto_worker_config_t config;
  pcp_rng_t rng;  // backoff jitter of this incarnation
  uint64_t conn_id;
  wtask_t tasks[SIM_WORKER_TASKS_MAX];
  // The last lease epoch this worker was accepted with, and under which
  // gateway incarnation (epochs live in the gateway's memory).
  uint64_t accepted_epoch;
  uint32_t accepted_gw_incarnation;
  // The program is in the worker's disk cache (kept across crashes).
  bool has_program;
} sim_worker_t;

// The gateway's registry entry of a worker (fabric's fabric_worker_t).
typedef struct gw_worker_t {
  uint64_t conn_id;  // 0: not connected
  uint64_t lease_epoch;
  uint8_t resume_token[PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH];
  int64_t lost_at_ns;
  int32_t last_job;  // the job it last ran a task of (-1: none)
} gw_worker_t;

// sim_runner: the "sim" kind's view of a job the real runner
// (src/workloads/runtime) started and still holds (|tracked|): what the
// kind keeps in memory while the job runs; rebuilt from the store at each
// start.
typedef struct sim_runner_job_t {
  bool tracked;  // started by the runner, its work item not run yet
  // Its run returned but the store has not recorded the end yet (a failed
  // write the runner retries each round); |steps| and |result_sha| kept.
  bool ending;
  pcp_store_job_state_t state;
  uint32_t steps;
  int64_t last_committed_step;
  uint32_t task_failures;
  uint64_t lease_id;
  uint64_t task_id;
  uint64_t task_conn;
  int64_t task_step;
  bool cancel_sent;
  bool result_stored;
  pcp_sha256_t result_sha;
  int run_result;  // sim_run_result_t (sim_runner.c): what run returns
  // The runner's work item for this job (its executor's fn, arg).
  void (*work_fn)(void* arg);
  void* work_arg;
} sim_runner_job_t;

typedef struct inflight_t {
  uint64_t task_id;
  uint32_t job;
  uint64_t conn_id;
} inflight_t;

// The checkers' model of each job, built only from the store's event log.
typedef struct model_job_t {
  bool exists;
  pcp_store_job_state_t state;
  int64_t last_step;
  bool acked;
  pcp_sha256_t acked_sha;
} model_job_t;

typedef struct buggify_site_t {
  const char* name;
  bool enabled;
} buggify_site_t;

typedef struct sim_t {
  pcp_sim_options_t options;
  uint8_t program[SIM_PROGRAM_BYTES];
  pcp_sha256_t program_sha;
  pcp_sim_result_t* result;
  pcp_allocator_t allocator;
  // Two streams: the scenario (job sizes, the drawn fault schedule) and
  // everything else. A replay with an explicit schedule (shrinking) draws
  // the rest exactly as the original run did.
  pcp_rng_t rng;
  pcp_rng_t scenario_rng;
  pcp_clock_manual_t clock_state;
  int64_t now_ns;
  pcp_proto_timeouts_t timeouts;
  char run_dir[512];    // the run's temporary directory
  char state_dir[600];  // run_dir/gateway-<incarnation>: the store's

  event_t* heap;
  size_t heap_count;
  size_t heap_capacity;
  uint64_t next_seq;

  conn_t* conns;
  size_t conn_count;

  sim_worker_t workers[PCP_SIM_MAX_WORKERS];

  // Gateway.
  bool gw_up;
  uint32_t gw_incarnation;
  pcp_store_t* store;
  pcp_sched_t* sched;
  pcp_workloads_runner_t* runner;  // the real one (sim_runner.c)
  bool runner_releasing;
  bool runner_wake;  // a scheduling round is due (sim_runner.c)
  gw_worker_t gw_workers[PCP_SIM_MAX_WORKERS];
  uint64_t next_task_seq;
  sim_runner_job_t jobs[PCP_SIM_MAX_JOBS];
  inflight_t inflight[SIM_INFLIGHT_MAX];
  size_t inflight_count;

  // Scenario.
  uint32_t job_steps[PCP_SIM_MAX_JOBS];
  bool job_submitted[PCP_SIM_MAX_JOBS];
  pcp_sim_fault_t faults[PCP_SIM_MAX_FAULTS];
  size_t fault_count;
  size_t faults_applied;
  // The runner's policy when a worker is lost, drawn per run: release the
  // lease and place the job again (false), or keep a detached lease and let
  // the scheduler resume, reassign or expire it, as fabric.c does (true).
  bool keep_detached_leases;

  // Checkers.
  model_job_t model[PCP_SIM_MAX_JOBS];
  int64_t last_event_id;
  bool store_dirty;

  buggify_site_t sites[SIM_BUGGIFY_SITES_MAX];
  size_t site_count;

  bool failed;
  pcp_status_t fatal;  // a setup-class failure in the middle of a run
} sim_t;

//===----------------------------------------------------------------------===//
// The engine (sim.c)
//===----------------------------------------------------------------------===//

void pcp_sim_trace(sim_t* sim, const char* fmt, ...) PCP_PRINTF_ATTR(2, 3);
void pcp_sim_fail(sim_t* sim, const char* fmt, ...) PCP_PRINTF_ATTR(2, 3);
// Copies the gateway's database files (pcp.db and its WAL) from the current
// state dir into a fresh one, as a killed process leaves them on disk, and
// makes it current; the old one is removed once its store is closed.
PCP_MUST_USE_RESULT pcp_status_t pcp_sim_state_dir_snapshot(sim_t* sim,
                                                            char* old_dir,
                                                            size_t capacity);
void pcp_sim_state_dir_remove(const char* dir);
void pcp_sim_fail_status(sim_t* sim, pcp_status_t status, const char* what);
void pcp_sim_event_at(sim_t* sim, int64_t at_ns, ev_kind_t kind, uint32_t index,
                      uint32_t incarnation, uint64_t id);
int64_t pcp_sim_rand_range_ns(sim_t* sim, int64_t lo, int64_t hi);
conn_t* pcp_sim_conn_get(sim_t* sim, uint64_t id);
int64_t pcp_sim_net_delay_ns(sim_t* sim);
void pcp_sim_net_send(sim_t* sim, conn_t* conn, bool to_gateway,
                      pcp_proto_encoded_frame_t* frame);
void pcp_sim_net_close_toward(sim_t* sim, conn_t* conn, bool to_gateway);

//===----------------------------------------------------------------------===//
// Checkers (sim_check.c)
//===----------------------------------------------------------------------===//

uint32_t pcp_sim_job_index_parse(const char* id);
void pcp_sim_expected_output(uint32_t job, int64_t step,
                             uint8_t out[SIM_OUTPUT_BYTES]);
void pcp_sim_check_store_events(sim_t* sim);
void pcp_sim_check_acked_durable(sim_t* sim, const char* when);
void pcp_sim_check_after_event(sim_t* sim);

//===----------------------------------------------------------------------===//
// sim_runner: the "sim" kind on the real runner (sim_runner.c)
//===----------------------------------------------------------------------===//

void pcp_sim_job_id_format(uint32_t j, char id[32]);
bool pcp_sim_runner_transition(sim_t* sim, uint32_t j, pcp_store_job_state_t to,
                               const json_t* placement);
bool pcp_sim_runner_task_assign(sim_t* sim, conn_t* conn, uint32_t j,
                                int64_t step, uint64_t* out_task_id);
void pcp_sim_runner_step(sim_t* sim);
void pcp_sim_runner_on_result(sim_t* sim, uint64_t task_id,
                              pcp_proto_frame_t* frame);
void pcp_sim_runner_on_failed(sim_t* sim, uint64_t task_id);
void pcp_sim_runner_on_lost(sim_t* sim, uint64_t task_id);
void pcp_sim_runner_on_sched_event(sim_t* sim, const pcp_sched_event_t* event);
void pcp_sim_runner_recover(sim_t* sim);
PCP_MUST_USE_RESULT pcp_status_t pcp_sim_runner_create(sim_t* sim);
void pcp_sim_runner_release(sim_t* sim);
void pcp_sim_runner_submit(sim_t* sim, uint32_t j);
void pcp_sim_runner_cancel(sim_t* sim, uint32_t j);

//===----------------------------------------------------------------------===//
// Gateway and workers (sim_nodes.c)
//===----------------------------------------------------------------------===//

void pcp_sim_gateway_conn_ended(sim_t* sim, conn_t* conn);
void pcp_sim_gateway_actions_process(sim_t* sim, conn_t* conn);
PCP_MUST_USE_RESULT pcp_status_t pcp_sim_gateway_boot(sim_t* sim);
void pcp_sim_gateway_crash(sim_t* sim);
void pcp_sim_gateway_tick(sim_t* sim);
void pcp_sim_gateway_submit(sim_t* sim, uint32_t j);
void pcp_sim_gateway_cancel(sim_t* sim, uint32_t j);
void pcp_sim_gateway_program_offer(sim_t* sim, conn_t* conn);
bool pcp_sim_worker_current(sim_t* sim, uint32_t w, const conn_t* conn);
void pcp_sim_worker_task_done(sim_t* sim, uint32_t w, uint64_t task_id);
void pcp_sim_worker_actions_process(sim_t* sim, sim_worker_t* worker);
PCP_MUST_USE_RESULT pcp_status_t pcp_sim_worker_boot(sim_t* sim, uint32_t w);
void pcp_sim_worker_crash(sim_t* sim, uint32_t w, int64_t downtime_ns);
void pcp_sim_conn_reset(sim_t* sim, conn_t* conn, const char* why);

#endif  // PCP_SIM_SIM_IMPL_H_
