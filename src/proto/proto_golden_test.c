// SPDX-License-Identifier: Apache-2.0
//
// Wire golden vectors (tests/conformance/fabric/*.hex): the encoder must
// produce exactly these bytes and the decoder must parse them. A change
// that breaks this test changes the wire: it needs a new protocol version,
// never an edit of the vectors.
//
// PCP_FABRIC_GOLDEN_WRITE=1 rewrites the vectors and the fuzz seeds
// (tests/fuzz/corpus/frame_decoder/) from the encoder: only for a new
// message, reviewed by hand.

#include <stdio.h>

#include "proto/proto_test_impl.h"

#ifndef PCP_FABRIC_GOLDEN_DIR
#error "PCP_FABRIC_GOLDEN_DIR must name tests/conformance/fabric"
#endif
#ifndef PCP_FABRIC_CORPUS_DIR
#error "PCP_FABRIC_CORPUS_DIR must name tests/fuzz/corpus/frame_decoder"
#endif

typedef struct vector_t {
  const char* name;
  const char* description;
  void (*encode)(pcp_proto_encoded_frame_t* out);
  void (*check)(pcp_proto_frame_t* frame);
} vector_t;

static pcp_proto_limits_t limits(void) {
  return pcp_proto_limits_default();
}

//===----------------------------------------------------------------------===//
// The messages (fixed inputs: never change them)
//===----------------------------------------------------------------------===//

static void encode_hello(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_hello_t m = {.min_version = 1,
                         .max_version = 1,
                         .role = "worker",
                         .software = "pcp 0.1.0"};
  ASSERT_OK(pcp_proto_hello_encode(1, 0, &m, &l, pcp_allocator_system(), out));
}
static void check_hello(pcp_proto_frame_t* f) {
  pcp_proto_hello_t m;
  ASSERT_OK(pcp_proto_hello_parse(f, &m));
  assert_int_equal(m.min_version, 1);
  assert_int_equal(m.max_version, 1);
  assert_string_equal(m.role, "worker");
  assert_false(m.has_selected_version);
}

static void encode_join(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_join_t m = {
      .worker_id = "site-a-pcp-system-node-1-pcp-worker-0-cpu-default-device-0",
      .backend = "cpu",
      .target = "",
      .device_id = 0,
      .device_memory_bytes = 8589934592ull,
      .drivers = {"local-task"},
      .driver_count = 1,
      .runtime_version = "3.13.0",
      .compiler_version = "3.13.0",
      .node_manager_id = "nm-node-1",
      .supervisor_id = 0,
      .worker_class = "",
  };
  ASSERT_OK(pcp_proto_join_encode(1, 1, &m, &l, pcp_allocator_system(), out));
}
static void check_join(pcp_proto_frame_t* f) {
  pcp_proto_join_t m;
  ASSERT_OK(pcp_proto_join_parse(f, &m));
  assert_string_equal(m.worker_id,
                      "site-a-pcp-system-node-1-pcp-worker-0-cpu-default-"
                      "device-0");
  assert_int_equal(m.device_memory_bytes, 8589934592ull);
  assert_string_equal(m.drivers[0], "local-task");
  assert_false(m.has_resume);
  assert_int_equal(f->header.request_id, 1);
}

static void encode_heartbeat(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_heartbeat_t m = {.seq = 7, .ack = 6};
  ASSERT_OK(
      pcp_proto_heartbeat_encode(1, 0, &m, &l, pcp_allocator_system(), out));
}
static void check_heartbeat(pcp_proto_frame_t* f) {
  pcp_proto_heartbeat_t m;
  ASSERT_OK(pcp_proto_heartbeat_parse(f, &m));
  assert_int_equal(m.seq, 7);
  assert_int_equal(m.ack, 6);
}

