// src/core/gemm.cpp: gemm() through oneDNN (float) and CBLAS (double).
#include "core/gemm.hpp"

#include <cblas.h>
#if MULTIHEAD_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <compare>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/narrow_rows.hpp"
#include "core/parallel.hpp"
#include "core/switches.hpp"
#include "core/thread_scratch.hpp"
#include "multihead/error.hpp"

#include <omp.h>

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

namespace {

// A 16-bit X as stored (op(X) is rows × cols; X itself is cols × rows when
// transposed), widened exactly into a packed float copy in `scratch` with
// the same orientation, so the float product takes the same Trans flags and
// sums in the same order as the float32 path on the same (rounded) values.
struct WidenedOperand {
  const float* data = nullptr;
  int64_t ld = 0;
};
template <class E>
WidenedOperand widened(Trans t, int64_t rows, int64_t cols, const E* X, int64_t ld, ThreadScratch& scratch,
                       int threads) {
  const int64_t stored_rows = t == Trans::No ? rows : cols, stored_cols = t == Trans::No ? cols : rows;
  float* copy = scratch.take(static_cast<std::size_t>(stored_rows * stored_cols));
  widen_rows(X, stored_rows, stored_cols, ld, copy, stored_cols, threads);
  return {copy, stored_cols};
}

// The widening product: exact float copies of A and B, then the float gemm.
// (Called on pool threads too: each thread has its own copies.)
template <class E>
void widened_gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const E* A, int64_t lda,
                  const E* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  thread_local ThreadScratch scratch_a, scratch_b;
  const WidenedOperand a = widened(ta, M, K, A, lda, scratch_a, 1), b = widened(tb, K, N, B, ldb, scratch_b, 1);
  gemm(ta, tb, M, N, K, alpha, a.data, a.ld, b.data, b.ld, beta, C, ldc);
}

// A float16 operand as the bf16x3 product reads it (gemm.hpp, "f16 on a
// bf16 matmul"): op(X)'s K axis three times as long, its pieces along K
// in the order (hi, lo, hi) for A and (hi, hi, lo) for B, so that
// op(A')·op(B') = Ah·Bh + Al·Bh + Ah·Bl; stored with X's orientation, so the
// product takes the same Trans flags. K runs along X's stored columns for
// A as stored and for Bᵀ, along its stored rows otherwise.
struct SplitOperand {
  const bfloat16* data = nullptr;
  int64_t ld = 0;
  bool finite = true;  // false: X holds an infinity or NaN (nothing usable)
};
enum class Operand { A, B };
SplitOperand split_operand(Operand which, Trans t, int64_t rows, int64_t cols, const float16* X, int64_t ld,
                           BasicThreadScratch<bfloat16>& scratch, int threads) {
  const int64_t stored_rows = t == Trans::No ? rows : cols, stored_cols = t == Trans::No ? cols : rows;
  const bool k_along_columns = (which == Operand::A) == (t == Trans::No);
  bfloat16* out = scratch.take(static_cast<std::size_t>(3 * stored_rows * stored_cols));
  // piece j's start and the new row stride
  const int64_t step = k_along_columns ? stored_cols : stored_rows * stored_cols;
  const int64_t ld_out = k_along_columns ? 3 * stored_cols : stored_cols;
  bfloat16* piece[3] = {out, out + step, out + 2 * step};
  bfloat16* hi = piece[0];
  bfloat16* hi_again = which == Operand::A ? piece[2] : piece[1];
  bfloat16* lo = which == Operand::A ? piece[1] : piece[2];
  const bool finite = split_rows(X, stored_rows, stored_cols, ld, hi, hi_again, lo, ld_out, threads);
  return {out, ld_out, finite};
}

