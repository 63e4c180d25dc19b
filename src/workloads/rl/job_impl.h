// SPDX-License-Identifier: Apache-2.0
//
// Private to src/workloads/rl: the parts of the RL job (job.c) that need no
// worker, kept apart so job_test.c tests them alone (job_state.c): the
// job's state and its state.json, the progress JSON, the stale-rollout
// accounting, checkpoints on disk, the served policy directory.
//
// Threading: thread-compatible (one job's run owns its state).

#ifndef PCP_WORKLOADS_RL_JOB_IMPL_H_
#define PCP_WORKLOADS_RL_JOB_IMPL_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/base.h"
#include "models/models.h"
#include "workloads/workloads.h"
// After workloads.h (rollout.h needs its sampling types).
#include "workloads/rl/rollout.h"

// Checkpoint directories kept per job (the newest ones; older are removed
// once a newer one is complete).
#define PCP_WORKLOADS_RL_CHECKPOINTS_KEPT 2
// Weight files kept in the served directory (the newest versions): the
// inference service may still be loading the one before the newest.
#define PCP_WORKLOADS_RL_SERVED_WEIGHTS_KEPT 3
// state.json's largest size (1000 history points are ~150 KB).
#define PCP_WORKLOADS_RL_STATE_MAX_BYTES ((size_t)4 << 20)

// One point of the reward curve. NaN: not measured (JSON null).
typedef struct pcp_workloads_rl_point_t {
  int64_t iteration;  // 1-based: the iteration that ended (0: before any)
  double reward_mean;
  double reward_std;
  double kl;
  double clip_fraction;
  double eval_reward_mean;  // NaN when this iteration did not evaluate
} pcp_workloads_rl_point_t;

// The last iteration's numbers (NaN: none yet).
typedef struct pcp_workloads_rl_last_t {
  double reward_mean;
  double reward_std;
  double kl;
  double clip_fraction;  // low + high
  double mean_ratio;
  double loss;
  double grad_norm;
  double tokens_per_second;       // rollout completion tokens / rollout seconds
  double weight_refresh_seconds;  // export -> served on the first worker
  int64_t weight_refresh_bytes;   // the exported weights file
} pcp_workloads_rl_last_t;

// What a checkpoint's state.json holds and the progress JSON shows.
typedef struct pcp_workloads_rl_state_t {
  int64_t iteration;  // iterations done
  int64_t step;       // AdamW steps done
  int64_t version;    // the policy version the parameters are
  int64_t seed;
  // Cumulative.
  int64_t rollout_tokens;
  int64_t stale_dropped;  // rollouts
  int64_t degenerate_groups;
  int64_t truncated_tokens;
  int64_t skipped_updates;  // iterations whose every group was stale
  // The trainer's data-parallel width (0: not chosen yet): a resumed run
  // waits a while for as many workers, so its batches split as before.
  int64_t workers;
  double eval_reward_mean;       // the last evaluation's; NaN: none
  int64_t checkpoint_iteration;  // of the newest checkpoint; -1: none
  pcp_workloads_rl_last_t last;
  // The newest PCP_WORKLOADS_RL_HISTORY_MAX_POINTS points, oldest first.
  pcp_workloads_rl_point_t history[PCP_WORKLOADS_RL_HISTORY_MAX_POINTS];
  size_t history_count;
} pcp_workloads_rl_state_t;

// A fresh job's state: everything 0, NaN where nothing was measured,
// checkpoint_iteration -1.
void pcp_workloads_rl_state_initialize(int64_t seed,
                                       pcp_workloads_rl_state_t* out_state);

// Appends |point|, dropping the oldest when full. A point of the same
// iteration as the newest replaces it (an evaluation folded in).
void pcp_workloads_rl_state_history_append(
    pcp_workloads_rl_state_t* state, const pcp_workloads_rl_point_t* point);

// state.json (new reference; NULL on OOM) and back: INVALID_ARGUMENT
// naming the key for a document this function did not write.
json_t* pcp_workloads_rl_state_json(const pcp_workloads_rl_state_t* state);
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_state_from_json(
    const json_t* json, pcp_workloads_rl_state_t* out_state);

// The progress object ("rl" of the job JSON; docs/rl.md "The job"). New
// reference; NULL on OOM.
json_t* pcp_workloads_rl_progress_json(const pcp_workloads_rl_state_t* state,
                                       int64_t num_iterations,
                                       const char* served_model);

