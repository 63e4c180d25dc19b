// SPDX-License-Identifier: Apache-2.0
//
// Gateway side of one fabric connection, sans-I/O: bytes, ticks and
// commands in; actions out. See proto.h for the state diagram.

#include <stdlib.h>
#include <string.h>

#include "proto/proto_impl.h"

typedef struct offer_t {
  uint64_t request_id;
  uint8_t program[PCP_SHA256_BYTE_LENGTH];
} offer_t;

typedef struct task_slot_t {
  uint64_t task_id;
  uint64_t request_id;
} task_slot_t;

// Offers awaiting an ACK are bounded like tasks.
#define MAX_OFFERS 64

struct pcp_proto_gateway_conn_t {
  pcp_allocator_t allocator;
  pcp_proto_gateway_config_t config;
  pcp_proto_timeouts_t timeouts;
  pcp_proto_frame_decoder_t decoder;
  pcp_proto_action_queue_t actions;
  pcp_proto_gateway_state_t state;
  uint16_t version;
  int64_t created_ns;
  int64_t last_rx_ns;
  int64_t next_heartbeat_ns;
  uint64_t heartbeat_seq_tx;
  uint64_t heartbeat_seq_rx;
  uint64_t next_request_id;
  uint64_t join_request_id;
  pcp_proto_frame_t join_frame;
  pcp_proto_join_t join;
  bool has_join;
  offer_t offers[MAX_OFFERS];
  size_t offer_count;
  task_slot_t* tasks;
  size_t task_count;
  pcp_proto_blob_table_t blobs;  // result tensors arriving as chunks
  uint64_t dropped;
};

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

static uint16_t send_version(const pcp_proto_gateway_conn_t* c) {
  return c->version ? c->version : PCP_PROTO_VERSION_MAX;
}

static pcp_status_t push(pcp_proto_gateway_conn_t* c,
                         pcp_proto_action_t* action) {
  action->allocator = c->allocator;
  return pcp_proto_action_queue_push(&c->actions, action);
}

static pcp_status_t push_simple(pcp_proto_gateway_conn_t* c,
                                pcp_proto_action_type_t type,
                                uint64_t request_id, uint64_t task_id,
                                pcp_status_t status) {
  pcp_proto_action_t a = {0};
  a.type = type;
  a.request_id = request_id;
  a.task_id = task_id;
  a.status = status;
  return push(c, &a);
}

static pcp_status_t push_send(pcp_proto_gateway_conn_t* c,
                              pcp_proto_encoded_frame_t* frame) {
  pcp_proto_action_t a = {0};
  a.type = PCP_PROTO_ACTION_SEND;
  a.frame = *frame;
  memset(frame, 0, sizeof(*frame));
  return push(c, &a);
}

static pcp_status_t send_error(pcp_proto_gateway_conn_t* c, uint64_t request_id,
                               pcp_status_t status, uint64_t task_id) {
  pcp_proto_encoded_frame_t f;
  pcp_status_t encoded =
      pcp_proto_error_encode(send_version(c), request_id, status, task_id,
                             &c->config.limits, c->allocator, &f);
  pcp_status_ignore(status);  // consumed: the peer gets a copy
  PCP_RETURN_IF_ERROR_BARE(encoded);
  return push_send(c, &f);
}

static pcp_status_t send_reject(pcp_proto_gateway_conn_t* c,
                                pcp_proto_reject_reason_t reason,
                                const char* message) {
  pcp_proto_reject_t r = {.reason = reason, .message = message};
  pcp_proto_encoded_frame_t f;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_proto_reject_encode(send_version(c), c->join_request_id, &r,
                              &c->config.limits, c->allocator, &f));
  return push_send(c, &f);
}

// Ends the connection: CLOSE (when we close it) and one TASK_LOST per task
// still in flight. |why| is consumed.
static pcp_status_t close_conn(pcp_proto_gateway_conn_t* c, pcp_status_t why,
                               bool emit_close) {
  if (c->state == PCP_PROTO_GATEWAY_CLOSED) {
    pcp_status_ignore(why);
    return pcp_ok_status();
  }
  c->state = PCP_PROTO_GATEWAY_CLOSED;
  pcp_status_t status = pcp_ok_status();
  if (emit_close) {
    status = push_simple(c, PCP_PROTO_ACTION_CLOSE, 0, 0, why);
  } else {
    pcp_status_ignore(why);
  }
  for (size_t i = 0; i < c->task_count && !status; ++i) {
    status = push_simple(c, PCP_PROTO_ACTION_TASK_LOST, c->tasks[i].request_id,
                         c->tasks[i].task_id, pcp_ok_status());
  }
  c->task_count = 0;
  c->offer_count = 0;
  pcp_proto_blob_table_clear(&c->blobs);
  return status;
}

