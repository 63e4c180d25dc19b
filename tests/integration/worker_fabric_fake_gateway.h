// SPDX-License-Identifier: Apache-2.0
//
// A scripted fake gateway for worker integration tests: blocking sockets on
// 127.0.0.1 and src/proto's codec, nothing of the real gateway. The test
// says what to send and what it expects back; while it waits, the fake
// sends heartbeats every H (once it has sent ACCEPT) and counts the
// worker's, so a worker that stays joined across a long step sees a live
// peer. Every wait is bounded. Single-threaded; header-only (static
// functions) so each integration test can include it.

#ifndef PCP_TESTS_INTEGRATION_WORKER_FABRIC_FAKE_GATEWAY_H_
#define PCP_TESTS_INTEGRATION_WORKER_FABRIC_FAKE_GATEWAY_H_

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"
#include "proto/proto.h"

typedef struct fake_gateway_t {
  int listen_fd;
  uint16_t port;
  int fd;  // -1 when no connection
  pcp_proto_limits_t limits;
  pcp_proto_frame_decoder_t decoder;
  uint16_t version;
  uint32_t heartbeat_ms;  // 0: no heartbeats yet (before ACCEPT)
  uint64_t heartbeat_seq;
  int64_t next_heartbeat_ns;
  uint64_t next_request_id;
  uint64_t worker_heartbeats;
  bool eof;
  uint8_t buffer[64 << 10];
  size_t buffer_length;
  size_t buffer_offset;
} fake_gateway_t;

static inline int64_t fake_gateway_now_ns(void) {
  return pcp_clock_now_ns(pcp_clock_system());
}

// Listens on 127.0.0.1 with an ephemeral port.
static inline bool fake_gateway_listen(fake_gateway_t* gw) {
  memset(gw, 0, sizeof(*gw));
  gw->fd = -1;
  gw->limits = pcp_proto_limits_default();
  gw->next_request_id = 1;
  gw->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  if (gw->listen_fd < 0)
    return false;
  int one = 1;
  setsockopt(gw->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(gw->listen_fd, (struct sockaddr*)&addr, sizeof(addr)) != 0 ||
      listen(gw->listen_fd, 16) != 0) {
    return false;
  }
  socklen_t length = sizeof(addr);
  getsockname(gw->listen_fd, (struct sockaddr*)&addr, &length);
  gw->port = ntohs(addr.sin_port);
  return true;
}

// True when a connection is waiting to be accepted (within |timeout_ms|).
static inline bool fake_gateway_pending(fake_gateway_t* gw, int timeout_ms) {
  struct pollfd p = {.fd = gw->listen_fd, .events = POLLIN};
  return poll(&p, 1, timeout_ms) == 1;
}

static inline void fake_gateway_disconnect(fake_gateway_t* gw) {
  if (gw->fd >= 0) {
    close(gw->fd);
    gw->fd = -1;
    pcp_proto_frame_decoder_deinitialize(&gw->decoder);
  }
  gw->heartbeat_ms = 0;
  gw->buffer_length = gw->buffer_offset = 0;
}

static inline bool fake_gateway_accept(fake_gateway_t* gw, int timeout_ms) {
  fake_gateway_disconnect(gw);
  if (!fake_gateway_pending(gw, timeout_ms))
    return false;
  gw->fd = accept(gw->listen_fd, NULL, NULL);
  if (gw->fd < 0)
    return false;
  pcp_proto_frame_decoder_initialize(&gw->limits, pcp_allocator_system(),
                                     &gw->decoder);
  gw->version = 0;
  gw->eof = false;
  gw->heartbeat_seq = 0;
  gw->worker_heartbeats = 0;
  gw->next_request_id = 1;
  return true;
}

static inline void fake_gateway_release(fake_gateway_t* gw) {
  fake_gateway_disconnect(gw);
  if (gw->listen_fd >= 0)
    close(gw->listen_fd);
  gw->listen_fd = -1;
}

