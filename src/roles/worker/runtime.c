// SPDX-License-Identifier: Apache-2.0
//
// The worker runtime (STYLE.md s.3.6): the main thread runs a pcp_loop that
// owns the fabric connection and drives proto's worker state machine; one
// compute thread owns the pcp_backend_t and runs jobs from a bounded queue
// (program lookups and stores, tasks, session drops), posting each finished
// job back through the loop's post queue. Only the loop thread touches the
// state machine and the socket; only the compute thread touches the backend,
// the loaded programs and the session store.
//
// A job's life: allocated on the loop thread from an action, pushed to the
// queue, run on the compute thread, posted back, finished on the loop thread
// and freed there (for a task with results: once the result frame, which
// borrows the job's host buffers, has been written).

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compile/compile.h"
#include "compute/compute.h"
#include "models/models.h"
#include "net/net.h"
#include "proto/proto.h"
#include "roles/worker/worker_impl.h"

// The state machine asks for a tick every H/4. A fixed 25 ms tick satisfies
// that for every H >= 100 ms without needing H from the machine; below that
// heartbeats go out up to 25 ms late, far inside the 3H silence deadline.
#define TICK_MS 25
// A tick later than this after the previous one means the loop did not run
// (SIGSTOP, a suspended VM): skip it, so that the bytes that arrived in the
// meantime are read before the silence deadline is judged.
#define TICK_STALL_NS ((int64_t)4 * TICK_MS * 1000000)
// Loaded programs kept by the compute thread (least recently used unloaded
// beyond it; the files stay cached on disk).
#define MAX_LOADED_PROGRAMS 32

typedef struct worker_t worker_t;

//===----------------------------------------------------------------------===//
// Jobs
//===----------------------------------------------------------------------===//

typedef enum job_kind_e {
  JOB_LOOKUP = 1,
  JOB_STORE = 2,
  JOB_TASK = 3,
  JOB_DROP_SESSIONS = 4,
} job_kind_t;

typedef struct job_t {
  job_kind_t kind;
  worker_t* worker;
  // The worker's allocator, kept here so a job can be freed after the loop
  // that owned it is gone. The job and its result arrays come from it.
  pcp_allocator_t allocator;
  // Loop thread: the job itself plus each unwritten frame that borrows its
  // buffers (a result and, for large outputs, the blob chunks before it).
  int ref_count;
  struct job_t* next;  // loop thread: the in-flight task list
  uint64_t request_id;
  uint64_t task_id;
  // TASK: the gateway session it came from (worker_t.task_generation when
  // it arrived). Task ids restart at 1 with each gateway process, so an
  // answer is only sent while the session it belongs to is current.
  uint64_t generation;
  uint8_t program[PCP_SHA256_BYTE_LENGTH];
  uint8_t* blob;  // STORE: owned (pcp_proto_blob_free)
  uint64_t blob_length;
  pcp_allocator_t blob_allocator;
  pcp_proto_frame_t frame;  // TASK: the TASK_ASSIGN
  // TASK: only its tensor blobs (inputs that came as chunked blobs).
  pcp_proto_action_t blobs;
  atomic_bool cancelled;
  // Written by the compute thread before it posts the job back.
  pcp_status_t status;
  bool found;
  uint64_t elapsed_us;
  pcp_host_tensor_t* outputs;
  pcp_proto_tensor_ref_t* refs;
  uint32_t output_count;
  pcp_proto_section_t* sections;
  size_t section_count;
  char (*section_names)[32];
  // TASK_ASSIGN "hash_inputs": the digest sent as the last output.
  uint8_t inputs_sha256[PCP_SHA256_BYTE_LENGTH];
  // TASK_ASSIGN "hash_outputs": the digest sent after it.
  uint8_t outputs_sha256[PCP_SHA256_BYTE_LENGTH];
} job_t;

static void job_free(job_t* job) {
  if (!job) {
    return;
  }
  if (job->blob) {
    pcp_proto_blob_free(job->blob_allocator, job->blob);
  }
  pcp_proto_frame_deinitialize(&job->frame);
  pcp_proto_action_deinitialize(&job->blobs);
  pcp_status_ignore(job->status);
  for (uint32_t i = 0; job->outputs && i < job->output_count; ++i) {
    pcp_host_tensor_deinitialize(&job->outputs[i]);
  }
  pcp_allocator_t allocator = job->allocator;
  pcp_allocator_free(allocator, job->outputs);
  pcp_allocator_free(allocator, job->refs);
  pcp_allocator_free(allocator, job->sections);
  pcp_allocator_free(allocator, job->section_names);
  pcp_allocator_free(allocator, job);
}

// Drops one reference; the last one frees the job. Loop thread (or the
// releasing thread once the loop is gone).
static void job_unref(job_t* job) {
  if (job && --job->ref_count <= 0) {
    job_free(job);
  }
}

//===----------------------------------------------------------------------===//
// Connections and writes
//===----------------------------------------------------------------------===//

typedef struct conn_state_t conn_state_t;

// One frame on its way to the socket. Its segments are written in batches
// of PCP_TCP_MAX_WRITE_BUFFERS; it is freed (with the job whose buffers its
// sections borrow) when the last batch's callback has run.
typedef struct pending_write_t {
  struct pending_write_t* next;
  conn_state_t* conn;
  pcp_proto_encoded_frame_t frame;
  job_t* owner;
  size_t next_segment;
  size_t outstanding;
  pcp_allocator_t allocator;  // the worker's; this write came from it
} pending_write_t;

struct conn_state_t {
  worker_t* worker;
  pcp_tcp_conn_t* tcp;
  pending_write_t* head;  // not yet fully handed to the socket
  pending_write_t* tail;
  bool closing;  // CLOSE seen: shut down once the queue is flushed
  bool shutdown_sent;
};

struct worker_t {
  // Every allocation of the runtime's own: the worker, connections, jobs,
  // pending writes, task inputs and results.
  pcp_allocator_t allocator;
  const pcp_roles_worker_config_t* config;
  pcp_log_context_t log;
  pcp_loop_t* loop;
  pcp_clock_t clock;
  pcp_rng_t rng;
  pcp_net_address_t address;
  char address_text[PCP_NET_ADDRESS_TEXT_CAPACITY];
  pcp_proto_worker_t* proto;
  uint8_t* token;
  size_t token_length;

  // Loop thread.
  conn_state_t* current;  // the connection the state machine believes in
  pcp_loop_timer_t* tick;
  int64_t last_tick_ns;
  job_t* in_flight;  // tasks handed to the compute thread
  // Bumped when the gateway did not resume our lease (a new gateway
  // process): tasks still running from before belong to a dead session.
  uint64_t task_generation;
  job_t* pending_owner;  // attached to each SEND of a task's answer
  pcp_loop_signal_t* sigterm;
  pcp_loop_signal_t* sigint;
  int64_t drain_deadline_ns;
  int open_conns;  // started and not yet closed (current or closing)
  uint32_t attempt;
  bool connecting;
  bool draining;
  bool finishing;  // no reconnects, waiting for compute and sockets
  bool compute_exited;
  bool stopped;

  // Shared.
  pcp_roles_worker_job_queue_t queue;
  pthread_t compute_thread;
  pthread_mutex_t startup_mutex;
  pthread_cond_t startup_cond;
  pcp_status_t startup_status;
  atomic_bool abandon;  // compute thread: skip queued jobs
  bool compute_started;
  bool startup_done;

  // Compute thread (after start-up).
  pcp_roles_worker_program_cache_t cache;
  pcp_backend_t* backend;
  pcp_backend_info_t backend_info;
  struct {
    uint8_t hash[PCP_SHA256_BYTE_LENGTH];
    pcp_program_t* program;
    uint64_t last_used;
  } programs[MAX_LOADED_PROGRAMS];
  size_t program_count;
  uint64_t program_tick;
  pcp_roles_worker_session_store_t sessions;
  // Tasks run that asked for "hash_inputs", and the debug hook
  // PCP_WORKER_TEST_CORRUPT_PARAM=<n>[,<n>...] (read at start; at most 8
  // numbers; unset: off): the n-th such task flips one bit of its last
  // hashed input before hashing and running (a resident one: of the copy it
  // hashes), so tests can prove the
  // gateway catches a worker whose copy of the global parameters differs
  // (docs/training.md).
  uint64_t hashed_tasks;
  uint64_t test_corrupt[8];
  uint32_t test_corrupt_count;
  // PCP_WORKER_TEST_OMIT_HASH=<n> (0/unset: off): the n-th hashed task
  // answers without its "inputs_sha256" section, as a build that ignores
  // hash_inputs would, so tests can prove the gateway survives it.
  uint64_t test_omit_hash;
  // PCP_WORKER_TEST_CORRUPT_OUTPUT=<n> (0/unset: off): the n-th task that
  // asks for "hash_outputs" flips bit 0 of its first hashed output's first
  // byte in the copy it hashes, as a worker whose arithmetic differs would
  // (the kept tensor unchanged).
  uint64_t output_hashed_tasks;
  uint64_t test_corrupt_output;
  // PCP_WORKER_TEST_INIT_SKEW=1 (0/unset: off): every tensor this worker
  // fills from a seeded-init ref gets bit 0 of its first byte flipped, as a
  // worker whose libm draws other bits would; tests prove the gateway then
  // re-sends that @init with values (docs/training.md).
  bool test_init_skew;
  // PCP_WORKER_TEST_INIT_SKEW=fail: every seeded-init input fails its task
  // (UNIMPLEMENTED, as a worker built before the ref kind would refuse
  // it); tests prove the gateway then sends the values, the learner kept.
  bool test_init_fail;

