// SPDX-License-Identifier: Apache-2.0
// The decoupled DiLoCo fragment window of the topology simulator, derived
// from the real state machine (issue 17 Deliver 7). Every decision the
// library makes is the library's: the window is a pcp_decoupled_round_t
// (quorum, grace, early close, timeout, duplicates, late updates), the
// learners are pcp_decoupled_learner_t (their clocks, counters and merge
// weights), a commit is pcp_decoupled_syncer_record_sync onto a real
// pcp_decoupled_tape_t, failures, recoveries and applies are
// pcp_decoupled_syncer_record_event records, and the fragment of each step
// is pcp_decoupled_schedule_fragment_at's. A change in decoupled_quorum.c,
// decoupled_tape.c or decoupled_plan.c therefore changes what explore.c,
// models.c and the oracles see. What the model adds is the envelope a
// gateway checks before an update reaches the round (session, assignment,
// availability, payload, stale step, stale vector clock), cancellation, and
// the injected bugs.
//
// The model is a plain value with no _deinitialize (the explorers and tests
// create thousands on the stack), so the real structs allocate from an arena
// inside it (arena_ctl): nothing reaches the heap and nothing leaks.

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "topology/protocols_impl.h"

//===----------------------------------------------------------------------===//
// The inline arena
//===----------------------------------------------------------------------===//

// Each block starts with its size (16 bytes keep the payload aligned).
typedef struct arena_header_t {
  size_t byte_length;
  size_t reserved;
} arena_header_t;

static size_t round_up16(size_t n) {
  return (n + 15u) & ~(size_t)15u;
}

static bool arena_is_last(const pcp_topology_decoupled_t* d,
                          const arena_header_t* h) {
  const uint8_t* end = (const uint8_t*)(h + 1) + round_up16(h->byte_length);
  return end == d->arena + d->arena_used;
}

static void* arena_take(pcp_topology_decoupled_t* d, size_t byte_length) {
  size_t need = sizeof(arena_header_t) + round_up16(byte_length);
  if (byte_length > sizeof(d->arena) ||
      need > sizeof(d->arena) - d->arena_used) {
    return NULL;
  }
  arena_header_t* h = (arena_header_t*)(d->arena + d->arena_used);
  h->byte_length = byte_length;
  d->arena_used += need;
  return h + 1;
}

static pcp_status_t arena_ctl(void* self, pcp_allocator_command_t command,
                              const pcp_allocator_alloc_params_t* params,
                              void** inout_ptr) {
  pcp_topology_decoupled_t* d = (pcp_topology_decoupled_t*)self;
  arena_header_t* h =
      *inout_ptr ? (arena_header_t*)*inout_ptr - 1 : (arena_header_t*)NULL;
  void* result = NULL;
  switch (command) {
    case PCP_ALLOCATOR_COMMAND_FREE:
      // Only the newest block goes back (the tape frees a failed append's
      // copies); the rest is released with the model.
      if (h != NULL && arena_is_last(d, h)) {
        d->arena_used = (size_t)((uint8_t*)h - d->arena);
      }
      *inout_ptr = NULL;
      return pcp_ok_status();
    case PCP_ALLOCATOR_COMMAND_MALLOC:
    case PCP_ALLOCATOR_COMMAND_CALLOC:
      result = arena_take(d, params->byte_length);
      if (result)
        memset(result, 0, params->byte_length);
      break;
    case PCP_ALLOCATOR_COMMAND_REALLOC:
      if (h == NULL) {
        result = arena_take(d, params->byte_length);
        break;
      }
      if (params->byte_length <= h->byte_length) {
        result = *inout_ptr;
        break;
      }
      if (arena_is_last(d, h)) {
        size_t old_need = round_up16(h->byte_length);
        size_t new_need = round_up16(params->byte_length);
        if (new_need - old_need <= sizeof(d->arena) - d->arena_used) {
          d->arena_used += new_need - old_need;
          h->byte_length = params->byte_length;
          result = *inout_ptr;
        }
        break;
      }
      result = arena_take(d, params->byte_length);
      if (result)
        memcpy(result, *inout_ptr, h->byte_length);
      break;
  }
  if (result == NULL) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "decoupled model arena: %zu bytes, %zu of %zu used",
                           params->byte_length, d->arena_used,
                           sizeof(d->arena));
  }
  *inout_ptr = result;
  return pcp_ok_status();
}

static pcp_allocator_t model_allocator(pcp_topology_decoupled_t* d) {
  return (pcp_allocator_t){.self = d, .ctl = arena_ctl};
}

//===----------------------------------------------------------------------===//
// Glue
//===----------------------------------------------------------------------===//

