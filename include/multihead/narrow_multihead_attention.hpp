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
// masks stay float (bool or additive). No attention weights:
// options.need_weights must be false, and the kernel Auto or Flash.
//
// Training (the backward, src/attention/narrow_multihead_attention_backward.cpp),
// as BasicMultiheadAttention's:
//   NarrowForwardContext<bfloat16> ctx;
//   Tensor<bfloat16> y = mha.forward(q, k, v, options, ctx);
//   MultiheadAttentionGradients<bfloat16> g = mha.backward(ctx, d_y);
// Each gradient is computed with float32 products and sums from the 16-bit
// values the forward saved and rounded once to E, at the points PyTorch's
// bf16 module's autograd rounds (docs/precision.md, "The backward").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "multihead/multihead_attention.hpp"
#include "multihead/narrow.hpp"
#include "multihead/tensor.hpp"

namespace multihead {

namespace detail {
template <class E>
struct NarrowSavedForward;
struct FloatWeightCopies;
}

template <class E>
class NarrowMultiheadAttention;

// What a 16-bit training forward keeps for the backward pass, as
// ForwardContext<float> does: the inputs' shapes and the forward's plan;
// copies of the inputs (16-bit); the projected Q, K, V as the kernel read
// them (16-bit, with the bias_k and zero-attention rows); the merged heads
// before out_projection (16-bit); each row's log-sum-exp (float32,
// (B·H, L)); the masks as the kernel read them (float32, a copy); the
// options; and which parameters it was filled with. Opaque, move-only;
// a later forward overwrites it.
template <class E>
class NarrowForwardContext {
 public:
  NarrowForwardContext();
  ~NarrowForwardContext();
  NarrowForwardContext(NarrowForwardContext&&) noexcept;
  NarrowForwardContext& operator=(NarrowForwardContext&&) noexcept;
  NarrowForwardContext(const NarrowForwardContext&) = delete;
  NarrowForwardContext& operator=(const NarrowForwardContext&) = delete;

  // True until a training forward has filled it (and after clear()).
  bool empty() const;
  // Bytes of the buffers it holds.
  std::size_t bytes() const;
  // Frees every buffer; the context is empty again.
  void clear();

 private:
  friend class NarrowMultiheadAttention<E>;
  std::unique_ptr<detail::NarrowSavedForward<E>> saved_;
};

extern template class NarrowForwardContext<bfloat16>;
extern template class NarrowForwardContext<float16>;

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
  // Training: the same forward (bit-identical output), also filling
  // `save_for_backward` with what backward() needs. options.training
  // selects dropout at config().dropout with options.attention.dropout_seed;
  // the backward regenerates the same keep decisions from that seed.
  Tensor<E> forward(const Tensor<E>& query, const Tensor<E>& key, const Tensor<E>& value,
                    const ForwardOptions<float>& options, NarrowForwardContext<E>& save_for_backward) const;
  // The backward pass of that forward: given d_output = dℓ/d(output), of the
  // output's shape, the gradients of the inputs and of every parameter under
  // its state_dict name, each in E (float32 accumulation, rounded once).
  // Throws multihead::Error, naming the argument, if `context` is empty, comes
  // from another module or predates update_parameters(), or if d_output has
  // the wrong shape. Thread-safe (no state is written).
  MultiheadAttentionGradients<E> backward(const NarrowForwardContext<E>& context, const Tensor<E>& d_output) const;

  // Calls update(name, tensor) for every parameter under its state_dict name
  // (in state_dict()'s order), e.g. writing the rounded master weights of a
  // mixed-precision step, then checks every shape; an update that throws or
  // reshapes a parameter (refused, naming it) leaves the module as it was.
  // Not thread-safe against concurrent forward/backward calls. Contexts
  // filled before the update are refused by backward().
  void update_parameters(const std::function<void(const std::string& name, Tensor<E>& parameter)>& update);

  // Float32 copies of the weights, for a CPU without a 16-bit matmul
  // (core/gemm.hpp's native_16bit_gemm: bf16 below AVX-512, and f16 on
  // every CPU with oneDNN 2.6), where each product runs in float32 on exact
  // float32 copies of its operands. Kept (the default), the projection
  // weights are widened once, by the first forward after construction or
  // update_parameters(), and kept: 4 more bytes per weight, three times the
  // 16-bit weights' memory in all; and each distinct input is widened once
  // for the products that read it. Not kept, every product widens both its
  // operands again, into per-thread buffers (less memory, slower: at small
  // shapes the widening is most of what a 16-bit forward costs beyond a
  // float32 one, docs/precision.md). The same copies either way, so the
  // same bits; on a CPU with a 16-bit matmul no copy is made at all.
  // Setting it frees copies held. Not thread-safe against concurrent
  // forward calls.
  void keep_float32_weights(bool keep);
  bool keeps_float32_weights() const { return keep_float32_weights_; }
  // Bytes of the float32 weight copies held now (0 before the first
  // forward, when not kept, or where a 16-bit matmul runs).
  std::size_t float32_weight_bytes() const;

 private:
  Tensor<E> run_forward(const Tensor<E>& query, const Tensor<E>& key, const Tensor<E>& value,
                        const ForwardOptions<float>& options, NarrowForwardContext<E>* save) const;
  MultiheadAttentionConfig config_;
  MultiheadAttentionParameters<E> params_;
  // A process-unique token for this set of parameter values (as
  // BasicMultiheadAttention's): drawn by the constructors and by
  // update_parameters(); a context records it.
  uint64_t parameters_token_ = 0;
  // The float32 weight copies (keep_float32_weights), made once under
  // their own lock and shared by copies of the module until one of them
  // updates its parameters (which gives it new, empty ones).
  bool keep_float32_weights_ = true;
  std::shared_ptr<detail::FloatWeightCopies> float_weights_;
};

extern template class NarrowMultiheadAttention<bfloat16>;
extern template class NarrowMultiheadAttention<float16>;

// Element-wise rounding to nearest even (float -> 16-bit) and the exact
// widening back (16-bit -> float, or double).
template <class E>
Tensor<E> round_to(const Tensor<float>& t);
// The same for a named input or parameter: a finite value beyond float16's
// largest, |x| > 65504 (from 65520 on it rounds to an infinity, which makes
// every output it reaches inf or NaN; between, it would be clipped to
// 65504), is refused with a multihead::Error naming `name`, the element's
// index and its value: the float16 KV cache's rule. bfloat16 holds
// float32's range: for it this is round_to(t). The command line rounds every
// float32 input of a 16-bit call with this, and NarrowMultiheadAttention::
// rounded and NarrowGroupedQueryAttention::rounded every parameter; the
// Python module keeps torch's .half() (overflow to ±inf: docs/precision.md).
template <class E>
Tensor<E> round_to(const Tensor<float>& t, const std::string& name);
template <class To, class E>
Tensor<To> widen(const Tensor<E>& t);

}  // namespace multihead
