// SPDX-License-Identifier: Apache-2.0
// Rollouts of a GRPO iteration (rollout.h): requests to the inference
// service, one per sample, collected by their callbacks; scoring through a
// batch verifier; packing into the @grpo tensors.
//
// generate keeps at most max_in_flight requests in the service and waits
// on a condition variable that every request's end signals, waking at
// least every 100 ms to poll stop() and the deadline. The callbacks run on
// the service's scheduler threads: each writes only its own item (tokens,
// text) until its on_done, which hands the item over under the mutex. On a
// failure or a stop the callbacks refuse to go on (returning false stops a
// request at its next token) and the call waits for every submitted
// request's on_done before it returns: the service guarantees exactly one
// per queued request (a lost worker or a stuck call ends it with an error),
// so no callback can touch the items after the return.

// rollout.h needs the sampling types workloads.h declares before it.
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "workloads/workloads.h"

// The experiment's bounds (experiment.h): group_size up to 1024 and at most
// 2^20 rollouts per iteration; a bigger call is a bug of the caller.
#define MAX_GROUP_SIZE 1024
#define MAX_ROLLOUTS ((size_t)1 << 20)
#define MAX_NEW_TOKENS ((int64_t)1 << 20)
#define DEFAULT_MAX_IN_FLIGHT 64u
// The whole call's timeout: a week is far past any iteration, and keeps the
// deadline (start + timeout_ms x 10^6 ns) inside int64.
#define MAX_TIMEOUT_MS ((int64_t)7 * 24 * 3600 * 1000)
// The longest wait between two looks at stop() and the deadline.
#define POLL_MS 100
// batch_pack: one side of the [rows, length] tensors, and their area (five
// tensors of 4-byte elements: 2^28 x 20 bytes = 5 GiB at most).
#define MAX_PACK_SIDE ((int64_t)1 << 20)
#define MAX_PACK_AREA ((int64_t)1 << 28)

//===----------------------------------------------------------------------===//
// Seeds
//===----------------------------------------------------------------------===//

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The seed of sample |i| of the group at position |p|: one hash per
// (seed, p), plus i, so the samples of a group have distinct seeds for sure
// (the sampler mixes its seed again: neighbouring seeds draw independent
// streams) and a group's seeds do not depend on the group size.
static uint64_t sample_seed(uint64_t seed, size_t p, int64_t i) {
  return splitmix64(splitmix64(seed) + (uint64_t)p) + (uint64_t)i;
}

//===----------------------------------------------------------------------===//
// Generate
//===----------------------------------------------------------------------===//

typedef struct generate_t generate_t;

// One request's collection, written by its scheduler thread until on_done.
typedef struct item_t {
  generate_t* g;
  size_t index;     // into the set's items
  size_t position;  // into prompt_indices
  int32_t* ids;
  float* logp;
  int64_t count;
  int64_t capacity;
  pcp_string_builder_t text;
  pcp_status_t error;  // the collection's own failure (out of memory)
} item_t;

struct generate_t {
  pthread_mutex_t mu;
  pthread_cond_t cv;  // a request ended
  pcp_allocator_t allocator;
  pcp_workloads_rl_rollout_set_t* set;
  pcp_clock_t clock;
  // Set once the call fails or stops: callbacks then end their requests.
  atomic_bool stopping;
  // Guarded by |mu|.
  size_t finished;
  pcp_status_t error;  // the first failed request's (owned)
  int64_t last_end_ns;
};

static bool item_token(void* user_data, const pcp_infer_token_t* token,
                       const pcp_infer_token_t* top, size_t top_count) {
  (void)top;
  (void)top_count;
  item_t* item = user_data;
  if (atomic_load(&item->g->stopping)) {
    return false;
  }
  if (item->count == item->capacity) {
    int64_t capacity = item->capacity ? 2 * item->capacity : 64;
    pcp_allocator_t allocator = item->g->allocator;
    pcp_status_t status = pcp_allocator_realloc(
        allocator, (size_t)capacity * sizeof(int32_t), (void**)&item->ids);
    if (!status) {
      status = pcp_allocator_realloc(
          allocator, (size_t)capacity * sizeof(float), (void**)&item->logp);
    }
    if (status) {
      item->error = pcp_status_annotate_f(status, "completion tokens");
      return false;
    }
    item->capacity = capacity;
  }
  item->ids[item->count] = token->id;
  item->logp[item->count] = token->logprob;
  item->count++;
  return true;
}

