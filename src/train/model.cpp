// src/train/model.cpp: the encoder's forward and backward (model.hpp).
//
// One block, pre-LN (multihead/train.hpp says why), x the residual stream (N×E):
//   a = norm1(x)
//   h = x + attn(a, a, a)                      MultiheadAttention, batch_first (B, L, E)
//   c = norm2(h);  f = relu(c·W1ᵀ + b1)        when ff > 0
//   x' = h + f·W2ᵀ + b2                        (else x' = h)
// then z = norm_f(x_layers), logits = z·W_rᵀ + b_r. The embedding adds
// sinusoidal positions with Positions::Sinusoidal only; ALiBi is the
// attention module's option; RoPE runs the grouped-query module instead
// (multihead/train.hpp, Positions). At a 16-bit compute type
// (PassOptions::compute) the linear maps and the attention run as
// train/mixed_precision.hpp says, everything else as here.
#include "train/model.hpp"

#include <random>
#include <type_traits>

#include "multihead/error.hpp"
#include "multihead/positions.hpp"
#include "train/mixed_precision.hpp"
#include "train/seeds.hpp"

namespace multihead::train {
namespace {

MultiheadAttentionConfig attention_config(const ModelConfig& c) {
  MultiheadAttentionConfig a;
  a.embed_dim = c.d_model;
  a.num_heads = c.heads;
  a.dropout = c.dropout;
  a.batch_first = true;  // our activations are (B, L, E)
  return a;
}

GroupedQueryAttentionConfig rope_attention_config(const ModelConfig& c) {
  GroupedQueryAttentionConfig a;
  a.embed_dim = c.d_model;
  a.num_heads = c.heads;
  a.num_kv_heads = c.heads;
  a.bias = true;  // as MultiheadAttention's in- and out-projections
  a.rope = RopeOptions{};
  a.causal = c.causal;
  return a;
}

std::string layer(int64_t i, const char* name) { return "blocks." + std::to_string(i) + "." + name; }

// What one block's forward keeps for its backward.
template <class T>
struct BlockSaved {
  Tensor<T> x;                     // (N, E) block input
  Tensor<T> a, mean1, rstd1;       // norm1(x) as (B, L, E), its row statistics (N)
  ForwardContext<T> attn;          // the attention module's own
  GroupedQueryForwardContext<T> rope_attn;  // with RoPE
  std::unique_ptr<NarrowBlockAttention> narrow_attn;  // at a 16-bit compute type (either module)
  Tensor<T> h;                     // (N, E) x + attention
  Tensor<T> c, mean2, rstd2;       // norm2(h), when ff
  Tensor<T> f1, r;                 // (N, F) pre- and post-ReLU, when ff
};

template <class T>
T* at(std::map<std::string, Tensor<T>>& m, const std::string& name) {
  return m.at(name).data();
}
template <class T>
const T* at(const std::map<std::string, Tensor<T>>& m, const std::string& name) {
  return m.at(name).data();
}

}  // namespace

std::string block_prefix(int64_t block) { return "blocks." + std::to_string(block) + ".attn."; }

template <class T>
std::map<std::string, Shape> Model<T>::parameter_shapes(const ModelConfig& c) {
  const int64_t E = c.d_model, V = c.vocabulary, F = c.ff;
  std::map<std::string, Shape> s;
  s["embedding.weight"] = {V, E};
  for (int64_t i = 0; i < c.layers; ++i) {
    s[layer(i, "norm1.weight")] = {E};
    s[layer(i, "norm1.bias")] = {E};
    const auto add = [&](const ParameterInfo& info) {
      if (info.present) s[layer(i, ("attn." + std::string(info.name)).c_str())] = info.shape;
    };
    if (c.positions == Positions::Rope) for_each_parameter(rope_attention_config(c), add);
    else for_each_parameter(attention_config(c), add);
    if (F > 0) {
      s[layer(i, "norm2.weight")] = {E};
      s[layer(i, "norm2.bias")] = {E};
      s[layer(i, "ff.0.weight")] = {F, E};
      s[layer(i, "ff.0.bias")] = {F};
      s[layer(i, "ff.2.weight")] = {E, F};
      s[layer(i, "ff.2.bias")] = {E};
    }
  }
  s["norm_f.weight"] = {E};
  s["norm_f.bias"] = {E};
  s["readout.weight"] = {V, E};
  s["readout.bias"] = {V};
  return s;
}

template <class T>
Model<T>::Model(const ModelConfig& config, uint64_t seed) : config_(config) {
  config_.validate();
  positions_ = sinusoidal_positions<T>(config_.sequence_length, config_.d_model);
  // Parameter k of the name-ordered list draws from its own generator, so
  // adding a layer does not change the others' initial values.
  uint64_t k = 0;
  for (const auto& [name, shape] : parameter_shapes(config_)) {
    const uint64_t stream = stream_value(seed, Stream::Init, k++, 0);
    if (name.find(".attn.") != std::string::npos) continue;  // the module initialises its own
    Tensor<T> t(shape, T(0));
    std::mt19937_64 rng(stream);
    const bool is_norm = name.find("norm") != std::string::npos;
    if (name == "embedding.weight") {
      // nn.Embedding: N(0, 1)
      std::normal_distribution<double> normal(0.0, 1.0);
      for (int64_t i = 0; i < t.numel(); ++i) t[i] = T(normal(rng));
    } else if (is_norm) {
      // nn.LayerNorm: weight 1, bias 0
      if (name.ends_with(".weight")) t = Tensor<T>(shape, T(1));
    } else {
      // nn.Linear: weight and bias U(−1/√in, 1/√in) (kaiming_uniform_ with
      // a = √5 gives that bound for the weight). `in` is the weight's second
      // dimension; a bias takes its weight's.
      const std::string weight = name.substr(0, name.rfind('.')) + ".weight";
      const int64_t in = parameter_shapes(config_).at(weight)[1];
      const double bound = 1.0 / std::sqrt(double(in));
      std::uniform_real_distribution<double> uniform(-bound, bound);
      for (int64_t i = 0; i < t.numel(); ++i) t[i] = T(uniform(rng));
    }
    params_[name] = std::move(t);
  }
  for (int64_t i = 0; i < config_.layers; ++i) {
    const uint64_t stream = stream_value(seed, Stream::Init, k + static_cast<uint64_t>(i), 1);
    if (config_.positions == Positions::Rope)
      rope_attn_.push_back(std::make_unique<GroupedQueryAttention<T>>(rope_attention_config(config_), stream));
    else
      attn_.push_back(std::make_unique<BasicMultiheadAttention<T>>(attention_config(config_), stream));
  }
}

template <class T>
Model<T>::Model(const ModelConfig& config, const std::map<std::string, Tensor<T>>& parameters) : config_(config) {
  config_.validate();
  positions_ = sinusoidal_positions<T>(config_.sequence_length, config_.d_model);
  const auto shapes = parameter_shapes(config_);
  for (const auto& [name, shape] : shapes) {
    const auto it = parameters.find(name);
    if (it == parameters.end())
      throw Error(Error::Kind::Missing, "parameter '" + name + "': missing (expected shape " +
                                            shape_to_string(shape) + ")");
    if (it->second.shape() != shape)
      throw Error(Error::Kind::Shape, "parameter '" + name + "': expected shape " + shape_to_string(shape) +
                                          ", got " + shape_to_string(it->second.shape()));
    if (name.find(".attn.") == std::string::npos) params_[name] = it->second;
  }
  for (const auto& [name, t] : parameters)
    if (shapes.count(name) == 0)
      throw Error(Error::Kind::Value, "parameter '" + name + "': not a parameter of this model (shape " +
                                          shape_to_string(t.shape()) + ")");
  for (int64_t i = 0; i < config_.layers; ++i) {
    const std::string pre = block_prefix(i);
    if (config_.positions == Positions::Rope) {
      rope_attn_.push_back(std::make_unique<GroupedQueryAttention<T>>(
          GroupedQueryAttention<T>::from_tensors(rope_attention_config(config_), parameters, pre)));
      continue;
    }
    MultiheadAttentionParameters<T> p;
    const MultiheadAttentionConfig attention = attention_config(config_);
    for_each_parameter(attention, p, [&](const ParameterInfo& info, Tensor<T>& t) {
      if (info.present) t = parameters.at(pre + info.name);
    });
    attn_.push_back(std::make_unique<BasicMultiheadAttention<T>>(attention, std::move(p)));
  }
}

template <class T>
std::map<std::string, Tensor<T>> Model<T>::parameters() const {
  std::map<std::string, Tensor<T>> out = params_;
  for (int64_t i = 0; i < config_.layers; ++i)
    for (auto& [name, t] : config_.positions == Positions::Rope ? rope_attn_[static_cast<std::size_t>(i)]->state_dict()
                                                               : attn_[static_cast<std::size_t>(i)]->state_dict())
      out[block_prefix(i) + name] = t;
  return out;
}

template <class T>
void Model<T>::update_parameters(const std::function<void(const std::string&, Tensor<T>&)>& update) {
  for (auto& [name, t] : params_) update(name, t);
  for (int64_t i = 0; i < config_.layers; ++i) {
    const auto each = [&](const std::string& name, Tensor<T>& t) { update(block_prefix(i) + name, t); };
    if (config_.positions == Positions::Rope) rope_attn_[static_cast<std::size_t>(i)]->update_parameters(each);
    else attn_[static_cast<std::size_t>(i)]->update_parameters(each);
  }
}

template <class T>
PassResult<T> Model<T>::run(const Batch& batch, const PassOptions& o, bool want_gradients) const {
  const ModelConfig& c = config_;
  const int64_t B = batch.batch, L = batch.length, N = B * L, E = c.d_model, F = c.ff, V = c.vocabulary;
  if (L != c.sequence_length)
    throw Error(Error::Kind::Shape, "batch: expected length " + std::to_string(c.sequence_length) + ", got " +
                                        std::to_string(L));
  if (B < 1)
    throw Error(Error::Kind::Shape, "batch: expected at least one sequence, got " + std::to_string(B));
  if (batch.tokens.size() != static_cast<std::size_t>(N) ||
      batch.targets.size() != static_cast<std::size_t>(N) || batch.mask.size() != static_cast<std::size_t>(N))
    throw Error(Error::Kind::Shape, "batch: expected " + std::to_string(N) +
                                        " tokens, targets and mask values, got " +
                                        std::to_string(batch.tokens.size()) + ", " +
                                        std::to_string(batch.targets.size()) + ", " +
                                        std::to_string(batch.mask.size()));
  for (std::size_t n = 0; n < batch.tokens.size(); ++n)
    if (batch.tokens[n] < 0 || batch.tokens[n] >= V || batch.targets[n] < 0 || batch.targets[n] >= V)
      throw Error(Error::Kind::Value, "batch: token or target at " + std::to_string(n) + " is " +
                                          std::to_string(batch.tokens[n]) + " / " +
                                          std::to_string(batch.targets[n]) + ", expected ids in [0, " +
                                          std::to_string(V) + ")");
  const ComputeDtype dt = o.compute;
  if (dt != ComputeDtype::F32) {
    if (!std::is_same_v<T, float>)
      throw Error(Error::Kind::Value, "compute dtype: " + to_string(dt) + " needs a float32 model, got float64");
    if (o.inspect)
      throw Error(Error::Kind::Value, "inspect: needs compute dtype f32 (the 16-bit attention returns no weights), "
                                      "got " + to_string(dt));
  }
  const int32_t* tokens = batch.tokens.data();
  const int th = o.threads;
  const auto& P = params_;

  // ---- forward ----
  Tensor<T> x({N, E});
  embedding_forward(tokens, N, at(P, "embedding.weight"), E, x.data());
  if (c.positions == Positions::Sinusoidal) positions_forward(x.data(), B, L, E, positions_.data());

  std::vector<BlockSaved<T>> saved(static_cast<std::size_t>(c.layers));
  std::vector<Tensor<T>> inspected;  // per-head weights, when o.inspect
  for (int64_t i = 0; i < c.layers; ++i) {
    BlockSaved<T>& s = saved[static_cast<std::size_t>(i)];
    s.x = std::move(x);
    s.a = Tensor<T>({B, L, E});
    s.mean1 = Tensor<T>({N});
    s.rstd1 = Tensor<T>({N});
    layernorm_forward(s.x.data(), N, E, at(P, layer(i, "norm1.weight")), at(P, layer(i, "norm1.bias")), s.a.data(),
                      s.mean1.data(), s.rstd1.data());
    s.h = Tensor<T>({N, E});
    if (c.positions == Positions::Rope) {
      if constexpr (std::is_same_v<T, float>) {
        if (dt != ComputeDtype::F32) {
          // The 16-bit grouped-query module, rounded from this pass's
          // master weights; the same dropout rate, seed and threads as the
          // float32 call below (mixed_precision.hpp).
          ForwardOptions<float> fo;
          fo.need_weights = false;
          fo.training = o.training && c.dropout > 0;
          fo.attention.num_threads = th;
          fo.attention.dropout_seed = dropout_seed(o.seed, o.step, i, o.example);
          s.narrow_attn = make_narrow_block_attention(dt, *rope_attn_[static_cast<std::size_t>(i)], c.dropout);
          const Tensor<float> out = s.narrow_attn->forward(s.a, fo);
          for (int64_t k = 0; k < N * E; ++k) s.h[k] = s.x[k] + out[k];
        }
      }
      if (!s.narrow_attn) {
        AttentionOptions ao;
        ao.num_threads = th;
        if (o.training && c.dropout > 0) ao.dropout_p = c.dropout;
        ao.dropout_seed = dropout_seed(o.seed, o.step, i, o.example);
        const Tensor<T> out = rope_attn_[static_cast<std::size_t>(i)]->forward(s.a, ao, s.rope_attn);
        for (int64_t k = 0; k < N * E; ++k) s.h[k] = s.x[k] + out[k];
      }
    } else {
      ForwardOptions<T> fo;
      fo.alibi = c.positions == Positions::Alibi;
      fo.need_weights = o.inspect;
      fo.average_attn_weights = false;
      fo.training = o.training && c.dropout > 0;
      fo.attention.is_causal = c.causal;
      fo.attention.num_threads = th;
      fo.attention.dropout_seed = dropout_seed(o.seed, o.step, i, o.example);
      if constexpr (std::is_same_v<T, float>) {
        if (dt != ComputeDtype::F32) {
          // The block's module at the 16-bit type, its parameters rounded
          // from this pass's master weights (mixed_precision.hpp).
          s.narrow_attn = make_narrow_block_attention(dt, *attn_[static_cast<std::size_t>(i)]);
          const Tensor<float> out = s.narrow_attn->forward(s.a, fo);
          for (int64_t k = 0; k < N * E; ++k) s.h[k] = s.x[k] + out[k];
        }
      }
      if (!s.narrow_attn) {
        // Self-attention: one tensor as query, key and value.
        ForwardResult<T> r = attn_[static_cast<std::size_t>(i)]->forward(s.a, s.a, s.a, fo, s.attn);
        if (o.inspect) inspected.push_back(std::move(*r.attn_weights));
        for (int64_t k = 0; k < N * E; ++k) s.h[k] = s.x[k] + r.output[k];
      }
    }
    if (F == 0) {
      x = s.h;
      continue;
    }
    s.c = Tensor<T>({N, E});
    s.mean2 = Tensor<T>({N});
    s.rstd2 = Tensor<T>({N});
    layernorm_forward(s.h.data(), N, E, at(P, layer(i, "norm2.weight")), at(P, layer(i, "norm2.bias")), s.c.data(),
                      s.mean2.data(), s.rstd2.data());
    s.f1 = Tensor<T>({N, F});
    s.r = Tensor<T>({N, F});
    linear_forward_at<T>(dt, N, s.c.data(), at(P, layer(i, "ff.0.weight")), F, E, at(P, layer(i, "ff.0.bias")),
                         s.f1.data(), th);
    relu_forward(s.f1.data(), N * F, s.r.data());
    x = Tensor<T>({N, E});
    linear_forward_at<T>(dt, N, s.r.data(), at(P, layer(i, "ff.2.weight")), E, F, at(P, layer(i, "ff.2.bias")),
                         x.data(), th);
    for (int64_t k = 0; k < N * E; ++k) x[k] += s.h[k];
  }
  Tensor<T> z({N, E}), mean_f({N}), rstd_f({N});
  layernorm_forward(x.data(), N, E, at(P, "norm_f.weight"), at(P, "norm_f.bias"), z.data(), mean_f.data(),
                    rstd_f.data());
  Tensor<T> logits({N, V}), probs({N, V});
  linear_forward_at<T>(dt, N, z.data(), at(P, "readout.weight"), V, E, at(P, "readout.bias"), logits.data(), th);
  PassResult<T> result;
  result.loss = cross_entropy_forward(logits.data(), batch.targets.data(), batch.mask.data(), N, V, probs.data());
  if (o.inspect) {
    result.attention = std::move(inspected);
    result.logits = logits;
  }
  if (!want_gradients) return result;

  // ---- backward ----
  auto& G = result.gradients;
  for (const auto& [name, shape] : parameter_shapes(c))
    if (name.find(".attn.") == std::string::npos) G[name] = Tensor<T>(shape, T(0));
  Tensor<T> d_logits({N, V}, T(0));
  cross_entropy_backward(probs.data(), batch.targets.data(), batch.mask.data(), N, V,
                         o.loss_count > 0 ? o.loss_count : result.loss.count, d_logits.data());
  // forward: the backward starts from scale · loss (loss scaling; a power
  // of two, so exact in T while nothing overflows)
  if (o.loss_scale != 1)
    for (int64_t k = 0; k < N * V; ++k) d_logits[k] *= T(o.loss_scale);
  Tensor<T> d_z({N, E}, T(0));
  linear_backward_at<T>(dt, N, z.data(), at(P, "readout.weight"), V, E, d_logits.data(), d_z.data(),
                        at(G, "readout.weight"), at(G, "readout.bias"), th);
  Tensor<T> d_x({N, E}, T(0));
  layernorm_backward(d_z.data(), x.data(), mean_f.data(), rstd_f.data(), at(P, "norm_f.weight"), N, E, d_x.data(),
                     at(G, "norm_f.weight"), at(G, "norm_f.bias"));
  for (int64_t i = c.layers - 1; i >= 0; --i) {
    const BlockSaved<T>& s = saved[static_cast<std::size_t>(i)];
    // forward: x' = h + ff(norm2(h))  =>  d_h = d_x' + d_(ff branch)
    Tensor<T> d_h = d_x;
    if (F > 0) {
      Tensor<T> d_r({N, F}, T(0)), d_f1({N, F}, T(0)), d_c({N, E}, T(0));
      linear_backward_at<T>(dt, N, s.r.data(), at(P, layer(i, "ff.2.weight")), E, F, d_x.data(), d_r.data(),
                            at(G, layer(i, "ff.2.weight")), at(G, layer(i, "ff.2.bias")), th);
      relu_backward(d_r.data(), s.f1.data(), N * F, d_f1.data());
      linear_backward_at<T>(dt, N, s.c.data(), at(P, layer(i, "ff.0.weight")), F, E, d_f1.data(), d_c.data(),
                            at(G, layer(i, "ff.0.weight")), at(G, layer(i, "ff.0.bias")), th);
      layernorm_backward(d_c.data(), s.h.data(), s.mean2.data(), s.rstd2.data(), at(P, layer(i, "norm2.weight")), N,
                         E, d_h.data(), at(G, layer(i, "norm2.weight")), at(G, layer(i, "norm2.bias")));
    }
    // forward: h = x + attn(a, a, a), a = norm1(x)
    //   =>  d_x = d_h + norm1'(d_a),  d_a = d_query + d_key + d_value (one tensor in three roles)
    Tensor<T> d_a({N, E});
    if (s.narrow_attn) {  // either module, at a 16-bit compute type
      if constexpr (std::is_same_v<T, float>) {  // (set for T = float only)
        NarrowBlockAttention::Gradients g = s.narrow_attn->backward(d_h.reshaped({B, L, E}));
        d_a = std::move(g.d_a);
        for (auto& [name, t] : g.parameters) G[block_prefix(i) + name] = std::move(t);
      }
    } else if (c.positions == Positions::Rope) {
      GroupedQueryAttentionGradients<T> g =
          rope_attn_[static_cast<std::size_t>(i)]->backward(s.rope_attn, d_h.reshaped({B, L, E}));
      for (int64_t k = 0; k < N * E; ++k) d_a[k] = g.x[k];
      for (const auto& [name, t] : g.parameters) G[block_prefix(i) + name] = t;
    } else {
      const MultiheadAttentionGradients<T> g =
          attn_[static_cast<std::size_t>(i)]->backward(s.attn, d_h.reshaped({B, L, E}));
      for (int64_t k = 0; k < N * E; ++k) d_a[k] = g.query[k] + g.key[k] + g.value[k];
      for (const auto& [name, t] : g.parameters) G[block_prefix(i) + name] = t;
    }
    d_x = d_h;
    layernorm_backward(d_a.data(), s.x.data(), s.mean1.data(), s.rstd1.data(), at(P, layer(i, "norm1.weight")), N, E,
                       d_x.data(), at(G, layer(i, "norm1.weight")), at(G, layer(i, "norm1.bias")));
  }
  // forward: x = embedding[tokens] + pe (pe = 0 without sinusoidal positions)
  Tensor<T> d_embedded({N, E}, T(0));
  positions_backward(d_x.data(), N, E, d_embedded.data());
  embedding_backward(tokens, N, d_embedded.data(), E, at(G, "embedding.weight"));
  return result;
}

template class Model<float>;
template class Model<double>;

}  // namespace multihead::train
