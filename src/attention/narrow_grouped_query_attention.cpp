// src/attention/narrow_grouped_query_attention.cpp: the 16-bit grouped-query
// module's forward (multihead/narrow_grouped_query_attention.hpp), the
// float module's steps (grouped_query_attention.cpp) in 16-bit storage:
//
//   q = round(x W_qᵀ + b_q)    (B·L, H·D)     in_projection, core/linear's 16-bit gemm
//   k = round(x W_kᵀ + b_k)    (B·L, Hkv·D)
//   v = round(x W_vᵀ + b_v)    (B·L, Hkv·D)
//   q, k = round(rope(q, k))   in float32, positions P … P + L − 1
//   a = attention(q, k, v)     no cache: flash on the 16-bit q, k, v
//                              (args.narrow), slice b·H + h reading K/V
//                              head h / (H / Hkv) in place, a rounded;
//                              a cache: k, v into it, then the float
//                              module's kernels on q widened (attend_over_cache;
//                              the bf16 module's bf16 cache read as bf16 pairs
//                              where flash takes its pair way), a rounded
//   out = round(a W_oᵀ + b_o)  (B·L, E)      out_projection
//
// Legend: B batch, L new tokens, P cached tokens, S = P + L keys, E embed
// width, H query heads, Hkv K/V heads, D head width.
#include "multihead/narrow_grouped_query_attention.hpp"

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention/attention_call.hpp"
#include "attention/grouped_query_steps.hpp"
#include "attention/narrow_convert.hpp"
#include "attention/rope.hpp"
#include "core/check.hpp"
#include "core/linear.hpp"
#include "core/parameters.hpp"
#include "kernels/kernel.hpp"
#include "multihead/error.hpp"
#include "multihead/narrow_multihead_attention.hpp"  // round_to