// A real call failed: the model keeps the first message and the oracle
// reports REAL_ERROR (never a silent divergence from the machine).
static void real_fail(pcp_topology_decoupled_t* d, pcp_status_t status) {
  if (status == NULL)
    return;
  if (!d->real_error) {
    d->real_error = true;
    snprintf(d->real_error_message, sizeof(d->real_error_message), "%s",
             pcp_status_message(status));
  }
  pcp_status_ignore(status);
}

// Learner w is node w + 1 of the clocks and the tape (node 0 is the syncer).
static uint16_t node_of(uint32_t worker) {
  return (uint16_t)(worker + 1u);
}

uint64_t pcp_topology_decoupled_real_step(const pcp_topology_decoupled_t* d,
                                          uint32_t step) {
  return (uint64_t)step + d->schedule.sync_interval_h;
}

// Opens the round of the current step over every worker of the session (the
// configured membership: a crashed worker simply never arrives).
static void round_reopen(pcp_topology_decoupled_t* d) {
  uint32_t expected[PCP_TOPOLOGY_DECOUPLED_MAX_WORKERS];
  for (uint32_t w = 0; w < d->worker_count; ++w) expected[w] = w;
  uint32_t quorum = d->quorum;
  if (d->bug_quorum_off_by_one && quorum > 1)
    --quorum;
  // The configured quorum is checked by
  // pcp_topology_decoupled_quorum_validate; a bad one here (0, or above the
  // workers) is the round's INVALID_ARGUMENT, kept as a real error.
  d->round_quorum = quorum;
  real_fail(
      d, pcp_decoupled_round_open(d->now_ms, expected, d->worker_count, quorum,
                                  pcp_decoupled_grace_ms(&d->grace),
                                  PCP_TOPOLOGY_DECOUPLED_WINDOW_MS, &d->round));
}

static bool round_has(const pcp_decoupled_round_t* round, uint32_t worker) {
  for (uint32_t i = 0; i < round->arrival_count; ++i) {
    if (round->arrivals[i].learner_id == worker)
      return true;
  }
  return false;
}

// The projections the explorers and tests read.
static void project(pcp_topology_decoupled_t* d) {
  d->accepted_mask = 0;
  for (uint32_t i = 0; i < d->round.arrival_count; ++i) {
    uint32_t id = d->round.arrivals[i].learner_id;
    if (id < 64)
      d->accepted_mask |= 1ull << id;
  }
  d->syncer_clock = pcp_decoupled_clock_get(&d->syncer.clock, 0);
  memset(&d->vector_clock, 0, sizeof(d->vector_clock));
  for (uint32_t w = 0; w < d->worker_count; ++w) {
    d->clock[w] = pcp_decoupled_clock_get(&d->learners[w].clock, node_of(w));
    d->known_clock[w] = pcp_decoupled_clock_get(&d->view, node_of(w));
    if (w < PCP_TOPOLOGY_VECTOR_CLOCK_SYNCER) {
      d->vector_clock.counters[w] = d->known_clock[w];
    }
  }
  d->vector_clock.counters[PCP_TOPOLOGY_VECTOR_CLOCK_SYNCER] =
      pcp_decoupled_clock_get(&d->view, 0);
}

// A record other than a sync, through the syncer's live path.
static void record(pcp_topology_decoupled_t* d, pcp_decoupled_event_kind_t kind,
                   uint32_t worker, uint32_t fragment, uint64_t syncer_step) {
  pcp_decoupled_event_t e;
  memset(&e, 0, sizeof(e));
  e.kind = kind;
  e.learner_id = node_of(worker);
  e.fragment_id = fragment;
  e.syncer_step = syncer_step;
  real_fail(d,
            pcp_decoupled_syncer_record_event(&d->syncer, &d->real_tape, &e));
}

// A learner coming back gets what the library's recovery plan gives it
// (pcp_decoupled_recovery_plan_initialize with it as the one live learner,
// over the live syncer state): the newest version of each listed fragment,
// applied and recorded. A learner the tape marked FAILED gets a full
// resync. Without this a learner that missed a sync while down and then
// applied a later one would look up to date to a restarted syncer (its
// observed step is the newest it applied), which the recovery oracle
// catches.
static void rejoin(pcp_topology_decoupled_t* d, uint32_t worker) {
  pcp_decoupled_live_learner_t live = {
      .learner_id = node_of(worker),
      .observed_global_step = d->learners[worker].observed_global_step};
  pcp_decoupled_recovery_plan_t plan;
  pcp_status_t status = pcp_decoupled_recovery_plan_initialize(
      pcp_allocator_system(), &d->syncer, &d->real_tape, &live, 1,
      PCP_TOPOLOGY_DECOUPLED_RECOVERY_STEPS, &plan);
  if (status != NULL) {
    real_fail(d, status);
    return;
  }
  for (uint32_t k = 0; k < plan.action_count; ++k) {
    const pcp_decoupled_recovery_action_t* a = &plan.actions[k];
    if (a->learner_id != live.learner_id ||
        (a->kind != PCP_DECOUPLED_RECOVERY_CATCH_UP &&
         a->kind != PCP_DECOUPLED_RECOVERY_FULL_RESYNC)) {
      continue;
    }
    for (uint32_t f = 0; f < a->fragment_count; ++f) {
      uint32_t fragment = a->fragments[f];
      uint64_t step = fragment < d->syncer.fragment_count
                          ? d->syncer.fragment_last_step[fragment]
                          : 0;
      if (step == 0)
        continue;  // never synced: the learner's copy is the start value
      real_fail(d, pcp_decoupled_learner_apply_fragment(&d->learners[worker],
                                                        fragment, step));
      record(d, PCP_DECOUPLED_EVENT_LEARNER_APPLY, worker, fragment, step);
    }
  }
  pcp_decoupled_recovery_plan_deinitialize(&plan);
}

