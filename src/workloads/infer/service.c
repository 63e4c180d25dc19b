// SPDX-License-Identifier: Apache-2.0
// The inference service: model registry, manager thread (scan, compile,
// @load, readiness probe), per-(model, worker) schedulers with continuous
// batching, and the router. infer.h describes the behaviour.

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "compile/compile.h"
#include "workloads/infer/infer_impl.h"

typedef struct runner_t runner_t;
typedef struct req_t req_t;

//===----------------------------------------------------------------------===//
// Types
//===----------------------------------------------------------------------===//

typedef enum model_state_e {
  MODEL_NEW = 0,     // model.json read; weights not loaded
  MODEL_LOADED = 1,  // weights on the host; compiles per target on demand
  MODEL_FAILED = 2,
} model_state_t;

#define MAX_PROGRAMS 8  // (backend, target) pairs compiled per model

typedef struct program_entry_t {
  char backend[16];
  char target[PCP_SCHED_TARGET_MAX_LENGTH + 1];
  bool failed;
  uint8_t hash[PCP_SHA256_BYTE_LENGTH];
} program_entry_t;

// One export of a model: the record read from its directory, the programs
// compiled for it and the runners that serve it. A later export of the
// same name becomes a new version; the old one lives while a runner (and so
// a request) or a submit still holds it.
typedef struct version_t {
  // The service's allocator: this version's memory.
  pcp_allocator_t allocator;
  pcp_infer_model_t* model;  // immutable once |state| is LOADED
  uint32_t number;           // 1, 2, ... per model name
  model_state_t state;
  char error[256];
  program_entry_t programs[MAX_PROGRAMS];
  size_t program_count;
  // Guarded by the service's |mu|: the entry's reference (as current or
  // next), one per runner, and one per thread reading it without the lock.
  uint32_t refs;
  // The version as a job of kind "inference" (job.c), with a runner
  // attached (options.kind); guarded by |mu|. |job_id| "" when none.
  char job_id[PCP_INFER_JOB_ID_MAX_LENGTH + 1];
  pcp_status_code_t error_code;  // of |error| (OK: none)
  char error_message[256];       // |error| without the code
  uint32_t compiling;            // compiles in flight for it
  // The manager's pass (|manage_passes|) in which a compile of it failed
  // last; its job fails only once that pass over every worker ended.
  uint64_t compile_failed_pass;
  bool compile_failure_told;  // its job was signalled after that pass
  uint32_t replaced_by;       // the version that replaced it (0: none)
  bool cancelled;             // its job was cancelled: it serves no more
} version_t;

typedef struct model_entry_t {
  // The version requests go to (or the first one, still preparing or
  // failed) and a newer export being prepared (NULL: none). |next| becomes
  // |current| once one of its runners is ready; the old runners finish what
  // they hold and stop.
  version_t* current;
  version_t* next;
  uint32_t versions;       // numbers handed out so far
  char reload_error[256];  // why the last newer export failed ("" if none)
  bool pinned;             // from --model-dir (readiness depends on it)
  // Its only version's job was cancelled: not listed, not found by
  // requests, until a new model.json of the name (docs/decisions.md).
  bool withdrawn;
  // Requests served under this name, every version (not probes), for the
  // dashboard's models page; guarded by the service's |mu|.
  pcp_infer_model_stats_t stats;
} model_entry_t;

typedef enum req_phase_e {
  PHASE_WAITING = 0,
  PHASE_PREFILL = 1,
  PHASE_DECODE = 2,
} req_phase_t;

struct req_t {
  // The service's allocator: this request's memory and |ids|.
  pcp_allocator_t allocator;
  req_t* next;  // waiting queue
  runner_t* runner;
  const pcp_infer_model_t* model;
  bool probe;  // readiness probe: not in the request metrics
  pcp_infer_text_fn_t on_text;
  pcp_infer_done_fn_t on_done;
  void* user_data;
  // Per-token log-probabilities (NULL: none, and the plain sampler runs).
  pcp_infer_token_fn_t on_token;
  uint32_t top_logprobs;
  pcp_string_builder_t token_bytes;  // scratch for on_token's bytes
  char session[PCP_INFER_MAX_MODEL_NAME + 1];
  pcp_sampler_t sampler;
  pcp_stop_state_t stop;
  pcp_tokenizer_decode_stream_t decode;
  uint8_t pending[4];  // byte tokenizer: an incomplete UTF-8 character
  size_t pending_size;
  pcp_string_builder_t text;  // scratch
  pcp_string_builder_t shown;
  // Prompt then generated ids (the sampler's history).
  int32_t* ids;
  int64_t prompt_count;
  int64_t count;
  int64_t prefilled;  // prompt tokens in the slot's cache
  int64_t cached;     // reused from the slot
  int32_t next_token;
  req_phase_t phase;
  int slot;
  int64_t submitted_ns;
  int64_t first_token_ns;  // 0: no token yet
  int64_t last_token_ns;
};

typedef struct slot_t {
  req_t* req;
  int32_t* tokens;  // what the cache holds, max_length entries
  int64_t length;
  char session[PCP_INFER_MAX_MODEL_NAME + 1];
  uint64_t last_used;
} slot_t;

typedef enum runner_state_e {
  RUNNER_LOADING = 0,
  RUNNER_READY = 1,
  RUNNER_DEAD = 2,
} runner_state_t;

struct runner_t {
  runner_t* next;
  pcp_infer_service_t* service;
  model_entry_t* entry;
  version_t* version;  // one reference, dropped when the runner is freed
  const pcp_infer_model_t* model;  // version->model
  char worker_id[PCP_SCHED_WORKER_ID_MAX_LENGTH + 1];
  char session_id[PCP_INFER_MAX_MODEL_NAME + 24];  // infer:<name>[#k]
  uint8_t program[PCP_SHA256_BYTE_LENGTH];
  pthread_t thread;
  bool thread_started;
  // Signalled (with the service's |mu|) when work is queued or the runner
  // must stop: one runner wakes per request, not every thread.
  pthread_cond_t cv;
  // Guarded by the service's |mu|.
  _Atomic runner_state_t state;
  bool stop;
  req_t* waiting_head;
  req_t* waiting_tail;
  uint32_t waiting;
  uint32_t active;
  // When this runner last ended a request (not a probe) with at least one
  // token; 0: never. Stands in for the readiness probe (probe_start).
  int64_t served_ok_ns;
  // Tokens the slots' KV caches hold, summed after each round (scheduler
  // thread writes; the metrics collector reads).
  _Atomic int64_t kv_tokens;
  // Scheduler thread only.
  slot_t* slots;
  uint64_t tick;
  int32_t* ids;
  int32_t* positions;
  int32_t* lengths;
  float* logits;
  char status_text[256];
};

struct pcp_infer_service_t {
  pcp_allocator_t allocator;
  pcp_infer_service_options_t options;
  char artifact_dir[PCP_INFER_MAX_PATH];
  char models_root[PCP_INFER_MAX_PATH];
  char (*model_dirs)[PCP_INFER_MAX_PATH];
  size_t model_dir_count;
  pcp_clock_t clock;
  pcp_obs_family_t* ttft;
  pcp_obs_family_t* itl;
  pcp_obs_family_t* e2e;
  pcp_obs_family_t* queue;
  pcp_obs_family_t* prompt_tokens;
  pcp_obs_family_t* generation_tokens;
  pcp_obs_family_t* running;
  pcp_obs_family_t* waiting;
  pcp_obs_family_t* reloads;
  pcp_obs_family_t* success;
  pcp_obs_family_t* kv_usage;
  pcp_obs_family_t* prefix_queries;
  pcp_obs_family_t* prefix_hits;
  pcp_obs_registry_t* registry;  // where the collector is (NULL: none)
  // Test hook: a pause after every scheduling round, so that a request can
  // be kept in flight across a reload (0: none).
  int64_t step_delay_ms;

  pthread_mutex_t mu;
  pthread_cond_t cv;
  // Broadcast when a request leaves a runner (pcp_infer_service_shutdown
  // waits on it for the ones in flight); its own, so the manager, which
  // waits on |cv|, is not woken per request.
  pthread_cond_t idle_cv;
  bool refusing;  // shutdown started: no new requests
  bool stopping;
  // The manager's compile in flight (cancelled by shutdown) and the queue
  // made when options.compile_queue is NULL (manager thread only).
  pcp_workloads_compile_request_t* compiling;
  pcp_workloads_compile_queue_t* own_queue;
  bool shut_down;
  model_entry_t models[PCP_INFER_MAX_MODELS];
  size_t model_count;
  // Directories already looked at: a model.json is read again only when
  // its identity (inode, mtime in ns, size) changes.
  char seen_dirs[PCP_INFER_MAX_MODELS][PCP_INFER_MAX_PATH];
  struct {
    uint64_t inode;
    int64_t mtime_ns;
    int64_t size;
  } seen_stamp[PCP_INFER_MAX_MODELS];
  size_t seen_count;
  runner_t* runners;
  int64_t last_scan_ns;
  // Readiness probe.
  bool probe_in_flight;
  int64_t probe_started_ns;
  int64_t probe_ok_ns;  // 0: never
  bool probe_failed;
  char probe_error[256];
  size_t probe_cursor;
  pthread_t manager;
  bool manager_started;
  // Bumped (under |mu|) with every change a version's job may care about,
  // before its job is signalled: the job's wait reads it without |mu|.
  _Atomic uint64_t job_generation;
  // manage_workers passes ended (under |mu|).
  uint64_t manage_passes;
};

//===----------------------------------------------------------------------===//
// Metrics
//===----------------------------------------------------------------------===//

// The inference set uses vLLM's names and its `model_name` label by
// default, so vLLM Grafana boards read it unchanged (docs/observability.md,
// docs/decisions.md); what vLLM has no name for keeps a pcp_ name.
static const char* const kModelLabel[] = {"model_name", NULL};
static const char* const kFinishLabels[] = {"model_name", "finished_reason",
                                            NULL};
static const char* const kReloadLabels[] = {"model", "outcome", NULL};
static const double kLatencyBuckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025,
                                         0.05,  0.1,    0.25,  0.5,  1.0,
                                         2.5,   5.0,    10.0,  30.0, 60.0};
static const double kTokenBuckets[] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5};

enum {
  M_TTFT = 0,
  M_ITL,
  M_E2E,
  M_QUEUE,
  M_PROMPT_TOKENS,
  M_GENERATION_TOKENS,
  M_RUNNING,
  M_WAITING,
  M_RELOADS,
  M_SUCCESS,
  M_KV_USAGE,
  M_PREFIX_QUERIES,
  M_PREFIX_HITS,
  M_COUNT_,
};

static const pcp_obs_metric_def_t kMetrics[M_COUNT_] = {
    [M_TTFT] = {.name = "vllm:time_to_first_token_seconds",
                .type = PCP_OBS_METRIC_TYPE_HISTOGRAM,
                .help = "Seconds from a request's arrival to its first "
                        "generated token",
                .label_names = kModelLabel,
                .buckets = kLatencyBuckets,
                .bucket_count = PCP_ARRAYSIZE(kLatencyBuckets)},
    [M_ITL] = {.name = "vllm:time_per_output_token_seconds",
               .type = PCP_OBS_METRIC_TYPE_HISTOGRAM,
               .help = "Seconds between consecutive generated tokens of a "
                       "request (inter-token latency)",
               .label_names = kModelLabel,
               .buckets = kTokenBuckets,
               .bucket_count = PCP_ARRAYSIZE(kTokenBuckets)},
    [M_E2E] = {.name = "vllm:e2e_request_latency_seconds",
               .type = PCP_OBS_METRIC_TYPE_HISTOGRAM,
               .help = "Seconds from a request's arrival to its end",
               .label_names = kModelLabel,
               .buckets = kLatencyBuckets,
               .bucket_count = PCP_ARRAYSIZE(kLatencyBuckets)},
    [M_QUEUE] = {.name = "vllm:request_queue_time_seconds",
                 .type = PCP_OBS_METRIC_TYPE_HISTOGRAM,
                 .help = "Seconds a request waited for a slot",
                 .label_names = kModelLabel,
                 .buckets = kLatencyBuckets,
                 .bucket_count = PCP_ARRAYSIZE(kLatencyBuckets)},
    [M_PROMPT_TOKENS] = {.name = "vllm:prompt_tokens_total",
                         .type = PCP_OBS_METRIC_TYPE_COUNTER,
                         .help = "Prompt tokens of admitted requests",
                         .label_names = kModelLabel},
    [M_GENERATION_TOKENS] = {.name = "vllm:generation_tokens_total",
                             .type = PCP_OBS_METRIC_TYPE_COUNTER,
                             .help = "Tokens generated",
                             .label_names = kModelLabel},
    [M_RUNNING] = {.name = "vllm:num_requests_running",
                   .type = PCP_OBS_METRIC_TYPE_GAUGE,
                   .help = "Requests holding a slot",
                   .label_names = kModelLabel},
    [M_WAITING] = {.name = "vllm:num_requests_waiting",
                   .type = PCP_OBS_METRIC_TYPE_GAUGE,
                   .help = "Requests waiting for a slot",
                   .label_names = kModelLabel},
    [M_RELOADS] = {.name = "pcp_model_reloads_total",
                   .type = PCP_OBS_METRIC_TYPE_COUNTER,
                   .help = "Newer exports of a served model: ok (now served) "
                           "or failed (the previous version stays)",
                   .label_names = kReloadLabels},
    [M_SUCCESS] = {.name = "vllm:request_success_total",
                   .type = PCP_OBS_METRIC_TYPE_COUNTER,
                   .help = "Requests ended, by why: stop (EOS or stop "
                           "sequence), length (max_tokens or context), abort "
                           "(cancelled), error (failed)",
                   .label_names = kFinishLabels},
    [M_KV_USAGE] = {.name = "vllm:kv_cache_usage_perc",
                    .type = PCP_OBS_METRIC_TYPE_GAUGE,
                    .help = "Fraction of the KV-cache token positions of the "
                            "model's slots that hold tokens (1 = full)",
                    .label_names = kModelLabel},
    [M_PREFIX_QUERIES] = {.name = "vllm:prefix_cache_queries_total",
                          .type = PCP_OBS_METRIC_TYPE_COUNTER,
                          .help = "Prompt tokens looked up in the slot "
                                  "prefix cache",
                          .label_names = kModelLabel},
    [M_PREFIX_HITS] = {.name = "vllm:prefix_cache_hits_total",
                       .type = PCP_OBS_METRIC_TYPE_COUNTER,
                       .help = "Prompt tokens reused from a slot's KV cache "
                               "(same session, common prefix)",
                       .label_names = kModelLabel},
};

