// src/explain/attention_weights.cpp: where the reports take their weights
// from. One function: the module's fused forward on the flash kernel, whose
// weights are recomputed from each row's log-sum-exp
// (src/simd/flash_weights-inl.h; ForwardOptions::weights_heads says when),
// not the materialized fallback. A double module has no flash kernel and
// takes the materialized kernel's weights.
//
// Legend: B batch, H heads, L queries, S' keys (S plus bias_k and the
// zero-attention key when the module adds them), E embed_dim.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>

#include "core/check.hpp"
#include "multihead/error.hpp"
#include "multihead/explain.hpp"

namespace multihead::explain {

template <class T>
LayerAttention attention_weights_per_head(const BasicMultiheadAttention<T>& module, const Tensor<T>& input,
                                          int64_t batch, const std::string& input_what) {
  const MultiheadAttentionConfig& config = module.config();
  // A report draws distributions: NaN or Inf in the input or the module's
  // parameters is refused up front, naming the tensor and the index.
  detail::check_finite(input_what, input);
  ForwardOptions<T> options;
  options.attention.check_finite = true;  // the parameters (the input passed above)
  options.need_weights = true;
  options.average_attn_weights = false;  // (B, H, L, S'): every head's own distribution
  // Flash forward + the weights recompute (MULTIHEAD_KERNEL still forces
  // another kernel, e.g. the reference, to check the report against it).
  if constexpr (std::is_same_v<T, float>) options.attention.kernel = AttentionKernel::Flash;
  const ForwardResult<T> result = module.forward(input, input, input, options);
  const Tensor<T>& w = *result.attn_weights;

  const bool batched = w.dim() == 4;
  const int64_t B = batched ? w.size(0) : 1;
  if (batch < 0 || batch >= B)
    throw Error(Error::Kind::Value, "batch: expected an entry 0 to " + std::to_string(B - 1) +
                                        " of the input's batch of " + std::to_string(B) + ", got " +
                                        std::to_string(batch));
  LayerAttention layer;
  layer.name = "layer 1";
  layer.heads = config.num_heads;
  layer.queries = w.size(-2);
  layer.keys = w.size(-1);
  const int64_t per_entry = layer.heads * layer.queries * layer.keys;
  const T* first = w.data() + batch * per_entry;
  // Finite inputs and parameters can still overflow T in the projections or
  // the scores; such a row is no distribution to draw.
  for (int64_t k = 0; k < per_entry; ++k) {
    if (std::isfinite(first[k])) continue;
    T largest = 0;
    for (int64_t i = 0; i < input.numel(); ++i) largest = std::max(largest, std::abs(input[i]));
    char big[32];
    std::snprintf(big, sizeof big, "%.3g", static_cast<double>(largest));
    const int64_t head = k / (layer.queries * layer.keys), query = k / layer.keys % layer.queries;
    throw Error(Error::Kind::Value,
                input_what + ": head " + std::to_string(head) + "'s attention weights at query " +
                    std::to_string(query) + " are not finite: the projections or scores overflow " +
                    (sizeof(T) == 8 ? "float64" : "float32") + " (its largest |value| is " + big +
                    "); scale it down");
  }
  layer.weights.assign(first, first + per_entry);
  return layer;
}

template LayerAttention attention_weights_per_head(const BasicMultiheadAttention<float>&, const Tensor<float>&,
                                                   int64_t, const std::string&);
template LayerAttention attention_weights_per_head(const BasicMultiheadAttention<double>&, const Tensor<double>&,
                                                   int64_t, const std::string&);

}  // namespace multihead::explain
