// src/distributed/head_parallel_mha.cpp: torch.nn.MultiheadAttention split by
// heads across the ranks (Megatron-LM's attention, Shoeybi et al. 2019).
//
// Rank r holds heads [h, h + H_r) (share_of). With D = E / H, its part of
// F.multi_head_attention_forward is
//   Q_r = query W_q,rᵀ + b_q,r                      (tokens, H_r·D)   rows h·D… of W_q
//   merged_r = MHA_r(Q_r, key, value)                (tokens, H_r·D)
//   partial_r = merged_r W^O_{:, r}ᵀ                 (tokens, E)       columns h·D… of W^O
//   output = Σ_r partial_r + b^O                     one all-reduce, the bias once
// where MHA_r is the library's own MultiheadAttention with H_r heads of width
// D, whose W_q and W^O are identities (exact: x·1 + 0 = x for finite x) and
// whose W_k, W_v, biases and bias_k / bias_v are the rank's slices. It runs
// every option of the module (masks, key padding, bias_k/bias_v,
// add_zero_attn, kdim/vdim, causal, window, softcap, ALiBi at the global
// head's slope) with the module's own code, forward and backward.
//
// Backward, the same lines in reverse:
//   d merged_r = d_output W^O_{:, r};  dW^O_{:, r} = d_outputᵀ merged_r;  db^O = Σ d_output
//   MHA_r.backward -> dQ_r, d key_r, d value_r, dW_k,r, dW_v,r, db_k,r, db_v,r, d bias_k/v
//   d query_r = dQ_r W_q,r;  dW_q,r = dQ_rᵀ query
//   (d query, d key, d value) = Σ_r (…)_r          one all-reduce, one message
//
// Legend: P ranks, B batch, L query length, S key length, E embed_dim,
// H heads, H_r this rank's, D head width, Ek kdim, Ev vdim.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "attention/mha_plan.hpp"
#include "core/check.hpp"
#include "core/linear.hpp"
#include "distributed/safetensors_slices.hpp"
#include "distributed/slices.hpp"
#include "multihead/distributed.hpp"
#include "multihead/io.hpp"
#include "multihead/error.hpp"

