// src/attention/narrow_multihead_attention.cpp: the 16-bit module's forward
// (multihead/narrow_multihead_attention.hpp), the fused form of
// multihead_attention_forward.cpp in 16-bit storage:
//
//   1. in_projection:  Q = round(X_q W_qᵀ + b_q), K, V likewise  (core/linear)
//   2. split_heads:    strided views of Q, K, V (SliceLayout), no copy; with
//                      bias_k or the zero-attention key, K and V are copied
//                      to (B, S', E) with those rows appended
//   3. scaled_dot_product_attention: the flash kernel on 16-bit operands,
//      writing the merged heads (tokens, E), rounded
//   4. out_projection: output = round(concat W^Oᵀ + b^O)
//
// Legend: B batch, L query length, S key length, S' = S (+1 bias_k)
// (+1 zero attention), E embed_dim, H heads, D head width, Ek kdim, Ev vdim.
#include "multihead/narrow_multihead_attention.hpp"

#include <algorithm>
#include <utility>

#include "attention/attention_call.hpp"
#include "attention/mha_plan.hpp"
#include "attention/narrow_saved_forward.hpp"
#include "core/check.hpp"
#include "core/linear.hpp"
#include "core/parameters.hpp"
#include "kernels/kernel.hpp"
#include "multihead/error.hpp"

