// SPDX-License-Identifier: Apache-2.0
//
// The solving and protocols half of the topology module, private to
// src/topology (never included outside it): traces and the two-node
// simulator, shrinking, replay fixtures, decision-map search (native and
// Z3), protocol complexes, the task catalogue and protocol models,
// obstructions, coverage, composition, state-space exploration and the merge
// oracle. Built on the core in complex_impl.h.

#ifndef PCP_TOPOLOGY_PROTOCOLS_IMPL_H_
#define PCP_TOPOLOGY_PROTOCOLS_IMPL_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "topology/complex_impl.h"
#include "workloads/train/decoupled.h"

#ifdef __cplusplus
extern "C" {
#endif

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

// True for the 16 tags the protocol models use (all but noop and
// health_update): the milestone execution vocabulary.
bool pcp_topology_event_tag_is_execution_vocabulary(
    pcp_topology_event_tag_t tag);

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
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_trace_parse(pcp_string_view_t text, pcp_allocator_t allocator,
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
  size_t deleted;  // events removed
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

// One step of a model schedule for shrinking: what the model does (|kind|,
// the caller's own enum) and with which numbers (job, worker, clock...).
// Parameters shrink towards 0, so a caller whose 0 is a valid but "simplest"
// value gets the simplest counterexample.
#define PCP_TOPOLOGY_ACTION_MAX_PARAMETERS 3u

typedef struct pcp_topology_action_t {
  uint32_t kind;
  uint64_t parameters[PCP_TOPOLOGY_ACTION_MAX_PARAMETERS];
} pcp_topology_action_t;

// Holds for a failing schedule.
typedef bool (*pcp_topology_action_predicate_fn_t)(
    void* user_data, const pcp_topology_action_t* actions, size_t action_count);

typedef struct pcp_topology_action_shrink_result_t {
  pcp_topology_action_t* actions;  // owned; free with the allocator passed in
  size_t action_count;
  size_t deleted;             // actions removed
  size_t parameters_reduced;  // accepted parameter reductions
  size_t rounds;              // deletion + parameter rounds until fixed
  size_t predicate_calls;
} pcp_topology_action_shrink_result_t;

// Delta debugging over a model schedule, to a fixed point: (1) deletion of
// chunks of half, a quarter, ... of the schedule, then single actions until
// no single deletion keeps the failure (1-minimal); (2) each parameter is
// tried at 0, then halved while that keeps the failure; repeat (1) and (2)
// until a round changes nothing (at most 64 rounds). A smaller parameter can
// make an action redundant that was needed before (a clock of 0 is stale
// after one observed step), which is why the phases alternate. When both
// are stuck, (3) deletes one action while lowering one parameter of another
// (schedules of at most 16 actions), then the round restarts. The predicate
// must hold on the input (FAILED_PRECONDITION otherwise).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_actions_shrink(
    pcp_allocator_t allocator, const pcp_topology_action_t* actions,
    size_t action_count, pcp_topology_action_predicate_fn_t predicate,
    void* user_data, pcp_topology_action_shrink_result_t* out_result);
void pcp_topology_action_shrink_result_deinitialize(
    pcp_allocator_t allocator, pcp_topology_action_shrink_result_t* result);

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

//===----------------------------------------------------------------------===//
// Solving and protocols: decision-map search
//===----------------------------------------------------------------------===//

// Find delta: P -> O with delta o Xi(s) inside Delta(s) for every input face
// s. Both carriers are borrowed and must share their domain I.
typedef struct pcp_topology_decision_problem_t {
  const pcp_topology_carrier_map_t* execution;  // Xi: I -> P
  const pcp_topology_carrier_map_t* task;       // Delta: I -> O
} pcp_topology_decision_problem_t;

// Both carriers validate (monotone) and have the same domain by closure
// (ComplexMismatch).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_decision_problem_validate(
    const pcp_topology_decision_problem_t* problem);

typedef struct pcp_topology_search_options_t {
  uint32_t max_solutions;            // stop after this many maps (1)
  uint64_t max_assignments;          // complete assignments examined (100000)
  uint32_t max_unsat_core_vertices;  // largest core the sweep tries (10)
} pcp_topology_search_options_t;

pcp_topology_search_options_t pcp_topology_search_options_default(void);

typedef enum pcp_topology_search_status_e {
  PCP_TOPOLOGY_SEARCH_SATISFIABLE = 0,
  PCP_TOPOLOGY_SEARCH_UNSATISFIABLE = 1,
  PCP_TOPOLOGY_SEARCH_LIMIT_EXCEEDED = 2,
  PCP_TOPOLOGY_SEARCH_UNKNOWN = 3,  // an external solver said "unknown"
} pcp_topology_search_status_t;

typedef enum pcp_topology_unsat_reason_e {
  PCP_TOPOLOGY_UNSAT_REASON_NONE = 0,
  PCP_TOPOLOGY_UNSAT_REASON_EMPTY_CANDIDATE_SET = 1,
  PCP_TOPOLOGY_UNSAT_REASON_LOCAL_INCONSISTENCY = 2,
  PCP_TOPOLOGY_UNSAT_REASON_GLOBAL_INCONSISTENCY = 3,
  PCP_TOPOLOGY_UNSAT_REASON_SEARCH_LIMIT_EXCEEDED = 4,
  PCP_TOPOLOGY_UNSAT_REASON_SOLVER_CORE = 5,  // imported from Z3
} pcp_topology_unsat_reason_t;

const char* pcp_topology_search_status_name(pcp_topology_search_status_t s);
const char* pcp_topology_unsat_reason_name(pcp_topology_unsat_reason_t r);

// Result of a search. Initialize, pass to a search, then deinitialize. Owns
// the solution maps (which borrow the problem's P and O) and the core.
typedef struct pcp_topology_search_result_t {
  pcp_allocator_t allocator;
  pcp_topology_search_status_t status;
  uint64_t explored;  // complete assignments examined
  bool limit_exceeded;
  size_t solution_count;
  pcp_topology_vertex_map_t** solutions;
  pcp_topology_unsat_reason_t unsat_reason;
  // Protocol vertices of a minimal unsatisfiable set (sorted).
  pcp_topology_vertex_list_t core;
  // Z3 only: the names of the core assertions ("c_12"), owned.
  size_t core_name_count;
  char** core_names;
} pcp_topology_search_result_t;

void pcp_topology_search_result_initialize(
    pcp_allocator_t allocator, pcp_topology_search_result_t* out_result);
void pcp_topology_search_result_deinitialize(
    pcp_topology_search_result_t* result);

// Native depth-first search (reference s.2.3). Candidates of a protocol
// vertex: output vertices of its colour that lie in Delta(s) for every
// input face s whose Xi(s) contains it. Variables go fewest-candidates
// first; every fully assigned face of P must land in O and every fully
// assigned face of Xi(s) in Delta(s). Each complete assignment is re-checked
// with pcp_topology_carried_decision_map_validate before it counts. When no
// map exists, |result| carries a minimal unsatisfiable core. |result| is
// reset first. Not finding a map is not an error (status OK).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_decision_maps_enumerate(
    const pcp_topology_decision_problem_t* problem,
    pcp_topology_search_options_t options,
    pcp_topology_search_result_t* inout_result);
// enumerate() with max_solutions = 1.
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_decision_map_solve(const pcp_topology_decision_problem_t* problem,
                                pcp_topology_search_options_t options,
                                pcp_topology_search_result_t* inout_result);

//===----------------------------------------------------------------------===//
// Solving and protocols: SMT-LIB and Z3
//===----------------------------------------------------------------------===//

typedef struct pcp_topology_smtlib_options_t {
  uint32_t timeout_ms;            // 0: no (set-option :timeout)
  bool produce_unsat_cores;       // name every assertion c_K
  bool include_check_sat;         // (check-sat), default true
  bool include_model_query;       // (get-value (x_0_0 ...))
  bool include_unsat_core_query;  // (get-unsat-core)
} pcp_topology_smtlib_options_t;

pcp_topology_smtlib_options_t pcp_topology_smtlib_options_default(void);

// Writes the QF_BOOL encoding of reference s.2.4: one Boolean x_i_j per
// (protocol vertex i, candidate j), exactly-one per vertex, and a forbidden
// tuple for every candidate combination of a face of P outside O and of a
// face of Xi(s) outside Delta(s). RESOURCE_EXHAUSTED past
// PCP_TOPOLOGY_MAX_SMT_CLAUSES clauses.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_smtlib_write(
    const pcp_topology_decision_problem_t* problem,
    pcp_topology_smtlib_options_t options, pcp_string_builder_t* builder);

typedef enum pcp_topology_solver_backend_e {
  // libz3 through its C API (Z3_eval_smtlib2_string on the same text).
  PCP_TOPOLOGY_SOLVER_BACKEND_Z3_LIBRARY = 0,
  // The z3 executable: `z3 -smt2 <file>` on a temporary file.
  PCP_TOPOLOGY_SOLVER_BACKEND_Z3_BINARY = 1,
} pcp_topology_solver_backend_t;

typedef struct pcp_topology_solver_options_t {
  pcp_topology_solver_backend_t backend;
  const char* executable;   // binary backend; NULL = "z3" on PATH
  uint32_t timeout_ms;      // 30000
  size_t max_output_bytes;  // 1 MiB
  bool request_unsat_core;  // true
} pcp_topology_solver_options_t;

pcp_topology_solver_options_t pcp_topology_solver_options_default(void);

// True when the backend can run (library compiled in / binary answers
// -version).
bool pcp_topology_solver_available(pcp_topology_solver_backend_t backend);

// Solves with Z3 (reference s.2.4 driver): status run, then a model run
// (sat; the model is rebuilt as a vertex map and re-checked natively with
// pcp_topology_carried_decision_map_validate) or a core run (unsat; core
// names are imported and mapped back to protocol vertices). UNAVAILABLE
// when the backend is missing; INTERNAL when the solver misbehaves
// (missing status, a model that fails the native check, ...).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_decision_map_solve_z3(
    const pcp_topology_decision_problem_t* problem,
    pcp_topology_solver_options_t options,
    pcp_topology_search_result_t* inout_result);

// Parsers for solver answers (exposed for tests): the first of sat / unsat /
// unknown; "x_i_j" tokens followed by "true" (|out_assignment[i]| = j,
// others UINT32_MAX; INVALID_ARGUMENT on a duplicate or out-of-range
// assignment); "c_<int>" core names.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_solver_parse_status(
    pcp_string_view_t answer, pcp_topology_search_status_t* out_status);
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_solver_parse_model(
    pcp_string_view_t answer, size_t source_count,
    const uint32_t* candidate_counts, uint32_t* out_assignment,
    size_t* out_assigned_count);
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_solver_parse_core(pcp_string_view_t answer, uint32_t* out_ids,
                               size_t capacity, size_t* out_count);

//===----------------------------------------------------------------------===//
// Solving and protocols: protocol-complex generation
//===----------------------------------------------------------------------===//

#define PCP_TOPOLOGY_MAX_PROCESSES 64u
#define PCP_TOPOLOGY_MAX_GENERATION_DEPTH 10u

// A simulated process: the node id used in events and its colour.
typedef struct pcp_topology_process_t {
  uint16_t id;
  pcp_topology_color_t color;
} pcp_topology_process_t;

// At most PCP_TOPOLOGY_MAX_PROCESSES, unique ids (INVALID_ARGUMENT), unique
// colours (DuplicateColor).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_process_set_validate(
    const pcp_topology_process_t* processes, size_t count);
// Every actor and peer of |events| is a process (INVALID_ARGUMENT).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_event_alphabet_validate(
    const pcp_topology_process_t* processes, size_t process_count,
    const pcp_topology_event_t* events, size_t event_count);

// Per-trace seed of random generation: seed, face ordinal and trace ordinal
// through a splitmix/murmur finaliser.
uint64_t pcp_topology_mix_seed(uint64_t seed, uint64_t face, uint64_t k);

// The model under test: runs |events| from |seed| on the processes of
// |input_face| and appends the local-view simplex they end with to
// |out_view| (one vertex per process, chromatic) and a hash of the final
// state to |out_state_hash|. Must be deterministic.
typedef pcp_status_t (*pcp_topology_view_fn_t)(
    void* user_data, pcp_topology_simplex_t input_face, uint64_t seed,
    const pcp_topology_event_t* events, size_t event_count,
    pcp_topology_vertex_list_t* out_view, uint64_t* out_state_hash);

typedef struct pcp_topology_generation_options_t {
  uint64_t seed;
  uint32_t depth;                // events per schedule, <= 10 (DepthTooLarge)
  bool partial_order_reduction;  // exhaustive mode (default true)
  bool require_nonempty_inputs;  // EmptyExecutionCarrier (default true)
  uint32_t traces_per_face;      // random mode (default 1)
} pcp_topology_generation_options_t;

