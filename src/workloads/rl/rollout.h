// SPDX-License-Identifier: Apache-2.0
//
// Rollouts of a GRPO iteration (issue 16, Deliver 2): groups of completions
// sampled by the inference service's engine on the rollout workers
// (continuous batching, stop tokens from the tokenizer), each with the
// per-token log-probabilities of its sampled tokens and the policy version
// that produced it; their rewards; and the packing of scored rollouts into
// the [rows, T] tensors of the @grpo objective (rl.h).
//
// Contract header: written by the lead before the implementation
// (rollout.c) so that the job (job.c) and the rollout library are built at
// the same time. Change a signature only with the lead.
//
// Threading: generate and score block the calling thread (a job's run);
// each call is independent. A rollout set is immutable after generate
// except for the rewards score writes.
// Ownership: sets and batches own their memory (their allocator); free
// with _deinitialize (safe on a zeroed struct).

#ifndef PCP_WORKLOADS_RL_ROLLOUT_H_
#define PCP_WORKLOADS_RL_ROLLOUT_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "workloads/infer/infer.h"
#include "workloads/rl/experiment.h"
#include "workloads/rl/reward.h"

#ifdef __cplusplus
extern "C" {
#endif

// One sampled completion.
typedef struct pcp_workloads_rl_rollout_t {
  uint32_t prompt_index;  // index into the prompt set
  uint32_t sample_index;  // 0..group_size-1 within its group
  // The policy version that generated it: the outer_step of the served
  // model version that ran the request (the RL job writes its policy
  // version there). -1 when the served model.json had none.
  int64_t policy_version;
  // The prompt as the model's tokenizer encoded it (what was prefilled).
  int32_t* prompt_ids;
  int64_t prompt_count;
  // Every sampled token, EOS included, with its log-probability under the
  // distribution it was drawn from (pcp_infer_token_t.logprob).
  int32_t* completion_ids;
  float* completion_logp;
  int64_t completion_count;
  // The completion's text (what a reward scores), NUL-terminated.
  char* completion_text;
  size_t completion_length;
  pcp_finish_reason_t finish_reason;  // STOP (EOS / stop string) or LENGTH
  float reward;                       // set by pcp_workloads_rl_rollouts_score
} pcp_workloads_rl_rollout_t;

// The rollouts of one call: groups are consecutive (group g is items
// [g * group_size, (g + 1) * group_size)), in the order of the request's
// prompt_indices.
typedef struct pcp_workloads_rl_rollout_set_t {
  pcp_allocator_t allocator;
  pcp_workloads_rl_rollout_t* items;
  size_t count;
  int64_t group_size;
  int64_t completion_tokens;  // sum of completion_count
  double seconds;             // wall time from the first submit to the last end
} pcp_workloads_rl_rollout_set_t;

typedef struct pcp_workloads_rl_rollout_request_t {
  const char* model;  // the served model name
  const pcp_workloads_rl_prompts_t* prompts;
  const uint32_t* prompt_indices;  // which prompts (each gives one group)
  size_t prompt_count;
  int64_t group_size;  // G >= 1 (evaluation may use 1)
  double temperature;  // > 0 for GRPO; 0 (greedy) allowed for evaluation
  double top_p;        // (0, 1]
  int64_t max_tokens;  // new tokens per completion, >= 1
  // Sample i of the group at position p of prompt_indices uses a seed that
  // depends only on (seed, p, i): reproducible, distinct within a group.
  uint64_t seed;
  // Requests queued in the service at once (0: 64); more wait here, so a
  // large iteration does not hit the service's per-worker queue cap (429).
  uint32_t max_in_flight;
  // Polled at least every 100 ms; true ends the call with CANCELLED
  // (requests in flight are stopped).
  bool (*stop)(void* user_data);
  void* stop_user_data;
  // The whole call (0: none; at most 7 days). DEADLINE_EXCEEDED past it.
  int64_t timeout_ms;
} pcp_workloads_rl_rollout_request_t;

// Submits prompt_count x group_size requests (the prompt's text encoded as
// it is, not through a chat template) to |service| and waits for all of
// them. A request that fails (worker lost, ...) fails the call with its
// status (nothing is silently dropped); UNAVAILABLE while no worker serves
// |model| (with a timeout_ms the call waits for one until the deadline,
// then DEADLINE_EXCEEDED; without, it fails at once). INVALID_ARGUMENT
// naming the field for a bad request. On failure |out_set| is left
// deinitialized, and no callback of its requests runs after the return.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_rollouts_generate(
    pcp_infer_service_t* service,
    const pcp_workloads_rl_rollout_request_t* request,
    pcp_allocator_t allocator, pcp_workloads_rl_rollout_set_t* out_set);

