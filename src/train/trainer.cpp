// src/train/trainer.cpp: the training loop and its checkpoints
// (multihead/train.hpp: Trainer, read_checkpoint_info).
//
// A checkpoint is one safetensors file:
//  - the parameters under their names ("embedding.weight", "blocks.0.attn.in_proj_weight", …);
//  - AdamW's moments as "optimizer.exp_avg.NAME" and "optimizer.exp_avg_sq.NAME"
//    (torch.optim.AdamW's state names), all float32, so every value the next
//    step reads is stored exactly;
//  - __metadata__: "format" = kCheckpointFormat (train/checkpoint_metadata.hpp), the model configuration, the task,
//    seed, steps done ("step") and every optimisation setting, doubles
//    written with 17 significant digits (exact round trip); a 16-bit run
//    also "compute_dtype" (bf16, f16: the parameters stay the float32
//    master weights) and, f16, the loss scaler's state "loss_scale" and
//    "loss_scale_clean_steps" and AdamW's own step count "optimizer_steps"
//    (the steps not skipped for an overflow); and
//    "blocks.i.attn.num_heads" / "batch_first" / "add_zero_attn" for the
//    weights loader.
// Nothing else evolves during a run (batches and dropout masks are hashes
// of seed and step: src/train/seeds.hpp), so a run resumed from it computes
// what the uninterrupted run computes, bit for bit.
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "core/check.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"
#include "multihead/train.hpp"
#include "train/adamw.hpp"
#include "train/checkpoint_metadata.hpp"
#include "train/loss_scale.hpp"
#include "train/model.hpp"

