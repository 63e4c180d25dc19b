// SPDX-License-Identifier: Apache-2.0
//
// fabric endpoint tests: a real endpoint on 127.0.0.1 driven by scripted fake
// workers (tests/fabric/fake_worker.h) over real TCP sockets. H = 200 ms, so
// every timeout is short (silence 600 ms, tick 50 ms, resume window 2 s) yet
// leaves room for a loaded 2-core machine.

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
// clang-format on

#include "fabric/fabric.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fabric/fake_worker.h"

#define TOKEN_ENV "PCP_FABRIC_TEST_TOKEN"
#define TOKEN "correct horse battery staple"
#define H_MS INT64_C(200)

typedef struct fixture_t {
  pcp_fabric_endpoint_t* endpoint;
  pcp_fabric_options_t options;
  uint16_t port;
  uint8_t program[PCP_SHA256_BYTE_LENGTH];
  uint8_t program_bytes[100000];
} fixture_t;

static fixture_t* fixture_start(uint64_t chunk_bytes) {
  fixture_t* f = calloc(1, sizeof(fixture_t));
  PCP_ASSERT(f);
  setenv(TOKEN_ENV, TOKEN, 1);
  pcp_fabric_options_initialize(&f->options);
  f->options.heartbeat_interval_ms = (uint32_t)H_MS;
  // The unanswered-cancel test waits for this bound: one resume window.
  f->options.cancel_answer_timeout_ms = (uint32_t)(10 * H_MS);
  f->options.join_token_env = TOKEN_ENV;
  if (chunk_bytes)
    f->options.limits.chunk_bytes = chunk_bytes;
  PCP_CHECK_OK(pcp_fabric_endpoint_create(&f->options, pcp_allocator_system(),
                                          &f->endpoint));
  f->port = pcp_fabric_endpoint_port(f->endpoint);
  for (size_t i = 0; i < sizeof(f->program_bytes); ++i) {
    f->program_bytes[i] = (uint8_t)(i * 131 + 7);
  }
  PCP_CHECK_OK(pcp_fabric_program_register(f->endpoint, f->program_bytes,
                                           sizeof(f->program_bytes), "cpu",
                                           "host", f->program));
  return f;
}

static void fixture_stop(fixture_t* f) {
  pcp_fabric_endpoint_release(f->endpoint);
  free(f);
}

static fake_worker_t* join_worker(fixture_t* f, const char* id,
                                  const char* token) {
  fake_worker_t* fw = malloc(sizeof(fake_worker_t));
  PCP_ASSERT(fw);
  assert_true(fake_worker_connect(f->port, &f->options.limits, fw));
  pcp_proto_join_t join;
  fake_default_join(id, &join);
  bool accepted = fake_handshake(fw, &join, token);
  if (strcmp(token, TOKEN) == 0)
    assert_true(accepted);
  return fw;
}

static void drop_worker(fake_worker_t* fw) {
  fake_worker_close(fw);
  free(fw);
}

// Waits (up to |timeout_ms|) until |id| is in |state|.
static bool wait_worker_state(fixture_t* f, const char* id,
                              pcp_fabric_worker_state_t state,
                              int64_t timeout_ms, fake_worker_t* keep_alive) {
  int64_t deadline = fake_now_ns() + timeout_ms * 1000000;
  while (fake_now_ns() < deadline) {
    pcp_fabric_worker_info_t info;
    pcp_status_t status = pcp_fabric_worker_query(f->endpoint, id, &info);
    if (!status && info.state == state)
      return true;
    pcp_status_ignore(status);
    if (keep_alive) {
      pcp_proto_frame_t frame;
      if (fake_recv_frame(keep_alive, 5, true, &frame)) {
        pcp_proto_frame_deinitialize(&frame);
      }
    } else {
      pcp_sleep_ms(5);
    }
  }
  return false;
}

//===----------------------------------------------------------------------===//
// Joins
//===----------------------------------------------------------------------===//

static void test_join_registers_every_field(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  fake_worker_t* fw = join_worker(f, "site-a-node-1-cpu-host-device-3", TOKEN);
  assert_int_equal(fw->lease_epoch, 1);
  assert_false(fw->resumed);
  assert_int_equal(fw->heartbeat_interval_ns, (int64_t)H_MS * 1000000);
  pcp_fabric_worker_info_t info;
  PCP_CHECK_OK(pcp_fabric_worker_query(
      f->endpoint, "site-a-node-1-cpu-host-device-3", &info));
  assert_string_equal(info.worker_id, "site-a-node-1-cpu-host-device-3");
  assert_string_equal(info.backend, "cpu");
  assert_string_equal(info.target, "host");
  assert_int_equal(info.device_id, 3);
  assert_int_equal(info.device_memory_bytes, UINT64_C(8) << 30);
  assert_int_equal(info.driver_count, 2);
  assert_string_equal(info.drivers[0], "local-task");
  assert_string_equal(info.drivers[1], "local-sync");
  assert_string_equal(info.runtime_version, "iree-rt 3.13");
  assert_string_equal(info.compiler_version, "iree-compile 3.13");
  assert_string_equal(info.node_manager_id, "nm-1");
  assert_int_equal(info.supervisor_id, 7);
  assert_string_equal(info.worker_class, "batch");
  assert_int_equal(info.state, PCP_FABRIC_WORKER_CONNECTED);
  assert_int_equal(info.sched_state, PCP_SCHED_WORKER_STATE_READY);
  assert_int_equal(info.lease_epoch, 1);
  assert_int_equal(info.join_count, 1);
  assert_int_equal(
      pcp_fabric_worker_count(f->endpoint, PCP_FABRIC_WORKER_CONNECTED), 1);
  // Metrics: the workers gauge carries state, backend and target. The gauge
  // is refreshed on the endpoint's timer: polled until it shows (bounded).
  static const char kConnected[] =
      "pcp_fabric_workers{state=\"connected\",backend=\"cpu\",target=\"host\"}"
      " 1";
  pcp_string_builder_t text;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &text);
  for (int waited_ms = 0;; waited_ms += 5) {
    pcp_string_builder_reset(&text);
    PCP_CHECK_OK(pcp_obs_registry_render(
        pcp_fabric_endpoint_metrics(f->endpoint), &text));
    if (strstr(pcp_string_builder_cstring(&text), kConnected) ||
        waited_ms >= 10000) {
      break;
    }
    pcp_sleep_ms(5);
  }
  const char* rendered = pcp_string_builder_cstring(&text);
  assert_non_null(strstr(rendered, kConnected));
  assert_non_null(strstr(
      rendered, "pcp_fabric_frames_total{direction=\"in\",type=\"JOIN\"} 1"));
  pcp_string_builder_deinitialize(&text);
  drop_worker(fw);
  fixture_stop(f);
}

static void test_wrong_token_rejected_others_unaffected(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  char log_path[] = "/tmp/pcp-fabric-test-log-XXXXXX";
  int log_fd = mkstemp(log_path);
  assert_true(log_fd >= 0);
  FILE* log = fdopen(log_fd, "w+");
  pcp_log_set_sink(log);
  fake_worker_t* good = join_worker(f, "good-1", TOKEN);
  fake_worker_t* bad = join_worker(f, "intruder", "not the token");
  assert_int_equal(bad->reject_reason, PCP_PROTO_REJECT_AUTH_FAILED);
  assert_true(fake_expect_eof(bad, 2000));
  drop_worker(bad);
  // The intruder is not registered; the good worker is still connected and
  // a later worker joins normally.
  pcp_fabric_worker_info_t info;
  pcp_status_t status = pcp_fabric_worker_query(f->endpoint, "intruder", &info);
  assert_int_equal(pcp_status_consume_code(status), PCP_STATUS_NOT_FOUND);
  fake_worker_t* later = join_worker(f, "good-2", TOKEN);
  assert_true(
      wait_worker_state(f, "good-1", PCP_FABRIC_WORKER_CONNECTED, 10, good));
  pcp_fabric_endpoint_stats_t stats;
  pcp_fabric_endpoint_stats_query(f->endpoint, &stats);
  assert_int_equal(stats.rejected_joins, 1);
  assert_int_equal(stats.workers_connected, 2);
  pcp_log_set_sink(NULL);
  fflush(log);
  rewind(log);
  char line[4096];
  bool found = false;
  while (fgets(line, sizeof(line), log)) {
    if (strstr(line, "level=warn") && strstr(line, "code=UNAUTHENTICATED") &&
        strstr(line, "fabric connection closed")) {
      found = true;
    }
  }
  fclose(log);
  unlink(log_path);
  assert_true(found);
  drop_worker(good);
  drop_worker(later);
  fixture_stop(f);
}

//===----------------------------------------------------------------------===//
// Bad input
//===----------------------------------------------------------------------===//

// Sends |bytes| on a connection (after a full handshake when |accepted|) and
// expects a frame of |reply_type| carrying |code| (ERROR) or a REJECT, then
// EOF.
static void expect_bad_input_closes(fixture_t* f, bool accepted,
                                    const void* bytes, size_t length,
                                    uint16_t reply_type,
                                    pcp_status_code_t code) {
  fake_worker_t* fw = malloc(sizeof(fake_worker_t));
  PCP_ASSERT(fw);
  assert_true(fake_worker_connect(f->port, &f->options.limits, fw));
  if (accepted) {
    pcp_proto_join_t join;
    fake_default_join("bad-input-worker", &join);
    assert_true(fake_handshake(fw, &join, TOKEN));
  }
  assert_true(fake_send_all(fw->fd, bytes, length));
  pcp_proto_frame_t frame;
  assert_true(fake_expect(fw, reply_type, 2000, &frame));
  if (reply_type == PCP_PROTO_MESSAGE_ERROR) {
    pcp_status_t peer = pcp_ok_status();
    uint64_t task_id = 0;
    PCP_CHECK_OK(pcp_proto_error_parse(&frame, &peer, &task_id));
    assert_int_equal(pcp_status_consume_code(peer), code);
  } else {
    pcp_proto_reject_t reject;
    PCP_CHECK_OK(pcp_proto_reject_parse(&frame, &reject));
    assert_int_equal(reject.reason, PCP_PROTO_REJECT_PROTOCOL_VIOLATION);
  }
  pcp_proto_frame_deinitialize(&frame);
  assert_true(fake_expect_eof(fw, 2000));
  drop_worker(fw);
  if (accepted) {
    assert_true(wait_worker_state(f, "bad-input-worker", PCP_FABRIC_WORKER_LOST,
                                  2000, NULL));
  }
}

