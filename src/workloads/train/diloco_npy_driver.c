// SPDX-License-Identifier: Apache-2.0
// Test driver: runs classic and streaming DiLoCo outer steps on seeded random
// data through the library and writes inputs and results as .npy files for
// tests/workloads/diloco_numpy_test.py, which recomputes everything with an
// independent NumPy implementation.
//
// usage: diloco_npy_driver OUT_DIR SEED

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/compute.h"
#include "workloads/workloads.h"

#define CHECK(expr)                                                         \
  do {                                                                      \
    pcp_status_t s_ = (expr);                                               \
    if (s_ != NULL) {                                                       \
      char text_[512];                                                      \
      pcp_status_format(s_, text_, sizeof(text_));                          \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, text_); \
      pcp_status_ignore(s_);                                                \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

static const char* g_dir;

static void write_npy(const char* name, pcp_element_type_t type, int rank,
                      const int64_t* dims, void* data) {
  pcp_tensor_shape_t shape = {type, rank, {0}};
  memcpy(shape.dims, dims, sizeof(int64_t) * (size_t)rank);
  size_t length = 0;
  CHECK(pcp_tensor_shape_byte_length(&shape, &length));
  pcp_host_tensor_t tensor;
  CHECK(pcp_host_tensor_wrap(&shape, data, length, &tensor));
  char path[1024];
  snprintf(path, sizeof(path), "%s/%s.npy", g_dir, name);
  CHECK(pcp_host_tensor_write_npy(&tensor, path, false));
}

// Zeroed memory for |count| elements of |size| bytes from |allocator|, or
// exit 1 naming the size (a test driver: nothing to recover).
static void* zalloc(pcp_allocator_t allocator, size_t count, size_t size) {
  size_t bytes = 0;
  void* p = NULL;
  if (__builtin_mul_overflow(count, size, &bytes)) {
    fprintf(stderr, "diloco_npy_driver: %zu x %zu bytes overflows\n", count,
            size);
    exit(1);
  }
  CHECK(pcp_allocator_calloc(allocator, bytes, &p));
  return p;
}

// One spare element past |n|, as before.
static float* falloc(pcp_allocator_t allocator, size_t n) {
  return zalloc(allocator, n + 1, sizeof(float));
}

// Classic DiLoCo: W workers, K rounds; rounds 1, 3 carry bf16 deltas; worker
// 2 is lost in round 1 and only worker 0 reports in round 2.
enum { kW = 3, kK = 4, kTensors = 4 };
static const int64_t kSizes[kTensors] = {7, 16, 5, 33};

static void run_classic(pcp_allocator_t allocator, pcp_rng_t* rng) {
  size_t n = 0;
  for (int i = 0; i < kTensors; ++i) n += (size_t)kSizes[i];
  float* theta = falloc(allocator, n);
  float* theta0 = falloc(allocator, n);
  float* pert = falloc(allocator, (size_t)kK * kW * n);
  float* wire = falloc(allocator, (size_t)kK * kW * n);
  float* avg = falloc(allocator, (size_t)kK * n);
  float* theta_hist = falloc(allocator, (size_t)kK * n);
  float* vel_hist = falloc(allocator, (size_t)kK * n);
  float* local = falloc(allocator, n);
  float* delta = falloc(allocator, n);
  uint16_t* q = zalloc(allocator, n, sizeof(uint16_t));
  int32_t reported[kK][kW] = {{1, 1, 1}, {1, 1, 0}, {1, 0, 0}, {1, 1, 1}};
  int32_t bf16_round[kK] = {0, 1, 0, 1};
  for (size_t i = 0; i < n; ++i)
    theta0[i] = theta[i] = (float)(0.02 * pcp_rng_next_normal(rng));
  for (size_t i = 0; i < (size_t)kK * kW * n; ++i) {
    pert[i] = (float)(0.01 * pcp_rng_next_normal(rng));
  }
  pcp_diloco_accumulator_t acc;
  CHECK(pcp_diloco_accumulator_initialize(allocator, n, &acc));
  pcp_diloco_nesterov_t nest;
  CHECK(pcp_diloco_nesterov_initialize(allocator, n, 0.7f, 0.9f, &nest));
  for (int k = 0; k < kK; ++k) {
    pcp_diloco_accumulator_reset(&acc);
    for (int w = 0; w < kW; ++w) {
      const float* p = pert + ((size_t)k * kW + w) * n;
      // Stand-in for tau inner steps: the worker ends at theta + pert.
      for (size_t i = 0; i < n; ++i) local[i] = theta[i] + p[i];
      pcp_diloco_delta_compute(theta, local, n, delta);
      float* on_wire = wire + ((size_t)k * kW + w) * n;
      if (bf16_round[k]) {
        pcp_diloco_bf16_quantize(delta, n, q);
        pcp_diloco_bf16_dequantize(q, n, on_wire);
        if (reported[k][w])
          CHECK(pcp_diloco_accumulator_add_bf16(&acc, q, n));
      } else {
        memcpy(on_wire, delta, n * sizeof(float));
        if (reported[k][w]) {
          CHECK(pcp_diloco_accumulator_add_f32(&acc, delta, n));
        }
      }
    }
    float* a = avg + (size_t)k * n;
    CHECK(pcp_diloco_accumulator_average(&acc, a, NULL));
    // Per named tensor, as the service will call it.
    size_t offset = 0;
    for (int t = 0; t < kTensors; ++t) {
      CHECK(pcp_diloco_nesterov_step(&nest, offset, (size_t)kSizes[t],
                                     a + offset, theta + offset));
      offset += (size_t)kSizes[t];
    }
    memcpy(theta_hist + (size_t)k * n, theta, n * sizeof(float));
    memcpy(vel_hist + (size_t)k * n, nest.velocity, n * sizeof(float));
  }
  int64_t d1[1] = {(int64_t)n}, d2[2] = {kK, (int64_t)n},
          d3[3] = {kK, kW, (int64_t)n}, dr[2] = {kK, kW}, dk[1] = {kK},
          ds[1] = {kTensors};
  write_npy("classic_sizes", PCP_ELEMENT_TYPE_I64, 1, ds, (void*)kSizes);
  write_npy("classic_theta0", PCP_ELEMENT_TYPE_F32, 1, d1, theta0);
  write_npy("classic_pert", PCP_ELEMENT_TYPE_F32, 3, d3, pert);
  write_npy("classic_reported", PCP_ELEMENT_TYPE_I32, 2, dr, reported);
  write_npy("classic_bf16", PCP_ELEMENT_TYPE_I32, 1, dk, bf16_round);
  write_npy("classic_wire", PCP_ELEMENT_TYPE_F32, 3, d3, wire);
  write_npy("classic_avg", PCP_ELEMENT_TYPE_F32, 2, d2, avg);
  write_npy("classic_theta", PCP_ELEMENT_TYPE_F32, 2, d2, theta_hist);
  write_npy("classic_velocity", PCP_ELEMENT_TYPE_F32, 2, d2, vel_hist);
  pcp_diloco_accumulator_deinitialize(&acc);
  pcp_diloco_nesterov_deinitialize(&nest);
  void* owned[] = {theta,      theta0,   pert,  wire,  avg,
                   theta_hist, vel_hist, local, delta, q};
  for (size_t i = 0; i < sizeof(owned) / sizeof(owned[0]); ++i) {
    pcp_allocator_free(allocator, owned[i]);
  }
}

// Streaming DiLoCo: W workers in lock step, T tensors, P fragments.
enum { kSW = 2, kST = 7 };
static const int64_t kSSizes[kST] = {4, 9, 3, 12, 6, 5, 8};

static void run_streaming(pcp_allocator_t allocator, pcp_rng_t* rng) {
  const pcp_streaming_diloco_schedule_t sched = {3, 4, 1, 3};
  const float alpha = 0.5f;
  size_t n = 0, off[kST];
  for (int i = 0; i < kST; ++i) off[i] = n, n += (size_t)kSSizes[i];
  const uint64_t steps = pcp_streaming_diloco_max_steps(&sched);
  float* master = falloc(allocator, n);
  float* master0 = falloc(allocator, n);
  float* local = falloc(allocator, kSW * n);
  float* snap = falloc(allocator, kSW * n);
  float* delta = falloc(allocator, n);
  float* avg = falloc(allocator, n);
  float* pert = falloc(allocator, steps * kSW * n);
  float* master_hist = falloc(allocator, steps * n);
  float* local_hist = falloc(allocator, steps * kSW * n);
  int32_t* sends = zalloc(allocator, steps * sched.fragments, sizeof(int32_t));
  int32_t* recvs = zalloc(allocator, steps * sched.fragments, sizeof(int32_t));
  for (size_t i = 0; i < n; ++i) {
    master0[i] = master[i] = (float)(0.02 * pcp_rng_next_normal(rng));
  }
  for (int w = 0; w < kSW; ++w) {
    memcpy(local + w * n, master, n * sizeof(float));
    memcpy(snap + w * n, master, n * sizeof(float));
  }
  for (size_t i = 0; i < steps * kSW * n; ++i) {
    pert[i] = (float)(0.01 * pcp_rng_next_normal(rng));
  }
  pcp_diloco_accumulator_t acc[kST];
  for (int i = 0; i < kST; ++i) {
    CHECK(pcp_diloco_accumulator_initialize(allocator, (size_t)kSSizes[i],
                                            &acc[i]));
  }
  pcp_diloco_nesterov_t nest;
  CHECK(pcp_diloco_nesterov_initialize(allocator, n, 0.7f, 0.9f, &nest));
  for (uint64_t t = 1; t <= steps; ++t) {
    for (uint32_t p = 0; p < sched.fragments; ++p) {
      uint32_t r = 0;
      bool in = pcp_streaming_diloco_receives_at(&sched, p, t, &r);
      recvs[(t - 1) * sched.fragments + p] = in ? (int32_t)r : -1;
      if (!in)
        continue;
      for (int w = 0; w < kSW; ++w) {
        for (uint32_t i = 0; i < kST; ++i) {
          if (pcp_streaming_diloco_fragment_of(i, sched.fragments) != p) {
            continue;
          }
          pcp_streaming_diloco_mix(alpha, master + off[i],
                                   local + w * n + off[i],
                                   snap + w * n + off[i], (size_t)kSSizes[i]);
        }
      }
    }
    for (int w = 0; w < kSW; ++w) {  // the inner step stand-in
      const float* pp = pert + ((t - 1) * kSW + w) * n;
      for (size_t i = 0; i < n; ++i) local[w * n + i] += pp[i];
    }
    for (uint32_t p = 0; p < sched.fragments; ++p) {
      uint32_t r = 0;
      bool out = pcp_streaming_diloco_sends_at(&sched, p, t, &r);
      sends[(t - 1) * sched.fragments + p] = out ? (int32_t)r : -1;
      if (!out)
        continue;
      for (uint32_t i = 0; i < kST; ++i) {
        if (pcp_streaming_diloco_fragment_of(i, sched.fragments) != p) {
          continue;
        }
        size_t m = (size_t)kSSizes[i];
        pcp_diloco_accumulator_reset(&acc[i]);
        for (int w = 0; w < kSW; ++w) {
          pcp_streaming_diloco_fragment_delta(snap + w * n + off[i],
                                              local + w * n + off[i], m, delta);
          CHECK(pcp_diloco_accumulator_add_f32(&acc[i], delta, m));
        }
        CHECK(pcp_diloco_accumulator_average(&acc[i], avg, NULL));
        CHECK(pcp_diloco_nesterov_step(&nest, off[i], m, avg, master + off[i]));
      }
    }
    memcpy(master_hist + (t - 1) * n, master, n * sizeof(float));
    memcpy(local_hist + (t - 1) * kSW * n, local, kSW * n * sizeof(float));
  }
  int64_t d1[1] = {(int64_t)n}, dh[2] = {(int64_t)steps, (int64_t)n},
          dl[3] = {(int64_t)steps, kSW, (int64_t)n},
          dsched[2] = {(int64_t)steps, sched.fragments}, ds[1] = {kST},
          dv[1] = {(int64_t)n};
  write_npy("stream_sizes", PCP_ELEMENT_TYPE_I64, 1, ds, (void*)kSSizes);
  write_npy("stream_master0", PCP_ELEMENT_TYPE_F32, 1, d1, master0);
  write_npy("stream_pert", PCP_ELEMENT_TYPE_F32, 3, dl, pert);
  write_npy("stream_sends", PCP_ELEMENT_TYPE_I32, 2, dsched, sends);
  write_npy("stream_recvs", PCP_ELEMENT_TYPE_I32, 2, dsched, recvs);
  write_npy("stream_master", PCP_ELEMENT_TYPE_F32, 2, dh, master_hist);
  write_npy("stream_local", PCP_ELEMENT_TYPE_F32, 3, dl, local_hist);
  write_npy("stream_velocity", PCP_ELEMENT_TYPE_F32, 1, dv, nest.velocity);
  for (int i = 0; i < kST; ++i) pcp_diloco_accumulator_deinitialize(&acc[i]);
  pcp_diloco_nesterov_deinitialize(&nest);
  void* owned[] = {master, master0,     local,      snap,  delta, avg,
                   pert,   master_hist, local_hist, sends, recvs};
  for (size_t i = 0; i < sizeof(owned) / sizeof(owned[0]); ++i) {
    pcp_allocator_free(allocator, owned[i]);
  }
}

// Inner learning-rate schedules: each case (kind, base, min_lr, warmup,
// total) evaluated at t = 0 .. kLrSteps-1 (past |total| too: cosine holds
// min_lr there).
enum { kLrCases = 7, kLrSteps = 64 };

static void run_schedule(pcp_allocator_t allocator, pcp_rng_t* rng) {
  double cases[kLrCases][5] = {
      {PCP_DILOCO_LR_CONSTANT, 3e-3, 0, 0, 40},
      {PCP_DILOCO_LR_COSINE, 3e-3, 0, 0, 40},
      {PCP_DILOCO_LR_COSINE, 3e-3, 3e-4, 10, 50},
      {PCP_DILOCO_LR_COSINE, 1e-2, 1e-4, 17, 18},  // one step after warmup
      {PCP_DILOCO_LR_WARMUP_CONSTANT, 6e-4, 0, 25, 60},
      {PCP_DILOCO_LR_WARMUP_CONSTANT, 6e-4, 0, 1, 60},
      {PCP_DILOCO_LR_COSINE, 0, 0, 0, 0},  // seeded below
  };
  cases[6][1] = 1e-3 * (1.0 + pcp_rng_next_double(rng));
  cases[6][2] = cases[6][1] * 0.1 * pcp_rng_next_double(rng);
  cases[6][3] = (double)(pcp_rng_next_u64(rng) % 20);
  cases[6][4] = cases[6][3] + 1 + (double)(pcp_rng_next_u64(rng) % 40);
  float* rates = falloc(allocator, (size_t)kLrCases * kLrSteps);
  for (int c = 0; c < kLrCases; ++c) {
    pcp_diloco_lr_schedule_t schedule = {
        .kind = (pcp_diloco_lr_schedule_kind_t)cases[c][0],
        .base = cases[c][1],
        .min_lr = cases[c][2],
        .warmup_steps = (uint64_t)cases[c][3],
        .total_steps = (uint64_t)cases[c][4]};
    pcp_diloco_lr_schedule_fill(&schedule, 0, kLrSteps, rates + c * kLrSteps);
  }
  int64_t dc[2] = {kLrCases, 5}, dr[2] = {kLrCases, kLrSteps};
  write_npy("lr_cases", PCP_ELEMENT_TYPE_F64, 2, dc, cases);
  write_npy("lr_rates", PCP_ELEMENT_TYPE_F32, 2, dr, rates);
  pcp_allocator_free(allocator, rates);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: diloco_npy_driver OUT_DIR SEED\n");
    return 2;
  }
  g_dir = argv[1];
  // The one allocator of this process, passed to everything below.
  pcp_allocator_t allocator = pcp_allocator_system();
  pcp_rng_t rng;
  pcp_rng_initialize(strtoull(argv[2], NULL, 10), &rng);
  run_classic(allocator, &rng);
  run_streaming(allocator, &rng);
  run_schedule(allocator, &rng);
  return 0;
}