static void metric(pcp_obs_family_t* family, const pcp_infer_model_t* m,
                   double value, bool observe) {
  if (!family) {
    return;
  }
  const char* labels[] = {m->name};
  if (observe) {
    pcp_obs_family_observe(family, labels, value);
  } else if (pcp_obs_family_type(family) == PCP_OBS_METRIC_TYPE_COUNTER) {
    pcp_obs_family_add(family, labels, value);
  } else {
    pcp_obs_series_t* series = NULL;
    if (pcp_obs_family_series_get(family, labels, &series) == 0) {
      pcp_obs_gauge_add(series, value);
    }
  }
}

// Counts a newer export of |m|'s model: served (|ok|) or failed.
static void metric_reload(pcp_infer_service_t* s, const pcp_infer_model_t* m,
                          bool ok) {
  if (s->reloads) {
    const char* labels[] = {m->name, ok ? "ok" : "failed"};
    pcp_obs_family_add(s->reloads, labels, 1);
  }
}

static int64_t now_ns(pcp_infer_service_t* s) {
  return pcp_clock_now_ns(s->clock);
}

// Counts finished request |r| in its model's stats (the models page).
static void stats_add(runner_t* runner, const req_t* r, pcp_status_t status) {
  pcp_infer_service_t* s = runner->service;
  int64_t end = now_ns(s);
  pthread_mutex_lock(&s->mu);
  pcp_infer_model_stats_t* st = &runner->entry->stats;
  st->requests++;
  if (status) {
    st->failed_requests++;
  }
  st->generated_tokens += (uint64_t)(r->count - r->prompt_count);
  st->request_seconds += (double)(end - r->submitted_ns) / 1e9;
  if (r->first_token_ns) {
    st->ttft_count++;
    st->ttft_seconds_sum += (double)(r->first_token_ns - r->submitted_ns) / 1e9;
  }
  pthread_mutex_unlock(&s->mu);
}

//===----------------------------------------------------------------------===//
// Versions
//===----------------------------------------------------------------------===//

// A version holding |m| (taken) with one reference (the caller's), from
// |allocator|.
static version_t* version_create(pcp_allocator_t allocator,
                                 pcp_infer_model_t* m, uint32_t number) {
  version_t* v = NULL;
  pcp_status_t status = pcp_allocator_calloc(allocator, sizeof(*v), (void**)&v);
  if (status) {
    pcp_status_ignore(status);
    pcp_infer_model_free(m);
    return NULL;
  }
  v->allocator = allocator;
  v->model = m;
  v->number = number;
  v->state = MODEL_NEW;
  v->refs = 1;
  return v;
}

// Service |mu| held (or no other thread left). NULL is a no-op.
static void version_retain(version_t* v) {
  if (v) {
    v->refs++;
  }
}

// Service |mu| held (or no other thread left). The last reference frees
// the weights; nothing reads them then (runners and submits hold one).
static void version_release(version_t* v) {
  if (v && --v->refs == 0) {
    pcp_infer_model_free(v->model);
    pcp_allocator_free(v->allocator, v);
  }
}

// Service |mu| held: |v|'s job (if it has one) looks at its version again.
// Taking the runner's lock under |mu| is the one order: the job's wait
// reads only |job_generation|, never |mu|.
static void version_job_signal(pcp_infer_service_t* s, const version_t* v) {
  if (!v || !v->job_id[0] || !s->options.kind) {
    return;
  }
  atomic_fetch_add(&s->job_generation, 1);
  pcp_workloads_runner_job_signal(s->options.kind->runner, v->job_id);
}

// Service |mu| held: records why |v| failed (the listing's |error|, and
// its code and message for its job's error).
static void version_error_set(version_t* v, pcp_status_t status) {
  pcp_status_format(status, v->error, sizeof(v->error));
  v->error_code = pcp_status_code(status);
  // The job's error is "<CODE>: <message>" (the runner's format): the
  // listing's text without its code, so that both read the same.
  const char* code = pcp_status_code_string(v->error_code);
  size_t n = strlen(code);
  const char* rest = v->error;
  if (strncmp(rest, code, n) == 0 && strncmp(rest + n, ": ", 2) == 0) {
    rest += n + 2;
  }
  snprintf(v->error_message, sizeof(v->error_message), "%s", rest);
}

//===----------------------------------------------------------------------===//
// Requests
//===----------------------------------------------------------------------===//

static void req_free(req_t* r) {
  if (!r) {
    return;
  }
  pcp_sampler_deinitialize(&r->sampler);
  pcp_stop_state_deinitialize(&r->stop);
  pcp_string_builder_deinitialize(&r->text);
  pcp_string_builder_deinitialize(&r->shown);
  pcp_string_builder_deinitialize(&r->token_bytes);
  pcp_allocator_t allocator = r->allocator;
  pcp_allocator_free(allocator, r->ids);
  pcp_allocator_free(allocator, r);
}

// Ends |r| (on_done), frees its slot for the next request and the record.
// Scheduler thread; |r| must not be in the waiting queue.
static void req_finish(runner_t* runner, req_t* r, pcp_status_t status,
                       pcp_finish_reason_t reason) {
  pcp_infer_service_t* s = runner->service;
  if (!r->probe) {
    stats_add(runner, r, status);  // the models page's per-name counts
  }
  if (r->slot >= 0) {
    slot_t* slot = &runner->slots[r->slot];
    slot->req = NULL;
    slot->last_used = ++runner->tick;
    pthread_mutex_lock(&s->mu);
    runner->active--;
    pthread_cond_broadcast(&s->idle_cv);
    if (!r->probe && !status && r->count > r->prompt_count) {
      runner->served_ok_ns = now_ns(s);
    }
    pthread_mutex_unlock(&s->mu);
    if (!r->probe) {
      metric(s->running, r->model, -1, false);
    }
  }
  if (!r->probe) {
    metric(s->e2e, r->model, (double)(now_ns(s) - r->submitted_ns) / 1e9, true);
    if (s->success) {
      const char* why = reason == PCP_FINISH_REASON_LENGTH ? "length" : "stop";
      if (status) {
        why =
            pcp_status_code(status) == PCP_STATUS_CANCELLED ? "abort" : "error";
      } else if (reason == PCP_FINISH_REASON_NONE) {
        why = "abort";  // the client went away mid-stream
      }
      const char* labels[] = {r->model->name, why};
      pcp_obs_family_add(s->success, labels, 1);
    }
  }
  pcp_infer_result_t result = {
      .finish_reason = status ? PCP_FINISH_REASON_NONE : reason,
      .prompt_tokens = r->prompt_count,
      .completion_tokens = r->count - r->prompt_count,
      .cached_tokens = r->cached,
      .status = status,
      .outer_step = runner->version->model->outer_step,
      .version = runner->version->number,
      .prompt_ids = r->ids,
  };
  r->on_done(r->user_data, &result);
  pcp_status_ignore(status);
  req_free(r);
}

// The text of token |id| so far complete, appended to r->text.
static pcp_status_t token_text(req_t* r, int32_t id) {
  const pcp_infer_model_t* m = r->model;
  switch (m->tokenizer_kind) {
    case PCP_INFER_TOKENIZER_CHAR:
      if (id >= 0 && (uint32_t)id < m->char_count) {
        uint32_t o = m->char_offsets[id];
        return pcp_string_builder_append(
            &r->text, pcp_make_string_view(m->char_text + o,
                                           m->char_offsets[id + 1] - o));
      }
      return pcp_ok_status();
    case PCP_INFER_TOKENIZER_BYTE: {
      if (id < 0 || id > 255) {
        return pcp_ok_status();
      }
      r->pending[r->pending_size++] = (uint8_t)id;
      size_t n = pcp_tokenizer_utf8_complete_length((const char*)r->pending,
                                                    r->pending_size);
      if (n == 0 && r->pending_size == 4) {
        n = 4;  // not UTF-8 at all: pass the bytes on
      }
      pcp_status_t status = pcp_string_builder_append(
          &r->text, pcp_make_string_view((const char*)r->pending, n));
      memmove(r->pending, r->pending + n, r->pending_size - n);
      r->pending_size -= n;
      return status;
    }
    case PCP_INFER_TOKENIZER_BPE:
      // The model's vocab may be padded past the tokenizer's ids: those
      // have no text.
      if (id < 0 || (uint32_t)id >= pcp_tokenizer_vocab_size(m->bpe)) {
        return pcp_ok_status();
      }
      return pcp_tokenizer_decode_stream_push(&r->decode, &id, 1, &r->text);
  }
  return pcp_ok_status();
}

// Appends what the decoder still holds (as U+FFFD) to the shown text.
static pcp_status_t text_finish(req_t* r) {
  pcp_string_builder_reset(&r->text);
  pcp_status_t status = pcp_ok_status();
  if (r->model->tokenizer_kind == PCP_INFER_TOKENIZER_BPE) {
    status = pcp_tokenizer_decode_stream_finish(&r->decode, &r->text);
  } else if (r->pending_size > 0) {
    status = pcp_string_builder_append_cstring(&r->text, "\xEF\xBF\xBD");
    r->pending_size = 0;
  }
  if (!status && r->text.size) {
    status = pcp_string_builder_append(
        &r->shown, pcp_make_string_view(r->text.data, r->text.size));
  }
  return status;
}

// The bytes of token |id| alone (not the decoded text so far: a token may
// hold part of a UTF-8 character, or a special token's text), appended to
// |out|. Ids without text (padding past the tokenizer) append nothing.
static pcp_status_t token_bytes(const pcp_infer_model_t* m, int32_t id,
                                pcp_string_builder_t* out) {
  switch (m->tokenizer_kind) {
    case PCP_INFER_TOKENIZER_CHAR:
      if (id >= 0 && (uint32_t)id < m->char_count) {
        uint32_t o = m->char_offsets[id];
        return pcp_string_builder_append(
            out, pcp_make_string_view(m->char_text + o,
                                      m->char_offsets[id + 1] - o));
      }
      return pcp_ok_status();
    case PCP_INFER_TOKENIZER_BYTE: {
      if (id < 0 || id > 255) {
        return pcp_ok_status();
      }
      char byte = (char)id;
      return pcp_string_builder_append(out, pcp_make_string_view(&byte, 1));
    }
    case PCP_INFER_TOKENIZER_BPE:
      if (id < 0 || (uint32_t)id >= pcp_tokenizer_vocab_size(m->bpe)) {
        return pcp_ok_status();
      }
      return pcp_tokenizer_decode(m->bpe, &id, 1,
                                  PCP_TOKENIZER_DECODE_FLAG_RAW_BYTES, out);
  }
  return pcp_ok_status();
}

// Hands |token| and its log-probabilities to r->on_token. False: the
// caller asked to stop, or an error (|out_status|).
static bool token_report(req_t* r, int32_t token,
                         const pcp_sampler_logprobs_t* lp,
                         pcp_status_t* out_status) {
  *out_status = pcp_ok_status();
  pcp_infer_token_t entries[1 + PCP_SAMPLER_MAX_TOP_LOGPROBS];
  size_t ends[1 + PCP_SAMPLER_MAX_TOP_LOGPROBS];
  size_t count = 1 + lp->top_count;
  pcp_string_builder_reset(&r->token_bytes);
  for (size_t i = 0; i < count && !*out_status; ++i) {
    entries[i].id = i == 0 ? token : lp->top[i - 1].token;
    entries[i].logprob = i == 0 ? lp->logprob : lp->top[i - 1].logprob;
    *out_status = token_bytes(r->model, entries[i].id, &r->token_bytes);
    ends[i] = r->token_bytes.size;
  }
  if (*out_status) {
    return false;
  }
  // Views are made once the builder stops growing (it may move).
  for (size_t i = 0; i < count; ++i) {
    size_t begin = i == 0 ? 0 : ends[i - 1];
    entries[i].bytes = pcp_make_string_view(
        r->token_bytes.data ? r->token_bytes.data + begin : "",
        ends[i] - begin);
  }
  return r->on_token(r->user_data, &entries[0], entries + 1, count - 1);
}

static bool show(req_t* r) {
  if (r->shown.size == 0) {
    return true;
  }
  bool keep = r->on_text(r->user_data, r->shown.data, r->shown.size);
  pcp_string_builder_reset(&r->shown);
  return keep;
}

