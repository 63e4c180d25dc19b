// SPDX-License-Identifier: Apache-2.0
// Group-normalised advantages (GRPO): each prompt's G rewards are compared
// with their own group, so no value network is needed.

#include <math.h>
#include <stdio.h>

#include "workloads/rl/rl.h"

void pcp_workloads_rl_advantage_options_initialize(
    pcp_workloads_rl_advantage_options_t* out_options) {
  out_options->group_size = 0;
  out_options->epsilon = PCP_RL_DEFAULT_ADVANTAGE_EPSILON;
  out_options->scale_by_std = true;
}

static pcp_status_t validate(
    const pcp_workloads_rl_advantage_options_t* options, const float* rewards,
    size_t count) {
  if (options->group_size < 2 || options->group_size > PCP_RL_MAX_GROUP_SIZE) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "group_size %lld is not in [2, %d]",
        (long long)options->group_size, PCP_RL_MAX_GROUP_SIZE);
  }
  // !(x >= 0) also catches NaN.
  if (!(options->epsilon >= 0.0 && options->epsilon <= 1.0)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "epsilon %g is not in [0, 1]", options->epsilon);
  }
  if (count == 0 || count > PCP_RL_MAX_SAMPLES) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "reward count %zu is not in [1, %zu]", count,
                           PCP_RL_MAX_SAMPLES);
  }
  if (count % (size_t)options->group_size != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "reward count %zu is not a multiple of group_size "
                           "%lld",
                           count, (long long)options->group_size);
  }
  if (rewards == NULL) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "rewards is NULL");
  }
  for (size_t i = 0; i < count; ++i) {
    if (!isfinite(rewards[i])) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "reward %zu (group %zu) is not finite (%g)", i,
                             i / (size_t)options->group_size,
                             (double)rewards[i]);
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_workloads_rl_advantages_compute(
    const pcp_workloads_rl_advantage_options_t* options, const float* rewards,
    size_t count, float* out_advantages,
    pcp_workloads_rl_advantage_stats_t* out_stats) {
  PCP_RETURN_IF_ERROR_BARE(validate(options, rewards, count));
  if (out_advantages == NULL) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "out_advantages is NULL");
  }
  const size_t g = (size_t)options->group_size;
  pcp_workloads_rl_advantage_stats_t stats = {.group_count =
                                                  (int64_t)(count / g)};
  // Overall stats first: |out_advantages| may alias |rewards|.
  double sum = 0.0;
  for (size_t i = 0; i < count; ++i) sum += rewards[i];
  stats.reward_mean = sum / (double)count;
  double squares = 0.0;
  for (size_t i = 0; i < count; ++i) {
    double d = rewards[i] - stats.reward_mean;
    squares += d * d;
  }
  stats.reward_std = sqrt(squares / (double)count);

  for (size_t start = 0; start < count; start += g) {
    const float* r = rewards + start;
    float* a = out_advantages + start;
    bool all_equal = true;
    double group_sum = 0.0;
    for (size_t i = 0; i < g; ++i) {
      group_sum += r[i];
      all_equal = all_equal && r[i] == r[0];
    }
    if (all_equal) {
      // Exactly zero: r - mean would leave the rounding residue of the mean
      // and, divided by epsilon, turn it into a spurious signal.
      for (size_t i = 0; i < g; ++i) a[i] = 0.0f;
      ++stats.degenerate_group_count;
      continue;
    }
    double mean = group_sum / (double)g;
    double group_squares = 0.0;
    for (size_t i = 0; i < g; ++i) {
      double d = r[i] - mean;
      group_squares += d * d;
    }
    double divisor = 1.0;
    if (options->scale_by_std) {
      divisor = sqrt(group_squares / (double)(g - 1)) + options->epsilon;
    }
    for (size_t i = 0; i < g; ++i) {
      a[i] = (float)((r[i] - mean) / divisor);
    }
  }
  if (out_stats != NULL) {
    *out_stats = stats;
  }
  return pcp_ok_status();
}
