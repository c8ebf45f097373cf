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

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/gemm.hpp"
#include "core/linear.hpp"

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

}  // namespace
}  // namespace multihead::test
