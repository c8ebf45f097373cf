// tests/test_multihead_attention.cpp: the fused and the textbook forms agree,
// every option, in float64 and float32; edge cases; dropout; initialisation;
// bad shapes at the API boundary.
//
// Tolerances. In float64 both forms carry rounding of order
// eps64·(E + S) ≈ 1e-14 relative; we require 1e-12. In float32 the fused form
// (BLAS sgemm, float accumulation) and the textbook form (float loops) each
// differ from the exact value by about eps32·√(E + S)·c ≈ 1e-6 for the small
// shapes here; the bound for the two forms is 1e-6 relative, which
// we check in float64 and relax to 1e-5 in float32 (documented in
// docs/semantics.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention/projection_weights.hpp"
#include "multihead/attention.hpp"
#include "multihead/error.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/runtime.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

using test::random_tensor;
using test::rel_error;

struct Case {
  int64_t E, H, B, L, S, kdim, vdim;
  bool bias, bias_kv, zero_attn, batch_first, unbatched, causal;
  int mask;  // 0 none, 1 bool 2-D, 2 float 2-D, 3 bool 3-D, 4 float 3-D
  int kpm;   // 0 none, 1 bool, 2 float
  bool average;
  std::string name() const {
    std::string n = "E" + std::to_string(E) + "_H" + std::to_string(H) + "_B" + std::to_string(B) +
                    "_L" + std::to_string(L) + "_S" + std::to_string(S) + "_k" + std::to_string(kdim) +
                    "_v" + std::to_string(vdim);
    if (!bias) n += "_nobias";
    if (bias_kv) n += "_biaskv";
    if (zero_attn) n += "_zeroattn";
    if (batch_first) n += "_batchfirst";
    if (unbatched) n += "_unbatched";
    if (causal) n += "_causal";
    static const char* masks[] = {"", "_mask2dbool", "_mask2dfloat", "_mask3dbool", "_mask3dfloat"};
    static const char* kpms[] = {"", "_kpmbool", "_kpmfloat"};
    n += masks[mask];
    n += kpms[kpm];
    if (!average) n += "_perhead";
    return n;
  }
};

const Case kCases[] = {
    {8, 2, 2, 5, 5, 0, 0, true, false, false, false, false, false, 0, 0, true},
    {12, 3, 3, 4, 7, 0, 0, true, true, false, false, false, false, 1, 0, false},
    {12, 4, 2, 6, 6, 0, 0, false, false, true, true, false, true, 2, 1, true},
    {16, 16, 1, 3, 9, 5, 7, true, true, true, false, false, false, 3, 2, false},
    {6, 1, 2, 1, 1, 0, 0, true, false, false, true, false, false, 4, 0, true},
    {10, 5, 1, 7, 3, 4, 0, true, false, true, false, true, true, 2, 1, false},
    {9, 3, 2, 5, 8, 0, 11, false, true, false, true, false, true, 3, 1, true},
    {4, 4, 3, 2, 2, 0, 0, true, false, false, false, true, false, 0, 2, false},
    {32, 8, 2, 17, 13, 0, 0, true, true, true, false, false, true, 4, 2, true},
    // S >= 2048: the fused form projects K and V block by block into
    // head-major buffers instead of viewing them in place (kHeadMajorFromKeys).
    {8, 2, 2, 3, 2050, 0, 0, true, false, false, false, false, false, 1, 1, true},
    {8, 4, 3, 4, 2048, 5, 7, true, true, false, true, false, true, 4, 2, false},
    {6, 3, 1, 2, 2049, 0, 0, false, false, true, false, true, false, 2, 0, true},
};

class FormsAgree : public ::testing::TestWithParam<Case> {};

template <class T>
struct Inputs {
  Tensor<T> q, k, v;
  std::unique_ptr<Mask<T>> attn, kpm;
};

