// src/simd/softmax_row.cpp: the softmax row of a stored score matrix
// (softmax_row.hpp), compiled once per Highway target.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "simd/softmax_row.hpp"
#include "simd/targets.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/softmax_row.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "core/narrow_lanes-inl.h"
#include "simd/exp2-inl.h"

HWY_BEFORE_NAMESPACE();
namespace multihead::detail {
namespace HWY_NAMESPACE {

// Softmax numerators of one row, p[j] = exp(row[j] - row_max) through
// Exp2NonPositive (exp2-inl.h, shared with the flash kernel), each handed
// to store(j, vector, valid lanes); returns Σ_j p[j]. row_max must be the
// row's maximum and finite, so every argument is <= 0 (masked entries,
// -inf, give exactly 0). The sum is kept in one vector of lane partial
// sums, then reduced.
template <class Store>
HWY_INLINE float ExpRowTo(const float* HWY_RESTRICT row, size_t count, float row_max, const Store& store) {
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  const VF32 log2e = hn::Set(df, 1.4426950408889634f);
  const VF32 m = hn::Set(df, row_max);
  VF32 sum = hn::Zero(df);
  size_t j = 0;
  for (; j + lanes <= count; j += lanes) {
    // Subtract first: s·log2(e) - m·log2(e) would lose the difference when
    // the scores are large (|s| ~ 1e4 leaves ~1e-3 of absolute error).
    const VF32 p = Exp2NonPositive(df, hn::Mul(hn::Sub(hn::LoadU(df, row + j), m), log2e));
    store(j, p, lanes);
    sum = hn::Add(sum, p);
  }
  if (j < count) {  // the last count % lanes through a padded buffer
    const size_t rest = count - j;
    HWY_ALIGN float buf[hn::MaxLanes(DF32())] = {};
    std::copy(row + j, row + count, buf);
    const VF32 p = hn::IfThenElseZero(hn::FirstN(df, rest),
                                      Exp2NonPositive(df, hn::Mul(hn::Sub(hn::Load(df, buf), m), log2e)));
    store(j, p, rest);
    sum = hn::Add(sum, p);
  }
  return hn::GetLane(hn::SumOfLanes(df, sum));
}

// In place: row[j] = exp(row[j] - row_max).
float ExpRowF32(float* row, size_t count, float row_max) {
  const DF32 df;
  return ExpRowTo(row, count, row_max, [&](size_t j, VF32 p, size_t valid) {
    if (valid == hn::Lanes(df)) {
      hn::StoreU(p, df, row + j);
    } else {
      HWY_ALIGN float buf[hn::MaxLanes(DF32())];
      hn::Store(p, df, buf);
      std::copy(buf, buf + valid, row + j);
    }
  });
}

// The same numerators rounded to bf16 into out[j] (nearest even; the tail
// by the scalar rule, as RoundRow's), the sum of the unrounded ones
// returned: ExpRowF32 then round_rows in one pass, the same bits.
float ExpRowBf16(const float* row, size_t count, float row_max, bfloat16* out) {
  const DF32 df;
  return ExpRowTo(row, count, row_max, [&](size_t j, VF32 p, size_t valid) {
    if (valid == hn::Lanes(df)) {
      RoundStore(df, p, out + j);
    } else {
      HWY_ALIGN float buf[hn::MaxLanes(DF32())];
      hn::Store(p, df, buf);
      for (size_t k = 0; k < valid; ++k) out[j + k] = to_bfloat16(buf[k]);
    }
  });
}

// The largest of row[0, count): what the scalar rule `m = s > m ? s : m`
// from -inf gives, NaNs aside (a row holding a NaN is NaN whatever its
// maximum: exp(NaN - m) and exp(s - NaN) are NaN). -inf for count 0.
float RowMaxF32(const float* row, size_t count) {
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  VF32 m = hn::Set(df, -std::numeric_limits<float>::infinity());
  size_t j = 0;
  for (; j + lanes <= count; j += lanes) m = hn::Max(m, hn::LoadU(df, row + j));
  // The lanes by the scalar rule: Highway 1.0.3's MaxOfLanes on EMU128
  // starts from the lowest finite float, so a row of -inf gave -FLT_MAX
  // (and a fully masked row looked unmasked).
  HWY_ALIGN float lane[hn::MaxLanes(DF32())];
  hn::Store(m, df, lane);
  float best = -std::numeric_limits<float>::infinity();
  for (size_t l = 0; l < lanes; ++l) best = lane[l] > best ? lane[l] : best;
  for (; j < count; ++j) best = row[j] > best ? row[j] : best;
  return best;
}

void Exp2NonPositiveArrayF32(const float* in, float* out, size_t count) {
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  size_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    hn::StoreU(Exp2NonPositive(df, hn::LoadU(df, in + i)), df, out + i);
  }
  // Remainder through a full vector in a padded buffer.
  if (i < count) {
    HWY_ALIGN float buf[hn::MaxLanes(DF32())] = {};
    std::copy(in + i, in + count, buf);
    hn::Store(Exp2NonPositive(df, hn::Load(df, buf)), df, buf);
    std::copy(buf, buf + (count - i), out + i);
  }
}

// The bf16 matmul backward's row (kernels/narrow_matmul.cpp) in one pass:
// p = exp(min(x[j] − lse, 0)) and dx = p·(dp[j] − delta), each rounded to
// bf16 (nearest even) into p16[j] and dx16[j]; the float32 values are never
// stored. The same operations as the passes it replaces (the clamp, ExpRowF32
// with row_max 0, the product, RoundRow), so the same bits: min(v, 0) as
// std::min(v, 0.0f) (a NaN stays NaN), and the tail's rounding the scalar
// rule RoundRow's tail uses.
void BackwardRowBf16(const float* HWY_RESTRICT x, const float* HWY_RESTRICT dp, size_t count, float lse,
                     float delta, bfloat16* HWY_RESTRICT p16, bfloat16* HWY_RESTRICT dx16) {
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  const VF32 log2e = hn::Set(df, 1.4426950408889634f);
  const VF32 l = hn::Set(df, lse), dl = hn::Set(df, delta), zero = hn::Zero(df);
  const auto row = [&](VF32 xv, VF32 dpv, VF32& p, VF32& dx) {
    const VF32 v = hn::Sub(xv, l);
    p = Exp2NonPositive(df, hn::Mul(hn::IfThenElse(hn::Lt(zero, v), zero, v), log2e));
    dx = hn::Mul(p, hn::Sub(dpv, dl));
  };
  size_t j = 0;
  for (; j + lanes <= count; j += lanes) {
    VF32 p, dx;
    row(hn::LoadU(df, x + j), hn::LoadU(df, dp + j), p, dx);
    RoundStore(df, p, p16 + j);
    RoundStore(df, dx, dx16 + j);
  }
  if (j < count) {  // the last count % lanes through padded buffers
    const size_t rest = count - j;
    HWY_ALIGN float bx[hn::MaxLanes(DF32())] = {};
    HWY_ALIGN float bdp[hn::MaxLanes(DF32())] = {};
    std::copy(x + j, x + count, bx);
    std::copy(dp + j, dp + count, bdp);
    VF32 p, dx;
    row(hn::Load(df, bx), hn::Load(df, bdp), p, dx);
    hn::Store(p, df, bx);
    hn::Store(dx, df, bdp);
    for (size_t k = 0; k < rest; ++k) {
      p16[j + k] = to_bfloat16(bx[k]);
      dx16[j + k] = to_bfloat16(bdp[k]);
    }
  }
}

int64_t SoftmaxRowTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace multihead::detail {

HWY_EXPORT(ExpRowF32);
HWY_EXPORT(RowMaxF32);
HWY_EXPORT(Exp2NonPositiveArrayF32);
HWY_EXPORT(ExpRowBf16);
HWY_EXPORT(BackwardRowBf16);
HWY_EXPORT(SoftmaxRowTarget);

namespace {
std::size_t index_of(int64_t target_bit) {
  return dispatch_table_index(HWY_DISPATCH_TABLE(SoftmaxRowTarget), target_bit, "softmax row");
}
}  // namespace

ExpRowF32Fn softmax_exp_row_for(int64_t target_bit) { return HWY_DISPATCH_TABLE(ExpRowF32)[index_of(target_bit)]; }

RowMaxF32Fn softmax_row_max_for(int64_t target_bit) { return HWY_DISPATCH_TABLE(RowMaxF32)[index_of(target_bit)]; }

ExpRowBf16Fn softmax_exp_row_bf16_for(int64_t target_bit) {
  return HWY_DISPATCH_TABLE(ExpRowBf16)[index_of(target_bit)];
}

BackwardRowBf16Fn backward_row_bf16_for(int64_t target_bit) {
  return HWY_DISPATCH_TABLE(BackwardRowBf16)[index_of(target_bit)];
}

void exp2_nonpositive_for_test(int64_t target_bit, const float* in, float* out, std::size_t count) {
  HWY_DISPATCH_TABLE(Exp2NonPositiveArrayF32)[index_of(target_bit)](in, out, count);
}

}  // namespace multihead::detail
#endif  // HWY_ONCE
