// SPDX-License-Identifier: Apache-2.0
//
// Inference service (part of the workloads module; included from
// workloads.h): serves built-in models (GPT, nanochat, Qwen3) from model
// directories on the inference workers of a fabric endpoint.
//
// A model directory holds model.json (docs/api.md, "Serving models") and
// its weights. For each model the service emits the generation module
// (src/models: @prefill, @decode, @load), compiles it with
// pcp_compile_module (a child process; artifacts cached) once per (backend,
// target) of the connected workers, registers it with the fabric and runs
// @load once per worker with every output kept resident in the worker
// session "infer:<model>", so weights and KV caches stay on the device.
//
// Per (model, worker) one scheduler thread drives continuous batching over
// the module's slots: queued requests take free slots, prompts are
// prefilled (all prefilling slots in one @prefill call per chunk), every
// generating slot advances in one @decode call per step, and each token is
// sampled here (pcp_sampler_t), run through the stop rules and handed to
// the request's text callback at once. Requests are routed to the least
// loaded worker of the model, except that a request with a session key goes
// to the worker that holds that session's slot, which keeps its tokens: a
// follow-up whose prompt extends them prefills only the new suffix (the
// longest common prefix is reused).
//
// A manager thread scans the model directories (also on demand through
// pcp_infer_service_scan, and for one directory through
// pcp_infer_service_dir_notify), prepares models, starts schedulers for
// workers that connect, stops those of workers that are lost, and runs the
// readiness probe: a one-token request through the real path (gateway ->
// worker -> @prefill and one @decode) every probe interval, on each serving
// scheduler in turn; a scheduler that ended a real request with a token
// within the interval counts as probed (the probe would only delay that
// traffic).
//
// A model is served as versions: a newer model.json of the same name (a
// training job's next checkpoint) is prepared beside the served version
// (own weights, own worker sessions) and takes new requests once one
// worker has it; the old version's schedulers finish what they hold and
// retire (pcp_infer_service_scan describes the rules).
//
// Threading: every function is thread-safe. Callbacks of a request run on
// its scheduler thread (or on the submitting thread when submit fails: then
// none runs); they must not block for long and must not call back into the
// service.
// Ownership: options are copied; the fabric endpoint and registry are
// borrowed and must outlive the service.

#ifndef PCP_WORKLOADS_INFER_INFER_H_
#define PCP_WORKLOADS_INFER_INFER_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "fabric/fabric.h"
#include "obs/obs.h"
#include "store/store.h"
#include "workloads/runtime/compile_queue.h"
#include "workloads/runtime/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

// model.json's maximum size and the longest model name.
#define PCP_INFER_MAX_MODEL_JSON_BYTES ((size_t)1 << 20)
#define PCP_INFER_MAX_MODEL_NAME 128
#define PCP_INFER_MAX_MODELS 64
#define PCP_INFER_MAX_MODEL_DIRS 64
// Messages per chat request and bytes of prompt text per request.
#define PCP_INFER_MAX_MESSAGES 1024
#define PCP_INFER_MAX_PROMPT_BYTES ((size_t)1 << 20)
// Slots of the generation module unless model.json says otherwise.
#define PCP_INFER_DEFAULT_SLOTS 8
#define PCP_INFER_MAX_SLOTS 64

typedef struct pcp_infer_service_t pcp_infer_service_t;

// Inference as a job kind (job.c, issue 14): each served model version is
// a job of kind "inference" on the workload runner. Its run follows the
// version through the store states (placing while its weights load and no
// worker has it, compiling while its programs compile or load on workers,
// running once a worker serves it) and ends it: succeeded when a newer
// version replaced it (placement {"replaced_by_version": N, "reason"}),
// failed with the load or compile error, cancelled by a client (the
// version stops serving; a model left with no version is withdrawn: not
// listed, its requests NOT_FOUND, until a new model.json of its name). A
// runner stop leaves the job where it is; the next start resumes it.
//
// The owner keeps one of these where the runner's kinds are built (it
// exists before the service): |runner| and |store| filled before the
// service is created with options.kind pointing here; the service sets
// |service| at create and clears it at release. Stop the runner before
// releasing the service.
typedef struct pcp_infer_kind_t {
  pcp_workloads_runner_t* runner;  // borrowed
  pcp_store_t* store;              // borrowed; the runner's
  pcp_infer_service_t* service;    // read with __atomic builtins
} pcp_infer_kind_t;

