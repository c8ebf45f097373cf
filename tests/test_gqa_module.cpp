// tests/test_gqa_module.cpp: the grouped-query attention module
// (multihead/grouped_query_attention.hpp) and its KV cache.
//
//  - GqaModule: against a float64 multi-head model written here: the same
//    weights with the K/V projection rows of each K/V head repeated for the
//    query heads that share it (the "same model with its K/V heads
//    repeated"), RoPE from its formula, attention and the variants as
//    loops. Every kernel, in float32 and float64.
//  - GqaDecode: decoding with a cache equals the full causal forward over
//    the same prefix at every step, for prompts of 1, tile − 1, tile and
//    tile + 1 tokens (the flash kernel's query tile and key tile).
//  - cache bytes, overflow, growth, and the configuration's errors.
// Legend: B batch, L tokens, E embed, H query heads, Hkv K/V heads, D head width.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "multihead/error.hpp"
#include "multihead/grouped_query_attention.hpp"
#include "simd/flash_attention.hpp"
#include "simd/targets.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

using test::fmt;

// ---- the float64 model with repeated K/V heads -----------------------------

struct Variant {
  bool causal = true;
  int64_t window = 0;
  double softcap = 0;
  bool alibi = false;
  std::optional<RopeConvention> rope;
  double theta = 10000.0;
};

// y (rows, out) = x (rows, in) Wᵀ + b
std::vector<double> linear64(const double* x, int64_t rows, int64_t in, const Tensor<double>& w,
                             const Tensor<double>* b) {
  const int64_t out = w.size(0);
  std::vector<double> y(static_cast<std::size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b ? (*b)[o] : 0.0;
      for (int64_t e = 0; e < in; ++e) s += x[r * in + e] * w[o * in + e];
      y[r * out + o] = s;
    }
  return y;
}

// RoPE of one head vector at position p, from the formula: pair i is
// (2i, 2i + 1) or (i, i + D/2), rotated by p·θ^(−2i/D).
void rope64(double* v, int64_t D, double p, RopeConvention conv, double theta) {
  for (int64_t i = 0; i < D / 2; ++i) {
    const int64_t a = conv == RopeConvention::Interleaved ? 2 * i : i;
    const int64_t c = conv == RopeConvention::Interleaved ? 2 * i + 1 : i + D / 2;
    const double angle = p * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    const double x = v[a], y = v[c];
    v[a] = x * std::cos(angle) - y * std::sin(angle);
    v[c] = x * std::sin(angle) + y * std::cos(angle);
  }
}

// The GQA model as multi-head attention: W_k, W_v (and biases) with the
// D rows of K/V head h / (H / Hkv) placed at query head h.
Tensor<double> repeat_rows(const Tensor<double>& w, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t cols = w.dim() == 2 ? w.size(1) : 1;
  Tensor<double> r(w.dim() == 2 ? Shape{H * D, cols} : Shape{H * D});
  for (int64_t h = 0; h < H; ++h)
    std::copy_n(w.data() + (h / (H / Hkv)) * D * cols, D * cols, r.data() + h * D * cols);
  return r;
}

