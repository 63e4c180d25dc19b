// SPDX-License-Identifier: Apache-2.0
//
// Decoupled DiLoCo, sans-I/O core (issue 17; reference s.1.3). Part of the
// workloads module's public surface: include "workloads/workloads.h", which
// includes this file under its DiLoCo banner.
//
// Decoupled DiLoCo splits the model into P fragments. Learners train without
// stopping; a syncer, once per syncer step, pulls one fragment's current
// values from a quorum of learners, merges their outer gradients, applies an
// outer Nesterov step to that fragment of the global model and sends it back;
// learners blend it in (alpha) and keep going. This file holds every decision
// of that protocol as pure functions and small state machines, so the
// training service (next session), the simulator and the tests all run the
// same code:
//   * fragment plans (strided, balanced_tensor) and their checks;
//   * the schedule (which fragment syncs at syncer step s);
//   * merge weights and the four merges, in double accumulation;
//   * quorum, grace window, adaptive grace: a round state machine fed
//     (time, arrivals);
//   * outer Nesterov per fragment, learner counters and alpha blending;
//   * vector clocks; the event tape (binary, versioned, CRC32C per record)
//     with replay into the syncer state; the recovery plan;
//   * a real int4 codec (two codes per byte, per-block f32 scales).
// Nothing here reads a clock, a socket or a thread: time is an argument.
//
// Conventions: a "parameter vector" is every tensor's f32 elements
// concatenated in tensor-index order; a "fragment buffer" is the fragment's
// tensors concatenated in index order (the plan's offsets). Byte counts are
// f32 (4 bytes per value), as upstream's TensorSpec.
// Ownership: structs with _initialize own heap memory from the allocator
// they were given, released by _deinitialize; other functions borrow.
// Thread-safety: thread-compatible throughout (no globals).

#ifndef PCP_WORKLOADS_TRAIN_DECOUPLED_H_
#define PCP_WORKLOADS_TRAIN_DECOUPLED_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/base.h"
#include "config/config.h"

#ifdef __cplusplus
extern "C" {
#endif

// Limits (upstream protocol/limits.zig): learners 1024, fragments 8192,
// tensors 1e6, syncer steps 1e6.
#define PCP_DECOUPLED_MAX_LEARNERS 1024u
#define PCP_DECOUPLED_MAX_FRAGMENTS 8192u
// Local steps one learner task may fuse (key steps_per_task): the derived
// @train_steps unrolls its data's leading dimension, so this bounds the
// program and the task's token payload.
#define PCP_DECOUPLED_MAX_STEPS_PER_TASK 64u
#define PCP_DECOUPLED_MAX_TENSORS 1000000u
#define PCP_DECOUPLED_MAX_SYNCER_STEPS 1000000u
// Vector clock entries: the syncer (node 0) plus every learner.
#define PCP_DECOUPLED_CLOCK_MAX_ENTRIES (PCP_DECOUPLED_MAX_LEARNERS + 1u)

//===----------------------------------------------------------------------===//
// Fragment plans
//===----------------------------------------------------------------------===//

typedef enum pcp_decoupled_role_e {
  PCP_DECOUPLED_ROLE_UNKNOWN = 0,
  PCP_DECOUPLED_ROLE_EMBEDDING = 1,
  PCP_DECOUPLED_ROLE_NON_TRANSFORMER = 2,
  PCP_DECOUPLED_ROLE_TRANSFORMER = 3,
} pcp_decoupled_role_t;

typedef enum pcp_decoupled_fragment_strategy_e {
  // Tensor i goes to fragment i mod P.
  PCP_DECOUPLED_FRAGMENTS_STRIDED = 0,
  // Largest tensor first (ties: lower index) to the fragment with the
  // smallest byte total so far (ties: lower fragment id).
  PCP_DECOUPLED_FRAGMENTS_BALANCED_TENSOR = 1,
} pcp_decoupled_fragment_strategy_t;

// One row of the parameter table (borrowed by the plan builder; the name is
// only used in error messages and is not kept).
typedef struct pcp_decoupled_tensor_spec_t {
  const char* name;
  uint64_t value_count;  // f32 elements, > 0
  int32_t role;          // pcp_decoupled_role_t
} pcp_decoupled_tensor_spec_t;

typedef struct pcp_decoupled_fragment_t {
  uint32_t id;
  uint32_t offset;  // id mod H: the syncer step residue it syncs at
  uint32_t tensor_count;
  uint32_t* tensor_indices;  // ascending
  uint64_t* offset_bytes;    // cumulative byte offset inside the fragment
  uint64_t byte_count;       // sum of its tensors' byte counts
  uint64_t value_count;      // byte_count / 4
} pcp_decoupled_fragment_t;

typedef struct pcp_decoupled_plan_t {
  pcp_allocator_t allocator;
  int32_t strategy;          // pcp_decoupled_fragment_strategy_t
  uint32_t fragment_count;   // P
  uint32_t sync_interval_h;  // H
  uint32_t tensor_count;
  pcp_decoupled_fragment_t* fragments;  // fragment_count
  // Per tensor: owning fragment, f32 value count, element offset in the
  // parameter vector, role.
  uint32_t* tensor_fragment;
  uint64_t* tensor_values;
  uint64_t* tensor_value_offset;
  int32_t* tensor_role;
  uint64_t max_tensor_bytes;
} pcp_decoupled_plan_t;

// Builds the plan of |tensors| (tensor i = tensors[i]) for P = |fragments|
// fragments and sync interval H = |sync_interval_h|, then checks it
// (pcp_decoupled_plan_check). Tensors listed in |embedding_indices| get
// role EMBEDDING whatever their spec says. INVALID_ARGUMENT names the rule
// broken: P or H zero or above the limits, P > H (fragments with id >= H
// would never be scheduled), no tensors, a zero-size tensor, an embedding
// index out of range, a fragment left empty (P > tensor count).
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_plan_initialize(
    pcp_allocator_t allocator, pcp_decoupled_fragment_strategy_t strategy,
    const pcp_decoupled_tensor_spec_t* tensors, uint32_t tensor_count,
    const uint32_t* embedding_indices, uint32_t embedding_count,
    uint32_t fragments, uint32_t sync_interval_h,
    pcp_decoupled_plan_t* out_plan);
void pcp_decoupled_plan_deinitialize(pcp_decoupled_plan_t* plan);

// The checks of a plan (also run by _initialize; exposed so a plan received
// or edited can be verified): P > 0, H > 0, every tensor in exactly one
// fragment and no index twice, tensor_fragment consistent, indices ascending
// inside a fragment with cumulative offsets, fragment offset == id mod H,
// and for balanced_tensor the greedy bound: max fragment bytes - min
// fragment bytes <= the largest tensor's bytes. INVALID_ARGUMENT naming the
// rule, the fragment and the tensor.
PCP_MUST_USE_RESULT pcp_status_t
pcp_decoupled_plan_check(const pcp_decoupled_plan_t* plan);

// Copies fragment |fragment_id|'s tensors out of the parameter vector
// |params| into the fragment buffer |out_values| (fragment.value_count), and
// back (scatter). OUT_OF_RANGE for a bad id.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_plan_gather(
    const pcp_decoupled_plan_t* plan, uint32_t fragment_id, const float* params,
    float* out_values);
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_plan_scatter(
    const pcp_decoupled_plan_t* plan, uint32_t fragment_id, const float* values,
    float* inout_params);

