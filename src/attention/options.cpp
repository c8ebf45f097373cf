// src/attention/options.cpp: the public option types of multihead/attention.hpp
// (masks, kernel names). No arithmetic beyond the mask conversion, so the
// textbook form's oracle build (tests/CMakeLists.txt) can link it alone.
#include <limits>
#include <string>

#include "multihead/attention.hpp"
#include "multihead/error.hpp"

namespace multihead {

template <class T>
Tensor<T> Mask<T>::to_additive() const {
  if (!is_bool_) return float_;
  Tensor<T> out(bool_.shape());
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < out.numel(); ++i) out[i] = bool_[i] ? neg_inf : T(0);
  return out;
}

template class Mask<float>;
template class Mask<double>;

std::string to_string(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::Auto: return "auto";
    case AttentionKernel::Reference: return "reference";
    case AttentionKernel::Materialized: return "materialized";
    case AttentionKernel::Flash: return "flash";
  }
  return "auto";
}

AttentionKernel parse_attention_kernel(const std::string& name) {
  for (AttentionKernel k : {AttentionKernel::Auto, AttentionKernel::Reference,
                            AttentionKernel::Materialized, AttentionKernel::Flash})
    if (name == to_string(k)) return k;
  throw Error(Error::Kind::Value, "kernel: expected one of auto, reference, materialized, flash; got '" +
                                      name + "'");
}

}  // namespace multihead
