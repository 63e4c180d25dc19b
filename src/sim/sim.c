// SPDX-License-Identifier: Apache-2.0
//
// The deterministic simulation (sim.h). One file on purpose: the event
// engine, the simulated network, the simulated gateway and workers, the job
// runner adapter and the checkers share one struct, and reading them side by
// side is how a failing trace gets understood.

#define _XOPEN_SOURCE 700  // nftw, mkdtemp (the temporary state dir)

#include "sim/sim.h"

#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "proto/proto.h"
#include "sched/sched.h"
#include "store/store.h"

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

static const char kSimJoinToken[] = "pcp-sim-join-token";

//===----------------------------------------------------------------------===//
// Names
//===----------------------------------------------------------------------===//

const char* pcp_sim_fault_kind_name(pcp_sim_fault_kind_t kind) {
  switch (kind) {
    case PCP_SIM_FAULT_WORKER_CRASH:
      return "worker_crash";
    case PCP_SIM_FAULT_CONNECTION_RESET:
      return "connection_reset";
    case PCP_SIM_FAULT_GATEWAY_RESTART:
      return "gateway_restart";
    case PCP_SIM_FAULT_JOB_CANCEL:
      return "job_cancel";
    default:
      return "unknown";
  }
}

const char* pcp_sim_bug_name(pcp_sim_bug_t bug) {
  switch (bug) {
    case PCP_SIM_BUG_NONE:
      return "none";
    case PCP_SIM_BUG_CANCEL_LEAKS_LEASE:
      return "cancel_leaks_lease";
    case PCP_SIM_BUG_RECOVERY_DROPS_RUNNING:
      return "recovery_drops_running";
    case PCP_SIM_BUG_DOUBLE_ASSIGN_ON_RECONNECT:
      return "double_assign_on_reconnect";
    default:
      return "unknown";
  }
}

bool pcp_sim_seeded_bugs_available(void) {
#if defined(PCP_SIM_SEEDED_BUGS)
  return true;
#else
  return false;
#endif
}

// True when the run has |bug| on. Compiles to false without the seeded bugs,
// so production-shaped code paths carry none of them.
#if defined(PCP_SIM_SEEDED_BUGS)
#define SIM_BUG(sim, which) ((sim)->options.bug == (which))
#else
#define SIM_BUG(sim, which) ((void)(sim), false)
#endif

void pcp_sim_options_initialize(uint64_t seed, pcp_sim_options_t* out_options) {
  memset(out_options, 0, sizeof(*out_options));
  out_options->seed = seed;
  out_options->worker_count = 4;
  out_options->job_count = 6;
  out_options->max_steps_per_job = 3;
  out_options->faults = true;
  out_options->buggify = true;
}

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

static const char* ev_kind_name(ev_kind_t kind) {
  static const char* const names[] = {
      "?",       "to_gw",   "to_wk",   "close_gw",  "close_wk",
      "connect", "gw_tick", "wk_tick", "task_done", "fault",
      "wk_boot", "gw_boot", "submit",
  };
  return (unsigned)kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "?";
}

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
  bool ended;             // the gateway ran conn_ended for it
  int64_t to_gw_last_ns;  // FIFO: the last delivery time each way
  int64_t to_wk_last_ns;
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
} sim_worker_t;

// The gateway's registry entry of a worker (fabric's fabric_worker_t).
typedef struct gw_worker_t {
  uint64_t conn_id;  // 0: not connected
  uint64_t lease_epoch;
  uint8_t resume_token[PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH];
  int64_t lost_at_ns;
  int32_t last_job;  // the job it last ran a task of (-1: none)
} gw_worker_t;

// sim_runner: the job runner adapter (see sim.h; to be replaced by the
// shared workload runner of src/workloads/runtime). Per job, what the
// gateway process holds in memory; rebuilt from the store on restart.
typedef struct sim_runner_job_t {
  bool tracked;
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
  char state_dir[512];

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
// Trace and failure
//===----------------------------------------------------------------------===//

static void trace(sim_t* sim, const char* fmt, ...) PCP_PRINTF_ATTR(2, 3);
static void trace(sim_t* sim, const char* fmt, ...) {
  char line[512];
  int n = snprintf(line, sizeof(line), "%10.3f ",
                   (double)sim->now_ns / (double)SIM_MS);
  va_list args;
  va_start(args, fmt);
  vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, args);
  va_end(args);
  uint64_t h = sim->result->trace_hash;
  for (const char* p = line; *p; ++p) {
    h ^= (uint8_t)*p;
    h *= UINT64_C(1099511628211);
  }
  h ^= '\n';
  h *= UINT64_C(1099511628211);
  sim->result->trace_hash = h;
  if (sim->options.trace) {
    fputs(line, sim->options.trace);
    fputc('\n', sim->options.trace);
  }
}

static void fail(sim_t* sim, const char* fmt, ...) PCP_PRINTF_ATTR(2, 3);
static void fail(sim_t* sim, const char* fmt, ...) {
  if (sim->failed)
    return;
  sim->failed = true;
  va_list args;
  va_start(args, fmt);
  vsnprintf(sim->result->failure, sizeof(sim->result->failure), fmt, args);
  va_end(args);
  trace(sim, "CHECK FAILED: %s", sim->result->failure);
}

// A status where none may occur: the run fails and names it.
static void fail_status(sim_t* sim, pcp_status_t status, const char* what) {
  char text[256];
  pcp_status_format(status, text, sizeof(text));
  pcp_status_ignore(status);
  fail(sim, "%s: %s", what, text);
}

//===----------------------------------------------------------------------===//
// Buggify
//===----------------------------------------------------------------------===//

// FoundationDB's rule: a site is switched on (or off) for the whole run the
// first time it is reached, then fires with a small probability per visit.
static bool buggify_hook(void* user_data, const char* site) {
  sim_t* sim = user_data;
  if (!sim->options.buggify)
    return false;
  buggify_site_t* s = NULL;
  for (size_t i = 0; i < sim->site_count; ++i) {
    if (strcmp(sim->sites[i].name, site) == 0)
      s = &sim->sites[i];
  }
  if (!s) {
    if (sim->site_count == SIM_BUGGIFY_SITES_MAX)
      return false;
    s = &sim->sites[sim->site_count++];
    s->name = site;
    s->enabled = pcp_rng_next_below(&sim->rng, 2) == 0;
  }
  if (!s->enabled || pcp_rng_next_below(&sim->rng, 20) != 0)
    return false;
  sim->result->buggify_fired++;
  trace(sim, "buggify %s", site);
  return true;
}

//===----------------------------------------------------------------------===//
// Event queue (binary heap on (at_ns, tie, seq))
//===----------------------------------------------------------------------===//

static bool ev_before(const event_t* a, const event_t* b) {
  if (a->at_ns != b->at_ns)
    return a->at_ns < b->at_ns;
  if (a->tie != b->tie)
    return a->tie < b->tie;
  return a->seq < b->seq;
}

static void ev_push(sim_t* sim, event_t ev) {
  if (sim->heap_count == sim->heap_capacity) {
    size_t capacity = sim->heap_capacity ? sim->heap_capacity * 2 : 256;
    void* p = sim->heap;
    pcp_status_t status =
        pcp_allocator_realloc(sim->allocator, capacity * sizeof(event_t), &p);
    if (status) {
      pcp_allocator_free(pcp_allocator_system(), ev.bytes);
      fail_status(sim, status, "event queue");
      return;
    }
    sim->heap = p;
    sim->heap_capacity = capacity;
  }
  // Faults take their schedule index as tie, so that dropping one while
  // shrinking leaves the draws of every other event where they were.
  ev.tie = ev.kind == EV_FAULT ? ev.index : pcp_rng_next_u64(&sim->rng);
  ev.seq = sim->next_seq++;
  size_t i = sim->heap_count++;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!ev_before(&ev, &sim->heap[parent]))
      break;
    sim->heap[i] = sim->heap[parent];
    i = parent;
  }
  sim->heap[i] = ev;
}

static event_t ev_pop(sim_t* sim) {
  event_t top = sim->heap[0];
  event_t last = sim->heap[--sim->heap_count];
  size_t i = 0;
  for (;;) {
    size_t child = 2 * i + 1;
    if (child >= sim->heap_count)
      break;
    if (child + 1 < sim->heap_count &&
        ev_before(&sim->heap[child + 1], &sim->heap[child])) {
      child++;
    }
    if (!ev_before(&sim->heap[child], &last))
      break;
    sim->heap[i] = sim->heap[child];
    i = child;
  }
  if (sim->heap_count)
    sim->heap[i] = last;
  return top;
}

static void ev_at(sim_t* sim, int64_t at_ns, ev_kind_t kind, uint32_t index,
                  uint32_t incarnation, uint64_t id) {
  event_t ev = {.at_ns = at_ns,
                .kind = kind,
                .index = index,
                .incarnation = incarnation,
                .id = id};
  ev_push(sim, ev);
}

static int64_t rand_range_ns(sim_t* sim, int64_t lo, int64_t hi) {
  return lo + (int64_t)pcp_rng_next_below(&sim->rng, (uint64_t)(hi - lo) + 1);
}

//===----------------------------------------------------------------------===//
// Network: one FIFO per direction per connection
//===----------------------------------------------------------------------===//

static conn_t* conn_get(sim_t* sim, uint64_t id) {
  return id >= 1 && id <= sim->conn_count ? &sim->conns[id - 1] : NULL;
}

static int64_t net_delay_ns(sim_t* sim) {
  // A delay spike past the silence timeout (3H) makes the peer evict.
  if (PCP_BUGGIFY("sim.net_delay_spike")) {
    return rand_range_ns(sim, 200 * SIM_MS, 450 * SIM_MS);
  }
  return rand_range_ns(sim, SIM_MS / 10, 5 * SIM_MS);
}

