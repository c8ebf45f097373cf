// src/attention/grouped_query_attention.cpp: the grouped-query module and
// its KV cache (multihead/grouped_query_attention.hpp).
//
// Legend: B batch, L new tokens, P cached tokens, S = P + L keys, E embed
// width, H query heads, Hkv K/V heads, D head width.
//
// The forward, as Hugging Face's LlamaAttention.forward (transformers 4.x),
// step by step:
//   q = x W_qᵀ + b_q            (B·L, H·D)     in_projection
//   k = x W_kᵀ + b_k            (B·L, Hkv·D)
//   v = x W_vᵀ + b_v            (B·L, Hkv·D)
//   q, k = rope(q, k)            positions P … P + L − 1
//   cache K/V ← k, v             [B][Hkv][capacity][D]   (with a cache)
//   a = attention(q, K, V)       one kernel call over B·H slices; slice
//                                b·H + h reads K/V head h / (H / Hkv) in
//                                place (kv_slice, src/contract/attention_args.hpp):
//                                no repeat_kv copy
//   out = a W_oᵀ + b_o           (B·L, E)      out_projection
// split_heads is a strided view (SliceLayout), merge_heads is the kernel
// writing its output rows where (B, L, H·D) puts them.
// Its backward (GroupedQueryAttention::backward, after the forward) runs
// these steps in reverse: o_proj, the kernels' grouped backward (d_k, d_v
// summed over each K/V head's query heads), RoPE's Rᵀ, the in-projections.
#include "multihead/grouped_query_attention.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "attention/attention_call.hpp"
#include "attention/grouped_query_steps.hpp"
#include "attention/rope.hpp"
#include "core/check.hpp"
#include "core/linear.hpp"
#include "core/parameters.hpp"
#include "kernels/kernel.hpp"
#include "multihead/error.hpp"
#include "simd/narrow_types.hpp"