// Samples the next token of |r| from |logits| and delivers it. Returns true
// when the request goes on (its next token is to be fed by @decode).
static bool req_token(runner_t* runner, req_t* r, const float* logits) {
  pcp_infer_service_t* s = runner->service;
  int32_t token = -1;
  pcp_sampler_logprobs_t lp;
  pcp_status_t status =
      r->on_token ? pcp_sampler_sample_logprobs(&r->sampler, logits, r->ids,
                                                (size_t)r->count,
                                                r->top_logprobs, &token, &lp)
                  : pcp_sampler_sample(&r->sampler, logits, r->ids,
                                       (size_t)r->count, &token);
  if (status) {
    req_finish(runner, r, status, PCP_FINISH_REASON_NONE);
    return false;
  }
  // Before the token's text: a caller pairs the text it gets next with the
  // tokens reported since its last text.
  if (r->on_token && !token_report(r, token, &lp, &status)) {
    req_finish(
        runner, r,
        status ? status
               : pcp_make_status(PCP_STATUS_CANCELLED, "the client went away"),
        PCP_FINISH_REASON_NONE);
    return false;
  }
  int64_t t = now_ns(s);
  if (!r->probe) {
    bool first = r->count == r->prompt_count;
    metric(first ? s->ttft : s->itl, r->model,
           (double)(t - (first ? r->submitted_ns : r->last_token_ns)) / 1e9,
           true);
    metric(s->generation_tokens, r->model, 1, false);
  }
  if (r->count == r->prompt_count) {
    r->first_token_ns = t;
  }
  r->last_token_ns = t;
  r->ids[r->count++] = token;
  pcp_string_builder_reset(&r->text);
  pcp_finish_reason_t reason = PCP_FINISH_REASON_NONE;
  status = token_text(r, token);
  if (!status) {
    status =
        pcp_stop_state_push(&r->stop, token, r->text.data ? r->text.data : "",
                            r->text.size, &r->shown, &reason);
  }
  slot_t* slot = &runner->slots[r->slot];
  if (!status && reason == PCP_FINISH_REASON_NONE &&
      (slot->length + 1 > r->model->gen.max_length ||
       r->count >= r->model->gen.max_length)) {
    // The context is full: nothing more can be fed.
    status = pcp_stop_state_flush(&r->stop, &r->shown);
    reason = PCP_FINISH_REASON_LENGTH;
  }
  bool eos = false;
  for (size_t i = 0; i < r->stop.eos_count; ++i) {
    eos = eos || r->stop.eos_ids[i] == token;
  }
  if (!status && (reason == PCP_FINISH_REASON_LENGTH ||
                  (reason == PCP_FINISH_REASON_STOP && eos))) {
    // The end: a character still incomplete is shown as U+FFFD, as a
    // decode of all the ids shows it (not after a stop sequence, whose
    // rest is cut anyway).
    status = text_finish(r);
  }
  if (status) {
    req_finish(runner, r, status, PCP_FINISH_REASON_NONE);
    return false;
  }
  if (!show(r)) {
    req_finish(runner, r,
               pcp_make_status(PCP_STATUS_CANCELLED, "the client went away"),
               PCP_FINISH_REASON_NONE);
    return false;
  }
  if (reason != PCP_FINISH_REASON_NONE) {
    req_finish(runner, r, pcp_ok_status(), reason);
    return false;
  }
  r->next_token = token;
  r->phase = PHASE_DECODE;
  return true;
}

//===----------------------------------------------------------------------===//
// Worker calls
//===----------------------------------------------------------------------===//

static bool worker_connected(runner_t* runner) {
  pcp_fabric_worker_info_t info;
  pcp_status_t status = pcp_fabric_worker_query(runner->service->options.fabric,
                                                runner->worker_id, &info);
  if (status) {
    pcp_status_ignore(status);
    return false;
  }
  return info.state == PCP_FABRIC_WORKER_CONNECTED;
}

// Submits one task to the runner's worker and waits for it, watching the
// worker: a lost worker or the call timeout cancels the task.
static pcp_status_t call(runner_t* runner, pcp_fabric_task_params_t* params,
                         pcp_fabric_task_t** out_task) {
  pcp_infer_service_t* s = runner->service;
  memcpy(params->program, runner->program, sizeof(params->program));
  params->worker_id = runner->worker_id;
  params->session_id = runner->session_id;
  // The fabric refuses it on a worker that rejoined as another class.
  params->worker_class_name = runner->version->model->worker_class;
  params->max_attempts = 1;
  pcp_fabric_task_t* task = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_fabric_task_submit(s->options.fabric, params, &task));
  int64_t deadline = now_ns(s) + s->options.call_timeout_ms * 1000000;
  pcp_status_t status = pcp_ok_status();
  while (!pcp_fabric_task_wait(task, 100)) {
    if (!worker_connected(runner)) {
      status =
          pcp_make_status(PCP_STATUS_UNAVAILABLE,
                          "inference worker %s was lost", runner->worker_id);
    } else if (now_ns(s) > deadline) {
      status = pcp_make_status(
          PCP_STATUS_DEADLINE_EXCEEDED, "worker %s did not answer in %lld ms",
          runner->worker_id, (long long)s->options.call_timeout_ms);
    }
    if (status) {
      pcp_fabric_task_cancel(task);
      pcp_fabric_task_release(task);
      return status;
    }
  }
  status = pcp_fabric_task_status(task);
  if (status) {
    status = pcp_status_clone(status);
    pcp_fabric_task_release(task);
    return status;
  }
  *out_task = task;
  return pcp_ok_status();
}

static pcp_status_t runner_load(runner_t* runner) {
  const pcp_infer_model_t* m = runner->model;
  size_t n = m->table.count;
  pcp_allocator_t allocator = runner->service->allocator;
  pcp_proto_keep_resident_t* keep = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(allocator, (n + 2) * sizeof(*keep), (void**)&keep),
      "load");
  for (size_t i = 0; i < n; ++i) {
    keep[i].output = (uint32_t)i;
    keep[i].as = m->param_names[i];
  }
  keep[n] = (pcp_proto_keep_resident_t){(uint32_t)n, "k"};
  keep[n + 1] = (pcp_proto_keep_resident_t){(uint32_t)n + 1, "v"};
  pcp_fabric_task_params_t params = {
      .function = "load",
      .inputs = m->param_sections,
      .input_count = (uint32_t)n,
      .keep_resident = keep,
      .keep_resident_count = (uint32_t)(n + 2),
  };
  pcp_fabric_task_t* task = NULL;
  pcp_status_t status = call(runner, &params, &task);
  pcp_fabric_task_release(task);
  pcp_allocator_free(allocator, keep);
  return status;
}

// One @prefill or @decode over every slot with the staged ids, positions
// (and lengths); the new caches stay resident, the logits come back.
static pcp_status_t runner_step(runner_t* runner, bool prefill) {
  const pcp_infer_model_t* m = runner->model;
  int64_t slots = m->gen.slots;
  int64_t t = prefill ? m->gen.prefill_length : 1;
  pcp_proto_section_t sections[3] = {
      {.name = "input_ids",
       .element_type = PCP_ELEMENT_TYPE_I32,
       .rank = 2,
       .shape = {slots, t},
       .byte_length = (uint64_t)(slots * t) * sizeof(int32_t),
       .data = runner->ids},
      {.name = "positions",
       .element_type = PCP_ELEMENT_TYPE_I32,
       .rank = 1,
       .shape = {slots},
       .byte_length = (uint64_t)slots * sizeof(int32_t),
       .data = runner->positions},
      {.name = "lengths",
       .element_type = PCP_ELEMENT_TYPE_I32,
       .rank = 1,
       .shape = {slots},
       .byte_length = (uint64_t)slots * sizeof(int32_t),
       .data = runner->lengths},
  };
  size_t n = m->table.count;
  pcp_proto_tensor_ref_t refs[PCP_PROTO_MAX_TASK_TENSORS];
  size_t r = 0;
  for (size_t i = 0; i < n; ++i) {
    refs[r++] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                                         .name = m->param_names[i]};
  }
  for (uint32_t i = 0; i < (prefill ? 3u : 2u); ++i) {
    refs[r++] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_SECTION,
                                         .section = i};
  }
  refs[r++] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                                       .name = "k"};
  refs[r++] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                                       .name = "v"};
  static const pcp_proto_keep_resident_t kKeep[2] = {{1, "k"}, {2, "v"}};
  pcp_fabric_task_params_t params = {
      .function = prefill ? "prefill" : "decode",
      .inputs = sections,
      .input_count = prefill ? 3u : 2u,
      .input_refs = refs,
      .input_ref_count = (uint32_t)r,
      .keep_resident = kKeep,
      .keep_resident_count = 2,
  };
  pcp_fabric_task_t* task = NULL;
  PCP_RETURN_IF_ERROR_BARE(call(runner, &params, &task));
  const pcp_proto_section_t* outputs = NULL;
  size_t output_count = 0;
  pcp_status_t status = pcp_fabric_task_outputs(task, &outputs, &output_count);
  size_t want = (size_t)slots * (size_t)m->spec.vocab * sizeof(float);
  if (!status && (output_count < 1 || !outputs[0].data ||
                  outputs[0].element_type != PCP_ELEMENT_TYPE_F32 ||
                  outputs[0].byte_length != want)) {
    status = pcp_make_status(
        PCP_STATUS_INTERNAL, "%s returned no [%lld, %lld] f32 logits",
        params.function, (long long)slots, (long long)m->spec.vocab);
  }
  if (!status) {
    memcpy(runner->logits, outputs[0].data, want);
  }
  pcp_fabric_task_release(task);
  return status;
}

//===----------------------------------------------------------------------===//
// Scheduler
//===----------------------------------------------------------------------===//

static int64_t common_prefix(const int32_t* a, int64_t a_count,
                             const int32_t* b, int64_t b_count) {
  int64_t n = a_count < b_count ? a_count : b_count;
  int64_t i = 0;
  while (i < n && a[i] == b[i]) {
    ++i;
  }
  return i;
}

// Moves waiting requests into free slots. A request with a session key
// takes that session's slot when free (keeping the common prefix of its
// tokens); others take the least recently used free slot.
static void admit(runner_t* runner) {
  pcp_infer_service_t* s = runner->service;
  const pcp_infer_model_t* m = runner->model;
  int64_t slots = m->gen.slots;
  pthread_mutex_lock(&s->mu);
  while (runner->waiting_head) {
    req_t* r = runner->waiting_head;
    int chosen = -1;
    if (r->session[0]) {
      for (int64_t b = 0; b < slots && chosen < 0; ++b) {
        if (!runner->slots[b].req &&
            strcmp(runner->slots[b].session, r->session) == 0) {
          chosen = (int)b;
        }
      }
    }
    for (int64_t b = 0; b < slots && chosen < 0; ++b) {
      if (runner->slots[b].req) {
        continue;
      }
      // Least recently used, sessionless slots first.
      int best = -1;
      for (int64_t c = 0; c < slots; ++c) {
        slot_t* sc = &runner->slots[c];
        if (sc->req)
          continue;
        if (best < 0) {
          best = (int)c;
          continue;
        }
        slot_t* sb = &runner->slots[best];
        bool c_free = sc->session[0] == 0, b_free = sb->session[0] == 0;
        if ((c_free && !b_free) ||
            (c_free == b_free && sc->last_used < sb->last_used)) {
          best = (int)c;
        }
      }
      chosen = best;
    }
    if (chosen < 0) {
      break;
    }
    runner->waiting_head = r->next;
    if (!runner->waiting_head) {
      runner->waiting_tail = NULL;
    }
    runner->waiting--;
    runner->active++;
    slot_t* slot = &runner->slots[chosen];
    bool same = r->session[0] && strcmp(slot->session, r->session) == 0;
    int64_t keep = same ? common_prefix(slot->tokens, slot->length, r->ids,
                                        r->prompt_count)
                        : 0;
    if (keep >= r->prompt_count) {
      keep = r->prompt_count - 1;  // the last token is fed for its logits
    }
    slot->length = keep;
    slot->req = r;
    slot->last_used = ++runner->tick;
    snprintf(slot->session, sizeof(slot->session), "%s", r->session);
    r->slot = chosen;
    r->prefilled = keep;
    r->cached = keep;
    r->phase = PHASE_PREFILL;
    if (!r->probe) {
      metric(s->waiting, m, -1, false);
      metric(s->running, m, 1, false);
      metric(s->queue, m, (double)(now_ns(s) - r->submitted_ns) / 1e9, true);
      metric(s->prompt_tokens, m, (double)r->prompt_count, false);
      // Only a request with a session can reuse a slot's cache; every
      // prompt is still a lookup, counted in tokens as vLLM does.
      metric(s->prefix_queries, m, (double)r->prompt_count, false);
      metric(s->prefix_hits, m, (double)keep, false);
    }
  }
  pthread_mutex_unlock(&s->mu);
}

// Ends every request of the runner (active and waiting) with |status|.
static void fail_all(runner_t* runner, pcp_status_t status) {
  pcp_infer_service_t* s = runner->service;
  for (int64_t b = 0; b < runner->model->gen.slots; ++b) {
    req_t* r = runner->slots[b].req;
    if (r) {
      req_finish(runner, r, pcp_status_clone(status), PCP_FINISH_REASON_NONE);
    }
  }
  pthread_mutex_lock(&s->mu);
  req_t* list = runner->waiting_head;
  runner->waiting_head = runner->waiting_tail = NULL;
  uint32_t n = runner->waiting;
  runner->waiting = 0;
  pthread_cond_broadcast(&s->idle_cv);
  pthread_mutex_unlock(&s->mu);
  while (list) {
    req_t* r = list;
    list = r->next;
    if (!r->probe && n) {
      metric(s->waiting, r->model, -1, false);
    }
    req_finish(runner, r, pcp_status_clone(status), PCP_FINISH_REASON_NONE);
  }
  pcp_status_ignore(status);
}

// Publishes what the slots hold for the KV-cache usage gauge. A slot keeps
// its tokens after its request ends (the next request of the session may
// reuse them), so they count as in use until overwritten.
static void kv_tokens_update(runner_t* runner) {
  int64_t total = 0;
  for (int64_t b = 0; b < runner->model->gen.slots; ++b) {
    total += runner->slots[b].length;
  }
  atomic_store(&runner->kv_tokens, total);
}

// Collector: per served model, the tokens its runners' slots hold over the
// positions they have (slots x max_length).
static void kv_usage_collect(void* user_data, pcp_obs_registry_t* registry) {
  (void)registry;
  pcp_infer_service_t* s = user_data;
  pthread_mutex_lock(&s->mu);
  for (size_t i = 0; i < s->model_count; ++i) {
    const version_t* v = s->models[i].current;
    if (!v || !v->model) {
      continue;
    }
    double used = 0, capacity = 0;
    for (runner_t* r = s->runners; r; r = r->next) {
      if (r->entry != &s->models[i] || atomic_load(&r->state) != RUNNER_READY) {
        continue;
      }
      used += (double)atomic_load(&r->kv_tokens);
      capacity +=
          (double)r->model->gen.slots * (double)r->model->gen.max_length;
    }
    const char* labels[] = {v->model->name};
    pcp_obs_family_set(s->kv_usage, labels, capacity > 0 ? used / capacity : 0);
  }
  pthread_mutex_unlock(&s->mu);
}

