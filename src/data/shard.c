// SPDX-License-Identifier: Apache-2.0
// Sharding plans, the assignment's JSON form, effective batch sizes.

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "data/data_impl.h"

//===----------------------------------------------------------------------===//
// Sharding
//===----------------------------------------------------------------------===//

typedef struct sorted_worker_t {
  const char* id;
  size_t input_index;
} sorted_worker_t;

static int compare_workers(const void* a, const void* b) {
  // strcmp compares as unsigned char: a bytewise order, locale-free.
  return strcmp(((const sorted_worker_t*)a)->id,
                ((const sorted_worker_t*)b)->id);
}

static uint64_t derive_seed(uint64_t base_seed, const char* worker_id,
                            uint64_t step) {
  // Hashing (not xor-ing) the inputs keeps neighbouring workers and steps
  // from getting correlated xoshiro streams.
  char text[PCP_DATA_MAX_WORKER_ID_LENGTH + 64];
  int length =
      snprintf(text, sizeof(text), "pcp.data.seed|%" PRIu64 "|%s|%" PRIu64,
               base_seed, worker_id, step);
  PCP_ASSERT(length > 0 && (size_t)length < sizeof(text));
  pcp_sha256_t digest;
  pcp_sha256_compute(text, (size_t)length, &digest);
  uint64_t seed = 0;
  for (int i = 7; i >= 0; --i) seed = (seed << 8) | digest.bytes[i];
  return seed;
}

pcp_status_t pcp_data_shard_plan(const pcp_data_dataset_t* dataset,
                                 pcp_data_range_t range, uint32_t block_size,
                                 const char* const* worker_ids,
                                 size_t worker_count, uint64_t step,
                                 uint64_t base_seed,
                                 pcp_data_assignment_t* out_assignments) {
  if (worker_count == 0 || worker_count > PCP_DATA_MAX_WORKERS) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "worker count %zu is not in [1, %d]", worker_count,
                           PCP_DATA_MAX_WORKERS);
  }
  if (block_size == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "block_size must be >= 1");
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_data_check_range(dataset, range));
  for (size_t i = 0; i < worker_count; ++i) {
    size_t length = worker_ids[i] ? strlen(worker_ids[i]) : 0;
    if (length == 0 || length > PCP_DATA_MAX_WORKER_ID_LENGTH) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "worker id %zu is empty or longer than %d bytes",
                             i, PCP_DATA_MAX_WORKER_ID_LENGTH);
    }
  }
  sorted_worker_t* sorted = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(
      dataset->allocator, worker_count * sizeof(*sorted), (void**)&sorted));
  for (size_t i = 0; i < worker_count; ++i) {
    sorted[i] = (sorted_worker_t){worker_ids[i], i};
  }
  // Sorting makes the plan independent of the order workers registered in,
  // so the gateway, a resumed gateway and a test all compute the same one.
  qsort(sorted, worker_count, sizeof(*sorted), compare_workers);
  pcp_status_t status = pcp_ok_status();
  for (size_t k = 1; k < worker_count && !status; ++k) {
    if (strcmp(sorted[k - 1].id, sorted[k].id) == 0) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "worker id \"%s\" appears twice", sorted[k].id);
    }
  }
  uint64_t length = range.byte_length;
  uint64_t w = worker_count;
  uint64_t previous_end = range.byte_offset;
  for (uint64_t k = 0; k < w && !status; ++k) {
    // floor((k+1) * length / W) without a 128-bit product: (length / W) and
    // (length % W) < W keep every term below 2^64.
    uint64_t next = k + 1;
    uint64_t cut = (length / w) * next + (length % w) * next / w;
    uint64_t end = next == w ? range.byte_offset + length
                             : pcp_data_dataset_align_down(
                                   dataset, range.byte_offset + cut);
    uint64_t tokens =
        pcp_data_count_tokens(dataset, previous_end, end - previous_end);
    if (tokens < (uint64_t)block_size + 1) {
      status = pcp_make_status(
          PCP_STATUS_OUT_OF_RANGE,
          "%s: %zu workers over a range of %llu bytes leave worker \"%s\" "
          "%llu tokens, fewer than block_size + 1 = %u",
          dataset->path, worker_count, (unsigned long long)length, sorted[k].id,
          (unsigned long long)tokens, block_size + 1);
      break;
    }
    pcp_data_assignment_t* a = &out_assignments[sorted[k].input_index];
    memset(a, 0, sizeof(*a));
    memcpy(a->path, dataset->path, strlen(dataset->path) + 1);
    a->format = dataset->format;
    a->range = (pcp_data_range_t){previous_end, end - previous_end};
    a->shard_index = (uint32_t)k;
    a->shard_count = (uint32_t)w;
    a->step = step;
    a->seed = derive_seed(base_seed, sorted[k].id, step);
    previous_end = end;
  }
  pcp_allocator_free(dataset->allocator, sorted);
  return status;
}

