// src/train/products.cpp: see products.hpp.
#include "train/products.hpp"

#include <algorithm>

#include <omp.h>

namespace multihead::train {
namespace {

template <class T>
void blocked(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
             int64_t ldb, T beta, T* C, int64_t ldc, int threads) {
  if (M == 0 || N == 0) return;
  const int64_t blocks = (M + kRowBlock - 1) / kRowBlock;
  const int team = static_cast<int>(std::min<int64_t>(blocks, threads > 0 ? threads : omp_get_max_threads()));
#pragma omp parallel num_threads(team)
  {
    // This implicit task's own nthreads ICV: BLAS (oneDNN reads
    // omp_get_max_threads()) runs each block on this one thread, also when
    // the team has a single member and the region is inactive.
    omp_set_num_threads(1);
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t m0 = blk * kRowBlock, rows = std::min(kRowBlock, M - m0);
      // Row m0 of op(A): row m0 of A, or column m0 of A when transposed.
      const T* a = ta == Trans::No ? A + m0 * lda : A + m0;
      detail::gemm(ta, tb, rows, N, K, T(1), a, lda, B, ldb, beta, C + m0 * ldc, ldc);
    }
  }
}

}  // namespace

void matmul(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
            int64_t ldb, float beta, float* C, int64_t ldc, int threads) {
  blocked(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, threads);
}

// float64 runs only in tests: one block at a time, since OpenBLAS (the
// double path) keeps its own thread pool and is not called concurrently here.
void matmul(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda, const double* B,
            int64_t ldb, double beta, double* C, int64_t ldc, int /*threads*/) {
  blocked(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, 1);
}

}  // namespace multihead::train
