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
//                                place (kv_slice, src/kernel/attention_args.hpp):
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
#include <vector>

#include "attention/attention_call.hpp"
#include "attention/kernel.hpp"
#include "attention/rope.hpp"
#include "core/check.hpp"
#include "core/gemm.hpp"
#include "multihead/error.hpp"

namespace multihead {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw Error(Error::Kind::Value, "GroupedQueryAttention: " + what);
}

}  // namespace

void validate(const GroupedQueryAttentionConfig& c) {
  if (c.embed_dim < 1) fail("embed_dim must be >= 1, got " + std::to_string(c.embed_dim));
  if (c.num_heads < 1) fail("num_heads must be >= 1, got " + std::to_string(c.num_heads));
  if (c.num_kv_heads < 0 || (c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads != 0))
    throw Error(Error::Kind::Value, "num_kv_heads: expected a divisor of num_heads " + std::to_string(c.num_heads) +
                                        " (each K/V head serves num_heads / num_kv_heads query heads), got " +
                                        std::to_string(c.num_kv_heads));
  if (c.head_dim < 0) fail("head_dim must be >= 0 (0 = embed_dim / num_heads), got " + std::to_string(c.head_dim));
  if (c.head_dim == 0 && c.embed_dim % c.num_heads != 0)
    fail("embed_dim " + std::to_string(c.embed_dim) + " is not divisible by num_heads " +
         std::to_string(c.num_heads) + " (set head_dim to choose the head width)");
  const int64_t D = c.head_dim > 0 ? c.head_dim : c.embed_dim / c.num_heads;
  if (c.rope) {
    validate_rope(*c.rope, D, "rope");
    if (c.rope->position_offset != 0)
      fail("rope.position_offset must be 0: positions come from the KV cache, got " +
           std::to_string(c.rope->position_offset));
  }
}

// ---- KVCache --------------------------------------------------------------

namespace {

// K and V, [B][Hkv][capacity][D] each, must fit in memory before they are
// allocated (issue 22: a cache of 4,000,000 positions committed 2.4 GB over
// 11 s before failing with a bare std::bad_alloc).
template <class T>
void check_cache_fits(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim, const std::string& hint) {
  detail::check_fits_in_memory("max_len",
                               "a KV cache of " + std::to_string(capacity) + " positions (batch " +
                                   std::to_string(batch) + ", " + std::to_string(kv_heads) + " K/V heads x head_dim " +
                                   std::to_string(head_dim) + ", K and V in " + std::to_string(8 * sizeof(T)) +
                                   "-bit floats)",
                               KVCache<T>::bytes_for(batch, kv_heads, head_dim, capacity), hint);
}

}  // namespace

template <class T>
KVCache<T>::KVCache(int64_t batch, int64_t kv_heads, int64_t head_dim, int64_t max_len, bool grow)
    : batch_(batch), kv_heads_(kv_heads), head_dim_(head_dim), capacity_(max_len), grow_(grow) {
  if (batch < 1 || kv_heads < 1 || head_dim < 1)
    throw Error(Error::Kind::Value, "KVCache: batch, kv_heads and head_dim must be >= 1, got " +
                                        std::to_string(batch) + ", " + std::to_string(kv_heads) + ", " +
                                        std::to_string(head_dim));
  if (max_len < 1 || max_len > (int64_t{1} << 40))
    throw Error(Error::Kind::Value, "max_len: expected a cache length of 1 to 2^40 tokens, got " +
                                        std::to_string(max_len));
  check_cache_fits<T>(batch, kv_heads, max_len, head_dim, "");
  const int64_t elements = shape_numel(Shape{batch, kv_heads, max_len, head_dim});
  k_.resize(static_cast<std::size_t>(elements));
  v_.resize(static_cast<std::size_t>(elements));
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
  check_cache_fits<T>(batch_, kv_heads_, fresh_capacity, head_dim_,
                   "the cache holds " + std::to_string(length_) + " tokens and grows to max(2 x capacity " +
                       std::to_string(capacity_) + ", " + std::to_string(need) + " needed)");
  Storage<T> k(static_cast<std::size_t>(shape_numel(Shape{batch_, kv_heads_, fresh_capacity, head_dim_})));
  Storage<T> v(k.size());
  for (int64_t bg = 0; bg < batch_ * kv_heads_; ++bg) {
    std::copy_n(k_.data() + bg * capacity_ * head_dim_, length_ * head_dim_, k.data() + bg * fresh_capacity * head_dim_);
    std::copy_n(v_.data() + bg * capacity_ * head_dim_, length_ * head_dim_, v.data() + bg * fresh_capacity * head_dim_);
  }
  k_ = std::move(k);
  v_ = std::move(v);
  capacity_ = fresh_capacity;
}

