// src/weights/weights.cpp: state_dict <-> safetensors, and the configuration
// a state_dict implies.
#include "multihead/weights.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

#include "core/check.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"

namespace multihead {
namespace {

std::string in_file(const std::string& path) { return " (in " + path + ")"; }

int64_t parse_int(const std::string& key, const std::string& text, const std::string& path) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE)
    throw Error(Error::Kind::Format, "__metadata__." + key + ": expected an integer, got '" + text + "'" + in_file(path));
  return v;
}

double parse_real(const std::string& key, const std::string& text, const std::string& path) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v))
    throw Error(Error::Kind::Format, "__metadata__." + key + ": expected a number, got '" + text + "'" + in_file(path));
  return v;
}

bool parse_bool(const std::string& key, const std::string& text, const std::string& path) {
  if (text == "true" || text == "True" || text == "1") return true;
  if (text == "false" || text == "False" || text == "0") return false;
  throw Error(Error::Kind::Format,
              "__metadata__." + key + ": expected true or false, got '" + text + "'" + in_file(path));
}

}  // namespace

std::map<std::string, std::string> config_metadata(const MultiheadAttentionConfig& c) {
  auto b = [](bool x) { return std::string(x ? "true" : "false"); };
  char dropout[64];
  std::snprintf(dropout, sizeof dropout, "%.17g", c.dropout);
  return {{"embed_dim", std::to_string(c.embed_dim)},
          {"num_heads", std::to_string(c.num_heads)},
          {"dropout", dropout},
          {"bias", b(c.bias)},
          {"add_bias_kv", b(c.add_bias_kv)},
          {"add_zero_attn", b(c.add_zero_attn)},
          {"kdim", std::to_string(c.key_dim())},
          {"vdim", std::to_string(c.value_dim())},
          {"batch_first", b(c.batch_first)},
          {"format", "pt"}};
}

