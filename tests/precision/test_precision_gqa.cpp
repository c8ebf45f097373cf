// tests/precision/test_precision_gqa.cpp: the bf16 and f16 grouped-query
// module (NarrowGroupedQueryAttention<E>, multihead/narrow_grouped_query_attention.hpp)
// against float64, on 240 configurations drawn from a table, forward output
// and every gradient (x and each parameter) checked element by element
// against a bound derived from the unit roundoff and the reduction lengths
// (gqa_trace below; docs/precision.md, "Grouped-query attention in 16 bits");
// then decoding with each cache dtype, and bad input.
//
// The float64 reference is GroupedQueryAttention<double> on the same 16-bit
// numbers widened (checked against central differences and PyTorch's
// autograd elsewhere: tests/test_gqa_backward.cpp). It shares the module's
// rules (the call's checks, grouped_query_steps) and nothing of its
// arithmetic (float64 products and the materialized float64 kernel against
// the 16-bit gemm and the float32 flash kernel). The bound's own float64
// values, computed here in plain loops, must agree with the reference
// (PrecisionGqaChecker.BoundsOwnValuesAgree), which checks that the bound
// is about the right numbers (RoPE's pairs, the window, ALiBi's sign,
// dropout's keep decisions).
#include <limits>
#include <map>
#include <set>

#include "multihead/grouped_query_attention.hpp"
#include "multihead/narrow_grouped_query_attention.hpp"
#include "multihead/narrow_multihead_attention.hpp"
#include "multihead/runtime.hpp"
#include "precision/backward_bound.hpp"
#include "precision/precision_cases.hpp"

