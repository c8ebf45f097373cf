// src/distributed/slices.hpp: the row and column blocks of a parameter that
// a rank holds (head parallel), and their inverse for tests and gradients.
#pragma once

#include <algorithm>
#include <cstdint>

#include "multihead/tensor.hpp"

namespace multihead::distributed::detail {

// Rows [row0, row0 + rows) of a (R, C) matrix (or of a vector, C = 1).
template <class T>
Tensor<T> row_block(const T* src, int64_t cols, int64_t row0, int64_t rows, Shape shape) {
  Tensor<T> out(std::move(shape));
  std::copy(src + row0 * cols, src + (row0 + rows) * cols, out.data());
  return out;
}

// Columns [col0, col0 + cols) of a (R, C) matrix, as (R, cols).
template <class T>
Tensor<T> column_block(const T* src, int64_t R, int64_t C, int64_t col0, int64_t cols) {
  Tensor<T> out(Shape{R, cols});
  for (int64_t r = 0; r < R; ++r) std::copy(src + r * C + col0, src + r * C + col0 + cols, out.data() + r * cols);
  return out;
}

// The query's shape with its last dimension replaced.
inline Shape with_last(Shape s, int64_t last) {
  s.back() = last;
  return s;
}

}  // namespace multihead::distributed::detail
