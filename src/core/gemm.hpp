// src/core/gemm.hpp: the one matrix-product interface of the library.
//
// Every dense product (projections, the materialised QKᵀ and PV) goes through
// gemm(), so a later kernel can replace it in one place.
//  - float: oneDNN's sgemm. Measured on a 2-core Zen 5 machine, full
//    forward (1, 2048, 768, 12), 2 threads: 95 ms with oneDNN vs 228 ms with
//    OpenBLAS. oneDNN dispatches on CPUID (OpenBLAS here obeys
//    OPENBLAS_CORETYPE=Haswell and runs AVX2 kernels) and threads with the
//    same OpenMP runtime as our kernels, so its workers and ours never spin
//    against each other.
//  - double: OpenBLAS through CBLAS (the float64 path is the exact one). Row-major:
//   C (M×N) = alpha · op(A) (M×K) · op(B) (K×N) + beta · C
// op(X) = X or Xᵀ. Leading dimensions are row strides, as in CBLAS RowMajor.
#pragma once

#include <cstdint>

namespace multihead::detail {

enum class Trans { No, Yes };

void gemm(Trans trans_a, Trans trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc);
void gemm(Trans trans_a, Trans trans_b, int64_t M, int64_t N, int64_t K, double alpha,
          const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C,
          int64_t ldc);

// The same product, cut into fixed blocks of gemm_row_block(M, N, K) rows of
// C whatever the thread count; each block is one gemm call with the whole K,
// run by one thread with BLAS held to that thread. Every element of C is then
// computed by the same instructions in the same order for 1 thread or 8: a
// BLAS may split K across its threads and add the partial sums in an order
// that depends on how many there are (oneDNN's driver has such a partition
// for small-M, small-N, large-K shapes, the shape of a weight gradient
// d_W = d_yᵀ x), or choose another kernel by thread count (OpenBLAS's
// single-threaded small-matrix path), and bit-identical results should not
// rest on a library's heuristics. threads <= 0: OpenMP's default.
// (float64 runs one block at a time: OpenBLAS, its BLAS, keeps its own
// thread pool and is not called concurrently here.)
void gemm_blocked(Trans trans_a, Trans trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                  const float* B, int64_t ldb, float beta, float* C, int64_t ldc, int threads);
void gemm_blocked(Trans trans_a, Trans trans_b, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda,
                  const double* B, int64_t ldb, double beta, double* C, int64_t ldc, int threads);

// Rows per block of gemm_blocked: a function of the shape alone. Each block
// call packs op(B) (K × N) again, so blocks are small (kMinRowBlock rows)
// only while op(B) is small, and otherwise a quarter of M: measured, oneDNN
// sgemm with one thread per block against one call on both threads (2-core
// Zen 5, M × N × K): 1024 × 1536 × 512: 32-row blocks 291 GFLOP/s, 256-row
// 420, one call 423; 2048 × 2304 × 768: 318, 512-row 428, one call 430;
// while at 2304 × 768 × 2048 (a weight gradient) every block size measured
// within 15% of one call. Blocks of 32 rows also keep the trainer's products
// as they were when it pinned its losses (the shipped model).
constexpr int64_t kMinRowBlock = 32;
int64_t gemm_row_block(int64_t M, int64_t N, int64_t K);

// Threads BLAS may use; <= 0 leaves BLAS's own default (OPENBLAS_NUM_THREADS).
void set_blas_threads(int threads);
int blas_threads();

}  // namespace multihead::detail
