// SPDX-License-Identifier: Apache-2.0
// The supervision policy (supervision_impl.h): pure state, no I/O.

#include <errno.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "roles/nodemgr/supervision_impl.h"

struct pcp_roles_supervision_t {
  pcp_allocator_t allocator;
  pcp_roles_supervision_options_t options;
  pcp_rng_t* rng;  // borrowed
  bool stopping;
  uint32_t slot_count;
  pcp_roles_slot_t slots[];
};

pcp_roles_supervision_options_t pcp_roles_supervision_options_default(void) {
  pcp_roles_supervision_options_t options = {
      .slot_count = 1,
      .stagger_ms = 200,
      .running_after_ms = 1000,
      .restart_min_ms = 1000,
      .restart_max_ms = 30000,
      .restart_multiplier = 2.0,
      .reset_after_ms = 60000,
      .crash_loop_restarts = 5,
      .crash_loop_window_ms = 60000,
      .stop_grace_ms = 10000,
  };
  return options;
}

pcp_status_t pcp_roles_supervision_options_check(
    const pcp_roles_supervision_options_t* options) {
#define CHECK(cond, field)                                                    \
  if (!(cond)) {                                                              \
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,                       \
                           "supervision option '%s' out of range: %s", field, \
                           #cond);                                            \
  }
  CHECK(options->slot_count >= 1 &&
            options->slot_count <= PCP_ROLES_SUPERVISION_MAX_SLOTS,
        "slot_count");
  CHECK(options->stagger_ms >= 0, "stagger_ms");
  CHECK(options->running_after_ms >= 0, "running_after_ms");
  CHECK(options->restart_min_ms >= 0, "restart_min_ms");
  CHECK(options->restart_max_ms >= options->restart_min_ms, "restart_max_ms");
  CHECK(isfinite(options->restart_multiplier) &&
            options->restart_multiplier >= 1.0,
        "restart_multiplier");
  CHECK(options->reset_after_ms >= 0, "reset_after_ms");
  CHECK(options->crash_loop_restarts <=
            PCP_ROLES_SUPERVISION_MAX_CRASH_LOOP_RESTARTS,
        "crash_loop_restarts");
  CHECK(options->crash_loop_window_ms > 0, "crash_loop_window_ms");
  CHECK(options->stop_grace_ms >= 0, "stop_grace_ms");
  // Deadlines are now + these: keep the sums far from overflow.
  const int64_t kMaxMs = INT64_C(1) << 50;
  CHECK(options->stagger_ms * (int64_t)options->slot_count < kMaxMs &&
            options->running_after_ms < kMaxMs &&
            options->restart_max_ms < kMaxMs &&
            options->stop_grace_ms < kMaxMs &&
            options->crash_loop_window_ms < kMaxMs,
        "times");
#undef CHECK
  return pcp_ok_status();
}

const char* pcp_roles_slot_state_name(pcp_roles_slot_state_t state) {
  switch (state) {
    case PCP_ROLES_SLOT_STATE_PENDING:
      return "pending";
    case PCP_ROLES_SLOT_STATE_STARTING:
      return "starting";
    case PCP_ROLES_SLOT_STATE_RUNNING:
      return "running";
    case PCP_ROLES_SLOT_STATE_BACKING_OFF:
      return "backing_off";
    case PCP_ROLES_SLOT_STATE_FAILED:
      return "failed";
    case PCP_ROLES_SLOT_STATE_STOPPING:
      return "stopping";
    case PCP_ROLES_SLOT_STATE_STOPPED:
      return "stopped";
  }
  return "unknown";
}

bool pcp_roles_slot_state_has_child(pcp_roles_slot_state_t state) {
  return state == PCP_ROLES_SLOT_STATE_STARTING ||
         state == PCP_ROLES_SLOT_STATE_RUNNING ||
         state == PCP_ROLES_SLOT_STATE_STOPPING;
}

static pcp_status_t backoff_reinitialize(
    const pcp_roles_supervision_options_t* options, pcp_backoff_t* backoff) {
  pcp_backoff_options_t backoff_options = {
      .min_ms = options->restart_min_ms,
      .max_ms = options->restart_max_ms,
      .multiplier = options->restart_multiplier,
  };
  return pcp_backoff_initialize(&backoff_options, backoff);
}