namespace multihead {
namespace {

using train::bad_file;
using train::kCheckpointFormat;
constexpr const char* kExpAvg = "optimizer.exp_avg.";
constexpr const char* kExpAvgSq = "optimizer.exp_avg_sq.";
constexpr const char* kPerExample = "per_example";  // metadata "gradients" of a PerExample run

std::map<std::string, std::string> metadata(const ModelConfig& m, const TrainOptions& o, const std::string& task,
                                            int64_t step, const train::LossScaler& scaler = {},
                                            int64_t optimizer_steps = 0) {
  std::map<std::string, std::string> out = {{"format", kCheckpointFormat},
          {"task", task},
          {"seed", std::to_string(o.seed)},
          {"step", std::to_string(step)},
          {"steps", std::to_string(o.steps)},
          {"batch", std::to_string(o.batch)},
          {"lr", to_exact_string(o.lr)},
          {"warmup", std::to_string(o.warmup)},
          {"schedule", to_string(o.schedule)},
          {"weight_decay", to_exact_string(o.weight_decay)},
          {"beta1", to_exact_string(o.beta1)},
          {"beta2", to_exact_string(o.beta2)},
          {"eps", to_exact_string(o.eps)},
          {"clip", to_exact_string(o.clip)}};
  // Only a per-example run writes its gradient sum, so a batched run's
  // checkpoint keeps its bytes (the shipped model's, tests/test_lesson_model.cpp).
  if (o.gradients == GradientSum::PerExample) out["gradients"] = kPerExample;
  // Likewise the compute type, only when it is not float32.
  if (o.dtype != ComputeDtype::F32) out["compute_dtype"] = to_string(o.dtype);
  if (scaler.enabled()) {
    out["loss_scale"] = to_exact_string(scaler.scale());
    out["loss_scale_clean_steps"] = std::to_string(scaler.clean_steps());
    out["optimizer_steps"] = std::to_string(optimizer_steps);
  }
  train::write_model_config(m, out);
  // Each attention module's settings under its prefix, as the weights
  // loader reads them (src/weights/weights.cpp): `multihead forward
  // --weights CHECKPOINT --prefix blocks.0.attn` runs a trained block.
  for (int64_t i = 0; i < m.layers; ++i) {
    out[train::block_prefix(i) + "num_heads"] = std::to_string(m.heads);
    out[train::block_prefix(i) + "batch_first"] = "true";
    out[train::block_prefix(i) + "add_zero_attn"] = "false";
  }
  return out;
}

CheckpointInfo info_of(const SafetensorsFile& f, const std::string& path) {
  const auto format = f.metadata.find("format");
  if (format == f.metadata.end() || format->second != kCheckpointFormat)
    bad_file(path, Error::Kind::Format,
             "not a multihead train checkpoint (expected __metadata__ format '" + std::string(kCheckpointFormat) +
                 "', got " + (format == f.metadata.end() ? std::string("none") : quote_input(format->second)) + ")");
  const train::MetadataReader r(f, path, "checkpoint");
  CheckpointInfo c;
  c.task = r.text("task");
  c.model = r.model_config();
  c.options.seed = r.unsigned_integer("seed");
  c.step = r.integer("step");
  c.options.steps = r.integer("steps");
  c.options.batch = r.integer("batch");
  c.options.lr = r.number("lr");
  c.options.warmup = r.integer("warmup");
  try {
    c.options.schedule = parse_schedule(r.text("schedule"));
  } catch (const Error& e) {
    r.fail(e.what());
  }
  c.options.weight_decay = r.number("weight_decay");
  c.options.beta1 = r.number("beta1");
  c.options.beta2 = r.number("beta2");
  c.options.eps = r.number("eps");
  c.options.clip = r.number("clip");
  if (f.metadata.count("gradients") != 0) {
    if (r.text("gradients") != kPerExample)
      r.fail("'gradients': expected '" + std::string(kPerExample) + "' (or no key: batched), got " +
             quote_input(r.text("gradients")));
    c.options.gradients = GradientSum::PerExample;
  }
  if (f.metadata.count("compute_dtype") != 0) {
    try {
      c.options.dtype = parse_compute_dtype(r.text("compute_dtype"), "'compute_dtype'");
    } catch (const Error& e) {
      r.fail(e.what());
    }
  }
  try {
    c.model.validate();
    c.options.validate();
  } catch (const Error& e) {
    r.fail(e.what());
  }
  if (c.step < 0) r.fail("'step': expected >= 0, got " + std::to_string(c.step));
  return c;
}

// The first setting of `given` that differs from the checkpoint's, as
// "FIELD is X in the checkpoint, got Y", or "".
std::string first_difference(const CheckpointInfo& ck, const std::string& task, const ModelConfig& m,
                             const TrainOptions& o) {
  auto differs = [](const std::string& field, const std::string& want, const std::string& got) {
    return want == got ? std::string() : field + " is " + want + " in the checkpoint, got " + got;
  };
  const auto mine = metadata(m, o, task, ck.step), theirs = metadata(ck.model, ck.options, ck.task, ck.step);
  if (o.dtype != ck.options.dtype)
    return "dtype is " + to_string(ck.options.dtype) + " in the checkpoint, got " + to_string(o.dtype);
  if (o.gradients != ck.options.gradients)
    return std::string("gradients are summed ") +
           (ck.options.gradients == GradientSum::PerExample ? "per example (data-parallel training)" : "over the batch at once") +
           " in the checkpoint, got " +
           (o.gradients == GradientSum::PerExample ? "per example (data-parallel training)" : "over the batch at once");
  for (const char* key : {"task", "vocabulary", "sequence_length", "d_model", "heads", "layers", "ff", "dropout",
                          "causal", "positional_encoding", "seed", "batch", "lr", "warmup", "schedule", "weight_decay",
                          "beta1", "beta2",
                          "eps", "clip"})
    if (std::string d = differs(key, theirs.at(key), mine.at(key)); !d.empty()) return d;
  return "";
}

}  // namespace

// Sizes the options allow can ask for terabytes (batch 65536 x length
// 65536 was killed by the kernel's OOM killer at 24 GB). Before anything
// is allocated: a lower bound of one step's memory, the parameters with
// their gradients and AdamW's two moments, the batch (tokens, targets,
// mask: 9 bytes a token), and for every token that one pass runs (the
// whole batch; one example when the gradients are summed per example) the
// residual stream and its normed copy in each layer and the logits.
void check_training_fits(const ModelConfig& c, const TrainOptions& o, const std::string& hint) {
  double parameters = 0;
  for (const auto& [name, shape] : train::Model<float>::parameter_shapes(c)) parameters += detail::elements_of(shape);
  const double L = static_cast<double>(c.sequence_length), batch_tokens = static_cast<double>(o.batch) * L;
  const bool per_example = o.gradients == GradientSum::PerExample;
  const double pass_tokens = per_example ? L : batch_tokens;
  const double per_token = 2.0 * static_cast<double>(c.layers) * static_cast<double>(c.d_model) +
                           static_cast<double>(c.vocabulary);
  const double bytes = 4.0 * (4.0 * parameters + pass_tokens * per_token) + 9.0 * batch_tokens;
  char sizes[360];
  std::snprintf(sizes, sizeof sizes,
                "one training step (batch %lld x sequence_length %lld tokens, %s through %lld layers of d_model "
                "%lld, vocabulary %lld; %.4g parameters with gradients and AdamW's moments)",
                static_cast<long long>(o.batch), static_cast<long long>(c.sequence_length),
                per_example ? "one example a pass" : "all in one pass", static_cast<long long>(c.layers),
                static_cast<long long>(c.d_model), static_cast<long long>(c.vocabulary), parameters);
  detail::check_fits_in_memory("training", sizes, bytes, hint);
}

class TrainerImpl {
 public:
  std::shared_ptr<const Task> task;
  ModelConfig model_config;
  TrainOptions options;
  std::unique_ptr<train::Model<float>> model;
  std::map<std::string, train::AdamWMoments<float>> moments;
  int64_t step = 0;  // steps done: the next batch, dropout masks and learning rate follow it
  // AdamW's t before this step: the updates applied. A step the loss
  // scaler skips (an overflowed gradient) leaves the parameters, the
  // moments and this count as they were, as torch.cuda.amp.GradScaler
  // skips optimizer.step(); the batch and the schedule still move on.
  int64_t optimizer_steps = 0;
  train::LossScaler scaler;  // enabled for F16 only

