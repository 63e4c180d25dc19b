// SPDX-License-Identifier: Apache-2.0
// Batch sampling inside one range, and the cursor that resumes it.

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "data/data_impl.h"

const char* pcp_data_sampling_name(pcp_data_sampling_t sampling) {
  switch (sampling) {
    case PCP_DATA_SAMPLING_RANDOM:
      return "random";
    case PCP_DATA_SAMPLING_SEQUENTIAL:
      return "sequential";
  }
  return "unknown";
}

bool pcp_data_sampling_parse(pcp_string_view_t name,
                             pcp_data_sampling_t* out_sampling) {
  if (pcp_string_view_equal(name, pcp_make_cstring_view("random"))) {
    *out_sampling = PCP_DATA_SAMPLING_RANDOM;
    return true;
  }
  // Upstream calls the sequential walk "fifo"; accept both spellings.
  if (pcp_string_view_equal(name, pcp_make_cstring_view("sequential")) ||
      pcp_string_view_equal(name, pcp_make_cstring_view("fifo"))) {
    *out_sampling = PCP_DATA_SAMPLING_SEQUENTIAL;
    return true;
  }
  return false;
}

//===----------------------------------------------------------------------===//
// Cursor text
//===----------------------------------------------------------------------===//

void pcp_data_cursor_format(const pcp_data_cursor_t* cursor, char* out_text,
                            size_t capacity) {
  PCP_ASSERT(capacity >= PCP_DATA_MAX_CURSOR_JSON_LENGTH + 1);
  snprintf(out_text, capacity,
           "{\"rng\":\"%016" PRIx64 "%016" PRIx64 "%016" PRIx64 "%016" PRIx64
           "\",\"position\":%" PRIu64 ",\"epoch\":%" PRIu64 "}",
           cursor->rng_state[0], cursor->rng_state[1], cursor->rng_state[2],
           cursor->rng_state[3], cursor->position, cursor->epoch);
}

static bool parse_hex_u64(const char* text, uint64_t* out_value) {
  uint64_t value = 0;
  for (int i = 0; i < 16; ++i) {
    char c = text[i];
    uint64_t digit;
    if (c >= '0' && c <= '9') {
      digit = (uint64_t)(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = (uint64_t)(c - 'a') + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = (uint64_t)(c - 'A') + 10;
    } else {
      return false;
    }
    value = (value << 4) | digit;
  }
  *out_value = value;
  return true;
}

pcp_status_t pcp_data_cursor_from_json(const void* json_object,
                                       pcp_data_cursor_t* out_cursor) {
  const json_t* root = json_object;
  memset(out_cursor, 0, sizeof(*out_cursor));
  if (!json_is_object(root)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "cursor: not a JSON object");
  }
  const json_t* rng = json_object_get(root, "rng");
  if (!json_is_string(rng) || json_string_length(rng) != 64) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "cursor: \"rng\" must be a string of 64 hex digits");
  }
  const char* hex = json_string_value(rng);
  for (int i = 0; i < 4; ++i) {
    if (!parse_hex_u64(hex + (size_t)16 * i, &out_cursor->rng_state[i])) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "cursor: \"rng\" must be a string of 64 hex "
                             "digits");
    }
  }
  const char* keys[2] = {"position", "epoch"};
  uint64_t* fields[2] = {&out_cursor->position, &out_cursor->epoch};
  for (int i = 0; i < 2; ++i) {
    const json_t* value = json_object_get(root, keys[i]);
    if (!json_is_integer(value) || json_integer_value(value) < 0) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "cursor: \"%s\" must be a non-negative integer",
                             keys[i]);
    }
    *fields[i] = (uint64_t)json_integer_value(value);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_data_cursor_parse(pcp_string_view_t text,
                                   pcp_data_cursor_t* out_cursor) {
  memset(out_cursor, 0, sizeof(*out_cursor));
  if (text.size > (size_t)4 * PCP_DATA_MAX_CURSOR_JSON_LENGTH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "cursor text of %zu bytes is too long", text.size);
  }
  json_error_t error;
  json_t* root =
      json_loadb(text.data, text.size, JSON_REJECT_DUPLICATES, &error);
  if (root == NULL) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "cursor: %s",
                           error.text);
  }
  pcp_status_t status = pcp_data_cursor_from_json(root, out_cursor);
  json_decref(root);
  return status;
}

