// src/train/mixed_precision.cpp: train/mixed_precision.hpp.
#include "train/mixed_precision.hpp"

#include <type_traits>
#include <vector>

#include "core/linear.hpp"
#include "multihead/error.hpp"
#include "multihead/narrow_grouped_query_attention.hpp"
#include "multihead/narrow_multihead_attention.hpp"

namespace multihead::train {
namespace {

using detail::LinearRows;
using detail::LinearWeight;

[[noreturn]] void refuse_double(ComputeDtype dtype) {
  throw Error(Error::Kind::Value, "compute dtype: " + to_string(dtype) +
                                      " needs float32 storage (a float64 model computes in float64), got float64");
}

template <class E, class T>
std::vector<E> rounded(const T* x, int64_t count) {
  std::vector<E> out(static_cast<std::size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[static_cast<std::size_t>(i)] = narrow_from_float<E>(x[i]);
  return out;
}

// The master parameters rounded to E as they are (round_to without a name):
// in training a master weight beyond float16's range becomes inf, the loss
// becomes non-finite, and the run stops with "training diverged" (or f16's
// loss scaler skips the step), rather than the refusal the modules'
// rounded() gives a loaded checkpoint.
template <class E, class Config, class Parameters>
auto rounded_parameters(const Config& config, const Parameters& master) {
  using Narrow = std::conditional_t<std::is_same_v<Parameters, MultiheadAttentionParameters<float>>,
                                    MultiheadAttentionParameters<E>, GroupedQueryAttentionParameters<E>>;
  Narrow out;
  for_each_parameter(config, out, master, [](const ParameterInfo& info, Tensor<E>& to, const Tensor<float>& from) {
    if (info.present) to = round_to<E>(from);
  });
  return out;
}

template <class E>
void narrow_forward(int64_t rows, const float* x, const float* W, int64_t out, int64_t in, const float* b, float* y,
                    int threads) {
  const std::vector<E> x16 = rounded<E>(x, rows * in), w16 = rounded<E>(W, out * in);
  const std::vector<E> b16 = b != nullptr ? rounded<E>(b, out) : std::vector<E>();
  std::vector<E> y16(static_cast<std::size_t>(rows * out));
  detail::linear_forward<E>({rows, x16.data(), in}, LinearWeight<E>::stored(w16.data(), out, in),
                            b != nullptr ? b16.data() : nullptr, y16.data(), out, {false, threads});
  for (int64_t i = 0; i < rows * out; ++i) y[i] = to_float(y16[static_cast<std::size_t>(i)]);
}

template <class E>
void narrow_backward(int64_t rows, const float* x, const float* W, int64_t out, int64_t in, const float* d_y,
                     float* d_x, float* d_W, float* d_b, int threads) {
  const std::vector<E> x16 = rounded<E>(x, rows * in), w16 = rounded<E>(W, out * in), dy16 = rounded<E>(d_y, rows * out);
  std::vector<E> dx16(d_x != nullptr ? static_cast<std::size_t>(rows * in) : 0);
  std::vector<E> dw16(d_W != nullptr ? static_cast<std::size_t>(out * in) : 0);
  std::vector<E> db16(d_b != nullptr ? static_cast<std::size_t>(out) : 0);
  detail::LinearGradients<E> g;
  g.d_x = d_x != nullptr ? dx16.data() : nullptr;
  g.d_W = d_W != nullptr ? dw16.data() : nullptr;
  g.d_b = d_b != nullptr ? db16.data() : nullptr;
  detail::linear_backward<E>({rows, x16.data(), in}, LinearWeight<E>::stored(w16.data(), out, in), dy16.data(), out,
                             g, {false, threads});
  // The cast's backward: each 16-bit gradient widened (exact) and added.
  for (std::size_t i = 0; i < dx16.size(); ++i) d_x[i] += to_float(dx16[i]);
  for (std::size_t i = 0; i < dw16.size(); ++i) d_W[i] += to_float(dw16[i]);
  for (std::size_t i = 0; i < db16.size(); ++i) d_b[i] += to_float(db16[i]);
}

template <class E>
Tensor<float> widened(const Tensor<E>& t) {
  return widen<float>(t);
}

// The block's attention as the 16-bit module (multihead/narrow_multihead_attention.hpp):
// the master parameters rounded once per pass, the input rounded, the
// output and every gradient the module's own 16-bit values.
template <class E>
class NarrowAttentionOf final : public NarrowBlockAttention {
 public:
  explicit NarrowAttentionOf(const BasicMultiheadAttention<float>& master)
      : module_(master.config(), rounded_parameters<E>(master.config(), master.parameters())) {}

  Tensor<float> forward(const Tensor<float>& a, const ForwardOptions<float>& options) override {
    const Tensor<E> a16 = round_to<E>(a);
    // Self-attention: one tensor as query, key and value.
    return widened(module_.forward(a16, a16, a16, options, context_));
  }

  Gradients backward(const Tensor<float>& d_output) override {
    // forward: out = attn(a, a, a)  =>  d_a = d_query + d_key + d_value, each widened, summed in float32
    const MultiheadAttentionGradients<E> g = module_.backward(context_, round_to<E>(d_output));
    Gradients out;
    out.d_a = Tensor<float>(g.query.shape());
    for (int64_t k = 0; k < out.d_a.numel(); ++k)
      out.d_a[k] = to_float(g.query[k]) + to_float(g.key[k]) + to_float(g.value[k]);
    for (const auto& [name, t] : g.parameters) out.parameters[name] = widened(t);
    return out;
  }

 private:
  NarrowMultiheadAttention<E> module_;
  NarrowForwardContext<E> context_;
};

// The RoPE block's attention as the 16-bit grouped-query module, as
// NarrowAttentionOf: the master parameters rounded once per pass, the input
// rounded, the output and every gradient the module's own 16-bit values.
// Its x is the block's one input, so d_a is the module's d_x as it is (one
// rounding of the sum over the three in-projections: the header's step).
template <class E>
class NarrowGroupedQueryOf final : public NarrowBlockAttention {
 public:
  NarrowGroupedQueryOf(const GroupedQueryAttention<float>& master, double dropout)
      : module_(master.config(), rounded_parameters<E>(master.config(), master.parameters())), dropout_(dropout) {}

  Tensor<float> forward(const Tensor<float>& a, const ForwardOptions<float>& options) override {
    // ForwardOptions is MultiheadAttention's: its fields without a
    // grouped-query counterpart here are refused rather than dropped.
    if (options.alibi || options.need_weights || options.key_padding_mask != nullptr ||
        options.attn_mask != nullptr || options.attention.dropout_p != 0)
      throw Error(Error::Kind::Value,
                  "16-bit grouped-query block: expected no alibi, masks, need_weights or attention.dropout_p "
                  "(dropout is the block's rate, when training)");
    AttentionOptions ao = options.attention;
    if (options.training) ao.dropout_p = dropout_;
    return widened(module_.forward(round_to<E>(a), ao, context_));
  }

  Gradients backward(const Tensor<float>& d_output) override {
    const GroupedQueryAttentionGradients<E> g = module_.backward(context_, round_to<E>(d_output));
    Gradients out;
    out.d_a = widened(g.x);
    for (const auto& [name, t] : g.parameters) out.parameters[name] = widened(t);
    return out;
  }

 private:
  NarrowGroupedQueryAttention<E> module_;
  double dropout_;
  NarrowGroupedQueryForwardContext<E> context_;
};

}  // namespace

template <class T>
void linear_forward_at(ComputeDtype dtype, int64_t rows, const T* x, const T* W, int64_t out, int64_t in, const T* b,
                       T* y, int threads) {
  if (dtype == ComputeDtype::F32) {
    detail::linear_forward<T>({rows, x, in}, LinearWeight<T>::stored(W, out, in), b, y, out, {false, threads});
    return;
  }
  if constexpr (!std::is_same_v<T, float>) {
    refuse_double(dtype);
  } else if (dtype == ComputeDtype::BF16) {
    narrow_forward<bfloat16>(rows, x, W, out, in, b, y, threads);
  } else {
    narrow_forward<float16>(rows, x, W, out, in, b, y, threads);
  }
}

template <class T>
void linear_backward_at(ComputeDtype dtype, int64_t rows, const T* x, const T* W, int64_t out, int64_t in,
                        const T* d_y, T* d_x, T* d_W, T* d_b, int threads) {
  if (dtype == ComputeDtype::F32) {
    detail::linear_backward<T>({rows, x, in}, LinearWeight<T>::stored(W, out, in), d_y, out, {d_x, in, d_W, d_b},
                               {true, threads});
    return;
  }
  if constexpr (!std::is_same_v<T, float>) {
    refuse_double(dtype);
  } else if (dtype == ComputeDtype::BF16) {
    narrow_backward<bfloat16>(rows, x, W, out, in, d_y, d_x, d_W, d_b, threads);
  } else {
    narrow_backward<float16>(rows, x, W, out, in, d_y, d_x, d_W, d_b, threads);
  }
}

std::unique_ptr<NarrowBlockAttention> make_narrow_block_attention(ComputeDtype dtype,
                                                                  const BasicMultiheadAttention<float>& master) {
  if (dtype == ComputeDtype::BF16) return std::make_unique<NarrowAttentionOf<bfloat16>>(master);
  if (dtype == ComputeDtype::F16) return std::make_unique<NarrowAttentionOf<float16>>(master);
  throw Error(Error::Kind::Value, "make_narrow_block_attention: expected bf16 or f16, got " + to_string(dtype));
}

std::unique_ptr<NarrowBlockAttention> make_narrow_block_attention(ComputeDtype dtype,
                                                                  const GroupedQueryAttention<float>& master,
                                                                  double dropout) {
  if (dtype == ComputeDtype::BF16) return std::make_unique<NarrowGroupedQueryOf<bfloat16>>(master, dropout);
  if (dtype == ComputeDtype::F16) return std::make_unique<NarrowGroupedQueryOf<float16>>(master, dropout);
  throw Error(Error::Kind::Value, "make_narrow_block_attention: expected bf16 or f16, got " + to_string(dtype));
}

template void linear_forward_at<float>(ComputeDtype, int64_t, const float*, const float*, int64_t, int64_t,
                                       const float*, float*, int);
template void linear_forward_at<double>(ComputeDtype, int64_t, const double*, const double*, int64_t, int64_t,
                                        const double*, double*, int);
template void linear_backward_at<float>(ComputeDtype, int64_t, const float*, const float*, int64_t, int64_t,
                                        const float*, float*, float*, float*, int);
template void linear_backward_at<double>(ComputeDtype, int64_t, const double*, const double*, int64_t, int64_t,
                                         const double*, double*, double*, double*, int);

}  // namespace multihead::train
