// src/attention/multihead_attention_forward.cpp: the fused form of
// multi-head attention, as frameworks run it (PyTorch 1.13,
// torch/nn/functional.py, multi_head_attention_forward):
//
//   1. in_projection:  one product for all heads,  [Q K V] = X W_inᵀ + b_in
//   2. split_heads:    (tokens, E) -> (B, H, L, D), D = E / H
//   3. scaled_dot_product_attention for every (batch, head) slice at once
//   4. merge_heads:    (B, H, L, D) -> (tokens, E)   (the concatenation)
//      out_projection: output = concat W^Oᵀ + b^O
//
// Legend: B batch, L query length, S key length, S' = S (+1 bias_k)
// (+1 zero attention), E embed_dim, H heads, D head width, Ek kdim, Ev vdim.
// "tokens" are the rows of the caller's tensor in its own layout
// ((L, B, E) or (B, L, E)); the plan's strides locate token (b, l).
#include <algorithm>
#include <cmath>
#include <cstring>

#include <omp.h>

#include "attention/kernel.hpp"
#include "attention/mha_plan.hpp"
#include "attention/projection_weights.hpp"
#include "attention/workspace.hpp"
#include "core/gemm.hpp"
#include "multihead/multihead_attention.hpp"

namespace multihead {
namespace detail {
namespace {

// A projection's weight as the products read it: Wᵀ, (in × out) row-major
// with row stride ld (projection_weights.hpp says why transposed).
template <class T>
struct WeightT {
  const T* data;
  int64_t ld;
};

// y (rows × out) = x (rows × in) · W + b, for nn.Linear's y = x Wᵀ + b.
template <class T>
void linear(int64_t rows, int64_t in, int64_t out, const T* x, WeightT<T> wt, const T* b, T* y,
            int64_t ldy) {
  gemm(Trans::No, Trans::No, rows, out, in, T(1), x, in, wt.data, wt.ld, T(0), y, ldy);
  if (b != nullptr)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < out; ++c) y[r * ldy + c] += b[c];
}

// W_qᵀ, W_kᵀ, W_vᵀ: column blocks of the transposed in_proj_weight, or the
// three separate transposed weights.
template <class T>
struct InWeightsT {
  WeightT<T> q, k, v;
};
template <class T>
InWeightsT<T> in_weights_t(const ProjectionWeights<T>& w, bool packed, int64_t E) {
  if (packed) {
    const T* base = w.in_proj_t.data();
    return {{base, 3 * E}, {base + E, 3 * E}, {base + 2 * E, 3 * E}};
  }
  return {{w.q_proj_t.data(), E}, {w.k_proj_t.data(), E}, {w.v_proj_t.data(), E}};
}

template <class T>
struct Projections {
  const T* q_ptr = nullptr;
  const T* k_ptr = nullptr;
  const T* v_ptr = nullptr;
  int64_t q_ld = 0, k_ld = 0, v_ld = 0;  // row strides
};

// Step 1. For self-attention (query, key and value are one tensor) and packed
// weights this is a single (tokens × E)·(E × 3E) product, PyTorch's
// _in_projection_packed fast case; otherwise one product per input.
template <class T>
Projections<T> in_projection(const MultiheadAttentionConfig& c, const MultiheadAttentionParameters<T>& p,
                             const ProjectionWeights<T>& weights_t, const ForwardPlan& plan, const Tensor<T>& query, const Tensor<T>& key,
                             const Tensor<T>& value, ForwardWorkspace<T>& ws) {
  Projections<T> r;
  const int64_t E = plan.E;
  const int64_t q_rows = plan.B * plan.L, kv_rows = plan.B * plan.S;
  const T* bias = c.bias ? p.in_proj_bias.data() : nullptr;
  const bool packed = c.same_embed_dim();
  const bool self = packed && query.data() == key.data() && key.data() == value.data();
  if (self) {
    T* qkv = ws.take(ws.proj_q, static_cast<std::size_t>(q_rows * 3 * E));
    linear(q_rows, E, 3 * E, query.data(), WeightT<T>{weights_t.in_proj_t.data(), 3 * E}, bias, qkv, 3 * E);
    r.q_ptr = qkv;
    r.k_ptr = qkv + E;
    r.v_ptr = qkv + 2 * E;
    r.q_ld = r.k_ld = r.v_ld = 3 * E;
    return r;
  }
  const InWeightsT<T> w = in_weights_t(weights_t, packed, E);
  T* q = ws.take(ws.proj_q, static_cast<std::size_t>(q_rows * E));
  T* k = ws.take(ws.proj_k, static_cast<std::size_t>(kv_rows * E));
  T* v = ws.take(ws.proj_v, static_cast<std::size_t>(kv_rows * E));
  linear(q_rows, E, E, query.data(), w.q, bias, q, E);
  linear(kv_rows, plan.Ek, E, key.data(), w.k, bias ? bias + E : nullptr, k, E);
  linear(kv_rows, plan.Ev, E, value.data(), w.v, bias ? bias + 2 * E : nullptr, v, E);
  r.q_ptr = q;
  r.k_ptr = k;
  r.v_ptr = v;
  r.q_ld = r.k_ld = r.v_ld = E;
  return r;
}

// A tensor seen as [B][H][len][D] through a slice layout (kernel.hpp).
template <class P>
struct HeadsView {
  P* data;
  SliceLayout layout;
};

// Step 2. split_heads is a reshape: feature h·D + d of token (b, l) in a
// (tokens, ld) buffer is element [b][h][l][d] of this view. No copy.
template <class P>
HeadsView<P> split_heads(P* src, int64_t ld, int64_t batch_stride, int64_t seq_stride, int64_t D) {
  return {src, SliceLayout{batch_stride * ld, D, seq_stride * ld}};
}

// Step 4a. merge_heads (the concatenation) is the inverse reshape: the kernel
// writes head h of token (b, l) straight into columns h·D … h·D + D − 1.
template <class P>
HeadsView<P> merge_heads(P* dst, int64_t E, int64_t batch_stride, int64_t seq_stride, int64_t D) {
  return {dst, SliceLayout{batch_stride * E, D, seq_stride * E}};
}

// Steps 1 and 2 together, for long key sequences: in_projection one block
// of token rows at a time into a small scratch, then split_heads as a copy of
// each block's rows into head-major [b][h][0, total_len)[d] buffers, one per
// part (W's row blocks: q, k, v for the packed self-attention product; one
// part otherwise).
//
// Why not always the view above: with views, the keys of one slice sit a
// whole projection row apart (3E floats for self-attention). At E = 1024
// that is 12 KiB, a multiple of 4 KiB, so the rows the kernel reads together
// fall into the same cache sets and evict each other. Measured, the flash
// kernel alone at L = S = 8192, H = 16, D = 64, 2 threads: 1288 ms on views,
// 780 ms on head-major buffers (the same runs as bench/bench_kernels.cpp's
// FlashLayout). Up to S = 1024 the two measure the same; at S = 2048,
// E = 768 views cost 9%.
// Projecting block by block keeps the extra memory to one block, instead of a
// second copy of Q, K and V.
constexpr int64_t kHeadMajorFromKeys = 2048;

// Rows per block: about projection_block_bytes() of projected rows (8 MiB by
// default: 682 rows at 3E = 3072), at least kMinBlockRows. The block's
// product must be tall enough for the GEMM to run at full speed: measured at
// L = 4096, E = 1024, 2 threads, whole forward: 2 MiB blocks 376 ms, 8 MiB
// 303 ms, 32 MiB 297 ms, one block 302 ms.
constexpr int64_t kMinBlockRows = 256;

template <class T>
struct HeadsDestination {
  T* data;            // [B][H][total_len][D]
  int64_t total_len;  // rows per slice (len, plus appended key columns)
};

template <class T>
void in_projection_split_heads(const T* x, int64_t in, WeightT<T> wt, const T* bias, int64_t parts,
                               const HeadsDestination<T>* dst, const ForwardPlan& plan, int64_t len,
                               int64_t seq_stride, int num_threads, Storage<T>& scratch) {
  const int64_t E = plan.E, H = plan.H, D = plan.D, B = plan.B;
  const int64_t out = parts * E, tokens = B * len;
  if (tokens == 0) return;
  const int64_t block = std::min(
      tokens, std::max<int64_t>(kMinBlockRows, projection_block_bytes().load() / static_cast<int64_t>(sizeof(T) * out)));
  T* y = ForwardWorkspace<T>::take(scratch, static_cast<std::size_t>(block * out));
  const int threads = num_threads > 0 ? num_threads : omp_get_max_threads();
  for (int64_t r0 = 0; r0 < tokens; r0 += block) {
    const int64_t rows = std::min(block, tokens - r0);
    linear(rows, in, out, x + r0 * in, wt, bias, y, out);
    // Token row r is (b, l) in the caller's layout: (B, len, ·) has
    // seq_stride 1, so r = b·len + l; (len, B, ·) has seq_stride B, so
    // r = l·B + b. (With B = 1 or len = 1 the two coincide, and so do the
    // formulas.)
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * out >= (int64_t{1} << 16))
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t r = r0 + i;
      const int64_t b = seq_stride == 1 ? r / len : r % B;
      const int64_t l = seq_stride == 1 ? r % len : r / B;
      for (int64_t part = 0; part < parts; ++part)
        for (int64_t h = 0; h < H; ++h)
          std::memcpy(dst[part].data + ((b * H + h) * dst[part].total_len + l) * D,
                      y + i * out + part * E + h * D, static_cast<std::size_t>(D) * sizeof(T));
    }
  }
}