template <class T>
Inputs<T> make_inputs(const Case& c, std::mt19937_64& rng) {
  Inputs<T> in;
  const int64_t Ek = c.kdim ? c.kdim : c.E, Ev = c.vdim ? c.vdim : c.E;
  auto shape = [&](int64_t len, int64_t width) {
    if (c.unbatched) return Shape{len, width};
    return c.batch_first ? Shape{c.B, len, width} : Shape{len, c.B, width};
  };
  in.q = random_tensor<T>(shape(c.L, c.E), rng);
  in.k = random_tensor<T>(shape(c.S, Ek), rng);
  in.v = random_tensor<T>(shape(c.S, Ev), rng);
  const int64_t B = c.unbatched ? 1 : c.B;
  std::bernoulli_distribution drop(0.25);
  if (c.mask) {
    const Shape s = c.mask <= 2 ? Shape{c.L, c.S} : Shape{B * c.H, c.L, c.S};
    if (c.mask == 1 || c.mask == 3) {
      Tensor<uint8_t> m(s);
      for (auto& x : m.vec()) x = drop(rng);
      // Keep key 0 visible so that only the deliberate cases fully mask a row.
      for (int64_t r = 0; r < m.numel() / c.S; ++r) m[r * c.S] = 0;
      in.attn = std::make_unique<Mask<T>>(Mask<T>::boolean(std::move(m)));
    } else {
      in.attn = std::make_unique<Mask<T>>(Mask<T>::additive(random_tensor<T>(s, rng)));
    }
  }
  if (c.kpm) {
    const Shape s = c.unbatched ? Shape{c.S} : Shape{B, c.S};
    if (c.kpm == 1) {
      Tensor<uint8_t> m(s);
      for (auto& x : m.vec()) x = drop(rng);
      for (int64_t b = 0; b < B; ++b) m[b * c.S] = 0;
      in.kpm = std::make_unique<Mask<T>>(Mask<T>::boolean(std::move(m)));
    } else {
      in.kpm = std::make_unique<Mask<T>>(Mask<T>::additive(random_tensor<T>(s, rng)));
    }
  }
  return in;
}

MultiheadAttentionConfig config_of(const Case& c) {
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = c.E;
  cfg.num_heads = c.H;
  cfg.kdim = c.kdim;
  cfg.vdim = c.vdim;
  cfg.bias = c.bias;
  cfg.add_bias_kv = c.bias_kv;
  cfg.add_zero_attn = c.zero_attn;
  cfg.batch_first = c.batch_first;
  return cfg;
}

// Random biases too: zero-initialised biases would hide bias bugs.
template <class T>
BasicMultiheadAttention<T> random_module(const MultiheadAttentionConfig& cfg, std::mt19937_64& rng) {
  BasicMultiheadAttention<T> init(cfg, rng());
  MultiheadAttentionParameters<T> p = init.parameters();
  for (Tensor<T>* t : {&p.in_proj_bias, &p.out_proj_bias, &p.bias_k, &p.bias_v})
    if (!t->shape().empty()) *t = random_tensor<T>(t->shape(), rng);
  return BasicMultiheadAttention<T>(cfg, std::move(p));
}

// The fused form's fast paths, each way (FusedPaths): the defaults, every
// plain alternative, and the views and packed product forced on.
struct PathsCase {
  const char* name;
  FusedPaths paths;
};
const PathsCase kPaths[] = {
    {"default", FusedPaths{}},
    {"headmajor_separate_original", FusedPaths{FusedPaths::Heads::HeadMajor, false, false}},
    {"views_packed_transposed", FusedPaths{FusedPaths::Heads::Views, true, true}},
};

// The fused form (every kernel, every path) against the textbook form,
// which runs the reference kernel's plain loops and no BLAS: two
// computations that share no arithmetic. Self-attention (one tensor as
// query, key and value) where the shapes allow, so the packed product runs.
// The score variants on top of a case (window, softcap, ALiBi, alignment).
struct Variant {
  const char* name;
  std::optional<int64_t> window;
  std::optional<double> softcap;
  bool alibi;
  CausalAlignment align;
};
const Variant kNoVariant{"", std::nullopt, std::nullopt, false, CausalAlignment::TopLeft};

template <class T>
void check_forms_agree(const Case& c, double bound, const Variant& variant = kNoVariant) {
  std::mt19937_64 rng(42);
  const auto mha = random_module<T>(config_of(c), rng);
  Inputs<T> in = make_inputs<T>(c, rng);
  const bool self = c.L == c.S && c.kdim == 0 && c.vdim == 0;
  ForwardOptions<T> o;
  o.attn_mask = in.attn.get();
  o.key_padding_mask = in.kpm.get();
  o.attention.is_causal = c.causal;
  o.attention.window = variant.window;
  o.attention.softcap = variant.softcap;
  o.attention.causal_alignment = variant.align;
  o.alibi = variant.alibi;
  o.average_attn_weights = c.average;
  for (bool same_tensor : {false, true}) {
    if (same_tensor && !self) continue;
    const Tensor<T>& k = same_tensor ? in.q : in.k;
    const Tensor<T>& v = same_tensor ? in.q : in.v;
    o.need_weights = true;
    const auto book = mha.forward_textbook(in.q, k, v, o);
    for (const PathsCase& paths : kPaths) {
      o.paths = paths.paths;
      for (AttentionKernel kernel : {AttentionKernel::Materialized, AttentionKernel::Reference, AttentionKernel::Flash}) {
        if (kernel == AttentionKernel::Flash && !std::is_same_v<T, float>) continue;
        o.attention.kernel = kernel;
        o.need_weights = kernel != AttentionKernel::Flash;
        const std::string where = std::string(" kernel ") + to_string(kernel) + " paths " + paths.name +
                                  (same_tensor ? " self-attention" : "");
        const auto fused = mha.forward(in.q, k, v, o);
        ASSERT_EQ(fused.output.shape(), book.output.shape());
        EXPECT_LT(rel_error(fused.output, book.output), bound) << "output," << where;
        if (!o.need_weights) continue;
        ASSERT_EQ(fused.attn_weights->shape(), book.attn_weights->shape());
        EXPECT_LT(rel_error(*fused.attn_weights, *book.attn_weights), bound) << "weights," << where;
      }
    }
    o.paths = FusedPaths{};
  }
}

