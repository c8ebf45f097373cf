// src/weights/weights.cpp: state_dict <-> safetensors, and the configuration
// a state_dict implies.
#include "multihead/weights.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <type_traits>
#include <utility>

#include "attention/narrow_convert.hpp"
#include "core/check.hpp"
#include "core/parameters.hpp"
#include "io/metadata.hpp"
#include "weights/gqa_format.hpp"
#include "weights/take_tensor.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"

namespace multihead {
namespace {

using detail::find_real;
using detail::has_tensor;
using detail::take_tensor;

// Where a module's tensors and metadata come from, for error messages: the
// full tensor name is prefix + local name, and every message ends with the file.
struct Source {
  std::string path;
  std::string prefix;
  std::string tensor(const std::string& local) const { return prefix + local; }
  std::string in_file() const { return " (in " + quote_input(path) + ")"; }
};

// Every name of the parameter table (for_each_parameter), whatever the
// configuration: what a MultiheadAttention state_dict may hold.
const std::set<std::string>& state_dict_names() {
  static const std::set<std::string> names = [] {
    std::set<std::string> n;
    for_each_parameter(MultiheadAttentionConfig{}, [&](const ParameterInfo& info) { n.insert(info.name); });
    return n;
  }();
  return names;
}

// "in_proj_weight, q_proj_weight, …": the same names in the table's order.
std::string state_dict_name_list() {
  std::string list;
  for_each_parameter(MultiheadAttentionConfig{}, [&](const ParameterInfo& info) {
    list += (list.empty() ? "" : ", ") + std::string(info.name);
  });
  return list;
}

// A metadata value by the one rule (io/metadata.hpp), the file named last.
template <class Read>
auto read_value(const std::string& key, const Source& src, Read read) {
  try {
    return read("__metadata__." + key);
  } catch (const Error& e) {
    throw Error(e.kind(), std::string(e.what()) + src.in_file());
  }
}
int64_t parse_int(const std::string& key, const std::string& text, const Source& src) {
  return read_value(key, src, [&](const std::string& name) { return detail::metadata_integer(name, text); });
}
double parse_real(const std::string& key, const std::string& text, const Source& src) {
  return read_value(key, src, [&](const std::string& name) { return detail::metadata_number(name, text); });
}
bool parse_bool(const std::string& key, const std::string& text, const Source& src) {
  return read_value(key, src, [&](const std::string& name) { return detail::metadata_boolean(name, text); });
}

using Metadata = std::map<std::string, std::string>;

// The one metadata lookup rule: "<prefix>key" first, then the file-wide "key".
// Returns the key found (for messages) and its value, or nothing.
std::optional<std::pair<std::string, std::string>> find_metadata(const Metadata& m, const Source& src,
                                                                 const std::string& key) {
  for (const std::string& k : {src.prefix + key, key})
    if (auto it = m.find(k); it != m.end()) return std::make_pair(k, it->second);
  return std::nullopt;
}

std::optional<int64_t> metadata_int(const Metadata& m, const Source& src, const char* key) {
  const auto kv = find_metadata(m, src, key);
  return kv ? std::optional(parse_int(kv->first, kv->second, src)) : std::nullopt;
}
std::optional<bool> metadata_bool(const Metadata& m, const Source& src, const char* key) {
  const auto kv = find_metadata(m, src, key);
  return kv ? std::optional(parse_bool(kv->first, kv->second, src)) : std::nullopt;
}
std::optional<double> metadata_real(const Metadata& m, const Source& src, const char* key) {
  const auto kv = find_metadata(m, src, key);
  return kv ? std::optional(parse_real(kv->first, kv->second, src)) : std::nullopt;
}

// ---- the tensors say embed_dim, kdim, vdim, bias and add_bias_kv ---------------

using ShapeMap = std::map<std::string, Shape>;  // local state_dict name -> shape

// embed_dim from out_proj.weight, which every configuration has; kdim and
// vdim from the separate projection weights, when present.
void infer_projection_dims(const ShapeMap& t, const Source& src, MultiheadAttentionConfig& c) {
  auto has = [&](const char* n) { return t.count(n) != 0; };
  if (!has("out_proj.weight"))
    throw Error(Error::Kind::Missing,
                src.tensor("out_proj.weight") + ": missing; expected shape (E, E)" + src.in_file());
  const Shape& ow = t.at("out_proj.weight");
  if (ow.size() != 2 || ow[0] != ow[1] || ow[0] <= 0)
    detail::fail_shape(src.tensor("out_proj.weight"), "(E, E) with E >= 1", ow);
  c.embed_dim = ow[0];
  const int64_t E = c.embed_dim;

  const bool separate = has("q_proj_weight") || has("k_proj_weight") || has("v_proj_weight");
  if (separate && has("in_proj_weight"))
    throw Error(Error::Kind::Format, src.tensor("in_proj_weight") + ": present together with q/k/v_proj_weight; "
                                     "a state_dict has one or the other" + src.in_file());
  if (!separate && !has("in_proj_weight"))
    throw Error(Error::Kind::Missing, src.tensor("in_proj_weight") + ": missing; expected shape " +
                                          shape_to_string({3 * E, E}) +
                                          " (or q_proj_weight, k_proj_weight, v_proj_weight)" + src.in_file());
  if (!separate) return;
  for (const char* n : {"q_proj_weight", "k_proj_weight", "v_proj_weight"})
    if (!has(n))
      throw Error(Error::Kind::Missing, src.tensor(n) + ": missing (the other separate projection "
                                                        "weights are present)" + src.in_file());
  for (const char* n : {"k_proj_weight", "v_proj_weight"}) {
    const Shape& s = t.at(n);
    if (s.size() != 2 || s[0] != E || s[1] <= 0)
      detail::fail_shape(src.tensor(n), "(" + std::to_string(E) + ", " + (n[0] == 'k' ? "kdim" : "vdim") + ")", s);
  }
  c.kdim = t.at("k_proj_weight")[1];
  c.vdim = t.at("v_proj_weight")[1];
}

// Each of these options brings a pair of tensors; one without the other is
// a broken state_dict, not a configuration.
void infer_bias_options(const ShapeMap& t, const Source& src, MultiheadAttentionConfig& c) {
  auto has = [&](const char* n) { return t.count(n) != 0; };
  if (has("in_proj_bias") != has("out_proj.bias"))
    throw Error(Error::Kind::Missing,
                src.tensor(has("in_proj_bias") ? "out_proj.bias" : "in_proj_bias") +
                    ": missing; bias=True has both in_proj_bias and out_proj.bias" + src.in_file());
  c.bias = has("in_proj_bias");
  if (has("bias_k") != has("bias_v"))
    throw Error(Error::Kind::Missing, src.tensor(has("bias_k") ? "bias_v" : "bias_k") +
                                          ": missing; add_bias_kv has both bias_k and bias_v" + src.in_file());
  c.add_bias_kv = has("bias_k");
}

MultiheadAttentionConfig config_from_shapes(const ShapeMap& shapes, const Source& src) {
  MultiheadAttentionConfig c;
  infer_projection_dims(shapes, src, c);
  infer_bias_options(shapes, src, c);
  return c;
}

// ---- the metadata says the rest ------------------------------------------------

// Metadata that restates what the tensors say must agree with them.
void check_metadata_agrees(const Metadata& m, const Source& src, const MultiheadAttentionConfig& c) {
  auto agree = [&](const char* key, int64_t actual) {
    const auto kv = find_metadata(m, src, key);
    if (kv && parse_int(kv->first, kv->second, src) != actual)
      throw Error(Error::Kind::Format, "__metadata__." + kv->first + ": says " + kv->second +
                                           " but the tensors give " + std::to_string(actual) + src.in_file());
  };
  agree("embed_dim", c.embed_dim);
  agree("kdim", c.key_dim());
  agree("vdim", c.value_dim());
  auto agree_presence = [&](const char* key, const char* tensor, bool present) {
    const auto kv = find_metadata(m, src, key);
    if (kv && parse_bool(kv->first, kv->second, src) != present)
      throw Error(Error::Kind::Format, "__metadata__." + kv->first + ": says " + kv->second + " but " +
                                           src.tensor(tensor) + " is " + (present ? "present" : "absent") +
                                           src.in_file());
  };
  agree_presence("bias", "in_proj_bias", c.bias);
  agree_presence("add_bias_kv", "bias_k", c.add_bias_kv);
}

// An override wins over the metadata, the metadata over PyTorch's default;
// a default that was used is recorded, so the caller can say so.
template <class V>
void settle(V& field, const std::optional<V>& override_value, const std::optional<V>& from_metadata,
            const char* key, std::vector<AssumedSetting>& assumed) {
  if (override_value) field = *override_value;
  else if (from_metadata) field = *from_metadata;
  else if constexpr (std::is_same_v<V, bool>) assumed.push_back({key, field ? "true" : "false"});
  else assumed.push_back({key, detail::format_number(static_cast<double>(field))});
}

void apply_metadata(const Metadata& m, const Source& src, const WeightOverrides& ov,
                    MultiheadAttentionConfig& c, std::vector<AssumedSetting>& assumed) {
  const std::optional<int64_t> heads = ov.num_heads ? ov.num_heads : metadata_int(m, src, "num_heads");
  if (!heads)
    throw Error(Error::Kind::Missing,
                "num_heads: expected a head count, given (num_heads=) or in the weights' __metadata__" +
                    (src.prefix.empty() ? " (as 'num_heads')"
                                        : " (as " + quote_input(src.prefix + "num_heads") + " or 'num_heads')") +
                    ", got neither" + src.in_file());
  c.num_heads = *heads;
  settle(c.batch_first, ov.batch_first, metadata_bool(m, src, "batch_first"), "batch_first", assumed);
  settle(c.add_zero_attn, ov.add_zero_attn, metadata_bool(m, src, "add_zero_attn"), "add_zero_attn", assumed);
  settle(c.dropout, ov.dropout, metadata_real(m, src, "dropout"), "dropout", assumed);
}

// ---- picking the module out of the file ------------------------------------------

// Every tensor name of the file, decoded or integer, in name order: the
// order in which they are checked, so the first error is the same whichever
// map a tensor is in.
std::vector<std::string> tensor_names(const SafetensorsFile& file) {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : file.tensors) names.push_back(name);
  for (const auto& [name, tensor] : file.bf16_tensors) names.push_back(name);
  for (const auto& [name, tensor] : file.f16_tensors) names.push_back(name);
  for (const auto& [name, info] : file.integer_tensors) names.push_back(name);
  for (const auto& [name, entry] : file.undecoded) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

// A parameter is real-valued; an integer tensor under a parameter's name is
// a broken export, named rather than skipped. (Bool is decoded to 0 / 1 and
// accepted, as it always was.)
[[noreturn]] void refuse_integer_parameter(const std::string& name, DType dtype, const Source& src) {
  throw Error(Error::Kind::Format, name + ": expected dtype float16, bfloat16, float32 or float64, got " +
                                       to_string(dtype) + src.in_file());
}

void check_parameter_dtype(const SafetensorsFile& file, const std::string& name, const Source& src) {
  const auto it = file.integer_tensors.find(name);
  if (it != file.integer_tensors.end()) refuse_integer_parameter(name, it->second.dtype, src);
}

// "; this file holds MultiheadAttention modules at prefixes a., b. (pass one
// as prefix=)", or "" when the file holds no module besides the one at
// src.prefix.
std::string module_prefixes_hint(const SafetensorsFile& file, const Source& src) {
  std::string list;
  for (const FoundModule& m : find_attention_modules(file, src.path))
    if (m.prefix != src.prefix) list += (list.empty() ? "" : ", ") + (m.prefix.empty() ? "''" : m.prefix);
  return list.empty() ? "" : "; this file holds MultiheadAttention modules at prefixes " + list +
                                 " (pass one as prefix=)";
}

// Moves the tensors under the prefix out of the file, under their local
// names. Anything else under the prefix is an error, as in strict loading,
// whatever its dtype; tensors outside the prefix are never looked at.
// Names are checked before anything moves, since the error message lists the
// file's modules from their shapes.
template <class T>
std::map<std::string, Tensor<T>> take_module(SafetensorsFile& file, const Source& src) {
  // A module nested under the prefix ("a." holding "a.b.", which inspect
  // lists as a module of its own) keeps its tensors: they are its
  // parameters, not unexpected ones of this module.
  std::vector<std::string> nested;
  if (has_tensor(file, src.tensor("out_proj.weight")))
    for (const FoundModule& m : find_attention_modules(file, src.path))
      if (m.prefix.size() > src.prefix.size() && m.prefix.starts_with(src.prefix)) nested.push_back(m.prefix);
  auto in_nested = [&](const std::string& name) {
    return std::any_of(nested.begin(), nested.end(), [&](const std::string& p) {
      return name.starts_with(p) && state_dict_names().count(name.substr(p.size())) != 0;
    });
  };
  std::vector<std::string> names;
  for (const std::string& name : tensor_names(file)) {
    if (!name.starts_with(src.prefix) || in_nested(name)) continue;
    if (!state_dict_names().count(name.substr(src.prefix.size())))
      throw Error(Error::Kind::Format,
                  name + ": unexpected tensor in a MultiheadAttention state_dict (expected names: " +
                      state_dict_name_list() + ")" + src.in_file() +
                      module_prefixes_hint(file, src));
    check_parameter_dtype(file, name, src);
    names.push_back(name);
  }
  if (names.empty() && !src.prefix.empty())
    throw Error(Error::Kind::Missing, "prefix: expected the start of a tensor name" + src.in_file() + ", got " +
                                          quote_input(src.prefix) + module_prefixes_hint(file, src));
  std::map<std::string, Tensor<T>> out;
  for (const std::string& name : names)
    out.emplace(name.substr(src.prefix.size()), take_tensor<T>(file, name, src.in_file()));
  return out;
}

template <class T>
ShapeMap shapes_of(const std::map<std::string, Tensor<T>>& tensors) {
  ShapeMap out;
  for (const auto& [name, t] : tensors) out.emplace(name, t.shape());
  return out;
}

// The tensors in the module's own layout. With kdim = vdim = embed_dim given
// explicitly as three weights, PyTorch packs them into in_proj_weight.
template <class T>
MultiheadAttentionParameters<T> build_parameters(std::map<std::string, Tensor<T>>& t,
                                                 const MultiheadAttentionConfig& c, const Source& src) {
  auto take = [&](const char* n) { return t.count(n) ? std::move(t.at(n)) : Tensor<T>(); };
  MultiheadAttentionParameters<T> p;
  const int64_t E = c.embed_dim;
  if (t.count("q_proj_weight") && c.same_embed_dim()) {
    const Tensor<T> q = take("q_proj_weight"), k = take("k_proj_weight"), v = take("v_proj_weight");
    detail::expect_shape(src.tensor("q_proj_weight"), q.shape(), {E, E});
    Storage<T> packed;
    packed.reserve(static_cast<std::size_t>(3 * E * E));
    for (const auto* w : {&q, &k, &v}) packed.insert(packed.end(), w->vec().begin(), w->vec().end());
    p.in_proj_weight = Tensor<T>({3 * E, E}, std::move(packed));
  }
  // Every row the packing above did not fill takes the tensor of its name.
  for_each_parameter(c, p, [&](const ParameterInfo& info, Tensor<T>& tensor) {
    if (tensor.shape().empty()) tensor = take(info.name);
  });
  try {
    c.validate();
    detail::check_parameters(c, p);
  } catch (const Error& e) {
    // Its messages start with the local tensor name.
    throw Error(e.kind(), src.prefix + e.what() + src.in_file());
  }
  return p;
}

}  // namespace

std::map<std::string, std::string> config_metadata(const MultiheadAttentionConfig& c) {
  auto b = [](bool x) { return std::string(x ? "true" : "false"); };
  return {{"embed_dim", std::to_string(c.embed_dim)},
          {"num_heads", std::to_string(c.num_heads)},
          {"dropout", to_exact_string(c.dropout)},
          {"bias", b(c.bias)},
          {"add_bias_kv", b(c.add_bias_kv)},
          {"add_zero_attn", b(c.add_zero_attn)},
          {"kdim", std::to_string(c.key_dim())},
          {"vdim", std::to_string(c.value_dim())},
          {"batch_first", b(c.batch_first)},
          {"format", "pt"}};
}

namespace {

// load_weights and load_weights_narrow: one rule, T the parameters' type.
template <class T>
BasicLoadedWeights<T> load_module(const std::string& path, const LoadOptions& options) {
  const Source src{path, module_prefix(options.prefix)};
  // Only the module's tensors are decoded; the rest of the file (a module
  // nested under the prefix, a sibling sharing its start) is seen through
  // its header (names and shapes, for the messages).
  SafetensorsFile file = read_safetensors(path, std::is_same_v<T, double> ? Sixteen::Decode : Sixteen::Keep,
                                          tensors_named(src.prefix, state_dict_names()));
  // A grouped-query module's file would fail on its first unexpected name;
  // say what it is, and how to read it, instead.
  if (auto gqa = detail::gqa_module_message(file, src.prefix, path)) throw Error(Error::Kind::Format, *gqa);
  BasicLoadedWeights<T> r;
  bool first = true;
  for (const std::string& local : state_dict_names()) {
    const auto found = find_real(file, src.tensor(local));
    if (!found) continue;
    if (first) r.parameter_dtype = found->dtype;
    else if (r.parameter_dtype != found->dtype) r.parameter_dtype.reset();
    if (!r.parameter_dtype) break;
    first = false;
  }
  std::map<std::string, Tensor<T>> tensors = take_module<T>(file, src);
  r.prefix = src.prefix;
  r.config = config_from_shapes(shapes_of(tensors), src);
  apply_metadata(file.metadata, src, options.overrides, r.config, r.assumed);
  check_metadata_agrees(file.metadata, src, r.config);
  r.config.validate();
  r.parameters = build_parameters(tensors, r.config, src);
  r.metadata = std::move(file.metadata);
  return r;
}

}  // namespace

LoadedWeights load_weights(const std::string& path, const LoadOptions& options) {
  return load_module<double>(path, options);
}

template <class E>
BasicLoadedWeights<E> load_weights_narrow(const std::string& path, const LoadOptions& options) {
  return load_module<E>(path, options);
}
template BasicLoadedWeights<bfloat16> load_weights_narrow<bfloat16>(const std::string&, const LoadOptions&);
template BasicLoadedWeights<float16> load_weights_narrow<float16>(const std::string&, const LoadOptions&);

LoadedWeights weights_from_header(const std::map<std::string, TensorHeader>& tensors,
                                  const std::map<std::string, std::string>& metadata, const std::string& path,
                                  const LoadOptions& options) {
  const Source src{path, module_prefix(options.prefix)};
  LoadedWeights r;
  ShapeMap shapes;
  bool first = true;
  for (const auto& [name, t] : tensors) {
    if (!name.starts_with(src.prefix) || !state_dict_names().count(name.substr(src.prefix.size()))) continue;
    if (is_integer(t.dtype)) refuse_integer_parameter(name, t.dtype, src);
    shapes.emplace(name.substr(src.prefix.size()), t.shape);
    if (first) r.parameter_dtype = t.dtype;
    else if (r.parameter_dtype != t.dtype) r.parameter_dtype.reset();
    first = false;
  }
  if (shapes.empty() && !src.prefix.empty())
    throw Error(Error::Kind::Missing, "prefix: expected the start of a tensor name" + src.in_file() + ", got " +
                                          quote_input(src.prefix));
  r.prefix = src.prefix;
  r.config = config_from_shapes(shapes, src);
  apply_metadata(metadata, src, options.overrides, r.config, r.assumed);
  check_metadata_agrees(metadata, src, r.config);
  r.config.validate();
  r.metadata = metadata;
  return r;
}

std::vector<FoundModule> find_attention_modules(const SafetensorsFile& file, const std::string& name) {
  static const std::string kAnchor = "out_proj.weight";
  std::vector<FoundModule> out;
  for (const std::string& tensor_name : tensor_names(file)) {
    if (!tensor_name.ends_with(kAnchor)) continue;
    const Source src{name, tensor_name.substr(0, tensor_name.size() - kAnchor.size())};
    if (!has_tensor(file, src.tensor("in_proj_weight")) && !has_tensor(file, src.tensor("q_proj_weight")))
      continue;
    ShapeMap shapes;
    for (const std::string& local : state_dict_names())
      if (const auto found = find_real(file, src.tensor(local))) shapes.emplace(local, *found->shape);
    FoundModule m;
    m.prefix = src.prefix;
    try {
      for (const std::string& local : state_dict_names()) check_parameter_dtype(file, src.tensor(local), src);
      const MultiheadAttentionConfig c = config_from_shapes(shapes, src);
      m.embed_dim = c.embed_dim, m.kdim = c.key_dim(), m.vdim = c.value_dim();
      m.bias = c.bias, m.add_bias_kv = c.add_bias_kv;
      m.num_heads = metadata_int(file.metadata, src, "num_heads");
      m.batch_first = metadata_bool(file.metadata, src, "batch_first");
      m.add_zero_attn = metadata_bool(file.metadata, src, "add_zero_attn");
      m.dropout = metadata_real(file.metadata, src, "dropout");
      check_metadata_agrees(file.metadata, src, c);
    } catch (const Error& e) {
      m.problem = e.what();
    }
    out.push_back(std::move(m));
  }
  std::sort(out.begin(), out.end(), [](const FoundModule& a, const FoundModule& b) { return a.prefix < b.prefix; });
  return out;
}

std::vector<FoundModule> find_attention_modules(const std::string& path) {
  return find_attention_modules(read_safetensors(path, Sixteen::Decode, no_tensors()), path);
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

// 16-bit modules: their parameters as stored, BF16 or F16 on disk.
std::string serialize_weights(const NarrowMultiheadAttention<bfloat16>& module) {
  return serialize_safetensors_narrow(module.state_dict(), config_metadata(module.config()));
}
std::string serialize_weights(const NarrowMultiheadAttention<float16>& module) {
  return serialize_safetensors_narrow(module.state_dict(), config_metadata(module.config()));
}

template std::string serialize_weights<float>(const BasicMultiheadAttention<float>&);
template std::string serialize_weights<double>(const BasicMultiheadAttention<double>&);
template void save_weights<float>(const std::string&, const BasicMultiheadAttention<float>&);
template void save_weights<double>(const std::string&, const BasicMultiheadAttention<double>&);

}  // namespace multihead