static bool item_text(void* user_data, const char* text, size_t length) {
  item_t* item = user_data;
  if (atomic_load(&item->g->stopping)) {
    return false;
  }
  pcp_status_t status = pcp_string_builder_append(
      &item->text, pcp_make_string_view(text, length));
  if (status) {
    item->error = pcp_status_annotate_f(status, "completion text");
    return false;
  }
  return true;
}

// Moves the collection into the set's rollout. Scheduler thread, before
// the item is handed over.
static pcp_status_t item_complete(item_t* item,
                                  const pcp_infer_result_t* result) {
  pcp_workloads_rl_rollout_t* out = &item->g->set->items[item->index];
  if (result->completion_tokens != item->count) {
    return pcp_make_status(
        PCP_STATUS_INTERNAL,
        "the service counted %lld completion tokens, the callbacks %lld",
        (long long)result->completion_tokens, (long long)item->count);
  }
  if (result->finish_reason != PCP_FINISH_REASON_STOP &&
      result->finish_reason != PCP_FINISH_REASON_LENGTH) {
    return pcp_make_status(PCP_STATUS_CANCELLED,
                           "the generation ended without a finish reason");
  }
  if (result->prompt_tokens < 1 || !result->prompt_ids) {
    return pcp_make_status(PCP_STATUS_INTERNAL, "no prompt ids");
  }
  pcp_allocator_t allocator = item->g->allocator;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_malloc(allocator,
                           (size_t)result->prompt_tokens * sizeof(int32_t),
                           (void**)&out->prompt_ids),
      "prompt ids");
  memcpy(out->prompt_ids, result->prompt_ids,
         (size_t)result->prompt_tokens * sizeof(int32_t));
  out->prompt_count = result->prompt_tokens;
  // The builder's size, not strlen: a byte tokenizer's token 0 is a NUL
  // byte of the text.
  size_t length = item->text.size;
  PCP_RETURN_IF_ERROR(
      pcp_string_builder_take(&item->text, &out->completion_text),
      "completion text");
  out->completion_length = length;
  out->completion_ids = item->ids;
  out->completion_logp = item->logp;
  out->completion_count = item->count;
  item->ids = NULL;
  item->logp = NULL;
  out->policy_version = result->outer_step;
  out->finish_reason = result->finish_reason;
  return pcp_ok_status();
}

static void item_done(void* user_data, const pcp_infer_result_t* result) {
  item_t* item = user_data;
  generate_t* g = item->g;
  pcp_status_t status = item->error;
  item->error = pcp_ok_status();
  if (!status && result->status) {
    status = pcp_status_clone(result->status);
  }
  if (!status) {
    status = item_complete(item, result);
  }
  if (status) {
    const pcp_workloads_rl_rollout_t* r = &g->set->items[item->index];
    status = pcp_status_annotate_f(status, "rollout of prompt %u sample %u",
                                   r->prompt_index, r->sample_index);
  }
  int64_t now = pcp_clock_now_ns(g->clock);
  pthread_mutex_lock(&g->mu);
  g->finished++;
  g->last_end_ns = now;
  if (status) {
    atomic_store(&g->stopping, true);
    if (!g->error) {
      g->error = status;
      status = pcp_ok_status();
    }
  }
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
  pcp_status_ignore(status);
}

