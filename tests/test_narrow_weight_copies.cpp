// NarrowMultiheadAttention's float32 weight copies (keep_float32_weights):
// on a CPU without a 16-bit matmul every 16-bit product runs in float32 on
// exact float32 copies of its operands, and the module keeps the weights'
// copies (and widens each distinct input once) instead of letting every
// product widen both operands again. The copies are the same numbers, so
// the output must be the same bits as the reference way (not kept), for
// every configuration that changes which weight a product reads (packed
// in_proj_weight, separate q/k/v weights with kdim/vdim, biases, bias_kv,
// the zero-attention key, self- and cross-attention, batch_first), for the
// plain and the training forward; and the copies must follow the
// parameters: update_parameters makes new ones, a copied module keeps its
// own, concurrent first forwards make them once (the TSan filter's
// *Concurren* runs that case).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/gemm.hpp"
#include "multihead/narrow_multihead_attention.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

struct Case {
  const char* name;
  int64_t E, H, kdim, vdim;
  bool bias, bias_kv, zero_attn, batch_first, self, causal;
};

const Case kCases[] = {
    {"packed_self", 32, 4, 0, 0, true, false, false, false, true, false},
    {"packed_self_causal_batch_first", 24, 3, 0, 0, true, false, false, true, true, true},
    {"packed_cross_no_bias", 32, 2, 0, 0, false, false, false, false, false, false},
    {"separate_kdim_vdim", 32, 4, 20, 12, true, false, false, true, false, false},
    {"bias_kv_zero_attn", 16, 2, 0, 0, true, true, true, false, true, false},
};

MultiheadAttentionConfig config_of(const Case& c) {
  MultiheadAttentionConfig config;
  config.embed_dim = c.E;
  config.num_heads = c.H;
  config.kdim = c.kdim;
  config.vdim = c.vdim;
  config.bias = c.bias;
  config.add_bias_kv = c.bias_kv;
  config.add_zero_attn = c.zero_attn;
  config.batch_first = c.batch_first;
  return config;
}

// The weights' element count: what the copies hold, 4 bytes each.
int64_t weight_elements(const MultiheadAttentionConfig& c) {
  const int64_t E = c.embed_dim;
  return E * E + E * (c.kdim > 0 ? c.kdim : E) + E * (c.vdim > 0 ? c.vdim : E) + E * E;
}

template <class E>
struct Inputs {
  Tensor<E> q, k, v;
};

template <class E>
Inputs<E> inputs_of(const Case& c, std::mt19937_64& rng) {
  const int64_t B = 2, L = 9, S = 7;
  const int64_t Ek = c.kdim > 0 ? c.kdim : c.E, Ev = c.vdim > 0 ? c.vdim : c.E;
  const auto shape = [&](int64_t len, int64_t width) {
    return c.batch_first ? Shape{B, len, width} : Shape{len, B, width};
  };
  Inputs<E> in;
  in.q = round_to<E>(test::random_tensor<float>(shape(L, c.E), rng));
  if (!c.self) {  // self-attention passes q itself as key and value (run below)
    in.k = round_to<E>(test::random_tensor<float>(shape(S, Ek), rng));
    in.v = round_to<E>(test::random_tensor<float>(shape(S, Ev), rng));
  }
  return in;
}

template <class E>
void expect_same_bits(const Tensor<E>& a, const Tensor<E>& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a[i].bits, b[i].bits) << what << ", element " << i;
}

template <class E>
Tensor<E> run(const NarrowMultiheadAttention<E>& m, const Case& c, const Inputs<E>& in, bool training = false) {
  ForwardOptions<float> options;
  options.need_weights = false;
  options.attention.is_causal = c.causal;
  const Tensor<E>& k = c.self ? in.q : in.k;
  const Tensor<E>& v = c.self ? in.q : in.v;
  if (!training) return m.forward(in.q, k, v, options);
  NarrowForwardContext<E> ctx;
  return m.forward(in.q, k, v, options, ctx);
}