static void test_malformed_frames_close_only_that_connection(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  fake_worker_t* good = join_worker(f, "steady", TOKEN);

  uint8_t garbage[64];
  memset(garbage, 0xAB, sizeof(garbage));
  // Garbage before the handshake: the handshake's error frame is REJECT.
  expect_bad_input_closes(f, false, garbage, sizeof(garbage),
                          PCP_PROTO_MESSAGE_REJECT, PCP_STATUS_OK);
  // Garbage after ACCEPT: ERROR INVALID_ARGUMENT (bad magic).
  expect_bad_input_closes(f, true, garbage, sizeof(garbage),
                          PCP_PROTO_MESSAGE_ERROR, PCP_STATUS_INVALID_ARGUMENT);
  // A valid header announcing more than the frame limit: RESOURCE_EXHAUSTED
  // before any payload is read or allocated.
  uint8_t header[PCP_PROTO_HEADER_BYTE_LENGTH];
  pcp_proto_header_t h = {.version = 1,
                          .type = PCP_PROTO_MESSAGE_HEARTBEAT,
                          .payload_length = f->options.limits.max_frame_bytes};
  pcp_proto_header_encode(&h, header);
  expect_bad_input_closes(f, true, header, sizeof(header),
                          PCP_PROTO_MESSAGE_ERROR,
                          PCP_STATUS_RESOURCE_EXHAUSTED);
  // Before authentication even a frame within the frame limit is refused
  // when it is larger than any handshake frame: no allocation for nobody.
  // The answer is REJECT reason 5 (protocol.md s.3), as for any other bad
  // frame before ACCEPT (expect_bad_input_closes checks the reason).
  h.payload_length = 1 << 20;
  pcp_proto_header_encode(&h, header);
  expect_bad_input_closes(f, false, header, sizeof(header),
                          PCP_PROTO_MESSAGE_REJECT, PCP_STATUS_OK);
  // The same before ACCEPT with a frame past the whole frame limit.
  h.payload_length = f->options.limits.max_frame_bytes;
  pcp_proto_header_encode(&h, header);
  expect_bad_input_closes(f, false, header, sizeof(header),
                          PCP_PROTO_MESSAGE_REJECT, PCP_STATUS_OK);
  // A heartbeat whose header checksum is wrong: DATA_LOSS.
  pcp_proto_heartbeat_t hb = {.seq = 1};
  pcp_proto_encoded_frame_t enc;
  PCP_CHECK_OK(pcp_proto_heartbeat_encode(1, 0, &hb, &f->options.limits,
                                          pcp_allocator_system(), &enc));
  uint8_t* flat = NULL;
  size_t flat_length = 0;
  PCP_CHECK_OK(pcp_proto_encoded_frame_flatten(&enc, pcp_allocator_system(),
                                               &flat, &flat_length));
  pcp_proto_encoded_frame_deinitialize(&enc);
  flat[16] ^= 0x5A;  // request id byte: covered by the header CRC
  expect_bad_input_closes(f, true, flat, flat_length, PCP_PROTO_MESSAGE_ERROR,
                          PCP_STATUS_DATA_LOSS);
  // A well-formed heartbeat before authentication (right after HELLO would
  // need the nonce; before HELLO it is out of order): REJECT + close.
  flat[16] ^= 0x5A;
  expect_bad_input_closes(f, false, flat, flat_length, PCP_PROTO_MESSAGE_REJECT,
                          PCP_STATUS_OK);
  pcp_allocator_free(pcp_allocator_system(), flat);

  // The endpoint kept serving: the steady worker is connected and a new one
  // joins.
  assert_true(
      wait_worker_state(f, "steady", PCP_FABRIC_WORKER_CONNECTED, 10, good));
  fake_worker_t* later = join_worker(f, "after-the-storm", TOKEN);
  pcp_fabric_endpoint_stats_t stats;
  pcp_fabric_endpoint_stats_query(f->endpoint, &stats);
  assert_true(stats.protocol_errors >= 6);
  drop_worker(later);
  drop_worker(good);
  fixture_stop(f);
}

//===----------------------------------------------------------------------===//
// Liveness, eviction, reassignment, identity
//===----------------------------------------------------------------------===//

static void test_heartbeats_keep_worker_alive(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  fake_worker_t* fw = join_worker(f, "beating", TOKEN);
  int64_t end = fake_now_ns() + 5 * H_MS * 1000000;  // > 3x the interval
  while (fake_now_ns() < end) {
    pcp_proto_frame_t frame;
    if (fake_recv_frame(fw, 10, true, &frame)) {
      if (frame.header.type == PCP_PROTO_MESSAGE_HEARTBEAT) {
        fw->heartbeats_received++;
      }
      pcp_proto_frame_deinitialize(&frame);
    }
  }
  pcp_fabric_worker_info_t info;
  PCP_CHECK_OK(pcp_fabric_worker_query(f->endpoint, "beating", &info));
  assert_int_equal(info.state, PCP_FABRIC_WORKER_CONNECTED);
  assert_int_equal(info.eviction_count, 0);
  assert_true(info.heartbeat_age_ns < 3 * H_MS * 1000000);
  // Both ways: the gateway sent one about every H.
  assert_true(fw->heartbeats_received >= 3);
  drop_worker(fw);
  fixture_stop(f);
}

typedef struct recorder_t {
  _Atomic int progress;
  _Atomic int done;
} recorder_t;

// wait() wakes when the outcome is set; the DONE callback runs right after,
// on the loop thread, once the lock is dropped: give it a moment.
static void wait_done_callback(recorder_t* r) {
  for (int i = 0; i < 400 && r->done == 0; ++i) pcp_sleep_ms(5);
}

static void record_event(void* user_data, pcp_fabric_task_t* task,
                         pcp_fabric_task_event_t event) {
  (void)task;
  recorder_t* r = user_data;
  if (event == PCP_FABRIC_TASK_EVENT_PROGRESS) {
    r->progress++;
  } else {
    r->done++;
  }
}

// Answers a PROGRAM_OFFER with "cached".
static void accept_offer(fake_worker_t* fw) {
  pcp_proto_frame_t frame;
  assert_true(fake_expect(fw, PCP_PROTO_MESSAGE_PROGRAM_OFFER, 3000, &frame));
  pcp_proto_program_offer_t offer;
  PCP_CHECK_OK(pcp_proto_program_offer_parse(&frame, &offer));
  pcp_proto_program_ack_t ack = {.status = PCP_PROTO_PROGRAM_CACHED};
  memcpy(ack.program, offer.program, sizeof(ack.program));
  pcp_proto_encoded_frame_t enc;
  PCP_CHECK_OK(pcp_proto_program_ack_encode(1, frame.header.request_id, &ack,
                                            &fw->limits, pcp_allocator_system(),
                                            &enc));
  pcp_proto_frame_deinitialize(&frame);
  assert_true(fake_send_frame(fw, &enc));
}

// Answers a PROGRAM_OFFER with "cached" and waits for the TASK_ASSIGN.
static void accept_offer_and_assign(fake_worker_t* fw,
                                    pcp_proto_frame_t* out_assign) {
  accept_offer(fw);
  assert_true(fake_expect(fw, PCP_PROTO_MESSAGE_TASK_ASSIGN, 3000, out_assign));
}

static void send_result(fake_worker_t* fw, uint64_t request_id,
                        uint64_t task_id, const float* values, size_t count) {
  pcp_proto_section_t out = {.name = "y",
                             .element_type = PCP_ELEMENT_TYPE_F32,
                             .rank = 1,
                             .shape = {(int64_t)count},
                             .data = values};
  pcp_proto_tensor_ref_t ref = {.kind = PCP_PROTO_TENSOR_REF_SECTION,
                                .section = 0};
  pcp_proto_task_result_t result = {
      .task_id = task_id, .outputs = &ref, .output_count = 1, .elapsed_us = 42};
  pcp_proto_encoded_frame_t enc;
  PCP_CHECK_OK(pcp_proto_task_result_encode(1, request_id, &result, &out, 1,
                                            &fw->limits, pcp_allocator_system(),
                                            &enc));
  assert_true(fake_send_frame(fw, &enc));
}

static void test_silent_worker_evicted_task_requeued(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  fake_worker_t* a = join_worker(f, "silent-a", TOKEN);
  float x[4] = {1, 2, 3, 4};
  pcp_proto_section_t input = {.name = "x",
                               .element_type = PCP_ELEMENT_TYPE_F32,
                               .rank = 1,
                               .shape = {4},
                               .data = x};
  recorder_t rec = {0};
  pcp_fabric_task_params_t params = {.function = "main",
                                     .inputs = &input,
                                     .input_count = 1,
                                     .worker_class = PCP_SCHED_WORKER_CLASS_CPU,
                                     .callback = record_event,
                                     .user_data = &rec};
  memcpy(params.program, f->program, sizeof(params.program));
  pcp_fabric_task_t* task = NULL;
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &task));
  pcp_proto_frame_t assign;
  accept_offer_and_assign(a, &assign);
  pcp_proto_frame_deinitialize(&assign);
  // A goes silent now (its last frame was the ACK just sent).
  int64_t silent_since = fake_now_ns();
  fake_worker_t* b = join_worker(f, "standby-b", TOKEN);
  // B gets the task once A is evicted: within the 3H timeout plus two
  // heartbeat intervals.
  accept_offer_and_assign(b, &assign);
  // Evicted after the 3H timeout and within two intervals of it, as the
  // endpoint saw it (B's own handshake latency is not part of the figure).
  pcp_fabric_worker_info_t lost;
  PCP_CHECK_OK(pcp_fabric_worker_query(f->endpoint, "silent-a", &lost));
  int64_t evicted_after = lost.lost_at_ns - silent_since;
  assert_true(evicted_after >= 3 * H_MS * 1000000 - 5000000);
  assert_true(evicted_after <= 5 * H_MS * 1000000);
  pcp_proto_task_assign_t parsed;
  PCP_CHECK_OK(pcp_proto_task_assign_parse(&assign, &parsed));
  assert_int_equal(parsed.task_id, pcp_fabric_task_id(task));
  float y[4] = {2, 4, 6, 8};
  send_result(b, assign.header.request_id, parsed.task_id, y, 4);
  pcp_proto_frame_deinitialize(&assign);
  assert_true(pcp_fabric_task_wait(task, 3000));
  assert_null(pcp_fabric_task_status(task));
  pcp_fabric_task_info_t info;
  pcp_fabric_task_info_query(task, &info);
  assert_int_equal(info.attempts, 2);
  assert_string_equal(info.worker_id.value, "standby-b");
  pcp_fabric_worker_info_t wa;
  PCP_CHECK_OK(pcp_fabric_worker_query(f->endpoint, "silent-a", &wa));
  assert_int_equal(wa.state, PCP_FABRIC_WORKER_LOST);
  assert_int_equal(wa.eviction_count, 1);
  wait_done_callback(&rec);
  assert_int_equal(rec.done, 1);
  pcp_fabric_task_release(task);
  drop_worker(a);
  drop_worker(b);
  fixture_stop(f);
}

