// SPDX-License-Identifier: Apache-2.0
//
// Codec tests: CRC, header, every message round-trip, byte-at-a-time
// decoding, every limit, checksums, versions, blobs, HMAC, error mapping,
// OOM sweep.

#include <stdatomic.h>

#include <openssl/hmac.h>

#include "proto/proto_test_impl.h"

static pcp_proto_limits_t limits(void) {
  return pcp_proto_limits_default();
}

// Decodes one flat frame with default limits (asserting success).
static void decode_ok(const uint8_t* bytes, size_t n, uint16_t version,
                      pcp_proto_frame_t* out) {
  pcp_proto_limits_t l = limits();
  ASSERT_OK(pcp_proto_frame_decode(bytes, n, &l, version,
                                   pcp_allocator_system(), out));
}

// Builds a raw frame around |json| and |data| (placed at the data area),
// with correct checksums unless told otherwise.
typedef struct raw_opts_t {
  uint16_t version;
  uint16_t type;
  uint32_t flags;
  bool bad_header_crc;
  bool bad_json_crc;
  uint32_t magic;
  size_t pad_garbage;  // non-zero padding byte after the JSON when > 0
} raw_opts_t;

static uint8_t* build_raw(raw_opts_t o, const char* json, const void* data,
                          size_t data_length, size_t* out_length) {
  size_t json_length = strlen(json);
  size_t prefix_json = 8 + json_length;
  size_t data_area = data ? (prefix_json + 63) / 64 * 64 : prefix_json;
  size_t payload = data_area + data_length;
  uint8_t* b = calloc(1, 32 + payload);
  pcp_proto_header_t h = {.version = o.version ? o.version : 1,
                          .type = o.type,
                          .flags = o.flags,
                          .request_id = 5,
                          .payload_length = payload};
  pcp_proto_header_encode(&h, b);
  if (o.magic) {
    b[0] = (uint8_t)o.magic;
    // Recompute the checksum so that only the magic is wrong.
    b[12] = b[13] = b[14] = b[15] = 0;
    uint32_t crc = pcp_proto_crc32c(b, 32);
    for (int i = 0; i < 4; ++i) b[12 + i] = (uint8_t)(crc >> (8 * i));
  }
  if (o.bad_header_crc)
    b[12] ^= 0xFF;
  uint8_t* p = b + 32;
  uint32_t crc = pcp_proto_crc32c(json, json_length);
  if (o.bad_json_crc)
    crc ^= 1;
  for (int i = 0; i < 4; ++i) {
    p[i] = (uint8_t)(json_length >> (8 * i));
    p[4 + i] = (uint8_t)(crc >> (8 * i));
  }
  memcpy(p + 8, json, json_length);
  if (o.pad_garbage && data_area > prefix_json)
    p[prefix_json] = 0x5A;
  if (data)
    memcpy(p + data_area, data, data_length);
  *out_length = 32 + payload;
  return b;
}

static pcp_status_t decode_raw(const uint8_t* b, size_t n, uint16_t version) {
  pcp_proto_limits_t l = limits();
  pcp_proto_frame_t f;
  pcp_status_t s =
      pcp_proto_frame_decode(b, n, &l, version, pcp_allocator_system(), &f);
  pcp_proto_frame_deinitialize(&f);
  return s;
}

//===----------------------------------------------------------------------===//

static void crc32c_known_answer(void** state) {
  (void)state;
  assert_int_equal(pcp_proto_crc32c("123456789", 9), 0xE3069283u);
  assert_int_equal(pcp_proto_crc32c("", 0), 0);
  // Extending over pieces equals one pass, at every split and alignment.
  uint8_t buffer[200];
  for (size_t i = 0; i < sizeof(buffer); ++i) buffer[i] = (uint8_t)(i * 7);
  uint32_t whole = pcp_proto_crc32c(buffer + 3, 190);
  for (size_t split = 0; split <= 190; split += 17) {
    uint32_t c = pcp_proto_crc32c(buffer + 3, split);
    c = pcp_proto_crc32c_extend(c, buffer + 3 + split, 190 - split);
    assert_int_equal(c, whole);
  }
}

