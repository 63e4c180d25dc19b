// SPDX-License-Identifier: Apache-2.0
//
// The RL experiment (issue 16, Deliver 1): the JSON a GRPO job is submitted
// with, parsed and validated as a whole (experiment.c), and the prompts JSONL
// it names (prompts.c). docs/rl.md "Experiment" and "Prompts" list every key,
// its range and its default.
//
// Every error is INVALID_ARGUMENT naming the key path ("clip_eps.high: must
// be in (0, 10]"), the text a 400 carries; a path outside the policy's roots
// is PERMISSION_DENIED naming the key and the roots (the training policy's
// rule, reused). Unknown keys are refused: a misspelt key of an RL job
// silently changes what the policy learns.
//
// Threading: parse/load are thread-compatible; a parsed experiment and a
// loaded prompt set are immutable afterwards (safe to share for reading).
// Ownership: parse/load fill caller-owned structs; free them with
// _deinitialize (safe on a zeroed or already-deinitialized struct).

#ifndef PCP_WORKLOADS_RL_EXPERIMENT_H_
#define PCP_WORKLOADS_RL_EXPERIMENT_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/base.h"
#include "workloads/rl/reward.h"
#include "workloads/train/diloco.h"
#include "workloads/train/policy.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Experiment
//===----------------------------------------------------------------------===//

// Bytes of an experiment's JSON text (STYLE 3.8: configs at most 1 MiB).
#define PCP_WORKLOADS_RL_EXPERIMENT_MAX_BYTES ((size_t)1 << 20)
// Rollouts of one iteration (num_prompts x group_size).
#define PCP_WORKLOADS_RL_MAX_ROLLOUTS_PER_ITERATION ((int64_t)1 << 20)
// Bytes of a training job id (base_model.train_job).
#define PCP_WORKLOADS_RL_MAX_JOB_ID_BYTES 128
// Bytes of served_model_name.
#define PCP_WORKLOADS_RL_MAX_SERVED_NAME_BYTES 64

// Where a model's weights come from (exactly one per model object).
typedef enum pcp_workloads_rl_model_source_e {
  PCP_WORKLOADS_RL_MODEL_NONE = 0,  // absent (reference_model only)
  // A built-in spec whose weights are a finished training job's.
  PCP_WORKLOADS_RL_MODEL_TRAIN_JOB = 1,
  // A served model directory (what a training job exports; infer serves it).
  PCP_WORKLOADS_RL_MODEL_SERVED_DIR = 2,
  // A Hugging Face-named safetensors file (model.safetensors or
  // model-00001-of-00004.safetensors).
  PCP_WORKLOADS_RL_MODEL_SAFETENSORS = 3,
} pcp_workloads_rl_model_source_t;

typedef struct pcp_workloads_rl_model_t {
  pcp_workloads_rl_model_source_t source;
  // TRAIN_JOB: the spec (training's model table: kind, layers, ...) and the
  // job id (1..128 bytes of [A-Za-z0-9._-]; its existence is the service's
  // check, which owns the store).
  pcp_diloco_model_spec_t spec;
  char* train_job;
  // SERVED_DIR, SAFETENSORS: the resolved path under the model roots.
  char* path;
} pcp_workloads_rl_model_t;

typedef struct pcp_workloads_rl_experiment_t {
  pcp_allocator_t allocator;  // owns every string below
  // GRPO (upstream grpo_config's names where they exist).
  int64_t num_iterations;
  int64_t group_size;
  int64_t num_prompts;  // prompts per iteration
  int64_t rollout_max_tokens;
  double learning_rate;
  double beta;  // KL weight
  double clip_low;
  double clip_high;
  double temperature;
  double top_p;
  int64_t max_off_policy_steps;
  // Data (resolved paths under the data roots).
  char* prompts_path;
  char* eval_prompts_path;  // NULL: no evaluation
  int64_t eval_every;
  // The reward: |reward_config| is a copy of the "reward" object; |reward| is
  // built from it unless its type is "verifier" (then NULL: the service
  // builds the external verifier with pcp_services_verifier_create).
  json_t* reward_config;
  pcp_workloads_rl_reward_t* reward;
  // Models. reference_model NONE: the base model's initial weights.
  pcp_workloads_rl_model_t base_model;
  pcp_workloads_rl_model_t reference_model;
  int64_t checkpoint_every;
  // AdamW and the schedule (training's schedule names and rules).
  double weight_decay;
  double beta1;
  double beta2;
  double eps;
  double grad_clip;      // global norm; 0: off
  int32_t lr_schedule;   // pcp_diloco_lr_schedule_kind_t
  int64_t warmup_steps;  // iterations of linear warmup
  double min_lr;
  int64_t seed;
  // Worker classes (a worker's --worker-class; NULL: every worker): where
  // the served policy decodes rollouts (its model.json's "worker_class")
  // and where the trainer's tasks run (trainer.h's worker_class).
  char* rollout_worker_class;
  char* trainer_worker_class;
  // The policy's served model name (1..64 of [A-Za-z0-9._-]); NULL: the
  // job's default, "rl-" + the first 8 characters of its id.
  char* served_model_name;
} pcp_workloads_rl_experiment_t;