// One scheduling round: prefill chunks for slots that are prefilling, then
// one decode step for every slot that has a token to feed.
static pcp_status_t round_run(runner_t* runner) {
  const pcp_infer_model_t* m = runner->model;
  int64_t slots = m->gen.slots;
  int64_t p = m->gen.prefill_length;
  bool any = false;
  memset(runner->ids, 0, (size_t)(slots * p) * sizeof(int32_t));
  for (int64_t b = 0; b < slots; ++b) {
    slot_t* slot = &runner->slots[b];
    runner->positions[b] = (int32_t)slot->length;
    runner->lengths[b] = 0;
    req_t* r = slot->req;
    if (r && r->phase == PHASE_PREFILL) {
      int64_t chunk = r->prompt_count - r->prefilled;
      chunk = chunk < p ? chunk : p;
      memcpy(runner->ids + b * p, r->ids + r->prefilled,
             (size_t)chunk * sizeof(int32_t));
      runner->lengths[b] = (int32_t)chunk;
      any = true;
    }
  }
  if (any) {
    PCP_RETURN_IF_ERROR(runner_step(runner, true), "prefill");
    for (int64_t b = 0; b < slots; ++b) {
      slot_t* slot = &runner->slots[b];
      req_t* r = slot->req;
      if (!r || r->phase != PHASE_PREFILL) {
        continue;
      }
      int64_t chunk = runner->lengths[b];
      memcpy(slot->tokens + slot->length, r->ids + r->prefilled,
             (size_t)chunk * sizeof(int32_t));
      slot->length += chunk;
      r->prefilled += chunk;
      if (r->prefilled == r->prompt_count) {
        req_token(runner, r, runner->logits + b * m->spec.vocab);
      }
    }
  }
  any = false;
  for (int64_t b = 0; b < slots; ++b) {
    slot_t* slot = &runner->slots[b];
    req_t* r = slot->req;
    runner->positions[b] = (int32_t)slot->length;
    runner->ids[b] = 0;
    if (r && r->phase == PHASE_DECODE) {
      runner->ids[b] = r->next_token;
      any = true;
    }
  }
  if (any) {
    PCP_RETURN_IF_ERROR(runner_step(runner, false), "decode");
    for (int64_t b = 0; b < slots; ++b) {
      slot_t* slot = &runner->slots[b];
      req_t* r = slot->req;
      if (!r || r->phase != PHASE_DECODE) {
        continue;
      }
      slot->tokens[slot->length++] = r->next_token;
      req_token(runner, r, runner->logits + b * m->spec.vocab);
    }
  }
  kv_tokens_update(runner);
  return pcp_ok_status();
}

// Service |mu| held: the runner's version is neither the one served nor
// the one being prepared (a newer export replaced it).
static bool runner_superseded(const runner_t* runner) {
  return (runner->version != runner->entry->current &&
          runner->version != runner->entry->next) ||
         runner->version->cancelled;
}

static void* runner_main(void* opaque) {
  runner_t* runner = opaque;
  pcp_infer_service_t* s = runner->service;
  pcp_log_context_t log = s->options.log;
  pcp_status_t status = runner_load(runner);
  if (status) {
    pcp_log_status(PCP_LOG_WARN, &log, status, "inference load failed");
    pcp_status_format(status, runner->status_text, sizeof(runner->status_text));
    pcp_status_ignore(status);
    atomic_store(&runner->state, RUNNER_DEAD);
    fail_all(runner, pcp_make_status(PCP_STATUS_UNAVAILABLE,
                                     "worker %s could not load the model",
                                     runner->worker_id));
    return NULL;
  }
  PCP_LOG(PCP_LOG_INFO, &log,
          "inference ready model=%s version=%u worker=%s session=%s",
          runner->model->name, runner->version->number, runner->worker_id,
          runner->session_id);
  pthread_mutex_lock(&s->mu);
  atomic_store(&runner->state, RUNNER_READY);
  // The manager promotes a newer version once one of its runners is ready.
  pthread_cond_broadcast(&s->cv);
  version_job_signal(s, runner->version);
  pthread_mutex_unlock(&s->mu);
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (!runner->stop && !runner->waiting_head && runner->active == 0) {
      if (runner_superseded(runner)) {
        // A newer version serves the model and this one holds nothing
        // more: the manager joins the thread and frees the runner.
        PCP_LOG(PCP_LOG_INFO, &log,
                "inference runner retired model=%s version=%u worker=%s",
                runner->model->name, runner->version->number,
                runner->worker_id);
        runner->stop = true;
        pthread_cond_broadcast(&s->cv);
        break;
      }
      pthread_cond_wait(&runner->cv, &s->mu);
    }
    bool stop = runner->stop;
    pthread_mutex_unlock(&s->mu);
    if (stop) {
      fail_all(runner, pcp_make_status(PCP_STATUS_CANCELLED,
                                       "the inference service is stopping"));
      break;
    }
    admit(runner);
    status = round_run(runner);
    if (status) {
      pcp_log_status(PCP_LOG_WARN, &log, status, "inference step failed");
      pcp_status_format(status, runner->status_text,
                        sizeof(runner->status_text));
      fail_all(runner, status);
      // Session tensors may be gone or stale after a failed call: this
      // runner ends and the manager starts a fresh one (a new @load).
      atomic_store(&runner->state, RUNNER_DEAD);
      break;
    }
    if (s->step_delay_ms > 0) {
      pcp_sleep_ms(s->step_delay_ms);
    }
  }
  return NULL;
}

static void runner_free(runner_t* runner) {
  if (runner->thread_started) {
    pthread_cond_destroy(&runner->cv);
  }
  pcp_allocator_t allocator = runner->service->allocator;
  if (runner->slots) {
    for (int64_t b = 0; b < runner->model->gen.slots; ++b) {
      pcp_allocator_free(allocator, runner->slots[b].tokens);
    }
  }
  pcp_allocator_free(allocator, runner->slots);
  pcp_allocator_free(allocator, runner->ids);
  pcp_allocator_free(allocator, runner->positions);
  pcp_allocator_free(allocator, runner->lengths);
  pcp_allocator_free(allocator, runner->logits);
  pcp_allocator_free(allocator, runner);
}

// A runner whose thread was joined: drops its version reference (|mu|
// taken here) and frees it.
static void runner_dispose(runner_t* runner) {
  pcp_infer_service_t* s = runner->service;
  version_t* v = runner->version;
  runner_free(runner);  // reads the model's slot count: before the release
  pthread_mutex_lock(&s->mu);
  version_release(v);
  pthread_mutex_unlock(&s->mu);
}

// Service |mu| held.
static pcp_status_t runner_start(
    pcp_infer_service_t* s, model_entry_t* e, version_t* v,
    const char* worker_id, const uint8_t program[PCP_SHA256_BYTE_LENGTH]) {
  const pcp_infer_model_t* m = v->model;
  runner_t* runner = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(s->allocator, sizeof(*runner), (void**)&runner),
      "runner");
  runner->service = s;
  runner->entry = e;
  runner->version = v;
  runner->model = m;
  snprintf(runner->worker_id, sizeof(runner->worker_id), "%s", worker_id);
  // The worker session: "infer:<name>", or "infer:<name>#<k>" while another
  // runner of the model on this worker (an old version finishing its
  // requests) still holds that one. Taking the lowest free k reuses the
  // sessions of runners that are gone (the new @load overwrites their
  // resident tensors), so reloads do not pile sessions up on a worker.
  for (uint32_t k = 0;; ++k) {
    if (k == 0) {
      snprintf(runner->session_id, sizeof(runner->session_id), "infer:%s",
               m->name);
    } else {
      snprintf(runner->session_id, sizeof(runner->session_id), "infer:%s#%u",
               m->name, k);
    }
    bool taken = false;
    for (runner_t* r = s->runners; r && !taken; r = r->next) {
      taken = r->entry == e && strcmp(r->worker_id, worker_id) == 0 &&
              strcmp(r->session_id, runner->session_id) == 0;
    }
    if (!taken) {
      break;
    }
  }
  memcpy(runner->program, program, PCP_SHA256_BYTE_LENGTH);
  size_t slots = (size_t)m->gen.slots;
  pcp_allocator_t allocator = s->allocator;
  pcp_status_t status = pcp_allocator_calloc(allocator, slots * sizeof(slot_t),
                                             (void**)&runner->slots);
  if (!status) {
    status = pcp_allocator_calloc(
        allocator, slots * (size_t)m->gen.prefill_length * sizeof(int32_t),
        (void**)&runner->ids);
  }
  if (!status) {
    status = pcp_allocator_calloc(allocator, slots * sizeof(int32_t),
                                  (void**)&runner->positions);
  }
  if (!status) {
    status = pcp_allocator_calloc(allocator, slots * sizeof(int32_t),
                                  (void**)&runner->lengths);
  }
  if (!status) {
    status = pcp_allocator_calloc(allocator,
                                  slots * (size_t)m->spec.vocab * sizeof(float),
                                  (void**)&runner->logits);
  }
  for (size_t b = 0; !status && b < slots; ++b) {
    status = pcp_allocator_calloc(allocator,
                                  (size_t)m->gen.max_length * sizeof(int32_t),
                                  (void**)&runner->slots[b].tokens);
  }
  if (status) {
    runner_free(runner);
    return pcp_status_annotate_f(status, "runner");
  }
  atomic_store(&runner->state, RUNNER_LOADING);
  pthread_cond_init(&runner->cv, NULL);
  if (pthread_create(&runner->thread, NULL, runner_main, runner) != 0) {
    pthread_cond_destroy(&runner->cv);
    runner_free(runner);
    return pcp_make_status(PCP_STATUS_UNAVAILABLE, "runner thread");
  }
  runner->thread_started = true;
  version_retain(v);
  runner->next = s->runners;
  s->runners = runner;
  version_job_signal(s, v);
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Models: scan, load, compile
//===----------------------------------------------------------------------===//

// Service |mu| held: |v| (with the caller's reference, taken) becomes the
// entry's next version, replacing one still being prepared.
static void entry_next_set(pcp_infer_service_t* s, model_entry_t* e,
                           version_t* v) {
  version_t* old = e->next;
  e->next = v;
  if (old) {
    PCP_LOG(PCP_LOG_INFO, &s->options.log,
            "model version dropped before it was served name=%s version=%u",
            old->model->name, old->number);
    if (v) {
      old->replaced_by = v->number;
    }
    version_job_signal(s, old);
    version_release(old);
  }
  if (!v && e->current->cancelled) {
    // No next and the current's job was cancelled: no version is left to
    // serve, so the model is withdrawn (as in pcp_infer_service_job_cancel
    // for an only version).
    e->withdrawn = true;
  }
  version_job_signal(s, v);
  // Runners of a replaced version retire once idle.
  for (runner_t* r = s->runners; r; r = r->next) {
    if (r->entry == e) {
      pthread_cond_signal(&r->cv);
    }
  }
  pthread_cond_broadcast(&s->cv);
}

// Service |mu| held, with a runner attached (options.kind): whether the
// model.json |m| may be served, and its job's id in |id|. The id is
// deterministic over (dir, model.json identity), so the scan after a
// gateway restart finds the job the runner recovered instead of making a
// second one. False when that job ended (cancelled, failed, replaced):
// that model.json is not served again; a new model.json is a new job.
// |*out_exists|: the job is stored already (not submitted again).
static bool version_job_admit(pcp_infer_service_t* s,
                              const pcp_infer_model_t* m,
                              char id[PCP_INFER_JOB_ID_MAX_LENGTH + 1],
                              bool* out_exists) {
  *out_exists = false;
  id[0] = 0;
  if (!s->options.kind) {
    return true;
  }
  pcp_infer_job_id_make(m->dir, m->json_inode, m->json_mtime_ns, m->json_size,
                        id);
  pcp_store_job_t job;
  pcp_status_t status = pcp_store_job_get(s->options.kind->store, id, &job);
  if (status) {
    // NOT_FOUND: a new version, submitted once it exists.
    pcp_status_ignore(status);
    return true;
  }
  pcp_store_job_state_t state = job.state;
  pcp_store_job_deinitialize(&job);
  *out_exists = true;
  if (pcp_store_job_state_is_terminal(state)) {
    PCP_LOG(PCP_LOG_INFO, &s->options.log,
            "model directory skipped name=%s dir=%s: its job %s ended %s",
            m->name, m->dir, id, pcp_store_job_state_name(state));
    return false;
  }
  return true;
}

// Service |mu| held: |v| gets the job |id| (from version_job_admit),
// submitted queued unless |exists|. A store error leaves the version
// served without a job (serving does not depend on the store).
static void version_job_submit(pcp_infer_service_t* s, version_t* v,
                               const char* id, bool exists, bool pinned) {
  if (!s->options.kind || !id[0]) {
    return;
  }
  const pcp_infer_model_t* m = v->model;
  pcp_status_t status = pcp_ok_status();
  if (!exists) {
    json_t* spec =
        json_pack("{s:s, s:s, s:i, s:I, s:b}", "name", m->name, "dir", m->dir,
                  "version", (int)v->number, "outer_step",
                  (json_int_t)m->outer_step, "pinned", pinned);
    if (spec && m->job_id[0]) {
      json_object_set_new(spec, "job_id", json_string(m->job_id));
    }
    status = spec ? pcp_workloads_runner_job_submit(s->options.kind->runner, id,
                                                    "inference", spec, NULL,
                                                    NULL, NULL)
                  : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "oom");
    json_decref(spec);
  }
  if (status) {
    pcp_log_status(PCP_LOG_WARN, &s->options.log, status,
                   "inference job not stored; the version is served anyway");
    pcp_status_ignore(status);
    return;
  }
  snprintf(v->job_id, sizeof(v->job_id), "%s", id);
  pcp_workloads_runner_wake(s->options.kind->runner);
}