// The default served name of job |job_id|: "rl-" + the first 8 characters
// of the id after its "rl-" prefix (the id itself when it has none).
void pcp_workloads_rl_served_name_default(const char* job_id, char* out_name,
                                          size_t capacity);

//===----------------------------------------------------------------------===//
// Stale rollouts
//===----------------------------------------------------------------------===//

// Marks the groups of |rollouts| (|count| = groups x |group_size|) that may
// train the policy at |version|: a group is dropped when one of its
// rollouts came from a version older than version - max_off_policy_steps
// (or newer than |version|: a version exported before a restart rolled the
// job back), since its advantages compare samples of one policy.
// |out_keep| gets one flag per group; returns the rollouts dropped.
int64_t pcp_workloads_rl_stale_groups_mark(
    const pcp_workloads_rl_rollout_t* rollouts, size_t count,
    int64_t group_size, int64_t version, int64_t max_off_policy_steps,
    bool* out_keep);

// The rows of a packed batch: |sequences| rounded up to a multiple of
// micro_batch x accumulation x workers (each >= 1), at least one such
// multiple.
int64_t pcp_workloads_rl_batch_rows(int64_t sequences, int64_t micro_batch,
                                    int64_t accumulation, int64_t workers);

// The spec's block size must hold the longest prompt plus the generation
// budget: FAILED_PRECONDITION naming both and the prompt's index otherwise.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_length_check(
    const char* what, int64_t longest_prompt_tokens, size_t longest_index,
    int64_t rollout_max_tokens, int64_t block_size);

//===----------------------------------------------------------------------===//
// Checkpoints: <root>/checkpoint-<iteration>/{params,m,v}.safetensors and
// state.json, written under checkpoint-<iteration>.tmp/ and renamed, so a
// directory without the suffix is complete.
//===----------------------------------------------------------------------===//

// Writes the checkpoint of |state|->iteration (|table| f32; |params|, |m|,
// |v| in table order), then removes all but the newest
// PCP_WORKLOADS_RL_CHECKPOINTS_KEPT.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_checkpoint_write(
    const char* root, const pcp_models_parameter_table_t* table,
    const float* const* params, const float* const* m, const float* const* v,
    const pcp_workloads_rl_state_t* state);

// The iteration of the newest complete checkpoint under |root|; false when
// none (a missing |root| included). Leftover .tmp directories are ignored.
bool pcp_workloads_rl_checkpoint_newest(const char* root,
                                        int64_t* out_iteration);

// Reads checkpoint |iteration| into the buffers and |out_state|.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_checkpoint_read(
    const char* root, int64_t iteration,
    const pcp_models_parameter_table_t* table, float* const* params,
    float* const* m, float* const* v, pcp_workloads_rl_state_t* out_state);

// Reads only state.json of checkpoint |iteration|.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_rl_checkpoint_state_read(
    const char* root, int64_t iteration, pcp_workloads_rl_state_t* out_state);

//===----------------------------------------------------------------------===//
// The served policy directory
//===----------------------------------------------------------------------===//

// What a policy version's model.json says besides the base model's keys.
typedef struct pcp_workloads_rl_export_t {
  const char* dir;   // <state_dir>/models/<name>
  const char* name;  // the served name
  const char* job_id;
  int64_t version;  // outer_step
  // The base model's model.json (borrowed): its architecture, sizes,
  // tokenizer, stop rules are kept; name, job_id, outer_step, weights,
  // weights_bytes, weights_sha256, dtype ("f32") and max_length (the block
  // size) are this export's; training-only keys (loss, val_loss) dropped.
  const json_t* base_model_json;
  int64_t max_length;
  const char* worker_class;  // NULL or "": none
} pcp_workloads_rl_export_t;

// Writes model-<version>.safetensors (|table| f32, |params| in table order)
// then model.json atomically (so a reader never sees a model.json before
// its weights) and removes weight files older than the newest
// PCP_WORKLOADS_RL_SERVED_WEIGHTS_KEPT. |out_bytes|: the weights file's
// size (optional).
PCP_MUST_USE_RESULT pcp_status_t
pcp_workloads_rl_policy_export(const pcp_workloads_rl_export_t* export_options,
                               const pcp_models_parameter_table_t* table,
                               const float* const* params, int64_t* out_bytes);

#endif  // PCP_WORKLOADS_RL_JOB_IMPL_H_
