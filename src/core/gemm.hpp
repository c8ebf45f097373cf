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

// Threads BLAS may use; <= 0 leaves BLAS's own default (OPENBLAS_NUM_THREADS).
void set_blas_threads(int threads);
int blas_threads();

}  // namespace multihead::detail
