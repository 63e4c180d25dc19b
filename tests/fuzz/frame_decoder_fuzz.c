// SPDX-License-Identifier: Apache-2.0
//
// Fuzz target for the fabric frame decoder and everything behind it: the
// incremental decoder (fed in input-chosen slices), every message parser,
// and both sans-I/O state machines taking the bytes as if from a peer.
//
// With PCP_FUZZ_LIBFUZZER (clang -fsanitize=fuzzer) this is a libFuzzer
// binary; otherwise main() replays the files named on the command line, so
// the normal build runs the seed corpus (tests/fuzz/corpus/frame_decoder).

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "proto/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static pcp_proto_limits_t fuzz_limits(void) {
  // Small limits so that the fuzzer reaches every limit check quickly.
  pcp_proto_limits_t l = pcp_proto_limits_default();
  l.max_frame_bytes = 1u << 20;
  l.max_json_bytes = 64u << 10;
  l.max_json_depth = 16;
  l.max_sections = 16;
  l.chunk_bytes = 64u << 10;
  l.max_chunk_bytes = 128u << 10;
  l.max_blob_bytes = 1u << 20;
  l.max_blob_assemblies = 2;
  l.max_in_flight = 4;
  return l;
}

static void parse_every_way(pcp_proto_frame_t* f) {
  pcp_status_t s = pcp_ok_status();
  switch (f->header.type) {
    case PCP_PROTO_MESSAGE_HELLO: {
      pcp_proto_hello_t m;
      s = pcp_proto_hello_parse(f, &m);
      break;
    }
    case PCP_PROTO_MESSAGE_JOIN: {
      pcp_proto_join_t m;
      s = pcp_proto_join_parse(f, &m);
      break;
    }
    case PCP_PROTO_MESSAGE_CHALLENGE: {
      pcp_proto_challenge_t m;
      s = pcp_proto_challenge_parse(f, &m);
      break;
    }
    case PCP_PROTO_MESSAGE_JOIN_PROOF: {
      pcp_proto_join_proof_t m;
      s = pcp_proto_join_proof_parse(f, &m);
      break;
    }
    case PCP_PROTO_MESSAGE_ACCEPT: {
      pcp_proto_accept_t m;
      s = pcp_proto_accept_parse(f, &m);
      break;
    }
    case PCP_PROTO_MESSAGE_REJECT: {
      pcp_proto_reject_t m;
      s = pcp_proto_reject_parse(f, &m);
      break;
    }
    case PCP_PROTO_MESSAGE_HEARTBEAT: {
      pcp_proto_heartbeat_t m;
      s = pcp_proto_heartbeat_parse(f, &m);
      break;
    }
    case PCP_PROTO_MESSAGE_ERROR: {
      pcp_status_t peer = pcp_ok_status();
      uint64_t task_id = 0;
      s = pcp_proto_error_parse(f, &peer, &task_id);
      pcp_status_ignore(peer);
      break;
    }
    case PCP_PROTO_MESSAGE_DRAIN: {
      pcp_proto_drain_t m;
      s = pcp_proto_drain_parse(f, &m);
      break;
    }
    case PCP_PROTO_MESSAGE_SHUTDOWN: {
      pcp_proto_shutdown_t m;
      s = pcp_proto_shutdown_parse(f, &m);
      break;
    }
    case PCP_PROTO_MESSAGE_PROGRAM_OFFER: {
      pcp_proto_program_offer_t m;
      s = pcp_proto_program_offer_parse(f, &m);
      break;
    }
    case PCP_PROTO_MESSAGE_PROGRAM_FETCH: {
      pcp_proto_program_fetch_t m;
      s = pcp_proto_program_fetch_parse(f, &m);
      break;
    }
    case PCP_PROTO_MESSAGE_BLOB_CHUNK: {
      pcp_proto_blob_chunk_t m;
      s = pcp_proto_blob_chunk_parse(f, &m);
      if (!s) {
        pcp_proto_limits_t l = fuzz_limits();
        pcp_proto_blob_assembly_t a;
        s = pcp_proto_blob_assembly_initialize(1, &m, &l,
                                               pcp_allocator_system(), &a);
        if (!s)
          pcp_proto_blob_assembly_deinitialize(&a);
      }
      break;
    }
    case PCP_PROTO_MESSAGE_PROGRAM_ACK: {
      pcp_proto_program_ack_t m;
      s = pcp_proto_program_ack_parse(f, &m);
      break;
    }
    case PCP_PROTO_MESSAGE_TASK_ASSIGN: {
      pcp_proto_task_assign_t m;
      s = pcp_proto_task_assign_parse(f, &m);
      // Touch what the parser handed out: it must point into the frame.
      for (uint32_t i = 0; !s && i < m.input_count; ++i) {
        if (m.inputs[i].kind == PCP_PROTO_TENSOR_REF_SECTION) {
          const pcp_proto_section_t* sec = &f->sections[m.inputs[i].section];
          if (sec->byte_length) {
            volatile uint8_t sink = ((const uint8_t*)sec->data)[0];
            (void)sink;
          }
        }
      }
      break;
    }
    case PCP_PROTO_MESSAGE_TASK_PROGRESS: {
      pcp_proto_task_progress_t m;
      s = pcp_proto_task_progress_parse(f, &m);
      break;
    }
    case PCP_PROTO_MESSAGE_TASK_RESULT: {
      pcp_proto_task_result_t m;
      s = pcp_proto_task_result_parse(f, &m);
      break;
    }
    case PCP_PROTO_MESSAGE_TASK_CANCEL: {
      pcp_proto_task_cancel_t m;
      s = pcp_proto_task_cancel_parse(f, &m);
      break;
    }
    default:
      break;
  }
  pcp_status_ignore(s);
}

