// tests/precision/precision_cases.hpp: the precision tests' shared
// machinery: the table of cases, the problems drawn from it (every number
// rounded to the 16-bit type first), the forward's error trace (the float64
// intermediates with their derived error bounds, error_bound's source and
// the backward bound's inputs), the library call, the checker, and the
// PyTorch dump. test_precision.cpp (the forwards) and
// test_precision_backward.cpp (the backwards) include it. Public headers only.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "oracle/library_side.hpp"
#include "oracle/mha_oracle.hpp"
#include "multihead/attention.hpp"
#include "multihead/error.hpp"
#include "multihead/narrow.hpp"
#include "multihead/narrow_multihead_attention.hpp"
#include "multihead/runtime.hpp"

namespace multihead::precision {

using oracle::MaskKind;
enum class Layout { SeqFirst, BatchFirst, Unbatched };
enum class AttnMask { None, Bool2D, Float2D, Bool3D, Float3D };

// ---- the cases: a shape row, then the variants, chosen per case index ------

struct ShapeRow {
  int64_t E, H, B, L, S, kdim, vdim;
};
// D = E / H from 1 to 32; S across the flash kernel's key tile (126 keys on
// AVX-512: 125, 126, 130) and the query tile (64 rows: L = 63, 65).
inline const ShapeRow kShapes[] = {
    {8, 2, 2, 5, 7, 0, 0},     {16, 4, 3, 6, 6, 0, 0},   {12, 3, 2, 9, 4, 5, 7}, {32, 2, 2, 17, 33, 0, 0},
    {6, 6, 2, 3, 5, 0, 0},     {24, 3, 1, 65, 126, 0, 0}, {16, 1, 2, 4, 130, 9, 0}, {32, 4, 2, 63, 31, 0, 20},
    {64, 2, 1, 8, 125, 0, 0},  {20, 5, 3, 2, 11, 0, 0},
};

struct Case {
  ShapeRow shape;
  bool bias, bias_kv, zero_attn;
  Layout layout;
  bool causal;
  AttnMask mask;
  MaskKind kpm;
  std::string name() const {
    static const char* layouts[] = {"seqfirst", "batchfirst", "unbatched"};
    static const char* masks[] = {"masknone", "mask2dbool", "mask2dfloat", "mask3dbool", "mask3dfloat"};
    static const char* kpms[] = {"kpmnone", "kpmbool", "kpmfloat"};
    const ShapeRow& s = shape;
    auto n = [](int64_t x) { return std::to_string(x); };
    return "E" + n(s.E) + "_H" + n(s.H) + "_B" + n(s.B) + "_L" + n(s.L) + "_S" + n(s.S) + "_k" + n(s.kdim) + "_v" +
           n(s.vdim) + (bias ? "_bias" : "_nobias") + (bias_kv ? "_biaskv" : "") + (zero_attn ? "_zeroattn" : "") +
           "_" + layouts[static_cast<int>(layout)] + (causal ? "_causal" : "") + "_" +
           masks[static_cast<int>(mask)] + "_" + kpms[static_cast<int>(kpm)];
  }
};

inline constexpr int kCaseCount = 240;

// Case i: shape row i mod 10, the variants drawn from a generator seeded
// with i (so a case's name, and its numbers, do not depend on the others).
inline Case case_at(int i) {
  std::mt19937 rng(static_cast<unsigned>(1000 + i));
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  Case c;
  c.shape = kShapes[i % 10];
  c.bias = pick(4) != 0;
  c.bias_kv = pick(3) == 0;
  c.zero_attn = pick(3) == 0;
  c.layout = static_cast<Layout>(pick(3));
  if (c.layout == Layout::Unbatched) c.shape.B = 1;
  c.causal = pick(2) == 0;
  c.mask = static_cast<AttnMask>(pick(5));
  c.kpm = static_cast<MaskKind>(pick(3));
  return c;
}

struct Problem {
  oracle::Config config;
  oracle::Params<double> params;
  oracle::Call<double> call;
  // Variants only the backward table draws (the forward oracle has
  // neither): causal aligned bottom-right (query i sees keys j <= i + S − L)
  // and dropout at this rate with this seed (the library's keep rule).
  bool bottom_right = false;
  double dropout = 0.0;
  uint64_t dropout_seed = 0;
  // Score modifiers only the modifiers table draws (test_precision.cpp,
  // PrecisionModifiers; the oracle has none, forward_trace computes their
  // float64 values): a sliding window of this many positions (0: none), the
  // logit soft-cap c·tanh(x / c) (0: none), ALiBi with the paper's slopes
  // (alibi_slopes_paper). Window and ALiBi place query i at position
  // i + (S − L if bottom_right else 0); the appended keys (bias_k, the zero
  // key) have no position: neither applies to them.
  int64_t window = 0;
  double softcap = 0.0;
  bool alibi = false;
};

// ALiBi's slopes as Press et al. (2022) define them (their reference code's
// get_slopes): for H a power of two, 2^(−8(h+1)/H); else the slopes of the
// power of two below H, then every other slope of twice that power.
inline std::vector<double> alibi_slopes_paper(int64_t H) {
  const auto power_of_two = [](int64_t n) {
    std::vector<double> r;
    const double start = std::pow(2.0, -8.0 / static_cast<double>(n));
    for (int64_t h = 0; h < n; ++h) r.push_back(std::pow(start, static_cast<double>(h + 1)));
    return r;
  };
  int64_t below = 1;
  while (below * 2 <= H) below *= 2;
  std::vector<double> r = power_of_two(below);
  if (below == H) return r;
  const std::vector<double> twice = alibi_slopes_paper(2 * below);
  for (int64_t h = 0; static_cast<int64_t>(r.size()) < H; h += 2) r.push_back(twice[static_cast<std::size_t>(h)]);
  return r;
}

// Every number rounded to E first (so the oracle and the library, and
// PyTorch, compute from the same values). No row is fully masked: key 0 is
// visible to every query (causal keeps it too).
template <class E>
Problem make_problem(const Case& c) {
  std::mt19937_64 rng(20261202);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto fill = [&](std::vector<int64_t> shape, double sd) {
    oracle::Array<double> a(std::move(shape));
    for (double& x : a.v) x = static_cast<double>(to_float(narrow_from_float<E>(static_cast<float>(sd * normal(rng)))));
    return a;
  };
  const ShapeRow& s = c.shape;
  Problem p;
  p.config = {s.E, s.H, s.kdim, s.vdim, c.bias, c.bias_kv, c.zero_attn, c.layout == Layout::BatchFirst};
  const int64_t E_ = s.E, Ek = p.config.Ek(), Ev = p.config.Ev();
  // Weights of nn.Linear's scale (xavier-like, 1/√in), so that projected
  // values stay of order 1 at every width.
  const auto sd_in = [](int64_t in) { return 1.0 / std::sqrt(static_cast<double>(in)); };
  if (Ek == E_ && Ev == E_) {
    p.params.in_proj_weight = fill({3 * E_, E_}, sd_in(E_));
  } else {
    p.params.q_proj_weight = fill({E_, E_}, sd_in(E_));
    p.params.k_proj_weight = fill({E_, Ek}, sd_in(Ek));
    p.params.v_proj_weight = fill({E_, Ev}, sd_in(Ev));
  }
  p.params.out_proj_weight = fill({E_, E_}, sd_in(E_));
  if (c.bias) {
    p.params.in_proj_bias = fill({3 * E_}, 0.5);
    p.params.out_proj_bias = fill({E_}, 0.5);
  }
  if (c.bias_kv) {
    p.params.bias_k = fill({1, 1, E_}, 1.0);
    p.params.bias_v = fill({1, 1, E_}, 1.0);
  }
  const bool unbatched = c.layout == Layout::Unbatched;
  auto input = [&](int64_t len, int64_t width) {
    if (unbatched) return fill({len, width}, 1.0);
    return c.layout == Layout::BatchFirst ? fill({s.B, len, width}, 1.0) : fill({len, s.B, width}, 1.0);
  };
  oracle::Call<double>& call = p.call;
  call.query = input(s.L, E_);
  call.key = input(s.S, Ek);
  call.value = input(s.S, Ev);
  call.need_weights = false;
  std::bernoulli_distribution hide(0.3);
  if (c.mask != AttnMask::None) {
    const bool three = c.mask == AttnMask::Bool3D || c.mask == AttnMask::Float3D;
    const std::vector<int64_t> shape =
        three ? std::vector<int64_t>{s.B * s.H, s.L, s.S} : std::vector<int64_t>{s.L, s.S};
    const bool boolean = c.mask == AttnMask::Bool2D || c.mask == AttnMask::Bool3D;
    call.attn_mask.kind = boolean ? MaskKind::Bool : MaskKind::Float;
    if (boolean) {
      call.attn_mask.bools = oracle::Array<uint8_t>(shape);
      std::vector<uint8_t>& m = call.attn_mask.bools.v;
      for (uint8_t& x : m) x = hide(rng);
      for (std::size_t r = 0; r < m.size(); r += static_cast<std::size_t>(s.S)) m[r] = 0;
    } else {
      call.attn_mask.floats = fill(shape, 1.0);
    }
  }
  if (c.kpm != MaskKind::None) {
    const std::vector<int64_t> shape = unbatched ? std::vector<int64_t>{s.S} : std::vector<int64_t>{s.B, s.S};
    call.key_padding_mask.kind = c.kpm;
    if (c.kpm == MaskKind::Bool) {
      call.key_padding_mask.bools = oracle::Array<uint8_t>(shape);
      std::vector<uint8_t>& m = call.key_padding_mask.bools.v;
      for (uint8_t& x : m) x = hide(rng);
      for (int64_t b = 0; b < (unbatched ? 1 : s.B); ++b) m[static_cast<std::size_t>(b * s.S)] = 0;
    } else {
      call.key_padding_mask.floats = fill(shape, 1.0);
    }
  }
  call.is_causal = c.causal;
  return p;
}

// The score modifiers of case i (test_precision.cpp's PrecisionModifiers,
// test_precision_backward.cpp's PrecisionBackwardModifiers): a window (half
// the cases, 1 … S), a soft-cap (1.5 or 4.0, two thirds), ALiBi (a third,
// and every case that drew neither other), bottom-right placement (half of
// those with a position rule), from a generator of their own.
inline Problem modified_problem(int i, const Problem& base) {
  std::mt19937 rng(static_cast<unsigned>(9000 + i));
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  Problem p = base;
  const int64_t S = case_at(i).shape.S;
  if (pick(2) == 0) p.window = 1 + pick(static_cast<int>(S));
  const int cap = pick(3);
  p.softcap = cap == 0 ? 0.0 : cap == 1 ? 1.5 : 4.0;
  p.alibi = pick(3) == 0;
  if (p.window == 0 && p.softcap == 0 && !p.alibi) p.alibi = true;  // every case modified
  p.bottom_right = (p.call.is_causal || p.window > 0 || p.alibi) && pick(2) == 0;
  return p;
}

inline std::string modifiers_name(const Problem& p) {
  char b[96];
  std::snprintf(b, sizeof b, "_w%lld_cap%d%s%s", static_cast<long long>(p.window), static_cast<int>(p.softcap * 10),
                p.alibi ? "_alibi" : "",
                p.bottom_right ? "_bottomright" : "");
  return b;
}

// ---- the bound --------------------------------------------------------------
//
// Per output element, first order in the roundings, from the steps of
// narrow_multihead_attention.hpp, evaluated on the float64 intermediates
// (the exact values of the same computation). u = the 16-bit unit roundoff
// (2^-8 bf16, 2^-11 f16); γ_n = n·u32/(1 − n·u32), u32 = 2^-24, bounds a
// float32 sum of n terms (Higham, Accuracy and Stability, Lemma 3.1).
// Inputs and parameters are the same numbers on both sides: no error.
//   Q = round(X W_qᵀ + b_q): products of 16-bit numbers are exact in float32,
//       the sum of Ek terms and the bias costs γ_{Ek+1}·(|X||W_q|ᵀ + |b_q|),
//       the rounding u·|Q|:       e_Q = u|Q| + γ_{Ek+1}(|X||W_q|ᵀ + |b_q|);
//       e_K, e_V likewise (bias_k, bias_v and the zero key: exact, e = 0)
//   s_ij = scale·Q_i·K_j + mask:  e_s = scale·Σ_d(|Q_d| e_K + e_Q |K_d| + e_Q e_K)
//                                       + γ_{D+2}·(scale·Σ_d |Q_d K_d| + |mask_ij|)
//   o_i = Σ_j p_ij V_j, p = softmax(s): ∂o_i/∂s_ij = p_ij (V_j − o_i), so
//       e_o = exp(2 max_j e_s)·Σ_j p_ij e_s,ij |V_j − o_i|     (the exp factor:
//             the most any p_ij moves, mean-value form of the first order)
//             + Σ_j p_ij e_V,j + γ_{2S'+8}·Σ_j p_ij |V_j|  (exp polynomial, sums)
//             + u·|o_i|                                     (rounded to 16 bits)
//   y = round(O W_oᵀ + b_o):      e_y = |W_o| e_o + γ_{E+1}(|O||W_o|ᵀ + |b_o|) + u|y|
// The bound is 1.05·e_y (the 5% covers the neglected second-order terms,
// each a product of two e's, below 2% here). Observed: docs/precision.md.
//
// The bf16 pair way (bf16_dot_force("dpbf16"), docs/precision.md "The two
// bf16 dot ways") changes two steps:
//   s_ij: the D products summed in pairs (odd, then even, then the running
//       sum) and the scale applied to the sum: still D + 2 roundings along
//       any path, so γ_{D+2} holds (Higham's bound is for any order); and
//       vdpbf16ps flushes a denormal product to zero: + scale·D·2^-126;
//   o_i: the probabilities rounded to bf16 before PV, p̃ = p(1 + δ), |δ| ≤ u,
//       while l keeps the float32 sum: + u·Σ_j p_ij |V_j|; a p̃ below 2^-126
//       flushed to zero: + 2^-126·Σ_j |V_j|.
// SliceTrace::pair_way adds these terms.
inline double gamma32(double n) {
  const double u32 = std::ldexp(1.0, -24);
  return n * u32 / (1 - n * u32);
}

// Whether products of two f16 values run on the bf16x3 way here
// (core/gemm.hpp: auto on a CPU whose oneDNN bf16 matmul runs on AMX).
inline bool f16_products_bf16x3() { return f16_gemm_current().rfind("bf16x3", 0) == 0; }
// The relative bound of a float32 sum of n products of two 16-bit values as
// the library's projections compute it: γ_n (exact products, float32 sums,
// any order); for f16 on the bf16x3 way, 3n exact products of the pieces,
// whose sizes are at most (1 + 2^-7)² those of the values (|hi| + |lo| <=
// (1 + 2^-7)|x|), plus the dropped Al·Bl, at most 2^-16 of the sizes. (The
// bf16 matmul's flushed denormals add at most 3n·2^-126 in absolute terms,
// far below every other term here.) A bound for sums the library runs
// otherwise too, since it exceeds γ_n.
template <class E>
double product_gamma(double n) {
  if constexpr (std::is_same_v<E, float16>) {
    if (f16_products_bf16x3()) return gamma32(3 * n) * (1 + 0x1p-7) * (1 + 0x1p-7) + 0x1p-16;
  }
  return gamma32(n);
}

enum class Way { Fma, Pair };
// Whether bf16 attention may run on the matmul way now
// (narrow_attention_current: forced, or auto on AMX for calls of at least
// 128 query rows). Its weights are rounded to bf16 before PV, as the pair
// way's are, with the same flushes (src/kernels/narrow_matmul.cpp): the
// pair way's terms bound it.
inline bool matmul_way_possible() { return narrow_attention_current().rfind("matmul", 0) == 0; }
// The way the bf16 kernel runs now (auto, MULTIHEAD_BF16_DOT or forced),
// for the bound: Pair where the pair way or the matmul way may run.
inline Way current_way() {
  return bf16_dot_current().rfind("dpbf16", 0) == 0 || matmul_way_possible() ? Way::Pair : Way::Fma;
}
// The way a forward in E runs now: float16 has one way.
template <class E>
Way current_way_of() {
  return std::is_same_v<E, bfloat16> ? current_way() : Way::Fma;
}

// Value and error bound of a (len, B, E) intermediate, seq-first.
struct Traced {
  oracle::Array<double> value, error;
};

// One attention slice's forward, traced: the float64 values and the bounds
// above, from operands that carry their own error bounds (projections in
// the module; exact inputs in scaled_dot_product_attention). Rows are
// [L][D] (q, o) and [S'][D] (k, v); the scores' mask [L][S'] is additive
// (−inf hides); keep [L][S'] the dropout factors k_ij (0 or 1/(1 − p);
// 1 without dropout).
struct SliceTrace {
  int64_t L = 0, St = 0, D = 0;
  double scale = 1;
  std::vector<double> q, eq, k, ek, v, ev, mask, keep;
  bool pair_way = false;  // the bf16 pair way's terms (above)
  // Logit soft-cap c > 0 (0: none): the score is c·tanh(x / c) + mask, x =
  // scale·<q, k>. The cap is 1-Lipschitz, so x's bound carries over, plus
  // its float32 evaluation (x / c, Highway's Tanh within 4 ulp, c·t):
  // 8·u32·|x|. Filled then: slope_ij = 1 − tanh²(x / c) and its bound
  // (|d slope / dx| <= 2 / c, and the float32 evaluation), for the backward.
  double softcap = 0;
  std::vector<double> slope, eslope;
  // Float32 additions beyond the dot product's D − 1, the scale and the
  // mask's (ALiBi's bias: 1): γ_{D+2+extra_adds}.
  int extra_adds = 0;
  // Filled by trace_slice_forward: p_ij (before dropout), [L][S']; ε_i, the
  // bound on |p̂_ij − p_ij| / p_ij: exp(2 max_j e_s,ij + γ_{2S'+8}) − 1
  // (each p_ij = exp(s_ij − lse_i), both within max_j e_s plus the float32
  // exp and sum; the mean value theorem gives the exp); o, eo [L][D], with
  // eo including o's rounding to 16 bits.
  std::vector<double> p, eps, o, eo;
};

inline void trace_slice_forward(SliceTrace& t, double u) {
  const int64_t L = t.L, St = t.St, D = t.D;
  const auto at = [&](int64_t i, int64_t j) { return static_cast<std::size_t>(i * St + j); };
  const auto qd = [&](int64_t i, int64_t d) { return static_cast<std::size_t>(i * D + d); };
  t.p.assign(static_cast<std::size_t>(L * St), 0.0);
  t.eps.assign(static_cast<std::size_t>(L), 0.0);
  t.o.assign(static_cast<std::size_t>(L * D), 0.0);
  t.eo.assign(t.o.size(), 0.0);
  if (t.softcap > 0) {
    t.slope.assign(static_cast<std::size_t>(L * St), 0.0);
    t.eslope.assign(t.slope.size(), 0.0);
  }
  std::vector<double> s(static_cast<std::size_t>(St)), es(s.size());
  const double flush = std::ldexp(1.0, -126);
  for (int64_t i = 0; i < L; ++i) {
    double smax = -INFINITY, es_max = 0;
    for (int64_t j = 0; j < St; ++j) {
      double dot = 0, dot_abs = 0, e = 0;
      for (int64_t d = 0; d < D; ++d) {
        const double q = t.q[qd(i, d)], eq = t.eq[qd(i, d)], k = t.k[qd(j, d)], ek = t.ek[qd(j, d)];
        dot += q * k;
        dot_abs += std::abs(q * k);
        e += std::abs(q) * ek + eq * std::abs(k) + eq * ek;
      }
      const double m = t.mask[at(i, j)], x = t.scale * dot;
      const double capped = t.softcap > 0 ? t.softcap * std::tanh(x / t.softcap) : x;
      s[static_cast<std::size_t>(j)] = capped + m;
      es[static_cast<std::size_t>(j)] =
          t.scale * e +
          gamma32(static_cast<double>(D + 2 + t.extra_adds)) * (t.scale * dot_abs + (std::isfinite(m) ? std::abs(m) : 0.0)) +
          (t.pair_way ? t.scale * static_cast<double>(D) * flush : 0.0);
      if (t.softcap > 0) {
        const double ex = es[static_cast<std::size_t>(j)], th = std::tanh(x / t.softcap);
        es[static_cast<std::size_t>(j)] += 8 * std::ldexp(1.0, -24) * std::abs(x);
        t.slope[at(i, j)] = 1 - th * th;
        t.eslope[at(i, j)] = 2 * ex / t.softcap + 8 * std::ldexp(1.0, -24);
      }
      smax = std::max(smax, s[static_cast<std::size_t>(j)]);
      if (std::isfinite(m)) es_max = std::max(es_max, es[static_cast<std::size_t>(j)]);
    }
    if (smax == -INFINITY) continue;  // every key hidden: p, o and their errors are 0 (MaskedRowPolicy::Zeros)
    t.eps[static_cast<std::size_t>(i)] = std::expm1(2 * es_max + gamma32(static_cast<double>(2 * St + 8)));
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - smax));  // now p_ij·sum
    for (int64_t j = 0; j < St; ++j) t.p[at(i, j)] = s[static_cast<std::size_t>(j)] / sum;
    // o_i = Σ_j k_ij p_ij v_j; with Δp_ij = p_ij (Δs_ij − Σ_l p_il Δs_il),
    // Δo_i = Σ_j p_ij Δs_ij (k_ij v_j − o_i) to first order.
    for (int64_t d = 0; d < D; ++d) {
      double o = 0;
      for (int64_t j = 0; j < St; ++j) o += t.keep[at(i, j)] * t.p[at(i, j)] * t.v[qd(j, d)];
      double first = 0, values = 0, sizes = 0, all_sizes = 0;
      for (int64_t j = 0; j < St; ++j) {
        const double pj = t.p[at(i, j)], kj = t.keep[at(i, j)], vj = t.v[qd(j, d)];
        all_sizes += std::abs(vj);
        if (pj == 0) continue;
        first += pj * es[static_cast<std::size_t>(j)] * std::abs(kj * vj - o);
        values += kj * pj * t.ev[qd(j, d)];
        sizes += kj * pj * std::abs(vj);
      }
      t.o[qd(i, d)] = o;
      t.eo[qd(i, d)] = std::exp(2 * es_max) * first + values + gamma32(static_cast<double>(2 * St + 8)) * sizes +
                       u * std::abs(o) + (t.pair_way ? u * sizes + flush * all_sizes : 0.0);
    }
  }
}

