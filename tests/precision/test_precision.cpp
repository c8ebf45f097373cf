// tests/precision/test_precision.cpp: the bf16 and f16 forwards
// (NarrowMultiheadAttention, the 16-bit scaled_dot_product_attention)
// against the independent float64 oracle of tests/oracle/mha_oracle.hpp, on
// 240 configurations drawn from the tables below, each error checked
// against a bound derived from the unit roundoff and the reduction lengths
// (error_bound below; docs/precision.md). Both sides see the same numbers:
// inputs, parameters and float masks are drawn in float64 and rounded to the
// 16-bit type first (tests/precision/precision_cases.hpp: the table, the
// bound). Public headers only (tests/CMakeLists.txt).
//
// PrecisionTorch.* compare with PyTorch 1.13's own bf16 module on the same
// cases (tests/precision/torch_bf16.py runs them: ctest precision_torch).
#include "precision/precision_cases.hpp"

#include "multihead/runtime.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <tuple>

namespace multihead {
namespace {

using namespace precision;
using oracle::MaskKind;

// ---- the tests --------------------------------------------------------------

class PrecisionOracle : public ::testing::TestWithParam<int> {};

template <class E>
void check_case(int i) {
  const Case c = case_at(i);
  const Problem p = make_problem<E>(c);
  const std::vector<double> want = oracle::multi_head_attention_forward(p.config, p.params, p.call).output.v;
  const std::vector<double> bound = error_bound<E>(p);
  const Verdict v = compare(widened(run_library<E>(p)), want, bound);
  ::testing::Test::RecordProperty("worst", std::to_string(v.worst));
  EXPECT_TRUE(v.ok) << c.name() << " " << to_string(compute_dtype_of<E>()) << ": " << v.message;
}

TEST_P(PrecisionOracle, BF16) { check_case<bfloat16>(GetParam()); }
TEST_P(PrecisionOracle, F16) { check_case<float16>(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Cases, PrecisionOracle, ::testing::Range(0, kCaseCount),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "case" + std::to_string(info.param) + "_" + case_at(info.param).name();
                         });

// The score modifiers in 16 bits: the same 240 cases, each with a window,
// a soft-cap, ALiBi and bottom-right placement drawn per case (seeded by
// the case index), against forward_trace's float64 values (the trace is the
// forward written out in the test: projections, the masks, window, ALiBi
// with the paper's slopes, soft-cap, softmax, PV, out-projection) within
// its derived bound (precision_cases.hpp, "the bound": the window only
// hides keys; ALiBi's bias is one more float32 addition to the score,
// γ_{D+3}; the cap is 1-Lipschitz plus its float32 evaluation, 8·u32·|x|).
// The oracle has none of these, so the trace's value is checked against
// the oracle on the same case with every modifier off
// (PrecisionModifiers.TraceIsTheOracleWithoutModifiers), and the modifiers
// move the output by far more than the bound (no case passes by ignoring
// them: PrecisionModifiers.ModifiersMatter).
class PrecisionModifiers : public ::testing::TestWithParam<int> {};

template <class E>
void check_modified_case(int i) {
  const Case c = case_at(i);
  const Problem p = modified_problem(i, make_problem<E>(c));
  const ForwardTrace t = forward_trace<E>(p);
  const Verdict v = compare(widened(run_library<E>(p)), t.output_value, t.output_bound);
  ::testing::Test::RecordProperty("worst", std::to_string(v.worst));
  EXPECT_TRUE(v.ok) << c.name() << modifiers_name(p) << " " << to_string(compute_dtype_of<E>()) << ": " << v.message;
}

TEST_P(PrecisionModifiers, BF16) { check_modified_case<bfloat16>(GetParam()); }
TEST_P(PrecisionModifiers, F16) { check_modified_case<float16>(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Cases, PrecisionModifiers, ::testing::Range(0, kCaseCount),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "case" + std::to_string(info.param) + "_" + case_at(info.param).name() +
                                  modifiers_name(modified_problem(info.param, make_problem<bfloat16>(case_at(info.param))));
                         });

TEST(PrecisionModifiersChecks, TraceIsTheOracleWithoutModifiers) {
  for (int i = 0; i < kCaseCount; i += 7) {
    const Problem p = make_problem<bfloat16>(case_at(i));
    const std::vector<double> want = oracle::multi_head_attention_forward(p.config, p.params, p.call).output.v;
    const std::vector<double> got = forward_trace<bfloat16>(p).output_value;
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t e = 0; e < want.size(); ++e)
      ASSERT_NEAR(got[e], want[e], 1e-12 * (1 + std::abs(want[e]))) << case_at(i).name() << " element " << e;
  }
}

TEST(PrecisionModifiersChecks, ModifiersMatter) {
  int moved = 0, cases = 0;
  for (int i = 0; i < kCaseCount; i += 5) {
    const Problem base = make_problem<bfloat16>(case_at(i));
    const Problem p = modified_problem(i, base);
    const ForwardTrace with = forward_trace<bfloat16>(p), without = forward_trace<bfloat16>(base);
    double far = 0, bound = 0;
    for (std::size_t e = 0; e < with.output_value.size(); ++e) {
      far = std::max(far, std::abs(with.output_value[e] - without.output_value[e]));
      bound = std::max(bound, with.output_bound[e]);
    }
    ++cases;
    moved += far > 2 * bound;
  }
  // A window wider than every row's reach, or a cap far above the scores,
  // changes nothing; most draws must move the output.
  EXPECT_GE(moved, cases * 3 / 4) << moved << " of " << cases << " cases moved by more than twice the bound";
}

// The checker fails on an output one bound away from the oracle's.
TEST(PrecisionChecker, FailsWhenOneElementMovesByTheBound) {
  const Problem p = make_problem<bfloat16>(case_at(3));
  const std::vector<double> want = oracle::multi_head_attention_forward(p.config, p.params, p.call).output.v;
  const std::vector<double> bound = error_bound<bfloat16>(p);
  std::vector<double> got = widened(run_library<bfloat16>(p));
  ASSERT_TRUE(compare(got, want, bound).ok);
  got[got.size() / 2] = want[got.size() / 2] + 1.01 * bound[got.size() / 2];
  EXPECT_FALSE(compare(got, want, bound).ok);
}

// The bound is not vacuous: its widest element stays below a tenth of the
// output's size, on every tenth case.
TEST(PrecisionChecker, BoundBelowOutputScale) {
  for (int i = 0; i < kCaseCount; i += 10) {
    const Problem p = make_problem<bfloat16>(case_at(i));
    const std::vector<double> want = oracle::multi_head_attention_forward(p.config, p.params, p.call).output.v;
    const std::vector<double> bound = error_bound<bfloat16>(p);
    double scale = 0, widest = 0;
    for (std::size_t k = 0; k < want.size(); ++k) {
      scale = std::max(scale, std::abs(want[k]));
      widest = std::max(widest, bound[k]);
    }
    EXPECT_LT(widest, 0.1 * scale) << case_at(i).name();
  }
}

// Dispatch: each SIMD target this CPU runs (the portable EMU128/SCALAR one,
// AVX2 without AVX512_BF16, and the best) gives outputs within twice the
// bound (each side within it of the oracle) of the best target's, on every
// eighth case.
TEST(PrecisionDispatch, EveryTargetWithinBoundOfTheBest) {
  const std::vector<std::string> targets = simd_targets_available();
  ASSERT_FALSE(targets.empty());
  for (int i = 0; i < kCaseCount; i += 8) {
    const Problem p = make_problem<bfloat16>(case_at(i));
    std::vector<double> bound = error_bound<bfloat16>(p);
    for (double& b : bound) b *= 2;  // both within the bound of the oracle
    simd_target_force(targets.front());
    const std::vector<double> best = widened(run_library<bfloat16>(p));
    for (std::size_t t = 1; t < targets.size(); ++t) {
      simd_target_force(targets[t]);
      const Verdict v = compare(widened(run_library<bfloat16>(p)), best, bound);
      EXPECT_TRUE(v.ok) << case_at(i).name() << " target " << targets[t] << " vs " << targets.front() << ": "
                        << v.message;
    }
    simd_target_force("");
  }
}

// The bf16 kernel's two ways (bf16_dot_force), each against the oracle
// within its own bound, on every fourth case: "fma" within the float way's
// bound, "dpbf16" (vdpbf16ps where this CPU has AVX512_BF16, Highway's
// widening elsewhere) within the pair way's. bf16_dot_current() names the
// forced way. The switch is lifted after.
TEST(PrecisionBf16Dot, BothWaysWithinTheirBoundOfTheOracle) {
  for (const char* way : {"fma", "dpbf16"}) {
    narrow_attention_force("flash");  // the flash kernel's bf16 ways
    bf16_dot_force(way);
    EXPECT_EQ(bf16_dot_current().rfind(way, 0), 0u) << bf16_dot_current();
    for (int i = 0; i < kCaseCount; i += 4) {
      const Problem p = make_problem<bfloat16>(case_at(i));
      const std::vector<double> want = oracle::multi_head_attention_forward(p.config, p.params, p.call).output.v;
      const std::vector<double> bound = error_bound<bfloat16>(p, way[0] == 'd' ? Way::Pair : Way::Fma);
      const Verdict v = compare(widened(run_library<bfloat16>(p)), want, bound);
      EXPECT_TRUE(v.ok) << case_at(i).name() << " bf16 dot " << way << " (" << bf16_dot_current() << "): " << v.message;
    }
  }
  bf16_dot_force("");
  narrow_attention_force("");
}

// The pair way on every SIMD target (vdpbf16ps on the best one where this
// CPU has AVX512_BF16; Highway's widening of the same pairs on AVX2 and
// the portable target) against the best target's, within twice the pair
// way's bound, on every eighth case; and the two ways differ (the pair way
// is not the float way under another name) somewhere.
TEST(PrecisionBf16Dot, PairWayOnEveryTargetWithinBoundOfTheBest) {
  const std::vector<std::string> targets = simd_targets_available();
  ASSERT_FALSE(targets.empty());
  bool ways_differ = false;
  for (int i = 0; i < kCaseCount; i += 8) {
    const Problem p = make_problem<bfloat16>(case_at(i));
    std::vector<double> bound = error_bound<bfloat16>(p, Way::Pair);
    for (double& b : bound) b *= 2;
    simd_target_force(targets.front());
    narrow_attention_force("flash");  // the flash kernel's bf16 ways
    bf16_dot_force("fma");
    const std::vector<double> fma = widened(run_library<bfloat16>(p));
    narrow_attention_force("flash");  // the flash kernel's bf16 ways
    bf16_dot_force("dpbf16");
    const std::vector<double> best = widened(run_library<bfloat16>(p));
    ways_differ = ways_differ || fma != best;
    for (std::size_t t = 1; t < targets.size(); ++t) {
      simd_target_force(targets[t]);
      const Verdict v = compare(widened(run_library<bfloat16>(p)), best, bound);
      EXPECT_TRUE(v.ok) << case_at(i).name() << " dpbf16 on " << targets[t] << " vs " << targets.front() << ": "
                        << v.message;
    }
    simd_target_force("");
  }
  bf16_dot_force("");
  narrow_attention_force("");
  EXPECT_TRUE(ways_differ) << "fma and dpbf16 gave identical outputs on every case";
}

TEST(PrecisionBf16Dot, UnknownWayIsRefused) {
  try {
    bf16_dot_force("dot");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "bf16_dot_force: expected one of auto, fma, dpbf16, measure; got 'dot'");
  }
}

