// bench/bench_kernels.cpp: the attention kernels alone (no projections), in
// GFLOP/s counted as issue "Fast" counts them: 4·N·L·S·D for QKᵀ and PV, the
// full square also when causal. Per SIMD target and thread count:
//   Flash/<target>/L/causal/threads        src/kernels/flash.cpp
//   Flash16/<dtype>/<way>/L/causal/threads the same kernel (best target) on 16-bit
//                                          q, k, v and out (AttentionArgs::narrow):
//                                          bf16 by its fma and dpbf16 ways, f16;
//                                          what the 16-bit modules' attention runs.
//   Materialized/L/causal/threads          src/kernels/materialized.cpp (BLAS)
//   SgemmTiles/threads                     cblas_sgemm on one flash tile's two
//                                          products: the alternative we measured
//                                          against our own micro-kernels.
// N = 12 slices (B = 1, H = 12), D = Dv = 64, as (1, L, 768, 12).
//   FlashLayout/L/views/threads            the flash kernel (best target) on the
//                                          heads of a (L, 1, 3E) self-attention
//                                          projection, E = 1024, H = 16: read in
//                                          place (views = 1, rows 3E floats apart)
//                                          or from head-major copies (views = 0).
//                                          Why the fused form copies for S >= 2048
//                                          (src/attention/multihead_attention_forward.cpp).
//   DecodeCompressed/dtype/kv_heads/S/threads
//                                          one decode step's attention alone
//                                          (src/kernels/decode_compressed.cpp) over a
//                                          cache of S positions, H = 32, D = 128,
//                                          dtype 0..3 = f32, bf16, f16, int8, 4 = bf16
//                                          as a bf16 module reads it (its pair way
//                                          where bf16_dot_choice takes it): GB/s
//                                          of cache read (bytes per position as
//                                          KVCache::row_bytes counts them); read_GBs
//                                          a plain read of the same bytes right after
//                                          each call, of_read the kernel's share of it
//                                          (bench/bench_decode.py's rows add the
//                                          projections' weights).
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/gemm.hpp"
#include "kernels/kernel.hpp"
#include "multihead/narrow.hpp"
#include "multihead/runtime.hpp"
#include "simd/decode_compressed.hpp"
#include "simd/narrow_types.hpp"
#include "simd/targets.hpp"

namespace {

using multihead::detail::AttentionArgs;

struct Problem {
  std::vector<float> q, k, v, out;
  AttentionArgs<float> args;
  Problem(int64_t slices, int64_t L, int64_t D, bool causal, int threads) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    const auto fill = [&](std::vector<float>& x, int64_t n) {
      x.resize(static_cast<size_t>(n));
      for (float& e : x) e = normal(rng);
    };
    fill(q, slices * L * D);
    fill(k, slices * L * D);
    fill(v, slices * L * D);
    out.assign(static_cast<size_t>(slices * L * D), 0.0f);
    args.slices = slices;
    args.heads = slices;
    args.q_len = args.kv_len = L;
    args.head_dim = args.value_dim = D;
    args.q = q.data();
    args.k = k.data();
    args.v = v.data();
    args.out = out.data();
    args.modifiers.causal = {causal, multihead::CausalAlignment::TopLeft, 0, L};
    args.scale = 0.125f;
    args.num_threads = threads;
  }
  double flops() const {
    return 4.0 * static_cast<double>(args.slices) * static_cast<double>(args.q_len) *
           static_cast<double>(args.kv_len) * static_cast<double>(args.head_dim);
  }
};

