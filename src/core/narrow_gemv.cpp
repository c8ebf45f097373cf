// src/core/narrow_gemv.cpp: see narrow_gemv.hpp. Compiled once per Highway
// target; the widening is narrow_lanes-inl.h's LoadWiden, the one vector
// form of multihead/narrow.hpp's rule (exact; on SSE4 and SCALAR the f16
// infinities and NaNs through its own lane rule, not Highway 1.0.3's
// emulated PromoteTo, which widens them to 65536 and above).
#include "core/narrow_gemv.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/narrow_rows.hpp"
#include "core/parallel.hpp"
#include "core/thread_scratch.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/narrow_gemv.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "core/narrow_lanes-inl.h"

HWY_BEFORE_NAMESPACE();
namespace multihead::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Σ_i x[i] · widen(w[i]) over n terms: four independent accumulators (a
// chain of dependent FMAs would wait on each one's latency, 4 cycles on
// Zen and Skylake, against 2 loads per cycle), then one vector, then the
// scalar tail (fewer than Lanes terms).
template <class E>
HWY_INLINE float Dot(const float* HWY_RESTRICT x, const E* HWY_RESTRICT w, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    a0 = hn::MulAdd(hn::LoadU(df, x + i), LoadWiden(df, w + i), a0);
    a1 = hn::MulAdd(hn::LoadU(df, x + i + N), LoadWiden(df, w + i + N), a1);
    a2 = hn::MulAdd(hn::LoadU(df, x + i + 2 * N), LoadWiden(df, w + i + 2 * N), a2);
    a3 = hn::MulAdd(hn::LoadU(df, x + i + 3 * N), LoadWiden(df, w + i + 3 * N), a3);
  }
  for (; i + N <= n; i += N) a0 = hn::MulAdd(hn::LoadU(df, x + i), LoadWiden(df, w + i), a0);
  float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; i < n; ++i) sum += x[i] * to_float(w[i]);
  return sum;
}

// Output columns [o0, o1) of every row: acc[r][o] = x_r · W_o. W_o (in
// 16-bit values, 8 KiB at in = 4096) is read from memory by the first row
// and from L1 by the others.
template <class E>
void GemvColumns(const float* HWY_RESTRICT x, size_t rows, size_t in, const E* HWY_RESTRICT w, size_t ldw,
                 size_t o0, size_t o1, float* HWY_RESTRICT acc, size_t ld_acc) {
  for (size_t o = o0; o < o1; ++o)
    for (size_t r = 0; r < rows; ++r) acc[r * ld_acc + o] = Dot(x + r * in, w + o * ldw, in);
}

void GemvColumnsBf16(const float* x, size_t rows, size_t in, const bfloat16* w, size_t ldw, size_t o0, size_t o1,
                     float* acc, size_t ld_acc) {
  GemvColumns(x, rows, in, w, ldw, o0, o1, acc, ld_acc);
}
void GemvColumnsF16(const float* x, size_t rows, size_t in, const float16* w, size_t ldw, size_t o0, size_t o1,
                    float* acc, size_t ld_acc) {
  GemvColumns(x, rows, in, w, ldw, o0, o1, acc, ld_acc);
}

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace multihead::detail {

HWY_EXPORT(GemvColumnsBf16);
HWY_EXPORT(GemvColumnsF16);

namespace {

// Output columns per work item: a function of the shape alone, so which
// thread computes a column never changes its instructions.
constexpr int64_t kColumnBlock = 16;

template <class E, class Columns>
void gemv(int64_t rows, int64_t out, int64_t in, const E* x, int64_t ldx, const E* w, int64_t ldw, float* acc,
          int64_t ld_acc, int threads, Columns columns) {
  if (rows <= 0 || out <= 0) return;
  // x widened once (exact; rows × in floats, 128 KiB at 8 × 4096), not once
  // per output column.
  thread_local ThreadScratch scratch;
  float* xf = scratch.take(static_cast<std::size_t>(std::max<int64_t>(rows * in, 1)));
  widen_rows(x, rows, in, ldx, xf, in, 1);
  const int64_t blocks = (out + kColumnBlock - 1) / kColumnBlock;
  parallel_items(blocks, requested_threads(threads), /*item_cost=*/rows * in * kColumnBlock, [&](int64_t blk) {
    const int64_t o0 = blk * kColumnBlock, o1 = std::min(out, o0 + kColumnBlock);
    columns(xf, static_cast<size_t>(rows), static_cast<size_t>(in), w, static_cast<size_t>(ldw),
            static_cast<size_t>(o0), static_cast<size_t>(o1), acc, static_cast<size_t>(ld_acc));
  });
}

}  // namespace

void narrow_gemv(int64_t rows, int64_t out, int64_t in, const bfloat16* x, int64_t ldx, const bfloat16* w,
                 int64_t ldw, float* acc, int64_t ld_acc, int threads) {
  gemv(rows, out, in, x, ldx, w, ldw, acc, ld_acc, threads, HWY_DYNAMIC_DISPATCH(GemvColumnsBf16));
}
void narrow_gemv(int64_t rows, int64_t out, int64_t in, const float16* x, int64_t ldx, const float16* w,
                 int64_t ldw, float* acc, int64_t ld_acc, int threads) {
  gemv(rows, out, in, x, ldx, w, ldw, acc, ld_acc, threads, HWY_DYNAMIC_DISPATCH(GemvColumnsF16));
}

}  // namespace multihead::detail
#endif  // HWY_ONCE
