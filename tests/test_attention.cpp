// tests/test_attention.cpp: scaled_dot_product_attention, the public
// single-head function, against an oracle written here from the formula in
// double, and the materialised kernel against the reference kernel.
//
// Tolerance: in float64 both sides round each of O(S + D) operations once, so
// the relative error is a few eps64·(S + D) < 1e-13 for these sizes; we
// require 1e-12.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "kernels/kernel.hpp"
#include "multihead/attention.hpp"
#include "multihead/error.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

using test::random_tensor;
using test::rel_error;

// softmax(q kᵀ · scale + mask) v for one (L, D) × (S, D) × (S, Dv) slice.
Tensor<double> oracle(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                      const Tensor<double>* mask, double scale, bool causal, Tensor<double>* w) {
  const int64_t L = q.size(0), D = q.size(1), S = k.size(0), Dv = v.size(1);
  Tensor<double> out({L, Dv}, 0.0);
  if (w) *w = Tensor<double>({L, S}, 0.0);
  for (int64_t i = 0; i < L; ++i) {
    std::vector<double> s(S);
    double mx = -INFINITY;
    for (int64_t j = 0; j < S; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += q[i * D + d] * k[j * D + d];
      s[j] = dot * scale + (mask ? (*mask)[i * S + j] : 0.0);
      if (causal && j > i) s[j] = -INFINITY;
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (auto& x : s) sum += (x = std::exp(x - mx));
    for (int64_t j = 0; j < S; ++j) {
      const double p = s[j] / sum;
      if (w) (*w)[i * S + j] = p;
      for (int64_t d = 0; d < Dv; ++d) out[i * Dv + d] += p * v[j * Dv + d];
    }
  }
  return out;
}

Tensor<double> slice(const Tensor<double>& t, int64_t n) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  Tensor<double> s({rows, cols});
  std::copy(t.data() + n * rows * cols, t.data() + (n + 1) * rows * cols, s.data());
  return s;
}

struct SdpaCase {
  int64_t N, L, S, D, Dv;
  bool causal, mask2d, mask_full;
  double scale;  // 0 = default
  AttentionKernel kernel;
  std::string name() const {
    return "N" + std::to_string(N) + "_L" + std::to_string(L) + "_S" + std::to_string(S) + "_D" +
           std::to_string(D) + "_Dv" + std::to_string(Dv) + (causal ? "_causal" : "") +
           (mask2d ? "_mask2d" : "") + (mask_full ? "_maskfull" : "") + (scale ? "_scale" : "") + "_" +
           to_string(kernel);
  }
};

class Sdpa : public ::testing::TestWithParam<SdpaCase> {};

TEST_P(Sdpa, MatchesFormula) {
  const SdpaCase c = GetParam();
  std::mt19937_64 rng(9);
  const Tensor<double> q = random_tensor<double>({c.N, c.L, c.D}, rng);
  const Tensor<double> k = random_tensor<double>({c.N, c.S, c.D}, rng);
  const Tensor<double> v = random_tensor<double>({c.N, c.S, c.Dv}, rng);
  std::unique_ptr<Mask<double>> mask;
  if (c.mask2d) mask = std::make_unique<Mask<double>>(Mask<double>::additive(random_tensor<double>({c.L, c.S}, rng)));
  if (c.mask_full)
    mask = std::make_unique<Mask<double>>(Mask<double>::additive(random_tensor<double>({c.N, c.L, c.S}, rng)));
  AttentionOptions o;
  o.is_causal = c.causal;
  if (c.scale) o.scale = c.scale;
  o.kernel = c.kernel;
  Tensor<double> w;
  const Tensor<double> out = scaled_dot_product_attention(q, k, v, mask.get(), o, &w);
  ASSERT_EQ(out.shape(), (Shape{c.N, c.L, c.Dv}));
  ASSERT_EQ(w.shape(), (Shape{c.N, c.L, c.S}));
  const double scale = c.scale ? c.scale : 1.0 / std::sqrt(double(c.D));
  for (int64_t n = 0; n < c.N; ++n) {
    Tensor<double> m;
    if (c.mask2d) m = mask->float_values();
    if (c.mask_full) m = slice(mask->float_values(), n);
    Tensor<double> w_ref;
    const Tensor<double> ref = oracle(slice(q, n), slice(k, n), slice(v, n), mask ? &m : nullptr, scale,
                                      c.causal, &w_ref);
    EXPECT_LT(rel_error(slice(out, n), ref), 1e-12) << "slice " << n;
    EXPECT_LT(rel_error(slice(w, n), w_ref), 1e-12) << "slice " << n;
  }
}

const SdpaCase kSdpaCases[] = {
    {1, 1, 1, 1, 1, false, false, false, 0, AttentionKernel::Materialized},
    {3, 5, 7, 4, 6, false, true, false, 0, AttentionKernel::Materialized},
    {2, 9, 4, 3, 3, true, false, true, 0, AttentionKernel::Materialized},
    {2, 4, 9, 8, 2, true, true, false, 0.3, AttentionKernel::Materialized},
    {3, 5, 7, 4, 6, false, true, false, 0, AttentionKernel::Reference},
    {2, 9, 4, 3, 3, true, false, true, 0, AttentionKernel::Reference},
    {2, 4, 9, 8, 2, true, true, false, 0.3, AttentionKernel::Reference},
    {1, 65, 33, 16, 16, true, false, false, 0, AttentionKernel::Materialized},
};