//===----------------------------------------------------------------------===//
// Sampler
//===----------------------------------------------------------------------===//

struct pcp_data_sampler_t {
  pcp_allocator_t allocator;
  const pcp_data_dataset_t* dataset;
  pcp_data_range_t range;
  pcp_data_sampler_options_t options;
  uint64_t token_count;
  // char: the range decoded to ids once, so that a row is a memcpy-like walk
  // instead of a UTF-8 decode from an arbitrary byte (code points are
  // variable-length, so token i has no computable byte offset). byte and u16
  // read the mapping directly and stay O(1) in memory.
  int32_t* decoded;
  pcp_rng_t rng;
  uint64_t position;
  uint64_t epoch;
};

static inline int32_t token_at(const pcp_data_sampler_t* sampler,
                               uint64_t index) {
  const uint8_t* p = sampler->dataset->bytes + sampler->range.byte_offset;
  switch (sampler->dataset->format) {
    case PCP_DATA_FORMAT_CHAR:
      return sampler->decoded[index];
    case PCP_DATA_FORMAT_BYTE:
      return p[index];
    case PCP_DATA_FORMAT_U16:
      return (int32_t)((uint32_t)p[2 * index] |
                       ((uint32_t)p[2 * index + 1] << 8));
  }
  return 0;
}

static pcp_status_t decode_char_range(pcp_data_sampler_t* sampler) {
  const pcp_data_dataset_t* dataset = sampler->dataset;
  if (sampler->token_count > SIZE_MAX / sizeof(int32_t)) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "char range of %llu tokens does not fit in memory",
                           (unsigned long long)sampler->token_count);
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
      sampler->allocator, (size_t)sampler->token_count * sizeof(int32_t) + 1,
      (void**)&sampler->decoded));
  const uint8_t* p = dataset->bytes + sampler->range.byte_offset;
  uint64_t n = sampler->range.byte_length;
  uint64_t k = 0;
  for (uint64_t i = 0; i < n;) {
    uint32_t cp;
    size_t length = pcp_data_utf8_decode(p + i, n - i, &cp);
    // The whole file was validated at open and the range ends on boundaries.
    PCP_ASSERT(length != 0);
    int32_t id = pcp_data_char_id(dataset, cp);
    PCP_ASSERT(id >= 0);
    sampler->decoded[k++] = id;
    i += length;
  }
  PCP_ASSERT(k == sampler->token_count);
  return pcp_ok_status();
}

pcp_status_t pcp_data_sampler_create(const pcp_data_dataset_t* dataset,
                                     pcp_data_range_t range,
                                     const pcp_data_sampler_options_t* options,
                                     pcp_allocator_t allocator,
                                     pcp_data_sampler_t** out_sampler) {
  *out_sampler = NULL;
  if (options->batch_size == 0 || options->block_size == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "batch_size (%u) and block_size (%u) must be >= 1",
                           options->batch_size, options->block_size);
  }
  if (options->sampling != PCP_DATA_SAMPLING_RANDOM &&
      options->sampling != PCP_DATA_SAMPLING_SEQUENTIAL) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "unknown sampling %d",
                           (int)options->sampling);
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_data_check_range(dataset, range));
  uint64_t tokens =
      pcp_data_count_tokens(dataset, range.byte_offset, range.byte_length);
  uint64_t block = options->block_size;
  // B*T fits in 64 bits (both are 32-bit).
  uint64_t window = (uint64_t)options->batch_size * block;
  if (tokens < block + 1) {
    return pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                           "%s range [%llu, +%llu) holds %llu tokens, fewer "
                           "than block_size + 1 = %llu",
                           dataset->path, (unsigned long long)range.byte_offset,
                           (unsigned long long)range.byte_length,
                           (unsigned long long)tokens,
                           (unsigned long long)(block + 1));
  }
  if (options->sampling == PCP_DATA_SAMPLING_SEQUENTIAL &&
      tokens < window + 1) {
    return pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                           "%s range [%llu, +%llu) holds %llu tokens, fewer "
                           "than batch_size * block_size + 1 = %llu needed "
                           "by sequential sampling",
                           dataset->path, (unsigned long long)range.byte_offset,
                           (unsigned long long)range.byte_length,
                           (unsigned long long)tokens,
                           (unsigned long long)(window + 1));
  }
  pcp_data_sampler_t* sampler = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*sampler), (void**)&sampler));
  sampler->allocator = allocator;
  sampler->dataset = dataset;
  sampler->range = range;
  sampler->options = *options;
  sampler->token_count = tokens;
  pcp_rng_initialize(options->seed, &sampler->rng);
  if (dataset->format == PCP_DATA_FORMAT_CHAR) {
    pcp_status_t status = decode_char_range(sampler);
    if (status) {
      pcp_data_sampler_release(sampler);
      return status;
    }
  }
  *out_sampler = sampler;
  return pcp_ok_status();
}

