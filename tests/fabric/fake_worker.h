// SPDX-License-Identifier: Apache-2.0
//
// A scripted fake worker for the fabric tests and benchmarks: blocking
// sockets on 127.0.0.1 and proto's codec, nothing from the real worker
// (src/roles/worker), so the endpoint is tested against exactly the bytes a
// test chooses to send. Header-only so that bench/ can share it; never
// included by production code.

#ifndef PCP_TESTS_FABRIC_FAKE_WORKER_H_
#define PCP_TESTS_FABRIC_FAKE_WORKER_H_

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/base.h"
#include "proto/proto.h"

typedef struct fake_worker_t {
  int fd;
  pcp_proto_limits_t limits;
  pcp_proto_frame_decoder_t decoder;
  uint16_t version;
  uint64_t next_request_id;
  uint64_t heartbeat_seq;
  int64_t heartbeat_interval_ns;
  int64_t last_heartbeat_ns;
  uint64_t heartbeats_received;
  bool eof;
  // From the handshake.
  uint8_t nonce[PCP_PROTO_NONCE_BYTE_LENGTH];
  uint64_t lease_epoch;
  uint8_t resume_token[PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH];
  bool resumed;
  uint32_t reject_reason;
  // Bytes received and not yet fed to the decoder.
  uint8_t pending[1 << 16];
  size_t pending_at;
  size_t pending_length;
} fake_worker_t;

static inline int64_t fake_now_ns(void) {
  return pcp_clock_now_ns(pcp_clock_system());
}

static inline bool fake_worker_connect(uint16_t port,
                                       const pcp_proto_limits_t* limits,
                                       fake_worker_t* out_fw) {
  memset(out_fw, 0, sizeof(*out_fw));
  out_fw->limits = *limits;
  out_fw->heartbeat_interval_ns = 1000000000;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return false;
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr*)&addr, sizeof(addr)) != 0) {
    close(fd);
    return false;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  out_fw->fd = fd;
  pcp_proto_frame_decoder_initialize(limits, pcp_allocator_system(),
                                     &out_fw->decoder);
  out_fw->next_request_id = 1;
  return true;
}

static inline void fake_worker_close(fake_worker_t* fw) {
  if (fw->fd >= 0)
    close(fw->fd);
  fw->fd = -1;
  pcp_proto_frame_decoder_deinitialize(&fw->decoder);
}

