// SPDX-License-Identifier: Apache-2.0
// The supervision policy with scripted exits and a manual clock: no
// processes, no loop.
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "roles/nodemgr/supervision_impl.h"

#define SPAWN PCP_ROLES_SUPERVISION_ACTION_SPAWN
#define TERMINATE PCP_ROLES_SUPERVISION_ACTION_TERMINATE
#define KILL PCP_ROLES_SUPERVISION_ACTION_KILL

// A machine, its rng and the actions of the last poll.
typedef struct harness_t {
  pcp_rng_t rng;
  pcp_roles_supervision_t* sup;
  int64_t now_ms;
  pcp_roles_supervision_action_t actions[PCP_ROLES_SUPERVISION_MAX_SLOTS];
  size_t action_count;
} harness_t;

static void harness_initialize(harness_t* h,
                               const pcp_roles_supervision_options_t* options,
                               uint64_t seed) {
  memset(h, 0, sizeof(*h));
  pcp_rng_initialize(seed, &h->rng);
  h->now_ms = 1000;  // any base: the machine only uses differences
  assert_null(pcp_roles_supervision_create(options, h->now_ms, &h->rng,
                                           pcp_allocator_system(), &h->sup));
}

static void harness_deinitialize(harness_t* h) {
  pcp_roles_supervision_release(h->sup);
}

static size_t poll_at(harness_t* h, int64_t now_ms) {
  h->now_ms = now_ms;
  h->action_count = pcp_roles_supervision_poll(h->sup, now_ms, h->actions,
                                               PCP_ARRAYSIZE(h->actions));
  return h->action_count;
}

static void expect_action(harness_t* h, size_t index,
                          pcp_roles_supervision_action_kind_t kind,
                          uint32_t slot) {
  assert_true(index < h->action_count);
  assert_int_equal(h->actions[index].kind, kind);
  assert_int_equal(h->actions[index].slot, slot);
}

static pcp_roles_slot_state_t state_of(harness_t* h, uint32_t slot) {
  return pcp_roles_supervision_slot(h->sup, slot)->state;
}

// Options with round numbers, jitter aside.
static pcp_roles_supervision_options_t test_options(uint32_t slots) {
  pcp_roles_supervision_options_t options =
      pcp_roles_supervision_options_default();
  options.slot_count = slots;
  options.stagger_ms = 200;
  options.running_after_ms = 1000;
  options.restart_min_ms = 1000;
  options.restart_max_ms = 8000;
  options.restart_multiplier = 2.0;
  options.reset_after_ms = 60000;
  options.crash_loop_restarts = 5;
  options.crash_loop_window_ms = 60000;
  options.stop_grace_ms = 10000;
  return options;
}

static void defaults_are_documented_values(void** state) {
  (void)state;
  pcp_roles_supervision_options_t options =
      pcp_roles_supervision_options_default();
  assert_int_equal(options.stagger_ms, 200);
  assert_int_equal(options.running_after_ms, 1000);
  assert_int_equal(options.restart_min_ms, 1000);
  assert_int_equal(options.restart_max_ms, 30000);
  assert_int_equal(options.reset_after_ms, 60000);
  assert_int_equal(options.crash_loop_restarts, 5);
  assert_int_equal(options.crash_loop_window_ms, 60000);
  assert_int_equal(options.stop_grace_ms, 10000);
  assert_null(pcp_roles_supervision_options_check(&options));
}

