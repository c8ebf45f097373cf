// src/distributed/sequence_parallel_mha.cpp: torch.nn.MultiheadAttention with
// the sequence split across the ranks, by ring attention or by Ulysses.
//
// Rank r holds rows of the query (its positions of L) and of key / value (its
// positions of S), and the whole parameters. Per rank, F.multi_head_attention_forward's steps:
//   1. in_projection of its rows          Q_r = query_r W_qᵀ + b_q  (K_r, V_r likewise)
//   2. split_heads                        [B·H][L_r][D]
//   3. attention over all S keys:
//        ring:    ring_attention_forward (K/V blocks travel around the ring)
//        Ulysses: all-to-all to [B·H/P][L][D] (every row of H/P heads), the
//                 kernel, all-to-all back (Jacobs et al. 2023)
//   4. merge_heads, out_projection of its rows
// Backward: the same in reverse; each rank's parameter gradients (its rows'
// share) are summed over the ranks in rank order (one all-reduce), so every
// rank ends with the whole module's.
//
// Legend: P ranks, B batch, L / S the whole query / key lengths, L_r / S_r
// this rank's rows, E embed_dim, H heads, D head width, Ek kdim, Ev vdim,
// Hp = H / P (Ulysses).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attention/attention_call.hpp"
#include "distributed/sequence_layout.hpp"
#include "core/check.hpp"
#include "core/linear.hpp"
#include "kernels/kernel.hpp"
#include "multihead/distributed.hpp"
#include "multihead/error.hpp"

namespace multihead::distributed {
namespace {

using multihead::detail::LinearOptions;
using multihead::detail::LinearWeight;
using detail::heads_to_rows;
using detail::merge_heads;
using detail::Rows;
using detail::rows_to_heads;
using detail::split_heads;

[[noreturn]] void fail(Error::Kind kind, const std::string& message) { throw Error(kind, message); }

template <class T>
struct Projections {
  LinearWeight<T> q, k, v, o;
  const T *bq = nullptr, *bk = nullptr, *bv = nullptr, *bo = nullptr;
};

template <class T>
Projections<T> projections(const MultiheadAttentionConfig& c, const MultiheadAttentionParameters<T>& p) {
  const int64_t E = c.embed_dim, Ek = c.key_dim(), Ev = c.value_dim();
  Projections<T> w;
  if (c.same_embed_dim()) {
    const T* base = p.in_proj_weight.data();
    w.q = LinearWeight<T>::stored(base, E, E);
    w.k = LinearWeight<T>::stored(base + E * E, E, E);
    w.v = LinearWeight<T>::stored(base + 2 * E * E, E, E);
  } else {
    w.q = LinearWeight<T>::stored(p.q_proj_weight.data(), E, E);
    w.k = LinearWeight<T>::stored(p.k_proj_weight.data(), E, Ek);
    w.v = LinearWeight<T>::stored(p.v_proj_weight.data(), E, Ev);
  }
  w.o = LinearWeight<T>::stored(p.out_proj_weight.data(), E, E);
  if (c.bias) {
    w.bq = p.in_proj_bias.data();
    w.bk = w.bq + E;
    w.bv = w.bq + 2 * E;
    w.bo = p.out_proj_bias.data();
  }
  return w;
}

// The extra keys of slice (b, h) in [slices][extra][D] layout: bias_k (or
// bias_v) first when present, then the zero key.
template <class T>
std::vector<T> extra_keys(const T* bias, bool zero, int64_t B, int64_t first_head, int64_t heads, int64_t D) {
  const int64_t extra = (bias ? 1 : 0) + (zero ? 1 : 0);
  std::vector<T> out(static_cast<std::size_t>(B * heads * extra * D), T(0));
  if (bias)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < heads; ++h)
        std::copy(bias + (first_head + h) * D, bias + (first_head + h + 1) * D,
                  out.data() + (b * heads + h) * extra * D);
  return out;
}

// The opposite: d bias[(first_head + h)·D + d] += Σ_b d_keys[b·heads + h][0][d]
// (the bias is each slice's first extra key).
template <class T>
void add_bias_gradient(const T* d_keys, int64_t B, int64_t heads, int64_t first_head, int64_t extra, int64_t D,
                       T* d_bias) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t d = 0; d < D; ++d) d_bias[(first_head + h) * D + d] += d_keys[((b * heads + h) * extra) * D + d];
}