// Auto's rule against the kernel's own CPUID reading, from /proc/cpuinfo:
// dpbf16 exactly where the vendor is AMD, the CPU has avx512_bf16 and the
// target is an AVX-512 one; and the same answer every time (the rule holds
// no timing). "measure" says that it measured.
TEST(PrecisionBf16Dot, AutoIsTheCpuRuleAndMeasureIsOptIn) {
  const char* env = std::getenv("MULTIHEAD_BF16_DOT");
  if (env != nullptr && std::string(env) != "auto" && std::string(env) != "")
    GTEST_SKIP() << "MULTIHEAD_BF16_DOT=" << env << " overrides auto";
  std::ifstream in("/proc/cpuinfo");
  if (!in) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string line, vendor;
  bool has_bf16 = false;
  while (std::getline(in, line)) {
    if (vendor.empty() && line.rfind("vendor_id", 0) == 0) vendor = line.substr(line.find(':') + 2);
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      for (std::string w; words >> w;) has_bf16 = has_bf16 || w == "avx512_bf16";
      break;
    }
  }
  const std::string target = simd_target_current();
  const bool native = has_bf16 && (target == "AVX3" || target == "AVX3_DL");
  const bool want = native && vendor == "AuthenticAMD";
  bf16_dot_force("");
  narrow_attention_force("");
  const std::string first = bf16_dot_current();
  EXPECT_EQ(first.rfind(want ? "dpbf16 (auto" : "fma (auto", 0), 0u)
      << first << " (vendor " << vendor << ", avx512_bf16 " << has_bf16 << ", target " << target << ")";
  for (int i = 0; i < 20; ++i) EXPECT_EQ(bf16_dot_current().substr(0, 6), first.substr(0, 6));
  bf16_dot_force("measure");
  const std::string measured = bf16_dot_current();
  EXPECT_TRUE(measured.rfind("dpbf16 (measure", 0) == 0 || measured.rfind("fma (measure", 0) == 0) << measured;
  if (native) {
    EXPECT_NE(measured.find("measured at"), std::string::npos) << measured;
  }
  bf16_dot_force("");
  narrow_attention_force("");
}

