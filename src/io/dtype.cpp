// src/io/dtype.cpp: names of the on-disk element types, as NumPy spells them.
#include "multihead/io.hpp"

namespace multihead {

std::string to_string(DType dtype) {
  switch (dtype) {
    case DType::Bool: return "bool";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::U8: return "uint8";
    case DType::I8: return "int8";
    case DType::U16: return "uint16";
    case DType::I16: return "int16";
    case DType::U32: return "uint32";
    case DType::I32: return "int32";
    case DType::U64: return "uint64";
    case DType::I64: return "int64";
  }
  return "dtype(" + std::to_string(static_cast<int>(dtype)) + ")";
}

bool is_integer(DType dtype) {
  switch (dtype) {
    case DType::U8:
    case DType::I8:
    case DType::U16:
    case DType::I16:
    case DType::U32:
    case DType::I32:
    case DType::U64:
    case DType::I64: return true;
    case DType::Bool:
    case DType::F16:
    case DType::BF16:
    case DType::F32:
    case DType::F64: return false;
  }
  return false;
}

}  // namespace multihead