static void encode_error(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_status_t s = pcp_make_status(PCP_STATUS_NOT_FOUND,
                                   "resident tensor 'w' not in session 's1'");
  ASSERT_OK(
      pcp_proto_error_encode(1, 3, s, 42, &l, pcp_allocator_system(), out));
  pcp_status_ignore(s);
}
static void check_error(pcp_proto_frame_t* f) {
  pcp_status_t peer = NULL;
  uint64_t task_id = 0;
  ASSERT_OK(pcp_proto_error_parse(f, &peer, &task_id));
  assert_int_equal(pcp_status_code(peer), PCP_STATUS_NOT_FOUND);
  assert_string_equal(pcp_status_message(peer),
                      "resident tensor 'w' not in session 's1'");
  assert_int_equal(task_id, 42);
  pcp_status_ignore(peer);
}

static const float kTaskInput[6] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 2.5f};

static void encode_task_assign(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_section_t s = {.name = "x",
                           .element_type = PCP_ELEMENT_TYPE_F32,
                           .rank = 2,
                           .shape = {2, 3},
                           .data = kTaskInput};
  pcp_proto_tensor_ref_t inputs[2] = {
      {.kind = PCP_PROTO_TENSOR_REF_SECTION, .section = 0},
      {.kind = PCP_PROTO_TENSOR_REF_RESIDENT, .name = "w"},
  };
  pcp_proto_keep_resident_t keep = {.output = 1, .as = "w"};
  pcp_proto_task_assign_t m = {.task_id = 42,
                               .session_id = "s1",
                               .function = "main",
                               .inputs = inputs,
                               .input_count = 2,
                               .keep_resident = &keep,
                               .keep_resident_count = 1};
  // The program id is the SHA-256 of the bytes "program".
  pcp_sha256_t h;
  pcp_sha256_compute("program", 7, &h);
  memcpy(m.program, h.bytes, 32);
  ASSERT_OK(pcp_proto_task_assign_encode(1, 3, &m, &s, 1, &l,
                                         pcp_allocator_system(), out));
  // The encoded frame borrows kTaskInput (static): safe to flatten later.
}
static void check_task_assign(pcp_proto_frame_t* f) {
  pcp_proto_task_assign_t m;
  ASSERT_OK(pcp_proto_task_assign_parse(f, &m));
  assert_int_equal(m.task_id, 42);
  assert_int_equal(m.input_count, 2);
  assert_int_equal(f->section_count, 1);
  assert_int_equal(f->sections[0].element_type, PCP_ELEMENT_TYPE_F32);
  assert_int_equal(f->sections[0].rank, 2);
  assert_memory_equal(f->sections[0].data, kTaskInput, sizeof(kTaskInput));
  assert_int_equal(f->sections[0].offset, 0);
  // The section starts on a 64-byte boundary of the payload.
  uint64_t json_length = f->payload[0] | (f->payload[1] << 8);
  assert_int_equal((uint8_t*)f->sections[0].data - f->payload,
                   (8 + json_length + 63) / 64 * 64);
}

// The remaining messages, one vector each (STYLE.md s.3.11: every wire
// message has a golden vector and a fuzz seed).
static void fill(uint8_t* bytes, size_t n, uint8_t start) {
  for (size_t i = 0; i < n; ++i) bytes[i] = (uint8_t)(start + i);
}

static void encode_challenge(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_challenge_t m;
  fill(m.nonce, sizeof(m.nonce), 0x10);
  ASSERT_OK(
      pcp_proto_challenge_encode(1, 0, &m, &l, pcp_allocator_system(), out));
}
static void check_challenge(pcp_proto_frame_t* f) {
  pcp_proto_challenge_t m;
  ASSERT_OK(pcp_proto_challenge_parse(f, &m));
  assert_int_equal(m.nonce[31], 0x10 + 31);
}

static const uint8_t kGoldenToken[] = "golden-join-token";

static void encode_join_proof(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  uint8_t nonce[32];
  fill(nonce, sizeof(nonce), 0x10);
  pcp_proto_join_proof_t m = {.worker_id = "w-0"};
  ASSERT_OK(pcp_proto_join_mac_compute(kGoldenToken, sizeof(kGoldenToken) - 1,
                                       nonce, "w-0", m.mac));
  ASSERT_OK(
      pcp_proto_join_proof_encode(1, 1, &m, &l, pcp_allocator_system(), out));
}
static void check_join_proof(pcp_proto_frame_t* f) {
  pcp_proto_join_proof_t m;
  ASSERT_OK(pcp_proto_join_proof_parse(f, &m));
  uint8_t nonce[32];
  fill(nonce, sizeof(nonce), 0x10);
  assert_true(pcp_proto_join_mac_verify(kGoldenToken, sizeof(kGoldenToken) - 1,
                                        nonce, m.worker_id, m.mac));
}