  // Series updated from both threads (lock-free).
  pcp_roles_worker_metrics_t metrics;
};

static int64_t now_ns(worker_t* w) {
  return pcp_clock_now_ns(w->clock);
}

// `msg` with the worker's id and |pairs| at |level|. Per-task lines go at
// debug (a serving worker runs one task per decode step); the rest at info.
static void log_event_at(worker_t* w, pcp_log_level_t level, const char* msg,
                         const char* const* pairs, size_t pair_count) {
  const char* all[32];
  size_t n = 0;
  all[n++] = "worker_id";
  all[n++] = w->config->worker_id;
  for (size_t i = 0; i < pair_count * 2 && n + 2 <= PCP_ARRAYSIZE(all); ++i) {
    all[n++] = pairs[i];
  }
  pcp_roles_log_event_at(level, "worker", msg, all, n / 2);
}

static void log_event(worker_t* w, const char* msg, const char* const* pairs,
                      size_t pair_count) {
  log_event_at(w, PCP_LOG_INFO, msg, pairs, pair_count);
}

static void log_status(worker_t* w, pcp_log_level_t level, pcp_status_t status,
                       const char* what) {
  pcp_log_status(level, &w->log, status, what);
}

static void pump(worker_t* w);
static void maybe_stop(worker_t* w);
static void finish(worker_t* w);

static void pending_write_free(pending_write_t* pw) {
  pcp_proto_encoded_frame_deinitialize(&pw->frame);
  job_unref(pw->owner);
  pcp_allocator_free(pw->allocator, pw);
}

static void close_conn(conn_state_t* cs) {
  if (!cs->tcp) {
    return;
  }
  pcp_tcp_conn_close(cs->tcp);
}

static void on_shutdown_done(void* user_data, pcp_tcp_conn_t* conn,
                             pcp_status_t status) {
  (void)user_data;
  pcp_status_ignore(status);
  pcp_tcp_conn_close(conn);
}

static void on_write_done(void* user_data, pcp_tcp_conn_t* conn,
                          pcp_status_t status);

// Hands queued frames to the socket in order until the send queue refuses
// (the writable callback resumes) or the queue is empty.
static void flush(conn_state_t* cs) {
  while (cs->head) {
    pending_write_t* pw = cs->head;
    while (pw->next_segment < pw->frame.segment_count) {
      pcp_tcp_buffer_t buffers[PCP_TCP_MAX_WRITE_BUFFERS];
      size_t n = 0;
      while (n < PCP_TCP_MAX_WRITE_BUFFERS &&
             pw->next_segment + n < pw->frame.segment_count) {
        const pcp_proto_iovec_t* seg =
            &pw->frame.segments[pw->next_segment + n];
        buffers[n].data = seg->data;
        buffers[n].byte_length = seg->byte_length;
        n++;
      }
      pcp_status_t status =
          pcp_tcp_conn_write(cs->tcp, buffers, n, on_write_done, pw);
      if (status) {
        bool full = pcp_status_code(status) == PCP_STATUS_RESOURCE_EXHAUSTED;
        if (!full) {
          log_status(cs->worker, PCP_LOG_WARN, status, "fabric write");
        }
        pcp_status_ignore(status);
        if (full) {
          return;  // resumed by on_writable
        }
        close_conn(cs);
        return;
      }
      double sent = 0;
      for (size_t i = 0; i < n; ++i) {
        sent += (double)buffers[i].byte_length;
      }
      pcp_roles_worker_metrics_add(cs->worker->metrics.sent_bytes, sent);
      pw->next_segment += n;
      pw->outstanding++;
    }
    cs->head = pw->next;
    if (!cs->head) {
      cs->tail = NULL;
    }
    pw->next = NULL;
  }
  if (cs->closing && !cs->shutdown_sent) {
    cs->shutdown_sent = true;
    pcp_status_t status =
        pcp_tcp_conn_shutdown(cs->tcp, on_shutdown_done, NULL);
    if (status) {
      pcp_status_ignore(status);
      close_conn(cs);
    }
  }
}

static void on_write_done(void* user_data, pcp_tcp_conn_t* conn,
                          pcp_status_t status) {
  (void)conn;
  pending_write_t* pw = user_data;
  pcp_status_ignore(status);
  pw->outstanding--;
  if (pw->outstanding == 0 && pw->next_segment == pw->frame.segment_count) {
    pending_write_free(pw);
  }
}

static void on_writable(void* user_data, pcp_tcp_conn_t* conn) {
  (void)conn;
  flush(user_data);
}

static void on_read(void* user_data, pcp_tcp_conn_t* conn, const void* data,
                    size_t byte_length) {
  conn_state_t* cs = user_data;
  worker_t* w = cs->worker;
  if (byte_length == 0) {
    // The peer finished sending: nothing more can arrive, so the session is
    // over; the close handler tells the state machine.
    pcp_tcp_conn_close(conn);
    return;
  }
  pcp_roles_worker_metrics_add(w->metrics.received_bytes, (double)byte_length);
  if (cs != w->current) {
    return;  // a connection we are closing: its bytes are stale
  }
  pcp_status_t status =
      pcp_proto_worker_on_bytes(w->proto, data, byte_length, now_ns(w));
  if (status) {
    log_status(w, PCP_LOG_ERROR, status, "fabric receive");
    pcp_status_ignore(status);
    pcp_tcp_conn_close(conn);
  }
  pump(w);
}

static void on_conn_closed(void* user_data, pcp_tcp_conn_t* conn,
                           pcp_status_t status) {
  (void)conn;
  conn_state_t* cs = user_data;
  worker_t* w = cs->worker;
  // Frames never handed to the socket die with it (their jobs with them).
  // A partly written one too: its CANCELLED write callbacks ran before
  // this handler, and nothing else will free it.
  while (cs->head) {
    pending_write_t* pw = cs->head;
    cs->head = pw->next;
    pending_write_free(pw);
  }
  cs->tail = NULL;
  w->open_conns--;
  bool was_current = cs == w->current;
  if (was_current) {
    w->current = NULL;
    char text[512] = "peer closed";
    if (status) {
      pcp_status_format(status, text, sizeof(text));
    }
    const char* pairs[] = {"address", w->address_text, "reason", text};
    log_event(w, "disconnected", pairs, 2);
  }
  pcp_status_ignore(status);
  pcp_allocator_free(w->allocator, cs);
  if (was_current && !w->finishing) {
    pcp_status_t s = pcp_proto_worker_on_closed(w->proto, now_ns(w));
    if (s) {
      log_status(w, PCP_LOG_ERROR, s, "fabric close");
      pcp_status_ignore(s);
    }
    pump(w);
  }
  maybe_stop(w);
}

static void on_connected(void* user_data, pcp_tcp_conn_t* conn,
                         pcp_status_t status) {
  worker_t* w = user_data;
  w->connecting = false;
  char attempt[16];
  snprintf(attempt, sizeof(attempt), "%u", w->attempt);
  if (status) {
    char text[512];
    pcp_status_format(status, text, sizeof(text));
    pcp_status_ignore(status);
    if (w->finishing) {
      maybe_stop(w);
      return;
    }
    pcp_status_t s = pcp_proto_worker_on_closed(w->proto, now_ns(w));
    pcp_status_ignore(s);
    char retry[32];
    int64_t wait_ms =
        (pcp_proto_worker_reconnect_at_ns(w->proto) - now_ns(w)) / 1000000;
    snprintf(retry, sizeof(retry), "%lld",
             (long long)(wait_ms > 0 ? wait_ms : 0));
    const char* pairs[] = {"attempt", attempt, "address",     w->address_text,
                           "error",   text,    "retry_in_ms", retry};
    log_event(w, "connect failed", pairs, 4);
    pump(w);
    return;
  }
  conn_state_t* cs = NULL;
  pcp_status_t alloc_status = pcp_ok_status();
  if (!w->finishing) {
    alloc_status = pcp_allocator_calloc(w->allocator, sizeof(*cs), (void**)&cs);
  }
  if (alloc_status || w->finishing) {
    pcp_status_ignore(alloc_status);
    pcp_tcp_conn_close(conn);  // never started: no close handler
    if (!w->finishing) {
      pcp_status_ignore(pcp_proto_worker_on_closed(w->proto, now_ns(w)));
      pump(w);
    }
    maybe_stop(w);
    return;
  }
  cs->worker = w;
  cs->tcp = conn;
  pcp_tcp_conn_handlers_t handlers = {.read = on_read,
                                      .writable = on_writable,
                                      .close = on_conn_closed,
                                      .user_data = cs};
  pcp_status_t s = pcp_tcp_conn_start(conn, &handlers);
  if (s) {
    log_status(w, PCP_LOG_ERROR, s, "fabric connection start");
    pcp_status_ignore(s);
    pcp_allocator_free(w->allocator, cs);
    pcp_tcp_conn_close(conn);
    pcp_status_ignore(pcp_proto_worker_on_closed(w->proto, now_ns(w)));
    pump(w);
    return;
  }
  w->open_conns++;
  w->current = cs;
  const char* pairs[] = {"attempt", attempt, "address", w->address_text};
  log_event(w, "connected", pairs, 2);
  s = pcp_proto_worker_on_connected(w->proto, now_ns(w));
  if (s) {
    log_status(w, PCP_LOG_ERROR, s, "fabric hello");
    pcp_status_ignore(s);
    pcp_tcp_conn_close(conn);
  }
  pump(w);
}