// A peer error that ends the connection: ERROR (or REJECT while
// handshaking) then CLOSE. |why| is consumed.
static pcp_status_t fail_peer(pcp_proto_gateway_conn_t* c, uint64_t request_id,
                              pcp_status_t why,
                              pcp_proto_reject_reason_t reject_reason) {
  pcp_status_t status;
  if (c->state < PCP_PROTO_GATEWAY_ACCEPTED && reject_reason) {
    status = send_reject(c, reject_reason, pcp_status_message(why));
  } else {
    status = send_error(c, request_id, pcp_status_clone(why), 0);
  }
  return pcp_status_join(status, close_conn(c, why, true));
}

static task_slot_t* find_task(pcp_proto_gateway_conn_t* c, uint64_t task_id) {
  for (size_t i = 0; i < c->task_count; ++i) {
    if (c->tasks[i].task_id == task_id)
      return &c->tasks[i];
  }
  return NULL;
}

static task_slot_t* find_task_by_request(pcp_proto_gateway_conn_t* c,
                                         uint64_t request_id) {
  for (size_t i = 0; i < c->task_count; ++i) {
    if (c->tasks[i].request_id == request_id)
      return &c->tasks[i];
  }
  return NULL;
}

static void remove_task(pcp_proto_gateway_conn_t* c, task_slot_t* slot) {
  *slot = c->tasks[--c->task_count];
}

static offer_t* find_offer(pcp_proto_gateway_conn_t* c, uint64_t request_id) {
  for (size_t i = 0; i < c->offer_count; ++i) {
    if (c->offers[i].request_id == request_id)
      return &c->offers[i];
  }
  return NULL;
}

static void remove_offer(pcp_proto_gateway_conn_t* c, offer_t* offer) {
  *offer = c->offers[--c->offer_count];
}

//===----------------------------------------------------------------------===//
// Frames from the worker
//===----------------------------------------------------------------------===//

static pcp_status_t on_hello(pcp_proto_gateway_conn_t* c,
                             pcp_proto_frame_t* frame) {
  pcp_proto_hello_t hello;
  pcp_status_t status = pcp_proto_hello_parse(frame, &hello);
  if (status) {
    return fail_peer(c, 0, status, PCP_PROTO_REJECT_PROTOCOL_VIOLATION);
  }
  uint16_t selected =
      pcp_proto_version_select(PCP_PROTO_VERSION_MIN, PCP_PROTO_VERSION_MAX,
                               hello.min_version, hello.max_version);
  pcp_proto_hello_t reply = {
      .min_version = PCP_PROTO_VERSION_MIN,
      .max_version = PCP_PROTO_VERSION_MAX,
      .selected_version = selected,
      .has_selected_version = true,
      .role = "gateway",
      .software = c->config.software ? c->config.software : "pcp",
  };
  pcp_proto_encoded_frame_t f;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_hello_encode(
      0, 0, &reply, &c->config.limits, c->allocator, &f));
  PCP_RETURN_IF_ERROR_BARE(push_send(c, &f));
  if (selected == 0) {
    return fail_peer(
        c, 0,
        pcp_make_status(PCP_STATUS_INCOMPATIBLE,
                        "no common fabric version: worker %u..%u, gateway "
                        "%u..%u",
                        hello.min_version, hello.max_version,
                        PCP_PROTO_VERSION_MIN, PCP_PROTO_VERSION_MAX),
        PCP_PROTO_REJECT_VERSION_UNSUPPORTED);
  }
  c->version = selected;
  pcp_proto_frame_decoder_set_version(&c->decoder, selected);
  pcp_proto_challenge_t challenge;
  memcpy(challenge.nonce, c->config.nonce, sizeof(challenge.nonce));
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_challenge_encode(
      c->version, 0, &challenge, &c->config.limits, c->allocator, &f));
  PCP_RETURN_IF_ERROR_BARE(push_send(c, &f));
  c->state = PCP_PROTO_GATEWAY_AWAIT_JOIN;
  return pcp_ok_status();
}

static pcp_status_t on_join(pcp_proto_gateway_conn_t* c,
                            pcp_proto_frame_t* frame) {
  c->join_request_id = frame->header.request_id;
  pcp_proto_frame_move(frame, &c->join_frame);
  pcp_status_t status = pcp_proto_join_parse(&c->join_frame, &c->join);
  if (status)
    return fail_peer(c, 0, status, PCP_PROTO_REJECT_BAD_JOIN);
  c->has_join = true;
  c->state = PCP_PROTO_GATEWAY_AWAIT_PROOF;
  return pcp_ok_status();
}

