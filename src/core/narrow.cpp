// src/core/narrow.cpp: the compute types' names (multihead/narrow.hpp).
#include "multihead/narrow.hpp"

#include "multihead/error.hpp"

namespace multihead {

std::string to_string(ComputeDtype dtype) {
  switch (dtype) {
    case ComputeDtype::F32: return "f32";
    case ComputeDtype::BF16: return "bf16";
    case ComputeDtype::F16: return "f16";
  }
  return "dtype(" + std::to_string(static_cast<int>(dtype)) + ")";
}

ComputeDtype parse_compute_dtype(const std::string& name, const std::string& what) {
  if (name == "f32" || name == "float32") return ComputeDtype::F32;
  if (name == "bf16" || name == "bfloat16") return ComputeDtype::BF16;
  if (name == "f16" || name == "float16") return ComputeDtype::F16;
  throw Error(Error::Kind::Value, what + ": expected f32, bf16 or f16, got '" + name + "'");
}

}  // namespace multihead
