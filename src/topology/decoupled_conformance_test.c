// SPDX-License-Identifier: Apache-2.0
//
// The topology model of decoupled DiLoCo (decoupled_model.c) against the
// library it is derived from (workloads/train/decoupled.h), issue 17
// Deliver 7. Seeded random schedules run through the model and, side by
// side, through a driver written here from decoupled.h's contract alone (its
// own round, learners, clocks, syncer state and tape on the system
// allocator): every action must give the same decision, the round the same
// arrivals, and at the end the two tapes must encode to the same bytes and
// the two syncer states be equal. Then the oracles: they hold on every
// schedule of the correct model and of the explorers, and a quorum off by
// one seeded into the machine through the test-only hook is caught by the
// quorum oracle and by the conformance comparison. Last, the RDA values the
// model publishes (the library's merge) against the referee's formula.

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include <math.h>
#include <string.h>

#include "base/base.h"
#include "topology/protocols_impl.h"
#include "workloads/train/decoupled.h"

#define MAX_W PCP_TOPOLOGY_DECOUPLED_MAX_WORKERS

// The scenario's shape.
typedef struct config_t {
  uint32_t workers;
  uint32_t quorum;
  uint32_t fragments;
  uint64_t grace_ms;  // fixed grace, unless adaptive
  bool adaptive;
  double gamma;
  uint32_t max_grace_steps;
  uint32_t overlap_tau;
} config_t;

// The library driver: the same scenario from the contract of decoupled.h.
typedef struct driver_t {
  config_t config;
  uint64_t now;
  uint32_t step;  // real syncer step = step + P (the model's mapping)
  uint32_t fragment;
  bool online[MAX_W];
  pcp_decoupled_schedule_t schedule;
  pcp_decoupled_grace_t grace;
  uint64_t last_step[MAX_W];
  pcp_decoupled_round_t round;
  pcp_decoupled_clock_t view;
  pcp_decoupled_learner_t learners[MAX_W];
  pcp_decoupled_syncer_state_t syncer;
  pcp_decoupled_tape_t tape;
  uint32_t rejoins;  // full resyncs sent to a learner coming back
} driver_t;

static uint64_t real_step(const driver_t* r) {
  return (uint64_t)r->step + r->config.fragments;
}

static void driver_open(driver_t* r) {
  uint32_t expected[MAX_W];
  for (uint32_t w = 0; w < r->config.workers; ++w) expected[w] = w;
  PCP_CHECK_OK(pcp_decoupled_round_open(
      r->now, expected, r->config.workers, r->config.quorum,
      pcp_decoupled_grace_ms(&r->grace), PCP_TOPOLOGY_DECOUPLED_WINDOW_MS,
      &r->round));
}

static void driver_initialize(const config_t* c, driver_t* r) {
  memset(r, 0, sizeof(*r));
  r->config = *c;
  r->schedule = (pcp_decoupled_schedule_t){c->fragments, c->fragments, 1};
  PCP_CHECK_OK(pcp_decoupled_schedule_check(&r->schedule));
  r->grace.config = (pcp_decoupled_grace_config_t){
      .grace_window_ms =
          c->adaptive ? PCP_TOPOLOGY_DECOUPLED_WINDOW_MS : c->grace_ms,
      .adaptive = c->adaptive,
      .gamma = c->adaptive ? c->gamma : 1.0,
      .max_grace_steps = c->adaptive ? c->max_grace_steps : 1,
      .overlap_tau = c->adaptive ? c->overlap_tau : 1,
      .ema_alpha = 0.125};
  PCP_CHECK_OK(pcp_decoupled_grace_config_check(&r->grace.config));
  pcp_decoupled_clock_initialize(&r->view);
  for (uint32_t w = 0; w < c->workers; ++w) {
    r->online[w] = true;
    PCP_CHECK_OK(pcp_decoupled_learner_initialize(
        pcp_allocator_system(), (uint16_t)(w + 1), c->fragments,
        &r->learners[w]));
  }
  PCP_CHECK_OK(pcp_decoupled_syncer_state_initialize(pcp_allocator_system(),
                                                     c->fragments, &r->syncer));
  pcp_decoupled_tape_initialize(pcp_allocator_system(), &r->tape);
  assert_true(pcp_decoupled_schedule_fragment_at(&r->schedule, real_step(r),
                                                 &r->fragment));
  driver_open(r);
}