static pcp_status_t on_join_proof(pcp_proto_gateway_conn_t* c,
                                  pcp_proto_frame_t* frame) {
  pcp_proto_join_proof_t proof;
  pcp_status_t status = pcp_proto_join_proof_parse(frame, &proof);
  if (status)
    return fail_peer(c, 0, status, PCP_PROTO_REJECT_BAD_JOIN);
  bool ok = strcmp(proof.worker_id, c->join.worker_id) == 0 &&
            pcp_proto_join_mac_verify(
                c->config.join_token, c->config.join_token_length,
                c->config.nonce, proof.worker_id, proof.mac);
  if (!ok) {
    return fail_peer(c, 0,
                     pcp_make_status(PCP_STATUS_UNAUTHENTICATED,
                                     "worker '%s': join proof does not "
                                     "match the join token",
                                     c->join.worker_id),
                     PCP_PROTO_REJECT_AUTH_FAILED);
  }
  c->state = PCP_PROTO_GATEWAY_VERIFIED;
  return push_simple(c, PCP_PROTO_ACTION_JOIN_VERIFIED, c->join_request_id, 0,
                     pcp_ok_status());
}

static pcp_status_t on_error_frame(pcp_proto_gateway_conn_t* c,
                                   pcp_proto_frame_t* frame) {
  pcp_status_t peer = pcp_ok_status();
  uint64_t task_id = 0;
  pcp_status_t status = pcp_proto_error_parse(frame, &peer, &task_id);
  if (status)
    return fail_peer(c, frame->header.request_id, status, 0);
  task_slot_t* slot = task_id ? find_task(c, task_id) : NULL;
  if (slot) {
    uint64_t request_id = slot->request_id;
    remove_task(c, slot);
    return push_simple(c, PCP_PROTO_ACTION_TASK_FAILED, request_id, task_id,
                       peer);
  }
  offer_t* offer = task_id ? NULL : find_offer(c, frame->header.request_id);
  if (offer) {
    pcp_proto_action_t a = {0};
    a.type = PCP_PROTO_ACTION_PROGRAM_FAILED;
    a.request_id = offer->request_id;
    a.status = peer;
    memcpy(a.program, offer->program, sizeof(a.program));
    remove_offer(c, offer);
    return push(c, &a);
  }
  if (task_id == 0 && frame->header.request_id == 0) {
    // A connection-level error: the worker closes after it.
    return close_conn(c, peer, true);
  }
  c->dropped++;  // about a task or offer we no longer track
  pcp_status_ignore(peer);
  return pcp_ok_status();
}

