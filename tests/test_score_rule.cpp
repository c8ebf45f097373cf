// tests/test_score_rule.cpp: every kernel against one independent float64
// computation of the score rules, over two tables:
//  - the whole table mask kind × key padding × causal alignment × query
//    offset × masked-row policy × dropout × shape;
//  - the variants: sliding window × soft-cap × ALiBi (every combination but
//    none) × shape × 7 position settings (causal or not, top-left or
//    bottom-right, query offsets), with mask kind, key padding, masked-row
//    policy, dropout and an extra position-less key (as bias_k) rotating
//    through their values from case to case;
// on every SIMD target this CPU runs (the flash kernel's vector twins of
// src/contract/score_rule.hpp) and at 1 and 2 threads. The same table checks
// the flash forward's weights recomputed from its saved lse
// (FlashWeightsRecompute, below).
//
// The float64 oracle here (expected()) is written from the definitions, not
// from score_rule.hpp: it measures the signed distance from query i to key j
// (from the start for TopLeft, from the end of the positioned keys for
// BottomRight) rather than using causal_shift(), and states causal, window,
// soft-cap and ALiBi on that distance itself. Only dropout's keep/drop hash
// is shared, since it is the definition itself.
//
// Names carry every parameter, e.g.
//   Table/ScoreRule.AllKernelsMatch/L9_S6_mask_slice_pad_causal_bottomright_offm3_nan_drop
//   Variants/ScoreRule.AllKernelsMatch/L70_S300_nomask_pad_nocausal_bottomright_off0_zeros_nodrop_win3_cap2_alibi_extra1
//
// ---- Tolerance (u = the kernel's unit roundoff: 2^-24 float, 2^-53 double)
// As in tests/test_flash.cpp: with A_ij = scale·Σ_d |q_id·k_jd| and
// M_ij = |mask_ij| + |pad_j| + |alibi_ij|, a score carries δ_ij <= u·((D + 3)·A_ij +
// 2·(A_ij + M_ij)); a normalised weight is off by <= 2·max_j δ_ij + 4u plus
// the sum's (S + S/64 + 2)·u, relative; an output feature by that times
// W_ic = Σ_j p_ij·|v_jc|. Hence
//   |out_ic − ref_ic| <= u·W_ic·(2·max_j δ_ij/u + 2·(S + S/64) + 16)
//   |w_ij − ref_ij|   <= u·ref_ij·(the same factor)
// Soft-capping cap·tanh(x/cap) has slope <= 1, so it passes δ on and adds
// its own rounding: the division, Highway's Tanh (<= 4 ulp) and the product,
// under 8·cap·u in all.
// A fully masked row is the policy's fill exactly (0 or NaN), and NaN must
// appear exactly where the oracle has NaN.
// The row log-sum-exp lse_i = m_i + log Σ_j exp(s_ij − m_i) (every kernel
// stores it when AttentionArgs::lse is set; −inf exactly for a fully masked
// row): m_i carries the score's δ, log of the sum its relative error (the
// same factor as a weight's, which also covers the exp's few ulp), and the
// final log and addition u·|lse_i| each, so
//   |lse_i − ref_i| <= u·(factor_i + 2·|ref_i| + 2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "contract/score_rule.hpp"
#include "kernels/kernel.hpp"
#include "multihead/runtime.hpp"

