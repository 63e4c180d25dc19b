// SPDX-License-Identifier: Apache-2.0
//
// Programs (registered VMFB bytes, offers and their answers) and session
// bindings.

#include "fabric/fabric_impl.h"

bool pcp_fabric_hash_set_contains(const hash_set_t* set, const uint8_t* hash) {
  for (uint32_t i = 0; i < set->count; ++i) {
    if (memcmp(set->items[i], hash, PCP_SHA256_BYTE_LENGTH) == 0)
      return true;
  }
  return false;
}

pcp_status_t pcp_fabric_hash_set_add(pcp_allocator_t allocator, hash_set_t* set,
                                     const uint8_t* hash) {
  if (pcp_fabric_hash_set_contains(set, hash))
    return pcp_ok_status();
  if (set->count == set->capacity) {
    uint32_t capacity = set->capacity ? set->capacity * 2 : 4;
    void* p = set->items;
    PCP_RETURN_IF_ERROR_BARE(pcp_allocator_realloc(
        allocator, (size_t)capacity * PCP_SHA256_BYTE_LENGTH, &p));
    set->items = p;
    set->capacity = capacity;
  }
  memcpy(set->items[set->count++], hash, PCP_SHA256_BYTE_LENGTH);
  return pcp_ok_status();
}

void pcp_fabric_hash_set_remove(hash_set_t* set, const uint8_t* hash) {
  for (uint32_t i = 0; i < set->count; ++i) {
    if (memcmp(set->items[i], hash, PCP_SHA256_BYTE_LENGTH) == 0) {
      memcpy(set->items[i], set->items[--set->count], PCP_SHA256_BYTE_LENGTH);
      return;
    }
  }
}

program_t* pcp_fabric_program_find(pcp_fabric_endpoint_t* ep,
                                   const uint8_t* hash) {
  for (uint32_t i = 0; i < ep->program_count; ++i) {
    if (memcmp(ep->programs[i].hash, hash, PCP_SHA256_BYTE_LENGTH) == 0) {
      return &ep->programs[i];
    }
  }
  return NULL;
}

session_t* pcp_fabric_session_find(pcp_fabric_endpoint_t* ep, const char* id) {
  for (uint32_t i = 0; i < ep->session_count; ++i) {
    if (strcmp(ep->sessions[i].id, id) == 0)
      return &ep->sessions[i];
  }
  return NULL;
}

void pcp_fabric_session_bind(pcp_fabric_endpoint_t* ep, const char* id,
                             fabric_worker_t* worker) {
  session_t* s = pcp_fabric_session_find(ep, id);
  if (s) {
    s->worker = worker;
    return;
  }
  if (ep->session_count == PCP_FABRIC_MAX_SESSIONS) {
    // Bounded: the oldest binding goes (its next task is placed by its
    // constraint, and the worker reports missing resident tensors).
    pcp_allocator_free(ep->allocator, ep->sessions[0].id);
    memmove(&ep->sessions[0], &ep->sessions[1],
            (ep->session_count - 1) * sizeof(session_t));
    ep->session_count--;
  }
  if (ep->session_count == ep->session_capacity) {
    uint32_t capacity = ep->session_capacity ? ep->session_capacity * 2 : 16;
    void* p = ep->sessions;
    pcp_status_t status =
        pcp_allocator_realloc(ep->allocator, capacity * sizeof(session_t), &p);
    if (status) {
      // Without the binding the next task of the session is placed by its
      // constraint; the worker then reports the missing resident tensors.
      pcp_status_ignore(status);
      return;
    }
    ep->sessions = p;
    ep->session_capacity = capacity;
  }
  char* copy = NULL;
  pcp_status_t status = dup_string(ep->allocator, id, &copy);
  if (status) {
    pcp_status_ignore(status);
    return;
  }
  ep->sessions[ep->session_count++] = (session_t){.id = copy, .worker = worker};
}

void pcp_fabric_session_forget(pcp_fabric_endpoint_t* ep, uint32_t index) {
  pcp_allocator_free(ep->allocator, ep->sessions[index].id);
  ep->sessions[index] = ep->sessions[--ep->session_count];
}

