// tests/test_kv_cache_dtypes.cpp: the compressed KV caches (bf16, f16, int8
// with a float scale per 32 values) of the grouped-query module.
//  - KvCacheRounding: the scalar rules of src/simd/narrow_types.hpp against
//    float64: every bf16 and f16 value round-trips, every midpoint between
//    neighbours rounds to the even one; the int8 quantizer against a float64
//    reference (q, and |x − scale·q| <= scale / 2).
//  - KvCacheDecode: decode outputs with each cache dtype against the float32
//    cache's, at every step (a prompt of 31, 32 or 33 tokens, then 1, 1, 1,
//    2 tokens), within the bound derived below, computed per output element
//    from the float64 q, k, v of the test's own projections; K/V heads 8, 2
//    and 1 of 8 query heads; plain, a window, ALiBi with a soft-cap.
//  - KvCacheF32Decode: the float32 cache's decode steps (<= 8 rows per K/V
//    head) through the decode kernel of every dtype, more rows through flash,
//    against the reference kernel within the float32 part of the bound; a
//    forced kernel still wins (KvCacheF32Force).
//  - KvCacheDispatch: each SIMD target against the best one, same cache,
//    within the float32 part of the bound.
//  - KvCacheBytes: bytes() is the compressed size, and the memory check
//    uses it.
//
// The bound (docs/decoding.md, "Compressed caches"). Per element the cache
// stores x̂ with |x − x̂| <= δ(x): bf16 2^-8·|x|; f16 2^-11·|x| + 2^-25; int8
// scale_b / 2 for its block b (narrow_types.hpp). For one query row q over
// keys j with exact weights p_j = softmax(s)_j, s_j = scale·<q, k_j> (then
// soft-cap, 1-Lipschitz, and ALiBi, unchanged by rounding):
//   |ŝ_j − s_j| <= ε_j = scale·Σ_d |q_d|·δ(k_jd),  ε = max_j ε_j;
//   p̂_j = p_j·e^{ŝ_j − s_j} / Σ_k p_k e^{ŝ_k − s_k}, the denominator in
//   [e^-ε, e^ε], so |p̂_j − p_j| <= (e^{2ε} − 1)·p_j;
//   a_d = Σ_j p_j v_jd, â_d = Σ_j p̂_j v̂_jd:
//   |â_d − a_d| <= Σ_j |p̂_j − p_j|·|v_jd| + Σ_j p̂_j·|v̂_jd − v_jd|
//               <= (e^{2ε} − 1)·Σ_j p_j |v_jd| + e^{2ε}·Σ_j p_j δ(v_jd).
// Both decodes also round in float32 (u = 2^-24, γ_n = n·u / (1 − n·u)):
// each score by γ_{D+2}·scale·Σ_d |q_d k_jd| (+ 4u for the exp2
// polynomial), each weighted sum by γ_{S+2}·Σ_j p_j |v_jd| more; counted
// twice (both paths) and with the cache's term. The module's output is
// y = â W_oᵀ: |ŷ_e − y_e| <= Σ_c |W_o,ec|·bound_c + 2γ_{HD}·Σ_c |W_o,ec a_c|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "multihead/error.hpp"
#include "multihead/grouped_query_attention.hpp"
#include "multihead/runtime.hpp"
#include "simd/narrow_types.hpp"
#include "simd/targets.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

// ---- the scalar rounding rules -------------------------------------------