static void bad_options_are_rejected(void** state) {
  (void)state;
  pcp_roles_supervision_options_t o = test_options(1);
  o.slot_count = 0;
  pcp_status_t status = pcp_roles_supervision_options_check(&o);
  assert_non_null(status);
  assert_non_null(strstr(pcp_status_message(status), "slot_count"));
  pcp_status_ignore(status);

  o = test_options(PCP_ROLES_SUPERVISION_MAX_SLOTS + 1);
  status = pcp_roles_supervision_options_check(&o);
  assert_non_null(status);
  pcp_status_ignore(status);

  o = test_options(1);
  o.restart_max_ms = o.restart_min_ms - 1;
  status = pcp_roles_supervision_options_check(&o);
  assert_non_null(status);
  assert_non_null(strstr(pcp_status_message(status), "restart_max_ms"));
  pcp_status_ignore(status);

  o = test_options(1);
  o.restart_multiplier = 0.5;
  status = pcp_roles_supervision_options_check(&o);
  assert_non_null(status);
  pcp_status_ignore(status);

  o = test_options(1);
  o.crash_loop_restarts = PCP_ROLES_SUPERVISION_MAX_CRASH_LOOP_RESTARTS + 1;
  status = pcp_roles_supervision_options_check(&o);
  assert_non_null(status);
  pcp_status_ignore(status);

  o = test_options(1);
  o.crash_loop_window_ms = 0;
  status = pcp_roles_supervision_options_check(&o);
  assert_non_null(status);
  pcp_status_ignore(status);

  pcp_rng_t rng;
  pcp_rng_initialize(1, &rng);
  pcp_roles_supervision_t* sup = (pcp_roles_supervision_t*)&rng;
  status =
      pcp_roles_supervision_create(&o, 0, &rng, pcp_allocator_system(), &sup);
  assert_non_null(status);
  assert_null(sup);
  pcp_status_ignore(status);

  o = test_options(4);
  status =
      pcp_roles_supervision_create(&o, 0, &rng, pcp_allocator_null(), &sup);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_RESOURCE_EXHAUSTED);
  pcp_status_ignore(status);
}

// Slot i is spawned at t0 + i * stagger, one per poll time, in order.
static void staggered_start(void** state) {
  (void)state;
  pcp_roles_supervision_options_t options = test_options(3);
  harness_t h;
  harness_initialize(&h, &options, 1);
  assert_int_equal(pcp_roles_supervision_next_deadline_ms(h.sup), 1000);
  assert_int_equal(poll_at(&h, 1000), 1);
  expect_action(&h, 0, SPAWN, 0);
  assert_int_equal(state_of(&h, 0), PCP_ROLES_SLOT_STATE_STARTING);
  assert_int_equal(state_of(&h, 1), PCP_ROLES_SLOT_STATE_PENDING);
  assert_int_equal(pcp_roles_supervision_next_deadline_ms(h.sup), 1200);
  assert_int_equal(poll_at(&h, 1199), 0);
  assert_int_equal(poll_at(&h, 1200), 1);
  expect_action(&h, 0, SPAWN, 1);
  assert_int_equal(poll_at(&h, 1400), 1);
  expect_action(&h, 0, SPAWN, 2);
  // Not ready until every slot has stayed up for running_after_ms.
  assert_false(pcp_roles_supervision_is_ready(h.sup));
  assert_int_equal(pcp_roles_supervision_next_deadline_ms(h.sup), 2000);
  assert_int_equal(poll_at(&h, 2000), 0);
  assert_int_equal(state_of(&h, 0), PCP_ROLES_SLOT_STATE_RUNNING);
  assert_int_equal(state_of(&h, 2), PCP_ROLES_SLOT_STATE_STARTING);
  assert_false(pcp_roles_supervision_is_ready(h.sup));
  poll_at(&h, 2400);
  assert_true(pcp_roles_supervision_is_ready(h.sup));
  assert_int_equal(
      pcp_roles_supervision_count_in_state(h.sup, PCP_ROLES_SLOT_STATE_RUNNING),
      3);
  assert_int_equal(pcp_roles_supervision_next_deadline_ms(h.sup), INT64_MAX);
  for (uint32_t i = 0; i < 3; ++i) {
    const pcp_roles_slot_t* slot = pcp_roles_supervision_slot(h.sup, i);
    assert_int_equal(slot->start_count, 1);
    assert_int_equal(slot->restart_count, 0);
  }
  harness_deinitialize(&h);
}