//===----------------------------------------------------------------------===//
// Schedule
//===----------------------------------------------------------------------===//

// At syncer step s (1-based) the scheduled fragment is the one whose offset
// (id mod H) equals s mod H; with P < H the steps with no such fragment are
// skipped (false). With P = H every step syncs one fragment and fragment 0
// runs when s mod H == 0. Learners keep training through the sync: the
// fragment pulled at syncer step s must be blended back by learner step
// s + overlap_tau (one syncer step per learner step period), which is the
// budget adaptive grace spends.
typedef struct pcp_decoupled_schedule_t {
  uint32_t fragment_count;   // P >= 1
  uint32_t sync_interval_h;  // H >= P
  uint32_t overlap_tau;      // >= 1
} pcp_decoupled_schedule_t;

// INVALID_ARGUMENT naming the rule (P, H, P <= H, overlap_tau >= 1).
PCP_MUST_USE_RESULT pcp_status_t
pcp_decoupled_schedule_check(const pcp_decoupled_schedule_t* schedule);
bool pcp_decoupled_schedule_fragment_at(
    const pcp_decoupled_schedule_t* schedule, uint64_t syncer_step,
    uint32_t* out_fragment_id);
// The learner step by which the fragment pulled at |syncer_step| is
// blended back: syncer_step + overlap_tau.
uint64_t pcp_decoupled_schedule_apply_deadline(
    const pcp_decoupled_schedule_t* schedule, uint64_t syncer_step);
// The final sync. A run of |local_steps| = S local steps per learner syncs
// fragment f last at the largest s <= S with s mod H == f: only the
// fragment at S mod H holds all S steps, the others lose up to H - 1 steps
// of every learner (fragment 1 of H 100, P 2, S 400 last syncs at 301).
// With |final_sync| the syncer runs on past S through the virtual steps
// S+1 .. S+H-1 with the same schedule (no local step: learners stop at S),
// which names every fragment but the one at S mod H exactly once, in the
// schedule's own order: the fragments whose last round is before S (or
// none) get one more round that merges every step up to S. Returns the
// syncer's last step (S when |final_sync| is false or no fragment needs
// one) and the rounds past S in |out_final_rounds| (optional).
uint64_t pcp_decoupled_schedule_last_step(
    const pcp_decoupled_schedule_t* schedule, uint64_t local_steps,
    bool final_sync, uint32_t* out_final_rounds);

//===----------------------------------------------------------------------===//
// Merges
//===----------------------------------------------------------------------===//

typedef enum pcp_decoupled_merge_strategy_e {
  PCP_DECOUPLED_MERGE_WEIGHTED_AVERAGE = 0,
  PCP_DECOUPLED_MERGE_RDA = 1,
  // Embedding tensors weighted_average, all others rda.
  PCP_DECOUPLED_MERGE_AVG_EMBEDDING_RDA_MODEL = 2,
  // Embedding tensors rda, all others weighted_average.
  PCP_DECOUPLED_MERGE_RDA_EMBEDDING_AVG_MODEL = 3,
} pcp_decoupled_merge_strategy_t;

// Parses "weighted_average" / "rda" / "avg_embedding_rda_model" /
// "rda_embedding_avg_model"; INVALID_ARGUMENT lists the accepted names.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_merge_strategy_parse(
    const char* name, pcp_decoupled_merge_strategy_t* out_strategy);
// The per-tensor merge a model-level strategy uses for |role| (WEIGHTED_
// AVERAGE or RDA).
pcp_decoupled_merge_strategy_t pcp_decoupled_merge_strategy_for_role(
    pcp_decoupled_merge_strategy_t strategy, pcp_decoupled_role_t role);

// A learner's merge weight: tokens^2 / max(steps, 1), counted since the
// learner last received this fragment; 0 when tokens is 0; saturates at
// FLT_MAX (upstream keeps it in f32).
double pcp_decoupled_merge_weight(uint64_t tokens_since, uint64_t steps_since);

// How many of |weights| a merge uses (finite and > 0). None: the merge's
// outer gradient is 0, and a round closed so must be skipped rather than
// take an outer step (with momentum, a step on a zero gradient still
// moves the masters by lr * mu^2 * v with no data).
uint32_t pcp_decoupled_merge_usable_count(const double* weights,
                                          uint32_t count);