// Every finite bf16 and f16 value converts back to itself, and the midpoint
// of two neighbours (exact in float) rounds to the one with an even
// significand: round to nearest even, checked on all 2 x 65536 patterns.
TEST(KvCacheRounding, Bf16AndF16RoundTripAndTiesToEven) {
  struct Format {
    const char* name;
    uint16_t (*narrow)(float);
    float (*widen)(uint16_t);
    uint32_t finite_end;  // first non-finite pattern of the positive half
  };
  for (const Format& f : {Format{"bf16", detail::float_to_bfloat16_bits, detail::bfloat16_bits_to_float, 0x7f80u},
                          Format{"f16", detail::float_to_float16_bits, detail::float16_bits_to_float, 0x7c00u}}) {
    int failures = 0;
    for (uint32_t sign : {0u, 0x8000u})
      for (uint32_t m = 0; m < f.finite_end && failures < 5; ++m) {
        const auto h = static_cast<uint16_t>(sign | m);
        const float x = f.widen(h);
        if (f.narrow(x) != h) {
          ++failures;
          ADD_FAILURE() << f.name << " pattern " << h << " = " << x << " came back as " << f.narrow(x);
        }
        if (m + 1 == f.finite_end) continue;
        const auto next = static_cast<uint16_t>(sign | (m + 1));
        const double mid = 0.5 * (static_cast<double>(x) + static_cast<double>(f.widen(next)));
        ASSERT_EQ(static_cast<double>(static_cast<float>(mid)), mid) << f.name;
        const uint16_t even = (m & 1u) == 0 ? h : next;
        if (f.narrow(static_cast<float>(mid)) != even) {
          ++failures;
          ADD_FAILURE() << f.name << " midpoint " << mid << " of patterns " << h << ", " << next << " gave "
                        << f.narrow(static_cast<float>(mid)) << ", expected " << even;
        }
      }
  }
  // f16's range ends at 65504; from 65520 (the midpoint to 2^16) on, inf.
  EXPECT_EQ(detail::float_to_float16_bits(65519.0f), 0x7bffu);
  EXPECT_EQ(detail::float_to_float16_bits(65520.0f), 0x7c00u);
  EXPECT_EQ(detail::float_to_float16_bits(0x1p-26f), 0u);  // below half the smallest subnormal
}

// The int8 block quantizer against float64: scale = max|x| / 127 (to float
// rounding), q = round-to-nearest-even(x / scale) except where x / scale is
// within 1e-5 of a tie (float's x / scale may fall on either side), and
// |x − scale·q| <= scale / 2·(1 + 2^-20) for every element. Block lengths
// 1, 7, 31, 32; values over 12 decades, exact ties and an all-zero block.
TEST(KvCacheRounding, Int8QuantizerAgainstFloat64) {
  std::mt19937_64 rng(19);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> decade(-6.0, 6.0);
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t n = std::vector<int64_t>{1, 7, 31, 32}[static_cast<std::size_t>(trial % 4)];
    const double magnitude = std::pow(10.0, decade(rng));
    std::vector<float> x(static_cast<std::size_t>(n));
    for (auto& e : x) e = static_cast<float>(normal(rng) * magnitude);
    if (trial % 10 == 1 && n > 2) {  // exact ties: max 127 (scale 1), values k + 1/2
      std::fill(x.begin(), x.end(), 1.0f);
      x[0] = 127.0f;
      x[1] = 2.5f;
      x[2] = -3.5f;
    }
    if (trial == 3) std::fill(x.begin(), x.end(), 0.0f);
    std::vector<int8_t> q(static_cast<std::size_t>(n));
    const float scale = detail::quantize_int8_block(x.data(), n, q.data());
    double max_abs = 0;
    for (float e : x) max_abs = std::max(max_abs, std::fabs(static_cast<double>(e)));
    const double scale64 = max_abs / 127.0;
    ASSERT_NEAR(scale, scale64, scale64 * 1e-7) << "trial " << trial;
    for (int64_t i = 0; i < n; ++i) {
      const double r = scale64 > 0 ? x[static_cast<std::size_t>(i)] / scale64 : 0.0;
      const double want = std::nearbyint(r);  // ties to even
      const auto got = q[static_cast<std::size_t>(i)];
      if (std::fabs(std::fabs(r - std::trunc(r)) - 0.5) > 1e-5) {
        EXPECT_EQ(got, want) << "trial " << trial << " element " << i << " x " << x[static_cast<std::size_t>(i)];
      }
      const double err = std::fabs(x[static_cast<std::size_t>(i)] - static_cast<double>(scale) * got);
      EXPECT_LE(err, 0.5 * scale64 * (1 + 0x1p-20) + 1e-300) << "trial " << trial << " element " << i;
      ++checked;
    }
    if (trial % 10 == 1 && n > 2) {
      EXPECT_EQ(q[1], 2);  // 2.5 → 2
      EXPECT_EQ(q[2], -4);  // −3.5 → −4
    }
  }
  EXPECT_GT(checked, 7000);
  // A non-finite value makes its block NaN (scale NaN, q 0).
  const float bad[3] = {1.0f, INFINITY, 2.0f};
  int8_t q[3];
  EXPECT_TRUE(std::isnan(detail::quantize_int8_block(bad, 3, q)));
}

// ---- decoding against the float32 cache ----------------------------------

constexpr int64_t kE = 64, kH = 8, kD = 40, kB = 2;  // D = 32 + 8: a full and a short int8 block,
                                                     // and a scalar tail on 16- and 8-lane targets

struct DecodeCase {
  KVCacheDType dtype;
  int64_t kv_heads, prompt;
};

