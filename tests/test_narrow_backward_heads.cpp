// The 16-bit module's backward from kBackwardHeadMajorFromKeys (512) keys
// on widens Q, K, V, the merged heads and d_concat straight into head-major
// float32 copies, runs the float32 flash backward on contiguous heads and
// rounds d_Q, d_K, d_V back into the projections' rows
// (narrow_multihead_attention_backward.cpp). Below that, or with
// MULTIHEAD_BACKWARD_HEADS=views, it widens the token rows as they are and
// the kernel reads the heads in place. The kernel's arithmetic does not
// depend on the layout, so every gradient must be the same bits both ways;
// the views way is the one the precision tests check against float64
// (tests/precision/test_precision_backward.cpp, S <= 130). A wrong head, row
// or stride in a copy or a rounding back moves whole rows: not the same bits.
//
// bf16 where the flash backward runs the pair way reads the saved bf16
// operands themselves, with no float32 copies (MULTIHEAD_BF16_BACKWARD=copies
// forces the copies): the same values, so again the same bits, here with the
// pair way forced (bf16_dot_force), so on every host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

#include "multihead/error.hpp"
#include "multihead/narrow_grouped_query_attention.hpp"
#include "multihead/narrow_multihead_attention.hpp"
#include "multihead/runtime.hpp"
#include "simd/targets.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

struct Case {
  const char* name;
  int64_t E, H, B, L, S, kdim, vdim;
  bool self, batch_first, causal, padding;
  bool bias_kv = false, zero_attn = false;
};

// Self-attention at S = 512 (the rule's edge), packed weights, causal,
// seq-first; cross-attention at S = 520, L = 37, kdim/vdim (separate
// weights), batch_first, a key padding mask; B = 2 in both, so the batch
// stride of every layout is exercised.
const Case kCases[] = {
    {"self_causal_S512", 32, 2, 2, 512, 512, 0, 0, true, false, true, false},
    {"cross_kdim_vdim_batch_first_padding_S520", 48, 4, 2, 37, 520, 24, 40, false, true, false, true},
};

template <class E>
MultiheadAttentionGradients<E> step(const NarrowMultiheadAttention<E>& m, const Case& c, const char* heads,
                                    const char* bf16_backward = "auto") {
  std::mt19937_64 rng(5);
  const int64_t Ek = c.kdim > 0 ? c.kdim : c.E, Ev = c.vdim > 0 ? c.vdim : c.E;
  const auto shape = [&](int64_t len, int64_t width) {
    return c.batch_first ? Shape{c.B, len, width} : Shape{len, c.B, width};
  };
  const Tensor<E> q = round_to<E>(test::random_tensor<float>(shape(c.L, c.E), rng));
  const Tensor<E> k = c.self ? q : round_to<E>(test::random_tensor<float>(shape(c.S, Ek), rng));
  const Tensor<E> v = c.self ? q : round_to<E>(test::random_tensor<float>(shape(c.S, Ev), rng));
  Tensor<uint8_t> pad(Shape{c.B, c.S});
  for (int64_t i = 0; i < pad.numel(); ++i) pad[i] = (i % 11 == 4) ? 1 : 0;
  const Mask<float> padding = Mask<float>::boolean(pad);
  ForwardOptions<float> options;
  options.need_weights = false;
  options.attention.is_causal = c.causal;
  if (c.padding) options.key_padding_mask = &padding;
  NarrowForwardContext<E> ctx;
  const Tensor<E> y = m.forward(q, k, v, options, ctx);
  Tensor<E> d_y(y.shape());
  for (int64_t i = 0; i < d_y.numel(); ++i) d_y[i] = narrow_from_float<E>(std::sin(0.61f * static_cast<float>(i)));
  setenv("MULTIHEAD_BACKWARD_HEADS", heads, 1);
  setenv("MULTIHEAD_BF16_BACKWARD", bf16_backward, 1);
  MultiheadAttentionGradients<E> g = m.backward(ctx, d_y);
  unsetenv("MULTIHEAD_BACKWARD_HEADS");
  unsetenv("MULTIHEAD_BF16_BACKWARD");
  return g;
}

template <class E>
void expect_same_bits(const Tensor<E>& a, const Tensor<E>& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a[i].bits, b[i].bits) << what << ", element " << i;
}

template <class E>
NarrowMultiheadAttention<E> module_for(const Case& c) {
  MultiheadAttentionConfig config;
  config.embed_dim = c.E;
  config.num_heads = c.H;
  config.kdim = c.kdim;
  config.vdim = c.vdim;
  config.batch_first = c.batch_first;
  config.add_bias_kv = c.bias_kv;
  config.add_zero_attn = c.zero_attn;
  return NarrowMultiheadAttention<E>::rounded(config, MultiheadAttention(config, 7).parameters());
}

