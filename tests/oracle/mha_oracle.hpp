// tests/oracle/mha_oracle.hpp: an independent oracle for multi-head
// attention, torch.nn.functional.multi_head_attention_forward (PyTorch 1.13,
// torch/nn/functional.py) step by step, as plain loops on its own dense
// arrays. It includes no multihead header and calls no library function: it
// has its own tensors, its own transposes for batch_first, its own unsqueeze
// for unbatched input, its own bool -> -inf conversion and its own padding
// and expansion of attn_mask and key_padding_mask. A planning error of the
// library (a stride, a mask column, the default scale, the weights'
// average) therefore cannot cancel out between the library and this file,
// as it would between the library's two forms, which share that planning
// (src/attention/multihead_attention_textbook.cpp says what they share).
//
// Where the library deliberately differs from PyTorch 1.13 (docs/semantics.md),
// this oracle follows the library's documented semantics, and says so:
//  - a float key_padding_mask is added to the scores (1.13 masked_fill's it);
//  - is_causal hides key j > i among the S given keys, top-left aligned;
//    bias_k and the zero-attention key stay visible (1.13's module has none);
//  - a fully masked row gives zero weights and a zero attention output
//    under MaskedRowPolicy::Zeros (nan_rows = false), NaN under NaN (1.13).
//  - weights_heads / weights_rows select heads and query rows of the
//    weights; the average is over the selected heads.
//
// Legend: B batch, L query length, S key length, S' = S (+1 bias_k)
// (+1 zero attention), E embed_dim, H heads, D = E / H, Ek kdim, Ev vdim.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace oracle {

// A dense row-major array with its own shape: the oracle's only tensor.
template <class T>
struct Array {
  std::vector<int64_t> shape;
  std::vector<T> v;

  Array() = default;
  explicit Array(std::vector<int64_t> s, T fill = T(0)) : shape(std::move(s)), v(count(shape), fill) {}
  static std::size_t count(const std::vector<int64_t>& s) {
    std::size_t n = 1;
    for (int64_t d : s) n *= static_cast<std::size_t>(d);
    return n;
  }
  int64_t dim() const { return static_cast<int64_t>(shape.size()); }
  int64_t size(int64_t d) const { return shape[static_cast<std::size_t>(d)]; }
  // Element (i, j) of a 2-D array, (i, j, k) of a 3-D one, (i, j, k, l) of 4-D.
  T& at(int64_t i, int64_t j) { return v[static_cast<std::size_t>(i * shape[1] + j)]; }
  T at(int64_t i, int64_t j) const { return v[static_cast<std::size_t>(i * shape[1] + j)]; }
  T& at(int64_t i, int64_t j, int64_t k) {
    return v[static_cast<std::size_t>((i * shape[1] + j) * shape[2] + k)];
  }
  T at(int64_t i, int64_t j, int64_t k) const {
    return v[static_cast<std::size_t>((i * shape[1] + j) * shape[2] + k)];
  }
  T& at(int64_t i, int64_t j, int64_t k, int64_t l) {
    return v[static_cast<std::size_t>(((i * shape[1] + j) * shape[2] + k) * shape[3] + l)];
  }
};

// A mask as the caller gives it: bool (nonzero = may not attend) or float
// (added), or none.
enum class MaskKind { None, Bool, Float };
template <class T>
struct MaskArg {
  MaskKind kind = MaskKind::None;
  Array<uint8_t> bools;
  Array<T> floats;
  const std::vector<int64_t>& shape() const { return kind == MaskKind::Bool ? bools.shape : floats.shape; }
};

// nn.MultiheadAttention's constructor arguments that shape the computation.
struct Config {
  int64_t E = 0, H = 1, kdim = 0, vdim = 0;  // kdim/vdim 0 = E
  bool bias = true, add_bias_kv = false, add_zero_attn = false, batch_first = false;
  int64_t Ek() const { return kdim ? kdim : E; }
  int64_t Ev() const { return vdim ? vdim : E; }
};

// The parameters under PyTorch's names: in_proj_weight (3E, E) when
// Ek = Ev = E, else q/k/v_proj_weight; biases empty when absent.
template <class T>
struct Params {
  Array<T> in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias;
  Array<T> out_proj_weight, out_proj_bias, bias_k, bias_v;
};