static void encode_accept(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_accept_t m = {.worker_id = "w-0",
                          .lease_epoch = 2,
                          .resumed = true,
                          .heartbeat_interval_ms = 1000,
                          .max_frame_bytes = l.max_frame_bytes,
                          .max_chunk_bytes = l.max_chunk_bytes,
                          .max_in_flight = l.max_in_flight};
  fill(m.resume_token, sizeof(m.resume_token), 0x80);
  ASSERT_OK(pcp_proto_accept_encode(1, 1, &m, &l, pcp_allocator_system(), out));
}
static void check_accept(pcp_proto_frame_t* f) {
  pcp_proto_accept_t m;
  ASSERT_OK(pcp_proto_accept_parse(f, &m));
  assert_int_equal(m.lease_epoch, 2);
  assert_true(m.resumed);
  assert_int_equal(m.heartbeat_interval_ms, 1000);
}

static void encode_reject(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_reject_t m = {.reason = PCP_PROTO_REJECT_AUTH_FAILED,
                          .message = "join proof does not match"};
  ASSERT_OK(pcp_proto_reject_encode(1, 1, &m, &l, pcp_allocator_system(), out));
}
static void check_reject(pcp_proto_frame_t* f) {
  pcp_proto_reject_t m;
  ASSERT_OK(pcp_proto_reject_parse(f, &m));
  assert_int_equal(m.reason, 1);
}

static void encode_drain(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_drain_t m = {.deadline_ms = 30000};
  ASSERT_OK(pcp_proto_drain_encode(1, 0, &m, &l, pcp_allocator_system(), out));
}
static void check_drain(pcp_proto_frame_t* f) {
  pcp_proto_drain_t m;
  ASSERT_OK(pcp_proto_drain_parse(f, &m));
  assert_int_equal(m.deadline_ms, 30000);
}

static void encode_shutdown(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_shutdown_t m = {.reason = "gateway stopping"};
  ASSERT_OK(
      pcp_proto_shutdown_encode(1, 0, &m, &l, pcp_allocator_system(), out));
}
static void check_shutdown(pcp_proto_frame_t* f) {
  pcp_proto_shutdown_t m;
  ASSERT_OK(pcp_proto_shutdown_parse(f, &m));
  assert_string_equal(m.reason, "gateway stopping");
}

static const char kProgramBytes[] = "program";

static void program_hash(uint8_t out[32]) {
  pcp_sha256_t h;
  pcp_sha256_compute(kProgramBytes, 7, &h);
  memcpy(out, h.bytes, 32);
}

static void encode_program_offer(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_program_offer_t m = {
      .byte_length = 7, .backend = "cpu", .target = "host"};
  program_hash(m.program);
  ASSERT_OK(pcp_proto_program_offer_encode(1, 2, &m, &l, pcp_allocator_system(),
                                           out));
}
static void check_program_offer(pcp_proto_frame_t* f) {
  pcp_proto_program_offer_t m;
  ASSERT_OK(pcp_proto_program_offer_parse(f, &m));
  assert_int_equal(m.byte_length, 7);
}

static void encode_program_fetch(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_program_fetch_t m;
  program_hash(m.program);
  ASSERT_OK(pcp_proto_program_fetch_encode(1, 2, &m, &l, pcp_allocator_system(),
                                           out));
}
static void check_program_fetch(pcp_proto_frame_t* f) {
  pcp_proto_program_fetch_t m;
  ASSERT_OK(pcp_proto_program_fetch_parse(f, &m));
  uint8_t h[32];
  program_hash(h);
  assert_memory_equal(m.program, h, 32);
}

