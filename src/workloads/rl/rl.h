// SPDX-License-Identifier: Apache-2.0
//
// rl: the numerical core of GRPO post-training (issue 16): group-normalised
// advantages on the host, and the GRPO objective emitted as StableHLO from a
// built-in model's forward, so that PCP's autodiff derives its gradient the
// way it derives a training step's (docs/rl.md has the formulas).
//
// Nothing here runs a service: rollouts, rewards, weight refresh and the
// job kind come later (docs/rl.md, "planned").
//
// Threading: every function is thread-safe (no shared state).
// Ownership: callers own every buffer; nothing is retained after a call.

#ifndef PCP_WORKLOADS_RL_RL_H_
#define PCP_WORKLOADS_RL_RL_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "compile/compile.h"
#include "models/models.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Group-normalised advantages (src/workloads/rl/advantage.c)
//===----------------------------------------------------------------------===//

// Samples per prompt (G): at least 2 (one sample has no spread to compare
// against), at most this.
#define PCP_RL_MAX_GROUP_SIZE 1024
// Rewards in one call (all groups of an iteration).
#define PCP_RL_MAX_SAMPLES ((size_t)1 << 24)
// TRL's GRPOTrainer value: large enough that a group whose rewards differ by
// rounding noise does not blow up to +-1/eps advantages.
#define PCP_RL_DEFAULT_ADVANTAGE_EPSILON 1e-4

typedef struct pcp_workloads_rl_advantage_options_t {
  // G: consecutive runs of |group_size| rewards belong to one prompt.
  int64_t group_size;
  // Added to the group's standard deviation; in [0, 1].
  double epsilon;
  // true (GRPO): A = (r - mean) / (std + epsilon). false (Dr. GRPO's
  // unbiased variant): A = r - mean, no division.
  bool scale_by_std;
} pcp_workloads_rl_advantage_options_t;

// group_size 0 (must be set), epsilon PCP_RL_DEFAULT_ADVANTAGE_EPSILON,
// scale_by_std true.
void pcp_workloads_rl_advantage_options_initialize(
    pcp_workloads_rl_advantage_options_t* out_options);

typedef struct pcp_workloads_rl_advantage_stats_t {
  int64_t group_count;
  // Groups whose rewards are all equal: their advantages are exactly 0, so
  // they carry no learning signal (a caller counts them; DAPO resamples).
  int64_t degenerate_group_count;
  // Over all |count| rewards (population standard deviation): what a
  // progress line reports as "reward mean / std".
  double reward_mean;
  double reward_std;
} pcp_workloads_rl_advantage_stats_t;

// Per group g of G rewards r_1..r_G (computed in double):
//   mean = sum(r) / G
//   std  = sqrt(sum((r - mean)^2) / (G - 1))   (sample std, as TRL and
//                                               torch.std)
//   A_i  = (r_i - mean) / (std + epsilon)      (scale_by_std)
//        = r_i - mean                          (otherwise)
// A group whose rewards are all equal gets A = 0 exactly (not the rounding
// residue of r - mean) and is counted in |out_stats|. |out_advantages| may
// alias |rewards|. INVALID_ARGUMENT naming the field for a group_size out of
// [2, PCP_RL_MAX_GROUP_SIZE], an epsilon out of [0, 1], a |count| that is 0,
// over PCP_RL_MAX_SAMPLES or not a multiple of group_size, or a reward that
// is not finite (naming its index); nothing is written then.
// |out_stats| may be NULL.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_advantages_compute(
    const pcp_workloads_rl_advantage_options_t* options, const float* rewards,
    size_t count, float* out_advantages,
    pcp_workloads_rl_advantage_stats_t* out_stats);

//===----------------------------------------------------------------------===//
// The GRPO objective (src/workloads/rl/objective.c)
//===----------------------------------------------------------------------===//

// The loss function, for pcp_compile_training_module_build's function_name:
//   @grpo(params..., input_ids: BxT i32, targets: BxT i32, mask: BxT f32,
//         old_logp: BxT f32, ref_logp: BxT f32, advantages: B f32,
//         clip_low: f32, clip_high: f32, beta: f32,
//         token_normalizer: f32, temperature: f32) -> loss: f32
// (scalars are rank-0 tensors). targets[b, t] is the token that follows
// input_ids[b, t]; mask is 1 on completion tokens and 0 on prompt and
// padding; old_logp and ref_logp are the log-probabilities of targets under
// the policy that sampled them and under the reference policy. The policy's
// logp is log_softmax(logits / temperature)[target]: the distribution the
// rollouts sampled from (temperature > 0; 1 is the model's own). The loss is
// -sum(mask * objective) / N: N = token_normalizer when it is > 0 (the
// completion tokens of a whole accumulated step divided by the number of
// micro-batches, since accumulation averages them; or a constant, as Dr.
// GRPO), else this batch's completion tokens, max(sum(mask), 1).
#define PCP_RL_OBJECTIVE_FUNCTION "grpo"
// Same arguments -> (loss, mean_kl, clip_low_fraction, clip_high_fraction,
// mean_ratio, logp: BxT f32), the loss as @grpo's, the others means over
// this batch's masked tokens. Not differentiated; run it on the same batch
// for the progress metrics.
#define PCP_RL_OBJECTIVE_METRICS_FUNCTION "grpo_metrics"
// The trailing arguments of @grpo that are data (no gradient): input_ids
// through temperature.
#define PCP_RL_OBJECTIVE_DATA_ARGUMENT_COUNT 11

// Appends a module holding the model's @main and @logits (exactly
// pcp_models_module_emit's functions) plus @grpo and @grpo_metrics for
// |spec| (validated first; B and T are the spec's batch and block size).
// @grpo calls @logits; the autodiff inlines the call. Deterministic text.
// RESOURCE_EXHAUSTED when the builder's cap is reached.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_objective_module_emit(
    const pcp_models_spec_t* spec, pcp_string_builder_t* builder);

// Training options that derive d loss / d params of @grpo: GRAD,
// function_name PCP_RL_OBJECTIVE_FUNCTION, data_argument_count
// PCP_RL_OBJECTIVE_DATA_ARGUMENT_COUNT, the rest as
// pcp_compile_training_options_initialize. A caller may then set TRAIN and
// the AdamW fields; the derived module's @main is @grpo and
// @compute_gradients returns (loss, dparams...).
void pcp_workloads_rl_objective_training_options_initialize(
    pcp_compile_training_options_t* out_options);

#ifdef __cplusplus
}
#endif

#endif  // PCP_WORKLOADS_RL_RL_H_
