// multihead/weights.hpp: torch.nn.MultiheadAttention state_dicts in
// safetensors files, in both directions.
//
// Tensor names are PyTorch's: in_proj_weight, in_proj_bias, out_proj.weight,
// out_proj.bias; q_proj_weight / k_proj_weight / v_proj_weight when kdim or
// vdim differ from embed_dim; bias_k and bias_v with add_bias_kv. In a whole
// model's state_dict they carry the module's prefix, e.g.
// "encoder.layers.0.self_attn.in_proj_weight", and LoadOptions::prefix picks
// the module.
//
// The module configuration that tensors cannot tell (num_heads, batch_first,
// add_zero_attn, dropout) is read from the file's "__metadata__" map: the key
// "<prefix>num_heads" (e.g. "encoder.layers.0.self_attn.num_heads") if the
// file has it, else the bare "num_heads", which then applies to every module
// in the file. Any field of WeightOverrides that is set replaces both.
//
// The grouped-query module (GroupedQueryAttention) has its own format,
// Hugging Face Llama's names: see "grouped-query attention" below.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "multihead/grouped_query_attention.hpp"
#include "multihead/io.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/narrow_grouped_query_attention.hpp"
#include "multihead/narrow_multihead_attention.hpp"

namespace multihead {

struct WeightOverrides {
  std::optional<int64_t> num_heads;
  std::optional<bool> batch_first;
  std::optional<bool> add_zero_attn;
  std::optional<double> dropout;
};

struct LoadOptions {
  // Reads only the tensors named prefix + <state_dict name> and ignores the
  // rest of the file. A prefix without its final '.' gets one:
  // "encoder.layers.0.self_attn" is "encoder.layers.0.self_attn.".
  std::string prefix;
  WeightOverrides overrides = {};
};

// A configuration value that neither the metadata nor an override gave, so
// PyTorch's default was used: {"batch_first", "false"}.
struct AssumedSetting {
  std::string key;
  std::string value;
};

// T: the parameters' element type. double for load_weights (exact for every
// file dtype); bfloat16 or float16 for load_weights_narrow.
template <class T>
struct BasicLoadedWeights {
  MultiheadAttentionConfig config;
  MultiheadAttentionParameters<T> parameters;
  std::map<std::string, std::string> metadata;
  std::string prefix;                  // as used, with its final '.'
  std::vector<AssumedSetting> assumed; // in the order batch_first, add_zero_attn, dropout
  // The parameters' dtype on disk when they all share one (F16, BF16, F32,
  // F64, Bool), else nullopt: lets a caller say that a bf16 checkpoint runs
  // in float32, or that an f32 one was rounded into a bf16 module.
  std::optional<DType> parameter_dtype;
};
using LoadedWeights = BasicLoadedWeights<double>;

// Infers embed_dim, kdim, vdim, bias and add_bias_kv from the tensors, takes
// the rest from metadata and overrides, and validates everything. Throws
// multihead::Error naming the tensor or metadata key (and the file) with the
// expected and the actual value. Unknown tensor names under the prefix are
// rejected, as load_state_dict(strict=True) does; the message then lists the
// prefixes of the MultiheadAttention modules the file does hold. Tensors
// outside the prefix are ignored whatever their dtype, so a whole model's
// integer buffers (num_batches_tracked, position_ids) do not matter; an
// integer tensor under a parameter's name is an error naming its dtype.
LoadedWeights load_weights(const std::string& path, const LoadOptions& options = {});
inline LoadedWeights load_weights(const std::string& path, const WeightOverrides& overrides) {
  return load_weights(path, LoadOptions{"", overrides});
}

// What load_weights(path, options) gives, from the file's header alone: the
// configuration (from the shapes of the tensors under the prefix and the
// metadata, by the same rules), metadata, prefix and assumed settings; the
// parameters stay empty and parameter_dtype is the shared dtype of those
// tensors, if one. `tensors` maps the file's floating-point tensors, full
// names, to their dtype and shape. For a reader that decodes only its part of
// a file (a head-parallel rank, multihead/distributed.hpp). Names under the
// prefix that are no parameter are skipped here (load_weights refuses them).
struct TensorHeader {
  DType dtype = DType::F32;
  Shape shape;
};
LoadedWeights weights_from_header(const std::map<std::string, TensorHeader>& tensors,
                                  const std::map<std::string, std::string>& metadata, const std::string& path,
                                  const LoadOptions& options = {});

// The same rules, into a 16-bit module's element type E (bfloat16, float16)
// with no float32 or float64 copy of the weights: a tensor stored as E is
// copied bit for bit from the file (read with Sixteen::Keep), so the peak
// memory is the mapped file plus the parameters, each the file's size. A
// tensor of another dtype is rounded to E once, to nearest even (F32, BF16
// into float16 and F16 into bfloat16 are widened exactly to float32 first;
// F64 is rounded to float32, then to E). parameter_dtype says which it was;
// serialize_weights(NarrowMultiheadAttention<E>) writes an E file back bit
// for bit.
template <class E>
BasicLoadedWeights<E> load_weights_narrow(const std::string& path, const LoadOptions& options = {});

// A MultiheadAttention state_dict found inside a file: a prefix p with
// p + "out_proj.weight" and p + "in_proj_weight" (or p + "q_proj_weight").
struct FoundModule {
  std::string prefix;  // "" for a bare MultiheadAttention state_dict
  // From the tensor shapes (meaningful when `problem` is empty).
  int64_t embed_dim = 0, kdim = 0, vdim = 0;
  bool bias = false, add_bias_kv = false;
  // From the metadata ("<prefix>key", else "key"); empty when absent.
  std::optional<int64_t> num_heads;
  std::optional<bool> batch_first, add_zero_attn;
  std::optional<double> dropout;
  // Why load_weights would refuse these tensors (an integer dtype, a shape)
  // or metadata; empty if it would not.
  std::string problem;
};

// Every module in the file, sorted by prefix. `name` is what messages call
// the file.
std::vector<FoundModule> find_attention_modules(const SafetensorsFile& file, const std::string& name);
std::vector<FoundModule> find_attention_modules(const std::string& path);

// The module's configuration as the metadata strings load_weights reads.
std::map<std::string, std::string> config_metadata(const MultiheadAttentionConfig& config);

// Writes the state_dict as F32 with config_metadata(). Atomic.
template <class T>
void save_weights(const std::string& path, const BasicMultiheadAttention<T>& module);
// The bytes save_weights writes (for a stream, or several files at once).
template <class T>
std::string serialize_weights(const BasicMultiheadAttention<T>& module);
// A 16-bit module's parameters as they are, BF16 (F16) tensors, with
// config_metadata(): load_weights reads them back exactly.
std::string serialize_weights(const NarrowMultiheadAttention<bfloat16>& module);
std::string serialize_weights(const NarrowMultiheadAttention<float16>& module);

// ---- grouped-query attention ---------------------------------------------------
// A GroupedQueryAttention module's file, as `multihead init --num-kv-heads`
// writes it and `multihead forward --num-kv-heads` and `multihead decode`
// read it: a safetensors with
//   q_proj.weight (H·D, E), k_proj.weight and v_proj.weight (Hkv·D, E),
//   o_proj.weight (E, H·D) and, all or none, the four *.bias,
// under an optional prefix (Hugging Face Llama's names:
// "model.layers.0.self_attn."; a missing final "." is added, as for
// MultiheadAttention: io.hpp's module_prefix), and __metadata__
//   module = "grouped_query_attention", num_heads = H, num_kv_heads = Hkv,
//   head_dim = D
// read by the one metadata rule (integers, the whole string). A Llama
// checkpoint has no metadata: num_heads is then an option, and the K/V heads
// follow from k_proj.weight's rows over D = q_proj.weight's rows / H.
struct GqaLoadOptions {
  std::string prefix;
  // Replace the metadata's; num_heads is needed when the file has none.
  std::optional<int64_t> num_heads;
  std::optional<int64_t> num_kv_heads;
  // Not in the file: the module's other settings.
  bool causal = true;
};

// The configuration the file implies (rope unset; set it before module()
// if the model uses it) and its tensors, exact in double.
struct LoadedGqaWeights {
  GroupedQueryAttentionConfig config;
  std::map<std::string, Tensor<double>> tensors;  // prefix + name
  std::map<std::string, std::string> metadata;
  std::string prefix;  // as used, with its final '.' (module_prefix)
  // The parameters' dtype on disk when they all share one (F32, BF16, F16,
  // F64), else nullopt, as BasicLoadedWeights::parameter_dtype.
  std::optional<DType> parameter_dtype;
  // GroupedQueryAttention<T>::from_tensors(config, tensors as T, prefix).
  template <class T>
  GroupedQueryAttention<T> module() const;
};

// Throws multihead::Error naming the tensor or key, the expected and the
// actual value, and the file: q_proj/k_proj.weight missing or not 2-D;
// num_heads missing, not an integer >= 1 or not dividing q_proj.weight's
// rows; head_dim or num_kv_heads in the metadata disagreeing with the
// shapes; num_kv_heads not dividing num_heads. A message about a value an
// option gave starts with the option's name ("num_kv_heads: …"), one about
// a metadata value with "__metadata__.KEY: …".
LoadedGqaWeights load_gqa_weights(const std::string& path, const GqaLoadOptions& options = {});
LoadedGqaWeights load_gqa_weights(const SafetensorsFile& file, const std::string& name,
                                  const GqaLoadOptions& options = {});

// The same file straight into 16-bit storage (E: bfloat16 or float16), with
// no float64 or float32 copy of the module: tensors stored as E are taken as
// they are, any other dtype is rounded once to nearest even (a finite value
// float16 cannot hold is refused, naming the tensor and the file). The
// configuration, its checks and parameter_dtype are load_gqa_weights'.
// Set config.rope (if the model uses it) before module().
template <class E>
struct NarrowLoadedGqaWeights {
  GroupedQueryAttentionConfig config;
  GroupedQueryAttentionParameters<E> parameters;
  std::map<std::string, std::string> metadata;
  std::string prefix;  // as used, with its final '.' (module_prefix)
  std::optional<DType> parameter_dtype;
  // NarrowGroupedQueryAttention<E>(config, parameters); a missing or
  // misshapen tensor is named with the prefix.
  NarrowGroupedQueryAttention<E> module() const;
};
template <class E>
NarrowLoadedGqaWeights<E> load_gqa_weights_narrow(const std::string& path, const GqaLoadOptions& options = {});

// The metadata above for `module`, its weights as F32 safetensors bytes,
// and those bytes written atomically.
std::map<std::string, std::string> gqa_config_metadata(const GroupedQueryAttention<float>& module);
std::string serialize_gqa_weights(const GroupedQueryAttention<float>& module);
void save_gqa_weights(const std::string& path, const GroupedQueryAttention<float>& module);
// A 16-bit module's parameters as they are, BF16 (F16) tensors, with the
// same metadata: load_gqa_weights reads their values back exactly.
std::string serialize_gqa_weights(const NarrowGroupedQueryAttention<bfloat16>& module);
std::string serialize_gqa_weights(const NarrowGroupedQueryAttention<float16>& module);

// Parameters converted to another element type (e.g. the double a file
// loads to, into the float a float32 forward runs in).
template <class To, class From>
MultiheadAttentionParameters<To> cast_parameters(const MultiheadAttentionParameters<From>& p) {
  MultiheadAttentionParameters<To> r;
  auto c = [](const Tensor<From>& t) {
    return t.shape().empty() && t.empty() ? Tensor<To>() : tensor_cast<To>(t);
  };
  // Every row of the table (an absent parameter stays absent).
  for_each_parameter(MultiheadAttentionConfig{}, p, r,
                     [&](const ParameterInfo&, const Tensor<From>& from, Tensor<To>& to) { to = c(from); });
  return r;
}

}  // namespace multihead
