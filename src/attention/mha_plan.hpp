// src/attention/mha_plan.hpp: what both forms of multi-head attention share:
// validating a forward call and laying out its masks.
//
// Legend: B batch, L query length, S key length (as given), S' = S plus one
// column for bias_k and one for the zero-attention key when enabled,
// E embed_dim, H heads, D = E / H, Ek = kdim, Ev = vdim.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "multihead/multihead_attention.hpp"

namespace multihead::detail {

// The dimensions of one forward call, and how to find token (b, l) in the
// caller's layout: row index b·batch_stride + l·seq_stride of the (tokens, E)
// matrix that the input is in memory.
struct ForwardPlan {
  bool batched = true;
  int64_t B = 0, L = 0, S = 0, S_total = 0;  // S_total = S'
  int64_t E = 0, H = 0, D = 0, Ek = 0, Ev = 0;
  int64_t q_batch_stride = 0, q_seq_stride = 0;    // rows of query / output
  int64_t kv_batch_stride = 0, kv_seq_stride = 0;  // rows of key / value
  // Where the extra key columns sit (or -1 when absent).
  int64_t bias_kv_col = -1, zero_attn_col = -1;
  // How many heads and query rows of weights need_weights returns
  // (ForwardOptions::weights_heads, weights_rows): H' and L'.
  int64_t H_weights = 0, L_weights = 0;
};

// Checks shapes, dtypes of masks and options; throws multihead::Error naming
// the offending tensor with expected and actual shape. X: the inputs'
// storage (T, or 16-bit with float T: the narrow module).
template <class T, class X = T>
ForwardPlan plan_forward(const MultiheadAttentionConfig& config, const Tensor<X>& query,
                         const Tensor<X>& key, const Tensor<X>& value,
                         const ForwardOptions<T>& options);

// The attention step's options for this module: options.attention, with
// dropout at the module's rate when training.
template <class T>
AttentionOptions module_attention_options(const MultiheadAttentionConfig& config,
                                          const ForwardOptions<T>& options) {
  AttentionOptions o = options.attention;
  o.dropout_p = options.training ? config.dropout : 0.0;
  return o;
}

// The combined additive masks in kernel layout, padded with zero columns for
// bias_k and zero attention exactly as PyTorch pads them:
//  - attn_mask: (L, S') shared, or (B·H, L, S'); empty when absent
//  - key_padding: (B, S'); empty when absent
//  - alibi_slopes: (B·H), slice n = b·H + h gets head h's slope
//    alibi_slopes(H)[h]; empty unless ForwardOptions::alibi
template <class T>
struct KernelMasks {
  Tensor<T> attn_mask;
  int64_t attn_mask_slice_stride = 0;
  Tensor<T> key_padding;
  std::vector<T> alibi_slopes;
};

template <class T>
KernelMasks<T> build_kernel_masks(const ForwardPlan& plan, const ForwardOptions<T>& options);

// Rejects NaN/Inf in inputs and parameters (every row of the parameter
// table), and NaN/+inf in a float mask, when options.check_finite is on.
template <class T>
void check_forward_finite(const MultiheadAttentionConfig& config, const Tensor<T>& query, const Tensor<T>& key,
                          const Tensor<T>& value, const MultiheadAttentionParameters<T>& params,
                          const ForwardOptions<T>& options);

// Shape of the attention weights returned for this plan (the selected
// H' heads and L' rows).
Shape attn_weights_shape(const ForwardPlan& plan, bool average);

// Head h' of the selection: options.weights_heads[h'], or h' when empty;
// row i' likewise.
template <class T>
int64_t selected_head(const ForwardOptions<T>& options, int64_t h) {
  return options.weights_heads.empty() ? h : options.weights_heads[static_cast<std::size_t>(h)];
}
template <class T>
int64_t selected_row(const ForwardOptions<T>& options, int64_t i) {
  return options.weights_rows.empty() ? i : options.weights_rows[static_cast<std::size_t>(i)];
}

// The selected heads and rows of a kernel's full (B, H, L, S') weights:
// (B, H', L', S'); `full` itself when nothing is selected.
template <class T>
Tensor<T> select_weights(Tensor<T>&& full, const ForwardPlan& plan, const ForwardOptions<T>& options) {
  if (options.weights_heads.empty() && options.weights_rows.empty()) return std::move(full);
  Tensor<T> out(Shape{plan.B, plan.H_weights, plan.L_weights, plan.S_total});
  const int64_t St = plan.S_total;
  for (int64_t b = 0; b < plan.B; ++b)
    for (int64_t h = 0; h < plan.H_weights; ++h)
      for (int64_t i = 0; i < plan.L_weights; ++i) {
        const T* src = full.data() + ((b * plan.H + selected_head(options, h)) * plan.L + selected_row(options, i)) * St;
        std::copy(src, src + St, out.data() + ((b * plan.H_weights + h) * plan.L_weights + i) * St);
      }
  return out;
}
// Shape of the output: the query's shape with its last dimension = E.
Shape output_shape(const ForwardPlan& plan, const Shape& query_shape);

// Throws multihead::Error when (B, heads, rows, S') attention weights would
// not fit in this machine's physical memory: a refusal with numbers, instead
// of an allocation that fails late or drives the machine into swap. The
// caller says how many heads and rows it will hold: (H, L) for a kernel's
// full weights, (H', L') for the recomputed selection.
void check_weights_fit(const ForwardPlan& plan, int64_t heads, int64_t rows, std::size_t element_size);

// The result of a call with B = 0 or L = 0: empty tensors of the right
// shapes, computed without touching any (L, S)-sized buffer.
template <class T>
ForwardResult<T> empty_result(const ForwardPlan& plan, const Shape& query_shape,
                              const ForwardOptions<T>& options) {
  ForwardResult<T> r;
  r.output = Tensor<T>(output_shape(plan, query_shape));
  if (options.need_weights) r.attn_weights = Tensor<T>(attn_weights_shape(plan, options.average_attn_weights));
  return r;
}

// The flash backward reads K and V rows (and adds into the d_k, d_v rows)
// once per query tile; as views they sit a projection row apart (3E
// floats for packed self-attention), a stride that maps the rows of a key
// tile onto few cache sets (in_projection_head_major in
// multihead_attention_forward.cpp says the same of the forward) and defeats
// the prefetcher. With its five products per tile the backward gains more
// from contiguous heads than the forward, so the modules' backwards
// (multihead_attention_backward.cpp; the 16-bit module's, which widens
// straight into the copies) copy view heads head-major (O(L·E) copies
// against O(L²·E) work) from this many keys on and gather the gradients
// back. The arithmetic and its order do not depend on the layout: the same
// bits either way.
inline constexpr int64_t kBackwardHeadMajorFromKeys = 512;

// MULTIHEAD_BACKWARD_HEADS=views makes the backward read view heads in
// place as the forward did (no copies), "auto" or unset leaves the rule
// above; read on every call, as MULTIHEAD_FUSED_PATHS. Throws
// multihead::Error naming the variable for any other value.
bool backward_reads_views();

// The bf16 module's backward, where the flash backward runs bf16's pair way
// (flash_backward_reads_bf16, kernels/kernel.hpp), hands the kernel its
// saved bf16 operands themselves; MULTIHEAD_BF16_BACKWARD=copies makes it
// widen them into float32 copies first, as on other hosts (the same values,
// so the same bits: the reference way, for tests and timing); "auto" or
// unset leaves the rule. Read on every call; any other value throws
// multihead::Error naming the variable.
bool backward_widens_bf16();

// Throws multihead::Error naming MULTIHEAD_FUSED_PATHS if it holds neither
// auto nor plain (multihead_attention_forward.cpp; check_environment).
void check_fused_paths_environment();

}  // namespace multihead::detail
