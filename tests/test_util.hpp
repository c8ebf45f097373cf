// tests/test_util.hpp: helpers shared by the C++ tests.
#pragma once

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>

#include "multihead/error.hpp"
#include "multihead/tensor.hpp"

namespace multihead::test {

// x with 3 significant digits, for RecordProperty (std::to_string prints
// 6 decimals: 1e-7 as 0.000000).
inline std::string fmt(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", x);
  return b;
}

// Standard-normal entries from `rng`.
template <class T>
Tensor<T> random_tensor(const Shape& shape, std::mt19937_64& rng) {
  Tensor<T> t(shape);
  std::normal_distribution<double> n(0.0, 1.0);
  for (auto& x : t.vec()) x = static_cast<T>(n(rng));
  return t;
}

// ‖a − b‖ / ‖b‖ over all elements (in double). NaN in the same places in
// both is ignored; NaN in one only gives +inf, so a test on it fails.
template <class A, class B>
double rel_error(const Tensor<A>& a, const Tensor<B>& b) {
  if (a.numel() != b.numel()) return INFINITY;
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (std::isnan(x) || std::isnan(y)) {
      if (std::isnan(x) != std::isnan(y)) return INFINITY;
      continue;
    }
    num += (x - y) * (x - y);
    den += y * y;
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

// The message of the multihead::Error that f() throws, or "" when it
// returns: a test compares the whole line, or EXPECT_EQ(error_of(f), "")
// for "no error". Any other exception propagates and fails the test.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace multihead::test