namespace multihead {
namespace {

[[noreturn]] void fail(const std::string& field, const std::string& expected, const std::string& got) {
  throw Error(Error::Kind::Value, field + ": expected " + expected + ", got " + got);
}

}  // namespace

void GroupedQueryAttentionConfig::validate() const {
  if (embed_dim < 1) fail("embed_dim", "a positive integer", std::to_string(embed_dim));
  if (num_heads < 1) fail("num_heads", "a positive integer", std::to_string(num_heads));
  if (num_kv_heads < 0 || (num_kv_heads > 0 && num_heads % num_kv_heads != 0))
    fail("num_kv_heads",
         "0 (= num_heads) or a divisor of num_heads " + std::to_string(num_heads) +
             " (each K/V head serves num_heads / num_kv_heads query heads)",
         std::to_string(num_kv_heads));
  if (head_dim < 0) fail("head_dim", "0 (= embed_dim / num_heads) or a positive integer", std::to_string(head_dim));
  if (head_dim == 0 && embed_dim % num_heads != 0)
    fail("num_heads", "a divisor of embed_dim " + std::to_string(embed_dim) + " (or set head_dim to choose the head width)",
         std::to_string(num_heads));
  // The query projection's rows, num_heads x head_dim, in int64 arithmetic
  // everywhere: a product past 2^40 (far beyond any memory, which the
  // parameters' check then says) is refused here, before it can wrap (2^62
  // heads of width 4 wrapped to 8 rows and ran off the weights).
  if (static_cast<double>(num_heads) * static_cast<double>(resolved_head_dim()) > 0x1p40)
    fail("head_dim", "num_heads x head_dim of at most 2^40 (the rows of q_proj.weight)",
         "num_heads " + std::to_string(num_heads) + " x head_dim " + std::to_string(resolved_head_dim()));
  if (rope) {
    validate_rope(*rope, resolved_head_dim(), "rope");
    if (rope->position_offset != 0)
      fail("rope.position_offset", "0 (positions come from the KV cache)", std::to_string(rope->position_offset));
  }
}

// ---- KVCache --------------------------------------------------------------

namespace {

const char* element_words(KVCacheDType dtype, std::size_t native_size) {
  switch (dtype) {
    case KVCacheDType::BFloat16: return "bfloat16";
    case KVCacheDType::Float16: return "float16";
    case KVCacheDType::Int8: return "int8 with a float32 scale per 32 values";
    case KVCacheDType::Native: break;
  }
  return native_size == 8 ? "64-bit floats" : "32-bit floats";
}

// K and V, [B][Hkv][capacity][D] each (with their scales), must fit in
// memory before they are allocated (issue 22: a cache of 4,000,000 positions
// committed 2.4 GB over 11 s before failing with a bare std::bad_alloc). The
// bytes are the cache dtype's.
template <class T>
void check_cache_fits(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim, KVCacheDType dtype,
                      const std::string& hint) {
  detail::check_fits_in_memory("max_len",
                               "a KV cache of " + std::to_string(capacity) + " positions (batch " +
                                   std::to_string(batch) + ", " + std::to_string(kv_heads) + " K/V heads x head_dim " +
                                   std::to_string(head_dim) + ", K and V in " + element_words(dtype, sizeof(T)) + ")",
                               KVCache<T>::bytes_for(batch, kv_heads, head_dim, capacity, dtype), hint);
}

// Bytes per stored element of a compressed dtype.
std::size_t element_bytes(KVCacheDType dtype) { return dtype == KVCacheDType::Int8 ? 1 : 2; }

}  // namespace

const char* kv_cache_dtype_name(KVCacheDType dtype) {
  switch (dtype) {
    case KVCacheDType::BFloat16: return "bf16";
    case KVCacheDType::Float16: return "f16";
    case KVCacheDType::Int8: return "int8";
    case KVCacheDType::Native: break;
  }
  return "f32";
}

template <class T>
KVCache<T>::KVCache(int64_t batch, int64_t kv_heads, int64_t head_dim, int64_t max_len, bool grow, KVCacheDType dtype)
    : batch_(batch), kv_heads_(kv_heads), head_dim_(head_dim), capacity_(max_len), grow_(grow), dtype_(dtype) {
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"batch", batch}, {"kv_heads", kv_heads},
                                     {"head_dim", head_dim}})
    if (value < 1) fail(std::string("KVCache ") + name, "a positive integer", std::to_string(value));
  if (max_len < 1 || max_len > (int64_t{1} << 40))
    throw Error(Error::Kind::Value, "max_len: expected a cache length of 1 to 2^40 tokens, got " +
                                        std::to_string(max_len));
  if (!std::is_same_v<T, float> && dtype != KVCacheDType::Native)
    fail("cache_dtype", "f32 for a float64 module's cache (compressed caches are for float32 modules)",
         kv_cache_dtype_name(dtype));
  check_cache_fits<T>(batch, kv_heads, max_len, head_dim, dtype, "");
  allocate(max_len);
}

template <class T>
void KVCache<T>::allocate(int64_t capacity) {
  const int64_t rows = batch_ * kv_heads_ * capacity;
  if (!compressed()) {
    k_.assign(static_cast<std::size_t>(rows * head_dim_), T(0));
    v_.assign(k_.size(), T(0));
    return;
  }
  k_narrow_.assign(static_cast<std::size_t>(rows * head_dim_) * element_bytes(dtype_), 0);
  v_narrow_.assign(k_narrow_.size(), 0);
  if (dtype_ == KVCacheDType::Int8) {
    k_scale_.assign(static_cast<std::size_t>(rows * detail::int8_blocks(head_dim_)), 0.0f);
    v_scale_.assign(k_scale_.size(), 0.0f);
  }
}

