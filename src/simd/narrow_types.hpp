// src/simd/narrow_types.hpp: the scalar rules of the compressed KV cache's
// element types (bfloat16, IEEE binary16, int8 with a float scale per block),
// written once: the cache stores through these, the decode kernel's scalar
// tail widens through them, and its vector loads (decode_compressed-inl.h)
// are their Highway twins (PromoteTo), which widen exactly as these do.
//
// Rounding is to nearest, ties to even, for all three. Error per element x
// (what docs/decoding.md's bound starts from):
//   bf16: |x − x̂| <= 2^-8·|x| (unit roundoff u = 2^-8; 8 significant bits);
//   f16:  |x − x̂| <= 2^-11·|x| + 2^-25 (u = 2^-11; the 2^-25 is half the
//         spacing of the subnormals below 2^-14); |x| > 65504 is out of range
//         (the cache refuses it rather than store an infinity);
//   int8: x̂ = scale·q, scale = max|x| / 127 over the block, q = round(x /
//         scale) in [−127, 127]: |x − x̂| <= scale / 2 (plus float32's own
//         rounding of x / scale and scale·q, a few 2^-24·|x|).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace multihead::detail {

// float → bfloat16 bits, round to nearest even (Highway 1.0's BF16FromF32
// truncates, so it is not used). NaN stays a quiet NaN of the same sign.
inline uint16_t float_to_bfloat16_bits(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}
inline float bfloat16_bits_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// The largest finite binary16 value.
inline constexpr float kFloat16Max = 65504.0f;

// float → binary16 bits, round to nearest even, with subnormals; values
// beyond the range round to ±infinity (the cache checks the range first).
inline uint16_t float_to_float16_bits(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: rounds to inf
  const int32_t exponent = static_cast<int32_t>(magnitude >> 23) - 127;
  if (exponent >= -14) {
    // Normal: keep 10 of the 23 mantissa bits, rounding the 13 dropped.
    const uint32_t rebased = magnitude - (static_cast<uint32_t>(127 - 15) << 23);
    const uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }
  if (exponent < -25) return sign;  // below half the smallest subnormal (2^-25): ±0
  // Subnormal: value = m · 2^-24 with m = mantissa (implicit one included)
  // shifted right by (−14 − exponent) + 13 bits, rounded to even.
  const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  const int shift = -exponent - 14 + 13;  // 14 … 24
  const uint32_t half = 1u << (shift - 1);
  const uint32_t kept = mantissa >> shift, dropped = mantissa & ((1u << shift) - 1u);
  const uint32_t m = kept + ((dropped > half || (dropped == half && (kept & 1u))) ? 1u : 0u);
  return static_cast<uint16_t>(sign | m);  // m may carry into the smallest normal: still right
}
inline float float16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
  const float subnormal = static_cast<float>(mantissa) * 0x1p-24f;  // exact
  return sign ? -subnormal : subnormal;
}

// The int8 cache's block: 32 consecutive values of one head's row (of one
// token); a row of D values has ceil(D / 32) blocks, the last one shorter
// when 32 does not divide D.
inline constexpr int64_t kInt8Block = 32;
inline int64_t int8_blocks(int64_t width) { return (width + kInt8Block - 1) / kInt8Block; }

// Quantizes x[0 … n) (n <= 32) symmetrically: scale = max|x| / 127,
// q[i] = round_to_nearest_even(x[i] / scale), clamped to [−127, 127] (x /
// scale may exceed 127 by float rounding). An all-zero block has scale 0
// and q = 0. A block holding a non-finite value gets scale NaN (and q = 0),
// so it reads back as NaN, as a float32 cache would propagate it.
inline float quantize_int8_block(const float* x, int64_t n, int8_t* q) {
  float max_abs = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    finite = finite && std::isfinite(x[i]);
    max_abs = std::fmax(max_abs, std::fabs(x[i]));
  }
  if (!finite || max_abs == 0.0f) {
    for (int64_t i = 0; i < n; ++i) q[i] = 0;
    return finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  const float scale = max_abs / 127.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float r = std::nearbyint(x[i] / scale);  // the default rounding mode: to nearest, ties to even
    q[i] = static_cast<int8_t>(std::fmax(-127.0f, std::fmin(127.0f, r)));
  }
  return scale;
}

}  // namespace multihead::detail
