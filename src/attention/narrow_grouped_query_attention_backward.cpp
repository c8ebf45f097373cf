// src/attention/narrow_grouped_query_attention_backward.cpp: the backward
// pass of the 16-bit grouped-query module's forward
// (narrow_grouped_query_attention.cpp), its steps in reverse, each gradient
// computed with float32 products and sums from the saved 16-bit values and
// rounded once to E:
//
//   out_projection backward   d_merged = round(d_out · W_o), d_W_o = round(d_outᵀ · merged),
//                             d_b_o = round(Σ d_out)
//   attention backward        q, k, v (after RoPE), merged and d_merged widened
//                             to float32 (exact), the float32 flash backward
//                             (the kernels' grouped backward: d_k, d_v of K/V
//                             head g summed over its query heads, in float32)
//   RoPE backward             d_q, d_k rotated back (Rᵀ) in float32
//   split_heads backward      d_q, d_k, d_v rounded once to E
//   in_projection backward    the three projections as one product:
//                             d_x = round([d_q d_k d_v] · [W_q; W_k; W_v])
//                             (one float32 sum over H·D + 2·Hkv·D terms, rounded
//                             once), d_W_q = round(d_qᵀ · x), d_b_q = round(Σ d_q),
//                             k and v likewise
//
// The products run core/linear's 16-bit backward (exact products, float32
// sums). The attention step widens in memory, as the narrow MHA's does
// (docs/precision.md, "Widened in memory, not in registers"): the float32
// flash backward reads float32 operands only.
//
// Legend: B batch, L tokens, E embed width, H query heads, Hkv K/V heads,
// D head width.
#include <algorithm>
#include <type_traits>
#include <string>
#include <vector>

#include "attention/grouped_query_steps.hpp"
#include "attention/mha_plan.hpp"
#include "attention/narrow_convert.hpp"
#include "attention/rope.hpp"
#include "core/check.hpp"
#include "core/linear.hpp"
#include "kernels/kernel.hpp"
#include "kernels/narrow_matmul.hpp"
#include "multihead/error.hpp"
#include "multihead/narrow_grouped_query_attention.hpp"