// The forward's float64 intermediates and their error bounds (the steps
// above), what error_bound returns and the backward's bound starts from.
// Seq-first (len, B, width) throughout, as the oracle's first step.
struct ForwardTrace {
  int64_t L = 0, B = 0, S = 0, St = 0, E = 0, H = 0, D = 0, Ek = 0, Ev = 0;
  bool unbatched = false, batch_first = false;
  oracle::Array<double> xq, xk, xv;  // the inputs, (len, B, width)
  Traced Q, K, V;                    // the projections, (len, B, E)
  std::vector<SliceTrace> slices;    // n = b·H + h
  Traced O;                          // the merged heads before out_projection, (L, B, E)
  std::vector<double> output_bound;  // the caller's layout
  std::vector<double> output_value;  // the float64 output, the caller's layout
  // (len, B, width) index -> the caller's layout.
  std::size_t caller(int64_t l, int64_t b, int64_t w, int64_t len, int64_t width) const {
    return static_cast<std::size_t>(batch_first && !unbatched ? (b * len + l) * width + w : (l * B + b) * width + w);
  }
};

inline oracle::Array<double> absolute(oracle::Array<double> a) {
  for (double& x : a.v) x = std::abs(x);
  return a;
}

// (len, B, width), as the oracle's first step.
inline oracle::Array<double> seq_first(const oracle::Array<double>& x, bool batch_first) {
  if (x.dim() == 2) return oracle::step::unsqueeze(x, 1);
  return batch_first ? oracle::step::transpose01(x) : x;
}

