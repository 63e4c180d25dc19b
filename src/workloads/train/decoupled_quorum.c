// SPDX-License-Identifier: Apache-2.0
// Decoupled DiLoCo: quorum and grace selection, adaptive grace, and the
// round state machine (reference s.1.3). Time is always an argument.

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "workloads/train/decoupled.h"

static int arrival_compare(const void* pa, const void* pb) {
  const pcp_decoupled_arrival_t* a = pa;
  const pcp_decoupled_arrival_t* b = pb;
  if (a->arrival_ms != b->arrival_ms) {
    return a->arrival_ms < b->arrival_ms ? -1 : 1;
  }
  return a->learner_id < b->learner_id ? -1 : (a->learner_id > b->learner_id);
}

static bool id_listed(const uint32_t* ids, uint32_t count, uint32_t id) {
  for (uint32_t i = 0; i < count; ++i) {
    if (ids[i] == id)
      return true;
  }
  return false;
}

pcp_status_t pcp_decoupled_select(const pcp_decoupled_arrival_t* arrivals,
                                  uint32_t arrival_count,
                                  const uint32_t* active_ids,
                                  uint32_t active_count, uint32_t min_quorum,
                                  uint64_t grace_ms,
                                  pcp_decoupled_selection_t* out_selection) {
  memset(out_selection, 0, sizeof(*out_selection));
  if (min_quorum == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "min_quorum 0: must be >= 1");
  }
  if (arrival_count > 4u * PCP_DECOUPLED_MAX_LEARNERS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "%u arrivals in one round, limit %u", arrival_count,
                           4u * PCP_DECOUPLED_MAX_LEARNERS);
  }
  // Earliest update per learner, inactive learners skipped.
  pcp_decoupled_arrival_t firsts[PCP_DECOUPLED_MAX_LEARNERS];
  uint32_t first_count = 0;
  uint32_t skipped = 0;
  for (uint32_t k = 0; k < arrival_count; ++k) {
    const pcp_decoupled_arrival_t* a = &arrivals[k];
    uint32_t j = 0;
    while (j < first_count && firsts[j].learner_id != a->learner_id) ++j;
    if (j < first_count) {
      if (a->arrival_ms < firsts[j].arrival_ms)
        firsts[j] = *a;
      continue;
    }
    if (active_ids != NULL &&
        !id_listed(active_ids, active_count, a->learner_id)) {
      // Counted once per learner (a second update of the same inactive
      // learner lands here again, so look it up among the earlier ones).
      bool counted = false;
      for (uint32_t e = 0; e < k && !counted; ++e) {
        counted = arrivals[e].learner_id == a->learner_id;
      }
      if (!counted)
        ++skipped;
      continue;
    }
    if (first_count == PCP_DECOUPLED_MAX_LEARNERS) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "more than %u learners in one round",
                             PCP_DECOUPLED_MAX_LEARNERS);
    }
    firsts[first_count++] = *a;
  }
  if (first_count < min_quorum) {
    out_selection->skipped_count = skipped;
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "quorum not met: %u learner(s) reported, "
                           "min_quorum %u",
                           first_count, min_quorum);
  }
  qsort(firsts, first_count, sizeof(firsts[0]), arrival_compare);
  uint64_t quorum_wait = firsts[min_quorum - 1].arrival_ms;
  uint64_t deadline = quorum_wait + grace_ms;
  if (deadline < quorum_wait)
    deadline = UINT64_MAX;
  for (uint32_t k = 0; k < first_count; ++k) {
    if (firsts[k].arrival_ms <= deadline) {
      out_selection->participants[out_selection->participant_count++] =
          firsts[k].learner_id;
      if (firsts[k].arrival_ms > quorum_wait) {
        out_selection->grace_inclusion_count++;
      }
    } else {
      ++skipped;
    }
  }
  out_selection->skipped_count = skipped;
  out_selection->quorum_wait_ms = quorum_wait;
  out_selection->deadline_ms = deadline;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Adaptive grace
//===----------------------------------------------------------------------===//