static void test_reconnect_keeps_identity(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  fake_worker_t* fw = join_worker(f, "phoenix", TOKEN);
  uint64_t epoch = fw->lease_epoch;
  uint8_t token[PCP_PROTO_RESUME_TOKEN_BYTE_LENGTH];
  memcpy(token, fw->resume_token, sizeof(token));
  drop_worker(fw);
  assert_true(
      wait_worker_state(f, "phoenix", PCP_FABRIC_WORKER_LOST, 2000, NULL));
  // Same process: resumes the lease (same epoch).
  fw = malloc(sizeof(fake_worker_t));
  PCP_ASSERT(fw);
  assert_true(fake_worker_connect(f->port, &f->options.limits, fw));
  pcp_proto_join_t join;
  fake_default_join("phoenix", &join);
  join.has_resume = true;
  join.lease_epoch = epoch;
  memcpy(join.resume_token, token, sizeof(token));
  assert_true(fake_handshake(fw, &join, TOKEN));
  assert_true(fw->resumed);
  assert_int_equal(fw->lease_epoch, epoch);
  // A second connection under the same live id is refused.
  fake_worker_t twin;
  assert_true(fake_worker_connect(f->port, &f->options.limits, &twin));
  pcp_proto_join_t twin_join;
  fake_default_join("phoenix", &twin_join);
  assert_false(fake_handshake(&twin, &twin_join, TOKEN));
  assert_int_equal(twin.reject_reason, PCP_PROTO_REJECT_DUPLICATE_WORKER);
  fake_worker_close(&twin);
  drop_worker(fw);
  assert_true(
      wait_worker_state(f, "phoenix", PCP_FABRIC_WORKER_LOST, 2000, NULL));
  // A new process (no resume block): same identity, fresh lease.
  fw = join_worker(f, "phoenix", TOKEN);
  assert_false(fw->resumed);
  assert_int_equal(fw->lease_epoch, epoch + 1);
  pcp_fabric_worker_info_t info;
  PCP_CHECK_OK(pcp_fabric_worker_query(f->endpoint, "phoenix", &info));
  assert_int_equal(info.join_count, 3);
  assert_int_equal(info.resumed_count, 1);
  assert_int_equal(
      pcp_fabric_worker_count(f->endpoint, PCP_FABRIC_WORKER_STATE_COUNT_), 1);
  drop_worker(fw);
  fixture_stop(f);
}

//===----------------------------------------------------------------------===//
// Programs and tasks
//===----------------------------------------------------------------------===//

static void test_program_offer_fetch_chunks_verified(void** state) {
  (void)state;
  fixture_t* f = fixture_start(16 << 10);  // 16 KiB chunks: 7 of them
  fake_worker_t* fw = join_worker(f, "fetcher", TOKEN);
  float x[2] = {1, 2};
  pcp_proto_section_t input = {.name = "x",
                               .element_type = PCP_ELEMENT_TYPE_F32,
                               .rank = 1,
                               .shape = {2},
                               .data = x};
  pcp_fabric_task_params_t params = {
      .function = "main", .inputs = &input, .input_count = 1};
  memcpy(params.program, f->program, sizeof(params.program));
  pcp_fabric_task_t* task = NULL;
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &task));
  pcp_proto_frame_t frame;
  assert_true(fake_expect(fw, PCP_PROTO_MESSAGE_PROGRAM_OFFER, 3000, &frame));
  pcp_proto_program_offer_t offer;
  PCP_CHECK_OK(pcp_proto_program_offer_parse(&frame, &offer));
  assert_memory_equal(offer.program, f->program, PCP_SHA256_BYTE_LENGTH);
  assert_int_equal(offer.byte_length, sizeof(f->program_bytes));
  assert_string_equal(offer.backend, "cpu");
  assert_string_equal(offer.target, "host");
  uint64_t offer_request = frame.header.request_id;
  pcp_proto_frame_deinitialize(&frame);
  // Not in our (empty) cache: fetch.
  pcp_proto_program_fetch_t fetch;
  memcpy(fetch.program, f->program, sizeof(fetch.program));
  pcp_proto_encoded_frame_t enc;
  PCP_CHECK_OK(pcp_proto_program_fetch_encode(
      1, offer_request, &fetch, &fw->limits, pcp_allocator_system(), &enc));
  assert_true(fake_send_frame(fw, &enc));
  pcp_proto_blob_assembly_t assembly;
  memset(&assembly, 0, sizeof(assembly));
  bool complete = false;
  int chunks = 0;
  while (!complete) {
    assert_true(fake_expect(fw, PCP_PROTO_MESSAGE_BLOB_CHUNK, 3000, &frame));
    assert_int_equal(frame.header.request_id, offer_request);
    pcp_proto_blob_chunk_t chunk;
    PCP_CHECK_OK(pcp_proto_blob_chunk_parse(&frame, &chunk));
    if (chunks == 0) {
      PCP_CHECK_OK(pcp_proto_blob_assembly_initialize(
          offer_request, &chunk, &fw->limits, pcp_allocator_system(),
          &assembly));
      complete = chunk.count == 1;
    } else {
      PCP_CHECK_OK(pcp_proto_blob_assembly_add(&assembly, &chunk, &complete));
    }
    ++chunks;
    pcp_proto_frame_deinitialize(&frame);
  }
  assert_int_equal(chunks, 7);
  uint8_t* data = NULL;
  uint64_t length = 0;
  pcp_proto_blob_assembly_take(&assembly, &data, &length);
  assert_int_equal(length, sizeof(f->program_bytes));
  pcp_sha256_t digest;
  pcp_sha256_compute(data, length, &digest);
  assert_memory_equal(digest.bytes, f->program, PCP_SHA256_BYTE_LENGTH);
  assert_memory_equal(data, f->program_bytes, length);
  pcp_proto_blob_free(pcp_allocator_system(), data);
  pcp_proto_program_ack_t ack = {.status = PCP_PROTO_PROGRAM_STORED};
  memcpy(ack.program, f->program, sizeof(ack.program));
  PCP_CHECK_OK(pcp_proto_program_ack_encode(1, offer_request, &ack, &fw->limits,
                                            pcp_allocator_system(), &enc));
  assert_true(fake_send_frame(fw, &enc));
  assert_true(fake_expect(fw, PCP_PROTO_MESSAGE_TASK_ASSIGN, 3000, &frame));
  pcp_proto_frame_deinitialize(&frame);
  pcp_fabric_worker_info_t info;
  PCP_CHECK_OK(pcp_fabric_worker_query(f->endpoint, "fetcher", &info));
  assert_int_equal(info.program_count, 1);
  pcp_fabric_task_release(task);
  drop_worker(fw);
  fixture_stop(f);
}

static void test_task_result_and_cancel(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  fake_worker_t* fw = join_worker(f, "runner", TOKEN);
  float x[4] = {1.5f, -2, 3, 4};
  pcp_proto_section_t input = {.name = "x",
                               .element_type = PCP_ELEMENT_TYPE_F32,
                               .rank = 2,
                               .shape = {2, 2},
                               .data = x};
  recorder_t rec = {0};
  pcp_fabric_task_params_t params = {.function = "double",
                                     .inputs = &input,
                                     .input_count = 1,
                                     .worker_id = "runner",
                                     .session_id = "s1",
                                     .callback = record_event,
                                     .user_data = &rec};
  memcpy(params.program, f->program, sizeof(params.program));
  pcp_fabric_task_t* task = NULL;
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &task));
  pcp_proto_frame_t assign;
  accept_offer_and_assign(fw, &assign);
  pcp_proto_task_assign_t parsed;
  PCP_CHECK_OK(pcp_proto_task_assign_parse(&assign, &parsed));
  assert_string_equal(parsed.function, "double");
  assert_string_equal(parsed.session_id, "s1");
  assert_int_equal(parsed.input_count, 1);
  assert_int_equal(parsed.inputs[0].kind, PCP_PROTO_TENSOR_REF_SECTION);
  const pcp_proto_section_t* in = &assign.sections[parsed.inputs[0].section];
  assert_int_equal(in->rank, 2);
  assert_int_equal(in->byte_length, sizeof(x));
  assert_memory_equal(in->data, x, sizeof(x));
  // Progress, then the result.
  pcp_proto_task_progress_t progress = {.task_id = parsed.task_id,
                                        .state = PCP_PROTO_TASK_RUNNING,
                                        .has_fraction = true,
                                        .fraction = 0.5};
  pcp_proto_encoded_frame_t enc;
  PCP_CHECK_OK(pcp_proto_task_progress_encode(1, assign.header.request_id,
                                              &progress, &fw->limits,
                                              pcp_allocator_system(), &enc));
  assert_true(fake_send_frame(fw, &enc));
  float y[4];
  for (int i = 0; i < 4; ++i) y[i] = 2 * x[i];
  send_result(fw, assign.header.request_id, parsed.task_id, y, 4);
  pcp_proto_frame_deinitialize(&assign);
  assert_true(pcp_fabric_task_wait(task, 3000));
  assert_null(pcp_fabric_task_status(task));
  const pcp_proto_section_t* outputs = NULL;
  size_t output_count = 0;
  PCP_CHECK_OK(pcp_fabric_task_outputs(task, &outputs, &output_count));
  assert_int_equal(output_count, 1);
  assert_int_equal(outputs[0].element_type, PCP_ELEMENT_TYPE_F32);
  assert_int_equal(outputs[0].byte_length, sizeof(y));
  assert_memory_equal(outputs[0].data, y, sizeof(y));
  assert_int_equal((uintptr_t)outputs[0].data % 64, 0);
  pcp_fabric_task_info_t info;
  pcp_fabric_task_info_query(task, &info);
  assert_int_equal(info.elapsed_us, 42);
  assert_true(info.progress_fraction > 0.49 && info.progress_fraction < 0.51);
  wait_done_callback(&rec);
  assert_int_equal(rec.progress, 1);
  assert_int_equal(rec.done, 1);
  pcp_fabric_task_release(task);

  // Cancel: the second task of the session goes to the same worker (the
  // program is known now: no offer) and the cancel reaches it.
  params.worker_id = NULL;
  params.callback = NULL;
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &task));
  assert_true(fake_expect(fw, PCP_PROTO_MESSAGE_TASK_ASSIGN, 3000, &assign));
  PCP_CHECK_OK(pcp_proto_task_assign_parse(&assign, &parsed));
  pcp_fabric_task_cancel(task);
  pcp_proto_frame_t cancel_frame;
  assert_true(
      fake_expect(fw, PCP_PROTO_MESSAGE_TASK_CANCEL, 3000, &cancel_frame));
  pcp_proto_task_cancel_t cancel;
  PCP_CHECK_OK(pcp_proto_task_cancel_parse(&cancel_frame, &cancel));
  assert_int_equal(cancel.task_id, parsed.task_id);
  assert_int_equal(cancel_frame.header.request_id, assign.header.request_id);
  pcp_proto_frame_deinitialize(&cancel_frame);
  pcp_status_t cancelled =
      pcp_make_status(PCP_STATUS_CANCELLED, "cancelled on request");
  PCP_CHECK_OK(pcp_proto_error_encode(1, assign.header.request_id, cancelled,
                                      parsed.task_id, &fw->limits,
                                      pcp_allocator_system(), &enc));
  pcp_status_ignore(cancelled);
  assert_true(fake_send_frame(fw, &enc));
  pcp_proto_frame_deinitialize(&assign);
  assert_true(pcp_fabric_task_wait(task, 3000));
  assert_int_equal(pcp_status_code(pcp_fabric_task_status(task)),
                   PCP_STATUS_CANCELLED);
  pcp_fabric_task_release(task);

  // A queued task (no worker matches) is cancelled locally at once.
  params.session_id = NULL;
  params.worker_class = PCP_SCHED_WORKER_CLASS_CUDA;
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &task));
  pcp_fabric_task_cancel(task);
  assert_true(pcp_fabric_task_wait(task, 3000));
  assert_int_equal(pcp_status_code(pcp_fabric_task_status(task)),
                   PCP_STATUS_CANCELLED);
  pcp_fabric_task_release(task);
  drop_worker(fw);
  fixture_stop(f);
}

