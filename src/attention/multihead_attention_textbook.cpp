// src/attention/multihead_attention_textbook.cpp: multi-head attention as the
// lesson writes it, one head at a time.
//
//   head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)          i = 1 … h
//   MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O
//
// Step 1: per-head projections with the slices W_i^Q, W_i^K, W_i^V (rows
//         i·D … (i+1)·D − 1 of the packed weights), as plain loops.
// Step 2: scaled dot-product attention for each head, independently.
// Step 3: concatenate the head outputs.
// Step 4: the final linear projection W^O.
//
// What it shares with the fused form, and what it does not.
//  - It shares the planning (src/attention/mha_plan.*, attention_call.*):
//    plan_forward's validation (and check_forward_finite,
//    check_weights_fit), B, L, S and the strides that find token
//    (b, l) for batch_first, seq-first and unbatched input; S' and the
//    columns of bias_k and the zero-attention key; build_kernel_masks (a
//    bool mask to -inf by Mask::to_additive, attn_mask (L, S') or
//    (B·H, L, S'), key_padding_mask (B, S'), both padded with zero columns
//    for the extra keys, and the ALiBi slope per slice); the default scale
//    1/√D, causal masking of the S given keys only, the dropout rate and
//    its slice numbering (make_attention_args, module_attention_options);
//    the weights' selection (select_weights), their shapes and the
//    unbatched squeeze (attn_weights_shape, output_shape, empty_result).
//    It also shares the score rule (src/contract/score_rule.hpp: the order of
//    the masks, causal and window visibility, the fully-masked-row fill,
//    dropout's decisions), which every kernel obeys. An error in any of
//    these would show in both forms alike, so the tests that make the two
//    forms agree cannot see it. tests/oracle/test_mha_oracle.cpp holds both
//    forms to an oracle with its own strides, mask expansion and padding,
//    scale, causal rule, fully-masked-row fill and weights (average and
//    selection) (tests/oracle/mha_oracle.hpp); ALiBi, the window, the soft
//    cap and dropout it does not model (tests/cli/variants.py and
//    tests/test_score_rule.cpp check those against float64 formulas).
//  - It shares no arithmetic with the fused form: the projections, the
//    extra keys, the concatenation, W^O and the mean over heads are plain
//    loops here, and step 2 runs the reference kernel's plain loops
//    (attention_forward_reference) whatever options.attention.kernel, the
//    kernel_force() switch or MULTIHEAD_KERNEL ask; no BLAS, no SIMD, no
//    split_heads. The tests that make the two forms agree therefore check
//    the fused form's products, reshapes and every kernel against an
//    independent computation of the same plan (with kernel = Reference the
//    fused form's step 3 is this same reference kernel, so that pairing
//    checks its projections and reshapes only), and tests/CMakeLists.txt
//    builds this form into a test binary that links neither BLAS nor the
//    SIMD code, to keep it so.
//
// Legend: B batch, L query length, S key length, S' = S (+1 bias_k)
// (+1 zero attention), E embed_dim, H heads, D head width, Ek kdim, Ev vdim.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention/attention_call.hpp"
#include "attention/mha_plan.hpp"
#include "kernels/kernel.hpp"
#include "multihead/multihead_attention.hpp"

