// fuzz/shape_arithmetic.hpp: the mutator's arithmetic on dimensions that come
// from parsed, untrusted files.
//
// A parsed .npy or safetensors tensor may legally claim a dimension of
// INT64_MAX when another dimension is 0 (it holds no bytes). So the mutator
// never writes `d + 1` or multiplies dimensions itself: it nudges through
// nudge_dim and asks small_enough before it allocates. Both are replayed at
// the extremes by tests/test_fuzz_regressions.cpp.
#pragma once

#include <cstdint>
#include <limits>

#include "multihead/error.hpp"
#include "multihead/tensor.hpp"

namespace multihead::fuzz {

// d moved one step up or down, staying within [0, INT64_MAX].
inline int64_t nudge_dim(int64_t d, bool up) {
  if (up) return d < std::numeric_limits<int64_t>::max() ? d + 1 : d;
  return d > 0 ? d - 1 : 0;
}

// Whether a tensor of `shape` has at most `max_elements` elements. A shape
// whose element count overflows int64 (shape_numel throws) is not.
inline bool small_enough(const Shape& shape, int64_t max_elements) {
  try {
    return shape_numel(shape) <= max_elements;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace multihead::fuzz