pcp_status_t pcp_roles_supervision_create(
    const pcp_roles_supervision_options_t* options, int64_t now_ms,
    pcp_rng_t* rng, pcp_allocator_t allocator,
    pcp_roles_supervision_t** out_supervision) {
  *out_supervision = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_roles_supervision_options_check(options));
  pcp_roles_supervision_t* supervision = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      allocator,
      sizeof(*supervision) + options->slot_count * sizeof(pcp_roles_slot_t),
      (void**)&supervision));
  supervision->allocator = allocator;
  supervision->options = *options;
  supervision->rng = rng;
  supervision->slot_count = options->slot_count;
  for (uint32_t i = 0; i < options->slot_count; ++i) {
    pcp_roles_slot_t* slot = &supervision->slots[i];
    slot->state = PCP_ROLES_SLOT_STATE_PENDING;
    // Staggered so N workers do not load N device runtimes at the same
    // instant (upstream's 200 ms).
    slot->deadline_ms = now_ms + (int64_t)i * options->stagger_ms;
    slot->started_ms = -1;
    pcp_status_t status = backoff_reinitialize(options, &slot->backoff);
    if (status) {
      pcp_allocator_free(allocator, supervision);
      return status;
    }
  }
  *out_supervision = supervision;
  return pcp_ok_status();
}

void pcp_roles_supervision_release(pcp_roles_supervision_t* supervision) {
  if (supervision) {
    pcp_allocator_free(supervision->allocator, supervision);
  }
}

static pcp_roles_slot_t* slot_at(pcp_roles_supervision_t* supervision,
                                 uint32_t slot) {
  PCP_ASSERT(slot < supervision->slot_count);
  return &supervision->slots[slot];
}

size_t pcp_roles_supervision_poll(pcp_roles_supervision_t* supervision,
                                  int64_t now_ms,
                                  pcp_roles_supervision_action_t* out_actions,
                                  size_t capacity) {
  PCP_ASSERT(capacity >= supervision->slot_count);
  size_t count = 0;
  for (uint32_t i = 0; i < supervision->slot_count; ++i) {
    pcp_roles_slot_t* slot = &supervision->slots[i];
    switch (slot->state) {
      case PCP_ROLES_SLOT_STATE_PENDING:
      case PCP_ROLES_SLOT_STATE_BACKING_OFF:
        if (now_ms >= slot->deadline_ms) {
          if (slot->start_count > 0) {
            ++slot->restart_count;
          }
          ++slot->start_count;
          slot->state = PCP_ROLES_SLOT_STATE_STARTING;
          slot->started_ms = now_ms;
          slot->deadline_ms = now_ms + supervision->options.running_after_ms;
          out_actions[count++] = (pcp_roles_supervision_action_t){
              PCP_ROLES_SUPERVISION_ACTION_SPAWN, i};
        }
        break;
      case PCP_ROLES_SLOT_STATE_STARTING:
        if (now_ms >= slot->deadline_ms) {
          slot->state = PCP_ROLES_SLOT_STATE_RUNNING;
          slot->deadline_ms = INT64_MAX;
        }
        break;
      case PCP_ROLES_SLOT_STATE_STOPPING:
        if (slot->term_pending) {
          slot->term_pending = false;
          out_actions[count++] = (pcp_roles_supervision_action_t){
              PCP_ROLES_SUPERVISION_ACTION_TERMINATE, i};
        } else if (now_ms >= slot->deadline_ms) {
          // SIGKILL once: the exit that follows is what ends STOPPING.
          slot->deadline_ms = INT64_MAX;
          out_actions[count++] = (pcp_roles_supervision_action_t){
              PCP_ROLES_SUPERVISION_ACTION_KILL, i};
        }
        break;
      case PCP_ROLES_SLOT_STATE_RUNNING:
      case PCP_ROLES_SLOT_STATE_FAILED:
      case PCP_ROLES_SLOT_STATE_STOPPED:
        break;
    }
  }
  return count;
}

int64_t pcp_roles_supervision_next_deadline_ms(
    const pcp_roles_supervision_t* supervision) {
  int64_t next = INT64_MAX;
  for (uint32_t i = 0; i < supervision->slot_count; ++i) {
    const pcp_roles_slot_t* slot = &supervision->slots[i];
    int64_t due = slot->deadline_ms;
    if (slot->state == PCP_ROLES_SLOT_STATE_STOPPING && slot->term_pending) {
      due = INT64_MIN;  // the SIGTERM is due now
    }
    switch (slot->state) {
      case PCP_ROLES_SLOT_STATE_PENDING:
      case PCP_ROLES_SLOT_STATE_STARTING:
      case PCP_ROLES_SLOT_STATE_BACKING_OFF:
      case PCP_ROLES_SLOT_STATE_STOPPING:
        if (due < next) {
          next = due;
        }
        break;
      default:
        break;
    }
  }
  return next;
}

