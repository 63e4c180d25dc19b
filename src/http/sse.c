// SPDX-License-Identifier: Apache-2.0
//
// Server-sent events on suspended libmicrohttpd connections.
//
// A stream's response is produced by a content-reader callback. When the
// queue is empty the reader suspends the connection (so no thread polls an
// idle stream) and a later send resumes it; both happen under the stream's
// mutex, so a send can never slip between "queue is empty" and "suspend".
// libmicrohttpd forbids stopping a daemon with suspended connections, so the
// server keeps a list of live streams and ends them all before it stops.

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "http/http_impl.h"

struct pcp_http_sse_stream_t {
  _Atomic int32_t ref_count;
  // The response's (the server's): the stream, its queue and the events
  // formatted for it.
  pcp_allocator_t allocator;
  pthread_mutex_t mutex;
  // Set when the response is queued; NULL before.
  pcp_http_sse_registry_t* registry;
  struct MHD_Connection* connection;
  char* queue;  // |allocator|; pending bytes [read_offset, queue_length)
  size_t queue_length;
  size_t queue_capacity;
  size_t read_offset;
  size_t max_queued_bytes;
  bool suspended;  // the reader suspended the connection
  bool closed;     // no more events: end after the queue drains
  bool gone;       // the response is destroyed (client left or ended)
  // Registry list links, guarded by the registry's mutex.
  pcp_http_sse_stream_t* next;
  pcp_http_sse_stream_t* prev;
};

void pcp_http_sse_registry_initialize(pcp_http_sse_registry_t* out_registry) {
  memset(out_registry, 0, sizeof(*out_registry));
  pthread_mutex_init(&out_registry->mutex, NULL);
}

void pcp_http_sse_registry_deinitialize(pcp_http_sse_registry_t* registry) {
  pthread_mutex_destroy(&registry->mutex);
}

void pcp_http_sse_registry_close_all(pcp_http_sse_registry_t* registry) {
  pthread_mutex_lock(&registry->mutex);
  registry->closing = true;
  for (pcp_http_sse_stream_t* stream = registry->head; stream;
       stream = stream->next) {
    pthread_mutex_lock(&stream->mutex);
    stream->closed = true;
    if (stream->suspended && !stream->gone) {
      stream->suspended = false;
      MHD_resume_connection(stream->connection);
    }
    pthread_mutex_unlock(&stream->mutex);
  }
  pthread_mutex_unlock(&registry->mutex);
}

void pcp_http_sse_stream_retain(pcp_http_sse_stream_t* stream) {
  atomic_fetch_add(&stream->ref_count, 1);
}

void pcp_http_sse_stream_release(pcp_http_sse_stream_t* stream) {
  if (!stream || atomic_fetch_sub(&stream->ref_count, 1) != 1) {
    return;
  }
  pthread_mutex_destroy(&stream->mutex);
  pcp_allocator_t allocator = stream->allocator;
  pcp_allocator_free(allocator, stream->queue);
  pcp_allocator_free(allocator, stream);
}

pcp_status_t pcp_http_response_sse_start(pcp_http_response_t* response,
                                         size_t max_queued_bytes,
                                         pcp_http_sse_stream_t** out_stream) {
  *out_stream = NULL;
  pcp_http_sse_stream_t* stream = NULL;
  pcp_status_t status = pcp_allocator_calloc(response->allocator,
                                             sizeof(*stream), (void**)&stream);
  if (status) {
    pcp_status_ignore(status);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory starting an event stream");
  }
  stream->allocator = response->allocator;
  // One reference for the caller, one for the response.
  atomic_init(&stream->ref_count, 2);
  pthread_mutex_init(&stream->mutex, NULL);
  stream->max_queued_bytes = max_queued_bytes
                                 ? max_queued_bytes
                                 : PCP_HTTP_SSE_DEFAULT_MAX_QUEUED_BYTES;
  status =
      pcp_http_response_body_set(response, 200, "text/event-stream", NULL, 0);
  if (!status) {
    status =
        pcp_http_response_header_add(response, "Cache-Control", "no-cache");
  }
  if (status) {
    // Nobody else has seen the stream yet: free it outright.
    pthread_mutex_destroy(&stream->mutex);
    pcp_allocator_free(stream->allocator, stream);
    return status;
  }
  response->sse = stream;
  *out_stream = stream;
  return pcp_ok_status();
}

