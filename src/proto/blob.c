// SPDX-License-Identifier: Apache-2.0
//
// Chunked blobs (docs/protocol.md s.1.4): splitting on the sender, in-order
// reassembly on the receiver. Every chunk's bytes are checked by the
// section CRC32C of their frame; a program blob is also checked whole
// against its SHA-256 (its content address, which the worker's cache keys
// on). A tensor blob is not hashed: see docs/decisions.md "Tensor blobs:
// CRC32C per chunk, no SHA-256".

#include <string.h>

#include "proto/proto_impl.h"

pcp_status_t pcp_proto_blob_encode_chunks(
    uint16_t version, uint64_t request_id, const char* blob_id,
    pcp_proto_blob_kind_t kind, const void* data, uint64_t byte_length,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_chunk_emit_fn_t emit, void* user_data) {
  if (byte_length > limits->max_blob_bytes) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "blob '%s' of %llu bytes exceeds %llu", blob_id,
                           (unsigned long long)byte_length,
                           (unsigned long long)limits->max_blob_bytes);
  }
  uint64_t chunk = limits->chunk_bytes;
  uint64_t count = byte_length == 0 ? 1 : (byte_length + chunk - 1) / chunk;
  // Programs only: a tensor has no content address, and hashing 256 MiB
  // on the loop thread cost more than sending it (docs/decisions.md).
  bool hashed = kind == PCP_PROTO_BLOB_PROGRAM;
  pcp_sha256_t digest;
  memset(&digest, 0, sizeof(digest));
  if (hashed)
    pcp_sha256_compute(data, (size_t)byte_length, &digest);
  const uint8_t* p = data;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t offset = i * chunk;
    uint64_t n = byte_length - offset < chunk ? byte_length - offset : chunk;
    pcp_proto_blob_chunk_t message = {
        .blob_id = blob_id,
        .kind = kind,
        .index = i,
        .count = count,
        .offset = offset,
        .total = byte_length,
        .has_sha256 = hashed && i + 1 == count,
        .data = p ? p + offset : NULL,
        .data_length = n,
    };
    memcpy(message.sha256, digest.bytes, sizeof(message.sha256));
    pcp_proto_encoded_frame_t frame;
    PCP_RETURN_IF_ERROR(
        pcp_proto_blob_chunk_encode(version, request_id, &message, limits,
                                    allocator, &frame),
        "chunk %llu of blob '%s'", (unsigned long long)i, blob_id);
    PCP_RETURN_IF_ERROR_BARE(emit(user_data, &frame));
  }
  return pcp_ok_status();
}

pcp_status_t pcp_proto_blob_assembly_begin(
    uint64_t request_id, const pcp_proto_blob_chunk_t* chunk,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_blob_assembly_t* out_assembly) {
  memset(out_assembly, 0, sizeof(*out_assembly));
  out_assembly->allocator = allocator;
  if (chunk->index != 0 || chunk->offset != 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "blob '%s': first chunk has index %llu",
                           chunk->blob_id, (unsigned long long)chunk->index);
  }
  if (chunk->total > limits->max_blob_bytes) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "blob '%s' of %llu bytes exceeds %llu",
                           chunk->blob_id, (unsigned long long)chunk->total,
                           (unsigned long long)limits->max_blob_bytes);
  }
  // A peer cannot make us allocate for chunks it will never send: the
  // count must be consistent with the total and the chunk limit.
  uint64_t min_count = chunk->total == 0
                           ? 1
                           : (chunk->total + limits->max_chunk_bytes - 1) /
                                 limits->max_chunk_bytes;
  if (chunk->count < min_count || chunk->count > chunk->total + 1) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "blob '%s': %llu chunks cannot carry %llu bytes",
                           chunk->blob_id, (unsigned long long)chunk->count,
                           (unsigned long long)chunk->total);
  }
  size_t id_length = strlen(chunk->blob_id);
  if (id_length > PCP_PROTO_MAX_STRING_BYTES) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "blob id too long");
  }
  memcpy(out_assembly->blob_id, chunk->blob_id, id_length + 1);
  out_assembly->kind = chunk->kind;
  out_assembly->request_id = request_id;
  out_assembly->total = chunk->total;
  out_assembly->count = chunk->count;
  out_assembly->max_chunk_bytes = limits->max_chunk_bytes;
  // Allocated once, with the announced size, after the checks above.
  pcp_status_t status = pcp_proto_aligned_allocate(
      allocator, (size_t)(chunk->total ? chunk->total : 1),
      &out_assembly->data);
  if (!status && chunk->kind == PCP_PROTO_BLOB_PROGRAM)
    status = pcp_sha256_stream_create(&out_assembly->hash);
  if (status)
    pcp_proto_blob_assembly_deinitialize(out_assembly);
  return status;
}

pcp_status_t pcp_proto_blob_assembly_initialize(
    uint64_t request_id, const pcp_proto_blob_chunk_t* chunk,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_blob_assembly_t* out_assembly) {
  pcp_status_t status = pcp_proto_blob_assembly_begin(request_id, chunk, limits,
                                                      allocator, out_assembly);
  if (status)
    return status;
  bool complete = false;
  status = pcp_proto_blob_assembly_add(out_assembly, chunk, &complete);
  if (status)
    pcp_proto_blob_assembly_deinitialize(out_assembly);
  return status;
}