static void start_connect(worker_t* w) {
  w->attempt++;
  char attempt[16];
  snprintf(attempt, sizeof(attempt), "%u", w->attempt);
  const char* pairs[] = {"attempt", attempt, "address", w->address_text};
  log_event(w, "connecting", pairs, 2);
  // The handshake deadline of the state machine bounds the whole attempt;
  // the connect timeout only stops a SYN into a black hole from waiting for
  // the kernel's minutes.
  pcp_status_t status =
      pcp_tcp_connect(w->loop, &w->address, 5000, on_connected, w);
  if (status) {
    log_status(w, PCP_LOG_WARN, status, "connect");
    pcp_status_ignore(status);
    pcp_status_ignore(pcp_proto_worker_on_closed(w->proto, now_ns(w)));
    return;  // the caller's pump handles the backoff actions
  }
  w->connecting = true;
}

//===----------------------------------------------------------------------===//
// Actions of the state machine
//===----------------------------------------------------------------------===//

static void in_flight_remove(worker_t* w, job_t* job) {
  for (job_t** p = &w->in_flight; *p; p = &(*p)->next) {
    if (*p == job) {
      *p = job->next;
      job->next = NULL;
      return;
    }
  }
}

static job_t* job_create(worker_t* w, job_kind_t kind) {
  job_t* job = NULL;
  pcp_status_t status =
      pcp_allocator_calloc(w->allocator, sizeof(*job), (void**)&job);
  if (status) {
    pcp_status_ignore(status);  // callers answer a NULL job as out of memory
    return NULL;
  }
  job->ref_count = 1;
  job->kind = kind;
  job->worker = w;
  job->allocator = w->allocator;
  atomic_init(&job->cancelled, false);
  return job;
}

// Queues |job| for the compute thread; on failure the job is freed and the
// status returned.
static pcp_status_t submit(worker_t* w, job_t* job) {
  pcp_status_t status = pcp_roles_worker_job_queue_push(&w->queue, job);
  if (status) {
    job_free(job);
    return status;
  }
  if (job->kind == JOB_TASK) {
    job->next = w->in_flight;
    w->in_flight = job;
  }
  return pcp_ok_status();
}

static void handle_send(worker_t* w, pcp_proto_action_t* action) {
  // Every frame of a task's answer borrows the job's output buffers, so
  // each holds a reference until it is written.
  job_t* owner = w->pending_owner;
  pending_write_t* pw = NULL;
  pcp_status_t status = pcp_ok_status();
  if (w->current) {
    status = pcp_allocator_calloc(w->allocator, sizeof(*pw), (void**)&pw);
  }
  if (status || !w->current) {
    pcp_status_ignore(status);
    pcp_proto_encoded_frame_deinitialize(&action->frame);
    return;
  }
  pw->allocator = w->allocator;
  if (owner) {
    owner->ref_count++;
  }
  pw->frame = action->frame;
  memset(&action->frame, 0, sizeof(action->frame));
  pw->owner = owner;
  pw->conn = w->current;
  if (pw->frame.segment_count == 0) {
    pending_write_free(pw);
    return;
  }
  conn_state_t* cs = w->current;
  if (cs->tail) {
    cs->tail->next = pw;
  } else {
    cs->head = pw;
  }
  cs->tail = pw;
  flush(cs);
}

static void handle_close(worker_t* w, pcp_proto_action_t* action) {
  conn_state_t* cs = w->current;
  if (action->status) {
    char text[512];
    pcp_status_format(action->status, text, sizeof(text));
    const char* pairs[] = {"address", w->address_text, "reason", text};
    log_event(w, "closing connection", pairs, 2);
  }
  if (!cs) {
    return;
  }
  // From here the state machine has moved on (backoff); this socket only
  // flushes what was queued (an ERROR frame, say) and goes.
  w->current = NULL;
  cs->closing = true;
  flush(cs);
}

static void handle_action(worker_t* w, pcp_proto_action_t* a) {
  pcp_status_t status = pcp_ok_status();
  switch (a->type) {
    case PCP_PROTO_ACTION_SEND:
      handle_send(w, a);
      return;
    case PCP_PROTO_ACTION_CLOSE:
      handle_close(w, a);
      return;
    case PCP_PROTO_ACTION_CONNECT:
      if (!w->finishing) {
        start_connect(w);
      }
      return;
    case PCP_PROTO_ACTION_ACCEPTED: {
      char epoch[32];
      snprintf(epoch, sizeof(epoch), "%llu",
               (unsigned long long)a->lease_epoch);
      const char* pairs[] = {"address",     w->address_text,
                             "lease_epoch", epoch,
                             "resumed",     a->resumed ? "true" : "false"};
      log_event(w, "joined", pairs, 3);
      w->attempt = 0;
      return;
    }
    case PCP_PROTO_ACTION_REJECTED: {
      char text[512];
      pcp_status_format(a->status, text, sizeof(text));
      char reason[16];
      snprintf(reason, sizeof(reason), "%u", a->reject_reason);
      const char* pairs[] = {
          "reason",  pcp_proto_reject_reason_name(a->reject_reason),
          "code",    reason,
          "message", text};
      log_event(w, "join rejected", pairs, 3);
      return;
    }
    case PCP_PROTO_ACTION_PROGRAM_LOOKUP: {
      job_t* job = job_create(w, JOB_LOOKUP);
      if (!job) {
        status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "job");
      } else {
        job->request_id = a->request_id;
        memcpy(job->program, a->program, sizeof(job->program));
        status = submit(w, job);
      }
      if (status) {
        // Answer "not cached": the fetch that follows will fail the same
        // way, and the gateway sees the error there.
        log_status(w, PCP_LOG_WARN, status, "program lookup");
        pcp_status_ignore(status);
        status = pcp_proto_worker_program_lookup_done(w->proto, a->request_id,
                                                      false, now_ns(w));
      }
      break;
    }
    case PCP_PROTO_ACTION_PROGRAM_STORE: {
      job_t* job = job_create(w, JOB_STORE);
      if (!job) {
        status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "job");
      } else {
        job->request_id = a->request_id;
        memcpy(job->program, a->program, sizeof(job->program));
        job->blob = a->blob;
        job->blob_length = a->blob_length;
        job->blob_allocator = a->allocator;
        a->blob = NULL;
        status = submit(w, job);
      }
      if (status) {
        status = pcp_proto_worker_program_stored(w->proto, a->request_id,
                                                 status, now_ns(w));
      }
      break;
    }
    case PCP_PROTO_ACTION_RUN_TASK: {
      job_t* job = job_create(w, JOB_TASK);
      if (!job) {
        status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "job");
      } else {
        job->request_id = a->request_id;
        job->task_id = a->task_id;
        job->generation = w->task_generation;
        pcp_proto_frame_move(&a->received, &job->frame);
        job->blobs.allocator = a->allocator;
        job->blobs.tensor_blobs = a->tensor_blobs;
        job->blobs.tensor_blob_count = a->tensor_blob_count;
        a->tensor_blobs = NULL;
        a->tensor_blob_count = 0;
        status = submit(w, job);
      }
      if (status) {
        pcp_status_t failed =
            pcp_proto_worker_task_fail(w->proto, a->task_id, status, now_ns(w));
        pcp_status_ignore(status);
        status = failed;
      }
      break;
    }
    case PCP_PROTO_ACTION_CANCEL_TASK:
      for (job_t* job = w->in_flight; job; job = job->next) {
        if (job->task_id == a->task_id &&
            job->generation == w->task_generation) {
          atomic_store(&job->cancelled, true);
        }
      }
      return;
    case PCP_PROTO_ACTION_DROP_SESSIONS: {
      // A new gateway session: what still runs from the old one is
      // cancelled, and its answers are dropped (its ids may be reused).
      ++w->task_generation;
      for (job_t* old = w->in_flight; old; old = old->next) {
        atomic_store(&old->cancelled, true);
      }
      job_t* job = job_create(w, JOB_DROP_SESSIONS);
      status = job ? submit(w, job)
                   : pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "job");
      break;
    }
    case PCP_PROTO_ACTION_DRAIN:
      log_event(w, "gateway asked to drain", NULL, 0);
      return;
    case PCP_PROTO_ACTION_SHUTDOWN: {
      char text[512] = "";
      if (a->status) {
        pcp_status_format(a->status, text, sizeof(text));
      }
      const char* pairs[] = {"reason", text};
      log_event(w, "shutdown by gateway", pairs, 1);
      atomic_store(&w->abandon, true);
      finish(w);
      return;
    }
    default:
      return;
  }
  if (status) {
    log_status(w, PCP_LOG_WARN, status, "fabric action");
    pcp_status_ignore(status);
  }
}