static pcp_status_t on_accepted_frame(pcp_proto_gateway_conn_t* c,
                                      pcp_proto_frame_t* frame) {
  uint64_t request_id = frame->header.request_id;
  pcp_status_t status = pcp_ok_status();
  switch ((pcp_proto_message_type_t)frame->header.type) {
    case PCP_PROTO_MESSAGE_HEARTBEAT: {
      pcp_proto_heartbeat_t hb;
      status = pcp_proto_heartbeat_parse(frame, &hb);
      if (status)
        break;
      if (hb.seq <= c->heartbeat_seq_rx) {
        c->dropped++;  // duplicate or reordered: still proof of life
      } else {
        c->heartbeat_seq_rx = hb.seq;
      }
      return pcp_ok_status();
    }
    case PCP_PROTO_MESSAGE_PROGRAM_FETCH: {
      pcp_proto_program_fetch_t fetch;
      status = pcp_proto_program_fetch_parse(frame, &fetch);
      if (status)
        break;
      offer_t* offer = find_offer(c, request_id);
      if (!offer || memcmp(offer->program, fetch.program, 32) != 0) {
        return send_error(c, request_id,
                          pcp_make_status(PCP_STATUS_NOT_FOUND,
                                          "no offer with request id %llu",
                                          (unsigned long long)request_id),
                          0);
      }
      pcp_proto_action_t a = {0};
      a.type = PCP_PROTO_ACTION_PROGRAM_FETCH;
      a.request_id = request_id;
      memcpy(a.program, fetch.program, sizeof(a.program));
      return push(c, &a);
    }
    case PCP_PROTO_MESSAGE_PROGRAM_ACK: {
      pcp_proto_program_ack_t ack;
      status = pcp_proto_program_ack_parse(frame, &ack);
      if (status)
        break;
      offer_t* offer = find_offer(c, request_id);
      if (!offer || memcmp(offer->program, ack.program, 32) != 0) {
        c->dropped++;
        return pcp_ok_status();
      }
      remove_offer(c, offer);
      pcp_proto_action_t a = {0};
      a.type = PCP_PROTO_ACTION_PROGRAM_READY;
      a.request_id = request_id;
      memcpy(a.program, ack.program, sizeof(a.program));
      return push(c, &a);
    }
    case PCP_PROTO_MESSAGE_TASK_PROGRESS:
    case PCP_PROTO_MESSAGE_TASK_RESULT: {
      uint64_t task_id = 0;
      bool result = frame->header.type == PCP_PROTO_MESSAGE_TASK_RESULT;
      if (result) {
        pcp_proto_task_result_t r;
        status = pcp_proto_task_result_parse(frame, &r);
        task_id = r.task_id;
      } else {
        pcp_proto_task_progress_t p;
        status = pcp_proto_task_progress_parse(frame, &p);
        task_id = p.task_id;
      }
      if (status)
        break;
      task_slot_t* slot = find_task(c, task_id);
      if (!slot || slot->request_id != request_id) {
        // Already answered, cancelled or reassigned: never double-complete.
        c->dropped++;
        return pcp_ok_status();
      }
      if (result)
        remove_task(c, slot);
      pcp_proto_action_t a = {0};
      a.type = result ? PCP_PROTO_ACTION_TASK_RESULT
                      : PCP_PROTO_ACTION_TASK_PROGRESS;
      a.request_id = request_id;
      a.task_id = task_id;
      a.allocator = c->allocator;
      if (result) {
        pcp_proto_task_result_t r;
        status = pcp_proto_task_result_parse(frame, &r);
        if (!status) {
          status = pcp_proto_blob_table_attach(&c->blobs, request_id, r.outputs,
                                               r.output_count, &a);
        }
        if (status) {
          // The result cannot be used: the task failed.
          pcp_proto_action_deinitialize(&a);
          return push_simple(
              c, PCP_PROTO_ACTION_TASK_FAILED, request_id, task_id,
              pcp_status_annotate_f(status, "task %llu result",
                                    (unsigned long long)task_id));
        }
      }
      pcp_proto_frame_move(frame, &a.received);
      return push(c, &a);
    }
    case PCP_PROTO_MESSAGE_BLOB_CHUNK: {
      pcp_proto_blob_chunk_t chunk;
      status = pcp_proto_blob_chunk_parse(frame, &chunk);
      if (status)
        break;
      if (chunk.kind != PCP_PROTO_BLOB_TENSOR ||
          !find_task_by_request(c, request_id)) {
        c->dropped++;  // a result blob for a task no longer in flight
        return pcp_ok_status();
      }
      pcp_status_t added = pcp_proto_blob_table_add(&c->blobs, request_id,
                                                    &chunk, &c->config.limits);
      // A bad chunk fails its task when the result arrives without it.
      if (added)
        return send_error(c, request_id, added, 0);
      return pcp_ok_status();
    }
    case PCP_PROTO_MESSAGE_ERROR:
      return on_error_frame(c, frame);
    case PCP_PROTO_MESSAGE_DRAIN: {
      pcp_proto_drain_t d;
      status = pcp_proto_drain_parse(frame, &d);
      if (status)
        break;
      c->state = PCP_PROTO_GATEWAY_DRAINING;
      return push_simple(c, PCP_PROTO_ACTION_PEER_DRAINING, 0, 0,
                         pcp_ok_status());
    }
    default:
      if (!pcp_proto_message_type_name(frame->header.type)) {
        // Well-formed but unknown: say so and carry on (s.3).
        return send_error(
            c, request_id,
            pcp_make_status(PCP_STATUS_UNIMPLEMENTED, "message type %u",
                            frame->header.type),
            0);
      }
      return fail_peer(
          c, request_id,
          pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                          "%s is not valid from a worker after "
                          "ACCEPT",
                          pcp_proto_message_type_name(frame->header.type)),
          0);
  }
  // A frame of a known type whose JSON is wrong.
  return fail_peer(c, request_id, status, 0);
}

static pcp_status_t handle_frame(pcp_proto_gateway_conn_t* c,
                                 pcp_proto_frame_t* frame) {
  uint16_t type = frame->header.type;
  switch (c->state) {
    case PCP_PROTO_GATEWAY_AWAIT_HELLO:
      if (type == PCP_PROTO_MESSAGE_HELLO)
        return on_hello(c, frame);
      break;
    case PCP_PROTO_GATEWAY_AWAIT_JOIN:
      if (type == PCP_PROTO_MESSAGE_JOIN)
        return on_join(c, frame);
      break;
    case PCP_PROTO_GATEWAY_AWAIT_PROOF:
      if (type == PCP_PROTO_MESSAGE_JOIN_PROOF)
        return on_join_proof(c, frame);
      break;
    case PCP_PROTO_GATEWAY_VERIFIED:
      if (type == PCP_PROTO_MESSAGE_HEARTBEAT)
        return pcp_ok_status();
      break;
    case PCP_PROTO_GATEWAY_ACCEPTED:
    case PCP_PROTO_GATEWAY_DRAINING:
      return on_accepted_frame(c, frame);
    case PCP_PROTO_GATEWAY_CLOSED:
      return pcp_ok_status();
  }
  if (type == PCP_PROTO_MESSAGE_ERROR)
    return on_error_frame(c, frame);
  const char* name = pcp_proto_message_type_name(type);
  return fail_peer(c, frame->header.request_id,
                   pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                                   "%s (type %u) out of order during the "
                                   "handshake",
                                   name ? name : "unknown", type),
                   PCP_PROTO_REJECT_PROTOCOL_VIOLATION);
}

