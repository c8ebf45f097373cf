// multihead/weights.hpp: torch.nn.MultiheadAttention state_dicts in
// safetensors files, in both directions.
//
// Tensor names are PyTorch's: in_proj_weight, in_proj_bias, out_proj.weight,
// out_proj.bias; q_proj_weight / k_proj_weight / v_proj_weight when kdim or
// vdim differ from embed_dim; bias_k and bias_v with add_bias_kv. The module
// configuration that tensors cannot tell (num_heads, batch_first,
// add_zero_attn, dropout) is read from the file's "__metadata__" map, and
// any field of WeightOverrides that is set replaces it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "multihead/multihead_attention.hpp"

namespace multihead {

struct WeightOverrides {
  std::optional<int64_t> num_heads;
  std::optional<bool> batch_first;
  std::optional<bool> add_zero_attn;
  std::optional<double> dropout;
};

struct LoadedWeights {
  MultiheadAttentionConfig config;
  MultiheadAttentionParameters<double> parameters;  // exact for every file dtype
  std::map<std::string, std::string> metadata;
};

// Infers embed_dim, kdim, vdim, bias and add_bias_kv from the tensors, takes
// the rest from metadata and overrides, and validates everything. Throws
// multihead::Error naming the tensor or metadata key (and the file) with the
// expected and the actual value. Unknown tensor names are rejected, as
// load_state_dict(strict=True) does.
LoadedWeights load_weights(const std::string& path, const WeightOverrides& overrides = {});

// The module's configuration as the metadata strings load_weights reads.
std::map<std::string, std::string> config_metadata(const MultiheadAttentionConfig& config);

// Writes the state_dict as F32 with config_metadata(). Atomic.
template <class T>
void save_weights(const std::string& path, const BasicMultiheadAttention<T>& module);
// The bytes save_weights writes (for a stream, or several files at once).
template <class T>
std::string serialize_weights(const BasicMultiheadAttention<T>& module);

// Parameters converted to another element type (e.g. the double a file
// loads to, into the float a float32 forward runs in).
template <class To, class From>
MultiheadAttentionParameters<To> cast_parameters(const MultiheadAttentionParameters<From>& p) {
  MultiheadAttentionParameters<To> r;
  auto c = [](const Tensor<From>& t) {
    return t.shape().empty() && t.empty() ? Tensor<To>() : tensor_cast<To>(t);
  };
  r.in_proj_weight = c(p.in_proj_weight);
  r.q_proj_weight = c(p.q_proj_weight);
  r.k_proj_weight = c(p.k_proj_weight);
  r.v_proj_weight = c(p.v_proj_weight);
  r.in_proj_bias = c(p.in_proj_bias);
  r.out_proj_weight = c(p.out_proj_weight);
  r.out_proj_bias = c(p.out_proj_bias);
  r.bias_k = c(p.bias_k);
  r.bias_v = c(p.bias_v);
  return r;
}

}  // namespace multihead
