// tests/test_rope_backward.cpp: rotary_embedding_backward (multihead/positions.hpp),
// d_x = Rᵀ d_y, checked two independent ways:
//  - central differences in double of ℓ(x) = Σ rotary_embedding(x) ⊙ G;
//  - a float64 formula written here: for pair (a, c) at angle
//    φ = p·θ^(−2i/D) (computed as exp(−ln θ·2i/D), not std::pow),
//      d_a = cos φ·g_a + sin φ·g_c,   d_c = −sin φ·g_a + cos φ·g_c,
//    pairs (2i, 2i + 1) interleaved and (i, i + D/2) half-split.
// Names carry every parameter: convention, leading size, L, D, θ, offset.
//
// Bounds. ℓ is linear in x, so a central difference has no truncation
// error, only rounding: each evaluation of ℓ is a sum of n = numel products
// of rotated elements, off by <= u·(n + 4)·W (W = Σ |G|·(|a| + |c|) over the
// pairs, u = 2^-53), so |fd − g| <= 2·u·(n + 4)·W / (2h) + the backward's
// own rounding (below), h = 2^-10 (exact steps). Against the formula:
// cos and sin are rounded once to T (u_T each), and each output is two
// products and a sum, so |d − ref| <= 4·u_T·(|g_a| + |g_c|) (plus the
// formula's own float64 rounding, covered by the factor 4 in double too).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "multihead/error.hpp"
#include "multihead/positions.hpp"