// `keep`: the keep factors k_ij, [(b·H + h)·L + i][S'] (dropout; null: 1).
template <class E>
ForwardTrace forward_trace(const Problem& p, const std::vector<double>* keep = nullptr,
                           Way way = current_way_of<E>()) {
  using oracle::Array;
  const double u = unit_roundoff(compute_dtype_of<E>());
  const oracle::Config& c = p.config;
  ForwardTrace t;
  t.E = c.E;
  t.H = c.H;
  t.D = c.E / c.H;
  t.Ek = c.Ek();
  t.Ev = c.Ev();
  const int64_t E_ = t.E, H = t.H, D = t.D, Ek = t.Ek, Ev = t.Ev;
  t.unbatched = p.call.query.dim() == 2;
  t.batch_first = c.batch_first;
  t.xq = seq_first(p.call.query, c.batch_first);
  t.xk = seq_first(p.call.key, c.batch_first);
  t.xv = seq_first(p.call.value, c.batch_first);
  const int64_t L = t.L = t.xq.size(0), B = t.B = t.xq.size(1), S = t.S = t.xk.size(0);
  const int64_t St = t.St = S + c.add_bias_kv + c.add_zero_attn;
  const bool packed = Ek == E_ && Ev == E_;
  const Array<double>* bias = c.bias ? &p.params.in_proj_bias : nullptr;
  const Array<double> bias_abs = c.bias ? absolute(p.params.in_proj_bias) : Array<double>();
  auto project = [&](const Array<double>& x, const Array<double>& w_sep, int64_t r0, int64_t in) {
    const Array<double>& W = packed ? p.params.in_proj_weight : w_sep;
    const int64_t row0 = packed ? r0 : 0;
    Array<double> value = oracle::step::linear<double>(x, W, row0, E_, nullptr);
    Array<double> sums = oracle::step::linear<double>(absolute(x), absolute(W), row0, E_, nullptr);
    const int64_t rows = static_cast<int64_t>(value.v.size()) / E_;
    Array<double> error(value.shape);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t e = 0; e < E_; ++e) {
        const std::size_t i = static_cast<std::size_t>(r * E_ + e);
        if (bias) {
          value.v[i] += bias->v[static_cast<std::size_t>(r0 + e)];
          sums.v[i] += bias_abs.v[static_cast<std::size_t>(r0 + e)];
        }
        error.v[i] = u * std::abs(value.v[i]) + product_gamma<E>(static_cast<double>(in + 1)) * sums.v[i];
      }
    return Traced{value, error};
  };
  t.Q = project(t.xq, p.params.q_proj_weight, 0, E_);
  t.K = project(t.xk, p.params.k_proj_weight, E_, Ek);
  t.V = project(t.xv, p.params.v_proj_weight, 2 * E_, Ev);
  const int64_t shift = p.bottom_right ? S - L : 0;  // causal: query i sees key j <= i + shift
  const std::vector<double> slopes = p.alibi ? alibi_slopes_paper(H) : std::vector<double>();
  // Additive mask of (b, h, i, j): the caller's attn_mask, key padding, causal.
  auto mask_at = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    if (j >= S) return 0.0;
    double m = 0;
    const oracle::MaskArg<double>& am = p.call.attn_mask;
    if (am.kind != MaskKind::None) {
      const bool three = am.shape().size() == 3;
      const std::size_t at = static_cast<std::size_t>(((three ? b * H + h : 0) * L + i) * S + j);
      m += am.kind == MaskKind::Bool ? (am.bools.v[at] ? -INFINITY : 0.0) : am.floats.v[at];
    }
    const oracle::MaskArg<double>& kp = p.call.key_padding_mask;
    if (kp.kind != MaskKind::None) {
      const std::size_t at = static_cast<std::size_t>(b * S + j);
      m += kp.kind == MaskKind::Bool ? (kp.bools.v[at] ? -INFINITY : 0.0) : kp.floats.v[at];
    }
    if (p.call.is_causal && j > i + shift) m = -INFINITY;
    // The window: position i + shift sees keys (p − w, p] when causal, (p − w, p + w) when not.
    const int64_t pos = i + shift;
    if (p.window > 0 && !(j > pos - p.window && (p.call.is_causal || j < pos + p.window))) m = -INFINITY;
    if (p.alibi) m += -slopes[static_cast<std::size_t>(h)] * static_cast<double>(std::abs(pos - j));
    return m;
  };
  // Key row j < S of batch b is projected; row S is bias_k (exact) with
  // add_bias_kv; the zero-attention row is 0.
  auto key_row = [&](const Traced& P, const Array<double>& extra, int64_t j, int64_t b, int64_t e, bool err) {
    if (j < S) return (err ? P.error : P.value).v[static_cast<std::size_t>((j * B + b) * E_ + e)];
    if (c.add_bias_kv && j == S) return err ? 0.0 : extra.v[static_cast<std::size_t>(e)];
    return 0.0;
  };
  t.O = Traced{Array<double>({L, B, E_}), Array<double>({L, B, E_})};
  t.slices.resize(static_cast<std::size_t>(B * H));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      SliceTrace& s = t.slices[static_cast<std::size_t>(b * H + h)];
      s.L = L;
      s.St = St;
      s.D = D;
      s.scale = 1.0 / std::sqrt(static_cast<double>(D));
      for (auto* v : {&s.q, &s.eq}) v->resize(static_cast<std::size_t>(L * D));
      for (auto* v : {&s.k, &s.ek, &s.v, &s.ev}) v->resize(static_cast<std::size_t>(St * D));
      for (int64_t i = 0; i < L; ++i)
        for (int64_t d = 0; d < D; ++d) {
          const std::size_t from = static_cast<std::size_t>((i * B + b) * E_ + h * D + d), to = static_cast<std::size_t>(i * D + d);
          s.q[to] = t.Q.value.v[from];
          s.eq[to] = t.Q.error.v[from];
        }
      for (int64_t j = 0; j < St; ++j)
        for (int64_t d = 0; d < D; ++d) {
          const std::size_t to = static_cast<std::size_t>(j * D + d);
          s.k[to] = key_row(t.K, p.params.bias_k, j, b, h * D + d, false);
          s.ek[to] = key_row(t.K, p.params.bias_k, j, b, h * D + d, true);
          s.v[to] = key_row(t.V, p.params.bias_v, j, b, h * D + d, false);
          s.ev[to] = key_row(t.V, p.params.bias_v, j, b, h * D + d, true);
        }
      s.mask.resize(static_cast<std::size_t>(L * St));
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < St; ++j) s.mask[static_cast<std::size_t>(i * St + j)] = mask_at(b, h, i, j);
      const std::size_t k0 = static_cast<std::size_t>((b * H + h) * L * St);
      s.keep = keep ? std::vector<double>(keep->begin() + static_cast<std::ptrdiff_t>(k0),
                                          keep->begin() + static_cast<std::ptrdiff_t>(k0 + s.mask.size()))
                    : std::vector<double>(s.mask.size(), 1.0);
      s.pair_way = way == Way::Pair;
      s.softcap = p.softcap;
      s.extra_adds = p.alibi ? 1 : 0;
      trace_slice_forward(s, u);
      for (int64_t i = 0; i < L; ++i)
        for (int64_t d = 0; d < D; ++d) {
          const std::size_t to = static_cast<std::size_t>((i * B + b) * E_ + h * D + d), from = static_cast<std::size_t>(i * D + d);
          t.O.value.v[to] = s.o[from];
          t.O.error.v[to] = s.eo[from];
        }
    }
  // out_projection, then back to the caller's layout.
  const Array<double>& Wo = p.params.out_proj_weight;
  t.output_bound.assign(static_cast<std::size_t>(L * B * E_), 0.0);
  t.output_value.assign(t.output_bound.size(), 0.0);
  for (int64_t i = 0; i < L; ++i)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t e = 0; e < E_; ++e) {
        double y = c.bias ? p.params.out_proj_bias.v[static_cast<std::size_t>(e)] : 0.0;
        double sums = c.bias ? std::abs(y) : 0.0, prop = 0;
        for (int64_t k = 0; k < E_; ++k) {
          const std::size_t at = static_cast<std::size_t>((i * B + b) * E_ + k);
          const double w = Wo.v[static_cast<std::size_t>(e * E_ + k)];
          y += t.O.value.v[at] * w;
          sums += std::abs(t.O.value.v[at] * w);
          prop += std::abs(w) * t.O.error.v[at];
        }
        const double ey = prop + product_gamma<E>(static_cast<double>(E_ + 1)) * sums + u * std::abs(y);
        t.output_bound[t.caller(i, b, e, L, E_)] = 1.05 * ey;
        t.output_value[t.caller(i, b, e, L, E_)] = y;
      }
  return t;
}

