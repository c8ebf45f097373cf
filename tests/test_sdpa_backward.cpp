// tests/test_sdpa_backward.cpp: the public scaled_dot_product_attention_backward
// (multihead/attention.hpp), in float64 and float32, against a float64
// reference written here in plain loops from the textbook formulas
// (softmax(x)·V and its Jacobian), independent of every kernel:
//   s_ij = scale·<q_i, k_j> + m_ij (−inf where causal hides j > i),
//   p = softmax_j(s), out_i = Σ_j p_ij v_j,
//   dv_j = Σ_i p_ij g_i, dp_ij = <g_i, v_j>, ds_ij = p_ij (dp_ij − Σ_k p_ik dp_ik),
//   dq_i = scale Σ_j ds_ij k_j, dk_j = scale Σ_i ds_ij q_i.
// Cases (their names carry them): no mask, a shared boolean (L, S) mask, a
// per-slice additive (..., L, S) mask, causal, an explicit scale, a fully
// masked row (zeros), every kernel. Bounds: float64 within 1e-12 of the
// reference (relative to the gradient's max magnitude); float32 within 2e-5
// of it (the kernels' float32 rounding on these O(1) sums of <= 13 terms;
// a wrong formula is off by O(1)). Also: a wrong-shaped output, lse or
// d_output is an error naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "multihead/attention.hpp"
#include "multihead/error.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

using test::random_tensor;

struct Case {
  std::string name;
  int mask;  // 0 none, 1 shared bool (L, S), 2 per-slice additive (N, L, S)
  bool causal;
  double scale;  // 0 = default 1/√D
  bool masked_row;  // query row 0 sees no key
  AttentionKernel kernel;
};

struct Grads {
  std::vector<double> q, k, v;
};

// Leading dims (2, 3) = 6 slices; L = 5, S = 7, D = 4, Dv = 3.
constexpr int64_t N = 6, L = 5, S = 7, D = 4, Dv = 3;

Grads reference(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                const std::vector<double>& mask, int64_t mask_stride, bool causal, double scale,
                const Tensor<double>& g) {
  Grads r{std::vector<double>(q.numel()), std::vector<double>(k.numel()), std::vector<double>(v.numel())};
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> s(S), p(S, 0.0), dp(S);
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < S; ++j) {
        double x = 0;
        for (int64_t d = 0; d < D; ++d) x += q[(n * L + i) * D + d] * k[(n * S + j) * D + d];
        s[j] = scale * x + (mask.empty() ? 0.0 : mask[n * mask_stride + i * S + j]);
        if (causal && j > i) s[j] = -std::numeric_limits<double>::infinity();
        mx = std::max(mx, s[j]);
      }
      if (std::isinf(mx)) continue;  // fully masked row: output 0, no gradient
      double z = 0;
      for (int64_t j = 0; j < S; ++j) z += (p[j] = std::exp(s[j] - mx));
      double delta = 0;
      for (int64_t j = 0; j < S; ++j) {
        p[j] /= z;
        dp[j] = 0;
        for (int64_t c = 0; c < Dv; ++c) dp[j] += g[(n * L + i) * Dv + c] * v[(n * S + j) * Dv + c];
        delta += p[j] * dp[j];
      }
      for (int64_t j = 0; j < S; ++j) {
        const double ds = p[j] * (dp[j] - delta);
        for (int64_t c = 0; c < Dv; ++c) r.v[(n * S + j) * Dv + c] += p[j] * g[(n * L + i) * Dv + c];
        for (int64_t d = 0; d < D; ++d) {
          r.q[(n * L + i) * D + d] += scale * ds * k[(n * S + j) * D + d];
          r.k[(n * S + j) * D + d] += scale * ds * q[(n * L + i) * D + d];
        }
      }
    }
  }
  return r;
}

// max |a − ref| / max(1, max |ref|).
template <class T>
double error(const Tensor<T>& a, const std::vector<double>& ref) {
  double e = 0, m = 1;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    e = std::max(e, std::abs(static_cast<double>(a[static_cast<int64_t>(i)]) - ref[i]));
    m = std::max(m, std::abs(ref[i]));
  }
  return e / m;
}

template <class T>
Tensor<T> cast(const Tensor<double>& t) {
  Tensor<T> r(t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) r[i] = static_cast<T>(t[i]);
  return r;
}