static inline bool fake_send_all(int fd, const void* data, size_t length) {
  const uint8_t* p = data;
  while (length > 0) {
    ssize_t n = send(fd, p, length, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    p += n;
    length -= (size_t)n;
  }
  return true;
}

// Writes the frame's segments with writev (no flattening: a tensor is sent
// from where it lies) and deinitializes the frame.
static inline bool fake_send_frame(fake_worker_t* fw,
                                   pcp_proto_encoded_frame_t* frame) {
  bool ok = true;
  size_t i = 0;
  while (ok && i < frame->segment_count) {
    struct iovec iov[64];
    int n = 0;
    for (; n < 64 && i + (size_t)n < frame->segment_count; ++n) {
      iov[n].iov_base = (void*)frame->segments[i + (size_t)n].data;
      iov[n].iov_len = frame->segments[i + (size_t)n].byte_length;
    }
    i += (size_t)n;
    int first = 0;
    while (first < n) {
      ssize_t w = writev(fw->fd, iov + first, n - first);
      if (w < 0 && errno == EINTR)
        continue;
      if (w <= 0) {
        ok = false;
        break;
      }
      size_t left = (size_t)w;
      while (first < n && left >= iov[first].iov_len) {
        left -= iov[first].iov_len;
        ++first;
      }
      if (first < n) {
        iov[first].iov_base = (uint8_t*)iov[first].iov_base + left;
        iov[first].iov_len -= left;
      }
    }
  }
  pcp_proto_encoded_frame_deinitialize(frame);
  return ok;
}

static inline void fake_heartbeat_if_due(fake_worker_t* fw) {
  if (fw->version == 0 || fw->lease_epoch == 0)
    return;
  int64_t now = fake_now_ns();
  if (now - fw->last_heartbeat_ns < fw->heartbeat_interval_ns)
    return;
  fw->last_heartbeat_ns = now;
  pcp_proto_heartbeat_t hb = {.seq = ++fw->heartbeat_seq, .ack = 0};
  pcp_proto_encoded_frame_t f;
  pcp_status_t status = pcp_proto_heartbeat_encode(
      fw->version, 0, &hb, &fw->limits, pcp_allocator_system(), &f);
  if (status) {
    pcp_status_ignore(status);
    return;
  }
  fake_send_frame(fw, &f);
}

// Reads the next frame (skipping nothing). While waiting, sends heartbeats
// every interval when |keep_alive|. False on timeout, EOF or a decode error.
static inline bool fake_recv_frame(fake_worker_t* fw, int64_t timeout_ms,
                                   bool keep_alive, pcp_proto_frame_t* out) {
  memset(out, 0, sizeof(*out));
  int64_t deadline = fake_now_ns() + timeout_ms * 1000000;
  for (;;) {
    while (fw->pending_at < fw->pending_length) {
      size_t consumed = 0;
      pcp_proto_parse_result_t result = PCP_PROTO_PARSE_NEED_MORE;
      pcp_status_t status = pcp_proto_frame_decoder_feed(
          &fw->decoder, fw->pending + fw->pending_at,
          fw->pending_length - fw->pending_at, &consumed, &result);
      if (status) {
        pcp_status_ignore(status);
        return false;
      }
      fw->pending_at += consumed;
      if (result == PCP_PROTO_PARSE_FRAME_READY) {
        pcp_proto_frame_decoder_take(&fw->decoder, out);
        return true;
      }
    }
    if (keep_alive)
      fake_heartbeat_if_due(fw);
    int64_t left = (deadline - fake_now_ns()) / 1000000;
    if (left <= 0)
      return false;
    int wait = (int)(left < 10 ? left : 10);
    struct pollfd pfd = {.fd = fw->fd, .events = POLLIN};
    int r = poll(&pfd, 1, wait);
    if (r <= 0)
      continue;
    ssize_t n = recv(fw->fd, fw->pending, sizeof(fw->pending), 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      fw->eof = true;
      return false;
    }
    fw->pending_at = 0;
    fw->pending_length = (size_t)n;
  }
}

// Waits for a frame of |type|, counting and skipping heartbeats.
static inline bool fake_expect(fake_worker_t* fw, uint16_t type,
                               int64_t timeout_ms, pcp_proto_frame_t* out) {
  int64_t deadline = fake_now_ns() + timeout_ms * 1000000;
  for (;;) {
    int64_t left = (deadline - fake_now_ns()) / 1000000;
    if (left <= 0)
      return false;
    if (!fake_recv_frame(fw, left, true, out))
      return false;
    if (out->header.type == type)
      return true;
    if (out->header.type == PCP_PROTO_MESSAGE_HEARTBEAT) {
      fw->heartbeats_received++;
    }
    pcp_proto_frame_deinitialize(out);
  }
}

typedef struct fake_join_t {
  const char* worker_id;
  const char* token;
  bool resume;  // send the last ACCEPT's epoch and token
} fake_join_t;

static inline void fake_default_join(const char* worker_id,
                                     pcp_proto_join_t* out_join) {
  memset(out_join, 0, sizeof(*out_join));
  out_join->worker_id = worker_id;
  out_join->backend = "cpu";
  out_join->target = "host";
  out_join->device_id = 3;
  out_join->device_memory_bytes = UINT64_C(8) << 30;
  out_join->drivers[0] = "local-task";
  out_join->drivers[1] = "local-sync";
  out_join->driver_count = 2;
  out_join->runtime_version = "iree-rt 3.13";
  out_join->compiler_version = "iree-compile 3.13";
  out_join->node_manager_id = "nm-1";
  out_join->supervisor_id = 7;
  out_join->worker_class = "batch";
}

// HELLO, CHALLENGE, JOIN, JOIN_PROOF; returns true on ACCEPT (then heartbeats
// start), false on REJECT (|reject_reason| set) or any failure.
static inline bool fake_handshake(fake_worker_t* fw,
                                  const pcp_proto_join_t* join_in,
                                  const char* token) {
  pcp_allocator_t a = pcp_allocator_system();
  pcp_proto_encoded_frame_t f;
  pcp_proto_hello_t hello = {.min_version = 1,
                             .max_version = 1,
                             .role = "worker",
                             .software = "fake-worker"};
  if (pcp_proto_hello_encode(1, 0, &hello, &fw->limits, a, &f))
    return false;
  if (!fake_send_frame(fw, &f))
    return false;
  pcp_proto_frame_t frame;
  if (!fake_recv_frame(fw, 2000, false, &frame))
    return false;
  pcp_proto_frame_deinitialize(&frame);
  fw->version = 1;
  pcp_proto_frame_decoder_set_version(&fw->decoder, 1);
  if (!fake_recv_frame(fw, 2000, false, &frame))
    return false;
  pcp_proto_challenge_t challenge;
  pcp_status_t status = pcp_proto_challenge_parse(&frame, &challenge);
  if (status) {
    pcp_status_ignore(status);
    pcp_proto_frame_deinitialize(&frame);
    return false;
  }
  memcpy(fw->nonce, challenge.nonce, sizeof(fw->nonce));
  pcp_proto_frame_deinitialize(&frame);
  pcp_proto_join_t join = *join_in;
  uint64_t join_request = fw->next_request_id++;
  if (pcp_proto_join_encode(1, join_request, &join, &fw->limits, a, &f)) {
    return false;
  }
  if (!fake_send_frame(fw, &f))
    return false;
  pcp_proto_join_proof_t proof = {.worker_id = join.worker_id};
  status = pcp_proto_join_mac_compute((const uint8_t*)token, strlen(token),
                                      fw->nonce, join.worker_id, proof.mac);
  if (status) {
    pcp_status_ignore(status);
    return false;
  }
  if (pcp_proto_join_proof_encode(1, join_request, &proof, &fw->limits, a,
                                  &f)) {
    return false;
  }
  if (!fake_send_frame(fw, &f))
    return false;
  if (!fake_recv_frame(fw, 3000, false, &frame))
    return false;
  bool accepted = false;
  if (frame.header.type == PCP_PROTO_MESSAGE_ACCEPT) {
    pcp_proto_accept_t accept;
    status = pcp_proto_accept_parse(&frame, &accept);
    if (!status) {
      accepted = true;
      fw->lease_epoch = accept.lease_epoch;
      memcpy(fw->resume_token, accept.resume_token, sizeof(fw->resume_token));
      fw->resumed = accept.resumed;
      fw->heartbeat_interval_ns =
          (int64_t)accept.heartbeat_interval_ms * 1000000;
      fw->last_heartbeat_ns = fake_now_ns();
    }
    pcp_status_ignore(status);
  } else if (frame.header.type == PCP_PROTO_MESSAGE_REJECT) {
    pcp_proto_reject_t reject;
    status = pcp_proto_reject_parse(&frame, &reject);
    if (!status)
      fw->reject_reason = reject.reason;
    pcp_status_ignore(status);
  }
  pcp_proto_frame_deinitialize(&frame);
  return accepted;
}

// Waits for EOF from the gateway (frames before it are dropped).
static inline bool fake_expect_eof(fake_worker_t* fw, int64_t timeout_ms) {
  int64_t deadline = fake_now_ns() + timeout_ms * 1000000;
  while (!fw->eof) {
    int64_t left = (deadline - fake_now_ns()) / 1000000;
    if (left <= 0)
      return false;
    pcp_proto_frame_t frame;
    if (fake_recv_frame(fw, left, false, &frame)) {
      pcp_proto_frame_deinitialize(&frame);
    } else if (!fw->eof) {
      // A decode error: the stream is unusable; treat as closed.
      if (fake_now_ns() >= deadline)
        return false;
      char sink[4096];
      ssize_t n = recv(fw->fd, sink, sizeof(sink), 0);
      if (n == 0)
        fw->eof = true;
    }
  }
  return true;
}

#endif  // PCP_TESTS_FABRIC_FAKE_WORKER_H_