static inline bool write_all(int fd, const uint8_t* data, size_t length) {
  while (length > 0) {
    ssize_t n = write(fd, data, length);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    data += n;
    length -= (size_t)n;
  }
  return true;
}

// Sends and deinitializes |frame|. A failed encode (|status|) aborts.
static inline bool fake_gateway_send(fake_gateway_t* gw, pcp_status_t status,
                                     pcp_proto_encoded_frame_t* frame) {
  PCP_CHECK_OK(status);
  uint8_t* bytes = NULL;
  size_t length = 0;
  PCP_CHECK_OK(pcp_proto_encoded_frame_flatten(frame, pcp_allocator_system(),
                                               &bytes, &length));
  pcp_proto_encoded_frame_deinitialize(frame);
  bool ok = gw->fd >= 0 && write_all(gw->fd, bytes, length);
  pcp_allocator_free(pcp_allocator_system(), bytes);
  return ok;
}

static inline void fake_gateway_heartbeat_if_due(fake_gateway_t* gw) {
  if (!gw->heartbeat_ms || gw->fd < 0)
    return;
  int64_t now = fake_gateway_now_ns();
  if (now < gw->next_heartbeat_ns)
    return;
  pcp_proto_heartbeat_t hb = {.seq = ++gw->heartbeat_seq,
                              .ack = gw->worker_heartbeats};
  pcp_proto_encoded_frame_t f;
  fake_gateway_send(gw,
                    pcp_proto_heartbeat_encode(gw->version, 0, &hb, &gw->limits,
                                               pcp_allocator_system(), &f),
                    &f);
  gw->next_heartbeat_ns = now + (int64_t)gw->heartbeat_ms * 1000000;
}

// Waits up to |timeout_ms| for the next frame that is not a heartbeat
// (heartbeats are counted). False on timeout or EOF (gw->eof set).
static inline bool fake_gateway_recv(fake_gateway_t* gw, int timeout_ms,
                                     pcp_proto_frame_t* out_frame) {
  memset(out_frame, 0, sizeof(*out_frame));
  if (gw->eof) {
    return false;  // the worker closed: nothing to read, nowhere to write
  }
  int64_t deadline = fake_gateway_now_ns() + (int64_t)timeout_ms * 1000000;
  for (;;) {
    while (gw->buffer_offset < gw->buffer_length) {
      size_t consumed = 0;
      pcp_proto_parse_result_t result = PCP_PROTO_PARSE_NEED_MORE;
      PCP_CHECK_OK(pcp_proto_frame_decoder_feed(
          &gw->decoder, gw->buffer + gw->buffer_offset,
          gw->buffer_length - gw->buffer_offset, &consumed, &result));
      gw->buffer_offset += consumed;
      if (result != PCP_PROTO_PARSE_FRAME_READY)
        break;
      pcp_proto_frame_decoder_take(&gw->decoder, out_frame);
      if (out_frame->header.type == PCP_PROTO_MESSAGE_HEARTBEAT) {
        gw->worker_heartbeats++;
        pcp_proto_frame_deinitialize(out_frame);
        continue;
      }
      return true;
    }
    gw->buffer_offset = gw->buffer_length = 0;
    fake_gateway_heartbeat_if_due(gw);
    int64_t now = fake_gateway_now_ns();
    if (now >= deadline || gw->fd < 0)
      return false;
    int64_t wait_ns = deadline - now;
    if (gw->heartbeat_ms) {
      int64_t until_heartbeat = gw->next_heartbeat_ns - now;
      if (until_heartbeat < wait_ns)
        wait_ns = until_heartbeat;
    }
    if (wait_ns < 0)
      wait_ns = 0;
    struct pollfd p = {.fd = gw->fd, .events = POLLIN};
    int ready = poll(&p, 1, (int)(wait_ns / 1000000) + 1);
    if (ready <= 0)
      continue;
    ssize_t n = read(gw->fd, gw->buffer, sizeof(gw->buffer));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      gw->eof = true;
      return false;
    }
    gw->buffer_length = (size_t)n;
  }
}