std::string case_name(const DecodeCase& c) {
  return std::string(kv_cache_dtype_name(c.dtype)) + "_Hkv" + std::to_string(c.kv_heads) + "_prompt" +
         std::to_string(c.prompt);
}

struct Variant {
  std::string name;
  int64_t window = 0;
  double softcap = 0;
  bool alibi = false;
};
const std::vector<Variant> kVariants = {{"plain"}, {"window5", 5}, {"alibi_softcap", 0, 3.0, true}};

AttentionOptions options_of(const Variant& v) {
  AttentionOptions o;
  if (v.window) o.window = v.window;
  if (v.softcap) o.softcap = v.softcap;
  if (v.alibi) o.alibi_slopes = alibi_slopes(kH);
  return o;
}

// y (rows, out) = x (rows, in) Wᵀ in double.
std::vector<double> project(const std::vector<double>& x, int64_t rows, int64_t in, const Tensor<float>& w) {
  const int64_t out = w.size(0);
  std::vector<double> y(static_cast<std::size_t>(rows * out), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += x[static_cast<std::size_t>(r * in + i)] * w[o * in + i];
      y[static_cast<std::size_t>(r * out + o)] = s;
    }
  return y;
}

// δ(x) of each element of a row of D values (the file comment).
std::vector<double> rounding_bound(KVCacheDType dtype, const double* x) {
  std::vector<double> d(static_cast<std::size_t>(kD));
  for (int64_t c = 0; c < kD; ++c) {
    const double a = std::fabs(x[c]);
    switch (dtype) {
      case KVCacheDType::BFloat16: d[static_cast<std::size_t>(c)] = 0x1p-8 * a; break;
      case KVCacheDType::Float16: d[static_cast<std::size_t>(c)] = 0x1p-11 * a + 0x1p-25; break;
      case KVCacheDType::Int8: {
        const int64_t b0 = c / 32 * 32, b1 = std::min(b0 + 32, kD);
        double m = 0;
        for (int64_t i = b0; i < b1; ++i) m = std::max(m, std::fabs(x[i]));
        d[static_cast<std::size_t>(c)] = 0.5 * m / 127.0 * (1 + 1e-5);  // 1e-5: float vs double k
        break;
      }
      case KVCacheDType::Native: d[static_cast<std::size_t>(c)] = 0; break;
    }
  }
  return d;
}

double gamma(double n) { return n * 0x1p-24 / (1 - n * 0x1p-24); }