namespace multihead {
namespace detail {
namespace {

// y (rows × D) = x (rows × in) · W_iᵀ + b_i, where W_i is rows [r0, r0 + D)
// of a weight stored (out × in), and x's rows are found through `row_of`.
template <class T, class RowOf>
void project_one_head(int64_t rows, int64_t in, const T* x, RowOf row_of, const T* W, const T* bias,
                      int64_t r0, int64_t D, T* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + row_of(r) * in;
    for (int64_t d = 0; d < D; ++d) {
      T acc = bias ? bias[r0 + d] : T(0);
      const T* w = W + (r0 + d) * in;
      for (int64_t e = 0; e < in; ++e) acc += xr[e] * w[e];
      y[r * D + d] = acc;
    }
  }
}

// One head's inputs and outputs: Q_i (L × D), K_i and V_i (S' × D), the
// head's output (L × D) and attention weights (L × S').
template <class T>
struct HeadBuffers {
  std::vector<T> q, k, v, out, weights;
};

// Step 1 for slice n = b·H + i (head i of batch entry b): Q_i = Q W_i^Q,
// K_i = K W_i^K, V_i = V W_i^V (rows i·D … i·D+D−1), then the extra key
// positions.
template <class T>
void project_head(const MultiheadAttentionConfig& c, const MultiheadAttentionParameters<T>& p,
                  const ForwardPlan& plan, const Tensor<T>* qkv[3], int64_t n, HeadBuffers<T>& h) {
  const int64_t E = plan.E, D = plan.D, b = n / plan.H, i = n % plan.H;
  const bool packed = c.same_embed_dim();
  const T* Wq = packed ? p.in_proj_weight.data() : p.q_proj_weight.data();
  const T* Wk = packed ? p.in_proj_weight.data() + E * E : p.k_proj_weight.data();
  const T* Wv = packed ? p.in_proj_weight.data() + 2 * E * E : p.v_proj_weight.data();
  const T* bias = c.bias ? p.in_proj_bias.data() : nullptr;
  auto q_row = [&](int64_t l) { return b * plan.q_batch_stride + l * plan.q_seq_stride; };
  auto kv_row = [&](int64_t s) { return b * plan.kv_batch_stride + s * plan.kv_seq_stride; };
  project_one_head(plan.L, E, qkv[0]->data(), q_row, Wq, bias, i * D, D, h.q.data());
  project_one_head(plan.S, plan.Ek, qkv[1]->data(), kv_row, Wk, bias ? bias + E : nullptr, i * D, D, h.k.data());
  project_one_head(plan.S, plan.Ev, qkv[2]->data(), kv_row, Wv, bias ? bias + 2 * E : nullptr, i * D, D,
                   h.v.data());
  if (plan.bias_kv_col >= 0)
    for (int64_t d = 0; d < D; ++d) {
      h.k[plan.bias_kv_col * D + d] = p.bias_k[i * D + d];
      h.v[plan.bias_kv_col * D + d] = p.bias_v[i * D + d];
    }
  if (plan.zero_attn_col >= 0)
    for (int64_t d = 0; d < D; ++d) h.k[plan.zero_attn_col * D + d] = h.v[plan.zero_attn_col * D + d] = 0;
}

// Step 2 for slice n = b·H + i: head_i = softmax(Q_i K_iᵀ / √D + masks) V_i,
// by the reference kernel.
template <class T>
void attend_one_head(const ForwardPlan& plan, const KernelMasks<T>& masks, const AttentionOptions& o, int64_t n,
                     HeadBuffers<T>& h) {
  const int64_t b = n / plan.H;
  AttentionShape shape;
  shape.slices = 1;
  shape.q_len = plan.L;
  shape.kv_len = plan.S_total;
  shape.head_dim = shape.value_dim = plan.D;
  shape.causal_cols = plan.S;
  shape.first_slice = n;  // drop what the fused form drops
  AttentionTensors<T> t;
  t.q = h.q.data();
  t.k = h.k.data();
  t.v = h.v.data();
  if (!masks.attn_mask.empty()) t.attn_mask = masks.attn_mask.data() + n * masks.attn_mask_slice_stride;
  if (!masks.key_padding.empty()) t.key_padding = masks.key_padding.data() + b * plan.S_total;
  if (!masks.alibi_slopes.empty()) t.alibi_slopes = masks.alibi_slopes.data() + n;
  t.out = h.out.data();
  t.weights = h.weights.data();
  attention_forward_reference(make_attention_args(shape, t, o));
}

// Step 4: output = Concat(…) W^O + b^O, written back in the caller's layout.
template <class T>
void out_project(const MultiheadAttentionConfig& c, const MultiheadAttentionParameters<T>& p,
                 const ForwardPlan& plan, const Tensor<T>& concat, T* output) {
  const int64_t E = plan.E;
  for (int64_t b = 0; b < plan.B; ++b)
    for (int64_t l = 0; l < plan.L; ++l) {
      const T* row = concat.data() + (b * plan.L + l) * E;
      T* o = output + (b * plan.q_batch_stride + l * plan.q_seq_stride) * E;
      for (int64_t e = 0; e < E; ++e) {
        T acc = c.bias ? p.out_proj_bias[e] : T(0);
        for (int64_t x = 0; x < E; ++x) acc += row[x] * p.out_proj_weight[e * E + x];
        o[e] = acc;
      }
    }
}

// Mean over heads, (B, H, L, S') -> (B, L, S').
// The mean over the H' selected heads of (B, H', L', S') weights.
template <class T>
Tensor<T> mean_over_heads(const ForwardPlan& plan, const Tensor<T>& weights_all, Shape shape) {
  const int64_t H = plan.H_weights, plane = plan.L_weights * plan.S_total;
  Tensor<T> avg(std::move(shape), T(0));
  for (int64_t b = 0; b < plan.B; ++b)
    for (int64_t x = 0; x < plane; ++x) {
      T sum = 0;
      for (int64_t i = 0; i < H; ++i) sum += weights_all[(b * H + i) * plane + x];
      avg[b * plane + x] = sum / static_cast<T>(H);
    }
  return avg;
}

}  // namespace
}  // namespace detail

