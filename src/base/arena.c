// SPDX-License-Identifier: Apache-2.0
// Block pool + bump arenas (IREE arena, nginx pools): request-scoped memory is
// carved out of recycled blocks and returned in one reset.

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

#define ARENA_ALIGNMENT 16

struct pcp_arena_block_t {
  pcp_arena_block_t* next;
  size_t byte_length;  // usable bytes after the header
  // Data follows, ARENA_ALIGNMENT aligned.
};

struct pcp_arena_cleanup_t {
  pcp_arena_cleanup_t* next;
  pcp_arena_cleanup_fn_t fn;
  void* user_data;
};

struct pcp_arena_block_pool_t {
  pcp_allocator_t allocator;
  size_t block_byte_length;
  pthread_mutex_t mutex;
  pcp_arena_block_t* free_list;
  size_t free_count;
};

#define BLOCK_HEADER                                   \
  ((sizeof(pcp_arena_block_t) + ARENA_ALIGNMENT - 1) & \
   ~(size_t)(ARENA_ALIGNMENT - 1))

static uint8_t* block_data(pcp_arena_block_t* block) {
  return (uint8_t*)block + BLOCK_HEADER;
}

pcp_status_t pcp_arena_block_pool_create(size_t block_byte_length,
                                         pcp_allocator_t allocator,
                                         pcp_arena_block_pool_t** out_pool) {
  *out_pool = NULL;
  if (block_byte_length < 256)
    block_byte_length = 256;
  block_byte_length = (block_byte_length + ARENA_ALIGNMENT - 1) &
                      ~(size_t)(ARENA_ALIGNMENT - 1);
  pcp_arena_block_pool_t* pool = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(allocator, sizeof(*pool), (void**)&pool),
      "creating arena block pool");
  pool->allocator = allocator;
  pool->block_byte_length = block_byte_length;
  pthread_mutex_init(&pool->mutex, NULL);
  *out_pool = pool;
  return pcp_ok_status();
}

void pcp_arena_block_pool_release(pcp_arena_block_pool_t* pool) {
  if (!pool)
    return;
  pcp_arena_block_t* block = pool->free_list;
  while (block) {
    pcp_arena_block_t* next = block->next;
    pcp_allocator_free(pool->allocator, block);
    block = next;
  }
  pthread_mutex_destroy(&pool->mutex);
  pcp_allocator_free(pool->allocator, pool);
}

size_t pcp_arena_block_pool_free_count(pcp_arena_block_pool_t* pool) {
  pthread_mutex_lock(&pool->mutex);
  size_t count = pool->free_count;
  pthread_mutex_unlock(&pool->mutex);
  return count;
}

static pcp_status_t pool_acquire(pcp_arena_block_pool_t* pool,
                                 pcp_arena_block_t** out_block) {
  pthread_mutex_lock(&pool->mutex);
  pcp_arena_block_t* block = pool->free_list;
  if (block) {
    pool->free_list = block->next;
    pool->free_count--;
  }
  pthread_mutex_unlock(&pool->mutex);
  if (!block) {
    PCP_RETURN_IF_ERROR(
        pcp_allocator_malloc(pool->allocator,
                             BLOCK_HEADER + pool->block_byte_length,
                             (void**)&block),
        "growing arena block pool");
    block->byte_length = pool->block_byte_length;
  }
  block->next = NULL;
  *out_block = block;
  return pcp_ok_status();
}

static void pool_return(pcp_arena_block_pool_t* pool, pcp_arena_block_t* list) {
  if (!list)
    return;
  pcp_arena_block_t* tail = list;
  size_t count = 1;
  while (tail->next) {
    tail = tail->next;
    count++;
  }
  pthread_mutex_lock(&pool->mutex);
  tail->next = pool->free_list;
  pool->free_list = list;
  pool->free_count += count;
  pthread_mutex_unlock(&pool->mutex);
}

void pcp_arena_initialize(pcp_arena_block_pool_t* pool,
                          pcp_arena_t* out_arena) {
  memset(out_arena, 0, sizeof(*out_arena));
  out_arena->pool = pool;
}

void pcp_arena_reset(pcp_arena_t* arena) {
  // Cleanups first: they may reference arena memory.
  pcp_arena_cleanup_t* cleanup = arena->cleanups;
  while (cleanup) {
    pcp_arena_cleanup_t* next = cleanup->next;
    cleanup->fn(cleanup->user_data);
    cleanup = next;
  }
  arena->cleanups = NULL;
  pcp_arena_block_t* big = arena->oversized;
  while (big) {
    pcp_arena_block_t* next = big->next;
    pcp_allocator_free(arena->pool->allocator, big);
    big = next;
  }
  arena->oversized = NULL;
  pool_return(arena->pool, arena->blocks);
  arena->blocks = NULL;
  arena->block_offset = 0;
  arena->total_byte_length = 0;
}

void pcp_arena_deinitialize(pcp_arena_t* arena) {
  pcp_arena_reset(arena);
}

pcp_status_t pcp_arena_allocate(pcp_arena_t* arena, size_t byte_length,
                                void** out_ptr) {
  *out_ptr = NULL;
  size_t aligned =
      (byte_length + ARENA_ALIGNMENT - 1) & ~(size_t)(ARENA_ALIGNMENT - 1);
  if (aligned < byte_length) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "arena request overflow");
  }
  size_t block_size = arena->pool->block_byte_length;
  if (aligned > block_size / 2) {
    // Oversized: own allocation, freed at reset, so one big request does
    // not waste the tail of a pool block.
    pcp_arena_block_t* big = NULL;
    if (aligned > SIZE_MAX - BLOCK_HEADER) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "arena request overflow");
    }
    PCP_RETURN_IF_ERROR(
        pcp_allocator_malloc(arena->pool->allocator, BLOCK_HEADER + aligned,
                             (void**)&big),
        "arena oversized allocation");
    big->byte_length = aligned;
    big->next = arena->oversized;
    arena->oversized = big;
    arena->total_byte_length += aligned;
    *out_ptr = block_data(big);
    return pcp_ok_status();
  }
  if (!arena->blocks || arena->block_offset + aligned > block_size) {
    pcp_arena_block_t* block = NULL;
    PCP_RETURN_IF_ERROR_BARE(pool_acquire(arena->pool, &block));
    block->next = arena->blocks;
    arena->blocks = block;
    arena->block_offset = 0;
  }
  *out_ptr = block_data(arena->blocks) + arena->block_offset;
  arena->block_offset += aligned;
  arena->total_byte_length += aligned;
  return pcp_ok_status();
}

pcp_status_t pcp_arena_cleanup_add(pcp_arena_t* arena,
                                   pcp_arena_cleanup_fn_t fn, void* user_data) {
  pcp_arena_cleanup_t* cleanup = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_arena_allocate(arena, sizeof(*cleanup), (void**)&cleanup));
  cleanup->fn = fn;
  cleanup->user_data = user_data;
  cleanup->next = arena->cleanups;
  arena->cleanups = cleanup;
  return pcp_ok_status();
}

pcp_status_t pcp_arena_strdup(pcp_arena_t* arena, const char* value,
                              char** out_value) {
  size_t n = strlen(value);
  PCP_RETURN_IF_ERROR_BARE(pcp_arena_allocate(arena, n + 1, (void**)out_value));
  memcpy(*out_value, value, n + 1);
  return pcp_ok_status();
}
