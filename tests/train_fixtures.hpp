// tests/train_fixtures.hpp: the small training runs that the trainer's tests
// share (tests/test_train_model.cpp, tests/train/test_mixed_precision.cpp):
// a few steps of a tiny model with dropout, so that a resume must restore
// the dropout stream and the schedule too, and a checkpoint path per process.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "multihead/narrow.hpp"
#include "multihead/train.hpp"

namespace multihead::test {

// `steps` steps at batch 8, two warm-up steps, seed 42.
inline TrainOptions quick_run(int64_t steps, int threads = 1, ComputeDtype dtype = ComputeDtype::F32) {
  TrainOptions o;
  o.steps = steps;
  o.batch = 8;
  o.warmup = 2;
  o.seed = 42;
  o.threads = threads;
  o.dtype = dtype;
  return o;
}

// Two layers, d_model 16, feed-forward 24, dropout 0.1.
inline ModelConfig small_dropout_model(int64_t heads) {
  ModelConfig m;
  m.d_model = 16;
  m.heads = heads;
  m.layers = 2;
  m.ff = 24;
  m.dropout = 0.1;
  return m;
}

// A .safetensors path in the temporary folder, unique to this process.
inline std::string temp_checkpoint_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()) + ".safetensors")).string();
}

}  // namespace multihead::test