typedef struct pcp_decoupled_merge_stats_t {
  uint64_t sanitized_count;  // non-finite delta elements treated as 0
  uint32_t used_learners;    // learners with a finite weight > 0
  double output_norm;        // L2 norm of the merged outer gradient
} pcp_decoupled_merge_stats_t;

// Merges one tensor of |count| values. The outer gradient of learner i is
// delta_i = global_before - learner_values[i] (learners send parameters,
// not deltas, reference s.1.3). A non-finite delta element counts as 0 and
// is counted in the stats. Learners with a weight <= 0 or non-finite are
// left out. All sums in double, the result rounded to f32:
//   weighted_average: out = sum w_i delta_i / sum w_i (0 when no weight);
//   rda: n_i = |delta_i|_2, dir = sum_{n_i > 0} (w_i / n_i) delta_i,
//        mean_norm = sum w_i n_i / sum w_i, out = dir * mean_norm / |dir|
//        (0 when |dir| is 0 or non-finite).
// |strategy| must be WEIGHTED_AVERAGE or RDA (use _for_role first).
// INVALID_ARGUMENT for another strategy or learner_count above the limit.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_merge_tensor(
    pcp_decoupled_merge_strategy_t strategy, const float* global_before,
    const float* const* learner_values, const double* weights,
    uint32_t learner_count, size_t count, float* out_outer_gradient,
    pcp_decoupled_merge_stats_t* out_stats);

// Merges a whole fragment buffer tensor by tensor with the strategy each
// tensor's role selects (plan roles). Buffers are fragment buffers of
// |fragment_id|. Stats are summed over the tensors (output_norm: of the
// whole fragment).
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_merge_fragment(
    const pcp_decoupled_plan_t* plan, uint32_t fragment_id,
    pcp_decoupled_merge_strategy_t strategy, const float* global_before,
    const float* const* learner_values, const double* weights,
    uint32_t learner_count, float* out_outer_gradient,
    pcp_decoupled_merge_stats_t* out_stats);

//===----------------------------------------------------------------------===//
// Outer Nesterov per fragment
//===----------------------------------------------------------------------===//

// The syncer's outer optimizer: one f32 velocity per parameter (zero at
// start), updated fragment by fragment with the host Nesterov formula of
// reference s.1.1, per element in f32:
//   v <- mu*v + g ;  theta <- theta - lr*(g + mu*v)
typedef struct pcp_decoupled_nesterov_t {
  pcp_allocator_t allocator;
  float learning_rate;
  float momentum;
  float* velocity;  // parameter vector order
  size_t count;
} pcp_decoupled_nesterov_t;

PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_nesterov_initialize(
    pcp_allocator_t allocator, size_t parameter_count, float learning_rate,
    float momentum, pcp_decoupled_nesterov_t* out_nesterov);
void pcp_decoupled_nesterov_deinitialize(pcp_decoupled_nesterov_t* nesterov);
// Applies the step to fragment |fragment_id| of the parameter vector
// |inout_params| with |outer_gradient| (a fragment buffer); only that
// fragment's velocity and values change. OUT_OF_RANGE for a bad id,
// INVALID_ARGUMENT when the plan and the optimizer sizes differ.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_nesterov_step_fragment(
    pcp_decoupled_nesterov_t* nesterov, const pcp_decoupled_plan_t* plan,
    uint32_t fragment_id, const float* outer_gradient, float* inout_params);

//===----------------------------------------------------------------------===//
// Vector clocks
//===----------------------------------------------------------------------===//

typedef struct pcp_decoupled_clock_entry_t {
  uint16_t node_id;
  uint64_t counter;
} pcp_decoupled_clock_entry_t;

// Entries sorted by node id; a missing entry reads as 0. Fixed capacity
// (PCP_DECOUPLED_CLOCK_MAX_ENTRIES) so a clock is a plain value: copy it
// with assignment.
typedef struct pcp_decoupled_clock_t {
  uint32_t count;
  pcp_decoupled_clock_entry_t entries[PCP_DECOUPLED_CLOCK_MAX_ENTRIES];
} pcp_decoupled_clock_t;

typedef enum pcp_decoupled_clock_order_e {
  PCP_DECOUPLED_CLOCK_EQUAL = 0,
  PCP_DECOUPLED_CLOCK_BEFORE = 1,
  PCP_DECOUPLED_CLOCK_AFTER = 2,
  PCP_DECOUPLED_CLOCK_CONCURRENT = 3,
} pcp_decoupled_clock_order_t;

void pcp_decoupled_clock_initialize(pcp_decoupled_clock_t* out_clock);
uint64_t pcp_decoupled_clock_get(const pcp_decoupled_clock_t* clock,
                                 uint16_t node_id);
// counter = counter + 1 / max(counter, value). RESOURCE_EXHAUSTED when a new
// node would pass the capacity.
PCP_MUST_USE_RESULT pcp_status_t
pcp_decoupled_clock_tick(pcp_decoupled_clock_t* clock, uint16_t node_id);
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_clock_observe(
    pcp_decoupled_clock_t* clock, uint16_t node_id, uint64_t value);
// Element-wise max of |other| into |inout_clock|.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_clock_merge(
    pcp_decoupled_clock_t* inout_clock, const pcp_decoupled_clock_t* other);
// BEFORE: a <= b everywhere and a != b; AFTER the reverse.
pcp_decoupled_clock_order_t pcp_decoupled_clock_compare(
    const pcp_decoupled_clock_t* a, const pcp_decoupled_clock_t* b);

// The wire form (reference: `[{node_id, counter}]`, the `vector_clock`
// field of learner metadata): a new JSON array in node order, or NULL when
// out of memory. Counters above INT64_MAX (JSON's integer range here) are
// written as INT64_MAX.
json_t* pcp_decoupled_clock_to_json(const pcp_decoupled_clock_t* clock);
// Parses the wire form into |out_clock|. INVALID_ARGUMENT naming the
// element and the rule: not an array, more than the limit, an element that
// is not an object, node_id not an integer in [0, 65535], counter not an
// integer >= 0, a node listed twice. Any order is accepted (the clock
// sorts). |out_clock| is empty on failure.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_clock_from_json(
    const json_t* json, pcp_decoupled_clock_t* out_clock);