static void encode_blob_chunk(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  char id[65];
  uint8_t h[32];
  program_hash(h);
  pcp_proto_hex_encode(h, 32, id);
  pcp_proto_blob_chunk_t m = {.blob_id = id,
                              .kind = PCP_PROTO_BLOB_PROGRAM,
                              .index = 0,
                              .count = 1,
                              .offset = 0,
                              .total = 7,
                              .has_sha256 = true,
                              .data = kProgramBytes,
                              .data_length = 7};
  memcpy(m.sha256, h, 32);
  ASSERT_OK(
      pcp_proto_blob_chunk_encode(1, 2, &m, &l, pcp_allocator_system(), out));
}
static void check_blob_chunk(pcp_proto_frame_t* f) {
  pcp_proto_blob_chunk_t m;
  ASSERT_OK(pcp_proto_blob_chunk_parse(f, &m));
  assert_int_equal(m.data_length, 7);
  assert_memory_equal(m.data, kProgramBytes, 7);
  assert_true(m.has_sha256);
}

// The last of two chunks of a 200-byte tensor blob: no sha256 (tensor
// blobs rely on the per-chunk CRC32C, docs/protocol.md s.1.4).
static const uint8_t* tensor_chunk_bytes(void) {
  static uint8_t bytes[72];
  for (size_t i = 0; i < sizeof(bytes); ++i) bytes[i] = (uint8_t)(i * 7 + 1);
  return bytes;
}
static void encode_blob_chunk_tensor(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_blob_chunk_t m = {.blob_id = "t42.s0",
                              .kind = PCP_PROTO_BLOB_TENSOR,
                              .index = 1,
                              .count = 2,
                              .offset = 128,
                              .total = 200,
                              .data = tensor_chunk_bytes(),
                              .data_length = 72};
  ASSERT_OK(
      pcp_proto_blob_chunk_encode(1, 3, &m, &l, pcp_allocator_system(), out));
}
static void check_blob_chunk_tensor(pcp_proto_frame_t* f) {
  pcp_proto_blob_chunk_t m;
  ASSERT_OK(pcp_proto_blob_chunk_parse(f, &m));
  assert_int_equal(m.kind, PCP_PROTO_BLOB_TENSOR);
  assert_int_equal(m.index, 1);
  assert_int_equal(m.offset, 128);
  assert_int_equal(m.data_length, 72);
  assert_memory_equal(m.data, tensor_chunk_bytes(), 72);
  assert_false(m.has_sha256);
}

static void encode_program_ack(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_program_ack_t m = {.status = PCP_PROTO_PROGRAM_STORED};
  program_hash(m.program);
  ASSERT_OK(
      pcp_proto_program_ack_encode(1, 2, &m, &l, pcp_allocator_system(), out));
}
static void check_program_ack(pcp_proto_frame_t* f) {
  pcp_proto_program_ack_t m;
  ASSERT_OK(pcp_proto_program_ack_parse(f, &m));
  assert_int_equal(m.status, PCP_PROTO_PROGRAM_STORED);
}

static void encode_task_progress(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_task_progress_t m = {.task_id = 42,
                                 .state = PCP_PROTO_TASK_RUNNING,
                                 .has_fraction = true,
                                 .fraction = 0.25};
  ASSERT_OK(pcp_proto_task_progress_encode(1, 3, &m, &l, pcp_allocator_system(),
                                           out));
}
static void check_task_progress(pcp_proto_frame_t* f) {
  pcp_proto_task_progress_t m;
  ASSERT_OK(pcp_proto_task_progress_parse(f, &m));
  assert_true(m.fraction == 0.25);
}

static const int32_t kTaskOutput[4] = {1, -2, 3, -4};