namespace multihead {
namespace {

using detail::AttentionArgs;
constexpr double kInf = std::numeric_limits<double>::infinity();

enum class MaskKind { None, Shared, PerSlice };
enum class Causal { None, TopLeft, BottomRight };

struct RuleCase {
  int64_t L, S;
  MaskKind mask;
  bool pad;
  Causal causal;
  int64_t offset;
  MaskedRowPolicy policy;
  double dropout;
  // The variants. Without causal masking the positions still have an
  // alignment: positions_bottomright puts the last query at the last key.
  bool positions_bottomright = false;
  int64_t window = 0;   // 0 = none
  double softcap = 0;   // 0 = none
  bool alibi = false;
  int64_t extra = 0;    // the last `extra` keys have no position (as bias_k)
  bool bottom_right() const { return causal == Causal::BottomRight || positions_bottomright; }
  std::string name() const {
    static const char* masks[] = {"nomask", "mask_shared", "mask_slice"};
    static const char* causals[] = {"nocausal", "causal_topleft", "causal_bottomright"};
    std::string n = "L" + std::to_string(L) + "_S" + std::to_string(S) + "_" + masks[static_cast<int>(mask)] +
                    (pad ? "_pad_" : "_nopad_") + causals[static_cast<int>(causal)] +
                    (positions_bottomright ? "_bottomright" : "") + "_off" +
                    (offset < 0 ? "m" + std::to_string(-offset) : std::to_string(offset)) +
                    (policy == MaskedRowPolicy::NaN ? "_nan" : "_zeros") + (dropout > 0 ? "_drop" : "_nodrop");
    if (window > 0) n += "_win" + std::to_string(window);
    if (softcap > 0) n += "_cap" + std::to_string(static_cast<int>(softcap));
    if (alibi) n += "_alibi";
    if (extra > 0) n += "_extra" + std::to_string(extra);
    return n;
  }
};

std::vector<RuleCase> all_cases() {
  std::vector<RuleCase> cases;
  // L > S (bottom-right hides every causal key from the first rows), L < S,
  // and a shape of several query and key tiles.
  const int64_t shapes[][2] = {{9, 6}, {6, 9}, {70, 300}};
  for (const auto& shape : shapes)
    for (MaskKind mask : {MaskKind::None, MaskKind::Shared, MaskKind::PerSlice})
      for (bool pad : {false, true})
        for (Causal causal : {Causal::None, Causal::TopLeft, Causal::BottomRight})
          for (int64_t offset : {int64_t{0}, int64_t{-3}, int64_t{2}}) {
            if (causal == Causal::None && offset != 0) continue;  // the offset only moves the diagonal
            for (MaskedRowPolicy policy : {MaskedRowPolicy::Zeros, MaskedRowPolicy::NaN})
              for (double dropout : {0.0, 0.3})
                cases.push_back({shape[0], shape[1], mask, pad, causal, offset, policy, dropout});
          }
  return cases;
}

// The variants: window × soft-cap × ALiBi, all but none, at 7 position
// settings; mask kind, padding, policy, dropout and the extra key rotate
// with the case number (periods 3, 2, 2, 2, 2 on successive digits), so
// each variant meets each of them across the shapes and positions.
std::vector<RuleCase> variant_cases() {
  struct Positions {
    Causal causal;
    bool bottomright;
    int64_t offset;
  };
  const Positions positions[] = {{Causal::None, false, 0},       {Causal::None, true, 0},
                                 {Causal::None, false, -3},      {Causal::TopLeft, false, 0},
                                 {Causal::BottomRight, false, 0}, {Causal::TopLeft, false, 2},
                                 {Causal::BottomRight, false, -3}};
  std::vector<RuleCase> cases;
  const int64_t shapes[][2] = {{9, 6}, {6, 9}, {70, 300}};
  int64_t k = 0;
  for (const auto& shape : shapes)
    for (int64_t window : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{50}})
      for (double softcap : {0.0, 2.0})
        for (bool alibi : {false, true}) {
          if (window == 0 && softcap == 0 && !alibi) continue;  // the first table
          for (const Positions& pos : positions) {
            RuleCase c{shape[0], shape[1], static_cast<MaskKind>(k % 3), (k / 3) % 2 == 1, pos.causal,
                       pos.offset, (k / 6) % 2 == 1 ? MaskedRowPolicy::NaN : MaskedRowPolicy::Zeros,
                       (k / 12) % 2 == 1 ? 0.3 : 0.0};
            c.positions_bottomright = pos.bottomright;
            c.window = window;
            c.softcap = softcap;
            c.alibi = alibi;
            c.extra = (k / 24) % 2;
            cases.push_back(c);
            ++k;
          }
        }
  return cases;
}

constexpr int64_t kB = 2, kH = 2, kN = kB * kH, kD = 8, kDv = 5;
// ALiBi slopes per slice, any positive numbers (the formula for them is
// tested apart, in test_alibi.cpp), small enough that slope·S + the dot
// products stay below 87: no weight falls under float's normal range, where
// the relative bounds above would not hold (the SIMD exp flushes to 0).
constexpr double kSlopes[kN] = {0.2, 0.1, 0.05, 0.02};

// Inputs in float (so that every kernel, float or double, sees the same
// numbers). Masks hold -inf in places, and whole rows of -inf: row 2 of the
// mask (every slice, or slice 1 only when per slice), and key padding hides
// every key of batch entry 1 but its last.
struct Inputs {
  RuleCase c;
  std::vector<float> q, k, v, mask, pad;
};

Inputs make_inputs(const RuleCase& c) {
  std::mt19937_64 rng(1234 + static_cast<uint64_t>(c.L * 1000 + c.S));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::bernoulli_distribution hide(0.2);
  Inputs in{c, {}, {}, {}, {}, {}};
  auto fill = [&](std::vector<float>& x, int64_t n) {
    x.resize(static_cast<std::size_t>(n));
    for (float& e : x) e = normal(rng);
  };
  fill(in.q, kN * c.L * kD);
  fill(in.k, kN * c.S * kD);
  fill(in.v, kN * c.S * kDv);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (c.mask != MaskKind::None) {
    const int64_t slices = c.mask == MaskKind::Shared ? 1 : kN;
    fill(in.mask, slices * c.L * c.S);
    for (float& e : in.mask)
      if (hide(rng)) e = neg_inf;
    const int64_t n = slices - 1;
    for (int64_t j = 0; j < c.S; ++j) in.mask[static_cast<std::size_t>((n * c.L + 2) * c.S + j)] = neg_inf;
  }
  if (c.pad) {
    fill(in.pad, kB * c.S);
    in.pad[1] = neg_inf;
    for (int64_t j = 0; j + 1 < c.S; ++j) in.pad[static_cast<std::size_t>(c.S + j)] = neg_inf;
  }
  return in;
}

// ---- the independent float64 oracle ----------------------------------------

// Positions from the definitions in src/contract/attention_args.hpp and
// multihead/attention.hpp: TopLeft puts query i at position i + offset, key
// j at j; BottomRight aligns the last query with the last positioned key
// (cols − 1, cols = S − extra), so query i is L − 1 − i rows from the end
// and key j is cols − 1 − j. distance = how far key j is behind query i.
int64_t distance(const RuleCase& c, int64_t i, int64_t j) {
  const int64_t cols = c.S - c.extra;
  return c.bottom_right() ? (cols - 1 - j) - (c.L - 1 - i) + c.offset : i + c.offset - j;
}
bool positioned(const RuleCase& c, int64_t j) { return j < c.S - c.extra; }

// Causal: a query sees the keys not ahead of it. Window w: with causal the w
// keys from its own position back (distance 0 … w − 1, Mistral), without
// the keys less than w away on either side. Keys without a position always.
bool sees(const RuleCase& c, int64_t i, int64_t j) {
  if (!positioned(c, j)) return true;
  const int64_t dist = distance(c, i, j);
  if (c.causal != Causal::None && dist < 0) return false;
  if (c.window > 0 && !(std::abs(dist) < c.window)) return false;
  return true;
}

struct Expected {
  std::vector<double> out, weights, out_bound, weights_factor, lse, lse_bound;
};

Expected expected(const Inputs& in, double u) {
  const RuleCase& c = in.c;
  const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
  const detail::DropoutRule dropout{c.dropout, 0x5EED, 0};
  Expected e;
  e.out.assign(static_cast<std::size_t>(kN * c.L * kDv), 0.0);
  e.out_bound.assign(e.out.size(), 0.0);
  e.weights.assign(static_cast<std::size_t>(kN * c.L * c.S), 0.0);
  e.weights_factor.assign(static_cast<std::size_t>(kN * c.L), 0.0);
  e.lse.assign(static_cast<std::size_t>(kN * c.L), -kInf);
  e.lse_bound.assign(e.lse.size(), 0.0);
  std::vector<double> s(static_cast<std::size_t>(c.S)), p(s.size());
  for (int64_t n = 0; n < kN; ++n)
    for (int64_t i = 0; i < c.L; ++i) {
      double max = -kInf, worst_delta = 0;
      for (int64_t j = 0; j < c.S; ++j) {
        double dot = 0, cond = 0;
        for (int64_t d = 0; d < kD; ++d) {
          const double x = in.q[static_cast<std::size_t>((n * c.L + i) * kD + d)] *
                           static_cast<double>(in.k[static_cast<std::size_t>((n * c.S + j) * kD + d)]);
          dot += x;
          cond += std::abs(x);
        }
        double add = 0;
        if (c.alibi && positioned(c, j)) add -= kSlopes[n] * static_cast<double>(std::abs(distance(c, i, j)));
        if (c.mask != MaskKind::None)
          add += in.mask[static_cast<std::size_t>(((c.mask == MaskKind::Shared ? 0 : n) * c.L + i) * c.S + j)];
        if (c.pad) add += in.pad[static_cast<std::size_t>((n / kH) * c.S + j)];
        const double x = dot * scale;
        const double capped = c.softcap > 0 ? c.softcap * std::tanh(x / c.softcap) : x;
        s[j] = sees(c, i, j) ? capped + add : -kInf;
        max = std::max(max, s[j]);
        if (s[j] != -kInf)
          worst_delta = std::max(worst_delta, (kD + 5) * cond * scale + 2 * std::abs(add) + 8 * c.softcap);
      }
      const std::size_t row = static_cast<std::size_t>(n * c.L + i);
      const double factor = 2 * worst_delta + 2 * (c.S + c.S / 64.0) + 16;
      e.weights_factor[row] = factor;
      if (max == -kInf) {  // fully masked row: the policy's fill
        const double fill = c.policy == MaskedRowPolicy::NaN ? std::nan("") : 0.0;
        for (int64_t j = 0; j < c.S; ++j) e.weights[row * c.S + j] = fill;
        for (int64_t d = 0; d < kDv; ++d) e.out[row * kDv + d] = fill;
        continue;
      }
      double sum = 0;
      for (int64_t j = 0; j < c.S; ++j) sum += p[j] = std::exp(s[j] - max);
      e.lse[row] = max + std::log(sum);
      e.lse_bound[row] = u * (factor + 2 * std::abs(e.lse[row]) + 2);
      for (int64_t j = 0; j < c.S; ++j) {
        p[j] /= sum;
        if (c.dropout > 0) p[j] = detail::dropout_keep(dropout, n, i, j) ? p[j] / (1 - c.dropout) : 0.0;
        e.weights[row * c.S + j] = p[j];
      }
      for (int64_t d = 0; d < kDv; ++d) {
        double acc = 0, w = 0;
        for (int64_t j = 0; j < c.S; ++j) {
          const double vj = in.v[static_cast<std::size_t>((n * c.S + j) * kDv + d)];
          acc += p[j] * vj;
          w += p[j] * std::abs(vj);
        }
        e.out[row * kDv + d] = acc;
        e.out_bound[row * kDv + d] = u * w * factor + 1e-300;
      }
    }
  return e;
}

// ---- the checker -----------------------------------------------------------

// "" when every element of got is within its bound of want (NaN exactly
// where want is NaN); else the first failure: index, both values, error,
// bound, and how many failed.
template <class T>
std::string compare(const char* what, const std::vector<T>& got, const std::vector<double>& want,
                    const std::vector<double>& bound) {
  int64_t failures = 0;
  std::string first;
  for (std::size_t x = 0; x < want.size(); ++x) {
    const double g = static_cast<double>(got[x]), w = want[x];
    const double err = std::isinf(w) ? (g == w ? 0.0 : kInf) : std::abs(g - w);
    const bool ok = std::isnan(w) ? std::isnan(g) : (!std::isnan(g) && err <= bound[x]);
    if (ok) continue;
    if (failures++ == 0) {
      std::ostringstream os;
      os.precision(10);
      os << what << "[" << x << "]: got " << g << ", want " << w << ", |error| " << err << " > bound " << bound[x];
      first = os.str();
    }
  }
  if (failures == 0) return "";
  return first + " (" + std::to_string(failures) + " elements fail)";
}

// ---- running a kernel ------------------------------------------------------

template <class T>
struct KernelRun {
  std::vector<T> q, k, v, mask, pad, slopes, out, weights, lse;
};

template <class T>
AttentionArgs<T> args_for(const Inputs& in, KernelRun<T>& r, bool weights, int threads) {
  const RuleCase& c = in.c;
  r.q.assign(in.q.begin(), in.q.end());
  r.k.assign(in.k.begin(), in.k.end());
  r.v.assign(in.v.begin(), in.v.end());
  r.mask.assign(in.mask.begin(), in.mask.end());
  r.pad.assign(in.pad.begin(), in.pad.end());
  r.out.assign(static_cast<std::size_t>(kN * c.L * kDv), T(-777));
  r.weights.assign(weights ? static_cast<std::size_t>(kN * c.L * c.S) : 0, T(-777));
  r.lse.assign(static_cast<std::size_t>(kN * c.L), T(-777));
  AttentionArgs<T> a;
  a.slices = kN;
  a.heads = kH;
  a.q_len = c.L;
  a.kv_len = c.S;
  a.head_dim = kD;
  a.value_dim = kDv;
  a.q = r.q.data();
  a.k = r.k.data();
  a.v = r.v.data();
  a.scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(kD)));
  if (c.mask != MaskKind::None) {
    a.modifiers.attn_mask = r.mask.data();
    a.modifiers.attn_mask_slice_stride = c.mask == MaskKind::Shared ? 0 : c.L * c.S;
  }
  if (c.pad) a.modifiers.key_padding = r.pad.data();
  a.modifiers.causal = {c.causal != Causal::None,
                        c.bottom_right() ? CausalAlignment::BottomRight : CausalAlignment::TopLeft, c.offset,
                        c.S - c.extra};
  a.modifiers.window = c.window;
  a.modifiers.softcap = static_cast<T>(c.softcap);
  if (c.alibi) {
    r.slopes.assign(std::begin(kSlopes), std::end(kSlopes));
    a.modifiers.alibi_slopes = r.slopes.data();
  }
  a.dropout = {c.dropout, 0x5EED, 0};
  a.masked_rows = c.policy;
  a.num_threads = threads;
  a.out = r.out.data();
  a.weights = weights ? r.weights.data() : nullptr;
  a.lse = r.lse.data();
  return a;
}

