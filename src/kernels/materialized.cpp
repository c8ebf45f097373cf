// src/kernels/materialized.cpp: attention with the L×S scores stored, the
// two products through BLAS. This is the path PyTorch 1.13 takes
// (torch/nn/functional.py, multi_head_attention_forward: baddbmm, softmax,
// dropout, bmm), and ours whenever attention weights are requested. Its
// backward pass (attention_backward_materialized) follows the forward.
//
// Legend: N slices, L queries, S keys, D head width, Dv value width.
#include <algorithm>
#include <cmath>
#include <new>
#include <string>
#include <cstddef>
#include <limits>
#include <type_traits>

#include "contract/score_rule.hpp"
#include "core/check.hpp"
#include "core/gemm.hpp"
#include "core/parallel.hpp"
#include "kernels/kernel.hpp"
#include "kernels/score_rows.hpp"
#include "multihead/tensor.hpp"

namespace multihead::detail {

template <class T>
void attention_forward_materialized(const AttentionArgs<T>& a) {
  check_kv_heads(a);
  const int64_t L = a.q_len, S = a.kv_len, D = a.head_dim, Dv = a.value_dim, Hkv = a.kv_heads_or_heads();
  // One L×S buffer reused for every slice when weights are not kept: in
  // memory, or refused naming the kernel (float64's "auto" is this kernel).
  const double scratch_bytes = a.weights ? 0.0 : static_cast<double>(L) * static_cast<double>(S) * sizeof(T);
  const std::string scratch_what = "the materialized kernel's scores (L " + std::to_string(L) + " x S " +
                                   std::to_string(S) + ", " + (sizeof(T) == 8 ? "float64" : "float32") + ")";
  const char* scratch_hint = "the reference kernel holds one row; float32's flash kernel one block";
  detail::check_fits_in_memory("kernel", scratch_what, scratch_bytes, scratch_hint);
  Storage<T> scratch;
  try {
    scratch = Storage<T>(a.weights ? 0 : static_cast<std::size_t>(L * S), T(0));
  } catch (const std::bad_alloc&) {
    throw Error(Error::Kind::Value, "kernel: " + scratch_what + " could not be allocated (" +
                                        std::to_string(static_cast<long long>(scratch_bytes)) + " bytes; " +
                                        scratch_hint + ")");
  }
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
    const SliceModifiers<T> mods = slice_modifiers(a.modifiers, n, a.heads, L, S);
    parallel_items(L, requested_threads(a.num_threads), kRowElementCost * S,
                   [&](int64_t i) { score_softmax_dropout_row(a, mods, n, i, scores + i * S, S, exp_row); });
    // out = P V   (L×S)·(S×Dv)
    gemm(Trans::No, Trans::No, L, Dv, S, T(1), scores, S, kv_slice_start(a.v, vl, n, a.heads, Hkv), vl.row,
         T(0), slice_start(a.out, ol, n, a.heads), ol.row);
    // No keys at all: every row is fully masked, and P V's empty sum gave
    // 0 where the policy may say NaN (the reference and flash kernels fill).
    if (S == 0)
      for (int64_t i = 0; i < L; ++i)
        std::fill_n(slice_start(a.out, ol, n, a.heads) + i * ol.row, Dv, masked_row_fill<T>(a.masked_rows));
  }
}

template void attention_forward_materialized<float>(const AttentionArgs<float>&);
template void attention_forward_materialized<double>(const AttentionArgs<double>&);

// ---- backward ---------------------------------------------------------------
//
// The backward contract (AttentionBackwardArgs, src/contract/attention_args.hpp)
// with the L×S products through BLAS, one slice at a time. Memory: two L×S
// buffers (the recomputed weights, and dP' turned into dX in place),
// allocated once per call and reused for every slice.

namespace {

// Row i of slice n, in place: x_row holds x_ij = scale·<q_i, k_j> and
// becomes p'_ij; dp_row holds dp'_ij = <d_out_i, v_j> and becomes
// dx_ij = p_ij (dp_ij − delta_i) · soft_cap_slope(x_ij).
template <class T>
void backward_row(const AttentionBackwardArgs<T>& b, const SliceModifiers<T>& mods, int64_t n, int64_t i,
                  T delta, T* x_row, T* dp_row) {
  const AttentionArgs<T>& a = b.forward;
  const int64_t S = a.kv_len;
  const T lse = b.lse[n * a.q_len + i];
  const bool masked_row = lse == -std::numeric_limits<T>::infinity();
  const bool dropout = a.dropout.p > 0.0;
  const T keep_scale = dropout ? T(1) / static_cast<T>(1.0 - a.dropout.p) : T(1);
  for (int64_t j = 0; j < S; ++j) {
    const T x = x_row[j];
    // Forward (score_softmax_dropout_row above): row[j] = modified_score(mods, S, i, j, row[j]),
    // then softmax exp(s − max)/Σ, which is exp(s − lse); a fully masked
    // row was filled with masked_row_fill.
    const T p = masked_row ? masked_row_fill<T>(a.masked_rows) : std::exp(modified_score(mods, S, i, j, x) - lse);
    // Forward: row[j] = dropout_weight(a.dropout, n, i, j, row[j], keep_scale):
    // the same keep decision scales p and its gradient.
    const bool keep = !dropout || dropout_keep(a.dropout, n, i, j);
    const T dp = keep ? dp_row[j] * keep_scale : T(0);
    x_row[j] = keep ? p * keep_scale : T(0);
    // softmax's Jacobian, then the cap's slope (masks, ALiBi and padding
    // are additive constants).
    dp_row[j] = p * (dp - delta) * soft_cap_slope(mods.softcap, x);
  }
}

}  // namespace