TEST_P(FormsAgree, Float64) { check_forms_agree<double>(GetParam(), 1e-12); }
TEST_P(FormsAgree, Float32) { check_forms_agree<float>(GetParam(), 1e-5); }

INSTANTIATE_TEST_SUITE_P(Table, FormsAgree, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name(); });

// The same table with the score variants (each case's causal flag, masks,
// bias_k and zero-attention keys as they are), forms against each other.
const Variant kVariants[] = {
    {"window2", 2, std::nullopt, false, CausalAlignment::TopLeft},
    {"window3_bottomright", 3, std::nullopt, false, CausalAlignment::BottomRight},
    {"softcap1p5", std::nullopt, 1.5, false, CausalAlignment::TopLeft},
    {"alibi", std::nullopt, std::nullopt, true, CausalAlignment::TopLeft},
    {"window4_softcap2_alibi_bottomright", 4, 2.0, true, CausalAlignment::BottomRight},
};
class FormsAgreeVariants : public ::testing::TestWithParam<std::tuple<Case, Variant>> {};
TEST_P(FormsAgreeVariants, Float64) {
  check_forms_agree<double>(std::get<0>(GetParam()), 1e-12, std::get<1>(GetParam()));
}
TEST_P(FormsAgreeVariants, Float32) {
  check_forms_agree<float>(std::get<0>(GetParam()), 1e-5, std::get<1>(GetParam()));
}
INSTANTIATE_TEST_SUITE_P(Table, FormsAgreeVariants,
                         ::testing::Combine(::testing::ValuesIn(std::begin(kCases), std::end(kCases) - 3),
                                            ::testing::ValuesIn(kVariants)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name() + "_" + std::get<1>(info.param).name;
                         });

// ALiBi per head: slice n = b·H + h gets alibi_slopes(H)[h], whatever b.
// With H = 2 heads of width 1, queries and keys zero (so every score is
// the bias alone) and values v_j = j, head h's output is the softmax of
// −m_h·|i − j| over j, weighted by j: computed here from the slopes.
TEST(FusedForm, AlibiSlopePerHead_H2_B2) {
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 2;
  cfg.num_heads = 2;
  cfg.bias = false;
  MultiheadAttentionParameters<double> p;
  p.in_proj_weight = Tensor<double>({6, 2}, 0.0);
  // q, k projections zero; v projection identity; out projection identity.
  p.in_proj_weight[4 * 2 + 0] = 1.0;
  p.in_proj_weight[5 * 2 + 1] = 1.0;
  p.out_proj_weight = Tensor<double>({2, 2}, 0.0);
  p.out_proj_weight[0] = p.out_proj_weight[3] = 1.0;
  const BasicMultiheadAttention<double> mha(cfg, std::move(p));
  constexpr int64_t L = 4, B = 2;
  Tensor<double> x({L, B, 2});
  for (int64_t l = 0; l < L; ++l)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t e = 0; e < 2; ++e) x[(l * B + b) * 2 + e] = static_cast<double>(l);
  ForwardOptions<double> o;
  o.alibi = true;
  o.need_weights = false;
  const std::vector<double> m = {std::pow(2.0, -4.0), std::pow(2.0, -8.0)};  // 2^(−8h/2), h = 1, 2
  for (const bool textbook : {false, true}) {
    const auto out = textbook ? mha.forward_textbook(x, x, x, o) : mha.forward(x, x, x, o);
    for (int64_t i = 0; i < L; ++i)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < 2; ++h) {
          double num = 0, den = 0;
          for (int64_t j = 0; j < L; ++j) {
            const double w = std::exp(-m[static_cast<std::size_t>(h)] * std::abs(static_cast<double>(i - j)));
            num += w * static_cast<double>(j);
            den += w;
          }
          EXPECT_NEAR(out.output[(i * B + b) * 2 + h], num / den, 1e-12)
              << (textbook ? "textbook" : "fused") << " i=" << i << " b=" << b << " h=" << h;
        }
  }
  o.attention.alibi_slopes = {0.5, 0.5, 0.5, 0.5};
  EXPECT_THROW(mha.forward(x, x, x, o), Error);
}