static void pump(worker_t* w) {
  pcp_proto_action_t action;
  while (pcp_proto_worker_next_action(w->proto, &action)) {
    handle_action(w, &action);
    pcp_proto_action_deinitialize(&action);
  }
  if (w->draining && !w->finishing && !w->in_flight) {
    log_event(w, "drained", NULL, 0);
    finish(w);
  }
}

//===----------------------------------------------------------------------===//
// Completions posted by the compute thread
//===----------------------------------------------------------------------===//

typedef struct progress_t {
  worker_t* worker;
  uint64_t task_id;
} progress_t;

static void on_progress(void* user_data, pcp_status_code_t code) {
  progress_t* p = user_data;
  worker_t* w = p->worker;
  if (code == PCP_STATUS_OK && !w->finishing) {
    pcp_proto_task_progress_t progress = {.task_id = p->task_id,
                                          .state = PCP_PROTO_TASK_RUNNING};
    // NOT_FOUND when the task was cancelled by a reconnect: nothing to say.
    pcp_status_ignore(
        pcp_proto_worker_task_progress(w->proto, &progress, now_ns(w)));
    pump(w);
  }
  pcp_allocator_free(w->allocator, p);
}

static void on_job_done(void* user_data, pcp_status_code_t code) {
  job_t* job = user_data;
  worker_t* w = job->worker;
  if (code != PCP_STATUS_OK) {
    job_free(job);  // the loop is being released
    return;
  }
  int64_t now = now_ns(w);
  pcp_status_t status = pcp_ok_status();
  switch (job->kind) {
    case JOB_LOOKUP:
      if (job->status) {
        log_status(w, PCP_LOG_WARN, job->status, "program lookup");
      }
      if (!job->status) {
        pcp_roles_worker_metrics_add(
            job->found ? w->metrics.cache_hits : w->metrics.cache_misses, 1);
      }
      status = pcp_proto_worker_program_lookup_done(w->proto, job->request_id,
                                                    job->found, now);
      if (!status) {
        char hex[PCP_SHA256_HEX_LENGTH + 1];
        pcp_proto_hex_encode(job->program, sizeof(job->program), hex);
        const char* pairs[] = {"program", hex, "cached",
                               job->found ? "true" : "false"};
        log_event(w, job->found ? "program cached" : "program fetch", pairs, 2);
      }
      break;
    case JOB_STORE: {
      char hex[PCP_SHA256_HEX_LENGTH + 1];
      pcp_proto_hex_encode(job->program, sizeof(job->program), hex);
      const char* pairs[] = {"program", hex};
      log_event(w, job->status ? "program store failed" : "program stored",
                pairs, 1);
      status = pcp_proto_worker_program_stored(w->proto, job->request_id,
                                               job->status, now);
      job->status = NULL;  // consumed
      break;
    }
    case JOB_TASK: {
      in_flight_remove(w, job);
      if (job->generation != w->task_generation) {
        // From a gateway session that is gone: its task id may name a task
        // of the new session, which must not get this answer.
        char task[32];
        snprintf(task, sizeof(task), "%llu", (unsigned long long)job->task_id);
        const char* pairs[] = {"task_id", task};
        log_event_at(w, PCP_LOG_DEBUG,
                     "answer of a previous gateway session dropped", pairs, 1);
        break;
      }
      pcp_roles_worker_metrics_add(
          job->status ? w->metrics.tasks_failed : w->metrics.tasks_succeeded,
          1);
      char task[32];
      snprintf(task, sizeof(task), "%llu", (unsigned long long)job->task_id);
      if (job->status) {
        char text[512];
        pcp_status_format(job->status, text, sizeof(text));
        const char* pairs[] = {"task_id", task, "error", text};
        log_event(w, "task failed", pairs, 2);
        status = pcp_proto_worker_task_fail(w->proto, job->task_id, job->status,
                                            now);
      } else {
        char elapsed[32];
        snprintf(elapsed, sizeof(elapsed), "%llu",
                 (unsigned long long)job->elapsed_us);
        const char* pairs[] = {"task_id", task, "elapsed_us", elapsed};
        log_event_at(w, PCP_LOG_DEBUG, "task done", pairs, 2);
        pcp_proto_task_result_t result = {.task_id = job->task_id,
                                          .outputs = job->refs,
                                          .output_count = job->output_count,
                                          .elapsed_us = job->elapsed_us};
        w->pending_owner = job;
        status = pcp_proto_worker_task_complete(
            w->proto, &result, job->sections, job->section_count, now);
        pump(w);
        w->pending_owner = NULL;
        pcp_status_code_t result_code = pcp_status_code(status);
        if (status && result_code != PCP_STATUS_NOT_FOUND &&
            result_code != PCP_STATUS_FAILED_PRECONDITION) {
          // The result could not be encoded (a limit): the gateway still
          // gets an answer for the task.
          log_status(w, PCP_LOG_WARN, status, "task result");
          pcp_status_t failed =
              pcp_proto_worker_task_fail(w->proto, job->task_id, status, now);
          pcp_status_ignore(status);
          status = failed;
        }
      }
      break;
    }
    case JOB_DROP_SESSIONS:
      log_event(w, "sessions dropped (lease not resumed)", NULL, 0);
      break;
  }
  if (status) {
    // Mostly NOT_FOUND / FAILED_PRECONDITION: the connection this answer
    // belonged to is gone, and the gateway has reassigned the work.
    log_status(w, PCP_LOG_DEBUG, status, "stale completion dropped");
    pcp_status_ignore(status);
  }
  job_unref(job);  // frames still being written hold their own references
  pump(w);
  maybe_stop(w);
}

static void on_compute_exited(void* user_data, pcp_status_code_t code) {
  (void)code;
  worker_t* w = user_data;
  w->compute_exited = true;
  maybe_stop(w);
}

// Compute thread: hands |fn(user_data)| to the loop, waiting while the post
// queue is full (backpressure on the compute thread, never a lost answer).
static void post_to_loop(worker_t* w, pcp_loop_post_fn_t fn, void* user_data) {
  for (;;) {
    pcp_status_t status = pcp_loop_post(w->loop, fn, user_data);
    if (!status) {
      return;
    }
    pcp_status_code_t code = pcp_status_consume_code(status);
    if (code != PCP_STATUS_RESOURCE_EXHAUSTED) {
      fn(user_data, PCP_STATUS_CANCELLED);  // loop going away: just free
      return;
    }
    pcp_sleep_ms(1);
  }
}

//===----------------------------------------------------------------------===//
// Compute thread
//===----------------------------------------------------------------------===//

static void release_tensor(void* value) {
  pcp_tensor_release(value);
}

static bool job_cancelled(job_t* job) {
  return atomic_load(&job->cancelled) || atomic_load(&job->worker->abandon);
}

static pcp_status_t cancelled_status(job_t* job) {
  return pcp_make_status(PCP_STATUS_CANCELLED,
                         "task %llu cancelled before it ran to completion",
                         (unsigned long long)job->task_id);
}

static pcp_status_t get_program(worker_t* w, const uint8_t hash[32],
                                pcp_program_t** out_program) {
  *out_program = NULL;
  for (size_t i = 0; i < w->program_count; ++i) {
    if (memcmp(w->programs[i].hash, hash, PCP_SHA256_BYTE_LENGTH) == 0) {
      w->programs[i].last_used = ++w->program_tick;
      *out_program = w->programs[i].program;
      return pcp_ok_status();
    }
  }
  void* data = NULL;
  size_t length = 0;
  pcp_status_t status =
      pcp_roles_worker_program_cache_load(&w->cache, hash, &data, &length);
  if (status) {
    return pcp_status_annotate_f(status,
                                 "the task's program was never acknowledged "
                                 "by this worker (offer it first)");
  }
  pcp_program_t* program = NULL;
  status = pcp_program_load(w->backend, data, length, &program);
  pcp_allocator_free(pcp_allocator_system(), data);  // the cache read it
  PCP_RETURN_IF_ERROR(status, "loading the task's program");
  size_t slot = w->program_count;
  if (slot == MAX_LOADED_PROGRAMS) {
    slot = 0;
    for (size_t i = 1; i < w->program_count; ++i) {
      if (w->programs[i].last_used < w->programs[slot].last_used) {
        slot = i;
      }
    }
    pcp_program_release(w->programs[slot].program);
  } else {
    w->program_count++;
  }
  memcpy(w->programs[slot].hash, hash, PCP_SHA256_BYTE_LENGTH);
  w->programs[slot].program = program;
  w->programs[slot].last_used = ++w->program_tick;
  *out_program = program;
  return pcp_ok_status();
}

