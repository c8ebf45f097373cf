// tests/train/test_mixed_precision.cpp: TrainOptions::dtype = bf16 / f16.
//  - one mixed-precision pass's gradients against the float64 model's exact
//    gradients on the same rounded weights and inputs, within a bound
//    derived from the unit roundoff and the rounding sites on the path,
//    with the MHA blocks and with RoPE's grouped-query blocks;
//  - a RoPE run at bf16 and f16 reaching the f32 run's accuracy;
//  - the loss scaler (src/train/loss_scale.hpp): overflow halves and skips,
//    2000 clean steps double, disabled never skips, the unscale's check;
//  - a 16-bit run's checkpoint: float32 master weights and moments,
//    compute_dtype (and the f16 scaler's state) in the metadata, and a
//    resumed run equal to the uninterrupted one bit for bit.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "multihead/error.hpp"
#include "multihead/io.hpp"
#include "multihead/narrow.hpp"
#include "multihead/narrow_multihead_attention.hpp"
#include "multihead/train.hpp"
#include "train/loss_scale.hpp"
#include "train/model.hpp"
#include "train_fixtures.hpp"

namespace multihead::test {
namespace {

using train::LossScaler;
using train::Model;
using train::PassOptions;

ModelConfig small_model(Positions positions, bool causal) {
  ModelConfig m;
  m.vocabulary = 7;
  m.sequence_length = 6;
  m.d_model = 16;
  m.heads = 2;
  m.layers = 2;
  m.ff = 16;
  m.positions = positions;
  m.causal = causal;
  return m;
}

// Whether the mixed pass rounds `name` to the compute type: the weights
// and biases of the linear maps and the attention (autocast casts them);
// the embedding and the layer norms stay float32.
bool rounded_parameter(const std::string& name) {
  return name.find("norm") == std::string::npos && name != "embedding.weight";
}

template <class E>
std::map<std::string, Tensor<double>> reference_parameters(const std::map<std::string, Tensor<float>>& master) {
  std::map<std::string, Tensor<double>> out;
  for (const auto& [name, t] : master)
    out[name] = rounded_parameter(name) ? widen<double>(round_to<E>(t)) : tensor_cast<double>(t);
  return out;
}

// The rounding sites a parameter's gradient can pass through, counted on
// the longest path (the first block's in_proj_weight, from the loss):
//  forward, per block: the in_proj input a, Q/K/V, the attention output,
//    the out_proj output, the ff.0 input and output (the ReLU keeps 16-bit
//    values, so ff.2's input is exact), the ff.2 output: 7; then the
//    read-out's input and the logits: 2;
//  backward: d_logits, the read-out's d_x: 2; per block: ff.2's d_y and
//    d_x, ff.0's d_x, the attention's d_output, out_proj's d_x (the merged
//    heads' gradient), dQ/dK/dV, in_proj's d_x (the query, key and value
//    gradients), and the parameter's own gradient: 8.
// With RoPE the block is the 16-bit grouped-query module
// (multihead/narrow_grouped_query_attention.hpp), which rounds once more in
// the forward: q and k after the rotation (its step 2), on top of their
// projection's rounding: 8 forward sites per block. Its backward has the
// MHA's sites: d_output, o_proj's d_x, d_q/d_k/d_v (after RoPE's
// transpose, in float32), one d_x for the three in-projections (one
// rounded float32 sum, where the MHA rounds the three and sums them in
// float32: one site either way) and the parameter's own gradient.
// First order, each site moves what passes through it by at most u
// relatively (|round(t) − t| <= u|t|), and the maps between sites at this
// initialisation (layer-normed activations of norm ~1, weights of norm ~1;
// the rotation is orthogonal) do not amplify a relative change in norm:
// the gradient's norm-wise relative error is then at most (sites)·u.
int64_t rounding_sites(const ModelConfig& c) {
  const int64_t forward = c.positions == Positions::Rope ? 8 : 7;
  return c.layers * (forward + 8) + 2 + 2;
}

struct GradientError {
  std::string worst_name;
  double worst_ratio = 0;  // max over parameters of ‖g̃ − g‖ / ‖g‖
};

GradientError relative_errors(const std::map<std::string, Tensor<float>>& got,
                              const std::map<std::string, Tensor<double>>& want, double scale) {
  GradientError e;
  for (const auto& [name, g] : want) {
    const Tensor<float>& h = got.at(name);
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < g.numel(); ++i) {
      const double d = double(h[i]) / scale - g[i];
      diff += d * d;
      norm += g[i] * g[i];
    }
    const double ratio = std::sqrt(diff) / std::sqrt(norm);
    if (!(ratio <= e.worst_ratio)) {
      e.worst_ratio = ratio;
      e.worst_name = name;
    }
  }
  return e;
}

struct MixedCase {
  ComputeDtype dtype;
  Positions positions;
  bool causal;
  double loss_scale;
  double dropout;  // > 0: a training pass, the same keep decisions in both models (the seed's)
};

// One pass's every gradient at bf16 and f16 (f16 with loss scale 2^10, as
// the trainer's scaler would run it), against Model<double> on the same
// rounded parameters and the same tokens: norm-wise per parameter within
// rounding_sites · u (34u here, 36u with RoPE). Measured (the worst
// parameter): bf16 1.2u–2.0u, f16 1.1u–1.4u with MHA blocks; with RoPE's
// grouped-query blocks bf16 2.5u–5.1u, f16 2.3u–6.6u, the worst always a
// q_proj or k_proj bias (small gradients: without the rotation a key bias
// would shift all of a query's scores alike, which softmax ignores); so
// the first-order bound holds with a wide margin; the checks below show it is not vacuous: the error is above
// float32's level (the 16-bit path ran), a gradient left scaled fails, and
// one element moved by twice the allowed norm fails. Model<double> with
// RoPE is GroupedQueryAttention<double>'s own forward and backward (no
// autograd, no 16-bit code), so it checks the grouped-query wrapper's
// gradients (under the master's names) and the model's wiring of them.
TEST(MixedPrecisionGradients, OnePassAgainstFloat64OnTheSameRoundedWeightsV7L6E16H2F16Layers2B4) {
  const MixedCase cases[] = {{ComputeDtype::BF16, Positions::Sinusoidal, false, 1.0, 0.0},
                             {ComputeDtype::BF16, Positions::Alibi, true, 1.0, 0.0},
                             {ComputeDtype::F16, Positions::Sinusoidal, false, 1024.0, 0.0},
                             {ComputeDtype::F16, Positions::Alibi, true, 1024.0, 0.0},
                             {ComputeDtype::BF16, Positions::Rope, false, 1.0, 0.0},
                             {ComputeDtype::BF16, Positions::Rope, true, 1.0, 0.0},
                             {ComputeDtype::F16, Positions::Rope, false, 1024.0, 0.0},
                             {ComputeDtype::F16, Positions::Rope, true, 1024.0, 0.0},
                             {ComputeDtype::BF16, Positions::Rope, true, 1.0, 0.1},
                             {ComputeDtype::F16, Positions::Rope, false, 1024.0, 0.1}};
  for (const MixedCase& mc : cases) {
    ModelConfig cfg = small_model(mc.positions, mc.causal);
    cfg.dropout = mc.dropout;
    const Model<float> model(cfg, 5);
    const auto task = make_task("reverse", cfg.vocabulary, cfg.sequence_length);
    const Batch batch = task->batch(11, 0, 4);
    PassOptions po;
    po.training = mc.dropout > 0;
    po.seed = 3;
    po.step = 2;
    PassOptions reference_pass = po;  // the same dropout seeds, at f32 (here float64)
    po.compute = mc.dtype;
    po.loss_scale = mc.loss_scale;
    const auto mixed = model.run(batch, po, true);
    const auto master = model.parameters();
    const auto ref_params = mc.dtype == ComputeDtype::BF16 ? reference_parameters<bfloat16>(master)
                                                            : reference_parameters<float16>(master);
    const Model<double> reference(cfg, ref_params);
    const auto exact = reference.run(batch, reference_pass, true);
    ASSERT_EQ(mixed.gradients.size(), exact.gradients.size());

    const double u = unit_roundoff(mc.dtype), sites = double(rounding_sites(cfg));
    const GradientError e = relative_errors(mixed.gradients, exact.gradients, mc.loss_scale);
    const std::string name = to_string(mc.dtype) + " positions=" + to_string(mc.positions) +
                             (mc.causal ? " causal" : "") + (mc.dropout > 0 ? " dropout" : "");
    EXPECT_LE(e.worst_ratio, sites * u) << name << ": worst parameter " << e.worst_name;
    // The loss: float32 cross-entropy of 16-bit logits, V = 7 terms.
    EXPECT_LE(std::abs(mixed.loss.loss - exact.loss.loss), sites * u * exact.loss.loss) << name;
    // Sensitivity: left scaled by the loss scale, the gradients fail.
    if (mc.loss_scale != 1.0) {
      EXPECT_GT(relative_errors(mixed.gradients, exact.gradients, 1.0).worst_ratio, sites * u);
    }
    // With dropout: against the reference without it the gradients fail,
    // so the 16-bit pass dropped, and the same elements as the reference.
    if (mc.dropout > 0) {
      PassOptions no_dropout = reference_pass;
      no_dropout.training = false;
      EXPECT_GT(relative_errors(mixed.gradients, reference.run(batch, no_dropout, true).gradients, mc.loss_scale)
                    .worst_ratio,
                sites * u)
          << name;
    }
    // The 16-bit path ran: the error is far above float32's (which is
    // ~1e-7 here), at least u/16.
    EXPECT_GT(e.worst_ratio, u / 16) << name;
    // The checker: one element of the worst parameter's gradient moved by
    // twice the allowed error norm fails it.
    {
      auto perturbed = mixed.gradients;
      double norm = 0;
      for (int64_t i = 0; i < exact.gradients.at(e.worst_name).numel(); ++i)
        norm += exact.gradients.at(e.worst_name)[i] * exact.gradients.at(e.worst_name)[i];
      perturbed.at(e.worst_name)[0] += float(2 * sites * u * std::sqrt(norm) * mc.loss_scale);
      EXPECT_GT(relative_errors(perturbed, exact.gradients, mc.loss_scale).worst_ratio, sites * u) << name;
    }
    std::printf("[ mixed gradients ] %s: worst ||g16 - g64|| / ||g64|| = %.3g (%s), bound %lld sites x u = %.3g\n",
                name.c_str(), e.worst_ratio, e.worst_name.c_str(), static_cast<long long>(rounding_sites(cfg)),
                sites * u);
  }
}

// At f32 the pass is the float32 model's, whatever loss_scale says about
// the 16-bit path: the mixed code changes nothing there (bit for bit).
TEST(MixedPrecisionGradients, F32PassIsTheFloat32ModelsBitForBit) {
  const ModelConfig cfg = small_model(Positions::Sinusoidal, false);
  const Model<float> model(cfg, 5);
  const Batch batch = make_task("reverse", 7, 6)->batch(11, 0, 4);
  PassOptions po;
  const auto a = model.run(batch, po, true);
  po.compute = ComputeDtype::F32;
  const auto b = model.run(batch, po, true);
  for (const auto& [name, g] : a.gradients)
    EXPECT_EQ(std::memcmp(g.data(), b.gradients.at(name).data(), sizeof(float) * static_cast<std::size_t>(g.numel())), 0)
        << name;
}

TEST(MixedPrecisionGradients, RefusedWhereThereIsNo16BitPath) {
  const Batch batch = make_task("reverse", 7, 6)->batch(11, 0, 2);
  PassOptions po;
  po.compute = ComputeDtype::BF16;
  const Model<double> dbl(small_model(Positions::Sinusoidal, false), 5);
  EXPECT_THROW(dbl.run(batch, po, true), Error);
  // RoPE runs at 16 bits (the test above), but not with inspect: the 16-bit
  // modules return no attention weights.
  const Model<float> rope(small_model(Positions::Rope, false), 5);
  EXPECT_NO_THROW(rope.run(batch, po, true));
  po.inspect = true;
  EXPECT_THROW(rope.run(batch, po, false), Error);
  TrainOptions o;
  o.dtype = ComputeDtype::BF16;
  o.gradients = GradientSum::PerExample;
  EXPECT_THROW(o.validate(), Error);
}

// ---- a RoPE run at 16 bits -------------------------------------------------------
// The copy task as tests/cli/train_dtype.py trains it with MHA blocks (8
// symbols, length 8, 1 layer, d_model 32, 2 heads, ff 32, batch 16, 150
// steps, lr 3e-3, seed 3), here with RoPE's grouped-query blocks, causal
// or not. (Reverse, that script's other permutation task, needs absolute
// positions, which RoPE does not give: at f32 it stays near 40% there.)
// As that script: "final accuracy" is the mean of the last kFinal steps'
// batch accuracies; a 16-bit run passes at the f32 run's less a slack of
// two sampling spreads sqrt(p(1 − p)/n), n = kFinal·B·L counted positions,
// and at least 0.01; the f32 run must itself learn (>= 0.8).
double final_accuracy(const std::shared_ptr<const Task>& task, const ModelConfig& model, ComputeDtype dtype,
                      int64_t final_steps) {
  TrainOptions o;
  o.steps = 150;
  o.batch = 16;
  o.lr = 3e-3;
  o.seed = 3;
  o.threads = 2;
  o.dtype = dtype;
  Trainer trainer(task, model, o);
  double sum = 0;
  while (trainer.step() < o.steps) {
    const StepStats s = trainer.train_step();
    if (trainer.step() > o.steps - final_steps) sum += s.accuracy;
  }
  return sum / double(final_steps);
}

TEST(MixedPrecisionTraining, RopeCopyAtBf16AndF16ReachesTheF32RunsAccuracy) {
  constexpr int64_t kFinal = 10, kBatch = 16, kLength = 8;
  const std::shared_ptr<const Task> task = make_task("copy", 8, kLength);
  for (const bool causal : {false, true}) {
    ModelConfig m;
    m.d_model = 32;
    m.heads = 2;
    m.layers = 1;
    m.ff = 32;
    m.positions = Positions::Rope;
    m.causal = causal;
    const double p = final_accuracy(task, m, ComputeDtype::F32, kFinal);
    EXPECT_GE(p, 0.8) << "f32 RoPE run does not learn" << (causal ? " (causal)" : "");
    const double slack = std::max(0.01, 2 * std::sqrt(p * (1 - p) / double(kFinal * kBatch * kLength)));
    for (const ComputeDtype dtype : {ComputeDtype::BF16, ComputeDtype::F16}) {
      const double got = final_accuracy(task, m, dtype, kFinal);
      EXPECT_GE(got, p - slack) << to_string(dtype) << (causal ? " causal" : "");
      std::printf("[ rope copy ] %s%s: final accuracy %.4f vs f32 %.4f (slack %.3f)\n", to_string(dtype).c_str(),
                  causal ? " causal" : "", got, p, slack);
    }
  }
}

// ---- the loss scaler ---------------------------------------------------------------
TEST(LossScaler, OverflowHalvesTheScaleAndSkipsTheStep) {
  LossScaler s(true);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.clean_steps(), 1);
  EXPECT_FALSE(s.update(false));  // skipped
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.clean_steps(), 0);  // the count starts again
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 16384.0);
}