// Self-attention (one tensor as query, key and value) with S >= 2048 takes
// the packed product block by block into head-major buffers; the textbook
// form projects head by head. Both layouts, B = 1 (where the two token
// layouts coincide) and B = 2, causal and not, every kernel that serves
// need_weights = false; float, and double (one batch size, not causal:
// the double textbook form is the slow part). Bounds as for FormsAgree. E = 16
// makes the scatter's parallel loop run (rows·3E >= 2^16), so
// scripts/tsan.sh (filter *HeadMajor*) checks it too.
template <class T>
void check_long_self_attention(std::initializer_list<AttentionKernel> kernels, double bound,
                               std::initializer_list<int64_t> batches, std::initializer_list<bool> causals) {
  for (bool batch_first : {false, true})
    for (int64_t B : batches)
      for (bool causal : causals) {
        std::mt19937_64 rng(11);
        MultiheadAttentionConfig cfg;
        cfg.embed_dim = 16;
        cfg.num_heads = 4;
        cfg.batch_first = batch_first;
        const auto mha = random_module<T>(cfg, rng);
        const int64_t L = 2048 + (B == 1 ? 3 : 0);
        const Tensor<T> x = random_tensor<T>(batch_first ? Shape{B, L, 16} : Shape{L, B, 16}, rng);
        ForwardOptions<T> o;
        o.need_weights = false;
        o.attention.is_causal = causal;
        const auto book = mha.forward_textbook(x, x, x, o);
        for (AttentionKernel kernel : kernels) {
          o.attention.kernel = kernel;
          const auto fused = mha.forward(x, x, x, o);
          EXPECT_LT(rel_error(fused.output, book.output), bound)
              << "batch_first " << batch_first << " B " << B << " causal " << causal << " kernel "
              << to_string(kernel);
        }
      }
}

TEST(FusedForm, LongSelfAttentionHeadMajorMatchesTextbook_L2048_Float32) {
  check_long_self_attention<float>({AttentionKernel::Flash, AttentionKernel::Materialized}, 1e-5, {1, 2},
                                   {false, true});
}
TEST(FusedForm, LongSelfAttentionHeadMajorMatchesTextbook_L2048_Float64) {
  check_long_self_attention<double>({AttentionKernel::Materialized}, 1e-12, {2}, {false});
}

// Lowers the projection block to its minimum (256 rows) for one scope, so
// that small inputs run many blocks and a short last one.
struct SmallProjectionBlocks {
  int64_t saved = detail::projection_block_bytes().exchange(1);
  ~SmallProjectionBlocks() { detail::projection_block_bytes() = saved; }
};

// Block by block: 2 × 2051 = 4102 token rows are 17 blocks of 256 rows, the
// last one 6 rows; self-attention (three parts per row) and cross-attention
// with kdim / vdim != E (one part, other input widths), both layouts.
TEST(FusedForm, HeadMajorProjectionManyBlocksMatchesTextbook) {
  const SmallProjectionBlocks small;
  for (bool batch_first : {false, true}) {
    std::mt19937_64 rng(5);
    MultiheadAttentionConfig cfg;
    cfg.embed_dim = 8;
    cfg.num_heads = 2;
    cfg.batch_first = batch_first;
    const auto self_mha = random_module<float>(cfg, rng);
    const Shape xs = batch_first ? Shape{2, 2051, 8} : Shape{2051, 2, 8};
    const Tensor<float> x = random_tensor<float>(xs, rng);
    ForwardOptions<float> o;
    o.need_weights = false;
    EXPECT_LT(rel_error(self_mha.forward(x, x, x, o).output, self_mha.forward_textbook(x, x, x, o).output),
              1e-5)
        << "self, batch_first " << batch_first;

    cfg.kdim = 5;
    cfg.vdim = 3;
    const auto cross_mha = random_module<float>(cfg, rng);
    const Tensor<float> q = random_tensor<float>(batch_first ? Shape{2, 300, 8} : Shape{300, 2, 8}, rng);
    const Tensor<float> k = random_tensor<float>(batch_first ? Shape{2, 2049, 5} : Shape{2049, 2, 5}, rng);
    const Tensor<float> v = random_tensor<float>(batch_first ? Shape{2, 2049, 3} : Shape{2049, 2, 3}, rng);
    EXPECT_LT(rel_error(cross_mha.forward(q, k, v, o).output, cross_mha.forward_textbook(q, k, v, o).output),
              1e-5)
        << "cross, batch_first " << batch_first;
  }
}

