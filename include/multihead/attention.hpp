// multihead/attention.hpp: scaled dot-product attention, the single-head
// building block of the lesson:
//
//   Attention(Q, K, V) = softmax(Q Kᵀ · scale + mask) V,  scale = 1/√D
//
// Dimension legend used in every attention file:
//   B batch, L query (target) length, S key (source) length,
//   E embedding width, H heads, D head width (E / H).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "multihead/tensor.hpp"

namespace multihead {

// What a query row gets when every key is masked out (all scores are -inf).
//  - Zeros (default): the row's attention weights are 0 and its attention
//    output is 0, so a fully padded query yields the out-projection bias.
//    This matches PyTorch's scaled_dot_product_attention path in 2.x.
//  - NaN: softmax(-inf, …, -inf) = NaN, propagated to the weights, the output
//    and (through W^O) every feature of that token. This matches PyTorch's
//    need_weights path (torch.nn.MultiheadAttention in 1.13 always).
enum class MaskedRowPolicy { Zeros, NaN };

// Where the causal diagonal sits when L != S (see AttentionOptions).
//  - TopLeft: query i sees keys j <= i, as PyTorch's is_causal.
//  - BottomRight: the last query sees every key, j <= i + (S − L), as
//    FlashAttention and KV-cache decoding need.
enum class CausalAlignment { TopLeft, BottomRight };

// Which implementation computes softmax(QKᵀ·scale + mask)V. All of them share
// one internal interface (src/kernels/kernel.hpp) and agree within the
// tolerances documented in docs/semantics.md.
//  - Auto: the fastest available for the request.
//  - Reference: plain loops, never optimised; the oracle for the others.
//  - Materialized: scores as an L×S matrix per head, products through BLAS.
//  - Flash: tiled online softmax, never stores the L×S scores (float only;
//    scaled_dot_product_attention cannot return weights from it; the module
//    recomputes the weights it is asked for from each row's log-sum-exp,
//    ForwardOptions::weights_heads says how).
// The environment variable MULTIHEAD_KERNEL=reference|materialized|flash
// overrides Auto, so one binary can check itself.
enum class AttentionKernel { Auto, Reference, Materialized, Flash };

// A boolean or an additive (float) mask, as PyTorch accepts for attn_mask and
// key_padding_mask.
//  - boolean: nonzero means "may NOT attend" (becomes -inf), zero leaves the
//    score unchanged. Same convention as PyTorch's bool masks.
//  - additive: the value is added to the score (use -inf to forbid).
template <class T>
class Mask {
 public:
  static Mask boolean(Tensor<uint8_t> m) {
    Mask r;
    r.is_bool_ = true;
    r.bool_ = std::move(m);
    return r;
  }
  static Mask additive(Tensor<T> m) {
    Mask r;
    r.is_bool_ = false;
    r.float_ = std::move(m);
    return r;
  }
  bool is_bool() const { return is_bool_; }
  const Shape& shape() const { return is_bool_ ? bool_.shape() : float_.shape(); }
  const Tensor<uint8_t>& bool_values() const { return bool_; }
  const Tensor<T>& float_values() const { return float_; }
  // The mask as additive values: bool true -> -inf, false -> 0.
  Tensor<T> to_additive() const;