static void mark_online(pcp_topology_decoupled_t* d, uint32_t worker) {
  if (!d->online[worker]) {
    rejoin(d, worker);
    record(d, PCP_DECOUPLED_EVENT_LEARNER_RECOVERY, worker, 0,
           d->syncer.global_step);
  }
  d->online[worker] = true;
}

// Next step: the schedule names its fragment; a new round opens.
static void advance(pcp_topology_decoupled_t* d) {
  d->step++;
  uint32_t fragment = 0;
  if (pcp_decoupled_schedule_fragment_at(
          &d->schedule, pcp_topology_decoupled_real_step(d, d->step),
          &fragment)) {
    d->fragment = fragment;
  }
  d->extra_accepted = 0;
  round_reopen(d);
}

// Commits the learners |ids| (model worker ids) for the current step: the
// real record (participants with their counters and merge weights), the
// projection tape entry, then every live learner applies the fragment.
static void commit(pcp_topology_decoupled_t* d, const uint32_t* ids,
                   uint32_t count) {
  uint64_t step = pcp_topology_decoupled_real_step(d, d->step);
  pcp_decoupled_participant_t parts[PCP_TOPOLOGY_DECOUPLED_MAX_WORKERS];
  uint64_t tokens = 0;
  uint32_t n = 0;
  for (uint32_t i = 0; i < count && n < PCP_TOPOLOGY_DECOUPLED_MAX_WORKERS;
       ++i) {
    uint32_t w = ids[i];
    if (w >= d->worker_count)
      continue;
    const pcp_decoupled_learner_t* l = &d->learners[w];
    uint64_t steps_since = l->steps_since ? l->steps_since[d->fragment] : 0;
    uint64_t tokens_since = l->tokens_since ? l->tokens_since[d->fragment] : 0;
    parts[n++] = (pcp_decoupled_participant_t){
        .learner_id = node_of(w),
        .learner_step = l->learner_step,
        .steps_since = steps_since,
        .tokens_since = tokens_since,
        .merge_weight = pcp_decoupled_merge_weight(tokens_since, steps_since)};
    tokens += tokens_since;
  }
  pcp_status_t status = pcp_decoupled_syncer_record_sync(
      &d->syncer, &d->real_tape, step, d->fragment, parts, n);
  if (status == NULL) {
    d->tape_entries++;
    // The projection (a full one stops recording, never the merge).
    pcp_topology_tape_entry_t entry;
    memset(&entry, 0, sizeof(entry));
    entry.kind = PCP_TOPOLOGY_TAPE_FRAGMENT_SYNC;
    entry.step = d->step;
    entry.fragment = d->fragment;
    entry.merge_weight = tokens ? tokens : 1;
    entry.participants = n + d->extra_accepted;
    pcp_status_ignore(pcp_topology_event_tape_append(&d->tape, &entry));
    real_fail(d,
              pcp_decoupled_clock_observe(
                  &d->view, 0, pcp_decoupled_clock_get(&d->syncer.clock, 0)));
    for (uint32_t w = 0; w < d->worker_count; ++w) {
      if (!d->online[w])
        continue;
      real_fail(d, pcp_decoupled_learner_apply_fragment(&d->learners[w],
                                                        d->fragment, step));
      record(d, PCP_DECOUPLED_EVENT_LEARNER_APPLY, w, d->fragment, step);
    }
  } else {
    real_fail(d, status);
  }
  advance(d);
  d->decision = PCP_TOPOLOGY_DECOUPLED_MERGE_COMMITTED;
}

//===----------------------------------------------------------------------===//
// The model's API
//===----------------------------------------------------------------------===//

