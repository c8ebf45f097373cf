// src/simd/flash_attention.hpp: the per-target flash attention kernel, as
// seen from src/kernels/flash.cpp (which validates, threads and calls it).
//
// Legend (as in kernel.hpp): N slices, L queries, S keys, D query/key width,
// Dv value width.
#pragma once

#include <cstddef>
#include <cstdint>

#include "contract/attention_args.hpp"

namespace multihead::detail {

// Grow-only scratch of one thread, reused across calls: the steady state
// allocates nothing. 64-byte aligned (multihead::allocate_storage).
class FlashScratch {
 public:
  FlashScratch() = default;
  FlashScratch(const FlashScratch&) = delete;
  FlashScratch& operator=(const FlashScratch&) = delete;
  ~FlashScratch();
  // At least `count` floats; contents unspecified. Grows, never shrinks.
  float* floats(std::size_t count);

 private:
  float* data_ = nullptr;
  std::size_t capacity_ = 0;
};

// One Highway target's flash kernel.
struct FlashAttentionKernel {
  // Writes out rows [row_begin, row_end) of slice `slice`, as kernel.hpp's
  // contract (src/contract/attention_args.hpp) says. Reads args.q/k/v/masks, never args.weights. Rows are
  // independent: a row's result depends on the other rows of its call only
  // through the query tile its row falls in, whose vector count sets the key
  // tiling (same_bits_rows below). Calls cut at the same multiples of
  // row_tile give bit-identical outputs.
  void (*rows)(const AttentionArgs<float>& args, int64_t slice, int64_t row_begin, int64_t row_end,
               FlashScratch& scratch);
  // The same with 16-bit storage (args.narrow.dtype BF16 or F16).
  void (*rows_bf16)(const AttentionArgs<float>& args, int64_t slice, int64_t row_begin, int64_t row_end,
                    FlashScratch& scratch);
  void (*rows_f16)(const AttentionArgs<float>& args, int64_t slice, int64_t row_begin, int64_t row_end,
                   FlashScratch& scratch);
  // Rows per call this target handles best (its widest query tile).
  int64_t row_tile;
  // Keys per key tile with that query tile (the last may take a quarter
  // more); tests put lengths on either side of it.
  int64_t key_tile;
  // Query rows of one vector (the float lanes).
  int64_t vector_rows;
  // A row's bits depend on its query tile only through the key tiling,
  // which follows the tile's vector count; this many rows (a multiple of
  // vector_rows) is the widest tile whose key tiling is a one-vector
  // tile's. Rows of a call with q_len at most this may be cut into tiles of
  // any whole vectors and keep their bits (flash.cpp's run_flash cuts a
  // decoding step's lone slice so that two threads share it).
  int64_t same_bits_rows;
};

// The kernel compiled for Highway target `target_bit` (see targets.hpp);
// throws multihead::Error if it was not compiled in.
FlashAttentionKernel flash_attention_kernel_for(int64_t target_bit);

// How the bf16 kernel of `target_bit` computes QKᵀ and PV now (targets.hpp's
// Bf16Dot): by bf16_dot_setting(), or under Auto by bf16_dot_prefers_dpbf16.
struct Bf16DotChoice {
  bool dpbf16 = false;  // the pair way (else widen and float32 FMA)
  bool native = false;  // vdpbf16ps runs here (else Highway's widening)
};
Bf16DotChoice bf16_dot_choice(int64_t target_bit);

// vdpbf16ps's FLOP rate over the float32 FMA's on this core (register
// chains, a few tens of microseconds, measured once per process and target;
// 0 without vdpbf16ps). A diagnostic for bf16_dot_current(): the choice
// never depends on it.
double bf16_dot_rate_ratio(int64_t target_bit);

}  // namespace multihead::detail