// Schedules a FIFO delivery: never before an earlier message of the same
// direction, so the seeded delay reorders only across connections.
static int64_t fifo_at(sim_t* sim, int64_t* last_ns) {
  int64_t at = sim->now_ns + net_delay_ns(sim);
  if (at <= *last_ns)
    at = *last_ns + 1;
  *last_ns = at;
  return at;
}

static void conn_reset(sim_t* sim, conn_t* conn, const char* why);

static void send_bytes(sim_t* sim, conn_t* conn, bool to_gateway,
                       pcp_proto_encoded_frame_t* frame) {
  if (to_gateway ? !conn->wk_open : !conn->gw_open)
    return;
  if (PCP_BUGGIFY("sim.frame_send_reset")) {
    conn_reset(sim, conn, "send failed");
    return;
  }
  event_t ev = {.kind = to_gateway ? EV_TO_GATEWAY : EV_TO_WORKER,
                .index = conn->worker,
                .id = conn->id};
  pcp_status_t status = pcp_proto_encoded_frame_flatten(
      frame, pcp_allocator_system(), &ev.bytes, &ev.byte_length);
  if (status) {
    fail_status(sim, status, "flatten");
    return;
  }
  ev.at_ns =
      fifo_at(sim, to_gateway ? &conn->to_gw_last_ns : &conn->to_wk_last_ns);
  ev_push(sim, ev);
}

// One side closes: the other side hears it after every byte already sent
// its way (FIN after data).
static void close_toward(sim_t* sim, conn_t* conn, bool to_gateway) {
  int64_t at =
      fifo_at(sim, to_gateway ? &conn->to_gw_last_ns : &conn->to_wk_last_ns);
  ev_at(sim, at, to_gateway ? EV_CLOSE_AT_GATEWAY : EV_CLOSE_AT_WORKER,
        conn->worker, 0, conn->id);
}

//===----------------------------------------------------------------------===//
// Checkers
//===----------------------------------------------------------------------===//

static uint32_t job_index_of(const char* id) {
  unsigned j = 0;
  if (sscanf(id, "job-%u", &j) != 1 || j >= PCP_SIM_MAX_JOBS) {
    return UINT32_MAX;
  }
  return j;
}

// The bytes a task of |job| at |step| returns: a function of the two, so a
// result is right or wrong on its own, whatever ran it and how often.
static void expected_output(uint32_t job, int64_t step,
                            uint8_t out[SIM_OUTPUT_BYTES]) {
  uint64_t z = ((uint64_t)job << 32) ^ (uint64_t)step ^ UINT64_C(0x5eed);
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  z ^= z >> 31;
  for (unsigned i = 0; i < SIM_OUTPUT_BYTES; ++i)
    out[i] = (uint8_t)(z >> (8 * i));
}

// Reads the store's new events and checks them against the model: every
// state change starts where the last one ended and is in the transition
// table; steps strictly increase; event ids strictly increase.
static void check_store_events(sim_t* sim) {
  if (!sim->gw_up || !sim->store_dirty || sim->failed)
    return;
  sim->store_dirty = false;
  for (;;) {
    pcp_store_job_event_list_t list = {0};
    pcp_status_t status = pcp_store_job_event_list(
        sim->store, sim->last_event_id, NULL, PCP_STORE_LIST_LIMIT_MAX, &list);
    if (status) {
      fail_status(sim, status, "event list");
      return;
    }
    for (size_t i = 0; i < list.count && !sim->failed; ++i) {
      const pcp_store_job_event_t* e = &list.items[i];
      if (e->event_id <= sim->last_event_id) {
        fail(sim, "event ids not increasing: %lld after %lld",
             (long long)e->event_id, (long long)sim->last_event_id);
        break;
      }
      sim->last_event_id = e->event_id;
      uint32_t j = job_index_of(e->job_id);
      if (j == UINT32_MAX) {
        fail(sim, "event of unknown job %s", e->job_id);
        break;
      }
      model_job_t* m = &sim->model[j];
      if (strcmp(e->type, "state") == 0) {
        if (!e->has_from_state) {
          if (m->exists)
            fail(sim, "%s created twice", e->job_id);
          m->exists = true;
          m->state = e->to_state;
          m->last_step = -1;
        } else if (!m->exists || m->state != e->from_state) {
          fail(sim, "%s: transition from %s but the job was %s", e->job_id,
               pcp_store_job_state_name(e->from_state),
               m->exists ? pcp_store_job_state_name(m->state) : "absent");
        } else if (!pcp_store_job_transition_is_allowed(e->from_state,
                                                        e->to_state)) {
          fail(sim, "%s: illegal transition %s -> %s", e->job_id,
               pcp_store_job_state_name(e->from_state),
               pcp_store_job_state_name(e->to_state));
        } else {
          m->state = e->to_state;
        }
      } else if (strcmp(e->type, "step") == 0) {
        json_t* step = json_object_get(e->payload, "step");
        int64_t s = json_is_integer(step) ? json_integer_value(step) : -1;
        if (s <= m->last_step) {
          fail(sim, "%s: step %lld after step %lld (versions must grow)",
               e->job_id, (long long)s, (long long)m->last_step);
        }
        m->last_step = s;
      }
    }
    size_t count = list.count;
    pcp_store_job_event_list_deinitialize(&list);
    if (count < PCP_STORE_LIST_LIMIT_MAX || sim->failed)
      return;
  }
}

// Every acknowledged result is in the store: the job succeeded and its
// result row has the acknowledged digest.
static void check_acked_durable(sim_t* sim, const char* when) {
  for (uint32_t j = 0; j < sim->options.job_count && !sim->failed; ++j) {
    if (!sim->model[j].acked)
      continue;
    char id[32];
    snprintf(id, sizeof(id), "job-%u", j);
    pcp_store_job_t job = {0};
    pcp_status_t status = pcp_store_job_get(sim->store, id, &job);
    bool ok = !status && job.state == PCP_STORE_JOB_STATE_SUCCEEDED;
    pcp_store_job_deinitialize(&job);
    pcp_status_ignore(status);
    pcp_store_job_result_t result;
    status = pcp_store_job_result_get(sim->store, id, "out", &result);
    ok = ok && !status &&
         memcmp(result.sha256.bytes, sim->model[j].acked_sha.bytes,
                PCP_SHA256_BYTE_LENGTH) == 0;
    pcp_status_ignore(status);
    if (!ok)
      fail(sim, "%s: acknowledged result of %s not durable", when, id);
  }
}

static void check_leases(sim_t* sim) {
  uint64_t ids[256];
  size_t count = 0;
  pcp_status_t status = pcp_sched_owner_leases_list(
      sim->sched, PCP_SCHED_OWNER_JOBS, ids, 256, &count);
  if (status) {
    fail_status(sim, status, "lease list");
    return;
  }
  uint32_t per_job[PCP_SIM_MAX_JOBS] = {0};
  for (size_t i = 0; i < count; ++i) {
    pcp_sched_lease_status_t lease;
    status = pcp_sched_lease_query(sim->sched, ids[i], &lease);
    if (status) {
      fail_status(sim, status, "lease query");
      return;
    }
    if (lease.tag == 0 || lease.tag > sim->options.job_count) {
      fail(sim, "lease %llu has tag %llu", (unsigned long long)ids[i],
           (unsigned long long)lease.tag);
      return;
    }
    if (++per_job[lease.tag - 1] > 1) {
      fail(sim, "job-%llu holds two leases at once (running twice)",
           (unsigned long long)(lease.tag - 1));
      return;
    }
  }
}

static void check_after_event(sim_t* sim) {
  if (sim->failed)
    return;
  uint32_t tasks[PCP_SIM_MAX_JOBS] = {0};
  for (size_t i = 0; i < sim->inflight_count; ++i) {
    if (++tasks[sim->inflight[i].job] > 1) {
      fail(sim, "job-%u has two tasks in flight (running twice)",
           sim->inflight[i].job);
      return;
    }
  }
  if (!sim->gw_up)
    return;
  pcp_status_t status = pcp_sched_check_invariants(sim->sched);
  if (status) {
    fail_status(sim, status, "sched invariants");
    return;
  }
  check_leases(sim);
  check_store_events(sim);
  // No job lost: a job the store says is unfinished is one the runner is
  // working on, in the state the store has.
  for (uint32_t j = 0; j < sim->options.job_count && !sim->failed; ++j) {
    const model_job_t* m = &sim->model[j];
    if (!m->exists || pcp_store_job_state_is_terminal(m->state))
      continue;
    if (!sim->jobs[j].tracked) {
      fail(sim, "job-%u is %s in the store but the runner lost it", j,
           pcp_store_job_state_name(m->state));
    } else if (sim->jobs[j].state != m->state) {
      fail(sim, "job-%u: runner thinks %s, store says %s", j,
           pcp_store_job_state_name(sim->jobs[j].state),
           pcp_store_job_state_name(m->state));
    }
  }
}

//===----------------------------------------------------------------------===//
// sim_runner: the job runner adapter
//===----------------------------------------------------------------------===//

static void job_id_format(uint32_t j, char id[32]) {
  snprintf(id, 32, "job-%u", j);
}

static void inflight_remove(sim_t* sim, uint64_t task_id) {
  for (size_t i = 0; i < sim->inflight_count; ++i) {
    if (sim->inflight[i].task_id == task_id) {
      sim->inflight[i] = sim->inflight[--sim->inflight_count];
      return;
    }
  }
}

