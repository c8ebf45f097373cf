// Per-example gradients (TrainOptions::gradients = PerExample), the sum
// `multihead train --parallel data` forms across ranks: here the ranks are
// simulated in one process by shares of the batch, each computed on its
// own (Trainer::example_results) and folded in example order (ExampleFold),
// as tools' data-parallel step passes the fold from rank to rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "multihead/error.hpp"
#include "multihead/train.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

using test::error_of;

ModelConfig small_model(double dropout) {
  ModelConfig m;
  m.d_model = 16;
  m.heads = 4;
  m.layers = 2;
  m.ff = 24;
  m.dropout = dropout;
  return m;
}

TrainOptions per_example(int64_t steps) {
  TrainOptions o;
  o.steps = steps;
  o.batch = 8;
  o.warmup = 2;
  o.seed = 7;
  o.threads = 1;
  o.gradients = GradientSum::PerExample;
  return o;
}

// One step with the batch cut into `shards` equal shares, each share's
// examples computed by one call, the fold taken share after share.
StepStats sharded_step(Trainer& t, int64_t shards) {
  const int64_t per = t.options().batch / shards;
  ExampleFold fold;
  for (int64_t s = 0; s < shards; ++s)
    for (const ExampleResult& r : t.example_results(s * per, (s + 1) * per)) fold.add(r);
  return t.apply(fold);
}

struct RunRecord {
  std::vector<double> losses, norms;
  std::string checkpoint;
};

RunRecord run_sharded(Trainer t, int64_t shards) {
  RunRecord r;
  while (t.step() < t.options().steps) {
    const StepStats s = shards == 0 ? t.train_step() : sharded_step(t, shards);
    r.losses.push_back(s.loss);
    r.norms.push_back(s.grad_norm);
  }
  r.checkpoint = t.serialize_checkpoint();
  return r;
}

void expect_same_run(const RunRecord& want, const RunRecord& got, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (std::size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_EQ(std::memcmp(&got.losses[i], &want.losses[i], sizeof(double)), 0)
        << what << ", step " << i << ": loss " << got.losses[i] << " vs " << want.losses[i];
    EXPECT_EQ(std::memcmp(&got.norms[i], &want.norms[i], sizeof(double)), 0)
        << what << ", step " << i << ": grad_norm " << got.norms[i] << " vs " << want.norms[i];
  }
  EXPECT_TRUE(got.checkpoint == want.checkpoint) << what << ": checkpoint bytes differ";
}

// Shares of 8, 4 and 2 examples (1, 2, 4 simulated ranks) and train_step()
// (the one-process path): the same loss and gradient-norm bits at each of 3
// steps and the same checkpoint bytes, with dropout on: an example's masks
// are its own, whichever share computes it (seeded by its place in the
// local share instead, the 2- and 4-share runs would differ).
TEST(TrainPerExample, Shares1And2And4AndTrainStepGiveBitIdenticalLossesAndCheckpointsB8Dropout01) {
  const std::shared_ptr<const Task> task = make_task("reverse", 7, 6);
  const RunRecord want = run_sharded(Trainer(task, small_model(0.1), per_example(3)), 1);
  EXPECT_NE(want.losses[0], want.losses[2]);  // the run moved
  for (int64_t shards : {0, 2, 4})
    expect_same_run(want, run_sharded(Trainer(task, small_model(0.1), per_example(3)), shards),
                    shards == 0 ? "train_step" : std::to_string(shards) + " shares");
}

// The fold of the per-example gradients is the batch's gradient: each
// example divides by the whole batch's counted positions. Against the
// batched pass (dropout 0, same parameters), every gradient element within
// 1e-5 of its tensor's largest (float32 sums of 8 examples against one
// product over 48 rows: a few ulps of the largest term), the loss within
// 1e-6 of itself (its float32 logits come from products of 6 rows instead
// of 48, a few ulps apart: measured 7e-10).
TEST(TrainPerExample, FoldedGradientIsTheBatchedGradientWithinFloatRoundingB8L6) {
  const std::shared_ptr<const Task> task = make_task("reverse", 7, 6);
  TrainOptions batched = per_example(1);
  batched.gradients = GradientSum::Batched;
  const GradientDump want = Trainer(task, small_model(0.0), batched).gradients();
  const GradientDump got = Trainer(task, small_model(0.0), per_example(1)).gradients();
  EXPECT_NEAR(got.loss, want.loss, 1e-6 * want.loss);
  EXPECT_EQ(got.accuracy, want.accuracy);
  ASSERT_EQ(got.gradients.size(), want.gradients.size());
  for (const auto& [name, g] : want.gradients) {
    const Tensor<float>& h = got.gradients.at(name);
    ASSERT_EQ(h.numel(), g.numel()) << name;
    double largest = 0, worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < g.numel(); ++i) largest = std::max(largest, std::fabs(double(g[i])));
    for (int64_t i = 0; i < g.numel(); ++i)
      if (std::fabs(double(h[i]) - double(g[i])) > worst) worst = std::fabs(double(h[i]) - double(g[i])), at = i;
    EXPECT_LE(worst, 1e-5 * largest) << name << "[" << at << "]: " << h[at] << " vs " << g[at] << ", largest "
                                     << largest;
  }
}