template <class T>
struct Call {
  Array<T> query, key, value;  // as the caller lays them out
  MaskArg<T> attn_mask, key_padding_mask;
  bool need_weights = true, average_attn_weights = true;
  bool is_causal = false;
  std::optional<double> scale;  // unset: 1/√D
  bool nan_rows = false;        // fully masked rows: NaN (true) or zeros
  std::vector<int64_t> weights_heads, weights_rows;
};

template <class T>
struct Result {
  Array<T> output;
  std::optional<Array<T>> weights;
};

namespace step {

template <class T>
void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("oracle: " + what);
}

// x.transpose(0, 1) of a 3-D array.
template <class T>
Array<T> transpose01(const Array<T>& x) {
  Array<T> y({x.size(1), x.size(0), x.size(2)});
  for (int64_t i = 0; i < x.size(0); ++i)
    for (int64_t j = 0; j < x.size(1); ++j)
      for (int64_t k = 0; k < x.size(2); ++k) y.at(j, i, k) = x.at(i, j, k);
  return y;
}

// x.unsqueeze(dim) of any array (the elements do not move).
template <class T>
Array<T> unsqueeze(Array<T> x, std::size_t dim) {
  x.shape.insert(x.shape.begin() + static_cast<std::ptrdiff_t>(dim), 1);
  return x;
}

// F.linear on a (rows…, in) array: y = x Wᵀ + b, W rows [r0, r0 + out) of
// a weight stored (·, in), b from offset r0 (or none).
template <class T>
Array<T> linear(const Array<T>& x, const Array<T>& W, int64_t r0, int64_t out, const Array<T>* b) {
  const int64_t in = x.shape.back();
  require<T>(W.size(1) == in, "linear: weight width");
  std::vector<int64_t> shape = x.shape;
  shape.back() = out;
  Array<T> y(shape);
  const int64_t rows = static_cast<int64_t>(x.v.size()) / in;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      T acc = 0;
      for (int64_t e = 0; e < in; ++e) acc += x.v[static_cast<std::size_t>(r * in + e)] * W.at(r0 + o, e);
      if (b) acc += b->v[static_cast<std::size_t>(r0 + o)];
      y.v[static_cast<std::size_t>(r * out + o)] = acc;
    }
  return y;
}

// A mask as additive floats: bool true -> -inf, false -> 0 (PyTorch 1.13:
// `new_attn_mask.masked_fill_(attn_mask, float("-inf"))`), float as given.
template <class T>
Array<T> additive(const MaskArg<T>& m) {
  if (m.kind == MaskKind::Float) return m.floats;
  Array<T> out(m.bools.shape);
  for (std::size_t i = 0; i < out.v.size(); ++i)
    out.v[i] = m.bools.v[i] ? -std::numeric_limits<T>::infinity() : T(0);
  return out;
}

// F.pad(x, (0, 1)): one zero column at the end of the last dimension.
template <class T>
Array<T> pad_last(const Array<T>& x) {
  const int64_t w = x.shape.back(), rows = static_cast<int64_t>(x.v.size()) / w;
  std::vector<int64_t> shape = x.shape;
  shape.back() = w + 1;
  Array<T> y(shape);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < w; ++j) y.v[static_cast<std::size_t>(r * (w + 1) + j)] = x.v[static_cast<std::size_t>(r * w + j)];
  return y;
}

// (len, B, E) -> (B·H, len, D): x.contiguous().view(len, B·H, D).transpose(0, 1).
template <class T>
Array<T> to_heads(const Array<T>& x, int64_t H) {
  const int64_t len = x.size(0), B = x.size(1), D = x.size(2) / H;
  Array<T> y({B * H, len, D});
  for (int64_t l = 0; l < len; ++l)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) y.at(b * H + h, l, d) = x.at(l, b, h * D + d);
  return y;
}

}  // namespace step

