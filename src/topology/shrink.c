// SPDX-License-Identifier: Apache-2.0
//
// Counterexample shrinking.
//
// Events and index lists (upstream shrinkEvents / shrinkIndices): greedy
// one-at-a-time deletion (restart from the front after every success) until
// no single deletion keeps the failure, then seed minimisation. Quadratic in
// the worst case, fine for traces of tens of events, and it reproduces the
// upstream results exactly (same deletion order).
//
// Model schedules (pcp_topology_actions_shrink): delta debugging over the
// actions (chunks, then single actions) alternating with parameter
// minimisation until neither changes anything. Deletion alone stops at a
// local minimum whenever the failure needs a particular number: a stale
// clock of 3 needs three observed steps before it, a clock of 0 only one.
// Shrinking the number first lets the next deletion round drop the steps,
// which is how the injected-bug schedules reach the upstream sizes.

#include <string.h>

#include "topology/protocols_impl.h"

pcp_status_t pcp_topology_events_shrink(
    pcp_allocator_t allocator, uint64_t seed,
    const pcp_topology_event_t* events, size_t event_count,
    pcp_topology_event_predicate_fn_t predicate, void* user_data,
    pcp_topology_shrink_result_t* out_result) {
  memset(out_result, 0, sizeof(*out_result));
  if (!predicate(user_data, seed, events, event_count)) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "shrink predicate does not hold on the input");
  }
  size_t calls = 1;
  pcp_topology_event_t* current = NULL;
  pcp_topology_event_t* candidate = NULL;
  if (event_count > 0) {
    size_t bytes = event_count * sizeof(*current);
    PCP_RETURN_IF_ERROR(
        pcp_allocator_malloc(allocator, bytes, (void**)&current),
        "shrink buffer");
    pcp_status_t status =
        pcp_allocator_malloc(allocator, bytes, (void**)&candidate);
    if (status) {
      pcp_allocator_free(allocator, current);
      return status;
    }
    memcpy(current, events, bytes);
  }
  size_t count = event_count;
  size_t index = 0;
  while (index < count) {
    // candidate = current without element |index|
    memcpy(candidate, current, index * sizeof(*current));
    memcpy(candidate + index, current + index + 1,
           (count - index - 1) * sizeof(*current));
    ++calls;
    if (predicate(user_data, seed, candidate, count - 1)) {
      pcp_topology_event_t* swap = current;
      current = candidate;
      candidate = swap;
      --count;
      index = 0;
    } else {
      ++index;
    }
  }
  // Seed minimisation: the smallest seeds are the easiest to replay and to
  // compare across reports.
  uint64_t best = seed;
  if (best != 0) {
    ++calls;
    if (predicate(user_data, 0, current, count)) {
      best = 0;
    } else if (best > 1) {
      ++calls;
      if (predicate(user_data, 1, current, count)) {
        best = 1;
      } else {
        uint64_t next = best / 2;
        while (next > 1) {
          ++calls;
          if (predicate(user_data, next, current, count))
            best = next;
          next /= 2;
        }
      }
    }
  }
  if (candidate)
    pcp_allocator_free(allocator, candidate);
  if (count == 0 && current) {
    pcp_allocator_free(allocator, current);
    current = NULL;
  }
  out_result->seed = best;
  out_result->events = current;
  out_result->event_count = count;
  out_result->deleted = event_count - count;
  out_result->predicate_calls = calls;
  return pcp_ok_status();
}

void pcp_topology_shrink_result_deinitialize(
    pcp_allocator_t allocator, pcp_topology_shrink_result_t* result) {
  if (result->events)
    pcp_allocator_free(allocator, result->events);
  memset(result, 0, sizeof(*result));
}

