// src/attention/scaled_dot_product_attention.cpp: the public single-head
// entry point, softmax(Q Kᵀ · scale + mask) V, over any leading dimensions.
//
// Legend: "..." leading dims flattened to N slices, L queries, S keys,
// D query/key width, Dv value width.
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "attention/attention_call.hpp"
#include "core/check.hpp"
#include "kernels/kernel.hpp"
#include "kernels/narrow_matmul.hpp"
#include "multihead/attention.hpp"
#include "multihead/error.hpp"
#include "multihead/narrow_multihead_attention.hpp"

namespace multihead {

namespace detail {
namespace {

// "..." followed by the given trailing dimensions.
Shape with_tail(const Shape& lead, int64_t a, int64_t b) {
  Shape s = lead;
  s.push_back(a);
  s.push_back(b);
  return s;
}

// The sizes of a call, checked: query (..., L, D), key (..., S, D),
// value (..., S, Dv).
struct SdpaDims {
  Shape lead;
  int64_t L, S, D, Dv;
};

template <class T>
SdpaDims check_dims(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value) {
  if (query.dim() < 2) fail_shape("query", "(..., L, D) with at least 2 dimensions", query.shape());
  const int64_t r = query.dim();
  SdpaDims d{Shape(query.shape().begin(), query.shape().end() - 2), query.size(-2), 0, query.size(-1), 0};
  // D = 0: no dot product to scale (1/√0 is infinite; PyTorch returns NaN),
  // so the kernels would disagree; refused.
  if (d.D == 0) fail_shape("query", "(..., L, D) with a head width D >= 1", query.shape());
  const std::string rank = " of rank " + std::to_string(r);
  if (key.dim() != r) fail_shape("key", "(..., S, " + std::to_string(d.D) + ")" + rank, key.shape());
  d.S = key.size(-2);
  expect_shape("key", key.shape(), with_tail(d.lead, d.S, d.D));
  if (value.dim() != r) fail_shape("value", "(..., " + std::to_string(d.S) + ", Dv)" + rank, value.shape());
  d.Dv = value.size(-1);
  expect_shape("value", value.shape(), with_tail(d.lead, d.S, d.Dv));
  return d;
}

// attn_mask as additive values, and its slice stride: (L, S) is shared by
// every slice (stride 0), (..., L, S) has one per slice.
template <class T>
int64_t check_mask(const SdpaDims& d, const Mask<T>& mask) {
  if (mask.shape() == Shape{d.L, d.S}) return 0;
  const Shape full = with_tail(d.lead, d.L, d.S);
  if (mask.shape() != full)
    fail_shape("attn_mask", shape_to_string({d.L, d.S}) + " or " + shape_to_string(full), mask.shape());
  return d.L * d.S;
}

// A call's kernel arguments (the forward's, which its backward reads too),
// for every storage type: E = T (float, double), or 16-bit E with float T
// (the caller then sets args.narrow): dims, mask (converted to additive
// into `additive`), slopes (into `slopes`), options validated;
// out/weights/lse are the caller's to set.
template <class T, class E>
AttentionArgs<T> sdpa_args(const Tensor<E>& query, const Tensor<E>& key, const Tensor<E>& value,
                           const Mask<T>* attn_mask, const AttentionOptions& options, const SdpaDims& d,
                           Tensor<T>& additive, std::vector<T>& slopes) {
  validate_attention_options(options);
  AttentionTensors<T> tensors;
  if (attn_mask) {
    tensors.attn_mask_slice_stride = check_mask(d, *attn_mask);
    additive = attn_mask->to_additive();
    tensors.attn_mask = additive.data();
  }
  if (options.check_finite) {
    check_finite("query", query);
    check_finite("key", key);
    check_finite("value", value);
    check_masks_finite<Mask<T>>(nullptr, attn_mask);
  }
  AttentionShape shape;
  shape.slices = shape_numel(d.lead);
  shape.q_len = d.L;
  shape.kv_len = shape.causal_cols = d.S;
  shape.head_dim = d.D;
  shape.value_dim = d.Dv;
  slopes.assign(options.alibi_slopes.begin(), options.alibi_slopes.end());
  if (!slopes.empty()) {
    if (static_cast<int64_t>(slopes.size()) != shape.slices)
      throw Error(Error::Kind::Shape, "alibi_slopes: expected one slope per slice, " +
                                          std::to_string(shape.slices) + " (the product of the leading dims), got " +
                                          std::to_string(slopes.size()));
    tensors.alibi_slopes = slopes.data();
  }
  if constexpr (std::is_same_v<T, E>) {
    tensors.q = query.data();
    tensors.k = key.data();
    tensors.v = value.data();
  }
  return make_attention_args(shape, tensors, options);
}

// The 16-bit forward: E storage, float arithmetic (the flash kernel widens).
template <class E>
Tensor<E> sdpa_narrow(const Tensor<E>& query, const Tensor<E>& key, const Tensor<E>& value,
                      const Mask<float>* attn_mask, const AttentionOptions& options, Tensor<float>* lse) {
  const SdpaDims d = check_dims(query, key, value);
  Tensor<float> additive;
  std::vector<float> slopes;
  AttentionArgs<float> args = sdpa_args<float, E>(query, key, value, attn_mask, options, d, additive, slopes);
  Tensor<E> out(with_tail(d.lead, d.L, d.Dv));
  Shape lse_shape = d.lead;
  lse_shape.push_back(d.L);
  if (lse) *lse = Tensor<float>(lse_shape);
  args.narrow = {compute_dtype_of<E>(), query.data(), key.data(), value.data(), out.data()};
  args.lse = lse ? lse->data() : nullptr;
  attention_forward(args, options.kernel);
  return out;
}

// The backward's output, lse and d_output against the forward's dims.
void check_backward_shapes(const SdpaDims& d, const Shape& output, const Shape& lse, const Shape& d_output) {
  expect_shape("output", output, with_tail(d.lead, d.L, d.Dv));
  Shape lse_shape = d.lead;
  lse_shape.push_back(d.L);
  expect_shape("lse", lse, lse_shape);
  expect_shape("d_output", d_output, with_tail(d.lead, d.L, d.Dv));
}

// The backward of both: `bf16_operands` (AttentionBackwardArgs) from the
// bf16 backward below, whose float32 operands hold bf16 values.
template <class T>
SdpaGradients<T> sdpa_backward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                               const Mask<T>* attn_mask, const AttentionOptions& options, const Tensor<T>& output,
                               const Tensor<T>& lse, const Tensor<T>& d_output, bool bf16_operands) {
  const SdpaDims d = check_dims(query, key, value);
  check_backward_shapes(d, output.shape(), lse.shape(), d_output.shape());
  Tensor<T> additive;
  std::vector<T> slopes;
  AttentionBackwardArgs<T> b;
  b.forward = sdpa_args(query, key, value, attn_mask, options, d, additive, slopes);
  b.forward.out = const_cast<T*>(output.data());  // read only (delta_i = <d_out_i, out_i>)
  SdpaGradients<T> g{Tensor<T>(query.shape()), Tensor<T>(key.shape()), Tensor<T>(value.shape())};
  b.lse = lse.data();
  b.d_out = d_output.data();
  b.d_q = g.query.data();
  b.d_k = g.key.data();
  b.d_v = g.value.data();
  b.bf16_operands = bf16_operands;
  // Any kernel's backward follows any kernel's forward (they share the
  // contract's lse and out): the one the forward would pick without weights.
  run_attention_backward(b, resolve_forward_kernel<T>(options.kernel, /*stores_weights=*/false));
  return g;
}

// The 16-bit backward: the float32 backward on exact float32 copies of the
// 16-bit operands, each gradient rounded once (attention.hpp).
template <class E>
SdpaGradients<E> sdpa_narrow_backward(const Tensor<E>& query, const Tensor<E>& key, const Tensor<E>& value,
                                      const Mask<float>* attn_mask, const AttentionOptions& options,
                                      const Tensor<E>& output, const Tensor<float>& lse, const Tensor<E>& d_output) {
  if (options.kernel != AttentionKernel::Auto && options.kernel != AttentionKernel::Flash)
    throw Error(Error::Kind::Value, "kernel: the " + to_string(compute_dtype_of<E>()) +
                                        " backward follows the flash forward (Auto or Flash), got " +
                                        to_string(options.kernel));
  AttentionOptions flash = options;
  flash.kernel = AttentionKernel::Flash;  // the kernel the 16-bit forward ran
  if constexpr (std::is_same_v<E, bfloat16>) {
    // Where the backward takes the matmul way (kernels/narrow_matmul.hpp),
    // it reads the bf16 operands in place: no float32 copies. The same
    // values, so the same bits as on the copies.
    const SdpaDims d = check_dims(query, key, value);
    check_backward_shapes(d, output.shape(), lse.shape(), d_output.shape());
    Tensor<float> additive;
    std::vector<float> slopes;
    AttentionBackwardArgs<float> b;
    b.forward = sdpa_args<float, E>(query, key, value, attn_mask, flash, d, additive, slopes);
    if (narrow_matmul_backward_serves_bf16(b.forward)) {
      b.forward.narrow = {ComputeDtype::BF16, query.data(), key.data(), value.data(), const_cast<E*>(output.data())};
      b.bf16_operands = true;
      b.d_out_bf16 = d_output.data();
      b.lse = lse.data();
      Tensor<float> dq(query.shape()), dk(key.shape()), dv(value.shape());
      b.d_q = dq.data();
      b.d_k = dk.data();
      b.d_v = dv.data();
      run_attention_backward(b, AttentionKernel::Flash);
      return {round_to<E>(dq), round_to<E>(dk), round_to<E>(dv)};
    }
  }
  const SdpaGradients<float> g =
      sdpa_backward<float>(widen<float>(query), widen<float>(key), widen<float>(value), attn_mask, flash,
                           widen<float>(output), lse, widen<float>(d_output), std::is_same_v<E, bfloat16>);
  return {round_to<E>(g.query), round_to<E>(g.key), round_to<E>(g.value)};
}

}  // namespace
}  // namespace detail

