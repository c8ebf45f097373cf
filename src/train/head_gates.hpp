// src/train/head_gates.hpp: the gate on each head's output
// (multihead/head_ablation.hpp), on the model's parameters, templated so a
// test can check the gradient against finite differences in double.
// Internal: not part of the public API.
//
// Legend: E d_model, H heads, D = E / H; out_proj.weight is (E, E), its
// column h·D + d reads element d of head h's output.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "multihead/error.hpp"
#include "multihead/train.hpp"
#include "train/model.hpp"

namespace multihead::train {

inline std::string out_projection_name(int64_t layer) { return block_prefix(layer) + "out_proj.weight"; }

inline void check_gates(const ModelConfig& c, std::size_t count) {
  if (count != static_cast<std::size_t>(c.layers * c.heads))
    throw Error(Error::Kind::Shape, "gates: expected " + std::to_string(c.layers * c.heads) + " values (layers " +
                                        std::to_string(c.layers) + " × heads " + std::to_string(c.heads) + "), got " +
                                        std::to_string(count));
}

// attn(x) = Σ_h ξ_h · o_h W_o,hᵀ + b_o: scaling head h's columns of
// out_proj.weight by ξ_h is the gate.
template <class T>
std::map<std::string, Tensor<T>> gated_parameters(const ModelConfig& c, std::map<std::string, Tensor<T>> parameters,
                                                  const std::vector<double>& gates) {
  check_gates(c, gates.size());
  const int64_t E = c.d_model, D = c.d_model / c.heads;
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    T* w = parameters.at(out_projection_name(layer)).data();
    for (int64_t e = 0; e < E; ++e)
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t d = 0; d < D; ++d) w[e * E + h * D + d] *= T(gates[static_cast<std::size_t>(layer * c.heads + h)]);
  }
  return parameters;
}

// ∂L/∂ξ_h at ξ = 1:  Σ_n <dL/dy_n, o_n,h W_o,hᵀ> = Σ_{e, d} dL/dW_o[e, hD + d] · W_o[e, hD + d],
// since dL/dW_o[e, hD + d] = Σ_n dL/dy[n, e] · o_h[n, d] (y = o W_oᵀ + b_o).
template <class T>
std::vector<double> gate_gradients(const ModelConfig& c, const std::map<std::string, Tensor<T>>& parameters,
                                   const std::map<std::string, Tensor<T>>& gradients) {
  const int64_t E = c.d_model, D = c.d_model / c.heads;
  std::vector<double> out(static_cast<std::size_t>(c.layers * c.heads), 0.0);
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    const T* w = parameters.at(out_projection_name(layer)).data();
    const T* g = gradients.at(out_projection_name(layer)).data();
    for (int64_t e = 0; e < E; ++e)
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t d = 0; d < D; ++d)
          out[static_cast<std::size_t>(layer * c.heads + h)] += double(g[e * E + h * D + d]) * double(w[e * E + h * D + d]);
  }
  return out;
}

}  // namespace multihead::train