static void driver_deinitialize(driver_t* r) {
  for (uint32_t w = 0; w < r->config.workers; ++w) {
    pcp_decoupled_learner_deinitialize(&r->learners[w]);
  }
  pcp_decoupled_syncer_state_deinitialize(&r->syncer);
  pcp_decoupled_tape_deinitialize(&r->tape);
}

static void driver_record(driver_t* r, pcp_decoupled_event_kind_t kind,
                          uint32_t w, uint32_t fragment, uint64_t step) {
  pcp_decoupled_event_t e;
  memset(&e, 0, sizeof(e));
  e.kind = kind;
  e.learner_id = w + 1;
  e.fragment_id = fragment;
  e.syncer_step = step;
  PCP_CHECK_OK(pcp_decoupled_syncer_record_event(&r->syncer, &r->tape, &e));
}

static void driver_next(driver_t* r) {
  r->step++;
  assert_true(pcp_decoupled_schedule_fragment_at(&r->schedule, real_step(r),
                                                 &r->fragment));
  driver_open(r);
}

typedef struct outcome_t {
  pcp_topology_decoupled_decision_t decision;
  pcp_topology_decoupled_violation_t violation;
} outcome_t;

static outcome_t reject(pcp_topology_decoupled_violation_t v) {
  return (outcome_t){PCP_TOPOLOGY_DECOUPLED_UPDATE_REJECTED, v};
}

