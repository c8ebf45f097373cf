// src/core/narrow_rows.hpp: whole rows between 16-bit storage (bfloat16,
// float16) and float32, vectorised (Highway, run-time dispatch).
//
// The rules are multihead/narrow.hpp's, written there once as scalars:
// widening is exact, rounding is to nearest with ties to even (NaN a quiet
// NaN with its sign, f16 overflow to ±inf). The vector forms in
// narrow_rows.cpp are transcriptions of those scalar rules into lane
// operations, bit for bit, on every target (tests/unit/test_narrow_rows.cpp
// compares them with the scalars on every bf16 tie and f16 rounding
// boundary), so which target runs never changes a bit.
//
// Rows are split across threads in fixed blocks; each element is written by
// one thread: the bits do not depend on the thread count.
#pragma once

#include <cstdint>

#include "multihead/narrow.hpp"

namespace multihead::detail {

// dst (rows × cols, rows ld_dst apart) = widen(src (rows × cols, rows
// ld_src apart)), exactly.
void widen_rows(const bfloat16* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst,
                int threads);
void widen_rows(const float16* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst,
                int threads);

// dst (rows × cols, rows ld_dst apart) = round(src + bias): each float32
// element of src (rows ld_src apart) plus, when bias is not null, the
// widened bias of its column (one float32 addition), rounded once.
void round_rows(const float* src, int64_t rows, int64_t cols, int64_t ld_src, const bfloat16* bias, bfloat16* dst,
                int64_t ld_dst, int threads);
void round_rows(const float* src, int64_t rows, int64_t cols, int64_t ld_src, const float16* bias, float16* dst,
                int64_t ld_dst, int threads);

// dst = widen(round(src + bias)): round_rows's values, kept as the float32
// numbers they are (exact), for a float32 step that reads them next (the
// 16-bit module's projections feeding the float32 attention kernel).
// src == dst (with ld_src == ld_dst) rounds in place.
void round_rows_widened(const float* src, int64_t rows, int64_t cols, int64_t ld_src, const bfloat16* bias,
                        float* dst, int64_t ld_dst, int threads);
void round_rows_widened(const float* src, int64_t rows, int64_t cols, int64_t ld_src, const float16* bias,
                        float* dst, int64_t ld_dst, int threads);

// The bf16 split of f16 values, for core/gemm.cpp's f16 product on a bf16
// matmul (the "bf16x3" way): each finite f16 x is hi + lo exactly, with
// hi = bf16(x) (nearest, ties to even) and lo = bf16(x - hi). Exact because
// x has at most 11 significant bits and hi keeps the top 8 of them (or
// rounds up past them): x - hi is a multiple of x's ulp, 2^e, of magnitude
// at most half hi's ulp, 4·2^e, so it has at most 3 significant bits, and
// bf16's exponent range holds every f16 value and difference (f16's
// smallest, 2^-24, is a normal bf16), so neither piece is a bf16 denormal.
// hi goes to `hi` and, when hi_again is not null, a second time there; lo
// to `lo` (each rows × cols, rows ld_dst apart). Returns false when some
// element is not finite (an infinity or NaN: hi + lo cannot carry it
// through three products, core/gemm.cpp then widens instead); the pieces
// written are then meaningless.
bool split_rows(const float16* src, int64_t rows, int64_t cols, int64_t ld_src, bfloat16* hi, bfloat16* hi_again,
                bfloat16* lo, int64_t ld_dst, int threads);
}  // namespace multihead::detail