template <class T>
void KVCache<T>::reserve_more(int64_t count) {
  const int64_t need = length_ + count;
  if (need <= capacity_) return;
  if (!grow_)
    throw Error(Error::Kind::Value, "max_len: the KV cache holds " + std::to_string(length_) + " of max_len " +
                                        std::to_string(capacity_) + " tokens; appending " + std::to_string(count) +
                                        " would overflow it (raise max_len or let the cache grow)");
  const int64_t fresh_capacity = std::max(need, 2 * capacity_);
  check_cache_fits<T>(batch_, kv_heads_, fresh_capacity, head_dim_, dtype_,
                      "the cache holds " + std::to_string(length_) + " tokens and grows to max(2 x capacity " +
                          std::to_string(capacity_) + ", " + std::to_string(need) + " needed)");
  KVCache<T> fresh(batch_, kv_heads_, head_dim_, fresh_capacity, grow_, dtype_);
  fresh.length_ = length_;
  // Each K/V slice's first length_ rows move; per row: D elements (and,
  // int8, ceil(D / 32) scales).
  const auto move_rows = [&](const auto& from, auto& to, int64_t per_row) {
    for (int64_t bg = 0; bg < batch_ * kv_heads_; ++bg)
      std::copy_n(from.data() + bg * capacity_ * per_row, length_ * per_row, to.data() + bg * fresh_capacity * per_row);
  };
  if (!compressed()) {
    move_rows(k_, fresh.k_, head_dim_);
    move_rows(v_, fresh.v_, head_dim_);
  } else {
    const int64_t row = head_dim_ * static_cast<int64_t>(element_bytes(dtype_));
    move_rows(k_narrow_, fresh.k_narrow_, row);
    move_rows(v_narrow_, fresh.v_narrow_, row);
    if (dtype_ == KVCacheDType::Int8) {
      move_rows(k_scale_, fresh.k_scale_, detail::int8_blocks(head_dim_));
      move_rows(v_scale_, fresh.v_scale_, detail::int8_blocks(head_dim_));
    }
  }
  *this = std::move(fresh);
}

template <class T>
void KVCache<T>::store(int64_t b, int64_t g, int64_t p, const T* k, const T* v) {
  if (!compressed())
    throw Error(Error::Kind::Value, "KVCache::store: expected a compressed cache (bf16, f16, int8), got f32 "
                                    "(write through k_row/v_row)");
  if constexpr (std::is_same_v<T, float>) {
    const int64_t D = head_dim_, row = (b * kv_heads_ + g) * capacity_ + p;
    for (const auto& [x, narrow, scales] : {std::tuple{k, &k_narrow_, &k_scale_}, std::tuple{v, &v_narrow_, &v_scale_}}) {
      uint8_t* dst = narrow->data() + row * D * static_cast<int64_t>(element_bytes(dtype_));
      switch (dtype_) {
        case KVCacheDType::BFloat16:
        case KVCacheDType::Float16: {
          auto* bits = reinterpret_cast<uint16_t*>(dst);
          for (int64_t c = 0; c < D; ++c)
            bits[c] = dtype_ == KVCacheDType::BFloat16 ? detail::float_to_bfloat16_bits(x[c])
                                                       : detail::float_to_float16_bits(x[c]);
          break;
        }
        case KVCacheDType::Int8: {
          const int64_t blocks = detail::int8_blocks(D);
          for (int64_t blk = 0; blk < blocks; ++blk) {
            const int64_t c0 = blk * detail::kInt8Block, n = std::min(detail::kInt8Block, D - c0);
            (*scales)[static_cast<std::size_t>(row * blocks + blk)] =
                detail::quantize_int8_block(x + c0, n, reinterpret_cast<int8_t*>(dst) + c0);
          }
          break;
        }
        case KVCacheDType::Native: break;
      }
    }
  } else {
    (void)b, (void)g, (void)p, (void)k, (void)v;  // compressed caches are float only (the constructor)
  }
}

template class KVCache<float>;
template class KVCache<double>;

// ---- the module -----------------------------------------------------------

template <class T>
GroupedQueryAttention<T>::GroupedQueryAttention(const GroupedQueryAttentionConfig& config, uint64_t seed)
    : config_(config) {
  config_.validate();
  {
    const int64_t E = config_.embed_dim, width = config_.num_heads * config_.resolved_head_dim();
    detail::check_parameters_fit(config_, sizeof(T), config_.head_dim > 0 && width > E ? "head_dim" : "embed_dim",
                                 "embed_dim " + std::to_string(E) + ", " + std::to_string(config_.num_heads) +
                                     " heads of head_dim " + std::to_string(config_.resolved_head_dim()) + ", " +
                                     (sizeof(T) == 8 ? "float64" : "float32"));
  }
  std::mt19937_64 rng(seed);
  // nn.Linear(in, out): weight and bias U(−1/√in, 1/√in), in = the weight's
  // second extent; drawn in the table's order (q, k, v, o, each weight then
  // bias), so the numbers stay those of every earlier version.
  double bound = 0;
  for_each_parameter(config_, params_, [&](const ParameterInfo& info, Tensor<T>& t) {
    if (!info.present) return;
    if (info.shape.size() == 2) bound = 1.0 / std::sqrt(static_cast<double>(info.shape[1]));
    std::uniform_real_distribution<double> u(-bound, bound);
    t = Tensor<T>(info.shape);
    for (int64_t e = 0; e < t.numel(); ++e) t[e] = static_cast<T>(u(rng));
  });
  parameters_token_ = detail::new_parameters_token();
}

