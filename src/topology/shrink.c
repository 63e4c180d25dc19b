// SPDX-License-Identifier: Apache-2.0
//
// Counterexample shrinking: greedy one-at-a-time deletion (restart from the
// front after every success) until no single deletion keeps the failure,
// then seed minimisation. Greedy deletion is quadratic in the worst case,
// which is fine for traces of tens of events; delta debugging would halve
// the predicate calls on long traces but finds the same 1-minimal result
// here and is harder to replay by hand.

#include <string.h>

#include "topology/topology.h"

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
    PCP_RETURN_IF_ERROR(pcp_allocator_malloc(allocator, bytes, (void**)&current),
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
          if (predicate(user_data, next, current, count)) best = next;
          next /= 2;
        }
      }
    }
  }
  if (candidate) pcp_allocator_free(allocator, candidate);
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
  if (result->events) pcp_allocator_free(allocator, result->events);
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
