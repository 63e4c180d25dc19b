// SPDX-License-Identifier: Apache-2.0
// Fuzz target for the decoupled DiLoCo decoders, the two that read bytes
// from a peer or a disk: the event tape (then replayed into a syncer state
// and turned into a recovery plan) and the int4 payload (then re-encoded:
// the bound |x - dec(enc(x))| <= scale/2 must hold for every value a
// decoder can produce, or the target aborts).
//
// Input: byte 0 selects the decoder (0 mod 4: tape as is; 2 mod 4: tape
// with the header and record CRCs fixed up first, so mutations reach the
// payload parser, the replay and the recovery plan; 1 mod 4: int4; 3 mod
// 4: the round machine). int4: byte 1 gives the block size (1 + b % 128),
// bytes 2-3 the value count (LE, mod 4096), the rest is the payload. Round:
// byte 1 the expected learners (1..8), byte 2 min_quorum, byte 3 the grace
// (ms), then (learner, time step) byte pairs: arrivals, or a poll when the
// learner byte is 0xFF; the machine must agree with pcp_decoupled_select.
//
// Built two ways, as config_fuzz.c: libFuzzer under clang with
// -DPCP_FUZZ=ON, otherwise a replay tool that ctest runs over
// tests/fuzz/decoupled.

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "workloads/workloads.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static void fuzz_tape(const uint8_t* data, size_t size) {
  pcp_allocator_t a = pcp_allocator_system();
  pcp_decoupled_tape_t tape;
  pcp_decoupled_tape_initialize(a, &tape);
  pcp_status_t status = pcp_decoupled_tape_decode(data, size, &tape);
  if (status != NULL) {
    // A failed decode leaves the tape empty.
    PCP_ASSERT(tape.count == 0);
    pcp_status_ignore(status);
    return;
  }
  // A decoded tape encodes back to the same bytes.
  uint8_t* again = NULL;
  size_t again_size = 0;
  PCP_CHECK_OK(pcp_decoupled_tape_encode(&tape, &again, &again_size));
  PCP_ASSERT(again_size == size && memcmp(again, data, size) == 0);
  pcp_allocator_free(a, again);
  static pcp_decoupled_syncer_state_t state;
  status = pcp_decoupled_syncer_state_replay(a, 8, &tape, &state);
  if (status == NULL) {
    pcp_decoupled_live_learner_t live[2] = {{1, state.global_step}, {2, 0}};
    pcp_decoupled_recovery_plan_t plan;
    status = pcp_decoupled_recovery_plan_initialize(a, &state, &tape, live, 2,
                                                    4, &plan);
    if (status == NULL)
      pcp_decoupled_recovery_plan_deinitialize(&plan);
    pcp_decoupled_syncer_state_deinitialize(&state);
  }
  pcp_status_ignore(status);
  pcp_decoupled_tape_deinitialize(&tape);
}

static void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = (uint8_t)(v >> (8 * i));
}

// Rewrites the header CRC and every record CRC that its length field lets
// us find, in a copy, then decodes that.
static void fuzz_tape_fixed(const uint8_t* data, size_t size) {
  static uint8_t copy[1u << 16];
  if (size > sizeof(copy))
    return;
  memcpy(copy, data, size);
  if (size >= 16)
    put_u32(copy + 12, pcp_proto_crc32c(copy, 12));
  size_t at = 16;
  while (at + 8 <= size) {
    uint32_t length = 0;
    for (int i = 0; i < 4; ++i) length |= (uint32_t)copy[at + i] << (8 * i);
    if (length > size - at - 8)
      break;
    put_u32(copy + at + 4, pcp_proto_crc32c(copy + at + 8, length));
    at += 8 + (size_t)length;
  }
  fuzz_tape(copy, size);
}

