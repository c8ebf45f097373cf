// src/core/linear.cpp: see linear.hpp.
#include "core/linear.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <string>

#include "core/gemm.hpp"
#include "core/narrow_gemv.hpp"
#include "core/narrow_rows.hpp"
#include "core/parallel.hpp"
#include "core/switches.hpp"
#include "core/thread_scratch.hpp"
#include "multihead/error.hpp"

namespace multihead::detail {
namespace {

// out[c] (+)= Σ_r x[r·ld + c], each column's rows added in order into an
// Acc sum (In widened to Acc: exact), in blocks of 64 columns across
// threads: the same bits for any thread count.
template <class In, class Acc>
void column_block_sums(int64_t rows, int64_t cols, const In* x, int64_t ld, Acc* out, bool accumulate, int threads) {
  constexpr int64_t kBlock = 64;  // columns per work item
  parallel_items((cols + kBlock - 1) / kBlock, requested_threads(threads), /*item_cost=*/rows * kBlock,
                 [&](int64_t blk) {
                   const int64_t c0 = blk * kBlock, n = std::min(cols, c0 + kBlock) - c0;
                   // The block's sums in a local array: out may alias x as far
                   // as the compiler knows, and summing into out itself kept a
                   // load and a store per element (column_sums was 2% of a
                   // float32 step at (8, 128, 512, 8), 4.5 GB/s at L = 4096).
                   Acc acc[kBlock];
                   for (int64_t c = 0; c < n; ++c) acc[c] = accumulate ? out[c0 + c] : Acc(0);
                   const auto add_rows = [&](int64_t width) {
                     for (int64_t r = 0; r < rows; ++r) {
                       const In* row = x + r * ld + c0;
                       for (int64_t c = 0; c < width; ++c) {
                         if constexpr (std::is_same_v<In, Acc>) acc[c] += row[c];
                         else acc[c] += to_float(row[c]);
                       }
                     }
                   };
                   if (n == kBlock) add_rows(kBlock);  // a constant trip count the compiler unrolls
                   else add_rows(n);
                   std::copy_n(acc, n, out + c0);
                 });
}

}  // namespace

template <class T>
void column_sums(int64_t rows, int64_t cols, const T* x, int64_t ld, T* out, bool accumulate, int threads) {
  column_block_sums(rows, cols, x, ld, out, accumulate, threads);
}

template <class T>
void linear_forward(const LinearRows<T>& x, const LinearWeight<T>& w, const T* b, T* y, int64_t ldy,
                    const LinearOptions& o) {
  const int64_t rows = x.rows, ldx = x.ldx > 0 ? x.ldx : w.in;
  if (ldy <= 0) ldy = w.out;
  if (rows == 0 || w.out == 0) return;
  // y (+)= x · Wᵀ: from Wᵀ (in × out) as it is, from W (out × in) transposed.
  gemm_blocked(Trans::No, w.transposed ? Trans::No : Trans::Yes, rows, w.out, w.in, x.x, ldx, w.data, w.ld,
               o.accumulate ? T(1) : T(0), y, ldy, o.threads);
  // + b, after the product (as torch's addmm rounds x·Wᵀ first, then adds).
  if (b != nullptr)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < w.out; ++c) y[r * ldy + c] += b[c];
}

template <class T>
void linear_backward(const LinearRows<T>& x, const LinearWeight<T>& w, const T* d_y, int64_t ld_dy,
                     const LinearGradients<T>& g, const LinearOptions& o) {
  const int64_t rows = x.rows, in = w.in, out = w.out, ldx = x.ldx > 0 ? x.ldx : in;
  if (ld_dy <= 0) ld_dy = out;
  const T beta = o.accumulate ? T(1) : T(0);
  // forward: y = x · Wᵀ + b
  //   =>  d_x (+)= d_y · W     (rows × out · out × in): W as stored, or (Wᵀ)ᵀ
  if (g.d_x != nullptr)
    gemm_blocked(Trans::No, w.transposed ? Trans::Yes : Trans::No, rows, in, out, d_y, ld_dy, w.data, w.ld, beta,
                 g.d_x, g.ld_dx > 0 ? g.ld_dx : in, o.threads);
  //   =>  d_W (+)= d_yᵀ · x    (out × rows · rows × in): d_W's rows in fixed
  //       blocks, each summing all rows of x in one product
  if (g.d_W != nullptr)
    gemm_blocked(Trans::Yes, Trans::No, out, in, rows, d_y, ld_dy, x.x, ldx, beta, g.d_W, in, o.threads);
  //   =>  d_b (+)= Σ_rows d_y
  if (g.d_b != nullptr) column_sums(rows, out, d_y, ld_dy, g.d_b, o.accumulate, o.threads);
}

