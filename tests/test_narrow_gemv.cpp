// The 16-bit few-row product (src/core/narrow_gemv.hpp) and the 16-bit
// linear_forward that uses it, against a float64 reference of the same
// rounded values, on every Highway target this binary has and this CPU
// runs, for each case of the table (rows 1..8, in below, at and above the
// vector widths, out = 1, strided rows, bias or none), at 1 and 2 threads.
//
// The bound, per output o of row r, K = in terms:
//  - each product x_i·w_i of two 16-bit values is exact in float32 (8 or 11
//    significant bits each, at most 22 in the product; the values here are
//    far from float32's underflow);
//  - the float32 sum of K exact terms, in any order (four accumulators,
//    their lanes, a scalar tail: each term passes through at most K − 1
//    additions), is within γ_K Σ|x_i w_i| of the exact sum (Higham, Accuracy
//    and Stability of Numerical Algorithms, 2nd ed., eq. 4.4), with
//    γ_K = K·u/(1 − K·u), u = 2⁻²⁴;
//  - linear_forward then adds the bias (one float32 addition: u·|s + b|)
//    and rounds once to the 16-bit type: half an ulp, u_E·|y| with
//    u_E = 2⁻⁸ (bf16) or 2⁻¹¹ (f16), plus 2⁻²⁵ absolute for an f16
//    subnormal result.
// The gemm way (the reference path, forced by narrow_gemv_enabled(false))
// obeys the same bound, so the two ways agree within twice the float32-sum
// part of it before rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/gemm.hpp"
#include "core/linear.hpp"
#include "core/narrow_gemv.hpp"
#include "highway_targets.hpp"
#include "multihead/error.hpp"
#include "multihead/narrow.hpp"

namespace multihead::detail {
namespace {

using test::for_each_highway_target;

struct GemvCase {
  int64_t rows, out, in;
  int64_t pad;  // extra elements between rows of x and of W (ld = in + pad)
  bool bias;
};

std::string case_name(const GemvCase& c) {
  return "rows" + std::to_string(c.rows) + "_out" + std::to_string(c.out) + "_in" + std::to_string(c.in) +
         (c.pad > 0 ? "_pad" + std::to_string(c.pad) : "") + (c.bias ? "_bias" : "_nobias");
}

constexpr double kU32 = 0x1p-24;

double gamma(int64_t k) { return static_cast<double>(k) * kU32 / (1.0 - static_cast<double>(k) * kU32); }

template <class E>
constexpr double kUnitRoundoff = std::is_same_v<E, bfloat16> ? 0x1p-8 : 0x1p-11;

// The same rounded operands, and their products in float64 (exact):
// ref[r][o] = Σ x·w, mag[r][o] = Σ |x·w|.
template <class E>
struct Problem {
  GemvCase c;
  int64_t ld;
  std::vector<E> x, w, b;
  std::vector<double> ref, mag;

  explicit Problem(const GemvCase& cs, uint64_t seed) : c(cs), ld(cs.in + cs.pad) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    x.resize(static_cast<std::size_t>(c.rows * ld));
    w.resize(static_cast<std::size_t>(c.out * ld));
    for (E& v : x) v = narrow_from_float<E>(normal(rng));
    for (E& v : w) v = narrow_from_float<E>(normal(rng) * 0.25f);
    if (c.bias) {
      b.resize(static_cast<std::size_t>(c.out));
      for (E& v : b) v = narrow_from_float<E>(normal(rng));
    }
    ref.assign(static_cast<std::size_t>(c.rows * c.out), 0.0);
    mag = ref;
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t o = 0; o < c.out; ++o)
        for (int64_t i = 0; i < c.in; ++i) {
          const double p = static_cast<double>(to_float(x[r * ld + i])) * to_float(w[o * ld + i]);
          ref[r * c.out + o] += p;
          mag[r * c.out + o] += std::fabs(p);
        }
  }
  // The bound on |acc − ref| for the float32 sums alone.
  double sum_bound(std::size_t k) const { return gamma(c.in) * mag[k]; }
  // The bound on |y − (ref + b)| for linear_forward's rounded output.
  double output_bound(std::size_t k, double exact) const {
    const double before_rounding = sum_bound(k) + kU32 * (std::fabs(exact) + sum_bound(k));
    return before_rounding + kUnitRoundoff<E> * (std::fabs(exact) + before_rounding) +
           (std::is_same_v<E, float16> ? 0x1p-25 : 0.0);
  }
};