// Records an unexpected exit at |now_ms| and decides what follows it.
static pcp_roles_slot_state_t exit_record(pcp_roles_supervision_t* supervision,
                                          pcp_roles_slot_t* slot,
                                          int64_t now_ms) {
  const pcp_roles_supervision_options_t* options = &supervision->options;
  ++slot->exit_count;
  // A run that stayed up long enough was healthy: the next restart is fast
  // again rather than paying for crashes long past.
  if (slot->started_ms >= 0 &&
      now_ms - slot->started_ms >= options->reset_after_ms) {
    pcp_backoff_reset(&slot->backoff);
  }
  // Crash-loop cap (systemd's StartLimitBurst within StartLimitIntervalSec):
  // keep the last K+1 exit times; when all K+1 fall within the window, the
  // K restarts allowed there are used up.
  const uint32_t ring_size = options->crash_loop_restarts + 1;
  slot->exit_ring_ms[slot->exit_ring_head] = now_ms;
  slot->exit_ring_head = (slot->exit_ring_head + 1) % ring_size;
  if (slot->exit_ring_count < ring_size) {
    ++slot->exit_ring_count;
  }
  if (slot->exit_ring_count == ring_size) {
    // With a full ring the head is also the oldest entry.
    int64_t oldest_ms = slot->exit_ring_ms[slot->exit_ring_head];
    if (now_ms - oldest_ms < options->crash_loop_window_ms) {
      slot->state = PCP_ROLES_SLOT_STATE_FAILED;
      slot->deadline_ms = INT64_MAX;
      return slot->state;
    }
  }
  slot->last_delay_ms = pcp_backoff_next_ms(&slot->backoff, supervision->rng);
  slot->state = PCP_ROLES_SLOT_STATE_BACKING_OFF;
  slot->deadline_ms = now_ms + slot->last_delay_ms;
  return slot->state;
}

pcp_roles_slot_state_t pcp_roles_supervision_child_exited(
    pcp_roles_supervision_t* supervision, uint32_t slot_index, int64_t now_ms,
    int64_t exit_status, int32_t term_signal) {
  pcp_roles_slot_t* slot = slot_at(supervision, slot_index);
  // A driver bug, not input: the driver only reports exits of children it
  // spawned, and a slot has at most one.
  PCP_ASSERT(pcp_roles_slot_state_has_child(slot->state));
  slot->last_exit_status = term_signal ? 0 : exit_status;
  slot->last_term_signal = term_signal;
  slot->last_spawn_failed = false;
  if (slot->state == PCP_ROLES_SLOT_STATE_STOPPING) {
    slot->state = PCP_ROLES_SLOT_STATE_STOPPED;
    slot->deadline_ms = INT64_MAX;
    slot->term_pending = false;
    return slot->state;
  }
  return exit_record(supervision, slot, now_ms);
}

pcp_roles_slot_state_t pcp_roles_supervision_spawn_failed(
    pcp_roles_supervision_t* supervision, uint32_t slot_index, int64_t now_ms) {
  pcp_roles_slot_t* slot = slot_at(supervision, slot_index);
  PCP_ASSERT(slot->state == PCP_ROLES_SLOT_STATE_STARTING ||
             slot->state == PCP_ROLES_SLOT_STATE_STOPPING);
  slot->last_exit_status = 0;
  slot->last_term_signal = 0;
  slot->last_spawn_failed = true;
  if (slot->state == PCP_ROLES_SLOT_STATE_STOPPING) {
    slot->state = PCP_ROLES_SLOT_STATE_STOPPED;
    slot->deadline_ms = INT64_MAX;
    slot->term_pending = false;
    return slot->state;
  }
  return exit_record(supervision, slot, now_ms);
}

void pcp_roles_supervision_stop(pcp_roles_supervision_t* supervision,
                                int64_t now_ms) {
  if (supervision->stopping) {
    return;
  }
  supervision->stopping = true;
  for (uint32_t i = 0; i < supervision->slot_count; ++i) {
    pcp_roles_slot_t* slot = &supervision->slots[i];
    if (pcp_roles_slot_state_has_child(slot->state)) {
      slot->state = PCP_ROLES_SLOT_STATE_STOPPING;
      slot->term_pending = true;
      slot->deadline_ms = now_ms + supervision->options.stop_grace_ms;
    } else {
      slot->state = PCP_ROLES_SLOT_STATE_STOPPED;
      slot->deadline_ms = INT64_MAX;
    }
  }
}

void pcp_roles_supervision_stop_now(pcp_roles_supervision_t* supervision,
                                    int64_t now_ms) {
  if (!supervision->stopping) {
    return;
  }
  for (uint32_t i = 0; i < supervision->slot_count; ++i) {
    pcp_roles_slot_t* slot = &supervision->slots[i];
    // INT64_MAX: the SIGKILL was handed out already.
    if (slot->state == PCP_ROLES_SLOT_STATE_STOPPING &&
        slot->deadline_ms != INT64_MAX && slot->deadline_ms > now_ms) {
      slot->deadline_ms = now_ms;
    }
  }
}

