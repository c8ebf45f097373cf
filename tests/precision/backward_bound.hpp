// tests/precision/backward_bound.hpp: the pieces of the backward's error
// bound that the MHA backward test (test_precision_backward.cpp) and the
// grouped-query test (test_precision_gqa.cpp) share: a float32 sum of
// products with operands that carry error bounds, a rounding to 16 bits,
// and one attention slice's backward traced (docs/precision.md, "The
// backward", derives each).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "precision/precision_cases.hpp"

namespace multihead::precision {

// Tensors by name (the gradients of a backward, or a forward's output and
// gradients), each flattened to float64.
using NamedValues = std::map<std::string, std::vector<double>>;

// A bound's own float64 values (plain loops over its trace) against the
// float64 module's, tensor by tensor: each element within 1e-9 of the
// tensor's largest magnitude (at least 1). Both sum the same float64 terms
// in different orders, so they differ by ~1e-15 relative; a wrong index or
// a missed term is off by the size of a term. So the bound is computed
// about the right numbers.
inline void expect_traced_values_agree(const NamedValues& traced, const NamedValues& want, const std::string& label) {
  for (const auto& [name, w] : want) {
    double scale = 0;
    for (double x : w) scale = std::max(scale, std::abs(x));
    ASSERT_TRUE(traced.count(name)) << label << ": the trace has no " << name;
    const std::vector<double>& mine = traced.at(name);
    ASSERT_EQ(mine.size(), w.size()) << label << " " << name;
    for (std::size_t k = 0; k < w.size(); ++k)
      ASSERT_NEAR(mine[k], w[k], 1e-9 * std::max(scale, 1.0)) << label << " " << name << "[" << k << "]";
  }
}

// Value and bound of a float32 sum of products a_r·b_r (r < n terms),
// operands with errors.
struct Sum {
  double value = 0, error = 0, sizes = 0, operands = 0;
  int64_t n = 0;
  void add(double a, double ea, double b, double eb) {
    value += a * b;
    error += std::abs(a) * eb + ea * std::abs(b) + ea * eb;
    sizes += std::abs(a * b);
    operands += std::abs(a) + std::abs(b) + ea + eb;
    ++n;
  }
  // The float32 result's bound (before any 16-bit rounding), `extra`
  // operations beyond the n − 1 additions (a scale, a bias).
  double bound(int64_t extra = 0) const {
    const double terms = static_cast<double>(n + extra);
    const double g = bf16x3 ? gamma32(3 * terms) * (1 + 0x1p-7) * (1 + 0x1p-7) + 0x1p-16 : gamma32(terms);
    return error + g * (sizes + error);
  }
  // A projection's sum of an f16 module where f16 products run on the
  // bf16x3 way (precision_cases.hpp, product_gamma).
  bool bf16x3 = false;
};
// A Sum for a product of the projections (the linear layers' gradients).
template <class E>
Sum projection_sum() {
  Sum s;
  s.bf16x3 = std::is_same_v<E, float16> && f16_products_bf16x3();
  return s;
}

// Rounding to 16 bits: |round(x) − x| <= u|x| + η, η half the smallest
// subnormal (2^-25 for f16, whose subnormals start below 6.1e-5, where
// small gradients fall; 2^-134 for bf16).
struct Rounding {
  double u, eta;
};
template <class E>
Rounding rounding_of() {
  const bool f16 = compute_dtype_of<E>() == ComputeDtype::F16;
  return {unit_roundoff(compute_dtype_of<E>()), std::ldexp(1.0, f16 ? -25 : -134)};
}

// The bound of round(x̂) against x, x̂ within e of x.
inline double rounded(const Rounding& r, double x, double e) { return e + r.u * (std::abs(x) + e) + r.eta; }

// One slice's backward, traced (before the 16-bit rounding): given the
// slice's forward trace and d_out [L][D] with its bounds. `group`: how many
// query slices' sums d_k and d_v of this slice's K/V rows join (grouped-
// query attention: the kernel sums the group's G·L rows in one float32
// sum, so each slice's part carries γ_{G·L+1}; 1 without grouping). With a
// soft-cap the chain multiplies ds by the cap's slope (SliceTrace::slope):
// dx = ds·slope, e_dx = e_ds·slope + |ds|·e_slope + u32·|dx|.
//
// The bf16 pair way (SliceTrace::pair_way: the bf16 backward where the
// forward ran that way; src/simd/flash_attention_backward-inl.h) changes
// the products' operands, not their sums (γ_n holds for any order, pairs
// included):
//   p' and ds rounded to bf16 before d_v, d_k and d_q read them: each
//       operand's bound grows by u·(|x| + e) + 2^-134 (u = 2^-8);
//   vdpbf16ps flushes denormal inputs and results to zero: each sum of n
//       products of operands a, b grows by 2^-126·(Σ(|a| + |b|) + n),
//       over the scale where ds carries it (dp' too: <d_out, V> on pairs).
struct SliceGradients {
  std::vector<double> dq, edq, dk, edk, dv, edv;
};

inline SliceGradients trace_slice_backward(const SliceTrace& t, const std::vector<double>& dout,
                                           const std::vector<double>& edout, int64_t group = 1) {
  const int64_t L = t.L, St = t.St, D = t.D;
  const auto at = [&](int64_t i, int64_t j) { return static_cast<std::size_t>(i * St + j); };
  const auto rd = [&](int64_t i, int64_t d) { return static_cast<std::size_t>(i * D + d); };
  // The pair way's terms (above); all zero otherwise.
  const bool pair = t.pair_way;
  const double u = pair ? std::ldexp(1.0, -8) : 0.0, eta = pair ? std::ldexp(1.0, -134) : 0.0;
  const double flush = pair ? std::ldexp(1.0, -126) * std::max(1.0, 1.0 / t.scale) : 0.0;
  const auto round_operand = [&](double x, double e) { return e + u * (std::abs(x) + e) + eta; };
  const auto flushed = [&](const Sum& s) { return flush * (s.operands + static_cast<double>(s.n)); };
  std::vector<double> ds(static_cast<std::size_t>(L * St)), eds(ds.size());
  for (int64_t i = 0; i < L; ++i) {
    Sum delta;
    for (int64_t d = 0; d < D; ++d) delta.add(dout[rd(i, d)], edout[rd(i, d)], t.o[rd(i, d)], t.eo[rd(i, d)]);
    const double e_delta = delta.bound(), eps = t.eps[static_cast<std::size_t>(i)];
    for (int64_t j = 0; j < St; ++j) {
      const double p = t.p[at(i, j)], k = t.keep[at(i, j)];
      if (p == 0) continue;
      Sum dpp;
      for (int64_t d = 0; d < D; ++d) dpp.add(dout[rd(i, d)], edout[rd(i, d)], t.v[rd(j, d)], t.ev[rd(j, d)]);
      const double dp = k * dpp.value, e_dp = k * (dpp.bound(1) + flushed(dpp));
      ds[at(i, j)] = p * (dp - delta.value);
      eds[at(i, j)] = eps * p * std::abs(dp - delta.value) + p * (1 + eps) * (e_dp + e_delta) +
                      gamma32(3) * p * (1 + eps) * (std::abs(dp) + std::abs(delta.value) + e_dp + e_delta);
    }
  }
  if (t.softcap > 0)
    for (std::size_t x = 0; x < ds.size(); ++x) {
      const double dx = ds[x] * t.slope[x];
      eds[x] = eds[x] * t.slope[x] + std::abs(ds[x]) * t.eslope[x] + std::ldexp(1.0, -24) * std::abs(dx);
      ds[x] = dx;
    }
  SliceGradients g;
  for (auto* v : {&g.dq, &g.edq}) v->assign(static_cast<std::size_t>(L * D), 0.0);
  for (auto* v : {&g.dk, &g.edk, &g.dv, &g.edv}) v->assign(static_cast<std::size_t>(St * D), 0.0);
  for (int64_t i = 0; i < L; ++i)
    for (int64_t d = 0; d < D; ++d) {
      Sum s;
      for (int64_t j = 0; j < St; ++j)
        s.add(ds[at(i, j)], round_operand(ds[at(i, j)], eds[at(i, j)]), t.k[rd(j, d)], t.ek[rd(j, d)]);
      g.dq[rd(i, d)] = t.scale * s.value;
      g.edq[rd(i, d)] = t.scale * (s.bound(1) + flushed(s));
    }
  for (int64_t j = 0; j < St; ++j)
    for (int64_t d = 0; d < D; ++d) {
      Sum sk, sv;
      for (int64_t i = 0; i < L; ++i) {
        sk.add(ds[at(i, j)], round_operand(ds[at(i, j)], eds[at(i, j)]), t.q[rd(i, d)], t.eq[rd(i, d)]);
        const double pk = t.keep[at(i, j)] * t.p[at(i, j)];
        sv.add(pk, round_operand(pk, pk * t.eps[static_cast<std::size_t>(i)]), dout[rd(i, d)], edout[rd(i, d)]);
      }
      g.dk[rd(j, d)] = t.scale * sk.value;
      g.edk[rd(j, d)] = t.scale * (sk.bound(1 + (group - 1) * L) + flushed(sk));
      g.dv[rd(j, d)] = sv.value;
      g.edv[rd(j, d)] = sv.bound(1 + (group - 1) * L) + flushed(sv);
    }
  return g;
}


}  // namespace multihead::precision
