// multihead/runtime.hpp: process-wide run-time switches. They let one
// binary check itself (force the reference kernel, or any SIMD target this
// CPU runs) and set the threads of both the library's own parallel loops and
// the BLAS it calls. Everything here is also reachable from the environment:
// MULTIHEAD_KERNEL and MULTIHEAD_SIMD_TARGET.
#pragma once

#include <string>
#include <vector>

#include "multihead/attention.hpp"

namespace multihead {

// Threads for OpenMP regions (omp_set_num_threads) and for BLAS. threads <= 0
// leaves both as they are. A call's options.num_threads, when > 0, still
// wins for that call's own loops. Throws multihead::Error above max_threads().
void set_threads(int threads);

// Reads every MULTIHEAD_* tuning variable the library reads (
// MULTIHEAD_SIMD_TARGET, MULTIHEAD_BF16_DOT, MULTIHEAD_F16_GEMM, MULTIHEAD_KERNEL,
// MULTIHEAD_NARROW_GEMV, MULTIHEAD_FUSED_PATHS, MULTIHEAD_BACKWARD_HEADS,
// MULTIHEAD_BF16_BACKWARD) and throws multihead::Error, naming the first
// one with an unknown value and the values it takes, as the call that reads
// it would (a SIMD target compiled in but not run by this CPU passes here
// and fails where it is dispatched). Each is otherwise read only by the calls it steers, so a bad
// value would fail some commands and pass others; the command line checks
// them all before any work. (MULTIHEAD_KEPT_STORAGE_MIB, a memory knob,
// falls back to its default with a note instead.)
void check_environment();
// The library's memory rule, for a program's own buffers: throws
// multihead::Error "NAME: WHAT would need X GiB (N bytes), more than this
// machine's Y GiB of memory (HINT)" when `bytes` exceed the physical memory,
// so a size the flags allow fails in one line before the allocation, not in
// the kernel's OOM killer or a bare std::bad_alloc.
void check_fits_in_memory(const std::string& name, const std::string& what, double bytes,
                          const std::string& hint = "");

// The most threads set_threads and AttentionOptions::num_threads accept:
// 8 per processor this process may run on. Far more threads than cores only
// slows the kernels down, and a thread count the system cannot start makes
// the OpenMP runtime stop (libgomp: "Thread creation failed") instead of
// failing cleanly, so such counts are refused up front.
int max_threads();
// Threads the library's own parallel loops use when a call asks for 0.
int threads();
// Threads BLAS uses now (OpenBLAS's or oneDNN's setting).
int blas_threads();

// SIMD targets compiled into this library that this CPU runs, best first,
// e.g. {"AVX3", "AVX2", "SSE4", "SSSE3", "SCALAR"} (Highway's names).
std::vector<std::string> simd_targets_available();
// The target the SIMD kernels dispatch to now.
std::string simd_target_current();
// Forces `name` (case-insensitive) for every later call in this process; ""
// returns to MULTIHEAD_SIMD_TARGET or, when that is unset, the best target.
// Throws multihead::Error naming the available targets for a bad name.
void simd_target_force(const std::string& name);

// The bf16 flash kernel's way of computing QKᵀ and PV (docs/precision.md,
// "The two bf16 dot ways"): "fma" (bf16 widened to float32, float32 FMA) or
// "dpbf16" (bf16 pairs multiplied into float32: vdpbf16ps where the CPU has
// AVX512_BF16, else Highway's widening of the same pairs). By default
// ("auto") dpbf16 where vdpbf16ps runs on an AMD core (Zen 4 and 5 issue it
// at the FMA's instruction rate: twice the FLOPs), fma elsewhere: a fixed
// rule of the CPU, so that runs on one machine give the same bits.
// "measure" times vdpbf16ps against the FMA once per process and takes
// dpbf16 at >= 1.2x its FLOP rate: for a CPU the rule misjudges, at the
// price that two processes on a loaded host may choose differently.
// MULTIHEAD_BF16_DOT=auto|measure|fma|dpbf16 sets it for the process;
// bf16_dot_force("fma" | "dpbf16" | "measure") forces one for every later call, "" or
// "auto" lifts the force. Throws multihead::Error for another name.
void bf16_dot_force(const std::string& way);
// What the current SIMD target runs now and why, one line: e.g.
// "dpbf16 (vdpbf16ps, forced)", "dpbf16 (auto: an AMD core; vdpbf16ps
// measured at 2.00x the FMA's FLOP rate here)", "fma (auto: no AVX512_BF16
// on this target)". The measured rate is a diagnostic, not the rule.
std::string bf16_dot_current();

// How products of two float16 operands (the f16 modules' projections) run
// (docs/precision.md, "f16 products on a bf16 matmul"): "widen" (both
// widened to float32, oneDNN's sgemm) or "bf16x3" (each f16 value split
// exactly into two bf16 numbers, hi + lo, and Ah·Bh + Al·Bh + Ah·Bl as one
// bf16 matmul over a K three times as long; the dropped Al·Bl is at most
// 2^-16·Σ|a||b|). By default ("auto") bf16x3 where oneDNN's bf16 matmul
// runs on AMX (several times the float32 rate), widen elsewhere;
// MULTIHEAD_F16_GEMM=auto|widen|bf16x3 sets it for the process,
// f16_gemm_force("widen" | "bf16x3") for every later call, "" or "auto"
// lifts the force. bf16x3 forced where oneDNN has no bf16 matmul widens.
// Throws multihead::Error for another name.
void f16_gemm_force(const std::string& way);
// The way f16 products run now and why, one line: e.g. "bf16x3 (auto:
// oneDNN's bf16 matmul runs on AMX (brg:avx512_core_amx_bf16))", "widen
// (auto: oneDNN's bf16 matmul is brg:avx512_core_bf16, not AMX)".
std::string f16_gemm_current();

// How bf16 attention computes its products, forward (QKᵀ, PV) and backward
// (docs/precision.md, "bf16 attention on a bf16 matmul"): "flash" (the flash
// kernel, its way chosen by bf16_dot_force) or "matmul" (forward: blocks of
// 256 query rows, the flash kernel's online softmax over chunks of 512 keys
// in float32, the two products on oneDNN's bf16 matmul, the weights rounded
// to bf16 for PV; backward: its five products on oneDNN's bf16 matmul, one
// K/V slice per thread, the weights and score gradients rounded to bf16). By
// default ("auto") matmul for calls of at least 128 query rows (a backward
// also over at least 2 K/V slices, batch entries × K/V heads) where
// oneDNN's bf16 matmul runs on AMX,
// flash elsewhere (a decoding step, and f16, always); MULTIHEAD_NARROW_ATTENTION=
// auto|flash|matmul sets it for the process, narrow_attention_force("flash"
// | "matmul") for every later call, "" or "auto" lifts the force. Throws
// multihead::Error for another name.
void narrow_attention_force(const std::string& way);
// The way now and why, one line: e.g. "matmul (auto, for bf16 calls of at
// least 128 query rows, a backward also over at least 2 K/V slices:
// oneDNN's bf16 matmul runs on AMX
// (brg:avx512_core_amx_bf16))", "flash (forced)".
std::string narrow_attention_current();

// Forces a kernel for every later call in this process, whatever the call
// asks for; Auto lifts the force (then MULTIHEAD_KERNEL, if set, applies).
void kernel_force(AttentionKernel kernel);
AttentionKernel kernel_forced();

}  // namespace multihead
