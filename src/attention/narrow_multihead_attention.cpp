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
#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "attention/attention_call.hpp"
#include "attention/mha_plan.hpp"
#include "attention/narrow_saved_forward.hpp"
#include "attention/narrow_convert.hpp"
#include "core/check.hpp"
#include "core/gemm.hpp"
#include "core/linear.hpp"
#include "core/narrow_rows.hpp"
#include "core/parallel.hpp"
#include "core/parameters.hpp"
#include "core/thread_scratch.hpp"
#include "kernels/kernel.hpp"
#include "simd/narrow_types.hpp"
#include "multihead/error.hpp"

namespace multihead {

template <class E>
Tensor<E> round_to(const Tensor<float>& t) {
  // narrow_from_float's rule, vectorised and split across the library's
  // threads (core/narrow_rows.hpp: the same bits on every target and
  // thread count). The Python module rounds every float32 argument of a
  // 16-bit call with this.
  Storage<E> out(static_cast<std::size_t>(t.numel()));
  detail::round_rows(t.data(), 1, t.numel(), t.numel(), static_cast<const E*>(nullptr), out.data(), t.numel(), 0);
  return Tensor<E>(t.shape(), std::move(out));
}

template <class E>
Tensor<E> round_to(const Tensor<float>& t, const std::string& name) {
  if constexpr (std::is_same_v<E, float16>)
    for (int64_t e = 0; e < t.numel(); ++e)
      if (std::isfinite(t.data()[e]) && !(std::fabs(t.data()[e]) <= detail::kFloat16Max)) {
        std::string index = "(";
        for (int64_t d = 0, rest = e; d < t.dim(); ++d) {
          int64_t stride = 1;
          for (int64_t k = d + 1; k < t.dim(); ++k) stride *= t.size(k);
          index += (d ? ", " : "") + std::to_string(rest / stride);
          rest %= stride;
        }
        char value[32];
        std::snprintf(value, sizeof value, "%.9g", static_cast<double>(t.data()[e]));
        throw Error(Error::Kind::Value, name + ": float16 holds values of magnitude <= 65504, got " + value +
                                            " at index " + index + ")" + "; bf16 or f32 holds it");
      }
  return round_to<E>(t);
}

template <class To, class E>
Tensor<To> widen(const Tensor<E>& t) {
  Storage<To> out(static_cast<std::size_t>(t.numel()));
  if constexpr (std::is_same_v<To, float>) {  // vectorised and threaded, as round_to
    detail::widen_rows(t.data(), 1, t.numel(), t.numel(), out.data(), t.numel(), 0);
  } else {
    for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<std::size_t>(i)] = static_cast<To>(to_float(t[i]));
  }
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
    if (info.present) get(p) = detail::rounded_parameter<E>(info.name, get(parameters));
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
    detail::check_masks_finite(options.key_padding_mask, options.attn_mask);
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
    s->keep_inputs(query, key, value);
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
  // A training forward's buffers move into its context; a plain forward's
  // are this thread's, kept between calls (a first-touched page costs
  // ~13 µs: attention/workspace.hpp), and grown, never shrunk.
  thread_local Storage<E> kept_q, kept_k, kept_v, kept_attn;
  Storage<E> own_q, own_k, own_v, own_attn;
  const auto buffer = [&](Storage<E>& own, Storage<E>& kept, int64_t n) -> Storage<E>& {
    Storage<E>& b = s ? own : kept;
    if (b.size() < static_cast<std::size_t>(n)) b.resize(static_cast<std::size_t>(n), E{});
    return b;
  };
  // With extra key rows (bias_k, the zero-attention key), K and V copied to
  // (B, S', E): the projected keys of entry b, then bias_k, then zeros.
  const auto extend_keys = [&](const Storage<E>& k, const Storage<E>& v, Storage<E>& k_ext, Storage<E>& v_ext) {
    if (p.S_total == p.S) return;
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
  };
  const auto fill_context = [&](detail::KernelMasks<float>& masks, Storage<E>& q, Storage<E>& k, Storage<E>& v,
                                Storage<E>& k_ext, Storage<E>& v_ext, Storage<E>& attn, Storage<float>& lse) {
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
  };
  detail::KernelMasks<float> masks = detail::build_kernel_masks(p, options);
  Storage<float> lse(s ? static_cast<std::size_t>(p.B * p.H * p.L) : 0, 0.0f);