// Per-element bound, in the caller's layout of the output.
template <class E>
std::vector<double> error_bound(const Problem& p, Way way = current_way_of<E>()) {
  return forward_trace<E>(p, nullptr, way).output_bound;
}


// ---- the library's side -----------------------------------------------------

// tensor_of, mask_of: tests/oracle/library_side.hpp (shared with the oracle test).
using library_side::mask_of;
using library_side::tensor_of;

inline MultiheadAttentionConfig config_of(const Problem& p) {
  MultiheadAttentionConfig cfg = library_side::config_of(p.config);
  cfg.dropout = p.dropout;
  return cfg;
}

// The problem's parameters as element type T (the 16-bit numbers, exactly).
template <class T>
MultiheadAttentionParameters<T> parameters_of(const Problem& p) {
  return library_side::parameters_of<T>(p.params);
}

// A call's masks (owned) and options, for a module with mask type T.
template <class T>
struct CallOptions {
  std::unique_ptr<Mask<T>> attn, kpm;
  ForwardOptions<T> options;
  explicit CallOptions(const Problem& p)
      : attn(mask_of<T>(p.call.attn_mask)), kpm(mask_of<T>(p.call.key_padding_mask)) {
    options.attn_mask = attn.get();
    options.key_padding_mask = kpm.get();
    options.need_weights = false;
    options.attention.is_causal = p.call.is_causal;
    options.attention.causal_alignment = p.bottom_right ? CausalAlignment::BottomRight : CausalAlignment::TopLeft;
    options.training = p.dropout > 0;
    options.attention.dropout_seed = p.dropout_seed;
    if (p.window > 0) options.attention.window = p.window;
    if (p.softcap > 0) options.attention.softcap = p.softcap;
    options.alibi = p.alibi;
  }
};

