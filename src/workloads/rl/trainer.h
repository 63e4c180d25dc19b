// SPDX-License-Identifier: Apache-2.0
//
// The GRPO policy update on workers (issue 16, Deliver 4): the programs
// (the @grpo objective module of rl.h and the training module PCP's
// autodiff derives from it) compiled through the compile queue for the
// trainer workers' (backend, target), the reference log-probabilities of a
// packed batch, and one AdamW step over a batch, data-parallel over up to
// max_workers workers:
//
//   1. ref_logp: @grpo_metrics with the reference parameters (kept
//      resident on each worker that needs them) on every micro-batch;
//   2. gradients: @compute_gradients_accumulated (A micro-batches of B rows
//      per worker task; rows are split over the workers, a whole number of
//      micro-batches each) with the current parameters;
//   3. the gateway sums the workers' gradients: every micro-batch runs with
//      token_normalizer = N / A (N the whole batch's completion tokens), so
//      each worker's accumulated gradient is its share of the token mean
//      over the whole batch and their sum is the step's gradient (docs/rl.md
//      derives it);
//   4. @apply_optimizer on one worker: global-norm clip, AdamW with the
//      step's learning rate; parameters, m and v come back to the gateway,
//      which owns them (a checkpoint holds all three and the step, so a
//      resumed job continues exactly).
//   5. metrics: @grpo_metrics with the parameters the step started from
//      (loss, KL, clip fractions, ratio; token-weighted means).
//
// Contract header: written by the lead before the implementation
// (trainer.c) so that the job (job.c) and the trainer are built at the same
// time. Change a signature only with the lead.
//
// Threading: a trainer is used by one thread (its job's run). Ownership:
// options are copied (strings too); the fabric endpoint and compile queue
// are borrowed and must outlive the trainer.

#ifndef PCP_WORKLOADS_RL_TRAINER_H_
#define PCP_WORKLOADS_RL_TRAINER_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "fabric/fabric.h"
#include "models/models.h"
#include "workloads/rl/rollout.h"
#include "workloads/runtime/compile_queue.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pcp_workloads_rl_trainer_t pcp_workloads_rl_trainer_t;

typedef struct pcp_workloads_rl_trainer_options_t {
  pcp_fabric_endpoint_t* fabric;                 // borrowed
  pcp_workloads_compile_queue_t* compile_queue;  // borrowed
  // The policy's architecture: spec.batch is the micro-batch B (rows per
  // program call), spec.block_size the sequence length T. f32 only.
  pcp_models_spec_t spec;
  // Micro-batches per worker task (A >= 1; the derived program's
  // --accumulate).
  int64_t accumulation_steps;
  // Workers of this class only ("" or NULL: any), backend and target as
  // the fabric places tasks. Data-parallel width: at most |max_workers|
  // (>= 1) connected workers of the class take part in a step.
  const char* worker_class;
  uint32_t max_workers;
  // AdamW (compiled into @apply_optimizer): betas, epsilon, decoupled
  // weight decay, global gradient-norm clip (0: off).
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  double grad_clip;
  // Worker sessions are named "<session_prefix>:..." (the job id), so two
  // jobs never share resident tensors.
  const char* session_prefix;
  // A task that takes longer fails the call (0: 600000).
  int64_t task_timeout_ms;
  // Polled while waiting; true ends the call with CANCELLED (tasks out are
  // cancelled).
  bool (*stop)(void* user_data);
  void* stop_user_data;
  pcp_log_context_t log;
} pcp_workloads_rl_trainer_options_t;

// Validates |options| (INVALID_ARGUMENT naming the field) and copies them.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_trainer_create(
    const pcp_workloads_rl_trainer_options_t* options,
    pcp_allocator_t allocator, pcp_workloads_rl_trainer_t** out_trainer);
// Releases the worker sessions it made (best effort) and frees. NULL ok.
void pcp_workloads_rl_trainer_release(pcp_workloads_rl_trainer_t* trainer);

// Emits, derives and compiles (through the compile queue, cached by
// artifact key) both programs for the (backend, target) of every connected
// worker of the class, and registers them with the fabric. Blocks until
// done: UNAVAILABLE when no worker of the class is connected, the compile
// error otherwise, CANCELLED on stop. Called again it only compiles for
// targets it has not seen (workers that joined since).
PCP_MUST_USE_RESULT pcp_status_t
pcp_workloads_rl_trainer_prepare(pcp_workloads_rl_trainer_t* trainer);

// The parameter table of the spec (names, shapes, @grpo's argument order).
const pcp_models_parameter_table_t* pcp_workloads_rl_trainer_table(
    const pcp_workloads_rl_trainer_t* trainer);

// Sets the reference policy's parameters (f32 host buffers in table order,
// copied). Must be called once before ref_logp.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_trainer_reference_set(
    pcp_workloads_rl_trainer_t* trainer, const float* const* parameters);

// Per-step scalars of the objective (rank-0 data inputs of @grpo: change
// them per call without a recompile).
typedef struct pcp_workloads_rl_step_params_t {
  double learning_rate;  // this step's rate (the schedule applied)
  int64_t step;          // 1-based AdamW step of this update
  double clip_low;
  double clip_high;
  double beta;         // KL weight
  double temperature;  // the rollouts' sampling temperature (> 0)
} pcp_workloads_rl_step_params_t;

// Writes |batch|->ref_logp: the log-probability of every target under the
// reference parameters at |temperature|, on the workers. batch->rows must
// be a multiple of spec.batch.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_trainer_ref_logp(
    pcp_workloads_rl_trainer_t* trainer, double temperature,
    pcp_workloads_rl_batch_t* batch);

typedef struct pcp_workloads_rl_update_metrics_t {
  double loss;  // the step's objective, token mean over the batch
  double mean_kl;
  double clip_low_fraction;
  double clip_high_fraction;
  double mean_ratio;
  double grad_norm;  // global norm of the averaged gradient, before clip
  int64_t completion_tokens;
  uint32_t workers;  // that computed gradients
  double seconds;    // wall time of the whole update
} pcp_workloads_rl_update_metrics_t;

// One AdamW step over |batch| (rows a multiple of spec.batch x
// accumulation_steps; pad rows have mask 0). |parameters|, |m|, |v| (f32
// host buffers in table order, caller-owned) are read and overwritten with
// the step's results. A failed or lost worker fails the call (nothing is
// written then); the caller may retry the step.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_trainer_update(
    pcp_workloads_rl_trainer_t* trainer,
    const pcp_workloads_rl_step_params_t* step_params,
    const pcp_workloads_rl_batch_t* batch, float* const* parameters,
    float* const* m, float* const* v,
    pcp_workloads_rl_update_metrics_t* out_metrics);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // PCP_WORKLOADS_RL_TRAINER_H_
