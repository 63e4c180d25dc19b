// SPDX-License-Identifier: Apache-2.0
// data_batch_tool PATH char|byte|u16 random|sequential B T SEED [BATCHES
//                 [OFFSET LENGTH]]
// Prints the vocabulary, the range and BATCHES batches (default 1) with the
// row offsets they came from, as one JSON object on stdout. The NumPy test
// (tests/data/numpy_batch_test.py) rebuilds every row from the file itself.

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data.h"

static int usage(void) {
  fprintf(stderr,
          "usage: data_batch_tool PATH char|byte|u16 random|sequential B T "
          "SEED [BATCHES [OFFSET LENGTH]]\n");
  return 2;
}

static bool parse_u64(const char* text, uint64_t* out_value) {
  return pcp_string_view_parse_uint64(pcp_make_cstring_view(text), out_value);
}

static int fail(pcp_status_t status) {
  char buffer[1024];
  pcp_status_format(status, buffer, sizeof(buffer));
  pcp_status_ignore(status);
  fprintf(stderr, "data_batch_tool: %s\n", buffer);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 7 && argc != 8 && argc != 10)
    return usage();
  pcp_data_format_t format;
  pcp_data_sampling_t sampling;
  uint64_t batch = 0;
  uint64_t block = 0;
  uint64_t seed = 0;
  uint64_t batches = 1;
  if (!pcp_data_format_parse(pcp_make_cstring_view(argv[2]), &format) ||
      !pcp_data_sampling_parse(pcp_make_cstring_view(argv[3]), &sampling) ||
      !parse_u64(argv[4], &batch) || !parse_u64(argv[5], &block) ||
      !parse_u64(argv[6], &seed) || batch == 0 || batch > 4096 || block == 0 ||
      block > 65536 ||
      (argc >= 8 && (!parse_u64(argv[7], &batches) || batches > 1024))) {
    return usage();
  }
  pcp_allocator_t allocator = pcp_allocator_system();
  pcp_data_dataset_options_t options;
  pcp_data_dataset_options_initialize(format, &options);
  pcp_data_dataset_t* dataset = NULL;
  pcp_status_t status =
      pcp_data_dataset_open(argv[1], &options, allocator, &dataset);
  if (status)
    return fail(status);
  pcp_data_range_t range = pcp_data_dataset_full_range(dataset);
  if (argc == 10 && (!parse_u64(argv[8], &range.byte_offset) ||
                     !parse_u64(argv[9], &range.byte_length))) {
    pcp_data_dataset_release(dataset);
    return usage();
  }
  pcp_data_sampler_options_t sampler_options = {
      .sampling = sampling,
      .batch_size = (uint32_t)batch,
      .block_size = (uint32_t)block,
      .seed = seed,
  };
  pcp_data_sampler_t* sampler = NULL;
  status = pcp_data_sampler_create(dataset, range, &sampler_options, allocator,
                                   &sampler);
  if (status) {
    pcp_data_dataset_release(dataset);
    return fail(status);
  }
  // batch <= 4096 and block <= 65536 (checked above): no overflow.
  size_t count = (size_t)(batch * block);
  int32_t* inputs = NULL;
  int32_t* targets = NULL;
  uint64_t* offsets = NULL;
  status =
      pcp_allocator_malloc(allocator, count * sizeof(int32_t), (void**)&inputs);
  if (!status) {
    status = pcp_allocator_malloc(allocator, count * sizeof(int32_t),
                                  (void**)&targets);
  }
  if (!status) {
    status = pcp_allocator_malloc(allocator, (size_t)batch * sizeof(uint64_t),
                                  (void**)&offsets);
  }
  if (status) {
    pcp_allocator_free(allocator, inputs);
    pcp_allocator_free(allocator, targets);
    pcp_data_sampler_release(sampler);
    pcp_data_dataset_release(dataset);
    return fail(status);
  }

  printf("{\"format\":\"%s\",\"vocab_size\":%u,\"symbols\":[",
         pcp_data_format_name(format), pcp_data_dataset_vocab_size(dataset));
  size_t symbol_count = 0;
  const uint32_t* symbols = pcp_data_dataset_symbols(dataset, &symbol_count);
  for (size_t i = 0; i < symbol_count; ++i) {
    printf("%s%u", i ? "," : "", symbols[i]);
  }
  printf("],\"offset\":%" PRIu64 ",\"length\":%" PRIu64 ",\"tokens\":%" PRIu64
         ",\"batches\":[",
         range.byte_offset, range.byte_length,
         pcp_data_sampler_token_count(sampler));
  for (uint64_t k = 0; k < batches; ++k) {
    pcp_data_sampler_next(sampler, inputs, targets, offsets);
    printf("%s{\"rows\":[", k ? "," : "");
    for (uint64_t b = 0; b < batch; ++b) {
      printf("%s%" PRIu64, b ? "," : "", offsets[b]);
    }
    printf("],\"inputs\":[");
    for (size_t i = 0; i < count; ++i) printf("%s%d", i ? "," : "", inputs[i]);
    printf("],\"targets\":[");
    for (size_t i = 0; i < count; ++i) printf("%s%d", i ? "," : "", targets[i]);
    printf("]}");
  }
  pcp_data_cursor_t cursor;
  pcp_data_sampler_cursor(sampler, &cursor);
  printf("],\"position\":%" PRIu64 ",\"epoch\":%" PRIu64 "}\n", cursor.position,
         cursor.epoch);
  pcp_allocator_free(allocator, inputs);
  pcp_allocator_free(allocator, targets);
  pcp_allocator_free(allocator, offsets);
  pcp_data_sampler_release(sampler);
  pcp_data_dataset_release(dataset);
  return 0;
}
