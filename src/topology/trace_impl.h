// SPDX-License-Identifier: Apache-2.0
//
// Private helpers shared by the solving and protocol files of src/topology
// (trace, sim, shrink, replay, report, solver, models). Never included
// outside this folder.

#ifndef PCP_TOPOLOGY_TRACE_IMPL_H_
#define PCP_TOPOLOGY_TRACE_IMPL_H_

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "topology/protocols_impl.h"

// murmur3 fmix64: the avalanche step used by the simulator checksum, the
// per-trace seed mixer and the stable hasher below.
static inline uint64_t pcp_topology_fmix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

// A stable, seeded 64-bit hash over little-endian field bytes. Upstream uses
// Wyhash; its tests only compare hashes for equality, so any hash that never
// changes between builds and platforms will do. FNV-1a over bytes with an
// fmix64 finish is small, portable and has no alignment traps.
typedef struct pcp_topology_hasher_t {
  uint64_t state;
} pcp_topology_hasher_t;

static inline void pcp_topology_hasher_initialize(
    uint64_t seed, pcp_topology_hasher_t* out_hasher) {
  out_hasher->state = 14695981039346656037ull ^ pcp_topology_fmix64(seed);
}

static inline void pcp_topology_hasher_update(pcp_topology_hasher_t* hasher,
                                              const void* data,
                                              size_t byte_length) {
  const uint8_t* bytes = (const uint8_t*)data;
  uint64_t h = hasher->state;
  for (size_t i = 0; i < byte_length; ++i) {
    h ^= bytes[i];
    h *= 1099511628211ull;
  }
  hasher->state = h;
}

// Hashes |value| as |byte_length| little-endian bytes (1..8).
static inline void pcp_topology_hasher_update_le(pcp_topology_hasher_t* hasher,
                                                 uint64_t value,
                                                 size_t byte_length) {
  uint8_t bytes[8];
  for (size_t i = 0; i < byte_length; ++i) {
    bytes[i] = (uint8_t)(value >> (8 * i));
  }
  pcp_topology_hasher_update(hasher, bytes, byte_length);
}

static inline uint64_t pcp_topology_hasher_finish(
    const pcp_topology_hasher_t* hasher) {
  return pcp_topology_fmix64(hasher->state);
}

// Seeds given as ASCII words ("smoke_xi") are packed little-endian.
static inline uint64_t pcp_topology_ascii_seed(const char* word) {
  uint64_t seed = 0;
  for (size_t i = 0; i < 8 && word[i]; ++i) {
    seed |= (uint64_t)(uint8_t)word[i] << (8 * i);
  }
  return seed;
}

// JSON writing helpers (replay.c): a quoted, escaped string ("" for NULL)
// and an events array [{"tag":..,"actor":..,"peer":null|N,"message_id":..}].
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_json_append_string(
    pcp_string_builder_t* builder, const char* value);
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_json_append_events(
    pcp_string_builder_t* builder, const pcp_topology_event_t* events,
    size_t event_count);

// Complex excerpts in reports: "<name>: simplexes=<faces incl. empty>
// dimension=<d>", then up to PCP_TOPOLOGY_EXCERPT_LINES listed simplices
// "  i: {..}" and "  ... K more".
#define PCP_TOPOLOGY_EXCERPT_LINES 8u
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_complex_format_excerpt(
    const char* name, const pcp_topology_complex_t* complex,
    pcp_string_builder_t* builder);
// "{v, w}" in canonical (sorted) vertex order.
PCP_MUST_USE_RESULT pcp_status_t pcp_topology_simplex_format_canonical(
    pcp_topology_simplex_t simplex, pcp_string_builder_t* builder);

#endif  // PCP_TOPOLOGY_TRACE_IMPL_H_