namespace {

std::atomic<bool>& narrow_gemv_switch() {
  static std::atomic<bool> enabled{true};
  return enabled;
}

// MULTIHEAD_NARROW_GEMV=gemm forces the gemm way for the whole process, so
// that a program such as the CLI can be timed and checked both ways; "auto"
// or unset leaves narrow_gemv_enabled's choice. Read on every call, as
// MULTIHEAD_KERNEL.
bool narrow_gemv_allowed() {
  if (env_switch("MULTIHEAD_NARROW_GEMV", {"auto", "gemm"}) == 1) return false;
  return narrow_gemv_switch().load(std::memory_order_relaxed);
}

// The few-row product (core/narrow_gemv.hpp) where it reads fewer bytes
// than the gemm way: W as stored (out × in, rows contiguous; a transposed
// W's columns would be strided loads), at most kNarrowGemvMaxRows rows, and
// no native bf16 matmul (which reads W in 16 bits itself). f16's bf16x3
// way is no such matmul for a few rows: it would split all of W on every
// call (core/gemm.hpp), so f16 keeps the few-row product.
template <class E>
bool use_narrow_gemv(const LinearWeight<E>& w, int64_t rows) {
  return !w.transposed && rows <= kNarrowGemvMaxRows && (std::is_same_v<E, float16> || !native_16bit_gemm<E>()) &&
         narrow_gemv_allowed();
}

// gemm_blocked's epilogue for the 16-bit products: each block of float32
// sums (acc, rows ld_acc apart) + bias, rounded once into y by the thread
// that made it, while the block is in that core's cache. A second pass over
// acc read it back from memory and cost ~9% of a (8, 128, 512, 8) bf16
// forward (perf, AMD Zen 5). The same rounding of the same sums, so the
// same bits.
template <class E>
BlockEpilogue round_each_block(const float* acc, int64_t ld_acc, const E* bias, E* y, int64_t ldy) {
  return [=](int64_t m0, int64_t rows, int64_t n0, int64_t cols) {
    round_rows(acc + m0 * ld_acc + n0, rows, cols, ld_acc, bias != nullptr ? bias + n0 : nullptr, y + m0 * ldy + n0,
               ldy, 1);
  };
}

// A: E, or float (exact copies of E values, linear_forward_widened: always
// the gemm way).
template <class A, class E>
void narrow_linear_forward(const LinearRows<A>& x, const LinearWeight<A>& w, const E* b, E* y, int64_t ldy,
                           const LinearOptions& o) {
  if (o.accumulate)
    throw Error(Error::Kind::Value, "linear_forward: accumulate=true is not supported with 16-bit outputs");
  const int64_t rows = x.rows, ldx = x.ldx > 0 ? x.ldx : w.in;
  if (ldy <= 0) ldy = w.out;
  if (rows == 0 || w.out == 0) return;
  // The float32 product, then + b and one rounding per element (each y
  // element written by one thread: the same bits for any thread count).
  // The buffer is not zeroed: the product writes it.
  thread_local ThreadScratch scratch;
  float* acc = scratch.take(static_cast<std::size_t>(rows * w.out));
  bool gemv = false;
  if constexpr (std::is_same_v<A, E>) gemv = use_narrow_gemv(w, rows);
  if constexpr (std::is_same_v<A, E>)
    if (gemv) narrow_gemv(rows, w.out, w.in, x.x, ldx, w.data, w.ld, acc, w.out, o.threads);
  if (gemv) return round_rows(acc, rows, w.out, w.out, b, y, ldy, o.threads);
  // Each block of sums (+ b) rounded in cache (round_each_block).
  gemm_blocked(Trans::No, w.transposed ? Trans::No : Trans::Yes, rows, w.out, w.in, x.x, ldx, w.data, w.ld, 0.0f, acc,
               w.out, o.threads, round_each_block(acc, w.out, b, y, ldy));
}

template <class E>
void narrow_linear_backward(const LinearRows<E>& x, const LinearWeight<E>& w, const E* d_y, int64_t ld_dy,
                            const LinearGradients<E>& g, const LinearOptions& o) {
  if (o.accumulate)
    throw Error(Error::Kind::Value, "linear_backward: accumulate=true is not supported with 16-bit gradients");
  const int64_t rows = x.rows, in = w.in, out = w.out, ldx = x.ldx > 0 ? x.ldx : in;
  if (ld_dy <= 0) ld_dy = out;
  // One float32 buffer, reused for each gradient in turn: the largest.
  const int64_t n = std::max({g.d_x ? rows * in : 0, g.d_W ? out * in : 0, g.d_b ? out : int64_t{0}});
  if (n == 0) return;
  thread_local ThreadScratch scratch;
  float* acc = scratch.take(static_cast<std::size_t>(n));
  // forward: y = round(x · Wᵀ + b)
  //   =>  d_x = round(d_y · W)      (rows × out · out × in)
  // (a product over K = 0 terms writes zeros: gemm's beta = 0)
  // Each block of sums rounded in cache, as the forward's (round_each_block).
  const E* no_bias = nullptr;
  if (g.d_x != nullptr) {
    gemm_blocked(Trans::No, w.transposed ? Trans::Yes : Trans::No, rows, in, out, d_y, ld_dy, w.data, w.ld, 0.0f,
                 acc, in, o.threads, round_each_block(acc, in, no_bias, g.d_x, g.ld_dx > 0 ? g.ld_dx : in));
  }
  //   =>  d_W = round(d_yᵀ · x)     (out × rows · rows × in)
  if (g.d_W != nullptr) {
    gemm_blocked(Trans::Yes, Trans::No, out, in, rows, d_y, ld_dy, x.x, ldx, 0.0f, acc, in, o.threads,
                 round_each_block(acc, in, no_bias, g.d_W, in));
  }
  //   =>  d_b = round(Σ_rows d_y), summed in float32, rows in order
  if (g.d_b != nullptr) {
    column_block_sums(rows, out, d_y, ld_dy, acc, /*accumulate=*/false, o.threads);
    round_rows(acc, 1, out, out, static_cast<const E*>(nullptr), g.d_b, out, o.threads);
  }
}

}  // namespace