pcp_topology_generation_options_t pcp_topology_generation_options_default(void);

// One recorded schedule: which input face (index into |input_faces|) reached
// which protocol simplex (index into |protocol|), through which trace.
typedef struct pcp_topology_generation_witness_t {
  uint32_t input_index;
  uint32_t protocol_index;
  uint32_t trace_index;
  uint32_t event_count;
  uint64_t state_hash;
} pcp_topology_generation_witness_t;

// Generated P, Xi: I -> P and the witnesses. Caller-embedded; owns
// everything (Xi borrows the input complex passed to the generator, which
// must outlive the result).
typedef struct pcp_topology_protocol_complex_t {
  pcp_allocator_t allocator;
  pcp_topology_complex_t* input_faces;  // faces of I in faces() order
  pcp_topology_complex_t* protocol;     // views, first-seen order
  pcp_topology_carrier_map_t* execution;
  pcp_topology_trace_t* traces;  // snapshot: steps = events, checksum = state
  pcp_topology_generation_witness_t* witnesses;  // one per trace
  size_t trace_count;
  size_t trace_capacity;
} pcp_topology_protocol_complex_t;

void pcp_topology_protocol_complex_initialize(
    pcp_allocator_t allocator, pcp_topology_protocol_complex_t* out_result);
void pcp_topology_protocol_complex_deinitialize(
    pcp_topology_protocol_complex_t* result);

// For each face F of |input| (faces order) runs every schedule of exactly
// options.depth events drawn from the alphabet events whose actor (and
// peer) colours lie in F, pruned by partial-order reduction; depth 0 runs
// the empty schedule once. Xi(F) = the views recorded for F; Xi is validated
// as monotone. RESOURCE_EXHAUSTED past 2^20 schedules.
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_protocol_complex_generate_exhaustive(
    const pcp_topology_complex_t* input,
    const pcp_topology_process_t* processes, size_t process_count,
    const pcp_topology_event_t* alphabet, size_t alphabet_count,
    pcp_topology_generation_options_t options, pcp_topology_view_fn_t view_fn,
    void* user_data, pcp_topology_protocol_complex_t* inout_result);

// The same with options.traces_per_face schedules per face drawn from one
// pcp_rng_t seeded by options.seed; trace k of face f gets the seed
// pcp_topology_mix_seed(seed, f, k). A sample need not be monotone, so Xi is
// not validated here.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_protocol_complex_generate_random(
    const pcp_topology_complex_t* input,
    const pcp_topology_process_t* processes, size_t process_count,
    const pcp_topology_event_t* alphabet, size_t alphabet_count,
    pcp_topology_generation_options_t options, pcp_topology_view_fn_t view_fn,
    void* user_data, pcp_topology_protocol_complex_t* inout_result);

// Shrinks a schedule while replaying it still ends at |target|
// (FAILED_PRECONDITION "PredicateDoesNotHold" when it does not to begin
// with). Release |out_result| with pcp_topology_shrink_result_deinitialize.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_trace_shrink_to_protocol_simplex(
    pcp_topology_view_fn_t view_fn, void* user_data,
    pcp_topology_simplex_t input_face, pcp_topology_simplex_t target,
    uint64_t seed, const pcp_topology_event_t* events, size_t event_count,
    pcp_allocator_t allocator, pcp_topology_shrink_result_t* out_result);

//===----------------------------------------------------------------------===//
// Solving and protocols: the task catalogue
//===----------------------------------------------------------------------===//

// The PCP coordination tasks (reference s.3.1). Numbers are stable: they
// index coverage tables.
typedef enum pcp_topology_task_kind_e {
  PCP_TOPOLOGY_TASK_MESSAGE_DISPATCH = 0,
  PCP_TOPOLOGY_TASK_WORKLOAD_NORMALIZATION = 1,
  PCP_TOPOLOGY_TASK_GATEWAY_LEASE_SCHEDULING = 2,
  PCP_TOPOLOGY_TASK_RESERVATION_LIFECYCLE = 3,
  PCP_TOPOLOGY_TASK_FEDERATION_PLACEMENT = 4,
  PCP_TOPOLOGY_TASK_DECOUPLED_FRAGMENT = 5,
  PCP_TOPOLOGY_TASK_RDA_MERGE = 6,
  PCP_TOPOLOGY_TASK_MULTI_GATEWAY_GLOBAL_JOB = 7,
  PCP_TOPOLOGY_TASK_KIND_COUNT_ = 8,
} pcp_topology_task_kind_t;

// How strongly a task's carrier is tied to the implementation, weakest
// first. Printed as "symbolic_carrier", ..., "generated_Xi", ....
typedef enum pcp_topology_evidence_e {
  PCP_TOPOLOGY_EVIDENCE_SYMBOLIC_CARRIER = 0,
  PCP_TOPOLOGY_EVIDENCE_PRODUCTION_FIXTURE = 1,
  PCP_TOPOLOGY_EVIDENCE_BOUNDED_MODEL = 2,
  PCP_TOPOLOGY_EVIDENCE_GENERATED_XI = 3,
  PCP_TOPOLOGY_EVIDENCE_SOLVER_CHECKED = 4,
  PCP_TOPOLOGY_EVIDENCE_SMOKE_REPLAY = 5,
} pcp_topology_evidence_t;

const char* pcp_topology_evidence_name(pcp_topology_evidence_t evidence);

#define PCP_TOPOLOGY_TASK_MAX_COLORS 4u
#define PCP_TOPOLOGY_TASK_MAX_OUTPUTS 2u

// One case of a task: the processes' local inputs (one symbol per colour,
// in |colors| order) and up to two allowed output facets. Static data.
typedef struct pcp_topology_task_case_t {
  uint32_t color_count;
  pcp_topology_color_t colors[PCP_TOPOLOGY_TASK_MAX_COLORS];
  const char* input[PCP_TOPOLOGY_TASK_MAX_COLORS];
  uint32_t output_count;
  const char* outputs[PCP_TOPOLOGY_TASK_MAX_OUTPUTS]
                     [PCP_TOPOLOGY_TASK_MAX_COLORS];
} pcp_topology_task_case_t;

typedef struct pcp_topology_task_definition_t {
  pcp_topology_task_kind_t kind;
  const char* name;                // "message_dispatch"
  const char* title;               // "message dispatch"
  const char* production_surface;  // what the carrier stands for
  pcp_topology_evidence_t evidence;
  bool design_only;  // no implementation yet (the global job)
  const pcp_topology_task_case_t* cases;
  size_t case_count;
} pcp_topology_task_definition_t;

// The eight tasks (static, thread-safe).
const pcp_topology_task_definition_t* pcp_topology_task_catalog(
    size_t* out_count);
const pcp_topology_task_definition_t* pcp_topology_task_definition(
    pcp_topology_task_kind_t kind);
// By name; NULL when unknown.
const pcp_topology_task_definition_t* pcp_topology_task_find(
    pcp_string_view_t name);

// Writes the vertices of a case's input (|output| < 0) or of output facet
// |output| into |out| (color_count entries; symbols borrowed from the case).
void pcp_topology_task_case_vertices(const pcp_topology_task_case_t* task_case,
                                     int output, pcp_topology_vertex_t* out);
// Restricts |simplex| to the colours of |colors| (in |colors| order);
// |out_complete| false when |simplex| lacks one of them.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_project_to_colors(
    pcp_topology_simplex_t simplex, pcp_topology_simplex_t colors,
    pcp_topology_vertex_t* out_vertices, bool* out_complete);

// A built task: I, O and Delta. Owns all three (Delta borrows I and O).
typedef struct pcp_topology_task_t {
  const pcp_topology_task_definition_t* definition;  // NULL for ad-hoc cases
  pcp_topology_complex_t* input;
  pcp_topology_complex_t* output;
  pcp_topology_carrier_map_t* carrier;
} pcp_topology_task_t;

// I = the case inputs, O = every case output, Delta(empty) = {empty} and
// Delta(F) = each output of the unique case containing F projected onto F's
// colours (UncoveredTaskFace when no or several cases contain F,
// OutputFacetMissingColor, TaskOutputProjectionOutsideOutputComplex).
// Delta is validated monotone and chromatic.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_task_build_from_cases(
    const pcp_topology_task_case_t* cases, size_t case_count,
    pcp_allocator_t allocator, pcp_topology_task_t* out_task);
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_task_build(
    pcp_topology_task_kind_t kind, pcp_allocator_t allocator,
    pcp_topology_task_t* out_task);
void pcp_topology_task_deinitialize(pcp_topology_task_t* task);

//===----------------------------------------------------------------------===//
// Solving and protocols: protocol stubs (protocol_stubs.c)
//===----------------------------------------------------------------------===//
//
// The production definitions the models check (protocol_stubs.c): the
// fabric's wire messages read from src/proto, and STUBS of the upstream
// workload message registry, scheduler, federation registry, decoupled
// window and RDA merge where this tree has no module with the same
// semantics (see the note at the top of that file). All plain data and pure
// functions; thread-compatible.

typedef enum pcp_topology_message_family_e {
  PCP_TOPOLOGY_FAMILY_WORKER_CONTROL = 0,
  PCP_TOPOLOGY_FAMILY_ARTIFACT_TRANSFER = 1,
  PCP_TOPOLOGY_FAMILY_REGULAR_TRAINING = 2,
  PCP_TOPOLOGY_FAMILY_STREAMING_DILOCO = 3,
  PCP_TOPOLOGY_FAMILY_DECOUPLED_TRAINING = 4,
  PCP_TOPOLOGY_FAMILY_INFERENCE = 5,
  PCP_TOPOLOGY_FAMILY_RL = 6,
  PCP_TOPOLOGY_FAMILY_COUNT_ = 7,
} pcp_topology_message_family_t;

typedef enum pcp_topology_message_direction_e {
  PCP_TOPOLOGY_MESSAGE_WORKER_TO_CONTROLLER = 0,
  PCP_TOPOLOGY_MESSAGE_CONTROLLER_TO_WORKER = 1,
  PCP_TOPOLOGY_MESSAGE_SUPERVISOR_TO_CONTROLLER = 2,
  PCP_TOPOLOGY_MESSAGE_CONTROLLER_TO_SUPERVISOR = 3,
} pcp_topology_message_direction_t;

typedef enum pcp_topology_worker_handler_e {
  PCP_TOPOLOGY_HANDLER_NONE = 0,
  PCP_TOPOLOGY_HANDLER_GRAPH = 1,
  PCP_TOPOLOGY_HANDLER_TRANSFER = 2,
  PCP_TOPOLOGY_HANDLER_REGULAR_TRAINING = 3,
  PCP_TOPOLOGY_HANDLER_DECOUPLED_TRAINING = 4,
  PCP_TOPOLOGY_HANDLER_STREAMING_DILOCO = 5,
  PCP_TOPOLOGY_HANDLER_RL = 6,
  PCP_TOPOLOGY_HANDLER_INFERENCE = 7,
  PCP_TOPOLOGY_HANDLER_LIFECYCLE = 8,
  PCP_TOPOLOGY_HANDLER_COUNT_ = 9,
} pcp_topology_worker_handler_t;

typedef struct pcp_topology_message_entry_t {
  const char* name;  // the wire message type, "StartGeneration"
  pcp_topology_message_family_t family;
  pcp_topology_message_direction_t direction;
  bool queued;  // W->C messages the gateway puts in its result queue
  pcp_topology_worker_handler_t handler;  // NONE: no worker-side handler
} pcp_topology_message_entry_t;

// The 32 public message types (static).
const pcp_topology_message_entry_t* pcp_topology_message_catalog(
    size_t* out_count);
const char* pcp_topology_message_family_name(
    pcp_topology_message_family_t family);
const char* pcp_topology_worker_handler_name(
    pcp_topology_worker_handler_t handler);
// Entry named |name| in |catalog| (a copy may carry injected bugs); NULL.
const pcp_topology_message_entry_t* pcp_topology_message_lookup(
    const pcp_topology_message_entry_t* catalog, size_t count,
    const char* name);

typedef enum pcp_topology_dispatch_e {
  PCP_TOPOLOGY_DISPATCH_CONTROLLER_TO_WORKER = 0,
  PCP_TOPOLOGY_DISPATCH_GATEWAY_QUEUE_ONLY = 1,
  PCP_TOPOLOGY_DISPATCH_GATEWAY_HANDLED = 2,
  PCP_TOPOLOGY_DISPATCH_FAIL_CLOSED = 3,
} pcp_topology_dispatch_t;

