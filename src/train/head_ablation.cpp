// src/train/head_ablation.cpp: multihead/head_ablation.hpp.
#include "multihead/head_ablation.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "train/head_gates.hpp"
#include "train/model.hpp"

namespace multihead {
namespace {

// Row b of a batch, as a batch of one.
Batch row(const Batch& b, int64_t r) {
  Batch one;
  one.batch = 1;
  one.length = b.length;
  const auto from = static_cast<std::ptrdiff_t>(r * b.length), to = from + static_cast<std::ptrdiff_t>(b.length);
  one.tokens.assign(b.tokens.begin() + from, b.tokens.begin() + to);
  one.targets.assign(b.targets.begin() + from, b.targets.begin() + to);
  one.mask.assign(b.mask.begin() + from, b.mask.begin() + to);
  return one;
}

double masked_accuracy(const TrainedModel& model, const Batch& test, const std::vector<int64_t>& masked) {
  const ModelConfig& c = model.config();
  std::vector<double> gates(static_cast<std::size_t>(c.layers * c.heads), 1.0);
  for (int64_t k : masked) gates[static_cast<std::size_t>(k)] = 0.0;
  return gated_model(model, gates).evaluate(test).accuracy;
}

}  // namespace

TrainedModel gated_model(const TrainedModel& model, const std::vector<double>& gates) {
  return TrainedModel(model.config(), train::gated_parameters(model.config(), model.parameters(), gates), model.task(),
                      model.metadata());
}

std::vector<double> head_gate_gradients(const TrainedModel& model, const Batch& batch) {
  const std::map<std::string, Tensor<float>> p = model.parameters();
  const train::Model<float> m(model.config(), p);
  train::PassOptions o;
  o.threads = 1;
  return train::gate_gradients(model.config(), p, m.run(batch, o, true).gradients);
}

HeadAblation ablate_heads(const TrainedModel& model, const Batch& test) {
  const ModelConfig& c = model.config();
  const int64_t K = c.layers * c.heads;
  HeadAblation a;
  a.layers = c.layers;
  a.heads = c.heads;
  a.accuracy = model.evaluate(test).accuracy;

  // I_k = E_x |∂L(x)/∂ξ_k|, one backward per sequence that counts a position.
  const std::map<std::string, Tensor<float>> p = model.parameters();
  const train::Model<float> m(c, p);
  train::PassOptions o;
  o.threads = 1;
  a.importance.assign(static_cast<std::size_t>(K), 0.0);
  for (int64_t r = 0; r < test.batch; ++r) {
    const Batch x = row(test, r);
    if (std::none_of(x.mask.begin(), x.mask.end(), [](uint8_t v) { return v != 0; })) continue;
    const std::vector<double> g = train::gate_gradients(c, p, m.run(x, o, true).gradients);
    for (int64_t k = 0; k < K; ++k) a.importance[static_cast<std::size_t>(k)] += std::fabs(g[static_cast<std::size_t>(k)]);
    ++a.sequences;
  }
  for (double& v : a.importance) v /= double(std::max<int64_t>(1, a.sequences));

  for (int64_t k = 0; k < K; ++k) a.masked_alone.push_back(masked_accuracy(model, test, {k}));

  // Least important first, each importance divided by its layer's ℓ2 norm
  // (Michel et al. §4.1); ties keep the head order.
  std::vector<double> normalised = a.importance;
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    double norm = 0;
    for (int64_t h = 0; h < c.heads; ++h) norm += std::pow(a.importance[static_cast<std::size_t>(layer * c.heads + h)], 2);
    norm = std::sqrt(norm);
    if (norm > 0)
      for (int64_t h = 0; h < c.heads; ++h) normalised[static_cast<std::size_t>(layer * c.heads + h)] /= norm;
  }
  a.prune_order.resize(static_cast<std::size_t>(K));
  std::iota(a.prune_order.begin(), a.prune_order.end(), int64_t{0});
  std::stable_sort(a.prune_order.begin(), a.prune_order.end(), [&](int64_t x, int64_t y) {
    return normalised[static_cast<std::size_t>(x)] < normalised[static_cast<std::size_t>(y)];
  });
  a.pruned_accuracy.push_back(a.accuracy);
  std::vector<int64_t> masked;
  for (int64_t k : a.prune_order) {
    masked.push_back(k);
    a.pruned_accuracy.push_back(masked_accuracy(model, test, masked));
  }
  a.no_attention_accuracy = a.pruned_accuracy.back();
  return a;
}

}  // namespace multihead