//===----------------------------------------------------------------------===//
// Learner side: counters and alpha blending
//===----------------------------------------------------------------------===//

// Per-fragment counters since the fragment was last received, the newest
// syncer step observed, and the learner's vector clock (its own entry
// ticks once per local step; the syncer's entry, node 0, follows the
// applied syncer steps).
typedef struct pcp_decoupled_learner_t {
  pcp_allocator_t allocator;
  uint16_t node_id;  // >= 1 (0 is the syncer)
  uint32_t fragment_count;
  uint64_t learner_step;
  uint64_t observed_global_step;
  uint64_t* steps_since;   // fragment_count
  uint64_t* tokens_since;  // fragment_count
  pcp_decoupled_clock_t clock;
} pcp_decoupled_learner_t;

// INVALID_ARGUMENT for node 0 or a fragment count out of [1, limit].
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_learner_initialize(
    pcp_allocator_t allocator, uint16_t node_id, uint32_t fragment_count,
    pcp_decoupled_learner_t* out_learner);
void pcp_decoupled_learner_deinitialize(pcp_decoupled_learner_t* learner);
// One local step of |tokens|: learner_step += 1, the clock's own entry
// ticks, and every fragment's counters grow by 1 step and |tokens|
// (saturating).
void pcp_decoupled_learner_record_step(pcp_decoupled_learner_t* learner,
                                       uint64_t tokens);
// The syncer's value of |fragment_id| from |syncer_step| was applied:
// zeroes its counters, observed_global_step = max(it, syncer_step), and
// the clock observes node 0 = syncer_step.
// OUT_OF_RANGE for a bad id.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_learner_apply_fragment(
    pcp_decoupled_learner_t* learner, uint32_t fragment_id,
    uint64_t syncer_step);
// Whether the learner goes on: max_syncer_steps == 0 (no limit) or
// observed_global_step < max_syncer_steps.
bool pcp_decoupled_learner_should_continue(
    const pcp_decoupled_learner_t* learner, uint64_t max_syncer_steps);

// local = alpha*local + (1-alpha)*global per element, in f32 (alpha 0:
// overwrite); a non-finite result becomes 0 and is counted (returned).
// Requires 0 <= alpha <= 1 (INVALID_ARGUMENT otherwise; the count output
// is then untouched).
PCP_MUST_USE_RESULT pcp_status_t
pcp_decoupled_blend(float alpha, const float* global, float* inout_local,
                    size_t count, uint64_t* out_nonfinite_count);

//===----------------------------------------------------------------------===//
// Quorum, grace window, adaptive grace
//===----------------------------------------------------------------------===//

// One learner's update as it reached the syncer: |arrival_ms| counts from
// the start of the round's collection.
typedef struct pcp_decoupled_arrival_t {
  uint32_t learner_id;
  uint64_t arrival_ms;
} pcp_decoupled_arrival_t;

typedef struct pcp_decoupled_selection_t {
  // Selected learners (arrival order, ties by id) and how many.
  uint32_t participants[PCP_DECOUPLED_MAX_LEARNERS];
  uint32_t participant_count;
  uint32_t grace_inclusion_count;  // selected, arrived after quorum_wait
  uint32_t skipped_count;          // arrived after the deadline, or inactive
  uint64_t quorum_wait_ms;         // arrival of the min_quorum-th learner
  uint64_t deadline_ms;            // quorum_wait + grace
} pcp_decoupled_selection_t;

// Upstream's selectLearnerUpdates: the earliest update per learner, learners
// not in |active_ids| (when |active_ids| is non-NULL) skipped; fewer than
// |min_quorum| distinct learners -> FAILED_PRECONDITION ("quorum not met").
// Then sort by (arrival, id), quorum_wait = arrival[min_quorum - 1],
// deadline = quorum_wait + grace_ms; keep every update with arrival <=
// deadline. INVALID_ARGUMENT for min_quorum 0, more than
// 4 x PCP_DECOUPLED_MAX_LEARNERS arrivals or more distinct learners than
// PCP_DECOUPLED_MAX_LEARNERS.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_select(
    const pcp_decoupled_arrival_t* arrivals, uint32_t arrival_count,
    const uint32_t* active_ids, uint32_t active_count, uint32_t min_quorum,
    uint64_t grace_ms, pcp_decoupled_selection_t* out_selection);

// Timing EMAs (ms): the first sample replaces the value, then
// alpha*x + (1-alpha)*prev.
typedef struct pcp_decoupled_ema_t {
  double value;
  bool has_value;
} pcp_decoupled_ema_t;
void pcp_decoupled_ema_update(pcp_decoupled_ema_t* ema, double alpha,
                              double sample);

typedef struct pcp_decoupled_grace_config_t {
  uint64_t grace_window_ms;  // fixed grace when adaptive is off
  bool adaptive;
  double gamma;              // finite, >= 0
  uint32_t max_grace_steps;  // >= 1
  uint32_t overlap_tau;      // >= 1
  double ema_alpha;          // (0, 1]
} pcp_decoupled_grace_config_t;

// INVALID_ARGUMENT naming the key that is out of range.
PCP_MUST_USE_RESULT pcp_status_t
pcp_decoupled_grace_config_check(const pcp_decoupled_grace_config_t* config);

typedef struct pcp_decoupled_grace_t {
  pcp_decoupled_grace_config_t config;
  pcp_decoupled_ema_t step_ema;         // learner step duration
  pcp_decoupled_ema_t quorum_wait_ema;  // round start -> quorum
  pcp_decoupled_ema_t sync_send_ema;    // quorum close -> ready sent
} pcp_decoupled_grace_t;

