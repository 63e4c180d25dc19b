// SPDX-License-Identifier: Apache-2.0
// DiLoCo outer step, streaming DiLoCo schedule/mixing and wire accounting
// (formulas: reference upstream-workloads.md s.1.1-1.2, docs/training.md).

#include <math.h>
#include <string.h>

#include "workloads/workloads.h"

void pcp_diloco_delta_compute(const float* theta_global,
                              const float* theta_local, size_t count,
                              float* out_delta) {
  // Upstream sign: initial - final, so the outer step subtracts it like a
  // gradient.
  for (size_t i = 0; i < count; ++i) {
    out_delta[i] = theta_global[i] - theta_local[i];
  }
}

// Round to nearest even on the top 16 bits; NaN keeps a quiet payload so it
// cannot round into Inf. Done here rather than with the compute module's
// scalar helper so this module does not pull in the IREE backend.
static uint16_t f32_to_bf16(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return (uint16_t)((bits >> 16) | 0x0040u);
  }
  uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return (uint16_t)((bits + rounding) >> 16);
}

static float bf16_to_f32(uint16_t value) {
  uint32_t bits = (uint32_t)value << 16;
  float out;
  memcpy(&out, &bits, sizeof(out));
  return out;
}

void pcp_diloco_bf16_quantize(const float* values, size_t count,
                              uint16_t* out) {
  for (size_t i = 0; i < count; ++i) out[i] = f32_to_bf16(values[i]);
}

void pcp_diloco_bf16_dequantize(const uint16_t* values, size_t count,
                                float* out) {
  for (size_t i = 0; i < count; ++i) out[i] = bf16_to_f32(values[i]);
}

//===----------------------------------------------------------------------===//
// Accumulator
//===----------------------------------------------------------------------===//

pcp_status_t pcp_diloco_accumulator_initialize(
    pcp_allocator_t allocator, size_t count,
    pcp_diloco_accumulator_t* out_accumulator) {
  memset(out_accumulator, 0, sizeof(*out_accumulator));
  if (count > SIZE_MAX / sizeof(float)) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "accumulator of %zu elements", count);
  }
  void* sum = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(allocator, count * sizeof(float) + 1, &sum),
      "diloco accumulator");
  out_accumulator->allocator = allocator;
  out_accumulator->sum = sum;
  out_accumulator->count = count;
  return pcp_ok_status();
}

void pcp_diloco_accumulator_deinitialize(
    pcp_diloco_accumulator_t* accumulator) {
  if (accumulator->sum != NULL) {
    pcp_allocator_free(accumulator->allocator, accumulator->sum);
  }
  memset(accumulator, 0, sizeof(*accumulator));
}

void pcp_diloco_accumulator_reset(pcp_diloco_accumulator_t* accumulator) {
  memset(accumulator->sum, 0, accumulator->count * sizeof(float));
  accumulator->contributor_count = 0;
}

static pcp_status_t check_count(const pcp_diloco_accumulator_t* accumulator,
                                size_t count) {
  if (count != accumulator->count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "delta of %zu elements, expected %zu", count,
                           accumulator->count);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_diloco_accumulator_add_f32(
    pcp_diloco_accumulator_t* accumulator, const float* delta, size_t count) {
  PCP_RETURN_IF_ERROR_BARE(check_count(accumulator, count));
  for (size_t i = 0; i < count; ++i) accumulator->sum[i] += delta[i];
  accumulator->contributor_count++;
  return pcp_ok_status();
}

pcp_status_t pcp_diloco_accumulator_add_bf16(
    pcp_diloco_accumulator_t* accumulator, const uint16_t* delta,
    size_t count) {
  PCP_RETURN_IF_ERROR_BARE(check_count(accumulator, count));
  // Widening bf16 is exact (<< 16); the sum stays f32 as upstream's.
  for (size_t i = 0; i < count; ++i) {
    accumulator->sum[i] += bf16_to_f32(delta[i]);
  }
  accumulator->contributor_count++;
  return pcp_ok_status();
}

pcp_status_t pcp_diloco_accumulator_average(
    const pcp_diloco_accumulator_t* accumulator, float* out_average,
    size_t* out_nonfinite_count) {
  if (out_nonfinite_count != NULL)
    *out_nonfinite_count = 0;
  if (accumulator->contributor_count == 0) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "no worker reported this round");
  }
  // Divide (not multiply by 1/n) so the result is the correctly rounded
  // mean of the f32 sum, which NumPy reproduces exactly.
  float n = (float)accumulator->contributor_count;
  size_t nonfinite = 0;
  for (size_t i = 0; i < accumulator->count; ++i) {
    float v = accumulator->sum[i] / n;
    if (!isfinite(v)) {
      v = 0.0f;
      ++nonfinite;
    }
    out_average[i] = v;
  }
  if (out_nonfinite_count != NULL)
    *out_nonfinite_count = nonfinite;
  return pcp_ok_status();
}