// Bit-at-a-time reference, straight from the definition.
static uint32_t crc32c_reference(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

// Long inputs take the three-chain path: check it against the reference at
// sizes and alignments around the block boundaries.
static void crc32c_long_inputs_match_reference(void** state) {
  (void)state;
  size_t n = 200000;
  uint8_t* b = malloc(n + 8);
  pcp_rng_t rng;
  pcp_rng_initialize(3, &rng);
  for (size_t i = 0; i < n + 8; ++i) b[i] = (uint8_t)pcp_rng_next_u64(&rng);
  size_t sizes[] = {12287, 12288, 12289, 24576 + 13, 65536, 199990};
  for (size_t i = 0; i < PCP_ARRAYSIZE(sizes); ++i) {
    for (size_t misalign = 0; misalign < 8; misalign += 3) {
      uint32_t expected = crc32c_reference(b + misalign, sizes[i]);
      assert_int_equal(pcp_proto_crc32c(b + misalign, sizes[i]), expected);
      // Extending in two uneven pieces gives the same value.
      uint32_t c = pcp_proto_crc32c(b + misalign, 5000);
      c = pcp_proto_crc32c_extend(c, b + misalign + 5000, sizes[i] - 5000);
      assert_int_equal(c, expected);
    }
  }
  free(b);
}

static void header_layout_is_frozen(void** state) {
  (void)state;
  pcp_proto_header_t h = {.version = 1,
                          .type = PCP_PROTO_MESSAGE_HELLO,
                          .flags = 0,
                          .request_id = 0x0102030405060708ull,
                          .payload_length = 0x1122};
  uint8_t b[32];
  pcp_proto_header_encode(&h, b);
  assert_memory_equal(b, "PCPF", 4);
  assert_int_equal(b[4], 1);
  assert_int_equal(b[6], 1);
  assert_int_equal(b[16], 0x08);
  assert_int_equal(b[23], 0x01);
  assert_int_equal(b[24], 0x22);
  assert_int_equal(b[25], 0x11);
  pcp_proto_header_t out;
  pcp_proto_limits_t l = limits();
  ASSERT_OK(pcp_proto_header_decode(b, &l, 0, &out));
  assert_int_equal(out.request_id, h.request_id);
  assert_int_equal(out.payload_length, h.payload_length);
  assert_int_equal(out.type, h.type);
}

static void hello_round_trip(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  pcp_proto_hello_t in = {.min_version = 1,
                          .max_version = 1,
                          .selected_version = 1,
                          .has_selected_version = true,
                          .role = "gateway",
                          .software = "pcp test"};
  pcp_proto_encoded_frame_t e;
  ASSERT_OK(pcp_proto_hello_encode(9, 77, &in, &l, pcp_allocator_system(), &e));
  size_t n;
  uint8_t* b = test_flatten(&e, &n);
  pcp_proto_frame_t f;
  decode_ok(b, n, 0, &f);
  assert_int_equal(f.header.request_id, 0);  // HELLO always carries 0
  pcp_proto_hello_t out;
  ASSERT_OK(pcp_proto_hello_parse(&f, &out));
  assert_int_equal(out.min_version, 1);
  assert_int_equal(out.selected_version, 1);
  assert_true(out.has_selected_version);
  assert_string_equal(out.role, "gateway");
  assert_string_equal(out.software, "pcp test");
  // Parsing as another message is a clean error, not a crash.
  pcp_proto_join_t join;
  ASSERT_CODE(pcp_proto_join_parse(&f, &join), PCP_STATUS_FAILED_PRECONDITION);
  pcp_proto_frame_deinitialize(&f);
  free(b);
}

static void join_round_trip(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  pcp_proto_join_t in = {
      .worker_id = "site-a-ns-node-1-pod-0-cpu-default-device-0",
      .backend = "cpu",
      .target = "host",
      .device_id = 3,
      .device_memory_bytes = 1ull << 34,
      .drivers = {"local-task", "local-sync"},
      .driver_count = 2,
      .runtime_version = "3.13.0",
      .compiler_version = "3.13.0",
      .node_manager_id = "nm-1",
      .supervisor_id = 2,
      .worker_class = "cpu-small",
      .has_resume = true,
      .lease_epoch = 4,
  };
  for (int i = 0; i < 32; ++i) in.resume_token[i] = (uint8_t)(0xA0 + i);
  pcp_proto_encoded_frame_t e;
  ASSERT_OK(pcp_proto_join_encode(1, 1, &in, &l, pcp_allocator_system(), &e));
  size_t n;
  uint8_t* b = test_flatten(&e, &n);
  pcp_proto_frame_t f;
  decode_ok(b, n, 1, &f);
  pcp_proto_join_t out;
  ASSERT_OK(pcp_proto_join_parse(&f, &out));
  assert_string_equal(out.worker_id, in.worker_id);
  assert_string_equal(out.backend, "cpu");
  assert_string_equal(out.target, "host");
  assert_int_equal(out.device_id, 3);
  assert_int_equal(out.device_memory_bytes, 1ull << 34);
  assert_int_equal(out.driver_count, 2);
  assert_string_equal(out.drivers[1], "local-sync");
  assert_string_equal(out.runtime_version, "3.13.0");
  assert_string_equal(out.node_manager_id, "nm-1");
  assert_int_equal(out.supervisor_id, 2);
  assert_string_equal(out.worker_class, "cpu-small");
  assert_true(out.has_resume);
  assert_int_equal(out.lease_epoch, 4);
  assert_memory_equal(out.resume_token, in.resume_token, 32);
  assert_true(pcp_proto_join_resume_matches(&out, 4, in.resume_token));
  assert_false(pcp_proto_join_resume_matches(&out, 5, in.resume_token));
  pcp_proto_frame_deinitialize(&f);
  free(b);
  // A bad worker id is refused by the encoder.
  in.worker_id = "bad id/with space";
  ASSERT_CODE(pcp_proto_join_encode(1, 1, &in, &l, pcp_allocator_system(), &e),
              PCP_STATUS_INVALID_ARGUMENT);
}

static void control_messages_round_trip(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  pcp_allocator_t a = pcp_allocator_system();
  pcp_proto_encoded_frame_t e;
  size_t n;
  uint8_t* b;
  pcp_proto_frame_t f;

  pcp_proto_challenge_t ch;
  for (int i = 0; i < 32; ++i) ch.nonce[i] = (uint8_t)i;
  ASSERT_OK(pcp_proto_challenge_encode(1, 0, &ch, &l, a, &e));
  b = test_flatten(&e, &n);
  decode_ok(b, n, 1, &f);
  pcp_proto_challenge_t ch2;
  ASSERT_OK(pcp_proto_challenge_parse(&f, &ch2));
  assert_memory_equal(ch.nonce, ch2.nonce, 32);
  pcp_proto_frame_deinitialize(&f);
  free(b);

  pcp_proto_join_proof_t jp = {.worker_id = "w-1"};
  memset(jp.mac, 0xCD, 32);
  ASSERT_OK(pcp_proto_join_proof_encode(1, 1, &jp, &l, a, &e));
  b = test_flatten(&e, &n);
  decode_ok(b, n, 1, &f);
  pcp_proto_join_proof_t jp2;
  ASSERT_OK(pcp_proto_join_proof_parse(&f, &jp2));
  assert_string_equal(jp2.worker_id, "w-1");
  assert_memory_equal(jp2.mac, jp.mac, 32);
  pcp_proto_frame_deinitialize(&f);
  free(b);

  pcp_proto_accept_t ac = {.worker_id = "w-1",
                           .lease_epoch = 7,
                           .resumed = true,
                           .heartbeat_interval_ms = 1000,
                           .max_frame_bytes = 1 << 20,
                           .max_chunk_bytes = 1 << 16,
                           .max_in_flight = 8};
  memset(ac.resume_token, 0x11, 32);
  ASSERT_OK(pcp_proto_accept_encode(1, 1, &ac, &l, a, &e));
  b = test_flatten(&e, &n);
  decode_ok(b, n, 1, &f);
  pcp_proto_accept_t ac2;
  ASSERT_OK(pcp_proto_accept_parse(&f, &ac2));
  assert_int_equal(ac2.lease_epoch, 7);
  assert_true(ac2.resumed);
  assert_int_equal(ac2.heartbeat_interval_ms, 1000);
  assert_int_equal(ac2.max_in_flight, 8);
  assert_memory_equal(ac2.resume_token, ac.resume_token, 32);
  pcp_proto_frame_deinitialize(&f);
  free(b);

  pcp_proto_reject_t rj = {.reason = PCP_PROTO_REJECT_AUTH_FAILED,
                           .message = "bad proof"};
  ASSERT_OK(pcp_proto_reject_encode(1, 1, &rj, &l, a, &e));
  b = test_flatten(&e, &n);
  decode_ok(b, n, 1, &f);
  pcp_proto_reject_t rj2;
  ASSERT_OK(pcp_proto_reject_parse(&f, &rj2));
  assert_int_equal(rj2.reason, PCP_PROTO_REJECT_AUTH_FAILED);
  assert_string_equal(rj2.message, "bad proof");
  pcp_proto_frame_deinitialize(&f);
  free(b);

  pcp_proto_heartbeat_t hb = {.seq = 12, .ack = 11};
  ASSERT_OK(pcp_proto_heartbeat_encode(1, 0, &hb, &l, a, &e));
  b = test_flatten(&e, &n);
  decode_ok(b, n, 1, &f);
  pcp_proto_heartbeat_t hb2;
  ASSERT_OK(pcp_proto_heartbeat_parse(&f, &hb2));
  assert_int_equal(hb2.seq, 12);
  assert_int_equal(hb2.ack, 11);
  pcp_proto_frame_deinitialize(&f);
  free(b);

  pcp_proto_drain_t dr = {.deadline_ms = 30000};
  ASSERT_OK(pcp_proto_drain_encode(1, 0, &dr, &l, a, &e));
  b = test_flatten(&e, &n);
  decode_ok(b, n, 1, &f);
  pcp_proto_drain_t dr2;
  ASSERT_OK(pcp_proto_drain_parse(&f, &dr2));
  assert_int_equal(dr2.deadline_ms, 30000);
  pcp_proto_frame_deinitialize(&f);
  free(b);

  pcp_proto_shutdown_t sd = {.reason = "maintenance"};
  ASSERT_OK(pcp_proto_shutdown_encode(1, 0, &sd, &l, a, &e));
  b = test_flatten(&e, &n);
  decode_ok(b, n, 1, &f);
  pcp_proto_shutdown_t sd2;
  ASSERT_OK(pcp_proto_shutdown_parse(&f, &sd2));
  assert_string_equal(sd2.reason, "maintenance");
  pcp_proto_frame_deinitialize(&f);
  free(b);

  pcp_proto_program_offer_t po = {
      .byte_length = 1234, .backend = "cpu", .target = "host"};
  memset(po.program, 0x42, 32);
  ASSERT_OK(pcp_proto_program_offer_encode(1, 3, &po, &l, a, &e));
  b = test_flatten(&e, &n);
  decode_ok(b, n, 1, &f);
  pcp_proto_program_offer_t po2;
  ASSERT_OK(pcp_proto_program_offer_parse(&f, &po2));
  assert_memory_equal(po2.program, po.program, 32);
  assert_int_equal(po2.byte_length, 1234);
  assert_string_equal(po2.backend, "cpu");
  pcp_proto_frame_deinitialize(&f);
  free(b);

  pcp_proto_program_fetch_t pf;
  memset(pf.program, 0x43, 32);
  ASSERT_OK(pcp_proto_program_fetch_encode(1, 3, &pf, &l, a, &e));
  b = test_flatten(&e, &n);
  decode_ok(b, n, 1, &f);
  pcp_proto_program_fetch_t pf2;
  ASSERT_OK(pcp_proto_program_fetch_parse(&f, &pf2));
  assert_memory_equal(pf2.program, pf.program, 32);
  pcp_proto_frame_deinitialize(&f);
  free(b);

  pcp_proto_program_ack_t pa = {.status = PCP_PROTO_PROGRAM_STORED};
  memset(pa.program, 0x44, 32);
  ASSERT_OK(pcp_proto_program_ack_encode(1, 3, &pa, &l, a, &e));
  b = test_flatten(&e, &n);
  decode_ok(b, n, 1, &f);
  pcp_proto_program_ack_t pa2;
  ASSERT_OK(pcp_proto_program_ack_parse(&f, &pa2));
  assert_int_equal(pa2.status, PCP_PROTO_PROGRAM_STORED);
  pcp_proto_frame_deinitialize(&f);
  free(b);

  pcp_proto_task_progress_t tp = {.task_id = 9,
                                  .state = PCP_PROTO_TASK_RUNNING,
                                  .has_fraction = true,
                                  .fraction = 0.5};
  ASSERT_OK(pcp_proto_task_progress_encode(1, 4, &tp, &l, a, &e));
  b = test_flatten(&e, &n);
  decode_ok(b, n, 1, &f);
  pcp_proto_task_progress_t tp2;
  ASSERT_OK(pcp_proto_task_progress_parse(&f, &tp2));
  assert_int_equal(tp2.task_id, 9);
  assert_int_equal(tp2.state, PCP_PROTO_TASK_RUNNING);
  assert_true(tp2.has_fraction);
  assert_true(tp2.fraction == 0.5);
  pcp_proto_frame_deinitialize(&f);
  free(b);

  pcp_proto_task_cancel_t tc = {.task_id = 9, .reason = "preempted"};
  ASSERT_OK(pcp_proto_task_cancel_encode(1, 4, &tc, &l, a, &e));
  b = test_flatten(&e, &n);
  decode_ok(b, n, 1, &f);
  pcp_proto_task_cancel_t tc2;
  ASSERT_OK(pcp_proto_task_cancel_parse(&f, &tc2));
  assert_int_equal(tc2.task_id, 9);
  assert_string_equal(tc2.reason, "preempted");
  pcp_proto_frame_deinitialize(&f);
  free(b);
}

static void task_assign_and_result_round_trip(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  pcp_allocator_t a = pcp_allocator_system();
  float x[6] = {0, 1, 2, 3, 4, 5};
  int32_t y[3] = {7, 8, 9};
  pcp_proto_section_t sections[2] = {
      {.name = "x",
       .element_type = PCP_ELEMENT_TYPE_F32,
       .rank = 2,
       .shape = {2, 3},
       .data = x},
      {.name = "y",
       .element_type = PCP_ELEMENT_TYPE_I32,
       .rank = 1,
       .shape = {3},
       .data = y},
  };
  pcp_proto_tensor_ref_t inputs[3] = {
      {.kind = PCP_PROTO_TENSOR_REF_SECTION, .section = 0},
      {.kind = PCP_PROTO_TENSOR_REF_RESIDENT, .name = "w"},
      {.kind = PCP_PROTO_TENSOR_REF_BLOB,
       .name = "t:1:big",
       .element_type = PCP_ELEMENT_TYPE_BF16,
       .rank = 2,
       .shape = {4, 5}},
  };
  pcp_proto_keep_resident_t keep[1] = {{.output = 1, .as = "w"}};
  pcp_proto_task_assign_t in = {.task_id = 42,
                                .session_id = "s1",
                                .function = "main",
                                .inputs = inputs,
                                .input_count = 3,
                                .keep_resident = keep,
                                .keep_resident_count = 1,
                                .return_resident = true,
                                .hash_inputs = 2,
                                .hash_outputs = 1};
  memset(in.program, 0x77, 32);
  pcp_proto_encoded_frame_t e;
  ASSERT_OK(pcp_proto_task_assign_encode(1, 3, &in, sections, 2, &l, a, &e));
  // Scatter list: head, x, padding, y (tensor data is not copied).
  assert_int_equal(e.segment_count, 4);
  assert_ptr_equal(e.segments[1].data, x);
  assert_ptr_equal(e.segments[3].data, y);
  size_t n;
  uint8_t* b = test_flatten(&e, &n);
  pcp_proto_frame_t f;
  decode_ok(b, n, 1, &f);
  assert_int_equal(f.section_count, 2);
  assert_int_equal((uintptr_t)f.sections[0].data % 64, 0);
  assert_int_equal((uintptr_t)f.sections[1].data % 64, 0);
  assert_memory_equal(f.sections[0].data, x, sizeof(x));
  assert_memory_equal(f.sections[1].data, y, sizeof(y));
  assert_int_equal(f.sections[0].shape[1], 3);
  pcp_proto_task_assign_t out;
  ASSERT_OK(pcp_proto_task_assign_parse(&f, &out));
  assert_int_equal(out.task_id, 42);
  assert_string_equal(out.session_id, "s1");
  assert_string_equal(out.function, "main");
  assert_memory_equal(out.program, in.program, 32);
  assert_int_equal(out.input_count, 3);
  assert_int_equal(out.inputs[0].kind, PCP_PROTO_TENSOR_REF_SECTION);
  assert_int_equal(out.inputs[1].kind, PCP_PROTO_TENSOR_REF_RESIDENT);
  assert_string_equal(out.inputs[1].name, "w");
  assert_int_equal(out.inputs[2].kind, PCP_PROTO_TENSOR_REF_BLOB);
  assert_int_equal(out.inputs[2].element_type, PCP_ELEMENT_TYPE_BF16);
  assert_int_equal(out.inputs[2].shape[1], 5);
  assert_int_equal(out.keep_resident_count, 1);
  assert_string_equal(out.keep_resident[0].as, "w");
  assert_true(out.return_resident);
  assert_int_equal(out.hash_inputs, 2);
  assert_int_equal(out.hash_outputs, 1);
  pcp_proto_frame_deinitialize(&f);
  free(b);

  pcp_proto_tensor_ref_t outputs[1] = {
      {.kind = PCP_PROTO_TENSOR_REF_SECTION, .section = 0}};
  pcp_proto_task_result_t r = {
      .task_id = 42, .outputs = outputs, .output_count = 1, .elapsed_us = 1500};
  ASSERT_OK(pcp_proto_task_result_encode(1, 3, &r, sections, 1, &l, a, &e));
  b = test_flatten(&e, &n);
  decode_ok(b, n, 1, &f);
  pcp_proto_task_result_t r2;
  ASSERT_OK(pcp_proto_task_result_parse(&f, &r2));
  assert_int_equal(r2.task_id, 42);
  assert_int_equal(r2.output_count, 1);
  assert_int_equal(r2.elapsed_us, 1500);
  assert_memory_equal(f.sections[r2.outputs[0].section].data, x, sizeof(x));
  pcp_proto_frame_deinitialize(&f);
  free(b);

  // A reference to a section the frame does not have is refused.
  outputs[0].section = 3;
  ASSERT_CODE(pcp_proto_task_result_encode(1, 3, &r, sections, 1, &l, a, &e),
              PCP_STATUS_INVALID_ARGUMENT);
}

// Seeded-init refs: the worker fills the tensor itself, so every field is
// checked before it allocates anything.
static void init_refs_round_trip_and_hostile(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  pcp_allocator_t a = pcp_allocator_system();
  pcp_proto_tensor_ref_t inputs[2] = {
      {.kind = PCP_PROTO_TENSOR_REF_INIT,
       .init = PCP_PROTO_INIT_NORMAL,
       .seed = 0xfedcba9876543210ull,
       .index = UINT32_MAX,
       .element_type = PCP_ELEMENT_TYPE_F32,
       .rank = 2,
       .shape = {3, 5}},
      {.kind = PCP_PROTO_TENSOR_REF_INIT,
       .init = PCP_PROTO_INIT_ONES,
       .seed = 7,
       .index = 2,
       .element_type = PCP_ELEMENT_TYPE_BF16,
       .rank = 1,
       .shape = {64}},
  };
  pcp_proto_task_assign_t in = {.task_id = 9,
                                .function = "init",
                                .inputs = inputs,
                                .input_count = 2,
                                .hash_inputs = 2};
  pcp_proto_encoded_frame_t e;
  ASSERT_OK(pcp_proto_task_assign_encode(1, 3, &in, NULL, 0, &l, a, &e));
  size_t n;
  uint8_t* b = test_flatten(&e, &n);
  pcp_proto_frame_t f;
  decode_ok(b, n, 1, &f);
  assert_non_null(strstr((const char*)b + 40, "\"seed\":\"fedcba9876543210\""));
  pcp_proto_task_assign_t out;
  ASSERT_OK(pcp_proto_task_assign_parse(&f, &out));
  assert_int_equal(out.input_count, 2);
  assert_int_equal(out.inputs[0].kind, PCP_PROTO_TENSOR_REF_INIT);
  assert_int_equal(out.inputs[0].init, PCP_PROTO_INIT_NORMAL);
  assert_true(out.inputs[0].seed == 0xfedcba9876543210ull);
  assert_true(out.inputs[0].index == UINT32_MAX);
  assert_int_equal(out.inputs[0].element_type, PCP_ELEMENT_TYPE_F32);
  assert_int_equal(out.inputs[0].rank, 2);
  assert_int_equal(out.inputs[0].shape[0], 3);
  assert_int_equal(out.inputs[0].shape[1], 5);
  assert_int_equal(out.inputs[1].init, PCP_PROTO_INIT_ONES);
  assert_true(out.inputs[1].seed == 7);
  assert_int_equal(out.inputs[1].element_type, PCP_ELEMENT_TYPE_BF16);
  assert_int_equal(out.inputs[1].shape[0], 64);
  pcp_proto_frame_deinitialize(&f);
  free(b);

  // The encoder refuses what the decoder would.
  inputs[1].element_type = PCP_ELEMENT_TYPE_I32;
  ASSERT_CODE(pcp_proto_task_assign_encode(1, 3, &in, NULL, 0, &l, a, &e),
              PCP_STATUS_INVALID_ARGUMENT);
  inputs[1].element_type = PCP_ELEMENT_TYPE_BF16;
  inputs[1].shape[0] = (int64_t)1 << 40;  // 2 TiB of bf16
  ASSERT_CODE(pcp_proto_task_assign_encode(1, 3, &in, NULL, 0, &l, a, &e),
              PCP_STATUS_INVALID_ARGUMENT);
  // Only task inputs may be init refs.
  pcp_proto_task_result_t r = {
      .task_id = 9, .outputs = inputs, .output_count = 1};
  ASSERT_CODE(pcp_proto_task_result_encode(1, 3, &r, NULL, 0, &l, a, &e),
              PCP_STATUS_INVALID_ARGUMENT);

  // Hostile decodes: each is one bad field of an otherwise good ref.
  static const char* const kBad[] = {
      "\"init\":\"uniform\",\"seed\":\"0000000000000001\",\"index\":0,"
      "\"dtype\":1,\"shape\":[4]",
      "\"init\":7,\"seed\":\"0000000000000001\",\"index\":0,"
      "\"dtype\":1,\"shape\":[4]",
      "\"init\":\"normal\",\"seed\":\"1\",\"index\":0,\"dtype\":1,"
      "\"shape\":[4]",
      "\"init\":\"normal\",\"seed\":\"000000000000000G\",\"index\":0,"
      "\"dtype\":1,\"shape\":[4]",
      "\"init\":\"normal\",\"seed\":\"00000000000000001\",\"index\":0,"
      "\"dtype\":1,\"shape\":[4]",
      "\"init\":\"normal\",\"seed\":1,\"index\":0,\"dtype\":1,"
      "\"shape\":[4]",
      "\"init\":\"normal\",\"seed\":\"0000000000000001\","
      "\"index\":4294967296,\"dtype\":1,\"shape\":[4]",
      "\"init\":\"normal\",\"seed\":\"0000000000000001\",\"index\":-1,"
      "\"dtype\":1,\"shape\":[4]",
      "\"init\":\"normal\",\"seed\":\"0000000000000001\",\"index\":0,"
      "\"dtype\":1,\"shape\":[]",
      "\"init\":\"normal\",\"seed\":\"0000000000000001\",\"index\":0,"
      "\"dtype\":1,\"shape\":[4,0]",
      "\"init\":\"normal\",\"seed\":\"0000000000000001\",\"index\":0,"
      "\"dtype\":1,\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]",
      "\"init\":\"normal\",\"seed\":\"0000000000000001\",\"index\":0,"
      "\"dtype\":1,\"shape\":[65536,65536]",
      "\"init\":\"normal\",\"seed\":\"0000000000000001\",\"index\":0,"
      "\"dtype\":1,\"shape\":[4611686018427387904,4]",
      "\"init\":\"normal\",\"seed\":\"0000000000000001\",\"index\":0,"
      "\"shape\":[4]",
  };
  for (size_t k = 0; k < sizeof(kBad) / sizeof(kBad[0]); ++k) {
    const char* ref = kBad[k];
    char json[512];
    snprintf(json, sizeof(json),
             "{\"task_id\":1,\"program\":\"%064d\",\"function\":\"f\","
             "\"inputs\":[{%s}]}",
             0, ref);
    size_t len;
    b = build_raw((raw_opts_t){.type = PCP_PROTO_MESSAGE_TASK_ASSIGN}, json,
                  NULL, 0, &len);
    decode_ok(b, len, 1, &f);
    pcp_proto_task_assign_t m;
    pcp_status_t st = pcp_proto_task_assign_parse(&f, &m);
    if (!st) {
      fail_msg("accepted: %s", ref);
    }
    assert_int_equal(pcp_status_consume_code(st), PCP_STATUS_INVALID_ARGUMENT);
    pcp_proto_frame_deinitialize(&f);
    free(b);
  }
  // Wrong dtypes: i32 and 0.
  for (int dtype = 0; dtype < 2; ++dtype) {
    char json[512];
    snprintf(json, sizeof(json),
             "{\"task_id\":1,\"program\":\"%064d\",\"function\":\"f\","
             "\"inputs\":[{\"init\":\"zeros\",\"seed\":\"0000000000000001\","
             "\"index\":0,\"dtype\":%d,\"shape\":[4]}]}",
             0, dtype ? (int)PCP_ELEMENT_TYPE_I32 : 0);
    size_t len;
    b = build_raw((raw_opts_t){.type = PCP_PROTO_MESSAGE_TASK_ASSIGN}, json,
                  NULL, 0, &len);
    decode_ok(b, len, 1, &f);
    pcp_proto_task_assign_t m;
    ASSERT_CODE(pcp_proto_task_assign_parse(&f, &m),
                PCP_STATUS_INVALID_ARGUMENT);
    pcp_proto_frame_deinitialize(&f);
    free(b);
  }
  // A result output that claims to be an init ref is refused.
  size_t len;
  b = build_raw((raw_opts_t){.type = PCP_PROTO_MESSAGE_TASK_RESULT},
                "{\"task_id\":1,\"outputs\":[{\"init\":\"zeros\",\"seed\":"
                "\"0000000000000001\",\"index\":0,\"dtype\":3,\"shape\":[4]}]}",
                NULL, 0, &len);
  decode_ok(b, len, 1, &f);
  pcp_proto_task_result_t rr;
  ASSERT_CODE(pcp_proto_task_result_parse(&f, &rr),
              PCP_STATUS_INVALID_ARGUMENT);
  pcp_proto_frame_deinitialize(&f);
  free(b);
}

// Each init ref is at most 1 GiB, and so are all of one task's together:
// a small frame of many 1 GiB refs would otherwise make a worker allocate
// (and fill) a TiB. The encoder, the decoder and the shared check refuse
// the sum with a message that says so.
static void init_refs_total_is_bounded(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  pcp_allocator_t a = pcp_allocator_system();
  // 16384 x 16384 f32: exactly the per-ref ceiling.
  pcp_proto_tensor_ref_t inputs[3];
  for (int k = 0; k < 3; ++k) {
    inputs[k] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_INIT,
                                         .init = PCP_PROTO_INIT_ZEROS,
                                         .seed = 1,
                                         .index = (uint32_t)k,
                                         .element_type = PCP_ELEMENT_TYPE_F32,
                                         .rank = 2,
                                         .shape = {16384, 16384}};
  }
  ASSERT_OK(pcp_proto_init_refs_validate(inputs, 1));
  // A resident ref between them costs nothing and is skipped.
  inputs[1] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                                       .name = "p.0"};
  ASSERT_OK(pcp_proto_init_refs_validate(inputs, 2));
  pcp_status_t st = pcp_proto_init_refs_validate(inputs, 3);
  assert_true(st != NULL);
  assert_non_null(strstr(pcp_status_message(st), "in all"));
  assert_int_equal(pcp_status_consume_code(st), PCP_STATUS_INVALID_ARGUMENT);
  // Half a ceiling each: two fit, three do not.
  inputs[1] = inputs[0];
  for (int k = 0; k < 3; ++k) {
    inputs[k].shape[0] = 8192;
  }
  ASSERT_OK(pcp_proto_init_refs_validate(inputs, 2));
  pcp_proto_task_assign_t in = {
      .task_id = 9, .function = "init", .inputs = inputs, .input_count = 2};
  pcp_proto_encoded_frame_t e;
  ASSERT_OK(pcp_proto_task_assign_encode(1, 3, &in, NULL, 0, &l, a, &e));
  pcp_proto_encoded_frame_deinitialize(&e);
  in.input_count = 3;
  ASSERT_CODE(pcp_proto_task_assign_encode(1, 3, &in, NULL, 0, &l, a, &e),
              PCP_STATUS_INVALID_ARGUMENT);

  // The hostile frame: 1024 refs of 1 GiB each, a few tens of KB of JSON.
  size_t cap = 1024 * 160 + 256, used = 0;
  char* json = malloc(cap);
  assert_non_null(json);
  used += (size_t)snprintf(json + used, cap - used,
                           "{\"task_id\":1,\"program\":\"%064d\","
                           "\"function\":\"f\",\"inputs\":[",
                           0);
  for (int k = 0; k < 1024; ++k) {
    used += (size_t)snprintf(json + used, cap - used,
                             "%s{\"init\":\"zeros\",\"seed\":"
                             "\"0000000000000001\",\"index\":%d,\"dtype\":%d,"
                             "\"shape\":[16384,16384]}",
                             k ? "," : "", k, (int)PCP_ELEMENT_TYPE_F32);
  }
  used += (size_t)snprintf(json + used, cap - used, "]}");
  assert_true(used < cap);
  size_t len;
  uint8_t* b = build_raw((raw_opts_t){.type = PCP_PROTO_MESSAGE_TASK_ASSIGN},
                         json, NULL, 0, &len);
  free(json);
  pcp_proto_frame_t f;
  decode_ok(b, len, 1, &f);
  pcp_proto_task_assign_t m;
  st = pcp_proto_task_assign_parse(&f, &m);
  assert_true(st != NULL);
  assert_non_null(strstr(pcp_status_message(st), "in all"));
  assert_int_equal(pcp_status_consume_code(st), PCP_STATUS_INVALID_ARGUMENT);
  pcp_proto_frame_deinitialize(&f);
  free(b);
}

