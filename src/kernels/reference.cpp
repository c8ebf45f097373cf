// src/kernels/reference.cpp: scaled dot-product attention as plain loops.
//
// This is the oracle every other kernel is tested against. It is written to
// be read next to the formula, templated so tests run it in double, and never
// optimised. It calls no BLAS and no SIMD code. Legend: N slices, L queries,
// S keys, D head width, Dv value width.
//
//   scores = Q Kᵀ · scale, shaped by score_rule.hpp   (L, S) per slice
//   P      = softmax(scores, dim=-1)      numerically stable: subtract row max
//   out    = dropout(P) V                 (L, Dv)
//   lse    = log Σ_j exp(scores)          (L), when asked for
//
// and its backward pass (attention_backward_reference, below), the formulas
// of the backward contract in src/contract/attention_args.hpp as loops.
#include <cmath>
#include <limits>
#include <vector>

#include "contract/score_rule.hpp"
#include "kernels/kernel.hpp"

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
  const T* d_out = nullptr;  // the backward's dℓ/dout, in out's layout
};

// Query row i of the slice: out (Dv), if a.weights the weights (S), if a.lse
// the row's log-sum-exp.
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
    if (a.lse) a.lse[n * a.q_len + i] = neg_inf;
    return;
  }
  // softmax_j = exp(s_j - max) / Σ exp(s_k - max). A NaN score (NaN input)
  // is skipped by the max but propagates through the sum, as in PyTorch.
  T sum = 0;
  for (int64_t j = 0; j < S; ++j) {
    scores[j] = std::exp(scores[j] - row_max);
    sum += scores[j];
  }
  if (a.lse) a.lse[n * a.q_len + i] = row_max + std::log(sum);
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
  check_kv_heads(a);
  const int64_t L = a.q_len, S = a.kv_len, Hkv = a.kv_heads_or_heads();
  std::vector<T> scores(static_cast<std::size_t>(S));
  const SliceLayout ql = resolve_layout(a.q_layout, a.heads, L, a.head_dim);
  const SliceLayout kl = resolve_layout(a.k_layout, Hkv, S, a.head_dim);
  const SliceLayout vl = resolve_layout(a.v_layout, Hkv, S, a.value_dim);
  const SliceLayout ol = resolve_layout(a.out_layout, a.heads, L, a.value_dim);
  for (int64_t n = 0; n < a.slices; ++n) {
    const Slice<T> slice{n,
                         slice_start(a.q, ql, n, a.heads),
                         kv_slice_start(a.k, kl, n, a.heads, Hkv),
                         kv_slice_start(a.v, vl, n, a.heads, Hkv),
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

namespace {

// The gradients of slice n's row i, added into d_k and d_v (S rows each) and
// written to d_q's row i. `p` and `dp` are S-element scratch rows.
template <class T>
void reference_backward_row(const AttentionBackwardArgs<T>& b, const Slice<T>& sl, T* d_q, T* d_k, T* d_v,
                            int64_t i, T* p, T* dp) {
  const AttentionArgs<T>& a = b.forward;
  const int64_t n = sl.n, S = a.kv_len, D = a.head_dim, Dv = a.value_dim;
  const T* q_row = sl.q + i * sl.q_row;
  const T* g = sl.d_out + i * sl.out_row;  // dℓ/dout_i
  const T lse = b.lse[n * a.q_len + i];
  const bool masked_row = lse == -std::numeric_limits<T>::infinity();
  const bool dropout = a.dropout.p > 0.0;
  const T keep_scale = dropout ? T(1) / static_cast<T>(1.0 - a.dropout.p) : T(1);
  // p_ij = exp(s_ij − lse_i), the forward's softmax recomputed; a fully
  // masked row gets the forward's fill (0, or NaN that then spreads).
  // dp_ij = dℓ/dp_ij through dropout: keep_ij/(1 − p) · <dout_i, v_j>.
  // delta_i = Σ_j p_ij dp_ij (= <dout_i, out_i>, the contract's form).
  T delta = 0;
  for (int64_t j = 0; j < S; ++j) {
    const T x = dot(q_row, sl.k + j * sl.k_row, D) * a.scale;
    p[j] = masked_row ? masked_row_fill<T>(a.masked_rows) : std::exp(modified_score(sl.mods, S, i, j, x) - lse);
    T g_v = dot(g, sl.v + j * sl.v_row, Dv);
    if (dropout) g_v = dropout_keep(a.dropout, n, i, j) ? g_v * keep_scale : T(0);
    dp[j] = g_v;
    delta += p[j] * dp[j];
  }
  for (int64_t d = 0; d < D; ++d) d_q[d] = 0;
  for (int64_t j = 0; j < S; ++j) {
    const T* k_row = sl.k + j * sl.k_row;
    const T x = dot(q_row, k_row, D) * a.scale;
    // d_v_j += p'_ij dout_i, p' = dropout(p)
    const T p_dropped = dropout ? dropout_weight(a.dropout, n, i, j, p[j], keep_scale) : p[j];
    for (int64_t d = 0; d < Dv; ++d) d_v[j * sl.v_row + d] += p_dropped * g[d];
    // ds_ij = p_ij (dp_ij − delta_i), through the cap: dx_ij
    const T dx = p[j] * (dp[j] - delta) * soft_cap_slope(sl.mods.softcap, x);
    // d_q_i += scale dx_ij k_j;  d_k_j += scale dx_ij q_i
    for (int64_t d = 0; d < D; ++d) {
      d_q[d] += a.scale * dx * k_row[d];
      d_k[j * sl.k_row + d] += a.scale * dx * q_row[d];
    }
  }
}

}  // namespace

template <class T>
void attention_backward_reference(const AttentionBackwardArgs<T>& b) {
  const AttentionArgs<T>& a = b.forward;
  check_kv_heads(a);
  const int64_t L = a.q_len, S = a.kv_len, D = a.head_dim, Dv = a.value_dim, Hkv = a.kv_heads_or_heads();
  std::vector<T> p(static_cast<std::size_t>(S)), dp(static_cast<std::size_t>(S));
  const SliceLayout ql = resolve_layout(a.q_layout, a.heads, L, D);
  const SliceLayout kl = resolve_layout(a.k_layout, Hkv, S, D);
  const SliceLayout vl = resolve_layout(a.v_layout, Hkv, S, Dv);
  const SliceLayout ol = resolve_layout(a.out_layout, a.heads, L, Dv);
  // d_k and d_v are written, not accumulated, for the caller: zero each K/V
  // slice once, then every query slice of its group adds into it
  // (d_k_j = Σ over the group's slices, the contract's grouped sum).
  const int64_t kv_slices = kv_slice_count(a.slices, a.heads, Hkv);
  for (int64_t g = 0; g < kv_slices; ++g) {
    T* d_k = slice_start(b.d_k, kl, g, Hkv);
    T* d_v = slice_start(b.d_v, vl, g, Hkv);
    for (int64_t j = 0; j < S; ++j) {
      for (int64_t d = 0; d < D; ++d) d_k[j * kl.row + d] = 0;
      for (int64_t d = 0; d < Dv; ++d) d_v[j * vl.row + d] = 0;
    }
  }
  for (int64_t n = 0; n < a.slices; ++n) {
    Slice<T> slice{n,
                   slice_start(a.q, ql, n, a.heads),
                   kv_slice_start(a.k, kl, n, a.heads, Hkv),
                   kv_slice_start(a.v, vl, n, a.heads, Hkv),
                   nullptr,
                   ql.row,
                   kl.row,
                   vl.row,
                   ol.row,
                   slice_modifiers(a.modifiers, n, a.heads, L, S)};
    slice.d_out = slice_start(b.d_out, ol, n, a.heads);
    T* d_q = slice_start(b.d_q, ql, n, a.heads);
    T* d_k = kv_slice_start(b.d_k, kl, n, a.heads, Hkv);
    T* d_v = kv_slice_start(b.d_v, vl, n, a.heads, Hkv);
    for (int64_t i = 0; i < L; ++i)
      reference_backward_row(b, slice, d_q + i * ql.row, d_k, d_v, i, p.data(), dp.data());
  }
}

template void attention_backward_reference<float>(const AttentionBackwardArgs<float>&);
template void attention_backward_reference<double>(const AttentionBackwardArgs<double>&);

}  // namespace multihead::detail