namespace multihead {

template <class E>
GroupedQueryAttentionGradients<E> NarrowGroupedQueryAttention<E>::backward(
    const NarrowGroupedQueryForwardContext<E>& saved, const Tensor<E>& d_output) const {
  using namespace detail;
  if (saved.empty())
    throw Error(Error::Kind::Value,
                "context: empty NarrowGroupedQueryForwardContext; fill it with forward(x, options, context) first");
  if (saved.parameters_token_ != parameters_token_)
    throw Error(Error::Kind::Value,
                "context: this NarrowGroupedQueryForwardContext was filled by another module or before "
                "update_parameters(); run the forward again");
  const int64_t E_ = config_.embed_dim, H = config_.num_heads, Hkv = kv_heads(), D = head_dim();
  const int64_t HD = H * D, KD = Hkv * D;
  expect_shape("d_output", d_output.shape(), saved.x_.shape());
  const AttentionOptions& options = saved.options_;
  if (options.check_finite) check_finite("d_output", d_output);
  const int64_t B = saved.x_.size(0), L = saved.x_.size(1), T = B * L;
  GroupedQueryAttentionGradients<E> g;
  g.x = Tensor<E>(saved.x_.shape());
  for_each_parameter(config_, [&](const ParameterInfo& info) {
    if (info.present) g.parameters[info.name] = Tensor<E>(info.shape);  // zeros
  });
  if (T == 0) return g;  // the forward did no work: every gradient is 0
  const int threads = options.num_threads;
  const LinearOptions lo{false, threads};
  const GroupedQueryAttentionParameters<E>& p = params_;
  const auto grad = [&](const char* name) { return g.parameters.at(name).data(); };
  const auto bias_grad = [&](const char* name) { return config_.bias ? g.parameters.at(name).data() : nullptr; };

  // In the forward pass this was (out_projection):
  //   linear(merged, B·L, H·D, W_o, b_o, out)      out = round(merged W_oᵀ + b_o)
  Storage<E> d_merged(static_cast<std::size_t>(T * HD), E{});
  linear_backward<E>({T, saved.merged_.data(), HD}, LinearWeight<E>::stored(p.o_proj_weight.data(), E_, HD),
                     d_output.data(), E_, {d_merged.data(), HD, grad("o_proj.weight"), bias_grad("o_proj.bias")}, lo);

  // In the forward pass this was (attention, flash on the 16-bit operands):
  //   a = grouped_query_attention_args(config, B, L, L, t, options); a.narrow = {q, k, v, merged}
  // The same arguments on float32 copies; the float32 flash backward. bf16
  // where the flash backward runs its pair way reads the saved bf16 q, k,
  // v, merged and d_merged themselves instead (AttentionBackwardArgs::
  // d_out_bf16; the same values, so the same bits: NarrowBackward.
  // GqaBf16OperandsGiveTheCopiesBits), as the multi-head module's does;
  // MULTIHEAD_BF16_BACKWARD=copies forces the copies (attention/mha_plan.hpp).
  // The backward's matmul way (kernels/narrow_matmul.hpp) reads them too.
  AttentionTensors<float> t;
  t.q_layout = t.out_layout = SliceLayout{L * HD, D, HD};
  t.k_layout = t.v_layout = SliceLayout{L * KD, D, KD};
  std::vector<float> slopes;
  AttentionBackwardArgs<float> b;
  b.forward = grouped_query_attention_args(config_, B, L, L, t, options, slopes);  // operands below
  b.lse = saved.lse_.data();
  const bool forced_copies = std::is_same_v<E, bfloat16> && backward_widens_bf16();  // read (and checked) each call
  const bool bf16_in = std::is_same_v<E, bfloat16> && !forced_copies &&
                       (flash_backward_reads_bf16() || narrow_matmul_backward_serves_bf16(b.forward));
  const auto copy = [&](const E* src, int64_t n) {
    return bf16_in ? Storage<float>() : widened(src, static_cast<std::size_t>(n), threads);
  };
  const Storage<float> qf = copy(saved.q_.data(), saved.q_.numel());
  const Storage<float> kf = copy(saved.k_.data(), saved.k_.numel());
  const Storage<float> vf = copy(saved.v_.data(), saved.v_.numel());
  const Storage<float> of = copy(saved.merged_.data(), saved.merged_.numel());
  const Storage<float> dof = copy(d_merged.data(), static_cast<int64_t>(d_merged.size()));
  if (!bf16_in) {
    b.forward.q = qf.data();
    b.forward.k = kf.data();
    b.forward.v = vf.data();
    b.forward.out = const_cast<float*>(of.data());  // read only: delta_i = <d_out_i, out_i>
  }
  if constexpr (std::is_same_v<E, bfloat16>) {
    if (bf16_in) {
      b.forward.narrow = {ComputeDtype::BF16, saved.q_.data(), saved.k_.data(), saved.v_.data(),
                          const_cast<E*>(saved.merged_.data())};  // merged: read only
      b.d_out_bf16 = d_merged.data();
    }
  }
  if (!bf16_in) b.d_out = dof.data();
  // Written in full by the kernel (Storage(n): no fill).
  Storage<float> dqf(static_cast<std::size_t>(saved.q_.numel())), dkf(static_cast<std::size_t>(saved.k_.numel())),
      dvf(static_cast<std::size_t>(saved.v_.numel()));
  b.d_q = dqf.data();
  b.d_k = dkf.data();
  b.d_v = dvf.data();
  b.bf16_operands = std::is_same_v<E, bfloat16>;  // the forward's bf16 way (AttentionBackwardArgs)
  run_attention_backward(b, AttentionKernel::Flash);  // the forward's kernel

  // In the forward pass this was (RoPE at positions 0 … L − 1, in float32):
  //   q, k = round(rope(q, k)), so d = Rᵀ d, before the rounding.
  if (config_.rope) {
    rope_backward_in_place(dqf.data(), B, L, H, D, *config_.rope);
    rope_backward_in_place(dkf.data(), B, L, Hkv, D, *config_.rope);
  }

  // d_q, d_k, d_v rounded once, side by side: row r of d_qkv is
  // [d_q (H·D) | d_k (Hkv·D) | d_v (Hkv·D)], for the one in-projection product.
  const int64_t QKV = HD + 2 * KD;
  Storage<E> d_qkv(static_cast<std::size_t>(T * QKV), E{});
  for (int64_t r = 0; r < T; ++r) {
    round_into(dqf.data() + r * HD, static_cast<std::size_t>(HD), d_qkv.data() + r * QKV, 1);
    round_into(dkf.data() + r * KD, static_cast<std::size_t>(KD), d_qkv.data() + r * QKV + HD, 1);
    round_into(dvf.data() + r * KD, static_cast<std::size_t>(KD), d_qkv.data() + r * QKV + HD + KD, 1);
  }

  // In the forward pass this was (in_projection):
  //   q = round(x W_qᵀ + b_q), k = round(x W_kᵀ + b_k), v = round(x W_vᵀ + b_v)
  // i.e. [q k v] = x [W_q; W_k; W_v]ᵀ with its rows rounded: one product
  // gives d_x summed over the three in float32, and d_W, d_b of the stacked
  // weight, whose row blocks are d_W_q, d_W_k, d_W_v.
  Storage<E> w_qkv(static_cast<std::size_t>(QKV * E_), E{}), d_w_qkv(w_qkv.size(), E{});
  std::copy_n(p.q_proj_weight.data(), HD * E_, w_qkv.data());
  std::copy_n(p.k_proj_weight.data(), KD * E_, w_qkv.data() + HD * E_);
  std::copy_n(p.v_proj_weight.data(), KD * E_, w_qkv.data() + (HD + KD) * E_);
  Storage<E> d_b_qkv(config_.bias ? static_cast<std::size_t>(QKV) : 0, E{});
  linear_backward<E>({T, saved.x_.data(), E_}, LinearWeight<E>::stored(w_qkv.data(), QKV, E_), d_qkv.data(), QKV,
                     {g.x.data(), E_, d_w_qkv.data(), config_.bias ? d_b_qkv.data() : nullptr}, lo);
  std::copy_n(d_w_qkv.data(), HD * E_, grad("q_proj.weight"));
  std::copy_n(d_w_qkv.data() + HD * E_, KD * E_, grad("k_proj.weight"));
  std::copy_n(d_w_qkv.data() + (HD + KD) * E_, KD * E_, grad("v_proj.weight"));
  if (config_.bias) {
    std::copy_n(d_b_qkv.data(), HD, grad("q_proj.bias"));
    std::copy_n(d_b_qkv.data() + HD, KD, grad("k_proj.bias"));
    std::copy_n(d_b_qkv.data() + HD + KD, KD, grad("v_proj.bias"));
  }
  return g;
}

template GroupedQueryAttentionGradients<bfloat16> NarrowGroupedQueryAttention<bfloat16>::backward(
    const NarrowGroupedQueryForwardContext<bfloat16>&, const Tensor<bfloat16>&) const;
template GroupedQueryAttentionGradients<float16> NarrowGroupedQueryAttention<float16>::backward(
    const NarrowGroupedQueryForwardContext<float16>&, const Tensor<float16>&) const;

}  // namespace multihead
