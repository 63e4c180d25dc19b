// SPDX-License-Identifier: Apache-2.0
//
// Worker side of the fabric, sans-I/O: one logical session that survives
// reconnects (stable id, lease epoch, resume token), with exponential
// backoff and jitter drawn from an injected pcp_rng_t.

#include <string.h>

#include "proto/proto_impl.h"

typedef struct task_slot_t {
  uint64_t task_id;
  uint64_t request_id;
} task_slot_t;

typedef enum fetch_stage_e {
  FETCH_LOOKUP = 0,     // asked the owner whether the program is cached
  FETCH_RECEIVING = 1,  // sent PROGRAM_FETCH, chunks arriving
  FETCH_STORING = 2,    // handed the bytes to the owner
} fetch_stage_t;

typedef struct fetch_t {
  uint64_t request_id;
  uint8_t program[PCP_SHA256_BYTE_LENGTH];
  uint64_t byte_length;
  fetch_stage_t stage;
  bool assembling;
  pcp_proto_blob_assembly_t assembly;
} fetch_t;

struct pcp_proto_worker_t {
  pcp_allocator_t allocator;
  pcp_proto_worker_config_t config;
  pcp_rng_t* rng;
  pcp_proto_timeouts_t timeouts;
  pcp_proto_frame_decoder_t decoder;
  pcp_proto_action_queue_t actions;
  pcp_proto_worker_state_t state;
  uint16_t version;
  int64_t attempt_started_ns;
  int64_t last_rx_ns;
  int64_t next_heartbeat_ns;
  int64_t reconnect_at_ns;
  uint32_t attempts;
  uint64_t heartbeat_seq_tx;
  uint64_t heartbeat_seq_rx;
  uint64_t next_request_id;
  uint64_t join_request_id;
  bool has_lease;
  uint64_t lease_epoch;
  uint8_t resume_token[PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH];
  uint32_t gateway_max_in_flight;
  task_slot_t* tasks;
  size_t task_count;
  fetch_t* fetches;              // max_blob_assemblies entries
  pcp_proto_blob_table_t blobs;  // task input tensors arriving as chunks
  size_t fetch_count;
  uint64_t dropped;
};

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

static pcp_status_t push(pcp_proto_worker_t* w, pcp_proto_action_t* action) {
  action->allocator = w->allocator;
  return pcp_proto_action_queue_push(&w->actions, action);
}

static pcp_status_t push_simple(pcp_proto_worker_t* w,
                                pcp_proto_action_type_t type,
                                uint64_t request_id, uint64_t task_id,
                                pcp_status_t status) {
  pcp_proto_action_t a = {0};
  a.type = type;
  a.request_id = request_id;
  a.task_id = task_id;
  a.status = status;
  return push(w, &a);
}

static pcp_status_t push_send(pcp_proto_worker_t* w,
                              pcp_proto_encoded_frame_t* frame) {
  pcp_proto_action_t a = {0};
  a.type = PCP_PROTO_ACTION_SEND;
  a.frame = *frame;
  memset(frame, 0, sizeof(*frame));
  return push(w, &a);
}

static uint16_t send_version(const pcp_proto_worker_t* w) {
  return w->version ? w->version : PCP_PROTO_VERSION_MAX;
}

static pcp_status_t send_error(pcp_proto_worker_t* w, uint64_t request_id,
                               pcp_status_t status, uint64_t task_id) {
  pcp_proto_encoded_frame_t f;
  pcp_status_t encoded =
      pcp_proto_error_encode(send_version(w), request_id, status, task_id,
                             &w->config.limits, w->allocator, &f);
  pcp_status_ignore(status);  // consumed: the peer gets a copy
  PCP_RETURN_IF_ERROR_BARE(encoded);
  return push_send(w, &f);
}

static bool connected(const pcp_proto_worker_t* w) {
  return w->state >= PCP_PROTO_WORKER_AWAIT_HELLO &&
         w->state <= PCP_PROTO_WORKER_DRAINING;
}

// Decoder data sink: a task input's chunk is read from the socket straight
// into its blob buffer (zero copy on receive, docs/decisions.md).
static uint8_t* blob_data_sink(void* user_data, pcp_proto_frame_t* head,
                               uint64_t data_length) {
  pcp_proto_worker_t* w = user_data;
  if (w->state != PCP_PROTO_WORKER_READY &&
      w->state != PCP_PROTO_WORKER_DRAINING) {
    return NULL;
  }
  pcp_proto_blob_chunk_t chunk;
  pcp_status_t status = pcp_proto_blob_chunk_parse(head, &chunk);
  if (status || chunk.data_length != data_length) {
    pcp_status_ignore(status);
    return NULL;
  }
  return pcp_proto_blob_table_dest(&w->blobs, head->header.request_id, &chunk,
                                   &w->config.limits);
}

static void reset_connection(pcp_proto_worker_t* w) {
  pcp_proto_frame_decoder_deinitialize(&w->decoder);
  pcp_proto_frame_decoder_initialize(&w->config.limits, w->allocator,
                                     &w->decoder);
  pcp_proto_frame_decoder_set_data_sink(&w->decoder, blob_data_sink, w);
  w->version = 0;
  w->heartbeat_seq_tx = 0;
  w->heartbeat_seq_rx = 0;
  for (size_t i = 0; i < w->fetch_count; ++i) {
    if (w->fetches[i].assembling) {
      pcp_proto_blob_assembly_deinitialize(&w->fetches[i].assembly);
    }
  }
  w->fetch_count = 0;
  pcp_proto_blob_table_clear(&w->blobs);
}