// Every gradient of two backwards the same bits; and not all zero.
template <class E>
void expect_same_gradients(const Case& c, const MultiheadAttentionGradients<E>& copied,
                           const MultiheadAttentionGradients<E>& in_place, const std::string& label) {
  expect_same_bits(copied.query, in_place.query, label + " d_query");
  if (!c.self) {
    expect_same_bits(copied.key, in_place.key, label + " d_key");
    expect_same_bits(copied.value, in_place.value, label + " d_value");
  }
  ASSERT_EQ(copied.parameters.size(), in_place.parameters.size()) << label;
  for (const auto& [name, t] : in_place.parameters) expect_same_bits(copied.parameters.at(name), t, label + " d_" + name);
  double norm = 0;
  for (int64_t i = 0; i < copied.query.numel(); ++i) norm += std::abs(to_float(copied.query[i]));
  EXPECT_GT(norm, 0.0) << label;
}

template <class E>
void check_head_major_matches_views() {
  for (const Case& c : kCases) {
    const std::string label = std::string(c.name) + (std::is_same_v<E, bfloat16> ? " bf16" : " f16");
    const auto m = module_for<E>(c);
    // bf16: the copies (MULTIHEAD_BF16_BACKWARD=copies), whose layout the rule picks.
    const MultiheadAttentionGradients<E> copied = step(m, c, "auto", "copies"), in_place = step(m, c, "views", "copies");
    expect_same_gradients(c, copied, in_place, label);
  }
}

TEST(NarrowBackward, HeadMajorCopiesGiveTheViewsBits) {
  check_head_major_matches_views<bfloat16>();
  check_head_major_matches_views<float16>();
}

// The bf16 operands in place against float32 copies, head-major (S >= 512,
// where the rule keeps the copies) and as views: self-attention (the stacked in_projection gradient),
// cross-attention with kdim/vdim, bias_k/v and the zero-attention row (K', V'
// copies with extra rows), an odd head width (pairs with a zero high) and an
// odd key count.
TEST(NarrowBackward, Bf16OperandsGiveTheCopiesBits) {
  const Case cases[] = {
      kCases[0],
      kCases[1],
      {"self_S128", 64, 4, 3, 128, 128, 0, 0, true, false, false, false},
      {"cross_bias_kv_zero_attn_odd_S", 40, 4, 2, 19, 33, 0, 0, false, false, true, true, true, true},
      {"odd_head_width_batch_first", 30, 2, 2, 21, 21, 0, 0, true, true, false, false},
  };
  narrow_attention_force("flash");  // the flash kernel's bf16 ways
  detail::bf16_dot_force("dpbf16");  // the pair way, natively or emulated
  for (const Case& c : cases) {
    const auto m = module_for<bfloat16>(c);
    const auto in_place = step(m, c, "auto", "auto");
    expect_same_gradients(c, step(m, c, "auto", "copies"), in_place, std::string(c.name) + " head rule");
    expect_same_gradients(c, step(m, c, "views", "copies"), in_place, std::string(c.name) + " views");
    // From 512 keys the rule takes the head-major copies; views read in place.
    expect_same_gradients(c, step(m, c, "views", "auto"), in_place, std::string(c.name) + " views in place");
  }
  detail::bf16_dot_force("");
  narrow_attention_force("");
  // A bad value of the switch is named, on any bf16 backward.
  const auto m = module_for<bfloat16>(cases[2]);
  try {
    step(m, cases[2], "auto", "copy");
    ADD_FAILURE() << "MULTIHEAD_BF16_BACKWARD=copy was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "MULTIHEAD_BF16_BACKWARD: expected one of auto, copies; got 'copy'");
  }
  unsetenv("MULTIHEAD_BACKWARD_HEADS");
  unsetenv("MULTIHEAD_BF16_BACKWARD");
}