template <class T>
ForwardResult<T> BasicMultiheadAttention<T>::forward_textbook(const Tensor<T>& query,
                                                              const Tensor<T>& key,
                                                              const Tensor<T>& value,
                                                              const ForwardOptions<T>& options) const {
  using namespace detail;
  const ForwardPlan plan = plan_forward(config_, query, key, value, options);
  if (options.attention.check_finite) check_forward_finite(config_, query, key, value, params_, options);
  const int64_t B = plan.B, H = plan.H, L = plan.L, St = plan.S_total, D = plan.D, E = plan.E;
  if (B == 0 || L == 0) return empty_result<T>(plan, query.shape(), options);
  check_weights_fit(plan, plan.H, plan.L, sizeof(T));  // the textbook form keeps every head's weights
  const KernelMasks<T> masks = build_kernel_masks(plan, options);
  const AttentionOptions o = module_attention_options(config_, options);
  const Tensor<T>* qkv[3] = {&query, &key, &value};

  Tensor<T> concat({B * L, E});  // row b·L + l
  Tensor<T> weights_all({B, H, L, St}, T(0));
  HeadBuffers<T> h{std::vector<T>(L * D), std::vector<T>(St * D), std::vector<T>(St * D),
                   std::vector<T>(L * D), std::vector<T>(L * St)};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < H; ++i) {
      project_head(config_, params_, plan, qkv, b * H + i, h);  // step 1
      attend_one_head(plan, masks, o, b * H + i, h);               // step 2
      // Step 3: Concat(head_1, …, head_h): head i fills columns i·D … i·D+D−1.
      for (int64_t l = 0; l < L; ++l)
        for (int64_t d = 0; d < D; ++d) concat[(b * L + l) * E + i * D + d] = h.out[l * D + d];
      std::copy(h.weights.begin(), h.weights.end(), weights_all.data() + (b * H + i) * L * St);
    }

  ForwardResult<T> result;
  result.output = Tensor<T>(output_shape(plan, query.shape()));
  out_project(config_, params_, plan, concat, result.output.data());  // step 4
  if (options.need_weights) {
    Shape shape = attn_weights_shape(plan, options.average_attn_weights);
    Tensor<T> selected = select_weights(std::move(weights_all), plan, options);
    result.attn_weights = options.average_attn_weights ? mean_over_heads(plan, selected, std::move(shape))
                                                       : std::move(selected).reshaped(std::move(shape));
  }
  return result;
}

template ForwardResult<float> BasicMultiheadAttention<float>::forward_textbook(
    const Tensor<float>&, const Tensor<float>&, const Tensor<float>&, const ForwardOptions<float>&) const;
template ForwardResult<double> BasicMultiheadAttention<double>::forward_textbook(
    const Tensor<double>&, const Tensor<double>&, const Tensor<double>&,
    const ForwardOptions<double>&) const;

}  // namespace multihead
