// SPDX-License-Identifier: Apache-2.0
//
// workloads: the pieces of PCP's workloads that are plain host code, below
// the programs that run on workers.
//
// Inference sampling: picks the next token from one row of f32 logits
// (greedy, temperature, top-k, top-p, repetition/presence/frequency
// penalties), reproducibly from a seed; and the stop conditions of a
// generation (max_tokens, EOS ids, stop sequences matched on the decoded
// text across token boundaries, holding back text that may start a stop
// sequence as OpenAI's streaming does).
//
// Threading: a sampler or stop state is thread-compatible (one sequence,
// one thread at a time); distinct objects are independent.
// Ownership: caller-owned structs; nothing here retains caller pointers
// beyond the call except where stated (stop strings are copied).

#ifndef PCP_WORKLOADS_WORKLOADS_H_
#define PCP_WORKLOADS_WORKLOADS_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

//===--- DiLoCo / streaming DiLoCo (src/workloads/train/) ---===//
// Config, outer step, streaming schedule, checkpoints, wire accounting.
#include "workloads/train/diloco.h"  // IWYU pragma: export
//===--- Decoupled DiLoCo (src/workloads/train/decoupled_*.c, issue 17) ---===//
// Fragment plans, schedule, merges, quorum, clocks, tape, recovery, int4.
#include "workloads/train/decoupled.h"  // IWYU pragma: export
//===--- DiLoCo training service (src/workloads/train/service.c) ---===//
// The outer loop of a training job over the worker fabric.
#include "workloads/train/service.h"  // IWYU pragma: export
//===--- Workload runtime (src/workloads/runtime/) ---===//
// The job runner every workload kind shares: kinds, transitions, recovery,
// cancel, the bounded pool.
#include "workloads/runtime/runtime.h"  // IWYU pragma: export
// The training kind on the runner (src/workloads/train/job.c).
#include "workloads/train/job.h"  // IWYU pragma: export
// The training kind's validation: paths, caps, the stored spec
// (src/workloads/train/policy.c).
#include "workloads/train/policy.h"  // IWYU pragma: export
// The generic job kind on the runner (src/workloads/jobs/jobs.c).
#include "workloads/jobs/jobs.h"  // IWYU pragma: export
//===--- RL (src/workloads/rl/, issue 16) ---===//
// GRPO core: group-normalised advantages and the @grpo objective module.
#include "workloads/rl/rl.h"  // IWYU pragma: export
//===--- RL rewards (src/workloads/rl/reward.c, issue 16) ---===//
// Built-in verifiable rewards and the batch verifier interface.
#include "workloads/rl/reward.h"  // IWYU pragma: export
//===--- RL experiment (src/workloads/rl/experiment.c, prompts.c) ---===//
// The GRPO job's experiment JSON and its prompts JSONL (issue 16).
#include "workloads/rl/experiment.h"  // IWYU pragma: export

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Inference sampling
//===----------------------------------------------------------------------===//

typedef struct pcp_sampling_params_t {
  // 0 = greedy (argmax, lowest id on ties). Otherwise softmax(logits / T).
  double temperature;
  // Keep the k most likely tokens (ties at the cut: lowest ids). 0 = off;
  // 1 = greedy whatever the temperature.
  int64_t top_k;
  // Keep the smallest set of most likely tokens whose probability (after
  // temperature and top-k) reaches top_p. 1 = off; in (0, 1].
  double top_p;
  // CTRL / Hugging Face: the logit of a token already in the history is
  // divided by the penalty when positive, multiplied when negative. 1 = off.
  double repetition_penalty;
  // OpenAI: logit -= presence * [count > 0] + frequency * count, counts
  // over the history. 0 = off; each in [-2, 2].
  double presence_penalty;
  double frequency_penalty;
  uint64_t seed;
} pcp_sampling_params_t;

// temperature 0, top_k 0, top_p 1, penalties off, seed 0.
void pcp_sampling_params_initialize(pcp_sampling_params_t* out_params);

// INVALID_ARGUMENT naming the field (negative or non-finite temperature,
// top_p outside (0, 1], repetition_penalty <= 0, ...).
PCP_MUST_USE_RESULT pcp_status_t
pcp_sampling_params_validate(const pcp_sampling_params_t* params);

