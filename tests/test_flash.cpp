// tests/test_flash.cpp: the flash kernel (src/kernels/flash.cpp +
// src/simd/flash_attention-inl.h) against the reference loops run in double
// (detail::attention_forward_reference<double>) on the same float inputs, for
// every SIMD target this machine runs, at 1 and 2 threads.
//
// Every case names all its parameters, e.g.
//   Flash/FlashCase.Matches/L17_S65_D63_Dv63_N4_H2_causal_kpm_mask3d_inf_t2_AVX3
// so a failure reruns with --gtest_filter='*L17_S65_D63_Dv63_N4_H2_causal*'.
//
// ---- Tolerance (derived; u = 2^-24, the float32 unit roundoff) -------------
// Let s_ij be the exact score, A_ij = scale·Σ_d |q_id·k_jd| its condition
// number, M_ij = |mask_ij| + |pad_j| (finite parts), p_ij the exact weights
// (reference, including dropout's keep/(1-p)) and W_ic = Σ_j |p_ij|·|v_jc|.
// The kernel computes in float32:
//  1. ŝ_ij = fl(scale·q_i)·k_j (+ mask + pad): a length-D fused dot product
//     and two additions whose rounding is relative to the running sum, so
//     |ŝ - s| <= u·((D + 3)·A_ij + 2·(A_ij + M_ij)) =: δ_ij (first order).
//  2. e_ij = 2^((ŝ_ij - m)·log2 e), m = max_j ŝ_ij: the subtraction, the
//     product and our exp2 polynomial (<= 2 ulp, see Exp2 test below) add a
//     relative error <= u·(|s_ij - m| + 3); since e_ij·|s_ij - m| <= 1/e this
//     costs at most ~4u relative after weighting.
//  3. The normalised weight e_ij / Σ_k e_ik is invariant to a common shift
//     of the scores, so its relative error is <= 2·max_j δ_ij + 4u + the
//     error of the sum l (sequential float adds and one multiply per key
//     tile: <= (S + S/64 + 2)·u relative).
//  4. acc_c = Σ_j e_ij·v_jc, accumulated in float32 one key after another
//     with one rescale per key tile: error <= (S + S/64 + 2)·u·W_ic·l.
// Hence, per element,
//   |out_ic - ref_ic| <= u·W_ic·(2·max_j δ_ij/u + 2·(S + S/64) + 16)  =: bound_ic
// with the max over keys that are not masked (-inf). For random N(0, 1)
// inputs and D = 64 this is ~1e-4·W_ic, while actual errors are ~1e-6·W_ic
// (the bound is worst-case, not statistical): a wrong mask, key or scale
// gives errors of order W_ic and fails it. When the inputs make every score
// exact in float32 (integers, scale a power of two: the "large scores" cases
// with s ~ 1e4), step 1 has no error and the bound is tight enough to catch
// an exp(s·log2e - m·log2e) that loses u·|m| ~ 1e-3 relative.
// A row that the reference leaves NaN must be NaN here, and vice versa.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/narrow_rows.hpp"
#include "kernels/kernel.hpp"
#include "multihead/error.hpp"
#include "simd/softmax_row.hpp"
#include "simd/targets.hpp"