// Regression (CI hang of integration_training_e2e, run B): tasks waiting for
// a program offer must all be assigned when the worker's ACK arrives, even
// when another task of the same worker finishes in the same read. The ACK
// and the other task's RESULT come in one TCP write, so the endpoint handles
// them in one batch of actions; answering the first waiting task used to
// handle the RESULT in the middle of the walk over the task list, and when
// the finished task was the walk's next one the rest of the waiting tasks
// were never assigned (they waited forever).
static void test_program_ack_assigns_every_waiting_task(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  fake_worker_t* fw = join_worker(f, "evaluator", TOKEN);
  float x[4] = {1, 2, 3, 4};
  pcp_proto_section_t input = {.name = "x",
                               .element_type = PCP_ELEMENT_TYPE_F32,
                               .rank = 1,
                               .shape = {4},
                               .data = x};
  pcp_fabric_task_params_t params = {.function = "main",
                                     .inputs = &input,
                                     .input_count = 1,
                                     .worker_id = "evaluator",
                                     .max_attempts = 1};
  // The worker learns program A (the "inference" program) first.
  memcpy(params.program, f->program, sizeof(params.program));
  pcp_fabric_task_t* warm = NULL;
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &warm));
  pcp_proto_frame_t assign;
  accept_offer_and_assign(fw, &assign);
  pcp_proto_task_assign_t parsed;
  PCP_CHECK_OK(pcp_proto_task_assign_parse(&assign, &parsed));
  send_result(fw, assign.header.request_id, parsed.task_id, x, 4);
  pcp_proto_frame_deinitialize(&assign);
  assert_true(pcp_fabric_task_wait(warm, 3000));
  assert_null(pcp_fabric_task_status(warm));
  pcp_fabric_task_release(warm);
  // Program B (the "eval" program) is new to the worker. List order:
  // B0, then A's task, then B1..B3.
  static uint8_t eval_bytes[4096];
  for (size_t i = 0; i < sizeof(eval_bytes); ++i) {
    eval_bytes[i] = (uint8_t)(i * 29 + 3);
  }
  uint8_t eval_program[PCP_SHA256_BYTE_LENGTH];
  PCP_CHECK_OK(pcp_fabric_program_register(f->endpoint, eval_bytes,
                                           sizeof(eval_bytes), "cpu", "host",
                                           eval_program));
  enum { kEval = 4 };
  pcp_fabric_task_t* evals[kEval] = {0};
  pcp_fabric_task_t* probe = NULL;
  memcpy(params.program, eval_program, sizeof(params.program));
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &evals[0]));
  memcpy(params.program, f->program, sizeof(params.program));
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &probe));
  memcpy(params.program, eval_program, sizeof(params.program));
  for (int i = 1; i < kEval; ++i) {
    PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &evals[i]));
  }
  // The worker sees B's offer and the assignment of A's task (either order;
  // fake_expect would drop the other one).
  pcp_proto_frame_t offer = {0}, probe_assign = {0};
  bool have_offer = false, have_assign = false;
  int64_t deadline = fake_now_ns() + INT64_C(3000) * 1000000;
  while ((!have_offer || !have_assign) && fake_now_ns() < deadline) {
    pcp_proto_frame_t frame;
    if (!fake_recv_frame(fw, 50, true, &frame))
      continue;
    if (frame.header.type == PCP_PROTO_MESSAGE_PROGRAM_OFFER && !have_offer) {
      offer = frame;
      have_offer = true;
    } else if (frame.header.type == PCP_PROTO_MESSAGE_TASK_ASSIGN &&
               !have_assign) {
      probe_assign = frame;
      have_assign = true;
    } else {
      pcp_proto_frame_deinitialize(&frame);
    }
  }
  assert_true(have_offer && have_assign);
  pcp_proto_task_assign_t probe_parsed;
  PCP_CHECK_OK(pcp_proto_task_assign_parse(&probe_assign, &probe_parsed));
  assert_int_equal(probe_parsed.task_id, pcp_fabric_task_id(probe));
  // Let every eval task reach the endpoint's placement (they wait for the
  // offer's answer): a few ticks, heartbeating (only heartbeats come).
  int64_t settle = fake_now_ns() + 2 * H_MS * 1000000;
  while (fake_now_ns() < settle) {
    pcp_proto_frame_t frame;
    if (fake_recv_frame(fw, 10, true, &frame)) {
      assert_int_equal(frame.header.type, PCP_PROTO_MESSAGE_HEARTBEAT);
      pcp_proto_frame_deinitialize(&frame);
    }
  }
  // One write: ACK of B, then the RESULT of A's task.
  pcp_proto_program_offer_t parsed_offer;
  PCP_CHECK_OK(pcp_proto_program_offer_parse(&offer, &parsed_offer));
  assert_memory_equal(parsed_offer.program, eval_program,
                      PCP_SHA256_BYTE_LENGTH);
  pcp_proto_program_ack_t ack = {.status = PCP_PROTO_PROGRAM_CACHED};
  memcpy(ack.program, eval_program, sizeof(ack.program));
  pcp_proto_encoded_frame_t enc_ack, enc_result;
  PCP_CHECK_OK(pcp_proto_program_ack_encode(1, offer.header.request_id, &ack,
                                            &fw->limits, pcp_allocator_system(),
                                            &enc_ack));
  pcp_proto_section_t out = {.name = "y",
                             .element_type = PCP_ELEMENT_TYPE_F32,
                             .rank = 1,
                             .shape = {4},
                             .data = x};
  pcp_proto_tensor_ref_t ref = {.kind = PCP_PROTO_TENSOR_REF_SECTION,
                                .section = 0};
  pcp_proto_task_result_t result = {
      .task_id = probe_parsed.task_id, .outputs = &ref, .output_count = 1};
  PCP_CHECK_OK(pcp_proto_task_result_encode(
      1, probe_assign.header.request_id, &result, &out, 1, &fw->limits,
      pcp_allocator_system(), &enc_result));
  uint8_t* flat_ack = NULL;
  uint8_t* flat_result = NULL;
  size_t ack_length = 0, result_length = 0;
  PCP_CHECK_OK(pcp_proto_encoded_frame_flatten(&enc_ack, pcp_allocator_system(),
                                               &flat_ack, &ack_length));
  PCP_CHECK_OK(pcp_proto_encoded_frame_flatten(
      &enc_result, pcp_allocator_system(), &flat_result, &result_length));
  pcp_proto_encoded_frame_deinitialize(&enc_ack);
  pcp_proto_encoded_frame_deinitialize(&enc_result);
  uint8_t* both = malloc(ack_length + result_length);
  PCP_ASSERT(both);
  memcpy(both, flat_ack, ack_length);
  memcpy(both + ack_length, flat_result, result_length);
  assert_true(fake_send_all(fw->fd, both, ack_length + result_length));
  free(both);
  pcp_allocator_free(pcp_allocator_system(), flat_ack);
  pcp_allocator_free(pcp_allocator_system(), flat_result);
  pcp_proto_frame_deinitialize(&offer);
  pcp_proto_frame_deinitialize(&probe_assign);
  assert_true(pcp_fabric_task_wait(probe, 3000));
  assert_null(pcp_fabric_task_status(probe));
  // Every eval task is assigned (and completes once answered).
  for (int i = 0; i < kEval; ++i) {
    if (!fake_expect(fw, PCP_PROTO_MESSAGE_TASK_ASSIGN, 3000, &assign)) {
      fail_msg("eval task %d of %d never assigned", i + 1, (int)kEval);
    }
    PCP_CHECK_OK(pcp_proto_task_assign_parse(&assign, &parsed));
    send_result(fw, assign.header.request_id, parsed.task_id, x, 4);
    pcp_proto_frame_deinitialize(&assign);
  }
  for (int i = 0; i < kEval; ++i) {
    assert_true(pcp_fabric_task_wait(evals[i], 3000));
    assert_null(pcp_fabric_task_status(evals[i]));
    pcp_fabric_task_release(evals[i]);
  }
  pcp_fabric_task_release(probe);
  drop_worker(fw);
  fixture_stop(f);
}