template <class T>
double unit_roundoff() {
  return std::is_same_v<T, float> ? 0x1.0p-24 : 0x1.0p-53;
}

// Runs `kernel` in T on the case; "" or what failed.
template <class T>
std::string check_kernel(const Inputs& in, const Expected& e, AttentionKernel kernel, int threads) {
  const bool weights = kernel != AttentionKernel::Flash;
  KernelRun<T> r;
  const AttentionArgs<T> a = args_for<T>(in, r, weights, threads);
  detail::attention_forward(a, kernel);
  std::string failure = compare("out", r.out, e.out, e.out_bound);
  if (failure.empty() && weights) {
    std::vector<double> bound(e.weights.size());
    for (std::size_t x = 0; x < bound.size(); ++x)
      bound[x] = unit_roundoff<T>() * std::abs(e.weights[x]) * e.weights_factor[x / static_cast<std::size_t>(in.c.S)] + 1e-300;
    failure = compare("weights", r.weights, e.weights, bound);
  }
  if (failure.empty()) failure = compare("lse", r.lse, e.lse, e.lse_bound);
  return failure;
}

class ScoreRule : public ::testing::TestWithParam<RuleCase> {};

TEST_P(ScoreRule, AllKernelsMatch) {
  const Inputs in = make_inputs(GetParam());
  const Expected e64 = expected(in, unit_roundoff<double>()), e32 = expected(in, unit_roundoff<float>());
  // The plain loops have no threads.
  EXPECT_EQ(check_kernel<double>(in, e64, AttentionKernel::Reference, 1), "") << "reference float64";
  EXPECT_EQ(check_kernel<float>(in, e32, AttentionKernel::Reference, 1), "") << "reference float32";
  for (int threads : {1, 2}) {
    const std::string t = " threads=" + std::to_string(threads);
    EXPECT_EQ(check_kernel<double>(in, e64, AttentionKernel::Materialized, threads), "")
        << "materialized float64" << t;
    for (const std::string& target : simd_targets_available()) {
      simd_target_force(target);
      EXPECT_EQ(check_kernel<float>(in, e32, AttentionKernel::Materialized, threads), "")
          << "materialized float32" << t << " target=" << target;
      EXPECT_EQ(check_kernel<float>(in, e32, AttentionKernel::Flash, threads), "")
          << "flash" << t << " target=" << target;
    }
    simd_target_force("");
  }
}

