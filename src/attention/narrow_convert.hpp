// src/attention/narrow_convert.hpp: whole buffers between 16-bit storage
// and float32, for the 16-bit modules' steps that run on float32 operands
// (the backward's float32 kernel, RoPE, the decode kernel): widening is
// exact, rounding is multihead/narrow.hpp's one rule, once per element.
// Blocks of elements split across threads; the bits do not depend on the
// thread count.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/parallel.hpp"
#include "multihead/narrow.hpp"
#include "multihead/tensor.hpp"

namespace multihead::detail {

inline constexpr int64_t kConvertBlock = 4096;  // elements per work item of the conversions below

// float32 copy of n 16-bit values (exact).
template <class E>
Storage<float> widened(const E* src, std::size_t n, int threads) {
  Storage<float> out(n);
  const int64_t count = static_cast<int64_t>(n);
  parallel_items((count + kConvertBlock - 1) / kConvertBlock, requested_threads(threads), kConvertBlock,
                 [&](int64_t blk) {
                   for (int64_t i = blk * kConvertBlock; i < std::min(count, (blk + 1) * kConvertBlock); ++i)
                     out[static_cast<std::size_t>(i)] = to_float(src[i]);
                 });
  return out;
}

// n float32 values rounded once each to E, into dst.
template <class E>
void round_into(const float* src, std::size_t n, E* dst, int threads) {
  const int64_t count = static_cast<int64_t>(n);
  parallel_items((count + kConvertBlock - 1) / kConvertBlock, requested_threads(threads), kConvertBlock,
                 [&](int64_t blk) {
                   for (int64_t i = blk * kConvertBlock; i < std::min(count, (blk + 1) * kConvertBlock); ++i)
                     dst[i] = narrow_from_float<E>(src[i]);
                 });
}

}  // namespace multihead::detail
