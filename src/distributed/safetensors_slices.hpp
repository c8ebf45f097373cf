// src/distributed/safetensors_slices.hpp: row and column blocks of tensors in
// a safetensors file, decoded without decoding the rest: the file is mapped
// (map_safetensors), its header parsed and checked as every reader checks it
// (parse_safetensors_header), and only the blocks asked for are read, so a
// head-parallel rank's memory for its parameters is its share (1/P).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "io/file_util.hpp"
#include "multihead/io.hpp"
#include "multihead/tensor.hpp"
#include "multihead/weights.hpp"

namespace multihead::distributed::detail {

class SafetensorsSlices {
 public:
  // Throws Error naming the file: unreadable, not safetensors, a header
  // whose tensors do not fit the file or their dtype and shape.
  explicit SafetensorsSlices(const std::string& path);
  bool has(const std::string& name) const { return entries_.count(name) > 0 && !is_integer(entries_.at(name).dtype); }
  // Every tensor's dtype and shape (integer ones too: weights_from_header
  // refuses one under a parameter's name), and the __metadata__
  // (weights_from_header reads the configuration from them).
  std::map<std::string, TensorHeader> tensors() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Values decoded so far by rows() and columns() (what this reader took
  // from the file: a test counts it).
  uint64_t values_read() const { return values_read_; }
  // Throws Error(Missing) naming the tensor and the file when absent.
  const Shape& shape(const std::string& name) const;
  // Rows [first, first + count) of the tensor seen as (shape[0], rest).
  template <class T>
  Tensor<T> rows(const std::string& name, int64_t first, int64_t count) const;
  // Columns [first, first + count) of a 2-D tensor, as (rows, count).
  template <class T>
  Tensor<T> columns(const std::string& name, int64_t first, int64_t count) const;

 private:
  const SafetensorsEntry& entry(const std::string& name) const;
  std::string path_;
  multihead::detail::FileBytes bytes_;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  mutable uint64_t values_read_ = 0;
};

}  // namespace multihead::distributed::detail
