// tests/oracle/library_side.hpp: the oracle's float64 problem as the
// library's own types (tensors, masks, the module's configuration and
// parameters), for the tests that run the library on the oracle's numbers:
// tests/oracle/test_mha_oracle.cpp and tests/precision/. Public headers
// only, so the oracle's side still cannot reach the library's planning.
// A 16-bit T takes each number rounded to nearest even (narrow_from_float).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "mha_oracle.hpp"
#include "multihead/attention.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/narrow.hpp"

namespace multihead::library_side {

template <class T, class U>
Tensor<T> tensor_of(const oracle::Array<U>& a) {
  Tensor<T> t(Shape(a.shape.begin(), a.shape.end()));
  for (std::size_t i = 0; i < a.v.size(); ++i) {
    if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>) {
      t[static_cast<int64_t>(i)] = narrow_from_float<T>(static_cast<float>(a.v[i]));
    } else {
      t[static_cast<int64_t>(i)] = static_cast<T>(a.v[i]);
    }
  }
  return t;
}

// A mask in the module's mask type T (float for the 16-bit module); null
// for none.
template <class T>
std::unique_ptr<Mask<T>> mask_of(const oracle::MaskArg<double>& m) {
  if (m.kind == oracle::MaskKind::None) return nullptr;
  if (m.kind == oracle::MaskKind::Bool)
    return std::make_unique<Mask<T>>(Mask<T>::boolean(tensor_of<uint8_t>(m.bools)));
  return std::make_unique<Mask<T>>(Mask<T>::additive(tensor_of<T>(m.floats)));
}

// nn.MultiheadAttention's constructor arguments as the module's config.
inline MultiheadAttentionConfig config_of(const oracle::Config& c) {
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = c.E;
  cfg.num_heads = c.H;
  cfg.kdim = c.kdim;
  cfg.vdim = c.vdim;
  cfg.bias = c.bias;
  cfg.add_bias_kv = c.add_bias_kv;
  cfg.add_zero_attn = c.add_zero_attn;
  cfg.batch_first = c.batch_first;
  return cfg;
}

// The oracle's parameters as element type T; the absent ones stay empty.
template <class T>
MultiheadAttentionParameters<T> parameters_of(const oracle::Params<double>& q) {
  MultiheadAttentionParameters<T> m;
  auto set = [](Tensor<T>& dst, const oracle::Array<double>& src) {
    if (!src.shape.empty()) dst = tensor_of<T>(src);
  };
  set(m.in_proj_weight, q.in_proj_weight);
  set(m.q_proj_weight, q.q_proj_weight);
  set(m.k_proj_weight, q.k_proj_weight);
  set(m.v_proj_weight, q.v_proj_weight);
  set(m.in_proj_bias, q.in_proj_bias);
  set(m.out_proj_weight, q.out_proj_weight);
  set(m.out_proj_bias, q.out_proj_bias);
  set(m.bias_k, q.bias_k);
  set(m.bias_v, q.bias_v);
  return m;
}

}  // namespace multihead::library_side