// Keeps the connection alive (heartbeats out, frames in) for |ms|. Returns
// the number of non-heartbeat frames that arrived (dropped), or -1 on EOF.
static inline int fake_gateway_idle(fake_gateway_t* gw, int ms) {
  int64_t deadline = fake_gateway_now_ns() + (int64_t)ms * 1000000;
  int frames = 0;
  for (;;) {
    int64_t left = (deadline - fake_gateway_now_ns()) / 1000000;
    if (left <= 0)
      return frames;
    pcp_proto_frame_t frame;
    if (fake_gateway_recv(gw, (int)left, &frame)) {
      pcp_proto_frame_deinitialize(&frame);
      frames++;
    } else if (gw->eof) {
      return -1;
    }
  }
}

// What the worker said in JOIN (copied out of the frame).
typedef struct fake_join_t {
  char worker_id[PCP_PROTO_MAX_STRING_BYTES + 1];
  char backend[64];
  char target[64];
  int32_t device_id;
  uint64_t device_memory_bytes;
  char drivers[PCP_PROTO_MAX_LIST_ITEMS][64];
  uint32_t driver_count;
  char runtime_version[PCP_PROTO_MAX_STRING_BYTES + 1];
  char compiler_version[PCP_PROTO_MAX_STRING_BYTES + 1];
  char node_manager_id[PCP_PROTO_MAX_STRING_BYTES + 1];
  int64_t supervisor_id;
  char worker_class[PCP_PROTO_MAX_STRING_BYTES + 1];
  bool has_resume;
  uint64_t lease_epoch;
  uint8_t resume_token[PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH];
  bool proof_valid;
  bool proof_valid_with_wrong_token;
} fake_join_t;

static inline void copy_string(char* out, size_t capacity, const char* value) {
  snprintf(out, capacity, "%s", value ? value : "");
}

