// src/simd/exp2-inl.h: the exponential every SIMD kernel uses: 2^x for
// x <= 0 in float32, written once against Highway and compiled once per
// target by each src/simd/*.cpp that includes it.
//
// Softmax needs exp(s − m) with s <= m: computed as 2^((s − m)·log2 e). The
// arguments are never positive, -inf must give exactly 0, and this costs 13
// operations against ~22 for hwy::Exp.

// Per-target include guard (Highway's pattern for -inl.h files).
#if defined(MULTIHEAD_SIMD_EXP2_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MULTIHEAD_SIMD_EXP2_INL_H_
#undef MULTIHEAD_SIMD_EXP2_INL_H_
#else
#define MULTIHEAD_SIMD_EXP2_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace multihead::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF32 = hn::ScalableTag<float>;
using VF32 = hn::Vec<DF32>;

// 2^x for x <= 0, in float: x = n + f with n = round(x), f in [-1/2, 1/2];
// 2^f by a degree-6 polynomial (relative error 2e-9 in exact arithmetic,
// ~1.6 ulp in float: fitted by bench/fit_exp2.py), 2^n by building the
// exponent bits. Rounding uses the 1.5·2^23 trick: t = x + 1.5·2^23 holds
// round(x) in its low mantissa bits, so n = t - 1.5·2^23 and the bits of t
// plus 127, shifted into the exponent field, are 2^n (3 operations fewer than
// Round + ConvertTo, whose overflow fix-up we do not need). x is clamped at
// -127, whose exponent bits are 0, so x <= -126.5 (and -inf) gives exactly +0
// (results below FLT_MIN flush to 0). 2^0 is exactly 1. NaN stays NaN on
// every target: the clamp is a compare and select (x < -127 is false for
// NaN), not Max, whose NaN result Highway leaves to the target.
HWY_INLINE VF32 Exp2NonPositive(DF32 df, VF32 x) {
  const hn::RebindToSigned<DF32> di;
  const VF32 magic = hn::Set(df, 12582912.0f);  // 1.5·2^23
  const VF32 lowest = hn::Set(df, -127.0f);
  x = hn::IfThenElse(hn::Lt(x, lowest), lowest, x);
  const VF32 t = hn::Add(x, magic);
  const VF32 n = hn::Sub(t, magic);
  const VF32 f = hn::Sub(x, n);
  VF32 p = hn::Set(df, 1.535336196e-04f);
  p = hn::MulAdd(p, f, hn::Set(df, 1.339887502e-03f));
  p = hn::MulAdd(p, f, hn::Set(df, 9.618436918e-03f));
  p = hn::MulAdd(p, f, hn::Set(df, 5.550332367e-02f));
  p = hn::MulAdd(p, f, hn::Set(df, 2.402264774e-01f));
  p = hn::MulAdd(p, f, hn::Set(df, 6.931471825e-01f));
  p = hn::MulAdd(p, f, hn::Set(df, 1.0f));
  const auto bits = hn::ShiftLeft<23>(hn::Add(hn::BitCast(di, t), hn::Set(di, 127)));
  return hn::Mul(p, hn::BitCast(df, bits));
}

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
