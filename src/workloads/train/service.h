// SPDX-License-Identifier: Apache-2.0
//
// The DiLoCo training service: the outer loop of one training job, driven
// over the worker fabric. Part of the workloads module's public surface:
// include "workloads/workloads.h", which includes this file under its
// training-service banner (like diloco.h).
//
// One call of pcp_diloco_job_run runs one job to its end on the calling
// thread (the gateway gives each running training job a thread of its own):
//   1. the built-in model of the experiment is emitted in-process, and its
//      round program (`pcp compile --program diloco --inner-steps tau`) is
//      derived and compiled in a CHILD process (never MLIR in the caller),
//      once per (backend, target) of the connected workers, cached on disk
//      by content hash, and registered with the fabric;
//   2. per outer step: one task per connected worker with a program (named
//      worker, one attempt, no session) running @diloco_round on the
//      global parameters (f32 sections pointing into ONE host buffer shared
//      by every task) and tau batches sampled on the gateway from that
//      worker's byte-range shard, seeded from (seed, outer step, shard), so
//      a round is a pure function of the checkpointed state; the deltas of
//      the tasks that succeed are averaged (a lost worker only costs its
//      delta; nobody reporting retries the round), then host Nesterov;
//   3. a "training.step" event per outer step (outer_step, loss, loss_mean,
//      tokens_per_second, wire_bytes, token_bytes, workers), metrics, and
//      checkpoints every checkpoint_every steps and at the end, each with an
//      export of the model for the inference service under
//      <state_dir>/models/<job_id>/ (model.safetensors, then model.json
//      naming the weights' size and SHA-256, then the exported hook).
// A job finds its own newest checkpoint in the store (a gateway restarted
// after SIGKILL resumes the job there), or with "resume": true the newest
// checkpoint under its checkpoint_dir.
// With a "streaming" object the job runs streaming DiLoCo instead: state
// resident on the workers in fabric sessions, one local step per task, and
// per-fragment @init/@delta/@mix programs (docs/training.md); checkpoint and
// export at the end only, no resume.
//
// Thread-safety: pcp_diloco_job_run is thread-safe for distinct jobs (the
// store, the fabric and the metrics are thread-safe); the hooks run on the
// calling thread.

#ifndef PCP_WORKLOADS_TRAIN_SERVICE_H_
#define PCP_WORKLOADS_TRAIN_SERVICE_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/base.h"
#include "fabric/fabric.h"
#include "models/models.h"
#include "obs/obs.h"
#include "store/store.h"
#include "workloads/runtime/compile_queue.h"
#include "workloads/train/diloco.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Metrics
//===----------------------------------------------------------------------===//

// The service's metric families (docs/api.md), registered once per process.
typedef struct pcp_diloco_metrics_t {
  pcp_obs_family_t* outer_step_seconds;  // histogram
  pcp_obs_family_t* loss;                // gauge {job}
  pcp_obs_family_t* tokens_per_second;   // gauge {job}
  pcp_obs_family_t* wire_bytes;          // counter {kind=parameters|deltas}
  pcp_obs_family_t* token_bytes;         // counter
  pcp_obs_family_t* outer_steps;         // counter
  pcp_obs_family_t* lost_tasks;          // counter
  pcp_obs_family_t* val_loss;            // gauge {job}
  pcp_obs_family_t* learning_rate;       // gauge {job}
  // counter {job}
  pcp_obs_family_t* param_hash_mismatches;
} pcp_diloco_metrics_t;

// Registers the families in |registry|. Errors as pcp_obs_registry_register
// (ALREADY_EXISTS when registered twice). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_metrics_register(
    pcp_obs_registry_t* registry, pcp_diloco_metrics_t* out_metrics);

// Removes |job_id|'s {job} series (loss, tokens/s, val loss, learning
// rate, parameter hash mismatches); pcp_diloco_job_run calls it when the job
// ends. NULL |metrics|: a no-op. Thread-safe.
void pcp_diloco_metrics_job_remove(const pcp_diloco_metrics_t* metrics,
                                   const char* job_id);