void pcp_http_sse_stream_abandon(pcp_http_sse_stream_t* stream) {
  // The response never reached libmicrohttpd: no reader will ever run.
  pthread_mutex_lock(&stream->mutex);
  stream->gone = true;
  pthread_mutex_unlock(&stream->mutex);
  pcp_http_sse_stream_release(stream);
}

static ssize_t sse_read(void* cls, uint64_t position, char* buffer,
                        size_t capacity) {
  PCP_UNUSED(position);
  pcp_http_sse_stream_t* stream = cls;
  pthread_mutex_lock(&stream->mutex);
  size_t pending = stream->queue_length - stream->read_offset;
  if (pending > 0) {
    size_t length = pending < capacity ? pending : capacity;
    memcpy(buffer, stream->queue + stream->read_offset, length);
    stream->read_offset += length;
    if (stream->read_offset == stream->queue_length) {
      stream->read_offset = stream->queue_length = 0;
    }
    pthread_mutex_unlock(&stream->mutex);
    return (ssize_t)length;
  }
  if (stream->closed) {
    pthread_mutex_unlock(&stream->mutex);
    return MHD_CONTENT_READER_END_OF_STREAM;
  }
  // Nothing to send: park the connection until a send or close resumes it.
  stream->suspended = true;
  MHD_suspend_connection(stream->connection);
  pthread_mutex_unlock(&stream->mutex);
  return 0;
}

static void sse_free(void* cls) {
  pcp_http_sse_stream_t* stream = cls;
  pthread_mutex_lock(&stream->mutex);
  stream->gone = true;
  stream->suspended = false;
  pthread_mutex_unlock(&stream->mutex);
  pcp_http_sse_registry_t* registry = stream->registry;
  if (registry) {
    pthread_mutex_lock(&registry->mutex);
    if (stream->prev) {
      stream->prev->next = stream->next;
    } else {
      registry->head = stream->next;
    }
    if (stream->next) {
      stream->next->prev = stream->prev;
    }
    pthread_mutex_unlock(&registry->mutex);
  }
  pcp_http_sse_stream_release(stream);  // the response's reference
}

struct MHD_Response* pcp_http_sse_response_create(
    pcp_http_sse_stream_t* stream, pcp_http_sse_registry_t* registry,
    struct MHD_Connection* connection) {
  pthread_mutex_lock(&stream->mutex);
  stream->connection = connection;
  stream->registry = registry;
  pthread_mutex_unlock(&stream->mutex);
  pthread_mutex_lock(&registry->mutex);
  if (registry->closing) {
    // The server is stopping: this stream ends as soon as it drains.
    pthread_mutex_lock(&stream->mutex);
    stream->closed = true;
    pthread_mutex_unlock(&stream->mutex);
  }
  stream->next = registry->head;
  if (registry->head) {
    registry->head->prev = stream;
  }
  registry->head = stream;
  pthread_mutex_unlock(&registry->mutex);
  // From here on sse_free owns the response's reference, even when
  // creation fails (libmicrohttpd does not call it then; we do).
  struct MHD_Response* response = MHD_create_response_from_callback(
      MHD_SIZE_UNKNOWN, (size_t)16 * 1024, sse_read, stream, sse_free);
  if (!response) {
    sse_free(stream);
  }
  return response;
}

// Appends |data| to the queue; the caller holds the mutex.
static pcp_status_t queue_append(pcp_http_sse_stream_t* stream,
                                 const char* data, size_t length) {
  size_t needed = stream->queue_length + length;
  if (needed > stream->queue_capacity) {
    size_t capacity = stream->queue_capacity ? stream->queue_capacity : 1024;
    while (capacity < needed) {
      capacity *= 2;
    }
    void* queue = stream->queue;
    pcp_status_t status =
        pcp_allocator_realloc(stream->allocator, capacity, &queue);
    if (status) {
      pcp_status_ignore(status);
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "out of memory queueing an event");
    }
    stream->queue = queue;
    stream->queue_capacity = capacity;
  }
  memcpy(stream->queue + stream->queue_length, data, length);
  stream->queue_length += length;
  return pcp_ok_status();
}

