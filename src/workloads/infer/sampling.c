// SPDX-License-Identifier: Apache-2.0
// Next-token sampling and the stop conditions of a generation.

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "workloads/workloads.h"

//===----------------------------------------------------------------------===//
// Parameters
//===----------------------------------------------------------------------===//

void pcp_sampling_params_initialize(pcp_sampling_params_t* out_params) {
  memset(out_params, 0, sizeof(*out_params));
  out_params->top_p = 1.0;
  out_params->repetition_penalty = 1.0;
}

pcp_status_t pcp_sampling_params_validate(const pcp_sampling_params_t* p) {
  if (!isfinite(p->temperature) || p->temperature < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "temperature must be finite and >= 0, not %g",
                           p->temperature);
  }
  if (p->top_k < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "top_k must be >= 0, not %lld", (long long)p->top_k);
  }
  if (!(p->top_p > 0 && p->top_p <= 1)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "top_p must be in (0, 1], not %g", p->top_p);
  }
  if (!isfinite(p->repetition_penalty) || p->repetition_penalty <= 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "repetition_penalty must be > 0, not %g",
                           p->repetition_penalty);
  }
  if (!(fabs(p->presence_penalty) <= 2) || !(fabs(p->frequency_penalty) <= 2)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "presence_penalty and frequency_penalty must be in "
                           "[-2, 2], not %g and %g",
                           p->presence_penalty, p->frequency_penalty);
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Sampler
//===----------------------------------------------------------------------===//

// Candidate for the sorted (top-k / top-p) path.
typedef struct candidate_t {
  double logit;
  int32_t id;
} candidate_t;

pcp_status_t pcp_sampler_initialize(const pcp_sampling_params_t* params,
                                    int64_t vocab, pcp_allocator_t allocator,
                                    pcp_sampler_t* out_sampler) {
  memset(out_sampler, 0, sizeof(*out_sampler));
  PCP_RETURN_IF_ERROR_BARE(pcp_sampling_params_validate(params));
  if (vocab <= 0 || vocab >= INT32_MAX) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "vocab must be in [1, 2^31), not %lld",
                           (long long)vocab);
  }
  out_sampler->allocator = allocator;
  out_sampler->params = *params;
  out_sampler->vocab = vocab;
  pcp_rng_initialize(params->seed, &out_sampler->rng);
  size_t n = (size_t)vocab;
  pcp_status_t status = pcp_allocator_malloc(allocator, n * sizeof(double),
                                             (void**)&out_sampler->scratch);
  if (!status) {
    status = pcp_allocator_malloc(allocator, n * sizeof(candidate_t),
                                  (void**)&out_sampler->candidates);
  }
  if (!status) {
    status = pcp_allocator_calloc(allocator, n * sizeof(uint32_t),
                                  (void**)&out_sampler->counts);
  }
  if (status) {
    pcp_sampler_deinitialize(out_sampler);
  }
  return status;
}

void pcp_sampler_deinitialize(pcp_sampler_t* sampler) {
  pcp_allocator_free(sampler->allocator, sampler->scratch);
  pcp_allocator_free(sampler->allocator, sampler->candidates);
  pcp_allocator_free(sampler->allocator, sampler->counts);
  memset(sampler, 0, sizeof(*sampler));
}

// Descending logit, then ascending id: ties go to the lowest id everywhere.
static int candidate_compare(const void* a, const void* b) {
  const candidate_t* x = a;
  const candidate_t* y = b;
  if (x->logit != y->logit) {
    return x->logit > y->logit ? -1 : 1;
  }
  return x->id < y->id ? -1 : (x->id > y->id);
}

// The |k| best entries of |s| (descending logit, ascending id), unsorted,
// through a min-heap of size k whose root is the worst kept candidate.
// Returns how many were kept (fewer than k if fewer are above -inf).
static bool worse(const candidate_t* a, const candidate_t* b) {
  return candidate_compare(a, b) > 0;
}

static void sift_down(candidate_t* heap, size_t size, size_t at) {
  for (;;) {
    size_t left = 2 * at + 1;
    size_t right = left + 1;
    size_t worst = at;
    if (left < size && worse(&heap[left], &heap[worst])) {
      worst = left;
    }
    if (right < size && worse(&heap[right], &heap[worst])) {
      worst = right;
    }
    if (worst == at) {
      return;
    }
    candidate_t swap = heap[at];
    heap[at] = heap[worst];
    heap[worst] = swap;
    at = worst;
  }
}

