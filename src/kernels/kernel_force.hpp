// src/kernels/kernel_force.hpp: the process-wide forced kernel behind
// multihead::kernel_force (src/attention/runtime.cpp), defined and read by
// the dispatcher (dispatch.cpp).
#pragma once

#include <atomic>

#include "multihead/attention.hpp"

namespace multihead::detail {

// Auto = nothing forced.
std::atomic<AttentionKernel>& forced_kernel();

// Throws multihead::Error (naming MULTIHEAD_KERNEL) if the variable holds no
// kernel's name; what every call would throw (multihead::check_environment).
void check_kernel_environment();

}  // namespace multihead::detail
