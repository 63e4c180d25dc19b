// SPDX-License-Identifier: Apache-2.0
// DiLoCo checkpoint image: fixed little-endian header, raw f32 payloads,
// opaque data cursor, SHA-256 trailer over everything before it.

#include <stdlib.h>
#include <string.h>

#include "workloads/workloads.h"

static const char kMagic[8] = {'P', 'C', 'P', 'D', 'L', 'C', 'K', '1'};
// magic + version + tensor_count + outer_step + rng[4] + cursor_bytes
#define HEADER_BYTES (8u + 4u + 4u + 8u + 32u + 8u)

static void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= (uint64_t)p[i] << (8 * i);
  return v;
}
// f32 arrays are written element by element through their bit pattern, so
// the image is little-endian on any host.
static void put_f32s(uint8_t* p, const float* values, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits;
    memcpy(&bits, &values[i], 4);
    put_u32(p + 4 * i, bits);
  }
}
static void get_f32s(const uint8_t* p, float* values, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits = get_u32(p + 4 * i);
    memcpy(&values[i], &bits, 4);
  }
}

pcp_status_t pcp_diloco_checkpoint_serialize(
    const pcp_diloco_checkpoint_t* checkpoint, void** out_data,
    size_t* out_byte_length) {
  *out_data = NULL;
  *out_byte_length = 0;
  if (checkpoint->tensor_count > PCP_DILOCO_CHECKPOINT_MAX_TENSORS) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "checkpoint: %u tensors (max %u)",
        checkpoint->tensor_count, PCP_DILOCO_CHECKPOINT_MAX_TENSORS);
  }
  uint64_t total = 0;
  for (uint32_t i = 0; i < checkpoint->tensor_count; ++i) {
    total += checkpoint->tensor_elements[i];
  }
  if (total != checkpoint->parameter_count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "checkpoint: tensors hold %llu elements, "
                           "parameter_count is %zu",
                           (unsigned long long)total,
                           checkpoint->parameter_count);
  }
  size_t n = checkpoint->parameter_count;
  size_t limit = PCP_DILOCO_CHECKPOINT_MAX_BYTES;
  if (n > limit / 8 || checkpoint->cursor_byte_length > limit) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "checkpoint over %zu bytes", limit);
  }
  size_t length = HEADER_BYTES + 8u * checkpoint->tensor_count + 8u * n +
                  checkpoint->cursor_byte_length + PCP_SHA256_BYTE_LENGTH;
  // The system allocator: callers free the buffer with free() (diloco.h).
  uint8_t* buffer = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_malloc(pcp_allocator_system(), length, (void**)&buffer),
      "checkpoint buffer of %zu bytes", length);
  uint8_t* p = buffer;
  memcpy(p, kMagic, 8);
  put_u32(p + 8, PCP_DILOCO_CHECKPOINT_VERSION);
  put_u32(p + 12, checkpoint->tensor_count);
  put_u64(p + 16, checkpoint->outer_step);
  for (int i = 0; i < 4; ++i) put_u64(p + 24 + 8 * i, checkpoint->rng.state[i]);
  put_u64(p + 56, checkpoint->cursor_byte_length);
  p += HEADER_BYTES;
  for (uint32_t i = 0; i < checkpoint->tensor_count; ++i, p += 8) {
    put_u64(p, checkpoint->tensor_elements[i]);
  }
  put_f32s(p, checkpoint->parameters, n);
  p += 4 * n;
  put_f32s(p, checkpoint->velocity, n);
  p += 4 * n;
  if (checkpoint->cursor_byte_length > 0) {
    memcpy(p, checkpoint->cursor, checkpoint->cursor_byte_length);
  }
  p += checkpoint->cursor_byte_length;
  pcp_sha256_t digest;
  pcp_sha256_compute(buffer, (size_t)(p - buffer), &digest);
  memcpy(p, digest.bytes, PCP_SHA256_BYTE_LENGTH);
  *out_data = buffer;
  *out_byte_length = length;
  return pcp_ok_status();
}

static pcp_status_t corrupt(const char* what) {
  return pcp_make_status(PCP_STATUS_DATA_LOSS, "diloco checkpoint: %s", what);
}

