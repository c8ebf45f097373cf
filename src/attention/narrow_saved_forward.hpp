// src/attention/narrow_saved_forward.hpp: what the 16-bit module's forward
// (narrow_multihead_attention.cpp) and its backward
// (narrow_multihead_attention_backward.cpp) share: the attention call's
// arguments, built once for both, and what a training forward keeps
// (NarrowForwardContext<E>'s contents).
//
// Legend: B batch, L query length, S key length, S' = S (+1 bias_k)
// (+1 zero attention), E embed_dim, H heads, D head width.
#pragma once

#include <cstdint>

#include "attention/mha_plan.hpp"
#include "attention/saved_inputs.hpp"
#include "contract/attention_args.hpp"
#include "multihead/narrow_multihead_attention.hpp"
#include "multihead/tensor.hpp"

namespace multihead::detail {

// The attention step's arguments without data pointers: B·H slices of L
// queries against S' keys (causal over the first S), the heads as views of
// (tokens, E) projections in the caller's token order, K and V views of
// the projections or, with extra key rows (S' > S), of (B, S', E) copies;
// the masks as the kernel reads them; the module's options. The forward
// sets args.narrow (16-bit operands), the backward the float q, k, v, out
// of its widened copies: the same layouts, so the backward recomputes the
// scores the forward computed.
AttentionArgs<float> narrow_attention_args(const MultiheadAttentionConfig& config, const ForwardPlan& plan,
                                           const ForwardOptions<float>& options, const KernelMasks<float>& masks);

template <class E>
struct NarrowSavedForward : SavedInputs<E> {  // the inputs' copies: query, saved_key(), saved_value()
  bool filled = false;
  uint64_t parameters_token = 0;  // the module's, at the forward
  ForwardPlan plan;
  // As the forward was called, but for attn_mask and key_padding_mask,
  // which are null: `masks` holds them (the caller's need not outlive it).
  ForwardOptions<float> options;
  KernelMasks<float> masks;
  Shape query_shape;
  Storage<E> q, k, v;           // the projections, (tokens, E) in the caller's token order
  Storage<E> k_ext, v_ext;      // (B, S', E) with bias_k / zero rows when S' > S, else empty
  Storage<E> concat;            // the merged heads, (B·L tokens, E), before out_projection
  Storage<float> lse;           // [B·H][L], the kernel's row log-sum-exps

  const E* k_heads() const { return k_ext.empty() ? k.data() : k_ext.data(); }
  const E* v_heads() const { return v_ext.empty() ? v.data() : v_ext.data(); }
  std::size_t k_heads_size() const { return k_ext.empty() ? k.size() : k_ext.size(); }
};

}  // namespace multihead::detail