static void encode_task_result(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_section_t s = {.name = "y",
                           .element_type = PCP_ELEMENT_TYPE_I32,
                           .rank = 1,
                           .shape = {4},
                           .data = kTaskOutput};
  pcp_proto_tensor_ref_t outputs[2] = {
      {.kind = PCP_PROTO_TENSOR_REF_SECTION, .section = 0},
      {.kind = PCP_PROTO_TENSOR_REF_RESIDENT, .name = "w"},
  };
  pcp_proto_task_result_t m = {
      .task_id = 42, .outputs = outputs, .output_count = 2, .elapsed_us = 1234};
  ASSERT_OK(pcp_proto_task_result_encode(1, 3, &m, &s, 1, &l,
                                         pcp_allocator_system(), out));
}
static void check_task_result(pcp_proto_frame_t* f) {
  pcp_proto_task_result_t m;
  ASSERT_OK(pcp_proto_task_result_parse(f, &m));
  assert_int_equal(m.output_count, 2);
  assert_memory_equal(f->sections[0].data, kTaskOutput, sizeof(kTaskOutput));
}

static void encode_task_cancel(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_task_cancel_t m = {.task_id = 42, .reason = "job cancelled"};
  ASSERT_OK(
      pcp_proto_task_cancel_encode(1, 3, &m, &l, pcp_allocator_system(), out));
}
static void check_task_cancel(pcp_proto_frame_t* f) {
  pcp_proto_task_cancel_t m;
  ASSERT_OK(pcp_proto_task_cancel_parse(f, &m));
  assert_int_equal(m.task_id, 42);
}

// "hash_inputs" (added with the bit-identity check of training, issue 17):
// the task_assign vector's task asking for the SHA-256 of its first input,
// and the answer carrying it as one more output after the function's.
static void encode_task_assign_hash(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_section_t s = {.name = "x",
                           .element_type = PCP_ELEMENT_TYPE_F32,
                           .rank = 2,
                           .shape = {2, 3},
                           .data = kTaskInput};
  pcp_proto_tensor_ref_t inputs[1] = {
      {.kind = PCP_PROTO_TENSOR_REF_SECTION, .section = 0},
  };
  pcp_proto_task_assign_t m = {.task_id = 43,
                               .function = "main",
                               .inputs = inputs,
                               .input_count = 1,
                               .hash_inputs = 1};
  program_hash(m.program);
  ASSERT_OK(pcp_proto_task_assign_encode(1, 3, &m, &s, 1, &l,
                                         pcp_allocator_system(), out));
}
static void check_task_assign_hash(pcp_proto_frame_t* f) {
  pcp_proto_task_assign_t m;
  ASSERT_OK(pcp_proto_task_assign_parse(f, &m));
  assert_int_equal(m.task_id, 43);
  assert_int_equal(m.hash_inputs, 1);
  assert_int_equal(m.input_count, 1);
}

static uint8_t* task_input_sha256(void) {
  static pcp_sha256_t h;
  pcp_sha256_compute(kTaskInput, sizeof(kTaskInput), &h);
  return h.bytes;
}
static void encode_task_result_hash(pcp_proto_encoded_frame_t* out) {
  pcp_proto_limits_t l = limits();
  pcp_proto_section_t s[2] = {{.name = "output0",
                               .element_type = PCP_ELEMENT_TYPE_I32,
                               .rank = 1,
                               .shape = {4},
                               .data = kTaskOutput},
                              {.name = "inputs_sha256",
                               .element_type = PCP_ELEMENT_TYPE_U8,
                               .rank = 1,
                               .shape = {32},
                               .data = task_input_sha256()}};
  pcp_proto_tensor_ref_t outputs[2] = {
      {.kind = PCP_PROTO_TENSOR_REF_SECTION, .section = 0},
      {.kind = PCP_PROTO_TENSOR_REF_SECTION, .section = 1},
  };
  pcp_proto_task_result_t m = {
      .task_id = 43, .outputs = outputs, .output_count = 2, .elapsed_us = 99};
  ASSERT_OK(pcp_proto_task_result_encode(1, 3, &m, s, 2, &l,
                                         pcp_allocator_system(), out));
}
static void check_task_result_hash(pcp_proto_frame_t* f) {
  pcp_proto_task_result_t m;
  ASSERT_OK(pcp_proto_task_result_parse(f, &m));
  assert_int_equal(m.output_count, 2);
  assert_int_equal(f->sections[1].byte_length, 32);
  assert_memory_equal(f->sections[1].data, task_input_sha256(), 32);
}