// Violations of |got[k] − want[k]| <= bound(k), the first few reported.
template <class Bound>
int64_t count_outside(const std::vector<double>& got, const std::vector<double>& want, const Bound& bound,
                      const std::string& what, bool report = true) {
  int64_t bad = 0;
  for (std::size_t k = 0; k < got.size(); ++k) {
    const double err = std::fabs(got[k] - want[k]);
    if (!(err <= bound(k)) && bad++ < 5 && report)
      ADD_FAILURE() << what << ": element " << k << " got " << got[k] << ", want " << want[k] << ", error " << err
                    << " > bound " << bound(k);
  }
  return bad;
}

// The kernel's float32 sums on every target, at 1 and 2 threads (the same
// bits), within γ_K Σ|x w| of float64, and the gemm way's within the same.
template <class E>
void check_kernel(const GemvCase& c) {
  const Problem<E> p(c, 17 + static_cast<uint64_t>(c.rows * 1000 + c.in));
  const std::size_t n = static_cast<std::size_t>(c.rows * c.out);
  std::vector<float> gemm_acc(n);
  gemm_blocked(Trans::No, Trans::Yes, c.rows, c.out, c.in, p.x.data(), p.ld, p.w.data(), p.ld, 0.0f,
               gemm_acc.data(), c.out, 1);
  const std::vector<double> gemm_wide(gemm_acc.begin(), gemm_acc.end());
  count_outside(gemm_wide, p.ref, [&](std::size_t k) { return p.sum_bound(k); }, case_name(c) + " gemm way");
  for_each_highway_target([&](const std::string& target) {
    std::vector<float> one(n, -1.0f), two(n, -2.0f);
    narrow_gemv(c.rows, c.out, c.in, p.x.data(), p.ld, p.w.data(), p.ld, one.data(), c.out, 1);
    narrow_gemv(c.rows, c.out, c.in, p.x.data(), p.ld, p.w.data(), p.ld, two.data(), c.out, 2);
    for (std::size_t k = 0; k < n; ++k)
      if (std::bit_cast<uint32_t>(one[k]) != std::bit_cast<uint32_t>(two[k])) {
        ADD_FAILURE() << case_name(c) << " " << target << ": element " << k << " 1 thread " << one[k]
                      << ", 2 threads " << two[k];
        break;
      }
    const std::vector<double> got(one.begin(), one.end());
    count_outside(got, p.ref, [&](std::size_t k) { return p.sum_bound(k); }, case_name(c) + " " + target);
    count_outside(got, gemm_wide, [&](std::size_t k) { return 2 * p.sum_bound(k); },
                  case_name(c) + " " + target + " against the gemm way");
  });
}

