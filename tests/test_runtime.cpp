// tests/test_runtime.cpp: the public run-time switches (multihead/runtime.hpp).
#include <gtest/gtest.h>

#include <string>

#include "multihead/error.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/runtime.hpp"

namespace multihead {
namespace {

// Lifts a forced kernel at the end of the scope, whatever happens.
struct ScopedKernel {
  explicit ScopedKernel(AttentionKernel k) { kernel_force(k); }
  ~ScopedKernel() { kernel_force(AttentionKernel::Auto); }
};

// A forced kernel wins over what the call asks for: forcing flash on a
// module call that asks for the weights runs flash and recomputes them.
TEST(Runtime, KernelForceWinsOverTheCall) {
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 8;
  cfg.num_heads = 2;
  const MultiheadAttention mha(cfg, 1);
  const Tensor<float> x({5, 2, 8}, 0.5f);
  ForwardOptions<float> o;
  o.attention.kernel = AttentionKernel::Materialized;
  const ForwardResult<float> materialized = mha.forward(x, x, x, o);
  const Tensor<float>& plain = materialized.output;
  {
    const ScopedKernel forced(AttentionKernel::Flash);
    EXPECT_EQ(kernel_forced(), AttentionKernel::Flash);
    // The module serves need_weights on flash: the forward saves each row's
    // lse and the weights are recomputed from it (1e-6, test_mha_weights.cpp).
    const ForwardResult<float> with_weights = mha.forward(x, x, x, o);
    for (int64_t i = 0; i < materialized.attn_weights->numel(); ++i)
      EXPECT_NEAR((*with_weights.attn_weights)[i], (*materialized.attn_weights)[i], 1e-6) << i;
    o.need_weights = false;
    const Tensor<float> flash = mha.forward(x, x, x, o).output;
    for (int64_t i = 0; i < plain.numel(); ++i) EXPECT_NEAR(flash[i], plain[i], 1e-5) << i;
  }
  EXPECT_EQ(kernel_forced(), AttentionKernel::Auto);
}

// Every listed target can be forced and is then current; "" returns to the
// default; threads are reported.
TEST(Runtime, SimdTargetsAndThreads) {
  const std::string before = simd_target_current();
  for (const std::string& target : simd_targets_available()) {
    simd_target_force(target);
    EXPECT_EQ(simd_target_current(), target);
  }
  simd_target_force("");
  EXPECT_EQ(simd_target_current(), before);
  EXPECT_GE(threads(), 1);
  set_threads(0);  // leaves both settings as they are
  EXPECT_GE(threads(), 1);
}

}  // namespace
}  // namespace multihead
