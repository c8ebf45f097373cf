// src/core/linear.hpp: nn.Linear, forward and backward: the one linear
// layer of the library. The MHA and GQA projections (in_projection,
// out_projection) and the trainer's feed-forward and read-out all run it.
//
//   forward:   y (rows × out) = x (rows × in) · Wᵀ + b          (torch.nn.functional.linear)
//   backward:  d_x (rows × in)  = d_y · W
//              d_W (out × in)   = d_yᵀ · x
//              d_b (out)        = Σ_rows d_y
//
// Each result is written, or added to what is there with `accumulate` (the
// trainer sums a gradient over its uses; GQA's d_x sums its three
// projections). W is (out × in) as nn.Linear stores it, or its transpose
// (in × out) when the caller keeps one (attention/projection_weights.hpp says
// why); d_W is always (out × in), contiguous, as the parameter it belongs to.
//
// Every product goes through gemm_blocked (core/gemm.hpp): fixed row blocks
// of the result, whatever the thread count, so the layer gives the same bits
// for 1 thread or 8, forward and backward (MhaBackward.SameBitsForOneAndTwo
// Threads and TrainDeterminism check it).
#pragma once

#include <cstdint>

#include "multihead/narrow.hpp"

namespace multihead::detail {

// A weight as the products read it. ld is the row stride of what `data`
// points to: W (out × in) or, transposed, Wᵀ (in × out).
template <class T>
struct LinearWeight {
  const T* data = nullptr;
  int64_t ld = 0;
  bool transposed = false;
  int64_t in = 0, out = 0;