// A running task whose worker stays connected but never answers the
// cancel (a wedged compute thread) ends DEADLINE_EXCEEDED after the resume
// window, so a caller that cancels on a deadline never waits forever.
static void test_unanswered_cancel_ends_in_bounded_time(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  fake_worker_t* fw = join_worker(f, "wedged", TOKEN);
  float x[4] = {1, 2, 3, 4};
  pcp_proto_section_t input = {.name = "x",
                               .element_type = PCP_ELEMENT_TYPE_F32,
                               .rank = 1,
                               .shape = {4},
                               .data = x};
  pcp_fabric_task_params_t params = {.function = "main",
                                     .inputs = &input,
                                     .input_count = 1,
                                     .worker_id = "wedged",
                                     .max_attempts = 1};
  memcpy(params.program, f->program, sizeof(params.program));
  pcp_fabric_task_t* task = NULL;
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &task));
  pcp_proto_frame_t assign;
  accept_offer_and_assign(fw, &assign);
  pcp_proto_frame_deinitialize(&assign);
  int64_t cancelled_at = fake_now_ns();
  pcp_fabric_task_cancel(task);
  pcp_proto_frame_t frame;
  assert_true(fake_expect(fw, PCP_PROTO_MESSAGE_TASK_CANCEL, 3000, &frame));
  pcp_proto_frame_deinitialize(&frame);
  // The worker heartbeats and says nothing about the task.
  int64_t resume_window_ns =
      pcp_fabric_endpoint_timeouts(f->endpoint).resume_window_ns;
  while (!pcp_fabric_task_is_done(task) &&
         fake_now_ns() - cancelled_at < 3 * resume_window_ns) {
    if (fake_recv_frame(fw, 10, true, &frame)) {
      pcp_proto_frame_deinitialize(&frame);
    }
  }
  assert_true(pcp_fabric_task_is_done(task));
  assert_int_equal(pcp_status_code(pcp_fabric_task_status(task)),
                   PCP_STATUS_DEADLINE_EXCEEDED);
  int64_t took = fake_now_ns() - cancelled_at;
  assert_true(took >= resume_window_ns);
  // The worker stayed connected throughout.
  pcp_fabric_worker_info_t info;
  PCP_CHECK_OK(pcp_fabric_worker_query(f->endpoint, "wedged", &info));
  assert_int_equal(info.state, PCP_FABRIC_WORKER_CONNECTED);
  pcp_fabric_task_release(task);
  drop_worker(fw);
  fixture_stop(f);
}

// A task whose frame cannot be encoded (more input sections than one
// frame carries) fails with the encoder's reason instead of waiting for an
// in-flight slot forever (it used to stay pending).
static void test_unencodable_task_fails(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  fake_worker_t* fw = join_worker(f, "wide", TOKEN);
  enum { kInputs = 65 };  // the default max_sections is 64
  float values[kInputs];
  pcp_proto_section_t inputs[kInputs];
  char names[kInputs][8];
  for (int i = 0; i < kInputs; ++i) {
    values[i] = (float)i;
    snprintf(names[i], sizeof(names[i]), "x%d", i);
    inputs[i] = (pcp_proto_section_t){.name = names[i],
                                      .element_type = PCP_ELEMENT_TYPE_F32,
                                      .rank = 0,
                                      .byte_length = sizeof(float),
                                      .data = &values[i]};
  }
  pcp_fabric_task_params_t params = {.function = "sum",
                                     .inputs = inputs,
                                     .input_count = kInputs,
                                     .worker_id = "wide",
                                     .max_attempts = 1};
  memcpy(params.program, f->program, sizeof(params.program));
  pcp_fabric_task_t* task = NULL;
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &task));
  accept_offer(fw);
  assert_true(pcp_fabric_task_wait(task, 3000));
  pcp_status_t status = pcp_fabric_task_status(task);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(pcp_status_message(status), "sections"));
  pcp_fabric_task_release(task);
  // The connection is fine: a normal task still runs on it.
  params.input_count = 1;
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &task));
  pcp_proto_frame_t assign;
  assert_true(fake_expect(fw, PCP_PROTO_MESSAGE_TASK_ASSIGN, 3000, &assign));
  pcp_proto_task_assign_t parsed;
  PCP_CHECK_OK(pcp_proto_task_assign_parse(&assign, &parsed));
  float y = 0;
  send_result(fw, assign.header.request_id, parsed.task_id, &y, 1);
  pcp_proto_frame_deinitialize(&assign);
  assert_true(pcp_fabric_task_wait(task, 3000));
  assert_null(pcp_fabric_task_status(task));
  pcp_fabric_task_release(task);
  drop_worker(fw);
  fixture_stop(f);
}

static pcp_status_t emit_to_fake(void* user_data,
                                 pcp_proto_encoded_frame_t* frame) {
  fake_worker_t* fw = user_data;
  if (!fake_send_frame(fw, frame)) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE, "send failed");
  }
  return pcp_ok_status();
}

// Tensors larger than the chunk size cross as tensor blobs both ways; the
// result comes back in the task's outputs with the right bytes.
static void test_large_tensors_travel_as_blobs(void** state) {
  (void)state;
  fixture_t* f = fixture_start(16 << 10);
  fake_worker_t* fw = join_worker(f, "big", TOKEN);
  enum { kCount = 20000 };  // 80000 bytes: 5 chunks of 16 KiB
  float* x = malloc(kCount * sizeof(float));
  for (int i = 0; i < kCount; ++i) x[i] = (float)i * 0.25f;
  pcp_proto_section_t input = {.name = "x",
                               .element_type = PCP_ELEMENT_TYPE_F32,
                               .rank = 1,
                               .shape = {kCount},
                               .data = x};
  pcp_fabric_task_params_t params = {
      .function = "negate", .inputs = &input, .input_count = 1};
  memcpy(params.program, f->program, sizeof(params.program));
  pcp_fabric_task_t* task = NULL;
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &task));
  pcp_proto_frame_t frame;
  assert_true(fake_expect(fw, PCP_PROTO_MESSAGE_PROGRAM_OFFER, 3000, &frame));
  pcp_proto_program_ack_t ack = {.status = PCP_PROTO_PROGRAM_CACHED};
  memcpy(ack.program, f->program, sizeof(ack.program));
  pcp_proto_encoded_frame_t enc;
  PCP_CHECK_OK(pcp_proto_program_ack_encode(1, frame.header.request_id, &ack,
                                            &fw->limits, pcp_allocator_system(),
                                            &enc));
  pcp_proto_frame_deinitialize(&frame);
  assert_true(fake_send_frame(fw, &enc));
  // Input chunks, then the assign that names the blob.
  pcp_proto_blob_assembly_t assembly;
  memset(&assembly, 0, sizeof(assembly));
  bool complete = false;
  int chunks = 0;
  while (!complete) {
    assert_true(fake_expect(fw, PCP_PROTO_MESSAGE_BLOB_CHUNK, 3000, &frame));
    pcp_proto_blob_chunk_t chunk;
    PCP_CHECK_OK(pcp_proto_blob_chunk_parse(&frame, &chunk));
    assert_int_equal(chunk.kind, PCP_PROTO_BLOB_TENSOR);
    if (chunks++ == 0) {
      PCP_CHECK_OK(pcp_proto_blob_assembly_initialize(
          frame.header.request_id, &chunk, &fw->limits, pcp_allocator_system(),
          &assembly));
      complete = chunk.count == 1;
    } else {
      PCP_CHECK_OK(pcp_proto_blob_assembly_add(&assembly, &chunk, &complete));
    }
    pcp_proto_frame_deinitialize(&frame);
  }
  assert_int_equal(chunks, 5);
  uint8_t* blob = NULL;
  uint64_t blob_length = 0;
  pcp_proto_blob_assembly_take(&assembly, &blob, &blob_length);
  assert_int_equal(blob_length, kCount * sizeof(float));
  assert_memory_equal(blob, x, blob_length);
  pcp_proto_frame_t assign;
  assert_true(fake_expect(fw, PCP_PROTO_MESSAGE_TASK_ASSIGN, 3000, &assign));
  pcp_proto_task_assign_t parsed;
  PCP_CHECK_OK(pcp_proto_task_assign_parse(&assign, &parsed));
  assert_int_equal(parsed.inputs[0].kind, PCP_PROTO_TENSOR_REF_BLOB);
  // The result: negated, sent as a blob, then referenced by the RESULT.
  float* y = (float*)blob;
  for (int i = 0; i < kCount; ++i) y[i] = -y[i];
  char blob_id[64];
  snprintf(blob_id, sizeof(blob_id), "t%llu.s0",
           (unsigned long long)parsed.task_id);
  PCP_CHECK_OK(pcp_proto_blob_encode_chunks(
      1, assign.header.request_id, blob_id, PCP_PROTO_BLOB_TENSOR, y,
      blob_length, &fw->limits, pcp_allocator_system(), emit_to_fake, fw));
  pcp_proto_tensor_ref_t ref = {.kind = PCP_PROTO_TENSOR_REF_BLOB,
                                .name = blob_id,
                                .element_type = PCP_ELEMENT_TYPE_F32,
                                .rank = 1,
                                .shape = {kCount}};
  pcp_proto_task_result_t result = {
      .task_id = parsed.task_id, .outputs = &ref, .output_count = 1};
  PCP_CHECK_OK(pcp_proto_task_result_encode(1, assign.header.request_id,
                                            &result, NULL, 0, &fw->limits,
                                            pcp_allocator_system(), &enc));
  assert_true(fake_send_frame(fw, &enc));
  pcp_proto_frame_deinitialize(&assign);
  assert_true(pcp_fabric_task_wait(task, 3000));
  assert_null(pcp_fabric_task_status(task));
  const pcp_proto_section_t* outputs = NULL;
  size_t count = 0;
  PCP_CHECK_OK(pcp_fabric_task_outputs(task, &outputs, &count));
  assert_int_equal(count, 1);
  assert_int_equal(outputs[0].byte_length, blob_length);
  assert_int_equal(outputs[0].element_type, PCP_ELEMENT_TYPE_F32);
  assert_int_equal(outputs[0].shape[0], kCount);
  assert_memory_equal(outputs[0].data, y, blob_length);
  // The worker's byte counters are the real traffic of its link: each way
  // the 80000-byte tensor plus framing, handshake and small frames (well
  // under 8 KiB here), and within the endpoint's totals.
  pcp_fabric_worker_info_t info;
  PCP_CHECK_OK(pcp_fabric_worker_query(f->endpoint, "big", &info));
  assert_in_range(info.bytes_out, blob_length, blob_length + 8192);
  assert_in_range(info.bytes_in, blob_length, blob_length + 8192);
  pcp_fabric_endpoint_stats_t stats;
  pcp_fabric_endpoint_stats_query(f->endpoint, &stats);
  assert_true(stats.bytes_out >= info.bytes_out);
  assert_true(stats.bytes_in >= info.bytes_in);
  pcp_proto_blob_free(pcp_allocator_system(), blob);
  free(x);
  pcp_fabric_task_release(task);
  drop_worker(fw);
  fixture_stop(f);
}