TEST(LossScaler, DoublesAfterTheGrowthIntervalOfCleanSteps) {
  LossScaler s(true);
  for (int64_t i = 0; i < LossScaler::kGrowthInterval - 1; ++i) ASSERT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 65536.0);  // 1999 clean steps: not yet
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 131072.0);  // the 2000th doubles it
  EXPECT_EQ(s.clean_steps(), 0);
  // An overflow in between restarts the count.
  LossScaler t(true, 8.0, 0, 3);
  EXPECT_TRUE(t.update(true));
  EXPECT_TRUE(t.update(true));
  EXPECT_FALSE(t.update(false));
  EXPECT_EQ(t.scale(), 4.0);
  EXPECT_TRUE(t.update(true));
  EXPECT_TRUE(t.update(true));
  EXPECT_EQ(t.scale(), 4.0);
  EXPECT_TRUE(t.update(true));
  EXPECT_EQ(t.scale(), 8.0);
}

TEST(LossScaler, DisabledIsScaleOneAndNeverSkips) {
  LossScaler s;
  EXPECT_FALSE(s.enabled());
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 1.0);
}

TEST(LossScaler, UnscaleDividesExactlyAndFindsInfAndNaN) {
  std::map<std::string, Tensor<float>> g;
  g["a"] = Tensor<float>({3}, 0.0f);
  g["a"][0] = 3.0f * 1024.0f;
  g["a"][1] = -0.5f * 1024.0f;
  g["b"] = Tensor<float>({2}, 1.0f);
  EXPECT_TRUE(train::unscale_gradients(g, 1024.0));
  EXPECT_EQ(g["a"][0], 3.0f);
  EXPECT_EQ(g["a"][1], -0.5f);
  EXPECT_EQ(g["b"][1], 1.0f / 1024.0f);
  for (const float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()}) {
    g["b"][1] = bad;
    EXPECT_FALSE(train::unscale_gradients(g, 2.0)) << bad;
  }
}

