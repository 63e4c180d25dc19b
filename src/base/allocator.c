// SPDX-License-Identifier: Apache-2.0
// System, null, counting and failing allocators behind one {self, ctl} shape.

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

static pcp_status_t system_ctl(void* self, pcp_allocator_command_t command,
                               const pcp_allocator_alloc_params_t* params,
                               void** inout_ptr) {
  (void)self;
  void* result = NULL;
  switch (command) {
    case PCP_ALLOCATOR_COMMAND_MALLOC:
      result = malloc(params->byte_length ? params->byte_length : 1);
      break;
    case PCP_ALLOCATOR_COMMAND_CALLOC:
      result = calloc(1, params->byte_length ? params->byte_length : 1);
      break;
    case PCP_ALLOCATOR_COMMAND_REALLOC:
      result =
          realloc(*inout_ptr, params->byte_length ? params->byte_length : 1);
      break;
    case PCP_ALLOCATOR_COMMAND_FREE:
      free(*inout_ptr);
      *inout_ptr = NULL;
      return pcp_ok_status();
  }
  if (!result) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory allocating %zu bytes",
                           params->byte_length);
  }
  *inout_ptr = result;
  return pcp_ok_status();
}

pcp_allocator_t pcp_allocator_system(void) {
  return (pcp_allocator_t){.self = NULL, .ctl = system_ctl};
}

pcp_allocator_t pcp_allocator_null(void) {
  return (pcp_allocator_t){.self = NULL, .ctl = NULL};
}

static pcp_status_t allocator_call(pcp_allocator_t allocator,
                                   pcp_allocator_command_t command,
                                   size_t byte_length, void** inout_ptr) {
  if (!allocator.ctl) {
    if (command == PCP_ALLOCATOR_COMMAND_FREE)
      return pcp_ok_status();
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "null allocator cannot allocate %zu bytes",
                           byte_length);
  }
  pcp_allocator_alloc_params_t params = {.byte_length = byte_length};
  return allocator.ctl(allocator.self, command, &params, inout_ptr);
}

pcp_status_t pcp_allocator_malloc(pcp_allocator_t allocator, size_t byte_length,
                                  void** out_ptr) {
  *out_ptr = NULL;
  return allocator_call(allocator, PCP_ALLOCATOR_COMMAND_MALLOC, byte_length,
                        out_ptr);
}

pcp_status_t pcp_allocator_calloc(pcp_allocator_t allocator, size_t byte_length,
                                  void** out_ptr) {
  *out_ptr = NULL;
  return allocator_call(allocator, PCP_ALLOCATOR_COMMAND_CALLOC, byte_length,
                        out_ptr);
}

pcp_status_t pcp_allocator_realloc(pcp_allocator_t allocator,
                                   size_t byte_length, void** inout_ptr) {
  void* ptr = *inout_ptr;
  pcp_status_t status = allocator_call(allocator, PCP_ALLOCATOR_COMMAND_REALLOC,
                                       byte_length, &ptr);
  if (status)
    return status;
  *inout_ptr = ptr;
  return status;
}

void pcp_allocator_free(pcp_allocator_t allocator, void* ptr) {
  if (!ptr)
    return;
  pcp_status_ignore(
      allocator_call(allocator, PCP_ALLOCATOR_COMMAND_FREE, 0, &ptr));
}

//===----------------------------------------------------------------------===//
// Counting allocator
//===----------------------------------------------------------------------===//

// Each block carries its size in a 16-byte header so that free and realloc
// can account without asking the base allocator.
#define COUNTING_HEADER 16

static void counting_add(pcp_allocator_counting_t* c, int64_t delta) {
  int64_t live = atomic_fetch_add(&c->live_bytes, delta) + delta;
  int64_t peak = atomic_load(&c->peak_bytes);
  while (live > peak &&
         !atomic_compare_exchange_weak(&c->peak_bytes, &peak, live)) {
  }
}