// A late poll catches up: everything due is handed out at once.
static void late_poll_spawns_all_due(void** state) {
  (void)state;
  pcp_roles_supervision_options_t options = test_options(4);
  harness_t h;
  harness_initialize(&h, &options, 1);
  assert_int_equal(poll_at(&h, 5000), 4);
  for (uint32_t i = 0; i < 4; ++i) {
    expect_action(&h, i, SPAWN, i);
  }
  harness_deinitialize(&h);
}

// Exits restart after a delay within [min, min * 2^n] (full jitter), the
// ceiling capped at restart_max_ms; restarts are counted.
static void restart_with_exponential_backoff(void** state) {
  (void)state;
  pcp_roles_supervision_options_t options = test_options(1);
  options.crash_loop_restarts = 20;  // stay clear of the cap here
  options.crash_loop_window_ms = 1000;
  harness_t h;
  harness_initialize(&h, &options, 7);
  poll_at(&h, 1000);
  int64_t now = 1000;
  for (int n = 0; n < 8; ++n) {
    now += 5000;  // runs 5 s each time: below reset_after_ms
    poll_at(&h, now);
    assert_int_equal(state_of(&h, 0), PCP_ROLES_SLOT_STATE_RUNNING);
    assert_int_equal(pcp_roles_supervision_child_exited(h.sup, 0, now, 1, 0),
                     PCP_ROLES_SLOT_STATE_BACKING_OFF);
    const pcp_roles_slot_t* slot = pcp_roles_supervision_slot(h.sup, 0);
    int64_t ceiling = 1000;
    for (int k = 0; k < n && ceiling < 8000; ++k) {
      ceiling *= 2;
    }
    if (ceiling > 8000) {
      ceiling = 8000;
    }
    assert_true(slot->last_delay_ms >= 1000);
    assert_true(slot->last_delay_ms <= ceiling);
    assert_int_equal(slot->deadline_ms, now + slot->last_delay_ms);
    assert_int_equal(slot->last_exit_status, 1);
    assert_int_equal(pcp_roles_supervision_next_deadline_ms(h.sup),
                     slot->deadline_ms);
    assert_int_equal(poll_at(&h, slot->deadline_ms - 1), 0);
    now = slot->deadline_ms;
    assert_int_equal(poll_at(&h, now), 1);
    expect_action(&h, 0, SPAWN, 0);
    assert_int_equal(slot->restart_count, (uint64_t)n + 1);
    assert_int_equal(slot->start_count, (uint64_t)n + 2);
  }
  harness_deinitialize(&h);
}

// The jitter spreads delays: over many seeds, the third restart's delays
// cover [1000, 4000] rather than one value.
static void jitter_spreads_delays(void** state) {
  (void)state;
  pcp_roles_supervision_options_t options = test_options(1);
  int64_t low = INT64_MAX, high = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    harness_t h;
    harness_initialize(&h, &options, seed);
    int64_t now = 1000;
    poll_at(&h, now);
    for (int n = 0; n < 3; ++n) {
      now += 10;
      pcp_roles_supervision_child_exited(h.sup, 0, now, 1, 0);
      now = pcp_roles_supervision_slot(h.sup, 0)->deadline_ms;
      if (n < 2) {
        poll_at(&h, now);
      }
    }
    int64_t delay = pcp_roles_supervision_slot(h.sup, 0)->last_delay_ms;
    assert_true(delay >= 1000 && delay <= 4000);
    low = delay < low ? delay : low;
    high = delay > high ? delay : high;
    harness_deinitialize(&h);
  }
  assert_true(low < 1500);
  assert_true(high > 3500);
}