pcp_status_t pcp_topology_indices_shrink(
    pcp_allocator_t allocator, size_t count,
    pcp_topology_index_predicate_fn_t predicate, void* user_data,
    uint32_t** out_retained, size_t* out_retained_count) {
  *out_retained = NULL;
  *out_retained_count = 0;
  if (count > UINT32_MAX) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "too many indices to shrink: %zu", count);
  }
  uint32_t* current = NULL;
  uint32_t* candidate = NULL;
  size_t bytes = (count ? count : 1) * sizeof(uint32_t);
  PCP_RETURN_IF_ERROR(pcp_allocator_malloc(allocator, bytes, (void**)&current),
                      "shrink indices");
  pcp_status_t status =
      pcp_allocator_malloc(allocator, bytes, (void**)&candidate);
  if (status) {
    pcp_allocator_free(allocator, current);
    return status;
  }
  for (size_t i = 0; i < count; ++i) current[i] = (uint32_t)i;
  if (!predicate(user_data, current, count)) {
    pcp_allocator_free(allocator, current);
    pcp_allocator_free(allocator, candidate);
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "shrink predicate does not hold on the input");
  }
  size_t retained = count;
  size_t index = 0;
  while (index < retained) {
    memcpy(candidate, current, index * sizeof(uint32_t));
    memcpy(candidate + index, current + index + 1,
           (retained - index - 1) * sizeof(uint32_t));
    if (predicate(user_data, candidate, retained - 1)) {
      uint32_t* swap = current;
      current = candidate;
      candidate = swap;
      --retained;
      index = 0;
    } else {
      ++index;
    }
  }
  pcp_allocator_free(allocator, candidate);
  *out_retained = current;
  *out_retained_count = retained;
  return pcp_ok_status();
}

// Tries |candidate| (|count| actions); on success it becomes the current
// schedule (the buffers swap).
static bool actions_try(pcp_topology_action_predicate_fn_t predicate,
                        void* user_data, pcp_topology_action_t** current,
                        pcp_topology_action_t** candidate, size_t count,
                        size_t* inout_calls) {
  ++*inout_calls;
  if (!predicate(user_data, *candidate, count)) {
    return false;
  }
  pcp_topology_action_t* swap = *current;
  *current = *candidate;
  *candidate = swap;
  return true;
}

// Deletion phase: chunks of count/2, count/4, ..., then single actions
// until a whole pass deletes nothing. Returns the number deleted.
static size_t actions_delete(pcp_topology_action_predicate_fn_t predicate,
                             void* user_data, pcp_topology_action_t** current,
                             pcp_topology_action_t** candidate,
                             size_t* inout_count, size_t* inout_calls) {
  size_t deleted = 0;
  size_t chunk = *inout_count / 2;
  if (chunk == 0) {
    chunk = 1;
  }
  for (;;) {
    bool any = false;
    size_t start = 0;
    while (start < *inout_count) {
      size_t count = *inout_count;
      size_t length = chunk < count - start ? chunk : count - start;
      memcpy(*candidate, *current, start * sizeof(**current));
      memcpy(*candidate + start, *current + start + length,
             (count - start - length) * sizeof(**current));
      if (actions_try(predicate, user_data, current, candidate, count - length,
                      inout_calls)) {
        *inout_count = count - length;
        deleted += length;
        any = true;
      } else {
        start += length;
      }
    }
    if (chunk > 1) {
      chunk /= 2;
    } else if (!any) {
      return deleted;
    }
  }
}

// Parameter phase: each parameter at 0, else halved while the failure
// stays (the seed rule of pcp_topology_events_shrink, per parameter).
static size_t actions_reduce(pcp_topology_action_predicate_fn_t predicate,
                             void* user_data, pcp_topology_action_t** current,
                             pcp_topology_action_t** candidate, size_t count,
                             size_t* inout_calls) {
  size_t reduced = 0;
  for (size_t i = 0; i < count; ++i) {
    for (uint32_t p = 0; p < PCP_TOPOLOGY_ACTION_MAX_PARAMETERS; ++p) {
      uint64_t value = (*current)[i].parameters[p];
      if (value == 0) {
        continue;
      }
      uint64_t next = 0;
      for (;;) {
        memcpy(*candidate, *current, count * sizeof(**current));
        (*candidate)[i].parameters[p] = next;
        if (actions_try(predicate, user_data, current, candidate, count,
                        inout_calls)) {
          ++reduced;
          value = next;
          if (next == 0) {
            break;
          }
          next = value / 2;
        } else {
          // 0 failed: continue with halves of the current value.
          next = next == 0 ? value / 2 : next / 2;
          if (next == 0) {
            break;
          }
        }
      }
    }
  }
  return reduced;
}