template <class E>
Tensor<E> run_library(const Problem& p) {
  const NarrowMultiheadAttention<E> mha(config_of(p), parameters_of<E>(p));
  const CallOptions<float> o(p);
  return mha.forward(tensor_of<E>(p.call.query), tensor_of<E>(p.call.key), tensor_of<E>(p.call.value), o.options);
}

template <class E>
std::vector<double> widened(const Tensor<E>& t) {
  std::vector<double> r(static_cast<std::size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) r[static_cast<std::size_t>(i)] = to_float(t[i]);
  return r;
}

// max_i |got_i − want_i|, with the first index where it exceeds `bound`.
struct Verdict {
  bool ok = true;
  double max_error = 0;
  double worst = 0;  // max_i error_i / bound_i
  std::string message;
};
inline Verdict compare(const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& bounds) {
  Verdict v;
  if (got.size() != want.size()) {
    v.ok = false;
    v.message = "size " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
    return v;
  }
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = std::isfinite(got[i]) ? std::abs(got[i] - want[i]) : INFINITY, bound = bounds[i];
    v.max_error = std::max(v.max_error, err);
    v.worst = std::max(v.worst, err / bound);
    if (!(err <= bound) && v.ok) {
      v.ok = false;
      char b[200];
      std::snprintf(b, sizeof b, "output[%zu]: library %.9g, oracle %.9g, error %.3g > bound %.3g", i, got[i], want[i],
                    err, bound);
      v.message = b;
    }
  }
  return v;
}