static void drain_actions_gateway(pcp_proto_gateway_conn_t* c) {
  pcp_proto_action_t a;
  while (pcp_proto_gateway_conn_next_action(c, &a)) {
    pcp_proto_action_deinitialize(&a);
  }
}

static void drain_actions_worker(pcp_proto_worker_t* w) {
  pcp_proto_action_t a;
  while (pcp_proto_worker_next_action(w, &a)) pcp_proto_action_deinitialize(&a);
}

// Answers the owner's side of the actions so that fuzzed frames reach the
// follow-up paths (program store, task results) too.
static void serve_gateway(pcp_proto_gateway_conn_t* g, pcp_proto_worker_t* w) {
  pcp_proto_action_t a;
  while (pcp_proto_gateway_conn_next_action(g, &a)) {
    if (a.type == PCP_PROTO_ACTION_SEND && w) {
      for (size_t i = 0; i < a.frame.segment_count; ++i) {
        pcp_status_ignore(pcp_proto_worker_on_bytes(
            w, a.frame.segments[i].data, a.frame.segments[i].byte_length, 2));
      }
    } else if (a.type == PCP_PROTO_ACTION_JOIN_VERIFIED) {
      pcp_proto_gateway_accept_params_t p = {.lease_epoch = 1};
      pcp_status_ignore(pcp_proto_gateway_conn_accept(g, &p, 2));
    } else if (a.type == PCP_PROTO_ACTION_PROGRAM_FETCH) {
      static const uint8_t kProgram[100] = {1};
      pcp_status_ignore(pcp_proto_gateway_conn_send_program(
          g, a.request_id, kProgram, sizeof(kProgram), 2));
    }
    pcp_proto_action_deinitialize(&a);
  }
}

static void serve_worker(pcp_proto_worker_t* w, pcp_proto_gateway_conn_t* g) {
  pcp_proto_action_t a;
  while (pcp_proto_worker_next_action(w, &a)) {
    if (a.type == PCP_PROTO_ACTION_SEND && g) {
      for (size_t i = 0; i < a.frame.segment_count; ++i) {
        pcp_status_ignore(pcp_proto_gateway_conn_on_bytes(
            g, a.frame.segments[i].data, a.frame.segments[i].byte_length, 2));
      }
    } else if (a.type == PCP_PROTO_ACTION_CONNECT) {
      pcp_status_ignore(pcp_proto_worker_on_connected(w, 2));
    } else if (a.type == PCP_PROTO_ACTION_PROGRAM_LOOKUP) {
      pcp_status_ignore(pcp_proto_worker_program_lookup_done(
          w, a.request_id, (a.program[0] & 1) != 0, 2));
    } else if (a.type == PCP_PROTO_ACTION_PROGRAM_STORE) {
      pcp_status_ignore(
          pcp_proto_worker_program_stored(w, a.request_id, pcp_ok_status(), 2));
    } else if (a.type == PCP_PROTO_ACTION_RUN_TASK) {
      pcp_proto_task_assign_t t;
      if (!pcp_status_consume_code(
              pcp_proto_task_assign_parse(&a.received, &t))) {
        pcp_proto_task_result_t r = {.task_id = t.task_id};
        pcp_status_ignore(pcp_proto_worker_task_complete(w, &r, NULL, 0, 2));
      }
    }
    pcp_proto_action_deinitialize(&a);
  }
}

