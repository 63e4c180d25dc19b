// SPDX-License-Identifier: Apache-2.0
//
// The deterministic simulation (sim.h): names and options, the trace, the
// BUGGIFY hook, the event queue, the simulated network, faults, the run and
// the shrinker. The gateway and workers are in sim_nodes.c, the job runner
// kind in sim_runner.c, the checkers in sim_check.c (sim_impl.h).

#define _XOPEN_SOURCE 700  // nftw, mkdtemp (the temporary state dir)

#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sim/sim_impl.h"

static const char kSimJoinToken[] = "pcp-sim-join-token";

static const char* ev_kind_name(ev_kind_t kind) {
  static const char* const names[] = {
      "?",       "to_gw",   "to_wk",   "close_gw",  "close_wk",
      "connect", "gw_tick", "wk_tick", "task_done", "fault",
      "wk_boot", "gw_boot", "submit",
  };
  return (unsigned)kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "?";
}

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
    case PCP_SIM_BUG_EPOCH_KEPT_ON_REJOIN:
      return "epoch_kept_on_rejoin";
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
// Trace and failure
//===----------------------------------------------------------------------===//

void pcp_sim_trace(sim_t* sim, const char* fmt, ...) {
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

void pcp_sim_fail(sim_t* sim, const char* fmt, ...) {
  if (sim->failed)
    return;
  sim->failed = true;
  va_list args;
  va_start(args, fmt);
  vsnprintf(sim->result->failure, sizeof(sim->result->failure), fmt, args);
  va_end(args);
  pcp_sim_trace(sim, "CHECK FAILED: %s", sim->result->failure);
}

// A status where none may occur: the run fails and names it.
void pcp_sim_fail_status(sim_t* sim, pcp_status_t status, const char* what) {
  char text[256];
  pcp_status_format(status, text, sizeof(text));
  pcp_status_ignore(status);
  pcp_sim_fail(sim, "%s: %s", what, text);
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
  pcp_sim_trace(sim, "buggify %s", site);
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
      pcp_sim_fail_status(sim, status, "event queue");
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

void pcp_sim_event_at(sim_t* sim, int64_t at_ns, ev_kind_t kind, uint32_t index,
                      uint32_t incarnation, uint64_t id) {
  event_t ev = {.at_ns = at_ns,
                .kind = kind,
                .index = index,
                .incarnation = incarnation,
                .id = id};
  ev_push(sim, ev);
}

int64_t pcp_sim_rand_range_ns(sim_t* sim, int64_t lo, int64_t hi) {
  return lo + (int64_t)pcp_rng_next_below(&sim->rng, (uint64_t)(hi - lo) + 1);
}

//===----------------------------------------------------------------------===//
// Network: one FIFO per direction per connection
//===----------------------------------------------------------------------===//

conn_t* pcp_sim_conn_get(sim_t* sim, uint64_t id) {
  return id >= 1 && id <= sim->conn_count ? &sim->conns[id - 1] : NULL;
}

int64_t pcp_sim_net_delay_ns(sim_t* sim) {
  // A delay spike past the silence timeout (3H) makes the peer evict.
  if (PCP_BUGGIFY("sim.net_delay_spike")) {
    return pcp_sim_rand_range_ns(sim, 200 * SIM_MS, 450 * SIM_MS);
  }
  return pcp_sim_rand_range_ns(sim, SIM_MS / 10, 5 * SIM_MS);
}

// Schedules a FIFO delivery: never before an earlier message of the same
// direction, so the seeded delay reorders only across connections.
static int64_t fifo_at(sim_t* sim, int64_t* last_ns) {
  int64_t at = sim->now_ns + pcp_sim_net_delay_ns(sim);
  if (at <= *last_ns)
    at = *last_ns + 1;
  *last_ns = at;
  return at;
}

void pcp_sim_net_send(sim_t* sim, conn_t* conn, bool to_gateway,
                      pcp_proto_encoded_frame_t* frame) {
  if (to_gateway ? !conn->wk_open : !conn->gw_open)
    return;
  if (PCP_BUGGIFY("sim.frame_send_reset")) {
    pcp_sim_conn_reset(sim, conn, "send failed");
    return;
  }
  event_t ev = {.kind = to_gateway ? EV_TO_GATEWAY : EV_TO_WORKER,
                .index = conn->worker,
                .id = conn->id};
  pcp_status_t status = pcp_proto_encoded_frame_flatten(
      frame, pcp_allocator_system(), &ev.bytes, &ev.byte_length);
  if (status) {
    pcp_sim_fail_status(sim, status, "flatten");
    return;
  }
  ev.at_ns =
      fifo_at(sim, to_gateway ? &conn->to_gw_last_ns : &conn->to_wk_last_ns);
  ev_push(sim, ev);
}

// One side closes: the other side hears it after every byte already sent
// its way (FIN after data).
void pcp_sim_net_close_toward(sim_t* sim, conn_t* conn, bool to_gateway) {
  int64_t at =
      fifo_at(sim, to_gateway ? &conn->to_gw_last_ns : &conn->to_wk_last_ns);
  pcp_sim_event_at(sim, at,
                   to_gateway ? EV_CLOSE_AT_GATEWAY : EV_CLOSE_AT_WORKER,
                   conn->worker, 0, conn->id);
}

//===----------------------------------------------------------------------===//
// The run
//===----------------------------------------------------------------------===//

static void apply_fault(sim_t* sim, const pcp_sim_fault_t* fault) {
  pcp_sim_trace(sim, "FAULT %s target %u arg %.3f ms",
                pcp_sim_fault_kind_name(fault->kind), fault->target,
                (double)fault->arg_ns / SIM_MS);
  switch (fault->kind) {
    case PCP_SIM_FAULT_WORKER_CRASH:
      pcp_sim_worker_crash(sim, fault->target % sim->options.worker_count,
                           fault->arg_ns);
      break;
    case PCP_SIM_FAULT_CONNECTION_RESET: {
      sim_worker_t* worker =
          &sim->workers[fault->target % sim->options.worker_count];
      conn_t* conn = pcp_sim_conn_get(sim, worker->conn_id);
      if (worker->alive && conn)
        pcp_sim_conn_reset(sim, conn, "fault");
      break;
    }
    case PCP_SIM_FAULT_GATEWAY_RESTART:
      if (!sim->gw_up)
        break;
      pcp_sim_gateway_crash(sim);
      sim->result->gateway_restarts++;
      pcp_sim_event_at(sim, sim->now_ns + fault->arg_ns, EV_GATEWAY_BOOT, 0, 0,
                       0);
      break;
    case PCP_SIM_FAULT_JOB_CANCEL:
      pcp_sim_gateway_cancel(sim, fault->target % sim->options.job_count);
      break;
    default:
      break;
  }
}

static void handle_event(sim_t* sim, event_t* ev) {
  conn_t* conn = pcp_sim_conn_get(sim, ev->id);
  pcp_status_t status = pcp_ok_status();
  switch (ev->kind) {
    case EV_TO_GATEWAY:
      if (conn && conn->gw_open) {
        status = pcp_proto_gateway_conn_on_bytes(conn->gw, ev->bytes,
                                                 ev->byte_length, sim->now_ns);
        if (!status)
          pcp_sim_gateway_actions_process(sim, conn);
      }
      break;
    case EV_TO_WORKER:
      if (pcp_sim_worker_current(sim, ev->index, conn)) {
        sim_worker_t* worker = &sim->workers[ev->index];
        status = pcp_proto_worker_on_bytes(worker->proto, ev->bytes,
                                           ev->byte_length, sim->now_ns);
        if (!status)
          pcp_sim_worker_actions_process(sim, worker);
      }
      break;
    case EV_CLOSE_AT_GATEWAY:
      if (conn && conn->gw_open) {
        status = pcp_proto_gateway_conn_on_closed(conn->gw, sim->now_ns);
        if (!status) {
          pcp_sim_gateway_actions_process(sim, conn);
          pcp_sim_gateway_conn_ended(sim, conn);
        }
      }
      break;
    case EV_CLOSE_AT_WORKER:
      if (pcp_sim_worker_current(sim, ev->index, conn)) {
        sim_worker_t* worker = &sim->workers[ev->index];
        conn->wk_open = false;
        status = pcp_proto_worker_on_closed(worker->proto, sim->now_ns);
        if (!status)
          pcp_sim_worker_actions_process(sim, worker);
      }
      break;
    case EV_CONNECT_DONE: {
      sim_worker_t* worker = &sim->workers[ev->index];
      if (!worker->alive || worker->incarnation != ev->incarnation ||
          worker->conn_id != ev->id) {
        break;
      }
      if (!sim->gw_up) {
        pcp_sim_trace(sim, "w%u connect refused", ev->index);
        status = pcp_proto_worker_on_closed(worker->proto, sim->now_ns);
        if (!status)
          pcp_sim_worker_actions_process(sim, worker);
        break;
      }
      pcp_proto_gateway_config_t config = {
          .limits = pcp_proto_limits_default(),
          .heartbeat_interval_ms = SIM_HEARTBEAT_MS,
          .join_token = (const uint8_t*)kSimJoinToken,
          .join_token_length = sizeof(kSimJoinToken) - 1,
      };
      config.limits.chunk_bytes = SIM_CHUNK_BYTES;  // several chunks
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
      pcp_sim_trace(sim, "w%u connected conn %llu", ev->index,
                    (unsigned long long)conn->id);
      status = pcp_proto_worker_on_connected(worker->proto, sim->now_ns);
      if (!status)
        pcp_sim_worker_actions_process(sim, worker);
      break;
    }
    case EV_GATEWAY_TICK:
      if (sim->gw_up)
        pcp_sim_gateway_tick(sim);
      pcp_sim_event_at(sim, sim->now_ns + sim->timeouts.tick_interval_ns,
                       EV_GATEWAY_TICK, 0, 0, 0);
      break;
    case EV_WORKER_TICK: {
      sim_worker_t* worker = &sim->workers[ev->index];
      if (!worker->alive || worker->incarnation != ev->incarnation)
        break;
      status = pcp_proto_worker_on_tick(worker->proto, sim->now_ns);
      if (!status)
        pcp_sim_worker_actions_process(sim, worker);
      pcp_sim_event_at(sim, sim->now_ns + sim->timeouts.tick_interval_ns,
                       EV_WORKER_TICK, ev->index, ev->incarnation, 0);
      break;
    }
    case EV_TASK_DONE: {
      sim_worker_t* worker = &sim->workers[ev->index];
      if (worker->alive && worker->incarnation == ev->incarnation) {
        pcp_sim_worker_task_done(sim, ev->index, ev->id);
      }
      break;
    }
    case EV_FAULT:
      sim->faults_applied++;
      apply_fault(sim, &sim->faults[ev->index]);
      break;
    case EV_WORKER_BOOT:
      status = pcp_sim_worker_boot(sim, ev->index);
      break;
    case EV_GATEWAY_BOOT:
      status = pcp_sim_gateway_boot(sim);
      break;
    case EV_SUBMIT:
      pcp_sim_gateway_submit(sim, ev->index);
      break;
  }
  if (status)
    pcp_sim_fail_status(sim, status, ev_kind_name(ev->kind));
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

void pcp_sim_state_dir_remove(const char* dir) {
  nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static pcp_status_t file_copy(const char* from, const char* to) {
  FILE* in = fopen(from, "rb");
  if (!in) {
    // No WAL yet is fine; anything else is not.
    return errno == ENOENT ? pcp_ok_status()
                           : pcp_status_from_errno(errno, "open %s", from);
  }
  FILE* out = fopen(to, "wb");
  pcp_status_t status =
      out ? pcp_ok_status() : pcp_status_from_errno(errno, "create %s", to);
  char buffer[1 << 14];
  size_t n = 0;
  while (!status && (n = fread(buffer, 1, sizeof(buffer), in)) > 0) {
    if (fwrite(buffer, 1, n, out) != n) {
      status = pcp_status_from_errno(errno, "write %s", to);
    }
  }
  if (!status && ferror(in))
    status = pcp_status_from_errno(EIO, "read %s", from);
  fclose(in);
  if (out && fclose(out) != 0 && !status) {
    status = pcp_status_from_errno(errno, "close %s", to);
  }
  return status;
}

static pcp_status_t state_dir_make(sim_t* sim) {
  snprintf(sim->state_dir, sizeof(sim->state_dir), "%s/gateway-%u",
           sim->run_dir, sim->gw_incarnation + 1);
  if (mkdir(sim->state_dir, 0700) != 0) {
    return pcp_status_from_errno(errno, "mkdir %s", sim->state_dir);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_sim_state_dir_snapshot(sim_t* sim, char* old_dir,
                                        size_t capacity) {
  snprintf(old_dir, capacity, "%s", sim->state_dir);
  PCP_RETURN_IF_ERROR_BARE(state_dir_make(sim));
  static const char* const names[] = {"pcp.db", "pcp.db-wal"};
  for (size_t i = 0; i < 2; ++i) {
    char from[700], to[700];
    snprintf(from, sizeof(from), "%s/%s", old_dir, names[i]);
    snprintf(to, sizeof(to), "%s/%s", sim->state_dir, names[i]);
    PCP_RETURN_IF_ERROR_BARE(file_copy(from, to));
  }
  return pcp_ok_status();
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
      pcp_sim_fail(
          sim, "job-%u lost: %s at the end", j,
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
    pcp_sim_fail_status(sim, status, "lease list");
    return;
  }
  if (count) {
    pcp_sim_fail(sim, "%zu lease(s) still held at quiescence (first %llu)",
                 count, (unsigned long long)ids[0]);
    return;
  }
  // One more restart: everything acknowledged is still there.
  pcp_sim_gateway_crash(sim);
  status = pcp_sim_gateway_boot(sim);
  if (status)
    pcp_sim_fail_status(sim, status, "final restart");
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
#if defined(PCP_SIM_SEEDED_BUGS)
  pcp_fabric_glue_seeded_epoch_kept =
      SIM_BUG(sim, PCP_SIM_BUG_EPOCH_KEPT_ON_REJOIN);
#endif
  sim->allocator = allocator;
  sim->timeouts = pcp_proto_timeouts_from_heartbeat(SIM_HEARTBEAT_MS);
  sim->clock_state.now_ns = 0;
  sim->clock_state.wall_ns = INT64_C(1800000000) * 1000000000;
  for (size_t i = 0; i < SIM_PROGRAM_BYTES; ++i) {
    sim->program[i] = (uint8_t)(i * 31u + 7u);
  }
  pcp_sha256_compute(sim->program, SIM_PROGRAM_BYTES, &sim->program_sha);
  pcp_rng_initialize(options->seed, &sim->rng);
  pcp_rng_initialize(options->seed ^ UINT64_C(0x9e3779b97f4a7c15),
                     &sim->scenario_rng);
  uint64_t max_events =
      options->max_events ? options->max_events : PCP_SIM_MAX_EVENTS_DEFAULT;

  // /dev/shm first (no disk I/O), then $TMPDIR, then /tmp; a given root is
  // the only one tried.
  const char* fallback = getenv("TMPDIR");
  const char* roots[3] = {options->temp_root, NULL, NULL};
  if (!roots[0]) {
    roots[0] = "/dev/shm";
    roots[1] = fallback && *fallback ? fallback : "/tmp";
  }
  pcp_status_t status = pcp_ok_status();
  bool made = false;
  int error_number = 0;
  for (size_t i = 0; i < 3 && roots[i] && !made; ++i) {
    snprintf(sim->run_dir, sizeof(sim->run_dir), "%s/pcp-sim-XXXXXX", roots[i]);
    made = mkdtemp(sim->run_dir) != NULL;
    if (!made)
      error_number = errno;
  }
  if (!made) {
    status = pcp_status_from_errno(error_number, "mkdtemp %s", sim->run_dir);
    pcp_allocator_free(allocator, sim);
    return status;
  }
  status = state_dir_make(sim);
  if (!status) {
    status = pcp_allocator_calloc(allocator,
                                  PCP_SIM_MAX_CONNECTIONS * sizeof(conn_t), &p);
  }
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
  // The runner logs every job's end and recovery; the trace has it all.
  pcp_log_level_t log_level = pcp_log_level();
  pcp_log_set_level(PCP_LOG_ERROR);
  if (!status) {
    draw_scenario(sim);
    pcp_sim_trace(
        sim,
        "sim seed %llu workers %u jobs %u faults %zu buggify %d bug %s "
        "keep_detached %d",
        (unsigned long long)options->seed, options->worker_count,
        options->job_count, sim->fault_count, (int)options->buggify,
        pcp_sim_bug_name(options->bug), (int)sim->keep_detached_leases);
    status = pcp_sim_gateway_boot(sim);
  }
  if (!status) {
    for (uint32_t w = 0; w < options->worker_count; ++w) {
      pcp_sim_event_at(sim, pcp_sim_rand_range_ns(sim, 0, 20 * SIM_MS),
                       EV_WORKER_BOOT, w, 0, 0);
    }
    for (uint32_t j = 0; j < options->job_count; ++j) {
      pcp_sim_event_at(sim, pcp_sim_rand_range_ns(sim, 0, SIM_SUBMIT_WINDOW_NS),
                       EV_SUBMIT, j, 0, 0);
    }
    for (size_t i = 0; i < sim->fault_count; ++i) {
      pcp_sim_event_at(sim, sim->faults[i].at_ns, EV_FAULT, (uint32_t)i, 0, 0);
    }
    pcp_sim_event_at(sim, sim->timeouts.tick_interval_ns, EV_GATEWAY_TICK, 0, 0,
                     0);

    int64_t settle_until = -1;
    while (!sim->failed && sim->heap_count) {
      event_t ev = ev_pop(sim);
      sim->now_ns = ev.at_ns;
      sim->clock_state.wall_ns += ev.at_ns - sim->clock_state.now_ns;
      sim->clock_state.now_ns = ev.at_ns;
      out_result->event_count++;
      pcp_sim_trace(sim, "%s i=%u c=%llu", ev_kind_name(ev.kind), ev.index,
                    (unsigned long long)ev.id);
      handle_event(sim, &ev);
      pcp_allocator_free(pcp_allocator_system(), ev.bytes);
      pcp_sim_runner_step(sim);
      pcp_sim_check_after_event(sim);
      if (settle_until < 0 && all_finished(sim)) {
        settle_until = sim->now_ns + SIM_SETTLE_NS;
      }
      if (settle_until >= 0 && sim->now_ns >= settle_until)
        break;
      if (sim->now_ns > SIM_LIVENESS_LIMIT_NS) {
        for (uint32_t j = 0; j < options->job_count; ++j) {
          if (!sim->model[j].exists ||
              !pcp_store_job_state_is_terminal(sim->model[j].state)) {
            pcp_sim_fail(sim, "liveness: job-%u still %s after %lld s", j,
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
        pcp_sim_fail(sim, "livelock: %llu events",
                     (unsigned long long)max_events);
      }
    }
    if (!sim->failed && sim->gw_up)
      sim_final_checks(sim);
  }
  pcp_buggify_install(NULL, NULL);
  pcp_log_set_level(log_level);
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
  pcp_sim_runner_release(sim);
  pcp_sched_release(sim->sched);
  pcp_store_release(sim->store);
  pcp_sim_state_dir_remove(sim->run_dir);
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
