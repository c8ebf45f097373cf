// tests/test_rope.cpp: rotary position embedding (multihead/positions.hpp)
// against float64 references written here from their sources, not from
// src/attention/positions.cpp:
//  - interleaved: Meta's original Llama (apply_rotary_emb: x viewed as D/2
//    complex numbers, times freqs_cis = polar(1, p·θ_i)), std::complex here;
//  - half-split: Hugging Face Llama's apply_rotary_pos_emb,
//    x·cos + rotate_half(x)·sin with cos, sin = cat(freqs, freqs) and
//    rotate_half(x) = cat(−x[D/2:], x[:D/2]).
// Frequencies here are exp(−ln θ · 2i/D), a different route to θ^(−2i/D).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <complex>
#include <random>
#include <string>
#include <vector>

#include "multihead/error.hpp"
#include "multihead/positions.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

using test::fmt;

constexpr double kUnitRoundoff = 0x1.0p-24;

double inv_freq(int64_t i, int64_t D, double theta) {
  return std::exp(-std::log(theta) * 2.0 * static_cast<double>(i) / static_cast<double>(D));
}

// One head vector x (D) at position p.
std::vector<double> interleaved_reference(const double* x, int64_t D, double p, double theta) {
  std::vector<double> y(static_cast<std::size_t>(D));
  for (int64_t i = 0; i < D / 2; ++i) {
    const std::complex<double> z(x[2 * i], x[2 * i + 1]);
    const std::complex<double> r = z * std::polar(1.0, p * inv_freq(i, D, theta));
    y[2 * i] = r.real();
    y[2 * i + 1] = r.imag();
  }
  return y;
}

std::vector<double> half_split_reference(const double* x, int64_t D, double p, double theta) {
  const int64_t half = D / 2;
  std::vector<double> y(static_cast<std::size_t>(D));
  for (int64_t c = 0; c < D; ++c) {
    const double angle = p * inv_freq(c % half, D, theta);  // emb = cat(freqs, freqs)
    const double rotated = c < half ? -x[c + half] : x[c - half];  // rotate_half
    y[c] = x[c] * std::cos(angle) + rotated * std::sin(angle);
  }
  return y;
}

struct RopeCase {
  RopeConvention convention;
  int64_t lead, L, D;
  double theta;
  int64_t offset;
};

std::string case_name(const RopeCase& c) {
  return std::string(c.convention == RopeConvention::Interleaved ? "interleaved" : "halfsplit") + "_N" +
         std::to_string(c.lead) + "_L" + std::to_string(c.L) + "_D" + std::to_string(c.D) + "_theta" +
         std::to_string(static_cast<int64_t>(c.theta)) + "_off" + std::to_string(c.offset);
}

class Rope : public ::testing::TestWithParam<RopeCase> {};

// Tolerances. double: both sides take cos/sin of the same angle up to the
// rounding of the frequency (a few ulp of p·θ_i, |p·θ_i| <= 1100 here, so
// ~1e-13 absolute), on |x| <= ~6: 1e-11. float: the input is exact, the
// table's cos/sin are rounded once (u each) and a·cos − c·sin rounds twice
// more: |error| <= 4u·(|a| + |c|), doubled.
TEST_P(Rope, MatchesReference) {
  const RopeCase& c = GetParam();
  std::mt19937_64 rng(std::hash<std::string>{}(case_name(c)));
  const Tensor<double> x = test::random_tensor<double>(Shape{c.lead, c.L, c.D}, rng);
  Tensor<float> x32(x.shape());
  for (int64_t e = 0; e < x.numel(); ++e) x32[e] = static_cast<float>(x[e]);
  Tensor<double> x32d(x.shape());  // the float input, exactly, in double
  for (int64_t e = 0; e < x.numel(); ++e) x32d[e] = x32[e];
  const RopeOptions options{c.convention, c.theta, c.offset};
  const Tensor<double> y64 = rotary_embedding(x, options);
  const Tensor<float> y32 = rotary_embedding(x32, options);
  ASSERT_EQ(y64.shape(), x.shape());
  ASSERT_EQ(y32.shape(), x.shape());
  const auto reference = c.convention == RopeConvention::Interleaved ? interleaved_reference : half_split_reference;
  double worst64 = 0, worst32_over_bound = 0;
  for (int64_t n = 0; n < c.lead; ++n)
    for (int64_t l = 0; l < c.L; ++l) {
      const int64_t row = (n * c.L + l) * c.D;
      const double p = static_cast<double>(c.offset + l);
      const std::vector<double> want64 = reference(x.data() + row, c.D, p, c.theta);
      const std::vector<double> want32 = reference(x32d.data() + row, c.D, p, c.theta);
      for (int64_t d = 0; d < c.D; ++d) {
        const double err64 = std::abs(y64[row + d] - want64[d]);
        worst64 = std::max(worst64, err64);
        ASSERT_LE(err64, 1e-11) << "n=" << n << " l=" << l << " d=" << d;
        // the pair partner of d, under either convention
        const int64_t partner = c.convention == RopeConvention::Interleaved ? (d ^ 1) : (d + c.D / 2) % c.D;
        const double bound =
            8.0 * kUnitRoundoff * (std::abs(x32d[row + d]) + std::abs(x32d[row + partner])) + 1e-30;
        const double err32 = std::abs(static_cast<double>(y32[row + d]) - want32[d]);
        worst32_over_bound = std::max(worst32_over_bound, err32 / bound);
        ASSERT_LE(err32, bound) << "float n=" << n << " l=" << l << " d=" << d << " got " << y32[row + d]
                                << " want " << want32[d];
      }
    }
  RecordProperty("worst_double_error", fmt(worst64));
  RecordProperty("worst_float_error_over_bound", fmt(worst32_over_bound));
}