// Exponential backoff with "equal jitter": a delay uniform in [d/2, d], so
// a restarted gateway does not see every worker in the same millisecond.
static int64_t next_backoff_ns(pcp_proto_worker_t* w) {
  int64_t d = w->timeouts.backoff_initial_ns;
  for (uint32_t i = 1; i < w->attempts && d < w->timeouts.backoff_max_ns; ++i) {
    d *= 2;
  }
  if (d > w->timeouts.backoff_max_ns)
    d = w->timeouts.backoff_max_ns;
  if (d < 2)
    d = 2;
  int64_t half = d / 2;
  return half + (int64_t)pcp_rng_next_below(w->rng, (uint64_t)(d - half) + 1);
}

// The connection is over (closed by us or by the peer): cancel the tasks
// whose results can no longer be delivered, then back off. |why| consumed.
static pcp_status_t enter_backoff(pcp_proto_worker_t* w, int64_t now_ns,
                                  pcp_status_t why, bool emit_close) {
  pcp_status_t status = pcp_ok_status();
  if (emit_close) {
    status = push_simple(w, PCP_PROTO_ACTION_CLOSE, 0, 0, why);
  } else {
    pcp_status_ignore(why);
  }
  for (size_t i = 0; i < w->task_count && !status; ++i) {
    status =
        push_simple(w, PCP_PROTO_ACTION_CANCEL_TASK, w->tasks[i].request_id,
                    w->tasks[i].task_id, pcp_ok_status());
  }
  w->task_count = 0;
  reset_connection(w);
  if (w->state == PCP_PROTO_WORKER_SHUTDOWN)
    return status;
  w->attempts++;
  w->state = PCP_PROTO_WORKER_BACKOFF;
  w->reconnect_at_ns = now_ns + next_backoff_ns(w);
  return status;
}

static pcp_status_t fail_peer(pcp_proto_worker_t* w, int64_t now_ns,
                              uint64_t request_id, pcp_status_t why) {
  pcp_status_t status = send_error(w, request_id, pcp_status_clone(why), 0);
  return pcp_status_join(status, enter_backoff(w, now_ns, why, true));
}

static pcp_status_t emit_chunk(void* user_data,
                               pcp_proto_encoded_frame_t* frame) {
  return push_send((pcp_proto_worker_t*)user_data, frame);
}

static task_slot_t* find_task(pcp_proto_worker_t* w, uint64_t task_id) {
  for (size_t i = 0; i < w->task_count; ++i) {
    if (w->tasks[i].task_id == task_id)
      return &w->tasks[i];
  }
  return NULL;
}

static fetch_t* find_fetch(pcp_proto_worker_t* w, uint64_t request_id) {
  for (size_t i = 0; i < w->fetch_count; ++i) {
    if (w->fetches[i].request_id == request_id)
      return &w->fetches[i];
  }
  return NULL;
}

static void remove_fetch(pcp_proto_worker_t* w, fetch_t* fetch) {
  if (fetch->assembling)
    pcp_proto_blob_assembly_deinitialize(&fetch->assembly);
  *fetch = w->fetches[--w->fetch_count];
}

//===----------------------------------------------------------------------===//
// Frames from the gateway
//===----------------------------------------------------------------------===//

static pcp_status_t on_hello(pcp_proto_worker_t* w, pcp_proto_frame_t* frame,
                             int64_t now_ns) {
  pcp_proto_hello_t hello;
  pcp_status_t status = pcp_proto_hello_parse(frame, &hello);
  if (status)
    return fail_peer(w, now_ns, 0, status);
  uint16_t v = hello.selected_version;
  if (!hello.has_selected_version || v < PCP_PROTO_VERSION_MIN ||
      v > PCP_PROTO_VERSION_MAX) {
    // Rule 3: no common version. Nothing to send; the gateway closes.
    return enter_backoff(
        w, now_ns,
        pcp_make_status(PCP_STATUS_INCOMPATIBLE,
                        "gateway speaks fabric %u..%u and selected %u; this "
                        "worker speaks %u..%u",
                        hello.min_version, hello.max_version, v,
                        PCP_PROTO_VERSION_MIN, PCP_PROTO_VERSION_MAX),
        true);
  }
  w->version = v;
  pcp_proto_frame_decoder_set_version(&w->decoder, v);
  w->state = PCP_PROTO_WORKER_AWAIT_CHALLENGE;
  return pcp_ok_status();
}

static pcp_status_t on_challenge(pcp_proto_worker_t* w,
                                 pcp_proto_frame_t* frame, int64_t now_ns) {
  pcp_proto_challenge_t challenge;
  pcp_status_t status = pcp_proto_challenge_parse(frame, &challenge);
  if (status)
    return fail_peer(w, now_ns, 0, status);
  pcp_proto_join_t join = w->config.join;
  join.has_resume = w->has_lease;
  join.lease_epoch = w->lease_epoch;
  memcpy(join.resume_token, w->resume_token, sizeof(join.resume_token));
  w->join_request_id = w->next_request_id++;
  pcp_proto_encoded_frame_t f;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_join_encode(w->version, w->join_request_id,
                                                 &join, &w->config.limits,
                                                 w->allocator, &f));
  PCP_RETURN_IF_ERROR_BARE(push_send(w, &f));
  pcp_proto_join_proof_t proof = {.worker_id = join.worker_id};
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_join_mac_compute(
      w->config.join_token, w->config.join_token_length, challenge.nonce,
      join.worker_id, proof.mac));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_proto_join_proof_encode(w->version, w->join_request_id, &proof,
                                  &w->config.limits, w->allocator, &f));
  PCP_RETURN_IF_ERROR_BARE(push_send(w, &f));
  w->state = PCP_PROTO_WORKER_AWAIT_ACCEPT;
  return pcp_ok_status();
}

