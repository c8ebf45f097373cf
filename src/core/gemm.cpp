// src/core/gemm.cpp: gemm() through oneDNN (float) and CBLAS (double).
#include "core/gemm.hpp"

#include <cblas.h>
#if MULTIHEAD_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

#include <climits>
#include <stdexcept>

#include "multihead/error.hpp"

namespace multihead::detail {
namespace {

CBLAS_TRANSPOSE to_cblas(Trans t) { return t == Trans::Yes ? CblasTrans : CblasNoTrans; }

// CBLAS takes int (blasint is 32-bit in Debian's OpenBLAS). A dimension that
// does not fit is reported rather than silently truncated.
int checked_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw Error(Error::Kind::Value, std::string("gemm: ") + what + " = " + std::to_string(v) +
                                        " does not fit BLAS's 32-bit int");
  return static_cast<int>(v);
}

// C = beta · C, the whole product when K = 0 (BLAS would reject lda = 0).
template <class T>
void scale_only(int64_t M, int64_t N, T beta, T* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
}

}  // namespace

void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_only(M, N, beta, C, ldc);
#if MULTIHEAD_WITH_ONEDNN
  const dnnl_status_t st = dnnl_sgemm(ta == Trans::Yes ? 'T' : 'N', tb == Trans::Yes ? 'T' : 'N', M, N, K,
                                      alpha, A, lda, B, ldb, beta, C, ldc);
  if (st != dnnl_success)
    throw Error(Error::Kind::Value, "gemm: oneDNN sgemm failed with status " + std::to_string(int(st)));
#else
  cblas_sgemm(CblasRowMajor, to_cblas(ta), to_cblas(tb), checked_int(M, "M"), checked_int(N, "N"),
              checked_int(K, "K"), alpha, A, checked_int(lda, "lda"), B, checked_int(ldb, "ldb"),
              beta, C, checked_int(ldc, "ldc"));
#endif
}

void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, double alpha,
                  const double* A, int64_t lda, const double* B, int64_t ldb, double beta,
                  double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_only(M, N, beta, C, ldc);
  cblas_dgemm(CblasRowMajor, to_cblas(ta), to_cblas(tb), checked_int(M, "M"), checked_int(N, "N"),
              checked_int(K, "K"), alpha, A, checked_int(lda, "lda"), B, checked_int(ldb, "ldb"),
              beta, C, checked_int(ldc, "ldc"));
}

void set_blas_threads(int threads) {
  if (threads > 0) openblas_set_num_threads(threads);
}
int blas_threads() { return openblas_get_num_threads(); }

}  // namespace multihead::detail
