// tools/decode_command.cpp: `multihead decode`, incremental decoding with a
// KV cache through the grouped-query module (multihead/grouped_query_attention.hpp).
//
// There is no vocabulary here (this is one attention layer, not a language
// model), so each step feeds its output vector back as the next input
// embedding: the prompt is run once (prefill, P positions, filling the
// cache), then step t = 0 … N − 1 runs one token at position P + t whose
// input is the previous output (for t = 0, the prompt's last output row).
// Tokens/s is batch / the median step time; the prefill is timed apart.
//
// --dtype bf16 / f16 runs the 16-bit module (NarrowGroupedQueryAttention<E>,
// multihead/narrow_grouped_query_attention.hpp): its weights are the
// float32 ones (seeded, or read from --weights) rounded once to E, as
// `.to(torch.bfloat16)` rounds a module; the prompt is rounded to E on the
// way in, each step's 16-bit output is the next input as it is, and --out
// widens the generated vectors to float32 (exactly). A decode step then
// reads 2 bytes per weight instead of 4 (core/narrow_gemv.hpp: the
// projections read W in 16 bits).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "checkpoint_hints.hpp"
#include "cli_manners.hpp"
#include "commands.hpp"
#include "file_flags.hpp"
#include "gqa_cli.hpp"
#include "validators.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"
#include "multihead/narrow_grouped_query_attention.hpp"
#include "multihead/narrow_multihead_attention.hpp"
#include "multihead/runtime.hpp"

