// SPDX-License-Identifier: Apache-2.0
// Resident tensors per session, with whole-session LRU eviction. Linear
// scans: a worker holds a handful of sessions with a handful of names each
// (parameters, optimizer moments, a KV cache), and the table maxima bound
// the worst case.

#include <stdlib.h>
#include <string.h>

#include "roles/worker/worker_impl.h"

void pcp_roles_worker_session_store_initialize(
    size_t limit_byte_length, pcp_roles_worker_value_release_fn_t release,
    pcp_allocator_t allocator, pcp_roles_worker_session_store_t* out_store) {
  memset(out_store, 0, sizeof(*out_store));
  out_store->limit_byte_length = limit_byte_length;
  out_store->release = release;
  out_store->allocator = allocator;
}

static char* copy_string(pcp_allocator_t allocator, const char* value) {
  size_t length = strlen(value) + 1;
  void* copy = NULL;
  pcp_status_t status = pcp_allocator_malloc(allocator, length, &copy);
  if (status) {
    pcp_status_ignore(status);
    return NULL;
  }
  memcpy(copy, value, length);
  return copy;
}

static void session_clear(pcp_roles_worker_session_store_t* store,
                          pcp_roles_worker_session_t* session) {
  for (size_t i = 0; i < session->entry_count; ++i) {
    store->release(session->entries[i].value);
    pcp_allocator_free(store->allocator, session->entries[i].name);
  }
  pcp_allocator_free(store->allocator, session->entries);
  pcp_allocator_free(store->allocator, session->id);
  store->byte_length -= session->byte_length;
  memset(session, 0, sizeof(*session));
}

void pcp_roles_worker_session_store_drop_all(
    pcp_roles_worker_session_store_t* store) {
  for (size_t i = 0; i < store->session_count; ++i) {
    session_clear(store, &store->sessions[i]);
  }
  store->session_count = 0;
}

void pcp_roles_worker_session_store_deinitialize(
    pcp_roles_worker_session_store_t* store) {
  pcp_roles_worker_session_store_drop_all(store);
  if (store->sessions) {
    pcp_allocator_free(store->allocator, store->sessions);
  }
  store->sessions = NULL;
  store->session_capacity = 0;
}

static pcp_roles_worker_session_t* find_session(
    pcp_roles_worker_session_store_t* store, const char* id) {
  for (size_t i = 0; i < store->session_count; ++i) {
    if (strcmp(store->sessions[i].id, id) == 0) {
      return &store->sessions[i];
    }
  }
  return NULL;
}

static pcp_status_t grow(pcp_allocator_t allocator, void** items,
                         size_t* capacity, size_t count, size_t item_size,
                         size_t maximum, const char* what) {
  if (count < *capacity) {
    return pcp_ok_status();
  }
  if (count >= maximum) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "more than %zu %s",
                           maximum, what);
  }
  size_t next = *capacity ? *capacity * 2 : 4;
  if (next > maximum) {
    next = maximum;
  }
  PCP_RETURN_IF_ERROR(pcp_allocator_realloc(allocator, next * item_size, items),
                      "%s table", what);
  *capacity = next;
  return pcp_ok_status();
}

pcp_status_t pcp_roles_worker_session_store_put(
    pcp_roles_worker_session_store_t* store, const char* session_id,
    const char* name, void* value, size_t byte_length) {
  if (!session_id || !session_id[0] || !name || !name[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "a resident tensor needs a session id and a name");
  }
  pcp_roles_worker_session_t* session = find_session(store, session_id);
  if (!session) {
    void* items = store->sessions;
    PCP_RETURN_IF_ERROR_BARE(
        grow(store->allocator, &items, &store->session_capacity,
             store->session_count, sizeof(pcp_roles_worker_session_t),
             PCP_ROLES_WORKER_MAX_SESSIONS, "sessions"));
    store->sessions = items;
    char* id = copy_string(store->allocator, session_id);
    if (!id) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "session id");
    }
    session = &store->sessions[store->session_count++];
    memset(session, 0, sizeof(*session));
    session->id = id;
  }
  session->last_used = ++store->tick;
  for (size_t i = 0; i < session->entry_count; ++i) {
    pcp_roles_worker_session_entry_t* entry = &session->entries[i];
    if (strcmp(entry->name, name) == 0) {
      store->release(entry->value);
      session->byte_length -= entry->byte_length;
      store->byte_length -= entry->byte_length;
      entry->value = value;
      entry->byte_length = byte_length;
      session->byte_length += byte_length;
      store->byte_length += byte_length;
      return pcp_ok_status();
    }
  }
  void* items = session->entries;
  PCP_RETURN_IF_ERROR_BARE(grow(
      store->allocator, &items, &session->entry_capacity, session->entry_count,
      sizeof(pcp_roles_worker_session_entry_t),
      PCP_ROLES_WORKER_MAX_SESSION_ENTRIES, "resident tensors in one session"));
  session->entries = items;
  char* copy = copy_string(store->allocator, name);
  if (!copy) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "tensor name");
  }
  session->entries[session->entry_count++] = (pcp_roles_worker_session_entry_t){
      .name = copy, .value = value, .byte_length = byte_length};
  session->byte_length += byte_length;
  store->byte_length += byte_length;
  return pcp_ok_status();
}

void* pcp_roles_worker_session_store_get(
    pcp_roles_worker_session_store_t* store, const char* session_id,
    const char* name) {
  if (!session_id || !name) {
    return NULL;
  }
  pcp_roles_worker_session_t* session = find_session(store, session_id);
  if (!session) {
    return NULL;
  }
  for (size_t i = 0; i < session->entry_count; ++i) {
    if (strcmp(session->entries[i].name, name) == 0) {
      session->last_used = ++store->tick;
      return session->entries[i].value;
    }
  }
  return NULL;
}

static void remove_at(pcp_roles_worker_session_store_t* store, size_t index) {
  session_clear(store, &store->sessions[index]);
  store->sessions[index] = store->sessions[--store->session_count];
}

bool pcp_roles_worker_session_store_drop(
    pcp_roles_worker_session_store_t* store, const char* session_id) {
  for (size_t i = 0; i < store->session_count; ++i) {
    if (strcmp(store->sessions[i].id, session_id) == 0) {
      remove_at(store, i);
      return true;
    }
  }
  return false;
}

pcp_status_t pcp_roles_worker_session_store_enforce_limit(
    pcp_roles_worker_session_store_t* store, const char* keep_id,
    size_t* out_evicted_count) {
  *out_evicted_count = 0;
  if (store->limit_byte_length == 0) {
    return pcp_ok_status();
  }
  while (store->byte_length > store->limit_byte_length) {
    size_t victim = SIZE_MAX;
    for (size_t i = 0; i < store->session_count; ++i) {
      if (keep_id && strcmp(store->sessions[i].id, keep_id) == 0) {
        continue;
      }
      if (victim == SIZE_MAX ||
          store->sessions[i].last_used < store->sessions[victim].last_used) {
        victim = i;
      }
    }
    if (victim == SIZE_MAX) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "session '%s' holds %zu resident bytes, over "
                             "the limit of %zu",
                             keep_id ? keep_id : "", store->byte_length,
                             store->limit_byte_length);
    }
    remove_at(store, victim);
    (*out_evicted_count)++;
  }
  return pcp_ok_status();
}
