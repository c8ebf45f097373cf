// tests/test_linear.cpp: the one linear layer (src/core/linear.hpp) and its
// blocked product (gemm_blocked), against plain float64 loops written here.
//
// Each case is named by all its parameters: rows, in, out, the weight's
// layout (stored W or Wᵀ), padded strides, bias, accumulate, threads.
//
// Bounds, relative to Σ|terms| of each element: float64 1e-12 (a sum of
// n ≤ 1024 products errs by at most n·ε·Σ|terms| = 1.1e-13, ε = 2⁻⁵³);
// float32 1e-5 (the worst case n·ε = 6e-5 at n = 1024 assumes every rounding
// in one direction; BLAS's blocked sums err like √n·ε, 2e-6 at n = 1024,
// and the inputs are rounded to float before the float64 reference sees them).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/gemm.hpp"
#include "core/linear.hpp"
#include "multihead/error.hpp"
#include "multihead/narrow.hpp"

namespace multihead::test {
namespace {

using detail::LinearGradients;
using detail::LinearOptions;
using detail::LinearWeight;

struct LinearCase {
  int64_t rows, in, out;
  bool transposed;  // the weight given as Wᵀ (in × out)
  bool padded;      // row strides wider than the rows (x, y, d_y, d_x, W)
  bool bias;
  bool accumulate;
  int threads;
  std::string name() const {
    return "rows" + std::to_string(rows) + "_in" + std::to_string(in) + "_out" + std::to_string(out) +
           (transposed ? "_Wt" : "_W") + (padded ? "_padded" : "") + (bias ? "_bias" : "_nobias") +
           (accumulate ? "_accumulate" : "_write") + "_threads" + std::to_string(threads);
  }
};

std::vector<LinearCase> cases() {
  std::vector<LinearCase> v;
  // Rows around the 32-row block (0, 1, 31, 32, 33, 65) and, with a large
  // weight (in·out ≥ 2¹⁶), rows that take the quarter-of-M blocks.
  for (int64_t rows : {0, 1, 31, 32, 33, 65})
    for (bool transposed : {false, true})
      for (bool padded : {false, true})
        for (bool accumulate : {false, true}) v.push_back({rows, 7, 5, transposed, padded, true, accumulate, 2});
  v.push_back({33, 6, 4, false, false, false, false, 1});
  v.push_back({300, 256, 300, false, false, true, false, 2});
  v.push_back({300, 256, 300, true, true, true, true, 3});
  v.push_back({5, 0, 4, false, false, true, false, 2});  // in = 0: y = b
  return v;
}

struct Data {
  std::vector<double> x, W, b, y, d_y, d_x, d_W, d_b;
  int64_t ldx, ldy, ldw;
};

Data make(const LinearCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  Data d;
  const int64_t pad = c.padded ? 3 : 0;
  d.ldx = c.in + pad;
  d.ldy = c.out + pad;
  d.ldw = (c.transposed ? c.out : c.in) + pad;
  auto fill = [&](std::vector<double>& v, std::size_t count) {
    v.resize(count);
    for (double& e : v) e = n(rng);
  };
  fill(d.x, static_cast<std::size_t>(c.rows * d.ldx));
  fill(d.W, static_cast<std::size_t>((c.transposed ? c.in : c.out) * d.ldw));
  fill(d.b, static_cast<std::size_t>(c.out));
  fill(d.y, static_cast<std::size_t>(c.rows * d.ldy));
  fill(d.d_y, static_cast<std::size_t>(c.rows * d.ldy));
  fill(d.d_x, static_cast<std::size_t>(c.rows * d.ldx));
  fill(d.d_W, static_cast<std::size_t>(c.out * c.in));
  fill(d.d_b, static_cast<std::size_t>(c.out));
  return d;
}

// W[o][i] whichever way it is stored.
double weight(const LinearCase& c, const Data& d, int64_t o, int64_t i) {
  return c.transposed ? d.W[static_cast<std::size_t>(i * d.ldw + o)] : d.W[static_cast<std::size_t>(o * d.ldw + i)];
}

template <class T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// |got − want| ≤ bound · scale, the scale Σ|terms| of that element.
void expect_close(double got, double want, double scale, double bound, const std::string& what) {
  EXPECT_LE(std::abs(got - want), bound * (scale + 1e-300)) << what << ": got " << got << ", want " << want
                                                             << ", bound " << bound << " x " << scale;
}

template <class T>
void check_case(const LinearCase& c, double bound) {
  SCOPED_TRACE(c.name());
  const Data d = make(c, 11);
  std::vector<T> x = cast<T>(d.x), W = cast<T>(d.W), b = cast<T>(d.b), y = cast<T>(d.y), d_y = cast<T>(d.d_y),
                 d_x = cast<T>(d.d_x), d_W = cast<T>(d.d_W), d_b = cast<T>(d.d_b);
  const LinearWeight<T> w = c.transposed ? LinearWeight<T>::transpose(W.data(), c.out, c.in, d.ldw)
                                         : LinearWeight<T>::stored(W.data(), c.out, c.in, d.ldw);
  const LinearOptions o{c.accumulate, c.threads};
  detail::linear_forward<T>({c.rows, x.data(), d.ldx}, w, c.bias ? b.data() : nullptr, y.data(), d.ldy, o);
  LinearGradients<T> g{d_x.data(), d.ldx, d_W.data(), c.bias ? d_b.data() : nullptr};
  detail::linear_backward<T>({c.rows, x.data(), d.ldx}, w, d_y.data(), d.ldy, g, o);

  const double keep = c.accumulate ? 1.0 : 0.0;
  // Reference, from the definitions, with the inputs rounded as the layer saw them.
  auto X = [&](int64_t r, int64_t i) { return double(x[static_cast<std::size_t>(r * d.ldx + i)]); };
  auto DY = [&](int64_t r, int64_t o_) { return double(d_y[static_cast<std::size_t>(r * d.ldy + o_)]); };
  auto Wd = [&](int64_t o_, int64_t i) { return double(T(weight(c, d, o_, i))); };
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t j = 0; j < c.out; ++j) {
      double want = keep * double(T(d.y[static_cast<std::size_t>(r * d.ldy + j)])), scale = std::abs(want);
      for (int64_t i = 0; i < c.in; ++i) want += X(r, i) * Wd(j, i), scale += std::abs(X(r, i) * Wd(j, i));
      if (c.bias) want += double(b[static_cast<std::size_t>(j)]), scale += std::abs(double(b[static_cast<std::size_t>(j)]));
      expect_close(y[static_cast<std::size_t>(r * d.ldy + j)], want, scale, bound, "y[" + std::to_string(r) + "," + std::to_string(j) + "]");
    }
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t i = 0; i < c.in; ++i) {
      double want = keep * double(T(d.d_x[static_cast<std::size_t>(r * d.ldx + i)])), scale = std::abs(want);
      for (int64_t j = 0; j < c.out; ++j) want += DY(r, j) * Wd(j, i), scale += std::abs(DY(r, j) * Wd(j, i));
      expect_close(d_x[static_cast<std::size_t>(r * d.ldx + i)], want, scale, bound, "d_x[" + std::to_string(r) + "," + std::to_string(i) + "]");
    }
  for (int64_t j = 0; j < c.out; ++j) {
    for (int64_t i = 0; i < c.in; ++i) {
      double want = keep * double(T(d.d_W[static_cast<std::size_t>(j * c.in + i)])), scale = std::abs(want);
      for (int64_t r = 0; r < c.rows; ++r) want += DY(r, j) * X(r, i), scale += std::abs(DY(r, j) * X(r, i));
      expect_close(d_W[static_cast<std::size_t>(j * c.in + i)], want, scale, bound, "d_W[" + std::to_string(j) + "," + std::to_string(i) + "]");
    }
    double want = c.bias ? keep * double(T(d.d_b[static_cast<std::size_t>(j)])) : double(T(d.d_b[static_cast<std::size_t>(j)]));
    double scale = std::abs(want);
    if (c.bias)
      for (int64_t r = 0; r < c.rows; ++r) want += DY(r, j), scale += std::abs(DY(r, j));
    // Without a bias d_b is not touched.
    expect_close(d_b[static_cast<std::size_t>(j)], want, scale, bound, "d_b[" + std::to_string(j) + "]");
  }
  // The padding columns of y and d_x are never written.
  if (c.padded)
    for (int64_t r = 0; r < c.rows; ++r) {
      for (int64_t j = c.out; j < d.ldy; ++j)
        EXPECT_EQ(y[static_cast<std::size_t>(r * d.ldy + j)], T(d.y[static_cast<std::size_t>(r * d.ldy + j)]));
      for (int64_t i = c.in; i < d.ldx; ++i)
        EXPECT_EQ(d_x[static_cast<std::size_t>(r * d.ldx + i)], T(d.d_x[static_cast<std::size_t>(r * d.ldx + i)]));
    }
}

