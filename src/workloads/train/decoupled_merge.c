// SPDX-License-Identifier: Apache-2.0
// Decoupled DiLoCo: merge weights and merges, the outer Nesterov per
// fragment, learner counters and alpha blending (reference s.1.3). See
// decoupled.h.

#include <float.h>
#include <math.h>
#include <string.h>

#include "workloads/train/decoupled.h"

//===----------------------------------------------------------------------===//
// Merges
//===----------------------------------------------------------------------===//

static const char* const kMergeNames[] = {
    "weighted_average",
    "rda",
    "avg_embedding_rda_model",
    "rda_embedding_avg_model",
};

pcp_status_t pcp_decoupled_merge_strategy_parse(
    const char* name, pcp_decoupled_merge_strategy_t* out_strategy) {
  for (size_t i = 0; name != NULL && i < PCP_ARRAYSIZE(kMergeNames); ++i) {
    if (strcmp(name, kMergeNames[i]) == 0) {
      *out_strategy = (pcp_decoupled_merge_strategy_t)i;
      return pcp_ok_status();
    }
  }
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                         "merge_strategy '%s': want weighted_average, rda, "
                         "avg_embedding_rda_model or rda_embedding_avg_model",
                         name ? name : "(null)");
}

pcp_decoupled_merge_strategy_t pcp_decoupled_merge_strategy_for_role(
    pcp_decoupled_merge_strategy_t strategy, pcp_decoupled_role_t role) {
  bool embedding = role == PCP_DECOUPLED_ROLE_EMBEDDING;
  switch (strategy) {
    case PCP_DECOUPLED_MERGE_AVG_EMBEDDING_RDA_MODEL:
      return embedding ? PCP_DECOUPLED_MERGE_WEIGHTED_AVERAGE
                       : PCP_DECOUPLED_MERGE_RDA;
    case PCP_DECOUPLED_MERGE_RDA_EMBEDDING_AVG_MODEL:
      return embedding ? PCP_DECOUPLED_MERGE_RDA
                       : PCP_DECOUPLED_MERGE_WEIGHTED_AVERAGE;
    default:
      return strategy;
  }
}

double pcp_decoupled_merge_weight(uint64_t tokens_since, uint64_t steps_since) {
  if (tokens_since == 0)
    return 0.0;
  double tokens = (double)tokens_since;
  double w = tokens * tokens / (double)(steps_since > 0 ? steps_since : 1);
  // Upstream keeps the weight in f32 and saturates there.
  return w > (double)FLT_MAX ? (double)FLT_MAX : w;
}

static bool weight_usable(double w) {
  return isfinite(w) && w > 0.0;
}

uint32_t pcp_decoupled_merge_usable_count(const double* weights,
                                          uint32_t count) {
  uint32_t usable = 0;
  for (uint32_t i = 0; i < count; ++i) {
    usable += weight_usable(weights[i]);
  }
  return usable;
}

// delta_i[j] = global[j] - learner_i[j]; a non-finite one reads as 0.
static inline double delta_at(const float* global, const float* learner,
                              size_t j, uint64_t* inout_sanitized) {
  double d = (double)global[j] - (double)learner[j];
  if (!isfinite(d)) {
    ++*inout_sanitized;
    return 0.0;
  }
  return d;
}