std::vector<double> mha_model64(const std::map<std::string, Tensor<double>>& w, int64_t B, int64_t L, int64_t E,
                                int64_t H, int64_t Hkv, int64_t D, const Variant& var, const double* x) {
  const bool bias = w.count("q_proj.bias") > 0;
  const Tensor<double> wk = repeat_rows(w.at("k_proj.weight"), H, Hkv, D);
  const Tensor<double> wv = repeat_rows(w.at("v_proj.weight"), H, Hkv, D);
  Tensor<double> bk, bv;
  if (bias) {
    bk = repeat_rows(w.at("k_proj.bias"), H, Hkv, D);
    bv = repeat_rows(w.at("v_proj.bias"), H, Hkv, D);
  }
  std::vector<double> q = linear64(x, B * L, E, w.at("q_proj.weight"), bias ? &w.at("q_proj.bias") : nullptr);
  std::vector<double> k = linear64(x, B * L, E, wk, bias ? &bk : nullptr);
  const std::vector<double> v = linear64(x, B * L, E, wv, bias ? &bv : nullptr);
  const std::vector<double> slopes = var.alibi ? alibi_slopes(H) : std::vector<double>{};
  if (var.rope)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t h = 0; h < H; ++h) {
          rope64(q.data() + ((b * L + i) * H + h) * D, D, static_cast<double>(i), *var.rope, var.theta);
          rope64(k.data() + ((b * L + i) * H + h) * D, D, static_cast<double>(i), *var.rope, var.theta);
        }
  std::vector<double> merged(static_cast<std::size_t>(B * L * H * D), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        std::vector<double> s(static_cast<std::size_t>(L), -INFINITY);
        double m = -INFINITY;
        for (int64_t j = 0; j < L; ++j) {
          const bool visible = (!var.causal || j <= i) &&
                               (var.window == 0 || (var.causal ? i - j < var.window : std::abs(i - j) < var.window));
          if (!visible) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q[((b * L + i) * H + h) * D + d] * k[((b * L + j) * H + h) * D + d];
          double sc = dot * scale;
          if (var.softcap > 0) sc = var.softcap * std::tanh(sc / var.softcap);
          if (var.alibi) sc -= slopes[h] * std::abs(static_cast<double>(i - j));
          s[j] = sc;
          m = std::max(m, sc);
        }
        double sum = 0;
        for (int64_t j = 0; j < L; ++j) sum += (s[j] = std::exp(s[j] - m));
        for (int64_t j = 0; j < L; ++j)
          for (int64_t d = 0; d < D; ++d)
            merged[((b * L + i) * H + h) * D + d] += s[j] / sum * v[((b * L + j) * H + h) * D + d];
      }
  return linear64(merged.data(), B * L, H * D, w.at("o_proj.weight"), bias ? &w.at("o_proj.bias") : nullptr);
}

struct ModuleCase {
  int64_t B, L, E, H, Hkv, D;  // D 0 = E / H
  bool bias;
  Variant var;
  std::string name;
};

const ModuleCase kModuleCases[] = {
    {2, 9, 32, 4, 2, 0, false, {}, "gqa2"},
    {1, 12, 32, 4, 1, 0, true, {}, "mqa_bias"},
    {2, 7, 24, 6, 6, 0, false, {}, "mha"},
    {1, 10, 32, 8, 2, 6, false, {}, "headdim6"},
    {2, 11, 32, 4, 2, 0, false, {.rope = RopeConvention::HalfSplit}, "rope_halfsplit"},
    {1, 11, 32, 4, 2, 0, true, {.rope = RopeConvention::Interleaved, .theta = 500000.0}, "rope_interleaved"},
    {1, 13, 32, 4, 1, 0, false, {.window = 4, .rope = RopeConvention::HalfSplit}, "mqa_rope_window4"},
    {2, 9, 32, 4, 2, 0, false, {.causal = false, .window = 3, .rope = {}}, "noncausal_window3"},
    {1, 9, 32, 4, 2, 0, false, {.softcap = 2.5, .alibi = true, .rope = {}}, "softcap_alibi"},
    {1, 9, 40, 5, 5, 0, false, {.causal = false, .alibi = true, .rope = {}}, "noncausal_alibi_h5"},
};

AttentionOptions options_for(const Variant& var, int64_t H, AttentionKernel kernel) {
  AttentionOptions o;
  if (var.window) o.window = var.window;
  if (var.softcap > 0) o.softcap = var.softcap;
  if (var.alibi) o.alibi_slopes = alibi_slopes(H);
  o.kernel = kernel;
  return o;
}

GroupedQueryAttentionConfig config_for(const ModuleCase& c) {
  GroupedQueryAttentionConfig cfg;
  cfg.embed_dim = c.E;
  cfg.num_heads = c.H;
  cfg.num_kv_heads = c.Hkv;
  cfg.head_dim = c.D;
  cfg.bias = c.bias;
  cfg.causal = c.var.causal;
  if (c.var.rope) cfg.rope = RopeOptions{*c.var.rope, c.var.theta, 0};
  return cfg;
}

std::map<std::string, Tensor<float>> to_float(const std::map<std::string, Tensor<double>>& w) {
  std::map<std::string, Tensor<float>> f;
  for (const auto& [name, t] : w) f[name] = tensor_cast<float>(t);
  return f;
}

struct ModuleParam {
  ModuleCase c;
  AttentionKernel kernel;
};

void PrintTo(const ModuleParam& p, std::ostream* os) { *os << p.c.name << "_" << to_string(p.kernel); }

