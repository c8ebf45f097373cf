// src/attention/grouped_query_steps.cpp: the grouped-query modules' shared
// steps (grouped_query_steps.hpp).
//
// Legend: B batch, L new tokens, P cached tokens, S = P + L keys, E embed
// width, H query heads, Hkv K/V heads, D head width.
#include "attention/grouped_query_steps.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>

#include "core/check.hpp"
#include "kernels/kernel.hpp"
#include "multihead/error.hpp"
#include "simd/narrow_types.hpp"

namespace multihead::detail {
namespace {

[[noreturn]] void fail(const std::string& field, const std::string& expected, const std::string& got) {
  throw Error(Error::Kind::Value, field + ": expected " + expected + ", got " + got);
}

// The new K/V rows, (B·L, Hkv·D) each, into positions P … P + L − 1 of a
// compressed cache. A float16 cache holds |x| <= 65504: a value beyond (or
// NaN) is refused before anything is stored, naming it, rather than kept as
// an infinity that would poison every later step.
void store_compressed(KVCache<float>& cache, const float* k, const float* v, int64_t B, int64_t L) {
  const int64_t P = cache.length(), Hkv = cache.kv_heads(), D = cache.head_dim();
  if (cache.dtype() == KVCacheDType::Float16)
    for (const auto& [name, x] : {std::pair{"k", k}, std::pair{"v", v}})
      for (int64_t e = 0; e < B * L * Hkv * D; ++e)
        if (!(std::fabs(x[e]) <= kFloat16Max)) {
          const int64_t row = e / (Hkv * D);
          throw Error(Error::Kind::Value,
                      std::string("cache: a float16 KV cache holds values of magnitude <= 65504, got ") + name +
                          " = " + format_number(x[e]) + " (batch " + std::to_string(row / L) + ", token " +
                          std::to_string(P + row % L) + ", K/V head " + std::to_string(e / D % Hkv) +
                          ", feature " + std::to_string(e % D) + ")" +
                          (std::isfinite(x[e]) ? "; a bf16 or f32 cache holds it"
                                               : "; not finite: the input or its projection overflowed before the "
                                                 "cache, which no cache dtype mends"));
        }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t g = 0; g < Hkv; ++g)
        cache.store(b, g, P + i, k + ((b * L + i) * Hkv + g) * D, v + ((b * L + i) * Hkv + g) * D);
  cache.commit(L);
}

}  // namespace

template <class T>
GroupedQueryCall check_grouped_query_call(const GroupedQueryAttentionConfig& config, const Shape& x,
                                          const AttentionOptions& options, KVCache<T>* cache) {
  const int64_t E = config.embed_dim, H = config.num_heads, Hkv = config.resolved_kv_heads();
  const int64_t D = config.resolved_head_dim();
  if (x.size() != 3 || x[2] != E)
    fail("x", "shape (batch, length, embed_dim = " + std::to_string(E) + ")", shape_to_string(x));
  const GroupedQueryCall call{x[0], x[1]};
  validate_attention_options(options);
  // Causal masking and positions are the module's own (config.causal,
  // bottom-right over the cache).
  const char* own = " (the module's own causal rule is config.causal, bottom-right over the cache)";
  if (options.is_causal) fail("is_causal", std::string("false") + own, "true");
  if (options.causal_alignment != CausalAlignment::TopLeft)
    fail("causal_alignment", std::string("the default, top-left") + own, "bottom-right");
  if (options.causal_query_offset != 0)
    fail("causal_query_offset", std::string("0") + own, std::to_string(options.causal_query_offset));
  if (!options.alibi_slopes.empty() && static_cast<int64_t>(options.alibi_slopes.size()) != H)
    fail("alibi_slopes", "one slope per query head (" + std::to_string(H) + ")",
         std::to_string(options.alibi_slopes.size()));
  if (cache) {
    if (cache->batch() != call.B || cache->kv_heads() != Hkv || cache->head_dim() != D)
      fail("cache",
           "batch " + std::to_string(call.B) + ", kv_heads " + std::to_string(Hkv) + ", head_dim " + std::to_string(D),
           std::to_string(cache->batch()) + ", " + std::to_string(cache->kv_heads()) + ", " +
               std::to_string(cache->head_dim()));
    if (cache->compressed()) {
      const std::string why = std::string(" with a compressed KV cache (") + kv_cache_dtype_name(cache->dtype()) +
                              ": its own decode kernel reads it)";
      if (options.kernel != AttentionKernel::Auto) fail("kernel", "auto" + why, to_string(options.kernel));
      if (options.dropout_p != 0.0) fail("dropout_p", "0" + why, std::to_string(options.dropout_p));
    }
    cache->reserve_more(call.L);  // throws naming max_len before any work
  }
  return call;
}