TEST(Linear, MatchesFloat64Loops_Float64) {
  for (const LinearCase& c : cases()) check_case<double>(c, 1e-12);
}

TEST(Linear, MatchesFloat64Loops_Float32) {
  for (const LinearCase& c : cases()) check_case<float>(c, 1e-5);
}

// The checker itself: a wrong bias (b + 1e-3 in one element) must fail it.
TEST(Linear, CheckerCatchesAPerturbedElement) {
  const LinearCase c{33, 7, 5, false, false, true, false, 2};
  const Data d = make(c, 11);
  std::vector<double> y = d.y;
  detail::linear_forward<double>({c.rows, d.x.data(), d.ldx}, LinearWeight<double>::stored(d.W.data(), c.out, c.in, d.ldw),
                                 d.b.data(), y.data(), d.ldy);
  double want = d.b[2];
  for (int64_t i = 0; i < c.in; ++i) want += d.x[static_cast<std::size_t>(17 * d.ldx + i)] * d.W[static_cast<std::size_t>(2 * d.ldw + i)];
  y[static_cast<std::size_t>(17 * d.ldy + 2)] += 1e-3;
  EXPECT_GT(std::abs(y[static_cast<std::size_t>(17 * d.ldy + 2)] - want), 1e-12 * 100);
}