template class KVCache<float>;
template class KVCache<double>;

// ---- the module -----------------------------------------------------------

template <class T>
GroupedQueryAttention<T>::GroupedQueryAttention(const GroupedQueryAttentionConfig& config, uint64_t seed) {
  validate(config);
  config_ = config;
  head_dim_ = config.head_dim > 0 ? config.head_dim : config.embed_dim / config.num_heads;
  kv_heads_ = config.num_kv_heads > 0 ? config.num_kv_heads : config.num_heads;
  const int64_t E = config.embed_dim, HD = config.num_heads * head_dim_, KD = kv_heads_ * head_dim_;
  std::mt19937_64 rng(seed);
  // nn.Linear(in, out): weight and bias U(−1/√in, 1/√in).
  const auto linear = [&](Tensor<T>& w, Tensor<T>& b, int64_t out, int64_t in) {
    std::uniform_real_distribution<double> u(-1.0 / std::sqrt(static_cast<double>(in)),
                                             1.0 / std::sqrt(static_cast<double>(in)));
    w = Tensor<T>(Shape{out, in});
    for (int64_t e = 0; e < w.numel(); ++e) w[e] = static_cast<T>(u(rng));
    if (config.bias) {
      b = Tensor<T>(Shape{out});
      for (int64_t e = 0; e < out; ++e) b[e] = static_cast<T>(u(rng));
    }
  };
  linear(q_w_, q_b_, HD, E);
  linear(k_w_, k_b_, KD, E);
  linear(v_w_, v_b_, KD, E);
  linear(o_w_, o_b_, E, HD);
}

template <class T>
GroupedQueryAttention<T> GroupedQueryAttention<T>::from_tensors(const GroupedQueryAttentionConfig& config,
                                                                const std::map<std::string, Tensor<T>>& tensors,
                                                                const std::string& prefix) {
  validate(config);
  GroupedQueryAttention m;
  m.config_ = config;
  m.head_dim_ = config.head_dim > 0 ? config.head_dim : config.embed_dim / config.num_heads;
  m.kv_heads_ = config.num_kv_heads > 0 ? config.num_kv_heads : config.num_heads;
  const int64_t E = config.embed_dim, HD = config.num_heads * m.head_dim_, KD = m.kv_heads_ * m.head_dim_;
  const auto take = [&](const std::string& name, const Shape& shape) {
    const auto it = tensors.find(prefix + name);
    if (it == tensors.end()) throw Error(Error::Kind::Value, prefix + name + ": missing (expected shape " + shape_to_string(shape) + ")");
    if (it->second.shape() != shape)
      throw Error(Error::Kind::Value, prefix + name + ": expected shape " + shape_to_string(shape) + ", got " +
                                          shape_to_string(it->second.shape()));
    return it->second;
  };
  m.q_w_ = take("q_proj.weight", {HD, E});
  m.k_w_ = take("k_proj.weight", {KD, E});
  m.v_w_ = take("v_proj.weight", {KD, E});
  m.o_w_ = take("o_proj.weight", {E, HD});
  const bool has_bias = tensors.count(prefix + "q_proj.bias") || tensors.count(prefix + "k_proj.bias") ||
                        tensors.count(prefix + "v_proj.bias") || tensors.count(prefix + "o_proj.bias");
  if (has_bias && !config.bias)
    throw Error(Error::Kind::Value, "bias: the weights have projection biases (" + prefix +
                                        "*_proj.bias) but the configuration has bias off");
  if (config.bias) {
    m.q_b_ = take("q_proj.bias", {HD});
    m.k_b_ = take("k_proj.bias", {KD});
    m.v_b_ = take("v_proj.bias", {KD});
    m.o_b_ = take("o_proj.bias", {E});
  }
  return m;
}