 private:
  bool is_bool_ = false;
  Tensor<uint8_t> bool_;
  Tensor<T> float_;
};

extern template class Mask<float>;
extern template class Mask<double>;

struct AttentionOptions {
  // Multiplies QKᵀ. Unset means 1/√D, as in the lesson and in PyTorch.
  std::optional<double> scale;
  // Query i may attend only to keys j <= i (top-left aligned when L != S,
  // like torch's is_causal). Combined with attn_mask when both are given.
  bool is_causal = false;
  // With is_causal: where the diagonal sits, and the position of query 0 in
  // a longer sequence. Query i may see key j iff
  //   j <= i + causal_query_offset + (BottomRight ? S − L : 0).
  CausalAlignment causal_alignment = CausalAlignment::TopLeft;
  int64_t causal_query_offset = 0;
  // The score variants (docs/semantics.md: the order of operations). Query i
  // sits at position p_i = i + causal_query_offset + (BottomRight ? S − L : 0)
  // whether or not is_causal is set; key j < S at position j. Keys PyTorch
  // appends (bias_k, the zero-attention key) have no position: no window
  // hides them and ALiBi adds nothing to them.
  //  - window w >= 1 (sliding-window / local attention): with is_causal,
  //    query i sees keys p_i − w < j <= p_i, w keys including its own
  //    position (as Hugging Face's Mistral masking and Mistral's reference
  //    code count; the paper's "between i − W and i" would be W + 1);
  //    without, keys |p_i − j| < w
  //    (2w − 1 positions centred on p_i). Unset = no window. At most 2^40.
  std::optional<int64_t> window;
  // Logit soft-capping (Gemma 2): s <- softcap·tanh(s / softcap) on the
  // scaled dot product, before any mask or bias is added. softcap in
  // [2^-126, 2^126] (the cap and 1/cap normal float32 numbers; beyond them
  // float32 would give NaN or no cap at all); unset = off.
  std::optional<double> softcap;
  // ALiBi (Press et al. 2022): −m_n·|p_i − j| added to the score of slice n.
  // The paper defines the causal case (j <= p_i); the symmetric bias of
  // non-causal attention is an extension.
  // Empty = off; otherwise one finite slope per slice (N values, slice n =
  // the flattened leading index). alibi_slopes(H) gives the paper's slopes
  // per head; MultiheadAttention applies them itself (ForwardOptions::alibi).
  std::vector<double> alibi_slopes;
  // Dropout on the attention weights, scaled by 1/(1-p) (PyTorch's rule).
  // Applied only when p > 0; the keep/drop decision for element
  // (slice, i, j) is a pure function of dropout_seed, so every kernel and
  // every thread count drops the same elements.
  double dropout_p = 0.0;
  uint64_t dropout_seed = 0;
  MaskedRowPolicy masked_rows = MaskedRowPolicy::Zeros;
  AttentionKernel kernel = AttentionKernel::Auto;
  // Threads for our own parallel loops; 0 = OpenMP's default. BLAS keeps
  // its own setting (the CLI's --threads sets both).
  int num_threads = 0;
  // Reject NaN/Inf in the inputs up front, naming the tensor and the index.
  bool check_finite = false;
};

// query (..., L, D), key (..., S, D), value (..., S, Dv), where "..." are the
// same leading dimensions for all three (no broadcasting; none at all is fine).
// attn_mask, if given, is (L, S) (shared by every slice) or (..., L, S).
// Returns (..., L, Dv). If attn_weights is not null it receives the
// post-softmax (and post-dropout) weights, (..., L, S). If lse is not null
// it receives each query row's log-sum-exp of its scores, (..., L) (−inf
// for a fully masked row): what the backward below needs.
template <class T>
Tensor<T> scaled_dot_product_attention(const Tensor<T>& query, const Tensor<T>& key,
                                       const Tensor<T>& value,
                                       const std::type_identity_t<Mask<T>>* attn_mask = nullptr,
                                       const AttentionOptions& options = {},
                                       Tensor<T>* attn_weights = nullptr, Tensor<T>* lse = nullptr);

// dℓ/d(query, key, value) of scaled_dot_product_attention, each of its
// input's shape.
template <class T>
struct SdpaGradients {
  Tensor<T> query, key, value;
};

// The backward of scaled_dot_product_attention: given the forward's inputs,
// attn_mask and options (the same ones: dropout's keep decisions are
// regenerated from options.dropout_seed), the output and lse it returned,
// and d_output = dℓ/d(output), (..., L, Dv). The kernels' own backward
// (the kernel options.kernel resolves to; any kernel's backward may follow
// any kernel's forward); the mask gets no gradient. Throws multihead::Error
// naming the tensor whose shape is wrong.
//   Tensor<float> lse;
//   auto out = scaled_dot_product_attention(q, k, v, mask, options, nullptr, &lse);
//   auto g = scaled_dot_product_attention_backward(q, k, v, mask, options, out, lse, d_out);
template <class T>
SdpaGradients<T> scaled_dot_product_attention_backward(const Tensor<T>& query, const Tensor<T>& key,
                                                       const Tensor<T>& value,
                                                       const std::type_identity_t<Mask<T>>* attn_mask,
                                                       const AttentionOptions& options, const Tensor<T>& output,
                                                       const Tensor<T>& lse, const Tensor<T>& d_output);

// The same in 16-bit storage (multihead/narrow.hpp): query, key, value and
// the result are bfloat16 (or float16); attn_mask stays a float mask (bool
// or additive). Q, K and V are widened to float32 in registers, the scores,
// softmax (its running max and sum) and the weighted sums are float32, and
// each output element is rounded once to nearest even (docs/precision.md:
// the error bound). Runs the flash kernel: options.kernel Auto or Flash;
// no attention weights. Every other option as for float.
// If lse is not null it receives each query row's log-sum-exp, (..., L),
// in float32 (never rounded: the backward below reads it).
Tensor<bfloat16> scaled_dot_product_attention(const Tensor<bfloat16>& query, const Tensor<bfloat16>& key,
                                              const Tensor<bfloat16>& value, const Mask<float>* attn_mask = nullptr,
                                              const AttentionOptions& options = {}, Tensor<float>* lse = nullptr);
Tensor<float16> scaled_dot_product_attention(const Tensor<float16>& query, const Tensor<float16>& key,
                                             const Tensor<float16>& value, const Mask<float>* attn_mask = nullptr,
                                             const AttentionOptions& options = {}, Tensor<float>* lse = nullptr);

// The 16-bit backward: the forward's inputs, mask and options, the
// (rounded) output and the float32 lse it returned, and d_output. Q, K, V,
// the output and d_output are widened to float32 (exact) in one buffer each,
// the float32 flash backward runs on them, and d_query, d_key, d_value are
// rounded once to nearest even (docs/precision.md: where, the bound, and
// what the float32 buffers cost). bf16 where the backward takes the matmul
// way (oneDNN's bf16 matmul on AMX; runtime.hpp, narrow_attention_force)
// reads the bf16 operands in place instead, with no float32 copies.
// Throws multihead::Error naming a tensor of the wrong shape.
SdpaGradients<bfloat16> scaled_dot_product_attention_backward(
    const Tensor<bfloat16>& query, const Tensor<bfloat16>& key, const Tensor<bfloat16>& value,
    const Mask<float>* attn_mask, const AttentionOptions& options, const Tensor<bfloat16>& output,
    const Tensor<float>& lse, const Tensor<bfloat16>& d_output);
SdpaGradients<float16> scaled_dot_product_attention_backward(
    const Tensor<float16>& query, const Tensor<float16>& key, const Tensor<float16>& value,
    const Mask<float>* attn_mask, const AttentionOptions& options, const Tensor<float16>& output,
    const Tensor<float>& lse, const Tensor<float16>& d_output);

// ALiBi's head slopes m_1 … m_H (Press et al. 2022). For H a power of two,
// m_h = 2^(−8h/H), h = 1..H. Otherwise, as the authors' code
// (ofirpress/attention_with_linear_biases, get_slopes): n = the largest
// power of two below H gives its n slopes, then the odd-numbered slopes
// m_1, m_3, … of the 2n-head sequence fill the remaining H − n.
// Throws multihead::Error if H < 1.
std::vector<double> alibi_slopes(int64_t heads);

// Name of a kernel ("reference", "materialized", "flash", "auto").
std::string to_string(AttentionKernel kernel);
// Parse a kernel name; throws multihead::Error on an unknown name.
AttentionKernel parse_attention_kernel(const std::string& name);

}  // namespace multihead