static outcome_t driver_apply(driver_t* r,
                              const pcp_topology_decoupled_action_t* a) {
  const outcome_t none = {PCP_TOPOLOGY_DECOUPLED_IDLE,
                          PCP_TOPOLOGY_DECOUPLED_VIOLATION_NONE};
  outcome_t out = none;
  r->now += PCP_TOPOLOGY_DECOUPLED_TICK_MS;
  uint32_t w = a->worker;
  uint16_t node = (uint16_t)(w + 1);
  switch (a->kind) {
    case PCP_TOPOLOGY_DECOUPLED_LOCAL_STEP_COMPLETE:
      if (!r->online[w])
        return reject(PCP_TOPOLOGY_DECOUPLED_VIOLATION_INVALID_WORKER);
      pcp_decoupled_learner_record_step(&r->learners[w], 8);
      pcp_decoupled_grace_observe_step(&r->grace,
                                       (double)(r->now - r->last_step[w]));
      r->last_step[w] = r->now;
      PCP_CHECK_OK(pcp_decoupled_clock_observe(
          &r->view, node,
          pcp_decoupled_clock_get(&r->learners[w].clock, node)));
      out.decision = PCP_TOPOLOGY_DECOUPLED_LOCAL_STEP;
      return out;
    case PCP_TOPOLOGY_DECOUPLED_SUBMIT: {
      if (!r->online[w])
        return reject(PCP_TOPOLOGY_DECOUPLED_VIOLATION_UNAVAILABLE_WORKER);
      if (a->step != r->step || a->fragment != r->fragment)
        return reject(PCP_TOPOLOGY_DECOUPLED_VIOLATION_STALE_UPDATE);
      if (a->clock < pcp_decoupled_clock_get(&r->view, node))
        return reject(PCP_TOPOLOGY_DECOUPLED_VIOLATION_STALE_VECTOR_CLOCK);
      uint32_t arrivals = r->round.arrival_count;
      uint32_t duplicates = r->round.duplicate_count;
      pcp_decoupled_round_arrive(&r->round, w, r->now);
      if (r->round.arrival_count > arrivals) {
        PCP_CHECK_OK(pcp_decoupled_clock_observe(&r->view, node, a->clock));
        out.decision = PCP_TOPOLOGY_DECOUPLED_UPDATE_ACCEPTED;
        return out;
      }
      bool had = false;
      for (uint32_t i = 0; i < r->round.arrival_count; ++i) {
        had |= r->round.arrivals[i].learner_id == w;
      }
      if (r->round.duplicate_count > duplicates || had)
        return reject(PCP_TOPOLOGY_DECOUPLED_VIOLATION_DUPLICATE_UPDATE);
      return reject(PCP_TOPOLOGY_DECOUPLED_VIOLATION_STALE_UPDATE);  // late
    }
    case PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW: {
      uint64_t deadline = pcp_decoupled_round_next_deadline_ms(&r->round);
      if (deadline != UINT64_MAX && deadline > r->now)
        r->now = deadline;
      if (pcp_decoupled_round_poll(&r->round, r->now) !=
          PCP_DECOUPLED_ROUND_CLOSED) {
        driver_next(r);
        out.decision = PCP_TOPOLOGY_DECOUPLED_MERGE_DEFERRED;
        return out;
      }
      const pcp_decoupled_selection_t* sel = &r->round.selection;
      pcp_decoupled_grace_observe_quorum_wait(&r->grace,
                                              (double)sel->quorum_wait_ms);
      pcp_decoupled_participant_t parts[MAX_W];
      for (uint32_t p = 0; p < sel->participant_count; ++p) {
        const pcp_decoupled_learner_t* l = &r->learners[sel->participants[p]];
        uint64_t steps = l->steps_since[r->fragment];
        uint64_t tokens = l->tokens_since[r->fragment];
        parts[p] = (pcp_decoupled_participant_t){
            .learner_id = sel->participants[p] + 1,
            .learner_step = l->learner_step,
            .steps_since = steps,
            .tokens_since = tokens,
            .merge_weight = pcp_decoupled_merge_weight(tokens, steps)};
      }
      uint64_t s = real_step(r);
      PCP_CHECK_OK(pcp_decoupled_syncer_record_sync(
          &r->syncer, &r->tape, s, r->fragment, parts, sel->participant_count));
      PCP_CHECK_OK(pcp_decoupled_clock_observe(
          &r->view, 0, pcp_decoupled_clock_get(&r->syncer.clock, 0)));
      for (uint32_t k = 0; k < r->config.workers; ++k) {
        if (!r->online[k])
          continue;
        PCP_CHECK_OK(pcp_decoupled_learner_apply_fragment(&r->learners[k],
                                                          r->fragment, s));
        driver_record(r, PCP_DECOUPLED_EVENT_LEARNER_APPLY, k, r->fragment, s);
      }
      driver_next(r);
      out.decision = PCP_TOPOLOGY_DECOUPLED_MERGE_COMMITTED;
      return out;
    }
    case PCP_TOPOLOGY_DECOUPLED_CRASH:
      if (r->online[w]) {
        driver_record(r, PCP_DECOUPLED_EVENT_LEARNER_FAILURE, w, 0,
                      r->syncer.global_step);
      }
      r->online[w] = false;
      out.decision = PCP_TOPOLOGY_DECOUPLED_WORKER_LOST;
      return out;
    case PCP_TOPOLOGY_DECOUPLED_RESTART:
      if (!r->online[w]) {
        // It rejoins with what the recovery plan sends it: the newest
        // version of each listed fragment that was ever synced.
        pcp_decoupled_live_learner_t live = {
            .learner_id = node,
            .observed_global_step = r->learners[w].observed_global_step};
        pcp_decoupled_recovery_plan_t plan;
        PCP_CHECK_OK(pcp_decoupled_recovery_plan_initialize(
            pcp_allocator_system(), &r->syncer, &r->tape, &live, 1,
            PCP_TOPOLOGY_DECOUPLED_RECOVERY_STEPS, &plan));
        for (uint32_t k = 0; k < plan.action_count; ++k) {
          const pcp_decoupled_recovery_action_t* p = &plan.actions[k];
          if (p->learner_id != node ||
              (p->kind != PCP_DECOUPLED_RECOVERY_CATCH_UP &&
               p->kind != PCP_DECOUPLED_RECOVERY_FULL_RESYNC)) {
            continue;
          }
          r->rejoins += p->kind == PCP_DECOUPLED_RECOVERY_FULL_RESYNC;
          for (uint32_t f = 0; f < p->fragment_count; ++f) {
            uint64_t s = r->syncer.fragment_last_step[p->fragments[f]];
            if (s == 0)
              continue;
            PCP_CHECK_OK(pcp_decoupled_learner_apply_fragment(
                &r->learners[w], p->fragments[f], s));
            driver_record(r, PCP_DECOUPLED_EVENT_LEARNER_APPLY, w,
                          p->fragments[f], s);
          }
        }
        pcp_decoupled_recovery_plan_deinitialize(&plan);
        driver_record(r, PCP_DECOUPLED_EVENT_LEARNER_RECOVERY, w, 0,
                      r->syncer.global_step);
      }
      r->online[w] = true;
      out.decision = PCP_TOPOLOGY_DECOUPLED_RESUMABLE;
      return out;
    default:
      break;
  }
  fail_msg("action kind %d is not in the conformance alphabet", (int)a->kind);
  return none;
}

