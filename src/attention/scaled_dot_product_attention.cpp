// src/attention/scaled_dot_product_attention.cpp: the public single-head
// entry point, softmax(Q Kᵀ · scale + mask) V, over any leading dimensions.
//
// Legend: "..." leading dims flattened to N slices, L queries, S keys,
// D query/key width, Dv value width.
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "attention/attention_call.hpp"
#include "core/check.hpp"
#include "kernels/kernel.hpp"
#include "multihead/attention.hpp"
#include "multihead/error.hpp"

namespace multihead {

namespace detail {
namespace {

// "..." followed by the given trailing dimensions.
Shape with_tail(const Shape& lead, int64_t a, int64_t b) {
  Shape s = lead;
  s.push_back(a);
  s.push_back(b);
  return s;
}

// The sizes of a call, checked: query (..., L, D), key (..., S, D),
// value (..., S, Dv).
struct SdpaDims {
  Shape lead;
  int64_t L, S, D, Dv;
};

template <class T>
SdpaDims check_dims(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value) {
  if (query.dim() < 2) fail_shape("query", "(..., L, D) with at least 2 dimensions", query.shape());
  const int64_t r = query.dim();
  SdpaDims d{Shape(query.shape().begin(), query.shape().end() - 2), query.size(-2), 0, query.size(-1), 0};
  const std::string rank = " of rank " + std::to_string(r);
  if (key.dim() != r) fail_shape("key", "(..., S, " + std::to_string(d.D) + ")" + rank, key.shape());
  d.S = key.size(-2);
  expect_shape("key", key.shape(), with_tail(d.lead, d.S, d.D));
  if (value.dim() != r) fail_shape("value", "(..., " + std::to_string(d.S) + ", Dv)" + rank, value.shape());
  d.Dv = value.size(-1);
  expect_shape("value", value.shape(), with_tail(d.lead, d.S, d.Dv));
  return d;
}

// attn_mask as additive values, and its slice stride: (L, S) is shared by
// every slice (stride 0), (..., L, S) has one per slice.
template <class T>
int64_t check_mask(const SdpaDims& d, const Mask<T>& mask) {
  if (mask.shape() == Shape{d.L, d.S}) return 0;
  const Shape full = with_tail(d.lead, d.L, d.S);
  if (mask.shape() != full)
    fail_shape("attn_mask", shape_to_string({d.L, d.S}) + " or " + shape_to_string(full), mask.shape());
  return d.L * d.S;
}

// The one call of the kernel, for every storage type: E = T (float,
// double) or 16-bit E with float T (args.narrow).
template <class T, class E>
Tensor<E> sdpa_call(const Tensor<E>& query, const Tensor<E>& key, const Tensor<E>& value, const Mask<T>* attn_mask,
                    const AttentionOptions& options, Tensor<T>* attn_weights) {
  constexpr bool narrow = !std::is_same_v<T, E>;
  validate_attention_options(options);
  const SdpaDims d = check_dims(query, key, value);
  AttentionTensors<T> tensors;
  Tensor<T> additive;
  if (attn_mask) {
    tensors.attn_mask_slice_stride = check_mask(d, *attn_mask);
    additive = attn_mask->to_additive();
    tensors.attn_mask = additive.data();
  }
  if (options.check_finite) {
    check_finite("query", query);
    check_finite("key", key);
    check_finite("value", value);
  }
  Tensor<E> out(with_tail(d.lead, d.L, d.Dv));
  if (attn_weights) *attn_weights = Tensor<T>(with_tail(d.lead, d.L, d.S));
  AttentionShape shape;
  shape.slices = shape_numel(d.lead);
  shape.q_len = d.L;
  shape.kv_len = shape.causal_cols = d.S;
  shape.head_dim = d.D;
  shape.value_dim = d.Dv;
  std::vector<T> slopes(options.alibi_slopes.begin(), options.alibi_slopes.end());
  if (!slopes.empty()) {
    if (static_cast<int64_t>(slopes.size()) != shape.slices)
      throw Error(Error::Kind::Shape, "alibi_slopes: expected one slope per slice, " +
                                          std::to_string(shape.slices) + " (the product of the leading dims), got " +
                                          std::to_string(slopes.size()));
    tensors.alibi_slopes = slopes.data();
  }
  if constexpr (!narrow) {
    tensors.q = query.data();
    tensors.k = key.data();
    tensors.v = value.data();
    tensors.out = out.data();
  }
  tensors.weights = attn_weights ? attn_weights->data() : nullptr;
  AttentionArgs<T> args = make_attention_args(shape, tensors, options);
  if constexpr (narrow) args.narrow = {compute_dtype_of<E>(), query.data(), key.data(), value.data(), out.data()};
  attention_forward(args, options.kernel);
  return out;
}

}  // namespace
}  // namespace detail

template <class T>
Tensor<T> scaled_dot_product_attention(const Tensor<T>& query, const Tensor<T>& key,
                                       const Tensor<T>& value,
                                       const std::type_identity_t<Mask<T>>* attn_mask,
                                       const AttentionOptions& options, Tensor<T>* attn_weights) {
  return detail::sdpa_call<T, T>(query, key, value, attn_mask, options, attn_weights);
}

Tensor<bfloat16> scaled_dot_product_attention(const Tensor<bfloat16>& query, const Tensor<bfloat16>& key,
                                              const Tensor<bfloat16>& value, const Mask<float>* attn_mask,
                                              const AttentionOptions& options) {
  return detail::sdpa_call<float, bfloat16>(query, key, value, attn_mask, options, nullptr);
}

Tensor<float16> scaled_dot_product_attention(const Tensor<float16>& query, const Tensor<float16>& key,
                                             const Tensor<float16>& value, const Mask<float>* attn_mask,
                                             const AttentionOptions& options) {
  return detail::sdpa_call<float, float16>(query, key, value, attn_mask, options, nullptr);
}

template Tensor<float> scaled_dot_product_attention<float>(const Tensor<float>&, const Tensor<float>&,
                                                           const Tensor<float>&, const Mask<float>*,
                                                           const AttentionOptions&, Tensor<float>*);
template Tensor<double> scaled_dot_product_attention<double>(const Tensor<double>&, const Tensor<double>&,
                                                             const Tensor<double>&, const Mask<double>*,
                                                             const AttentionOptions&, Tensor<double>*);

}  // namespace multihead