// The grace of the next round. Fixed: grace_window_ms. Adaptive:
// slack = overlap_tau*step_ema - (quorum_wait_ema + sync_send_ema) (a
// missing quorum/send EMA counts as 0); grace = floor(min(gamma*slack,
// max_grace_steps*step_ema)), and 0 when that is <= 0 or there is no step
// EMA yet.
uint64_t pcp_decoupled_grace_ms(const pcp_decoupled_grace_t* grace);
// Samples feeding the EMAs (ms).
void pcp_decoupled_grace_observe_step(pcp_decoupled_grace_t* grace,
                                      double step_ms);
void pcp_decoupled_grace_observe_quorum_wait(pcp_decoupled_grace_t* grace,
                                             double wait_ms);
void pcp_decoupled_grace_observe_sync_send(pcp_decoupled_grace_t* grace,
                                           double send_ms);

// One fragment round as a state machine (a plain value of about 25 KiB:
// keep it off small stacks): opened at a time, fed arrivals
// with their times, polled with the current time. It closes
//   * QUORUM + GRACE: at quorum_wait + grace once min_quorum learners came;
//   * EARLY: as soon as every expected learner came (nothing left to wait
//     for), even inside the grace window;
//   * TIMEOUT: at open + collection_timeout without a quorum (the caller
//     skips the step; upstream's 30 s collection limit).
// An arrival after the close, a duplicate and a learner not expected are
// ignored and counted.
typedef enum pcp_decoupled_round_state_e {
  PCP_DECOUPLED_ROUND_COLLECTING = 0,
  PCP_DECOUPLED_ROUND_CLOSED = 1,
  PCP_DECOUPLED_ROUND_TIMED_OUT = 2,
} pcp_decoupled_round_state_t;

typedef struct pcp_decoupled_round_t {
  int32_t state;  // pcp_decoupled_round_state_t
  uint64_t opened_at_ms;
  uint64_t grace_ms;
  uint64_t collection_timeout_ms;
  uint32_t min_quorum;
  uint32_t expected[PCP_DECOUPLED_MAX_LEARNERS];
  uint32_t expected_count;
  pcp_decoupled_arrival_t arrivals[PCP_DECOUPLED_MAX_LEARNERS];
  uint32_t arrival_count;
  uint32_t late_count;        // after the close
  uint32_t duplicate_count;   // same learner again
  uint32_t unexpected_count;  // not in |expected|
  uint64_t closed_at_ms;
  pcp_decoupled_selection_t selection;  // valid once CLOSED
} pcp_decoupled_round_t;

// INVALID_ARGUMENT for min_quorum 0, min_quorum > expected_count, too many
// or duplicate expected ids, a zero timeout.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_round_open(
    uint64_t now_ms, const uint32_t* expected_ids, uint32_t expected_count,
    uint32_t min_quorum, uint64_t grace_ms, uint64_t collection_timeout_ms,
    pcp_decoupled_round_t* out_round);
// Records |learner_id|'s update at |now_ms|, then advances like _poll; an
// update at exactly the deadline is inside the window (as in _select). A
// time before the open time counts as the open time, one before the
// previous arrival as that arrival's (arrivals stay in time order).
void pcp_decoupled_round_arrive(pcp_decoupled_round_t* round,
                                uint32_t learner_id, uint64_t now_ms);
// Advances the machine to |now_ms| and returns its state.
pcp_decoupled_round_state_t pcp_decoupled_round_poll(
    pcp_decoupled_round_t* round, uint64_t now_ms);
// When the driver must poll next if nothing arrives (absolute ms); UINT64_MAX
// once closed.
uint64_t pcp_decoupled_round_next_deadline_ms(
    const pcp_decoupled_round_t* round);

//===----------------------------------------------------------------------===//
// Event tape
//===----------------------------------------------------------------------===//

typedef enum pcp_decoupled_event_kind_e {
  PCP_DECOUPLED_EVENT_FRAGMENT_SYNC = 1,
  PCP_DECOUPLED_EVENT_LEARNER_APPLY = 2,
  PCP_DECOUPLED_EVENT_LEARNER_FAILURE = 3,
  PCP_DECOUPLED_EVENT_LEARNER_RECOVERY = 4,
  PCP_DECOUPLED_EVENT_SNAPSHOT_MARKER = 5,
  PCP_DECOUPLED_EVENT_IN_FLIGHT_MESSAGE = 6,
} pcp_decoupled_event_kind_t;

// One selected learner of a fragment sync.
typedef struct pcp_decoupled_participant_t {
  uint32_t learner_id;
  uint64_t learner_step;
  uint64_t steps_since;
  uint64_t tokens_since;
  double merge_weight;
} pcp_decoupled_participant_t;

// A record. Which fields mean something depends on the kind:
//   FRAGMENT_SYNC: syncer_step, fragment_id, participants, clock (after the
//     syncer's tick);
//   LEARNER_APPLY: learner_id applied fragment_id from syncer_step;
//   LEARNER_FAILURE / LEARNER_RECOVERY: learner_id at syncer_step;
//   SNAPSHOT_MARKER: snapshot_id at syncer_step; participants are the
//     learners the snapshot waits on, learner_step = 1 while a marker is
//     still pending from that learner, 0 once it arrived;
//   IN_FLIGHT_MESSAGE: a pull of fragment_id at syncer_step to learner_id
//     that had no answer when it was recorded.
// |participants| and |clock_entries| are borrowed by _append (copied) and
// owned by the tape in records it holds. The clock is stored as its entries
// only (a full pcp_decoupled_clock_t is 16 KiB; a tape holds millions).
typedef struct pcp_decoupled_event_t {
  uint64_t id;   // assigned by the tape, from 1
  int32_t kind;  // pcp_decoupled_event_kind_t
  uint64_t syncer_step;
  uint32_t fragment_id;
  uint32_t learner_id;
  uint64_t snapshot_id;
  pcp_decoupled_participant_t* participants;
  uint32_t participant_count;
  pcp_decoupled_clock_entry_t* clock_entries;  // sorted by node id
  uint32_t clock_entry_count;
} pcp_decoupled_event_t;