// The 16-bit scaled_dot_product_attention against a float64 softmax, with
// the bound of the attention step alone (e_o above with exact projections:
// Q, K, V are inputs).
template <class E>
void check_sdpa(int64_t N, int64_t L, int64_t S, int64_t D, bool causal) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto fill = [&](Shape shape) {
    Tensor<E> t(shape);
    for (int64_t i = 0; i < t.numel(); ++i) t[i] = narrow_from_float<E>(static_cast<float>(normal(rng)));
    return t;
  };
  const Tensor<E> q = fill({N, L, D}), k = fill({N, S, D}), v = fill({N, S, D});
  AttentionOptions o;
  o.is_causal = causal;
  const Tensor<E> out = scaled_dot_product_attention(q, k, v, nullptr, o);
  const double u = unit_roundoff(compute_dtype_of<E>()), scale = 1.0 / std::sqrt(static_cast<double>(D));
  double Aq = 0, Ak = 0, Av = 0;
  for (int64_t i = 0; i < q.numel(); ++i) Aq = std::max(Aq, std::abs(double{to_float(q[i])}));
  for (int64_t i = 0; i < k.numel(); ++i) Ak = std::max(Ak, std::abs(double{to_float(k[i])}));
  for (int64_t i = 0; i < v.numel(); ++i) Av = std::max(Av, std::abs(double{to_float(v[i])}));
  const double es = gamma32(static_cast<double>(D + 2)) * scale * static_cast<double>(D) * Aq * Ak;
  // The pair way and the matmul way round P to bf16 before PV: u·Σ p|v|
  // <= u·Av more (precision_cases.hpp, SliceTrace::pair_way).
  const double pair = current_way_of<E>() == Way::Pair ? u * Av + std::ldexp(Av * static_cast<double>(S), -126) : 0.0;
  const double bound = 1.01 * (Av * (std::expm1(2 * es) + gamma32(static_cast<double>(2 * S + 8))) + u * Av + pair);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < L; ++i) {
      const int64_t keys = causal ? std::min(S, i + 1) : S;
      std::vector<double> s(static_cast<std::size_t>(keys));
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j < keys; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += double{to_float(q[(n * L + i) * D + d])} * to_float(k[(n * S + j) * D + d]);
        s[static_cast<std::size_t>(j)] = dot * scale;
        m = std::max(m, dot * scale);
      }
      for (double& x : s) sum += (x = std::exp(x - m));
      for (int64_t d = 0; d < D; ++d) {
        double o_ref = 0;
        for (int64_t j = 0; j < keys; ++j) o_ref += s[static_cast<std::size_t>(j)] / sum * to_float(v[(n * S + j) * D + d]);
        const double got = to_float(out[(n * L + i) * D + d]);
        ASSERT_LE(std::abs(got - o_ref), bound) << "N" << N << "_L" << L << "_S" << S << "_D" << D
                                                << (causal ? "_causal" : "") << " n=" << n << " i=" << i << " d=" << d
                                                << ": library " << got << ", float64 " << o_ref;
      }
    }
}