static void test_drained_worker_gets_no_new_task(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  fake_worker_t* a = join_worker(f, "leaving", TOKEN);
  fake_worker_t* b = join_worker(f, "staying", TOKEN);
  PCP_CHECK_OK(pcp_fabric_worker_drain(f->endpoint, "leaving", 5000));
  pcp_proto_frame_t frame;
  assert_true(fake_expect(a, PCP_PROTO_MESSAGE_DRAIN, 3000, &frame));
  pcp_proto_drain_t drain;
  PCP_CHECK_OK(pcp_proto_drain_parse(&frame, &drain));
  assert_int_equal(drain.deadline_ms, 5000);
  pcp_proto_frame_deinitialize(&frame);
  assert_true(
      wait_worker_state(f, "leaving", PCP_FABRIC_WORKER_DRAINING, 2000, a));
  uint8_t x[4] = {9, 8, 7, 6};
  pcp_proto_section_t input = {.name = "x",
                               .element_type = PCP_ELEMENT_TYPE_U8,
                               .rank = 1,
                               .shape = {4},
                               .data = x};
  pcp_fabric_task_params_t params = {
      .function = "main", .inputs = &input, .input_count = 1};
  memcpy(params.program, f->program, sizeof(params.program));
  pcp_fabric_task_t* task = NULL;
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &task));
  pcp_proto_frame_t assign;
  accept_offer_and_assign(b, &assign);
  pcp_proto_task_assign_t parsed;
  PCP_CHECK_OK(pcp_proto_task_assign_parse(&assign, &parsed));
  float y[1] = {1};
  send_result(b, assign.header.request_id, parsed.task_id, y, 1);
  pcp_proto_frame_deinitialize(&assign);
  assert_true(pcp_fabric_task_wait(task, 3000));
  pcp_fabric_task_info_t info;
  pcp_fabric_task_info_query(task, &info);
  assert_string_equal(info.worker_id.value, "staying");
  pcp_fabric_task_release(task);
  // The metrics count the outcome.
  pcp_string_builder_t text;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &text);
  PCP_CHECK_OK(
      pcp_obs_registry_render(pcp_fabric_endpoint_metrics(f->endpoint), &text));
  assert_non_null(strstr(pcp_string_builder_cstring(&text),
                         "pcp_fabric_tasks_total{outcome=\"succeeded\"} 1"));
  pcp_string_builder_deinitialize(&text);
  drop_worker(a);
  drop_worker(b);
  fixture_stop(f);
}

typedef struct stall_t {
  _Atomic int done;
  int64_t stall_ms;
} stall_t;

static void stall_in_callback(void* user_data, pcp_fabric_task_t* task,
                              pcp_fabric_task_event_t event) {
  (void)task;
  stall_t* stall = user_data;
  if (event != PCP_FABRIC_TASK_EVENT_DONE)
    return;
  pcp_sleep_ms(stall->stall_ms);  // the loop thread is stuck here
  stall->done = 1;
}

// A loop stall longer than the silence timeout must not evict workers whose
// heartbeats were sent on time and sit unread in the kernel.
static void test_loop_stall_does_not_evict_talking_workers(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  fake_worker_t* a = join_worker(f, "talker", TOKEN);
  fake_worker_t* b = join_worker(f, "runner-b", TOKEN);
  uint8_t x[4] = {1, 2, 3, 4};
  pcp_proto_section_t input = {.name = "x",
                               .element_type = PCP_ELEMENT_TYPE_U8,
                               .rank = 1,
                               .shape = {4},
                               .data = x};
  stall_t stall = {.stall_ms = 5 * H_MS};
  pcp_fabric_task_params_t params = {.function = "main",
                                     .inputs = &input,
                                     .input_count = 1,
                                     .worker_id = "runner-b",
                                     .callback = stall_in_callback,
                                     .user_data = &stall};
  memcpy(params.program, f->program, sizeof(params.program));
  pcp_fabric_task_t* task = NULL;
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &task));
  pcp_proto_frame_t assign;
  accept_offer_and_assign(b, &assign);
  pcp_proto_task_assign_t parsed;
  PCP_CHECK_OK(pcp_proto_task_assign_parse(&assign, &parsed));
  float y[1] = {1};
  send_result(b, assign.header.request_id, parsed.task_id, y, 1);
  pcp_proto_frame_deinitialize(&assign);
  // Both workers keep heartbeating through the stall and a while after it.
  int64_t end = fake_now_ns() + 8 * H_MS * 1000000;
  while (fake_now_ns() < end) {
    pcp_proto_frame_t frame;
    if (fake_recv_frame(a, 5, true, &frame))
      pcp_proto_frame_deinitialize(&frame);
    if (fake_recv_frame(b, 5, true, &frame))
      pcp_proto_frame_deinitialize(&frame);
  }
  assert_int_equal(stall.done, 1);
  pcp_fabric_endpoint_stats_t stats;
  pcp_fabric_endpoint_stats_query(f->endpoint, &stats);
  assert_int_equal(stats.evictions, 0);
  assert_int_equal(stats.workers_connected, 2);
  pcp_fabric_task_release(task);
  drop_worker(a);
  drop_worker(b);
  fixture_stop(f);
}

// Pumps |workers| until |results| TASK_RESULTs were sent: answers offers with
// "cached" and every assign with a one-float result. Records which worker
// ran each assign.
static int pump_assigns(fake_worker_t** workers, int worker_count, int results,
                        int64_t timeout_ms, int* out_runs) {
  int sent = 0;
  int64_t deadline = fake_now_ns() + timeout_ms * 1000000;
  while (sent < results && fake_now_ns() < deadline) {
    for (int i = 0; i < worker_count; ++i) {
      pcp_proto_frame_t frame;
      if (!fake_recv_frame(workers[i], 2, true, &frame))
        continue;
      if (frame.header.type == PCP_PROTO_MESSAGE_PROGRAM_OFFER) {
        pcp_proto_program_offer_t offer;
        PCP_CHECK_OK(pcp_proto_program_offer_parse(&frame, &offer));
        pcp_proto_program_ack_t ack = {.status = PCP_PROTO_PROGRAM_CACHED};
        memcpy(ack.program, offer.program, sizeof(ack.program));
        pcp_proto_encoded_frame_t enc;
        PCP_CHECK_OK(pcp_proto_program_ack_encode(
            1, frame.header.request_id, &ack, &workers[i]->limits,
            pcp_allocator_system(), &enc));
        assert_true(fake_send_frame(workers[i], &enc));
      } else if (frame.header.type == PCP_PROTO_MESSAGE_TASK_ASSIGN) {
        pcp_proto_task_assign_t parsed;
        PCP_CHECK_OK(pcp_proto_task_assign_parse(&frame, &parsed));
        float y[1] = {(float)i};
        send_result(workers[i], frame.header.request_id, parsed.task_id, y, 1);
        out_runs[i]++;
        sent++;
      }
      pcp_proto_frame_deinitialize(&frame);
    }
  }
  return sent;
}

static void test_group_is_placed_all_at_once_on_distinct_workers(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  fake_worker_t* workers[4] = {join_worker(f, "gang-0", TOKEN),
                               join_worker(f, "gang-1", TOKEN),
                               join_worker(f, "gang-2", TOKEN), NULL};
  uint8_t x[4] = {1, 2, 3, 4};
  pcp_proto_section_t input = {.name = "x",
                               .element_type = PCP_ELEMENT_TYPE_U8,
                               .rank = 1,
                               .shape = {4},
                               .data = x};
  pcp_fabric_task_params_t params = {
      .function = "shard", .inputs = &input, .input_count = 1};
  memcpy(params.program, f->program, sizeof(params.program));
  pcp_fabric_task_t* tasks[4] = {0};
  PCP_CHECK_OK(pcp_fabric_task_submit_group(f->endpoint, &params, 2, tasks));
  int runs[4] = {0};
  assert_int_equal(pump_assigns(workers, 3, 2, 3000, runs), 2);
  for (int i = 0; i < 2; ++i) {
    assert_true(pcp_fabric_task_wait(tasks[i], 3000));
    assert_null(pcp_fabric_task_status(tasks[i]));
  }
  pcp_fabric_task_info_t a, b;
  pcp_fabric_task_info_query(tasks[0], &a);
  pcp_fabric_task_info_query(tasks[1], &b);
  assert_string_not_equal(a.worker_id.value, b.worker_id.value);
  for (int i = 0; i < 2; ++i) pcp_fabric_task_release(tasks[i]);

  // A gang of 4 with 3 workers waits whole; a fourth worker places it.
  PCP_CHECK_OK(pcp_fabric_task_submit_group(f->endpoint, &params, 4, tasks));
  memset(runs, 0, sizeof(runs));
  assert_int_equal(pump_assigns(workers, 3, 1, 4 * H_MS, runs), 0);
  workers[3] = join_worker(f, "gang-3", TOKEN);
  assert_int_equal(pump_assigns(workers, 4, 4, 3000, runs), 4);
  for (int i = 0; i < 4; ++i) {
    assert_int_equal(runs[i], 1);
    assert_true(pcp_fabric_task_wait(tasks[i], 3000));
    pcp_fabric_task_release(tasks[i]);
  }
  // Invalid: a gang cannot name a worker.
  params.worker_id = "gang-0";
  pcp_status_t status =
      pcp_fabric_task_submit_group(f->endpoint, &params, 2, tasks);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_INVALID_ARGUMENT);
  for (int i = 0; i < 4; ++i) drop_worker(workers[i]);
  fixture_stop(f);
}

static void test_rerun_on_rejoin_at_most_n_times(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  fake_worker_t* fw = join_worker(f, "flaky", TOKEN);
  uint8_t x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  pcp_proto_section_t input = {.name = "x",
                               .element_type = PCP_ELEMENT_TYPE_U8,
                               .rank = 1,
                               .shape = {8},
                               .data = x};
  pcp_fabric_task_params_t params = {.function = "main",
                                     .inputs = &input,
                                     .input_count = 1,
                                     .max_attempts = 2};
  memcpy(params.program, f->program, sizeof(params.program));
  pcp_fabric_task_t* task = NULL;
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &task));
  for (uint32_t attempt = 1; attempt <= 2; ++attempt) {
    pcp_proto_frame_t assign;
    accept_offer_and_assign(fw, &assign);
    pcp_proto_frame_deinitialize(&assign);
    pcp_fabric_task_info_t info;
    pcp_fabric_task_info_query(task, &info);
    assert_int_equal(info.attempts, attempt);
    // The worker process dies; a new one with the same id comes back and
    // gets the same task again (sched: the detached lease resumes on it).
    drop_worker(fw);
    assert_true(
        wait_worker_state(f, "flaky", PCP_FABRIC_WORKER_LOST, 2000, NULL));
    fw = join_worker(f, "flaky", TOKEN);
  }
  // Two runs were the limit: the task fails instead of a third run.
  assert_true(pcp_fabric_task_wait(task, 3000));
  assert_int_equal(pcp_status_code(pcp_fabric_task_status(task)),
                   PCP_STATUS_ABORTED);
  pcp_fabric_task_release(task);
  drop_worker(fw);
  fixture_stop(f);
}

