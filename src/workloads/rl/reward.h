// SPDX-License-Identifier: Apache-2.0
//
// RL rewards (issue 16, Deliver 3): the verifiable rewards GRPO scores its
// rollouts with, built from a JSON config, and the interface of a batch
// verifier that the RL workload calls for every group of completions.
//
// A reward maps one sample (prompt, completion, answer, metadata) to a
// double. The built-in types (docs/rl.md "Rewards" lists every key):
//   exact_match   1 when the normalised completion equals the answer;
//   numeric       1 when the last number of the completion is within the
//                 tolerance of the answer;
//   regex         1 when a POSIX extended regex matches the completion;
//   contains      1 when the completion contains |text|;
//   not_contains  1 when it does not;
//   length        1 when the completion's length (tokens and/or code
//                 points) lies in a window;
//   sum           the weighted sum of other rewards (bounded depth/terms).
// Leaves are 0/1 so that a sum's weights read as points. Upstream's reward is
// a length heuristic that ignores correctness (reference/upstream-workloads.md
// s.5); these measure the task instead.
//
// A config is validated as a whole at create: unknown keys, wrong types and
// values out of range are INVALID_ARGUMENT naming the key path
// ("reward.terms[1].reward.pattern: ..."). Unknown keys are refused, unlike
// the service configs, because a misspelt reward key silently changes what
// the policy learns.
//
// Scoring never returns a silent zero for a sample it cannot judge: a sample
// without the answer a type needs, an answer that is not a finite number, or
// a length in tokens that the caller did not give is an error naming the key
// path; a completion that simply fails the check scores 0.
//
// The external verifier (src/services, pcp_services_verifier_create) and the
// built-in rewards (pcp_workloads_rl_reward_verifier) both present the
// pcp_workloads_rl_verifier_t interface below, so the RL workload scores a
// batch the same way whichever the experiment names.
//
// Threading: create/release are thread-compatible; scoring a created reward
// is thread-safe (the reward is immutable after create, regexec on a compiled
// regex_t is MT-safe, scratch memory is per call).
// Ownership: create returns an owned reward; samples are borrowed for the
// call only.

#ifndef PCP_WORKLOADS_RL_REWARD_H_
#define PCP_WORKLOADS_RL_REWARD_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Limits
//===----------------------------------------------------------------------===//

// Nesting of "sum" rewards (a sum inside a sum inside ... ): at most 4 levels.
#define PCP_WORKLOADS_RL_REWARD_MAX_DEPTH 4
// Terms of one "sum".
#define PCP_WORKLOADS_RL_REWARD_MAX_TERMS 16
// Rewards (leaves and sums) in one config, so that depth x terms cannot make
// a config of 16^4 regexes.
#define PCP_WORKLOADS_RL_REWARD_MAX_NODES 64
// Bytes of a regex pattern.
#define PCP_WORKLOADS_RL_REWARD_MAX_PATTERN_BYTES 1024
// Default and largest max_input_bytes of a regex reward: glibc's matcher is
// not linear (an unanchored "([a-z]+ )+[0-9]$" takes 0.1 s on 4 KiB, 1.4 s
// on 16 KiB and 29 s on 64 KiB of letters), so a regex sees a bounded text.
#define PCP_WORKLOADS_RL_REWARD_DEFAULT_REGEX_INPUT_BYTES (16u << 10)
#define PCP_WORKLOADS_RL_REWARD_MAX_REGEX_INPUT_BYTES (1u << 20)
// Bytes of a contains / not_contains text.
#define PCP_WORKLOADS_RL_REWARD_MAX_TEXT_BYTES 4096
// Bytes of each of prompt, completion and answer given to score.
#define PCP_WORKLOADS_RL_REWARD_MAX_INPUT_BYTES (1u << 20)
// Bytes of a reward config given as a string.
#define PCP_WORKLOADS_RL_REWARD_MAX_CONFIG_BYTES (64u << 10)
// A number in a completion longer than this never matches (numeric).
#define PCP_WORKLOADS_RL_REWARD_MAX_NUMBER_BYTES 511

//===----------------------------------------------------------------------===//
// Samples
//===----------------------------------------------------------------------===//

// One rollout to score. Every field is borrowed for the call.
typedef struct pcp_workloads_rl_sample_t {
  pcp_string_view_t prompt;
  pcp_string_view_t completion;
  // |answer.data| NULL: the prompt has no answer (types that need one fail).
  pcp_string_view_t answer;
  // Tokens of the completion as generated; negative: unknown (a length
  // reward with token bounds then fails).
  int64_t completion_token_count;
  // The prompt's metadata object; NULL: none. The built-in types ignore it;
  // the external verifier forwards it.
  const json_t* metadata;
} pcp_workloads_rl_sample_t;

