// src/simd/targets.hpp: which Highway SIMD target the kernels in src/simd run.
//
// Every kernel in src/simd is compiled once per Highway target (AVX3, AVX2,
// SSE4, SSSE3, and the portable SCALAR/EMU128 fallback) and dispatched at run
// time. By default the best target this CPU supports is used. Two switches
// force another one, so one binary can check every path it carries:
//  - the environment variable MULTIHEAD_SIMD_TARGET (read once per process),
//    e.g. MULTIHEAD_SIMD_TARGET=AVX2;
//  - simd_target_force() below, which tests use to iterate over targets.
// Names are Highway's (hwy::TargetName), matched case-insensitively; "SCALAR"
// and "EMU128" both name the portable fallback, whichever this build has.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace multihead::detail {

// Targets compiled into this binary that this CPU can run, best first,
// e.g. {"AVX3", "AVX2", "SSE4", "SSSE3", "SCALAR"} on an AVX-512 machine.
std::vector<std::string> simd_targets_available();

// Name of the target the kernels dispatch to now.
// Throws multihead::Error if MULTIHEAD_SIMD_TARGET names an unknown or
// unsupported target (the message lists the available ones).
std::string simd_target_current();

// The same target as a Highway bit (HWY_AVX3, ...): kernels look their
// per-target function up with it. Same errors as simd_target_current().
int64_t simd_target_bit();

// Forces `name` for every later kernel call in this process; "" returns to
// MULTIHEAD_SIMD_TARGET or, when that is unset, the best target.
// Throws multihead::Error for an unknown or unsupported name. Meant for tests
// and benchmarks: a kernel that is running keeps the target it started with.
void simd_target_force(const std::string& name);

// Parses a target name into its Highway bit; throws multihead::Error naming
// `what` (e.g. "MULTIHEAD_SIMD_TARGET"), the value and the available targets.
int64_t simd_target_parse(const std::string& name, const std::string& what);

[[noreturn]] void fail_target_not_compiled(int64_t target_bit, const char* kernel);

// Whether the CPU has AVX512_BF16 (CPUID leaf 7 subleaf 1, EAX bit 5): the
// vdpbf16ps of the bf16 flash kernel's pair way. False off x86.
bool cpu_has_avx512_bf16();

// The bf16 flash kernel's two ways of computing QKᵀ and PV
// (flash_attention-inl.h): Fma widens bf16 to float32 and uses float32 FMA;
// Dpbf16 multiplies bf16 pairs into float32 (vdpbf16ps where the CPU has
// AVX512_BF16 and the target is AVX3 or AVX3_DL, else Highway's widening
// of the same pairs). Auto picks by bf16_dot_prefers_dpbf16; Measure (asked
// for by name only) times vdpbf16ps against the FMA in each process and takes
// dpbf16 at kBf16DotMinRatio or more: faster where the rule is wrong for a
// CPU, but two processes on a loaded host may then choose differently.
enum class Bf16Dot { Auto, Fma, Dpbf16, Measure };
inline constexpr double kBf16DotMinRatio = 1.2;
// The setting now: bf16_dot_force's, else MULTIHEAD_BF16_DOT (auto, fma,
// dpbf16 or measure, read once per process), else Auto. Throws multihead::Error naming
// the variable, the value and the accepted names for a bad value.
Bf16Dot bf16_dot_setting();

// Throws multihead::Error naming MULTIHEAD_SIMD_TARGET or MULTIHEAD_BF16_DOT
// if either holds an unknown value (multihead::check_environment; a target
// compiled in but not run by this CPU fails where it is used instead).
void check_simd_environment();
// Forces "fma", "dpbf16" or "measure" for every later call; "" or "auto" returns to
// MULTIHEAD_BF16_DOT or Auto. Throws multihead::Error for another name.
void bf16_dot_force(const std::string& name);
// Whether the CPU's vendor string (CPUID leaf 0) is "AuthenticAMD". False
// off x86.
bool cpu_is_amd();
// The rule of Auto: the pair way where vdpbf16ps runs (`native`) on an AMD
// core. It is a fixed function of the CPU, never of a timing, so that two
// runs on one machine give the same bits (a rule from a measured rate flipped
// between processes on a loaded host). The measurements behind it
// (docs/precision.md): Zen 4 issues vdpbf16ps at the FMA's instruction rate,
// so at 2x its FLOPs (register chains, bench/fma_peak.cpp); issue 19's Intel
// Xeon at half the FMA's instruction rate, so no FLOP gain to pay for the
// pair packing and the rounding of P to bf16.
inline bool bf16_dot_prefers_dpbf16(bool native, bool amd) { return native && amd; }

// Index of `target_bit` in the HWY_EXPORT tables of a src/simd file, given
// the table of a function of that file that returns HWY_TARGET. Rather than
// rely on how Highway orders its tables, ask each entry which target it was
// compiled for. With several targets, entry 0 is Highway's own "choose and
// call" trampoline (it dispatches on Highway's global choice, not ours):
// skip it. Throws multihead::Error naming `kernel` if the target is absent.
template <std::size_t N>
std::size_t dispatch_table_index(int64_t (*const (&target_of)[N])(), int64_t target_bit, const char* kernel) {
  for (std::size_t i = N > 1 ? 1 : 0; i < N; ++i) {
    if (target_of[i] != nullptr && target_of[i]() == target_bit) return i;
  }
  fail_target_not_compiled(target_bit, kernel);
}

}  // namespace multihead::detail
