// tests/test_module_parameters.cpp: the parameter tables (for_each_parameter,
// multihead/parameter_table.hpp) and the one module dialect they feed:
// state_dict, load_state_dict, update_parameters, a member validate, an
// opaque context refused when stale, for MultiheadAttention and
// GroupedQueryAttention alike. The names and shapes against PyTorch's
// nn.MultiheadAttention.state_dict() are checked in
// python/tests/test_api.py (test_parameter_table_matches_torch).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "multihead/error.hpp"
#include "multihead/grouped_query_attention.hpp"
#include "multihead/multihead_attention.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

using test::error_of;

using test::random_tensor;

template <class T>
bool same_bits(const Tensor<T>& a, const Tensor<T>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), sizeof(T) * a.numel()) == 0;
}

// ---- MultiheadAttention -----------------------------------------------------

struct MhaTableCase {
  std::string name;
  int64_t E, H, kdim, vdim;
  bool bias, add_bias_kv;
};

MultiheadAttentionConfig config_of(const MhaTableCase& c) {
  MultiheadAttentionConfig config;
  config.embed_dim = c.E;
  config.num_heads = c.H;
  config.kdim = c.kdim;
  config.vdim = c.vdim;
  config.bias = c.bias;
  config.add_bias_kv = c.add_bias_kv;
  return config;
}

const MhaTableCase kMhaTableCases[] = {
    {"E8_H2_packed_bias", 8, 2, 0, 0, true, false},
    {"E8_H2_packed_nobias_biaskv", 8, 2, 0, 0, false, true},
    {"E6_H3_kdim5_vdim7_bias_biaskv", 6, 3, 5, 7, true, true},
    {"E4_H1_kdim3_nobias", 4, 1, 3, 0, false, false},
};

class MhaParameterTable : public ::testing::TestWithParam<MhaTableCase> {};

// state_dict, the backward's gradients and the validation all follow the
// table: the same names, at the same shapes.
TEST_P(MhaParameterTable, StateDictGradientsAndTableAgree) {
  const MultiheadAttentionConfig config = config_of(GetParam());
  std::map<std::string, Shape> rows;
  for_each_parameter(config, [&](const ParameterInfo& info) {
    if (info.present) rows.emplace(info.name, info.shape);
    else EXPECT_NE(std::string(info.absent_because), "") << info.name;
  });
  const BasicMultiheadAttention<double> m(config, 7);
  std::map<std::string, Shape> state;
  for (const auto& [name, t] : m.state_dict()) state.emplace(name, t.shape());
  EXPECT_EQ(state, rows);
  std::mt19937_64 rng(1);
  const Tensor<double> q = random_tensor<double>({3, 2, config.embed_dim}, rng);
  const Tensor<double> k = random_tensor<double>({4, 2, config.key_dim()}, rng);
  const Tensor<double> v = random_tensor<double>({4, 2, config.value_dim()}, rng);
  ForwardContext<double> ctx;
  const Tensor<double> out = m.forward(q, k, v, {}, ctx).output;
  const MultiheadAttentionGradients<double> g = m.backward(ctx, random_tensor<double>(out.shape(), rng));
  std::map<std::string, Shape> grads;
  for (const auto& [name, t] : g.parameters) grads.emplace(name, t.shape());
  EXPECT_EQ(grads, rows);
}