void report(benchmark::State& state, double flops) {
  state.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Flash(benchmark::State& state, std::string target) {
  multihead::detail::simd_target_force(target);
  Problem p(12, state.range(0), 64, state.range(1) != 0, static_cast<int>(state.range(2)));
  multihead::detail::attention_forward_flash(p.args);  // warm-up: scratch, threads
  for (auto _ : state) {
    multihead::detail::attention_forward_flash(p.args);
    benchmark::DoNotOptimize(p.out.data());
  }
  report(state, p.flops());
  multihead::detail::simd_target_force("");
}

// The flash kernel on the same problem stored in 16 bits (the values
// rounded once), as the bf16 and f16 modules call it. way: "fma" or
// "dpbf16" (bf16 only, multihead::bf16_dot_force), "" for f16.
template <class E>
void BM_Flash16(benchmark::State& state, std::string way) {
  Problem p(12, state.range(0), 64, state.range(1) != 0, static_cast<int>(state.range(2)));
  const auto narrowed = [](const std::vector<float>& x) {
    std::vector<E> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = multihead::narrow_from_float<E>(x[i]);
    return y;
  };
  const std::vector<E> q = narrowed(p.q), k = narrowed(p.k), v = narrowed(p.v);
  std::vector<E> out(p.out.size());
  p.args.q = p.args.k = p.args.v = nullptr;
  p.args.out = nullptr;
  p.args.narrow = {std::is_same_v<E, multihead::bfloat16> ? multihead::ComputeDtype::BF16
                                                          : multihead::ComputeDtype::F16,
                   q.data(), k.data(), v.data(), out.data()};
  multihead::bf16_dot_force(way);
  multihead::detail::attention_forward_flash(p.args);  // warm-up: scratch, threads
  for (auto _ : state) {
    multihead::detail::attention_forward_flash(p.args);
    benchmark::DoNotOptimize(out.data());
  }
  report(state, p.flops());
  multihead::bf16_dot_force("");
}

// The flash backward (src/kernels/flash.cpp) on the same problem: d_q, d_k
// and d_v from d_out and the forward's lse. GFLOPs counts the backward's
// algorithmic products, 8·N·L·S·D (dV, dP, dQ, dK; the full square also
// when causal), as bench/bench_train_vs_pytorch.py does; the kernel also
// recomputes QKᵀ (2·N·L·S·D more).
void BM_FlashBackward(benchmark::State& state) {
  Problem p(12, state.range(0), 64, state.range(1) != 0, static_cast<int>(state.range(2)));
  const size_t n = p.q.size();
  std::vector<float> lse(static_cast<size_t>(p.args.slices * p.args.q_len)), d_out(n), d_q(n), d_k(n), d_v(n);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  for (float& e : d_out) e = normal(rng);
  p.args.lse = lse.data();
  multihead::detail::attention_forward_flash(p.args);
  multihead::detail::AttentionBackwardArgs<float> b;
  b.forward = p.args;
  b.forward.lse = nullptr;
  b.lse = lse.data();
  b.d_out = d_out.data();
  b.d_q = d_q.data();
  b.d_k = d_k.data();
  b.d_v = d_v.data();
  multihead::detail::attention_backward_flash(b);  // warm-up: scratch, threads
  for (auto _ : state) {
    multihead::detail::attention_backward_flash(b);
    benchmark::DoNotOptimize(d_q.data());
  }
  report(state, 2.0 * p.flops());
}

// The bf16 module's flash backward (narrow_multihead_attention_backward.cpp)
// at a training step's small shape, e.g. (8, 128, 512, 8): 64 slices of 128
// queries and keys, D 64, operands holding bf16 values (float32 copies),
// the float32 products (pairs 0) against the bf16 pair way (pairs 1,
// AttentionBackwardArgs::bf16_operands; float32 where this CPU's bf16
// forward does not run the pair way).
void BM_FlashBackwardBf16(benchmark::State& state) {
  Problem p(state.range(0), state.range(1), 64, false, static_cast<int>(state.range(3)));
  const auto to_bf16_values = [](std::vector<float>& x) {
    for (float& e : x) e = multihead::to_float(multihead::to_bfloat16(e));
  };
  to_bf16_values(p.q);
  to_bf16_values(p.k);
  to_bf16_values(p.v);
  const size_t n = p.q.size();
  std::vector<float> lse(static_cast<size_t>(p.args.slices * p.args.q_len)), d_out(n), d_q(n), d_k(n), d_v(n);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  for (float& e : d_out) e = normal(rng);
  to_bf16_values(d_out);
  p.args.lse = lse.data();
  multihead::detail::attention_forward_flash(p.args);
  to_bf16_values(p.out);
  multihead::detail::AttentionBackwardArgs<float> b;
  b.forward = p.args;
  b.forward.lse = nullptr;
  b.lse = lse.data();
  b.d_out = d_out.data();
  b.d_q = d_q.data();
  b.d_k = d_k.data();
  b.d_v = d_v.data();
  b.bf16_operands = state.range(2) != 0;
  multihead::detail::attention_backward_flash(b);  // warm-up: scratch, threads
  for (auto _ : state) {
    multihead::detail::attention_backward_flash(b);
    benchmark::DoNotOptimize(d_q.data());
  }
  report(state, 2.0 * p.flops());
}

void BM_Materialized(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(2));
  multihead::detail::set_blas_threads(threads);
  Problem p(12, state.range(0), 64, state.range(1) != 0, threads);
  multihead::detail::attention_forward_materialized(p.args);
  for (auto _ : state) {
    multihead::detail::attention_forward_materialized(p.args);
    benchmark::DoNotOptimize(p.out.data());
  }
  report(state, p.flops());
}