// The bound on |ŷ − y| for every output element of one step (rows P … P+L−1
// of each sequence), given all tokens' x so far. `cache_term` false: only
// the float32 rounding of two decodes (the dispatch test).
// `norm` (if non-null) gets each element's scale, Σ_c |W_o,ec|·Σ_j p_j |v_jc|:
// what the bound is a small multiple of (ε × norm).
std::vector<double> output_bound(const GroupedQueryAttention<float>& m, const Variant& var, KVCacheDType dtype,
                                 const std::vector<double>& x, int64_t total, int64_t P, int64_t L, bool cache_term,
                                 std::vector<double>* norm = nullptr) {
  const int64_t Hkv = m.kv_heads(), G = kH / Hkv, S = P + L;
  const auto& prm = m.parameters();
  const std::vector<double> q = project(x, kB * total, kE, prm.q_proj_weight);
  const std::vector<double> k = project(x, kB * total, kE, prm.k_proj_weight);
  const std::vector<double> v = project(x, kB * total, kE, prm.v_proj_weight);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
  const auto slopes = alibi_slopes(kH);
  std::vector<double> bound(static_cast<std::size_t>(kB * L * kE), 0.0);
  std::vector<double> a_bound(static_cast<std::size_t>(kH * kD)), a_abs(static_cast<std::size_t>(kH * kD));
  std::vector<double> a_norm(static_cast<std::size_t>(kH * kD));
  if (norm) norm->assign(bound.size(), 0.0);
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t i = 0; i < L; ++i) {
      const int64_t pos = P + i, row = b * total + pos;
      for (int64_t h = 0; h < kH; ++h) {
        const int64_t g = h / G;
        const double* qh = q.data() + row * kH * kD + h * kD;
        std::vector<double> s, absdot, eps;
        std::vector<int64_t> keys;
        for (int64_t j = 0; j <= pos; ++j) {
          if (var.window && j <= pos - var.window) continue;
          const double* kj = k.data() + (b * total + j) * Hkv * kD + g * kD;
          const std::vector<double> dk = rounding_bound(dtype, kj);
          double dot = 0, ad = 0, e = 0;
          for (int64_t c = 0; c < kD; ++c) {
            dot += qh[c] * kj[c];
            ad += std::fabs(qh[c] * kj[c]);
            e += std::fabs(qh[c]) * dk[static_cast<std::size_t>(c)];
          }
          double sc = scale * dot;
          if (var.softcap) sc = var.softcap * std::tanh(sc / var.softcap);
          if (var.alibi) sc -= slopes[static_cast<std::size_t>(h)] * static_cast<double>(pos - j);
          s.push_back(sc);
          absdot.push_back(scale * ad);
          eps.push_back(scale * e);
          keys.push_back(j);
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        double eps_cache = 0, eps_f32 = 0;
        for (std::size_t t = 0; t < s.size(); ++t) {
          s[t] /= sum;
          eps_cache = std::max(eps_cache, eps[t]);
          eps_f32 = std::max(eps_f32, gamma(kD + 2) * absdot[t] + 4 * 0x1p-24);
        }
        for (int64_t c = 0; c < kD; ++c) {
          double pv = 0, a = 0, dv = 0;
          for (std::size_t t = 0; t < s.size(); ++t) {
            const double* vj = v.data() + (b * total + keys[t]) * Hkv * kD + g * kD;
            pv += s[t] * std::fabs(vj[c]);
            a += s[t] * vj[c];
            if (cache_term) dv += s[t] * rounding_bound(dtype, vj)[static_cast<std::size_t>(c)];
          }
          dv *= std::exp(2 * eps_cache);  // Σ_j p̂_j δ(v_jd) <= e^{2ε} Σ_j p_j δ(v_jd)
          const double f32 = 2 * ((std::exp(2 * eps_f32) - 1) * pv + gamma(static_cast<double>(S) + 2) * pv);
          const double cache = cache_term ? (std::exp(2 * eps_cache) - 1) * pv + dv : 0.0;
          a_bound[static_cast<std::size_t>(h * kD + c)] = f32 + cache;
          a_abs[static_cast<std::size_t>(h * kD + c)] = std::fabs(a);
          a_norm[static_cast<std::size_t>(h * kD + c)] = pv;
        }
      }
      for (int64_t e = 0; e < kE; ++e) {
        double bnd = 0, wa = 0, wn = 0;
        for (int64_t c = 0; c < kH * kD; ++c) {
          const double w = std::fabs(prm.o_proj_weight[e * kH * kD + c]);
          bnd += w * a_bound[static_cast<std::size_t>(c)];
          wa += w * a_abs[static_cast<std::size_t>(c)];
          wn += w * a_norm[static_cast<std::size_t>(c)];
        }
        if (norm) (*norm)[static_cast<std::size_t>((b * L + i) * kE + e)] = wn;
        bound[static_cast<std::size_t>((b * L + i) * kE + e)] = bnd + 2 * gamma(kH * kD) * wa;
      }
    }
  return bound;
}

GroupedQueryAttention<float> make_module(int64_t kv_heads) {
  GroupedQueryAttentionConfig cfg;
  cfg.embed_dim = kE;
  cfg.num_heads = kH;
  cfg.num_kv_heads = kv_heads;
  cfg.head_dim = kD;
  return GroupedQueryAttention<float>(cfg, 11);
}

const std::vector<int64_t> kSteps = {1, 1, 1, 2};  // after the prompt

// Every step's output, teacher-forced (each step's input is x's next
// tokens, so both caches see the same K/V).
std::vector<Tensor<float>> decode_all(const GroupedQueryAttention<float>& m, const Tensor<float>& x, int64_t prompt,
                                      const AttentionOptions& o, KVCacheDType dtype) {
  const int64_t total = x.size(1);
  KVCache<float> cache = m.make_cache(kB, total, false, dtype);
  std::vector<Tensor<float>> out;
  int64_t P = 0;
  std::vector<int64_t> steps = {prompt};
  steps.insert(steps.end(), kSteps.begin(), kSteps.end());
  for (int64_t L : steps) {
    Tensor<float> chunk(Shape{kB, L, kE});
    for (int64_t b = 0; b < kB; ++b) std::copy_n(x.data() + (b * total + P) * kE, L * kE, chunk.data() + b * L * kE);
    out.push_back(m.forward(chunk, o, &cache));
    P += L;
  }
  EXPECT_EQ(cache.length(), total);
  return out;
}

class KvCacheDecode : public ::testing::TestWithParam<DecodeCase> {};

