// src/simd/flash_weights.hpp: the per-target weights recompute
// (flash_weights-inl.h), as seen from src/kernels/flash_weights.cpp (which
// validates, threads and calls it).
//
// Legend (as in kernel.hpp): N slices, L queries, S keys.
#pragma once

#include <cstdint>

#include "contract/attention_weights_args.hpp"
#include "simd/flash_attention.hpp"

namespace multihead::detail {

// One Highway target's weights recompute.
struct FlashWeightsKernel {
  // Writes the weights of query rows [row_begin, row_end) of slice `slice`
  // into out [row_end − row_begin][S] (rows S apart), as
  // src/contract/attention_weights_args.hpp says; ignores args.slices,
  // args.rows and args.weights. Rows are independent: a row's weights do not
  // depend on which other rows share the call.
  void (*rows)(const AttentionWeightsArgs& args, int64_t slice, int64_t row_begin, int64_t row_end, float* out,
               FlashScratch& scratch);
  // Rows per call this target handles best (its widest query tile, the forward's).
  int64_t row_tile;
};

// The recompute compiled for Highway target `target_bit` (see targets.hpp);
// throws multihead::Error if it was not compiled in.
FlashWeightsKernel flash_weights_kernel_for(int64_t target_bit);

}  // namespace multihead::detail