INSTANTIATE_TEST_SUITE_P(Table, ScoreRule, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param.name(); });
INSTANTIATE_TEST_SUITE_P(Variants, ScoreRule, ::testing::ValuesIn(variant_cases()),
                         [](const auto& info) { return info.param.name(); });

// The checker catches a planted one-element change: in a finite output, in
// a weight, a NaN fill turned into 0, and in a log-sum-exp.
TEST(ScoreRuleChecker, CatchesOneChangedElement) {
  const RuleCase c{9, 6, MaskKind::PerSlice, true, Causal::BottomRight, 0, MaskedRowPolicy::NaN, 0.3};
  const Inputs in = make_inputs(c);
  KernelRun<float> r;
  detail::attention_forward(args_for<float>(in, r, true, 1), AttentionKernel::Materialized);
  const Expected e = expected(in, unit_roundoff<float>());
  ASSERT_EQ(compare("out", r.out, e.out, e.out_bound), "");
  // A finite element, changed by 1e-4 of its magnitude (about 100 times
  // the actual float error, below the bound's worst case it is not).
  std::size_t x = 0;
  while (x < e.out.size() && (std::isnan(e.out[x]) || e.out[x] == 0.0)) ++x;
  ASSERT_LT(x, e.out.size());
  std::vector<float> planted = r.out;
  planted[x] += static_cast<float>(4 * e.out_bound[x]);
  EXPECT_NE(compare("out", planted, e.out, e.out_bound), "");
  // A NaN fill (the first L − S rows see no key: bottom-right) set to 0.
  std::size_t y = 0;
  while (y < e.out.size() && !std::isnan(e.out[y])) ++y;
  ASSERT_LT(y, e.out.size());
  planted = r.out;
  planted[y] = 0.0f;
  EXPECT_NE(compare("out", planted, e.out, e.out_bound), "");
  // A weight of a kept element.
  std::vector<double> bound(e.weights.size(), 1e-6);
  std::size_t z = 0;
  while (z < e.weights.size() && !(e.weights[z] > 0.0)) ++z;
  ASSERT_LT(z, e.weights.size());
  std::vector<float> w = r.weights;
  w[z] *= 1.001f;
  EXPECT_NE(compare("weights", w, e.weights, bound), "");
  // A row's log-sum-exp moved by 4 bounds, and a fully masked row's −inf
  // turned into a finite number.
  ASSERT_EQ(compare("lse", r.lse, e.lse, e.lse_bound), "");
  std::size_t finite = 0, masked = 0;
  while (finite < e.lse.size() && std::isinf(e.lse[finite])) ++finite;
  while (masked < e.lse.size() && !std::isinf(e.lse[masked])) ++masked;
  ASSERT_LT(finite, e.lse.size());
  ASSERT_LT(masked, e.lse.size());
  std::vector<float> lse = r.lse;
  lse[finite] += static_cast<float>(4 * e.lse_bound[finite]);
  EXPECT_NE(compare("lse", lse, e.lse, e.lse_bound), "");
  lse = r.lse;
  lse[masked] = -1e30f;
  EXPECT_NE(compare("lse", lse, e.lse, e.lse_bound), "");
}