static size_t select_top_k(const double* s, size_t n, size_t k,
                           candidate_t* heap) {
  size_t size = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!(s[i] > -INFINITY)) {
      continue;
    }
    candidate_t c = {s[i], (int32_t)i};
    if (size < k) {
      // Sift up.
      size_t at = size++;
      heap[at] = c;
      while (at > 0 && worse(&heap[at], &heap[(at - 1) / 2])) {
        candidate_t swap = heap[at];
        heap[at] = heap[(at - 1) / 2];
        heap[(at - 1) / 2] = swap;
        at = (at - 1) / 2;
      }
    } else if (worse(&heap[0], &c)) {
      heap[0] = c;
      sift_down(heap, size, 0);
    }
  }
  return size;
}

static void apply_penalties(pcp_sampler_t* sampler, const int32_t* history,
                            size_t history_count) {
  const pcp_sampling_params_t* p = &sampler->params;
  if (history_count == 0 ||
      (p->repetition_penalty == 1.0 && p->presence_penalty == 0.0 &&
       p->frequency_penalty == 0.0)) {
    return;
  }
  double* s = sampler->scratch;
  uint32_t* counts = sampler->counts;
  for (size_t i = 0; i < history_count; ++i) {
    int32_t id = history[i];
    if (id >= 0 && id < sampler->vocab && counts[id] < UINT32_MAX) {
      ++counts[id];
    }
  }
  // Second pass applies each distinct id once and clears its count, so the
  // counts array is all zeros again without a V-sized memset per token.
  for (size_t i = 0; i < history_count; ++i) {
    int32_t id = history[i];
    if (id < 0 || id >= sampler->vocab || counts[id] == 0) {
      continue;
    }
    double value = s[id];
    if (isfinite(value)) {
      value = value > 0 ? value / p->repetition_penalty
                        : value * p->repetition_penalty;
      value -= p->presence_penalty + p->frequency_penalty * counts[id];
      s[id] = value;
    }
    counts[id] = 0;
  }
}

// Fills |out| (when not NULL): the sampled token's log-probability from its
// weight |token_weight| (exp((x - max) / T)) over |total|, the weights'
// sum over the set the token was drawn from, and the first |top_count| of
// |order| (sorted by candidate_compare; |logit| fields hold weights).
// Entries of zero weight (exp underflow) have no finite log-probability
// and are not listed.
static void logprobs_fill(const candidate_t* order, size_t count, double total,
                          double token_weight, size_t top_count,
                          pcp_sampler_logprobs_t* out) {
  if (!out) {
    return;
  }
  double log_total = log(total);
  out->logprob = (float)(log(token_weight) - log_total);
  out->top_count = 0;
  for (size_t j = 0; j < count && j < top_count; ++j) {
    if (!(order[j].logit > 0)) {
      break;
    }
    out->top[j].token = order[j].id;
    out->top[j].logprob = (float)(log(order[j].logit) - log_total);
    out->top_count = j + 1;
  }
}

