// src/contract/attention_args.hpp: the one contract every attention kernel
// implements (reference loops, BLAS materialised, SIMD flash). This layer
// sits below src/simd/ and src/attention/: it includes only the public
// headers and the standard library, and everything above includes it.
//
// Legend: N slices (= B·H for multi-head, or the flattened leading dims of
// scaled_dot_product_attention), L queries, S keys, D query/key width,
// Dv value width.
//
// For slice n = b·heads + h, its K/V slice g = kv_slice(n) (= n unless
// grouped-query, below) and query row i, every kernel computes
//   s_ij  = score_rule(scale · <q[n,i,:], k[g,j,:]>)     (score_rule.hpp,
//           in the order ScoreModifiers lists)
//   p_ij  = softmax_j(s_ij)          (fully masked row: masked_row_fill)
//   p'_ij = dropout_weight(p_ij)     (when dropout.p > 0)
//   out[n,i,:] = Σ_j p'_ij v[g,j,:]
// and, when weights != nullptr, stores p'_ij in weights[n,i,j]; when
// lse != nullptr, stores lse[n,i] = log Σ_j exp(s_ij) (the row's
// log-sum-exp, natural log, over the shaped scores, before dropout; −inf for
// a fully masked row), which is what the backward pass needs to recompute
// p_ij = exp(s_ij − lse_i) without storing the L×S weights.
//
// The backward contract (AttentionBackwardArgs, at the end of this file).
#pragma once

#include <cstdint>
#include <string>

#include "multihead/attention.hpp"
#include "multihead/error.hpp"
#include "multihead/narrow.hpp"

