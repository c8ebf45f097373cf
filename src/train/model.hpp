// src/train/model.hpp: the encoder of multihead/train.hpp (embedding +
// positions, pre-LN blocks of self-attention and feed-forward, norm_f,
// read-out, cross-entropy) as a forward that keeps its activations and the
// backward beside it. Templated so the tests can run it in double.
//
// Legend: B batch, L length, N = B·L tokens, E d_model, F ff width, V vocabulary.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "multihead/grouped_query_attention.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/tensor.hpp"
#include "multihead/train.hpp"
#include "train/layers.hpp"

namespace multihead::train {

// How one pass runs.
struct PassOptions {
  bool training = false;   // dropout on the attention weights (at ModelConfig::dropout)
  uint64_t seed = 0;       // the run's seed; with step, gives each layer's dropout seed
  int64_t step = 0;
  int threads = 0;         // our loops and the attention kernel; 0 = OpenMP's default
  bool inspect = false;    // also return each layer's per-head attention weights and the logits (with RoPE
                           // the logits only: its module returns no weights)
  // A pass over part of a step's batch (TrainOptions::gradients = PerExample):
  //  - loss_count > 0: the loss gradient divides by this (the whole batch's
  //    counted positions), not by this pass's own count, so the parts'
  //    gradients add up to the batch's;
  //  - example >= 0: the pass is example `example` of the batch alone, and
  //    its dropout masks are that example's (seeds.hpp), whatever else runs.
  int64_t loss_count = 0;
  int64_t example = -1;
  // The compute type (TrainOptions::dtype; train/mixed_precision.hpp says
  // where it rounds). BF16 / F16 need T = float and no inspect (any
  // positions: with RoPE the grouped-query module runs in 16 bits).
  ComputeDtype compute = ComputeDtype::F32;
  // The loss gradient is multiplied by this (F16's loss scaling,
  // train/loss_scale.hpp); the gradients returned are then scaled by it.
  double loss_scale = 1;
};

// The loss, and the gradients under the parameter names.
template <class T>
struct PassResult {
  CrossEntropyResult loss;
  std::map<std::string, Tensor<T>> gradients;  // empty when not asked for
  // With PassOptions::inspect: per layer (B, H, L, L) (none with RoPE), and the logits (B·L, V).
  std::vector<Tensor<T>> attention;
  Tensor<T> logits;
};

template <class T>
class Model {
 public:
  // Parameters initialised as PyTorch initialises each layer (model.cpp),
  // each from its own stream of `seed`.
  Model(const ModelConfig& config, uint64_t seed);
  // Given parameters (a checkpoint's). Throws multihead::Error naming a
  // parameter that is missing, unexpected or of the wrong shape.
  Model(const ModelConfig& config, const std::map<std::string, Tensor<T>>& parameters);

  const ModelConfig& config() const { return config_; }
  // Every parameter's shape, by name, for this configuration.
  static std::map<std::string, Shape> parameter_shapes(const ModelConfig& config);
  std::map<std::string, Tensor<T>> parameters() const;

  // Forward (and, with gradients = true, backward) on one batch.
  PassResult<T> run(const Batch& batch, const PassOptions& options, bool gradients) const;

  // Calls update(name, parameter) for every parameter, in name order, then
  // lets each attention module rebuild its derived data.
  void update_parameters(const std::function<void(const std::string& name, Tensor<T>& parameter)>& update);

 private:
  ModelConfig config_;
  std::map<std::string, Tensor<T>> params_;  // everything but the attention modules'
  // One attention module per block: MultiheadAttention, or with RoPE the
  // grouped-query module (one K/V head per head, biases).
  std::vector<std::unique_ptr<BasicMultiheadAttention<T>>> attn_;
  std::vector<std::unique_ptr<GroupedQueryAttention<T>>> rope_attn_;
  Tensor<T> positions_;  // (L, E) sinusoidal_positions, a constant (added with Positions::Sinusoidal only)
};

extern template class Model<float>;
extern template class Model<double>;

// "blocks.3.attn." for block 3.
std::string block_prefix(int64_t block);

}  // namespace multihead::train
