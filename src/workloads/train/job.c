// SPDX-License-Identifier: Apache-2.0
// The training workload kind (job.h): the job-level half of a DiLoCo job,
// moved out of roles/gateway/training.c onto the shared runner (issue 14).
// The outer loop itself stays in service.c.

#include <stdlib.h>
#include <string.h>

#include "workloads/workloads.h"

// The hooks of pcp_diloco_job_run take one user_data: the phase, progress
// and stop hooks need the job, the export hook the owner.
typedef struct train_run_t {
  pcp_workloads_train_t* train;
  pcp_workloads_job_t* job;
} train_run_t;

static pcp_status_t run_phase(void* user_data, pcp_diloco_job_phase_t phase) {
  train_run_t* run = user_data;
  if (phase != PCP_DILOCO_JOB_PHASE_RUNNING) {
    return pcp_ok_status();
  }
  return pcp_workloads_job_transition(run->job, PCP_STORE_JOB_STATE_RUNNING,
                                      NULL);
}

static void run_progress(void* user_data, const json_t* progress) {
  pcp_workloads_job_progress_publish(((train_run_t*)user_data)->job, progress);
}

// The runner's flag: set by a cancel (the transition to cancelling) or a
// stop, with the job's condition variable signalled. Before issue 14 this
// hook read the job back from the store on every poll.
static bool run_should_stop(void* user_data) {
  return pcp_workloads_job_should_stop(((train_run_t*)user_data)->job);
}

// The job's waits on its fabric tasks sleep on the runner's condition
// variable, woken by a task's end (run_signal, from the fabric's loop
// thread) and by a cancel or stop (the runner signals it), not by polling.
static bool run_wait(void* user_data, bool (*ready)(void* arg), void* arg,
                     bool stop_wakes, int64_t timeout_ms) {
  return pcp_workloads_job_wait_for(((train_run_t*)user_data)->job, ready, arg,
                                    stop_wakes, timeout_ms);
}

static void run_signal(void* user_data) {
  pcp_workloads_job_signal(((train_run_t*)user_data)->job);
}

static void run_exported(void* user_data, const char* model_dir) {
  const pcp_workloads_train_options_t* o =
      &((train_run_t*)user_data)->train->options;
  if (o->exported) {
    o->exported(o->user_data, model_dir);
  }
}

static pcp_status_t train_run(void* self, pcp_workloads_job_t* job) {
  pcp_workloads_train_t* train = self;
  const pcp_workloads_train_options_t* o = &train->options;
  const char* id = pcp_workloads_job_id(job);
  pcp_log_context_t log = o->log;
  log.job_id = id;
  pcp_store_job_t stored;
  pcp_status_t status = pcp_store_job_get(o->store, id, &stored);
  char* experiment = NULL;
  if (!status) {
    experiment =
        json_dumps(json_object_get(stored.spec, "experiment"), JSON_COMPACT);
    pcp_store_job_deinitialize(&stored);
    if (!experiment) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "the job has no experiment");
    }
  }
  if (!status) {
    status =
        pcp_workloads_job_transition(job, PCP_STORE_JOB_STATE_PLACING, NULL);
  }
  if (!status && o->experiment_check) {
    // The same checks as at submit, again before anything is opened (a
    // failure here fails the job from placing): a job stored by an older
    // gateway, or under roots since narrowed, must not reach files outside
    // today's roots (a restart re-runs stored jobs).
    char* checked = NULL;
    status = o->experiment_check(o->user_data, experiment, &checked);
    if (!status) {
      pcp_libc_free(experiment);
      experiment = checked;
    }
  }
  if (!status) {
    status =
        pcp_workloads_job_transition(job, PCP_STORE_JOB_STATE_COMPILING, NULL);
  }
  if (!status) {
    train_run_t run = {.train = train, .job = job};
    pcp_diloco_job_options_t options = {
        .job_id = id,
        .experiment_json = experiment,
        .experiment_byte_length = strlen(experiment),
        .fabric = o->fabric,
        .store = o->store,
        .state_dir = o->state_dir,
        .pcp_path = "/proc/self/exe",
        .compile_queue = o->compile_queue,
        .allocator = o->allocator,
        .metrics = o->metrics,
        .clock = o->clock,
        .log = log,
        .hooks = {.phase = run_phase,
                  .progress = run_progress,
                  .should_stop = run_should_stop,
                  .wait = run_wait,
                  .signal = run_signal,
                  .exported = run_exported,
                  .user_data = &run},
    };
    status = pcp_diloco_job_run(&options);
  }
  pcp_libc_free(experiment);
  return status;
}

void pcp_workloads_train_progress_merge(const json_t* progress,
                                        json_t* job_json) {
  // Keep the submit-time fields (tau, parameter_count, ...) and overwrite
  // the live ones.
  json_t* spec = json_object_get(job_json, "spec");
  json_t* stored = json_object_get(spec, "training");
  json_t* merged =
      json_is_object(stored) ? json_deep_copy(stored) : json_object();
  if (merged) {
    json_object_update(merged, (json_t*)progress);
    json_object_set(job_json, "training", merged);
    if (json_is_object(spec)) {
      json_object_set(spec, "training", merged);
    }
    json_decref(merged);
  }
}

static void train_progress(void* self, const json_t* published,
                           json_t* job_json) {
  (void)self;
  pcp_workloads_train_progress_merge(published, job_json);
}

// A stop reaches the waits the job's condition variable does not: the
// fabric's worker waits (pcp_fabric_workers_wait with the stop hook) wake
// now instead of at their next slice.
static void train_cancel(void* self, pcp_workloads_job_t* job) {
  (void)job;
  pcp_workloads_train_t* train = self;
  if (train->options.fabric) {
    pcp_fabric_endpoint_wake(train->options.fabric);
  }
}

pcp_workloads_kind_t pcp_workloads_train_kind(pcp_workloads_train_t* train) {
  return (pcp_workloads_kind_t){
      .name = "training",
      .max_running = PCP_WORKLOADS_TRAIN_MAX_RUNNING,
      .self = train,
      .run = train_run,
      .progress = train_progress,
      .cancel = train_cancel,
  };
}
