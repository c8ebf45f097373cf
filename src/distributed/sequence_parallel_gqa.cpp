// src/distributed/sequence_parallel_gqa.cpp: GroupedQueryAttention (Llama's
// attention) with the sequence split across the ranks, by ring attention or
// by Ulysses. Self-attention: query and key rows are the same positions.
//
// Rank r holds rows of x (its positions of L) and the whole parameters. Per
// rank, the module's steps (src/attention/grouped_query_attention.cpp):
//   1. q = x W_qᵀ + b_q (B·L_r, H·D); k, v (B·L_r, Hkv·D)
//   2. split_heads; RoPE on q and k at the rows' global positions (segment
//      by segment: a zig-zag rank holds two)
//   3. attention over all L keys, causal bottom-right (config.causal; L = S,
//      so the same as top-left), K/V heads grouped:
//        ring:    ring_attention_forward with kv_heads = Hkv: a K/V block
//                 carries the rank's rows of every K/V head, read by its
//                 H/Hkv query heads where it arrives
//        Ulysses: P divides Hkv; all-to-alls give rank r every row of K/V
//                 heads [r·Hkv/P, (r+1)·Hkv/P) and of the query heads that
//                 read them, [r·H/P, (r+1)·H/P): a K/V head travels with its
//                 whole group
//   4. merge_heads, o_proj on the rank's rows
// Backward: the same in reverse (RoPE by its transpose); the parameter
// gradients are summed over the ranks in rank order (one all-reduce).
//
// Legend: P ranks, B batch, L the whole length, L_r this rank's rows, E
// embed_dim, H heads, Hkv K/V heads, D head width, Hp = H/P, Gp = Hkv/P.
#include <algorithm>
#include <string>
#include <vector>

#include "attention/attention_call.hpp"
#include "attention/rope.hpp"
#include "core/check.hpp"
#include "core/linear.hpp"
#include "distributed/sequence_layout.hpp"
#include "kernels/kernel.hpp"
#include "multihead/distributed.hpp"
#include "multihead/error.hpp"

