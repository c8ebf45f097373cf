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
// 16-bit operands on a host where the flash kernel widens them tile by tile
// (f16; bf16's fma way) are widened once per call instead, and the float32
// kernel runs on the copies (flash.cpp says why; the same bits). false
// forces the tile way, for the test that compares the two.
void flash_narrow_widen_once(bool enabled);
// Whether the flash kernel's arithmetic on 16-bit operands of `dtype` is, on
// this host, the float32 kernel's on their exact widenings, with each
// output rounded once (f16; bf16 unless its dpbf16 way is chosen): a
// 16-bit caller holding those widenings may run the float32 kernel on them
// and get the same bits.
bool narrow_flash_is_float32_kernel(ComputeDtype dtype);

// Attention of args' queries over a KV cache `kv` of any dtype (float32, or
// compressed: bf16, f16 or int8 with block scales; args.k/v unused), widened
// in registers, softmax in float32: the grouped-query module's forward with
// a compressed cache, and its decode steps with a float32 one
// (decode_kernel_serves). Reads causal, window, soft-cap and ALiBi from
// args.modifiers; no masks, weights or dropout. Defined in
// src/kernels/decode_compressed.cpp; kernel in src/simd/decode_compressed-inl.h.
void attention_forward_compressed(const AttentionArgs<float>& args, const CompressedKV& kv);

// Whether a call over a float32 KV cache is a decode step that the decode
// kernel above serves, so that one kernel decodes every cache dtype: float,
// nothing forced (`requested` Auto, and no kernel_force or MULTIHEAD_KERNEL,
// so `reference`, `materialized` and `flash` still force their kernels), no
// rule the decode kernel lacks (masks, dropout, stored weights), and few
// rows per K/V head: (H / Hkv)·q_len <= kDecodeMaxRows, the rows one call
// holds in registers. Flash on such a step puts 1 to 8 queries in a query
// tile of 16 to 64 lanes (issue 19: 8.4 ms per step against the materialized
// kernel's 1.25 ms at E 256, H 2, context 16,384, 1 thread). More rows (a
// prompt, or multi-query decoding: 32 query heads on one K/V head, which
// flash packs into one full tile) keep flash: there the decode kernel's
// per-row dot products and horizontal sums cost more than flash's tiles
// (measured, E 1024, H 32, Hkv 1, context 8192, 1 thread, 3 alternated
// rounds on a loaded machine: 5.2-8.7 ms a step against flash's 2.8-4.9 ms).
template <class T>
bool decode_kernel_serves(const AttentionArgs<T>& args, AttentionKernel requested);

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
// Whether attention_backward_flash runs bf16's pair way on this host (for a
// backward with bf16_operands): then it can read the bf16 operands
// themselves (AttentionBackwardArgs::d_out_bf16).
bool flash_backward_reads_bf16();

// The backward of a chosen kernel (resolve_forward_kernel chose it), and
// both steps at once (for a caller with a single backward call: the kernel tests).
template <class T>
void run_attention_backward(const AttentionBackwardArgs<T>& args, AttentionKernel chosen);
template <class T>
void attention_backward(const AttentionBackwardArgs<T>& args, AttentionKernel requested);

}  // namespace multihead::detail
