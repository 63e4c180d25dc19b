// SPDX-License-Identifier: Apache-2.0
//
// State-space exploration of the protocol stubs (reference s.3.2, the
// scheduling and decoupled explorers): every short schedule, or seeded
// random ones, over a fixed action alphabet, recording which decisions and
// violations the model can reach. Exploration is what turns the bounded
// models into evidence: a decision the task expects but no schedule reaches,
// or a violation a schedule does reach, shows up here.

#include <string.h>

#include "topology/protocols_impl.h"
#include "topology/trace_impl.h"

//===----------------------------------------------------------------------===//
// Scheduler
//===----------------------------------------------------------------------===//

// Eleven scenarios, each a short script on the scheduler; exploration runs
// them back to back. Job ids are per scenario so that two scenarios in a
// row do not collide unless they mean to.
static void sched_scenario(pcp_topology_sched_t* s, uint32_t scenario,
                           uint32_t salt) {
  uint32_t job = 100 + scenario * 10 + salt;
  const uint32_t training = PCP_TOPOLOGY_SCHED_OWNER_TRAINING;
  switch (scenario) {
    case 0:  // reserve and commit
      if (pcp_topology_sched_reserve(s, job, training, 1) >= 0) {
        pcp_topology_sched_commit(s, job);
      }
      break;
    case 1:  // reserve and queue ahead
      if (pcp_topology_sched_reserve(s, job, training, 1) >= 0) {
        pcp_topology_sched_commit_to_queue(s, job);
      }
      break;
    case 2:  // a normal job starts
      pcp_topology_sched_enqueue(s, job, training, 1);
      (void)pcp_topology_sched_start_next(s);
      break;
    case 3:  // a normal job runs to completion
      pcp_topology_sched_enqueue(s, job, training, 1);
      if (pcp_topology_sched_start_next(s) == job) {
        pcp_topology_sched_complete(s, job);
      }
      break;
    case 4:  // reserve and release
      if (pcp_topology_sched_reserve(s, job, training, 1) >= 0) {
        pcp_topology_sched_release(s, job);
      }
      break;
    case 5:  // reserve and expire
      if (pcp_topology_sched_reserve(s, job, training, 1) >= 0) {
        pcp_topology_sched_expire(s, job);
      }
      break;
    case 6:  // reserve, queue, cancel while queued
      if (pcp_topology_sched_reserve(s, job, training, 1) >= 0) {
        pcp_topology_sched_commit_to_queue(s, job);
        pcp_topology_sched_cancel_queued(s, job);
      }
      break;
    case 7:  // a normal job starts and is canceled
      pcp_topology_sched_enqueue(s, job, training, 1);
      if (pcp_topology_sched_start_next(s) == job) {
        pcp_topology_sched_cancel_active(s, job);
      }
      break;
    case 8:  // the reserved worker is lost before the commit
      if (pcp_topology_sched_reserve(s, job, training, 1) >= 0) {
        for (uint32_t i = 0; i < s->worker_count; ++i) {
          if (s->workers[i].job == job) {
            pcp_topology_sched_lose_worker(s, s->workers[i].id);
            break;
          }
        }
        pcp_topology_sched_commit(s, job);
      }
      break;
    case 9:  // more workers than the pool has
      (void)pcp_topology_sched_reserve(s, job, training, 3);
      break;
    default:  // lost workers come back, then a plain reservation
      for (uint32_t i = 0; i < s->worker_count; ++i) {
        if (s->workers[i].state == PCP_TOPOLOGY_WORKER_OFFLINE) {
          pcp_topology_sched_restore_worker(s, s->workers[i].id);
        }
      }
      (void)pcp_topology_sched_reserve(s, job, training, 1);
      break;
  }
}

