// tests/test_head_ablation.cpp: head importance, masking and pruning
// (multihead/head_ablation.hpp, Michel et al. 2019).
//  - the gate gradient <dL/dW_o,h, W_o,h> against central differences of
//    the loss in the gate, in double (src/train/head_gates.hpp);
//  - masking no head gives the model's own accuracy; masking every head
//    gives the accuracy of the model whose attention branch outputs only
//    out_proj.bias, computed another way: the value projection zeroed
//    (v = 0, so every head's output is 0), the logits equal to the bit;
//  - the bookkeeping: sizes, the pruning order a permutation ordered by
//    layer-normalised importance, the curve's ends.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "multihead/error.hpp"
#include "multihead/head_ablation.hpp"
#include "multihead/lesson_tasks.hpp"
#include "multihead/trained_model.hpp"
#include "train/head_gates.hpp"
#include "train/model.hpp"

namespace multihead {
namespace {

const std::string kModelPath = std::string(MULTIHEAD_TEST_DATA_DIR) + "/../../models/lesson-heads.safetensors";

// The model with every block's value projection (rows 2E … 3E − 1 of
// in_proj_weight, and of in_proj_bias) zeroed: v = 0, so o_h = P_h v_h = 0
// and the attention block outputs out_proj.bias alone.
TrainedModel without_values(const TrainedModel& model) {
  const ModelConfig& c = model.config();
  std::map<std::string, Tensor<float>> p = model.parameters();
  const int64_t E = c.d_model;
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string pre = "blocks." + std::to_string(i) + ".attn.";
    float* w = p.at(pre + "in_proj_weight").data();
    float* b = p.at(pre + "in_proj_bias").data();
    std::fill(w + 2 * E * E, w + 3 * E * E, 0.0f);
    std::fill(b + 2 * E, b + 3 * E, 0.0f);
  }
  return TrainedModel(c, p, model.task());
}

void check_ablation(const TrainedModel& model, const Batch& test, const std::string& name) {
  const HeadAblation a = ablate_heads(model, test);
  const ModelConfig& c = model.config();
  const auto K = static_cast<std::size_t>(c.layers * c.heads);
  const Evaluation own = model.evaluate(test);
  EXPECT_EQ(a.accuracy, own.accuracy) << name << ": nothing masked";
  const Evaluation ones = gated_model(model, std::vector<double>(K, 1.0)).evaluate(test);
  EXPECT_EQ(ones.accuracy, own.accuracy) << name << ": gates all 1";
  ASSERT_EQ(a.pruned_accuracy.size(), K + 1) << name;
  EXPECT_EQ(a.pruned_accuracy.front(), own.accuracy) << name;

  const Evaluation none = without_values(model).evaluate(test);
  const Evaluation all_masked = gated_model(model, std::vector<double>(K, 0.0)).evaluate(test);
  float worst = 0;
  for (int64_t i = 0; i < none.logits.numel(); ++i) worst = std::max(worst, std::fabs(none.logits[i] - all_masked.logits[i]));
  EXPECT_EQ(worst, 0.0f) << name << ": every head gated to 0 vs the value projection zeroed, logits";
  EXPECT_EQ(a.no_attention_accuracy, none.accuracy) << name;
  EXPECT_EQ(a.pruned_accuracy.back(), none.accuracy) << name;
  std::printf("%s: accuracy %.4f, no attention %.4f, %lld sequences\n", name.c_str(), a.accuracy,
              a.no_attention_accuracy, static_cast<long long>(a.sequences));

  ASSERT_EQ(a.importance.size(), K);
  ASSERT_EQ(a.masked_alone.size(), K);
  std::vector<int64_t> order = a.prune_order;
  std::sort(order.begin(), order.end());
  for (std::size_t k = 0; k < K; ++k) EXPECT_EQ(order[k], static_cast<int64_t>(k)) << name << ": prune order";
  // Within a layer, the order is by importance (the layer's norm divides all alike).
  for (std::size_t i = 0; i + 1 < K; ++i)
    for (std::size_t j = i + 1; j < K; ++j) {
      const int64_t x = a.prune_order[i], y = a.prune_order[j];
      if (x / c.heads == y / c.heads) {
        EXPECT_LE(a.importance[static_cast<std::size_t>(x)], a.importance[static_cast<std::size_t>(y)]) << name;
      }
    }
  // Masking head k alone is the first pruning step when k is first.
  EXPECT_EQ(a.pruned_accuracy[1], a.masked_alone[static_cast<std::size_t>(a.prune_order[0])]) << name;
}

TEST(HeadAblation, ShippedModelMaskingNoneIsItsAccuracyMaskingAllIsNoAttention) {
  const LessonTask task;
  check_ablation(TrainedModel::load(kModelPath), task.test_set(), "shipped (1 layer, 4 heads)");
}

TEST(HeadAblation, TrainedTwoLayersHeads2MaskingNoneIsItsAccuracyMaskingAllIsNoAttention) {
  ModelConfig m;
  m.d_model = 16;
  m.heads = 2;
  m.layers = 2;
  m.ff = 16;
  TrainOptions t;
  t.steps = 30;
  t.batch = 16;
  t.threads = 1;
  Trainer trainer(make_task("lesson", 2, 1), m, t);
  for (int i = 0; i < 30; ++i) trainer.train_step();
  const LessonTask task;
  check_ablation(TrainedModel::of(trainer, "lesson"), task.test_set(), "trained 30 steps (2 layers, 2 heads)");
}

// ∂L/∂ξ_k at ξ = 1 against (L(ξ_k = 1 + ε) − L(ξ_k = 1 − ε)) / 2ε, in
// double on a seeded model: ε = 1e-5 leaves a truncation error ~ε²·|L'''|
// (~1e-10) and a rounding error ~1e-16·L/ε (~1e-11); bound 1e-8.
TEST(HeadAblation, GateGradientEqualsCentralDifferencesDoubleLayers2Heads4) {
  const LessonTask task;
  ModelConfig c;
  c.vocabulary = task.vocabulary();
  c.sequence_length = LessonTask::kLength;
  c.d_model = 16;
  c.heads = 4;
  c.layers = 2;
  c.ff = 8;
  const train::Model<double> model(c, 11);
  const std::vector<LessonSentence> s = task.test_sentences();
  const Batch batch = task.encode({s[0], s[7], s[100]});
  train::PassOptions o;
  o.threads = 1;
  const std::map<std::string, Tensor<double>> p = model.parameters();
  const std::vector<double> analytic = train::gate_gradients(c, p, model.run(batch, o, true).gradients);
  const auto loss = [&](std::size_t k, double gate) {
    std::vector<double> gates(analytic.size(), 1.0);
    gates[k] = gate;
    return train::Model<double>(c, train::gated_parameters(c, p, gates)).run(batch, o, false).loss.loss;
  };
  const double eps = 1e-5;
  double largest = 0;
  for (std::size_t k = 0; k < analytic.size(); ++k) {
    const double fd = (loss(k, 1 + eps) - loss(k, 1 - eps)) / (2 * eps);
    EXPECT_NEAR(analytic[k], fd, 1e-8) << "head " << k / 4 + 1 << "." << k % 4 + 1;
    largest = std::max(largest, std::fabs(analytic[k]));
  }
  // A gradient that is not ~0 everywhere, so the comparison can fail.
  EXPECT_GT(largest, 1e-3);
}

TEST(HeadAblation, GatesOfTheWrongCountAreRefusedNamingTheCount) {
  const TrainedModel model = TrainedModel::load(kModelPath);
  try {
    gated_model(model, {1.0, 1.0});
    ADD_FAILURE() << "accepted 2 gates for 4 heads";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "gates: expected 4 values (layers 1 × heads 4), got 2");
  }
}

}  // namespace
}  // namespace multihead