  // The float32 way, where every step of the 16-bit forward is a float32
  // step on exact widenings: each product the float32 gemm of float32
  // copies of its operands (no 16-bit matmul here, and not the few-row
  // product), and the flash kernel the float32 kernel on the widened Q, K,
  // V with each output rounded once (kernels/kernel.hpp). The weights'
  // copies are then made once and kept (keep_float32_weights); each
  // distinct input is widened once for the products that read it; the
  // projections' sums are rounded (+ bias) straight into head-major float32
  // Q, K, V for the kernel, and the kernel's output rounded in place for
  // out_projection: no value is stored in 16 bits to be widened again. The
  // same numbers at every step, so the same bits as the reference way below
  // (NarrowWeightCopies.KeptCopiesGiveTheReferenceBits).
  const bool float32_way =
      keep_float32_weights_ && detail::narrow_linear_is_widened_gemm(wq, q_tokens) &&
      detail::narrow_linear_is_widened_gemm(wk, kv_tokens) && detail::narrow_linear_is_widened_gemm(wv, kv_tokens) &&
      detail::narrow_flash_is_float32_kernel(compute_dtype_of<E>()) &&
      detail::resolve_forward_kernel<float>(options.attention.kernel, /*stores_weights=*/false) ==
          AttentionKernel::Flash;
  if (float32_way) {
    detail::FloatWeightCopies& fw = *float_weights_;
    std::call_once(fw.once, [&] { fw.fill(config_, params_, options.attention.num_threads); });
    const int threads = detail::requested_threads(options.attention.num_threads);
    thread_local detail::ThreadScratch scratch[9];
    const auto take = [&](int slot, int64_t n) { return scratch[slot].take(static_cast<std::size_t>(n)); };
    const auto widen_input = [&](const Tensor<E>& x, int slot) -> const float* {
      float* dst = take(slot, x.numel());
      detail::widen_rows(x.data(), 1, x.numel(), x.numel(), dst, x.numel(), threads);
      return dst;
    };
    const auto same = [](const Tensor<E>& a, const Tensor<E>& b) { return a.data() == b.data() && a.shape() == b.shape(); };
    const float* xq = widen_input(query, 0);
    const float* xk = same(key, query) ? xq : widen_input(key, 1);
    const float* xv = same(value, query) ? xq : same(value, key) ? xk : widen_input(value, 2);
    const float* wq_f = packed ? fw.in_proj.data() : fw.q_proj.data();
    const float* wk_f = packed ? fw.in_proj.data() + E_ * E_ : fw.k_proj.data();
    const float* wv_f = packed ? fw.in_proj.data() + 2 * E_ * E_ : fw.v_proj.data();
    // in_projection: the float32 sums, token rows (the bias comes with the rounding).
    const auto sums = [&](const float* x, int64_t tokens, const float* w, int64_t in, int slot) {
      float* acc = take(slot, tokens * E_);
      detail::linear_forward<float>(LinearRows<float>{tokens, x, 0}, LinearWeight<float>::stored(w, E_, in), nullptr,
                                    acc, 0, lo);
      return acc;
    };
    const float* aq = sums(xq, q_tokens, wq_f, E_, 3);
    const float* ak = sums(xk, kv_tokens, wk_f, p.Ek, 4);
    const float* av = sums(xv, kv_tokens, wv_f, p.Ev, 5);
    // split_heads: slice n = b·H + h, `len` rows of head h rounded (+ its
    // bias) into [n][S'][D]; then the bias_k row (exact) and the zero row.
    const auto heads = [&](const float* acc, int64_t len, int64_t total, int64_t batch_stride, int64_t seq_stride,
                           const E* bias, const Tensor<E>* extra, int slot) {
      float* dst = take(slot, p.B * p.H * total * p.D);
      detail::parallel_items(p.B * p.H, threads, /*item_cost=*/total * p.D, [&](int64_t n) {
        const int64_t b = n / p.H, h = n % p.H;
        float* out = dst + n * total * p.D;
        detail::round_rows_widened(acc + b * batch_stride * E_ + h * p.D, len, p.D, seq_stride * E_,
                                   bias != nullptr ? bias + h * p.D : static_cast<const E*>(nullptr), out, p.D, 1);
        if (p.bias_kv_col >= 0 && extra != nullptr)
          detail::widen_rows(extra->data() + h * p.D, 1, p.D, p.D, out + p.bias_kv_col * p.D, p.D, 1);
        if (p.zero_attn_col >= 0 && total > len) std::fill_n(out + p.zero_attn_col * p.D, p.D, 0.0f);
      });
      return dst;
    };
    const float* hq = heads(aq, p.L, p.L, p.q_batch_stride, p.q_seq_stride, b_in, nullptr, 6);
    const float* hk = heads(ak, p.S, p.S_total, p.kv_batch_stride, p.kv_seq_stride, b_in ? b_in + E_ : nullptr,
                            &params_.bias_k, 7);
    const float* hv = heads(av, p.S, p.S_total, p.kv_batch_stride, p.kv_seq_stride, b_in ? b_in + 2 * E_ : nullptr,
                            &params_.bias_v, 8);
    // scaled_dot_product_attention: the float32 kernel on the head-major
    // copies, writing the merged heads in token order (the widened input
    // copies' slot 0 is free again: the products have read them).
    float* concat = take(0, q_tokens * E_);
    detail::AttentionArgs<float> args = detail::narrow_attention_args(config_, p, options, masks);
    args.q_layout = args.k_layout = args.v_layout = detail::SliceLayout{};  // contiguous [slices][len][D]
    args.q = hq;
    args.k = hk;
    args.v = hv;
    args.out = concat;
    args.lse = s ? lse.data() : nullptr;
    detail::run_attention_forward(args, AttentionKernel::Flash);
    detail::round_rows_widened(concat, q_tokens, E_, E_, static_cast<const E*>(nullptr), concat, E_, threads);
    // out_projection.
    detail::linear_forward_widened(LinearRows<float>{q_tokens, concat, 0},
                                   LinearWeight<float>::stored(fw.out_proj.data(), E_, E_),
                                   config_.bias ? params_.out_proj_bias.data() : nullptr, output.data(), 0, lo);
    if (s) {  // what the backward reads, in 16 bits: the same values, rounded (exactly) once more
      Storage<E> q(static_cast<std::size_t>(q_tokens * E_)), k(static_cast<std::size_t>(kv_tokens * E_)),
          v(static_cast<std::size_t>(kv_tokens * E_)), k_ext, v_ext, attn(static_cast<std::size_t>(q_tokens * E_));
      detail::round_rows(aq, q_tokens, E_, E_, b_in, q.data(), E_, threads);
      detail::round_rows(ak, kv_tokens, E_, E_, b_in ? b_in + E_ : nullptr, k.data(), E_, threads);
      detail::round_rows(av, kv_tokens, E_, E_, b_in ? b_in + 2 * E_ : nullptr, v.data(), E_, threads);
      detail::round_rows(concat, q_tokens, E_, E_, static_cast<const E*>(nullptr), attn.data(), E_, threads);
      extend_keys(k, v, k_ext, v_ext);
      fill_context(masks, q, k, v, k_ext, v_ext, attn, lse);
    }
    return output;
  }

