// multihead/train.hpp: a small Transformer encoder and the loop that trains it.
//
// The model (Vaswani et al. 2017, with the layer norm placed first):
//   x      = embedding[tokens] + PE                 PE: sinusoidal_positions (§3.5)
//   for each block i < layers:
//     x    = x + attn_i(norm1_i(x))                 self-attention, MultiheadAttention
//     x    = x + ff_i(norm2_i(x))                   Linear–ReLU–Linear, when ff > 0
//   logits = readout(norm_f(x))
//   loss   = cross-entropy over the positions the task's mask counts
//
// Pre-LN (Xiong et al. 2020, "On Layer Normalization in the Transformer
// Architecture"), not the 2017 paper's post-LN: with the norm inside the
// residual branch the gradient reaching every block is well scaled at
// initialisation, so a two-core, few-hundred-step run trains at lr 1e-3
// without a long warm-up. It costs one more LayerNorm (norm_f) before the
// read-out, as in GPT-2. No embedding scale (√E) and no dropout outside the
// attention weights: the tasks are small and the fewer moving parts the
// easier the PyTorch copy (tests/train/torch_model.py) is to check.
//
// Parameter names follow PyTorch's state_dict of the same model built from
// nn.Embedding, nn.MultiheadAttention, nn.LayerNorm, nn.Linear and
// nn.Sequential(Linear, ReLU, Linear):
//   embedding.weight (V, E)
//   blocks.i.norm1.{weight,bias} (E)
//   blocks.i.attn.in_proj_weight (3E, E), in_proj_bias (3E),
//   blocks.i.attn.out_proj.{weight (E, E), bias (E)}
//   blocks.i.norm2.{weight,bias} (E)                   when ff > 0
//   blocks.i.ff.0.{weight (F, E), bias (F)}, blocks.i.ff.2.{weight (E, F), bias (E)}
//   norm_f.{weight,bias} (E), readout.{weight (V, E), bias (V)}
//
// Legend: B batch, L sequence length, N = B·L tokens, E d_model, H heads,
// F feed-forward width, V vocabulary.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "multihead/narrow.hpp"
#include "multihead/tensor.hpp"

namespace multihead {

// ---- data ----------------------------------------------------------------------
// One batch of a task. Row b, position l of every tensor belongs together.
struct Batch {
  int64_t batch = 0, length = 0;  // B, L
  std::vector<int32_t> tokens;    // (B, L) row-major: input ids in [0, V)
  std::vector<int32_t> targets;   // (B, L) the id the model should predict at each position
  std::vector<uint8_t> mask;      // (B, L) 1 = this position counts in the loss, 0 = it does not
};

// What the trainer trains on. A task is a pure function of (seed, step):
// batch(seed, step, B) returns the same batch whenever it is called, so a
// resumed run sees the batches an uninterrupted one would, with no
// generator state to save.
class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  virtual int64_t vocabulary() const = 0;       // V: ids are in [0, V)
  virtual int64_t sequence_length() const = 0;  // L
  // Whether query i may look only at positions <= i (a language-model task).
  virtual bool causal() const { return false; }
  virtual Batch batch(uint64_t seed, int64_t step, int64_t batch_size) const = 0;
};

// The built-in tasks, each over `symbols` ids and sequences of `length`:
//  - "copy":    targets = tokens;
//  - "reverse": targets[l] = tokens[L − 1 − l] (needs attention and positions:
//               each output must find the token mirrored to it).
// Tokens are drawn uniformly by a counter-based hash of (seed, step, b, l).
// Throws multihead::Error for an unknown name (listing the known ones),
// symbols < 2 or length < 1.
std::unique_ptr<Task> make_task(const std::string& name, int64_t symbols, int64_t length);
std::vector<std::string> task_names();

// ---- model and training ----------------------------------------------------------
// Where the model learns token order from (docs/experiment.md, "Positional
// encodings"): nothing; sinusoidal vectors added to the embeddings
// (Vaswani et al. 2017 §3.5, the default); RoPE on each head's query and key
// (Su et al. 2021, half-split, theta 10000: the grouped-query module of
// multihead/grouped_query_attention.hpp with one K/V head per head and
// biases, since MultiheadAttention has no RoPE); ALiBi's per-head distance
// penalty on the scores (Press et al. 2022, ForwardOptions::alibi).
enum class Positions { None, Sinusoidal, Rope, Alibi };
std::string to_string(Positions positions);  // "none", "sinusoidal", "rope", "alibi"
// Throws multihead::Error naming `what` for another name.
Positions parse_positions(const std::string& name, const std::string& what = "positions");