//===----------------------------------------------------------------------===//
// Models
//===----------------------------------------------------------------------===//

// The built-in model of |config| as a models spec (kv_heads only for Qwen3,
// the experiment's dtype). INVALID_ARGUMENT "key 'model': ..." when the
// models module rejects it; FAILED_PRECONDITION for a model_path experiment
// (not a built-in). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_model_spec_resolve(
    const pcp_diloco_config_t* config, pcp_models_spec_t* out_spec);

// A forward-loss module named by the experiment key model_path:
// `@main(params..., input_ids: BxT, targets: BxT) -> scalar loss`
// (src/workloads/train/model_path.c).
typedef struct pcp_diloco_module_t {
  char* text;  // the module as read (NUL-terminated)
  size_t length;
  // One entry per parameter argument, named "param_<i>", the module's shapes
  // and element types, init N(0, 0.02^2) for every tensor (upstream's rule
  // for a foreign module: arguments carry no role).
  pcp_models_parameter_table_t table;
  int64_t batch;                 // B of the data arguments: the micro batch
  int64_t block_size;            // T
  pcp_element_type_t data_type;  // I32 or I64 token ids
} pcp_diloco_module_t;

// Reads and checks config->model_path (at most 64 MiB of text): every
// parameter must be a static ranked tensor of the experiment's dtype (f32 or
// bf16), the last two arguments i32 or i64 tensors of one BxT shape, the one
// result a scalar f32 or bf16 loss. INVALID_ARGUMENT naming the key
// ('model_path' or 'dtype') otherwise, also when the file cannot be read.
// Release with pcp_diloco_module_deinitialize (also
// safe after a failure). Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_module_load(
    const pcp_diloco_config_t* config, pcp_diloco_module_t* out_module);
void pcp_diloco_module_deinitialize(pcp_diloco_module_t* module);

// The rules an experiment must meet beyond its config table's, once the
// model's micro batch is known (the gateway checks them at submit for a
// 400, the service again at set-up): tau at most 4096; dtype f32 or bf16;
// effective_batch_size a multiple of |micro_batch|, at most 4096 micro
// batches; a worker's round of token ids (2 x tau x effective batch x
// |block_size| of |id_type|) at most 256 MiB; warmup_steps at most the
// run's inner steps. INVALID_ARGUMENT naming the key. Thread-safe.
// Inner steps one worker runs over the whole job, the horizon of the lr
// schedule: outer_loop_steps x tau (classic), or streaming's local steps
// (max_epochs x H + phase(P-1) + overlap_tau). Thread-safe.
uint64_t pcp_diloco_inner_step_total(const pcp_diloco_config_t* config);

PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_experiment_check(
    const pcp_diloco_config_t* config, int64_t micro_batch, int64_t block_size,
    pcp_element_type_t id_type);

//===----------------------------------------------------------------------===//
// Streaming programs
//===----------------------------------------------------------------------===//

// Appends the StableHLO module of streaming DiLoCo's per-fragment programs
// for fragment |fragment| of |fragment_count| (the tensors i of |table| with
// i % fragment_count == fragment):
//   @delta(s..., c...) -> (s - c in the delta dtype..., c...)
//   @mix(alpha: tensor<f32>, g..., l...) -> (b..., b...),
//       b = alpha*l + (1-alpha)*g
//   @init(p...) -> (p..., 0..., 0..., p...)   local params, f32 moments, s
//   @copy(x...) -> (x...)   (and @copy_moments in f32 for bf16 parameters)
// Parameters p, s in bf16 when |bf16_parameters| (else f32), deltas in bf16
// when |bf16_deltas|; the arithmetic is f32. The service compiles one per
// fragment; `streaming_fragment_tool` emits them for the backend matrix
// (docs/backends.md). INVALID_ARGUMENT for a fragment that does not exist;
// RESOURCE_EXHAUSTED at the builder's cap. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_diloco_fragment_module_emit(
    const pcp_models_parameter_table_t* table, uint32_t fragment,
    uint32_t fragment_count, bool bf16_parameters, bool bf16_deltas,
    pcp_string_builder_t* builder);