namespace multihead {
namespace {

using detail::AttentionArgs;

constexpr double kUnitRoundoff = 0x1.0p-24;
constexpr float kInf = std::numeric_limits<float>::infinity();

enum class MaskKind { None, Mask2d, Mask3d, KeyPadding, Both };

struct Case {
  int64_t L, S, D, Dv;
  int64_t batch = 2, heads = 2;  // N = batch·heads slices
  MaskKind mask = MaskKind::None;
  bool with_inf = false;        // masks contain -inf entries
  bool causal = false;
  int64_t causal_cols = -1;     // -1: S
  double dropout = 0.0;
  bool masked_rows = false;     // some rows have every key masked
  MaskedRowPolicy policy = MaskedRowPolicy::Zeros;
  bool large_scores = false;    // integer inputs, scores ~1e4, exact in float
  bool strided = false;         // q, k, v, out as (len, B, H·width) views
  bool nan_inputs = false;      // a NaN in q (slice 0), k (slice 1), v (slice 2)
};

// A case together with the thread count and the SIMD target it runs on.
struct Param {
  Case c;
  int threads;
  std::string target;
};

std::string case_name(const Case& c) {
  std::string n = "L" + std::to_string(c.L) + "_S" + std::to_string(c.S) + "_D" + std::to_string(c.D) +
                  "_Dv" + std::to_string(c.Dv) + "_N" + std::to_string(c.batch * c.heads) + "_H" +
                  std::to_string(c.heads);
  if (c.causal) {
    n += "_causal";
    if (c.causal_cols >= 0) n += "cols" + std::to_string(c.causal_cols);
  }
  static const char* kMasks[] = {"", "_mask2d", "_mask3d", "_kpm", "_mask2d_kpm"};
  n += kMasks[static_cast<int>(c.mask)];
  if (c.with_inf) n += "_inf";
  if (c.dropout > 0) n += "_dropout" + std::to_string(static_cast<int>(c.dropout * 100));
  if (c.masked_rows) n += c.policy == MaskedRowPolicy::NaN ? "_maskedrowsNaN" : "_maskedrowsZeros";
  if (c.large_scores) n += "_scores1e4";
  if (c.strided) n += "_strided";
  if (c.nan_inputs) n += "_naninputs";
  return n;
}

std::string param_name(const Param& p) {
  return case_name(p.c) + "_t" + std::to_string(p.threads) + "_" + p.target;
}

// gtest prints a failing parameter with this instead of its bytes.
void PrintTo(const Param& p, std::ostream* os) { *os << param_name(p); }

// ---- inputs ---------------------------------------------------------------

struct Inputs {
  Case c;
  int64_t N;
  std::vector<float> q, k, v, mask, pad;
  float scale;
};

Inputs make_inputs(const Case& c) {
  Inputs in;
  in.c = c;
  in.N = c.batch * c.heads;
  std::mt19937_64 rng(std::hash<std::string>{}(case_name(c)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::uniform_int_distribution<int> ints(-40, 40);
  auto fill = [&](std::vector<float>& x, int64_t count) {
    x.resize(static_cast<std::size_t>(count));
    for (float& e : x) e = c.large_scores ? static_cast<float>(ints(rng)) : normal(rng);
  };
  fill(in.q, in.N * c.L * c.D);
  fill(in.k, in.N * c.S * c.D);
  in.v.resize(static_cast<std::size_t>(in.N * c.S * c.Dv));
  for (float& e : in.v) e = normal(rng);
  // Large scores: D = 16 keeps |q·k| <= 16·40·40 = 25600 exact, scale 1/4.
  in.scale = c.large_scores ? 0.25f : static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.D)));