static void sched_fresh(pcp_topology_sched_t* s) {
  pcp_topology_sched_initialize(s);
  for (uint32_t i = 0; i < 2; ++i) {
    pcp_status_ignore(pcp_topology_sched_add_worker(
        s, i + 1, PCP_TOPOLOGY_WORKER_CLASS_CUDA, "sm_80"));
  }
  for (uint32_t o = 0; o < PCP_TOPOLOGY_SCHED_OWNER_COUNT; ++o) {
    s->policies[o].worker_class = PCP_TOPOLOGY_WORKER_CLASS_CUDA;
    s->policies[o].target_arch = "sm_80";
  }
}

// Runs one scenario and folds what it reached into |stats|.
static void sched_step(pcp_topology_sched_t* s, uint32_t scenario,
                       uint32_t salt, pcp_topology_exploration_stats_t* stats,
                       bool* inout_failed, pcp_topology_hasher_t* hasher) {
  s->violation = PCP_TOPOLOGY_SCHED_VIOLATION_NONE;
  s->decision = PCP_TOPOLOGY_SCHED_IDLE;
  sched_scenario(s, scenario, salt);
  stats->invariant_failures +=
      pcp_topology_sched_check_invariants(s) != PCP_TOPOLOGY_SCHED_INVARIANT_OK;
  stats->decisions_seen |= 1ull << s->decision;
  if (s->violation != PCP_TOPOLOGY_SCHED_VIOLATION_NONE) {
    stats->violations_seen |= 1ull << s->violation;
    *inout_failed = true;
  }
  pcp_topology_hasher_update_le(hasher, s->decision, 1);
  pcp_topology_hasher_update_le(hasher, s->violation, 1);
  pcp_topology_hasher_update_le(
      hasher, pcp_topology_sched_count_state(s, PCP_TOPOLOGY_WORKER_IDLE), 1);
}

void pcp_topology_sched_explore_exhaustive(
    pcp_topology_exploration_stats_t* out_stats) {
  memset(out_stats, 0, sizeof(*out_stats));
  pcp_topology_hasher_t hasher;
  pcp_topology_hasher_initialize(0, &hasher);
  for (uint32_t a = 0; a < PCP_TOPOLOGY_SCHED_SCENARIOS; ++a) {
    for (uint32_t b = 0; b < PCP_TOPOLOGY_SCHED_SCENARIOS; ++b) {
      pcp_topology_sched_t s;
      sched_fresh(&s);
      bool failed = false;
      sched_step(&s, a, 0, out_stats, &failed, &hasher);
      sched_step(&s, b, 1, out_stats, &failed, &hasher);
      out_stats->checked++;
      out_stats->failed += failed;
    }
  }
  out_stats->fingerprint = pcp_topology_hasher_finish(&hasher);
}

void pcp_topology_sched_explore_seeded(
    uint64_t seed, uint32_t trace_count, uint32_t depth,
    pcp_topology_exploration_stats_t* out_stats) {
  memset(out_stats, 0, sizeof(*out_stats));
  out_stats->seed = seed;
  pcp_rng_t rng;
  pcp_rng_initialize(seed, &rng);
  pcp_topology_hasher_t hasher;
  pcp_topology_hasher_initialize(seed, &hasher);
  for (uint32_t t = 0; t < trace_count; ++t) {
    pcp_topology_sched_t s;
    sched_fresh(&s);
    bool failed = false;
    for (uint32_t d = 0; d < depth; ++d) {
      uint32_t scenario =
          (uint32_t)pcp_rng_next_below(&rng, PCP_TOPOLOGY_SCHED_SCENARIOS);
      sched_step(&s, scenario, d, out_stats, &failed, &hasher);
    }
    out_stats->checked++;
    out_stats->failed += failed;
  }
  out_stats->fingerprint = pcp_topology_hasher_finish(&hasher);
}

//===----------------------------------------------------------------------===//
// Scheduler: injected bugs
//===----------------------------------------------------------------------===//

