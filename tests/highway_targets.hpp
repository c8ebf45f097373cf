// tests/highway_targets.hpp: run a test body once per Highway target, for
// the tests of code that dispatches through Highway's own tables
// (HWY_DYNAMIC_DISPATCH: core/narrow_rows, core/narrow_gemv). The flash
// kernel dispatches through our table instead (simd_target_force).
#pragma once

#include <cstdint>
#include <string>

#include "hwy/highway.h"
#include "hwy/targets.h"

namespace multihead::test {

// Runs fn(target name) once per compiled target this CPU supports, with
// Highway's dispatch held to that target, then restores the default.
template <class Fn>
void for_each_highway_target(const Fn& fn) {
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    fn(std::string(hwy::TargetName(target)));
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace multihead::test
