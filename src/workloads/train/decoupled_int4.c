// SPDX-License-Identifier: Apache-2.0
// Decoupled DiLoCo: the int4 wire codec (two codes per byte, per-block f32
// scales). See decoupled.h for the layout and the error bound.

#include <float.h>
#include <math.h>
#include <string.h>

#include "workloads/train/decoupled.h"

size_t pcp_decoupled_int4_encoded_size(size_t count, uint32_t block_size) {
  if (block_size == 0 || count > PCP_DECOUPLED_INT4_MAX_VALUES)
    return 0;
  size_t blocks = count / block_size + (count % block_size != 0);
  return blocks * sizeof(float) + count / 2 + (count & 1u);
}

static uint32_t float_bits(float f) {
  uint32_t b = 0;
  memcpy(&b, &f, sizeof(b));
  return b;
}
static float bits_float(uint32_t b) {
  float f = 0;
  memcpy(&f, &b, sizeof(f));
  return f;
}

// The block scale for max|x| = |max_abs| > 0: the smallest f32 s with
// 7*s >= max_abs whose low 3 mantissa bits are zero (so q*s, |q| <= 7, is
// exact in f32 and decoding rounds nothing). If 7*s would pass FLT_MAX the
// scale rounds down instead: the codes near the top are then clamped to 7,
// an error of max_abs - 7*s <= 7*s*2^-20, far below s/2.
static float block_scale(float max_abs) {
  float s = (float)((double)max_abs / 7.0);
  while ((double)s * 7.0 < (double)max_abs) s = nextafterf(s, INFINITY);
  // Positive floats order like their bit patterns: rounding the pattern up
  // to a multiple of 8 rounds the value up (a carry into the exponent
  // included).
  uint32_t bits = float_bits(s);
  float s_up = (bits & 7u) ? bits_float((bits | 7u) + 1u) : s;
  if ((double)s_up * 7.0 <= (double)FLT_MAX)
    return s_up;
  // Near FLT_MAX: the largest scale whose 7*s stays finite, rounded down.
  while ((double)s * 7.0 > (double)FLT_MAX) s = nextafterf(s, 0.0f);
  return bits_float(float_bits(s) & ~7u);
}

static void put_f32(uint8_t* p, float f) {
  uint32_t b = float_bits(f);
  for (int i = 0; i < 4; ++i) p[i] = (uint8_t)(b >> (8 * i));
}
static float get_f32(const uint8_t* p) {
  uint32_t b = 0;
  for (int i = 0; i < 4; ++i) b |= (uint32_t)p[i] << (8 * i);
  return bits_float(b);
}

static pcp_status_t check_shape(size_t count, uint32_t block_size) {
  if (block_size == 0 || block_size > PCP_DECOUPLED_INT4_MAX_BLOCK) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "int4 block size %u: must be in [1, %u]", block_size,
                           PCP_DECOUPLED_INT4_MAX_BLOCK);
  }
  if (count > PCP_DECOUPLED_INT4_MAX_VALUES) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "int4 payload of %zu values, limit %zu", count,
                           PCP_DECOUPLED_INT4_MAX_VALUES);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_decoupled_int4_encode(const float* values, size_t count,
                                       uint32_t block_size, uint8_t* out_data,
                                       size_t out_capacity) {
  PCP_RETURN_IF_ERROR_BARE(check_shape(count, block_size));
  size_t need = pcp_decoupled_int4_encoded_size(count, block_size);
  if (out_capacity < need) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "int4 encode of %zu values needs %zu bytes, got %zu",
                           count, need, out_capacity);
  }
  for (size_t i = 0; i < count; ++i) {
    if (!isfinite(values[i])) {
      return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "int4 encode: element %zu is %s (the codec "
                             "refuses non-finite values)",
                             i, isnan(values[i]) ? "NaN" : "infinite");
    }
  }
  size_t blocks = count / block_size + (count % block_size != 0);
  uint8_t* codes = out_data + blocks * sizeof(float);
  memset(codes, 0, count / 2 + (count & 1u));
  for (size_t b = 0; b < blocks; ++b) {
    size_t begin = b * block_size;
    size_t end = begin + block_size < count ? begin + block_size : count;
    float max_abs = 0.0f;
    for (size_t i = begin; i < end; ++i) {
      float a = fabsf(values[i]);
      if (a > max_abs)
        max_abs = a;
    }
    float s = max_abs > 0.0f ? block_scale(max_abs) : 0.0f;
    put_f32(out_data + b * sizeof(float), s);
    for (size_t i = begin; i < end; ++i) {
      int q = 0;
      if (s > 0.0f) {
        // Division in double: correctly rounded and far finer than the
        // half-code decision, so the nearest code is the true nearest.
        double t = nearbyint((double)values[i] / (double)s);
        if (t > 7.0)
          t = 7.0;
        if (t < -7.0)
          t = -7.0;
        q = (int)t;
      }
      uint8_t nibble = (uint8_t)(q + 8);
      codes[i / 2] |= (i & 1u) ? (uint8_t)(nibble << 4) : nibble;
    }
  }
  return pcp_ok_status();
}

pcp_status_t pcp_decoupled_int4_decode(const uint8_t* data, size_t byte_length,
                                       size_t count, uint32_t block_size,
                                       float* out_values) {
  PCP_RETURN_IF_ERROR_BARE(check_shape(count, block_size));
  size_t need = pcp_decoupled_int4_encoded_size(count, block_size);
  if (byte_length != need) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "int4 payload of %zu bytes, %zu values in blocks of "
                           "%u need %zu",
                           byte_length, count, block_size, need);
  }
  size_t blocks = count / block_size + (count % block_size != 0);
  const uint8_t* codes = data + blocks * sizeof(float);
  for (size_t b = 0; b < blocks; ++b) {
    float s = get_f32(data + b * sizeof(float));
    // The encoder never writes a scale whose 7*s overflows (found by the
    // fuzz target: such a payload decoded to infinities).
    if (!isfinite(s) || s < 0.0f || (double)s * 7.0 > (double)FLT_MAX) {
      return pcp_make_status(PCP_STATUS_DATA_LOSS,
                             "int4 payload: block %zu has scale %g", b,
                             (double)s);
    }
    size_t begin = b * block_size;
    size_t end = begin + block_size < count ? begin + block_size : count;
    for (size_t i = begin; i < end; ++i) {
      uint8_t byte = codes[i / 2];
      int nibble = (i & 1u) ? (byte >> 4) : (byte & 0x0F);
      if (nibble == 0) {
        // Never written (q >= -7); -8*s could also overflow.
        return pcp_make_status(PCP_STATUS_DATA_LOSS,
                               "int4 payload: element %zu has code 0", i);
      }
      out_values[i] = (float)(nibble - 8) * s;
    }
  }
  return pcp_ok_status();
}