// The kind's table: validate (the spec's keys), run, progress (the job
// JSON gets "inference": {model, version, workers, requests,
// generated_tokens, ttft_seconds_mean}), cancel. max_running
// 2 * PCP_INFER_MAX_MODELS (a current and a next version per model).
pcp_workloads_kind_t pcp_infer_kind(pcp_infer_kind_t* kind);

typedef struct pcp_infer_service_options_t {
  pcp_fabric_endpoint_t* fabric;  // borrowed
  pcp_obs_registry_t* metrics;    // borrowed; the vllm:* inference metrics
  const char* artifact_dir;       // compile cache (NULL: the default)
  // The compile queue programs go through (borrowed, thread-safe); NULL: a
  // queue of this service's own (one slot, this process's binary as `pcp`),
  // made at the first compile.
  pcp_workloads_compile_queue_t* compile_queue;
  // Scanned for <models_root>/<name>/model.json (NULL: none).
  const char* models_root;
  // Model directories served from the start (each holds model.json).
  const char* const* model_dirs;
  size_t model_dir_count;
  int64_t probe_interval_ms;  // 0: 1000
  // A probe older than this (or a failed one) makes the service not ready.
  int64_t probe_max_age_ms;  // 0: 5 x probe_interval_ms
  // Requests waiting for a slot per worker (429 past it).
  uint32_t max_waiting_per_worker;  // 0: 64
  // A worker call taking longer fails its requests (DEADLINE_EXCEEDED).
  int64_t call_timeout_ms;  // 0: 60000
  // Tests only: a pause after every scheduling round (0: none), so that a
  // request stays in flight long enough to watch a reload around it.
  int64_t test_step_delay_ms;
  pcp_log_context_t log;
  // Served versions become jobs of this kind's runner (borrowed; NULL: no
  // jobs, the service alone, as in tests and standalone use).
  pcp_infer_kind_t* kind;
} pcp_infer_service_options_t;

// Registers the metrics, loads nothing yet and starts the manager thread.
PCP_MUST_USE_RESULT pcp_status_t pcp_infer_service_create(
    const pcp_infer_service_options_t* options, pcp_allocator_t allocator,
    pcp_infer_service_t** out_service);
// The service as the gateway serves it (setup.c): |base| with
// <state_dir>/models as the models root, <state_dir>/artifacts as the
// compile cache and the directories of |model_dir_values| (each a
// comma-separated list; empty parts skipped) as model_dirs.
// INVALID_ARGUMENT past PCP_INFER_MAX_MODEL_DIRS; else as _create. The test
// hook PCP_GATEWAY_TEST_INFER_STEP_DELAY_MS (1..10000) sets
// test_step_delay_ms.
PCP_MUST_USE_RESULT pcp_status_t pcp_infer_service_create_in_state_dir(
    const pcp_infer_service_options_t* base, const char* state_dir,
    const char* const* model_dir_values, size_t model_dir_value_count,
    pcp_allocator_t allocator, pcp_infer_service_t** out_service);
// Refuses new requests (UNAVAILABLE), lets the running and waiting ones
// finish for up to |deadline_ms|, then stops every thread; requests still
// in flight end with CANCELLED (their done callback runs). Idempotent.
// Call it before stopping the HTTP server whose handlers wait on requests.
void pcp_infer_service_shutdown(pcp_infer_service_t* service,
                                int64_t deadline_ms);
// Shuts down (deadline 0) if needed and frees. Before the fabric endpoint
// is released. NULL is a no-op.
void pcp_infer_service_release(pcp_infer_service_t* service);

// Looks for model directories not seen yet or changed (the root and the
// configured dirs) and starts preparing them. Cheap when nothing changed.
//
// Reloads: a model.json read again (its inode, mtime or size changed) that
// names a model already served, from the same directory or from another
// one with a newer model.json (a new training job of the same name), is a
// new version of it. Its weights are loaded (and checked against the
// model.json's weights_sha256 when given), @load'ed on every worker in a
// session of its own, and once one worker has it, new requests go to it;
// requests already queued or running finish on the version they started
// on, whose runners then retire. A failed reload leaves the served version
// in place (reload_error in the listing). Counted in
// pcp_model_reloads_total{model, outcome=ok|failed}.
void pcp_infer_service_scan(pcp_infer_service_t* service);