static const vector_t kVectors[] = {
    {"hello", "HELLO worker -> gateway, versions 1..1 (frozen layout)",
     encode_hello, check_hello},
    {"join", "JOIN request 1, cpu worker, no resume block", encode_join,
     check_join},
    {"heartbeat", "HEARTBEAT seq 7 ack 6", encode_heartbeat, check_heartbeat},
    {"error", "ERROR request 3, NOT_FOUND (5) for task 42", encode_error,
     check_error},
    {"task_assign",
     "TASK_ASSIGN request 3, task 42, one f32[2,3] section, one resident "
     "input",
     encode_task_assign, check_task_assign},
    {"challenge", "CHALLENGE nonce 10 11 .. 2f", encode_challenge,
     check_challenge},
    {"join_proof",
     "JOIN_PROOF for w-0 over the challenge vector's nonce, token "
     "'golden-join-token'",
     encode_join_proof, check_join_proof},
    {"accept", "ACCEPT w-0, lease epoch 2, resumed", encode_accept,
     check_accept},
    {"reject", "REJECT AUTH_FAILED (1)", encode_reject, check_reject},
    {"drain", "DRAIN deadline 30 s", encode_drain, check_drain},
    {"shutdown", "SHUTDOWN", encode_shutdown, check_shutdown},
    {"program_offer", "PROGRAM_OFFER sha256('program'), 7 bytes, cpu/host",
     encode_program_offer, check_program_offer},
    {"program_fetch", "PROGRAM_FETCH sha256('program')", encode_program_fetch,
     check_program_fetch},
    {"blob_chunk", "BLOB_CHUNK the whole 7-byte program in one chunk",
     encode_blob_chunk, check_blob_chunk},
    {"blob_chunk_tensor",
     "BLOB_CHUNK last of 2 chunks of a 200-byte tensor blob, no sha256",
     encode_blob_chunk_tensor, check_blob_chunk_tensor},
    {"program_ack", "PROGRAM_ACK stored", encode_program_ack,
     check_program_ack},
    {"task_progress", "TASK_PROGRESS task 42 running 0.25",
     encode_task_progress, check_task_progress},
    {"task_result",
     "TASK_RESULT task 42, one i32[4] section and one resident output",
     encode_task_result, check_task_result},
    {"task_cancel", "TASK_CANCEL task 42", encode_task_cancel,
     check_task_cancel},
    {"task_assign_hash",
     "TASK_ASSIGN request 3, task 43, one f32[2,3] section, hash_inputs 1",
     encode_task_assign_hash, check_task_assign_hash},
    {"task_result_hash",
     "TASK_RESULT task 43, one i32[4] output and the u8[32] SHA-256 of the "
     "hashed input",
     encode_task_result_hash, check_task_result_hash},
};

//===----------------------------------------------------------------------===//
// Files
//===----------------------------------------------------------------------===//

static uint8_t* read_hex(const char* path, size_t* out_length) {
  FILE* f = fopen(path, "r");
  if (!f)
    fail_msg("cannot open %s", path);
  size_t capacity = 4096, n = 0;
  uint8_t* bytes = malloc(capacity);
  char line[1024];
  while (fgets(line, sizeof(line), f)) {
    if (line[0] == '#')
      continue;
    int high = -1;
    for (char* p = line; *p; ++p) {
      int v;
      if (*p >= '0' && *p <= '9') {
        v = *p - '0';
      } else if (*p >= 'a' && *p <= 'f') {
        v = *p - 'a' + 10;
      } else {
        continue;
      }
      if (high < 0) {
        high = v;
      } else {
        if (n == capacity)
          bytes = realloc(bytes, capacity *= 2);
        bytes[n++] = (uint8_t)((high << 4) | v);
        high = -1;
      }
    }
  }
  fclose(f);
  *out_length = n;
  return bytes;
}