// One store transition; the runner's state moves only when it committed.
static bool sim_runner_transition(sim_t* sim, uint32_t j,
                                  pcp_store_job_state_t to,
                                  const json_t* placement) {
  char id[32];
  job_id_format(j, id);
  pcp_store_job_transition_params_t params = {.placement = placement};
  pcp_status_t status =
      pcp_store_job_transition(sim->store, id, to, &params, NULL);
  sim->store_dirty = true;
  if (status) {
    char text[160];
    pcp_status_format(status, text, sizeof(text));
    pcp_status_ignore(status);
    trace(sim, "runner %s -> %s failed: %s", id, pcp_store_job_state_name(to),
          text);
    return false;
  }
  trace(sim, "runner %s %s -> %s", id,
        pcp_store_job_state_name(sim->jobs[j].state),
        pcp_store_job_state_name(to));
  sim->jobs[j].state = to;
  return true;
}

static void sim_runner_lease_release(sim_t* sim, uint32_t j) {
  sim_runner_job_t* job = &sim->jobs[j];
  if (!job->lease_id)
    return;
  pcp_status_ignore(pcp_sched_lease_release(sim->sched, job->lease_id));
  trace(sim, "runner job-%u release lease %llu", j,
        (unsigned long long)job->lease_id);
  job->lease_id = 0;
}

// The gateway connection of the worker holding |lease_id|, or NULL.
static conn_t* lease_conn(sim_t* sim, uint64_t lease_id, uint32_t* out_w) {
  pcp_sched_lease_status_t lease;
  pcp_status_t status = pcp_sched_lease_query(sim->sched, lease_id, &lease);
  if (status || lease.detached) {
    pcp_status_ignore(status);
    return NULL;
  }
  unsigned w = 0;
  if (sscanf(lease.worker_id.value, "w%u", &w) != 1 ||
      w >= sim->options.worker_count) {
    return NULL;
  }
  conn_t* conn = conn_get(sim, sim->gw_workers[w].conn_id);
  if (!conn || !conn->gw_open ||
      pcp_proto_gateway_conn_state(conn->gw) != PCP_PROTO_GATEWAY_ACCEPTED) {
    return NULL;
  }
  *out_w = w;
  return conn;
}

static bool lease_detached(sim_t* sim, uint64_t lease_id) {
  pcp_sched_lease_status_t lease;
  pcp_status_t status = pcp_sched_lease_query(sim->sched, lease_id, &lease);
  if (status) {
    pcp_status_ignore(status);
    return false;
  }
  return lease.detached;
}

static bool assign_task(sim_t* sim, conn_t* conn, uint32_t j, int64_t step,
                        uint64_t* out_task_id) {
  // The task id names the job and step, so the fake compute needs no input
  // tensors: (sequence << 16) | (job << 8) | step.
  uint64_t task_id =
      (++sim->next_task_seq << 16) | ((uint64_t)j << 8) | (uint64_t)step;
  char session[32];
  job_id_format(j, session);
  pcp_proto_task_assign_t task = {
      .task_id = task_id, .session_id = session, .function = "sim_step"};
  uint64_t request_id = 0;
  pcp_status_t status = pcp_proto_gateway_conn_assign_task(
      conn->gw, &task, NULL, 0, sim->now_ns, &request_id);
  if (status) {
    char text[160];
    pcp_status_format(status, text, sizeof(text));
    pcp_status_ignore(status);
    trace(sim, "runner assign job-%u failed: %s", j, text);
    return false;
  }
  if (sim->inflight_count == SIM_INFLIGHT_MAX) {
    fail(sim, "in-flight table full");
    return false;
  }
  sim->inflight[sim->inflight_count++] =
      (inflight_t){.task_id = task_id, .job = j, .conn_id = conn->id};
  sim->gw_workers[conn->worker].last_job = (int32_t)j;
  trace(sim, "runner assign job-%u step %lld task %llx to w%u conn %llu", j,
        (long long)step, (unsigned long long)task_id, conn->worker,
        (unsigned long long)conn->id);
  *out_task_id = task_id;
  return true;
}

static void sim_runner_ack(sim_t* sim, uint32_t j) {
  sim_runner_job_t* job = &sim->jobs[j];
  model_job_t* m = &sim->model[j];
  uint8_t expected[SIM_OUTPUT_BYTES];
  expected_output(j, (int64_t)job->steps - 1, expected);
  pcp_sha256_t sha;
  pcp_sha256_compute(expected, sizeof(expected), &sha);
  if (memcmp(sha.bytes, job->result_sha.bytes, sizeof(sha.bytes)) != 0) {
    fail(sim, "job-%u acknowledged a wrong result", j);
  }
  if (m->acked)
    fail(sim, "job-%u acknowledged twice", j);
  m->acked = true;
  m->acked_sha = job->result_sha;
  trace(sim, "runner job-%u succeeded (acknowledged)", j);
}

// Moves job |j| as far as it can go now. Every store write may fail
// (buggify); the job then stays where it is and the next step retries.
static void sim_runner_job_step(sim_t* sim, uint32_t j) {
  sim_runner_job_t* job = &sim->jobs[j];
  for (int round = 0; round < 8 && !sim->failed; ++round) {
    pcp_store_job_state_t before = job->state;
    uint64_t task_before = job->task_id;
    switch (job->state) {
      case PCP_STORE_JOB_STATE_QUEUED: {
        pcp_sched_constraint_t constraint = {
            .worker_class = PCP_SCHED_WORKER_CLASS_ANY, .worker_count = 1};
        uint64_t lease_id = 0;
        pcp_status_t status = pcp_sched_lease_acquire(
            sim->sched, PCP_SCHED_OWNER_JOBS, &constraint, j + 1, &lease_id, 1);
        if (status) {
          pcp_status_ignore(status);
          return;  // no free worker: wait for one
        }
        job->lease_id = lease_id;
        uint32_t w = 0;
        if (!lease_conn(sim, lease_id, &w)) {
          sim_runner_lease_release(sim, j);
          return;
        }
        char wid[16];
        snprintf(wid, sizeof(wid), "w%u", w);
        json_t* placement = json_pack("{s:s}", "worker", wid);
        bool ok =
            placement && sim_runner_transition(
                             sim, j, PCP_STORE_JOB_STATE_PLACING, placement);
        json_decref(placement);
        if (!ok)
          sim_runner_lease_release(sim, j);
        break;
      }
      case PCP_STORE_JOB_STATE_PLACING:
        sim_runner_transition(sim, j,
                              job->lease_id ? PCP_STORE_JOB_STATE_COMPILING
                                            : PCP_STORE_JOB_STATE_QUEUED,
                              NULL);
        break;
      case PCP_STORE_JOB_STATE_COMPILING:
        sim_runner_transition(sim, j,
                              job->lease_id ? PCP_STORE_JOB_STATE_RUNNING
                                            : PCP_STORE_JOB_STATE_QUEUED,
                              NULL);
        break;
      case PCP_STORE_JOB_STATE_RUNNING: {
        if (job->result_stored && !job->task_id) {
          if (sim_runner_transition(sim, j, PCP_STORE_JOB_STATE_SUCCEEDED,
                                    NULL)) {
            sim_runner_lease_release(sim, j);
            sim_runner_ack(sim, j);
          }
          break;
        }
        if (job->task_id)
          return;  // waiting for the worker
        uint32_t w = 0;
        conn_t* conn =
            job->lease_id ? lease_conn(sim, job->lease_id, &w) : NULL;
        if (!conn && job->lease_id && lease_detached(sim, job->lease_id)) {
          return;  // the scheduler resumes, reassigns or expires it
        }
        if (!conn) {
          sim_runner_lease_release(sim, j);
          sim_runner_transition(sim, j, PCP_STORE_JOB_STATE_QUEUED, NULL);
          break;
        }
        int64_t step = job->last_committed_step + 1;
        if (step >= (int64_t)job->steps)
          step = (int64_t)job->steps - 1;
        if (assign_task(sim, conn, j, step, &job->task_id)) {
          job->task_conn = conn->id;
          job->task_step = step;
          job->cancel_sent = false;
        } else {
          sim_runner_lease_release(sim, j);
        }
        break;
      }
      case PCP_STORE_JOB_STATE_CANCELLING: {
        if (job->task_id) {
          if (job->cancel_sent)
            return;
          conn_t* conn = conn_get(sim, job->task_conn);
          pcp_status_t status =
              conn && conn->gw_open
                  ? pcp_proto_gateway_conn_cancel_task(conn->gw, job->task_id,
                                                       "cancelled", sim->now_ns)
                  : pcp_make_status(PCP_STATUS_NOT_FOUND, "no connection");
          if (status) {
            pcp_status_ignore(status);
            inflight_remove(sim, job->task_id);
            job->task_id = 0;
          } else {
            job->cancel_sent = true;
            trace(sim, "runner cancel job-%u task %llx", j,
                  (unsigned long long)job->task_id);
            return;
          }
          break;
        }
        if (sim_runner_transition(sim, j, PCP_STORE_JOB_STATE_CANCELLED,
                                  NULL)) {
          if (!SIM_BUG(sim, PCP_SIM_BUG_CANCEL_LEAKS_LEASE)) {
            sim_runner_lease_release(sim, j);
          } else {
            job->lease_id = 0;  // forgotten, never released
          }
        }
        break;
      }
      default:
        job->tracked = false;  // terminal
        return;
    }
    if (job->state == before && job->task_id == task_before)
      return;
  }
}

static void sim_runner_step(sim_t* sim) {
  if (!sim->gw_up)
    return;
  for (uint32_t j = 0; j < sim->options.job_count && !sim->failed; ++j) {
    if (sim->jobs[j].tracked)
      sim_runner_job_step(sim, j);
  }
}

static sim_runner_job_t* job_of_task(sim_t* sim, uint64_t task_id,
                                     uint32_t* out_j) {
  for (uint32_t j = 0; j < sim->options.job_count; ++j) {
    if (sim->jobs[j].tracked && sim->jobs[j].task_id == task_id) {
      *out_j = j;
      return &sim->jobs[j];
    }
  }
  return NULL;
}

