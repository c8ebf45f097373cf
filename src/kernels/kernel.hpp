// src/kernels/kernel.hpp: the attention kernels behind the one contract of
// src/contract/attention_args.hpp, and the dispatcher that picks one.
//
// Legend: N slices, L queries, S keys, D query/key width, Dv value width.
#pragma once

#include "contract/attention_args.hpp"
#include "contract/attention_weights_args.hpp"
#include "multihead/attention.hpp"

namespace multihead::detail {

// Plain loops, templated so tests can run them in double. Never optimised;
// calls no BLAS and no SIMD code (the textbook form relies on it).
template <class T>
void attention_forward_reference(const AttentionArgs<T>& args);

// Scores materialised per slice (L×S), products through BLAS, softmax rows
// through src/simd/softmax_row.hpp.
template <class T>
void attention_forward_materialized(const AttentionArgs<T>& args);

// Tiled online softmax (Highway SIMD). float only, weights must be nullptr.
// Defined in src/kernels/flash.cpp.
void attention_forward_flash(const AttentionArgs<float>& args);

// Picks a kernel: `requested`, unless forced (multihead/runtime.hpp's
// kernel_force or MULTIHEAD_KERNEL); Auto means flash when it can serve the
// request, else materialised.
template <class T>
void attention_forward(const AttentionArgs<T>& args, AttentionKernel requested);

// The kernel attention_forward(args, requested) runs: `requested` unless
// forced, Auto resolved as above. Lets a caller that wants weights run the
// flash forward without them and recompute them (attention_weights_flash)
// exactly when flash is the kernel that would serve the call.
template <class T>
AttentionKernel attention_forward_kernel(const AttentionArgs<T>& args, AttentionKernel requested);

// The weights of a flash forward's selected slices and rows, recomputed
// tile by tile from its saved lse (the contract:
// src/contract/attention_weights_args.hpp); no L×S buffer beyond the caller's.
// Defined in src/kernels/flash_weights.cpp; kernel in
// src/simd/flash_weights-inl.h.
void attention_weights_flash(const AttentionWeightsArgs& args);

// The backward passes (the contract: AttentionBackwardArgs in
// src/contract/attention_args.hpp), each beside its forward.
template <class T>
void attention_backward_reference(const AttentionBackwardArgs<T>& args);

// Recomputes P per slice from the saved lse (two L×S buffers), products
// through BLAS. float and double.
template <class T>
void attention_backward_materialized(const AttentionBackwardArgs<T>& args);

// FlashAttention-2's backward (Highway SIMD): scores recomputed tile by
// tile, no L×S storage; deterministic for any thread count. float only.
// Defined in src/kernels/flash.cpp, beside the forward.
void attention_backward_flash(const AttentionBackwardArgs<float>& args);

// Picks the backward kernel as attention_forward picks the forward.
template <class T>
void attention_backward(const AttentionBackwardArgs<T>& args, AttentionKernel requested);

}  // namespace multihead::detail
