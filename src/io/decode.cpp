// src/io/decode.cpp: see decode.hpp. The dtype switch sits outside the
// element loops so each loop is a plain load-convert-store.
#include "io/decode.hpp"

#include <bit>

#include "io/bytes.hpp"
#include "io/half.hpp"
#include "multihead/error.hpp"

namespace multihead::detail {

std::size_t itemsize(DType dtype) {
  switch (dtype) {
    case DType::Bool:
    case DType::U8:
    case DType::I8: return 1;
    case DType::F16:
    case DType::BF16:
    case DType::U16:
    case DType::I16: return 2;
    case DType::F32:
    case DType::U32:
    case DType::I32: return 4;
    case DType::F64:
    case DType::U64:
    case DType::I64: return 8;
  }
  return 0;
}

namespace {

template <class U, class Convert>
void decode_loop(const uint8_t* src, std::size_t count, bool big_endian, double* dst, Convert convert) {
  if (big_endian) {
    for (std::size_t i = 0; i < count; ++i) dst[i] = convert(load_be<U>(src + i * sizeof(U)));
  } else {
    for (std::size_t i = 0; i < count; ++i) dst[i] = convert(load_le<U>(src + i * sizeof(U)));
  }
}

}  // namespace

void decode_to_double(const uint8_t* src, std::size_t count, DType dtype, bool big_endian, double* dst) {
  switch (dtype) {
    case DType::Bool:
      for (std::size_t i = 0; i < count; ++i) dst[i] = src[i] != 0 ? 1.0 : 0.0;
      return;
    case DType::F16:
      decode_loop<uint16_t>(src, count, big_endian, dst, [](uint16_t b) { return double{half_to_float(b)}; });
      return;
    case DType::BF16:
      decode_loop<uint16_t>(src, count, big_endian, dst,
                            [](uint16_t b) { return double{bfloat16_to_float(b)}; });
      return;
    case DType::F32:
      decode_loop<uint32_t>(src, count, big_endian, dst,
                            [](uint32_t b) { return double{std::bit_cast<float>(b)}; });
      return;
    case DType::F64:
      decode_loop<uint64_t>(src, count, big_endian, dst, [](uint64_t b) { return std::bit_cast<double>(b); });
      return;
    case DType::U8:
    case DType::I8:
    case DType::U16:
    case DType::I16:
    case DType::U32:
    case DType::I32:
    case DType::U64:
    case DType::I64:
      // The readers never decode integer tensors (decode.hpp); reaching
      // here is a bug in a reader, reported rather than filling garbage.
      throw Error(Error::Kind::Value, "decode_to_double: " + to_string(dtype) + " tensors are not decoded");
  }
}

}  // namespace multihead::detail