// Within the bound at every step and every output element. The bound is
// a small multiple of each element's norm Σ_c |W_o,ec|·Σ_j p_j |v_jc|
// (below 5% of it for bf16, 10% for int8, 0.6% for f16, so it is not vacuous;
// KvCacheChecker shows that a wrong context fails it), and the compressed
// output does differ from float32's (the compressed cache was read).
TEST_P(KvCacheDecode, WithinDerivedBoundOfFloat32Cache) {
  const DecodeCase& c = GetParam();
  const GroupedQueryAttention<float> m = make_module(c.kv_heads);
  int64_t total = c.prompt;
  for (int64_t s : kSteps) total += s;
  std::mt19937_64 rng(static_cast<uint64_t>(c.prompt * 100 + c.kv_heads));
  const Tensor<float> x = test::random_tensor<float>(Shape{kB, total, kE}, rng);
  const std::vector<double> x64(x.data(), x.data() + x.numel());
  // int8's δ is half a step of the block's largest value, not of x itself.
  const double width = c.dtype == KVCacheDType::Float16 ? 0.006 : c.dtype == KVCacheDType::Int8 ? 0.1 : 0.05;
  for (const Variant& var : kVariants) {
    const AttentionOptions o = options_of(var);
    const std::vector<Tensor<float>> want = decode_all(m, x, c.prompt, o, KVCacheDType::Native);
    const std::vector<Tensor<float>> got = decode_all(m, x, c.prompt, o, c.dtype);
    int64_t P = 0;
    double worst_ratio = 0, any_diff = 0;
    for (std::size_t step = 0; step < want.size(); ++step) {
      const int64_t L = want[step].size(1);
      std::vector<double> norm;
      const std::vector<double> bound = output_bound(m, var, c.dtype, x64, total, P, L, true, &norm);
      for (int64_t e = 0; e < want[step].numel(); ++e) {
        const double err = std::fabs(static_cast<double>(got[step][e]) - want[step][e]);
        const double bnd = bound[static_cast<std::size_t>(e)];
        ASSERT_LE(err, bnd) << var.name << " step " << step << " (P=" << P << ", L=" << L << ") element " << e
                            << ": float32 cache " << want[step][e] << ", " << kv_cache_dtype_name(c.dtype) << " "
                            << got[step][e] << ", error " << err << ", bound " << bnd;
        ASSERT_LE(bnd, width * norm[static_cast<std::size_t>(e)]) << var.name << " step " << step << " element " << e
                                                                  << ": the bound is too wide to check much";
        worst_ratio = std::max(worst_ratio, err / bnd);
        any_diff = std::max(any_diff, err);
      }
      P += L;
    }
    EXPECT_GT(any_diff, 0.0) << var.name << ": identical to the float32 cache, so the compressed one was not read";
    RecordProperty("error_over_bound_" + var.name, test::fmt(worst_ratio));
  }
}

// The checker itself: the float32 decode of a context whose first token
// differs (a cache misreading one key and value) is outside the bf16 bound
// somewhere. The token is scaled by 8: zeroing it moves the outputs by at
// most 0.25 of the bound (the bound is 5% of the norm, one of 33 tokens
// less), which this test once missed while reading the last step's bound
// (2 tokens) past its end as if it had 1.
TEST(KvCacheChecker, WrongContextFailsTheBound) {
  const GroupedQueryAttention<float> m = make_module(2);
  const int64_t prompt = 32;
  int64_t total = prompt;
  for (int64_t s : kSteps) total += s;
  std::mt19937_64 rng(5);
  const Tensor<float> x = test::random_tensor<float>(Shape{kB, total, kE}, rng);
  Tensor<float> wrong = x;
  for (int64_t e = 0; e < kE; ++e) wrong[e] *= 8.0f;  // sequence 0, token 0
  const std::vector<double> x64(x.data(), x.data() + x.numel());
  const std::vector<Tensor<float>> want = decode_all(m, x, prompt, {}, KVCacheDType::Native);
  const std::vector<Tensor<float>> bad = decode_all(m, wrong, prompt, {}, KVCacheDType::Native);
  int64_t P = 0, violations = 0;
  for (std::size_t step = 1; step < want.size(); ++step) {  // the decoding steps (after the prompt)
    P += want[step - 1].size(1);
    const int64_t L = want[step].size(1);  // the last step has 2 tokens
    const std::vector<double> bound = output_bound(m, kVariants[0], KVCacheDType::BFloat16, x64, total, P, L, true);
    for (int64_t e = 0; e < want[step].numel(); ++e)
      violations += std::fabs(static_cast<double>(bad[step][e]) - want[step][e]) > bound[static_cast<std::size_t>(e)];
  }
  EXPECT_GT(violations, 0);
  RecordProperty("violations", std::to_string(violations));
}