static pcp_status_t request_validate(
    const pcp_workloads_rl_rollout_request_t* request) {
  if (!request->model || !request->model[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "model: required");
  }
  if (!request->prompts || request->prompts->count == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "prompts: required (at least one prompt)");
  }
  if (request->prompt_count == 0 || !request->prompt_indices) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "prompt_indices: at least one prompt");
  }
  for (size_t p = 0; p < request->prompt_count; ++p) {
    if (request->prompt_indices[p] >= request->prompts->count) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "prompt_indices[%zu]: %u is not below the %zu "
                             "prompts",
                             p, request->prompt_indices[p],
                             request->prompts->count);
    }
  }
  if (request->group_size < 1 || request->group_size > MAX_GROUP_SIZE) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "group_size: %lld is not in [1, %d]",
                           (long long)request->group_size, MAX_GROUP_SIZE);
  }
  if (request->prompt_count > MAX_ROLLOUTS / (size_t)request->group_size) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "prompt_count: %zu prompts x group_size %lld is "
                           "more than %zu rollouts",
                           request->prompt_count,
                           (long long)request->group_size, MAX_ROLLOUTS);
  }
  // !(x >= a) also refuses NaN.
  if (!(request->temperature >= 0.0 && request->temperature <= 10.0)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "temperature: %g is not in [0, 10]",
                           request->temperature);
  }
  if (!(request->top_p > 0.0 && request->top_p <= 1.0)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "top_p: %g is not in (0, 1]", request->top_p);
  }
  if (request->max_tokens < 1 || request->max_tokens > MAX_NEW_TOKENS) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "max_tokens: %lld is not in [1, %lld]",
        (long long)request->max_tokens, (long long)MAX_NEW_TOKENS);
  }
  if (request->timeout_ms < 0 || request->timeout_ms > MAX_TIMEOUT_MS) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "timeout_ms: %lld is not in [0, %lld]",
        (long long)request->timeout_ms, (long long)MAX_TIMEOUT_MS);
  }
  return pcp_ok_status();
}

// One request for |item|. Submit's own errors (nothing queued, no callback).
static pcp_status_t item_submit(pcp_infer_service_t* service,
                                const pcp_workloads_rl_rollout_request_t* rq,
                                item_t* item) {
  const pcp_workloads_rl_prompt_t* prompt =
      &rq->prompts->items[rq->prompt_indices[item->position]];
  pcp_infer_request_params_t params = {
      .model = rq->model,
      .chat = false,
      .prompt = pcp_make_string_view(prompt->prompt, prompt->prompt_length),
      .max_tokens = rq->max_tokens,
      .on_text = item_text,
      .on_done = item_done,
      .user_data = item,
      .on_token = item_token,
      .top_logprobs = 0,
  };
  // top_k 0 and no penalties: old_logp is then the policy's own
  // distribution at the temperature, filtered by top_p alone (docs/rl.md).
  pcp_sampling_params_initialize(&params.sampling);
  params.sampling.temperature = rq->temperature;
  params.sampling.top_p = rq->top_p;
  params.sampling.seed =
      sample_seed(rq->seed, item->position,
                  (int64_t)(item->index % (size_t)rq->group_size));
  return pcp_infer_request_submit(service, &params, NULL);
}

// What the submitting loop decided.
typedef enum outcome_e {
  OUTCOME_RUNNING = 0,
  OUTCOME_DONE = 1,
  OUTCOME_FAILED = 2,
} outcome_t;

