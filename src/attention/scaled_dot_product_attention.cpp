// src/attention/scaled_dot_product_attention.cpp: the public single-head
// entry point, softmax(Q Kᵀ · scale + mask) V, over any leading dimensions.
//
// Legend: "..." leading dims flattened to N slices, L queries, S keys,
// D query/key width, Dv value width.
#include <cmath>
#include <limits>
#include <string>

#include "attention/attention_call.hpp"
#include "attention/kernel.hpp"
#include "core/check.hpp"
#include "multihead/attention.hpp"
#include "multihead/error.hpp"

namespace multihead {

template <class T>
Tensor<T> scaled_dot_product_attention(const Tensor<T>& query, const Tensor<T>& key,
                                       const Tensor<T>& value,
                                       const std::type_identity_t<Mask<T>>* attn_mask,
                                       const AttentionOptions& options, Tensor<T>* attn_weights) {
  detail::validate_attention_options(options);
  if (query.dim() < 2) detail::fail_shape("query", "(..., L, D) with at least 2 dimensions", query.shape());
  const int64_t r = query.dim();
  const int64_t L = query.size(-2);
  const int64_t D = query.size(-1);
  Shape lead(query.shape().begin(), query.shape().end() - 2);
  if (key.dim() != r) detail::fail_shape("key", "(..., S, " + std::to_string(D) + ") of rank " + std::to_string(r), key.shape());
  const int64_t S = key.size(-2);
  Shape key_expected = lead;
  key_expected.push_back(S);
  key_expected.push_back(D);
  detail::expect_shape("key", key.shape(), key_expected);
  if (value.dim() != r) detail::fail_shape("value", "(..., " + std::to_string(S) + ", Dv) of rank " + std::to_string(r), value.shape());
  const int64_t Dv = value.size(-1);
  Shape value_expected = lead;
  value_expected.push_back(S);
  value_expected.push_back(Dv);
  detail::expect_shape("value", value.shape(), value_expected);
  const int64_t N = shape_numel(lead);

  Tensor<T> additive;
  int64_t mask_stride = 0;
  if (attn_mask) {
    Shape full = lead;
    full.push_back(L);
    full.push_back(S);
    if (attn_mask->shape() == Shape{L, S}) {
      mask_stride = 0;
    } else if (attn_mask->shape() == full) {
      mask_stride = L * S;
    } else {
      detail::fail_shape("attn_mask", shape_to_string({L, S}) + " or " + shape_to_string(full),
                         attn_mask->shape());
    }
    additive = attn_mask->to_additive();
  }
  if (options.check_finite) {
    detail::check_finite("query", query);
    detail::check_finite("key", key);
    detail::check_finite("value", value);
  }

  Shape out_shape = lead;
  out_shape.push_back(L);
  out_shape.push_back(Dv);
  Tensor<T> out(out_shape);
  if (attn_weights) {
    Shape w_shape = lead;
    w_shape.push_back(L);
    w_shape.push_back(S);
    *attn_weights = Tensor<T>(w_shape);
  }
  detail::AttentionShape shape;
  shape.slices = N;
  shape.q_len = L;
  shape.kv_len = S;
  shape.head_dim = D;
  shape.value_dim = Dv;
  shape.causal_cols = S;
  detail::AttentionTensors<T> tensors;
  tensors.q = query.data();
  tensors.k = key.data();
  tensors.v = value.data();
  tensors.attn_mask = attn_mask ? additive.data() : nullptr;
  tensors.attn_mask_slice_stride = mask_stride;
  tensors.out = out.data();
  tensors.weights = attn_weights ? attn_weights->data() : nullptr;
  const detail::AttentionArgs<T> a = detail::make_attention_args(shape, tensors, options);
  detail::attention_forward(a, options.kernel);
  return out;
}

template Tensor<float> scaled_dot_product_attention<float>(const Tensor<float>&, const Tensor<float>&,
                                                           const Tensor<float>&, const Mask<float>*,
                                                           const AttentionOptions&, Tensor<float>*);
template Tensor<double> scaled_dot_product_attention<double>(const Tensor<double>&, const Tensor<double>&,
                                                             const Tensor<double>&, const Mask<double>*,
                                                             const AttentionOptions&, Tensor<double>*);

}  // namespace multihead