// Service |mu| held. Reads |dir|/model.json if it is new or changed. A
// model.json naming a model already known is a newer version of it when it
// comes from the directory that model is served from (a training job's
// later checkpoint) or from another directory whose model.json is newer (a
// new job with the same name); an older one elsewhere is skipped.
static void dir_consider(pcp_infer_service_t* s, const char* dir, bool pinned) {
  char path[PCP_INFER_MAX_PATH + 16];
  snprintf(path, sizeof(path), "%s/model.json", dir);
  struct stat st;
  if (stat(path, &st) != 0) {
    return;
  }
  int64_t mtime_ns =
      (int64_t)st.st_mtim.tv_sec * 1000000000 + (int64_t)st.st_mtim.tv_nsec;
  size_t seen = s->seen_count;
  for (size_t i = 0; i < s->seen_count; ++i) {
    if (strcmp(s->seen_dirs[i], dir) == 0) {
      if (s->seen_stamp[i].inode == (uint64_t)st.st_ino &&
          s->seen_stamp[i].mtime_ns == mtime_ns &&
          s->seen_stamp[i].size == (int64_t)st.st_size) {
        return;
      }
      seen = i;
    }
  }
  if (seen == s->seen_count) {
    if (s->seen_count >= PCP_INFER_MAX_MODELS) {
      return;
    }
    s->seen_count++;
  }
  snprintf(s->seen_dirs[seen], sizeof(s->seen_dirs[seen]), "%s", dir);
  s->seen_stamp[seen].inode = (uint64_t)st.st_ino;
  s->seen_stamp[seen].mtime_ns = mtime_ns;
  s->seen_stamp[seen].size = (int64_t)st.st_size;
  // The system allocator: pcp_infer_model_free's contract (model_dir.c).
  pcp_infer_model_t* m = NULL;
  pcp_status_t allocated =
      pcp_allocator_calloc(pcp_allocator_system(), sizeof(*m), (void**)&m);
  if (allocated) {
    pcp_status_ignore(allocated);
    return;
  }
  pcp_status_t status = pcp_infer_model_json_load(dir, m);
  model_entry_t* e = NULL;
  for (size_t i = 0; i < s->model_count && !e; ++i) {
    model_entry_t* c = &s->models[i];
    if (status ? strcmp(c->current->model->dir, dir) == 0
               : strcmp(c->current->model->name, m->name) == 0) {
      e = &s->models[i];
    }
  }
  if (status) {
    // A rewrite that broke model.json: the version served stays, and the
    // listing says why the new one is not.
    if (e) {
      pcp_status_format(status, e->reload_error, sizeof(e->reload_error));
      metric_reload(s, e->current->model, false);
    }
    pcp_log_status(PCP_LOG_WARN, &s->options.log, status,
                   "model directory skipped");
    pcp_status_ignore(status);
    pcp_infer_model_free(m);
    return;
  }
  char job_id[PCP_INFER_JOB_ID_MAX_LENGTH + 1];
  bool job_exists = false;
  if (!version_job_admit(s, m, job_id, &job_exists)) {
    pcp_infer_model_free(m);
    return;
  }
  if (e) {
    const pcp_infer_model_t* served = e->current->model;
    bool same_dir = strcmp(served->dir, dir) == 0 ||
                    (e->next && strcmp(e->next->model->dir, dir) == 0);
    // A withdrawn model (its job cancelled) comes back with any new
    // model.json of its name.
    if (!same_dir && !e->withdrawn &&
        m->json_mtime_ns <= served->json_mtime_ns) {
      PCP_LOG(PCP_LOG_INFO, &s->options.log,
              "model directory skipped name=%s dir=%s: a newer model.json "
              "from %s serves it",
              m->name, dir, served->dir);
      pcp_infer_model_free(m);
      return;
    }
    version_t* v = version_create(s->allocator, m, ++e->versions);
    if (!v) {
      return;
    }
    version_job_submit(s, v, job_id, job_exists, pinned);
    e->pinned = e->pinned || pinned;
    if (e->current->state == MODEL_FAILED || e->current->state == MODEL_NEW ||
        e->withdrawn) {
      // Nothing serves the current version yet (it failed or is still
      // loading, or its job was cancelled): the new one takes its place at
      // once. A load in progress holds its own reference.
      PCP_LOG(PCP_LOG_INFO, &s->options.log,
              "model dir changed, reloading name=%s version=%u dir=%s", m->name,
              v->number, dir);
      version_t* old = e->current;
      e->current = v;
      e->withdrawn = false;
      if (!old->cancelled) {
        old->replaced_by = v->number;
      }
      version_job_signal(s, old);
      version_release(old);
      entry_next_set(s, e, NULL);
      return;
    }
    PCP_LOG(PCP_LOG_INFO, &s->options.log,
            "model export found, preparing name=%s version=%u dir=%s "
            "outer_step=%lld",
            m->name, v->number, dir, (long long)m->outer_step);
    entry_next_set(s, e, v);
    return;
  }
  if (s->model_count >= PCP_INFER_MAX_MODELS) {
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "more than %d models", PCP_INFER_MAX_MODELS);
    pcp_log_status(PCP_LOG_WARN, &s->options.log, status,
                   "model directory skipped");
    pcp_status_ignore(status);
    pcp_infer_model_free(m);
    return;
  }
  version_t* v = version_create(s->allocator, m, 1);
  if (!v) {
    return;
  }
  e = &s->models[s->model_count++];
  memset(e, 0, sizeof(*e));
  e->current = v;
  e->versions = 1;
  e->pinned = pinned;
  version_job_submit(s, v, job_id, job_exists, pinned);
  PCP_LOG(PCP_LOG_INFO, &s->options.log, "model found name=%s dir=%s", m->name,
          dir);
  pthread_cond_broadcast(&s->cv);
}

static void scan_locked(pcp_infer_service_t* s) {
  s->last_scan_ns = now_ns(s);
  for (size_t i = 0; i < s->model_dir_count; ++i) {
    dir_consider(s, s->model_dirs[i], true);
  }
  if (!s->models_root[0]) {
    return;
  }
  DIR* d = opendir(s->models_root);
  if (!d) {
    return;
  }
  struct dirent* ent;
  while ((ent = readdir(d)) != NULL) {
    if (ent->d_name[0] == '.') {
      continue;
    }
    char dir[PCP_INFER_MAX_PATH];
    int n = snprintf(dir, sizeof(dir), "%s/%s", s->models_root, ent->d_name);
    if (n > 0 && (size_t)n < sizeof(dir)) {
      dir_consider(s, dir, false);
    }
  }
  closedir(d);
}

void pcp_infer_service_scan(pcp_infer_service_t* s) {
  pthread_mutex_lock(&s->mu);
  scan_locked(s);
  pthread_mutex_unlock(&s->mu);
}

void pcp_infer_service_dir_notify(pcp_infer_service_t* s, const char* dir) {
  if (!s || !dir || strlen(dir) >= PCP_INFER_MAX_PATH) {
    return;
  }
  pthread_mutex_lock(&s->mu);
  bool pinned = false;
  for (size_t i = 0; i < s->model_dir_count; ++i) {
    pinned = pinned || strcmp(s->model_dirs[i], dir) == 0;
  }
  if (!s->stopping) {
    dir_consider(s, dir, pinned);
  }
  pthread_mutex_unlock(&s->mu);
}

// Manager thread, without |mu|: the program of |m| for (backend, target),
// through the compile queue: the generation module is written under the
// artifact directory (named by its hash) and compiled by a child.
static pcp_status_t model_compile(pcp_infer_service_t* s,
                                  const pcp_infer_model_t* m,
                                  const char* backend, const char* target,
                                  uint8_t out_hash[PCP_SHA256_BYTE_LENGTH]) {
  pcp_compile_backend_t cb;
  PCP_RETURN_IF_ERROR_BARE(pcp_compile_backend_parse(backend, &cb));
  const char* dir =
      s->artifact_dir[0] ? s->artifact_dir : pcp_compile_default_cache_dir();
  pcp_workloads_compile_queue_t* queue = s->options.compile_queue;
  pcp_status_t status = pcp_ok_status();
  if (!queue && !s->own_queue) {
    pcp_workloads_compile_queue_options_t queue_options = {
        .pcp_path = "/proc/self/exe",
        .artifact_dir = dir,
        .slot_count = 1,
        .clock = s->clock,
        .log = s->options.log,
    };
    status = pcp_workloads_compile_queue_create(&queue_options, s->allocator,
                                                &s->own_queue);
  }
  if (!queue) {
    queue = s->own_queue;
  }
  pcp_string_builder_t text;
  pcp_string_builder_initialize(s->allocator, PCP_COMPILE_MAX_MLIR_BYTES,
                                &text);
  if (!status) {
    status = pcp_models_generation_module_emit(&m->spec, &m->gen, &text);
  }
  char hex[PCP_SHA256_HEX_LENGTH + 1] = {0};
  char path[PCP_INFER_MAX_PATH + 96];
  if (!status) {
    pcp_sha256_t digest;
    pcp_sha256_compute(text.data, text.size, &digest);
    pcp_sha256_to_hex(&digest, hex);
    snprintf(path, sizeof(path), "%.*s/generate-%.32s.mlir", PCP_INFER_MAX_PATH,
             dir, hex);
    status = pcp_file_make_directories(dir);
    if (!status && !pcp_file_exists(path)) {
      status = pcp_file_write_atomic(path, text.data, text.size);
    }
  }
  pcp_string_builder_deinitialize(&text);
  pcp_workloads_compile_spec_t spec = {
      .mlir_path = path,
      .content_hash = hex,
      .backend = backend,
      .target = target,
      .label = m->name,
  };
  pcp_workloads_compile_request_t* request = NULL;
  if (!status) {
    status = pcp_workloads_compile_queue_submit(queue, &spec, &request);
  }
  if (!status) {
    pthread_mutex_lock(&s->mu);
    s->compiling = request;
    if (s->stopping) {
      pcp_workloads_compile_request_cancel(request);
    }
    pthread_mutex_unlock(&s->mu);
    status = pcp_workloads_compile_request_wait(request);
    pthread_mutex_lock(&s->mu);
    s->compiling = NULL;
    pthread_mutex_unlock(&s->mu);
  }
  void* vmfb = NULL;
  size_t length = 0;
  if (!status) {
    status = pcp_file_read_all(pcp_workloads_compile_request_vmfb_path(request),
                               (size_t)1 << 30, &vmfb, &length);
  }
  if (!status) {
    PCP_LOG(PCP_LOG_INFO, &s->options.log,
            "inference program ready model=%s backend=%s target=%s "
            "cache_hit=%d",
            m->name, backend, target,
            pcp_workloads_compile_request_cache_hit(request));
    status = pcp_fabric_program_register(s->options.fabric, vmfb, length,
                                         backend, target, out_hash);
  }
  pcp_allocator_free(pcp_allocator_system(), vmfb);  // pcp_file_read_all
  pcp_workloads_compile_request_release(request);
  return status;
}

//===----------------------------------------------------------------------===//
// Submit and route
//===----------------------------------------------------------------------===//

static model_entry_t* model_find(pcp_infer_service_t* s, const char* name) {
  for (size_t i = 0; i < s->model_count; ++i) {
    if (!s->models[i].withdrawn &&
        strcmp(s->models[i].current->model->name, name) == 0) {
      return &s->models[i];
    }
  }
  return NULL;
}

// Service |mu| held: runners of |v| that take requests.
static uint32_t runners_serving(pcp_infer_service_t* s, const version_t* v) {
  uint32_t n = 0;
  for (runner_t* r = s->runners; r && !v->cancelled; r = r->next) {
    if (r->version == v && atomic_load(&r->state) == RUNNER_READY && !r->stop) {
      ++n;
    }
  }
  return n;
}

// Service |mu| held: |r| takes requests (ready, not stopping, of the
// version its model serves now).
static bool runner_serving(const runner_t* r) {
  return atomic_load(&r->state) == RUNNER_READY && !r->stop &&
         r->version == r->entry->current && !r->version->cancelled;
}

// Service |mu| held: the runner of version |v| for a request.
static runner_t* route(pcp_infer_service_t* s, const version_t* v,
                       const char* session) {
  runner_t* best = NULL;
  for (runner_t* r = s->runners; r; r = r->next) {
    if (r->version != v || atomic_load(&r->state) != RUNNER_READY || r->stop ||
        v->cancelled) {
      continue;
    }
    if (session && session[0]) {
      // Sticky: the worker whose slot holds this session (read without the
      // scheduler's ownership: a stale answer only costs the prefix reuse).
      for (int64_t b = 0; b < v->model->gen.slots; ++b) {
        if (strcmp(r->slots[b].session, session) == 0) {
          return r;
        }
      }
    }
    if (!best || r->waiting + r->active < best->waiting + best->active) {
      best = r;
    }
  }
  return best;
}

static pcp_status_t req_create(pcp_allocator_t allocator,
                               const pcp_infer_model_t* m,
                               const pcp_infer_request_params_t* params,
                               const int32_t* ids, size_t id_count,
                               req_t** out) {
  *out = NULL;
  req_t* r = NULL;
  PCP_RETURN_IF_ERROR(pcp_allocator_calloc(allocator, sizeof(*r), (void**)&r),
                      "request");
  r->allocator = allocator;
  r->model = m;
  r->slot = -1;
  r->on_text = params->on_text;
  r->on_done = params->on_done;
  r->user_data = params->user_data;
  r->on_token = params->on_token;
  r->top_logprobs = params->top_logprobs;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &r->token_bytes);
  if (params->session_key) {
    snprintf(r->session, sizeof(r->session), "%s", params->session_key);
  }
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &r->text);
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &r->shown);
  pcp_tokenizer_decode_stream_initialize(
      m->bpe, PCP_TOKENIZER_DECODE_FLAG_SKIP_SPECIAL, &r->decode);
  pcp_status_t status = pcp_allocator_calloc(
      allocator, ((size_t)m->gen.max_length + 1) * sizeof(int32_t),
      (void**)&r->ids);
  if (status) {
    req_free(r);
    return pcp_status_annotate_f(status, "request");
  }
  memcpy(r->ids, ids, id_count * sizeof(int32_t));
  r->prompt_count = r->count = (int64_t)id_count;
  int64_t max_tokens = params->max_tokens
                           ? params->max_tokens
                           : m->gen.max_length - (int64_t)id_count;
  const char* stops[PCP_STOP_MAX_SEQUENCES];
  size_t stop_count = 0;
  for (size_t i = 0; i < params->stop_count && stop_count < 12; ++i) {
    stops[stop_count++] = params->stop[i];
  }
  for (size_t i = 0; i < m->stop_count; ++i) {
    stops[stop_count++] = m->stop[i];
  }
  status = pcp_sampler_initialize(&params->sampling, m->spec.vocab,
                                  pcp_allocator_system(), &r->sampler);
  if (!status) {
    status =
        pcp_stop_state_initialize(max_tokens, m->eos_ids, m->eos_count, stops,
                                  stop_count, pcp_allocator_system(), &r->stop);
  }
  if (status) {
    req_free(r);
    return status;
  }
  *out = r;
  return pcp_ok_status();
}