// The gateway side of the handshake. |accept| (may be NULL: the fake then
// stops after the proof) is sent as is, with the worker id filled in.
static inline bool fake_gateway_handshake(fake_gateway_t* gw, const char* token,
                                          pcp_proto_accept_t* accept,
                                          fake_join_t* out_join) {
  memset(out_join, 0, sizeof(*out_join));
  pcp_proto_frame_t frame;
  if (!fake_gateway_recv(gw, 10000, &frame))
    return false;
  pcp_proto_hello_t hello;
  if (frame.header.type != PCP_PROTO_MESSAGE_HELLO ||
      pcp_proto_hello_parse(&frame, &hello) != NULL ||
      strcmp(hello.role, "worker") != 0) {
    pcp_proto_frame_deinitialize(&frame);
    return false;
  }
  uint16_t v =
      pcp_proto_version_select(PCP_PROTO_VERSION_MIN, PCP_PROTO_VERSION_MAX,
                               hello.min_version, hello.max_version);
  pcp_proto_frame_deinitialize(&frame);
  pcp_proto_hello_t reply = {.min_version = PCP_PROTO_VERSION_MIN,
                             .max_version = PCP_PROTO_VERSION_MAX,
                             .selected_version = v,
                             .has_selected_version = true,
                             .role = "gateway",
                             .software = "fake gateway"};
  pcp_proto_encoded_frame_t f;
  fake_gateway_send(gw,
                    pcp_proto_hello_encode(0, 0, &reply, &gw->limits,
                                           pcp_allocator_system(), &f),
                    &f);
  gw->version = v;
  pcp_proto_frame_decoder_set_version(&gw->decoder, v);
  pcp_proto_challenge_t challenge;
  PCP_CHECK_OK(
      pcp_proto_random_bytes(challenge.nonce, sizeof(challenge.nonce)));
  fake_gateway_send(gw,
                    pcp_proto_challenge_encode(v, 0, &challenge, &gw->limits,
                                               pcp_allocator_system(), &f),
                    &f);

  if (!fake_gateway_recv(gw, 10000, &frame))
    return false;
  pcp_proto_join_t join;
  if (frame.header.type != PCP_PROTO_MESSAGE_JOIN ||
      pcp_proto_join_parse(&frame, &join) != NULL) {
    pcp_proto_frame_deinitialize(&frame);
    return false;
  }
  uint64_t join_request_id = frame.header.request_id;
  copy_string(out_join->worker_id, sizeof(out_join->worker_id), join.worker_id);
  copy_string(out_join->backend, sizeof(out_join->backend), join.backend);
  copy_string(out_join->target, sizeof(out_join->target), join.target);
  out_join->device_id = join.device_id;
  out_join->device_memory_bytes = join.device_memory_bytes;
  out_join->driver_count = join.driver_count;
  for (uint32_t i = 0; i < join.driver_count; ++i) {
    copy_string(out_join->drivers[i], sizeof(out_join->drivers[i]),
                join.drivers[i]);
  }
  copy_string(out_join->runtime_version, sizeof(out_join->runtime_version),
              join.runtime_version);
  copy_string(out_join->compiler_version, sizeof(out_join->compiler_version),
              join.compiler_version);
  copy_string(out_join->node_manager_id, sizeof(out_join->node_manager_id),
              join.node_manager_id);
  out_join->supervisor_id = join.supervisor_id;
  copy_string(out_join->worker_class, sizeof(out_join->worker_class),
              join.worker_class);
  out_join->has_resume = join.has_resume;
  out_join->lease_epoch = join.lease_epoch;
  memcpy(out_join->resume_token, join.resume_token,
         sizeof(out_join->resume_token));
  pcp_proto_frame_deinitialize(&frame);

  if (!fake_gateway_recv(gw, 10000, &frame))
    return false;
  pcp_proto_join_proof_t proof;
  if (frame.header.type != PCP_PROTO_MESSAGE_JOIN_PROOF ||
      pcp_proto_join_proof_parse(&frame, &proof) != NULL) {
    pcp_proto_frame_deinitialize(&frame);
    return false;
  }
  out_join->proof_valid = strcmp(proof.worker_id, out_join->worker_id) == 0 &&
                          pcp_proto_join_mac_verify(
                              (const uint8_t*)token, strlen(token),
                              challenge.nonce, out_join->worker_id, proof.mac);
  static const char kWrong[] = "not-the-token";
  out_join->proof_valid_with_wrong_token = pcp_proto_join_mac_verify(
      (const uint8_t*)kWrong, strlen(kWrong), challenge.nonce,
      out_join->worker_id, proof.mac);
  pcp_proto_frame_deinitialize(&frame);
  if (!accept)
    return true;
  accept->worker_id = out_join->worker_id;
  fake_gateway_send(
      gw,
      pcp_proto_accept_encode(v, join_request_id, accept, &gw->limits,
                              pcp_allocator_system(), &f),
      &f);
  gw->heartbeat_ms = accept->heartbeat_interval_ms;
  gw->next_heartbeat_ns =
      fake_gateway_now_ns() + (int64_t)gw->heartbeat_ms * 1000000;
  return true;
}

typedef struct chunk_sender_t {
  fake_gateway_t* gw;
  int chunks;
} chunk_sender_t;

static inline pcp_status_t fake_gateway_emit_chunk(
    void* user_data, pcp_proto_encoded_frame_t* frame) {
  chunk_sender_t* sender = user_data;
  sender->chunks++;
  if (!fake_gateway_send(sender->gw, pcp_ok_status(), frame)) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE, "write failed");
  }
  return pcp_ok_status();
}

#endif  // PCP_TESTS_INTEGRATION_WORKER_FABRIC_FAKE_GATEWAY_H_