static void sim_runner_on_result(sim_t* sim, uint64_t task_id,
                                 pcp_proto_frame_t* frame) {
  inflight_remove(sim, task_id);
  uint32_t j = 0;
  sim_runner_job_t* job = job_of_task(sim, task_id, &j);
  if (!job) {
    trace(sim, "runner stale result task %llx dropped",
          (unsigned long long)task_id);
    return;
  }
  job->task_id = 0;
  if (job->state != PCP_STORE_JOB_STATE_RUNNING)
    return;
  pcp_proto_task_result_t result;
  pcp_status_t status = pcp_proto_task_result_parse(frame, &result);
  if (status || result.output_count != 1 ||
      result.outputs[0].kind != PCP_PROTO_TENSOR_REF_SECTION ||
      result.outputs[0].section >= frame->section_count) {
    pcp_status_ignore(status);
    fail(sim, "job-%u: malformed result", j);
    return;
  }
  const pcp_proto_section_t* section =
      &frame->sections[result.outputs[0].section];
  uint8_t expected[SIM_OUTPUT_BYTES];
  expected_output(j, job->task_step, expected);
  if (section->byte_length != SIM_OUTPUT_BYTES ||
      memcmp(section->data, expected, SIM_OUTPUT_BYTES) != 0) {
    fail(sim, "job-%u step %lld: wrong output bytes", j,
         (long long)job->task_step);
    return;
  }
  char id[32];
  job_id_format(j, id);
  bool last = job->task_step == (int64_t)job->steps - 1;
  if (last) {
    pcp_store_job_result_t row = {.dtype = PCP_ELEMENT_TYPE_U8,
                                  .rank = 1,
                                  .byte_length = SIM_OUTPUT_BYTES};
    row.shape[0] = SIM_OUTPUT_BYTES;
    snprintf(row.job_id, sizeof(row.job_id), "%s", id);
    snprintf(row.name, sizeof(row.name), "out");
    snprintf(row.path, sizeof(row.path), "sim/%s/out.bin", id);
    pcp_sha256_compute(section->data, SIM_OUTPUT_BYTES, &row.sha256);
    status = pcp_store_job_result_put(sim->store, &row);
    if (pcp_status_code(status) == PCP_STATUS_ALREADY_EXISTS) {
      // Put before a restart or a failed step commit: the same bytes.
      pcp_status_ignore(status);
      pcp_store_job_result_t old;
      status = pcp_store_job_result_get(sim->store, id, "out", &old);
      if (!status && memcmp(old.sha256.bytes, row.sha256.bytes,
                            PCP_SHA256_BYTE_LENGTH) != 0) {
        fail(sim, "%s: stored result differs from the new one", id);
        return;
      }
    }
    if (status) {
      pcp_status_ignore(status);
      trace(sim, "runner %s result put failed", id);
      return;  // the step runs again
    }
    job->result_sha = row.sha256;
  }
  if (job->task_step > job->last_committed_step) {
    status = pcp_store_job_step_commit(sim->store, id, job->task_step, NULL);
    sim->store_dirty = true;
    if (status) {
      pcp_status_ignore(status);
      trace(sim, "runner %s step %lld commit failed", id,
            (long long)job->task_step);
      return;  // the step runs again
    }
    job->last_committed_step = job->task_step;
    trace(sim, "runner %s step %lld committed", id, (long long)job->task_step);
  }
  if (last)
    job->result_stored = true;
}

static void sim_runner_on_failed(sim_t* sim, uint64_t task_id) {
  inflight_remove(sim, task_id);
  uint32_t j = 0;
  sim_runner_job_t* job = job_of_task(sim, task_id, &j);
  if (!job)
    return;
  job->task_id = 0;
  if (job->state != PCP_STORE_JOB_STATE_RUNNING)
    return;
  if (++job->task_failures >= SIM_TASK_FAILURES_MAX) {
    if (sim_runner_transition(sim, j, PCP_STORE_JOB_STATE_FAILED, NULL)) {
      sim_runner_lease_release(sim, j);
    }
  }
}

static void sim_runner_on_lost(sim_t* sim, uint64_t task_id) {
  inflight_remove(sim, task_id);
  uint32_t j = 0;
  sim_runner_job_t* job = job_of_task(sim, task_id, &j);
  if (!job)
    return;
  job->task_id = 0;
  if (!sim->keep_detached_leases)
    sim_runner_lease_release(sim, j);
}

static void sim_runner_on_sched_event(sim_t* sim,
                                      const pcp_sched_event_t* event) {
  if (event->kind == PCP_SCHED_EVENT_NONE)
    return;
  trace(sim, "sched %s lease %llu tag %llu worker %s",
        pcp_sched_event_kind_name(event->kind),
        (unsigned long long)event->lease_id, (unsigned long long)event->tag,
        event->worker_id.value);
  for (uint32_t j = 0; j < sim->options.job_count; ++j) {
    sim_runner_job_t* job = &sim->jobs[j];
    if (!event->lease_id || job->lease_id != event->lease_id)
      continue;
    if (event->kind == PCP_SCHED_EVENT_LEASE_EXPIRED) {
      job->lease_id = 0;
    } else if (!sim->keep_detached_leases &&
               (event->kind == PCP_SCHED_EVENT_LEASE_REASSIGNED ||
                event->kind == PCP_SCHED_EVENT_LEASE_DETACHED)) {
      // Its task died with the worker: give the lease back and place the
      // job again through the queue (one path for every re-run).
      sim_runner_lease_release(sim, j);
    }
  }
}

// Recovery after a gateway (re)start: every unfinished job in the store is
// taken up again in the state the store has.
static void sim_runner_recover(sim_t* sim) {
  memset(sim->jobs, 0, sizeof(sim->jobs));
  pcp_store_job_list_t list = {0};
  pcp_store_job_filter_t filter = {.limit = PCP_STORE_LIST_LIMIT_MAX};
  pcp_status_t status = pcp_store_job_list(sim->store, &filter, &list);
  if (status) {
    fail_status(sim, status, "recovery list");
    return;
  }
  for (size_t i = 0; i < list.count; ++i) {
    const pcp_store_job_t* row = &list.items[i];
    uint32_t j = job_index_of(row->id);
    if (j == UINT32_MAX)
      continue;
    if (pcp_store_job_state_is_terminal(row->state))
      continue;
    if (SIM_BUG(sim, PCP_SIM_BUG_RECOVERY_DROPS_RUNNING) &&
        row->state == PCP_STORE_JOB_STATE_RUNNING) {
      continue;
    }
    sim_runner_job_t* job = &sim->jobs[j];
    job->tracked = true;
    job->state = row->state;
    json_t* steps = json_object_get(row->spec, "steps");
    job->steps =
        json_is_integer(steps) ? (uint32_t)json_integer_value(steps) : 1;
    job->last_committed_step = row->last_committed_step;
    // The result row is written before the last step commits.
    if (job->last_committed_step >= (int64_t)job->steps - 1) {
      pcp_store_job_result_t result;
      status = pcp_store_job_result_get(sim->store, row->id, "out", &result);
      if (!status) {
        job->result_stored = true;
        job->result_sha = result.sha256;
      }
      pcp_status_ignore(status);
    }
    trace(sim, "recover %s in %s step %lld", row->id,
          pcp_store_job_state_name(row->state),
          (long long)row->last_committed_step);
  }
  pcp_store_job_list_deinitialize(&list);
}

//===----------------------------------------------------------------------===//
// Gateway
//===----------------------------------------------------------------------===//

static void gw_process_actions(sim_t* sim, conn_t* conn);

// The gateway no longer has |conn| (it closed or was told so): its worker
// is lost (sched decides what happens to its lease).
static void gw_conn_ended(sim_t* sim, conn_t* conn) {
  if (conn->ended)
    return;
  conn->ended = true;
  conn->gw_open = false;
  pcp_proto_gateway_conn_release(conn->gw);
  conn->gw = NULL;
  gw_worker_t* gw = &sim->gw_workers[conn->worker];
  if (gw->conn_id != conn->id)
    return;
  gw->conn_id = 0;
  gw->lost_at_ns = sim->now_ns;
  pcp_sched_event_t event = {0};
  pcp_status_t status = pcp_sched_worker_mark_lost(
      sim->sched, sim->workers[conn->worker].id, sim->now_ns, &event);
  if (status) {
    pcp_status_ignore(status);
    return;
  }
  trace(sim, "gateway lost w%u (conn %llu)", conn->worker,
        (unsigned long long)conn->id);
  sim_runner_on_sched_event(sim, &event);
}

static void gw_reject(sim_t* sim, conn_t* conn, pcp_proto_reject_reason_t r,
                      const char* message) {
  trace(sim, "gateway reject conn %llu: %s", (unsigned long long)conn->id,
        message);
  pcp_status_ignore(
      pcp_proto_gateway_conn_reject(conn->gw, r, message, sim->now_ns));
}