void pcp_topology_sched_action_apply(pcp_topology_sched_t* s,
                                     const pcp_topology_action_t* a) {
  uint32_t job = (uint32_t)a->parameters[0];
  uint32_t owner = (uint32_t)a->parameters[1];
  uint32_t workers = (uint32_t)a->parameters[2];
  switch ((pcp_topology_sched_action_kind_t)a->kind) {
    case PCP_TOPOLOGY_SCHED_ACTION_RESERVE:
      (void)pcp_topology_sched_reserve(s, job, owner, workers);
      return;
    case PCP_TOPOLOGY_SCHED_ACTION_COMMIT:
      pcp_topology_sched_commit(s, job);
      return;
    case PCP_TOPOLOGY_SCHED_ACTION_COMMIT_TO_QUEUE:
      pcp_topology_sched_commit_to_queue(s, job);
      return;
    case PCP_TOPOLOGY_SCHED_ACTION_ENQUEUE:
      pcp_topology_sched_enqueue(s, job, owner, workers);
      return;
    case PCP_TOPOLOGY_SCHED_ACTION_START_NEXT:
      (void)pcp_topology_sched_start_next(s);
      return;
    case PCP_TOPOLOGY_SCHED_ACTION_COMPLETE:
      pcp_topology_sched_complete(s, job);
      return;
    case PCP_TOPOLOGY_SCHED_ACTION_CANCEL:
      pcp_topology_sched_cancel(s, job);
      return;
    case PCP_TOPOLOGY_SCHED_ACTION_RELEASE:
      pcp_topology_sched_release(s, job);
      return;
    case PCP_TOPOLOGY_SCHED_ACTION_EXPIRE:
      pcp_topology_sched_expire(s, job);
      return;
    case PCP_TOPOLOGY_SCHED_ACTION_LOSE_WORKER:
      pcp_topology_sched_lose_worker(s, job);
      return;
    case PCP_TOPOLOGY_SCHED_ACTION_RESTORE_WORKER:
      pcp_topology_sched_restore_worker(s, job);
      return;
    case PCP_TOPOLOGY_SCHED_ACTION_COUNT_:
      break;
  }
  s->violation = PCP_TOPOLOGY_SCHED_VIOLATION_INVALID_REQUEST;
  s->decision = PCP_TOPOLOGY_SCHED_REJECTED;
}

const char* pcp_topology_sched_bug_name(pcp_topology_sched_bug_t bug) {
  switch (bug) {
    case PCP_TOPOLOGY_SCHED_BUG_DUPLICATE_WORKER_RESERVATION:
      return "duplicate_worker_reservation";
    case PCP_TOPOLOGY_SCHED_BUG_ASSIGNMENT_AFTER_WORKER_LOSS:
      return "assignment_after_worker_loss";
    case PCP_TOPOLOGY_SCHED_BUG_CANCELLATION_CLEANUP_LEAK:
      return "cancellation_cleanup_leak";
    case PCP_TOPOLOGY_SCHED_BUG_COUNT_:
      break;
  }
  return "?";
}

// Whether the active reservation of |job| has lost a worker: one it was
// granted is offline, or was restored and so no longer held.
static bool sched_reservation_lost(const pcp_topology_sched_t* s,
                                   uint32_t job) {
  for (uint32_t r = 0; r < PCP_TOPOLOGY_SCHED_MAX_RESERVATIONS; ++r) {
    const pcp_topology_sched_reservation_t* res = &s->reservations[r];
    if (!res->active || res->job != job) {
      continue;
    }
    uint32_t held = 0;
    bool lost = false;
    for (uint32_t w = 0; w < s->worker_count; ++w) {
      if (!((res->worker_mask >> w) & 1u)) {
        continue;
      }
      held++;
      lost |= s->workers[w].state == PCP_TOPOLOGY_WORKER_OFFLINE;
    }
    return lost || held < res->workers_required;
  }
  return false;
}

