// src/attention/narrow_multihead_attention_backward.cpp: the backward pass
// of the 16-bit module's forward (narrow_multihead_attention.cpp), its steps
// in reverse, each gradient rounded once to E where PyTorch's bf16 module's
// autograd rounds it (each op's result is a bf16 tensor there):
//
//   4. out_projection backward   d_concat = round(d_output · W_O),
//                                d_W_O = round(d_outputᵀ · concat), d_b_O = round(Σ d_output)
//   3. attention backward        Q, K, V, the merged heads O and d_concat
//                                widened to float32 (exact), the flash
//                                backward (the forward's kernel; bf16's pair
//                                way where the forward ran it:
//                                AttentionBackwardArgs::bf16_operands),
//                                d_Q, d_K, d_V in float32
//   2. split_heads backward      d_bias_k = round(Σ_b d_K[b, S]) (and d_bias_v)
//                                in float32; d_Q, d_K, d_V rounded to E
//   1. in_projection backward    d_query = round(d_Q · W_q), d_W_q = round(d_Qᵀ · query),
//                                d_b_q = round(Σ d_Q); K and V likewise
//
// The products of 4 and 1 run core/linear's 16-bit backward (the 16-bit
// gemm: exact products, float32 sums; oneDNN's bf16 matmul for bf16). Step 3
// keeps five float32 copies of (tokens, E) or (B·S', E) buffers and three
// float32 gradients of the same sizes for the call: the float32 kernel
// reads nothing narrower (docs/precision.md states the cost).
//
// Legend: B batch, L query length, S key length, S' = S (+1 bias_k)
// (+1 zero attention), E embed_dim, H heads, D head width, Ek kdim, Ev vdim.
#include <algorithm>
#include <string>
#include <type_traits>

#include "attention/mha_plan.hpp"
#include "attention/narrow_convert.hpp"
#include "attention/narrow_saved_forward.hpp"
#include "core/check.hpp"
#include "core/linear.hpp"
#include "core/narrow_rows.hpp"
#include "core/thread_scratch.hpp"
#include "core/parallel.hpp"
#include "kernels/kernel.hpp"
#include "kernels/narrow_matmul.hpp"
#include "multihead/error.hpp"