// F.multi_head_attention_forward, after nn.MultiheadAttention.forward's
// batch_first transposes, for the library's semantics (top of this file).
template <class T>
Result<T> multi_head_attention_forward(const Config& c, const Params<T>& p, const Call<T>& call) {
  using namespace step;
  const int64_t E = c.E, H = c.H, D = E / H;
  require<T>(H > 0 && E % H == 0, "embed_dim must divide into heads");
  // nn.MultiheadAttention.forward: batch_first inputs are transposed to
  // (L, B, E) first (query.transpose(1, 0)); unbatched ones stay 2-D.
  const bool batched = call.query.dim() == 3;
  Array<T> query = call.query, key = call.key, value = call.value;
  if (batched && c.batch_first) {
    query = transpose01(query);
    key = transpose01(key);
    value = transpose01(value);
  }
  // _mha_shape_check: unbatched (L, E) becomes (L, 1, E); the key padding
  // mask (S) becomes (1, S); a 3-D attn_mask (H, L, S) is already (B·H, L, S).
  Array<T> kpm, mask;
  const bool has_kpm = call.key_padding_mask.kind != MaskKind::None;
  const bool has_mask = call.attn_mask.kind != MaskKind::None;
  if (has_kpm) kpm = additive(call.key_padding_mask);
  if (has_mask) mask = additive(call.attn_mask);
  if (!batched) {
    query = unsqueeze(query, 1);
    key = unsqueeze(key, 1);
    value = unsqueeze(value, 1);
    if (has_kpm) kpm = unsqueeze(kpm, 0);
  }
  const int64_t L = query.size(0), B = query.size(1), S = key.size(0);
  require<T>(query.size(2) == E && key.size(2) == c.Ek() && value.size(2) == c.Ev(), "input widths");
  require<T>(key.size(1) == B && value.size(0) == S && value.size(1) == B, "key/value shapes");

  // _in_projection_packed / _in_projection: q = query W_qᵀ + b_q, …
  const bool packed = c.Ek() == E && c.Ev() == E;
  const Array<T>* b = c.bias ? &p.in_proj_bias : nullptr;
  Array<T> q = linear(query, packed ? p.in_proj_weight : p.q_proj_weight, 0, E, b);
  Array<T> k = packed ? linear(key, p.in_proj_weight, E, E, b) : linear<T>(key, p.k_proj_weight, 0, E, nullptr);
  Array<T> v = packed ? linear(value, p.in_proj_weight, 2 * E, E, b) : linear<T>(value, p.v_proj_weight, 0, E, nullptr);
  if (!packed && b) {  // _in_projection's b_k, b_v: the 2nd and 3rd thirds of in_proj_bias
    for (std::size_t r = 0; r < k.v.size(); ++r) k.v[r] += b->v[static_cast<std::size_t>(E) + r % static_cast<std::size_t>(E)];
    for (std::size_t r = 0; r < v.v.size(); ++r) v.v[r] += b->v[2 * static_cast<std::size_t>(E) + r % static_cast<std::size_t>(E)];
  }

  // attn_mask: 2-D (L, S) -> unsqueeze(0) (1, L, S); 3-D must be (B·H, L, S).
  if (has_mask && mask.dim() == 2) mask = unsqueeze(mask, 0);
  if (has_mask) require<T>(mask.size(0) == 1 || mask.size(0) == B * H, "attn_mask batch");

  // add_bias_kv: k = cat([k, bias_k.repeat(1, B, 1)]); masks pad(…, (0, 1)).
  int64_t St = S;
  if (c.add_bias_kv) {
    Array<T> k2({St + 1, B, E}), v2({St + 1, B, E});
    for (int64_t s = 0; s <= St; ++s)
      for (int64_t bb = 0; bb < B; ++bb)
        for (int64_t e = 0; e < E; ++e) {
          k2.at(s, bb, e) = s < St ? k.at(s, bb, e) : p.bias_k.v[static_cast<std::size_t>(e)];
          v2.at(s, bb, e) = s < St ? v.at(s, bb, e) : p.bias_v.v[static_cast<std::size_t>(e)];
        }
    k = std::move(k2);
    v = std::move(v2);
    ++St;
    if (has_mask) mask = pad_last(mask);
    if (has_kpm) kpm = pad_last(kpm);
  }
  // (len, B, E) -> (B·H, len, D)
  Array<T> qh = to_heads(q, H), kh = to_heads(k, H), vh = to_heads(v, H);
  // add_zero_attn: cat a zero key/value on dim 1; masks pad(…, (0, 1)).
  if (c.add_zero_attn) {
    Array<T> k2({B * H, St + 1, D}), v2({B * H, St + 1, D});
    for (int64_t n = 0; n < B * H; ++n)
      for (int64_t s = 0; s < St; ++s)
        for (int64_t d = 0; d < D; ++d) {
          k2.at(n, s, d) = kh.at(n, s, d);
          v2.at(n, s, d) = vh.at(n, s, d);
        }
    kh = std::move(k2);
    vh = std::move(v2);
    ++St;
    if (has_mask) mask = pad_last(mask);
    if (has_kpm) kpm = pad_last(kpm);
  }
  // key_padding_mask (B, S') -> view(B, 1, 1, S').expand(-1, H, -1, -1)
  // .reshape(B·H, 1, S'), merged into attn_mask by addition. The merged
  // mask, (B·H, L, S'), written out element by element.
  Array<T> merged({B * H, L, St});
  for (int64_t n = 0; n < B * H; ++n)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < St; ++j) {
        T m = 0;
        if (has_mask) m += mask.at(mask.size(0) == 1 ? 0 : n, i, j);
        if (has_kpm) m += kpm.at(n / H, j);
        // is_causal: key j of the S given keys is hidden from query i > … (j > i).
        if (call.is_causal && j < S && j > i) m = -std::numeric_limits<T>::infinity();
        merged.at(n, i, j) = m;
      }

  // _scaled_dot_product_attention: attn = softmax(q kᵀ · scale + mask), out = attn v.
  const T scale = static_cast<T>(call.scale ? *call.scale : 1.0 / std::sqrt(static_cast<double>(D)));
  Array<T> attn({B * H, L, St}), out({B * H, L, D});
  for (int64_t n = 0; n < B * H; ++n)
    for (int64_t i = 0; i < L; ++i) {
      std::vector<T> s(static_cast<std::size_t>(St));
      T top = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < St; ++j) {
        T dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += qh.at(n, i, d) * kh.at(n, j, d);
        s[static_cast<std::size_t>(j)] = dot * scale + merged.at(n, i, j);
        if (s[static_cast<std::size_t>(j)] > top) top = s[static_cast<std::size_t>(j)];
      }
      if (top == -std::numeric_limits<T>::infinity()) {  // every key masked
        const T fill = call.nan_rows ? std::numeric_limits<T>::quiet_NaN() : T(0);
        for (int64_t j = 0; j < St; ++j) attn.at(n, i, j) = fill;
        for (int64_t d = 0; d < D; ++d) out.at(n, i, d) = fill;
        continue;
      }
      T sum = 0;
      for (T& x : s) sum += x = std::exp(x - top);
      for (int64_t j = 0; j < St; ++j) attn.at(n, i, j) = s[static_cast<std::size_t>(j)] / sum;
      for (int64_t d = 0; d < D; ++d) {
        T acc = 0;
        for (int64_t j = 0; j < St; ++j) acc += attn.at(n, i, j) * vh.at(n, j, d);
        out.at(n, i, d) = acc;
      }
    }

  // attn_output.transpose(0, 1).contiguous().view(L·B, E), out_proj, view(L, B, E).
  Array<T> concat({L, B, E});
  for (int64_t n = 0; n < B * H; ++n)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t d = 0; d < D; ++d) concat.at(i, n / H, (n % H) * D + d) = out.at(n, i, d);
  Result<T> r;
  r.output = linear(concat, p.out_proj_weight, 0, E, c.bias ? &p.out_proj_bias : nullptr);
  if (!batched) {
    r.output.shape = {L, E};  // squeeze(1)
  } else if (c.batch_first) {
    r.output = transpose01(r.output);
  }

  if (call.need_weights) {
    // view(B, H, L, S'); the selected heads and rows; mean(dim=1) when averaging.
    std::vector<int64_t> heads = call.weights_heads, rows = call.weights_rows;
    if (heads.empty())
      for (int64_t h = 0; h < H; ++h) heads.push_back(h);
    if (rows.empty())
      for (int64_t i = 0; i < L; ++i) rows.push_back(i);
    const int64_t Hs = static_cast<int64_t>(heads.size()), Ls = static_cast<int64_t>(rows.size());
    Array<T> w({B, Hs, Ls, St});
    for (int64_t bb = 0; bb < B; ++bb)
      for (int64_t h = 0; h < Hs; ++h)
        for (int64_t i = 0; i < Ls; ++i)
          for (int64_t j = 0; j < St; ++j)
            w.at(bb, h, i, j) = attn.at(bb * H + heads[static_cast<std::size_t>(h)], rows[static_cast<std::size_t>(i)], j);
    if (call.average_attn_weights) {
      Array<T> mean({B, Ls, St});
      for (int64_t bb = 0; bb < B; ++bb)
        for (int64_t i = 0; i < Ls; ++i)
          for (int64_t j = 0; j < St; ++j) {
            T sum = 0;
            for (int64_t h = 0; h < Hs; ++h) sum += w.at(bb, h, i, j);
            mean.at(bb, i, j) = sum / static_cast<T>(Hs);
          }
      w = std::move(mean);
    }
    if (!batched) w.shape.erase(w.shape.begin());  // squeeze(0)
    r.weights = std::move(w);
  }
  return r;
}

}  // namespace oracle