// Parses and validates experiment JSON |text| (at most
// PCP_WORKLOADS_RL_EXPERIMENT_MAX_BYTES) into |out_experiment|: defaults
// filled, paths confined under |policy|'s roots (prompt files must be
// readable regular files, a served model a directory, a safetensors path a
// regular file with an HF name), the reward built. INVALID_ARGUMENT naming
// the key path; PERMISSION_DENIED for a path outside the roots;
// RESOURCE_EXHAUSTED when out of memory. On failure |out_experiment| is left
// deinitialized.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_experiment_parse(
    const pcp_workloads_train_policy_t* policy, const char* text,
    size_t byte_length, pcp_allocator_t allocator,
    pcp_workloads_rl_experiment_t* out_experiment);
void pcp_workloads_rl_experiment_deinitialize(
    pcp_workloads_rl_experiment_t* experiment);

//===----------------------------------------------------------------------===//
// Prompts
//===----------------------------------------------------------------------===//

// Limits of a prompts JSONL file.
#define PCP_WORKLOADS_RL_PROMPTS_MAX_FILE_BYTES ((size_t)256 << 20)
#define PCP_WORKLOADS_RL_PROMPTS_MAX_LINE_BYTES ((size_t)1 << 20)
#define PCP_WORKLOADS_RL_PROMPTS_MAX_LINES ((size_t)1 << 20)
// Nesting of a line's JSON (the line's object is level 1).
#define PCP_WORKLOADS_RL_PROMPTS_MAX_DEPTH 16

typedef struct pcp_workloads_rl_prompt_t {
  char* prompt;  // NUL-terminated UTF-8 (may hold no NUL: JSON \u0000 is
                 // refused)
  size_t prompt_length;
  // NULL: no answer. A number answer is kept as its JSON text ("42", "0.5").
  char* answer;
  size_t answer_length;
  // The metadata object (a new reference) or NULL.
  json_t* metadata;
} pcp_workloads_rl_prompt_t;

typedef struct pcp_workloads_rl_prompts_t {
  pcp_allocator_t allocator;
  pcp_workloads_rl_prompt_t* items;
  size_t count;
} pcp_workloads_rl_prompts_t;

// Parses JSONL |text|: one object per line {"prompt": string (required,
// non-empty), "answer": string or number (optional), "metadata": object
// (optional)}; other keys refused. Empty (or whitespace-only) lines are
// skipped, CRLF line ends and a leading UTF-8 BOM accepted. Errors are
// INVALID_ARGUMENT "<origin>:<line>: <key>: ..." with the 1-based line;
// RESOURCE_EXHAUSTED when out of memory. No prompt at all is an error. On
// failure |out_prompts| is left deinitialized.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_prompts_parse(
    pcp_string_view_t text, const char* origin, pcp_allocator_t allocator,
    pcp_workloads_rl_prompts_t* out_prompts);

// Reads |path| (at most PCP_WORKLOADS_RL_PROMPTS_MAX_FILE_BYTES, refused
// before reading) and parses it with |path| as the origin.
PCP_MUST_USE_RESULT pcp_status_t
pcp_workloads_rl_prompts_load(const char* path, pcp_allocator_t allocator,
                              pcp_workloads_rl_prompts_t* out_prompts);

void pcp_workloads_rl_prompts_deinitialize(pcp_workloads_rl_prompts_t* prompts);

// The prompts of iteration |iteration|: |out_indices| (|num_prompts|
// entries) receives positions [iteration*num_prompts, +num_prompts) of an
// endless stream of epochs, each epoch a permutation of 0..count-1 drawn
// from (|seed|, epoch). It depends only on its arguments, so a resumed job
// sees the prompts the first run would have; every prompt is seen once per
// epoch. INVALID_ARGUMENT for count 0 or above UINT32_MAX, num_prompts 0 or
// an overflowing position; RESOURCE_EXHAUSTED when out of memory (scratch of
// |count| x 4 bytes from |allocator|). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_prompts_select(
    size_t count, uint64_t seed, uint64_t iteration, size_t num_prompts,
    pcp_allocator_t allocator, uint32_t* out_indices);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // PCP_WORKLOADS_RL_EXPERIMENT_H_