// Same seed, same script: same delays (replayable in simulation).
static void same_seed_same_delays(void** state) {
  (void)state;
  pcp_roles_supervision_options_t options = test_options(1);
  int64_t delays[2][4];
  for (int run = 0; run < 2; ++run) {
    harness_t h;
    harness_initialize(&h, &options, 42);
    int64_t now = 1000;
    poll_at(&h, now);
    for (int n = 0; n < 4; ++n) {
      now += 10;
      pcp_roles_supervision_child_exited(h.sup, 0, now, 0, SIGSEGV);
      delays[run][n] = pcp_roles_supervision_slot(h.sup, 0)->last_delay_ms;
      now = pcp_roles_supervision_slot(h.sup, 0)->deadline_ms;
      poll_at(&h, now);
    }
    harness_deinitialize(&h);
  }
  assert_memory_equal(delays[0], delays[1], sizeof(delays[0]));
}

// A run that lasted reset_after_ms brings the delay back to the minimum.
static void long_run_resets_backoff(void** state) {
  (void)state;
  pcp_roles_supervision_options_t options = test_options(1);
  options.restart_min_ms = 1000;
  options.restart_max_ms = 1000000;
  options.crash_loop_restarts = 10;
  harness_t h;
  harness_initialize(&h, &options, 3);
  int64_t now = 1000;
  poll_at(&h, now);
  // Four quick crashes: the ceiling grows to 16 s.
  for (int n = 0; n < 4; ++n) {
    now += 100;
    pcp_roles_supervision_child_exited(h.sup, 0, now, 1, 0);
    now = pcp_roles_supervision_slot(h.sup, 0)->deadline_ms;
    poll_at(&h, now);
  }
  const pcp_roles_slot_t* slot = pcp_roles_supervision_slot(h.sup, 0);
  assert_int_equal(slot->backoff.attempt, 4);
  // Then a run of exactly reset_after_ms: the next delay is the minimum
  // (the first attempt's ceiling is min_ms, so no jitter is possible).
  now += options.reset_after_ms;
  pcp_roles_supervision_child_exited(h.sup, 0, now, 0, 0);
  assert_int_equal(slot->last_delay_ms, 1000);
  assert_int_equal(slot->backoff.attempt, 1);
  // One ms short of it does not reset.
  now = slot->deadline_ms;
  poll_at(&h, now);
  now += options.reset_after_ms - 1;
  pcp_roles_supervision_child_exited(h.sup, 0, now, 0, 0);
  assert_int_equal(slot->backoff.attempt, 2);
  harness_deinitialize(&h);
}

// K restarts within the window are allowed; the exit after them fails the
// slot, which then stays failed (no spawn, no deadline) while the other
// slots keep going.
static void crash_loop_cap_fails_slot(void** state) {
  (void)state;
  pcp_roles_supervision_options_t options = test_options(2);
  options.restart_min_ms = 100;
  options.restart_max_ms = 100;
  options.crash_loop_restarts = 3;
  options.crash_loop_window_ms = 10000;
  harness_t h;
  harness_initialize(&h, &options, 5);
  int64_t now = 1000;
  poll_at(&h, now);
  poll_at(&h, now += 200);  // slot 1 spawned
  for (int n = 0; n < 3; ++n) {
    now += 5;
    assert_int_equal(pcp_roles_supervision_child_exited(h.sup, 0, now, 2, 0),
                     PCP_ROLES_SLOT_STATE_BACKING_OFF);
    now += 100;
    assert_int_equal(poll_at(&h, now), 1);
    expect_action(&h, 0, SPAWN, 0);
  }
  assert_int_equal(pcp_roles_supervision_slot(h.sup, 0)->restart_count, 3);
  now += 5;
  assert_int_equal(pcp_roles_supervision_child_exited(h.sup, 0, now, 2, 0),
                   PCP_ROLES_SLOT_STATE_FAILED);
  const pcp_roles_slot_t* slot = pcp_roles_supervision_slot(h.sup, 0);
  assert_int_equal(slot->exit_count, 4);
  assert_int_equal(slot->deadline_ms, INT64_MAX);
  assert_int_equal(poll_at(&h, now + 100000), 0);
  assert_int_equal(state_of(&h, 0), PCP_ROLES_SLOT_STATE_FAILED);
  assert_int_equal(state_of(&h, 1), PCP_ROLES_SLOT_STATE_RUNNING);
  assert_false(pcp_roles_supervision_is_ready(h.sup));
  assert_int_equal(pcp_roles_supervision_next_deadline_ms(h.sup), INT64_MAX);
  // Reviving gives it a fresh history.
  assert_null(pcp_roles_supervision_slot_revive(h.sup, 0, now + 100000));
  assert_int_equal(poll_at(&h, now + 100000), 1);
  expect_action(&h, 0, SPAWN, 0);
  pcp_status_t status = pcp_roles_supervision_slot_revive(h.sup, 1, now);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_FAILED_PRECONDITION);
  pcp_status_ignore(status);
  harness_deinitialize(&h);
}