// linear_forward<E> (bias, one rounding) within the output bound, both ways.
template <class E>
void check_linear(const GemvCase& c) {
  const Problem<E> p(c, 29 + static_cast<uint64_t>(c.out * 1000 + c.in));
  const std::size_t n = static_cast<std::size_t>(c.rows * c.out);
  std::vector<double> exact(n);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t o = 0; o < c.out; ++o)
      exact[r * c.out + o] = p.ref[r * c.out + o] + (c.bias ? static_cast<double>(to_float(p.b[o])) : 0.0);
  const auto run = [&](bool gemv, int threads) {
    narrow_gemv_enabled(gemv);
    std::vector<E> y(n);
    linear_forward<E>({c.rows, p.x.data(), p.ld}, LinearWeight<E>::stored(p.w.data(), c.out, c.in, p.ld),
                      c.bias ? p.b.data() : nullptr, y.data(), 0, {false, threads});
    narrow_gemv_enabled(true);
    std::vector<double> wide(n);
    for (std::size_t k = 0; k < n; ++k) wide[k] = to_float(y[k]);
    return wide;
  };
  const auto bound = [&](std::size_t k) { return p.output_bound(k, exact[k]); };
  count_outside(run(false, 2), exact, bound, case_name(c) + " linear_forward, gemm way");
  for_each_highway_target([&](const std::string& target) {
    const std::vector<double> one = run(true, 1), two = run(true, 2);
    EXPECT_EQ(one, two) << case_name(c) << " " << target << ": linear_forward at 1 and 2 threads";
    count_outside(one, exact, bound, case_name(c) + " " + target + " linear_forward");
  });
}

class NarrowGemv : public ::testing::TestWithParam<GemvCase> {};

TEST_P(NarrowGemv, Bf16SumsWithinGammaKOfFloat64OnEveryTarget) { check_kernel<bfloat16>(GetParam()); }
TEST_P(NarrowGemv, F16SumsWithinGammaKOfFloat64OnEveryTarget) { check_kernel<float16>(GetParam()); }
TEST_P(NarrowGemv, Bf16LinearForwardWithinOneRoundingOnEveryTarget) { check_linear<bfloat16>(GetParam()); }
TEST_P(NarrowGemv, F16LinearForwardWithinOneRoundingOnEveryTarget) { check_linear<float16>(GetParam()); }

// in around the widths (4, 8, 16 floats; 4 accumulators: 16, 32, 64 per
// round), out = 1, every row count to 8, strided rows, and one case large
// enough for two threads to split its columns (3 × 100 × 4099 is above the
// grain, core/parallel.hpp).
INSTANTIATE_TEST_SUITE_P(
    Cases, NarrowGemv,
    ::testing::Values(GemvCase{1, 1, 1, 0, false}, GemvCase{1, 1, 7, 0, true}, GemvCase{1, 17, 15, 0, false},
                      GemvCase{2, 16, 16, 0, true}, GemvCase{3, 5, 17, 3, false}, GemvCase{4, 33, 31, 0, true},
                      GemvCase{5, 1, 63, 1, false}, GemvCase{6, 40, 64, 0, true}, GemvCase{7, 9, 65, 0, false},
                      GemvCase{8, 20, 129, 5, true}, GemvCase{1, 300, 1000, 0, true},
                      GemvCase{3, 100, 4099, 0, false}, GemvCase{8, 64, 4096, 0, true}),
    [](const ::testing::TestParamInfo<GemvCase>& info) { return case_name(info.param); });

// The checker fails when one element leaves the bound (a test that cannot
// fail checks nothing).
TEST(NarrowGemvChecker, OneElementOutsideItsBoundIsCaught) {
  const Problem<bfloat16> p({2, 10, 33, 0, false}, 5);
  std::vector<double> got = p.ref;
  const auto bound = [&](std::size_t k) { return p.sum_bound(k); };
  EXPECT_EQ(count_outside(got, p.ref, bound, "unperturbed", false), 0);
  got[7] += 2 * p.sum_bound(7) + 1e-30;
  EXPECT_EQ(count_outside(got, p.ref, bound, "perturbed", false), 1);
}