void pcp_topology_decoupled_initialize(uint32_t session, uint32_t worker_count,
                                       uint32_t quorum, uint32_t fragments,
                                       pcp_topology_decoupled_t* out) {
  // Everything but the arena's bytes (a third of the model; arena_ctl
  // zeroes what it hands out), since explorers build thousands of models.
  memset(out, 0, offsetof(pcp_topology_decoupled_t, arena));
  out->session = session;
  out->worker_count = worker_count > PCP_TOPOLOGY_DECOUPLED_MAX_WORKERS
                          ? PCP_TOPOLOGY_DECOUPLED_MAX_WORKERS
                          : worker_count;
  out->quorum = quorum;
  out->fragment_count = fragments ? fragments : 1;
  if (out->fragment_count > PCP_DECOUPLED_MAX_FRAGMENTS) {
    out->fragment_count = PCP_DECOUPLED_MAX_FRAGMENTS;
  }
  for (uint32_t i = 0; i < out->worker_count; ++i) out->online[i] = true;
  // P = H: every step syncs one fragment, in turn; overlap_tau 1.
  out->schedule =
      (pcp_decoupled_schedule_t){.fragment_count = out->fragment_count,
                                 .sync_interval_h = out->fragment_count,
                                 .overlap_tau = 1};
  out->grace.config = (pcp_decoupled_grace_config_t){
      .grace_window_ms = PCP_TOPOLOGY_DECOUPLED_WINDOW_MS,
      .adaptive = false,
      .gamma = 1.0,
      .max_grace_steps = 1,
      .overlap_tau = 1,
      .ema_alpha = 0.125};
  pcp_allocator_t allocator = model_allocator(out);
  pcp_decoupled_clock_initialize(&out->view);
  for (uint32_t w = 0; w < out->worker_count; ++w) {
    real_fail(out, pcp_decoupled_learner_initialize(allocator, node_of(w),
                                                    out->fragment_count,
                                                    &out->learners[w]));
  }
  real_fail(out, pcp_decoupled_syncer_state_initialize(
                     allocator, out->fragment_count, &out->syncer));
  pcp_decoupled_tape_initialize(allocator, &out->real_tape);
  uint32_t fragment = 0;
  if (pcp_decoupled_schedule_fragment_at(
          &out->schedule, pcp_topology_decoupled_real_step(out, 0),
          &fragment)) {
    out->fragment = fragment;
  }
  round_reopen(out);
  project(out);
}

void pcp_topology_decoupled_set_grace(pcp_topology_decoupled_t* d,
                                      uint64_t grace_ms) {
  d->grace.config.grace_window_ms = grace_ms;
  if (d->round.state == PCP_DECOUPLED_ROUND_COLLECTING &&
      d->round.arrival_count == 0) {
    round_reopen(d);
  }
}

pcp_status_t pcp_topology_decoupled_set_adaptive_grace(
    pcp_topology_decoupled_t* d, double gamma, uint32_t max_grace_steps,
    uint32_t overlap_tau) {
  pcp_decoupled_grace_config_t config = d->grace.config;
  config.adaptive = true;
  config.gamma = gamma;
  config.max_grace_steps = max_grace_steps;
  config.overlap_tau = overlap_tau;
  PCP_RETURN_IF_ERROR_BARE(pcp_decoupled_grace_config_check(&config));
  d->grace.config = config;
  if (d->round.state == PCP_DECOUPLED_ROUND_COLLECTING &&
      d->round.arrival_count == 0) {
    round_reopen(d);
  }
  return pcp_ok_status();
}

void pcp_topology_decoupled_set_bug_quorum_off_by_one(
    pcp_topology_decoupled_t* d, bool inject) {
  d->bug_quorum_off_by_one = inject;
  if (d->round.state == PCP_DECOUPLED_ROUND_COLLECTING &&
      d->round.arrival_count == 0) {
    round_reopen(d);
  }
}

void pcp_topology_decoupled_observe_metadata(pcp_topology_decoupled_t* d,
                                             uint32_t worker, uint64_t clock) {
  if (worker >= d->worker_count)
    return;
  real_fail(d, pcp_decoupled_clock_observe(&d->view, node_of(worker), clock));
  project(d);
}