// The grouped-query module's bf16 backward: the saved bf16 q, k, v, merged
// and d_merged read in place against float32 copies (MULTIHEAD_BF16_BACKWARD=
// copies), the pair way forced: groups of 2 and 4 query heads per K/V head,
// multi-query, RoPE in both conventions, biases, causal and not, an odd
// head width, a sliding window with ALiBi and a soft cap.
TEST(NarrowBackward, GqaBf16OperandsGiveTheCopiesBits) {
  struct GqaCase {
    const char* name;
    int64_t E, H, Hkv, D, B, L;
    bool bias, causal, rope, rope_half;
    int64_t window;
    bool alibi;
    float softcap;
  };
  const GqaCase cases[] = {
      {"groups2_rope_bias_causal", 64, 4, 2, 16, 2, 37, true, true, true, false, 0, false, 0.0f},
      {"multi_query_rope_half", 48, 6, 1, 8, 1, 70, false, true, true, true, 0, false, 0.0f},
      {"groups4_odd_D_not_causal", 40, 8, 2, 5, 2, 29, true, false, false, false, 0, false, 0.0f},
      {"window_alibi_softcap", 32, 4, 4, 8, 2, 45, false, true, false, false, 9, true, 30.0f},
  };
  narrow_attention_force("flash");  // the flash kernel's bf16 ways
  detail::bf16_dot_force("dpbf16");  // the pair way, natively or emulated
  for (const GqaCase& c : cases) {
    GroupedQueryAttentionConfig config;
    config.embed_dim = c.E;
    config.num_heads = c.H;
    config.num_kv_heads = c.Hkv;
    config.head_dim = c.D;
    config.bias = c.bias;
    config.causal = c.causal;
    if (c.rope) {
      RopeOptions r;
      r.convention = c.rope_half ? RopeConvention::HalfSplit : RopeConvention::Interleaved;
      config.rope = r;
    }
    const auto m = NarrowGroupedQueryAttention<bfloat16>::rounded(config, GroupedQueryAttention<float>(config, 11).parameters());
    std::mt19937_64 rng(9);
    const Tensor<bfloat16> x = round_to<bfloat16>(test::random_tensor<float>(Shape{c.B, c.L, c.E}, rng));
    AttentionOptions options;
    if (c.window > 0) options.window = c.window;
    if (c.softcap > 0.0f) options.softcap = c.softcap;
    if (c.alibi) options.alibi_slopes = alibi_slopes(c.H);
    NarrowGroupedQueryForwardContext<bfloat16> ctx;
    const Tensor<bfloat16> y = m.forward(x, options, ctx);
    Tensor<bfloat16> d_y(y.shape());
    for (int64_t i = 0; i < d_y.numel(); ++i) d_y[i] = to_bfloat16(std::cos(0.37f * static_cast<float>(i)));
    const auto run = [&](const char* way) {
      setenv("MULTIHEAD_BF16_BACKWARD", way, 1);
      GroupedQueryAttentionGradients<bfloat16> g = m.backward(ctx, d_y);
      unsetenv("MULTIHEAD_BF16_BACKWARD");
      return g;
    };
    const GroupedQueryAttentionGradients<bfloat16> in_place = run("auto"), copied = run("copies");
    const std::string label = c.name;
    expect_same_bits(copied.x, in_place.x, label + " d_x");
    ASSERT_EQ(copied.parameters.size(), in_place.parameters.size()) << label;
    for (const auto& [name, t] : in_place.parameters) expect_same_bits(copied.parameters.at(name), t, label + " d_" + name);
    double norm = 0;
    for (int64_t i = 0; i < in_place.x.numel(); ++i) norm += std::abs(to_float(in_place.x[i]));
    EXPECT_GT(norm, 0.0) << label;
  }
  detail::bf16_dot_force("");
  narrow_attention_force("");
}

// The bf16 backward's matmul way (kernels/narrow_matmul.hpp, forced) inside
// the modules, across its chunks of 512 keys and blocks of 256 query rows:
// the operands as the modules lay them out (token rows, seq-first and
// batch_first, B = 2), cross-attention with kdim/vdim, bias_k/v and the
// zero-attention key (keys without a position) under the causal rule and a
// key padding mask, and grouped-query heads (two query heads per K/V head)
// with causal, a window, ALiBi and a soft-cap. Each step's gradients:
//  - the same bits from the bf16 rows in place and from the float32 copies
//    (MULTIHEAD_BF16_BACKWARD=copies);
//  - within 16·2⁻⁸ of the flash kernel's, relative to each gradient's
//    largest magnitude: the attention step's gradients agree within 8·2⁻⁸
//    (PrecisionBackwardMatmulWay), and each module gradient is one more
//    product of exact bf16 products in float32 and one rounding; a wrong
//    head, row or chunk moves gradients by their own size;
//  - not the flash kernel's bits everywhere (the matmul way ran).
template <class T>
double worst_relative(const Tensor<T>& got, const Tensor<T>& want) {
  double scale = 0, worst = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    scale = std::max(scale, static_cast<double>(std::abs(to_float(want[i]))));
    worst = std::max(worst, static_cast<double>(std::abs(to_float(got[i]) - to_float(want[i]))));
  }
  return scale > 0 ? worst / scale : (worst > 0 ? INFINITY : 0.0);
}

template <class T>
bool differ(const Tensor<T>& a, const Tensor<T>& b) {
  for (int64_t i = 0; i < a.numel(); ++i)
    if (a[i].bits != b[i].bits) return true;
  return false;
}