//===----------------------------------------------------------------------===//
// Public API
//===----------------------------------------------------------------------===//

// Decoder data sink: a result tensor's chunk is read from the socket
// straight into its blob buffer (zero copy on receive, docs/decisions.md).
static uint8_t* blob_data_sink(void* user_data, pcp_proto_frame_t* head,
                               uint64_t data_length) {
  pcp_proto_gateway_conn_t* c = user_data;
  uint64_t request_id = head->header.request_id;
  if ((c->state != PCP_PROTO_GATEWAY_ACCEPTED &&
       c->state != PCP_PROTO_GATEWAY_DRAINING) ||
      !find_task_by_request(c, request_id)) {
    return NULL;
  }
  pcp_proto_blob_chunk_t chunk;
  pcp_status_t status = pcp_proto_blob_chunk_parse(head, &chunk);
  if (status || chunk.data_length != data_length) {
    pcp_status_ignore(status);
    return NULL;
  }
  return pcp_proto_blob_table_dest(&c->blobs, request_id, &chunk,
                                   &c->config.limits);
}

pcp_status_t pcp_proto_gateway_conn_create(
    const pcp_proto_gateway_config_t* config, int64_t now_ns,
    pcp_allocator_t allocator, pcp_proto_gateway_conn_t** out_conn) {
  *out_conn = NULL;
  PCP_RETURN_IF_ERROR(pcp_proto_limits_validate(&config->limits),
                      "gateway fabric connection");
  if (!config->join_token || config->join_token_length == 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "gateway fabric connection: empty join token");
  }
  void* memory = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_allocator_calloc(
      allocator, sizeof(pcp_proto_gateway_conn_t), &memory));
  pcp_proto_gateway_conn_t* c = memory;
  pcp_status_t status = pcp_allocator_calloc(
      allocator, config->limits.max_in_flight * sizeof(task_slot_t), &memory);
  if (status) {
    pcp_allocator_free(allocator, c);
    return status;
  }
  c->tasks = memory;
  c->allocator = allocator;
  c->config = *config;
  c->timeouts =
      pcp_proto_timeouts_from_heartbeat(config->heartbeat_interval_ms);
  c->config.heartbeat_interval_ms =
      (uint32_t)(c->timeouts.heartbeat_interval_ns / 1000000);
  pcp_proto_frame_decoder_initialize(&config->limits, allocator, &c->decoder);
  pcp_proto_frame_decoder_set_data_sink(&c->decoder, blob_data_sink, c);
  pcp_proto_action_queue_initialize(allocator, &c->actions);
  status = pcp_proto_blob_table_initialize(config->limits.max_blob_assemblies,
                                           allocator, &c->blobs);
  if (status) {
    pcp_proto_gateway_conn_release(c);
    return status;
  }
  c->state = PCP_PROTO_GATEWAY_AWAIT_HELLO;
  c->created_ns = now_ns;
  c->last_rx_ns = now_ns;
  c->next_request_id = 1;
  *out_conn = c;
  return pcp_ok_status();
}

void pcp_proto_gateway_conn_release(pcp_proto_gateway_conn_t* c) {
  if (!c)
    return;
  pcp_proto_frame_decoder_deinitialize(&c->decoder);
  pcp_proto_action_queue_deinitialize(&c->actions);
  pcp_proto_frame_deinitialize(&c->join_frame);
  pcp_proto_blob_table_deinitialize(&c->blobs);
  pcp_allocator_free(c->allocator, c->tasks);
  pcp_allocator_free(c->allocator, c);
}