// A seeded initial parameter (tensor ref "init"): filled here by the
// models' own initializer, into storage the host tensor owns (run_task
// deinitializes every input's host tensor after the call). The decoder
// bounded its size; it is checked again since the ref is the one thing
// that makes the worker allocate what the gateway did not send.
static pcp_status_t init_input_value(worker_t* w,
                                     const pcp_proto_tensor_ref_t* ref,
                                     pcp_host_tensor_t* host,
                                     pcp_value_t* out) {
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_init_ref_validate(ref));
  if (w->test_init_fail) {
    return pcp_make_status(PCP_STATUS_UNIMPLEMENTED,
                           "test hook: seeded-init inputs refused");
  }
  pcp_tensor_shape_t shape = {.element_type = ref->element_type,
                              .rank = (int32_t)ref->rank};
  int64_t count = 1;
  for (uint32_t d = 0; d < ref->rank; ++d) {
    shape.dims[d] = ref->shape[d];
    count *= ref->shape[d];
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_host_tensor_allocate_with_allocator(&shape, w->allocator, host));
  pcp_models_parameter_fill((pcp_models_init_t)ref->init, ref->seed, ref->index,
                            ref->element_type, count, host->data);
  if (w->test_init_skew && host->byte_length > 0) {
    ((uint8_t*)host->data)[0] ^= 1u;
    log_event_at(w, PCP_LOG_WARN,
                 "test hook: flipped one bit of a seeded-init input", NULL, 0);
  }
  *out = pcp_value_host(host);
  return pcp_ok_status();
}

static pcp_status_t input_value(worker_t* w, job_t* job,
                                const pcp_proto_task_assign_t* assign,
                                const pcp_proto_tensor_ref_t* ref,
                                pcp_host_tensor_t* host, pcp_value_t* out) {
  switch (ref->kind) {
    case PCP_PROTO_TENSOR_REF_SECTION: {
      // The parser has checked the index against the frame's sections.
      const pcp_proto_section_t* s = &job->frame.sections[ref->section];
      pcp_tensor_shape_t shape = {.element_type = s->element_type,
                                  .rank = (int32_t)s->rank};
      for (uint32_t d = 0; d < s->rank; ++d) {
        shape.dims[d] = s->shape[d];
      }
      // Zero copy: the host tensor wraps the frame's aligned payload.
      PCP_RETURN_IF_ERROR_BARE(pcp_host_tensor_wrap(
          &shape, (void*)s->data, (size_t)s->byte_length, host));
      *out = pcp_value_host(host);
      return pcp_ok_status();
    }
    case PCP_PROTO_TENSOR_REF_RESIDENT: {
      pcp_tensor_t* t = pcp_roles_worker_session_store_get(
          &w->sessions, assign->session_id, ref->name);
      if (!t) {
        return pcp_make_status(PCP_STATUS_NOT_FOUND,
                               "no resident tensor '%s' in session '%s'",
                               ref->name, assign->session_id);
      }
      *out = pcp_value_resident(t);
      return pcp_ok_status();
    }
    case PCP_PROTO_TENSOR_REF_BLOB: {
      // The state machine checked the blob's length against this dtype
      // and shape when it attached it to the task.
      const pcp_proto_tensor_blob_t* blob =
          pcp_proto_action_tensor_blob(&job->blobs, ref->name);
      if (!blob) {
        return pcp_make_status(PCP_STATUS_NOT_FOUND,
                               "tensor blob '%s' did not arrive with the "
                               "task",
                               ref->name);
      }
      pcp_tensor_shape_t shape = {.element_type = ref->element_type,
                                  .rank = (int32_t)ref->rank};
      for (uint32_t d = 0; d < ref->rank; ++d) {
        shape.dims[d] = ref->shape[d];
      }
      PCP_RETURN_IF_ERROR_BARE(pcp_host_tensor_wrap(
          &shape, blob->data, (size_t)blob->byte_length, host));
      *out = pcp_value_host(host);
      return pcp_ok_status();
    }
    case PCP_PROTO_TENSOR_REF_INIT:
      return init_input_value(w, ref, host, out);
  }
  return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                         "unknown tensor reference kind %d", (int)ref->kind);
}

// SHA-256 over the raw bytes of outputs 0..hash_outputs-1 in order, each
// read back from the device (kept outputs included: what the session
// holds is what the gateway checks).
static pcp_status_t outputs_hash(worker_t* w, pcp_tensor_t* const* results,
                                 size_t result_count, uint32_t hash_outputs,
                                 uint8_t out[PCP_SHA256_BYTE_LENGTH]) {
  if (hash_outputs > result_count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "hash_outputs %u of %zu outputs", hash_outputs,
                           result_count);
  }
  ++w->output_hashed_tasks;
  bool corrupt = w->test_corrupt_output != 0 &&
                 w->test_corrupt_output == w->output_hashed_tasks;
  pcp_sha256_stream_t* stream = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_sha256_stream_create(&stream));
  pcp_status_t status = pcp_ok_status();
  for (uint32_t k = 0; k < hash_outputs && !status; ++k) {
    pcp_host_tensor_t copy;
    memset(&copy, 0, sizeof(copy));
    status = pcp_tensor_download_host(results[k], &copy);
    if (!status && corrupt && k == 0 && copy.byte_length > 0) {
      ((uint8_t*)copy.data)[0] ^= 1u;
    }
    if (!status) {
      pcp_sha256_stream_update(stream, copy.data, copy.byte_length);
    }
    pcp_host_tensor_deinitialize(&copy);
  }
  pcp_sha256_t digest;
  pcp_sha256_stream_finish(stream, &digest);
  memcpy(out, digest.bytes, PCP_SHA256_BYTE_LENGTH);
  if (corrupt) {
    log_event_at(w, PCP_LOG_WARN,
                 "test hook: flipped one bit of a hashed output", NULL, 0);
  }
  return status;
}

// SHA-256 over the raw bytes of inputs 0..hash_inputs-1 in order (a
// resident one is downloaded for it). The test hook flips bit 0 of the
// last hashed input's first byte in the worker's own copy (the task then
// runs on it) when this is the n-th hashed task and that input came with
// the task (a resident one is left alone).
static pcp_status_t inputs_hash(worker_t* w,
                                const pcp_proto_task_assign_t* assign,
                                pcp_host_tensor_t* hosts, pcp_value_t* values,
                                uint8_t out[PCP_SHA256_BYTE_LENGTH]) {
  if (assign->hash_inputs > assign->input_count) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "hash_inputs %u of %u inputs", assign->hash_inputs,
                           assign->input_count);
  }
  ++w->hashed_tasks;
  bool corrupt = false;
  for (uint32_t c = 0; c < w->test_corrupt_count; ++c) {
    corrupt = corrupt || w->test_corrupt[c] == w->hashed_tasks;
  }
  pcp_sha256_stream_t* stream = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_sha256_stream_create(&stream));
  pcp_status_t status = pcp_ok_status();
  for (uint32_t i = 0; i < assign->hash_inputs && !status; ++i) {
    if (assign->inputs[i].kind == PCP_PROTO_TENSOR_REF_RESIDENT) {
      pcp_host_tensor_t copy;
      memset(&copy, 0, sizeof(copy));
      status = pcp_tensor_download_host(values[i].resident, &copy);
      if (!status && corrupt && i + 1 == assign->hash_inputs &&
          copy.byte_length > 0) {
        // A resident input: the bit flips in the hashed copy only (the
        // session's tensor stays), which is what the gateway can see.
        ((uint8_t*)copy.data)[0] ^= 1u;
      }
      if (!status) {
        pcp_sha256_stream_update(stream, copy.data, copy.byte_length);
      }
      pcp_host_tensor_deinitialize(&copy);
      continue;
    }
    if (corrupt && i + 1 == assign->hash_inputs && hosts[i].byte_length > 0) {
      ((uint8_t*)hosts[i].data)[0] ^= 1u;
    }
    pcp_sha256_stream_update(stream, hosts[i].data, hosts[i].byte_length);
  }
  pcp_sha256_t digest;
  pcp_sha256_stream_finish(stream, &digest);
  memcpy(out, digest.bytes, PCP_SHA256_BYTE_LENGTH);
  if (corrupt) {
    log_event_at(w, PCP_LOG_WARN,
                 "test hook: flipped one bit of a hashed input", NULL, 0);
  }
  return status;
}