template <class T>
AttentionArgs<T> grouped_query_attention_args(const GroupedQueryAttentionConfig& config, int64_t B, int64_t L,
                                              int64_t S, AttentionTensors<T>& t, const AttentionOptions& options,
                                              std::vector<T>& slopes) {
  const int64_t H = config.num_heads, D = config.resolved_head_dim();
  slopes.clear();
  if (!options.alibi_slopes.empty()) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) slopes.push_back(static_cast<T>(options.alibi_slopes[static_cast<std::size_t>(h)]));
    t.alibi_slopes = slopes.data();
  }
  AttentionShape shape;
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
  AttentionArgs<T> a = make_attention_args(shape, t, o);
  a.kv_heads = config.resolved_kv_heads();
  return a;
}

template <class T>
AttentionKernel attend_over_cache(KVCache<T>& cache, const T* k, const T* v, int64_t B, int64_t L,
                                  AttentionArgs<T>& a, AttentionKernel requested, bool bf16_module) {
  const int64_t P = cache.length(), Hkv = cache.kv_heads(), D = cache.head_dim();
  if (cache.compressed()) {
    if constexpr (std::is_same_v<T, float>) store_compressed(cache, k, v, B, L);
  } else {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t g = 0; g < Hkv; ++g) {
          std::copy_n(k + ((b * L + i) * Hkv + g) * D, D, cache.k_row(b, g, P + i));
          std::copy_n(v + ((b * L + i) * Hkv + g) * D, D, cache.v_row(b, g, P + i));
        }
    cache.commit(L);
    const int64_t cap = cache.capacity();
    a.k = cache.k_data();
    a.v = cache.v_data();
    a.k_layout = a.v_layout = SliceLayout{Hkv * cap * D, cap * D, D};
  }
  // The kernel, chosen once for the call. A compressed cache, and a decode
  // step over a float32 one (decode_kernel_serves: few new tokens, nothing
  // forced), go through the one decode kernel of every cache dtype; a prompt
  // over a float32 cache keeps flash.
  if (cache.compressed() || decode_kernel_serves(a, requested)) {
    if constexpr (std::is_same_v<T, float>) {
      const CompressedKV kv =
          cache.compressed() ? CompressedKV{cache.dtype(), cache.k_compressed(), cache.v_compressed(), cache.k_scales(),
                                            cache.v_scales(), cache.capacity(), bf16_module}
                             : CompressedKV{KVCacheDType::Native, cache.k_data(), cache.v_data(), nullptr, nullptr,
                                            cache.capacity(), bf16_module};
      attention_forward_compressed(a, kv);
    }
    return AttentionKernel::Auto;
  }
  const AttentionKernel kernel = resolve_forward_kernel<T>(requested, /*stores_weights=*/false);
  run_attention_forward(a, kernel);
  return kernel;
}

#define MULTIHEAD_GQA_STEPS(T)                                                                                      \
  template GroupedQueryCall check_grouped_query_call<T>(const GroupedQueryAttentionConfig&, const Shape&,           \
                                                        const AttentionOptions&, KVCache<T>*);                      \
  template AttentionArgs<T> grouped_query_attention_args<T>(const GroupedQueryAttentionConfig&, int64_t, int64_t,   \
                                                            int64_t, AttentionTensors<T>&, const AttentionOptions&, \
                                                            std::vector<T>&);                                       \
  template AttentionKernel attend_over_cache<T>(KVCache<T>&, const T*, const T*, int64_t, int64_t,                  \
                                                AttentionArgs<T>&, AttentionKernel, bool);
MULTIHEAD_GQA_STEPS(float)
MULTIHEAD_GQA_STEPS(double)
#undef MULTIHEAD_GQA_STEPS

}  // namespace multihead::detail