pcp_status_t pcp_decoupled_merge_tensor(
    pcp_decoupled_merge_strategy_t strategy, const float* global_before,
    const float* const* learner_values, const double* weights,
    uint32_t learner_count, size_t count, float* out_outer_gradient,
    pcp_decoupled_merge_stats_t* out_stats) {
  if (strategy != PCP_DECOUPLED_MERGE_WEIGHTED_AVERAGE &&
      strategy != PCP_DECOUPLED_MERGE_RDA) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "merge of one tensor: strategy %d is model-level "
                           "(use pcp_decoupled_merge_strategy_for_role)",
                           (int)strategy);
  }
  if (learner_count > PCP_DECOUPLED_MAX_LEARNERS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "merge: %u learners, limit %u", learner_count,
                           PCP_DECOUPLED_MAX_LEARNERS);
  }
  pcp_decoupled_merge_stats_t stats;
  memset(&stats, 0, sizeof(stats));
  double total_weight = 0.0;
  for (uint32_t i = 0; i < learner_count; ++i) {
    if (!weight_usable(weights[i]))
      continue;
    total_weight += weights[i];
    stats.used_learners++;
  }
  // Only the first pass over a learner's delta counts sanitized elements,
  // so each bad element is counted once per learner.
  uint64_t scratch = 0;
  if (strategy == PCP_DECOUPLED_MERGE_WEIGHTED_AVERAGE || total_weight <= 0) {
    double norm2 = 0.0;
    for (size_t j = 0; j < count; ++j) {
      double sum = 0.0;
      for (uint32_t i = 0; i < learner_count; ++i) {
        if (!weight_usable(weights[i]))
          continue;
        sum += weights[i] * delta_at(global_before, learner_values[i], j,
                                     &stats.sanitized_count);
      }
      float v = total_weight > 0.0 ? (float)(sum / total_weight) : 0.0f;
      out_outer_gradient[j] = v;
      norm2 += (double)v * (double)v;
    }
    stats.output_norm = sqrt(norm2);
    if (out_stats)
      *out_stats = stats;
    return pcp_ok_status();
  }

  // RDA: norms first (f64), then the weighted direction, rescaled to the
  // weighted mean norm.
  double norms[PCP_DECOUPLED_MAX_LEARNERS];
  double weighted_norm_sum = 0.0;
  for (uint32_t i = 0; i < learner_count; ++i) {
    norms[i] = 0.0;
    if (!weight_usable(weights[i]))
      continue;
    double n2 = 0.0;
    for (size_t j = 0; j < count; ++j) {
      double d =
          delta_at(global_before, learner_values[i], j, &stats.sanitized_count);
      n2 += d * d;
    }
    norms[i] = sqrt(n2);
    weighted_norm_sum += weights[i] * norms[i];
  }
  double mean_norm = weighted_norm_sum / total_weight;
  // Direction into the output (f64 per element would need a buffer; two
  // passes in f64 instead: norm of dir, then the scaled write).
  double dir_norm2 = 0.0;
  for (size_t j = 0; j < count; ++j) {
    double dir = 0.0;
    for (uint32_t i = 0; i < learner_count; ++i) {
      if (!weight_usable(weights[i]) || norms[i] <= 0.0)
        continue;
      dir += (weights[i] / norms[i]) *
             delta_at(global_before, learner_values[i], j, &scratch);
    }
    dir_norm2 += dir * dir;
  }
  double dir_norm = sqrt(dir_norm2);
  double scale = 0.0;
  if (dir_norm > 0.0 && isfinite(dir_norm))
    scale = mean_norm / dir_norm;
  if (!isfinite(scale))
    scale = 0.0;
  double norm2 = 0.0;
  for (size_t j = 0; j < count; ++j) {
    double dir = 0.0;
    if (scale != 0.0) {
      for (uint32_t i = 0; i < learner_count; ++i) {
        if (!weight_usable(weights[i]) || norms[i] <= 0.0)
          continue;
        dir += (weights[i] / norms[i]) *
               delta_at(global_before, learner_values[i], j, &scratch);
      }
    }
    float v = (float)(dir * scale);
    out_outer_gradient[j] = v;
    norm2 += (double)v * (double)v;
  }
  stats.output_norm = sqrt(norm2);
  if (out_stats)
    *out_stats = stats;
  return pcp_ok_status();
}