static pcp_status_t run_task(worker_t* w, job_t* job) {
  if (job_cancelled(job)) {
    return cancelled_status(job);
  }
  // "running" as soon as the compute thread takes the task: from here a
  // cancel no longer skips it outright.
  progress_t* progress = NULL;
  pcp_status_t progress_status =
      pcp_allocator_malloc(w->allocator, sizeof(*progress), (void**)&progress);
  pcp_status_ignore(progress_status);  // no "running" report: not an error
  if (progress) {
    progress->worker = w;
    progress->task_id = job->task_id;
    post_to_loop(w, on_progress, progress);
  }
  if (w->config->test_task_delay_ms > 0) {
    pcp_sleep_ms(w->config->test_task_delay_ms);
  }
  if (job_cancelled(job)) {
    return cancelled_status(job);
  }
  pcp_proto_task_assign_t assign;
  PCP_RETURN_IF_ERROR(pcp_proto_task_assign_parse(&job->frame, &assign),
                      "TASK_ASSIGN");
  pcp_program_t* program = NULL;
  PCP_RETURN_IF_ERROR_BARE(get_program(w, assign.program, &program));

  pcp_status_t status = pcp_ok_status();
  size_t n = assign.input_count;
  pcp_host_tensor_t* hosts = NULL;
  pcp_value_t* values = NULL;
  pcp_tensor_t** results = NULL;
  size_t result_count = 0;
  status = pcp_allocator_calloc(w->allocator, (n ? n : 1) * sizeof(*hosts),
                                (void**)&hosts);
  if (!status) {
    status = pcp_allocator_calloc(w->allocator, (n ? n : 1) * sizeof(*values),
                                  (void**)&values);
  }
  if (!status) {
    status = pcp_allocator_calloc(w->allocator,
                                  PCP_PROTO_MAX_TASK_TENSORS * sizeof(void*),
                                  (void**)&results);
  }
  if (!status) {
    // The decoder bounded the init refs' total; checked again before any
    // is filled, as init_input_value checks each one.
    status = pcp_proto_init_refs_validate(assign.inputs, (uint32_t)n);
  }
  if (status) {
    pcp_allocator_free(w->allocator, results);
    pcp_allocator_free(w->allocator, values);
    pcp_allocator_free(w->allocator, hosts);
    return pcp_status_annotate_f(status, "task inputs");
  }
  for (size_t i = 0; i < n && !status; ++i) {
    status =
        input_value(w, job, &assign, &assign.inputs[i], &hosts[i], &values[i]);
    if (status) {
      status = pcp_status_annotate_f(status, "input %zu", i);
    }
  }
  bool send_hash = false;
  if (!status && assign.hash_inputs > 0) {
    status = inputs_hash(w, &assign, hosts, values, job->inputs_sha256);
    send_hash = w->test_omit_hash == 0 || w->hashed_tasks != w->test_omit_hash;
    if (!send_hash) {
      log_event_at(w, PCP_LOG_WARN, "test hook: answering without the hash",
                   NULL, 0);
    }
  }
  // Cancellation is honoured up to here: an IREE call cannot be
  // interrupted, so a cancel that arrives during it is reported after it.
  if (!status && job_cancelled(job)) {
    status = cancelled_status(job);
  }
  int64_t started = now_ns(w);
  if (!status) {
    status = pcp_program_invoke(program, assign.function, values, n, results,
                                PCP_PROTO_MAX_TASK_TENSORS, &result_count);
  }
  job->elapsed_us = (uint64_t)((now_ns(w) - started) / 1000);
  if (!status && job_cancelled(job)) {
    status = cancelled_status(job);
  }
  if (!status && assign.hash_outputs > 0) {
    status = outputs_hash(w, results, result_count, assign.hash_outputs,
                          job->outputs_sha256);
  }
  for (uint32_t k = 0; k < assign.keep_resident_count && !status; ++k) {
    const pcp_proto_keep_resident_t* keep = &assign.keep_resident[k];
    if (!assign.session_id || !assign.session_id[0]) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "keep_resident needs a session_id");
    } else if (keep->output >= result_count) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "keep_resident output %u of %zu outputs",
                               keep->output, result_count);
    } else {
      pcp_tensor_t* t = results[keep->output];
      pcp_tensor_retain(t);
      status = pcp_roles_worker_session_store_put(&w->sessions,
                                                  assign.session_id, keep->as,
                                                  t, pcp_tensor_byte_length(t));
      if (status) {
        pcp_tensor_release(t);
      }
    }
  }
  if (!status && assign.keep_resident_count > 0) {
    size_t evicted = 0;
    status = pcp_roles_worker_session_store_enforce_limit(
        &w->sessions, assign.session_id, &evicted);
    if (status) {
      // This session alone is over the limit: it cannot be kept.
      pcp_roles_worker_session_store_drop(&w->sessions, assign.session_id);
    }
  }
  if (!status) {
    size_t count =
        result_count + (send_hash ? 1 : 0) + (assign.hash_outputs ? 1 : 0);
    count = count ? count : 1;
    status =
        pcp_allocator_calloc(job->allocator, count * sizeof(pcp_host_tensor_t),
                             (void**)&job->outputs);
    if (!status) {
      status = pcp_allocator_calloc(job->allocator,
                                    count * sizeof(pcp_proto_tensor_ref_t),
                                    (void**)&job->refs);
    }
    if (!status) {
      status = pcp_allocator_calloc(job->allocator,
                                    count * sizeof(pcp_proto_section_t),
                                    (void**)&job->sections);
    }
    if (!status) {
      status = pcp_allocator_calloc(job->allocator,
                                    count * sizeof(*job->section_names),
                                    (void**)&job->section_names);
    }
    if (status) {
      status = pcp_status_annotate_f(status, "task results");
    }
  }
  bool allocated =
      job->outputs && job->refs && job->sections && job->section_names;
  for (size_t k = 0; allocated && k < result_count && !status; ++k) {
    job->output_count = (uint32_t)(k + 1);
    const char* kept_as = NULL;
    for (uint32_t r = 0; r < assign.keep_resident_count; ++r) {
      if (assign.keep_resident[r].output == k) {
        kept_as = assign.keep_resident[r].as;
      }
    }
    pcp_proto_tensor_ref_t* ref = &job->refs[k];
    if (kept_as && !assign.return_resident) {
      ref->kind = PCP_PROTO_TENSOR_REF_RESIDENT;
      ref->name = kept_as;  // borrowed from the frame the job holds
      continue;
    }
    status = pcp_tensor_download_host(results[k], &job->outputs[k]);
    if (status) {
      break;
    }
    pcp_host_tensor_t* host = &job->outputs[k];
    pcp_proto_section_t* section = &job->sections[job->section_count];
    snprintf(job->section_names[job->section_count],
             sizeof(job->section_names[0]), "output%zu", k);
    section->name = job->section_names[job->section_count];
    section->element_type = host->shape.element_type;
    section->rank = (uint32_t)host->shape.rank;
    for (int32_t d = 0; d < host->shape.rank; ++d) {
      section->shape[d] = host->shape.dims[d];
    }
    section->data = host->data;
    section->byte_length = host->byte_length;
    ref->kind = PCP_PROTO_TENSOR_REF_SECTION;
    ref->section = (uint32_t)job->section_count;
    job->section_count++;
  }
  if (allocated && !status && send_hash) {
    // The digest of the inputs as this worker held them, after the outputs.
    size_t k = result_count;
    job->output_count = (uint32_t)(k + 1);
    pcp_proto_section_t* section = &job->sections[job->section_count];
    snprintf(job->section_names[job->section_count],
             sizeof(job->section_names[0]), "inputs_sha256");
    section->name = job->section_names[job->section_count];
    section->element_type = PCP_ELEMENT_TYPE_U8;
    section->rank = 1;
    section->shape[0] = PCP_SHA256_BYTE_LENGTH;
    section->data = job->inputs_sha256;
    section->byte_length = PCP_SHA256_BYTE_LENGTH;
    job->refs[k] =
        (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_SECTION,
                                 .section = (uint32_t)job->section_count};
    job->section_count++;
  }
  if (allocated && !status && assign.hash_outputs > 0) {
    // The digest of the outputs as this worker produced them, last.
    size_t k = job->output_count;
    job->output_count = (uint32_t)(k + 1);
    pcp_proto_section_t* section = &job->sections[job->section_count];
    snprintf(job->section_names[job->section_count],
             sizeof(job->section_names[0]), "outputs_sha256");
    section->name = job->section_names[job->section_count];
    section->element_type = PCP_ELEMENT_TYPE_U8;
    section->rank = 1;
    section->shape[0] = PCP_SHA256_BYTE_LENGTH;
    section->data = job->outputs_sha256;
    section->byte_length = PCP_SHA256_BYTE_LENGTH;
    job->refs[k] =
        (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_SECTION,
                                 .section = (uint32_t)job->section_count};
    job->section_count++;
  }
  for (size_t k = 0; k < result_count; ++k) {
    pcp_tensor_release(results[k]);
  }
  for (size_t i = 0; hosts && i < n; ++i) {
    pcp_host_tensor_deinitialize(&hosts[i]);
  }
  pcp_allocator_free(w->allocator, results);
  pcp_allocator_free(w->allocator, values);
  pcp_allocator_free(w->allocator, hosts);
  return status;
}

static void run_job(worker_t* w, job_t* job) {
  switch (job->kind) {
    case JOB_LOOKUP:
      job->status = pcp_roles_worker_program_cache_lookup(
          &w->cache, job->program, &job->found);
      break;
    case JOB_STORE:
      job->status = pcp_roles_worker_program_cache_store(
          &w->cache, job->program, job->blob, (size_t)job->blob_length);
      pcp_proto_blob_free(job->blob_allocator, job->blob);
      job->blob = NULL;
      break;
    case JOB_TASK:
      job->status = run_task(w, job);
      if (job->status) {
        job->output_count = 0;  // nothing of a failed task is sent
      }
      break;
    case JOB_DROP_SESSIONS:
      pcp_roles_worker_session_store_drop_all(&w->sessions);
      break;
  }
}

