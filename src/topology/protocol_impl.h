// SPDX-License-Identifier: Apache-2.0
//
// STAGING: the trace / simulator / shrinking / replay declarations of the
// "Solving and protocols" section, kept here until topology.h exists; they
// move into topology.h verbatim.

#ifndef PCP_TOPOLOGY_PROTOCOL_IMPL_H_
#define PCP_TOPOLOGY_PROTOCOL_IMPL_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

//===----------------------------------------------------------------------===//
// Solving and protocols: traces and events
//===----------------------------------------------------------------------===//

// A node of a simulated protocol run; PCP_TOPOLOGY_NO_NODE marks "no peer".
#define PCP_TOPOLOGY_NO_NODE 0xFFFFu
// Bound on events in one trace (parsed text, imported fixtures, generators).
#define PCP_TOPOLOGY_TRACE_MAX_EVENTS 4096u

// Event tags. The ordinals are hashed into trace checksums and printed in
// replay fixtures, so they can never be renumbered.
typedef enum pcp_topology_event_tag_e {
  PCP_TOPOLOGY_EVENT_NOOP = 0,
  PCP_TOPOLOGY_EVENT_SEND = 1,
  PCP_TOPOLOGY_EVENT_DELIVER = 2,
  PCP_TOPOLOGY_EVENT_DROP = 3,
  PCP_TOPOLOGY_EVENT_DUPLICATE = 4,
  PCP_TOPOLOGY_EVENT_TIMEOUT = 5,
  PCP_TOPOLOGY_EVENT_CRASH = 6,
  PCP_TOPOLOGY_EVENT_RESTART = 7,
  PCP_TOPOLOGY_EVENT_JOIN = 8,
  PCP_TOPOLOGY_EVENT_LEAVE = 9,
  PCP_TOPOLOGY_EVENT_CANCEL = 10,
  PCP_TOPOLOGY_EVENT_HEARTBEAT = 11,
  PCP_TOPOLOGY_EVENT_HEALTH_UPDATE = 12,
  PCP_TOPOLOGY_EVENT_LOCAL_STEP_COMPLETE = 13,
  PCP_TOPOLOGY_EVENT_LEASE_RESERVE = 14,
  PCP_TOPOLOGY_EVENT_LEASE_COMMIT = 15,
  PCP_TOPOLOGY_EVENT_LEASE_RELEASE = 16,
  PCP_TOPOLOGY_EVENT_LEASE_EXPIRE = 17,
  PCP_TOPOLOGY_EVENT_TAG_COUNT_ = 18,
} pcp_topology_event_tag_t;

// Why a simulated run stopped. Sticky: the first failure ends the run.
typedef enum pcp_topology_failure_e {
  PCP_TOPOLOGY_FAILURE_NONE = 0,
  PCP_TOPOLOGY_FAILURE_INVALID_ACTOR = 1,
  PCP_TOPOLOGY_FAILURE_INVALID_PEER = 2,
  PCP_TOPOLOGY_FAILURE_INVALID_DELIVERY = 3,
  PCP_TOPOLOGY_FAILURE_DUPLICATE_SEND = 4,
  PCP_TOPOLOGY_FAILURE_EVENT_ON_CRASHED_NODE = 5,
  PCP_TOPOLOGY_FAILURE_COUNT_ = 6,
} pcp_topology_failure_t;

// One step of a schedule. |tag| holds a pcp_topology_event_tag_t.
typedef struct pcp_topology_event_t {
  uint8_t tag;
  uint16_t actor;
  uint16_t peer;        // PCP_TOPOLOGY_NO_NODE when the event has no peer
  uint32_t message_id;  // 0 when the event carries no message
} pcp_topology_event_t;

// "send", "local_step_complete", ... ; "?" for out-of-range values.
const char* pcp_topology_event_tag_name(pcp_topology_event_tag_t tag);
bool pcp_topology_event_tag_parse(pcp_string_view_t name,
                                  pcp_topology_event_tag_t* out_tag);
const char* pcp_topology_failure_name(pcp_topology_failure_t failure);
bool pcp_topology_failure_parse(pcp_string_view_t name,
                                pcp_topology_failure_t* out_failure);

// FNV-style hash over the four whole field values (tag, actor, peer,
// message id). Stable across builds: it feeds checksums in fixtures.
uint64_t pcp_topology_event_hash(pcp_topology_event_t event);

// Appends "<index>: <tag> actor=<a> peer=<p|-> message=<m>\n".
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_event_format(
    size_t index, pcp_topology_event_t event, pcp_string_builder_t* builder);

// Partial-order reduction over event sequences. Two events are independent
// unless they share a non-zero message id or one touches the other's actor
// or peer. Returns true when |next| may follow |prefix|: the prefix is
// empty, or its last event depends on |next|, or key(last) <= key(next).
// This keeps exactly one order of each run of adjacent independent events.
bool pcp_topology_events_independent(pcp_topology_event_t a,
                                     pcp_topology_event_t b);