// Self-attention with bias_k / bias_v and the zero-attention key: short, but
// the appended key columns send it to the head-major path, where q is
// L rows per slice and k, v are S + 2. Flash (no weights) and materialized
// (weights) both against the textbook form.
TEST(FusedForm, HeadMajorSelfAttentionWithExtraKeysMatchesTextbook) {
  std::mt19937_64 rng(9);
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 12;
  cfg.num_heads = 3;
  cfg.add_bias_kv = true;
  cfg.add_zero_attn = true;
  const auto mha = random_module<float>(cfg, rng);
  const Tensor<float> x = random_tensor<float>(Shape{37, 3, 12}, rng);
  for (bool need_weights : {false, true}) {
    ForwardOptions<float> o;
    o.need_weights = need_weights;
    o.attention.is_causal = true;
    const auto fused = mha.forward(x, x, x, o);
    const auto book = mha.forward_textbook(x, x, x, o);
    EXPECT_LT(rel_error(fused.output, book.output), 1e-5) << "need_weights " << need_weights;
    if (need_weights) {
      EXPECT_LT(rel_error(*fused.attn_weights, *book.attn_weights), 1e-5);
    }
  }
}

// Independent oracle: multi-head attention written straight from the
// formula in double, sharing no code with the library.
TEST(FusedForm, MatchesFormulaInDouble_E12_H3_B2_L4_S5) {
  std::mt19937_64 rng(5);
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 12;
  cfg.num_heads = 3;
  const auto mha = random_module<double>(cfg, rng);
  const int64_t E = 12, H = 3, D = 4, B = 2, L = 4, S = 5;
  const Tensor<double> q = random_tensor<double>({L, B, E}, rng), k = random_tensor<double>({S, B, E}, rng),
                       v = random_tensor<double>({S, B, E}, rng);
  ForwardOptions<double> o;
  o.need_weights = false;
  const auto ours = mha.forward(q, k, v, o);
  const auto& P = mha.parameters();
  auto lin = [&](const Tensor<double>& x, int64_t t, int64_t b, int64_t block, int64_t f) {
    double acc = P.in_proj_bias[block * E + f];
    for (int64_t e = 0; e < E; ++e) acc += x[(t * B + b) * E + e] * P.in_proj_weight[(block * E + f) * E + e];
    return acc;
  };
  Tensor<double> expect({L, B, E});
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> concat(static_cast<std::size_t>(L * E));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        std::vector<double> s(S);
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < S; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += lin(q, i, b, 0, h * D + d) * lin(k, j, b, 1, h * D + d);
          s[j] = dot / std::sqrt(double(D));
          mx = std::max(mx, s[j]);
        }
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < S; ++j) acc += s[j] / sum * lin(v, j, b, 2, h * D + d);
          concat[i * E + h * D + d] = acc;
        }
      }
    for (int64_t i = 0; i < L; ++i)
      for (int64_t e = 0; e < E; ++e) {
        double acc = P.out_proj_bias[e];
        for (int64_t x = 0; x < E; ++x) acc += concat[i * E + x] * P.out_proj_weight[e * E + x];
        expect[(i * B + b) * E + e] = acc;
      }
  }
  EXPECT_LT(rel_error(ours.output, expect), 1e-13);
}

// ---- edge cases ------------------------------------------------------------

TEST(Edge, ScoresAround1e4StayFinite) {
  std::mt19937_64 rng(1);
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 8;
  cfg.num_heads = 2;
  auto mha = random_module<float>(cfg, rng);
  auto p = mha.parameters();
  for (auto& w : p.in_proj_weight.vec()) w *= 60.0f;  // scores ~ 1e4
  const BasicMultiheadAttention<float> big(cfg, p);
  Tensor<float> x = random_tensor<float>({6, 2, 8}, rng);
  for (auto& e : x.vec()) e *= 3.0f;
  for (AttentionKernel kernel : {AttentionKernel::Auto, AttentionKernel::Materialized, AttentionKernel::Reference}) {
    ForwardOptions<float> o;
    o.attention.kernel = kernel;
    const auto r = big.forward(x, x, x, o);
    for (float y : r.output.vec()) ASSERT_TRUE(std::isfinite(y)) << to_string(kernel);
    for (float y : r.attn_weights->vec()) ASSERT_TRUE(std::isfinite(y)) << to_string(kernel);
  }
}