pcp_status_t pcp_proto_blob_assembly_add(pcp_proto_blob_assembly_t* a,
                                         const pcp_proto_blob_chunk_t* chunk,
                                         bool* out_complete) {
  *out_complete = false;
  if (!a->data || (a->kind == PCP_PROTO_BLOB_PROGRAM && !a->hash)) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "blob assembly not started");
  }
  if (strcmp(chunk->blob_id, a->blob_id) != 0 || chunk->kind != a->kind ||
      chunk->total != a->total || chunk->count != a->count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "blob '%s': chunk %llu does not match chunk 0",
                           a->blob_id, (unsigned long long)chunk->index);
  }
  if (chunk->index != a->next_index || chunk->offset != a->received) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "blob '%s': chunk %llu at %llu, expected chunk "
                           "%llu at %llu",
                           a->blob_id, (unsigned long long)chunk->index,
                           (unsigned long long)chunk->offset,
                           (unsigned long long)a->next_index,
                           (unsigned long long)a->received);
  }
  if (chunk->data_length > a->max_chunk_bytes) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "blob '%s': chunk %llu of %llu bytes exceeds the "
                           "chunk limit %llu",
                           a->blob_id, (unsigned long long)chunk->index,
                           (unsigned long long)chunk->data_length,
                           (unsigned long long)a->max_chunk_bytes);
  }
  if (chunk->data_length > a->total - a->received) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "blob '%s': chunk %llu overruns the total",
                           a->blob_id, (unsigned long long)chunk->index);
  }
  bool last = chunk->index + 1 == a->count;
  if (!last && chunk->data_length == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "blob '%s': empty chunk %llu", a->blob_id,
                           (unsigned long long)chunk->index);
  }
  if (chunk->data_length) {
    // A chunk that the decoder's data sink already read into place (zero
    // copy on receive) needs no copy.
    uint8_t* dest = a->data + a->received;
    if (chunk->data != dest)
      memcpy(dest, chunk->data, (size_t)chunk->data_length);
    if (a->hash)
      pcp_sha256_stream_update(a->hash, dest, (size_t)chunk->data_length);
  }
  a->received += chunk->data_length;
  a->next_index++;
  if (!last)
    return pcp_ok_status();
  if (a->received != a->total) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "blob '%s': last chunk leaves %llu bytes missing",
                           a->blob_id,
                           (unsigned long long)(a->total - a->received));
  }
  if (a->kind == PCP_PROTO_BLOB_TENSOR) {
    // Every chunk passed its CRC32C; a tensor's sha256, if a sender still
    // sends one, is ignored (s.1.4).
    *out_complete = true;
    return pcp_ok_status();
  }
  if (!chunk->has_sha256) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "blob '%s': last chunk carries no sha256",
                           a->blob_id);
  }
  pcp_sha256_t digest;
  pcp_sha256_stream_finish(a->hash, &digest);
  a->hash = NULL;
  if (memcmp(digest.bytes, chunk->sha256, sizeof(digest.bytes)) != 0) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS, "blob '%s': SHA-256 mismatch",
                           a->blob_id);
  }
  *out_complete = true;
  return pcp_ok_status();
}

void pcp_proto_blob_assembly_take(pcp_proto_blob_assembly_t* assembly,
                                  uint8_t** out_data,
                                  uint64_t* out_byte_length) {
  // Aligned, so a program can be handed to IREE without a copy.
  *out_data = assembly->data;
  *out_byte_length = assembly->total;
  assembly->data = NULL;
  pcp_proto_blob_assembly_deinitialize(assembly);
}

void pcp_proto_blob_assembly_deinitialize(pcp_proto_blob_assembly_t* assembly) {
  if (assembly->hash) {
    pcp_sha256_t ignored;
    pcp_sha256_stream_finish(assembly->hash, &ignored);
  }
  pcp_proto_aligned_free(assembly->allocator, assembly->data);
  memset(assembly, 0, sizeof(*assembly));
}

void pcp_proto_blob_free(pcp_allocator_t allocator, uint8_t* data) {
  pcp_proto_aligned_free(allocator, data);
}

uint8_t* pcp_proto_blob_assembly_next_dest(
    const pcp_proto_blob_assembly_t* a, const pcp_proto_blob_chunk_t* chunk) {
  // Only a chunk that assembly_add will accept may be written into place:
  // anything else goes the normal way and gets the normal error.
  if (!a->data || strcmp(chunk->blob_id, a->blob_id) != 0 ||
      chunk->kind != a->kind || chunk->total != a->total ||
      chunk->count != a->count || chunk->index != a->next_index ||
      chunk->offset != a->received || chunk->data_length == 0 ||
      chunk->data_length > a->max_chunk_bytes ||
      chunk->data_length > a->total - a->received) {
    return NULL;
  }
  return a->data + a->received;
}
