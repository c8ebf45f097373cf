// The vector conversions (src/core/narrow_rows.hpp) against the scalar rules
// they transcribe (multihead/narrow.hpp), bit for bit, on every Highway
// target this binary has and this CPU runs:
//  - rounding to bf16: every upper half (all 2^16) with the lower halves
//    that decide a rounding (0, 1, just below, at and above the tie 0x8000,
//    0xffff): every tie, NaN, infinity and overflow;
//  - rounding to f16: every value of the top 19 bits (sign, exponent, the 10
//    kept mantissa bits and 2 more) with the low 13 bits at 0, 1, below, at
//    and above the tie and all ones: the ties of normal results, and those
//    of subnormal results, whose rounding bit lies in the enumerated bits;
//  - the bias: round(acc + widen(bias)), one float addition;
//  - widening: all 2^16 patterns of each type.
// Then strided rows and thread counts, which must not change a bit.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/narrow_rows.hpp"
#include "highway_targets.hpp"
#include "kernels/kernel.hpp"
#include "multihead/attention.hpp"
#include "multihead/narrow_grouped_query_attention.hpp"
#include "multihead/narrow_multihead_attention.hpp"
#include "multihead/runtime.hpp"
#include "simd/targets.hpp"
#include "test_util.hpp"

namespace multihead::detail {
namespace {

using test::for_each_highway_target;

std::vector<float> floats_from_bits(const std::vector<uint32_t>& bits) {
  std::vector<float> out(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) out[i] = std::bit_cast<float>(bits[i]);
  return out;
}

template <class E>
void expect_rounding_matches_scalar(const std::vector<float>& x, const std::string& target) {
  std::vector<E> got(x.size());
  round_rows(x.data(), 1, static_cast<int64_t>(x.size()), 0, static_cast<const E*>(nullptr), got.data(), 0, 2);
  int64_t mismatches = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const uint16_t want = narrow_from_float<E>(x[i]).bits;
    if (got[i].bits != want && mismatches++ < 5)
      ADD_FAILURE() << target << ": input bits 0x" << std::hex << std::bit_cast<uint32_t>(x[i]) << " gave 0x"
                    << got[i].bits << ", the scalar rule 0x" << want;
  }
  EXPECT_EQ(mismatches, 0) << target;
}

TEST(NarrowRows, Bf16RoundingMatchesScalarOnEveryTie) {
  std::vector<uint32_t> bits;
  for (uint32_t hi = 0; hi < (1u << 16); ++hi)
    for (const uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xfffeu, 0xffffu})
      bits.push_back(hi << 16 | lo);
  const std::vector<float> x = floats_from_bits(bits);
  for_each_highway_target([&](const std::string& target) { expect_rounding_matches_scalar<bfloat16>(x, target); });
}

TEST(NarrowRows, F16RoundingMatchesScalarOnEveryBoundary) {
  std::vector<uint32_t> bits;
  for (uint32_t hi = 0; hi < (1u << 19); ++hi)
    for (const uint32_t lo : {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu}) bits.push_back(hi << 13 | lo);
  const std::vector<float> x = floats_from_bits(bits);
  for_each_highway_target([&](const std::string& target) { expect_rounding_matches_scalar<float16>(x, target); });
}

template <class E>
void expect_widening_matches_scalar(const std::string& target) {
  std::vector<E> h(1u << 16);
  for (uint32_t b = 0; b < (1u << 16); ++b) h[b].bits = static_cast<uint16_t>(b);
  std::vector<float> got(h.size());
  widen_rows(h.data(), 1, static_cast<int64_t>(h.size()), 0, got.data(), 0, 2);
  int64_t mismatches = 0;
  for (std::size_t i = 0; i < h.size(); ++i) {
    const float want = to_float(h[i]);
    // A NaN widens to a NaN of the same sign: F16C's vcvtph2ps quiets a
    // signalling f16 NaN, which the scalar rule keeps signalling.
    const bool same = std::isnan(want) ? std::isnan(got[i]) && std::signbit(got[i]) == std::signbit(want)
                                       : std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want);
    if (!same && mismatches++ < 5)
      ADD_FAILURE() << target << ": 16-bit pattern 0x" << std::hex << h[i].bits << " widened to 0x"
                    << std::bit_cast<uint32_t>(got[i]) << ", the scalar rule 0x" << std::bit_cast<uint32_t>(want);
  }
  EXPECT_EQ(mismatches, 0) << target;
}