// The ring's inputs from a forward's saved context.
template <class T>
RingAttentionInputs<T> ring_inputs(const SequenceParallelContext<T>& s, int64_t B, int64_t H, int64_t L, int64_t S,
                                   int64_t D, RingOrder order) {
  RingAttentionInputs<T> in = detail::ring_heads(B, H, H, L, S, D, order, s.q, s.k, s.v);
  in.attn_mask = s.attn_mask.empty() ? nullptr : s.attn_mask.data();
  in.attn_mask_slices = s.attn_mask_slices;
  in.key_padding = s.key_padding.empty() ? nullptr : s.key_padding.data();
  in.extra_k = s.extra_k.empty() ? nullptr : s.extra_k.data();
  in.extra_v = s.extra_v.empty() ? nullptr : s.extra_v.data();
  in.extra_len = s.extra;
  return in;
}

// Ulysses' kernel call on the rank's Hp heads, every row: L queries against
// St = S + extra keys (the extra ones without a position).
template <class T>
struct UlyssesCall {
  multihead::detail::AttentionShape shape;
  multihead::detail::AttentionTensors<T> t;
  std::vector<T> slopes;
  UlyssesCall(const SequenceParallelContext<T>& s, int64_t Np, int64_t Hp, int64_t L, int64_t S, int64_t D)
      : shape{Np, Hp, L, S + s.extra, D, D, S, 0},
        slopes(s.attention.alibi_slopes.begin(), s.attention.alibi_slopes.end()) {
    t.q = s.q.data();
    t.k = s.k.data();
    t.v = s.v.data();
    t.attn_mask = s.attn_mask.empty() ? nullptr : s.attn_mask.data();
    t.attn_mask_slice_stride = s.attn_mask_slices == 1 ? 0 : L * (S + s.extra);
    t.key_padding = s.key_padding.empty() ? nullptr : s.key_padding.data();
    t.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
  }
  UlyssesCall(const UlyssesCall&) = delete;
};

// [n][len][w] -> [n][len + extra][w], slice i's extra rows from keys[i] ([n][extra][w]).
template <class T>
std::vector<T> append_rows(const std::vector<T>& x, const std::vector<T>& keys, int64_t n, int64_t len,
                           int64_t extra, int64_t w) {
  std::vector<T> out(static_cast<std::size_t>(n * (len + extra) * w));
  for (int64_t i = 0; i < n; ++i) {
    std::copy(x.data() + i * len * w, x.data() + (i + 1) * len * w, out.data() + i * (len + extra) * w);
    std::copy(keys.data() + i * extra * w, keys.data() + (i + 1) * extra * w,
              out.data() + (i * (len + extra) + len) * w);
  }
  return out;
}

}  // namespace

template <class T>
SequenceParallelMultiheadAttention<T>::SequenceParallelMultiheadAttention(Communicator& comm,
                                                                          const MultiheadAttentionConfig& config,
                                                                          const MultiheadAttentionParameters<T>& whole,
                                                                          SequenceMode mode, bool causal_balance)
    : comm_(&comm), config_(config), params_(whole), mode_(mode) {
  order_ = mode == SequenceMode::Ring && causal_balance ? RingOrder::ZigZag : RingOrder::Contiguous;
  comm.agree([&] {
    config.validate();
    validate_parameters(config, whole);
    if (mode == SequenceMode::Ulysses && config.num_heads % comm.size() != 0)
      fail(Error::Kind::Value, "ranks: expected a divisor of num_heads = " + std::to_string(config.num_heads) +
                                   " in Ulysses (each rank takes H/P heads), got " + std::to_string(comm.size()));
  });
}

template <class T>
ForwardResult<T> SequenceParallelMultiheadAttention<T>::forward(const Tensor<T>& query, const Tensor<T>& key,
                                                                const Tensor<T>& value, int64_t L, int64_t S,
                                                                const ForwardOptions<T>& options) const {
  return run(query, key, value, L, S, options, nullptr);
}
template <class T>
ForwardResult<T> SequenceParallelMultiheadAttention<T>::forward(const Tensor<T>& query, const Tensor<T>& key,
                                                                const Tensor<T>& value, int64_t L, int64_t S,
                                                                const ForwardOptions<T>& options,
                                                                SequenceParallelContext<T>& save) const {
  return run(query, key, value, L, S, options, &save);
}

