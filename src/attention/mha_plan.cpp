// src/attention/mha_plan.cpp: validation and mask layout shared by the fused
// and the textbook forms. Mirrors the checks of PyTorch 1.13's
// _mha_shape_check and multi_head_attention_forward, with messages that name
// the tensor and give the expected and the actual shape.
#include "attention/mha_plan.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention/attention_call.hpp"
#include "core/check.hpp"
#include "core/switches.hpp"
#include "multihead/error.hpp"

namespace multihead::detail {
namespace {

std::string dims(std::initializer_list<const char*> names) {
  std::string s = "(";
  bool first = true;
  for (const char* n : names) {
    s += (first ? "" : ", ") + std::string(n);
    first = false;
  }
  return s + ")";
}

// query, key and value have the same rank, 3 (batched) or 2 (unbatched).
template <class T>
void check_ranks(bool batch_first, const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value) {
  const bool bf = batch_first;
  if (query.dim() != 3 && query.dim() != 2)
    fail_shape("query", bf ? "(B, L, E) or unbatched (L, E)" : "(L, B, E) or unbatched (L, E)", query.shape());
  const int64_t rank = query.dim();
  if (key.dim() != rank)
    fail_shape("key", std::to_string(rank) + "-D like query: " +
                          (rank == 2 ? std::string("(S, Ek)") : bf ? "(B, S, Ek)" : "(S, B, Ek)"),
               key.shape());
  if (value.dim() != rank)
    fail_shape("value", std::to_string(rank) + "-D like query: " +
                            (rank == 2 ? std::string("(S, Ev)") : bf ? "(B, S, Ev)" : "(S, B, Ev)"),
               value.shape());
}

// B, L, S and the token strides of the caller's layout; checks the shapes.
template <class T>
void plan_tokens(bool bf, const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value, ForwardPlan& p) {
  if (p.batched) {
    p.B = bf ? query.size(0) : query.size(1);
    p.L = bf ? query.size(1) : query.size(0);
    p.S = bf ? key.size(1) : key.size(0);
    // seq-first (L, B, E): token (b, l) is row l·B + b; batch-first: b·L + l.
    p.q_batch_stride = bf ? p.L : 1;
    p.q_seq_stride = bf ? 1 : p.B;
    p.kv_batch_stride = bf ? p.S : 1;
    p.kv_seq_stride = bf ? 1 : p.B;
    expect_shape("query", query.shape(), bf ? Shape{p.B, p.L, p.E} : Shape{p.L, p.B, p.E});
    expect_shape("key", key.shape(), bf ? Shape{p.B, p.S, p.Ek} : Shape{p.S, p.B, p.Ek});
    expect_shape("value", value.shape(), bf ? Shape{p.B, p.S, p.Ev} : Shape{p.S, p.B, p.Ev});
    return;
  }
  p.B = 1;
  p.L = query.size(0);
  p.S = key.size(0);
  p.q_batch_stride = p.L;
  p.q_seq_stride = 1;
  p.kv_batch_stride = p.S;
  p.kv_seq_stride = 1;
  expect_shape("query", query.shape(), Shape{p.L, p.E});
  expect_shape("key", key.shape(), Shape{p.S, p.Ek});
  expect_shape("value", value.shape(), Shape{p.S, p.Ev});
}

template <class T>
void check_masks(const ForwardPlan& p, const ForwardOptions<T>& options) {
  if (const Mask<T>* m = options.key_padding_mask) {
    const Shape expected = p.batched ? Shape{p.B, p.S} : Shape{p.S};
    if (m->shape() != expected)
      fail_shape("key_padding_mask", shape_to_string(expected) + (p.batched ? " = (B, S)" : " = (S)"),
                 m->shape());
  }
  if (const Mask<T>* m = options.attn_mask) {
    const Shape two = {p.L, p.S};
    const Shape three = {p.B * p.H, p.L, p.S};
    const Shape& s = m->shape();
    if (s != two && s != three) {
      const std::string three_name = p.batched ? dims({"B·H", "L", "S"}) : dims({"H", "L", "S"});
      fail_shape("attn_mask",
                 shape_to_string(two) + " = (L, S) or " + shape_to_string(three) + " = " + three_name,
                 s);
    }
  }
}

// ForwardOptions::weights_heads / weights_rows: indices in range, each at
// most once, only with need_weights. Sets H' and L'.
template <class T>
void check_weights_selection(ForwardPlan& p, const ForwardOptions<T>& options) {
  const auto check = [&](const std::vector<int64_t>& list, const char* name, const char* what, int64_t limit) {
    if (!list.empty() && !options.need_weights)
      throw Error(Error::Kind::Value, std::string(name) + ": expected need_weights=true (it selects which weights "
                                      "need_weights returns), got need_weights=false");
    if (list.empty()) return;
    std::vector<bool> seen(static_cast<std::size_t>(limit), false);
    for (std::size_t x = 0; x < list.size(); ++x) {
      const int64_t v = list[x];
      if (v < 0 || v >= limit)
        throw Error(Error::Kind::Value, std::string(name) + "[" + std::to_string(x) + "]: expected " + what +
                                            " in [0, " + std::to_string(limit) + "), got " + std::to_string(v));
      if (seen[static_cast<std::size_t>(v)])
        throw Error(Error::Kind::Value, std::string(name) + "[" + std::to_string(x) + "]: expected each " +
                                            std::string(what).substr(2) + " at most once, got " + std::to_string(v) + " again");
      seen[static_cast<std::size_t>(v)] = true;
    }
  };
  check(options.weights_heads, "weights_heads", "a head", p.H);
  check(options.weights_rows, "weights_rows", "a query row", p.L);
  p.H_weights = options.weights_heads.empty() ? p.H : static_cast<int64_t>(options.weights_heads.size());
  p.L_weights = options.weights_rows.empty() ? p.L : static_cast<int64_t>(options.weights_rows.size());
}

}  // namespace

template <class T, class X>
ForwardPlan plan_forward(const MultiheadAttentionConfig& config, const Tensor<X>& query,
                         const Tensor<X>& key, const Tensor<X>& value,
                         const ForwardOptions<T>& options) {
  config.validate();
  validate_attention_options(options.attention);
  if (options.attention.dropout_p != 0.0)
    throw Error(Error::Kind::Value, "attention.dropout_p: expected 0 (multi-head attention drops at "
                                    "MultiheadAttentionConfig::dropout when training), got " +
                                        format_number(options.attention.dropout_p));
  if (!options.attention.alibi_slopes.empty())
    throw Error(Error::Kind::Value, "attention.alibi_slopes: expected none (multi-head attention takes "
                                    "ForwardOptions::alibi, the paper's slopes per head), got " +
                                        std::to_string(options.attention.alibi_slopes.size()));
  if (options.alibi_heads != 0 || options.alibi_head_offset != 0) {
    const int64_t total = options.alibi_heads == 0 ? config.num_heads : options.alibi_heads;
    if (options.alibi_head_offset < 0 || options.alibi_head_offset + config.num_heads > total)
      throw Error(Error::Kind::Value, "alibi_head_offset: expected 0 to " + std::to_string(total - config.num_heads) +
                                          " (heads " + std::to_string(config.num_heads) + " of alibi_heads " +
                                          std::to_string(total) + "), got " +
                                          std::to_string(options.alibi_head_offset));
  }
  ForwardPlan p;
  p.E = config.embed_dim;
  p.H = config.num_heads;
  p.D = config.head_dim();
  p.Ek = config.key_dim();
  p.Ev = config.value_dim();
  check_ranks(config.batch_first, query, key, value);
  p.batched = query.dim() == 3;
  plan_tokens(config.batch_first, query, key, value, p);
  p.S_total = p.S;
  if (config.add_bias_kv) p.bias_kv_col = p.S_total++;
  if (config.add_zero_attn) p.zero_attn_col = p.S_total++;
  if (p.S_total == 0)
    throw Error(Error::Kind::Shape,
                "key: expected at least 1 key (sequence length S >= 1), got S = 0 with no "
                "bias_k or zero-attention key");
  check_masks(p, options);
  check_weights_selection(p, options);
  return p;
}

template <class T>
KernelMasks<T> build_kernel_masks(const ForwardPlan& p, const ForwardOptions<T>& options) {
  KernelMasks<T> out;
  const int64_t S = p.S, St = p.S_total;
  if (options.alibi) {
    const std::vector<double> heads = alibi_slopes(options.alibi_heads == 0 ? p.H : options.alibi_heads);
    for (int64_t n = 0; n < p.B * p.H; ++n)
      out.alibi_slopes.push_back(static_cast<T>(heads[static_cast<std::size_t>(options.alibi_head_offset + n % p.H)]));
  }
  if (const Mask<T>* m = options.attn_mask) {
    const Tensor<T> add = m->to_additive();
    const int64_t slices = add.dim() == 3 ? add.size(0) : 1;
    out.attn_mask = Tensor<T>(slices == 1 ? Shape{p.L, St} : Shape{slices, p.L, St}, T(0));
    out.attn_mask_slice_stride = slices == 1 ? 0 : p.L * St;
    for (int64_t n = 0; n < slices; ++n)
      for (int64_t i = 0; i < p.L; ++i)
        for (int64_t j = 0; j < S; ++j)
          out.attn_mask[(n * p.L + i) * St + j] = add[(n * p.L + i) * S + j];
  }
  if (const Mask<T>* m = options.key_padding_mask) {
    const Tensor<T> add = m->to_additive();
    out.key_padding = Tensor<T>(Shape{p.B, St}, T(0));
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t j = 0; j < S; ++j) out.key_padding[b * St + j] = add[b * S + j];
  }
  return out;
}