static pcp_status_t sample(pcp_sampler_t* sampler, const float* logits,
                           const int32_t* history, size_t history_count,
                           size_t top_count, int32_t* out_token,
                           pcp_sampler_logprobs_t* out) {
  *out_token = -1;
  if (out) {
    memset(out, 0, sizeof(*out));
  }
  const pcp_sampling_params_t* p = &sampler->params;
  size_t n = (size_t)sampler->vocab;
  double* s = sampler->scratch;
  for (size_t i = 0; i < n; ++i) {
    // NaN (a broken program) must not win the argmax or poison the sum.
    s[i] = isnan(logits[i]) ? -INFINITY : (double)logits[i];
  }
  apply_penalties(sampler, history, history_count);
  // Argmax first: greedy needs nothing else and sampling needs the max for
  // a stable softmax (exp of non-positive numbers only).
  size_t best = 0;
  for (size_t i = 1; i < n; ++i) {
    if (s[i] > s[best]) {
      best = i;
    }
  }
  if (!(s[best] > -INFINITY) || s[best] == INFINITY) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "logits hold no finite maximum (all NaN or -inf, "
                           "or +inf)");
  }
  if (p->temperature == 0 || p->top_k == 1) {
    // Greedy: the sampling policy is a point mass on the argmax.
    *out_token = (int32_t)best;
    if (out && top_count > 0) {
      out->top[0].token = (int32_t)best;
      out->top_count = 1;
    }
    return pcp_ok_status();
  }
  double inverse_t = 1.0 / p->temperature;
  double max_logit = s[best];
  if (p->top_k == 0 && p->top_p >= 1.0) {
    // Plain temperature: inverse CDF in id order, no sort.
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
      s[i] = exp((s[i] - max_logit) * inverse_t);
      total += s[i];
    }
    double u = pcp_rng_next_double(&sampler->rng) * total;
    double cumulative = 0;
    size_t last_positive = best;
    size_t chosen = SIZE_MAX;
    for (size_t i = 0; i < n; ++i) {
      if (s[i] <= 0) {
        continue;
      }
      cumulative += s[i];
      last_positive = i;
      if (u < cumulative) {
        chosen = i;
        break;
      }
    }
    if (chosen == SIZE_MAX) {
      // Rounding left u at the very top: the last token with mass.
      chosen = last_positive;
    }
    *out_token = (int32_t)chosen;
    if (out) {
      // The candidates buffer is free on this path: the best weights.
      candidate_t* order = sampler->candidates;
      size_t kept = select_top_k(s, n,
                                 top_count < PCP_SAMPLER_MAX_TOP_LOGPROBS
                                     ? top_count
                                     : PCP_SAMPLER_MAX_TOP_LOGPROBS,
                                 order);
      qsort(order, kept, sizeof(candidate_t), candidate_compare);
      logprobs_fill(order, kept, total, s[chosen], top_count, out);
    }
    return pcp_ok_status();
  }
  // top-k / top-p: the candidates that can be kept, sorted by probability.
  // Sorting all V logits costs ~30 ms per token at V = 150k, so only a
  // small set is sorted: the k best (a bounded heap) for top-k, and for
  // top-p alone the tokens above a probability floor, when their mass
  // already reaches top_p (then the kept prefix lies inside them, since
  // every token below the floor is less likely than every token above it).
  candidate_t* order = sampler->candidates;
  size_t count = 0;
  // Mass of the whole distribution the top-p threshold refers to, when the
  // candidates are only part of it (negative: the candidates are all of it).
  double full_total = -1;
  if (p->top_k > 0 && (uint64_t)p->top_k < n) {
    count = select_top_k(s, n, (size_t)p->top_k, order);
  } else {
    double floor_weight[] = {1e-4, 1e-7, 0.0};
    size_t first_floor = p->top_p < 1.0 ? 0 : 2;
    double total_weight = 0;
    for (size_t i = 0; i < n; ++i) {
      total_weight += exp((s[i] - max_logit) * inverse_t);
    }
    full_total = total_weight;
    for (size_t f = first_floor; f < PCP_ARRAYSIZE(floor_weight); ++f) {
      // Logit floor equivalent to weight >= floor * total.
      double floor_logit =
          floor_weight[f] > 0
              ? max_logit + log(floor_weight[f] * total_weight) / inverse_t
              : -INFINITY;
      double mass = 0;
      count = 0;
      for (size_t i = 0; i < n; ++i) {
        if (s[i] > -INFINITY && s[i] >= floor_logit) {
          order[count].logit = s[i];
          order[count].id = (int32_t)i;
          mass += exp((s[i] - max_logit) * inverse_t);
          ++count;
        }
      }
      if (floor_weight[f] == 0 || mass >= p->top_p * total_weight) {
        break;
      }
    }
  }
  qsort(order, count, sizeof(candidate_t), candidate_compare);
  double total = 0;
  for (size_t j = 0; j < count; ++j) {
    order[j].logit = exp((order[j].logit - max_logit) * inverse_t);
    total += order[j].logit;
  }
  if (p->top_p < 1.0) {
    // Smallest prefix whose mass reaches top_p: a token is kept while the
    // mass before it is still below the threshold.
    double threshold = p->top_p * (full_total >= 0 ? full_total : total);
    double kept_mass = 0;
    size_t kept = 0;
    while (kept < count && kept_mass < threshold) {
      kept_mass += order[kept].logit;
      ++kept;
    }
    count = kept;
    total = kept_mass;
  }
  double u = pcp_rng_next_double(&sampler->rng) * total;
  double cumulative = 0;
  size_t chosen = count - 1;
  for (size_t j = 0; j < count; ++j) {
    cumulative += order[j].logit;
    if (u < cumulative) {
      chosen = j;
      break;
    }
  }
  *out_token = order[chosen].id;
  // The kept set renormalised: what the token was drawn from.
  logprobs_fill(order, count, total, order[chosen].logit, top_count, out);
  return pcp_ok_status();
}

