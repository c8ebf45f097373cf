// src/train/mixed_precision.hpp: the trainer's layers at a compute type
// (TrainOptions::dtype), as PyTorch's CPU autocast runs them (PyTorch 1.13,
// aten/src/ATen/autocast_mode.cpp: `linear` is on the CPU lower-precision
// list; layer_norm, softmax and the losses on the float32 list).
//
// Storage stays T (float): a 16-bit value widened to float is exact, so an
// activation "in bf16" is a float tensor holding bf16 values. At F32 each
// helper is core/linear.hpp's layer in T; at BF16 / F16:
//   forward:   y = round(round(x) · round(W)ᵀ + round(b))     (linear_forward<E>)
//   backward:  d_y rounded first (autograd casts a gradient to the dtype of
//              what it flows into), then d_x = round(d_y · W),
//              d_W = round(d_yᵀ · x), d_b = round(Σ d_y): linear_backward<E>,
//              each product float32; d_W and d_b are then added, widened,
//              into the float32 master gradient, as the cast's backward does.
// The rounding is multihead/narrow.hpp's one rule (narrow_from_float).
// Internal: not part of the public API.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "multihead/grouped_query_attention.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/narrow.hpp"
#include "multihead/tensor.hpp"

namespace multihead::train {

// y (rows × out) = x (rows × in) · Wᵀ + b at `dtype` (W is out × in, as
// nn.Linear). T must be float for BF16 / F16 (a double would be rounded
// twice, through float): double throws multihead::Error.
template <class T>
void linear_forward_at(ComputeDtype dtype, int64_t rows, const T* x, const T* W, int64_t out, int64_t in, const T* b,
                       T* y, int threads);

// The backward of linear_forward_at, ADDED into d_x (rows × in), d_W and d_b.
template <class T>
void linear_backward_at(ComputeDtype dtype, int64_t rows, const T* x, const T* W, int64_t out, int64_t in,
                        const T* d_y, T* d_x, T* d_W, T* d_b, int threads);

// One block's self-attention at a 16-bit compute type, for one pass:
// built from the block's float32 master parameters, forward on norm1's
// output a (B, L, E), backward from d_output. The block's module is
// MultiheadAttention (sinusoidal, ALiBi or no positions) or, with RoPE,
// GroupedQueryAttention; either way `options` are MultiheadAttention's
// ForwardOptions: dropout at the module's rate when options.training, the
// step's options in options.attention (dropout_p left 0).
class NarrowBlockAttention {
 public:
  virtual ~NarrowBlockAttention() = default;
  // The output (B, L, E), 16-bit values widened to float.
  virtual Tensor<float> forward(const Tensor<float>& a, const ForwardOptions<float>& options) = 0;
  struct Gradients {
    Tensor<float> d_a;                               // d_query + d_key + d_value (one tensor, three roles)
    std::map<std::string, Tensor<float>> parameters;  // under the state_dict names, widened
  };
  virtual Gradients backward(const Tensor<float>& d_output) = 0;
};

// dtype BF16 or F16; throws multihead::Error for F32.
std::unique_ptr<NarrowBlockAttention> make_narrow_block_attention(ComputeDtype dtype,
                                                                  const BasicMultiheadAttention<float>& master);
// The RoPE block's grouped-query module (multihead/narrow_grouped_query_attention.hpp).
// GroupedQueryAttentionConfig has no dropout rate (GroupedQueryAttention
// takes it per call, options.dropout_p), so the block's is given here.
// Its forward refuses what the grouped-query module has no form of (ALiBi
// through options.alibi, masks, need_weights) with a multihead::Error;
// causality is the master's config.causal.
std::unique_ptr<NarrowBlockAttention> make_narrow_block_attention(ComputeDtype dtype,
                                                                  const GroupedQueryAttention<float>& master,
                                                                  double dropout);

}  // namespace multihead::train
