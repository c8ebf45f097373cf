// tests/test_mha_weights.cpp: the module's selected attention weights
// (ForwardOptions::weights_heads, weights_rows) and where they come from.
//
// On the flash kernel (float32, kernel Auto or Flash) need_weights runs the
// flash forward, saving each row's lse, and recomputes the selected weights
// from it (src/simd/flash_weights-inl.h); on the materialized and reference
// kernels (and in float64) the selection is copied out of the full weights.
//
// Tolerances, and why:
//  - a selection against the same call's full weights: bit-for-bit. On the
//    flash kernel every (i, j) weight is computed from (i, j) alone, whatever
//    tile or other rows share the work (flash_weights.cpp); on the others
//    the selection is a copy. The mean over selected heads is summed in the
//    order the test sums it, so it is bit-for-bit too.
//  - flash-recomputed weights against the materialized kernel's: 1e-6
//    absolute, the bar (both carry a few float ulp of a weight <= 1;
//    tests/test_score_rule.cpp derives the recompute's bound per element).
//  - the output is the same flash forward with or without weights: bit-for-bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "multihead/error.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/runtime.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

using test::random_tensor;

struct SelectionCase {
  AttentionKernel kernel;
  bool bias_kv_zero_attn;  // S' = S + 2
  bool causal_and_padding;
  bool batch_first;
  std::string name() const {
    std::string n = kernel == AttentionKernel::Auto ? "auto" : kernel == AttentionKernel::Flash ? "flash" : "materialized";
    n += bias_kv_zero_attn ? "_biaskv_zeroattn" : "_plain";
    n += causal_and_padding ? "_causal_pad" : "_nomask";
    n += batch_first ? "_batchfirst" : "_seqfirst";
    return n;
  }
};

constexpr int64_t kE = 16, kH = 4, kB = 2, kL = 37, kS = 29;

class WeightsSelection : public ::testing::TestWithParam<SelectionCase> {};