template <class T>
std::map<std::string, Tensor<T>> GroupedQueryAttention<T>::named_tensors() const {
  std::map<std::string, Tensor<T>> t{
      {"q_proj.weight", q_w_}, {"k_proj.weight", k_w_}, {"v_proj.weight", v_w_}, {"o_proj.weight", o_w_}};
  if (config_.bias) {
    t["q_proj.bias"] = q_b_;
    t["k_proj.bias"] = k_b_;
    t["v_proj.bias"] = v_b_;
    t["o_proj.bias"] = o_b_;
  }
  return t;
}

template <class T>
KVCache<T> GroupedQueryAttention<T>::make_cache(int64_t batch, int64_t max_len, bool grow) const {
  return KVCache<T>(batch, kv_heads_, head_dim_, max_len, grow);
}

namespace {

// y (rows, out) = x (rows, in) Wᵀ + b: nn.Linear.
template <class T>
void linear(const T* x, int64_t rows, int64_t in, const Tensor<T>& w, const Tensor<T>& b, T* y) {
  const int64_t out = w.size(0);
  if (!b.empty())
    for (int64_t r = 0; r < rows; ++r) std::copy_n(b.data(), out, y + r * out);
  detail::gemm(detail::Trans::No, detail::Trans::Yes, rows, out, in, T(1), x, in, w.data(), in,
               b.empty() ? T(0) : T(1), y, out);
}

// The kernel call for B·H query slices of L rows over S keys, the module's
// rules in one place for its forward and its backward: causal bottom-right
// (queries are positions S − L … S − 1), one ALiBi slope per query head
// (into `slopes`), K/V heads grouped.
template <class T>
detail::AttentionArgs<T> module_attention_args(const GroupedQueryAttentionConfig& config, int64_t Hkv, int64_t D,
                                               int64_t B, int64_t L, int64_t S, detail::AttentionTensors<T>& t,
                                               const AttentionOptions& options, std::vector<T>& slopes) {
  const int64_t H = config.num_heads;
  slopes.clear();
  if (!options.alibi_slopes.empty()) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) slopes.push_back(static_cast<T>(options.alibi_slopes[static_cast<std::size_t>(h)]));
    t.alibi_slopes = slopes.data();
  }
  detail::AttentionShape shape;
  shape.slices = B * H;
  shape.heads = H;
  shape.q_len = L;
  shape.kv_len = S;
  shape.head_dim = D;
  shape.value_dim = D;
  shape.causal_cols = S;
  AttentionOptions o = options;
  o.is_causal = config.causal;
  o.causal_alignment = CausalAlignment::BottomRight;  // queries are positions P … S − 1
  detail::AttentionArgs<T> a = detail::make_attention_args(shape, t, o);
  a.kv_heads = Hkv;
  return a;
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
  const int64_t E = config_.embed_dim, H = config_.num_heads, Hkv = kv_heads_, D = head_dim_;
  if (x.dim() != 3 || x.size(2) != E)
    fail("x: expected (batch, length, embed_dim = " + std::to_string(E) + "), got " + shape_to_string(x.shape()));
  const int64_t B = x.size(0), L = x.size(1);
  detail::validate_attention_options(options);
  if (options.is_causal || options.causal_alignment != CausalAlignment::TopLeft || options.causal_query_offset != 0)
    fail("is_causal, causal_alignment and causal_query_offset are the module's own (config.causal, "
         "bottom-right over the cache); leave them unset");
  if (!options.alibi_slopes.empty() && static_cast<int64_t>(options.alibi_slopes.size()) != H)
    fail("alibi_slopes: expected one slope per query head (" + std::to_string(H) + "), got " +
         std::to_string(options.alibi_slopes.size()));
  if (cache) {
    if (cache->batch() != B || cache->kv_heads() != Hkv || cache->head_dim() != D)
      fail("cache: expected batch " + std::to_string(B) + ", kv_heads " + std::to_string(Hkv) + ", head_dim " +
           std::to_string(D) + ", got " + std::to_string(cache->batch()) + ", " + std::to_string(cache->kv_heads()) +
           ", " + std::to_string(cache->head_dim()));
    cache->reserve_more(L);  // throws naming max_len before any work
  }
  if (options.check_finite) {
    detail::check_finite("x", x);
    const std::pair<const char*, const Tensor<T>*> weights[] = {
        {"q_proj.weight", &q_w_}, {"k_proj.weight", &k_w_}, {"v_proj.weight", &v_w_}, {"o_proj.weight", &o_w_},
        {"q_proj.bias", &q_b_},   {"k_proj.bias", &k_b_},   {"v_proj.bias", &v_b_},   {"o_proj.bias", &o_b_}};
    for (const auto& [name, t] : weights) detail::check_finite(name, *t);
  }
  Tensor<T> out(Shape{B, L, E});
  if (B == 0 || L == 0) return out;
  const int64_t P = cache ? cache->length() : 0, S = P + L;

  // in_projection
  Tensor<T> q(Shape{B * L, H * D}), k(Shape{B * L, Hkv * D}), v(Shape{B * L, Hkv * D});
  linear(x.data(), B * L, E, q_w_, q_b_, q.data());
  linear(x.data(), B * L, E, k_w_, k_b_, k.data());
  linear(x.data(), B * L, E, v_w_, v_b_, v.data());
  if (config_.rope) {
    RopeOptions rope = *config_.rope;
    rope.position_offset = P;
    detail::rope_in_place(q.data(), B, L, H, D, rope);
    detail::rope_in_place(k.data(), B, L, Hkv, D, rope);
  }

  // split_heads: views. Query slice b·H + h, row i at q + (b·L + i)·H·D + h·D.
  detail::AttentionTensors<T> t;
  t.q = q.data();
  t.q_layout = detail::SliceLayout{L * H * D, D, H * D};
  if (cache) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t g = 0; g < Hkv; ++g) {
          std::copy_n(k.data() + ((b * L + i) * Hkv + g) * D, D, cache->k_row(b, g, P + i));
          std::copy_n(v.data() + ((b * L + i) * Hkv + g) * D, D, cache->v_row(b, g, P + i));
        }
    cache->commit(L);
    const int64_t cap = cache->capacity();
    t.k = cache->k_data();
    t.v = cache->v_data();
    t.k_layout = t.v_layout = detail::SliceLayout{Hkv * cap * D, cap * D, D};
  } else {
    t.k = k.data();
    t.v = v.data();
    t.k_layout = t.v_layout = detail::SliceLayout{L * Hkv * D, D, Hkv * D};
  }
  // merge_heads: the kernel writes slice b·H + h's row i at (b·L + i, h·D).
  Tensor<T> merged(Shape{B * L, H * D});
  t.out = merged.data();
  t.out_layout = t.q_layout;
  std::vector<T> slopes;
  detail::AttentionArgs<T> a = module_attention_args(config_, Hkv, D, B, L, S, t, options, slopes);
  Tensor<T> lse;
  if (save) {
    lse = Tensor<T>(Shape{B * H, L});
    a.lse = lse.data();
  }
  detail::attention_forward(a, options.kernel);

  // out_projection
  linear(merged.data(), B * L, H * D, o_w_, o_b_, out.data());
  if (save) {
    save->x = x;
    save->q = std::move(q);
    save->k = std::move(k);
    save->v = std::move(v);
    save->merged = std::move(merged);
    save->lse = std::move(lse);
    save->options = options;
  }
  return out;
}