// load_state_dict(state_dict()) of another module: the same forward, bit for
// bit; earlier contexts are stale.
TEST_P(MhaParameterTable, LoadStateDictRoundTrip) {
  const MultiheadAttentionConfig config = config_of(GetParam());
  const BasicMultiheadAttention<float> source(config, 11);
  BasicMultiheadAttention<float> m(config, 12);
  std::mt19937_64 rng(2);
  const Tensor<float> q = random_tensor<float>({3, 2, config.embed_dim}, rng);
  const Tensor<float> k = random_tensor<float>({4, 2, config.key_dim()}, rng);
  const Tensor<float> v = random_tensor<float>({4, 2, config.value_dim()}, rng);
  ForwardContext<float> ctx;
  const Tensor<float> out = m.forward(q, k, v, {}, ctx).output;
  m.load_state_dict(source.state_dict());
  EXPECT_TRUE(same_bits(m.forward(q, k, v).output, source.forward(q, k, v).output));
  EXPECT_NE(error_of([&] { m.backward(ctx, out); }).find("before update_parameters"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Table, MhaParameterTable, ::testing::ValuesIn(kMhaTableCases),
                         [](const auto& info) { return info.param.name; });

TEST(MhaLoadStateDict, RefusesMissingMisshapenAndUnexpectedNamesLeavingTheModule_E8_H2) {
  const MultiheadAttentionConfig config = config_of(kMhaTableCases[0]);
  BasicMultiheadAttention<double> m(config, 1);
  const std::map<std::string, Tensor<double>> before = m.state_dict();
  std::map<std::string, Tensor<double>> sd = before;
  sd.erase("in_proj_bias");
  EXPECT_EQ(error_of([&] { m.load_state_dict(sd); }), "in_proj_bias: missing; expected shape (24)");
  sd = before;
  sd["out_proj.weight"] = Tensor<double>({8, 7});
  EXPECT_EQ(error_of([&] { m.load_state_dict(sd); }), "out_proj.weight: expected shape (8, 8), got (8, 7)");
  sd = before;
  sd["bias_k"] = Tensor<double>({1, 1, 8});
  EXPECT_EQ(error_of([&] { m.load_state_dict(sd); }),
            "bias_k: unexpected tensor of shape (1, 1, 8) (add_bias_kv is false)");
  sd = before;
  sd["linear1.weight"] = Tensor<double>({2, 2});
  EXPECT_EQ(error_of([&] { m.load_state_dict(sd); }),
            "linear1.weight: unexpected tensor in a MultiheadAttention state_dict (expected names: "
            "in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias)");
  for (const auto& [name, t] : m.state_dict()) EXPECT_TRUE(same_bits(t, before.at(name))) << name;
}

// ---- GroupedQueryAttention --------------------------------------------------

struct GqaTableCase {
  std::string name;
  int64_t E, H, Hkv, D;
  bool bias, rope;
};

GroupedQueryAttentionConfig config_of(const GqaTableCase& c) {
  GroupedQueryAttentionConfig config;
  config.embed_dim = c.E;
  config.num_heads = c.H;
  config.num_kv_heads = c.Hkv;
  config.head_dim = c.D;
  config.bias = c.bias;
  if (c.rope) config.rope = RopeOptions{};
  return config;
}

const GqaTableCase kGqaTableCases[] = {
    {"E16_H4_Hkv2_bias", 16, 4, 2, 0, true, false},
    {"E16_H4_Hkv1_nobias_rope", 16, 4, 1, 0, false, true},
    {"E12_H4_Hkv4_D6_bias_rope", 12, 4, 4, 6, true, true},
};

class GqaParameters : public ::testing::TestWithParam<GqaTableCase> {};

// Names and shapes: Hugging Face's LlamaAttention layout, written out here
// independently of the table.
TEST_P(GqaParameters, TableHasLlamaNamesAndShapes) {
  const GqaTableCase& c = GetParam();
  const GroupedQueryAttentionConfig config = config_of(c);
  const int64_t D = c.D > 0 ? c.D : c.E / c.H, HD = c.H * D, KD = c.Hkv * D;
  std::map<std::string, Shape> expected = {{"q_proj.weight", {HD, c.E}}, {"k_proj.weight", {KD, c.E}},
                                           {"v_proj.weight", {KD, c.E}}, {"o_proj.weight", {c.E, HD}}};
  if (c.bias) {
    expected["q_proj.bias"] = {HD};
    expected["k_proj.bias"] = {KD};
    expected["v_proj.bias"] = {KD};
    expected["o_proj.bias"] = {c.E};
  }
  std::map<std::string, Shape> rows;
  std::vector<std::string> order;
  for_each_parameter(config, [&](const ParameterInfo& info) {
    order.push_back(info.name);
    if (info.present) rows.emplace(info.name, info.shape);
  });
  EXPECT_EQ(rows, expected);
  EXPECT_EQ(order, (std::vector<std::string>{"q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
                                             "v_proj.weight", "v_proj.bias", "o_proj.weight", "o_proj.bias"}));
  const GroupedQueryAttention<double> m(config, 3);
  std::map<std::string, Shape> state;
  for (const auto& [name, t] : m.state_dict()) state.emplace(name, t.shape());
  EXPECT_EQ(state, expected);
  std::mt19937_64 rng(4);
  GroupedQueryForwardContext<double> ctx;
  const Tensor<double> out = m.forward(random_tensor<double>({2, 5, c.E}, rng), {}, ctx);
  std::map<std::string, Shape> grads;
  for (const auto& [name, t] : m.backward(ctx, random_tensor<double>(out.shape(), rng)).parameters)
    grads.emplace(name, t.shape());
  EXPECT_EQ(grads, expected);
}

// state_dict -> load_state_dict into a module of other weights: the same
// forward, bit for bit, and the same state_dict.
TEST_P(GqaParameters, StateDictLoadStateDictRoundTrip) {
  const GroupedQueryAttentionConfig config = config_of(GetParam());
  const GroupedQueryAttention<float> source(config, 21);
  GroupedQueryAttention<float> m(config, 22);
  std::mt19937_64 rng(5);
  const Tensor<float> x = random_tensor<float>({2, 5, config.embed_dim}, rng);
  ASSERT_FALSE(same_bits(m.forward(x), source.forward(x)));
  m.load_state_dict(source.state_dict());
  EXPECT_TRUE(same_bits(m.forward(x), source.forward(x)));
  const std::map<std::string, Tensor<float>> a = m.state_dict(), b = source.state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(same_bits(t, b.at(name))) << name;
}

// update_parameters visits state_dict()'s names in order; the module then
// computes what a fresh module built from the updated parameters computes,
// bit for bit, forward and backward.
TEST_P(GqaParameters, UpdateParametersThenForwardEqualsAFreshModule) {
  const GroupedQueryAttentionConfig config = config_of(GetParam());
  GroupedQueryAttention<float> m(config, 31);
  std::vector<std::string> names;
  m.update_parameters([&](const std::string& name, Tensor<float>& t) {
    names.push_back(name);
    for (int64_t i = 0; i < t.numel(); ++i) t[i] = t[i] * 0.5f + 0.01f * static_cast<float>(i % 7);
  });
  std::vector<std::string> expected;
  for (const auto& [name, t] : m.state_dict()) expected.push_back(name);
  EXPECT_EQ(names, expected);
  const GroupedQueryAttention<float> fresh(config, m.parameters());
  std::mt19937_64 rng(6);
  const Tensor<float> x = random_tensor<float>({2, 5, config.embed_dim}, rng);
  GroupedQueryForwardContext<float> ca, cb;
  const Tensor<float> ya = m.forward(x, {}, ca), yb = fresh.forward(x, {}, cb);
  EXPECT_TRUE(same_bits(ya, yb));
  const Tensor<float> G = random_tensor<float>(ya.shape(), rng);
  const GroupedQueryAttentionGradients<float> ga = m.backward(ca, G), gb = fresh.backward(cb, G);
  EXPECT_TRUE(same_bits(ga.x, gb.x));
  for (const auto& [name, t] : ga.parameters) EXPECT_TRUE(same_bits(t, gb.parameters.at(name))) << name;
}

INSTANTIATE_TEST_SUITE_P(Table, GqaParameters, ::testing::ValuesIn(kGqaTableCases),
                         [](const auto& info) { return info.param.name; });

// A reshaping update and a bad state_dict are refused, naming the tensor in
// MultiheadAttention's words, and leave the module as it was.
TEST(GqaParameterErrors, MessagesNameTheTensorAndLeaveTheModule_E16_H4_Hkv2_bias) {
  const GroupedQueryAttentionConfig config = config_of(kGqaTableCases[0]);
  GroupedQueryAttention<double> m(config, 1);
  const std::map<std::string, Tensor<double>> before = m.state_dict();
  EXPECT_EQ(error_of([&] {
              m.update_parameters([](const std::string& name, Tensor<double>& t) {
                if (name == "k_proj.weight") t = Tensor<double>({2, 2});
              });
            }),
            "k_proj.weight: expected shape (8, 16), got (2, 2)");
  std::map<std::string, Tensor<double>> sd = before;
  sd.erase("v_proj.bias");
  EXPECT_EQ(error_of([&] { m.load_state_dict(sd); }), "v_proj.bias: missing; expected shape (8)");
  sd = before;
  sd["rotary_emb.inv_freq"] = Tensor<double>({2});
  EXPECT_EQ(error_of([&] { m.load_state_dict(sd); }),
            "rotary_emb.inv_freq: unexpected tensor in a GroupedQueryAttention state_dict (expected names: "
            "q_proj.weight, q_proj.bias, k_proj.weight, k_proj.bias, v_proj.weight, v_proj.bias, o_proj.weight, "
            "o_proj.bias)");
  for (const auto& [name, t] : m.state_dict()) EXPECT_TRUE(same_bits(t, before.at(name))) << name;
  // A bias the configuration does not have, through from_tensors' prefix.
  GroupedQueryAttentionConfig no_bias = config;
  no_bias.bias = false;
  std::map<std::string, Tensor<double>> prefixed;
  for (const auto& [name, t] : before) prefixed.emplace("layers.0." + name, t);
  EXPECT_EQ(error_of([&] { GroupedQueryAttention<double>::from_tensors(no_bias, prefixed, "layers.0."); }),
            "layers.0.q_proj.bias: unexpected tensor of shape (16) (bias is false)");
  prefixed.erase("layers.0.o_proj.weight");
  EXPECT_EQ(error_of([&] { GroupedQueryAttention<double>::from_tensors(config, prefixed, "layers.0."); }),
            "layers.0.o_proj.weight: missing; expected shape (16, 16)");
}

// A context is refused once the module's parameters changed, or by another
// module; a fresh forward makes it good again.
TEST(GqaContext, StaleForeignAndEmptyContextsAreRefused_E16_H4_Hkv2) {
  const GroupedQueryAttentionConfig config = config_of(kGqaTableCases[0]);
  GroupedQueryAttention<double> m(config, 1);
  const GroupedQueryAttention<double> other(config, 1);  // same values, another module
  std::mt19937_64 rng(7);
  const Tensor<double> x = random_tensor<double>({2, 3, 16}, rng);
  const Tensor<double> G = random_tensor<double>({2, 3, 16}, rng);
  GroupedQueryForwardContext<double> ctx;
  EXPECT_TRUE(ctx.empty());
  EXPECT_EQ(ctx.bytes(), 0u);
  EXPECT_NE(error_of([&] { m.backward(ctx, G); }).find("context: empty GroupedQueryForwardContext"), std::string::npos);
  m.forward(x, {}, ctx);
  EXPECT_FALSE(ctx.empty());
  EXPECT_GT(ctx.bytes(), static_cast<std::size_t>(x.numel()) * sizeof(double));
  EXPECT_EQ(error_of([&] { m.backward(ctx, G); }), "");
  EXPECT_NE(error_of([&] { other.backward(ctx, G); }).find("another module"), std::string::npos);
  m.update_parameters([](const std::string&, Tensor<double>&) {});
  const std::string stale = error_of([&] { m.backward(ctx, G); });
  EXPECT_EQ(stale.rfind("context: ", 0), 0u) << stale;
  EXPECT_NE(stale.find("before update_parameters()"), std::string::npos) << stale;
  m.forward(x, {}, ctx);
  EXPECT_EQ(error_of([&] { m.backward(ctx, G); }), "");
  m.load_state_dict(other.state_dict());
  EXPECT_NE(error_of([&] { m.backward(ctx, G); }).find("load_state_dict()"), std::string::npos);
  ctx.clear();
  EXPECT_TRUE(ctx.empty());
}

// validate() is a member and speaks MultiheadAttentionConfig's words:
// "field: expected X, got Y".
TEST(GqaConfigValidate, MessagesPinned) {
  const auto message = [](const GroupedQueryAttentionConfig& c) { return error_of([&] { c.validate(); }); };
  GroupedQueryAttentionConfig c;
  EXPECT_EQ(message(c), "embed_dim: expected a positive integer, got 0");
  c.embed_dim = 32;
  EXPECT_EQ(message(c), "num_heads: expected a positive integer, got 0");
  c.num_heads = 8;
  c.num_kv_heads = 3;
  EXPECT_EQ(message(c), "num_kv_heads: expected 0 (= num_heads) or a divisor of num_heads 8 (each K/V head serves "
                        "num_heads / num_kv_heads query heads), got 3");
  c.num_kv_heads = 2;
  c.head_dim = -1;
  EXPECT_EQ(message(c), "head_dim: expected 0 (= embed_dim / num_heads) or a positive integer, got -1");
  c.head_dim = 0;
  c.embed_dim = 30;
  EXPECT_EQ(message(c), "num_heads: expected a divisor of embed_dim 30 (or set head_dim to choose the head "
                        "width), got 8");
  c.embed_dim = 32;
  c.rope = RopeOptions{};
  c.rope->position_offset = 3;
  EXPECT_EQ(message(c), "rope.position_offset: expected 0 (positions come from the KV cache), got 3");
  c.rope->position_offset = 0;
  EXPECT_EQ(message(c), "");
}

}  // namespace
}  // namespace multihead
