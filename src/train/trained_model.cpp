// src/train/trained_model.cpp: multihead/trained_model.hpp.
#include "multihead/trained_model.hpp"

#include <cstdio>

#include "multihead/error.hpp"
#include "multihead/io.hpp"
#include "multihead/lesson_tasks.hpp"
#include "train/checkpoint_metadata.hpp"
#include "train/layers.hpp"
#include "train/model.hpp"

namespace multihead {
namespace {

constexpr const char* kModelFormat = "multihead-model-1";
using train::bad_file;
using train::kCheckpointFormat;
const char* const kConfigKeys[] = {"format", "task",    "vocabulary", "sequence_length", "d_model",
                                   "heads",  "layers",  "ff",         "dropout",         "causal",
                                   "positional_encoding"};

// A JSON string: the words of the built-in tasks are printable ASCII, but
// quotes, backslashes and control characters are escaped all the same.
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(ch)));
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// "token_ids": {"<pad>": 0, "the": 1, …} in id order, the words of a task
// with named tokens (lesson, lookup2); a task of plain symbols (copy,
// reverse) names each id by its number. Empty when the model is of no
// built-in task, or of one whose vocabulary it does not have (nothing to
// describe: the reader of such a file, e.g. `explain --model`, refuses it).
std::string token_ids(const std::string& task_name, const ModelConfig& c) {
  std::unique_ptr<Task> task;
  try {
    task = make_task(task_name, c.vocabulary, c.sequence_length);
  } catch (const Error&) {
    return "";
  }
  if (task->vocabulary() != c.vocabulary) return "";
  const auto* named = dynamic_cast<const HeldOutTask*>(task.get());
  std::string out = "{";
  for (int64_t id = 0; id < c.vocabulary; ++id)
    out += (id ? ", " : "") + json_string(named ? named->token(static_cast<int32_t>(id)) : std::to_string(id)) +
           ": " + std::to_string(id);
  return out + "}";
}

// What a reader needs besides the configuration to rebuild the forward
// (docs/model-format.md), as this program computes it: one row per key.
// A file that states another value is refused (the model would not be the
// one it describes); a file without the key (older files) is read as this.
struct Description {
  const char* key;
  std::string (*value)(const std::string& task, const ModelConfig& c);
};
const Description kDescription[] = {
    {"token_ids", token_ids},
    {"layer_norm_eps", [](const std::string&, const ModelConfig&) { return to_exact_string(train::kLayerNormEps); }},
    {"norm_placement", [](const std::string&, const ModelConfig&) { return std::string("pre"); }},
    {"positional_encoding", [](const std::string&, const ModelConfig& c) { return to_string(c.positions); }},
    {"activation", [](const std::string&, const ModelConfig&) { return std::string("relu"); }},
};

}  // namespace

class TrainedModelImpl {
 public:
  std::unique_ptr<train::Model<float>> model;
  std::string task;
  std::map<std::string, std::string> metadata;
};

TrainedModel::TrainedModel(std::unique_ptr<TrainedModelImpl> impl) : impl_(std::move(impl)) {}
TrainedModel::TrainedModel(TrainedModel&&) noexcept = default;
TrainedModel& TrainedModel::operator=(TrainedModel&&) noexcept = default;
TrainedModel::~TrainedModel() = default;

TrainedModel::TrainedModel(const ModelConfig& config, const std::map<std::string, Tensor<float>>& parameters,
                           std::string task, std::map<std::string, std::string> metadata)
    : impl_(std::make_unique<TrainedModelImpl>()) {
  impl_->model = std::make_unique<train::Model<float>>(config, parameters);
  impl_->task = std::move(task);
  impl_->metadata = std::move(metadata);
  const ModelConfig& c = impl_->model->config();
  impl_->metadata["format"] = kModelFormat;
  impl_->metadata["task"] = impl_->task;
  train::write_model_config(c, impl_->metadata);
  for (const Description& d : kDescription) {
    const std::string value = d.value(impl_->task, c);
    if (!value.empty()) impl_->metadata[d.key] = value;
  }
}

TrainedModel TrainedModel::of(const Trainer& trainer, const std::string& task) {
  return TrainedModel(trainer.model_config(), trainer.parameters(), task);
}

namespace {

// The parameters of configuration c, float32, from a parsed file.
std::map<std::string, Tensor<float>> parameters_of(const SafetensorsFile& f, const ModelConfig& c,
                                                   const std::string& path) {
  const train::MetadataReader r(f, path, "model");
  std::map<std::string, Tensor<float>> params;
  for (const auto& [name, shape] : train::Model<float>::parameter_shapes(c)) params[name] = r.float32_tensor(name, shape);
  return params;
}

}  // namespace

