// tests/test_train_optim.cpp: AdamW, clipping, the learning-rate schedule
// and the built-in tasks, each against a formula written out here.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>
#include <set>

#include "multihead/error.hpp"
#include "multihead/train.hpp"
#include "train/adamw.hpp"

namespace multihead::test {
namespace {

using namespace multihead::train;

struct Reference {
  double p, m, v;
};

// torch.optim.AdamW's step (1.13, _single_tensor_adamw) in float64:
// torch places eps after dividing √v by √(1 − β2^t): p −= lr/(1−β1^t) · m / (√v/√(1−β2^t) + eps).
Reference adamw_torch(double p, double m, double v, double g, double lr, double b1, double b2, double eps, double wd,
                      int t) {
  p = p * (1 - lr * wd);
  m = b1 * m + (1 - b1) * g;
  v = b2 * v + (1 - b2) * g * g;
  p = p - (lr / (1 - std::pow(b1, t))) * m / (std::sqrt(v) / std::sqrt(1 - std::pow(b2, t)) + eps);
  return {p, m, v};
}

// Step t = 3 from non-zero moments, with and without decay, in double: the
// update is the formula's to 1e-15 relative (a few roundings of order-1
// values; the formula and the code associate differently).
TEST(TrainAdamW, OneStepT3MatchesTorchFormulaDouble) {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> n(0.0, 1.0);
  const AdamWSettings s{3e-3, 0.9, 0.98, 1e-6, 0.1};
  for (bool decay : {false, true}) {
    Tensor<double> p({17}), g({17});
    AdamWMoments<double> mo{Tensor<double>({17}), Tensor<double>({17})};
    for (int i = 0; i < 17; ++i) {
      p[i] = n(rng);
      g[i] = n(rng);
      mo.m[i] = 0.1 * n(rng);
      mo.v[i] = 0.01 * std::abs(n(rng));
    }
    const Tensor<double> p0 = p, m0 = mo.m, v0 = mo.v;
    adamw_update(p, g, mo, s, decay, 3);
    for (int i = 0; i < 17; ++i) {
      const Reference r = adamw_torch(p0[i], m0[i], v0[i], g[i], s.lr, s.beta1, s.beta2, s.eps,
                                      decay ? s.weight_decay : 0.0, 3);
      EXPECT_NEAR(p[i], r.p, 1e-15 * (1 + std::abs(r.p))) << "decay " << decay << " element " << i;
      EXPECT_NEAR(mo.m[i], r.m, 1e-16 * (1 + std::abs(r.m)));
      EXPECT_NEAR(mo.v[i], r.v, 1e-16 * (1 + std::abs(r.v)));
    }
  }
}

// With eps negligible, the first step moves every element by lr·sign(g)
// (m̂/√v̂ = g/|g|) plus the decay: the textbook property, independent of
// torch's placement of eps.
TEST(TrainAdamW, FirstStepMovesByLrTimesSignFloat) {
  const AdamWSettings s{1e-2, 0.9, 0.999, 1e-12, 0.5};
  Tensor<float> p({4}), g({4});
  const float pv[4] = {1.0f, -2.0f, 0.5f, 3.0f}, gv[4] = {0.3f, -7.0f, 1e-3f, -0.2f};
  for (int i = 0; i < 4; ++i) {
    p[i] = pv[i];
    g[i] = gv[i];
  }
  AdamWMoments<float> mo{Tensor<float>({4}, 0.0f), Tensor<float>({4}, 0.0f)};
  adamw_update(p, g, mo, s, true, 1);
  for (int i = 0; i < 4; ++i) {
    const double want = pv[i] * (1 - s.lr * s.weight_decay) - s.lr * (gv[i] > 0 ? 1 : -1);
    // float32 rounding of p, m and v: a few ulps of order-1 values.
    EXPECT_NEAR(p[i], want, 1e-6 * (1 + std::abs(want))) << i;
  }
}

TEST(TrainAdamW, DecaysWeightMatricesOnly) {
  for (const char* name : {"blocks.0.attn.in_proj_weight", "blocks.1.attn.out_proj.weight", "blocks.0.ff.0.weight",
                           "blocks.0.ff.2.weight", "readout.weight"})
    EXPECT_TRUE(decays(name)) << name;
  for (const char* name : {"embedding.weight", "blocks.0.norm1.weight", "blocks.0.norm2.weight", "norm_f.weight",
                           "blocks.0.attn.in_proj_bias", "blocks.0.attn.out_proj.bias", "blocks.0.ff.0.bias",
                           "readout.bias", "norm_f.bias"})
    EXPECT_FALSE(decays(name)) << name;
}

// clip_grad_norm_: norm over every tensor together; scaled by
// max/(norm + 1e-6) only when above the bound.
TEST(TrainClip, GlobalNormAndScale) {
  std::map<std::string, Tensor<double>> g;
  g["a"] = Tensor<double>({2}, 3.0);  // 9 + 9
  g["b"] = Tensor<double>({1}, 4.0);  // 16 -> norm √34
  const double norm = clip_gradients(g, 1.0);
  EXPECT_DOUBLE_EQ(norm, std::sqrt(34.0));
  const double scale = 1.0 / (std::sqrt(34.0) + 1e-6);
  EXPECT_DOUBLE_EQ(g["a"][0], 3.0 * scale);
  EXPECT_DOUBLE_EQ(g["b"][0], 4.0 * scale);
  std::map<std::string, Tensor<double>> small;
  small["a"] = Tensor<double>({1}, 0.5);
  EXPECT_DOUBLE_EQ(clip_gradients(small, 1.0), 0.5);
  EXPECT_EQ(small["a"][0], 0.5);  // under the bound: unchanged
  std::map<std::string, Tensor<double>> off;
  off["a"] = Tensor<double>({1}, 50.0);
  clip_gradients(off, 0.0);
  EXPECT_EQ(off["a"][0], 50.0);  // 0 = no clipping
}

TEST(TrainSchedule, WarmupThenCosineToTenthOrConstant) {
  TrainOptions o;
  o.lr = 1e-3;
  o.warmup = 10;
  o.steps = 110;
  o.schedule = Schedule::Cosine;
  EXPECT_DOUBLE_EQ(learning_rate(o, 0), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(o, 4), 5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(o, 10), 1e-3);   // first step after warm-up: the peak
  EXPECT_NEAR(learning_rate(o, 109), 1e-4, 1e-15);  // last step: 0.1·lr
  // Halfway (p = 0.5): lr·(0.1 + 0.45).
  o.steps = 111;
  EXPECT_NEAR(learning_rate(o, 60), 1e-3 * 0.55, 1e-15);
  o.schedule = Schedule::Constant;
  EXPECT_DOUBLE_EQ(learning_rate(o, 60), 1e-3);
  o.warmup = 0;
  EXPECT_DOUBLE_EQ(learning_rate(o, 0), 1e-3);
}

TEST(TrainTasks, ReverseAndCopyTargetsAreTheirPermutation) {
  const auto rev = make_task("reverse", 10, 7), copy = make_task("copy", 10, 7);
  const Batch r = rev->batch(5, 3, 4), c = copy->batch(5, 3, 4);
  ASSERT_EQ(r.tokens.size(), 28u);
  EXPECT_EQ(r.tokens, c.tokens);  // same seed and step: same inputs
  std::set<int32_t> seen;
  for (int b = 0; b < 4; ++b)
    for (int l = 0; l < 7; ++l) {
      EXPECT_EQ(r.targets[b * 7 + l], r.tokens[b * 7 + 6 - l]);
      EXPECT_EQ(c.targets[b * 7 + l], c.tokens[b * 7 + l]);
      EXPECT_EQ(r.mask[b * 7 + l], 1);
      ASSERT_GE(r.tokens[b * 7 + l], 0);
      ASSERT_LT(r.tokens[b * 7 + l], 10);
      seen.insert(r.tokens[b * 7 + l]);
    }
  EXPECT_GE(seen.size(), 6u);  // 28 draws from 10 symbols cover most of them
}

TEST(TrainTasks, BatchIsAPureFunctionOfSeedAndStep) {
  const auto t = make_task("reverse", 16, 8);
  EXPECT_EQ(t->batch(1, 7, 3).tokens, t->batch(1, 7, 3).tokens);
  EXPECT_NE(t->batch(1, 7, 3).tokens, t->batch(1, 8, 3).tokens);
  EXPECT_NE(t->batch(1, 7, 3).tokens, t->batch(2, 7, 3).tokens);
}

TEST(TrainTasks, BadArgumentsNameThem) {
  auto message = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([] { make_task("sort", 10, 8); }), "task: expected one of copy, reverse, lesson, lookup2; got 'sort'");
  EXPECT_EQ(message([] { make_task("copy", 1, 8); }), "task symbols: expected 2 to 65536, got 1");
  EXPECT_EQ(message([] { make_task("copy", 10, 0); }), "task length: expected 1 to 65536, got 0");
}

TEST(TrainOptionsValidate, BadFieldsNameThemselves) {
  ModelConfig m;
  m.vocabulary = 10;
  m.sequence_length = 8;
  m.d_model = 30;
  m.heads = 4;
  try {
    m.validate();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "heads: expected a divisor of d_model 30, got 4");
  }
  TrainOptions o;
  o.lr = -1;
  try {
    o.validate();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "lr: expected a finite number > 0, got -1");
  }
}

}  // namespace
}  // namespace multihead::test