TEST(NarrowBackward, MatmulWayInTheModulesAcrossChunks) {
  const double tolerance = 16 * std::ldexp(1.0, -8);
  const Case cases[] = {
      {"self_causal_L600", 64, 4, 2, 600, 600, 0, 0, true, false, true, false},
      {"cross_causal_bias_kv_zero_attn_padding_S1100", 48, 4, 2, 300, 1100, 24, 40, false, true, true, true, true,
       true},
  };
  for (const Case& c : cases) {
    const auto m = module_for<bfloat16>(c);
    narrow_attention_force("flash");
    const MultiheadAttentionGradients<bfloat16> flash = step(m, c, "auto", "auto");
    narrow_attention_force("matmul");
    const MultiheadAttentionGradients<bfloat16> in_place = step(m, c, "auto", "auto");
    const MultiheadAttentionGradients<bfloat16> copied = step(m, c, "auto", "copies");
    narrow_attention_force("");
    expect_same_gradients(c, copied, in_place, std::string(c.name) + " matmul, in place against copies");
    bool ran = differ(in_place.query, flash.query);
    EXPECT_LE(worst_relative(in_place.query, flash.query), tolerance) << c.name << " d_query";
    if (!c.self) {
      EXPECT_LE(worst_relative(in_place.key, flash.key), tolerance) << c.name << " d_key";
      EXPECT_LE(worst_relative(in_place.value, flash.value), tolerance) << c.name << " d_value";
    }
    for (const auto& [name, t] : in_place.parameters) {
      EXPECT_LE(worst_relative(t, flash.parameters.at(name)), tolerance) << c.name << " d_" << name;
      ran = ran || differ(t, flash.parameters.at(name));
    }
    EXPECT_TRUE(ran) << c.name << ": the matmul way gave the flash kernel's bits";
  }

  struct GqaCase {
    const char* name;
    int64_t window;
    bool alibi;
    float softcap;
  };
  for (const GqaCase& c : {GqaCase{"groups2_causal_L600", 0, false, 0.0f}, GqaCase{"groups2_window_alibi_softcap_L600", 300, true, 20.0f}}) {
    GroupedQueryAttentionConfig config;
    config.embed_dim = 64;
    config.num_heads = 4;
    config.num_kv_heads = 2;
    config.head_dim = 16;
    config.bias = true;
    config.causal = true;
    const auto m = NarrowGroupedQueryAttention<bfloat16>::rounded(config, GroupedQueryAttention<float>(config, 13).parameters());
    std::mt19937_64 rng(21);
    const Tensor<bfloat16> x = round_to<bfloat16>(test::random_tensor<float>(Shape{2, 600, 64}, rng));
    AttentionOptions options;
    if (c.window > 0) options.window = c.window;
    if (c.softcap > 0.0f) options.softcap = c.softcap;
    if (c.alibi) options.alibi_slopes = alibi_slopes(4);
    Tensor<bfloat16> d_y;
    const auto run = [&](const char* way, const char* operands) {
      narrow_attention_force(way);
      NarrowGroupedQueryForwardContext<bfloat16> ctx;
      const Tensor<bfloat16> y = m.forward(x, options, ctx);
      if (d_y.numel() == 0) {
        d_y = Tensor<bfloat16>(y.shape());
        for (int64_t i = 0; i < d_y.numel(); ++i) d_y[i] = to_bfloat16(std::cos(0.37f * static_cast<float>(i)));
      }
      setenv("MULTIHEAD_BF16_BACKWARD", operands, 1);
      GroupedQueryAttentionGradients<bfloat16> g = m.backward(ctx, d_y);
      unsetenv("MULTIHEAD_BF16_BACKWARD");
      narrow_attention_force("");
      return g;
    };
    const GroupedQueryAttentionGradients<bfloat16> flash = run("flash", "auto"), in_place = run("matmul", "auto"),
                                                   copied = run("matmul", "copies");
    expect_same_bits(copied.x, in_place.x, std::string(c.name) + " d_x, in place against copies");
    EXPECT_LE(worst_relative(in_place.x, flash.x), tolerance) << c.name << " d_x";
    bool ran = differ(in_place.x, flash.x);
    for (const auto& [name, t] : in_place.parameters) {
      expect_same_bits(copied.parameters.at(name), t, std::string(c.name) + " d_" + name + ", in place against copies");
      // d_b_k = scale·Σ_i q_i Σ_j ds_ij, and each row of softmax's Jacobian
      // sums to 0 (Σ_j p_ij (dp_ij − delta_i) = 0): both ways' d_b_k are
      // rounding noise around 0 (or the soft-cap's small remainder), whose
      // scale says nothing; the same bits in place and copied still hold.
      if (name == "k_proj.bias") continue;
      EXPECT_LE(worst_relative(t, flash.parameters.at(name)), tolerance) << c.name << " d_" << name;
      ran = ran || differ(t, flash.parameters.at(name));
    }
    EXPECT_TRUE(ran) << c.name << ": the matmul way gave the flash kernel's bits";
  }
}

}  // namespace
}  // namespace multihead