// The 16-bit scaled_dot_product_attention over a table: 240 cases, each
// drawing N, L, S, D around the kernel's tiles, a mask (none, bool or
// additive, shared (L, S) or per slice (N, L, S)), causal with either
// alignment, a window, a soft-cap, ALiBi (a slope per slice), an explicit
// scale, seeded by the case index. Reference and bound: precision_cases.hpp's
// SliceTrace per slice on the exact 16-bit inputs (no projection error), the
// mask and the position rules written out here (docs/semantics.md), the
// output rounded once to E (the trace's u·|o|), times 1.05 for the second
// order, as the module's bound.
struct SdpaCase {
  int64_t N, L, S, D;
  int mask;  // 0 none, 1 bool (L, S), 2 additive (L, S), 3 bool (N, L, S), 4 additive (N, L, S)
  bool causal, bottom_right, alibi;
  int64_t window;
  double softcap, scale;  // 0: unset
  std::string name() const {
    char b[160];
    std::snprintf(b, sizeof b, "N%lld_L%lld_S%lld_D%lld_mask%d%s%s_w%lld_cap%d%s_scale%d",
                  static_cast<long long>(N), static_cast<long long>(L), static_cast<long long>(S),
                  static_cast<long long>(D), mask, causal ? "_causal" : "", bottom_right ? "_bottomright" : "",
                  static_cast<long long>(window), static_cast<int>(softcap * 10), alibi ? "_alibi" : "",
                  static_cast<int>(scale * 100));
    return b;
  }
};

