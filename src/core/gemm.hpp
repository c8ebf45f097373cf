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
//  - double: OpenBLAS through CBLAS (the float64 path is the exact one).
//  - bfloat16 / float16 inputs (the narrow modules, multihead/narrow.hpp),
//    float32 products, sums and C: bf16 through oneDNN's bf16 matmul
//    (vdpbf16ps on AVX512_BF16, oneDNN's emulation on other AVX-512 CPUs,
//    the widened product below AVX-512, where oneDNN has none); f16
//    widens A and B to float32 (as stored, core/narrow_rows.hpp) and runs
//    the float product with the same Trans flags, since oneDNN 2.6 (Debian
//    12) has no f16 matmul on CPUs (its primitive descriptor is refused),
//    and so does bf16 in a build without oneDNN. gemm_blocked widens each
//    operand once, with all threads, before its blocks run.
//    Either way every product of two 16-bit values is exact in float32 and
//    the K-term sums are float32 sums: the error bound of docs/precision.md.
//  - f16 on a bf16 matmul, the "bf16x3" way, where oneDNN's bf16 matmul
//    runs on AMX (or where forced): every f16 value is exactly hi + lo, two
//    bf16 numbers (core/narrow_rows.hpp, split_rows), so
//      A·B = Ah·Bh + Al·Bh + Ah·Bl + Al·Bl,
//    and the first three are one bf16 matmul over a K three times as long
//    (A' = [Ah Al Ah], B' = [Bh; Bh; Bl]): exact bf16 products, float32
//    sums. The dropped Al·Bl is at most 2^-16·Σ|a||b| (|lo| <= 2^-8 |x|),
//    below f16's own rounding of the result (2^-11) and below the float32
//    sums' worst case, γ_3K, from K = 86 on; docs/precision.md adds it to the
//    bound. It pays where the bf16 matmul runs at more than three times the
//    float32 one: AMX (tdpbf16ps: a 16×16 tile of float32 sums of 32 bf16
//    products per instruction) did 2217 GFLOP/s against oneDNN's sgemm's
//    368 (4096 × 3072 × 1024, 2 threads, Intel Xeon with AMX, 2026-12-06);
//    vdpbf16ps runs at most twice the FMA's rate (AMD Zen 4/5, README
//    "Precision"), so there the three products would be slower. Operands
//    holding an infinity or NaN widen (hi + lo cannot carry one through
//    three products), and so do calls of fewer than 256 rows or 16
//    columns (split_pays: the splitting and oneDNN's packing of B per call
//    would cost more than the products save). MULTIHEAD_F16_GEMM=auto|widen|bf16x3 or
//    f16_gemm_force (multihead/runtime.hpp) chooses for the process.
// Row-major:
//   C (M×N) = alpha · op(A) (M×K) · op(B) (K×N) + beta · C
// op(X) = X or Xᵀ. Leading dimensions are row strides, as in CBLAS RowMajor.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "multihead/narrow.hpp"