//===----------------------------------------------------------------------===//
// Assignment JSON
//===----------------------------------------------------------------------===//

pcp_status_t pcp_data_assignment_format(const pcp_data_assignment_t* assignment,
                                        char* out_text, size_t capacity) {
  if (capacity > 0)
    out_text[0] = '\0';
  if (assignment->range.byte_offset > (uint64_t)INT64_MAX ||
      assignment->range.byte_length > (uint64_t)INT64_MAX ||
      assignment->step > (uint64_t)INT64_MAX) {
    return pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                           "assignment range or step does not fit a JSON "
                           "integer");
  }
  char seed_hex[17];
  snprintf(seed_hex, sizeof(seed_hex), "%016" PRIx64, assignment->seed);
  json_t* root = json_pack(
      "{s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:s}", "kind",
      "byte_range", "provider", "local_path", "path", assignment->path,
      "tokenizer", pcp_data_format_name(assignment->format), "offset",
      (json_int_t)assignment->range.byte_offset, "length",
      (json_int_t)assignment->range.byte_length, "chunk_id",
      (json_int_t)assignment->shard_index, "shard_index",
      (json_int_t)assignment->shard_index, "shard_count",
      (json_int_t)assignment->shard_count, "step", (json_int_t)assignment->step,
      "seed", seed_hex);
  if (root == NULL) {
    // json_pack fails on allocation or on a path that is not UTF-8.
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "assignment cannot be written as JSON (path not "
                           "UTF-8, or out of memory)");
  }
  if (assignment->has_cursor) {
    char cursor_text[PCP_DATA_MAX_CURSOR_JSON_LENGTH + 1];
    pcp_data_cursor_format(&assignment->cursor, cursor_text,
                           sizeof(cursor_text));
    json_t* cursor = json_loads(cursor_text, 0, NULL);
    PCP_ASSERT(cursor != NULL);
    json_object_set_new(root, "cursor", cursor);
  }
  size_t needed = json_dumpb(root, NULL, 0, JSON_COMPACT | JSON_PRESERVE_ORDER);
  pcp_status_t status = pcp_ok_status();
  if (needed == 0 || needed + 1 > capacity) {
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "assignment JSON needs %zu bytes, capacity is %zu",
                             needed + 1, capacity);
  } else {
    json_dumpb(root, out_text, needed, JSON_COMPACT | JSON_PRESERVE_ORDER);
    out_text[needed] = '\0';
  }
  json_decref(root);
  return status;
}

static pcp_status_t get_u64(const json_t* root, const char* key, bool required,
                            uint64_t fallback, uint64_t* out_value) {
  const json_t* value = json_object_get(root, key);
  if (value == NULL || json_is_null(value)) {
    if (required) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "data_assignment: \"%s\" is required", key);
    }
    *out_value = fallback;
    return pcp_ok_status();
  }
  if (!json_is_integer(value) || json_integer_value(value) < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "data_assignment: \"%s\" must be a non-negative "
                           "integer",
                           key);
  }
  *out_value = (uint64_t)json_integer_value(value);
  return pcp_ok_status();
}