TEST(Edge, FullyMaskedRowPolicies_Zeros_And_NaN) {
  std::mt19937_64 rng(2);
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 6;
  cfg.num_heads = 3;
  const auto mha = random_module<double>(cfg, rng);
  const Tensor<double> x = random_tensor<double>({4, 2, 6}, rng);  // L=S=4, B=2
  Tensor<uint8_t> kpm({2, 4}, 0);
  for (int j = 0; j < 4; ++j) kpm[1 * 4 + j] = 1;  // batch 1: every key padded
  const Mask<double> mask = Mask<double>::boolean(kpm);
  ForwardOptions<double> o;
  o.key_padding_mask = &mask;
  o.average_attn_weights = false;
  for (int form = 0; form < 2; ++form) {
    o.attention.masked_rows = MaskedRowPolicy::Zeros;
    auto r = form ? mha.forward_textbook(x, x, x, o) : mha.forward(x, x, x, o);
    for (int64_t l = 0; l < 4; ++l)
      for (int64_t e = 0; e < 6; ++e) {
        // Zeros: attention output 0, so the output is out_proj.bias.
        EXPECT_DOUBLE_EQ(r.output[(l * 2 + 1) * 6 + e], mha.parameters().out_proj_bias[e]);
        EXPECT_TRUE(std::isfinite(r.output[(l * 2 + 0) * 6 + e]));
      }
    for (int64_t x2 = 0; x2 < 3 * 4 * 4; ++x2) EXPECT_EQ((*r.attn_weights)[3 * 4 * 4 + x2], 0.0);
    o.attention.masked_rows = MaskedRowPolicy::NaN;
    r = form ? mha.forward_textbook(x, x, x, o) : mha.forward(x, x, x, o);
    for (int64_t l = 0; l < 4; ++l)
      for (int64_t e = 0; e < 6; ++e) {
        EXPECT_TRUE(std::isnan(r.output[(l * 2 + 1) * 6 + e]));
        EXPECT_TRUE(std::isfinite(r.output[(l * 2 + 0) * 6 + e]));
      }
  }
}

TEST(Edge, LengthOne_OneHead_HeadDimOne) {
  std::mt19937_64 rng(3);
  for (auto [E, H] : {std::pair<int64_t, int64_t>{1, 1}, {4, 4}, {5, 1}}) {
    MultiheadAttentionConfig cfg;
    cfg.embed_dim = E;
    cfg.num_heads = H;
    const auto mha = random_module<double>(cfg, rng);
    const Tensor<double> x = random_tensor<double>({1, 1, E}, rng);
    const auto r = mha.forward(x, x, x);
    // One key: its weight is 1, so output = W^O (W^V x + b^V) + b^O.
    for (double w : r.attn_weights->vec()) EXPECT_NEAR(w, 1.0, 1e-15);
    const auto book = mha.forward_textbook(x, x, x);
    EXPECT_LT(rel_error(r.output, book.output), 1e-13) << "E" << E << " H" << H;
  }
}

// ---- dropout -----------------------------------------------------------------

TEST(Dropout, RateAndScaling_p0_3) {
  std::mt19937_64 rng(4);
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 8;
  cfg.num_heads = 2;
  cfg.dropout = 0.3;
  const auto mha = random_module<double>(cfg, rng);
  const Tensor<double> x = random_tensor<double>({64, 2, 8}, rng);
  ForwardOptions<double> eval, train;
  eval.average_attn_weights = train.average_attn_weights = false;
  train.training = true;
  train.attention.dropout_seed = 99;
  const auto a = mha.forward(x, x, x, eval);
  const auto d = mha.forward(x, x, x, train);
  int64_t dropped = 0, n = a.attn_weights->numel();
  for (int64_t i = 0; i < n; ++i) {
    const double kept = (*d.attn_weights)[i];
    if (kept == 0.0) {
      ++dropped;
    } else {
      // Kept weights are scaled by 1/(1-p), PyTorch's inverted dropout.
      EXPECT_NEAR(kept, (*a.attn_weights)[i] / 0.7, 1e-12);
    }
  }
  // n = 16384 Bernoulli(0.3) draws: σ = √(n·p·(1-p)) ≈ 58.7; allow 5σ.
  EXPECT_NEAR(static_cast<double>(dropped), 0.3 * n, 5 * std::sqrt(n * 0.3 * 0.7));
  // The same seed drops the same elements in both forms and every kernel.
  const auto book = mha.forward_textbook(x, x, x, train);
  EXPECT_LT(rel_error(d.output, book.output), 1e-12);
  train.attention.kernel = AttentionKernel::Reference;
  EXPECT_LT(rel_error(d.output, mha.forward(x, x, x, train).output), 1e-12);
  // Eval mode ignores dropout.
  EXPECT_LT(rel_error(a.output, mha.forward(x, x, x, ForwardOptions<double>{}).output), 1e-15);
}

