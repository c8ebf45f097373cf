// src/explain/report.cpp: the report model's rules (explain.hpp): what a
// valid Report is, the head average, the labels of positions and of the keys
// PyTorch appends.
#include <cmath>
#include <string>
#include <vector>

#include "multihead/error.hpp"
#include "multihead/explain.hpp"

namespace multihead::explain {
namespace {

std::string num(int64_t v) { return std::to_string(v); }

void fail(const std::string& message) { throw Error(Error::Kind::Value, message); }

}  // namespace

std::vector<double> head_average(const LayerAttention& layer) {
  const int64_t H = layer.heads, L = layer.queries, S = layer.keys;
  std::vector<double> mean(static_cast<std::size_t>(L * S), 0.0);
  // PyTorch: attn_output_weights.mean(dim=1), a sum over heads divided by H.
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < S; ++j) mean[static_cast<std::size_t>(i * S + j)] += layer.at(h, i, j);
  for (double& m : mean) m /= static_cast<double>(H);
  return mean;
}

std::vector<std::string> position_labels(int64_t n) {
  std::vector<std::string> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(std::to_string(i));
  return labels;
}

std::vector<std::string> key_labels(const MultiheadAttentionConfig& config, const std::vector<std::string>& tokens) {
  std::vector<std::string> keys = tokens;
  // F.multi_head_attention_forward appends bias_k to the keys first, then
  // the zero-attention key.
  if (config.add_bias_kv) keys.push_back("bias_k");
  if (config.add_zero_attn) keys.push_back("zero_attn");
  return keys;
}

void validate(const Report& r) {
  if (r.layers.empty()) fail("report.layers: expected at least one layer, got none");
  const auto L = static_cast<int64_t>(r.query_tokens.size());
  const auto S = static_cast<int64_t>(r.key_tokens.size());
  if (L < 1 || S < 1)
    fail("report: expected at least one query and one key token, got " + num(L) + " and " + num(S));
  for (std::size_t n = 0; n < r.layers.size(); ++n) {
    const LayerAttention& layer = r.layers[n];
    const std::string name = "report.layers[" + std::to_string(n) + "]";
    if (layer.heads < 1) fail(name + ".heads: expected at least 1, got " + num(layer.heads));
    if (layer.queries != L)
      fail(name + ".queries: expected " + num(L) + " (the query tokens), got " + num(layer.queries));
    if (layer.keys != S) fail(name + ".keys: expected " + num(S) + " (the key tokens), got " + num(layer.keys));
    const int64_t expected = layer.heads * layer.queries * layer.keys;
    if (static_cast<int64_t>(layer.weights.size()) != expected)
      fail(name + ".weights: expected " + num(expected) + " values (H·L·S = " + num(layer.heads) + "·" + num(L) +
           "·" + num(S) + "), got " + num(static_cast<int64_t>(layer.weights.size())));
    for (std::size_t k = 0; k < layer.weights.size(); ++k) {
      const double w = layer.weights[k];
      if (!(w >= 0.0 && w <= 1.0)) {  // also refuses NaN
        const int64_t j = static_cast<int64_t>(k) % S, i = static_cast<int64_t>(k) / S % L,
                      h = static_cast<int64_t>(k) / (S * L);
        fail(name + ".weights[" + num(h) + "][" + num(i) + "][" + num(j) +
             "]: expected a probability in [0, 1], got " + std::to_string(w));
      }
    }
  }
  if (r.focus < -1 || r.focus >= L)
    fail("report.focus: expected -1 (none) or a query token 0 to " + num(L - 1) + ", got " + num(r.focus));
  for (std::size_t m = 0; m < r.measures.size(); ++m) {
    const HeadMeasure& measure = r.measures[m];
    const std::string name = "report.measures[" + std::to_string(m) + "] (" + measure.name + ")";
    if (measure.layer < 0 || measure.layer >= static_cast<int64_t>(r.layers.size()))
      fail(name + ".layer: expected 0 to " + num(static_cast<int64_t>(r.layers.size()) - 1) + ", got " +
           num(measure.layer));
    const int64_t H = r.layers[static_cast<std::size_t>(measure.layer)].heads;
    if (static_cast<int64_t>(measure.per_head.size()) != H)
      fail(name + ".per_head: expected " + num(H) + " values (the layer's heads), got " +
           num(static_cast<int64_t>(measure.per_head.size())));
    for (const double v : measure.per_head)
      if (!std::isfinite(v)) fail(name + ".per_head: expected finite values, got " + std::to_string(v));
    if (measure.picked && (*measure.picked < 0 || *measure.picked >= H))
      fail(name + ".picked: expected a head 0 to " + num(H - 1) + ", got " + num(*measure.picked));
  }
  if (r.answer && r.answer->confidence && !(*r.answer->confidence >= 0.0 && *r.answer->confidence <= 1.0))
    fail("report.answer.confidence: expected a probability in [0, 1], got " + std::to_string(*r.answer->confidence));
}

}  // namespace multihead::explain