// ---- PyTorch: the dump of a case (test_precision.cpp says how it is used) --

inline const char* torch_dir() { return std::getenv("MULTIHEAD_PRECISION_TORCH_DIR"); }
inline bool torch_case(const Case& c) { return c.kpm != MaskKind::Float; }

inline void write_array(std::ostream& os, const char* name, const std::vector<int64_t>& shape, const std::vector<double>& v) {
  os << "\"" << name << "\": {\"shape\": [";
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "], \"data\": [";
  char b[32];
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::snprintf(b, sizeof b, "%.9g", v[i]);
    os << (i ? ", " : "") << b;
  }
  os << "]}, ";
}

// With d_output (the backward's cases): also d_output, and the gradient
// names in the order torch_bf16.py writes them.
inline void write_case(const std::string& path, const std::string& name, const Problem& p,
                       const oracle::Array<double>* d_output = nullptr,
                       const std::vector<std::string>& gradient_names = {}) {
  std::ofstream os(path);
  const oracle::Config& k = p.config;
  os << "{\"name\": \"" << name << "\", \"E\": " << k.E << ", \"H\": " << k.H << ", \"kdim\": " << k.Ek()
     << ", \"vdim\": " << k.Ev() << ", \"bias\": " << (k.bias ? "true" : "false")
     << ", \"add_bias_kv\": " << (k.add_bias_kv ? "true" : "false")
     << ", \"add_zero_attn\": " << (k.add_zero_attn ? "true" : "false")
     << ", \"batch_first\": " << (k.batch_first ? "true" : "false") << ", \"causal\": " << (p.call.is_causal ? "true" : "false")
     << ", \"bottom_right\": " << (p.bottom_right ? "true" : "false") << ", ";
  if (d_output) write_array(os, "d_output", d_output->shape, d_output->v);
  if (!gradient_names.empty()) {
    os << "\"gradient_names\": [";
    for (std::size_t i = 0; i < gradient_names.size(); ++i) os << (i ? ", " : "") << "\"" << gradient_names[i] << "\"";
    os << "], ";
  }
  const oracle::Params<double>& q = p.params;
  const std::pair<const char*, const oracle::Array<double>*> params[] = {
      {"in_proj_weight", &q.in_proj_weight}, {"q_proj_weight", &q.q_proj_weight}, {"k_proj_weight", &q.k_proj_weight},
      {"v_proj_weight", &q.v_proj_weight},   {"in_proj_bias", &q.in_proj_bias},   {"out_proj.weight", &q.out_proj_weight},
      {"out_proj.bias", &q.out_proj_bias},   {"bias_k", &q.bias_k},               {"bias_v", &q.bias_v}};
  for (const auto& [name, a] : params)
    if (!a->shape.empty()) write_array(os, name, a->shape, a->v);
  write_array(os, "query", p.call.query.shape, p.call.query.v);
  write_array(os, "key", p.call.key.shape, p.call.key.v);
  write_array(os, "value", p.call.value.shape, p.call.value.v);
  for (const auto& [name, m] : {std::pair{"attn_mask", &p.call.attn_mask}, std::pair{"key_padding_mask", &p.call.key_padding_mask}}) {
    if (m->kind == MaskKind::None) continue;
    if (m->kind == MaskKind::Bool) {
      write_array(os, (std::string(name) + "_bool").c_str(), m->bools.shape,
                  std::vector<double>(m->bools.v.begin(), m->bools.v.end()));
    } else {
      write_array(os, (std::string(name) + "_float").c_str(), m->floats.shape, m->floats.v);
    }
  }
  os << "\"end\": 0}\n";
}