// One sequence's sampler: its parameters, its generator (seeded once, so
// the n-th draw of a sequence depends only on the seed and n) and scratch
// for |vocab| entries.
typedef struct pcp_sampler_t {
  pcp_allocator_t allocator;
  pcp_sampling_params_t params;
  int64_t vocab;
  pcp_rng_t rng;
  double* scratch;   // vocab entries
  void* candidates;  // vocab entries (a private type)
  uint32_t* counts;  // vocab entries (history counts for penalties)
} pcp_sampler_t;

// Validates |params| and allocates scratch for |vocab| (> 0, < 2^31).
// Release with pcp_sampler_deinitialize.
PCP_MUST_USE_RESULT pcp_status_t
pcp_sampler_initialize(const pcp_sampling_params_t* params, int64_t vocab,
                       pcp_allocator_t allocator, pcp_sampler_t* out_sampler);
void pcp_sampler_deinitialize(pcp_sampler_t* sampler);

// Picks the next token from |logits| (|vocab| f32, not modified). |history|
// (ids already in the sequence, prompt included) feeds the penalties and
// may be NULL when |history_count| is 0; ids outside the vocabulary are
// ignored. NaN logits count as -inf. INVALID_ARGUMENT when no logit is
// finite or above -inf. Greedy draws no random number; sampling draws one.
PCP_MUST_USE_RESULT pcp_status_t pcp_sampler_sample(pcp_sampler_t* sampler,
                                                    const float* logits,
                                                    const int32_t* history,
                                                    size_t history_count,
                                                    int32_t* out_token);

// Log-probabilities of a sampled token (issue 16: a rollout's old_logp and
// OpenAI's `logprobs`). They are those of the distribution the token was
// drawn from: the logits after the penalties, divided by the temperature,
// restricted to the kept set of top-k / top-p and renormalised over it, so
// that exp(logprob) is the probability the sampler gave the token (what
// GRPO's importance ratio needs; a token outside the kept set could not
// have been drawn). log-sum-exp is stable (the maximum subtracted) in f64,
// reported as f32. Greedy (temperature 0 or top_k 1) is a point mass on
// the argmax: logprob 0 and one top entry.
#define PCP_SAMPLER_MAX_TOP_LOGPROBS 20
typedef struct pcp_token_logprob_t {
  int32_t token;
  float logprob;
} pcp_token_logprob_t;
typedef struct pcp_sampler_logprobs_t {
  float logprob;  // of the sampled token
  // The most likely tokens of the kept set, most likely first (ties:
  // lowest id), at most the count asked for and the kept set's size.
  size_t top_count;
  pcp_token_logprob_t top[PCP_SAMPLER_MAX_TOP_LOGPROBS];
} pcp_sampler_logprobs_t;

// pcp_sampler_sample that also reports the log-probabilities above, with
// |top_count| (0..PCP_SAMPLER_MAX_TOP_LOGPROBS, else INVALID_ARGUMENT) top
// entries. Draws the same tokens as pcp_sampler_sample for the same seed.
PCP_MUST_USE_RESULT pcp_status_t pcp_sampler_sample_logprobs(
    pcp_sampler_t* sampler, const float* logits, const int32_t* history,
    size_t history_count, size_t top_count, int32_t* out_token,
    pcp_sampler_logprobs_t* out_logprobs);

// Batch form: |samplers[b]| samples row b of |logits| (B x vocab, all the
// samplers with the same vocab); |histories[b]| / |history_counts[b]| as
// above (|histories| may be NULL). Rows are independent: the result of a
// row equals pcp_sampler_sample on it alone. Stops at the first error and
// annotates it with the row.
PCP_MUST_USE_RESULT pcp_status_t
pcp_sampler_sample_batch(pcp_sampler_t* samplers, size_t batch,
                         const float* logits, const int32_t* const* histories,
                         const size_t* history_counts, int32_t* out_tokens);

//===----------------------------------------------------------------------===//
// Inference stop conditions
//===----------------------------------------------------------------------===//