void narrow_gemv_enabled(bool enabled) { narrow_gemv_switch().store(enabled, std::memory_order_relaxed); }

void check_narrow_gemv_environment() { (void)narrow_gemv_allowed(); }

template <>
void linear_backward<bfloat16>(const LinearRows<bfloat16>& x, const LinearWeight<bfloat16>& w, const bfloat16* d_y,
                               int64_t ld_dy, const LinearGradients<bfloat16>& g, const LinearOptions& o) {
  narrow_linear_backward(x, w, d_y, ld_dy, g, o);
}
template <>
void linear_backward<float16>(const LinearRows<float16>& x, const LinearWeight<float16>& w, const float16* d_y,
                              int64_t ld_dy, const LinearGradients<float16>& g, const LinearOptions& o) {
  narrow_linear_backward(x, w, d_y, ld_dy, g, o);
}

template <>
void linear_forward<bfloat16>(const LinearRows<bfloat16>& x, const LinearWeight<bfloat16>& w, const bfloat16* b,
                              bfloat16* y, int64_t ldy, const LinearOptions& o) {
  narrow_linear_forward(x, w, b, y, ldy, o);
}
template <>
void linear_forward<float16>(const LinearRows<float16>& x, const LinearWeight<float16>& w, const float16* b,
                             float16* y, int64_t ldy, const LinearOptions& o) {
  narrow_linear_forward(x, w, b, y, ldy, o);
}