// A gateway connection and a worker that completed the real handshake
// (HMAC included), so fuzzed frames reach the post-ACCEPT logic.
static bool joined_pair(const pcp_proto_limits_t* limits, pcp_rng_t* rng,
                        const uint8_t* token, size_t token_length,
                        pcp_proto_gateway_conn_t** out_g,
                        pcp_proto_worker_t** out_w) {
  pcp_proto_gateway_config_t gc = {.limits = *limits,
                                   .heartbeat_interval_ms = 1000,
                                   .join_token = token,
                                   .join_token_length = token_length};
  pcp_proto_worker_config_t wc = {.limits = *limits,
                                  .heartbeat_interval_ms = 1000,
                                  .join_token = token,
                                  .join_token_length = token_length};
  wc.join.worker_id = "fuzz-worker";
  wc.join.backend = "cpu";
  *out_g = NULL;
  *out_w = NULL;
  if (pcp_status_consume_code(pcp_proto_gateway_conn_create(
          &gc, 0, pcp_allocator_system(), out_g)) ||
      pcp_status_consume_code(
          pcp_proto_worker_create(&wc, rng, pcp_allocator_system(), out_w)) ||
      pcp_status_consume_code(pcp_proto_worker_start(*out_w, 1))) {
    pcp_proto_gateway_conn_release(*out_g);
    pcp_proto_worker_release(*out_w);
    return false;
  }
  for (int round = 0; round < 8; ++round) {
    serve_worker(*out_w, *out_g);
    serve_gateway(*out_g, *out_w);
  }
  return pcp_proto_worker_state(*out_w) == PCP_PROTO_WORKER_READY;
}

