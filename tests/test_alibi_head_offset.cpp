// ForwardOptions::alibi_heads / alibi_head_offset: a module computing heads
// [offset, offset + H) of a larger module's gets those heads' ALiBi slopes
// (what head parallel needs, multihead/distributed.hpp), and a bad offset is
// refused naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "multihead/error.hpp"
#include "multihead/multihead_attention.hpp"

namespace multihead {
namespace {

// Per-head weights of heads [first, first + 2) of a 4-head, E = 8 module,
// computed by a 2-head module holding those heads' rows of W_q and W_k.
TEST(AlibiHeadOffset, TwoHeadsOfFourHaveTheWholeModulesSlopes_f64_bound_1e_minus12) {
  MultiheadAttentionConfig whole_config;
  whole_config.embed_dim = 8;
  whole_config.num_heads = 4;
  whole_config.bias = false;
  BasicMultiheadAttention<double> whole(whole_config, 3);
  const int64_t L = 5, E = 8, D = 2;
  Tensor<double> x(Shape{L, 1, E});
  std::mt19937_64 g(1);
  std::normal_distribution<double> n(0, 1);
  for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = n(g);
  ForwardOptions<double> o;
  o.alibi = true;
  o.attention.is_causal = true;
  o.average_attn_weights = false;
  const Tensor<double> want = *whole.forward(x, x, x, o).attn_weights;  // (1, 4, L, L)
  for (int64_t first : {0, 2}) {
    // A 2-head module of width 4 reading x through its own q/k/v_proj (kdim = vdim = 8).
    MultiheadAttentionConfig part_config;
    part_config.embed_dim = 2 * D;
    part_config.num_heads = 2;
    part_config.bias = false;
    part_config.kdim = E;
    part_config.vdim = E;
    MultiheadAttentionParameters<double> p;
    const Tensor<double>& w = whole.parameters().in_proj_weight;  // (3E, E)
    const auto rows = [&](int64_t r0) {
      Tensor<double> t(Shape{2 * D, E});
      for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = w.data()[r0 * E + i];
      return t;
    };
    // The part's query width is its embed width 2·D, so the query comes
    // pre-projected by W_q's rows of those heads (q below) and q_proj is the
    // identity; key and value are x, through the heads' rows of W_k, W_v.
    p.q_proj_weight = Tensor<double>(Shape{2 * D, 2 * D}, 0.0);
    for (int64_t i = 0; i < 2 * D; ++i) p.q_proj_weight.data()[i * 2 * D + i] = 1.0;
    p.k_proj_weight = rows(E + first * D);
    p.v_proj_weight = rows(2 * E + first * D);
    p.out_proj_weight = Tensor<double>(Shape{2 * D, 2 * D}, 0.0);
    const BasicMultiheadAttention<double> part(part_config, std::move(p));
    Tensor<double> q(Shape{L, 1, 2 * D}, 0.0);
    const Tensor<double> wq = rows(first * D);
    for (int64_t l = 0; l < L; ++l)
      for (int64_t o2 = 0; o2 < 2 * D; ++o2)
        for (int64_t e = 0; e < E; ++e) q.data()[l * 2 * D + o2] += x.data()[l * E + e] * wq.data()[o2 * E + e];
    ForwardOptions<double> po = o;
    po.alibi_heads = 4;
    po.alibi_head_offset = first;
    const Tensor<double> got = *part.forward(q, x, x, po).attn_weights;  // (1, 2, L, L)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < L * L; ++i)
        ASSERT_NEAR(got.data()[h * L * L + i], want.data()[(first + h) * L * L + i], 1e-12)
            << "head " << first + h << ", element " << i;
    // Without the offset, the part's slopes are those of a 2-head module:
    // another function (the check would fail without the option).
    po.alibi_heads = 0;
    po.alibi_head_offset = 0;
    const Tensor<double> own = *part.forward(q, x, x, po).attn_weights;
    double diff = 0;
    for (int64_t i = 0; i < own.numel(); ++i) diff = std::max(diff, std::fabs(own.data()[i] - got.data()[i]));
    EXPECT_GT(diff, 1e-3);
  }
}

TEST(AlibiHeadOffset, OffsetPastTheHeadsIsRefusedNamingIt) {
  MultiheadAttentionConfig c;
  c.embed_dim = 4;
  c.num_heads = 2;
  const MultiheadAttention m(c, 1);
  const Tensor<float> x(Shape{3, 1, 4}, 0.5f);
  ForwardOptions<float> o;
  o.alibi = true;
  o.alibi_heads = 4;
  o.alibi_head_offset = 3;
  try {
    (void)m.forward(x, x, x, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "alibi_head_offset: expected 0 to 2 (heads 2 of alibi_heads 4), got 3");
  }
}

}  // namespace
}  // namespace multihead