namespace multihead {
namespace {

using namespace precision;

// ---- the cases: a shape row, then the variants, chosen per case index ------

struct GqaShape {
  int64_t B, L, E, H, Hkv, D;
};
// Hkv = 1 (multi-query), a divisor, = H; D = E / H and not; L = 1, 2, odd,
// past the flash kernel's query tile (64 rows: 65) and its key tile (130).
const GqaShape kGqaShapes[] = {
    {2, 5, 8, 4, 2, 4},    {1, 17, 32, 4, 1, 8},  {2, 9, 24, 6, 6, 4},  {1, 33, 16, 4, 2, 6},
    {3, 2, 12, 3, 1, 8},   {1, 65, 32, 2, 1, 16}, {2, 1, 16, 8, 4, 2},  {1, 40, 64, 8, 2, 8},
    {2, 7, 20, 5, 5, 10},  {1, 130, 16, 2, 2, 8}, {2, 12, 48, 6, 3, 8}, {1, 3, 6, 2, 1, 3},
};
constexpr int kShapeCount = sizeof(kGqaShapes) / sizeof(kGqaShapes[0]);
constexpr int kGqaCaseCount = 240;

enum class Rope { None, Interleaved, HalfSplit };

struct GqaCase {
  GqaShape shape;
  bool bias = false, causal = true, alibi = false;
  Rope rope = Rope::None;
  int64_t window = 0;
  double softcap = 0, dropout = 0;
  std::string name() const {
    static const char* ropes[] = {"ropenone", "ropeinterleaved", "ropehalfsplit"};
    const GqaShape& s = shape;
    auto n = [](int64_t x) { return std::to_string(x); };
    return "B" + n(s.B) + "_L" + n(s.L) + "_E" + n(s.E) + "_H" + n(s.H) + "_Hkv" + n(s.Hkv) + "_D" + n(s.D) +
           (bias ? "_bias" : "_nobias") + "_" + ropes[static_cast<int>(rope)] + (causal ? "_causal" : "_nocausal") +
           "_win" + n(window) + (alibi ? "_alibi" : "_noalibi") + "_cap" + n(static_cast<int64_t>(softcap)) +
           "_drop" + n(static_cast<int64_t>(dropout * 100));
  }
};

// Case i: shape row i mod 12, the variants from a generator seeded with i.
GqaCase gqa_case_at(int i) {
  std::mt19937 rng(static_cast<unsigned>(9000 + i));
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  GqaCase c;
  c.shape = kGqaShapes[i % kShapeCount];
  c.bias = pick(2) == 0;
  c.rope = static_cast<Rope>(pick(3));
  if (c.shape.D % 2 != 0) c.rope = Rope::None;  // RoPE rotates pairs
  c.causal = pick(3) != 0;
  const int64_t windows[] = {1, 3, 8};
  c.window = pick(3) == 0 ? windows[pick(3)] : 0;
  c.alibi = pick(4) == 0;
  c.softcap = pick(4) == 0 ? 2.0 : 0.0;
  c.dropout = pick(6) == 0 ? 0.2 : 0.0;
  return c;
}

GroupedQueryAttentionConfig config_of(const GqaCase& c) {
  GroupedQueryAttentionConfig cfg;
  cfg.embed_dim = c.shape.E;
  cfg.num_heads = c.shape.H;
  cfg.num_kv_heads = c.shape.Hkv;
  cfg.head_dim = c.shape.D;
  cfg.bias = c.bias;
  cfg.causal = c.causal;
  if (c.rope != Rope::None)
    cfg.rope = RopeOptions{c.rope == Rope::Interleaved ? RopeConvention::Interleaved : RopeConvention::HalfSplit};
  return cfg;
}

// ALiBi's slopes rounded to float first: the library's kernels take float
// slopes, so both sides use the same numbers.
std::vector<double> slopes_of(const GqaCase& c) {
  std::vector<double> s = alibi_slopes(c.shape.H);
  for (double& x : s) x = static_cast<double>(static_cast<float>(x));
  return s;
}

AttentionOptions options_of(const GqaCase& c) {
  AttentionOptions o;
  if (c.window) o.window = c.window;
  if (c.softcap > 0) o.softcap = c.softcap;
  if (c.alibi) o.alibi_slopes = slopes_of(c);
  o.dropout_p = c.dropout;
  o.dropout_seed = 0x5eed + static_cast<uint64_t>(c.shape.E);
  return o;
}

// Every number rounded to E first: x N(0, 1), weights N(0, 1/in), biases
// N(0, 0.25), d_output N(0, 1).
struct GqaProblem {
  GqaCase c;
  GroupedQueryAttentionConfig config;
  GroupedQueryAttentionParameters<double> params;
  Tensor<double> x, d_output;
};

template <class E>
GqaProblem make_gqa_problem(const GqaCase& c) {
  std::mt19937_64 rng(20261203);
  std::normal_distribution<double> normal(0.0, 1.0);
  const auto fill = [&](Shape shape, double sd) {
    Tensor<double> t(std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i)
      t[i] = static_cast<double>(to_float(narrow_from_float<E>(static_cast<float>(sd * normal(rng)))));
    return t;
  };
  GqaProblem p{c, config_of(c), {}, {}, {}};
  for_each_parameter(p.config, p.params, [&](const ParameterInfo& info, Tensor<double>& t) {
    if (!info.present) return;
    t = info.shape.size() == 2 ? fill(info.shape, 1.0 / std::sqrt(static_cast<double>(info.shape[1])))
                               : fill(info.shape, 0.5);
  });
  p.x = fill({c.shape.B, c.shape.L, c.shape.E}, 1.0);
  p.d_output = fill({c.shape.B, c.shape.L, c.shape.E}, 1.0);
  return p;
}

template <class E>
Tensor<E> narrow_of(const Tensor<double>& t) {
  Tensor<E> r(t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) r[i] = narrow_from_float<E>(static_cast<float>(t[i]));  // exact
  return r;
}

template <class E>
GroupedQueryAttentionParameters<E> narrow_parameters(const GroupedQueryAttentionConfig& config,
                                                     const GroupedQueryAttentionParameters<double>& params) {
  GroupedQueryAttentionParameters<E> out;
  for_each_parameter(config, out, params, [](const ParameterInfo& info, Tensor<E>& to, const Tensor<double>& from) {
    if (info.present) to = narrow_of<E>(from);
  });
  return out;
}

template <class T>
std::vector<double> values_of(const Tensor<T>& t) {
  std::vector<double> r(static_cast<std::size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    if constexpr (std::is_same_v<T, double>) r[static_cast<std::size_t>(i)] = t[i];
    else r[static_cast<std::size_t>(i)] = to_float(t[i]);
  }
  return r;
}

// The forward output ("output") and every gradient ("x", the state_dict names).
using Values = NamedValues;

template <class T>
Values values_of(const Tensor<T>& out, const GroupedQueryAttentionGradients<T>& g) {
  Values r{{"output", values_of(out)}, {"x", values_of(g.x)}};
  for (const auto& [name, t] : g.parameters) r[name] = values_of(t);
  return r;
}

Values reference_values(const GqaProblem& p) {
  const GroupedQueryAttention<double> gqa(p.config, p.params);
  GroupedQueryForwardContext<double> ctx;
  const Tensor<double> out = gqa.forward(p.x, options_of(p.c), ctx);
  return values_of(out, gqa.backward(ctx, p.d_output));
}

template <class E>
Values library_values(const GqaProblem& p, int threads = 0) {
  const NarrowGroupedQueryAttention<E> gqa(p.config, narrow_parameters<E>(p.config, p.params));
  AttentionOptions o = options_of(p.c);
  o.num_threads = threads;
  NarrowGroupedQueryForwardContext<E> ctx;
  const Tensor<E> out = gqa.forward(narrow_of<E>(p.x), o, ctx);
  return values_of(out, gqa.backward(ctx, narrow_of<E>(p.d_output)));
}

// ---- the bound --------------------------------------------------------------
//
// Per element, first order in the roundings, from the steps of
// narrow_grouped_query_attention.hpp, evaluated on the float64
// intermediates (SliceTrace, Sum, Rounding as the MHA's:
// precision_cases.hpp, backward_bound.hpp). u the 16-bit unit roundoff, γ_n
// = n·u32/(1 − n·u32); a 16-bit rounding of x̂ within e of x adds
// u(|x| + e) + η (rounded()).
// Forward:
//   q = round(x W_qᵀ + b_q):      e_q = rounded(q, γ_{E+1}(|x||W_q|ᵀ + |b_q|)); k, v likewise
//   RoPE, pair (a, c), angle φ:   a' = a cos φ − c sin φ (c' likewise), in float32 from
//                                 the rounded a, c: e_a' = rounded(a', |cos| e_a + |sin| e_c
//                                 + γ_3(|a cos| + |c sin|))  (cos, sin rounded to float32,
//                                 two products, one sum)
//   each slice n = b·H + h over K/V head g = h / (H / Hkv): trace_slice_forward
//                                 (scores with causal, window and ALiBi as an additive
//                                 mask, the soft-cap, dropout's keep factors; its output
//                                 rounded)
//   y = round(a W_oᵀ + b_o):      e_y = rounded(y, |W_o| e_a + γ_{HD+1}(|a||W_o|ᵀ + |b_o|))
// Backward (d_output exact):
//   d_a = round(d_y W_o):         rounded(γ_E |d_y||W_o|); d_W_o = round(d_yᵀ a), d_b_o = round(Σ d_y)
//   per slice: trace_slice_backward (group G = H / Hkv: d_k, d_v are one float32 sum
//              over the group's G·L rows, γ_{GL+1}); d_k, d_v summed over the group
//   RoPE backward (Rᵀ, float32): |cos| e_da + |sin| e_dc + γ_3(|cos d_a| + |sin d_c|)
//   d_q, d_k, d_v rounded
//   d_x = round(Σ over the three projections' H·D + 2·Hkv·D columns of d_qkv W_qkv): one Sum
//   d_W_q = round(d_qᵀ x), d_b_q = round(Σ d_q), k and v likewise
// Every bound is 1.05 times this (neglected: products of two relative
// errors, as in the MHA's).

// A (rows × width) intermediate with its element bounds.
struct Block {
  int64_t rows = 0, width = 0;
  std::vector<double> value, error;
  Block() = default;
  Block(int64_t r, int64_t w)
      : rows(r), width(w), value(static_cast<std::size_t>(r * w), 0.0), error(value.size(), 0.0) {}
  double& v(int64_t r, int64_t c) { return value[static_cast<std::size_t>(r * width + c)]; }
  double& e(int64_t r, int64_t c) { return error[static_cast<std::size_t>(r * width + c)]; }
};

// Dropout's keep factors k_ij (0 or 1/(1 − p)), [(b·H + h)·L + i][L]: the
// float64 scaled_dot_product_attention's weights with dropout over those
// without, on the traced q and the K/V repeated per query head (slice
// n = b·H + h, the module's slices, so the same keep decisions).
std::vector<double> keep_factors(const GqaCase& c, const Block& q, const Block& k, const Block& v) {
  const GqaShape& s = c.shape;
  const int64_t B = s.B, L = s.L, H = s.H, Hkv = s.Hkv, D = s.D, G = H / Hkv;
  Tensor<double> qt(Shape{B, H, L, D}), kt(Shape{B, H, L, D}), vt(Shape{B, H, L, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t at = ((b * H + h) * L + i) * D + d, r = b * L + i;
          qt[at] = q.value[static_cast<std::size_t>(r * H * D + h * D + d)];
          kt[at] = k.value[static_cast<std::size_t>(r * Hkv * D + (h / G) * D + d)];
          vt[at] = v.value[static_cast<std::size_t>(r * Hkv * D + (h / G) * D + d)];
        }
  AttentionOptions o = options_of(c);
  o.is_causal = c.causal;
  o.kernel = AttentionKernel::Reference;
  if (c.alibi) {
    o.alibi_slopes.clear();
    for (int64_t b = 0; b < B; ++b)
      for (double x : slopes_of(c)) o.alibi_slopes.push_back(x);
  }
  Tensor<double> dropped, plain;
  scaled_dot_product_attention<double>(qt, kt, vt, nullptr, o, &dropped);
  o.dropout_p = 0;
  scaled_dot_product_attention<double>(qt, kt, vt, nullptr, o, &plain);
  std::vector<double> keep(static_cast<std::size_t>(plain.numel()), 1.0);
  for (int64_t x = 0; x < plain.numel(); ++x)
    keep[static_cast<std::size_t>(x)] = dropped[x] != 0 || plain[x] == 0 ? 1.0 / (1.0 - c.dropout) : 0.0;
  return keep;
}

struct GqaTrace {
  Values value, bound;  // by the names of Values
};

// y (rows × out) = x (rows × in) Wᵀ + b, x with bounds, W and b exact: the
// float32 sums before any rounding.
// bf16x3: f16 products on the bf16x3 way (backward_bound.hpp's Sum).
Block linear_trace(const Block& x, const Tensor<double>& w, const Tensor<double>* b, bool bf16x3) {
  const int64_t out = w.size(0), in = w.size(1);
  Block y(x.rows, out);
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      Sum s;
      s.bf16x3 = bf16x3;
      for (int64_t c = 0; c < in; ++c)
        s.add(x.value[static_cast<std::size_t>(r * in + c)], x.error[static_cast<std::size_t>(r * in + c)],
              w[o * in + c], 0);
      if (b) s.add((*b)[o], 0, 1, 0);
      y.v(r, o) = s.value;
      y.e(r, o) = s.bound();
    }
  return y;
}

void round_block(Block& x, const Rounding& r) {
  for (std::size_t k = 0; k < x.value.size(); ++k) x.error[k] = rounded(r, x.value[k], x.error[k]);
}

// RoPE on a (B·L, heads·D) block in place, positions 0 … L − 1: the float32
// rotation's bound (sign −1: the backward's Rᵀ).
void rope_trace(Block& x, int64_t B, int64_t L, int64_t heads, int64_t D, Rope rope, double sign) {
  const int64_t half = D / 2;
  const bool interleaved = rope == Rope::Interleaved;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t l = 0; l < L; ++l)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(l) * std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(D));
          const double cs = std::cos(angle), sn = sign * std::sin(angle);
          const int64_t r = b * L + l, ca = h * D + (interleaved ? 2 * i : i), cc = ca + (interleaved ? 1 : half);
          const double a = x.v(r, ca), c = x.v(r, cc), ea = x.e(r, ca), ec = x.e(r, cc);
          x.v(r, ca) = a * cs - c * sn;
          x.v(r, cc) = a * sn + c * cs;
          x.e(r, ca) = std::abs(cs) * ea + std::abs(sn) * ec + gamma32(3) * (std::abs(a * cs) + std::abs(c * sn));
          x.e(r, cc) = std::abs(sn) * ea + std::abs(cs) * ec + gamma32(3) * (std::abs(a * sn) + std::abs(c * cs));
        }
}

