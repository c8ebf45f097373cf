// src/core/narrow_lanes-inl.h: multihead/narrow.hpp's conversions as lane
// operations, for every Highway target: the one vector form of those rules,
// used by the whole-row conversions (core/narrow_rows.cpp), the 16-bit flash
// kernel's tiles (simd/bf16_compute-inl.h) and the compressed-cache decode
// (simd/decode_compressed-inl.h). Compiled once per target with its
// includer (Highway's per-target include guard).
//
// Each function runs the scalar rule's steps on every lane, computing each
// branch and selecting, so the bits are the scalar rule's (checked against
// it in tests/test_narrow_rows.cpp on every tie and boundary), with one
// exception stated where it arises: F16C quiets a signalling f16 NaN.
#if defined(MULTIHEAD_CORE_NARROW_LANES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MULTIHEAD_CORE_NARROW_LANES_INL_H_
#undef MULTIHEAD_CORE_NARROW_LANES_INL_H_
#else
#define MULTIHEAD_CORE_NARROW_LANES_INL_H_
#endif

#include <bit>
#include <cstdint>

#include "hwy/highway.h"
#include "multihead/narrow.hpp"

HWY_BEFORE_NAMESPACE();
namespace multihead::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes(df) bf16 values at p, widened: a 16-bit shift (exact).
template <class DF>
HWY_INLINE hn::Vec<DF> LoadWidenBf16(DF df, const bfloat16* HWY_RESTRICT p) {
  const hn::Rebind<hwy::bfloat16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::bfloat16_t*>(p)));
}

// Lanes(df) f16 values at p, widened exactly. On x86 from AVX2 on, F16C's
// vcvtph2ps (one instruction; it quiets a signalling NaN, the one
// difference from the scalar rule, which keeps the payload as it is).
// Elsewhere to_float(float16)'s rule in lanes: Highway 1.0.3's own emulated
// PromoteTo widens the f16 infinities and NaNs to 65536 and above, so it is
// not used: the magnitude's bits shifted into a float32's place and scaled
// by 2^112 (exact for the normals and, through a float32 subnormal, the
// subnormals), or for exponent 31 the float32 infinity or NaN with the same
// payload; then the sign.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadWidenF16(DF df, const float16* HWY_RESTRICT p) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#else
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> d16;
  const auto h = hn::PromoteTo(du, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(p)));
  const auto magnitude = hn::And(h, hn::Set(du, 0x7fffu));
  const auto shifted = hn::ShiftLeft<13>(magnitude);
  const auto finite = hn::Mul(hn::BitCast(df, shifted), hn::Set(df, std::bit_cast<float>(uint32_t{(127u + 112u) << 23})));
  const auto special = hn::BitCast(df, hn::Or(shifted, hn::Set(du, 0x7f800000u)));
  const auto is_special = hn::RebindMask(df, hn::Gt(hn::BitCast(di, magnitude), hn::Set(di, 0x7bff)));
  const auto sign = hn::BitCast(df, hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u))));
  return hn::Or(hn::IfThenElse(is_special, special, finite), sign);
#endif
}

// to_bfloat16's bits (narrow.hpp) in the low half of each int32 lane: NaN
// keeps its top half with the quiet bit set; everything else adds 0x7fff
// plus the kept half's lowest bit (ties to even) and keeps the top half.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> Bf16Bits(DF, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto u = hn::BitCast(du, v);
  const auto magnitude = hn::BitCast(di, hn::And(u, hn::Set(du, 0x7fffffffu)));
  const auto is_nan = hn::RebindMask(du, hn::Gt(magnitude, hn::Set(di, 0x7f800000)));
  const auto lowest_kept = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto rounded = hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), lowest_kept));
  const auto quiet = hn::Or(u, hn::Set(du, 0x00400000u));
  return hn::BitCast(di, hn::ShiftRight<16>(hn::IfThenElse(is_nan, quiet, rounded)));
}

// to_float16's bits (narrow.hpp, F. Giesen's float_to_half_fast3_rtne) in
// the low half of each int32 lane, on the magnitude: at or beyond 2^16 ±inf
// (or the quiet NaN 0x7e00); below 2^-14 one float addition of 0.5, whose
// ulp (2^-24) is the f16 subnormals' spacing, so the addition rounds to
// that grid, to nearest even; otherwise re-bias, add half an ulp minus one
// and the kept lowest bit (ties to even), shift. Then the sign.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> F16Bits(DF df, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  constexpr int32_t kInf32 = 255 << 23;
  constexpr int32_t kOverflow = (127 + 16) << 23;
  constexpr int32_t kDenormMagic = ((127 - 15) + (23 - 10) + 1) << 23;
  constexpr int32_t kSmallestNormal = 113 << 23;  // 2^-14
  const auto u = hn::BitCast(du, v);
  const auto sign = hn::And(u, hn::Set(du, 0x80000000u));
  const auto a = hn::BitCast(di, hn::Xor(u, sign));  // |v|'s bits, below 2^31
  const auto big = hn::IfThenElse(hn::Gt(a, hn::Set(di, kInf32)), hn::Set(di, 0x7e00), hn::Set(di, 0x7c00));
  const auto t = hn::Add(hn::BitCast(df, a), hn::Set(df, std::bit_cast<float>(kDenormMagic)));
  const auto small = hn::Sub(hn::BitCast(di, t), hn::Set(di, kDenormMagic));
  const auto odd = hn::And(hn::ShiftRight<13>(a), hn::Set(di, 1));
  const auto normal = hn::ShiftRight<13>(hn::Add(hn::Add(a, hn::Set(di, ((15 - 127) << 23) + 0xfff)), odd));
  const auto magnitude_bits = hn::IfThenElse(hn::Gt(a, hn::Set(di, kOverflow - 1)), big,
                                             hn::IfThenElse(hn::Lt(a, hn::Set(di, kSmallestNormal)), small, normal));
  return hn::Or(magnitude_bits, hn::BitCast(di, hn::ShiftRight<16>(sign)));
}

// Lanes(df) values widened from E at p.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadWiden(DF df, const bfloat16* HWY_RESTRICT p) { return LoadWidenBf16(df, p); }
template <class DF>
HWY_INLINE hn::Vec<DF> LoadWiden(DF df, const float16* HWY_RESTRICT p) { return LoadWidenF16(df, p); }

// v rounded once to E (narrow_from_float<E>), stored at p (Lanes(df) values).
template <class E, class DF>
HWY_INLINE void RoundStore(DF df, hn::Vec<DF> v, E* HWY_RESTRICT p) {
  const hn::Rebind<uint16_t, DF> d16;
  const auto bits = std::is_same_v<E, bfloat16> ? Bf16Bits(df, v) : F16Bits(df, v);
  hn::StoreU(hn::DemoteTo(d16, bits), d16, reinterpret_cast<uint16_t*>(p));  // bits are in [0, 0xffff]
}

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#endif  // MULTIHEAD_CORE_NARROW_LANES_INL_H_