static void gw_on_join_verified(sim_t* sim, conn_t* conn) {
  const pcp_proto_join_t* join = pcp_proto_gateway_conn_join(conn->gw);
  unsigned w = 0;
  if (sscanf(join->worker_id, "w%u", &w) != 1 ||
      w >= sim->options.worker_count || w != conn->worker) {
    gw_reject(sim, conn, PCP_PROTO_REJECT_BAD_JOIN, "unknown worker");
    return;
  }
  gw_worker_t* gw = &sim->gw_workers[w];
  conn_t* old = conn_get(sim, gw->conn_id);
  if (old && old->gw_open) {
    if (sim->now_ns < pcp_proto_gateway_conn_deadline_ns(old->gw)) {
      gw_reject(sim, conn, PCP_PROTO_REJECT_DUPLICATE_WORKER,
                "another live connection holds this worker id");
      return;
    }
    pcp_status_ignore(pcp_proto_gateway_conn_fail(
        old->gw, pcp_make_status(PCP_STATUS_DEADLINE_EXCEEDED, "replaced"),
        sim->now_ns));
    gw_process_actions(sim, old);
  }
  bool resumed =
      gw->lease_epoch != 0 &&
      sim->now_ns - gw->lost_at_ns <= sim->timeouts.resume_window_ns &&
      pcp_proto_join_resume_matches(join, gw->lease_epoch, gw->resume_token);
  pcp_sched_worker_info_t info = {
      .id = join->worker_id,
      .backend = PCP_SCHED_BACKEND_CPU,
      .target = join->target,
      .device_id = join->device_id,
      .device_memory_bytes = join->device_memory_bytes,
      .node_manager_id = join->node_manager_id,
  };
  pcp_status_t status = pcp_sched_worker_join(sim->sched, &info, sim->now_ns);
  if (status) {
    char text[160];
    pcp_status_format(status, text, sizeof(text));
    pcp_status_ignore(status);
    gw_reject(sim, conn, PCP_PROTO_REJECT_BAD_JOIN, text);
    return;
  }
  if (!resumed) {
    gw->lease_epoch++;
    for (size_t i = 0; i < sizeof(gw->resume_token); ++i) {
      gw->resume_token[i] = (uint8_t)pcp_rng_next_u64(&sim->rng);
    }
  }
  pcp_proto_gateway_accept_params_t params = {.lease_epoch = gw->lease_epoch,
                                              .resumed = resumed};
  memcpy(params.resume_token, gw->resume_token, sizeof(params.resume_token));
  status = pcp_proto_gateway_conn_accept(conn->gw, &params, sim->now_ns);
  if (status) {
    fail_status(sim, status, "accept");
    return;
  }
  gw->conn_id = conn->id;
  trace(sim, "gateway accept w%u conn %llu epoch %llu resumed %d", w,
        (unsigned long long)conn->id, (unsigned long long)gw->lease_epoch,
        (int)resumed);
  pcp_sched_event_t event = {0};
  status =
      pcp_sched_worker_ready(sim->sched, join->worker_id, sim->now_ns, &event);
  if (status) {
    fail_status(sim, status, "sched ready");
    return;
  }
  sim_runner_on_sched_event(sim, &event);
  if (SIM_BUG(sim, PCP_SIM_BUG_DOUBLE_ASSIGN_ON_RECONNECT) &&
      gw->last_job >= 0) {
    // The bug: "resume" the worker's last job on the new connection without
    // a lease, although the runner requeued it when the old one died.
    uint32_t j = (uint32_t)gw->last_job;
    uint64_t ghost = 0;
    if (sim->jobs[j].tracked &&
        sim->jobs[j].state != PCP_STORE_JOB_STATE_CANCELLING) {
      (void)assign_task(
          sim, conn, j,
          sim->jobs[j].last_committed_step + 1 < (int64_t)sim->jobs[j].steps
              ? sim->jobs[j].last_committed_step + 1
              : (int64_t)sim->jobs[j].steps - 1,
          &ghost);
    }
  }
}

static void gw_process_actions(sim_t* sim, conn_t* conn) {
  pcp_proto_action_t a;
  bool closed = false;
  while (conn->gw && pcp_proto_gateway_conn_next_action(conn->gw, &a)) {
    switch (a.type) {
      case PCP_PROTO_ACTION_SEND:
        send_bytes(sim, conn, false, &a.frame);
        break;
      case PCP_PROTO_ACTION_CLOSE:
        if (conn->gw_open) {
          close_toward(sim, conn, false);
          closed = true;
        }
        break;
      case PCP_PROTO_ACTION_JOIN_VERIFIED:
        gw_on_join_verified(sim, conn);
        break;
      case PCP_PROTO_ACTION_EVICT:
        trace(sim, "gateway evict w%u conn %llu", conn->worker,
              (unsigned long long)conn->id);
        break;
      case PCP_PROTO_ACTION_TASK_RESULT:
        trace(sim, "gateway result task %llx", (unsigned long long)a.task_id);
        sim_runner_on_result(sim, a.task_id, &a.received);
        break;
      case PCP_PROTO_ACTION_TASK_FAILED:
        trace(sim, "gateway task %llx failed: %s",
              (unsigned long long)a.task_id,
              pcp_status_code_string(pcp_status_code(a.status)));
        sim_runner_on_failed(sim, a.task_id);
        break;
      case PCP_PROTO_ACTION_TASK_LOST:
        trace(sim, "gateway task %llx lost", (unsigned long long)a.task_id);
        sim_runner_on_lost(sim, a.task_id);
        break;
      case PCP_PROTO_ACTION_PEER_DRAINING:
        pcp_status_ignore(
            pcp_sched_worker_drain(sim->sched, sim->workers[conn->worker].id));
        break;
      default:
        break;
    }
    pcp_proto_action_deinitialize(&a);
  }
  if (closed)
    gw_conn_ended(sim, conn);
}

static pcp_status_t gw_boot(sim_t* sim) {
  pcp_store_options_t store_options;
  pcp_store_options_initialize(&store_options);
  store_options.state_dir = sim->state_dir;
  store_options.clock = pcp_clock_manual(&sim->clock_state);
  // The simulated crash is a process death, which NORMAL survives (store.h).
  store_options.sync_mode = PCP_STORE_SYNC_NORMAL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_create(&store_options, sim->allocator, &sim->store));
  pcp_sched_options_t sched_options;
  pcp_sched_options_initialize(&sched_options);
  sched_options.max_workers = PCP_SIM_MAX_WORKERS;
  sched_options.max_leases = 256;
  sched_options.heartbeat_timeout_ns = 0;  // the state machines detect it
  sched_options.lease_rejoin_grace_ns = sim->timeouts.resume_window_ns;
  pcp_status_t status =
      pcp_sched_create(&sched_options, sim->allocator, &sim->sched);
  if (status) {
    pcp_store_release(sim->store);
    sim->store = NULL;
    return status;
  }
  sim->gw_up = true;
  sim->gw_incarnation++;
  sim->inflight_count = 0;
  for (uint32_t w = 0; w < PCP_SIM_MAX_WORKERS; ++w) {
    sim->gw_workers[w] = (gw_worker_t){.last_job = -1};
  }
  trace(sim, "gateway up (incarnation %u)", sim->gw_incarnation);
  sim_runner_recover(sim);
  sim->store_dirty = true;
  check_store_events(sim);
  check_acked_durable(sim, "after recovery");
  return pcp_ok_status();
}

// The gateway process dies: nothing it held in memory survives, and its
// sockets close (peers hear it after what is already on the wire).
static void gw_crash(sim_t* sim) {
  for (size_t i = 0; i < sim->conn_count; ++i) {
    conn_t* conn = &sim->conns[i];
    if (!conn->gw)
      continue;
    if (conn->gw_open)
      close_toward(sim, conn, false);
    pcp_proto_gateway_conn_release(conn->gw);
    conn->gw = NULL;
    conn->gw_open = false;
    conn->ended = true;
  }
  pcp_sched_release(sim->sched);
  sim->sched = NULL;
  pcp_store_release(sim->store);
  sim->store = NULL;
  sim->gw_up = false;
  sim->inflight_count = 0;
  memset(sim->jobs, 0, sizeof(sim->jobs));
  trace(sim, "gateway down");
}

static void gw_tick(sim_t* sim) {
  for (size_t i = 0; i < sim->conn_count && !sim->failed; ++i) {
    conn_t* conn = &sim->conns[i];
    if (!conn->gw_open)
      continue;
    pcp_status_t status = pcp_proto_gateway_conn_on_tick(conn->gw, sim->now_ns);
    if (status) {
      fail_status(sim, status, "gateway tick");
      return;
    }
    gw_process_actions(sim, conn);
  }
  pcp_sched_event_t events[16];
  size_t count = 0;
  do {
    pcp_status_t status =
        pcp_sched_tick(sim->sched, sim->now_ns, events, 16, &count);
    if (status) {
      fail_status(sim, status, "sched tick");
      return;
    }
    for (size_t i = 0; i < count; ++i)
      sim_runner_on_sched_event(sim, &events[i]);
  } while (count == 16);
}

static void gw_submit(sim_t* sim, uint32_t j) {
  if (sim->job_submitted[j])
    return;
  if (!sim->gw_up) {
    ev_at(sim, sim->now_ns + 50 * SIM_MS, EV_SUBMIT, j, 0, 0);  // client retry
    return;
  }
  char id[32];
  job_id_format(j, id);
  json_t* spec = json_pack("{s:i}", "steps", (json_int_t)sim->job_steps[j]);
  pcp_status_t status =
      spec ? pcp_store_job_create(sim->store, id, "sim", spec, NULL)
           : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "spec");
  json_decref(spec);
  sim->store_dirty = true;
  if (status) {
    fail_status(sim, status, "job create");
    return;
  }
  sim->job_submitted[j] = true;
  sim->jobs[j] = (sim_runner_job_t){.tracked = true,
                                    .state = PCP_STORE_JOB_STATE_QUEUED,
                                    .steps = sim->job_steps[j],
                                    .last_committed_step = -1};
  trace(sim, "submit %s steps %u", id, sim->job_steps[j]);
}

static void gw_cancel(sim_t* sim, uint32_t j) {
  if (!sim->gw_up || !sim->jobs[j].tracked)
    return;
  pcp_store_job_state_t to = sim->jobs[j].state == PCP_STORE_JOB_STATE_QUEUED
                                 ? PCP_STORE_JOB_STATE_CANCELLED
                                 : PCP_STORE_JOB_STATE_CANCELLING;
  if (!pcp_store_job_transition_is_allowed(sim->jobs[j].state, to))
    return;
  if (sim_runner_transition(sim, j, to, NULL) &&
      to == PCP_STORE_JOB_STATE_CANCELLED) {
    sim->jobs[j].tracked = false;
  }
}

