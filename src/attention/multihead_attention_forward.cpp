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
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "attention/attention_call.hpp"
#include "attention/mha_plan.hpp"
#include "attention/multihead_attention_fused.hpp"
#include "attention/projection_weights.hpp"
#include "attention/workspace.hpp"
#include "core/linear.hpp"
#include "core/parallel.hpp"
#include "core/switches.hpp"
#include "kernels/kernel.hpp"
#include "multihead/error.hpp"
#include "multihead/multihead_attention.hpp"

namespace multihead {
namespace detail {
namespace {

// A projection's weight as the products read it: either Wᵀ, (in × out)
// row-major (projection_weights.hpp says why), or W as nn.Linear stores it,
// (out × in). The projections are the one linear layer, core/linear.hpp.
template <class T>
using Weight = LinearWeight<T>;

// W_q, W_k, W_v (and, packed, all three as one (3E × E) weight), as the
// products read them; the in-projection biases.
template <class T>
struct InWeights {
  Weight<T> q, k, v, qkv;
  const T *bq, *bk, *bv;
};

template <class T>
InWeights<T> in_weights(const MultiheadAttentionConfig& c, const MultiheadAttentionParameters<T>& p,
                        const ProjectionWeights<T>& wt, bool transposed) {
  const int64_t E = c.embed_dim;
  InWeights<T> w{};
  const T* bias = c.bias ? p.in_proj_bias.data() : nullptr;
  w.bq = bias;
  w.bk = bias ? bias + E : nullptr;
  w.bv = bias ? bias + 2 * E : nullptr;
  if (c.same_embed_dim() && transposed) {  // (E, 3E): column blocks
    const T* base = wt.in_proj_t.data();
    w = {{base, 3 * E, true, E, E}, {base + E, 3 * E, true, E, E}, {base + 2 * E, 3 * E, true, E, E},
         {base, 3 * E, true, E, 3 * E}, w.bq, w.bk, w.bv};
  } else if (c.same_embed_dim()) {  // (3E, E): row blocks
    const T* base = p.in_proj_weight.data();
    w = {{base, E, false, E, E}, {base + E * E, E, false, E, E}, {base + 2 * E * E, E, false, E, E},
         {base, E, false, E, 3 * E}, w.bq, w.bk, w.bv};
  } else if (transposed) {
    w.q = {wt.q_proj_t.data(), E, true, E, E};
    w.k = {wt.k_proj_t.data(), E, true, c.key_dim(), E};
    w.v = {wt.v_proj_t.data(), E, true, c.value_dim(), E};
  } else {
    w.q = {p.q_proj_weight.data(), E, false, E, E};
    w.k = {p.k_proj_weight.data(), c.key_dim(), false, c.key_dim(), E};
    w.v = {p.v_proj_weight.data(), c.value_dim(), false, c.value_dim(), E};
  }
  return w;
}

// Auto copies heads from this many keys on (in_projection_head_major says
// why). Heads must be copied whatever the setting when bias_k / bias_v or
// the zero-attention key add key positions (PyTorch: torch.cat, then pad the
// masks).
constexpr int64_t kHeadMajorFromKeys = 2048;

// MULTIHEAD_FUSED_PATHS=plain forces every plain alternative (head-major
// copies, separate products, the weights as stored) for the whole process,
// so that a program such as the CLI can be checked both ways; "auto" or
// unset leaves the call's FusedPaths. Read on every call, as MULTIHEAD_KERNEL.
FusedPaths paths_from_environment(const FusedPaths& requested) {
  if (env_switch("MULTIHEAD_FUSED_PATHS", {"auto", "plain"}) == 0) return requested;
  return FusedPaths{FusedPaths::Heads::HeadMajor, false, false};
}

template <class T>
PathChoice choose_paths(const MultiheadAttentionConfig& c, const ForwardPlan& plan, const FusedPaths& requested,
                        const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value) {
  const FusedPaths paths = paths_from_environment(requested);
  PathChoice r;
  const bool extra_keys = plan.S_total != plan.S;
  r.head_major = extra_keys || paths.heads == FusedPaths::Heads::HeadMajor ||
                 (paths.heads == FusedPaths::Heads::Auto && plan.S >= kHeadMajorFromKeys);
  r.packed_self = paths.packed_self_projection && c.same_embed_dim() && query.data() == key.data() &&
                  key.data() == value.data() && plan.L == plan.S;
  r.transposed = paths.transposed_weights;
  return r;
}

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

// One fused forward call: what every step reads.
template <class T>
struct FusedCall {
  const MultiheadAttentionConfig& config;
  const MultiheadAttentionParameters<T>& params;
  const ForwardPlan& plan;
  const ForwardOptions<T>& options;
  const Tensor<T>& query;
  const Tensor<T>& key;
  const Tensor<T>& value;
  InWeights<T> w;
  PathChoice paths;
  ForwardWorkspace<T>& ws;
  AttentionKernel kernel;     // chosen once for the call (resolve_forward_kernel): never Auto
  const KernelMasks<T>& masks;  // the masks in kernel layout, built once for the call
};

// Steps 1 and 2 for short key sequences: in_projection into token rows, and
// split_heads as strided views of them (no copy).
template <class T>
Heads<T> in_projection_views(const FusedCall<T>& f) {
  const ForwardPlan& plan = f.plan;
  const int64_t E = plan.E, D = plan.D, q_rows = plan.B * plan.L, kv_rows = plan.B * plan.S;
  Heads<T> h;
  if (f.paths.packed_self) {  // one (tokens × E)·(E × 3E) product
    T* qkv = f.ws.take(f.ws.proj_q, static_cast<std::size_t>(q_rows * 3 * E));
    linear_forward<T>({q_rows, f.query.data(), f.w.qkv.in}, f.w.qkv, f.w.bq, qkv, 3 * E, {false, f.options.attention.num_threads});
    h.q = split_heads<const T>(qkv, 3 * E, plan.q_batch_stride, plan.q_seq_stride, D);
    h.k = split_heads<const T>(qkv + E, 3 * E, plan.kv_batch_stride, plan.kv_seq_stride, D);
    h.v = split_heads<const T>(qkv + 2 * E, 3 * E, plan.kv_batch_stride, plan.kv_seq_stride, D);
    return h;
  }
  T* q = f.ws.take(f.ws.proj_q, static_cast<std::size_t>(q_rows * E));
  T* k = f.ws.take(f.ws.proj_k, static_cast<std::size_t>(kv_rows * E));
  T* v = f.ws.take(f.ws.proj_v, static_cast<std::size_t>(kv_rows * E));
  linear_forward<T>({q_rows, f.query.data(), f.w.q.in}, f.w.q, f.w.bq, q, E, {false, f.options.attention.num_threads});
  linear_forward<T>({kv_rows, f.key.data(), f.w.k.in}, f.w.k, f.w.bk, k, E, {false, f.options.attention.num_threads});
  linear_forward<T>({kv_rows, f.value.data(), f.w.v.in}, f.w.v, f.w.bv, v, E, {false, f.options.attention.num_threads});
  h.q = split_heads<const T>(q, E, plan.q_batch_stride, plan.q_seq_stride, D);
  h.k = split_heads<const T>(k, E, plan.kv_batch_stride, plan.kv_seq_stride, D);
  h.v = split_heads<const T>(v, E, plan.kv_batch_stride, plan.kv_seq_stride, D);
  return h;
}

// Steps 1 and 2 together, for long key sequences: in_projection one block
// of token rows at a time into a small scratch, then split_heads as a copy of
// each block's rows into head-major [b][h][0, total_len)[d] buffers, one per
// part (W's row blocks: q, k, v for the packed self-attention product; one
// part otherwise).
//
// Why not always views (in_projection_views): with views, the keys of one slice sit a
// whole projection row apart (3E floats for self-attention). At E = 1024
// that is 12 KiB, a multiple of 4 KiB, so the rows the kernel reads together
// fall into the same cache sets and evict each other. Measured, the flash
// kernel alone at L = S = 8192, H = 16, D = 64, 2 threads: 1288 ms on views,
// 780 ms on head-major buffers (the same runs as bench/bench_kernels.cpp's
// FlashLayout). Up to S = 1024 the two measure the same; at S = 2048,
// E = 768 views cost 9%.
// Projecting block by block keeps the extra memory to one block, instead of a
// second copy of Q, K and V.

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

// One input projected into head-major buffers: x (tokens, w.in) through w,
// `parts` blocks of E output columns, tokens (b, l) for l < len, with
// seq_stride locating them in the caller's layout.
template <class T>
struct HeadMajorProjection {
  const T* x;
  Weight<T> w;
  const T* bias;
  int64_t parts;
  const HeadsDestination<T>* dst;
  int64_t len, seq_stride;
};

// Copies block row i (token r0 + i) of y into the head-major destinations.
template <class T>
void scatter_heads(const HeadMajorProjection<T>& p, const ForwardPlan& plan, int64_t r, const T* y_row) {
  const int64_t E = plan.E, H = plan.H, D = plan.D;
  // Token row r is (b, l) in the caller's layout: (B, len, ·) has
  // seq_stride 1, so r = b·len + l; (len, B, ·) has seq_stride B, so
  // r = l·B + b. (With B = 1 or len = 1 the two coincide, and so do the
  // formulas.)
  const int64_t b = p.seq_stride == 1 ? r / p.len : r % plan.B;
  const int64_t l = p.seq_stride == 1 ? r % p.len : r / plan.B;
  for (int64_t part = 0; part < p.parts; ++part)
    for (int64_t h = 0; h < H; ++h)
      std::memcpy(p.dst[part].data + ((b * H + h) * p.dst[part].total_len + l) * D, y_row + part * E + h * D,
                  static_cast<std::size_t>(D) * sizeof(T));
}

template <class T>
void in_projection_split_heads(const HeadMajorProjection<T>& p, const ForwardPlan& plan, int num_threads,
                               Storage<T>& scratch) {
  const int64_t out = p.parts * plan.E, tokens = plan.B * p.len;
  if (tokens == 0) return;
  const int64_t block = std::min(
      tokens, std::max<int64_t>(kMinBlockRows, projection_block_bytes().load() / static_cast<int64_t>(sizeof(T) * out)));
  T* y = ForwardWorkspace<T>::take(scratch, static_cast<std::size_t>(block * out));
  const int threads = num_threads > 0 ? num_threads : omp_get_max_threads();
  for (int64_t r0 = 0; r0 < tokens; r0 += block) {
    const int64_t rows = std::min(block, tokens - r0);
    linear_forward<T>({rows, p.x + r0 * p.w.in, p.w.in}, p.w, p.bias, y, out, {false, threads});
    parallel_items(rows, threads, /*item_cost=*/out, [&](int64_t i) { scatter_heads(p, plan, r0 + i, y + i * out); });
  }
}

// The appended key positions: bias_k / bias_v, and the zero-attention key.
template <class T>
void append_extra_keys(const FusedCall<T>& f, T* k, T* v) {
  const ForwardPlan& plan = f.plan;
  const int64_t D = plan.D, St = plan.S_total;
  for (int64_t b = 0; b < plan.B; ++b)
    for (int64_t h = 0; h < plan.H; ++h) {
      const int64_t slice = (b * plan.H + h) * St;
      if (plan.bias_kv_col >= 0) {
        std::copy_n(f.params.bias_k.data() + h * D, D, k + (slice + plan.bias_kv_col) * D);
        std::copy_n(f.params.bias_v.data() + h * D, D, v + (slice + plan.bias_kv_col) * D);
      }
      if (plan.zero_attn_col >= 0) {
        std::fill_n(k + (slice + plan.zero_attn_col) * D, D, T(0));
        std::fill_n(v + (slice + plan.zero_attn_col) * D, D, T(0));
      }
    }
}

// Steps 1 and 2 for long key sequences, or with extra key positions.
template <class T>
Heads<T> in_projection_head_major(const FusedCall<T>& f) {
  const ForwardPlan& plan = f.plan;
  const int64_t B = plan.B, H = plan.H, L = plan.L, S = plan.S, St = plan.S_total, D = plan.D;
  T* q = f.ws.take(f.ws.q, static_cast<std::size_t>(B * H * L * D));
  T* k = f.ws.take(f.ws.k, static_cast<std::size_t>(B * H * St * D));
  T* v = f.ws.take(f.ws.v, static_cast<std::size_t>(B * H * St * D));
  const int threads = f.options.attention.num_threads;
  if (f.paths.packed_self) {  // one product with W_in = [W_q; W_k; W_v]
    const HeadsDestination<T> dst[3] = {{q, L}, {k, St}, {v, St}};
    in_projection_split_heads<T>({f.query.data(), f.w.qkv, f.w.bq, 3, dst, L, plan.q_seq_stride}, plan,
                                 threads, f.ws.proj_q);
  } else {
    const HeadsDestination<T> dq{q, L}, dk{k, St}, dv{v, St};
    in_projection_split_heads<T>({f.query.data(), f.w.q, f.w.bq, 1, &dq, L, plan.q_seq_stride}, plan,
                                 threads, f.ws.proj_q);
    in_projection_split_heads<T>({f.key.data(), f.w.k, f.w.bk, 1, &dk, S, plan.kv_seq_stride}, plan,
                                 threads, f.ws.proj_q);
    in_projection_split_heads<T>({f.value.data(), f.w.v, f.w.bv, 1, &dv, S, plan.kv_seq_stride}, plan,
                                 threads, f.ws.proj_q);
  }
  append_extra_keys(f, k, v);
  return {{q, SliceLayout{}}, {k, SliceLayout{}}, {v, SliceLayout{}}};
}

// Whether the weights come from the flash kernel's recompute (its lse,
// then attention_weights_flash for the selection only) rather than from a
// kernel that stores all of them: when flash is the kernel chosen for the
// call (Auto for float, or forced).
template <class T>
bool weights_recomputed(const ForwardOptions<T>& options, AttentionKernel kernel) {
  return std::is_same_v<T, float> && options.need_weights && kernel == AttentionKernel::Flash;
}

// Step 3. scaled_dot_product_attention for all B·H slices, writing merged
// heads into `concat` (4a: merge_heads is the kernel's output view), and
// each row's log-sum-exp into `lse` when not null (a training forward).
// With need_weights, returns the selected weights (B, H', L', S'):
//  - recomputed (weights_recomputed): flash without weights, saving the lse
//    (into f.ws when the caller keeps none), then p'_ij = dropout(exp(s_ij −
//    lse_i)) for the selected slices b·H + h and rows only;
//  - else the kernel's full (B, H, L, S') weights, and the selection copied.
template <class T>
std::optional<Tensor<T>> attend(const FusedCall<T>& f, const Heads<T>& heads, T* concat, T* lse) {
  const ForwardPlan& plan = f.plan;
  AttentionArgs<T> args =
      module_attention_args(f.config, plan, f.options, heads, f.masks, concat, static_cast<T*>(nullptr));
  args.lse = lse;
  if (!f.options.need_weights) {
    run_attention_forward(args, f.kernel);
    return std::nullopt;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (weights_recomputed(f.options, f.kernel)) {
      if (args.lse == nullptr) args.lse = f.ws.take(f.ws.lse, static_cast<std::size_t>(plan.B * plan.H * plan.L));
      run_attention_forward(args, f.kernel);
      std::vector<int64_t> slices(static_cast<std::size_t>(plan.B * plan.H_weights));
      for (int64_t b = 0; b < plan.B; ++b)
        for (int64_t h = 0; h < plan.H_weights; ++h)
          slices[static_cast<std::size_t>(b * plan.H_weights + h)] = b * plan.H + selected_head(f.options, h);
      Tensor<T> weights(Shape{plan.B, plan.H_weights, plan.L_weights, plan.S_total});
      AttentionWeightsArgs w;
      w.forward = args;
      w.lse = args.lse;
      w.slices = slices.data();
      w.slice_count = static_cast<int64_t>(slices.size());
      if (!f.options.weights_rows.empty()) {
        w.rows = f.options.weights_rows.data();
        w.row_count = static_cast<int64_t>(f.options.weights_rows.size());
      }
      w.weights = weights.data();
      attention_weights_flash(w);
      return weights;
    }
  }
  Tensor<T> full(Shape{plan.B, plan.H, plan.L, plan.S_total});
  args.weights = full.data();
  run_attention_forward(args, f.kernel);
  return select_weights(std::move(full), plan, f.options);
}

}  // namespace

void check_fused_paths_environment() { (void)paths_from_environment(FusedPaths{}); }

template <class T>
AttentionArgs<T> module_attention_args(const MultiheadAttentionConfig& config, const ForwardPlan& plan,
                                       const ForwardOptions<T>& options, const Heads<T>& heads,
                                       const KernelMasks<T>& masks, T* concat, T* weights) {
  const HeadsView<T> out = merge_heads(concat, plan.E, plan.q_batch_stride, plan.q_seq_stride, plan.D);
  AttentionShape shape;
  shape.slices = plan.B * plan.H;
  shape.heads = plan.H;
  shape.q_len = plan.L;
  shape.kv_len = plan.S_total;
  shape.head_dim = shape.value_dim = plan.D;
  shape.causal_cols = plan.S;
  AttentionTensors<T> t;
  t.q = heads.q.data;
  t.k = heads.k.data;
  t.v = heads.v.data;
  t.q_layout = heads.q.layout;
  t.k_layout = heads.k.layout;
  t.v_layout = heads.v.layout;
  t.attn_mask = masks.attn_mask.empty() ? nullptr : masks.attn_mask.data();
  t.attn_mask_slice_stride = masks.attn_mask_slice_stride;
  t.key_padding = masks.key_padding.empty() ? nullptr : masks.key_padding.data();
  t.alibi_slopes = masks.alibi_slopes.empty() ? nullptr : masks.alibi_slopes.data();
  t.out = out.data;
  t.out_layout = out.layout;
  t.weights = weights;
  return make_attention_args(shape, t, module_attention_options(config, options));
}

template AttentionArgs<float> module_attention_args<float>(const MultiheadAttentionConfig&, const ForwardPlan&,
                                                           const ForwardOptions<float>&, const Heads<float>&,
                                                           const KernelMasks<float>&, float*, float*);
template AttentionArgs<double> module_attention_args<double>(const MultiheadAttentionConfig&, const ForwardPlan&,
                                                             const ForwardOptions<double>&, const Heads<double>&,
                                                             const KernelMasks<double>&, double*, double*);

namespace {

// Step 4b. out_projection: output = concat · W^Oᵀ + b^O.
template <class T>
void out_projection(const FusedCall<T>& f, const ProjectionWeights<T>& wt, const T* concat, T* out) {
  const int64_t E = f.config.embed_dim;
  const Weight<T> w = f.paths.transposed ? Weight<T>{wt.out_proj_t.data(), E, true, E, E}
                                         : Weight<T>{f.params.out_proj_weight.data(), E, false, E, E};
  linear_forward<T>({f.plan.B * f.plan.L, concat, w.in}, w, f.config.bias ? f.params.out_proj_bias.data() : nullptr, out, E, {false, f.options.attention.num_threads});
}

// Mean over the selected heads: (B, H', L', S') -> (B, L', S'), PyTorch's
// sum(dim=1) / H when every head is selected.
template <class T>
Tensor<T> average_heads(const Tensor<T>& w, const ForwardPlan& plan, Shape shape) {
  Tensor<T> avg(std::move(shape), T(0));
  const int64_t H = plan.H_weights, plane = plan.L_weights * plan.S_total;
  for (int64_t b = 0; b < plan.B; ++b) {
    T* dst = avg.data() + b * plane;
    for (int64_t h = 0; h < H; ++h) {
      const T* src = w.data() + (b * H + h) * plane;
      for (int64_t x = 0; x < plane; ++x) dst[x] += src[x];
    }
    for (int64_t x = 0; x < plane; ++x) dst[x] /= static_cast<T>(H);
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

namespace detail {
namespace {

// Steps 1 to 4 into `result`, the scratch in f.ws; each attention row's
// log-sum-exp into `lse` when not null. Returns the heads as the kernel read
// them (views into f.ws). Both public forwards run exactly this, so the
// training forward's output is bit-identical to the plain one's.
template <class T>
Heads<T> fused_forward(const FusedCall<T>& f, const ProjectionWeights<T>& wt, T* lse, ForwardResult<T>& result) {
  const ForwardPlan& plan = f.plan;
  const ForwardOptions<T>& options = f.options;
  // 1. in_projection and 2. split_heads.
  const Heads<T> heads = f.paths.head_major ? in_projection_head_major(f) : in_projection_views(f);
  // 3. attention and 4a. merge_heads.
  T* concat = f.ws.take(f.ws.concat, static_cast<std::size_t>(plan.B * plan.L * plan.E));
  std::optional<Tensor<T>> weights = attend(f, heads, concat, lse);
  // 4b. out_projection into the result.
  const Shape out_shape = output_shape(plan, f.query.shape());
  if (result.output.shape() != out_shape) result.output = Tensor<T>(out_shape);
  out_projection(f, wt, concat, result.output.data());

  result.attn_weights.reset();
  if (options.need_weights) {
    Shape shape = attn_weights_shape(plan, options.average_attn_weights);
    if (options.average_attn_weights) {
      result.attn_weights = average_heads(*weights, plan, std::move(shape));
    } else {
      result.attn_weights = std::move(*weights).reshaped(std::move(shape));
    }
  }
  return heads;
}

// The weights the call will hold must fit: the selection when recomputed,
// else the kernel's full (B, H, L, S') (also what the materialized kernel
// holds per slice even without weights).
template <class T>
void check_weights_fit(const ForwardPlan& plan, std::size_t element_size, const ForwardOptions<T>& options,
                       AttentionKernel kernel) {
  if (weights_recomputed(options, kernel)) {
    check_weights_fit(plan, plan.H_weights, plan.L_weights, element_size);
  } else if (options.need_weights || options.attention.kernel == AttentionKernel::Materialized) {
    check_weights_fit(plan, plan.H, plan.L, element_size);
  }
}

}  // namespace
}  // namespace detail

template <class T>
void BasicMultiheadAttention<T>::forward(const Tensor<T>& query, const Tensor<T>& key,
                                         const Tensor<T>& value, const ForwardOptions<T>& options,
                                         ForwardResult<T>& result) const {
  using namespace detail;
  const ForwardPlan plan = plan_forward(config_, query, key, value, options);
  if (options.attention.check_finite) check_forward_finite(config_, query, key, value, params_, options);
  if (plan.B == 0 || plan.L == 0) {  // nothing to attend from: empty outputs, no work
    result = empty_result<T>(plan, query.shape(), options);
    return;
  }
  // The kernel and the masks, once for the whole call.
  const AttentionKernel kernel = resolve_forward_kernel<T>(options.attention.kernel, /*stores_weights=*/false);
  check_weights_fit(plan, sizeof(T), options, kernel);
  const KernelMasks<T> masks = build_kernel_masks(plan, options);
  WorkspaceLease<T> ws(*workspaces_);
  const PathChoice paths = choose_paths(config_, plan, options.paths, query, key, value);
  const FusedCall<T> f{config_, params_, plan, options, query, key, value,
                       in_weights(config_, params_, *weights_t_, paths.transposed), paths, *ws, kernel, masks};
  fused_forward(f, *weights_t_, static_cast<T*>(nullptr), result);
}

template <class T>
ForwardResult<T> BasicMultiheadAttention<T>::forward(const Tensor<T>& query, const Tensor<T>& key,
                                                     const Tensor<T>& value, const ForwardOptions<T>& options,
                                                     ForwardContext<T>& save_for_backward) const {
  using namespace detail;
  if (!save_for_backward.saved_) save_for_backward.saved_ = std::make_unique<SavedForward<T>>();  // moved from
  SavedForward<T>& s = *save_for_backward.saved_;
  s.filled = false;  // until this forward has succeeded (a failed call leaves no stale context)
  const ForwardPlan plan = plan_forward(config_, query, key, value, options);
  if (options.attention.check_finite) check_forward_finite(config_, query, key, value, params_, options);
  s.parameters_token = parameters_token_;
  s.plan = plan;
  s.options = options;
  // The backward reads s.masks (below), never the caller's masks: they need
  // not outlive this call.
  s.options.attn_mask = nullptr;
  s.options.key_padding_mask = nullptr;
  s.query_shape = query.shape();
  s.key_shape = key.shape();
  s.value_shape = value.shape();
  ForwardResult<T> result;
  if (plan.B == 0 || plan.L == 0) {  // nothing to attend from: the backward gives zeros
    result = empty_result<T>(plan, query.shape(), options);
    s.heads = {};
    s.filled = true;
    return result;
  }
  // The kernel, the masks and the paths, once: the backward reuses them.
  s.kernel = resolve_forward_kernel<T>(options.attention.kernel, /*stores_weights=*/false);
  check_weights_fit(plan, sizeof(T), options, s.kernel);
  s.masks = build_kernel_masks(plan, options);
  s.paths = choose_paths(config_, plan, options.paths, query, key, value);
  s.keep_inputs(query, key, value);
  T* lse = ForwardWorkspace<T>::take(s.lse, static_cast<std::size_t>(plan.B * plan.H * plan.L));
  const FusedCall<T> f{config_, params_, plan, options, query, key, value,
                       in_weights(config_, params_, *weights_t_, s.paths.transposed), s.paths, s.ws, s.kernel,
                       s.masks};
  s.heads = fused_forward(f, *weights_t_, lse, result);
  s.filled = true;
  return result;
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
template ForwardResult<float> BasicMultiheadAttention<float>::forward(const Tensor<float>&, const Tensor<float>&,
                                                                     const Tensor<float>&,
                                                                     const ForwardOptions<float>&,
                                                                     ForwardContext<float>&) const;
template ForwardResult<double> BasicMultiheadAttention<double>::forward(const Tensor<double>&,
                                                                       const Tensor<double>&,
                                                                       const Tensor<double>&,
                                                                       const ForwardOptions<double>&,
                                                                       ForwardContext<double>&) const;

}  // namespace multihead