namespace multihead {
namespace {

struct RopeBwdCase {
  RopeConvention convention;
  int64_t outer, L, D;
  double theta;
  int64_t offset;
  std::string name() const {
    std::ostringstream os;
    os << (convention == RopeConvention::Interleaved ? "interleaved" : "halfsplit") << "_outer" << outer << "_L" << L
       << "_D" << D << "_theta" << static_cast<int64_t>(theta) << "_off" << offset;
    return os.str();
  }
};
void PrintTo(const RopeBwdCase& c, std::ostream* os) { *os << c.name(); }

template <class T>
Tensor<T> random_tensor(const RopeBwdCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Tensor<T> x(Shape{c.outer, c.L, c.D});
  for (int64_t e = 0; e < x.numel(); ++e) x[e] = static_cast<T>(normal(rng));
  return x;
}

RopeOptions options_for(const RopeBwdCase& c) {
  RopeOptions o;
  o.convention = c.convention, o.theta = c.theta, o.position_offset = c.offset;
  return o;
}

// The index of pair i's second element, relative to the first, and the first's.
int64_t first_of(const RopeBwdCase& c, int64_t i) { return c.convention == RopeConvention::Interleaved ? 2 * i : i; }
int64_t second_of(const RopeBwdCase& c, int64_t i) {
  return c.convention == RopeConvention::Interleaved ? 2 * i + 1 : i + c.D / 2;
}

class RopeBackward : public ::testing::TestWithParam<RopeBwdCase> {};

TEST_P(RopeBackward, CentralDifferencesInDouble) {
  const RopeBwdCase c = GetParam();
  const RopeOptions o = options_for(c);
  Tensor<double> x = random_tensor<double>(c, 11), G = random_tensor<double>(c, 12);
  const Tensor<double> g = rotary_embedding_backward(G, o);
  const auto loss = [&] {
    const Tensor<double> y = rotary_embedding(x, o);
    double l = 0;
    for (int64_t e = 0; e < y.numel(); ++e) l += y[e] * G[e];
    return l;
  };
  double W = 0;
  for (int64_t e = 0; e < x.numel(); ++e) W += std::abs(G[e]) * 2 * std::abs(x[e]);
  const double h = 0x1.0p-10, u = 0x1.0p-53;
  const double bound = 2 * u * static_cast<double>(x.numel() + 4) * (W + 1) / (2 * h);
  double worst = 0;
  for (int64_t e = 0; e < x.numel(); ++e) {
    const double x0 = x[e];
    x[e] = x0 + h;
    const double up = loss();
    x[e] = x0 - h;
    const double down = loss();
    x[e] = x0;
    const double fd = (up - down) / (2 * h), err = std::abs(fd - g[e]);
    worst = std::max(worst, err);
    ASSERT_LE(err, bound) << "element " << e << ": backward " << g[e] << ", central difference " << fd;
  }
  std::cout << "  worst |g − fd| " << worst << " (bound " << bound << ")\n";
}

template <class T>
void check_formula(const RopeBwdCase& c, double u, double* worst_ratio) {
  const Tensor<T> G = random_tensor<T>(c, 21);
  const Tensor<T> d = rotary_embedding_backward(G, options_for(c));
  for (int64_t b = 0; b < c.outer; ++b)
    for (int64_t l = 0; l < c.L; ++l) {
      const double p = static_cast<double>(c.offset + l);
      const int64_t row = (b * c.L + l) * c.D;
      for (int64_t i = 0; i < c.D / 2; ++i) {
        const double phi = p * std::exp(-std::log(c.theta) * 2.0 * static_cast<double>(i) / static_cast<double>(c.D));
        const int64_t ia = row + first_of(c, i), ic = row + second_of(c, i);
        const double ga = G[ia], gc = G[ic];
        const double want_a = std::cos(phi) * ga + std::sin(phi) * gc;
        const double want_c = -std::sin(phi) * ga + std::cos(phi) * gc;
        // The angle itself: p·θ_i in double, then cos/sin, off by ~p·2^-53
        // radians between the two routes to θ_i (added to the bound).
        const double bound = (4 * u + 4 * p * 0x1.0p-52) * (std::abs(ga) + std::abs(gc));
        const double ea = std::abs(static_cast<double>(d[ia]) - want_a);
        const double ec = std::abs(static_cast<double>(d[ic]) - want_c);
        ASSERT_LE(ea, bound) << "pair " << i << " first, batch " << b << " row " << l;
        ASSERT_LE(ec, bound) << "pair " << i << " second, batch " << b << " row " << l;
        if (bound > 0) *worst_ratio = std::max(*worst_ratio, std::max(ea, ec) / bound);
      }
    }
}

TEST_P(RopeBackward, MatchesFloat64Formula) {
  double r32 = 0, r64 = 0;
  check_formula<float>(GetParam(), 0x1.0p-24, &r32);
  check_formula<double>(GetParam(), 0x1.0p-53, &r64);
  std::cout << "  worst error / bound: float32 " << r32 << ", float64 " << r64 << "\n";
}

// Rᵀ R = I: the backward undoes the forward, to rounding (float64).
TEST_P(RopeBackward, UndoesTheForward) {
  const RopeBwdCase c = GetParam();
  const Tensor<double> x = random_tensor<double>(c, 31);
  const Tensor<double> back = rotary_embedding_backward(rotary_embedding(x, options_for(c)), options_for(c));
  for (int64_t e = 0; e < x.numel(); ++e) ASSERT_NEAR(back[e], x[e], 1e-13 * (1 + std::abs(x[e]))) << e;
}

std::vector<RopeBwdCase> rope_backward_cases() {
  return {{RopeConvention::HalfSplit, 2, 5, 8, 10000.0, 0},
          {RopeConvention::Interleaved, 2, 5, 8, 10000.0, 0},
          {RopeConvention::HalfSplit, 3, 7, 6, 500000.0, 9},
          {RopeConvention::Interleaved, 1, 3, 2, 10000.0, 1000},
          {RopeConvention::Interleaved, 3, 4, 16, 500000.0, 3}};
}

INSTANTIATE_TEST_SUITE_P(Cases, RopeBackward, ::testing::ValuesIn(rope_backward_cases()),
                         [](const auto& info) { return info.param.name(); });

// The checks can fail: the forward (a +φ rotation) in place of the
// backward misses the formula whenever some angle is nonzero.
TEST(RopeBackwardChecker, ForwardInPlaceOfBackwardFails) {
  const RopeBwdCase c{RopeConvention::Interleaved, 1, 3, 4, 10000.0, 1};
  const RopeOptions o = options_for(c);
  const Tensor<double> G = random_tensor<double>(c, 41);
  const Tensor<double> right = rotary_embedding_backward(G, o), wrong = rotary_embedding(G, o);
  double diff = 0;
  for (int64_t e = 0; e < G.numel(); ++e) diff = std::max(diff, std::abs(right[e] - wrong[e]));
  EXPECT_GT(diff, 0.1);
}

TEST(RopeBackwardValidation, OddHeadWidthAndRankNameTheFunction) {
  EXPECT_THROW(rotary_embedding_backward(Tensor<float>(Shape{2, 3}), RopeOptions{}), Error);
  try {
    rotary_embedding_backward(Tensor<float>(Shape{4}), RopeOptions{});
    ADD_FAILURE() << "accepted a 1-d d_y";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rotary_embedding_backward: d_y"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace multihead
