// SPDX-License-Identifier: Apache-2.0
//
// The compile queue: the one way a workload turns StableHLO into a VMFB.
//
// Every compile is a child `pcp compile` process (the compiler maps a
// ~320 MB library and can crash on bad input; neither may take down the
// gateway). The queue runs at most |slot_count| children at once and starts
// queued compiles first in, first out. Each compile's output is one file in
// the artifact directory, named by ONE key (pcp_workloads_compile_key_compute)
// over everything that shapes the program: the content hash of the input,
// the program kind and its options (inner steps, delta dtype, accumulation,
// inner state), the extra iree flags and $PCP_IREE_FLAGS, the backend, the
// target and the compiler's version line. An artifact that exists is reused
// without starting a child; requests for a key already queued or running
// join that compile (one child, several waiters).
//
// A request is one waiter. Cancelling it wakes its waiter at once; when the
// last waiter of a compile has cancelled, a queued compile is dropped and a
// running child is killed (SIGKILL). Waiters block on a condition variable:
// nothing polls. Each slot is one thread that starts a child and blocks in
// waitid(WNOWAIT) until it exits; the child stays a zombie until the slot
// thread, holding the queue lock, marks it gone and reaps it, so a cancel
// (which signals under the same lock) can never hit a recycled pid. No
// SIGCHLD handler (it would take children from every other part of the
// process) and no pidfd (Linux-only, and the queue needs nothing it adds).
//
// Threading: all functions are thread-safe. Ownership: the queue copies
// every string of a spec; a request is owned by its submitter until
// pcp_workloads_compile_request_release.

#ifndef PCP_WORKLOADS_RUNTIME_COMPILE_QUEUE_H_
#define PCP_WORKLOADS_RUNTIME_COMPILE_QUEUE_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// The artifact key
//===----------------------------------------------------------------------===//

// Bumped when the key's text changes meaning (artifacts of an older version
// are recompiled once, never served for a different program).
#define PCP_WORKLOADS_COMPILE_KEY_VERSION "pcp.compile.v1"
// Artifacts are <artifact_dir>/program-<first 32 hex digits of the key>.vmfb.
#define PCP_WORKLOADS_COMPILE_ARTIFACT_PREFIX "program-"
// Extra iree flags of one compile (as pcp compile --iree-flag).
#define PCP_WORKLOADS_COMPILE_MAX_IREE_FLAGS 16
#define PCP_WORKLOADS_COMPILE_MAX_STRING_LENGTH 1023

// What one compile is. Strings are borrowed for the call.
typedef struct pcp_workloads_compile_spec_t {
  // The StableHLO file the child compiles (required).
  const char* mlir_path;
  // Hex SHA-256 of what the input is made of (the model text, say); NULL:
  // the queue hashes the file.
  const char* content_hash;
  // NULL: the module as it is. Else a training program (pcp compile
  // --program): "grad", "train" or "diloco", with the options below; they
  // are ignored (and not in the key) without a program.
  const char* program;
  int64_t inner_steps;      // --inner-steps
  const char* delta_dtype;  // --delta-dtype; NULL = "f32"
  int64_t accumulation;     // > 1: --accumulate
  bool inner_state_keep;    // --inner-state keep
  // Extra iree-compile flags (each passed as --iree-flag=FLAG).
  const char* const* iree_flags;
  size_t iree_flag_count;
  const char* backend;  // "cpu", "cuda", ... (required)
  const char* target;   // NULL or "" = the backend default
  // Where compile-<key>.log goes; NULL = the artifact directory.
  const char* log_dir;
  // For log lines (a job id); may be NULL.
  const char* label;
} pcp_workloads_compile_spec_t;

// The key of |spec| as 64 hex digits. |compiler_version| is the compiler's
// version line; $PCP_IREE_FLAGS is read here (the child inherits it).
// INVALID_ARGUMENT for a spec without mlir_path or backend, too many flags
// or a string over PCP_WORKLOADS_COMPILE_MAX_STRING_LENGTH; NOT_FOUND when
// |content_hash| is NULL and the file cannot be read.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_compile_key_compute(
    const pcp_workloads_compile_spec_t* spec, const char* compiler_version,
    char out_key[PCP_SHA256_HEX_LENGTH + 1]);

//===----------------------------------------------------------------------===//
// The queue
//===----------------------------------------------------------------------===//

typedef struct pcp_workloads_compile_queue_t pcp_workloads_compile_queue_t;
typedef struct pcp_workloads_compile_request_t pcp_workloads_compile_request_t;

#define PCP_WORKLOADS_COMPILE_MAX_SLOTS 64

typedef struct pcp_workloads_compile_queue_options_t {
  // The binary started as `<pcp_path> compile ...` (required).
  const char* pcp_path;
  // Where artifacts go (created when missing; required). Also the child's
  // --cache-dir.
  const char* artifact_dir;
  uint32_t slot_count;   // concurrent children, 1..MAX_SLOTS (0 = 2)
  uint32_t max_pending;  // compiles queued or running (0 = 256)
  int64_t timeout_s;     // the child's --timeout-s (0 = its default)
  // NULL: probed once (pcp_compile_compiler_version). Tests give one.
  const char* compiler_version;
  pcp_clock_t clock;  // timings; {0} = the system clock
  pcp_log_context_t log;
} pcp_workloads_compile_queue_options_t;