class GqaModule : public ::testing::TestWithParam<ModuleParam> {};

// Tolerances: float64, 1e-12 relative (both sides are exact to ~1e-15;
// the sums run over at most E = 40 terms). float32, 2e-5 relative in the
// norm: inputs and weights of size ~1, three products over <= 48 terms and
// a softmax over <= 13 keys, each a few u = 6e-8 per term (≈ 48·u ≈ 3e-6
// worst case per product, far less on average).
TEST_P(GqaModule, EqualsRepeatedKvModel) {
  const ModuleCase& c = GetParam().c;
  const AttentionKernel kernel = GetParam().kernel;
  const GroupedQueryAttentionConfig cfg = config_for(c);
  const GroupedQueryAttention<double> m64(cfg, 42);
  const std::map<std::string, Tensor<double>> w = m64.state_dict();
  const int64_t D = m64.head_dim();
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  const Tensor<double> x = test::random_tensor<double>(Shape{c.B, c.L, c.E}, rng);
  const std::vector<double> y = mha_model64(w, c.B, c.L, c.E, c.H, c.Hkv, D, c.var, x.data());
  Tensor<double> want(Shape{c.B, c.L, c.E});
  std::copy(y.begin(), y.end(), want.data());
  const AttentionOptions o = options_for(c.var, c.H, kernel);
  if (kernel != AttentionKernel::Flash) {
    const double err64 = test::rel_error(m64.forward(x, o), want);
    EXPECT_LE(err64, 1e-12) << "float64";
    RecordProperty("rel_error_float64", fmt(err64));
  }
  const GroupedQueryAttention<float> m32 = GroupedQueryAttention<float>::from_tensors(cfg, to_float(w));
  const double err32 = test::rel_error(m32.forward(tensor_cast<float>(x), o), want);
  EXPECT_LE(err32, 2e-5) << "float32";
  RecordProperty("rel_error_float32", fmt(err32));
}

std::vector<ModuleParam> module_params() {
  std::vector<ModuleParam> p;
  for (const ModuleCase& c : kModuleCases)
    for (AttentionKernel k : {AttentionKernel::Reference, AttentionKernel::Materialized, AttentionKernel::Flash})
      p.push_back({c, k});
  return p;
}

INSTANTIATE_TEST_SUITE_P(Table, GqaModule, ::testing::ValuesIn(module_params()), [](const auto& info) {
  return info.param.c.name + "_" + to_string(info.param.kernel);
});

// The model check can fail: with the K/V heads grouped the other way
// (h % Hkv), the float64 reference no longer matches.
TEST(GqaModuleChecker, WrongGroupingIsCaught) {
  const ModuleCase c = kModuleCases[0];
  const GroupedQueryAttention<double> m(config_for(c), 42);
  std::map<std::string, Tensor<double>> w = m.state_dict();
  std::mt19937_64 rng(3);
  const Tensor<double> x = test::random_tensor<double>(Shape{c.B, c.L, c.E}, rng);
  // Swap K/V heads 0 and 1: a model that pairs query head h with K/V head h % 2.
  for (const char* name : {"k_proj.weight", "v_proj.weight"}) {
    Tensor<double>& t = w.at(name);
    const int64_t block = m.head_dim() * c.E;
    std::swap_ranges(t.data(), t.data() + block, t.data() + block);
  }
  const std::vector<double> y = mha_model64(w, c.B, c.L, c.E, c.H, c.Hkv, m.head_dim(), c.var, x.data());
  Tensor<double> wrong(Shape{c.B, c.L, c.E});
  std::copy(y.begin(), y.end(), wrong.data());
  EXPECT_GT(test::rel_error(m.forward(x), wrong), 1e-3);
}

// ---- decoding with a cache -------------------------------------------------

struct DecodeParam {
  int64_t prompt;
  std::string what;  // which tile boundary it sits at
  std::string target;
};

void PrintTo(const DecodeParam& p, std::ostream* os) { *os << "prompt" << p.prompt << "_" << p.what << "_" << p.target; }

class GqaDecode : public ::testing::TestWithParam<DecodeParam> {};

class ScopedTarget {
 public:
  explicit ScopedTarget(const std::string& name) { detail::simd_target_force(name); }
  ~ScopedTarget() { detail::simd_target_force(""); }
  ScopedTarget(const ScopedTarget&) = delete;
  ScopedTarget& operator=(const ScopedTarget&) = delete;
};