// Exits spread wider than the window never hit the cap.
static void exits_outside_window_do_not_count(void** state) {
  (void)state;
  pcp_roles_supervision_options_t options = test_options(1);
  options.restart_min_ms = 100;
  options.restart_max_ms = 100;
  options.crash_loop_restarts = 2;
  options.crash_loop_window_ms = 1000;
  harness_t h;
  harness_initialize(&h, &options, 5);
  int64_t now = 1000;
  poll_at(&h, now);
  for (int n = 0; n < 50; ++n) {
    now += 400;  // three exits span 2 * 500 = 1000 ms: not within 1000
    assert_int_equal(pcp_roles_supervision_child_exited(h.sup, 0, now, 1, 0),
                     PCP_ROLES_SLOT_STATE_BACKING_OFF);
    now += 100;
    assert_int_equal(poll_at(&h, now), 1);
  }
  // One exit sooner: three within 999 ms -> failed.
  now += 398;
  assert_int_equal(pcp_roles_supervision_child_exited(h.sup, 0, now, 1, 0),
                   PCP_ROLES_SLOT_STATE_FAILED);
  harness_deinitialize(&h);
}

// Failed spawns count like exits (a missing executable ends in FAILED, not
// in a hot loop).
static void spawn_failures_hit_the_cap(void** state) {
  (void)state;
  pcp_roles_supervision_options_t options = test_options(1);
  options.restart_min_ms = 10;
  options.restart_max_ms = 10;
  options.crash_loop_restarts = 2;
  harness_t h;
  harness_initialize(&h, &options, 5);
  int64_t now = 1000;
  for (int n = 0; n < 2; ++n) {
    assert_int_equal(poll_at(&h, now), 1);
    assert_int_equal(pcp_roles_supervision_spawn_failed(h.sup, 0, now),
                     PCP_ROLES_SLOT_STATE_BACKING_OFF);
    assert_true(pcp_roles_supervision_slot(h.sup, 0)->last_spawn_failed);
    now += 10;
  }
  assert_int_equal(poll_at(&h, now), 1);
  assert_int_equal(pcp_roles_supervision_spawn_failed(h.sup, 0, now),
                   PCP_ROLES_SLOT_STATE_FAILED);
  harness_deinitialize(&h);
}

// crash_loop_restarts 0: the first exit fails the slot.
static void zero_restarts_fail_at_first_exit(void** state) {
  (void)state;
  pcp_roles_supervision_options_t options = test_options(1);
  options.crash_loop_restarts = 0;
  harness_t h;
  harness_initialize(&h, &options, 5);
  poll_at(&h, 1000);
  assert_int_equal(pcp_roles_supervision_child_exited(h.sup, 0, 2000, 0, 0),
                   PCP_ROLES_SLOT_STATE_FAILED);
  harness_deinitialize(&h);
}

