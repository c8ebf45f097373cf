// src/kernels/kernel.hpp: the attention kernels behind the one contract of
// src/contract/attention_args.hpp, and the dispatcher that picks one.
//
// Legend: N slices, L queries, S keys, D query/key width, Dv value width.
#pragma once

#include "contract/attention_args.hpp"
#include "contract/attention_weights_args.hpp"
#include "multihead/attention.hpp"
#include "simd/decode_compressed.hpp"

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

// Attention of args' queries over a compressed KV cache `kv` (bf16, f16 or
// int8 with block scales; args.k/v unused), widened in registers, softmax in
// float32: the grouped-query module's forward with such a cache. Reads
// causal, window, soft-cap and ALiBi from args.modifiers; no masks, weights
// or dropout. Defined in src/kernels/decode_compressed.cpp; kernel in
// src/simd/decode_compressed-inl.h.
void attention_forward_compressed(const AttentionArgs<float>& args, const CompressedKV& kv);

// Choosing a kernel is done once per call (a module call: its forward, and
// the backward of a training forward, which reuses the forward's choice),
// then the chosen kernel runs without looking again:
//  - resolve_forward_kernel: `requested`, unless forced (multihead/runtime.hpp's
//    kernel_force, else the environment's MULTIHEAD_KERNEL, read here and
//    nowhere else); Auto becomes flash when flash can serve the call (float,
//    and no stored weights: `stores_weights` false), else materialized.
//    Never returns Auto. A module that wants weights asks with
//    stores_weights false and, given flash, recomputes them from the lse
//    (attention_weights_flash).
//  - run_attention_forward / run_attention_backward: the chosen kernel;
//    flash where it cannot run (weights, float64) is a usage error, not a
//    silent swap. Any kernel's backward may follow any kernel's forward:
//    they share the contract (lse, out).
template <class T>
AttentionKernel resolve_forward_kernel(AttentionKernel requested, bool stores_weights);
template <class T>
void run_attention_forward(const AttentionArgs<T>& args, AttentionKernel chosen);

// Both steps at once, for a caller with a single kernel call
// (scaled_dot_product_attention).
template <class T>
void attention_forward(const AttentionArgs<T>& args, AttentionKernel requested);

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

// The backward of a chosen kernel (resolve_forward_kernel chose it), and
// both steps at once (for a caller with a single backward call: the kernel tests).
template <class T>
void run_attention_backward(const AttentionBackwardArgs<T>& args, AttentionKernel chosen);
template <class T>
void attention_backward(const AttentionBackwardArgs<T>& args, AttentionKernel requested);

}  // namespace multihead::detail