static pcp_status_t on_accept(pcp_proto_worker_t* w, pcp_proto_frame_t* frame,
                              int64_t now_ns) {
  pcp_proto_accept_t accept;
  pcp_status_t status = pcp_proto_accept_parse(frame, &accept);
  if (status)
    return fail_peer(w, now_ns, frame->header.request_id, status);
  if (strcmp(accept.worker_id, w->config.join.worker_id) != 0) {
    return fail_peer(
        w, now_ns, frame->header.request_id,
        pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                        "ACCEPT for worker '%s', I am '%s'", accept.worker_id,
                        w->config.join.worker_id));
  }
  bool had_lease = w->has_lease;
  w->has_lease = true;
  w->lease_epoch = accept.lease_epoch;
  memcpy(w->resume_token, accept.resume_token, sizeof(w->resume_token));
  w->gateway_max_in_flight = accept.max_in_flight;
  // From now on every timeout follows the gateway's heartbeat setting.
  w->timeouts = pcp_proto_timeouts_from_heartbeat(accept.heartbeat_interval_ms);
  w->state = PCP_PROTO_WORKER_READY;
  w->attempts = 0;
  w->next_heartbeat_ns = now_ns + w->timeouts.heartbeat_interval_ns;
  if (had_lease && !accept.resumed) {
    PCP_RETURN_IF_ERROR_BARE(
        push_simple(w, PCP_PROTO_ACTION_DROP_SESSIONS, 0, 0, pcp_ok_status()));
  }
  pcp_proto_action_t a = {0};
  a.type = PCP_PROTO_ACTION_ACCEPTED;
  a.resumed = accept.resumed;
  a.lease_epoch = accept.lease_epoch;
  return push(w, &a);
}

static pcp_status_t on_reject(pcp_proto_worker_t* w, pcp_proto_frame_t* frame,
                              int64_t now_ns) {
  pcp_proto_reject_t reject;
  pcp_status_t status = pcp_proto_reject_parse(frame, &reject);
  if (status)
    return fail_peer(w, now_ns, 0, status);
  pcp_proto_action_t a = {0};
  a.type = PCP_PROTO_ACTION_REJECTED;
  a.reject_reason = reject.reason;
  a.status = pcp_make_status(reject.reason == PCP_PROTO_REJECT_AUTH_FAILED
                                 ? PCP_STATUS_UNAUTHENTICATED
                                 : PCP_STATUS_PERMISSION_DENIED,
                             "gateway rejected the join: %s: %s",
                             pcp_proto_reject_reason_name(reject.reason),
                             reject.message);
  PCP_RETURN_IF_ERROR_BARE(push(w, &a));
  return enter_backoff(
      w, now_ns,
      pcp_make_status(PCP_STATUS_PERMISSION_DENIED, "rejected: %s",
                      pcp_proto_reject_reason_name(reject.reason)),
      true);
}

static pcp_status_t on_program_offer(pcp_proto_worker_t* w,
                                     pcp_proto_frame_t* frame) {
  pcp_proto_program_offer_t offer;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_program_offer_parse(frame, &offer));
  uint64_t request_id = frame->header.request_id;
  if (find_fetch(w, request_id)) {
    w->dropped++;  // duplicate offer
    return pcp_ok_status();
  }
  if (w->fetch_count == w->config.limits.max_blob_assemblies) {
    return send_error(
        w, request_id,
        pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                        "%zu program transfers in progress", w->fetch_count),
        0);
  }
  if (offer.byte_length > w->config.limits.max_blob_bytes) {
    return send_error(
        w, request_id,
        pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                        "program of %llu bytes exceeds %llu",
                        (unsigned long long)offer.byte_length,
                        (unsigned long long)w->config.limits.max_blob_bytes),
        0);
  }
  fetch_t* f = &w->fetches[w->fetch_count++];
  memset(f, 0, sizeof(*f));
  f->request_id = request_id;
  memcpy(f->program, offer.program, sizeof(f->program));
  f->byte_length = offer.byte_length;
  f->stage = FETCH_LOOKUP;
  pcp_proto_action_t a = {0};
  a.type = PCP_PROTO_ACTION_PROGRAM_LOOKUP;
  a.request_id = request_id;
  memcpy(a.program, offer.program, sizeof(a.program));
  return push(w, &a);
}