pcp_status_t pcp_decoupled_merge_fragment(
    const pcp_decoupled_plan_t* plan, uint32_t fragment_id,
    pcp_decoupled_merge_strategy_t strategy, const float* global_before,
    const float* const* learner_values, const double* weights,
    uint32_t learner_count, float* out_outer_gradient,
    pcp_decoupled_merge_stats_t* out_stats) {
  if (fragment_id >= plan->fragment_count) {
    return pcp_make_status(PCP_STATUS_OUT_OF_RANGE, "fragment %u of %u",
                           fragment_id, plan->fragment_count);
  }
  if (learner_count > PCP_DECOUPLED_MAX_LEARNERS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "merge: %u learners, limit %u", learner_count,
                           PCP_DECOUPLED_MAX_LEARNERS);
  }
  const pcp_decoupled_fragment_t* fr = &plan->fragments[fragment_id];
  pcp_decoupled_merge_stats_t total;
  memset(&total, 0, sizeof(total));
  double norm2 = 0.0;
  const float* views[PCP_DECOUPLED_MAX_LEARNERS];
  for (uint32_t k = 0; k < fr->tensor_count; ++k) {
    uint32_t t = fr->tensor_indices[k];
    size_t at = (size_t)(fr->offset_bytes[k] / 4u);
    for (uint32_t i = 0; i < learner_count; ++i) {
      views[i] = learner_values[i] + at;
    }
    pcp_decoupled_merge_stats_t stats;
    PCP_RETURN_IF_ERROR(
        pcp_decoupled_merge_tensor(
            pcp_decoupled_merge_strategy_for_role(
                strategy, (pcp_decoupled_role_t)plan->tensor_role[t]),
            global_before + at, views, weights, learner_count,
            (size_t)plan->tensor_values[t], out_outer_gradient + at, &stats),
        "fragment %u tensor %u", fragment_id, t);
    total.sanitized_count += stats.sanitized_count;
    total.used_learners = stats.used_learners;
    norm2 += stats.output_norm * stats.output_norm;
  }
  total.output_norm = sqrt(norm2);
  if (out_stats)
    *out_stats = total;
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Outer Nesterov per fragment
//===----------------------------------------------------------------------===//

pcp_status_t pcp_decoupled_nesterov_initialize(
    pcp_allocator_t allocator, size_t parameter_count, float learning_rate,
    float momentum, pcp_decoupled_nesterov_t* out_nesterov) {
  memset(out_nesterov, 0, sizeof(*out_nesterov));
  size_t bytes = 0;
  if (__builtin_mul_overflow(parameter_count, sizeof(float), &bytes)) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "outer Nesterov: %zu values", parameter_count);
  }
  void* velocity = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(allocator, bytes == 0 ? 1 : bytes, &velocity),
      "outer Nesterov velocity (%zu values)", parameter_count);
  out_nesterov->allocator = allocator;
  out_nesterov->learning_rate = learning_rate;
  out_nesterov->momentum = momentum;
  out_nesterov->velocity = velocity;
  out_nesterov->count = parameter_count;
  return pcp_ok_status();
}

void pcp_decoupled_nesterov_deinitialize(pcp_decoupled_nesterov_t* nesterov) {
  if (nesterov == NULL)
    return;
  pcp_allocator_free(nesterov->allocator, nesterov->velocity);
  memset(nesterov, 0, sizeof(*nesterov));
}

pcp_status_t pcp_decoupled_nesterov_step_fragment(
    pcp_decoupled_nesterov_t* nesterov, const pcp_decoupled_plan_t* plan,
    uint32_t fragment_id, const float* outer_gradient, float* inout_params) {
  if (fragment_id >= plan->fragment_count) {
    return pcp_make_status(PCP_STATUS_OUT_OF_RANGE, "fragment %u of %u",
                           fragment_id, plan->fragment_count);
  }
  uint32_t last = plan->tensor_count - 1;
  uint64_t total = plan->tensor_value_offset[last] + plan->tensor_values[last];
  if (total != nesterov->count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "outer Nesterov holds %zu values, the plan %llu",
                           nesterov->count, (unsigned long long)total);
  }
  const pcp_decoupled_fragment_t* fr = &plan->fragments[fragment_id];
  const float mu = nesterov->momentum;
  const float lr = nesterov->learning_rate;
  for (uint32_t k = 0; k < fr->tensor_count; ++k) {
    uint32_t t = fr->tensor_indices[k];
    const float* g = outer_gradient + fr->offset_bytes[k] / 4u;
    float* v = nesterov->velocity + plan->tensor_value_offset[t];
    float* theta = inout_params + plan->tensor_value_offset[t];
    for (uint64_t j = 0; j < plan->tensor_values[t]; ++j) {
      // Two f32 roundings per line, as the NumPy reference: no FMA
      // (compiled with -ffp-contract=off).
      float vj = mu * v[j] + g[j];
      v[j] = vj;
      float step = g[j] + mu * vj;
      theta[j] = theta[j] - lr * step;
    }
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Learner counters and blending
//===----------------------------------------------------------------------===//

pcp_status_t pcp_decoupled_learner_initialize(
    pcp_allocator_t allocator, uint16_t node_id, uint32_t fragment_count,
    pcp_decoupled_learner_t* out_learner) {
  memset(out_learner, 0, sizeof(*out_learner));
  if (node_id == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "learner node id 0: that is the syncer's");
  }
  if (fragment_count == 0 || fragment_count > PCP_DECOUPLED_MAX_FRAGMENTS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "learner: %u fragments, want [1, %u]",
                           fragment_count, PCP_DECOUPLED_MAX_FRAGMENTS);
  }
  void* steps = NULL;
  void* tokens = NULL;
  size_t bytes = sizeof(uint64_t) * fragment_count;
  PCP_RETURN_IF_ERROR(pcp_allocator_calloc(allocator, bytes, &steps),
                      "learner counters");
  pcp_status_t status = pcp_allocator_calloc(allocator, bytes, &tokens);
  if (status != NULL) {
    pcp_allocator_free(allocator, steps);
    return pcp_status_annotate_f(status, "learner counters");
  }
  out_learner->allocator = allocator;
  out_learner->node_id = node_id;
  out_learner->fragment_count = fragment_count;
  pcp_decoupled_clock_initialize(&out_learner->clock);
  out_learner->steps_since = steps;
  out_learner->tokens_since = tokens;
  return pcp_ok_status();
}