// ---- backward -------------------------------------------------------------
//
// The forward's steps in reverse (llm.c's order), each quoting its line.

namespace {

// Forward: y (rows, out) = x (rows, in) Wᵀ + b. Given d_y: d_W = d_yᵀ x,
// d_b = Σ_rows d_y, and d_x (+)= d_y W (beta 0 writes, 1 adds).
template <class T>
void linear_backward(const T* x, const T* d_y, int64_t rows, int64_t in, const Tensor<T>& w, bool bias,
                     std::map<std::string, Tensor<T>>& grads, const std::string& name, T* d_x, T beta) {
  const int64_t out = w.size(0);
  Tensor<T> d_w(Shape{out, in});
  detail::gemm(detail::Trans::Yes, detail::Trans::No, out, in, rows, T(1), d_y, out, x, in, T(0), d_w.data(), in);
  grads[name + ".weight"] = std::move(d_w);
  if (bias) {
    Tensor<T> d_b(Shape{out}, T(0));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < out; ++c) d_b[c] += d_y[r * out + c];
    grads[name + ".bias"] = std::move(d_b);
  }
  if (d_x) detail::gemm(detail::Trans::No, detail::Trans::No, rows, in, out, T(1), d_y, out, w.data(), in, beta, d_x, in);
}

}  // namespace

