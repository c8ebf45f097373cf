// fuzz/fuzz_safetensors.cpp: parse_safetensors on arbitrary bytes. A parse
// either succeeds or throws multihead::Error; anything else is a bug.
// A successful parse must also survive our writer: the same names, shapes
// (as float32 zeros: values outside float's range cannot be narrowed) and
// metadata serialize and parse back unchanged.
#include <cstdint>
#include <map>
#include <string>

#include "multihead/error.hpp"
#include "multihead/io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  multihead::SafetensorsFile f;
  try {
    f = multihead::parse_safetensors(data, size, "fuzz");
  } catch (const multihead::Error&) {
    return 0;
  }
  std::map<std::string, multihead::Tensor<float>> zeros;
  for (const auto& [name, t] : f.tensors) {
    if (t.values.numel() != multihead::shape_numel(t.values.shape())) __builtin_trap();
    zeros.emplace(name, multihead::Tensor<float>(t.values.shape(), 0.0f));
  }
  const std::string again = multihead::serialize_safetensors(zeros, f.metadata);
  const multihead::SafetensorsFile g = multihead::parse_safetensors(
      reinterpret_cast<const uint8_t*>(again.data()), again.size(), "fuzz round trip");
  if (g.metadata != f.metadata || g.tensors.size() != f.tensors.size()) __builtin_trap();
  for (const auto& [name, t] : f.tensors) {
    const auto it = g.tensors.find(name);
    if (it == g.tensors.end() || it->second.values.shape() != t.values.shape()) __builtin_trap();
  }
  return 0;
}
