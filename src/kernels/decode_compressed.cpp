// src/kernels/decode_compressed.cpp: attention over a compressed KV cache
// (kernel.hpp, attention_forward_compressed): the rows of each K/V head's
// group cut into calls of at most kDecodeMaxRows, threaded over those calls;
// the per-target kernel is src/simd/decode_compressed-inl.h.
#include <algorithm>
#include <cstdint>

#include "core/parallel.hpp"
#include "kernels/kernel.hpp"
#include "simd/decode_compressed.hpp"
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
  const int64_t calls = (group_rows + kDecodeMaxRows - 1) / kDecodeMaxRows;
  if (kv_slices == 0 || L == 0) return;
  const DecodeCompressedKernel kernel = decode_compressed_kernel_for(simd_target_bit());
  // A call's work: its rows' dot products and weighted sums over S keys.
  const int64_t item_cost = std::min(group_rows, kDecodeMaxRows) * std::max<int64_t>(args.kv_len, 1) *
                            std::max<int64_t>(args.head_dim, 1) * 2;
  parallel_items(kv_slices * calls, requested_threads(args.num_threads), item_cost, [&](int64_t it) {
    const int64_t slice = it / calls, begin = it % calls * kDecodeMaxRows;
    kernel.rows(args, kv, slice, begin, std::min(group_rows, begin + kDecodeMaxRows));
  });
}

}  // namespace multihead::detail