static pcp_status_t on_blob_chunk(pcp_proto_worker_t* w,
                                  pcp_proto_frame_t* frame) {
  pcp_proto_blob_chunk_t chunk;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_blob_chunk_parse(frame, &chunk));
  uint64_t request_id = frame->header.request_id;
  if (chunk.kind == PCP_PROTO_BLOB_TENSOR) {
    // An input of the TASK_ASSIGN that will follow with this request id.
    pcp_status_t added = pcp_proto_blob_table_add(&w->blobs, request_id, &chunk,
                                                  &w->config.limits);
    return added ? send_error(w, request_id, added, 0) : pcp_ok_status();
  }
  fetch_t* f = find_fetch(w, request_id);
  if (!f || f->stage != FETCH_RECEIVING ||
      chunk.kind != PCP_PROTO_BLOB_PROGRAM) {
    return send_error(w, request_id,
                      pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                                      "unexpected BLOB_CHUNK for request "
                                      "%llu",
                                      (unsigned long long)request_id),
                      0);
  }
  pcp_status_t status = pcp_ok_status();
  bool complete = false;
  if (!f->assembling) {
    char hex[PCP_SHA256_HEX_LENGTH + 1];
    pcp_proto_hex_encode(f->program, sizeof(f->program), hex);
    if (strcmp(chunk.blob_id, hex) != 0 || chunk.total != f->byte_length) {
      status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                               "program blob '%s' of %llu bytes does not "
                               "match the offer",
                               chunk.blob_id, (unsigned long long)chunk.total);
    }
    if (!status) {
      status = pcp_proto_blob_assembly_initialize(
          request_id, &chunk, &w->config.limits, w->allocator, &f->assembly);
      f->assembling = !status;
      complete = !status && chunk.count == 1;
    }
  } else {
    status = pcp_proto_blob_assembly_add(&f->assembly, &chunk, &complete);
  }
  if (!status && complete &&
      memcmp(chunk.sha256, f->program, sizeof(f->program)) != 0) {
    status = pcp_make_status(PCP_STATUS_DATA_LOSS,
                             "program bytes do not hash to the offered id");
  }
  if (status) {
    // Drop the transfer, tell the gateway, keep the connection.
    remove_fetch(w, f);
    return send_error(w, request_id, status, 0);
  }
  if (!complete)
    return pcp_ok_status();
  pcp_proto_action_t a = {0};
  a.type = PCP_PROTO_ACTION_PROGRAM_STORE;
  a.request_id = request_id;
  memcpy(a.program, f->program, sizeof(a.program));
  pcp_proto_blob_assembly_take(&f->assembly, &a.blob, &a.blob_length);
  f->assembling = false;
  f->stage = FETCH_STORING;
  return push(w, &a);
}

static pcp_status_t on_task_assign(pcp_proto_worker_t* w,
                                   pcp_proto_frame_t* frame) {
  pcp_proto_task_assign_t assign;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_task_assign_parse(frame, &assign));
  if (find_task(w, assign.task_id)) {
    w->dropped++;  // retransmission: already running
    return pcp_ok_status();
  }
  uint32_t limit = w->config.limits.max_in_flight;
  if (w->gateway_max_in_flight && w->gateway_max_in_flight < limit) {
    limit = w->gateway_max_in_flight;
  }
  if (w->state == PCP_PROTO_WORKER_DRAINING || w->task_count >= limit) {
    return send_error(w, frame->header.request_id,
                      pcp_make_status(w->state == PCP_PROTO_WORKER_DRAINING
                                          ? PCP_STATUS_UNAVAILABLE
                                          : PCP_STATUS_RESOURCE_EXHAUSTED,
                                      "worker cannot take task %llu",
                                      (unsigned long long)assign.task_id),
                      assign.task_id);
  }
  pcp_proto_action_t a = {0};
  a.type = PCP_PROTO_ACTION_RUN_TASK;
  a.request_id = frame->header.request_id;
  a.task_id = assign.task_id;
  a.allocator = w->allocator;
  pcp_status_t status = pcp_proto_blob_table_attach(
      &w->blobs, a.request_id, assign.inputs, assign.input_count, &a);
  if (status) {
    pcp_proto_action_deinitialize(&a);
    return send_error(w, frame->header.request_id, status, assign.task_id);
  }
  w->tasks[w->task_count++] = (task_slot_t){
      .task_id = assign.task_id, .request_id = frame->header.request_id};
  pcp_proto_frame_move(frame, &a.received);
  return push(w, &a);
}