static void fuzz_int4(const uint8_t* data, size_t size) {
  if (size < 4)
    return;
  uint32_t block = 1u + data[1] % 128u;
  size_t count = ((size_t)data[2] | ((size_t)data[3] << 8)) % 4096u;
  static float values[4096];
  static float back[4096];
  static uint8_t encoded[4 * 4096 + 2048];
  pcp_status_t status =
      pcp_decoupled_int4_decode(data + 4, size - 4, count, block, values);
  if (status != NULL) {
    pcp_status_ignore(status);
    return;
  }
  size_t bytes = pcp_decoupled_int4_encoded_size(count, block);
  PCP_ASSERT(bytes == size - 4);
  for (size_t i = 0; i < count; ++i) PCP_ASSERT(isfinite(values[i]));
  PCP_CHECK_OK(pcp_decoupled_int4_encode(values, count, block, encoded,
                                         sizeof(encoded)));
  PCP_CHECK_OK(pcp_decoupled_int4_decode(encoded, bytes, count, block, back));
  for (size_t i = 0; i < count; ++i) {
    float s = 0;
    memcpy(&s, encoded + (i / block) * 4, 4);
    PCP_ASSERT(fabs((double)values[i] - (double)back[i]) <= (double)s / 2);
  }
}

static void fuzz_round(const uint8_t* data, size_t size) {
  if (size < 4)
    return;
  uint32_t expected[8];
  uint32_t expected_count = 1u + data[1] % 8u;
  for (uint32_t i = 0; i < expected_count; ++i) expected[i] = 10u + i;
  uint32_t min_quorum = 1u + data[2] % expected_count;
  uint64_t grace = data[3];
  static pcp_decoupled_round_t round;
  PCP_CHECK_OK(pcp_decoupled_round_open(1000, expected, expected_count,
                                        min_quorum, grace, 500, &round));
  uint64_t now = 1000;
  for (size_t i = 4; i + 1 < size; i += 2) {
    now += data[i + 1] % 16u;
    if (data[i] == 0xFF) {
      (void)pcp_decoupled_round_poll(&round, now);
    } else {
      pcp_decoupled_round_arrive(&round, 8u + data[i] % 12u, now);
    }
  }
  uint64_t at = pcp_decoupled_round_next_deadline_ms(&round);
  if (at != UINT64_MAX)
    (void)pcp_decoupled_round_poll(&round, at);
  PCP_ASSERT(round.state != PCP_DECOUPLED_ROUND_COLLECTING);
  if (round.state == PCP_DECOUPLED_ROUND_TIMED_OUT) {
    PCP_ASSERT(round.arrival_count < min_quorum);
    return;
  }
  // The machine's recorded arrivals, selected from scratch, give the same
  // participants; every participant was expected and within the deadline.
  pcp_decoupled_selection_t again;
  PCP_CHECK_OK(pcp_decoupled_select(round.arrivals, round.arrival_count,
                                    expected, expected_count, min_quorum, grace,
                                    &again));
  PCP_ASSERT(again.participant_count == round.selection.participant_count);
  PCP_ASSERT(round.selection.participant_count >= min_quorum);
  PCP_ASSERT(round.selection.participant_count == round.arrival_count);
  for (uint32_t p = 0; p < again.participant_count; ++p) {
    PCP_ASSERT(again.participants[p] == round.selection.participants[p]);
  }
  PCP_ASSERT(round.closed_at_ms <= 1000 + round.selection.deadline_ms ||
             round.arrival_count == expected_count);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  if (data[0] % 4 == 0) {
    fuzz_tape(data + 1, size - 1);
  } else if (data[0] % 4 == 2) {
    fuzz_tape_fixed(data + 1, size - 1);
  } else if (data[0] % 4 == 1) {
    fuzz_int4(data, size);
  } else {
    fuzz_round(data, size);
  }
  return 0;
}

#ifndef PCP_FUZZ_LIBFUZZER
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    void* data = NULL;
    size_t size = 0;
    pcp_status_t status = pcp_file_read_all(argv[i], 1u << 22, &data, &size);
    if (status) {
      char text[512];
      pcp_status_format(status, text, sizeof(text));
      fprintf(stderr, "decoupled_fuzz: %s\n", text);
      pcp_status_ignore(status);
      return 1;
    }
    LLVMFuzzerTestOneInput(data, size);
    pcp_libc_free(data);  // pcp_file_read_all's buffer: posix_memalign
  }
  printf("decoupled_fuzz: replayed %d input(s)\n", argc - 1);
  return 0;
}
#endif