template <class T>
void check_forward_finite(const MultiheadAttentionConfig& config, const Tensor<T>& query, const Tensor<T>& key,
                          const Tensor<T>& value, const MultiheadAttentionParameters<T>& params,
                          const ForwardOptions<T>& options) {
  check_finite("query", query);
  check_finite("key", key);
  check_finite("value", value);
  check_masks_finite(options.key_padding_mask, options.attn_mask);
  for_each_parameter(config, params,
                     [](const ParameterInfo& info, const Tensor<T>& t) { check_finite(info.name, t); });
}

void check_weights_fit(const ForwardPlan& p, int64_t heads, int64_t rows, std::size_t element_size) {
  const double bytes = static_cast<double>(p.B) * static_cast<double>(heads) * static_cast<double>(rows) *
                       static_cast<double>(p.S_total) * static_cast<double>(element_size);
  check_fits_in_memory("attn_weights", "shape " + shape_to_string({p.B, heads, rows, p.S_total}), bytes,
                       "only need_weights asks for them; the output alone needs none of this");
}

Shape attn_weights_shape(const ForwardPlan& p, bool average) {
  if (p.batched) return average ? Shape{p.B, p.L_weights, p.S_total} : Shape{p.B, p.H_weights, p.L_weights, p.S_total};
  return average ? Shape{p.L_weights, p.S_total} : Shape{p.H_weights, p.L_weights, p.S_total};
}