std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> cases;
  for (KVCacheDType d : {KVCacheDType::BFloat16, KVCacheDType::Float16, KVCacheDType::Int8})
    for (int64_t kv : {8, 2, 1})
      for (int64_t prompt : {31, 32, 33}) cases.push_back({d, kv, prompt});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Table, KvCacheDecode, ::testing::ValuesIn(decode_cases()),
                         [](const auto& info) { return case_name(info.param); });

// ---- the float32 cache through the decode kernel ---------------------------

// The largest |a − b| over two outputs of one shape.
double max_abs_diff(const Tensor<float>& a, const Tensor<float>& b) {
  double d = 0;
  for (int64_t e = 0; e < a.numel(); ++e) d = std::max(d, std::fabs(static_cast<double>(a[e]) - b[e]));
  return d;
}

class KvCacheF32Decode : public ::testing::TestWithParam<DecodeCase> {};

// A float32 cache's decode steps (kernel auto, L <= 8 new tokens) run the
// decode kernel of every cache dtype (decode_kernel_serves), its prompt runs
// flash. Against the reference kernel (plain loops, forced through
// options.kernel) at every step, the prompt's and each decode step's,
// within the float32 part of the bound (both paths' rounding, no cache
// term; under 1e-4 of each element's norm Σ_c |W_o,ec|·Σ_j p_j |v_jc|, and
// the errors seen are ~0.15% of it: γ_n is a worst case). Which kernel
// ran: a step of <= 8 rows per K/V head differs from a forced flash in some
// element (the decode kernel ran), a step of more is bit-identical to it.
TEST_P(KvCacheF32Decode, DecodeKernelWithinFloat32BoundOfReference) {
  constexpr double kWidth = 1e-4;  // measured widest: 6.1e-5
  const DecodeCase& c = GetParam();
  const GroupedQueryAttention<float> m = make_module(c.kv_heads);
  int64_t total = c.prompt;
  for (int64_t s : kSteps) total += s;
  std::mt19937_64 rng(static_cast<uint64_t>(c.prompt * 100 + c.kv_heads));
  const Tensor<float> x = test::random_tensor<float>(Shape{kB, total, kE}, rng);
  const std::vector<double> x64(x.data(), x.data() + x.numel());
  for (const Variant& var : kVariants) {
    const AttentionOptions o = options_of(var);
    AttentionOptions reference = o, flash = o;
    reference.kernel = AttentionKernel::Reference;
    flash.kernel = AttentionKernel::Flash;
    const std::vector<Tensor<float>> want = decode_all(m, x, c.prompt, reference, KVCacheDType::Native);
    const std::vector<Tensor<float>> got = decode_all(m, x, c.prompt, o, KVCacheDType::Native);
    const std::vector<Tensor<float>> old = decode_all(m, x, c.prompt, flash, KVCacheDType::Native);
    int64_t P = 0;
    double worst_ratio = 0, widest = 0;
    for (std::size_t step = 0; step < want.size(); ++step) {
      const int64_t L = want[step].size(1);
      std::vector<double> norm;
      const std::vector<double> bound = output_bound(m, var, KVCacheDType::Native, x64, total, P, L, false, &norm);
      for (int64_t e = 0; e < want[step].numel(); ++e) {
        const double err = std::fabs(static_cast<double>(got[step][e]) - want[step][e]);
        const double bnd = bound[static_cast<std::size_t>(e)];
        ASSERT_LE(err, bnd) << var.name << " step " << step << " (P=" << P << ", L=" << L << ") element " << e
                            << ": reference " << want[step][e] << ", auto " << got[step][e] << ", error " << err
                            << ", bound " << bnd;
        ASSERT_LE(bnd, kWidth * norm[static_cast<std::size_t>(e)]) << var.name << " step " << step << " element " << e
                                                                 << ": the bound is too wide to check much";
        worst_ratio = std::max(worst_ratio, err / bnd);
        widest = std::max(widest, bnd / norm[static_cast<std::size_t>(e)]);
      }
      if (kH / c.kv_heads * L > 8)
        EXPECT_EQ(max_abs_diff(got[step], old[step]), 0.0)
            << var.name << " step " << step << " (L=" << L << "): more than 8 rows per K/V head, but not flash's output";
      else
        EXPECT_GT(max_abs_diff(got[step], old[step]), 0.0)
            << var.name << " step " << step << " (L=" << L << "): identical to flash, so the decode kernel did not run";
      P += L;
    }
    RecordProperty("error_over_bound_" + var.name, test::fmt(worst_ratio));
    RecordProperty("bound_over_norm_" + var.name, test::fmt(widest));
  }
}