// Step 4b. out_projection: output = concat · W^Oᵀ + b^O.
template <class T>
void out_projection(const MultiheadAttentionConfig& c, const MultiheadAttentionParameters<T>& p,
                    const ProjectionWeights<T>& weights_t, int64_t rows, const T* concat, T* out) {
  linear(rows, c.embed_dim, c.embed_dim, concat, WeightT<T>{weights_t.out_proj_t.data(), c.embed_dim},
         c.bias ? p.out_proj_bias.data() : nullptr, out, c.embed_dim);
}

// Mean over heads: (B, H, L, S') -> (B, L, S'), PyTorch's sum(dim=1) / H.
template <class T>
Tensor<T> average_heads(const Tensor<T>& w, const ForwardPlan& plan, Shape shape) {
  Tensor<T> avg(std::move(shape), T(0));
  const int64_t plane = plan.L * plan.S_total;
  for (int64_t b = 0; b < plan.B; ++b) {
    T* dst = avg.data() + b * plane;
    for (int64_t h = 0; h < plan.H; ++h) {
      const T* src = w.data() + (b * plan.H + h) * plane;
      for (int64_t x = 0; x < plane; ++x) dst[x] += src[x];
    }
    for (int64_t x = 0; x < plane; ++x) dst[x] /= static_cast<T>(plan.H);
  }
  return avg;
}

}  // namespace

