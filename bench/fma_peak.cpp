// bench/fma_peak.cpp: the machine's float32 FMA ceiling, in GFLOP/s.
//
// Each thread runs kChains independent chains of MulAdd on registers (no
// memory traffic) for a fixed number of iterations; FLOPs = 2·lanes per FMA.
// A core with 2 FMA pipes of latency 4 needs >= 8 independent chains in
// flight (issue "Fast": >= 12 were needed to reach the peak on AVX-512).
// Every chain must stay in a register: AVX-512 has 32 vector registers, so
// 16 chains fit; AVX2 and SSE have 16, and 16 chains plus the two operands
// spill, turning each chain into a store-to-load round trip that halves the
// rate (measured: 55 against 111 GFLOP/s per Zen 4 core). There we use 12.
//
// Then, in the same run, the two 16-bit peaks and the memory ceiling:
//  - vdpbf16ps (AVX512_BF16: 32 bf16 pairs into 16 float32 lanes, each lane
//    2 multiply-adds = 4 FLOPs, 64 per instruction), through the intrinsic
//    behind a CPUID check (Highway 1.0's ReorderWidenMulAccumulate does not
//    emit it);
//  - fp16 FMA (AVX512_FP16 vfmadd…ph, 32 lanes, 64 FLOPs per instruction),
//    or "not available on this CPU";
//  - read bandwidth over a buffer of at least 4x the last-level cache (all
//    L3 instances summed, from /sys/devices/system/cpu/cpu*/cache/index3, or
//    sysconf(_SC_LEVEL3_CACHE_SIZE)), all threads, best of 5 passes.
// Usage: multihead_fma_peak [--threads T] [--seconds S] [--buffer-mib M]
//   (--buffer-mib: the bandwidth buffer; default max(4 x L3, 256 MiB))
// Prints:
//   fma_peak_gflops=X threads=T target=NAME per_core_gflops=Y
//   bf16_dot_peak_gflops=X instruction=vdpbf16ps      (or =n/a ... not available on this CPU)
//   fp16_fma_peak_gflops=X instruction=vfmadd231ph    (or =n/a ... not available on this CPU)
//   l3_bytes=N l3_instances=K
//   read_bandwidth_gbs=X buffer_bytes=N threads=T
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/fma_peak.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace multihead_bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET <= HWY_AVX3
constexpr int kChains = 16;  // 32 zmm registers
#else
constexpr int kChains = 12;  // 16 registers: 12 chains + the 2 operands
#endif

// Returns a value depending on every chain so nothing is optimised away.
// FLOPs performed: iterations · kChains · 2 · lanes.
float FmaChains(long iterations) {
  const hn::ScalableTag<float> d;
  const auto a = hn::Set(d, 0.999999f);
  const auto b = hn::Set(d, 1e-7f);
  hn::Vec<decltype(d)> acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = hn::Set(d, static_cast<float>(c));
  for (long i = 0; i < iterations; ++i) {
    HWY_UNROLL(16)
    for (int c = 0; c < kChains; ++c) acc[c] = hn::MulAdd(acc[c], a, b);
  }
  auto sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = hn::Add(sum, acc[c]);
  return hn::GetLane(sum);
}
long FlopsPerIteration() {
  return kChains * 2 * static_cast<long>(hn::Lanes(hn::ScalableTag<float>()));
}

// Σ of n floats with 8 independent accumulators (a read stream, no stores).
float ReadSum(const float* p, long n) {
  const hn::ScalableTag<float> d;
  const long N = static_cast<long>(hn::Lanes(d));
  hn::Vec<decltype(d)> acc[8];
  for (auto& a : acc) a = hn::Zero(d);
  long i = 0;
  for (; i + 8 * N <= n; i += 8 * N) {
    HWY_UNROLL(8)
    for (int c = 0; c < 8; ++c) acc[c] = hn::Add(acc[c], hn::LoadU(d, p + i + c * N));
  }
  float tail = 0;
  for (; i < n; ++i) tail += p[i];
  for (int c = 1; c < 8; ++c) acc[0] = hn::Add(acc[0], acc[c]);
  return hn::GetLane(hn::SumOfLanes(d, acc[0])) + tail;
}

}  // namespace HWY_NAMESPACE
}  // namespace multihead_bench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace multihead_bench {
HWY_EXPORT(FmaChains);
HWY_EXPORT(FlopsPerIteration);
HWY_EXPORT(ReadSum);