// Service |mu| held. Queues |r| on |runner| (at the head for a probe).
static void enqueue(pcp_infer_service_t* s, runner_t* runner, req_t* r) {
  r->runner = runner;
  r->submitted_ns = now_ns(s);
  if (r->probe) {
    r->next = runner->waiting_head;
    runner->waiting_head = r;
    if (!runner->waiting_tail) {
      runner->waiting_tail = r;
    }
  } else {
    if (runner->waiting_tail) {
      runner->waiting_tail->next = r;
    } else {
      runner->waiting_head = r;
    }
    runner->waiting_tail = r;
    metric(s->waiting, r->model, 1, false);
  }
  runner->waiting++;
  pthread_cond_signal(&runner->cv);
}

// One attempt of pcp_infer_request_submit on the version served now.
// UNAVAILABLE with |*out_retry| set when a newer version took over while
// the prompt was encoded (the runners of the encoded one take no more).
static pcp_status_t submit_once(pcp_infer_service_t* s,
                                const pcp_infer_request_params_t* params,
                                int64_t* out_prompt_tokens, bool* out_retry) {
  *out_retry = false;
  pthread_mutex_lock(&s->mu);
  model_entry_t* e = model_find(s, params->model);
  if (!e) {
    scan_locked(s);
    e = model_find(s, params->model);
  }
  version_t* v = e ? e->current : NULL;
  pcp_status_t status = pcp_ok_status();
  if (s->refusing) {
    status = pcp_make_status(PCP_STATUS_UNAVAILABLE,
                             "the inference service is stopping");
  } else if (!e) {
    status = pcp_make_status(PCP_STATUS_NOT_FOUND,
                             "The model `%s` does not exist.", params->model);
  } else if (v->state == MODEL_FAILED) {
    status =
        pcp_make_status(PCP_STATUS_UNAVAILABLE, "model %s failed to load: %s",
                        params->model, v->error);
  } else if (v->state != MODEL_LOADED || runners_serving(s, v) == 0) {
    status = pcp_make_status(PCP_STATUS_UNAVAILABLE,
                             "model %s is not being served by any worker yet",
                             params->model);
  }
  // The version's record is immutable once loaded; the reference keeps it
  // while the prompt is encoded without the lock.
  if (!status) {
    version_retain(v);
  }
  pthread_mutex_unlock(&s->mu);
  PCP_RETURN_IF_ERROR_BARE(status);
  const pcp_infer_model_t* m = v->model;

  pcp_tokenizer_id_list_t ids;
  pcp_tokenizer_id_list_initialize(pcp_allocator_system(), &ids);
  status = pcp_infer_model_encode(m, params, &ids);
  if (!status && ids.count == 0) {
    status =
        pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "%s: the prompt is empty",
                        params->chat ? "messages" : "prompt");
  }
  int64_t n = (int64_t)ids.count;
  if (out_prompt_tokens) {
    *out_prompt_tokens = n;
  }
  if (!status &&
      (n >= m->gen.max_length || n + params->max_tokens > m->gen.max_length)) {
    status = pcp_make_status(
        PCP_STATUS_OUT_OF_RANGE,
        "This model's maximum context length is %lld tokens. However, you "
        "requested %lld tokens (%lld in the messages, %lld in the "
        "completion). Please reduce the length of the messages or "
        "completion.",
        (long long)m->gen.max_length,
        (long long)(n + (params->max_tokens ? params->max_tokens : 1)),
        (long long)n, (long long)(params->max_tokens ? params->max_tokens : 1));
  }
  req_t* r = NULL;
  if (!status) {
    status = req_create(s->allocator, m, params, ids.values, ids.count, &r);
  }
  pcp_tokenizer_id_list_deinitialize(&ids);

  pthread_mutex_lock(&s->mu);
  if (!status) {
    runner_t* runner = route(s, v, r->session);
    if (!runner) {
      // A newer version took over meanwhile (its tokenizer may differ:
      // encode again), or the last worker went away.
      *out_retry = e->current != v;
      status = pcp_make_status(PCP_STATUS_UNAVAILABLE,
                               "model %s is not being served by any worker",
                               params->model);
    } else if (runner->waiting >= s->options.max_waiting_per_worker) {
      status =
          pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                          "too many requests waiting for model %s (%u "
                          "per worker); retry later",
                          params->model, s->options.max_waiting_per_worker);
    } else {
      enqueue(s, runner, r);
      r = NULL;
    }
  }
  // A request not queued reads the record while it is freed.
  req_free(r);
  version_release(v);
  pthread_mutex_unlock(&s->mu);
  return status;
}

pcp_status_t pcp_infer_request_submit(pcp_infer_service_t* s,
                                      const pcp_infer_request_params_t* params,
                                      int64_t* out_prompt_tokens) {
  if (out_prompt_tokens) {
    *out_prompt_tokens = 0;
  }
  if (!params->model || !params->on_text || !params->on_done) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "model: required");
  }
  if (params->top_logprobs > PCP_SAMPLER_MAX_TOP_LOGPROBS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "top_logprobs: must be in [0, %d], not %u",
                           PCP_SAMPLER_MAX_TOP_LOGPROBS, params->top_logprobs);
  }
  // A version switch between encoding and routing is rare (one per
  // export); a few tries cover back-to-back exports.
  pcp_status_t status = pcp_ok_status();
  for (int attempt = 0; attempt < 4; ++attempt) {
    bool retry = false;
    pcp_status_ignore(status);
    status = submit_once(s, params, out_prompt_tokens, &retry);
    if (!retry) {
      break;
    }
  }
  return status;
}

//===----------------------------------------------------------------------===//
// Readiness probe
//===----------------------------------------------------------------------===//

static bool probe_text(void* user_data, const char* text, size_t length) {
  (void)user_data;
  (void)text;
  (void)length;
  return true;
}

static void probe_done(void* user_data, const pcp_infer_result_t* result) {
  pcp_infer_service_t* s = user_data;
  pthread_mutex_lock(&s->mu);
  s->probe_in_flight = false;
  if (result->status == 0 && result->completion_tokens >= 1) {
    s->probe_ok_ns = now_ns(s);
    s->probe_failed = false;
    s->probe_error[0] = 0;
  } else {
    s->probe_failed = true;
    if (result->status) {
      pcp_status_format(result->status, s->probe_error, sizeof(s->probe_error));
    }
  }
  pthread_mutex_unlock(&s->mu);
}

// Service |mu| held: queues a one-token prompt with two tokens to generate
// (one @prefill and one @decode) on the next ready runner.
static void probe_start(pcp_infer_service_t* s) {
  size_t count = 0;
  for (runner_t* r = s->runners; r; r = r->next) {
    if (runner_serving(r))
      ++count;
  }
  if (count == 0) {
    return;
  }
  size_t pick = s->probe_cursor++ % count;
  runner_t* runner = NULL;
  for (runner_t* r = s->runners; r; r = r->next) {
    if (runner_serving(r) && pick-- == 0) {
      runner = r;
      break;
    }
  }
  // Real traffic stands in for the probe: a request this runner ended with
  // a token within the interval took the same path (gateway -> worker ->
  // @prefill, the same session) and proves what the probe would. A probe
  // on a busy runner only competes with that traffic: a request arriving
  // during it waited for the probe's @prefill and @decode, the largest
  // outliers of bench/gateway_overhead's time to first token.
  int64_t t = now_ns(s);
  if (runner->served_ok_ns > 0 &&
      t - runner->served_ok_ns < s->options.probe_interval_ms * 1000000) {
    s->probe_ok_ns = runner->served_ok_ns;
    s->probe_failed = false;
    s->probe_error[0] = 0;
    return;
  }
  pcp_infer_request_params_t params = {
      .max_tokens = 2,
      .on_text = probe_text,
      .on_done = probe_done,
      .user_data = s,
  };
  pcp_sampling_params_initialize(&params.sampling);
  int32_t token = 0;
  req_t* r = NULL;
  pcp_status_t status =
      req_create(s->allocator, runner->model, &params, &token, 1, &r);
  if (status) {
    pcp_status_ignore(status);
    return;
  }
  r->probe = true;
  s->probe_in_flight = true;
  s->probe_started_ns = now_ns(s);
  enqueue(s, runner, r);
}

void pcp_infer_service_readiness(pcp_infer_service_t* s,
                                 pcp_infer_readiness_t* out) {
  memset(out, 0, sizeof(*out));
  pthread_mutex_lock(&s->mu);
  uint32_t pinned_waiting = 0;
  for (size_t i = 0; i < s->model_count; ++i) {
    if (s->models[i].withdrawn) {
      continue;  // cancelled through its job: not awaited
    }
    if (runners_serving(s, s->models[i].current) > 0) {
      out->models_ready++;
    } else if (s->models[i].pinned) {
      pinned_waiting++;
    }
  }
  for (runner_t* r = s->runners; r; r = r->next) {
    if (runner_serving(r) && worker_connected(r)) {
      out->schedulers++;
    }
  }
  int64_t t = now_ns(s);
  out->probe_age_ms = s->probe_ok_ns ? (t - s->probe_ok_ns) / 1000000 : -1;
  snprintf(out->last_error, sizeof(out->last_error), "%s", s->probe_error);
  bool stuck = s->probe_in_flight && (t - s->probe_started_ns) / 1000000 >
                                         s->options.probe_max_age_ms;
  // Every --model-dir model is served, and the probe passed recently.
  out->ready = pinned_waiting == 0 && out->schedulers > 0 && s->probe_ok_ns &&
               !s->probe_failed && !stuck &&
               out->probe_age_ms <= s->options.probe_max_age_ms;
  pthread_mutex_unlock(&s->mu);
}

//===----------------------------------------------------------------------===//
// Manager thread
//===----------------------------------------------------------------------===//

// Service |mu| held: the version of |e| with |index| 0 (current) or 1
// (next), or NULL.
static version_t* entry_version(model_entry_t* e, size_t index) {
  return index == 0 ? e->current : e->next;
}

// Loads the weights of new versions (|mu| dropped while reading files).
static void manage_models(pcp_infer_service_t* s) {
  for (;;) {
    pthread_mutex_lock(&s->mu);
    model_entry_t* e = NULL;
    version_t* v = NULL;
    for (size_t i = 0; i < s->model_count && !v; ++i) {
      for (size_t k = 0; k < 2 && !v; ++k) {
        version_t* c = entry_version(&s->models[i], k);
        if (c && c->state == MODEL_NEW && !c->cancelled) {
          e = &s->models[i];
          v = c;
        }
      }
    }
    version_retain(v);
    pthread_mutex_unlock(&s->mu);
    if (!v) {
      return;
    }
    // Only this thread moves a version out of NEW, so it can fill the
    // record without the lock; readers look at it only once LOADED.
    pcp_status_t status = pcp_infer_model_weights_load(v->model);
    pthread_mutex_lock(&s->mu);
    if (status) {
      pcp_log_status(PCP_LOG_WARN, &s->options.log, status,
                     "model load failed");
      version_error_set(v, status);
      pcp_status_ignore(status);
      v->state = MODEL_FAILED;
      if (v == e->next) {
        // The version served stays; the listing says why the new one is
        // not (a directory caught mid-rewrite loads with its next
        // model.json).
        snprintf(e->reload_error, sizeof(e->reload_error), "%s", v->error);
        metric_reload(s, v->model, false);
        entry_next_set(s, e, NULL);
      }
    } else {
      v->state = MODEL_LOADED;
    }
    version_job_signal(s, v);
    version_release(v);
    pthread_mutex_unlock(&s->mu);
  }
}

// Starts a runner per (loaded version, connected worker) that has none,
// compiling the model for the worker's (backend, target) first. A version
// being prepared gets its runners beside the served one's.
static void manage_workers(pcp_infer_service_t* s) {
  enum { kMaxListed = 64 };
  pcp_fabric_worker_info_t* infos = NULL;
  pcp_status_t allocated = pcp_allocator_calloc(
      s->allocator, kMaxListed * sizeof(*infos), (void**)&infos);
  if (allocated) {
    pcp_status_ignore(allocated);
    return;
  }
  uint32_t count =
      pcp_fabric_worker_list(s->options.fabric, infos, kMaxListed, NULL);
  for (uint32_t w = 0; w < count; ++w) {
    if (infos[w].state != PCP_FABRIC_WORKER_CONNECTED) {
      continue;
    }
    // Slot j: model j / 2, its current (even) or next (odd) version.
    for (size_t j = 0;; ++j) {
      pthread_mutex_lock(&s->mu);
      if (j >= 2 * s->model_count || s->stopping) {
        pthread_mutex_unlock(&s->mu);
        break;
      }
      model_entry_t* e = &s->models[j / 2];
      version_t* v = entry_version(e, j % 2);
      // A model that names a worker class runs only there: other workers
      // count as already served (no compile, no runner, no probe).
      bool has = !v || v->state != MODEL_LOADED || v->cancelled ||
                 (v->model->worker_class[0] &&
                  strcmp(v->model->worker_class, infos[w].worker_class) != 0);
      for (runner_t* r = s->runners; r && !has; r = r->next) {
        has = r->version == v && strcmp(r->worker_id, infos[w].worker_id) == 0;
      }
      program_entry_t* prog = NULL;
      for (size_t k = 0; !has && k < v->program_count; ++k) {
        if (strcmp(v->programs[k].backend, infos[w].backend) == 0 &&
            strcmp(v->programs[k].target, infos[w].target) == 0) {
          prog = &v->programs[k];
        }
      }
      if (has || (prog && prog->failed)) {
        pthread_mutex_unlock(&s->mu);
        continue;
      }
      if (prog) {
        pcp_status_t status =
            runner_start(s, e, v, infos[w].worker_id, prog->hash);
        pthread_mutex_unlock(&s->mu);
        if (status) {
          pcp_log_status(PCP_LOG_WARN, &s->options.log, status, "runner");
          pcp_status_ignore(status);
        }
        continue;
      }
      version_retain(v);
      v->compiling++;
      version_job_signal(s, v);
      pthread_mutex_unlock(&s->mu);
      uint8_t hash[PCP_SHA256_BYTE_LENGTH];
      pcp_status_t status =
          model_compile(s, v->model, infos[w].backend, infos[w].target, hash);
      pthread_mutex_lock(&s->mu);
      v->compiling--;
      bool recorded = v->program_count < MAX_PROGRAMS;
      if (recorded) {
        prog = &v->programs[v->program_count++];
        snprintf(prog->backend, sizeof(prog->backend), "%s", infos[w].backend);
        snprintf(prog->target, sizeof(prog->target), "%s", infos[w].target);
        prog->failed = status != 0;
        memcpy(prog->hash, hash, sizeof(hash));
      }
      if (status) {
        pcp_log_status(PCP_LOG_WARN, &s->options.log, status,
                       "inference compile failed");
        version_error_set(v, status);
        v->compile_failed_pass = s->manage_passes;
        v->compile_failure_told = false;
        if (v == e->next) {
          snprintf(e->reload_error, sizeof(e->reload_error), "%s", v->error);
        }
        pcp_status_ignore(status);
      }
      version_job_signal(s, v);
      version_release(v);
      pthread_mutex_unlock(&s->mu);
      if (recorded) {
        --j;  // start the runner on the next pass
      }
    }
  }
  pcp_allocator_free(s->allocator, infos);
  // A pass over every connected worker ended: a version whose compile
  // failed before it has had each worker's target tried; its job looks.
  pthread_mutex_lock(&s->mu);
  s->manage_passes++;
  for (size_t i = 0; i < 2 * s->model_count; ++i) {
    version_t* v = entry_version(&s->models[i / 2], i % 2);
    if (v && v->error_code && !v->compile_failure_told &&
        v->compile_failed_pass < s->manage_passes) {
      v->compile_failure_told = true;
      version_job_signal(s, v);
    }
  }
  pthread_mutex_unlock(&s->mu);
}

