// SPDX-License-Identifier: Apache-2.0
//
// pcp_loop_t: the libuv loop, the bounded post queue, timers and signal
// watchers.

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "net/net_impl.h"

//===----------------------------------------------------------------------===//
// Helpers shared by the module
//===----------------------------------------------------------------------===//

pcp_status_t pcp_net_calloc(pcp_loop_t* loop, size_t byte_length, void** out) {
  return pcp_allocator_calloc(loop->allocator, byte_length, out);
}

void pcp_net_free(pcp_loop_t* loop, void* ptr) {
  pcp_allocator_free(loop->allocator, ptr);
}

pcp_status_t pcp_net_status_from_uv(int uv_error, const char* what) {
  // On Unix libuv errors are negated errno values, except the getaddrinfo
  // family (UV_EAI_*), which has no errno.
  if (uv_error == UV_EAI_NONAME || uv_error == UV_EAI_NODATA ||
      uv_error == UV_EAI_FAIL || uv_error == UV_EAI_AGAIN) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "%s: %s", what,
                           uv_strerror(uv_error));
  }
  if (uv_error == UV_EAI_CANCELED) {
    return pcp_make_status(PCP_STATUS_CANCELLED, "%s: cancelled", what);
  }
  if (uv_error <= UV_EAI_ADDRFAMILY && uv_error >= UV_EAI_SOCKTYPE) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE, "%s: %s", what,
                           uv_strerror(uv_error));
  }
  return pcp_status_from_errno(-uv_error, "%s", what);
}

void pcp_net_read_buffer_alloc(uv_handle_t* handle, size_t suggested_size,
                               uv_buf_t* out_buffer) {
  PCP_UNUSED(suggested_size);
  pcp_loop_t* loop = (pcp_loop_t*)handle->loop;
  // libuv pairs each allocation with exactly one read callback before the
  // next allocation, so the buffer is never lent twice; the check guards
  // that assumption (libuv then reports UV_ENOBUFS instead of corrupting).
  if (loop->read_buffer_busy) {
    *out_buffer = uv_buf_init(NULL, 0);
    return;
  }
  loop->read_buffer_busy = true;
  *out_buffer = uv_buf_init((char*)loop->read_buffer,
                            (unsigned)PCP_TCP_READ_BUFFER_BYTES);
}

void pcp_net_read_buffer_release(pcp_loop_t* loop, const uv_buf_t* buffer) {
  if (buffer->base == (char*)loop->read_buffer) {
    loop->read_buffer_busy = false;
  }
}

//===----------------------------------------------------------------------===//
// Loop lifecycle
//===----------------------------------------------------------------------===//

static pthread_once_t sigpipe_once = PTHREAD_ONCE_INIT;

// A write to a socket the peer closed raises SIGPIPE, whose default action
// kills the process. libuv leaves that to the application; we turn it into
// the EPIPE status the write returns anyway, unless the program installed
// its own handler.
static void ignore_sigpipe(void) {
  struct sigaction current;
  if (sigaction(SIGPIPE, NULL, &current) != 0) {
    return;
  }
  if (current.sa_handler != SIG_DFL) {
    return;
  }
  struct sigaction ignore;
  memset(&ignore, 0, sizeof(ignore));
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  (void)sigaction(SIGPIPE, &ignore, NULL);
}

static void on_async(uv_async_t* async);

// The loop the calling thread is running (NULL outside pcp_loop_run). A
// thread-local rather than a pthread_t in the loop: other threads asking
// pcp_loop_is_loop_thread would race with the write of that field.
static _Thread_local pcp_loop_t* current_loop;

pcp_loop_options_t pcp_loop_options_default(void) {
  pcp_loop_options_t options = {
      .allocator = pcp_allocator_system(),
      .post_queue_capacity = PCP_LOOP_DEFAULT_POST_QUEUE_CAPACITY,
  };
  return options;
}

