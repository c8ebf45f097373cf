// tests/memory/flash_backward_memory.cpp: the flash forward + backward at a
// long sequence, to show the backward never stores the L×S weights.
//
// Default shape: B = 1, H = 16, L = S = 16384, D = 64 (E = 1024). The
// inputs, the output, d_out and the three gradients are 8 tensors of
// N·L·D floats (64 MiB each at this shape, 512 MiB in all) plus lse (N·L);
// one L×S matrix would be 1 GiB per slice. Prints the shape, the time of
// each pass and the peak resident set (getrusage ru_maxrss), and fails if
// a gradient is not finite. scripts/check-flash-backward-memory.sh runs it
// and enforces the limit.
//
// Usage: multihead_flash_backward_memory [--len L] [--heads H] [--head-dim D]
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "kernels/kernel.hpp"

namespace {

// Cheap deterministic values in [-1, 1): 128 M of them must not take longer
// than the attention itself.
void fill(std::vector<float>& x, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& e : x) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    e = static_cast<float>(static_cast<int32_t>(s >> 32)) * 0x1.0p-31f;
  }
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

int64_t arg(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::strtoll(argv[i + 1], nullptr, 10);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) try {
  using namespace multihead;
  const int64_t L = arg(argc, argv, "--len", 16384), H = arg(argc, argv, "--heads", 16),
                D = arg(argc, argv, "--head-dim", 64);
  const int64_t N = H;  // B = 1
  const std::size_t elems = static_cast<std::size_t>(N * L * D);
  std::vector<float> q(elems), k(elems), v(elems), out(elems), d_out(elems), d_q(elems), d_k(elems), d_v(elems);
  std::vector<float> lse(static_cast<std::size_t>(N * L));
  fill(q, 1), fill(k, 2), fill(v, 3), fill(d_out, 4);

  detail::AttentionBackwardArgs<float> b;
  detail::AttentionArgs<float>& a = b.forward;
  a.slices = N, a.heads = H, a.q_len = L, a.kv_len = L, a.head_dim = D, a.value_dim = D;
  a.q = q.data(), a.k = k.data(), a.v = v.data(), a.out = out.data(), a.lse = lse.data();
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  b.lse = lse.data(), b.d_out = d_out.data(), b.d_q = d_q.data(), b.d_k = d_k.data(), b.d_v = d_v.data();

  const auto t0 = std::chrono::steady_clock::now();
  detail::attention_forward_flash(a);
  const auto t1 = std::chrono::steady_clock::now();
  detail::attention_backward_flash(b);
  const auto t2 = std::chrono::steady_clock::now();

  for (const std::vector<float>* g : {&d_q, &d_k, &d_v})
    for (float x : *g)
      if (!std::isfinite(x)) {
        std::fprintf(stderr, "flash_backward_memory: a gradient is not finite (%g)\n", static_cast<double>(x));
        return 1;
      }
  const double s_fwd = std::chrono::duration<double>(t1 - t0).count();
  const double s_bwd = std::chrono::duration<double>(t2 - t1).count();
  std::printf("shape B=1 H=%lld L=S=%lld D=%lld (E=%lld), inputs+outputs+gradients %.0f MiB\n",
              static_cast<long long>(H), static_cast<long long>(L), static_cast<long long>(D),
              static_cast<long long>(H * D), 8.0 * static_cast<double>(elems) * 4 / (1 << 20));
  std::printf("forward %.2f s, backward %.2f s\n", s_fwd, s_bwd);
  std::printf("peak_rss_mib %.1f\n", peak_rss_mib());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "flash_backward_memory: %s\n", e.what());
  return 1;
}