struct ModelConfig {
  int64_t vocabulary = 0;       // V
  int64_t sequence_length = 0;  // L (positions the encoding is built for)
  int64_t d_model = 64;         // E
  int64_t heads = 4;            // H, divides E
  int64_t layers = 2;           // blocks, >= 1
  int64_t ff = 128;             // F; 0 = no feed-forward sub-layer
  double dropout = 0.0;         // on the attention weights, while training
  bool causal = false;          // causal self-attention
  Positions positions = Positions::Sinusoidal;
  // Throws multihead::Error naming the bad field, expected and actual.
  void validate() const;
};

enum class Schedule { Constant, Cosine };

// How a step's gradient is summed over the batch.
//  - Batched: one forward and backward over the whole batch, B·L rows in
//    every matrix product (`multihead train`);
//  - PerExample: one forward and backward per example, each divided by the
//    whole batch's counted positions, the B gradients added in example
//    order (ExampleFold). `multihead train --parallel data` computes this
//    at every rank count, so its losses do not depend on how the batch is
//    split (docs/distributed.md). Its dropout masks are per example
//    (src/train/seeds.hpp), so its run is not the Batched run.
enum class GradientSum { Batched, PerExample };

struct TrainOptions {
  int64_t steps = 200;
  int64_t batch = 32;
  double lr = 1e-3;             // peak learning rate
  int64_t warmup = 20;          // linear warm-up from lr/warmup to lr over this many steps
  Schedule schedule = Schedule::Cosine;  // after warm-up: constant, or cosine to 0.1·lr at `steps`
  double weight_decay = 0.01;   // AdamW, on weight matrices only (adamw.hpp says which)
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double clip = 1.0;            // global gradient norm bound; 0 = no clipping
  uint64_t seed = 0;            // initialisation, data and dropout
  int threads = 0;              // our loops; 0 = OpenMP's default
  GradientSum gradients = GradientSum::Batched;
  // Mixed precision (docs/precision.md, "Training"): the type the forward
  // and backward compute in. F32: everything float32. BF16 / F16: as
  // PyTorch's CPU autocast, every linear map (the attention's projections,
  // the feed-forward layers, the read-out) and the attention itself take
  // their inputs and weights rounded to the 16-bit type, sum in float32 and
  // round their outputs, and the backward rounds the gradients those layers
  // take and give; the embedding, layer norms, residual adds, softmax, the
  // loss and AdamW stay float32. Master weights and AdamW's moments are
  // float32 either way (what the checkpoint holds). F16 adds dynamic loss
  // scaling (src/train/loss_scale.hpp: 2^16 at first, halved and the step
  // skipped on an inf/NaN gradient, doubled after 2000 clean steps).
  // With Positions::Rope the blocks' grouped-query attention runs as
  // NarrowGroupedQueryAttention (multihead/narrow_grouped_query_attention.hpp).
  // Not with GradientSum::PerExample.
  ComputeDtype dtype = ComputeDtype::F32;
  void validate() const;
};

// Refuses (multihead::Error, check_fits_in_memory's line)
// a training step that cannot fit in this machine's memory, before anything
// is allocated: a lower bound from the parameters with their gradients and
// AdamW's moments, the batch and each pass's activations. `model` has its
// vocabulary and sequence_length set (the task's). Trainer's constructor
// calls it; `multihead experiment` calls it for each task's largest run
// before the first.
// `hint` ends the message (a program names its own flags there).
void check_training_fits(const ModelConfig& model, const TrainOptions& options,
                         const std::string& hint = "a lower bound; lower batch, sequence_length, d_model or layers");

std::string to_string(Schedule schedule);
Schedule parse_schedule(const std::string& name);  // "constant" | "cosine"

// The learning rate of step t (0-based): (t + 1)/warmup · lr during warm-up,
// then constant, or lr·(0.1 + 0.9·(1 + cos(π·p))/2) with p the fraction of
// the post-warm-up steps done.
double learning_rate(const TrainOptions& options, int64_t step);

// What one step measured (before the update it made).
struct StepStats {
  int64_t step = 0;          // 0-based index of the step
  double loss = 0;           // mean cross-entropy over the counted positions
  double accuracy = 0;       // fraction of counted positions whose argmax is the target
  double grad_norm = 0;      // global gradient norm before clipping
  double lr = 0;             // the learning rate used
  int64_t tokens = 0;        // counted positions
  // F16 (dynamic loss scaling): the scale this step's backward ran at, and
  // whether its gradient overflowed, so the update was skipped (the
  // parameters and moments are unchanged; the step still counts).
  double loss_scale = 1;
  bool skipped = false;
};