TEST_P(WeightsSelection, SubsetIsTheSliceOfTheFullWeights) {
  const SelectionCase c = GetParam();
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = kE;
  cfg.num_heads = kH;
  cfg.add_bias_kv = cfg.add_zero_attn = c.bias_kv_zero_attn;
  cfg.batch_first = c.batch_first;
  const MultiheadAttention mha(cfg, 7);
  std::mt19937_64 rng(11);
  const Shape qs = c.batch_first ? Shape{kB, kL, kE} : Shape{kL, kB, kE};
  const Shape ks = c.batch_first ? Shape{kB, kS, kE} : Shape{kS, kB, kE};
  const Tensor<float> q = random_tensor<float>(qs, rng), k = random_tensor<float>(ks, rng),
                      v = random_tensor<float>(ks, rng);
  Tensor<uint8_t> pad(Shape{kB, kS}, uint8_t{0});
  pad[kS - 1] = pad[kS + 3] = 1;
  const Mask<float> padding = Mask<float>::boolean(pad);
  ForwardOptions<float> o;
  o.attention.kernel = c.kernel;
  o.average_attn_weights = false;
  if (c.causal_and_padding) {
    o.attention.is_causal = true;
    o.key_padding_mask = &padding;
  }
  const ForwardResult<float> full = mha.forward(q, k, v, o);
  const int64_t St = full.attn_weights->size(3);
  ASSERT_EQ(full.attn_weights->shape(), (Shape{kB, kH, kL, St}));

  ForwardOptions<float> s = o;
  s.weights_heads = {3, 0};
  s.weights_rows = {5, 6, 7, 8, 0, kL - 1};
  const ForwardResult<float> some = mha.forward(q, k, v, s);
  const int64_t Hs = 2, Ls = 6;
  ASSERT_EQ(some.attn_weights->shape(), (Shape{kB, Hs, Ls, St}));
  for (int64_t x = 0; x < full.output.numel(); ++x) ASSERT_EQ(some.output[x], full.output[x]) << "output " << x;
  const auto at = [&](const Tensor<float>& w, int64_t H, int64_t L, int64_t b, int64_t h, int64_t i, int64_t j) {
    return w[((b * H + h) * L + i) * St + j];
  };
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t h = 0; h < Hs; ++h)
      for (int64_t i = 0; i < Ls; ++i)
        for (int64_t j = 0; j < St; ++j) {
          const float got = at(*some.attn_weights, Hs, Ls, b, h, i, j);
          const float want = at(*full.attn_weights, kH, kL, b, s.weights_heads[h], s.weights_rows[i], j);
          ASSERT_EQ(got, want) << "b=" << b << " head=" << s.weights_heads[h] << " row=" << s.weights_rows[i]
                               << " key=" << j;
        }

  // Averaged over the selected heads: (B, L', S'), their mean.
  s.average_attn_weights = true;
  const ForwardResult<float> mean = mha.forward(q, k, v, s);
  ASSERT_EQ(mean.attn_weights->shape(), (Shape{kB, Ls, St}));
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t i = 0; i < Ls; ++i)
      for (int64_t j = 0; j < St; ++j) {
        float sum = 0.0f;
        for (int64_t h = 0; h < Hs; ++h) sum += at(*some.attn_weights, Hs, Ls, b, h, i, j);
        ASSERT_EQ((*mean.attn_weights)[(b * Ls + i) * St + j], sum / static_cast<float>(Hs))
            << "b=" << b << " row=" << s.weights_rows[i] << " key=" << j;
      }

  // Only heads, and only rows.
  ForwardOptions<float> heads_only = o, rows_only = o;
  heads_only.weights_heads = {1};
  rows_only.weights_rows = {kL - 1};
  EXPECT_EQ(mha.forward(q, k, v, heads_only).attn_weights->shape(), (Shape{kB, 1, kL, St}));
  EXPECT_EQ(mha.forward(q, k, v, rows_only).attn_weights->shape(), (Shape{kB, kH, 1, St}));

  // The flash recompute against the materialized kernel's weights, 1e-6.
  if (c.kernel != AttentionKernel::Materialized) {
    ForwardOptions<float> m = o;
    m.attention.kernel = AttentionKernel::Materialized;
    const ForwardResult<float> mat = mha.forward(q, k, v, m);
    for (int64_t x = 0; x < mat.attn_weights->numel(); ++x)
      ASSERT_NEAR((*full.attn_weights)[x], (*mat.attn_weights)[x], 1e-6) << "weight " << x;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, WeightsSelection,
    ::testing::Values(SelectionCase{AttentionKernel::Auto, false, false, false},
                      SelectionCase{AttentionKernel::Auto, true, true, false},
                      SelectionCase{AttentionKernel::Flash, false, true, true},
                      SelectionCase{AttentionKernel::Materialized, false, false, false},
                      SelectionCase{AttentionKernel::Materialized, true, true, true}),
    [](const auto& info) { return info.param.name(); });

// The textbook form and float64 honour the same selection (there, a copy
// out of the full weights).
TEST(WeightsSelectionForms, TextbookAndDoubleSelectTheSame) {
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 8;
  cfg.num_heads = 2;
  const BasicMultiheadAttention<double> mha(cfg, 3);
  std::mt19937_64 rng(5);
  const Tensor<double> x = random_tensor<double>({6, 1, 8}, rng);
  ForwardOptions<double> o;
  o.average_attn_weights = false;
  const Tensor<double> full = *mha.forward(x, x, x, o).attn_weights;
  o.weights_heads = {1};
  o.weights_rows = {4, 2};
  for (bool textbook : {false, true}) {
    const Tensor<double> w = *(textbook ? mha.forward_textbook(x, x, x, o) : mha.forward(x, x, x, o)).attn_weights;
    ASSERT_EQ(w.shape(), (Shape{1, 1, 2, 6}));
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 6; ++j)
        EXPECT_NEAR(w[i * 6 + j], full[(1 * 6 + o.weights_rows[i]) * 6 + j], 1e-12)
            << (textbook ? "textbook" : "fused") << " row " << o.weights_rows[i] << " key " << j;
  }
}