// The switch forces the gemm way: linear_forward's bits are each way's own
// float32 sums rounded once. 4096 outputs of 4096 terms: the two orders of
// summation differ in a few float32 ulps, and some of those differences
// straddle an f16 rounding boundary (checked: the test needs one).
TEST(NarrowGemvSwitch, LinearForwardFollowsTheSwitch_out4096_in4096) {
  if (native_16bit_gemm<float16>()) GTEST_SKIP() << "f16 has a native matmul here: the few-row product is unused";
  constexpr int64_t kOut = 4096, kIn = 4096;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float16> x(kIn), w(kOut * kIn);
  for (float16& v : x) v = to_float16(normal(rng));
  for (float16& v : w) v = to_float16(normal(rng));
  std::vector<float> gemv_acc(kOut), gemm_acc(kOut);
  narrow_gemv(1, kOut, kIn, x.data(), kIn, w.data(), kIn, gemv_acc.data(), kOut, 1);
  gemm_blocked(Trans::No, Trans::Yes, 1, kOut, kIn, x.data(), kIn, w.data(), kIn, 0.0f, gemm_acc.data(), kOut, 1);
  const auto rounded = [](const std::vector<float>& a) {
    std::vector<uint16_t> r;
    for (const float v : a) r.push_back(to_float16(v).bits);
    return r;
  };
  ASSERT_NE(rounded(gemv_acc), rounded(gemm_acc)) << "the two ways round to the same f16 bits: choose another case";
  const auto run = [&](bool gemv) {
    narrow_gemv_enabled(gemv);
    std::vector<float16> y(kOut);
    linear_forward<float16>({1, x.data(), kIn}, LinearWeight<float16>::stored(w.data(), kOut, kIn), nullptr,
                            y.data(), 0, {false, 1});
    narrow_gemv_enabled(true);
    std::vector<uint16_t> bits;
    for (const float16 v : y) bits.push_back(v.bits);
    return bits;
  };
  EXPECT_EQ(run(true), rounded(gemv_acc));
  EXPECT_EQ(run(false), rounded(gemm_acc));
}

// MULTIHEAD_NARROW_GEMV=gemm forces the gemm way, as narrow_gemv_enabled(false)
// does; any other value than auto, gemm or empty is refused, naming it.
TEST(NarrowGemvSwitch, EnvironmentForcesTheGemmWayAndNamesABadValue) {
  if (native_16bit_gemm<float16>()) GTEST_SKIP() << "f16 has a native matmul here: the few-row product is unused";
  struct Variable {  // set for this scope only, whatever happens
    explicit Variable(const char* v) { setenv("MULTIHEAD_NARROW_GEMV", v, 1); }
    ~Variable() { unsetenv("MULTIHEAD_NARROW_GEMV"); }
  };
  constexpr int64_t kOut = 4096, kIn = 4096;
  std::mt19937_64 rng(3);  // the case above: the two ways differ in some f16 bit
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float16> x(kIn), w(kOut * kIn);
  for (float16& v : x) v = to_float16(normal(rng));
  for (float16& v : w) v = to_float16(normal(rng));
  const auto run = [&] {
    std::vector<float16> y(kOut);
    linear_forward<float16>({1, x.data(), kIn}, LinearWeight<float16>::stored(w.data(), kOut, kIn), nullptr,
                            y.data(), 0, {false, 1});
    std::vector<uint16_t> bits;
    for (const float16 v : y) bits.push_back(v.bits);
    return bits;
  };
  const std::vector<uint16_t> gemv = run();
  narrow_gemv_enabled(false);
  const std::vector<uint16_t> gemm = run();
  narrow_gemv_enabled(true);
  ASSERT_NE(gemv, gemm);
  {
    const Variable scoped("gemm");
    EXPECT_EQ(run(), gemm);
  }
  {
    const Variable scoped("auto");
    EXPECT_EQ(run(), gemv);
  }
  const Variable scoped("fastest");
  try {
    (void)run();
    ADD_FAILURE() << "MULTIHEAD_NARROW_GEMV=fastest was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "MULTIHEAD_NARROW_GEMV: expected one of auto, gemm; got 'fastest'");
  }
}

}  // namespace
}  // namespace multihead::detail
