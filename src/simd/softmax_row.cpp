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
#include "simd/exp2-inl.h"

HWY_BEFORE_NAMESPACE();
namespace multihead::detail {
namespace HWY_NAMESPACE {

// Softmax numerators of one row in place: row[j] = exp(row[j] - row_max)
// through Exp2NonPositive (exp2-inl.h, shared with the flash kernel);
// returns Σ_j row[j]. row_max must be the row's maximum and
// finite, so every argument is <= 0 (masked entries, -inf, give exactly 0).
// The sum is kept in one vector of lane partial sums, then reduced.
float ExpRowF32(float* row, size_t count, float row_max) {
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
    hn::StoreU(p, df, row + j);
    sum = hn::Add(sum, p);
  }
  if (j < count) {  // the last count % lanes through a padded buffer
    const size_t rest = count - j;
    HWY_ALIGN float buf[hn::MaxLanes(DF32())] = {};
    std::copy(row + j, row + count, buf);
    const VF32 p = hn::IfThenElseZero(hn::FirstN(df, rest),
                                      Exp2NonPositive(df, hn::Mul(hn::Sub(hn::Load(df, buf), m), log2e)));
    hn::Store(p, df, buf);
    std::copy(buf, buf + rest, row + j);
    sum = hn::Add(sum, p);
  }
  return hn::GetLane(hn::SumOfLanes(df, sum));
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

int64_t SoftmaxRowTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace multihead::detail {

HWY_EXPORT(ExpRowF32);
HWY_EXPORT(RowMaxF32);
HWY_EXPORT(Exp2NonPositiveArrayF32);
HWY_EXPORT(SoftmaxRowTarget);

namespace {
std::size_t index_of(int64_t target_bit) {
  return dispatch_table_index(HWY_DISPATCH_TABLE(SoftmaxRowTarget), target_bit, "softmax row");
}
}  // namespace

ExpRowF32Fn softmax_exp_row_for(int64_t target_bit) { return HWY_DISPATCH_TABLE(ExpRowF32)[index_of(target_bit)]; }

RowMaxF32Fn softmax_row_max_for(int64_t target_bit) { return HWY_DISPATCH_TABLE(RowMaxF32)[index_of(target_bit)]; }

void exp2_nonpositive_for_test(int64_t target_bit, const float* in, float* out, std::size_t count) {
  HWY_DISPATCH_TABLE(Exp2NonPositiveArrayF32)[index_of(target_bit)](in, out, count);
}

}  // namespace multihead::detail
#endif  // HWY_ONCE