INSTANTIATE_TEST_SUITE_P(Table, Sdpa, ::testing::ValuesIn(kSdpaCases),
                         [](const auto& info) { return info.param.name(); });

TEST(Sdpa, ThreadCountDoesNotChangeBits_Materialized_L300_S200) {
  std::mt19937_64 rng(10);
  const Tensor<float> q = random_tensor<float>({4, 300, 32}, rng), k = random_tensor<float>({4, 200, 32}, rng),
                      v = random_tensor<float>({4, 200, 32}, rng);
  AttentionOptions o;
  o.kernel = AttentionKernel::Materialized;
  o.is_causal = true;
  o.num_threads = 1;
  Tensor<float> w1, w2;
  const Tensor<float> a = scaled_dot_product_attention(q, k, v, nullptr, o, &w1);
  o.num_threads = 2;
  const Tensor<float> b = scaled_dot_product_attention(q, k, v, nullptr, o, &w2);
  EXPECT_EQ(a.vec(), b.vec());
  EXPECT_EQ(w1.vec(), w2.vec());
}

// The public causal options reach the kernels: BottomRight is TopLeft with
// the query offset S − L, on every kernel; an offset of S or more shows
// every key (no mask at all).
TEST(Sdpa, CausalAlignmentAndOffset_L5_S9) {
  std::mt19937_64 rng(12);
  const Tensor<float> q = random_tensor<float>({2, 5, 8}, rng), k = random_tensor<float>({2, 9, 8}, rng),
                      v = random_tensor<float>({2, 9, 8}, rng);
  for (AttentionKernel kernel : {AttentionKernel::Reference, AttentionKernel::Materialized, AttentionKernel::Flash}) {
    AttentionOptions br;
    br.kernel = kernel;
    br.is_causal = true;
    br.causal_alignment = CausalAlignment::BottomRight;
    AttentionOptions tl = br;
    tl.causal_alignment = CausalAlignment::TopLeft;
    tl.causal_query_offset = 9 - 5;
    EXPECT_EQ(scaled_dot_product_attention(q, k, v, nullptr, br).vec(),
              scaled_dot_product_attention(q, k, v, nullptr, tl).vec())
        << to_string(kernel);
    AttentionOptions all = tl;
    all.causal_query_offset = 9;
    AttentionOptions none;
    none.kernel = kernel;
    EXPECT_EQ(scaled_dot_product_attention(q, k, v, nullptr, all).vec(),
              scaled_dot_product_attention(q, k, v, nullptr, none).vec())
        << to_string(kernel);
  }
}

TEST(Sdpa, BoolMaskTrueMeansMayNotAttend) {
  Tensor<double> q({1, 2}, 1.0), k({3, 2}, 1.0), v({3, 1});
  v[0] = 1, v[1] = 2, v[2] = 4;
  Tensor<uint8_t> m({1, 3}, 0);
  m[1] = 1;  // key 1 hidden
  const Mask<double> mask = Mask<double>::boolean(m);
  const Tensor<double> out = scaled_dot_product_attention(q, k, v, &mask);
  EXPECT_NEAR(out[0], 2.5, 1e-15);  // equal scores on keys 0 and 2
}

TEST(Sdpa, CheckerFailsWhenOneElementIsPerturbed) {
  std::mt19937_64 rng(11);
  const Tensor<double> q = random_tensor<double>({4, 8}, rng), k = random_tensor<double>({6, 8}, rng),
                       v = random_tensor<double>({6, 8}, rng);
  Tensor<double> out = scaled_dot_product_attention(q, k, v);
  const Tensor<double> ref = oracle(q, k, v, nullptr, 1.0 / std::sqrt(8.0), false, nullptr);
  ASSERT_LT(rel_error(out, ref), 1e-12);
  out[5] += 1e-6;
  EXPECT_GT(rel_error(out, ref), 1e-12);
}

TEST(Sdpa, BadShapesAreNamed) {
  const Tensor<double> q({2, 3, 4}), k({2, 5, 4}), v({2, 5, 6});
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { scaled_dot_product_attention(q, Tensor<double>({2, 5, 3}), v); }).find("key: expected shape (2, 5, 4), got (2, 5, 3)"), std::string::npos);
  EXPECT_NE(message([&] { scaled_dot_product_attention(q, k, Tensor<double>({2, 4, 6})); }).find("value: expected shape (2, 5, 6), got (2, 4, 6)"), std::string::npos);
  const Mask<double> bad = Mask<double>::additive(Tensor<double>({3, 4}));
  EXPECT_NE(message([&] { scaled_dot_product_attention(q, k, v, &bad); }).find("attn_mask: expected shape (3, 5) or (2, 3, 5), got (3, 4)"), std::string::npos);
  AttentionOptions o;
  o.dropout_p = 1.5;
  EXPECT_NE(message([&] { scaled_dot_product_attention(q, k, v, nullptr, o); }).find("dropout_p"), std::string::npos);
  o = {};
  o.kernel = AttentionKernel::Flash;
  Tensor<double> w;
  EXPECT_NE(message([&] { scaled_dot_product_attention(q, k, v, nullptr, o, &w); }).find("kernel: flash"), std::string::npos);
}

}  // namespace
}  // namespace multihead