// Submits, waits and polls until every request ended, one failed, stop()
// or the deadline. Returns the call's failure (OK when all ended well) and
// |*out_submitted| the requests queued.
static pcp_status_t generate_run(pcp_infer_service_t* service,
                                 const pcp_workloads_rl_rollout_request_t* rq,
                                 generate_t* g, item_t* items, size_t total,
                                 size_t* out_submitted) {
  uint32_t max_in_flight =
      rq->max_in_flight ? rq->max_in_flight : DEFAULT_MAX_IN_FLIGHT;
  int64_t start_ns = pcp_clock_now_ns(g->clock);
  int64_t deadline_ns =
      rq->timeout_ms > 0 ? start_ns + rq->timeout_ms * 1000000 : INT64_MAX;
  size_t next = 0;
  // Why the last submit was put off (429 or no worker yet), for the
  // deadline's message; owned.
  pcp_status_t deferred = pcp_ok_status();
  pcp_status_t failure = pcp_ok_status();
  outcome_t outcome = OUTCOME_RUNNING;
  while (outcome == OUTCOME_RUNNING) {
    if (rq->stop && rq->stop(rq->stop_user_data)) {
      failure = pcp_make_status(PCP_STATUS_CANCELLED,
                                "rollouts stopped (%zu of %zu submitted)", next,
                                total);
      break;
    }
    pthread_mutex_lock(&g->mu);
    size_t finished = g->finished;
    if (g->error) {
      failure = g->error;
      g->error = pcp_ok_status();
    }
    pthread_mutex_unlock(&g->mu);
    if (failure) {
      break;
    }
    if (finished == total) {
      outcome = OUTCOME_DONE;
      break;
    }
    if (pcp_clock_now_ns(g->clock) >= deadline_ns) {
      failure = pcp_make_status(
          PCP_STATUS_DEADLINE_EXCEEDED,
          "rollouts: %zu of %zu done after timeout_ms %lld%s%s", finished,
          total, (long long)rq->timeout_ms, deferred ? "; last refusal: " : "",
          deferred ? pcp_status_message(deferred) : "");
      break;
    }
    while (next < total && next - finished < max_in_flight) {
      pcp_status_t status = item_submit(service, rq, &items[next]);
      pcp_status_code_t code = pcp_status_code(status);
      if (!status) {
        next++;
        continue;
      }
      // The worker's queue is full: room comes as requests end. No worker
      // serves the model yet: one may connect before the deadline; with no
      // deadline the call says so at once (rollout.h).
      if (code == PCP_STATUS_RESOURCE_EXHAUSTED ||
          (code == PCP_STATUS_UNAVAILABLE && rq->timeout_ms > 0)) {
        pcp_status_ignore(deferred);
        deferred = status;
        break;
      }
      failure = pcp_status_annotate_f(status, "rollout of prompt %u sample %u",
                                      g->set->items[next].prompt_index,
                                      g->set->items[next].sample_index);
      break;
    }
    if (failure) {
      break;
    }
    // Wait for a request to end (room, or the end) or the next poll.
    int64_t wait_ms = POLL_MS;
    int64_t left_ms = (deadline_ns - pcp_clock_now_ns(g->clock)) / 1000000;
    if (deadline_ns != INT64_MAX && left_ms + 1 < wait_ms) {
      wait_ms = left_ms < 0 ? 0 : left_ms + 1;
    }
    struct timespec until = pcp_realtime_deadline_ms(wait_ms);
    pthread_mutex_lock(&g->mu);
    if (g->finished == finished && !g->error) {
      pthread_cond_timedwait(&g->cv, &g->mu, &until);
    }
    pthread_mutex_unlock(&g->mu);
  }
  pcp_status_ignore(deferred);
  *out_submitted = next;
  return failure;
}

// Frees what an item still holds (not moved into the set).
static void item_deinitialize(pcp_allocator_t allocator, item_t* item) {
  pcp_allocator_free(allocator, item->ids);
  pcp_allocator_free(allocator, item->logp);
  item->ids = NULL;
  item->logp = NULL;
  pcp_string_builder_deinitialize(&item->text);
  pcp_status_ignore(item->error);
  item->error = pcp_ok_status();
}