pcp_status_t pcp_loop_create(const pcp_loop_options_t* options,
                             pcp_loop_t** out_loop) {
  *out_loop = NULL;
  pthread_once(&sigpipe_once, ignore_sigpipe);
  size_t capacity = options->post_queue_capacity
                        ? options->post_queue_capacity
                        : PCP_LOOP_DEFAULT_POST_QUEUE_CAPACITY;
  if (capacity > ((size_t)1 << 24)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "post queue capacity %zu over 16M", capacity);
  }
  pcp_loop_t* loop = NULL;
  PCP_RETURN_IF_ERROR(
      pcp_allocator_calloc(options->allocator, sizeof(*loop), (void**)&loop),
      "allocating the loop");
  loop->allocator = options->allocator;
  loop->capacity = capacity;
  pcp_status_t status = pcp_net_calloc(loop, capacity * sizeof(post_entry_t),
                                       (void**)&loop->ring);
  if (!status) {
    status = pcp_net_calloc(loop, capacity * sizeof(post_entry_t),
                            (void**)&loop->batch);
  }
  if (!status) {
    status = pcp_allocator_malloc(loop->allocator, PCP_TCP_READ_BUFFER_BYTES,
                                  (void**)&loop->read_buffer);
  }
  if (status) {
    pcp_net_free(loop, loop->batch);
    pcp_net_free(loop, loop->ring);
    pcp_net_free(loop, loop);
    return pcp_status_annotate_f(status, "allocating the loop's queues");
  }
  int err = uv_loop_init(&loop->uv);
  if (err == 0) {
    err = uv_async_init(&loop->uv, &loop->async, on_async);
    if (err != 0) {
      (void)uv_loop_close(&loop->uv);
    }
  }
  if (err != 0) {
    pcp_net_free(loop, loop->read_buffer);
    pcp_net_free(loop, loop->batch);
    pcp_net_free(loop, loop->ring);
    pcp_net_free(loop, loop);
    return pcp_net_status_from_uv(err, "initializing the libuv loop");
  }
  loop->async.data = NULL;
  PCP_ASSERT(pthread_mutex_init(&loop->mutex, NULL) == 0);
  atomic_init(&loop->stop_requested, false);
  atomic_init(&loop->running, false);
  *out_loop = loop;
  return pcp_ok_status();
}

pcp_status_t pcp_loop_run(pcp_loop_t* loop) {
  bool expected = false;
  if (!atomic_compare_exchange_strong(&loop->running, &expected, true)) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "pcp_loop_run: the loop is already running");
  }
  pcp_loop_t* outer = current_loop;
  current_loop = loop;
  // A stop that arrived while nobody ran the loop still counts: one
  // non-blocking pass, then return.
  if (atomic_exchange(&loop->stop_requested, false)) {
    (void)uv_run(&loop->uv, UV_RUN_NOWAIT);
  } else {
    (void)uv_run(&loop->uv, UV_RUN_DEFAULT);
  }
  current_loop = outer;
  atomic_store(&loop->running, false);
  return pcp_ok_status();
}

void pcp_loop_stop(pcp_loop_t* loop) {
  atomic_store(&loop->stop_requested, true);
  // uv_async_send is the only libuv call that is safe from any thread.
  (void)uv_async_send(&loop->async);
}

bool pcp_loop_is_loop_thread(pcp_loop_t* loop) {
  return current_loop == loop;
}

uint64_t pcp_loop_now_ms(pcp_loop_t* loop) {
  return uv_now(&loop->uv);
}

pcp_allocator_t pcp_loop_allocator(pcp_loop_t* loop) {
  return loop->allocator;
}

static void abort_handle(uv_handle_t* handle, void* arg) {
  PCP_UNUSED(arg);
  if (uv_is_closing(handle)) {
    return;
  }
  pcp_net_object_t* object = (pcp_net_object_t*)handle->data;
  if (object) {
    object->abort(object);
  } else {
    uv_close(handle, NULL);
  }
}

// Takes every queued entry into |loop->batch|; returns how many.
static size_t take_posts(pcp_loop_t* loop) {
  PCP_ASSERT(pthread_mutex_lock(&loop->mutex) == 0);
  size_t count = loop->count;
  for (size_t i = 0; i < count; ++i) {
    loop->batch[i] = loop->ring[(loop->head + i) % loop->capacity];
  }
  loop->head = (loop->head + count) % loop->capacity;
  loop->count = 0;
  PCP_ASSERT(pthread_mutex_unlock(&loop->mutex) == 0);
  return count;
}

void pcp_loop_release(pcp_loop_t* loop) {
  if (!loop) {
    return;
  }
  PCP_ASSERT(!atomic_load(&loop->running));
  PCP_ASSERT(pthread_mutex_lock(&loop->mutex) == 0);
  loop->releasing = true;
  PCP_ASSERT(pthread_mutex_unlock(&loop->mutex) == 0);
  size_t count = take_posts(loop);
  for (size_t i = 0; i < count; ++i) {
    loop->batch[i].fn(loop->batch[i].user_data, PCP_STATUS_CANCELLED);
  }
  // Cancel every live handle, then let libuv deliver the close callbacks
  // (which run the CANCELLED completions). A callback may open something
  // new despite |releasing|; walking again until the loop is empty catches
  // it.
  for (int round = 0; round < 1000; ++round) {
    uv_walk(&loop->uv, abort_handle, NULL);
    if (uv_run(&loop->uv, UV_RUN_DEFAULT) == 0 &&
        uv_loop_alive(&loop->uv) == 0) {
      break;
    }
  }
  int err = uv_loop_close(&loop->uv);
  PCP_ASSERT(err == 0);
  PCP_ASSERT(pthread_mutex_destroy(&loop->mutex) == 0);
  pcp_net_free(loop, loop->read_buffer);
  pcp_net_free(loop, loop->batch);
  pcp_net_free(loop, loop->ring);
  pcp_net_free(loop, loop);
}