void pcp_decoupled_ema_update(pcp_decoupled_ema_t* ema, double alpha,
                              double sample) {
  if (!ema->has_value) {
    ema->value = sample;
    ema->has_value = true;
    return;
  }
  ema->value = alpha * sample + (1.0 - alpha) * ema->value;
}

pcp_status_t pcp_decoupled_grace_config_check(
    const pcp_decoupled_grace_config_t* config) {
  if (!isfinite(config->gamma) || config->gamma < 0.0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "grace_gamma %g: must be finite and >= 0",
                           config->gamma);
  }
  if (config->max_grace_steps < 1) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "max_grace_steps 0: must be >= 1");
  }
  if (config->overlap_tau < 1) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "overlap_tau 0: must be >= 1");
  }
  if (!(config->ema_alpha > 0.0 && config->ema_alpha <= 1.0)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "timing_ema_alpha %g: must be in (0, 1]",
                           config->ema_alpha);
  }
  return pcp_ok_status();
}

uint64_t pcp_decoupled_grace_ms(const pcp_decoupled_grace_t* grace) {
  const pcp_decoupled_grace_config_t* c = &grace->config;
  if (!c->adaptive)
    return c->grace_window_ms;
  if (!grace->step_ema.has_value)
    return 0;
  double step = grace->step_ema.value;
  double spent =
      (grace->quorum_wait_ema.has_value ? grace->quorum_wait_ema.value : 0.0) +
      (grace->sync_send_ema.has_value ? grace->sync_send_ema.value : 0.0);
  double slack = (double)c->overlap_tau * step - spent;
  double cap = (double)c->max_grace_steps * step;
  double g = c->gamma * slack;
  if (cap < g)
    g = cap;
  if (!(g > 0.0) || !isfinite(g))
    return 0;
  return (uint64_t)floor(g);
}

void pcp_decoupled_grace_observe_step(pcp_decoupled_grace_t* grace,
                                      double step_ms) {
  pcp_decoupled_ema_update(&grace->step_ema, grace->config.ema_alpha, step_ms);
}
void pcp_decoupled_grace_observe_quorum_wait(pcp_decoupled_grace_t* grace,
                                             double wait_ms) {
  pcp_decoupled_ema_update(&grace->quorum_wait_ema, grace->config.ema_alpha,
                           wait_ms);
}
void pcp_decoupled_grace_observe_sync_send(pcp_decoupled_grace_t* grace,
                                           double send_ms) {
  pcp_decoupled_ema_update(&grace->sync_send_ema, grace->config.ema_alpha,
                           send_ms);
}

//===----------------------------------------------------------------------===//
// Round state machine
//===----------------------------------------------------------------------===//

pcp_status_t pcp_decoupled_round_open(uint64_t now_ms,
                                      const uint32_t* expected_ids,
                                      uint32_t expected_count,
                                      uint32_t min_quorum, uint64_t grace_ms,
                                      uint64_t collection_timeout_ms,
                                      pcp_decoupled_round_t* out_round) {
  memset(out_round, 0, sizeof(*out_round));
  if (expected_count > PCP_DECOUPLED_MAX_LEARNERS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "round of %u learners, limit %u", expected_count,
                           PCP_DECOUPLED_MAX_LEARNERS);
  }
  if (min_quorum == 0 || min_quorum > expected_count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "min_quorum %u: must be in [1, %u learners]",
                           min_quorum, expected_count);
  }
  if (collection_timeout_ms == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "collection timeout 0 ms: must be > 0");
  }
  for (uint32_t i = 0; i < expected_count; ++i) {
    if (id_listed(expected_ids, i, expected_ids[i])) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "learner %u listed twice in the round",
                             expected_ids[i]);
    }
    out_round->expected[i] = expected_ids[i];
  }
  out_round->state = PCP_DECOUPLED_ROUND_COLLECTING;
  out_round->opened_at_ms = now_ms;
  out_round->grace_ms = grace_ms;
  out_round->collection_timeout_ms = collection_timeout_ms;
  out_round->min_quorum = min_quorum;
  out_round->expected_count = expected_count;
  return pcp_ok_status();
}