static pcp_status_t on_ready_frame(pcp_proto_worker_t* w,
                                   pcp_proto_frame_t* frame, int64_t now_ns) {
  uint64_t request_id = frame->header.request_id;
  pcp_status_t status = pcp_ok_status();
  switch ((pcp_proto_message_type_t)frame->header.type) {
    case PCP_PROTO_MESSAGE_HEARTBEAT: {
      pcp_proto_heartbeat_t hb;
      status = pcp_proto_heartbeat_parse(frame, &hb);
      if (!status) {
        if (hb.seq <= w->heartbeat_seq_rx) {
          w->dropped++;
        } else {
          w->heartbeat_seq_rx = hb.seq;
        }
      }
      break;
    }
    case PCP_PROTO_MESSAGE_PROGRAM_OFFER:
      status = on_program_offer(w, frame);
      break;
    case PCP_PROTO_MESSAGE_BLOB_CHUNK:
      status = on_blob_chunk(w, frame);
      break;
    case PCP_PROTO_MESSAGE_TASK_ASSIGN:
      status = on_task_assign(w, frame);
      break;
    case PCP_PROTO_MESSAGE_TASK_CANCEL: {
      pcp_proto_task_cancel_t cancel;
      status = pcp_proto_task_cancel_parse(frame, &cancel);
      if (status)
        break;
      task_slot_t* slot = find_task(w, cancel.task_id);
      if (!slot) {
        w->dropped++;  // finished already, or never here
        return pcp_ok_status();
      }
      return push_simple(w, PCP_PROTO_ACTION_CANCEL_TASK, slot->request_id,
                         slot->task_id, pcp_ok_status());
    }
    case PCP_PROTO_MESSAGE_DRAIN: {
      pcp_proto_drain_t d;
      status = pcp_proto_drain_parse(frame, &d);
      if (status)
        break;
      w->state = PCP_PROTO_WORKER_DRAINING;
      return push_simple(w, PCP_PROTO_ACTION_DRAIN, 0, 0, pcp_ok_status());
    }
    case PCP_PROTO_MESSAGE_SHUTDOWN: {
      pcp_proto_shutdown_t s;
      status = pcp_proto_shutdown_parse(frame, &s);
      if (status)
        break;
      pcp_status_t why = pcp_make_status(
          PCP_STATUS_CANCELLED, "gateway shut this worker down: %s", s.reason);
      PCP_RETURN_IF_ERROR_BARE(push_simple(w, PCP_PROTO_ACTION_SHUTDOWN, 0, 0,
                                           pcp_status_clone(why)));
      w->state = PCP_PROTO_WORKER_SHUTDOWN;
      return enter_backoff(w, now_ns, why, true);
    }
    case PCP_PROTO_MESSAGE_ERROR: {
      pcp_status_t peer = pcp_ok_status();
      uint64_t task_id = 0;
      status = pcp_proto_error_parse(frame, &peer, &task_id);
      if (status)
        break;
      if (request_id == 0 && task_id == 0) {
        return enter_backoff(w, now_ns, peer, true);
      }
      // About one request (an offer we fetched badly, say): drop it.
      fetch_t* f = find_fetch(w, request_id);
      if (f)
        remove_fetch(w, f);
      pcp_status_ignore(peer);
      w->dropped++;
      return pcp_ok_status();
    }
    default:
      if (!pcp_proto_message_type_name(frame->header.type)) {
        return send_error(
            w, request_id,
            pcp_make_status(PCP_STATUS_UNIMPLEMENTED, "message type %u",
                            frame->header.type),
            0);
      }
      return fail_peer(
          w, now_ns, request_id,
          pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                          "%s is not valid from a gateway after "
                          "ACCEPT",
                          pcp_proto_message_type_name(frame->header.type)));
  }
  if (status)
    return fail_peer(w, now_ns, request_id, status);
  return pcp_ok_status();
}

static pcp_status_t handle_frame(pcp_proto_worker_t* w,
                                 pcp_proto_frame_t* frame, int64_t now_ns) {
  uint16_t type = frame->header.type;
  switch (w->state) {
    case PCP_PROTO_WORKER_AWAIT_HELLO:
      if (type == PCP_PROTO_MESSAGE_HELLO)
        return on_hello(w, frame, now_ns);
      break;
    case PCP_PROTO_WORKER_AWAIT_CHALLENGE:
      if (type == PCP_PROTO_MESSAGE_CHALLENGE) {
        return on_challenge(w, frame, now_ns);
      }
      if (type == PCP_PROTO_MESSAGE_REJECT)
        return on_reject(w, frame, now_ns);
      break;
    case PCP_PROTO_WORKER_AWAIT_ACCEPT:
      if (type == PCP_PROTO_MESSAGE_ACCEPT)
        return on_accept(w, frame, now_ns);
      if (type == PCP_PROTO_MESSAGE_REJECT)
        return on_reject(w, frame, now_ns);
      break;
    case PCP_PROTO_WORKER_READY:
    case PCP_PROTO_WORKER_DRAINING:
      return on_ready_frame(w, frame, now_ns);
    default:
      return pcp_ok_status();  // not connected: stale bytes
  }
  if (type == PCP_PROTO_MESSAGE_REJECT)
    return on_reject(w, frame, now_ns);
  if (type == PCP_PROTO_MESSAGE_ERROR) {
    pcp_status_t peer = pcp_ok_status();
    uint64_t task_id = 0;
    pcp_status_t status = pcp_proto_error_parse(frame, &peer, &task_id);
    return enter_backoff(w, now_ns, status ? status : peer, true);
  }
  const char* name = pcp_proto_message_type_name(type);
  return fail_peer(w, now_ns, frame->header.request_id,
                   pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                                   "%s (type %u) out of order during the "
                                   "handshake",
                                   name ? name : "unknown", type));
}

//===----------------------------------------------------------------------===//
// Public API
//===----------------------------------------------------------------------===//