static void* take(size_t bytes) {
  void* p = NULL;
  PCP_CHECK_OK(pcp_allocator_calloc(pcp_allocator_system(), bytes, &p));
  return p;
}

static void release(void* p) {
  pcp_allocator_free(pcp_allocator_system(), p);
}

// The bytes of |tape| (encoded on the system allocator whatever the tape's).
static uint8_t* encode(const pcp_decoupled_tape_t* tape, size_t* out_length) {
  pcp_decoupled_tape_t view = *tape;
  view.allocator = pcp_allocator_system();
  uint8_t* data = NULL;
  PCP_CHECK_OK(pcp_decoupled_tape_encode(&view, &data, out_length));
  return data;
}

typedef struct run_result_t {
  bool diverged;  // a decision, the round or the tape differed
  pcp_topology_decoupled_oracle_t oracle;
  uint32_t commits;
  uint32_t deferrals;
  uint32_t late;
  uint32_t adaptive_grace;  // commits whose next round got adaptive grace
  uint32_t rejoins;         // full resyncs to a learner coming back
} run_result_t;

// One seeded schedule of |length| actions through both; with |bug| the
// model runs with the quorum off by one (the driver never does).
static run_result_t run_one(uint64_t seed, uint32_t length, bool bug,
                            pcp_topology_decoupled_t* d, driver_t* r) {
  pcp_rng_t rng;
  pcp_rng_initialize(seed, &rng);
  config_t c;
  c.workers = 2 + (uint32_t)pcp_rng_next_below(&rng, 3);
  c.quorum = 1 + (uint32_t)pcp_rng_next_below(&rng, c.workers);
  if (bug && c.quorum < 2)
    c.quorum = 2;
  c.fragments = 1 + (uint32_t)pcp_rng_next_below(&rng, 3);
  static const uint64_t kGrace[4] = {0, 2, 5, PCP_TOPOLOGY_DECOUPLED_WINDOW_MS};
  c.grace_ms = kGrace[pcp_rng_next_below(&rng, 4)];
  // A third adaptive: grace from the library's EMAs of the step and the
  // quorum wait.
  c.adaptive = pcp_rng_next_below(&rng, 3) == 0;
  static const double kGamma[3] = {0.5, 1.0, 2.0};
  c.gamma = kGamma[pcp_rng_next_below(&rng, 3)];
  c.max_grace_steps = 1 + (uint32_t)pcp_rng_next_below(&rng, 2);
  c.overlap_tau = 1 + (uint32_t)pcp_rng_next_below(&rng, 3);

  pcp_topology_decoupled_initialize(11, c.workers, c.quorum, c.fragments, d);
  if (c.adaptive) {
    PCP_CHECK_OK(pcp_topology_decoupled_set_adaptive_grace(
        d, c.gamma, c.max_grace_steps, c.overlap_tau));
  } else {
    pcp_topology_decoupled_set_grace(d, c.grace_ms);
  }
  pcp_topology_decoupled_set_bug_quorum_off_by_one(d, bug);
  driver_initialize(&c, r);
  run_result_t result = {0};
  // Every worker is assigned first (the driver has no assignment step).
  for (uint32_t w = 0; w < c.workers; ++w) {
    pcp_topology_decoupled_action_t a = {.kind = PCP_TOPOLOGY_DECOUPLED_ASSIGN,
                                         .worker = w};
    pcp_topology_decoupled_apply(d, &a);
    r->now += PCP_TOPOLOGY_DECOUPLED_TICK_MS;
    r->last_step[w] = r->now;
  }
  for (uint32_t i = 0; i < length; ++i) {
    static const pcp_topology_decoupled_action_kind_t kKinds[8] = {
        PCP_TOPOLOGY_DECOUPLED_LOCAL_STEP_COMPLETE,
        PCP_TOPOLOGY_DECOUPLED_SUBMIT,
        PCP_TOPOLOGY_DECOUPLED_SUBMIT,
        PCP_TOPOLOGY_DECOUPLED_SUBMIT,
        PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW,
        PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW,
        PCP_TOPOLOGY_DECOUPLED_CRASH,
        PCP_TOPOLOGY_DECOUPLED_RESTART,
    };
    pcp_topology_decoupled_action_t a;
    memset(&a, 0, sizeof(a));
    a.kind = kKinds[pcp_rng_next_below(&rng, 8)];
    a.worker = (uint32_t)pcp_rng_next_below(&rng, c.workers);
    a.session = d->session;
    a.step = d->step;
    a.fragment = d->fragment;
    // The learner's own clock, sometimes one behind (a retransmission), and
    // now and then for the previous step (a stale update).
    uint64_t own = pcp_decoupled_clock_get(&r->learners[a.worker].clock,
                                           (uint16_t)(a.worker + 1));
    uint64_t roll = pcp_rng_next_below(&rng, 8);
    a.clock = roll == 0 && own > 0 ? own - 1 : own;
    if (roll == 1 && a.step > 0) {
      a.step--;
    }
    pcp_topology_decoupled_apply(d, &a);
    outcome_t want = driver_apply(r, &a);
    if (d->decision != want.decision || d->violation != want.violation ||
        d->round.arrival_count != r->round.arrival_count ||
        d->round.state != r->round.state || d->step != r->step ||
        d->fragment != r->fragment) {
      result.diverged = true;
      break;
    }
    result.commits += d->decision == PCP_TOPOLOGY_DECOUPLED_MERGE_COMMITTED;
    result.adaptive_grace +=
        c.adaptive && d->decision == PCP_TOPOLOGY_DECOUPLED_MERGE_COMMITTED &&
        d->round.grace_ms > 0;
    result.deferrals += d->decision == PCP_TOPOLOGY_DECOUPLED_MERGE_DEFERRED;
  }
  result.late = d->late_updates;
  result.rejoins = r->rejoins;
  if (!result.diverged) {
    size_t model_length = 0, driver_length = 0;
    uint8_t* model_bytes = encode(&d->real_tape, &model_length);
    uint8_t* driver_bytes = encode(&r->tape, &driver_length);
    result.diverged = model_length != driver_length ||
                      memcmp(model_bytes, driver_bytes, model_length) != 0 ||
                      !pcp_decoupled_syncer_state_equal(&d->syncer, &r->syncer);
    release(model_bytes);
    release(driver_bytes);
  }
  result.oracle = pcp_topology_decoupled_check(d, pcp_allocator_system());
  driver_deinitialize(r);
  return result;
}

