// SPDX-License-Identifier: Apache-2.0
//
// The simulated gateway (proto gateway connections + sched + the runner, as
// fabric.c wires them) and the simulated workers (proto worker state
// machines + a fake compute).

#include "sim/sim_impl.h"

//===----------------------------------------------------------------------===//
// Gateway
//===----------------------------------------------------------------------===//

// The gateway no longer has |conn| (it closed or was told so): its worker
// is lost (sched decides what happens to its lease).
void pcp_sim_gateway_conn_ended(sim_t* sim, conn_t* conn) {
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
  pcp_sim_trace(sim, "gateway lost w%u (conn %llu)", conn->worker,
                (unsigned long long)conn->id);
  pcp_sim_runner_on_sched_event(sim, &event);
}

static void gw_reject(sim_t* sim, conn_t* conn, pcp_proto_reject_reason_t r,
                      const char* message) {
  pcp_sim_trace(sim, "gateway reject conn %llu: %s",
                (unsigned long long)conn->id, message);
  pcp_status_ignore(
      pcp_proto_gateway_conn_reject(conn->gw, r, message, sim->now_ns));
}

// JOIN_VERIFIED: fabric's decision (pcp_fabric_join_decide), acted on with
// the simulation's registry (one slot per worker, made at boot) and its
// seeded RNG for the resume token.
static void gw_on_join_verified(sim_t* sim, conn_t* conn) {
  const pcp_proto_join_t* join = pcp_proto_gateway_conn_join(conn->gw);
  unsigned w = 0;
  // The simulation's own precondition (its tables are indexed by worker),
  // not fabric's: a simulated worker always names itself.
  if (sscanf(join->worker_id, "w%u", &w) != 1 ||
      w >= sim->options.worker_count || w != conn->worker) {
    gw_reject(sim, conn, PCP_PROTO_REJECT_BAD_JOIN, "unknown worker");
    return;
  }
  gw_worker_t* gw = &sim->gw_workers[w];
  conn_t* old = pcp_sim_conn_get(sim, gw->conn_id);
  pcp_fabric_join_record_t record = {
      .known = true,
      .connected = old && old->gw_open,
      .lease_epoch = gw->lease_epoch,
      .lost_at_ns = gw->lost_at_ns,
  };
  if (record.connected) {
    record.connection_deadline_ns = pcp_proto_gateway_conn_deadline_ns(old->gw);
  }
  memcpy(record.resume_token, gw->resume_token, sizeof(record.resume_token));
  pcp_fabric_join_decision_t decision;
  pcp_fabric_join_decide(join, &record, true, sim->now_ns, &sim->timeouts,
                         &decision);
  if (decision.verdict == PCP_FABRIC_JOIN_REJECT) {
    gw_reject(sim, conn, decision.reject_reason, decision.message);
    return;
  }
  if (decision.evict_old) {
    pcp_fabric_join_evict(old->gw, sim->now_ns);
    pcp_sim_gateway_actions_process(sim, old);
  }
  bool resumed = decision.resumed;
  if (!pcp_fabric_join_sched_enter(sim->sched, join, sim->now_ns, &decision)) {
    gw_reject(sim, conn, decision.reject_reason, decision.message);
    return;
  }
  if (!resumed) {
    gw->lease_epoch = decision.lease_epoch;
    for (size_t i = 0; i < sizeof(gw->resume_token); ++i) {
      gw->resume_token[i] = (uint8_t)pcp_rng_next_u64(&sim->rng);
    }
  }
  pcp_proto_gateway_accept_params_t params;
  pcp_fabric_join_accept_params(&decision, gw->resume_token, &params);
  pcp_status_t status =
      pcp_proto_gateway_conn_accept(conn->gw, &params, sim->now_ns);
  if (status) {
    pcp_sim_fail_status(sim, status, "accept");
    return;
  }
  gw->conn_id = conn->id;
  pcp_sim_trace(sim, "gateway accept w%u conn %llu epoch %llu resumed %d", w,
                (unsigned long long)conn->id,
                (unsigned long long)gw->lease_epoch, (int)resumed);
  pcp_sched_event_t event = {0};
  status =
      pcp_sched_worker_ready(sim->sched, join->worker_id, sim->now_ns, &event);
  if (status) {
    pcp_sim_fail_status(sim, status, "sched ready");
    return;
  }
  pcp_sim_runner_on_sched_event(sim, &event);
  if (SIM_BUG(sim, PCP_SIM_BUG_DOUBLE_ASSIGN_ON_RECONNECT) &&
      gw->last_job >= 0) {
    // The bug: "resume" the worker's last job on the new connection without
    // a lease, although the runner requeued it when the old one died.
    uint32_t j = (uint32_t)gw->last_job;
    uint64_t ghost = 0;
    if (sim->jobs[j].tracked &&
        sim->jobs[j].state != PCP_STORE_JOB_STATE_CANCELLING) {
      (void)pcp_sim_runner_task_assign(
          sim, conn, j,
          sim->jobs[j].last_committed_step + 1 < (int64_t)sim->jobs[j].steps
              ? sim->jobs[j].last_committed_step + 1
              : (int64_t)sim->jobs[j].steps - 1,
          &ghost);
    }
  }
}

