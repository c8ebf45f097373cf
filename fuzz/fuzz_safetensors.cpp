// fuzz/fuzz_safetensors.cpp: parse_safetensors on arbitrary bytes. A parse
// either succeeds or throws multihead::Error; anything else is a bug.
// A successful parse must also survive our writer: the same names, shapes
// (as float32 zeros: values outside float's range cannot be narrowed) and
// metadata serialize and parse back unchanged. Integer tensors, which the
// reader describes without decoding, go through the writer the same way.
#include <cstdint>
#include <map>
#include <string>

#include "multihead/error.hpp"
#include "multihead/io.hpp"

namespace {

// What io.hpp promises of an integer tensor's description: an integer
// dtype, a name in no other map, and numel × itemsize (1, 2, 4 or 8) bytes.
void check_integer_tensor(const multihead::SafetensorsFile& f, const std::string& name,
                          const multihead::IntegerTensorInfo& t) {
  if (!multihead::is_integer(t.dtype) || f.tensors.count(name)) __builtin_trap();
  const auto numel = static_cast<uint64_t>(multihead::shape_numel(t.shape));
  if (numel == 0 ? t.byte_size != 0 : t.byte_size % numel != 0) __builtin_trap();
  const uint64_t itemsize = numel == 0 ? 1 : t.byte_size / numel;
  if (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  multihead::SafetensorsFile f;
  try {
    f = multihead::parse_safetensors(data, size, "fuzz");
  } catch (const multihead::Error&) {
    return 0;
  }
  std::map<std::string, multihead::Tensor<float>> zeros;
  for (const auto& [name, t] : f.tensors) {
    if (multihead::is_integer(t.dtype)) __builtin_trap();
    if (t.values.numel() != multihead::shape_numel(t.values.shape())) __builtin_trap();
    zeros.emplace(name, multihead::Tensor<float>(t.values.shape(), 0.0f));
  }
  for (const auto& [name, t] : f.integer_tensors) {
    check_integer_tensor(f, name, t);
    zeros.emplace(name, multihead::Tensor<float>(t.shape, 0.0f));
  }
  const std::string again = multihead::serialize_safetensors(zeros, f.metadata);
  const multihead::SafetensorsFile g = multihead::parse_safetensors(
      reinterpret_cast<const uint8_t*>(again.data()), again.size(), "fuzz round trip");
  if (g.metadata != f.metadata || g.tensors.size() != zeros.size() || !g.integer_tensors.empty())
    __builtin_trap();
  for (const auto& [name, t] : zeros) {
    const auto it = g.tensors.find(name);
    if (it == g.tensors.end() || it->second.values.shape() != t.shape()) __builtin_trap();
  }
  return 0;
}