// The gateway's routing rule: C->W messages go to a worker, queued W->C
// results stay in the gateway queue, unknown messages fail closed.
pcp_topology_dispatch_t pcp_topology_message_dispatch(
    const pcp_topology_message_entry_t* catalog, size_t count,
    const char* name);

typedef enum pcp_topology_handler_verdict_e {
  PCP_TOPOLOGY_HANDLER_VERDICT_ACCEPTED = 0,
  PCP_TOPOLOGY_HANDLER_VERDICT_WRONG_WORKER_HANDLER = 1,
  PCP_TOPOLOGY_HANDLER_VERDICT_NO_WORKER_HANDLER = 2,
  PCP_TOPOLOGY_HANDLER_VERDICT_UNKNOWN_MESSAGE = 3,
} pcp_topology_handler_verdict_t;

// Worker-side acceptance of |name| claimed by handler |claimed|.
pcp_topology_handler_verdict_t pcp_topology_worker_handler_check(
    const pcp_topology_message_entry_t* catalog, size_t count, const char* name,
    pcp_topology_worker_handler_t claimed);

// The fabric's own wire messages (src/proto, docs/protocol.md s.3), read
// from proto's message-type table, so a type added to, renamed in or
// removed from the real protocol changes this catalogue. proto exports no
// direction table, so each type's direction is stated in protocol_stubs.c,
// keyed by proto's enumerators: a removed type no longer compiles, and a
// type proto knows without a direction here makes the catalogue fail.
typedef enum pcp_topology_fabric_direction_e {
  PCP_TOPOLOGY_FABRIC_WORKER_TO_GATEWAY = 1,
  PCP_TOPOLOGY_FABRIC_GATEWAY_TO_WORKER = 2,
  PCP_TOPOLOGY_FABRIC_BOTH = 3,
} pcp_topology_fabric_direction_t;

typedef struct pcp_topology_fabric_message_t {
  uint16_t type;     // the wire number
  const char* name;  // proto's name, "TASK_ASSIGN" (static)
  pcp_topology_fabric_direction_t direction;
} pcp_topology_fabric_message_t;

#define PCP_TOPOLOGY_FABRIC_MAX_MESSAGES 64u

// Every message type proto knows, ascending by number. FAILED_PRECONDITION
// naming the first type proto knows that has no direction here (the
// topology is out of sync with the protocol), or a direction for a type
// proto no longer names; RESOURCE_EXHAUSTED past |capacity|.
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_fabric_catalog(pcp_topology_fabric_message_t* out_messages,
                            size_t capacity, size_t* out_count);
const char* pcp_topology_fabric_direction_name(
    pcp_topology_fabric_direction_t direction);

typedef enum pcp_topology_training_kind_e {
  PCP_TOPOLOGY_TRAINING_REGULAR = 0,
  PCP_TOPOLOGY_TRAINING_DECOUPLED = 1,
  PCP_TOPOLOGY_TRAINING_STREAMING = 2,
  PCP_TOPOLOGY_TRAINING_INVALID = 3,
} pcp_topology_training_kind_t;

// "{}" and bodies without "training_kind" are regular.
pcp_topology_training_kind_t pcp_topology_training_kind_from_request_body(
    const char* body);
// Regular training with a known session is routed to the regular training
// service; anything else is rejected.
bool pcp_topology_workload_route_regular(const char* body,
                                         const char* session_id);

// Scheduler. Owners: inference 0, training 1, rl 2.
#define PCP_TOPOLOGY_SCHED_MAX_WORKERS 8u
#define PCP_TOPOLOGY_SCHED_MAX_RESERVATIONS 8u
#define PCP_TOPOLOGY_SCHED_MAX_QUEUE 8u
#define PCP_TOPOLOGY_SCHED_OWNER_COUNT 3u
#define PCP_TOPOLOGY_SCHED_OWNER_INFERENCE 0u
#define PCP_TOPOLOGY_SCHED_OWNER_TRAINING 1u
#define PCP_TOPOLOGY_SCHED_OWNER_RL 2u

typedef enum pcp_topology_worker_class_e {
  PCP_TOPOLOGY_WORKER_CLASS_ANY = 0,
  PCP_TOPOLOGY_WORKER_CLASS_CPU = 1,
  PCP_TOPOLOGY_WORKER_CLASS_CUDA = 2,
  PCP_TOPOLOGY_WORKER_CLASS_ROCM = 3,
  PCP_TOPOLOGY_WORKER_CLASS_METAL = 4,
  PCP_TOPOLOGY_WORKER_CLASS_VULKAN = 5,
} pcp_topology_worker_class_t;

// "any", "cpu", "cuda", "rocm" (alias "hip"), "metal", "vulkan".
bool pcp_topology_worker_class_parse(const char* name,
                                     pcp_topology_worker_class_t* out_class);

typedef struct pcp_topology_sched_policy_t {
  pcp_topology_worker_class_t worker_class;
  const char* target_arch;    // NULL: any arch
  uint32_t reserved_workers;  // kept free for this owner
  uint32_t max_workers;       // 0: unlimited
} pcp_topology_sched_policy_t;

// Class any or equal, and the exact arch when the policy names one.
bool pcp_topology_sched_policy_allows(const pcp_topology_sched_policy_t* policy,
                                      pcp_topology_worker_class_t worker_class,
                                      const char* arch);

typedef enum pcp_topology_worker_state_e {
  PCP_TOPOLOGY_WORKER_OFFLINE = 0,
  PCP_TOPOLOGY_WORKER_IDLE = 1,
  PCP_TOPOLOGY_WORKER_RESERVED = 2,
  PCP_TOPOLOGY_WORKER_ASSIGNED = 3,
} pcp_topology_worker_state_t;

typedef enum pcp_topology_sched_decision_e {
  PCP_TOPOLOGY_SCHED_IDLE = 0,
  PCP_TOPOLOGY_SCHED_RESERVED = 1,
  PCP_TOPOLOGY_SCHED_COMMITTED = 2,
  PCP_TOPOLOGY_SCHED_QUEUED = 3,
  PCP_TOPOLOGY_SCHED_STARTED = 4,
  PCP_TOPOLOGY_SCHED_COMPLETED = 5,
  PCP_TOPOLOGY_SCHED_RELEASED = 6,
  PCP_TOPOLOGY_SCHED_EXPIRED = 7,
  PCP_TOPOLOGY_SCHED_CANCELED = 8,
  PCP_TOPOLOGY_SCHED_REJECTED = 9,
} pcp_topology_sched_decision_t;

typedef enum pcp_topology_sched_violation_e {
  PCP_TOPOLOGY_SCHED_VIOLATION_NONE = 0,
  PCP_TOPOLOGY_SCHED_VIOLATION_INVALID_WORKER = 1,
  PCP_TOPOLOGY_SCHED_VIOLATION_INVALID_REQUEST = 2,
  PCP_TOPOLOGY_SCHED_VIOLATION_DUPLICATE_JOB_RESERVATION = 3,
  PCP_TOPOLOGY_SCHED_VIOLATION_DUPLICATE_WORKER_RESERVATION = 4,
  PCP_TOPOLOGY_SCHED_VIOLATION_DUPLICATE_QUEUED_JOB = 5,
  PCP_TOPOLOGY_SCHED_VIOLATION_RESERVATION_NOT_FOUND = 6,
  PCP_TOPOLOGY_SCHED_VIOLATION_RESERVATION_UNAVAILABLE = 7,
  PCP_TOPOLOGY_SCHED_VIOLATION_ASSIGNMENT_AFTER_WORKER_LOSS = 8,
  PCP_TOPOLOGY_SCHED_VIOLATION_WORKER_ALREADY_BUSY = 9,
  PCP_TOPOLOGY_SCHED_VIOLATION_QUEUE_FULL = 10,
  PCP_TOPOLOGY_SCHED_VIOLATION_QUEUED_JOB_NOT_FOUND = 11,
  PCP_TOPOLOGY_SCHED_VIOLATION_ACTIVE_JOB_NOT_FOUND = 12,
} pcp_topology_sched_violation_t;

// Why the last reservation found too few workers.
typedef enum pcp_topology_sched_block_e {
  PCP_TOPOLOGY_SCHED_BLOCK_NONE = 0,
  PCP_TOPOLOGY_SCHED_BLOCK_BUSY = 1,
  PCP_TOPOLOGY_SCHED_BLOCK_POLICY = 2,
  PCP_TOPOLOGY_SCHED_BLOCK_MAX_WORKERS = 3,
  PCP_TOPOLOGY_SCHED_BLOCK_RESERVED_CAPACITY = 4,
} pcp_topology_sched_block_t;

typedef struct pcp_topology_sched_worker_t {
  uint32_t id;
  pcp_topology_worker_class_t worker_class;
  const char* arch;  // borrowed
  pcp_topology_worker_state_t state;
  int32_t owner;        // -1: unowned
  int32_t reservation;  // -1: none
  uint32_t job;
} pcp_topology_sched_worker_t;

typedef struct pcp_topology_sched_reservation_t {
  bool active;
  uint32_t job;
  uint32_t owner;
  uint32_t workers_required;
  // The workers it was granted, by index into |workers|; a restored worker
  // leaves it (its lease fields are cleared), so this is what the
  // reservation still believes it holds.
  uint32_t worker_mask;
} pcp_topology_sched_reservation_t;

typedef struct pcp_topology_sched_queued_t {
  uint32_t job;
  uint32_t owner;
  uint32_t workers;
  int32_t reservation;  // >= 0 for committed reservations (queue head)
} pcp_topology_sched_queued_t;

typedef struct pcp_topology_sched_active_t {
  bool in_use;
  uint32_t job;
  uint32_t owner;
  uint32_t workers;
} pcp_topology_sched_active_t;

typedef struct pcp_topology_sched_t {
  pcp_topology_sched_worker_t workers[PCP_TOPOLOGY_SCHED_MAX_WORKERS];
  uint32_t worker_count;
  pcp_topology_sched_policy_t policies[PCP_TOPOLOGY_SCHED_OWNER_COUNT];
  pcp_topology_sched_reservation_t
      reservations[PCP_TOPOLOGY_SCHED_MAX_RESERVATIONS];
  pcp_topology_sched_queued_t queue[PCP_TOPOLOGY_SCHED_MAX_QUEUE];
  uint32_t queue_count;
  pcp_topology_sched_active_t active[PCP_TOPOLOGY_SCHED_MAX_RESERVATIONS];
  pcp_topology_sched_decision_t decision;
  pcp_topology_sched_violation_t violation;  // last rejection
  pcp_topology_sched_block_t block;
  // Injected bugs for the regression models.
  bool bug_ignore_reserved_capacity;
  bool bug_leak_on_cancel;
  // Reserve treats a worker another reservation holds as free (upstream's
  // injected duplicate_worker_reservation).
  bool bug_duplicate_worker_reservation;
  // Commit assigns a reservation without checking that its workers are
  // still there (upstream's injected assignment_after_worker_loss).
  bool bug_commit_after_loss;
} pcp_topology_sched_t;

void pcp_topology_sched_initialize(pcp_topology_sched_t* out_sched);
// RESOURCE_EXHAUSTED past PCP_TOPOLOGY_SCHED_MAX_WORKERS.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_sched_add_worker(
    pcp_topology_sched_t* sched, uint32_t id,
    pcp_topology_worker_class_t worker_class, const char* arch);
// Leases |workers_required| idle workers first-fit for |owner| (all or
// nothing). Returns the reservation slot or -1 with |violation| set.
int32_t pcp_topology_sched_reserve(pcp_topology_sched_t* sched, uint32_t job,
                                   uint32_t owner, uint32_t workers_required);
void pcp_topology_sched_commit(pcp_topology_sched_t* sched, uint32_t job);
void pcp_topology_sched_commit_to_queue(pcp_topology_sched_t* sched,
                                        uint32_t job);
void pcp_topology_sched_enqueue(pcp_topology_sched_t* sched, uint32_t job,
                                uint32_t owner, uint32_t workers);
// Starts the queue head; returns its job id (0 when nothing started).
uint32_t pcp_topology_sched_start_next(pcp_topology_sched_t* sched);
void pcp_topology_sched_complete(pcp_topology_sched_t* sched, uint32_t job);
void pcp_topology_sched_cancel_queued(pcp_topology_sched_t* sched,
                                      uint32_t job);
void pcp_topology_sched_cancel_active(pcp_topology_sched_t* sched,
                                      uint32_t job);