// Makes a prepared version the served one as soon as one of its runners is
// ready: new requests go to it from then on, and the old version's runners
// finish what they hold and retire (each is woken to look).
static void promote(pcp_infer_service_t* s) {
  pthread_mutex_lock(&s->mu);
  for (size_t i = 0; i < s->model_count; ++i) {
    model_entry_t* e = &s->models[i];
    version_t* v = e->next;
    bool ready = false;
    for (runner_t* r = s->runners; r && v && !ready; r = r->next) {
      ready =
          r->version == v && atomic_load(&r->state) == RUNNER_READY && !r->stop;
    }
    if (!ready) {
      continue;
    }
    version_t* old = e->current;
    PCP_LOG(PCP_LOG_INFO, &s->options.log,
            "model reloaded name=%s version=%u outer_step=%lld dir=%s "
            "(was version %u)",
            v->model->name, v->number, (long long)v->model->outer_step,
            v->model->dir, old->number);
    e->current = v;
    e->next = NULL;
    e->reload_error[0] = 0;
    e->withdrawn = false;
    metric_reload(s, v->model, true);
    if (!old->cancelled) {
      old->replaced_by = v->number;
    }
    version_job_signal(s, old);
    version_job_signal(s, v);
    version_release(old);
    for (runner_t* r = s->runners; r; r = r->next) {
      if (r->entry == e) {
        pthread_cond_signal(&r->cv);
      }
    }
  }
  pthread_mutex_unlock(&s->mu);
}

// Joins runners that ended (their worker was lost or a call failed).
static void reap(pcp_infer_service_t* s) {
  pthread_mutex_lock(&s->mu);
  runner_t** link = &s->runners;
  runner_t* dead = NULL;
  while (*link) {
    runner_t* r = *link;
    if (atomic_load(&r->state) == RUNNER_DEAD) {
      *link = r->next;
      r->next = dead;
      dead = r;
      version_job_signal(s, r->version);
    } else {
      link = &r->next;
    }
  }
  pthread_mutex_unlock(&s->mu);
  while (dead) {
    runner_t* r = dead;
    dead = r->next;
    pthread_join(r->thread, NULL);
    // Requests may have been queued between the end and the unlink.
    fail_all(r, pcp_make_status(PCP_STATUS_UNAVAILABLE,
                                "inference worker %s is gone", r->worker_id));
    runner_dispose(r);
  }
}

// A runner whose worker was lost while it was idle stops here (a busy one
// notices in its call).
static void watch_workers(pcp_infer_service_t* s) {
  pthread_mutex_lock(&s->mu);
  for (runner_t* r = s->runners; r; r = r->next) {
    if (atomic_load(&r->state) == RUNNER_READY && !r->stop &&
        !worker_connected(r)) {
      r->stop = true;
      pthread_cond_signal(&r->cv);
      PCP_LOG(PCP_LOG_WARN, &s->options.log,
              "inference worker lost model=%s worker=%s", r->model->name,
              r->worker_id);
    }
  }
  pthread_mutex_unlock(&s->mu);
  // Stopped runners end their thread; mark them dead for reap.
  pthread_mutex_lock(&s->mu);
  runner_t* stopped = NULL;
  for (runner_t** link = &s->runners; *link;) {
    runner_t* r = *link;
    if (r->stop && atomic_load(&r->state) != RUNNER_LOADING) {
      *link = r->next;
      r->next = stopped;
      stopped = r;
      version_job_signal(s, r->version);
    } else {
      link = &r->next;
    }
  }
  pthread_mutex_unlock(&s->mu);
  while (stopped) {
    runner_t* r = stopped;
    stopped = r->next;
    pthread_join(r->thread, NULL);
    fail_all(r, pcp_make_status(PCP_STATUS_UNAVAILABLE,
                                "inference worker %s is gone", r->worker_id));
    runner_dispose(r);
  }
}

static void* manager_main(void* opaque) {
  pcp_infer_service_t* s = opaque;
  int64_t next_probe = 0;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
      pthread_mutex_unlock(&s->mu);
      break;
    }
    if (now_ns(s) - s->last_scan_ns > 2000000000) {
      scan_locked(s);
    }
    pthread_mutex_unlock(&s->mu);
    manage_models(s);
    manage_workers(s);
    promote(s);
    watch_workers(s);
    reap(s);
    pthread_mutex_lock(&s->mu);
    int64_t t = now_ns(s);
    if (!s->probe_in_flight && !s->refusing && t >= next_probe) {
      next_probe = t + s->options.probe_interval_ms * 1000000;
      probe_start(s);
    }
    if (!s->stopping) {
      // Wake at least every 200 ms (probe, scans, lost workers).
      struct timespec until = pcp_realtime_deadline_ms(200);
      pthread_cond_timedwait(&s->cv, &s->mu, &until);
    }
    pthread_mutex_unlock(&s->mu);
  }
  return NULL;
}

//===----------------------------------------------------------------------===//
// Versions as jobs (the "inference" kind's run; job.c holds its table)
//===----------------------------------------------------------------------===//

// Service |mu| held: the version whose job is |id| (a model's current or
// next), or NULL; |*out_entry| its model.
static version_t* version_of_job(pcp_infer_service_t* s, const char* id,
                                 model_entry_t** out_entry) {
  for (size_t i = 0; i < s->model_count; ++i) {
    for (size_t k = 0; k < 2; ++k) {
      version_t* v = entry_version(&s->models[i], k);
      if (v && v->job_id[0] && strcmp(v->job_id, id) == 0) {
        *out_entry = &s->models[i];
        return v;
      }
    }
  }
  *out_entry = NULL;
  return NULL;
}

// Service |mu| held: the live fields of |v| (of |e|) into |progress|.
static void version_progress_fill(pcp_infer_service_t* s, model_entry_t* e,
                                  const version_t* v, json_t* progress) {
  const pcp_infer_model_stats_t* st = &e->stats;
  json_object_set_new(progress, "model", json_string(v->model->name));
  json_object_set_new(progress, "version", json_integer(v->number));
  json_object_set_new(
      progress, "workers",
      json_integer(v == e->current ? runners_serving(s, v) : 0));
  json_object_set_new(progress, "requests",
                      json_integer((json_int_t)st->requests));
  json_object_set_new(progress, "generated_tokens",
                      json_integer((json_int_t)st->generated_tokens));
  json_object_set_new(
      progress, "ttft_seconds_mean",
      st->ttft_count ? json_real(st->ttft_seconds_sum / (double)st->ttft_count)
                     : json_null());
}

bool pcp_infer_service_job_progress(pcp_infer_service_t* s, const char* id,
                                    json_t* progress) {
  pthread_mutex_lock(&s->mu);
  model_entry_t* e = NULL;
  version_t* v = version_of_job(s, id, &e);
  if (v) {
    version_progress_fill(s, e, v, progress);
  }
  pthread_mutex_unlock(&s->mu);
  return v != NULL;
}

void pcp_infer_service_job_cancel(pcp_infer_service_t* s, const char* id) {
  pthread_mutex_lock(&s->mu);
  model_entry_t* e = NULL;
  version_t* v = version_of_job(s, id, &e);
  if (v && !v->cancelled) {
    PCP_LOG(PCP_LOG_INFO, &s->options.log,
            "model version cancelled name=%s version=%u job=%s", v->model->name,
            v->number, id);
    v->cancelled = true;
    if (v == e->next) {
      entry_next_set(s, e, NULL);
    } else if (!e->next) {
      // The only version: the model is withdrawn until a new model.json.
      e->withdrawn = true;
    }
    // Its runners finish what they hold and retire (runner_superseded).
    for (runner_t* r = s->runners; r; r = r->next) {
      if (r->entry == e) {
        pthread_cond_signal(&r->cv);
      }
    }
    pthread_cond_broadcast(&s->cv);
    version_job_signal(s, v);
  }
  pthread_mutex_unlock(&s->mu);
}

typedef struct job_wait_t {
  pcp_infer_service_t* service;
  uint64_t seen;
} job_wait_t;

// Under the runner's lock: something changed since the run looked.
static bool job_changed(void* arg) {
  job_wait_t* w = arg;
  return atomic_load(&w->service->job_generation) != w->seen;
}

// What a run makes of its version, read under |mu|.
typedef struct job_view_t {
  pcp_store_job_state_t target;  // placing, compiling or running
  bool failed;
  pcp_status_code_t error_code;
  char error[256];
  uint32_t replaced_by;  // 0: not replaced
} job_view_t;

// Service |mu| held.
static void job_view(pcp_infer_service_t* s, model_entry_t* e, version_t* v,
                     job_view_t* out) {
  memset(out, 0, sizeof(*out));
  out->target = PCP_STORE_JOB_STATE_PLACING;
  bool has_runner = false;
  for (runner_t* r = s->runners; r && !has_runner; r = r->next) {
    has_runner = r->version == v;
  }
  bool compile_failed = false;
  bool compile_ok = false;
  for (size_t k = 0; k < v->program_count; ++k) {
    compile_failed = compile_failed || v->programs[k].failed;
    compile_ok = compile_ok || !v->programs[k].failed;
  }
  // A compile failure ends the job once no runner has the version, none of
  // its compiles runs and the manager's pass that saw it fail ended (every
  // connected worker's target was tried: another target may serve it). A
  // version that some target compiled is not failed by one that did not:
  // with no runner (its worker lost) it waits for a worker of that target.
  if (v->state == MODEL_FAILED ||
      (compile_failed && !compile_ok && !has_runner && v->compiling == 0 &&
       s->manage_passes > v->compile_failed_pass)) {
    // The listing's error (or reload_error) for this version: a load
    // failure, or a compile that left no worker able to serve it.
    out->failed = true;
    out->error_code =
        v->error_code ? v->error_code : PCP_STATUS_FAILED_PRECONDITION;
    snprintf(out->error, sizeof(out->error), "%s",
             v->error_message[0] ? v->error_message : v->error);
    return;
  }
  out->replaced_by = v->replaced_by;
  if (v->state != MODEL_LOADED) {
    return;
  }
  if (v == e->current && runners_serving(s, v) > 0) {
    out->target = PCP_STORE_JOB_STATE_RUNNING;
  } else if (v->compiling > 0 || has_runner) {
    out->target = PCP_STORE_JOB_STATE_COMPILING;
  }
}

// No version has job |id| (the service is not stopping): one that was
// replaced before its run started, a model.json rewritten while the
// gateway was down, or a directory that is gone. |dir| from the spec.
static pcp_status_t job_unbound(pcp_infer_service_t* s,
                                pcp_workloads_job_t* job, const char* dir) {
  char path[PCP_INFER_MAX_PATH + 16];
  snprintf(path, sizeof(path), "%s/model.json", dir);
  struct stat st;
  if (stat(path, &st) != 0) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "model directory %s is gone (no model.json)", dir);
  }
  (void)s;
  json_t* placement =
      json_pack("{s:s}", "reason", "replaced by a newer model.json");
  pcp_workloads_job_placement_set(job, placement);
  json_decref(placement);
  return pcp_ok_status();
}