SdpaCase sdpa_case_at(int i) {
  std::mt19937 rng(static_cast<unsigned>(11000 + i));
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  static const int64_t Ls[] = {1, 2, 5, 17, 63, 65, 70}, Ss[] = {1, 3, 7, 33, 125, 126, 130, 300},
                       Ds[] = {1, 3, 8, 16, 32, 64, 100};
  SdpaCase c;
  c.N = 1 + pick(3);
  c.L = Ls[pick(7)];
  c.S = Ss[pick(8)];
  c.D = Ds[pick(7)];
  c.mask = pick(5);
  c.causal = pick(2) == 0;
  c.window = pick(3) == 0 ? 1 + pick(static_cast<int>(c.S)) : 0;
  c.alibi = pick(3) == 0;
  c.bottom_right = (c.causal || c.window > 0 || c.alibi) && pick(2) == 0;
  const int cap = pick(3);
  c.softcap = cap == 0 ? 0.0 : cap == 1 ? 1.5 : 4.0;
  c.scale = pick(4) == 0 ? 0.25 : 0.0;
  return c;
}

// Case i's rules at lengths across the matmul way's blocks (256 query rows)
// and chunks (512 keys): L and S from these, the window redrawn within S,
// D at most 32 (the float64 trace is L·S·D per slice).
SdpaCase long_sdpa_case(int i) {
  SdpaCase c = sdpa_case_at(i);
  static const int64_t Ls[] = {70, 257, 600}, Ss[] = {513, 1100, 600};
  c.L = Ls[i % 3];
  c.S = Ss[(i / 3) % 3];
  c.D = std::min<int64_t>(c.D, 32);
  if (c.window > 0) c.window = 1 + (c.window * 37) % c.S;
  return c;
}

template <class E>
void check_sdpa_case(int i, bool long_lengths = false) {
  const SdpaCase c = long_lengths ? long_sdpa_case(i) : sdpa_case_at(i);
  std::mt19937_64 rng(static_cast<uint64_t>(20261205 + i));
  std::normal_distribution<double> normal(0.0, 1.0);
  std::bernoulli_distribution hide(0.3);
  auto fill = [&](Shape shape) {
    Tensor<E> t(shape);
    for (int64_t e = 0; e < t.numel(); ++e) t[e] = narrow_from_float<E>(static_cast<float>(normal(rng)));
    return t;
  };
  const int64_t N = c.N, L = c.L, S = c.S, D = c.D;
  const Tensor<E> q = fill({N, L, D}), k = fill({N, S, D}), v = fill({N, S, D});
  const bool per_slice = c.mask >= 3, boolean = c.mask == 1 || c.mask == 3;
  const int64_t mask_slices = per_slice ? N : 1;
  std::vector<double> additive(static_cast<std::size_t>(mask_slices * L * S), 0.0);
  std::unique_ptr<Mask<float>> mask;
  if (c.mask != 0) {
    const Shape shape = per_slice ? Shape{N, L, S} : Shape{L, S};
    if (boolean) {
      Tensor<uint8_t> m(shape);
      for (int64_t e = 0; e < m.numel(); ++e) {
        m[e] = hide(rng) ? 1 : 0;
        additive[static_cast<std::size_t>(e)] = m[e] ? -INFINITY : 0.0;
      }
      mask = std::make_unique<Mask<float>>(Mask<float>::boolean(std::move(m)));
    } else {
      Tensor<float> m(shape);
      for (int64_t e = 0; e < m.numel(); ++e) {
        m[e] = to_float(narrow_from_float<E>(static_cast<float>(normal(rng))));
        additive[static_cast<std::size_t>(e)] = m[e];
      }
      mask = std::make_unique<Mask<float>>(Mask<float>::additive(std::move(m)));
    }
  }
  std::vector<double> slopes(static_cast<std::size_t>(N));
  for (int64_t n = 0; n < N; ++n) slopes[static_cast<std::size_t>(n)] = 0.125 * static_cast<double>(1 + n);
  const AttentionOptions o =
      rule_options(c.causal, c.bottom_right, c.window, c.softcap, c.scale, c.alibi ? slopes : std::vector<double>{});
  const Tensor<E> out = scaled_dot_product_attention(q, k, v, mask.get(), o);
  ASSERT_EQ(out.shape(), (Shape{N, L, D})) << c.name();
  const double u = unit_roundoff(compute_dtype_of<E>());
  const int64_t shift = c.bottom_right ? S - L : 0;
  double worst = 0;
  for (int64_t n = 0; n < N; ++n) {
    SliceTrace t;
    t.L = L;
    t.St = S;
    t.D = D;
    t.scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(D));
    t.softcap = c.softcap;
    t.extra_adds = c.alibi ? 1 : 0;
    t.pair_way = current_way_of<E>() == Way::Pair;
    t.q.resize(static_cast<std::size_t>(L * D));
    t.k.resize(static_cast<std::size_t>(S * D));
    t.v.resize(t.k.size());
    for (int64_t e = 0; e < L * D; ++e) t.q[static_cast<std::size_t>(e)] = to_float(q[n * L * D + e]);
    for (int64_t e = 0; e < S * D; ++e) {
      t.k[static_cast<std::size_t>(e)] = to_float(k[n * S * D + e]);
      t.v[static_cast<std::size_t>(e)] = to_float(v[n * S * D + e]);
    }
    t.eq.assign(t.q.size(), 0.0);
    t.ek.assign(t.k.size(), 0.0);
    t.ev.assign(t.v.size(), 0.0);
    t.keep.assign(static_cast<std::size_t>(L * S), 1.0);
    t.mask.assign(static_cast<std::size_t>(L * S), 0.0);
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < S; ++j) {
        const int64_t pos = i + shift;
        double m = c.mask != 0 ? additive[static_cast<std::size_t>(((per_slice ? n : 0) * L + i) * S + j)] : 0.0;
        if (c.causal && j > pos) m = -INFINITY;
        if (c.window > 0 && !(j > pos - c.window && (c.causal || j < pos + c.window))) m = -INFINITY;
        if (c.alibi) m += -slopes[static_cast<std::size_t>(n)] * static_cast<double>(std::abs(pos - j));
        t.mask[static_cast<std::size_t>(i * S + j)] = m;
      }
    trace_slice_forward(t, u);
    for (int64_t e = 0; e < L * D; ++e) {
      const double got = to_float(out[n * L * D + e]), want = t.o[static_cast<std::size_t>(e)];
      const double bound = 1.05 * t.eo[static_cast<std::size_t>(e)], err = std::abs(got - want);
      if (bound > 0) worst = std::max(worst, err / bound);
      ASSERT_LE(err, bound) << c.name() << " " << to_string(compute_dtype_of<E>()) << " slice " << n << " row "
                            << e / D << " column " << e % D << ": library " << got << ", float64 " << want;
    }
  }
  ::testing::Test::RecordProperty("worst", std::to_string(worst));
}