pcp_status_t pcp_proto_worker_create(const pcp_proto_worker_config_t* config,
                                     pcp_rng_t* rng, pcp_allocator_t allocator,
                                     pcp_proto_worker_t** out_worker) {
  *out_worker = NULL;
  PCP_RETURN_IF_ERROR(pcp_proto_limits_validate(&config->limits),
                      "worker fabric session");
  if (!pcp_proto_worker_id_is_valid(config->join.worker_id)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "worker id '%s' must be 1..%u bytes of "
                           "[A-Za-z0-9._-]",
                           config->join.worker_id ? config->join.worker_id : "",
                           PCP_PROTO_MAX_STRING_BYTES);
  }
  if (!config->join_token || config->join_token_length == 0 || !rng) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "worker fabric session: join token and rng are "
                           "required");
  }
  void* memory = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(pcp_proto_worker_t), &memory));
  pcp_proto_worker_t* w = memory;
  w->allocator = allocator;
  pcp_status_t status = pcp_allocator_calloc(
      allocator, config->limits.max_in_flight * sizeof(task_slot_t), &memory);
  if (!status) {
    w->tasks = memory;
    status = pcp_allocator_calloc(
        allocator, config->limits.max_blob_assemblies * sizeof(fetch_t),
        &memory);
  }
  if (status) {
    pcp_allocator_free(allocator, w->tasks);
    pcp_allocator_free(allocator, w);
    return status;
  }
  w->fetches = memory;
  w->config = *config;
  w->config.join.has_resume = false;
  w->rng = rng;
  w->timeouts =
      pcp_proto_timeouts_from_heartbeat(config->heartbeat_interval_ms);
  pcp_proto_frame_decoder_initialize(&config->limits, allocator, &w->decoder);
  pcp_proto_frame_decoder_set_data_sink(&w->decoder, blob_data_sink, w);
  pcp_proto_action_queue_initialize(allocator, &w->actions);
  status = pcp_proto_blob_table_initialize(config->limits.max_blob_assemblies,
                                           allocator, &w->blobs);
  if (status) {
    pcp_proto_worker_release(w);
    return status;
  }
  w->state = PCP_PROTO_WORKER_IDLE;
  w->next_request_id = 1;
  *out_worker = w;
  return pcp_ok_status();
}

void pcp_proto_worker_release(pcp_proto_worker_t* w) {
  if (!w)
    return;
  reset_connection(w);
  pcp_proto_frame_decoder_deinitialize(&w->decoder);
  pcp_proto_action_queue_deinitialize(&w->actions);
  pcp_proto_blob_table_deinitialize(&w->blobs);
  pcp_allocator_free(w->allocator, w->fetches);
  pcp_allocator_free(w->allocator, w->tasks);
  pcp_allocator_free(w->allocator, w);
}

static pcp_status_t begin_connect(pcp_proto_worker_t* w, int64_t now_ns) {
  w->state = PCP_PROTO_WORKER_CONNECTING;
  w->attempt_started_ns = now_ns;
  return push_simple(w, PCP_PROTO_ACTION_CONNECT, 0, 0, pcp_ok_status());
}

pcp_status_t pcp_proto_worker_start(pcp_proto_worker_t* w, int64_t now_ns) {
  if (w->state != PCP_PROTO_WORKER_IDLE) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "worker fabric session already started");
  }
  return begin_connect(w, now_ns);
}

pcp_status_t pcp_proto_worker_on_connected(pcp_proto_worker_t* w,
                                           int64_t now_ns) {
  if (w->state != PCP_PROTO_WORKER_CONNECTING) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "on_connected while not connecting");
  }
  reset_connection(w);
  pcp_proto_hello_t hello = {
      .min_version = PCP_PROTO_VERSION_MIN,
      .max_version = PCP_PROTO_VERSION_MAX,
      .role = "worker",
      .software = w->config.software ? w->config.software : "pcp",
  };
  pcp_proto_encoded_frame_t f;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_hello_encode(
      0, 0, &hello, &w->config.limits, w->allocator, &f));
  PCP_RETURN_IF_ERROR_BARE(push_send(w, &f));
  w->state = PCP_PROTO_WORKER_AWAIT_HELLO;
  w->attempt_started_ns = now_ns;
  w->last_rx_ns = now_ns;
  return pcp_ok_status();
}

pcp_status_t pcp_proto_worker_on_closed(pcp_proto_worker_t* w, int64_t now_ns) {
  if (w->state != PCP_PROTO_WORKER_CONNECTING && !connected(w)) {
    return pcp_ok_status();  // we closed it ourselves, or idle
  }
  return enter_backoff(
      w, now_ns,
      pcp_make_status(PCP_STATUS_UNAVAILABLE, "fabric connection closed"),
      false);
}

pcp_status_t pcp_proto_worker_on_bytes(pcp_proto_worker_t* w, const void* data,
                                       size_t byte_length, int64_t now_ns) {
  // Liveness is progress (s.4): any byte proves the gateway alive. On a slow
  // link one frame (a task's inputs) can take longer than 3H to arrive, and
  // the gateway's heartbeats wait behind it on the same stream; a gateway
  // that stops mid-frame still goes silent and is left.
  if (byte_length > 0 && connected(w))
    w->last_rx_ns = now_ns;
  const uint8_t* p = data;
  while (byte_length > 0 && connected(w)) {
    size_t consumed = 0;
    pcp_proto_parse_result_t result = PCP_PROTO_PARSE_NEED_MORE;
    pcp_status_t status = pcp_proto_frame_decoder_feed(
        &w->decoder, p, byte_length, &consumed, &result);
    if (status)
      return fail_peer(w, now_ns, 0, status);
    p += consumed;
    byte_length -= consumed;
    if (result != PCP_PROTO_PARSE_FRAME_READY)
      break;
    pcp_proto_frame_t frame;
    pcp_proto_frame_decoder_take(&w->decoder, &frame);
    status = handle_frame(w, &frame, now_ns);
    pcp_proto_frame_deinitialize(&frame);
    PCP_RETURN_IF_ERROR_BARE(status);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_proto_worker_read_window(pcp_proto_worker_t* w,
                                          void** out_data,
                                          size_t* out_capacity) {
  *out_data = NULL;
  *out_capacity = 0;
  if (!connected(w)) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "fabric worker: not connected");
  }
  return pcp_proto_frame_decoder_window(&w->decoder, out_data, out_capacity);
}