// The gateway's job cancel, whatever the job's state: a queued job is
// removed (cancel_queued), an active one ended (cancel_active), a job that
// only holds an open reservation has it dropped and its workers freed. The
// cleanup-leak bug forgets the workers on both reservation paths.
// QUEUED_JOB_NOT_FOUND for a job the scheduler does not know.
void pcp_topology_sched_cancel(pcp_topology_sched_t* sched, uint32_t job);
void pcp_topology_sched_release(pcp_topology_sched_t* sched, uint32_t job);
void pcp_topology_sched_expire(pcp_topology_sched_t* sched, uint32_t job);
void pcp_topology_sched_lose_worker(pcp_topology_sched_t* sched, uint32_t id);
void pcp_topology_sched_restore_worker(pcp_topology_sched_t* sched,
                                       uint32_t id);
uint32_t pcp_topology_sched_owner_leases(const pcp_topology_sched_t* sched,
                                         uint32_t owner);
// Non-offline workers the owner's policy admits, unowned or its own.
uint32_t pcp_topology_sched_owner_capacity(const pcp_topology_sched_t* sched,
                                           uint32_t owner);
// Workers the owner could still lease (greedy, hypothetical).
uint32_t pcp_topology_sched_owner_available(const pcp_topology_sched_t* sched,
                                            uint32_t owner);
uint32_t pcp_topology_sched_count_state(const pcp_topology_sched_t* sched,
                                        pcp_topology_worker_state_t state);
uint32_t pcp_topology_sched_active_reservations(
    const pcp_topology_sched_t* sched);

// Invariants of the scheduler state (the scheduling oracle, run after every
// explored step, TigerBeetle-checker style). Returns the first broken one.
typedef enum pcp_topology_sched_invariant_e {
  PCP_TOPOLOGY_SCHED_INVARIANT_OK = 0,
  // A reserved worker whose reservation is gone (a cleanup leak).
  PCP_TOPOLOGY_SCHED_INVARIANT_ORPHAN_RESERVED_WORKER = 1,
  // An active reservation holding more workers than it was granted (a
  // worker leased twice). Fewer is legal: a lost and restored worker leaves
  // its reservation short, and the commit reports the loss.
  PCP_TOPOLOGY_SCHED_INVARIANT_RESERVATION_OVERFULL = 2,
  // An assigned worker with no active job of its owner.
  PCP_TOPOLOGY_SCHED_INVARIANT_ORPHAN_ASSIGNED_WORKER = 3,
  // An owner above its max_workers.
  PCP_TOPOLOGY_SCHED_INVARIANT_MAX_WORKERS_EXCEEDED = 4,
  // An owner's reserved_workers no longer available to it.
  PCP_TOPOLOGY_SCHED_INVARIANT_RESERVED_CAPACITY_STARVED = 5,
  // A queued reserved job whose reservation is gone.
  PCP_TOPOLOGY_SCHED_INVARIANT_QUEUED_RESERVATION_MISSING = 6,
  // An idle worker that still has an owner or a job.
  PCP_TOPOLOGY_SCHED_INVARIANT_IDLE_WORKER_OWNED = 7,
  // A worker that two active reservations both hold (upstream violation
  // duplicate_worker_reservation; the real scheduler's "every worker holds
  // at most one lease or one reservation slot").
  PCP_TOPOLOGY_SCHED_INVARIANT_DUPLICATE_WORKER_RESERVATION = 8,
} pcp_topology_sched_invariant_t;

const char* pcp_topology_sched_invariant_name(
    pcp_topology_sched_invariant_t invariant);
pcp_topology_sched_invariant_t pcp_topology_sched_check_invariants(
    const pcp_topology_sched_t* sched);

// Federation hub.
#define PCP_TOPOLOGY_FEDERATION_MAX_GATEWAYS 6u
#define PCP_TOPOLOGY_FEDERATION_MAX_SERVICES 8u
#define PCP_TOPOLOGY_FEDERATION_MAX_CAPABILITIES 4u

typedef struct pcp_topology_federation_service_t {
  const char* service_type;
  const char* capabilities[PCP_TOPOLOGY_FEDERATION_MAX_CAPABILITIES];
  uint32_t workers_available;
  uint32_t workers_ready;
  bool health_ok;
  uint64_t updated_at;
} pcp_topology_federation_service_t;

typedef struct pcp_topology_federation_gateway_t {
  const char* name;
  bool connected;
  uint32_t generation;  // bumped by register, mark_stale and lose
  pcp_topology_federation_service_t
      services[PCP_TOPOLOGY_FEDERATION_MAX_SERVICES];
  uint32_t service_count;
} pcp_topology_federation_gateway_t;

typedef struct pcp_topology_federation_t {
  pcp_topology_federation_gateway_t
      gateways[PCP_TOPOLOGY_FEDERATION_MAX_GATEWAYS];
  uint32_t gateway_count;
  // Injected bug (the registry's test-only option): place on stale gateways.
  bool bug_accept_stale;
} pcp_topology_federation_t;

typedef struct pcp_topology_federation_selector_t {
  const char* gateway;       // NULL: any gateway
  const char* service_type;  // required
  uint32_t workers_required;
} pcp_topology_federation_selector_t;

typedef enum pcp_topology_federation_violation_e {
  PCP_TOPOLOGY_FEDERATION_VIOLATION_NONE = 0,
  PCP_TOPOLOGY_FEDERATION_VIOLATION_INVALID_REQUEST = 1,
  PCP_TOPOLOGY_FEDERATION_VIOLATION_UNKNOWN_GATEWAY = 2,
  PCP_TOPOLOGY_FEDERATION_VIOLATION_STALE_GATEWAY = 3,
  PCP_TOPOLOGY_FEDERATION_VIOLATION_INCOMPATIBLE_GATEWAY = 4,
  PCP_TOPOLOGY_FEDERATION_VIOLATION_FAILED_AFTER_PLACEMENT_LOSS = 5,
} pcp_topology_federation_violation_t;

typedef struct pcp_topology_federation_placement_t {
  bool placed;
  int32_t gateway;
  int32_t service;
  uint32_t generation;
  pcp_topology_federation_violation_t violation;
} pcp_topology_federation_placement_t;

void pcp_topology_federation_initialize(pcp_topology_federation_t* out);
// Registers (or re-registers, bumping the generation) a gateway; -1 when
// full.
int32_t pcp_topology_federation_register(pcp_topology_federation_t* f,
                                         const char* name);
bool pcp_topology_federation_add_service(
    pcp_topology_federation_t* f, int32_t gateway,
    const pcp_topology_federation_service_t* service);
void pcp_topology_federation_mark_stale(pcp_topology_federation_t* f,
                                        int32_t gateway);
void pcp_topology_federation_lose_gateway(pcp_topology_federation_t* f,
                                          int32_t gateway);
// Selects the best matching service of a connected gateway by running the
// hub's real registry (sched.h "Federation") over the model's gateways:
// workers_required filters, then healthy, more available, more ready, newer
// win. |bug_accept_stale| is passed to the registry's test-only option.
pcp_topology_federation_placement_t pcp_topology_federation_place(
    const pcp_topology_federation_t* f,
    const pcp_topology_federation_selector_t* selector);
// FAILED_AFTER_PLACEMENT_LOSS when the gateway went away or re-registered
// since the placement.
pcp_topology_federation_violation_t pcp_topology_federation_complete_routed(
    const pcp_topology_federation_t* f,
    const pcp_topology_federation_placement_t* placement);

// Vector clock over the window's nodes: workers 0..n-1 and the syncer at
// index PCP_TOPOLOGY_VECTOR_CLOCK_SYNCER.
#define PCP_TOPOLOGY_VECTOR_CLOCK_NODES 8u
#define PCP_TOPOLOGY_VECTOR_CLOCK_SYNCER (PCP_TOPOLOGY_VECTOR_CLOCK_NODES - 1u)

typedef struct pcp_topology_vector_clock_t {
  uint64_t counters[PCP_TOPOLOGY_VECTOR_CLOCK_NODES];
} pcp_topology_vector_clock_t;

// Advances |node|'s own counter.
void pcp_topology_vector_clock_tick(pcp_topology_vector_clock_t* clock,
                                    uint32_t node);
// Merges |other| in (component-wise maximum).
void pcp_topology_vector_clock_observe(
    pcp_topology_vector_clock_t* clock,
    const pcp_topology_vector_clock_t* other);
uint64_t pcp_topology_vector_clock_counter(
    const pcp_topology_vector_clock_t* clock, uint32_t node);

// The decoupled event tape: what the syncer applied, in order, so that a
// restarted gateway can replay its fragment syncs.
typedef enum pcp_topology_tape_kind_e {
  PCP_TOPOLOGY_TAPE_LEARNER_APPLY = 0,
  PCP_TOPOLOGY_TAPE_IN_FLIGHT = 1,
  PCP_TOPOLOGY_TAPE_FRAGMENT_SYNC = 2,
  PCP_TOPOLOGY_TAPE_FAILURE = 3,
  PCP_TOPOLOGY_TAPE_RECOVERY = 4,
} pcp_topology_tape_kind_t;

#define PCP_TOPOLOGY_TAPE_MAX_ENTRIES 64u

typedef struct pcp_topology_tape_entry_t {
  pcp_topology_tape_kind_t kind;
  uint32_t step;
  uint32_t fragment;
  uint32_t learner;       // LEARNER_APPLY / FAILURE / RECOVERY
  uint64_t merge_weight;  // FRAGMENT_SYNC: max(tokens, 1)
  uint32_t participants;  // FRAGMENT_SYNC
} pcp_topology_tape_entry_t;

typedef struct pcp_topology_event_tape_t {
  pcp_topology_tape_entry_t entries[PCP_TOPOLOGY_TAPE_MAX_ENTRIES];
  uint32_t count;
} pcp_topology_event_tape_t;

// RESOURCE_EXHAUSTED when full.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_event_tape_append(
    pcp_topology_event_tape_t* tape, const pcp_topology_tape_entry_t* entry);
// The fragment-sync entry of (|step|, |fragment|), or NULL.
const pcp_topology_tape_entry_t* pcp_topology_event_tape_replay_fragment_sync(
    const pcp_topology_event_tape_t* tape, uint32_t step, uint32_t fragment);

// Decoupled DiLoCo fragment window.
#define PCP_TOPOLOGY_DECOUPLED_MAX_WORKERS 4u

typedef enum pcp_topology_decoupled_action_kind_e {
  PCP_TOPOLOGY_DECOUPLED_ASSIGN = 0,
  PCP_TOPOLOGY_DECOUPLED_LOCAL_STEP_COMPLETE = 1,
  PCP_TOPOLOGY_DECOUPLED_SUBMIT = 2,
  PCP_TOPOLOGY_DECOUPLED_TIMEOUT_WINDOW = 3,
  PCP_TOPOLOGY_DECOUPLED_CANCEL_SESSION = 4,
  PCP_TOPOLOGY_DECOUPLED_CRASH = 5,
  PCP_TOPOLOGY_DECOUPLED_RESTART = 6,
  PCP_TOPOLOGY_DECOUPLED_FORCE_COMMIT = 7,
} pcp_topology_decoupled_action_kind_t;

typedef struct pcp_topology_decoupled_action_t {
  pcp_topology_decoupled_action_kind_t kind;
  uint32_t worker;
  uint32_t session;       // submit: the envelope's request id
  uint32_t fragment;      // submit
  uint32_t step;          // submit: syncer step the update is for
  uint64_t clock;         // submit: the worker's vector-clock counter
  bool payload_mismatch;  // submit: envelope and payload disagree
} pcp_topology_decoupled_action_t;

typedef enum pcp_topology_decoupled_decision_e {
  PCP_TOPOLOGY_DECOUPLED_IDLE = 0,
  PCP_TOPOLOGY_DECOUPLED_ASSIGNED = 1,
  PCP_TOPOLOGY_DECOUPLED_LOCAL_STEP = 2,
  PCP_TOPOLOGY_DECOUPLED_UPDATE_ACCEPTED = 3,
  PCP_TOPOLOGY_DECOUPLED_UPDATE_REJECTED = 4,
  PCP_TOPOLOGY_DECOUPLED_MERGE_COMMITTED = 5,
  PCP_TOPOLOGY_DECOUPLED_MERGE_DEFERRED = 6,
  PCP_TOPOLOGY_DECOUPLED_CANCELED = 7,
  PCP_TOPOLOGY_DECOUPLED_WORKER_LOST = 8,
  PCP_TOPOLOGY_DECOUPLED_RESUMABLE = 9,
} pcp_topology_decoupled_decision_t;

