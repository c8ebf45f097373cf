// bench/fma_peak.cpp: the machine's float32 FMA ceiling, in GFLOP/s.
//
// Each thread runs kChains independent chains of MulAdd on registers (no
// memory traffic) for a fixed number of iterations; FLOPs = 2·lanes per FMA.
// A core with 2 FMA pipes of latency 4 needs >= 8 independent chains in
// flight; we use 16 (issue "Fast": >= 12 were needed to reach the peak).
// Usage: multihead_fma_peak [--threads T] [--seconds S]
// Prints: fma_peak_gflops=X threads=T target=NAME per_core_gflops=Y
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/fma_peak.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace multihead_bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int kChains = 16;

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

}  // namespace HWY_NAMESPACE
}  // namespace multihead_bench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace multihead_bench {
HWY_EXPORT(FmaChains);
HWY_EXPORT(FlopsPerIteration);
}  // namespace multihead_bench

int main(int argc, char** argv) {
  int threads = omp_get_max_threads();
  double seconds = 0.5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[i + 1]);
  }
  const long flops_per_iteration = HWY_DYNAMIC_DISPATCH(multihead_bench::FlopsPerIteration)();
  // Calibrate the iteration count on one thread (~20 ms), then run all
  // threads together, best of several repetitions.
  long iterations = 1 << 20;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    volatile float sink = HWY_DYNAMIC_DISPATCH(multihead_bench::FmaChains)(iterations);
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
      volatile float sink = HWY_DYNAMIC_DISPATCH(multihead_bench::FmaChains)(iterations);
      (void)sink;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double flops =
        static_cast<double>(iterations) * static_cast<double>(flops_per_iteration) * threads;
    best = std::max(best, flops / s * 1e-9);
  }
  std::printf("fma_peak_gflops=%.1f threads=%d target=%s per_core_gflops=%.1f\n", best, threads,
              hwy::TargetName(hwy::SupportedTargets() & HWY_TARGETS & -(hwy::SupportedTargets() & HWY_TARGETS)),
              best / threads);
  return 0;
}
#endif  // HWY_ONCE