// Stop: SIGTERM to every child at once, SIGKILL to those still alive after
// the grace period, slots without a child stop at once; stopped when every
// child has exited; nothing restarts during or after the stop.
static void stop_terminates_then_kills(void** state) {
  (void)state;
  pcp_roles_supervision_options_t options = test_options(4);
  options.crash_loop_restarts = 0;
  harness_t h;
  harness_initialize(&h, &options, 5);
  int64_t now = 1000;
  poll_at(&h, now);
  poll_at(&h, now += 200);  // slot 1 up
  poll_at(&h, now += 200);  // slot 2 up
  // Slot 2 fails, slot 3 is still pending.
  pcp_roles_supervision_child_exited(h.sup, 2, now, 1, 0);
  assert_int_equal(state_of(&h, 2), PCP_ROLES_SLOT_STATE_FAILED);
  pcp_roles_supervision_stop(h.sup, now);
  pcp_roles_supervision_stop(h.sup, now);  // idempotent
  assert_true(pcp_roles_supervision_is_stopping(h.sup));
  assert_false(pcp_roles_supervision_is_stopped(h.sup));
  assert_false(pcp_roles_supervision_is_ready(h.sup));
  assert_int_equal(state_of(&h, 0), PCP_ROLES_SLOT_STATE_STOPPING);
  assert_int_equal(state_of(&h, 1), PCP_ROLES_SLOT_STATE_STOPPING);
  assert_int_equal(state_of(&h, 2), PCP_ROLES_SLOT_STATE_STOPPED);
  assert_int_equal(state_of(&h, 3), PCP_ROLES_SLOT_STATE_STOPPED);
  assert_true(pcp_roles_supervision_next_deadline_ms(h.sup) <= now);
  assert_int_equal(poll_at(&h, now), 2);
  expect_action(&h, 0, TERMINATE, 0);
  expect_action(&h, 1, TERMINATE, 1);
  assert_int_equal(poll_at(&h, now), 0);  // SIGTERM once
  assert_int_equal(pcp_roles_supervision_next_deadline_ms(h.sup), now + 10000);
  // Slot 0 exits in time; slot 1 ignores SIGTERM.
  assert_int_equal(pcp_roles_supervision_child_exited(h.sup, 0, now + 50, 0, 0),
                   PCP_ROLES_SLOT_STATE_STOPPED);
  assert_int_equal(poll_at(&h, now + 9999), 0);
  assert_int_equal(poll_at(&h, now + 10000), 1);
  expect_action(&h, 0, KILL, 1);
  assert_int_equal(poll_at(&h, now + 20000), 0);  // SIGKILL once
  assert_int_equal(pcp_roles_supervision_next_deadline_ms(h.sup), INT64_MAX);
  assert_false(pcp_roles_supervision_is_stopped(h.sup));
  assert_int_equal(
      pcp_roles_supervision_child_exited(h.sup, 1, now + 10001, 0, SIGKILL),
      PCP_ROLES_SLOT_STATE_STOPPED);
  assert_true(pcp_roles_supervision_is_stopped(h.sup));
  assert_int_equal(poll_at(&h, now + 100000), 0);
  // A failed slot cannot be revived once stopping.
  pcp_status_t status = pcp_roles_supervision_slot_revive(h.sup, 2, now);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_FAILED_PRECONDITION);
  pcp_status_ignore(status);
  // An exit during the stop does not count as a crash.
  assert_int_equal(pcp_roles_supervision_slot(h.sup, 1)->exit_count, 0);
  harness_deinitialize(&h);
}

// A stop while a slot backs off cancels the restart.
static void stop_cancels_pending_restart(void** state) {
  (void)state;
  pcp_roles_supervision_options_t options = test_options(1);
  harness_t h;
  harness_initialize(&h, &options, 5);
  poll_at(&h, 1000);
  pcp_roles_supervision_child_exited(h.sup, 0, 1500, 1, 0);
  assert_int_equal(state_of(&h, 0), PCP_ROLES_SLOT_STATE_BACKING_OFF);
  pcp_roles_supervision_stop(h.sup, 1600);
  assert_true(pcp_roles_supervision_is_stopped(h.sup));
  assert_int_equal(poll_at(&h, 100000), 0);
  harness_deinitialize(&h);
}