pcp_status_t pcp_roles_supervision_slot_revive(
    pcp_roles_supervision_t* supervision, uint32_t slot_index, int64_t now_ms) {
  pcp_roles_slot_t* slot = slot_at(supervision, slot_index);
  if (supervision->stopping || slot->state != PCP_ROLES_SLOT_STATE_FAILED) {
    return pcp_make_status(
        PCP_STATUS_FAILED_PRECONDITION, "slot %u is %s, not failed", slot_index,
        supervision->stopping ? "stopping"
                              : pcp_roles_slot_state_name(slot->state));
  }
  slot->exit_ring_count = 0;
  slot->exit_ring_head = 0;
  pcp_backoff_reset(&slot->backoff);
  slot->state = PCP_ROLES_SLOT_STATE_BACKING_OFF;
  slot->deadline_ms = now_ms;
  return pcp_ok_status();
}

uint32_t pcp_roles_supervision_slot_count(
    const pcp_roles_supervision_t* supervision) {
  return supervision->slot_count;
}

const pcp_roles_slot_t* pcp_roles_supervision_slot(
    const pcp_roles_supervision_t* supervision, uint32_t slot) {
  PCP_ASSERT(slot < supervision->slot_count);
  return &supervision->slots[slot];
}

uint32_t pcp_roles_supervision_count_in_state(
    const pcp_roles_supervision_t* supervision, pcp_roles_slot_state_t state) {
  uint32_t count = 0;
  for (uint32_t i = 0; i < supervision->slot_count; ++i) {
    count += supervision->slots[i].state == state;
  }
  return count;
}

bool pcp_roles_supervision_is_ready(
    const pcp_roles_supervision_t* supervision) {
  return !supervision->stopping &&
         pcp_roles_supervision_count_in_state(supervision,
                                              PCP_ROLES_SLOT_STATE_RUNNING) ==
             supervision->slot_count;
}

bool pcp_roles_supervision_is_stopping(
    const pcp_roles_supervision_t* supervision) {
  return supervision->stopping;
}

bool pcp_roles_supervision_is_stopped(
    const pcp_roles_supervision_t* supervision) {
  return supervision->stopping &&
         pcp_roles_supervision_count_in_state(supervision,
                                              PCP_ROLES_SLOT_STATE_STOPPED) ==
             supervision->slot_count;
}

pcp_status_t pcp_roles_policy_flags_to_options(
    const pcp_roles_policy_flags_t* flags, uint32_t slot_count,
    int64_t stagger_ms, pcp_roles_supervision_options_t* out_options) {
  pcp_roles_supervision_options_t options =
      pcp_roles_supervision_options_default();
  options.slot_count = slot_count;
  options.stagger_ms = stagger_ms;
  options.running_after_ms = flags->running_after_ms;
  options.restart_min_ms = flags->restart_min_ms;
  options.restart_max_ms = flags->restart_max_ms;
  options.reset_after_ms = flags->restart_reset_after_ms;
  options.crash_loop_restarts = (uint32_t)flags->crash_loop_restarts;
  options.crash_loop_window_ms = flags->crash_loop_window_ms;
  options.stop_grace_ms = flags->stop_grace_ms;
  if (options.restart_max_ms < options.restart_min_ms) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "flag '--restart-max-ms': %lld is below "
                           "--restart-min-ms %lld",
                           (long long)options.restart_max_ms,
                           (long long)options.restart_min_ms);
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_roles_supervision_options_check(&options));
  *out_options = options;
  return pcp_ok_status();
}

int64_t pcp_roles_worker_drain_timeout_ms(int64_t stop_grace_ms) {
  int64_t margin_ms = stop_grace_ms / 5;
  if (margin_ms > 2000) {
    margin_ms = 2000;
  }
  return stop_grace_ms - margin_ms;
}

pcp_status_t pcp_roles_self_exe(char* buffer, size_t capacity) {
  // /proc/self/exe rather than argv[0]: the worker must be this very
  // binary even when we were started through a relative path or PATH and
  // the working directory or PATH changed since.
  ssize_t n = readlink("/proc/self/exe", buffer, capacity);
  if (n < 0) {
    return pcp_status_from_errno(errno, "readlink /proc/self/exe");
  }
  if ((size_t)n >= capacity) {
    return pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                           "path of this executable is longer than %zu bytes",
                           capacity - 1);
  }
  buffer[n] = 0;
  return pcp_ok_status();
}
