// src/simd/flash_attention_backward.hpp: the per-target flash attention
// backward kernel, as seen from src/kernels/flash.cpp (which
// validates, threads and calls it).
//
// Legend (as in kernel.hpp): N slices, L queries, S keys, D query/key width,
// Dv value width.
#pragma once

#include <cstdint>

#include "contract/attention_args.hpp"
#include "simd/flash_attention.hpp"

namespace multihead::detail {

// One Highway target's flash backward.
struct FlashBackwardKernel {
  // Writes the d_k and d_v rows of K/V slice `kv` and the d_q rows of the
  // query slices that read it (its group, kv_slice in attention_args.hpp;
  // one slice without grouped-query): the contract, AttentionBackwardArgs.
  // Groups are independent and each is summed in a fixed order (its query
  // slices in increasing n), so any partition of the groups over threads
  // gives bit-identical gradients.
  void (*group)(const AttentionBackwardArgs<float>& args, int64_t kv, FlashScratch& scratch);
  // The same group split in two passes that may run on different threads:
  // keys(…, kv, begin, end) writes the d_k and d_v rows [begin, end) of K/V
  // slice kv, queries(…, slice, begin, end) the d_q rows [begin, end) of
  // query slice `slice` (begin a multiple of row_tile). Together they give
  // exactly the bits group() gives.
  void (*keys)(const AttentionBackwardArgs<float>& args, int64_t kv, int64_t begin, int64_t end,
               FlashScratch& scratch);
  void (*queries)(const AttentionBackwardArgs<float>& args, int64_t slice, int64_t begin, int64_t end,
                  FlashScratch& scratch);
  int64_t row_tile;  // query rows per tile (the forward's)
  int64_t key_tile;  // keys per tile
};

// The tile products' arithmetic: float32 FMA, or the bf16 pair way
// (AttentionBackwardArgs::bf16_operands), with Highway's widening or with
// vdpbf16ps (native: only where bf16_dot_choice says it runs).
enum class BackwardProducts { Float32, Bf16Pairs, Bf16PairsNative };

// The backward compiled for Highway target `target_bit` (see targets.hpp);
// throws multihead::Error if it was not compiled in.
FlashBackwardKernel flash_backward_kernel_for(int64_t target_bit, BackwardProducts products = BackwardProducts::Float32);

}  // namespace multihead::detail