pcp_status_t pcp_sampler_sample(pcp_sampler_t* sampler, const float* logits,
                                const int32_t* history, size_t history_count,
                                int32_t* out_token) {
  return sample(sampler, logits, history, history_count, 0, out_token, NULL);
}

pcp_status_t pcp_sampler_sample_logprobs(pcp_sampler_t* sampler,
                                         const float* logits,
                                         const int32_t* history,
                                         size_t history_count, size_t top_count,
                                         int32_t* out_token,
                                         pcp_sampler_logprobs_t* out_logprobs) {
  if (top_count > PCP_SAMPLER_MAX_TOP_LOGPROBS) {
    *out_token = -1;
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "top_logprobs must be in [0, %d], not %zu",
                           PCP_SAMPLER_MAX_TOP_LOGPROBS, top_count);
  }
  return sample(sampler, logits, history, history_count, top_count, out_token,
                out_logprobs);
}

pcp_status_t pcp_sampler_sample_batch(pcp_sampler_t* samplers, size_t batch,
                                      const float* logits,
                                      const int32_t* const* histories,
                                      const size_t* history_counts,
                                      int32_t* out_tokens) {
  for (size_t b = 0; b < batch; ++b) {
    size_t vocab = (size_t)samplers[0].vocab;
    if ((size_t)samplers[b].vocab != vocab) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "batch row %zu: vocab %lld, row 0 has %zu", b,
                             (long long)samplers[b].vocab, vocab);
    }
    const int32_t* history = histories ? histories[b] : NULL;
    size_t history_count = histories && history_counts ? history_counts[b] : 0;
    PCP_RETURN_IF_ERROR(
        pcp_sampler_sample(&samplers[b], logits + b * vocab, history,
                           history_count, &out_tokens[b]),
        "batch row %zu", b);
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Stop conditions
//===----------------------------------------------------------------------===//

const char* pcp_finish_reason_name(pcp_finish_reason_t reason) {
  switch (reason) {
    case PCP_FINISH_REASON_STOP:
      return "stop";
    case PCP_FINISH_REASON_LENGTH:
      return "length";
    default:
      return NULL;
  }
}

pcp_status_t pcp_stop_state_initialize(int64_t max_tokens,
                                       const int32_t* eos_ids, size_t eos_count,
                                       const char* const* sequences,
                                       size_t sequence_count,
                                       pcp_allocator_t allocator,
                                       pcp_stop_state_t* out_state) {
  memset(out_state, 0, sizeof(*out_state));
  if (max_tokens <= 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "max_tokens must be > 0, not %lld",
                           (long long)max_tokens);
  }
  if (eos_count > PCP_STOP_MAX_EOS_IDS ||
      sequence_count > PCP_STOP_MAX_SEQUENCES) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "at most %d EOS ids and %d stop sequences",
                           PCP_STOP_MAX_EOS_IDS, PCP_STOP_MAX_SEQUENCES);
  }
  for (size_t i = 0; i < sequence_count; ++i) {
    size_t length = strlen(sequences[i]);
    if (length == 0 || length > PCP_STOP_MAX_SEQUENCE_BYTES) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "stop sequence %zu must have 1 to %d bytes, not "
                             "%zu",
                             i, PCP_STOP_MAX_SEQUENCE_BYTES, length);
    }
    memcpy(out_state->sequences[i], sequences[i], length + 1);
    out_state->sequence_lengths[i] = length;
  }
  out_state->max_tokens = max_tokens;
  out_state->eos_count = eos_count;
  if (eos_count > 0) {
    memcpy(out_state->eos_ids, eos_ids, eos_count * sizeof(int32_t));
  }
  out_state->sequence_count = sequence_count;
  pcp_string_builder_initialize(allocator, 0, &out_state->held);
  return pcp_ok_status();
}

