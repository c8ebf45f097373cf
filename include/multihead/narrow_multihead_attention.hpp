// multihead/narrow_multihead_attention.hpp: torch.nn.MultiheadAttention in
// 16-bit storage, bfloat16 or float16 (multihead/narrow.hpp), the module
// `torch.nn.MultiheadAttention(...).to(torch.bfloat16)` is.
//
// Inputs, parameters and the output are stored in E. Where the computation
// rounds (each rounding to nearest even, as PyTorch's bf16 CPU ops do):
//   1. in_projection: Q, K, V = round(X W_inᵀ + b_in)   (products exact in
//      float32, sums float32: core/gemm.hpp's 16-bit gemm; oneDNN's bf16
//      matmul for bf16)
//   2. scaled_dot_product_attention on the rounded Q, K, V (and bias_k,
//      bias_v, the zero-attention key): widened to float32 in registers,
//      scores, softmax, its running max and sum, and the weighted sums in
//      float32 (the flash kernel), each head's output rounded once; for
//      bf16, where vdpbf16ps is measured faster, QKᵀ and PV run on bf16
//      pairs instead, P rounded to bf16 (docs/precision.md, "The two bf16
//      dot ways"; MULTIHEAD_BF16_DOT forces either)
//   3. out_projection: round(concat W^Oᵀ + b^O)
// docs/precision.md derives the error bound from these steps.
//
// Same configuration, parameter names and shapes, forward arguments and
// shape rules as BasicMultiheadAttention (multihead/multihead_attention.hpp);
// masks stay float (bool or additive). Forward only (no backward yet), and
// no attention weights: options.need_weights must be false, and the kernel
// Auto or Flash.
#pragma once

#include <map>
#include <string>

#include "multihead/multihead_attention.hpp"
#include "multihead/narrow.hpp"
#include "multihead/tensor.hpp"

namespace multihead {

template <class E>
class NarrowMultiheadAttention {
 public:
  // Takes given parameters; throws multihead::Error if any is missing, extra
  // or of the wrong shape (naming it, with expected and actual shape).
  NarrowMultiheadAttention(const MultiheadAttentionConfig& config, MultiheadAttentionParameters<E> parameters);
  // Every parameter of a float32 module rounded to E (what .to(bfloat16)
  // does to a module).
  static NarrowMultiheadAttention rounded(const MultiheadAttentionConfig& config,
                                          const MultiheadAttentionParameters<float>& parameters);

  const MultiheadAttentionConfig& config() const { return config_; }
  const MultiheadAttentionParameters<E>& parameters() const { return params_; }
  // By state_dict name, as BasicMultiheadAttention::state_dict.
  std::map<std::string, Tensor<E>> state_dict() const;

  // The fused forward (above). Thread-safe (no state is written).
  Tensor<E> forward(const Tensor<E>& query, const Tensor<E>& key, const Tensor<E>& value,
                    const ForwardOptions<float>& options) const;

 private:
  MultiheadAttentionConfig config_;
  MultiheadAttentionParameters<E> params_;
};

extern template class NarrowMultiheadAttention<bfloat16>;
extern template class NarrowMultiheadAttention<float16>;

// Element-wise rounding to nearest even (float -> 16-bit) and the exact
// widening back (16-bit -> float, or double).
template <class E>
Tensor<E> round_to(const Tensor<float>& t);
template <class To, class E>
Tensor<To> widen(const Tensor<E>& t);

}  // namespace multihead