namespace multihead::detail {

// Where slice n = b·heads + h of a tensor starts and how far apart its rows
// are, in elements: row i of slice n is at
//   base + b·batch + h·head + i·row.
// All zero means contiguous [N][len][width]. A strided layout lets the fused
// form hand the kernels views into its projection buffer (split_heads as a
// reshape, not a copy) and let them write merged heads directly.
struct SliceLayout {
  int64_t batch = 0, head = 0, row = 0;
  bool contiguous() const { return batch == 0 && head == 0 && row == 0; }
};

// The effective layout: `layout`, or contiguous [N][len][width] when unset.
inline SliceLayout resolve_layout(const SliceLayout& layout, int64_t heads, int64_t len, int64_t width) {
  if (!layout.contiguous()) return layout;
  return SliceLayout{heads * len * width, len * width, width};
}
// Start of slice n under a resolved layout.
// A null base (a tensor the call does not have, or the float pointers of a
// 16-bit call, whose data is in AttentionArgs::narrow) stays null: an offset
// applied to null is undefined behaviour.
template <class P>
P* slice_start(P* base, const SliceLayout& l, int64_t n, int64_t heads) {
  if (base == nullptr) return base;
  return base + (n / heads) * l.batch + (n % heads) * l.head;
}

// Grouped-query attention (Ainslie et al. 2023; multi-query, kv_heads = 1:
// Shazeer 2019): `heads` query heads per batch entry share `kv_heads` K/V
// heads (heads % kv_heads == 0), each K/V head serving heads / kv_heads
// consecutive query heads, as Llama's repeat_kv orders them. Query slice
// n = b·heads + h reads K/V slice
//   b·kv_heads + h / (heads / kv_heads)
// in place (K and V are [B·kv_heads][S][·], or as their layouts say, with
// batch/head strides over K/V heads); no kernel copies a K/V head per query
// head. kv_heads == heads is ordinary multi-head attention. The one rule:
// every kernel finds its K/V rows through kv_slice_start.
inline int64_t kv_slice(int64_t n, int64_t heads, int64_t kv_heads) {
  if (kv_heads == heads) return n;
  return (n / heads) * kv_heads + (n % heads) / (heads / kv_heads);
}
// Start of the K (or V) rows query slice n reads, under a layout resolved
// with kv_heads (resolve_layout(layout, kv_heads, S, width)).
template <class P>
P* kv_slice_start(P* base, const SliceLayout& l, int64_t n, int64_t heads, int64_t kv_heads) {
  return slice_start(base, l, kv_slice(n, heads, kv_heads), kv_heads);
}
// How many K/V slices N query slices read: N / heads · kv_heads (N itself
// without grouping, where N need not be a multiple of heads).
inline int64_t kv_slice_count(int64_t slices, int64_t heads, int64_t kv_heads) {
  return kv_heads == heads ? slices : slices / heads * kv_heads;
}
// Query slice r < heads / kv_heads of K/V slice g's group: the inverse of
// kv_slice (consecutive query heads, in increasing n).
inline int64_t group_query_slice(int64_t g, int64_t r, int64_t heads, int64_t kv_heads) {
  if (kv_heads == heads) return g;
  return (g / kv_heads) * heads + (g % kv_heads) * (heads / kv_heads) + r;
}

// Causal masking, with its alignment made explicit. Keys j < cols take part
// (the columns after them, bias_k and the zero-attention key, stay visible,
// as PyTorch pads its masks). With
//   shift = query_offset + (alignment == BottomRight ? cols − L : 0)
// query i may see key j < cols iff j ≤ i + shift.
//  - TopLeft, offset 0: j ≤ i, PyTorch's is_causal (torch.triu(ones, 1)).
//  - BottomRight, offset 0: the last query sees every key, FlashAttention's
//    convention; with L > cols the first L − cols queries see no causal key.
//  - query_offset p: the queries are positions p, p + 1, … of a longer
//    sequence, e.g. TopLeft with p = cols − L decodes L new tokens against a
//    KV cache of cols keys (the same as BottomRight with p = 0).
// The rule itself is causal_visible() in score_rule.hpp.
struct CausalRule {
  bool enabled = false;
  CausalAlignment alignment = CausalAlignment::TopLeft;
  int64_t query_offset = 0;
  int64_t cols = 0;
};

// Positions, for the sliding window and ALiBi. Query i is at position
//   p_i = i + shift   (shift = causal_shift(), as CausalRule defines it,
// whether or not causal masking is enabled) and key j < causal.cols at
// position j. Keys j >= cols (bias_k, the zero-attention key) have no
// position: the window never hides them and ALiBi adds nothing to them.
//
// Every rule that shapes the scores before the softmax, applied by
// score_rule.hpp (scalar) and its vector twin in src/simd/, in this order:
//   s = scale·<q_i, k_j>
//   s = softcap·tanh(s / softcap)              when softcap > 0
//   s = s − alibi_slopes[n]·|p_i − j|          when alibi_slopes, j < cols
//       + attn_mask[i][j] + key_padding[j]
//   s = −inf where causal or window hides key j from query i
// Which K/V head a slice reads is not a score rule: kv_slice() above.
template <class T>
struct ScoreModifiers {
  // Additive mask [L][S] for slice n at attn_mask + n·attn_mask_slice_stride
  // (stride 0 broadcasts one (L, S) mask to every slice). nullptr = none.
  const T* attn_mask = nullptr;
  int64_t attn_mask_slice_stride = 0;
  // Additive key padding [B][S], row n / heads. nullptr = none.
  const T* key_padding = nullptr;
  CausalRule causal;
  // Sliding window w >= 1, 0 = none. Key j < cols is visible to query i iff
  //   causal:     p_i − w < j <= p_i     (w keys, its own position included)
  //   not causal: |p_i − j| < w
  // window_visible() in score_rule.hpp.
  int64_t window = 0;
  // Logit soft-cap > 0, 0 = none: soft_cap() in score_rule.hpp.
  T softcap = T(0);
  // ALiBi: [N] the slope of slice n, nullptr = none: alibi_bias().
  const T* alibi_slopes = nullptr;
};

// Dropout on the softmax weights, PyTorch's rule: keep with probability
// 1 − p, scale the kept by 1/(1 − p). The decision is dropout_keep() in
// score_rule.hpp, a hash of (seed, n + slice_offset, i, j).
struct DropoutRule {
  double p = 0.0;
  uint64_t seed = 0;
  // Added to the slice index: lets a caller that runs one head per call
  // drop exactly the elements a call over all heads drops.
  int64_t slice_offset = 0;
};

// 16-bit storage of q, k, v and out (the bf16 and f16 modules,
// multihead/narrow.hpp): when dtype is BF16 or F16 these are read and
// written, as elements of that type in the layouts AttentionArgs gives, in
// place of its float q, k, v and out (which stay nullptr). Everything else
// (masks, scale, lse) stays float. Only the flash kernel takes them
// (run_attention_forward refuses the others).
struct NarrowOperands {
  ComputeDtype dtype = ComputeDtype::F32;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  // bf16's pair way only (the flash kernel's Bf16Way::Dot): K and V already
  // packed as the pairs its products read (simd/bf16_pairs.hpp), made once
  // per call by attention_forward_flash (src/kernels/flash.cpp,
  // run_flash_on_pairs), contiguous per K/V slice:
  //   k_pairs [kv slices][S][ceil(D/2)]   each K row's pairs along D
  //   v_pairs [kv slices][ceil(S/2)][Dv]  V's pairs down the keys
  // nullptr: the kernel packs each key tile itself.
  const uint32_t* k_pairs = nullptr;
  const uint32_t* v_pairs = nullptr;
};

template <class T>
struct AttentionArgs {
  int64_t slices = 0;    // N
  int64_t heads = 1;     // slices per batch entry (for key_padding indexing)
  int64_t kv_heads = 0;  // K/V heads per batch entry (kv_slice); 0 = heads
  int64_t q_len = 0;     // L
  int64_t kv_len = 0;    // S (all keys, including bias_k / zero-attention columns)
  int64_t head_dim = 0;  // D
  int64_t value_dim = 0; // Dv

