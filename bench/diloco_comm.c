// SPDX-License-Identifier: Apache-2.0
// bench/diloco_comm: bytes on the wire of DiLoCo, measured.
//
// First the arithmetic (src/workloads accounting, the functions the tests
// check): payload bytes per outer step of DiLoCo (star through the gateway:
// each of W workers sends its delta up and receives the f32 params down once
// per tau inner steps) against a data-parallel ring all-reduce of f32
// gradients at every inner step (2(W-1)/W of the parameter bytes per worker
// per step, no central link). Per worker DiLoCo moves N x (up + 4) bytes per
// outer step whatever W; the gateway's link carries W times that, so it is
// the gateway link that grows (linearly) with W, and the reduction there
// against a ring's per-link traffic, tau (W-1)/W^2, SHRINKS as W grows; the
// per-worker reduction tau (W-1)/W grows with W only up to tau.
//
// Then the measurement (bench/diloco_comm.py, run with the project's venv
// and the pcp binary; this binary passes its arguments on: --workers 1,2,4
// --steps --tau --budget-s): a real training job over loopback for W = 1, 2,
// 4 CPU workers, the bytes from the fabric's own per-worker counters
// (GET /v1/workers bytes_to_worker / bytes_from_worker), per worker and at
// the gateway link, against the arithmetic prediction of that run.
//
// Last line (the Python's): `diloco_comm ratio=<x>`, x = the smallest
// predicted / measured bytes over every worker (1: nothing but payload on
// the wire); goal x in [0.9, 1.0], a miss fails under PCP_BENCH_CHECK=1.

#include <inttypes.h>
#include <stdio.h>
#include <unistd.h>

#include "workloads/workloads.h"

static double row(uint64_t params, uint32_t workers, uint32_t tau,
                  pcp_diloco_wire_dtype_t up) {
  uint64_t diloco = pcp_diloco_outer_step_wire_bytes(params, workers, up,
                                                     PCP_DILOCO_WIRE_F32);
  uint64_t dp = pcp_diloco_ring_allreduce_wire_bytes(params, workers, tau);
  double ratio = (double)dp / (double)diloco;
  printf("diloco W=%-3u tau=%-4u deltas=%-4s outer_step_bytes=%-12" PRIu64
         " dp_allreduce_bytes=%-13" PRIu64 " reduction=%.2fx\n",
         workers, tau, up == PCP_DILOCO_WIRE_BF16 ? "bf16" : "f32", diloco, dp,
         ratio);
  return ratio;
}

int main(int argc, char** argv) {
  // About the char-level GPT of the end-to-end test (~1M parameters); the
  // ratios do not depend on it.
  const uint64_t params = 1u << 20;
  printf("arithmetic: parameters=%" PRIu64 " (f32 master, %" PRIu64 " bytes)\n",
         params, params * 4);
  const uint32_t workers[] = {2, 4, 8};
  const uint32_t taus[] = {10, 100};
  for (size_t w = 0; w < 3; ++w) {
    for (size_t t = 0; t < 2; ++t) {
      row(params, workers[w], taus[t], PCP_DILOCO_WIRE_F32);
      row(params, workers[w], taus[t], PCP_DILOCO_WIRE_BF16);
    }
  }
  // Streaming DiLoCo, upstream defaults P=4, H=100: per fragment sync and
  // per H steps (every fragment once), 8 workers, f32 deltas.
  const uint32_t p = 4, h = 100, w8 = 8;
  uint64_t fragment = params / p;
  uint64_t sync = pcp_streaming_diloco_fragment_wire_bytes(fragment, w8,
                                                           PCP_DILOCO_WIRE_F32);
  uint64_t dp = pcp_diloco_ring_allreduce_wire_bytes(params, w8, h);
  printf("streaming W=%u P=%u H=%u fragment_sync_bytes=%" PRIu64
         " per_H_bytes=%" PRIu64 " dp_allreduce_bytes=%" PRIu64
         " reduction=%.2fx peak_vs_diloco=1/%u\n",
         w8, p, h, sync, sync * p, dp, (double)dp / (double)(sync * p), p);
  printf(
      "arithmetic: per worker the reduction is tau (W-1)/W (grows with W "
      "up to tau); the gateway link carries all W workers' bytes (grows "
      "linearly with W)\n");
  enum { kMaxArgs = 32 };
  if (argc > kMaxArgs - 4) {
    fprintf(stderr, "diloco_comm: at most %d arguments\n", kMaxArgs - 4);
    return 2;
  }
  char* args[kMaxArgs];
  int n = 0;
  args[n++] = (char*)PCP_VENV_PYTHON;
  args[n++] = (char*)PCP_SOURCE_DIR "/bench/diloco_comm.py";
  args[n++] = (char*)PCP_BINARY_PATH;
  for (int i = 1; i < argc; ++i) {
    args[n++] = argv[i];
  }
  args[n] = NULL;
  fflush(stdout);
  execv(args[0], args);
  perror("diloco_comm: running " PCP_VENV_PYTHON);
  return 1;
}