// Append-only. Encoding (little-endian):
//   file:   "PCPTAPE1" | u32 version (1) | u32 header CRC32C of the 12 bytes
//           before it | records...
//   record: u32 payload_length | u32 CRC32C(payload) | payload
//   payload: u64 id | u8 kind | u64 syncer_step | u32 fragment_id |
//            u32 learner_id | u64 snapshot_id | u32 participant_count |
//            participants x (u32 learner_id, u64 learner_step,
//            u64 steps_since, u64 tokens_since, f64 merge_weight) |
//            u32 clock_count | clock x (u16 node_id, u64 counter)
// A tape of records is a plain concatenation, so an appended record is
// written once and never rewritten (a crash leaves at worst a truncated
// last record, which _decode reports).
#define PCP_DECOUPLED_TAPE_VERSION 1u
#define PCP_DECOUPLED_TAPE_MAX_EVENTS 4000000u
#define PCP_DECOUPLED_TAPE_MAX_BYTES ((size_t)1 << 30)

typedef struct pcp_decoupled_tape_t {
  pcp_allocator_t allocator;
  pcp_decoupled_event_t* events;
  uint64_t count;
  uint64_t capacity;
  uint64_t cursor;  // replay cursor (index of the next record to replay)
} pcp_decoupled_tape_t;

void pcp_decoupled_tape_initialize(pcp_allocator_t allocator,
                                   pcp_decoupled_tape_t* out_tape);
void pcp_decoupled_tape_deinitialize(pcp_decoupled_tape_t* tape);
// Copies |event| (its participants too), assigns id = count + 1 (returned
// in |out_id|, optional). INVALID_ARGUMENT for an unknown kind or too many
// participants; RESOURCE_EXHAUSTED past the event limit or on allocation
// failure.
PCP_MUST_USE_RESULT pcp_status_t
pcp_decoupled_tape_append(pcp_decoupled_tape_t* tape,
                          const pcp_decoupled_event_t* event, uint64_t* out_id);
// Serializes the whole tape into memory from the tape's allocator (caller
// frees it with that allocator).
PCP_MUST_USE_RESULT pcp_status_t
pcp_decoupled_tape_encode(const pcp_decoupled_tape_t* tape, uint8_t** out_data,
                          size_t* out_byte_length);
// Serializes records |first|..count-1, after the file header when |header|
// (the whole tape: first 0 with the header). Records are self-delimiting,
// so a file holding the header and records 0..first-1 followed by these
// bytes decodes as the whole tape: the writer appends each round's new
// records instead of rewriting the file. OUT_OF_RANGE for |first| past
// count; otherwise as _encode.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_tape_encode_records(
    const pcp_decoupled_tape_t* tape, uint64_t first, bool header,
    uint8_t** out_data, size_t* out_byte_length);
// Parses |data| into an empty, initialized |inout_tape|. DATA_LOSS naming
// the byte offset and record for a bad magic/header CRC, a truncated
// record, a CRC mismatch, ids out of sequence or an unknown kind;
// INCOMPATIBLE for another version; FAILED_PRECONDITION when |inout_tape|
// is not empty. On failure the tape is left empty.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_tape_decode(
    const uint8_t* data, size_t byte_length, pcp_decoupled_tape_t* inout_tape);
// Replays the next FRAGMENT_SYNC record: it must be for (|syncer_step|,
// |fragment_id|); advances the cursor past it and borrows its participants,
// so a replayed round selects the same learners. NOT_FOUND when no sync
// record is left; FAILED_PRECONDITION when the next one is for another
// step or fragment.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_tape_replay_fragment_sync(
    pcp_decoupled_tape_t* tape, uint64_t syncer_step, uint32_t fragment_id,
    const pcp_decoupled_event_t** out_event);

//===----------------------------------------------------------------------===//
// Syncer state (what the tape rebuilds)
//===----------------------------------------------------------------------===//

typedef enum pcp_decoupled_learner_status_e {
  PCP_DECOUPLED_LEARNER_UNKNOWN = 0,
  PCP_DECOUPLED_LEARNER_ACTIVE = 1,
  PCP_DECOUPLED_LEARNER_FAILED = 2,
} pcp_decoupled_learner_status_t;

typedef struct pcp_decoupled_syncer_learner_t {
  int32_t status;              // pcp_decoupled_learner_status_t
  uint64_t last_applied_step;  // newest syncer step it applied (0: none)
  uint64_t last_learner_step;  // newest learner step seen in a sync
} pcp_decoupled_syncer_learner_t;

// The syncer's bookkeeping (the parameters and velocities live in the
// checkpoint; this is what the tape alone determines). About 40 KiB with
// the per-learner table and the clock: keep it off small stacks.
typedef struct pcp_decoupled_syncer_state_t {
  pcp_allocator_t allocator;
  uint32_t fragment_count;
  uint64_t global_step;          // newest synced syncer step
  uint64_t* fragment_versions;   // syncs per fragment
  uint64_t* fragment_last_step;  // syncer step of its newest sync (0: none)
  pcp_decoupled_clock_t clock;
  pcp_decoupled_syncer_learner_t learners[PCP_DECOUPLED_MAX_LEARNERS];
  uint64_t participants_total;
  uint64_t last_snapshot_id;
  uint64_t last_snapshot_step;
  bool snapshot_pending;  // the newest marker still waits on a learner
  // In-flight pulls recorded after the last sync of their fragment.
  uint64_t in_flight_count;
} pcp_decoupled_syncer_state_t;

PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_syncer_state_initialize(
    pcp_allocator_t allocator, uint32_t fragment_count,
    pcp_decoupled_syncer_state_t* out_state);