template <class E>
GqaTrace gqa_trace(const GqaProblem& p) {
  const GqaCase& c = p.c;
  const GqaShape& sh = c.shape;
  const int64_t B = sh.B, L = sh.L, E_ = sh.E, H = sh.H, Hkv = sh.Hkv, D = sh.D, G = H / Hkv, T = B * L;
  const int64_t HD = H * D, KD = Hkv * D;
  const Rounding r = rounding_of<E>();
  const double u = r.u;
  const GroupedQueryAttentionParameters<double>& w = p.params;
  const auto bias = [&](const Tensor<double>& b) { return c.bias ? &b : nullptr; };
  Block x(T, E_);
  x.value.assign(p.x.data(), p.x.data() + p.x.numel());

  // Forward: projections, RoPE, rounded.
  Block q = linear_trace(x, w.q_proj_weight, bias(w.q_proj_bias), projection_sum<E>().bf16x3);
  Block k = linear_trace(x, w.k_proj_weight, bias(w.k_proj_bias), projection_sum<E>().bf16x3);
  Block v = linear_trace(x, w.v_proj_weight, bias(w.v_proj_bias), projection_sum<E>().bf16x3);
  for (Block* blk : {&q, &k, &v}) round_block(*blk, r);
  if (c.rope != Rope::None) {
    rope_trace(q, B, L, H, D, c.rope, 1.0);
    rope_trace(k, B, L, Hkv, D, c.rope, 1.0);
    round_block(q, r);
    round_block(k, r);
  }
  const std::vector<double> keep = c.dropout > 0 ? keep_factors(c, q, k, v) : std::vector<double>();
  const std::vector<double> slopes = c.alibi ? slopes_of(c) : std::vector<double>();

  // Attention per slice.
  std::vector<SliceTrace> slices(static_cast<std::size_t>(B * H));
  Block a(T, HD);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      SliceTrace& s = slices[static_cast<std::size_t>(b * H + h)];
      const int64_t g = h / G;
      s.L = s.St = L;
      s.D = D;
      s.scale = 1.0 / std::sqrt(static_cast<double>(D));
      s.softcap = c.softcap;
      s.pair_way = current_way_of<E>() == Way::Pair;
      for (int64_t i = 0; i < L; ++i)
        for (int64_t d = 0; d < D; ++d) {
          s.q.push_back(q.v(b * L + i, h * D + d));
          s.eq.push_back(q.e(b * L + i, h * D + d));
          s.k.push_back(k.v(b * L + i, g * D + d));
          s.ek.push_back(k.e(b * L + i, g * D + d));
          s.v.push_back(v.v(b * L + i, g * D + d));
          s.ev.push_back(v.e(b * L + i, g * D + d));
        }
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < L; ++j) {
          const int64_t dist = i > j ? i - j : j - i;
          bool hidden = c.causal && j > i;
          if (c.window) hidden = hidden || (c.causal ? j <= i - c.window : dist >= c.window);
          s.mask.push_back(hidden ? -INFINITY : (c.alibi ? -slopes[static_cast<std::size_t>(h)] * static_cast<double>(dist) : 0.0));
        }
      const std::size_t k0 = static_cast<std::size_t>((b * H + h) * L * L);
      s.keep = keep.empty() ? std::vector<double>(s.mask.size(), 1.0)
                            : std::vector<double>(keep.begin() + static_cast<std::ptrdiff_t>(k0),
                                                  keep.begin() + static_cast<std::ptrdiff_t>(k0 + s.mask.size()));
      trace_slice_forward(s, u);  // its output's bound includes the rounding (u|o|)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t d = 0; d < D; ++d) {
          a.v(b * L + i, h * D + d) = s.o[static_cast<std::size_t>(i * D + d)];
          a.e(b * L + i, h * D + d) = s.eo[static_cast<std::size_t>(i * D + d)] + r.eta;
        }
    }
  GqaTrace out;
  const auto put = [&](const std::string& name, const Block& blk) {
    out.value[name] = blk.value;
    std::vector<double>& bound = out.bound[name];
    bound.resize(blk.error.size());
    for (std::size_t e = 0; e < bound.size(); ++e) bound[e] = 1.05 * blk.error[e];
  };
  Block y = linear_trace(a, w.o_proj_weight, bias(w.o_proj_bias), projection_sum<E>().bf16x3);
  round_block(y, r);
  put("output", y);

  // Backward: out_projection.
  Block dy(T, E_);
  dy.value.assign(p.d_output.data(), p.d_output.data() + p.d_output.numel());
  Block da(T, HD), dWo(E_, HD), dbo(1, E_);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t col = 0; col < HD; ++col) {
      Sum s = projection_sum<E>();
      for (int64_t e = 0; e < E_; ++e) s.add(dy.v(t, e), 0, w.o_proj_weight[e * HD + col], 0);
      da.v(t, col) = s.value;
      da.e(t, col) = rounded(r, s.value, s.bound());
    }
  for (int64_t e = 0; e < E_; ++e) {
    for (int64_t col = 0; col < HD; ++col) {
      Sum s = projection_sum<E>();
      for (int64_t t = 0; t < T; ++t) s.add(dy.v(t, e), 0, a.v(t, col), a.e(t, col));
      dWo.v(e, col) = s.value;
      dWo.e(e, col) = rounded(r, s.value, s.bound());
    }
    Sum s = projection_sum<E>();
    for (int64_t t = 0; t < T; ++t) s.add(dy.v(t, e), 0, 1, 0);
    dbo.v(0, e) = s.value;
    dbo.e(0, e) = rounded(r, s.value, s.bound());
  }
  put("o_proj.weight", dWo);
  if (c.bias) put("o_proj.bias", dbo);

  // Attention backward per slice; d_k, d_v summed over each group.
  Block dq(T, HD), dk(T, KD), dv(T, KD);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const SliceTrace& s = slices[static_cast<std::size_t>(b * H + h)];
      std::vector<double> dout, edout;
      for (int64_t i = 0; i < L; ++i)
        for (int64_t d = 0; d < D; ++d) {
          dout.push_back(da.v(b * L + i, h * D + d));
          edout.push_back(da.e(b * L + i, h * D + d));
        }
      const SliceGradients sg = trace_slice_backward(s, dout, edout, G);
      const int64_t g = h / G;
      for (int64_t i = 0; i < L; ++i)
        for (int64_t d = 0; d < D; ++d) {
          const std::size_t at = static_cast<std::size_t>(i * D + d);
          dq.v(b * L + i, h * D + d) = sg.dq[at];
          dq.e(b * L + i, h * D + d) = sg.edq[at];
          dk.v(b * L + i, g * D + d) += sg.dk[at];
          dk.e(b * L + i, g * D + d) += sg.edk[at];
          dv.v(b * L + i, g * D + d) += sg.dv[at];
          dv.e(b * L + i, g * D + d) += sg.edv[at];
        }
    }
  if (c.rope != Rope::None) {
    rope_trace(dq, B, L, H, D, c.rope, -1.0);
    rope_trace(dk, B, L, Hkv, D, c.rope, -1.0);
  }
  for (Block* blk : {&dq, &dk, &dv}) round_block(*blk, r);

  // in_projection: d_x one sum over the three; each weight's and bias's own.
  Block dx(T, E_);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t col = 0; col < E_; ++col) {
      Sum s = projection_sum<E>();
      for (const auto& [d, W] : {std::pair{&dq, &w.q_proj_weight}, std::pair{&dk, &w.k_proj_weight},
                                 std::pair{&dv, &w.v_proj_weight}})
        for (int64_t o = 0; o < d->width; ++o) s.add(d->v(t, o), d->e(t, o), (*W)[o * E_ + col], 0);
      dx.v(t, col) = s.value;
      dx.e(t, col) = rounded(r, s.value, s.bound());
    }
  put("x", dx);
  for (const auto& [d, name] : {std::pair{&dq, "q_proj"}, std::pair{&dk, "k_proj"}, std::pair{&dv, "v_proj"}}) {
    Block dW(d->width, E_), db(1, d->width);
    for (int64_t o = 0; o < d->width; ++o) {
      for (int64_t col = 0; col < E_; ++col) {
        Sum s = projection_sum<E>();
        for (int64_t t = 0; t < T; ++t) s.add(d->v(t, o), d->e(t, o), x.v(t, col), 0);
        dW.v(o, col) = s.value;
        dW.e(o, col) = rounded(r, s.value, s.bound());
      }
      Sum s = projection_sum<E>();
      for (int64_t t = 0; t < T; ++t) s.add(d->v(t, o), d->e(t, o), 1, 0);
      db.v(0, o) = s.value;
      db.e(0, o) = rounded(r, s.value, s.bound());
    }
    put(std::string(name) + ".weight", dW);
    if (c.bias) put(std::string(name) + ".bias", db);
  }
  return out;
}