  const bool mask2d = c.mask == MaskKind::Mask2d || c.mask == MaskKind::Both;
  const bool mask3d = c.mask == MaskKind::Mask3d;
  const bool kpm = c.mask == MaskKind::KeyPadding || c.mask == MaskKind::Both;
  if (mask2d || mask3d) {
    const int64_t count = (mask3d ? in.N : 1) * c.L * c.S;
    in.mask.resize(static_cast<std::size_t>(count));
    for (float& e : in.mask) e = c.with_inf && uniform(rng) < 0.25f ? -kInf : 2.0f * normal(rng);
  }
  if (kpm) {
    in.pad.resize(static_cast<std::size_t>(c.batch * c.S));
    for (float& e : in.pad) {
      // Large scores: integer padding keeps s + pad exact in float.
      const float value = c.large_scores ? static_cast<float>(ints(rng)) : normal(rng);
      e = c.with_inf && uniform(rng) < 0.3f ? -kInf : value;
    }
  }
  if (c.nan_inputs) {
    // Slice 0: query row 3 (that row is NaN); slice 1: key 5 (every row that
    // sees it); slice 2: value row 7 (every row: 0·NaN is NaN too).
    const float nan = std::numeric_limits<float>::quiet_NaN();
    in.q[static_cast<std::size_t>((0 * c.L + 3) * c.D + 1)] = nan;
    in.k[static_cast<std::size_t>((1 * c.S + 5) * c.D + 0)] = nan;
    in.v[static_cast<std::size_t>((2 * c.S + 7) * c.Dv + 2)] = nan;
  }
  if (c.masked_rows) {
    // Row 0 (and row L/2) of every slice sees no key at all; with key padding
    // the whole last batch entry is padded out.
    if (in.mask.empty()) in.mask.assign(static_cast<std::size_t>(c.L * c.S), 0.0f);
    const int64_t mask_slices = static_cast<int64_t>(in.mask.size()) / (c.L * c.S);
    for (int64_t n = 0; n < mask_slices; ++n) {
      for (int64_t i : {int64_t{0}, c.L / 2}) {
        for (int64_t j = 0; j < c.S; ++j) in.mask[static_cast<std::size_t>((n * c.L + i) * c.S + j)] = -kInf;
      }
    }
    if (!in.pad.empty()) {
      for (int64_t j = 0; j < c.S; ++j) in.pad[static_cast<std::size_t>((c.batch - 1) * c.S + j)] = -kInf;
    }
  }
  return in;
}

template <class T>
struct Buffers {
  std::vector<T> q, k, v, mask, pad, out, weights;
};

template <class T>
AttentionArgs<T> make_args(const Inputs& in, Buffers<T>& b) {
  const Case& c = in.c;
  b.q.assign(in.q.begin(), in.q.end());
  b.k.assign(in.k.begin(), in.k.end());
  b.v.assign(in.v.begin(), in.v.end());
  b.mask.assign(in.mask.begin(), in.mask.end());
  b.pad.assign(in.pad.begin(), in.pad.end());
  b.out.assign(static_cast<std::size_t>(in.N * c.L * c.Dv), T(-12345));
  AttentionArgs<T> a;
  a.slices = in.N;
  a.heads = c.heads;
  a.q_len = c.L;
  a.kv_len = c.S;
  a.head_dim = c.D;
  a.value_dim = c.Dv;
  a.q = b.q.data();
  a.k = b.k.data();
  a.v = b.v.data();
  if (!b.mask.empty()) {
    a.modifiers.attn_mask = b.mask.data();
    a.modifiers.attn_mask_slice_stride = static_cast<int64_t>(b.mask.size()) == c.L * c.S ? 0 : c.L * c.S;
  }
  if (!b.pad.empty()) a.modifiers.key_padding = b.pad.data();
  a.modifiers.causal.enabled = c.causal;
  a.modifiers.causal.cols = c.causal_cols >= 0 ? c.causal_cols : c.S;
  a.scale = static_cast<T>(in.scale);
  a.dropout.p = c.dropout;
  a.dropout.seed = 0x5EED;
  a.masked_rows = c.policy;
  a.out = b.out.data();
  return a;
}

// ---- the checker ----------------------------------------------------------

struct Check {
  bool ok = true;
  int64_t failures = 0;
  double worst_ratio = 0;  // max error / bound
  std::string first;       // first failing element, printed in full
};

// out (float, flash) against ref (double, reference) with the bound derived
// at the top of this file. ref_weights are the reference's p_ij (after
// dropout), [N][L][S].
Check check_against_reference(const Inputs& in, const std::vector<float>& out,
                              const std::vector<double>& ref, const std::vector<double>& ref_weights) {
  const Case& c = in.c;
  const double u = kUnitRoundoff;
  const int64_t mask_stride = static_cast<int64_t>(in.mask.size()) == c.L * c.S ? 0 : c.L * c.S;
  Check result;
  for (int64_t n = 0; n < in.N; ++n) {
    for (int64_t i = 0; i < c.L; ++i) {
      // max_j δ_ij / u over unmasked keys.
      double delta = 0;
      for (int64_t j = 0; j < c.S; ++j) {
        double a = 0;
        for (int64_t d = 0; d < c.D; ++d) {
          a += std::abs(static_cast<double>(in.q[static_cast<std::size_t>((n * c.L + i) * c.D + d)]) *
                        static_cast<double>(in.k[static_cast<std::size_t>((n * c.S + j) * c.D + d)]));
        }
        a *= std::abs(static_cast<double>(in.scale));
        double m = 0;
        if (!in.mask.empty()) m += std::abs(static_cast<double>(in.mask[static_cast<std::size_t>(n * mask_stride + i * c.S + j)]));
        if (!in.pad.empty()) m += std::abs(static_cast<double>(in.pad[static_cast<std::size_t>((n / c.heads) * c.S + j)]));
        if (std::isinf(m)) continue;  // masked key
        // Integer inputs, a power-of-two scale and integer masks: every
        // product, sum and mask addition is exact in float.
        if (!c.large_scores) delta = std::max(delta, (static_cast<double>(c.D) + 3) * a + 2 * (a + m));
      }
      const double factor = 2 * delta + 2 * (static_cast<double>(c.S) + static_cast<double>(c.S) / 64) + 16;
      for (int64_t col = 0; col < c.Dv; ++col) {
        double w = 0;
        for (int64_t j = 0; j < c.S && !std::isnan(ref[static_cast<std::size_t>((n * c.L + i) * c.Dv)]); ++j) {
          w += std::abs(ref_weights[static_cast<std::size_t>((n * c.L + i) * c.S + j)]) *
               std::abs(static_cast<double>(in.v[static_cast<std::size_t>((n * c.S + j) * c.Dv + col)]));
        }
        const std::size_t idx = static_cast<std::size_t>((n * c.L + i) * c.Dv + col);
        const double ours = static_cast<double>(out[idx]);
        const double want = ref[idx];
        const double bound = u * w * factor;
        double err;
        if (std::isnan(want) || std::isnan(ours)) {
          err = std::isnan(want) == std::isnan(ours) ? 0.0 : INFINITY;
        } else {
          err = std::abs(ours - want);
        }
        const double ratio = err == 0 ? 0 : (bound > 0 ? err / bound : INFINITY);
        result.worst_ratio = std::max(result.worst_ratio, ratio);
        if (!(err <= bound) && !(std::isnan(want) && std::isnan(ours))) {
          if (result.ok) {
            std::ostringstream os;
            os.precision(9);
            os << "first failure at [slice " << n << ", row " << i << ", col " << col << "]: flash " << ours
               << ", reference " << want << ", |error| " << err << " > bound " << bound
               << " (= u·W·" << factor << ", W = " << w << ")";
            result.first = os.str();
          }
          result.ok = false;
          ++result.failures;
        }
      }
    }
  }
  return result;
}

// Forces a SIMD target for the scope of a test.
class ScopedTarget {
 public:
  explicit ScopedTarget(const std::string& name) { detail::simd_target_force(name); }
  ~ScopedTarget() { detail::simd_target_force(""); }
  ScopedTarget(const ScopedTarget&) = delete;
  ScopedTarget& operator=(const ScopedTarget&) = delete;
};

// [N][len][width] (n = b·H + h) -> the (len, B, H·width) layout of PyTorch's
// (L, B, E) projections, and back.
std::vector<float> to_strided(const std::vector<float>& x, int64_t B, int64_t H, int64_t len, int64_t width) {
  std::vector<float> y(x.size());
  for (int64_t n = 0; n < B * H; ++n)
    for (int64_t i = 0; i < len; ++i)
      for (int64_t d = 0; d < width; ++d)
        y[static_cast<std::size_t>((i * B + n / H) * H * width + (n % H) * width + d)] =
            x[static_cast<std::size_t>((n * len + i) * width + d)];
  return y;
}
std::vector<float> from_strided(const std::vector<float>& y, int64_t B, int64_t H, int64_t len, int64_t width) {
  std::vector<float> x(y.size());
  for (int64_t n = 0; n < B * H; ++n)
    for (int64_t i = 0; i < len; ++i)
      for (int64_t d = 0; d < width; ++d)
        x[static_cast<std::size_t>((n * len + i) * width + d)] =
            y[static_cast<std::size_t>((i * B + n / H) * H * width + (n % H) * width + d)];
  return x;
}
detail::SliceLayout strided_layout(int64_t B, int64_t H, int64_t width) {
  return detail::SliceLayout{H * width, width, B * H * width};
}

std::vector<float> run_flash(const Inputs& in, int threads) {
  Buffers<float> b;
  AttentionArgs<float> a = make_args(in, b);
  a.num_threads = threads;
  const Case& c = in.c;
  if (!c.strided) {
    detail::attention_forward_flash(a);
    return b.out;
  }
  // The same problem through strided views; the output comes back contiguous.
  const std::vector<float> q = to_strided(b.q, c.batch, c.heads, c.L, c.D);
  const std::vector<float> k = to_strided(b.k, c.batch, c.heads, c.S, c.D);
  const std::vector<float> v = to_strided(b.v, c.batch, c.heads, c.S, c.Dv);
  std::vector<float> out(b.out.size(), -12345.0f);
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.out = out.data();
  a.q_layout = strided_layout(c.batch, c.heads, c.D);
  a.k_layout = strided_layout(c.batch, c.heads, c.D);
  a.v_layout = strided_layout(c.batch, c.heads, c.Dv);
  a.out_layout = strided_layout(c.batch, c.heads, c.Dv);
  detail::attention_forward_flash(a);
  return from_strided(out, c.batch, c.heads, c.L, c.Dv);
}

struct Reference {
  std::vector<double> out, weights;
};

Reference run_reference(const Inputs& in) {
  Buffers<double> b;
  AttentionArgs<double> a = make_args(in, b);
  b.weights.assign(static_cast<std::size_t>(in.N * in.c.L * in.c.S), 0.0);
  a.weights = b.weights.data();
  detail::attention_forward_reference<double>(a);
  return {b.out, b.weights};
}

// ---- the case table -----------------------------------------------------------

std::vector<Case> cases() {
  std::vector<Case> t;
  // Lengths around the tile and vector sizes (16 lanes, 64-query tiles, 126- or
  // 128-key tiles), L = S and L != S.
  for (int64_t L : {1, 15, 16, 17, 63, 64, 65, 127, 129, 200}) t.push_back({L, L, 64, 64});
  for (auto [L, S] : {std::pair<int64_t, int64_t>{1, 200}, {200, 1}, {17, 65}, {65, 17}, {16, 129}, {129, 127}}) {
    t.push_back({L, S, 64, 64});
  }
  // Key counts around the last-tile rule (a tile of 126 or 128 keys; the last
  // one takes up to a quarter more): 157/158 and 160/161 keys are one tile or
  // two, 283/284 and 288/289 two or three.
  for (auto [L, S] : {std::pair<int64_t, int64_t>{65, 157}, {65, 158}, {65, 283}, {65, 284},
                      {17, 160}, {17, 161}, {17, 288}, {17, 289}}) {
    Case c{L, S, 16, 16};
    c.batch = 1;
    t.push_back(c);
  }
  // Head widths, and value width != head width.
  for (int64_t D : {1, 8, 63, 64, 80, 128}) t.push_back({65, 65, D, D});
  t.push_back({33, 47, 8, 80});
  t.push_back({33, 47, 80, 1});
  t.push_back({17, 129, 63, 7});
  // Every mask kind, with and without -inf entries.
  for (MaskKind m : {MaskKind::Mask2d, MaskKind::Mask3d, MaskKind::KeyPadding, MaskKind::Both}) {
    for (bool inf : {false, true}) {
      Case c{65, 129, 63, 63};
      c.mask = m;
      c.with_inf = inf;
      t.push_back(c);
      Case d{17, 65, 64, 64};
      d.mask = m;
      d.with_inf = inf;
      d.causal = true;
      t.push_back(d);
    }
  }
  // Causal: square, L < S, L > S, columns beyond causal_cols (bias_k, zero
  // attention), long enough to skip whole key tiles.
  for (auto [L, S] : {std::pair<int64_t, int64_t>{64, 64}, {65, 65}, {200, 200}, {17, 65}, {129, 63}, {1, 16}}) {
    Case c{L, S, 64, 64};
    c.causal = true;
    t.push_back(c);
  }
  {
    Case c{200, 200, 64, 64};
    c.causal = true;
    c.causal_cols = 198;
    t.push_back(c);
    Case d{127, 129, 80, 80};
    d.causal = true;
    d.causal_cols = 127;
    d.mask = MaskKind::KeyPadding;
    d.with_inf = true;
    t.push_back(d);
    Case e{300, 300, 16, 16};
    e.batch = 1;
    e.heads = 1;
    e.causal = true;
    t.push_back(e);
  }
  // Dropout, compared against the reference with the same seed.
  for (bool causal : {false, true}) {
    Case c{65, 129, 64, 64};
    c.dropout = 0.3;
    c.causal = causal;
    t.push_back(c);
  }
  {
    Case c{17, 17, 8, 8};
    c.dropout = 1.0;
    t.push_back(c);
  }
  // Rows with every key masked, under both policies.
  for (MaskedRowPolicy policy : {MaskedRowPolicy::Zeros, MaskedRowPolicy::NaN}) {
    for (MaskKind m : {MaskKind::Mask2d, MaskKind::Both}) {
      Case c{65, 63, 64, 64};
      c.mask = m;
      c.with_inf = true;
      c.masked_rows = true;
      c.policy = policy;
      t.push_back(c);
    }
    Case d{64, 64, 64, 64};
    d.mask = MaskKind::Mask3d;
    d.masked_rows = true;
    d.causal = true;
    d.policy = policy;
    t.push_back(d);
    Case e{5, 0, 8, 8};  // no keys at all: every row is masked
    e.policy = policy;
    t.push_back(e);
  }
  // Strided (len, B, H·width) views, as the fused multi-head form passes them.
  for (bool causal : {false, true}) {
    Case c{65, 129, 63, 17};
    c.batch = 3;
    c.heads = 2;
    c.strided = true;
    c.causal = causal;
    c.mask = MaskKind::Both;
    c.with_inf = true;
    t.push_back(c);
  }
  // NaN inputs propagate to exactly the rows the reference makes NaN, on
  // every target (not only where Highway's Max happens to keep NaN).
  for (MaskKind m : {MaskKind::None, MaskKind::KeyPadding}) {
    Case c{17, 33, 8, 8};
    c.nan_inputs = true;
    c.mask = m;
    c.with_inf = m != MaskKind::None;
    t.push_back(c);
  }
  // Scores around 1e4 (exact in float): no overflow, no NaN, and the max
  // subtraction stays exact.
  for (bool causal : {false, true}) {
    Case c{65, 129, 16, 16};
    c.large_scores = true;
    c.causal = causal;
    c.mask = MaskKind::KeyPadding;
    t.push_back(c);
  }
  // The sweeps overlap (e.g. L = S = 65, D = 64); keep each case once.
  std::vector<Case> unique;
  for (const Case& c : t) {
    bool seen = false;
    for (const Case& u : unique) seen = seen || case_name(u) == case_name(c);
    if (!seen) unique.push_back(c);
  }
  return unique;
}

std::vector<Param> params() {
  std::vector<Param> p;
  for (const std::string& target : detail::simd_targets_available()) {
    for (const Case& c : cases()) {
      for (int threads : {1, 2}) p.push_back({c, threads, target});
    }
  }
  return p;
}

class FlashCase : public ::testing::TestWithParam<Param> {};

TEST_P(FlashCase, Matches) {
  const Param& p = GetParam();
  const ScopedTarget target(p.target);
  ASSERT_EQ(detail::simd_target_current(), p.target);
  const Inputs in = make_inputs(p.c);
  const std::vector<float> out = run_flash(in, p.threads);
  const Reference ref = run_reference(in);
  const Check check = check_against_reference(in, out, ref.out, ref.weights);
  EXPECT_TRUE(check.ok) << check.failures << " elements out of bound; " << check.first;
  // How close the worst element came to the bound (in the XML report).
  RecordProperty("worst_error_over_bound", std::to_string(check.worst_ratio));
  if (p.threads != 1) {
    // Each row is computed by one thread, independent of the others: the
    // output must not depend on the thread count, to the bit.
    const std::vector<float> single = run_flash(in, 1);
    EXPECT_EQ(0, std::memcmp(out.data(), single.data(), out.size() * sizeof(float)))
        << "outputs differ between " << p.threads << " threads and 1 thread";
  }
}

INSTANTIATE_TEST_SUITE_P(Flash, FlashCase, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) { return param_name(info.param); });