// ---- initialisation ------------------------------------------------------------

TEST(Init, MatchesPyTorchScheme_E64_H8_biaskv) {
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 64;
  cfg.num_heads = 8;
  cfg.add_bias_kv = true;
  const MultiheadAttention mha(cfg, 11);
  const auto& p = mha.parameters();
  // xavier_uniform on (3E, E): U(-a, a), a = √(6 / 4E).
  const double a = std::sqrt(6.0 / (4.0 * 64));
  double sumsq = 0;
  for (float w : p.in_proj_weight.vec()) {
    ASSERT_LE(std::abs(w), a);
    sumsq += w * w;
  }
  // Var U(-a, a) = a²/3; 12288 draws: relative sd of the estimate ≈ 0.8%.
  EXPECT_NEAR(sumsq / p.in_proj_weight.numel(), a * a / 3, 0.05 * a * a / 3);
  for (float w : p.out_proj_weight.vec()) ASSERT_LE(std::abs(w), 1.0 / 8.0);
  for (float b : p.in_proj_bias.vec()) ASSERT_EQ(b, 0.0f);
  for (float b : p.out_proj_bias.vec()) ASSERT_EQ(b, 0.0f);
  EXPECT_EQ(p.bias_k.shape(), (Shape{1, 1, 64}));
  // Same seed, same numbers; another seed, other numbers.
  EXPECT_EQ(MultiheadAttention(cfg, 11).parameters().in_proj_weight.vec(), p.in_proj_weight.vec());
  EXPECT_NE(MultiheadAttention(cfg, 12).parameters().in_proj_weight.vec(), p.in_proj_weight.vec());
}

// ---- bad input at the API boundary ------------------------------------------------

void expect_error(const std::function<void()>& f, Error::Kind kind, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
  }
}

TEST(BadInput, ShapesAreNamedWithExpectedAndActual) {
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 8;
  cfg.num_heads = 2;
  const MultiheadAttention mha(cfg, 0);
  const Tensor<float> q({5, 2, 8}), k({6, 2, 8}), wrong_e({5, 2, 7}), wrong_b({6, 3, 8});
  expect_error([&] { mha.forward(wrong_e, wrong_e, wrong_e); }, Error::Kind::Shape, {"query", "(5, 2, 8)", "(5, 2, 7)"});
  expect_error([&] { mha.forward(q, wrong_b, wrong_b); }, Error::Kind::Shape, {"key", "(6, 2, 8)", "(6, 3, 8)"});
  expect_error([&] { mha.forward(q, k, q); }, Error::Kind::Shape, {"value", "(6, 2, 8)", "(5, 2, 8)"});
  expect_error([&] { mha.forward(Tensor<float>({8}), k, k); }, Error::Kind::Shape, {"query", "(8)"});
  const Mask<float> kpm = Mask<float>::boolean(Tensor<uint8_t>({6, 2}));
  ForwardOptions<float> o;
  o.key_padding_mask = &kpm;
  expect_error([&] { mha.forward(q, k, k, o); }, Error::Kind::Shape, {"key_padding_mask", "(2, 6)", "(6, 2)"});
  const Mask<float> am = Mask<float>::additive(Tensor<float>({3, 5, 6}));
  ForwardOptions<float> o2;
  o2.attn_mask = &am;
  expect_error([&] { mha.forward(q, k, k, o2); }, Error::Kind::Shape, {"attn_mask", "(5, 6)", "(4, 5, 6)", "(3, 5, 6)"});
  Tensor<float> nan_q({5, 2, 8}, 0.0f);
  nan_q[17] = std::numeric_limits<float>::quiet_NaN();
  ForwardOptions<float> o3;
  o3.attention.check_finite = true;
  expect_error([&] { mha.forward(nan_q, k, k, o3); }, Error::Kind::Value, {"query", "nan", "(1, 0, 1)"});
  MultiheadAttentionConfig bad = cfg;
  bad.num_heads = 3;
  expect_error([&] { MultiheadAttention m(bad); }, Error::Kind::Value, {"num_heads", "8", "3"});
  auto p = mha.parameters();
  p.out_proj_bias = Tensor<float>({7});
  expect_error([&] { MultiheadAttention m(cfg, p); }, Error::Kind::Shape, {"out_proj.bias", "(8)", "(7)"});
}