static uint64_t sat_add(uint64_t a, uint64_t b) {
  uint64_t s = 0;
  return __builtin_add_overflow(a, b, &s) ? UINT64_MAX : s;
}

// Absolute time at which the round closes if nothing else arrives.
static uint64_t round_close_at(const pcp_decoupled_round_t* round) {
  if (round->arrival_count >= round->min_quorum) {
    // Arrivals are appended in time order (times never go backwards for
    // the driver), so the min_quorum-th arrival is the quorum.
    uint64_t quorum_wait = round->arrivals[round->min_quorum - 1].arrival_ms;
    return sat_add(sat_add(round->opened_at_ms, quorum_wait), round->grace_ms);
  }
  return sat_add(round->opened_at_ms, round->collection_timeout_ms);
}

static void round_close(pcp_decoupled_round_t* round, uint64_t now_ms) {
  round->closed_at_ms = now_ms;
  pcp_status_t status = pcp_decoupled_select(
      round->arrivals, round->arrival_count, NULL, 0, round->min_quorum,
      round->grace_ms, &round->selection);
  if (status != NULL) {
    pcp_status_ignore(status);
    round->state = PCP_DECOUPLED_ROUND_TIMED_OUT;
    return;
  }
  // Expected learners that never came are skipped too.
  round->selection.skipped_count +=
      round->expected_count - round->arrival_count;
  round->state = PCP_DECOUPLED_ROUND_CLOSED;
}

// Advances to |now_ms|. An arrival at exactly the deadline is inside the
// window (selection keeps arrival <= deadline), so the arrival path closes
// only once time is strictly past it; a bare poll at the deadline closes.
static pcp_decoupled_round_state_t round_advance(pcp_decoupled_round_t* round,
                                                 uint64_t now_ms,
                                                 bool arriving) {
  if (round->state != PCP_DECOUPLED_ROUND_COLLECTING) {
    return (pcp_decoupled_round_state_t)round->state;
  }
  bool everyone = round->arrival_count == round->expected_count;
  uint64_t close_at = round_close_at(round);
  if (everyone) {
    round_close(round, now_ms);
  } else if (arriving ? now_ms > close_at : now_ms >= close_at) {
    round_close(round, close_at);
  }
  return (pcp_decoupled_round_state_t)round->state;
}

pcp_decoupled_round_state_t pcp_decoupled_round_poll(
    pcp_decoupled_round_t* round, uint64_t now_ms) {
  return round_advance(round, now_ms, false);
}

void pcp_decoupled_round_arrive(pcp_decoupled_round_t* round,
                                uint32_t learner_id, uint64_t now_ms) {
  // Time passes first: an update landing after the deadline is late even
  // if nobody polled in between.
  if (round_advance(round, now_ms, true) != PCP_DECOUPLED_ROUND_COLLECTING) {
    round->late_count++;
    return;
  }
  if (!id_listed(round->expected, round->expected_count, learner_id)) {
    round->unexpected_count++;
    return;
  }
  for (uint32_t i = 0; i < round->arrival_count; ++i) {
    if (round->arrivals[i].learner_id == learner_id) {
      round->duplicate_count++;
      return;
    }
  }
  uint64_t at = now_ms > round->opened_at_ms ? now_ms - round->opened_at_ms : 0;
  if (round->arrival_count > 0 &&
      at < round->arrivals[round->arrival_count - 1].arrival_ms) {
    // Keep arrivals in time order for round_close_at.
    at = round->arrivals[round->arrival_count - 1].arrival_ms;
  }
  round->arrivals[round->arrival_count].learner_id = learner_id;
  round->arrivals[round->arrival_count].arrival_ms = at;
  round->arrival_count++;
  (void)pcp_decoupled_round_poll(round, now_ms);
}

uint64_t pcp_decoupled_round_next_deadline_ms(
    const pcp_decoupled_round_t* round) {
  if (round->state != PCP_DECOUPLED_ROUND_COLLECTING)
    return UINT64_MAX;
  return round_close_at(round);
}