typedef enum pcp_topology_decoupled_violation_e {
  PCP_TOPOLOGY_DECOUPLED_VIOLATION_NONE = 0,
  PCP_TOPOLOGY_DECOUPLED_VIOLATION_POST_CANCEL_UPDATE = 1,
  PCP_TOPOLOGY_DECOUPLED_VIOLATION_INVALID_WORKER = 2,
  PCP_TOPOLOGY_DECOUPLED_VIOLATION_UNAVAILABLE_WORKER = 3,
  PCP_TOPOLOGY_DECOUPLED_VIOLATION_UNASSIGNED_WORKER = 4,
  PCP_TOPOLOGY_DECOUPLED_VIOLATION_INVALID_SESSION = 5,
  PCP_TOPOLOGY_DECOUPLED_VIOLATION_CONTEXT_PAYLOAD_MISMATCH = 6,
  PCP_TOPOLOGY_DECOUPLED_VIOLATION_STALE_UPDATE = 7,
  PCP_TOPOLOGY_DECOUPLED_VIOLATION_STALE_VECTOR_CLOCK = 8,
  PCP_TOPOLOGY_DECOUPLED_VIOLATION_DUPLICATE_UPDATE = 9,
  PCP_TOPOLOGY_DECOUPLED_VIOLATION_BELOW_QUORUM_COMMIT = 10,
  PCP_TOPOLOGY_DECOUPLED_VIOLATION_INCOMPATIBLE_RESUME = 11,
} pcp_topology_decoupled_violation_t;

// The model's time: every action is one tick of this many ms, and the window
// (fixed grace and collection timeout of the real round) is long enough that
// only a TIMEOUT_WINDOW action, which jumps to the round's deadline, ends it
// unless every worker came (the real round's early close).
#define PCP_TOPOLOGY_DECOUPLED_TICK_MS 1u
#define PCP_TOPOLOGY_DECOUPLED_WINDOW_MS 1000000u
// The inline arena the real learners, syncer state and tape allocate from
// (the model is a plain stack value with no _deinitialize, so nothing it
// holds may live on the heap). The densest schedule (4 workers, 3
// fragments, a sync with 4 applies, a failure and a rejoin every 4 actions)
// uses 38 KiB in 64 actions (the explorers' longest) and 75 KiB in 128;
// past the arena the real calls fail, |real_error| says so and the oracle
// reports REAL_ERROR (decoupled_conformance_test runs both).
#define PCP_TOPOLOGY_DECOUPLED_ARENA_BYTES (96u * 1024u)
// The recovery oracle's catch-up window (syncer steps): small, so that both
// CATCH_UP and FULL_RESYNC come up in short schedules.
#define PCP_TOPOLOGY_DECOUPLED_RECOVERY_STEPS 2u

// Oracle outcomes over the real state (pcp_topology_decoupled_check).
typedef enum pcp_topology_decoupled_oracle_e {
  PCP_TOPOLOGY_DECOUPLED_ORACLE_OK = 0,
  // A FRAGMENT_SYNC record with fewer distinct participants than quorum.
  PCP_TOPOLOGY_DECOUPLED_ORACLE_BELOW_QUORUM = 1,
  // A learner listed twice in one sync (a duplicate merged twice).
  PCP_TOPOLOGY_DECOUPLED_ORACLE_DUPLICATE_MERGE = 2,
  // pcp_decoupled_syncer_state_replay of the tape differs from the live
  // state (or fails).
  PCP_TOPOLOGY_DECOUPLED_ORACLE_REPLAY_MISMATCH = 3,
  // A sync record whose clock does not follow the previous one's (the
  // syncer's entry must grow by one per sync).
  PCP_TOPOLOGY_DECOUPLED_ORACLE_CLOCK_REGRESSION = 4,
  // A sync recorded after the session was canceled.
  PCP_TOPOLOGY_DECOUPLED_ORACLE_POST_CANCEL_SYNC = 5,
  // A real call failed (the arena is exhausted): the model stopped
  // following the machine.
  PCP_TOPOLOGY_DECOUPLED_ORACLE_REAL_ERROR = 6,
  // A syncer restarted from the tape (pcp_decoupled_recovery_plan_initialize
  // over the replayed state and the online learners) would resume a learner
  // without a fragment it missed (a sync of it the learner never applied),
  // or mark a live learner failed.
  PCP_TOPOLOGY_DECOUPLED_ORACLE_RECOVERY_MISSES_FRAGMENT = 7,
} pcp_topology_decoupled_oracle_t;

// The decoupled window, derived from the real state machine of
// src/workloads/train/decoupled.h (decoupled_model.c): the window is a real
// pcp_decoupled_round_t, the learners real pcp_decoupled_learner_t (clock,
// counters, merge weights), a commit goes through
// pcp_decoupled_syncer_record_sync onto a real pcp_decoupled_tape_t, the
// fragment of each step comes from pcp_decoupled_schedule_fragment_at.
// What stays the model's own is the envelope a real gateway checks before an
// update reaches the round (session, assignment, availability, payload,
// stale step, stale vector clock) and cancellation. The fields above
// |now_ms| are projections of the real state kept for the explorers and
// tests (updated after every action). Self-referencing (the arena): never
// copy a model by value.
typedef struct pcp_topology_decoupled_t {
  uint32_t session;
  uint32_t worker_count;
  uint32_t quorum;
  uint32_t fragment_count;
  uint32_t fragment;
  uint32_t step;          // the model's step; the real syncer step is step + P
  uint64_t syncer_clock;  // the real syncer clock's own entry (node 0)
  uint32_t tape_entries;  // FRAGMENT_SYNC records on the real tape
  pcp_topology_vector_clock_t vector_clock;  // projection of |view|
  pcp_topology_event_tape_t tape;            // projection of |real_tape|
  bool canceled;
  bool assigned[PCP_TOPOLOGY_DECOUPLED_MAX_WORKERS];
  bool online[PCP_TOPOLOGY_DECOUPLED_MAX_WORKERS];
  uint64_t clock[PCP_TOPOLOGY_DECOUPLED_MAX_WORKERS];  // learner's own entry
  uint64_t known_clock[PCP_TOPOLOGY_DECOUPLED_MAX_WORKERS];  // in |view|
  uint64_t tokens[PCP_TOPOLOGY_DECOUPLED_MAX_WORKERS];
  uint64_t accepted_mask;  // the round's arrivals
  uint32_t extra_accepted;
  pcp_topology_decoupled_decision_t decision;
  pcp_topology_decoupled_violation_t violation;  // of the last action
  bool bug_count_duplicates;    // injected bug: duplicates count to quorum
  bool bug_accept_stale_clock;  // injected bug: no vector-clock check
  // Test-only hook (the conformance test's seeded bug): the round opens with
  // min_quorum - 1 (at least 1), a quorum off by one inside the machine.
  bool bug_quorum_off_by_one;

  // The real machine.
  uint64_t now_ms;
  pcp_decoupled_schedule_t schedule;  // P = H = fragment_count, tau 1
  pcp_decoupled_grace_t grace;        // fixed window unless set otherwise
  pcp_decoupled_round_t round;
  uint32_t round_quorum;  // the min_quorum the round was opened with
  uint32_t late_updates;  // arrivals after the round closed
  bool real_error;        // a real call failed (see the oracle)
  char real_error_message[96];
  pcp_decoupled_clock_t view;  // the syncer's view: node 0 + learners w+1
  pcp_decoupled_learner_t learners[PCP_TOPOLOGY_DECOUPLED_MAX_WORKERS];
  pcp_decoupled_syncer_state_t syncer;
  pcp_decoupled_tape_t real_tape;
  uint64_t canceled_at_sync;  // tape_entries when canceled
  // Adaptive grace's step samples: when each learner last stepped (or was
  // assigned), model ms.
  uint64_t last_step_ms[PCP_TOPOLOGY_DECOUPLED_MAX_WORKERS];
  size_t arena_used;
  _Alignas(16) uint8_t arena[PCP_TOPOLOGY_DECOUPLED_ARENA_BYTES];
} pcp_topology_decoupled_t;

// The decoupled protocol's configuration invariants (upstream
// src/protocol/invariants.zig): at least one worker (InvalidWorkerCount) and
// 1 <= quorum <= workers (InvalidQuorum); at least one fragment
// (InvalidFragmentCount) and index < count (InvalidFragmentIndex).
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_decoupled_quorum_validate(uint32_t quorum, uint32_t worker_count);
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_decoupled_fragment_validate(
    uint32_t fragment_index, uint32_t fragment_count);

void pcp_topology_decoupled_initialize(uint32_t session, uint32_t worker_count,
                                       uint32_t quorum, uint32_t fragments,
                                       pcp_topology_decoupled_t* out);
// Applies one action (checks in the upstream order: post-cancel, worker,
// availability, assignment, session, payload, stale fragment/step, stale
// clock, duplicate). A window timeout commits at quorum, else defers.
void pcp_topology_decoupled_apply(
    pcp_topology_decoupled_t* model,
    const pcp_topology_decoupled_action_t* action);

// The real syncer step of model step |step| (step + P: the first step at
// which the real schedule syncs fragment 0, so model step 0 syncs fragment
// 0 as before).
uint64_t pcp_topology_decoupled_real_step(const pcp_topology_decoupled_t* model,
                                          uint32_t step);
// Sets the fixed grace of the next rounds (and of the open round when no
// update has come yet): the explorers' way to reach late arrivals.
void pcp_topology_decoupled_set_grace(pcp_topology_decoupled_t* model,
                                      uint64_t grace_ms);
// Adaptive grace (pcp_decoupled_grace_ms over the library's EMAs) instead
// of the fixed window: a local step samples the time since the learner's
// previous step (or its assignment), a commit samples the round's quorum
// wait; no send time is modelled (the library counts a missing EMA as 0).
// INVALID_ARGUMENT from pcp_decoupled_grace_config_check leaves the model
// unchanged. The open round is reopened when no update has come yet.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_decoupled_set_adaptive_grace(
    pcp_topology_decoupled_t* model, double gamma, uint32_t max_grace_steps,
    uint32_t overlap_tau);
// The test-only seeded bug (bug_quorum_off_by_one): the round of the
// current step is reopened with it when no update has come yet, the next
// rounds open with it.
void pcp_topology_decoupled_set_bug_quorum_off_by_one(
    pcp_topology_decoupled_t* model, bool inject);
// A learner's metadata (DecoupledLearnerMetadata) reached the syncer with
// its clock: the syncer's view observes it (the real clock's max).
void pcp_topology_decoupled_observe_metadata(pcp_topology_decoupled_t* model,
                                             uint32_t worker, uint64_t clock);
// The oracles over the real state: quorum safety and no duplicate merge on
// every sync record, the syncer clock one up per sync, no sync after a
// cancel, the tape replayed by pcp_decoupled_syncer_state_replay equal to
// the live state, and the recovery plan a syncer restarted from that replay
// would make (max_recovery_syncer_steps
// PCP_TOPOLOGY_DECOUPLED_RECOVERY_STEPS) sending every online learner the
// fragments it missed. |allocator| holds the replayed state and the plan
// while it checks.
pcp_topology_decoupled_oracle_t pcp_topology_decoupled_check(
    const pcp_topology_decoupled_t* model, pcp_allocator_t allocator);
const char* pcp_topology_decoupled_oracle_name(
    pcp_topology_decoupled_oracle_t oracle);

// Resuming a worker after a restart: the session must be the one the
// window runs (else INCOMPATIBLE_RESUME); the worker comes back online.
void pcp_topology_decoupled_resume(pcp_topology_decoupled_t* model,
                                   uint32_t worker, uint32_t session);

// One queued response as the gateway's collectors see it: the envelope
// (request id, round, task) and, for fragment updates, whether the payload
// agrees with the envelope.
typedef struct pcp_topology_decoupled_response_t {
  uint32_t sender;
  uint32_t request_id;
  uint32_t round;
  uint32_t task;
  bool payload_consistent;
} pcp_topology_decoupled_response_t;

typedef struct pcp_topology_decoupled_collection_t {
  uint32_t matched;     // envelope matches the window
  uint32_t accepted;    // first response of each sender
  uint32_t unique;      // distinct senders accepted
  uint32_t duplicates;  // repeated senders (counted once)
  uint32_t ignored;     // envelope for another request / round / task
  pcp_topology_decoupled_violation_t violation;  // payload mismatch
} pcp_topology_decoupled_collection_t;

// Metadata collection: matches on request id = session only. Fragment
// collection: request = session, round = step, task = fragment + 1, and a
// consistent payload (else CONTEXT_PAYLOAD_MISMATCH). Each sender counts
// once (a 64-bit mask, so senders must be < 64; others are ignored).
void pcp_topology_decoupled_collect(
    const pcp_topology_decoupled_t* model, bool fragments,
    const pcp_topology_decoupled_response_t* responses, size_t count,
    pcp_topology_decoupled_collection_t* out);

// RDA merge: weight w = tokens^2 / max(steps, 1) (0 without tokens, capped
// at FLT_MAX); out = (sum w|v| / sum w) * u / |u| with u = sum over v != 0
// of w v / |v|; zero when the weights are unusable or |u| = 0.
#define PCP_TOPOLOGY_RDA_MAX_DIMENSION 8u