// The process-wide switches: an unknown MULTIHEAD_KERNEL fails the forward
// that reads it, naming the variable; an unknown SIMD target (what
// MULTIHEAD_SIMD_TARGET goes through) names the value and lists the targets.
TEST(BadInput, EnvironmentSwitchesAreNamed) {
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 8;
  cfg.num_heads = 2;
  const MultiheadAttention mha(cfg, 1);
  const Tensor<float> x({5, 2, 8}, 0.5f);
  {
    struct KernelVariable {  // set for this scope only, whatever happens
      KernelVariable() { setenv("MULTIHEAD_KERNEL", "fast", 1); }
      ~KernelVariable() { unsetenv("MULTIHEAD_KERNEL"); }
    } scoped;
    expect_error([&] { (void)mha.forward(x, x, x); }, Error::Kind::Value,
                 {"MULTIHEAD_KERNEL: kernel: expected one of auto, reference, materialized, flash; got 'fast'"});
  }
  {
    struct PathsVariable {
      PathsVariable() { setenv("MULTIHEAD_FUSED_PATHS", "fastest", 1); }
      ~PathsVariable() { unsetenv("MULTIHEAD_FUSED_PATHS"); }
    } scoped;
    expect_error([&] { (void)mha.forward(x, x, x); }, Error::Kind::Value,
                 {"MULTIHEAD_FUSED_PATHS: expected one of auto, plain; got 'fastest'"});
  }
  expect_error([] { simd_target_force("AVX9"); }, Error::Kind::Value, {"AVX9", simd_targets_available().back()});
}

// NaN in the inputs propagates (PyTorch's behaviour) unless check_finite.
TEST(NonFinite, NaNPropagatesByDefault) {
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 4;
  cfg.num_heads = 2;
  const MultiheadAttention mha(cfg, 0);
  Tensor<float> x({3, 1, 4}, 0.5f);
  x[0] = std::numeric_limits<float>::quiet_NaN();
  const auto r = mha.forward(x, x, x);
  bool any_nan = false;
  for (float y : r.output.vec()) any_nan = any_nan || std::isnan(y);
  EXPECT_TRUE(any_nan);
}

}  // namespace
}  // namespace multihead

namespace multihead {
namespace {

TEST(BadInput, OptionsAndParametersAreNamed) {
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 4;
  cfg.num_heads = 2;
  const BasicMultiheadAttention<double> mha(cfg, 0);
  const Tensor<double> x({3, 1, 4}, 0.5);
  ForwardOptions<double> o;
  o.attention.num_threads = -1;
  expect_error([&] { mha.forward(x, x, x, o); }, Error::Kind::Value,
               {"num_threads: expected 0 (default) to " + std::to_string(max_threads()) + " (8 per processor), got -1"});
  // A thread count the system may not be able to start is refused, not
  // handed to the OpenMP runtime (which stops the process on failure).
  o.attention.num_threads = max_threads() + 1;
  expect_error([&] { mha.forward(x, x, x, o); }, Error::Kind::Value,
               {"num_threads: expected 0 (default) to " + std::to_string(max_threads()) + " (8 per processor), got " +
                std::to_string(max_threads() + 1)});
  expect_error([&] { set_threads(max_threads() + 1); }, Error::Kind::Value,
               {"threads: expected at most " + std::to_string(max_threads()) + " (8 per processor), got " +
                std::to_string(max_threads() + 1)});
  ForwardOptions<double> flash;
  flash.attention.kernel = AttentionKernel::Flash;
  flash.need_weights = false;
  expect_error([&] { mha.forward(x, x, x, flash); }, Error::Kind::Value,
               {"kernel: flash runs in float32 only; this call is float64 (use kernel=materialized)"});
  auto p = mha.parameters();
  p.bias_k = Tensor<double>({1, 1, 4});
  expect_error([&] { BasicMultiheadAttention<double> m(cfg, p); }, Error::Kind::Value,
               {"bias_k: unexpected tensor of shape (1, 1, 4) (add_bias_kv is false)"});
  AttentionOptions so;
  so.scale = std::numeric_limits<double>::infinity();
  const Tensor<double> q({2, 4});
  expect_error([&] { scaled_dot_product_attention(q, q, q, nullptr, so); }, Error::Kind::Value,
               {"scale: expected a finite number, got inf"});
  so = {};
  so.dropout_p = 2;
  expect_error([&] { scaled_dot_product_attention(q, q, q, nullptr, so); }, Error::Kind::Value, {"dropout_p", "got 2"});
  expect_error([&] { parse_attention_kernel("fast"); }, Error::Kind::Value,
               {"kernel: expected one of auto, reference, materialized, flash; got 'fast'"});
  MultiheadAttentionConfig bad = cfg;
  bad.dropout = 1.5;
  expect_error([&] { MultiheadAttention m(bad); }, Error::Kind::Value, {"dropout", "got 1.5"});
}

}  // namespace
}  // namespace multihead
