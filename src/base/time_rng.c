// SPDX-License-Identifier: Apache-2.0
// The only place PCP reads the system clock; plus the seeded RNG.

#include <errno.h>
#include <math.h>
#include <time.h>

#include "base.h"

static int64_t timespec_ns(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t system_now_ns(void* self) {
  (void)self;
  return timespec_ns(CLOCK_MONOTONIC);
}

static int64_t system_wall_ns(void* self) {
  (void)self;
  return timespec_ns(CLOCK_REALTIME);
}

pcp_clock_t pcp_clock_system(void) {
  return (pcp_clock_t){
      .self = NULL, .now_ns = system_now_ns, .wall_ns = system_wall_ns};
}

static int64_t manual_now_ns(void* self) {
  return ((pcp_clock_manual_t*)self)->now_ns;
}

static int64_t manual_wall_ns(void* self) {
  return ((pcp_clock_manual_t*)self)->wall_ns;
}

pcp_clock_t pcp_clock_manual(pcp_clock_manual_t* state) {
  return (pcp_clock_t){
      .self = state, .now_ns = manual_now_ns, .wall_ns = manual_wall_ns};
}

void pcp_clock_manual_advance(pcp_clock_manual_t* state, int64_t delta_ns) {
  state->now_ns += delta_ns;
  state->wall_ns += delta_ns;
}

void pcp_sleep_ms(int64_t duration_ms) {
  if (duration_ms <= 0)
    return;
  struct timespec ts = {.tv_sec = duration_ms / 1000,
                        .tv_nsec = (duration_ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

struct timespec pcp_realtime_deadline_ms(int64_t duration_ms) {
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  int64_t ns = (int64_t)deadline.tv_nsec + (duration_ms % 1000) * 1000000;
  deadline.tv_sec += (time_t)(duration_ms / 1000 + ns / 1000000000);
  deadline.tv_nsec = (long)(ns % 1000000000);
  return deadline;
}

//===----------------------------------------------------------------------===//
// xoshiro256** (Blackman and Vigna), seeded by splitmix64
//===----------------------------------------------------------------------===//

static uint64_t splitmix64(uint64_t* x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

void pcp_rng_initialize(uint64_t seed, pcp_rng_t* out_rng) {
  uint64_t x = seed;
  for (int i = 0; i < 4; ++i) out_rng->state[i] = splitmix64(&x);
}

uint64_t pcp_rng_next_u64(pcp_rng_t* rng) {
  uint64_t* s = rng->state;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double pcp_rng_next_double(pcp_rng_t* rng) {
  return (double)(pcp_rng_next_u64(rng) >> 11) * 0x1.0p-53;
}

uint64_t pcp_rng_next_below(pcp_rng_t* rng, uint64_t bound) {
  PCP_ASSERT(bound > 0);
  // Rejection sampling over the largest multiple of |bound|.
  uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    uint64_t r = pcp_rng_next_u64(rng);
    if (r >= threshold)
      return r % bound;
  }
}

double pcp_rng_next_normal(pcp_rng_t* rng) {
  double u1 = pcp_rng_next_double(rng);
  double u2 = pcp_rng_next_double(rng);
  if (u1 < 1e-300)
    u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2);
}
