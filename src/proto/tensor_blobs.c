// SPDX-License-Identifier: Apache-2.0
//
// Tensors too large to travel inline: split into BLOB_CHUNKs on the sender,
// held by request id on the receiver until the frame that names them.

#include <stdio.h>
#include <string.h>

#include "proto/proto_impl.h"

#define BLOB_ID_BYTES 32

//===----------------------------------------------------------------------===//
// Sender
//===----------------------------------------------------------------------===//

void pcp_proto_outgoing_tensors_deinitialize(pcp_proto_outgoing_tensors_t* o) {
  pcp_allocator_free(o->allocator, o->refs);
  pcp_allocator_free(o->allocator, o->sections);
  pcp_allocator_free(o->allocator, o->ids);
  memset(o, 0, sizeof(*o));
}

pcp_status_t pcp_proto_outgoing_tensors_prepare(
    uint16_t version, uint64_t request_id, uint64_t task_id,
    const pcp_proto_tensor_ref_t* refs, uint32_t ref_count,
    const pcp_proto_section_t* sections, size_t section_count,
    const pcp_proto_limits_t* limits, pcp_allocator_t allocator,
    pcp_proto_chunk_emit_fn_t emit, void* user_data,
    pcp_proto_outgoing_tensors_t* out) {
  memset(out, 0, sizeof(*out));
  out->allocator = allocator;
  if (section_count > PCP_PROTO_CEILING_SECTIONS) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "%zu sections exceed %u", section_count,
                           PCP_PROTO_CEILING_SECTIONS);
  }
  void* memory = NULL;
  pcp_status_t status = pcp_allocator_calloc(
      allocator, (ref_count ? ref_count : 1) * sizeof(pcp_proto_tensor_ref_t),
      &memory);
  out->refs = memory;
  if (!status) {
    status = pcp_allocator_calloc(
        allocator, (section_count ? section_count : 1) * sizeof(*sections),
        &memory);
    out->sections = memory;
  }
  if (!status) {
    status = pcp_allocator_calloc(
        allocator, (section_count ? section_count : 1) * BLOB_ID_BYTES,
        &memory);
    out->ids = memory;
  }
  // new_index[i]: position among inline sections, or -1 when chunked.
  int32_t new_index[PCP_PROTO_CEILING_SECTIONS];
  uint64_t inline_bytes = 0;
  for (size_t i = 0; !status && i < section_count; ++i) {
    const pcp_proto_section_t* s = &sections[i];
    uint64_t length = 0;
    if (!pcp_proto_tensor_byte_length(s->element_type, s->rank, s->shape,
                                      &length) ||
        s->rank > PCP_MAX_TENSOR_RANK) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "section %zu: bad dtype or shape", i);
      break;
    }
    // Inline while the frame stays within one chunk's worth of data.
    if (inline_bytes + length <= limits->chunk_bytes) {
      inline_bytes += length;
      new_index[i] = (int32_t)out->section_count;
      out->sections[out->section_count++] = *s;
      continue;
    }
    new_index[i] = -1;
    char* id = out->ids + i * BLOB_ID_BYTES;
    snprintf(id, BLOB_ID_BYTES, "t%llu.s%zu", (unsigned long long)task_id, i);
    status = pcp_proto_blob_encode_chunks(
        version, request_id, id, PCP_PROTO_BLOB_TENSOR, s->data, length, limits,
        allocator, emit, user_data);
  }
  for (uint32_t r = 0; !status && r < ref_count; ++r) {
    out->refs[r] = refs[r];
    if (refs[r].kind != PCP_PROTO_TENSOR_REF_SECTION)
      continue;
    uint32_t i = refs[r].section;
    if (i >= section_count) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "reference %u names section %u of %zu", r, i,
                               section_count);
      break;
    }
    if (new_index[i] >= 0) {
      out->refs[r].section = (uint32_t)new_index[i];
      continue;
    }
    const pcp_proto_section_t* s = &sections[i];
    pcp_proto_tensor_ref_t* ref = &out->refs[r];
    ref->kind = PCP_PROTO_TENSOR_REF_BLOB;
    ref->name = out->ids + i * BLOB_ID_BYTES;
    ref->element_type = s->element_type;
    ref->rank = s->rank;
    memcpy(ref->shape, s->shape, sizeof(ref->shape));
  }
  if (status)
    pcp_proto_outgoing_tensors_deinitialize(out);
  return status;
}

