// SPDX-License-Identifier: Apache-2.0
//
// The generic job workload kind: a program (StableHLO text or VMFB), a
// function, input tensors and placement constraints in; output tensors out.
// Part of the workloads module's public surface: include
// "workloads/workloads.h", which includes this file under its runtime
// banner. Moved from roles/gateway/jobs.c (issue 14); the HTTP side stays in
// roles/gateway/workload_routes.c.
//
// Durability: the program and inputs are written as files under
// <state_dir>/jobs/<id>/ (fsynced, renamed into place, base/file.c) BEFORE
// the job row is created, so every job in the store has its files; a crash
// in between leaves only unreferenced files. Results are written as files
// first and recorded next, and the job turns succeeded only after all of
// them are recorded: a finished job never lacks a result.
//
// The kind "generic" on the shared runner (runtime.h): each job's run, on a
// pool thread, goes queued -> placing -> compiling -> running -> succeeded |
// failed (cancelling -> cancelled). Compiling a StableHLO program takes one
// of PCP_WORKLOADS_JOBS_COMPILE_SLOTS slots served by
// PCP_WORKLOADS_JOBS_COMPILE_THREADS compile threads (pcp_compile_module:
// iree-compile in a child process, artifacts cached by content, backend,
// target and compiler); while every slot is taken no generic job starts
// (the kind's admit), so the slots bound the compile backlog. Running
// submits one gang of tasks and waits for their DONE callbacks on the
// job's condition variable; a cancel reaches the tasks through the kind's
// cancel. A restarted gateway re-runs jobs it finds placing, compiling or
// running (generic jobs have no steps to resume from): the runner's
// recovery.
//
// Threading: thread-safe. Ownership: borrows the store and the fabric.

#ifndef PCP_WORKLOADS_JOBS_JOBS_H_
#define PCP_WORKLOADS_JOBS_JOBS_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/base.h"
#include "fabric/fabric.h"
#include "store/store.h"
#include "workloads/runtime/compile_queue.h"
#include "workloads/runtime/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

// Largest job submission (programs and inputs travel in it), inputs and
// workers per job, generic jobs running at once (compiling included).
#define PCP_WORKLOADS_JOBS_MAX_BODY_BYTES ((size_t)64 << 20)
#define PCP_WORKLOADS_JOBS_MAX_INPUTS 64
#define PCP_WORKLOADS_JOBS_MAX_WORKERS 64
#define PCP_WORKLOADS_JOBS_MAX_RUNNING 32
// The compile pool: threads, and slots (compiles queued or running).
#define PCP_WORKLOADS_JOBS_COMPILE_THREADS 2
#define PCP_WORKLOADS_JOBS_COMPILE_SLOTS 16

typedef struct pcp_workloads_jobs_t pcp_workloads_jobs_t;

typedef struct pcp_workloads_jobs_options_t {
  pcp_store_t* store;     // borrowed; required
  const char* state_dir;  // copied; jobs/ and artifacts/ lie under it
  pcp_clock_t clock;      // {0}: pcp_clock_system()
  pcp_log_context_t log;
} pcp_workloads_jobs_options_t;

// INVALID_ARGUMENT naming the option, RESOURCE_EXHAUSTED. Starts nothing.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_jobs_create(
    const pcp_workloads_jobs_options_t* options, pcp_allocator_t allocator,
    pcp_workloads_jobs_t** out_jobs);
// Frees what runs left behind at a stop (their tasks borrow input buffers):
// only after the fabric endpoint is released. NULL-safe.
void pcp_workloads_jobs_release(pcp_workloads_jobs_t* jobs);

// The kind "generic" over |jobs| (borrowed for the runner's lifetime).
pcp_workloads_kind_t pcp_workloads_jobs_kind(pcp_workloads_jobs_t* jobs);

// Starts the compile threads over |fabric| (borrowed; the programs they
// compile are registered there). Before the runner starts. UNAVAILABLE.
// The environment PCP_GATEWAY_TEST_COMPILE_DELAY_MS (test hook) delays
// compiles of programs holding "pcp-test:slow-compile".
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_jobs_start(
    pcp_workloads_jobs_t* jobs, pcp_fabric_endpoint_t* fabric,
    pcp_workloads_compile_queue_t* compile_queue);
// Joins the compile threads (a compile in progress finishes first; queued
// ones are left, their jobs re-run at the next start). After the runner
// stopped.
void pcp_workloads_jobs_stop(pcp_workloads_jobs_t* jobs);

// Submits a job from its JSON form: {"program": {"format": "stablehlo" |
// "vmfb", "text" | "base64"}, "function", "inputs": [{"data_base64",
// "dtype", "shape"} | {"npy_base64"}], "placement": {"backend", "target",
// "workers"}}. Writes the files, stores the job (kind "generic") through
// |runner| and returns it as API JSON in |*out_job| (new reference), then
// wakes the runner.
// INVALID_ARGUMENT naming the field; the store's errors. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_jobs_submit(
    pcp_workloads_jobs_t* jobs, pcp_workloads_runner_t* runner,
    const json_t* body, json_t** out_job);

// A job record as API JSON (new reference; NULL on OOM).
json_t* pcp_workloads_job_json(const pcp_store_job_t* job);
// A job event / result record as API JSON (new reference; NULL on OOM).
json_t* pcp_workloads_job_event_json(const pcp_store_job_event_t* event);
json_t* pcp_workloads_job_result_json(const pcp_store_job_result_t* result);

// Writes result |result| as a .npy file at a fresh path beside it, into
// |out_path| (|capacity| bytes); the caller unlinks it. Errors as the file
// and tensor functions.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_jobs_result_npy_write(
    pcp_workloads_jobs_t* jobs, const pcp_store_job_result_t* result,
    char* out_path, size_t capacity);

#ifdef __cplusplus
}
#endif

#endif  // PCP_WORKLOADS_JOBS_JOBS_H_
