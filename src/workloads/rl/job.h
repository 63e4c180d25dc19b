// SPDX-License-Identifier: Apache-2.0
//
// The RL workload kind (issue 16, Deliver 5 and 6): a GRPO job on the shared
// runner (runtime.h). Part of the workloads module's public surface: include
// "workloads/workloads.h", which includes this file under its RL banner.
//
// One job (kind "rl", spec {"experiment": <the posted experiment>}) runs
// the GRPO loop on the gateway's thread of the runner's pool:
//   placing    the experiment is parsed again under today's roots, the
//              prompts and the base (and reference) weights are loaded into
//              f32 host buffers, the newest complete checkpoint is read;
//   compiling  the trainer's programs compile for the trainer workers, the
//              policy's current version is exported as a served model
//              directory <state_dir>/models/<served_model_name>/ and the
//              inference service loads it on the rollout workers;
//   running    per iteration: prompts (a pure function of seed and
//              iteration), rollouts on the served policy (rollout.h), stale
//              groups dropped, rewards, group-normalised advantages, packing,
//              reference log-probabilities and one AdamW step on the workers
//              (trainer.h), the next version exported; evaluation on the
//              held-out prompts every eval_every iterations and at the end;
//              a checkpoint (<state_dir>/rl/<job id>/checkpoint-<i>/: params,
//              m and v as safetensors, state.json) every checkpoint_every
//              iterations and at the end.
// A restarted gateway re-queues the job (the runner's recovery) and the run
// resumes from the newest complete checkpoint: the same prompts, the same
// rollout seeds, the same AdamW state. The final policy stays served under
// its name. docs/rl.md "The job" has the progress JSON and the layout.
//
// Threading: the kind's functions are thread-safe for distinct jobs; the
// spec builder is thread-safe. Ownership: the kind borrows everything in its
// options.

#ifndef PCP_WORKLOADS_RL_JOB_H_
#define PCP_WORKLOADS_RL_JOB_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/base.h"
#include "fabric/fabric.h"
#include "obs/obs.h"
#include "store/store.h"
#include "workloads/infer/infer.h"
#include "workloads/rl/experiment.h"
#include "workloads/rl/reward.h"
#include "workloads/runtime/compile_queue.h"
#include "workloads/runtime/runtime.h"
#include "workloads/train/policy.h"

#ifdef __cplusplus
extern "C" {
#endif

// The store's job kind.
#define PCP_WORKLOADS_RL_KIND_NAME "rl"
// RL jobs running at once: each holds its policy, AdamW moments and the
// reference on the gateway (4 copies of the parameters) and the rollout
// workers' inference slots.
#define PCP_WORKLOADS_RL_MAX_RUNNING 2
// Points of the progress "history" (the newest kept).
#define PCP_WORKLOADS_RL_HISTORY_MAX_POINTS 1000
// Evaluation prompts scored per evaluation (the first ones of the file).
#define PCP_WORKLOADS_RL_MAX_EVAL_PROMPTS 256

// Builds the external verifier of a reward config {"type": "verifier", ...}
// (the services module's pcp_services_verifier_create, which this module
// may not call).
typedef pcp_status_t (*pcp_workloads_rl_verifier_create_fn_t)(
    void* user_data, const json_t* config, pcp_allocator_t allocator,
    pcp_workloads_rl_verifier_t* out_verifier);

typedef struct pcp_workloads_rl_options_t {
  pcp_fabric_endpoint_t* fabric;  // borrowed; set before the runner starts
  pcp_infer_service_t* infer;     // borrowed; serves the policy versions
  pcp_workloads_compile_queue_t* compile_queue;  // borrowed
  pcp_store_t* store;                            // borrowed
  const char* state_dir;                         // borrowed
  // The roots experiments may reach (the training policy's; borrowed).
  const pcp_workloads_train_policy_t* policy;
  // The gateway's registry (borrowed; NULL: no metrics). The pcp_rl_*
  // families are registered at the first RL job's start, so a gateway that
  // never ran one exposes none.
  pcp_obs_registry_t* metrics;
  pcp_allocator_t allocator;  // each job's buffers; unset: system
  pcp_clock_t clock;
  pcp_log_context_t log;
  // Required for experiments whose reward is an external verifier.
  pcp_workloads_rl_verifier_create_fn_t verifier_create;
  void* user_data;
  // How long a version may take to be served on a worker (0: 600000).
  int64_t serve_timeout_ms;
} pcp_workloads_rl_options_t;

// The kind's state (its |self|); embed it, fill |options| before the runner
// starts.
typedef struct pcp_workloads_rl_t {
  pcp_workloads_rl_options_t options;
} pcp_workloads_rl_t;

// The kind "rl" over |rl| (borrowed for the runner's lifetime).
pcp_workloads_kind_t pcp_workloads_rl_kind(pcp_workloads_rl_t* rl);

// POST /v1/rl/jobs's check of experiment JSON |text|: parsed under the
// policy's roots (INVALID_ARGUMENT naming the key, PERMISSION_DENIED for a
// path outside the roots), a train_job model's job found in the store
// (NOT_FOUND) and succeeded (FAILED_PRECONDITION), a verifier reward only
// when a verifier can be built. |*out_spec| (a new reference) is the job's
// spec {"experiment": <the object>}.
PCP_MUST_USE_RESULT pcp_status_t
pcp_workloads_rl_spec_build(pcp_workloads_rl_t* rl, const char* text,
                            size_t byte_length, json_t** out_spec);

// The "rl" object a job shows before its run published anything: from the
// newest complete checkpoint under |state_dir| (its history and counters)
// when there is one, else iteration 0 of the experiment in |spec|. NULL on
// a spec without an experiment object. New reference.
json_t* pcp_workloads_rl_progress_initial(const char* state_dir,
                                          const char* job_id,
                                          const json_t* spec);

// Folds |progress| (what the run published last) into an RL job's API JSON
// as "rl". The kind's progress function.
void pcp_workloads_rl_progress_merge(const json_t* progress, json_t* job_json);

#ifdef __cplusplus
}
#endif

#endif  // PCP_WORKLOADS_RL_JOB_H_
