// src/io/safetensors_write.cpp: writing safetensors as the Rust crate does:
// a compact JSON header ("__metadata__" first, then tensors in key order,
// each {"dtype","shape","data_offsets"}), padded with spaces to a multiple of
// 8 bytes so the buffer is 8-byte aligned, then the tensors back to back.
#include <nlohmann/json.hpp>

#include <bit>
#include <cstring>

#include "io/bytes.hpp"
#include "io/message.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"

#include <type_traits>

namespace multihead {

namespace {

// A JSON string literal. nlohmann refuses invalid UTF-8, which the format
// forbids too.
std::string json_string(const std::string& s, const char* what) {
  try {
    return nlohmann::json(s).dump();
  } catch (const nlohmann::json::exception&) {
    throw Error(Error::Kind::Value,
                "safetensors: " + std::string(what) + " " + quote_input(s, 120) + " is not valid UTF-8");
  }
}

}  // namespace

namespace {

// Element type T of the tensors, written as safetensors dtype `dtype`
// (F32 for float, BF16, F16: the bits as stored).
template <class T>
const char* dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "F32";
  else if constexpr (std::is_same_v<T, bfloat16>) return "BF16";
  else return "F16";
}

template <class T>
std::string serialize(const std::map<std::string, Tensor<T>>& tensors, const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (const auto& [key, value] : metadata)
      header += json_string(key, "metadata key") + ":" + json_string(value, "metadata value") + ",";
    header.back() = '}';
    header += ",";
  }
  uint64_t offset = 0;
  for (const auto& [key, t] : tensors) {
    if (key == "__metadata__") {
      throw Error(Error::Kind::Value, "safetensors: tensor name '__metadata__' is reserved for the metadata");
    }
    if (shape_numel(t.shape()) != t.numel()) {
      throw Error(Error::Kind::Shape, "safetensors: tensor " + quote_input(key, 120) + ": shape " +
                                          shape_to_string(t.shape()) + " needs " +
                                          std::to_string(shape_numel(t.shape())) + " elements, tensor has " +
                                          std::to_string(t.numel()));
    }
    std::string dims;
    for (int64_t d : t.shape()) {
      if (!dims.empty()) dims += ',';
      dims += std::to_string(d);
    }
    const uint64_t end = offset + static_cast<uint64_t>(t.numel()) * sizeof(T);
    header += json_string(key, "tensor name") + ":{\"dtype\":\"" + dtype_name<T>() + "\",\"shape\":[" + dims +
              "],\"data_offsets\":[" +
              std::to_string(offset) + "," + std::to_string(end) + "]},";
    offset = end;
  }
  if (header.back() == ',') header.pop_back();
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + header.size() + offset);
  detail::append_le(out, static_cast<uint64_t>(header.size()));
  out += header;
  for (const auto& [key, t] : tensors) {
    if constexpr (std::endian::native == std::endian::little) {
      out.append(reinterpret_cast<const char*>(t.data()), static_cast<std::size_t>(t.numel()) * sizeof(T));
    } else if constexpr (std::is_same_v<T, float>) {
      for (int64_t i = 0; i < t.numel(); ++i) detail::append_le(out, std::bit_cast<uint32_t>(t[i]));
    } else {
      for (int64_t i = 0; i < t.numel(); ++i) detail::append_le(out, t[i].bits);
    }
  }
  return out;
}

}  // namespace

std::string serialize_safetensors(const std::map<std::string, Tensor<float>>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  return serialize(tensors, metadata);
}
std::string serialize_safetensors_narrow(const std::map<std::string, Tensor<bfloat16>>& tensors,
                                         const std::map<std::string, std::string>& metadata) {
  return serialize(tensors, metadata);
}
std::string serialize_safetensors_narrow(const std::map<std::string, Tensor<float16>>& tensors,
                                         const std::map<std::string, std::string>& metadata) {
  return serialize(tensors, metadata);
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor<float>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file_atomic(path, serialize_safetensors(tensors, metadata));
}

}  // namespace multihead