//===----------------------------------------------------------------------===//
// Post queue
//===----------------------------------------------------------------------===//

static void on_async(uv_async_t* async) {
  pcp_loop_t* loop = (pcp_loop_t*)async->loop;
  // Only what is queued now runs; posts made by these callbacks send a new
  // wake-up and run on the next iteration, after pending I/O.
  size_t count = take_posts(loop);
  for (size_t i = 0; i < count; ++i) {
    loop->batch[i].fn(loop->batch[i].user_data, PCP_STATUS_OK);
  }
  if (atomic_exchange(&loop->stop_requested, false)) {
    uv_stop(&loop->uv);
  }
}

pcp_status_t pcp_loop_post(pcp_loop_t* loop, pcp_loop_post_fn_t fn,
                           void* user_data) {
  if (!fn) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "pcp_loop_post: no callback");
  }
  PCP_ASSERT(pthread_mutex_lock(&loop->mutex) == 0);
  if (loop->releasing) {
    PCP_ASSERT(pthread_mutex_unlock(&loop->mutex) == 0);
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "pcp_loop_post: the loop is being released");
  }
  if (loop->count == loop->capacity) {
    size_t capacity = loop->capacity;
    PCP_ASSERT(pthread_mutex_unlock(&loop->mutex) == 0);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "pcp_loop_post: queue full (%zu entries)", capacity);
  }
  loop->ring[(loop->head + loop->count) % loop->capacity] =
      (post_entry_t){.fn = fn, .user_data = user_data};
  ++loop->count;
  // Sent under the lock so that release (which sets |releasing| under the
  // same lock) cannot close the async handle between our check and here.
  (void)uv_async_send(&loop->async);
  PCP_ASSERT(pthread_mutex_unlock(&loop->mutex) == 0);
  return pcp_ok_status();
}

size_t pcp_loop_post_queue_length(pcp_loop_t* loop) {
  PCP_ASSERT(pthread_mutex_lock(&loop->mutex) == 0);
  size_t count = loop->count;
  PCP_ASSERT(pthread_mutex_unlock(&loop->mutex) == 0);
  return count;
}

pcp_status_t pcp_net_check_not_releasing(pcp_loop_t* loop, const char* what) {
  if (loop->releasing) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "%s: the loop is being released", what);
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Timers
//===----------------------------------------------------------------------===//

typedef enum timer_state_e {
  TIMER_ARMED = 0,
  TIMER_EXPIRED = 1,     // one-shot fired: closing, no further callback
  TIMER_CANCELLING = 2,  // closing; the close callback reports CANCELLED
} timer_state_t;

struct pcp_loop_timer_t {
  pcp_net_object_t base;
  pcp_loop_t* loop;
  uv_timer_t uv;
  pcp_loop_timer_fn_t fn;
  void* user_data;
  bool repeating;
  timer_state_t state;
};

static void on_timer_closed(uv_handle_t* handle) {
  pcp_loop_timer_t* timer = (pcp_loop_timer_t*)handle->data;
  if (timer->state == TIMER_CANCELLING) {
    timer->fn(timer->user_data, timer, PCP_STATUS_CANCELLED);
  }
  pcp_net_free(timer->loop, timer);
}

static void on_timer(uv_timer_t* handle) {
  pcp_loop_timer_t* timer = (pcp_loop_timer_t*)handle->data;
  if (timer->state != TIMER_ARMED) {
    return;
  }
  if (!timer->repeating) {
    // Final: mark it before the callback so a cancel from inside it is a
    // no-op, and close after it so the pointer stays valid during it.
    timer->state = TIMER_EXPIRED;
    timer->fn(timer->user_data, timer, PCP_STATUS_OK);
    uv_close((uv_handle_t*)&timer->uv, on_timer_closed);
    return;
  }
  timer->fn(timer->user_data, timer, PCP_STATUS_OK);
}

void pcp_loop_timer_cancel(pcp_loop_timer_t* timer) {
  if (timer->state != TIMER_ARMED) {
    return;
  }
  timer->state = TIMER_CANCELLING;
  (void)uv_timer_stop(&timer->uv);
  // The CANCELLED call comes from the close callback: a later iteration,
  // never inside this call (libuv's rule, kept for ours).
  uv_close((uv_handle_t*)&timer->uv, on_timer_closed);
}