class PrecisionSdpaTable : public ::testing::TestWithParam<int> {};
TEST_P(PrecisionSdpaTable, BF16) { check_sdpa_case<bfloat16>(GetParam()); }
TEST_P(PrecisionSdpaTable, F16) { check_sdpa_case<float16>(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Cases, PrecisionSdpaTable, ::testing::Range(0, kCaseCount),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "case" + std::to_string(info.param) + "_" + sdpa_case_at(info.param).name();
                         });

TEST(PrecisionSdpa, BF16_N3_L70_S130_D16) { check_sdpa<bfloat16>(3, 70, 130, 16, false); }
TEST(PrecisionSdpa, BF16_N2_L65_S65_D7_causal) { check_sdpa<bfloat16>(2, 65, 65, 7, true); }
TEST(PrecisionSdpa, F16_N3_L70_S130_D16) { check_sdpa<float16>(3, 70, 130, 16, false); }
TEST(PrecisionSdpa, F16_N2_L1_S300_D64_causal) { check_sdpa<float16>(2, 1, 300, 64, true); }

// ---- bf16 attention on a bf16 matmul (src/kernels/narrow_matmul.hpp) ---------

// The matmul way forced (narrow_attention_force("matmul"): on every CPU;
// AMX where oneDNN's bf16 matmul runs on it) against the oracle within the
// pair way's bound (its weights are rounded to bf16 before PV, as the pair
// way's are: precision_cases.hpp): the module on every second case and its
// modified twin (window, soft-cap, ALiBi, bottom-right), and every second
// scaled_dot_product_attention case (masks, causal, windows, ALiBi,
// soft-caps, scales). The table's L and S are small (one block, one chunk):
// PrecisionNarrowAttention.BlocksAndChunks takes more. And it is not the
// flash kernel under another name: the outputs differ from its somewhere.
TEST(PrecisionNarrowAttention, MatmulWayWithinThePairBoundOfTheOracle) {
  bool differ = false;
  for (int i = 0; i < kCaseCount; i += 2) {
    const Problem p = make_problem<bfloat16>(case_at(i));
    narrow_attention_force("flash");
    const std::vector<double> flash = widened(run_library<bfloat16>(p));
    narrow_attention_force("matmul");
    ASSERT_EQ(narrow_attention_current().rfind("matmul (forced", 0), 0u) << narrow_attention_current();
    const std::vector<double> want = oracle::multi_head_attention_forward(p.config, p.params, p.call).output.v;
    const std::vector<double> got = widened(run_library<bfloat16>(p));
    const Verdict v = compare(got, want, error_bound<bfloat16>(p, Way::Pair));
    EXPECT_TRUE(v.ok) << case_at(i).name() << " bf16 matmul way: " << v.message;
    differ = differ || got != flash;
    check_modified_case<bfloat16>(i);
    check_sdpa_case<bfloat16>(i);
  }
  narrow_attention_force("");
  EXPECT_TRUE(differ) << "the matmul way gave the flash kernel's outputs on every case: did it run?";
}