namespace multihead::distributed {

using multihead::detail::LinearGradients;
using multihead::detail::LinearOptions;
using multihead::detail::LinearRows;
using multihead::detail::LinearWeight;
using detail::column_block;
using detail::row_block;
using detail::with_last;

template <class T>
struct HeadParallelMultiheadAttention<T>::Local {
  MultiheadAttentionConfig config;              // H_r heads of width D
  std::optional<BasicMultiheadAttention<T>> module;
  Tensor<T> wq, bq, wk, bk, wv, bv, wo, bo, bias_k, bias_v;  // the rank's slices
  uint64_t values_read = 0;                     // by load(), from the file
};

namespace {

void check_ranks_fit(int ranks, int64_t items, const char* what, const char* mode) {
  if (ranks > items)
    throw Error(Error::Kind::Value, std::string("ranks: expected at most ") + what + " = " + std::to_string(items) +
                                        " ranks in " + mode + " parallel (each rank needs one), got " +
                                        std::to_string(ranks));
}

template <class T>
Tensor<T> identity(int64_t n) {
  Tensor<T> out(Shape{n, n}, T(0));
  for (int64_t i = 0; i < n; ++i) out.data()[i * n + i] = T(1);
  return out;
}

template <class T>
Tensor<T> stack_rows(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& c, Shape shape) {
  Tensor<T> out(std::move(shape));
  T* at = std::copy(a.data(), a.data() + a.numel(), out.data());
  at = std::copy(b.data(), b.data() + b.numel(), at);
  std::copy(c.data(), c.data() + c.numel(), at);
  return out;
}

// The (B·H, L, S) attn_mask's slices of this rank's heads: (B·H_r, L, S).
template <class T>
Mask<T> mask_heads(const Mask<T>& m, int64_t H, Share heads) {
  const Shape& s = m.shape();
  const int64_t B = s[0] / H, per = s[1] * s[2];
  const auto take = [&](const auto& full, auto& out) {
    for (int64_t b = 0; b < B; ++b)
      std::copy(full.data() + (b * H + heads.begin) * per, full.data() + (b * H + heads.end()) * per,
                out.data() + b * heads.count * per);
  };
  const Shape local = {B * heads.count, s[1], s[2]};
  if (m.is_bool()) {
    Tensor<uint8_t> out(local);
    take(m.bool_values(), out);
    return Mask<T>::boolean(std::move(out));
  }
  Tensor<T> out(local);
  take(m.float_values(), out);
  return Mask<T>::additive(std::move(out));
}

}  // namespace

template <class T>
HeadParallelMultiheadAttention<T>::HeadParallelMultiheadAttention(Communicator& comm,
                                                                  const MultiheadAttentionConfig& config,
                                                                  const MultiheadAttentionParameters<T>& whole)
    : HeadParallelMultiheadAttention(comm, config, [&] {
        config.validate();
        validate_parameters(config, whole);
      }, [&](const std::string& name, int64_t first, int64_t count, bool columns) {
        Tensor<T> t;
        for_each_parameter(config, whole, [&](const ParameterInfo& info, const Tensor<T>& p) {
          if (name != info.name) return;
          const int64_t per = p.numel() / p.shape()[0];
          t = columns ? column_block(p.data(), p.shape()[0], p.shape()[1], first, count)
                      : row_block(p.data(), per, first, count, {count * per});
        });
        return t;
      }) {}

template <class T>
HeadParallelMultiheadAttention<T> HeadParallelMultiheadAttention<T>::load(Communicator& comm, const std::string& path,
                                                                          const MultiheadAttentionConfig& config,
                                                                          const std::string& prefix) {
  std::optional<detail::SafetensorsSlices> file;
  return load_opened(comm, path, config, prefix, file);
}

template <class T>
HeadParallelMultiheadAttention<T> HeadParallelMultiheadAttention<T>::load_opened(
    Communicator& comm, const std::string& path, const MultiheadAttentionConfig& config, const std::string& prefix,
    std::optional<detail::SafetensorsSlices>& file) {
  const std::string p = module_prefix(prefix);
  HeadParallelMultiheadAttention m(comm, config, [&] {
    config.validate();
    if (!file) file.emplace(path);
    // Every parameter the configuration has, of its shape (the rest of the
    // file is not read).
    for_each_parameter(config, [&](const ParameterInfo& info) {
      if (!info.present) return;
      const Shape& got = file->shape(p + info.name);
      if (got != info.shape)
        throw Error(Error::Kind::Shape, p + info.name + ": expected shape " + shape_to_string(info.shape) + ", got " +
                                            shape_to_string(got) + " in '" + path + "'");
    });
  }, [&](const std::string& name, int64_t first, int64_t count, bool columns) {
    return columns ? file->columns<T>(p + name, first, count) : file->rows<T>(p + name, first, count);
  });
  m.local_->values_read = file->values_read();
  return m;
}

template <class T>
HeadParallelMultiheadAttention<T> HeadParallelMultiheadAttention<T>::load(Communicator& comm, const std::string& path,
                                                                          const LoadOptions& options,
                                                                          LoadedWeights* header) {
  LoadedWeights w;
  std::optional<detail::SafetensorsSlices> file;
  comm.agree([&] {
    file.emplace(path);  // the header; the slices are decoded later
    w = weights_from_header(file->tensors(), file->metadata(), path, options);
  });
  HeadParallelMultiheadAttention m = load_opened(comm, path, w.config, w.prefix, file);
  if (header) *header = std::move(w);
  return m;
}

template <class T>
uint64_t HeadParallelMultiheadAttention<T>::values_read() const {
  return local_->values_read;
}

template <class T>
HeadParallelMultiheadAttention<T>::HeadParallelMultiheadAttention(Communicator& comm,
                                                                  const MultiheadAttentionConfig& config,
                                                                  const std::function<void()>& check,
                                                                  const BlockSource& block)
    : comm_(&comm), config_(config), local_(std::make_unique<Local>()) {
  comm.agree([&] {
    check();
    check_ranks_fit(comm.size(), config.num_heads, "num_heads", "head");
  });
  heads_ = share_of(config.num_heads, comm.size(), comm.rank());
  const int64_t E = config.embed_dim, D = config.head_dim(), Ek = config.key_dim(), Ev = config.value_dim();
  const int64_t r0 = heads_.begin * D, n = heads_.count * D;
  Local& l = *local_;
  const auto rows = [&](const char* name, int64_t first, Shape shape) {
    return block(name, first, n, false).reshaped(std::move(shape));
  };
  comm.agree([&] {  // reading the blocks may fail (a file's I/O)
    if (config.same_embed_dim()) {
      l.wq = rows("in_proj_weight", r0, {n, E});
      l.wk = rows("in_proj_weight", E + r0, {n, E});
      l.wv = rows("in_proj_weight", 2 * E + r0, {n, E});
    } else {
      l.wq = rows("q_proj_weight", r0, {n, E});
      l.wk = rows("k_proj_weight", r0, {n, Ek});
      l.wv = rows("v_proj_weight", r0, {n, Ev});
    }
    if (config.bias) {
      l.bq = rows("in_proj_bias", r0, {n});
      l.bk = rows("in_proj_bias", E + r0, {n});
      l.bv = rows("in_proj_bias", 2 * E + r0, {n});
      l.bo = block("out_proj.bias", 0, E, false);
    }
    l.wo = block("out_proj.weight", r0, n, true);
    if (config.add_bias_kv) {
      // (1, 1, E): its elements are the rows of the flattened tensor.
      l.bias_k = block("bias_k", 0, 1, false).reshaped({E});
      l.bias_k = row_block(l.bias_k.data(), 1, r0, n, {1, 1, n});
      l.bias_v = block("bias_v", 0, 1, false).reshaped({E});
      l.bias_v = row_block(l.bias_v.data(), 1, r0, n, {1, 1, n});
    }
  });
  // The local module: H_r heads of width D on the projected query.
  MultiheadAttentionConfig& lc = l.config;
  lc = config;
  lc.embed_dim = n;
  lc.num_heads = heads_.count;
  lc.kdim = Ek;
  lc.vdim = Ev;
  MultiheadAttentionParameters<T> p;
  if (lc.same_embed_dim()) {
    p.in_proj_weight = stack_rows(identity<T>(n), l.wk, l.wv, {3 * n, n});
  } else {
    p.q_proj_weight = identity<T>(n);
    p.k_proj_weight = l.wk;
    p.v_proj_weight = l.wv;
  }
  if (config.bias) {
    p.in_proj_bias = stack_rows(Tensor<T>(Shape{n}, T(0)), l.bk, l.bv, {3 * n});
    p.out_proj_bias = Tensor<T>(Shape{n}, T(0));
  }
  p.out_proj_weight = identity<T>(n);
  p.bias_k = l.bias_k;
  p.bias_v = l.bias_v;
  l.module.emplace(lc, std::move(p));
}

template <class T>
HeadParallelMultiheadAttention<T>::~HeadParallelMultiheadAttention() = default;
template <class T>
HeadParallelMultiheadAttention<T>::HeadParallelMultiheadAttention(HeadParallelMultiheadAttention&&) noexcept = default;

template <class T>
std::map<std::string, Tensor<T>> HeadParallelMultiheadAttention<T>::state_dict() const {
  const Local& l = *local_;
  const int64_t n = heads_.count * config_.head_dim();
  std::map<std::string, Tensor<T>> out;
  if (config_.same_embed_dim()) {
    out["in_proj_weight"] = stack_rows(l.wq, l.wk, l.wv, {3 * n, config_.embed_dim});
  } else {
    out["q_proj_weight"] = l.wq;
    out["k_proj_weight"] = l.wk;
    out["v_proj_weight"] = l.wv;
  }
  if (config_.bias) {
    out["in_proj_bias"] = stack_rows(l.bq, l.bk, l.bv, {3 * n});
    out["out_proj.bias"] = l.bo;
  }
  out["out_proj.weight"] = l.wo;
  if (config_.add_bias_kv) {
    out["bias_k"] = l.bias_k;
    out["bias_v"] = l.bias_v;
  }
  return out;
}

template <class T>
ForwardResult<T> HeadParallelMultiheadAttention<T>::forward(const Tensor<T>& query, const Tensor<T>& key,
                                                            const Tensor<T>& value,
                                                            const ForwardOptions<T>& options) const {
  return run(query, key, value, options, nullptr);
}

template <class T>
ForwardResult<T> HeadParallelMultiheadAttention<T>::forward(const Tensor<T>& query, const Tensor<T>& key,
                                                            const Tensor<T>& value, const ForwardOptions<T>& options,
                                                            HeadParallelContext<T>& save) const {
  return run(query, key, value, options, &save);
}

template <class T>
ForwardResult<T> HeadParallelMultiheadAttention<T>::run(const Tensor<T>& query, const Tensor<T>& key,
                                                        const Tensor<T>& value, const ForwardOptions<T>& options,
                                                        HeadParallelContext<T>* save) const {
  const Local& l = *local_;
  const int64_t E = config_.embed_dim, H = config_.num_heads, n = heads_.count * config_.head_dim();
  const LinearOptions lin{false, options.attention.num_threads};
  const int64_t rows = query.numel() / std::max<int64_t>(E, 1);
  Tensor<T> q_r;
  ForwardResult<T> local;
  // Everything before the first message, on every rank: the whole call's
  // checks (the one-process module's plan), then the rank's own work, whose
  // errors (check_finite on its slices) are agreed too.
  comm_->agree([&] {
    (void)multihead::detail::plan_forward(config_, query, key, value, options);
    if (options.training && config_.dropout > 0)
      throw Error(Error::Kind::Value, "dropout: expected 0 while training in head parallel (the keep decisions are "
                                      "drawn per global (batch, head) slice), got " + std::to_string(config_.dropout));
    if (!options.weights_heads.empty() || !options.weights_rows.empty())
      throw Error(Error::Kind::Value, "weights_heads, weights_rows: expected none in head parallel (it returns "
                                      "every head's weights), got a selection");
    // check_finite: the whole inputs and masks (every rank holds them, so an
    // index is the caller's), and this rank's slices of the parameters, each
    // under its tensor's name; the local module then checks nothing (it
    // would name the projected query "query", at its own indices).
    if (options.attention.check_finite) {
      for (const auto& [name, t] : {std::pair{"query", &query}, std::pair{"key", &key}, std::pair{"value", &value}})
        multihead::detail::check_finite(name, *t);
      multihead::detail::check_masks_finite(options.key_padding_mask, options.attn_mask);
      // This rank's slices of the parameters, each named as the whole
      // tensor at the whole tensor's index (one process's message).
      const bool packed = config_.same_embed_dim();
      const int64_t D = config_.head_dim(), r0 = heads_.begin * D;
      const auto from = [&](int64_t first) {
        std::vector<int64_t> at(static_cast<std::size_t>(n));
        for (int64_t i = 0; i < n; ++i) at[static_cast<std::size_t>(i)] = first + i;
        return at;
      };
      const int64_t k0 = packed ? E : 0, v0 = packed ? 2 * E : 0;
      multihead::detail::check_finite(packed ? "in_proj_weight" : "q_proj_weight", l.wq, 0, from(r0));
      multihead::detail::check_finite(packed ? "in_proj_weight" : "k_proj_weight", l.wk, 0, from(k0 + r0));
      multihead::detail::check_finite(packed ? "in_proj_weight" : "v_proj_weight", l.wv, 0, from(v0 + r0));
      multihead::detail::check_finite("in_proj_bias", l.bq, 0, from(r0));
      multihead::detail::check_finite("in_proj_bias", l.bk, 0, from(E + r0));
      multihead::detail::check_finite("in_proj_bias", l.bv, 0, from(2 * E + r0));
      multihead::detail::check_finite("out_proj.weight", l.wo, 1, from(r0));
      multihead::detail::check_finite("out_proj.bias", l.bo);
      multihead::detail::check_finite("bias_k", l.bias_k, 2, from(r0));
      multihead::detail::check_finite("bias_v", l.bias_v, 2, from(r0));
    }
    // Q_r = query W_q,rᵀ + b_q,r
    q_r = Tensor<T>(with_last(query.shape(), n));
    multihead::detail::linear_forward<T>({rows, query.data(), E}, LinearWeight<T>::stored(l.wq.data(), n, E),
                                         config_.bias ? l.bq.data() : nullptr, q_r.data(), n, lin);
    ForwardOptions<T> lo = options;
    lo.attention.check_finite = false;  // checked above
    std::optional<Mask<T>> local_mask;
    if (options.attn_mask && options.attn_mask->shape().size() == 3) {
      local_mask = mask_heads(*options.attn_mask, H, heads_);
      lo.attn_mask = &*local_mask;
    }
    lo.average_attn_weights = false;
    if (options.alibi) {
      lo.alibi_heads = options.alibi_heads == 0 ? H : options.alibi_heads;
      lo.alibi_head_offset = options.alibi_head_offset + heads_.begin;
    }
    // key and value stay the caller's tensors (self-attention: one tensor).
    local = save ? l.module->forward(q_r, key, value, lo, save->local) : l.module->forward(q_r, key, value, lo);
  });
  ForwardResult<T> result;
  result.output = Tensor<T>(with_last(query.shape(), E));
  multihead::detail::linear_forward<T>({rows, local.output.data(), n}, LinearWeight<T>::stored(l.wo.data(), E, n),
                                       nullptr, result.output.data(), E, lin);
  comm_->all_reduce_sum(result.output.data(), result.output.numel());
  if (config_.bias)
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t e = 0; e < E; ++e) result.output.data()[t * E + e] += l.bo.data()[e];
  if (local.attn_weights) {
    // Every head's weights on every rank: the rank's heads in place, zeros
    // elsewhere, summed.
    const Tensor<T>& w = *local.attn_weights;  // (B, H_r, L, S') or (H_r, L, S')
    const bool batched = w.dim() == 4;
    const int64_t B = batched ? w.size(0) : 1, Lq = w.size(-2), St = w.size(-1), per = Lq * St;
    Tensor<T> all(Shape{B, H, Lq, St}, T(0));
    for (int64_t b = 0; b < B; ++b)
      std::copy(w.data() + b * heads_.count * per, w.data() + (b + 1) * heads_.count * per,
                all.data() + (b * H + heads_.begin) * per);
    comm_->all_reduce_sum(all.data(), all.numel());
    if (options.average_attn_weights) {
      Tensor<T> mean(Shape{B, Lq, St}, T(0));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < per; ++i) mean.data()[b * per + i] += all.data()[(b * H + h) * per + i];
      for (T& x : mean.vec()) x /= static_cast<T>(H);
      result.attn_weights = batched ? std::move(mean) : std::move(mean).reshaped({Lq, St});
    } else {
      result.attn_weights = batched ? std::move(all) : std::move(all).reshaped({H, Lq, St});
    }
  }
  if (save) {
    save->query = query;
    save->projected_query = std::move(q_r);
    save->merged = std::move(local.output);
    save->query_shape = query.shape();
  }
  return result;
}

