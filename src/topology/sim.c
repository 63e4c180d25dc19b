// SPDX-License-Identifier: Apache-2.0
//
// The two-node trace simulator: a gateway (node 0) and a worker (node 1)
// exchanging at most one message at a time. Small on purpose: it is the
// smallest state space on which seeded random schedules, exhaustive
// schedules, shrinking and replay can all be checked for determinism.

#include <string.h>

#include "topology/protocols_impl.h"
#include "topology/trace_impl.h"

#define SIM_NODE_COUNT 2u
// "TOPO_SIM" in ASCII: mixed into the seed so that two simulators with
// different purposes never share a checksum stream.
#define SIM_CHECKSUM_SALT 0x544f504f5f53494dull

void pcp_topology_sim_initialize(uint64_t seed, pcp_topology_sim_t* out_sim) {
  memset(out_sim, 0, sizeof(*out_sim));
  out_sim->online_mask = (1u << SIM_NODE_COUNT) - 1u;
  out_sim->checksum = seed ^ SIM_CHECKSUM_SALT;
  out_sim->failure = PCP_TOPOLOGY_FAILURE_NONE;
}

static pcp_topology_failure_t sim_apply(pcp_topology_sim_t* sim,
                                        pcp_topology_event_t event) {
  if (event.actor >= SIM_NODE_COUNT)
    return PCP_TOPOLOGY_FAILURE_INVALID_ACTOR;
  bool has_peer = event.peer != PCP_TOPOLOGY_NO_NODE;
  if (has_peer && event.peer >= SIM_NODE_COUNT) {
    return PCP_TOPOLOGY_FAILURE_INVALID_PEER;
  }
  uint64_t actor_bit = 1ull << event.actor;
  bool online = (sim->online_mask & actor_bit) != 0;
  if (!online && event.tag != PCP_TOPOLOGY_EVENT_RESTART &&
      event.tag != PCP_TOPOLOGY_EVENT_JOIN) {
    return PCP_TOPOLOGY_FAILURE_EVENT_ON_CRASHED_NODE;
  }
  switch ((pcp_topology_event_tag_t)event.tag) {
    case PCP_TOPOLOGY_EVENT_SEND:
      if (!has_peer)
        return PCP_TOPOLOGY_FAILURE_INVALID_PEER;
      // One message in flight at a time: a second send before delivery is
      // the duplicate-send bug the invalid alphabet is there to find.
      if (sim->pending != 0)
        return PCP_TOPOLOGY_FAILURE_DUPLICATE_SEND;
      sim->pending++;
      break;
    case PCP_TOPOLOGY_EVENT_DELIVER:
      if (!has_peer)
        return PCP_TOPOLOGY_FAILURE_INVALID_PEER;
      if (sim->pending == 0)
        return PCP_TOPOLOGY_FAILURE_INVALID_DELIVERY;
      sim->pending--;
      sim->delivered++;
      break;
    case PCP_TOPOLOGY_EVENT_DUPLICATE:
      if (sim->pending == 0)
        return PCP_TOPOLOGY_FAILURE_INVALID_DELIVERY;
      sim->pending++;
      break;
    case PCP_TOPOLOGY_EVENT_DROP:
      if (sim->pending == 0)
        return PCP_TOPOLOGY_FAILURE_INVALID_DELIVERY;
      sim->pending--;
      break;
    case PCP_TOPOLOGY_EVENT_CRASH:
    case PCP_TOPOLOGY_EVENT_LEAVE:
      sim->online_mask &= ~actor_bit;
      break;
    case PCP_TOPOLOGY_EVENT_RESTART:
    case PCP_TOPOLOGY_EVENT_JOIN:
      sim->online_mask |= actor_bit;
      break;
    case PCP_TOPOLOGY_EVENT_CANCEL:
      sim->pending = 0;
      break;
    default:
      break;
  }
  return PCP_TOPOLOGY_FAILURE_NONE;
}

bool pcp_topology_sim_step(pcp_topology_sim_t* sim,
                           pcp_topology_event_t event) {
  if (sim->failure != PCP_TOPOLOGY_FAILURE_NONE)
    return false;
  sim->steps++;
  sim->checksum =
      pcp_topology_fmix64(sim->checksum ^ pcp_topology_event_hash(event));
  sim->failure = sim_apply(sim, event);
  return sim->failure == PCP_TOPOLOGY_FAILURE_NONE;
}

void pcp_topology_sim_snapshot(const pcp_topology_sim_t* sim,
                               pcp_topology_snapshot_t* out_snapshot) {
  memset(out_snapshot, 0, sizeof(*out_snapshot));
  out_snapshot->steps = sim->steps;
  out_snapshot->node_count = SIM_NODE_COUNT;
  out_snapshot->online_mask = sim->online_mask;
  out_snapshot->pending = sim->pending;
  out_snapshot->delivered = sim->delivered;
  out_snapshot->checksum = sim->checksum;
  out_snapshot->failure = (uint8_t)sim->failure;
}