// Lengths across the way's blocks (256 query rows) and chunks (512 keys):
// scaled_dot_product_attention at L and S on either side of them, with and
// without causal masking (whose blocks skip the chunks past their last
// visible key), against the float64 trace within the pair way's bound; and
// the same bits on 1 and 2 threads.
TEST(PrecisionNarrowAttention, BlocksAndChunks) {
  const ForcedNarrowAttention matmul("matmul");
  // The table's rules (masks, causal in both alignments, windows, ALiBi,
  // soft-caps, scales) at lengths across blocks and chunks.
  for (int i = 0; i < 24; ++i) check_sdpa_case<bfloat16>(i, /*long_lengths=*/true);
  for (const auto& [L, S, causal] : {std::tuple<int64_t, int64_t, bool>{257, 513, false}, {300, 1100, true},
                                     {511, 512, true}, {64, 1025, false}})
    check_sdpa<bfloat16>(2, L, S, 16, causal);
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](Shape shape) {
    Tensor<bfloat16> t(shape);
    for (int64_t i = 0; i < t.numel(); ++i) t[i] = to_bfloat16(normal(rng));
    return t;
  };
  // A window that hides every key from a whole block (queries far past
  // the keys): each row fully masked, zeros, as the flash kernel gives.
  {
    const Tensor<bfloat16> q = fill({2, 64, 16}), k = fill({2, 512, 16}), v = fill({2, 512, 16});
    AttentionOptions o;
    o.is_causal = true;
    o.causal_query_offset = 600;
    o.window = 4;
    const Tensor<bfloat16> out = scaled_dot_product_attention(q, k, v, nullptr, o);
    for (int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(to_float(out[i]), 0.0f) << "element " << i;
  }
  // The same bits on 1 and 2 threads.
  const Tensor<bfloat16> q = fill({3, 300, 32}), k = fill({3, 700, 32}), v = fill({3, 700, 32});
  AttentionOptions o;
  o.is_causal = true;
  o.num_threads = 1;
  const Tensor<bfloat16> one = scaled_dot_product_attention(q, k, v, nullptr, o);
  o.num_threads = 2;
  const Tensor<bfloat16> two = scaled_dot_product_attention(q, k, v, nullptr, o);
  for (int64_t i = 0; i < one.numel(); ++i) ASSERT_EQ(one[i].bits, two[i].bits) << "element " << i;
}

// The switch names its way, auto follows the CPU (matmul where it has
// AMX's bf16 tiles: /proc/cpuinfo's amx_bf16, read here, not through
// oneDNN), and an unknown way is refused in one line.
TEST(PrecisionNarrowAttention, SwitchNamesItsWayAndRefusesAnUnknownOne) {
  narrow_attention_force("flash");
  EXPECT_EQ(narrow_attention_current(), "flash (forced)");
  narrow_attention_force("matmul");
  EXPECT_EQ(narrow_attention_current().rfind("matmul (forced; ", 0), 0u) << narrow_attention_current();
  narrow_attention_force("");
  try {
    narrow_attention_force("amx");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "narrow_attention_force: expected one of auto, flash, matmul; got 'amx'");
  }
  for (const char* env : {"MULTIHEAD_NARROW_ATTENTION", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"})
    if (std::getenv(env) != nullptr) GTEST_SKIP() << env << " is set: auto's rule is not the CPU's";
  std::ifstream in("/proc/cpuinfo");
  if (!in) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string line;
  bool amx = false;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) amx = amx || line.find(" amx_bf16") != std::string::npos;
  EXPECT_EQ(narrow_attention_current().rfind(amx ? "matmul (auto" : "flash (auto", 0), 0u)
      << narrow_attention_current();
}