static void test_registry_recycles_long_lost_workers(void** state) {
  (void)state;
  setenv(TOKEN_ENV, TOKEN, 1);
  fixture_t* f = calloc(1, sizeof(fixture_t));
  PCP_ASSERT(f);
  pcp_fabric_options_initialize(&f->options);
  f->options.heartbeat_interval_ms = (uint32_t)H_MS;
  f->options.join_token_env = TOKEN_ENV;
  f->options.max_workers = 2;
  PCP_CHECK_OK(pcp_fabric_endpoint_create(&f->options, pcp_allocator_system(),
                                          &f->endpoint));
  f->port = pcp_fabric_endpoint_port(f->endpoint);
  fake_worker_t* a = join_worker(f, "pod-a", TOKEN);
  fake_worker_t* b = join_worker(f, "pod-b", TOKEN);
  // Full, nobody lost: refused.
  fake_worker_t c;
  assert_true(fake_worker_connect(f->port, &f->options.limits, &c));
  pcp_proto_join_t join;
  fake_default_join("pod-c", &join);
  assert_false(fake_handshake(&c, &join, TOKEN));
  assert_int_equal(c.reject_reason, PCP_PROTO_REJECT_CAPACITY);
  fake_worker_close(&c);
  // pod-a goes away for longer than the resume window: its slot is reused.
  drop_worker(a);
  assert_true(wait_worker_state(f, "pod-a", PCP_FABRIC_WORKER_LOST, 2000, b));
  int64_t until = fake_now_ns() + 11 * H_MS * 1000000;
  while (fake_now_ns() < until) {
    pcp_proto_frame_t frame;
    if (fake_recv_frame(b, 10, true, &frame)) {
      pcp_proto_frame_deinitialize(&frame);
    }
  }
  fake_worker_t* d = join_worker(f, "pod-c", TOKEN);
  pcp_fabric_worker_info_t info;
  pcp_status_t status = pcp_fabric_worker_query(f->endpoint, "pod-a", &info);
  assert_int_equal(pcp_status_consume_code(status), PCP_STATUS_NOT_FOUND);
  PCP_CHECK_OK(pcp_fabric_worker_query(f->endpoint, "pod-c", &info));
  assert_int_equal(info.state, PCP_FABRIC_WORKER_CONNECTED);
  // pod-b and pod-c fill the two slots. pod-b is not answered while pod-c
  // joins, so on a loaded machine it may already count as lost (silent past
  // 3H): count it in either state, not just connected.
  assert_int_equal(
      pcp_fabric_worker_count(f->endpoint, PCP_FABRIC_WORKER_CONNECTED) +
          pcp_fabric_worker_count(f->endpoint, PCP_FABRIC_WORKER_LOST),
      2);
  drop_worker(d);
  drop_worker(b);
  fixture_stop(f);
}

static void test_config_table_and_bad_options(void** state) {
  (void)state;
  pcp_fabric_config_t config;
  memset(&config, 0, sizeof(config));
  PCP_CHECK_OK(pcp_config_initialize(pcp_fabric_config_table(), &config));
  pcp_fabric_options_t options;
  pcp_fabric_options_initialize(&options);
  PCP_CHECK_OK(pcp_fabric_options_apply_config(&config, &options));
  assert_int_equal(options.heartbeat_interval_ms, 1000);
  assert_string_equal(options.join_token_env, "PCP_WORKER_JOIN_TOKEN");
  assert_int_equal(options.max_task_attempts, 3);
  pcp_config_deinitialize(pcp_fabric_config_table(), &config);
  // An unset token variable is refused at create, naming the variable.
  unsetenv("PCP_FABRIC_TEST_UNSET");
  options.join_token_env = "PCP_FABRIC_TEST_UNSET";
  pcp_fabric_endpoint_t* endpoint = NULL;
  pcp_status_t status =
      pcp_fabric_endpoint_create(&options, pcp_allocator_system(), &endpoint);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(status), "PCP_FABRIC_TEST_UNSET"));
  pcp_status_ignore(status);
  assert_null(endpoint);
}

// pcp_fabric_worker_list: every known worker (lost ones included), full
// records, sorted by id, bounded by the caller's capacity.
static void test_worker_list_snapshot(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  fake_worker_t* c = join_worker(f, "list-c", TOKEN);
  fake_worker_t* a = join_worker(f, "list-a", TOKEN);
  fake_worker_t* b = join_worker(f, "list-b", TOKEN);
  drop_worker(b);
  assert_true(
      wait_worker_state(f, "list-b", PCP_FABRIC_WORKER_LOST, 3000, NULL));
  pcp_fabric_worker_info_t infos[8];
  uint32_t total = 0;
  assert_int_equal(pcp_fabric_worker_list(f->endpoint, infos, 8, &total), 3);
  assert_int_equal(total, 3);
  const char* ids[3] = {"list-a", "list-b", "list-c"};
  for (int i = 0; i < 3; ++i) {
    assert_string_equal(infos[i].worker_id, ids[i]);
    // The whole JOIN record, as pcp_fabric_worker_query gives it.
    assert_string_equal(infos[i].backend, "cpu");
    assert_string_equal(infos[i].target, "host");
    assert_int_equal(infos[i].device_id, 3);
    assert_int_equal(infos[i].device_memory_bytes, UINT64_C(8) << 30);
    assert_int_equal(infos[i].driver_count, 2);
    assert_string_equal(infos[i].runtime_version, "iree-rt 3.13");
    assert_string_equal(infos[i].node_manager_id, "nm-1");
    assert_int_equal(infos[i].lease_id, 0);
  }
  assert_int_equal(infos[0].state, PCP_FABRIC_WORKER_CONNECTED);
  assert_int_equal(infos[1].state, PCP_FABRIC_WORKER_LOST);
  assert_true(infos[1].lost_at_ns > 0);
  assert_int_equal(infos[2].state, PCP_FABRIC_WORKER_CONNECTED);
  assert_true(infos[0].heartbeat_age_ns >= 0);
  // Capacity bounds the copy; the total still says how many there are.
  memset(infos, 0, sizeof(infos));
  assert_int_equal(pcp_fabric_worker_list(f->endpoint, infos, 1, &total), 1);
  assert_int_equal(total, 3);
  assert_string_equal(infos[1].worker_id, "");
  assert_int_equal(pcp_fabric_worker_list(f->endpoint, NULL, 0, NULL), 0);
  drop_worker(a);
  drop_worker(c);
  fixture_stop(f);
}

//===----------------------------------------------------------------------===//
// Waiting for workers
//===----------------------------------------------------------------------===//

typedef struct workers_waiter_t {
  fixture_t* f;
  const char* backend;
  const char* target;
  uint32_t count;
  int64_t timeout_ms;
  atomic_bool stop;
  pcp_status_code_t code;
  uint32_t seen;
  int64_t returned_ns;
} workers_waiter_t;

static bool waiter_stop(void* user_data) {
  return atomic_load(&((workers_waiter_t*)user_data)->stop);
}

static void* waiter_main(void* arg) {
  workers_waiter_t* w = arg;
  int64_t deadline =
      pcp_fabric_endpoint_now_ns(w->f->endpoint) + w->timeout_ms * 1000000;
  pcp_status_t status =
      pcp_fabric_workers_wait(w->f->endpoint, w->backend, w->target, w->count,
                              deadline, waiter_stop, w, &w->seen);
  w->code = pcp_status_consume_code(status);
  w->returned_ns = fake_now_ns();
  return NULL;
}

static void test_workers_wait_is_an_event(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  // Satisfied by joins: returns right after the second one (well before
  // its 10 s deadline).
  workers_waiter_t w = {.f = f,
                        .backend = "cpu",
                        .target = "host",
                        .count = 2,
                        .timeout_ms = 10000};
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, waiter_main, &w), 0);
  fake_worker_t* a = join_worker(f, "wait-a", TOKEN);
  fake_worker_t* b = join_worker(f, "wait-b", TOKEN);
  int64_t joined = fake_now_ns();
  pthread_join(thread, NULL);
  assert_int_equal(w.code, PCP_STATUS_OK);
  assert_int_equal(w.seen, 2);
  assert_true(w.returned_ns - joined < INT64_C(2000) * 1000000);
  // Already satisfied: at once. Any backend and target count too.
  workers_waiter_t any = {.f = f, .count = 2, .timeout_ms = 0};
  waiter_main(&any);
  assert_int_equal(any.code, PCP_STATUS_OK);
  // Another backend: none, so the deadline ends it (not before it).
  workers_waiter_t cuda = {
      .f = f, .backend = "cuda", .count = 1, .timeout_ms = 300};
  int64_t start = fake_now_ns();
  waiter_main(&cuda);
  assert_int_equal(cuda.code, PCP_STATUS_DEADLINE_EXCEEDED);
  assert_int_equal(cuda.seen, 0);
  assert_true(cuda.returned_ns - start >= INT64_C(300) * 1000000);
  // A stop request plus a wake ends a long wait at once.
  workers_waiter_t stopped = {.f = f, .count = 3, .timeout_ms = 60000};
  assert_int_equal(pthread_create(&thread, NULL, waiter_main, &stopped), 0);
  pcp_sleep_ms(50);
  atomic_store(&stopped.stop, true);
  int64_t asked = fake_now_ns();
  pcp_fabric_endpoint_wake(f->endpoint);
  pthread_join(thread, NULL);
  assert_int_equal(stopped.code, PCP_STATUS_CANCELLED);
  assert_true(stopped.returned_ns - asked < INT64_C(2000) * 1000000);
  // A lost worker no longer counts; a returning one wakes the wait.
  drop_worker(b);
  assert_true(wait_worker_state(f, "wait-b", PCP_FABRIC_WORKER_LOST, 2000, a));
  workers_waiter_t again = {
      .f = f, .backend = "cpu", .count = 2, .timeout_ms = 10000};
  assert_int_equal(pthread_create(&thread, NULL, waiter_main, &again), 0);
  b = join_worker(f, "wait-b", TOKEN);
  pthread_join(thread, NULL);
  assert_int_equal(again.code, PCP_STATUS_OK);
  drop_worker(a);
  drop_worker(b);
  fixture_stop(f);
}

//===----------------------------------------------------------------------===//
// Worker classes
//===----------------------------------------------------------------------===//