// The loss and gradients of one batch, without an update (what
// `multihead train --dump-gradients` writes).
struct GradientDump {
  double loss = 0;
  double accuracy = 0;
  std::map<std::string, Tensor<float>> gradients;  // under the parameter names
};

// ---- per-example gradients (GradientSum::PerExample) ---------------------------
// One example's pass: its gradient and its share of the loss.
struct ExampleResult {
  int64_t example = 0;            // b: its place in the step's batch
  std::vector<float> gradient;    // every parameter's gradient, parameters in name order, flattened
  double loss_sum = 0;            // Σ cross-entropy over its counted positions
  int64_t count = 0, correct = 0; // its counted positions, and those whose argmax is the target
};

// The running sum over examples 0, 1, …, examples − 1, added in that order
// whoever computed them: g ← g + g_b in float32, loss_sum ← loss_sum + ℓ_b in
// double. Data parallelism passes it from rank to rank (docs/distributed.md).
struct ExampleFold {
  int64_t examples = 0;
  std::vector<float> gradient;    // empty until the first example
  double loss_sum = 0;
  int64_t count = 0, correct = 0;
  // Adds example r.example; throws multihead::Error (Kind::Value) unless it
  // is example `examples` (the next one) with a gradient of the same size.
  void add(const ExampleResult& r);
};

class TrainerImpl;

// A model, its AdamW state and the run's settings. float32 parameters and
// moments; the passes compute in options.dtype.
class Trainer {
 public:
  // A fresh run: parameters initialised from options.seed.
  // model.vocabulary and model.sequence_length are the task's (0 = take them; any
  // other value must match).
  Trainer(std::shared_ptr<const Task> task, const ModelConfig& model, const TrainOptions& options);
  // A run continued from a checkpoint written by save_checkpoint. The model
  // configuration, task, seed and every optimisation setting must equal the
  // checkpoint's (else the losses could not match an uninterrupted run);
  // options.steps may be larger. Throws multihead::Error naming the file and
  // the first field that differs (expected = the checkpoint's), or what is
  // wrong with the file (missing, truncated, not a checkpoint, a tensor
  // missing or of the wrong shape).
  static Trainer resume(const std::string& path, std::shared_ptr<const Task> task, const ModelConfig& model,
                        const TrainOptions& options);
  Trainer(Trainer&&) noexcept;
  Trainer& operator=(Trainer&&) noexcept;
  ~Trainer();

  int64_t step() const;  // steps done
  const ModelConfig& model_config() const;
  const TrainOptions& options() const;
  // One step: batch(seed, step()), forward, backward, clip, AdamW
  // (options().gradients says how the gradient is summed).
  StepStats train_step();
  // The parts of a PerExample step, for data parallelism:
  //  - example_results(begin, end): examples [begin, end) of batch(seed,
  //    step()), one pass each; example b's result depends on b alone, not on
  //    the range asked for. Needs gradients = PerExample; throws
  //    multihead::Error naming begin and end unless 0 <= begin <= end <= batch.
  //  - apply(fold): clip and AdamW with the whole batch's fold (fold.examples
  //    = batch, else throws), step() + 1. train_step() is
  //    apply(fold of example_results(0, batch)).
  std::vector<ExampleResult> example_results(int64_t begin, int64_t end) const;
  StepStats apply(const ExampleFold& fold);
  // Loss and gradients on batch(seed, step()), no update.
  GradientDump gradients() const;
  // The batch step() would train on.
  Batch current_batch() const;

  // Parameters by name (see the top of this file).
  std::map<std::string, Tensor<float>> parameters() const;
  // The checkpoint's tensors and __metadata__, as save_checkpoint writes them.
  std::string serialize_checkpoint() const;
  void save_checkpoint(const std::string& path) const;  // atomic

 private:
  explicit Trainer(std::unique_ptr<TrainerImpl> impl);
  std::unique_ptr<TrainerImpl> impl_;
};

// The checkpoint's model configuration, task and settings, as
// `multihead train --resume` reads them before building the task. Throws as
// Trainer::resume does.
struct CheckpointInfo {
  ModelConfig model;
  TrainOptions options;     // steps = the run's planned steps
  std::string task;         // make_task(task, model.vocabulary, model.sequence_length)
  int64_t step = 0;         // steps done
};
CheckpointInfo read_checkpoint_info(const std::string& path);

}  // namespace multihead