typedef struct pcp_topology_rda_update_t {
  const double* values;
  uint64_t tokens;
  uint64_t steps;
} pcp_topology_rda_update_t;

double pcp_topology_token_step_weight(uint64_t tokens, uint64_t steps);
// False when |dimension| exceeds PCP_TOPOLOGY_RDA_MAX_DIMENSION.
bool pcp_topology_rda_merge(const pcp_topology_rda_update_t* updates,
                            size_t update_count, size_t dimension, double* out);
// The RDA merge of the library (pcp_decoupled_merge_tensor, strategy RDA,
// weights pcp_decoupled_merge_weight) on the same updates: each update is a
// learner at -values from a global of zeros, so its outer gradient is
// |values| rounded to f32; the f32 result comes back widened. What the RDA
// model publishes (models.c); pcp_topology_rda_merge above stays the
// referee's independent double formula (oracles.c). False for a dimension
// above PCP_TOPOLOGY_RDA_MAX_DIMENSION, more than
// PCP_TOPOLOGY_MERGE_MAX_UPDATES updates, or a library refusal.
bool pcp_topology_rda_merge_real(const pcp_topology_rda_update_t* updates,
                                 size_t update_count, size_t dimension,
                                 double* out);
// The plain coordinate-wise average (what RDA replaces).
void pcp_topology_direct_average(const pcp_topology_rda_update_t* updates,
                                 size_t update_count, size_t dimension,
                                 double* out);

//===----------------------------------------------------------------------===//
// Solving and protocols: the obstruction catalogue
//===----------------------------------------------------------------------===//

typedef enum pcp_topology_obstruction_kind_e {
  PCP_TOPOLOGY_OBSTRUCTION_CARRIER_NONEXISTENCE = 0,
  PCP_TOPOLOGY_OBSTRUCTION_DISCONNECTED_TASK_OUTPUT = 1,
  PCP_TOPOLOGY_OBSTRUCTION_HOLE_PRESERVATION_FAILURE = 2,
  PCP_TOPOLOGY_OBSTRUCTION_HOLE_CREATION_FAILURE = 3,
  PCP_TOPOLOGY_OBSTRUCTION_INCOMPATIBLE_LOCAL_VIEW_IDENTIFICATION = 4,
  PCP_TOPOLOGY_OBSTRUCTION_SOLVER_UNSAT = 5,
  PCP_TOPOLOGY_OBSTRUCTION_UNSUPPORTED_DIMENSION = 6,
} pcp_topology_obstruction_kind_t;

typedef enum pcp_topology_failed_invariant_e {
  PCP_TOPOLOGY_INVARIANT_CANDIDATE_CARRIER = 0,
  PCP_TOPOLOGY_INVARIANT_CONNECTIVITY = 1,
  PCP_TOPOLOGY_INVARIANT_BETTI_NUMBER = 2,
  PCP_TOPOLOGY_INVARIANT_INDUCED_HOMOLOGY = 3,
  PCP_TOPOLOGY_INVARIANT_LOCAL_VIEW_COMPATIBILITY = 4,
  PCP_TOPOLOGY_INVARIANT_DECISION_SEARCH = 5,
  PCP_TOPOLOGY_INVARIANT_UNSUPPORTED_DIMENSION = 6,
} pcp_topology_failed_invariant_t;

// The PCP name of a failure. A label the caller supplies (the model knows
// which protocol property it encodes); never inferred from the topology.
typedef enum pcp_topology_pcp_witness_e {
  PCP_TOPOLOGY_PCP_WITNESS_GENERIC = 0,
  PCP_TOPOLOGY_PCP_WITNESS_PARTITION = 1,
  PCP_TOPOLOGY_PCP_WITNESS_STALE_GATEWAY = 2,
  PCP_TOPOLOGY_PCP_WITNESS_DUPLICATE_QUORUM = 3,
  PCP_TOPOLOGY_PCP_WITNESS_CANCELLATION_HOLE = 4,
  PCP_TOPOLOGY_PCP_WITNESS_GLOBAL_ROLLBACK_GAP = 5,
  PCP_TOPOLOGY_PCP_WITNESS_LEASE_OWNER_CONFLICT = 6,
} pcp_topology_pcp_witness_t;

const char* pcp_topology_obstruction_kind_name(
    pcp_topology_obstruction_kind_t kind);
const char* pcp_topology_failed_invariant_name(
    pcp_topology_failed_invariant_t invariant);
const char* pcp_topology_pcp_witness_name(pcp_topology_pcp_witness_t witness);
bool pcp_topology_pcp_witness_parse(pcp_string_view_t name,
                                    pcp_topology_pcp_witness_t* out_witness);

typedef struct pcp_topology_obstruction_options_t {
  uint32_t max_homology_dimension;   // 2; above it: unsupported_dimension
  uint32_t prime;                    // 2
  uint64_t max_assignments;          // 100000
  uint32_t max_unsat_core_vertices;  // 10
} pcp_topology_obstruction_options_t;

pcp_topology_obstruction_options_t pcp_topology_obstruction_options_default(
    void);

// Why no carried decision map exists. Initialize / deinitialize; owns its
// lists, complexes and witness.
typedef struct pcp_topology_obstruction_report_t {
  pcp_allocator_t allocator;
  pcp_topology_obstruction_kind_t kind;
  pcp_topology_pcp_witness_t pcp_witness;
  pcp_topology_failed_invariant_t failed_invariant;
  pcp_topology_vertex_list_t input_face;   // canonical order
  pcp_topology_complex_t* protocol_image;  // closed Xi(face) (or the domain)
  pcp_topology_complex_t* output_image;    // closed Delta(face) (or image)
  uint32_t prime;
  pcp_topology_betti_t protocol_betti;  // >= max dimension + 1 entries
  pcp_topology_betti_t output_betti;
  uint32_t induced_rank_count;  // map-induced reports only
  uint64_t induced_ranks[PCP_TOPOLOGY_MAX_HOMOLOGY_DIMENSION + 1];
  bool has_unsat_reason;
  pcp_topology_unsat_reason_t unsat_reason;
  bool has_unsupported_dimension;
  int32_t unsupported_dimension;
  pcp_topology_homology_witness_t homology_witness;  // kind NONE if absent
  pcp_topology_vertex_list_t unsat_core_vertices;
} pcp_topology_obstruction_report_t;

void pcp_topology_obstruction_report_initialize(
    pcp_allocator_t allocator, pcp_topology_obstruction_report_t* out_report);
void pcp_topology_obstruction_report_deinitialize(
    pcp_topology_obstruction_report_t* report);

// Diagnoses a decision problem (reference s.4). |out_found| false when a
// carried map exists. Otherwise, in order: an empty candidate set
// (carrier_nonexistence), Xi(F) connected but Delta(F) not
// (disconnected_task_output), a face beyond max_homology_dimension
// (unsupported_dimension), beta_k(Xi(F)) > beta_k(Delta(F))
// (hole_preservation_failure) or < (hole_creation_failure), a local unsat
// core (incompatible_local_view_identification), else solver_unsat.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_obstruction_diagnose(
    const pcp_topology_decision_problem_t* problem,
    pcp_topology_pcp_witness_t witness,
    pcp_topology_obstruction_options_t options,
    pcp_topology_obstruction_report_t* inout_report, bool* out_found);

// Map-induced diagnosis: |out_found| false when |map| preserves homology
// onto its image; else hole_preservation_failure (a source cycle lost, the
// default) or hole_creation_failure (an image cycle created), failed
// invariant induced_homology, with the induced ranks and the cycle witness.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_obstruction_diagnose_map(
    pcp_topology_simplex_t input_face, const pcp_topology_vertex_map_t* map,
    pcp_topology_pcp_witness_t witness,
    pcp_topology_obstruction_options_t options,
    pcp_topology_obstruction_report_t* inout_report, bool* out_found);

// Human form, titled "bounded topology obstruction" (reference s.4), with
// excerpts "protocol_carrier_image" and "output_carrier_image".
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_obstruction_report_format(
    const pcp_topology_obstruction_report_t* report,
    pcp_string_builder_t* builder);
// Compact JSON, schema "pcp.topology.obstruction.v1".
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_obstruction_report_format_json(
    const pcp_topology_obstruction_report_t* report,
    pcp_string_builder_t* builder);

//===----------------------------------------------------------------------===//
// Solving and protocols: protocol models and the check
//===----------------------------------------------------------------------===//

typedef enum pcp_topology_verdict_e {
  PCP_TOPOLOGY_VERDICT_SOLVABLE = 0,         // a carried map exists and the
                                             // model's own delta is one
  PCP_TOPOLOGY_VERDICT_DECISION_ESCAPE = 1,  // solvable, but the model's
                                             // decisions leave Delta
  PCP_TOPOLOGY_VERDICT_OBSTRUCTION = 2,      // no carried map exists
  PCP_TOPOLOGY_VERDICT_UNKNOWN = 3,          // search limit / solver unknown
} pcp_topology_verdict_t;

const char* pcp_topology_verdict_name(pcp_topology_verdict_t verdict);

// A named protocol model (static table). Task models run the protocol stubs
// on every case of |task|; regression models do the same with one upstream
// bug injected; two toys build their complexes directly.
typedef struct pcp_topology_model_t {
  const char* name;
  pcp_topology_task_kind_t task;  // KIND_COUNT_ for the partition toy
  bool inject_bug;
  pcp_topology_pcp_witness_t pcp_witness;  // label for obstruction reports
  pcp_topology_verdict_t expected;         // what the model is known to give
  uint32_t max_homology_dimension;         // for the diagnosis
  const char* violated_rule;  // regression models: the rule the bug breaks
  const char* description;
} pcp_topology_model_t;

const pcp_topology_model_t* pcp_topology_model_catalog(size_t* out_count);
const pcp_topology_model_t* pcp_topology_model_find(pcp_string_view_t name);

// A built model: I, O, Delta (the task), P, Xi, the implementation's delta
// (NULL with |decision_error| set when its views decide inconsistently or
// outside O) and one replay trace per generated case (seed = case ordinal,
// snapshot checksum = model state hash). Owns everything.
#define PCP_TOPOLOGY_MODEL_MAX_RUNS 8u

typedef struct pcp_topology_model_instance_t {
  pcp_allocator_t allocator;
  pcp_topology_task_t task;
  pcp_topology_complex_t* protocol;
  pcp_topology_carrier_map_t* execution;
  pcp_topology_vertex_map_t* decision;
  char decision_error[256];
  pcp_topology_trace_t* traces;
  size_t trace_count;
  uint32_t trace_task_case[PCP_TOPOLOGY_MODEL_MAX_RUNS];  // case of each trace
} pcp_topology_model_instance_t;

void pcp_topology_model_instance_initialize(
    pcp_allocator_t allocator, pcp_topology_model_instance_t* out_instance);
void pcp_topology_model_instance_deinitialize(
    pcp_topology_model_instance_t* instance);
// Runs the model. Xi is validated monotone and chromatic
// (UncoveredExtractedInputFace, ProtocolFacetMissingColor,
// ProtocolSimplexMissingTraceWitness).
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_model_build(const pcp_topology_model_t* model,
                         pcp_topology_model_instance_t* inout_instance);

// Bounds an extraction must respect (reference s.3.2 ExtractionBound):
// cases, traces, events per trace and schedule depth. Zero is rejected for
// the first three.
typedef struct pcp_topology_extraction_bound_t {
  uint32_t max_cases;
  uint32_t max_traces;
  uint32_t max_events;
  uint32_t max_depth;
} pcp_topology_extraction_bound_t;

// INVALID_ARGUMENT for a zero bound; RESOURCE_EXHAUSTED
// (ExtractionEventBoundExceeded) when cases, traces, events or depth pass
// the bound; ExtractionEvidenceMismatch when the task's evidence is not
// |expected|.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_model_instance_check_bound(
    const pcp_topology_model_instance_t* instance,
    pcp_topology_extraction_bound_t bound, pcp_topology_evidence_t expected);

// The bridge from the decoupled window to the RDA merge: the generated case
// that committed a quorum window, its protocol facet, the RDA input it
// feeds (the direction case) and the replay state hash that ties the two.
typedef struct pcp_topology_rda_bridge_t {
  uint32_t decoupled_case;   // task case of the committing run
  size_t protocol_index;     // its facet in the decoupled P
  uint32_t rda_input_index;  // the RDA task case it becomes
  uint64_t state_hash;       // the committing run's snapshot checksum
} pcp_topology_rda_bridge_t;