std::atomic<int64_t>& projection_block_bytes() {
  static std::atomic<int64_t> bytes{int64_t{8} << 20};
  return bytes;
}

}  // namespace detail

template <class T>
ForwardResult<T> BasicMultiheadAttention<T>::forward(const Tensor<T>& query, const Tensor<T>& key,
                                                     const Tensor<T>& value,
                                                     const ForwardOptions<T>& options) const {
  ForwardResult<T> result;
  forward(query, key, value, options, result);
  return result;
}

template <class T>
void BasicMultiheadAttention<T>::forward(const Tensor<T>& query, const Tensor<T>& key,
                                         const Tensor<T>& value, const ForwardOptions<T>& options,
                                         ForwardResult<T>& result) const {
  using namespace detail;
  const ForwardPlan plan = plan_forward(config_, query, key, value, options);
  if (options.check_finite) check_forward_finite(query, key, value, params_);
  const int64_t B = plan.B, H = plan.H, L = plan.L, S = plan.S, St = plan.S_total, D = plan.D;
  if (B == 0 || L == 0) {  // nothing to attend from: empty outputs, no work
    result = empty_result<T>(plan, query.shape(), options);
    return;
  }
  if (options.need_weights || options.kernel == AttentionKernel::Materialized) check_weights_fit(plan, sizeof(T));
  WorkspaceLease<T> ws(*workspaces_);

  // 1. in_projection and 2. split_heads. Short key sequences: one product
  //    into token rows, and the heads as strided views of it (no copy).
  //    Long ones, or with bias_k / bias_v or the zero-attention key appended
  //    as extra key positions (PyTorch: torch.cat, then pad the masks):
  //    head-major copies, projected block by block.
  const bool extra_keys = St != S;
  const bool head_major = extra_keys || S >= kHeadMajorFromKeys;
  HeadsView<const T> q_heads, k_heads, v_heads;
  if (!head_major) {
    const Projections<T> proj = in_projection(config_, params_, *weights_t_, plan, query, key, value, *ws);
    q_heads = split_heads(proj.q_ptr, proj.q_ld, plan.q_batch_stride, plan.q_seq_stride, D);
    k_heads = split_heads(proj.k_ptr, proj.k_ld, plan.kv_batch_stride, plan.kv_seq_stride, D);
    v_heads = split_heads(proj.v_ptr, proj.v_ld, plan.kv_batch_stride, plan.kv_seq_stride, D);
  } else {
    T* q = ws->take(ws->q, static_cast<std::size_t>(B * H * L * D));
    T* k = ws->take(ws->k, static_cast<std::size_t>(B * H * St * D));
    T* v = ws->take(ws->v, static_cast<std::size_t>(B * H * St * D));
    const T* bias = config_.bias ? params_.in_proj_bias.data() : nullptr;
    const bool packed = config_.same_embed_dim();
    const bool self = packed && query.data() == key.data() && key.data() == value.data() && L == S;
    if (self) {  // one product with W_in = [W_q; W_k; W_v], as in_projection does
      const HeadsDestination<T> dst[3] = {{q, L}, {k, St}, {v, St}};
      in_projection_split_heads(query.data(), plan.E, WeightT<T>{weights_t_->in_proj_t.data(), 3 * plan.E},
                                bias, 3, dst, plan,
                                L, plan.q_seq_stride, options.num_threads, ws->proj_q);
    } else {
      const InWeightsT<T> w = in_weights_t(*weights_t_, packed, plan.E);
      const HeadsDestination<T> dq{q, L}, dk{k, St}, dv{v, St};
      in_projection_split_heads(query.data(), plan.E, w.q, bias, 1, &dq, plan, L, plan.q_seq_stride,
                                options.num_threads, ws->proj_q);
      in_projection_split_heads(key.data(), plan.Ek, w.k, bias ? bias + plan.E : nullptr, 1, &dk, plan, S,
                                plan.kv_seq_stride, options.num_threads, ws->proj_q);
      in_projection_split_heads(value.data(), plan.Ev, w.v, bias ? bias + 2 * plan.E : nullptr, 1, &dv, plan,
                                S, plan.kv_seq_stride, options.num_threads, ws->proj_q);
    }
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t slice = (b * H + h) * St;
        if (plan.bias_kv_col >= 0) {
          std::copy_n(params_.bias_k.data() + h * D, D, k + (slice + plan.bias_kv_col) * D);
          std::copy_n(params_.bias_v.data() + h * D, D, v + (slice + plan.bias_kv_col) * D);
        }
        if (plan.zero_attn_col >= 0) {
          std::fill_n(k + (slice + plan.zero_attn_col) * D, D, T(0));
          std::fill_n(v + (slice + plan.zero_attn_col) * D, D, T(0));
        }
      }
    q_heads = {q, SliceLayout{}};
    k_heads = {k, SliceLayout{}};
    v_heads = {v, SliceLayout{}};
  }

  // 3. scaled_dot_product_attention for all B·H slices, writing merged heads
  //    (4a: merge_heads is the kernel's output view into the concat buffer).
  const KernelMasks<T> masks = build_kernel_masks(plan, options);
  T* concat = ws->take(ws->concat, static_cast<std::size_t>(B * L * plan.E));
  const HeadsView<T> out_heads = merge_heads(concat, plan.E, plan.q_batch_stride, plan.q_seq_stride, D);
  Tensor<T> weights;
  if (options.need_weights) weights = Tensor<T>(Shape{B, H, L, St});
  AttentionArgs<T> a;
  a.slices = B * H;
  a.heads = H;
  a.q_len = L;
  a.kv_len = St;
  a.head_dim = D;
  a.value_dim = D;
  a.q = q_heads.data;
  a.k = k_heads.data;
  a.v = v_heads.data;
  a.q_layout = q_heads.layout;
  a.k_layout = k_heads.layout;
  a.v_layout = v_heads.layout;
  a.attn_mask = masks.attn_mask.empty() ? nullptr : masks.attn_mask.data();
  a.attn_mask_slice_stride = masks.attn_mask_slice_stride;
  a.key_padding = masks.key_padding.empty() ? nullptr : masks.key_padding.data();
  a.is_causal = options.is_causal;
  a.causal_cols = S;
  a.scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
  a.dropout_p = options.training ? config_.dropout : 0.0;
  a.dropout_seed = options.dropout_seed;
  a.masked_rows = options.masked_rows;
  a.num_threads = options.num_threads;
  a.out = out_heads.data;
  a.out_layout = out_heads.layout;
  a.weights = options.need_weights ? weights.data() : nullptr;
  attention_forward(a, options.kernel);

  // 4b. out_projection into the result.
  const Shape out_shape = output_shape(plan, query.shape());
  if (result.output.shape() != out_shape) result.output = Tensor<T>(out_shape);
  out_projection(config_, params_, *weights_t_, B * L, concat, result.output.data());

  result.attn_weights.reset();
  if (options.need_weights) {
    Shape shape = attn_weights_shape(plan, options.average_attn_weights);
    if (options.average_attn_weights) {
      result.attn_weights = average_heads(weights, plan, std::move(shape));
    } else {
      result.attn_weights = std::move(weights).reshaped(std::move(shape));
    }
  }
}

template ForwardResult<float> BasicMultiheadAttention<float>::forward(
    const Tensor<float>&, const Tensor<float>&, const Tensor<float>&, const ForwardOptions<float>&) const;
template ForwardResult<double> BasicMultiheadAttention<double>::forward(
    const Tensor<double>&, const Tensor<double>&, const Tensor<double>&,
    const ForwardOptions<double>&) const;

template void BasicMultiheadAttention<float>::forward(const Tensor<float>&, const Tensor<float>&,
                                                     const Tensor<float>&, const ForwardOptions<float>&,
                                                     ForwardResult<float>&) const;
template void BasicMultiheadAttention<double>::forward(const Tensor<double>&, const Tensor<double>&,
                                                      const Tensor<double>&, const ForwardOptions<double>&,
                                                      ForwardResult<double>&) const;

}  // namespace multihead