static void error_frame_maps_status(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  pcp_status_t original =
      pcp_make_status(PCP_STATUS_NOT_FOUND, "task %d not found", 42);
  original = pcp_status_annotate_f(original, "running on worker w-1");
  pcp_proto_encoded_frame_t e;
  ASSERT_OK(pcp_proto_error_encode(1, 9, original, 42, &l,
                                   pcp_allocator_system(), &e));
  pcp_status_ignore(original);
  size_t n;
  uint8_t* b = test_flatten(&e, &n);
  pcp_proto_frame_t f;
  decode_ok(b, n, 1, &f);
  pcp_status_t peer = NULL;
  uint64_t task_id = 0;
  ASSERT_OK(pcp_proto_error_parse(&f, &peer, &task_id));
  assert_int_equal(pcp_status_code(peer), PCP_STATUS_NOT_FOUND);
  assert_int_equal(task_id, 42);
  assert_string_equal(pcp_status_message(peer),
                      "task 42 not found; running on worker w-1");
  char* text = pcp_status_to_string(peer);
  assert_non_null(strstr(text, "from peer"));
  assert_null(strstr(text, "proto_test.c"));  // no source location sent
  free(text);
  pcp_status_ignore(peer);
  pcp_proto_frame_deinitialize(&f);
  free(b);

  // Every canonical code survives the trip.
  for (int code = 1; code < PCP_STATUS_CODE_COUNT_; ++code) {
    pcp_status_t s = pcp_make_status((pcp_status_code_t)code, "c%d", code);
    ASSERT_OK(
        pcp_proto_error_encode(1, 0, s, 0, &l, pcp_allocator_system(), &e));
    pcp_status_ignore(s);
    b = test_flatten(&e, &n);
    decode_ok(b, n, 1, &f);
    ASSERT_OK(pcp_proto_error_parse(&f, &peer, &task_id));
    assert_int_equal(pcp_status_code(peer), code);
    pcp_status_ignore(peer);
    pcp_proto_frame_deinitialize(&f);
    free(b);
  }

  // A code from a newer peer becomes UNKNOWN; code 0 is malformed.
  raw_opts_t o = {.type = PCP_PROTO_MESSAGE_ERROR};
  b = build_raw(o, "{\"code\":200,\"message\":\"future\"}", NULL, 0, &n);
  decode_ok(b, n, 1, &f);
  ASSERT_OK(pcp_proto_error_parse(&f, &peer, &task_id));
  assert_int_equal(pcp_status_code(peer), PCP_STATUS_UNKNOWN);
  assert_non_null(strstr(pcp_status_message(peer), "200"));
  pcp_status_ignore(peer);
  pcp_proto_frame_deinitialize(&f);
  free(b);
  b = build_raw(o, "{\"code\":0,\"message\":\"ok?\"}", NULL, 0, &n);
  decode_ok(b, n, 1, &f);
  ASSERT_CODE(pcp_proto_error_parse(&f, &peer, &task_id),
              PCP_STATUS_INVALID_ARGUMENT);
  assert_null(peer);
  pcp_proto_frame_deinitialize(&f);
  free(b);

  // Long messages are cut to 4096 bytes on a UTF-8 boundary.
  char big[6000];
  for (size_t i = 0; i + 2 < sizeof(big); i += 2) {
    big[i] = (char)0xC3;  // U+00E9, two bytes
    big[i + 1] = (char)0xA9;
  }
  big[sizeof(big) - 1] = '\0';
  big[sizeof(big) - 2] = 'x';
  pcp_status_t s = pcp_make_status(PCP_STATUS_INTERNAL, "x%s", big);
  ASSERT_OK(pcp_proto_error_encode(1, 0, s, 0, &l, pcp_allocator_system(), &e));
  pcp_status_ignore(s);
  b = test_flatten(&e, &n);
  decode_ok(b, n, 1, &f);
  ASSERT_OK(pcp_proto_error_parse(&f, &peer, &task_id));
  assert_true(strlen(pcp_status_message(peer)) <= 4096);
  pcp_status_ignore(peer);
  pcp_proto_frame_deinitialize(&f);
  free(b);
}