template <class T>
MultiheadAttentionGradients<T> HeadParallelMultiheadAttention<T>::backward(const HeadParallelContext<T>& saved,
                                                                           const Tensor<T>& d_output) const {
  const Local& l = *local_;
  const int64_t E = config_.embed_dim, n = heads_.count * config_.head_dim();
  const LinearOptions lin{false, 0};
  MultiheadAttentionGradients<T> g, lg;
  Tensor<T> d_wo(Shape{E, n}), d_bo(Shape{E}), d_query, d_wq(Shape{n, E});
  comm_->agree([&] {
    if (saved.local.empty())
      throw Error(Error::Kind::Value, "context: expected the context of a training forward, got an empty one");
    if (d_output.shape() != with_last(saved.query_shape, E))
      throw Error(Error::Kind::Shape, "d_output: expected shape " + shape_to_string(with_last(saved.query_shape, E)) +
                                          " (the output's), got " + shape_to_string(d_output.shape()));
    const int64_t rows = d_output.numel() / E;
    // In the forward: partial_r = merged_r W^O_{:, r}ᵀ (+ b^O once).
    Tensor<T> d_merged(saved.merged.shape());
    multihead::detail::linear_backward<T>({rows, saved.merged.data(), n}, LinearWeight<T>::stored(l.wo.data(), E, n),
                                          d_output.data(), E,
                                          {d_merged.data(), n, d_wo.data(), config_.bias ? d_bo.data() : nullptr}, lin);
    lg = l.module->backward(saved.local, d_merged);
    // In the forward: Q_r = query W_q,rᵀ + b_q,r.
    d_query = Tensor<T>(saved.query.shape());
    multihead::detail::linear_backward<T>({rows, saved.query.data(), E}, LinearWeight<T>::stored(l.wq.data(), n, E),
                                          lg.query.data(), n, {d_query.data(), E, d_wq.data(), nullptr}, lin);
  });
  // One all-reduce for the three input gradients.
  const int64_t nq = d_query.numel(), nk = lg.key.numel(), nv = lg.value.numel();
  std::vector<T> packed(static_cast<std::size_t>(nq + nk + nv));
  std::copy(d_query.data(), d_query.data() + nq, packed.data());
  std::copy(lg.key.data(), lg.key.data() + nk, packed.data() + nq);
  std::copy(lg.value.data(), lg.value.data() + nv, packed.data() + nq + nk);
  comm_->all_reduce_sum(packed.data(), nq + nk + nv);
  std::copy(packed.data(), packed.data() + nq, d_query.data());
  std::copy(packed.data() + nq, packed.data() + nq + nk, lg.key.data());
  std::copy(packed.data() + nq + nk, packed.data() + nq + nk + nv, lg.value.data());
  g.query = std::move(d_query);
  g.key = std::move(lg.key);
  g.value = std::move(lg.value);
  // The rank's parameter gradients, each the slice its parameter is.
  auto& lp = lg.parameters;
  Tensor<T> d_wk, d_wv;
  if (l.config.same_embed_dim()) {
    const Tensor<T>& packed_w = lp.at("in_proj_weight");  // (3n, n): identity rows, then W_k, W_v
    d_wk = row_block(packed_w.data(), n, n, n, {n, n});
    d_wv = row_block(packed_w.data(), n, 2 * n, n, {n, n});
  } else {
    d_wk = lp.at("k_proj_weight");
    d_wv = lp.at("v_proj_weight");
  }
  if (config_.same_embed_dim()) {
    g.parameters["in_proj_weight"] = stack_rows(d_wq, d_wk, d_wv, {3 * n, E});
  } else {
    g.parameters["q_proj_weight"] = std::move(d_wq);
    g.parameters["k_proj_weight"] = std::move(d_wk);
    g.parameters["v_proj_weight"] = std::move(d_wv);
  }
  if (config_.bias) {
    g.parameters["in_proj_bias"] = lp.at("in_proj_bias");  // d b_q,r = Σ dQ_r: the local q bias's
    g.parameters["out_proj.bias"] = std::move(d_bo);
  }
  g.parameters["out_proj.weight"] = std::move(d_wo);
  if (config_.add_bias_kv) {
    g.parameters["bias_k"] = lp.at("bias_k");
    g.parameters["bias_v"] = lp.at("bias_v");
  }
  return g;
}

template class HeadParallelMultiheadAttention<float>;
template class HeadParallelMultiheadAttention<double>;

}  // namespace multihead::distributed