// A case's error against the oracle: max |got − want| and the root mean
// square. The comparison with PyTorch uses the RMS: on outputs of 80
// elements the max is one element's rounding, which either side can win by
// half an ulp of the output (docs/precision.md gives both).
struct ErrorStats {
  double max = 0, rms = 0;
};
inline ErrorStats error_of(const std::vector<double>& got, const std::vector<double>& want) {
  ErrorStats e;
  for (std::size_t k = 0; k < want.size(); ++k) {
    const double d = std::abs(got[k] - want[k]);
    e.max = std::max(e.max, d);
    e.rms += d * d;
  }
  e.rms = std::sqrt(e.rms / static_cast<double>(std::max<std::size_t>(want.size(), 1)));
  return e;
}

// A table case's score rules as AttentionOptions (0 and an empty list:
// unset).
inline AttentionOptions rule_options(bool causal, bool bottom_right, int64_t window, double softcap, double scale,
                                     std::vector<double> alibi_slopes) {
  AttentionOptions o;
  o.is_causal = causal;
  o.causal_alignment = bottom_right ? CausalAlignment::BottomRight : CausalAlignment::TopLeft;
  if (window > 0) o.window = window;
  if (softcap > 0) o.softcap = softcap;
  if (scale > 0) o.scale = scale;
  o.alibi_slopes = std::move(alibi_slopes);
  return o;
}

// narrow_attention_force(way) for a scope, lifted on the way out (a failed
// ASSERT's too), so that no later test runs under it.
struct ForcedNarrowAttention {
  explicit ForcedNarrowAttention(const char* way) { narrow_attention_force(way); }
  ~ForcedNarrowAttention() { narrow_attention_force(""); }
  ForcedNarrowAttention(const ForcedNarrowAttention&) = delete;
  ForcedNarrowAttention& operator=(const ForcedNarrowAttention&) = delete;
};

}  // namespace multihead::precision
