// src/kernels/kernel_force.hpp: the process-wide forced kernel behind
// multihead::kernel_force (src/attention/runtime.cpp), defined and read by
// the dispatcher (dispatch.cpp).
#pragma once

#include <atomic>

#include "multihead/attention.hpp"

namespace multihead::detail {

// Auto = nothing forced.
std::atomic<AttentionKernel>& forced_kernel();

}  // namespace multihead::detail