static void byte_at_a_time_stream(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  pcp_allocator_t a = pcp_allocator_system();
  // Three frames back to back: heartbeat, task assign with sections, hello.
  uint8_t* parts[3];
  size_t lengths[3];
  pcp_proto_encoded_frame_t e;
  pcp_proto_heartbeat_t hb = {.seq = 1, .ack = 0};
  ASSERT_OK(pcp_proto_heartbeat_encode(1, 0, &hb, &l, a, &e));
  parts[0] = test_flatten(&e, &lengths[0]);
  double d[5] = {1, 2, 3, 4, 5};
  pcp_proto_section_t s = {.name = "d",
                           .element_type = PCP_ELEMENT_TYPE_F64,
                           .rank = 1,
                           .shape = {5},
                           .data = d};
  pcp_proto_tensor_ref_t in = {.kind = PCP_PROTO_TENSOR_REF_SECTION};
  pcp_proto_task_assign_t t = {
      .task_id = 1, .function = "f", .inputs = &in, .input_count = 1};
  ASSERT_OK(pcp_proto_task_assign_encode(1, 2, &t, &s, 1, &l, a, &e));
  parts[1] = test_flatten(&e, &lengths[1]);
  pcp_proto_hello_t h = {.min_version = 1, .max_version = 1, .role = "worker"};
  ASSERT_OK(pcp_proto_hello_encode(1, 0, &h, &l, a, &e));
  parts[2] = test_flatten(&e, &lengths[2]);
  size_t total = lengths[0] + lengths[1] + lengths[2];
  uint8_t* stream = malloc(total);
  memcpy(stream, parts[0], lengths[0]);
  memcpy(stream + lengths[0], parts[1], lengths[1]);
  memcpy(stream + lengths[0] + lengths[1], parts[2], lengths[2]);

  pcp_proto_frame_decoder_t decoder;
  pcp_proto_frame_decoder_initialize(&l, a, &decoder);
  pcp_proto_frame_decoder_set_version(&decoder, 1);
  int frames = 0;
  uint16_t types[3] = {0};
  for (size_t i = 0; i < total; ++i) {
    size_t consumed = 0;
    pcp_proto_parse_result_t r;
    ASSERT_OK(
        pcp_proto_frame_decoder_feed(&decoder, stream + i, 1, &consumed, &r));
    assert_int_equal(consumed, 1);
    if (r == PCP_PROTO_PARSE_FRAME_READY) {
      pcp_proto_frame_t f;
      pcp_proto_frame_decoder_take(&decoder, &f);
      types[frames++] = f.header.type;
      if (f.header.type == PCP_PROTO_MESSAGE_TASK_ASSIGN) {
        assert_memory_equal(f.sections[0].data, d, sizeof(d));
      }
      pcp_proto_frame_deinitialize(&f);
    }
  }
  assert_int_equal(frames, 3);
  assert_int_equal(types[0], PCP_PROTO_MESSAGE_HEARTBEAT);
  assert_int_equal(types[1], PCP_PROTO_MESSAGE_TASK_ASSIGN);
  assert_int_equal(types[2], PCP_PROTO_MESSAGE_HELLO);

  // The same stream in one call stops after each frame.
  size_t offset = 0;
  frames = 0;
  while (offset < total) {
    size_t consumed = 0;
    pcp_proto_parse_result_t r;
    ASSERT_OK(pcp_proto_frame_decoder_feed(&decoder, stream + offset,
                                           total - offset, &consumed, &r));
    assert_int_equal(r, PCP_PROTO_PARSE_FRAME_READY);
    assert_int_equal(consumed, lengths[frames]);
    offset += consumed;
    pcp_proto_frame_t f;
    pcp_proto_frame_decoder_take(&decoder, &f);
    pcp_proto_frame_deinitialize(&f);
    frames++;
  }
  assert_int_equal(frames, 3);
  pcp_proto_frame_decoder_deinitialize(&decoder);
  for (int i = 0; i < 3; ++i) free(parts[i]);
  free(stream);
}

