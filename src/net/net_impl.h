// SPDX-License-Identifier: Apache-2.0
//
// Private to src/net: the loop structure shared by loop.c, process.c and
// tcp.c, and the object header that lets pcp_loop_release cancel every live
// handle without knowing its type.

#ifndef PCP_NET_NET_IMPL_H_
#define PCP_NET_NET_IMPL_H_

#include <pthread.h>
#include <stdatomic.h>

#include <uv.h>

#include "net/net.h"

// Every uv handle this module opens has |data| pointing at a pcp_net_object_t
// (the first member of its wrapper), or NULL for the loop's own handles.
// pcp_loop_release walks the libuv handles and calls |abort| on each owner
// that is not yet closing; |abort| must be idempotent (a wrapper with two
// handles is visited twice) and must lead to exactly one final callback with
// CANCELLED.
typedef struct pcp_net_object_t {
  void (*abort)(struct pcp_net_object_t* object);
} pcp_net_object_t;

typedef struct post_entry_t {
  pcp_loop_post_fn_t fn;
  void* user_data;
} post_entry_t;

struct pcp_loop_t {
  uv_loop_t uv;
  pcp_allocator_t allocator;

  // Post queue: a ring under |mutex|, drained in batches into |batch| so
  // that callbacks run without the lock held and posts made by callbacks
  // wait for the next wake-up (no starvation of I/O by a self-posting
  // callback).
  uv_async_t async;
  pthread_mutex_t mutex;
  post_entry_t* ring;
  post_entry_t* batch;
  size_t capacity;
  size_t head;
  size_t count;
  bool releasing;  // under |mutex|

  atomic_bool stop_requested;
  atomic_bool running;

  // Reads of every connection land here; read handlers consume the bytes
  // before returning, so one buffer serves all connections of the loop.
  uint8_t* read_buffer;
  bool read_buffer_busy;
};

// Allocation helpers through the loop's allocator.
PCP_MUST_USE_RESULT pcp_status_t pcp_net_calloc(pcp_loop_t* loop,
                                                size_t byte_length, void** out);
void pcp_net_free(pcp_loop_t* loop, void* ptr);

// A status from a (negative) libuv error code.
PCP_MUST_USE_RESULT pcp_status_t pcp_net_status_from_uv(int uv_error,
                                                        const char* what);

// FAILED_PRECONDITION once pcp_loop_release has begun (loop thread only).
PCP_MUST_USE_RESULT pcp_status_t pcp_net_check_not_releasing(pcp_loop_t* loop,
                                                             const char* what);

// libuv's write API takes char* for bytes it only reads. Through a union,
// not an integer cast, so no provenance is lost.
static inline char* pcp_net_drop_const(const void* data) {
  union {
    const void* in;
    char* out;
  } cast = {.in = data};
  return cast.out;
}

// uv_buf_t supplier for streams: hands out the loop's shared read buffer.
void pcp_net_read_buffer_alloc(uv_handle_t* handle, size_t suggested_size,
                               uv_buf_t* out_buffer);
// Gives the shared buffer back (from every read callback).
void pcp_net_read_buffer_release(pcp_loop_t* loop, const uv_buf_t* buffer);

#endif  // PCP_NET_NET_IMPL_H_