pcp_status_t pcp_topology_sim_run(uint64_t seed,
                                  const pcp_topology_event_t* events,
                                  size_t event_count, pcp_allocator_t allocator,
                                  pcp_topology_trace_t* out_trace) {
  pcp_topology_trace_initialize(allocator, seed, out_trace);
  pcp_topology_sim_t sim;
  pcp_topology_sim_initialize(seed, &sim);
  for (size_t i = 0; i < event_count; ++i) {
    pcp_status_t status = pcp_topology_trace_append(out_trace, events[i]);
    if (status) {
      pcp_topology_trace_deinitialize(out_trace);
      return status;
    }
    if (!pcp_topology_sim_step(&sim, events[i]))
      break;
  }
  pcp_topology_snapshot_t snapshot;
  pcp_topology_sim_snapshot(&sim, &snapshot);
  pcp_topology_trace_finish(out_trace, &snapshot);
  return pcp_ok_status();
}

static const pcp_topology_event_t kValidAlphabet[] = {
    {PCP_TOPOLOGY_EVENT_SEND, 0, 1, 1},
    {PCP_TOPOLOGY_EVENT_DELIVER, 1, 0, 1},
    {PCP_TOPOLOGY_EVENT_TIMEOUT, 0, PCP_TOPOLOGY_NO_NODE, 0},
};

static const pcp_topology_event_t kControlAlphabet[] = {
    {PCP_TOPOLOGY_EVENT_TIMEOUT, 0, PCP_TOPOLOGY_NO_NODE, 0},
    {PCP_TOPOLOGY_EVENT_HEARTBEAT, 1, 0, 0},
    {PCP_TOPOLOGY_EVENT_LOCAL_STEP_COMPLETE, 1, PCP_TOPOLOGY_NO_NODE, 0},
};

void pcp_topology_sim_alphabet(bool include_invalid_events,
                               const pcp_topology_event_t** out_events,
                               size_t* out_count) {
  if (include_invalid_events) {
    *out_events = kValidAlphabet;
    *out_count = PCP_ARRAYSIZE(kValidAlphabet);
  } else {
    *out_events = kControlAlphabet;
    *out_count = PCP_ARRAYSIZE(kControlAlphabet);
  }
}

pcp_status_t pcp_topology_sim_random_trace(uint64_t seed, size_t event_count,
                                           bool include_invalid_events,
                                           pcp_allocator_t allocator,
                                           pcp_topology_trace_t* out_trace) {
  if (event_count > PCP_TOPOLOGY_TRACE_MAX_EVENTS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "random trace of %zu events exceeds %u", event_count,
                           PCP_TOPOLOGY_TRACE_MAX_EVENTS);
  }
  const pcp_topology_event_t* alphabet = NULL;
  size_t alphabet_count = 0;
  pcp_topology_sim_alphabet(include_invalid_events, &alphabet, &alphabet_count);
  pcp_topology_event_t* events = NULL;
  if (event_count > 0) {
    PCP_RETURN_IF_ERROR(
        pcp_allocator_malloc(allocator, event_count * sizeof(*events),
                             (void**)&events),
        "random trace");
  }
  pcp_rng_t rng;
  pcp_rng_initialize(seed, &rng);
  for (size_t i = 0; i < event_count; ++i) {
    events[i] = alphabet[pcp_rng_next_below(&rng, alphabet_count)];
  }
  pcp_status_t status =
      pcp_topology_sim_run(seed, events, event_count, allocator, out_trace);
  pcp_allocator_free(allocator, events);
  return status;
}

pcp_status_t pcp_topology_sim_explore_exhaustive(
    uint64_t seed, uint32_t depth, bool include_invalid_events,
    pcp_allocator_t allocator, pcp_topology_sim_exploration_t* out_result) {
  memset(out_result, 0, sizeof(*out_result));
  if (depth > PCP_TOPOLOGY_SIM_MAX_DEPTH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "exhaustive depth %u exceeds %u", depth,
                           PCP_TOPOLOGY_SIM_MAX_DEPTH);
  }
  const pcp_topology_event_t* alphabet = NULL;
  size_t alphabet_count = 0;
  pcp_topology_sim_alphabet(include_invalid_events, &alphabet, &alphabet_count);
  // An odometer over alphabet indices walks the schedules in lexicographic
  // order without recursion; depth <= 8 keeps it at 3^8 runs.
  uint32_t digits[PCP_TOPOLOGY_SIM_MAX_DEPTH] = {0};
  pcp_topology_event_t events[PCP_TOPOLOGY_SIM_MAX_DEPTH];
  for (;;) {
    for (uint32_t i = 0; i < depth; ++i) events[i] = alphabet[digits[i]];
    pcp_topology_sim_t sim;
    pcp_topology_sim_initialize(seed, &sim);
    for (uint32_t i = 0; i < depth; ++i) {
      if (!pcp_topology_sim_step(&sim, events[i]))
        break;
    }
    out_result->checked++;
    if (sim.failure != PCP_TOPOLOGY_FAILURE_NONE) {
      out_result->failed++;
      if (!out_result->has_failure) {
        // Record through the same runner a replay uses, so the stored trace
        // is by construction what a replay reproduces.
        pcp_status_t status = pcp_topology_sim_run(
            seed, events, depth, allocator, &out_result->first_failure);
        if (status)
          return status;
        out_result->has_failure = true;
      }
    }
    int position = (int)depth - 1;
    while (position >= 0) {
      if (++digits[position] < alphabet_count)
        break;
      digits[position] = 0;
      --position;
    }
    if (position < 0)
      break;
  }
  return pcp_ok_status();
}

void pcp_topology_sim_exploration_deinitialize(
    pcp_topology_sim_exploration_t* result) {
  if (result->has_failure) {
    pcp_topology_trace_deinitialize(&result->first_failure);
  }
  result->has_failure = false;
}
