// src/distributed/safetensors_slices.cpp: see safetensors_slices.hpp.
#include "distributed/safetensors_slices.hpp"

#include <cstring>
#include <vector>

#include "io/decode.hpp"
#include "multihead/error.hpp"

namespace multihead::distributed::detail {

SafetensorsSlices::SafetensorsSlices(const std::string& path) : path_(path) {
  bytes_ = multihead::detail::map_safetensors(path, path);
  SafetensorsHeader header = parse_safetensors_header(bytes_.data(), bytes_.size(), path);
  metadata_ = std::move(header.metadata);
  entries_ = std::move(header.tensors);
}

const SafetensorsEntry& SafetensorsSlices::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end())
    throw Error(Error::Kind::Missing, name + ": missing from " + quote_input(path_) + " (a floating-point tensor)");
  if (is_integer(it->second.dtype))  // weights_from_header refuses one under a parameter's name first
    throw Error(Error::Kind::Format, name + ": an integer tensor (" + to_string(it->second.dtype) +
                                         "), not a parameter (in " + quote_input(path_) + ")");
  return it->second;
}

std::map<std::string, TensorHeader> SafetensorsSlices::tensors() const {
  std::map<std::string, TensorHeader> out;
  for (const auto& [name, e] : entries_) out.emplace(name, TensorHeader{e.dtype, e.shape});
  return out;
}

const Shape& SafetensorsSlices::shape(const std::string& name) const { return entry(name).shape; }

template <class T>
Tensor<T> SafetensorsSlices::rows(const std::string& name, int64_t first, int64_t count) const {
  const SafetensorsEntry& e = entry(name);
  int64_t per = 1;
  for (std::size_t d = 1; d < e.shape.size(); ++d) per *= e.shape[d];
  const std::size_t item = multihead::detail::itemsize(e.dtype);
  std::vector<double> values(static_cast<std::size_t>(count * per));
  values_read_ += values.size();
  multihead::detail::decode_to_double(bytes_.data() + e.offset + static_cast<std::size_t>(first * per) * item,
                                      values.size(), e.dtype, false, values.data());
  Tensor<T> out(Shape{count * per});
  for (std::size_t i = 0; i < values.size(); ++i) out.data()[i] = static_cast<T>(values[i]);
  return out;
}

template <class T>
Tensor<T> SafetensorsSlices::columns(const std::string& name, int64_t first, int64_t count) const {
  const SafetensorsEntry& e = entry(name);
  const int64_t R = e.shape.at(0), C = e.shape.at(1);
  const std::size_t item = multihead::detail::itemsize(e.dtype);
  Tensor<T> out(Shape{R, count});
  std::vector<double> row(static_cast<std::size_t>(count));
  values_read_ += static_cast<uint64_t>(R * count);
  for (int64_t r = 0; r < R; ++r) {
    multihead::detail::decode_to_double(bytes_.data() + e.offset + static_cast<std::size_t>(r * C + first) * item,
                                        row.size(), e.dtype, false, row.data());
    for (int64_t c = 0; c < count; ++c) out.data()[r * count + c] = static_cast<T>(row[static_cast<std::size_t>(c)]);
  }
  return out;
}

template Tensor<float> SafetensorsSlices::rows<float>(const std::string&, int64_t, int64_t) const;
template Tensor<double> SafetensorsSlices::rows<double>(const std::string&, int64_t, int64_t) const;
template Tensor<float> SafetensorsSlices::columns<float>(const std::string&, int64_t, int64_t) const;
template Tensor<double> SafetensorsSlices::columns<double>(const std::string&, int64_t, int64_t) const;

}  // namespace multihead::distributed::detail