// Prompt, then 3 single tokens, then a chunk of 2, then 1 more: at every
// step the new rows equal rows P … P + L − 1 of the full forward over the
// prefix (no cache), to 1e-5 relative to the largest output. Both run the
// same projections on the same rows and the flash kernel on the same keys;
// they differ only in how the queries are tiled (the full forward's tiles
// cross the step boundaries), so the difference is float rounding of
// ~S·u ≈ 1e-5 at most for S <= 170 and typically ~1e-7.
// GQA with RoPE, and a window or ALiBi, per the combination table.
TEST_P(GqaDecode, EqualsFullForwardAtEveryStep) {
  const DecodeParam& p = GetParam();
  const ScopedTarget target(p.target);
  GroupedQueryAttentionConfig cfg;
  cfg.embed_dim = 32;
  cfg.num_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.rope = RopeOptions{};
  const GroupedQueryAttention<float> m(cfg, 7);
  const std::vector<int64_t> steps = {p.prompt, 1, 1, 1, 2, 1};
  int64_t total = 0;
  for (int64_t s : steps) total += s;
  std::mt19937_64 rng(static_cast<uint64_t>(p.prompt));
  const Tensor<float> x = test::random_tensor<float>(Shape{2, total, 32}, rng);
  // Plain; a window of 5; ALiBi with a soft-cap (bottom-right positions
  // over the cache, the combination table).
  for (const std::string variant : {"plain", "window5", "alibi_softcap"}) {
    AttentionOptions o;
    if (variant == "window5") o.window = 5;
    if (variant == "alibi_softcap") {
      o.alibi_slopes = alibi_slopes(4);
      o.softcap = 3.0;
    }
    o.kernel = AttentionKernel::Flash;
    KVCache<float> cache = m.make_cache(2, total);
    int64_t P = 0;
    for (int64_t L : steps) {
      Tensor<float> chunk(Shape{2, L, 32}), prefix(Shape{2, P + L, 32});
      for (int64_t b = 0; b < 2; ++b) {
        std::copy_n(x.data() + (b * total + P) * 32, L * 32, chunk.data() + b * L * 32);
        std::copy_n(x.data() + b * total * 32, (P + L) * 32, prefix.data() + b * (P + L) * 32);
      }
      const Tensor<float> got = m.forward(chunk, o, &cache);
      const Tensor<float> full = m.forward(prefix, o);
      ASSERT_EQ(cache.length(), P + L);
      double worst = 0, scale = 0;
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t e = 0; e < L * 32; ++e) {
          const double want = full[(b * (P + L) + P) * 32 + e];
          worst = std::max(worst, std::abs(got[b * L * 32 + e] - want));
          scale = std::max(scale, std::abs(want));
        }
      EXPECT_LE(worst, 1e-5 * scale) << "step at P=" << P << " L=" << L << " " << variant;
      RecordProperty("worst_over_max_P" + std::to_string(P) + "_" + variant, fmt(worst / scale));
      P += L;
    }
  }
}

std::vector<DecodeParam> decode_params() {
  std::vector<DecodeParam> p;
  for (const std::string& target : detail::simd_targets_available()) {
    const ScopedTarget t(target);
    const detail::FlashAttentionKernel k = detail::flash_attention_kernel_for(detail::simd_target_bit());
    p.push_back({1, "one", target});
    // The last key tile of a range takes up to a quarter more keys
    // (MaxKeyTile in src/simd/flash_attention-inl.h), so the first length
    // split in two key tiles is key_tile + key_tile / 4 + 1; the decoding
    // steps after such a prompt cross the one-query tiles' bound as well.
    const int64_t max_key_tile = k.key_tile + k.key_tile / 4;
    for (const auto& [tile, name] : {std::pair{k.row_tile, std::string("querytile")}, {k.key_tile, "keytile"},
                                     {max_key_tile, "maxkeytile"}}) {
      p.push_back({tile - 1, name + "minus1", target});
      p.push_back({tile, name, target});
      p.push_back({tile + 1, name + "plus1", target});
    }
  }
  return p;
}