// ---- PyTorch 1.13's bf16 module on the same cases ---------------------------
//
// PrecisionTorch.Dump writes each case (configuration, parameters, inputs,
// masks: the bf16 numbers, as JSON) to $MULTIHEAD_PRECISION_TORCH_DIR;
// tests/precision/torch_bf16.py runs nn.MultiheadAttention(...).to(
// torch.bfloat16) on them and writes torch_<case>.f32; PrecisionTorch.Compare
// then checks, per case, rms(ours − oracle) <= 1.5 · rms(torch − oracle)
// (error_of below; errors.tsv has the max errors too). Cases with a float key_padding_mask are left out:
// PyTorch 1.13 treats a float padding mask as a boolean one
// (docs/semantics.md), so its output is another function. Causal runs in
// PyTorch as a boolean (L, S) mask joined to attn_mask (1.13's module has no
// is_causal).


TEST(PrecisionTorch, Dump) {
  ASSERT_NE(torch_dir(), nullptr) << "run by tests/precision/torch_bf16.py";
  for (int i = 0; i < kCaseCount; ++i) {
    const Case c = case_at(i);
    if (torch_case(c)) write_case(std::string(torch_dir()) + "/case_" + std::to_string(i) + ".json", c.name(), make_problem<bfloat16>(c));
  }
}

TEST(PrecisionTorch, Compare) {
  ASSERT_NE(torch_dir(), nullptr) << "run by tests/precision/torch_bf16.py";
  int compared = 0;
  std::ofstream table(std::string(torch_dir()) + "/errors.tsv");
  table << "case\tmax_ours_bf16\tmax_torch_bf16\trms_ours_bf16\trms_torch_bf16\tmax_ours_f16\trms_ours_f16\n";
  for (int i = 0; i < kCaseCount; ++i) {
    const Case c = case_at(i);
    if (!torch_case(c)) continue;
    const Problem p = make_problem<bfloat16>(c);
    const std::vector<double> want = oracle::multi_head_attention_forward(p.config, p.params, p.call).output.v;
    std::ifstream in(std::string(torch_dir()) + "/torch_" + std::to_string(i) + ".f32", std::ios::binary);
    ASSERT_TRUE(in) << "torch_" << i << ".f32 missing";
    std::vector<float> torch_out(want.size());
    in.read(reinterpret_cast<char*>(torch_out.data()), static_cast<std::streamsize>(torch_out.size() * sizeof(float)));
    ASSERT_EQ(in.gcount(), static_cast<std::streamsize>(torch_out.size() * sizeof(float))) << c.name();
    const std::vector<double> ours = widened(run_library<bfloat16>(p));
    std::vector<double> theirs(torch_out.begin(), torch_out.end());
    const ErrorStats ours_err = error_of(ours, want), torch_err = error_of(theirs, want);
    const Problem p16 = make_problem<float16>(c);
    const ErrorStats ours16 = error_of(widened(run_library<float16>(p16)),
                                  oracle::multi_head_attention_forward(p16.config, p16.params, p16.call).output.v);
    table << c.name() << "\t" << ours_err.max << "\t" << torch_err.max << "\t" << ours_err.rms << "\t" << torch_err.rms
          << "\t" << ours16.max << "\t" << ours16.rms << "\n";
    EXPECT_LE(ours_err.rms, 1.5 * torch_err.rms)
        << c.name() << ": rms error ours " << ours_err.rms << ", PyTorch bf16 " << torch_err.rms;
    ++compared;
  }
  EXPECT_GE(compared, 150);
}

// Rounding: to nearest, ties to even, at the edges of each format.
TEST(PrecisionRounding, BF16AndF16TiesOverflowSubnormalsNaN) {
  EXPECT_EQ(to_bfloat16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);   // tie, even stays
  EXPECT_EQ(to_bfloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(to_bfloat16(std::numeric_limits<float>::max()).bits, 0x7f80);  // rounds to inf
  EXPECT_TRUE(std::isnan(to_float(to_bfloat16(NAN))));
  EXPECT_EQ(to_float16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);
  EXPECT_EQ(to_float16(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);
  EXPECT_EQ(to_float16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(to_float16(65520.0f).bits, 0x7c00);            // halfway to 2^16: inf
  EXPECT_EQ(to_float16(std::ldexp(1.0f, -24)).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(to_float16(std::ldexp(1.0f, -25)).bits, 0x0000);  // tie to even: 0
  EXPECT_EQ(to_float16(-0.0f).bits, 0x8000);
  EXPECT_TRUE(std::isnan(to_float(to_float16(NAN))));
  for (uint32_t h = 0; h < 0x7c00; ++h)  // every finite f16 round-trips
    ASSERT_EQ(to_float16(to_float(float16{static_cast<uint16_t>(h)})).bits, h);
}

}  // namespace
}  // namespace multihead