// ---- the checker checks -----------------------------------------------------

TEST(FlashChecker, FailsWhenOneElementIsPerturbed) {
  Case c{33, 47, 64, 64};
  c.mask = MaskKind::Both;
  c.with_inf = true;
  const Inputs in = make_inputs(c);
  const Reference ref = run_reference(in);
  std::vector<float> exact(ref.out.begin(), ref.out.end());
  ASSERT_TRUE(check_against_reference(in, exact, ref.out, ref.weights).ok);
  // Relative 1e-3 on one element: far below what a wrong mask or key would
  // cause, far above the bound (~1e-4 relative here).
  for (std::size_t idx : {std::size_t{0}, exact.size() / 2, exact.size() - 1}) {
    std::vector<float> bad = exact;
    bad[idx] += 1e-3f * std::max(1.0f, std::abs(bad[idx]));
    const Check check = check_against_reference(in, bad, ref.out, ref.weights);
    EXPECT_FALSE(check.ok) << "perturbing element " << idx << " went unnoticed";
    EXPECT_EQ(check.failures, 1);
    EXPECT_NE(check.first.find("bound"), std::string::npos) << check.first;
  }
  // A NaN where the reference has a number (and the reverse) fails too.
  std::vector<float> nan = exact;
  nan[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(check_against_reference(in, nan, ref.out, ref.weights).ok);
}

// ---- exp2 -------------------------------------------------------------------

// Our 2^x for x <= 0 on every target: <= 2 ulp where the result is a normal
// float, exactly 0 for -inf and below the flush threshold, exactly 1 at 0.
TEST(SimdExp2, AccurateOnEveryTarget) {
  std::vector<float> x;
  for (int i = 0; i <= 130000; ++i) x.push_back(-static_cast<float>(i) * 0.001f);
  for (float e : {-0.5f, -0.49999997f, -1e-30f, -1e-7f, -125.9f, -126.0f, -126.4f}) x.push_back(e);
  x.push_back(-kInf);
  x.push_back(0.0f);
  for (std::size_t count : {x.size(), std::size_t{1}, std::size_t{15}, std::size_t{17}}) {
    for (const std::string& target : detail::simd_targets_available()) {
      std::vector<float> y(count);
      detail::exp2_nonpositive_for_test(detail::simd_target_parse(target, "test"), x.data(), y.data(), count);
      double worst_ulp = 0;
      for (std::size_t i = 0; i < count; ++i) {
        const double want = std::exp2(static_cast<double>(x[i]));
        if (x[i] == -kInf || x[i] <= -126.5f) {
          ASSERT_EQ(y[i], 0.0f) << target << " x=" << x[i];
          continue;
        }
        if (x[i] < -126.0f) continue;  // flushed or subnormal: both fine
        const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
        const double err_ulp = std::abs(static_cast<double>(y[i]) - want) / ulp;
        worst_ulp = std::max(worst_ulp, err_ulp);
        ASSERT_LE(err_ulp, 2.0) << target << " x=" << x[i] << " got " << y[i] << " want " << want;
      }
      if (count == x.size()) {
        EXPECT_EQ(y[count - 1], 1.0f) << target << ": 2^0 must be exactly 1";
      }
    }
  }
}

// The row maximum of kernels/score_rows.hpp (src/simd/softmax_row.hpp) on
// every target: the scalar rule's value for every length 0-40 (whole
// vectors and tails), on rows of -inf (a fully masked row must stay -inf:
// EMU128's MaxOfLanes once made it the lowest finite float), random rows,
// and rows whose largest entry sits in each position.
TEST(SimdRowMax, TheScalarRuleOnEveryTarget) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  for (const std::string& target : detail::simd_targets_available()) {
    const detail::RowMaxF32Fn row_max = detail::softmax_row_max_for(detail::simd_target_parse(target, "test"));
    for (std::size_t count = 0; count <= 40; ++count) {
      const std::vector<float> hidden(count, -kInf);
      EXPECT_EQ(row_max(hidden.data(), count), -kInf) << target << " count " << count;
      for (std::size_t top = 0; top < count; ++top) {
        std::vector<float> row(count);
        for (float& x : row) x = normal(rng);
        row[top] = 1000.0f;
        if (top > 0) row[top - 1] = -kInf;
        EXPECT_EQ(row_max(row.data(), count), 1000.0f) << target << " count " << count << " top " << top;
      }
    }
  }
}

