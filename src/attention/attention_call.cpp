// src/attention/attention_call.cpp: options -> kernel arguments (attention_call.hpp).
#include "attention/attention_call.hpp"

#include <cmath>
#include <string>

#include "core/check.hpp"
#include "multihead/error.hpp"
#include "multihead/runtime.hpp"

namespace multihead::detail {

namespace {
constexpr double kMinSoftcap = 0x1p-126, kMaxSoftcap = 0x1p126;
}  // namespace

void validate_attention_options(const AttentionOptions& o) {
  if (!(o.dropout_p >= 0.0 && o.dropout_p <= 1.0))
    throw Error(Error::Kind::Value,
                "dropout_p: expected a probability in [0, 1], got " + format_number(o.dropout_p));
  if (o.scale && !std::isfinite(*o.scale))
    throw Error(Error::Kind::Value, "scale: expected a finite number, got " + format_number(*o.scale));
  if (o.num_threads < 0 || o.num_threads > max_threads())
    throw Error(Error::Kind::Value, "num_threads: expected 0 (default) to " + std::to_string(max_threads()) +
                                        " (8 per processor), got " + std::to_string(o.num_threads));
  constexpr int64_t kMaxOffset = int64_t{1} << 40;
  if (o.causal_query_offset < -kMaxOffset || o.causal_query_offset > kMaxOffset)
    throw Error(Error::Kind::Value, "causal_query_offset: expected a value in [-2^40, 2^40], got " +
                                        std::to_string(o.causal_query_offset));
  if (o.window && (*o.window < 1 || *o.window > kMaxOffset))
    throw Error(Error::Kind::Value,
                "window: expected a window of 1 to 2^40 keys, got " + std::to_string(*o.window));
  // The float32 kernels compute cap·tanh(s·(1/cap)) in float32: a cap past
  // FLT_MAX becomes inf (inf·0 = NaN everywhere), one below FLT_MIN becomes
  // 0 or a denormal (0 means "no cap", the opposite of the limit, a flat row).
  // [2^-126, 2^126] keeps both the cap and 1/cap normal float32 numbers; one
  // rule for every dtype, so float64 and float32 accept the same caps.
  if (o.softcap && !(*o.softcap >= kMinSoftcap && *o.softcap <= kMaxSoftcap))
    throw Error(Error::Kind::Value,
                "softcap: expected a cap in [2^-126, 2^126] (about 1.2e-38 to 8.5e+37, where the cap and 1/cap are "
                "both normal float32 numbers), got " +
                    format_number(*o.softcap));
  for (std::size_t n = 0; n < o.alibi_slopes.size(); ++n)
    if (!std::isfinite(o.alibi_slopes[n]))
      throw Error(Error::Kind::Value, "alibi_slopes[" + std::to_string(n) + "]: expected a finite slope, got " +
                                          format_number(o.alibi_slopes[n]));
}

template <class T>
AttentionArgs<T> make_attention_args(const AttentionShape& shape, const AttentionTensors<T>& t,
                                     const AttentionOptions& o) {
  AttentionArgs<T> a;
  a.slices = shape.slices;
  a.heads = shape.heads;
  a.q_len = shape.q_len;
  a.kv_len = shape.kv_len;
  a.head_dim = shape.head_dim;
  a.value_dim = shape.value_dim;
  a.q = t.q;
  a.k = t.k;
  a.v = t.v;
  a.q_layout = t.q_layout;
  a.k_layout = t.k_layout;
  a.v_layout = t.v_layout;
  a.out_layout = t.out_layout;
  a.scale = static_cast<T>(o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(shape.head_dim)));
  a.modifiers.attn_mask = t.attn_mask;
  a.modifiers.attn_mask_slice_stride = t.attn_mask_slice_stride;
  a.modifiers.key_padding = t.key_padding;
  a.modifiers.causal = CausalRule{o.is_causal, o.causal_alignment, o.causal_query_offset, shape.causal_cols};
  a.modifiers.window = o.window.value_or(0);
  a.modifiers.softcap = static_cast<T>(o.softcap.value_or(0.0));
  a.modifiers.alibi_slopes = t.alibi_slopes;
  a.dropout = DropoutRule{o.dropout_p, o.dropout_seed, shape.first_slice};
  a.masked_rows = o.masked_rows;
  a.num_threads = o.num_threads;
  a.out = t.out;
  a.weights = t.weights;
  return a;
}

template AttentionArgs<float> make_attention_args<float>(const AttentionShape&, const AttentionTensors<float>&,
                                                         const AttentionOptions&);
template AttentionArgs<double> make_attention_args<double>(const AttentionShape&,
                                                           const AttentionTensors<double>&,
                                                           const AttentionOptions&);

}  // namespace multihead::detail