LoadedWeights load_weights(const std::string& path, const WeightOverrides& overrides) {
  SafetensorsFile file = read_safetensors(path);
  LoadedWeights r;
  r.metadata = file.metadata;
  auto& t = file.tensors;
  static const std::set<std::string> known = {"in_proj_weight", "q_proj_weight", "k_proj_weight",
                                              "v_proj_weight",  "in_proj_bias",  "out_proj.weight",
                                              "out_proj.bias",  "bias_k",        "bias_v"};
  for (const auto& [name, tensor] : t)
    if (!known.count(name))
      throw Error(Error::Kind::Format,
                  name + ": unexpected tensor in a MultiheadAttention state_dict (expected names: "
                         "in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias, "
                         "q_proj_weight, k_proj_weight, v_proj_weight, bias_k, bias_v)" + in_file(path));
  auto has = [&](const char* n) { return t.count(n) != 0; };
  auto take = [&](const char* n) { return std::move(t.at(n).values); };

  // embed_dim from out_proj.weight, which every configuration has.
  if (!has("out_proj.weight"))
    throw Error(Error::Kind::Missing, "out_proj.weight: missing; expected shape (E, E)" + in_file(path));
  const Shape& ow = t.at("out_proj.weight").values.shape();
  if (ow.size() != 2 || ow[0] != ow[1] || ow[0] <= 0)
    detail::fail_shape("out_proj.weight", "(E, E) with E >= 1", ow);
  MultiheadAttentionConfig& c = r.config;
  c.embed_dim = ow[0];
  const int64_t E = c.embed_dim;

  // kdim / vdim from the separate projection weights, when present.
  const bool separate = has("q_proj_weight") || has("k_proj_weight") || has("v_proj_weight");
  if (separate && has("in_proj_weight"))
    throw Error(Error::Kind::Format,
                "in_proj_weight: present together with q/k/v_proj_weight; a state_dict has one or "
                "the other" + in_file(path));
  if (separate) {
    for (const char* n : {"q_proj_weight", "k_proj_weight", "v_proj_weight"})
      if (!has(n))
        throw Error(Error::Kind::Missing, std::string(n) + ": missing (the other separate projection "
                                                           "weights are present)" + in_file(path));
    for (const char* n : {"k_proj_weight", "v_proj_weight"}) {
      const Shape& s = t.at(n).values.shape();
      if (s.size() != 2 || s[0] != E || s[1] <= 0)
        detail::fail_shape(n, "(" + std::to_string(E) + ", " + (n[0] == 'k' ? "kdim" : "vdim") + ")", s);
    }
    c.kdim = t.at("k_proj_weight").values.size(1);
    c.vdim = t.at("v_proj_weight").values.size(1);
  } else if (!has("in_proj_weight")) {
    throw Error(Error::Kind::Missing, "in_proj_weight: missing; expected shape " +
                                          shape_to_string({3 * E, E}) +
                                          " (or q_proj_weight, k_proj_weight, v_proj_weight)" + in_file(path));
  }
  if (has("in_proj_bias") != has("out_proj.bias"))
    throw Error(Error::Kind::Missing,
                std::string(has("in_proj_bias") ? "out_proj.bias" : "in_proj_bias") +
                    ": missing; bias=True has both in_proj_bias and out_proj.bias" + in_file(path));
  c.bias = has("in_proj_bias");
  if (has("bias_k") != has("bias_v"))
    throw Error(Error::Kind::Missing,
                std::string(has("bias_k") ? "bias_v" : "bias_k") +
                    ": missing; add_bias_kv has both bias_k and bias_v" + in_file(path));
  c.add_bias_kv = has("bias_k");

  // What the tensors cannot tell comes from metadata, then from overrides.
  const auto& m = file.metadata;
  if (m.count("num_heads")) c.num_heads = parse_int("num_heads", m.at("num_heads"), path);
  else c.num_heads = 0;
  if (m.count("batch_first")) c.batch_first = parse_bool("batch_first", m.at("batch_first"), path);
  if (m.count("add_zero_attn")) c.add_zero_attn = parse_bool("add_zero_attn", m.at("add_zero_attn"), path);
  if (m.count("dropout")) c.dropout = parse_real("dropout", m.at("dropout"), path);
  if (overrides.num_heads) c.num_heads = *overrides.num_heads;
  if (overrides.batch_first) c.batch_first = *overrides.batch_first;
  if (overrides.add_zero_attn) c.add_zero_attn = *overrides.add_zero_attn;
  if (overrides.dropout) c.dropout = *overrides.dropout;
  if (c.num_heads == 0 && !m.count("num_heads") && !overrides.num_heads)
    throw Error(Error::Kind::Missing, "num_heads: not in the weights' __metadata__; pass --num-heads" + in_file(path));

  // Metadata that restates what the tensors say must agree with them.
  auto agree = [&](const char* key, int64_t actual) {
    if (m.count(key) && parse_int(key, m.at(key), path) != actual)
      throw Error(Error::Kind::Format, std::string("__metadata__.") + key + ": says " + m.at(key) +
                                           " but the tensors give " + std::to_string(actual) + in_file(path));
  };
  agree("embed_dim", E);
  agree("kdim", c.key_dim());
  agree("vdim", c.value_dim());
  if (m.count("bias") && parse_bool("bias", m.at("bias"), path) != c.bias)
    throw Error(Error::Kind::Format, "__metadata__.bias: says " + m.at("bias") + " but in_proj_bias is " +
                                         (c.bias ? "present" : "absent") + in_file(path));
  if (m.count("add_bias_kv") && parse_bool("add_bias_kv", m.at("add_bias_kv"), path) != c.add_bias_kv)
    throw Error(Error::Kind::Format, "__metadata__.add_bias_kv: says " + m.at("add_bias_kv") +
                                         " but bias_k is " + (c.add_bias_kv ? "present" : "absent") + in_file(path));
  c.validate();

  MultiheadAttentionParameters<double>& p = r.parameters;
  if (separate && c.same_embed_dim()) {
    // kdim = vdim = embed_dim given explicitly: PyTorch packs the three.
    const Tensor<double> q = take("q_proj_weight"), k = take("k_proj_weight"), v = take("v_proj_weight");
    detail::expect_shape("q_proj_weight", q.shape(), {E, E});
    Storage<double> packed;
    packed.reserve(static_cast<std::size_t>(3 * E * E));
    for (const auto* w : {&q, &k, &v}) packed.insert(packed.end(), w->vec().begin(), w->vec().end());
    p.in_proj_weight = Tensor<double>({3 * E, E}, std::move(packed));
  } else if (separate) {
    p.q_proj_weight = take("q_proj_weight");
    p.k_proj_weight = take("k_proj_weight");
    p.v_proj_weight = take("v_proj_weight");
  } else {
    p.in_proj_weight = take("in_proj_weight");
  }
  p.out_proj_weight = take("out_proj.weight");
  if (c.bias) {
    p.in_proj_bias = take("in_proj_bias");
    p.out_proj_bias = take("out_proj.bias");
  }
  if (c.add_bias_kv) {
    p.bias_k = take("bias_k");
    p.bias_v = take("bias_v");
  }
  try {
    validate_parameters(c, p);
  } catch (const Error& e) {
    throw Error(e.kind(), e.what() + in_file(path));
  }
  return r;
}

template <class T>
std::string serialize_weights(const BasicMultiheadAttention<T>& module) {
  std::map<std::string, Tensor<float>> tensors;
  for (const auto& [name, tensor] : module.state_dict()) tensors.emplace(name, tensor_cast<float>(tensor));
  return serialize_safetensors(tensors, config_metadata(module.config()));
}

template <class T>
void save_weights(const std::string& path, const BasicMultiheadAttention<T>& module) {
  write_file_atomic(path, serialize_weights(module));
}

template std::string serialize_weights<float>(const BasicMultiheadAttention<float>&);
template std::string serialize_weights<double>(const BasicMultiheadAttention<double>&);
template void save_weights<float>(const std::string&, const BasicMultiheadAttention<float>&);
template void save_weights<double>(const std::string&, const BasicMultiheadAttention<double>&);

}  // namespace multihead
