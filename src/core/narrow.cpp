// src/core/narrow.cpp: the compute types' names (multihead/narrow.hpp).
#include "multihead/narrow.hpp"

#include "core/gemm.hpp"
#include "multihead/error.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

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

bool cpu_has_avx512_fp16() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  return (d >> 23) & 1u;
#else
  return false;
#endif
}

std::string compute_dtype_note(ComputeDtype dtype) {
  if (dtype != ComputeDtype::F16) return "";
  std::string path = "f16 runs on the widening path (f16 values widened to float32, float32 FMA and sums, results "
                     "rounded to f16)";
  if (detail::native_16bit_gemm<float16>())
    path += ", except its projections: three exact bf16 products on oneDNN's bf16 matmul, " +
            detail::f16_gemm_current();
  if (!cpu_has_avx512_fp16()) return "this CPU has no AVX512_FP16, so " + path;
  return "no fp16-FMA kernel is built (this CPU has AVX512_FP16), so " + path;
}

}  // namespace multihead
