// src/simd/flash_attention.cpp: compiles flash_attention-inl.h once per
// Highway target and looks a target's kernel up by its Highway bit, so
// src/kernels/flash.cpp can dispatch once per call to the target chosen in
// src/simd/targets.cpp (best supported, or forced).
#include <algorithm>
#include <cstddef>
#include <cstdint>
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
void FlashAttentionRowsF16(const AttentionArgs<float>& args, int64_t slice, int64_t row_begin,
                           int64_t row_end, FlashScratch& scratch) {
  FlashAttentionRowsNarrow<float16>(args, slice, row_begin, row_end, scratch);
}
int64_t FlashAttentionRowTile() { return FlashAttentionRowTileF32(); }
int64_t FlashAttentionKeyTile() { return static_cast<int64_t>(KeyTile(kMaxQueryVectors)); }
int64_t FlashAttentionTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace multihead::detail {

HWY_EXPORT(FlashAttentionRows);
HWY_EXPORT(FlashAttentionRowsBF16);
HWY_EXPORT(FlashAttentionRowsF16);
HWY_EXPORT(FlashAttentionRowTile);
HWY_EXPORT(FlashAttentionKeyTile);
HWY_EXPORT(FlashAttentionTarget);

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
  const size_t i = dispatch_table_index(HWY_DISPATCH_TABLE(FlashAttentionTarget), target_bit, "flash attention");
  FlashAttentionKernel kernel;
  kernel.rows = HWY_DISPATCH_TABLE(FlashAttentionRows)[i];
  kernel.rows_bf16 = HWY_DISPATCH_TABLE(FlashAttentionRowsBF16)[i];
  kernel.rows_f16 = HWY_DISPATCH_TABLE(FlashAttentionRowsF16)[i];
  kernel.row_tile = HWY_DISPATCH_TABLE(FlashAttentionRowTile)[i]();
  kernel.key_tile = HWY_DISPATCH_TABLE(FlashAttentionKeyTile)[i]();
  return kernel;
}

}  // namespace multihead::detail
#endif  // HWY_ONCE
