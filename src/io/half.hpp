// src/io/half.hpp: IEEE 754 binary16 and bfloat16 bit patterns to float.
// Both conversions are exact (every binary16 and bfloat16 value is a float),
// keep the sign of zero, map infinities to infinities and keep NaN payloads.
#pragma once

#include <bit>
#include <cstdint>

namespace multihead::detail {

// binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
// binary32: 1 sign, 8 exponent (bias 127), 23 mantissa bits.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf, or NaN with its payload
  } else if (exponent != 0) {
    bits = sign | ((exponent - 15 + 127) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // ±0
  } else {
    // Subnormal: value = mantissa · 2^-24. Shift the leading one up to the
    // implicit-bit position (bit 10); each shift lowers the exponent by one
    // from the smallest normal exponent, -14.
    int32_t e = -14;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e + 127) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// bfloat16 is the top half of a binary32, so widening is a shift.
inline float bfloat16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

}  // namespace multihead::detail
