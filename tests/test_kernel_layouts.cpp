// tests/test_kernel_layouts.cpp: every kernel reads strided views (the
// fused form's split_heads without a copy) and writes strided outputs (merged
// heads) exactly as it reads and writes contiguous [N][len][width] buffers.
//
// The same arithmetic in the same order runs in both cases, so results must
// be bit-identical, not merely close.
#include <gtest/gtest.h>

#include <random>

#include "kernels/kernel.hpp"
#include "test_util.hpp"

namespace multihead::detail {
namespace {

struct LayoutCase {
  int64_t B, H, L, S, D;
  bool batch_first;
  AttentionKernel kernel;
  std::string name() const {
    return "B" + std::to_string(B) + "_H" + std::to_string(H) + "_L" + std::to_string(L) + "_S" +
           std::to_string(S) + "_D" + std::to_string(D) + (batch_first ? "_batchfirst" : "_seqfirst") + "_" +
           to_string(kernel);
  }
};

class KernelLayouts : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(KernelLayouts, StridedEqualsContiguous) {
  const LayoutCase c = GetParam();
  const int64_t E = c.H * c.D, ld = 3 * E, N = c.B * c.H;
  std::mt19937_64 rng(21);
  // A packed (tokens, 3E) projection buffer: q | k | v, token (b, l) at row
  // b·L + l (batch first) or l·B + b (sequence first). Here L = S.
  const int64_t T = c.B * c.L;
  const Tensor<double> qkv = test::random_tensor<double>({T, ld}, rng);
  auto row_of = [&](int64_t b, int64_t l) { return c.batch_first ? b * c.L + l : l * c.B + b; };
  const SliceLayout in{c.batch_first ? c.L * ld : ld, c.D, c.batch_first ? ld : c.B * ld};
  const SliceLayout out{c.batch_first ? c.L * E : E, c.D, c.batch_first ? E : c.B * E};

  // Contiguous copies [N][L][D].
  Tensor<double> q({N, c.L, c.D}), k({N, c.S, c.D}), v({N, c.S, c.D});
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t l = 0; l < c.L; ++l)
        for (int64_t d = 0; d < c.D; ++d) {
          const int64_t n = b * c.H + h, r = row_of(b, l);
          q[(n * c.L + l) * c.D + d] = qkv[r * ld + h * c.D + d];
          k[(n * c.S + l) * c.D + d] = qkv[r * ld + E + h * c.D + d];
          v[(n * c.S + l) * c.D + d] = qkv[r * ld + 2 * E + h * c.D + d];
        }

  AttentionArgs<double> a;
  a.slices = N;
  a.heads = c.H;
  a.q_len = c.L;
  a.kv_len = c.S;
  a.head_dim = a.value_dim = c.D;
  a.modifiers.causal = {true, CausalAlignment::TopLeft, 0, c.S};
  a.scale = 0.5;
  Tensor<double> contiguous_out({N, c.L, c.D});
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.out = contiguous_out.data();
  attention_forward(a, c.kernel);

  Tensor<double> strided_out({T, E}, -7.0);
  a.q = qkv.data();
  a.k = qkv.data() + E;
  a.v = qkv.data() + 2 * E;
  a.q_layout = a.k_layout = a.v_layout = in;
  a.out = strided_out.data();
  a.out_layout = out;
  attention_forward(a, c.kernel);

  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t l = 0; l < c.L; ++l)
        for (int64_t d = 0; d < c.D; ++d) {
          const int64_t n = b * c.H + h;
          ASSERT_EQ(strided_out[row_of(b, l) * E + h * c.D + d], contiguous_out[(n * c.L + l) * c.D + d])
              << "b " << b << " h " << h << " l " << l << " d " << d;
        }
}

const LayoutCase kLayoutCases[] = {
    {2, 3, 5, 5, 4, false, AttentionKernel::Reference},
    {2, 3, 5, 5, 4, true, AttentionKernel::Reference},
    {3, 2, 7, 7, 8, false, AttentionKernel::Materialized},
    {3, 2, 7, 7, 8, true, AttentionKernel::Materialized},
    {1, 1, 1, 1, 1, false, AttentionKernel::Materialized},
};

INSTANTIATE_TEST_SUITE_P(Table, KernelLayouts, ::testing::ValuesIn(kLayoutCases),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace multihead::detail