#if MULTIHEAD_WITH_ONEDNN
// oneDNN's matmul primitive on bf16 op(A), op(B) (strided views, no copy)
// and a float C; alpha as its output scale, beta through a sum post-op.
// Returns false, having computed nothing, where oneDNN has no bf16 matmul:
// oneDNN 2.6 has one from AVX-512 on (avx512_core emulates the bf16
// products, avx512_core_bf16 runs vdpbf16ps) and refuses the primitive
// descriptor below it (AVX2, or ONEDNN_MAX_CPU_ISA=AVX2); the refusal is
// remembered, and the widened product runs instead.
//
// The primitive of each product shape (sizes, strides, flags, alpha, beta)
// is made once per thread and kept (at most kKeptBf16Matmuls shapes, then
// the thread's set starts again), so that a primitive descriptor, which
// walks oneDNN's implementation list on every construction, is built once
// per shape rather than per call. Measured on a (1, 128, 512, 8) bf16
// forward (AMD Zen 5): no difference within the noise (0.76 against 0.75
// ms), so it is a saving of work, not a measured speed-up. Per thread,
// because oneDNN built with its default DNNL_ENABLE_CONCURRENT_EXEC=OFF
// shares one scratchpad between primitives and requires a primitive to run
// on the thread that created it.
struct Bf16MatmulShape {
  int64_t M, N, K, lda, ldb, ldc;
  bool ta, tb;
  float alpha, beta;
  auto operator<=>(const Bf16MatmulShape&) const = default;
};
constexpr std::size_t kKeptBf16Matmuls = 64;

bool onednn_bf16_gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A,
                      int64_t lda, const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  using dnnl::memory;
  static std::atomic<bool> refused{false};
  if (refused.load(std::memory_order_relaxed)) return false;
  try {
    static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    struct Made {
      dnnl::matmul::primitive_desc pd;
      dnnl::matmul matmul;
    };
    thread_local std::map<Bf16MatmulShape, Made> made;
    thread_local std::optional<dnnl::stream> stream;
    const Bf16MatmulShape shape{M, N, K, lda, ldb, ldc, ta == Trans::Yes, tb == Trans::Yes, alpha, beta};
    auto it = made.find(shape);
    if (it == made.end()) {
      const memory::desc a_md({M, K}, memory::data_type::bf16,
                              ta == Trans::No ? memory::dims{lda, 1} : memory::dims{1, lda});
      const memory::desc b_md({K, N}, memory::data_type::bf16,
                              tb == Trans::No ? memory::dims{ldb, 1} : memory::dims{1, ldb});
      const memory::desc c_md({M, N}, memory::data_type::f32, memory::dims{ldc, 1});
      dnnl::primitive_attr attr;
      if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
      if (beta != 0.0f) {
        dnnl::post_ops ops;
        ops.append_sum(beta);
        attr.set_post_ops(ops);
      }
      std::optional<dnnl::matmul::primitive_desc> pd;
      try {
        pd.emplace(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine);
      } catch (const dnnl::error& e) {
        if (e.status != dnnl_unimplemented) throw;
        refused.store(true, std::memory_order_relaxed);
        return false;
      }
      if (made.size() >= kKeptBf16Matmuls) made.clear();
      dnnl::matmul matmul(*pd);
      it = made.emplace(shape, Made{std::move(*pd), std::move(matmul)}).first;
    }
    if (!stream) stream.emplace(engine);
    const Made& m = it->second;
    memory a(m.pd.src_desc(), engine, const_cast<bfloat16*>(A)), b(m.pd.weights_desc(), engine, const_cast<bfloat16*>(B)),
        c(m.pd.dst_desc(), engine, C);
    m.matmul.execute(*stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    stream->wait();
    return true;
  } catch (const dnnl::error& e) {
    throw Error(Error::Kind::Value, std::string("gemm: oneDNN bf16 matmul failed: ") + e.what());
  }
}

// oneDNN's implementation of a bf16 matmul of a projection's size (256 ×
// 256 × 256), e.g. "brg:avx512_core_amx_bf16"; "" where it has none.
const std::string& onednn_bf16_matmul_impl() {
  static const std::string impl = [] {
    using dnnl::memory;
    try {
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      const memory::desc a_md({256, 256}, memory::data_type::bf16, memory::dims{256, 1});
      const memory::desc c_md({256, 256}, memory::data_type::f32, memory::dims{256, 1});
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, a_md, c_md), engine);
      return std::string(pd.impl_info_str());
    } catch (const dnnl::error&) {
      return std::string();
    }
  }();
  return impl;
}

