// Self-attention through the installed library; prints the output shape.
#include <multihead/multihead_attention.hpp>

#include <cstdio>

int main() {
  multihead::MultiheadAttentionConfig config;
  config.embed_dim = 16;
  config.num_heads = 4;
  const multihead::MultiheadAttention mha(config, /*seed=*/1);
  multihead::Tensor<float> x({5, 2, 16}, 0.25f);  // (L, B, E)
  const auto r = mha.forward(x, x, x);
  std::printf("output %s weights %s\n", multihead::shape_to_string(r.output.shape()).c_str(),
              multihead::shape_to_string(r.attn_weights->shape()).c_str());
  return r.output.shape() == multihead::Shape{5, 2, 16} ? 0 : 1;
}
