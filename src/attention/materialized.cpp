// src/attention/materialized.cpp: attention with the L×S scores stored, the
// two products through BLAS. This is the path PyTorch 1.13 takes
// (torch/nn/functional.py, multi_head_attention_forward: baddbmm, softmax,
// dropout, bmm), and ours whenever attention weights are requested.
//
// Legend: N slices, L queries, S keys, D head width, Dv value width.
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>

#include <omp.h>

#include "attention/kernel.hpp"
#include "core/gemm.hpp"
#include "kernel/score_rule.hpp"
#include "multihead/tensor.hpp"
#include "simd/softmax_row.hpp"
#include "simd/targets.hpp"

namespace multihead::detail {
namespace {

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

// In place on one row of scaled scores: the score rule, then softmax, then
// dropout (all three from score_rule.hpp).
template <class T>
void score_softmax_dropout_row(const AttentionArgs<T>& a, int64_t n, int64_t i, T* row, ExpRow<T> exp_row) {
  const int64_t S = a.kv_len;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const SliceModifiers<T> mods = slice_modifiers(a.modifiers, n, a.heads, a.q_len, S);
  T row_max = neg_inf;
  bool all_masked = true;
  for (int64_t j = 0; j < S; ++j) {
    const T s = modified_score(mods, S, i, j, row[j]);
    row[j] = s;
    row_max = s > row_max ? s : row_max;
    all_masked = all_masked && s == neg_inf;
  }
  if (all_masked) {
    const T fill = masked_row_fill<T>(a.masked_rows);
    for (int64_t j = 0; j < S; ++j) row[j] = fill;
    return;
  }
  const T inv_sum = T(1) / exp_row(row, static_cast<std::size_t>(S), row_max);
  if (a.dropout.p > 0.0) {
    const T keep_scale = inv_sum / static_cast<T>(1.0 - a.dropout.p);
    for (int64_t j = 0; j < S; ++j) row[j] = dropout_weight(a.dropout, n, i, j, row[j], keep_scale);
  } else {
    for (int64_t j = 0; j < S; ++j) row[j] *= inv_sum;
  }
}

}  // namespace

template <class T>
void attention_forward_materialized(const AttentionArgs<T>& a) {
  check_kv_heads(a);
  const int64_t L = a.q_len, S = a.kv_len, D = a.head_dim, Dv = a.value_dim, Hkv = a.kv_heads_or_heads();
  // One L×S buffer reused for every slice when weights are not kept.
  Storage<T> scratch(a.weights ? 0 : static_cast<std::size_t>(L * S));
  const ExpRow<T> exp_row = exp_row_for_current_target<T>();
  const SliceLayout ql = resolve_layout(a.q_layout, a.heads, L, D);
  const SliceLayout kl = resolve_layout(a.k_layout, Hkv, S, D);
  const SliceLayout vl = resolve_layout(a.v_layout, Hkv, S, Dv);
  const SliceLayout ol = resolve_layout(a.out_layout, a.heads, L, Dv);
  for (int64_t n = 0; n < a.slices; ++n) {
    T* scores = a.weights ? a.weights + n * L * S : scratch.data();
    // scores = scale · Q Kᵀ   (L×D)·(D×S); BLAS runs its own threads here.
    gemm(Trans::No, Trans::Yes, L, S, D, a.scale, slice_start(a.q, ql, n, a.heads), ql.row,
         kv_slice_start(a.k, kl, n, a.heads, Hkv), kl.row, T(0), scores, S);
    // Rows are independent: one thread writes each row.
#pragma omp parallel for schedule(static) num_threads(a.num_threads > 0 ? a.num_threads : omp_get_max_threads()) if (L * S > 16384)
    for (int64_t i = 0; i < L; ++i) score_softmax_dropout_row(a, n, i, scores + i * S, exp_row);
    // out = P V   (L×S)·(S×Dv)
    gemm(Trans::No, Trans::No, L, Dv, S, T(1), scores, S, kv_slice_start(a.v, vl, n, a.heads, Hkv), vl.row,
         T(0), slice_start(a.out, ol, n, a.heads), ol.row);
  }
}

template void attention_forward_materialized<float>(const AttentionArgs<float>&);
template void attention_forward_materialized<double>(const AttentionArgs<double>&);

}  // namespace multihead::detail