pcp_status_t pcp_diloco_gradient_average(const float* const* inputs,
                                         uint32_t count, size_t length,
                                         float* out) {
  if (count == 0 || !inputs) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "gradient average of no worker");
  }
  float n = (float)count;
  for (size_t e = 0; e < length; ++e) {
    float sum = inputs[0][e];
    for (uint32_t k = 1; k < count; ++k) {
      sum += inputs[k][e];
    }
    if (!isfinite(sum)) {
      // Name the input that holds the first non-finite value (the sum of
      // finite values can overflow too: then none does).
      for (uint32_t k = 0; k < count; ++k) {
        if (!isfinite(inputs[k][e])) {
          return pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                                 "gradient element %zu of worker %u is %f: "
                                 "training diverged",
                                 e, k, (double)inputs[k][e]);
        }
      }
      return pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                             "gradient element %zu overflows f32 when "
                             "summed over %u workers: training diverged",
                             e, count);
    }
    out[e] = sum / n;
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Nesterov
//===----------------------------------------------------------------------===//

pcp_status_t pcp_diloco_nesterov_initialize(
    pcp_allocator_t allocator, size_t count, float learning_rate,
    float momentum, pcp_diloco_nesterov_t* out_nesterov) {
  memset(out_nesterov, 0, sizeof(*out_nesterov));
  if (count > SIZE_MAX / sizeof(float) - 1) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "nesterov of %zu elements", count);
  }
  void* velocity = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(allocator, count * sizeof(float) + 1, &velocity),
      "nesterov velocity");
  out_nesterov->allocator = allocator;
  out_nesterov->learning_rate = learning_rate;
  out_nesterov->momentum = momentum;
  out_nesterov->velocity = velocity;
  out_nesterov->count = count;
  return pcp_ok_status();
}

void pcp_diloco_nesterov_deinitialize(pcp_diloco_nesterov_t* nesterov) {
  if (nesterov->velocity != NULL) {
    pcp_allocator_free(nesterov->allocator, nesterov->velocity);
  }
  memset(nesterov, 0, sizeof(*nesterov));
}