// A second stop request SIGKILLs at once instead of after the grace period;
// before any stop it does nothing.
static void stop_now_skips_the_grace_period(void** state) {
  (void)state;
  pcp_roles_supervision_options_t options = test_options(2);
  harness_t h;
  harness_initialize(&h, &options, 5);
  poll_at(&h, 1000);
  poll_at(&h, 1200);
  pcp_roles_supervision_stop_now(h.sup, 1200);
  assert_false(pcp_roles_supervision_is_stopping(h.sup));
  assert_int_equal(poll_at(&h, 1300), 0);
  pcp_roles_supervision_stop(h.sup, 1300);
  assert_int_equal(poll_at(&h, 1300), 2);
  expect_action(&h, 0, TERMINATE, 0);
  // Slot 0 exits in time, slot 1 does not; the operator will not wait.
  pcp_roles_supervision_child_exited(h.sup, 0, 1400, 0, 0);
  pcp_roles_supervision_stop_now(h.sup, 1500);
  assert_int_equal(pcp_roles_supervision_next_deadline_ms(h.sup), 1500);
  assert_int_equal(poll_at(&h, 1500), 1);
  expect_action(&h, 0, KILL, 1);
  // SIGKILL once, even when asked again.
  pcp_roles_supervision_stop_now(h.sup, 1600);
  assert_int_equal(poll_at(&h, 1600), 0);
  harness_deinitialize(&h);
}

// Grace 0: SIGTERM and SIGKILL on consecutive polls at the same time.
static void zero_grace_kills_next_poll(void** state) {
  (void)state;
  pcp_roles_supervision_options_t options = test_options(1);
  options.stop_grace_ms = 0;
  harness_t h;
  harness_initialize(&h, &options, 5);
  poll_at(&h, 1000);
  pcp_roles_supervision_stop(h.sup, 1000);
  assert_int_equal(poll_at(&h, 1000), 1);
  expect_action(&h, 0, TERMINATE, 0);
  assert_int_equal(poll_at(&h, 1000), 1);
  expect_action(&h, 0, KILL, 0);
  harness_deinitialize(&h);
}

// A seeded random script of exits, spawn failures, polls and a stop: the
// invariants hold at every step (simulation-style checker).
static void random_script_keeps_invariants(void** state) {
  (void)state;
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    pcp_rng_t script;
    pcp_rng_initialize(seed * 7919, &script);
    pcp_roles_supervision_options_t options =
        test_options(1 + (uint32_t)pcp_rng_next_below(&script, 6));
    options.crash_loop_restarts = (uint32_t)pcp_rng_next_below(&script, 5);
    options.restart_min_ms = 50;
    options.restart_max_ms = 2000;
    options.crash_loop_window_ms = 3000;
    harness_t h;
    harness_initialize(&h, &options, seed);
    int64_t now = 1000;
    bool stopped_requested = false;
    for (int step = 0; step < 400; ++step) {
      now += (int64_t)pcp_rng_next_below(&script, 400);
      uint32_t n = pcp_roles_supervision_slot_count(h.sup);
      if (!stopped_requested && step == 350) {
        pcp_roles_supervision_stop(h.sup, now);
        stopped_requested = true;
      }
      poll_at(&h, now);
      for (size_t a = 0; a < h.action_count; ++a) {
        const pcp_roles_slot_t* slot =
            pcp_roles_supervision_slot(h.sup, h.actions[a].slot);
        if (h.actions[a].kind == SPAWN) {
          assert_false(stopped_requested);
          assert_int_equal(slot->state, PCP_ROLES_SLOT_STATE_STARTING);
          if (pcp_rng_next_below(&script, 10) == 0) {
            pcp_roles_supervision_spawn_failed(h.sup, h.actions[a].slot, now);
          }
        } else {
          assert_int_equal(slot->state, PCP_ROLES_SLOT_STATE_STOPPING);
        }
      }
      uint32_t victim = (uint32_t)pcp_rng_next_below(&script, n);
      const pcp_roles_slot_t* slot = pcp_roles_supervision_slot(h.sup, victim);
      if (pcp_roles_slot_state_has_child(slot->state) &&
          pcp_rng_next_below(&script, 3) == 0) {
        pcp_roles_slot_state_t next =
            pcp_roles_supervision_child_exited(h.sup, victim, now, 1, 0);
        assert_true(next == PCP_ROLES_SLOT_STATE_BACKING_OFF ||
                    next == PCP_ROLES_SLOT_STATE_FAILED ||
                    next == PCP_ROLES_SLOT_STATE_STOPPED);
      }
      for (uint32_t i = 0; i < n; ++i) {
        const pcp_roles_slot_t* s = pcp_roles_supervision_slot(h.sup, i);
        assert_true(s->restart_count + 1 >= s->start_count);
        assert_true(s->exit_ring_count <= options.crash_loop_restarts + 1);
        if (s->state == PCP_ROLES_SLOT_STATE_BACKING_OFF) {
          assert_true(s->last_delay_ms >= options.restart_min_ms &&
                      s->last_delay_ms <= options.restart_max_ms);
        }
        if (stopped_requested) {
          assert_true(s->state == PCP_ROLES_SLOT_STATE_STOPPING ||
                      s->state == PCP_ROLES_SLOT_STATE_STOPPED);
        }
      }
    }
    // Every child gets SIGKILL eventually and its exit ends the stop.
    poll_at(&h, now + 100000);
    for (uint32_t i = 0; i < pcp_roles_supervision_slot_count(h.sup); ++i) {
      if (state_of(&h, i) == PCP_ROLES_SLOT_STATE_STOPPING) {
        pcp_roles_supervision_child_exited(h.sup, i, now + 100001, 0, SIGKILL);
      }
    }
    assert_true(pcp_roles_supervision_is_stopped(h.sup));
    harness_deinitialize(&h);
  }
}