// Compute thread (the backend's owner): device memory after each job.
static void memory_publish(worker_t* w) {
  pcp_roles_worker_metrics_set(w->metrics.session_bytes,
                               (double)w->sessions.byte_length);
  pcp_backend_memory_t memory;
  pcp_status_t status = pcp_backend_memory_query(w->backend, &memory);
  if (status) {
    pcp_status_ignore(status);  // no allocator statistics: left unset
    return;
  }
  pcp_roles_worker_metrics_set(w->metrics.device_memory,
                               (double)memory.device_bytes_live);
  pcp_roles_worker_metrics_set(w->metrics.device_memory_peak,
                               (double)memory.device_bytes_peak);
}

static void startup_signal(worker_t* w, pcp_status_t status) {
  pthread_mutex_lock(&w->startup_mutex);
  w->startup_status = status;
  w->startup_done = true;
  pthread_cond_broadcast(&w->startup_cond);
  pthread_mutex_unlock(&w->startup_mutex);
}

static void* compute_main(void* opaque) {
  worker_t* w = opaque;
  const char* backend = pcp_roles_backend_name(w->config->backend);
  // On cpu the device id names a slot on the host, not an IREE device:
  // local-task has exactly one device, so every cpu worker uses ordinal 0.
  bool cpu = strcmp(backend, "cpu") == 0;
  pcp_backend_options_t options = {
      .driver = backend,
      .device_ordinal = cpu ? 0 : (int32_t)w->config->device_id,
      .cpu_threads = (int32_t)w->config->cpu_threads};
  pcp_status_t status = pcp_backend_create(&options, &w->backend);
  if (!status) {
    w->backend_info = *pcp_backend_info(w->backend);
  }
  bool ok = !status;
  if (ok) {
    memory_publish(w);
  }
  startup_signal(w, status);
  if (!ok) {
    return NULL;
  }
  for (;;) {
    job_t* job = pcp_roles_worker_job_queue_pop(&w->queue);
    if (!job) {
      break;
    }
    if (job->kind == JOB_TASK && atomic_load(&w->abandon)) {
      job->status = cancelled_status(job);
    } else {
      run_job(w, job);
    }
    memory_publish(w);
    post_to_loop(w, on_job_done, job);
  }
  // The backend's objects die on the thread that used them.
  pcp_roles_worker_session_store_deinitialize(&w->sessions);
  for (size_t i = 0; i < w->program_count; ++i) {
    pcp_program_release(w->programs[i].program);
  }
  w->program_count = 0;
  pcp_backend_release(w->backend);
  w->backend = NULL;
  post_to_loop(w, on_compute_exited, w);
  return NULL;
}

//===----------------------------------------------------------------------===//
// Loop: ticks, signals, stopping
//===----------------------------------------------------------------------===//

static void maybe_stop(worker_t* w) {
  if (w->finishing && w->compute_exited && w->open_conns == 0 &&
      !w->connecting && !w->stopped) {
    w->stopped = true;
    pcp_loop_stop(w->loop);
  }
}

// Stops for good: no reconnect, the compute thread ends after its queue,
// the connection is flushed and closed. The loop stops once all of that
// has happened (maybe_stop).
static void finish(worker_t* w) {
  if (w->finishing) {
    return;
  }
  w->finishing = true;
  pcp_roles_worker_job_queue_close(&w->queue);
  if (w->current) {
    conn_state_t* cs = w->current;
    w->current = NULL;
    cs->closing = true;
    flush(cs);
  }
  maybe_stop(w);
}

static void on_tick(void* user_data, pcp_loop_timer_t* timer,
                    pcp_status_code_t code) {
  (void)timer;
  worker_t* w = user_data;
  if (code != PCP_STATUS_OK) {
    return;
  }
  int64_t now = now_ns(w);
  bool stalled = w->last_tick_ns && now - w->last_tick_ns > TICK_STALL_NS;
  w->last_tick_ns = now;
  if (stalled || w->finishing || !w->proto) {
    return;
  }
  if (w->draining && now >= w->drain_deadline_ns) {
    const char* pairs[] = {"reason", "drain deadline passed"};
    log_event(w, "drained", pairs, 1);
    atomic_store(&w->abandon, true);
    finish(w);
    return;
  }
  pcp_status_t status = pcp_proto_worker_on_tick(w->proto, now);
  if (status) {
    log_status(w, PCP_LOG_ERROR, status, "fabric tick");
    pcp_status_ignore(status);
  }
  pump(w);
}

static void on_signal(void* user_data, int signum) {
  worker_t* w = user_data;
  const char* pairs[] = {"signal", signum == SIGINT ? "SIGINT" : "SIGTERM"};
  if (w->draining || w->finishing) {
    // A second signal: stop now (the running IREE call still finishes).
    log_event(w, "stopping now", pairs, 1);
    atomic_store(&w->abandon, true);
    finish(w);
    return;
  }
  log_event(w, "stopping", pairs, 1);
  pcp_proto_worker_state_t state =
      w->proto ? pcp_proto_worker_state(w->proto) : PCP_PROTO_WORKER_IDLE;
  if (state == PCP_PROTO_WORKER_READY) {
    // Tell the gateway first, so it assigns nothing new, then let the
    // in-flight tasks finish and report.
    pcp_status_t status = pcp_proto_worker_drain(
        w->proto, (uint64_t)w->config->drain_timeout_ms, now_ns(w));
    if (!status) {
      w->draining = true;
      w->drain_deadline_ns =
          now_ns(w) + w->config->drain_timeout_ms * (int64_t)1000000;
      pump(w);
      return;
    }
    pcp_status_ignore(status);
  } else if (state == PCP_PROTO_WORKER_DRAINING) {
    w->draining = true;
    w->drain_deadline_ns =
        now_ns(w) + w->config->drain_timeout_ms * (int64_t)1000000;
    pump(w);
    return;
  }
  // Not joined: nothing to report; whatever is queued cannot be delivered.
  atomic_store(&w->abandon, true);
  finish(w);
}

//===----------------------------------------------------------------------===//
// Start-up
//===----------------------------------------------------------------------===//

static uint64_t host_memory_bytes(void) {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) {
    return 0;
  }
  return (uint64_t)pages * (uint64_t)page_size;
}

static pcp_status_t resolve_cache_dir(const pcp_roles_worker_config_t* config,
                                      char* buffer, size_t capacity) {
  int n;
  if (config->cache_dir && config->cache_dir[0]) {
    n = snprintf(buffer, capacity, "%s", config->cache_dir);
  } else {
    n = snprintf(buffer, capacity, "%s/worker-programs",
                 pcp_compile_default_cache_dir());
  }
  if (n < 0 || (size_t)n >= capacity) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "program cache directory is too long");
  }
  return pcp_ok_status();
}

// Logs why the worker cannot run (level=error) and returns exit code 1.
static int fail_start(worker_t* w, pcp_status_t status, const char* what) {
  log_status(w, PCP_LOG_ERROR, status, what);
  pcp_status_ignore(status);
  return 1;
}