template <class E>
void check_kept_matches_reference(const Case& c) {
  SCOPED_TRACE(std::string(c.name) + (std::is_same_v<E, bfloat16> ? " bf16" : " f16"));
  std::mt19937_64 rng(21);
  const MultiheadAttentionConfig config = config_of(c);
  const MultiheadAttention f32(config, 3);
  auto kept = NarrowMultiheadAttention<E>::rounded(config, f32.parameters());
  auto reference = NarrowMultiheadAttention<E>::rounded(config, f32.parameters());
  reference.keep_float32_weights(false);
  EXPECT_TRUE(kept.keeps_float32_weights());
  EXPECT_FALSE(reference.keeps_float32_weights());
  const Inputs<E> in = inputs_of<E>(c, rng);
  EXPECT_EQ(kept.float32_weight_bytes(), 0u);  // made by the first forward
  const Tensor<E> want = run(reference, c, in);
  expect_same_bits(run(kept, c, in), want, "plain forward");
  expect_same_bits(run(kept, c, in, /*training=*/true), want, "training forward");
  // The float32 way (and its copies) runs where the projections widen: for
  // f16, every product below bf16x3's 256 rows (all of these cases).
  const int64_t tokens = in.q.numel() / config.embed_dim;
  const bool copies = !detail::native_16bit_product<E>(tokens, config.embed_dim, config.embed_dim);
  EXPECT_EQ(kept.float32_weight_bytes(), copies ? static_cast<std::size_t>(weight_elements(config)) * 4 : 0u);
  EXPECT_EQ(reference.float32_weight_bytes(), 0u);
  // The training forward's context: the backward from either way gives the
  // same bits (it reads the saved 16-bit Q, K, V, merged heads and lse).
  {
    ForwardOptions<float> options;
    options.need_weights = false;
    options.attention.is_causal = c.causal;
    const Tensor<E>& k = c.self ? in.q : in.k;
    const Tensor<E>& v = c.self ? in.q : in.v;
    NarrowForwardContext<E> ctx_kept, ctx_ref;
    const Tensor<E> y = kept.forward(in.q, k, v, options, ctx_kept);
    reference.forward(in.q, k, v, options, ctx_ref);
    Tensor<E> d_y(y.shape());
    for (int64_t i = 0; i < d_y.numel(); ++i) d_y[i] = narrow_from_float<E>(std::sin(0.37f * static_cast<float>(i)));
    const MultiheadAttentionGradients<E> gk = kept.backward(ctx_kept, d_y), gr = reference.backward(ctx_ref, d_y);
    expect_same_bits(gk.query, gr.query, "d_query");
    expect_same_bits(gk.key, gr.key, "d_key");
    expect_same_bits(gk.value, gr.value, "d_value");
    ASSERT_EQ(gk.parameters.size(), gr.parameters.size());
    for (const auto& [name, t] : gr.parameters) expect_same_bits(gk.parameters.at(name), t, "d_" + name);
  }
  kept.keep_float32_weights(false);
  EXPECT_EQ(kept.float32_weight_bytes(), 0u);
  expect_same_bits(run(kept, c, in), want, "after keep_float32_weights(false)");
}

TEST(NarrowWeightCopies, KeptCopiesGiveTheReferenceBits) {
  for (const Case& c : kCases) {
    check_kept_matches_reference<bfloat16>(c);
    check_kept_matches_reference<float16>(c);
  }
}

// The copies follow the parameters: after update_parameters the module
// computes what a new module with those values computes, and a copy of the
// module made before the update keeps computing with the old values.
template <class E>
void check_copies_follow_parameters() {
  const Case& c = kCases[3];  // separate q/k/v weights: every copy is its own tensor
  std::mt19937_64 rng(5);
  const MultiheadAttentionConfig config = config_of(c);
  const MultiheadAttention before(config, 1), after(config, 2);
  auto module = NarrowMultiheadAttention<E>::rounded(config, before.parameters());
  const Inputs<E> in = inputs_of<E>(c, rng);
  const Tensor<E> old_out = run(module, c, in);  // makes the copies of `before`
  const NarrowMultiheadAttention<E> copy = module;
  const auto fresh = NarrowMultiheadAttention<E>::rounded(config, after.parameters());
  const std::map<std::string, Tensor<E>> next = fresh.state_dict();
  module.update_parameters([&](const std::string& name, Tensor<E>& t) { t = next.at(name); });
  const Tensor<E> new_out = run(module, c, in);
  expect_same_bits(new_out, run(fresh, c, in), "updated module against a fresh one");
  expect_same_bits(run(copy, c, in), old_out, "the copy made before the update");
  bool differs = false;
  for (int64_t i = 0; i < new_out.numel(); ++i) differs = differs || new_out[i].bits != old_out[i].bits;
  EXPECT_TRUE(differs) << "the two parameter sets gave the same output: the test could not see stale copies";
}

TEST(NarrowWeightCopies, CopiesFollowUpdateParameters) {
  check_copies_follow_parameters<bfloat16>();
  check_copies_follow_parameters<float16>();
}

// Several threads making the first forward at once: the copies are made
// once (std::call_once), and every thread gets the serial result.
TEST(NarrowWeightCopies, ConcurrentFirstForwardsMatchSerial) {
  const Case& c = kCases[0];
  std::mt19937_64 rng(8);
  const MultiheadAttentionConfig config = config_of(c);
  const MultiheadAttention f32(config, 4);
  const Inputs<bfloat16> in = inputs_of<bfloat16>(c, rng);
  auto serial = NarrowMultiheadAttention<bfloat16>::rounded(config, f32.parameters());
  serial.keep_float32_weights(false);
  const Tensor<bfloat16> want = run(serial, c, in);
  const auto shared = NarrowMultiheadAttention<bfloat16>::rounded(config, f32.parameters());
  std::vector<Tensor<bfloat16>> got(4);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] { got[t] = run(shared, c, in); });
  for (std::thread& t : threads) t.join();
  for (const Tensor<bfloat16>& g : got) expect_same_bits(g, want, "a concurrent first forward");
}

}  // namespace
}  // namespace multihead
