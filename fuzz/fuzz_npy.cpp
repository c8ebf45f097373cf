// fuzz/fuzz_npy.cpp: parse_npy on arbitrary bytes. A parse either succeeds
// or throws multihead::Error; anything else (a crash, a sanitizer report, an
// allocation past -rss_limit_mb, another exception type) is a bug.
// A successful parse must also survive our writer: serialize_npy of the
// values as float64 and parse again gives the same shape and bits.
#include <cstdint>
#include <cstring>

#include "multihead/error.hpp"
#include "multihead/io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  multihead::LoadedTensor t;
  try {
    t = multihead::parse_npy(data, size, "fuzz");
  } catch (const multihead::Error&) {
    return 0;
  }
  if (t.values.numel() != multihead::shape_numel(t.values.shape())) __builtin_trap();
  const std::string again = multihead::serialize_npy(t.values);
  const multihead::LoadedTensor u =
      multihead::parse_npy(reinterpret_cast<const uint8_t*>(again.data()), again.size(), "fuzz round trip");
  if (u.values.shape() != t.values.shape() || u.values.numel() != t.values.numel()) __builtin_trap();
  // An empty tensor's data() may be null, which memcmp must not see.
  if (t.values.numel() > 0 && std::memcmp(u.values.data(), t.values.data(),
                                          static_cast<std::size_t>(t.values.numel()) * sizeof(double)) != 0) {
    __builtin_trap();
  }
  return 0;
}