// An update reaching the syncer: the envelope first (the checks in the
// upstream order), then the real round decides.
static void submit(pcp_topology_decoupled_t* d,
                   const pcp_topology_decoupled_action_t* a) {
  uint32_t w = a->worker;
  pcp_topology_decoupled_violation_t v = PCP_TOPOLOGY_DECOUPLED_VIOLATION_NONE;
  if (d->canceled) {
    v = PCP_TOPOLOGY_DECOUPLED_VIOLATION_POST_CANCEL_UPDATE;
  } else if (w >= d->worker_count) {
    v = PCP_TOPOLOGY_DECOUPLED_VIOLATION_INVALID_WORKER;
  } else if (!d->online[w]) {
    v = PCP_TOPOLOGY_DECOUPLED_VIOLATION_UNAVAILABLE_WORKER;
  } else if (!d->assigned[w]) {
    v = PCP_TOPOLOGY_DECOUPLED_VIOLATION_UNASSIGNED_WORKER;
  } else if (a->session != d->session) {
    v = PCP_TOPOLOGY_DECOUPLED_VIOLATION_INVALID_SESSION;
  } else if (a->payload_mismatch) {
    v = PCP_TOPOLOGY_DECOUPLED_VIOLATION_CONTEXT_PAYLOAD_MISMATCH;
  } else if (a->fragment != d->fragment || a->step != d->step) {
    v = PCP_TOPOLOGY_DECOUPLED_VIOLATION_STALE_UPDATE;
  } else if (a->clock < pcp_decoupled_clock_get(&d->view, node_of(w)) &&
             !d->bug_accept_stale_clock) {
    v = PCP_TOPOLOGY_DECOUPLED_VIOLATION_STALE_VECTOR_CLOCK;
  }
  if (v != PCP_TOPOLOGY_DECOUPLED_VIOLATION_NONE) {
    d->violation = v;
    d->decision = PCP_TOPOLOGY_DECOUPLED_UPDATE_REJECTED;
    return;
  }
  if (d->bug_count_duplicates && round_has(&d->round, w)) {
    // The duplicate-quorum bug: a repeated sender counts again.
    d->extra_accepted++;
    d->decision = PCP_TOPOLOGY_DECOUPLED_UPDATE_ACCEPTED;
    return;
  }
  pcp_decoupled_round_t* round = &d->round;
  uint32_t arrivals = round->arrival_count;
  uint32_t duplicates = round->duplicate_count;
  uint32_t late = round->late_count;
  pcp_decoupled_round_arrive(round, w, d->now_ms);
  if (round->arrival_count > arrivals) {
    // The syncer observes the learner's clock with its update.
    real_fail(d, pcp_decoupled_clock_observe(&d->view, node_of(w), a->clock));
    d->decision = PCP_TOPOLOGY_DECOUPLED_UPDATE_ACCEPTED;
    return;
  }
  if (round->duplicate_count > duplicates) {
    v = PCP_TOPOLOGY_DECOUPLED_VIOLATION_DUPLICATE_UPDATE;
  } else if (round->late_count > late) {
    // After the close: a second update of a participant is still a
    // duplicate; anyone else's came too late for this step.
    d->late_updates++;
    v = round_has(round, w) ? PCP_TOPOLOGY_DECOUPLED_VIOLATION_DUPLICATE_UPDATE
                            : PCP_TOPOLOGY_DECOUPLED_VIOLATION_STALE_UPDATE;
  } else {
    v = PCP_TOPOLOGY_DECOUPLED_VIOLATION_INVALID_WORKER;  // not expected
  }
  d->violation = v;
  d->decision = PCP_TOPOLOGY_DECOUPLED_UPDATE_REJECTED;
}

// The window's end: time jumps to the round's deadline and the round says
// whether it closed (commit its selection) or timed out (the step is
// skipped, as the service skips it).
static void timeout_window(pcp_topology_decoupled_t* d) {
  if (d->canceled) {
    d->decision = PCP_TOPOLOGY_DECOUPLED_CANCELED;
    return;
  }
  pcp_decoupled_round_t* round = &d->round;
  if (d->bug_count_duplicates && d->extra_accepted > 0 &&
      round->state == PCP_DECOUPLED_ROUND_COLLECTING) {
    uint32_t counted = round->arrival_count + d->extra_accepted;
    if (counted >= d->quorum) {
      uint32_t ids[PCP_TOPOLOGY_DECOUPLED_MAX_WORKERS];
      uint32_t n = 0;
      for (uint32_t i = 0; i < round->arrival_count && n < PCP_ARRAYSIZE(ids);
           ++i) {
        ids[n++] = round->arrivals[i].learner_id;
      }
      commit(d, ids, n);
      return;
    }
  }
  d->extra_accepted = 0;
  uint64_t deadline = pcp_decoupled_round_next_deadline_ms(round);
  if (deadline != UINT64_MAX && deadline > d->now_ms)
    d->now_ms = deadline;
  pcp_decoupled_round_state_t state =
      pcp_decoupled_round_poll(round, d->now_ms);
  if (state == PCP_DECOUPLED_ROUND_CLOSED) {
    // The quorum wait as the library measures it: from the round's open
    // (selection times are relative to it), before the next round opens
    // with the grace it gives.
    pcp_decoupled_grace_observe_quorum_wait(
        &d->grace, (double)round->selection.quorum_wait_ms);
    commit(d, round->selection.participants,
           round->selection.participant_count);
    return;
  }
  advance(d);
  d->decision = PCP_TOPOLOGY_DECOUPLED_MERGE_DEFERRED;
}