pcp_status_t pcp_workloads_rl_rollouts_generate(
    pcp_infer_service_t* service,
    const pcp_workloads_rl_rollout_request_t* request,
    pcp_allocator_t allocator, pcp_workloads_rl_rollout_set_t* out_set) {
  memset(out_set, 0, sizeof(*out_set));
  if (!service || !request) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "service and request: required");
  }
  PCP_RETURN_IF_ERROR_BARE(request_validate(request));
  size_t total = request->prompt_count * (size_t)request->group_size;
  out_set->allocator = allocator;
  out_set->group_size = request->group_size;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(allocator, total * sizeof(*out_set->items),
                           (void**)&out_set->items),
      "rollouts");
  out_set->count = total;
  item_t* items = NULL;
  pcp_status_t status =
      pcp_allocator_calloc(allocator, total * sizeof(*items), (void**)&items);
  if (status) {
    pcp_workloads_rl_rollout_set_deinitialize(out_set);
    return pcp_status_annotate_f(status, "rollouts");
  }
  generate_t g = {
      .allocator = allocator,
      .set = out_set,
      .clock = pcp_clock_system(),
  };
  atomic_init(&g.stopping, false);
  pthread_mutex_init(&g.mu, NULL);
  pthread_cond_init(&g.cv, NULL);
  for (size_t i = 0; i < total; ++i) {
    size_t p = i / (size_t)request->group_size;
    out_set->items[i].prompt_index = request->prompt_indices[p];
    out_set->items[i].sample_index =
        (uint32_t)(i % (size_t)request->group_size);
    out_set->items[i].policy_version = -1;
    items[i].g = &g;
    items[i].index = i;
    items[i].position = p;
    pcp_string_builder_initialize(allocator, 0, &items[i].text);
  }

  int64_t start_ns = pcp_clock_now_ns(g.clock);
  size_t submitted = 0;
  status = generate_run(service, request, &g, items, total, &submitted);
  // Every queued request ends with one on_done, and nothing may run after
  // this call returns: stop them (their callbacks refuse the next token)
  // and wait. Bounded by the service: a request whose worker call hangs
  // fails at call_timeout_ms.
  pthread_mutex_lock(&g.mu);
  if (status) {
    atomic_store(&g.stopping, true);
  }
  while (g.finished < submitted) {
    pthread_cond_wait(&g.cv, &g.mu);
  }
  if (!status && g.error) {
    status = g.error;  // a request that failed as the last one ended
  } else {
    pcp_status_ignore(g.error);
  }
  g.error = pcp_ok_status();
  int64_t end_ns = g.last_end_ns;
  pthread_mutex_unlock(&g.mu);

  for (size_t i = 0; i < total; ++i) {
    item_deinitialize(allocator, &items[i]);
  }
  pcp_allocator_free(allocator, items);
  pthread_cond_destroy(&g.cv);
  pthread_mutex_destroy(&g.mu);
  if (status) {
    pcp_workloads_rl_rollout_set_deinitialize(out_set);
    return status;
  }
  for (size_t i = 0; i < total; ++i) {
    out_set->completion_tokens += out_set->items[i].completion_count;
  }
  out_set->seconds = end_ns > start_ns ? (double)(end_ns - start_ns) / 1e9 : 0;
  return pcp_ok_status();
}

void pcp_workloads_rl_rollout_set_deinitialize(
    pcp_workloads_rl_rollout_set_t* set) {
  if (!set) {
    return;
  }
  for (size_t i = 0; set->items && i < set->count; ++i) {
    pcp_workloads_rl_rollout_t* r = &set->items[i];
    pcp_allocator_free(set->allocator, r->prompt_ids);
    pcp_allocator_free(set->allocator, r->completion_ids);
    pcp_allocator_free(set->allocator, r->completion_logp);
    pcp_allocator_free(set->allocator, r->completion_text);
  }
  if (set->items) {
    pcp_allocator_free(set->allocator, set->items);
  }
  memset(set, 0, sizeof(*set));
}

//===----------------------------------------------------------------------===//
// Score
//===----------------------------------------------------------------------===//

pcp_status_t pcp_workloads_rl_rollouts_score(
    const pcp_workloads_rl_verifier_t* verifier,
    const pcp_workloads_rl_prompts_t* prompts, size_t max_batch,
    pcp_workloads_rl_rollout_set_t* set) {
  return pcp_workloads_rl_rollouts_score_until(verifier, prompts, max_batch,
                                               NULL, set);
}