// The materialized kernel's softmax numerators (src/simd/softmax_row.hpp)
// on every target, against double: each element within 3 ulp (the
// polynomial's 2, plus slack) of exp(x - max), plus what the two float
// roundings of the argument cost: (x - max) and (x - max)·log2(e) each carry
// a relative error <= 2^-24 (with slack, 1.2e-7), and an absolute error e in
// the exponent is a relative error e in the result, so 2.4e-7·|x - max|.
// The sum is within (count + 4)·2^-23 relative (float summation); -inf gives
// 0; lengths go around the vector width.
TEST(SoftmaxRow, MatchesStdExpOnEveryTarget) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-30.0f, 30.0f);
  for (const std::string& target : detail::simd_targets_available()) {
    const detail::ExpRowF32Fn exp_row = detail::softmax_exp_row_for(detail::simd_target_parse(target, "test"));
    for (std::size_t count : {1, 2, 7, 15, 16, 17, 31, 33, 64, 100, 1000}) {
      for (float offset : {0.0f, 1e4f}) {  // large scores: the subtraction comes first
        std::vector<float> x(count);
        for (float& v : x) v = dist(rng) + offset;
        if (count > 2) x[1] = -kInf;
        const float m = *std::max_element(x.begin(), x.end());
        std::vector<float> y = x;
        const float sum = exp_row(y.data(), count, m);
        double want_sum = 0;
        for (std::size_t j = 0; j < count; ++j) {
          const double want = std::exp(static_cast<double>(x[j]) - m);
          want_sum += want;
          if (x[j] == -kInf) {
            ASSERT_EQ(y[j], 0.0f) << target;
            continue;
          }
          const double diff = std::abs(static_cast<double>(x[j]) - m);
          const double tol = want * (3 * 1.2e-7 + diff * 2.4e-7) + 1e-38;
          ASSERT_NEAR(y[j], want, tol) << target << " count " << count << " j " << j;
        }
        EXPECT_NEAR(sum, want_sum, want_sum * (static_cast<double>(count) + 4) * 1.2e-7) << target;
      }
    }
    // NaN stays NaN (and makes the sum NaN), as std::exp does; so does a
    // +inf maximum (inf - inf), which the materialized kernel can pass when
    // a float mask holds +inf.
    std::vector<float> x = {0.0f, std::numeric_limits<float>::quiet_NaN(), -1.0f};
    EXPECT_TRUE(std::isnan(exp_row(x.data(), x.size(), 0.0f))) << target;
    EXPECT_TRUE(std::isnan(x[1])) << target;
    EXPECT_EQ(x[0], 1.0f) << target;
    std::vector<float> y = {kInf, 1.0f};
    EXPECT_TRUE(std::isnan(exp_row(y.data(), y.size(), kInf))) << target;
    EXPECT_TRUE(std::isnan(y[0])) << target;
    EXPECT_EQ(y[1], 0.0f) << target;
  }
}