// ---- the 16-bit peaks (x86 intrinsics behind CPUID) ------------------------

#if defined(__x86_64__)
bool cpu_has(unsigned leaf, unsigned subleaf, int reg, unsigned bit) {
  unsigned r[4] = {0, 0, 0, 0};
  if (!__get_cpuid_count(leaf, subleaf, &r[0], &r[1], &r[2], &r[3])) return false;
  return (r[reg] >> bit) & 1u;
}
// CPUID.(7,1):EAX[5] AVX512_BF16; CPUID.(7,0):EDX[23] AVX512_FP16; both
// need AVX512F (7,0):EBX[16] (the OS's zmm state: Highway's AVX3 check).
bool has_avx512_bf16() { return cpu_has(7, 0, 1, 16) && cpu_has(7, 1, 0, 5); }
bool has_avx512_fp16() { return cpu_has(7, 0, 1, 16) && cpu_has(7, 0, 3, 23); }

constexpr int kChains16 = 16;

__attribute__((target("avx512f,avx512bf16"))) float Bf16DotChains(long iterations) {
  __m512 acc[kChains16];
  for (int c = 0; c < kChains16; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-4f), _mm512_set1_ps(1e-4f));
  for (long i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains16; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains16; ++c) sum = _mm512_add_ps(sum, acc[c]);
  alignas(64) float lanes[16];  // not _mm512_reduce_add_ps: gcc 12's header trips -Wuninitialized
  _mm512_store_ps(lanes, sum);
  float total = 0;
  for (float x : lanes) total += x;
  return total;
}
constexpr long kBf16FlopsPerIteration = kChains16 * 64;

#if (defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12) || (defined(__clang__) && __clang_major__ >= 16)
#define MULTIHEAD_BENCH_HAS_FP16 1
__attribute__((target("avx512f,avx512fp16"))) float Fp16FmaChains(long iterations) {
  __m512h acc[kChains16];
  for (int c = 0; c < kChains16; ++c) acc[c] = _mm512_set1_ph(static_cast<_Float16>(c));
  const __m512h a = _mm512_set1_ph(static_cast<_Float16>(0.999f)), b = _mm512_set1_ph(static_cast<_Float16>(1e-3f));
  for (long i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains16; ++c) acc[c] = _mm512_fmadd_ph(acc[c], a, b);
  }
  __m512h sum = acc[0];
  for (int c = 1; c < kChains16; ++c) sum = _mm512_add_ph(sum, acc[c]);
  _Float16 lanes[32];
  _mm512_storeu_ph(lanes, sum);
  float total = 0;
  for (_Float16 x : lanes) total += static_cast<float>(x);
  return total;
}
constexpr long kFp16FlopsPerIteration = kChains16 * 64;
#endif
#endif  // __x86_64__

// ---- the last-level cache ----------------------------------------------------

struct L3Size {
  long bytes = 0;
  int instances = 0;
};

// Every distinct L3 (by the CPUs sharing it) of /sys, summed; else
// sysconf's (one instance).
L3Size l3_size() {
  L3Size l3;
  std::set<std::string> seen;
  const long cpus = sysconf(_SC_NPROCESSORS_CONF);
  for (long cpu = 0; cpu < cpus; ++cpu) {
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/cache/index3/";
    std::ifstream size_file(dir + "size"), shared_file(dir + "shared_cpu_list");
    std::string size, shared;
    if (!(size_file >> size) || !(shared_file >> shared) || !seen.insert(shared).second) continue;
    long value = std::atol(size.c_str());
    if (size.back() == 'K') value *= 1024;
    if (size.back() == 'M') value *= 1024 * 1024;
    l3.bytes += value;
    ++l3.instances;
  }
  if (l3.bytes == 0) {
    l3.bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
    l3.instances = l3.bytes > 0 ? 1 : 0;
  }
  return l3;
}

}  // namespace multihead_bench

