// src/io/decode.hpp: on-disk element bytes to double, shared by the .npy and
// safetensors readers. Every decoded dtype (bool and the floating-point
// types) converts exactly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "multihead/io.hpp"

namespace multihead::detail {

// Bytes per element of `dtype` on disk.
std::size_t itemsize(DType dtype);

// Converts `count` elements starting at `src` (packed, itemsize(dtype) bytes
// each, in the given byte order). Bool: any nonzero byte becomes 1.0, as
// NumPy's bool(x) and PyTorch's .bool() read a byte. Integer dtypes
// (is_integer) are not decoded: they throw Error(Value), as a reader's bug.
void decode_to_double(const uint8_t* src, std::size_t count, DType dtype, bool big_endian, double* dst);

}  // namespace multihead::detail