static void limit_frame_size_checked_before_allocation(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  pcp_allocator_counting_t counter;
  pcp_allocator_counting_initialize(pcp_allocator_system(), &counter);
  pcp_proto_frame_decoder_t decoder;
  pcp_proto_frame_decoder_initialize(&l, pcp_allocator_counting(&counter),
                                     &decoder);
  pcp_proto_header_t h = {.version = 1,
                          .type = PCP_PROTO_MESSAGE_TASK_ASSIGN,
                          .payload_length = l.max_frame_bytes};  // +32 > max
  uint8_t b[32];
  pcp_proto_header_encode(&h, b);
  size_t consumed;
  pcp_proto_parse_result_t r;
  ASSERT_CODE(pcp_proto_frame_decoder_feed(&decoder, b, 32, &consumed, &r),
              PCP_STATUS_RESOURCE_EXHAUSTED);
  assert_int_equal(counter.allocation_count, 0);
  // The decoder stays failed.
  ASSERT_CODE(pcp_proto_frame_decoder_feed(&decoder, b, 1, &consumed, &r),
              PCP_STATUS_FAILED_PRECONDITION);
  pcp_proto_frame_decoder_deinitialize(&decoder);
  // A payload shorter than its own prefix.
  h.payload_length = 4;
  pcp_proto_header_encode(&h, b);
  pcp_proto_header_t out;
  ASSERT_CODE(pcp_proto_header_decode(b, &l, 0, &out),
              PCP_STATUS_INVALID_ARGUMENT);
}

static void limit_json_length_checked_from_prefix(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  l.max_json_bytes = 64;
  pcp_proto_frame_decoder_t decoder;
  pcp_proto_frame_decoder_initialize(&l, pcp_allocator_system(), &decoder);
  pcp_proto_header_t h = {.version = 1,
                          .type = PCP_PROTO_MESSAGE_HEARTBEAT,
                          .payload_length = 1000};
  uint8_t b[40] = {0};
  pcp_proto_header_encode(&h, b);
  b[32] = 200;  // json_length 200 > 64
  size_t consumed;
  pcp_proto_parse_result_t r;
  // Fails on the 8th payload byte, long before the 1000 arrive.
  ASSERT_CODE(pcp_proto_frame_decoder_feed(&decoder, b, 40, &consumed, &r),
              PCP_STATUS_RESOURCE_EXHAUSTED);
  pcp_proto_frame_decoder_deinitialize(&decoder);
  // JSON longer than the payload.
  pcp_proto_frame_decoder_initialize(&l, pcp_allocator_system(), &decoder);
  b[32] = 60;
  h.payload_length = 30;
  pcp_proto_header_encode(&h, b);
  ASSERT_CODE(pcp_proto_frame_decoder_feed(&decoder, b, 40, &consumed, &r),
              PCP_STATUS_INVALID_ARGUMENT);
  pcp_proto_frame_decoder_deinitialize(&decoder);
  // The encoder refuses to produce what the receiver would refuse.
  json_t* o = json_pack("{s:s}", "k",
                        "0123456789012345678901234567890123456789"
                        "0123456789012345678901234567890123456789");
  pcp_proto_encoded_frame_t e;
  ASSERT_CODE(pcp_proto_frame_encode(1, 7, 0, o, NULL, 0, &l,
                                     pcp_allocator_system(), &e),
              PCP_STATUS_RESOURCE_EXHAUSTED);
  json_decref(o);
}

static void limit_json_depth(void** state) {
  (void)state;
  char json[200] = "{\"a\":";
  size_t n = strlen(json);
  for (int i = 0; i < 40; ++i) json[n++] = '[';
  for (int i = 0; i < 40; ++i) json[n++] = ']';
  json[n++] = '}';
  json[n] = '\0';
  raw_opts_t o = {.type = PCP_PROTO_MESSAGE_HEARTBEAT};
  size_t len;
  uint8_t* b = build_raw(o, json, NULL, 0, &len);
  ASSERT_CODE(decode_raw(b, len, 1), PCP_STATUS_INVALID_ARGUMENT);
  free(b);
  // Brackets inside strings do not count.
  b = build_raw(o, "{\"a\":\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"}", NULL,
                0, &len);
  ASSERT_OK(decode_raw(b, len, 1));
  free(b);
}

static void limit_sections_and_rank(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  l.max_sections = 2;
  uint8_t byte = 1;
  pcp_proto_section_t s[3];
  for (int i = 0; i < 3; ++i) {
    s[i] = (pcp_proto_section_t){.name = "b",
                                 .element_type = PCP_ELEMENT_TYPE_U8,
                                 .rank = 1,
                                 .shape = {1},
                                 .data = &byte};
  }
  json_t* o = json_object();
  pcp_proto_encoded_frame_t e;
  ASSERT_CODE(
      pcp_proto_frame_encode(1, 34, 0, o, s, 3, &l, pcp_allocator_system(), &e),
      PCP_STATUS_RESOURCE_EXHAUSTED);
  // Encode with a generous limit, decode with the strict one.
  pcp_proto_limits_t wide = limits();
  ASSERT_OK(pcp_proto_frame_encode(1, 34, 0, o, s, 3, &wide,
                                   pcp_allocator_system(), &e));
  size_t n;
  uint8_t* b = test_flatten(&e, &n);
  pcp_proto_frame_t f;
  ASSERT_CODE(pcp_proto_frame_decode(b, n, &l, 1, pcp_allocator_system(), &f),
              PCP_STATUS_RESOURCE_EXHAUSTED);
  free(b);
  // Rank over the limit, on both sides.
  pcp_proto_section_t r = {.name = "r",
                           .element_type = PCP_ELEMENT_TYPE_U8,
                           .rank = 5,
                           .shape = {1, 1, 1, 1, 1},
                           .data = &byte};
  ASSERT_OK(pcp_proto_frame_encode(1, 34, 0, o, &r, 1, &wide,
                                   pcp_allocator_system(), &e));
  b = test_flatten(&e, &n);
  l = limits();
  l.max_rank = 4;
  ASSERT_CODE(pcp_proto_frame_decode(b, n, &l, 1, pcp_allocator_system(), &f),
              PCP_STATUS_INVALID_ARGUMENT);
  ASSERT_CODE(pcp_proto_frame_encode(1, 34, 0, o, &r, 1, &l,
                                     pcp_allocator_system(), &e),
              PCP_STATUS_INVALID_ARGUMENT);
  free(b);
  json_decref(o);
}