int pcp_roles_worker_runtime_run(const pcp_roles_worker_config_t* config) {
  // The system allocator: the role's top. Everything below takes it from
  // |w|, so a test that builds a worker with another reaches every site.
  pcp_allocator_t allocator = pcp_allocator_system();
  worker_t* w = NULL;
  pcp_status_t alloc_status =
      pcp_allocator_calloc(allocator, sizeof(*w), (void**)&w);
  if (alloc_status) {
    pcp_status_ignore(alloc_status);
    return 1;
  }
  w->allocator = allocator;
  w->config = config;
  w->log = (pcp_log_context_t){.role = "worker", .node_id = config->worker_id};
  w->clock = pcp_clock_system();
  atomic_init(&w->abandon, false);
  pthread_mutex_init(&w->startup_mutex, NULL);
  pthread_cond_init(&w->startup_cond, NULL);
  int exit_code = 1;
  pcp_status_t status = pcp_ok_status();
  char cache_dir[4096];
  char runtime_version[64] = "";
  char compiler_version[256] = "";
  char port_text[16];
  char device_text[32];
  snprintf(port_text, sizeof(port_text), "%lld", (long long)config->port);
  snprintf(device_text, sizeof(device_text), "%lld",
           (long long)config->device_id);

  // The join token: named by a flag, read from the environment, never
  // logged (STYLE.md s.3.8).
  // Without it the worker cannot join; it still starts (backend, signals)
  // and idles with an error line instead of exiting, so a supervisor does
  // not crash-loop it and the log says exactly what to set.
  const char* token = getenv(config->join_token_env);
  const char* corrupt = getenv("PCP_WORKER_TEST_CORRUPT_PARAM");
  const char* omit_hash = getenv("PCP_WORKER_TEST_OMIT_HASH");
  if (omit_hash && *omit_hash) {
    w->test_omit_hash = strtoull(omit_hash, NULL, 10);
  }
  const char* init_skew = getenv("PCP_WORKER_TEST_INIT_SKEW");
  w->test_init_skew = init_skew && strcmp(init_skew, "1") == 0;
  w->test_init_fail = init_skew && strcmp(init_skew, "fail") == 0;
  const char* corrupt_output = getenv("PCP_WORKER_TEST_CORRUPT_OUTPUT");
  if (corrupt_output && *corrupt_output) {
    w->test_corrupt_output = strtoull(corrupt_output, NULL, 10);
  }
  while (corrupt && *corrupt && w->test_corrupt_count < 8) {
    char* end = NULL;
    w->test_corrupt[w->test_corrupt_count++] = strtoull(corrupt, &end, 10);
    corrupt = end && *end == ',' ? end + 1 : NULL;
  }
  if (token && token[0]) {
    w->token_length = strlen(token);
    char* copy = NULL;
    pcp_status_t copy_status = pcp_allocator_strdup(w->allocator, token, &copy);
    pcp_status_ignore(copy_status);  // no copy: joins as without a token
    w->token = (uint8_t*)copy;
  }
  if (!config->host || strlen(config->host) > PCP_NET_MAX_HOST_LENGTH) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "bad --host");
  } else {
    snprintf(w->address.host, sizeof(w->address.host), "%s", config->host);
    w->address.port = (uint16_t)config->port;
    pcp_net_address_format(&w->address, w->address_text,
                           sizeof(w->address_text));
  }
  if (!status) {
    status = pcp_roles_worker_metrics_initialize(
        pcp_roles_backend_name(config->backend), config->target,
        config->worker_id, &w->metrics);
  }
  char metrics_port[16] = "";
  if (!status && config->metrics_listen) {
    uint16_t port = 0;
    status = pcp_roles_worker_metrics_listen(&w->metrics,
                                             config->metrics_listen, &port);
    snprintf(metrics_port, sizeof(metrics_port), "%u", (unsigned)port);
  }
  if (!status) {
    status = resolve_cache_dir(config, cache_dir, sizeof(cache_dir));
  }
  if (!status) {
    status = pcp_roles_worker_program_cache_initialize(
        cache_dir, pcp_allocator_system(), &w->cache);
  }
  if (!status) {
    pcp_roles_worker_session_store_initialize(
        (size_t)config->resident_memory_bytes, release_tensor,
        pcp_allocator_system(), &w->sessions);
    // Room for every task the gateway may have in flight plus the program
    // transfers and a session drop: a well-behaved gateway never fills it.
    pcp_proto_limits_t limits = pcp_proto_limits_default();
    status = pcp_roles_worker_job_queue_initialize(
        limits.max_in_flight + 2 * limits.max_blob_assemblies + 8,
        pcp_allocator_system(), &w->queue);
  }
  if (status) {
    exit_code = fail_start(w, status, "start failed");
    goto cleanup_early;
  }
  {
    pcp_status_t v =
        pcp_compute_runtime_version(runtime_version, sizeof(runtime_version));
    pcp_status_ignore(v);
    v = pcp_compile_compiler_version(compiler_version,
                                     sizeof(compiler_version));
    if (v) {
      compiler_version[0] = 0;  // this worker cannot compile; say so
    }
    pcp_status_ignore(v);
  }

  // The compute thread creates the backend (it owns it from the start) and
  // reports whether that worked before anything connects.
  if (pthread_create(&w->compute_thread, NULL, compute_main, w) != 0) {
    exit_code = fail_start(w,
                           pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                                           "cannot start the compute thread"),
                           "start failed");
    goto cleanup_queue;
  }
  w->compute_started = true;
  pthread_mutex_lock(&w->startup_mutex);
  while (!w->startup_done) {
    pthread_cond_wait(&w->startup_cond, &w->startup_mutex);
  }
  pthread_mutex_unlock(&w->startup_mutex);
  if (w->startup_status) {
    pthread_join(w->compute_thread, NULL);
    w->compute_started = false;
    exit_code = fail_start(w, w->startup_status, "backend failed");
    w->startup_status = NULL;
    goto cleanup_queue;
  }

  pcp_loop_options_t loop_options = pcp_loop_options_default();
  status = pcp_loop_create(&loop_options, &w->loop);
  uint64_t seed = 0;
  if (!status) {
    // Jitter only needs to differ between workers, not be secret.
    status = pcp_proto_random_bytes((uint8_t*)&seed, sizeof(seed));
  }
  pcp_rng_initialize(seed, &w->rng);
  pcp_proto_worker_config_t pc = {0};
  pc.join.backend = pcp_roles_backend_name(config->backend);
  if (!status && w->token) {
    pc.limits = pcp_proto_limits_default();
    pc.heartbeat_interval_ms = PCP_PROTO_HEARTBEAT_DEFAULT_MS;
    pc.join.worker_id = config->worker_id;
    pc.join.backend = pcp_roles_backend_name(config->backend);
    pc.join.target = config->target ? config->target : "";
    pc.join.device_id = (int32_t)config->device_id;
    pc.join.device_memory_bytes =
        config->device_memory_bytes > 0 ? (uint64_t)config->device_memory_bytes
        : strcmp(pc.join.backend, "cpu") == 0 ? host_memory_bytes()
                                              : 0;
    pc.join.drivers[0] = w->backend_info.driver;
    pc.join.driver_count = 1;
    pc.join.runtime_version = runtime_version;
    pc.join.compiler_version = compiler_version;
    pc.join.node_manager_id =
        config->node_manager_id ? config->node_manager_id : "";
    pc.join.supervisor_id = config->supervisor_id;
    pc.join.worker_class = config->worker_class ? config->worker_class : "";
    pc.join_token = w->token;
    pc.join_token_length = w->token_length;
    pc.software = "pcp " PCP_VERSION_STRING;
    status = pcp_proto_worker_create(&pc, &w->rng, pcp_allocator_system(),
                                     &w->proto);
  }
  if (!status) {
    status = pcp_loop_signal_watch(w->loop, SIGTERM, on_signal, w, &w->sigterm);
  }
  if (!status) {
    status = pcp_loop_signal_watch(w->loop, SIGINT, on_signal, w, &w->sigint);
  }
  if (!status) {
    status =
        pcp_loop_timer_start(w->loop, TICK_MS, TICK_MS, on_tick, w, &w->tick);
  }
  if (!status && w->proto) {
    status = pcp_proto_worker_start(w->proto, now_ns(w));
  }
  if (!status) {
    char supervisor_text[32];
    snprintf(supervisor_text, sizeof(supervisor_text), "%lld",
             (long long)config->supervisor_id);
    // The first fields keep the order of the role's thin start line, which
    // the node manager's tests read.
    const char* pairs[] = {
        "host",          config->host,
        "port",          port_text,
        "backend",       pc.join.backend,
        "target",        config->target,
        "device_id",     device_text,
        "supervisor_id", config->supervisor_id >= 0 ? supervisor_text : NULL,
        "driver",        w->backend_info.driver,
        "cache_dir",     cache_dir,
        "runtime",       runtime_version,
        "metrics_port",  metrics_port[0] ? metrics_port : NULL,
    };
    log_event(w, "started", pairs, PCP_ARRAYSIZE(pairs) / 2);
    if (!w->proto) {
      PCP_LOG(PCP_LOG_ERROR, &w->log,
              "no join token: environment variable %s is unset or empty; "
              "not connecting until restarted with it",
              config->join_token_env);
    } else {
      pump(w);
    }
    status = pcp_loop_run(w->loop);
  }
  if (status) {
    exit_code = fail_start(w, status, "run failed");
    atomic_store(&w->abandon, true);
  } else {
    exit_code = 0;
    log_event(w, "stopped", NULL, 0);
  }

  // Teardown: the compute thread first (its posts need the loop alive),
  // then the loop (cancelling whatever is still queued on it).
  pcp_roles_worker_job_queue_close(&w->queue);
  if (w->compute_started) {
    pthread_join(w->compute_thread, NULL);
    w->compute_started = false;
  }
  if (w->loop) {
    if (w->sigterm) {
      pcp_loop_signal_release(w->sigterm);
    }
    if (w->sigint) {
      pcp_loop_signal_release(w->sigint);
    }
    pcp_loop_release(w->loop);
  }
  pcp_proto_worker_release(w->proto);
  // Jobs never popped (the compute thread could not start, or left early).
  while (pcp_roles_worker_job_queue_count(&w->queue) > 0) {
    job_free(pcp_roles_worker_job_queue_pop(&w->queue));
  }
cleanup_queue:
  if (w->compute_started) {
    pthread_join(w->compute_thread, NULL);
  }
  pcp_roles_worker_job_queue_deinitialize(&w->queue);
  pcp_roles_worker_session_store_deinitialize(&w->sessions);
cleanup_early:
  pcp_roles_worker_program_cache_deinitialize(&w->cache);
  pcp_roles_worker_metrics_deinitialize(&w->metrics);
  if (w->token) {
    memset(w->token, 0, w->token_length);
    pcp_allocator_free(w->allocator, w->token);
  }
  pthread_cond_destroy(&w->startup_cond);
  pthread_mutex_destroy(&w->startup_mutex);
  pcp_allocator_free(allocator, w);
  return exit_code;
}
