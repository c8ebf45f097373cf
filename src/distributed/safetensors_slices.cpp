// src/distributed/safetensors_slices.cpp: see safetensors_slices.hpp.
#include "distributed/safetensors_slices.hpp"

#include <cstring>
#include <vector>

#include "io/decode.hpp"
#include "multihead/error.hpp"

namespace multihead::distributed::detail {

namespace {

// The floating-point dtypes a parameter may have (what the readers decode).
bool parse_dtype(const std::string& name, DType& out) {
  static const std::pair<const char*, DType> table[] = {
      {"F16", DType::F16}, {"BF16", DType::BF16}, {"F32", DType::F32}, {"F64", DType::F64}};
  for (const auto& [text, dtype] : table)
    if (name == text) {
      out = dtype;
      return true;
    }
  return false;
}

}  // namespace

SafetensorsSlices::SafetensorsSlices(const std::string& path) : path_(path) {
  bytes_ = multihead::detail::map_file(path, "weights");
  const auto bad = [&](const std::string& why) {
    return Error(Error::Kind::Format, "weights: " + quote_input(path) + " is not a safetensors file: " + why);
  };
  const uint8_t* data = bytes_.data();
  const uint64_t size = bytes_.size();
  if (size < 8) throw bad("shorter than its 8-byte header length");
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | data[i];
  if (header > size - 8) throw bad("header length " + std::to_string(header) + " past the file's end");
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(data + 8, data + 8 + header);
  } catch (const nlohmann::json::exception&) {
    throw bad("its header is not JSON");
  }
  if (!root.is_object()) throw bad("its header is not a JSON object");
  const uint64_t buffer = 8 + header;
  for (const auto& [name, v] : root.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) throw bad("its __metadata__ is not a JSON object");
      for (const auto& [key, text] : v.items()) {
        if (!text.is_string()) throw bad("__metadata__." + key + " is not a string");
        metadata_[key] = text.get<std::string>();
      }
      continue;
    }
    Entry e;
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      throw bad("tensor '" + name + "' lacks dtype, shape or data_offsets");
    // Integer tensors (a model's buffers) are skipped: no parameter is one.
    if (!v["dtype"].is_string() || !parse_dtype(v["dtype"].get<std::string>(), e.dtype)) continue;
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) throw bad("tensor '" + name + "' has a bad shape");
      e.shape.push_back(d.get<int64_t>());
      numel *= d.get<uint64_t>();
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw bad("tensor '" + name + "' has bad data_offsets");
    const uint64_t b = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (b > end || end > size - buffer || end - b != numel * multihead::detail::itemsize(e.dtype))
      throw bad("tensor '" + name + "' data_offsets do not fit its shape and the file");
    e.begin = buffer + b;
    entries_[name] = std::move(e);
  }
}

const SafetensorsSlices::Entry& SafetensorsSlices::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end())
    throw Error(Error::Kind::Missing, name + ": missing from '" + path_ + "' (a floating-point tensor)");
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
  const Entry& e = entry(name);
  int64_t per = 1;
  for (std::size_t d = 1; d < e.shape.size(); ++d) per *= e.shape[d];
  const std::size_t item = multihead::detail::itemsize(e.dtype);
  std::vector<double> values(static_cast<std::size_t>(count * per));
  values_read_ += values.size();
  multihead::detail::decode_to_double(bytes_.data() + e.begin + static_cast<std::size_t>(first * per) * item,
                                      values.size(), e.dtype, false, values.data());
  Tensor<T> out(Shape{count * per});
  for (std::size_t i = 0; i < values.size(); ++i) out.data()[i] = static_cast<T>(values[i]);
  return out;
}

template <class T>
Tensor<T> SafetensorsSlices::columns(const std::string& name, int64_t first, int64_t count) const {
  const Entry& e = entry(name);
  const int64_t R = e.shape.at(0), C = e.shape.at(1);
  const std::size_t item = multihead::detail::itemsize(e.dtype);
  Tensor<T> out(Shape{R, count});
  std::vector<double> row(static_cast<std::size_t>(count));
  values_read_ += static_cast<uint64_t>(R * count);
  for (int64_t r = 0; r < R; ++r) {
    multihead::detail::decode_to_double(bytes_.data() + e.begin + static_cast<std::size_t>(r * C + first) * item,
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