namespace multihead {

template <class E>
NarrowForwardContext<E>::NarrowForwardContext() = default;
template <class E>
NarrowForwardContext<E>::~NarrowForwardContext() = default;
template <class E>
NarrowForwardContext<E>::NarrowForwardContext(NarrowForwardContext&&) noexcept = default;
template <class E>
NarrowForwardContext<E>& NarrowForwardContext<E>::operator=(NarrowForwardContext&&) noexcept = default;

template <class E>
bool NarrowForwardContext<E>::empty() const {
  return saved_ == nullptr || !saved_->filled;
}

template <class E>
std::size_t NarrowForwardContext<E>::bytes() const {
  if (!saved_) return 0;
  const detail::NarrowSavedForward<E>& s = *saved_;
  const std::size_t narrow = static_cast<std::size_t>(s.saved_numel()) +
                             s.q.size() + s.k.size() + s.v.size() + s.k_ext.size() + s.v_ext.size() + s.concat.size();
  const std::size_t wide = s.lse.size() + static_cast<std::size_t>(s.masks.attn_mask.numel() + s.masks.key_padding.numel()) +
                           s.masks.alibi_slopes.size();
  return narrow * sizeof(E) + wide * sizeof(float);
}

template <class E>
void NarrowForwardContext<E>::clear() {
  saved_.reset();
}

template class NarrowForwardContext<bfloat16>;
template class NarrowForwardContext<float16>;

namespace detail {
namespace {

// The gradient of parameter `name` in g's map at its shape, as a view
// (MultiheadAttentionParameters<E> under the members' own names).
// Slice n = b·H + h of `src` (16-bit rows under the resolved layout l,
// `len` rows of D each) widened into contiguous [B·H][len][D] floats:
// split_heads and the widening in one pass (kBackwardHeadMajorFromKeys).
template <class E>
void widen_heads(const E* src, const SliceLayout& l, int64_t slices, int64_t H, int64_t len, int64_t D, float* dst,
                 int threads) {
  parallel_items(slices, threads, /*item_cost=*/len * D, [&](int64_t n) {
    widen_rows(src + (n / H) * l.batch + (n % H) * l.head, len, D, l.row, dst + n * len * D, D, 1);
  });
}

// n floats of one of this thread's buffers, kept between calls and
// uninitialised (core/thread_scratch.hpp).
struct KeptFloats {
  float* p;
  std::size_t n;
  float* data() const { return p; }
  std::size_t size() const { return n; }
};

// widen_heads's inverse for the gradients: contiguous [B·H][len][D] floats
// rounded once each into the 16-bit rows of layout l (merge_heads).
template <class E>
void round_heads(const float* src, const SliceLayout& l, int64_t slices, int64_t H, int64_t len, int64_t D, E* dst,
                 int threads) {
  parallel_items(slices, threads, /*item_cost=*/len * D, [&](int64_t n) {
    round_rows(src + n * len * D, len, D, D, static_cast<const E*>(nullptr), dst + (n / H) * l.batch + (n % H) * l.head,
               l.row, 1);
  });
}

template <class E>
MultiheadAttentionParameters<E> shape_gradients(const MultiheadAttentionConfig& c, MultiheadAttentionGradients<E>& g) {
  MultiheadAttentionParameters<E> d;
  for_each_parameter(c, d, [&](const ParameterInfo& info, Tensor<E>& t) {
    if (!info.present) return;
    Tensor<E>& slot = g.parameters[info.name];
    slot = Tensor<E>(info.shape);
    t = Tensor<E>::view(info.shape, slot.data());
  });
  return d;
}

}  // namespace
}  // namespace detail

template <class E>
MultiheadAttentionGradients<E> NarrowMultiheadAttention<E>::backward(const NarrowForwardContext<E>& saved,
                                                                    const Tensor<E>& d_output) const {
  using namespace detail;
  if (saved.empty())
    throw Error(Error::Kind::Value,
                "context: empty NarrowForwardContext; fill it with forward(query, key, value, options, context) first");
  const NarrowSavedForward<E>& s = *saved.saved_;
  if (s.parameters_token != parameters_token_)
    throw Error(Error::Kind::Value,
                "context: this NarrowForwardContext was filled by another module or before update_parameters(); "
                "run the forward again");
  const ForwardPlan& p = s.plan;
  expect_shape("d_output", d_output.shape(), output_shape(p, s.query_shape));
  if (s.options.attention.check_finite) check_finite("d_output", d_output);
  MultiheadAttentionGradients<E> g;
  MultiheadAttentionParameters<E> d = shape_gradients(config_, g);  // views of g.parameters, zeros
  if (p.B == 0 || p.L == 0) {  // the forward did no work: every gradient is 0
    g.query = Tensor<E>(s.query.shape());
    g.key = Tensor<E>(s.saved_key().shape());
    g.value = Tensor<E>(s.saved_value().shape());
    return g;
  }
  // Written in full by step 1's products below (d_x of each linear_backward).
  g.query = Tensor<E>::uninitialized(s.query.shape());
  g.key = Tensor<E>::uninitialized(s.saved_key().shape());
  g.value = Tensor<E>::uninitialized(s.saved_value().shape());
  const int threads = s.options.attention.num_threads;
  const int64_t E_ = p.E, q_tokens = p.B * p.L, kv_tokens = p.B * p.S;
  const LinearOptions lo{false, threads};

  // 4. In the forward pass this was (out_projection):
  //   linear_forward({B·L, attn, E}, W_O, b_O, output)   output = round(concat · W_Oᵀ + b_O)
  Storage<E> d_concat(static_cast<std::size_t>(q_tokens * E_));  // written in full (Storage(n): no fill)
  linear_backward<E>({q_tokens, s.concat.data(), E_}, LinearWeight<E>::stored(params_.out_proj_weight.data(), E_, E_),
                     d_output.data(), E_,
                     {d_concat.data(), E_, d.out_proj_weight.data(), config_.bias ? d.out_proj_bias.data() : nullptr},
                     lo);

  // 3. In the forward pass this was (attention, the flash kernel on the
  // 16-bit operands):
  //   args = narrow_attention_args(config, plan, options, masks); args.narrow = {Q, K', V', concat}
  // The same arguments on float32 copies; the backward of the kernel the
  // forward ran (a 16-bit forward runs flash only). From
  // kBackwardHeadMajorFromKeys keys on (as the float32 module's backward,
  // and without extra key rows) the copies are head-major, widened straight
  // from the 16-bit rows: the float32 kernel then reads contiguous heads, not
  // rows E floats apart (the bf16 training step at (1, 4096, 1024, 16) went
  // from 0.95x to 1.20x our float32 step with this and the kept buffers
  // below; bench/bench_precision.py --train, AMD Zen 5). Same values, same arithmetic, same
  // bits (NarrowBackward.HeadMajorCopiesGiveTheViewsBits).
  //
  // bf16 where the backward takes the matmul way (narrow_matmul.hpp) or
  // the flash backward runs its pair way (flash_backward_reads_bf16:
  // the products read only bf16 pairs) reads the saved bf16 Q, K', V', concat
  // and d_concat themselves (AttentionBackwardArgs::d_out_bf16): no float32
  // copies, in the token-row layouts (the pair way packs its operands per
  // call and per tile) where the views are read anyway. The same
  // values, so the same bits as on the copies (NarrowBackward.
  // Bf16OperandsGiveTheCopiesBits); the bf16 step at (8, 128, 512, 8) ran
  // ~5% faster without these five widenings (bench/bench_precision.py's
  // step, alternated with the copies' build, AMD Zen 5).
  AttentionBackwardArgs<float> b;
  b.forward = narrow_attention_args(config_, p, s.options, s.masks);
  // From kBackwardHeadMajorFromKeys keys on the head-major float32 copies
  // stay: the kernel's d_k, d_v rows E apart cost more there than the
  // copies (bf16 step at (1, 1024, 768, 12): 50.0 ms in place against 48.7
  // with the copies, alternated, median of 3).
  // The matmul way (kernels/narrow_matmul.hpp) reads the token rows' bf16
  // in place, whatever the length.
  const bool forced_copies = std::is_same_v<E, bfloat16> && backward_widens_bf16();  // read (and checked) each call
  const bool matmul_in = std::is_same_v<E, bfloat16> && !forced_copies && narrow_matmul_backward_serves_bf16(b.forward);
  const bool head_major =
      !matmul_in && p.S_total == p.S && p.S >= kBackwardHeadMajorFromKeys && !backward_reads_views();
  const bool bf16_in = matmul_in || (std::is_same_v<E, bfloat16> && !forced_copies && !head_major &&
                                     flash_backward_reads_bf16());
  const int64_t slices = p.B * p.H;
  const SliceLayout ql = resolve_layout(b.forward.q_layout, p.H, p.L, p.D);
  const SliceLayout kl = resolve_layout(b.forward.k_layout, p.H, p.S, p.D);
  const SliceLayout vl = resolve_layout(b.forward.v_layout, p.H, p.S, p.D);
  const SliceLayout ol = resolve_layout(b.forward.out_layout, p.H, p.L, p.D);
  // The copies and the kernel's gradients (written, not accumulated: no
  // zeroing) are this thread's buffers, kept between calls: fresh ones
  // were zeroed and faulted in on every step, and a training step at
  // (8, 128, 512, 8) then spent ~40% of its time in memset and page faults
  // (perf, AMD Zen 5). Memory: 8 float buffers of the step's Q/K/V sizes
  // per thread, grown, never shrunk.
  thread_local ThreadScratch scratch[8];
  const auto take = [&](int slot, std::size_t n) { return KeptFloats{scratch[slot].take(n), n}; };
  const auto copy = [&](const E* src, std::size_t n, const SliceLayout& l, int64_t len, int slot) {
    const KeptFloats dst = take(slot, n);
    if (head_major) {
      widen_heads(src, l, slices, p.H, len, p.D, dst.data(), threads);
    } else {
      widen_rows(src, 1, static_cast<int64_t>(n), static_cast<int64_t>(n), dst.data(), static_cast<int64_t>(n), threads);
    }
    return dst;
  };
  const KeptFloats dqf = take(5, s.q.size()), dkf = take(6, s.k_heads_size()), dvf = take(7, s.k_heads_size());
  if constexpr (std::is_same_v<E, bfloat16>) {
    if (bf16_in) {
      // concat is read only (delta_i = <d_out_i, out_i>).
      b.forward.narrow = {ComputeDtype::BF16, s.q.data(), s.k_heads(), s.v_heads(), const_cast<E*>(s.concat.data())};
      b.d_out_bf16 = d_concat.data();
    }
  }
  if (!bf16_in) {
    const KeptFloats qf = copy(s.q.data(), s.q.size(), ql, p.L, 0);
    const KeptFloats kf = copy(s.k_heads(), s.k_heads_size(), kl, p.S, 1);
    const KeptFloats vf = copy(s.v_heads(), s.k_heads_size(), vl, p.S, 2);
    const KeptFloats of = copy(s.concat.data(), s.concat.size(), ol, p.L, 3);
    const KeptFloats dof = copy(d_concat.data(), d_concat.size(), ol, p.L, 4);
    if (head_major) b.forward.q_layout = b.forward.k_layout = b.forward.v_layout = b.forward.out_layout = SliceLayout{};
    b.forward.q = qf.data();
    b.forward.k = kf.data();
    b.forward.v = vf.data();
    b.forward.out = of.data();  // read only: delta_i = <d_out_i, out_i>
    b.d_out = dof.data();
  }
  b.lse = s.lse.data();
  b.d_q = dqf.data();
  b.d_k = dkf.data();
  b.d_v = dvf.data();
  b.bf16_operands = std::is_same_v<E, bfloat16>;  // the forward's bf16 way (AttentionBackwardArgs)
  run_attention_backward(b, AttentionKernel::Flash);

  // 2. In the forward pass this was (split_heads): views of the projections
  // (a reshape), or (B, S', E) copies of K and V with bias_k (and the zero
  // row) appended. d_Q, d_K, d_V rounded to E in the projections' rows;
  // the bias_k row's gradient, summed over the batch in float32, is
  // d_bias_k (the zero row's is dropped: a constant).
  //
  // Self-attention (one input tensor, the packed in_proj_weight, no extra
  // key rows): d_Q, d_K, d_V side by side in one (tokens × 3E) buffer, row
  // r = [d_Q | d_K | d_V], so that step 1 takes d_W_in and d_b_in in one
  // product through [W_q; W_k; W_v], as the forward's one in_projection
  // product, in place of three (core/linear.hpp, linear_forward_stacked).
  const bool packed = config_.same_embed_dim();
  const bool stacked = packed && s.key_is_query && s.value_is_query && p.S_total == p.S;
  const int64_t ld_d = stacked ? 3 * E_ : E_;  // rows of d_Q, d_K, d_V
  // Written in full by each branch below (Storage(n): no fill).
  Storage<E> d_qkv(stacked ? static_cast<std::size_t>(q_tokens * 3 * E_) : 0);
  Storage<E> d_q(stacked ? 0 : dqf.size()), d_k(stacked ? 0 : static_cast<std::size_t>(kv_tokens * E_)), d_v(d_k.size());
  E* const dq = stacked ? d_qkv.data() : d_q.data();
  E* const dk = stacked ? d_qkv.data() + E_ : d_k.data();
  E* const dv = stacked ? d_qkv.data() + 2 * E_ : d_v.data();
  // A token-row layout (rows E apart) with rows ld_d apart.
  const auto in_rows = [&](SliceLayout l) {
    l.batch = l.batch / E_ * ld_d;
    l.row = l.row / E_ * ld_d;
    return l;
  };
  if (head_major) {  // merge_heads: back into the projections' rows
    round_heads(dqf.data(), in_rows(ql), slices, p.H, p.L, p.D, dq, threads);
    round_heads(dkf.data(), in_rows(kl), slices, p.H, p.S, p.D, dk, threads);
    round_heads(dvf.data(), in_rows(vl), slices, p.H, p.S, p.D, dv, threads);
  } else if (p.S_total == p.S) {
    round_rows(dqf.data(), q_tokens, E_, E_, static_cast<const E*>(nullptr), dq, ld_d, threads);
    round_rows(dkf.data(), kv_tokens, E_, E_, static_cast<const E*>(nullptr), dk, ld_d, threads);
    round_rows(dvf.data(), kv_tokens, E_, E_, static_cast<const E*>(nullptr), dv, ld_d, threads);
  } else {
    round_into(dqf.data(), dqf.size(), d_q.data(), threads);
    for (int64_t bb = 0; bb < p.B; ++bb)
      for (int64_t j = 0; j < p.S; ++j) {
        const int64_t src = (bb * p.S_total + j) * E_, dst = (bb * p.kv_batch_stride + j * p.kv_seq_stride) * E_;
        round_into(dkf.data() + src, static_cast<std::size_t>(E_), d_k.data() + dst, 1);
        round_into(dvf.data() + src, static_cast<std::size_t>(E_), d_v.data() + dst, 1);
      }
    if (p.bias_kv_col >= 0) {
      for (auto [from, to] : {std::pair{dkf.data(), d.bias_k.data()}, std::pair{dvf.data(), d.bias_v.data()}})
        for (int64_t e = 0; e < E_; ++e) {
          float sum = 0.0f;
          for (int64_t bb = 0; bb < p.B; ++bb) sum += from[(bb * p.S_total + p.bias_kv_col) * E_ + e];
          to[e] = narrow_from_float<E>(sum);
        }
    }
  }

  // 1. In the forward pass this was (in_projection):
  //   linear_forward({tokens, query, E}, W_q, b_q, Q)   Q = round(query · W_qᵀ + b_q), K, V likewise
  // (self-attention: one product through [W_q; W_k; W_v], linear_forward_stacked).
  // Each argument gets its own d_input (self-attention: the caller sums them).
  const E* W_q = packed ? params_.in_proj_weight.data() : params_.q_proj_weight.data();
  const E* W_k = packed ? W_q + E_ * E_ : params_.k_proj_weight.data();
  const E* W_v = packed ? W_q + 2 * E_ * E_ : params_.v_proj_weight.data();
  E* d_W_q = packed ? d.in_proj_weight.data() : d.q_proj_weight.data();
  E* d_W_k = packed ? d_W_q + E_ * E_ : d.k_proj_weight.data();
  E* d_W_v = packed ? d_W_q + 2 * E_ * E_ : d.v_proj_weight.data();
  E* d_b = config_.bias ? d.in_proj_bias.data() : nullptr;
  const auto part = [&](int64_t rows, int64_t in, const Tensor<E>& x, const E* W, const E* d_y, Tensor<E>& d_x,
                        E* d_W, E* d_bias) {
    linear_backward<E>({rows, x.data(), in}, LinearWeight<E>::stored(W, E_, in), d_y, ld_d,
                       {d_x.data(), in, d_W, d_bias}, lo);
  };
  if (stacked) {
    // d_W_in = round(d_QKVᵀ · x) and d_b_in = round(Σ d_QKV): one product
    // and one column sum over the 3E columns; then each d_input alone.
    linear_backward<E>({q_tokens, s.query.data(), E_}, LinearWeight<E>::stored(W_q, 3 * E_, E_), d_qkv.data(), ld_d,
                       {nullptr, 0, d_W_q, d_b}, lo);
    part(q_tokens, E_, s.query, W_q, dq, g.query, nullptr, nullptr);
    part(kv_tokens, E_, s.saved_key(), W_k, dk, g.key, nullptr, nullptr);
    part(kv_tokens, E_, s.saved_value(), W_v, dv, g.value, nullptr, nullptr);
    return g;
  }
  part(q_tokens, E_, s.query, W_q, dq, g.query, d_W_q, d_b);
  part(kv_tokens, p.Ek, s.saved_key(), W_k, dk, g.key, d_W_k, d_b ? d_b + E_ : nullptr);
  part(kv_tokens, p.Ev, s.saved_value(), W_v, dv, g.value, d_W_v, d_b ? d_b + 2 * E_ : nullptr);
  return g;
}

template MultiheadAttentionGradients<bfloat16> NarrowMultiheadAttention<bfloat16>::backward(
    const NarrowForwardContext<bfloat16>&, const Tensor<bfloat16>&) const;
template MultiheadAttentionGradients<float16> NarrowMultiheadAttention<float16>::backward(
    const NarrowForwardContext<float16>&, const Tensor<float16>&) const;

}  // namespace multihead