void pcp_stop_state_deinitialize(pcp_stop_state_t* state) {
  pcp_string_builder_deinitialize(&state->held);
}

// First index of |needle| in |haystack|, or SIZE_MAX (memmem is a GNU
// extension, and both strings are short).
static size_t find_bytes(const char* haystack, size_t haystack_length,
                         const char* needle, size_t needle_length) {
  if (needle_length > haystack_length) {
    return SIZE_MAX;
  }
  for (size_t i = 0; i + needle_length <= haystack_length; ++i) {
    if (memcmp(haystack + i, needle, needle_length) == 0) {
      return i;
    }
  }
  return SIZE_MAX;
}

// Moves the first |count| held bytes to |out_text|.
static pcp_status_t release(pcp_stop_state_t* state, size_t count,
                            pcp_string_builder_t* out_text) {
  pcp_string_builder_t* held = &state->held;
  if (count > 0) {
    PCP_RETURN_IF_ERROR_BARE(pcp_string_builder_append(
        out_text, pcp_make_string_view(held->data, count)));
    memmove(held->data, held->data + count, held->size - count);
    held->size -= count;
    held->data[held->size] = 0;
  }
  return pcp_ok_status();
}

static void discard_held(pcp_stop_state_t* state) {
  pcp_string_builder_reset(&state->held);
}

pcp_status_t pcp_stop_state_push(pcp_stop_state_t* state, int32_t token,
                                 const char* text, size_t text_length,
                                 pcp_string_builder_t* out_text,
                                 pcp_finish_reason_t* out_reason) {
  *out_reason = PCP_FINISH_REASON_NONE;
  if (state->finish_reason != PCP_FINISH_REASON_NONE) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "the generation already finished (%s)",
                           pcp_finish_reason_name(state->finish_reason));
  }
  ++state->generated;
  for (size_t i = 0; i < state->eos_count; ++i) {
    if (state->eos_ids[i] == token) {
      PCP_RETURN_IF_ERROR_BARE(release(state, state->held.size, out_text));
      state->finish_reason = *out_reason = PCP_FINISH_REASON_STOP;
      return pcp_ok_status();
    }
  }
  pcp_string_builder_t* held = &state->held;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_string_builder_append(held, pcp_make_string_view(text, text_length)));
  // Earliest occurrence of any stop sequence in the held text.
  size_t stop_at = SIZE_MAX;
  for (size_t i = 0; i < state->sequence_count; ++i) {
    size_t at = find_bytes(held->data, held->size, state->sequences[i],
                           state->sequence_lengths[i]);
    if (at < stop_at) {
      stop_at = at;
    }
  }
  if (stop_at != SIZE_MAX) {
    PCP_RETURN_IF_ERROR_BARE(release(state, stop_at, out_text));
    discard_held(state);
    state->finish_reason = *out_reason = PCP_FINISH_REASON_STOP;
    return pcp_ok_status();
  }
  if (state->generated >= state->max_tokens) {
    PCP_RETURN_IF_ERROR_BARE(release(state, held->size, out_text));
    state->finish_reason = *out_reason = PCP_FINISH_REASON_LENGTH;
    return pcp_ok_status();
  }
  // Hold back the longest suffix that is a proper prefix of some stop
  // sequence: the next token may complete it. Everything before it can no
  // longer be part of a match and goes out now.
  size_t keep = 0;
  for (size_t i = 0; i < state->sequence_count; ++i) {
    size_t length = state->sequence_lengths[i];
    size_t longest = length - 1 < held->size ? length - 1 : held->size;
    for (size_t k = longest; k > keep; --k) {
      if (memcmp(held->data + held->size - k, state->sequences[i], k) == 0) {
        keep = k;
        break;
      }
    }
  }
  return release(state, held->size - keep, out_text);
}

pcp_status_t pcp_stop_state_flush(pcp_stop_state_t* state,
                                  pcp_string_builder_t* out_text) {
  return release(state, state->held.size, out_text);
}