template <class T>
ForwardResult<T> SequenceParallelMultiheadAttention<T>::run(const Tensor<T>& query, const Tensor<T>& key,
                                                            const Tensor<T>& value, int64_t L, int64_t S,
                                                            const ForwardOptions<T>& options,
                                                            SequenceParallelContext<T>* save) const {
  Communicator& comm = *comm_;
  const MultiheadAttentionConfig& c = config_;
  const int P = comm.size(), r = comm.rank();
  const int64_t E = c.embed_dim, H = c.num_heads, D = c.head_dim(), Ek = c.key_dim(), Ev = c.value_dim();
  const int64_t L_r = ring_rows(L, P, r, order_), S_r = ring_rows(S, P, r, order_);
  const bool batched = query.dim() == 3;
  const int64_t B = batched ? query.size(c.batch_first ? 0 : 1) : 1;
  const Rows q_rows{c.batch_first, B, L_r}, kv_rows{c.batch_first, B, S_r};
  const Projections<T> w = projections(c, params_);
  const LinearOptions lin{false, options.attention.num_threads};
  const int64_t extra = (c.add_bias_kv ? 1 : 0) + (c.add_zero_attn ? 1 : 0);
  const T* bias_k = c.add_bias_kv ? params_.bias_k.data() : nullptr;
  const T* bias_v = c.add_bias_kv ? params_.bias_v.data() : nullptr;
  SequenceParallelContext<T> local;
  SequenceParallelContext<T>& s = save ? *save : local;
  comm.agree([&] {
    const auto shape = [&](int64_t len, int64_t width) {
      if (!batched) return Shape{len, width};
      return c.batch_first ? Shape{B, len, width} : Shape{len, B, width};
    };
    const auto expect = [&](const char* name, const Tensor<T>& t, const Shape& want, const char* what) {
      if (t.shape() != want)
        fail(Error::Kind::Shape, std::string(name) + ": expected this rank's rows " + shape_to_string(want) + " (" +
                                     what + "), got " + shape_to_string(t.shape()));
    };
    if (query.dim() != 2 && query.dim() != 3)
      fail(Error::Kind::Shape, "query: expected 2 or 3 dimensions, got " + shape_to_string(query.shape()));
    if (P > L)
      fail(Error::Kind::Value, "ranks: expected at most L = " + std::to_string(L) + " ranks in sequence parallel "
                               "(each rank needs a query row), got " + std::to_string(P));
    expect("query", query, shape(L_r, E), "its positions of L");
    expect("key", key, shape(S_r, Ek), "its positions of S");
    expect("value", value, shape(S_r, Ev), "its positions of S");
    if (options.training && c.dropout > 0)
      fail(Error::Kind::Value, "dropout: expected 0 while training in sequence parallel, got " +
                                   std::to_string(c.dropout));
    if (options.need_weights)
      fail(Error::Kind::Value, "need_weights: not supported in sequence parallel (no rank holds a whole row of "
                               "scores), got true");
    if (!options.attention.alibi_slopes.empty())
      fail(Error::Kind::Value, "attention.alibi_slopes: expected none (use ForwardOptions::alibi)");
    multihead::detail::validate_attention_options(options.attention);
    // check_finite: this rank's rows (indices in the whole sequence), the
    // masks and the parameters, which every rank holds whole.
    if (options.attention.check_finite) {
      const int64_t position_dim = batched && c.batch_first ? 1 : 0;
      const auto positions = [&](int64_t n) {
        std::vector<int64_t> at;
        for (const Share& g : ring_segments(n, P, r, order_))
          for (int64_t p = g.begin; p < g.end(); ++p) at.push_back(p);
        return at;
      };
      multihead::detail::check_finite("query", query, position_dim, positions(L));
      multihead::detail::check_finite("key", key, position_dim, positions(S));
      multihead::detail::check_finite("value", value, position_dim, positions(S));
      multihead::detail::check_masks_finite(options.key_padding_mask, options.attn_mask);
      for_each_parameter(c, params_, [](const ParameterInfo& info, const Tensor<T>& t) {
        multihead::detail::check_finite(info.name, t);
      });
    }
    // Masks in kernel layout: additive, the rank's query rows (ring) or all
    // rows of its heads (Ulysses).
    s.attn_mask.clear();
    s.key_padding.clear();
    s.attn_mask_slices = 1;
    s.extra = extra;
    const std::vector<Share> q_segments = ring_segments(L, P, r, order_);
    const int64_t Hp = mode_ == SequenceMode::Ulysses ? H / P : H;
    if (const Mask<T>* m = options.attn_mask) {
      const Shape two = {L, S}, three = {B * H, L, S};
      if (m->shape() != two && m->shape() != three)
        fail(Error::Kind::Shape, "attn_mask: expected the whole mask " + shape_to_string(two) + " or " +
                                     shape_to_string(three) + ", got " + shape_to_string(m->shape()));
      const Tensor<T> add = m->to_additive();
      const int64_t M = add.dim() == 3 ? B * H : 1;
      if (mode_ == SequenceMode::Ring) {
        s.attn_mask_slices = M;
        for (int64_t n = 0; n < M; ++n)
          for (const Share& seg : q_segments)
            s.attn_mask.insert(s.attn_mask.end(), add.data() + (n * L + seg.begin) * S,
                               add.data() + (n * L + seg.end()) * S);
      } else {  // every row, padded with zeros for the extra keys
        s.attn_mask_slices = M == 1 ? 1 : B * Hp;
        for (int64_t b = 0; b < (M == 1 ? 1 : B); ++b)
          for (int64_t h = 0; h < (M == 1 ? 1 : Hp); ++h) {
            const int64_t n = M == 1 ? 0 : b * H + r * Hp + h;
            for (int64_t i = 0; i < L; ++i) {
              s.attn_mask.insert(s.attn_mask.end(), add.data() + (n * L + i) * S, add.data() + (n * L + i + 1) * S);
              s.attn_mask.insert(s.attn_mask.end(), static_cast<std::size_t>(extra), T(0));
            }
          }
      }
    }
    if (const Mask<T>* m = options.key_padding_mask) {
      const Shape want = batched ? Shape{B, S} : Shape{S};
      if (m->shape() != want)
        fail(Error::Kind::Shape, "key_padding_mask: expected the whole mask " + shape_to_string(want) + ", got " +
                                     shape_to_string(m->shape()));
      const Tensor<T> add = m->to_additive();
      s.key_padding.clear();
      const int64_t pad = mode_ == SequenceMode::Ulysses ? extra : 0;  // the ring's extra block has no mask
      for (int64_t b = 0; b < B; ++b) {
        s.key_padding.insert(s.key_padding.end(), add.data() + b * S, add.data() + (b + 1) * S);
        s.key_padding.insert(s.key_padding.end(), static_cast<std::size_t>(pad), T(0));
      }
    }
    s.attention = options.attention;
    if (options.alibi) {
      const std::vector<double> slopes = alibi_slopes(H);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hp; ++h)
          s.attention.alibi_slopes.push_back(slopes[static_cast<std::size_t>(mode_ == SequenceMode::Ulysses ? r * Hp + h : h)]);
    }
    // 1-2. in_projection of the rank's rows, split_heads.
    std::vector<T> qp(static_cast<std::size_t>(B * L_r * E)), kp(static_cast<std::size_t>(B * S_r * E)),
        vp(kp.size());
    multihead::detail::linear_forward<T>({B * L_r, query.data(), E}, w.q, w.bq, qp.data(), E, lin);
    multihead::detail::linear_forward<T>({B * S_r, key.data(), Ek}, w.k, w.bk, kp.data(), E, lin);
    multihead::detail::linear_forward<T>({B * S_r, value.data(), Ev}, w.v, w.bv, vp.data(), E, lin);
    s.q = split_heads(qp.data(), q_rows, H, D);
    s.k = split_heads(kp.data(), kv_rows, H, D);
    s.v = split_heads(vp.data(), kv_rows, H, D);
  });
  // 3. attention over every key.
  const int64_t N = B * H;
  std::vector<T> heads_out;
  if (mode_ == SequenceMode::Ring) {
    s.extra_k = extra_keys(bias_k, c.add_zero_attn, B, 0, H, D);
    s.extra_v = extra_keys(bias_v, c.add_zero_attn, B, 0, H, D);
    s.out.resize(static_cast<std::size_t>(N * L_r * D));
    s.lse.resize(static_cast<std::size_t>(N * L_r));
    ring_attention_forward(comm, ring_inputs(s, B, H, L, S, D, order_), s.attention, s.out.data(), s.lse.data());
    heads_out = s.out;
  } else {
    const int64_t Hp = H / P, Np = B * Hp;
    s.q = rows_to_heads(comm, s.q, B, H, L, D);
    s.k = rows_to_heads(comm, s.k, B, H, S, D);
    s.v = rows_to_heads(comm, s.v, B, H, S, D);
    if (extra > 0) {  // the rank's heads' extra keys after their S keys
      s.k = append_rows(s.k, extra_keys(bias_k, c.add_zero_attn, B, r * Hp, Hp, D), Np, S, extra, D);
      s.v = append_rows(s.v, extra_keys(bias_v, c.add_zero_attn, B, r * Hp, Hp, D), Np, S, extra, D);
    }
    s.out.assign(static_cast<std::size_t>(Np * L * D), T(0));
    s.lse.assign(static_cast<std::size_t>(Np * L), T(0));
    comm.agree([&] {
      UlyssesCall<T> call(s, Np, Hp, L, S, D);
      call.t.out = s.out.data();
      auto a = multihead::detail::make_attention_args(call.shape, call.t, s.attention);
      a.lse = s.lse.data();
      multihead::detail::run_attention_forward(
          a, multihead::detail::resolve_forward_kernel<T>(s.attention.kernel, false));
    });
    heads_out = heads_to_rows(comm, s.out.data(), B, H, L, D);
  }
  // 4. merge_heads, out_projection of the rank's rows.
  s.concat.assign(static_cast<std::size_t>(B * L_r * E), T(0));
  merge_heads(heads_out.data(), q_rows, H, D, s.concat.data());
  ForwardResult<T> result;
  result.output = Tensor<T>(query.shape());
  multihead::detail::linear_forward<T>({B * L_r, s.concat.data(), E}, w.o, w.bo, result.output.data(), E, lin);
  if (save) {
    s.query = query;
    s.key = key;
    s.value = value;
    s.output_shape = query.shape();
    s.filled = true;
  }
  (void)S_r;
  return result;
}