pcp_status_t pcp_diloco_nesterov_step(pcp_diloco_nesterov_t* nesterov,
                                      size_t offset, size_t count,
                                      const float* g, float* theta) {
  if (offset > nesterov->count || count > nesterov->count - offset) {
    return pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                           "nesterov range [%zu, +%zu) of %zu", offset, count,
                           nesterov->count);
  }
  const float lr = nesterov->learning_rate;
  const float mu = nesterov->momentum;
  float* v = nesterov->velocity + offset;
  for (size_t i = 0; i < count; ++i) {
    // v <- mu*v + g ; theta <- theta - lr*(g + mu*v): each operation is one
    // f32 rounding, in this order, so NumPy float32 matches bit for bit
    // (no FMA contraction: -ffp-contract is off for this file).
    float vi = mu * v[i];
    vi = vi + g[i];
    v[i] = vi;
    float look = mu * vi;
    look = g[i] + look;
    theta[i] = theta[i] - lr * look;
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Streaming DiLoCo
//===----------------------------------------------------------------------===//

uint64_t pcp_streaming_diloco_phase(
    const pcp_streaming_diloco_schedule_t* schedule, uint32_t fragment) {
  return (uint64_t)fragment * schedule->inner_steps / schedule->fragments;
}

uint64_t pcp_streaming_diloco_max_steps(
    const pcp_streaming_diloco_schedule_t* schedule) {
  return (uint64_t)schedule->max_rounds * schedule->inner_steps +
         pcp_streaming_diloco_phase(schedule, schedule->fragments - 1) +
         schedule->overlap_tau;
}

static bool fires_at(const pcp_streaming_diloco_schedule_t* schedule,
                     uint64_t offset, uint64_t step, uint32_t* out_round) {
  if (step <= offset)
    return false;
  uint64_t since = step - offset;
  if (since % schedule->inner_steps != 0)
    return false;
  uint64_t round = since / schedule->inner_steps - 1;
  if (round >= schedule->max_rounds)
    return false;
  if (out_round != NULL)
    *out_round = (uint32_t)round;
  return true;
}

bool pcp_streaming_diloco_sends_at(
    const pcp_streaming_diloco_schedule_t* schedule, uint32_t fragment,
    uint64_t step, uint32_t* out_round) {
  return fires_at(schedule, pcp_streaming_diloco_phase(schedule, fragment),
                  step, out_round);
}

bool pcp_streaming_diloco_receives_at(
    const pcp_streaming_diloco_schedule_t* schedule, uint32_t fragment,
    uint64_t step, uint32_t* out_round) {
  return fires_at(
      schedule,
      pcp_streaming_diloco_phase(schedule, fragment) + schedule->overlap_tau,
      step, out_round);
}

void pcp_streaming_diloco_fragment_delta(float* inout_snapshot,
                                         const float* current, size_t count,
                                         float* out_delta) {
  for (size_t i = 0; i < count; ++i) {
    out_delta[i] = inout_snapshot[i] - current[i];
    inout_snapshot[i] = current[i];
  }
}

void pcp_streaming_diloco_mix(float alpha, const float* theta_global,
                              float* inout_theta_local, float* out_snapshot,
                              size_t count) {
  const float beta = 1.0f - alpha;
  for (size_t i = 0; i < count; ++i) {
    float a = alpha * inout_theta_local[i];
    float b = beta * theta_global[i];
    float mixed = a + b;
    inout_theta_local[i] = mixed;
    out_snapshot[i] = mixed;
  }
}

//===----------------------------------------------------------------------===//
// Wire accounting
//===----------------------------------------------------------------------===//

size_t pcp_diloco_wire_dtype_size(pcp_diloco_wire_dtype_t dtype) {
  return dtype == PCP_DILOCO_WIRE_BF16 ? 2 : 4;
}

uint64_t pcp_diloco_outer_step_wire_bytes(uint64_t parameter_count,
                                          uint32_t workers,
                                          pcp_diloco_wire_dtype_t up_dtype,
                                          pcp_diloco_wire_dtype_t down_dtype) {
  return (uint64_t)workers * parameter_count *
         (pcp_diloco_wire_dtype_size(up_dtype) +
          pcp_diloco_wire_dtype_size(down_dtype));
}

uint64_t pcp_streaming_diloco_fragment_wire_bytes(
    uint64_t fragment_elements, uint32_t workers,
    pcp_diloco_wire_dtype_t up_dtype) {
  return (uint64_t)workers * fragment_elements *
         (pcp_diloco_wire_dtype_size(up_dtype) + 4);
}

uint64_t pcp_diloco_ring_allreduce_wire_bytes(uint64_t parameter_count,
                                              uint32_t workers,
                                              uint64_t steps) {
  if (workers <= 1)
    return 0;
  // Each of W workers sends 2(W-1)/W of the f32 parameter bytes per step
  // (reduce-scatter + all-gather); summed over workers: 2(W-1) * bytes.
  return 2ull * (workers - 1) * parameter_count * 4ull * steps;
}

//===----------------------------------------------------------------------===//
// Inner learning-rate schedule
//===----------------------------------------------------------------------===//

// M_PI is POSIX, not C17.
static const double kPi = 3.14159265358979323846;

void pcp_diloco_lr_schedule_initialize(const pcp_diloco_config_t* config,
                                       uint64_t total_steps,
                                       pcp_diloco_lr_schedule_t* out_schedule) {
  memset(out_schedule, 0, sizeof(*out_schedule));
  out_schedule->kind = (pcp_diloco_lr_schedule_kind_t)config->lr_schedule;
  out_schedule->base = config->learning_rate;
  out_schedule->min_lr = config->min_lr;
  out_schedule->warmup_steps =
      config->lr_schedule == PCP_DILOCO_LR_CONSTANT
          ? 0
          : (uint64_t)(config->warmup_steps > 0 ? config->warmup_steps : 0);
  out_schedule->total_steps = total_steps;
}

float pcp_diloco_lr_schedule_at(const pcp_diloco_lr_schedule_t* schedule,
                                uint64_t t) {
  double base = schedule->base;
  uint64_t w = schedule->warmup_steps;
  if (schedule->kind == PCP_DILOCO_LR_CONSTANT) {
    return (float)base;
  }
  if (t < w) {
    return (float)(base * (double)(t + 1) / (double)w);
  }
  if (schedule->kind == PCP_DILOCO_LR_WARMUP_CONSTANT) {
    return (float)base;
  }
  // Cosine from |base| at step W down to min_lr at the last step; a run
  // with no step after the warmup never decays.
  uint64_t last = schedule->total_steps > 0 ? schedule->total_steps - 1 : 0;
  double p = last > w ? (double)(t - w) / (double)(last - w) : 0.0;
  if (p > 1.0) {
    p = 1.0;
  }
  double min_lr = schedule->min_lr;
  return (float)(min_lr + 0.5 * (base - min_lr) * (1.0 + cos(kPi * p)));
}

void pcp_diloco_lr_schedule_fill(const pcp_diloco_lr_schedule_t* schedule,
                                 uint64_t first_step, size_t count,
                                 float* out_rates) {
  for (size_t i = 0; i < count; ++i) {
    out_rates[i] = pcp_diloco_lr_schedule_at(schedule, first_step + i);
  }
}