pcp_status_t pcp_loop_timer_restart(pcp_loop_timer_t* timer,
                                    uint64_t timeout_ms) {
  if (timer->state != TIMER_ARMED) {
    return pcp_make_status(
        PCP_STATUS_FAILED_PRECONDITION, "timer restart: the timer %s",
        timer->state == TIMER_EXPIRED ? "already expired" : "was cancelled");
  }
  // uv_timer_start on an active timer re-arms it. Timers count from the
  // loop's cached "now", which is stale after a long callback; refresh it so
  // the deadline is measured from this call, not from the last iteration.
  uv_update_time(timer->uv.loop);
  PCP_ASSERT(uv_timer_start(&timer->uv, on_timer, timeout_ms,
                            uv_timer_get_repeat(&timer->uv)) == 0);
  return pcp_ok_status();
}

static void abort_timer(pcp_net_object_t* object) {
  pcp_loop_timer_cancel((pcp_loop_timer_t*)object);
}

pcp_status_t pcp_loop_timer_start(pcp_loop_t* loop, uint64_t timeout_ms,
                                  uint64_t repeat_ms, pcp_loop_timer_fn_t fn,
                                  void* user_data,
                                  pcp_loop_timer_t** out_timer) {
  if (out_timer) {
    *out_timer = NULL;
  }
  if (!fn) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "pcp_loop_timer_start: no callback");
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_net_check_not_releasing(loop, "pcp_loop_timer_start"));
  pcp_loop_timer_t* timer = NULL;
  PCP_RETURN_IF_ERROR(pcp_net_calloc(loop, sizeof(*timer), (void**)&timer),
                      "allocating a timer");
  timer->base.abort = abort_timer;
  timer->loop = loop;
  timer->fn = fn;
  timer->user_data = user_data;
  timer->repeating = repeat_ms > 0;
  timer->state = TIMER_ARMED;
  PCP_ASSERT(uv_timer_init(&loop->uv, &timer->uv) == 0);
  timer->uv.data = timer;
  // uv_timer_start fails only for a closing handle or a NULL callback. The
  // cached loop time may be stale (a long callback, or set-up before the
  // loop runs): refresh it so the deadline counts from now.
  uv_update_time(&loop->uv);
  PCP_ASSERT(uv_timer_start(&timer->uv, on_timer, timeout_ms, repeat_ms) == 0);
  if (out_timer) {
    *out_timer = timer;
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Signals
//===----------------------------------------------------------------------===//

struct pcp_loop_signal_t {
  pcp_net_object_t base;
  pcp_loop_t* loop;
  uv_signal_t uv;
  pcp_loop_signal_fn_t fn;
  void* user_data;
};

static void on_signal_closed(uv_handle_t* handle) {
  pcp_loop_signal_t* watch = (pcp_loop_signal_t*)handle->data;
  pcp_net_free(watch->loop, watch);
}

static void on_signal(uv_signal_t* handle, int signum) {
  pcp_loop_signal_t* watch = (pcp_loop_signal_t*)handle->data;
  watch->fn(watch->user_data, signum);
}

void pcp_loop_signal_release(pcp_loop_signal_t* watch) {
  if (!watch || uv_is_closing((uv_handle_t*)&watch->uv)) {
    return;
  }
  (void)uv_signal_stop(&watch->uv);
  uv_close((uv_handle_t*)&watch->uv, on_signal_closed);
}

static void abort_signal(pcp_net_object_t* object) {
  pcp_loop_signal_release((pcp_loop_signal_t*)object);
}

pcp_status_t pcp_loop_signal_watch(pcp_loop_t* loop, int signum,
                                   pcp_loop_signal_fn_t fn, void* user_data,
                                   pcp_loop_signal_t** out_signal) {
  *out_signal = NULL;
  if (!fn) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "pcp_loop_signal_watch: no callback");
  }
  if (signum == SIGKILL || signum == SIGSTOP || signum <= 0 || signum >= 65) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "signal %d cannot be watched", signum);
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_net_check_not_releasing(loop, "pcp_loop_signal_watch"));
  pcp_loop_signal_t* watch = NULL;
  PCP_RETURN_IF_ERROR(pcp_net_calloc(loop, sizeof(*watch), (void**)&watch),
                      "allocating a signal watcher");
  watch->base.abort = abort_signal;
  watch->loop = loop;
  watch->fn = fn;
  watch->user_data = user_data;
  int err = uv_signal_init(&loop->uv, &watch->uv);
  if (err != 0) {
    pcp_net_free(loop, watch);
    return pcp_net_status_from_uv(err, "uv_signal_init");
  }
  watch->uv.data = watch;
  err = uv_signal_start(&watch->uv, on_signal, signum);
  if (err != 0) {
    uv_close((uv_handle_t*)&watch->uv, on_signal_closed);
    return pcp_net_status_from_uv(err, "watching a signal");
  }
  *out_signal = watch;
  return pcp_ok_status();
}