//===----------------------------------------------------------------------===//
// Receiver
//===----------------------------------------------------------------------===//

pcp_status_t pcp_proto_blob_table_initialize(size_t max,
                                             pcp_allocator_t allocator,
                                             pcp_proto_blob_table_t* out) {
  memset(out, 0, sizeof(*out));
  out->allocator = allocator;
  out->max = max;
  void* memory = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      allocator, (max ? max : 1) * sizeof(pcp_proto_blob_slot_t), &memory));
  out->slots = memory;
  return pcp_ok_status();
}

static void slot_free(pcp_proto_blob_table_t* t, pcp_proto_blob_slot_t* s) {
  if (s->complete) {
    pcp_proto_blob_free(t->allocator, s->blob.data);
  } else {
    pcp_proto_blob_assembly_deinitialize(&s->assembly);
  }
  *s = t->slots[--t->count];
}

void pcp_proto_blob_table_clear(pcp_proto_blob_table_t* t) {
  while (t->count > 0) slot_free(t, &t->slots[0]);
}

void pcp_proto_blob_table_deinitialize(pcp_proto_blob_table_t* t) {
  if (!t->slots)
    return;
  pcp_proto_blob_table_clear(t);
  pcp_allocator_free(t->allocator, t->slots);
  memset(t, 0, sizeof(*t));
}

// A connection streams one request's blobs at a time (the sender queues a
// request's chunks and then its frame, in order), so blobs left by any other
// request are orphans, e.g. of a frame the sender failed to encode after its
// chunks went out: drop them rather than let them fill the table.
static void drop_orphans(pcp_proto_blob_table_t* t, uint64_t request_id) {
  for (size_t i = 0; i < t->count;) {
    if (t->slots[i].request_id != request_id) {
      slot_free(t, &t->slots[i]);
    } else {
      ++i;
    }
  }
}

uint8_t* pcp_proto_blob_table_dest(pcp_proto_blob_table_t* t,
                                   uint64_t request_id,
                                   const pcp_proto_blob_chunk_t* chunk,
                                   const pcp_proto_limits_t* limits) {
  if (chunk->kind != PCP_PROTO_BLOB_TENSOR)
    return NULL;
  for (size_t i = 0; i < t->count; ++i) {
    pcp_proto_blob_slot_t* s = &t->slots[i];
    if (s->request_id == request_id && !s->complete &&
        strcmp(s->assembly.blob_id, chunk->blob_id) == 0) {
      return pcp_proto_blob_assembly_next_dest(&s->assembly, chunk);
    }
  }
  if (chunk->index != 0)
    return NULL;
  // What blob_table_add would do for chunk 0, minus adding it: the frame's
  // checksums are verified in place before add sees it.
  drop_orphans(t, request_id);
  if (t->count == t->max)
    return NULL;
  pcp_proto_blob_slot_t* s = &t->slots[t->count];
  memset(s, 0, sizeof(*s));
  s->request_id = request_id;
  pcp_status_t status = pcp_proto_blob_assembly_begin(
      request_id, chunk, limits, t->allocator, &s->assembly);
  if (status) {
    // Declined: the normal path refuses the chunk with this same error.
    pcp_status_ignore(status);
    return NULL;
  }
  t->count++;
  uint8_t* dest = pcp_proto_blob_assembly_next_dest(&s->assembly, chunk);
  if (!dest)
    slot_free(t, s);
  return dest;
}