// Whether oneDNN has a bf16 matmul on this CPU: from AVX-512 on, not below.
bool onednn_has_bf16_matmul() { return !onednn_bf16_matmul_impl().empty(); }
#endif

enum class F16Products { Auto, Widen, Bf16x3 };

// F16Products' names, in its order.
constexpr std::string_view kF16ProductNames[] = {"auto", "widen", "bf16x3"};

F16Products parse_f16_products(const std::string& name, const std::string& what) {
  return static_cast<F16Products>(switch_choice(what, name, kF16ProductNames));
}

// MULTIHEAD_F16_GEMM, parsed once.
F16Products env_f16_products() {
  static const F16Products way =
      static_cast<F16Products>(env_switch("MULTIHEAD_F16_GEMM", kF16ProductNames));
  return way;
}

std::atomic<int> g_forced_f16_products{static_cast<int>(F16Products::Auto)};

F16Products f16_products_setting() {
  const auto forced = static_cast<F16Products>(g_forced_f16_products.load(std::memory_order_relaxed));
  return forced != F16Products::Auto ? forced : env_f16_products();
}

// The f16 product's way now, and why: the one rule, read by every product
// (f16_products_split) and spelled out by f16_gemm_current.
enum class F16Why { NoMatmul, ForcedWithoutMatmul, Forced, Amx, NotAmx, NoOneDnn };
struct F16Choice {
  bool bf16x3;
  F16Why why;
};
F16Choice f16_choice() {
  const F16Products setting = f16_products_setting();
#if MULTIHEAD_WITH_ONEDNN
  if (!onednn_has_bf16_matmul())
    return {false, setting == F16Products::Bf16x3 ? F16Why::ForcedWithoutMatmul : F16Why::NoMatmul};
  if (setting != F16Products::Auto) return {setting == F16Products::Bf16x3, F16Why::Forced};
  const bool amx = bf16_matmul_on_amx();
  return {amx, amx ? F16Why::Amx : F16Why::NotAmx};
#else
  (void)setting;
  return {false, F16Why::NoOneDnn};
#endif
}

bool f16_products_split() { return f16_choice().bf16x3; }

}  // namespace

// The blocks of a product on oneDNN's bf16 matmul: gemm_blocks' rows, or,
// where it would cut columns, quarters of the rows instead. oneDNN 2.6's
// brgemm matmul (AMX, vdpbf16ps) takes a block only when its rows of op(A)
// and of C are dense (lda == K and ldc == N when not transposed); a column
// block's C (ldc = N, cols < N) falls to its "gemm:jit" bf16 kernel,
// measured (Intel Xeon with AMX, (1, 1024, 768, 12) bf16 forward, 2
// threads): the in_projection's four 1024 × 576 column blocks took 2.3-10.8
// ms each on gemm:jit, the out_projection's 256-row blocks 0.7-1.0 ms on
// brg:avx512_core_amx_bf16. Row blocks re-pack op(B) each, which the
// 16-bit matmul's rate repays. A product of at most kMinRowBlock rows (a
// decoding step's) keeps its column blocks: as one row block it would run
// on one thread, and a few rows read op(B) once whatever kernel runs.
GemmBlocks gemm_blocks_16bit(int64_t M, int64_t N, int64_t K) {
  const GemmBlocks b = gemm_blocks(M, N, K);
  if (b.cols >= N || M <= kMinRowBlock) return b;
  const int64_t quarter = std::max(kMinRowBlock, ((M + 3) / 4 + kMinRowBlock - 1) / kMinRowBlock * kMinRowBlock);
  return {std::min(quarter, std::max<int64_t>(M, 1)), std::max<int64_t>(N, 1)};
}

namespace {

// Whether a product takes the bf16x3 way: the way is on, op(B) has at
// least kMinSplitSide columns, and each call (one block of
// gemm_blocks_16bit's rows, or the whole product in gemm()) has at least
// kMinSplitRows rows of op(A). Every call splits every element of both
// operands, and oneDNN packs op(B)'s three pieces again for each call; a
// call of few rows does not repay those copies with its multiply-adds.
// Measured (Intel Xeon with AMX, 2 threads, median of 3 alternated rounds,
// bench/bench_precision.py): the f16 forward (1, 128, 512, 8), whose
// products ran as 32-row blocks, took 2.11 ms on bf16x3 against 1.20
// widened; (8, 128, 512, 8), 256-row blocks, 8.5 against 9.2.
constexpr int64_t kMinSplitSide = 16;
constexpr int64_t kMinSplitRows = 256;
bool split_pays(int64_t rows_per_call, int64_t N) {
  return rows_per_call >= kMinSplitRows && N >= kMinSplitSide && f16_products_split();
}

}  // namespace