namespace multihead::distributed {
namespace {

using detail::heads_to_rows;
using detail::merge_heads;
using detail::Rows;
using detail::rows_to_heads;
using detail::split_heads;
using multihead::detail::LinearOptions;
using multihead::detail::LinearWeight;

[[noreturn]] void fail(Error::Kind kind, const std::string& message) { throw Error(kind, message); }

template <class T>
LinearWeight<T> weight(const Tensor<T>& w) {
  return LinearWeight<T>::stored(w.data(), w.size(0), w.size(1));
}
template <class T>
const T* bias(const Tensor<T>& b) {
  return b.numel() > 0 && b.dim() == 1 ? b.data() : nullptr;
}

// RoPE (or its transpose) on heads [slices][n][D] whose rows are this rank's
// segments, each at its global positions.
template <class T>
void rope_rows(std::vector<T>& heads, int64_t slices, int64_t n, int64_t D, const std::vector<Share>& segments,
               const RopeOptions& rope, bool backward) {
  for (int64_t i = 0; i < slices; ++i) {
    int64_t row = 0;
    for (const Share& seg : segments) {
      RopeOptions o = rope;
      o.position_offset = seg.begin;
      T* x = heads.data() + (i * n + row) * D;
      if (backward) multihead::detail::rope_backward_in_place(x, 1, seg.count, 1, D, o);
      else multihead::detail::rope_in_place(x, 1, seg.count, 1, D, o);
      row += seg.count;
    }
  }
}

// Ulysses' kernel call: Np = B·Hp query slices of L rows over L keys, Gp
// K/V heads per batch entry, the module's causal rule (bottom-right).
template <class T>
struct UlyssesGqaCall {
  multihead::detail::AttentionShape shape;
  multihead::detail::AttentionTensors<T> t;
  std::vector<T> slopes;
  AttentionOptions options;
  int64_t kv_heads;
  UlyssesGqaCall(const SequenceParallelGqaContext<T>& s, int64_t B, int64_t Hp, int64_t Gp, int64_t L, int64_t D)
      : shape{B * Hp, Hp, L, L, D, D, L, 0},
        slopes(s.attention.alibi_slopes.begin(), s.attention.alibi_slopes.end()),
        options(s.attention),
        kv_heads(Gp) {
    t.q = s.q.data();
    t.k = s.k.data();
    t.v = s.v.data();
    t.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
    options.alibi_slopes.clear();
  }
  UlyssesGqaCall(const UlyssesGqaCall&) = delete;
  multihead::detail::AttentionArgs<T> args() const {
    multihead::detail::AttentionArgs<T> a = multihead::detail::make_attention_args(shape, t, options);
    a.kv_heads = kv_heads;
    return a;
  }
};

}  // namespace

template <class T>
SequenceParallelGroupedQueryAttention<T>::SequenceParallelGroupedQueryAttention(
    Communicator& comm, const GroupedQueryAttentionConfig& config, const GroupedQueryAttentionParameters<T>& whole,
    SequenceMode mode, bool causal_balance)
    : comm_(&comm), config_(config), params_(whole), mode_(mode) {
  order_ = mode == SequenceMode::Ring && causal_balance && config.causal ? RingOrder::ZigZag : RingOrder::Contiguous;
  comm.agree([&] {
    config.validate();
    // The module checks its parameters' shapes.
    (void)GroupedQueryAttention<T>(config, whole);
    const int64_t Hkv = config.resolved_kv_heads();
    if (mode == SequenceMode::Ulysses && Hkv % comm.size() != 0)
      fail(Error::Kind::Value, "ranks: expected a divisor of num_kv_heads = " + std::to_string(Hkv) +
                                   " in Ulysses (each rank takes Hkv/P K/V heads with their query heads), got " +
                                   std::to_string(comm.size()));
  });
}

template <class T>
Tensor<T> SequenceParallelGroupedQueryAttention<T>::forward(const Tensor<T>& x, int64_t L,
                                                           const AttentionOptions& options) const {
  return run(x, L, options, nullptr);
}
template <class T>
Tensor<T> SequenceParallelGroupedQueryAttention<T>::forward(const Tensor<T>& x, int64_t L,
                                                           const AttentionOptions& options,
                                                           SequenceParallelGqaContext<T>& save) const {
  return run(x, L, options, &save);
}

template <class T>
Tensor<T> SequenceParallelGroupedQueryAttention<T>::run(const Tensor<T>& x, int64_t L, const AttentionOptions& options,
                                                       SequenceParallelGqaContext<T>* save) const {
  Communicator& comm = *comm_;
  const GroupedQueryAttentionConfig& c = config_;
  const int P = comm.size(), r = comm.rank();
  const int64_t E = c.embed_dim, H = c.num_heads, Hkv = c.resolved_kv_heads(), D = c.resolved_head_dim();
  const int64_t L_r = ring_rows(L, P, r, order_);
  const std::vector<Share> segments = ring_segments(L, P, r, order_);
  SequenceParallelGqaContext<T> local;
  SequenceParallelGqaContext<T>& s = save ? *save : local;
  int64_t B = 0;
  const LinearOptions lin{false, options.num_threads};
  comm.agree([&] {
    if (x.dim() != 3 || x.size(2) != E)
      fail(Error::Kind::Shape, "x: expected this rank's rows (B, " + std::to_string(L_r) + ", " + std::to_string(E) +
                                   "), got " + shape_to_string(x.shape()));
    if (P > L)
      fail(Error::Kind::Value, "ranks: expected at most L = " + std::to_string(L) + " ranks in sequence parallel "
                               "(each rank needs a query row), got " + std::to_string(P));
    if (x.size(1) != L_r)
      fail(Error::Kind::Shape, "x: expected this rank's rows (B, " + std::to_string(L_r) + ", " + std::to_string(E) +
                                   ") (its positions of L), got " + shape_to_string(x.shape()));
    const char* own = " (the module's own causal rule is config.causal, bottom-right)";
    if (options.is_causal) fail(Error::Kind::Value, std::string("is_causal: expected false") + own + ", got true");
    if (options.causal_alignment != CausalAlignment::TopLeft || options.causal_query_offset != 0)
      fail(Error::Kind::Value, std::string("causal_alignment, causal_query_offset: expected the defaults") + own);
    if (options.dropout_p != 0)
      fail(Error::Kind::Value, "dropout_p: expected 0 in sequence parallel, got " + std::to_string(options.dropout_p));
    // check_finite: this rank's rows (indices in the whole sequence) and the
    // parameters, which every rank holds whole.
    if (options.check_finite) {
      std::vector<int64_t> positions;
      for (const Share& g : segments)
        for (int64_t p = g.begin; p < g.end(); ++p) positions.push_back(p);
      multihead::detail::check_finite("x", x, 1, positions);
      for_each_parameter(c, params_, [](const ParameterInfo& info, const Tensor<T>& t) {
        multihead::detail::check_finite(info.name, t);
      });
    }
    if (!options.alibi_slopes.empty() && static_cast<int64_t>(options.alibi_slopes.size()) != H)
      fail(Error::Kind::Value, "alibi_slopes: expected one slope per query head (" + std::to_string(H) + "), got " +
                                   std::to_string(options.alibi_slopes.size()));
    multihead::detail::validate_attention_options(options);
    B = x.size(0);
    const Rows rows{true, B, L_r};
    std::vector<T> q(static_cast<std::size_t>(B * L_r * H * D)), k(static_cast<std::size_t>(B * L_r * Hkv * D)),
        v(k.size());
    multihead::detail::linear_forward<T>({B * L_r, x.data(), E}, weight(params_.q_proj_weight),
                                         bias(params_.q_proj_bias), q.data(), H * D, lin);
    multihead::detail::linear_forward<T>({B * L_r, x.data(), E}, weight(params_.k_proj_weight),
                                         bias(params_.k_proj_bias), k.data(), Hkv * D, lin);
    multihead::detail::linear_forward<T>({B * L_r, x.data(), E}, weight(params_.v_proj_weight),
                                         bias(params_.v_proj_bias), v.data(), Hkv * D, lin);
    s.q = split_heads(q.data(), rows, H, D);
    s.k = split_heads(k.data(), rows, Hkv, D);
    s.v = split_heads(v.data(), rows, Hkv, D);
    if (c.rope) {
      rope_rows(s.q, B * H, L_r, D, segments, *c.rope, false);
      rope_rows(s.k, B * Hkv, L_r, D, segments, *c.rope, false);
    }
    s.attention = options;
    s.attention.is_causal = c.causal;
    s.attention.causal_alignment = CausalAlignment::BottomRight;
    s.attention.alibi_slopes.clear();
    const int64_t Hp = mode_ == SequenceMode::Ulysses ? H / P : H, h0 = mode_ == SequenceMode::Ulysses ? r * Hp : 0;
    if (!options.alibi_slopes.empty())
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hp; ++h)
          s.attention.alibi_slopes.push_back(options.alibi_slopes[static_cast<std::size_t>(h0 + h)]);
  });
  std::vector<T> heads_out;
  if (mode_ == SequenceMode::Ring) {
    const RingAttentionInputs<T> in = detail::ring_heads(B, H, Hkv, L, L, D, order_, s.q, s.k, s.v);
    s.out.resize(static_cast<std::size_t>(B * H * L_r * D));
    s.lse.resize(static_cast<std::size_t>(B * H * L_r));
    ring_attention_forward(comm, in, s.attention, s.out.data(), s.lse.data());
    heads_out = s.out;
  } else {
    const int64_t Hp = H / P, Gp = Hkv / P;
    s.q = rows_to_heads(comm, s.q, B, H, L, D);
    s.k = rows_to_heads(comm, s.k, B, Hkv, L, D);
    s.v = rows_to_heads(comm, s.v, B, Hkv, L, D);
    s.out.assign(static_cast<std::size_t>(B * Hp * L * D), T(0));
    s.lse.assign(static_cast<std::size_t>(B * Hp * L), T(0));
    comm.agree([&] {
      UlyssesGqaCall<T> call(s, B, Hp, Gp, L, D);
      call.t.out = s.out.data();
      multihead::detail::AttentionArgs<T> a = call.args();
      a.lse = s.lse.data();
      multihead::detail::run_attention_forward(a, multihead::detail::resolve_forward_kernel<T>(options.kernel, false));
    });
    heads_out = heads_to_rows(comm, s.out.data(), B, H, L, D);
  }
  s.merged.assign(static_cast<std::size_t>(B * L_r * H * D), T(0));
  merge_heads(heads_out.data(), Rows{true, B, L_r}, H, D, s.merged.data());
  Tensor<T> out(Shape{B, L_r, E});
  multihead::detail::linear_forward<T>({B * L_r, s.merged.data(), H * D}, weight(params_.o_proj_weight),
                                       bias(params_.o_proj_bias), out.data(), E, lin);
  if (save) {
    s.x = x;
    s.L = L;
    s.filled = true;
  }
  return out;
}

