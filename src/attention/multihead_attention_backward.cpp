// src/attention/multihead_attention_backward.cpp: the backward pass of the
// fused form (multihead_attention_forward.cpp), its steps in reverse:
//
//   4b. out_projection backward   output = concat W^Oᵀ + b^O
//   4a. merge_heads backward      a reshape: d_concat read through the same view
//   3.  scaled_dot_product_attention backward, through the kernel contract
//       (AttentionBackwardArgs, src/contract/attention_args.hpp): masks, causal
//       and its alignment, window, softcap, ALiBi and dropout (its keep
//       decisions regenerated from the forward's seed, no mask stored) are
//       the kernel's, from the same arguments the forward built
//       (module_attention_args)
//   2.  split_heads backward      a reshape for views; a gather for head-major
//       copies, where the extra key columns give d_bias_k / d_bias_v (the
//       zero-attention column carries no parameter)
//   1.  in_projection backward    Q = query W_qᵀ + b_q, K = …, V = …
//
// PyTorch computes the same gradients by autograd through
// multi_head_attention_forward (torch/nn/functional.py, 1.13); the tests
// compare against it (python/tests/test_gradients.py) and against central
// differences (tests/test_mha_backward.cpp).
//
// Legend: B batch, L query length, S key length, S' = S (+1 bias_k)
// (+1 zero attention), E embed_dim, H heads, D head width, Ek kdim, Ev vdim.
// "tokens" are rows of the caller's tensors in its own layout; the plan's
// strides locate token (b, l), as in the forward.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include <omp.h>

#include "attention/mha_plan.hpp"
#include "attention/multihead_attention_fused.hpp"
#include "attention/workspace.hpp"
#include "core/check.hpp"
#include "core/linear.hpp"
#include "core/parallel.hpp"
#include "kernels/kernel.hpp"
#include "multihead/error.hpp"
#include "multihead/multihead_attention.hpp"