// ---- the tests --------------------------------------------------------------

// Each value's largest error / its bound, by name.
using Ratios = std::map<std::string, double>;

template <class E>
Ratios check_gqa_case(int i, bool expect = true) {
  const GqaCase c = gqa_case_at(i);
  const GqaProblem p = make_gqa_problem<E>(c);
  const Values want = reference_values(p), got = library_values<E>(p);
  const GqaTrace traced = gqa_trace<E>(p);
  Ratios ratios;
  EXPECT_EQ(got.size(), want.size()) << c.name();
  for (const auto& [name, w] : want) {
    if (!got.count(name) || !traced.bound.count(name)) {
      ADD_FAILURE() << c.name() << ": " << name << " missing";
      continue;
    }
    const Verdict v = compare(got.at(name), w, traced.bound.at(name));
    ratios[name] = v.worst;
    if (expect) {
      EXPECT_TRUE(v.ok) << c.name() << " " << to_string(compute_dtype_of<E>()) << " " << name << ": " << v.message;
    }
  }
  return ratios;
}

class PrecisionGqa : public ::testing::TestWithParam<int> {};

template <class E>
void run_case(int i) {
  const Ratios ratios = check_gqa_case<E>(i);
  double forward = ratios.count("output") ? ratios.at("output") : 0, backward = 0;
  for (const auto& [name, x] : ratios)
    if (name != "output") backward = std::max(backward, x);
  ::testing::Test::RecordProperty("worst_forward", std::to_string(forward));
  ::testing::Test::RecordProperty("worst_backward", std::to_string(backward));
}

TEST_P(PrecisionGqa, BF16) { run_case<bfloat16>(GetParam()); }
TEST_P(PrecisionGqa, F16) { run_case<float16>(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Cases, PrecisionGqa, ::testing::Range(0, kGqaCaseCount),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "case" + std::to_string(info.param) + "_" + gqa_case_at(info.param).name();
                         });

// The table covers every option.
TEST(PrecisionGqaChecker, TableCoversEveryOption) {
  std::set<std::string> seen;
  for (int i = 0; i < kGqaCaseCount; ++i) {
    const GqaCase c = gqa_case_at(i);
    const GqaShape& s = c.shape;
    if (s.Hkv == 1) seen.insert("multi-query");
    if (s.Hkv > 1 && s.Hkv < s.H) seen.insert("grouped");
    if (s.Hkv == s.H) seen.insert("Hkv=H");
    if (s.D * s.H != s.E) seen.insert("D!=E/H");
    if (c.bias) seen.insert("bias");
    if (c.rope == Rope::Interleaved) seen.insert("interleaved");
    if (c.rope == Rope::HalfSplit) seen.insert("halfsplit");
    seen.insert(c.causal ? "causal" : "noncausal");
    if (c.window && c.causal) seen.insert("window causal");
    if (c.window && !c.causal) seen.insert("window noncausal");
    if (c.alibi) seen.insert("alibi");
    if (c.softcap > 0) seen.insert("softcap");
    if (c.dropout > 0) seen.insert("dropout");
    if (c.softcap > 0 && c.rope != Rope::None && c.dropout > 0) seen.insert("softcap+rope+dropout");
  }
  for (const char* option : {"multi-query", "grouped", "Hkv=H", "D!=E/H", "bias", "interleaved", "halfsplit", "causal",
                             "noncausal", "window causal", "window noncausal", "alibi", "softcap", "dropout",
                             "softcap+rope+dropout"})
    EXPECT_TRUE(seen.count(option)) << option;
}

// The bound's own float64 values (plain loops over the trace) agree with
// the float64 module's, on every fifth case: the bound is about the right
// numbers (RoPE's pairs and angles, the window, ALiBi, dropout's keeps).
TEST(PrecisionGqaChecker, BoundsOwnValuesAgree) {
  for (int i = 0; i < kGqaCaseCount; i += 5) {
    const GqaProblem p = make_gqa_problem<bfloat16>(gqa_case_at(i));
    expect_traced_values_agree(gqa_trace<bfloat16>(p).value, reference_values(p), gqa_case_at(i).name());
  }
}

// The checker fails on a value one bound away from the reference's.
TEST(PrecisionGqaChecker, FailsWhenOneElementMovesByTheBound) {
  const GqaProblem p = make_gqa_problem<bfloat16>(gqa_case_at(1));
  const Values want = reference_values(p);
  Values got = library_values<bfloat16>(p);
  const GqaTrace traced = gqa_trace<bfloat16>(p);
  for (const char* name : {"output", "x", "k_proj.weight", "o_proj.weight"}) {
    std::vector<double>& g = got.at(name);
    const std::vector<double>& w = want.at(name);
    const std::vector<double>& bound = traced.bound.at(name);
    ASSERT_TRUE(compare(g, w, bound).ok) << name;
    const std::size_t k = g.size() / 2;
    g[k] = w[k] + 1.01 * bound[k];
    EXPECT_FALSE(compare(g, w, bound).ok) << name;
  }
}

// A deliberately wrong reference is caught: the float64 module with one
// option changed (RoPE's other convention, no soft-cap, another dropout
// seed) puts the 16-bit output outside the bound of the reference.
TEST(PrecisionGqaChecker, WrongReferenceFails) {
  struct Wrong {
    const char* what;
    bool (*applies)(const GqaCase&);
    void (*change)(GroupedQueryAttentionConfig&, AttentionOptions&);
  };
  const Wrong wrongs[] = {
      {"rope convention", [](const GqaCase& c) { return c.rope == Rope::HalfSplit; },
       [](GroupedQueryAttentionConfig& cfg, AttentionOptions&) { cfg.rope->convention = RopeConvention::Interleaved; }},
      {"softcap", [](const GqaCase& c) { return c.softcap > 0; },
       [](GroupedQueryAttentionConfig&, AttentionOptions& o) { o.softcap.reset(); }},
      {"dropout seed", [](const GqaCase& c) { return c.dropout > 0; },
       [](GroupedQueryAttentionConfig&, AttentionOptions& o) { o.dropout_seed += 1; }},
  };
  for (const Wrong& w : wrongs) {
    int tried = 0;
    for (int i = 0; i < kGqaCaseCount && tried < 3; ++i) {
      const GqaCase c = gqa_case_at(i);
      if (!w.applies(c) || c.shape.L < 5 || c.window == 1) continue;  // window 1: each query sees itself alone
      ++tried;
      const GqaProblem p = make_gqa_problem<bfloat16>(c);
      GroupedQueryAttentionConfig cfg = p.config;
      AttentionOptions o = options_of(c);
      w.change(cfg, o);
      const GroupedQueryAttention<double> wrong(cfg, p.params);
      const std::vector<double> want = values_of(wrong.forward(p.x, o));
      const Values got = library_values<bfloat16>(p);
      EXPECT_FALSE(compare(got.at("output"), want, gqa_trace<bfloat16>(p).bound.at("output")).ok)
          << w.what << ": " << c.name();
    }
    EXPECT_EQ(tried, 3) << w.what;
  }
}