template <class T>
void attention_backward_materialized(const AttentionBackwardArgs<T>& b) {
  const AttentionArgs<T>& a = b.forward;
  check_kv_heads(a);
  const int64_t L = a.q_len, S = a.kv_len, D = a.head_dim, Dv = a.value_dim, Hkv = a.kv_heads_or_heads();
  const int64_t group = a.heads / Hkv;  // query heads per K/V head
  Storage<T> weights(static_cast<std::size_t>(L * S), T(0)), d_scores(static_cast<std::size_t>(L * S), T(0));
  const SliceLayout ql = resolve_layout(a.q_layout, a.heads, L, D);
  const SliceLayout kl = resolve_layout(a.k_layout, Hkv, S, D);
  const SliceLayout vl = resolve_layout(a.v_layout, Hkv, S, Dv);
  const SliceLayout ol = resolve_layout(a.out_layout, a.heads, L, Dv);
  const int threads = requested_threads(a.num_threads);
  for (int64_t n = 0; n < a.slices; ++n) {
    const T* q = slice_start(a.q, ql, n, a.heads);
    const T* k = kv_slice_start(a.k, kl, n, a.heads, Hkv);
    const T* v = kv_slice_start(a.v, vl, n, a.heads, Hkv);
    const T* out = slice_start(a.out, ol, n, a.heads);
    const T* d_out = slice_start(b.d_out, ol, n, a.heads);
    T* x = weights.data();
    T* dx = d_scores.data();
    // Forward: scores = scale · Q Kᵀ, recomputed.
    gemm(Trans::No, Trans::Yes, L, S, D, a.scale, q, ql.row, k, kl.row, T(0), x, S);
    // Forward: out = P' V, so dP' = dO Vᵀ   (L×Dv)·(Dv×S).
    gemm(Trans::No, Trans::Yes, L, S, Dv, T(1), d_out, ol.row, v, vl.row, T(0), dx, S);
    const SliceModifiers<T> mods = slice_modifiers(a.modifiers, n, a.heads, L, S);
    parallel_items(L, threads, kRowElementCost * S + Dv, [&](int64_t i) {
      // delta_i = <d_out_i, out_i> (= Σ_j p_ij dp_ij, the contract's form).
      T delta = 0;
      for (int64_t c = 0; c < Dv; ++c) delta += d_out[i * ol.row + c] * out[i * ol.row + c];
      backward_row(b, mods, n, i, delta, x + i * S, dx + i * S);
    });
    // K/V slice g is read by the group's query slices, consecutive in n:
    // the first one writes its d_k/d_v (beta 0, so the caller's buffer is
    // written, not accumulated) and the others add (beta 1), in order of n.
    const T beta = (n % a.heads) % group == 0 ? T(0) : T(1);
    // d_v = P'ᵀ dO   (S×L)·(L×Dv)
    gemm(Trans::Yes, Trans::No, S, Dv, L, T(1), x, S, d_out, ol.row, beta,
         kv_slice_start(b.d_v, vl, n, a.heads, Hkv), vl.row);
    // Forward: x = scale · Q Kᵀ, so d_q = scale · dX K and d_k = scale · dXᵀ Q.
    gemm(Trans::No, Trans::No, L, D, S, a.scale, dx, S, k, kl.row, T(0), slice_start(b.d_q, ql, n, a.heads),
         ql.row);
    gemm(Trans::Yes, Trans::No, S, D, L, a.scale, dx, S, q, ql.row, beta,
         kv_slice_start(b.d_k, kl, n, a.heads, Hkv), kl.row);
  }
}

template void attention_backward_materialized<float>(const AttentionBackwardArgs<float>&);
template void attention_backward_materialized<double>(const AttentionBackwardArgs<double>&);

}  // namespace multihead::detail
