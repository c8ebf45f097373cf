// tools/bench_command.cpp: `multihead bench`, the median time of repeated
// forward passes (eval, need_weights=False, self-attention; float32, or the
// 16-bit module with --dtype bf16|f16) after a warm-up. FLOPs counted as bench/bench_vs_pytorch.py counts them:
// projections 8·B·L·E², attention 4·B·L·S·E (the full square, also causal).
#include <algorithm>
#include <functional>
#include <optional>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "cli_manners.hpp"
#include "commands.hpp"
#include "validators.hpp"
#include "multihead/error.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/narrow_multihead_attention.hpp"
#include "multihead/runtime.hpp"

namespace multihead::cli {

Runner add_bench_command(CLI::App& app) {
  struct Args {
    int64_t batch = 1, seq_len = 1024, embed_dim = 768, num_heads = 12;
    bool causal = false, batch_first = false;
    int threads = 0, repeat = 7, warmup = 2;
    std::string kernel = "auto";
    std::string simd_target;
    std::string dtype = "f32";
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand("bench", "Time forward passes: median ms and GFLOP/s");
  c->add_option("--batch", a->batch, "B")->check(positive_integer());
  c->add_option("--seq-len", a->seq_len, "L (= S)")->check(positive_integer());
  c->add_option("--embed-dim", a->embed_dim, "E")->check(positive_integer());
  c->add_option("--num-heads", a->num_heads, "H")->check(positive_integer());
  c->add_flag("--causal", a->causal, "is_causal=True");
  c->add_flag("--batch-first", a->batch_first, "(B, L, E) inputs");
  c->add_option("--threads", a->threads, "Threads (0 = default)")->check(non_negative_integer());
  c->add_option("--repeat", a->repeat, "Timed runs (median reported)")->check(positive_integer());
  c->add_option("--warmup", a->warmup, "Untimed runs first")->check(non_negative_integer());
  c->add_option("--kernel", a->kernel, "auto, reference, materialized or flash")
      ->transform(one_of({"auto", "reference", "materialized", "flash"}));
  c->add_option("--simd-target", a->simd_target,
                "Force a SIMD target for the flash kernel (e.g. AVX3, AVX2, SSE4, SCALAR)");
  c->add_option("--dtype", a->dtype, "Compute type: f32, bf16 or f16 (NarrowMultiheadAttention)")
      ->transform(one_of({"f32", "bf16", "f16"}));
  return [a] {
    const ComputeDtype dtype = parse_compute_dtype(a->dtype, "--dtype");
    if (const std::string note = compute_dtype_note(dtype); !note.empty())
      std::fprintf(stderr, "multihead: note: --dtype %s: %s\n", a->dtype.c_str(), note.c_str());
    if (!a->simd_target.empty() && (a->kernel == "reference" || a->kernel == "materialized"))
      throw Error(Error::Kind::Value, "--simd-target: applies to the flash kernel only, got --kernel " + a->kernel);
    apply_threads(a->threads);
    if (!a->simd_target.empty()) {
      try {
        simd_target_force(a->simd_target);
      } catch (const Error& e) {
        // The flag, not the library function, is what the user typed.
        std::string why = e.what();
        const std::string function = "simd_target_force: ";
        if (why.rfind(function, 0) == 0) why.erase(0, function.size());
        throw Error(e.kind(), "--simd-target: " + why);
      }
    }
    MultiheadAttentionConfig config;
    config.embed_dim = a->embed_dim;
    config.num_heads = a->num_heads;
    config.batch_first = a->batch_first;
    const MultiheadAttention mha(config, 1);
    const Shape shape = a->batch_first ? Shape{a->batch, a->seq_len, a->embed_dim}
                                       : Shape{a->seq_len, a->batch, a->embed_dim};
    Tensor<float> x(shape);
    std::mt19937 rng(3);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (float& v : x.vec()) v = n(rng);
    ForwardOptions<float> o;
    o.need_weights = false;
    o.attention.is_causal = a->causal;
    o.attention.kernel = parse_attention_kernel(a->kernel);
    o.attention.num_threads = a->threads;
    // One forward pass in the chosen type (16-bit: the module and input
    // rounded once, outside the timing).
    std::function<void()> run = [&] { (void)mha.forward(x, x, x, o); };
    std::optional<NarrowMultiheadAttention<bfloat16>> m_bf16;
    std::optional<NarrowMultiheadAttention<float16>> m_f16;
    Tensor<bfloat16> x_bf16;
    Tensor<float16> x_f16;
    if (dtype == ComputeDtype::BF16) {
      m_bf16.emplace(NarrowMultiheadAttention<bfloat16>::rounded(config, mha.parameters()));
      x_bf16 = round_to<bfloat16>(x);
      run = [&] { (void)m_bf16->forward(x_bf16, x_bf16, x_bf16, o); };
    } else if (dtype == ComputeDtype::F16) {
      m_f16.emplace(NarrowMultiheadAttention<float16>::rounded(config, mha.parameters()));
      x_f16 = round_to<float16>(x);
      run = [&] { (void)m_f16->forward(x_f16, x_f16, x_f16, o); };
    }
    for (int i = 0; i < a->warmup; ++i) run();
    std::vector<double> ms;
    for (int i = 0; i < a->repeat; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      run();
      const auto t1 = std::chrono::steady_clock::now();
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    const double B = static_cast<double>(a->batch), L = static_cast<double>(a->seq_len),
                 E = static_cast<double>(a->embed_dim);
    const double flops = 8 * B * L * E * E + 4 * B * L * L * E;
    std::printf("bench B=%lld L=%lld E=%lld H=%lld causal=%d threads=%d blas_threads=%d kernel=%s simd=%s dtype=%s\n",
                static_cast<long long>(a->batch), static_cast<long long>(a->seq_len),
                static_cast<long long>(a->embed_dim), static_cast<long long>(a->num_heads),
                a->causal ? 1 : 0, a->threads > 0 ? a->threads : multihead::threads(),
                blas_threads(), a->kernel.c_str(), simd_target_current().c_str(), to_string(dtype).c_str());
    std::printf("median_ms=%.4f gflops=%.2f min_ms=%.4f max_ms=%.4f runs=%d\n", median,
                flops / (median * 1e6), ms.front(), ms.back(), a->repeat);
  };
}

}  // namespace multihead::cli
