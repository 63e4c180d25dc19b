// SPDX-License-Identifier: Apache-2.0
// Test driver: runs the decoupled DiLoCo merges, the per-fragment outer
// Nesterov, blending and the int4 codec on seeded random data through the
// library and writes inputs and results as .npy for
// tests/workloads/decoupled_numpy_test.py, which recomputes them with an
// independent NumPy implementation.
//
// usage: decoupled_npy_driver OUT_DIR SEED

#include <math.h>
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
static pcp_allocator_t g_alloc;

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

static void* zalloc(size_t count, size_t size) {
  void* p = NULL;
  CHECK(pcp_allocator_calloc(g_alloc, count * size + 1, &p));
  return p;
}

enum { kL = 4, kT = 5, kP = 2, kH = 3, kSteps = 6, kInt4 = 1000 };
static const int64_t kSizes[kT] = {7, 16, 5, 33, 2};

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: decoupled_npy_driver OUT_DIR SEED\n");
    return 2;
  }
  g_dir = argv[1];
  g_alloc = pcp_allocator_system();
  pcp_rng_t rng;
  pcp_rng_initialize(strtoull(argv[2], NULL, 10), &rng);

  pcp_decoupled_tensor_spec_t specs[kT];
  int64_t n = 0;
  for (int t = 0; t < kT; ++t) {
    specs[t].name = "t";
    specs[t].value_count = (uint64_t)kSizes[t];
    specs[t].role = PCP_DECOUPLED_ROLE_TRANSFORMER;
    n += kSizes[t];
  }
  uint32_t embedding[1] = {1};
  pcp_decoupled_plan_t plan;
  CHECK(pcp_decoupled_plan_initialize(g_alloc,
                                      PCP_DECOUPLED_FRAGMENTS_BALANCED_TENSOR,
                                      specs, kT, embedding, 1, kP, kH, &plan));
  int64_t fragment_of[kT];
  int64_t roles[kT];
  for (int t = 0; t < kT; ++t) {
    fragment_of[t] = plan.tensor_fragment[t];
    roles[t] = plan.tensor_role[t];
  }

  // One merge of every strategy on the same inputs.
  float* global = zalloc((size_t)n, sizeof(float));
  float* learners = zalloc((size_t)kL * n, sizeof(float));
  float* merged = zalloc(4 * (size_t)n, sizeof(float));
  float* frag_global = zalloc((size_t)n, sizeof(float));
  float* frag_learners = zalloc((size_t)kL * n, sizeof(float));
  float* frag_out = zalloc((size_t)n, sizeof(float));
  int64_t tokens[kL];
  int64_t steps[kL];
  double weights[kL];
  for (int64_t i = 0; i < n; ++i) {
    global[i] = (float)(0.02 * pcp_rng_next_normal(&rng));
  }
  for (int l = 0; l < kL; ++l) {
    // Learner 3 has no tokens (weight 0); learner 1 differs by scale.
    tokens[l] = l == 3 ? 0 : (int64_t)(64 + pcp_rng_next_below(&rng, 512));
    steps[l] = (int64_t)pcp_rng_next_below(&rng, 4);  // 0 -> max(.,1)
    weights[l] =
        pcp_decoupled_merge_weight((uint64_t)tokens[l], (uint64_t)steps[l]);
    double scale = l == 1 ? 0.05 : 0.01;
    for (int64_t i = 0; i < n; ++i) {
      learners[l * n + i] =
          global[i] + (float)(scale * pcp_rng_next_normal(&rng));
    }
  }
  learners[2 * n + 3] = NAN;  // a non-finite element, read as delta 0
  for (int s = 0; s < 4; ++s) {
    for (uint32_t f = 0; f < kP; ++f) {
      const float* views[kL];
      CHECK(pcp_decoupled_plan_gather(&plan, f, global, frag_global));
      for (int l = 0; l < kL; ++l) {
        CHECK(pcp_decoupled_plan_gather(&plan, f, learners + l * n,
                                        frag_learners + l * n));
        views[l] = frag_learners + l * n;
      }
      CHECK(pcp_decoupled_merge_fragment(
          &plan, f, (pcp_decoupled_merge_strategy_t)s, frag_global, views,
          weights, kL, frag_out, NULL));
      CHECK(pcp_decoupled_plan_scatter(&plan, f, frag_out, merged + s * n));
    }
  }
  // Written now: the outer steps below reuse the buffer as scratch.
  int64_t dln[2] = {kL, n};
  write_npy("learners", PCP_ELEMENT_TYPE_F32, 2, dln, learners);

  // Outer steps: steps 1..6 of the schedule (P = 2, H = 3: fragments 1, -,
  // 0, 1, -, 0), each with fresh learner params around the master, merged
  // with avg_embedding_rda_model, then Nesterov on that fragment.
  pcp_decoupled_schedule_t schedule = {kP, kH, 1};
  pcp_decoupled_nesterov_t nesterov;
  CHECK(pcp_decoupled_nesterov_initialize(g_alloc, (size_t)n, 0.7f, 0.9f,
                                          &nesterov));
  float* theta = zalloc((size_t)n, sizeof(float));
  float* theta0 = zalloc((size_t)n, sizeof(float));
  float* pert = zalloc((size_t)kSteps * kL * n, sizeof(float));
  float* theta_hist = zalloc((size_t)kSteps * n, sizeof(float));
  float* vel_hist = zalloc((size_t)kSteps * n, sizeof(float));
  int64_t step_fragment[kSteps];
  memcpy(theta, global, sizeof(float) * (size_t)n);
  memcpy(theta0, global, sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < (int64_t)kSteps * kL * n; ++i) {
    pert[i] = (float)(0.01 * pcp_rng_next_normal(&rng));
  }
  for (int k = 0; k < kSteps; ++k) {
    uint32_t f = 0;
    step_fragment[k] = -1;
    if (pcp_decoupled_schedule_fragment_at(&schedule, (uint64_t)k + 1, &f)) {
      step_fragment[k] = f;
      const float* views[kL];
      CHECK(pcp_decoupled_plan_gather(&plan, f, theta, frag_global));
      for (int l = 0; l < kL; ++l) {
        float* lp = learners + l * n;  // reuse as scratch
        for (int64_t i = 0; i < n; ++i) {
          lp[i] = theta[i] + pert[((int64_t)k * kL + l) * n + i];
        }
        CHECK(pcp_decoupled_plan_gather(&plan, f, lp, frag_learners + l * n));
        views[l] = frag_learners + l * n;
      }
      CHECK(pcp_decoupled_merge_fragment(
          &plan, f, PCP_DECOUPLED_MERGE_AVG_EMBEDDING_RDA_MODEL, frag_global,
          views, weights, kL, frag_out, NULL));
      CHECK(pcp_decoupled_nesterov_step_fragment(&nesterov, &plan, f, frag_out,
                                                 theta));
    }
    memcpy(theta_hist + (int64_t)k * n, theta, sizeof(float) * (size_t)n);
    memcpy(vel_hist + (int64_t)k * n, nesterov.velocity,
           sizeof(float) * (size_t)n);
  }

  // Blend with alpha 0.3.
  float* blended = zalloc((size_t)n, sizeof(float));
  memcpy(blended, learners, sizeof(float) * (size_t)n);
  float* local0 = zalloc((size_t)n, sizeof(float));
  memcpy(local0, learners, sizeof(float) * (size_t)n);
  CHECK(pcp_decoupled_blend(0.3f, theta, blended, (size_t)n, NULL));

  // int4: blocks of 64 and of 7 over values of mixed magnitudes.
  float* x = zalloc(kInt4, sizeof(float));
  for (int i = 0; i < kInt4; ++i) {
    double mag = pow(10.0, (double)((i / 64) % 9) - 4.0);
    x[i] = (float)(mag * pcp_rng_next_normal(&rng));
  }
  x[5] = 0.0f;
  for (int i = 128; i < 192; ++i) x[i] = 0.0f;  // an all-zero block
  uint32_t blocks[2] = {64, 7};
  for (int b = 0; b < 2; ++b) {
    size_t bytes = pcp_decoupled_int4_encoded_size(kInt4, blocks[b]);
    uint8_t* enc = zalloc(bytes, 1);
    float* dec = zalloc(kInt4, sizeof(float));
    CHECK(pcp_decoupled_int4_encode(x, kInt4, blocks[b], enc, bytes));
    CHECK(pcp_decoupled_int4_decode(enc, bytes, kInt4, blocks[b], dec));
    char name[64];
    int64_t db[1] = {(int64_t)bytes};
    int64_t dx[1] = {kInt4};
    snprintf(name, sizeof(name), "int4_bytes_%u", blocks[b]);
    write_npy(name, PCP_ELEMENT_TYPE_U8, 1, db, enc);
    snprintf(name, sizeof(name), "int4_decoded_%u", blocks[b]);
    write_npy(name, PCP_ELEMENT_TYPE_F32, 1, dx, dec);
    pcp_allocator_free(g_alloc, enc);
    pcp_allocator_free(g_alloc, dec);
  }

  int64_t dt[1] = {kT}, dn[1] = {n}, dl[1] = {kL}, d4n[2] = {4, n},
          dk[1] = {kSteps}, dkn[2] = {kSteps, n}, dkln[3] = {kSteps, kL, n},
          dx[1] = {kInt4};
  write_npy("sizes", PCP_ELEMENT_TYPE_I64, 1, dt, (void*)kSizes);
  write_npy("fragment_of", PCP_ELEMENT_TYPE_I64, 1, dt, fragment_of);
  write_npy("roles", PCP_ELEMENT_TYPE_I64, 1, dt, roles);
  write_npy("global", PCP_ELEMENT_TYPE_F32, 1, dn, global);
  write_npy("tokens", PCP_ELEMENT_TYPE_I64, 1, dl, tokens);
  write_npy("steps", PCP_ELEMENT_TYPE_I64, 1, dl, steps);
  write_npy("merged", PCP_ELEMENT_TYPE_F32, 2, d4n, merged);
  write_npy("theta0", PCP_ELEMENT_TYPE_F32, 1, dn, theta0);
  write_npy("pert", PCP_ELEMENT_TYPE_F32, 3, dkln, pert);
  write_npy("step_fragment", PCP_ELEMENT_TYPE_I64, 1, dk, step_fragment);
  write_npy("theta_hist", PCP_ELEMENT_TYPE_F32, 2, dkn, theta_hist);
  write_npy("vel_hist", PCP_ELEMENT_TYPE_F32, 2, dkn, vel_hist);
  write_npy("blend_local", PCP_ELEMENT_TYPE_F32, 1, dn, local0);
  write_npy("blended", PCP_ELEMENT_TYPE_F32, 1, dn, blended);
  write_npy("int4_x", PCP_ELEMENT_TYPE_F32, 1, dx, x);

  pcp_decoupled_nesterov_deinitialize(&nesterov);
  pcp_decoupled_plan_deinitialize(&plan);
  void* owned[] = {
      global, learners, merged,     frag_global, frag_learners, frag_out, theta,
      theta0, pert,     theta_hist, vel_hist,    blended,       local0,   x};
  for (size_t i = 0; i < sizeof(owned) / sizeof(owned[0]); ++i) {
    pcp_allocator_free(g_alloc, owned[i]);
  }
  return 0;
}