void pcp_topology_decoupled_apply(pcp_topology_decoupled_t* d,
                                  const pcp_topology_decoupled_action_t* a) {
  d->violation = PCP_TOPOLOGY_DECOUPLED_VIOLATION_NONE;
  d->now_ms += PCP_TOPOLOGY_DECOUPLED_TICK_MS;
  uint32_t w = a->worker;
  bool valid_worker = w < d->worker_count;
  switch (a->kind) {
    case PCP_TOPOLOGY_DECOUPLED_ASSIGN:
      if (!valid_worker)
        break;
      d->assigned[w] = true;
      d->last_step_ms[w] = d->now_ms;
      d->decision = PCP_TOPOLOGY_DECOUPLED_ASSIGNED;
      project(d);
      return;
    case PCP_TOPOLOGY_DECOUPLED_LOCAL_STEP_COMPLETE:
      if (!valid_worker || !d->assigned[w] || !d->online[w])
        break;
      pcp_decoupled_learner_record_step(&d->learners[w], 8);
      d->tokens[w] += 8;
      pcp_decoupled_grace_observe_step(
          &d->grace, (double)(d->now_ms - d->last_step_ms[w]));
      d->last_step_ms[w] = d->now_ms;
      // The learner reports each completed local step with its clock
      // (DecoupledLearnerMetadata) and the syncer observes it, so an update
      // that carries an older clock afterwards is stale.
      real_fail(
          d, pcp_decoupled_clock_observe(
                 &d->view, node_of(w),
                 pcp_decoupled_clock_get(&d->learners[w].clock, node_of(w))));
      d->decision = PCP_TOPOLOGY_DECOUPLED_LOCAL_STEP;
      project(d);
      return;
    case PCP_TOPOLOGY_DECOUPLED_SUBMIT:
      submit(d, a);
      project(d);
      return;
    case PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW:
      timeout_window(d);
      project(d);
      return;
    case PCP_TOPOLOGY_DECOUPLED_CANCEL_SESSION:
      if (!d->canceled)
        d->canceled_at_sync = d->tape_entries;
      d->canceled = true;
      d->decision = PCP_TOPOLOGY_DECOUPLED_CANCELED;
      project(d);
      return;
    case PCP_TOPOLOGY_DECOUPLED_CRASH:
      if (!valid_worker)
        break;
      if (d->online[w]) {
        record(d, PCP_DECOUPLED_EVENT_LEARNER_FAILURE, w, 0,
               d->syncer.global_step);
      }
      d->online[w] = false;
      d->decision = PCP_TOPOLOGY_DECOUPLED_WORKER_LOST;
      project(d);
      return;
    case PCP_TOPOLOGY_DECOUPLED_RESTART:
      if (!valid_worker)
        break;
      mark_online(d, w);
      d->decision = PCP_TOPOLOGY_DECOUPLED_RESUMABLE;
      project(d);
      return;
    case PCP_TOPOLOGY_DECOUPLED_FORCE_COMMIT: {
      // The injected bug: commit what arrived, whatever the round says.
      pcp_decoupled_round_t* round = &d->round;
      if (round->arrival_count < d->quorum) {
        d->violation = PCP_TOPOLOGY_DECOUPLED_VIOLATION_BELOW_QUORUM_COMMIT;
      } else if (d->canceled) {
        d->violation = PCP_TOPOLOGY_DECOUPLED_VIOLATION_POST_CANCEL_UPDATE;
      }
      uint32_t ids[PCP_TOPOLOGY_DECOUPLED_MAX_WORKERS];
      uint32_t n = 0;
      for (uint32_t i = 0; i < round->arrival_count && n < PCP_ARRAYSIZE(ids);
           ++i) {
        ids[n++] = round->arrivals[i].learner_id;
      }
      commit(d, ids, n);
      project(d);
      return;
    }
  }
  d->violation = PCP_TOPOLOGY_DECOUPLED_VIOLATION_INVALID_WORKER;
  d->decision = PCP_TOPOLOGY_DECOUPLED_UPDATE_REJECTED;
  project(d);
}

void pcp_topology_decoupled_resume(pcp_topology_decoupled_t* d, uint32_t worker,
                                   uint32_t session) {
  d->violation = PCP_TOPOLOGY_DECOUPLED_VIOLATION_NONE;
  if (worker >= d->worker_count) {
    d->violation = PCP_TOPOLOGY_DECOUPLED_VIOLATION_INVALID_WORKER;
    return;
  }
  if (session != d->session) {
    // A restarted worker that comes back with another session's state must
    // not rejoin this window.
    d->violation = PCP_TOPOLOGY_DECOUPLED_VIOLATION_INCOMPATIBLE_RESUME;
    d->decision = PCP_TOPOLOGY_DECOUPLED_UPDATE_REJECTED;
    return;
  }
  mark_online(d, worker);
  d->decision = PCP_TOPOLOGY_DECOUPLED_RESUMABLE;
  project(d);
}

//===----------------------------------------------------------------------===//
// The RDA merge the model publishes: the library's
//===----------------------------------------------------------------------===//

