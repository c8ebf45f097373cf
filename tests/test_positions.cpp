// tests/test_positions.cpp: positional encodings against float64 formulas
// written here from the papers, not from src/attention/positions.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "multihead/error.hpp"
#include "multihead/positions.hpp"

namespace multihead {
namespace {

// Vaswani et al. 2017, §3.5, with the frequency as exp(−ln(10000)·2i/E)
// (the form of the Annotated Transformer), a different route to the same
// number. Tolerance: both sides evaluate sin/cos of the same angle within
// a few ulp of each other in double (|angle| < 200 here); float rounds once
// (2^-24 relative of a value <= 1) and 1e-6 absolute covers it.
double expected(int64_t p, int64_t c, int64_t width) {
  const int64_t i = c / 2;
  const double angle = static_cast<double>(p) * std::exp(-std::log(10000.0) * (2.0 * i) / width);
  return c % 2 == 0 ? std::sin(angle) : std::cos(angle);
}

struct Case {
  int64_t length, width, offset;
};

class SinusoidalPositions : public ::testing::TestWithParam<Case> {};

TEST_P(SinusoidalPositions, MatchesPaperFormula) {
  const Case c = GetParam();
  const Tensor<double> pe64 = sinusoidal_positions<double>(c.length, c.width, c.offset);
  const Tensor<float> pe32 = sinusoidal_positions<float>(c.length, c.width, c.offset);
  ASSERT_EQ(pe64.shape(), (Shape{c.length, c.width}));
  for (int64_t p = 0; p < c.length; ++p)
    for (int64_t col = 0; col < c.width; ++col) {
      const double want = expected(p + c.offset, col, c.width);
      ASSERT_NEAR(pe64[p * c.width + col], want, 1e-12) << "p=" << p << " col=" << col;
      ASSERT_NEAR(pe32[p * c.width + col], want, 1e-6) << "p=" << p << " col=" << col;
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SinusoidalPositions,
                         ::testing::Values(Case{1, 1, 0}, Case{7, 2, 0}, Case{16, 9, 0}, Case{33, 64, 0},
                                           Case{5, 8, 100}, Case{0, 4, 0}),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return "L" + std::to_string(c.length) + "_E" + std::to_string(c.width) + "_off" +
                                  std::to_string(c.offset);
                         });

// Position 0 is (0, 1, 0, 1, …); every row differs (order is visible).
TEST(SinusoidalPositions, StartsAtSinZeroCosOneAndRowsDiffer) {
  const Tensor<double> pe = sinusoidal_positions<double>(4, 6);
  for (int64_t c = 0; c < 6; ++c) EXPECT_EQ(pe[c], c % 2 == 0 ? 0.0 : 1.0);
  for (int64_t a = 0; a < 4; ++a)
    for (int64_t b = a + 1; b < 4; ++b) {
      double diff = 0;
      for (int64_t c = 0; c < 6; ++c) diff += std::fabs(pe[a * 6 + c] - pe[b * 6 + c]);
      EXPECT_GT(diff, 1e-3) << "rows " << a << " and " << b;
    }
}

TEST(SinusoidalPositions, BadArgumentsNameTheArgument) {
  EXPECT_THROW(
      {
        try {
          sinusoidal_positions<float>(-1, 4);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("length must be >= 0, got -1"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  EXPECT_THROW(sinusoidal_positions<float>(3, 0), Error);
  EXPECT_THROW(sinusoidal_positions<float>(3, 4, -2), Error);
}

}  // namespace
}  // namespace multihead