// The handlers of pcp_fabric_conn_actions_drain for a simulated gateway
// connection: the drain loop and its re-entrancy guard are fabric's.
typedef struct gw_drain_t {
  sim_t* sim;
  conn_t* conn;
} gw_drain_t;

static void gw_on_send(void* context, pcp_proto_action_t* a) {
  gw_drain_t* d = context;
  pcp_sim_net_send(d->sim, d->conn, false, &a->frame);
}

static void gw_on_close(void* context, pcp_proto_action_t* a) {
  (void)a;
  gw_drain_t* d = context;
  if (d->conn->gw_open)
    pcp_sim_net_close_toward(d->sim, d->conn, false);
}

static void gw_on_join(void* context, pcp_proto_action_t* a) {
  (void)a;
  gw_drain_t* d = context;
  gw_on_join_verified(d->sim, d->conn);
}

static void gw_on_evict(void* context, pcp_proto_action_t* a) {
  (void)a;
  gw_drain_t* d = context;
  pcp_sim_trace(d->sim, "gateway evict w%u conn %llu", d->conn->worker,
                (unsigned long long)d->conn->id);
}

static void gw_on_program_fetch(void* context, pcp_proto_action_t* a) {
  gw_drain_t* d = context;
  sim_t* sim = d->sim;
  pcp_sim_trace(sim, "gateway sends the program on conn %llu",
                (unsigned long long)d->conn->id);
  pcp_status_t status = pcp_proto_gateway_conn_send_program(
      d->conn->gw, a->request_id, sim->program, SIM_PROGRAM_BYTES, sim->now_ns);
  if (status) {
    pcp_status_ignore(
        pcp_proto_gateway_conn_fail(d->conn->gw, status, sim->now_ns));
    pcp_status_ignore(status);
  }
}

static void gw_on_program_ready(void* context, pcp_proto_action_t* a) {
  gw_drain_t* d = context;
  if (memcmp(a->program, d->sim->program_sha.bytes, sizeof(a->program)) != 0) {
    pcp_sim_fail(d->sim, "conn %llu: PROGRAM_READY for another program",
                 (unsigned long long)d->conn->id);
  }
  d->conn->program_state = SIM_PROGRAM_READY;
  pcp_sim_trace(d->sim, "gateway program ready on conn %llu",
                (unsigned long long)d->conn->id);
}

static void gw_on_program_failed(void* context, pcp_proto_action_t* a) {
  (void)a;
  gw_drain_t* d = context;
  d->conn->program_state = SIM_PROGRAM_NONE;  // offered again later
  pcp_sim_trace(d->sim, "gateway program failed on conn %llu",
                (unsigned long long)d->conn->id);
}

