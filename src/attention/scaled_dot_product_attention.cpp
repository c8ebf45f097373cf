// src/attention/scaled_dot_product_attention.cpp: the public single-head
// entry point, softmax(Q Kᵀ · scale + mask) V, over any leading dimensions.
//
// Legend: "..." leading dims flattened to N slices, L queries, S keys,
// D query/key width, Dv value width.
#include <cmath>
#include <limits>
#include <string>

#include "attention/kernel.hpp"
#include "core/check.hpp"
#include "multihead/attention.hpp"
#include "multihead/error.hpp"

namespace multihead {

template <class T>
Tensor<T> Mask<T>::to_additive() const {
  if (!is_bool_) return float_;
  Tensor<T> out(bool_.shape());
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < out.numel(); ++i) out[i] = bool_[i] ? neg_inf : T(0);
  return out;
}

template class Mask<float>;
template class Mask<double>;

std::string to_string(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::Auto: return "auto";
    case AttentionKernel::Reference: return "reference";
    case AttentionKernel::Materialized: return "materialized";
    case AttentionKernel::Flash: return "flash";
  }
  return "auto";
}

AttentionKernel parse_attention_kernel(const std::string& name) {
  for (AttentionKernel k : {AttentionKernel::Auto, AttentionKernel::Reference,
                            AttentionKernel::Materialized, AttentionKernel::Flash})
    if (name == to_string(k)) return k;
  throw Error(Error::Kind::Value, "kernel: expected one of auto, reference, materialized, flash; got '" +
                                      name + "'");
}

namespace detail {

void validate_attention_options(const AttentionOptions& o) {
  if (!(o.dropout_p >= 0.0 && o.dropout_p <= 1.0))
    throw Error(Error::Kind::Value,
                "dropout_p: expected a probability in [0, 1], got " + detail::format_number(o.dropout_p));
  if (o.scale && !std::isfinite(*o.scale))
    throw Error(Error::Kind::Value, "scale: expected a finite number, got " + detail::format_number(*o.scale));
  if (o.num_threads < 0)
    throw Error(Error::Kind::Value,
                "num_threads: expected 0 (default) or more, got " + std::to_string(o.num_threads));
}

}  // namespace detail

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
  detail::AttentionArgs<T> a;
  a.slices = N;
  a.heads = 1;
  a.q_len = L;
  a.kv_len = S;
  a.head_dim = D;
  a.value_dim = Dv;
  a.q = query.data();
  a.k = key.data();
  a.v = value.data();
  a.attn_mask = attn_mask ? additive.data() : nullptr;
  a.attn_mask_slice_stride = mask_stride;
  a.is_causal = options.is_causal;
  a.causal_cols = S;
  a.scale = static_cast<T>(options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(D)));
  a.dropout_p = options.dropout_p;
  a.dropout_seed = options.dropout_seed;
  a.masked_rows = options.masked_rows;
  a.num_threads = options.num_threads;
  a.out = out.data();
  a.weights = attn_weights ? attn_weights->data() : nullptr;
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
