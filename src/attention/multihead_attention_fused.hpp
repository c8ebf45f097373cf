// src/attention/multihead_attention_fused.hpp: what the fused form's forward
// (multihead_attention_forward.cpp) and its backward
// (multihead_attention_backward.cpp) share: the paths a call takes, the
// heads as the kernel reads them, the one construction of the kernel's
// arguments, and what a training forward saves (ForwardContext's contents).
//
// Legend: B batch, L query length, S key length, S' = S (+1 bias_k)
// (+1 zero attention), E embed_dim, H heads, D head width, Ek kdim, Ev vdim.
#pragma once

#include <cstdint>

#include "attention/mha_plan.hpp"
#include "attention/saved_inputs.hpp"
#include "attention/workspace.hpp"
#include "contract/attention_args.hpp"
#include "multihead/multihead_attention.hpp"

namespace multihead::detail {

// Which fast paths a call takes (FusedPaths in multihead_attention.hpp).
struct PathChoice {
  bool head_major = false;   // head-major copies, else strided views
  bool packed_self = false;  // one product for q, k and v
  bool transposed = false;   // Wᵀ copies, else W
};

// A tensor seen as [B][H][len][D] through a slice layout (attention_args.hpp).
template <class P>
struct HeadsView {
  P* data = nullptr;
  SliceLayout layout;
};

template <class T>
struct Heads {
  HeadsView<const T> q, k, v;
};

// The attention step's kernel arguments for this module call: shape
// (B·H slices of L queries against S' keys, causal over the first S),
// the heads, the kernel masks, merge_heads's output view into `concat`,
// the options (module_attention_options). The forward and the backward both
// build their arguments here, so the backward recomputes exactly the scores
// the forward computed.
template <class T>
AttentionArgs<T> module_attention_args(const MultiheadAttentionConfig& config, const ForwardPlan& plan,
                                       const ForwardOptions<T>& options, const Heads<T>& heads,
                                       const KernelMasks<T>& masks, T* concat, T* weights);

// What a training forward keeps (ForwardContext<T>'s contents). Every
// pointer in `heads` points into `ws`, which only a later forward resizes.
template <class T>
struct SavedForward : SavedInputs<T> {  // the inputs' copies: query, saved_key(), saved_value()
  bool filled = false;
  uint64_t parameters_token = 0;  // the module's, at the forward
  ForwardPlan plan;
  PathChoice paths;
  // As the forward was called, but for attn_mask and key_padding_mask,
  // which are null: `masks` holds them, in kernel layout, so the caller's
  // need not outlive the forward.
  ForwardOptions<T> options;
  AttentionKernel kernel = AttentionKernel::Auto;  // the kernel the forward ran (resolve_forward_kernel)
  KernelMasks<T> masks;                            // as the forward's kernel read them
  Shape query_shape, key_shape, value_shape;
  ForwardWorkspace<T> ws;  // the projections or head-major Q/K/V, and concat
  Storage<T> lse;          // [B·H][L], the kernel's row log-sum-exps
  Heads<T> heads;          // what the kernel read, views into ws

  // The merged heads, token rows × E (the attention output before out_projection).
  const T* concat() const { return ws.concat.data(); }
};

}  // namespace multihead::detail