// 2 steps in shares of 2 (4 ranks), checkpoint, resume in one share (1
// rank) and in shares of 4 (2 ranks): the losses and checkpoint of 4 steps
// in one go. The checkpoint records the gradient sum, and a batched trainer
// refuses it (its continuation would not be this run's).
TEST(TrainPerExample, ResumeWithAnotherShareCountGivesTheUninterruptedRunAndBatchedIsRefused) {
  const std::shared_ptr<const Task> task = make_task("reverse", 7, 6);
  const RunRecord want = run_sharded(Trainer(task, small_model(0.1), per_example(4)), 1);
  Trainer first(task, small_model(0.1), per_example(4));
  RunRecord head;
  while (first.step() < 2) head.losses.push_back(sharded_step(first, 4).loss);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("per-example-" + std::to_string(::getpid()) + ".safetensors")).string();
  first.save_checkpoint(path);
  for (int64_t shards : {1, 2}) {
    RunRecord r = run_sharded(Trainer::resume(path, task, small_model(0.1), per_example(4)), shards);
    r.losses.insert(r.losses.begin(), head.losses.begin(), head.losses.end());
    ASSERT_EQ(r.losses.size(), want.losses.size());
    for (std::size_t i = 0; i < want.losses.size(); ++i)
      EXPECT_EQ(std::memcmp(&r.losses[i], &want.losses[i], sizeof(double)), 0)
          << "resumed in " << shards << " shares, step " << i << ": " << r.losses[i] << " vs " << want.losses[i];
    EXPECT_TRUE(r.checkpoint == want.checkpoint) << "resumed in " << shards << " shares: checkpoint bytes differ";
  }
  TrainOptions batched = per_example(4);
  batched.gradients = GradientSum::Batched;
  EXPECT_EQ(error_of([&] { Trainer::resume(path, task, small_model(0.1), batched); }),
            "'" + path + "': gradients are summed per example (data-parallel training) in the checkpoint, got over the batch "
                         "at once");
  EXPECT_EQ(read_checkpoint_info(path).options.gradients, GradientSum::PerExample);
  std::remove(path.c_str());
}

TEST(TrainPerExample, FoldAndApplyRefuseExamplesOutOfOrderOrMissing) {
  const std::shared_ptr<const Task> task = make_task("reverse", 7, 6);
  Trainer t(task, small_model(0.0), per_example(1));
  const std::vector<ExampleResult> r = t.example_results(0, 3);
  ExampleFold fold;
  EXPECT_EQ(error_of([&] { fold.add(r[1]); }), "fold: expected example 0 next (examples are added in order), got 1");
  fold.add(r[0]);
  ExampleResult shorter = r[1];
  shorter.gradient.pop_back();
  EXPECT_EQ(error_of([&] { fold.add(shorter); }),
            "fold: expected a gradient of " + std::to_string(r[0].gradient.size()) + " values for example 1, got " +
                std::to_string(r[0].gradient.size() - 1));
  EXPECT_EQ(error_of([&] { t.apply(fold); }), "apply: expected the fold of the whole batch, 8 examples, got 1");
  EXPECT_EQ(error_of([&] { t.example_results(6, 9); }),
            "example_results: expected 0 <= begin <= end <= batch 8, got begin 6, end 9");
  TrainOptions batched = per_example(1);
  batched.gradients = GradientSum::Batched;
  EXPECT_EQ(error_of([&] { Trainer(task, small_model(0.0), batched).example_results(0, 1); }),
            "example_results: expected a trainer with per-example gradients, got batched");
}

}  // namespace
}  // namespace multihead