// Joint phase, tried when deletion and parameters are stuck: delete action
// |i| while lowering one parameter of another action (0, halves, one
// less). It escapes minima where an action is only needed because another
// action's number points past it (a worker that is lost first so that a
// reservation takes the second one, whose loss is the failure). Quadratic
// in the schedule, so only for short ones. Returns true after the first
// success (the caller restarts its round).
#define ACTIONS_JOINT_MAX_COUNT 16u

static bool actions_delete_jointly(pcp_topology_action_predicate_fn_t predicate,
                                   void* user_data,
                                   pcp_topology_action_t** current,
                                   pcp_topology_action_t** candidate,
                                   size_t* inout_count, size_t* inout_calls) {
  size_t count = *inout_count;
  if (count < 2 || count > ACTIONS_JOINT_MAX_COUNT) {
    return false;
  }
  for (size_t i = 0; i < count; ++i) {
    for (size_t j = 0; j < count; ++j) {
      if (j == i) {
        continue;
      }
      size_t jj = j < i ? j : j - 1;  // index of j once i is gone
      for (uint32_t p = 0; p < PCP_TOPOLOGY_ACTION_MAX_PARAMETERS; ++p) {
        uint64_t value = (*current)[j].parameters[p];
        if (value == 0) {
          continue;
        }
        // 0, value/2, value/4, ..., 1, then value - 1.
        uint64_t tries[66];
        size_t try_count = 0;
        tries[try_count++] = 0;
        for (uint64_t half = value / 2; half > 0; half /= 2) {
          tries[try_count++] = half;
        }
        if (value > 2) {
          tries[try_count++] = value - 1;  // not a half for value > 2
        }
        for (size_t t = 0; t < try_count; ++t) {
          memcpy(*candidate, *current, i * sizeof(**current));
          memcpy(*candidate + i, *current + i + 1,
                 (count - i - 1) * sizeof(**current));
          (*candidate)[jj].parameters[p] = tries[t];
          if (actions_try(predicate, user_data, current, candidate, count - 1,
                          inout_calls)) {
            *inout_count = count - 1;
            return true;
          }
        }
      }
    }
  }
  return false;
}

pcp_status_t pcp_topology_actions_shrink(
    pcp_allocator_t allocator, const pcp_topology_action_t* actions,
    size_t action_count, pcp_topology_action_predicate_fn_t predicate,
    void* user_data, pcp_topology_action_shrink_result_t* out_result) {
  memset(out_result, 0, sizeof(*out_result));
  if (!predicate(user_data, actions, action_count)) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "shrink predicate does not hold on the input");
  }
  size_t calls = 1;
  size_t bytes = (action_count ? action_count : 1) * sizeof(*actions);
  pcp_topology_action_t* current = NULL;
  pcp_topology_action_t* candidate = NULL;
  PCP_RETURN_IF_ERROR(pcp_allocator_malloc(allocator, bytes, (void**)&current),
                      "shrink actions");
  pcp_status_t status =
      pcp_allocator_malloc(allocator, bytes, (void**)&candidate);
  if (status) {
    pcp_allocator_free(allocator, current);
    return status;
  }
  if (action_count) {
    memcpy(current, actions, action_count * sizeof(*actions));
  }
  size_t count = action_count;
  size_t reduced = 0;
  size_t rounds = 0;
  // Bounded so that a predicate that is not a function of its input (it
  // should be) cannot loop forever.
  while (rounds < 64) {
    ++rounds;
    size_t deleted = actions_delete(predicate, user_data, &current, &candidate,
                                    &count, &calls);
    size_t round_reduced = actions_reduce(predicate, user_data, &current,
                                          &candidate, count, &calls);
    reduced += round_reduced;
    if (deleted == 0 && round_reduced == 0) {
      if (!actions_delete_jointly(predicate, user_data, &current, &candidate,
                                  &count, &calls)) {
        break;
      }
      ++reduced;  // the lowered parameter
    }
  }
  pcp_allocator_free(allocator, candidate);
  out_result->actions = current;
  out_result->action_count = count;
  out_result->deleted = action_count - count;
  out_result->parameters_reduced = reduced;
  out_result->rounds = rounds;
  out_result->predicate_calls = calls;
  return pcp_ok_status();
}

void pcp_topology_action_shrink_result_deinitialize(
    pcp_allocator_t allocator, pcp_topology_action_shrink_result_t* result) {
  if (result->actions) {
    pcp_allocator_free(allocator, result->actions);
  }
  memset(result, 0, sizeof(*result));
}