  const T* q = nullptr;  // [N][L][D]  (or as q_layout says)
  const T* k = nullptr;  // [B·kv_heads][S][D]  (or as k_layout says)
  const T* v = nullptr;  // [B·kv_heads][S][Dv] (or as v_layout says)
  SliceLayout q_layout, k_layout, v_layout, out_layout;

  T scale = T(1);
  ScoreModifiers<T> modifiers;
  DropoutRule dropout;
  MaskedRowPolicy masked_rows = MaskedRowPolicy::Zeros;
  int num_threads = 0;

  T* out = nullptr;      // [N][L][Dv] (or as out_layout says)
  T* weights = nullptr;  // [N][L][S] or nullptr
  T* lse = nullptr;      // [N][L] contiguous, or nullptr: each row's log-sum-exp
  NarrowOperands narrow; // 16-bit q, k, v, out (float T only), above

  // K/V heads per batch entry, kv_heads resolved (0 means heads).
  int64_t kv_heads_or_heads() const { return kv_heads > 0 ? kv_heads : heads; }
};

// Throws multihead::Error unless kv_heads is 0 or divides heads (>= 1).
template <class T>
void check_kv_heads(const AttentionArgs<T>& a) {
  if (a.kv_heads == 0) return;
  if (a.kv_heads < 0 || a.heads < 1 || a.heads % a.kv_heads != 0)
    throw Error(Error::Kind::Value, "num_kv_heads: expected a divisor of num_heads " + std::to_string(a.heads) +
                                        " (grouped-query attention), got " + std::to_string(a.kv_heads));
}

// The backward pass of the forward above. Given the forward's own arguments
// (forward.out holds the output it wrote), the row log-sum-exps it saved and
// dℓ/dout, every backward kernel computes, for slice n, query i, key j
// (x_ij = scale·<q_i, k_j>, s_ij its shaped score, as in the forward;
// k_j, v_j rows of K/V slice g = kv_slice(n)):
//   p_ij    = exp(s_ij − lse_i)            the forward's softmax, recomputed
//   dp'_ij  = <d_out_i, v_j>               (p' = dropout(p), out_i = Σ_j p'_ij v_j)
//   dp_ij   = dropout_weight(dp'_ij)       the same keep decision and 1/(1 − p)
//   delta_i = <d_out_i, out_i>             (= Σ_j p_ij dp_ij, also with dropout)
//   ds_ij   = p_ij (dp_ij − delta_i)       softmax's Jacobian
//   dx_ij   = ds_ij · soft_cap_slope(x_ij) the cap's derivative (1 without it);
//                                          masks, ALiBi and padding are constants
//   d_q[n]_i = scale Σ_j dx_ij k_j
//   d_k[g]_j = scale Σ_{n: kv_slice(n) = g} Σ_i dx_ij q[n]_i
//   d_v[g]_j = Σ_{n: kv_slice(n) = g} Σ_i p'_ij d_out[n]_i
// i.e. grouped-query K/V rows get the sum over the heads / kv_heads query
// slices that read them (what autograd gives through repeat_kv), summed in
// increasing n in every kernel.
// A fully masked row (lse_i = −inf) contributes nothing under
// MaskedRowPolicy::Zeros (its output was the constant 0); under NaN its
// gradient is NaN wherever it reaches, as PyTorch 1.13's autograd gives.
// The masks themselves get no gradient (they are inputs, not parameters).
template <class T>
struct AttentionBackwardArgs {
  AttentionArgs<T> forward;   // as the forward was called; its weights and lse are not read
  const T* lse = nullptr;     // [N][L], as the forward wrote it
  const T* d_out = nullptr;   // forward.out_layout
  // Written (not accumulated) in the layouts of q, k and v (d_k and d_v
  // over the kv_heads K/V slices): views into one packed buffer give the
  // packed gradient of the in-projection's output.
  T* d_q = nullptr;           // forward.q_layout
  T* d_k = nullptr;           // forward.k_layout
  T* d_v = nullptr;           // forward.v_layout
  // The bf16 module's backward (float only): q, k, v, out and d_out hold
  // bf16 values (their exact float32 widenings). Where this host's bf16
  // flash forward runs its pair way (bf16_dot_choice: vdpbf16ps), the
  // flash backward then runs its five tile products on bf16 pairs as well:
  // the scores exactly as the forward computed them, P and dS rounded to
  // bf16 before the products that read them (src/kernels/flash.cpp,
  // attention_backward_flash). Elsewhere, and in every other kernel, it
  // changes nothing.
  bool bf16_operands = false;
  // The bf16 operands themselves (float only, flash only, and only where
  // that pair way runs, flash_backward_reads_bf16(), kernels/kernel.hpp, or
  // where the matmul way does, kernels/narrow_matmul.hpp):
  // forward.narrow (dtype BF16) holds q, k, v and out, and d_out_bf16
  // d_out, read in the layouts above in place of the float q, k, v, out and
  // d_out (which stay nullptr); both ways read only their bf16 values, so
  // no float32 copy of them is made. The gradients stay float.
  const bfloat16* d_out_bf16 = nullptr;
  // Set by attention_backward_flash itself for that way (callers leave
  // them nullptr): K and V packed as bf16 pairs once per call, contiguous
  // per K/V slice (simd/bf16_pairs.hpp), beside forward.narrow.k_pairs
  // (K's rows, as the forward's):
  //   k_column_pairs [kv slices][ceil(S/2)][D]   K's pairs down the keys (d_q)
  //   v_row_pairs    [kv slices][S][ceil(Dv/2)]  each V row's pairs (dp')
  const uint32_t* k_column_pairs = nullptr;
  const uint32_t* v_row_pairs = nullptr;
};

}  // namespace multihead::detail