void pcp_workloads_rl_rollout_set_deinitialize(
    pcp_workloads_rl_rollout_set_t* set);

// Scores every rollout of |set| with |verifier| (one score_batch call per
// at most |max_batch| rollouts; 0: all at once), writing each reward. The
// sample is {prompt, completion, answer, metadata} from |prompts| and the
// rollout, with the completion's token count. The verifier's error fails
// the call (never a zero reward).
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_rollouts_score(
    const pcp_workloads_rl_verifier_t* verifier,
    const pcp_workloads_rl_prompts_t* prompts, size_t max_batch,
    pcp_workloads_rl_rollout_set_t* set);

// Same, passing |stop| (may be NULL) to the verifier: CANCELLED ("scoring
// cancelled") soon after it turns true, with |set| left as it was.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_rollouts_score_until(
    const pcp_workloads_rl_verifier_t* verifier,
    const pcp_workloads_rl_prompts_t* prompts, size_t max_batch,
    const pcp_workloads_rl_stop_t* stop, pcp_workloads_rl_rollout_set_t* set);

// The [rows, length] tensors of @grpo for scored rollouts (rl.h):
//   sequence s  = prompt_ids ++ completion_ids
//   input_ids[r, t] = s[t], targets[r, t] = s[t + 1]  (t < |s| - 1)
//   mask[r, t]      = 1 where targets[r, t] is a completion token, else 0
//   old_logp[r, t]  = that completion token's completion_logp (else 0)
//   advantages[r]   = the rollout's advantage
// A sequence longer than length + 1 loses prompt tokens from the front
// (at least one prompt token is kept), then completion tokens from the end
// (those are counted in |truncated_tokens| and never trained on). Rows past
// |count| (up to |rows|) and positions past |s| are padding: ids
// |pad_id|, mask 0, old_logp 0, advantage 0. ref_logp is zero-filled (the
// trainer writes it).
typedef struct pcp_workloads_rl_batch_t {
  pcp_allocator_t allocator;
  int64_t rows;               // R (a multiple of the trainer's micro-batch)
  int64_t length;             // T (the model's block size)
  int32_t* input_ids;         // R x T
  int32_t* targets;           // R x T
  float* mask;                // R x T
  float* old_logp;            // R x T
  float* ref_logp;            // R x T
  float* advantages;          // R
  int64_t sequences;          // rows holding a rollout (the rest pad)
  int64_t completion_tokens;  // sum of mask
  int64_t truncated_tokens;   // completion tokens cut by |length|
} pcp_workloads_rl_batch_t;

// Packs |count| rollouts (|rollouts[i]| borrowed) with |advantages[i]|
// into |out_batch| of |rows| >= |count| rows of |length| >= 2. Every
// rollout must have at least one prompt token. INVALID_ARGUMENT naming the
// field; RESOURCE_EXHAUSTED when out of memory.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_batch_pack(
    const pcp_workloads_rl_rollout_t* const* rollouts, const float* advantages,
    size_t count, int64_t rows, int64_t length, int32_t pad_id,
    pcp_allocator_t allocator, pcp_workloads_rl_batch_t* out_batch);

void pcp_workloads_rl_batch_deinitialize(pcp_workloads_rl_batch_t* batch);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // PCP_WORKLOADS_RL_ROLLOUT_H_