// The bound is not vacuous: over every fourth case, the largest error /
// bound of the output and of every gradient is printed, and the output's
// and the gradients' largest ratio must exceed 1e-3 (a bound 1000 times too
// loose, or an error never measured, fails here).
template <class E>
void expect_bound_reached() {
  Ratios worst;
  for (int i = 0; i < kGqaCaseCount; i += 4)
    for (const auto& [name, x] : check_gqa_case<E>(i, false)) {
      const std::string key = name.find("bias") != std::string::npos ? "biases" : name;
      worst[key] = std::max(worst[key], x);
    }
  std::string line;
  for (const auto& [name, x] : worst) line += " " + name + " " + std::to_string(x);
  std::printf("%s largest error / bound:%s\n", to_string(compute_dtype_of<E>()).c_str(), line.c_str());
  for (const auto& [name, x] : worst) EXPECT_GT(x, 1e-3) << name;
  EXPECT_GT(worst.at("output"), 0.05);
}
TEST(PrecisionGqaChecker, BoundReachedBF16) { expect_bound_reached<bfloat16>(); }
TEST(PrecisionGqaChecker, BoundReachedF16) { expect_bound_reached<float16>(); }

// The training forward's output is the inference forward's, bit for bit,
// and the gradients are the same bits for one thread and two.
TEST(PrecisionGqa, TrainingForwardSameBitsAndThreadCounts) {
  for (int i : {3, 9, 17}) {
    GqaCase c = gqa_case_at(i);
    c.dropout = 0.2;
    const GqaProblem p = make_gqa_problem<bfloat16>(c);
    const NarrowGroupedQueryAttention<bfloat16> gqa(p.config, narrow_parameters<bfloat16>(p.config, p.params));
    const Tensor<bfloat16> x = narrow_of<bfloat16>(p.x);
    NarrowGroupedQueryForwardContext<bfloat16> ctx;
    const Tensor<bfloat16> trained = gqa.forward(x, options_of(c), ctx), plain = gqa.forward(x, options_of(c));
    ASSERT_EQ(trained.numel(), plain.numel());
    for (int64_t k = 0; k < plain.numel(); ++k) ASSERT_EQ(trained[k].bits, plain[k].bits) << c.name() << " " << k;
    EXPECT_GT(ctx.bytes(), 0u);
    const Values one = library_values<bfloat16>(p, 1), two = library_values<bfloat16>(p, 2);
    for (const auto& [name, v] : one) EXPECT_EQ(v, two.at(name)) << c.name() << " " << name;
  }
}

// ---- decoding with each cache dtype ------------------------------------------
//
// Prefill of 33 tokens, then steps of 1, 1, 2 and 1 tokens, against the
// 16-bit module's own full causal forward over the whole prefix (its rows
// P … P + L − 1). Both paths compute the same rounded q, k, v (the same
// 16-bit gemm, RoPE and roundings); they differ in
//  - what the cache gives back for k, v: x̂ with |x − x̂| <= δ(x), δ = 0 where
//    the cache dtype holds every value of E (f32 always; bf16 for a bf16
//    module; f16 for an f16 module), else bf16 2^-8|x|, f16 2^-11|x| + 2^-25
//    (a bf16 value below f16's normal range loses bits), int8 scale / 2;
//  - the float32 kernel: flash on 16-bit operands for the full forward, the
//    decode kernel (compressed caches; a float cache's steps) or float32
//    flash (a float cache's prompt) for decoding: other sums, other orders
//    (and, where bf16's pair way runs, P rounded to bf16: decode_bound's
//    pair_way term).
// Per element of the merged heads a (test_kv_cache_dtypes.cpp's derivation,
// docs/decoding.md): ε_j = scale·Σ_d |q_d| δ(k_jd) + 2γ_{D+2}·scale·Σ_d |q_d k_jd|,
// ε = max_j ε_j, |Δa_d| <= (e^{2ε} − 1)·Σ_j p_j |v_jd| + e^{2ε}·Σ_j p_j δ(v_jd)
// + 2γ_{S+2}·Σ_j p_j |v_jd|; both sides round a to E, so a may land one ulp
// apart: + 2u|a_d| + 2η; the output, rounded on both sides:
// |Δy_e| <= Σ_c |W_o,ec|·|Δa_c| + 2γ_{HD+1}·Σ_c |W_o,ec a_c| + 2u|y_e|.
// Evaluated on float64 q, k, v recomputed by the test with the module's
// roundings (they may differ from the module's by an ulp where a float32
// sum falls on a rounding boundary: the bound is taken 1.25 times).

struct DecodeSetup {
  GroupedQueryAttentionConfig config;
  GroupedQueryAttentionParameters<double> params;
  Tensor<double> x;  // (B, total, E)
};

constexpr int64_t kDecB = 2, kDecE = 64, kDecH = 8, kDecHkv = 2, kDecD = 40;  // D: a full and a short int8 block
const int64_t kSteps[] = {33, 1, 1, 2, 1};
constexpr int64_t kDecTotal = 38;

template <class E>
DecodeSetup decode_setup(int64_t head_dim = kDecD) {
  DecodeSetup s;
  s.config.embed_dim = kDecE;
  s.config.num_heads = kDecH;
  s.config.num_kv_heads = kDecHkv;
  s.config.head_dim = head_dim;
  s.config.bias = true;
  s.config.rope = RopeOptions{};
  std::mt19937_64 rng(4242);
  std::normal_distribution<double> normal(0.0, 1.0);
  const auto fill = [&](Shape shape, double sd) {
    Tensor<double> t(std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i)
      t[i] = static_cast<double>(to_float(narrow_from_float<E>(static_cast<float>(sd * normal(rng)))));
    return t;
  };
  for_each_parameter(s.config, s.params, [&](const ParameterInfo& info, Tensor<double>& t) {
    t = info.shape.size() == 2 ? fill(info.shape, 1.0 / std::sqrt(static_cast<double>(info.shape[1])))
                               : fill(info.shape, 0.5);
  });
  s.x = fill({kDecB, kDecTotal, kDecE}, 1.0);
  return s;
}

// Rows [from, to) of every batch entry of a (B, len, E) tensor.
template <class T>
Tensor<T> rows_of(const Tensor<T>& t, int64_t from, int64_t to) {
  const int64_t B = t.size(0), len = t.size(1), W = t.size(2);
  Tensor<T> r(Shape{B, to - from, W});
  for (int64_t b = 0; b < B; ++b)
    std::copy_n(t.data() + (b * len + from) * W, (to - from) * W, r.data() + b * (to - from) * W);
  return r;
}

// δ(x) of a cache dtype holding a value of E (0 where it holds it exactly).
template <class E>
double cache_delta(KVCacheDType dtype, double x, double int8_scale) {
  const bool exact = dtype == KVCacheDType::Native || (dtype == KVCacheDType::BFloat16 && std::is_same_v<E, bfloat16>) ||
                     (dtype == KVCacheDType::Float16 && std::is_same_v<E, float16>);
  if (exact) return 0;
  if (dtype == KVCacheDType::BFloat16) return std::ldexp(std::abs(x), -8);
  if (dtype == KVCacheDType::Float16) return std::ldexp(std::abs(x), -11) + std::ldexp(1.0, -25);
  return 0.5 * int8_scale * (1 + 1e-6);
}