TrainedModel TrainedModel::parse(const uint8_t* data, std::size_t size, const std::string& path) {
  return from_file(parse_safetensors(data, size, path), path);
}

TrainedModel TrainedModel::from_file(const SafetensorsFile& f, const std::string& path) {
  const auto format = f.metadata.find("format");
  if (format != f.metadata.end() && format->second == kCheckpointFormat)
    bad_file(path, Error::Kind::Format,
             std::string("a training checkpoint ('") + kCheckpointFormat +
                 "'), which is read from its path (TrainedModel::load); these bytes must be a model file ('" +
                 kModelFormat + "', TrainedModel::serialize)");
  if (format == f.metadata.end() || format->second != kModelFormat)
    bad_file(path, Error::Kind::Format,
             std::string("not a multihead model (expected __metadata__ format '") + kModelFormat + "' or '" +
                 kCheckpointFormat + "' from a path, got " +
                 (format == f.metadata.end() ? std::string("none") : quote_input(format->second)) + ")");
  const train::MetadataReader r(f, path, "model");
  const std::string task = r.text("task");
  const ModelConfig c = r.model_config();
  try {
    c.validate();
  } catch (const Error& e) {
    r.fail(e.what());
  }
  for (const Description& d : kDescription) {
    const auto it = f.metadata.find(d.key);
    if (it == f.metadata.end()) continue;
    const std::string want = d.value(task, c);
    if (!want.empty() && it->second != want)
      r.fail("'" + std::string(d.key) + "': expected " + quote_input(want) + " (the model this program runs), got " +
             quote_input(it->second));
  }
  try {
    return TrainedModel(c, parameters_of(f, c, path), task, f.metadata);
  } catch (const Error& e) {
    bad_file(path, e.kind(), e.what());
  }
}

TrainedModel TrainedModel::load(const std::string& path) {
  const SafetensorsFile f = read_safetensors(path);
  const auto format = f.metadata.find("format");
  if (format != f.metadata.end() && format->second == kCheckpointFormat) {
    const CheckpointInfo info = read_checkpoint_info(path);
    try {
      return TrainedModel(info.model, parameters_of(f, info.model, path), info.task);
    } catch (const Error& e) {
      bad_file(path, e.kind(), e.what());
    }
  }
  return from_file(f, path);
}

const ModelConfig& TrainedModel::config() const { return impl_->model->config(); }
const std::string& TrainedModel::task() const { return impl_->task; }
const std::map<std::string, std::string>& TrainedModel::metadata() const { return impl_->metadata; }
std::map<std::string, Tensor<float>> TrainedModel::parameters() const { return impl_->model->parameters(); }

int64_t TrainedModel::parameter_count() const {
  int64_t n = 0;
  for (const auto& [name, shape] : train::Model<float>::parameter_shapes(config())) n += shape_numel(shape);
  return n;
}

Evaluation TrainedModel::evaluate(const Batch& batch, bool attention_weights, int threads) const {
  // RoPE runs the grouped-query module, which returns no attention weights
  // (experiment.cpp's has_heads): asking for them is an error, not an empty list.
  if (attention_weights && config().positions == Positions::Rope)
    throw Error(Error::Kind::Value, "model: expected a model whose attention returns its weights (positional "
                                    "encoding none, sinusoidal or alibi), got positional_encoding rope");
  train::PassOptions o;
  o.training = false;
  o.threads = threads;
  o.inspect = true;
  train::PassResult<float> r = impl_->model->run(batch, o, false);
  Evaluation e;
  e.loss = r.loss.loss;
  e.count = r.loss.count;
  e.accuracy = r.loss.count > 0 ? double(r.loss.correct) / double(r.loss.count) : 0.0;
  const int64_t N = batch.batch * batch.length, V = config().vocabulary;
  e.predictions.resize(static_cast<std::size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    const float* row = r.logits.data() + n * V;
    int64_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (row[v] > row[best]) best = v;
    e.predictions[static_cast<std::size_t>(n)] = static_cast<int32_t>(best);
  }
  if (attention_weights) e.attention = std::move(r.attention);
  e.logits = std::move(r.logits);
  return e;
}

std::string TrainedModel::serialize(const std::map<std::string, std::string>& extra) const {
  std::map<std::string, std::string> m = impl_->metadata;
  for (const auto& [key, value] : extra) {
    bool set_by_model = false;
    for (const char* k : kConfigKeys) set_by_model = set_by_model || key == k;
    for (const Description& d : kDescription) set_by_model = set_by_model || key == d.key;
    if (set_by_model)
      throw Error(Error::Kind::Value, "model metadata '" + key + "': set by the model, not by the writer");
    m[key] = value;
  }
  return serialize_safetensors(parameters(), m);
}

}  // namespace multihead
