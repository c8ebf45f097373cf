// src/attention/positions.cpp: positional encodings (multihead/positions.hpp).
#include "multihead/positions.hpp"

#include <cmath>
#include <string>

#include "multihead/error.hpp"

namespace multihead {

template <class T>
Tensor<T> sinusoidal_positions(int64_t length, int64_t width, int64_t offset) {
  const auto fail = [](const std::string& what) { throw Error(Error::Kind::Value, "sinusoidal_positions: " + what); };
  if (length < 0) fail("length must be >= 0, got " + std::to_string(length));
  if (width < 1) fail("width must be >= 1, got " + std::to_string(width));
  if (offset < 0) fail("offset must be >= 0, got " + std::to_string(offset));
  Tensor<T> pe(Shape{length, width});
  for (int64_t p = 0; p < length; ++p) {
    const double pos = static_cast<double>(p + offset);
    for (int64_t c = 0; c < width; ++c) {
      // Columns 2i and 2i + 1 share the frequency 1 / 10000^(2i / E).
      const double angle = pos / std::pow(10000.0, static_cast<double>(c - c % 2) / static_cast<double>(width));
      pe[p * width + c] = static_cast<T>(c % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
  }
  return pe;
}

template Tensor<float> sinusoidal_positions<float>(int64_t, int64_t, int64_t);
template Tensor<double> sinusoidal_positions<double>(int64_t, int64_t, int64_t);

}  // namespace multihead
