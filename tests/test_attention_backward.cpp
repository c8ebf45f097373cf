// tests/test_attention_backward.cpp: the attention kernels' backward passes
// (the contract: AttentionBackwardArgs in src/contract/attention_args.hpp).
//
//  - BackwardFiniteDifferences: the reference backward and the materialized
//    backward in float64 against central differences of the float64
//    reference forward, on small shapes, every modifier (masks, padding,
//    causal both ways with offsets, window, soft-cap, ALiBi, dropout, a
//    position-less key), one at a time and all together.
//  - BackwardKernels: every kernel's backward (materialized float64 and
//    float32, flash float32 on every SIMD target this CPU runs, 1 and 2
//    threads), each after its own forward, against the float64 reference
//    backward after the float64 reference forward, over a table of shapes
//    around the tile sizes and of modifiers; NaN exactly where the
//    reference has it (MaskedRowPolicy::NaN); strided layouts leave the
//    elements outside every slice untouched; grouped-query and multi-query
//    K/V (Grouped/…) with the modifiers.
//  - BackwardDeterminism: the flash backward is bit-identical for 1, 2 and
//    3 threads on every target, across its one-pass and two-pass splits.
//  - BackwardGroupedReference: grouped-query / multi-query K/V, the
//    reference backward against the reference backward on K/V repeated
//    per query head with d_k, d_v summed per group in the test.
//  - BackwardChecker: the comparisons catch a planted error.
//
// Names carry every parameter, e.g.
//   Shapes/BackwardKernels.MatchReference/B2_H2_Hkv2_L65_S158_D17_Dv16_mask_slice_nopad_causal_bottomright_offm3_win0_cap0_noalibi_drop_nan_contiguous_extra0
//
// ---- Finite differences: step and bound -------------------------------------
// ℓ(θ) = Σ out ⊙ G (G a fixed random d_out), g = dℓ/dθ by the backward,
// fd(h) = (ℓ(θ + h) − ℓ(θ − h)) / 2h with h = 2^-14 (a power of two, so
// θ ± h is exact). Its error is truncation h²/6·ℓ''' + O(h⁴) plus rounding
// ≤ ε_ℓ/h, where ε_ℓ bounds the rounding of one evaluation of ℓ:
//   ε_ℓ = u·(2·(S + D + Dv) + 16)·W,  W = Σ_{n,i,c} |G_nic|·Σ_j p'_nij·|v_njc|
// (u = 2^-53; every term of ℓ is a sum of S products of D-long dot products
// through exp and a division). The truncation is measured rather than
// assumed: fd(2h) − fd(h) = 3·(h²/6·ℓ''') + O(h⁴), so
//   |g − fd(h)| <= |fd(2h) − fd(h)| + 3·ε_ℓ/h
// holds with a margin of 3 on the truncation term. A wrong gradient is off
// by O(|g|), far above this (BackwardChecker plants 1e-6).
//
// ---- Kernels against the reference: the bound -------------------------------
// u = the kernel's unit roundoff (2^-24 float, 2^-53 double). Per (i, j),
// first order, everything taken from the float64 reference:
//   x_ij = scale·<q_i, k_j>, A_ij = scale·Σ_d |q_id·k_jd|, s_ij its shaped score;
//   score error  δs_ij <= u·κ_ij, κ_ij = (D + 3)·A_ij + 2·|s_ij − cap(x_ij)| + 8·cap
//     (the D-long dot, then the additive terms; tanh ≤ 4 ulp: as
//     tests/test_score_rule.cpp);
//   the forward's lse_i is off by <= u·λ_i, λ_i = 2·max_j κ_ij + 2·(S + S/64) + 16
//     + 2·|lse_i| (the bound test_score_rule.cpp checks);
//   p_ij = exp(s_ij − lse_i), relative error <= u·(κ_ij + λ_i + 4) (+ 2^-126:
//     the SIMD exp flushes below FLT_MIN);
//   dp_ij = keep·<d_out_i, v_j>/(1 − p): <= u·(Dv + 3)·Σ_c |d_out_ic·v_jc|/(1 − p);
//   delta_i = <d_out_i, out_i>: <= u·(Dv + 2)·Σ_c |d_out_ic·out_ic| + Σ_c |d_out_ic|·δout_ic,
//     δout_ic = u·λ_i·Σ_j p'_ij·|v_jc| (the forward's output bound);
//   soft_cap_slope 1 − t², t = capped/cap: <= 2·(u·κ_ij/cap + 2u) + 2u;
//   ds_ij = p (dp − delta)·slope: E_ds = (δp·|dp − delta| + p·(δdp + δdelta))·slope
//     + p·|dp − delta|·δslope + 4u·|ds|.
// The gradients are sums of L or S such terms, each summed with relative
// error <= (n + 2)·u of the sum of magnitudes:
//   |d_q_id − ref| <= 2·scale·Σ_j (E_ds_ij + u·(S + 2)·|ds_ij|)·|k_jd|
//   |d_k_jd − ref| <= 2·scale·Σ_i (E_ds_ij + u·(L + 2)·|ds_ij|)·|q_id|
//   |d_v_jc − ref| <= 2·Σ_i (keep·δp_ij/(1 − p) + u·(L + 2)·p'_ij)·|d_out_ic|
// The factor 2 covers the second-order terms and the float64 reference's
// own rounding (which is the same bound at u = 2^-53). Gradient elements of
// a fully masked row are exact: 0 under Zeros, NaN under NaN exactly where
// the reference has NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "contract/score_rule.hpp"
#include "kernels/kernel.hpp"
#include "multihead/error.hpp"
#include "multihead/runtime.hpp"

namespace multihead {
namespace {

using detail::AttentionArgs;
using detail::AttentionBackwardArgs;
using detail::SliceLayout;
constexpr double kInf = std::numeric_limits<double>::infinity();

enum class MaskKind { None, Shared, PerSlice };
enum class Causal { None, TopLeft, BottomRight };

struct BwdCase {
  int64_t B = 2, H = 2, L = 9, S = 6, D = 8, Dv = 5;
  int64_t Hkv = 0;  // K/V heads (grouped-query); 0 = H
  MaskKind mask = MaskKind::None;
  bool pad = false;
  Causal causal = Causal::None;
  bool bottomright = false;  // positions aligned bottom-right (implied by Causal::BottomRight)
  int64_t offset = 0;
  int64_t window = 0;
  double softcap = 0;
  bool alibi = false;
  double dropout = 0;
  MaskedRowPolicy policy = MaskedRowPolicy::Zeros;
  bool strided = false;
  int64_t extra = 0;  // the last `extra` keys have no position (as bias_k)