bool pcp_topology_partial_order_allows(const pcp_topology_event_t* prefix,
                                       size_t prefix_count,
                                       pcp_topology_event_t next);

// State of the two-node simulator at the end of a run.
typedef struct pcp_topology_snapshot_t {
  uint32_t steps;
  uint8_t node_count;
  uint64_t online_mask;
  uint32_t pending;
  uint32_t delivered;
  uint64_t checksum;
  uint8_t failure;  // pcp_topology_failure_t
} pcp_topology_snapshot_t;

// Stable hash of the snapshot's little-endian field bytes, for canonical
// state comparison.
uint64_t pcp_topology_snapshot_hash(const pcp_topology_snapshot_t* snapshot);
// Appends "final steps=.. nodes=.. online_mask=.. pending=.. delivered=..
// checksum=.. failure=<name>\n".
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_snapshot_format(
    const pcp_topology_snapshot_t* snapshot, pcp_string_builder_t* builder);

// A seed, the events run from it and the snapshot they ended in. Owns its
// event array. Thread-compatible.
typedef struct pcp_topology_trace_t {
  pcp_allocator_t allocator;
  uint64_t seed;
  pcp_topology_event_t* events;
  size_t event_count;
  size_t event_capacity;
  pcp_topology_snapshot_t final_snapshot;
} pcp_topology_trace_t;

void pcp_topology_trace_initialize(pcp_allocator_t allocator, uint64_t seed,
                                   pcp_topology_trace_t* out_trace);
void pcp_topology_trace_deinitialize(pcp_topology_trace_t* trace);
// Records one event (the recorder). RESOURCE_EXHAUSTED past
// PCP_TOPOLOGY_TRACE_MAX_EVENTS or when the allocator fails.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_trace_append(
    pcp_topology_trace_t* trace, pcp_topology_event_t event);
// Closes the trace with its final snapshot.
void pcp_topology_trace_finish(pcp_topology_trace_t* trace,
                               const pcp_topology_snapshot_t* snapshot);
// Appends the replay text: the header "topology-simulator-trace v1
// seed=<s> events=<n>\n", one line per event, then the snapshot line.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_trace_format(
    const pcp_topology_trace_t* trace, pcp_string_builder_t* builder);
// Parses the text written by pcp_topology_trace_format. INVALID_ARGUMENT
// names the line and the problem; never asserts on input.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_trace_parse(
    pcp_string_view_t text, pcp_allocator_t allocator,
    pcp_topology_trace_t* out_trace);

//===----------------------------------------------------------------------===//
// Solving and protocols: the two-node simulator
//===----------------------------------------------------------------------===//

// Node 0 is the gateway, node 1 the worker. Events are checked (actor and
// peer must be 0 or 1, a crashed node accepts only restart and join) and
// applied: send/deliver/duplicate/drop move the single pending message,
// crash/leave and restart/join toggle the node, cancel clears pending. The
// checksum starts at seed ^ "TOPO_SIM" and absorbs every event hash.
typedef struct pcp_topology_sim_t {
  uint32_t steps;
  uint64_t online_mask;
  uint32_t pending;
  uint32_t delivered;
  uint64_t checksum;
  pcp_topology_failure_t failure;
} pcp_topology_sim_t;

void pcp_topology_sim_initialize(uint64_t seed, pcp_topology_sim_t* out_sim);
// Applies |event|; returns false once the run has failed (the failing event
// still counts as a step). Events after a failure are ignored.
bool pcp_topology_sim_step(pcp_topology_sim_t* sim, pcp_topology_event_t event);
void pcp_topology_sim_snapshot(const pcp_topology_sim_t* sim,
                               pcp_topology_snapshot_t* out_snapshot);

// Runs |events| from |seed| and records them (up to and including the first
// failing one) into |out_trace|, which is initialized here.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_sim_run(
    uint64_t seed, const pcp_topology_event_t* events, size_t event_count,
    pcp_allocator_t allocator, pcp_topology_trace_t* out_trace);

// The event alphabets: "control" (timeout 0, heartbeat 1->0,
// local_step_complete 1) never fails; "valid" (send 0->1 m1, deliver 1<-0
// m1, timeout 0) is used to find invalid deliveries and duplicate sends.
void pcp_topology_sim_alphabet(bool include_invalid_events,
                               const pcp_topology_event_t** out_events,
                               size_t* out_count);

// Draws |event_count| events uniformly from the alphabet with a pcp_rng_t
// seeded by |seed| and runs them from the same seed.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_sim_random_trace(
    uint64_t seed, size_t event_count, bool include_invalid_events,
    pcp_allocator_t allocator, pcp_topology_trace_t* out_trace);

#define PCP_TOPOLOGY_SIM_MAX_DEPTH 8u

typedef struct pcp_topology_sim_exploration_t {
  uint64_t checked;  // schedules run (alphabet size ^ depth)
  uint64_t failed;   // schedules that ended in a failure
  bool has_failure;  // |first_failure| holds the first failing trace
  pcp_topology_trace_t first_failure;
} pcp_topology_sim_exploration_t;