TEST(NarrowRows, WideningMatchesScalarOnEveryPattern) {
  for_each_highway_target([](const std::string& target) {
    expect_widening_matches_scalar<bfloat16>(target);
    expect_widening_matches_scalar<float16>(target);
  });
}

// split_rows (core/gemm.cpp's bf16x3 product): every f16 pattern is
// hi + lo exactly, hi its nearest bf16 (the scalar rule), lo = x - hi a bf16
// (so rounding it lost nothing), neither a bf16 denormal; hi written twice
// when asked; false exactly when some element is an infinity or NaN. Rows
// of 65536 + 3 (vector body, scalar tail), 1 and 2 threads, on every target.
TEST(NarrowRows, F16SplitsExactlyIntoTwoBf16OnEveryPattern) {
  for_each_highway_target([](const std::string& target) {
    std::vector<float16> all;
    for (uint32_t b = 0; b < 0x10000u; ++b)
      if (!std::isnan(to_float(float16{static_cast<uint16_t>(b)}))) all.push_back(float16{static_cast<uint16_t>(b)});
    const int64_t finite_n = static_cast<int64_t>(all.size());
    for (uint16_t b : {0x3c00, 0x0001, 0xfbff}) all.push_back(float16{b});  // a tail of 3
    const auto n = static_cast<int64_t>(all.size());
    std::vector<int64_t> non_finite;
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(to_float(all[static_cast<std::size_t>(i)]))) non_finite.push_back(i);
    ASSERT_EQ(non_finite.size(), 2u);  // ±inf (NaNs left out above)
    for (const int threads : {1, 2}) {
      std::vector<bfloat16> hi(static_cast<std::size_t>(n)), again(static_cast<std::size_t>(n)), lo(static_cast<std::size_t>(n));
      EXPECT_FALSE(split_rows(all.data(), 1, n, n, hi.data(), again.data(), lo.data(), n, threads)) << target;
      // Without the infinities: every element finite, so true.
      std::vector<float16> finite;
      for (const float16 x : all)
        if (std::isfinite(to_float(x))) finite.push_back(x);
      const auto m = static_cast<int64_t>(finite.size());
      ASSERT_EQ(m, finite_n + 3 - 2);
      ASSERT_TRUE(split_rows(finite.data(), 1, m, m, hi.data(), again.data(), lo.data(), m, threads)) << target;
      for (int64_t i = 0; i < m; ++i) {
        const std::size_t k = static_cast<std::size_t>(i);
        const float x = to_float(finite[k]), h = to_float(hi[k]), l = to_float(lo[k]);
        ASSERT_EQ(hi[k].bits, to_bfloat16(x).bits) << target << " f16 0x" << std::hex << finite[k].bits;
        ASSERT_EQ(again[k].bits, hi[k].bits) << target;
        ASSERT_EQ(static_cast<double>(h) + static_cast<double>(l), static_cast<double>(x))
            << target << " f16 0x" << std::hex << finite[k].bits;
        ASSERT_TRUE(h == 0 || std::abs(h) >= 0x1p-126f) << target;
        ASSERT_TRUE(l == 0 || std::abs(l) >= 0x1p-126f) << target;
        ASSERT_LE(std::abs(l), 0x1p-8f * std::abs(x)) << target;  // |lo| <= 2^-8 |x|: the dropped term's bound
      }
      // No second copy asked: the same pieces.
      std::vector<bfloat16> hi2(static_cast<std::size_t>(m)), lo2(static_cast<std::size_t>(m));
      ASSERT_TRUE(split_rows(finite.data(), 1, m, m, hi2.data(), nullptr, lo2.data(), m, threads));
      for (int64_t i = 0; i < m; ++i) {
        ASSERT_EQ(hi2[static_cast<std::size_t>(i)].bits, hi[static_cast<std::size_t>(i)].bits);
        ASSERT_EQ(lo2[static_cast<std::size_t>(i)].bits, lo[static_cast<std::size_t>(i)].bits);
      }
    }
  });
}