//===----------------------------------------------------------------------===//
// Built-in rewards
//===----------------------------------------------------------------------===//

typedef struct pcp_workloads_rl_reward_t pcp_workloads_rl_reward_t;

// Builds a reward from |config| (borrowed; nothing retained). |key_path|
// prefixes every error ("reward" when NULL). INVALID_ARGUMENT naming the
// key for a bad config (including {"type":"verifier"}, which
// pcp_services_verifier_create builds instead); RESOURCE_EXHAUSTED when out
// of memory.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_reward_create(
    const json_t* config, const char* key_path, pcp_allocator_t allocator,
    pcp_workloads_rl_reward_t** out_reward);

// Same from JSON text of at most PCP_WORKLOADS_RL_REWARD_MAX_CONFIG_BYTES
// (INVALID_ARGUMENT with line and column when it does not parse).
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_reward_create_from_string(
    pcp_string_view_t config_json, const char* key_path,
    pcp_allocator_t allocator, pcp_workloads_rl_reward_t** out_reward);

// NULL is a no-op.
void pcp_workloads_rl_reward_release(pcp_workloads_rl_reward_t* reward);

// Scores |sample| into |*out_reward| (set to 0 first; always finite when OK).
// INVALID_ARGUMENT when a text exceeds PCP_WORKLOADS_RL_REWARD_MAX_INPUT_BYTES
// or the answer is not a finite number (numeric); FAILED_PRECONDITION when
// the sample lacks what a type needs (an answer; a token count);
// RESOURCE_EXHAUSTED when out of memory. Errors name the reward's key path.
// Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_reward_score(
    const pcp_workloads_rl_reward_t* reward,
    const pcp_workloads_rl_sample_t* sample, double* out_reward);

//===----------------------------------------------------------------------===//
// Batch verifier interface
//===----------------------------------------------------------------------===//

// A caller's cancel check for scoring: |should_stop| (NULL: never) is
// polled with |user_data|; once it returns true a stoppable verifier gives
// up within about 200 ms with CANCELLED ("scoring cancelled"). Thread-safe
// as the caller makes it (a job's stop flag is atomic).
typedef struct pcp_workloads_rl_stop_t {
  bool (*should_stop)(void* user_data);
  void* user_data;
} pcp_workloads_rl_stop_t;

// What the RL workload scores a batch with. |score_batch| writes one finite
// reward per item into |out_rewards| (|count| doubles) or returns an error
// that fails the job (never zeros in place of rewards it did not get).
// |score_batch| is thread-safe; |release| (may be NULL) frees |self|.
typedef struct pcp_workloads_rl_verifier_t {
  void* self;
  pcp_status_t (*score_batch)(void* self,
                              const pcp_workloads_rl_sample_t* items,
                              size_t count, double* out_rewards);
  void (*release)(void* self);
  // Same as |score_batch| but abandons the batch when |stop| (may be NULL)
  // turns true. NULL: the verifier is fast and never blocks (the built-in
  // rewards), and score_batch serves. The external verifier sets it, so a
  // job's cancel does not wait out its timeouts and retries.
  pcp_status_t (*score_batch_stoppable)(void* self,
                                        const pcp_workloads_rl_sample_t* items,
                                        size_t count,
                                        const pcp_workloads_rl_stop_t* stop,
                                        double* out_rewards);
} pcp_workloads_rl_verifier_t;

// Calls |verifier|'s score_batch and checks its contract (every reward
// finite); INTERNAL when an implementation broke it. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_verifier_score_batch(
    const pcp_workloads_rl_verifier_t* verifier,
    const pcp_workloads_rl_sample_t* items, size_t count, double* out_rewards);

// Same, passing |stop| (may be NULL) to a verifier with
// score_batch_stoppable; CANCELLED when it stopped. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_verifier_score_batch_until(
    const pcp_workloads_rl_verifier_t* verifier,
    const pcp_workloads_rl_sample_t* items, size_t count,
    const pcp_workloads_rl_stop_t* stop, double* out_rewards);

// Releases |verifier|'s self (when it has a release) and clears it.
void pcp_workloads_rl_verifier_release(pcp_workloads_rl_verifier_t* verifier);

// A verifier over a built-in |reward| (borrowed: it must outlive the
// verifier; release does not free it).
pcp_workloads_rl_verifier_t pcp_workloads_rl_reward_verifier(
    const pcp_workloads_rl_reward_t* reward);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // PCP_WORKLOADS_RL_REWARD_H_
