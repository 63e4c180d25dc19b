// SPDX-License-Identifier: Apache-2.0
//
// The training workload kind: a DiLoCo job on the shared runner
// (runtime.h). Part of the workloads module's public surface: include
// "workloads/workloads.h", which includes this file under its runtime
// banner.
//
// run: queued -> placing (the owner's experiment check runs again before
// anything is opened) -> compiling -> running (the service's phase hook) ->
// pcp_diloco_job_run; the runner records the end. Cancel and stop reach the
// service's should_stop hook as the job's atomic flag (no store read per
// poll, as the gateway's hook did before issue 14). The live progress the
// service reports is published to the runner and merged into the job JSON
// over the submit-time "training" object.
//
// Threading: the kind's functions are thread-safe for distinct jobs.
// Ownership: the kind borrows everything in its options.

#ifndef PCP_WORKLOADS_TRAIN_JOB_H_
#define PCP_WORKLOADS_TRAIN_JOB_H_

#include "fabric/fabric.h"
#include "workloads/runtime/runtime.h"
#include "workloads/train/service.h"

#ifdef __cplusplus
extern "C" {
#endif

// Training jobs running at once (the gateway's limit since training began).
#define PCP_WORKLOADS_TRAIN_MAX_RUNNING 4

typedef struct pcp_workloads_train_options_t {
  pcp_fabric_endpoint_t* fabric;  // borrowed; set before the runner starts
  const char* state_dir;          // borrowed
  pcp_diloco_metrics_t* metrics;  // borrowed; may be NULL
  // The one compile queue (borrowed); NULL: a queue per compile.
  pcp_workloads_compile_queue_t* compile_queue;
  // Each job's buffers (the DiLoCo service's allocator); unset: system.
  pcp_allocator_t allocator;
  pcp_store_t* store;  // borrowed
  pcp_clock_t clock;
  pcp_log_context_t log;
  // Optional: the owner's checks of a stored experiment, again at placing
  // (paths under today's roots, the caps). |*out_checked| receives the text
  // to run (malloc'd by jansson; free()). Errors fail the job.
  pcp_status_t (*experiment_check)(void* user_data, const char* experiment,
                                   char** out_checked);
  // Optional: a checkpoint's export was written under |model_dir|.
  void (*exported)(void* user_data, const char* model_dir);
  void* user_data;
} pcp_workloads_train_options_t;

// The kind's state (its |self|); embed it, fill |options|.
typedef struct pcp_workloads_train_t {
  pcp_workloads_train_options_t options;
} pcp_workloads_train_t;

// The kind "training" over |train| (borrowed for the runner's lifetime).
pcp_workloads_kind_t pcp_workloads_train_kind(pcp_workloads_train_t* train);

// Folds |progress| into a training job's API JSON: the stored "training"
// object (spec.training) overlaid with the live fields, set at the top
// level and in "spec". The kind's progress function.
void pcp_workloads_train_progress_merge(const json_t* progress,
                                        json_t* job_json);

#ifdef __cplusplus
}
#endif

#endif  // PCP_WORKLOADS_TRAIN_JOB_H_
