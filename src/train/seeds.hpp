// src/train/seeds.hpp: every random number of a training run comes from the
// run's one seed through this hash, so that a run is a pure function of its
// seed (any thread count; resumed or not) with no generator state to save.
//  - data: token (b, l) of step t,   stream(seed, kData, t, b · L + l)
//  - dropout: layer i at step t,     stream(seed, kDropout, t, i) as the
//    attention's dropout_seed (a new mask every step and layer); with
//    per-example gradients (TrainOptions::gradients) example b's own,
//    stream(stream(seed, kDropout, t, i), kDropout, b, 0)
//  - initialisation: parameter k,    stream(seed, kInit, k, 0) seeds its mt19937_64
#pragma once

#include <cstdint>

#include "contract/score_rule.hpp"

namespace multihead::train {

enum class Stream : uint64_t { Data = 1, Dropout = 2, Init = 3 };

// SplitMix64's finaliser (the dropout rule's mix64) chained over the fields.
inline uint64_t stream_value(uint64_t seed, Stream stream, uint64_t a, uint64_t b) {
  using detail::mix64;
  return mix64(seed ^ mix64(static_cast<uint64_t>(stream) ^ mix64(a ^ mix64(b))));
}

// The attention dropout seed of layer `layer` at step `step`; example >= 0:
// of that example alone (its pass sees slices 0 … H−1 only, so its mask
// cannot come from the batch's seed and its place in the batch).
inline uint64_t dropout_seed(uint64_t seed, int64_t step, int64_t layer, int64_t example) {
  const uint64_t batch = stream_value(seed, Stream::Dropout, static_cast<uint64_t>(step), static_cast<uint64_t>(layer));
  return example < 0 ? batch : stream_value(batch, Stream::Dropout, static_cast<uint64_t>(example), 0);
}

}  // namespace multihead::train
