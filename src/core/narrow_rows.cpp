// src/core/narrow_rows.cpp: whole rows through the lane forms of
// multihead/narrow.hpp's conversions (core/narrow_lanes-inl.h), compiled
// once per Highway target. A row's tail (fewer elements than a vector) goes
// through the scalar rules themselves.
#include "core/narrow_rows.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/parallel.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/narrow_rows.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "core/narrow_lanes-inl.h"

HWY_BEFORE_NAMESPACE();
namespace multihead::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class E>
void WidenRow(const E* HWY_RESTRICT src, size_t n, float* HWY_RESTRICT dst) {
  const hn::ScalableTag<float> df;
  const size_t lanes = hn::Lanes(df);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(LoadWiden(df, src + i), df, dst + i);
  for (; i < n; ++i) dst[i] = to_float(src[i]);
}

template <class E>
void RoundRow(const float* HWY_RESTRICT src, size_t n, const E* HWY_RESTRICT bias, E* HWY_RESTRICT dst) {
  const hn::ScalableTag<float> df;
  const size_t lanes = hn::Lanes(df);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    auto x = hn::LoadU(df, src + i);
    if (bias != nullptr) x = hn::Add(x, LoadWiden(df, bias + i));
    RoundStore(df, x, dst + i);
  }
  // Without a bias the value itself: src + 0.0f would turn −0 into +0,
  // which the vector lanes above keep.
  for (; i < n; ++i) dst[i] = narrow_from_float<E>(bias != nullptr ? src[i] + to_float(bias[i]) : src[i]);
}

// In place when src == dst: each vector is loaded before it is stored.
template <class E>
void RoundRowWidened(const float* src, size_t n, const E* HWY_RESTRICT bias, float* dst) {
  const hn::ScalableTag<float> df;
  const size_t lanes = hn::Lanes(df);
  alignas(64) E rounded[HWY_MAX_BYTES / sizeof(float)];
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    auto x = hn::LoadU(df, src + i);
    if (bias != nullptr) x = hn::Add(x, LoadWiden(df, bias + i));
    RoundStore(df, x, rounded);
    hn::StoreU(LoadWiden(df, rounded), df, dst + i);
  }
  for (; i < n; ++i) dst[i] = to_float(narrow_from_float<E>(bias != nullptr ? src[i] + to_float(bias[i]) : src[i]));
}

// split_rows' pieces of one row; returns whether every element is finite.
// hi is stored, then read back (widened, exact) for x - hi, which is exact
// in float32 and rounds to lo without loss (narrow_rows.hpp).
bool SplitRowF16(const float16* HWY_RESTRICT src, size_t n, bfloat16* HWY_RESTRICT hi, bfloat16* HWY_RESTRICT hi_again,
                 bfloat16* HWY_RESTRICT lo) {
  const hn::ScalableTag<float> df;
  const size_t lanes = hn::Lanes(df);
  const auto inf = hn::Set(df, std::numeric_limits<float>::infinity());
  auto finite = hn::Eq(hn::Zero(df), hn::Zero(df));
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto x = LoadWidenF16(df, src + i);
    finite = hn::And(finite, hn::Lt(hn::Abs(x), inf));
    RoundStore(df, x, hi + i);
    const auto h = LoadWidenBf16(df, hi + i);
    if (hi_again != nullptr) RoundStore(df, h, hi_again + i);  // exact: h is a bf16
    RoundStore(df, hn::Sub(x, h), lo + i);
  }
  bool all_finite = hn::AllTrue(df, finite);
  for (; i < n; ++i) {
    const float x = to_float(src[i]);
    all_finite = all_finite && std::isfinite(x);
    hi[i] = to_bfloat16(x);
    if (hi_again != nullptr) hi_again[i] = hi[i];
    lo[i] = to_bfloat16(x - to_float(hi[i]));
  }
  return all_finite;
}

