// SPDX-License-Identifier: Apache-2.0
//
// sim_runner: the simulated gateway's jobs run on the real workload runner
// (src/workloads/runtime/runner.c) through the "sim" kind defined here.
// Every state change goes through pcp_workloads_runner_transition, every
// start through pcp_workloads_runner_step, every end through the runner's
// job_finish, recovery after a gateway restart through
// pcp_workloads_runner_recover and cancels through
// pcp_workloads_runner_job_cancel.
//
// No thread: the runner gets the simulation's executor, which records the
// started job's work item (fn, arg) instead of running it. The kind's work
// (lease, placement, tasks on workers, results) is asynchronous, so the
// simulation drives it from its event loop (sim_runner_job_step, in virtual
// time) while the job runs in the runner, and calls the work item once the
// outcome is known: the kind's run then returns that outcome at once and the
// runner records it (docs/simulation.md).

#include "sim/sim_impl.h"

typedef enum sim_run_result_e {
  SIM_RUN_PENDING = 0,
  SIM_RUN_OK = 1,
  SIM_RUN_FAILED = 2,
  SIM_RUN_CANCELLED = 3,
} sim_run_result_t;

//===----------------------------------------------------------------------===//
// sim_runner: the "sim" kind on the real runner
//===----------------------------------------------------------------------===//