static void gw_on_task_result(void* context, pcp_proto_action_t* a) {
  gw_drain_t* d = context;
  pcp_sim_trace(d->sim, "gateway result task %llx",
                (unsigned long long)a->task_id);
  pcp_sim_runner_on_result(d->sim, a->task_id, &a->received);
}

static void gw_on_task_failed(void* context, pcp_proto_action_t* a) {
  gw_drain_t* d = context;
  pcp_sim_trace(d->sim, "gateway task %llx failed: %s",
                (unsigned long long)a->task_id,
                pcp_status_code_string(pcp_status_code(a->status)));
  pcp_sim_runner_on_failed(d->sim, a->task_id);
}

static void gw_on_task_lost(void* context, pcp_proto_action_t* a) {
  gw_drain_t* d = context;
  pcp_sim_trace(d->sim, "gateway task %llx lost",
                (unsigned long long)a->task_id);
  pcp_sim_runner_on_lost(d->sim, a->task_id);
}

static void gw_on_peer_draining(void* context, pcp_proto_action_t* a) {
  (void)a;
  gw_drain_t* d = context;
  pcp_status_ignore(pcp_sched_worker_drain(
      d->sim->sched, d->sim->workers[d->conn->worker].id));
}

static const pcp_fabric_action_handlers_t kGatewayHandlers = {
    .send = gw_on_send,
    .close = gw_on_close,
    .join_verified = gw_on_join,
    .evict = gw_on_evict,
    .program_fetch = gw_on_program_fetch,
    .program_ready = gw_on_program_ready,
    .program_failed = gw_on_program_failed,
    .task_progress = NULL,  // the fake compute reports none
    .task_result = gw_on_task_result,
    .task_failed = gw_on_task_failed,
    .task_lost = gw_on_task_lost,
    .peer_draining = gw_on_peer_draining,
};

void pcp_sim_gateway_actions_process(sim_t* sim, conn_t* conn) {
  if (!conn->gw)
    return;
  gw_drain_t drain = {.sim = sim, .conn = conn};
  if (pcp_fabric_conn_actions_drain(conn->gw, &conn->gw_draining,
                                    &kGatewayHandlers, &drain)) {
    pcp_sim_gateway_conn_ended(sim, conn);
  }
}