// ---- the weights recompute (src/contract/attention_weights_args.hpp) --------
//
// The flash forward runs without weights, saving each row's lse; then
// attention_weights_flash recomputes p'_ij = dropout(exp(s_ij − lse_i))
// tile by tile, on every SIMD target and at 1 and 2 threads, for:
//  - every slice and row: against the float64 oracle, and against the
//    reference kernel's float32 weights to 1e-6 (absolute; the bar);
//  - a selection (slices {3, 1}, rows {L−1, 2, 3, 4, 0}, out of order, a
//    run and singles): bit-for-bit the same elements of the full recompute,
//    since a row's weights are a function of its own (i, j) alone, whatever
//    tile or thread computes them (flash_weights.cpp says why).
// Tolerance against the oracle: the recompute's score carries δ_ij (as the
// forward's, <= its factor), the lse its own lse_bound, the subtraction
// u·|s − lse| <= 88u for a weight in float's normal range, the exp and the
// dropout scale a few ulp, so relative to the weight
//   |w_ij − ref_ij| <= u·ref_ij·(factor_i + lse_bound_i/u + 100).
std::vector<float> recompute(const AttentionArgs<float>& forward, const std::vector<float>& lse,
                             const std::vector<int64_t>* slices, const std::vector<int64_t>* rows) {
  detail::AttentionWeightsArgs w;
  w.forward = forward;
  w.lse = lse.data();
  if (slices) {
    w.slices = slices->data();
    w.slice_count = static_cast<int64_t>(slices->size());
  }
  if (rows) {
    w.rows = rows->data();
    w.row_count = static_cast<int64_t>(rows->size());
  }
  const int64_t n = slices ? w.slice_count : forward.slices, r = rows ? w.row_count : forward.q_len;
  std::vector<float> out(static_cast<std::size_t>(n * r * forward.kv_len), -777.0f);
  w.weights = out.data();
  detail::attention_weights_flash(w);
  return out;
}

