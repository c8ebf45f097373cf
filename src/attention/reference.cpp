// src/attention/reference.cpp: scaled dot-product attention as plain loops.
//
// This is the oracle every other kernel is tested against. It is written to
// be read next to the formula, templated so tests run it in double, and never
// optimised. It calls no BLAS and no SIMD code. Legend: N slices, L queries,
// S keys, D head width, Dv value width.
//
//   scores = Q Kᵀ · scale, shaped by score_rule.hpp   (L, S) per slice
//   P      = softmax(scores, dim=-1)      numerically stable: subtract row max
//   out    = dropout(P) V                 (L, Dv)
#include <cmath>
#include <limits>
#include <vector>

#include "attention/kernel.hpp"
#include "kernel/score_rule.hpp"

namespace multihead::detail {
namespace {

template <class T>
T dot(const T* x, const T* y, int64_t width) {
  T acc = 0;
  for (int64_t d = 0; d < width; ++d) acc += x[d] * y[d];
  return acc;
}

// Slice n of every tensor: rows of q, k, v and out are *_row apart.
template <class T>
struct Slice {
  int64_t n;
  const T *q, *k, *v;
  T* out;
  int64_t q_row, k_row, v_row, out_row;
  SliceModifiers<T> mods;
};

// Query row i of the slice: out (Dv) and, if a.weights, the weights (S).
template <class T>
void reference_row(const AttentionArgs<T>& a, const Slice<T>& sl, int64_t i, T* scores) {
  const int64_t n = sl.n, S = a.kv_len, Dv = a.value_dim;
  const T* q_row = sl.q + i * sl.q_row;
  T* out = sl.out + i * sl.out_row;
  T* w = a.weights ? a.weights + (n * a.q_len + i) * S : nullptr;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  T row_max = neg_inf;
  bool all_masked = true;
  for (int64_t j = 0; j < S; ++j) {
    const T s = modified_score(sl.mods, S, i, j, dot(q_row, sl.k + j * sl.k_row, a.head_dim) * a.scale);
    scores[j] = s;
    if (s > row_max) row_max = s;
    if (!(s == neg_inf)) all_masked = false;  // NaN counts as not masked
  }
  if (all_masked) {
    const T fill = masked_row_fill<T>(a.masked_rows);
    for (int64_t d = 0; d < Dv; ++d) out[d] = fill;
    if (w)
      for (int64_t j = 0; j < S; ++j) w[j] = fill;
    return;
  }
  // softmax_j = exp(s_j - max) / Σ exp(s_k - max). A NaN score (NaN input)
  // is skipped by the max but propagates through the sum, as in PyTorch.
  T sum = 0;
  for (int64_t j = 0; j < S; ++j) {
    scores[j] = std::exp(scores[j] - row_max);
    sum += scores[j];
  }
  const T keep_scale = a.dropout.p > 0.0 ? T(1) / static_cast<T>(1.0 - a.dropout.p) : T(1);
  for (int64_t j = 0; j < S; ++j) {
    T p = scores[j] / sum;
    if (a.dropout.p > 0.0) p = dropout_weight(a.dropout, n, i, j, p, keep_scale);
    scores[j] = p;
    if (w) w[j] = p;
  }
  // out_i = Σ_j p_ij v_j
  for (int64_t d = 0; d < Dv; ++d) out[d] = 0;
  for (int64_t j = 0; j < S; ++j)
    for (int64_t d = 0; d < Dv; ++d) out[d] += scores[j] * sl.v[j * sl.v_row + d];
}

}  // namespace

template <class T>
void attention_forward_reference(const AttentionArgs<T>& a) {
  const int64_t L = a.q_len, S = a.kv_len;
  std::vector<T> scores(static_cast<std::size_t>(S));
  const SliceLayout ql = resolve_layout(a.q_layout, a.heads, L, a.head_dim);
  const SliceLayout kl = resolve_layout(a.k_layout, a.heads, S, a.head_dim);
  const SliceLayout vl = resolve_layout(a.v_layout, a.heads, S, a.value_dim);
  const SliceLayout ol = resolve_layout(a.out_layout, a.heads, L, a.value_dim);
  for (int64_t n = 0; n < a.slices; ++n) {
    const Slice<T> slice{n,
                         slice_start(a.q, ql, n, a.heads),
                         slice_start(a.k, kl, n, a.heads),
                         slice_start(a.v, vl, n, a.heads),
                         slice_start(a.out, ol, n, a.heads),
                         ql.row,
                         kl.row,
                         vl.row,
                         ol.row,
                         slice_modifiers(a.modifiers, n, a.heads, L, S)};
    for (int64_t i = 0; i < L; ++i) reference_row(a, slice, i, scores.data());
  }
}

template void attention_forward_reference<float>(const AttentionArgs<float>&);
template void attention_forward_reference<double>(const AttentionArgs<double>&);

}  // namespace multihead::detail