INSTANTIATE_TEST_SUITE_P(Prompts, GqaDecode, ::testing::ValuesIn(decode_params()), [](const auto& info) {
  return "prompt" + std::to_string(info.param.prompt) + "_" + info.param.what + "_" + info.param.target;
});

TEST(GqaCache, BytesOverflowAndGrowth) {
  GroupedQueryAttentionConfig cfg;
  cfg.embed_dim = 16;
  cfg.num_heads = 4;
  cfg.num_kv_heads = 1;
  const GroupedQueryAttention<float> m(cfg, 1);
  KVCache<float> cache = m.make_cache(2, 5);
  // K and V: 2 batch × 1 K/V head × 5 positions × 4 wide × 4 bytes, twice.
  EXPECT_EQ(cache.bytes(), 2 * 2 * 1 * 5 * 4 * 4);
  std::mt19937_64 rng(5);
  const Tensor<float> x = test::random_tensor<float>(Shape{2, 4, 16}, rng);
  m.forward(x, {}, &cache);
  EXPECT_EQ(cache.length(), 4);
  try {
    m.forward(x, {}, &cache);
    ADD_FAILURE() << "appending 4 tokens to 4 of 5 did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("max_len:", 0), 0u) << msg;
    EXPECT_NE(msg.find("holds 4 of max_len 5"), std::string::npos) << msg;
  }
  EXPECT_EQ(cache.length(), 4);  // the failed call changed nothing
  // A growing cache doubles and keeps what it holds: same outputs as a big one.
  KVCache<float> grows = m.make_cache(2, 1, true), big = m.make_cache(2, 64);
  for (int step = 0; step < 5; ++step) {
    const Tensor<float> a = m.forward(x, {}, &grows), b = m.forward(x, {}, &big);
    EXPECT_EQ(test::rel_error(a, b), 0.0) << "step " << step;
  }
  EXPECT_EQ(grows.length(), 20);
  // Each growth goes to max(2 x capacity, needed): 1 -> 4 (4 needed) -> 8 ->
  // 16 (12 needed) -> 32 (20 needed).
  EXPECT_EQ(grows.capacity(), 32);
}

// A cache that could never fit is refused before any allocation, naming
// max_len, the bytes and the machine's memory (issue 22: decode with
// --max-len 4000000 failed with a bare std::bad_alloc after committing
// 2.4 GB). 2 x 32 K/V heads x 2^40 positions x 128 x 4 bytes = 2^55 bytes.
TEST(GqaCache, LargerThanMemoryIsRefusedBeforeAllocating) {
  GroupedQueryAttentionConfig cfg;
  cfg.embed_dim = 64;
  cfg.num_heads = 32;
  cfg.head_dim = 128;
  const GroupedQueryAttention<float> m(cfg, 1);
  std::string msg = "no error";
  try {
    (void)m.make_cache(1, int64_t{1} << 40);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_EQ(msg.rfind("max_len: a KV cache of 1099511627776 positions", 0), 0u) << msg;
  EXPECT_NE(msg.find("(36028797018963968 bytes), more than this machine's"), std::string::npos) << msg;
  EXPECT_NE(msg.find("GiB of memory"), std::string::npos) << msg;
}

TEST(GqaConfigValidation, ErrorsNameTheOption) {
  const auto message = [](const GroupedQueryAttentionConfig& c) -> std::string {
    try {
      c.validate();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  GroupedQueryAttentionConfig c;
  c.embed_dim = 32;
  c.num_heads = 8;
  c.num_kv_heads = 3;
  std::string m = message(c);
  EXPECT_EQ(m.rfind("num_kv_heads:", 0), 0u) << m;
  EXPECT_NE(m.find("num_heads 8"), std::string::npos) << m;
  EXPECT_NE(m.find("got 3"), std::string::npos) << m;
  c.num_kv_heads = 2;
  c.head_dim = 5;
  c.rope = RopeOptions{};
  m = message(c);
  EXPECT_EQ(m.rfind("head_dim: expected an even head width", 0), 0u) << m;
  EXPECT_NE(m.find("got 5"), std::string::npos) << m;
  c.head_dim = 0;
  EXPECT_EQ(message(c), "no error");
  c.embed_dim = 30;
  m = message(c);
  EXPECT_NE(m.find("a divisor of embed_dim 30"), std::string::npos) << m;
}

}  // namespace
}  // namespace multihead