template <class T>
Tensor<T> scaled_dot_product_attention(const Tensor<T>& query, const Tensor<T>& key,
                                       const Tensor<T>& value,
                                       const std::type_identity_t<Mask<T>>* attn_mask,
                                       const AttentionOptions& options, Tensor<T>* attn_weights, Tensor<T>* lse) {
  const detail::SdpaDims d = detail::check_dims(query, key, value);
  Tensor<T> additive;
  std::vector<T> slopes;
  detail::AttentionArgs<T> args = detail::sdpa_args(query, key, value, attn_mask, options, d, additive, slopes);
  Tensor<T> out(detail::with_tail(d.lead, d.L, d.Dv));
  if (attn_weights) *attn_weights = Tensor<T>(detail::with_tail(d.lead, d.L, d.S));
  Shape lse_shape = d.lead;
  lse_shape.push_back(d.L);
  if (lse) *lse = Tensor<T>(lse_shape);
  args.out = out.data();
  args.weights = attn_weights ? attn_weights->data() : nullptr;
  args.lse = lse ? lse->data() : nullptr;
  detail::attention_forward(args, options.kernel);
  return out;
}

Tensor<bfloat16> scaled_dot_product_attention(const Tensor<bfloat16>& query, const Tensor<bfloat16>& key,
                                              const Tensor<bfloat16>& value, const Mask<float>* attn_mask,
                                              const AttentionOptions& options, Tensor<float>* lse) {
  return detail::sdpa_narrow(query, key, value, attn_mask, options, lse);
}