pcp_status_t pcp_infer_service_job_run(pcp_infer_service_t* s,
                                       pcp_workloads_job_t* job) {
  const char* id = pcp_workloads_job_id(job);
  pcp_status_t status = pcp_ok_status();
  char dir[PCP_INFER_MAX_PATH] = "";
  {
    pcp_store_job_t stored;
    status = pcp_store_job_get(s->options.kind->store, id, &stored);
    if (status) {
      return status;
    }
    snprintf(dir, sizeof(dir), "%s",
             json_string_value(json_object_get(stored.spec, "dir"))
                 ? json_string_value(json_object_get(stored.spec, "dir"))
                 : "");
    pcp_store_job_deinitialize(&stored);
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_workloads_job_transition(job, PCP_STORE_JOB_STATE_PLACING, NULL));
  pthread_mutex_lock(&s->mu);
  model_entry_t* e = NULL;
  version_t* v = version_of_job(s, id, &e);
  if (!v && !s->stopping && dir[0]) {
    // A directory not looked at since (or changed): look now.
    dir_consider(s, dir, false);
    v = version_of_job(s, id, &e);
  }
  version_retain(v);
  bool stopping = s->stopping;
  pthread_mutex_unlock(&s->mu);
  if (!v && !stopping) {
    return job_unbound(s, job, dir);
  }
  static const pcp_store_job_state_t kPath[] = {PCP_STORE_JOB_STATE_PLACING,
                                                PCP_STORE_JOB_STATE_COMPILING,
                                                PCP_STORE_JOB_STATE_RUNNING};
  size_t reached = 0;  // index in kPath
  char published[512] = "";
  for (;;) {
    job_wait_t w = {.service = s};
    job_view_t view = {.target = PCP_STORE_JOB_STATE_PLACING};
    json_t* progress = json_object();
    pthread_mutex_lock(&s->mu);
    w.seen = atomic_load(&s->job_generation);
    // Once the service stops, nothing serves and nothing changes: the run
    // waits for the runner's stop, which comes next (the job resumes at
    // the next start).
    stopping = s->stopping;
    if (v && !stopping) {
      job_view(s, e, v, &view);
      if (progress) {
        version_progress_fill(s, e, v, progress);
      }
    }
    pthread_mutex_unlock(&s->mu);
    // Published when it changed (the listing folds the live numbers in).
    char* text = progress ? json_dumps(progress, JSON_COMPACT) : NULL;
    if (text && v && !stopping && strcmp(text, published) != 0) {
      snprintf(published, sizeof(published), "%s", text);
      pcp_workloads_job_progress_publish(job, progress);
    }
    pcp_libc_free(text);
    json_decref(progress);
    if (pcp_workloads_job_should_stop(job)) {
      if (pcp_workloads_job_cancel_requested(job)) {
        // The kind's cancel did this already; again for a cancel that came
        // before the run found its version.
        pcp_infer_service_job_cancel(s, id);
      }
      status =
          pcp_make_status(PCP_STATUS_CANCELLED, "inference job %s stopped", id);
      break;
    }
    if (view.failed) {
      status = pcp_make_status(view.error_code, "%s", view.error);
      break;
    }
    if (view.replaced_by) {
      char reason[64];
      snprintf(reason, sizeof(reason), "replaced by version %u",
               view.replaced_by);
      json_t* placement = json_pack("{s:i, s:s}", "replaced_by_version",
                                    (int)view.replaced_by, "reason", reason);
      pcp_workloads_job_placement_set(job, placement);
      json_decref(placement);
      PCP_LOG(PCP_LOG_INFO, &s->options.log, "inference job %s %s", id, reason);
      break;
    }
    // Forward only: placing, compiling, running (a lost worker shows in
    // "workers", not as a step back).
    size_t target = 0;
    while (kPath[target] != view.target) {
      ++target;
    }
    while (!stopping && reached < target) {
      pcp_status_t moved =
          pcp_workloads_job_transition(job, kPath[reached + 1], NULL);
      if (moved) {
        // A cancel won the race: the next look sees should_stop.
        pcp_status_ignore(moved);
        break;
      }
      ++reached;
    }
    pcp_workloads_job_wait_for(job, job_changed, &w, true, -1);
  }
  pthread_mutex_lock(&s->mu);
  version_release(v);
  pthread_mutex_unlock(&s->mu);
  return status;
}

//===----------------------------------------------------------------------===//
// Lifecycle and listing
//===----------------------------------------------------------------------===//

pcp_status_t pcp_infer_service_create(
    const pcp_infer_service_options_t* options, pcp_allocator_t allocator,
    pcp_infer_service_t** out_service) {
  *out_service = NULL;
  if (!options->fabric || options->model_dir_count > PCP_INFER_MAX_MODEL_DIRS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "inference: a fabric endpoint and at most %d "
                           "model dirs",
                           PCP_INFER_MAX_MODEL_DIRS);
  }
  pcp_infer_service_t* s = NULL;
  PCP_RETURN_IF_ERROR(pcp_allocator_calloc(allocator, sizeof(*s), (void**)&s),
                      "inference");
  s->allocator = allocator;
  s->options = *options;
  s->clock = pcp_clock_system();
  if (!s->options.probe_interval_ms)
    s->options.probe_interval_ms = 1000;
  if (!s->options.probe_max_age_ms)
    s->options.probe_max_age_ms = 10 * s->options.probe_interval_ms;
  if (!s->options.max_waiting_per_worker)
    s->options.max_waiting_per_worker = 64;
  if (!s->options.call_timeout_ms)
    s->options.call_timeout_ms = 60000;
  s->step_delay_ms = s->options.test_step_delay_ms;
  snprintf(s->artifact_dir, sizeof(s->artifact_dir), "%s",
           options->artifact_dir ? options->artifact_dir : "");
  snprintf(s->models_root, sizeof(s->models_root), "%s",
           options->models_root ? options->models_root : "");
  pcp_status_t allocated = pcp_allocator_calloc(
      allocator, (options->model_dir_count + 1) * sizeof(*s->model_dirs),
      (void**)&s->model_dirs);
  if (allocated) {
    pcp_allocator_free(allocator, s);
    return pcp_status_annotate_f(allocated, "inference");
  }
  for (size_t i = 0; i < options->model_dir_count; ++i) {
    snprintf(s->model_dirs[i], sizeof(s->model_dirs[i]), "%s",
             options->model_dirs[i]);
  }
  s->model_dir_count = options->model_dir_count;
  s->options.model_dirs = NULL;
  s->options.artifact_dir = NULL;
  s->options.models_root = NULL;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_cond_init(&s->idle_cv, NULL);
  pcp_status_t status = pcp_ok_status();
  if (options->metrics) {
    pcp_obs_family_t* f[PCP_ARRAYSIZE(kMetrics)];
    status = pcp_obs_registry_register(options->metrics, kMetrics,
                                       PCP_ARRAYSIZE(kMetrics), f);
    if (!status) {
      s->ttft = f[M_TTFT];
      s->itl = f[M_ITL];
      s->e2e = f[M_E2E];
      s->queue = f[M_QUEUE];
      s->prompt_tokens = f[M_PROMPT_TOKENS];
      s->generation_tokens = f[M_GENERATION_TOKENS];
      s->running = f[M_RUNNING];
      s->waiting = f[M_WAITING];
      s->reloads = f[M_RELOADS];
      s->success = f[M_SUCCESS];
      s->kv_usage = f[M_KV_USAGE];
      s->prefix_queries = f[M_PREFIX_QUERIES];
      s->prefix_hits = f[M_PREFIX_HITS];
      status =
          pcp_obs_registry_collector_add(options->metrics, kv_usage_collect, s);
      if (!status) {
        s->registry = options->metrics;
      }
    }
  }
  if (!status) {
    // A missing --model-dir is a start error, not a silent empty service.
    for (size_t i = 0; i < s->model_dir_count && !status; ++i) {
      char path[PCP_INFER_MAX_PATH + 16];
      snprintf(path, sizeof(path), "%s/model.json", s->model_dirs[i]);
      pcp_infer_model_t probe = {0};
      status = pcp_infer_model_json_load(s->model_dirs[i], &probe);
      // pcp_infer_model_json_load allocates these from the system allocator.
      pcp_allocator_free(pcp_allocator_system(), probe.char_offsets);
      pcp_allocator_free(pcp_allocator_system(), probe.char_text);
    }
  }
  if (!status) {
    pthread_mutex_lock(&s->mu);
    scan_locked(s);
    pthread_mutex_unlock(&s->mu);
    if (s->options.kind) {
      __atomic_store_n(&s->options.kind->service, s, __ATOMIC_RELEASE);
    }
    if (pthread_create(&s->manager, NULL, manager_main, s) != 0) {
      status = pcp_make_status(PCP_STATUS_UNAVAILABLE, "inference manager");
    } else {
      s->manager_started = true;
    }
  }
  if (status) {
    pcp_infer_service_release(s);
    return status;
  }
  *out_service = s;
  return pcp_ok_status();
}

void pcp_infer_service_shutdown(pcp_infer_service_t* s, int64_t deadline_ms) {
  if (!s || s->shut_down) {
    return;
  }
  pthread_mutex_lock(&s->mu);
  s->refusing = true;
  pthread_mutex_unlock(&s->mu);
  // Until the requests in flight end (every end broadcasts |idle_cv|) or the
  // deadline: no polling.
  int64_t end = now_ns(s) + deadline_ms * 1000000;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    bool busy = false;
    for (runner_t* r = s->runners; r && !busy; r = r->next) {
      busy = r->waiting > 0 || r->active > 0;
    }
    int64_t left_ms = (end - now_ns(s)) / 1000000;
    if (!busy || left_ms <= 0) {
      break;
    }
    struct timespec until = pcp_realtime_deadline_ms(left_ms);
    pthread_cond_timedwait(&s->idle_cv, &s->mu, &until);
  }
  s->stopping = true;
  // A compile the manager waits for is cancelled (its child killed).
  if (s->compiling) {
    pcp_workloads_compile_request_cancel(s->compiling);
  }
  for (runner_t* r = s->runners; r; r = r->next) {
    r->stop = true;
    pthread_cond_signal(&r->cv);
  }
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  if (s->manager_started) {
    pthread_join(s->manager, NULL);
  }
  // Detached under the lock: the metrics collector walks the list.
  pthread_mutex_lock(&s->mu);
  runner_t* r = s->runners;
  s->runners = NULL;
  pthread_mutex_unlock(&s->mu);
  while (r) {
    runner_t* next = r->next;
    pthread_join(r->thread, NULL);
    fail_all(r, pcp_make_status(PCP_STATUS_CANCELLED,
                                "the inference service is stopping"));
    runner_dispose(r);
    r = next;
  }
  s->shut_down = true;
}

void pcp_infer_service_release(pcp_infer_service_t* s) {
  if (!s) {
    return;
  }
  if (s->registry) {
    pcp_obs_registry_collector_remove(s->registry, kv_usage_collect, s);
  }
  pcp_infer_service_shutdown(s, 0);
  if (s->options.kind) {
    __atomic_store_n(&s->options.kind->service, NULL, __ATOMIC_RELEASE);
  }
  pcp_workloads_compile_queue_destroy(s->own_queue);
  // Every runner is gone: the entries hold the last references.
  for (size_t i = 0; i < s->model_count; ++i) {
    version_release(s->models[i].current);
    version_release(s->models[i].next);
  }
  pthread_cond_destroy(&s->cv);
  pthread_cond_destroy(&s->idle_cv);
  pthread_mutex_destroy(&s->mu);
  pcp_allocator_t allocator = s->allocator;
  pcp_allocator_free(allocator, s->model_dirs);
  pcp_allocator_free(allocator, s);
}

static int info_compare(const void* a, const void* b) {
  return strcmp(((const pcp_infer_model_info_t*)a)->name,
                ((const pcp_infer_model_info_t*)b)->name);
}

size_t pcp_infer_service_model_list(pcp_infer_service_t* s,
                                    pcp_infer_model_info_t* out_infos,
                                    size_t capacity, size_t* out_total) {
  pthread_mutex_lock(&s->mu);
  scan_locked(s);
  size_t n = 0;
  size_t total = 0;
  for (size_t i = 0; i < s->model_count && n < capacity; ++i) {
    model_entry_t* e = &s->models[i];
    if (e->withdrawn) {
      continue;  // its job was cancelled (docs/decisions.md)
    }
    const version_t* v = e->current;
    const pcp_infer_model_t* m = v->model;
    pcp_infer_model_info_t* info = &out_infos[n++];
    memset(info, 0, sizeof(*info));
    snprintf(info->name, sizeof(info->name), "%s", m->name);
    snprintf(info->architecture, sizeof(info->architecture), "%s",
             pcp_models_architecture_name(m->spec.architecture));
    info->workers = runners_serving(s, v);
    info->state = v->state == MODEL_FAILED ? PCP_INFER_MODEL_FAILED
                  : info->workers > 0      ? PCP_INFER_MODEL_READY
                                           : PCP_INFER_MODEL_PREPARING;
    snprintf(info->error, sizeof(info->error), "%s", v->error);
    info->created_s = m->created_s;
    info->max_length = m->gen.max_length;
    info->version = v->number;
    snprintf(info->job_id, sizeof(info->job_id), "%s", m->job_id);
    info->outer_step = m->outer_step;
    snprintf(info->worker_class, sizeof(info->worker_class), "%s",
             m->worker_class);
    info->pending_version = e->next ? e->next->number : 0;
    snprintf(info->reload_error, sizeof(info->reload_error), "%s",
             e->reload_error);
    info->stats = e->stats;
  }
  for (size_t i = 0; i < s->model_count; ++i) {
    total += s->models[i].withdrawn ? 0 : 1;
  }
  if (out_total) {
    *out_total = total;
  }
  pthread_mutex_unlock(&s->mu);
  qsort(out_infos, n, sizeof(*out_infos), info_compare);
  return n;
}

bool pcp_infer_service_has_pinned_models(pcp_infer_service_t* s) {
  return s->model_dir_count > 0;
}

pcp_status_t pcp_infer_prompt_tokens_count(
    pcp_infer_service_t* s, const pcp_infer_request_params_t* params,
    int64_t* out_prompt_tokens, int64_t* out_max_length) {
  *out_prompt_tokens = 0;
  *out_max_length = 0;
  if (!params->model) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "model: required");
  }
  pthread_mutex_lock(&s->mu);
  model_entry_t* e = model_find(s, params->model);
  if (!e) {
    scan_locked(s);
    e = model_find(s, params->model);
  }
  version_t* v = e ? e->current : NULL;
  pcp_status_t status = pcp_ok_status();
  if (!e) {
    status = pcp_make_status(PCP_STATUS_NOT_FOUND,
                             "The model `%s` does not exist.", params->model);
  } else if (v->state != MODEL_LOADED) {
    status = pcp_make_status(PCP_STATUS_UNAVAILABLE,
                             "model %s is not loaded yet", params->model);
  }
  if (!status) {
    version_retain(v);
  }
  pthread_mutex_unlock(&s->mu);
  PCP_RETURN_IF_ERROR_BARE(status);
  pcp_tokenizer_id_list_t ids;
  pcp_tokenizer_id_list_initialize(pcp_allocator_system(), &ids);
  status = pcp_infer_model_encode(v->model, params, &ids);
  *out_prompt_tokens = (int64_t)ids.count;
  *out_max_length = v->model->gen.max_length;
  pcp_tokenizer_id_list_deinitialize(&ids);
  pthread_mutex_lock(&s->mu);
  version_release(v);
  pthread_mutex_unlock(&s->mu);
  return status;
}