// Strided rows (ld > cols), a bias per column, odd widths (vector body and
// scalar tail), 1 and 2 threads: against the scalar rule element by element.
template <class E>
void expect_strided_rows_with_bias(const std::string& target) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {5, 33}, {2, 4099}, {17, 130}}) {
    const int64_t ld_src = cols + 3, ld_dst = cols + 5;
    std::vector<float> acc(static_cast<std::size_t>(rows * ld_src));
    for (float& v : acc) v = normal(rng);
    std::vector<E> bias(static_cast<std::size_t>(cols));
    for (E& b : bias) b = narrow_from_float<E>(normal(rng));
    for (const int threads : {1, 2}) {
      const E sentinel{0x1234};
      std::vector<E> out(static_cast<std::size_t>(rows * ld_dst), sentinel);
      round_rows(acc.data(), rows, cols, ld_src, bias.data(), out.data(), ld_dst, threads);
      std::vector<float> widened(static_cast<std::size_t>(rows * ld_dst), -1.0f);
      widen_rows(out.data(), rows, cols, ld_dst, widened.data(), ld_dst, threads);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < ld_dst; ++c) {
          const std::size_t i = static_cast<std::size_t>(r * ld_dst + c);
          if (c >= cols) {  // the gap between rows is never written
            ASSERT_EQ(out[i].bits, sentinel.bits) << target << " row " << r << " col " << c;
            ASSERT_EQ(widened[i], -1.0f) << target << " row " << r << " col " << c;
            continue;
          }
          const float sum = acc[static_cast<std::size_t>(r * ld_src + c)] + to_float(bias[static_cast<std::size_t>(c)]);
          ASSERT_EQ(out[i].bits, narrow_from_float<E>(sum).bits)
              << target << " rows " << rows << " cols " << cols << " threads " << threads << " at " << r << "," << c;
          ASSERT_EQ(widened[i], to_float(out[i])) << target << " at " << r << "," << c;
        }
    }
  }
}

TEST(NarrowRows, StridedRowsWithBiasMatchScalar) {
  for_each_highway_target([](const std::string& target) {
    expect_strided_rows_with_bias<bfloat16>(target);
    expect_strided_rows_with_bias<float16>(target);
  });
}

// The flash kernel's two ways with 16-bit operands where it widens (f16,
// and bf16's fma way): the K/V tiles widened for every query tile, or Q, K
// and V widened once per call and the float32 kernel (kernels/flash.cpp).
// The same arithmetic on the same values, so the same bits: checked on the
// module forward (self- and cross-attention, causal, a key padding mask,
// batch_first strides, bias_kv) and grouped-query attention, on every
// target, at lengths that take the once path (L >= the work item's rows).
template <class E>
void expect_widen_once_matches_tile_way(const std::string& target) {
  std::mt19937_64 rng(11);
  struct Case {
    int64_t B, L, S, Emb, H;
    bool causal, padding, batch_first, bias_kv;
  };
  for (const Case& c : {Case{1, 200, 200, 64, 4, false, false, false, false},
                        Case{2, 130, 77, 48, 3, true, true, true, false},
                        Case{2, 129, 129, 32, 2, false, true, false, true}}) {
    MultiheadAttentionConfig config;
    config.embed_dim = c.Emb;
    config.num_heads = c.H;
    config.batch_first = c.batch_first;
    config.add_bias_kv = c.bias_kv;
    const MultiheadAttention f32(config, 5);
    const auto module = NarrowMultiheadAttention<E>::rounded(config, f32.parameters());
    const Shape qs = c.batch_first ? Shape{c.B, c.L, c.Emb} : Shape{c.L, c.B, c.Emb};
    const Shape ks = c.batch_first ? Shape{c.B, c.S, c.Emb} : Shape{c.S, c.B, c.Emb};
    const Tensor<E> q = round_to<E>(test::random_tensor<float>(qs, rng));
    const Tensor<E> kv = round_to<E>(test::random_tensor<float>(ks, rng));
    Tensor<uint8_t> pad(Shape{c.B, c.S});
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t j = 0; j < c.S; ++j) pad.data()[b * c.S + j] = (j % 7 == 3) ? 1 : 0;
    const Mask<float> padding = Mask<float>::boolean(pad);
    ForwardOptions<float> options;
    options.need_weights = false;
    options.attention.is_causal = c.causal;
    if (c.padding) options.key_padding_mask = &padding;
    const Tensor<E>& key = c.L == c.S ? q : kv;
    flash_narrow_widen_once(false);
    const Tensor<E> tiles = module.forward(q, key, key, options);
    flash_narrow_widen_once(true);
    const Tensor<E> once = module.forward(q, key, key, options);
    ASSERT_EQ(tiles.numel(), once.numel());
    for (int64_t i = 0; i < once.numel(); ++i)
      ASSERT_EQ(tiles.data()[i].bits, once.data()[i].bits) << target << " L " << c.L << " element " << i;
  }
  GroupedQueryAttentionConfig gc;
  gc.embed_dim = 64;
  gc.num_heads = 4;
  gc.num_kv_heads = 2;
  gc.causal = true;
  const GroupedQueryAttention<float> g32(gc, 9);
  const auto gqa = NarrowGroupedQueryAttention<E>::rounded(gc, g32.parameters());
  const Tensor<E> x = round_to<E>(test::random_tensor<float>(Shape{2, 150, 64}, rng));
  flash_narrow_widen_once(false);
  const Tensor<E> tiles = gqa.forward(x);
  flash_narrow_widen_once(true);
  const Tensor<E> once = gqa.forward(x);
  for (int64_t i = 0; i < once.numel(); ++i)
    ASSERT_EQ(tiles.data()[i].bits, once.data()[i].bits) << target << " GQA element " << i;
}