  // W (out × in) as stored, rows ld apart (ld = in unless W is a block of a
  // wider matrix).
  static LinearWeight stored(const T* w, int64_t out, int64_t in, int64_t ld = 0) {
    return {w, ld > 0 ? ld : in, false, in, out};
  }
  // Wᵀ (in × out), rows ld apart (ld = out unless Wᵀ is a column block of a
  // wider matrix, as W_qᵀ is of the packed (E × 3E) copy).
  static LinearWeight transpose(const T* wt, int64_t out, int64_t in, int64_t ld = 0) {
    return {wt, ld > 0 ? ld : out, true, in, out};
  }
};

struct LinearOptions {
  bool accumulate = false;  // add into y (forward) or d_x, d_W, d_b (backward) instead of writing them
  int threads = 0;          // <= 0: OpenMP's default (omp_get_max_threads())
};

// The `rows` rows of x, ldx apart (0: in, rows packed).
template <class T>
struct LinearRows {
  int64_t rows = 0;
  const T* x = nullptr;
  int64_t ldx = 0;
};

// y = x · Wᵀ + b (b may be null: no bias), y's rows ldy apart (0: out).
template <class T>
void linear_forward(const LinearRows<T>& x, const LinearWeight<T>& w, const T* b, T* y, int64_t ldy,
                    const LinearOptions& options = {});

// The 16-bit layer (bfloat16, float16: the narrow modules): x, W, b and y
// in 16 bits; x · Wᵀ through the 16-bit gemm (core/gemm.hpp: exact
// products, float32 sums), + b in float32, then each y rounded once to
// nearest even. accumulate is refused (y holds no float32 sum to add to).
// For at most kNarrowGemvMaxRows rows (a decoding step) from W as stored,
// on a host without a native 16-bit matmul (native_16bit_gemm), x · Wᵀ is
// core/narrow_gemv.hpp's product instead, reading W in 16 bits where the
// gemm way widens all of it to a float32 copy first: the same error bound,
// another order of the float32 sums. narrow_gemv_enabled(false), or
// MULTIHEAD_NARROW_GEMV=gemm in the environment, forces the gemm way.
template <>
void linear_forward<bfloat16>(const LinearRows<bfloat16>& x, const LinearWeight<bfloat16>& w, const bfloat16* b,
                              bfloat16* y, int64_t ldy, const LinearOptions& options);
template <>
void linear_forward<float16>(const LinearRows<float16>& x, const LinearWeight<float16>& w, const float16* b,
                             float16* y, int64_t ldy, const LinearOptions& options);

// The 16-bit layer through a stacked weight, e.g. self-attention's
// in_projection [W_q; W_k; W_v]: w (parts·n × in), one product x · Wᵀ,
// each column block j of its sums (+ b's block j) rounded into y[j]
// (rows × n, packed). The same float32 sums and one rounding per element
// as `parts` calls of linear_forward<E>, one per block of W; one product
// with wider blocks in place of `parts` products and parallel regions (the
// bf16 forward at (1, 128, 512, 8) ran three in_projection products of
// 128 × 512 × 512). Where linear_forward<E> takes the few-row product, this
// is those calls. w is W as stored (not transposed); parts > 0 divides w.out.
template <class E>
void linear_forward_stacked(const LinearRows<E>& x, const LinearWeight<E>& w, const E* b, E* const* y, int64_t parts,
                            const LinearOptions& options = {});

// The rows up to which the 16-bit forward takes the few-row product: a
// decoding step's batch. Measured (docs/decoding.md, "16-bit weights"; AVX2,
// E 2048, bf16): a step took 2.9 ms against the gemm way's 8.5-10.3 at 1
// row, and 10.6-12.4 against 18.6-19.9 at 8.
inline constexpr int64_t kNarrowGemvMaxRows = 8;
// false forces the gemm way for every 16-bit linear_forward (the switch the
// tests compare the two ways with); true (the default) allows the few-row
// product where it applies.
void narrow_gemv_enabled(bool enabled);
// Throws multihead::Error naming MULTIHEAD_NARROW_GEMV if it holds neither
// auto nor gemm (multihead::check_environment).
void check_narrow_gemv_environment();

// The 16-bit layer from exact float32 copies of its operands: y =
// round(x · Wᵀ + b), x (rows packed, ldx = in) and W (as stored, out × in,
// packed) the float32 widenings of 16-bit values, b and y in E. Where
// linear_forward<E> itself runs the float product of such copies
// (narrow_linear_is_widened_gemm), the bits are the same, without the
// widening: the 16-bit modules keep float32 copies of their weights for it,
// and widen an input once for all the products that read it.
template <class E>
void linear_forward_widened(const LinearRows<float>& x, const LinearWeight<float>& w, const E* b, E* y, int64_t ldy,
                            const LinearOptions& options = {});
// Whether linear_forward<E> of `rows` rows through w computes as the float
// gemm of exact float32 copies of x and W: no native 16-bit matmul, and not
// the few-row product (which sums in its own order).
template <class E>
bool narrow_linear_is_widened_gemm(const LinearWeight<E>& w, int64_t rows);

// What the backward writes; a null pointer skips that gradient.
template <class T>
struct LinearGradients {
  T* d_x = nullptr;  // (rows × in), rows ld_dx apart (0: in)
  int64_t ld_dx = 0;
  T* d_W = nullptr;  // (out × in), contiguous
  T* d_b = nullptr;  // (out)
};

// Given d_y (rows × out, rows ld_dy apart; 0: out), the gradients of
// y = x · Wᵀ + b with respect to x, W and b.
template <class T>
void linear_backward(const LinearRows<T>& x, const LinearWeight<T>& w, const T* d_y, int64_t ld_dy,
                     const LinearGradients<T>& g, const LinearOptions& options = {});

// The 16-bit backward (bfloat16, float16): each of d_x = d_y · W,
// d_W = d_yᵀ · x through the 16-bit gemm (exact products, float32 sums) and
// d_b = Σ_rows d_y in float32, then rounded once to nearest even.
// accumulate is refused (no float32 sum is kept to add to).
template <>
void linear_backward<bfloat16>(const LinearRows<bfloat16>& x, const LinearWeight<bfloat16>& w, const bfloat16* d_y,
                               int64_t ld_dy, const LinearGradients<bfloat16>& g, const LinearOptions& options);
template <>
void linear_backward<float16>(const LinearRows<float16>& x, const LinearWeight<float16>& w, const float16* d_y,
                              int64_t ld_dy, const LinearGradients<float16>& g, const LinearOptions& options);

// out[c] (+)= Σ_r x[r·ld + c], r in order: a bias's gradient, the sum over
// the rows it was added to. Threads split the columns, so the bits do not
// depend on the thread count.
template <class T>
void column_sums(int64_t rows, int64_t cols, const T* x, int64_t ld, T* out, bool accumulate, int threads);

}  // namespace multihead::detail