// 300 seeded schedules of 40 actions (2-4 workers, every quorum, 1-3
// fragments, grace 0, 2, 5 ms or the whole window): the model decides as the
// library, tape bytes and syncer state equal, every oracle holds; the
// schedules reach commits, skipped rounds and late updates.
static void test_model_conforms_to_library(void** state) {
  (void)state;
  pcp_topology_decoupled_t* d = take(sizeof(*d));
  driver_t* r = take(sizeof(*r));
  uint32_t commits = 0, deferrals = 0, late = 0, adaptive = 0, rejoins = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    run_result_t got = run_one(seed, 40, false, d, r);
    if (got.diverged || got.oracle != PCP_TOPOLOGY_DECOUPLED_ORACLE_OK) {
      fail_msg("seed %llu: diverged %d, oracle %s (%s)",
               (unsigned long long)seed, got.diverged,
               pcp_topology_decoupled_oracle_name(got.oracle),
               d->real_error_message);
    }
    commits += got.commits;
    deferrals += got.deferrals;
    late += got.late;
    adaptive += got.adaptive_grace;
    rejoins += got.rejoins;
  }
  print_message(
      "conformance: 300 schedules, %u commits, %u skipped rounds, "
      "%u late updates, %u adaptive grace windows, %u rejoins with a full "
      "resync\n",
      commits, deferrals, late, adaptive, rejoins);
  assert_true(commits > 300);
  assert_true(deferrals > 100);
  assert_true(late > 0);
  assert_true(adaptive > 0);
  assert_true(rejoins > 0);
  release(r);
  release(d);
}