// NOT_FOUND when no generated run of |decoupled| (a decoupled_fragment
// model instance) committed its window.
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_rda_bridge_find(const pcp_topology_model_instance_t* decoupled,
                             pcp_topology_rda_bridge_t* out_bridge);

// The first input face F (faces order) and the first face of delta(Xi(F))
// outside Delta(F). Caller-embedded; owns its lists and complexes.
typedef struct pcp_topology_carrier_escape_t {
  bool found;
  pcp_topology_vertex_list_t input;             // canonical
  pcp_topology_vertex_list_t offending_output;  // canonical
  pcp_topology_complex_t* decided_image;        // delta(Xi(F)), closed
  pcp_topology_complex_t* allowed_image;        // Delta(F), closed
} pcp_topology_carrier_escape_t;

void pcp_topology_carrier_escape_initialize(
    pcp_allocator_t allocator, pcp_topology_carrier_escape_t* out_escape);
void pcp_topology_carrier_escape_deinitialize(
    pcp_topology_carrier_escape_t* escape);
// |found| false when delta o Xi lies in Delta. Works on maps that fail
// validation too (an unmapped view is skipped), which is the point: it
// names where an implementation's decisions leave the task.
PCP_MUST_USE_RESULT pcp_status_t
pcp_topology_carrier_escape_find(const pcp_topology_carrier_map_t* execution,
                                 const pcp_topology_carrier_map_t* task,
                                 const pcp_topology_vertex_map_t* decision,
                                 pcp_topology_carrier_escape_t* inout_escape);

typedef enum pcp_topology_solver_kind_e {
  PCP_TOPOLOGY_SOLVER_NATIVE = 0,
  PCP_TOPOLOGY_SOLVER_Z3 = 1,
} pcp_topology_solver_kind_t;

typedef struct pcp_topology_check_options_t {
  pcp_topology_solver_kind_t solver;
  pcp_topology_solver_options_t z3;  // when solver is Z3
} pcp_topology_check_options_t;

pcp_topology_check_options_t pcp_topology_check_options_default(void);

// The outcome of checking one model. Initialize / deinitialize.
typedef struct pcp_topology_check_report_t {
  pcp_allocator_t allocator;
  const pcp_topology_model_t* model;
  pcp_topology_verdict_t verdict;
  pcp_topology_solver_kind_t solver;
  pcp_topology_search_status_t search_status;
  uint64_t explored;
  size_t z3_core_size;     // named assertions in Z3's core (unsat, Z3 only)
  size_t input_simplexes;  // face counts, empty face included
  size_t protocol_simplexes;
  size_t output_simplexes;
  size_t trace_count;
  bool decision_checked;     // the model has its own delta
  char decision_error[256];  // why the model's delta is not carried
  bool has_obstruction;
  pcp_topology_obstruction_report_t obstruction;
  pcp_topology_carrier_escape_t escape;
  // Replay of the generated case the escape was found on.
  bool has_replay;
  pcp_topology_trace_t replay;
} pcp_topology_check_report_t;

void pcp_topology_check_report_initialize(
    pcp_allocator_t allocator, pcp_topology_check_report_t* out_report);
void pcp_topology_check_report_deinitialize(
    pcp_topology_check_report_t* report);

// Builds the model, searches for a carried decision map with the chosen
// solver, checks the model's own delta and, when no map exists, diagnoses
// the obstruction (native, with the model's homology bound). Errors only on
// malformed models, allocation failure or a misbehaving solver; a negative
// verdict is not an error.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_model_check(
    const pcp_topology_model_t* model, pcp_topology_check_options_t options,
    pcp_topology_check_report_t* inout_report);

// Human form (the obstruction report or the counterexample follows the
// summary lines) and compact JSON (schema "pcp.topology.check.v1").
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_check_report_format(
    const pcp_topology_check_report_t* report, pcp_string_builder_t* builder);
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_check_report_format_json(
    const pcp_topology_check_report_t* report, pcp_string_builder_t* builder);

//===----------------------------------------------------------------------===//
// Solving and protocols: CLI (topology_cli_solving.c)
//===----------------------------------------------------------------------===//

// `pcp topo check --model NAME [--solver native|z3] [--z3-backend
// library|binary] [--json]` (argv[0] = "check"): exit 0 solvable, 1
// obstruction / decision escape / unknown, 2 usage, input or solver error.
// `--all` instead of `--model` checks every model against its expected
// verdict (exit 0 when all match).
int pcp_topology_cli_check_main(int argc, char** argv);
// `pcp topo models [--json]`: the model list.
int pcp_topology_cli_models_main(int argc, char** argv);
// `pcp topo sim [--seed N] [--events K] [--invalid] [--exhaustive --depth D]
// [--replay FILE] [--shrink]`: the two-node simulator and its replay.
int pcp_topology_cli_sim_main(int argc, char** argv);

//===----------------------------------------------------------------------===//
// Solving and protocols: review artifacts (report.c)
//===----------------------------------------------------------------------===//

// Stable signatures for CI diffs (never change between builds). A carrier:
// validated, then for every domain face (faces order) the face and every
// face of its image, each as a vertex count and per canonical vertex the
// colour and label hashes. A map: per sorted domain vertex, the source and
// target vertex hashes (MissingVertexMapEntry when one is unmapped).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_carrier_signature(
    const pcp_topology_carrier_map_t* carrier, uint64_t* out_signature);
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_map_signature(
    const pcp_topology_vertex_map_t* map, uint64_t* out_signature);

// Known-invalid protocol designs; each has a regression model of the same
// name in pcp_topology_model_catalog (static table).
typedef struct pcp_topology_regression_entry_t {
  const char* name;
  const char* task;
  const char* violated_rule;
  const char* description;
} pcp_topology_regression_entry_t;

const pcp_topology_regression_entry_t* pcp_topology_regression_corpus(
    size_t* out_count);

// A counterexample next to the objects it refutes. All borrowed; |decision|,
// |escape| and |replay| may be NULL.
typedef struct pcp_topology_analysis_report_t {
  const char* violated_rule;
  const pcp_topology_carrier_map_t* execution;  // Xi (its domain is I)
  const pcp_topology_carrier_map_t* task;       // Delta
  const pcp_topology_vertex_map_t* decision;    // delta
  const pcp_topology_carrier_escape_t* escape;
  const pcp_topology_trace_t* replay;
} pcp_topology_analysis_report_t;

// Human form titled "pcp topology counterexample": violated_rule, seed,
// events, excerpts of I, P, O (face counts, at most 8 listed simplices), Xi
// and Delta (carrier_entries), delta (vertex_map_entries), the minimal
// offending simplex and the replay events.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_analysis_report_format(
    const pcp_topology_analysis_report_t* report,
    pcp_string_builder_t* builder);
// Compact JSON, schema "pcp.topology.analysis.v1", with face counts of I, P
// and O, the witness and the events.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_analysis_report_format_json(
    const pcp_topology_analysis_report_t* report,
    pcp_string_builder_t* builder);

//===----------------------------------------------------------------------===//
// Solving and protocols: coverage metadata (coverage.c)
//===----------------------------------------------------------------------===//

// One protocol surface and the task whose carrier covers it (-1: none).
typedef struct pcp_topology_coverage_path_t {
  const char* id;      // "scheduling.decision.admission"
  int32_t task;        // pcp_topology_task_kind_t or -1
  const char* source;  // the definition it stands for
  bool design_only;    // not implemented yet (the global job)
} pcp_topology_coverage_path_t;

// The 31 default paths (static).
const pcp_topology_coverage_path_t* pcp_topology_coverage_default_paths(
    size_t* out_count);
// The path ids a task claims.
size_t pcp_topology_task_coverage_paths(pcp_topology_task_kind_t kind,
                                        const char* const** out_ids);

typedef struct pcp_topology_coverage_summary_t {
  size_t total;
  size_t implemented;  // not design-only
  size_t covered;      // implemented with a task
  size_t design_only;
  size_t uncovered;  // implemented without a task
} pcp_topology_coverage_summary_t;

void pcp_topology_coverage_summarize(const pcp_topology_coverage_path_t* paths,
                                     size_t count,
                                     pcp_topology_coverage_summary_t* out);
// Task metadata (MissingTaskCoveragePaths, UnexpectedDesignOnlyTask,
// StaleTaskCoveragePath, TaskCoveragePathUnmapped, TaskCoveragePathMismatch,
// TaskCoverageDesignOnlyMismatch), the path list (empty fields,
// DuplicateCoveragePath) and, when |strict|, every implemented path covered
// (UncoveredImplementedProductionPath).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_coverage_validate(
    const pcp_topology_coverage_path_t* paths, size_t count, bool strict);
// The CI text: "pcp topology coverage summary: total=.. implemented=..
// covered=.. design_only=.. uncovered=..", one line per task
// "- <task>: paths=N evidence=<e>[ design_only=true]", then
// "- uncovered: <id> source=<src>" per uncovered implemented path.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_coverage_summary_format(
    const pcp_topology_coverage_path_t* paths, size_t count,
    pcp_string_builder_t* builder);

typedef enum pcp_topology_message_aspect_e {
  PCP_TOPOLOGY_MESSAGE_ASPECT_ENTRY = 0,
  PCP_TOPOLOGY_MESSAGE_ASPECT_FAMILY = 1,
  PCP_TOPOLOGY_MESSAGE_ASPECT_HANDLER = 2,
} pcp_topology_message_aspect_t;

typedef enum pcp_topology_global_job_state_e {
  PCP_TOPOLOGY_GLOBAL_JOB_SUBMITTED = 0,
  PCP_TOPOLOGY_GLOBAL_JOB_ROUTED = 1,
  PCP_TOPOLOGY_GLOBAL_JOB_PARTIALLY_COMMITTED = 2,
  PCP_TOPOLOGY_GLOBAL_JOB_ROLLED_BACK = 3,
  PCP_TOPOLOGY_GLOBAL_JOB_STATUS_POLLED = 4,
  PCP_TOPOLOGY_GLOBAL_JOB_CANCELED = 5,
} pcp_topology_global_job_state_t;

// Coverage path of a protocol value; NULL when it maps nowhere (unknown
// messages, a message without worker handler for HANDLER, unknown
// federation operations).
const char* pcp_topology_coverage_path_for_message(
    const pcp_topology_message_entry_t* entry,
    pcp_topology_message_aspect_t aspect);
const char* pcp_topology_coverage_path_for_federation_operation(
    const char* name);
const char* pcp_topology_coverage_path_for_sched_decision(
    pcp_topology_sched_decision_t decision);
const char* pcp_topology_coverage_path_for_sched_violation(
    pcp_topology_sched_violation_t violation);
const char* pcp_topology_coverage_path_for_decoupled_action(
    pcp_topology_decoupled_action_kind_t action);
const char* pcp_topology_coverage_path_for_rda_violation(const char* name);
const char* pcp_topology_coverage_path_for_global_job_state(
    pcp_topology_global_job_state_t state);

//===----------------------------------------------------------------------===//
// Solving and protocols: composition (composition.c)
//===----------------------------------------------------------------------===//

// One projection entry: output vertex (colour, symbol) of one task -> input
// vertex of the next. Static data.
typedef struct pcp_topology_projection_pair_t {
  pcp_topology_color_t from_color;
  const char* from;
  pcp_topology_color_t to_color;
  const char* to;
} pcp_topology_projection_pair_t;

// Builds the vertex map |from_output| -> |to_input| (VertexRefNotFound for a
// reference that is not a vertex) and validates it as simplicial; it need
// not preserve colours.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_projection_create(
    const pcp_topology_complex_t* from_output,
    const pcp_topology_complex_t* to_input,
    const pcp_topology_projection_pair_t* pairs, size_t pair_count,
    pcp_allocator_t allocator, pcp_topology_vertex_map_t** out_map);

typedef struct pcp_topology_composition_link_t {
  const pcp_topology_vertex_map_t* projection;  // O_k -> I_k+1
  const pcp_topology_carrier_map_t* next;       // Delta_k+1
} pcp_topology_composition_link_t;

// current := (current o projection) then composed with next, for each link
// (EmptyComposition without links). The result borrows the complexes of
// |start| and the last link.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_carriers_compose_projected(
    const pcp_topology_carrier_map_t* start,
    const pcp_topology_composition_link_t* links, size_t link_count,
    pcp_allocator_t allocator, pcp_topology_carrier_map_t** out_carrier);

// |detailed| o |projection| refines |abstract|: same inputs
// (RefinementDomainMismatch) and outputs (RefinementCodomainMismatch) by
// closure, and every image inside the abstract one
// (DetailedCarrierEscapesAbstractTask).
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_projected_refinement_validate(
    const pcp_topology_carrier_map_t* detailed,
    const pcp_topology_vertex_map_t* projection,
    const pcp_topology_carrier_map_t* abstract, pcp_allocator_t allocator);