static pcp_status_t parse_assignment(const json_t* root,
                                     pcp_data_assignment_t* a) {
  if (!json_is_object(root)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "data_assignment: not a JSON object");
  }
  const json_t* kind = json_object_get(root, "kind");
  if (kind && !(json_is_string(kind) &&
                strcmp(json_string_value(kind), "byte_range") == 0)) {
    return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                           "data_assignment: only kind \"byte_range\" is "
                           "supported");
  }
  const json_t* provider = json_object_get(root, "provider");
  const json_t* path = json_object_get(root, "path");
  const json_t* uri = json_object_get(root, "uri");
  const char* path_text = NULL;
  if (json_is_string(path)) {
    path_text = json_string_value(path);
  } else if (json_is_string(uri) &&
             strncmp(json_string_value(uri), "file://", 7) == 0) {
    path_text = json_string_value(uri) + 7;
  }
  if (provider &&
      !(json_is_string(provider) &&
        strcmp(json_string_value(provider), "local_path") == 0) &&
      !(json_is_string(uri) && path_text != NULL)) {
    return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                           "data_assignment: only provider \"local_path\" or "
                           "a file:// uri is supported");
  }
  if (path_text == NULL || path_text[0] == '\0') {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "data_assignment: \"path\" (or a file:// \"uri\") "
                           "is required");
  }
  size_t path_length = strlen(path_text);
  if (path_length > PCP_DATA_MAX_PATH_LENGTH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "data_assignment: \"path\" is longer than %d bytes",
                           PCP_DATA_MAX_PATH_LENGTH);
  }
  memcpy(a->path, path_text, path_length + 1);
  const json_t* tokenizer = json_object_get(root, "tokenizer");
  if (!json_is_string(tokenizer) ||
      !pcp_data_format_parse(
          pcp_make_cstring_view(json_string_value(tokenizer)), &a->format)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "data_assignment: \"tokenizer\" must be char, byte "
                           "or u16");
  }
  uint64_t chunk_id = 0;
  uint64_t shard_index = 0;
  uint64_t shard_count = 0;
  PCP_RETURN_IF_ERROR_BARE(
      get_u64(root, "offset", true, 0, &a->range.byte_offset));
  PCP_RETURN_IF_ERROR_BARE(
      get_u64(root, "length", true, 0, &a->range.byte_length));
  PCP_RETURN_IF_ERROR_BARE(get_u64(root, "chunk_id", false, 0, &chunk_id));
  PCP_RETURN_IF_ERROR_BARE(
      get_u64(root, "shard_index", false, chunk_id, &shard_index));
  PCP_RETURN_IF_ERROR_BARE(
      get_u64(root, "shard_count", false, 1, &shard_count));
  PCP_RETURN_IF_ERROR_BARE(get_u64(root, "step", false, 0, &a->step));
  if (shard_count == 0 || shard_count > PCP_DATA_MAX_WORKERS ||
      shard_index >= shard_count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "data_assignment: shard_index %llu / shard_count "
                           "%llu out of range",
                           (unsigned long long)shard_index,
                           (unsigned long long)shard_count);
  }
  a->shard_index = (uint32_t)shard_index;
  a->shard_count = (uint32_t)shard_count;
  const json_t* seed = json_object_get(root, "seed");
  if (json_is_string(seed)) {
    const char* hex = json_string_value(seed);
    bool valid = json_string_length(seed) == 16;
    for (size_t i = 0; valid && i < 16; ++i) {
      char c = hex[i];
      valid = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') ||
              (c >= 'A' && c <= 'F');
    }
    unsigned long long value = valid ? strtoull(hex, NULL, 16) : 0;
    if (!valid) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "data_assignment: \"seed\" must be 16 hex digits "
                             "or an integer");
    }
    a->seed = value;
  } else if (seed != NULL) {
    PCP_RETURN_IF_ERROR_BARE(get_u64(root, "seed", false, 0, &a->seed));
  }
  const json_t* cursor = json_object_get(root, "cursor");
  if (cursor && !json_is_null(cursor)) {
    PCP_RETURN_IF_ERROR(pcp_data_cursor_from_json(cursor, &a->cursor),
                        "data_assignment: \"cursor\"");
    a->has_cursor = true;
  }
  return pcp_ok_status();
}