std::vector<DecodeCase> f32_decode_cases() {
  std::vector<DecodeCase> cases;
  for (int64_t kv : {8, 2, 1})
    for (int64_t prompt : {31, 32, 33}) cases.push_back({KVCacheDType::Native, kv, prompt});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Table, KvCacheF32Decode, ::testing::ValuesIn(f32_decode_cases()),
                         [](const auto& info) { return case_name(info.param); });

// The process-wide force (kernel_force, as MULTIHEAD_KERNEL) still reaches
// a float32 cache's decode steps: forced flash gives flash's outputs bit for
// bit, with options.kernel left at auto.
TEST(KvCacheF32Force, ForcedKernelStillRunsOnDecodeSteps) {
  const GroupedQueryAttention<float> m = make_module(2);
  const int64_t prompt = 32;
  int64_t total = prompt;
  for (int64_t s : kSteps) total += s;
  std::mt19937_64 rng(21);
  const Tensor<float> x = test::random_tensor<float>(Shape{kB, total, kE}, rng);
  AttentionOptions flash;
  flash.kernel = AttentionKernel::Flash;
  const std::vector<Tensor<float>> want = decode_all(m, x, prompt, flash, KVCacheDType::Native);
  kernel_force(AttentionKernel::Flash);
  const std::vector<Tensor<float>> got = decode_all(m, x, prompt, {}, KVCacheDType::Native);
  kernel_force(AttentionKernel::Auto);
  for (std::size_t step = 0; step < want.size(); ++step)
    EXPECT_EQ(max_abs_diff(got[step], want[step]), 0.0) << "step " << step;
}

// ---- dispatch -------------------------------------------------------------

class ScopedTarget {
 public:
  explicit ScopedTarget(const std::string& name) { detail::simd_target_force(name); }
  ~ScopedTarget() { detail::simd_target_force(""); }
  ScopedTarget(const ScopedTarget&) = delete;
  ScopedTarget& operator=(const ScopedTarget&) = delete;
};

// Every target this CPU runs (down to the portable fallback, the baseline
// MULTIHEAD_SIMD_TARGET=SCALAR/EMU128 selects) against the best one: the
// caches hold the same values (the rounding is scalar), so only float32
// arithmetic differs: the bound without its cache term. MQA (8 query heads
// on one K/V head), prompt 33, ALiBi with a soft-cap.
TEST(KvCacheDispatch, EveryTargetWithinFloat32BoundOfBest) {
  const GroupedQueryAttention<float> m = make_module(1);
  const int64_t prompt = 33;
  int64_t total = prompt;
  for (int64_t s : kSteps) total += s;
  std::mt19937_64 rng(3);
  const Tensor<float> x = test::random_tensor<float>(Shape{kB, total, kE}, rng);
  const std::vector<double> x64(x.data(), x.data() + x.numel());
  const Variant& var = kVariants[2];
  const std::vector<std::string> targets = detail::simd_targets_available();
  ASSERT_GE(targets.size(), 2u) << "the portable fallback is always compiled in";
  for (KVCacheDType d : {KVCacheDType::BFloat16, KVCacheDType::Float16, KVCacheDType::Int8}) {
    std::vector<Tensor<float>> best;
    {
      const ScopedTarget t(targets.front());
      best = decode_all(m, x, prompt, options_of(var), d);
    }
    for (std::size_t ti = 1; ti < targets.size(); ++ti) {
      const ScopedTarget t(targets[ti]);
      const std::vector<Tensor<float>> got = decode_all(m, x, prompt, options_of(var), d);
      int64_t P = 0;
      for (std::size_t step = 0; step < got.size(); ++step) {
        const int64_t L = got[step].size(1);
        const std::vector<double> bound = output_bound(m, var, d, x64, total, P, L, false);
        for (int64_t e = 0; e < got[step].numel(); ++e)
          ASSERT_LE(std::fabs(static_cast<double>(got[step][e]) - best[step][e]), bound[static_cast<std::size_t>(e)])
              << kv_cache_dtype_name(d) << " target " << targets[ti] << " vs " << targets.front() << " step "
              << step << " element " << e << ": " << got[step][e] << " vs " << best[step][e];
        P += L;
      }
    }
  }
}

