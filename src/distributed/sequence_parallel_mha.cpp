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
#include "core/linear.hpp"
#include "kernels/kernel.hpp"
#include "multihead/distributed.hpp"
#include "multihead/error.hpp"

namespace multihead::distributed {
namespace {

using multihead::detail::LinearOptions;
using multihead::detail::LinearWeight;

[[noreturn]] void fail(Error::Kind kind, const std::string& message) { throw Error(kind, message); }

// Where token (b, l) of a (len, B, ·) / (B, len, ·) / (len, ·) tensor is.
struct Rows {
  bool batch_first = false;
  int64_t B = 1, len = 0;
  int64_t row(int64_t b, int64_t l) const { return batch_first ? b * len + l : l * B + b; }
};

// split_heads: X (rows × H·w, token layout) -> [B·H][len][w].
template <class T>
std::vector<T> split_heads(const T* x, const Rows& rows, int64_t H, int64_t w) {
  std::vector<T> out(static_cast<std::size_t>(rows.B * H * rows.len * w));
  for (int64_t b = 0; b < rows.B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < rows.len; ++l) {
        const T* src = x + rows.row(b, l) * H * w + h * w;
        std::copy(src, src + w, out.data() + ((b * H + h) * rows.len + l) * w);
      }
  return out;
}

// merge_heads: [B·H][len][w] -> (rows × H·w) in the token layout.
template <class T>
void merge_heads(const T* heads, const Rows& rows, int64_t H, int64_t w, T* x) {
  for (int64_t b = 0; b < rows.B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < rows.len; ++l) {
        const T* src = heads + ((b * H + h) * rows.len + l) * w;
        std::copy(src, src + w, x + rows.row(b, l) * H * w + h * w);
      }
}

// Ulysses' all-to-all, rows -> heads: [B·H][n_r][w], the rank's contiguous
// rows of every head, to [B·Hp][n][w], every row of heads [r·Hp, (r+1)·Hp).
// Blocks are padded to ⌈n/P⌉ rows, as MPI_Alltoall wants equal blocks.
template <class T>
std::vector<T> rows_to_heads(Communicator& comm, const std::vector<T>& local, int64_t B, int64_t H, int64_t n,
                             int64_t w) {
  const int P = comm.size(), r = comm.rank();
  const int64_t Hp = H / P, pad = (n + P - 1) / P, mine = share_of(n, P, r).count;
  const int64_t block = B * Hp * pad * w;
  std::vector<T> send(static_cast<std::size_t>(block * P), T(0)), recv(send.size());
  for (int j = 0; j < P; ++j)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hp; ++h)
        std::copy(local.data() + ((b * H + j * Hp + h) * mine) * w, local.data() + ((b * H + j * Hp + h) * mine + mine) * w,
                  send.data() + j * block + ((b * Hp + h) * pad) * w);
  comm.all_to_all(send.data(), recv.data(), block);
  std::vector<T> out(static_cast<std::size_t>(B * Hp * n * w));
  for (int j = 0; j < P; ++j) {
    const Share s = share_of(n, P, j);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hp; ++h)
        std::copy(recv.data() + j * block + ((b * Hp + h) * pad) * w,
                  recv.data() + j * block + ((b * Hp + h) * pad + s.count) * w,
                  out.data() + ((b * Hp + h) * n + s.begin) * w);
  }
  return out;
}

