// src/simd/bf16_compute-inl.h: 16-bit (bfloat16, float16) rows widened to
// float32 with vector conversions, for the narrow forms of the kernels
// (flash_attention-inl.h), and bf16's pair way (PairDot below; the flash
// kernel's and the decode kernel's, decode_compressed-inl.h). Compiled once
// per target with its includer.
//
// The widening is core/narrow_lanes-inl.h's (bf16 a 16-bit shift; f16
// vcvtph2ps on x86 from AVX2 on, the scalar rule in lanes elsewhere). Both
// are exact, so every target gives the same floats, and the arithmetic
// after them is the float32 kernel's.

// Per-target include guard (Highway's pattern for -inl.h files).
#if defined(MULTIHEAD_SIMD_BF16_COMPUTE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MULTIHEAD_SIMD_BF16_COMPUTE_INL_H_
#undef MULTIHEAD_SIMD_BF16_COMPUTE_INL_H_
#else
#define MULTIHEAD_SIMD_BF16_COMPUTE_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "hwy/highway.h"
#include "core/narrow_lanes-inl.h"
#include "multihead/narrow.hpp"
#include "simd/bf16_pairs.hpp"

HWY_BEFORE_NAMESPACE();
namespace multihead::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// dst [rows][width] (packed) = widen(src [rows][width], rows ld apart).
template <class E>
HWY_INLINE void WidenRows(const E* HWY_RESTRICT src, size_t ld, size_t rows, size_t width,
                          float* HWY_RESTRICT dst) {
  const hn::ScalableTag<float> df;
  const size_t lanes = hn::Lanes(df);
  for (size_t r = 0; r < rows; ++r) {
    const E* HWY_RESTRICT s = src + r * ld;
    float* HWY_RESTRICT d = dst + r * width;
    size_t c = 0;
    for (; c + lanes <= width; c += lanes) hn::StoreU(LoadWiden(df, s + c), df, d + c);
    for (; c < width; ++c) d[c] = to_float(s[c]);
  }
}

// ---- the dot-product way for bf16 (vdpbf16ps) -------------------------------
// QKᵀ and PV on bf16 pairs (flash_attention-inl.h, Bf16Way::Dot): two bf16
// values packed in a uint32, as simd/bf16_pairs.hpp lays them out (PackPair,
// PackRowPairs, PackColumnPairs: plain code, shared with src/kernels/flash.cpp).
//
// Highway 1.0.3's ReorderWidenMulAccumulate for bf16 never emits vdpbf16ps
// (x86_128-inl.h: "TODO(janwas): _mm_dpbf16_ps when available"): it widens
// each half by a shift or a mask and issues two FMAs. So the native way is
// one vdpbf16ps in inline assembly, on the targets compiled with AVX-512
// registers, run only where CPUID says AVX512_BF16 (bf16_dot_choice in
// flash_attention.cpp, which the decode kernel's driver asks too); every
// other target runs Highway's widening on the same packed pairs, in
// vdpbf16ps's order.
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
inline constexpr bool kHasDpbf16 = true;
#else
inline constexpr bool kHasDpbf16 = false;
#endif

// acc[i] + a.bf16[2i+1]·b.bf16[2i+1] + a.bf16[2i]·b.bf16[2i], odd pair first,
// each addition rounded to nearest even (Intel's pseudo-code for VDPBF16PS;
// the products of two bf16 are exact in float32). kNative: vdpbf16ps, which
// also flushes denormal inputs and results to zero; else the same two steps
// as Highway's ReorderWidenMulAccumulate does them (shift / mask, MulAdd).
template <bool kNative, class DF>
HWY_INLINE hn::Vec<DF> PairDot(DF df, hn::Vec<hn::RebindToUnsigned<DF>> a, hn::Vec<hn::RebindToUnsigned<DF>> b,
                               hn::Vec<DF> acc) {
  static_assert(!kNative || kHasDpbf16, "vdpbf16ps is issued only on the AVX-512 targets");
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
  if constexpr (kNative) {
    asm("vdpbf16ps %2, %1, %0" : "+v"(acc.raw) : "v"(a.raw), "v"(b.raw));
    return acc;
  }
#endif
  const hn::RebindToUnsigned<DF> du;
  const auto high = hn::Set(du, 0xFFFF0000u);
  const auto a_even = hn::BitCast(df, hn::ShiftLeft<16>(a)), b_even = hn::BitCast(df, hn::ShiftLeft<16>(b));
  const auto a_odd = hn::BitCast(df, hn::And(a, high)), b_odd = hn::BitCast(df, hn::And(b, high));
  return hn::MulAdd(a_even, b_even, hn::MulAdd(a_odd, b_odd, acc));
}

// The bits of to_bfloat16(x) (multihead/narrow.hpp: nearest even, NaN kept
// quiet) in the low half of each lane: its vector twin.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> RoundToBf16Bits(DF /*df*/, hn::Vec<DF> x) {
  const hn::RebindToUnsigned<DF> du;
  const auto u = hn::BitCast(du, x);
  const auto odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), odd)));
  const auto quiet_nan = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(x)), quiet_nan, rounded);
}

// pp [ceil(rows/2)][bq] = the float rows of st [rows][bq] rounded to bf16 and
// paired down the columns, as PackColumnPairs (bq a multiple of the lanes).
template <class DF>
HWY_INLINE void PackRoundedColumnPairs(DF df, const float* HWY_RESTRICT st, size_t rows, size_t bq,
                                       uint32_t* HWY_RESTRICT pp) {
  const hn::RebindToUnsigned<DF> du;
  const size_t lanes = hn::Lanes(df);
  for (size_t p = 0; p < (rows + 1) / 2; ++p) {
    for (size_t w = 0; w < bq; w += lanes) {
      const auto even = RoundToBf16Bits(df, hn::Load(df, st + 2 * p * bq + w));
      const auto odd = 2 * p + 1 < rows ? RoundToBf16Bits(df, hn::Load(df, st + (2 * p + 1) * bq + w)) : hn::Zero(du);
      hn::Store(hn::Or(even, hn::ShiftLeft<16>(odd)), du, pp + p * bq + w);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
