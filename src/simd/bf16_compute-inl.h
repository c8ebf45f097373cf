// src/simd/bf16_compute-inl.h: 16-bit (bfloat16, float16) rows widened to
// float32 with vector conversions, for the narrow forms of the kernels
// (flash_attention-inl.h). Compiled once per target with its includer.
//
// bf16 widening is a 16-bit shift on every target; f16 widening is
// vcvtph2ps (F16C) on AVX2 and AVX-512 targets and Highway's bit emulation
// on the portable fallback. Both are exact, so every target gives the same
// floats, and the arithmetic after them is the float32 kernel's.

// Per-target include guard (Highway's pattern for -inl.h files).
#if defined(MULTIHEAD_SIMD_BF16_COMPUTE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MULTIHEAD_SIMD_BF16_COMPUTE_INL_H_
#undef MULTIHEAD_SIMD_BF16_COMPUTE_INL_H_
#else
#define MULTIHEAD_SIMD_BF16_COMPUTE_INL_H_
#endif

#include <cstddef>
#include <type_traits>

#include "hwy/highway.h"
#include "multihead/narrow.hpp"

HWY_BEFORE_NAMESPACE();
namespace multihead::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Highway's lane type of E (same layout: 16 bits).
template <class E>
using HwyNarrow = std::conditional_t<std::is_same_v<E, bfloat16>, hwy::bfloat16_t, hwy::float16_t>;

// dst [rows][width] (packed) = widen(src [rows][width], rows ld apart).
template <class E>
HWY_INLINE void WidenRows(const E* HWY_RESTRICT src, size_t ld, size_t rows, size_t width,
                          float* HWY_RESTRICT dst) {
  static_assert(sizeof(E) == 2 && sizeof(HwyNarrow<E>) == 2);
  const hn::ScalableTag<float> df;
  const hn::Rebind<HwyNarrow<E>, decltype(df)> dh;
  const size_t lanes = hn::Lanes(df);
  for (size_t r = 0; r < rows; ++r) {
    const HwyNarrow<E>* HWY_RESTRICT s = reinterpret_cast<const HwyNarrow<E>*>(src + r * ld);
    float* HWY_RESTRICT d = dst + r * width;
    size_t c = 0;
    for (; c + lanes <= width; c += lanes) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, s + c)), df, d + c);
    for (; c < width; ++c) d[c] = to_float(src[r * ld + c]);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
