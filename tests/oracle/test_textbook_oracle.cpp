// tests/oracle/test_textbook_oracle.cpp: the textbook form is an oracle
// that shares no arithmetic with the fused form. tests/CMakeLists.txt builds
// this binary from the textbook form's own sources only, without BLAS,
// without Highway and without any file of src/simd/ or the other kernels: if
// forward_textbook called gemm(), a SIMD kernel or the dispatcher, this
// binary would not link. The test then checks its numbers against the
// lesson's formula, written out here in double.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "multihead/multihead_attention.hpp"

namespace multihead {
namespace {

// MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O + b^O,
// head_i = softmax((Q W_i^Qᵀ + b_i^Q)(K W_i^Kᵀ + b_i^K)ᵀ / √D) (V W_i^Vᵀ + b_i^V),
// unbatched (L, E) self-attention.
std::vector<double> formula(const MultiheadAttentionParameters<double>& p, const Tensor<double>& x, int64_t H) {
  const int64_t L = x.size(0), E = x.size(1), D = E / H;
  auto project = [&](int64_t l, int64_t row) {  // (x W_inᵀ + b_in)[l, row]
    double acc = p.in_proj_bias[row];
    for (int64_t e = 0; e < E; ++e) acc += x[l * E + e] * p.in_proj_weight[row * E + e];
    return acc;
  };
  std::vector<double> concat(static_cast<std::size_t>(L * E));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> w(static_cast<std::size_t>(L));
      double sum = 0;
      for (int64_t j = 0; j < L; ++j) {
        double s = 0;
        for (int64_t d = 0; d < D; ++d) s += project(i, h * D + d) * project(j, E + h * D + d);
        sum += w[j] = std::exp(s / std::sqrt(static_cast<double>(D)));
      }
      for (int64_t d = 0; d < D; ++d) {
        double acc = 0;
        for (int64_t j = 0; j < L; ++j) acc += w[j] / sum * project(j, 2 * E + h * D + d);
        concat[i * E + h * D + d] = acc;
      }
    }
  std::vector<double> out(static_cast<std::size_t>(L * E));
  for (int64_t i = 0; i < L; ++i)
    for (int64_t e = 0; e < E; ++e) {
      double acc = p.out_proj_bias[e];
      for (int64_t c = 0; c < E; ++c) acc += concat[i * E + c] * p.out_proj_weight[e * E + c];
      out[i * E + e] = acc;
    }
  return out;
}

TEST(TextbookOracle, LinksWithoutBlasOrSimdAndMatchesTheFormula_E8_H2_L5) {
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 8;
  cfg.num_heads = 2;
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(0.0, 1.0);
  MultiheadAttentionParameters<double> p = BasicMultiheadAttention<double>(cfg, 5).parameters();
  for (double& b : p.in_proj_bias.vec()) b = normal(rng);
  for (double& b : p.out_proj_bias.vec()) b = normal(rng);
  const BasicMultiheadAttention<double> mha(cfg, p);
  Tensor<double> x({5, 8});
  for (double& e : x.vec()) e = normal(rng);
  ForwardOptions<double> o;
  // Whatever kernel a call asks for, the textbook form runs the plain loops.
  o.attention.kernel = AttentionKernel::Flash;
  const ForwardResult<double> r = mha.forward_textbook(x, x, x, o);
  const std::vector<double> want = formula(p, x, 2);
  ASSERT_EQ(r.output.numel(), static_cast<int64_t>(want.size()));
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(r.output[static_cast<int64_t>(i)], want[i], 1e-12 * (1 + std::abs(want[i]))) << "index " << i;
}

}  // namespace
}  // namespace multihead
