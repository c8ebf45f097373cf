// src/train/layers.hpp: the trainer's layers, each forward next to its
// backward (llm.c's layout). Every backward quotes the forward line it
// differentiates and ADDS into its d_ outputs (the caller zeroes them), so
// a tensor used twice (a residual stream) collects both contributions.
//
// Legend: N tokens (rows; B·L), E width, F feed-forward width, V vocabulary.
// Activations are row-major (N, width). Reductions over tokens (d_W, d_b,
// d_gamma, the loss) run in token order on one thread or through the
// linear layer's fixed blocks (core/linear.hpp), so their sums are the same
// for any thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/linear.hpp"

namespace multihead::train {

// ---- token embedding (nn.Embedding) ------------------------------------------------
// x[n, :] = weight[tokens[n], :]
template <class T>
void embedding_forward(const int32_t* tokens, int64_t N, const T* weight, int64_t E, T* x) {
  for (int64_t n = 0; n < N; ++n) std::copy_n(weight + int64_t{tokens[n]} * E, E, x + n * E);
}

template <class T>
void embedding_backward(const int32_t* tokens, int64_t N, const T* d_x, int64_t E, T* d_weight) {
  // forward: x[n, :] = weight[tokens[n], :]  =>  d_weight[tokens[n], :] += d_x[n, :]
  // (a token that occurs twice collects both rows, added in token order)
  for (int64_t n = 0; n < N; ++n) {
    T* row = d_weight + int64_t{tokens[n]} * E;
    for (int64_t e = 0; e < E; ++e) row[e] += d_x[n * E + e];
  }
}

// ---- sinusoidal positions (Vaswani §3.5), a constant added to the embedding ----------
// x[b, l, :] += pe[l, :]    (pe is (L, E), from multihead::sinusoidal_positions)
template <class T>
void positions_forward(T* x, int64_t B, int64_t L, int64_t E, const T* pe) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L * E; ++i) x[b * L * E + i] += pe[i];
}

template <class T>
void positions_backward(const T* d_x, int64_t N, int64_t E, T* d_embedded) {
  // forward: x = embedded + pe, pe constant  =>  d_embedded += d_x (no parameter)
  for (int64_t i = 0; i < N * E; ++i) d_embedded[i] += d_x[i];
}

// ---- layer norm (nn.LayerNorm(E), eps 1e-5) ----------------------------------------
// mean_n = Σ_e x[n,e] / E,  rstd_n = 1/√(Σ_e (x[n,e] − mean_n)² / E + eps)
// y[n, e] = (x[n, e] − mean_n) · rstd_n · gamma[e] + beta[e]
// Statistics accumulate in double and are kept, rounded to T, for backward.
constexpr double kLayerNormEps = 1e-5;

template <class T>
void layernorm_forward(const T* x, int64_t N, int64_t E, const T* gamma, const T* beta, T* y, T* mean,
                       T* rstd) {
  for (int64_t n = 0; n < N; ++n) {
    const T* xn = x + n * E;
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += xn[e];
    const double mu = sum / double(E);
    double var = 0;
    for (int64_t e = 0; e < E; ++e) var += (xn[e] - mu) * (xn[e] - mu);
    const double r = 1.0 / std::sqrt(var / double(E) + kLayerNormEps);
    mean[n] = T(mu);
    rstd[n] = T(r);
    for (int64_t e = 0; e < E; ++e) y[n * E + e] = T((xn[e] - mu) * r) * gamma[e] + beta[e];
  }
}

