// src/kernels/decode_compressed.cpp: attention over a compressed KV cache
// (kernel.hpp, attention_forward_compressed): the rows of each K/V head's
// group cut into calls of whole chunks (kDecodeMaxRows rows), threaded over
// those calls; the per-target kernel is src/simd/decode_compressed-inl.h.
#include <algorithm>
#include <cstdint>

#include "core/parallel.hpp"
#include "kernels/kernel.hpp"
#include "simd/decode_compressed.hpp"
#include "simd/flash_attention.hpp"
#include "simd/targets.hpp"

namespace multihead::detail {

void attention_forward_compressed(const AttentionArgs<float>& call, const CompressedKV& kv) {
  // q and out as AttentionArgs says (unset layouts: contiguous); the kernel
  // reads them resolved. K/V are the cache's [B·Hkv][capacity][D].
  AttentionArgs<float> args = call;
  args.q_layout = resolve_layout(call.q_layout, call.heads, call.q_len, call.head_dim);
  args.out_layout = resolve_layout(call.out_layout, call.heads, call.q_len, call.head_dim);
  const int64_t H = args.heads, Hkv = args.kv_heads_or_heads(), L = args.q_len;
  const int64_t kv_slices = kv_slice_count(args.slices, H, Hkv);
  const int64_t group_rows = H / Hkv * L;  // the query rows reading one K/V slice
  const int64_t chunks = (group_rows + kDecodeMaxRows - 1) / kDecodeMaxRows;
  if (kv_slices == 0 || L == 0) return;
  const int64_t target = simd_target_bit();
  const DecodeCompressedKernel kernel = decode_compressed_kernel_for(target);
  // A bf16 module over a bf16 cache reads it as bf16 pairs where the flash
  // kernel takes its pair way for that module (bf16_dot_choice: vdpbf16ps on
  // an AMD core with AVX512_BF16, or MULTIHEAD_BF16_DOT), so that the
  // module's prompt and its decode steps round the same things.
  DecodeWay way = DecodeWay::Widen;
  if (kv.bf16_module && kv.dtype == KVCacheDType::BFloat16) {
    const Bf16DotChoice choice = bf16_dot_choice(target);
    if (choice.dpbf16) way = choice.native ? DecodeWay::PairsNative : DecodeWay::Pairs;
  }
  // Each call reads its K/V slice once for all its chunks (the kernel takes a
  // block of keys chunk by chunk while it is in cache), so a group's chunks
  // are cut into few calls: one per slice when there are at least as many
  // slices as threads, and with fewer (one K/V head, 32 query heads: 4
  // chunks) up to threads / slices calls of whole chunks; never more than
  // kDecodeMaxCallChunks chunks a call, which bounds a call's accumulators
  // (64 rows × D floats) when a prompt runs over a compressed cache. A step
  // under the parallel grain runs on one thread (parallel_team), and then
  // cutting a slice would only read it again. A row's bits do not depend on
  // the cut (decode_compressed-inl.h, DecodeRowsW).
  const int threads = requested_threads(args.num_threads);
  const int64_t row_cost = std::max<int64_t>(args.kv_len, 1) * std::max<int64_t>(args.head_dim, 1) * 2;
  const bool one_thread = parallel_team(kv_slices * chunks, threads, kDecodeMaxRows * row_cost) == 1;
  const int64_t least_parts = (chunks + kDecodeMaxCallChunks - 1) / kDecodeMaxCallChunks;
  const int64_t parts = std::clamp<int64_t>(
      std::max<int64_t>(one_thread ? 1 : (threads + kv_slices - 1) / kv_slices, least_parts), 1, chunks);
  // A call's work: its rows' dot products and weighted sums over S keys.
  const int64_t item_cost = std::min(group_rows, (chunks + parts - 1) / parts * kDecodeMaxRows) * row_cost;
  parallel_items(kv_slices * parts, threads, item_cost, [&](int64_t it) {
    const int64_t slice = it / parts, part = it % parts;
    const int64_t first = part * chunks / parts * kDecodeMaxRows, last = (part + 1) * chunks / parts * kDecodeMaxRows;
    kernel.rows(args, kv, slice, first, std::min(group_rows, last), way);
  });
}

}  // namespace multihead::detail
