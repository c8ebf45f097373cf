// src/train/checkpoint_metadata.hpp: the __metadata__ rules shared by the
// two safetensors files of training, the checkpoint (trainer.cpp,
// "multihead-train-checkpoint-1") and the trained model (trained_model.cpp,
// "multihead-model-1"): how a model configuration and a double are written,
// and how a value is read back: the key must be there, and its value obey
// the one metadata rule (io/metadata.hpp); doubles are written with
// to_exact_string (multihead/io.hpp). Also the one float32 tensor reader of
// both files.
// Internal: not part of the public API.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "multihead/error.hpp"
#include "multihead/io.hpp"
#include "multihead/train.hpp"

namespace multihead::train {

// The "format" of a checkpoint's metadata (TrainedModel::load accepts one too).
inline constexpr const char* kCheckpointFormat = "multihead-train-checkpoint-1";

// Throws multihead::Error(kind, "'PATH': WHAT").
[[noreturn]] void bad_file(const std::string& path, Error::Kind kind, const std::string& what);

// The model configuration's keys (vocabulary, sequence_length, d_model,
// heads, layers, ff, dropout, causal) into `out`; model_config() reads them.
void write_model_config(const ModelConfig& c, std::map<std::string, std::string>& out);

// Reads the metadata of file `path`; every failure is a Kind::Format error
// "'PATH': NOUN metadata …" (noun: "checkpoint" or "model").
class MetadataReader {
 public:
  MetadataReader(const SafetensorsFile& file, const std::string& path, std::string noun)
      : file_(file), path_(path), noun_(std::move(noun)) {}
  const std::string& text(const std::string& key) const;
  int64_t integer(const std::string& key) const;
  uint64_t unsigned_integer(const std::string& key) const;
  double number(const std::string& key) const;
  bool boolean(const std::string& key) const;  // "true" or "false"
  // Tensor `name` of the file, which must be there, float32 (as both files
  // are written) and of `shape`; else Error(Missing / Format / Shape)
  // "'PATH': tensor 'NAME': …".
  Tensor<float> float32_tensor(const std::string& name, const Shape& shape) const;
  // The keys write_model_config writes (not validated: the caller does, see fail).
  ModelConfig model_config() const;
  // Throws the Kind::Format error "'PATH': NOUN metadata WHAT".
  [[noreturn]] void fail(const std::string& what) const;

 private:
  template <class Read>
  auto read(const std::string& key, Read read) const;
  const SafetensorsFile& file_;
  const std::string& path_;
  std::string noun_;
};

}  // namespace multihead::train
