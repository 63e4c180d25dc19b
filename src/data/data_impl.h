// SPDX-License-Identifier: Apache-2.0
// Private to src/data: the dataset layout and helpers shared by its files.

#ifndef PCP_DATA_DATA_IMPL_H_
#define PCP_DATA_DATA_IMPL_H_

#include "data/data.h"

struct pcp_data_dataset_t {
  pcp_allocator_t allocator;
  pcp_data_format_t format;
  const uint8_t* bytes;  // the read-only mapping
  uint64_t byte_length;
  uint32_t vocab_size;
  uint32_t* symbols;  // char: sorted code points (id -> code point)
  size_t symbol_count;
  int32_t ascii_ids[128];  // char: code point -> id for ASCII, -1 if absent
  char path[PCP_DATA_MAX_PATH_LENGTH + 1];
};

// One code point at |p| (|n| bytes left): its byte length, 0 if invalid.
size_t pcp_data_utf8_decode(const uint8_t* p, uint64_t n,
                            uint32_t* out_code_point);
// Vocabulary id of |code_point|, -1 if absent.
int32_t pcp_data_char_id(const pcp_data_dataset_t* dataset,
                         uint32_t code_point);
bool pcp_data_is_boundary(const pcp_data_dataset_t* dataset,
                          uint64_t byte_offset);
// INVALID_ARGUMENT unless |range| lies in the file on token boundaries.
PCP_MUST_USE_RESULT pcp_status_t
pcp_data_check_range(const pcp_data_dataset_t* dataset, pcp_data_range_t range);
// Tokens in a checked byte range.
uint64_t pcp_data_count_tokens(const pcp_data_dataset_t* dataset,
                               uint64_t byte_offset, uint64_t byte_length);

// Reads a cursor from a jansson object (|json_object| is a const json_t*;
// void here so that the header does not pull jansson into every file).
PCP_MUST_USE_RESULT pcp_status_t pcp_data_cursor_from_json(
    const void* json_object, pcp_data_cursor_t* out_cursor);

#endif  // PCP_DATA_DATA_IMPL_H_