void pcp_fabric_program_answer(fabric_conn_t* conn, const uint8_t* program,
                               pcp_status_t failure) {
  pcp_fabric_endpoint_t* ep = conn->endpoint;
  fabric_worker_t* w = conn->worker;
  if (!w) {
    pcp_status_ignore(failure);
    return;
  }
  pcp_fabric_hash_set_remove(&w->offered, program);
  if (!failure) {
    pcp_status_t status =
        pcp_fabric_hash_set_add(ep->allocator, &w->acked, program);
    if (status)
      failure = status;
  }
  // Each step moves one waiting task out of TASK_AWAIT_PROGRAM (assigned,
  // back to pending at the in-flight limit, or finished), and the walk
  // starts over from the head, so it never follows a |next| pointer that
  // the step may have unlinked.
  bool connected = pcp_fabric_worker_connected(w);
  for (;;) {
    pcp_fabric_task_t* t = ep->tasks_head;
    while (t && !(t->worker == w && t->state == TASK_AWAIT_PROGRAM &&
                  memcmp(t->program, program, PCP_SHA256_BYTE_LENGTH) == 0)) {
      t = t->next;
    }
    if (!t)
      break;
    if (failure) {
      pcp_fabric_task_finish(ep, t, pcp_status_clone(failure));
    } else if (connected) {
      pcp_fabric_task_assign(ep, t);
    } else {
      break;  // conn_ended puts them back to pending
    }
  }
  pcp_status_ignore(failure);
}

pcp_status_t pcp_fabric_program_register(
    pcp_fabric_endpoint_t* ep, const void* data, size_t byte_length,
    const char* backend, const char* target,
    uint8_t out_program[PCP_SHA256_BYTE_LENGTH]) {
  memset(out_program, 0, PCP_SHA256_BYTE_LENGTH);
  if (!data || byte_length == 0 || !backend || !backend[0] ||
      strlen(backend) >= sizeof(((program_t*)0)->backend) ||
      (target && strlen(target) > PCP_SCHED_TARGET_MAX_LENGTH)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "fabric program: empty bytes, or bad backend or "
                           "target");
  }
  if (byte_length > ep->options.limits.max_blob_bytes) {
    return pcp_make_status(
        PCP_STATUS_RESOURCE_EXHAUSTED,
        "fabric program of %zu bytes over the blob limit "
        "%llu",
        byte_length, (unsigned long long)ep->options.limits.max_blob_bytes);
  }
  pcp_sha256_t digest;
  pcp_sha256_compute(data, byte_length, &digest);
  memcpy(out_program, digest.bytes, PCP_SHA256_BYTE_LENGTH);
  pthread_mutex_lock(&ep->mu);
  if (pcp_fabric_program_find(ep, digest.bytes)) {
    pthread_mutex_unlock(&ep->mu);
    return pcp_ok_status();
  }
  pcp_status_t status = pcp_ok_status();
  if (ep->program_count == ep->program_capacity) {
    uint32_t capacity = ep->program_capacity ? ep->program_capacity * 2 : 8;
    void* p = ep->programs;
    status =
        pcp_allocator_realloc(ep->allocator, capacity * sizeof(program_t), &p);
    if (!status) {
      ep->programs = p;
      ep->program_capacity = capacity;
    }
  }
  void* raw = NULL;
  if (!status) {
    status = pcp_allocator_malloc(ep->allocator, byte_length + 64, &raw);
  }
  if (status) {
    pthread_mutex_unlock(&ep->mu);
    return status;
  }
  program_t* prog = &ep->programs[ep->program_count++];
  memset(prog, 0, sizeof(*prog));
  memcpy(prog->hash, digest.bytes, sizeof(prog->hash));
  prog->raw = raw;
  prog->data = (uint8_t*)raw + ((64 - ((uintptr_t)raw & 63)) & 63);
  memcpy(prog->data, data, byte_length);
  prog->byte_length = byte_length;
  copy_text(prog->backend, sizeof(prog->backend), backend);
  copy_text(prog->target, sizeof(prog->target), target);
  pthread_mutex_unlock(&ep->mu);
  return pcp_ok_status();
}