pcp_status_t pcp_data_assignment_parse(pcp_string_view_t text,
                                       pcp_data_assignment_t* out_assignment) {
  memset(out_assignment, 0, sizeof(*out_assignment));
  if (text.size > PCP_DATA_MAX_ASSIGNMENT_JSON_LENGTH) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "data_assignment of %zu bytes exceeds %d", text.size,
                           PCP_DATA_MAX_ASSIGNMENT_JSON_LENGTH);
  }
  json_error_t error;
  json_t* root =
      json_loadb(text.data, text.size, JSON_REJECT_DUPLICATES, &error);
  if (root == NULL) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "data_assignment: %s (line %d column %d)",
                           error.text, error.line, error.column);
  }
  pcp_status_t status = parse_assignment(root, out_assignment);
  json_decref(root);
  if (status)
    memset(out_assignment, 0, sizeof(*out_assignment));
  return status;
}

//===----------------------------------------------------------------------===//
// Effective batch size
//===----------------------------------------------------------------------===//

pcp_status_t pcp_data_effective_batch_size_compute(
    uint32_t micro_batch, uint32_t worker_count, uint32_t accumulation_steps,
    uint64_t* out_effective_batch_size) {
  *out_effective_batch_size = 0;
  if (micro_batch == 0 || worker_count == 0 || accumulation_steps == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "effective batch size factors must be >= 1 "
                           "(micro_batch %u, workers %u, accumulation %u)",
                           micro_batch, worker_count, accumulation_steps);
  }
  uint64_t per_step = (uint64_t)micro_batch * worker_count;
  if (per_step > UINT64_MAX / accumulation_steps) {
    return pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                           "effective batch size overflows 64 bits");
  }
  *out_effective_batch_size = per_step * accumulation_steps;
  return pcp_ok_status();
}

pcp_status_t pcp_data_accumulation_steps_resolve(
    uint64_t effective_batch_size, uint32_t micro_batch, uint32_t worker_count,
    uint32_t* out_accumulation_steps) {
  *out_accumulation_steps = 0;
  if (effective_batch_size == 0 || micro_batch == 0 || worker_count == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "effective_batch_size (%llu), micro batch (%u) and "
                           "workers (%u) must be >= 1",
                           (unsigned long long)effective_batch_size,
                           micro_batch, worker_count);
  }
  uint64_t per_step = (uint64_t)micro_batch * worker_count;
  if (effective_batch_size % per_step != 0) {
    uint64_t below = effective_batch_size / per_step * per_step;
    uint64_t above = below + per_step;
    if (below == 0) {
      return pcp_make_status(
          PCP_STATUS_INVALID_ARGUMENT,
          "effective_batch_size %llu is not a multiple of micro batch %u x "
          "%u workers = %llu (smallest valid: %llu)",
          (unsigned long long)effective_batch_size, micro_batch, worker_count,
          (unsigned long long)per_step, (unsigned long long)above);
    }
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "effective_batch_size %llu is not a multiple of micro batch %u x %u "
        "workers = %llu (nearest valid: %llu or %llu)",
        (unsigned long long)effective_batch_size, micro_batch, worker_count,
        (unsigned long long)per_step, (unsigned long long)below,
        (unsigned long long)above);
  }
  uint64_t steps = effective_batch_size / per_step;
  if (steps > UINT32_MAX) {
    return pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                           "%llu accumulation steps do not fit 32 bits",
                           (unsigned long long)steps);
  }
  *out_accumulation_steps = (uint32_t)steps;
  return pcp_ok_status();
}
