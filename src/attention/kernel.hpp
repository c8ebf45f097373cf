// src/attention/kernel.hpp: the one internal interface behind which every
// attention kernel sits (reference loops, BLAS materialised, flash).
//
// Legend: N slices (= B·H for multi-head, or the flattened leading dims of
// scaled_dot_product_attention), L queries, S keys, D query/key width,
// Dv value width.
//
// For slice n = b·heads + h and query row i, every kernel computes
//   s_ij  = scale · <q[n,i,:], k[n,j,:]> + attn_mask[n,i,j] + key_padding[b,j]
//           (+ -inf where is_causal and j < causal_cols and j > i)
//   p_ij  = softmax_j(s_ij)            (fully masked row: see masked_rows)
//   p'_ij = p_ij · keep(n,i,j) / (1-p)  when dropout_p > 0
//   out[n,i,:] = Σ_j p'_ij v[n,j,:]
// and, when weights != nullptr, stores p'_ij in weights[n,i,j].
#pragma once

#include <cstdint>

#include "multihead/attention.hpp"

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

template <class T>
struct AttentionArgs {
  int64_t slices = 0;   // N
  int64_t heads = 1;    // slices per batch entry (for key_padding_mask indexing)
  int64_t q_len = 0;    // L
  int64_t kv_len = 0;   // S (all keys, including bias_k / zero-attention columns)
  int64_t head_dim = 0; // D
  int64_t value_dim = 0;// Dv

  const T* q = nullptr;  // [N][L][D]  (or as q_layout says)
  const T* k = nullptr;  // [N][S][D]  (or as k_layout says)
  const T* v = nullptr;  // [N][S][Dv] (or as v_layout says)
  SliceLayout q_layout, k_layout, v_layout, out_layout;

  // Additive mask [L][S] for slice n at attn_mask + n·attn_mask_slice_stride
  // (stride 0 broadcasts one (L, S) mask to every slice). nullptr = none.
  const T* attn_mask = nullptr;
  int64_t attn_mask_slice_stride = 0;
  // Additive key padding [B][S], row n / heads. nullptr = none.
  const T* key_padding = nullptr;

  bool is_causal = false;
  // Causal masking applies to key columns j < causal_cols only; the columns
  // after it (bias_k, zero attention) stay visible, as PyTorch pads masks.
  int64_t causal_cols = 0;

  T scale = T(1);
  double dropout_p = 0.0;
  uint64_t dropout_seed = 0;
  // Added to the slice index in dropout_keep(seed, n + dropout_slice_offset,
  // i, j): lets the textbook form, which runs one head per call, drop exactly
  // the elements the fused form drops.
  int64_t dropout_slice_offset = 0;
  MaskedRowPolicy masked_rows = MaskedRowPolicy::Zeros;
  int num_threads = 0;

  T* out = nullptr;      // [N][L][Dv] (or as out_layout says)
  T* weights = nullptr;  // [N][L][S] or nullptr
};

// Dropout decision shared by every kernel: keep element (n, i, j)?
// A counter-based hash (SplitMix64 finaliser) of (seed, n, i, j), so that the
// decision does not depend on kernel, tile order or thread count.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline bool dropout_keep(uint64_t seed, int64_t n, int64_t i, int64_t j, double p) {
  uint64_t h = mix64(seed ^ mix64(static_cast<uint64_t>(n) ^ mix64(static_cast<uint64_t>(i) ^
                                                                    mix64(static_cast<uint64_t>(j)))));
  // 53 random bits -> uniform double in [0, 1).
  double u = static_cast<double>(h >> 11) * 0x1.0p-53;
  return u >= p;
}

// The effective layout: `layout`, or contiguous [N][len][width] when unset.
inline SliceLayout resolve_layout(const SliceLayout& layout, int64_t heads, int64_t len, int64_t width) {
  if (!layout.contiguous()) return layout;
  return SliceLayout{heads * len * width, len * width, width};
}
// Start of slice n under a resolved layout.
template <class P>
P* slice_start(P* base, const SliceLayout& l, int64_t n, int64_t heads) {
  return base + (n / heads) * l.batch + (n % heads) * l.head;
}
// Plain loops, templated so tests can run them in double. Never optimised.
template <class T>
void attention_forward_reference(const AttentionArgs<T>& args);

// Scores materialised per slice (L×S), products through BLAS.
template <class T>
void attention_forward_materialized(const AttentionArgs<T>& args);

// Tiled online softmax (Highway SIMD). float only, weights must be nullptr.
// Defined in src/attention/flash.cpp.
void attention_forward_flash(const AttentionArgs<float>& args);
bool flash_available();  // whether this build has the flash kernel

// Picks a kernel: `requested`, unless MULTIHEAD_KERNEL overrides it; Auto
// means flash when it can serve the request, else materialised.
template <class T>
void attention_forward(const AttentionArgs<T>& args, AttentionKernel requested);

}  // namespace multihead::detail
