// src/attention/options.cpp: the public option types of multihead/attention.hpp
// (masks, kernel names, ALiBi slopes). No arithmetic beyond the mask conversion, so the
// textbook form's oracle build (tests/CMakeLists.txt) can link it alone.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "multihead/attention.hpp"
#include "core/check.hpp"
#include "multihead/error.hpp"

namespace multihead {

template <class T>
Tensor<T> Mask<T>::to_additive() const {
  if (!is_bool_) return float_;
  Tensor<T> out(bool_.shape());
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < out.numel(); ++i) out[i] = bool_[i] ? neg_inf : T(0);
  return out;
}

template class Mask<float>;
template class Mask<double>;

std::string to_string(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::Auto: return "auto";
    case AttentionKernel::Reference: return "reference";
    case AttentionKernel::Materialized: return "materialized";
    case AttentionKernel::Flash: return "flash";
  }
  return "auto";
}

AttentionKernel parse_attention_kernel(const std::string& name) {
  for (AttentionKernel k : {AttentionKernel::Auto, AttentionKernel::Reference,
                            AttentionKernel::Materialized, AttentionKernel::Flash})
    if (name == to_string(k)) return k;
  throw Error(Error::Kind::Value, "kernel: expected one of auto, reference, materialized, flash; got " +
                                      quote_input(name));
}

// ALiBi slopes, as get_slopes in the authors' code
// (github.com/ofirpress/attention_with_linear_biases, models/transformer.py):
//   power of two n: start = 2^(−8/n), slopes start^1 … start^n;
//   else: closest = 2^⌊log2 H⌋, get_slopes(closest) +
//         get_slopes(2·closest)[0::2][:H − closest].
std::vector<double> alibi_slopes(int64_t heads) {
  if (heads < 1)
    throw Error(Error::Kind::Value, "alibi_slopes: expected heads >= 1, got " + std::to_string(heads));
  detail::check_fits_in_memory("heads", "alibi_slopes(" + std::to_string(heads) + ") (two lists of float64)",
                               2.0 * 8.0 * static_cast<double>(heads), "");
  const auto power_of_two = [](int64_t n) {
    std::vector<double> s(static_cast<std::size_t>(n));
    for (int64_t h = 1; h <= n; ++h) s[static_cast<std::size_t>(h - 1)] = std::exp2(-8.0 * h / n);
    return s;
  };
  int64_t closest = 1;
  while (closest * 2 <= heads) closest *= 2;
  std::vector<double> slopes = power_of_two(closest);
  if (closest == heads) return slopes;
  const std::vector<double> finer = power_of_two(2 * closest);
  for (int64_t x = 0; static_cast<int64_t>(slopes.size()) < heads; x += 2)
    slopes.push_back(finer[static_cast<std::size_t>(x)]);
  return slopes;
}

}  // namespace multihead