typedef enum pcp_finish_reason_e {
  PCP_FINISH_REASON_NONE = 0,    // still generating
  PCP_FINISH_REASON_STOP = 1,    // EOS id or stop sequence
  PCP_FINISH_REASON_LENGTH = 2,  // max_tokens reached
} pcp_finish_reason_t;

// "stop", "length"; NULL for NONE (OpenAI's finish_reason: null).
const char* pcp_finish_reason_name(pcp_finish_reason_t reason);

#define PCP_STOP_MAX_SEQUENCES 16
#define PCP_STOP_MAX_SEQUENCE_BYTES 256
#define PCP_STOP_MAX_EOS_IDS 16

typedef struct pcp_stop_state_t {
  int64_t max_tokens;  // > 0
  int64_t generated;   // tokens pushed so far
  size_t eos_count;
  int32_t eos_ids[PCP_STOP_MAX_EOS_IDS];
  size_t sequence_count;
  char sequences[PCP_STOP_MAX_SEQUENCES][PCP_STOP_MAX_SEQUENCE_BYTES + 1];
  size_t sequence_lengths[PCP_STOP_MAX_SEQUENCES];
  // Decoded text not released yet: it may be the start of a stop sequence.
  // Never longer than the longest sequence plus one pushed chunk.
  pcp_string_builder_t held;
  pcp_finish_reason_t finish_reason;
} pcp_stop_state_t;

// Copies the EOS ids and stop sequences (non-empty strings of at most
// PCP_STOP_MAX_SEQUENCE_BYTES; OpenAI allows up to 4). INVALID_ARGUMENT for
// max_tokens <= 0, an empty sequence or too many / too long ones.
PCP_MUST_USE_RESULT pcp_status_t pcp_stop_state_initialize(
    int64_t max_tokens, const int32_t* eos_ids, size_t eos_count,
    const char* const* sequences, size_t sequence_count,
    pcp_allocator_t allocator, pcp_stop_state_t* out_state);
void pcp_stop_state_deinitialize(pcp_stop_state_t* state);

// Accounts one generated token |token| whose decoded text is |text|
// (|text_length| bytes, whole characters: e.g. from the tokenizer's decode
// stream; may be empty) and appends to |out_text| what may be shown now.
// An EOS id finishes with "stop" and its text is not shown (the held text
// is released). A stop sequence finishes with "stop": the text before it is
// released, the sequence and anything after it are not. Otherwise, after
// max_tokens tokens, "length" and all held text is released. Returns the
// finish reason (NONE while generating). Pushing after a finish is
// FAILED_PRECONDITION.
PCP_MUST_USE_RESULT pcp_status_t
pcp_stop_state_push(pcp_stop_state_t* state, int32_t token, const char* text,
                    size_t text_length, pcp_string_builder_t* out_text,
                    pcp_finish_reason_t* out_reason);

// The generation ended for another reason (cancel, context full): releases
// the held text to |out_text|.
PCP_MUST_USE_RESULT pcp_status_t
pcp_stop_state_flush(pcp_stop_state_t* state, pcp_string_builder_t* out_text);

#ifdef __cplusplus
}
#endif

//===--- Inference service (src/workloads/infer/) ---===//
// Model directories, per-worker continuous batching, routing, readiness.
#include "workloads/infer/infer.h"  // IWYU pragma: export
//===--- Generation driver (src/workloads/infer/generate.c) ---===//
// A generation module on a local backend, weights and KV caches resident.
#include "workloads/infer/generate.h"  // IWYU pragma: export

//===--- Compile queue (src/workloads/runtime/compile_queue.c) ---===//
// Bounded slots of child `pcp compile`s, one artifact key, kill on cancel.
#include "workloads/runtime/compile_queue.h"  // IWYU pragma: export
//===--- RL rollouts (src/workloads/rl/rollout.c, issue 16) ---===//
// Groups of sampled completions tagged with their policy version, their
// rewards, and the @grpo batch they pack into (after the service above).
#include "workloads/rl/rollout.h"  // IWYU pragma: export
//===--- RL job kind (src/workloads/rl/job.c, issue 16) ---===//
// The GRPO job on the runner: kind "rl", POST /v1/rl/jobs's spec check.
#include "workloads/rl/job.h"  // IWYU pragma: export

#endif  // PCP_WORKLOADS_WORKLOADS_H_