static fake_worker_t* join_worker_class(fixture_t* f, const char* id,
                                        const char* worker_class) {
  fake_worker_t* fw = malloc(sizeof(fake_worker_t));
  PCP_ASSERT(fw);
  assert_true(fake_worker_connect(f->port, &f->options.limits, fw));
  pcp_proto_join_t join;
  fake_default_join(id, &join);
  join.worker_class = worker_class;
  assert_true(fake_handshake(fw, &join, TOKEN));
  return fw;
}

static void test_task_runs_only_on_its_worker_class(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  fake_worker_t* workers[3] = {join_worker_class(f, "train-0", "train"), NULL,
                               NULL};
  uint8_t x[4] = {1, 2, 3, 4};
  pcp_proto_section_t input = {.name = "x",
                               .element_type = PCP_ELEMENT_TYPE_U8,
                               .rank = 1,
                               .shape = {4},
                               .data = x};
  pcp_fabric_task_params_t params = {.function = "decode",
                                     .inputs = &input,
                                     .input_count = 1,
                                     .worker_class_name = "gen"};
  memcpy(params.program, f->program, sizeof(params.program));
  assert_int_equal(pcp_fabric_workers_count(f->endpoint, NULL, NULL, "gen"), 0);
  assert_int_equal(pcp_fabric_workers_count(f->endpoint, NULL, NULL, "train"),
                   1);
  assert_int_equal(pcp_fabric_workers_count(f->endpoint, "cpu", NULL, NULL), 1);
  // A "gen" task with only a "train" worker free: never offered there.
  pcp_fabric_task_t* task = NULL;
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &task));
  int runs[3] = {0};
  assert_int_equal(pump_assigns(workers, 1, 1, 4 * H_MS, runs), 0);
  assert_false(pcp_fabric_task_is_done(task));
  // A class wait counts only "gen" workers: none yet, so the deadline.
  uint32_t seen = 99;
  pcp_status_t status = pcp_fabric_workers_wait_class(
      f->endpoint, NULL, NULL, "gen", 1,
      pcp_fabric_endpoint_now_ns(f->endpoint) + INT64_C(100) * 1000000, NULL,
      NULL, &seen);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_DEADLINE_EXCEEDED);
  assert_int_equal(seen, 0);
  // The "gen" worker joins: the task runs there.
  workers[1] = join_worker_class(f, "gen-0", "gen");
  PCP_CHECK_OK(pcp_fabric_workers_wait_class(
      f->endpoint, "cpu", "host", "gen", 1,
      pcp_fabric_endpoint_now_ns(f->endpoint) + INT64_C(5000) * 1000000, NULL,
      NULL, &seen));
  assert_int_equal(seen, 1);
  assert_int_equal(pump_assigns(workers, 2, 1, 3000, runs), 1);
  assert_int_equal(runs[0], 0);
  assert_int_equal(runs[1], 1);
  assert_true(pcp_fabric_task_wait(task, 3000));
  assert_null(pcp_fabric_task_status(task));
  pcp_fabric_task_info_t info;
  pcp_fabric_task_info_query(task, &info);
  assert_string_equal(info.worker_id.value, "gen-0");
  pcp_fabric_task_release(task);

  // A gang of 2 over "gen" with one "gen" worker waits whole (the "train"
  // worker is free and does not count); a second "gen" worker places it.
  pcp_fabric_task_t* tasks[2] = {0};
  PCP_CHECK_OK(pcp_fabric_task_submit_group(f->endpoint, &params, 2, tasks));
  memset(runs, 0, sizeof(runs));
  assert_int_equal(pump_assigns(workers, 2, 1, 4 * H_MS, runs), 0);
  workers[2] = join_worker_class(f, "gen-1", "gen");
  assert_int_equal(pump_assigns(workers, 3, 2, 3000, runs), 2);
  assert_int_equal(runs[0], 0);
  assert_int_equal(runs[1], 1);
  assert_int_equal(runs[2], 1);
  for (int i = 0; i < 2; ++i) {
    assert_true(pcp_fabric_task_wait(tasks[i], 3000));
    assert_null(pcp_fabric_task_status(tasks[i]));
    pcp_fabric_task_release(tasks[i]);
  }

  // Any-class tasks go anywhere: three at once fill all three workers.
  params.worker_class_name = NULL;
  pcp_fabric_task_t* any[3] = {0};
  for (int i = 0; i < 3; ++i) {
    PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &any[i]));
  }
  memset(runs, 0, sizeof(runs));
  assert_int_equal(pump_assigns(workers, 3, 3, 3000, runs), 3);
  assert_int_equal(runs[0] + runs[1] + runs[2], 3);
  assert_true(runs[0] >= 1);  // the "train" worker took one
  for (int i = 0; i < 3; ++i) {
    assert_true(pcp_fabric_task_wait(any[i], 3000));
    pcp_fabric_task_release(any[i]);
  }

  // A named worker of another class: FAILED_PRECONDITION at submit.
  params.worker_class_name = "gen";
  params.worker_id = "train-0";
  status = pcp_fabric_task_submit(f->endpoint, &params, &task);
  assert_int_equal(pcp_status_consume_code(status),
                   PCP_STATUS_FAILED_PRECONDITION);
  assert_null(task);
  // The same class by name runs there.
  params.worker_id = "gen-1";
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &task));
  memset(runs, 0, sizeof(runs));
  assert_int_equal(pump_assigns(workers, 3, 1, 3000, runs), 1);
  assert_int_equal(runs[2], 1);
  assert_true(pcp_fabric_task_wait(task, 3000));
  pcp_fabric_task_release(task);
  // Malformed class names: INVALID_ARGUMENT.
  params.worker_id = NULL;
  const char* bad[] = {"has space", "slash/",
                       "a2345678901234567890123456789"
                       "01234567890123456789012345678901234"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(bad); ++i) {
    params.worker_class_name = bad[i];
    status = pcp_fabric_task_submit(f->endpoint, &params, &task);
    assert_int_equal(pcp_status_consume_code(status),
                     PCP_STATUS_INVALID_ARGUMENT);
    status = pcp_fabric_workers_wait_class(f->endpoint, NULL, NULL, bad[i], 1,
                                           0, NULL, NULL, NULL);
    assert_int_equal(pcp_status_consume_code(status),
                     PCP_STATUS_INVALID_ARGUMENT);
  }
  for (int i = 0; i < 3; ++i) drop_worker(workers[i]);
  fixture_stop(f);
}

static void test_worker_class_survives_loss_and_bad_join(void** state) {
  (void)state;
  fixture_t* f = fixture_start(0);
  // A worker whose class name is malformed is rejected at JOIN.
  fake_worker_t* odd = malloc(sizeof(fake_worker_t));
  PCP_ASSERT(odd);
  assert_true(fake_worker_connect(f->port, &f->options.limits, odd));
  pcp_proto_join_t join;
  fake_default_join("odd-0", &join);
  join.worker_class = "no spaces";
  assert_false(fake_handshake(odd, &join, TOKEN));
  drop_worker(odd);
  // A "gen" task whose worker is lost re-runs on another "gen" worker,
  // never on the free "train" one.
  fake_worker_t* workers[3] = {join_worker_class(f, "train-0", "train"),
                               join_worker_class(f, "gen-0", "gen"), NULL};
  uint8_t x[4] = {1, 2, 3, 4};
  pcp_proto_section_t input = {.name = "x",
                               .element_type = PCP_ELEMENT_TYPE_U8,
                               .rank = 1,
                               .shape = {4},
                               .data = x};
  pcp_fabric_task_params_t params = {.function = "decode",
                                     .inputs = &input,
                                     .input_count = 1,
                                     .worker_class_name = "gen"};
  memcpy(params.program, f->program, sizeof(params.program));
  pcp_fabric_task_t* task = NULL;
  PCP_CHECK_OK(pcp_fabric_task_submit(f->endpoint, &params, &task));
  pcp_proto_frame_t assign;
  accept_offer_and_assign(workers[1], &assign);
  pcp_proto_frame_deinitialize(&assign);
  drop_worker(workers[1]);
  workers[1] = NULL;
  assert_true(
      wait_worker_state(f, "gen-0", PCP_FABRIC_WORKER_LOST, 3000, workers[0]));
  int runs[3] = {0};
  fake_worker_t* train_only[1] = {workers[0]};
  assert_int_equal(pump_assigns(train_only, 1, 1, 4 * H_MS, runs), 0);
  workers[2] = join_worker_class(f, "gen-1", "gen");
  fake_worker_t* live[2] = {workers[0], workers[2]};
  assert_int_equal(pump_assigns(live, 2, 1, 3000, runs), 1);
  assert_int_equal(runs[0], 0);
  assert_int_equal(runs[1], 1);
  assert_true(pcp_fabric_task_wait(task, 3000));
  assert_null(pcp_fabric_task_status(task));
  pcp_fabric_task_info_t info;
  pcp_fabric_task_info_query(task, &info);
  assert_string_equal(info.worker_id.value, "gen-1");
  pcp_fabric_task_release(task);
  drop_worker(workers[0]);
  drop_worker(workers[2]);
  fixture_stop(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_table_and_bad_options),
      cmocka_unit_test(test_join_registers_every_field),
      cmocka_unit_test(test_wrong_token_rejected_others_unaffected),
      cmocka_unit_test(test_malformed_frames_close_only_that_connection),
      cmocka_unit_test(test_heartbeats_keep_worker_alive),
      cmocka_unit_test(test_silent_worker_evicted_task_requeued),
      cmocka_unit_test(test_reconnect_keeps_identity),
      cmocka_unit_test(test_program_offer_fetch_chunks_verified),
      cmocka_unit_test(test_task_result_and_cancel),
      cmocka_unit_test(test_program_ack_assigns_every_waiting_task),
      cmocka_unit_test(test_unanswered_cancel_ends_in_bounded_time),
      cmocka_unit_test(test_unencodable_task_fails),
      cmocka_unit_test(test_large_tensors_travel_as_blobs),
      cmocka_unit_test(test_drained_worker_gets_no_new_task),
      cmocka_unit_test(test_loop_stall_does_not_evict_talking_workers),
      cmocka_unit_test(test_group_is_placed_all_at_once_on_distinct_workers),
      cmocka_unit_test(test_rerun_on_rejoin_at_most_n_times),
      cmocka_unit_test(test_registry_recycles_long_lost_workers),
      cmocka_unit_test(test_worker_list_snapshot),
      cmocka_unit_test(test_workers_wait_is_an_event),
      cmocka_unit_test(test_task_runs_only_on_its_worker_class),
      cmocka_unit_test(test_worker_class_survives_loss_and_bad_join),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