// Tells the service that |dir| was (re)written (a training job's export):
// the same as a scan of that one directory, at once rather than at the
// next periodic scan. Thread-safe; cheap (a stat and a small JSON read).
void pcp_infer_service_dir_notify(pcp_infer_service_t* service,
                                  const char* dir);

typedef enum pcp_infer_model_state_e {
  PCP_INFER_MODEL_PREPARING = 0,  // loading weights, compiling, @load
  PCP_INFER_MODEL_READY = 1,      // at least one worker serves it
  PCP_INFER_MODEL_FAILED = 2,     // |error| says why
} pcp_infer_model_state_t;

// Requests a model name served since the service started (every version,
// readiness probes excluded).
typedef struct pcp_infer_model_stats_t {
  uint64_t requests;
  uint64_t failed_requests;   // ended with an error (client gone included)
  uint64_t generated_tokens;  // completion tokens of all of them
  double request_seconds;     // summed arrival-to-end times
  uint64_t ttft_count;        // requests that produced a first token
  double ttft_seconds_sum;    // summed arrival-to-first-token times
} pcp_infer_model_stats_t;

typedef struct pcp_infer_model_info_t {
  char name[PCP_INFER_MAX_MODEL_NAME + 1];
  char architecture[16];
  pcp_infer_model_state_t state;
  char error[256];
  int64_t created_s;   // model.json mtime (Unix seconds)
  int64_t max_length;  // context: prompt + generated tokens
  uint32_t workers;    // workers serving it now
  // The version served: 1 for the first model.json read, +1 for each newer
  // export of the name since; the export's training job and outer step
  // ("" / -1 when model.json has none).
  uint32_t version;
  char job_id[64];
  int64_t outer_step;
  // model.json's "worker_class": the class of the workers serving it ("":
  // every worker).
  char worker_class[PCP_SCHED_CLASS_NAME_MAX_LENGTH + 1];
  // A newer export being prepared (0: none), and why the last newer one
  // was not served ("" if none).
  uint32_t pending_version;
  char reload_error[256];
  pcp_infer_model_stats_t stats;
} pcp_infer_model_info_t;

// Copies up to |capacity| models (sorted by name) and returns the count
// copied; |out_total| (optional) gets the number known.
size_t pcp_infer_service_model_list(pcp_infer_service_t* service,
                                    pcp_infer_model_info_t* out_infos,
                                    size_t capacity, size_t* out_total);

// Readiness: every model from |model_dirs| is served by a worker, a probe
// passed within probe_max_age_ms and none failed since.
typedef struct pcp_infer_readiness_t {
  bool ready;
  uint32_t models_ready;
  uint32_t schedulers;   // (model, worker) pairs serving
  int64_t probe_age_ms;  // since the last passed probe; -1: never
  char last_error[256];  // of the last failed probe ("" if none)
} pcp_infer_readiness_t;
void pcp_infer_service_readiness(pcp_infer_service_t* service,
                                 pcp_infer_readiness_t* out_readiness);
// True when the service was given model directories at create: only then
// does a gateway's /readyz depend on the inference probe (models that
// appear later under models_root do not make a gateway unready).
bool pcp_infer_service_has_pinned_models(pcp_infer_service_t* service);

//===----------------------------------------------------------------------===//
// Requests
//===----------------------------------------------------------------------===//

typedef struct pcp_infer_message_t {
  pcp_string_view_t role;  // "system" | "user" | "assistant"
  pcp_string_view_t content;
} pcp_infer_message_t;

typedef struct pcp_infer_result_t {
  pcp_finish_reason_t finish_reason;  // NONE when |status| is an error
  int64_t prompt_tokens;
  int64_t completion_tokens;
  int64_t cached_tokens;  // prompt tokens reused from the session's slot
  // OK, or why the generation ended early (CANCELLED when the text callback
  // asked to stop or the service stops; UNAVAILABLE when the worker was
  // lost). Borrowed for the callback.
  pcp_status_t status;
  // The served version that ran the request (pcp_infer_model_info_t's
  // version and outer_step): the weights its tokens came from. A rollout
  // is tagged with it (an RL job writes its policy version as outer_step).
  // outer_step -1 when that model.json has none.
  int64_t outer_step;
  uint32_t version;
  // The prompt's |prompt_tokens| ids as that version's tokenizer encoded
  // them (what was prefilled); borrowed for the callback.
  const int32_t* prompt_ids;
} pcp_infer_result_t;