// The bound of every element of the full forward's output (B, total, E).
// pair_way: the full forward's flash runs bf16's pair way (docs/precision.md,
// "The two bf16 dot ways"), which rounds P to bf16 before PV: u·Σ_j p|V_j|
// more on each attention output; the decoding side's kernel does too over a
// bf16 cache (its pair way, decode_compressed-inl.h), another u·Σ_j p|V_j|,
// and keeps P float32 over the other caches.
template <class E>
std::vector<double> decode_bound(const DecodeSetup& s, KVCacheDType dtype, bool pair_way) {
  const int64_t B = kDecB, S = kDecTotal, E_ = kDecE, H = kDecH, Hkv = kDecHkv, D = kDecD, G = H / Hkv;
  const int64_t HD = H * D, KD = Hkv * D;
  const double u = unit_roundoff(compute_dtype_of<E>());
  const double eta = std::ldexp(1.0, std::is_same_v<E, float16> ? -25 : -134);
  const auto round_e = [](double x) { return static_cast<double>(to_float(narrow_from_float<E>(static_cast<float>(x)))); };
  const auto project = [&](const Tensor<double>& W, const Tensor<double>& b, int64_t out) {
    std::vector<double> y(static_cast<std::size_t>(B * S * out));
    for (int64_t t = 0; t < B * S; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double acc = b[o];
        for (int64_t c = 0; c < E_; ++c) acc += s.x[t * E_ + c] * W[o * E_ + c];
        y[static_cast<std::size_t>(t * out + o)] = round_e(acc);
      }
    return y;
  };
  std::vector<double> q = project(s.params.q_proj_weight, s.params.q_proj_bias, HD);
  std::vector<double> k = project(s.params.k_proj_weight, s.params.k_proj_bias, KD);
  const std::vector<double> v = project(s.params.v_proj_weight, s.params.v_proj_bias, KD);
  const auto rope = [&](std::vector<double>& z, int64_t heads) {  // half-split, θ = 10000
    for (int64_t t = 0; t < B * S; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < D / 2; ++i) {
          const double angle = static_cast<double>(t % S) * std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(D));
          double& a = z[static_cast<std::size_t>(t * heads * D + h * D + i)];
          double& c = z[static_cast<std::size_t>(t * heads * D + h * D + i + D / 2)];
          const double a0 = a, c0 = c;
          a = round_e(a0 * std::cos(angle) - c0 * std::sin(angle));
          c = round_e(a0 * std::sin(angle) + c0 * std::cos(angle));
        }
  };
  rope(q, H);
  rope(k, Hkv);
  // int8 block scales of each K/V row: max|x| / 127 per 32 values.
  const auto scale_of = [&](const std::vector<double>& z, int64_t t, int64_t g, int64_t d) {
    double m = 0;
    for (int64_t c = d / 32 * 32; c < std::min(D, d / 32 * 32 + 32); ++c)
      m = std::max(m, std::abs(z[static_cast<std::size_t>(t * KD + g * D + c)]));
    return m / 127.0;
  };
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> a(static_cast<std::size_t>(B * S * HD)), ea(a.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < S; ++i) {
        const int64_t g = h / G, tq = b * S + i;
        std::vector<double> sc(static_cast<std::size_t>(i + 1)), eps(sc.size());
        double mx = -INFINITY, epsmax = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0, dabs = 0, e = 0;
          for (int64_t d = 0; d < D; ++d) {
            const double qd = q[static_cast<std::size_t>(tq * HD + h * D + d)];
            const double kd = k[static_cast<std::size_t>((b * S + j) * KD + g * D + d)];
            dot += qd * kd;
            dabs += std::abs(qd * kd);
            e += std::abs(qd) * cache_delta<E>(KVCacheDType(dtype), kd, scale_of(k, b * S + j, g, d));
          }
          sc[static_cast<std::size_t>(j)] = scale * dot;
          eps[static_cast<std::size_t>(j)] = scale * e + 2 * gamma32(static_cast<double>(D + 2)) * scale * dabs +
                                              8 * std::ldexp(1.0, -24);
          mx = std::max(mx, scale * dot);
          epsmax = std::max(epsmax, eps[static_cast<std::size_t>(j)]);
        }
        double sum = 0;
        for (double& z : sc) sum += (z = std::exp(z - mx));
        for (int64_t d = 0; d < D; ++d) {
          double o = 0, pv = 0, pd = 0;
          for (int64_t j = 0; j <= i; ++j) {
            const double p = sc[static_cast<std::size_t>(j)] / sum;
            const double vd = v[static_cast<std::size_t>((b * S + j) * KD + g * D + d)];
            o += p * vd;
            pv += p * std::abs(vd);
            pd += p * cache_delta<E>(dtype, vd, scale_of(v, b * S + j, g, d));
          }
          const std::size_t at = static_cast<std::size_t>(tq * HD + h * D + d);
          a[at] = o;
          ea[at] = std::expm1(2 * epsmax) * pv + std::exp(2 * epsmax) * pd +
                   2 * gamma32(static_cast<double>(i + 3)) * pv + 2 * u * std::abs(o) + 2 * eta +
                   (pair_way ? (dtype == KVCacheDType::BFloat16 ? 2 : 1) * u * pv : 0.0);
        }
      }
  std::vector<double> bound(static_cast<std::size_t>(B * S * E_));
  for (int64_t t = 0; t < B * S; ++t)
    for (int64_t e = 0; e < E_; ++e) {
      double y = s.params.o_proj_bias[e], prop = 0, sizes = std::abs(y);
      for (int64_t c = 0; c < HD; ++c) {
        const double w = s.params.o_proj_weight[e * HD + c];
        y += w * a[static_cast<std::size_t>(t * HD + c)];
        prop += std::abs(w) * ea[static_cast<std::size_t>(t * HD + c)];
        sizes += std::abs(w * a[static_cast<std::size_t>(t * HD + c)]);
      }
      bound[static_cast<std::size_t>(t * E_ + e)] =
          1.25 * (prop + 2 * gamma32(static_cast<double>(HD + 1)) * sizes + 2 * u * std::abs(y) + 2 * eta);
    }
  return bound;
}

struct DecodeResult {
  double worst = 0;          // largest error / bound over every decoded row
  int64_t differing = 0;     // output elements whose bits differ from the full forward's
  int64_t prefill_differing = 0;
  int64_t elements = 0;
};

template <class E>
DecodeResult check_decode(KVCacheDType dtype, bool pair_way = false) {
  const DecodeSetup s = decode_setup<E>();
  const NarrowGroupedQueryAttention<E> gqa(s.config, narrow_parameters<E>(s.config, s.params));
  const Tensor<E> x = narrow_of<E>(s.x);
  const Tensor<E> full = gqa.forward(x, {});  // causal over all 38 positions
  const std::vector<double> bound = decode_bound<E>(s, dtype, pair_way);
  KVCache<float> cache = gqa.make_cache(kDecB, 16, /*grow=*/true, dtype);
  DecodeResult r;
  int64_t P = 0;
  for (int64_t L : kSteps) {
    const Tensor<E> y = gqa.forward(rows_of(x, P, P + L), {}, &cache);
    EXPECT_EQ(cache.length(), P + L);
    const Tensor<E> want = rows_of(full, P, P + L);
    for (int64_t b = 0; b < kDecB; ++b)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t e = 0; e < kDecE; ++e) {
          const int64_t at = (b * L + i) * kDecE + e;
          const double got = to_float(y[at]), ref = to_float(want[at]);
          const double bnd = bound[static_cast<std::size_t>((b * kDecTotal + P + i) * kDecE + e)];
          const double err = std::abs(got - ref);
          r.worst = std::max(r.worst, err / bnd);
          const bool differs = y[at].bits != want[at].bits;
          r.differing += differs;
          if (P == 0) r.prefill_differing += differs;
          ++r.elements;
          EXPECT_LE(err, bnd) << to_string(compute_dtype_of<E>()) << " module, cache " << kv_cache_dtype_name(dtype)
                              << ": step at P " << P << " batch " << b << " row " << i << " feature " << e
                              << ": decoded " << got << ", full forward " << ref;
        }
    P += L;
  }
  std::printf("%s module, %s cache: largest |decoded - full| / bound %.3g; %lld of %lld output elements differ in "
              "their bits (%lld in the prefill)\n",
              to_string(compute_dtype_of<E>()).c_str(), kv_cache_dtype_name(dtype), r.worst,
              static_cast<long long>(r.differing), static_cast<long long>(r.elements),
              static_cast<long long>(r.prefill_differing));
  return r;
}

