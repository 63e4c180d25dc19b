// SPDX-License-Identifier: Apache-2.0
// GET /v1/events: a server-sent event stream of job events (from the store,
// with the store's event ids, so a client resumes with Last-Event-ID and
// misses nothing that was committed) and live worker events (not stored:
// they carry no id and are not replayed).
//
// One pump thread feeds every stream from the store. It sleeps until the
// store's event callback says a job event committed (or a stream opened,
// or the gateway stops), so an event reaches clients at once and an idle
// gateway does no work; it also wakes every second to release streams
// whose client left, and every 100 ms while a client's queue is full.
// Pulling from the store instead of pushing from each writer keeps one
// source of truth and one order (commit order), and a slow client never
// slows a writer: when its queue is full the pump simply retries later
// from the client's cursor.

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "roles/gateway/gateway_impl.h"

// A full client queue is retried this often; otherwise the pump waits for
// a wake-up, at most PUMP_IDLE_MS (closed streams are noticed then).
#define PUMP_RETRY_MS 100
#define PUMP_IDLE_MS 1000
#define PUMP_PAGE 200
#define HEARTBEAT_INTERVAL_NS INT64_C(10000000000)

pcp_status_t pcp_roles_gateway_events_stream(void* user_data,
                                             const pcp_http_request_t* request,
                                             pcp_http_response_t* response) {
  pcp_roles_gateway_state_t* g = user_data;
  const char* last = pcp_http_request_header(request, "Last-Event-ID");
  if (!last) {
    last = pcp_http_request_query(request, "after");
  }
  int64_t cursor = -1;
  if (last && last[0]) {
    char* end = NULL;
    errno = 0;
    long long v = strtoll(last, &end, 10);
    // ERANGE: strtoll clamps to LLONG_MAX, which would silently skip every
    // future event; a cursor past int64 is a client bug, said as such.
    if (!end || *end || v < 0 || errno == ERANGE) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "Last-Event-ID (or query 'after') must be an "
                             "event id in [0, 9223372036854775807]");
    }
    cursor = v;
  }
  if (cursor < 0) {
    // A new client starts at the present: history is at
    // /v1/jobs/{id}/events, or ask for it with Last-Event-ID: 0.
    PCP_RETURN_IF_ERROR_BARE(pcp_store_job_event_last_id(g->store, &cursor));
  }
  pthread_mutex_lock(&g->mu);
  bool full = g->client_count >= PCP_GATEWAY_MAX_EVENT_STREAMS;
  pthread_mutex_unlock(&g->mu);
  if (full) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "too many open event streams (%d)",
                           PCP_GATEWAY_MAX_EVENT_STREAMS);
  }
  pcp_http_sse_stream_t* stream = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_http_response_sse_start(response, 0, &stream));
  pcp_status_ignore(pcp_http_sse_stream_comment(stream, "pcp gateway events"));
  pthread_mutex_lock(&g->mu);
  if (g->client_count < PCP_GATEWAY_MAX_EVENT_STREAMS) {
    g->clients[g->client_count++] = (pcp_roles_gateway_event_client_t){
        .stream = stream,
        .cursor = cursor,
        .next_comment_ns = pcp_clock_now_ns(g->clock) + HEARTBEAT_INTERVAL_NS,
    };
    stream = NULL;
  }
  pthread_mutex_unlock(&g->mu);
  if (stream) {
    pcp_http_sse_stream_close(stream);
    pcp_http_sse_stream_release(stream);
  } else {
    pcp_roles_gateway_events_wake(g, 0);
  }
  return pcp_ok_status();
}

void pcp_roles_gateway_events_wake(void* user_data, int64_t event_id) {
  (void)event_id;
  pcp_roles_gateway_state_t* g = user_data;
  pthread_mutex_lock(&g->pump_mu);
  g->pump_seq++;
  pthread_cond_signal(&g->pump_cv);
  pthread_mutex_unlock(&g->pump_mu);
}