void pcp_decoupled_syncer_state_deinitialize(
    pcp_decoupled_syncer_state_t* state);

// Live path: records a fragment sync in |state| (version++, global step,
// fragment's step, the syncer clock's tick of node 0, participants ACTIVE
// with their steps) and appends the FRAGMENT_SYNC record to |tape|.
// INVALID_ARGUMENT for a bad fragment, a step not after global_step, a
// learner id out of range.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_syncer_record_sync(
    pcp_decoupled_syncer_state_t* state, pcp_decoupled_tape_t* tape,
    uint64_t syncer_step, uint32_t fragment_id,
    const pcp_decoupled_participant_t* participants,
    uint32_t participant_count);
// Live path for the other kinds (learner_apply, failure, recovery,
// snapshot markers, in-flight pulls): updates |state| and appends.
// INVALID_ARGUMENT for FRAGMENT_SYNC (use _record_sync), a learner id or a
// fragment out of range; the state is unchanged on any error.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_syncer_record_event(
    pcp_decoupled_syncer_state_t* state, pcp_decoupled_tape_t* tape,
    const pcp_decoupled_event_t* event);
// Rebuilds |out_state| (initialized here) from every record of |tape|,
// independently of the live path's code: a record whose effect does not
// fit (a sync step going backwards, a clock that does not match the
// replayed tick, a fragment out of range) is DATA_LOSS naming the record.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_syncer_state_replay(
    pcp_allocator_t allocator, uint32_t fragment_count,
    const pcp_decoupled_tape_t* tape, pcp_decoupled_syncer_state_t* out_state);
// Field-by-field equality (tests, the restart check).
bool pcp_decoupled_syncer_state_equal(const pcp_decoupled_syncer_state_t* a,
                                      const pcp_decoupled_syncer_state_t* b);

//===----------------------------------------------------------------------===//
// Recovery plan
//===----------------------------------------------------------------------===//

// Upstream's RecoveryPlan: after a restart the syncer targets the tape's
// global step; updates for fragments at a step >= target are accepted, and
// once the current step passes started + max_recovery_syncer_steps without
// having caught up a restart is required.
typedef struct pcp_decoupled_recovery_window_t {
  uint64_t target_step;
  uint64_t started_step;
  uint64_t max_recovery_syncer_steps;
} pcp_decoupled_recovery_window_t;
bool pcp_decoupled_recovery_accepts(
    const pcp_decoupled_recovery_window_t* window, uint64_t step);
bool pcp_decoupled_recovery_restart_required(
    const pcp_decoupled_recovery_window_t* window, uint64_t current_step);

// A learner alive after the restart, as its first metadata reports it.
typedef struct pcp_decoupled_live_learner_t {
  uint32_t learner_id;
  uint64_t observed_global_step;
} pcp_decoupled_live_learner_t;

typedef enum pcp_decoupled_recovery_action_kind_e {
  // Up to date (observed >= target): keeps training, takes part from the
  // next scheduled step.
  PCP_DECOUPLED_RECOVERY_RESUME = 1,
  // Behind by at most max_recovery_syncer_steps: send it the current value
  // of every fragment synced after its observed step (the fragment list).
  PCP_DECOUPLED_RECOVERY_CATCH_UP = 2,
  // Behind by more, unknown to the tape (a joiner) or marked FAILED: send
  // every fragment (the full online weights), log LEARNER_RECOVERY.
  PCP_DECOUPLED_RECOVERY_FULL_RESYNC = 3,
  // Known to the tape as ACTIVE but not alive: log LEARNER_FAILURE, leave
  // it out of quorums.
  PCP_DECOUPLED_RECOVERY_MARK_FAILED = 4,
  // A pull recorded in flight after its fragment's last sync: that sync
  // never completed; pull the fragment again (fragment_id) before moving
  // on.
  PCP_DECOUPLED_RECOVERY_REPULL = 5,
} pcp_decoupled_recovery_action_kind_t;

typedef struct pcp_decoupled_recovery_action_t {
  int32_t kind;  // pcp_decoupled_recovery_action_kind_t
  uint32_t learner_id;
  uint32_t fragment_id;  // REPULL
  // CATCH_UP / FULL_RESYNC: fragments to send, ascending (owned by the
  // plan's allocator).
  uint32_t* fragments;
  uint32_t fragment_count;
} pcp_decoupled_recovery_action_t;

typedef struct pcp_decoupled_recovery_plan_t {
  pcp_allocator_t allocator;
  pcp_decoupled_recovery_window_t window;
  // MARK_FAILED first (ascending id), then REPULL (ascending fragment),
  // then one action per live learner in ascending id.
  pcp_decoupled_recovery_action_t* actions;
  uint32_t action_count;
  // The snapshot the restart resumes from is complete (no marker pending).
  bool snapshot_complete;
} pcp_decoupled_recovery_plan_t;

// The plan of a restarted syncer from the replayed |state|, the |tape| (for
// in-flight pulls) and the learners alive now (distinct ids). started_step
// = target_step = state->global_step. INVALID_ARGUMENT for duplicate or
// out-of-range ids.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_recovery_plan_initialize(
    pcp_allocator_t allocator, const pcp_decoupled_syncer_state_t* state,
    const pcp_decoupled_tape_t* tape, const pcp_decoupled_live_learner_t* live,
    uint32_t live_count, uint64_t max_recovery_syncer_steps,
    pcp_decoupled_recovery_plan_t* out_plan);
void pcp_decoupled_recovery_plan_deinitialize(
    pcp_decoupled_recovery_plan_t* plan);

//===----------------------------------------------------------------------===//
// int4 codec
//===----------------------------------------------------------------------===//