// Every cache dtype within its bound. Where the cache holds exactly the
// values the full forward reads (a float32 cache; a bf16 cache of a bf16
// module, an f16 cache of an f16 module), the two paths differ only in the
// float32 kernel's sums (flash on 16-bit operands against the decode kernel
// or float32 flash), a few 2^-24 relative, and each rounds the merged heads
// once to E: they can differ only where a float32 value falls within that
// of a rounding boundary of E, one ulp of a, then of the output. Measured
// (docs/precision.md): the bf16 module's outputs are the same bits with a
// float32, bf16 (and f16) cache; the f16 module's differ in 8 (f32 cache)
// and 43 (f16 cache) of 4864 elements. Required: at most 2% differ.
// That holds where the full forward's flash kernel keeps the float32
// arithmetic: bf16's fma way, forced here, which the decode kernel then
// takes too (auto takes the pair way on an AMD CPU with AVX512_BF16, whose
// bf16 P differs in about a third of the outputs' bits where only the full
// forward rounds it: the next test).
TEST(PrecisionGqaDecode, EveryCacheDtypeAgreesWithTheFullForward) {
  narrow_attention_force("flash");  // the flash kernel's bf16 ways
  bf16_dot_force("fma");
  // The full forward's f16 projections widened too: the bf16x3 way (auto
  // where oneDNN's bf16 matmul runs on AMX) drops Al·Bl, up to 2^-16 of a
  // sum's sizes, where the decoding steps' few-row products widen; on an
  // AMX host it moved 127 of the 4864 f16 outputs' bits. Both within the
  // bound: the next line's loop checks it under bf16x3 as well.
  f16_gemm_force("widen");
  for (KVCacheDType dtype : {KVCacheDType::Native, KVCacheDType::BFloat16, KVCacheDType::Float16, KVCacheDType::Int8}) {
    const DecodeResult bf = check_decode<bfloat16>(dtype), f16 = check_decode<float16>(dtype);
    if (dtype == KVCacheDType::Native || dtype == KVCacheDType::BFloat16) {
      EXPECT_LE(bf.differing, bf.elements / 50) << "bf16 module, " << kv_cache_dtype_name(dtype) << " cache";
    }
    if (dtype == KVCacheDType::Native || dtype == KVCacheDType::Float16) {
      EXPECT_LE(f16.differing, f16.elements / 50) << "f16 module, " << kv_cache_dtype_name(dtype) << " cache";
    }
  }
  f16_gemm_force("bf16x3");  // widens where oneDNN has no bf16 matmul
  for (KVCacheDType dtype : {KVCacheDType::Native, KVCacheDType::Float16, KVCacheDType::Int8})
    (void)check_decode<float16>(dtype);  // within the bound (EXPECT_LE inside)
  f16_gemm_force("");
  bf16_dot_force("");
  narrow_attention_force("");
}

// The bf16 module whose full forward runs the pair way (forced, so on every
// CPU: vdpbf16ps where it runs, Highway's widening of the same pairs
// elsewhere): every cache dtype within the bound with the pair way's P term.
TEST(PrecisionGqaDecode, PairWayFullForwardWithinTheBound) {
  narrow_attention_force("flash");  // the flash kernel's bf16 ways
  bf16_dot_force("dpbf16");
  for (KVCacheDType dtype : {KVCacheDType::Native, KVCacheDType::BFloat16, KVCacheDType::Float16, KVCacheDType::Int8}) {
    const DecodeResult r = check_decode<bfloat16>(dtype, /*pair_way=*/true);
    EXPECT_GT(r.elements, 0);
  }
  bf16_dot_force("");
  narrow_attention_force("");
}

// The bf16 module's decode steps reach the decode kernel's pair way over a
// bf16 cache (CompressedKV::bf16_module, through attend_over_cache): with
// D 64 (2N divides it on every target) the steps' bits change with the
// forced way, dpbf16 or fma, on a bf16 cache, and not on an f16 one (always
// widened). The pair way's error is the kernel's (GqaDecodePairs in
// tests/test_gqa_kernels.cpp); this is the route to it. HWY_SCALAR widens.
TEST(PrecisionGqaDecode, Bf16ModuleReachesThePairWay) {
  const DecodeSetup s = decode_setup<bfloat16>(/*head_dim=*/64);
  const NarrowGroupedQueryAttention<bfloat16> gqa(s.config, narrow_parameters<bfloat16>(s.config, s.params));
  const Tensor<bfloat16> x = narrow_of<bfloat16>(s.x);
  const auto decode = [&](KVCacheDType dtype, const char* way) {
    narrow_attention_force("flash");  // the flash kernel's bf16 ways
    bf16_dot_force(way);
    KVCache<float> cache = gqa.make_cache(kDecB, 16, /*grow=*/true, dtype);
    std::vector<uint16_t> bits;
    int64_t P = 0;
    for (int64_t L : kSteps) {
      const Tensor<bfloat16> y = gqa.forward(rows_of(x, P, P + L), {}, &cache);
      for (int64_t e = 0; e < y.numel(); ++e) bits.push_back(y[e].bits);
      P += L;
    }
    bf16_dot_force("");
    narrow_attention_force("");
    return bits;
  };
  const std::vector<uint16_t> pairs = decode(KVCacheDType::BFloat16, "dpbf16");
  const std::vector<uint16_t> widened = decode(KVCacheDType::BFloat16, "fma");
  ASSERT_EQ(pairs.size(), widened.size());
  if (simd_target_current() != "SCALAR") {
    int64_t differ = 0;
    for (std::size_t e = 0; e < pairs.size(); ++e) differ += pairs[e] != widened[e];
    EXPECT_GT(differ, 0) << "the bf16 module's decode over a bf16 cache did not take the pair way";
  }
  EXPECT_EQ(decode(KVCacheDType::Float16, "dpbf16"), decode(KVCacheDType::Float16, "fma"));
}

// The cache's contents are the module's rounded k, v (after RoPE), widened
// exactly: a float32 cache after the prompt holds 16-bit values only, and a
// bf16 cache of a bf16 module holds the same numbers.
TEST(PrecisionGqaDecode, Float32CacheHoldsTheRoundedValues) {
  const DecodeSetup s = decode_setup<bfloat16>();
  const NarrowGroupedQueryAttention<bfloat16> gqa(s.config, narrow_parameters<bfloat16>(s.config, s.params));
  const Tensor<bfloat16> prompt = rows_of(narrow_of<bfloat16>(s.x), 0, 9);
  KVCache<float> f32 = gqa.make_cache(kDecB, 9), bf16 = gqa.make_cache(kDecB, 9, false, KVCacheDType::BFloat16);
  gqa.forward(prompt, {}, &f32);
  gqa.forward(prompt, {}, &bf16);
  const auto* bits = static_cast<const uint16_t*>(bf16.k_compressed());
  const auto* vbits = static_cast<const uint16_t*>(bf16.v_compressed());
  for (int64_t e = 0; e < kDecB * kDecHkv * 9 * kDecD; ++e) {
    ASSERT_EQ(to_bfloat16(f32.k_data()[e]).bits, bits[e]) << "k element " << e;
    ASSERT_EQ(to_float(bfloat16{bits[e]}), f32.k_data()[e]) << "k element " << e;
    ASSERT_EQ(to_float(bfloat16{vbits[e]}), f32.v_data()[e]) << "v element " << e;
  }
}

// ---- bad input: one clear line ----------------------------------------------

template <class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const multihead::Error& e) {
    return e.what();
  }
  return "";
}