pcp_status_t pcp_proto_worker_read_commit(pcp_proto_worker_t* w,
                                          size_t byte_length, int64_t now_ns) {
  if (!connected(w)) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "fabric worker: not connected");
  }
  if (byte_length > 0)
    w->last_rx_ns = now_ns;  // progress is life, as in on_bytes
  pcp_proto_parse_result_t result = PCP_PROTO_PARSE_NEED_MORE;
  pcp_status_t status =
      pcp_proto_frame_decoder_commit(&w->decoder, byte_length, &result);
  if (status)
    return fail_peer(w, now_ns, 0, status);
  if (result != PCP_PROTO_PARSE_FRAME_READY)
    return pcp_ok_status();
  pcp_proto_frame_t frame;
  pcp_proto_frame_decoder_take(&w->decoder, &frame);
  status = handle_frame(w, &frame, now_ns);
  pcp_proto_frame_deinitialize(&frame);
  return status;
}

pcp_status_t pcp_proto_worker_on_tick(pcp_proto_worker_t* w, int64_t now_ns) {
  switch (w->state) {
    case PCP_PROTO_WORKER_IDLE:
    case PCP_PROTO_WORKER_SHUTDOWN:
      return pcp_ok_status();
    case PCP_PROTO_WORKER_BACKOFF:
      if (now_ns >= w->reconnect_at_ns)
        return begin_connect(w, now_ns);
      return pcp_ok_status();
    case PCP_PROTO_WORKER_CONNECTING:
    case PCP_PROTO_WORKER_AWAIT_HELLO:
    case PCP_PROTO_WORKER_AWAIT_CHALLENGE:
    case PCP_PROTO_WORKER_AWAIT_ACCEPT:
      if (now_ns - w->attempt_started_ns >= w->timeouts.handshake_timeout_ns) {
        return enter_backoff(w, now_ns,
                             pcp_make_status(PCP_STATUS_DEADLINE_EXCEEDED,
                                             "fabric handshake timed out"),
                             true);
      }
      return pcp_ok_status();
    case PCP_PROTO_WORKER_READY:
    case PCP_PROTO_WORKER_DRAINING:
      break;
  }
  if (now_ns - w->last_rx_ns >= w->timeouts.silence_timeout_ns) {
    return enter_backoff(
        w, now_ns,
        pcp_make_status(PCP_STATUS_DEADLINE_EXCEEDED,
                        "gateway silent for %lld ms",
                        (long long)((now_ns - w->last_rx_ns) / 1000000)),
        true);
  }
  if (now_ns >= w->next_heartbeat_ns) {
    pcp_proto_heartbeat_t hb = {.seq = ++w->heartbeat_seq_tx,
                                .ack = w->heartbeat_seq_rx};
    pcp_proto_encoded_frame_t f;
    PCP_RETURN_IF_ERROR_BARE(pcp_proto_heartbeat_encode(
        w->version, 0, &hb, &w->config.limits, w->allocator, &f));
    PCP_RETURN_IF_ERROR_BARE(push_send(w, &f));
    w->next_heartbeat_ns += w->timeouts.heartbeat_interval_ns;
    if (w->next_heartbeat_ns <= now_ns) {
      w->next_heartbeat_ns = now_ns + w->timeouts.heartbeat_interval_ns;
    }
  }
  return pcp_ok_status();
}

static pcp_status_t require_ready(const pcp_proto_worker_t* w,
                                  const char* what) {
  if (w->state != PCP_PROTO_WORKER_READY &&
      w->state != PCP_PROTO_WORKER_DRAINING) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "%s while not joined (state %d)", what,
                           (int)w->state);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_proto_worker_program_lookup_done(pcp_proto_worker_t* w,
                                                  uint64_t request_id,
                                                  bool found, int64_t now_ns) {
  (void)now_ns;
  PCP_RETURN_IF_ERROR_BARE(require_ready(w, "program_lookup_done"));
  fetch_t* f = find_fetch(w, request_id);
  if (!f || f->stage != FETCH_LOOKUP) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "no program lookup %llu",
                           (unsigned long long)request_id);
  }
  pcp_proto_encoded_frame_t frame;
  if (found) {
    pcp_proto_program_ack_t ack = {.status = PCP_PROTO_PROGRAM_CACHED};
    memcpy(ack.program, f->program, sizeof(ack.program));
    remove_fetch(w, f);
    PCP_RETURN_IF_ERROR_BARE(pcp_proto_program_ack_encode(
        w->version, request_id, &ack, &w->config.limits, w->allocator, &frame));
    return push_send(w, &frame);
  }
  pcp_proto_program_fetch_t fetch;
  memcpy(fetch.program, f->program, sizeof(fetch.program));
  f->stage = FETCH_RECEIVING;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_program_fetch_encode(
      w->version, request_id, &fetch, &w->config.limits, w->allocator, &frame));
  return push_send(w, &frame);
}