// "" when the flash recompute on the case passes all three checks.
// worst: the largest |recomputed − reference kernel| seen so far (finite weights).
std::string check_recompute(const Inputs& in, const Expected& e, const std::vector<float>& reference_weights,
                            int threads, double& worst) {
  const RuleCase& c = in.c;
  KernelRun<float> r;
  const AttentionArgs<float> a = args_for<float>(in, r, false, threads);
  detail::attention_forward(a, AttentionKernel::Flash);
  const std::vector<float> all = recompute(a, r.lse, nullptr, nullptr);
  std::vector<double> bound(e.weights.size()), reference(e.weights.size()), tight(e.weights.size(), 1e-6);
  for (std::size_t x = 0; x < bound.size(); ++x) {
    const std::size_t row = x / static_cast<std::size_t>(c.S);
    const double u = unit_roundoff<float>();
    bound[x] = u * std::abs(e.weights[x]) * (e.weights_factor[row] + e.lse_bound[row] / u + 100) + 1e-300;
    reference[x] = reference_weights[x];
    const double diff = std::abs(static_cast<double>(all[x]) - reference[x]);
    if (std::isfinite(diff)) worst = std::max(worst, diff);
  }
  std::string failure = compare("recomputed weights vs oracle", all, e.weights, bound);
  if (failure.empty()) failure = compare("recomputed weights vs reference kernel", all, reference, tight);
  if (!failure.empty()) return failure;
  const std::vector<int64_t> slices = {3, 1}, rows = {c.L - 1, 2, 3, 4, 0};
  const std::vector<float> some = recompute(a, r.lse, &slices, &rows);
  for (std::size_t s = 0; s < slices.size(); ++s)
    for (std::size_t i = 0; i < rows.size(); ++i)
      for (int64_t j = 0; j < c.S; ++j) {
        const float got = some[(s * rows.size() + i) * static_cast<std::size_t>(c.S) + static_cast<std::size_t>(j)];
        const float want = all[static_cast<std::size_t>((slices[s] * c.L + rows[i]) * c.S + j)];
        if (!(got == want || (std::isnan(got) && std::isnan(want))))
          return "selected weight (slice " + std::to_string(slices[s]) + ", row " + std::to_string(rows[i]) +
                 ", key " + std::to_string(j) + "): got " + std::to_string(got) + ", the full recompute has " +
                 std::to_string(want);
      }
  return "";
}

