// src/kernels/narrow_matmul.hpp: the bf16 attention's matmul way, forward
// and backward. Scaled dot-product attention of bf16 operands
// (AttentionArgs::narrow) with its two products, QKᵀ and PV (and its
// backward's five), on oneDNN's bf16 matmul, which runs on
// AMX tiles where the CPU has them (tdpbf16ps: a 16×16 tile of float32
// sums of 32 bf16 products per instruction, several times the float32
// FMA's rate, core/gemm.hpp): the flash kernel's online softmax over
// blocks of 256 query rows and chunks of 512 keys, each chunk's scores
// stored (float32), shaped and exponentiated in float32, its weights
// rounded to bf16 for PV. narrow_matmul.cpp says how, and what it costs in
// precision; docs/precision.md gives the bound.
//
// The flash kernel is the reference beside it. The switch
// (MULTIHEAD_NARROW_ATTENTION=auto|flash|matmul, narrow_attention_force):
// "auto" takes the matmul way for a bf16 call of at least
// kNarrowMatmulMinRows query rows where oneDNN's bf16 matmul is AMX (a
// decoding step keeps the flash kernel; the backward's rule is below);
// "matmul" takes it for every bf16 call (on a CPU without AMX its products are oneDNN's vdpbf16ps or
// emulated bf16 matmul, or widened); "flash" never. f16 always keeps the
// flash kernel (narrow_matmul.cpp says why).
#pragma once

#include <cstdint>
#include <string>

#include "contract/attention_args.hpp"

namespace multihead::detail {

// The forward of a call narrow_matmul_serves (the contract of
// src/contract/attention_args.hpp: out, lse).
void attention_forward_narrow_matmul(const AttentionArgs<float>& args);

// Whether the call takes the matmul way: bf16 operands, no stored weights,
// a query, a key and nonzero widths, and the switch (above): with "auto",
// at least kNarrowMatmulMinRows query rows on AMX. Measured (Intel Xeon
// with AMX, 2 threads, the bf16 forward, flash and matmul alternated 3
// times, ms): (1, 64, 512, 8) 0.43-0.47 flash against 0.47-0.49 matmul,
// (4, 64, 512, 8) 1.45-1.54 against 1.39-1.49, (1, 128, 512, 8) 0.90-0.94
// against 0.84-0.85, (1, 256, 512, 8) 2.00-2.08 against 1.58-1.71.
inline constexpr int64_t kNarrowMatmulMinRows = 128;
bool narrow_matmul_serves(const AttentionArgs<float>& args);

// The backward of a call narrow_matmul_backward_serves (the contract of
// AttentionBackwardArgs: d_q, d_k, d_v written): its five products on
// oneDNN's bf16 matmul (narrow_matmul.cpp says how).
void attention_backward_narrow_matmul(const AttentionBackwardArgs<float>& args);

// Whether the backward takes the matmul way: bf16 operands (bf16_operands),
// no stored weights, nonzero sizes, and the switch above: with "auto", at
// least kNarrowMatmulMinRows query rows and kNarrowMatmulBackwardMinGroups
// K/V slices (a work item is a whole K/V group, so fewer would leave
// threads idle; the flash backward splits a group) on AMX. Neither rule
// reads the thread count, so neither do the bits. The second form is the
// same rule for a bf16 backward of `forward`'s shapes (the modules ask it
// before they build the operands: this way reads the bf16 ones in place).
// Measured (Intel Xeon with AMX, 2 threads, the bf16 training step's
// backward, flash and matmul alternated twice, ms): (1, 128, 512, 8)
// 2.7-2.9 against 2.6-2.8, (1, 256, 512, 8) 5.0-5.2 against 4.4,
// (8, 128, 512, 8) 14.6-15.1 against 13.3-13.8, (1, 1024, 768, 12)
// 48.6-51.9 against 38.9-40.0, (1, 4096, 1024, 16) 662-720 against
// 480-542.
inline constexpr int64_t kNarrowMatmulBackwardMinGroups = 2;
bool narrow_matmul_backward_serves(const AttentionBackwardArgs<float>& args);
bool narrow_matmul_backward_serves_bf16(const AttentionArgs<float>& forward);

// multihead/runtime.hpp's narrow_attention_force and
// narrow_attention_current; the environment's MULTIHEAD_NARROW_ATTENTION,
// checked (check_environment).
void narrow_attention_force(const std::string& way);
std::string narrow_attention_current();
void check_narrow_attention_environment();

}  // namespace multihead::detail