template <class T>
MultiheadAttentionGradients<T> SequenceParallelMultiheadAttention<T>::backward(const SequenceParallelContext<T>& s,
                                                                               const Tensor<T>& d_output) const {
  Communicator& comm = *comm_;
  const MultiheadAttentionConfig& c = config_;
  const int P = comm.size(), r = comm.rank();
  const int64_t E = c.embed_dim, H = c.num_heads, D = c.head_dim(), Ek = c.key_dim(), Ev = c.value_dim();
  comm.agree([&] {
    if (!s.filled) fail(Error::Kind::Value, "context: expected the context of a training forward, got an empty one");
    if (d_output.shape() != s.output_shape)
      fail(Error::Kind::Shape, "d_output: expected this rank's rows " + shape_to_string(s.output_shape) +
                                   ", got " + shape_to_string(d_output.shape()));
  });
  const bool batched = s.query.dim() == 3;
  const int64_t B = batched ? s.query.size(c.batch_first ? 0 : 1) : 1;
  const int64_t L_r = s.query.size(batched && c.batch_first ? 1 : 0), S_r = s.key.size(batched && c.batch_first ? 1 : 0);
  const int64_t L = [&] {
    int64_t n = L_r;
    comm.all_reduce_sum(&n, 1);
    return n;
  }();
  const int64_t S = [&] {
    int64_t n = S_r;
    comm.all_reduce_sum(&n, 1);
    return n;
  }();
  const Rows q_rows{c.batch_first, B, L_r}, kv_rows{c.batch_first, B, S_r};
  const Projections<T> w = projections(c, params_);
  const LinearOptions lin{false, s.attention.num_threads};
  MultiheadAttentionGradients<T> g;
  // The whole module's gradients, this rank's share (summed over ranks below).
  for_each_parameter(c, [&](const ParameterInfo& info) {
    if (info.present) g.parameters[info.name] = Tensor<T>(info.shape, T(0));
  });
  const bool packed = c.same_embed_dim();
  T* d_wq = packed ? g.parameters["in_proj_weight"].data() : g.parameters["q_proj_weight"].data();
  T* d_wk = packed ? d_wq + E * E : g.parameters["k_proj_weight"].data();
  T* d_wv = packed ? d_wq + 2 * E * E : g.parameters["v_proj_weight"].data();
  T* d_b = c.bias ? g.parameters["in_proj_bias"].data() : nullptr;
  // In the forward: output = concat W^Oᵀ + b^O.
  std::vector<T> d_concat(static_cast<std::size_t>(B * L_r * E));
  multihead::detail::linear_backward<T>({B * L_r, s.concat.data(), E}, w.o, d_output.data(), E,
                                        {d_concat.data(), E, g.parameters["out_proj.weight"].data(),
                                         c.bias ? g.parameters["out_proj.bias"].data() : nullptr},
                                        lin);
  std::vector<T> d_heads = split_heads(d_concat.data(), q_rows, H, D);
  const int64_t N = B * H;
  std::vector<T> dq(static_cast<std::size_t>(N * L_r * D)), dk(static_cast<std::size_t>(N * S_r * D)), dv(dk.size());
  const int64_t extra = s.extra;
  T* d_bias_k = c.add_bias_kv ? g.parameters["bias_k"].data() : nullptr;
  T* d_bias_v = c.add_bias_kv ? g.parameters["bias_v"].data() : nullptr;
  if (mode_ == SequenceMode::Ring) {
    std::vector<T> d_extra_k(s.extra_k.size()), d_extra_v(s.extra_v.size());
    ring_attention_backward(comm, ring_inputs(s, B, H, L, S, D, order_), s.attention, s.out.data(), s.lse.data(),
                            d_heads.data(), dq.data(), dk.data(), dv.data(), d_extra_k.data(), d_extra_v.data());
    if (d_bias_k) {  // this rank's queries' share (the all-reduce below sums the ranks')
      add_bias_gradient(d_extra_k.data(), B, H, 0, extra, D, d_bias_k);
      add_bias_gradient(d_extra_v.data(), B, H, 0, extra, D, d_bias_v);
    }
  } else {
    const int64_t Hp = H / P, Np = B * Hp, St = S + extra;
    const std::vector<T> d_out_u = rows_to_heads(comm, d_heads, B, H, L, D);
    std::vector<T> dq_u(static_cast<std::size_t>(Np * L * D)), dk_u(static_cast<std::size_t>(Np * St * D)),
        dv_u(dk_u.size());
    comm.agree([&] {
      UlyssesCall<T> call(s, Np, Hp, L, S, D);
      call.t.out = const_cast<T*>(s.out.data());
      detail::ulysses_backward(multihead::detail::make_attention_args(call.shape, call.t, s.attention),
                               s.lse.data(), d_out_u.data(), dq_u.data(), dk_u.data(), dv_u.data(),
                               s.attention.kernel);
    });
    if (extra > 0) {  // the extra keys' rows: d bias_k / d bias_v of the rank's heads, then dropped
      std::vector<T> ek(static_cast<std::size_t>(Np * extra * D)), ev(ek.size());
      std::vector<T> k_only(static_cast<std::size_t>(Np * S * D)), v_only(k_only.size());
      for (int64_t i = 0; i < Np; ++i) {
        std::copy(dk_u.data() + i * St * D, dk_u.data() + (i * St + S) * D, k_only.data() + i * S * D);
        std::copy(dv_u.data() + i * St * D, dv_u.data() + (i * St + S) * D, v_only.data() + i * S * D);
        std::copy(dk_u.data() + (i * St + S) * D, dk_u.data() + (i + 1) * St * D, ek.data() + i * extra * D);
        std::copy(dv_u.data() + (i * St + S) * D, dv_u.data() + (i + 1) * St * D, ev.data() + i * extra * D);
      }
      if (d_bias_k) {
        add_bias_gradient(ek.data(), B, Hp, r * Hp, extra, D, d_bias_k);
        add_bias_gradient(ev.data(), B, Hp, r * Hp, extra, D, d_bias_v);
      }
      dk_u = std::move(k_only);
      dv_u = std::move(v_only);
    }
    dq = heads_to_rows(comm, dq_u.data(), B, H, L, D);
    dk = heads_to_rows(comm, dk_u.data(), B, H, S, D);
    dv = heads_to_rows(comm, dv_u.data(), B, H, S, D);
  }
  // merge_heads, then the in-projections' backward on the rank's rows.
  std::vector<T> dqp(static_cast<std::size_t>(B * L_r * E)), dkp(static_cast<std::size_t>(B * S_r * E)), dvp(dkp.size());
  merge_heads(dq.data(), q_rows, H, D, dqp.data());
  merge_heads(dk.data(), kv_rows, H, D, dkp.data());
  merge_heads(dv.data(), kv_rows, H, D, dvp.data());
  g.query = Tensor<T>(s.query.shape());
  g.key = Tensor<T>(s.key.shape());
  g.value = Tensor<T>(s.value.shape());
  multihead::detail::linear_backward<T>({B * L_r, s.query.data(), E}, w.q, dqp.data(), E,
                                        {g.query.data(), E, d_wq, d_b}, lin);
  multihead::detail::linear_backward<T>({B * S_r, s.key.data(), Ek}, w.k, dkp.data(), E,
                                        {g.key.data(), Ek, d_wk, d_b ? d_b + E : nullptr}, lin);
  multihead::detail::linear_backward<T>({B * S_r, s.value.data(), Ev}, w.v, dvp.data(), E,
                                        {g.value.data(), Ev, d_wv, d_b ? d_b + 2 * E : nullptr}, lin);
  detail::sum_over_ranks(comm, g.parameters);  // one message, rank order
  (void)r;
  return g;
}