  TrainerImpl(std::shared_ptr<const Task> t, const ModelConfig& m, const TrainOptions& o)
      : task(std::move(t)), model_config(m), options(o) {
    if (!task) throw Error(Error::Kind::Missing, "trainer: no task");
    auto take = [&](int64_t& field, int64_t value, const char* name) {
      if (field != 0 && field != value)
        throw Error(Error::Kind::Value, std::string(name) + ": expected the task's " + std::to_string(value) +
                                            ", got " + std::to_string(field));
      field = value;
    };
    take(model_config.vocabulary, task->vocabulary(), "vocabulary");
    take(model_config.sequence_length, task->sequence_length(), "sequence_length");
    if (task->causal()) model_config.causal = true;
    model_config.validate();
    options.validate();
    check_training_fits(model_config, options);
    scaler = train::LossScaler(options.dtype == ComputeDtype::F16);
  }

  train::PassOptions pass(bool training) const {
    train::PassOptions p;
    p.training = training;
    p.seed = options.seed;
    p.step = step;
    p.threads = options.threads;
    p.compute = options.dtype;
    p.loss_scale = scaler.scale();
    return p;
  }

  Batch batch() const { return task->batch(options.seed, step, options.batch); }

  void zero_moments() {
    for (const auto& [name, shape] : train::Model<float>::parameter_shapes(model_config))
      moments[name] = {Tensor<float>(shape, 0.0f), Tensor<float>(shape, 0.0f)};
  }
};

Trainer::Trainer(std::unique_ptr<TrainerImpl> impl) : impl_(std::move(impl)) {}

Trainer::Trainer(std::shared_ptr<const Task> task, const ModelConfig& model, const TrainOptions& options)
    : impl_(std::make_unique<TrainerImpl>(std::move(task), model, options)) {
  impl_->model = std::make_unique<train::Model<float>>(impl_->model_config, impl_->options.seed);
  impl_->zero_moments();
}

Trainer::Trainer(Trainer&&) noexcept = default;
Trainer& Trainer::operator=(Trainer&&) noexcept = default;
Trainer::~Trainer() = default;

int64_t Trainer::step() const { return impl_->step; }
const ModelConfig& Trainer::model_config() const { return impl_->model_config; }
const TrainOptions& Trainer::options() const { return impl_->options; }
Batch Trainer::current_batch() const { return impl_->batch(); }
std::map<std::string, Tensor<float>> Trainer::parameters() const { return impl_->model->parameters(); }

namespace {

// Example b of `batch`, alone.
Batch example_of(const Batch& batch, int64_t b) {
  Batch one;
  one.batch = 1;
  one.length = batch.length;
  const auto first = static_cast<std::ptrdiff_t>(b * batch.length), last = first + batch.length;
  one.tokens.assign(batch.tokens.begin() + first, batch.tokens.begin() + last);
  one.targets.assign(batch.targets.begin() + first, batch.targets.begin() + last);
  one.mask.assign(batch.mask.begin() + first, batch.mask.begin() + last);
  return one;
}

int64_t counted(const Batch& batch) {
  int64_t n = 0;
  for (const uint8_t m : batch.mask) n += m != 0 ? 1 : 0;
  return n;
}

// Example b's pass: its gradient divided by the batch's counted positions.
ExampleResult example_result(const TrainerImpl& t, const Batch& batch, int64_t count, int64_t b) {
  train::PassOptions p = t.pass(true);
  p.loss_count = count;
  p.example = b;
  const train::PassResult<float> r = t.model->run(example_of(batch, b), p, true);
  ExampleResult out;
  out.example = b;
  out.loss_sum = r.loss.sum;
  out.count = r.loss.count;
  out.correct = r.loss.correct;
  int64_t size = 0;
  for (const auto& [name, g] : r.gradients) size += g.numel();
  out.gradient.reserve(static_cast<std::size_t>(size));
  for (const auto& [name, g] : r.gradients) out.gradient.insert(out.gradient.end(), g.data(), g.data() + g.numel());
  return out;
}

// The fold of every example of the current batch, each added as it is computed.
ExampleFold fold_all(const TrainerImpl& t) {
  const Batch batch = t.batch();
  const int64_t count = counted(batch);
  ExampleFold fold;
  for (int64_t b = 0; b < batch.batch; ++b) fold.add(example_result(t, batch, count, b));
  return fold;
}

// The fold's gradient under the parameter names (the order example_result flattened them in).
std::map<std::string, Tensor<float>> unflatten(const TrainerImpl& t, const ExampleFold& fold) {
  std::map<std::string, Tensor<float>> out;
  std::size_t at = 0;
  for (const auto& [name, shape] : train::Model<float>::parameter_shapes(t.model_config)) {
    Tensor<float> g(shape);
    if (at + static_cast<std::size_t>(g.numel()) > fold.gradient.size()) break;
    std::copy_n(fold.gradient.begin() + static_cast<std::ptrdiff_t>(at), g.numel(), g.data());
    at += static_cast<std::size_t>(g.numel());
    out[name] = std::move(g);
  }
  if (at != fold.gradient.size() || out.size() != train::Model<float>::parameter_shapes(t.model_config).size())
    throw Error(Error::Kind::Shape, "fold: expected a gradient of " + std::to_string(at) +
                                        " values (every parameter), got " + std::to_string(fold.gradient.size()));
  return out;
}

double ratio(int64_t part, int64_t whole) { return whole > 0 ? double(part) / double(whole) : 0.0; }
// The batch's mean loss, as cross_entropy_forward divides it.
double ratio_loss(const ExampleFold& f) { return f.count > 0 ? f.loss_sum / double(f.count) : 0.0; }

// Clip, AdamW, one step further: the end of every step, however its
// gradient was summed. `loss` is the batch's mean over `count` positions.
StepStats update(TrainerImpl& t, std::map<std::string, Tensor<float>>& gradients, double loss, int64_t count,
                 int64_t correct) {
  StepStats s;
  s.step = t.step;
  s.loss = loss;
  s.tokens = count;
  s.accuracy = ratio(correct, count);
  s.lr = learning_rate(t.options, t.step);
  if (t.scaler.enabled()) {
    // The gradients came from scale · loss: unscale, and skip the update
    // when one of them overflowed (loss_scale.hpp).
    s.loss_scale = t.scaler.scale();
    const bool finite = train::unscale_gradients(gradients, s.loss_scale);
    s.skipped = !t.scaler.update(finite);
    if (s.skipped) {  // nothing updated, AdamW's t included
      s.grad_norm = std::numeric_limits<double>::infinity();
      t.step += 1;
      return s;
    }
  }
  s.grad_norm = train::clip_gradients(gradients, t.options.clip);
  train::AdamWSettings a{s.lr, t.options.beta1, t.options.beta2, t.options.eps, t.options.weight_decay};
  const int64_t adam_t = t.optimizer_steps + 1;  // AdamW's t, this update included
  t.model->update_parameters([&](const std::string& name, Tensor<float>& p) {
    train::adamw_update(p, gradients.at(name), t.moments.at(name), a, train::decays(name), adam_t);
  });
  t.optimizer_steps += 1;
  t.step += 1;
  return s;
}

}  // namespace

void ExampleFold::add(const ExampleResult& r) {
  if (r.example != examples)
    throw Error(Error::Kind::Value, "fold: expected example " + std::to_string(examples) +
                                        " next (examples are added in order), got " + std::to_string(r.example));
  if (examples > 0 && r.gradient.size() != gradient.size())
    throw Error(Error::Kind::Shape, "fold: expected a gradient of " + std::to_string(gradient.size()) +
                                        " values for example " + std::to_string(r.example) + ", got " +
                                        std::to_string(r.gradient.size()));
  if (examples == 0) {
    gradient = r.gradient;  // 0 + g_0 = g_0 exactly
    loss_sum = r.loss_sum;
  } else {
    for (std::size_t k = 0; k < gradient.size(); ++k) gradient[k] += r.gradient[k];
    loss_sum += r.loss_sum;
  }
  count += r.count;
  correct += r.correct;
  examples += 1;
}

StepStats Trainer::train_step() {
  TrainerImpl& t = *impl_;
  if (t.options.gradients == GradientSum::PerExample) return apply(fold_all(t));
  const Batch batch = t.batch();
  train::PassResult<float> r = t.model->run(batch, t.pass(true), true);
  return update(t, r.gradients, r.loss.loss, r.loss.count, r.loss.correct);
}

std::vector<ExampleResult> Trainer::example_results(int64_t begin, int64_t end) const {
  const TrainerImpl& t = *impl_;
  if (t.options.gradients != GradientSum::PerExample)
    throw Error(Error::Kind::Value, "example_results: expected a trainer with per-example gradients, got batched");
  if (begin < 0 || begin > end || end > t.options.batch)
    throw Error(Error::Kind::Value, "example_results: expected 0 <= begin <= end <= batch " +
                                        std::to_string(t.options.batch) + ", got begin " + std::to_string(begin) +
                                        ", end " + std::to_string(end));
  const Batch batch = t.batch();
  const int64_t count = counted(batch);
  std::vector<ExampleResult> out;
  for (int64_t b = begin; b < end; ++b) out.push_back(example_result(t, batch, count, b));
  return out;
}

StepStats Trainer::apply(const ExampleFold& fold) {
  TrainerImpl& t = *impl_;
  if (t.options.gradients != GradientSum::PerExample)
    throw Error(Error::Kind::Value, "apply: expected a trainer with per-example gradients, got batched");
  if (fold.examples != t.options.batch)
    throw Error(Error::Kind::Value, "apply: expected the fold of the whole batch, " +
                                        std::to_string(t.options.batch) + " examples, got " +
                                        std::to_string(fold.examples));
  std::map<std::string, Tensor<float>> gradients = unflatten(t, fold);
  return update(t, gradients, ratio_loss(fold), fold.count, fold.correct);
}

GradientDump Trainer::gradients() const {
  const TrainerImpl& t = *impl_;
  GradientDump d;
  if (t.options.gradients == GradientSum::PerExample) {
    const ExampleFold fold = fold_all(t);
    d.loss = ratio_loss(fold);
    d.accuracy = ratio(fold.correct, fold.count);
    d.gradients = unflatten(t, fold);
    return d;
  }
  train::PassResult<float> r = t.model->run(t.batch(), t.pass(true), true);
  if (t.scaler.enabled()) train::unscale_gradients(r.gradients, t.scaler.scale());
  d.loss = r.loss.loss;
  d.accuracy = r.loss.count > 0 ? double(r.loss.correct) / double(r.loss.count) : 0.0;
  d.gradients = std::move(r.gradients);
  return d;
}

std::string Trainer::serialize_checkpoint() const {
  const TrainerImpl& t = *impl_;
  std::map<std::string, Tensor<float>> tensors = t.model->parameters();
  for (const auto& [name, m] : t.moments) {
    tensors[kExpAvg + name] = m.m;
    tensors[kExpAvgSq + name] = m.v;
  }
  return serialize_safetensors(
      tensors, metadata(t.model_config, t.options, t.task->name(), t.step, t.scaler, t.optimizer_steps));
}

void Trainer::save_checkpoint(const std::string& path) const { write_file_atomic(path, serialize_checkpoint()); }

// The metadata alone: no tensor is decoded (a checkpoint's parameters and
// AdamW moments as float64 were three times its size, for nothing).
CheckpointInfo read_checkpoint_info(const std::string& path) {
  return info_of(read_safetensors(path, Sixteen::Decode, no_tensors()), path);
}

Trainer Trainer::resume(const std::string& path, std::shared_ptr<const Task> task, const ModelConfig& model,
                        const TrainOptions& options) {
  const SafetensorsFile file = read_safetensors(path);
  const CheckpointInfo ck = info_of(file, path);
  auto impl = std::make_unique<TrainerImpl>(std::move(task), model, options);
  if (const std::string d = first_difference(ck, impl->task->name(), impl->model_config, impl->options); !d.empty())
    bad_file(path, Error::Kind::Value, d);
  if (options.steps < ck.step)
    bad_file(path, Error::Kind::Value, "steps: expected at least the checkpoint's " + std::to_string(ck.step) +
                                           " steps done, got " + std::to_string(options.steps));
  // Every tensor as float32, as save_checkpoint wrote it.
  const auto shapes = train::Model<float>::parameter_shapes(impl->model_config);
  const train::MetadataReader r(file, path, "checkpoint");
  std::map<std::string, Tensor<float>> params;
  for (const auto& [name, shape] : shapes) {
    params[name] = r.float32_tensor(name, shape);
    impl->moments[name] = {r.float32_tensor(kExpAvg + name, shape), r.float32_tensor(kExpAvgSq + name, shape)};
  }
  // Parameters and moments a run can continue from are finite, and AdamW's
  // second moments >= 0: from any other the run trained on NaN and blamed
  // the learning rate.
  const auto check_saved = [&](const std::string& key, const Tensor<float>& t, bool nonnegative) {
    for (int64_t i = 0; i < t.numel(); ++i)
      if (!std::isfinite(t[i]) || (nonnegative && t[i] < 0))
        bad_file(path, Error::Kind::Format,
                 "tensor " + quote_input(key) + " holds " + detail::format_number(t[i]) + " at index " +
                     detail::index_to_string(t.shape(), i) + ", expected " +
                     (nonnegative ? "a finite value >= 0 (AdamW's second moment)" : "a finite value") +
                     " (training cannot continue from it)");
  };
  for (const auto& entry : shapes) {
    const std::string& name = entry.first;
    check_saved(name, params.at(name), false);
    check_saved(kExpAvg + name, impl->moments.at(name).m, false);
    check_saved(kExpAvgSq + name, impl->moments.at(name).v, true);
  }
  // Nothing else: a tensor this model does not have means another model's file.
  auto known = [&](const std::string& name) {
    for (const std::string prefix : {"", kExpAvg, kExpAvgSq})
      if (name.rfind(prefix, 0) == 0 && shapes.count(name.substr(prefix.size())) != 0) return true;
    return false;
  };
  for (const auto& [name, t] : file.tensors)
    if (!known(name)) bad_file(path, Error::Kind::Format, "tensor " + quote_input(name) + " is not part of this model");
  for (const auto& [name, t] : file.integer_tensors)
    bad_file(path, Error::Kind::Format, "tensor " + quote_input(name) + " is not part of this model (dtype " +
                                            to_string(t.dtype) + ")");
  impl->model = std::make_unique<train::Model<float>>(impl->model_config, params);
  impl->step = ck.step;
  impl->optimizer_steps = ck.step;  // no step skipped: float32 and bf16 runs
  if (impl->scaler.enabled()) {
    // The scaler where the run left it (else the resumed steps would run
    // at another scale and skip other steps).
    const double scale = r.number("loss_scale");
    const int64_t clean = r.integer("loss_scale_clean_steps");
    int exponent = 0;
    if (!(scale > 0 && std::isfinite(scale) && std::frexp(scale, &exponent) == 0.5))
      r.fail("'loss_scale': expected a power of two, got " + to_exact_string(scale));
    if (clean < 0 || clean >= train::LossScaler::kGrowthInterval)
      r.fail("'loss_scale_clean_steps': expected 0 to " + std::to_string(train::LossScaler::kGrowthInterval - 1) +
             ", got " + std::to_string(clean));
    impl->scaler = train::LossScaler(true, scale, clean);
    // A file written before the count was kept counted every step (its
    // AdamW took t = step + 1).
    if (file.metadata.count("optimizer_steps") != 0) {
      const int64_t updates = r.integer("optimizer_steps");
      if (updates < 0 || updates > ck.step)
        r.fail("'optimizer_steps': expected 0 to the " + std::to_string(ck.step) + " steps done, got " +
               std::to_string(updates));
      impl->optimizer_steps = updates;
    }
  }
  return Trainer(std::move(impl));
}

}  // namespace multihead