std::string bf16_matmul_implementation() {
#if MULTIHEAD_WITH_ONEDNN
  return onednn_bf16_matmul_impl();
#else
  return std::string();
#endif
}

bool bf16_matmul_on_amx() {
  static const bool amx = bf16_matmul_implementation().find("amx") != std::string::npos;
  return amx;
}

void check_f16_gemm_environment() { (void)env_f16_products(); }

void f16_gemm_force(const std::string& name) {
  g_forced_f16_products.store(static_cast<int>(parse_f16_products(name, "f16_gemm_force")), std::memory_order_relaxed);
}

std::string f16_gemm_current() {
  const F16Choice c = f16_choice();
  std::string why;
  const std::string impl = bf16_matmul_implementation();
  switch (c.why) {
    case F16Why::NoMatmul: why = "oneDNN has no bf16 matmul on this CPU"; break;
    case F16Why::ForcedWithoutMatmul: why = "bf16x3 forced, but oneDNN has no bf16 matmul on this CPU"; break;
    case F16Why::Forced: why = c.bf16x3 ? "forced; oneDNN's bf16 matmul: " + impl : "forced"; break;
    case F16Why::Amx: why = "auto: oneDNN's bf16 matmul runs on AMX (" + impl + ")"; break;
    case F16Why::NotAmx: why = "auto: oneDNN's bf16 matmul is " + impl + ", not AMX"; break;
    case F16Why::NoOneDnn: why = "built without oneDNN"; break;
  }
  return std::string(c.bf16x3 ? "bf16x3" : "widen") + " (" + why + ")";
}

template <class E>
bool native_16bit_gemm() {
#if MULTIHEAD_WITH_ONEDNN
  if constexpr (std::is_same_v<E, bfloat16>) return onednn_has_bf16_matmul();
#endif
  if constexpr (std::is_same_v<E, float16>) return f16_products_split();
  return false;
}
template bool native_16bit_gemm<bfloat16>();
template bool native_16bit_gemm<float16>();

template <class E>
bool native_16bit_product(int64_t M, int64_t N, int64_t K) {
  if constexpr (std::is_same_v<E, float16>) {
    return split_pays(gemm_blocks_16bit(M, N, K).rows, N);
  } else {
    (void)M, (void)N, (void)K;
    return native_16bit_gemm<E>();
  }
}
template bool native_16bit_product<bfloat16>(int64_t, int64_t, int64_t);
template bool native_16bit_product<float16>(int64_t, int64_t, int64_t);

void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A, int64_t lda,
          const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_only(M, N, beta, C, ldc);