bool pcp_topology_sched_bug_exposed(pcp_topology_sched_bug_t bug, bool inject,
                                    const pcp_topology_action_t* actions,
                                    size_t action_count) {
  pcp_topology_sched_t s;
  sched_fresh(&s);
  s.bug_duplicate_worker_reservation =
      inject && bug == PCP_TOPOLOGY_SCHED_BUG_DUPLICATE_WORKER_RESERVATION;
  s.bug_commit_after_loss =
      inject && bug == PCP_TOPOLOGY_SCHED_BUG_ASSIGNMENT_AFTER_WORKER_LOSS;
  s.bug_leak_on_cancel =
      inject && bug == PCP_TOPOLOGY_SCHED_BUG_CANCELLATION_CLEANUP_LEAK;
  for (size_t i = 0; i < action_count; ++i) {
    const pcp_topology_action_t* a = &actions[i];
    bool lost = a->kind == PCP_TOPOLOGY_SCHED_ACTION_COMMIT &&
                sched_reservation_lost(&s, (uint32_t)a->parameters[0]);
    s.violation = PCP_TOPOLOGY_SCHED_VIOLATION_NONE;
    pcp_topology_sched_action_apply(&s, a);
    pcp_topology_sched_invariant_t broken =
        pcp_topology_sched_check_invariants(&s);
    switch (bug) {
      case PCP_TOPOLOGY_SCHED_BUG_DUPLICATE_WORKER_RESERVATION:
        if (broken ==
            PCP_TOPOLOGY_SCHED_INVARIANT_DUPLICATE_WORKER_RESERVATION) {
          return true;
        }
        break;
      case PCP_TOPOLOGY_SCHED_BUG_ASSIGNMENT_AFTER_WORKER_LOSS:
        // The correct scheduler refuses such a commit with the violation of
        // the same name; the bug lets it through.
        if (lost && s.decision == PCP_TOPOLOGY_SCHED_COMMITTED) {
          return true;
        }
        break;
      case PCP_TOPOLOGY_SCHED_BUG_CANCELLATION_CLEANUP_LEAK:
        if (broken == PCP_TOPOLOGY_SCHED_INVARIANT_ORPHAN_RESERVED_WORKER) {
          return true;
        }
        break;
      case PCP_TOPOLOGY_SCHED_BUG_COUNT_:
        return false;
    }
  }
  return false;
}

typedef struct sched_bug_context_t {
  pcp_topology_sched_bug_t bug;
} sched_bug_context_t;

static bool sched_bug_predicate(void* user_data,
                                const pcp_topology_action_t* actions,
                                size_t action_count) {
  const sched_bug_context_t* context = (const sched_bug_context_t*)user_data;
  return pcp_topology_sched_bug_exposed(context->bug, true, actions,
                                        action_count);
}

pcp_status_t pcp_topology_sched_injected_bug_find(
    pcp_topology_sched_bug_t bug, uint64_t seed, uint32_t trace_count,
    uint32_t depth, pcp_allocator_t allocator,
    pcp_topology_action_shrink_result_t* out_result) {
  memset(out_result, 0, sizeof(*out_result));
  if ((unsigned)bug >= PCP_TOPOLOGY_SCHED_BUG_COUNT_ || depth > 64) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "injected scheduler bug %u at depth %u",
                           (unsigned)bug, depth);
  }
  pcp_rng_t rng;
  pcp_rng_initialize(seed, &rng);
  pcp_topology_action_t actions[64];
  for (uint32_t t = 0; t < trace_count; ++t) {
    for (uint32_t i = 0; i < depth; ++i) {
      pcp_topology_action_t* a = &actions[i];
      a->kind =
          (uint32_t)pcp_rng_next_below(&rng, PCP_TOPOLOGY_SCHED_ACTION_COUNT_);
      bool on_worker = a->kind == PCP_TOPOLOGY_SCHED_ACTION_LOSE_WORKER ||
                       a->kind == PCP_TOPOLOGY_SCHED_ACTION_RESTORE_WORKER;
      a->parameters[0] = on_worker ? 1 + pcp_rng_next_below(&rng, 2)
                                   : 5 + pcp_rng_next_below(&rng, 3);
      a->parameters[1] = pcp_rng_next_below(&rng, 2);
      a->parameters[2] = 1 + pcp_rng_next_below(&rng, 2);
    }
    if (!pcp_topology_sched_bug_exposed(bug, true, actions, depth)) {
      continue;
    }
    sched_bug_context_t context = {bug};
    return pcp_topology_actions_shrink(
        allocator, actions, depth, sched_bug_predicate, &context, out_result);
  }
  return pcp_make_status(PCP_STATUS_NOT_FOUND,
                         "no schedule of %u exposes %s in %u traces", depth,
                         pcp_topology_sched_bug_name(bug), trace_count);
}