namespace multihead {

template <class T>
ForwardContext<T>::ForwardContext() : saved_(std::make_unique<detail::SavedForward<T>>()) {}
template <class T>
ForwardContext<T>::~ForwardContext() = default;
template <class T>
ForwardContext<T>::ForwardContext(ForwardContext&&) noexcept = default;
template <class T>
ForwardContext<T>& ForwardContext<T>::operator=(ForwardContext&&) noexcept = default;

template <class T>
bool ForwardContext<T>::empty() const {
  return saved_ == nullptr || !saved_->filled;
}

template <class T>
std::size_t ForwardContext<T>::bytes() const {
  if (!saved_) return 0;
  const detail::SavedForward<T>& s = *saved_;
  const std::size_t n = s.ws.proj_q.capacity() + s.ws.proj_k.capacity() + s.ws.proj_v.capacity() +
                        s.ws.q.capacity() + s.ws.k.capacity() + s.ws.v.capacity() + s.ws.concat.capacity() +
                        s.lse.capacity() + static_cast<std::size_t>(s.saved_numel()) +
                        static_cast<std::size_t>(s.masks.attn_mask.numel() + s.masks.key_padding.numel()) +
                        s.masks.alibi_slopes.capacity();
  return n * sizeof(T);
}

template <class T>
void ForwardContext<T>::clear() {
  saved_ = std::make_unique<detail::SavedForward<T>>();
}

template class ForwardContext<float>;
template class ForwardContext<double>;

namespace detail {
namespace {

// The gradient of parameter `name`, of `shape`, in `g`'s map: its tensor is
// reused when it has the shape already.
template <class T>
T* gradient_slot(MultiheadAttentionGradients<T>& g, const std::string& name, const Shape& shape) {
  Tensor<T>& t = g.parameters[name];
  if (t.is_view() || t.shape() != shape) t = Tensor<T>(shape);
  return t.data();
}

template <class T>
T* input_gradient_slot(Tensor<T>& t, const Shape& shape) {
  if (t.is_view() || t.shape() != shape) t = Tensor<T>(shape);
  return t.data();
}

// Threads for this call's own loops, as the forward counts them.
int loop_threads(int num_threads) { return num_threads > 0 ? num_threads : omp_get_max_threads(); }

// Every gradient tensor of `g` at its shape, and no stale parameter names.
// Returns views of them under the parameters' own member names (d.bias_k is
// dℓ/d bias_k), so the steps below name a gradient as the forward names its
// parameter, and only the table (for_each_parameter) spells the names.
template <class T>
MultiheadAttentionParameters<T> shape_gradients(const MultiheadAttentionConfig& c, const SavedForward<T>& s,
                                                MultiheadAttentionGradients<T>& g) {
  std::map<std::string, Shape> shapes;
  for_each_parameter(c, [&](const ParameterInfo& info) {
    if (info.present) shapes.emplace(info.name, info.shape);
  });
  for (auto it = g.parameters.begin(); it != g.parameters.end();)
    it = shapes.count(it->first) ? std::next(it) : g.parameters.erase(it);
  MultiheadAttentionParameters<T> d;
  for_each_parameter(c, d, [&](const ParameterInfo& info, Tensor<T>& t) {
    if (info.present) t = Tensor<T>::view(info.shape, gradient_slot(g, info.name, info.shape));
  });
  input_gradient_slot(g.query, s.query_shape);
  input_gradient_slot(g.key, s.key_shape);
  input_gradient_slot(g.value, s.value_shape);
  return d;
}

// The gradients of the in-projection's outputs Q, K, V in token rows (the
// caller's layout), row stride ld: 3E when they are the column blocks of one
// packed (tokens × 3E) buffer, else E.
template <class T>
struct ProjectionGradients {
  const T *q, *k, *v;
  int64_t ld;
};

// One backward call: what every step reads.
template <class T>
struct BackwardCall {
  const MultiheadAttentionConfig& config;
  const MultiheadAttentionParameters<T>& params;
  const SavedForward<T>& saved;
  ForwardWorkspace<T>& ws;  // scratch, from the module's pool
  MultiheadAttentionGradients<T>& g;
  MultiheadAttentionParameters<T>& d;  // views of g.parameters (shape_gradients)
  int threads;  // for the loops and the linear layer's products below
};

// Step 4b backward. In the forward pass this was (out_projection):
//   linear_forward({B·L, concat, E}, W_O, b_O, out, E)   output = concat · W_Oᵀ + b_O
// so d_concat = d_output · W_O, dW_O = d_outputᵀ · concat, db_O = Σ_tokens d_output.
template <class T>
T* out_projection_backward(const BackwardCall<T>& c, const T* d_output) {
  const int64_t E = c.config.embed_dim, rows = c.saved.plan.B * c.saved.plan.L;
  T* d_concat = c.ws.take(c.ws.concat, static_cast<std::size_t>(rows * E));
  const T* W_O = c.params.out_proj_weight.data();  // (E out, E in), as nn.Linear stores it
  LinearGradients<T> d;
  d.d_x = d_concat;
  d.d_W = c.d.out_proj_weight.data();
  d.d_b = c.config.bias ? c.d.out_proj_bias.data() : nullptr;
  linear_backward<T>({rows, c.saved.concat(), E}, LinearWeight<T>::stored(W_O, E, E), d_output, E, d,
                     {false, c.threads});
  return d_concat;
}

// The heads' gradients as attention_backward_step wrote them: in the
// forward's layouts (views into token rows, or its head-major copies), or
// head-major [B][H][L | S][D] because the backward copied view heads first.
template <class T>
struct HeadGradients {
  Heads<T> d;
  bool head_major;
};

// Heads n = b·H + h of `src` (a view, `len` rows of D) into contiguous
// [B·H][len][D] at dst.
template <class T>
void copy_heads_contiguous(const ForwardPlan& plan, const HeadsView<const T>& src, int64_t len, T* dst,
                           int threads) {
  const int64_t H = plan.H, D = plan.D;
  const SliceLayout l = resolve_layout(src.layout, H, len, D);
  parallel_items(plan.B * H, threads, /*item_cost=*/len * D, [&](int64_t n) {
    const T* from = slice_start(src.data, l, n, H);
    for (int64_t r = 0; r < len; ++r) std::copy_n(from + r * l.row, D, dst + (n * len + r) * D);
  });
}

// Step 4a backward. In the forward pass this was (merge_heads):
//   merge_heads(concat, E, q_batch_stride, q_seq_stride, D)   head h of token (b, l) -> columns h·D …
// a reshape, so d_concat is read through the same view: module_attention_args
// builds d_out's layout exactly as it built the forward's out layout.
//
// Step 3 backward. In the forward pass this was (attend):
//   attention_forward(module_attention_args(config, plan, options, heads, masks, concat, weights), kernel)
// The backward kernel recomputes p_ij = exp(s_ij − lse_i) from the saved
// row log-sum-exps and writes d_q, d_k, d_v in the heads' layouts. Returns
// the gradients of Q, K and V in the heads' layouts (views or head-major).
template <class T>
HeadGradients<T> attention_backward_step(const BackwardCall<T>& c, T* d_concat) {
  const SavedForward<T>& s = c.saved;
  const ForwardPlan& plan = s.plan;
  const int64_t E = plan.E, q_rows = plan.B * plan.L, kv_rows = plan.B * plan.S;
  // View heads copied head-major for the flash kernel (kBackwardHeadMajorFromKeys);
  // the views path has no extra keys, so S' = S.
  const bool in_place = backward_reads_views();  // read (and checked) on every call
  const bool copy_heads =
      !in_place && !s.paths.head_major && s.kernel == AttentionKernel::Flash && plan.S >= kBackwardHeadMajorFromKeys;
  Heads<T> heads = s.heads;
  if (copy_heads) {
    const int64_t q_n = plan.B * plan.H * plan.L * plan.D, kv_n = plan.B * plan.H * plan.S * plan.D;
    T* copy = c.ws.take(c.ws.heads_copy, static_cast<std::size_t>(q_n + 2 * kv_n));
    copy_heads_contiguous(plan, s.heads.q, plan.L, copy, c.threads);
    copy_heads_contiguous(plan, s.heads.k, plan.S, copy + q_n, c.threads);
    copy_heads_contiguous(plan, s.heads.v, plan.S, copy + q_n + kv_n, c.threads);
    heads = {{copy, SliceLayout{}}, {copy + q_n, SliceLayout{}}, {copy + q_n + kv_n, SliceLayout{}}};
  }
  T *d_q, *d_k, *d_v;
  if (s.paths.head_major || copy_heads) {  // [B][H][L | S'][D], as the forward's copies
    d_q = c.ws.take(c.ws.q, static_cast<std::size_t>(plan.B * plan.H * plan.L * plan.D));
    d_k = c.ws.take(c.ws.k, static_cast<std::size_t>(plan.B * plan.H * plan.S_total * plan.D));
    d_v = c.ws.take(c.ws.v, static_cast<std::size_t>(plan.B * plan.H * plan.S_total * plan.D));
  } else if (s.paths.packed_self) {  // column blocks of one (tokens × 3E) buffer, as [Q K V] was
    d_q = c.ws.take(c.ws.proj_q, static_cast<std::size_t>(q_rows * 3 * E));
    d_k = d_q + E;
    d_v = d_q + 2 * E;
  } else {  // token rows × E each
    d_q = c.ws.take(c.ws.proj_q, static_cast<std::size_t>(q_rows * E));
    d_k = c.ws.take(c.ws.proj_k, static_cast<std::size_t>(kv_rows * E));
    d_v = c.ws.take(c.ws.proj_v, static_cast<std::size_t>(kv_rows * E));
  }
  AttentionBackwardArgs<T> b;
  // forward.out is the saved concat: the contract's delta_i = <d_out_i, out_i>;
  // the masks are the forward's own (saved.masks).
  b.forward = module_attention_args(c.config, plan, s.options, heads, s.masks, const_cast<T*>(s.concat()),
                                    static_cast<T*>(nullptr));
  b.lse = s.lse.data();
  b.d_out = d_concat;
  b.d_q = d_q;
  b.d_k = d_k;
  b.d_v = d_v;
  run_attention_backward(b, s.kernel);  // the kernel the forward ran
  return {{{d_q, heads.q.layout}, {d_k, heads.k.layout}, {d_v, heads.v.layout}}, s.paths.head_major || copy_heads};
}

// Head-major [b][h][0, len)[d] rows back into token rows: token (b, l) is
// row b·batch_stride + l·seq_stride of `dst` (row stride ld).
template <class T>
void gather_heads(const ForwardPlan& plan, const T* src, int64_t total_len, int64_t len, int64_t batch_stride,
                  int64_t seq_stride, T* dst, int64_t ld, int threads) {
  const int64_t H = plan.H, D = plan.D, slices = plan.B * H;
  parallel_items(slices, threads, /*item_cost=*/len * D, [&](int64_t n) {
    const int64_t b = n / H, h = n % H;
    for (int64_t l = 0; l < len; ++l)
      std::copy_n(src + (n * total_len + l) * D, D, dst + (b * batch_stride + l * seq_stride) * ld + h * D);
  });
}

// d_bias[h·D + d] = Σ_b d_heads[b][h][col][d]: bias_k (or bias_v) was the
// same key row for every batch entry.
template <class T>
void extra_key_gradient(const ForwardPlan& plan, const T* d_heads, int64_t col, T* d_bias) {
  const int64_t H = plan.H, D = plan.D, St = plan.S_total;
  std::fill_n(d_bias, H * D, T(0));
  for (int64_t b = 0; b < plan.B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) d_bias[h * D + d] += d_heads[((b * H + h) * St + col) * D + d];
}

// Step 2 backward. In the forward pass this was (split_heads):
//   views:      split_heads(qkv, 3E | E, batch_stride, seq_stride, D)   a reshape
//   head-major: scatter_heads(...) copies token rows into [b][h][l][d], then
//               append_extra_keys(...) sets key column S (bias_k / bias_v)
//               and the zero-attention column
// so the views' gradients already sit in token rows, and head-major ones are
// gathered back; the bias_k column's gradient is d_bias_k, the zero column's
// is dropped (a constant).
template <class T>
ProjectionGradients<T> split_heads_backward(const BackwardCall<T>& c, const HeadGradients<T>& grads) {
  const SavedForward<T>& s = c.saved;
  const ForwardPlan& plan = s.plan;
  const int64_t E = plan.E, q_rows = plan.B * plan.L, kv_rows = plan.B * plan.S;
  const Heads<T>& d_heads = grads.d;
  if (!grads.head_major)
    return {d_heads.q.data, d_heads.k.data, d_heads.v.data, s.paths.packed_self ? 3 * E : E};
  if (plan.bias_kv_col >= 0) {
    extra_key_gradient(plan, d_heads.k.data, plan.bias_kv_col, c.d.bias_k.data());
    extra_key_gradient(plan, d_heads.v.data, plan.bias_kv_col, c.d.bias_v.data());
  }
  T *q, *k, *v;
  int64_t ld;
  if (s.paths.packed_self) {  // one (tokens × 3E) buffer, for the one in_proj product
    ld = 3 * E;
    q = c.ws.take(c.ws.proj_q, static_cast<std::size_t>(q_rows * ld));
    k = q + E;
    v = q + 2 * E;
  } else {
    ld = E;
    q = c.ws.take(c.ws.proj_q, static_cast<std::size_t>(q_rows * E));
    k = c.ws.take(c.ws.proj_k, static_cast<std::size_t>(kv_rows * E));
    v = c.ws.take(c.ws.proj_v, static_cast<std::size_t>(kv_rows * E));
  }
  gather_heads(plan, d_heads.q.data, plan.L, plan.L, plan.q_batch_stride, plan.q_seq_stride, q, ld, c.threads);
  gather_heads(plan, d_heads.k.data, plan.S_total, plan.S, plan.kv_batch_stride, plan.kv_seq_stride, k, ld,
               c.threads);
  gather_heads(plan, d_heads.v.data, plan.S_total, plan.S, plan.kv_batch_stride, plan.kv_seq_stride, v, ld,
               c.threads);
  return {q, k, v, ld};
}

// Step 1 backward. In the forward pass this was (in_projection_views /
// in_projection_head_major):
//   packed self-attention:  linear_forward({tokens, x, E}, W_in, b_in, qkv, 3E) [Q K V] = x · W_inᵀ + b_in
//   otherwise:              linear_forward({tokens, query, E}, W_q, b_q, q, E), and so for K (key) and V (value)
// Each argument gets its own d_input (self-attention: the caller sums them).
template <class T>
void in_projection_backward(const BackwardCall<T>& c, const ProjectionGradients<T>& d) {
  const SavedForward<T>& s = c.saved;
  const ForwardPlan& plan = s.plan;
  const MultiheadAttentionConfig& cfg = c.config;
  const int64_t E = plan.E, Ek = plan.Ek, Ev = plan.Ev, q_rows = plan.B * plan.L, kv_rows = plan.B * plan.S;
  const bool packed = cfg.same_embed_dim();
  const T* W_q = packed ? c.params.in_proj_weight.data() : c.params.q_proj_weight.data();
  const T* W_k = packed ? W_q + E * E : c.params.k_proj_weight.data();
  const T* W_v = packed ? W_q + 2 * E * E : c.params.v_proj_weight.data();
  T* d_W_q = packed ? c.d.in_proj_weight.data() : c.d.q_proj_weight.data();
  T* d_W_k = packed ? d_W_q + E * E : c.d.k_proj_weight.data();
  T* d_W_v = packed ? d_W_q + 2 * E * E : c.d.v_proj_weight.data();
  T* d_b = cfg.bias ? c.d.in_proj_bias.data() : nullptr;
  // The packed product's weight gradient is one (3E × tokens)·(tokens × E)
  // product, as the forward's was one; the per-part products below then
  // skip theirs.
  const bool one_weight_product = s.paths.packed_self;
  const LinearOptions write{false, c.threads};
  if (one_weight_product)
    linear_backward<T>({q_rows, s.query.data(), E}, LinearWeight<T>::stored(W_q, 3 * E, E), d.q, 3 * E,
                       {nullptr, 0, d_W_q, nullptr}, write);
  // Each part: y = x · Wᵀ + b with W (E out, in) a block of rows of W_in (or
  // q/k/v_proj_weight), so d_x = d_y · W, d_W = d_yᵀ · x, d_b = Σ_rows d_y.
  const auto part = [&](int64_t rows, int64_t in, const T* x, const T* W, const T* d_y, T* d_x, T* d_W, T* d_bias) {
    linear_backward<T>({rows, x, in}, LinearWeight<T>::stored(W, E, in), d_y, d.ld,
                       {d_x, in, one_weight_product ? nullptr : d_W, d_bias}, write);
  };
  part(q_rows, E, s.query.data(), W_q, d.q, c.g.query.data(), d_W_q, d_b);
  part(kv_rows, Ek, s.saved_key().data(), W_k, d.k, c.g.key.data(), d_W_k, d_b ? d_b + E : nullptr);
  part(kv_rows, Ev, s.saved_value().data(), W_v, d.v, c.g.value.data(), d_W_v, d_b ? d_b + 2 * E : nullptr);
}

}  // namespace
}  // namespace detail

template <class T>
MultiheadAttentionGradients<T> BasicMultiheadAttention<T>::backward(const ForwardContext<T>& saved,
                                                                   const Tensor<T>& d_output) const {
  MultiheadAttentionGradients<T> g;
  backward(saved, d_output, g);
  return g;
}

template <class T>
void BasicMultiheadAttention<T>::backward(const ForwardContext<T>& saved, const Tensor<T>& d_output,
                                          MultiheadAttentionGradients<T>& g) const {
  using namespace detail;
  if (saved.empty())
    throw Error(Error::Kind::Value,
                "context: empty ForwardContext; fill it with forward(query, key, value, options, context) first");
  const SavedForward<T>& s = *saved.saved_;
  if (s.parameters_token != parameters_token_)
    throw Error(Error::Kind::Value,
                "context: this ForwardContext was filled by another module or before update_parameters(); "
                "run the forward again");
  const ForwardPlan& plan = s.plan;
  expect_shape("d_output", d_output.shape(), output_shape(plan, s.query_shape));
  if (s.options.attention.check_finite) check_finite("d_output", d_output);
  MultiheadAttentionParameters<T> d = shape_gradients(config_, s, g);
  if (plan.B == 0 || plan.L == 0) {  // the forward did no work: nothing depends on anything
    for (auto& [name, t] : g.parameters) std::fill_n(t.data(), t.numel(), T(0));
    for (Tensor<T>* t : {&g.query, &g.key, &g.value}) std::fill_n(t->data(), t->numel(), T(0));
    return;
  }
  WorkspaceLease<T> ws(*workspaces_);
  const BackwardCall<T> c{config_, params_, s, *ws, g, d, loop_threads(s.options.attention.num_threads)};
  T* d_concat = out_projection_backward(c, d_output.data());    // 4b
  const HeadGradients<T> d_heads = attention_backward_step(c, d_concat);  // 4a, 3
  const ProjectionGradients<T> d_proj = split_heads_backward(c, d_heads);  // 2
  in_projection_backward(c, d_proj);  // 1
}

template MultiheadAttentionGradients<float> BasicMultiheadAttention<float>::backward(
    const ForwardContext<float>&, const Tensor<float>&) const;
template MultiheadAttentionGradients<double> BasicMultiheadAttention<double>::backward(
    const ForwardContext<double>&, const Tensor<double>&) const;
template void BasicMultiheadAttention<float>::backward(const ForwardContext<float>&, const Tensor<float>&,
                                                      MultiheadAttentionGradients<float>&) const;
template void BasicMultiheadAttention<double>::backward(const ForwardContext<double>&, const Tensor<double>&,
                                                       MultiheadAttentionGradients<double>&) const;

}  // namespace multihead
