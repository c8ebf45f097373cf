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

#include <cmath>
#include <cstdint>
#include <limits>

#include "multihead/narrow.hpp"

namespace multihead::detail {

// bfloat16 and binary16 as bits. The rounding rule itself (to nearest,
// ties to even; NaN stays a quiet NaN; |x| >= 65520 gives ±inf in f16)
// lives once, in multihead/narrow.hpp, which the 16-bit modules use too;
// these name it in the cache's terms. (Highway 1.0's BF16FromF32 truncates,
// so it is not used.)
inline uint16_t float_to_bfloat16_bits(float x) { return to_bfloat16(x).bits; }
inline float bfloat16_bits_to_float(uint16_t b) { return to_float(bfloat16{b}); }

// The largest finite binary16 value.
inline constexpr float kFloat16Max = 65504.0f;

inline uint16_t float_to_float16_bits(float x) { return to_float16(x).bits; }
inline float float16_bits_to_float(uint16_t h) { return to_float(float16{h}); }

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