// Starts |slot_count| slot threads. RESOURCE_EXHAUSTED / UNAVAILABLE when
// memory or threads run out; INVALID_ARGUMENT for bad options.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_compile_queue_create(
    const pcp_workloads_compile_queue_options_t* options,
    pcp_allocator_t allocator, pcp_workloads_compile_queue_t** out_queue);

// Cancels every compile (queued ones are dropped, running children killed;
// every wait returns CANCELLED), refuses new submits (CANCELLED) and joins
// the slot threads. Idempotent; the queue stays valid until destroy (so a
// server can stop compiles early and free the queue after its users).
void pcp_workloads_compile_queue_shutdown(pcp_workloads_compile_queue_t* queue);

// Shuts down (above) and drops the creator's reference. Requests not yet
// released stay valid and are released by their owners as usual (the last one
// frees the queue).
void pcp_workloads_compile_queue_destroy(pcp_workloads_compile_queue_t* queue);

// Submits a compile. An artifact that exists makes a request that is done
// at once; a key already queued or running is joined. RESOURCE_EXHAUSTED
// when max_pending compiles are in flight; CANCELLED after shutdown began;
// errors of pcp_workloads_compile_key_compute.
PCP_MUST_USE_RESULT pcp_status_t pcp_workloads_compile_queue_submit(
    pcp_workloads_compile_queue_t* queue,
    const pcp_workloads_compile_spec_t* spec,
    pcp_workloads_compile_request_t** out_request);

// Blocks until the compile is done or the request is cancelled. OK: the
// artifact is at pcp_workloads_compile_request_vmfb_path. CANCELLED after a
// cancel; the child's failure otherwise: INVALID_ARGUMENT (it exited
// non-zero) or INTERNAL (killed by a signal, or could not start), the
// message naming the log file and ending with the log's last KiB on one
// line (the compiler's diagnostics). May be called again (same answer).
PCP_MUST_USE_RESULT pcp_status_t
pcp_workloads_compile_request_wait(pcp_workloads_compile_request_t* request);

// Blocks at most |timeout_ms| (real time: a condition variable's timed
// wait) for the compile to finish; true when it has (done or cancelled),
// then _wait returns at once. For callers that must also watch something
// that cannot call _cancel (a polled stop hook).
bool pcp_workloads_compile_request_wait_for(
    pcp_workloads_compile_request_t* request, int64_t timeout_ms);

// Runs |notify|(|user_data|) once when |request| finishes (done or
// cancelled), so a caller can sleep on a condition variable of its own and
// watch other events too; at once when it has finished already. It runs
// with the queue's lock held, on the thread that finishes the request (a
// slot thread, a cancelling or releasing thread, or this caller): it must
// not call into the queue nor block, and any lock it takes must never be
// held while calling into the queue. At most once per request;
// |user_data| must live until the request has finished.
void pcp_workloads_compile_request_notify(
    pcp_workloads_compile_request_t* request, void (*notify)(void* user_data),
    void* user_data);

// Cancels |request| (idempotent; a done request stays done). Any thread.
void pcp_workloads_compile_request_cancel(
    pcp_workloads_compile_request_t* request);

// Borrowed, valid until release: the artifact path, the log path, the key.
const char* pcp_workloads_compile_request_vmfb_path(
    const pcp_workloads_compile_request_t* request);
const char* pcp_workloads_compile_request_log_path(
    const pcp_workloads_compile_request_t* request);
const char* pcp_workloads_compile_request_key(
    const pcp_workloads_compile_request_t* request);
// True when the artifact existed at submit (no child was started for it).
bool pcp_workloads_compile_request_cache_hit(
    const pcp_workloads_compile_request_t* request);

// Cancels (when not done) and frees |request|. NULL is fine.
void pcp_workloads_compile_request_release(
    pcp_workloads_compile_request_t* request);

// Counters for tests and metrics.
typedef struct pcp_workloads_compile_queue_stats_t {
  uint64_t children_started;
  uint64_t children_killed;  // by a cancel or destroy
  uint64_t cache_hits;       // submits answered by an existing artifact
  uint64_t joined;           // submits that joined a queued/running compile
  uint32_t queued;
  uint32_t running;
  uint32_t running_peak;
  int64_t last_compile_ns;  // injected clock, start to exit of the last
} pcp_workloads_compile_queue_stats_t;

void pcp_workloads_compile_queue_stats(
    pcp_workloads_compile_queue_t* queue,
    pcp_workloads_compile_queue_stats_t* out_stats);

#ifdef __cplusplus
}
#endif

#endif  // PCP_WORKLOADS_RUNTIME_COMPILE_QUEUE_H_