template <class E>
void linear_forward_stacked(const LinearRows<E>& x, const LinearWeight<E>& w, const E* b, E* const* y, int64_t parts,
                            const LinearOptions& o) {
  if (parts <= 0 || w.transposed || w.out % parts != 0)
    throw Error(Error::Kind::Value, "linear_forward_stacked: expected W as stored with out a multiple of parts (" +
                                        std::to_string(parts) + "), got out " + std::to_string(w.out));
  if (o.accumulate)
    throw Error(Error::Kind::Value, "linear_forward: accumulate=true is not supported with 16-bit outputs");
  const int64_t n = w.out / parts, rows = x.rows, ldx = x.ldx > 0 ? x.ldx : w.in;
  if (use_narrow_gemv(w, rows)) {
    for (int64_t j = 0; j < parts; ++j)
      narrow_linear_forward(x, LinearWeight<E>::stored(w.data + j * n * w.ld, n, w.in, w.ld),
                            b != nullptr ? b + j * n : nullptr, y[j], n, o);
    return;
  }
  if (rows == 0 || n == 0) return;
  thread_local ThreadScratch scratch;
  float* acc = scratch.take(static_cast<std::size_t>(rows * w.out));
  // Each block of sums (+ b) rounded in cache into the parts it spans.
  gemm_blocked(Trans::No, Trans::Yes, rows, w.out, w.in, x.x, ldx, w.data, w.ld, 0.0f, acc, w.out, o.threads,
               [&](int64_t m0, int64_t block_rows, int64_t n0, int64_t cols) {
                 for (int64_t c = n0; c < n0 + cols;) {
                   const int64_t j = c / n, end = std::min(n0 + cols, (j + 1) * n);
                   round_rows(acc + m0 * w.out + c, block_rows, end - c, w.out, b != nullptr ? b + c : nullptr,
                              y[j] + m0 * n + (c - j * n), n, 1);
                   c = end;
                 }
               });
}
template void linear_forward_stacked<bfloat16>(const LinearRows<bfloat16>&, const LinearWeight<bfloat16>&,
                                               const bfloat16*, bfloat16* const*, int64_t, const LinearOptions&);
template void linear_forward_stacked<float16>(const LinearRows<float16>&, const LinearWeight<float16>&,
                                              const float16*, float16* const*, int64_t, const LinearOptions&);

template <class E>
void linear_forward_widened(const LinearRows<float>& x, const LinearWeight<float>& w, const E* b, E* y, int64_t ldy,
                            const LinearOptions& o) {
  narrow_linear_forward(x, w, b, y, ldy, o);
}
template void linear_forward_widened<bfloat16>(const LinearRows<float>&, const LinearWeight<float>&, const bfloat16*,
                                               bfloat16*, int64_t, const LinearOptions&);
template void linear_forward_widened<float16>(const LinearRows<float>&, const LinearWeight<float>&, const float16*,
                                              float16*, int64_t, const LinearOptions&);

template <class E>
bool narrow_linear_is_widened_gemm(const LinearWeight<E>& w, int64_t rows) {
  return !native_16bit_product<E>(rows, w.out, w.in) && !use_narrow_gemv(w, rows);
}
template bool narrow_linear_is_widened_gemm<bfloat16>(const LinearWeight<bfloat16>&, int64_t);
template bool narrow_linear_is_widened_gemm<float16>(const LinearWeight<float16>&, int64_t);

template void linear_forward<float>(const LinearRows<float>&, const LinearWeight<float>&, const float*, float*,
                                    int64_t, const LinearOptions&);
template void linear_forward<double>(const LinearRows<double>&, const LinearWeight<double>&, const double*,
                                     double*, int64_t, const LinearOptions&);
template void linear_backward<float>(const LinearRows<float>&, const LinearWeight<float>&, const float*, int64_t,
                                     const LinearGradients<float>&, const LinearOptions&);
template void linear_backward<double>(const LinearRows<double>&, const LinearWeight<double>&, const double*,
                                      int64_t, const LinearGradients<double>&, const LinearOptions&);
template void column_sums<float>(int64_t, int64_t, const float*, int64_t, float*, bool, int);
template void column_sums<double>(int64_t, int64_t, const double*, int64_t, double*, bool, int);

}  // namespace multihead::detail