// One flash tile's products through BLAS: st = Q Kᵀ (64×128, inner 64) and
// o += P V (64×64, inner 128), repeated over many tiles on each thread with
// BLAS single-threaded inside (as it would have to be inside our OpenMP
// region). No softmax: this is an upper bound on the BLAS-tile variant.
void BM_SgemmTiles(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  constexpr int kQ = 64, kK = 128, kD = 64, kTiles = 64;
  openblas_set_num_threads(1);
  std::vector<float> q(kQ * kD, 0.5f), k(kTiles * kK * kD, 0.25f), v(kTiles * kK * kD, 0.25f);
  for (auto _ : state) {
#pragma omp parallel num_threads(threads)
    {
      std::vector<float> s(kQ * kK), o(kQ * kD, 0.0f);
      for (int t = 0; t < kTiles; ++t) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kQ, kK, kD, 1.0f, q.data(), kD,
                    k.data() + t * kK * kD, kD, 0.0f, s.data(), kK);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kQ, kD, kK, 1.0f, s.data(), kK,
                    v.data() + t * kK * kD, kD, 1.0f, o.data(), kD);
      }
      benchmark::DoNotOptimize(o.data());
    }
  }
  report(state, 4.0 * kQ * kK * kD * kTiles * threads);
}

void BM_FlashLayout(benchmark::State& state) {
  const int64_t L = state.range(0), H = 16, D = 64, E = H * D;
  const bool views = state.range(1) != 0;
  std::vector<float> qkv(static_cast<size_t>(L * 3 * E)), out(static_cast<size_t>(L * E));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& e : qkv) e = normal(rng);
  AttentionArgs<float> a;
  a.slices = a.heads = H;
  a.q_len = a.kv_len = L;
  a.head_dim = a.value_dim = D;
  a.scale = 0.125f;
  a.num_threads = static_cast<int>(state.range(2));
  a.out = out.data();
  if (views) {  // head h of token l at qkv[l·3E + part·E + h·D]; merged output
    a.q = qkv.data();
    a.k = qkv.data() + E;
    a.v = qkv.data() + 2 * E;
    a.q_layout = a.k_layout = a.v_layout = multihead::detail::SliceLayout{0, D, 3 * E};
    a.out_layout = multihead::detail::SliceLayout{0, D, E};
  } else {  // [part][h][l][d], the same values moved
    a.q = qkv.data();
    a.k = qkv.data() + L * E;
    a.v = qkv.data() + 2 * L * E;
  }
  multihead::detail::attention_forward_flash(a);
  for (auto _ : state) {
    multihead::detail::attention_forward_flash(a);
    benchmark::DoNotOptimize(out.data());
  }
  report(state, 4.0 * static_cast<double>(H * L) * static_cast<double>(L * D));
}