//===----------------------------------------------------------------------===//
// Running a job
//===----------------------------------------------------------------------===//

typedef enum pcp_diloco_job_phase_e {
  PCP_DILOCO_JOB_PHASE_COMPILING = 0,  // set-up done, programs next
  PCP_DILOCO_JOB_PHASE_RUNNING = 1,    // first round about to start
} pcp_diloco_job_phase_t;

typedef struct pcp_diloco_job_hooks_t {
  // The job entered |phase|. A non-OK status stops the run with it.
  pcp_status_t (*phase)(void* user_data, pcp_diloco_job_phase_t phase);
  // After each outer step (and once at start with the resumed state):
  // |progress| is the job's progress object (borrowed for the call).
  void (*progress)(void* user_data, const json_t* progress);
  // Polled between waits: true stops the run (CANCELLED returned).
  bool (*should_stop)(void* user_data);
  // Optional pair (both or neither): the run's waits on fabric tasks block
  // in |wait| until |ready|(|arg|) (evaluated under the waiter's lock; it
  // only reads atomics), until should_stop turns true (when |stop_wakes|;
  // whoever sets it signals the same waiter), or until |timeout_ms| passed
  // (-1: no limit); it returns |ready|(|arg|). |signal| wakes it: the run
  // calls it from the fabric's loop thread when one of its tasks ends, and
  // never after pcp_diloco_job_run returned. The runner's job condition
  // variable (pcp_workloads_job_wait_for / _signal) fits. NULL: the waits
  // poll should_stop every WAIT_SLICE_MS (100 ms) instead.
  bool (*wait)(void* user_data, bool (*ready)(void* arg), void* arg,
               bool stop_wakes, int64_t timeout_ms);
  void (*signal)(void* user_data);
  // After each export of the model for the inference service (optional):
  // |model_dir| (borrowed for the call) holds the new model.json, in place.
  // The gateway tells its inference service, which reloads the model.
  void (*exported)(void* user_data, const char* model_dir);
  void* user_data;
} pcp_diloco_job_hooks_t;

typedef struct pcp_diloco_job_options_t {
  const char* job_id;
  // The experiment JSON (the text POST /v1/training/jobs accepted).
  const char* experiment_json;
  size_t experiment_byte_length;
  pcp_fabric_endpoint_t* fabric;
  pcp_store_t* store;
  const char* state_dir;
  // The `pcp` binary that compiles programs in a child ("/proc/self/exe").
  const char* pcp_path;
  // The compile queue the job's programs go through (borrowed; thread-safe);
  // NULL: a queue of one slot per compile over <state_dir>/artifacts.
  pcp_workloads_compile_queue_t* compile_queue;
  const pcp_diloco_metrics_t* metrics;  // optional
  pcp_clock_t clock;
  pcp_log_context_t log;
  pcp_diloco_job_hooks_t hooks;
  // The job's buffers; unset ({NULL, NULL}): the system allocator.
  pcp_allocator_t allocator;
} pcp_diloco_job_options_t;

// Runs the job until it has made outer_loop_steps outer steps (OK), a hook
// asks it to stop (CANCELLED; the job's last checkpoint stays), or it fails:
// INVALID_ARGUMENT (experiment, model_path module, dataset, vocabulary
// larger than the model's), FAILED_PRECONDITION (a model too large for one
// task frame, a checkpoint of another model), INTERNAL
// / INVALID_ARGUMENT from the program compile (message with the compiler's
// log path), ABORTED when every task of several consecutive rounds failed
// (the last task error in the message). Thread-safe for distinct jobs.
PCP_MUST_USE_RESULT pcp_status_t
pcp_diloco_job_run(const pcp_diloco_job_options_t* options);

#ifdef __cplusplus
}
#endif

#endif  // PCP_WORKLOADS_TRAIN_SERVICE_H_