// The seeded bug: the round opens with min_quorum - 1 (test-only hook). The
// quorum oracle fails on some schedules, and each of those also leaves the
// library's decisions; the same seeds without the hook pass both.
static void test_seeded_quorum_bug_is_caught(void** state) {
  (void)state;
  pcp_topology_decoupled_t* d = take(sizeof(*d));
  driver_t* r = take(sizeof(*r));
  uint32_t caught = 0;
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    run_result_t clean = run_one(seed, 40, false, d, r);
    assert_false(clean.diverged);
    assert_int_equal(clean.oracle, PCP_TOPOLOGY_DECOUPLED_ORACLE_OK);
    run_result_t buggy = run_one(seed, 40, true, d, r);
    if (buggy.oracle == PCP_TOPOLOGY_DECOUPLED_ORACLE_BELOW_QUORUM) {
      ++caught;
      assert_true(buggy.diverged);
    }
  }
  print_message("seeded quorum off by one: caught on %u of 100 schedules\n",
                caught);
  assert_true(caught >= 10);
  release(r);
  release(d);
}

// The explorers' runs hold every oracle (invariant_failures counts an oracle
// failure the model did not flag itself), and the oracles are not vacuous:
// a forced commit is below quorum, a tampered live state no longer equals
// its replay, a sync after a cancel is caught.
static void test_oracles_on_explorers_and_tampering(void** state) {
  (void)state;
  pcp_topology_exploration_stats_t stats;
  PCP_CHECK_OK(pcp_topology_decoupled_explore_exhaustive(3, &stats));
  assert_int_equal(stats.checked, 1331);
  assert_int_equal(stats.invariant_failures, 0);
  PCP_CHECK_OK(pcp_topology_decoupled_explore_seeded(0xdec0, 64, 18, &stats));
  assert_int_equal(stats.invariant_failures, 0);

  pcp_topology_decoupled_t* d = take(sizeof(*d));
  pcp_topology_decoupled_initialize(7, 2, 2, 1, d);
  pcp_topology_decoupled_action_t a = {.kind = PCP_TOPOLOGY_DECOUPLED_ASSIGN};
  pcp_topology_decoupled_apply(d, &a);
  a.worker = 1;
  pcp_topology_decoupled_apply(d, &a);
  a = (pcp_topology_decoupled_action_t){.kind = PCP_TOPOLOGY_DECOUPLED_SUBMIT,
                                        .session = 7};
  pcp_topology_decoupled_apply(d, &a);
  a.worker = 1;
  pcp_topology_decoupled_apply(d, &a);
  // Both came: the real round closed early; the timeout commits it.
  assert_int_equal(d->round.state, PCP_DECOUPLED_ROUND_CLOSED);
  a = (pcp_topology_decoupled_action_t){
      .kind = PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW};
  pcp_topology_decoupled_apply(d, &a);
  assert_int_equal(d->decision, PCP_TOPOLOGY_DECOUPLED_MERGE_COMMITTED);
  assert_int_equal(d->syncer.global_step, 1);  // real step = model step + P
  assert_int_equal(pcp_topology_decoupled_check(d, pcp_allocator_system()),
                   PCP_TOPOLOGY_DECOUPLED_ORACLE_OK);
  d->syncer.participants_total++;
  assert_int_equal(pcp_topology_decoupled_check(d, pcp_allocator_system()),
                   PCP_TOPOLOGY_DECOUPLED_ORACLE_REPLAY_MISMATCH);
  d->syncer.participants_total--;
  a = (pcp_topology_decoupled_action_t){
      .kind = PCP_TOPOLOGY_DECOUPLED_CANCEL_SESSION};
  pcp_topology_decoupled_apply(d, &a);
  a = (pcp_topology_decoupled_action_t){
      .kind = PCP_TOPOLOGY_DECOUPLED_FORCE_COMMIT};
  pcp_topology_decoupled_apply(d, &a);
  assert_int_equal(d->violation,
                   PCP_TOPOLOGY_DECOUPLED_VIOLATION_BELOW_QUORUM_COMMIT);
  assert_int_equal(pcp_topology_decoupled_check(d, pcp_allocator_system()),
                   PCP_TOPOLOGY_DECOUPLED_ORACLE_BELOW_QUORUM);

  // The recovery oracle: worker 1 takes part in fragment 0's sync, is down
  // while fragment 1 syncs, and is back for fragment 0's next sync. Through
  // the model (crash, restart) the rejoin sends it fragment 1 and the tape
  // says so. Tampered (down and back behind the syncer's back: no failure,
  // no recovery, nothing sent), its observed step is the newest, a restarted
  // syncer's plan resumes it, and it never got fragment 1.
  for (int honest = 0; honest < 2; ++honest) {
    pcp_topology_decoupled_initialize(9, 2, 1, 2, d);
    for (uint32_t w = 0; w < 2; ++w) {
      a = (pcp_topology_decoupled_action_t){
          .kind = PCP_TOPOLOGY_DECOUPLED_ASSIGN, .worker = w};
      pcp_topology_decoupled_apply(d, &a);
    }
    for (uint32_t round = 0; round < 3; ++round) {
      for (uint32_t w = 0; w < (round == 0 ? 2u : 1u); ++w) {
        a = (pcp_topology_decoupled_action_t){
            .kind = PCP_TOPOLOGY_DECOUPLED_SUBMIT,
            .worker = w,
            .session = 9,
            .fragment = d->fragment,
            .step = d->step};
        pcp_topology_decoupled_apply(d, &a);
      }
      a = (pcp_topology_decoupled_action_t){
          .kind = PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW};
      pcp_topology_decoupled_apply(d, &a);
      assert_int_equal(d->decision, PCP_TOPOLOGY_DECOUPLED_MERGE_COMMITTED);
      if (round < 2 && honest) {
        a = (pcp_topology_decoupled_action_t){
            .kind = round == 0 ? PCP_TOPOLOGY_DECOUPLED_CRASH
                               : PCP_TOPOLOGY_DECOUPLED_RESTART,
            .worker = 1};
        pcp_topology_decoupled_apply(d, &a);
      } else if (round < 2) {
        d->online[1] = round == 1;  // the tampering
      }
    }
    assert_int_equal(
        pcp_topology_decoupled_check(d, pcp_allocator_system()),
        honest ? PCP_TOPOLOGY_DECOUPLED_ORACLE_OK
               : PCP_TOPOLOGY_DECOUPLED_ORACLE_RECOVERY_MISSES_FRAGMENT);
  }

  // The arena's bound: the densest schedule (a sync with 4 applies, a
  // failure and a rejoin every 4 actions) fits in 128 actions and is a
  // clear REAL_ERROR, not a crash, at 256.
  for (uint32_t length = 128; length <= 256; length *= 2) {
    pcp_topology_decoupled_initialize(1, 4, 1, 3, d);
    for (uint32_t w = 0; w < 4; ++w) {
      a = (pcp_topology_decoupled_action_t){
          .kind = PCP_TOPOLOGY_DECOUPLED_ASSIGN, .worker = w};
      pcp_topology_decoupled_apply(d, &a);
    }
    for (uint32_t i = 0; i < length; ++i) {
      static const pcp_topology_decoupled_action_kind_t kDense[4] = {
          PCP_TOPOLOGY_DECOUPLED_SUBMIT, PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW,
          PCP_TOPOLOGY_DECOUPLED_CRASH, PCP_TOPOLOGY_DECOUPLED_RESTART};
      a = (pcp_topology_decoupled_action_t){
          .kind = kDense[i % 4],
          // Worker 0 submits; each group of 4 crashes and restarts one of
          // the others in turn.
          .worker = i % 4 == 0 ? 0 : 1 + (i / 4) % 3,
          .session = 1,
          .fragment = d->fragment,
          .step = d->step};
      pcp_topology_decoupled_apply(d, &a);
    }
    pcp_topology_decoupled_oracle_t oracle =
        pcp_topology_decoupled_check(d, pcp_allocator_system());
    if (length == 128) {
      assert_int_equal(oracle, PCP_TOPOLOGY_DECOUPLED_ORACLE_OK);
      assert_true(d->tape_entries >= 30);
    } else {
      assert_int_equal(oracle, PCP_TOPOLOGY_DECOUPLED_ORACLE_REAL_ERROR);
      assert_non_null(strstr(d->real_error_message, "arena"));
    }
  }
  release(d);
}