template <class T>
void check_case(const Case& c, double bound) {
  std::mt19937_64 rng(42);
  const Tensor<double> q = random_tensor<double>({2, 3, L, D}, rng), k = random_tensor<double>({2, 3, S, D}, rng),
                       v = random_tensor<double>({2, 3, S, Dv}, rng), g = random_tensor<double>({2, 3, L, Dv}, rng);
  std::vector<double> additive;
  int64_t stride = 0;
  std::optional<Mask<T>> mask;
  if (c.mask == 1 || c.masked_row) {
    Tensor<uint8_t> b({L, S}, uint8_t(0));
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < S; ++j) b[i * S + j] = (c.masked_row && i == 0) || (c.mask == 1 && (i + 2 * j) % 5 == 0);
    additive.resize(L * S);
    for (int64_t i = 0; i < L * S; ++i) additive[i] = b[i] ? -std::numeric_limits<double>::infinity() : 0.0;
    mask = Mask<T>::boolean(std::move(b));
  } else if (c.mask == 2) {
    const Tensor<double> m = random_tensor<double>({2, 3, L, S}, rng);
    additive.assign(m.data(), m.data() + m.numel());
    stride = L * S;
    mask = Mask<T>::additive(cast<T>(m));
  }
  AttentionOptions o;
  o.is_causal = c.causal;
  if (c.scale != 0) o.scale = c.scale;
  o.kernel = c.kernel;
  const Tensor<T> qt = cast<T>(q), kt = cast<T>(k), vt = cast<T>(v), gt = cast<T>(g);
  Tensor<T> lse;
  const Tensor<T> out = scaled_dot_product_attention<T>(qt, kt, vt, mask ? &*mask : nullptr, o, nullptr, &lse);
  ASSERT_EQ(lse.shape(), (Shape{2, 3, L}));
  const SdpaGradients<T> r =
      scaled_dot_product_attention_backward<T>(qt, kt, vt, mask ? &*mask : nullptr, o, out, lse, gt);
  const Grads ref = reference(q, k, v, additive, stride, c.causal, c.scale != 0 ? c.scale : 1 / std::sqrt(double(D)), g);
  EXPECT_LE(error(r.query, ref.q), bound) << c.name << " d_query";
  EXPECT_LE(error(r.key, ref.k), bound) << c.name << " d_key";
  EXPECT_LE(error(r.value, ref.v), bound) << c.name << " d_value";
  EXPECT_EQ(r.query.shape(), q.shape());
  EXPECT_EQ(r.key.shape(), k.shape());
  EXPECT_EQ(r.value.shape(), v.shape());
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"nomask", 0, false, 0, false, AttentionKernel::Auto},
      {"boolmask_shared", 1, false, 0, false, AttentionKernel::Auto},
      {"additive_per_slice", 2, false, 0, false, AttentionKernel::Auto},
      {"causal", 0, true, 0, false, AttentionKernel::Auto},
      {"causal_boolmask_scale0p3", 1, true, 0.3, false, AttentionKernel::Auto},
      {"masked_row0_zeros", 0, false, 0, true, AttentionKernel::Auto},
      {"additive_reference_kernel", 2, true, 0, false, AttentionKernel::Reference},
      {"additive_materialized_kernel", 2, false, 1.5, false, AttentionKernel::Materialized},
  };
  return c;
}

TEST(SdpaBackward, Float64MatchesTheTextbookReferenceWithin1em12_N6_L5_S7_D4_Dv3) {
  for (const Case& c : cases()) check_case<double>(c, 1e-12);
}

TEST(SdpaBackward, Float32MatchesTheTextbookReferenceWithin2em5_N6_L5_S7_D4_Dv3) {
  for (const Case& c : cases()) check_case<float>(c, 2e-5);
  check_case<float>({"flash_kernel", 2, true, 0, false, AttentionKernel::Flash}, 2e-5);
}

TEST(SdpaBackward, WrongShapesNameTheTensor) {
  std::mt19937_64 rng(1);
  const Tensor<double> q = random_tensor<double>({2, L, D}, rng), k = random_tensor<double>({2, S, D}, rng),
                       v = random_tensor<double>({2, S, Dv}, rng), g = random_tensor<double>({2, L, Dv}, rng);
  Tensor<double> lse;
  const Tensor<double> out = scaled_dot_product_attention<double>(q, k, v, nullptr, {}, nullptr, &lse);
  const auto message = [&](const Tensor<double>& o, const Tensor<double>& l, const Tensor<double>& d) {
    try {
      scaled_dot_product_attention_backward<double>(q, k, v, nullptr, {}, o, l, d);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const Tensor<double> wrong({2, L, Dv + 1});
  EXPECT_NE(message(wrong, lse, g).find("output"), std::string::npos) << message(wrong, lse, g);
  EXPECT_NE(message(out, Tensor<double>({2, L + 1}), g).find("lse"), std::string::npos);
  EXPECT_NE(message(out, lse, wrong).find("d_output"), std::string::npos);
  EXPECT_EQ(message(out, lse, g), "");
}

}  // namespace
}  // namespace multihead