TEST(NarrowRows, FlashWidenOnceMatchesTileWay) {
  narrow_attention_force("flash");  // the flash kernel's bf16 ways
  bf16_dot_force("fma");
  for (const std::string& target : simd_targets_available()) {
    simd_target_force(target);
    expect_widen_once_matches_tile_way<bfloat16>(target);
    expect_widen_once_matches_tile_way<float16>(target);
  }
  simd_target_force("");
  bf16_dot_force("");
  narrow_attention_force("");
  flash_narrow_widen_once(true);
}

// bf16's pair way (Bf16Way::Dot) the same: K and V packed as pairs for
// every key tile of every query tile, or once per call (kernels/flash.cpp,
// run_flash_on_pairs; the kernel then packs only a tile whose keys start or
// end on an odd key before S). Same pairs, same bits. The module cases
// above, then scaled_dot_product_attention at the tile edges a whole-call
// packing could get wrong: odd S (the last pair's zero high), odd D (each
// row's), and windows and bottom-right causal ranges whose visible keys
// start on an odd key.
void expect_pairs_once_match_tile_way(const std::string& target) {
  expect_widen_once_matches_tile_way<bfloat16>(target);
  std::mt19937_64 rng(17);
  struct Case {
    int64_t N, L, S, D;
    bool causal;
    std::optional<int64_t> window;
  };
  for (const Case& c : {Case{3, 200, 301, 64, false, std::nullopt}, Case{2, 130, 131, 15, false, std::nullopt},
                        Case{2, 150, 150, 32, true, 37}, Case{2, 140, 333, 16, false, 51},
                        Case{2, 129, 257, 8, true, std::nullopt}, Case{1, 300, 300, 9, true, 100}}) {
    const Tensor<bfloat16> q = round_to<bfloat16>(test::random_tensor<float>(Shape{c.N, c.L, c.D}, rng));
    const Tensor<bfloat16> k = round_to<bfloat16>(test::random_tensor<float>(Shape{c.N, c.S, c.D}, rng));
    const Tensor<bfloat16> v = round_to<bfloat16>(test::random_tensor<float>(Shape{c.N, c.S, c.D + 3}, rng));
    AttentionOptions options;
    options.is_causal = c.causal;
    options.causal_alignment = CausalAlignment::BottomRight;
    options.window = c.window;
    flash_narrow_widen_once(false);
    const Tensor<bfloat16> tiles = scaled_dot_product_attention(q, k, v, nullptr, options);
    flash_narrow_widen_once(true);
    const Tensor<bfloat16> once = scaled_dot_product_attention(q, k, v, nullptr, options);
    ASSERT_EQ(tiles.numel(), once.numel());
    for (int64_t i = 0; i < once.numel(); ++i)
      ASSERT_EQ(tiles.data()[i].bits, once.data()[i].bits)
          << target << " N " << c.N << " L " << c.L << " S " << c.S << " D " << c.D << " causal " << c.causal
          << " window " << c.window.value_or(0) << " element " << i;
  }
}

TEST(NarrowRows, FlashPairsOnceMatchTileWay) {
  narrow_attention_force("flash");  // the flash kernel's bf16 ways
  bf16_dot_force("dpbf16");
  for (const std::string& target : simd_targets_available()) {
    simd_target_force(target);
    expect_pairs_once_match_tile_way(target);
  }
  simd_target_force("");
  bf16_dot_force("");
  narrow_attention_force("");
  flash_narrow_widen_once(true);
}

}  // namespace
}  // namespace multihead::detail