namespace multihead::detail {

enum class Trans { No, Yes };

void gemm(Trans trans_a, Trans trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc);
void gemm(Trans trans_a, Trans trans_b, int64_t M, int64_t N, int64_t K, double alpha,
          const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C,
          int64_t ldc);
void gemm(Trans trans_a, Trans trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const bfloat16* A, int64_t lda, const bfloat16* B, int64_t ldb, float beta, float* C,
          int64_t ldc);
void gemm(Trans trans_a, Trans trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float16* A, int64_t lda, const float16* B, int64_t ldb, float beta, float* C,
          int64_t ldc);

// The same product, cut into fixed blocks of C (gemm_blocks) whatever the
// thread count; each block is one gemm call with the whole K, run by one
// thread with BLAS held to that thread. Every element of C is then computed
// by the same instructions in the same order for 1 thread or 8: a BLAS may
// split K across its threads and add the partial sums in an order that
// depends on how many there are (oneDNN's driver has such a partition for
// small-M, small-N, large-K shapes, the shape of a weight gradient
// d_W = d_yᵀ x), or choose another kernel by thread count (OpenBLAS's
// single-threaded small-matrix path), and bit-identical results should not
// rest on a library's heuristics. threads <= 0: OpenMP's default. On
// OpenBLAS (float64, and float32 without oneDNN), which has only a
// process-wide thread count, that count is held at 1 while such a product
// runs (gemm.cpp says how). A failing block (oneDNN's status) throws after
// the parallel region, never from inside it.
void gemm_blocked(Trans trans_a, Trans trans_b, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda,
                  const double* B, int64_t ldb, double beta, double* C, int64_t ldc, int threads);
// float or 16-bit A and B, float C. after_block, if given, runs on the
// thread that computed each block of C, right after it (rows [m0, m0 + rows), columns
// [n0, n0 + cols)), while the block is in that core's cache: the 16-bit
// linear layer rounds its sums there (core/linear.cpp) instead of in a
// second pass over C.
using BlockEpilogue = std::function<void(int64_t m0, int64_t rows, int64_t n0, int64_t cols)>;
void gemm_blocked(Trans trans_a, Trans trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                  const float* B, int64_t ldb, float beta, float* C, int64_t ldc, int threads,
                  const BlockEpilogue& after_block = {});
void gemm_blocked(Trans trans_a, Trans trans_b, int64_t M, int64_t N, int64_t K, const bfloat16* A, int64_t lda,
                  const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc, int threads,
                  const BlockEpilogue& after_block = {});
void gemm_blocked(Trans trans_a, Trans trans_b, int64_t M, int64_t N, int64_t K, const float16* A, int64_t lda,
                  const float16* B, int64_t ldb, float beta, float* C, int64_t ldc, int threads,
                  const BlockEpilogue& after_block = {});

// The blocks of gemm_blocked: a function of the shape alone. Each block call
// packs its part of op(B) (K × N) again, so
//  - while op(B) is small (N·K < 2¹⁶ numbers, 256 KiB of floats), blocks of
//    kMinRowBlock rows and every column: the packing is cheap, and these are
//    the trainer's shapes, whose bits the shipped model pins;
//  - otherwise quarters of the longer side: of M (multiples of 32 rows)
//    when M >= N, each block re-packing op(B); else of N (multiples of 64
//    columns), each block re-packing op(A), the smaller then. Measured,
//    oneDNN sgemm with one thread per block against one call on both
//    threads (2-core AMD EPYC Zen 5, medians of 7 alternated rounds, ms;
//    M × N × K): 682 × 3072 × 1024 (a head-major in_projection block):
//    192-row blocks 11.7, 768-column blocks 10.1, one call 10.2;
//    4096 × 1024 × 1024: 1024-row blocks 20.1, one call 20.2;
//    128 × 1536 × 512: 0.45 every way; a decoding step 1 × 4096 × 4096
//    from W: 1024-column blocks 1.62, one call 1.64; and with 32-row
//    blocks instead of quarters, 1024 × 1536 × 512 ran at 291 GFLOP/s
//    against 423 for one call.
//  The price of four blocks: one large product uses at most 4 threads
//  (this machine has 2; a host with more would want more blocks, which on
//  2 cores cost up to 13% in packing).
constexpr int64_t kMinRowBlock = 32;
struct GemmBlocks {
  int64_t rows, cols;
};
GemmBlocks gemm_blocks(int64_t M, int64_t N, int64_t K);
// The blocks of a product on oneDNN's bf16 matmul (bf16, f16's bf16x3):
// gemm_blocks', except that a product of more than kMinRowBlock rows which
// gemm_blocks would cut into columns is cut into quarters of its rows: the
// brgemm matmul (AMX, vdpbf16ps) of oneDNN 2.6 takes only dense rows of C
// (gemm.cpp says what a column block cost).
GemmBlocks gemm_blocks_16bit(int64_t M, int64_t N, int64_t K);

// Whether a product of 16-bit E (bfloat16, float16) runs natively here (a
// 16-bit matmul: oneDNN's bf16 one, from AVX-512 on; for float16, the
// bf16x3 way, which skips products of few rows: native_16bit_product) rather than on
// widened float copies of both operands (widened as stored, with the same
// Trans flags and blocks as the float32 product). Where it does not, a caller
// that already holds exact float32 copies of its operands (the 16-bit
// modules' kept weight copies) gets the same bits from gemm_blocked on
// those copies. (core/linear.cpp's few-row product reads W in 16 bits
// where it does not.)
template <class E>
bool native_16bit_gemm();
// The same for one gemm_blocked product of this shape: for float16, whether
// it takes the bf16x3 way (which skips products of few rows or columns,
// gemm.cpp's split_pays); for bfloat16, native_16bit_gemm.
template <class E>
bool native_16bit_product(int64_t M, int64_t N, int64_t K);
// oneDNN's implementation of a bf16 matmul of a projection's size on this
// CPU (e.g. "brg:avx512_core_amx_bf16"), "" where it has none (below
// AVX-512, or a build without oneDNN); and whether that is AMX (tile
// products at several times the float32 FMA's rate): the rule that
// chooses the 16-bit ways which pay only there (f16's bf16x3 products, the
// 16-bit attention's matmul way, kernels/narrow_matmul.hpp).
std::string bf16_matmul_implementation();
bool bf16_matmul_on_amx();
// MULTIHEAD_F16_GEMM's value, checked (check_environment).
void check_f16_gemm_environment();
// multihead/runtime.hpp's f16_gemm_force and f16_gemm_current.
void f16_gemm_force(const std::string& way);
std::string f16_gemm_current();

// Threads BLAS may use; <= 0 leaves BLAS's own default (OPENBLAS_NUM_THREADS).
void set_blas_threads(int threads);
int blas_threads();

}  // namespace multihead::detail