#define PCP_TOPOLOGY_PIPELINE_STAGES 6u

// The global training pipeline: workload -> federation -> scheduling ->
// reservation -> fragment -> RDA, the five projections between them plus
// RDA -> global outputs (projections[5]), the composed detailed carrier
// (workload inputs -> RDA outputs) and the abstract global contract
// (regular request: committed or deferred; invalid request: deferred).
typedef struct pcp_topology_global_composition_t {
  pcp_allocator_t allocator;
  pcp_topology_task_t stages[PCP_TOPOLOGY_PIPELINE_STAGES];
  pcp_topology_task_t global;
  pcp_topology_vertex_map_t* projections[PCP_TOPOLOGY_PIPELINE_STAGES];
  pcp_topology_carrier_map_t* detailed;
  pcp_topology_carrier_map_t* abstract;
} pcp_topology_global_composition_t;

void pcp_topology_global_composition_initialize(
    pcp_allocator_t allocator, pcp_topology_global_composition_t* out);
void pcp_topology_global_composition_deinitialize(
    pcp_topology_global_composition_t* composition);
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_global_composition_build(
    pcp_topology_global_composition_t* inout_composition);

//===----------------------------------------------------------------------===//
// Solving and protocols: state-space exploration (explore.c)
//===----------------------------------------------------------------------===//

#define PCP_TOPOLOGY_SCHED_SCENARIOS 11u
#define PCP_TOPOLOGY_DECOUPLED_ACTIONS 11u
#define PCP_TOPOLOGY_DECOUPLED_MAX_EXPLORE_DEPTH 5u

// What an exploration reached: bit d of |decisions_seen| for decision d,
// bit v of |violations_seen| for violation v (the model's own enums).
typedef struct pcp_topology_exploration_stats_t {
  uint64_t invariant_failures;  // steps after which an invariant broke
  uint64_t seed;                // seeded runs: the seed to replay them with
  uint64_t checked;             // schedules run
  uint64_t failed;              // schedules that hit a violation
  uint64_t decisions_seen;
  uint64_t violations_seen;
  uint64_t fingerprint;  // hash of every step's outcome (determinism)
} pcp_topology_exploration_stats_t;

// Every ordered pair of the 11 scheduler scenarios (reserve+commit,
// reserve+queue, enqueue+start, run to completion, release, expire, cancel
// queued, cancel active, worker loss before commit, oversized request,
// restore and reserve) from two idle cuda sm_80 workers: 121 records.
void pcp_topology_sched_explore_exhaustive(
    pcp_topology_exploration_stats_t* out_stats);
// |trace_count| runs of |depth| scenarios drawn from a pcp_rng_t seeded by
// |seed|.
void pcp_topology_sched_explore_seeded(
    uint64_t seed, uint32_t trace_count, uint32_t depth,
    pcp_topology_exploration_stats_t* out_stats);

// Scheduler primitives as shrinkable actions (pcp_topology_action_t.kind);
// parameters[0] is the job (the worker id for LOSE/RESTORE), [1] the owner
// and [2] the workers required (RESERVE, ENQUEUE).
typedef enum pcp_topology_sched_action_kind_e {
  PCP_TOPOLOGY_SCHED_ACTION_RESERVE = 0,
  PCP_TOPOLOGY_SCHED_ACTION_COMMIT = 1,
  PCP_TOPOLOGY_SCHED_ACTION_COMMIT_TO_QUEUE = 2,
  PCP_TOPOLOGY_SCHED_ACTION_ENQUEUE = 3,
  PCP_TOPOLOGY_SCHED_ACTION_START_NEXT = 4,
  PCP_TOPOLOGY_SCHED_ACTION_COMPLETE = 5,
  PCP_TOPOLOGY_SCHED_ACTION_CANCEL = 6,
  PCP_TOPOLOGY_SCHED_ACTION_RELEASE = 7,
  PCP_TOPOLOGY_SCHED_ACTION_EXPIRE = 8,
  PCP_TOPOLOGY_SCHED_ACTION_LOSE_WORKER = 9,
  PCP_TOPOLOGY_SCHED_ACTION_RESTORE_WORKER = 10,
  PCP_TOPOLOGY_SCHED_ACTION_COUNT_ = 11,
} pcp_topology_sched_action_kind_t;

void pcp_topology_sched_action_apply(pcp_topology_sched_t* sched,
                                     const pcp_topology_action_t* action);

// The upstream injected scheduler bugs (reference s.3.2).
typedef enum pcp_topology_sched_bug_e {
  PCP_TOPOLOGY_SCHED_BUG_DUPLICATE_WORKER_RESERVATION = 0,
  PCP_TOPOLOGY_SCHED_BUG_ASSIGNMENT_AFTER_WORKER_LOSS = 1,
  PCP_TOPOLOGY_SCHED_BUG_CANCELLATION_CLEANUP_LEAK = 2,
  PCP_TOPOLOGY_SCHED_BUG_COUNT_ = 3,
} pcp_topology_sched_bug_t;

const char* pcp_topology_sched_bug_name(pcp_topology_sched_bug_t bug);

// The scheduling oracle for |bug| over |actions| on two cuda sm_80 workers
// (ids 1 and 2, cuda policies for every owner), with the bug injected or
// not: true when a step breaks the post-condition the bug breaks
// (duplicate_worker_reservation, orphan_reserved_worker) or, for the loss,
// a commit goes through although its reservation lost a worker.
bool pcp_topology_sched_bug_exposed(pcp_topology_sched_bug_t bug, bool inject,
                                    const pcp_topology_action_t* actions,
                                    size_t action_count);

// Seeded exploration with |bug| injected: up to |trace_count| random
// schedules of |depth| primitives (jobs 5..7, both owners, 1..2 workers,
// worker ids 1..2) until one exposes the bug, which is then shrunk with
// pcp_topology_actions_shrink. NOT_FOUND when no schedule exposes it;
// INVALID_ARGUMENT for a bad bug or a depth above 64.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_sched_injected_bug_find(
    pcp_topology_sched_bug_t bug, uint64_t seed, uint32_t trace_count,
    uint32_t depth, pcp_allocator_t allocator,
    pcp_topology_action_shrink_result_t* out_result);
// Every schedule of |depth| (<= 5) actions over the 11-action decoupled
// alphabet (assign w0/w1, step, submit w0/w1, timeout, cancel, crash and
// restart w1, forced commit, resubmission) on a 2-worker quorum-2 session.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_decoupled_explore_exhaustive(
    uint32_t depth, pcp_topology_exploration_stats_t* out_stats);
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_decoupled_explore_seeded(
    uint64_t seed, uint32_t trace_count, uint32_t depth,
    pcp_topology_exploration_stats_t* out_stats);

// The upstream injected decoupled bugs (reference s.3.2): a commit forced
// below quorum, and an update accepted with a stale vector clock.
typedef enum pcp_topology_decoupled_bug_e {
  PCP_TOPOLOGY_DECOUPLED_BUG_BELOW_QUORUM_COMMIT = 0,
  PCP_TOPOLOGY_DECOUPLED_BUG_STALE_VECTOR_CLOCK_ACCEPTANCE = 1,
  PCP_TOPOLOGY_DECOUPLED_BUG_COUNT_ = 2,
} pcp_topology_decoupled_bug_t;

const char* pcp_topology_decoupled_bug_name(pcp_topology_decoupled_bug_t bug);

// The oracle for |bug| over |actions| (kind: a decoupled action kind,
// parameters[0] the worker, [1] the update's clock; envelopes match the
// window) on session 7 with two workers, quorum 2 and one fragment: a
// commit with fewer than quorum accepted senders, or an accepted update
// whose clock is below the one the syncer already knew. Without |inject|
// the window has no forced commit (FORCE_COMMIT times out like the window
// does) and checks vector clocks.
bool pcp_topology_decoupled_bug_exposed(pcp_topology_decoupled_bug_t bug,
                                        bool inject,
                                        const pcp_topology_action_t* actions,
                                        size_t action_count);

// Seeded exploration with |bug| injected (random actions over both workers,
// clocks 0..3), the first exposing schedule shrunk. NOT_FOUND when none
// does; INVALID_ARGUMENT for a bad bug or a depth above 64.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_decoupled_injected_bug_find(
    pcp_topology_decoupled_bug_t bug, uint64_t seed, uint32_t trace_count,
    uint32_t depth, pcp_allocator_t allocator,
    pcp_topology_action_shrink_result_t* out_result);

//===----------------------------------------------------------------------===//
// Solving and protocols: the merge oracle (oracles.c)
//===----------------------------------------------------------------------===//

#define PCP_TOPOLOGY_MERGE_MAX_UPDATES 8u

typedef enum pcp_topology_merge_kind_e {
  PCP_TOPOLOGY_MERGE_DIRECT_AVERAGE = 0,
  PCP_TOPOLOGY_MERGE_TOKEN_WEIGHTED = 1,
  PCP_TOPOLOGY_MERGE_RDA = 2,
} pcp_topology_merge_kind_t;

typedef enum pcp_topology_merge_violation_e {
  PCP_TOPOLOGY_MERGE_VIOLATION_NONE = 0,
  PCP_TOPOLOGY_MERGE_VIOLATION_BELOW_QUORUM = 1,
  PCP_TOPOLOGY_MERGE_VIOLATION_DUPLICATE_UPDATE = 2,
  PCP_TOPOLOGY_MERGE_VIOLATION_OUTSIDE_ENVELOPE = 3,
  PCP_TOPOLOGY_MERGE_VIOLATION_AVERAGE_MISMATCH = 4,
  PCP_TOPOLOGY_MERGE_VIOLATION_RDA_NORM_MISMATCH = 5,
  PCP_TOPOLOGY_MERGE_VIOLATION_RDA_DIRECTION_MISMATCH = 6,
  PCP_TOPOLOGY_MERGE_VIOLATION_INCOMPATIBLE_LOCAL_VIEWS = 7,
} pcp_topology_merge_violation_t;

const char* pcp_topology_merge_violation_name(
    pcp_topology_merge_violation_t violation);

// One learner's fragment update as the window saw it. |values| borrowed.
typedef struct pcp_topology_merge_update_t {
  uint32_t learner;
  uint32_t step;  // syncer step it was computed for
  bool late;      // arrived after the grace window
  const double* values;
  uint64_t tokens;
  uint64_t steps;
  uint32_t view;      // local-view id (for the compatibility check)
  uint32_t decision;  // the learner's merge decision (same)
} pcp_topology_merge_update_t;

typedef struct pcp_topology_merge_result_t {
  pcp_topology_merge_violation_t violation;  // below quorum, duplicate
  size_t dimension;
  size_t participants;
  size_t non_participants;  // late or for another step
  uint32_t participant_learners[PCP_TOPOLOGY_MERGE_MAX_UPDATES];
  double total_weight;      // sum of token-step weights
  double direction_weight;  // weight of non-zero updates
  double mean_norm;         // weighted mean norm
  double output[PCP_TOPOLOGY_RDA_MAX_DIMENSION];
  double output_norm;
  double envelope_min[PCP_TOPOLOGY_RDA_MAX_DIMENSION];
  double envelope_max[PCP_TOPOLOGY_RDA_MAX_DIMENSION];
} pcp_topology_merge_result_t;

// Filters the participants (on time, this step, each learner once: a
// repeated learner is DUPLICATE_UPDATE), checks the quorum and computes the
// merge of |kind|. INVALID_ARGUMENT beyond 8 dimensions or 8 updates.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_merge_oracle_run(
    pcp_topology_merge_kind_t kind, uint32_t window_step, uint32_t quorum,
    const pcp_topology_merge_update_t* updates, size_t count, size_t dimension,
    pcp_topology_merge_result_t* out);
// Is |claimed| an acceptable output? Averages must stay in the coordinate
// envelope (OUTSIDE_ENVELOPE) and equal the average (AVERAGE_MISMATCH); RDA
// must carry the weighted mean norm (RDA_NORM_MISMATCH) along the merged
// direction (RDA_DIRECTION_MISMATCH; any non-zero claim when the direction
// cancels).
pcp_topology_merge_violation_t pcp_topology_merge_oracle_check_claim(
    pcp_topology_merge_kind_t kind, const pcp_topology_merge_result_t* merge,
    const double* claimed);
// Learners with the same local view must decide the same
// (INCOMPATIBLE_LOCAL_VIEWS).
pcp_topology_merge_violation_t pcp_topology_merge_local_views_check(
    const pcp_topology_merge_update_t* updates, size_t count);

#ifdef __cplusplus
}
#endif

#endif  // PCP_TOPOLOGY_PROTOCOLS_IMPL_H_