template <class T>
GroupedQueryAttention<T>::GroupedQueryAttention(const GroupedQueryAttentionConfig& config,
                                                GroupedQueryAttentionParameters<T> parameters)
    : config_(config), params_(std::move(parameters)) {
  config_.validate();
  detail::check_parameters(config_, params_);
  parameters_token_ = detail::new_parameters_token();
}

template <class T>
GroupedQueryAttention<T> GroupedQueryAttention<T>::from_tensors(const GroupedQueryAttentionConfig& config,
                                                                const std::map<std::string, Tensor<T>>& tensors,
                                                                const std::string& prefix) {
  config.validate();
  GroupedQueryAttentionParameters<T> p;
  for_each_parameter(config, p, [&](const ParameterInfo& info, Tensor<T>& t) {
    if (const auto it = tensors.find(prefix + info.name); it != tensors.end()) t = it->second;
  });
  try {
    return GroupedQueryAttention(config, std::move(p));
  } catch (const Error& e) {
    throw Error(e.kind(), prefix + e.what());  // its messages start with the local name
  }
}

template <class T>
std::map<std::string, Tensor<T>> GroupedQueryAttention<T>::state_dict() const {
  return detail::parameter_map<T>(config_, params_);
}

template <class T>
void GroupedQueryAttention<T>::load_state_dict(const std::map<std::string, Tensor<T>>& state_dict) {
  GroupedQueryAttentionParameters<T> p;
  detail::parameters_from_map(config_, p, state_dict, "GroupedQueryAttention");
  params_ = std::move(p);
  parameters_token_ = detail::new_parameters_token();  // contexts filled before are stale now
}

template <class T>
void GroupedQueryAttention<T>::update_parameters(
    const std::function<void(const std::string& name, Tensor<T>& parameter)>& update) {
  // On a copy, installed only once every tensor has passed the checks.
  GroupedQueryAttentionParameters<T> p = params_;
  detail::update_present(config_, p, update);
  params_ = std::move(p);
  parameters_token_ = detail::new_parameters_token();
}

template <class T>
KVCache<T> GroupedQueryAttention<T>::make_cache(int64_t batch, int64_t max_len, bool grow,
                                                KVCacheDType dtype) const {
  return KVCache<T>(batch, kv_heads(), head_dim(), max_len, grow, dtype);
}

namespace {

// y (rows, out) = x (rows, in) Wᵀ + b: nn.Linear, the library's one linear
// layer (core/linear.hpp), with W (out, in) as stored.
template <class T>
void linear(const T* x, int64_t rows, int64_t in, const Tensor<T>& w, const Tensor<T>& b, T* y, int threads) {
  const int64_t out = w.size(0);
  detail::linear_forward<T>({rows, x, in}, detail::LinearWeight<T>::stored(w.data(), out, in),
                            b.empty() ? nullptr : b.data(), y, out, {false, threads});
}

}  // namespace

template <class T>
Tensor<T> GroupedQueryAttention<T>::forward(const Tensor<T>& x, const AttentionOptions& options,
                                            KVCache<T>* cache) const {
  return run(x, options, cache, nullptr);
}

template <class T>
Tensor<T> GroupedQueryAttention<T>::forward(const Tensor<T>& x, const AttentionOptions& options,
                                            GroupedQueryForwardContext<T>& save_for_backward) const {
  return run(x, options, nullptr, &save_for_backward);
}

