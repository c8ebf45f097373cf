// src/attention/reference.cpp: scaled dot-product attention as plain loops.
//
// This is the oracle every other kernel is tested against. It is written to
// be read next to the formula, templated so tests run it in double, and never
// optimised. Legend: N slices, L queries, S keys, D head width, Dv value width.
//
//   scores = Q Kᵀ · scale + mask          (L, S) per slice
//   P      = softmax(scores, dim=-1)      numerically stable: subtract row max
//   out    = dropout(P) V                 (L, Dv)
#include <cmath>
#include <limits>
#include <vector>

#include "attention/kernel.hpp"

namespace multihead::detail {

template <class T>
void attention_forward_reference(const AttentionArgs<T>& a) {
  const int64_t L = a.q_len, S = a.kv_len, D = a.head_dim, Dv = a.value_dim;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> scores(static_cast<std::size_t>(S));
  const SliceLayout ql = resolve_layout(a.q_layout, a.heads, L, D);
  const SliceLayout kl = resolve_layout(a.k_layout, a.heads, S, D);
  const SliceLayout vl = resolve_layout(a.v_layout, a.heads, S, Dv);
  const SliceLayout ol = resolve_layout(a.out_layout, a.heads, L, Dv);
  for (int64_t n = 0; n < a.slices; ++n) {
    const T* q = slice_start(a.q, ql, n, a.heads);
    const T* k = slice_start(a.k, kl, n, a.heads);
    const T* v = slice_start(a.v, vl, n, a.heads);
    const T* mask = a.attn_mask ? a.attn_mask + n * a.attn_mask_slice_stride : nullptr;
    const T* pad = a.key_padding ? a.key_padding + (n / a.heads) * S : nullptr;
    for (int64_t i = 0; i < L; ++i) {
      // scores_ij = scale · <q_i, k_j> + masks
      T row_max = neg_inf;
      bool all_masked = true;
      for (int64_t j = 0; j < S; ++j) {
        T dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += q[i * ql.row + d] * k[j * kl.row + d];
        T s = dot * a.scale;
        if (mask) s += mask[i * S + j];
        if (pad) s += pad[j];
        if (a.is_causal && j < a.causal_cols && j > i) s = neg_inf;
        scores[j] = s;
        if (s > row_max) row_max = s;
        if (!(s == neg_inf)) all_masked = false;  // NaN counts as not masked
      }
      T* out = slice_start(a.out, ol, n, a.heads) + i * ol.row;
      T* w = a.weights ? a.weights + (n * L + i) * S : nullptr;
      if (all_masked) {
        // Every key is masked: softmax is 0/0. The policy decides.
        const T fill = a.masked_rows == MaskedRowPolicy::NaN ? std::numeric_limits<T>::quiet_NaN() : T(0);
        for (int64_t d = 0; d < Dv; ++d) out[d] = fill;
        if (w)
          for (int64_t j = 0; j < S; ++j) w[j] = fill;
        continue;
      }
      // softmax_j = exp(s_j - max) / Σ exp(s_k - max). A NaN score (NaN input)
      // is skipped by the max but propagates through the sum, as in PyTorch.
      T sum = 0;
      for (int64_t j = 0; j < S; ++j) {
        scores[j] = std::exp(scores[j] - row_max);
        sum += scores[j];
      }
      for (int64_t j = 0; j < S; ++j) {
        T p = scores[j] / sum;
        if (a.dropout_p > 0.0) {
          p = dropout_keep(a.dropout_seed, n + a.dropout_slice_offset, i, j, a.dropout_p)
                  ? p / static_cast<T>(1.0 - a.dropout_p)
                  : T(0);
        }
        scores[j] = p;
        if (w) w[j] = p;
      }
      // out_i = Σ_j p_ij v_j
      for (int64_t d = 0; d < Dv; ++d) out[d] = 0;
      for (int64_t j = 0; j < S; ++j)
        for (int64_t d = 0; d < Dv; ++d) out[d] += scores[j] * v[j * vl.row + d];
    }
  }
}

template void attention_forward_reference<float>(const AttentionArgs<float>&);
template void attention_forward_reference<double>(const AttentionArgs<double>&);

}  // namespace multihead::detail