void WidenRowBf16(const bfloat16* src, size_t n, float* dst) { WidenRow(src, n, dst); }
void WidenRowF16(const float16* src, size_t n, float* dst) { WidenRow(src, n, dst); }
void RoundRowBf16(const float* src, size_t n, const bfloat16* bias, bfloat16* dst) { RoundRow(src, n, bias, dst); }
void RoundRowF16(const float* src, size_t n, const float16* bias, float16* dst) { RoundRow(src, n, bias, dst); }
void RoundRowWidenedBf16(const float* src, size_t n, const bfloat16* bias, float* dst) {
  RoundRowWidened(src, n, bias, dst);
}
void RoundRowWidenedF16(const float* src, size_t n, const float16* bias, float* dst) {
  RoundRowWidened(src, n, bias, dst);
}

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace multihead::detail {

HWY_EXPORT(WidenRowBf16);
HWY_EXPORT(WidenRowF16);
HWY_EXPORT(RoundRowBf16);
HWY_EXPORT(RoundRowF16);
HWY_EXPORT(RoundRowWidenedBf16);
HWY_EXPORT(RoundRowWidenedF16);
HWY_EXPORT(SplitRowF16);

namespace {

constexpr int64_t kChunk = 4096;  // elements per work item

// fn(row, first column, count) over chunks of at most kChunk elements of
// each row, split across threads. threads == 1 runs them here, outside any
// OpenMP construct: a caller already inside a parallel loop's item (the
// 16-bit linear layer rounding a product's block, core/linear.cpp) would
// otherwise open a nested serialized region per call, whose team set-up
// cost ~10% of a (1, 128, 512, 8) bf16 forward (AMD Zen 5).
template <class Fn>
void for_row_chunks(int64_t rows, int64_t cols, int threads, const Fn& fn) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t per_row = (cols + kChunk - 1) / kChunk;
  if (threads == 1) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c0 = 0; c0 < cols; c0 += kChunk) fn(r, c0, std::min(kChunk, cols - c0));
    return;
  }
  parallel_items(rows * per_row, requested_threads(threads), /*item_cost=*/std::min(cols, kChunk), [&](int64_t item) {
    const int64_t r = item / per_row, c0 = item % per_row * kChunk;
    fn(r, c0, std::min(kChunk, cols - c0));
  });
}

}  // namespace

void widen_rows(const bfloat16* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst,
                int threads) {
  for_row_chunks(rows, cols, threads, [&](int64_t r, int64_t c0, int64_t n) {
    HWY_DYNAMIC_DISPATCH(WidenRowBf16)(src + r * ld_src + c0, static_cast<size_t>(n), dst + r * ld_dst + c0);
  });
}
void widen_rows(const float16* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst,
                int threads) {
  for_row_chunks(rows, cols, threads, [&](int64_t r, int64_t c0, int64_t n) {
    HWY_DYNAMIC_DISPATCH(WidenRowF16)(src + r * ld_src + c0, static_cast<size_t>(n), dst + r * ld_dst + c0);
  });
}
void round_rows(const float* src, int64_t rows, int64_t cols, int64_t ld_src, const bfloat16* bias, bfloat16* dst,
                int64_t ld_dst, int threads) {
  for_row_chunks(rows, cols, threads, [&](int64_t r, int64_t c0, int64_t n) {
    HWY_DYNAMIC_DISPATCH(RoundRowBf16)(src + r * ld_src + c0, static_cast<size_t>(n),
                                       bias != nullptr ? bias + c0 : nullptr, dst + r * ld_dst + c0);
  });
}
void round_rows(const float* src, int64_t rows, int64_t cols, int64_t ld_src, const float16* bias, float16* dst,
                int64_t ld_dst, int threads) {
  for_row_chunks(rows, cols, threads, [&](int64_t r, int64_t c0, int64_t n) {
    HWY_DYNAMIC_DISPATCH(RoundRowF16)(src + r * ld_src + c0, static_cast<size_t>(n),
                                      bias != nullptr ? bias + c0 : nullptr, dst + r * ld_dst + c0);
  });
}

void round_rows_widened(const float* src, int64_t rows, int64_t cols, int64_t ld_src, const bfloat16* bias,
                        float* dst, int64_t ld_dst, int threads) {
  for_row_chunks(rows, cols, threads, [&](int64_t r, int64_t c0, int64_t n) {
    HWY_DYNAMIC_DISPATCH(RoundRowWidenedBf16)(src + r * ld_src + c0, static_cast<size_t>(n),
                                              bias != nullptr ? bias + c0 : nullptr, dst + r * ld_dst + c0);
  });
}
void round_rows_widened(const float* src, int64_t rows, int64_t cols, int64_t ld_src, const float16* bias,
                        float* dst, int64_t ld_dst, int threads) {
  for_row_chunks(rows, cols, threads, [&](int64_t r, int64_t c0, int64_t n) {
    HWY_DYNAMIC_DISPATCH(RoundRowWidenedF16)(src + r * ld_src + c0, static_cast<size_t>(n),
                                             bias != nullptr ? bias + c0 : nullptr, dst + r * ld_dst + c0);
  });
}

bool split_rows(const float16* src, int64_t rows, int64_t cols, int64_t ld_src, bfloat16* hi, bfloat16* hi_again,
                bfloat16* lo, int64_t ld_dst, int threads) {
  std::atomic<bool> all_finite{true};
  for_row_chunks(rows, cols, threads, [&](int64_t r, int64_t c0, int64_t n) {
    const int64_t at = r * ld_dst + c0;
    if (!HWY_DYNAMIC_DISPATCH(SplitRowF16)(src + r * ld_src + c0, static_cast<size_t>(n), hi + at,
                                           hi_again != nullptr ? hi_again + at : nullptr, lo + at))
      all_finite.store(false, std::memory_order_relaxed);
  });
  return all_finite.load();
}

}  // namespace multihead::detail
#endif  // HWY_ONCE