bool pcp_topology_rda_merge_real(const pcp_topology_rda_update_t* updates,
                                 size_t update_count, size_t dimension,
                                 double* out) {
  if (dimension > PCP_TOPOLOGY_RDA_MAX_DIMENSION ||
      update_count > PCP_TOPOLOGY_MERGE_MAX_UPDATES) {
    return false;
  }
  float zero[PCP_TOPOLOGY_RDA_MAX_DIMENSION] = {0};
  float values[PCP_TOPOLOGY_MERGE_MAX_UPDATES][PCP_TOPOLOGY_RDA_MAX_DIMENSION];
  const float* rows[PCP_TOPOLOGY_MERGE_MAX_UPDATES];
  double weights[PCP_TOPOLOGY_MERGE_MAX_UPDATES];
  for (size_t k = 0; k < update_count; ++k) {
    // The learner sends parameters; global - learner is its outer gradient.
    for (size_t i = 0; i < dimension; ++i) {
      values[k][i] = -(float)updates[k].values[i];
    }
    rows[k] = values[k];
    weights[k] =
        pcp_decoupled_merge_weight(updates[k].tokens, updates[k].steps);
  }
  float merged[PCP_TOPOLOGY_RDA_MAX_DIMENSION] = {0};
  pcp_decoupled_merge_stats_t stats;
  pcp_status_t status = pcp_decoupled_merge_tensor(
      PCP_DECOUPLED_MERGE_RDA, zero, rows, weights, (uint32_t)update_count,
      dimension, merged, &stats);
  if (status != NULL) {
    pcp_status_ignore(status);
    return false;
  }
  for (size_t i = 0; i < dimension; ++i) out[i] = (double)merged[i];
  return true;
}

//===----------------------------------------------------------------------===//
// Oracles over the real state
//===----------------------------------------------------------------------===//

const char* pcp_topology_decoupled_oracle_name(
    pcp_topology_decoupled_oracle_t oracle) {
  switch (oracle) {
    case PCP_TOPOLOGY_DECOUPLED_ORACLE_OK:
      return "ok";
    case PCP_TOPOLOGY_DECOUPLED_ORACLE_BELOW_QUORUM:
      return "below_quorum";
    case PCP_TOPOLOGY_DECOUPLED_ORACLE_DUPLICATE_MERGE:
      return "duplicate_merge";
    case PCP_TOPOLOGY_DECOUPLED_ORACLE_REPLAY_MISMATCH:
      return "replay_mismatch";
    case PCP_TOPOLOGY_DECOUPLED_ORACLE_CLOCK_REGRESSION:
      return "clock_regression";
    case PCP_TOPOLOGY_DECOUPLED_ORACLE_POST_CANCEL_SYNC:
      return "post_cancel_sync";
    case PCP_TOPOLOGY_DECOUPLED_ORACLE_REAL_ERROR:
      return "real_error";
    case PCP_TOPOLOGY_DECOUPLED_ORACLE_RECOVERY_MISSES_FRAGMENT:
      return "recovery_misses_fragment";
  }
  return "?";
}

static uint64_t event_syncer_counter(const pcp_decoupled_event_t* e) {
  for (uint32_t i = 0; i < e->clock_entry_count; ++i) {
    if (e->clock_entries[i].node_id == 0)
      return e->clock_entries[i].counter;
  }
  return 0;
}

// Whether learner node |node| applied |fragment| from |step| (a
// LEARNER_APPLY record), read from the tape, not from the learner.
static bool applied(const pcp_decoupled_tape_t* tape, uint32_t node,
                    uint32_t fragment, uint64_t step) {
  for (uint64_t i = 0; i < tape->count; ++i) {
    const pcp_decoupled_event_t* e = &tape->events[i];
    if (e->kind == PCP_DECOUPLED_EVENT_LEARNER_APPLY && e->learner_id == node &&
        e->fragment_id == fragment && e->syncer_step == step) {
      return true;
    }
  }
  return false;
}

// Whether learner |node| missed the sync |e| for good: it never applied it
// nor a later sync of the same fragment.
static bool missed(const pcp_decoupled_tape_t* tape, uint32_t node,
                   uint64_t index) {
  const pcp_decoupled_event_t* e = &tape->events[index];
  for (uint64_t j = index; j < tape->count; ++j) {
    const pcp_decoupled_event_t* s = &tape->events[j];
    if (s->kind == PCP_DECOUPLED_EVENT_FRAGMENT_SYNC &&
        s->fragment_id == e->fragment_id &&
        applied(tape, node, s->fragment_id, s->syncer_step)) {
      return false;
    }
  }
  return true;
}

