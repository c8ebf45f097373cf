// src/distributed/head_parallel_gqa.cpp: the grouped-query module split by
// K/V groups across the ranks. Rank r holds K/V heads [g, g + G_r)
// (share_of(Hkv)) and the query heads that read them, [g·n, (g + G_r)·n),
// n = H / Hkv (repeat_kv's order: query head h reads K/V head h / n), so a
// K/V head never leaves its rank. Its part of the forward is the module's
// own, on its rows of q/k/v_proj and its columns of o_proj (RoPE, causal,
// window, softcap and ALiBi at the global heads' slopes included):
//   partial_r = GQA_r(x)            o_proj.bias zero in GQA_r
//   output = Σ_r partial_r + b_o    one all-reduce, the bias once
// Backward: GQA_r.backward gives the rank's parameter gradients (db_o = Σ
// d_output, whole, on every rank) and its share of dx; one all-reduce sums dx.
//
// Legend: P ranks, B batch, L tokens, E embed width, H query heads, Hkv K/V
// heads, G_r this rank's K/V heads, D head width.
#include <string>

#include <utility>

#include "core/check.hpp"
#include "distributed/slices.hpp"
#include "multihead/distributed.hpp"
#include "multihead/error.hpp"

namespace multihead::distributed {

using detail::column_block;
using detail::row_block;

template <class T>
HeadParallelGroupedQueryAttention<T>::HeadParallelGroupedQueryAttention(
    Communicator& comm, const GroupedQueryAttentionConfig& config, const GroupedQueryAttentionParameters<T>& whole)
    : comm_(&comm), config_(config) {
  comm.agree([&] {
    config.validate();
    (void)GroupedQueryAttention<T>(config, whole);  // its shape checks, naming the tensor
    if (comm.size() > config.resolved_kv_heads())
      throw Error(Error::Kind::Value, "ranks: expected at most num_kv_heads = " +
                                          std::to_string(config.resolved_kv_heads()) +
                                          " ranks in head parallel (a K/V head travels with its group), got " +
                                          std::to_string(comm.size()));
  });
  groups_ = share_of(config.resolved_kv_heads(), comm.size(), comm.rank());
  const Share h = heads();
  const int64_t E = config.embed_dim, D = config.resolved_head_dim(), HD = config.num_heads * D;
  GroupedQueryAttentionConfig lc = config;
  lc.num_heads = h.count;
  lc.num_kv_heads = groups_.count;
  lc.head_dim = D;
  GroupedQueryAttentionParameters<T> p;
  p.q_proj_weight = row_block(whole.q_proj_weight.data(), E, h.begin * D, h.count * D, {h.count * D, E});
  p.k_proj_weight = row_block(whole.k_proj_weight.data(), E, groups_.begin * D, groups_.count * D,
                              {groups_.count * D, E});
  p.v_proj_weight = row_block(whole.v_proj_weight.data(), E, groups_.begin * D, groups_.count * D,
                              {groups_.count * D, E});
  p.o_proj_weight = column_block(whole.o_proj_weight.data(), E, HD, h.begin * D, h.count * D);
  if (config.bias) {
    p.q_proj_bias = row_block(whole.q_proj_bias.data(), 1, h.begin * D, h.count * D, {h.count * D});
    p.k_proj_bias = row_block(whole.k_proj_bias.data(), 1, groups_.begin * D, groups_.count * D, {groups_.count * D});
    p.v_proj_bias = row_block(whole.v_proj_bias.data(), 1, groups_.begin * D, groups_.count * D, {groups_.count * D});
    p.o_proj_bias = Tensor<T>(Shape{E}, T(0));  // added once, after the all-reduce
    out_bias_ = whole.o_proj_bias;
  }
  local_.emplace(lc, std::move(p));
}

template <class T>
Share HeadParallelGroupedQueryAttention<T>::heads() const {
  const int64_t n = config_.num_heads / config_.resolved_kv_heads();
  return {groups_.begin * n, groups_.count * n};
}

template <class T>
std::map<std::string, Tensor<T>> HeadParallelGroupedQueryAttention<T>::state_dict() const {
  std::map<std::string, Tensor<T>> out = local_->state_dict();
  if (config_.bias) out["o_proj.bias"] = out_bias_;
  return out;
}

template <class T>
AttentionOptions HeadParallelGroupedQueryAttention<T>::local_options(const AttentionOptions& options) const {
  if (options.dropout_p > 0)
    throw Error(Error::Kind::Value, "dropout_p: expected 0 in head parallel (the keep decisions are drawn per "
                                    "global (batch, head) slice), got " + std::to_string(options.dropout_p));
  AttentionOptions o = options;
  if (!o.alibi_slopes.empty()) {
    if (static_cast<int64_t>(o.alibi_slopes.size()) != config_.num_heads)
      throw Error(Error::Kind::Value, "alibi_slopes: expected num_heads = " + std::to_string(config_.num_heads) +
                                          " slopes (one per query head of the whole module), got " +
                                          std::to_string(o.alibi_slopes.size()));
    const Share h = heads();
    o.alibi_slopes.assign(options.alibi_slopes.begin() + h.begin, options.alibi_slopes.begin() + h.end());
  }
  return o;
}

namespace {

// The ranks' partial outputs summed (one all-reduce), o_proj's bias added once.
template <class T>
Tensor<T> sum_partials(Communicator& comm, const GroupedQueryAttentionConfig& config, const Tensor<T>& out_bias,
                       Tensor<T> out) {
  comm.all_reduce_sum(out.data(), out.numel());
  if (config.bias)
    for (int64_t t = 0, E = config.embed_dim; t < out.numel() / E; ++t)
      for (int64_t e = 0; e < E; ++e) out.data()[t * E + e] += out_bias.data()[e];
  return out;
}

// check_finite, before the local module runs with it off: x whole (every
// rank holds it, so an index is the caller's) and this rank's slices of the
// parameters, each named as the whole tensor at the whole tensor's index
// (the local module would name its slices' own indices): q_proj's rows
// from the rank's first query head, k/v_proj's from its first K/V head,
// o_proj.weight's columns from its first query head; o_proj.bias is whole.
template <class T>
void check_finite_whole(const Tensor<T>& x, const std::map<std::string, Tensor<T>>& local, const Tensor<T>& out_bias,
                        bool bias, int64_t first_query_row, int64_t first_kv_row) {
  multihead::detail::check_finite("x", x);
  const auto from = [](int64_t first, int64_t n) {
    std::vector<int64_t> at(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) at[static_cast<std::size_t>(i)] = first + i;
    return at;
  };
  for (const auto& [name, t] : local) {
    if (name == "o_proj.bias") continue;  // the local zeros; the whole one below
    const bool query_side = name.rfind("q_proj.", 0) == 0 || name == "o_proj.weight";
    const int64_t dim = name == "o_proj.weight" ? 1 : 0;
    const int64_t first = query_side ? first_query_row : first_kv_row;
    multihead::detail::check_finite(name, t, dim, from(first, t.shape()[static_cast<std::size_t>(dim)]));
  }
  if (bias) multihead::detail::check_finite("o_proj.bias", out_bias);
}

}  // namespace

template <class T>
AttentionOptions HeadParallelGroupedQueryAttention<T>::checked_options(const Tensor<T>& x,
                                                                       const AttentionOptions& options) const {
  AttentionOptions o = local_options(options);
  if (options.check_finite) {
    const int64_t D = config_.resolved_head_dim();
    check_finite_whole(x, local_->state_dict(), out_bias_, config_.bias, heads().begin * D, groups_.begin * D);
    o.check_finite = false;  // checked above
  }
  return o;
}

template <class T>
Tensor<T> HeadParallelGroupedQueryAttention<T>::forward(const Tensor<T>& x, const AttentionOptions& options) const {
  Tensor<T> out;
  comm_->agree([&] {
    // check_finite's indices are the whole tensors' (checked_options).
    out = local_->forward(x, checked_options(x, options));
  });
  return sum_partials(*comm_, config_, out_bias_, std::move(out));
}

template <class T>
Tensor<T> HeadParallelGroupedQueryAttention<T>::forward(const Tensor<T>& x, const AttentionOptions& options,
                                                        GroupedQueryForwardContext<T>& save) const {
  Tensor<T> out;
  comm_->agree([&] {
    // check_finite's indices are the whole tensors' (checked_options).
    out = local_->forward(x, checked_options(x, options), save);
  });
  return sum_partials(*comm_, config_, out_bias_, std::move(out));
}

template <class T>
GroupedQueryAttentionGradients<T> HeadParallelGroupedQueryAttention<T>::backward(
    const GroupedQueryForwardContext<T>& saved, const Tensor<T>& d_output) const {
  GroupedQueryAttentionGradients<T> g;
  comm_->agree([&] { g = local_->backward(saved, d_output); });
  comm_->all_reduce_sum(g.x.data(), g.x.numel());
  return g;
}

template class HeadParallelGroupedQueryAttention<float>;
template class HeadParallelGroupedQueryAttention<double>;

}  // namespace multihead::distributed