pcp_status_t pcp_proto_gateway_conn_on_bytes(pcp_proto_gateway_conn_t* c,
                                             const void* data,
                                             size_t byte_length,
                                             int64_t now_ns) {
  // Liveness is progress (s.4): any byte proves the peer alive, not only a
  // complete frame. On a slow link one frame (a task's result) can take
  // longer than 3H to arrive, and the worker's heartbeats wait behind it on
  // the same stream; a stalled peer still goes silent and is evicted.
  if (byte_length > 0 && c->state != PCP_PROTO_GATEWAY_CLOSED)
    c->last_rx_ns = now_ns;
  const uint8_t* p = data;
  while (byte_length > 0 && c->state != PCP_PROTO_GATEWAY_CLOSED) {
    size_t consumed = 0;
    pcp_proto_parse_result_t result = PCP_PROTO_PARSE_NEED_MORE;
    pcp_status_t status = pcp_proto_frame_decoder_feed(
        &c->decoder, p, byte_length, &consumed, &result);
    if (status) {
      return fail_peer(c, 0, status, PCP_PROTO_REJECT_PROTOCOL_VIOLATION);
    }
    p += consumed;
    byte_length -= consumed;
    if (result != PCP_PROTO_PARSE_FRAME_READY)
      break;
    pcp_proto_frame_t frame;
    pcp_proto_frame_decoder_take(&c->decoder, &frame);
    status = handle_frame(c, &frame);
    pcp_proto_frame_deinitialize(&frame);
    PCP_RETURN_IF_ERROR_BARE(status);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_proto_gateway_conn_on_tick(pcp_proto_gateway_conn_t* c,
                                            int64_t now_ns) {
  switch (c->state) {
    case PCP_PROTO_GATEWAY_CLOSED:
      return pcp_ok_status();
    case PCP_PROTO_GATEWAY_AWAIT_HELLO:
    case PCP_PROTO_GATEWAY_AWAIT_JOIN:
    case PCP_PROTO_GATEWAY_AWAIT_PROOF:
    case PCP_PROTO_GATEWAY_VERIFIED:
      if (now_ns - c->created_ns >= c->timeouts.handshake_timeout_ns) {
        return fail_peer(
            c, 0,
            pcp_make_status(
                PCP_STATUS_DEADLINE_EXCEEDED,
                "handshake not finished within "
                "%lld ms",
                (long long)(c->timeouts.handshake_timeout_ns / 1000000)),
            PCP_PROTO_REJECT_HANDSHAKE_TIMEOUT);
      }
      return pcp_ok_status();
    case PCP_PROTO_GATEWAY_ACCEPTED:
    case PCP_PROTO_GATEWAY_DRAINING:
      break;
  }
  if (now_ns - c->last_rx_ns >= c->timeouts.silence_timeout_ns) {
    PCP_RETURN_IF_ERROR_BARE(
        push_simple(c, PCP_PROTO_ACTION_EVICT, 0, 0, pcp_ok_status()));
    return close_conn(
        c,
        pcp_make_status(PCP_STATUS_DEADLINE_EXCEEDED,
                        "worker '%s' silent for %lld ms (limit %lld ms)",
                        c->join.worker_id,
                        (long long)((now_ns - c->last_rx_ns) / 1000000),
                        (long long)(c->timeouts.silence_timeout_ns / 1000000)),
        true);
  }
  if (now_ns >= c->next_heartbeat_ns) {
    pcp_proto_heartbeat_t hb = {.seq = ++c->heartbeat_seq_tx,
                                .ack = c->heartbeat_seq_rx};
    pcp_proto_encoded_frame_t f;
    PCP_RETURN_IF_ERROR_BARE(pcp_proto_heartbeat_encode(
        c->version, 0, &hb, &c->config.limits, c->allocator, &f));
    PCP_RETURN_IF_ERROR_BARE(push_send(c, &f));
    // Next beat one period after this one, without bursts after a stall.
    c->next_heartbeat_ns += c->timeouts.heartbeat_interval_ns;
    if (c->next_heartbeat_ns <= now_ns) {
      c->next_heartbeat_ns = now_ns + c->timeouts.heartbeat_interval_ns;
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_proto_gateway_conn_on_closed(pcp_proto_gateway_conn_t* c,
                                              int64_t now_ns) {
  (void)now_ns;
  return close_conn(c,
                    pcp_make_status(PCP_STATUS_UNAVAILABLE,
                                    "fabric connection closed by the peer"),
                    false);
}

static pcp_status_t require_state(const pcp_proto_gateway_conn_t* c, bool ok,
                                  const char* what) {
  if (!ok) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "%s in fabric connection state %d", what,
                           (int)c->state);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_proto_gateway_conn_accept(
    pcp_proto_gateway_conn_t* c,
    const pcp_proto_gateway_accept_params_t* params, int64_t now_ns) {
  PCP_RETURN_IF_ERROR_BARE(
      require_state(c, c->state == PCP_PROTO_GATEWAY_VERIFIED, "accept"));
  pcp_proto_accept_t accept = {
      .worker_id = c->join.worker_id,
      .lease_epoch = params->lease_epoch,
      .resumed = params->resumed,
      .heartbeat_interval_ms = c->config.heartbeat_interval_ms,
      .max_frame_bytes = c->config.limits.max_frame_bytes,
      .max_chunk_bytes = c->config.limits.max_chunk_bytes,
      .max_in_flight = c->config.limits.max_in_flight,
  };
  memcpy(accept.resume_token, params->resume_token,
         sizeof(accept.resume_token));
  pcp_proto_encoded_frame_t f;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_proto_accept_encode(c->version, c->join_request_id, &accept,
                              &c->config.limits, c->allocator, &f));
  PCP_RETURN_IF_ERROR_BARE(push_send(c, &f));
  c->state = PCP_PROTO_GATEWAY_ACCEPTED;
  c->last_rx_ns = now_ns;
  c->next_heartbeat_ns = now_ns + c->timeouts.heartbeat_interval_ns;
  return pcp_ok_status();
}

pcp_status_t pcp_proto_gateway_conn_reject(pcp_proto_gateway_conn_t* c,
                                           pcp_proto_reject_reason_t reason,
                                           const char* message,
                                           int64_t now_ns) {
  (void)now_ns;
  PCP_RETURN_IF_ERROR_BARE(
      require_state(c, c->state < PCP_PROTO_GATEWAY_ACCEPTED, "reject"));
  PCP_RETURN_IF_ERROR_BARE(send_reject(c, reason, message));
  return close_conn(
      c,
      pcp_make_status(PCP_STATUS_PERMISSION_DENIED, "rejected: %s: %s",
                      pcp_proto_reject_reason_name(reason),
                      message ? message : ""),
      true);
}

static bool accepted(const pcp_proto_gateway_conn_t* c) {
  return c->state == PCP_PROTO_GATEWAY_ACCEPTED;
}

pcp_status_t pcp_proto_gateway_conn_offer_program(
    pcp_proto_gateway_conn_t* c, const pcp_proto_program_offer_t* offer,
    int64_t now_ns, uint64_t* out_request_id) {
  (void)now_ns;
  *out_request_id = 0;
  PCP_RETURN_IF_ERROR_BARE(require_state(c, accepted(c), "offer_program"));
  if (c->offer_count == MAX_OFFERS) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "%d program offers already pending", MAX_OFFERS);
  }
  uint64_t request_id = c->next_request_id++;
  pcp_proto_encoded_frame_t f;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_program_offer_encode(
      c->version, request_id, offer, &c->config.limits, c->allocator, &f));
  PCP_RETURN_IF_ERROR_BARE(push_send(c, &f));
  offer_t* o = &c->offers[c->offer_count++];
  o->request_id = request_id;
  memcpy(o->program, offer->program, sizeof(o->program));
  *out_request_id = request_id;
  return pcp_ok_status();
}

static pcp_status_t emit_chunk(void* user_data,
                               pcp_proto_encoded_frame_t* frame) {
  return push_send((pcp_proto_gateway_conn_t*)user_data, frame);
}

pcp_status_t pcp_proto_gateway_conn_send_program(pcp_proto_gateway_conn_t* c,
                                                 uint64_t request_id,
                                                 const void* data,
                                                 uint64_t byte_length,
                                                 int64_t now_ns) {
  (void)now_ns;
  PCP_RETURN_IF_ERROR_BARE(
      require_state(c, accepted(c) || c->state == PCP_PROTO_GATEWAY_DRAINING,
                    "send_program"));
  offer_t* offer = find_offer(c, request_id);
  if (!offer) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND,
                           "no pending program offer %llu",
                           (unsigned long long)request_id);
  }
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_proto_hex_encode(offer->program, sizeof(offer->program), hex);
  return pcp_proto_blob_encode_chunks(
      c->version, request_id, hex, PCP_PROTO_BLOB_PROGRAM, data, byte_length,
      &c->config.limits, c->allocator, emit_chunk, c);
}

