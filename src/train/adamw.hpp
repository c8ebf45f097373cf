// src/train/adamw.hpp: AdamW (Loshchilov & Hutter 2019, decoupled weight
// decay) as torch.optim.AdamW computes it (PyTorch 1.13,
// torch/optim/adamw.py, _single_tensor_adamw, amsgrad off), and global-norm
// gradient clipping as torch.nn.utils.clip_grad_norm_.
//
// For step t = 1, 2, … and each element:
//   θ ← θ · (1 − lr · λ)                          decoupled decay (λ = 0 where excluded)
//   m ← β1 · m + (1 − β1) · g
//   v ← β2 · v + (1 − β2) · g²
//   θ ← θ − (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + ε)
//
// Weight decay applies to the weight matrices of linear maps (the attention
// projections, the feed-forward layers, the read-out) and not to biases,
// layer-norm gains and shifts or the embedding, as minGPT's configure_optimizers
// (Karpathy): decaying a gain or a bias towards 0 pulls against what the
// norm or the shift is for, and an embedding row is only updated when its
// token occurs, so its decay would depend on token frequency.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>

#include "multihead/tensor.hpp"

namespace multihead::train {

struct AdamWSettings {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

// Whether `name` (a parameter name of multihead/train.hpp) gets weight decay.
bool decays(const std::string& name);

// The moments of one parameter.
template <class T>
struct AdamWMoments {
  Tensor<T> m, v;  // exp_avg, exp_avg_sq: same shape as the parameter
};

// One AdamW update of `param` with gradient `grad`, at step t >= 1 (the
// count including this step), lr = this step's learning rate. The element
// arithmetic is in double, rounded once to T per stored value.
template <class T>
void adamw_update(Tensor<T>& param, const Tensor<T>& grad, AdamWMoments<T>& moments, const AdamWSettings& s,
                  bool decay, int64_t t) {
  const double bias1 = 1.0 - std::pow(s.beta1, double(t));
  const double bias2_sqrt = std::sqrt(1.0 - std::pow(s.beta2, double(t)));
  const double step_size = s.lr / bias1;
  const double keep = decay ? 1.0 - s.lr * s.weight_decay : 1.0;
  T* p = param.data();
  const T* g = grad.data();
  T* m = moments.m.data();
  T* v = moments.v.data();
  for (int64_t i = 0; i < param.numel(); ++i) {
    const double gi = g[i];
    const double mi = s.beta1 * double(m[i]) + (1.0 - s.beta1) * gi;
    const double vi = s.beta2 * double(v[i]) + (1.0 - s.beta2) * gi * gi;
    m[i] = T(mi);
    v[i] = T(vi);
    const double denom = std::sqrt(double(v[i])) / bias2_sqrt + s.eps;
    p[i] = T(double(p[i]) * keep - step_size * double(m[i]) / denom);
  }
}

// The global L2 norm of every gradient (in map order, summed in double, so
// the same for any thread count); when max_norm > 0 and the norm exceeds
// it, every gradient is scaled by max_norm / (norm + 1e-6), as
// clip_grad_norm_. Returns the norm before clipping.
template <class T>
double clip_gradients(std::map<std::string, Tensor<T>>& grads, double max_norm) {
  double sum = 0;
  for (const auto& [name, g] : grads)
    for (int64_t i = 0; i < g.numel(); ++i) sum += double(g[i]) * double(g[i]);
  const double norm = std::sqrt(sum);
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (auto& [name, g] : grads)
      for (int64_t i = 0; i < g.numel(); ++i) g[i] = T(double(g[i]) * scale);
  }
  return norm;
}

}  // namespace multihead::train