//===----------------------------------------------------------------------===//
// Workers
//===----------------------------------------------------------------------===//

static void wk_process_actions(sim_t* sim, sim_worker_t* worker);

static bool wk_current(sim_t* sim, uint32_t w, const conn_t* conn) {
  const sim_worker_t* worker = &sim->workers[w];
  return worker->alive && conn && worker->conn_id == conn->id && conn->wk_open;
}

static void wk_task_done(sim_t* sim, uint32_t w, uint64_t task_id) {
  sim_worker_t* worker = &sim->workers[w];
  wtask_t* task = NULL;
  for (size_t i = 0; i < SIM_WORKER_TASKS_MAX; ++i) {
    if (worker->tasks[i].live && worker->tasks[i].task_id == task_id) {
      task = &worker->tasks[i];
    }
  }
  if (!task)
    return;
  task->live = false;
  pcp_status_t status;
  if (PCP_BUGGIFY("sim.task_fail")) {
    status = pcp_proto_worker_task_fail(
        worker->proto, task_id,
        pcp_make_status(PCP_STATUS_INTERNAL, "buggify: compute failed"),
        sim->now_ns);
  } else {
    uint8_t out[SIM_OUTPUT_BYTES];
    expected_output((uint32_t)((task_id >> 8) & 0xff),
                    (int64_t)(task_id & 0xff), out);
    pcp_proto_tensor_ref_t ref = {.kind = PCP_PROTO_TENSOR_REF_SECTION};
    pcp_proto_task_result_t result = {
        .task_id = task_id, .outputs = &ref, .output_count = 1};
    pcp_proto_section_t section = {.name = "out",
                                   .element_type = PCP_ELEMENT_TYPE_U8,
                                   .rank = 1,
                                   .data = out};
    section.shape[0] = SIM_OUTPUT_BYTES;
    status = pcp_proto_worker_task_complete(worker->proto, &result, &section, 1,
                                            sim->now_ns);
  }
  if (pcp_status_code(status) == PCP_STATUS_NOT_FOUND) {
    pcp_status_ignore(status);  // dropped by a reconnect
    return;
  }
  if (status) {
    fail_status(sim, status, "task complete");
    return;
  }
  trace(sim, "w%u task %llx done", w, (unsigned long long)task_id);
  wk_process_actions(sim, worker);
}

static void wk_process_actions(sim_t* sim, sim_worker_t* worker) {
  uint32_t w = (uint32_t)(worker - sim->workers);
  pcp_proto_action_t a;
  while (worker->proto && pcp_proto_worker_next_action(worker->proto, &a)) {
    conn_t* conn = conn_get(sim, worker->conn_id);
    switch (a.type) {
      case PCP_PROTO_ACTION_SEND:
        if (conn)
          send_bytes(sim, conn, true, &a.frame);
        break;
      case PCP_PROTO_ACTION_CLOSE:
        if (conn && conn->wk_open) {
          conn->wk_open = false;
          close_toward(sim, conn, true);
        }
        break;
      case PCP_PROTO_ACTION_CONNECT: {
        if (sim->conn_count == PCP_SIM_MAX_CONNECTIONS) {
          fail(sim, "connection table full");
          break;
        }
        conn_t* c = &sim->conns[sim->conn_count++];
        *c = (conn_t){.id = sim->conn_count,
                      .worker = w,
                      .worker_incarnation = worker->incarnation};
        worker->conn_id = c->id;
        ev_at(sim, sim->now_ns + net_delay_ns(sim), EV_CONNECT_DONE, w,
              worker->incarnation, c->id);
        break;
      }
      case PCP_PROTO_ACTION_RUN_TASK: {
        size_t slot = SIM_WORKER_TASKS_MAX;
        for (size_t i = 0; i < SIM_WORKER_TASKS_MAX; ++i) {
          if (!worker->tasks[i].live)
            slot = i;
        }
        if (slot == SIM_WORKER_TASKS_MAX) {
          fail(sim, "w%u: fake compute full", w);
          break;
        }
        worker->tasks[slot] = (wtask_t){.task_id = a.task_id, .live = true};
        ev_at(sim, sim->now_ns + rand_range_ns(sim, 5 * SIM_MS, 80 * SIM_MS),
              EV_TASK_DONE, w, worker->incarnation, a.task_id);
        trace(sim, "w%u run task %llx", w, (unsigned long long)a.task_id);
        break;
      }
      case PCP_PROTO_ACTION_CANCEL_TASK:
        for (size_t i = 0; i < SIM_WORKER_TASKS_MAX; ++i) {
          if (worker->tasks[i].live && worker->tasks[i].task_id == a.task_id) {
            worker->tasks[i].live = false;
            // Answers a gateway's cancel; after a close there is no one to
            // answer (NOT_FOUND).
            pcp_status_ignore(pcp_proto_worker_task_fail(
                worker->proto, a.task_id,
                pcp_make_status(PCP_STATUS_CANCELLED, "cancelled"),
                sim->now_ns));
            trace(sim, "w%u cancel task %llx", w,
                  (unsigned long long)a.task_id);
          }
        }
        break;
      case PCP_PROTO_ACTION_ACCEPTED:
        trace(sim, "w%u accepted epoch %llu resumed %d", w,
              (unsigned long long)a.lease_epoch, (int)a.resumed);
        // Lease epochs only grow under one gateway; a resumed session
        // keeps its epoch, a new one gets a higher one.
        if (conn &&
            worker->accepted_gw_incarnation == conn->gateway_incarnation &&
            (a.resumed ? a.lease_epoch != worker->accepted_epoch
                       : a.lease_epoch <= worker->accepted_epoch)) {
          fail(sim, "w%u: lease epoch %llu after %llu (resumed %d)", w,
               (unsigned long long)a.lease_epoch,
               (unsigned long long)worker->accepted_epoch, (int)a.resumed);
        }
        worker->accepted_epoch = a.lease_epoch;
        worker->accepted_gw_incarnation = conn ? conn->gateway_incarnation : 0;
        break;
      case PCP_PROTO_ACTION_REJECTED:
        trace(sim, "w%u rejected reason %u", w, a.reject_reason);
        break;
      default:
        break;
    }
    pcp_proto_action_deinitialize(&a);
  }
}

static pcp_status_t wk_boot(sim_t* sim, uint32_t w) {
  sim_worker_t* worker = &sim->workers[w];
  worker->incarnation++;
  pcp_rng_initialize(pcp_rng_next_u64(&sim->rng), &worker->rng);
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_worker_create(
      &worker->config, &worker->rng, sim->allocator, &worker->proto));
  worker->alive = true;
  worker->conn_id = 0;
  memset(worker->tasks, 0, sizeof(worker->tasks));
  trace(sim, "w%u boot (incarnation %u)", w, worker->incarnation);
  pcp_status_t status = pcp_proto_worker_start(worker->proto, sim->now_ns);
  if (status)
    return status;
  wk_process_actions(sim, worker);
  ev_at(sim, sim->now_ns + sim->timeouts.tick_interval_ns, EV_WORKER_TICK, w,
        worker->incarnation, 0);
  return pcp_ok_status();
}

static void wk_crash(sim_t* sim, uint32_t w, int64_t downtime_ns) {
  sim_worker_t* worker = &sim->workers[w];
  if (!worker->alive)
    return;
  conn_t* conn = conn_get(sim, worker->conn_id);
  if (conn && conn->wk_open) {
    conn->wk_open = false;
    close_toward(sim, conn, true);
  }
  pcp_proto_worker_release(worker->proto);
  worker->proto = NULL;
  worker->alive = false;
  sim->result->worker_crashes++;
  trace(sim, "w%u crash (down %.3f ms)", w, (double)downtime_ns / SIM_MS);
  ev_at(sim, sim->now_ns + downtime_ns, EV_WORKER_BOOT, w, 0, 0);
}

// Both ends see a reset: the worker at once, the gateway after what is on
// the wire toward it.
static void conn_reset(sim_t* sim, conn_t* conn, const char* why) {
  if (!conn->wk_open)
    return;
  trace(sim, "conn %llu reset (%s)", (unsigned long long)conn->id, why);
  conn->wk_open = false;
  close_toward(sim, conn, true);
  sim_worker_t* worker = &sim->workers[conn->worker];
  if (worker->alive && worker->conn_id == conn->id) {
    pcp_status_t status =
        pcp_proto_worker_on_closed(worker->proto, sim->now_ns);
    if (status) {
      fail_status(sim, status, "worker on_closed");
      return;
    }
    wk_process_actions(sim, worker);
  }
}

//===----------------------------------------------------------------------===//
// The run
//===----------------------------------------------------------------------===//

static void apply_fault(sim_t* sim, const pcp_sim_fault_t* fault) {
  trace(sim, "FAULT %s target %u arg %.3f ms",
        pcp_sim_fault_kind_name(fault->kind), fault->target,
        (double)fault->arg_ns / SIM_MS);
  switch (fault->kind) {
    case PCP_SIM_FAULT_WORKER_CRASH:
      wk_crash(sim, fault->target % sim->options.worker_count, fault->arg_ns);
      break;
    case PCP_SIM_FAULT_CONNECTION_RESET: {
      sim_worker_t* worker =
          &sim->workers[fault->target % sim->options.worker_count];
      conn_t* conn = conn_get(sim, worker->conn_id);
      if (worker->alive && conn)
        conn_reset(sim, conn, "fault");
      break;
    }
    case PCP_SIM_FAULT_GATEWAY_RESTART:
      if (!sim->gw_up)
        break;
      gw_crash(sim);
      sim->result->gateway_restarts++;
      ev_at(sim, sim->now_ns + fault->arg_ns, EV_GATEWAY_BOOT, 0, 0, 0);
      break;
    case PCP_SIM_FAULT_JOB_CANCEL:
      gw_cancel(sim, fault->target % sim->options.job_count);
      break;
    default:
      break;
  }
}