template <class T>
void layernorm_backward(const T* d_y, const T* x, const T* mean, const T* rstd, const T* gamma, int64_t N,
                        int64_t E, T* d_x, T* d_gamma, T* d_beta) {
  for (int64_t n = 0; n < N; ++n) {
    const T* xn = x + n * E;
    const T* dy = d_y + n * E;
    // forward: y = norm · gamma + beta, norm = (x − mean) · rstd
    //   =>  d_gamma += norm · d_y,  d_beta += d_y,  d_norm = gamma · d_y
    // forward: mean and rstd are functions of the row x, so
    //   d_x = rstd · (d_norm − mean_e(d_norm) − norm · mean_e(d_norm · norm))
    double mean_d = 0, mean_d_norm = 0;
    for (int64_t e = 0; e < E; ++e) {
      const double norm = (double(xn[e]) - mean[n]) * rstd[n];
      const double d_norm = double(gamma[e]) * dy[e];
      mean_d += d_norm;
      mean_d_norm += d_norm * norm;
    }
    mean_d /= double(E);
    mean_d_norm /= double(E);
    for (int64_t e = 0; e < E; ++e) {
      const double norm = (double(xn[e]) - mean[n]) * rstd[n];
      const double d_norm = double(gamma[e]) * dy[e];
      d_gamma[e] += T(norm * dy[e]);
      d_beta[e] += dy[e];
      d_x[n * E + e] += T(rstd[n] * (d_norm - mean_d - norm * mean_d_norm));
    }
  }
}

// ---- linear (nn.Linear(in, out)) ---------------------------------------------------
// The library's one linear layer, core/linear.hpp: forward writes y, the
// backward here always accumulates (LinearOptions::accumulate), as every
// layer in this file does.

// ---- ReLU --------------------------------------------------------------------------
// y = max(x, 0)
template <class T>
void relu_forward(const T* x, int64_t count, T* y) {
  for (int64_t i = 0; i < count; ++i) y[i] = x[i] > T(0) ? x[i] : T(0);
}

template <class T>
void relu_backward(const T* d_y, const T* x, int64_t count, T* d_x) {
  // forward: y = max(x, 0)  =>  d_x += d_y where x > 0 (the subgradient 0 at x = 0, as PyTorch)
  for (int64_t i = 0; i < count; ++i)
    if (x[i] > T(0)) d_x[i] += d_y[i];
}

// ---- cross-entropy over the counted positions ---------------------------------------
// count = Σ_n mask[n];  loss = (1/count) Σ_{n: mask[n]} (logsumexp(z[n, :]) − z[n, targets[n]])
// as F.cross_entropy(logits[mask], targets[mask]) (mean reduction); loss 0
// when nothing counts. probs (N×V) keeps softmax(z) for backward; correct
// counts the counted rows whose first maximal logit is the target.
struct CrossEntropyResult {
  double loss = 0;
  double sum = 0;  // Σ over the counted positions, in position order (loss = sum / count)
  int64_t count = 0;
  int64_t correct = 0;
};

template <class T>
CrossEntropyResult cross_entropy_forward(const T* logits, const int32_t* targets, const uint8_t* mask, int64_t N,
                                         int64_t V, T* probs) {
  CrossEntropyResult r;
  double sum = 0;
  for (int64_t n = 0; n < N; ++n) {
    const T* z = logits + n * V;
    int64_t arg = 0;
    for (int64_t v = 1; v < V; ++v)
      if (z[v] > z[arg]) arg = v;
    double total = 0;
    for (int64_t v = 0; v < V; ++v) total += std::exp(double(z[v]) - double(z[arg]));
    for (int64_t v = 0; v < V; ++v) probs[n * V + v] = T(std::exp(double(z[v]) - double(z[arg])) / total);
    if (mask[n] == 0) continue;
    const double lse = double(z[arg]) + std::log(total);
    sum += lse - double(z[targets[n]]);
    r.count += 1;
    r.correct += arg == targets[n] ? 1 : 0;
  }
  r.sum = sum;
  r.loss = r.count > 0 ? sum / double(r.count) : 0.0;
  return r;
}

template <class T>
void cross_entropy_backward(const T* probs, const int32_t* targets, const uint8_t* mask, int64_t N, int64_t V,
                            int64_t count, T* d_logits) {
  // forward: loss = (1/count) Σ_{n: mask} (logsumexp(z[n]) − z[n, t_n])
  //   =>  d_z[n, v] += mask[n]/count · (softmax(z[n])[v] − [v = t_n])
  if (count == 0) return;
  const double w = 1.0 / double(count);
  for (int64_t n = 0; n < N; ++n) {
    if (mask[n] == 0) continue;
    for (int64_t v = 0; v < V; ++v)
      d_logits[n * V + v] += T(w * (double(probs[n * V + v]) - (v == targets[n] ? 1.0 : 0.0)));
  }
}

}  // namespace multihead::train