template <class T>
GroupedQueryAttentionGradients<T> GroupedQueryAttention<T>::backward(const GroupedQueryForwardContext<T>& saved,
                                                                     const Tensor<T>& d_output) const {
  if (saved.empty()) fail("saved: empty; run the training forward (with a GroupedQueryForwardContext) first");
  const int64_t E = config_.embed_dim, H = config_.num_heads, Hkv = kv_heads_, D = head_dim_;
  const int64_t B = saved.x.size(0), L = saved.x.size(1);
  if (d_output.shape() != saved.x.shape())
    fail("d_output: expected the output's shape " + shape_to_string(saved.x.shape()) + ", got " +
         shape_to_string(d_output.shape()));
  GroupedQueryAttentionGradients<T> g;
  g.x = Tensor<T>(saved.x.shape(), T(0));
  if (B == 0 || L == 0) {
    for (const auto& [name, t] : named_tensors()) g.parameters[name] = Tensor<T>(t.shape(), T(0));
    return g;
  }

  // Forward: out = merged W_oᵀ + b_o.
  Tensor<T> d_merged(Shape{B * L, H * D});
  linear_backward(saved.merged.data(), d_output.data(), B * L, H * D, o_w_, config_.bias, g.parameters, "o_proj",
                  d_merged.data(), T(0));

  // Forward: a = attention(q, K, V), K/V head g serving its group; the
  // kernels' backward sums d_k, d_v over the group.
  detail::AttentionTensors<T> t;
  t.q = saved.q.data();
  t.q_layout = detail::SliceLayout{L * H * D, D, H * D};
  t.k = saved.k.data();
  t.v = saved.v.data();
  t.k_layout = t.v_layout = detail::SliceLayout{L * Hkv * D, D, Hkv * D};
  t.out = const_cast<T*>(saved.merged.data());  // read only: the backward reads forward.out
  t.out_layout = t.q_layout;
  std::vector<T> slopes;
  detail::AttentionBackwardArgs<T> b;
  b.forward = module_attention_args(config_, Hkv, D, B, L, L, t, saved.options, slopes);
  b.lse = saved.lse.data();
  b.d_out = d_merged.data();
  Tensor<T> d_q(Shape{B * L, H * D}), d_k(Shape{B * L, Hkv * D}), d_v(Shape{B * L, Hkv * D});
  b.d_q = d_q.data();
  b.d_k = d_k.data();
  b.d_v = d_v.data();
  detail::attention_backward(b, saved.options.kernel);

  // Forward: q, k = rope(q, k) at positions 0 … L − 1, so d = Rᵀ d.
  if (config_.rope) {
    detail::rope_backward_in_place(d_q.data(), B, L, H, D, *config_.rope);
    detail::rope_backward_in_place(d_k.data(), B, L, Hkv, D, *config_.rope);
  }

  // Forward: q = x W_qᵀ + b_q, k = x W_kᵀ + b_k, v = x W_vᵀ + b_v: d_x sums the three.
  const T* x = saved.x.data();
  linear_backward(x, d_q.data(), B * L, E, q_w_, config_.bias, g.parameters, "q_proj", g.x.data(), T(0));
  linear_backward(x, d_k.data(), B * L, E, k_w_, config_.bias, g.parameters, "k_proj", g.x.data(), T(1));
  linear_backward(x, d_v.data(), B * L, E, v_w_, config_.bias, g.parameters, "v_proj", g.x.data(), T(1));
  return g;
}

template class GroupedQueryAttention<float>;
template class GroupedQueryAttention<double>;

}  // namespace multihead