pcp_status_t pcp_workloads_rl_rollouts_score_until(
    const pcp_workloads_rl_verifier_t* verifier,
    const pcp_workloads_rl_prompts_t* prompts, size_t max_batch,
    const pcp_workloads_rl_stop_t* stop, pcp_workloads_rl_rollout_set_t* set) {
  if (!verifier || !verifier->score_batch) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "verifier: required");
  }
  if (!prompts || !set) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "prompts and set: required");
  }
  if (set->count == 0) {
    return pcp_ok_status();
  }
  for (size_t i = 0; i < set->count; ++i) {
    if (set->items[i].prompt_index >= prompts->count) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "set.items[%zu].prompt_index: %u is not below "
                             "the %zu prompts",
                             i, set->items[i].prompt_index, prompts->count);
    }
  }
  size_t slice = max_batch && max_batch < set->count ? max_batch : set->count;
  pcp_workloads_rl_sample_t* samples = NULL;
  double* rewards = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(set->allocator, slice * sizeof(*samples),
                           (void**)&samples),
      "reward samples");
  // Every reward first, written into the set only when all were scored:
  // a failed call leaves the set as it was.
  pcp_status_t status = pcp_allocator_calloc(
      set->allocator, set->count * sizeof(*rewards), (void**)&rewards);
  for (size_t begin = 0; !status && begin < set->count; begin += slice) {
    size_t n = set->count - begin < slice ? set->count - begin : slice;
    for (size_t k = 0; k < n; ++k) {
      const pcp_workloads_rl_rollout_t* r = &set->items[begin + k];
      const pcp_workloads_rl_prompt_t* p = &prompts->items[r->prompt_index];
      samples[k] = (pcp_workloads_rl_sample_t){
          .prompt = pcp_make_string_view(p->prompt, p->prompt_length),
          .completion =
              pcp_make_string_view(r->completion_text ? r->completion_text : "",
                                   r->completion_length),
          .answer = pcp_make_string_view(p->answer, p->answer_length),
          .completion_token_count = r->completion_count,
          .metadata = p->metadata,
      };
    }
    status = pcp_workloads_rl_verifier_score_batch_until(verifier, samples, n,
                                                         stop, rewards + begin);
    if (status) {
      status = pcp_status_annotate_f(status, "scoring rollouts [%zu, %zu)",
                                     begin, begin + n);
    }
  }
  for (size_t i = 0; !status && i < set->count; ++i) {
    // Finite (the verifier's contract), but a float holds less.
    if (!(fabs(rewards[i]) <= 3.4e38)) {
      status = pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                               "reward %g of rollout %zu does not fit a float",
                               rewards[i], i);
    }
  }
  for (size_t i = 0; !status && i < set->count; ++i) {
    set->items[i].reward = (float)rewards[i];
  }
  pcp_allocator_free(set->allocator, rewards);
  pcp_allocator_free(set->allocator, samples);
  return status;
}

//===----------------------------------------------------------------------===//
// Batch
//===----------------------------------------------------------------------===//

static pcp_status_t pack_validate(
    const pcp_workloads_rl_rollout_t* const* rollouts, const float* advantages,
    size_t count, int64_t rows, int64_t length) {
  if (rows < 1 || rows > MAX_PACK_SIDE) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "rows: %lld is not in [1, %lld]", (long long)rows,
                           (long long)MAX_PACK_SIDE);
  }
  if (length < 2 || length > MAX_PACK_SIDE) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "length: %lld is not in [2, %lld]",
                           (long long)length, (long long)MAX_PACK_SIDE);
  }
  if (rows * length > MAX_PACK_AREA) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "rows x length: %lld x %lld is more than %lld "
                           "elements",
                           (long long)rows, (long long)length,
                           (long long)MAX_PACK_AREA);
  }
  if ((uint64_t)count > (uint64_t)rows) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "count: %zu rollouts do not fit %lld rows", count,
                           (long long)rows);
  }
  if (count > 0 && (!rollouts || !advantages)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "rollouts and advantages: required");
  }
  for (size_t i = 0; i < count; ++i) {
    const pcp_workloads_rl_rollout_t* r = rollouts[i];
    if (!r) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "rollouts[%zu]: required", i);
    }
    if (r->prompt_count < 1 || !r->prompt_ids) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "rollouts[%zu].prompt_count: at least one "
                             "prompt token is needed",
                             i);
    }
    if (r->completion_count < 0 ||
        (r->completion_count > 0 &&
         (!r->completion_ids || !r->completion_logp))) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "rollouts[%zu].completion_count: %lld tokens "
                             "without their ids and log-probabilities",
                             i, (long long)r->completion_count);
    }
    if (!isfinite(advantages[i])) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "advantages[%zu]: %g is not finite", i,
                             (double)advantages[i]);
    }
    for (int64_t j = 0; j < r->completion_count; ++j) {
      if (!isfinite(r->completion_logp[j])) {
        return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "rollouts[%zu].completion_logp[%lld]: %g is "
                               "not finite",
                               i, (long long)j, (double)r->completion_logp[j]);
      }
    }
  }
  return pcp_ok_status();
}