// The bf16 matmul way's one-pass rows (kernels/narrow_matmul.cpp) against
// the passes they replace, bit for bit, on every target: the forward's
// ExpRowBf16 is ExpRowF32 then round_rows (the same sum), the backward's
// BackwardRowBf16 is the clamp min(x − lse, 0), ExpRowF32 with row_max 0,
// dx = p (dp − delta), then round_rows of both. Rows hold −inf (hidden
// keys: p = +0, so dx is −0 where dp < delta, in the vector lanes and the
// tail alike), a NaN, scores past lse by a rounding (the clamp), values
// whose bf16 rounding is a tie, and lengths around the vector width.
TEST(SoftmaxRow, OnePassBf16RowsAreThePassesOnEveryTarget) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> dist(-12.0f, 0.5f);
  std::normal_distribution<float> normal;
  const auto bits = [](const std::vector<bfloat16>& v) {
    std::vector<uint16_t> b(v.size());
    for (std::size_t j = 0; j < v.size(); ++j) b[j] = v[j].bits;
    return b;
  };
  const auto same = [](float a, float b) { return std::isnan(a) ? std::isnan(b) : std::memcmp(&a, &b, 4) == 0; };
  for (const std::string& target : detail::simd_targets_available()) {
    const int64_t bit = detail::simd_target_parse(target, "test");
    const detail::ExpRowF32Fn exp_row = detail::softmax_exp_row_for(bit);
    const detail::ExpRowBf16Fn exp_row_bf16 = detail::softmax_exp_row_bf16_for(bit);
    const detail::BackwardRowBf16Fn backward_row = detail::backward_row_bf16_for(bit);
    for (std::size_t count : {1, 2, 7, 15, 16, 17, 31, 33, 64, 100, 512}) {
      for (int variant = 0; variant < 3; ++variant) {
        std::vector<float> x(count), dp(count);
        for (float& v : x) v = dist(rng);
        for (float& v : dp) v = normal(rng);
        if (count > 2) x[1] = -kInf;
        if (variant == 1 && count > 3) x[3] = std::numeric_limits<float>::quiet_NaN();
        if (variant == 2) x[0] = std::bit_cast<float>(0x3f808000u);  // 1 + 2^-8: exp rounds near a bf16 tie
        const float lse = 0.25f, delta = 0.125f;
        // Forward: a finite row maximum (the NaN row takes one too).
        float m = -kInf;
        for (float v : x) m = v > m ? v : m;
        std::vector<float> y = x;
        const float want_sum = exp_row(y.data(), count, m);
        std::vector<bfloat16> want_p(count), got_p(count);
        detail::round_rows(y.data(), 1, static_cast<int64_t>(count), static_cast<int64_t>(count),
                           static_cast<const bfloat16*>(nullptr), want_p.data(), static_cast<int64_t>(count), 1);
        const float got_sum = exp_row_bf16(x.data(), count, m, got_p.data());
        EXPECT_TRUE(same(want_sum, got_sum)) << target << " count " << count << " variant " << variant;
        EXPECT_EQ(bits(got_p), bits(want_p)) << target << " count " << count << " variant " << variant;
        // Backward.
        std::vector<float> p = x, d = dp;
        for (float& v : p) v = std::min(v - lse, 0.0f);
        (void)exp_row(p.data(), count, 0.0f);
        for (std::size_t j = 0; j < count; ++j) d[j] = p[j] * (d[j] - delta);
        std::vector<bfloat16> want_p16(count), want_dx16(count), got_p16(count), got_dx16(count);
        const auto n = static_cast<int64_t>(count);
        detail::round_rows(p.data(), 1, n, n, static_cast<const bfloat16*>(nullptr), want_p16.data(), n, 1);
        detail::round_rows(d.data(), 1, n, n, static_cast<const bfloat16*>(nullptr), want_dx16.data(), n, 1);
        backward_row(x.data(), dp.data(), count, lse, delta, got_p16.data(), got_dx16.data());
        EXPECT_EQ(bits(got_p16), bits(want_p16)) << target << " count " << count << " variant " << variant;
        EXPECT_EQ(bits(got_dx16), bits(want_dx16)) << target << " count " << count << " variant " << variant;
      }
    }
  }
}

