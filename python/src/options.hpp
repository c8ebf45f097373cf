// python/src/options.hpp: the one place where Python keyword arguments become
// the library's options structs. A new option of ForwardOptions or
// AttentionOptions is added here (and to the signatures in module.cpp and
// multihead/__init__.pyi), nowhere else.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "multihead/attention.hpp"
#include "multihead/error.hpp"
#include "multihead/multihead_attention.hpp"

namespace multihead::python {

// Every keyword a forward or a scaled_dot_product_attention call takes,
// besides the tensors, with PyTorch's defaults.
struct CallOptions {
  bool need_weights = true;
  bool average_attn_weights = true;
  bool is_causal = false;
  bool training = false;        // the module's .training (forward only)
  double dropout_p = 0.0;       // scaled_dot_product_attention only (MHA: the module's dropout)
  std::optional<double> scale;  // scaled_dot_product_attention only
  uint64_t dropout_seed = 0;
  std::string masked_rows = "zeros";  // "zeros" | "nan"
  std::string kernel = "auto";        // "auto" | "reference" | "materialized" | "flash"
  int num_threads = 0;
  bool check_finite = false;
  // The score variants (docs/semantics.md, "Positions").
  std::string causal_align = "top-left";  // "top-left" | "bottom-right"
  std::optional<int64_t> window;
  std::optional<double> softcap;
  bool alibi = false;                     // forward only: the paper's slopes per head
  std::vector<double> alibi_slopes;       // scaled_dot_product_attention only: one per slice
  // forward only: which heads' and query rows' weights need_weights returns
  // (ForwardOptions::weights_heads / weights_rows; empty = all).
  std::vector<int64_t> weights_heads, weights_rows;
};

inline CausalAlignment parse_causal_align(const std::string& s) {
  if (s == "top-left") return CausalAlignment::TopLeft;
  if (s == "bottom-right") return CausalAlignment::BottomRight;
  throw Error(Error::Kind::Value, "causal_align: expected 'top-left' or 'bottom-right', got '" + s + "'");
}

inline MaskedRowPolicy parse_masked_rows(const std::string& s) {
  if (s == "zeros") return MaskedRowPolicy::Zeros;
  if (s == "nan") return MaskedRowPolicy::NaN;
  throw Error(Error::Kind::Value, "masked_rows: expected 'zeros' or 'nan', got '" + s + "'");
}

inline AttentionOptions attention_options(const CallOptions& o) {
  AttentionOptions a;
  a.scale = o.scale;
  a.is_causal = o.is_causal;
  a.causal_alignment = parse_causal_align(o.causal_align);
  a.window = o.window;
  a.softcap = o.softcap;
  a.alibi_slopes = o.alibi_slopes;
  a.dropout_p = o.dropout_p;
  a.dropout_seed = o.dropout_seed;
  a.masked_rows = parse_masked_rows(o.masked_rows);
  a.kernel = parse_attention_kernel(o.kernel);
  a.num_threads = o.num_threads;
  a.check_finite = o.check_finite;
  return a;
}

template <class T>
ForwardOptions<T> forward_options(const CallOptions& o, const Mask<T>* key_padding_mask,
                                  const Mask<T>* attn_mask) {
  ForwardOptions<T> f;
  f.key_padding_mask = key_padding_mask;
  f.attn_mask = attn_mask;
  f.need_weights = o.need_weights;
  f.average_attn_weights = o.average_attn_weights;
  f.training = o.training;
  f.alibi = o.alibi;
  f.weights_heads = o.weights_heads;
  f.weights_rows = o.weights_rows;
  // The attention step's options; its dropout rate is the module's, so
  // attention.dropout_p stays 0.
  f.attention = attention_options(o);
  f.attention.dropout_p = 0.0;
  return f;
}

}  // namespace multihead::python