// The same bits for 1, 2 and 3 threads, forward and backward, at shapes
// whose products a BLAS would split differently (float32, where it shows).
TEST(Linear, SameBitsForOneTwoThreeThreads_Float32) {
  for (const LinearCase& base : {LinearCase{1000, 96, 288, false, false, true, false, 1},
                                 LinearCase{700, 256, 768, true, false, true, true, 1},
                                 LinearCase{2, 1024, 512, false, false, true, false, 1}}) {
    const Data d = make(base, 5);
    std::vector<std::vector<float>> ys, dxs, dWs, dbs;
    for (int threads : {1, 2, 3}) {
      std::vector<float> x = cast<float>(d.x), W = cast<float>(d.W), b = cast<float>(d.b), y = cast<float>(d.y),
                         d_y = cast<float>(d.d_y), d_x = cast<float>(d.d_x), d_W = cast<float>(d.d_W), d_b = cast<float>(d.d_b);
      const LinearWeight<float> w = base.transposed ? LinearWeight<float>::transpose(W.data(), base.out, base.in, d.ldw)
                                                    : LinearWeight<float>::stored(W.data(), base.out, base.in, d.ldw);
      const LinearOptions o{base.accumulate, threads};
      detail::linear_forward<float>({base.rows, x.data(), d.ldx}, w, b.data(), y.data(), d.ldy, o);
      detail::linear_backward<float>({base.rows, x.data(), d.ldx}, w, d_y.data(), d.ldy,
                                     {d_x.data(), d.ldx, d_W.data(), d_b.data()}, o);
      ys.push_back(y), dxs.push_back(d_x), dWs.push_back(d_W), dbs.push_back(d_b);
    }
    for (std::size_t t = 1; t < ys.size(); ++t) {
      const std::string label = base.name() + " threads " + std::to_string(t + 1) + " vs 1";
      EXPECT_EQ(0, std::memcmp(ys[0].data(), ys[t].data(), ys[0].size() * sizeof(float))) << label << " y";
      EXPECT_EQ(0, std::memcmp(dxs[0].data(), dxs[t].data(), dxs[0].size() * sizeof(float))) << label << " d_x";
      EXPECT_EQ(0, std::memcmp(dWs[0].data(), dWs[t].data(), dWs[0].size() * sizeof(float))) << label << " d_W";
      EXPECT_EQ(0, std::memcmp(dbs[0].data(), dbs[t].data(), dbs[0].size() * sizeof(float))) << label << " d_b";
    }
  }
}