// Real int4 compression of an outer gradient or a fragment for the wire.
// Values are cut into blocks of |block_size| (default 64; the reference's
// simulated round trip uses one scale per tensor); each block has an f32
// scale s >= max|x|/7 and codes q = round(x/s) in [-7, 7], stored as the
// nibble q + 8 (element i: byte i/2, low nibble when i is even).
// Layout: block_count x f32 LE scales | ceil(n/2) code bytes, where
// block_count = ceil(n/block_size); no header (the receiver knows n and the
// block size from the plan). For n = 64k values that is 36k bytes against
// 256k for f32: 7.11x smaller.
// Bound (asserted by the tests): |x - decode(encode(x))| <= s/2 for every
// element, s its block's scale. Exact, not approximate: s is rounded so
// that q*s is exact in f32 (its low 3 mantissa bits are zero) and
// s*7 >= max|x| (no clamping) unless that would overflow, in which case the
// clamped error is still below s/2. A block of zeros has s = 0 and decodes
// to zeros.
#define PCP_DECOUPLED_INT4_DEFAULT_BLOCK 64u
#define PCP_DECOUPLED_INT4_MAX_BLOCK 65536u
// Values in one payload (a tensor or fragment; 8 GiB of f32).
#define PCP_DECOUPLED_INT4_MAX_VALUES ((size_t)1 << 31)

// Encoded size of |count| values: 4*ceil(count/block) + ceil(count/2).
// 0 when block_size is 0 or count is above PCP_DECOUPLED_INT4_MAX_VALUES.
size_t pcp_decoupled_int4_encoded_size(size_t count, uint32_t block_size);
// INVALID_ARGUMENT naming the first element that is NaN or infinite (the
// codec refuses them rather than silently zeroing them), a block size of 0
// or above the max, a count above the max, or an |out_capacity| below the
// encoded size.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_int4_encode(const float* values,
                                                           size_t count,
                                                           uint32_t block_size,
                                                           uint8_t* out_data,
                                                           size_t out_capacity);
// DATA_LOSS when |byte_length| is not the encoded size of |count|, a scale
// is negative, not finite or so large that 7*scale overflows, or a code is
// 0 (none of which the encoder writes);
// INVALID_ARGUMENT for the block size or a count above the max.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_int4_decode(const uint8_t* data,
                                                           size_t byte_length,
                                                           size_t count,
                                                           uint32_t block_size,
                                                           float* out_values);

//===----------------------------------------------------------------------===//
// Experiment keys (the decoupled_diloco block)
//===----------------------------------------------------------------------===//

// The keys of reference s.1.6 with the syncer's defaults of s.1.3, plus
// int4_block_size (ours). |present| first, so the struct can later sit in
// the DiLoCo config as an OBJECT field ("decoupled_diloco").
// embedding_tensor_indices is not a key here yet (the config tables have
// no integer list type): the caller passes the indices to the plan.
typedef struct pcp_decoupled_config_t {
  bool present;
  int64_t num_fragments;    // P, default 24
  int64_t sync_interval_h;  // H; 0: the experiment's tau
  int64_t overlap_tau;      // default 2
  int64_t min_quorum;       // default 1
  int64_t grace_window_ms;  // default 0
  double grace_gamma;       // default 1.0
  int64_t max_grace_steps;  // default 1
  bool adaptive_grace_enabled;
  double timing_ema_alpha;             // default 0.125
  int32_t merge_strategy;              // pcp_decoupled_merge_strategy_t
  int32_t fragment_strategy;           // pcp_decoupled_fragment_strategy_t
  double learner_alpha;                // default 0
  double outer_learning_rate;          // default 0.7 (upstream null -> 0.7)
  int32_t outer_gradient_compression;  // 0 none, 1 int4
  int64_t int4_block_size;             // default 64
  int64_t max_recovery_syncer_steps;   // default 24
  // int4 on the down path (@mix_int4: the merged fragment's change against
  // the broadcast copy every learner holds, error feedback on the gateway):
  // 0 auto (on when outer_gradient_compression is int4), 1 on, 2 off.
  int32_t int4_down;
  // Local steps per learner task (ours, default 1): K > 1 compiles the
  // K-step @train_steps as well and runs K steps per task wherever none of
  // them but the last is followed by something due (docs/training.md).
  int64_t steps_per_task;
  // A fresh start's @init of a fragment that holds the seeded initial
  // values goes as seeded-init tensor refs (the learners fill them):
  // 0 auto (on), 1 off.
  int32_t seeded_init;
  // One more round after the last local step for every fragment whose last
  // scheduled round is before it (pcp_decoupled_schedule_last_step), so
  // the masters the job exports hold all S steps (default true).
  bool final_sync;
} pcp_decoupled_config_t;

// The table (defaults, bounds, help). Cross-field rules: timing_ema_alpha
// in (0, 1], grace_gamma finite, num_fragments <= sync_interval_h when H
// is given.
const pcp_config_table_t* pcp_decoupled_config_table(void);
// Defaults, then the JSON object |text|, then validation; |present| set.
// Unknown keys go to |out_unknown_keys| (optional). INVALID_ARGUMENT names
// the key; the config is left deinitialized on failure.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_config_parse_json(
    const char* text, size_t byte_length, pcp_decoupled_config_t* out_config,
    pcp_string_list_t* out_unknown_keys);
void pcp_decoupled_config_deinitialize(pcp_decoupled_config_t* config);
// The rules that need the run: H = sync_interval_h or |tau|, P <= H,
// 1 <= min_quorum <= |workers|; fills the schedule and the grace config
// (both optional). INVALID_ARGUMENT naming the key.
PCP_MUST_USE_RESULT pcp_status_t pcp_decoupled_config_resolve(
    const pcp_decoupled_config_t* config, uint32_t workers, uint64_t tau,
    pcp_decoupled_schedule_t* out_schedule,
    pcp_decoupled_grace_config_t* out_grace);

#ifdef __cplusplus
}
#endif

#endif  // PCP_WORKLOADS_TRAIN_DECOUPLED_H_