static pcp_status_t counting_ctl(void* self, pcp_allocator_command_t command,
                                 const pcp_allocator_alloc_params_t* params,
                                 void** inout_ptr) {
  pcp_allocator_counting_t* c = self;
  if (command == PCP_ALLOCATOR_COMMAND_FREE) {
    if (!*inout_ptr)
      return pcp_ok_status();
    uint8_t* block = (uint8_t*)*inout_ptr - COUNTING_HEADER;
    size_t size;
    memcpy(&size, block, sizeof(size));
    counting_add(c, -(int64_t)size);
    pcp_allocator_free(c->base, block);
    *inout_ptr = NULL;
    return pcp_ok_status();
  }
  if (params->byte_length > SIZE_MAX - COUNTING_HEADER) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "allocation too large");
  }
  size_t total = params->byte_length + COUNTING_HEADER;
  size_t old_size = 0;
  void* block = NULL;
  pcp_status_t status;
  if (command == PCP_ALLOCATOR_COMMAND_REALLOC && *inout_ptr) {
    block = (uint8_t*)*inout_ptr - COUNTING_HEADER;
    memcpy(&old_size, block, sizeof(old_size));
    status = pcp_allocator_realloc(c->base, total, &block);
  } else if (command == PCP_ALLOCATOR_COMMAND_CALLOC) {
    status = pcp_allocator_calloc(c->base, total, &block);
  } else {
    status = pcp_allocator_malloc(c->base, total, &block);
  }
  if (status)
    return status;
  memcpy(block, &params->byte_length, sizeof(size_t));
  counting_add(c, (int64_t)params->byte_length - (int64_t)old_size);
  if (!old_size)
    atomic_fetch_add(&c->allocation_count, 1);
  *inout_ptr = (uint8_t*)block + COUNTING_HEADER;
  return pcp_ok_status();
}

void pcp_allocator_counting_initialize(pcp_allocator_t base,
                                       pcp_allocator_counting_t* out_counter) {
  out_counter->base = base;
  atomic_init(&out_counter->live_bytes, 0);
  atomic_init(&out_counter->peak_bytes, 0);
  atomic_init(&out_counter->allocation_count, 0);
}

pcp_allocator_t pcp_allocator_counting(pcp_allocator_counting_t* counter) {
  return (pcp_allocator_t){.self = counter, .ctl = counting_ctl};
}

//===----------------------------------------------------------------------===//
// Failing allocator
//===----------------------------------------------------------------------===//

static pcp_status_t failing_ctl(void* self, pcp_allocator_command_t command,
                                const pcp_allocator_alloc_params_t* params,
                                void** inout_ptr) {
  pcp_allocator_failing_t* f = self;
  if (command != PCP_ALLOCATOR_COMMAND_FREE) {
    int64_t index = f->request_count++;
    bool fail = f->fail_at_index >= 0 &&
                (index == f->fail_at_index ||
                 (f->fail_forever && index > f->fail_at_index));
    if (fail) {
      f->failure_count++;
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "injected allocation failure #%lld (%zu bytes)",
                             (long long)index, params->byte_length);
    }
  }
  return f->base.ctl(f->base.self, command, params, inout_ptr);
}

void pcp_allocator_failing_initialize(pcp_allocator_t base,
                                      int64_t fail_at_index, bool fail_forever,
                                      pcp_allocator_failing_t* out_failing) {
  out_failing->base = base;
  out_failing->fail_at_index = fail_at_index;
  out_failing->fail_forever = fail_forever;
  out_failing->request_count = 0;
  out_failing->failure_count = 0;
}

pcp_allocator_t pcp_allocator_failing(pcp_allocator_failing_t* failing) {
  return (pcp_allocator_t){.self = failing, .ctl = failing_ctl};
}

pcp_status_t pcp_allocator_strdup(pcp_allocator_t allocator, const char* text,
                                  char** out_text) {
  *out_text = NULL;
  size_t length = strlen(text);
  void* copy = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_malloc(allocator, length + 1, &copy));
  memcpy(copy, text, length + 1);
  *out_text = copy;
  return pcp_ok_status();
}

void pcp_libc_free(void* ptr) {
  free(ptr);
}