template <class T>
Tensor<T> GroupedQueryAttention<T>::run(const Tensor<T>& x, const AttentionOptions& options, KVCache<T>* cache,
                                        GroupedQueryForwardContext<T>* save) const {
  const int64_t E = config_.embed_dim, H = config_.num_heads, Hkv = kv_heads(), D = head_dim();
  const auto [B, L] = detail::check_grouped_query_call(config_, x.shape(), options, cache);
  if (options.check_finite) {
    detail::check_finite("x", x);
    for_each_parameter(config_, params_,
                       [](const ParameterInfo& info, const Tensor<T>& t) { detail::check_finite(info.name, t); });
  }
  Tensor<T> out(Shape{B, L, E});
  if (B == 0 || L == 0) return out;
  const int64_t P = cache ? cache->length() : 0, S = P + L;

  // in_projection
  Tensor<T> q(Shape{B * L, H * D}), k(Shape{B * L, Hkv * D}), v(Shape{B * L, Hkv * D});
  const GroupedQueryAttentionParameters<T>& p = params_;
  linear(x.data(), B * L, E, p.q_proj_weight, p.q_proj_bias, q.data(), options.num_threads);
  linear(x.data(), B * L, E, p.k_proj_weight, p.k_proj_bias, k.data(), options.num_threads);
  linear(x.data(), B * L, E, p.v_proj_weight, p.v_proj_bias, v.data(), options.num_threads);
  if (config_.rope) {
    RopeOptions rope = *config_.rope;
    rope.position_offset = P;
    detail::rope_in_place(q.data(), B, L, H, D, rope);
    detail::rope_in_place(k.data(), B, L, Hkv, D, rope);
  }

  // split_heads: views. Query slice b·H + h, row i at q + (b·L + i)·H·D + h·D;
  // K/V the new rows, or the cache's (attend_over_cache sets them).
  detail::AttentionTensors<T> t;
  t.q = q.data();
  t.q_layout = detail::SliceLayout{L * H * D, D, H * D};
  if (!cache) {
    t.k = k.data();
    t.v = v.data();
    t.k_layout = t.v_layout = detail::SliceLayout{L * Hkv * D, D, Hkv * D};
  }
  // merge_heads: the kernel writes slice b·H + h's row i at (b·L + i, h·D).
  Tensor<T> merged(Shape{B * L, H * D});
  t.out = merged.data();
  t.out_layout = t.q_layout;
  std::vector<T> slopes;
  detail::AttentionArgs<T> a = detail::grouped_query_attention_args(config_, B, L, S, t, options, slopes);
  Tensor<T> lse;
  if (save) {
    lse = Tensor<T>(Shape{B * H, L});
    a.lse = lse.data();
  }
  // The kernel, chosen once for the call; a training forward keeps it for
  // the backward. With a cache, attend_over_cache chooses (the decode kernel
  // or flash).
  AttentionKernel kernel = AttentionKernel::Auto;
  if (cache) {
    kernel = detail::attend_over_cache(*cache, k.data(), v.data(), B, L, a, options.kernel);
  } else {
    kernel = detail::resolve_forward_kernel<T>(options.kernel, /*stores_weights=*/false);
    detail::run_attention_forward(a, kernel);
  }

  // out_projection
  linear(merged.data(), B * L, H * D, p.o_proj_weight, p.o_proj_bias, out.data(), options.num_threads);
  if (save) {
    save->x_ = x;
    save->q_ = std::move(q);
    save->k_ = std::move(k);
    save->v_ = std::move(v);
    save->merged_ = std::move(merged);
    save->lse_ = std::move(lse);
    save->options_ = options;
    save->kernel_ = kernel;
    save->parameters_token_ = parameters_token_;
  }
  return out;
}

// ---- backward -------------------------------------------------------------
//
// The forward's steps in reverse (llm.c's order), each quoting its line.

namespace {

// Forward: y (rows, out) = x (rows, in) Wᵀ + b (linear above). Given d_y:
// d_W = d_yᵀ x and d_b = Σ_rows d_y into grads under name's keys, and
// d_x = d_y W written, or added to d_x with accumulate_d_x.
template <class T>
void linear_backward(const T* x, const T* d_y, int64_t rows, int64_t in, const Tensor<T>& w, bool bias,
                     std::map<std::string, Tensor<T>>& grads, const std::string& name, T* d_x, bool accumulate_d_x,
                     int threads) {
  const int64_t out = w.size(0);
  // Zeros, so that one accumulating call writes d_W and d_b and adds into d_x.
  Tensor<T>& d_w = grads[name + ".weight"] = Tensor<T>(Shape{out, in}, T(0));
  Tensor<T>* d_b = bias ? &(grads[name + ".bias"] = Tensor<T>(Shape{out}, T(0))) : nullptr;
  if (!accumulate_d_x && d_x != nullptr) std::fill_n(d_x, rows * in, T(0));
  detail::linear_backward<T>({rows, x, in}, detail::LinearWeight<T>::stored(w.data(), out, in), d_y, out,
                             {d_x, in, d_w.data(), d_b ? d_b->data() : nullptr}, {true, threads});
}

}  // namespace

