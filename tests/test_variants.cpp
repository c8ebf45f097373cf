// tests/test_variants.cpp: the score variants outside the rule table
// (tests/test_score_rule.cpp checks their values for every kernel):
//  - alibi_slopes(H) against the paper's formula, written here in float64;
//  - the flash kernel's window tile skipping, on every SIMD target;
//  - the validation of window, softcap and alibi_slopes.
//
// Legend: N slices, L queries, S keys, D head width, H heads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernel.hpp"
#include "multihead/attention.hpp"
#include "multihead/error.hpp"
#include "multihead/runtime.hpp"

namespace multihead {
namespace {

// ---- ALiBi slopes ----------------------------------------------------------

// Press et al. 2022, section 3: for n heads (a power of two) the slopes are
// the geometric sequence that starts at 2^(−8/n) with that ratio; for other
// H the authors' code takes the closest power of two n <= H, then every
// other slope (1st, 3rd, …) of the 2n sequence for the remaining H − n.
std::vector<double> paper_slopes(int64_t H) {
  const auto geometric = [](int64_t n) {
    std::vector<double> s;
    const double start = std::pow(2.0, -8.0 / static_cast<double>(n));
    double m = start;
    for (int64_t h = 0; h < n; ++h, m *= start) s.push_back(m);
    return s;
  };
  const int64_t n = static_cast<int64_t>(std::pow(2.0, std::floor(std::log2(static_cast<double>(H)))));
  std::vector<double> s = geometric(n);
  const std::vector<double> finer = geometric(2 * n);
  for (int64_t x = 0; static_cast<int64_t>(s.size()) < H; x += 2) s.push_back(finer[static_cast<std::size_t>(x)]);
  return s;
}

class AlibiSlopes : public ::testing::TestWithParam<int64_t> {};

// Bound: the formula's pow and the repeated products round (h + 2 times at
// most, h <= 32), the library's exp2 once: 64 ulp of double is ample.
TEST_P(AlibiSlopes, MatchPaperFormula) {
  const int64_t H = GetParam();
  const std::vector<double> got = alibi_slopes(H), want = paper_slopes(H);
  ASSERT_EQ(got.size(), static_cast<std::size_t>(H));
  for (int64_t h = 0; h < H; ++h) {
    const double bound = 64 * 0x1.0p-52 * want[static_cast<std::size_t>(h)];
    EXPECT_NEAR(got[static_cast<std::size_t>(h)], want[static_cast<std::size_t>(h)], bound)
        << "H=" << H << " head " << h;
  }
}

INSTANTIATE_TEST_SUITE_P(Heads, AlibiSlopes, ::testing::Values(1, 2, 3, 5, 8, 12, 16),
                         [](const auto& info) { return "H" + std::to_string(info.param); });

// A few values written out, from the authors' repository's get_slopes:
// H = 8 gives 1/2, 1/4, …, 1/256; H = 3 gives 2^-4, 2^-8 (n = 2) then 2^-2
// (the first of the n = 4 sequence).
TEST(AlibiSlopesValues, WrittenOut) {
  const std::vector<double> eight = alibi_slopes(8);
  for (int h = 0; h < 8; ++h) EXPECT_DOUBLE_EQ(eight[static_cast<std::size_t>(h)], std::ldexp(1.0, -(h + 1)));
  EXPECT_EQ(alibi_slopes(3), (std::vector<double>{0x1.0p-4, 0x1.0p-8, 0x1.0p-2}));
  EXPECT_EQ(alibi_slopes(1), (std::vector<double>{0x1.0p-8}));
  EXPECT_THROW(alibi_slopes(0), Error);
}

// ---- the flash kernel skips key tiles outside the window ------------------

// NaN in every K and V row outside the key tiles the query tile [256, 320)
// may touch: with window w and causal, its keys are (256 − w, 319]; without
// causal, (256 − w, 319 + w). Every SIMD target's query tile (8 to 64 rows)
// divides 256 and 64, so those rows are whole tiles on every target. A
// visited tile with a NaN V row would make the output NaN (0·NaN), so a
// finite output, bit-identical to the run on clean inputs, shows the kernel
// visited no tile outside the window on either side.
struct SkipCase {
  bool causal;
  int64_t window;
};

class WindowSkip : public ::testing::TestWithParam<SkipCase> {};

TEST_P(WindowSkip, FlashVisitsNoTileOutsideWindow) {
  const SkipCase c = GetParam();
  constexpr int64_t L = 1024, S = 1024, D = 16, first = 256, last = 319;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(L * D), k(S * D), v(S * D);
  for (float& x : q) x = normal(rng);
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  std::vector<float> k_nan = k, v_nan = v;
  const int64_t lo = first - c.window, hi = c.causal ? last + 1 : last + c.window;  // keys (lo, hi) seen
  for (int64_t j = 0; j < S; ++j)
    if (j <= lo || j >= hi)
      for (int64_t d = 0; d < D; ++d)
        k_nan[j * D + d] = v_nan[j * D + d] = std::numeric_limits<float>::quiet_NaN();
  const auto run = [&](const std::vector<float>& kk, const std::vector<float>& vv) {
    std::vector<float> out(L * D, -777.0f);
    detail::AttentionArgs<float> a;
    a.slices = 1;
    a.q_len = L;
    a.kv_len = S;
    a.head_dim = a.value_dim = D;
    a.q = q.data();
    a.k = kk.data();
    a.v = vv.data();
    a.scale = 0.25f;
    a.modifiers.causal = {c.causal, CausalAlignment::TopLeft, 0, S};
    a.modifiers.window = c.window;
    a.num_threads = 1;
    a.out = out.data();
    detail::attention_forward(a, AttentionKernel::Flash);
    return out;
  };
  for (const std::string& target : simd_targets_available()) {
    simd_target_force(target);
    const std::vector<float> clean = run(k, v), planted = run(k_nan, v_nan);
    for (int64_t i = first; i <= last; ++i)
      for (int64_t d = 0; d < D; ++d) {
        const std::size_t x = static_cast<std::size_t>(i * D + d);
        ASSERT_TRUE(std::isfinite(planted[x]) && planted[x] == clean[x])
            << "target=" << target << " row " << i << " feature " << d << ": got " << planted[x] << ", clean "
            << clean[x] << " (a tile outside the window was visited)";
      }
  }
  simd_target_force("");
}

INSTANTIATE_TEST_SUITE_P(Flash, WindowSkip,
                         ::testing::Values(SkipCase{true, 1}, SkipCase{true, 16}, SkipCase{true, 100},
                                           SkipCase{false, 1}, SkipCase{false, 16}, SkipCase{false, 100}),
                         [](const auto& info) {
                           return std::string(info.param.causal ? "causal" : "nocausal") + "_window" +
                                  std::to_string(info.param.window);
                         });

// ---- validation ------------------------------------------------------------

// The error names the option and shows the value.
void expect_rejected(const AttentionOptions& o, const std::string& needle) {
  Tensor<float> q({2, 3, 4}, 0.5f), k({2, 5, 4}, 0.25f), v({2, 5, 4}, 1.0f);
  try {
    scaled_dot_product_attention(q, k, v, nullptr, o);
    ADD_FAILURE() << "accepted, expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(VariantOptions, RejectedWithTheirValues) {
  AttentionOptions o;
  o.window = 0;
  expect_rejected(o, "window: expected a window of 1 to 2^40 keys, got 0");
  o.window = -4;
  expect_rejected(o, "got -4");
  o = {};
  o.softcap = 0.0;
  expect_rejected(o, "softcap: expected a cap in [2^-126, 2^126] (about 1.2e-38 to 8.5e+37, where the cap and 1/cap are both normal float32 numbers), got 0");
  o.softcap = std::numeric_limits<double>::infinity();
  expect_rejected(o, "softcap");
  // Outside float32's normal range (issue 22: 1e39 and 1e300 gave all-NaN
  // outputs, 1e-300 the uncapped one, with no error).
  for (double cap : {1e39, 1e300, 0x1p126 * 1.0000001, 1e-300, 1e-39, 0x1p-126 * 0.9999999}) {
    o.softcap = cap;
    expect_rejected(o, "softcap: expected a cap in [2^-126, 2^126]");
  }
  o = {};
  o.alibi_slopes = {0.5};
  expect_rejected(o, "alibi_slopes: expected one slope per slice, 2 (the product of the leading dims), got 1");
  o.alibi_slopes = {0.5, std::nan("")};
  expect_rejected(o, "alibi_slopes[1]: expected a finite slope");
}

// The ends of the accepted range give the two limits, in float32 on every
// kernel: a cap of 2^126 is no cap (within float32 rounding of the uncapped
// output), and one of 2^-126 flattens every score to ±2^-126, so each
// output row is the mean of the value rows (relative 1e-6: a few roundings
// of 2^-24 in a 5-term mean).
TEST(VariantOptions, SoftcapAtTheEndsOfItsRangeGivesItsLimits) {
  Tensor<float> q({2, 3, 4}), k({2, 5, 4}), v({2, 5, 4});
  // Scores up to about 30: s / 2^-126 overflows to inf, whose tanh must be 1.
  for (int64_t x = 0; x < q.numel(); ++x) q[x] = static_cast<float>(x % 7) * 3.0f - 9.0f;
  for (int64_t x = 0; x < k.numel(); ++x) {
    k[x] = static_cast<float>(x % 5) * 0.4f - 0.8f;
    v[x] = static_cast<float>(x % 11) - 5.0f;
  }
  for (AttentionKernel kernel : {AttentionKernel::Reference, AttentionKernel::Materialized, AttentionKernel::Flash}) {
    AttentionOptions o;
    o.kernel = kernel;
    const Tensor<float> plain = scaled_dot_product_attention(q, k, v, nullptr, o);
    o.softcap = 0x1p126;
    const Tensor<float> huge = scaled_dot_product_attention(q, k, v, nullptr, o);
    o.softcap = 0x1p-126;
    const Tensor<float> tiny = scaled_dot_product_attention(q, k, v, nullptr, o);
    for (int64_t s = 0; s < 2; ++s)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t d = 0; d < 4; ++d) {
          double mean = 0;
          for (int64_t j = 0; j < 5; ++j) mean += v[(s * 5 + j) * 4 + d] / 5.0;
          const int64_t x = (s * 3 + i) * 4 + d;
          EXPECT_NEAR(huge[x], plain[x], 1e-6 * std::abs(plain[x]) + 1e-6) << to_string(kernel) << " element " << x;
          EXPECT_NEAR(tiny[x], mean, 1e-6 * std::abs(mean) + 1e-6) << to_string(kernel) << " element " << x;
        }
  }
}

// Through the public entry point: a window of 1 with causal attends to the
// query's own key only, so out_i = v_i; ALiBi slopes are taken per slice.
TEST(VariantOptions, PublicEntryPoint) {
  Tensor<float> q({2, 3, 4}), k({2, 3, 4}), v({2, 3, 4});
  for (int64_t x = 0; x < q.numel(); ++x) {
    q[x] = static_cast<float>(x % 7) * 0.1f;
    k[x] = static_cast<float>(x % 5) * 0.2f;
    v[x] = static_cast<float>(x);
  }
  AttentionOptions o;
  o.is_causal = true;
  o.window = 1;
  o.alibi_slopes = {0.5, 0.25};
  o.softcap = 3.0;
  for (AttentionKernel kernel : {AttentionKernel::Reference, AttentionKernel::Materialized, AttentionKernel::Flash}) {
    o.kernel = kernel;
    const Tensor<float> out = scaled_dot_product_attention(q, k, v, nullptr, o);
    for (int64_t x = 0; x < out.numel(); ++x) EXPECT_EQ(out[x], v[x]) << to_string(kernel) << " element " << x;
  }
}

}  // namespace
}  // namespace multihead
