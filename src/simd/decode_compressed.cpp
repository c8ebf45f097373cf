// src/simd/decode_compressed.cpp: compiles decode_compressed-inl.h once per
// Highway target and looks a target's kernel up by its Highway bit, as
// src/simd/flash_weights.cpp does.
#include <cstddef>
#include <cstdint>

#include "simd/decode_compressed.hpp"
#include "simd/targets.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/decode_compressed.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "simd/decode_compressed-inl.h"

HWY_BEFORE_NAMESPACE();
namespace multihead::detail {
namespace HWY_NAMESPACE {

void DecodeCompressed(const AttentionArgs<float>& args, const CompressedKV& kv, int64_t kv_slice, int64_t row_begin,
                      int64_t row_end, DecodeWay way) {
  DecodeCompressedRows(args, kv, kv_slice, row_begin, row_end, way);
}
int64_t DecodeCompressedTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace multihead::detail {

HWY_EXPORT(DecodeCompressed);
HWY_EXPORT(DecodeCompressedTarget);

DecodeCompressedKernel decode_compressed_kernel_for(int64_t target_bit) {
  const size_t i =
      dispatch_table_index(HWY_DISPATCH_TABLE(DecodeCompressedTarget), target_bit, "compressed-cache decode");
  return DecodeCompressedKernel{HWY_DISPATCH_TABLE(DecodeCompressed)[i]};
}

}  // namespace multihead::detail
#endif  // HWY_ONCE
