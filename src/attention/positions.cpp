// src/attention/positions.cpp: positional encodings (multihead/positions.hpp).
#include "multihead/positions.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention/rope.hpp"
#include "core/check.hpp"
#include "multihead/error.hpp"

namespace multihead {

template <class T>
Tensor<T> sinusoidal_positions(int64_t length, int64_t width, int64_t offset) {
  const auto fail = [](const std::string& what) { throw Error(Error::Kind::Value, "sinusoidal_positions: " + what); };
  if (length < 0) fail("length must be >= 0, got " + std::to_string(length));
  if (width < 1) fail("width must be >= 1, got " + std::to_string(width));
  if (offset < 0) fail("offset must be >= 0, got " + std::to_string(offset));
  detail::check_fits_in_memory("length", "sinusoidal_positions (length " + std::to_string(length) + " x width " +
                                             std::to_string(width) + ")",
                               static_cast<double>(length) * static_cast<double>(width) * sizeof(T), "");
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

namespace multihead {

std::string to_string(RopeConvention convention) {
  return convention == RopeConvention::Interleaved ? "interleaved" : "half-split";
}

RopeConvention parse_rope_convention(const std::string& name, const std::string& what) {
  if (name == "interleaved") return RopeConvention::Interleaved;
  if (name == "half-split") return RopeConvention::HalfSplit;
  throw Error(Error::Kind::Value, what + ": expected interleaved or half-split, got " + quote_input(name));
}

void validate_rope(const RopeOptions& o, int64_t head_dim, const std::string& what, const std::string& width) {
  const std::string field = what.empty() ? "" : what + ".";
  if (head_dim < 2 || head_dim % 2 != 0)
    throw Error(Error::Kind::Value, width + ": expected an even head width >= 2 (rotary embedding rotates pairs), got " +
                                        std::to_string(head_dim));
  if (!(o.theta > 0.0 && std::isfinite(o.theta)))
    throw Error(Error::Kind::Value, field + "theta: expected a finite number > 0, got " + detail::format_number(o.theta));
  if (o.position_offset < 0 || o.position_offset > (int64_t{1} << 40))
    throw Error(Error::Kind::Value, field + "position_offset: expected 0 to 2^40, got " +
                                        std::to_string(o.position_offset));
}

namespace detail {

namespace {

// The rotation by +angle (forward) or −angle (backward, sign = −1): one
// angle computation for both, so Rᵀ is exactly the forward's R transposed.
template <class T>
void rotate_in_place(T* x, int64_t outer, int64_t L, int64_t inner, int64_t D, const RopeOptions& o,
                     const char* what, double sign) {
  validate_rope(o, D, what, sign > 0 ? "x's last dimension" : "d_y's last dimension");
  const int64_t half = D / 2;
  // θ_i = θ^(−2i/D), as RoFormer eq. (15); one cos/sin row per position.
  std::vector<double> inv_freq(static_cast<std::size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = std::pow(o.theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
  std::vector<T> cos_row(static_cast<std::size_t>(half)), sin_row(static_cast<std::size_t>(half));
  // Pair i is (i·stride_a, i·stride_a + second): interleaved (2i, 2i + 1),
  // half-split (i, i + D/2).
  const bool interleaved = o.convention == RopeConvention::Interleaved;
  const int64_t first_step = interleaved ? 2 : 1, second = interleaved ? 1 : half;
  for (int64_t l = 0; l < L; ++l) {
    const double p = static_cast<double>(o.position_offset + l);
    for (int64_t i = 0; i < half; ++i) {
      cos_row[i] = static_cast<T>(std::cos(p * inv_freq[i]));
      sin_row[i] = static_cast<T>(sign * std::sin(p * inv_freq[i]));
    }
    for (int64_t b = 0; b < outer; ++b)
      for (int64_t h = 0; h < inner; ++h) {
        T* v = x + ((b * L + l) * inner + h) * D;
        for (int64_t i = 0; i < half; ++i) {
          T& a = v[i * first_step];
          T& c = v[i * first_step + second];
          const T a0 = a, c0 = c;
          // (a + i·c)·(cos + i·sin)
          a = a0 * cos_row[i] - c0 * sin_row[i];
          c = a0 * sin_row[i] + c0 * cos_row[i];
        }
      }
  }
}

}  // namespace

template <class T>
void rope_in_place(T* x, int64_t outer, int64_t L, int64_t inner, int64_t D, const RopeOptions& o, const char* what) {
  rotate_in_place(x, outer, L, inner, D, o, what, 1.0);
}

// Forward (rope_in_place): y = R(φ) x per pair, R orthogonal, so
// dℓ/dx = R(φ)ᵀ dℓ/dy = R(−φ) dℓ/dy: the same rotation with sin negated,
//   d_a =  cos·d_y_a + sin·d_y_c,   d_c = −sin·d_y_a + cos·d_y_c.
template <class T>
void rope_backward_in_place(T* d, int64_t outer, int64_t L, int64_t inner, int64_t D, const RopeOptions& o,
                            const char* what) {
  rotate_in_place(d, outer, L, inner, D, o, what, -1.0);
}

template void rope_in_place<float>(float*, int64_t, int64_t, int64_t, int64_t, const RopeOptions&, const char*);
template void rope_in_place<double>(double*, int64_t, int64_t, int64_t, int64_t, const RopeOptions&, const char*);
template void rope_backward_in_place<float>(float*, int64_t, int64_t, int64_t, int64_t, const RopeOptions&,
                                            const char*);
template void rope_backward_in_place<double>(double*, int64_t, int64_t, int64_t, int64_t, const RopeOptions&,
                                             const char*);

}  // namespace detail

template <class T>
Tensor<T> rotary_embedding(const Tensor<T>& x, const RopeOptions& options) {
  if (x.dim() < 2)
    throw Error(Error::Kind::Value, "rotary_embedding: x must be (..., L, D), got shape " + shape_to_string(x.shape()));
  const int64_t L = x.size(-2), D = x.size(-1);
  Tensor<T> y(x.shape());
  std::copy_n(x.data(), x.numel(), y.data());
  const int64_t outer = L * D == 0 ? 0 : x.numel() / (L * D);
  detail::rope_in_place(y.data(), outer, L, int64_t{1}, D, options, "options");
  return y;
}

template Tensor<float> rotary_embedding<float>(const Tensor<float>&, const RopeOptions&);
template Tensor<double> rotary_embedding<double>(const Tensor<double>&, const RopeOptions&);

}  // namespace multihead

namespace multihead {

template <class T>
Tensor<T> rotary_embedding_backward(const Tensor<T>& d_y, const RopeOptions& options) {
  if (d_y.dim() < 2)
    throw Error(Error::Kind::Value,
                "rotary_embedding_backward: d_y must be (..., L, D), got shape " + shape_to_string(d_y.shape()));
  const int64_t L = d_y.size(-2), D = d_y.size(-1);
  Tensor<T> d_x(d_y.shape());
  std::copy_n(d_y.data(), d_y.numel(), d_x.data());
  const int64_t outer = L * D == 0 ? 0 : d_y.numel() / (L * D);
  detail::rope_backward_in_place(d_x.data(), outer, L, int64_t{1}, D, options, "options");
  return d_x;
}

template Tensor<float> rotary_embedding_backward<float>(const Tensor<float>&, const RopeOptions&);
template Tensor<double> rotary_embedding_backward<double>(const Tensor<double>&, const RopeOptions&);

}  // namespace multihead