TEST_P(ScoreRule, FlashWeightsRecompute) {
  const Inputs in = make_inputs(GetParam());
  const Expected e32 = expected(in, unit_roundoff<float>());
  KernelRun<float> ref;
  detail::attention_forward(args_for<float>(in, ref, true, 1), AttentionKernel::Reference);
  double worst = 0;
  for (int threads : {1, 2}) {
    for (const std::string& target : simd_targets_available()) {
      simd_target_force(target);
      EXPECT_EQ(check_recompute(in, e32, ref.weights, threads, worst), "")
          << "threads=" << threads << " target=" << target;
    }
    simd_target_force("");
  }
  std::printf("  worst |recomputed - reference kernel weight|: %.3g (bound 1e-6)\n", worst);
}

// The recompute reads the saved lse (it does not renormalise on its own):
// one row's lse moved by 1e-2 moves that row's weights by about 1e-2
// relative, and the checks above catch it.
TEST(ScoreRuleChecker, RecomputeUsesTheSavedLse) {
  const RuleCase c{70, 300, MaskKind::None, false, Causal::None, 0, MaskedRowPolicy::Zeros, 0.0};
  const Inputs in = make_inputs(c);
  const Expected e = expected(in, unit_roundoff<float>());
  KernelRun<float> r;
  const AttentionArgs<float> a = args_for<float>(in, r, false, 1);
  detail::attention_forward(a, AttentionKernel::Flash);
  std::vector<double> tight(e.weights.size(), 1e-6);
  ASSERT_EQ(compare("weights", recompute(a, r.lse, nullptr, nullptr), e.weights, tight), "");
  std::vector<float> lse = r.lse;
  lse[5] += 1e-2f;
  EXPECT_NE(compare("weights", recompute(a, lse, nullptr, nullptr), e.weights, tight), "");
}

