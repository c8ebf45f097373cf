// Tensor::view: a tensor over memory its caller owns (the Python module's
// zero-copy path). A view shares the caller's buffer, a copy of it owns its
// elements, and forward() on views equals forward() on owning tensors.
#include <gtest/gtest.h>

#include <vector>

#include "multihead/error.hpp"
#include "multihead/multihead_attention.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

TEST(TensorView, SharesTheCallersBuffer) {
  std::vector<float> buf = {1, 2, 3, 4, 5, 6};
  Tensor<float> v = Tensor<float>::view({2, 3}, buf.data());
  EXPECT_TRUE(v.is_view());
  EXPECT_EQ(v.data(), buf.data());
  EXPECT_EQ(v.numel(), 6);
  EXPECT_EQ(v.shape(), (Shape{2, 3}));
  v[4] = 50;
  EXPECT_EQ(buf[4], 50);
  buf[0] = 10;
  EXPECT_EQ(v[0], 10);
}

TEST(TensorView, CopyOwnsMoveKeepsTheView) {
  std::vector<double> buf = {1, 2, 3};
  Tensor<double> v = Tensor<double>::view({3}, buf.data());
  Tensor<double> copy = v;
  EXPECT_FALSE(copy.is_view());
  EXPECT_NE(copy.data(), buf.data());
  EXPECT_EQ(copy.vec(), (Storage<double>{1, 2, 3}));
  Tensor<double> assigned;
  assigned = v;
  EXPECT_FALSE(assigned.is_view());
  EXPECT_EQ(assigned[2], 3);
  // A view assigned from an owning tensor owns a copy; the viewed buffer is untouched.
  std::vector<double> other = {7, 8, 9};
  Tensor<double> w = Tensor<double>::view({3}, other.data());
  w = copy;
  EXPECT_FALSE(w.is_view());
  EXPECT_EQ(w.vec(), (Storage<double>{1, 2, 3}));
  EXPECT_EQ(other, (std::vector<double>{7, 8, 9}));

  Tensor<double> moved = std::move(v);
  EXPECT_TRUE(moved.is_view());
  EXPECT_EQ(moved.data(), buf.data());
  EXPECT_FALSE(v.is_view());  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(v.numel(), 0);

  // reshaped: a copy from an lvalue view, the same view from an rvalue one.
  Tensor<double> r1 = moved.reshaped({1, 3});
  EXPECT_FALSE(r1.is_view());
  EXPECT_EQ(r1[1], 2);
  Tensor<double> r2 = std::move(moved).reshaped({3, 1});
  EXPECT_TRUE(r2.is_view());
  EXPECT_EQ(r2.data(), buf.data());
  EXPECT_EQ(r2.shape(), (Shape{3, 1}));
  EXPECT_EQ(tensor_cast<float>(r2).vec(), (Storage<float>{1, 2, 3}));
}

TEST(TensorView, RejectsBadInputAndHasNoStorage) {
  EXPECT_THROW(Tensor<float>::view({2, 2}, nullptr), Error);
  float x = 0;
  EXPECT_THROW(Tensor<float>::view({-1}, &x), Error);
  EXPECT_THROW(Tensor<float>::view({int64_t{1} << 62, 8}, &x), Error);
  // No elements: an ordinary empty tensor, whatever the pointer.
  Tensor<float> e = Tensor<float>::view({0, 4}, nullptr);
  EXPECT_FALSE(e.is_view());
  EXPECT_EQ(e.shape(), (Shape{0, 4}));
  Tensor<float> v = Tensor<float>::view({1}, &x);
  EXPECT_THROW((void)v.vec(), Error);
  const Tensor<float>& cv = v;
  EXPECT_THROW((void)cv.vec(), Error);
}

// The fused and textbook forms read views exactly as owning tensors, both for
// self-attention (one buffer: the packed projection) and cross-attention.
TEST(TensorView, ForwardOnViewsEqualsForwardOnOwningTensors) {
  MultiheadAttentionConfig c;
  c.embed_dim = 8;
  c.num_heads = 2;
  c.add_bias_kv = true;
  const BasicMultiheadAttention<double> mha(c, 3);
  std::mt19937_64 rng(1);
  Tensor<double> x = test::random_tensor<double>({5, 2, 8}, rng);
  Tensor<double> y = test::random_tensor<double>({7, 2, 8}, rng);
  Tensor<double> xv = Tensor<double>::view(x.shape(), x.data());
  Tensor<double> yv = Tensor<double>::view(y.shape(), y.data());
  for (bool textbook : {false, true}) {
    auto run = [&](const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v) {
      return textbook ? mha.forward_textbook(q, k, v) : mha.forward(q, k, v);
    };
    EXPECT_EQ(run(xv, xv, xv).output.vec(), run(x, x, x).output.vec()) << "textbook=" << textbook;
    EXPECT_EQ(run(xv, yv, yv).output.vec(), run(x, y, y).output.vec()) << "textbook=" << textbook;
    EXPECT_EQ(run(xv, yv, yv).attn_weights->vec(), run(x, y, y).attn_weights->vec());
  }
}

}  // namespace
}  // namespace multihead