void pcp_roles_gateway_events_broadcast(pcp_roles_gateway_state_t* g,
                                        const char* event, const char* data) {
  pthread_mutex_lock(&g->mu);
  for (uint32_t i = 0; i < g->client_count; ++i) {
    pcp_status_ignore(
        pcp_http_sse_stream_send(g->clients[i].stream, NULL, event, data));
  }
  pthread_mutex_unlock(&g->mu);
}

// Sends what |client| has not seen yet. Called with g->mu held. True when
// its queue was full (or the store refused): the pump retries soon.
static bool client_feed(pcp_roles_gateway_state_t* g,
                        pcp_roles_gateway_event_client_t* client) {
  for (int page = 0; page < 8; ++page) {
    pcp_store_job_event_list_t list = {0};
    pcp_status_t status = pcp_store_job_event_list(g->store, client->cursor,
                                                   NULL, PUMP_PAGE, &list);
    if (status) {
      pcp_status_ignore(status);
      return true;
    }
    size_t count = list.count;
    bool blocked = false;
    for (size_t i = 0; i < count && !blocked; ++i) {
      const pcp_store_job_event_t* e = &list.items[i];
      json_t* data = json_pack(
          "{s:I, s:s, s:s, s:s?, s:s?, s:O, s:I}", "event_id",
          (json_int_t)e->event_id, "job_id", e->job_id, "type", e->type, "from",
          e->has_from_state ? pcp_store_job_state_name(e->from_state) : NULL,
          "to", e->has_states ? pcp_store_job_state_name(e->to_state) : NULL,
          "payload", e->payload, "created_at_ms",
          (json_int_t)(e->created_at_ns / 1000000));
      char* text = data ? json_dumps(data, JSON_COMPACT) : NULL;
      json_decref(data);
      char id[32];
      snprintf(id, sizeof(id), "%" PRId64, e->event_id);
      status = text ? pcp_http_sse_stream_send(client->stream, id, "job", text)
                    : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "oom");
      pcp_libc_free(text);  // json_dumps's buffer: libc memory
      if (status) {
        // Full queue or gone: resume from the cursor next time.
        pcp_status_ignore(status);
        blocked = true;
      } else {
        client->cursor = e->event_id;
      }
    }
    pcp_store_job_event_list_deinitialize(&list);
    if (blocked || count < PUMP_PAGE) {
      return blocked;
    }
  }
  return true;  // more pages than one round takes: go on soon
}

void* pcp_roles_gateway_events_pump_main(void* opaque) {
  pcp_roles_gateway_state_t* g = opaque;
  uint64_t seen = 0;
  while (!atomic_load(&g->stopping)) {
    // Wake-ups from here on are for events this round may not see.
    pthread_mutex_lock(&g->pump_mu);
    seen = g->pump_seq;
    pthread_mutex_unlock(&g->pump_mu);
    int64_t now = pcp_clock_now_ns(g->clock);
    bool retry = false;
    pthread_mutex_lock(&g->mu);
    uint32_t kept = 0;
    for (uint32_t i = 0; i < g->client_count; ++i) {
      pcp_roles_gateway_event_client_t* c = &g->clients[i];
      if (now >= c->next_comment_ns) {
        // Suspended streams learn that the client left only on a write.
        pcp_status_ignore(pcp_http_sse_stream_comment(c->stream, "ping"));
        c->next_comment_ns = now + HEARTBEAT_INTERVAL_NS;
      }
      if (!pcp_http_sse_stream_is_open(c->stream)) {
        pcp_http_sse_stream_release(c->stream);
        continue;
      }
      retry = client_feed(g, c) || retry;
      g->clients[kept++] = *c;
    }
    g->client_count = kept;
    pthread_mutex_unlock(&g->mu);
    pthread_mutex_lock(&g->pump_mu);
    if (g->pump_seq == seen && !atomic_load(&g->stopping)) {
      struct timespec until =
          pcp_realtime_deadline_ms(retry ? PUMP_RETRY_MS : PUMP_IDLE_MS);
      pthread_cond_timedwait(&g->pump_cv, &g->pump_mu, &until);
    }
    pthread_mutex_unlock(&g->pump_mu);
  }
  return NULL;
}