// Row |row| of |b| from |r|: prompt tokens dropped from the front, then
// completion tokens from the end, until prompt ++ completion fits length + 1
// (rollout.h).
static void pack_row(const pcp_workloads_rl_rollout_t* r, float advantage,
                     int64_t row, pcp_workloads_rl_batch_t* b) {
  int64_t t_max = b->length + 1;  // tokens a row can hold (inputs + last)
  int64_t c = r->completion_count;
  int64_t kept_p = r->prompt_count;
  if (kept_p + c > t_max) {
    kept_p = t_max - c > 1 ? t_max - c : 1;
  }
  int64_t kept_c = c < t_max - kept_p ? c : t_max - kept_p;
  b->truncated_tokens += c - kept_c;
  const int32_t* prompt = r->prompt_ids + (r->prompt_count - kept_p);
  int64_t n = kept_p + kept_c;  // the sequence s
  int32_t* input = b->input_ids + row * b->length;
  int32_t* target = b->targets + row * b->length;
  float* mask = b->mask + row * b->length;
  float* old_logp = b->old_logp + row * b->length;
  for (int64_t t = 0; t < b->length && t < n; ++t) {
    input[t] = t < kept_p ? prompt[t] : r->completion_ids[t - kept_p];
  }
  for (int64_t t = 0; t + 1 < n; ++t) {
    int64_t s = t + 1;  // the target's position in s
    if (s < kept_p) {
      target[t] = prompt[s];
      continue;
    }
    target[t] = r->completion_ids[s - kept_p];
    mask[t] = 1.0f;
    old_logp[t] = r->completion_logp[s - kept_p];
    b->completion_tokens++;
  }
  b->advantages[row] = advantage;
}

pcp_status_t pcp_workloads_rl_batch_pack(
    const pcp_workloads_rl_rollout_t* const* rollouts, const float* advantages,
    size_t count, int64_t rows, int64_t length, int32_t pad_id,
    pcp_allocator_t allocator, pcp_workloads_rl_batch_t* out_batch) {
  memset(out_batch, 0, sizeof(*out_batch));
  PCP_RETURN_IF_ERROR_BARE(
      pack_validate(rollouts, advantages, count, rows, length));
  if (pad_id < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "pad_id: %d is negative (it is an embedding row)",
                           pad_id);
  }
  pcp_workloads_rl_batch_t* b = out_batch;
  b->allocator = allocator;
  b->rows = rows;
  b->length = length;
  size_t cells = (size_t)(rows * length);
  pcp_status_t status = pcp_allocator_malloc(allocator, cells * sizeof(int32_t),
                                             (void**)&b->input_ids);
  if (!status) {
    status = pcp_allocator_malloc(allocator, cells * sizeof(int32_t),
                                  (void**)&b->targets);
  }
  if (!status) {
    status = pcp_allocator_calloc(allocator, cells * sizeof(float),
                                  (void**)&b->mask);
  }
  if (!status) {
    status = pcp_allocator_calloc(allocator, cells * sizeof(float),
                                  (void**)&b->old_logp);
  }
  if (!status) {
    status = pcp_allocator_calloc(allocator, cells * sizeof(float),
                                  (void**)&b->ref_logp);
  }
  if (!status) {
    status = pcp_allocator_calloc(allocator, (size_t)rows * sizeof(float),
                                  (void**)&b->advantages);
  }
  if (status) {
    pcp_workloads_rl_batch_deinitialize(b);
    return pcp_status_annotate_f(status, "batch of %lld x %lld",
                                 (long long)rows, (long long)length);
  }
  for (size_t i = 0; i < cells; ++i) {
    b->input_ids[i] = pad_id;
    b->targets[i] = pad_id;
  }
  for (size_t i = 0; i < count; ++i) {
    pack_row(rollouts[i], advantages[i], (int64_t)i, b);
  }
  b->sequences = (int64_t)count;
  return pcp_ok_status();
}

void pcp_workloads_rl_batch_deinitialize(pcp_workloads_rl_batch_t* batch) {
  if (!batch) {
    return;
  }
  pcp_allocator_free(batch->allocator, batch->input_ids);
  pcp_allocator_free(batch->allocator, batch->targets);
  pcp_allocator_free(batch->allocator, batch->mask);
  pcp_allocator_free(batch->allocator, batch->old_logp);
  pcp_allocator_free(batch->allocator, batch->ref_logp);
  pcp_allocator_free(batch->allocator, batch->advantages);
  memset(batch, 0, sizeof(*batch));
}