// Runs every schedule of exactly |depth| events over the alphabet, in
// lexicographic alphabet order. INVALID_ARGUMENT when depth exceeds
// PCP_TOPOLOGY_SIM_MAX_DEPTH. Release the result with
// pcp_topology_sim_exploration_deinitialize.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_sim_explore_exhaustive(
    uint64_t seed, uint32_t depth, bool include_invalid_events,
    pcp_allocator_t allocator, pcp_topology_sim_exploration_t* out_result);
void pcp_topology_sim_exploration_deinitialize(
    pcp_topology_sim_exploration_t* result);

//===----------------------------------------------------------------------===//
// Solving and protocols: shrinking
//===----------------------------------------------------------------------===//

// Holds for a failing (seed, events) pair.
typedef bool (*pcp_topology_event_predicate_fn_t)(
    void* user_data, uint64_t seed, const pcp_topology_event_t* events,
    size_t event_count);

typedef struct pcp_topology_shrink_result_t {
  uint64_t seed;
  pcp_topology_event_t* events;  // owned; free with the allocator passed in
  size_t event_count;
  size_t deleted;                // events removed
  size_t predicate_calls;
} pcp_topology_shrink_result_t;

// Greedy one-at-a-time deletion, restarting at index 0 after each success,
// then seed minimisation (0, then 1, then repeated halving). The predicate
// must hold on the input (FAILED_PRECONDITION otherwise).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_events_shrink(
    pcp_allocator_t allocator, uint64_t seed,
    const pcp_topology_event_t* events, size_t event_count,
    pcp_topology_event_predicate_fn_t predicate, void* user_data,
    pcp_topology_shrink_result_t* out_result);
void pcp_topology_shrink_result_deinitialize(
    pcp_allocator_t allocator, pcp_topology_shrink_result_t* result);

// Holds for a failing subset, given as retained indices into the original
// list (ascending).
typedef bool (*pcp_topology_index_predicate_fn_t)(void* user_data,
                                                  const uint32_t* retained,
                                                  size_t retained_count);

// The same greedy deletion over the index list [0, |count|): participants,
// windows, workers. Returns the retained indices (owned, allocator).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_indices_shrink(
    pcp_allocator_t allocator, size_t count,
    pcp_topology_index_predicate_fn_t predicate, void* user_data,
    uint32_t** out_retained, size_t* out_retained_count);

//===----------------------------------------------------------------------===//
// Solving and protocols: replay fixtures and reports
//===----------------------------------------------------------------------===//

// A minimal replayable counterexample: which input, where the protocol
// ended, what it decided, which rule broke, and the events to replay.
// Strings are borrowed rendered forms ("{gateway.0:a, worker.0:b}").
typedef struct pcp_topology_counterexample_t {
  const char* input_simplex;
  const char* final_protocol_simplex;
  const char* output_decision;
  const char* violated_rule;
  uint64_t seed;
  const pcp_topology_event_t* events;
  size_t event_count;
} pcp_topology_counterexample_t;

// Human form, titled "topology simulator counterexample".
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_counterexample_format(
    const pcp_topology_counterexample_t* report, pcp_string_builder_t* builder);
// Compact JSON, schema "pcp.topology.replay.v1".
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_counterexample_format_json(
    const pcp_topology_counterexample_t* report, pcp_string_builder_t* builder);

// Smoke replay fixture (schema "pcp.topology.smoke_replay.v1"): a trace id,
// seed, the input and output labels and the events. Importing gives a trace
// whose snapshot has steps = event count and a checksum over seed, input,
// output and the event hashes.
typedef struct pcp_topology_smoke_replay_t {
  char* trace_id;  // owned
  char* input;     // owned
  char* output;    // owned
  pcp_topology_trace_t trace;
} pcp_topology_smoke_replay_t;

// Parses the JSON text. INVALID_ARGUMENT names the missing or malformed
// key; RESOURCE_EXHAUSTED when there are more than |max_events| events.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_smoke_replay_parse(
    pcp_string_view_t json_text, size_t max_events, pcp_allocator_t allocator,
    pcp_topology_smoke_replay_t* out_replay);
void pcp_topology_smoke_replay_deinitialize(
    pcp_topology_smoke_replay_t* replay);

// Review-artifact summary for CI: each artifact's signature before and after
// a change.
typedef struct pcp_topology_artifact_t {
  const char* name;
  bool has_before;
  uint64_t before;
  bool has_after;
  uint64_t after;
} pcp_topology_artifact_t;

// Appends "pcp topology artifact summary: N item(s)\n" and one line per
// artifact "- <name>: <unchanged|changed|added|removed>[ before=<hex>]
// [ after=<hex>]\n" (lower-case hex, no 0x).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_artifact_summary_format(
    const pcp_topology_artifact_t* artifacts, size_t artifact_count,
    pcp_string_builder_t* builder);

#endif  // PCP_TOPOLOGY_PROTOCOL_IMPL_H_
