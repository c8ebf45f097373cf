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
#include <mutex>
#include <utility>

#include "attention/attention_call.hpp"
#include "attention/mha_plan.hpp"
#include "attention/narrow_saved_forward.hpp"
#include "attention/narrow_convert.hpp"
#include "core/check.hpp"
#include "core/gemm.hpp"
#include "core/linear.hpp"
#include "core/narrow_rows.hpp"
#include "core/parameters.hpp"
#include "core/thread_scratch.hpp"
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

namespace detail {

// A 16-bit module's projection weights widened exactly to float32, as
// stored (NarrowMultiheadAttention::keep_float32_weights): in_proj_weight,
// or q/k/v_proj_weight, and out_proj.weight. Filled once, under `once`.
struct FloatWeightCopies {
  std::once_flag once;
  Storage<float> in_proj, q_proj, k_proj, v_proj, out_proj;

  std::size_t bytes() const {
    return (in_proj.size() + q_proj.size() + k_proj.size() + v_proj.size() + out_proj.size()) * sizeof(float);
  }
  template <class E>
  void fill(const MultiheadAttentionConfig& config, const MultiheadAttentionParameters<E>& p, int threads) {
    const auto copy = [&](const Tensor<E>& t) { return widened(t.data(), static_cast<std::size_t>(t.numel()), threads); };
    if (config.same_embed_dim()) {
      in_proj = copy(p.in_proj_weight);
    } else {
      q_proj = copy(p.q_proj_weight);
      k_proj = copy(p.k_proj_weight);
      v_proj = copy(p.v_proj_weight);
    }
    out_proj = copy(p.out_proj_weight);
  }
};

}  // namespace detail

template <class E>
NarrowMultiheadAttention<E>::NarrowMultiheadAttention(const MultiheadAttentionConfig& config,
                                                      MultiheadAttentionParameters<E> parameters)
    : config_(config), params_(std::move(parameters)), float_weights_(std::make_shared<detail::FloatWeightCopies>()) {
  config_.validate();
  detail::check_parameters(config_, params_);
  parameters_token_ = detail::new_parameters_token();
}

template <class E>
void NarrowMultiheadAttention<E>::keep_float32_weights(bool keep) {
  keep_float32_weights_ = keep;
  float_weights_ = std::make_shared<detail::FloatWeightCopies>();  // copies held (if any) are freed
}

template <class E>
std::size_t NarrowMultiheadAttention<E>::float32_weight_bytes() const {
  return float_weights_ ? float_weights_->bytes() : 0;
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
    s->query = query;
    s->key = key;
    s->value = value;
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

  // Where no 16-bit matmul runs, every product is the float32 product of
  // exact float32 copies of its operands (core/gemm.hpp). The weights' copies
  // are then made once and kept (keep_float32_weights), and each distinct
  // input is widened once for the products that read it (self-attention:
  // one copy for three), instead of every product widening both operands
  // again: the same copies, so the same bits.
  // Not kept (keep_float32_weights(false)), each product widens its own
  // operands (core/linear.hpp's 16-bit layer): the reference way.
  const detail::FloatWeightCopies* fw = nullptr;
  if (keep_float32_weights_ && !detail::native_16bit_gemm<E>()) {
    detail::FloatWeightCopies& kept = *float_weights_;
    std::call_once(kept.once, [&] { kept.fill(config_, params_, options.attention.num_threads); });
    fw = &kept;
  }
  // One exact float32 copy of x (rows × cols, packed), in this thread's
  // scratch for `slot`.
  const auto widen_input = [&](const Tensor<E>& x, int slot) -> const float* {
    thread_local detail::ThreadScratch scratch[3];
    float* dst = scratch[slot].take(static_cast<std::size_t>(x.numel()));
    detail::widen_rows(x.data(), 1, x.numel(), x.numel(), dst, x.numel(), options.attention.num_threads);
    return dst;
  };
  const auto project = [&](const Tensor<E>& x, const float* x_widened, int64_t tokens, const LinearWeight<E>& w,
                           const float* w_widened, const E* b, E* y) {
    if (fw == nullptr) return detail::linear_forward(LinearRows<E>{tokens, x.data(), 0}, w, b, y, 0, lo);
    detail::linear_forward_widened(LinearRows<float>{tokens, x_widened, 0},
                                   LinearWeight<float>::stored(w_widened, w.out, w.in), b, y, 0, lo);
  };

  // 1. in_projection, rows in the caller's token order.
  // A training forward's buffers move into its context; a plain forward's
  // are this thread's, kept between calls (a first-touched page costs
  // ~13 µs: attention/workspace.hpp), and grown, never shrunk.
  thread_local Storage<E> kept_q, kept_k, kept_v, kept_attn;
  Storage<E> own_q, own_k, own_v, own_attn;
  const auto buffer = [&](Storage<E>& own, Storage<E>& kept, int64_t n) -> Storage<E>& {
    Storage<E>& b = s ? own : kept;
    if (b.size() < static_cast<std::size_t>(n)) b.resize(static_cast<std::size_t>(n));
    return b;
  };
  Storage<E>& q = buffer(own_q, kept_q, q_tokens * E_);
  Storage<E>& k = buffer(own_k, kept_k, kv_tokens * E_);
  Storage<E>& v = buffer(own_v, kept_v, kv_tokens * E_);
  const float *xq = nullptr, *xk = nullptr, *xv = nullptr, *wq_f = nullptr, *wk_f = nullptr, *wv_f = nullptr;
  if (fw != nullptr) {
    const auto same = [](const Tensor<E>& a, const Tensor<E>& b) { return a.data() == b.data() && a.shape() == b.shape(); };
    xq = widen_input(query, 0);
    xk = same(key, query) ? xq : widen_input(key, 1);
    xv = same(value, query) ? xq : same(value, key) ? xk : widen_input(value, 2);
    wq_f = packed ? fw->in_proj.data() : fw->q_proj.data();
    wk_f = packed ? fw->in_proj.data() + E_ * E_ : fw->k_proj.data();
    wv_f = packed ? fw->in_proj.data() + 2 * E_ * E_ : fw->v_proj.data();
  }
  project(query, xq, q_tokens, wq, wq_f, b_in, q.data());
  project(key, xk, kv_tokens, wk, wk_f, b_in ? b_in + E_ : nullptr, k.data());
  project(value, xv, kv_tokens, wv, wv_f, b_in ? b_in + 2 * E_ : nullptr, v.data());

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
  Storage<E>& attn = buffer(own_attn, kept_attn, q_tokens * E_);
  Storage<float> lse(s ? static_cast<std::size_t>(p.B * p.H * p.L) : 0);
  detail::AttentionArgs<float> args = detail::narrow_attention_args(config_, p, options, masks);
  args.narrow = {compute_dtype_of<E>(), q.data(), k_base, v_base, attn.data()};
  args.lse = s ? lse.data() : nullptr;
  detail::attention_forward(args, options.attention.kernel);

  // 4. out_projection, in the same token order as the query (so the output
  // has the query's layout).
  {
    const Tensor<E> concat_view = Tensor<E>::view(Shape{q_tokens, E_}, attn.data());
    project(concat_view, fw != nullptr ? widen_input(concat_view, 0) : nullptr, q_tokens,
            LinearWeight<E>::stored(params_.out_proj_weight.data(), E_, E_), fw != nullptr ? fw->out_proj.data() : nullptr,
            config_.bias ? params_.out_proj_bias.data() : nullptr, output.data());
  }
  if (s) {
    s->masks = std::move(masks);
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
  float_weights_ = std::make_shared<detail::FloatWeightCopies>();  // widened from the new values when next needed
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