pcp_status_t pcp_proto_gateway_conn_assign_task(
    pcp_proto_gateway_conn_t* c, const pcp_proto_task_assign_t* task,
    const pcp_proto_section_t* sections, size_t section_count, int64_t now_ns,
    uint64_t* out_request_id) {
  (void)now_ns;
  *out_request_id = 0;
  PCP_RETURN_IF_ERROR_BARE(require_state(c, accepted(c), "assign_task"));
  if (find_task(c, task->task_id)) {
    return pcp_make_status(PCP_STATUS_ALREADY_EXISTS,
                           "task %llu already in flight on this worker",
                           (unsigned long long)task->task_id);
  }
  if (c->task_count >= c->config.limits.max_in_flight) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "%zu tasks in flight (limit %u)", c->task_count,
                           c->config.limits.max_in_flight);
  }
  uint64_t request_id = c->next_request_id++;
  // Large inputs go first, as tensor blobs with the same request id.
  pcp_proto_outgoing_tensors_t out;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_outgoing_tensors_prepare(
      c->version, request_id, task->task_id, task->inputs, task->input_count,
      sections, section_count, &c->config.limits, c->allocator, emit_chunk, c,
      &out));
  pcp_proto_task_assign_t rewritten = *task;
  rewritten.inputs = out.refs;
  pcp_proto_encoded_frame_t f;
  pcp_status_t status = pcp_proto_task_assign_encode(
      c->version, request_id, &rewritten, out.sections, out.section_count,
      &c->config.limits, c->allocator, &f);
  pcp_proto_outgoing_tensors_deinitialize(&out);
  PCP_RETURN_IF_ERROR_BARE(status);
  PCP_RETURN_IF_ERROR_BARE(push_send(c, &f));
  c->tasks[c->task_count++] =
      (task_slot_t){.task_id = task->task_id, .request_id = request_id};
  *out_request_id = request_id;
  return pcp_ok_status();
}

