// multihead/narrow_grouped_query_attention.hpp: grouped-query attention
// (multihead/grouped_query_attention.hpp) in 16-bit storage, bfloat16 or
// float16 (multihead/narrow.hpp): the module
// `LlamaAttention(...).to(torch.bfloat16)` is, as NarrowMultiheadAttention
// is torch.nn.MultiheadAttention's.
//
// Inputs, parameters and the output are stored in E. Where the computation
// rounds (each rounding to nearest even; docs/precision.md, "Grouped-query
// attention in 16 bits", derives the error bound from these steps):
//   1. in_projection: q, k, v = round(x W_ᵀ + b)   (core/linear's 16-bit
//      gemm: products exact in float32, sums float32)
//   2. RoPE (config.rope): the rounded q and k widened to float32 (exact),
//      rotated in float32 (rope_in_place, the float module's rotation, cos
//      and sin in float32), each element rounded once to E. (PyTorch's bf16
//      module rounds q·cos, rotate_half(q)·sin and their sum: three times.)
//   3. attention on the rounded q, k, v: the flash kernel on 16-bit operands
//      (widened in registers; scores, softmax and the weighted sums in
//      float32), query slice b·H + h reading K/V head h / (H / Hkv) in
//      place; each head's output rounded once
//   4. out_projection: round(merged W_oᵀ + b_o)
// With a KV cache (KVCache<float>, any dtype) step 3 reads the cache
// instead: the new k, v (rounded to E, after RoPE) are widened exactly into
// a float32 cache, or rounded/quantized into a compressed one, and the
// queries, widened to float32, run the decode kernel (or flash, for a float
// cache's prompt) as GroupedQueryAttention<float> does, except that the bf16
// module reads a bf16 cache as bf16 pairs (vdpbf16ps, P rounded to bf16)
// where its flash kernel takes that way too (docs/decoding.md, "bf16's pair
// way"); each output element is rounded once to E. A float32 or (for a bf16 module) a bf16 cache holds
// exactly the rounded k, v the full forward reads.
//
// Same configuration, parameter names and shapes, options and shape rules as
// GroupedQueryAttention<float>, with the same messages. options.kernel must
// be Auto or Flash (the 16-bit operands are flash's only), as the narrow MHA.
//
// Training:
//   NarrowGroupedQueryForwardContext<bfloat16> ctx;
//   Tensor<bfloat16> y = gqa.forward(x, options, ctx);
//   GroupedQueryAttentionGradients<bfloat16> g = gqa.backward(ctx, d_y);
// Each gradient is computed with float32 products and sums from the saved
// 16-bit values and rounded once to E (docs/precision.md): d_x is one
// float32 sum over the three in-projections, rounded once.
//
// Legend: B batch, L new tokens, P tokens already cached, S = P + L keys,
// E embed width, H query heads, Hkv K/V heads, D head width.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "multihead/attention.hpp"
#include "multihead/grouped_query_attention.hpp"
#include "multihead/narrow.hpp"
#include "multihead/tensor.hpp"

namespace multihead {

template <class E>
class NarrowGroupedQueryAttention;

// What a 16-bit training forward keeps for the backward pass, as
// GroupedQueryForwardContext does: a copy of x; q, k (after RoPE) and v as
// the kernel read them, (B·L, H·D) and (B·L, Hkv·D) ×2; the merged heads
// before o_proj, (B·L, H·D); all in E; each row's log-sum-exp in float32,
// (B·H, L); the options; and which parameters it was filled with. Opaque;
// a later forward overwrites it.
template <class E>
class NarrowGroupedQueryForwardContext {
 public:
  // True until a training forward has filled it (and after clear()).
  bool empty() const { return !filled_; }
  // Bytes of the tensors it holds.
  std::size_t bytes() const {
    return static_cast<std::size_t>(x_.numel() + q_.numel() + k_.numel() + v_.numel() + merged_.numel()) * sizeof(E) +
           static_cast<std::size_t>(lse_.numel()) * sizeof(float);
  }
  // Frees every tensor; the context is empty again.
  void clear() { *this = NarrowGroupedQueryForwardContext(); }