template <class T>
GroupedQueryAttentionGradients<T> GroupedQueryAttention<T>::backward(const GroupedQueryForwardContext<T>& saved,
                                                                     const Tensor<T>& d_output) const {
  if (saved.empty())
    throw Error(Error::Kind::Value, "context: empty GroupedQueryForwardContext; fill it with forward(x, options, "
                                    "context) first");
  if (saved.parameters_token_ != parameters_token_)
    throw Error(Error::Kind::Value,
                "context: this GroupedQueryForwardContext was filled by another module or before "
                "update_parameters() / load_state_dict(); run the forward again");
  const int64_t E = config_.embed_dim, H = config_.num_heads, Hkv = kv_heads(), D = head_dim();
  const int64_t B = saved.x_.size(0), L = saved.x_.size(1);
  if (d_output.shape() != saved.x_.shape())
    fail("d_output", "the output's shape " + shape_to_string(saved.x_.shape()), shape_to_string(d_output.shape()));
  GroupedQueryAttentionGradients<T> g;
  g.x = Tensor<T>(saved.x_.shape(), T(0));
  if (B == 0 || L == 0) {
    for_each_parameter(config_, [&](const ParameterInfo& info) {
      if (info.present) g.parameters[info.name] = Tensor<T>(info.shape, T(0));
    });
    return g;
  }
  const GroupedQueryAttentionParameters<T>& p = params_;

  // Forward: out = merged W_oᵀ + b_o.
  Tensor<T> d_merged(Shape{B * L, H * D});
  const int threads = saved.options_.num_threads;
  linear_backward(saved.merged_.data(), d_output.data(), B * L, H * D, p.o_proj_weight, config_.bias, g.parameters,
                  "o_proj", d_merged.data(), false, threads);

  // Forward: a = attention(q, K, V), K/V head g serving its group; the
  // kernels' backward sums d_k, d_v over the group.
  detail::AttentionTensors<T> t;
  t.q = saved.q_.data();
  t.q_layout = detail::SliceLayout{L * H * D, D, H * D};
  t.k = saved.k_.data();
  t.v = saved.v_.data();
  t.k_layout = t.v_layout = detail::SliceLayout{L * Hkv * D, D, Hkv * D};
  t.out = const_cast<T*>(saved.merged_.data());  // read only: the backward reads forward.out
  t.out_layout = t.q_layout;
  std::vector<T> slopes;
  detail::AttentionBackwardArgs<T> b;
  b.forward = detail::grouped_query_attention_args(config_, B, L, L, t, saved.options_, slopes);
  b.lse = saved.lse_.data();
  b.d_out = d_merged.data();
  Tensor<T> d_q(Shape{B * L, H * D}), d_k(Shape{B * L, Hkv * D}), d_v(Shape{B * L, Hkv * D});
  b.d_q = d_q.data();
  b.d_k = d_k.data();
  b.d_v = d_v.data();
  detail::run_attention_backward(b, saved.kernel_);  // the kernel the forward ran

  // Forward: q, k = rope(q, k) at positions 0 … L − 1, so d = Rᵀ d.
  if (config_.rope) {
    detail::rope_backward_in_place(d_q.data(), B, L, H, D, *config_.rope);
    detail::rope_backward_in_place(d_k.data(), B, L, Hkv, D, *config_.rope);
  }

  // Forward: q = x W_qᵀ + b_q, k = x W_kᵀ + b_k, v = x W_vᵀ + b_v: d_x sums the three.
  const T* x = saved.x_.data();
  linear_backward(x, d_q.data(), B * L, E, p.q_proj_weight, config_.bias, g.parameters, "q_proj", g.x.data(), false,
                  threads);
  linear_backward(x, d_k.data(), B * L, E, p.k_proj_weight, config_.bias, g.parameters, "k_proj", g.x.data(), true,
                  threads);
  linear_backward(x, d_v.data(), B * L, E, p.v_proj_weight, config_.bias, g.parameters, "v_proj", g.x.data(), true,
                  threads);
  return g;
}

template class GroupedQueryAttention<float>;
template class GroupedQueryAttention<double>;

}  // namespace multihead