// ---- the 16-bit run's checkpoint ---------------------------------------------------------
std::string temp_path(const std::string& name) { return temp_checkpoint_path(name); }
TrainOptions quick(int64_t steps, ComputeDtype dtype) { return quick_run(steps, 1, dtype); }
ModelConfig run_model() { return small_dropout_model(2); }

// An f16 run whose loss scale overflows the gradient skips the step: the
// parameters and AdamW's moments stay as they were, and so does AdamW's t,
// as torch.cuda.amp.GradScaler skips optimizer.step(). The run starts from a
// fresh model's checkpoint edited to a loss scale of 2^40 (every gradient
// overflows in f16 until the scale has halved to a finite one); the first
// update after the skips must then be AdamW's first, t = 1, which the test
// computes from the moments it wrote: m = (1 − β1)·g, v = (1 − β2)·g², so
// Δp = −lr·(m / (1 − β1)) / (sqrt(v / (1 − β2)) + eps) (weight decay 0).
// Counting the skipped steps (t = skips + 1) would scale that by about a
// half after ~25 skips. Tolerance: the update is computed in float32 (a few
// roundings of relative size 2^-24 on a value of size lr) and p is rounded
// to float32 (half an ulp of |p|): 1e-4·|Δ| + 2^-23·max(|p|, 1).
TEST(MixedPrecisionTraining, SkippedStepsLeaveParametersMomentsAndAdamWsStep) {
  const std::shared_ptr<const Task> task = make_task("reverse", 7, 6);
  TrainOptions o = quick(80, ComputeDtype::F16);
  o.weight_decay = 0.0;
  const std::string path = temp_path("mixed-skip");
  {
    const Trainer fresh(task, run_model(), o);
    fresh.save_checkpoint(path);
  }
  {
    const SafetensorsFile file = read_safetensors(path);
    std::map<std::string, Tensor<float>> tensors;
    for (const auto& [name, t] : file.tensors) {
      Tensor<float> f(t.values.shape());
      for (int64_t e = 0; e < f.numel(); ++e) f.data()[e] = static_cast<float>(t.values.data()[e]);
      tensors[name] = std::move(f);
    }
    std::map<std::string, std::string> metadata = file.metadata;
    ASSERT_EQ(metadata.at("optimizer_steps"), "0");
    // More updates than steps done is refused, naming the field.
    metadata["optimizer_steps"] = "5";
    write_safetensors(path, tensors, metadata);
    try {
      (void)Trainer::resume(path, task, run_model(), o);
      ADD_FAILURE() << "optimizer_steps 5 after 0 steps was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'optimizer_steps': expected 0 to the 0 steps done, got 5"),
                std::string::npos)
          << e.what();
    }
    metadata["optimizer_steps"] = "0";
    metadata["loss_scale"] = to_exact_string(std::ldexp(1.0, 40));
    write_safetensors(path, tensors, metadata);
  }
  Trainer run = Trainer::resume(path, task, run_model(), o);
  std::remove(path.c_str());
  const std::map<std::string, Tensor<float>> before = run.parameters();
  int64_t skipped = 0;
  StepStats s;
  while (run.step() < o.steps) {
    s = run.train_step();
    if (!s.skipped) break;
    ++skipped;
    for (const auto& [name, p] : run.parameters())
      ASSERT_EQ(0, std::memcmp(p.data(), before.at(name).data(), sizeof(float) * p.numel())) << name;
  }
  ASSERT_GE(skipped, 10) << "the scale of 2^40 should overflow f16 for many steps";
  ASSERT_FALSE(s.skipped) << "no step was finite";
  const std::string after_path = temp_path("mixed-skip-after");
  run.save_checkpoint(after_path);
  const SafetensorsFile after = read_safetensors(after_path);
  std::remove(after_path.c_str());
  EXPECT_EQ(after.metadata.at("optimizer_steps"), "1");
  EXPECT_EQ(after.metadata.at("step"), std::to_string(skipped + 1));
  const double b1 = o.beta1, b2 = o.beta2, eps = o.eps;
  int64_t moved = 0;
  for (const auto& [name, p] : run.parameters()) {
    const Tensor<double>& m = after.tensors.at("optimizer.exp_avg." + name).values;
    const Tensor<double>& v = after.tensors.at("optimizer.exp_avg_sq." + name).values;
    const Tensor<float>& p0 = before.at(name);
    for (int64_t e = 0; e < p.numel(); ++e) {
      const double want = -s.lr * (m.data()[e] / (1 - b1)) / (std::sqrt(v.data()[e] / (1 - b2)) + eps);
      const double got = double(p.data()[e]) - double(p0.data()[e]);
      const double tol = 1e-4 * std::abs(want) + std::ldexp(1.0, -23) * std::max(std::abs(double(p0.data()[e])), 1.0);
      ASSERT_LE(std::abs(got - want), tol) << name << "[" << e << "]: moved " << got << ", AdamW at t = 1 gives " << want
                                           << " (" << skipped << " steps skipped before)";
      if (want != 0) ++moved;
    }
  }
  EXPECT_GT(moved, 0);
}

