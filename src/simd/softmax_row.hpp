// src/simd/softmax_row.hpp: the SIMD softmax numerators of one stored row of
// scores, for the materialized kernel. It uses the same exp as the flash
// kernel (src/simd/exp2-inl.h), so the two kernels round alike, and neither
// borrows from the other.
#pragma once

#include <cstddef>
#include <cstdint>

#include "multihead/narrow.hpp"

namespace multihead::detail {

// row[j] = exp(row[j] − row_max) in place, returns Σ_j row[j]. row_max must
// be finite and >= every row[j]; -inf gives exactly 0. <= 2 ulp.
using ExpRowF32Fn = float (*)(float* row, std::size_t count, float row_max);

// The largest of row[0, count) (-inf for an empty row); a NaN may or may
// not be it (a row with a NaN is NaN after the exp either way).
using RowMaxF32Fn = float (*)(const float* row, std::size_t count);

// The numerators above rounded to bf16 into out[j] (nearest even), the sum
// of the unrounded ones returned: the exp row then round_rows in one pass,
// the same bits (the bf16 matmul forward, kernels/narrow_matmul.cpp).
using ExpRowBf16Fn = float (*)(const float* row, std::size_t count, float row_max, bfloat16* out);

// The bf16 matmul backward's row in one pass (kernels/narrow_matmul.cpp):
// p16[j] = bf16(p), dx16[j] = bf16(p·(dp[j] − delta)) with
// p = exp(min(x[j] − lse, 0)), for j < count; the bits of the clamp, the
// exp above (row_max 0), the product and round_rows done one after another.
using BackwardRowBf16Fn = void (*)(const float* x, const float* dp, std::size_t count, float lse, float delta,
                                   bfloat16* p16, bfloat16* dx16);

// The functions compiled for Highway target `target_bit` (targets.hpp);
// throw multihead::Error if it was not compiled in.
ExpRowF32Fn softmax_exp_row_for(int64_t target_bit);
RowMaxF32Fn softmax_row_max_for(int64_t target_bit);
ExpRowBf16Fn softmax_exp_row_bf16_for(int64_t target_bit);
BackwardRowBf16Fn backward_row_bf16_for(int64_t target_bit);

// The vectorised 2^x for x <= 0 (exported for its unit test):
// out[i] = 2^in[i], with in[i] = -inf giving exactly 0.
void exp2_nonpositive_for_test(int64_t target_bit, const float* in, float* out, std::size_t count);

}  // namespace multihead::detail