// The inverse: [B·Hp][n][w] of the rank's heads -> [B·H][n_r][w] of its rows.
template <class T>
std::vector<T> heads_to_rows(Communicator& comm, const T* heads, int64_t B, int64_t H, int64_t n, int64_t w) {
  const int P = comm.size(), r = comm.rank();
  const int64_t Hp = H / P, pad = (n + P - 1) / P, mine = share_of(n, P, r).count;
  const int64_t block = B * Hp * pad * w;
  std::vector<T> send(static_cast<std::size_t>(block * P), T(0)), recv(send.size());
  for (int j = 0; j < P; ++j) {
    const Share s = share_of(n, P, j);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hp; ++h)
        std::copy(heads + ((b * Hp + h) * n + s.begin) * w, heads + ((b * Hp + h) * n + s.end()) * w,
                  send.data() + j * block + ((b * Hp + h) * pad) * w);
  }
  comm.all_to_all(send.data(), recv.data(), block);
  std::vector<T> out(static_cast<std::size_t>(B * H * mine * w));
  for (int j = 0; j < P; ++j)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hp; ++h)
        std::copy(recv.data() + j * block + ((b * Hp + h) * pad) * w,
                  recv.data() + j * block + ((b * Hp + h) * pad + mine) * w,
                  out.data() + ((b * H + j * Hp + h) * mine) * w);
  return out;
}

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
    if (config.add_bias_kv)
      fail(Error::Kind::Value, "add_bias_kv: not supported in sequence parallel (bias_k / bias_v are keys "
                               "without a position), got true");
    if (config.add_zero_attn)
      fail(Error::Kind::Value, "add_zero_attn: not supported in sequence parallel (the zero key has no "
                               "position), got true");
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
    // Masks in kernel layout: additive, the rank's query rows (ring) or all
    // rows of its heads (Ulysses).
    s.attn_mask.clear();
    s.key_padding.clear();
    s.attn_mask_slices = 1;
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
      } else {
        s.attn_mask_slices = M == 1 ? 1 : B * Hp;
        for (int64_t b = 0; b < (M == 1 ? 1 : B); ++b)
          for (int64_t h = 0; h < (M == 1 ? 1 : Hp); ++h) {
            const int64_t n = M == 1 ? 0 : b * H + r * Hp + h;
            s.attn_mask.insert(s.attn_mask.end(), add.data() + n * L * S, add.data() + (n + 1) * L * S);
          }
      }
    }
    if (const Mask<T>* m = options.key_padding_mask) {
      const Shape want = batched ? Shape{B, S} : Shape{S};
      if (m->shape() != want)
        fail(Error::Kind::Shape, "key_padding_mask: expected the whole mask " + shape_to_string(want) + ", got " +
                                     shape_to_string(m->shape()));
      const Tensor<T> add = m->to_additive();
      s.key_padding.assign(add.data(), add.data() + add.numel());
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
    RingAttentionInputs<T> in;
    in.batch = B;
    in.heads = H;
    in.q_len = L;
    in.kv_len = S;
    in.head_dim = D;
    in.value_dim = D;
    in.order = order_;
    in.q = s.q.data();
    in.k = s.k.data();
    in.v = s.v.data();
    in.attn_mask = s.attn_mask.empty() ? nullptr : s.attn_mask.data();
    in.attn_mask_slices = s.attn_mask_slices;
    in.key_padding = s.key_padding.empty() ? nullptr : s.key_padding.data();
    s.out.resize(static_cast<std::size_t>(N * L_r * D));
    s.lse.resize(static_cast<std::size_t>(N * L_r));
    ring_attention_forward(comm, in, s.attention, s.out.data(), s.lse.data());
    heads_out = s.out;
  } else {
    const int64_t Hp = H / P, Np = B * Hp;
    s.q = rows_to_heads(comm, s.q, B, H, L, D);
    s.k = rows_to_heads(comm, s.k, B, H, S, D);
    s.v = rows_to_heads(comm, s.v, B, H, S, D);
    s.out.assign(static_cast<std::size_t>(Np * L * D), T(0));
    s.lse.assign(static_cast<std::size_t>(Np * L), T(0));
    comm.agree([&] {
      multihead::detail::AttentionShape shape{Np, Hp, L, S, D, D, S, 0};
      multihead::detail::AttentionTensors<T> t;
      t.q = s.q.data();
      t.k = s.k.data();
      t.v = s.v.data();
      t.attn_mask = s.attn_mask.empty() ? nullptr : s.attn_mask.data();
      t.attn_mask_slice_stride = s.attn_mask_slices == 1 ? 0 : L * S;
      t.key_padding = s.key_padding.empty() ? nullptr : s.key_padding.data();
      std::vector<T> slopes(s.attention.alibi_slopes.begin(), s.attention.alibi_slopes.end());
      t.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
      t.out = s.out.data();
      auto a = multihead::detail::make_attention_args(shape, t, s.attention);
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
    if (!s.filled) fail(Error::Kind::Value, "saved: expected the context of a training forward, got an empty one");
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
  if (mode_ == SequenceMode::Ring) {
    RingAttentionInputs<T> in;
    in.batch = B;
    in.heads = H;
    in.q_len = L;
    in.kv_len = S;
    in.head_dim = D;
    in.value_dim = D;
    in.order = order_;
    in.q = s.q.data();
    in.k = s.k.data();
    in.v = s.v.data();
    in.attn_mask = s.attn_mask.empty() ? nullptr : s.attn_mask.data();
    in.attn_mask_slices = s.attn_mask_slices;
    in.key_padding = s.key_padding.empty() ? nullptr : s.key_padding.data();
    ring_attention_backward(comm, in, s.attention, s.out.data(), s.lse.data(), d_heads.data(), dq.data(), dk.data(),
                            dv.data());
  } else {
    const int64_t Hp = H / P, Np = B * Hp;
    const std::vector<T> d_out_u = rows_to_heads(comm, d_heads, B, H, L, D);
    std::vector<T> dq_u(static_cast<std::size_t>(Np * L * D)), dk_u(static_cast<std::size_t>(Np * S * D)),
        dv_u(dk_u.size());
    comm.agree([&] {
      multihead::detail::AttentionShape shape{Np, Hp, L, S, D, D, S, 0};
      multihead::detail::AttentionTensors<T> t;
      t.q = s.q.data();
      t.k = s.k.data();
      t.v = s.v.data();
      t.attn_mask = s.attn_mask.empty() ? nullptr : s.attn_mask.data();
      t.attn_mask_slice_stride = s.attn_mask_slices == 1 ? 0 : L * S;
      t.key_padding = s.key_padding.empty() ? nullptr : s.key_padding.data();
      std::vector<T> slopes(s.attention.alibi_slopes.begin(), s.attention.alibi_slopes.end());
      t.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
      t.out = const_cast<T*>(s.out.data());
      multihead::detail::AttentionBackwardArgs<T> b;
      b.forward = multihead::detail::make_attention_args(shape, t, s.attention);
      b.lse = s.lse.data();
      b.d_out = d_out_u.data();
      b.d_q = dq_u.data();
      b.d_k = dk_u.data();
      b.d_v = dv_u.data();
      multihead::detail::run_attention_backward(
          b, multihead::detail::resolve_forward_kernel<T>(s.attention.kernel, false));
    });
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
  // Σ over ranks, one message, rank order.
  std::vector<T> all;
  for (auto& [name, t] : g.parameters) all.insert(all.end(), t.data(), t.data() + t.numel());
  comm.all_reduce_sum(all.data(), static_cast<int64_t>(all.size()));
  std::size_t at = 0;
  for (auto& [name, t] : g.parameters) {
    std::copy(all.data() + at, all.data() + at + t.numel(), t.data());
    at += static_cast<std::size_t>(t.numel());
  }
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