static void bad_sections_are_refused(void** state) {
  (void)state;
  uint8_t data[64] = {1, 2, 3, 4};
  uint32_t crc4 = pcp_proto_crc32c(data, 4);
  char json[256];
  raw_opts_t o = {.type = PCP_PROTO_MESSAGE_TASK_RESULT};
  size_t n;
  uint8_t* b;
  // Good, to prove the builder is right.
  snprintf(json, sizeof(json),
           "{\"sections\":[{\"name\":\"a\",\"dtype\":10,\"shape\":[4],"
           "\"offset\":0,\"length\":4,\"crc32c\":%u}]}",
           crc4);
  b = build_raw(o, json, data, 4, &n);
  ASSERT_OK(decode_raw(b, n, 1));
  free(b);
  // Section checksum.
  snprintf(json, sizeof(json),
           "{\"sections\":[{\"name\":\"a\",\"dtype\":10,\"shape\":[4],"
           "\"offset\":0,\"length\":4,\"crc32c\":%u}]}",
           crc4 ^ 1);
  b = build_raw(o, json, data, 4, &n);
  ASSERT_CODE(decode_raw(b, n, 1), PCP_STATUS_DATA_LOSS);
  free(b);
  // Length that does not match dtype x shape.
  snprintf(json, sizeof(json),
           "{\"sections\":[{\"name\":\"a\",\"dtype\":1,\"shape\":[4],"
           "\"offset\":0,\"length\":4,\"crc32c\":%u}]}",
           crc4);
  b = build_raw(o, json, data, 4, &n);
  ASSERT_CODE(decode_raw(b, n, 1), PCP_STATUS_INVALID_ARGUMENT);
  free(b);
  // Unknown dtype, dtype 0, negative dim, overflowing shape.
  const char* bad[] = {
      "{\"sections\":[{\"name\":\"a\",\"dtype\":99,\"shape\":[4],"
      "\"offset\":0,\"length\":4,\"crc32c\":0}]}",
      "{\"sections\":[{\"name\":\"a\",\"dtype\":0,\"shape\":[4],"
      "\"offset\":0,\"length\":4,\"crc32c\":0}]}",
      "{\"sections\":[{\"name\":\"a\",\"dtype\":10,\"shape\":[-4],"
      "\"offset\":0,\"length\":4,\"crc32c\":0}]}",
      "{\"sections\":[{\"name\":\"a\",\"dtype\":9,\"shape\":"
      "[4294967296,4294967296],\"offset\":0,\"length\":4,\"crc32c\":0}]}",
      "{\"sections\":[{\"name\":\"a\",\"dtype\":10,\"shape\":[4],"
      "\"offset\":8,\"length\":4,\"crc32c\":0}]}",
      "{\"sections\":[{\"name\":\"a\",\"dtype\":10,\"shape\":[4],"
      "\"offset\":64,\"length\":4,\"crc32c\":0}]}",
      "{\"sections\":[{\"dtype\":10,\"shape\":[4],"
      "\"offset\":0,\"length\":4,\"crc32c\":0}]}",
      "{\"sections\":{}}",
      "[1,2]",
      "{\"a\":1,\"a\":2}",
      "{\"a\":",
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(bad); ++i) {
    b = build_raw(o, bad[i], data, 4, &n);
    pcp_status_t s = decode_raw(b, n, 1);
    assert_non_null(s);
    pcp_status_code_t code = pcp_status_consume_code(s);
    assert_true(code == PCP_STATUS_INVALID_ARGUMENT ||
                code == PCP_STATUS_DATA_LOSS);
    free(b);
  }
  // Non-zero padding between the JSON and the data area.
  snprintf(json, sizeof(json),
           "{\"sections\":[{\"name\":\"a\",\"dtype\":10,\"shape\":[4],"
           "\"offset\":0,\"length\":4,\"crc32c\":%u}]}",
           crc4);
  o.pad_garbage = 1;
  b = build_raw(o, json, data, 4, &n);
  ASSERT_CODE(decode_raw(b, n, 1), PCP_STATUS_INVALID_ARGUMENT);
  free(b);
  // Trailing bytes after a frame without sections.
  o.pad_garbage = 0;
  b = build_raw(o, "{}", data, 4, &n);
  ASSERT_CODE(decode_raw(b, n, 1), PCP_STATUS_INVALID_ARGUMENT);
  free(b);
}

static void checksums_magic_flags_versions(void** state) {
  (void)state;
  size_t n;
  uint8_t* b;
  raw_opts_t o = {.type = PCP_PROTO_MESSAGE_HEARTBEAT};
  const char* hb = "{\"seq\":1,\"ack\":0}";
  b = build_raw(o, hb, NULL, 0, &n);
  ASSERT_OK(decode_raw(b, n, 1));
  free(b);
  o.bad_header_crc = true;
  b = build_raw(o, hb, NULL, 0, &n);
  ASSERT_CODE(decode_raw(b, n, 1), PCP_STATUS_DATA_LOSS);
  free(b);
  o.bad_header_crc = false;
  o.bad_json_crc = true;
  b = build_raw(o, hb, NULL, 0, &n);
  ASSERT_CODE(decode_raw(b, n, 1), PCP_STATUS_DATA_LOSS);
  free(b);
  o.bad_json_crc = false;
  o.magic = 'G';  // "GCPF": e.g. an HTTP client on the fabric port
  b = build_raw(o, hb, NULL, 0, &n);
  ASSERT_CODE(decode_raw(b, n, 1), PCP_STATUS_INVALID_ARGUMENT);
  free(b);
  o.magic = 0;
  o.flags = 1;
  b = build_raw(o, hb, NULL, 0, &n);
  ASSERT_CODE(decode_raw(b, n, 1), PCP_STATUS_INVALID_ARGUMENT);
  free(b);
  o.flags = 0;
  // Versions: a HELLO from the future decodes (its layout is frozen) ...
  o.type = PCP_PROTO_MESSAGE_HELLO;
  o.version = 7;
  b = build_raw(o,
                "{\"min_version\":5,\"max_version\":7,\"role\":\"worker\","
                "\"future_key\":{\"x\":1}}",
                NULL, 0, &n);
  pcp_proto_frame_t f;
  decode_ok(b, n, 0, &f);
  pcp_proto_hello_t hello;
  ASSERT_OK(pcp_proto_hello_parse(&f, &hello));
  assert_int_equal(hello.max_version, 7);
  assert_int_equal(
      pcp_proto_version_select(1, 1, hello.min_version, hello.max_version), 0);
  pcp_proto_frame_deinitialize(&f);
  free(b);
  // ... also after negotiation ...
  b = build_raw(o, "{\"min_version\":1,\"max_version\":7,\"role\":\"worker\"}",
                NULL, 0, &n);
  ASSERT_OK(decode_raw(b, n, 1));
  free(b);
  // ... but any other message in an unknown version is INCOMPATIBLE.
  o.type = PCP_PROTO_MESSAGE_HEARTBEAT;
  b = build_raw(o, hb, NULL, 0, &n);
  ASSERT_CODE(decode_raw(b, n, 0), PCP_STATUS_INCOMPATIBLE);
  ASSERT_CODE(decode_raw(b, n, 1), PCP_STATUS_INCOMPATIBLE);
  free(b);
  assert_int_equal(pcp_proto_version_select(1, 3, 2, 5), 3);
  assert_int_equal(pcp_proto_version_select(2, 3, 1, 1), 0);
  assert_int_equal(pcp_proto_version_select(1, 1, 1, 1), 1);
  // Truncated input.
  o.version = 0;
  b = build_raw(o, hb, NULL, 0, &n);
  ASSERT_CODE(decode_raw(b, n - 1, 1), PCP_STATUS_OUT_OF_RANGE);
  free(b);
}

static void limits_validate(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  ASSERT_OK(pcp_proto_limits_validate(&l));
  l.max_json_depth = 0;
  ASSERT_CODE(pcp_proto_limits_validate(&l), PCP_STATUS_INVALID_ARGUMENT);
  l = limits();
  l.max_frame_bytes = PCP_PROTO_CEILING_FRAME_BYTES + 1;
  ASSERT_CODE(pcp_proto_limits_validate(&l), PCP_STATUS_INVALID_ARGUMENT);
  l = limits();
  l.chunk_bytes = l.max_chunk_bytes + 1;
  ASSERT_CODE(pcp_proto_limits_validate(&l), PCP_STATUS_INVALID_ARGUMENT);
  l = limits();
  l.max_frame_bytes = l.chunk_bytes;
  ASSERT_CODE(pcp_proto_limits_validate(&l), PCP_STATUS_INVALID_ARGUMENT);
  pcp_proto_timeouts_t t = pcp_proto_timeouts_from_heartbeat(1000);
  assert_int_equal(t.heartbeat_interval_ns, 1000000000);
  assert_int_equal(t.silence_timeout_ns, 3000000000);
  assert_int_equal(t.handshake_timeout_ns, 5000000000);
  assert_int_equal(t.backoff_initial_ns, 100000000);
  assert_int_equal(t.backoff_max_ns, 5000000000);
  t = pcp_proto_timeouts_from_heartbeat(1);
  assert_int_equal(t.heartbeat_interval_ns,
                   (int64_t)PCP_PROTO_HEARTBEAT_MIN_MS * 1000000);
}

typedef struct chunk_sink_t {
  uint8_t* frames[64];
  size_t lengths[64];
  size_t count;
} chunk_sink_t;

static pcp_status_t sink_chunk(void* user_data,
                               pcp_proto_encoded_frame_t* frame) {
  chunk_sink_t* sink = user_data;
  sink->frames[sink->count] = test_flatten(frame, &sink->lengths[sink->count]);
  sink->count++;
  return pcp_ok_status();
}

