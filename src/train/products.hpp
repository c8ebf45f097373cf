// src/train/products.hpp: the trainer's matrix products, deterministic for
// any thread count.
//
// A BLAS may split a product's inner dimension K across its threads and add
// the partial sums in an order that depends on how many there are (oneDNN's
// gemm driver has such a K partition for small-M, small-N, large-K shapes,
// the shape of a weight gradient d_W = d_yᵀ x over all tokens). We did not
// see it happen at the trainer's shapes on this machine, but bit-identical
// losses should not rest on a library's heuristics. So C is cut into fixed
// blocks of kRowBlock rows, whatever the thread count; each block is one
// gemm call with the whole K, run by one thread with BLAS held to one
// thread. Every element of C is then computed by the same instructions in
// the same order for 1 thread or 8, which is what makes a training run's
// losses bit-identical across --threads.
//
//   C (M×N) = op(A) (M×K) · op(B) (K×N) + beta · C     (row-major, as gemm.hpp)
#pragma once

#include <cstdint>

#include "core/gemm.hpp"

namespace multihead::train {

using detail::Trans;

constexpr int64_t kRowBlock = 32;

// threads <= 0: OpenMP's default.
void matmul(Trans trans_a, Trans trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
            const float* B, int64_t ldb, float beta, float* C, int64_t ldc, int threads);
void matmul(Trans trans_a, Trans trans_b, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda,
            const double* B, int64_t ldb, double beta, double* C, int64_t ldc, int threads);

}  // namespace multihead::train
