// SPDX-License-Identifier: Apache-2.0
//
// The simulation's checkers (docs/simulation.md "Invariants"). They read the
// store's event log and the scheduler, never the runner's memory, so a
// runner that lies to itself is still caught.

#include "sim/sim_impl.h"

//===----------------------------------------------------------------------===//
// Checkers
//===----------------------------------------------------------------------===//

uint32_t pcp_sim_job_index_parse(const char* id) {
  unsigned j = 0;
  if (sscanf(id, "job-%u", &j) != 1 || j >= PCP_SIM_MAX_JOBS) {
    return UINT32_MAX;
  }
  return j;
}

// The bytes a task of |job| at |step| returns: a function of the two, so a
// result is right or wrong on its own, whatever ran it and how often.
void pcp_sim_expected_output(uint32_t job, int64_t step,
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
void pcp_sim_check_store_events(sim_t* sim) {
  if (!sim->gw_up || !sim->store_dirty || sim->failed)
    return;
  sim->store_dirty = false;
  for (;;) {
    pcp_store_job_event_list_t list = {0};
    pcp_status_t status = pcp_store_job_event_list(
        sim->store, sim->last_event_id, NULL, PCP_STORE_LIST_LIMIT_MAX, &list);
    if (status) {
      pcp_sim_fail_status(sim, status, "event list");
      return;
    }
    for (size_t i = 0; i < list.count && !sim->failed; ++i) {
      const pcp_store_job_event_t* e = &list.items[i];
      if (e->event_id <= sim->last_event_id) {
        pcp_sim_fail(sim, "event ids not increasing: %lld after %lld",
                     (long long)e->event_id, (long long)sim->last_event_id);
        break;
      }
      sim->last_event_id = e->event_id;
      uint32_t j = pcp_sim_job_index_parse(e->job_id);
      if (j == UINT32_MAX) {
        pcp_sim_fail(sim, "event of unknown job %s", e->job_id);
        break;
      }
      model_job_t* m = &sim->model[j];
      if (strcmp(e->type, "state") == 0) {
        if (!e->has_from_state) {
          if (m->exists)
            pcp_sim_fail(sim, "%s created twice", e->job_id);
          m->exists = true;
          m->state = e->to_state;
          m->last_step = -1;
        } else if (!m->exists || m->state != e->from_state) {
          pcp_sim_fail(
              sim, "%s: transition from %s but the job was %s", e->job_id,
              pcp_store_job_state_name(e->from_state),
              m->exists ? pcp_store_job_state_name(m->state) : "absent");
        } else if (!pcp_store_job_transition_is_allowed(e->from_state,
                                                        e->to_state)) {
          pcp_sim_fail(sim, "%s: illegal transition %s -> %s", e->job_id,
                       pcp_store_job_state_name(e->from_state),
                       pcp_store_job_state_name(e->to_state));
        } else {
          m->state = e->to_state;
        }
      } else if (strcmp(e->type, "step") == 0) {
        json_t* step = json_object_get(e->payload, "step");
        int64_t s = json_is_integer(step) ? json_integer_value(step) : -1;
        if (s <= m->last_step) {
          pcp_sim_fail(sim,
                       "%s: step %lld after step %lld (versions must grow)",
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
void pcp_sim_check_acked_durable(sim_t* sim, const char* when) {
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
      pcp_sim_fail(sim, "%s: acknowledged result of %s not durable", when, id);
  }
}

static void check_leases(sim_t* sim) {
  uint64_t ids[256];
  size_t count = 0;
  pcp_status_t status = pcp_sched_owner_leases_list(
      sim->sched, PCP_SCHED_OWNER_JOBS, ids, 256, &count);
  if (status) {
    pcp_sim_fail_status(sim, status, "lease list");
    return;
  }
  uint32_t per_job[PCP_SIM_MAX_JOBS] = {0};
  for (size_t i = 0; i < count; ++i) {
    pcp_sched_lease_status_t lease;
    status = pcp_sched_lease_query(sim->sched, ids[i], &lease);
    if (status) {
      pcp_sim_fail_status(sim, status, "lease query");
      return;
    }
    if (lease.tag == 0 || lease.tag > sim->options.job_count) {
      pcp_sim_fail(sim, "lease %llu has tag %llu", (unsigned long long)ids[i],
                   (unsigned long long)lease.tag);
      return;
    }
    if (++per_job[lease.tag - 1] > 1) {
      pcp_sim_fail(sim, "job-%llu holds two leases at once (running twice)",
                   (unsigned long long)(lease.tag - 1));
      return;
    }
  }
}

void pcp_sim_check_after_event(sim_t* sim) {
  if (sim->failed)
    return;
  uint32_t tasks[PCP_SIM_MAX_JOBS] = {0};
  for (size_t i = 0; i < sim->inflight_count; ++i) {
    if (++tasks[sim->inflight[i].job] > 1) {
      pcp_sim_fail(sim, "job-%u has two tasks in flight (running twice)",
                   sim->inflight[i].job);
      return;
    }
  }
  if (!sim->gw_up)
    return;
  pcp_status_t status = pcp_sched_check_invariants(sim->sched);
  if (status) {
    pcp_sim_fail_status(sim, status, "sched invariants");
    return;
  }
  check_leases(sim);
  pcp_sim_check_store_events(sim);
  // No job lost: a job the store says is unfinished is one the runner is
  // working on, in the state the store has.
  for (uint32_t j = 0; j < sim->options.job_count && !sim->failed; ++j) {
    const model_job_t* m = &sim->model[j];
    if (!m->exists || pcp_store_job_state_is_terminal(m->state))
      continue;
    if (!sim->jobs[j].tracked) {
      // Queued and not started: the runner's next round starts it.
      // Ended by its run, the store write of the end still to come: the
      // runner retries it each round (liveness bounds it). Caught by a
      // crash while its recovery write failed (BUGGIFY at boot): every
      // round runs the recovery pass again (liveness bounds it too; seeds
      // 9905, 12495, 15121 and 21342 of `tools/sim.sh --seeds 20000 --first
      // 2001` failed here before this case).
      if (m->state == PCP_STORE_JOB_STATE_QUEUED || sim->jobs[j].ending ||
          pcp_workloads_runner_recovery_pending(sim->runner))
        continue;
      pcp_sim_fail(sim, "job-%u is %s in the store but the runner lost it", j,
                   pcp_store_job_state_name(m->state));
    } else if (sim->jobs[j].state != m->state) {
      pcp_sim_fail(sim, "job-%u: runner thinks %s, store says %s", j,
                   pcp_store_job_state_name(sim->jobs[j].state),
                   pcp_store_job_state_name(m->state));
    }
  }
}
