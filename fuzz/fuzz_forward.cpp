// fuzz/fuzz_forward.cpp: the path from parsed inputs through shape validation
// into forward. Each input is a header of options plus a safetensors state
// dict and .npy query/key/value/masks (layout in forward_harness.hpp).
// forward either returns a result that meets its contract or throws
// multihead::Error; anything else (a crash, a sanitizer report, another
// exception type, a hang, an allocation past -rss_limit_mb) is a bug.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <typeinfo>

#include "forward_harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  try {
    multihead::fuzz::run_forward_input(data, size);
  } catch (const multihead::fuzz::HarnessFailure& e) {
    std::fprintf(stderr, "fuzz_forward: contract broken: %s\n", e.what());
    __builtin_trap();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_forward: unexpected %s: %s\n", typeid(e).name(), e.what());
    __builtin_trap();
  }
  return 0;
}