// Queues |text| (one whole event) and wakes the connection.
static pcp_status_t stream_push(pcp_http_sse_stream_t* stream, const char* text,
                                size_t length) {
  pthread_mutex_lock(&stream->mutex);
  pcp_status_t status = pcp_ok_status();
  if (stream->gone || stream->closed) {
    // A stream we closed reports "closed" even when the client has also
    // left since: which of the two the connection thread saw first is a
    // race, and the caller's own close is the reason it should read.
    status = pcp_make_status(PCP_STATUS_UNAVAILABLE, "event stream is %s",
                             stream->closed ? "closed" : "disconnected");
  } else if (length > stream->max_queued_bytes -
                          (stream->queue_length - stream->read_offset)) {
    // A client that does not read must not grow our memory: the caller
    // decides (drop the event, or close and let the client resume).
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "event stream queue is full (%zu bytes)",
                             stream->max_queued_bytes);
  } else {
    status = queue_append(stream, text, length);
  }
  if (!status && stream->suspended) {
    stream->suspended = false;
    MHD_resume_connection(stream->connection);
  }
  pthread_mutex_unlock(&stream->mutex);
  return status;
}

static bool has_newline(const char* value) {
  return value && strpbrk(value, "\r\n") != NULL;
}

pcp_status_t pcp_http_sse_stream_send(pcp_http_sse_stream_t* stream,
                                      const char* id, const char* event,
                                      const char* data) {
  if (has_newline(id) || has_newline(event)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "event id and type must be one line");
  }
  pcp_string_builder_t builder;
  pcp_string_builder_initialize(stream->allocator, 0, &builder);
  pcp_status_t status = pcp_ok_status();
  if (id) {
    status = pcp_string_builder_append_f(&builder, "id: %s\n", id);
  }
  if (!status && event) {
    status = pcp_string_builder_append_f(&builder, "event: %s\n", event);
  }
  // Each line of |data| becomes one "data:" line; a client joins them with
  // '\n' again. "\r\n" and "\r" count as line ends too, as the spec says.
  const char* cursor = data ? data : "";
  while (!status) {
    size_t length = strcspn(cursor, "\r\n");
    status = pcp_string_builder_append_cstring(&builder, "data: ");
    if (!status) {
      status = pcp_string_builder_append(&builder,
                                         pcp_make_string_view(cursor, length));
    }
    if (!status) {
      status = pcp_string_builder_append_cstring(&builder, "\n");
    }
    cursor += length;
    if (*cursor == '\0') {
      break;
    }
    cursor += (cursor[0] == '\r' && cursor[1] == '\n') ? 2 : 1;
  }
  if (!status) {
    status = pcp_string_builder_append_cstring(&builder, "\n");
  }
  if (!status) {
    status = stream_push(stream, builder.data, builder.size);
  }
  pcp_string_builder_deinitialize(&builder);
  return status;
}

pcp_status_t pcp_http_sse_stream_comment(pcp_http_sse_stream_t* stream,
                                         const char* text) {
  if (has_newline(text)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "an event stream comment must be one line");
  }
  char line[256];
  int length = snprintf(line, sizeof(line), ": %s\n\n", text ? text : "");
  if (length < 0 || (size_t)length >= sizeof(line)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "event stream comment longer than %zu bytes",
                           sizeof(line) - 4);
  }
  return stream_push(stream, line, (size_t)length);
}

void pcp_http_sse_stream_close(pcp_http_sse_stream_t* stream) {
  pthread_mutex_lock(&stream->mutex);
  stream->closed = true;
  if (stream->suspended && !stream->gone) {
    stream->suspended = false;
    MHD_resume_connection(stream->connection);
  }
  pthread_mutex_unlock(&stream->mutex);
}

bool pcp_http_sse_stream_is_open(pcp_http_sse_stream_t* stream) {
  pthread_mutex_lock(&stream->mutex);
  bool open = !stream->gone && !stream->closed;
  pthread_mutex_unlock(&stream->mutex);
  return open;
}