// The RDA values the model publishes (the library's merge) against the
// referee's double formula on 500 seeded cases (1-8 updates, 1-8
// dimensions, values k/8 in [-4, 4] so the f32 inputs are exact, tokens
// 0-99 including none, steps 0-9): within 1e-6 of the output's norm (the
// f32 rounding of the result), the weights equal, the cancelling and empty
// cases zero in both.
static void test_rda_values_match_referee(void** state) {
  (void)state;
  pcp_rng_t rng;
  pcp_rng_initialize(0x7da, &rng);
  uint32_t zeros = 0, compared = 0;
  for (uint32_t c = 0; c < 500; ++c) {
    size_t count = 1 + (size_t)pcp_rng_next_below(&rng, 8);
    size_t dimension = 1 + (size_t)pcp_rng_next_below(&rng, 8);
    double values[PCP_TOPOLOGY_MERGE_MAX_UPDATES]
                 [PCP_TOPOLOGY_RDA_MAX_DIMENSION];
    pcp_topology_rda_update_t updates[PCP_TOPOLOGY_MERGE_MAX_UPDATES];
    for (size_t k = 0; k < count; ++k) {
      for (size_t i = 0; i < dimension; ++i) {
        values[k][i] = ((double)pcp_rng_next_below(&rng, 65) - 32.0) / 8.0;
      }
      updates[k].values = values[k];
      updates[k].tokens = pcp_rng_next_below(&rng, 100);
      updates[k].steps = pcp_rng_next_below(&rng, 10);
      assert_true(
          pcp_topology_token_step_weight(updates[k].tokens, updates[k].steps) ==
          pcp_decoupled_merge_weight(updates[k].tokens, updates[k].steps));
    }
    if (c % 50 == 0) {
      // A cancelling pair: the direction is zero, so is the merge.
      count = 2;
      for (size_t i = 0; i < dimension; ++i) values[1][i] = -values[0][i];
      updates[1].tokens = updates[0].tokens;
      updates[1].steps = updates[0].steps;
    }
    double referee[PCP_TOPOLOGY_RDA_MAX_DIMENSION];
    double real[PCP_TOPOLOGY_RDA_MAX_DIMENSION];
    assert_true(pcp_topology_rda_merge(updates, count, dimension, referee));
    assert_true(pcp_topology_rda_merge_real(updates, count, dimension, real));
    double norm = 0.0, error = 0.0;
    for (size_t i = 0; i < dimension; ++i) {
      norm += referee[i] * referee[i];
      error += (real[i] - referee[i]) * (real[i] - referee[i]);
    }
    norm = sqrt(norm);
    if (norm == 0.0) {
      ++zeros;
      for (size_t i = 0; i < dimension; ++i) assert_true(real[i] == 0.0);
      continue;
    }
    if (sqrt(error) > 1e-6 * norm) {
      fail_msg("case %u: library and referee differ by %g (norm %g)", c,
               sqrt(error), norm);
    }
    ++compared;
  }
  assert_true(zeros >= 10);
  assert_true(compared >= 400);
  // Beyond the model's bounds both refuse.
  double out[PCP_TOPOLOGY_RDA_MAX_DIMENSION + 1];
  pcp_topology_rda_update_t one = {out, 1, 1};
  assert_false(pcp_topology_rda_merge_real(
      &one, 1, PCP_TOPOLOGY_RDA_MAX_DIMENSION + 1, out));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_model_conforms_to_library),
      cmocka_unit_test(test_seeded_quorum_bug_is_caught),
      cmocka_unit_test(test_oracles_on_explorers_and_tampering),
      cmocka_unit_test(test_rda_values_match_referee),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
