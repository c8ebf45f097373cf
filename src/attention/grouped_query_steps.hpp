// src/attention/grouped_query_steps.hpp: the steps the grouped-query module
// (grouped_query_attention.cpp, float32 and float64) and its 16-bit form
// (narrow_grouped_query_attention.cpp) share, written once: the call's
// validation, the kernel arguments of the module's rules (causal
// bottom-right, ALiBi per query head, K/V heads grouped), and attention over
// a KV cache (append the new K/V, then the decode kernel or flash).
//
// Legend: B batch, L new tokens, P cached tokens, S = P + L keys, E embed
// width, H query heads, Hkv K/V heads, D head width.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/attention_call.hpp"
#include "contract/attention_args.hpp"
#include "multihead/grouped_query_attention.hpp"
#include "multihead/tensor.hpp"

namespace multihead::detail {

// Checks a forward call before any work, each failure an Error naming the
// argument with expected and actual value: x must be (B, L, E); the options
// (validate_attention_options) with is_causal, causal_alignment and
// causal_query_offset at their defaults (causal masking is config.causal)
// and H ALiBi slopes if any; a cache of batch B, Hkv K/V heads and head
// width D, and with a compressed one kernel Auto and no dropout. Then makes
// room in the cache for L more tokens (reserve_more: throws naming max_len).
// Returns {B, L}.
struct GroupedQueryCall {
  int64_t B = 0, L = 0;
};
template <class T>
GroupedQueryCall check_grouped_query_call(const GroupedQueryAttentionConfig& config, const Shape& x,
                                          const AttentionOptions& options, KVCache<T>* cache);

// The kernel call for B·H query slices of L rows over S keys: causal
// bottom-right (queries are positions S − L … S − 1), one ALiBi slope per
// query head (written into `slopes`, which must outlive the call), K/V
// heads grouped. The forward's and the backward's one definition.
template <class T>
AttentionArgs<T> grouped_query_attention_args(const GroupedQueryAttentionConfig& config, int64_t B, int64_t L,
                                              int64_t S, AttentionTensors<T>& tensors,
                                              const AttentionOptions& options, std::vector<T>& slopes);

// With a cache: appends the new K/V rows k, v ((B·L, Hkv·D) each, after
// RoPE) at positions P … P + L − 1 (copied into a float cache, rounded or
// quantized into a compressed one: KVCache::store) and runs `a`'s queries
// over all S keys of the cache, writing a.out (and a.lse). A compressed
// cache, and a decode step over a float one (decode_kernel_serves), run the
// decode kernel (src/simd/decode_compressed-inl.h); more rows, or a forced
// kernel, run resolve_forward_kernel's choice on the cache's float rows.
// Returns the kernel that ran, Auto for the decode kernel. bf16_module: the
// caller is the bf16 module (its q and k, v are bf16 values, its merged heads
// rounded to bf16), so the decode kernel may read a bf16 cache as bf16 pairs
// (CompressedKV::bf16_module).
template <class T>
AttentionKernel attend_over_cache(KVCache<T>& cache, const T* k, const T* v, int64_t B, int64_t L,
                                  AttentionArgs<T>& a, AttentionKernel requested, bool bf16_module = false);

}  // namespace multihead::detail
