// src/simd/targets.cpp: run-time choice of the Highway target (see targets.hpp).
#include "simd/targets.hpp"

#include <atomic>
#include <cctype>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "core/switches.hpp"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "multihead/error.hpp"

namespace multihead::detail {
namespace {

// The portable fallback is HWY_SCALAR with GCC < 12.3 (Highway marks EMU128
// broken there) and HWY_EMU128 otherwise; both names select it.
constexpr int64_t kFallbackTargets = HWY_SCALAR | HWY_EMU128;

// Bits of the targets compiled into this binary (every file in src/simd is
// built with the same flags, hence the same HWY_TARGETS) and runnable here.
int64_t runnable_targets() {
  int64_t runnable = hwy::SupportedTargets() & HWY_TARGETS;
  // The fallback always runs, whether or not SupportedTargets lists it.
  runnable |= HWY_TARGETS & kFallbackTargets;
  return runnable;
}

std::string upper(const std::string& s) {
  std::string r = s;
  for (char& c : r) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return r;
}

std::string join_available() {
  std::string list;
  for (const std::string& name : simd_targets_available()) list += (list.empty() ? "" : ", ") + name;
  return list;
}

// The best runnable target: the lowest set bit (Highway orders targets from
// best to worst by increasing bit value).
int64_t best_target() {
  const int64_t runnable = runnable_targets();
  return runnable & -runnable;
}

// MULTIHEAD_SIMD_TARGET, parsed once. A bad value throws on every query (the
// static is only initialised once parsing succeeds).
int64_t default_target() {
  static const int64_t target = [] {
    const char* env = std::getenv("MULTIHEAD_SIMD_TARGET");
    if (env == nullptr || *env == '\0') return best_target();
    return simd_target_parse(env, "MULTIHEAD_SIMD_TARGET");
  }();
  return target;
}

// 0 = no override.
std::atomic<int64_t> g_forced_target{0};

}  // namespace

std::vector<std::string> simd_targets_available() {
  std::vector<std::string> names;
  for (int64_t bits = runnable_targets(); bits != 0; bits &= bits - 1) {
    names.emplace_back(hwy::TargetName(bits & -bits));
  }
  return names;
}

int64_t simd_target_parse(const std::string& name, const std::string& what) {
  const std::string want = upper(name);
  const int64_t runnable = runnable_targets();
  if (want == "SCALAR" || want == "EMU128") {
    return runnable & kFallbackTargets & -(runnable & kFallbackTargets);
  }
  for (int64_t bits = HWY_TARGETS; bits != 0; bits &= bits - 1) {
    const int64_t bit = bits & -bits;
    if (want != hwy::TargetName(bit)) continue;
    if ((runnable & bit) == 0) {
      throw Error(Error::Kind::Value, what + ": SIMD target '" + name +
                                          "' is compiled in but not supported by this CPU; available: " +
                                          join_available());
    }
    return bit;
  }
  throw Error(Error::Kind::Value,
              what + ": unknown SIMD target " + quote_input(name) + "; available: " + join_available());
}

int64_t simd_target_bit() {
  const int64_t forced = g_forced_target.load(std::memory_order_relaxed);
  return forced != 0 ? forced : default_target();
}

std::string simd_target_current() { return hwy::TargetName(simd_target_bit()); }

void simd_target_force(const std::string& name) {
  const int64_t bit = name.empty() ? 0 : simd_target_parse(name, "simd_target_force");
  g_forced_target.store(bit, std::memory_order_relaxed);
}

// CPUID is asked once per process: in a virtual machine each CPUID traps to
// the hypervisor (microseconds), and the bf16 way is looked up on every
// flash call (perf, (1, 128, 512, 8) bf16 forward, AMD Zen 5 guest: the two
// queries were ~1% of the samples).
bool cpu_has_avx512_bf16() {
  static const bool has = [] {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d) == 0) return false;
    return ((a >> 5) & 1u) != 0;
#else
    return false;
#endif
  }();
  return has;
}

bool cpu_is_amd() {
  static const bool amd = [] {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(0, &a, &b, &c, &d) == 0) return false;
    // The vendor string is EBX, EDX, ECX: "Auth" "enti" "cAMD".
    return b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;
#else
    return false;
#endif
  }();
  return amd;
}

namespace {

// Bf16Dot's names, in its order.
constexpr std::string_view kBf16DotNames[] = {"auto", "fma", "dpbf16", "measure"};

Bf16Dot parse_bf16_dot(const std::string& name, const std::string& what) {
  return static_cast<Bf16Dot>(switch_choice(what, name, kBf16DotNames));
}

// MULTIHEAD_BF16_DOT, parsed once (as default_target).
Bf16Dot env_bf16_dot() {
  static const Bf16Dot way = static_cast<Bf16Dot>(env_switch("MULTIHEAD_BF16_DOT", kBf16DotNames));
  return way;
}

std::atomic<int> g_forced_bf16_dot{static_cast<int>(Bf16Dot::Auto)};

}  // namespace

void check_simd_environment() {
  // The target's name only: whether this CPU runs it is checked where it is
  // used (a command that never dispatches, or bench --simd-target, which
  // overrides it, still runs), with simd_target_parse's message.
  if (const char* env = std::getenv("MULTIHEAD_SIMD_TARGET"); env != nullptr && *env != '\0') {
    const std::string want = upper(env);
    bool known = want == "SCALAR" || want == "EMU128";
    for (int64_t bits = HWY_TARGETS; bits != 0 && !known; bits &= bits - 1) known = want == hwy::TargetName(bits & -bits);
    if (!known) (void)simd_target_parse(env, "MULTIHEAD_SIMD_TARGET");  // throws: unknown, naming the targets
  }
  (void)env_bf16_dot();
}

Bf16Dot bf16_dot_setting() {
  const auto forced = static_cast<Bf16Dot>(g_forced_bf16_dot.load(std::memory_order_relaxed));
  return forced != Bf16Dot::Auto ? forced : env_bf16_dot();
}

void bf16_dot_force(const std::string& name) {
  g_forced_bf16_dot.store(static_cast<int>(parse_bf16_dot(name, "bf16_dot_force")), std::memory_order_relaxed);
}

void fail_target_not_compiled(int64_t target_bit, const char* kernel) {
  throw Error(Error::Kind::Value,
              std::string(kernel) + ": no kernel compiled for SIMD target " + hwy::TargetName(target_bit));
}

}  // namespace multihead::detail