static void blob_chunks_assemble_and_verify(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  l.chunk_bytes = 1000;
  size_t total = 4500;
  uint8_t* blob = malloc(total);
  for (size_t i = 0; i < total; ++i) blob[i] = (uint8_t)(i * 31 + 7);
  chunk_sink_t sink = {0};
  // A program blob: the last chunk carries the whole blob's SHA-256 (its
  // content address); tensor blobs carry none (tensor_blob_* below).
  ASSERT_OK(pcp_proto_blob_encode_chunks(
      1, 8, "blob-1", PCP_PROTO_BLOB_PROGRAM, blob, total, &l,
      pcp_allocator_system(), sink_chunk, &sink));
  assert_int_equal(sink.count, 5);
  pcp_proto_blob_assembly_t assembly;
  for (size_t i = 0; i < sink.count; ++i) {
    pcp_proto_frame_t f;
    decode_ok(sink.frames[i], sink.lengths[i], 1, &f);
    pcp_proto_blob_chunk_t chunk;
    ASSERT_OK(pcp_proto_blob_chunk_parse(&f, &chunk));
    assert_int_equal(chunk.index, i);
    assert_int_equal(chunk.has_sha256, i == 4);
    bool complete = false;
    if (i == 0) {
      ASSERT_OK(pcp_proto_blob_assembly_initialize(
          8, &chunk, &l, pcp_allocator_system(), &assembly));
    } else {
      ASSERT_OK(pcp_proto_blob_assembly_add(&assembly, &chunk, &complete));
    }
    assert_int_equal(complete, i == 4);
    pcp_proto_frame_deinitialize(&f);
  }
  uint8_t* out = NULL;
  uint64_t out_length = 0;
  pcp_proto_blob_assembly_take(&assembly, &out, &out_length);
  assert_int_equal(out_length, total);
  assert_memory_equal(out, blob, total);
  assert_int_equal((uintptr_t)out % 64, 0);
  pcp_proto_blob_free(pcp_allocator_system(), out);

  // Out of order: chunk 2 after chunk 0.
  pcp_proto_frame_t f0, f2;
  decode_ok(sink.frames[0], sink.lengths[0], 1, &f0);
  decode_ok(sink.frames[2], sink.lengths[2], 1, &f2);
  pcp_proto_blob_chunk_t c0, c2;
  ASSERT_OK(pcp_proto_blob_chunk_parse(&f0, &c0));
  ASSERT_OK(pcp_proto_blob_chunk_parse(&f2, &c2));
  ASSERT_OK(pcp_proto_blob_assembly_initialize(
      8, &c0, &l, pcp_allocator_system(), &assembly));
  bool complete;
  ASSERT_CODE(pcp_proto_blob_assembly_add(&assembly, &c2, &complete),
              PCP_STATUS_INVALID_ARGUMENT);
  pcp_proto_blob_assembly_deinitialize(&assembly);
  // Starting anywhere but chunk 0.
  ASSERT_CODE(pcp_proto_blob_assembly_initialize(
                  8, &c2, &l, pcp_allocator_system(), &assembly),
              PCP_STATUS_INVALID_ARGUMENT);
  // A total over the blob limit, refused before allocating it.
  pcp_proto_limits_t small = l;
  small.max_blob_bytes = 4000;
  ASSERT_CODE(pcp_proto_blob_assembly_initialize(
                  8, &c0, &small, pcp_allocator_system(), &assembly),
              PCP_STATUS_RESOURCE_EXHAUSTED);
  // A chunk bigger than the receiver's chunk limit.
  small = l;
  small.max_chunk_bytes = 999;
  {
    pcp_proto_blob_chunk_t single = c0;
    single.count = 5;
    ASSERT_CODE(pcp_proto_blob_assembly_initialize(
                    8, &single, &small, pcp_allocator_system(), &assembly),
                PCP_STATUS_RESOURCE_EXHAUSTED);
  }
  // A chunk count that cannot carry the total at max_chunk_bytes.
  small = l;
  small.max_chunk_bytes = 500;
  ASSERT_CODE(pcp_proto_blob_assembly_initialize(
                  8, &c0, &small, pcp_allocator_system(), &assembly),
              PCP_STATUS_INVALID_ARGUMENT);

  // A wrong SHA-256 on the last chunk: DATA_LOSS.
  ASSERT_OK(pcp_proto_blob_assembly_initialize(
      8, &c0, &l, pcp_allocator_system(), &assembly));
  for (size_t i = 1; i < sink.count; ++i) {
    pcp_proto_frame_t f;
    decode_ok(sink.frames[i], sink.lengths[i], 1, &f);
    pcp_proto_blob_chunk_t chunk;
    ASSERT_OK(pcp_proto_blob_chunk_parse(&f, &chunk));
    if (i + 1 == sink.count) {
      chunk.sha256[0] ^= 1;
      ASSERT_CODE(pcp_proto_blob_assembly_add(&assembly, &chunk, &complete),
                  PCP_STATUS_DATA_LOSS);
    } else {
      ASSERT_OK(pcp_proto_blob_assembly_add(&assembly, &chunk, &complete));
    }
    pcp_proto_frame_deinitialize(&f);
  }
  pcp_proto_blob_assembly_deinitialize(&assembly);
  pcp_proto_frame_deinitialize(&f0);
  pcp_proto_frame_deinitialize(&f2);
  for (size_t i = 0; i < sink.count; ++i) free(sink.frames[i]);
  free(blob);
}

// Where the test data sink puts a blob's data areas.
typedef struct direct_sink_t {
  uint8_t* buffer;
  uint64_t filled;
  uint64_t capacity;
  size_t calls;
} direct_sink_t;

static uint8_t* direct_sink(void* user_data, pcp_proto_frame_t* head,
                            uint64_t data_length) {
  direct_sink_t* d = user_data;
  pcp_proto_blob_chunk_t chunk;
  pcp_status_t status = pcp_proto_blob_chunk_parse(head, &chunk);
  if (status || chunk.offset != d->filled ||
      data_length > d->capacity - d->filled) {
    pcp_status_ignore(status);
    return NULL;
  }
  assert_null(chunk.data);  // nothing of the data area has arrived yet
  d->calls++;
  uint8_t* dest = d->buffer + d->filled;
  d->filled += data_length;
  return dest;
}

// Feeds |n| bytes in pieces of at most |piece| through the window API.
static pcp_status_t feed_window(pcp_proto_frame_decoder_t* decoder,
                                const uint8_t* bytes, size_t n, size_t piece,
                                pcp_proto_parse_result_t* out_result) {
  size_t at = 0;
  *out_result = PCP_PROTO_PARSE_NEED_MORE;
  while (at < n && *out_result == PCP_PROTO_PARSE_NEED_MORE) {
    void* window = NULL;
    size_t capacity = 0;
    PCP_RETURN_IF_ERROR_BARE(
        pcp_proto_frame_decoder_window(decoder, &window, &capacity));
    size_t k = n - at < capacity ? n - at : capacity;
    if (k > piece)
      k = piece;
    memcpy(window, bytes + at, k);
    at += k;
    PCP_RETURN_IF_ERROR_BARE(
        pcp_proto_frame_decoder_commit(decoder, k, out_result));
  }
  return pcp_ok_status();
}

// Tensor blobs: no SHA-256 on the wire; each chunk's data area is read
// straight into the destination through the decoder's data sink and checked
// there by its CRC32C; a corrupted chunk is DATA_LOSS.
static void tensor_blob_chunks_direct_and_crc(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  l.chunk_bytes = 1000;
  size_t total = 4500;
  uint8_t* blob = malloc(total);
  for (size_t i = 0; i < total; ++i) blob[i] = (uint8_t)(i * 13 + 5);
  chunk_sink_t sink = {0};
  ASSERT_OK(pcp_proto_blob_encode_chunks(
      1, 8, "t1.s0", PCP_PROTO_BLOB_TENSOR, blob, total, &l,
      pcp_allocator_system(), sink_chunk, &sink));
  assert_int_equal(sink.count, 5);
  uint8_t* into = malloc(total);
  direct_sink_t d = {.buffer = into, .capacity = total};
  pcp_proto_frame_decoder_t decoder;
  pcp_proto_frame_decoder_initialize(&l, pcp_allocator_system(), &decoder);
  pcp_proto_frame_decoder_set_version(&decoder, 1);
  pcp_proto_frame_decoder_set_data_sink(&decoder, direct_sink, &d);
  pcp_proto_blob_assembly_t assembly;
  for (size_t i = 0; i < sink.count; ++i) {
    pcp_proto_parse_result_t result;
    // Odd pieces: the head boundary falls inside a piece's window.
    ASSERT_OK(
        feed_window(&decoder, sink.frames[i], sink.lengths[i], 77, &result));
    assert_int_equal(result, PCP_PROTO_PARSE_FRAME_READY);
    pcp_proto_frame_t f = {0};
    pcp_proto_frame_decoder_take(&decoder, &f);
    pcp_proto_blob_chunk_t chunk;
    ASSERT_OK(pcp_proto_blob_chunk_parse(&f, &chunk));
    assert_false(chunk.has_sha256);
    assert_ptr_equal(chunk.data, into + i * 1000);
    bool complete = false;
    if (i == 0) {
      ASSERT_OK(pcp_proto_blob_assembly_initialize(
          8, &chunk, &l, pcp_allocator_system(), &assembly));
    } else {
      ASSERT_OK(pcp_proto_blob_assembly_add(&assembly, &chunk, &complete));
    }
    assert_int_equal(complete, i == 4);
    pcp_proto_frame_deinitialize(&f);
  }
  assert_int_equal(d.calls, 5);
  assert_memory_equal(into, blob, total);
  uint8_t* out = NULL;
  uint64_t out_length = 0;
  pcp_proto_blob_assembly_take(&assembly, &out, &out_length);
  assert_memory_equal(out, blob, total);
  pcp_proto_blob_free(pcp_allocator_system(), out);
  pcp_proto_frame_decoder_deinitialize(&decoder);

  // One flipped bit in chunk 2's data (its last byte): the CRC32C catches
  // it in the destination buffer, on the direct path and the buffered one.
  for (int direct = 0; direct < 2; ++direct) {
    d.filled = 2000;
    pcp_proto_frame_decoder_initialize(&l, pcp_allocator_system(), &decoder);
    pcp_proto_frame_decoder_set_version(&decoder, 1);
    if (direct)
      pcp_proto_frame_decoder_set_data_sink(&decoder, direct_sink, &d);
    sink.frames[2][sink.lengths[2] - 1] ^= 0x10;
    pcp_proto_parse_result_t result;
    ASSERT_CODE(
        feed_window(&decoder, sink.frames[2], sink.lengths[2], 4096, &result),
        PCP_STATUS_DATA_LOSS);
    sink.frames[2][sink.lengths[2] - 1] ^= 0x10;
    pcp_proto_frame_decoder_deinitialize(&decoder);
  }
  free(into);
  for (size_t i = 0; i < sink.count; ++i) free(sink.frames[i]);
  free(blob);
}

// A tensor blob announcing more than the blob limit is refused at chunk 0
// before its buffer exists: nothing of that size is ever allocated.
static void tensor_blob_over_limit_refused_before_allocation(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  l.max_blob_bytes = 1 << 20;
  pcp_allocator_counting_t counter;
  pcp_allocator_counting_initialize(pcp_allocator_system(), &counter);
  pcp_proto_blob_chunk_t chunk = {
      .blob_id = "t1.s0",
      .kind = PCP_PROTO_BLOB_TENSOR,
      .index = 0,
      .count = 64,
      .offset = 0,
      .total = (uint64_t)64 << 30,  // 64 GiB announced
      .data_length = 1024,
  };
  pcp_proto_blob_assembly_t assembly;
  ASSERT_CODE(pcp_proto_blob_assembly_begin(
                  1, &chunk, &l, pcp_allocator_counting(&counter), &assembly),
              PCP_STATUS_RESOURCE_EXHAUSTED);
  ASSERT_CODE(pcp_proto_blob_assembly_initialize(
                  1, &chunk, &l, pcp_allocator_counting(&counter), &assembly),
              PCP_STATUS_RESOURCE_EXHAUSTED);
  assert_int_equal(atomic_load(&counter.peak_bytes), 0);
  assert_int_equal(atomic_load(&counter.allocation_count), 0);
  // Just within the limit: one buffer of exactly the announced size.
  chunk.total = l.max_blob_bytes;
  chunk.count = 1024;
  ASSERT_OK(pcp_proto_blob_assembly_begin(
      1, &chunk, &l, pcp_allocator_counting(&counter), &assembly));
  assert_true(atomic_load(&counter.peak_bytes) >= (int64_t)l.max_blob_bytes);
  assert_true(atomic_load(&counter.peak_bytes) <
              (int64_t)l.max_blob_bytes + 256);
  assert_null(assembly.hash);  // tensors are not hashed
  pcp_proto_blob_assembly_deinitialize(&assembly);
  assert_int_equal(atomic_load(&counter.live_bytes), 0);
}