// The cache is filled with random values in its own type (no float32 copy);
// Hkv·S·D elements per K and V, 16 GiB at most (S <= 2^20 is the caller's).
void BM_DecodeCompressed(benchmark::State& state) {
  using multihead::KVCacheDType;
  namespace d = multihead::detail;
  constexpr KVCacheDType kDtypes[] = {KVCacheDType::Native, KVCacheDType::BFloat16, KVCacheDType::Float16,
                                      KVCacheDType::Int8, KVCacheDType::BFloat16};
  const KVCacheDType dtype = kDtypes[state.range(0)];
  const int64_t Hkv = state.range(1), S = state.range(2), H = 32, D = 128, blocks = d::int8_blocks(D);
  const int threads = static_cast<int>(state.range(3));
  const auto n = static_cast<size_t>(Hkv * S * D);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> f32_k, f32_v, k_scales, v_scales, q(static_cast<size_t>(H * D)), out(q.size());
  std::vector<uint16_t> bits_k, bits_v;
  std::vector<int8_t> i8_k, i8_v;
  for (float& e : q) e = normal(rng);
  d::CompressedKV kv;
  kv.dtype = dtype;
  kv.capacity = S;
  kv.bf16_module = state.range(0) == 4;
  switch (dtype) {
    case KVCacheDType::Native:
      f32_k.resize(n);
      f32_v.resize(n);
      for (size_t i = 0; i < n; ++i) f32_k[i] = normal(rng), f32_v[i] = normal(rng);
      kv.k = f32_k.data();
      kv.v = f32_v.data();
      break;
    case KVCacheDType::BFloat16:
    case KVCacheDType::Float16: {
      const bool bf = dtype == KVCacheDType::BFloat16;
      bits_k.resize(n);
      bits_v.resize(n);
      for (size_t i = 0; i < n; ++i) {
        const float a = normal(rng), b = normal(rng);
        bits_k[i] = bf ? d::float_to_bfloat16_bits(a) : d::float_to_float16_bits(a);
        bits_v[i] = bf ? d::float_to_bfloat16_bits(b) : d::float_to_float16_bits(b);
      }
      kv.k = bits_k.data();
      kv.v = bits_v.data();
      break;
    }
    case KVCacheDType::Int8: {
      i8_k.resize(n);
      i8_v.resize(n);
      std::uniform_int_distribution<int> q8(-127, 127);
      for (size_t i = 0; i < n; ++i) i8_k[i] = static_cast<int8_t>(q8(rng)), i8_v[i] = static_cast<int8_t>(q8(rng));
      k_scales.assign(static_cast<size_t>(Hkv * S * blocks), 1.0f / 127);
      v_scales.assign(k_scales.size(), 1.0f / 127);
      kv.k = i8_k.data();
      kv.v = i8_v.data();
      kv.k_scales = k_scales.data();
      kv.v_scales = v_scales.data();
      break;
    }
  }
  AttentionArgs<float> a;
  a.slices = a.heads = H;
  a.kv_heads = Hkv;
  a.q_len = 1;
  a.kv_len = S;
  a.head_dim = a.value_dim = D;
  a.q = q.data();
  a.out = out.data();
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  a.num_threads = threads;
  const int64_t row_bytes = dtype == KVCacheDType::Native ? 4 * D
                            : dtype == KVCacheDType::Int8 ? D + 4 * blocks
                                                          : 2 * D;
  // The same bytes read plainly (K, V and the int8 scales, each thread its share),
  // right after each kernel call: the bandwidth the kernel could reach at
  // that moment, so that of_read holds on a busy machine too. Between the two, a
  // pass over a buffer of 64 MiB (twice this host's L3 or more is the point)
  // evicts what the previous pass left in the cache.
  const size_t elem = dtype == KVCacheDType::Native ? 4 : dtype == KVCacheDType::Int8 ? 1 : 2;
  std::vector<std::pair<const void*, size_t>> parts = {{kv.k, n * elem}, {kv.v, n * elem}};
  if (dtype == KVCacheDType::Int8) {
    parts.emplace_back(kv.k_scales, k_scales.size() * sizeof(float));
    parts.emplace_back(kv.v_scales, v_scales.size() * sizeof(float));
  }
  std::vector<uint64_t> evict((64u << 20) / sizeof(uint64_t), 1);
  const auto read_all = [threads](const void* p, size_t bytes) {
    const auto* w = static_cast<const uint64_t*>(p);
    const auto words = static_cast<int64_t>(bytes / sizeof(uint64_t));
    uint64_t sum = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : sum) schedule(static)
    for (int64_t i = 0; i < words; ++i) sum += w[i];
    return sum;
  };
  d::attention_forward_compressed(a, kv);  // warm-up: threads
  double kernel_s = 0, read_s = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(read_all(evict.data(), evict.size() * sizeof(uint64_t)));
    const auto t0 = std::chrono::steady_clock::now();
    d::attention_forward_compressed(a, kv);
    benchmark::DoNotOptimize(out.data());
    const auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(read_all(evict.data(), evict.size() * sizeof(uint64_t)));
    const auto t2 = std::chrono::steady_clock::now();
    for (const auto& [p, bytes] : parts) benchmark::DoNotOptimize(read_all(p, bytes));
    const auto t3 = std::chrono::steady_clock::now();
    kernel_s += std::chrono::duration<double>(t1 - t0).count();
    read_s += std::chrono::duration<double>(t3 - t2).count();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  const double bytes = 2.0 * static_cast<double>(Hkv * S * row_bytes);
  state.counters["GBs"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["read_GBs"] = bytes * static_cast<double>(state.iterations()) / read_s * 1e-9;
  state.counters["of_read"] = read_s / kernel_s;
}

}  // namespace