// The worker's drain ends before our SIGKILL: a fifth of the grace, at
// most 2 s, is left for the exit itself.
static void drain_fits_the_grace_period(void** state) {
  (void)state;
  assert_int_equal(pcp_roles_worker_drain_timeout_ms(10000), 8000);
  assert_int_equal(pcp_roles_worker_drain_timeout_ms(60000), 58000);
  assert_int_equal(pcp_roles_worker_drain_timeout_ms(3000), 2400);
  assert_int_equal(pcp_roles_worker_drain_timeout_ms(0), 0);
}

static void state_names(void** state) {
  (void)state;
  assert_string_equal(
      pcp_roles_slot_state_name(PCP_ROLES_SLOT_STATE_BACKING_OFF),
      "backing_off");
  assert_string_equal(pcp_roles_slot_state_name(PCP_ROLES_SLOT_STATE_FAILED),
                      "failed");
  assert_true(pcp_roles_slot_state_has_child(PCP_ROLES_SLOT_STATE_STOPPING));
  assert_false(pcp_roles_slot_state_has_child(PCP_ROLES_SLOT_STATE_FAILED));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(defaults_are_documented_values),
      cmocka_unit_test(bad_options_are_rejected),
      cmocka_unit_test(staggered_start),
      cmocka_unit_test(late_poll_spawns_all_due),
      cmocka_unit_test(restart_with_exponential_backoff),
      cmocka_unit_test(jitter_spreads_delays),
      cmocka_unit_test(same_seed_same_delays),
      cmocka_unit_test(long_run_resets_backoff),
      cmocka_unit_test(crash_loop_cap_fails_slot),
      cmocka_unit_test(exits_outside_window_do_not_count),
      cmocka_unit_test(spawn_failures_hit_the_cap),
      cmocka_unit_test(zero_restarts_fail_at_first_exit),
      cmocka_unit_test(stop_terminates_then_kills),
      cmocka_unit_test(stop_cancels_pending_restart),
      cmocka_unit_test(stop_now_skips_the_grace_period),
      cmocka_unit_test(zero_grace_kills_next_poll),
      cmocka_unit_test(random_script_keeps_invariants),
      cmocka_unit_test(drain_fits_the_grace_period),
      cmocka_unit_test(state_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
