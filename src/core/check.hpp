// src/core/check.hpp: the API boundary's validation helpers. Each throws a
// multihead::Error whose one-line message names the tensor and gives the
// expected and the actual value, in the same words everywhere.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "multihead/error.hpp"
#include "multihead/tensor.hpp"

namespace multihead::detail {

// A number as a person writes it: 0.5, 1e-09, 2 (std::to_string gives 2.000000).
// The shortest "%.Ng" that reads back the same; N = 17 always does
// (to_exact_string, multihead/io.hpp, is that form).
inline std::string format_number(double x) {
  char buf[64];
  for (int precision = 1;; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, x);
    if (precision == 17 || std::strtod(buf, nullptr) == x) return buf;
  }
}

// This machine's physical memory in bytes, or 0 when sysconf cannot tell.
inline double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

// Refuses, before allocating, a buffer larger than the machine's memory,
// which could never be held: the alternative is a std::bad_alloc (or the OOM
// killer) after the allocator has committed what it could. The one message:
//   "NAME: WHAT would need 122.1 GiB (131072000000 bytes), more than this
//    machine's 15.6 GiB of memory (HINT)"
inline void check_fits_in_memory(const std::string& name, const std::string& what, double bytes,
                                 const std::string& hint) {
  const double memory = physical_memory_bytes();
  if (!(memory > 0 && bytes > memory)) return;
  // Sizes past an EiB in 4 digits (1.49e+14 GiB), not 24-digit counts.
  const double gib = bytes / 1073741824.0;
  char msg[160];
  std::snprintf(msg, sizeof msg, gib < 1e6 ? " would need %.1f GiB" : " would need %.4g GiB", gib);
  std::snprintf(msg + std::strlen(msg), sizeof msg - std::strlen(msg),
                bytes < 1e18 ? " (%.0f bytes), more than this machine's %.1f GiB of memory"
                             : " (%.4g bytes), more than this machine's %.1f GiB of memory",
                bytes, memory / 1073741824.0);
  throw Error(Error::Kind::Value, name + ": " + what + msg + (hint.empty() ? "" : " (" + hint + ")"));
}

// A shape's element count as a double (no overflow, for memory estimates).
inline double elements_of(const Shape& shape) {
  double n = 1;
  for (const int64_t d : shape) n *= static_cast<double>(d);
  return n;
}

// The parameters a module's configuration asks for must fit in memory
// before any is allocated (MultiheadAttention(2**31, 1) asked for 192 EiB
// and failed with std::length_error naming nothing). for_each_parameter is
// the module's table (found by argument-dependent lookup); `name` is the
// configuration field to name, `sizes` the configuration in words.
template <class Config>
void check_parameters_fit(const Config& config, std::size_t element_size, const std::string& name,
                          const std::string& sizes) {
  double elements = 0;
  for_each_parameter(config, [&](const auto& info) {
    if (info.present) elements += elements_of(info.shape);
  });
  check_fits_in_memory(name, "the module's parameters (" + sizes + ")", elements * static_cast<double>(element_size),
                       "");
}

[[noreturn]] inline void fail_shape(const std::string& name, const std::string& expected,
                                    const Shape& actual) {
  throw Error(Error::Kind::Shape,
              name + ": expected shape " + expected + ", got " + shape_to_string(actual));
}

inline void expect_shape(const std::string& name, const Shape& actual, const Shape& expected) {
  if (actual != expected) fail_shape(name, shape_to_string(expected), actual);
}

// "(2, 3, 4)" -> multi-index of flat element `flat` for error messages.
inline std::string index_to_string(const Shape& shape, int64_t flat) {
  std::string out;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    const int64_t extent = shape[static_cast<std::size_t>(d)];
    const int64_t i = extent > 0 ? flat % extent : 0;
    flat = extent > 0 ? flat / extent : 0;
    out = std::to_string(i) + (out.empty() ? "" : ", ") + out;
  }
  return "(" + out + ")";
}

// Throws naming the first NaN or ±Inf element (used when check_finite is on).
// `dim` and `positions`: the tensor holds only some positions of a longer
// sequence along dimension `dim` (a rank's rows in sequence parallel),
// positions[r] the caller's position of row r, so the index is the caller's.
template <class T>
void check_finite(const std::string& name, const Tensor<T>& t, int64_t dim = -1,
                  const std::vector<int64_t>& positions = {}) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    const auto x = [&] {
      if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>) {
        return to_float(t[i]);  // 16-bit storage: its exact float value
      } else {
        return t[i];
      }
    }();
    if (std::isfinite(x)) continue;
    std::vector<int64_t> index(t.shape().size());
    for (int64_t d = static_cast<int64_t>(index.size()) - 1, flat = i; d >= 0; --d) {
      const int64_t extent = t.shape()[static_cast<std::size_t>(d)];
      index[static_cast<std::size_t>(d)] = flat % extent;
      flat /= extent;
    }
    if (dim >= 0) {
      int64_t& r = index[static_cast<std::size_t>(dim)];
      r = positions[static_cast<std::size_t>(r)];
    }
    std::string at;
    for (int64_t v : index) at += (at.empty() ? "" : ", ") + std::to_string(v);
    throw Error(Error::Kind::Value, name + ": non-finite value " +
                                        (std::isnan(x) ? std::string("nan") : std::string(x > 0 ? "inf" : "-inf")) +
                                        " at index (" + at + ") (check_finite rejects NaN and Inf)");
  }
}

// An additive (float) mask under check_finite: -inf masks a position and
// is accepted; NaN and +inf would make the row NaN, and are refused naming
// the first.
template <class T>
void check_mask_finite(const std::string& name, const Tensor<T>& additive) {
  for (int64_t i = 0; i < additive.numel(); ++i) {
    const T x = additive[i];
    if (std::isnan(x) || x == std::numeric_limits<T>::infinity())
      throw Error(Error::Kind::Value, name + ": " + (std::isnan(x) ? "nan" : "inf") + " at index " +
                                          index_to_string(additive.shape(), i) +
                                          " (check_finite accepts -inf in a float mask, which masks the position, "
                                          "but not NaN or +inf)");
  }
}

// Both float masks of a call under check_finite (Mask<T>: boolean ones hold
// no value to check).
template <class MaskT>
void check_masks_finite(const MaskT* key_padding_mask, const MaskT* attn_mask) {
  if (key_padding_mask != nullptr && !key_padding_mask->is_bool())
    check_mask_finite("key_padding_mask", key_padding_mask->float_values());
  if (attn_mask != nullptr && !attn_mask->is_bool()) check_mask_finite("attn_mask", attn_mask->float_values());
}

}  // namespace multihead::detail