void pcp_decoupled_learner_deinitialize(pcp_decoupled_learner_t* learner) {
  if (learner == NULL)
    return;
  pcp_allocator_free(learner->allocator, learner->steps_since);
  pcp_allocator_free(learner->allocator, learner->tokens_since);
  memset(learner, 0, sizeof(*learner));
}

static uint64_t add_saturating(uint64_t a, uint64_t b) {
  uint64_t s = 0;
  return __builtin_add_overflow(a, b, &s) ? UINT64_MAX : s;
}

void pcp_decoupled_learner_record_step(pcp_decoupled_learner_t* learner,
                                       uint64_t tokens) {
  learner->learner_step = add_saturating(learner->learner_step, 1);
  // Two entries at most (its own and the syncer's): never full.
  PCP_CHECK_OK(pcp_decoupled_clock_tick(&learner->clock, learner->node_id));
  for (uint32_t f = 0; f < learner->fragment_count; ++f) {
    learner->steps_since[f] = add_saturating(learner->steps_since[f], 1);
    learner->tokens_since[f] = add_saturating(learner->tokens_since[f], tokens);
  }
}

pcp_status_t pcp_decoupled_learner_apply_fragment(
    pcp_decoupled_learner_t* learner, uint32_t fragment_id,
    uint64_t syncer_step) {
  if (fragment_id >= learner->fragment_count) {
    return pcp_make_status(PCP_STATUS_OUT_OF_RANGE, "fragment %u of %u",
                           fragment_id, learner->fragment_count);
  }
  learner->steps_since[fragment_id] = 0;
  learner->tokens_since[fragment_id] = 0;
  if (syncer_step > learner->observed_global_step) {
    learner->observed_global_step = syncer_step;
  }
  return pcp_decoupled_clock_observe(&learner->clock, 0, syncer_step);
}

bool pcp_decoupled_learner_should_continue(
    const pcp_decoupled_learner_t* learner, uint64_t max_syncer_steps) {
  return max_syncer_steps == 0 ||
         learner->observed_global_step < max_syncer_steps;
}

pcp_status_t pcp_decoupled_blend(float alpha, const float* global,
                                 float* inout_local, size_t count,
                                 uint64_t* out_nonfinite_count) {
  if (!(alpha >= 0.0f && alpha <= 1.0f)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "learner_alpha %g: must be in [0, 1]",
                           (double)alpha);
  }
  uint64_t bad = 0;
  const float beta = 1.0f - alpha;
  for (size_t j = 0; j < count; ++j) {
    // alpha 0 is an overwrite (0*inf would be NaN otherwise).
    float v =
        alpha == 0.0f ? global[j] : alpha * inout_local[j] + beta * global[j];
    if (!isfinite(v)) {
      v = 0.0f;
      ++bad;
    }
    inout_local[j] = v;
  }
  if (out_nonfinite_count)
    *out_nonfinite_count = bad;
  return pcp_ok_status();
}
