// src/simd/flash_weights.cpp: compiles flash_weights-inl.h once per Highway
// target and looks a target's kernel up by its Highway bit, as
// src/simd/flash_attention.cpp does for the forward.
#include <cstddef>
#include <cstdint>

#include "simd/flash_weights.hpp"
#include "simd/targets.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/flash_weights.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "simd/flash_weights-inl.h"

HWY_BEFORE_NAMESPACE();
namespace multihead::detail {
namespace HWY_NAMESPACE {

void FlashWeightsRows(const AttentionWeightsArgs& args, int64_t slice, int64_t row_begin, int64_t row_end, float* out,
                      FlashScratch& scratch) {
  FlashWeightsRowsF32(args, slice, row_begin, row_end, out, scratch);
}
int64_t FlashWeightsRowTile() { return static_cast<int64_t>(kMaxQueryVectors * hn::Lanes(DF32())); }
int64_t FlashWeightsTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace multihead::detail {

HWY_EXPORT(FlashWeightsRows);
HWY_EXPORT(FlashWeightsRowTile);
HWY_EXPORT(FlashWeightsTarget);

FlashWeightsKernel flash_weights_kernel_for(int64_t target_bit) {
  const size_t i = dispatch_table_index(HWY_DISPATCH_TABLE(FlashWeightsTarget), target_bit, "flash weights");
  FlashWeightsKernel kernel;
  kernel.rows = HWY_DISPATCH_TABLE(FlashWeightsRows)[i];
  kernel.row_tile = HWY_DISPATCH_TABLE(FlashWeightsRowTile)[i]();
  return kernel;
}

}  // namespace multihead::detail
#endif  // HWY_ONCE