namespace {

// `kernel(iterations)` on every thread at once, best GFLOP/s of 5 after a
// one-thread calibration of ~seconds / 5 per repetition.
double peak_gflops(const std::function<float(long)>& kernel, long flops_per_iteration, int threads, double seconds) {
  long iterations = 1 << 16;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    volatile float sink = kernel(iterations);
    (void)sink;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0.02) {
      iterations = static_cast<long>(static_cast<double>(iterations) * (seconds / 5) / s) + 1;
      break;
    }
    iterations *= 2;
  }
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    {
      volatile float sink = kernel(iterations);
      (void)sink;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(iterations) * static_cast<double>(flops_per_iteration) * threads / s * 1e-9);
  }
  return best;
}

// GB/s reading `bytes` (every thread its own contiguous part; first touch
// by the same threads), best of 5 passes after one warm-up pass.
double read_bandwidth(long bytes, int threads) {
  const long n = bytes / static_cast<long>(sizeof(float));
  float* buffer = static_cast<float*>(std::aligned_alloc(64, static_cast<std::size_t>(n) * sizeof(float)));
  if (buffer == nullptr) return 0;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (long i = 0; i < n; ++i) buffer[i] = 1.0f;
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    {
      const long t = omp_get_thread_num(), parts = omp_get_num_threads();
      const long begin = n * t / parts, end = n * (t + 1) / parts;
      volatile float sink = HWY_DYNAMIC_DISPATCH(multihead_bench::ReadSum)(buffer + begin, end - begin);
      (void)sink;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::max(best, static_cast<double>(n) * sizeof(float) / s * 1e-9);
  }
  std::free(buffer);
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = omp_get_max_threads();
  double seconds = 0.5;
  long buffer_mib = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[i + 1]);
    else if (std::strcmp(argv[i], "--buffer-mib") == 0) buffer_mib = std::atol(argv[i + 1]);
  }
  const long flops_per_iteration = HWY_DYNAMIC_DISPATCH(multihead_bench::FlopsPerIteration)();
  const double best = peak_gflops([](long n) { return HWY_DYNAMIC_DISPATCH(multihead_bench::FmaChains)(n); },
                                  flops_per_iteration, threads, seconds);
  std::printf("fma_peak_gflops=%.1f threads=%d target=%s per_core_gflops=%.1f\n", best, threads,
              hwy::TargetName(hwy::SupportedTargets() & HWY_TARGETS & -(hwy::SupportedTargets() & HWY_TARGETS)),
              best / threads);

#if defined(__x86_64__)
  if (multihead_bench::has_avx512_bf16()) {
    std::printf("bf16_dot_peak_gflops=%.1f instruction=vdpbf16ps threads=%d (4 FLOPs per float32 lane)\n",
                peak_gflops(multihead_bench::Bf16DotChains, multihead_bench::kBf16FlopsPerIteration, threads, seconds),
                threads);
  } else {
    std::printf("bf16_dot_peak_gflops=n/a instruction=vdpbf16ps: AVX512_BF16 not available on this CPU\n");
  }
#if defined(MULTIHEAD_BENCH_HAS_FP16)
  if (multihead_bench::has_avx512_fp16()) {
    std::printf("fp16_fma_peak_gflops=%.1f instruction=vfmadd231ph threads=%d\n",
                peak_gflops(multihead_bench::Fp16FmaChains, multihead_bench::kFp16FlopsPerIteration, threads, seconds),
                threads);
  } else {
    std::printf("fp16_fma_peak_gflops=n/a instruction=vfmadd231ph: AVX512_FP16 not available on this CPU\n");
  }
#else
  std::printf("fp16_fma_peak_gflops=n/a: this compiler has no AVX512_FP16 intrinsics\n");
#endif
#else
  std::printf("bf16_dot_peak_gflops=n/a: not an x86-64 CPU\nfp16_fma_peak_gflops=n/a: not an x86-64 CPU\n");
#endif

  const multihead_bench::L3Size l3 = multihead_bench::l3_size();
  std::printf("l3_bytes=%ld l3_instances=%d\n", l3.bytes, l3.instances);
  const long buffer = buffer_mib > 0 ? buffer_mib << 20 : std::max(4 * l3.bytes, 256L << 20);
  std::printf("read_bandwidth_gbs=%.1f buffer_bytes=%ld threads=%d%s\n", read_bandwidth(buffer, threads), buffer,
              threads, buffer < 4 * l3.bytes ? " (smaller than 4 x L3: not a memory measurement)" : "");
  return 0;
}
#endif  // HWY_ONCE