pcp_status_t pcp_diloco_checkpoint_deserialize(
    const void* data, size_t byte_length,
    pcp_diloco_checkpoint_t* out_checkpoint) {
  memset(out_checkpoint, 0, sizeof(*out_checkpoint));
  const uint8_t* base = data;
  if (byte_length < HEADER_BYTES + PCP_SHA256_BYTE_LENGTH) {
    return corrupt("truncated header");
  }
  if (memcmp(base, kMagic, 8) != 0)
    return corrupt("bad magic");
  // The digest is checked before any length is trusted.
  size_t body = byte_length - PCP_SHA256_BYTE_LENGTH;
  pcp_sha256_t digest;
  pcp_sha256_compute(base, body, &digest);
  if (memcmp(digest.bytes, base + body, PCP_SHA256_BYTE_LENGTH) != 0) {
    return corrupt("SHA-256 mismatch");
  }
  if (get_u32(base + 8) != PCP_DILOCO_CHECKPOINT_VERSION) {
    return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                           "diloco checkpoint: version %u", get_u32(base + 8));
  }
  uint32_t tensors = get_u32(base + 12);
  uint64_t cursor_bytes = get_u64(base + 56);
  if (tensors > PCP_DILOCO_CHECKPOINT_MAX_TENSORS ||
      8ull * tensors > body - HEADER_BYTES) {
    return corrupt("tensor count");
  }
  const uint8_t* p = base + HEADER_BYTES;
  uint64_t total = 0;
  for (uint32_t i = 0; i < tensors; ++i) {
    uint64_t e = get_u64(p + 8 * i);
    if (e > body || total + e > body)
      return corrupt("tensor length");
    total += e;
  }
  size_t rest = body - HEADER_BYTES - 8u * tensors;
  if (total > rest / 8 || cursor_bytes != rest - 8 * total) {
    return corrupt("payload length");
  }
  pcp_diloco_checkpoint_t c = {0};
  c.outer_step = get_u64(base + 16);
  for (int i = 0; i < 4; ++i) c.rng.state[i] = get_u64(base + 24 + 8 * i);
  c.tensor_count = tensors;
  c.parameter_count = (size_t)total;
  c.cursor_byte_length = (size_t)cursor_bytes;
  // The system allocator, which pcp_diloco_checkpoint_deinitialize frees
  // with (callers also fill checkpoints with their own malloc'd arrays).
  pcp_allocator_t allocator = pcp_allocator_system();
  pcp_status_t status = pcp_allocator_malloc(allocator, 8u * tensors + 1,
                                             (void**)&c.tensor_elements);
  if (!status) {
    status = pcp_allocator_malloc(allocator, 4 * c.parameter_count + 1,
                                  (void**)&c.parameters);
  }
  if (!status) {
    status = pcp_allocator_malloc(allocator, 4 * c.parameter_count + 1,
                                  (void**)&c.velocity);
  }
  if (!status) {
    status = pcp_allocator_malloc(allocator, c.cursor_byte_length + 1,
                                  (void**)&c.cursor);
  }
  if (status) {
    pcp_diloco_checkpoint_deinitialize(&c);
    return pcp_status_annotate_f(status, "diloco checkpoint of %zu parameters",
                                 (size_t)total);
  }
  for (uint32_t i = 0; i < tensors; ++i) {
    c.tensor_elements[i] = get_u64(p + 8 * i);
  }
  p += 8u * tensors;
  get_f32s(p, c.parameters, c.parameter_count);
  p += 4 * c.parameter_count;
  get_f32s(p, c.velocity, c.parameter_count);
  p += 4 * c.parameter_count;
  if (c.cursor_byte_length > 0)
    memcpy(c.cursor, p, c.cursor_byte_length);
  *out_checkpoint = c;
  return pcp_ok_status();
}

void pcp_diloco_checkpoint_deinitialize(pcp_diloco_checkpoint_t* checkpoint) {
  pcp_allocator_t allocator = pcp_allocator_system();
  pcp_allocator_free(allocator, checkpoint->tensor_elements);
  pcp_allocator_free(allocator, checkpoint->parameters);
  pcp_allocator_free(allocator, checkpoint->velocity);
  pcp_allocator_free(allocator, checkpoint->cursor);
  memset(checkpoint, 0, sizeof(*checkpoint));
}

pcp_status_t pcp_diloco_checkpoint_save(
    const pcp_diloco_checkpoint_t* checkpoint, const char* path) {
  void* data = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_diloco_checkpoint_serialize(checkpoint, &data, &length));
  pcp_status_t status = pcp_file_write_atomic(path, data, length);
  pcp_allocator_free(pcp_allocator_system(), data);
  return status;
}

pcp_status_t pcp_diloco_checkpoint_load(
    const char* path, pcp_diloco_checkpoint_t* out_checkpoint) {
  memset(out_checkpoint, 0, sizeof(*out_checkpoint));
  void* data = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR(
      pcp_file_read_all(path, PCP_DILOCO_CHECKPOINT_MAX_BYTES, &data, &length),
      "diloco checkpoint %s", path);
  pcp_status_t status =
      pcp_diloco_checkpoint_deserialize(data, length, out_checkpoint);
  pcp_allocator_free(pcp_allocator_system(), data);  // pcp_file_read_all
  return status;
}

pcp_status_t pcp_diloco_checkpoint_store_write(
    const pcp_diloco_checkpoint_t* checkpoint, pcp_store_t* store,
    const char* job_id, pcp_store_checkpoint_t* out_row) {
  void* data = NULL;
  size_t length = 0;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_diloco_checkpoint_serialize(checkpoint, &data, &length));
  pcp_status_t status = pcp_store_checkpoint_write(
      store, job_id, (int64_t)checkpoint->outer_step, data, length, out_row);
  pcp_allocator_free(pcp_allocator_system(), data);
  return status;
}