static void handle_event(sim_t* sim, event_t* ev) {
  conn_t* conn = conn_get(sim, ev->id);
  pcp_status_t status = pcp_ok_status();
  switch (ev->kind) {
    case EV_TO_GATEWAY:
      if (conn && conn->gw_open) {
        status = pcp_proto_gateway_conn_on_bytes(conn->gw, ev->bytes,
                                                 ev->byte_length, sim->now_ns);
        if (!status)
          gw_process_actions(sim, conn);
      }
      break;
    case EV_TO_WORKER:
      if (wk_current(sim, ev->index, conn)) {
        sim_worker_t* worker = &sim->workers[ev->index];
        status = pcp_proto_worker_on_bytes(worker->proto, ev->bytes,
                                           ev->byte_length, sim->now_ns);
        if (!status)
          wk_process_actions(sim, worker);
      }
      break;
    case EV_CLOSE_AT_GATEWAY:
      if (conn && conn->gw_open) {
        status = pcp_proto_gateway_conn_on_closed(conn->gw, sim->now_ns);
        if (!status) {
          gw_process_actions(sim, conn);
          gw_conn_ended(sim, conn);
        }
      }
      break;
    case EV_CLOSE_AT_WORKER:
      if (wk_current(sim, ev->index, conn)) {
        sim_worker_t* worker = &sim->workers[ev->index];
        conn->wk_open = false;
        status = pcp_proto_worker_on_closed(worker->proto, sim->now_ns);
        if (!status)
          wk_process_actions(sim, worker);
      }
      break;
    case EV_CONNECT_DONE: {
      sim_worker_t* worker = &sim->workers[ev->index];
      if (!worker->alive || worker->incarnation != ev->incarnation ||
          worker->conn_id != ev->id) {
        break;
      }
      if (!sim->gw_up) {
        trace(sim, "w%u connect refused", ev->index);
        status = pcp_proto_worker_on_closed(worker->proto, sim->now_ns);
        if (!status)
          wk_process_actions(sim, worker);
        break;
      }
      pcp_proto_gateway_config_t config = {
          .limits = pcp_proto_limits_default(),
          .heartbeat_interval_ms = SIM_HEARTBEAT_MS,
          .join_token = (const uint8_t*)kSimJoinToken,
          .join_token_length = sizeof(kSimJoinToken) - 1,
      };
      for (size_t i = 0; i < sizeof(config.nonce); ++i) {
        config.nonce[i] = (uint8_t)pcp_rng_next_u64(&sim->rng);
      }
      status = pcp_proto_gateway_conn_create(&config, sim->now_ns,
                                             sim->allocator, &conn->gw);
      if (status)
        break;
      conn->gw_open = true;
      conn->wk_open = true;
      conn->gateway_incarnation = sim->gw_incarnation;
      trace(sim, "w%u connected conn %llu", ev->index,
            (unsigned long long)conn->id);
      status = pcp_proto_worker_on_connected(worker->proto, sim->now_ns);
      if (!status)
        wk_process_actions(sim, worker);
      break;
    }
    case EV_GATEWAY_TICK:
      if (sim->gw_up)
        gw_tick(sim);
      ev_at(sim, sim->now_ns + sim->timeouts.tick_interval_ns, EV_GATEWAY_TICK,
            0, 0, 0);
      break;
    case EV_WORKER_TICK: {
      sim_worker_t* worker = &sim->workers[ev->index];
      if (!worker->alive || worker->incarnation != ev->incarnation)
        break;
      status = pcp_proto_worker_on_tick(worker->proto, sim->now_ns);
      if (!status)
        wk_process_actions(sim, worker);
      ev_at(sim, sim->now_ns + sim->timeouts.tick_interval_ns, EV_WORKER_TICK,
            ev->index, ev->incarnation, 0);
      break;
    }
    case EV_TASK_DONE: {
      sim_worker_t* worker = &sim->workers[ev->index];
      if (worker->alive && worker->incarnation == ev->incarnation) {
        wk_task_done(sim, ev->index, ev->id);
      }
      break;
    }
    case EV_FAULT:
      sim->faults_applied++;
      apply_fault(sim, &sim->faults[ev->index]);
      break;
    case EV_WORKER_BOOT:
      status = wk_boot(sim, ev->index);
      break;
    case EV_GATEWAY_BOOT:
      status = gw_boot(sim);
      break;
    case EV_SUBMIT:
      gw_submit(sim, ev->index);
      break;
  }
  if (status)
    fail_status(sim, status, ev_kind_name(ev->kind));
}

static bool all_finished(sim_t* sim) {
  if (!sim->gw_up || sim->faults_applied < sim->fault_count)
    return false;
  for (uint32_t j = 0; j < sim->options.job_count; ++j) {
    if (!sim->job_submitted[j] || !sim->model[j].exists ||
        !pcp_store_job_state_is_terminal(sim->model[j].state)) {
      return false;
    }
  }
  return true;
}

static int fault_compare(const void* a, const void* b) {
  const pcp_sim_fault_t* x = a;
  const pcp_sim_fault_t* y = b;
  return x->at_ns < y->at_ns ? -1 : x->at_ns > y->at_ns;
}

static void draw_scenario(sim_t* sim) {
  for (uint32_t j = 0; j < sim->options.job_count; ++j) {
    sim->job_steps[j] =
        1 + (uint32_t)pcp_rng_next_below(&sim->scenario_rng,
                                         sim->options.max_steps_per_job);
  }
  sim->keep_detached_leases = pcp_rng_next_below(&sim->scenario_rng, 2) == 0;
  if (sim->options.fault_schedule) {
    sim->fault_count = sim->options.fault_schedule_count;
    memcpy(sim->faults, sim->options.fault_schedule,
           sim->fault_count * sizeof(pcp_sim_fault_t));
  } else if (sim->options.faults) {
    sim->fault_count = 1 + (size_t)pcp_rng_next_below(&sim->scenario_rng, 8);
    for (size_t i = 0; i < sim->fault_count; ++i) {
      pcp_sim_fault_t* f = &sim->faults[i];
      uint64_t roll = pcp_rng_next_below(&sim->scenario_rng, 100);
      f->kind = roll < 30   ? PCP_SIM_FAULT_WORKER_CRASH
                : roll < 60 ? PCP_SIM_FAULT_CONNECTION_RESET
                : roll < 75 ? PCP_SIM_FAULT_GATEWAY_RESTART
                            : PCP_SIM_FAULT_JOB_CANCEL;
      f->at_ns = (int64_t)pcp_rng_next_below(&sim->scenario_rng,
                                             SIM_FAULT_WINDOW_NS + 1);
      f->target =
          (uint32_t)pcp_rng_next_below(&sim->scenario_rng, PCP_SIM_MAX_JOBS);
      f->arg_ns = 20 * SIM_MS + (int64_t)pcp_rng_next_below(&sim->scenario_rng,
                                                            380 * SIM_MS + 1);
    }
    qsort(sim->faults, sim->fault_count, sizeof(pcp_sim_fault_t),
          fault_compare);
  }
  memcpy(sim->result->faults, sim->faults,
         sim->fault_count * sizeof(pcp_sim_fault_t));
  sim->result->fault_count = sim->fault_count;
}

static int remove_entry(const char* path, const struct stat* st, int flag,
                        struct FTW* ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static pcp_status_t options_validate(const pcp_sim_options_t* o) {
  if (o->worker_count < 1 || o->worker_count > PCP_SIM_MAX_WORKERS ||
      o->job_count < 1 || o->job_count > PCP_SIM_MAX_JOBS ||
      o->max_steps_per_job < 1 ||
      o->max_steps_per_job > PCP_SIM_MAX_STEPS_PER_JOB ||
      o->fault_schedule_count > PCP_SIM_MAX_FAULTS ||
      (unsigned)o->bug >= PCP_SIM_BUG_COUNT_) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "sim options out of range (workers 1..%u, jobs "
                           "1..%u, steps 1..%u, faults <= %u)",
                           PCP_SIM_MAX_WORKERS, PCP_SIM_MAX_JOBS,
                           PCP_SIM_MAX_STEPS_PER_JOB, PCP_SIM_MAX_FAULTS);
  }
  if (o->bug != PCP_SIM_BUG_NONE && !pcp_sim_seeded_bugs_available()) {
    return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                           "seeded bug %s needs a PCP_SIM_SEEDED_BUGS build",
                           pcp_sim_bug_name(o->bug));
  }
  return pcp_ok_status();
}

static void sim_final_checks(sim_t* sim) {
  // Quiescence: every job finished, every lease given back.
  for (uint32_t j = 0; j < sim->options.job_count && !sim->failed; ++j) {
    const model_job_t* m = &sim->model[j];
    if (!m->exists || !pcp_store_job_state_is_terminal(m->state)) {
      fail(sim, "job-%u lost: %s at the end", j,
           m->exists ? pcp_store_job_state_name(m->state) : "never stored");
    } else if (m->state == PCP_STORE_JOB_STATE_SUCCEEDED) {
      sim->result->jobs_succeeded++;
    } else if (m->state == PCP_STORE_JOB_STATE_FAILED) {
      sim->result->jobs_failed++;
    } else {
      sim->result->jobs_cancelled++;
    }
  }
  if (sim->failed)
    return;
  uint64_t ids[256];
  size_t count = 0;
  pcp_status_t status = pcp_sched_owner_leases_list(
      sim->sched, PCP_SCHED_OWNER_JOBS, ids, 256, &count);
  if (status) {
    fail_status(sim, status, "lease list");
    return;
  }
  if (count) {
    fail(sim, "%zu lease(s) still held at quiescence (first %llu)", count,
         (unsigned long long)ids[0]);
    return;
  }
  // One more restart: everything acknowledged is still there.
  gw_crash(sim);
  status = gw_boot(sim);
  if (status)
    fail_status(sim, status, "final restart");
}

