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
// It shares no arithmetic with the fused form (no BLAS, no split_heads), so
// the tests that make the two agree check one against the other.
//
// Legend: B batch, L query length, S key length, S' = S (+1 bias_k)
// (+1 zero attention), E embed_dim, H heads, D head width, Ek kdim, Ev vdim.
#include <cmath>

#include "attention/kernel.hpp"
#include "attention/mha_plan.hpp"
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

}  // namespace
}  // namespace detail

template <class T>
ForwardResult<T> BasicMultiheadAttention<T>::forward_textbook(const Tensor<T>& query,
                                                              const Tensor<T>& key,
                                                              const Tensor<T>& value,
                                                              const ForwardOptions<T>& options) const {
  using namespace detail;
  const ForwardPlan plan = plan_forward(config_, query, key, value, options);
  if (options.check_finite) check_forward_finite(query, key, value, params_);
  const int64_t B = plan.B, H = plan.H, L = plan.L, S = plan.S, St = plan.S_total, D = plan.D,
                E = plan.E;
  if (B == 0 || L == 0) return empty_result<T>(plan, query.shape(), options);
  check_weights_fit(plan, sizeof(T));  // the textbook form keeps every head's weights
  const KernelMasks<T> masks = build_kernel_masks(plan, options);
  const bool packed = config_.same_embed_dim();
  const T* Wq = packed ? params_.in_proj_weight.data() : params_.q_proj_weight.data();
  const T* Wk = packed ? params_.in_proj_weight.data() + E * E : params_.k_proj_weight.data();
  const T* Wv = packed ? params_.in_proj_weight.data() + 2 * E * E : params_.v_proj_weight.data();
  const T* bq = config_.bias ? params_.in_proj_bias.data() : nullptr;
  const T* bk = config_.bias ? params_.in_proj_bias.data() + E : nullptr;
  const T* bv = config_.bias ? params_.in_proj_bias.data() + 2 * E : nullptr;

  Tensor<T> concat({B * L, E});  // row b·L + l
  Tensor<T> weights_all({B, H, L, St}, T(0));
  std::vector<T> Qi(L * D), Ki(St * D), Vi(St * D), head(L * D), mask_i(L * St), w_i(L * St);

  for (int64_t b = 0; b < B; ++b) {
    auto q_row = [&](int64_t l) { return b * plan.q_batch_stride + l * plan.q_seq_stride; };
    auto kv_row = [&](int64_t s) { return b * plan.kv_batch_stride + s * plan.kv_seq_stride; };
    for (int64_t i = 0; i < H; ++i) {
      // Step 1: Q_i = Q W_i^Q, K_i = K W_i^K, V_i = V W_i^V (rows i·D … i·D+D−1).
      project_one_head(L, E, query.data(), q_row, Wq, bq, i * D, D, Qi.data());
      project_one_head(S, plan.Ek, key.data(), kv_row, Wk, bk, i * D, D, Ki.data());
      project_one_head(S, plan.Ev, value.data(), kv_row, Wv, bv, i * D, D, Vi.data());
      if (plan.bias_kv_col >= 0)
        for (int64_t d = 0; d < D; ++d) {
          Ki[plan.bias_kv_col * D + d] = params_.bias_k[i * D + d];
          Vi[plan.bias_kv_col * D + d] = params_.bias_v[i * D + d];
        }
      if (plan.zero_attn_col >= 0)
        for (int64_t d = 0; d < D; ++d) Ki[plan.zero_attn_col * D + d] = Vi[plan.zero_attn_col * D + d] = 0;

      // This head's mask: attn_mask (its own slice if 3-D) + key padding of batch b.
      for (int64_t l = 0; l < L; ++l)
        for (int64_t s = 0; s < St; ++s) {
          T m = 0;
          if (!masks.attn_mask.empty())
            m += masks.attn_mask[(b * H + i) * masks.attn_mask_slice_stride + l * St + s];
          if (!masks.key_padding.empty()) m += masks.key_padding[b * St + s];
          mask_i[l * St + s] = m;
        }

      // Step 2: head_i = softmax(Q_i K_iᵀ / √D + mask_i) V_i.
      AttentionArgs<T> a;
      a.slices = 1;
      a.q_len = L;
      a.kv_len = St;
      a.head_dim = D;
      a.value_dim = D;
      a.q = Qi.data();
      a.k = Ki.data();
      a.v = Vi.data();
      a.attn_mask = mask_i.data();
      a.is_causal = options.is_causal;
      a.causal_cols = S;
      a.scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
      a.dropout_p = options.training ? config_.dropout : 0.0;
      a.dropout_seed = options.dropout_seed;
      a.dropout_slice_offset = b * H + i;  // drop what the fused form drops
      a.masked_rows = options.masked_rows;
      a.num_threads = options.num_threads;
      a.out = head.data();
      a.weights = w_i.data();
      attention_forward(a, options.kernel == AttentionKernel::Flash ? AttentionKernel::Materialized
                                                                     : options.kernel);

      // Step 3: Concat(head_1, …, head_h): head i fills columns i·D … i·D+D−1.
      for (int64_t l = 0; l < L; ++l)
        for (int64_t d = 0; d < D; ++d) concat[(b * L + l) * E + i * D + d] = head[l * D + d];
      for (int64_t x = 0; x < L * St; ++x) weights_all[((b * H + i) * L) * St + x] = w_i[x];
    }
  }

  // Step 4: output = Concat(…) W^O + b^O, written back in the caller's layout.
  ForwardResult<T> result;
  result.output = Tensor<T>(output_shape(plan, query.shape()));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t l = 0; l < L; ++l) {
      const T* c = concat.data() + (b * L + l) * E;
      T* o = result.output.data() + (b * plan.q_batch_stride + l * plan.q_seq_stride) * E;
      for (int64_t e = 0; e < E; ++e) {
        T acc = config_.bias ? params_.out_proj_bias[e] : T(0);
        for (int64_t x = 0; x < E; ++x) acc += c[x] * params_.out_proj_weight[e * E + x];
        o[e] = acc;
      }
    }

  if (options.need_weights) {
    Shape shape = attn_weights_shape(plan, options.average_attn_weights);
    if (options.average_attn_weights) {
      Tensor<T> avg(std::move(shape), T(0));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t x = 0; x < L * St; ++x) {
          T sum = 0;
          for (int64_t i = 0; i < H; ++i) sum += weights_all[((b * H + i) * L) * St + x];
          avg[b * L * St + x] = sum / static_cast<T>(H);
        }
      result.attn_weights = std::move(avg);
    } else {
      result.attn_weights = std::move(weights_all).reshaped(std::move(shape));
    }
  }
  return result;
}

template ForwardResult<float> BasicMultiheadAttention<float>::forward_textbook(
    const Tensor<float>&, const Tensor<float>&, const Tensor<float>&, const ForwardOptions<float>&) const;
template ForwardResult<double> BasicMultiheadAttention<double>::forward_textbook(
    const Tensor<double>&, const Tensor<double>&, const Tensor<double>&,
    const ForwardOptions<double>&) const;

}  // namespace multihead
