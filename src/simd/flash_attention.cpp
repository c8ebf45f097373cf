// src/simd/flash_attention.cpp: compiles flash_attention-inl.h once per
// Highway target and looks a target's kernel up by its Highway bit, so
// src/kernels/flash.cpp can dispatch once per call to the target chosen in
// src/simd/targets.cpp (best supported, or forced).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "multihead/error.hpp"
#include "multihead/tensor.hpp"
#include "simd/flash_attention.hpp"
#include "simd/targets.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/flash_attention.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "simd/flash_attention-inl.h"

HWY_BEFORE_NAMESPACE();
namespace multihead::detail {
namespace HWY_NAMESPACE {

void FlashAttentionRows(const AttentionArgs<float>& args, int64_t slice, int64_t row_begin,
                        int64_t row_end, FlashScratch& scratch) {
  FlashAttentionRowsF32(args, slice, row_begin, row_end, scratch);
}
void FlashAttentionRowsBF16(const AttentionArgs<float>& args, int64_t slice, int64_t row_begin,
                            int64_t row_end, FlashScratch& scratch) {
  FlashAttentionRowsNarrow<bfloat16>(args, slice, row_begin, row_end, scratch);
}
// The bf16 pair way (flash_attention-inl.h, Bf16Way::Dot): with Highway's
// widening on every target, and with vdpbf16ps on the AVX-512 ones (the
// same code as the widening elsewhere; never chosen there).
void FlashAttentionRowsBF16Dot(const AttentionArgs<float>& args, int64_t slice, int64_t row_begin,
                               int64_t row_end, FlashScratch& scratch) {
  FlashAttentionRowsNarrow<bfloat16, Bf16Way::Dot>(args, slice, row_begin, row_end, scratch);
}
void FlashAttentionRowsBF16DotNative(const AttentionArgs<float>& args, int64_t slice, int64_t row_begin,
                                     int64_t row_end, FlashScratch& scratch) {
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)  // kHasDpbf16
  FlashAttentionRowsNarrow<bfloat16, Bf16Way::DotNative>(args, slice, row_begin, row_end, scratch);
#else
  FlashAttentionRowsBF16Dot(args, slice, row_begin, row_end, scratch);
#endif
}
double FlashAttentionBf16DotRateRatio() { return Bf16DotRateRatio(); }
void FlashAttentionRowsF16(const AttentionArgs<float>& args, int64_t slice, int64_t row_begin,
                           int64_t row_end, FlashScratch& scratch) {
  FlashAttentionRowsNarrow<float16>(args, slice, row_begin, row_end, scratch);
}
int64_t FlashAttentionRowTile() { return FlashAttentionRowTileF32(); }
int64_t FlashAttentionKeyTile() { return static_cast<int64_t>(KeyTile(kMaxQueryVectors)); }
int64_t FlashAttentionVectorRows() { return static_cast<int64_t>(hn::Lanes(DF32())); }
int64_t FlashAttentionSameBitsRows() {
  size_t nvq = 1;
  while (nvq < kMaxQueryVectors && KeyTile(nvq + 1) == KeyTile(1)) ++nvq;
  return static_cast<int64_t>(nvq * hn::Lanes(DF32()));
}
int64_t FlashAttentionTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace multihead::detail {

HWY_EXPORT(FlashAttentionRows);
HWY_EXPORT(FlashAttentionRowsBF16);
HWY_EXPORT(FlashAttentionRowsF16);
HWY_EXPORT(FlashAttentionRowsBF16Dot);
HWY_EXPORT(FlashAttentionRowsBF16DotNative);
HWY_EXPORT(FlashAttentionBf16DotRateRatio);
HWY_EXPORT(FlashAttentionRowTile);
HWY_EXPORT(FlashAttentionKeyTile);
HWY_EXPORT(FlashAttentionVectorRows);
HWY_EXPORT(FlashAttentionSameBitsRows);
HWY_EXPORT(FlashAttentionTarget);

FlashScratch::~FlashScratch() { free_storage(data_, capacity_ * sizeof(float)); }

float* FlashScratch::floats(std::size_t count) {
  if (count > capacity_) {
    // Grow geometrically so that a sequence of growing shapes reallocates
    // O(log) times; never shrink.
    const std::size_t grown = std::max(count, capacity_ + capacity_ / 2);
    float* fresh = static_cast<float*>(allocate_storage(grown * sizeof(float)));
    free_storage(data_, capacity_ * sizeof(float));
    data_ = fresh;
    capacity_ = grown;
  }
  return data_;
}

namespace {

// vdpbf16ps over float32 FMA, measured once per target (0: no vdpbf16ps).
double bf16_dot_rate_ratio_at(std::size_t i, int64_t target_bit) {
  static std::mutex mutex;
  static std::map<int64_t, double> measured;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = measured.find(target_bit);
  if (it != measured.end()) return it->second;
  return measured[target_bit] = HWY_DISPATCH_TABLE(FlashAttentionBf16DotRateRatio)[i]();
}

// Whether this target issues vdpbf16ps (an AVX-512 target on a CPU with
// AVX512_BF16); the measured ratio is > 0 exactly then.
bool native_dpbf16(int64_t target_bit) {
  return (target_bit == HWY_AVX3 || target_bit == HWY_AVX3_DL) && cpu_has_avx512_bf16();
}

}  // namespace

Bf16DotChoice bf16_dot_choice(int64_t target_bit) {
  // Throws for a target that was not compiled in, as the kernel lookup does.
  (void)dispatch_table_index(HWY_DISPATCH_TABLE(FlashAttentionTarget), target_bit, "flash attention");
  Bf16DotChoice c;
  c.native = native_dpbf16(target_bit);
  const Bf16Dot setting = bf16_dot_setting();
  switch (setting) {
    case Bf16Dot::Auto: c.dpbf16 = bf16_dot_prefers_dpbf16(c.native, cpu_is_amd()); break;
    case Bf16Dot::Measure: c.dpbf16 = c.native && bf16_dot_rate_ratio(target_bit) >= kBf16DotMinRatio; break;
    case Bf16Dot::Fma: c.dpbf16 = false; break;
    case Bf16Dot::Dpbf16: c.dpbf16 = true; break;
  }
  return c;
}

double bf16_dot_rate_ratio(int64_t target_bit) {
  const size_t i = dispatch_table_index(HWY_DISPATCH_TABLE(FlashAttentionTarget), target_bit, "flash attention");
  return native_dpbf16(target_bit) ? bf16_dot_rate_ratio_at(i, target_bit) : 0.0;
}

FlashAttentionKernel flash_attention_kernel_for(int64_t target_bit) {
  const size_t i = dispatch_table_index(HWY_DISPATCH_TABLE(FlashAttentionTarget), target_bit, "flash attention");
  FlashAttentionKernel kernel;
  kernel.rows = HWY_DISPATCH_TABLE(FlashAttentionRows)[i];
  const Bf16DotChoice bf16 = bf16_dot_choice(target_bit);
  kernel.rows_bf16 = !bf16.dpbf16 ? HWY_DISPATCH_TABLE(FlashAttentionRowsBF16)[i]
                     : bf16.native ? HWY_DISPATCH_TABLE(FlashAttentionRowsBF16DotNative)[i]
                                   : HWY_DISPATCH_TABLE(FlashAttentionRowsBF16Dot)[i];
  kernel.rows_f16 = HWY_DISPATCH_TABLE(FlashAttentionRowsF16)[i];
  kernel.row_tile = HWY_DISPATCH_TABLE(FlashAttentionRowTile)[i]();
  kernel.key_tile = HWY_DISPATCH_TABLE(FlashAttentionKeyTile)[i]();
  kernel.vector_rows = HWY_DISPATCH_TABLE(FlashAttentionVectorRows)[i]();
  kernel.same_bits_rows = HWY_DISPATCH_TABLE(FlashAttentionSameBitsRows)[i]();
  return kernel;
}

}  // namespace multihead::detail
#endif  // HWY_ONCE