 private:
  friend class NarrowGroupedQueryAttention<E>;
  Tensor<E> x_, q_, k_, v_, merged_;
  Tensor<float> lse_;
  AttentionOptions options_;
  bool filled_ = false;            // by a training forward (also one of B = 0 or L = 0)
  uint64_t parameters_token_ = 0;  // the module's, when filled
};

template <class E>
class NarrowGroupedQueryAttention {
 public:
  // Takes given parameters; throws multihead::Error if any is missing, extra
  // or of the wrong shape (naming it, with expected and actual shape).
  NarrowGroupedQueryAttention(const GroupedQueryAttentionConfig& config, GroupedQueryAttentionParameters<E> parameters);
  // Every parameter of a float32 module rounded to E (what .to(bfloat16)
  // does to a module).
  static NarrowGroupedQueryAttention rounded(const GroupedQueryAttentionConfig& config,
                                             const GroupedQueryAttentionParameters<float>& parameters);

  const GroupedQueryAttentionConfig& config() const { return config_; }
  const GroupedQueryAttentionParameters<E>& parameters() const { return params_; }
  int64_t head_dim() const { return config_.resolved_head_dim(); }
  int64_t kv_heads() const { return config_.resolved_kv_heads(); }
  // By state_dict name, as GroupedQueryAttention::state_dict.
  std::map<std::string, Tensor<E>> state_dict() const;
  // As NarrowMultiheadAttention::update_parameters: update(name, tensor) for
  // every parameter, then every shape checked; a throwing or reshaping
  // update (refused, naming it) leaves the module as it was. Contexts filled
  // before are refused by backward().
  void update_parameters(const std::function<void(const std::string& name, Tensor<E>& parameter)>& update);

  // A cache for `batch` sequences of up to max_len tokens, float32 or
  // compressed (KVCacheDType).
  KVCache<float> make_cache(int64_t batch, int64_t max_len, bool grow = false,
                            KVCacheDType dtype = KVCacheDType::Native) const;

  // x (B, L, E). Without a cache: self-attention over positions 0 … L − 1.
  // With one: K/V of x are appended (positions P … P + L − 1, P =
  // cache->length()) and the L queries attend to all P + L keys, as
  // GroupedQueryAttention::forward (its rules for a compressed cache: kernel
  // Auto, no dropout). Returns (B, L, E). Thread-safe without a cache.
  Tensor<E> forward(const Tensor<E>& x, const AttentionOptions& options = {}, KVCache<float>* cache = nullptr) const;
  // Training (no cache): the same forward (bit-identical output), also
  // filling `save_for_backward`; dropout (options.dropout_p) keeps the
  // elements the float module's kernels keep for the same dropout_seed.
  Tensor<E> forward(const Tensor<E>& x, const AttentionOptions& options,
                    NarrowGroupedQueryForwardContext<E>& save_for_backward) const;
  // Its backward: given d_output = dℓ/d(output), (B, L, E), dℓ/dx and dℓ/dθ
  // for every parameter under its state_dict name, each in E. Throws an
  // Error naming `context` if it is empty, comes from another module or
  // predates update_parameters(), or d_output if its shape is not the
  // output's.
  GroupedQueryAttentionGradients<E> backward(const NarrowGroupedQueryForwardContext<E>& context,
                                             const Tensor<E>& d_output) const;

 private:
  Tensor<E> run(const Tensor<E>& x, const AttentionOptions& options, KVCache<float>* cache,
                NarrowGroupedQueryForwardContext<E>* save) const;
  GroupedQueryAttentionConfig config_;
  GroupedQueryAttentionParameters<E> params_;
  // A process-unique token for this set of parameter values (as the float
  // module's); a context records it.
  uint64_t parameters_token_ = 0;
};

extern template class NarrowGroupedQueryAttention<bfloat16>;
extern template class NarrowGroupedQueryAttention<float16>;

}  // namespace multihead
