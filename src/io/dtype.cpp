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
  }
  return "dtype(" + std::to_string(static_cast<int>(dtype)) + ")";
}

}  // namespace multihead