// The recovery oracle on a syncer restarted from |replayed|: each online
// learner's action must cover every fragment it missed (what the tape's
// sync and apply records say, not the plan's own reasoning), and no live
// learner may be marked failed.
static bool recovery_covers(const pcp_topology_decoupled_t* d,
                            const pcp_decoupled_syncer_state_t* replayed,
                            pcp_allocator_t allocator) {
  pcp_decoupled_live_learner_t live[PCP_TOPOLOGY_DECOUPLED_MAX_WORKERS];
  uint32_t live_count = 0;
  for (uint32_t w = 0; w < d->worker_count; ++w) {
    if (d->online[w]) {
      live[live_count++] = (pcp_decoupled_live_learner_t){
          .learner_id = node_of(w),
          .observed_global_step = d->learners[w].observed_global_step};
    }
  }
  pcp_decoupled_recovery_plan_t plan;
  pcp_status_t status = pcp_decoupled_recovery_plan_initialize(
      allocator, replayed, &d->real_tape, live, live_count,
      PCP_TOPOLOGY_DECOUPLED_RECOVERY_STEPS, &plan);
  if (status != NULL) {
    pcp_status_ignore(status);
    return false;
  }
  bool ok = true;
  for (uint32_t k = 0; k < plan.action_count && ok; ++k) {
    const pcp_decoupled_recovery_action_t* a = &plan.actions[k];
    if (a->kind == PCP_DECOUPLED_RECOVERY_MARK_FAILED) {
      uint32_t w = a->learner_id - 1u;
      ok = a->learner_id == 0 || w >= d->worker_count || !d->online[w];
      continue;
    }
    if (a->kind != PCP_DECOUPLED_RECOVERY_RESUME &&
        a->kind != PCP_DECOUPLED_RECOVERY_CATCH_UP) {
      continue;  // a full resync or a re-pull sends everything again
    }
    for (uint64_t i = 0; i < d->real_tape.count && ok; ++i) {
      const pcp_decoupled_event_t* e = &d->real_tape.events[i];
      if (e->kind != PCP_DECOUPLED_EVENT_FRAGMENT_SYNC ||
          !missed(&d->real_tape, a->learner_id, i)) {
        continue;
      }
      bool sent = false;
      for (uint32_t f = 0; f < a->fragment_count; ++f) {
        sent |= a->fragments[f] == e->fragment_id;
      }
      ok = sent;
    }
  }
  pcp_decoupled_recovery_plan_deinitialize(&plan);
  return ok;
}

pcp_topology_decoupled_oracle_t pcp_topology_decoupled_check(
    const pcp_topology_decoupled_t* d, pcp_allocator_t allocator) {
  if (d->real_error)
    return PCP_TOPOLOGY_DECOUPLED_ORACLE_REAL_ERROR;
  uint64_t previous = 0;
  uint32_t syncs = 0;
  for (uint64_t i = 0; i < d->real_tape.count; ++i) {
    const pcp_decoupled_event_t* e = &d->real_tape.events[i];
    if (e->kind != PCP_DECOUPLED_EVENT_FRAGMENT_SYNC)
      continue;
    ++syncs;
    for (uint32_t p = 0; p < e->participant_count; ++p) {
      for (uint32_t q = p + 1; q < e->participant_count; ++q) {
        if (e->participants[p].learner_id == e->participants[q].learner_id) {
          return PCP_TOPOLOGY_DECOUPLED_ORACLE_DUPLICATE_MERGE;
        }
      }
    }
    if (e->participant_count < d->quorum)
      return PCP_TOPOLOGY_DECOUPLED_ORACLE_BELOW_QUORUM;
    uint64_t counter = event_syncer_counter(e);
    if (counter != previous + 1)
      return PCP_TOPOLOGY_DECOUPLED_ORACLE_CLOCK_REGRESSION;
    previous = counter;
    if (d->canceled && syncs > d->canceled_at_sync)
      return PCP_TOPOLOGY_DECOUPLED_ORACLE_POST_CANCEL_SYNC;
  }
  // Replay equals live: the tape alone rebuilds the syncer's state.
  pcp_decoupled_syncer_state_t* replayed = NULL;
  pcp_status_t status =
      pcp_allocator_malloc(allocator, sizeof(*replayed), (void**)&replayed);
  if (status != NULL) {
    pcp_status_ignore(status);
    return PCP_TOPOLOGY_DECOUPLED_ORACLE_REAL_ERROR;
  }
  status = pcp_decoupled_syncer_state_replay(allocator, d->fragment_count,
                                             &d->real_tape, replayed);
  bool equal =
      status == NULL && pcp_decoupled_syncer_state_equal(replayed, &d->syncer);
  pcp_status_ignore(status);
  bool covered = equal && recovery_covers(d, replayed, allocator);
  pcp_decoupled_syncer_state_deinitialize(replayed);
  pcp_allocator_free(allocator, replayed);
  if (!equal)
    return PCP_TOPOLOGY_DECOUPLED_ORACLE_REPLAY_MISMATCH;
  return covered ? PCP_TOPOLOGY_DECOUPLED_ORACLE_OK
                 : PCP_TOPOLOGY_DECOUPLED_ORACLE_RECOVERY_MISSES_FRAGMENT;
}