//===----------------------------------------------------------------------===//
// Decoupled window
//===----------------------------------------------------------------------===//

// The eleven-action alphabet over a session with two workers, quorum 2 and
// one fragment.
static void decoupled_action(const pcp_topology_decoupled_t* d, uint32_t index,
                             uint64_t clock,
                             pcp_topology_decoupled_action_t* out) {
  static const struct {
    pcp_topology_decoupled_action_kind_t kind;
    uint32_t worker;
  } kAlphabet[PCP_TOPOLOGY_DECOUPLED_ACTIONS] = {
      {PCP_TOPOLOGY_DECOUPLED_ASSIGN, 0},
      {PCP_TOPOLOGY_DECOUPLED_ASSIGN, 1},
      {PCP_TOPOLOGY_DECOUPLED_LOCAL_STEP_COMPLETE, 0},
      {PCP_TOPOLOGY_DECOUPLED_SUBMIT, 0},
      {PCP_TOPOLOGY_DECOUPLED_SUBMIT, 1},
      {PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW, 0},
      {PCP_TOPOLOGY_DECOUPLED_CANCEL_SESSION, 0},
      {PCP_TOPOLOGY_DECOUPLED_CRASH, 1},
      {PCP_TOPOLOGY_DECOUPLED_RESTART, 1},
      {PCP_TOPOLOGY_DECOUPLED_FORCE_COMMIT, 0},
      {PCP_TOPOLOGY_DECOUPLED_SUBMIT, 0},  // resubmission (duplicate / stale)
  };
  memset(out, 0, sizeof(*out));
  out->kind = kAlphabet[index].kind;
  out->worker = kAlphabet[index].worker;
  out->session = d->session;
  out->fragment = d->fragment;
  out->step = index == 10 && d->step > 0 ? d->step - 1 : d->step;
  out->clock = clock;
}

static void decoupled_run(const uint32_t* actions, uint32_t count,
                          pcp_topology_exploration_stats_t* stats,
                          pcp_topology_hasher_t* hasher) {
  // About 250 KiB (the real round, learners, syncer state and the model's
  // arena) of stack, one model at a time.
  pcp_topology_decoupled_t d;
  pcp_topology_decoupled_initialize(7, 2, 2, 1, &d);
  bool failed = false;
  bool flagged_commit = false;  // the model flagged a forced commit
  for (uint32_t i = 0; i < count; ++i) {
    pcp_topology_decoupled_action_t a;
    decoupled_action(&d, actions[i], i + 1, &a);
    pcp_topology_decoupled_apply(&d, &a);
    stats->decisions_seen |= 1ull << d.decision;
    if (d.violation != PCP_TOPOLOGY_DECOUPLED_VIOLATION_NONE) {
      stats->violations_seen |= 1ull << d.violation;
      failed = true;
      flagged_commit |= a.kind == PCP_TOPOLOGY_DECOUPLED_FORCE_COMMIT;
    }
    pcp_topology_hasher_update_le(hasher, d.decision, 1);
    pcp_topology_hasher_update_le(hasher, d.violation, 1);
  }
  // The oracles over the real state (quorum, duplicates, clock, replay equal
  // to live, no sync after a cancel): a failure the model did not flag as a
  // violation of its own is an invariant failure. A forced commit (the
  // injected bug in the alphabet) is flagged, so its below-quorum or
  // post-cancel record is not one; everything else must always hold.
  pcp_topology_decoupled_oracle_t oracle =
      pcp_topology_decoupled_check(&d, pcp_allocator_system());
  bool excused = flagged_commit &&
                 (oracle == PCP_TOPOLOGY_DECOUPLED_ORACLE_BELOW_QUORUM ||
                  oracle == PCP_TOPOLOGY_DECOUPLED_ORACLE_POST_CANCEL_SYNC);
  if (oracle != PCP_TOPOLOGY_DECOUPLED_ORACLE_OK && !excused) {
    stats->invariant_failures++;
  }
  stats->checked++;
  stats->failed += failed;
}

