// multihead/trained_model.hpp: a trained encoder (multihead/train.hpp's
// model) without its optimiser: evaluate it on a batch, with no update,
// and look at each layer's per-head attention weights; save it as a small
// model file, load it back.
//
// A model file is one safetensors file: the parameters under their names
// (train.hpp lists them), float32, and __metadata__ with "format" =
// "multihead-model-1", the model configuration (vocabulary,
// sequence_length, d_model, heads, layers, ff, dropout, causal), the task,
// what else a reader needs to rebuild the forward (token_ids: the task's
// words → ids, layer_norm_eps, norm_placement "pre", positional_encoding
// "sinusoidal", activation "relu"; docs/model-format.md), and whatever else
// the writer adds (models/lesson-heads.safetensors carries the command that
// retrains it). A file that states other values than this program computes
// is refused when loaded.
//
// Legend: B batch, L length, H heads, V vocabulary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "multihead/tensor.hpp"
#include "multihead/train.hpp"

namespace multihead {

struct Evaluation {
  double loss = 0;       // mean cross-entropy over the counted positions
  double accuracy = 0;   // fraction of counted positions whose argmax is the target
  int64_t count = 0;     // counted positions
  std::vector<int32_t> predictions;       // (B, L): the argmax id at every position
  Tensor<float> logits;                   // (B·L, V)
  std::vector<Tensor<float>> attention;   // per layer (B, H, L, L), when asked for
};

class TrainedModelImpl;
struct SafetensorsFile;

class TrainedModel {
 public:
  // Throws multihead::Error naming a parameter that is missing, extra or of
  // the wrong shape, or the configuration field that is invalid.
  TrainedModel(const ModelConfig& config, const std::map<std::string, Tensor<float>>& parameters,
               std::string task = "", std::map<std::string, std::string> metadata = {});
  // The trainer's model as it stands (its task's name kept).
  static TrainedModel of(const Trainer& trainer, const std::string& task);
  // A model file, or a `multihead train` checkpoint (its optimiser state
  // ignored). Throws multihead::Error naming the file and what is wrong.
  static TrainedModel load(const std::string& path);
  // A model file's bytes (a checkpoint must be loaded from its path);
  // `name` is what messages call it.
  static TrainedModel parse(const uint8_t* data, std::size_t size, const std::string& name);
  TrainedModel(TrainedModel&&) noexcept;
  TrainedModel& operator=(TrainedModel&&) noexcept;
  ~TrainedModel();

  const ModelConfig& config() const;
  const std::string& task() const;
  // Every __metadata__ entry of the file (or given), the configuration's included.
  const std::map<std::string, std::string>& metadata() const;
  std::map<std::string, Tensor<float>> parameters() const;
  int64_t parameter_count() const;

  // Forward only (inference: no dropout), on one thread unless told.
  Evaluation evaluate(const Batch& batch, bool attention_weights = false, int threads = 1) const;

  // The model file's bytes, with `extra` added to __metadata__ (format and
  // configuration keys may not be overridden).
  std::string serialize(const std::map<std::string, std::string>& extra = {}) const;

 private:
  explicit TrainedModel(std::unique_ptr<TrainedModelImpl> impl);
  static TrainedModel from_file(const SafetensorsFile& file, const std::string& name);
  std::unique_ptr<TrainedModelImpl> impl_;
};

}  // namespace multihead