pcp_status_t pcp_proto_gateway_conn_cancel_task(pcp_proto_gateway_conn_t* c,
                                                uint64_t task_id,
                                                const char* reason,
                                                int64_t now_ns) {
  (void)now_ns;
  task_slot_t* slot = find_task(c, task_id);
  if (!slot || c->state == PCP_PROTO_GATEWAY_CLOSED) {
    return pcp_make_status(PCP_STATUS_NOT_FOUND, "task %llu not in flight",
                           (unsigned long long)task_id);
  }
  pcp_proto_task_cancel_t cancel = {.task_id = task_id, .reason = reason};
  pcp_proto_encoded_frame_t f;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_proto_task_cancel_encode(c->version, slot->request_id, &cancel,
                                   &c->config.limits, c->allocator, &f));
  // The slot stays until the worker answers (ERROR CANCELLED or RESULT).
  return push_send(c, &f);
}

pcp_status_t pcp_proto_gateway_conn_drain(pcp_proto_gateway_conn_t* c,
                                          uint64_t deadline_ms,
                                          int64_t now_ns) {
  (void)now_ns;
  PCP_RETURN_IF_ERROR_BARE(require_state(c, accepted(c), "drain"));
  pcp_proto_drain_t d = {.deadline_ms = deadline_ms};
  pcp_proto_encoded_frame_t f;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_drain_encode(
      c->version, 0, &d, &c->config.limits, c->allocator, &f));
  PCP_RETURN_IF_ERROR_BARE(push_send(c, &f));
  c->state = PCP_PROTO_GATEWAY_DRAINING;
  return pcp_ok_status();
}

pcp_status_t pcp_proto_gateway_conn_shutdown(pcp_proto_gateway_conn_t* c,
                                             const char* reason,
                                             int64_t now_ns) {
  (void)now_ns;
  PCP_RETURN_IF_ERROR_BARE(require_state(
      c, accepted(c) || c->state == PCP_PROTO_GATEWAY_DRAINING, "shutdown"));
  pcp_proto_shutdown_t s = {.reason = reason};
  pcp_proto_encoded_frame_t f;
  PCP_RETURN_IF_ERROR_BARE(pcp_proto_shutdown_encode(
      c->version, 0, &s, &c->config.limits, c->allocator, &f));
  PCP_RETURN_IF_ERROR_BARE(push_send(c, &f));
  return close_conn(c,
                    pcp_make_status(PCP_STATUS_CANCELLED, "shutdown: %s",
                                    reason ? reason : ""),
                    true);
}

pcp_status_t pcp_proto_gateway_conn_fail(pcp_proto_gateway_conn_t* c,
                                         pcp_status_t status, int64_t now_ns) {
  (void)now_ns;
  if (c->state == PCP_PROTO_GATEWAY_CLOSED)
    return pcp_ok_status();
  return fail_peer(c, 0, pcp_status_clone(status), 0);
}

bool pcp_proto_gateway_conn_next_action(pcp_proto_gateway_conn_t* c,
                                        pcp_proto_action_t* out_action) {
  return pcp_proto_action_queue_pop(&c->actions, out_action);
}

pcp_proto_gateway_state_t pcp_proto_gateway_conn_state(
    const pcp_proto_gateway_conn_t* c) {
  return c->state;
}

const pcp_proto_join_t* pcp_proto_gateway_conn_join(
    const pcp_proto_gateway_conn_t* c) {
  return c->has_join && c->state >= PCP_PROTO_GATEWAY_VERIFIED ? &c->join
                                                               : NULL;
}

size_t pcp_proto_gateway_conn_in_flight_count(
    const pcp_proto_gateway_conn_t* c) {
  return c->task_count;
}

int64_t pcp_proto_gateway_conn_deadline_ns(const pcp_proto_gateway_conn_t* c) {
  return c->last_rx_ns + c->timeouts.silence_timeout_ns;
}

uint64_t pcp_proto_gateway_conn_dropped_count(
    const pcp_proto_gateway_conn_t* c) {
  return c->dropped;
}
