// src/kernels/score_rows.hpp: one stored row of scaled scores through the
// score rule, softmax and dropout (the rules of src/contract/score_rule.hpp),
// in place. The rows of the kernels that store their scores: the
// materialized kernel (materialized.cpp, a slice's L×S) and the 16-bit
// matmul way (narrow_matmul.cpp, a block of rows at a time).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "contract/attention_args.hpp"
#include "contract/score_rule.hpp"
#include "simd/softmax_row.hpp"
#include "simd/targets.hpp"

namespace multihead::detail {

// The work of one score element of a softmax row, in multiply-adds for
// parallel_items' grain: the score rule, an exp (about 8) and the scaling.
inline constexpr int64_t kRowElementCost = 12;

// row[j] = exp(row[j] - row_max) in place; returns Σ_j row[j].
template <class T>
using ExpRow = T (*)(T* row, std::size_t count, T row_max);

template <class T>
T exp_row_scalar(T* row, std::size_t count, T row_max) {
  T sum = 0;
  for (std::size_t j = 0; j < count; ++j) {
    row[j] = std::exp(row[j] - row_max);
    sum += row[j];
  }
  return sum;
}

// float: the SIMD softmax row of the current target (src/simd/softmax_row.hpp;
// <= 2 ulp, -inf gives 0); double: std::exp.
template <class T>
ExpRow<T> exp_row_for_current_target() {
  if constexpr (std::is_same_v<T, float>) {
    return softmax_exp_row_for(simd_target_bit());
  } else {
    return exp_row_scalar<T>;
  }
}

// Whether the causal rule is the only score rule of a slice (no mask,
// padding, ALiBi, soft-cap or window): then a row's scores are its scaled
// dot products, or -inf past its causal end, and score_softmax_dropout_row
// takes them in whole-row passes (the same values: the maximum does not
// depend on the order it is taken in).
template <class T>
bool only_causal_rule(const SliceModifiers<T>& m) {
  return m.attn_mask == nullptr && m.key_padding == nullptr && !m.alibi && !(m.softcap > T(0)) && m.window <= 0;
}

// The score rule on keys [j0, j0 + count) of row i, in place (key j at
// row[j − j0]); returns their largest score: −inf when every one is hidden
// (a NaN score is not hidden, and may or may not be the one returned; a
// row holding one is NaN after the exp either way). Under the causal rule
// alone, whole-row passes: the hidden keys set to −inf, then a SIMD max.
// Under the causal rule alone (only_causal_rule): keys [j0, j0 + count) of
// row i with the causal rule applied in place, the hidden ones −inf.
template <class T>
void hide_causal_keys(const SliceModifiers<T>& mods, int64_t i, int64_t j0, T* row, int64_t count) {
  if (!mods.causal.enabled) return;
  // Keys [end, cols) are hidden (causal_visible), the rest are not.
  const int64_t cols = std::clamp<int64_t>(mods.causal.cols, j0, j0 + count);
  const int64_t end = std::clamp<int64_t>(i + mods.shift + 1, j0, cols);
  std::fill(row + (end - j0), row + (cols - j0), -std::numeric_limits<T>::infinity());
}

template <class T>
T shape_scores(const SliceModifiers<T>& mods, int64_t S, int64_t i, int64_t j0, T* row, int64_t count) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  if (only_causal_rule(mods)) {
    hide_causal_keys(mods, i, j0, row, count);
    if constexpr (std::is_same_v<T, float>) {
      return softmax_row_max_for(simd_target_bit())(row, static_cast<std::size_t>(count));
    } else {
      T m = neg_inf;
      for (int64_t j = 0; j < count; ++j) m = row[j] > m ? row[j] : m;
      return m;
    }
  }
  T m = neg_inf;
  for (int64_t j = 0; j < count; ++j) {
    const T s = modified_score(mods, S, i, j0 + j, row[j]);
    row[j] = s;
    m = s > m ? s : m;
  }
  return m;
}

// shape_scores without the maximum (the backward's rows, which have lse).
template <class T>
void apply_score_rule(const SliceModifiers<T>& mods, int64_t S, int64_t i, int64_t j0, T* row, int64_t count) {
  if (only_causal_rule(mods)) return hide_causal_keys(mods, i, j0, row, count);
  for (int64_t j = 0; j < count; ++j) row[j] = modified_score(mods, S, i, j0 + j, row[j]);
}

// Whether every one of `count` shaped scores is hidden (−inf): a row whose
// maximum is −inf may still hold a NaN, which is not hidden.
template <class T>
bool all_hidden(const T* row, int64_t count) {
  return std::all_of(row, row + count, [](T s) { return s == -std::numeric_limits<T>::infinity(); });
}

// The first two steps of score_softmax_dropout_row below, in place: the
// score rule, then the softmax's numerators exp(s_j − max); returns 1/Σ_j
// of them, by which the caller scales the row, or 0 for a fully masked row,
// which then holds masked_row_fill already. Stores lse (below).
template <class T>
T score_exp_row(const AttentionArgs<T>& a, const SliceModifiers<T>& mods, int64_t n, int64_t i, T* row,
                int64_t count, ExpRow<T> exp_row) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const T row_max = shape_scores(mods, a.kv_len, i, 0, row, count);
  const bool all_masked = row_max == neg_inf && all_hidden(row, count);
  if (all_masked) {
    const T fill = masked_row_fill<T>(a.masked_rows);
    for (int64_t j = 0; j < count; ++j) row[j] = fill;
    if (a.lse) a.lse[n * a.q_len + i] = neg_inf;
    return T(0);
  }
  const T sum = exp_row(row, static_cast<std::size_t>(count), row_max);
  if (a.lse) a.lse[n * a.q_len + i] = row_max + std::log(sum);
  return T(1) / sum;  // sum >= 1: the maximum's own term is exp(0)
}

// In place on the first `count` scaled scores of row i of slice n (mods =
// slice_modifiers of n): the score rule, then softmax, then dropout (all
// three from score_rule.hpp). The keys from `count` to S must be hidden
// from query i (their weights are 0 and are not stored): count = S, or a
// causal end the caller computed. When a.lse, stores the row's
// log-sum-exp lse[n][i] = max + log Σ_j exp(s_j − max) (−inf for a fully
// masked row), what the backward pass recomputes p from.
template <class T>
void score_softmax_dropout_row(const AttentionArgs<T>& a, const SliceModifiers<T>& mods, int64_t n, int64_t i,
                               T* row, int64_t count, ExpRow<T> exp_row) {
  const T inv_sum = score_exp_row(a, mods, n, i, row, count, exp_row);
  if (inv_sum == T(0)) return;  // fully masked: filled
  if (a.dropout.p > 0.0) {
    const T keep_scale = inv_sum / static_cast<T>(1.0 - a.dropout.p);
    for (int64_t j = 0; j < count; ++j) row[j] = dropout_weight(a.dropout, n, i, j, row[j], keep_scale);
  } else {
    for (int64_t j = 0; j < count; ++j) row[j] *= inv_sum;
  }
}

}  // namespace multihead::detail
