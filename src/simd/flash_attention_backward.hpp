// src/simd/flash_attention_backward.hpp: the per-target flash attention
// backward kernel, as seen from src/attention/flash.cpp (which
// validates, threads and calls it).
//
// Legend (as in kernel.hpp): N slices, L queries, S keys, D query/key width,
// Dv value width.
#pragma once

#include <cstdint>

#include "kernel/attention_args.hpp"
#include "simd/flash_attention.hpp"

namespace multihead::detail {

// One Highway target's flash backward.
struct FlashBackwardKernel {
  // Writes slice `slice`'s rows of args.d_q, d_k and d_v (the contract:
  // AttentionBackwardArgs, src/kernel/attention_args.hpp). Slices are
  // independent and each is summed in a fixed order, so any partition of
  // the slices over threads gives bit-identical gradients.
  void (*slice)(const AttentionBackwardArgs<float>& args, int64_t slice, FlashScratch& scratch);
  // The same slice split in two passes that may run on different threads:
  // keys(…, begin, end) writes the d_k and d_v rows [begin, end), queries(…,
  // begin, end) the d_q rows [begin, end) (begin a multiple of row_tile).
  // Together they give exactly the bits slice() gives.
  void (*keys)(const AttentionBackwardArgs<float>& args, int64_t slice, int64_t begin, int64_t end,
               FlashScratch& scratch);
  void (*queries)(const AttentionBackwardArgs<float>& args, int64_t slice, int64_t begin, int64_t end,
                  FlashScratch& scratch);
  int64_t row_tile;  // query rows per tile (the forward's)
  int64_t key_tile;  // keys per tile
};

// The backward compiled for Highway target `target_bit` (see targets.hpp);
// throws multihead::Error if it was not compiled in.
FlashBackwardKernel flash_backward_kernel_for(int64_t target_bit);

}  // namespace multihead::detail
