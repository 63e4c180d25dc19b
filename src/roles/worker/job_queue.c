// SPDX-License-Identifier: Apache-2.0
// The bounded queue from the worker's loop thread to its compute thread.

#include <stdlib.h>
#include <string.h>

#include "roles/worker/worker_impl.h"

pcp_status_t pcp_roles_worker_job_queue_initialize(
    size_t capacity, pcp_allocator_t allocator,
    pcp_roles_worker_job_queue_t* out_queue) {
  memset(out_queue, 0, sizeof(*out_queue));
  if (capacity == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "job queue capacity must be positive");
  }
  if (capacity > SIZE_MAX / sizeof(void*)) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "job queue of %zu entries", capacity);
  }
  void* items = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(allocator, capacity * sizeof(void*), &items),
      "job queue of %zu entries", capacity);
  out_queue->items = items;
  out_queue->allocator = allocator;
  out_queue->capacity = capacity;
  pthread_mutex_init(&out_queue->mutex, NULL);
  pthread_cond_init(&out_queue->cond, NULL);
  return pcp_ok_status();
}

void pcp_roles_worker_job_queue_deinitialize(
    pcp_roles_worker_job_queue_t* queue) {
  if (!queue->items) {
    return;
  }
  pthread_cond_destroy(&queue->cond);
  pthread_mutex_destroy(&queue->mutex);
  pcp_allocator_free(queue->allocator, queue->items);
  memset(queue, 0, sizeof(*queue));
}

pcp_status_t pcp_roles_worker_job_queue_push(
    pcp_roles_worker_job_queue_t* queue, void* job) {
  pthread_mutex_lock(&queue->mutex);
  pcp_status_t status = pcp_ok_status();
  if (queue->closed) {
    status =
        pcp_make_status(PCP_STATUS_FAILED_PRECONDITION, "job queue is closed");
  } else if (queue->count == queue->capacity) {
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "job queue is full (%zu jobs)", queue->capacity);
  } else {
    queue->items[(queue->head + queue->count) % queue->capacity] = job;
    queue->count++;
    pthread_cond_signal(&queue->cond);
  }
  pthread_mutex_unlock(&queue->mutex);
  return status;
}

void* pcp_roles_worker_job_queue_pop(pcp_roles_worker_job_queue_t* queue) {
  pthread_mutex_lock(&queue->mutex);
  while (queue->count == 0 && !queue->closed) {
    pthread_cond_wait(&queue->cond, &queue->mutex);
  }
  void* job = NULL;
  if (queue->count > 0) {
    job = queue->items[queue->head];
    queue->head = (queue->head + 1) % queue->capacity;
    queue->count--;
  }
  pthread_mutex_unlock(&queue->mutex);
  return job;
}

void pcp_roles_worker_job_queue_close(pcp_roles_worker_job_queue_t* queue) {
  pthread_mutex_lock(&queue->mutex);
  queue->closed = true;
  pthread_cond_broadcast(&queue->cond);
  pthread_mutex_unlock(&queue->mutex);
}

size_t pcp_roles_worker_job_queue_count(pcp_roles_worker_job_queue_t* queue) {
  pthread_mutex_lock(&queue->mutex);
  size_t count = queue->count;
  pthread_mutex_unlock(&queue->mutex);
  return count;
}