// 3 steps, checkpoint, resume for 3 more == 6 steps uninterrupted, at bf16
// and f16 (whose loss scale and clean-step count the checkpoint carries);
// the file holds float32 parameters and moments and names the compute type.
TEST(MixedPrecisionResume, ResumedRunEqualsUninterruptedAndTheCheckpointIsFloat32) {
  const std::shared_ptr<const Task> task = make_task("reverse", 7, 6);
  for (const ComputeDtype dtype : {ComputeDtype::BF16, ComputeDtype::F16}) {
    const TrainOptions o = quick(6, dtype);
    Trainer whole(task, run_model(), o);
    std::vector<StepStats> want;
    while (whole.step() < 6) want.push_back(whole.train_step());
    Trainer first(task, run_model(), o);
    std::vector<StepStats> got;
    while (first.step() < 3) got.push_back(first.train_step());
    const std::string path = temp_path("mixed-resume-" + to_string(dtype));
    first.save_checkpoint(path);
    const SafetensorsFile file = read_safetensors(path);
    EXPECT_EQ(file.metadata.at("compute_dtype"), to_string(dtype));
    for (const auto& [name, t] : file.tensors) EXPECT_EQ(t.dtype, DType::F32) << name;
    EXPECT_EQ(file.metadata.count("loss_scale"), dtype == ComputeDtype::F16 ? 1u : 0u);
    EXPECT_EQ(read_checkpoint_info(path).options.dtype, dtype);
    Trainer second = Trainer::resume(path, task, run_model(), o);
    while (second.step() < 6) got.push_back(second.train_step());
    // Another compute type is refused, naming it.
    TrainOptions other = o;
    other.dtype = ComputeDtype::F32;
    try {
      (void)Trainer::resume(path, task, run_model(), other);
      ADD_FAILURE() << "resume with another dtype was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("dtype is " + to_string(dtype) + " in the checkpoint, got f32"),
                std::string::npos)
          << e.what();
    }
    std::remove(path.c_str());
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(std::memcmp(&got[i].loss, &want[i].loss, sizeof(double)), 0)
          << to_string(dtype) << " step " << i << ": " << got[i].loss << " vs " << want[i].loss;
      EXPECT_EQ(got[i].loss_scale, want[i].loss_scale);
      EXPECT_EQ(got[i].loss_scale, dtype == ComputeDtype::F16 ? want[0].loss_scale : 1.0);
    }
    const auto a = second.parameters(), b = whole.parameters();
    for (const auto& [name, t] : a)
      EXPECT_EQ(std::memcmp(t.data(), b.at(name).data(), sizeof(float) * static_cast<std::size_t>(t.numel())), 0)
          << name;
    // A 16-bit step moves the float32 master weights by less than a 16-bit
    // ulp at times: they are not all 16-bit values after it.
    int64_t off_grid = 0;
    for (const auto& [name, t] : b)
      for (int64_t i = 0; i < t.numel(); ++i)
        off_grid += to_float(to_bfloat16(t[i])) != t[i] && to_float(to_float16(t[i])) != t[i] ? 1 : 0;
    EXPECT_GT(off_grid, 0) << to_string(dtype);
  }
}

}  // namespace
}  // namespace multihead::test
