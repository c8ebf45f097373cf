// src/io/half.hpp: IEEE 754 binary16 and bfloat16 bit patterns to float.
// Both conversions are exact (every binary16 and bfloat16 value is a float),
// keep the sign of zero, map infinities to infinities and keep NaN payloads.
#pragma once

#include <cstdint>

#include "multihead/narrow.hpp"

namespace multihead::detail {

// The one conversion of each lives in multihead/narrow.hpp.
inline float half_to_float(uint16_t h) { return to_float(float16{h}); }
inline float bfloat16_to_float(uint16_t b) { return to_float(bfloat16{b}); }

}  // namespace multihead::detail