pcp_status_t pcp_topology_decoupled_explore_exhaustive(
    uint32_t depth, pcp_topology_exploration_stats_t* out_stats) {
  memset(out_stats, 0, sizeof(*out_stats));
  if (depth > PCP_TOPOLOGY_DECOUPLED_MAX_EXPLORE_DEPTH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "decoupled exploration depth %u exceeds %u", depth,
                           PCP_TOPOLOGY_DECOUPLED_MAX_EXPLORE_DEPTH);
  }
  pcp_topology_hasher_t hasher;
  pcp_topology_hasher_initialize(0, &hasher);
  uint32_t actions[PCP_TOPOLOGY_DECOUPLED_MAX_EXPLORE_DEPTH] = {0};
  for (;;) {
    decoupled_run(actions, depth, out_stats, &hasher);
    int position = (int)depth - 1;
    while (position >= 0) {
      if (++actions[position] < PCP_TOPOLOGY_DECOUPLED_ACTIONS)
        break;
      actions[position] = 0;
      --position;
    }
    if (position < 0)
      break;
  }
  out_stats->fingerprint = pcp_topology_hasher_finish(&hasher);
  return pcp_ok_status();
}

pcp_status_t pcp_topology_decoupled_explore_seeded(
    uint64_t seed, uint32_t trace_count, uint32_t depth,
    pcp_topology_exploration_stats_t* out_stats) {
  memset(out_stats, 0, sizeof(*out_stats));
  out_stats->seed = seed;
  if (depth > PCP_TOPOLOGY_TRACE_MAX_EVENTS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "decoupled exploration depth %u too large", depth);
  }
  pcp_rng_t rng;
  pcp_rng_initialize(seed, &rng);
  pcp_topology_hasher_t hasher;
  pcp_topology_hasher_initialize(seed, &hasher);
  uint32_t actions[64];
  for (uint32_t t = 0; t < trace_count; ++t) {
    uint32_t count = depth < 64 ? depth : 64;
    for (uint32_t i = 0; i < count; ++i) {
      actions[i] =
          (uint32_t)pcp_rng_next_below(&rng, PCP_TOPOLOGY_DECOUPLED_ACTIONS);
    }
    decoupled_run(actions, count, out_stats, &hasher);
  }
  out_stats->seed = seed;
  out_stats->fingerprint = pcp_topology_hasher_finish(&hasher);
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Decoupled window: injected bugs
//===----------------------------------------------------------------------===//

const char* pcp_topology_decoupled_bug_name(pcp_topology_decoupled_bug_t bug) {
  switch (bug) {
    case PCP_TOPOLOGY_DECOUPLED_BUG_BELOW_QUORUM_COMMIT:
      return "below_quorum_commit";
    case PCP_TOPOLOGY_DECOUPLED_BUG_STALE_VECTOR_CLOCK_ACCEPTANCE:
      return "stale_vector_clock_acceptance";
    case PCP_TOPOLOGY_DECOUPLED_BUG_COUNT_:
      break;
  }
  return "?";
}

