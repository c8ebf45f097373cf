// src/attention/narrow_convert.hpp: whole buffers between 16-bit storage
// and float32, for the 16-bit modules' steps that run on float32 operands
// (the backward's float32 kernel, RoPE, the decode kernel): widening is
// exact, rounding is multihead/narrow.hpp's one rule, once per element
// (core/narrow_rows.hpp: its vector form, blocks of elements split across
// threads; the bits do not depend on the thread count).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/narrow_rows.hpp"
#include "multihead/error.hpp"
#include "multihead/narrow.hpp"
#include "multihead/narrow_multihead_attention.hpp"  // round_to
#include "multihead/tensor.hpp"

namespace multihead::detail {

// float32 copy of n 16-bit values (exact).
template <class E>
Storage<float> widened(const E* src, std::size_t n, int threads) {
  Storage<float> out(n);
  const auto count = static_cast<int64_t>(n);
  widen_rows(src, 1, count, count, out.data(), count, threads);
  return out;
}

// n float32 values rounded once each to E, into dst.
template <class E>
void round_into(const float* src, std::size_t n, E* dst, int threads) {
  const auto count = static_cast<int64_t>(n);
  round_rows(src, 1, count, count, static_cast<const E*>(nullptr), dst, count, threads);
}

// A float32 module's parameter `name` rounded to E for a 16-bit module
// (NarrowMultiheadAttention::rounded, NarrowGroupedQueryAttention::rounded,
// load_weights_narrow): round_to(t, name)'s rule (a finite value float16
// cannot hold is refused, naming it), the message ended by `where` (e.g.
// " (in FILE)").
template <class E>
Tensor<E> rounded_parameter(const std::string& name, const Tensor<float>& t, const std::string& where = "") {
  try {
    return round_to<E>(t, name);
  } catch (const Error& e) {
    throw Error(e.kind(), e.what() + where);
  }
}

}  // namespace multihead::detail