template <class T>
Tensor<T> take_positions(const Tensor<T>& t, bool batch_first, const std::vector<Share>& segments) {
  const bool batched = t.dim() == 3;
  const int64_t w = t.size(-1), B = batched ? t.size(batch_first ? 0 : 1) : 1;
  const int64_t len = t.size(batched && batch_first ? 1 : 0);
  int64_t n = 0;
  for (const Share& s : segments) n += s.count;
  Shape shape = t.shape();
  shape[batched && batch_first ? 1 : 0] = n;
  Tensor<T> out(shape);
  const Rows from{batch_first, B, len}, to{batch_first, B, n};
  int64_t l2 = 0;
  for (const Share& s : segments)
    for (int64_t l = s.begin; l < s.end(); ++l, ++l2)
      for (int64_t b = 0; b < B; ++b)
        std::copy(t.data() + from.row(b, l) * w, t.data() + (from.row(b, l) + 1) * w, out.data() + to.row(b, l2) * w);
  return out;
}

template <class T>
Tensor<T> gather_positions(Communicator& comm, const Tensor<T>& local, bool batch_first, int64_t len,
                           RingOrder order) {
  const int P = comm.size();
  const bool batched = local.dim() == 3;
  const int64_t w = local.size(-1), B = batched ? local.size(batch_first ? 0 : 1) : 1;
  int64_t most = 0;
  for (int j = 0; j < P; ++j) most = std::max(most, ring_rows(len, P, j, order));
  // Each rank's rows as [row][B][w], padded to `most` rows.
  const int64_t block = most * B * w;
  std::vector<T> mine(static_cast<std::size_t>(block), T(0)), all(static_cast<std::size_t>(block * P));
  const Rows lr{batch_first, B, ring_rows(len, P, comm.rank(), order)};
  for (int64_t l = 0; l < lr.len; ++l)
    for (int64_t b = 0; b < B; ++b)
      std::copy(local.data() + lr.row(b, l) * w, local.data() + (lr.row(b, l) + 1) * w, mine.data() + (l * B + b) * w);
  comm.all_gather(mine.data(), all.data(), block);
  Shape shape = local.shape();
  shape[batched && batch_first ? 1 : 0] = len;
  Tensor<T> out(shape);
  const Rows wr{batch_first, B, len};
  for (int j = 0; j < P; ++j) {
    int64_t l2 = 0;
    for (const Share& s : ring_segments(len, P, j, order))
      for (int64_t l = s.begin; l < s.end(); ++l, ++l2)
        for (int64_t b = 0; b < B; ++b)
          std::copy(all.data() + j * block + (l2 * B + b) * w, all.data() + j * block + (l2 * B + b + 1) * w,
                    out.data() + wr.row(b, l) * w);
  }
  return out;
}

template Tensor<float> take_positions(const Tensor<float>&, bool, const std::vector<Share>&);
template Tensor<double> take_positions(const Tensor<double>&, bool, const std::vector<Share>&);
template Tensor<float> gather_positions(Communicator&, const Tensor<float>&, bool, int64_t, RingOrder);
template Tensor<double> gather_positions(Communicator&, const Tensor<double>&, bool, int64_t, RingOrder);

template class SequenceParallelMultiheadAttention<float>;
template class SequenceParallelMultiheadAttention<double>;

}  // namespace multihead::distributed