namespace multihead {

template <class E>
NarrowGroupedQueryAttention<E>::NarrowGroupedQueryAttention(const GroupedQueryAttentionConfig& config,
                                                            GroupedQueryAttentionParameters<E> parameters)
    : config_(config), params_(std::move(parameters)) {
  config_.validate();
  detail::check_parameters(config_, params_);
  parameters_token_ = detail::new_parameters_token();
}

template <class E>
NarrowGroupedQueryAttention<E> NarrowGroupedQueryAttention<E>::rounded(
    const GroupedQueryAttentionConfig& config, const GroupedQueryAttentionParameters<float>& parameters) {
  config.validate();
  detail::check_parameters(config, parameters);  // names a misshapen float32 tensor before rounding it
  GroupedQueryAttentionParameters<E> p;
  detail::grouped_query_attention_parameter_table(config, [&](const ParameterInfo& info, auto get) {
    if (info.present) get(p) = detail::rounded_parameter<E>(info.name, get(parameters));
  });
  return NarrowGroupedQueryAttention(config, std::move(p));
}

template <class E>
std::map<std::string, Tensor<E>> NarrowGroupedQueryAttention<E>::state_dict() const {
  return detail::parameter_map<E>(config_, params_);
}

template <class E>
void NarrowGroupedQueryAttention<E>::update_parameters(
    const std::function<void(const std::string& name, Tensor<E>& parameter)>& update) {
  // On a copy, installed only once every tensor has passed the checks.
  GroupedQueryAttentionParameters<E> next = params_;
  detail::update_present(config_, next, update);
  params_ = std::move(next);
  parameters_token_ = detail::new_parameters_token();  // contexts filled before are stale now
}

template <class E>
KVCache<float> NarrowGroupedQueryAttention<E>::make_cache(int64_t batch, int64_t max_len, bool grow,
                                                          KVCacheDType dtype) const {
  return KVCache<float>(batch, kv_heads(), head_dim(), max_len, grow, dtype);
}

namespace {

// y (rows, out) = round(x (rows, in) Wᵀ + b): the 16-bit nn.Linear.
template <class E>
void linear(const E* x, int64_t rows, int64_t in, const Tensor<E>& w, const Tensor<E>& b, E* y, int threads) {
  const int64_t out = w.size(0);
  detail::linear_forward<E>({rows, x, in}, detail::LinearWeight<E>::stored(w.data(), out, in),
                            b.empty() ? nullptr : b.data(), y, 0, {false, threads});
}

// RoPE on the rounded x, [B][L][heads][D]: widened (exact), the float
// module's rotation in float32 (rope_in_place), each element rounded once.
template <class E>
void rope_rounded(E* x, int64_t B, int64_t L, int64_t heads, int64_t D, const RopeOptions& rope, int threads) {
  const std::size_t n = static_cast<std::size_t>(B * L * heads * D);
  Storage<float> wide = detail::widened(x, n, threads);
  detail::rope_in_place(wide.data(), B, L, heads, D, rope);
  detail::round_into(wide.data(), n, x, threads);
}

}  // namespace

template <class E>
Tensor<E> NarrowGroupedQueryAttention<E>::forward(const Tensor<E>& x, const AttentionOptions& options,
                                                  KVCache<float>* cache) const {
  return run(x, options, cache, nullptr);
}

template <class E>
Tensor<E> NarrowGroupedQueryAttention<E>::forward(const Tensor<E>& x, const AttentionOptions& options,
                                                  NarrowGroupedQueryForwardContext<E>& save_for_backward) const {
  return run(x, options, nullptr, &save_for_backward);
}

template <class E>
Tensor<E> NarrowGroupedQueryAttention<E>::run(const Tensor<E>& x, const AttentionOptions& options,
                                              KVCache<float>* cache, NarrowGroupedQueryForwardContext<E>* save) const {
  const int64_t E_ = config_.embed_dim, H = config_.num_heads, Hkv = kv_heads(), D = head_dim();
  const std::string dtype = to_string(compute_dtype_of<E>());
  if (options.kernel != AttentionKernel::Auto && options.kernel != AttentionKernel::Flash)
    throw Error(Error::Kind::Value, "kernel: expected auto or flash (the " + dtype +
                                        " grouped-query module runs the flash kernel on 16-bit operands, and the "
                                        "decode kernel over a KV cache), got " + to_string(options.kernel));
  const auto [B, L] = detail::check_grouped_query_call(config_, x.shape(), options, cache);
  if (options.check_finite) {
    detail::check_finite("x", x);
    for_each_parameter(config_, params_,
                       [](const ParameterInfo& info, const Tensor<E>& t) { detail::check_finite(info.name, t); });
  }
  if (save) *save = NarrowGroupedQueryForwardContext<E>();  // a throw below leaves it empty
  Tensor<E> out(Shape{B, L, E_});
  if (B == 0 || L == 0) {
    if (save) {
      save->x_ = x;
      save->options_ = options;
      save->parameters_token_ = parameters_token_;
      save->filled_ = true;
    }
    return out;
  }
  const int64_t P = cache ? cache->length() : 0, S = P + L;
  const int threads = options.num_threads;

  // in_projection, each result rounded once.
  Tensor<E> q(Shape{B * L, H * D}), k(Shape{B * L, Hkv * D}), v(Shape{B * L, Hkv * D});
  const GroupedQueryAttentionParameters<E>& p = params_;
  linear(x.data(), B * L, E_, p.q_proj_weight, p.q_proj_bias, q.data(), threads);
  linear(x.data(), B * L, E_, p.k_proj_weight, p.k_proj_bias, k.data(), threads);
  linear(x.data(), B * L, E_, p.v_proj_weight, p.v_proj_bias, v.data(), threads);
  if (config_.rope) {
    RopeOptions rope = *config_.rope;
    rope.position_offset = P;
    rope_rounded(q.data(), B, L, H, D, rope, threads);
    rope_rounded(k.data(), B, L, Hkv, D, rope, threads);
  }

  // split_heads: views, as the float module's. Query slice b·H + h, row i
  // at (b·L + i)·H·D + h·D; merge_heads: the kernel writes there too.
  detail::AttentionTensors<float> t;
  t.q_layout = t.out_layout = detail::SliceLayout{L * H * D, D, H * D};
  if (!cache) t.k_layout = t.v_layout = detail::SliceLayout{L * Hkv * D, D, Hkv * D};
  std::vector<float> slopes;
  Tensor<E> merged(Shape{B * L, H * D});
  Tensor<float> lse;
  if (cache) {
    // The cache is float32: q and the new k, v widened (exact) for it and
    // the float module's kernels; the merged heads rounded once.
    const Storage<float> qf = detail::widened(q.data(), static_cast<std::size_t>(q.numel()), threads);
    const Storage<float> kf = detail::widened(k.data(), static_cast<std::size_t>(k.numel()), threads);
    const Storage<float> vf = detail::widened(v.data(), static_cast<std::size_t>(v.numel()), threads);
    Storage<float> merged_f(static_cast<std::size_t>(merged.numel()), 0.0f);
    t.q = qf.data();
    t.out = merged_f.data();
    detail::AttentionArgs<float> a = detail::grouped_query_attention_args(config_, B, L, S, t, options, slopes);
    detail::attend_over_cache(*cache, kf.data(), vf.data(), B, L, a, options.kernel,
                              /*bf16_module=*/std::is_same_v<E, bfloat16>);
    detail::round_into(merged_f.data(), merged_f.size(), merged.data(), threads);
  } else {
    detail::AttentionArgs<float> a = detail::grouped_query_attention_args(config_, B, L, S, t, options, slopes);
    a.narrow = {compute_dtype_of<E>(), q.data(), k.data(), v.data(), merged.data()};
    if (save) {
      lse = Tensor<float>(Shape{B * H, L});
      a.lse = lse.data();
    }
    detail::attention_forward(a, options.kernel);  // flash (run_attention_forward refuses a forced other)
  }

  // out_projection
  linear(merged.data(), B * L, H * D, p.o_proj_weight, p.o_proj_bias, out.data(), threads);
  if (save) {
    save->x_ = x;
    save->q_ = std::move(q);
    save->k_ = std::move(k);
    save->v_ = std::move(v);
    save->merged_ = std::move(merged);
    save->lse_ = std::move(lse);
    save->options_ = options;
    save->parameters_token_ = parameters_token_;
    save->filled_ = true;
  }
  return out;
}

template class NarrowGroupedQueryAttention<bfloat16>;
template class NarrowGroupedQueryAttention<float16>;

}  // namespace multihead