pcp_status_t pcp_sim_gateway_boot(sim_t* sim) {
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
  status = pcp_sim_runner_create(sim);
  if (status) {
    pcp_sched_release(sim->sched);
    sim->sched = NULL;
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
  pcp_sim_trace(sim, "gateway up (incarnation %u)", sim->gw_incarnation);
  pcp_sim_runner_recover(sim);
  sim->store_dirty = true;
  pcp_sim_check_store_events(sim);
  pcp_sim_check_acked_durable(sim, "after recovery");
  return pcp_ok_status();
}

// The gateway process dies: nothing it held in memory survives, and its
// sockets close (peers hear it after what is already on the wire).
void pcp_sim_gateway_crash(sim_t* sim) {
  for (size_t i = 0; i < sim->conn_count; ++i) {
    conn_t* conn = &sim->conns[i];
    if (!conn->gw)
      continue;
    if (conn->gw_open)
      pcp_sim_net_close_toward(sim, conn, false);
    pcp_proto_gateway_conn_release(conn->gw);
    conn->gw = NULL;
    conn->gw_open = false;
    conn->ended = true;
  }
  // The files as the killed process leaves them (committed transactions in
  // the WAL, no clean close), copied before the connection is closed.
  pcp_sim_runner_release(sim);
  char old_dir[600];
  pcp_status_t status =
      pcp_sim_state_dir_snapshot(sim, old_dir, sizeof(old_dir));
  pcp_sched_release(sim->sched);
  sim->sched = NULL;
  pcp_store_release(sim->store);
  sim->store = NULL;
  pcp_sim_state_dir_remove(old_dir);
  if (status)
    pcp_sim_fail_status(sim, status, "gateway crash snapshot");
  sim->gw_up = false;
  sim->inflight_count = 0;
  memset(sim->jobs, 0, sizeof(sim->jobs));
  pcp_sim_trace(sim, "gateway down");
}

void pcp_sim_gateway_tick(sim_t* sim) {
  sim->runner_wake = true;  // the scheduler's timer
  for (size_t i = 0; i < sim->conn_count && !sim->failed; ++i) {
    conn_t* conn = &sim->conns[i];
    if (!conn->gw_open)
      continue;
    pcp_status_t status = pcp_proto_gateway_conn_on_tick(conn->gw, sim->now_ns);
    if (status) {
      pcp_sim_fail_status(sim, status, "gateway tick");
      return;
    }
    pcp_sim_gateway_actions_process(sim, conn);
  }
  pcp_sched_event_t events[16];
  size_t count = 0;
  do {
    pcp_status_t status =
        pcp_sched_tick(sim->sched, sim->now_ns, events, 16, &count);
    if (status) {
      pcp_sim_fail_status(sim, status, "sched tick");
      return;
    }
    for (size_t i = 0; i < count; ++i)
      pcp_sim_runner_on_sched_event(sim, &events[i]);
  } while (count == 16);
}

void pcp_sim_gateway_submit(sim_t* sim, uint32_t j) {
  if (sim->job_submitted[j])
    return;
  if (!sim->gw_up) {
    pcp_sim_event_at(sim, sim->now_ns + 50 * SIM_MS, EV_SUBMIT, j, 0,
                     0);  // client retry
    return;
  }
  pcp_sim_runner_submit(sim, j);
}

void pcp_sim_gateway_cancel(sim_t* sim, uint32_t j) {
  if (!sim->gw_up || !sim->job_submitted[j])
    return;
  pcp_sim_runner_cancel(sim, j);
}

//===----------------------------------------------------------------------===//
// Workers
//===----------------------------------------------------------------------===//

bool pcp_sim_worker_current(sim_t* sim, uint32_t w, const conn_t* conn) {
  const sim_worker_t* worker = &sim->workers[w];
  return worker->alive && conn && worker->conn_id == conn->id && conn->wk_open;
}

void pcp_sim_worker_task_done(sim_t* sim, uint32_t w, uint64_t task_id) {
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
  // The result's SEND borrows |out| until it is flattened: the actions are
  // processed at the end of this function, while |out| is alive.
  uint8_t out[SIM_OUTPUT_BYTES];
  pcp_status_t status;
  if (PCP_BUGGIFY("sim.task_fail")) {
    pcp_status_t why =
        pcp_make_status(PCP_STATUS_INTERNAL, "buggify: compute failed");
    status =
        pcp_proto_worker_task_fail(worker->proto, task_id, why, sim->now_ns);
    pcp_status_ignore(why);  // borrowed by task_fail
  } else {
    pcp_sim_expected_output((uint32_t)((task_id >> 8) & 0xff),
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
    pcp_sim_fail_status(sim, status, "task complete");
    return;
  }
  pcp_sim_trace(sim, "w%u task %llx done", w, (unsigned long long)task_id);
  pcp_sim_worker_actions_process(sim, worker);
}

void pcp_sim_worker_actions_process(sim_t* sim, sim_worker_t* worker) {
  uint32_t w = (uint32_t)(worker - sim->workers);
  pcp_proto_action_t a;
  while (worker->proto && pcp_proto_worker_next_action(worker->proto, &a)) {
    conn_t* conn = pcp_sim_conn_get(sim, worker->conn_id);
    switch (a.type) {
      case PCP_PROTO_ACTION_SEND:
        if (conn)
          pcp_sim_net_send(sim, conn, true, &a.frame);
        break;
      case PCP_PROTO_ACTION_CLOSE:
        if (conn && conn->wk_open) {
          conn->wk_open = false;
          pcp_sim_net_close_toward(sim, conn, true);
        }
        break;
      case PCP_PROTO_ACTION_CONNECT: {
        if (sim->conn_count == PCP_SIM_MAX_CONNECTIONS) {
          pcp_sim_fail(sim, "connection table full");
          break;
        }
        conn_t* c = &sim->conns[sim->conn_count++];
        *c = (conn_t){.id = sim->conn_count,
                      .worker = w,
                      .worker_incarnation = worker->incarnation};
        worker->conn_id = c->id;
        pcp_sim_event_at(sim, sim->now_ns + pcp_sim_net_delay_ns(sim),
                         EV_CONNECT_DONE, w, worker->incarnation, c->id);
        break;
      }
      case PCP_PROTO_ACTION_RUN_TASK: {
        size_t slot = SIM_WORKER_TASKS_MAX;
        for (size_t i = 0; i < SIM_WORKER_TASKS_MAX; ++i) {
          if (!worker->tasks[i].live)
            slot = i;
        }
        if (slot == SIM_WORKER_TASKS_MAX) {
          pcp_sim_fail(sim, "w%u: fake compute full", w);
          break;
        }
        if (!worker->has_program) {
          pcp_sim_fail(sim, "w%u runs task %llx without its program", w,
                       (unsigned long long)a.task_id);
          break;
        }
        worker->tasks[slot] = (wtask_t){.task_id = a.task_id, .live = true};
        pcp_sim_event_at(
            sim,
            sim->now_ns + pcp_sim_rand_range_ns(sim, 5 * SIM_MS, 80 * SIM_MS),
            EV_TASK_DONE, w, worker->incarnation, a.task_id);
        pcp_sim_trace(sim, "w%u run task %llx", w,
                      (unsigned long long)a.task_id);
        break;
      }
      case PCP_PROTO_ACTION_CANCEL_TASK:
        for (size_t i = 0; i < SIM_WORKER_TASKS_MAX; ++i) {
          if (worker->tasks[i].live && worker->tasks[i].task_id == a.task_id) {
            worker->tasks[i].live = false;
            // Answers a gateway's cancel; after a close there is no one to
            // answer (NOT_FOUND).
            pcp_status_t why =
                pcp_make_status(PCP_STATUS_CANCELLED, "cancelled");
            pcp_status_ignore(pcp_proto_worker_task_fail(
                worker->proto, a.task_id, why, sim->now_ns));
            pcp_status_ignore(why);  // borrowed by task_fail
            pcp_sim_trace(sim, "w%u cancel task %llx", w,
                          (unsigned long long)a.task_id);
          }
        }
        break;
      case PCP_PROTO_ACTION_PROGRAM_LOOKUP:
        pcp_status_ignore(pcp_proto_worker_program_lookup_done(
            worker->proto, a.request_id, worker->has_program, sim->now_ns));
        break;
      case PCP_PROTO_ACTION_PROGRAM_STORE: {
        if (a.blob_length != SIM_PROGRAM_BYTES ||
            memcmp(a.blob, sim->program, SIM_PROGRAM_BYTES) != 0) {
          pcp_sim_fail(sim, "w%u: the program arrived corrupted", w);
          break;
        }
        pcp_status_t stored = pcp_ok_status();
        if (PCP_BUGGIFY("sim.program_store_fail")) {
          stored =
              pcp_make_status(PCP_STATUS_UNAVAILABLE, "buggify: disk full");
        } else {
          worker->has_program = true;
        }
        pcp_sim_trace(sim, "w%u program stored: %d", w, stored == NULL);
        // |stored| is consumed.
        pcp_status_ignore(pcp_proto_worker_program_stored(
            worker->proto, a.request_id, stored, sim->now_ns));
        break;
      }
      case PCP_PROTO_ACTION_ACCEPTED:
        pcp_sim_trace(sim, "w%u accepted epoch %llu resumed %d", w,
                      (unsigned long long)a.lease_epoch, (int)a.resumed);
        // Lease epochs only grow under one gateway; a resumed session
        // keeps its epoch, a new one gets a higher one.
        if (conn &&
            worker->accepted_gw_incarnation == conn->gateway_incarnation &&
            (a.resumed ? a.lease_epoch != worker->accepted_epoch
                       : a.lease_epoch <= worker->accepted_epoch)) {
          pcp_sim_fail(sim, "w%u: lease epoch %llu after %llu (resumed %d)", w,
                       (unsigned long long)a.lease_epoch,
                       (unsigned long long)worker->accepted_epoch,
                       (int)a.resumed);
        }
        worker->accepted_epoch = a.lease_epoch;
        worker->accepted_gw_incarnation = conn ? conn->gateway_incarnation : 0;
        break;
      case PCP_PROTO_ACTION_REJECTED:
        pcp_sim_trace(sim, "w%u rejected reason %u", w, a.reject_reason);
        break;
      default:
        break;
    }
    pcp_proto_action_deinitialize(&a);
  }
}

pcp_status_t pcp_sim_worker_boot(sim_t* sim, uint32_t w) {
  sim_worker_t* worker = &sim->workers[w];
  worker->incarnation++;
  pcp_rng_initialize(pcp_rng_next_u64(&sim->rng), &worker->rng);
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_worker_create(
      &worker->config, &worker->rng, sim->allocator, &worker->proto));
  worker->alive = true;
  worker->conn_id = 0;
  memset(worker->tasks, 0, sizeof(worker->tasks));
  pcp_sim_trace(sim, "w%u boot (incarnation %u)", w, worker->incarnation);
  pcp_status_t status = pcp_proto_worker_start(worker->proto, sim->now_ns);
  if (status)
    return status;
  pcp_sim_worker_actions_process(sim, worker);
  pcp_sim_event_at(sim, sim->now_ns + sim->timeouts.tick_interval_ns,
                   EV_WORKER_TICK, w, worker->incarnation, 0);
  return pcp_ok_status();
}

void pcp_sim_worker_crash(sim_t* sim, uint32_t w, int64_t downtime_ns) {
  sim_worker_t* worker = &sim->workers[w];
  if (!worker->alive)
    return;
  conn_t* conn = pcp_sim_conn_get(sim, worker->conn_id);
  if (conn && conn->wk_open) {
    conn->wk_open = false;
    pcp_sim_net_close_toward(sim, conn, true);
  }
  pcp_proto_worker_release(worker->proto);
  worker->proto = NULL;
  worker->alive = false;
  sim->result->worker_crashes++;
  pcp_sim_trace(sim, "w%u crash (down %.3f ms)", w,
                (double)downtime_ns / SIM_MS);
  pcp_sim_event_at(sim, sim->now_ns + downtime_ns, EV_WORKER_BOOT, w, 0, 0);
}

// Both ends see a reset: the worker at once, the gateway after what is on
// the wire toward it.
void pcp_sim_conn_reset(sim_t* sim, conn_t* conn, const char* why) {
  if (!conn->wk_open)
    return;
  pcp_sim_trace(sim, "conn %llu reset (%s)", (unsigned long long)conn->id, why);
  conn->wk_open = false;
  pcp_sim_net_close_toward(sim, conn, true);
  sim_worker_t* worker = &sim->workers[conn->worker];
  if (worker->alive && worker->conn_id == conn->id) {
    pcp_status_t status =
        pcp_proto_worker_on_closed(worker->proto, sim->now_ns);
    if (status) {
      pcp_sim_fail_status(sim, status, "worker on_closed");
      return;
    }
    pcp_sim_worker_actions_process(sim, worker);
  }
}

void pcp_sim_gateway_program_offer(sim_t* sim, conn_t* conn) {
  pcp_proto_program_offer_t offer = {
      .byte_length = SIM_PROGRAM_BYTES, .backend = "cpu", .target = "host"};
  memcpy(offer.program, sim->program_sha.bytes, sizeof(offer.program));
  uint64_t request_id = 0;
  pcp_status_t status = pcp_proto_gateway_conn_offer_program(
      conn->gw, &offer, sim->now_ns, &request_id);
  if (status) {
    pcp_status_ignore(status);
    return;
  }
  conn->program_state = SIM_PROGRAM_OFFERED;
  pcp_sim_trace(sim, "gateway offers the program on conn %llu",
                (unsigned long long)conn->id);
  pcp_sim_gateway_actions_process(sim, conn);
}
