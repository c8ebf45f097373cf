// tests/distributed/mpi_inputs.hpp: the inputs of the distributed cases, the
// same on every rank (a seeded generator), and the tolerances: float32
// within 1e-5, float64 within 1e-12 of the one-process result (relative to
// the largest magnitude of the reference; both forms round differently only
// in the order of a few sums over heads or key blocks, a few ulps each).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>

#include "multihead/attention.hpp"
#include "multihead/tensor.hpp"

namespace multihead::mpi_test {

template <class T>
constexpr double tolerance() {
  return sizeof(T) == 4 ? 1e-5 : 1e-12;
}
template <class T>
const char* type_name() {
  return sizeof(T) == 4 ? "f32" : "f64";
}

template <class T>
Tensor<T> random_tensor(Shape shape, uint64_t seed, double scale = 1.0) {
  Tensor<T> t(std::move(shape));
  std::mt19937_64 g(seed);
  std::normal_distribution<double> n(0.0, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<T>(n(g));
  return t;
}

// Mask kinds of the tables: none, boolean or additive (float), 2-D (L, S)
// or per slice (slices, L, S).
enum class MaskKind { None, Bool2D, Float2D, Bool3D, Float3D };
inline const char* mask_name(MaskKind k) {
  switch (k) {
    case MaskKind::None: return "none";
    case MaskKind::Bool2D: return "bool2d";
    case MaskKind::Float2D: return "float2d";
    case MaskKind::Bool3D: return "bool3d";
    case MaskKind::Float3D: return "float3d";
  }
  return "?";
}

// A mask that hides about a quarter of the keys (never a whole row: the
// diagonal-ish key i % S stays visible) or adds N(0, 1).
template <class T>
std::optional<Mask<T>> make_mask(MaskKind kind, int64_t slices, int64_t L, int64_t S, uint64_t seed) {
  if (kind == MaskKind::None) return std::nullopt;
  const bool three = kind == MaskKind::Bool3D || kind == MaskKind::Float3D;
  const Shape shape = three ? Shape{slices, L, S} : Shape{L, S};
  std::mt19937_64 g(seed);
  if (kind == MaskKind::Bool2D || kind == MaskKind::Bool3D) {
    Tensor<uint8_t> m(shape, 0);
    for (int64_t x = 0; x < m.numel(); ++x) {
      const int64_t i = (x / S) % L, j = x % S;
      m.data()[x] = j != i % S && g() % 4 == 0;
    }
    return Mask<T>::boolean(std::move(m));
  }
  return Mask<T>::additive(random_tensor<T>(shape, seed));
}

// Key padding (B, S) (or (S)): boolean hides the last keys of some batch
// entries (never key 0), additive adds N(0, 1).
template <class T>
std::optional<Mask<T>> make_key_padding(int kind, int64_t B, int64_t S, bool batched, uint64_t seed) {
  if (kind == 0) return std::nullopt;
  const Shape shape = batched ? Shape{B, S} : Shape{S};
  if (kind == 1) {
    Tensor<uint8_t> m(shape, 0);
    for (int64_t b = 0; b < (batched ? B : 1); ++b)
      for (int64_t j = 1; j < S; ++j) m.data()[b * S + j] = j >= S - 1 - b;
    return Mask<T>::boolean(std::move(m));
  }
  return Mask<T>::additive(random_tensor<T>(shape, seed));
}

}  // namespace multihead::mpi_test