#if MULTIHEAD_WITH_ONEDNN
  if (native_16bit_gemm<bfloat16>() && onednn_bf16_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
#endif
  widened_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float16* A, int64_t lda,
          const float16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_only(M, N, beta, C, ldc);
#if MULTIHEAD_WITH_ONEDNN
  if (split_pays(M, N)) {
    thread_local BasicThreadScratch<bfloat16> scratch_a, scratch_b;
    const SplitOperand a = split_operand(Operand::A, ta, M, K, A, lda, scratch_a, 1);
    const SplitOperand b = split_operand(Operand::B, tb, K, N, B, ldb, scratch_b, 1);
    if (a.finite && b.finite &&
        onednn_bf16_gemm(ta, tb, M, N, 3 * K, alpha, a.data, a.ld, b.data, b.ld, beta, C, ldc))
      return;
  }
#endif
  widened_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

GemmBlocks gemm_blocks(int64_t M, int64_t N, int64_t K) {
  constexpr int64_t kSmallB = int64_t{1} << 16;  // numbers of op(B): 256 KiB of floats
  constexpr int64_t kColumnBlock = 64;
  const auto quarter = [](int64_t n, int64_t unit) { return std::max(unit, ((n + 3) / 4 + unit - 1) / unit * unit); };
  if (N * K < kSmallB) return {kMinRowBlock, std::max<int64_t>(N, 1)};
  // Quarters of the longer side: row blocks pack op(B) (K × N) once each,
  // column blocks pack op(A) (M × K) once each, so cut the side whose
  // blocks re-pack the smaller operand.
  if (M >= N) return {quarter(M, kMinRowBlock), std::max<int64_t>(N, 1)};
  return {std::max<int64_t>(M, 1), quarter(N, kColumnBlock)};
}

namespace {

// OpenBLAS (Debian's, the pthreads build) has one process-wide thread count
// and no per-call one, and it picks its kernel by that count (a
// single-threaded "direct" sgemm below a size, its threaded driver above),
// so a block's bits would depend on it. While one of our blocked products
// runs on OpenBLAS (always in float64; in float32 when the build has no
// oneDNN), the count is held at 1, since our team threads the blocks, and
// restored when the last such product ends. set_blas_threads() during a hold
// sets the count restored. (A host calling OpenBLAS itself, on another
// thread, during one of our products runs single-threaded meanwhile.)
class OpenBlasHeldToOneThread {
 public:
  OpenBlasHeldToOneThread() {
    std::lock_guard<std::mutex> lock(mutex());
    if (state().holders++ == 0) {
      state().saved = openblas_get_num_threads();
      if (state().saved != 1) openblas_set_num_threads(1);
    }
  }
  ~OpenBlasHeldToOneThread() {
    std::lock_guard<std::mutex> lock(mutex());
    if (--state().holders == 0 && state().saved != 1) openblas_set_num_threads(state().saved);
  }
  OpenBlasHeldToOneThread(const OpenBlasHeldToOneThread&) = delete;
  OpenBlasHeldToOneThread& operator=(const OpenBlasHeldToOneThread&) = delete;

  struct State {
    int holders = 0;
    int saved = 1;
  };
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static State& state() {
    static State s;
    return s;
  }
};

#if MULTIHEAD_WITH_ONEDNN
constexpr bool kFloatOnOneDnn = true;
#else
constexpr bool kFloatOnOneDnn = false;
#endif
// float64 always; float (and the 16-bit inputs, which widen to it or run
// oneDNN's bf16 matmul) without oneDNN.
template <class T>
constexpr bool kOnOpenBlas = std::is_same_v<T, double> || !kFloatOnOneDnn;

// T: the element type of A and B; C's is Acc (T, or float for 16-bit T).
template <class T, class Acc>
void blocked(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
             int64_t ldb, Acc beta, Acc* C, int64_t ldc, int threads, const BlockEpilogue& after_block = {},
             std::optional<GemmBlocks> blocks_override = std::nullopt) {
  if (M == 0 || N == 0) return;
  if constexpr (kOnOpenBlas<T>) {
    // Every block's dimensions are at most these: refused here, not by a
    // throw inside the parallel region below.
    for (const auto& [v, what] : {std::pair{M, "M"}, {N, "N"}, {K, "K"}, {lda, "lda"}, {ldb, "ldb"}, {ldc, "ldc"}})
      checked_int(v, what);
  }
  const GemmBlocks size = blocks_override ? *blocks_override : gemm_blocks(M, N, K);
  const int64_t row_blocks = (M + size.rows - 1) / size.rows, col_blocks = (N + size.cols - 1) / size.cols;
  const int64_t blocks = row_blocks * col_blocks;
  std::optional<OpenBlasHeldToOneThread> hold;
  if constexpr (kOnOpenBlas<T>) hold.emplace();
  // One block per item, each the whole K (parallel_items rethrows a block's
  // failure, oneDNN's status, after its region, and runs a product below
  // its grain on this thread alone).
  parallel_items(blocks, requested_threads(threads), /*item_cost=*/size.rows * size.cols * std::max<int64_t>(K, 1),
                 [&](int64_t blk) {
                   // This implicit task's own nthreads ICV: BLAS (oneDNN reads
                   // omp_get_max_threads()) runs the block on this one thread.
                   omp_set_num_threads(1);
                   const int64_t m0 = blk / col_blocks * size.rows, rows = std::min(size.rows, M - m0);
                   const int64_t n0 = blk % col_blocks * size.cols, cols = std::min(size.cols, N - n0);
                   // Row m0 of op(A): row m0 of A, or column m0 of A when
                   // transposed; column n0 of op(B): column n0 of B, or row n0
                   // of B when transposed.
                   const T* a = ta == Trans::No ? A + m0 * lda : A + m0;
                   const T* b = tb == Trans::No ? B + n0 : B + n0 * ldb;
                   gemm(ta, tb, rows, cols, K, Acc(1), a, lda, b, ldb, beta, C + m0 * ldc + n0, ldc);
                   if (after_block) after_block(m0, rows, n0, cols);
                 });
}

}  // namespace

void gemm_blocked(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                  const float* B, int64_t ldb, float beta, float* C, int64_t ldc, int threads,
                  const BlockEpilogue& after_block) {
  blocked(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, threads, after_block);
}

void gemm_blocked(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda,
                  const double* B, int64_t ldb, double beta, double* C, int64_t ldc, int threads) {
  blocked(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, threads);
}

namespace {

// 16-bit operands: oneDNN's 16-bit matmul per block where it has one; else
// A and B widened once (all threads), then the float blocks, so no block
// widens op(B) again.
// f16 on the bf16x3 way: both operands split once (all threads), then the
// bf16 blocks over the tripled K.
template <class E>
void blocked_16bit(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const E* A, int64_t lda, const E* B,
                   int64_t ldb, float beta, float* C, int64_t ldc, int threads, const BlockEpilogue& after_block) {
  if (M == 0 || N == 0) return;
  if constexpr (std::is_same_v<E, float16>) {
    if (K > 0 && split_pays(gemm_blocks_16bit(M, N, K).rows, N)) {
      thread_local BasicThreadScratch<bfloat16> split_a, split_b;
      const SplitOperand a = split_operand(Operand::A, ta, M, K, A, lda, split_a, threads);
      const SplitOperand b = split_operand(Operand::B, tb, K, N, B, ldb, split_b, threads);
      if (a.finite && b.finite)
        return blocked(ta, tb, M, N, 3 * K, a.data, a.ld, b.data, b.ld, beta, C, ldc, threads, after_block,
                       gemm_blocks_16bit(M, N, K));
    }
  } else if (native_16bit_gemm<E>()) {
    return blocked(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, threads, after_block, gemm_blocks_16bit(M, N, K));
  }
  thread_local ThreadScratch scratch_a, scratch_b;
  const WidenedOperand a = widened(ta, M, K, A, lda, scratch_a, threads),
                       b = widened(tb, K, N, B, ldb, scratch_b, threads);
  blocked(ta, tb, M, N, K, a.data, a.ld, b.data, b.ld, beta, C, ldc, threads, after_block);
}

}  // namespace

void gemm_blocked(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const bfloat16* A, int64_t lda,
                  const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc, int threads,
                  const BlockEpilogue& after_block) {
  blocked_16bit(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, threads, after_block);
}

void gemm_blocked(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float16* A, int64_t lda,
                  const float16* B, int64_t ldb, float beta, float* C, int64_t ldc, int threads,
                  const BlockEpilogue& after_block) {
  blocked_16bit(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, threads, after_block);
}

void set_blas_threads(int threads) {
  if (threads <= 0) return;
  std::lock_guard<std::mutex> lock(OpenBlasHeldToOneThread::mutex());
  if (OpenBlasHeldToOneThread::state().holders > 0) {
    OpenBlasHeldToOneThread::state().saved = threads;  // set when the hold ends
  } else {
    openblas_set_num_threads(threads);
  }
}

int blas_threads() {
  std::lock_guard<std::mutex> lock(OpenBlasHeldToOneThread::mutex());
  return OpenBlasHeldToOneThread::state().holders > 0 ? OpenBlasHeldToOneThread::state().saved
                                                       : openblas_get_num_threads();
}

}  // namespace multihead::detail
