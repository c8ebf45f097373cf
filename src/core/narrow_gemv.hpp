// src/core/narrow_gemv.hpp: the 16-bit linear layer's product for a few
// rows (a decoding step's projections: rows = batch, usually 1), reading W
// in 16 bits and widening it in registers (Highway, run-time dispatch).
//
//   acc (rows × out) = x (rows × in) · Wᵀ,   W (out × in) rows ldw apart
//
// The gemm way (core/gemm.hpp) on a host without a native 16-bit matmul
// (bf16 below AVX-512, f16 everywhere) first widens all of W into a float32
// copy each call: for one row that writes 4 bytes and reads 6 per weight,
// where this reads 2. Products of two 16-bit values are exact in float32
// (outside float32's underflow) and each output is one float32 sum over in
// terms, so the error bound is the gemm way's (docs/precision.md); only the
// order of the sums differs. Each output column is computed by one thread
// with the same instructions whatever the thread count: the same bits for
// 1 thread or 8 (tests/test_narrow_gemv.cpp checks both).
#pragma once

#include <cstdint>

#include "multihead/narrow.hpp"

namespace multihead::detail {

// acc[r·ld_acc + o] = Σ_i x[r·ldx + i] · W[o·ldw + i], float32 sums.
void narrow_gemv(int64_t rows, int64_t out, int64_t in, const bfloat16* x, int64_t ldx, const bfloat16* w,
                 int64_t ldw, float* acc, int64_t ld_acc, int threads);
void narrow_gemv(int64_t rows, int64_t out, int64_t in, const float16* x, int64_t ldx, const float16* w,
                 int64_t ldw, float* acc, int64_t ld_acc, int threads);

}  // namespace multihead::detail
