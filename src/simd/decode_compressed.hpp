// src/simd/decode_compressed.hpp: the per-target attention of a decode step
// over a KV cache of any dtype (decode_compressed-inl.h), as seen from
// src/kernels/decode_compressed.cpp (which threads and calls it).
//
// Legend: B batch, H query heads, Hkv K/V heads, G = H / Hkv query heads per
// K/V head, L queries, S keys, D head width.
#pragma once

#include <cstdint>

#include "contract/attention_args.hpp"
#include "multihead/grouped_query_attention.hpp"

namespace multihead::detail {

// The cache's storage (KVCache::k_compressed() …, or k_data() … for
// float32): K and V [B·Hkv][capacity][D] elements of `dtype` (float32 for
// Native, 2-byte bit patterns, or int8), with int8 scales
// [B·Hkv][capacity][ceil(D / 32)] (nullptr for the other dtypes).
struct CompressedKV {
  KVCacheDType dtype = KVCacheDType::BFloat16;
  const void* k = nullptr;
  const void* v = nullptr;
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
  int64_t capacity = 0;
  // The caller's q is bf16-exact and it rounds the output to bf16 (a bf16
  // module): with a bf16 cache, attention_forward_compressed may then take
  // bf16's pair way (DecodeWay), as the flash kernel does for that module.
  bool bf16_module = false;
};

// The query rows the kernel takes together over a block of keys (a chunk):
// their dot-product accumulators and one widened K/V vector stay in
// registers (8 + 1 of AVX-512's 32). A call's rows are cut into chunks from
// its first row, so calls must begin at multiples of it within a group for
// the bits to be the same however a group's rows are cut into calls.
inline constexpr int64_t kDecodeMaxRows = 8;

// Chunks a call takes over one pass of the cache (decode_compressed-inl.h's
// DecodeRowsW): this many chunks' accumulators (64 rows × D floats) and
// online-softmax states live together. attention_forward_compressed cuts a
// group's chunks into calls of at most this many; a longer call still runs,
// as several passes, with the same bits.
inline constexpr int64_t kDecodeMaxCallChunks = 8;

// How a bf16 cache is read (decode_compressed-inl.h): Widen to float32 and
// use float32 FMA, or bf16's pair way, QKᵀ and PV on bf16 pairs (q and the
// weights P rounded to bf16), with vdpbf16ps (PairsNative: only where the
// CPU has AVX512_BF16, on the AVX-512 targets) or Highway's widening of the
// same pairs (Pairs). Other cache dtypes always widen.
enum class DecodeWay { Widen, Pairs, PairsNative };

struct DecodeCompressedKernel {
  // Rows [row_begin, row_end) (row_begin a multiple of kDecodeMaxRows) of K/V slice
  // kv_slice = b·Hkv + g: row ρ is query i = ρ % L of query head
  // g·G + ρ / L (slice n = b·H + g·G + ρ / L). Reads args' q, layouts,
  // scale, modifiers (causal, window, softcap, ALiBi; no masks) and writes
  // out (and lse if non-null) of those rows; args.k/v are not read.
  void (*rows)(const AttentionArgs<float>& args, const CompressedKV& kv, int64_t kv_slice, int64_t row_begin,
               int64_t row_end, DecodeWay way);
};

// The kernel compiled for Highway target `target_bit` (targets.hpp); throws
// multihead::Error if it was not compiled in.
DecodeCompressedKernel decode_compressed_kernel_for(int64_t target_bit);

}  // namespace multihead::detail
