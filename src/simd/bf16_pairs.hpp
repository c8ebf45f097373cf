// src/simd/bf16_pairs.hpp: the layout of bf16 *pairs*, the operands of the
// bf16 flash kernel's pair way (flash_attention-inl.h, Bf16Way::Dot) and of
// vdpbf16ps: two bf16 values in one uint32, element 2p in the low half and
// 2p + 1 in the high half (the lane order of vdpbf16ps and of Highway's
// ReorderWidenMulAccumulate: even in the low half). An odd count's last pair
// has a zero high half.
//
// Plain scalar code, target-independent: the kernel packs a key tile with it
// (bf16_compute-inl.h's includers, once per target), and src/kernels/flash.cpp
// packs a whole call's K and V with it once (run_flash_on_pairs), so both
// ways give the same pairs.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "multihead/narrow.hpp"

namespace multihead::detail {

inline uint32_t PackPair(uint16_t even, uint16_t odd) {
  return static_cast<uint32_t>(even) | (static_cast<uint32_t>(odd) << 16);
}

// dst [rows][pairs] = the pairs of each row of src [rows][width] (rows ld
// apart), pairs = ceil(width / 2); an odd width's last pair has a zero high.
inline void PackRowPairs(const bfloat16* src, size_t ld, size_t rows, size_t width, uint32_t* dst) {
  const size_t pairs = (width + 1) / 2;
  for (size_t r = 0; r < rows; ++r) {
    const bfloat16* s = src + r * ld;
    uint32_t* d = dst + r * pairs;
    if constexpr (std::endian::native == std::endian::little) {
      // A row's pairs are its own bytes: element 2p at the lower address,
      // the low half of the little-endian word.
      std::memcpy(d, s, width / 2 * sizeof(uint32_t));
    } else {
      for (size_t p = 0; p < width / 2; ++p) d[p] = PackPair(s[2 * p].bits, s[2 * p + 1].bits);
    }
    if (width % 2 != 0) d[pairs - 1] = PackPair(s[width - 1].bits, 0);
  }
}

// dst [ceil(rows/2)][width] = the pairs down each column of src [rows][width]
// (rows ld apart): dst[p][c] = (src[2p][c], src[2p+1][c]), an odd row count's
// last pair with a zero high.
inline void PackColumnPairs(const bfloat16* src, size_t ld, size_t rows, size_t width, uint32_t* dst) {
  for (size_t p = 0; p < (rows + 1) / 2; ++p) {
    const bfloat16* even = src + 2 * p * ld;
    uint32_t* d = dst + p * width;
    if (2 * p + 1 < rows) {
      const bfloat16* odd = even + ld;
      for (size_t c = 0; c < width; ++c) d[c] = PackPair(even[c].bits, odd[c].bits);
    } else {
      for (size_t c = 0; c < width; ++c) d[c] = PackPair(even[c].bits, 0);
    }
  }
}

// The same two layouts from float32 rows, each value rounded to bf16
// (to_bfloat16: nearest even): the bf16 backward's operands are float32
// copies of bf16 values, for which the rounding is exact, so these give
// the pairs the bf16 rows themselves give (src/kernels/flash.cpp,
// attention_backward_flash).
inline void PackRowPairs(const float* src, size_t ld, size_t rows, size_t width, uint32_t* dst) {
  const size_t pairs = (width + 1) / 2;
  for (size_t r = 0; r < rows; ++r) {
    const float* s = src + r * ld;
    uint32_t* d = dst + r * pairs;
    for (size_t p = 0; p < width / 2; ++p) d[p] = PackPair(to_bfloat16(s[2 * p]).bits, to_bfloat16(s[2 * p + 1]).bits);
    if (width % 2 != 0) d[pairs - 1] = PackPair(to_bfloat16(s[width - 1]).bits, 0);
  }
}

// dst [ceil(rows/2)][ld_dst] from float rows, columns [width, ld_dst) zero
// (a padded stride keeps vector loads aligned).
inline void PackColumnPairs(const float* src, size_t ld, size_t rows, size_t width, uint32_t* dst, size_t ld_dst) {
  for (size_t p = 0; p < (rows + 1) / 2; ++p) {
    const float* even = src + 2 * p * ld;
    uint32_t* d = dst + p * ld_dst;
    if (2 * p + 1 < rows) {
      const float* odd = even + ld;
      for (size_t c = 0; c < width; ++c) d[c] = PackPair(to_bfloat16(even[c]).bits, to_bfloat16(odd[c]).bits);
    } else {
      for (size_t c = 0; c < width; ++c) d[c] = PackPair(to_bfloat16(even[c]).bits, 0);
    }
    for (size_t c = width; c < ld_dst; ++c) d[c] = 0;
  }
}

}  // namespace multihead::detail