// A data sink for BLOB_CHUNK data areas (the zero-copy receive path): a
// fixed buffer when the area fits, else declined (the decoder then buffers
// the frame itself). Both answers are reached.
static uint8_t g_sink_buffer[64u << 10];
static uint8_t* fuzz_data_sink(void* user_data, pcp_proto_frame_t* head,
                               uint64_t data_length) {
  (void)user_data;
  pcp_proto_blob_chunk_t chunk;
  pcp_status_t s = pcp_proto_blob_chunk_parse(head, &chunk);
  pcp_status_ignore(s);
  return data_length <= sizeof(g_sink_buffer) ? g_sink_buffer : NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  pcp_proto_limits_t limits = fuzz_limits();
  size_t slice = (size_t)(data[0] % 29) + 1;
  uint16_t version = (data[0] & 0x80) ? 1 : 0;

  // 1. The decoder, fed in slices, then every parser on each frame; once
  // buffering every frame, once with a data sink for BLOB_CHUNK data areas.
  for (int direct = 0; direct < 2; ++direct) {
    pcp_proto_frame_decoder_t decoder;
    pcp_proto_frame_decoder_initialize(&limits, pcp_allocator_system(),
                                       &decoder);
    pcp_proto_frame_decoder_set_version(&decoder, version);
    if (direct)
      pcp_proto_frame_decoder_set_data_sink(&decoder, fuzz_data_sink, NULL);
    size_t offset = 0;
    while (offset < size) {
      size_t n = size - offset < slice ? size - offset : slice;
      size_t consumed = 0;
      pcp_proto_parse_result_t result;
      pcp_status_t s = pcp_proto_frame_decoder_feed(&decoder, data + offset, n,
                                                    &consumed, &result);
      if (s) {
        pcp_status_ignore(s);
        break;
      }
      offset += consumed;
      if (result == PCP_PROTO_PARSE_FRAME_READY) {
        pcp_proto_frame_t f;
        pcp_proto_frame_decoder_take(&decoder, &f);
        parse_every_way(&f);
        pcp_proto_frame_deinitialize(&f);
      }
    }
    pcp_proto_frame_decoder_deinitialize(&decoder);
  }

  // 2. The gateway machine receiving the bytes from a would-be worker.
  static const uint8_t kToken[] = "fuzz-token";
  pcp_proto_gateway_config_t gc = {.limits = limits,
                                   .heartbeat_interval_ms = 1000,
                                   .join_token = kToken,
                                   .join_token_length = sizeof(kToken) - 1};
  pcp_proto_gateway_conn_t* gateway = NULL;
  if (!pcp_proto_gateway_conn_create(&gc, 0, pcp_allocator_system(),
                                     &gateway)) {
    pcp_status_ignore(pcp_proto_gateway_conn_on_bytes(gateway, data, size, 1));
    drain_actions_gateway(gateway);
    pcp_status_ignore(pcp_proto_gateway_conn_on_tick(gateway, 10000000000LL));
    drain_actions_gateway(gateway);
    pcp_proto_gateway_conn_release(gateway);
  }

  // 3. The worker machine receiving them from a would-be gateway.
  pcp_rng_t rng;
  pcp_rng_initialize(size, &rng);
  pcp_proto_worker_config_t wc = {.limits = limits,
                                  .heartbeat_interval_ms = 1000,
                                  .join_token = kToken,
                                  .join_token_length = sizeof(kToken) - 1};
  wc.join.worker_id = "fuzz-worker";
  wc.join.backend = "cpu";
  pcp_proto_worker_t* worker = NULL;
  if (!pcp_proto_worker_create(&wc, &rng, pcp_allocator_system(), &worker)) {
    pcp_status_ignore(pcp_proto_worker_start(worker, 0));
    drain_actions_worker(worker);
    pcp_status_ignore(pcp_proto_worker_on_connected(worker, 0));
    drain_actions_worker(worker);
    pcp_status_ignore(pcp_proto_worker_on_bytes(worker, data, size, 1));
    drain_actions_worker(worker);
    pcp_status_ignore(pcp_proto_worker_on_tick(worker, 10000000000LL));
    drain_actions_worker(worker);
    pcp_proto_worker_release(worker);
  }

  // 4. A joined pair: the bytes arrive at the accepted gateway as if from
  // the worker, then at the ready worker as if from the gateway.
  pcp_rng_t pair_rng;
  pcp_rng_initialize(7, &pair_rng);
  pcp_proto_gateway_conn_t* g = NULL;
  pcp_proto_worker_t* w = NULL;
  if (joined_pair(&limits, &pair_rng, kToken, sizeof(kToken) - 1, &g, &w)) {
    pcp_status_ignore(pcp_proto_gateway_conn_on_bytes(g, data, size, 3));
    serve_gateway(g, NULL);
    pcp_status_ignore(pcp_proto_worker_on_bytes(w, data, size, 3));
    serve_worker(w, NULL);
    pcp_status_ignore(pcp_proto_gateway_conn_on_tick(g, 10000000000LL));
    serve_gateway(g, NULL);
  }
  pcp_proto_gateway_conn_release(g);
  pcp_proto_worker_release(w);
  return 0;
}

#if !defined(PCP_FUZZ_LIBFUZZER)
// Replay mode: each argument is an input file.
int main(int argc, char** argv) {
  int replayed = 0;
  for (int i = 1; i < argc; ++i) {
    FILE* f = fopen(argv[i], "rb");
    if (!f) {
      fprintf(stderr, "cannot open %s\n", argv[i]);
      return 1;
    }
    uint8_t* buffer = malloc(1u << 20);
    size_t n = fread(buffer, 1, 1u << 20, f);
    fclose(f);
    LLVMFuzzerTestOneInput(buffer, n);
    // Also with each slicing/version mode over the same bytes.
    for (int mode = 0; mode < 4 && n > 0; ++mode) {
      uint8_t* copy = malloc(n + 1);
      copy[0] = (uint8_t)(mode * 37 + (mode & 1 ? 0x80 : 0));
      memcpy(copy + 1, buffer, n);
      LLVMFuzzerTestOneInput(copy, n + 1);
      free(copy);
    }
    free(buffer);
    replayed++;
  }
  printf("replayed %d inputs\n", replayed);
  return replayed > 0 ? 0 : 1;
}
#endif