INSTANTIATE_TEST_SUITE_P(
    Table, Rope,
    ::testing::Values(RopeCase{RopeConvention::Interleaved, 1, 1, 2, 10000.0, 0},
                      RopeCase{RopeConvention::HalfSplit, 1, 1, 2, 10000.0, 0},
                      RopeCase{RopeConvention::Interleaved, 3, 17, 8, 10000.0, 0},
                      RopeCase{RopeConvention::HalfSplit, 3, 17, 8, 10000.0, 0},
                      RopeCase{RopeConvention::Interleaved, 2, 9, 64, 10000.0, 1000},
                      RopeCase{RopeConvention::HalfSplit, 2, 9, 64, 10000.0, 1000},
                      RopeCase{RopeConvention::Interleaved, 2, 5, 16, 500000.0, 7},
                      RopeCase{RopeConvention::HalfSplit, 2, 5, 16, 500000.0, 7}),
    [](const auto& info) { return case_name(info.param); });

// The checker can fail: the two conventions differ (D >= 4), and a
// position offset of 1 is noticed.
TEST(RopeChecker, ConventionsAndOffsetsAreDistinguished) {
  std::mt19937_64 rng(7);
  const Tensor<double> x = test::random_tensor<double>(Shape{1, 4, 8}, rng);
  const Tensor<double> inter = rotary_embedding(x, {RopeConvention::Interleaved, 10000.0, 0});
  const Tensor<double> half = rotary_embedding(x, {RopeConvention::HalfSplit, 10000.0, 0});
  const Tensor<double> shifted = rotary_embedding(x, {RopeConvention::HalfSplit, 10000.0, 1});
  EXPECT_GT(test::rel_error(inter, half), 1e-3);
  EXPECT_GT(test::rel_error(shifted, half), 1e-3);
  // Position 0 is the identity under both (cos 0 = 1, sin 0 = 0 exactly).
  const Tensor<double> at_zero = x.reshaped({4, 1, 8});
  for (RopeConvention conv : {RopeConvention::Interleaved, RopeConvention::HalfSplit})
    EXPECT_EQ(test::rel_error(rotary_embedding(at_zero, {conv, 10000.0, 0}), at_zero), 0.0);
}

// Rotation is relative: <rope(q, p), rope(k, p')> depends on p − p' only
// (RoFormer eq. 16), in both conventions.
TEST(Rope, ScoresDependOnRelativePosition) {
  std::mt19937_64 rng(11);
  const Tensor<double> q = test::random_tensor<double>(Shape{1, 16}, rng);
  const Tensor<double> k = test::random_tensor<double>(Shape{1, 16}, rng);
  for (RopeConvention conv : {RopeConvention::Interleaved, RopeConvention::HalfSplit}) {
    const auto score = [&](int64_t p, int64_t pk) {
      const Tensor<double> rq = rotary_embedding(q, {conv, 10000.0, p});
      const Tensor<double> rk = rotary_embedding(k, {conv, 10000.0, pk});
      double s = 0;
      for (int64_t d = 0; d < 16; ++d) s += rq[d] * rk[d];
      return s;
    };
    EXPECT_NEAR(score(5, 2), score(103, 100), 1e-10) << to_string(conv);
    EXPECT_GT(std::abs(score(5, 2) - score(5, 3)), 1e-6) << to_string(conv);
  }
}

TEST(RopeValidation, OddHeadWidthThetaAndOffsetNameTheOption) {
  const auto message = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  const Tensor<float> odd(Shape{2, 3, 5}, 1.0f);
  std::string m = message([&] { rotary_embedding(odd); });
  EXPECT_EQ(m, "x's last dimension: expected an even head width >= 2 (rotary embedding rotates pairs), got 5");
  m = message([] { validate_rope({}, 7, "rope", "--head-dim"); });
  EXPECT_EQ(m.rfind("--head-dim: expected an even head width", 0), 0u) << m;
  const Tensor<float> x(Shape{2, 4}, 1.0f);
  m = message([&] { rotary_embedding(x, {RopeConvention::HalfSplit, 0.0, 0}); });
  EXPECT_EQ(m, "options.theta: expected a finite number > 0, got 0");
  m = message([&] { rotary_embedding(x, {RopeConvention::HalfSplit, 10000.0, -1}); });
  EXPECT_EQ(m, "options.position_offset: expected 0 to 2^40, got -1");
  m = message([] { validate_rope({RopeConvention::HalfSplit, 1e4, -1}, 8, ""); });
  EXPECT_EQ(m, "position_offset: expected 0 to 2^40, got -1");
  m = message([] { parse_rope_convention("complex", "--rope"); });
  EXPECT_NE(m.find("interleaved or half-split"), std::string::npos) << m;
}

}  // namespace
}  // namespace multihead
