// SPDX-License-Identifier: Apache-2.0
// Test driver for pcp_sampler_sample_logprobs, used by
// tests/workloads/sampling_logprobs_numpy_test.py (which recomputes the
// log-probabilities independently with NumPy):
//
//   sampling_logprobs_tool VOCAB ROWS TEMPERATURE TOP_K TOP_P SEED TOP IN.f32
//       ROWS x VOCAB raw little-endian f32 logits in; one line per row,
//       "token logprob n id:logprob ..." (the n top entries), after
//       checking that pcp_sampler_sample with the same seed draws the same
//       token (exit 2 if not); the error and exit 1 on failure.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workloads/workloads.h"

static int fail(pcp_status_t status) {
  char text[1024];
  pcp_status_format(status, text, sizeof(text));
  fprintf(stderr, "sampling_logprobs_tool: %s\n", text);
  pcp_status_ignore(status);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 9) {
    fprintf(stderr,
            "usage: sampling_logprobs_tool VOCAB ROWS TEMPERATURE TOP_K TOP_P "
            "SEED TOP IN.f32\n");
    return 1;
  }
  int64_t vocab = strtoll(argv[1], NULL, 10);
  int64_t rows = strtoll(argv[2], NULL, 10);
  pcp_sampling_params_t params;
  pcp_sampling_params_initialize(&params);
  params.temperature = strtod(argv[3], NULL);
  params.top_k = strtoll(argv[4], NULL, 10);
  params.top_p = strtod(argv[5], NULL);
  params.seed = strtoull(argv[6], NULL, 10);
  size_t top = (size_t)strtoull(argv[7], NULL, 10);
  void* data = NULL;
  size_t length = 0;
  pcp_status_t status =
      pcp_file_read_all(argv[8], (size_t)1 << 28, &data, &length);
  if (status) {
    return fail(status);
  }
  if (vocab <= 0 || rows <= 0 ||
      length != (size_t)vocab * (size_t)rows * sizeof(float)) {
    pcp_libc_free(data);  // pcp_file_read_all returns a malloc()ed buffer
    fprintf(stderr, "sampling_logprobs_tool: %zu bytes, not %lld x %lld f32\n",
            length, (long long)rows, (long long)vocab);
    return 1;
  }
  pcp_sampler_t with;
  pcp_sampler_t plain;
  status =
      pcp_sampler_initialize(&params, vocab, pcp_allocator_system(), &with);
  if (!status) {
    status =
        pcp_sampler_initialize(&params, vocab, pcp_allocator_system(), &plain);
    if (status) {
      pcp_sampler_deinitialize(&with);
    }
  }
  if (status) {
    pcp_libc_free(data);
    return fail(status);
  }
  int rc = 0;
  const float* logits = data;
  for (int64_t r = 0; r < rows && rc == 0; ++r) {
    const float* row = logits + r * vocab;
    int32_t token = -1;
    int32_t expected = -1;
    pcp_sampler_logprobs_t lp;
    status = pcp_sampler_sample_logprobs(&with, row, NULL, 0, top, &token, &lp);
    if (!status) {
      status = pcp_sampler_sample(&plain, row, NULL, 0, &expected);
    }
    if (status) {
      rc = fail(status);
      break;
    }
    if (token != expected) {
      fprintf(stderr, "row %lld: %d with log-probs, %d without\n", (long long)r,
              token, expected);
      rc = 2;
      break;
    }
    printf("%d %.9g %zu", token, (double)lp.logprob, lp.top_count);
    for (size_t i = 0; i < lp.top_count; ++i) {
      printf(" %d:%.9g", lp.top[i].token, (double)lp.top[i].logprob);
    }
    printf("\n");
  }
  pcp_sampler_deinitialize(&with);
  pcp_sampler_deinitialize(&plain);
  pcp_libc_free(data);
  return rc;
}