namespace multihead {

template <class E>
Tensor<E> round_to(const Tensor<float>& t) {
  Storage<E> out(static_cast<std::size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<std::size_t>(i)] = narrow_from_float<E>(t[i]);
  return Tensor<E>(t.shape(), std::move(out));
}

template <class To, class E>
Tensor<To> widen(const Tensor<E>& t) {
  Storage<To> out(static_cast<std::size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<std::size_t>(i)] = static_cast<To>(to_float(t[i]));
  return Tensor<To>(t.shape(), std::move(out));
}

template <class E>
NarrowMultiheadAttention<E>::NarrowMultiheadAttention(const MultiheadAttentionConfig& config,
                                                      MultiheadAttentionParameters<E> parameters)
    : config_(config), params_(std::move(parameters)) {
  config_.validate();
  detail::check_parameters(config_, params_);
  parameters_token_ = detail::new_parameters_token();
}

template <class E>
NarrowMultiheadAttention<E> NarrowMultiheadAttention<E>::rounded(const MultiheadAttentionConfig& config,
                                                                 const MultiheadAttentionParameters<float>& parameters) {
  MultiheadAttentionParameters<E> p;
  detail::multihead_attention_parameter_table(config, [&](const ParameterInfo& info, auto get) {
    if (info.present) get(p) = round_to<E>(get(parameters));
  });
  return NarrowMultiheadAttention(config, std::move(p));
}

template <class E>
std::map<std::string, Tensor<E>> NarrowMultiheadAttention<E>::state_dict() const {
  return detail::parameter_map<E>(config_, params_);
}

namespace detail {

AttentionArgs<float> narrow_attention_args(const MultiheadAttentionConfig& config, const ForwardPlan& p,
                                           const ForwardOptions<float>& options, const KernelMasks<float>& masks) {
  const int64_t E_ = p.E, D = p.D;
  // split_heads: slice n = b·H + h reads columns [h·D, (h+1)·D) of the
  // rows of batch entry b, as the plan's token strides find them.
  AttentionTensors<float> tensors;
  tensors.q_layout = SliceLayout{p.q_batch_stride * E_, D, p.q_seq_stride * E_};
  tensors.out_layout = tensors.q_layout;
  if (p.S_total == p.S) {
    tensors.k_layout = tensors.v_layout = SliceLayout{p.kv_batch_stride * E_, D, p.kv_seq_stride * E_};
  } else {
    tensors.k_layout = tensors.v_layout = SliceLayout{p.S_total * E_, D, E_};  // (B, S', E) copies
  }
  tensors.attn_mask = masks.attn_mask.empty() ? nullptr : masks.attn_mask.data();
  tensors.attn_mask_slice_stride = masks.attn_mask_slice_stride;
  tensors.key_padding = masks.key_padding.empty() ? nullptr : masks.key_padding.data();
  tensors.alibi_slopes = masks.alibi_slopes.empty() ? nullptr : masks.alibi_slopes.data();
  AttentionShape shape;
  shape.slices = p.B * p.H;
  shape.heads = p.H;
  shape.q_len = p.L;
  shape.kv_len = p.S_total;
  shape.causal_cols = p.S;
  shape.head_dim = shape.value_dim = D;
  return make_attention_args(shape, tensors, module_attention_options(config, options));
}

}  // namespace detail

template <class E>
Tensor<E> NarrowMultiheadAttention<E>::forward(const Tensor<E>& query, const Tensor<E>& key, const Tensor<E>& value,
                                               const ForwardOptions<float>& options) const {
  return run_forward(query, key, value, options, nullptr);
}

template <class E>
Tensor<E> NarrowMultiheadAttention<E>::forward(const Tensor<E>& query, const Tensor<E>& key, const Tensor<E>& value,
                                               const ForwardOptions<float>& options,
                                               NarrowForwardContext<E>& save_for_backward) const {
  return run_forward(query, key, value, options, &save_for_backward);
}

template <class E>
Tensor<E> NarrowMultiheadAttention<E>::run_forward(const Tensor<E>& query, const Tensor<E>& key,
                                                   const Tensor<E>& value, const ForwardOptions<float>& options,
                                                   NarrowForwardContext<E>* save) const {
  using detail::LinearRows;
  using detail::LinearWeight;
  if (options.need_weights)
    throw Error(Error::Kind::Value, "need_weights: expected false (the " + to_string(compute_dtype_of<E>()) +
                                        " module runs the flash kernel, which returns no attention weights), got true");
  const detail::ForwardPlan p = detail::plan_forward(config_, query, key, value, options);
  if (options.attention.check_finite) {
    detail::check_finite("query", query);
    detail::check_finite("key", key);
    detail::check_finite("value", value);
    for_each_parameter(config_, params_,
                       [](const ParameterInfo& info, const Tensor<E>& t) { detail::check_finite(info.name, t); });
  }
  // A training forward fills the context as it goes: a throw below leaves
  // it empty, never half filled.
  detail::NarrowSavedForward<E>* s = nullptr;
  if (save) {
    save->saved_ = std::make_unique<detail::NarrowSavedForward<E>>();
    s = save->saved_.get();
    s->plan = p;
    s->options = options;
    s->options.attn_mask = s->options.key_padding_mask = nullptr;
    s->query_shape = query.shape();
  }
  Tensor<E> output(detail::output_shape(p, query.shape()));
  if (p.B == 0 || p.L == 0) {
    if (s) {
      s->parameters_token = parameters_token_;
      s->filled = true;
    }
    return output;
  }
  const int64_t E_ = p.E;
  const int64_t q_tokens = p.B * p.L, kv_tokens = p.B * p.S;
  const bool packed = config_.same_embed_dim();
  const E* b_in = config_.bias ? params_.in_proj_bias.data() : nullptr;
  const LinearWeight<E> wq = LinearWeight<E>::stored(packed ? params_.in_proj_weight.data() : params_.q_proj_weight.data(), E_, E_);
  const LinearWeight<E> wk = LinearWeight<E>::stored(
      packed ? params_.in_proj_weight.data() + E_ * E_ : params_.k_proj_weight.data(), E_, p.Ek);
  const LinearWeight<E> wv = LinearWeight<E>::stored(
      packed ? params_.in_proj_weight.data() + 2 * E_ * E_ : params_.v_proj_weight.data(), E_, p.Ev);
  const detail::LinearOptions lo{false, options.attention.num_threads};

  // 1. in_projection, rows in the caller's token order.
  Storage<E> q(static_cast<std::size_t>(q_tokens * E_)), k(static_cast<std::size_t>(kv_tokens * E_)),
      v(static_cast<std::size_t>(kv_tokens * E_));
  detail::linear_forward(LinearRows<E>{q_tokens, query.data(), 0}, wq, b_in, q.data(), 0, lo);
  detail::linear_forward(LinearRows<E>{kv_tokens, key.data(), 0}, wk, b_in ? b_in + E_ : nullptr, k.data(), 0, lo);
  detail::linear_forward(LinearRows<E>{kv_tokens, value.data(), 0}, wv, b_in ? b_in + 2 * E_ : nullptr, v.data(), 0, lo);

  // 2. split_heads (narrow_attention_args: the layouts). With extra key
  // rows, K and V are copied to (B, S', E): the projected keys of entry b,
  // then bias_k, then zeros.
  Storage<E> k_ext, v_ext;
  if (p.S_total != p.S) {
    k_ext.assign(static_cast<std::size_t>(p.B * p.S_total * E_), E{});
    v_ext.assign(static_cast<std::size_t>(p.B * p.S_total * E_), E{});
    for (int64_t b = 0; b < p.B; ++b) {
      for (int64_t j = 0; j < p.S; ++j) {
        const int64_t src = (b * p.kv_batch_stride + j * p.kv_seq_stride) * E_, dst = (b * p.S_total + j) * E_;
        std::copy(k.data() + src, k.data() + src + E_, k_ext.data() + dst);
        std::copy(v.data() + src, v.data() + src + E_, v_ext.data() + dst);
      }
      if (p.bias_kv_col >= 0) {
        const int64_t dst = (b * p.S_total + p.bias_kv_col) * E_;
        std::copy(params_.bias_k.data(), params_.bias_k.data() + E_, k_ext.data() + dst);
        std::copy(params_.bias_v.data(), params_.bias_v.data() + E_, v_ext.data() + dst);
      }
      // The zero-attention row stays the zeros assign() wrote.
    }
  }
  const E* k_base = k_ext.empty() ? k.data() : k_ext.data();
  const E* v_base = v_ext.empty() ? v.data() : v_ext.data();
  detail::KernelMasks<float> masks = detail::build_kernel_masks(p, options);

  // 3. attention, writing the merged heads (q_tokens, E) in token order,
  // and each row's log-sum-exp when training.
  Storage<E> attn(static_cast<std::size_t>(q_tokens * E_));
  Storage<float> lse(s ? static_cast<std::size_t>(p.B * p.H * p.L) : 0);
  detail::AttentionArgs<float> args = detail::narrow_attention_args(config_, p, options, masks);
  args.narrow = {compute_dtype_of<E>(), q.data(), k_base, v_base, attn.data()};
  args.lse = s ? lse.data() : nullptr;
  detail::attention_forward(args, options.attention.kernel);

  // 4. out_projection, in the same token order as the query (so the output
  // has the query's layout).
  detail::linear_forward(LinearRows<E>{q_tokens, attn.data(), 0},
                         LinearWeight<E>::stored(params_.out_proj_weight.data(), E_, E_),
                         config_.bias ? params_.out_proj_bias.data() : nullptr, output.data(), 0, lo);
  if (s) {
    s->masks = std::move(masks);
    s->query = query;
    s->key = key;
    s->value = value;
    s->q = std::move(q);
    s->k = std::move(k);
    s->v = std::move(v);
    s->k_ext = std::move(k_ext);
    s->v_ext = std::move(v_ext);
    s->concat = std::move(attn);
    s->lse = std::move(lse);
    s->parameters_token = parameters_token_;
    s->filled = true;
  }
  return output;
}

template <class E>
void NarrowMultiheadAttention<E>::update_parameters(
    const std::function<void(const std::string& name, Tensor<E>& parameter)>& update) {
  // On a copy, installed only once every tensor has passed the checks.
  MultiheadAttentionParameters<E> next = params_;
  detail::update_present(config_, next, update);
  params_ = std::move(next);
  parameters_token_ = detail::new_parameters_token();  // contexts filled before are stale now
}

template class NarrowMultiheadAttention<bfloat16>;
template class NarrowMultiheadAttention<float16>;
template Tensor<bfloat16> round_to<bfloat16>(const Tensor<float>&);
template Tensor<float16> round_to<float16>(const Tensor<float>&);
template Tensor<float> widen<float, bfloat16>(const Tensor<bfloat16>&);
template Tensor<float> widen<float, float16>(const Tensor<float16>&);
template Tensor<double> widen<double, bfloat16>(const Tensor<bfloat16>&);
template Tensor<double> widen<double, float16>(const Tensor<float16>&);

}  // namespace multihead
