// src/weights/take_tensor.hpp: a parameter out of a read safetensors file,
// whichever of its maps holds it (decoded, or kept 16-bit: io.hpp's
// Sixteen), as the element type a module wants. The multi-head and the
// grouped-query loaders share it (weights.cpp, gqa_weights.cpp).
#pragma once

#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "attention/narrow_convert.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"
#include "multihead/tensor.hpp"

namespace multihead::detail {

// A real-valued tensor's dtype on disk and shape, from whichever map holds
// it (decoded, kept 16-bit: io.hpp's Sixteen, or left undecoded by a
// filter), or nothing.
struct RealTensor {
  DType dtype;
  const Shape* shape;
};
inline std::optional<RealTensor> find_real(const SafetensorsFile& file, const std::string& name) {
  if (auto it = file.tensors.find(name); it != file.tensors.end())
    return RealTensor{it->second.dtype, &it->second.values.shape()};
  if (auto it = file.bf16_tensors.find(name); it != file.bf16_tensors.end())
    return RealTensor{DType::BF16, &it->second.shape()};
  if (auto it = file.f16_tensors.find(name); it != file.f16_tensors.end())
    return RealTensor{DType::F16, &it->second.shape()};
  if (auto it = file.undecoded.find(name); it != file.undecoded.end())
    return RealTensor{it->second.dtype, &it->second.shape};
  return std::nullopt;
}

inline bool has_tensor(const SafetensorsFile& file, const std::string& name) {
  return find_real(file, name) || file.integer_tensors.count(name) != 0;
}

// The tensor `name` (known to be real-valued) moved out of the file as
// element type T: as stored when the file holds it as T, else converted
// (exactly to double; to a 16-bit T rounded once: weights.hpp; a finite
// value float16 cannot hold is refused, naming the tensor and the file:
// attention/narrow_convert.hpp's rounded_parameter).
template <class T, class From>
Tensor<T> convert_tensor(const Tensor<From>& t, const std::string& name, const std::string& where) {
  if constexpr (std::is_same_v<T, double>) {
    return widen<double>(t);
  } else if constexpr (std::is_same_v<From, double>) {
    Tensor<float> f(t.shape());
    for (int64_t i = 0; i < t.numel(); ++i) f.data()[i] = static_cast<float>(t[i]);
    return detail::rounded_parameter<T>(name, f, where);
  } else {
    return detail::rounded_parameter<T>(name, widen<float>(t), where);
  }
}
// Throws Error(Value) naming `name` when the file was read with a filter
// that left it undecoded (io.hpp's TensorWanted): a caller's read that
// does not fit its use, named rather than taken for a missing tensor.
inline void expect_decoded(const SafetensorsFile& file, const std::string& name, const std::string& where) {
  if (file.undecoded.count(name))
    throw Error(Error::Kind::Value, name + ": not decoded (the file was read with a filter that left it out)" + where);
}

template <class T>
Tensor<T> take_tensor(SafetensorsFile& file, const std::string& name, const std::string& where) {
  expect_decoded(file, name, where);
  auto take = [&](auto& map) {
    auto node = map.extract(name);
    using From = typename std::decay_t<decltype(node.mapped())>::value_type;
    if constexpr (std::is_same_v<From, T>) return std::move(node.mapped());
    else return convert_tensor<T>(node.mapped(), name, where);
  };
  if (file.bf16_tensors.count(name)) return take(file.bf16_tensors);
  if (file.f16_tensors.count(name)) return take(file.f16_tensors);
  auto node = file.tensors.extract(name);
  if constexpr (std::is_same_v<T, double>) return std::move(node.mapped().values);
  else return convert_tensor<T>(node.mapped().values, name, where);
}

}  // namespace multihead::detail