  int64_t N() const { return B * H; }
  int64_t KV() const { return Hkv > 0 ? Hkv : H; }
  // The K/V slice query slice n reads (the contract's kv_slice).
  int64_t kv(int64_t n) const { return detail::kv_slice(n, H, KV()); }
  std::string name() const {
    static const char* masks[] = {"nomask", "mask_shared", "mask_slice"};
    static const char* causals[] = {"nocausal", "causal_topleft", "causal_bottomright"};
    std::ostringstream os;
    os << "B" << B << "_H" << H << "_Hkv" << KV() << "_L" << L << "_S" << S << "_D" << D << "_Dv" << Dv << "_"
       << masks[static_cast<int>(mask)] << (pad ? "_pad_" : "_nopad_") << causals[static_cast<int>(causal)]
       << (bottomright && causal != Causal::BottomRight ? "_bottomright" : "") << "_off"
       << (offset < 0 ? "m" + std::to_string(-offset) : std::to_string(offset)) << "_win" << window << "_cap"
       << static_cast<int>(softcap) << (alibi ? "_alibi" : "_noalibi") << (dropout > 0 ? "_drop" : "_nodrop")
       << (policy == MaskedRowPolicy::NaN ? "_nan" : "_zeros") << (strided ? "_strided" : "_contiguous")
       << "_extra" << extra;
    return os.str();
  }
};

// gtest prints a parameter by its name (not its bytes, padding included).
void PrintTo(const BwdCase& c, std::ostream* os) { *os << c.name(); }

// A profile: which modifiers a case carries (applied to a shape).
BwdCase with_profile(BwdCase c, int profile) {
  switch (profile) {
    case 0:
      break;
    case 1:
      c.mask = MaskKind::Shared, c.pad = true, c.causal = Causal::TopLeft;
      break;
    case 2:
      c.mask = MaskKind::PerSlice, c.causal = Causal::BottomRight, c.dropout = 0.3, c.policy = MaskedRowPolicy::NaN;
      break;
    case 3:
      c.causal = Causal::TopLeft, c.offset = 2, c.window = 3, c.alibi = true, c.strided = true;
      break;
    case 4:
      c.softcap = 2, c.pad = true, c.dropout = 0.3, c.policy = MaskedRowPolicy::NaN, c.strided = true;
      break;
    case 5:
      c.window = 5, c.bottomright = true, c.alibi = true, c.mask = MaskKind::PerSlice, c.extra = 1;
      break;
    case 6:
      c.causal = Causal::BottomRight, c.offset = -3, c.softcap = 2, c.alibi = true, c.mask = MaskKind::Shared,
      c.pad = true, c.dropout = 0.3, c.strided = true, c.extra = 1;
      break;
    default:
      break;
  }
  return c;
}
constexpr int kProfiles = 7;

// Shapes around the tiles: query tiles of 2 (SCALAR), 8 (SSE4, EMU128),
// 16 (AVX2) and 64 (AVX3) rows; key tiles of 126 keys, the last one up to
// 157 (flash_attention-inl.h, KeyTile and MaxKeyTile). Lengths 1, tile − 1,
// tile, tile + 1, odd, L ≠ S; head widths below, at and above a vector.
std::vector<BwdCase> shape_cases() {
  const int64_t shapes[][4] = {{1, 1, 8, 5},       {1, 127, 8, 5},    {15, 126, 17, 16}, {16, 127, 8, 5},
                               {17, 125, 64, 64},  {7, 3, 3, 2},      {3, 7, 16, 17},    {63, 158, 17, 16},
                               {64, 157, 8, 5},    {65, 253, 64, 64}, {130, 40, 8, 5}};
  std::vector<BwdCase> cases;
  for (const auto& s : shapes)
    for (int profile = 0; profile < kProfiles; ++profile) {
      BwdCase c;
      c.L = s[0], c.S = s[1], c.D = s[2], c.Dv = s[3];
      cases.push_back(with_profile(c, profile));
    }
  return cases;
}

// Each modifier alone, at a shape of two query tiles (AVX2) and one key
// tile and a sliver.
std::vector<BwdCase> modifier_cases() {
  std::vector<BwdCase> cases;
  BwdCase base;
  base.L = 17, base.S = 130, base.D = 8, base.Dv = 5;
  const auto add = [&](auto edit) {
    BwdCase c = base;
    edit(c);
    cases.push_back(c);
  };
  add([](BwdCase&) {});
  add([](BwdCase& c) { c.mask = MaskKind::Shared; });
  add([](BwdCase& c) { c.mask = MaskKind::PerSlice; });
  add([](BwdCase& c) { c.mask = MaskKind::PerSlice, c.policy = MaskedRowPolicy::NaN; });
  add([](BwdCase& c) { c.pad = true; });
  add([](BwdCase& c) { c.pad = true, c.policy = MaskedRowPolicy::NaN; });
  add([](BwdCase& c) { c.causal = Causal::TopLeft; });
  add([](BwdCase& c) { c.causal = Causal::TopLeft, c.offset = 2; });
  add([](BwdCase& c) { c.causal = Causal::TopLeft, c.offset = -3, c.policy = MaskedRowPolicy::NaN; });
  add([](BwdCase& c) { c.causal = Causal::BottomRight; });
  add([](BwdCase& c) { c.causal = Causal::BottomRight, c.offset = -3; });
  add([](BwdCase& c) { c.causal = Causal::BottomRight, c.L = 40, c.S = 30, c.policy = MaskedRowPolicy::NaN; });
  add([](BwdCase& c) { c.causal = Causal::BottomRight, c.L = 40, c.S = 30, c.policy = MaskedRowPolicy::NaN, c.dropout = 0.3; });
  add([](BwdCase& c) { c.causal = Causal::TopLeft, c.window = 1; });
  add([](BwdCase& c) { c.causal = Causal::TopLeft, c.window = 3; });
  add([](BwdCase& c) { c.window = 4; });
  add([](BwdCase& c) { c.window = 50, c.bottomright = true, c.extra = 1; });
  add([](BwdCase& c) { c.softcap = 2; });
  add([](BwdCase& c) { c.alibi = true; });
  add([](BwdCase& c) { c.alibi = true, c.bottomright = true, c.extra = 2; });
  add([](BwdCase& c) { c.dropout = 0.3; });
  add([](BwdCase& c) { c.strided = true; });
  add([](BwdCase& c) { c.B = 1, c.H = 1; });
  add([](BwdCase& c) { c.B = 1, c.H = 1, c.L = 70, c.S = 300, c.causal = Causal::TopLeft, c.window = 100; });
  add([](BwdCase& c) {
    c.B = 1, c.H = 1, c.L = 70, c.S = 300, c.causal = Causal::BottomRight, c.mask = MaskKind::Shared,
    c.policy = MaskedRowPolicy::NaN, c.dropout = 0.3, c.strided = true;
  });
  add([](BwdCase& c) { c.B = 3, c.H = 1, c.pad = true; });
  return cases;
}

// Grouped-query (H = 4 over Hkv = 2) and multi-query (Hkv = 1) K/V: d_k and
// d_v sum over each group's query slices. Plain, then with the modifiers
// (causal bottom-right, window, soft-cap, ALiBi, dropout), at one and two
// query tiles (AVX2) and a key tile and a sliver.
std::vector<BwdCase> grouped_cases() {
  std::vector<BwdCase> cases;
  for (int64_t hkv : {2, 1}) {
    BwdCase base;
    base.B = 2, base.H = 4, base.Hkv = hkv, base.L = 17, base.S = 130, base.D = 8, base.Dv = 5;
    const auto add = [&](auto edit) {
      BwdCase c = base;
      edit(c);
      cases.push_back(c);
    };
    add([](BwdCase&) {});
    add([](BwdCase& c) { c.causal = Causal::BottomRight, c.L = 40, c.S = 30, c.policy = MaskedRowPolicy::NaN; });
    add([](BwdCase& c) { c.causal = Causal::TopLeft, c.window = 3, c.alibi = true, c.strided = true; });
    add([](BwdCase& c) { c.softcap = 2, c.dropout = 0.3, c.pad = true, c.policy = MaskedRowPolicy::NaN; });
    add([](BwdCase& c) {
      c.B = 1, c.L = 15, c.S = 126, c.D = 17, c.Dv = 16, c.causal = Causal::BottomRight, c.offset = -3,
      c.window = 50, c.softcap = 2, c.alibi = true, c.dropout = 0.3, c.mask = MaskKind::PerSlice,
      c.strided = true, c.extra = 1;
    });
  }
  return cases;
}

// ---- inputs -----------------------------------------------------------------

// Where row i, column c of slice n sits in a buffer of `layout`
// (resolved), and how many elements the buffer needs.
struct Layout {
  SliceLayout l;  // as passed to the kernels ({} = contiguous)
  SliceLayout r;  // resolved
  int64_t heads, slices, len, width, size;
  int64_t at(int64_t n, int64_t i, int64_t c) const {
    return (n / heads) * r.batch + (n % heads) * r.head + i * r.row + c;
  }
};

// Strided: the heads of a (len, B, H·width) projection with 3 spare floats
// at the end of each row, as the fused form hands views to the kernels.
// K and V have `heads` = c.KV() heads per batch entry.
Layout make_layout(const BwdCase& c, int64_t heads, int64_t len, int64_t width) {
  Layout lay;
  lay.heads = heads, lay.slices = c.B * heads, lay.len = len, lay.width = width;
  if (c.strided) {
    lay.l = SliceLayout{heads * width, width, c.B * heads * width + 3};
    lay.size = len * lay.l.row;
  } else {
    lay.l = SliceLayout{};
    lay.size = lay.slices * len * width;
  }
  lay.r = detail::resolve_layout(lay.l, heads, len, width);
  return lay;
}

struct Inputs {
  BwdCase c;
  Layout lq, lk, lv, lo;
  std::vector<double> q, k, v, d_out, mask, pad, slopes;
};

// Values rounded to float, so that every kernel sees the same numbers.
// Masks hold −inf in places and a whole row of −inf (row 2: every slice's,
// or slice 1's when per slice); key padding hides key 1 of batch entry 0
// and every key of the last batch entry but its last.
Inputs make_inputs(const BwdCase& c) {
  std::mt19937_64 rng(99 + static_cast<uint64_t>(c.L * 7919 + c.S * 131 + c.D * 17 + c.Dv));
  std::normal_distribution<double> normal(0.0, 1.0);
  std::bernoulli_distribution hide(0.2);
  Inputs in;
  in.c = c;
  in.lq = make_layout(c, c.H, c.L, c.D);
  in.lk = make_layout(c, c.KV(), c.S, c.D);
  in.lv = make_layout(c, c.KV(), c.S, c.Dv);
  in.lo = make_layout(c, c.H, c.L, c.Dv);
  const auto fill = [&](std::vector<double>& x, int64_t count) {
    x.resize(static_cast<std::size_t>(count));
    for (double& e : x) e = static_cast<float>(normal(rng));
  };
  fill(in.q, in.lq.size);
  fill(in.k, in.lk.size);
  fill(in.v, in.lv.size);
  fill(in.d_out, in.lo.size);
  if (c.mask != MaskKind::None) {
    const int64_t slices = c.mask == MaskKind::Shared ? 1 : c.N();
    fill(in.mask, slices * c.L * c.S);
    for (double& e : in.mask)
      if (hide(rng)) e = -kInf;
    if (c.L > 2) {
      const int64_t n = c.mask == MaskKind::Shared ? 0 : 1 % slices;
      for (int64_t j = 0; j < c.S; ++j) in.mask[static_cast<std::size_t>((n * c.L + 2) * c.S + j)] = -kInf;
    }
  }
  if (c.pad) {
    fill(in.pad, c.B * c.S);
    if (c.S > 1) in.pad[1] = -kInf;
    if (c.B > 1)
      for (int64_t j = 0; j + 1 < c.S; ++j) in.pad[static_cast<std::size_t>((c.B - 1) * c.S + j)] = -kInf;
  }
  if (c.alibi) {
    // Any positive slopes (the formula is tested in test_variants.cpp),
    // small enough that no weight leaves float's normal range.
    for (int64_t n = 0; n < c.N(); ++n) in.slopes.push_back(0.2 / static_cast<double>(1 + n));
  }
  return in;
}

// One run of a kernel in T: its buffers and the arguments pointing at them.
template <class T>
struct KernelRun {
  std::vector<T> q, k, v, mask, pad, slopes, out, lse, d_out, d_q, d_k, d_v;
  AttentionBackwardArgs<T> b;
};

// Gradient buffers start as this: elements outside every slice must keep it.
constexpr double kSentinel = -777.0;

template <class T>
std::vector<T> to(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

template <class T>
void prepare(const Inputs& in, KernelRun<T>& r, int threads) {
  const BwdCase& c = in.c;
  r.q = to<T>(in.q), r.k = to<T>(in.k), r.v = to<T>(in.v), r.d_out = to<T>(in.d_out);
  r.mask = to<T>(in.mask), r.pad = to<T>(in.pad), r.slopes = to<T>(in.slopes);
  r.out.assign(static_cast<std::size_t>(in.lo.size), T(0));
  r.lse.assign(static_cast<std::size_t>(c.N() * c.L), T(kSentinel));
  r.d_q.assign(static_cast<std::size_t>(in.lq.size), T(kSentinel));
  r.d_k.assign(static_cast<std::size_t>(in.lk.size), T(kSentinel));
  r.d_v.assign(static_cast<std::size_t>(in.lv.size), T(kSentinel));
  AttentionArgs<T>& a = r.b.forward;
  a = AttentionArgs<T>{};
  a.slices = c.N(), a.heads = c.H, a.kv_heads = c.Hkv, a.q_len = c.L, a.kv_len = c.S, a.head_dim = c.D, a.value_dim = c.Dv;
  a.q = r.q.data(), a.k = r.k.data(), a.v = r.v.data(), a.out = r.out.data(), a.lse = r.lse.data();
  a.q_layout = in.lq.l, a.k_layout = in.lk.l, a.v_layout = in.lv.l, a.out_layout = in.lo.l;
  a.scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(c.D)));
  if (c.mask != MaskKind::None) {
    a.modifiers.attn_mask = r.mask.data();
    a.modifiers.attn_mask_slice_stride = c.mask == MaskKind::Shared ? 0 : c.L * c.S;
  }
  if (c.pad) a.modifiers.key_padding = r.pad.data();
  const bool br = c.causal == Causal::BottomRight || c.bottomright;
  a.modifiers.causal = {c.causal != Causal::None, br ? CausalAlignment::BottomRight : CausalAlignment::TopLeft,
                        c.offset, c.S - c.extra};
  a.modifiers.window = c.window;
  a.modifiers.softcap = static_cast<T>(c.softcap);
  if (c.alibi) a.modifiers.alibi_slopes = r.slopes.data();
  a.dropout = {c.dropout, 0xBAC4, 3};
  a.masked_rows = c.policy;
  a.num_threads = threads;
  r.b.lse = r.lse.data();
  r.b.d_out = r.d_out.data();
  r.b.d_q = r.d_q.data(), r.b.d_k = r.d_k.data(), r.b.d_v = r.d_v.data();
}

// The kernel's forward (out, lse), then its backward.
template <class T>
void run_kernel(const Inputs& in, KernelRun<T>& r, AttentionKernel kernel, int threads) {
  prepare(in, r, threads);
  detail::attention_forward(r.b.forward, kernel);
  detail::attention_backward(r.b, kernel);
}

// ---- the bound ----------------------------------------------------------------

struct Bounds {
  std::vector<double> d_q, d_k, d_v;  // per buffer element; 0 outside the slices
};

Bounds bounds_for(const Inputs& in, const KernelRun<double>& ref, double u) {
  const BwdCase& c = in.c;
  const AttentionArgs<double>& a = ref.b.forward;
  Bounds bd;
  bd.d_q.assign(ref.d_q.size(), 0.0);
  bd.d_k.assign(ref.d_k.size(), 0.0);
  bd.d_v.assign(ref.d_v.size(), 0.0);
  const double scale = a.scale, ks = c.dropout > 0 ? 1.0 / (1.0 - c.dropout) : 1.0;
  const std::size_t S = static_cast<std::size_t>(c.S);
  std::vector<double> kappa(S), p(S), dp(S), ds(S), e_ds(S), e_p(S), pk(S);
  // d_k and d_v rows of a grouped K/V slice are sums over its group's
  // heads / kv_heads query slices: group·L terms (Lg).
  const int64_t Lg = c.L * (c.H / c.KV());
  for (int64_t n = 0; n < c.N(); ++n) {
    const int64_t kvs = c.kv(n);  // the K/V slice n reads
    const detail::SliceModifiers<double> mods = detail::slice_modifiers(a.modifiers, n, c.H, c.L, c.S);
    for (int64_t i = 0; i < c.L; ++i) {
      const double lse = ref.lse[static_cast<std::size_t>(n * c.L + i)];
      if (lse == -kInf) continue;  // exact: 0, or NaN checked by pattern
      double max_kappa = 0;
      for (int64_t j = 0; j < c.S; ++j) {
        double x = 0, A = 0;
        for (int64_t d = 0; d < c.D; ++d) {
          const double t = ref.q[in.lq.at(n, i, d)] * ref.k[in.lk.at(kvs, j, d)];
          x += t, A += std::abs(t);
        }
        x *= scale, A *= scale;
        const double s = detail::modified_score(mods, c.S, i, j, x);
        const double capped = detail::soft_cap(mods.softcap, x);
        kappa[j] = s == -kInf ? 0.0 : (c.D + 3) * A + 2 * std::abs(s - capped) + 8 * c.softcap;
        max_kappa = std::max(max_kappa, kappa[j]);
        p[j] = std::exp(s - lse);
      }
      const double lambda = 2 * max_kappa + 2 * (c.S + c.S / 64.0) + 16 + 2 * std::abs(lse);
      // delta_i and its error; the forward's output error feeds it.
      double delta = 0, e_delta = 0;
      for (int64_t cc = 0; cc < c.Dv; ++cc) {
        const double g = ref.d_out[in.lo.at(n, i, cc)], o = ref.out[in.lo.at(n, i, cc)];
        double w = 0;
        for (int64_t j = 0; j < c.S; ++j) {
          const bool keep = c.dropout == 0 || detail::dropout_keep(a.dropout, n, i, j);
          w += (keep ? p[j] * ks : 0.0) * std::abs(ref.v[in.lv.at(kvs, j, cc)]);
        }
        delta += g * o;
        e_delta += u * (c.Dv + 2) * std::abs(g * o) + std::abs(g) * u * lambda * w;
      }
      for (int64_t j = 0; j < c.S; ++j) {
        const bool keep = c.dropout == 0 || detail::dropout_keep(a.dropout, n, i, j);
        double dpv = 0, e_dpv = 0;
        for (int64_t cc = 0; cc < c.Dv; ++cc) {
          const double t = ref.d_out[in.lo.at(n, i, cc)] * ref.v[in.lv.at(kvs, j, cc)];
          dpv += t, e_dpv += std::abs(t);
        }
        dp[j] = keep ? dpv * ks : 0.0;
        const double e_dp = keep ? u * (c.Dv + 3) * e_dpv * ks : 0.0;
        e_p[j] = p[j] * u * (kappa[j] + lambda + 4) + 0x1.0p-126;
        pk[j] = keep ? p[j] * ks : 0.0;
        double x = 0;
        for (int64_t d = 0; d < c.D; ++d) x += ref.q[in.lq.at(n, i, d)] * ref.k[in.lk.at(kvs, j, d)];
        x *= scale;
        const double slope = detail::soft_cap_slope(mods.softcap, x);
        const double e_slope = c.softcap > 0 ? 2 * (u * kappa[j] / c.softcap + 2 * u) + 2 * u : 0.0;
        const double r = dp[j] - delta;
        ds[j] = p[j] * r * slope;
        e_ds[j] = (e_p[j] * std::abs(r) + p[j] * (e_dp + e_delta)) * slope + p[j] * std::abs(r) * e_slope +
                  4 * u * std::abs(ds[j]);
      }
      for (int64_t j = 0; j < c.S; ++j) {
        const bool keep = c.dropout == 0 || detail::dropout_keep(a.dropout, n, i, j);
        for (int64_t d = 0; d < c.D; ++d) {
          bd.d_q[in.lq.at(n, i, d)] +=
              2 * scale * (e_ds[j] + u * (c.S + 2) * std::abs(ds[j])) * std::abs(ref.k[in.lk.at(kvs, j, d)]);
          bd.d_k[in.lk.at(kvs, j, d)] +=
              2 * scale * (e_ds[j] + u * (Lg + 2) * std::abs(ds[j])) * std::abs(ref.q[in.lq.at(n, i, d)]);
        }
        for (int64_t cc = 0; cc < c.Dv; ++cc)
          bd.d_v[in.lv.at(kvs, j, cc)] += 2 * ((keep ? e_p[j] * ks : 0.0) + u * (Lg + 2) * pk[j]) *
                                        std::abs(ref.d_out[in.lo.at(n, i, cc)]);
      }
    }
  }
  return bd;
}

// ---- the checker ----------------------------------------------------------------

struct Worst {
  double error = 0, ratio = 0;  // largest |error|, largest |error|/bound
};

// "" when every element is within its bound (NaN exactly where want is
// NaN; elements outside the slices, bound 0, equal); else the first
// failure: index, both values, error, bound, and how many failed.
template <class T>
std::string compare(const char* what, const std::vector<T>& got, const std::vector<double>& want,
                    const std::vector<double>& bound, Worst* worst = nullptr) {
  int64_t failures = 0;
  std::string first;
  for (std::size_t x = 0; x < want.size(); ++x) {
    const double g = static_cast<double>(got[x]), w = want[x];
    const double err = std::abs(g - w);
    const bool ok = std::isnan(w) ? std::isnan(g) : (!std::isnan(g) && err <= bound[x]);
    if (ok) {
      if (worst && !std::isnan(w)) {
        worst->error = std::max(worst->error, err);
        if (bound[x] > 0) worst->ratio = std::max(worst->ratio, err / bound[x]);
      }
      continue;
    }
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

template <class T>
double unit_roundoff() {
  return std::is_same_v<T, float> ? 0x1.0p-24 : 0x1.0p-53;
}

struct Reference {
  KernelRun<double> run;
  Bounds f32, f64;
};

Reference reference_for(const Inputs& in) {
  Reference ref;
  run_kernel<double>(in, ref.run, AttentionKernel::Reference, 1);
  ref.f32 = bounds_for(in, ref.run, unit_roundoff<float>());
  ref.f64 = bounds_for(in, ref.run, unit_roundoff<double>());
  return ref;
}

template <class T>
std::string check_kernel(const Inputs& in, const Reference& ref, AttentionKernel kernel, int threads, Worst& worst) {
  KernelRun<T> r;
  run_kernel<T>(in, r, kernel, threads);
  const Bounds& bd = std::is_same_v<T, float> ? ref.f32 : ref.f64;
  std::string f = compare("d_q", r.d_q, ref.run.d_q, bd.d_q, &worst);
  if (f.empty()) f = compare("d_k", r.d_k, ref.run.d_k, bd.d_k, &worst);
  if (f.empty()) f = compare("d_v", r.d_v, ref.run.d_v, bd.d_v, &worst);
  return f;
}

class BackwardKernels : public ::testing::TestWithParam<BwdCase> {};

TEST_P(BackwardKernels, MatchReference) {
  const Inputs in = make_inputs(GetParam());
  const Reference ref = reference_for(in);
  Worst w64, w32;
  for (int threads : {1, 2}) {
    const std::string t = " threads=" + std::to_string(threads);
    EXPECT_EQ(check_kernel<double>(in, ref, AttentionKernel::Materialized, threads, w64), "")
        << "materialized float64" << t;
    for (const std::string& target : simd_targets_available()) {
      simd_target_force(target);
      EXPECT_EQ(check_kernel<float>(in, ref, AttentionKernel::Materialized, threads, w32), "")
          << "materialized float32" << t << " target=" << target;
      EXPECT_EQ(check_kernel<float>(in, ref, AttentionKernel::Flash, threads, w32), "")
          << "flash" << t << " target=" << target;
    }
    simd_target_force("");
  }
  std::cout << "  worst |error|: float32 " << w32.error << " (" << w32.ratio << " of its bound), float64 "
            << w64.error << " (" << w64.ratio << " of its bound)\n";
}

INSTANTIATE_TEST_SUITE_P(Shapes, BackwardKernels, ::testing::ValuesIn(shape_cases()),
                         [](const auto& info) { return info.param.name(); });
INSTANTIATE_TEST_SUITE_P(Modifiers, BackwardKernels, ::testing::ValuesIn(modifier_cases()),
                         [](const auto& info) { return info.param.name(); });
INSTANTIATE_TEST_SUITE_P(Grouped, BackwardKernels, ::testing::ValuesIn(grouped_cases()),
                         [](const auto& info) { return info.param.name(); });

// ---- finite differences -----------------------------------------------------------

std::vector<BwdCase> fd_cases() {
  std::vector<BwdCase> cases;
  BwdCase base;
  base.B = 1, base.H = 2, base.L = 5, base.S = 7, base.D = 3, base.Dv = 2;
  const auto add = [&](auto edit) {
    BwdCase c = base;
    edit(c);
    cases.push_back(c);
  };
  add([](BwdCase&) {});
  add([](BwdCase& c) { c.mask = MaskKind::Shared; });
  add([](BwdCase& c) { c.mask = MaskKind::PerSlice; });
  add([](BwdCase& c) { c.B = 2, c.H = 1, c.pad = true; });
  add([](BwdCase& c) { c.causal = Causal::TopLeft; });
  add([](BwdCase& c) { c.causal = Causal::TopLeft, c.offset = 1; });
  add([](BwdCase& c) { c.causal = Causal::BottomRight; });
  add([](BwdCase& c) { c.causal = Causal::BottomRight, c.offset = -2; });
  add([](BwdCase& c) { c.causal = Causal::TopLeft, c.window = 2; });
  add([](BwdCase& c) { c.window = 2, c.bottomright = true, c.extra = 1; });
  add([](BwdCase& c) { c.softcap = 2; });
  add([](BwdCase& c) { c.alibi = true; });
  add([](BwdCase& c) { c.dropout = 0.3; });
  add([](BwdCase& c) { c.strided = true; });
  add([](BwdCase& c) {
    c.B = 2, c.H = 1, c.mask = MaskKind::PerSlice, c.pad = true, c.causal = Causal::BottomRight, c.offset = 1,
    c.window = 3, c.softcap = 2, c.alibi = true, c.dropout = 0.3, c.strided = true, c.extra = 1;
  });
  // Grouped-query (4 query heads over 2 K/V heads) and multi-query K/V.
  add([](BwdCase& c) { c.H = 4, c.Hkv = 2; });
  add([](BwdCase& c) { c.H = 3, c.Hkv = 1, c.causal = Causal::BottomRight; });
  add([](BwdCase& c) {
    c.B = 2, c.H = 4, c.Hkv = 2, c.mask = MaskKind::PerSlice, c.pad = true, c.causal = Causal::TopLeft,
    c.window = 3, c.softcap = 2, c.alibi = true, c.dropout = 0.3, c.strided = true, c.extra = 1;
  });
  return cases;
}

// ℓ = Σ out ⊙ G by the float64 reference forward, for the inputs in r;
// also W = Σ |G|·Σ_j p'|v| (the rounding scale of ℓ) when asked.
double loss(const Inputs& in, KernelRun<double>& r, double* magnitude = nullptr) {
  AttentionArgs<double> a = r.b.forward;
  std::vector<double> out(r.out.size(), 0.0), weights;
  a.out = out.data();
  a.lse = nullptr;
  if (magnitude) {
    weights.assign(static_cast<std::size_t>(in.c.N() * in.c.L * in.c.S), 0.0);
    a.weights = weights.data();
  }
  detail::attention_forward_reference(a);
  double l = 0;
  for (int64_t n = 0; n < in.c.N(); ++n)
    for (int64_t i = 0; i < in.c.L; ++i)
      for (int64_t c = 0; c < in.c.Dv; ++c) {
        const int64_t x = in.lo.at(n, i, c);
        l += out[x] * r.d_out[x];
        if (magnitude) {
          double w = 0;
          for (int64_t j = 0; j < in.c.S; ++j)
            w += std::abs(weights[static_cast<std::size_t>((n * in.c.L + i) * in.c.S + j)] *
                            r.v[in.lv.at(in.c.kv(n), j, c)]);
          *magnitude += std::abs(r.d_out[x]) * w;
        }
      }
  return l;
}

// Central differences of ℓ for every element of q, k and v that a slice
// uses, against `got` (the backward's d_q, d_k, d_v); "" or the first
// failure. worst gets the largest |g − fd|.
std::string check_finite_differences(const Inputs& in, const KernelRun<double>& got, Worst& worst,
                                     double* max_bound = nullptr) {
  const double h = 0x1.0p-14, u = 0x1.0p-53;
  KernelRun<double> r;
  prepare(in, r, 1);
  double W = 0;
  loss(in, r, &W);
  const double eps = u * (2 * (in.c.S + in.c.D + in.c.Dv) + 16) * W;
  struct Tensor {
    const char* name;
    std::vector<double>* x;
    const std::vector<double>* g;
    const Layout* lay;
  };
  const Tensor tensors[] = {{"d_q", &r.q, &got.d_q, &in.lq}, {"d_k", &r.k, &got.d_k, &in.lk},
                            {"d_v", &r.v, &got.d_v, &in.lv}};
  for (const Tensor& t : tensors)
    for (int64_t n = 0; n < t.lay->slices; ++n)
      for (int64_t i = 0; i < t.lay->len; ++i)
        for (int64_t c = 0; c < t.lay->width; ++c) {
          const std::size_t x = static_cast<std::size_t>(t.lay->at(n, i, c));
          const double x0 = (*t.x)[x];
          const auto central = [&](double step) {
            (*t.x)[x] = x0 + step;
            const double up = loss(in, r);
            (*t.x)[x] = x0 - step;
            const double down = loss(in, r);
            (*t.x)[x] = x0;
            return (up - down) / (2 * step);
          };
          const double fd = central(h), fd2 = central(2 * h);
          const double bound = std::abs(fd2 - fd) + 3 * eps / h;
          const double err = std::abs((*t.g)[x] - fd);
          if (max_bound) *max_bound = std::max(*max_bound, bound);
          if (!(err <= bound)) {
            std::ostringstream os;
            os.precision(12);
            os << t.name << " slice " << n << " row " << i << " col " << c << ": backward " << (*t.g)[x]
               << ", central difference " << fd << ", |error| " << err << " > bound " << bound;
            return os.str();
          }
          worst.error = std::max(worst.error, err);
          worst.ratio = std::max(worst.ratio, err / bound);
        }
  return "";
}

class BackwardFiniteDifferences : public ::testing::TestWithParam<BwdCase> {};

TEST_P(BackwardFiniteDifferences, ReferenceAndMaterialized) {
  const Inputs in = make_inputs(GetParam());
  for (AttentionKernel kernel : {AttentionKernel::Reference, AttentionKernel::Materialized}) {
    KernelRun<double> r;
    run_kernel<double>(in, r, kernel, 1);
    Worst worst;
    double max_bound = 0;
    EXPECT_EQ(check_finite_differences(in, r, worst, &max_bound), "")
        << (kernel == AttentionKernel::Reference ? "reference" : "materialized");
    std::cout << "  " << (kernel == AttentionKernel::Reference ? "reference" : "materialized")
              << ": worst |g − fd| " << worst.error << ", largest bound " << max_bound << "\n";
  }
}

INSTANTIATE_TEST_SUITE_P(Small, BackwardFiniteDifferences, ::testing::ValuesIn(fd_cases()),
                         [](const auto& info) { return info.param.name(); });

// ---- determinism -------------------------------------------------------------------

// The flash backward runs whole slices per thread when N >= threads and
// a two-pass split (key tiles for d_k, d_v; query tiles for d_q) when N <
// threads (src/kernels/flash.cpp); both must give the same bits. N = 1
// runs one pass at 1 thread and two at 2 and 3; N = 2 one pass at 1 and 2,
// two at 3; N = 5 is split unevenly by 2 and 3 threads.
std::vector<BwdCase> determinism_cases() {
  std::vector<BwdCase> cases;
  BwdCase c;
  c.L = 70, c.S = 300, c.D = 17, c.Dv = 16;
  c.B = 5, c.H = 1, c.mask = MaskKind::PerSlice, c.pad = true, c.causal = Causal::TopLeft, c.softcap = 2,
  c.dropout = 0.3;
  cases.push_back(c);
  c = BwdCase{};
  c.L = 130, c.S = 270, c.D = 64, c.Dv = 64, c.B = 1, c.H = 1;
  cases.push_back(c);
  c.causal = Causal::BottomRight, c.mask = MaskKind::Shared, c.policy = MaskedRowPolicy::NaN, c.dropout = 0.3,
  c.strided = true;
  cases.push_back(c);
  c = BwdCase{};
  c.L = 100, c.S = 260, c.D = 8, c.Dv = 5, c.B = 1, c.H = 2, c.causal = Causal::TopLeft, c.window = 40,
  c.alibi = true, c.softcap = 2;
  cases.push_back(c);
  // Grouped K/V: the unit of work is a group (K/V slice and its query
  // slices). B·Hkv = 2 groups: one pass at 1 and 2 threads, two at 3;
  // multi-query, 1 group: two passes at 2 and 3 threads; 3 groups of 2.
  c = BwdCase{};
  c.L = 70, c.S = 300, c.D = 17, c.Dv = 16, c.B = 1, c.H = 4, c.Hkv = 2, c.causal = Causal::BottomRight,
  c.dropout = 0.3, c.mask = MaskKind::PerSlice, c.policy = MaskedRowPolicy::NaN;
  cases.push_back(c);
  c = BwdCase{};
  c.L = 65, c.S = 260, c.D = 8, c.Dv = 5, c.B = 1, c.H = 3, c.Hkv = 1, c.window = 40, c.softcap = 2,
  c.alibi = true, c.strided = true;
  cases.push_back(c);
  c = BwdCase{};
  c.L = 40, c.S = 140, c.D = 8, c.Dv = 5, c.B = 3, c.H = 2, c.Hkv = 1, c.causal = Causal::TopLeft, c.pad = true;
  cases.push_back(c);
  return cases;
}

class BackwardDeterminism : public ::testing::TestWithParam<BwdCase> {};

TEST_P(BackwardDeterminism, FlashBitIdenticalFor1To3Threads) {
  const Inputs in = make_inputs(GetParam());
  for (const std::string& target : simd_targets_available()) {
    simd_target_force(target);
    KernelRun<float> one;
    run_kernel<float>(in, one, AttentionKernel::Flash, 1);
    for (int threads : {2, 3}) {
      KernelRun<float> r;
      run_kernel<float>(in, r, AttentionKernel::Flash, threads);
      const auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
        return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
      };
      EXPECT_TRUE(same(one.d_q, r.d_q)) << "d_q, target=" << target << " threads=" << threads;
      EXPECT_TRUE(same(one.d_k, r.d_k)) << "d_k, target=" << target << " threads=" << threads;
      EXPECT_TRUE(same(one.d_v, r.d_v)) << "d_v, target=" << target << " threads=" << threads;
    }
  }
  simd_target_force("");
}

INSTANTIATE_TEST_SUITE_P(Flash, BackwardDeterminism, ::testing::ValuesIn(determinism_cases()),
                         [](const auto& info) { return info.param.name(); });

// ---- grouped K/V against explicitly repeated K/V ----------------------------------

// An independent statement of the grouped sum: the reference backward on
// grouped K/V against the reference backward of ordinary multi-head
// attention on K/V repeated per query head (what repeat_kv builds, written
// here as loops), whose d_k and d_v this test sums over each group.
// d_q: the same operations on the same numbers, so equal bits. d_k, d_v:
// the same group·L products summed in another order, so each side is
// within its float64 bound (bounds_for at u = 2^-53) of the exact sum and
// the two within the sum of both bounds.
class BackwardGroupedReference : public ::testing::TestWithParam<BwdCase> {};

TEST_P(BackwardGroupedReference, EqualsRepeatedKvSummedPerGroup) {
  const BwdCase c = GetParam();
  const Inputs in = make_inputs(c);
  const Reference grouped = reference_for(in);
  BwdCase rc = c;
  rc.Hkv = 0;  // H K/V heads
  Inputs rep = in;
  rep.c = rc;
  rep.lk = make_layout(rc, rc.H, c.S, c.D);
  rep.lv = make_layout(rc, rc.H, c.S, c.Dv);
  rep.k.assign(static_cast<std::size_t>(rep.lk.size), 0.0);
  rep.v.assign(static_cast<std::size_t>(rep.lv.size), 0.0);
  for (int64_t n = 0; n < c.N(); ++n)
    for (int64_t j = 0; j < c.S; ++j) {
      for (int64_t d = 0; d < c.D; ++d) rep.k[rep.lk.at(n, j, d)] = in.k[in.lk.at(c.kv(n), j, d)];
      for (int64_t d = 0; d < c.Dv; ++d) rep.v[rep.lv.at(n, j, d)] = in.v[in.lv.at(c.kv(n), j, d)];
    }
  KernelRun<double> r;
  run_kernel<double>(rep, r, AttentionKernel::Reference, 1);
  EXPECT_EQ(std::memcmp(r.d_q.data(), grouped.run.d_q.data(), r.d_q.size() * sizeof(double)), 0) << "d_q";
  const Bounds rb = bounds_for(rep, r, unit_roundoff<double>());
  // d_k, d_v of the repeated run summed per group, into grouped layouts
  // (their bound: the sum of the repeated bounds, plus the grouped one).
  std::vector<double> d_k(grouped.run.d_k.size(), kSentinel), d_v(grouped.run.d_v.size(), kSentinel);
  std::vector<double> bk(d_k.size(), 0.0), bv(d_v.size(), 0.0);
  for (int64_t g = 0; g < in.lk.slices; ++g)
    for (int64_t j = 0; j < c.S; ++j) {
      for (int64_t d = 0; d < c.D; ++d) {
        const int64_t x = in.lk.at(g, j, d);
        d_k[x] = 0, bk[x] = grouped.f64.d_k[x];
      }
      for (int64_t d = 0; d < c.Dv; ++d) {
        const int64_t x = in.lv.at(g, j, d);
        d_v[x] = 0, bv[x] = grouped.f64.d_v[x];
      }
    }
  for (int64_t n = 0; n < c.N(); ++n)
    for (int64_t j = 0; j < c.S; ++j) {
      for (int64_t d = 0; d < c.D; ++d) {
        d_k[in.lk.at(c.kv(n), j, d)] += r.d_k[rep.lk.at(n, j, d)];
        bk[in.lk.at(c.kv(n), j, d)] += rb.d_k[rep.lk.at(n, j, d)];
      }
      for (int64_t d = 0; d < c.Dv; ++d) {
        d_v[in.lv.at(c.kv(n), j, d)] += r.d_v[rep.lv.at(n, j, d)];
        bv[in.lv.at(c.kv(n), j, d)] += rb.d_v[rep.lv.at(n, j, d)];
      }
    }
  Worst worst;
  EXPECT_EQ(compare("d_k", grouped.run.d_k, d_k, bk, &worst), "");
  EXPECT_EQ(compare("d_v", grouped.run.d_v, d_v, bv, &worst), "");
  std::cout << "  worst |grouped − repeated, summed|: " << worst.error << " (" << worst.ratio << " of its bound)\n";
}

std::vector<BwdCase> grouped_reference_cases() {
  std::vector<BwdCase> cases;
  BwdCase c;
  c.B = 2, c.H = 4, c.Hkv = 2, c.L = 9, c.S = 12, c.D = 5, c.Dv = 3;
  cases.push_back(c);
  c.Hkv = 1, c.causal = Causal::BottomRight, c.dropout = 0.3, c.softcap = 2, c.alibi = true, c.strided = true;
  cases.push_back(c);
  c.Hkv = 2, c.H = 6, c.window = 3, c.mask = MaskKind::PerSlice, c.policy = MaskedRowPolicy::NaN, c.pad = true;
  cases.push_back(c);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Reference, BackwardGroupedReference, ::testing::ValuesIn(grouped_reference_cases()),
                         [](const auto& info) { return info.param.name(); });

// ---- the checkers can fail -----------------------------------------------------------

TEST(BackwardChecker, CatchesPlantedErrors) {
  BwdCase c;
  c.L = 17, c.S = 130, c.mask = MaskKind::PerSlice, c.causal = Causal::BottomRight, c.dropout = 0.3,
  c.policy = MaskedRowPolicy::NaN;
  const Inputs in = make_inputs(c);
  const Reference ref = reference_for(in);
  KernelRun<float> r;
  run_kernel<float>(in, r, AttentionKernel::Flash, 1);
  ASSERT_EQ(compare("d_k", r.d_k, ref.run.d_k, ref.f32.d_k), "");
  ASSERT_EQ(compare("d_q", r.d_q, ref.run.d_q, ref.f32.d_q), "");
  // A finite d_k element moved by 4 bounds.
  std::size_t x = 0;
  while (x < ref.run.d_k.size() && !(std::isfinite(ref.run.d_k[x]) && ref.f32.d_k[x] > 0)) ++x;
  ASSERT_LT(x, ref.run.d_k.size());
  std::vector<float> planted = r.d_k;
  planted[x] += static_cast<float>(4 * ref.f32.d_k[x]);
  EXPECT_NE(compare("d_k", planted, ref.run.d_k, ref.f32.d_k), "");
  // The bound is tight enough to see a 1e-3 relative error in a gradient
  // (it is a worst case: the errors measured stay below 1/10 of it).
  std::size_t y = 0;
  while (y < ref.run.d_q.size() && !(std::isfinite(ref.run.d_q[y]) && std::abs(ref.run.d_q[y]) > 0.1)) ++y;
  ASSERT_LT(y, ref.run.d_q.size());
  planted = r.d_q;
  planted[y] *= 1.001f;
  EXPECT_NE(compare("d_q", planted, ref.run.d_q, ref.f32.d_q), "");
  // A NaN (row 2 of slice 1 is fully masked) replaced by 0.
  std::size_t z = 0;
  while (z < ref.run.d_q.size() && !std::isnan(ref.run.d_q[z])) ++z;
  ASSERT_LT(z, ref.run.d_q.size());
  planted = r.d_q;
  planted[z] = 0.0f;
  EXPECT_NE(compare("d_q", planted, ref.run.d_q, ref.f32.d_q), "");
  // A finite difference check of a gradient off by 1e-6.
  BwdCase small = fd_cases()[0];
  const Inputs sin = make_inputs(small);
  KernelRun<double> g;
  run_kernel<double>(sin, g, AttentionKernel::Reference, 1);
  Worst worst;
  ASSERT_EQ(check_finite_differences(sin, g, worst), "");
  g.d_v[0] += 1e-6;
  EXPECT_NE(check_finite_differences(sin, g, worst), "");
}

// Forcing the flash backward on float64 is a usage error, as in the forward.
TEST(BackwardDispatch, FlashForFloat64IsRefused) {
  BwdCase c;
  const Inputs in = make_inputs(c);
  KernelRun<double> r;
  prepare(in, r, 1);
  detail::attention_forward(r.b.forward, AttentionKernel::Reference);
  EXPECT_THROW(detail::attention_backward(r.b, AttentionKernel::Flash), Error);
}

}  // namespace
}  // namespace multihead