// Training with dropout: the recompute drops exactly the weights the
// materialized kernel drops (the same keep decisions, dropout_keep of the
// slice b·H + h, the row and the key) and scales the kept by 1/(1 − p): 1e-6;
// and a training forward with a context (whose lse the recompute reads)
// returns the same weights bit-for-bit.
TEST(WeightsSelectionDropout, TrainingWeightsMatchTheMaterializedKernel) {
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 16;
  cfg.num_heads = 4;
  cfg.dropout = 0.3;
  const MultiheadAttention mha(cfg, 9);
  std::mt19937_64 rng(4);
  const Tensor<float> x = random_tensor<float>({21, 2, 16}, rng);
  ForwardOptions<float> o;
  o.training = true;
  o.attention.dropout_seed = 77;
  o.average_attn_weights = false;
  o.weights_heads = {2, 3};
  const ForwardResult<float> flash = mha.forward(x, x, x, o);
  ForwardContext<float> ctx;
  const ForwardResult<float> with_context = mha.forward(x, x, x, o, ctx);
  o.attention.kernel = AttentionKernel::Materialized;
  const ForwardResult<float> mat = mha.forward(x, x, x, o);
  int64_t dropped = 0;
  for (int64_t i = 0; i < mat.attn_weights->numel(); ++i) {
    ASSERT_NEAR((*flash.attn_weights)[i], (*mat.attn_weights)[i], 1e-6) << "weight " << i;
    ASSERT_EQ((*with_context.attn_weights)[i], (*flash.attn_weights)[i]) << "weight " << i;
    dropped += (*mat.attn_weights)[i] == 0.0f;
  }
  EXPECT_GT(dropped, mat.attn_weights->numel() / 5) << "dropout at 0.3 should zero about 30% of the weights";
}

// One clear line naming the option, the expected and the actual value.
TEST(WeightsSelectionErrors, NameTheOptionExpectedAndActual) {
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 8;
  cfg.num_heads = 2;
  const MultiheadAttention mha(cfg, 1);
  const Tensor<float> x({5, 1, 8}, 0.25f);
  const auto message = [&](const ForwardOptions<float>& o) -> std::string {
    try {
      (void)mha.forward(x, x, x, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  ForwardOptions<float> o;
  o.weights_heads = {0, 2};
  EXPECT_EQ(message(o), "weights_heads[1]: expected a head in [0, 2), got 2");
  o.weights_heads = {1, 1};
  EXPECT_EQ(message(o), "weights_heads[1]: expected each head at most once, got 1 again");
  o.weights_heads = {};
  o.weights_rows = {-1};
  EXPECT_EQ(message(o), "weights_rows[0]: expected a query row in [0, 5), got -1");
  o.weights_rows = {5};
  EXPECT_EQ(message(o), "weights_rows[0]: expected a query row in [0, 5), got 5");
  o.need_weights = false;
  o.weights_rows = {1};
  EXPECT_EQ(message(o),
            "weights_rows: expected need_weights=true (it selects which weights need_weights returns), "
            "got need_weights=false");
}

// Memory: one query row's weights at L = S = 2^17 on the flash kernel. The
// full (B, H, L, S) weights would be 128 GiB, which the same call without a
// selection refuses (more than this machine's memory); with the selection
// the call holds B·H'·L'·S floats (1 MiB here) and succeeds. A window of 1
// keeps the forward itself cheap (each query tile visits one or two key
// tiles) and makes the answer exact: query i sees only key i, weight 1.
TEST(WeightsSelectionMemory, OneRowAtLargeLengthHoldsNoLxS) {
  constexpr int64_t L = int64_t{1} << 17;
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 4;
  cfg.num_heads = 2;
  const MultiheadAttention mha(cfg, 2);
  std::mt19937_64 rng(3);
  const Tensor<float> x = random_tensor<float>({L, 1, 4}, rng);
  ForwardOptions<float> o;
  o.average_attn_weights = false;
  o.attention.window = 1;
  try {
    (void)mha.forward(x, x, x, o);
    FAIL() << "expected the full weights to be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("GiB"), std::string::npos) << e.what();
  }
  const int64_t row = 123457;
  o.weights_heads = {1};
  o.weights_rows = {row};
  const ForwardResult<float> r = mha.forward(x, x, x, o);
  ASSERT_EQ(r.attn_weights->shape(), (Shape{1, 1, 1, L}));
  for (int64_t j = 0; j < L; ++j) ASSERT_EQ((*r.attn_weights)[j], j == row ? 1.0f : 0.0f) << "key " << j;
}

}  // namespace
}  // namespace multihead