// The block rule: 32 rows and every column while op(B) is small, else
// quarters of the longer side (rows in multiples of 32, columns of 64);
// never a function of the thread count (it takes none).
TEST(Linear, BlockRule) {
  const auto expect = [](int64_t M, int64_t N, int64_t K, int64_t rows, int64_t cols) {
    const detail::GemmBlocks b = detail::gemm_blocks(M, N, K);
    EXPECT_EQ(b.rows, rows) << M << " x " << N << " x " << K;
    EXPECT_EQ(b.cols, cols) << M << " x " << N << " x " << K;
  };
  expect(10000, 64, 64, 32, 64);        // 4 Ki numbers of op(B)
  expect(10000, 255, 256, 32, 255);     // just under 64 Ki
  expect(4096, 256, 256, 1024, 256);    // 64 Ki: a quarter of M (M >= N)
  expect(1000, 512, 512, 256, 512);     // ⌈250 / 32⌉ · 32
  expect(682, 3072, 1024, 682, 768);    // M < N: quarters of N, one row block
  expect(33, 1024, 1024, 33, 256);      // M < N
  expect(1, 12288, 4096, 1, 3072);      // a decoding step: columns in quarters
  expect(32, 100, 1024, 32, 64);        // never under 64 columns
  expect(0, 1024, 1024, 1, 256);
  // On oneDNN's bf16 matmul: row quarters where gemm_blocks cuts columns,
  // except at most 32 rows (a decoding step keeps its column blocks).
  const auto expect16 = [](int64_t M, int64_t N, int64_t K, int64_t rows, int64_t cols) {
    const detail::GemmBlocks b = detail::gemm_blocks_16bit(M, N, K);
    EXPECT_EQ(b.rows, rows) << "16-bit " << M << " x " << N << " x " << K;
    EXPECT_EQ(b.cols, cols) << "16-bit " << M << " x " << N << " x " << K;
  };
  expect16(1024, 2304, 768, 256, 2304);  // a (1, 1024, 768, 12) in_projection
  expect16(682, 3072, 1024, 192, 3072);  // ⌈682 / 4 / 32⌉ · 32
  expect16(33, 1024, 1024, 32, 1024);
  expect16(1, 12288, 4096, 1, 3072);     // a decoding step: columns, as gemm_blocks
  expect16(32, 100, 1024, 32, 64);
  expect16(4096, 256, 256, 1024, 256);   // gemm_blocks' own rows
  expect16(10000, 64, 64, 32, 64);
}

// A decoding step's shape (one row block, column blocks) and a column
// remainder, through the layer, against the float64 loops.
TEST(Linear, ColumnBlocks_MatchFloat64Loops) {
  for (const LinearCase& c : {LinearCase{1, 1024, 300, false, false, true, false, 2},
                              LinearCase{3, 700, 1000, true, true, true, true, 2}})
    check_case<float>(c, 1e-5);
}

// column_sums's stated order (linear.hpp: each column's rows added in order
// into a float sum), bit for bit against that loop written here: a change
// of order (pairwise, or rows split across threads) would pass the float64
// bounds above but change the bias gradients' bits, and with them every
// run's trajectory. Columns around the 64-column work item, a padded
// stride, write and accumulate, 1 and 2 threads.
TEST(Linear, ColumnSumsAddRowsInOrder) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (int64_t rows : {1, 5, 301})
    for (int64_t cols : {1, 63, 64, 65, 200})
      for (bool accumulate : {false, true})
        for (int threads : {1, 2}) {
          const int64_t ld = cols + 3;
          std::vector<float> x(static_cast<std::size_t>(rows * ld)), start(static_cast<std::size_t>(cols));
          for (float& e : x) e = normal(rng);
          for (float& e : start) e = normal(rng);
          std::vector<float> expected = start, got = start;
          for (int64_t c = 0; c < cols; ++c) {
            float sum = accumulate ? start[static_cast<std::size_t>(c)] : 0.0f;
            for (int64_t r = 0; r < rows; ++r) sum += x[static_cast<std::size_t>(r * ld + c)];
            expected[static_cast<std::size_t>(c)] = sum;
          }
          const std::vector<float> x_before = x;
          detail::column_sums<float>(rows, cols, x.data(), ld, got.data(), accumulate, threads);
          const std::string label = "rows " + std::to_string(rows) + " cols " + std::to_string(cols) +
                                    (accumulate ? " accumulate" : " write") + " threads " + std::to_string(threads);
          EXPECT_EQ(0, std::memcmp(expected.data(), got.data(), expected.size() * sizeof(float))) << label;
          EXPECT_EQ(x_before, x) << label << ": the input changed";
        }
}