pcp_status_t pcp_sim_run(const pcp_sim_options_t* options,
                         pcp_sim_result_t* out_result) {
  memset(out_result, 0, sizeof(*out_result));
  out_result->trace_hash = UINT64_C(14695981039346656037);
  PCP_RETURN_IF_ERROR_BARE(options_validate(options));
  sim_t* sim = NULL;
  pcp_allocator_t allocator = pcp_allocator_system();
  void* p = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(allocator, sizeof(sim_t), &p));
  sim = p;
  sim->options = *options;
  sim->result = out_result;
  sim->allocator = allocator;
  sim->timeouts = pcp_proto_timeouts_from_heartbeat(SIM_HEARTBEAT_MS);
  sim->clock_state.now_ns = 0;
  sim->clock_state.wall_ns = INT64_C(1800000000) * 1000000000;
  pcp_rng_initialize(options->seed, &sim->rng);
  pcp_rng_initialize(options->seed ^ UINT64_C(0x9e3779b97f4a7c15),
                     &sim->scenario_rng);
  uint64_t max_events =
      options->max_events ? options->max_events : PCP_SIM_MAX_EVENTS_DEFAULT;

  const char* root = options->temp_root;
  struct stat st;
  if (!root)
    root = stat("/dev/shm", &st) == 0 ? "/dev/shm" : getenv("TMPDIR");
  if (!root)
    root = "/tmp";
  snprintf(sim->state_dir, sizeof(sim->state_dir), "%s/pcp-sim-XXXXXX", root);
  pcp_status_t status = pcp_ok_status();
  if (!mkdtemp(sim->state_dir)) {
    status = pcp_status_from_errno(errno, "mkdtemp %s", sim->state_dir);
    pcp_allocator_free(allocator, sim);
    return status;
  }
  status = pcp_allocator_calloc(allocator,
                                PCP_SIM_MAX_CONNECTIONS * sizeof(conn_t), &p);
  if (!status)
    sim->conns = p;

  for (uint32_t w = 0; w < options->worker_count && !status; ++w) {
    sim_worker_t* worker = &sim->workers[w];
    snprintf(worker->id, sizeof(worker->id), "w%u", w);
    worker->config = (pcp_proto_worker_config_t){
        .limits = pcp_proto_limits_default(),
        .heartbeat_interval_ms = SIM_HEARTBEAT_MS,
        .join = {.worker_id = worker->id,
                 .backend = "cpu",
                 .target = "host",
                 .device_memory_bytes = UINT64_C(1) << 30,
                 .runtime_version = "sim",
                 .compiler_version = "sim",
                 .node_manager_id = "",
                 .supervisor_id = -1,
                 .worker_class = "cpu"},
        .join_token = (const uint8_t*)kSimJoinToken,
        .join_token_length = sizeof(kSimJoinToken) - 1,
    };
  }

  pcp_buggify_install(buggify_hook, sim);
  if (!status) {
    draw_scenario(sim);
    trace(sim,
          "sim seed %llu workers %u jobs %u faults %zu buggify %d bug %s "
          "keep_detached %d",
          (unsigned long long)options->seed, options->worker_count,
          options->job_count, sim->fault_count, (int)options->buggify,
          pcp_sim_bug_name(options->bug), (int)sim->keep_detached_leases);
    status = gw_boot(sim);
  }
  if (!status) {
    for (uint32_t w = 0; w < options->worker_count; ++w) {
      ev_at(sim, rand_range_ns(sim, 0, 20 * SIM_MS), EV_WORKER_BOOT, w, 0, 0);
    }
    for (uint32_t j = 0; j < options->job_count; ++j) {
      ev_at(sim, rand_range_ns(sim, 0, SIM_SUBMIT_WINDOW_NS), EV_SUBMIT, j, 0,
            0);
    }
    for (size_t i = 0; i < sim->fault_count; ++i) {
      ev_at(sim, sim->faults[i].at_ns, EV_FAULT, (uint32_t)i, 0, 0);
    }
    ev_at(sim, sim->timeouts.tick_interval_ns, EV_GATEWAY_TICK, 0, 0, 0);

    int64_t settle_until = -1;
    while (!sim->failed && sim->heap_count) {
      event_t ev = ev_pop(sim);
      sim->now_ns = ev.at_ns;
      sim->clock_state.wall_ns += ev.at_ns - sim->clock_state.now_ns;
      sim->clock_state.now_ns = ev.at_ns;
      out_result->event_count++;
      trace(sim, "%s i=%u c=%llu", ev_kind_name(ev.kind), ev.index,
            (unsigned long long)ev.id);
      handle_event(sim, &ev);
      pcp_allocator_free(pcp_allocator_system(), ev.bytes);
      sim_runner_step(sim);
      check_after_event(sim);
      if (settle_until < 0 && all_finished(sim)) {
        settle_until = sim->now_ns + SIM_SETTLE_NS;
      }
      if (settle_until >= 0 && sim->now_ns >= settle_until)
        break;
      if (sim->now_ns > SIM_LIVENESS_LIMIT_NS) {
        for (uint32_t j = 0; j < options->job_count; ++j) {
          if (!sim->model[j].exists ||
              !pcp_store_job_state_is_terminal(sim->model[j].state)) {
            fail(sim, "liveness: job-%u still %s after %lld s", j,
                 sim->model[j].exists
                     ? pcp_store_job_state_name(sim->model[j].state)
                     : "unsubmitted",
                 (long long)(SIM_LIVENESS_LIMIT_NS / 1000000000));
            break;
          }
        }
        break;
      }
      if (out_result->event_count >= max_events) {
        fail(sim, "livelock: %llu events", (unsigned long long)max_events);
      }
    }
    if (!sim->failed && sim->gw_up)
      sim_final_checks(sim);
  }
  pcp_buggify_install(NULL, NULL);
  out_result->failed = sim->failed;
  out_result->end_ns = sim->now_ns;

  // Tear down.
  while (sim->heap_count) {
    pcp_allocator_free(pcp_allocator_system(), ev_pop(sim).bytes);
  }
  pcp_allocator_free(allocator, sim->heap);
  for (size_t i = 0; i < sim->conn_count; ++i) {
    pcp_proto_gateway_conn_release(sim->conns[i].gw);
  }
  pcp_allocator_free(allocator, sim->conns);
  for (uint32_t w = 0; w < PCP_SIM_MAX_WORKERS; ++w) {
    pcp_proto_worker_release(sim->workers[w].proto);
  }
  pcp_sched_release(sim->sched);
  pcp_store_release(sim->store);
  nftw(sim->state_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  pcp_allocator_free(allocator, sim);
  return status;
}

//===----------------------------------------------------------------------===//
// Shrinking
//===----------------------------------------------------------------------===//

pcp_status_t pcp_sim_shrink(const pcp_sim_options_t* options, uint32_t max_runs,
                            pcp_sim_result_t* out_result, bool* out_buggify) {
  pcp_sim_options_t current = *options;
  current.trace = NULL;
  pcp_sim_result_t result;
  PCP_RETURN_IF_ERROR_BARE(pcp_sim_run(&current, &result));
  if (!result.failed) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "seed %llu does not fail: nothing to shrink",
                           (unsigned long long)options->seed);
  }
  pcp_sim_fault_t faults[PCP_SIM_MAX_FAULTS];
  size_t count = result.fault_count;
  memcpy(faults, result.faults, count * sizeof(pcp_sim_fault_t));
  current.fault_schedule = faults;
  current.fault_schedule_count = count;
  *out_result = result;
  uint32_t runs = 1;
  // Drop one fault at a time while the run still fails; start over after
  // every success, until a full pass removes nothing.
  bool progress = true;
  while (progress && runs < max_runs) {
    progress = false;
    for (size_t i = 0; i < count && runs < max_runs; ++i) {
      pcp_sim_fault_t trial[PCP_SIM_MAX_FAULTS];
      memcpy(trial, faults, i * sizeof(pcp_sim_fault_t));
      memcpy(trial + i, faults + i + 1,
             (count - i - 1) * sizeof(pcp_sim_fault_t));
      pcp_sim_options_t attempt = current;
      attempt.fault_schedule = trial;
      attempt.fault_schedule_count = count - 1;
      PCP_RETURN_IF_ERROR_BARE(pcp_sim_run(&attempt, &result));
      runs++;
      if (result.failed) {
        memcpy(faults, trial, (count - 1) * sizeof(pcp_sim_fault_t));
        count--;
        current.fault_schedule_count = count;
        *out_result = result;
        progress = true;
        break;
      }
    }
  }
  if (current.buggify && runs < max_runs) {
    pcp_sim_options_t attempt = current;
    attempt.buggify = false;
    PCP_RETURN_IF_ERROR_BARE(pcp_sim_run(&attempt, &result));
    if (result.failed) {
      current.buggify = false;
      *out_result = result;
    }
  }
  *out_buggify = current.buggify;
  return pcp_ok_status();
}

void pcp_sim_faults_print(const pcp_sim_fault_t* faults, size_t count,
                          FILE* sink) {
  for (size_t i = 0; i < count; ++i) {
    fprintf(sink, "at_ms=%.3f fault=%s target=%u arg_ms=%.3f\n",
            (double)faults[i].at_ns / (double)SIM_MS,
            pcp_sim_fault_kind_name(faults[i].kind), faults[i].target,
            (double)faults[i].arg_ns / (double)SIM_MS);
  }
}