Tensor<float16> scaled_dot_product_attention(const Tensor<float16>& query, const Tensor<float16>& key,
                                             const Tensor<float16>& value, const Mask<float>* attn_mask,
                                             const AttentionOptions& options, Tensor<float>* lse) {
  return detail::sdpa_narrow(query, key, value, attn_mask, options, lse);
}

SdpaGradients<bfloat16> scaled_dot_product_attention_backward(
    const Tensor<bfloat16>& query, const Tensor<bfloat16>& key, const Tensor<bfloat16>& value,
    const Mask<float>* attn_mask, const AttentionOptions& options, const Tensor<bfloat16>& output,
    const Tensor<float>& lse, const Tensor<bfloat16>& d_output) {
  return detail::sdpa_narrow_backward(query, key, value, attn_mask, options, output, lse, d_output);
}

SdpaGradients<float16> scaled_dot_product_attention_backward(
    const Tensor<float16>& query, const Tensor<float16>& key, const Tensor<float16>& value,
    const Mask<float>* attn_mask, const AttentionOptions& options, const Tensor<float16>& output,
    const Tensor<float>& lse, const Tensor<float16>& d_output) {
  return detail::sdpa_narrow_backward(query, key, value, attn_mask, options, output, lse, d_output);
}

template <class T>
SdpaGradients<T> scaled_dot_product_attention_backward(const Tensor<T>& query, const Tensor<T>& key,
                                                       const Tensor<T>& value,
                                                       const std::type_identity_t<Mask<T>>* attn_mask,
                                                       const AttentionOptions& options, const Tensor<T>& output,
                                                       const Tensor<T>& lse, const Tensor<T>& d_output) {
  return detail::sdpa_backward(query, key, value, attn_mask, options, output, lse, d_output, /*bf16_operands=*/false);
}

#define MULTIHEAD_SDPA_INSTANTIATE(T)                                                                            \
  template Tensor<T> scaled_dot_product_attention<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,      \
                                                     const Mask<T>*, const AttentionOptions&, Tensor<T>*,       \
                                                     Tensor<T>*);                                               \
  template SdpaGradients<T> scaled_dot_product_attention_backward<T>(                                           \
      const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, const Mask<T>*, const AttentionOptions&,            \
      const Tensor<T>&, const Tensor<T>&, const Tensor<T>&);
MULTIHEAD_SDPA_INSTANTIATE(float)
MULTIHEAD_SDPA_INSTANTIATE(double)
#undef MULTIHEAD_SDPA_INSTANTIATE

}  // namespace multihead