static void write_vector(const vector_t* v, const uint8_t* bytes, size_t n) {
  char path[1024];
  snprintf(path, sizeof(path), "%s/%s.hex", PCP_FABRIC_GOLDEN_DIR, v->name);
  FILE* f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "# %s\n", v->description);
  fprintf(f, "# %zu bytes; docs/protocol.md; 32 bytes per line\n", n);
  for (size_t i = 0; i < n; ++i) {
    fprintf(f, "%02x%s", bytes[i], (i % 32 == 31 || i + 1 == n) ? "\n" : "");
  }
  fclose(f);
  snprintf(path, sizeof(path), "%s/%s.bin", PCP_FABRIC_CORPUS_DIR, v->name);
  f = fopen(path, "wb");
  assert_non_null(f);
  fwrite(bytes, 1, n, f);
  fclose(f);
}

static void golden_vectors_match(void** state) {
  (void)state;
  const char* write = getenv("PCP_FABRIC_GOLDEN_WRITE");
  for (size_t i = 0; i < PCP_ARRAYSIZE(kVectors); ++i) {
    const vector_t* v = &kVectors[i];
    pcp_proto_encoded_frame_t e;
    v->encode(&e);
    size_t n;
    uint8_t* encoded = test_flatten(&e, &n);
    if (write && strcmp(write, "1") == 0)
      write_vector(v, encoded, n);
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s.hex", PCP_FABRIC_GOLDEN_DIR, v->name);
    size_t golden_length;
    uint8_t* golden = read_hex(path, &golden_length);
    if (golden_length != n || memcmp(golden, encoded, n) != 0) {
      fail_msg(
          "%s: the encoder no longer produces the golden bytes "
          "(%zu vs %zu bytes): the wire changed",
          v->name, n, golden_length);
    }
    // Decode the golden bytes at once and one byte at a time.
    pcp_proto_limits_t l = limits();
    pcp_proto_frame_t f;
    ASSERT_OK(pcp_proto_frame_decode(golden, golden_length, &l,
                                     v->name[0] == 'h' ? 0 : 1,
                                     pcp_allocator_system(), &f));
    v->check(&f);
    pcp_proto_frame_deinitialize(&f);
    pcp_proto_frame_decoder_t d;
    pcp_proto_frame_decoder_initialize(&l, pcp_allocator_system(), &d);
    pcp_proto_parse_result_t r = PCP_PROTO_PARSE_NEED_MORE;
    for (size_t k = 0; k < golden_length; ++k) {
      size_t consumed;
      ASSERT_OK(pcp_proto_frame_decoder_feed(&d, golden + k, 1, &consumed, &r));
      assert_int_equal(r == PCP_PROTO_PARSE_FRAME_READY,
                       k + 1 == golden_length);
    }
    pcp_proto_frame_decoder_take(&d, &f);
    v->check(&f);
    pcp_proto_frame_deinitialize(&f);
    pcp_proto_frame_decoder_deinitialize(&d);
    free(golden);
    free(encoded);
  }
}

// The frozen part of HELLO, byte by byte (s.2): magic, type 1 at offset 6,
// flags 0, request id 0, and the payload prefix.
static void hello_bytes_are_frozen(void** state) {
  (void)state;
  char path[1024];
  snprintf(path, sizeof(path), "%s/hello.hex", PCP_FABRIC_GOLDEN_DIR);
  size_t n;
  uint8_t* b = read_hex(path, &n);
  assert_true(n > 40);
  assert_memory_equal(b, "PCPF", 4);
  assert_int_equal(b[6] | (b[7] << 8), PCP_PROTO_MESSAGE_HELLO);
  for (int i = 8; i < 12; ++i) assert_int_equal(b[i], 0);
  for (int i = 16; i < 24; ++i) assert_int_equal(b[i], 0);
  uint64_t payload = 0;
  for (int i = 7; i >= 0; --i) payload = (payload << 8) | b[24 + i];
  assert_int_equal(payload + 32, n);
  uint32_t json_length =
      b[32] | (b[33] << 8) | (b[34] << 16) | ((uint32_t)b[35] << 24);
  assert_int_equal(json_length + 8, payload);
  assert_int_equal(b[40], '{');
  free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(golden_vectors_match),
      cmocka_unit_test(hello_bytes_are_frozen),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