// ---- bytes, errors ----------------------------------------------------------

TEST(KvCacheBytes, CompressedSizeAndMemoryCheck) {
  const GroupedQueryAttention<float> m = make_module(2);
  // 2 (K, V) × batch 3 × 2 K/V heads × 10 positions × row bytes.
  const int64_t rows = 2 * 3 * 2 * 10;
  EXPECT_EQ(m.make_cache(3, 10).bytes(), rows * kD * 4);
  EXPECT_EQ(m.make_cache(3, 10, false, KVCacheDType::BFloat16).bytes(), rows * kD * 2);
  EXPECT_EQ(m.make_cache(3, 10, false, KVCacheDType::Float16).bytes(), rows * kD * 2);
  EXPECT_EQ(m.make_cache(3, 10, false, KVCacheDType::Int8).bytes(), rows * (kD + 4 * 2));  // 2 blocks of 32
  // The memory check counts the int8 bytes: 2 × 8 × 2^40 × (128 + 16) bytes.
  GroupedQueryAttentionConfig cfg;
  cfg.embed_dim = 64;
  cfg.num_heads = 32;
  cfg.num_kv_heads = 8;
  cfg.head_dim = 128;
  const GroupedQueryAttention<float> big(cfg, 1);
  std::string msg = "no error";
  try {
    (void)big.make_cache(1, int64_t{1} << 40, false, KVCacheDType::Int8);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("K and V in int8 with a float32 scale per 32 values"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(2533274790395904 bytes)"), std::string::npos) << msg;
  // A growing int8 cache keeps what it holds, scales included.
  std::mt19937_64 rng(8);
  const Tensor<float> x = test::random_tensor<float>(Shape{3, 4, kE}, rng);
  KVCache<float> grows = m.make_cache(3, 1, true, KVCacheDType::Int8);
  KVCache<float> fixed = m.make_cache(3, 64, false, KVCacheDType::Int8);
  for (int step = 0; step < 4; ++step)
    EXPECT_EQ(test::rel_error(m.forward(x, {}, &grows), m.forward(x, {}, &fixed)), 0.0) << "step " << step;
}

// A float16 cache refuses a value beyond 65504 before storing anything;
// compressed caches refuse a forced kernel, dropout and a float64 module.
TEST(KvCacheBytes, ErrorsNameTheValueAndTheOption) {
  const GroupedQueryAttention<float> m = make_module(1);
  Tensor<float> x(Shape{1, 2, kE});
  for (int64_t e = 0; e < x.numel(); ++e) x[e] = 1e6f;  // k, v = x W reach ~1e5 to 1e6
  KVCache<float> cache = m.make_cache(1, 4, false, KVCacheDType::Float16);
  std::string msg = "no error";
  try {
    m.forward(x, {}, &cache);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_EQ(msg.rfind("cache: a float16 KV cache holds values of magnitude <= 65504, got k = ", 0), 0u) << msg;
  EXPECT_NE(msg.find("; a bf16 or f32 cache holds it"), std::string::npos) << msg;
  EXPECT_EQ(cache.length(), 0);
  // A value that is already not finite (the input overflowed float32 in the
  // projection) is no cache dtype's to hold: the hint says so.
  for (int64_t e = 0; e < x.numel(); ++e) x[e] = std::numeric_limits<float>::infinity();
  msg = "no error";
  try {
    m.forward(x, {}, &cache);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("not finite: the input or its projection overflowed before the cache"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("a bf16 or f32 cache holds it"), std::string::npos) << msg;
  EXPECT_EQ(cache.length(), 0);
  for (int64_t e = 0; e < x.numel(); ++e) x[e] = 1e6f;
  AttentionOptions flash;
  flash.kernel = AttentionKernel::Flash;
  KVCache<float> bf = m.make_cache(1, 4, false, KVCacheDType::BFloat16);
  try {
    m.forward(x, flash, &bf);
    ADD_FAILURE() << "a forced kernel was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("kernel: expected auto with a compressed KV cache (bf16", 0), 0u) << e.what();
  }
  GroupedQueryAttentionConfig cfg;
  cfg.embed_dim = 8;
  cfg.num_heads = 2;
  const GroupedQueryAttention<double> m64(cfg, 1);
  try {
    (void)m64.make_cache(1, 4, false, KVCacheDType::Int8);
    ADD_FAILURE() << "a float64 int8 cache was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("cache_dtype: expected f32", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace multihead
