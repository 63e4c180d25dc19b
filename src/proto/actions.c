// SPDX-License-Identifier: Apache-2.0
//
// Actions and the queue the state machines emit them through.

#include <string.h>

#include "proto/proto_impl.h"

void pcp_proto_action_deinitialize(pcp_proto_action_t* action) {
  if (!action)
    return;
  pcp_proto_encoded_frame_deinitialize(&action->frame);
  pcp_proto_frame_deinitialize(&action->received);
  pcp_status_ignore(action->status);
  if (action->blob)
    pcp_proto_blob_free(action->allocator, action->blob);
  for (size_t i = 0; i < action->tensor_blob_count; ++i) {
    pcp_proto_blob_free(action->allocator, action->tensor_blobs[i].data);
  }
  pcp_allocator_free(action->allocator, action->tensor_blobs);
  memset(action, 0, sizeof(*action));
}

void pcp_proto_action_queue_initialize(pcp_allocator_t allocator,
                                       pcp_proto_action_queue_t* out_queue) {
  memset(out_queue, 0, sizeof(*out_queue));
  out_queue->allocator = allocator;
}

void pcp_proto_action_queue_deinitialize(pcp_proto_action_queue_t* queue) {
  pcp_proto_action_t action;
  while (pcp_proto_action_queue_pop(queue, &action)) {
    pcp_proto_action_deinitialize(&action);
  }
  pcp_allocator_free(queue->allocator, queue->items);
  memset(queue, 0, sizeof(*queue));
}

pcp_status_t pcp_proto_action_queue_push(pcp_proto_action_queue_t* queue,
                                         pcp_proto_action_t* action) {
  if (queue->count == queue->capacity) {
    size_t capacity = queue->capacity ? queue->capacity * 2 : 16;
    void* items = NULL;
    pcp_status_t status = pcp_allocator_malloc(
        queue->allocator, capacity * sizeof(pcp_proto_action_t), &items);
    if (status) {
      pcp_proto_action_deinitialize(action);
      return status;
    }
    // Unroll the ring into the new array.
    pcp_proto_action_t* dst = items;
    for (size_t i = 0; i < queue->count; ++i) {
      dst[i] = queue->items[(queue->head + i) % queue->capacity];
    }
    pcp_allocator_free(queue->allocator, queue->items);
    queue->items = dst;
    queue->capacity = capacity;
    queue->head = 0;
  }
  queue->items[(queue->head + queue->count) % queue->capacity] = *action;
  queue->count++;
  memset(action, 0, sizeof(*action));
  return pcp_ok_status();
}

bool pcp_proto_action_queue_pop(pcp_proto_action_queue_t* queue,
                                pcp_proto_action_t* out_action) {
  if (queue->count == 0) {
    memset(out_action, 0, sizeof(*out_action));
    return false;
  }
  *out_action = queue->items[queue->head];
  queue->head = (queue->head + 1) % queue->capacity;
  queue->count--;
  return true;
}

const pcp_proto_tensor_blob_t* pcp_proto_action_tensor_blob(
    const pcp_proto_action_t* action, const char* blob_id) {
  for (size_t i = 0; i < action->tensor_blob_count; ++i) {
    if (strcmp(action->tensor_blobs[i].id, blob_id) == 0) {
      return &action->tensor_blobs[i];
    }
  }
  return NULL;
}