// Bottom-right, exactly: with L = 3 queries and S = 5 keys, query i sees
// keys j <= i + 2; with L = 5, S = 3 and offset 0, queries 0 and 1 see no
// key and query 4 sees all three; an offset of 1 moves the diagonal right.
TEST(ScoreRuleCausal, BottomRightDiagonal) {
  using detail::causal_shift;
  using detail::causal_visible;
  const detail::CausalRule br{true, CausalAlignment::BottomRight, 0, 5};
  EXPECT_EQ(causal_shift(br, 3), 2);
  EXPECT_TRUE(causal_visible(br, 2, 0, 2));
  EXPECT_FALSE(causal_visible(br, 2, 0, 3));
  EXPECT_TRUE(causal_visible(br, 2, 2, 4));
  const detail::CausalRule tall{true, CausalAlignment::BottomRight, 0, 3};
  const int64_t shift = causal_shift(tall, 5);
  for (int64_t j = 0; j < 3; ++j) {
    EXPECT_FALSE(causal_visible(tall, shift, 0, j));
    EXPECT_FALSE(causal_visible(tall, shift, 1, j));
    EXPECT_TRUE(causal_visible(tall, shift, 4, j));
  }
  const detail::CausalRule moved{true, CausalAlignment::BottomRight, 1, 3};
  EXPECT_TRUE(causal_visible(moved, causal_shift(moved, 5), 1, 0));
  // Keys from cols on (bias_k, the zero-attention key) stay visible.
  EXPECT_TRUE(causal_visible(tall, shift, 0, 3));
  // TopLeft with offset S − L is BottomRight.
  const detail::CausalRule tl{true, CausalAlignment::TopLeft, 2, 5};
  EXPECT_EQ(causal_shift(tl, 3), causal_shift(br, 3));
}

}  // namespace
}  // namespace multihead

// ---- visible_key_range (score_rule.hpp) ----------------------------------
// Exhaustive over small shapes: for every S, cols (fewer, equal, more keys
// with a position), causal on/off, window 0..4, shift -5..5 (the causal
// alignments and query offsets reduce to it) and every query range
// [i0, i1) of L = 4 queries, key j is in [begin, end) ∪ [rest, S) exactly
// when causal_visible and window_visible let some query of the range see
// it. Also the form: begin <= end <= rest <= S, and without causal and
// window the single range {0, S, S}.
namespace multihead::detail {
namespace {

TEST(VisibleKeyRange, MatchesCausalAndWindowVisibleExhaustively) {
  int64_t checked = 0;
  for (int64_t S = 0; S <= 6; ++S)
    for (int64_t cols = 0; cols <= S + 2; ++cols)
      for (const bool causal : {false, true})
        for (int64_t window = 0; window <= 4; ++window)
          for (int64_t shift = -5; shift <= 5; ++shift)
            for (int64_t i0 = 0; i0 < 4; ++i0)
              for (int64_t i1 = i0 + 1; i1 <= 4; ++i1) {
                CausalRule c;
                c.enabled = causal;
                c.cols = cols;
                const VisibleKeys k = visible_key_range(c, window, shift, S, i0, i1);
                const std::string name = "S=" + std::to_string(S) + " cols=" + std::to_string(cols) +
                                         " causal=" + std::to_string(causal) + " window=" + std::to_string(window) +
                                         " shift=" + std::to_string(shift) + " rows=[" + std::to_string(i0) + "," +
                                         std::to_string(i1) + ") -> {" + std::to_string(k.begin) + "," +
                                         std::to_string(k.end) + "," + std::to_string(k.rest) + "}";
                ASSERT_TRUE(0 <= k.begin && k.begin <= k.end && k.end <= k.rest && k.rest <= S) << name;
                if (!causal && window == 0) {
                  ASSERT_TRUE(k.begin == 0 && k.end == S && k.rest == S) << name;
                }
                for (int64_t j = 0; j < S; ++j) {
                  bool seen = false;
                  for (int64_t i = i0; i < i1; ++i)
                    seen = seen || (causal_visible(c, shift, i, j) && window_visible(c, window, shift, i, j));
                  const bool in_range = (j >= k.begin && j < k.end) || j >= k.rest;
                  ASSERT_EQ(in_range, seen) << name << " key " << j;
                  ++checked;
                }
              }
  EXPECT_GT(checked, 10000);
}

// The checker catches a range one key too short: the last visible
// positional key of a causal query left out must fail the comparison.
TEST(VisibleKeyRange, CheckerCatchesARangeOneKeyShort) {
  CausalRule c;
  c.enabled = true;
  c.cols = 6;
  VisibleKeys k = visible_key_range(c, 0, 1, 6, 0, 2);  // queries at 1, 2: keys [0, 3)
  ASSERT_EQ(k.end, 3);
  k.end -= 1;
  const int64_t j = 2;
  const bool in_range = (j >= k.begin && j < k.end) || j >= k.rest;
  EXPECT_NE(in_range, causal_visible(c, 1, 1, j));
}

}  // namespace
}  // namespace multihead::detail