void expect_one_line(const std::string& message, const std::string& names) {
  EXPECT_NE(message.find(names), std::string::npos) << "expected \"" << names << "\" in: " << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(PrecisionGqaBadInput, ShapesCachesOptionsAndContexts) {
  const GqaCase c = gqa_case_at(1);  // B1 L17 E32 H4 Hkv1 D8
  const GqaProblem p = make_gqa_problem<bfloat16>(c);
  NarrowGroupedQueryAttention<bfloat16> gqa(p.config, narrow_parameters<bfloat16>(p.config, p.params));
  const NarrowGroupedQueryAttention<bfloat16> other(p.config, narrow_parameters<bfloat16>(p.config, p.params));
  const Tensor<bfloat16> x = narrow_of<bfloat16>(p.x), dy = narrow_of<bfloat16>(p.d_output);
  // x
  expect_one_line(thrown([&] { gqa.forward(Tensor<bfloat16>(Shape{17, 32})); }),
                  "x: expected shape (batch, length, embed_dim = 32), got (17, 32)");
  expect_one_line(thrown([&] { gqa.forward(Tensor<bfloat16>(Shape{1, 17, 31})); }), "x: expected shape");
  // parameters: missing, misshapen (naming it, expected and actual), a float32 one for rounded()
  GroupedQueryAttentionParameters<bfloat16> bad = narrow_parameters<bfloat16>(p.config, p.params);
  bad.k_proj_weight = Tensor<bfloat16>(Shape{16, 32});
  expect_one_line(thrown([&] { NarrowGroupedQueryAttention<bfloat16>(p.config, bad); }), "k_proj.weight");
  expect_one_line(thrown([&] { NarrowGroupedQueryAttention<bfloat16>(p.config, bad); }), "(8, 32)");
  bad.k_proj_weight = Tensor<bfloat16>();
  expect_one_line(thrown([&] { NarrowGroupedQueryAttention<bfloat16>(p.config, bad); }), "k_proj.weight: missing");
  GroupedQueryAttentionParameters<float> wide;
  for_each_parameter(p.config, wide, [](const ParameterInfo& info, Tensor<float>& t) {
    if (info.present) t = Tensor<float>(info.shape);
  });
  wide.o_proj_weight = Tensor<float>(Shape{32, 31});
  expect_one_line(thrown([&] { NarrowGroupedQueryAttention<bfloat16>::rounded(p.config, wide); }), "o_proj.weight");
  // a finite float32 value float16 cannot hold (it would round to inf) is
  // refused by rounded<float16>, naming the parameter and the element; bf16
  // holds it; 65504 itself is float16's largest value and is kept
  wide.o_proj_weight = Tensor<float>(Shape{32, 32});
  wide.v_proj_weight[5] = 70000.0f;
  expect_one_line(thrown([&] { NarrowGroupedQueryAttention<float16>::rounded(p.config, wide); }),
                  "v_proj.weight: float16 holds values of magnitude <= 65504, got 70000 at index (0, 5); bf16 or f32 holds it");
  EXPECT_NO_THROW(NarrowGroupedQueryAttention<bfloat16>::rounded(p.config, wide));
  wide.v_proj_weight[5] = -65504.0f;
  EXPECT_EQ(NarrowGroupedQueryAttention<float16>::rounded(p.config, wide).parameters().v_proj_weight[5].bits, 0xfbff);
  {
    MultiheadAttentionConfig mc;
    mc.embed_dim = 8;
    mc.num_heads = 2;
    MultiheadAttentionParameters<float> mp;
    for_each_parameter(mc, mp, [](const ParameterInfo& info, Tensor<float>& t) {
      if (info.present) t = Tensor<float>(info.shape, 0.5f);
    });
    mp.out_proj_bias[7] = -1.0e6f;
    expect_one_line(thrown([&] { NarrowMultiheadAttention<float16>::rounded(mc, mp); }),
                    "out_proj.bias: float16 holds values of magnitude <= 65504, got -1000000 at index (7)");
    EXPECT_NO_THROW(NarrowMultiheadAttention<bfloat16>::rounded(mc, mp));
    mp.out_proj_bias[7] = std::numeric_limits<float>::infinity();  // already infinite: kept as it is
    EXPECT_NO_THROW(NarrowMultiheadAttention<float16>::rounded(mc, mp));
  }
  // the configuration: the float module's messages
  GroupedQueryAttentionConfig cfg = p.config;
  cfg.num_kv_heads = 3;
  expect_one_line(thrown([&] { NarrowGroupedQueryAttention<bfloat16>(cfg, narrow_parameters<bfloat16>(p.config, p.params)); }),
                  "num_kv_heads: expected 0 (= num_heads) or a divisor of num_heads 4");
  // options: the float module's rules, and the kernel the 16-bit operands need
  AttentionOptions o;
  o.is_causal = true;
  expect_one_line(thrown([&] { gqa.forward(x, o); }), "is_causal: expected false");
  o = {};
  o.alibi_slopes = {0.5, 0.25};
  expect_one_line(thrown([&] { gqa.forward(x, o); }), "alibi_slopes: expected one slope per query head (4), got 2");
  o = {};
  o.kernel = AttentionKernel::Reference;
  expect_one_line(thrown([&] { gqa.forward(x, o); }), "kernel: expected auto or flash");
  o = {};
  o.dropout_p = 1.5;
  expect_one_line(thrown([&] { gqa.forward(x, o); }), "dropout_p: expected a probability in [0, 1]");
  o = {};
  o.check_finite = true;
  Tensor<bfloat16> nan = x;
  nan[5] = to_bfloat16(NAN);
  expect_one_line(thrown([&] { gqa.forward(nan, o); }), "x: non-finite value nan");
  // caches: shape, compressed-cache rules, overflow
  KVCache<float> wrong_heads(1, 2, 8, 32), wrong_batch(2, 1, 8, 32);
  expect_one_line(thrown([&] { gqa.forward(x, {}, &wrong_heads); }), "cache: expected batch 1, kv_heads 1, head_dim 8, got 1, 2, 8");
  expect_one_line(thrown([&] { gqa.forward(x, {}, &wrong_batch); }), "cache: expected batch 1");
  KVCache<float> int8 = gqa.make_cache(1, 32, false, KVCacheDType::Int8);
  o = {};
  o.dropout_p = 0.1;
  expect_one_line(thrown([&] { gqa.forward(x, o, &int8); }), "dropout_p: expected 0 with a compressed KV cache (int8");
  o = {};
  o.kernel = AttentionKernel::Flash;
  expect_one_line(thrown([&] { gqa.forward(x, o, &int8); }), "kernel: expected auto with a compressed KV cache");
  EXPECT_EQ(int8.length(), 0);  // refused before anything was stored
  KVCache<float> small = gqa.make_cache(1, 8);
  expect_one_line(thrown([&] { gqa.forward(x, {}, &small); }), "max_len: the KV cache holds 0 of max_len 8 tokens");
  // contexts: empty, foreign, stale; d_output's shape
  NarrowGroupedQueryForwardContext<bfloat16> ctx;
  expect_one_line(thrown([&] { gqa.backward(ctx, dy); }), "context: empty NarrowGroupedQueryForwardContext");
  gqa.forward(x, {}, ctx);
  EXPECT_FALSE(ctx.empty());
  expect_one_line(thrown([&] { other.backward(ctx, dy); }), "context: this NarrowGroupedQueryForwardContext was filled by another module");
  expect_one_line(thrown([&] { gqa.backward(ctx, Tensor<bfloat16>(Shape{1, 17, 33})); }), "d_output");
  EXPECT_EQ(thrown([&] { gqa.backward(ctx, dy); }), "");
  gqa.update_parameters([](const std::string&, Tensor<bfloat16>&) {});
  expect_one_line(thrown([&] { gqa.backward(ctx, dy); }), "before update_parameters()");
  // a reshaping update is refused, naming the parameter, and changes nothing
  const std::map<std::string, Tensor<bfloat16>> before = gqa.state_dict();
  expect_one_line(thrown([&] {
                    gqa.update_parameters([](const std::string& name, Tensor<bfloat16>& t) {
                      if (name == "v_proj.weight") t = Tensor<bfloat16>(Shape{1});
                    });
                  }),
                  "v_proj.weight");
  EXPECT_EQ(gqa.state_dict().at("v_proj.weight").shape(), before.at("v_proj.weight").shape());
  ctx.clear();
  EXPECT_TRUE(ctx.empty());
}

// No tokens: the forward does no work, every gradient is zeros of its
// tensor's shape; a cache is left as it was.
TEST(PrecisionGqaBadInput, EmptyInputGivesZeroGradients) {
  const GqaProblem p = make_gqa_problem<float16>(gqa_case_at(0));
  const NarrowGroupedQueryAttention<float16> gqa(p.config, narrow_parameters<float16>(p.config, p.params));
  const Tensor<float16> x(Shape{2, 0, 8});
  NarrowGroupedQueryForwardContext<float16> ctx;
  const Tensor<float16> y = gqa.forward(x, {}, ctx);
  EXPECT_EQ(y.shape(), (Shape{2, 0, 8}));
  const GroupedQueryAttentionGradients<float16> g = gqa.backward(ctx, y);
  EXPECT_EQ(g.x.shape(), x.shape());
  EXPECT_EQ(g.parameters.size(), gqa.state_dict().size());
  for (const auto& [name, t] : g.parameters) {
    EXPECT_EQ(t.shape(), gqa.state_dict().at(name).shape()) << name;
    for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t[i].bits, 0) << name;
  }
  KVCache<float> cache = gqa.make_cache(2, 4);
  EXPECT_EQ(gqa.forward(x, {}, &cache).numel(), 0);
  EXPECT_EQ(cache.length(), 0);
}

}  // namespace
}  // namespace multihead
