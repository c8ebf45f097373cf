// tests/precision/test_precision.cpp: the bf16 and f16 forwards
// (NarrowMultiheadAttention, the 16-bit scaled_dot_product_attention)
// against the independent float64 oracle of tests/oracle/mha_oracle.hpp, on
// 240 configurations drawn from the tables below, each error checked
// against a bound derived from the unit roundoff and the reduction lengths
// (error_bound below; docs/precision.md). Both sides see the same numbers:
// inputs, parameters and float masks are drawn in float64 and rounded to the
// 16-bit type first. Public headers only (tests/CMakeLists.txt).
//
// PrecisionTorch.* compare with PyTorch 1.13's own bf16 module on the same
// cases (tests/precision/torch_bf16.py runs them: ctest precision_torch).
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

#include "oracle/mha_oracle.hpp"
#include "multihead/attention.hpp"
#include "multihead/error.hpp"
#include "multihead/narrow.hpp"
#include "multihead/narrow_multihead_attention.hpp"
#include "multihead/runtime.hpp"

namespace multihead {
namespace {

using oracle::MaskKind;
enum class Layout { SeqFirst, BatchFirst, Unbatched };
enum class AttnMask { None, Bool2D, Float2D, Bool3D, Float3D };

// ---- the cases: a shape row, then the variants, chosen per case index ------

struct ShapeRow {
  int64_t E, H, B, L, S, kdim, vdim;
};
// D = E / H from 1 to 32; S across the flash kernel's key tile (126 keys on
// AVX-512: 125, 126, 130) and the query tile (64 rows: L = 63, 65).
const ShapeRow kShapes[] = {
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

constexpr int kCaseCount = 240;

// Case i: shape row i mod 10, the variants drawn from a generator seeded
// with i (so a case's name, and its numbers, do not depend on the others).
Case case_at(int i) {
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
};

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
// error_bound(p, Way::Pair) adds these terms.
enum class Way { Fma, Pair };
// The way the bf16 kernel runs now (auto, MULTIHEAD_BF16_DOT or forced).
Way current_way() { return bf16_dot_current().rfind("dpbf16", 0) == 0 ? Way::Pair : Way::Fma; }
double gamma32(double n) {
  const double u32 = std::ldexp(1.0, -24);
  return n * u32 / (1 - n * u32);
}

// Per-element bound, in the caller's layout of the output.
template <class E>
std::vector<double> error_bound(const Problem& p, Way way = Way::Fma) {
  const bool pair_way = way == Way::Pair;
  const double flush = std::ldexp(1.0, -126);
  using oracle::Array;
  const double u = unit_roundoff(compute_dtype_of<E>());
  const oracle::Config& c = p.config;
  const int64_t E_ = c.E, H = c.H, D = E_ / H, Ek = c.Ek(), Ev = c.Ev();
  const bool unbatched = p.call.query.dim() == 2;
  // (len, B, width), as the oracle's first step.
  auto seq_first = [&](const Array<double>& x) {
    if (unbatched) return oracle::step::unsqueeze(x, 1);
    return c.batch_first ? oracle::step::transpose01(x) : x;
  };
  const Array<double> xq = seq_first(p.call.query), xk = seq_first(p.call.key), xv = seq_first(p.call.value);
  const int64_t L = xq.size(0), B = xq.size(1), S = xk.size(0);
  const int64_t St = S + c.add_bias_kv + c.add_zero_attn;
  auto absolute = [](Array<double> a) {
    for (double& x : a.v) x = std::abs(x);
    return a;
  };
  const bool packed = Ek == E_ && Ev == E_;
  const Array<double>* bias = c.bias ? &p.params.in_proj_bias : nullptr;
  const Array<double> bias_abs = c.bias ? absolute(p.params.in_proj_bias) : Array<double>();
  // value and error of a projection, (len, B, E).
  struct Projected {
    Array<double> value, error;
  };
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
        error.v[i] = u * std::abs(value.v[i]) + gamma32(static_cast<double>(in + 1)) * sums.v[i];
      }
    return Projected{value, error};
  };
  const Projected Q = project(xq, p.params.q_proj_weight, 0, E_);
  const Projected K = project(xk, p.params.k_proj_weight, E_, Ek);
  const Projected V = project(xv, p.params.v_proj_weight, 2 * E_, Ev);
  // Key row j of batch b, column e: projected, bias_k, or the zero key.
  auto key_at = [&](const Projected& P, const Array<double>* extra, int64_t j, int64_t b, int64_t e, bool err) {
    if (j < S) return (err ? P.error : P.value).v[static_cast<std::size_t>((j * B + b) * E_ + e)];
    if (c.add_bias_kv && j == S) return err ? 0.0 : extra->v[static_cast<std::size_t>(e)];
    return 0.0;
  };
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
    if (p.call.is_causal && j > i) m = -INFINITY;
    return m;
  };
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Array<double> O({L, B, E_}), eO({L, B, E_});
  std::vector<double> s(static_cast<std::size_t>(St)), es(s.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        double smax = -INFINITY, es_max = 0;
        for (int64_t j = 0; j < St; ++j) {
          double dot = 0, dot_abs = 0, e = 0;
          for (int64_t d = h * D; d < (h + 1) * D; ++d) {
            const double q = Q.value.v[static_cast<std::size_t>((i * B + b) * E_ + d)];
            const double eq = Q.error.v[static_cast<std::size_t>((i * B + b) * E_ + d)];
            const double k = key_at(K, &p.params.bias_k, j, b, d, false), ek = key_at(K, &p.params.bias_k, j, b, d, true);
            dot += q * k;
            dot_abs += std::abs(q * k);
            e += std::abs(q) * ek + eq * std::abs(k) + eq * ek;
          }
          const double m = mask_at(b, h, i, j);
          s[static_cast<std::size_t>(j)] = scale * dot + m;
          es[static_cast<std::size_t>(j)] =
              scale * e + gamma32(static_cast<double>(D + 2)) * (scale * dot_abs + (std::isfinite(m) ? std::abs(m) : 0.0)) +
              (pair_way ? scale * static_cast<double>(D) * flush : 0.0);
          smax = std::max(smax, s[static_cast<std::size_t>(j)]);
          if (std::isfinite(m)) es_max = std::max(es_max, es[static_cast<std::size_t>(j)]);
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - smax));  // now p_ij·sum
        for (int64_t d = h * D; d < (h + 1) * D; ++d) {
          double o = 0;
          for (int64_t j = 0; j < St; ++j) o += s[static_cast<std::size_t>(j)] / sum * key_at(V, &p.params.bias_v, j, b, d, false);
          double first = 0, values = 0, sizes = 0, all_sizes = 0;
          for (int64_t j = 0; j < St; ++j) {
            const double pj = s[static_cast<std::size_t>(j)] / sum, vj = key_at(V, &p.params.bias_v, j, b, d, false);
            all_sizes += std::abs(vj);
            if (pj == 0) continue;
            first += pj * es[static_cast<std::size_t>(j)] * std::abs(vj - o);
            values += pj * key_at(V, &p.params.bias_v, j, b, d, true);
            sizes += pj * std::abs(vj);
          }
          const std::size_t at = static_cast<std::size_t>((i * B + b) * E_ + d);
          O.v[at] = o;
          eO.v[at] = std::exp(2 * es_max) * first + values + gamma32(static_cast<double>(2 * St + 8)) * sizes +
                     u * std::abs(o) + (pair_way ? u * sizes + flush * all_sizes : 0.0);
        }
      }
  // out_projection, then back to the caller's layout.
  const Array<double>& Wo = p.params.out_proj_weight;
  std::vector<double> bound(static_cast<std::size_t>(L * B * E_));
  for (int64_t i = 0; i < L; ++i)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t e = 0; e < E_; ++e) {
        double y = c.bias ? p.params.out_proj_bias.v[static_cast<std::size_t>(e)] : 0.0;
        double sums = c.bias ? std::abs(y) : 0.0, prop = 0;
        for (int64_t k = 0; k < E_; ++k) {
          const std::size_t at = static_cast<std::size_t>((i * B + b) * E_ + k);
          const double w = Wo.v[static_cast<std::size_t>(e * E_ + k)];
          y += O.v[at] * w;
          sums += std::abs(O.v[at] * w);
          prop += std::abs(w) * eO.v[at];
        }
        const double ey = prop + gamma32(static_cast<double>(E_ + 1)) * sums + u * std::abs(y);
        // caller's layout: (L, B, E), (B, L, E) or (L, E)
        const int64_t out = c.batch_first && !unbatched ? (b * L + i) * E_ + e : (i * B + b) * E_ + e;
        bound[static_cast<std::size_t>(out)] = 1.05 * ey;
      }
  return bound;
}