// f16 products on a bf16 matmul (core/gemm.hpp, "bf16x3"), forced, against
// the float64 sum of the same f16 values: within
//   (γ_{3K+1}·(1 + 2^-7)² + 2^-16)·Σ|a||b| + 3K·2^-126 (+ beta's term),
// the three bf16 products' float32 sums (|hi| + |lo| <= (1 + 2^-7)|x|), the
// dropped Al·Bl (|lo| <= 2^-8 |x|) and the matmul's flushed denormals; every
// transposition, alpha and beta, gemm and gemm_blocked (1 and 2 threads, the
// same bits). The widened product is checked against its own bound
// γ_{K+1}·Σ|a||b|. Where bf16x3 runs (oneDNN has a bf16 matmul here) it
// must differ from the widened product somewhere (it ran), and an operand
// holding an infinity, or a product of fewer than 256 rows per call (gemm
// on 8 rows), gives the widened product's bits. Shapes: 37 rows (widens),
// 300 rows (gemm splits; gemm_blocked's 32-row blocks widen), 1024 × 300 ×
// 256 (both split: 256-row blocks).
TEST(Linear, F16ProductsOnABf16MatmulWithinTheirBound) {
  using detail::Trans;
  std::mt19937 rng(19);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> scale(-12, 6);
  const auto f16_values = [&](int64_t n) {
    std::vector<float16> v(static_cast<std::size_t>(n));
    for (float16& x : v) x = to_float16(std::ldexp(normal(rng), scale(rng)));  // subnormals to 2^10
    return v;
  };
  const auto gamma32 = [](double n) { return n * 0x1p-24 / (1 - n * 0x1p-24); };
  detail::f16_gemm_force("bf16x3");
  const bool runs = detail::f16_gemm_current().rfind("bf16x3", 0) == 0;
  int64_t differing = 0;
  struct Shape {
    int64_t M, N, K;
  };
  for (const Shape sh : {Shape{37, 50, 100}, Shape{300, 20, 513}, Shape{1024, 300, 256}, Shape{256, 16, 1}}) {
    for (const Trans ta : {Trans::No, Trans::Yes})
      for (const Trans tb : {Trans::No, Trans::Yes})
        for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, 1.0f}}) {
          const int64_t M = sh.M, N = sh.N, K = sh.K;
          const int64_t lda = (ta == Trans::No ? K : M) + 3, ldb = (tb == Trans::No ? N : K) + 1, ldc = N + 2;
          const std::vector<float16> A = f16_values((ta == Trans::No ? M : K) * lda);
          const std::vector<float16> B = f16_values((tb == Trans::No ? K : N) * ldb);
          std::vector<float> C0(static_cast<std::size_t>(M * ldc));
          for (float& c : C0) c = normal(rng);
          const auto a = [&](int64_t i, int64_t k) {
            return static_cast<double>(to_float(A[static_cast<std::size_t>(ta == Trans::No ? i * lda + k : k * lda + i)]));
          };
          const auto b = [&](int64_t k, int64_t j) {
            return static_cast<double>(to_float(B[static_cast<std::size_t>(tb == Trans::No ? k * ldb + j : j * ldb + k)]));
          };
          std::vector<float> widened = C0;
          detail::f16_gemm_force("widen");
          detail::gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, widened.data(), ldc);
          detail::f16_gemm_force("bf16x3");
          std::vector<float> one = C0, blocked1 = C0, blocked2 = C0;
          detail::gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, one.data(), ldc);
          if (alpha == 1.0f) {
            detail::gemm_blocked(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, beta, blocked1.data(), ldc, 1);
            detail::gemm_blocked(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, beta, blocked2.data(), ldc, 2);
            ASSERT_EQ(0, std::memcmp(blocked1.data(), blocked2.data(), blocked1.size() * sizeof(float)))
                << "gemm_blocked bf16x3: 1 and 2 threads differ";
          }
          const std::string label = std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
                                    (ta == Trans::Yes ? " A^T" : "") + (tb == Trans::Yes ? " B^T" : "") +
                                    " alpha " + std::to_string(alpha) + " beta " + std::to_string(beta);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double exact = 0, sizes = 0;
              for (int64_t k = 0; k < K; ++k) exact += a(i, k) * b(k, j), sizes += std::abs(a(i, k) * b(k, j));
              const std::size_t at = static_cast<std::size_t>(i * ldc + j);
              const double c0 = beta * static_cast<double>(C0[at]);
              const double want = alpha * exact + c0;
              const double split_bound =
                  alpha * ((gamma32(3.0 * K + 1) * (1 + 0x1p-7) * (1 + 0x1p-7) + 0x1p-16) * sizes + 3.0 * K * 0x1p-126) +
                  gamma32(3.0 * K + 2) * std::abs(c0) + 0x1p-24 * std::abs(want);
              const double widen_bound = alpha * gamma32(K + 1.0) * sizes + gamma32(K + 2.0) * std::abs(c0) +
                                         0x1p-24 * std::abs(want);
              ASSERT_LE(std::abs(one[at] - want), split_bound) << label << " gemm at " << i << "," << j;
              if (alpha == 1.0f) {
                ASSERT_LE(std::abs(blocked1[at] - want), split_bound) << label << " blocked at " << i << "," << j;
              }
              ASSERT_LE(std::abs(widened[at] - want), widen_bound) << label << " widened at " << i << "," << j;
              differing += one[at] != widened[at];
            }
        }
  }
  if (runs) {
    EXPECT_GT(differing, 0) << "bf16x3 runs here, yet gave the widened product's bits everywhere";
  }
  // An infinity in A, and a product of 8 rows: the widened product's bits.
  for (const int64_t M : {int64_t{300}, int64_t{8}}) {
    const int64_t N = 40, K = 24;
    std::vector<float16> A = f16_values(M * K), B = f16_values(K * N);
    if (M == 300) A[5] = to_float16(std::numeric_limits<float>::infinity());
    std::vector<float> split(static_cast<std::size_t>(M * N)), split_blocked(split.size()), widened(split.size()),
        widened_blocked(split.size());
    detail::gemm(Trans::No, Trans::No, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, split.data(), N);
    detail::gemm_blocked(Trans::No, Trans::No, M, N, K, A.data(), K, B.data(), N, 0.0f, split_blocked.data(), N, 2);
    detail::f16_gemm_force("widen");
    detail::gemm(Trans::No, Trans::No, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, widened.data(), N);
    detail::gemm_blocked(Trans::No, Trans::No, M, N, K, A.data(), K, B.data(), N, 0.0f, widened_blocked.data(), N, 2);
    detail::f16_gemm_force("bf16x3");
    const auto same = [](float x, float y) { return std::bit_cast<uint32_t>(x) == std::bit_cast<uint32_t>(y); };
    for (std::size_t i = 0; i < split.size(); ++i) {
      ASSERT_TRUE(same(split[i], widened[i])) << "M " << M << " gemm at " << i;
      ASSERT_TRUE(same(split_blocked[i], widened_blocked[i])) << "M " << M << " gemm_blocked at " << i;
    }
    if (M == 300) {
      EXPECT_TRUE(std::isinf(split[0]) || std::isnan(split[0]));  // row 0 reads the infinity
    }
  }
  detail::f16_gemm_force("");
  EXPECT_THROW(detail::f16_gemm_force("fp16"), Error);
}

}  // namespace
}  // namespace multihead::test