  // The reference way: each product widens its own operands (core/linear.hpp's
  // 16-bit layer), the projections are stored in 16 bits and the flash
  // kernel reads them so.
  Storage<E>& q = buffer(own_q, kept_q, q_tokens * E_);
  Storage<E>& k = buffer(own_k, kept_k, kv_tokens * E_);
  Storage<E>& v = buffer(own_v, kept_v, kv_tokens * E_);
  const bool self_attention = packed && query.data() == key.data() && query.data() == value.data() &&
                              query.shape() == key.shape() && query.shape() == value.shape();
  if (self_attention) {  // one product through in_proj_weight [W_q; W_k; W_v]
    E* const parts[3] = {q.data(), k.data(), v.data()};
    detail::linear_forward_stacked(LinearRows<E>{q_tokens, query.data(), 0},
                                   LinearWeight<E>::stored(params_.in_proj_weight.data(), 3 * E_, E_), b_in, parts, 3,
                                   lo);
  } else {
    detail::linear_forward(LinearRows<E>{q_tokens, query.data(), 0}, wq, b_in, q.data(), 0, lo);
    detail::linear_forward(LinearRows<E>{kv_tokens, key.data(), 0}, wk, b_in ? b_in + E_ : nullptr, k.data(), 0, lo);
    detail::linear_forward(LinearRows<E>{kv_tokens, value.data(), 0}, wv, b_in ? b_in + 2 * E_ : nullptr, v.data(), 0,
                           lo);
  }

  // 2. split_heads (narrow_attention_args: the layouts), K and V extended
  // when there are extra key rows.
  Storage<E> k_ext, v_ext;
  extend_keys(k, v, k_ext, v_ext);
  const E* k_base = k_ext.empty() ? k.data() : k_ext.data();
  const E* v_base = v_ext.empty() ? v.data() : v_ext.data();

  // 3. attention, writing the merged heads (q_tokens, E) in token order,
  // and each row's log-sum-exp when training.
  Storage<E>& attn = buffer(own_attn, kept_attn, q_tokens * E_);
  detail::AttentionArgs<float> args = detail::narrow_attention_args(config_, p, options, masks);
  args.narrow = {compute_dtype_of<E>(), q.data(), k_base, v_base, attn.data()};
  args.lse = s ? lse.data() : nullptr;
  detail::attention_forward(args, options.attention.kernel);

  // 4. out_projection, in the same token order as the query (so the output
  // has the query's layout).
  detail::linear_forward(LinearRows<E>{q_tokens, attn.data(), 0},
                         LinearWeight<E>::stored(params_.out_proj_weight.data(), E_, E_),
                         config_.bias ? params_.out_proj_bias.data() : nullptr, output.data(), 0, lo);
  if (s) fill_context(masks, q, k, v, k_ext, v_ext, attn, lse);
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
template Tensor<bfloat16> round_to<bfloat16>(const Tensor<float>&, const std::string&);
template Tensor<float16> round_to<float16>(const Tensor<float>&, const std::string&);
template Tensor<float> widen<float, bfloat16>(const Tensor<bfloat16>&);
template Tensor<float> widen<float, float16>(const Tensor<float16>&);
template Tensor<double> widen<double, bfloat16>(const Tensor<bfloat16>&);
template Tensor<double> widen<double, float16>(const Tensor<float16>&);

}  // namespace multihead
