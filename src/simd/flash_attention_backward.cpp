// src/simd/flash_attention_backward.cpp: compiles
// flash_attention_backward-inl.h once per Highway target and looks a
// target's kernel up by its Highway bit, as src/simd/flash_attention.cpp
// does for the forward.
#include <cstddef>
#include <cstdint>

#include "simd/flash_attention_backward.hpp"
#include "simd/targets.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/flash_attention_backward.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "simd/flash_attention_backward-inl.h"

HWY_BEFORE_NAMESPACE();
namespace multihead::detail {
namespace HWY_NAMESPACE {

void FlashAttentionBackwardGroup(const AttentionBackwardArgs<float>& args, int64_t kv, FlashScratch& scratch) {
  FlashAttentionBackwardGroupF32(args, kv, scratch);
}
void FlashAttentionBackwardKeys(const AttentionBackwardArgs<float>& args, int64_t kv, int64_t begin, int64_t end,
                                FlashScratch& scratch) {
  FlashAttentionBackwardKeysF32(args, kv, begin, end, scratch);
}
void FlashAttentionBackwardQueries(const AttentionBackwardArgs<float>& args, int64_t slice, int64_t begin,
                                   int64_t end, FlashScratch& scratch) {
  FlashAttentionBackwardQueriesF32(args, slice, begin, end, scratch);
}
int64_t FlashAttentionBackwardRowTile() { return FlashAttentionBackwardRowTileF32(); }
int64_t FlashAttentionBackwardKeyTile() { return FlashAttentionBackwardKeyTileF32(); }
int64_t FlashAttentionBackwardTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace multihead::detail {

HWY_EXPORT(FlashAttentionBackwardGroup);
HWY_EXPORT(FlashAttentionBackwardKeys);
HWY_EXPORT(FlashAttentionBackwardQueries);
HWY_EXPORT(FlashAttentionBackwardRowTile);
HWY_EXPORT(FlashAttentionBackwardKeyTile);
HWY_EXPORT(FlashAttentionBackwardTarget);

FlashBackwardKernel flash_backward_kernel_for(int64_t target_bit) {
  const size_t i =
      dispatch_table_index(HWY_DISPATCH_TABLE(FlashAttentionBackwardTarget), target_bit, "flash attention backward");
  FlashBackwardKernel kernel;
  kernel.group = HWY_DISPATCH_TABLE(FlashAttentionBackwardGroup)[i];
  kernel.keys = HWY_DISPATCH_TABLE(FlashAttentionBackwardKeys)[i];
  kernel.queries = HWY_DISPATCH_TABLE(FlashAttentionBackwardQueries)[i];
  kernel.row_tile = HWY_DISPATCH_TABLE(FlashAttentionBackwardRowTile)[i]();
  kernel.key_tile = HWY_DISPATCH_TABLE(FlashAttentionBackwardKeyTile)[i]();
  return kernel;
}

}  // namespace multihead::detail
#endif  // HWY_ONCE
