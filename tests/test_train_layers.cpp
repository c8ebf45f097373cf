// tests/test_train_layers.cpp: each layer of the trainer (src/train/layers.hpp)
// against central finite differences of its own forward, in double (step,
// bound and why in train_gradcheck.hpp), plus the cross-entropy's value
// against a long-double formula written here.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "multihead/positions.hpp"
#include "train/layers.hpp"
#include "train_gradcheck.hpp"

namespace multihead::test {
namespace {

using namespace multihead::train;

std::vector<double> randn(int64_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

void expect_within(const FdWorst& w, const char* what) {
  EXPECT_LE(w.error, kFdBound) << what << ": " << w.describe();
  EXPECT_GT(w.checked, 0) << what;
}

// N=7 tokens, E=5 (odd, not a vector width), V=4 so tokens repeat.
TEST(TrainLayersFiniteDifferences, EmbeddingN7E5V4RepeatedTokens) {
  std::mt19937_64 rng(1);
  const int64_t N = 7, E = 5, V = 4;
  const std::vector<int32_t> tokens = {0, 3, 3, 1, 0, 2, 3};
  std::vector<double> W = randn(V * E, rng), w = randn(N * E, rng), x(static_cast<std::size_t>(N * E));
  auto f = [&] {
    embedding_forward(tokens.data(), N, W.data(), E, x.data());
    return dot(x, w);
  };
  std::vector<double> d_W(static_cast<std::size_t>(V * E), 0.0);
  embedding_backward(tokens.data(), N, w.data(), E, d_W.data());
  expect_within(finite_difference(W.data(), V * E, f, d_W.data()), "d_weight");
}

// The positional encoding is a constant: d_embedded = d_x, and the encoding
// added is multihead::sinusoidal_positions row l for position l of every row.
TEST(TrainLayersFiniteDifferences, PositionsB2L3E6) {
  std::mt19937_64 rng(2);
  const int64_t B = 2, L = 3, E = 6, N = B * L;
  const Tensor<double> pe = sinusoidal_positions<double>(L, E);
  std::vector<double> e = randn(N * E, rng), w = randn(N * E, rng), x(static_cast<std::size_t>(N * E));
  auto f = [&] {
    x = e;
    positions_forward(x.data(), B, L, E, pe.data());
    return dot(x, w);
  };
  f();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L * E; ++i) ASSERT_EQ(x[static_cast<std::size_t>(b * L * E + i)], e[static_cast<std::size_t>(b * L * E + i)] + pe[i]);
  std::vector<double> d_e(static_cast<std::size_t>(N * E), 0.0);
  positions_backward(w.data(), N, E, d_e.data());
  expect_within(finite_difference(e.data(), N * E, f, d_e.data()), "d_embedded");
}

TEST(TrainLayersFiniteDifferences, LayerNormN4E7) {
  std::mt19937_64 rng(3);
  const int64_t N = 4, E = 7;
  std::vector<double> x = randn(N * E, rng, 2.0), g = randn(E, rng), b = randn(E, rng), w = randn(N * E, rng);
  for (auto& v : x) v += 0.5;  // a non-zero mean per row
  std::vector<double> y(static_cast<std::size_t>(N * E)), mean(static_cast<std::size_t>(N)), rstd(static_cast<std::size_t>(N));
  auto f = [&] {
    layernorm_forward(x.data(), N, E, g.data(), b.data(), y.data(), mean.data(), rstd.data());
    return dot(y, w);
  };
  f();
  std::vector<double> d_x(x.size(), 0.0), d_g(g.size(), 0.0), d_b(b.size(), 0.0);
  layernorm_backward(w.data(), x.data(), mean.data(), rstd.data(), g.data(), N, E, d_x.data(), d_g.data(), d_b.data());
  expect_within(finite_difference(x.data(), N * E, f, d_x.data()), "d_x");
  expect_within(finite_difference(g.data(), E, f, d_g.data()), "d_gamma");
  expect_within(finite_difference(b.data(), E, f, d_b.data()), "d_beta");
  // The forward against nn.LayerNorm's definition, row 0.
  f();
  double mu = 0, var = 0;
  for (int64_t e = 0; e < E; ++e) mu += x[static_cast<std::size_t>(e)] / E;
  for (int64_t e = 0; e < E; ++e) var += (x[static_cast<std::size_t>(e)] - mu) * (x[static_cast<std::size_t>(e)] - mu) / E;
  for (int64_t e = 0; e < E; ++e)
    EXPECT_NEAR(y[static_cast<std::size_t>(e)], (x[static_cast<std::size_t>(e)] - mu) / std::sqrt(var + 1e-5) * g[static_cast<std::size_t>(e)] + b[static_cast<std::size_t>(e)], 1e-12);
}

// N=37 rows: more than one block (kMinRowBlock, 32 rows) of the blocked product, and a remainder.
TEST(TrainLayersFiniteDifferences, LinearN37In5Out3) {
  std::mt19937_64 rng(4);
  const int64_t N = 37, in = 5, out = 3;
  std::vector<double> x = randn(N * in, rng), W = randn(out * in, rng), b = randn(out, rng), w = randn(N * out, rng);
  std::vector<double> y(static_cast<std::size_t>(N * out));
  auto f = [&] {
    detail::linear_forward<double>({N, x.data(), in}, detail::LinearWeight<double>::stored(W.data(), out, in), b.data(),
                                   y.data(), out, {false, 2});
    return dot(y, w);
  };
  std::vector<double> d_x(x.size(), 0.0), d_W(W.size(), 0.0), d_b(b.size(), 0.0);
  detail::linear_backward<double>({N, x.data(), in}, detail::LinearWeight<double>::stored(W.data(), out, in), w.data(),
                                  out, {d_x.data(), in, d_W.data(), d_b.data()}, {true, 2});
  expect_within(finite_difference(x.data(), N * in, f, d_x.data()), "d_x");
  expect_within(finite_difference(W.data(), out * in, f, d_W.data()), "d_W");
  expect_within(finite_difference(b.data(), out, f, d_b.data()), "d_b");
}

// Linear–ReLU–Linear as the model's ff sub-layer. ReLU's kink: the test
// checks that no pre-activation lies within 1e-3 of 0, where a ±h step
// could cross it (then the difference quotient is not the derivative).
TEST(TrainLayersFiniteDifferences, FeedForwardN6E4F9) {
  std::mt19937_64 rng(5);
  const int64_t N = 6, E = 4, F = 9;
  std::vector<double> x = randn(N * E, rng), W1 = randn(F * E, rng), b1 = randn(F, rng), W2 = randn(E * F, rng),
                      b2 = randn(E, rng), w = randn(N * E, rng);
  std::vector<double> f1(static_cast<std::size_t>(N * F)), r(f1.size()), y(static_cast<std::size_t>(N * E));
  auto f = [&] {
    detail::linear_forward<double>({N, x.data(), E}, detail::LinearWeight<double>::stored(W1.data(), F, E), b1.data(),
                                   f1.data(), F, {false, 1});
    relu_forward(f1.data(), N * F, r.data());
    detail::linear_forward<double>({N, r.data(), F}, detail::LinearWeight<double>::stored(W2.data(), E, F), b2.data(),
                                   y.data(), E, {false, 1});
    return dot(y, w);
  };
  f();
  int positive = 0;
  for (double v : f1) {
    ASSERT_GT(std::abs(v), 1e-3) << "a pre-activation at the kink; pick another seed";
    positive += v > 0;
  }
  ASSERT_GT(positive, 0);
  ASSERT_LT(positive, N * F);  // both sides of the ReLU are exercised
  std::vector<double> d_r(r.size(), 0.0), d_f1(f1.size(), 0.0), d_x(x.size(), 0.0), d_W1(W1.size(), 0.0),
      d_b1(b1.size(), 0.0), d_W2(W2.size(), 0.0), d_b2(b2.size(), 0.0);
  detail::linear_backward<double>({N, r.data(), F}, detail::LinearWeight<double>::stored(W2.data(), E, F), w.data(),
                                  E, {d_r.data(), F, d_W2.data(), d_b2.data()}, {true, 1});
  relu_backward(d_r.data(), f1.data(), N * F, d_f1.data());
  detail::linear_backward<double>({N, x.data(), E}, detail::LinearWeight<double>::stored(W1.data(), F, E), d_f1.data(),
                                  F, {d_x.data(), E, d_W1.data(), d_b1.data()}, {true, 1});
  expect_within(finite_difference(x.data(), N * E, f, d_x.data()), "d_x");
  expect_within(finite_difference(W1.data(), F * E, f, d_W1.data()), "d_W1");
  expect_within(finite_difference(b1.data(), F, f, d_b1.data()), "d_b1");
  expect_within(finite_difference(W2.data(), E * F, f, d_W2.data()), "d_W2");
  expect_within(finite_difference(b2.data(), E, f, d_b2.data()), "d_b2");
}

// Cross-entropy with 2 of N=5 positions masked out: their logits get no
// gradient and do not count in the mean. The loss itself is checked against
// Σ(log Σ exp − z_t)/count in long double.
TEST(TrainLayersFiniteDifferences, CrossEntropyN5V6TwoMasked) {
  std::mt19937_64 rng(6);
  const int64_t N = 5, V = 6;
  std::vector<double> z = randn(N * V, rng, 3.0), probs(z.size());
  const std::vector<int32_t> t = {2, 0, 5, 5, 1};
  const std::vector<uint8_t> mask = {1, 0, 1, 1, 0};
  CrossEntropyResult r;
  auto f = [&] {
    r = cross_entropy_forward(z.data(), t.data(), mask.data(), N, V, probs.data());
    return r.loss;
  };
  f();
  EXPECT_EQ(r.count, 3);
  long double want = 0;
  int64_t correct = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (!mask[static_cast<std::size_t>(n)]) continue;
    long double s = 0;
    int64_t arg = 0;
    for (int64_t v = 0; v < V; ++v) {
      s += std::exp(static_cast<long double>(z[static_cast<std::size_t>(n * V + v)]));
      if (z[static_cast<std::size_t>(n * V + v)] > z[static_cast<std::size_t>(n * V + arg)]) arg = v;
    }
    want += std::log(s) - z[static_cast<std::size_t>(n * V + t[static_cast<std::size_t>(n)])];
    correct += arg == t[static_cast<std::size_t>(n)];
  }
  EXPECT_NEAR(r.loss, static_cast<double>(want / 3), 1e-14);
  EXPECT_EQ(r.correct, correct);
  std::vector<double> d_z(z.size(), 0.0);
  cross_entropy_backward(probs.data(), t.data(), mask.data(), N, V, r.count, d_z.data());
  expect_within(finite_difference(z.data(), N * V, f, d_z.data()), "d_logits");
  for (int64_t v = 0; v < V; ++v) EXPECT_EQ(d_z[static_cast<std::size_t>(1 * V + v)], 0.0) << "masked row 1";
}

// The checker can fail: one wrong element of a correct gradient is found.
TEST(TrainLayersFiniteDifferences, CheckerFindsOnePerturbedElement) {
  std::mt19937_64 rng(7);
  const int64_t N = 4, E = 7;
  std::vector<double> x = randn(N * E, rng), g = randn(E, rng), b = randn(E, rng), w = randn(N * E, rng);
  std::vector<double> y(x.size()), mean(static_cast<std::size_t>(N)), rstd(static_cast<std::size_t>(N));
  auto f = [&] {
    layernorm_forward(x.data(), N, E, g.data(), b.data(), y.data(), mean.data(), rstd.data());
    return dot(y, w);
  };
  f();
  std::vector<double> d_x(x.size(), 0.0), d_g(g.size(), 0.0), d_b(b.size(), 0.0);
  layernorm_backward(w.data(), x.data(), mean.data(), rstd.data(), g.data(), N, E, d_x.data(), d_g.data(), d_b.data());
  d_x[9] += 1e-4;  // a small error, far above the bound
  const FdWorst worst = finite_difference(x.data(), N * E, f, d_x.data());
  EXPECT_GT(worst.error, kFdBound) << worst.describe();
  EXPECT_EQ(worst.index, 9);
}

}  // namespace
}  // namespace multihead::test