// Called with text that may be shown now (never empty). Returning false
// stops the generation (the client went away): the slot is freed before the
// next decode step.
typedef bool (*pcp_infer_text_fn_t)(void* user_data, const char* text,
                                    size_t length);
// Called exactly once when submit succeeded; nothing is called after it.
typedef void (*pcp_infer_done_fn_t)(void* user_data,
                                    const pcp_infer_result_t* result);

// One generated token for pcp_infer_token_fn_t: its id, its
// log-probability under the distribution it was sampled from
// (pcp_sampler_sample_logprobs: after penalties, temperature, top-k and
// top-p, renormalised; 0 for greedy) and its own bytes (borrowed for the
// call; part of a UTF-8 character for a byte-level token, a special
// token's text as written; empty for an id without text).
typedef struct pcp_infer_token_t {
  int32_t id;
  float logprob;
  pcp_string_view_t bytes;
} pcp_infer_token_t;

// Called once per sampled token, EOS and tokens of a stop string included
// (what completion_tokens counts), before any text that token completes
// goes to on_text; |top| holds up to the request's top_logprobs most likely
// tokens of the sampled distribution, most likely first. Returning false
// stops the generation as on_text does.
typedef bool (*pcp_infer_token_fn_t)(void* user_data,
                                     const pcp_infer_token_t* token,
                                     const pcp_infer_token_t* top,
                                     size_t top_count);

typedef struct pcp_infer_request_params_t {
  const char* model;
  // Chat: |messages| rendered by the model's chat template. Otherwise
  // |prompt| is encoded as it is.
  bool chat;
  const pcp_infer_message_t* messages;
  size_t message_count;
  pcp_string_view_t prompt;
  pcp_sampling_params_t sampling;
  int64_t max_tokens;  // 0: up to the end of the context
  const char* const* stop;
  size_t stop_count;
  const char* session_key;  // NULL or "": none
  pcp_infer_text_fn_t on_text;
  pcp_infer_done_fn_t on_done;
  void* user_data;
  // Optional (NULL: none; the sampled tokens are the same either way, for
  // the same seed): per-token log-probabilities, with |top_logprobs|
  // (0..PCP_SAMPLER_MAX_TOP_LOGPROBS, else INVALID_ARGUMENT) top entries.
  pcp_infer_token_fn_t on_token;
  uint32_t top_logprobs;
} pcp_infer_request_params_t;

// Tokenizes and queues a request. Errors (no callback runs): NOT_FOUND for
// an unknown model (after a scan); INVALID_ARGUMENT for a bad message,
// prompt or parameter (the message starts with the parameter name and a
// colon, e.g. "messages[1].role: ..."); OUT_OF_RANGE when the prompt plus
// max_tokens exceed the context (the message says so);
// RESOURCE_EXHAUSTED when the worker's queue is full; UNAVAILABLE when no
// worker serves the model yet. |out_prompt_tokens| (optional) gets the
// prompt's token count.
PCP_MUST_USE_RESULT pcp_status_t pcp_infer_request_submit(
    pcp_infer_service_t* service, const pcp_infer_request_params_t* params,
    int64_t* out_prompt_tokens);

// The prompt's token count under |params->model|'s tokenizer and chat
// template (what submit would queue) and the model's context window, with
// nothing queued: lets a caller fit text into the window before it submits
// (query-then-infer's graph context). NOT_FOUND for an unknown model,
// UNAVAILABLE while it loads. Thread-safe.
PCP_MUST_USE_RESULT pcp_status_t pcp_infer_prompt_tokens_count(
    pcp_infer_service_t* service, const pcp_infer_request_params_t* params,
    int64_t* out_prompt_tokens, int64_t* out_max_length);

#ifdef __cplusplus
}
#endif

#endif  // PCP_WORKLOADS_INFER_INFER_H_