pcp_status_t pcp_proto_worker_program_stored(pcp_proto_worker_t* w,
                                             uint64_t request_id,
                                             pcp_status_t store_status,
                                             int64_t now_ns) {
  (void)now_ns;
  pcp_status_t status = require_ready(w, "program_stored");
  if (status) {
    pcp_status_ignore(store_status);
    return status;
  }
  fetch_t* f = find_fetch(w, request_id);
  if (!f || f->stage != FETCH_STORING) {
    pcp_status_ignore(store_status);
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "no program store %llu",
                           (unsigned long long)request_id);
  }
  uint8_t program[PCP_SHA256_BYTE_LENGTH];
  memcpy(program, f->program, sizeof(program));
  remove_fetch(w, f);
  if (store_status) {
    return send_error(w, request_id, store_status, 0);
  }
  pcp_proto_program_ack_t ack = {.status = PCP_PROTO_PROGRAM_STORED};
  memcpy(ack.program, program, sizeof(program));
  pcp_proto_encoded_frame_t frame;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_program_ack_encode(
      w->version, request_id, &ack, &w->config.limits, w->allocator, &frame));
  return push_send(w, &frame);
}

pcp_status_t pcp_proto_worker_task_progress(
    pcp_proto_worker_t* w, const pcp_proto_task_progress_t* progress,
    int64_t now_ns) {
  (void)now_ns;
  PCP_RETURN_IF_ERROR_BARE(require_ready(w, "task_progress"));
  task_slot_t* slot = find_task(w, progress->task_id);
  if (!slot) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "task %llu is not running",
                           (unsigned long long)progress->task_id);
  }
  pcp_proto_encoded_frame_t frame;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_proto_task_progress_encode(w->version, slot->request_id, progress,
                                     &w->config.limits, w->allocator, &frame));
  return push_send(w, &frame);
}

pcp_status_t pcp_proto_worker_task_complete(
    pcp_proto_worker_t* w, const pcp_proto_task_result_t* result,
    const pcp_proto_section_t* sections, size_t section_count, int64_t now_ns) {
  (void)now_ns;
  PCP_RETURN_IF_ERROR_BARE(require_ready(w, "task_complete"));
  task_slot_t* slot = find_task(w, result->task_id);
  if (!slot) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND,
                           "task %llu is not running (cancelled or lost in "
                           "a reconnect)",
                           (unsigned long long)result->task_id);
  }
  // Large outputs go first, as tensor blobs with the same request id.
  pcp_proto_outgoing_tensors_t out;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_outgoing_tensors_prepare(
      w->version, slot->request_id, result->task_id, result->outputs,
      result->output_count, sections, section_count, &w->config.limits,
      w->allocator, emit_chunk, w, &out));
  pcp_proto_task_result_t rewritten = *result;
  rewritten.outputs = out.refs;
  pcp_proto_encoded_frame_t frame;
  pcp_status_t status = pcp_proto_task_result_encode(
      w->version, slot->request_id, &rewritten, out.sections, out.section_count,
      &w->config.limits, w->allocator, &frame);
  pcp_proto_outgoing_tensors_deinitialize(&out);
  PCP_RETURN_IF_ERROR_BARE(status);
  *slot = w->tasks[--w->task_count];
  return push_send(w, &frame);
}

pcp_status_t pcp_proto_worker_task_fail(pcp_proto_worker_t* w, uint64_t task_id,
                                        pcp_status_t status, int64_t now_ns) {
  (void)now_ns;
  PCP_RETURN_IF_ERROR_BARE(require_ready(w, "task_fail"));
  task_slot_t* slot = find_task(w, task_id);
  if (!slot) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "task %llu is not running",
                           (unsigned long long)task_id);
  }
  uint64_t request_id = slot->request_id;
  *slot = w->tasks[--w->task_count];
  return send_error(w, request_id, pcp_status_clone(status), task_id);
}

pcp_status_t pcp_proto_worker_drain(pcp_proto_worker_t* w, uint64_t deadline_ms,
                                    int64_t now_ns) {
  (void)now_ns;
  PCP_RETURN_IF_ERROR_BARE(require_ready(w, "drain"));
  pcp_proto_drain_t d = {.deadline_ms = deadline_ms};
  pcp_proto_encoded_frame_t frame;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_drain_encode(
      w->version, 0, &d, &w->config.limits, w->allocator, &frame));
  w->state = PCP_PROTO_WORKER_DRAINING;
  return push_send(w, &frame);
}

bool pcp_proto_worker_next_action(pcp_proto_worker_t* w,
                                  pcp_proto_action_t* out_action) {
  return pcp_proto_action_queue_pop(&w->actions, out_action);
}

pcp_proto_worker_state_t pcp_proto_worker_state(const pcp_proto_worker_t* w) {
  return w->state;
}

int64_t pcp_proto_worker_reconnect_at_ns(const pcp_proto_worker_t* w) {
  return w->reconnect_at_ns;
}

uint32_t pcp_proto_worker_attempt_count(const pcp_proto_worker_t* w) {
  return w->attempts;
}

size_t pcp_proto_worker_in_flight_count(const pcp_proto_worker_t* w) {
  return w->task_count;
}

uint64_t pcp_proto_worker_lease_epoch(const pcp_proto_worker_t* w) {
  return w->lease_epoch;
}

int64_t pcp_proto_worker_deadline_ns(const pcp_proto_worker_t* w) {
  return w->last_rx_ns + w->timeouts.silence_timeout_ns;
}
