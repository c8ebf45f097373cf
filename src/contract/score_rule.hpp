// src/contract/score_rule.hpp: the single scalar definition of every rule that
// shapes attention scores and weights. The reference and materialized
// kernels call these functions element by element; the flash kernel carries
// their vector twins (src/simd/flash_attention-inl.h, ApplyScoreModifiers and
// the fill in QueryTile), tested against these on every SIMD target by
// tests/test_score_rule.cpp.
//
// Legend (attention_args.hpp): N slices, L queries, S keys; n slice, i query
// row, j key column.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "contract/attention_args.hpp"

namespace multihead::detail {

// The diagonal offset of the causal rule: query i may see key j < cols iff
// j <= i + causal_shift (attention_args.hpp, CausalRule, says why).
inline int64_t causal_shift(const CausalRule& c, int64_t q_len) {
  return c.query_offset + (c.alignment == CausalAlignment::BottomRight ? c.cols - q_len : 0);
}

// Rule: causal. May query i see key j?
inline bool causal_visible(const CausalRule& c, int64_t shift, int64_t i, int64_t j) {
  return !c.enabled || j >= c.cols || j <= i + shift;
}

// Rule: sliding window. May query i (position i + shift) see key j? Keys
// j >= cols have no position and stay visible (ScoreModifiers says more).
inline bool window_visible(const CausalRule& c, int64_t window, int64_t shift, int64_t i, int64_t j) {
  if (window <= 0 || j >= c.cols) return true;
  const int64_t p = i + shift;
  return j > p - window && (c.enabled || j < p + window);
}

// Rule: the keys that the causal rule and the window leave visible to at
// least one of the queries [row_begin, row_end) (row_begin < row_end), in
// closed form: [begin, end) ∪ [rest, S), begin <= end <= rest <= S. Key j is
// in it iff causal_visible and window_visible hold for some such i (exact:
// tests/test_score_rule.cpp checks it against both predicates). The
// positional keys j < cols that a query at p = i + shift sees are (p − w, p]
// with causal and window, [0, p] with causal only, (p − w, p + w) with the
// window only; over consecutive queries they join into one interval. Keys
// from cols on have no position and are always seen (rest = clamp(cols, 0,
// S)). Without causal and window every key is seen: {0, S, S}, one range, so
// that a tiled kernel cuts it as it always has. The flash kernels skip the
// key tiles outside it (VisitKeyTiles); grouped decoding reads only its keys.
struct VisibleKeys {
  int64_t begin, end, rest;
};
inline VisibleKeys visible_key_range(const CausalRule& c, int64_t window, int64_t shift, int64_t kv_len,
                                     int64_t row_begin, int64_t row_end) {
  if (!c.enabled && window <= 0) return {0, kv_len, kv_len};
  const int64_t rest = std::clamp<int64_t>(c.cols, 0, kv_len);
  const int64_t first = row_begin + shift, last = row_end - 1 + shift;  // the queries' positions
  const int64_t begin = window > 0 ? std::clamp<int64_t>(first - window + 1, 0, rest) : 0;  // j > p − w
  const int64_t end = std::clamp<int64_t>(c.enabled ? last + 1 : last + window, begin, rest);  // j <= p, j < p + w
  return {begin, end, rest};
}

// Rule: logit soft-capping (Gemma 2), cap·tanh(s / cap); cap 0 = off.
template <class T>
T soft_cap(T cap, T s) {
  return cap > T(0) ? cap * std::tanh(s / cap) : s;
}

// The derivative of soft_cap with respect to s: 1 − tanh²(s / cap), or 1
// when the cap is off (the backward contract, attention_args.hpp).
template <class T>
T soft_cap_slope(T cap, T s) {
  if (!(cap > T(0))) return T(1);
  const T t = std::tanh(s / cap);
  return T(1) - t * t;
}

// Rule: ALiBi's bias (Press et al. 2022), −slope·|p_i − j| for key j < cols,
// 0 for the keys without a position.
template <class T>
T alibi_bias(const CausalRule& c, T slope, int64_t shift, int64_t i, int64_t j) {
  if (j >= c.cols) return T(0);
  const int64_t distance = i + shift - j;
  return -slope * static_cast<T>(distance < 0 ? -distance : distance);
}

// A slice's view of the modifiers, hoisted out of the loops over i and j.
template <class T>
struct SliceModifiers {
  const T* attn_mask;    // [L][S] of slice n, or nullptr
  const T* key_padding;  // [S] of batch entry n / heads, or nullptr
  CausalRule causal;
  int64_t shift;         // causal_shift(causal, L): query i is at position i + shift
  int64_t window;        // 0 = none
  T softcap;             // 0 = none
  bool alibi;
  T alibi_slope;         // of slice n
};

template <class T>
SliceModifiers<T> slice_modifiers(const ScoreModifiers<T>& m, int64_t n, int64_t heads, int64_t q_len,
                                  int64_t kv_len) {
  return {m.attn_mask ? m.attn_mask + n * m.attn_mask_slice_stride : nullptr,
          m.key_padding ? m.key_padding + (n / heads) * kv_len : nullptr,
          m.causal,
          causal_shift(m.causal, q_len),
          m.window,
          m.softcap,
          m.alibi_slopes != nullptr,
          m.alibi_slopes ? m.alibi_slopes[n] : T(0)};
}

// Rule: the score of (i, j) from its scaled dot product, in the order of
// ScoreModifiers (attention_args.hpp):
//   s_ij = soft_cap(scale·<q_i, k_j>) + alibi_bias + attn_mask[i, j] + key_padding[j],
// or -inf where the causal rule or the window hides key j from query i.
template <class T>
T modified_score(const SliceModifiers<T>& m, int64_t kv_len, int64_t i, int64_t j, T scaled_dot) {
  if (!causal_visible(m.causal, m.shift, i, j) || !window_visible(m.causal, m.window, m.shift, i, j))
    return -std::numeric_limits<T>::infinity();
  T s = soft_cap(m.softcap, scaled_dot);
  if (m.alibi) s += alibi_bias(m.causal, m.alibi_slope, m.shift, i, j);
  if (m.attn_mask) s += m.attn_mask[i * kv_len + j];
  if (m.key_padding) s += m.key_padding[j];
  return s;
}

// Rule: a row whose scores are all -inf (softmax would be 0/0) gets this
// value for every weight and every output feature. NaN scores do not count
// as masked: they propagate, as in PyTorch.
template <class T>
T masked_row_fill(MaskedRowPolicy policy) {
  return policy == MaskedRowPolicy::NaN ? std::numeric_limits<T>::quiet_NaN() : T(0);
}

// Rule: dropout's keep/drop decision for element (n, i, j). A counter-based
// hash (SplitMix64 finaliser) of (seed, n, i, j), so that the decision does
// not depend on kernel, form, tile order or thread count.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline bool dropout_keep(const DropoutRule& d, int64_t n, int64_t i, int64_t j) {
  const uint64_t h = mix64(d.seed ^ mix64(static_cast<uint64_t>(n + d.slice_offset) ^
                                          mix64(static_cast<uint64_t>(i) ^ mix64(static_cast<uint64_t>(j)))));
  // 53 random bits -> uniform double in [0, 1).
  const double u = static_cast<double>(h >> 11) * 0x1.0p-53;
  return u >= d.p;
}

// Rule: dropout applied to the softmax weight p of (n, i, j), PyTorch's
// p·keep/(1 − p). keep_scale = 1/(1 − p) (the caller may fold 1/Σ into it).
template <class T>
T dropout_weight(const DropoutRule& d, int64_t n, int64_t i, int64_t j, T p, T keep_scale) {
  return dropout_keep(d, n, i, j) ? p * keep_scale : T(0);
}

}  // namespace multihead::detail
