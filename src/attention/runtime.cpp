// src/attention/runtime.cpp: the public run-time switches (multihead/runtime.hpp).
#include "multihead/runtime.hpp"

#include <atomic>
#include <cstdio>
#include <string>

#include <omp.h>

#include "attention/mha_plan.hpp"
#include "core/check.hpp"
#include "core/gemm.hpp"
#include "core/linear.hpp"
#include "kernels/kernel_force.hpp"
#include "kernels/narrow_matmul.hpp"
#include "multihead/error.hpp"
#include "simd/flash_attention.hpp"
#include "simd/targets.hpp"

namespace multihead {

void check_fits_in_memory(const std::string& name, const std::string& what, double bytes, const std::string& hint) {
  detail::check_fits_in_memory(name, what, bytes, hint);
}

void check_environment() {
  detail::check_simd_environment();
  detail::check_f16_gemm_environment();
  detail::check_narrow_attention_environment();
  detail::check_kernel_environment();
  detail::check_narrow_gemv_environment();
  detail::check_fused_paths_environment();
  (void)detail::backward_reads_views();
  (void)detail::backward_widens_bf16();
}

void set_threads(int threads) {
  if (threads <= 0) return;
  if (threads > max_threads())
    throw Error(Error::Kind::Value, "threads: expected at most " + std::to_string(max_threads()) +
                                        " (8 per processor), got " + std::to_string(threads));
  omp_set_num_threads(threads);
  detail::set_blas_threads(threads);
}

int threads() { return omp_get_max_threads(); }

int blas_threads() { return detail::blas_threads(); }

std::vector<std::string> simd_targets_available() { return detail::simd_targets_available(); }
std::string simd_target_current() { return detail::simd_target_current(); }
void simd_target_force(const std::string& name) { detail::simd_target_force(name); }

void bf16_dot_force(const std::string& way) { detail::bf16_dot_force(way); }
void f16_gemm_force(const std::string& way) { detail::f16_gemm_force(way); }
std::string f16_gemm_current() { return detail::f16_gemm_current(); }
void narrow_attention_force(const std::string& way) { detail::narrow_attention_force(way); }
std::string narrow_attention_current() { return detail::narrow_attention_current(); }
std::string bf16_dot_current() {
  const int64_t target = detail::simd_target_bit();
  const detail::Bf16DotChoice c = detail::bf16_dot_choice(target);
  const detail::Bf16Dot setting = detail::bf16_dot_setting();
  const std::string instruction = c.native ? "vdpbf16ps" : "Highway's widening: no AVX512_BF16 on this target";
  if (setting == detail::Bf16Dot::Fma || setting == detail::Bf16Dot::Dpbf16)
    return c.dpbf16 ? "dpbf16 (" + instruction + ", forced)" : "fma (forced)";
  const std::string mode = setting == detail::Bf16Dot::Measure ? "measure" : "auto";
  if (!c.native) return "fma (" + mode + ": no AVX512_BF16 on this target)";
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.2f", detail::bf16_dot_rate_ratio(target));
  const std::string measured = std::string("vdpbf16ps measured at ") + ratio + "x the FMA's FLOP rate here";
  if (setting == detail::Bf16Dot::Measure)
    return std::string(c.dpbf16 ? "dpbf16" : "fma") + " (measure: " + measured + ", " +
           (c.dpbf16 ? "at least" : "below") + " 1.2x)";
  return std::string(c.dpbf16 ? "dpbf16 (auto: an AMD core; " : "fma (auto: not an AMD core; ") + measured + ")";
}

void kernel_force(AttentionKernel kernel) { detail::forced_kernel().store(kernel, std::memory_order_relaxed); }
AttentionKernel kernel_forced() { return detail::forced_kernel().load(std::memory_order_relaxed); }

}  // namespace multihead
