// src/attention/kernel_force.hpp: the process-wide forced kernel behind
// multihead::kernel_force (runtime.cpp), read by the dispatcher.
#pragma once

#include <atomic>

#include "multihead/attention.hpp"

namespace multihead::detail {

// Auto = nothing forced.
std::atomic<AttentionKernel>& forced_kernel();

}  // namespace multihead::detail