void pcp_data_sampler_release(pcp_data_sampler_t* sampler) {
  if (sampler == NULL)
    return;
  pcp_allocator_free(sampler->allocator, sampler->decoded);
  pcp_allocator_free(sampler->allocator, sampler);
}

uint64_t pcp_data_sampler_token_count(const pcp_data_sampler_t* sampler) {
  return sampler->token_count;
}

static void fill_row(const pcp_data_sampler_t* sampler, uint64_t start,
                     int32_t* inputs, int32_t* targets) {
  uint32_t block = sampler->options.block_size;
  int32_t previous = token_at(sampler, start);
  for (uint32_t t = 0; t < block; ++t) {
    int32_t next = token_at(sampler, start + t + 1);
    inputs[t] = previous;
    targets[t] = next;
    previous = next;
  }
}

void pcp_data_sampler_next(pcp_data_sampler_t* sampler, int32_t* out_input_ids,
                           int32_t* out_targets, uint64_t* out_row_offsets) {
  uint32_t batch = sampler->options.batch_size;
  uint64_t block = sampler->options.block_size;
  uint64_t n = sampler->token_count;
  uint64_t window = (uint64_t)batch * block;
  if (sampler->options.sampling == PCP_DATA_SAMPLING_SEQUENTIAL) {
    // A window needs B*T+1 tokens; what is left at the end of an epoch is
    // skipped (nanochat drops the tail too) rather than wrapped around, so
    // that a row never straddles the end of the range and the start.
    if (sampler->position + window + 1 > n) {
      sampler->position = 0;
      sampler->epoch += 1;
    }
    for (uint32_t b = 0; b < batch; ++b) {
      uint64_t start = sampler->position + b * block;
      if (out_row_offsets)
        out_row_offsets[b] = start;
      fill_row(sampler, start, out_input_ids + b * block,
               out_targets + b * block);
    }
    sampler->position += window;
    return;
  }
  for (uint32_t b = 0; b < batch; ++b) {
    // s in [0, n - T - 1]: torch.randint(len(data) - block_size) in nanoGPT.
    uint64_t start = pcp_rng_next_below(&sampler->rng, n - block);
    if (out_row_offsets)
      out_row_offsets[b] = start;
    fill_row(sampler, start, out_input_ids + b * block,
             out_targets + b * block);
  }
  // Random sampling has no passes; an epoch is n tokens' worth of rows, the
  // measure max_epochs is checked against.
  sampler->position += window;
  while (sampler->position >= n) {
    sampler->position -= n;
    sampler->epoch += 1;
  }
}

void pcp_data_sampler_cursor(const pcp_data_sampler_t* sampler,
                             pcp_data_cursor_t* out_cursor) {
  memcpy(out_cursor->rng_state, sampler->rng.state,
         sizeof(out_cursor->rng_state));
  out_cursor->position = sampler->position;
  out_cursor->epoch = sampler->epoch;
}

pcp_status_t pcp_data_sampler_restore(pcp_data_sampler_t* sampler,
                                      const pcp_data_cursor_t* cursor) {
  if (cursor->position > sampler->token_count) {
    return pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                           "cursor position %llu is past the range's %llu "
                           "tokens (a cursor of another range?)",
                           (unsigned long long)cursor->position,
                           (unsigned long long)sampler->token_count);
  }
  if (sampler->options.sampling == PCP_DATA_SAMPLING_RANDOM &&
      cursor->rng_state[0] == 0 && cursor->rng_state[1] == 0 &&
      cursor->rng_state[2] == 0 && cursor->rng_state[3] == 0) {
    // xoshiro's one fixed point: it would return zeros forever.
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "cursor rng state is all zeros");
  }
  memcpy(sampler->rng.state, cursor->rng_state, sizeof(sampler->rng.state));
  sampler->position = cursor->position;
  sampler->epoch = cursor->epoch;
  return pcp_ok_status();
}