// ---- interface --------------------------------------------------------------

TEST(FlashInterface, RejectsWeights) {
  Case c{4, 4, 8, 8};
  const Inputs in = make_inputs(c);
  Buffers<float> b;
  AttentionArgs<float> a = make_args(in, b);
  std::vector<float> weights(static_cast<std::size_t>(in.N * 16));
  a.weights = weights.data();
  try {
    detail::attention_forward_flash(a);
    FAIL() << "expected multihead::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weights"), std::string::npos) << e.what();
  }
}


std::string hwy_name(int64_t bit) {
  const ScopedTarget unused("");
  for (const std::string& name : detail::simd_targets_available()) {
    if (detail::simd_target_parse(name, "test") == bit) return name;
  }
  return "?";
}

TEST(SimdTargets, ListedForcedAndRejected) {
  const std::vector<std::string> available = detail::simd_targets_available();
  ASSERT_FALSE(available.empty());
  // The default is the best target, unless MULTIHEAD_SIMD_TARGET says otherwise.
  const char* env = std::getenv("MULTIHEAD_SIMD_TARGET");
  const std::string expected_default =
      env != nullptr && *env != '\0' ? hwy_name(detail::simd_target_parse(env, "test")) : available.front();
  EXPECT_EQ(detail::simd_target_current(), expected_default);
  for (const std::string& name : available) {
    std::string lower = name;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    const ScopedTarget forced(lower);
    EXPECT_EQ(detail::simd_target_current(), name);
  }
  try {
    detail::simd_target_force("AVX9_NOPE");
    FAIL() << "expected multihead::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("AVX9_NOPE"), std::string::npos) << what;
    EXPECT_NE(what.find(available.front()), std::string::npos) << what;
  }
  EXPECT_EQ(detail::simd_target_current(), expected_default);
}

}  // namespace
}  // namespace multihead
