// SPDX-License-Identifier: Apache-2.0
// f16 and bf16 scalar conversions (round to nearest even), beside the
// element types they convert: the models module reads f16/bf16 checkpoints
// without reaching down into compute.

#include <stdint.h>
#include <string.h>

#include "base.h"

static uint32_t float_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, 4);
  return bits;
}

static float bits_float(uint32_t bits) {
  float value;
  memcpy(&value, &bits, 4);
  return value;
}

uint16_t pcp_f32_to_bf16(float value) {
  uint32_t bits = float_bits(value);
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu)) {
    return (uint16_t)((bits >> 16) | 0x40);  // quiet NaN
  }
  uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return (uint16_t)((bits + rounding) >> 16);
}

float pcp_bf16_to_f32(uint16_t value) {
  return bits_float((uint32_t)value << 16);
}

uint16_t pcp_f32_to_f16(float value) {
  uint32_t bits = float_bits(value);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t exponent = (bits >> 23) & 0xFFu;
  uint32_t mantissa = bits & 0x7FFFFFu;
  if (exponent == 0xFF) {
    return (uint16_t)(sign | 0x7C00u | (mantissa ? 0x200u : 0));
  }
  int32_t e = (int32_t)exponent - 127 + 15;
  if (e >= 31)
    return (uint16_t)(sign | 0x7C00u);  // overflow -> inf
  if (e <= 0) {
    if (e < -10)
      return (uint16_t)sign;  // underflow -> signed zero
    // Subnormal: shift the implicit-one mantissa, round to nearest even.
    mantissa |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - e);
    uint32_t half = mantissa >> shift;
    uint32_t remainder = mantissa & ((1u << shift) - 1);
    uint32_t midpoint = 1u << (shift - 1);
    if (remainder > midpoint || (remainder == midpoint && (half & 1)))
      half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = sign | ((uint32_t)e << 10) | (mantissa >> 13);
  uint32_t remainder = mantissa & 0x1FFFu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (half & 1)))
    half++;
  return (uint16_t)half;
}

float pcp_f16_to_f32(uint16_t value) {
  uint32_t sign = (uint32_t)(value & 0x8000u) << 16;
  uint32_t exponent = (value >> 10) & 0x1Fu;
  uint32_t mantissa = value & 0x3FFu;
  if (exponent == 0) {
    if (mantissa == 0)
      return bits_float(sign);
    float f = (float)mantissa / 1024.0f / 16384.0f;  // 2^-14 subnormal scale
    return sign ? -f : f;
  }
  if (exponent == 31)
    return bits_float(sign | 0x7F800000u | (mantissa << 13));
  return bits_float(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}
