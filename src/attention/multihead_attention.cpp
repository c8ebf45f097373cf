// src/attention/multihead_attention.cpp: configuration, parameters and their
// initialisation, as torch.nn.MultiheadAttention (torch/nn/modules/activation.py,
// __init__ and _reset_parameters).
#include "multihead/multihead_attention.hpp"

#include <cmath>
#include <random>
#include <string>

#include "attention/projection_weights.hpp"
#include "attention/workspace.hpp"
#include "core/check.hpp"
#include "core/parameters.hpp"
#include "multihead/error.hpp"

namespace multihead {
namespace {

[[noreturn]] void fail_config(const std::string& field, const std::string& expected, const std::string& got) {
  throw Error(Error::Kind::Value, field + ": expected " + expected + ", got " + got);
}

// xavier_uniform_: U(-a, a), a = √(6 / (fan_in + fan_out)); for a 2-D
// weight (out, in) fan_in = in, fan_out = out.
template <class T>
Tensor<T> xavier_uniform(int64_t out, int64_t in, std::mt19937_64& rng) {
  const double a = std::sqrt(6.0 / static_cast<double>(in + out));
  std::uniform_real_distribution<double> u(-a, a);
  Tensor<T> w({out, in});
  for (auto& x : w.vec()) x = static_cast<T>(u(rng));
  return w;
}

// nn.Linear's reset_parameters: kaiming_uniform_(a=√5) = U(-1/√in, 1/√in).
template <class T>
Tensor<T> linear_default(int64_t out, int64_t in, std::mt19937_64& rng) {
  const double a = 1.0 / std::sqrt(static_cast<double>(in));
  std::uniform_real_distribution<double> u(-a, a);
  Tensor<T> w({out, in});
  for (auto& x : w.vec()) x = static_cast<T>(u(rng));
  return w;
}

// xavier_normal_ on a (1, 1, E) tensor: fan_in = fan_out = E (receptive
// field E), std = √(2 / (fan_in + fan_out)) = 1/√E.
template <class T>
Tensor<T> xavier_normal_bias(int64_t E, std::mt19937_64& rng) {
  std::normal_distribution<double> n(0.0, std::sqrt(2.0 / static_cast<double>(2 * E)));
  Tensor<T> b({1, 1, E});
  for (auto& x : b.vec()) x = static_cast<T>(n(rng));
  return b;
}

}  // namespace

void MultiheadAttentionConfig::validate() const {
  if (embed_dim <= 0) fail_config("embed_dim", "a positive integer", std::to_string(embed_dim));
  if (num_heads <= 0) fail_config("num_heads", "a positive integer", std::to_string(num_heads));
  if (embed_dim % num_heads != 0)
    fail_config("num_heads", "a divisor of embed_dim " + std::to_string(embed_dim),
                std::to_string(num_heads));
  if (!(dropout >= 0.0 && dropout <= 1.0))
    fail_config("dropout", "a probability in [0, 1]", detail::format_number(dropout));
  if (kdim < 0) fail_config("kdim", "0 (= embed_dim) or a positive integer", std::to_string(kdim));
  if (vdim < 0) fail_config("vdim", "0 (= embed_dim) or a positive integer", std::to_string(vdim));
}

template <class T>
void validate_parameters(const MultiheadAttentionConfig& c, const MultiheadAttentionParameters<T>& p) {
  c.validate();
  detail::check_parameters(c, p);
}

template <class T>
BasicMultiheadAttention<T>::BasicMultiheadAttention(const MultiheadAttentionConfig& config, uint64_t seed)
    : config_(config), workspaces_(std::make_shared<detail::WorkspacePool<T>>()) {
  config_.validate();
  {
    const int64_t E = config_.embed_dim, K = config_.key_dim(), V = config_.value_dim();
    const char* widest = K > E && K >= V ? "kdim" : V > E && V > K ? "vdim" : "embed_dim";
    detail::check_parameters_fit(config_, sizeof(T), widest,
                                 "embed_dim " + std::to_string(E) + ", kdim " + std::to_string(K) + ", vdim " +
                                     std::to_string(V) + ", " + (sizeof(T) == 8 ? "float64" : "float32"));
  }
  std::mt19937_64 rng(seed);
  const int64_t E = config_.embed_dim;
  // Same order as _reset_parameters: in-projection, biases, bias_k, bias_v;
  // out_proj.weight is initialised when out_proj (an nn.Linear) is built.
  params_.out_proj_weight = linear_default<T>(E, E, rng);
  if (config_.same_embed_dim()) {
    params_.in_proj_weight = xavier_uniform<T>(3 * E, E, rng);
  } else {
    params_.q_proj_weight = xavier_uniform<T>(E, E, rng);
    params_.k_proj_weight = xavier_uniform<T>(E, config_.key_dim(), rng);
    params_.v_proj_weight = xavier_uniform<T>(E, config_.value_dim(), rng);
  }
  if (config_.bias) {
    params_.in_proj_bias = Tensor<T>({3 * E}, T(0));
    params_.out_proj_bias = Tensor<T>({E}, T(0));
  }
  if (config_.add_bias_kv) {
    params_.bias_k = xavier_normal_bias<T>(E, rng);
    params_.bias_v = xavier_normal_bias<T>(E, rng);
  }
  weights_t_ = detail::ProjectionWeights<T>::from(config_, params_);
  parameters_token_ = detail::new_parameters_token();
}

template <class T>
BasicMultiheadAttention<T>::BasicMultiheadAttention(const MultiheadAttentionConfig& config,
                                                    MultiheadAttentionParameters<T> parameters)
    : config_(config),
      params_(std::move(parameters)),
      workspaces_(std::make_shared<detail::WorkspacePool<T>>()) {
  validate_parameters(config_, params_);
  weights_t_ = detail::ProjectionWeights<T>::from(config_, params_);
  parameters_token_ = detail::new_parameters_token();
}

template <class T>
void BasicMultiheadAttention<T>::update_parameters(
    const std::function<void(const std::string& name, Tensor<T>& parameter)>& update) {
  // The update runs on a copy, which replaces the parameters only once every
  // tensor has passed validate_parameters: an update that throws, or that
  // reshapes a parameter (refused, naming it), leaves the module as it was.
  // The copy costs 4·E² numbers per step, small beside the step itself.
  MultiheadAttentionParameters<T> p = params_;
  detail::update_present(config_, p, update);
  replace_parameters(std::move(p));
}

template <class T>
void BasicMultiheadAttention<T>::load_state_dict(const std::map<std::string, Tensor<T>>& state_dict) {
  MultiheadAttentionParameters<T> p;
  detail::parameters_from_map(config_, p, state_dict, "MultiheadAttention");
  replace_parameters(std::move(p));
}

template <class T>
void BasicMultiheadAttention<T>::replace_parameters(MultiheadAttentionParameters<T> p) {
  // p has passed check_parameters; the module changes only from here on.
  auto weights_t = detail::ProjectionWeights<T>::from(config_, p);
  params_ = std::move(p);
  weights_t_ = std::move(weights_t);
  parameters_token_ = detail::new_parameters_token();  // contexts filled before are stale now
}

template <class T>
void BasicMultiheadAttention<T>::parameters_changed() {
  weights_t_ = detail::ProjectionWeights<T>::from(config_, params_);
  parameters_token_ = detail::new_parameters_token();
}

template <class T>
void BasicMultiheadAttention<T>::release_workspaces() const {
  workspaces_->clear();
}

template <class T>
std::map<std::string, Tensor<T>> BasicMultiheadAttention<T>::state_dict() const {
  return detail::parameter_map<T>(config_, params_);
}

template void validate_parameters<float>(const MultiheadAttentionConfig&,
                                         const MultiheadAttentionParameters<float>&);
template void validate_parameters<double>(const MultiheadAttentionConfig&,
                                          const MultiheadAttentionParameters<double>&);
template class BasicMultiheadAttention<float>;
template class BasicMultiheadAttention<double>;

namespace detail {
namespace {

// (rows, cols) -> (cols, rows).
template <class T>
Tensor<T> transposed(const Tensor<T>& w) {
  const int64_t rows = w.size(0), cols = w.size(1);
  Tensor<T> t(Shape{cols, rows});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = w[r * cols + c];
  return t;
}

}  // namespace

template <class T>
std::shared_ptr<const ProjectionWeights<T>> ProjectionWeights<T>::from(
    const MultiheadAttentionConfig& config, const MultiheadAttentionParameters<T>& p) {
  auto w = std::make_shared<ProjectionWeights<T>>();
  if (config.same_embed_dim()) {
    w->in_proj_t = transposed(p.in_proj_weight);
  } else {
    w->q_proj_t = transposed(p.q_proj_weight);
    w->k_proj_t = transposed(p.k_proj_weight);
    w->v_proj_t = transposed(p.v_proj_weight);
  }
  w->out_proj_t = transposed(p.out_proj_weight);
  return w;
}

template struct ProjectionWeights<float>;
template struct ProjectionWeights<double>;

}  // namespace detail

}  // namespace multihead