int main(int argc, char** argv) {
  for (const std::string& target : multihead::detail::simd_targets_available()) {
    if (target == "SCALAR" || target == "EMU128" || target == "SSSE3") continue;  // minutes per run
    auto* b = benchmark::RegisterBenchmark(("Flash/" + target).c_str(), BM_Flash, target);
    b->ArgNames({"L", "causal", "threads"})->Unit(benchmark::kMillisecond)->UseRealTime();
    for (int64_t L : {512, 2048}) {
      for (int64_t causal : {0, 1}) {
        for (int64_t threads : {1, 2}) b->Args({L, causal, threads});
      }
    }
  }
  const std::pair<const char*, void (*)(benchmark::State&, std::string)> ways16[] = {
      {"bf16/fma", BM_Flash16<multihead::bfloat16>},
      {"bf16/dpbf16", BM_Flash16<multihead::bfloat16>},
      {"f16/-", BM_Flash16<multihead::float16>}};
  for (const auto& [name, fn] : ways16) {
    const std::string n(name), way = n.substr(n.find('/') + 1);
    auto* b = benchmark::RegisterBenchmark(("Flash16/" + n).c_str(), fn, way == "-" ? std::string() : way);
    b->ArgNames({"L", "causal", "threads"})->Unit(benchmark::kMillisecond)->UseRealTime();
    for (int64_t L : {512, 2048}) {
      for (int64_t causal : {0, 1}) {
        for (int64_t threads : {1, 2}) b->Args({L, causal, threads});
      }
    }
  }
  auto* fb = benchmark::RegisterBenchmark("FlashBackward", BM_FlashBackward);
  fb->ArgNames({"L", "causal", "threads"})->Unit(benchmark::kMillisecond)->UseRealTime();
  for (int64_t L : {1024, 2048}) {
    for (int64_t causal : {0, 1}) {
      for (int64_t threads : {1, 2}) fb->Args({L, causal, threads});
    }
  }
  auto* fb16 = benchmark::RegisterBenchmark("FlashBackwardBf16", BM_FlashBackwardBf16);
  fb16->ArgNames({"slices", "L", "pairs", "threads"})->Unit(benchmark::kMillisecond)->UseRealTime();
  for (int64_t pairs : {0, 1}) {
    for (int64_t threads : {1, 2}) fb16->Args({64, 128, pairs, threads});
  }
  fb16->Args({12, 1024, 0, 2})->Args({12, 1024, 1, 2});
  auto* m = benchmark::RegisterBenchmark("Materialized", BM_Materialized);
  m->ArgNames({"L", "causal", "threads"})->Unit(benchmark::kMillisecond)->UseRealTime();
  for (int64_t L : {512, 2048}) {
    for (int64_t threads : {1, 2}) m->Args({L, 0, threads});
  }
  benchmark::RegisterBenchmark("SgemmTiles", BM_SgemmTiles)
      ->ArgNames({"threads"})
      ->Arg(1)
      ->Arg(2)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  auto* f = benchmark::RegisterBenchmark("FlashLayout", BM_FlashLayout);
  f->ArgNames({"L", "views", "threads"})->Unit(benchmark::kMillisecond)->UseRealTime();
  for (int64_t L : {2048, 4096, 8192}) {
    for (int64_t views : {1, 0}) f->Args({L, views, 2});
  }
  auto* dc = benchmark::RegisterBenchmark("DecodeCompressed", BM_DecodeCompressed);
  dc->ArgNames({"dtype", "kv_heads", "S", "threads"})->Unit(benchmark::kMillisecond)->UseManualTime();
  for (int64_t dtype : {0, 1, 2, 3, 4}) {
    for (int64_t kv_heads : {32, 8, 1})
      for (int64_t threads : {1, 2}) dc->Args({dtype, kv_heads, 16384, threads});
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
