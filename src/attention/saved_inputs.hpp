// src/attention/saved_inputs.hpp: the inputs a training forward keeps for
// its backward (the in-projection's weight gradient d_W = d_yᵀ · x reads
// them), shared by the float module's SavedForward and the 16-bit module's
// NarrowSavedForward.
//
// Self-attention passes one tensor as query, key and value: it is copied
// once, and key / value stay empty, naming the copy they share
// (saved_key(), saved_value()).
#pragma once

#include <algorithm>

#include "multihead/tensor.hpp"

namespace multihead::detail {

template <class T>
struct SavedInputs {
  Tensor<T> query, key, value;
  bool key_is_query = false, value_is_query = false, value_is_key = false;

  // Copies the inputs, each distinct tensor once; a copy whose shape has not
  // changed since the last forward reuses its storage.
  void keep_inputs(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v) {
    key_is_query = same(k, q);
    value_is_query = same(v, q);
    value_is_key = same(v, k);
    keep(q, query);
    if (key_is_query) key = Tensor<T>();
    else keep(k, key);
    if (value_is_query || value_is_key) value = Tensor<T>();
    else keep(v, value);
  }
  const Tensor<T>& saved_key() const { return key_is_query ? query : key; }
  const Tensor<T>& saved_value() const { return value_is_query ? query : value_is_key ? saved_key() : value; }
  // Elements held (each copy once).
  int64_t saved_numel() const { return query.numel() + key.numel() + value.numel(); }

 private:
  static bool same(const Tensor<T>& a, const Tensor<T>& b) { return a.data() == b.data() && a.shape() == b.shape(); }
  static void keep(const Tensor<T>& src, Tensor<T>& dst) {
    if (dst.is_view() || dst.shape() != src.shape()) dst = Tensor<T>::uninitialized(src.shape());  // copied next
    std::copy_n(src.data(), src.numel(), dst.data());
  }
};

}  // namespace multihead::detail