template <class T>
GroupedQueryAttentionGradients<T> SequenceParallelGroupedQueryAttention<T>::backward(
    const SequenceParallelGqaContext<T>& s, const Tensor<T>& d_output) const {
  Communicator& comm = *comm_;
  const GroupedQueryAttentionConfig& c = config_;
  const int P = comm.size(), r = comm.rank();
  const int64_t E = c.embed_dim, H = c.num_heads, Hkv = c.resolved_kv_heads(), D = c.resolved_head_dim();
  comm.agree([&] {
    if (!s.filled) fail(Error::Kind::Value, "context: expected the context of a training forward, got an empty one");
    const Shape want = {s.x.size(0), s.x.size(1), E};
    if (d_output.shape() != want)
      fail(Error::Kind::Shape, "d_output: expected this rank's rows " + shape_to_string(want) + ", got " +
                                   shape_to_string(d_output.shape()));
  });
  const int64_t B = s.x.size(0), L_r = s.x.size(1), L = s.L;
  const std::vector<Share> segments = ring_segments(L, P, r, order_);
  const Rows rows{true, B, L_r};
  const LinearOptions acc{true, s.attention.num_threads};
  GroupedQueryAttentionGradients<T> g;
  for_each_parameter(c, [&](const ParameterInfo& info) {
    if (info.present) g.parameters[info.name] = Tensor<T>(info.shape, T(0));
  });
  const auto grad = [&](const char* name) { return g.parameters.count(name) ? g.parameters[name].data() : nullptr; };
  // out = merged W_oᵀ + b_o
  std::vector<T> d_merged(static_cast<std::size_t>(B * L_r * H * D), T(0));
  multihead::detail::linear_backward<T>({B * L_r, s.merged.data(), H * D}, weight(params_.o_proj_weight),
                                        d_output.data(), E,
                                        {d_merged.data(), H * D, grad("o_proj.weight"), grad("o_proj.bias")}, acc);
  std::vector<T> d_heads = split_heads(d_merged.data(), rows, H, D);
  std::vector<T> dq(static_cast<std::size_t>(B * H * L_r * D)), dk(static_cast<std::size_t>(B * Hkv * L_r * D)),
      dv(dk.size());
  if (mode_ == SequenceMode::Ring) {
    ring_attention_backward(comm, detail::ring_heads(B, H, Hkv, L, L, D, order_, s.q, s.k, s.v), s.attention,
                            s.out.data(), s.lse.data(), d_heads.data(), dq.data(), dk.data(), dv.data());
  } else {
    const int64_t Hp = H / P, Gp = Hkv / P;
    const std::vector<T> d_out_u = rows_to_heads(comm, d_heads, B, H, L, D);
    std::vector<T> dq_u(static_cast<std::size_t>(B * Hp * L * D)), dk_u(static_cast<std::size_t>(B * Gp * L * D)),
        dv_u(dk_u.size());
    comm.agree([&] {
      UlyssesGqaCall<T> call(s, B, Hp, Gp, L, D);
      call.t.out = const_cast<T*>(s.out.data());
      detail::ulysses_backward(call.args(), s.lse.data(), d_out_u.data(), dq_u.data(), dk_u.data(), dv_u.data(),
                               s.attention.kernel);
    });
    dq = heads_to_rows(comm, dq_u.data(), B, H, L, D);
    dk = heads_to_rows(comm, dk_u.data(), B, Hkv, L, D);
    dv = heads_to_rows(comm, dv_u.data(), B, Hkv, L, D);
  }
  if (c.rope) {
    rope_rows(dq, B * H, L_r, D, segments, *c.rope, true);
    rope_rows(dk, B * Hkv, L_r, D, segments, *c.rope, true);
  }
  std::vector<T> dqp(static_cast<std::size_t>(B * L_r * H * D)), dkp(static_cast<std::size_t>(B * L_r * Hkv * D)),
      dvp(dkp.size());
  merge_heads(dq.data(), rows, H, D, dqp.data());
  merge_heads(dk.data(), rows, Hkv, D, dkp.data());
  merge_heads(dv.data(), rows, Hkv, D, dvp.data());
  g.x = Tensor<T>(s.x.shape(), T(0));
  const std::pair<const char*, const std::vector<T>*> projections[] = {{"q_proj", &dqp}, {"k_proj", &dkp},
                                                                       {"v_proj", &dvp}};
  for (const auto& [name, d_y] : projections) {
    const std::string n = name;
    const Tensor<T>& w = n == "q_proj" ? params_.q_proj_weight : n == "k_proj" ? params_.k_proj_weight
                                                                               : params_.v_proj_weight;
    multihead::detail::linear_backward<T>({B * L_r, s.x.data(), E}, weight(w), d_y->data(), w.size(0),
                                          {g.x.data(), E, grad((n + ".weight").c_str()),
                                           grad((n + ".bias").c_str())},
                                          acc);
  }
  detail::sum_over_ranks(comm, g.parameters);  // one message, rank order
  return g;
}

template class SequenceParallelGroupedQueryAttention<float>;
template class SequenceParallelGroupedQueryAttention<double>;

}  // namespace multihead::distributed
