// tests/test_mha_external_parameters.cpp: a MultiheadAttention constructed
// over parameters that are views of its caller's memory (Tensor::view, as
// python/multihead/torch.py builds it over the torch Parameters), changed in
// place, then parameters_changed(): its forward and backward equal a fresh
// module's of the new values bit for bit (so the transposed copies were
// rebuilt, and the views read, not copies), and a context filled before the
// change is refused. E = 8, H = 2, L = 3, B = 2.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "multihead/error.hpp"
#include "multihead/multihead_attention.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

template <class T>
bool same_bits(const Tensor<T>& a, const Tensor<T>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), sizeof(T) * a.numel()) == 0;
}

TEST(MhaExternalParameters, ViewsChangedInPlaceThenParametersChangedEqualAFreshModule_E8_H2_L3_B2) {
  MultiheadAttentionConfig c;
  c.embed_dim = 8;
  c.num_heads = 2;
  std::mt19937_64 rng(7);
  MultiheadAttentionParameters<float> owned = MultiheadAttention(c, 3).parameters();  // the caller's memory
  MultiheadAttentionParameters<float> views;
  for_each_parameter(c, views, owned, [](const ParameterInfo& info, Tensor<float>& view, Tensor<float>& mine) {
    if (info.present) view = Tensor<float>::view(mine.shape(), mine.data());
  });
  MultiheadAttention m(c, std::move(views));
  EXPECT_EQ(m.parameters().in_proj_weight.data(), owned.in_proj_weight.data());  // no copy

  const Tensor<float> x = test::random_tensor<float>({3, 2, 8}, rng), g = test::random_tensor<float>({3, 2, 8}, rng);
  ForwardOptions<float> o;
  o.need_weights = false;
  ForwardContext<float> before;
  m.forward(x, x, x, o, before);

  for_each_parameter(c, owned, [](const ParameterInfo& info, Tensor<float>& t) {
    if (info.present)
      for (int64_t i = 0; i < t.numel(); ++i) t[i] = t[i] * 0.5f + 0.01f * static_cast<float>(i % 7);
  });
  m.parameters_changed();
  const MultiheadAttention fresh(c, owned);  // copies of the new values
  ForwardContext<float> a, b;
  const ForwardResult<float> ra = m.forward(x, x, x, o, a), rb = fresh.forward(x, x, x, o, b);
  EXPECT_TRUE(same_bits(ra.output, rb.output));
  const MultiheadAttentionGradients<float> ga = m.backward(a, g), gb = fresh.backward(b, g);
  EXPECT_TRUE(same_bits(ga.query, gb.query));
  for (const auto& [name, t] : gb.parameters) EXPECT_TRUE(same_bits(ga.parameters.at(name), t)) << name;

  std::string message;
  try {
    m.backward(before, g);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_EQ(message.rfind("context: ", 0), 0u) << message;
}

}  // namespace
}  // namespace multihead