namespace multihead::cli {
namespace {

constexpr KVCacheDType kCacheDTypes[] = {KVCacheDType::Native, KVCacheDType::BFloat16, KVCacheDType::Float16,
                                         KVCacheDType::Int8};

struct DecodeArgs {
  std::string weights, prefix, prompt, out, kernel = "auto", cache_dtype = "f32", dtype = "f32";
  std::optional<int64_t> num_heads, embed_dim, head_dim, prompt_len, max_len, window;
  std::optional<double> softcap;
  int64_t batch = 1, tokens = 0;
  uint64_t seed = 0;
  bool grow = false, alibi = false, bias = false;
  int threads = 0;
  GqaFlags gqa;
};

[[noreturn]] void fail(const std::string& message) { throw Error(Error::Kind::Value, message); }

// `stored` receives --weights' parameter dtype (nullopt for random weights).
// With --weights the file's shapes give the sizes.
void check_weights_flags(const DecodeArgs& a) {
  for (const auto& [flag, given] : {std::pair{"--embed-dim", a.embed_dim.has_value()},
                                    {"--head-dim", a.head_dim.has_value()}})
    if (given) fail(std::string(flag) + ": not used with --weights (the weights' shapes give it)");
}

GroupedQueryAttention<float> make_module(const DecodeArgs& a, std::optional<DType>& stored) {
  stored.reset();
  if (!a.weights.empty()) {
    check_weights_flags(a);
    return load_gqa<float>(a.weights, a.prefix, a.num_heads, a.gqa, true, &stored);
  }
  if (!a.embed_dim || !a.num_heads)
    fail("--weights: expected a weights file, or --embed-dim and --num-heads for seeded random weights");
  if (!a.head_dim && *a.embed_dim % *a.num_heads != 0)
    fail("--num-heads: " + std::to_string(*a.num_heads) + " does not divide --embed-dim " +
         std::to_string(*a.embed_dim) + " (or give --head-dim)");
  const int64_t D = a.head_dim.value_or(*a.embed_dim / *a.num_heads);
  return GroupedQueryAttention<float>(gqa_config(*a.embed_dim, *a.num_heads, D, a.gqa, a.bias, true), a.seed);
}

Tensor<float> make_prompt(const DecodeArgs& a, int64_t E) {
  if (!a.prompt.empty()) {
    if (a.prompt_len) fail("--prompt-len: not used with --prompt (the file gives the length)");
    const LoadedTensor t = read_npy(a.prompt, "prompt");
    if (t.dtype == DType::Bool)  // '|b1' or '|u1', which the reader decodes as mask values
      fail("prompt: expected dtype float32, float64 or float16, got a boolean or uint8 array (" + a.prompt + ")");
    Tensor<float> x = tensor_cast<float>(t.values);
    if ((x.dim() != 2 && x.dim() != 3) || x.size(-1) != E || x.size(-2) < 1 || (x.dim() == 3 && x.size(0) < 1))
      throw Error(Error::Kind::Shape, "prompt: expected (L, " + std::to_string(E) + ") or (B, L, " +
                                          std::to_string(E) + ") with B, L >= 1, got " + shape_to_string(x.shape()));
    if (x.dim() == 2) {
      const int64_t L = x.size(0);
      x = std::move(x).reshaped({1, L, E});
    }
    return x;
  }
  if (!a.prompt_len) fail("--prompt: expected a prompt file, or --prompt-len for a seeded random prompt");
  check_fits_in_memory("--prompt-len", "a random prompt of batch " + std::to_string(a.batch) + " x " +
                                           std::to_string(*a.prompt_len) + " tokens x embed_dim " + std::to_string(E),
                       4.0 * static_cast<double>(a.batch) * static_cast<double>(*a.prompt_len) * static_cast<double>(E));
  Tensor<float> x(Shape{a.batch, *a.prompt_len, E});
  std::mt19937_64 rng(a.seed + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t e = 0; e < x.numel(); ++e) x[e] = normal(rng);
  return x;
}

// --cache-dtype's values (one_of has checked the name), the library's names.
KVCacheDType parse_cache_dtype(const std::string& name) {
  for (const KVCacheDType d : kCacheDTypes)
    if (name == kv_cache_dtype_name(d)) return d;
  fail("--cache-dtype: expected one of f32, bf16, f16, int8; got " + name);
}

// The longest cache a run may ask for (the library's KVCache limit, and
// --max-len's): positions 1 to 2^40.
constexpr int64_t kMaxCacheLen = int64_t{1} << 40;

// The library names the cache's length max_len; here it is --max-len, or
// "the prompt and --tokens" when --max-len was not given (`length_flag`).
[[noreturn]] void rethrow_as_flag(const Error& e, const std::string& length_flag) {
  const std::string what = e.what();
  if (what.rfind("max_len: ", 0) == 0) throw Error(e.kind(), length_flag + ": " + what.substr(9));
  throw e;
}

// The cache, refused before any allocation when it cannot fit in memory
// (the library's check); an allocation that fails anyway (a ulimit below
// the machine's memory) names the flag and the bytes too.
template <class Module>
KVCache<float> make_cache(const Module& m, int64_t batch, int64_t max_len, bool grow, KVCacheDType dtype,
                          const std::string& length_flag) {
  try {
    return m.make_cache(batch, max_len, grow, dtype);
  } catch (const Error& e) {
    rethrow_as_flag(e, length_flag);
  } catch (const std::bad_alloc&) {
    char msg[96];
    std::snprintf(msg, sizeof msg, "%.0f bytes",
                  KVCache<float>::bytes_for(batch, m.kv_heads(), m.head_dim(), max_len, dtype));
    fail(length_flag + ": a KV cache of " + std::to_string(max_len) + " positions needs " + msg +
         ", and allocating them failed: out of memory");
  }
}

// The prompt in the module's element type T (float32 as read, or rounded
// once to 16 bits), and the generated vectors back to float32 (exact).
template <class T>
Tensor<T> to_module_type(Tensor<float> x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return round_to<T>(x, "prompt");
}
template <class T>
Tensor<float> to_float32(Tensor<T> x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return widen<float>(x);
}

// The weights' bytes as the module stores them: what a decode step reads.
template <class Module>
int64_t weight_bytes(const Module& m) {
  int64_t bytes = 0;
  for (const auto& [name, t] : m.state_dict())
    bytes += t.numel() * static_cast<int64_t>(sizeof(*t.data()));
  return bytes;
}

// T: the module's element type (float, bfloat16, float16).
template <class T, class Module>
void run_decode(const DecodeArgs& a, const Module& m) {
  const int64_t E = m.config().embed_dim;
  const Tensor<T> prompt = to_module_type<T>(make_prompt(a, E));
  const int64_t B = prompt.size(0), P = prompt.size(1), N = a.tokens;  // each at most 2^40: no overflow below
  if (!a.max_len && P + N > kMaxCacheLen)
    fail("--tokens: the prompt (" + std::to_string(P) + ") and --tokens " + std::to_string(N) + " need a cache of " +
         std::to_string(P + N) + " positions, beyond the 2^40 a cache may hold");
  const int64_t max_len = a.max_len.value_or(P + N);
  const std::string length_flag = a.max_len ? "--max-len" : "--tokens (with the prompt)";
  if (max_len < P + N && !a.grow)
    fail("--max-len: the cache holds " + std::to_string(max_len) + " tokens, but the prompt (" + std::to_string(P) +
         ") and --tokens " + std::to_string(N) + " need " + std::to_string(P + N) +
         " (raise --max-len or add --grow)");
  AttentionOptions o;
  o.window = a.window;
  o.softcap = a.softcap;
  if (a.alibi) o.alibi_slopes = alibi_slopes(m.config().num_heads);
  o.kernel = parse_attention_kernel(a.kernel);
  o.num_threads = a.threads;
  KVCache<float> cache = make_cache(m, B, max_len, a.grow, parse_cache_dtype(a.cache_dtype), length_flag);

  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  // With --grow the cache may grow past the machine's memory: that Error
  // names max_len too.
  auto forward = [&](const Tensor<T>& x) {
    try {
      return m.forward(x, o, &cache);
    } catch (const Error& e) {
      rethrow_as_flag(e, length_flag);
    }
  };
  const Tensor<T> prefill = forward(prompt);
  const auto t1 = clock::now();
  // Step t's input: the previous output row (B, 1, E).
  Tensor<T> x(Shape{B, 1, E});
  for (int64_t b = 0; b < B; ++b) std::copy_n(prefill.data() + (b * P + P - 1) * E, E, x.data() + b * E);
  Tensor<T> generated(Shape{B, N, E});
  std::vector<double> step_s(static_cast<std::size_t>(N));
  for (int64_t t = 0; t < N; ++t) {
    const auto s0 = clock::now();
    x = forward(x);
    step_s[static_cast<std::size_t>(t)] = std::chrono::duration<double>(clock::now() - s0).count();
    for (int64_t b = 0; b < B; ++b) std::copy_n(x.data() + b * E, E, generated.data() + (b * N + t) * E);
  }
  const double prefill_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  // The median step: the first steps pay one-time costs (threads, BLAS
  // setup) that a long generation does not.
  std::sort(step_s.begin(), step_s.end());
  const double median_s = N == 0 ? 0.0 : N % 2 ? step_s[N / 2] : 0.5 * (step_s[N / 2 - 1] + step_s[N / 2]);

  if (!a.out.empty()) write_outputs({{{"--out", a.out}, serialize_npy(to_float32(generated))}});
  std::FILE* report = a.out == "-" ? stderr : stdout;
  std::fprintf(report,
               "multihead decode: %lld tokens x batch %lld after a %lld-token prompt: %.1f tokens/s (median step "
               "%.3f ms; prefill %.3f ms); KV cache %lld bytes (%lld of %lld positions, %lld K/V heads x head_dim "
               "%lld, %s); weights %s, %lld bytes; embed_dim %lld, num_heads %lld, kernel %s, threads %d\n",
               static_cast<long long>(N), static_cast<long long>(B), static_cast<long long>(P),
               median_s > 0 ? static_cast<double>(B) / median_s : 0.0, median_s * 1e3, prefill_ms, static_cast<long long>(cache.bytes()), static_cast<long long>(cache.length()),
               static_cast<long long>(cache.capacity()), static_cast<long long>(m.kv_heads()),
               static_cast<long long>(m.head_dim()), a.cache_dtype.c_str(), a.dtype.c_str(),
               static_cast<long long>(weight_bytes(m)), static_cast<long long>(E),
               static_cast<long long>(m.config().num_heads), a.kernel.c_str(), a.threads);
}

// The 16-bit module: --weights read straight into E (load_gqa_narrow), or
// make_module's seeded random parameters rounded once to E (the float32
// module is freed on return).
template <class E>
NarrowGroupedQueryAttention<E> make_narrow_module(const DecodeArgs& a, std::optional<DType>& stored) {
  if (!a.weights.empty()) {
    check_weights_flags(a);
    return load_gqa_narrow<E>(a.weights, a.prefix, a.num_heads, a.gqa, true, &stored);
  }
  const GroupedQueryAttention<float> m = make_module(a, stored);
  return NarrowGroupedQueryAttention<E>::rounded(m.config(), m.parameters());
}

// --dtype: the float32 module, or its parameters rounded once to 16 bits.
// The notes `multihead forward` prints, after the run (so that a failed run
// prints one line): the compute path (compute_dtype_note), then how
// --weights' dtype met the compute type.
void run_decode(const DecodeArgs& a) {
  const ComputeDtype dtype = parse_compute_dtype(a.dtype, "--dtype");
  if (dtype != ComputeDtype::F32 && a.kernel != "auto" && a.kernel != "flash")
    fail("--kernel: " + a.kernel + " is not available with --dtype " + a.dtype +
         " (the 16-bit module runs the flash kernel on the prompt and the decode kernel on each step: auto or "
         "flash)");
  std::optional<DType> stored;
  if (dtype == ComputeDtype::F32) run_decode<float>(a, make_module(a, stored));
  else if (dtype == ComputeDtype::BF16) run_decode<bfloat16>(a, make_narrow_module<bfloat16>(a, stored));
  else run_decode<float16>(a, make_narrow_module<float16>(a, stored));
  print_notes(dtype_notes(dtype, a.dtype, stored, "float32", !a.weights.empty()));
}

}  // namespace

Runner add_decode_command(CLI::App& app) {
  auto a = std::make_shared<DecodeArgs>();
  CLI::App* c = app.add_subcommand(
      "decode", "Generate tokens with a KV cache (grouped-query module): tokens/s and cache bytes");
  c->footer(
      "There is no vocabulary: the prompt is run once (prefill), then each step feeds its output vector back as "
      "the next input embedding, one token per step. Tokens/s is batch / the median step; the report goes to "
      "standard output (standard error with --out -). docs/decoding.md has the cache's rules.");
  c->add_option("--weights", a->weights,
                "safetensors with q_proj/k_proj/v_proj/o_proj.weight (+ .bias), as `multihead init "
                "--num-kv-heads` writes; omit for seeded random weights (--embed-dim, --num-heads, --seed)")
      ->check(path());
  c->add_option("--prefix", a->prefix, "Module inside a whole model's file, e.g. model.layers.0.self_attn.");
  c->add_option("--embed-dim", a->embed_dim, "Random weights: embed_dim")->check(positive_integer());
  c->add_option("--num-heads", a->num_heads, "Query heads (overrides the weights' metadata)")
      ->check(positive_integer());
  c->add_option("--head-dim", a->head_dim, "Random weights: head width (default embed_dim / num_heads)")
      ->check(positive_integer());
  c->add_flag("--bias", a->bias, "Random weights: with projection biases (Llama has none)");
  c->add_option("--seed", a->seed, "Seed of the random weights and the random prompt")->check(unsigned_integer());
  add_gqa_flags(*c, a->gqa, "K/V heads (divides the heads; 1 = multi-query; default: from the weights' metadata or k_proj.weight; random weights: the heads)");
  c->add_option("--prompt", a->prompt, ".npy prompt embeddings (L, E) or (B, L, E)")->check(path());
  c->add_option("--prompt-len", a->prompt_len, "A seeded random prompt of this many tokens instead of --prompt")
      ->check(integer_in(1, kMaxCacheLen, "a prompt of 1 to 2^40 tokens"));
  c->add_option("--batch", a->batch, "Sequences decoded together, with --prompt-len (default 1)")
      ->check(positive_integer());
  c->add_option("--tokens", a->tokens, "Tokens to generate")
      ->required()
      ->check(integer_in(0, kMaxCacheLen, "0 to 2^40 tokens"));
  c->add_option("--max-len", a->max_len, "Cache length, preallocated (default: prompt + tokens)")
      ->check(integer_in(1, kMaxCacheLen, "a cache length of 1 to 2^40 tokens"));
  c->add_flag("--grow", a->grow,
              "Let the cache grow when full instead of failing: to max(2 x capacity, positions needed)");
  c->add_option("--window", a->window, "Sliding window: each token sees its own and the W-1 previous positions")
      ->check(integer_in(1, int64_t{1} << 40, "a window of 1 to 2^40 keys"));
  c->add_option("--softcap", a->softcap, "Logit soft-cap C: scores become C*tanh(score/C)")->check(positive_number());
  c->add_flag("--alibi", a->alibi, "ALiBi position biases with the paper's per-head slopes");
  c->add_option("--kernel", a->kernel,
                "auto (decode steps: the decode kernel of every --cache-dtype; the prompt: flash), reference, "
                "materialized or flash (f32 cache only)")
      ->transform(one_of({"auto", "reference", "materialized", "flash"}));
  c->add_option("--cache-dtype", a->cache_dtype,
                "K/V cache element type: f32, bf16 (2 bytes), f16 (2 bytes, |x| <= 65504) or int8 (1 byte + a float "
                "scale per 32 values); docs/decoding.md gives each one's error bound")
      ->transform(one_of({"f32", "bf16", "f16", "int8"}));
  c->add_option("--dtype", a->dtype,
                "Module weights and computation: f32, bf16 or f16 (the float32 weights, seeded or from --weights, "
                "rounded once to nearest even; the prompt rounded on the way in, --out widened back to float32; "
                "--kernel auto or flash); docs/decoding.md")
      ->transform(one_of({"f32", "bf16", "f16"}));
  c->add_option("--threads", a->threads, "Threads (0 = default)")->check(non_negative_integer());
  c->add_option("--out", a->out, "The N generated vectors as .npy (B, N, E) ('-' = standard output; the report "
                                 "then goes to stderr)")
      ->check(path());
  return [a, c] {
    const auto given = [c](const char* flag) { return c->get_option(flag)->count() > 0; };
    // Flags that would change nothing in this combination (issue 22).
    if (!a->prompt.empty() && given("--batch"))
      fail("--batch: not used with --prompt (the file gives the batch)");
    if (!a->weights.empty() && a->bias) fail("--bias: not used with --weights (the file has biases or not)");
    if (!a->weights.empty() && !a->prompt.empty() && given("--seed"))
      fail("--seed: not used with --weights and --prompt (nothing is random)");
    if (a->grow && !a->max_len)
      fail("--grow: needs --max-len (the default cache, prompt + tokens, never fills)");
    check_files({{"--weights", a->weights}, {"--prompt", a->prompt}}, {{"--out", a->out}});
    if (a->gqa.rope.empty() && a->gqa.rope_theta_option->count() > 0)
      fail("--rope-theta: needs --rope (interleaved or half-split)");
    apply_threads(a->threads);
    run_decode(*a);
  };
}

}  // namespace multihead::cli