static void join_mac_verify(void** state) {
  (void)state;
  const uint8_t token[] = "s3cret-join-token";
  uint8_t nonce[32];
  for (int i = 0; i < 32; ++i) nonce[i] = (uint8_t)(255 - i);
  uint8_t mac[32];
  ASSERT_OK(
      pcp_proto_join_mac_compute(token, sizeof(token) - 1, nonce, "w-1", mac));
  // Independent computation of the documented construction.
  uint8_t message[12 + 32 + 3];
  memcpy(message, "pcp-join-v1", 12);  // with its NUL
  memcpy(message + 12, nonce, 32);
  memcpy(message + 44, "w-1", 3);
  uint8_t expected[32];
  unsigned int len = 0;
  HMAC(EVP_sha256(), token, (int)sizeof(token) - 1, message, sizeof(message),
       expected, &len);
  assert_memory_equal(mac, expected, 32);
  assert_true(
      pcp_proto_join_mac_verify(token, sizeof(token) - 1, nonce, "w-1", mac));
  assert_false(
      pcp_proto_join_mac_verify(token, sizeof(token) - 2, nonce, "w-1", mac));
  assert_false(
      pcp_proto_join_mac_verify(token, sizeof(token) - 1, nonce, "w-2", mac));
  nonce[0] ^= 1;
  assert_false(
      pcp_proto_join_mac_verify(token, sizeof(token) - 1, nonce, "w-1", mac));
  assert_false(pcp_proto_join_mac_verify(token, 0, nonce, "w-1", mac));
  uint8_t r1[32], r2[32];
  ASSERT_OK(pcp_proto_random_bytes(r1, 32));
  ASSERT_OK(pcp_proto_random_bytes(r2, 32));
  assert_memory_not_equal(r1, r2, 32);
}

// SQLite-style OOM sweep: fail the Nth allocation for every N until the
// whole encode + decode + parse succeeds; every failure must be a clean
// RESOURCE_EXHAUSTED with nothing leaked.
static void oom_sweep_task_assign(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  float x[4] = {1, 2, 3, 4};
  pcp_proto_section_t s = {.name = "x",
                           .element_type = PCP_ELEMENT_TYPE_F32,
                           .rank = 1,
                           .shape = {4},
                           .data = x};
  pcp_proto_tensor_ref_t in = {.kind = PCP_PROTO_TENSOR_REF_SECTION};
  pcp_proto_task_assign_t t = {
      .task_id = 1, .function = "f", .inputs = &in, .input_count = 1};
  bool succeeded = false;
  for (int64_t fail_at = 0; fail_at < 100 && !succeeded; ++fail_at) {
    pcp_allocator_counting_t counter;
    pcp_allocator_counting_initialize(pcp_allocator_system(), &counter);
    pcp_allocator_failing_t failing;
    pcp_allocator_failing_initialize(pcp_allocator_counting(&counter), fail_at,
                                     false, &failing);
    pcp_allocator_t a = pcp_allocator_failing(&failing);
    pcp_proto_encoded_frame_t e;
    pcp_status_t st = pcp_proto_task_assign_encode(1, 1, &t, &s, 1, &l, a, &e);
    uint8_t* bytes = NULL;
    size_t n = 0;
    if (!st) {
      st = pcp_proto_encoded_frame_flatten(&e, a, &bytes, &n);
      pcp_proto_encoded_frame_deinitialize(&e);
    }
    pcp_proto_frame_t f = {0};
    if (!st)
      st = pcp_proto_frame_decode(bytes, n, &l, 1, a, &f);
    pcp_proto_task_assign_t out;
    if (!st)
      st = pcp_proto_task_assign_parse(&f, &out);
    if (!st) {
      succeeded = true;
      assert_int_equal(out.input_count, 1);
    } else {
      assert_int_equal(pcp_status_code(st), PCP_STATUS_RESOURCE_EXHAUSTED);
      pcp_status_ignore(st);
    }
    pcp_proto_frame_deinitialize(&f);
    pcp_allocator_free(a, bytes);
    assert_int_equal(counter.live_bytes, 0);
  }
  assert_true(succeeded);
}

static void limit_tensors_per_task(void** state) {
  (void)state;
  // 1025 resident inputs: one over PCP_PROTO_MAX_TASK_TENSORS.
  size_t n_inputs = PCP_PROTO_MAX_TASK_TENSORS + 1;
  size_t cap = 64 + n_inputs * 20;
  char* json = malloc(cap);
  size_t n = (size_t)snprintf(json, cap,
                              "{\"task_id\":1,\"program\":\"%064d\","
                              "\"function\":\"f\",\"inputs\":[",
                              0);
  for (size_t i = 0; i < n_inputs; ++i) {
    n += (size_t)snprintf(json + n, cap - n, "%s{\"resident\":\"r\"}",
                          i ? "," : "");
  }
  snprintf(json + n, cap - n, "]}");
  raw_opts_t o = {.type = PCP_PROTO_MESSAGE_TASK_ASSIGN};
  size_t len;
  uint8_t* b = build_raw(o, json, NULL, 0, &len);
  pcp_proto_frame_t f;
  decode_ok(b, len, 1, &f);
  pcp_proto_task_assign_t m;
  ASSERT_CODE(pcp_proto_task_assign_parse(&f, &m), PCP_STATUS_INVALID_ARGUMENT);
  pcp_proto_frame_deinitialize(&f);
  free(b);
  // Strings over their cap are refused by name.
  b = build_raw(
      (raw_opts_t){.type = PCP_PROTO_MESSAGE_SHUTDOWN},
      "{\"reason\":\""
      "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
      "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
      "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
      "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
      "x\"}",
      NULL, 0, &len);
  decode_ok(b, len, 1, &f);
  pcp_proto_shutdown_t sd;
  ASSERT_CODE(pcp_proto_shutdown_parse(&f, &sd), PCP_STATUS_INVALID_ARGUMENT);
  pcp_proto_frame_deinitialize(&f);
  free(b);
  free(json);
}

// The reader-facing zero-copy path: bytes are written straight into the
// decoder's window (the frame's own aligned payload buffer for the body).
static void decoder_window_commit(void** state) {
  (void)state;
  pcp_proto_limits_t l = limits();
  static float x[1000];
  for (int i = 0; i < 1000; ++i) x[i] = (float)i;
  pcp_proto_section_t s = {.name = "x",
                           .element_type = PCP_ELEMENT_TYPE_F32,
                           .rank = 1,
                           .shape = {1000},
                           .data = x};
  json_t* o = json_object();
  pcp_proto_encoded_frame_t e;
  ASSERT_OK(pcp_proto_frame_encode(1, PCP_PROTO_MESSAGE_TASK_RESULT, 4, o, &s,
                                   1, &l, pcp_allocator_system(), &e));
  json_decref(o);
  size_t n;
  uint8_t* bytes = test_flatten(&e, &n);
  pcp_proto_frame_decoder_t d;
  pcp_proto_frame_decoder_initialize(&l, pcp_allocator_system(), &d);
  size_t offset = 0;
  pcp_proto_parse_result_t r = PCP_PROTO_PARSE_NEED_MORE;
  int windows = 0;
  while (r != PCP_PROTO_PARSE_FRAME_READY) {
    void* window = NULL;
    size_t capacity = 0;
    ASSERT_OK(pcp_proto_frame_decoder_window(&d, &window, &capacity));
    assert_true(capacity > 0);
    // A "socket read" of at most 700 bytes into the window.
    size_t k = capacity < 700 ? capacity : 700;
    if (k > n - offset)
      k = n - offset;
    memcpy(window, bytes + offset, k);
    offset += k;
    ASSERT_OK(pcp_proto_frame_decoder_commit(&d, k, &r));
    windows++;
  }
  assert_int_equal(offset, n);
  assert_true(windows > 5);
  // A ready frame must be taken before the next window.
  void* window;
  size_t capacity;
  ASSERT_CODE(pcp_proto_frame_decoder_window(&d, &window, &capacity),
              PCP_STATUS_FAILED_PRECONDITION);
  pcp_proto_frame_t f;
  pcp_proto_frame_decoder_take(&d, &f);
  assert_memory_equal(f.sections[0].data, x, sizeof(x));
  pcp_proto_frame_deinitialize(&f);
  pcp_proto_frame_decoder_deinitialize(&d);
  free(bytes);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(crc32c_known_answer),
      cmocka_unit_test(crc32c_long_inputs_match_reference),
      cmocka_unit_test(header_layout_is_frozen),
      cmocka_unit_test(hello_round_trip),
      cmocka_unit_test(join_round_trip),
      cmocka_unit_test(control_messages_round_trip),
      cmocka_unit_test(task_assign_and_result_round_trip),
      cmocka_unit_test(init_refs_round_trip_and_hostile),
      cmocka_unit_test(init_refs_total_is_bounded),
      cmocka_unit_test(error_frame_maps_status),
      cmocka_unit_test(byte_at_a_time_stream),
      cmocka_unit_test(decoder_window_commit),
      cmocka_unit_test(limit_frame_size_checked_before_allocation),
      cmocka_unit_test(limit_json_length_checked_from_prefix),
      cmocka_unit_test(limit_json_depth),
      cmocka_unit_test(limit_sections_and_rank),
      cmocka_unit_test(limit_tensors_per_task),
      cmocka_unit_test(bad_sections_are_refused),
      cmocka_unit_test(checksums_magic_flags_versions),
      cmocka_unit_test(limits_validate),
      cmocka_unit_test(blob_chunks_assemble_and_verify),
      cmocka_unit_test(tensor_blob_chunks_direct_and_crc),
      cmocka_unit_test(tensor_blob_over_limit_refused_before_allocation),
      cmocka_unit_test(join_mac_verify),
      cmocka_unit_test(oom_sweep_task_assign),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
