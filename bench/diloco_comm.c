// SPDX-License-Identifier: Apache-2.0
// bench/diloco_comm: payload bytes on the wire per DiLoCo outer step against
// an analytic data-parallel ring all-reduce of every inner step, from the
// accounting functions of src/workloads (the same ones the tests check).
//
// DiLoCo (star through the gateway): each of W workers sends its delta up
// (f32 or bf16) and receives the f32 params down once per tau inner steps.
// Data parallel: a ring all-reduce of the f32 gradients every inner step,
// 2(W-1)/W of the parameter bytes per worker per step. Streaming DiLoCo
// moves the same total per H steps, in P fragment syncs of about 1/P each
// (lower peak). Payload only: framing and base64 are not counted.
//
// The last line, `diloco_comm ratio=<x>`, is the reduction factor of the
// default experiment (tau 10, f32 deltas) with the quickstart's 2 workers.

#include <inttypes.h>
#include <stdio.h>

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

int main(void) {
  // About the char-level GPT of the end-to-end test (~1M parameters); the
  // ratios do not depend on it.
  const uint64_t params = 1u << 20;
  printf("parameters=%" PRIu64 " (f32 master, %" PRIu64 " bytes)\n", params,
         params * 4);
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
  double headline = row(params, 2, 10, PCP_DILOCO_WIRE_F32);
  printf("diloco_comm ratio=%.2f\n", headline);
  return 0;
}