// ---- the library's side -----------------------------------------------------

template <class T, class U>
Tensor<T> tensor_of(const oracle::Array<U>& a) {
  Tensor<T> t(Shape(a.shape.begin(), a.shape.end()));
  for (std::size_t i = 0; i < a.v.size(); ++i) {
    if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>) {
      t[static_cast<int64_t>(i)] = narrow_from_float<T>(static_cast<float>(a.v[i]));
    } else {
      t[static_cast<int64_t>(i)] = static_cast<T>(a.v[i]);
    }
  }
  return t;
}

std::unique_ptr<Mask<float>> mask_of(const oracle::MaskArg<double>& m) {
  if (m.kind == MaskKind::None) return nullptr;
  if (m.kind == MaskKind::Bool) return std::make_unique<Mask<float>>(Mask<float>::boolean(tensor_of<uint8_t>(m.bools)));
  return std::make_unique<Mask<float>>(Mask<float>::additive(tensor_of<float>(m.floats)));
}

template <class E>
Tensor<E> run_library(const Problem& p) {
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = p.config.E;
  cfg.num_heads = p.config.H;
  cfg.kdim = p.config.kdim;
  cfg.vdim = p.config.vdim;
  cfg.bias = p.config.bias;
  cfg.add_bias_kv = p.config.add_bias_kv;
  cfg.add_zero_attn = p.config.add_zero_attn;
  cfg.batch_first = p.config.batch_first;
  MultiheadAttentionParameters<E> m;
  const oracle::Params<double>& q = p.params;
  auto set = [](Tensor<E>& dst, const oracle::Array<double>& src) {
    if (!src.shape.empty()) dst = tensor_of<E>(src);
  };
  set(m.in_proj_weight, q.in_proj_weight);
  set(m.q_proj_weight, q.q_proj_weight);
  set(m.k_proj_weight, q.k_proj_weight);
  set(m.v_proj_weight, q.v_proj_weight);
  set(m.in_proj_bias, q.in_proj_bias);
  set(m.out_proj_weight, q.out_proj_weight);
  set(m.out_proj_bias, q.out_proj_bias);
  set(m.bias_k, q.bias_k);
  set(m.bias_v, q.bias_v);
  const NarrowMultiheadAttention<E> mha(cfg, std::move(m));
  const std::unique_ptr<Mask<float>> attn = mask_of(p.call.attn_mask), kpm = mask_of(p.call.key_padding_mask);
  ForwardOptions<float> o;
  o.attn_mask = attn.get();
  o.key_padding_mask = kpm.get();
  o.need_weights = false;
  o.attention.is_causal = p.call.is_causal;
  return mha.forward(tensor_of<E>(p.call.query), tensor_of<E>(p.call.key), tensor_of<E>(p.call.value), o);
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
Verdict compare(const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& bounds) {
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

// ---- the tests --------------------------------------------------------------

class PrecisionOracle : public ::testing::TestWithParam<int> {};

template <class E>
void check_case(int i) {
  const Case c = case_at(i);
  const Problem p = make_problem<E>(c);
  const std::vector<double> want = oracle::multi_head_attention_forward(p.config, p.params, p.call).output.v;
  const std::vector<double> bound = error_bound<E>(p, std::is_same_v<E, bfloat16> ? current_way() : Way::Fma);
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
    std::vector<double> bound = error_bound<bfloat16>(p, current_way());
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
    bf16_dot_force("fma");
    const std::vector<double> fma = widened(run_library<bfloat16>(p));
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
  EXPECT_TRUE(ways_differ) << "fma and dpbf16 gave identical outputs on every case";
}

TEST(PrecisionBf16Dot, UnknownWayIsRefused) {
  try {
    bf16_dot_force("dot");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "bf16_dot_force: expected auto, fma or dpbf16, got 'dot'");
  }
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
  const double bound = 1.01 * (Av * (std::expm1(2 * es) + gamma32(static_cast<double>(2 * S + 8))) + u * Av);
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

TEST(PrecisionSdpa, BF16_N3_L70_S130_D16) { check_sdpa<bfloat16>(3, 70, 130, 16, false); }
TEST(PrecisionSdpa, BF16_N2_L65_S65_D7_causal) { check_sdpa<bfloat16>(2, 65, 65, 7, true); }
TEST(PrecisionSdpa, F16_N3_L70_S130_D16) { check_sdpa<float16>(3, 70, 130, 16, false); }
TEST(PrecisionSdpa, F16_N2_L1_S300_D64_causal) { check_sdpa<float16>(2, 1, 300, 64, true); }

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

const char* torch_dir() { return std::getenv("MULTIHEAD_PRECISION_TORCH_DIR"); }
bool torch_case(const Case& c) { return c.kpm != MaskKind::Float; }

void write_array(std::ostream& os, const char* name, const std::vector<int64_t>& shape, const std::vector<double>& v) {
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

void write_case(const std::string& path, const Case& c, const Problem& p) {
  std::ofstream os(path);
  const oracle::Config& k = p.config;
  os << "{\"name\": \"" << c.name() << "\", \"E\": " << k.E << ", \"H\": " << k.H << ", \"kdim\": " << k.Ek()
     << ", \"vdim\": " << k.Ev() << ", \"bias\": " << (k.bias ? "true" : "false")
     << ", \"add_bias_kv\": " << (k.add_bias_kv ? "true" : "false")
     << ", \"add_zero_attn\": " << (k.add_zero_attn ? "true" : "false")
     << ", \"batch_first\": " << (k.batch_first ? "true" : "false") << ", \"causal\": " << (p.call.is_causal ? "true" : "false")
     << ", ";
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
struct Error {
  double max = 0, rms = 0;
};
Error error_of(const std::vector<double>& got, const std::vector<double>& want) {
  Error e;
  for (std::size_t k = 0; k < want.size(); ++k) {
    const double d = std::abs(got[k] - want[k]);
    e.max = std::max(e.max, d);
    e.rms += d * d;
  }
  e.rms = std::sqrt(e.rms / static_cast<double>(std::max<std::size_t>(want.size(), 1)));
  return e;
}

TEST(PrecisionTorch, Dump) {
  ASSERT_NE(torch_dir(), nullptr) << "run by tests/precision/torch_bf16.py";
  for (int i = 0; i < kCaseCount; ++i) {
    const Case c = case_at(i);
    if (torch_case(c)) write_case(std::string(torch_dir()) + "/case_" + std::to_string(i) + ".json", c, make_problem<bfloat16>(c));
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
    const Error ours_err = error_of(ours, want), torch_err = error_of(theirs, want);
    const Problem p16 = make_problem<float16>(c);
    const Error ours16 = error_of(widened(run_library<float16>(p16)),
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
