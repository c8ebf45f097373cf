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

// The bf16 pair way (flash_attention_backward-inl.h, BackwardKeyTileStep):
// with Highway's widening on every target, with vdpbf16ps on the AVX-512
// ones, as the forward's (flash_attention.cpp). Its pairs of adjacent
// queries need an even query tile: a target of one float lane (the
// portable fallback) runs the float32 products instead.
constexpr Bf16Way kNativeWay =
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)  // kHasDpbf16
    Bf16Way::DotNative;
#else
    Bf16Way::Dot;
#endif
template <Bf16Way W>
void GroupPairs(const AttentionBackwardArgs<float>& args, int64_t kv, FlashScratch& scratch) {
  if (hn::Lanes(DF32()) < 2) return FlashAttentionBackwardGroupF32(args, kv, scratch);
  FlashAttentionBackwardGroupF32<W>(args, kv, scratch);
}
template <Bf16Way W>
void KeysPairs(const AttentionBackwardArgs<float>& args, int64_t kv, int64_t begin, int64_t end, FlashScratch& scratch) {
  if (hn::Lanes(DF32()) < 2) return FlashAttentionBackwardKeysF32(args, kv, begin, end, scratch);
  FlashAttentionBackwardKeysF32<W>(args, kv, begin, end, scratch);
}
template <Bf16Way W>
void QueriesPairs(const AttentionBackwardArgs<float>& args, int64_t slice, int64_t begin, int64_t end,
                  FlashScratch& scratch) {
  if (hn::Lanes(DF32()) < 2) return FlashAttentionBackwardQueriesF32(args, slice, begin, end, scratch);
  FlashAttentionBackwardQueriesF32<W>(args, slice, begin, end, scratch);
}
void FlashAttentionBackwardGroupBF16Dot(const AttentionBackwardArgs<float>& args, int64_t kv, FlashScratch& scratch) {
  GroupPairs<Bf16Way::Dot>(args, kv, scratch);
}
void FlashAttentionBackwardKeysBF16Dot(const AttentionBackwardArgs<float>& args, int64_t kv, int64_t begin,
                                       int64_t end, FlashScratch& scratch) {
  KeysPairs<Bf16Way::Dot>(args, kv, begin, end, scratch);
}
void FlashAttentionBackwardQueriesBF16Dot(const AttentionBackwardArgs<float>& args, int64_t slice, int64_t begin,
                                          int64_t end, FlashScratch& scratch) {
  QueriesPairs<Bf16Way::Dot>(args, slice, begin, end, scratch);
}
void FlashAttentionBackwardGroupBF16DotNative(const AttentionBackwardArgs<float>& args, int64_t kv,
                                              FlashScratch& scratch) {
  GroupPairs<kNativeWay>(args, kv, scratch);
}
void FlashAttentionBackwardKeysBF16DotNative(const AttentionBackwardArgs<float>& args, int64_t kv, int64_t begin,
                                             int64_t end, FlashScratch& scratch) {
  KeysPairs<kNativeWay>(args, kv, begin, end, scratch);
}
void FlashAttentionBackwardQueriesBF16DotNative(const AttentionBackwardArgs<float>& args, int64_t slice,
                                                int64_t begin, int64_t end, FlashScratch& scratch) {
  QueriesPairs<kNativeWay>(args, slice, begin, end, scratch);
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
HWY_EXPORT(FlashAttentionBackwardGroupBF16Dot);
HWY_EXPORT(FlashAttentionBackwardKeysBF16Dot);
HWY_EXPORT(FlashAttentionBackwardQueriesBF16Dot);
HWY_EXPORT(FlashAttentionBackwardGroupBF16DotNative);
HWY_EXPORT(FlashAttentionBackwardKeysBF16DotNative);
HWY_EXPORT(FlashAttentionBackwardQueriesBF16DotNative);
HWY_EXPORT(FlashAttentionBackwardRowTile);
HWY_EXPORT(FlashAttentionBackwardKeyTile);
HWY_EXPORT(FlashAttentionBackwardTarget);

FlashBackwardKernel flash_backward_kernel_for(int64_t target_bit, BackwardProducts products) {
  const size_t i =
      dispatch_table_index(HWY_DISPATCH_TABLE(FlashAttentionBackwardTarget), target_bit, "flash attention backward");
  FlashBackwardKernel kernel;
  switch (products) {
    case BackwardProducts::Float32:
      kernel.group = HWY_DISPATCH_TABLE(FlashAttentionBackwardGroup)[i];
      kernel.keys = HWY_DISPATCH_TABLE(FlashAttentionBackwardKeys)[i];
      kernel.queries = HWY_DISPATCH_TABLE(FlashAttentionBackwardQueries)[i];
      break;
    case BackwardProducts::Bf16Pairs:
      kernel.group = HWY_DISPATCH_TABLE(FlashAttentionBackwardGroupBF16Dot)[i];
      kernel.keys = HWY_DISPATCH_TABLE(FlashAttentionBackwardKeysBF16Dot)[i];
      kernel.queries = HWY_DISPATCH_TABLE(FlashAttentionBackwardQueriesBF16Dot)[i];
      break;
    case BackwardProducts::Bf16PairsNative:
      kernel.group = HWY_DISPATCH_TABLE(FlashAttentionBackwardGroupBF16DotNative)[i];
      kernel.keys = HWY_DISPATCH_TABLE(FlashAttentionBackwardKeysBF16DotNative)[i];
      kernel.queries = HWY_DISPATCH_TABLE(FlashAttentionBackwardQueriesBF16DotNative)[i];
      break;
  }
  kernel.row_tile = HWY_DISPATCH_TABLE(FlashAttentionBackwardRowTile)[i]();
  kernel.key_tile = HWY_DISPATCH_TABLE(FlashAttentionBackwardKeyTile)[i]();
  return kernel;
}

}  // namespace multihead::detail
#endif  // HWY_ONCE
