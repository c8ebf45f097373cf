// src/weights/gqa_weights.cpp: GroupedQueryAttention weights in safetensors
// files, both directions (multihead/weights.hpp, "grouped-query attention").
#include <set>
#include <string>
#include <utility>

#include "io/metadata.hpp"
#include "weights/gqa_format.hpp"
#include "weights/take_tensor.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"
#include "multihead/weights.hpp"

namespace multihead {
namespace {

std::string in_file(const std::string& path) { return " (in " + quote_input(path) + ")"; }

// A metadata integer >= 1 by the one rule (io/metadata.hpp), or nothing.
std::optional<int64_t> metadata_count(const SafetensorsFile& file, const std::string& key, const std::string& path) {
  const auto it = file.metadata.find(key);
  if (it == file.metadata.end()) return std::nullopt;
  try {
    return detail::metadata_integer("__metadata__." + key, it->second, 1);
  } catch (const Error& e) {
    throw Error(e.kind(), std::string(e.what()) + in_file(path));
  }
}

// A projection weight's shape, from whichever map of the file holds it
// (decoded, or kept 16-bit for the narrow loader).
const Shape& weight(const SafetensorsFile& file, const std::string& name, const std::string& path) {
  const std::optional<detail::RealTensor> found = detail::find_real(file, name);
  if (!found) {
    const bool integer = file.integer_tensors.count(name) != 0;
    throw Error(integer ? Error::Kind::Format : Error::Kind::Missing,
                name + (integer ? ": an integer tensor, expected floating point"
                                : ": missing; a grouped-query attention file holds q_proj/k_proj/v_proj/"
                                  "o_proj.weight (`multihead init --num-kv-heads` writes one)") +
                    in_file(path));
  }
  if (found->shape->size() != 2)
    throw Error(Error::Kind::Shape, name + ": expected 2 dimensions (out_features, in_features), got shape " +
                                        shape_to_string(*found->shape) + in_file(path));
  return *found->shape;
}

}  // namespace

namespace detail {

std::optional<std::string> gqa_module_message(const SafetensorsFile& file, const std::string& prefix,
                                              const std::string& path) {
  auto has = [&](const char* name) {
    const std::string n = prefix + name;
    return file.tensors.count(n) != 0 || file.integer_tensors.count(n) != 0 || file.bf16_tensors.count(n) != 0 ||
           file.f16_tensors.count(n) != 0 || file.undecoded.count(n) != 0;
  };
  if (!has("q_proj.weight") || !has("o_proj.weight")) return std::nullopt;
  std::string count = "N";
  if (const auto it = file.metadata.find("num_kv_heads"); it != file.metadata.end()) {
    try {
      count = std::to_string(metadata_integer("num_kv_heads", it->second, 1)) + " (the file's num_kv_heads)";
    } catch (const Error&) {
    }
  }
  return prefix + "q_proj.weight: a grouped-query attention module (q_proj/k_proj/v_proj/o_proj.weight), not a "
                  "MultiheadAttention state_dict; read it with load_gqa_weights, or on the command line with multihead "
                  "forward or decode and --num-kv-heads " + count + in_file(path);
}

}  // namespace detail

namespace {

// The configuration a file's shapes and metadata imply, with the options
// (rope unset, bias false: the loaders set it from the biases found).
GroupedQueryAttentionConfig gqa_file_config(const SafetensorsFile& file, const std::string& path,
                                            const GqaLoadOptions& options) {
  const std::string p = module_prefix(options.prefix);
  const Shape& q = weight(file, p + "q_proj.weight", path);
  const Shape& k = weight(file, p + "k_proj.weight", path);
  const int64_t rows = q[0], E = q[1];

  // num_heads: the option, else the metadata; the file's shapes cannot tell.
  const std::optional<int64_t> meta_heads = metadata_count(file, "num_heads", path);
  const std::string heads_name = options.num_heads ? "num_heads" : "__metadata__.num_heads";
  if (options.num_heads && *options.num_heads < 1)
    throw Error(Error::Kind::Value, "num_heads: expected >= 1, got " + std::to_string(*options.num_heads));
  if (!options.num_heads && !meta_heads)
    throw Error(Error::Kind::Missing, "num_heads: expected a head count, given (num_heads=) or in the weights' "
                                      "__metadata__ (as 'num_heads'), got neither" + in_file(path));
  const int64_t H = options.num_heads ? *options.num_heads : *meta_heads;
  if (rows % H != 0)
    throw Error(Error::Kind::Shape, heads_name + ": " + p + "q_proj.weight's " + std::to_string(rows) +
                                        " rows are not " + std::to_string(H) + " heads of equal width" + in_file(path));
  const int64_t D = rows / H;
  if (const auto meta_d = metadata_count(file, "head_dim", path); meta_d && *meta_d != D)
    throw Error(Error::Kind::Format, heads_name + ": " + std::to_string(H) + " heads give head_dim " +
                                         std::to_string(D) + " (" + p + "q_proj.weight's " + std::to_string(rows) +
                                         " rows / " + std::to_string(H) + "), but __metadata__.head_dim says " +
                                         std::to_string(*meta_d) + in_file(path));

  // num_kv_heads: the option, else the metadata (as `multihead init` writes
  // it), else k_proj.weight's rows over the head width.
  const std::optional<int64_t> meta_kv = metadata_count(file, "num_kv_heads", path);
  std::string kv_name = "num_kv_heads";
  int64_t kv = 0;
  if (options.num_kv_heads) {
    kv = *options.num_kv_heads;
  } else if (meta_kv) {
    kv = *meta_kv, kv_name = "__metadata__.num_kv_heads";
  } else {
    if (k[0] % D != 0)
      throw Error(Error::Kind::Shape, p + "k_proj.weight: " + std::to_string(k[0]) +
                                          " rows are not K/V heads of the query heads' width " + std::to_string(D) +
                                          in_file(path));
    kv = k[0] / D, kv_name = p + "k_proj.weight";
  }
  if (kv < 1 || H % kv != 0)
    throw Error(Error::Kind::Value, kv_name + ": expected a divisor of num_heads " + std::to_string(H) +
                                        " (each K/V head serves num_heads / num_kv_heads query heads), got " +
                                        std::to_string(kv) + in_file(path));
  if (k != Shape{kv * D, E})
    throw Error(Error::Kind::Shape, kv_name + ": " + std::to_string(kv) + " K/V heads of width " + std::to_string(D) +
                                        " need " + p + "k_proj.weight " + shape_to_string({kv * D, E}) +
                                        ", the file's is " + shape_to_string(k) + in_file(path));
  GroupedQueryAttentionConfig config;
  config.embed_dim = E;
  config.num_heads = H;
  config.num_kv_heads = kv;
  config.head_dim = D;
  config.causal = options.causal;
  return config;
}

// Every row of the module's parameter table that the file holds, biases
// included (their presence sets config.bias), in the table's order:
// fn(row name, prefix + name); the dtypes on disk into `dtype` (nullopt
// when they differ), as BasicLoadedWeights::parameter_dtype.
template <class Fn>
void for_each_file_parameter(const SafetensorsFile& file, const std::string& prefix,
                             GroupedQueryAttentionConfig& config, std::optional<DType>& dtype, Fn&& fn) {
  GroupedQueryAttentionConfig every_row = config;
  every_row.bias = true;
  bool first = true;
  for_each_parameter(every_row, [&](const ParameterInfo& info) {
    const std::optional<detail::RealTensor> found = detail::find_real(file, prefix + info.name);
    if (!found) return;
    if (first) dtype = found->dtype;
    else if (dtype != found->dtype) dtype.reset();
    first = false;
    config.bias = config.bias || std::string(info.name).ends_with(".bias");
    fn(std::string(info.name), prefix + info.name);
  });
}

// The module's tensors, every row of the parameter table, biases included:
// the only ones a loader decodes (io.hpp's tensors_named).
TensorWanted gqa_tensors(const std::string& prefix) {
  static const std::set<std::string> names = [] {
    GroupedQueryAttentionConfig every_row;
    every_row.bias = true;
    std::set<std::string> n;
    for_each_parameter(every_row, [&](const ParameterInfo& info) { n.insert(info.name); });
    return n;
  }();
  return tensors_named(module_prefix(prefix), names);
}

}  // namespace

LoadedGqaWeights load_gqa_weights(const SafetensorsFile& file, const std::string& path, const GqaLoadOptions& options) {
  LoadedGqaWeights r;
  r.config = gqa_file_config(file, path, options);
  r.prefix = module_prefix(options.prefix);
  // The biases found say `bias` (from_tensors checks they are all there or
  // none). A file read with 16-bit tensors kept has them widened exactly.
  for_each_file_parameter(file, r.prefix, r.config, r.parameter_dtype,
                          [&](const std::string&, const std::string& name) {
                            detail::expect_decoded(file, name, in_file(path));
                            if (const auto it = file.tensors.find(name); it != file.tensors.end())
                              r.tensors.emplace(name, it->second.values);
                            else if (const auto b = file.bf16_tensors.find(name); b != file.bf16_tensors.end())
                              r.tensors.emplace(name, widen<double>(b->second));
                            else
                              r.tensors.emplace(name, widen<double>(file.f16_tensors.at(name)));
                          });
  r.metadata = file.metadata;
  return r;
}

LoadedGqaWeights load_gqa_weights(const std::string& path, const GqaLoadOptions& options) {
  return load_gqa_weights(read_safetensors(path, Sixteen::Decode, gqa_tensors(options.prefix)), path, options);
}

template <class E>
NarrowLoadedGqaWeights<E> load_gqa_weights_narrow(const std::string& path, const GqaLoadOptions& options) {
  SafetensorsFile file = read_safetensors(path, Sixteen::Keep, gqa_tensors(options.prefix));
  NarrowLoadedGqaWeights<E> r;
  r.config = gqa_file_config(file, path, options);
  r.prefix = module_prefix(options.prefix);
  std::map<std::string, Tensor<E>> tensors;
  for_each_file_parameter(file, r.prefix, r.config, r.parameter_dtype,
                          [&](const std::string& row, const std::string& name) {
                            tensors.emplace(row, detail::take_tensor<E>(file, name, in_file(path)));
                          });
  for_each_parameter(r.config, r.parameters, [&](const ParameterInfo& info, Tensor<E>& t) {
    if (const auto it = tensors.find(info.name); it != tensors.end()) t = std::move(it->second);
  });
  r.metadata = std::move(file.metadata);
  return r;
}

template <class E>
NarrowGroupedQueryAttention<E> NarrowLoadedGqaWeights<E>::module() const {
  try {
    return NarrowGroupedQueryAttention<E>(config, parameters);
  } catch (const Error& e) {
    throw Error(e.kind(), prefix + e.what());
  }
}

template struct NarrowLoadedGqaWeights<bfloat16>;
template struct NarrowLoadedGqaWeights<float16>;
template NarrowLoadedGqaWeights<bfloat16> load_gqa_weights_narrow<bfloat16>(const std::string&, const GqaLoadOptions&);
template NarrowLoadedGqaWeights<float16> load_gqa_weights_narrow<float16>(const std::string&, const GqaLoadOptions&);

template <class T>
GroupedQueryAttention<T> LoadedGqaWeights::module() const {
  std::map<std::string, Tensor<T>> cast;
  for (const auto& [name, t] : tensors) cast.emplace(name, tensor_cast<T>(t));
  return GroupedQueryAttention<T>::from_tensors(config, cast, prefix);
}

namespace {
std::map<std::string, std::string> gqa_metadata(const GroupedQueryAttentionConfig& c) {
  return {{"module", "grouped_query_attention"},
          {"num_heads", std::to_string(c.num_heads)},
          {"num_kv_heads", std::to_string(c.resolved_kv_heads())},
          {"head_dim", std::to_string(c.resolved_head_dim())}};
}
}  // namespace

std::map<std::string, std::string> gqa_config_metadata(const GroupedQueryAttention<float>& module) {
  return gqa_metadata(module.config());
}

std::string serialize_gqa_weights(const GroupedQueryAttention<float>& module) {
  return serialize_safetensors(module.state_dict(), gqa_config_metadata(module));
}
std::string serialize_gqa_weights(const NarrowGroupedQueryAttention<bfloat16>& module) {
  return serialize_safetensors_narrow(module.state_dict(), gqa_metadata(module.config()));
}
std::string serialize_gqa_weights(const NarrowGroupedQueryAttention<float16>& module) {
  return serialize_safetensors_narrow(module.state_dict(), gqa_metadata(module.config()));
}

void save_gqa_weights(const std::string& path, const GroupedQueryAttention<float>& module) {
  write_file_atomic(path, serialize_gqa_weights(module));
}

template GroupedQueryAttention<float> LoadedGqaWeights::module<float>() const;
template GroupedQueryAttention<double> LoadedGqaWeights::module<double>() const;

}  // namespace multihead