bool pcp_topology_decoupled_bug_exposed(pcp_topology_decoupled_bug_t bug,
                                        bool inject,
                                        const pcp_topology_action_t* actions,
                                        size_t action_count) {
  pcp_topology_decoupled_t d;  // large: see decoupled_run
  pcp_topology_decoupled_initialize(7, 2, 2, 1, &d);
  d.bug_accept_stale_clock =
      inject && bug == PCP_TOPOLOGY_DECOUPLED_BUG_STALE_VECTOR_CLOCK_ACCEPTANCE;
  for (size_t i = 0; i < action_count; ++i) {
    pcp_topology_decoupled_action_t a;
    memset(&a, 0, sizeof(a));
    a.kind = (pcp_topology_decoupled_action_kind_t)actions[i].kind;
    if (a.kind == PCP_TOPOLOGY_DECOUPLED_FORCE_COMMIT &&
        !(inject && bug == PCP_TOPOLOGY_DECOUPLED_BUG_BELOW_QUORUM_COMMIT)) {
      a.kind = PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW;
    }
    a.worker = (uint32_t)actions[i].parameters[0];
    a.session = d.session;
    a.fragment = d.fragment;
    a.step = d.step;
    a.clock = actions[i].parameters[1];
    uint32_t accepted = 0;
    for (uint32_t w = 0; w < d.worker_count; ++w) {
      accepted += (d.accepted_mask >> w) & 1u;
    }
    uint64_t known = a.worker < d.worker_count ? d.known_clock[a.worker] : 0;
    pcp_topology_decoupled_apply(&d, &a);
    switch (bug) {
      case PCP_TOPOLOGY_DECOUPLED_BUG_BELOW_QUORUM_COMMIT:
        if (d.decision == PCP_TOPOLOGY_DECOUPLED_MERGE_COMMITTED &&
            accepted < d.quorum) {
          return true;
        }
        break;
      case PCP_TOPOLOGY_DECOUPLED_BUG_STALE_VECTOR_CLOCK_ACCEPTANCE:
        if (a.kind == PCP_TOPOLOGY_DECOUPLED_SUBMIT &&
            d.decision == PCP_TOPOLOGY_DECOUPLED_UPDATE_ACCEPTED &&
            a.clock < known) {
          return true;
        }
        break;
      case PCP_TOPOLOGY_DECOUPLED_BUG_COUNT_:
        return false;
    }
  }
  return false;
}

typedef struct decoupled_bug_context_t {
  pcp_topology_decoupled_bug_t bug;
} decoupled_bug_context_t;

static bool decoupled_bug_predicate(void* user_data,
                                    const pcp_topology_action_t* actions,
                                    size_t action_count) {
  const decoupled_bug_context_t* context =
      (const decoupled_bug_context_t*)user_data;
  return pcp_topology_decoupled_bug_exposed(context->bug, true, actions,
                                            action_count);
}

pcp_status_t pcp_topology_decoupled_injected_bug_find(
    pcp_topology_decoupled_bug_t bug, uint64_t seed, uint32_t trace_count,
    uint32_t depth, pcp_allocator_t allocator,
    pcp_topology_action_shrink_result_t* out_result) {
  memset(out_result, 0, sizeof(*out_result));
  if ((unsigned)bug >= PCP_TOPOLOGY_DECOUPLED_BUG_COUNT_ || depth > 64) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "injected decoupled bug %u at depth %u",
                           (unsigned)bug, depth);
  }
  pcp_rng_t rng;
  pcp_rng_initialize(seed, &rng);
  pcp_topology_action_t actions[64];
  for (uint32_t t = 0; t < trace_count; ++t) {
    for (uint32_t i = 0; i < depth; ++i) {
      actions[i].kind = (uint32_t)pcp_rng_next_below(
          &rng, PCP_TOPOLOGY_DECOUPLED_FORCE_COMMIT + 1);
      actions[i].parameters[0] = pcp_rng_next_below(&rng, 2);
      actions[i].parameters[1] = pcp_rng_next_below(&rng, 4);
      actions[i].parameters[2] = 0;
    }
    if (!pcp_topology_decoupled_bug_exposed(bug, true, actions, depth)) {
      continue;
    }
    decoupled_bug_context_t context = {bug};
    return pcp_topology_actions_shrink(allocator, actions, depth,
                                       decoupled_bug_predicate, &context,
                                       out_result);
  }
  return pcp_make_status(PCP_STATUS_NOT_FOUND,
                         "no schedule of %u exposes %s in %u traces", depth,
                         pcp_topology_decoupled_bug_name(bug), trace_count);
}