void pcp_sim_job_id_format(uint32_t j, char id[32]) {
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

// One transition through the runner's transition function; the mirror
// state moves only when it committed.
bool pcp_sim_runner_transition(sim_t* sim, uint32_t j, pcp_store_job_state_t to,
                               const json_t* placement) {
  char id[32];
  pcp_sim_job_id_format(j, id);
  pcp_store_job_transition_params_t params = {.placement = placement};
  pcp_status_t status =
      pcp_workloads_runner_transition(sim->runner, id, to, &params);
  sim->store_dirty = true;
  if (status) {
    char text[160];
    pcp_status_format(status, text, sizeof(text));
    pcp_status_ignore(status);
    pcp_sim_trace(sim, "runner %s -> %s failed: %s", id,
                  pcp_store_job_state_name(to), text);
    return false;
  }
  pcp_sim_trace(sim, "runner %s %s -> %s", id,
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
  pcp_sim_trace(sim, "runner job-%u release lease %llu", j,
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
  conn_t* conn = pcp_sim_conn_get(sim, sim->gw_workers[w].conn_id);
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

bool pcp_sim_runner_task_assign(sim_t* sim, conn_t* conn, uint32_t j,
                                int64_t step, uint64_t* out_task_id) {
  // The task id names the job and step, so the fake compute needs no input
  // tensors: (sequence << 16) | (job << 8) | step.
  uint64_t task_id =
      (++sim->next_task_seq << 16) | ((uint64_t)j << 8) | (uint64_t)step;
  char session[32];
  pcp_sim_job_id_format(j, session);
  pcp_proto_task_assign_t task = {
      .task_id = task_id, .session_id = session, .function = "sim_step"};
  memcpy(task.program, sim->program_sha.bytes, sizeof(task.program));
  uint64_t request_id = 0;
  pcp_status_t status = pcp_proto_gateway_conn_assign_task(
      conn->gw, &task, NULL, 0, sim->now_ns, &request_id);
  if (status) {
    char text[160];
    pcp_status_format(status, text, sizeof(text));
    pcp_status_ignore(status);
    pcp_sim_trace(sim, "runner assign job-%u failed: %s", j, text);
    return false;
  }
  if (sim->inflight_count == SIM_INFLIGHT_MAX) {
    pcp_sim_fail(sim, "in-flight table full");
    return false;
  }
  sim->inflight[sim->inflight_count++] =
      (inflight_t){.task_id = task_id, .job = j, .conn_id = conn->id};
  sim->gw_workers[conn->worker].last_job = (int32_t)j;
  pcp_sim_trace(sim,
                "runner assign job-%u step %lld task %llx to w%u conn %llu", j,
                (long long)step, (unsigned long long)task_id, conn->worker,
                (unsigned long long)conn->id);
  *out_task_id = task_id;
  return true;
}

static void sim_runner_ack(sim_t* sim, uint32_t j,
                           const sim_runner_job_t* job) {
  model_job_t* m = &sim->model[j];
  uint8_t expected[SIM_OUTPUT_BYTES];
  pcp_sim_expected_output(j, (int64_t)job->steps - 1, expected);
  pcp_sha256_t sha;
  pcp_sha256_compute(expected, sizeof(expected), &sha);
  if (memcmp(sha.bytes, job->result_sha.bytes, sizeof(sha.bytes)) != 0) {
    pcp_sim_fail(sim, "job-%u acknowledged a wrong result", j);
  }
  if (m->acked)
    pcp_sim_fail(sim, "job-%u acknowledged twice", j);
  m->acked = true;
  m->acked_sha = job->result_sha;
  pcp_sim_trace(sim, "runner job-%u succeeded (acknowledged)", j);
}

// True once the store has job |j| in a terminal state; a success is then
// acknowledged (the checkers hold it durable from here on).
static bool sim_runner_end_seen(sim_t* sim, uint32_t j,
                                const sim_runner_job_t* ended) {
  char id[32];
  pcp_sim_job_id_format(j, id);
  pcp_store_job_t row;
  pcp_status_t status = pcp_store_job_get(sim->store, id, &row);
  if (status) {
    pcp_status_ignore(status);
    return false;
  }
  pcp_store_job_state_t state = row.state;
  pcp_store_job_deinitialize(&row);
  if (!pcp_store_job_state_is_terminal(state))
    return false;
  if (ended->run_result == SIM_RUN_OK &&
      state == PCP_STORE_JOB_STATE_SUCCEEDED) {
    sim_runner_ack(sim, j, ended);
  }
  return true;
}

// The job's outcome is known: its lease goes back (unless the seeded bug
// forgets it on a cancel) and its work item runs, so the kind's run returns
// |result| and the runner records the job's end (job_finish).
static void sim_runner_job_finish(sim_t* sim, uint32_t j,
                                  sim_run_result_t result) {
  sim_runner_job_t* job = &sim->jobs[j];
  if (result == SIM_RUN_CANCELLED &&
      SIM_BUG(sim, PCP_SIM_BUG_CANCEL_LEAKS_LEASE)) {
    job->lease_id = 0;  // forgotten, never released
  }
  sim_runner_lease_release(sim, j);
  job->run_result = result;
  void (*fn)(void*) = job->work_fn;
  void* arg = job->work_arg;
  pcp_sim_trace(sim, "runner job-%u run returns %s", j,
                result == SIM_RUN_OK       ? "ok"
                : result == SIM_RUN_FAILED ? "failed"
                                           : "cancelled");
  sim_runner_job_t ended = *job;
  fn(arg);
  sim->store_dirty = true;
  // The runner no longer runs the job.
  *job = (sim_runner_job_t){0};
  if (!sim_runner_end_seen(sim, j, &ended)) {
    // The store failed the end's write: the runner writes it again.
    *job = (sim_runner_job_t){.ending = true,
                              .steps = ended.steps,
                              .run_result = ended.run_result,
                              .result_sha = ended.result_sha};
    pcp_sim_trace(sim, "runner job-%u end not recorded yet", j);
  }
}

// Moves job |j| as far as it can go now. Every store write may fail
// (buggify); the job then stays where it is and the next step retries.
static void sim_runner_job_step(sim_t* sim, uint32_t j) {
  sim_runner_job_t* job = &sim->jobs[j];
  for (int round = 0; round < 8 && !sim->failed; ++round) {
    if (job->run_result == SIM_RUN_FAILED && !job->task_id) {
      sim_runner_job_finish(sim, j, SIM_RUN_FAILED);
      return;
    }
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
            placement && pcp_sim_runner_transition(
                             sim, j, PCP_STORE_JOB_STATE_PLACING, placement);
        json_decref(placement);
        if (!ok)
          sim_runner_lease_release(sim, j);
        break;
      }
      case PCP_STORE_JOB_STATE_PLACING:
        pcp_sim_runner_transition(sim, j,
                                  job->lease_id ? PCP_STORE_JOB_STATE_COMPILING
                                                : PCP_STORE_JOB_STATE_QUEUED,
                                  NULL);
        break;
      case PCP_STORE_JOB_STATE_COMPILING:
        pcp_sim_runner_transition(sim, j,
                                  job->lease_id ? PCP_STORE_JOB_STATE_RUNNING
                                                : PCP_STORE_JOB_STATE_QUEUED,
                                  NULL);
        break;
      case PCP_STORE_JOB_STATE_RUNNING: {
        if (job->result_stored && !job->task_id) {
          sim_runner_job_finish(sim, j, SIM_RUN_OK);
          return;
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
          pcp_sim_runner_transition(sim, j, PCP_STORE_JOB_STATE_QUEUED, NULL);
          break;
        }
        if (conn->program_state != SIM_PROGRAM_READY) {
          // A task names a program the worker must hold first (fabric's
          // rule): offer it once per connection and wait for the ACK.
          if (conn->program_state == SIM_PROGRAM_NONE) {
            pcp_sim_gateway_program_offer(sim, conn);
          }
          return;
        }
        int64_t step = job->last_committed_step + 1;
        if (step >= (int64_t)job->steps)
          step = (int64_t)job->steps - 1;
        if (pcp_sim_runner_task_assign(sim, conn, j, step, &job->task_id)) {
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
          conn_t* conn = pcp_sim_conn_get(sim, job->task_conn);
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
            pcp_sim_trace(sim, "runner cancel job-%u task %llx", j,
                          (unsigned long long)job->task_id);
            return;
          }
          break;
        }
        // No task left: the run returns and the runner ends it cancelled.
        sim_runner_job_finish(sim, j, SIM_RUN_CANCELLED);
        return;
      }
      default:
        // Cancelled while still queued (the runner's cancel ended it): the
        // run returns at once.
        sim_runner_job_finish(sim, j, SIM_RUN_CANCELLED);
        return;
    }
    if (job->state == before && job->task_id == task_before)
      return;
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

void pcp_sim_runner_on_result(sim_t* sim, uint64_t task_id,
                              pcp_proto_frame_t* frame) {
  inflight_remove(sim, task_id);
  uint32_t j = 0;
  sim_runner_job_t* job = job_of_task(sim, task_id, &j);
  if (!job) {
    pcp_sim_trace(sim, "runner stale result task %llx dropped",
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
    pcp_sim_fail(sim, "job-%u: malformed result", j);
    return;
  }
  const pcp_proto_section_t* section =
      &frame->sections[result.outputs[0].section];
  uint8_t expected[SIM_OUTPUT_BYTES];
  pcp_sim_expected_output(j, job->task_step, expected);
  if (section->byte_length != SIM_OUTPUT_BYTES ||
      memcmp(section->data, expected, SIM_OUTPUT_BYTES) != 0) {
    pcp_sim_fail(sim, "job-%u step %lld: wrong output bytes", j,
                 (long long)job->task_step);
    return;
  }
  char id[32];
  pcp_sim_job_id_format(j, id);
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
        pcp_sim_fail(sim, "%s: stored result differs from the new one", id);
        return;
      }
    }
    if (status) {
      pcp_status_ignore(status);
      pcp_sim_trace(sim, "runner %s result put failed", id);
      return;  // the step runs again
    }
    job->result_sha = row.sha256;
  }
  if (job->task_step > job->last_committed_step) {
    status = pcp_store_job_step_commit(sim->store, id, job->task_step, NULL);
    sim->store_dirty = true;
    if (status) {
      pcp_status_ignore(status);
      pcp_sim_trace(sim, "runner %s step %lld commit failed", id,
                    (long long)job->task_step);
      return;  // the step runs again
    }
    job->last_committed_step = job->task_step;
    pcp_sim_trace(sim, "runner %s step %lld committed", id,
                  (long long)job->task_step);
  }
  if (last)
    job->result_stored = true;
}

void pcp_sim_runner_on_failed(sim_t* sim, uint64_t task_id) {
  inflight_remove(sim, task_id);
  uint32_t j = 0;
  sim_runner_job_t* job = job_of_task(sim, task_id, &j);
  if (!job)
    return;
  job->task_id = 0;
  if (job->state != PCP_STORE_JOB_STATE_RUNNING)
    return;
  if (++job->task_failures >= SIM_TASK_FAILURES_MAX) {
    job->run_result = SIM_RUN_FAILED;  // the next step ends the run
  }
}

void pcp_sim_runner_on_lost(sim_t* sim, uint64_t task_id) {
  inflight_remove(sim, task_id);
  uint32_t j = 0;
  sim_runner_job_t* job = job_of_task(sim, task_id, &j);
  if (!job)
    return;
  job->task_id = 0;
  if (!sim->keep_detached_leases)
    sim_runner_lease_release(sim, j);
}

void pcp_sim_runner_on_sched_event(sim_t* sim, const pcp_sched_event_t* event) {
  if (event->kind == PCP_SCHED_EVENT_NONE)
    return;
  pcp_sim_trace(sim, "sched %s lease %llu tag %llu worker %s",
                pcp_sched_event_kind_name(event->kind),
                (unsigned long long)event->lease_id,
                (unsigned long long)event->tag, event->worker_id.value);
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

//===----------------------------------------------------------------------===//
// The kind, the executor and the runner's life
//===----------------------------------------------------------------------===//

// The runner started a job: its work item waits here until the simulation
// knows the job's outcome (sim_runner_job_finish). The job resumes from the
// store: its committed steps and its stored result.
static pcp_status_t sim_executor_submit(void* self, void (*fn)(void* arg),
                                        void* arg) {
  sim_t* sim = self;
  const char* id = pcp_workloads_job_id((const pcp_workloads_job_t*)arg);
  uint32_t j = pcp_sim_job_index_parse(id);
  if (j == UINT32_MAX || sim->jobs[j].tracked) {
    return pcp_make_status(PCP_STATUS_INTERNAL, "sim: bad job start %s", id);
  }
  pcp_store_job_t row;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_get(sim->store, id, &row));
  json_t* steps = json_object_get(row.spec, "steps");
  sim_runner_job_t* job = &sim->jobs[j];
  *job = (sim_runner_job_t){
      .tracked = true,
      .state = row.state,
      .steps = json_is_integer(steps) ? (uint32_t)json_integer_value(steps) : 1,
      .last_committed_step = row.last_committed_step,
      .work_fn = fn,
      .work_arg = arg};
  pcp_store_job_deinitialize(&row);
  // The result row is written before the last step commits.
  if (job->last_committed_step >= (int64_t)job->steps - 1) {
    pcp_store_job_result_t result;
    pcp_status_t status =
        pcp_store_job_result_get(sim->store, id, "out", &result);
    if (!status) {
      job->result_stored = true;
      job->result_sha = result.sha256;
    }
    pcp_status_ignore(status);
  }
  pcp_sim_trace(sim, "runner start %s in %s step %lld", id,
                pcp_store_job_state_name(job->state),
                (long long)job->last_committed_step);
  return pcp_ok_status();
}

// Called from the work item once the outcome is known: returns it.
static pcp_status_t sim_kind_run(void* self, pcp_workloads_job_t* rjob) {
  sim_t* sim = self;
  uint32_t j = pcp_sim_job_index_parse(pcp_workloads_job_id(rjob));
  switch (j == UINT32_MAX ? SIM_RUN_PENDING : sim->jobs[j].run_result) {
    case SIM_RUN_OK:
      return pcp_ok_status();
    case SIM_RUN_FAILED:
      return pcp_make_status(PCP_STATUS_INTERNAL, "task failed %u times",
                             SIM_TASK_FAILURES_MAX);
    case SIM_RUN_CANCELLED:
      return pcp_make_status(PCP_STATUS_CANCELLED, "cancelled");
    default:
      return pcp_make_status(PCP_STATUS_INTERNAL, "sim: run without outcome");
  }
}

// A cancel reached a started job: the job step sends the task's cancel
// (state cancelling). Nothing to do while the gateway dies.
static void sim_kind_cancel(void* self, pcp_workloads_job_t* rjob) {
  sim_t* sim = self;
  if (sim->runner_releasing)
    return;
  pcp_sim_trace(sim, "runner cancel request %s", pcp_workloads_job_id(rjob));
}

#if defined(PCP_SIM_SEEDED_BUGS)
// The runner's default recovery, except with the seeded bug: a running job
// is left running although no run holds it any more.
static pcp_store_job_state_t sim_kind_recover(void* self,
                                              const pcp_store_job_t* job,
                                              const char** out_error) {
  sim_t* sim = self;
  if (job->state == PCP_STORE_JOB_STATE_CANCELLING)
    return PCP_STORE_JOB_STATE_CANCELLED;
  if (SIM_BUG(sim, PCP_SIM_BUG_RECOVERY_DROPS_RUNNING) &&
      job->state == PCP_STORE_JOB_STATE_RUNNING) {
    return PCP_STORE_JOB_STATE_RUNNING;
  }
  *out_error = "re-run after a gateway restart";
  return PCP_STORE_JOB_STATE_QUEUED;
}
#endif

static void sim_runner_changed(void* user_data, const char* job_id) {
  (void)job_id;
  ((sim_t*)user_data)->runner_wake = true;
}

pcp_status_t pcp_sim_runner_create(sim_t* sim) {
  pcp_workloads_kind_t kind = {.name = "sim",
                               .max_running = PCP_SIM_MAX_JOBS,
                               .self = sim,
                               .run = sim_kind_run,
                               .cancel = sim_kind_cancel};
#if defined(PCP_SIM_SEEDED_BUGS)
  kind.recover = sim_kind_recover;
#endif
  pcp_workloads_runner_options_t options = {
      .store = sim->store,
      .clock = pcp_clock_manual(&sim->clock_state),
      .kinds = &kind,
      .kind_count = 1,
      .executor = {.self = sim, .submit = sim_executor_submit},
      .hooks = {.changed = sim_runner_changed, .user_data = sim}};
  sim->runner_wake = true;
  return pcp_workloads_runner_create(&options, sim->allocator, &sim->runner);
}

// The gateway process dies (or the run ends): the runner and what it held
// are gone; the work items of started jobs never run.
void pcp_sim_runner_release(sim_t* sim) {
  sim->runner_releasing = true;
  pcp_workloads_runner_release(sim->runner);
  sim->runner = NULL;
  sim->runner_releasing = false;
  memset(sim->jobs, 0, sizeof(sim->jobs));
}

// Drives every started job as far as it can go, then one scheduling round
// of the runner; jobs it started are driven in the next pass.
void pcp_sim_runner_step(sim_t* sim) {
  if (!sim->gw_up || !sim->runner)
    return;
  for (int pass = 0; pass < 4 && !sim->failed; ++pass) {
    for (uint32_t j = 0; j < sim->options.job_count && !sim->failed; ++j) {
      if (sim->jobs[j].tracked)
        sim_runner_job_step(sim, j);
    }
    if (sim->failed || !sim->runner_wake)
      return;
    // As the gateway's scheduler thread: a round when woken (the runner's
    // changed hook: a submit, a cancel, any transition) or at a tick.
    sim->runner_wake = false;
    uint32_t started = 0;
    pcp_status_t status = pcp_workloads_runner_step(sim->runner, &started);
    sim->store_dirty = true;
    if (status) {
      pcp_sim_fail_status(sim, status, "runner step");
      return;
    }
    for (uint32_t j = 0; j < sim->options.job_count && !sim->failed; ++j) {
      if (sim->jobs[j].ending && sim_runner_end_seen(sim, j, &sim->jobs[j]))
        sim->jobs[j] = (sim_runner_job_t){0};
    }
    if (!started)
      break;
  }
}

// Recovery after a gateway (re)start: the runner's own.
void pcp_sim_runner_recover(sim_t* sim) {
  memset(sim->jobs, 0, sizeof(sim->jobs));
  pcp_status_t status = pcp_workloads_runner_recover(sim->runner);
  sim->store_dirty = true;
  if (status)
    pcp_sim_fail_status(sim, status, "recovery");
}

void pcp_sim_runner_submit(sim_t* sim, uint32_t j) {
  char id[32];
  pcp_sim_job_id_format(j, id);
  json_t* spec = json_pack("{s:i}", "steps", (json_int_t)sim->job_steps[j]);
  pcp_status_t status =
      spec ? pcp_workloads_runner_job_submit(sim->runner, id, "sim", spec, NULL,
                                             NULL, NULL)
           : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "spec");
  json_decref(spec);
  sim->store_dirty = true;
  if (status) {
    pcp_sim_fail_status(sim, status, "job create");
    return;
  }
  sim->job_submitted[j] = true;
  pcp_sim_trace(sim, "submit %s steps %u", id, sim->job_steps[j]);
}

void pcp_sim_runner_cancel(sim_t* sim, uint32_t j) {
  char id[32];
  pcp_sim_job_id_format(j, id);
  pcp_store_job_state_t state = PCP_STORE_JOB_STATE_QUEUED;
  bool changed = false;
  pcp_status_t status =
      pcp_workloads_runner_job_cancel(sim->runner, id, &state, &changed);
  sim->store_dirty = true;
  if (status) {
    char text[160];
    pcp_status_format(status, text, sizeof(text));
    pcp_status_ignore(status);
    pcp_sim_trace(sim, "cancel %s failed: %s", id, text);
    return;
  }
  pcp_sim_trace(sim, "cancel %s: %s%s", id, pcp_store_job_state_name(state),
                changed ? "" : " (unchanged)");
  if (sim->jobs[j].tracked)
    sim->jobs[j].state = state;
}