pcp_status_t pcp_proto_blob_table_add(pcp_proto_blob_table_t* t,
                                      uint64_t request_id,
                                      const pcp_proto_blob_chunk_t* chunk,
                                      const pcp_proto_limits_t* limits) {
  for (size_t i = 0; i < t->count; ++i) {
    pcp_proto_blob_slot_t* s = &t->slots[i];
    if (s->request_id != request_id || s->complete ||
        strcmp(s->assembly.blob_id, chunk->blob_id) != 0) {
      continue;
    }
    bool complete = false;
    pcp_status_t status =
        pcp_proto_blob_assembly_add(&s->assembly, chunk, &complete);
    if (status) {
      slot_free(t, s);
      return status;
    }
    if (complete) {
      snprintf(s->blob.id, sizeof(s->blob.id), "%s", s->assembly.blob_id);
      pcp_proto_blob_assembly_take(&s->assembly, &s->blob.data,
                                   &s->blob.byte_length);
      s->complete = true;
    }
    return pcp_ok_status();
  }
  drop_orphans(t, request_id);
  if (t->count == t->max) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "%zu tensor blobs already pending", t->count);
  }
  pcp_proto_blob_slot_t* s = &t->slots[t->count];
  memset(s, 0, sizeof(*s));
  s->request_id = request_id;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_blob_assembly_initialize(
      request_id, chunk, limits, t->allocator, &s->assembly));
  t->count++;
  if (chunk->count == 1) {
    snprintf(s->blob.id, sizeof(s->blob.id), "%s", s->assembly.blob_id);
    pcp_proto_blob_assembly_take(&s->assembly, &s->blob.data,
                                 &s->blob.byte_length);
    s->complete = true;
  }
  return pcp_ok_status();
}

pcp_status_t pcp_proto_blob_table_attach(pcp_proto_blob_table_t* t,
                                         uint64_t request_id,
                                         const pcp_proto_tensor_ref_t* refs,
                                         uint32_t ref_count,
                                         pcp_proto_action_t* action) {
  size_t n = 0;
  for (size_t i = 0; i < t->count; ++i) {
    n += t->slots[i].request_id == request_id && t->slots[i].complete;
  }
  pcp_status_t status = pcp_ok_status();
  if (n > 0) {
    void* memory = NULL;
    status = pcp_allocator_calloc(t->allocator,
                                  n * sizeof(pcp_proto_tensor_blob_t), &memory);
    action->tensor_blobs = memory;
  }
  // Move the complete blobs; drop partial ones of this request.
  for (size_t i = 0; i < t->count;) {
    pcp_proto_blob_slot_t* s = &t->slots[i];
    if (s->request_id != request_id) {
      ++i;
      continue;
    }
    if (!status && s->complete) {
      action->tensor_blobs[action->tensor_blob_count++] = s->blob;
      s->complete = false;
      memset(&s->blob, 0, sizeof(s->blob));
      memset(&s->assembly, 0, sizeof(s->assembly));
    }
    slot_free(t, s);  // the slot moves: do not advance
  }
  for (uint32_t r = 0; !status && r < ref_count; ++r) {
    if (refs[r].kind != PCP_PROTO_TENSOR_REF_BLOB)
      continue;
    const pcp_proto_tensor_blob_t* blob =
        pcp_proto_action_tensor_blob(action, refs[r].name);
    uint64_t expected = 0;
    if (!blob) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "tensor blob '%s' never arrived", refs[r].name);
    } else if (!pcp_proto_tensor_byte_length(refs[r].element_type, refs[r].rank,
                                             refs[r].shape, &expected) ||
               expected != blob->byte_length) {
      status =
          pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                          "tensor blob '%s' has %llu bytes, its dtype "
                          "and shape say %llu",
                          refs[r].name, (unsigned long long)blob->byte_length,
                          (unsigned long long)expected);
    }
  }
  return status;
}
