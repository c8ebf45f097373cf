// src/simd/flash_attention.cpp: compiles flash_attention-inl.h once per
// Highway target and looks a target's kernel up by its Highway bit, so
// src/attention/flash.cpp can dispatch once per call to the target chosen in
// src/simd/targets.cpp (best supported, or forced).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "multihead/error.hpp"
#include "multihead/tensor.hpp"
#include "simd/flash_attention.hpp"

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
int64_t FlashAttentionRowTile() { return FlashAttentionRowTileF32(); }
int64_t FlashAttentionTarget() { return HWY_TARGET; }
void FlashExp2(const float* in, float* out, size_t count) { Exp2NonPositiveArrayF32(in, out, count); }
float SoftmaxExpRow(float* row, size_t count, float row_max) { return ExpRowF32(row, count, row_max); }

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace multihead::detail {

HWY_EXPORT(FlashAttentionRows);
HWY_EXPORT(FlashAttentionRowTile);
HWY_EXPORT(FlashAttentionTarget);
HWY_EXPORT(FlashExp2);
HWY_EXPORT(SoftmaxExpRow);

namespace {

// Index of `target_bit` in the HWY_EXPORT tables. Rather than rely on how
// Highway orders its tables, ask each entry which target it was compiled
// for. With several targets, entry 0 is Highway's own "choose and call"
// trampoline (it dispatches on Highway's global choice, not ours): skip it.
size_t table_index(int64_t target_bit) {
  constexpr size_t kEntries =
      sizeof(HWY_DISPATCH_TABLE(FlashAttentionTarget)) / sizeof(HWY_DISPATCH_TABLE(FlashAttentionTarget)[0]);
  for (size_t i = kEntries > 1 ? 1 : 0; i < kEntries; ++i) {
    const auto target_of = HWY_DISPATCH_TABLE(FlashAttentionTarget)[i];
    if (target_of != nullptr && target_of() == target_bit) return i;
  }
  throw Error(Error::Kind::Value, std::string("flash attention: no kernel compiled for SIMD target ") +
                                      hwy::TargetName(target_bit));
}

}  // namespace

FlashScratch::~FlashScratch() { free_storage(data_); }

float* FlashScratch::floats(std::size_t count) {
  if (count > capacity_) {
    // Grow geometrically so that a sequence of growing shapes reallocates
    // O(log) times; never shrink.
    const std::size_t grown = std::max(count, capacity_ + capacity_ / 2);
    float* fresh = static_cast<float*>(allocate_storage(grown * sizeof(float)));
    free_storage(data_);
    data_ = fresh;
    capacity_ = grown;
  }
  return data_;
}

FlashAttentionKernel flash_attention_kernel_for(int64_t target_bit) {
  const size_t i = table_index(target_bit);
  FlashAttentionKernel kernel;
  kernel.rows = HWY_DISPATCH_TABLE(FlashAttentionRows)[i];
  kernel.row_tile = HWY_DISPATCH_TABLE(FlashAttentionRowTile)[i]();
  kernel.exp_row = HWY_DISPATCH_TABLE(SoftmaxExpRow)[i];
  kernel.target = target_bit;
  kernel.target_name = hwy::TargetName(target_bit);
  return kernel;
}

void flash_exp2_for_test(int64_t target_bit, const float* in, float* out, std::size_t count) {
  HWY_DISPATCH_TABLE(FlashExp2)[table_index(target_bit)](in, out, count);
}

}  // namespace multihead::detail
#endif  // HWY_ONCE
