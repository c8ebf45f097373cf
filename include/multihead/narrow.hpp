// multihead/narrow.hpp: the 16-bit floating-point element types, bfloat16 and
// IEEE binary16 (float16), stored as their bits, and their one scalar
// conversion to and from float.
//
// Tensor<bfloat16> and Tensor<float16> hold the inputs, weights and outputs
// of the narrow modules (NarrowMultiheadAttention, the narrow
// scaled_dot_product_attention); every computation widens them to float32
// (exact: every bf16 and f16 value is a float) and rounds results back to
// nearest, ties to even (IEEE 754's default, what PyTorch's .to(bfloat16)
// and .half() do). docs/precision.md states the error this costs.
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <type_traits>

namespace multihead {

struct bfloat16 {
  uint16_t bits = 0;
};
struct float16 {
  uint16_t bits = 0;
};

// The compute types of the modules: float32 and the two narrow ones.
enum class ComputeDtype { F32, BF16, F16 };
// "f32", "bf16", "f16" (the command line's names).
std::string to_string(ComputeDtype dtype);
// "f32"/"float32", "bf16"/"bfloat16", "f16"/"float16"; anything else throws
// multihead::Error naming `what`, the value and the accepted names.
ComputeDtype parse_compute_dtype(const std::string& name, const std::string& what);

// What a 16-bit computation runs on here, for a one-line note (the command
// line prints it once on stderr): for F16, that it widens to float32 and
// why (this CPU has no AVX512_FP16, or no fp16-FMA kernel is built); ""
// for F32 and BF16.
std::string compute_dtype_note(ComputeDtype dtype);
// Whether the CPU has AVX512_FP16 (CPUID leaf 7, EDX bit 23); false off x86.
bool cpu_has_avx512_fp16();

// Unit roundoff u = 2^-(p) of a p+1-bit significand: bf16 8 bits (u = 2^-8),
// f16 11 bits (u = 2^-11), float32 24 bits (u = 2^-24).
constexpr double unit_roundoff(ComputeDtype dtype) {
  return dtype == ComputeDtype::BF16 ? 1.0 / 256.0 : dtype == ComputeDtype::F16 ? 1.0 / 2048.0 : 1.0 / 16777216.0;
}

// bfloat16 is the top half of a binary32: widening is a shift.
inline float to_float(bfloat16 b) { return std::bit_cast<float>(static_cast<uint32_t>(b.bits) << 16); }

// Round to nearest, ties to even; NaN stays NaN (quiet, sign kept), values
// beyond the largest finite bf16 round to ±inf.
inline bfloat16 to_bfloat16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<uint16_t>(u >> 16)};
}

// binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. Exact; keeps the
// sign of zero, infinities and NaN payloads.
inline float to_float(float16 h16) {
  const uint16_t h = h16.bits;
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf, or NaN with its payload
  } else if (exponent != 0) {
    bits = sign | ((exponent - 15 + 127) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // ±0
  } else {
    // Subnormal: value = mantissa · 2^-24. Shift the leading one up to the
    // implicit-bit position (bit 10); each shift lowers the exponent by one
    // from the smallest normal exponent, -14.
    int32_t e = -14;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e + 127) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// Round to nearest, ties to even (F. Giesen's float_to_half_fast3_rtne):
// |f| >= 65520 gives ±inf, subnormal results are rounded by one float
// addition (which rounds to nearest even), NaN gives a quiet NaN.
inline float16 to_float16(float f) {
  constexpr uint32_t kInf32 = 255u << 23;
  constexpr uint32_t kOverflow = (127u + 16u) << 23;  // 2^16: beyond every finite f16
  constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint16_t out;
  if (u >= kOverflow) {
    out = u > kInf32 ? 0x7e00u : 0x7c00u;
  } else if (u < (113u << 23)) {  // below 2^-14: a subnormal f16 or zero
    const float t = std::bit_cast<float>(u) + std::bit_cast<float>(kDenormMagic);
    out = static_cast<uint16_t>(std::bit_cast<uint32_t>(t) - kDenormMagic);
  } else {
    const uint32_t odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;  // re-bias, add half an ulp minus one
    u += odd;                                              // ties to even
    out = static_cast<uint16_t>(u >> 13);
  }
  return {static_cast<uint16_t>(out | (sign >> 16))};
}

// The conversion by type, for templates over the element type E.
template <class E>
E narrow_from_float(float f);
template <>
inline bfloat16 narrow_from_float<bfloat16>(float f) { return to_bfloat16(f); }
template <>
inline float16 narrow_from_float<float16>(float f) { return to_float16(f); }

template <class E>
constexpr ComputeDtype compute_dtype_of() {
  if constexpr (std::is_same_v<E, bfloat16>) return ComputeDtype::BF16;
  else if constexpr (std::is_same_v<E, float16>) return ComputeDtype::F16;
  else return ComputeDtype::F32;
}

}  // namespace multihead