Shape output_shape(const ForwardPlan& p, const Shape& query_shape) {
  Shape s = query_shape;
  s.back() = p.E;
  return s;
}

template ForwardPlan plan_forward<float, bfloat16>(const MultiheadAttentionConfig&, const Tensor<bfloat16>&,
                                                   const Tensor<bfloat16>&, const Tensor<bfloat16>&,
                                                   const ForwardOptions<float>&);
template ForwardPlan plan_forward<float, float16>(const MultiheadAttentionConfig&, const Tensor<float16>&,
                                                  const Tensor<float16>&, const Tensor<float16>&,
                                                  const ForwardOptions<float>&);
#define MULTIHEAD_INSTANTIATE(T)                                                                    \
  template ForwardPlan plan_forward<T, T>(const MultiheadAttentionConfig&, const Tensor<T>&,          \
                                       const Tensor<T>&, const Tensor<T>&,                         \
                                       const ForwardOptions<T>&);                                  \
  template KernelMasks<T> build_kernel_masks<T>(const ForwardPlan&, const ForwardOptions<T>&);     \
  template void check_forward_finite<T>(const MultiheadAttentionConfig&, const Tensor<T>&,        \
                                        const Tensor<T>&, const Tensor<T>&,                         \
                                        const MultiheadAttentionParameters<T>&, const ForwardOptions<T>&);
MULTIHEAD_INSTANTIATE(float)
MULTIHEAD_INSTANTIATE(double)
#undef MULTIHEAD_INSTANTIATE

bool backward_reads_views() { return env_switch("MULTIHEAD_BACKWARD_HEADS", {"auto", "views"}) == 1; }

bool backward_widens_bf16() { return env_switch("MULTIHEAD_BF16_BACKWARD", {"auto", "copies"}) == 1; }

}  // namespace multihead::detail
