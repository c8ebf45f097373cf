// tests/test_mha_backward.cpp: the fused form's backward pass
// (src/attention/multihead_attention_backward.cpp) against central finite
// differences of our own float64 forward, over a table of options; the
// training forward against the plain one (bit-identical); the training API's
// refusals; update_parameters.
//
// Finite differences. ℓ(θ) = Σ output ⊙ R for a fixed random R, so
// dℓ/d(output) = R. For every element x of every input and parameter,
//   fd = (ℓ(x + h) − ℓ(x − h)) / 2h,   h = 1e-5.
// Its error is truncation h²/6·|ℓ'''| plus rounding ≈ eps64·|ℓ|/h. Here the
// inputs are O(1), the shapes tiny (|ℓ| ≲ 30, |ℓ'''| ≲ 1e2), so the error
// per element is ≲ 2e-9 + 7e-10 ≈ 3e-9, against gradient tensors of norm
// ≳ 0.1: relative ≲ 1e-7 per tensor (worst tensor measured: printed). A
// wrong gradient term (a missing bias column, a transposed weight, a lost
// dropout scale) gives O(1) relative error, so 1e-6 separates the two with
// room; CheckerFailsOnAPerturbedGradient shows that it does. Dropout's keep
// decisions are a hash of (seed, slice, i, j), not of the values, so ℓ stays
// smooth under the perturbations and differences see the same mask.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "multihead/attention.hpp"
#include "multihead/error.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/runtime.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

using test::error_of;

using test::random_tensor;

struct BackwardCase {
  int64_t E, H, B, L, S, kdim, vdim;
  bool bias, bias_kv, zero_attn, batch_first, unbatched, self;
  int mask;  // 0 none, 1 bool 2-D, 2 float 2-D, 3 bool 3-D, 4 float 3-D
  int kpm;   // 0 none, 1 bool, 2 float
  bool causal, bottom_right;
  double dropout;
  int64_t window;   // 0 none
  double softcap;   // 0 none
  bool alibi;
  FusedPaths::Heads heads;
  std::string name() const {
    std::string n = "E" + std::to_string(E) + "_H" + std::to_string(H) + "_B" + std::to_string(B) + "_L" +
                    std::to_string(L) + "_S" + std::to_string(S) + "_k" + std::to_string(kdim) + "_v" +
                    std::to_string(vdim);
    if (!bias) n += "_nobias";
    if (bias_kv) n += "_biaskv";
    if (zero_attn) n += "_zeroattn";
    if (batch_first) n += "_batchfirst";
    if (unbatched) n += "_unbatched";
    if (self) n += "_self";
    static const char* masks[] = {"", "_mask2dbool", "_mask2dfloat", "_mask3dbool", "_mask3dfloat"};
    static const char* kpms[] = {"", "_kpmbool", "_kpmfloat"};
    n += masks[mask];
    n += kpms[kpm];
    if (causal) n += bottom_right ? "_causalBR" : "_causal";
    if (dropout > 0) n += "_dropout" + std::to_string(static_cast<int>(dropout * 100));
    if (window) n += "_window" + std::to_string(window);
    if (softcap > 0) n += "_softcap";
    if (alibi) n += "_alibi";
    n += heads == FusedPaths::Heads::HeadMajor ? "_headmajor" : heads == FusedPaths::Heads::Views ? "_views" : "";
    return n;
  }
};

using FH = FusedPaths::Heads;
// Each row mixes options so that together they cover every forward option
// the backward handles (both heads paths, packed self-attention, kdim/vdim).
const BackwardCase kFiniteDifferenceCases[] = {
    {8, 2, 2, 3, 4, 0, 0, true, false, false, false, false, false, 0, 0, false, false, 0, 0, 0, false, FH::Views},
    {8, 2, 2, 4, 4, 0, 0, true, false, false, false, false, true, 1, 1, true, false, 0, 0, 0, false, FH::Views},
    {8, 2, 2, 4, 4, 0, 0, true, true, true, true, false, true, 2, 0, false, false, 0.3, 0, 0, false, FH::HeadMajor},
    {6, 3, 2, 3, 5, 5, 7, true, true, false, false, false, false, 3, 2, false, false, 0, 0, 0, false, FH::HeadMajor},
    {6, 2, 1, 4, 3, 4, 0, false, false, true, true, false, false, 4, 1, true, true, 0, 0, 0, false, FH::Views},
    {8, 4, 2, 3, 5, 0, 0, true, false, false, false, true, false, 0, 2, false, false, 0.2, 2, 0, false, FH::Views},
    {8, 2, 2, 5, 5, 0, 0, true, false, false, true, false, true, 0, 0, true, false, 0, 3, 1.5, true, FH::HeadMajor},
    {4, 2, 1, 3, 6, 0, 5, true, true, true, false, true, false, 1, 0, true, true, 0.25, 0, 2.0, true, FH::Views},
};

template <class T>
struct Problem {
  MultiheadAttentionConfig config;
  Tensor<T> q, k, v;
  std::unique_ptr<Mask<T>> attn, kpm;
  ForwardOptions<T> options;
};

template <class T>
Problem<T> make_problem(const BackwardCase& c, std::mt19937_64& rng) {
  Problem<T> p;
  p.config.embed_dim = c.E;
  p.config.num_heads = c.H;
  p.config.dropout = c.dropout;
  p.config.bias = c.bias;
  p.config.add_bias_kv = c.bias_kv;
  p.config.add_zero_attn = c.zero_attn;
  p.config.kdim = c.kdim;
  p.config.vdim = c.vdim;
  p.config.batch_first = c.batch_first;
  const int64_t Ek = c.kdim ? c.kdim : c.E, Ev = c.vdim ? c.vdim : c.E;
  auto shape = [&](int64_t len, int64_t width) {
    if (c.unbatched) return Shape{len, width};
    return c.batch_first ? Shape{c.B, len, width} : Shape{len, c.B, width};
  };
  p.q = random_tensor<T>(shape(c.L, c.E), rng);
  if (!c.self) {
    p.k = random_tensor<T>(shape(c.S, Ek), rng);
    p.v = random_tensor<T>(shape(c.S, Ev), rng);
  }
  const int64_t B = c.unbatched ? 1 : c.B;
  std::bernoulli_distribution drop(0.3);
  if (c.mask) {
    const Shape s = c.mask <= 2 ? Shape{c.L, c.S} : Shape{B * c.H, c.L, c.S};
    if (c.mask == 1 || c.mask == 3) {
      Tensor<uint8_t> m(s);
      for (auto& x : m.vec()) x = drop(rng);
      p.attn = std::make_unique<Mask<T>>(Mask<T>::boolean(std::move(m)));
    } else {
      p.attn = std::make_unique<Mask<T>>(Mask<T>::additive(random_tensor<T>(s, rng)));
    }
  }
  if (c.kpm) {
    const Shape s = c.unbatched ? Shape{c.S} : Shape{B, c.S};
    if (c.kpm == 1) {
      Tensor<uint8_t> m(s);
      for (auto& x : m.vec()) x = drop(rng);
      p.kpm = std::make_unique<Mask<T>>(Mask<T>::boolean(std::move(m)));
    } else {
      p.kpm = std::make_unique<Mask<T>>(Mask<T>::additive(random_tensor<T>(s, rng)));
    }
  }
  p.options.attn_mask = p.attn.get();
  p.options.key_padding_mask = p.kpm.get();
  p.options.need_weights = false;
  p.options.training = c.dropout > 0;
  p.options.attention.dropout_seed = 1234;
  p.options.attention.is_causal = c.causal;
  p.options.attention.causal_alignment = c.bottom_right ? CausalAlignment::BottomRight : CausalAlignment::TopLeft;
  if (c.window) p.options.attention.window = c.window;
  if (c.softcap > 0) p.options.attention.softcap = c.softcap;
  p.options.alibi = c.alibi;
  p.options.paths.heads = c.heads;
  p.options.attention.kernel = AttentionKernel::Reference;
  return p;
}

template <class T>
const Tensor<T>& key_of(const Problem<T>& p) {
  return p.k.shape().empty() ? p.q : p.k;
}
template <class T>
const Tensor<T>& value_of(const Problem<T>& p) {
  return p.v.shape().empty() ? p.q : p.v;
}

double loss(const BasicMultiheadAttention<double>& m, const Tensor<double>& q, const Tensor<double>& k,
            const Tensor<double>& v, const ForwardOptions<double>& o, const Tensor<double>& R) {
  const Tensor<double> out = m.forward(q, k, v, o).output;
  double s = 0;
  for (int64_t i = 0; i < out.numel(); ++i) s += out[i] * R[i];
  return s;
}

// ‖a − b‖ / max(‖b‖, 1e-3): relative, except for gradients that are (almost)
// zero, where 1e-3 keeps rounding from looking large.
double gradient_error(const Tensor<double>& a, const Tensor<double>& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-3);
}

constexpr double kStep = 1e-5;
constexpr double kBound = 1e-6;

// Central differences of ℓ for every input (the shared tensor once, for
// self-attention) and every parameter, by name.
std::map<std::string, Tensor<double>> finite_differences(const BasicMultiheadAttention<double>& m,
                                                         const Problem<double>& p, const Tensor<double>& R) {
  std::map<std::string, Tensor<double>> fd;
  const bool self = p.k.shape().empty();
  auto input_fd = [&](const std::string& name, int which) {
    const Tensor<double>& x0 = which == 0 ? p.q : which == 1 ? p.k : p.v;
    Tensor<double> d(x0.shape());
    for (int64_t i = 0; i < x0.numel(); ++i) {
      Tensor<double> x = x0;
      x[i] = x0[i] + kStep;
      const Tensor<double>& qp = which == 0 ? x : p.q;
      const double up = self ? loss(m, x, x, x, p.options, R)
                             : loss(m, qp, which == 1 ? x : p.k, which == 2 ? x : p.v, p.options, R);
      x[i] = x0[i] - kStep;
      const double down = self ? loss(m, x, x, x, p.options, R)
                               : loss(m, qp, which == 1 ? x : p.k, which == 2 ? x : p.v, p.options, R);
      d[i] = (up - down) / (2 * kStep);
    }
    fd[name] = std::move(d);
  };
  input_fd("query", 0);
  if (!self) {
    input_fd("key", 1);
    input_fd("value", 2);
  }
  for (const auto& entry : m.state_dict()) {
    // Not a structured binding: clang 14 cannot capture one in a lambda.
    const std::string& name = entry.first;
    const Tensor<double>& t0 = entry.second;
    Tensor<double> d(t0.shape());
    for (int64_t i = 0; i < t0.numel(); ++i) {
      double pm[2];
      for (int s = 0; s < 2; ++s) {
        BasicMultiheadAttention<double> copy = m;
        copy.update_parameters([&](const std::string& n, Tensor<double>& t) {
          if (n == name) t[i] += s == 0 ? kStep : -kStep;
        });
        pm[s] = loss(copy, p.q, key_of(p), value_of(p), p.options, R);
      }
      d[i] = (pm[0] - pm[1]) / (2 * kStep);
    }
    fd["param:" + name] = std::move(d);
  }
  return fd;
}

// The analytic gradients under the finite differences' names (the three
// input gradients summed for self-attention, as the caller does).
std::map<std::string, Tensor<double>> analytic(const BasicMultiheadAttention<double>& m, const Problem<double>& p,
                                               const Tensor<double>& R) {
  ForwardContext<double> ctx;
  m.forward(p.q, key_of(p), value_of(p), p.options, ctx);
  MultiheadAttentionGradients<double> g = m.backward(ctx, R);
  std::map<std::string, Tensor<double>> a;
  if (p.k.shape().empty()) {
    Tensor<double> sum = g.query;
    for (int64_t i = 0; i < sum.numel(); ++i) sum[i] += g.key[i] + g.value[i];
    a["query"] = std::move(sum);
  } else {
    a["query"] = g.query;
    a["key"] = g.key;
    a["value"] = g.value;
  }
  for (auto& [name, t] : g.parameters) a["param:" + name] = t;
  return a;
}

// The worst error over tensors, printing each; fails on a missing name or shape mismatch.
double worst_error(const std::map<std::string, Tensor<double>>& a, const std::map<std::string, Tensor<double>>& fd,
                   const std::string& label) {
  double worst = 0;
  EXPECT_EQ(a.size(), fd.size()) << label;
  for (const auto& [name, f] : fd) {
    auto it = a.find(name);
    if (it == a.end() || it->second.shape() != f.shape()) {
      ADD_FAILURE() << label << ": gradient " << name << " missing or of the wrong shape";
      return INFINITY;
    }
    const double e = gradient_error(it->second, f);
    if (!(e < kBound)) {
      // The first element that differs most, with both values.
      int64_t at = 0;
      double d = -1;
      for (int64_t i = 0; i < f.numel(); ++i)
        if (std::abs(it->second[i] - f[i]) > d) d = std::abs(it->second[i] - f[i]), at = i;
      std::printf("  %s %s: rel %.3g > %.0e, worst at %lld: analytic %.12g, fd %.12g\n", label.c_str(),
                  name.c_str(), e, kBound, static_cast<long long>(at), it->second[at], f[at]);
    }
    worst = std::max(worst, std::isnan(e) ? INFINITY : e);
  }
  return worst;
}

class MhaFiniteDifferences : public ::testing::TestWithParam<BackwardCase> {};

// The differences run the reference forward whichever kernel the backward
// under test runs (the float64 kernels: reference, materialized), so the
// oracle is the plain loops' function.
void check_finite_differences(const BackwardCase& c, AttentionKernel kernel) {
  std::mt19937_64 rng(42);
  Problem<double> p = make_problem<double>(c, rng);
  BasicMultiheadAttention<double> m(p.config, 7);
  // Non-zero biases (the module starts them at 0), so their paths matter.
  m.update_parameters([&](const std::string& name, Tensor<double>& t) {
    if (name.find("bias") != std::string::npos)
      for (int64_t i = 0; i < t.numel(); ++i) t[i] = 0.5 * std::normal_distribution<double>()(rng);
  });
  ForwardResult<double> probe = m.forward(p.q, key_of(p), value_of(p), p.options);
  const Tensor<double> R = random_tensor<double>(probe.output.shape(), rng);
  const auto fd = finite_differences(m, p, R);
  p.options.attention.kernel = kernel;
  const std::string label = c.name() + "_" + to_string(kernel);
  const double worst = worst_error(analytic(m, p, R), fd, label);
  std::printf("[ fd ] %s: worst relative error %.3g (bound %.0e, step %.0e)\n", label.c_str(), worst, kBound,
              kStep);
  EXPECT_LT(worst, kBound);
}

TEST_P(MhaFiniteDifferences, Float64_Reference) { check_finite_differences(GetParam(), AttentionKernel::Reference); }
TEST_P(MhaFiniteDifferences, Float64_Materialized) {
  check_finite_differences(GetParam(), AttentionKernel::Materialized);
}

INSTANTIATE_TEST_SUITE_P(Table, MhaFiniteDifferences, ::testing::ValuesIn(kFiniteDifferenceCases),
                         [](const auto& info) { return info.param.name(); });

// The checker itself: one analytic element off by 1e-3 of its tensor's norm
// must fail the bound.
TEST(MhaFiniteDifferences, CheckerFailsOnAPerturbedGradient) {
  const BackwardCase c = kFiniteDifferenceCases[3];
  std::mt19937_64 rng(42);
  Problem<double> p = make_problem<double>(c, rng);
  BasicMultiheadAttention<double> m(p.config, 7);
  const Tensor<double> R =
      random_tensor<double>(m.forward(p.q, key_of(p), value_of(p), p.options).output.shape(), rng);
  const auto fd = finite_differences(m, p, R);
  for (const char* name : {"param:k_proj_weight", "value", "param:bias_v"}) {
    auto a = analytic(m, p, R);
    Tensor<double>& t = a.at(name);
    double norm = 0;
    for (int64_t i = 0; i < t.numel(); ++i) norm += t[i] * t[i];
    t[t.numel() / 2] += 1e-3 * std::max(std::sqrt(norm), 1e-3);
    EXPECT_GE(worst_error(a, fd, std::string("perturbed ") + name), kBound) << name;
  }
}

// The training forward computes exactly what the plain forward computes.
template <class T>
void check_training_forward_identical(const BackwardCase& c, AttentionKernel kernel, bool need_weights) {
  std::mt19937_64 rng(5);
  Problem<T> p = make_problem<T>(c, rng);
  p.options.attention.kernel = kernel;
  p.options.need_weights = need_weights;
  p.options.average_attn_weights = false;
  BasicMultiheadAttention<T> m(p.config, 3);
  const ForwardResult<T> plain = m.forward(p.q, key_of(p), value_of(p), p.options);
  ForwardContext<T> ctx;
  const ForwardResult<T> trained = m.forward(p.q, key_of(p), value_of(p), p.options, ctx);
  ASSERT_FALSE(ctx.empty());
  ASSERT_EQ(plain.output.shape(), trained.output.shape());
  EXPECT_EQ(0, std::memcmp(plain.output.data(), trained.output.data(), sizeof(T) * plain.output.numel()))
      << c.name() << " kernel " << to_string(kernel);
  ASSERT_EQ(plain.attn_weights.has_value(), trained.attn_weights.has_value());
  if (plain.attn_weights) {
    EXPECT_EQ(0, std::memcmp(plain.attn_weights->data(), trained.attn_weights->data(),
                             sizeof(T) * plain.attn_weights->numel()))
        << c.name();
  }
}

TEST(MhaTrainingForward, BitIdenticalToPlainForward_EveryCase_Kernels) {
  for (const BackwardCase& c : kFiniteDifferenceCases) {
    for (AttentionKernel k : {AttentionKernel::Reference, AttentionKernel::Materialized, AttentionKernel::Auto}) {
      check_training_forward_identical<double>(c, k, k != AttentionKernel::Auto);
      check_training_forward_identical<float>(c, k, k != AttentionKernel::Auto);
    }
    check_training_forward_identical<float>(c, AttentionKernel::Flash, false);
  }
}

// A context and a gradients object reused across steps of different shapes
// give what fresh ones give.
TEST(MhaBackward, ReusedContextAndGradientsMatchFresh_Float32) {
  ForwardContext<float> ctx;
  MultiheadAttentionGradients<float> g;
  for (int step = 0; step < 3; ++step) {
    const BackwardCase& c = kFiniteDifferenceCases[step == 1 ? 3 : 1];
    std::mt19937_64 rng(11 + step);
    Problem<float> p = make_problem<float>(c, rng);
    BasicMultiheadAttention<float> m(p.config, 3);
    const Tensor<float> R =
        random_tensor<float>(m.forward(p.q, key_of(p), value_of(p), p.options, ctx).output.shape(), rng);
    m.backward(ctx, R, g);
    ForwardContext<float> fresh_ctx;
    m.forward(p.q, key_of(p), value_of(p), p.options, fresh_ctx);
    const MultiheadAttentionGradients<float> fresh = m.backward(fresh_ctx, R);
    ASSERT_EQ(fresh.parameters.size(), g.parameters.size()) << c.name();
    EXPECT_EQ(0, std::memcmp(fresh.query.data(), g.query.data(), sizeof(float) * fresh.query.numel()));
    EXPECT_EQ(0, std::memcmp(fresh.key.data(), g.key.data(), sizeof(float) * fresh.key.numel()));
    for (const auto& [name, t] : fresh.parameters)
      EXPECT_EQ(0, std::memcmp(t.data(), g.parameters.at(name).data(), sizeof(float) * t.numel())) << name;
  }
  EXPECT_GT(ctx.bytes(), 0u);
  ctx.clear();
  EXPECT_TRUE(ctx.empty());
}

// The training context keeps the masks as the forward's kernel read them:
// the caller's masks may change (or die) before backward. Here they are
// replaced, in place, by others (every key padded but one, no attention
// mask) between forward and backward: the gradients must still be those of
// the masks the forward saw. A context that read the caller's masks at the
// backward would see the new ones and differ.
TEST(MhaBackward, ContextKeepsItsOwnMasks_Mask3dBool_KpmFloat) {
  const BackwardCase& c = kFiniteDifferenceCases[3];
  ASSERT_TRUE(c.mask == 3 && c.kpm == 2);
  MultiheadAttentionGradients<double> g[2];
  for (int changed = 0; changed < 2; ++changed) {
    std::mt19937_64 rng(21);
    Problem<double> p = make_problem<double>(c, rng);
    BasicMultiheadAttention<double> m(p.config, 3);
    ForwardContext<double> ctx;
    const Tensor<double> out = m.forward(p.q, key_of(p), value_of(p), p.options, ctx).output;
    const Tensor<double> R = random_tensor<double>(out.shape(), rng);
    if (changed) {
      Tensor<uint8_t> none(p.attn->shape(), 0);
      *p.attn = Mask<double>::boolean(std::move(none));
      Tensor<double> pad(p.kpm->shape(), -1e9);
      for (int64_t b = 0; b < pad.size(0); ++b) pad[b * pad.size(1)] = 0;
      *p.kpm = Mask<double>::additive(std::move(pad));
    }
    g[changed] = m.backward(ctx, R);
  }
  EXPECT_EQ(0, std::memcmp(g[0].query.data(), g[1].query.data(), sizeof(double) * g[0].query.numel()));
  for (const auto& [name, t] : g[0].parameters)
    EXPECT_EQ(0, std::memcmp(t.data(), g[1].parameters.at(name).data(), sizeof(double) * t.numel())) << name;
}

// The kernel is chosen once per training step: the backward runs the kernel
// the forward ran, even if the force changes in between. (The reference and
// flash backwards differ in their last bits here, checked first, so the
// comparison can tell them apart.)
TEST(MhaBackward, BackwardRunsTheForwardsKernel_Float32_AutoThenForcedReference) {
  BackwardCase c = kFiniteDifferenceCases[1];  // causal, bool mask, bool key padding
  c.E = 64;
  c.H = 2;
  c.L = c.S = 70;  // head width 32, more than one key tile: the kernels' sums differ in order
  const auto step = [&](AttentionKernel before_forward, AttentionKernel before_backward) {
    std::mt19937_64 rng(5);
    Problem<float> p = make_problem<float>(c, rng);
    p.options.attention.kernel = AttentionKernel::Auto;  // flash, unless forced
    BasicMultiheadAttention<float> m(p.config, 3);
    ForwardContext<float> ctx;
    kernel_force(before_forward);
    const Tensor<float> out = m.forward(p.q, key_of(p), value_of(p), p.options, ctx).output;
    kernel_force(before_backward);
    MultiheadAttentionGradients<float> g = m.backward(ctx, random_tensor<float>(out.shape(), rng));
    kernel_force(AttentionKernel::Auto);
    return g;
  };
  const auto same = [](const MultiheadAttentionGradients<float>& a, const MultiheadAttentionGradients<float>& b) {
    if (std::memcmp(a.query.data(), b.query.data(), sizeof(float) * a.query.numel()) != 0) return false;
    for (const auto& [name, t] : a.parameters)
      if (std::memcmp(t.data(), b.parameters.at(name).data(), sizeof(float) * t.numel()) != 0) return false;
    return true;
  };
  const MultiheadAttentionGradients<float> flash = step(AttentionKernel::Auto, AttentionKernel::Auto);
  const MultiheadAttentionGradients<float> reference = step(AttentionKernel::Reference, AttentionKernel::Reference);
  ASSERT_FALSE(same(flash, reference)) << "the two kernels agree to the bit here: the test could not tell them apart";
  EXPECT_TRUE(same(flash, step(AttentionKernel::Auto, AttentionKernel::Reference)));
  EXPECT_TRUE(same(reference, step(AttentionKernel::Reference, AttentionKernel::Flash)));
}

TEST(MhaBackward, RefusesEmptyForeignStaleContextAndBadDOutput) {
  const BackwardCase& c = kFiniteDifferenceCases[0];
  std::mt19937_64 rng(1);
  Problem<float> p = make_problem<float>(c, rng);
  BasicMultiheadAttention<float> m(p.config, 3), other(p.config, 3);
  ForwardContext<float> ctx;
  const Tensor<float> R = random_tensor<float>({c.L, c.B, c.E}, rng);
  EXPECT_NE(error_of([&] { m.backward(ctx, R); }).find("context: empty ForwardContext"), std::string::npos);
  m.forward(p.q, key_of(p), value_of(p), p.options, ctx);
  EXPECT_NE(error_of([&] { other.backward(ctx, R); }).find("another module"), std::string::npos);
  const std::string bad = error_of([&] { m.backward(ctx, Tensor<float>({c.L, c.B, c.E + 1})); });
  EXPECT_NE(bad.find("d_output"), std::string::npos) << bad;
  EXPECT_NE(bad.find(std::to_string(c.E + 1)), std::string::npos) << bad;
  EXPECT_EQ(error_of([&] { m.backward(ctx, R); }), "");
  m.update_parameters([](const std::string&, Tensor<float>&) {});
  EXPECT_NE(error_of([&] { m.backward(ctx, R); }).find("before update_parameters"), std::string::npos);
  // A moved-from context is empty, and can be filled again.
  ForwardContext<float> moved = std::move(ctx);
  EXPECT_TRUE(ctx.empty());  // NOLINT(bugprone-use-after-move): documented state
  m.forward(p.q, key_of(p), value_of(p), p.options, ctx);
  EXPECT_EQ(error_of([&] { m.backward(ctx, R); }), "");
}

// update_parameters: the module then computes what a module built from the
// updated parameters computes (the transposed copies were rebuilt), and a
// reshaping update is refused, naming the parameter, leaving it unchanged.
TEST(MhaUpdateParameters, RebuildsDerivedWeightsAndRefusesReshape) {
  const BackwardCase& c = kFiniteDifferenceCases[3];  // kdim/vdim: q/k/v_proj_weight
  std::mt19937_64 rng(2);
  Problem<float> p = make_problem<float>(c, rng);
  BasicMultiheadAttention<float> m(p.config, 3);
  std::vector<std::string> names;
  m.update_parameters([&](const std::string& name, Tensor<float>& t) {
    names.push_back(name);
    for (int64_t i = 0; i < t.numel(); ++i) t[i] = t[i] * 0.5f + 0.01f * static_cast<float>(i % 7);
  });
  std::vector<std::string> expected;
  for (const auto& [name, t] : m.state_dict()) expected.push_back(name);
  EXPECT_EQ(names, expected);
  MultiheadAttentionParameters<float> params = m.parameters();
  BasicMultiheadAttention<float> rebuilt(p.config, params);
  const Tensor<float> a = m.forward(p.q, key_of(p), value_of(p), p.options).output;
  const Tensor<float> b = rebuilt.forward(p.q, key_of(p), value_of(p), p.options).output;
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), sizeof(float) * a.numel()));
  const std::string e = error_of([&] {
    m.update_parameters([](const std::string& name, Tensor<float>& t) {
      if (name == "k_proj_weight") t = Tensor<float>({2, 2});
    });
  });
  EXPECT_NE(e.find("k_proj_weight"), std::string::npos) << e;
  const Tensor<float> after = m.forward(p.q, key_of(p), value_of(p), p.options).output;
  EXPECT_EQ(0, std::memcmp(a.data(), after.data(), sizeof(float) * a.numel()));
}

// No queries (L = 0), or no keys but the zero-attention key (S = 0,
// add_zero_attn): the output depends on nothing, or only on out_proj.bias
// (every query attends to the zero key alone: attention output 0, output
// b_O). The gradients have the inputs' and parameters' shapes and are zero
// except dℓ/db_O = Σ_tokens R.
TEST(MhaBackward, EmptyQueryOrKeyLengths_E4_H2_B2) {
  std::mt19937_64 rng(3);
  for (const auto& [L, S] : {std::pair<int64_t, int64_t>{0, 3}, {3, 0}}) {
    MultiheadAttentionConfig config;
    config.embed_dim = 4;
    config.num_heads = 2;
    config.add_zero_attn = S == 0;
    BasicMultiheadAttention<double> m(config, 1);
    m.update_parameters([](const std::string& name, Tensor<double>& t) {
      if (name == "in_proj_bias") std::fill_n(t.data(), t.numel(), 0.5);  // a query/value bias that must not leak
    });
    const Tensor<double> q = random_tensor<double>({L, 2, 4}, rng), kv = random_tensor<double>({S, 2, 4}, rng);
    ForwardOptions<double> o;
    o.need_weights = false;
    ForwardContext<double> ctx;
    const Tensor<double> out = m.forward(q, kv, kv, o, ctx).output;
    const Tensor<double> R = random_tensor<double>(out.shape(), rng);
    const MultiheadAttentionGradients<double> g = m.backward(ctx, R);
    EXPECT_EQ(g.query.shape(), q.shape());
    EXPECT_EQ(g.key.shape(), kv.shape());
    EXPECT_EQ(g.value.shape(), kv.shape());
    for (const auto& [name, t] : m.state_dict()) {
      const Tensor<double>& d = g.parameters.at(name);
      ASSERT_EQ(d.shape(), t.shape()) << name;
      for (int64_t i = 0; i < d.numel(); ++i) {
        double expected = 0;
        if (name == "out_proj.bias")
          for (int64_t r = 0; r < L * 2; ++r) expected += R[r * 4 + i];
        EXPECT_NEAR(d[i], expected, 1e-12) << "L=" << L << " S=" << S << " " << name << "[" << i << "]";
      }
    }
    for (const Tensor<double>* t : {&g.query, &g.key, &g.value})
      for (int64_t i = 0; i < t->numel(); ++i) EXPECT_EQ((*t)[i], 0.0);
  }
}

// A fully masked query row (key padding hides every key of batch entry 1):
// under MaskedRowPolicy::Zeros its output is the constant b_O, so every
// gradient stays finite and batch entry 1's query gets none; under NaN the
// gradients are NaN where that row reaches (PyTorch 1.13's autograd).
TEST(MhaBackward, FullyMaskedRowPolicies_Zeros_Finite_NaN_Spreads) {
  MultiheadAttentionConfig config;
  config.embed_dim = 4;
  config.num_heads = 2;
  BasicMultiheadAttention<double> m(config, 1);
  std::mt19937_64 rng(4);
  const Tensor<double> q = random_tensor<double>({3, 2, 4}, rng), kv = random_tensor<double>({5, 2, 4}, rng);
  Tensor<uint8_t> pad({2, 5}, 0);
  for (int64_t j = 0; j < 5; ++j) pad[5 + j] = 1;
  const Mask<double> mask = Mask<double>::boolean(pad);
  for (MaskedRowPolicy policy : {MaskedRowPolicy::Zeros, MaskedRowPolicy::NaN}) {
    ForwardOptions<double> o;
    o.need_weights = false;
    o.key_padding_mask = &mask;
    o.attention.masked_rows = policy;
    ForwardContext<double> ctx;
    const Tensor<double> out = m.forward(q, kv, kv, o, ctx).output;
    const MultiheadAttentionGradients<double> g = m.backward(ctx, Tensor<double>(out.shape(), 1.0));
    bool any_nan = false;
    for (const auto& [name, t] : g.parameters)
      for (int64_t i = 0; i < t.numel(); ++i) any_nan |= std::isnan(t[i]);
    if (policy == MaskedRowPolicy::Zeros) {
      EXPECT_FALSE(any_nan);
      for (int64_t l = 0; l < 3; ++l)  // token (l, b = 1) is row l·B + 1
        for (int64_t e = 0; e < 4; ++e) EXPECT_EQ(g.query[(l * 2 + 1) * 4 + e], 0.0);
    } else {
      EXPECT_TRUE(any_nan);
    }
  }
}

// From 512 keys on, the backward copies view heads head-major before the
// flash kernel and gathers the gradients back
// (multihead_attention_backward.cpp, kBackwardHeadMajorFromKeys). The
// kernel's arithmetic does not depend on the layout, so the gradients are
// the bits of the in-place read (MULTIHEAD_BACKWARD_HEADS=views), and they
// agree with the float32 reference kernel's (an independent implementation:
// scores and weights materialised, then the textbook products) to 1e-4 in
// relative norm: both are float32 sums of at most S + E = 552 products, whose
// error bound γ_n ≈ n·2⁻²⁴ is 3.3e-5 per element in the worst case; a wrong
// row or head in a copy or a gather is an error of order 1. Packed
// self-attention (one (tokens × 3E) buffer) and separate projections with
// L ≠ S, kdim and vdim; causal, key padding and dropout ride along.
TEST(MhaBackward, HeadMajorCopiesFromViews_SameBitsAsInPlace_MatchReference_Float32) {
  BackwardCase self = kFiniteDifferenceCases[1];  // causal, bool mask, bool key padding, self
  self.E = 32;
  self.H = 2;
  self.B = 2;
  self.L = self.S = 512;
  self.mask = 0;
  BackwardCase cross = kFiniteDifferenceCases[5];  // dropout, float key padding, window
  cross.E = 32;
  cross.H = 4;
  cross.B = 1;
  cross.L = 37;
  cross.S = 520;
  cross.kdim = 24;
  cross.vdim = 40;
  cross.window = 0;
  for (BackwardCase c : {self, cross}) {
    c.heads = FH::Views;
    const auto step = [&](AttentionKernel kernel, const char* heads) {
      setenv("MULTIHEAD_BACKWARD_HEADS", heads, 1);
      std::mt19937_64 rng(17);
      Problem<float> p = make_problem<float>(c, rng);
      p.options.attention.kernel = kernel;
      BasicMultiheadAttention<float> m(p.config, 3);
      ForwardContext<float> ctx;
      const Tensor<float> out = m.forward(p.q, key_of(p), value_of(p), p.options, ctx).output;
      MultiheadAttentionGradients<float> g = m.backward(ctx, random_tensor<float>(out.shape(), rng));
      unsetenv("MULTIHEAD_BACKWARD_HEADS");
      return g;
    };
    const MultiheadAttentionGradients<float> copied = step(AttentionKernel::Flash, "auto");
    const MultiheadAttentionGradients<float> in_place = step(AttentionKernel::Flash, "views");
    const MultiheadAttentionGradients<float> reference = step(AttentionKernel::Reference, "auto");
    std::map<std::string, const Tensor<float>*> a{{"query", &copied.query}}, b{{"query", &in_place.query}},
        r{{"query", &reference.query}};
    if (!c.self) {
      a.insert({{"key", &copied.key}, {"value", &copied.value}});
      b.insert({{"key", &in_place.key}, {"value", &in_place.value}});
      r.insert({{"key", &reference.key}, {"value", &reference.value}});
    }
    for (const auto& [name, t] : copied.parameters) {
      a[name] = &t;
      b[name] = &in_place.parameters.at(name);
      r[name] = &reference.parameters.at(name);
    }
    for (const auto& [name, t] : a) {
      const std::string label = c.name() + " " + name;
      ASSERT_EQ(t->shape(), b[name]->shape()) << label;
      EXPECT_EQ(0, std::memcmp(t->data(), b[name]->data(), sizeof(float) * t->numel())) << label;
      double diff = 0, norm = 0;
      for (int64_t i = 0; i < t->numel(); ++i) {
        const double x = (*t)[i], y = (*r[name])[i];
        diff += (x - y) * (x - y);
        norm += y * y;
      }
      EXPECT_LT(std::sqrt(diff) / std::max(std::sqrt(norm), 1e-3), 1e-4) << label;
    }
  }
  // An unknown value is named, whatever the shape.
  std::mt19937_64 rng(3);
  Problem<float> p = make_problem<float>(kFiniteDifferenceCases[0], rng);
  BasicMultiheadAttention<float> m(p.config, 3);
  ForwardContext<float> ctx;
  const Tensor<float> out = m.forward(p.q, key_of(p), value_of(p), p.options, ctx).output;
  setenv("MULTIHEAD_BACKWARD_HEADS", "copy", 1);
  try {
    (void)m.backward(ctx, out);
    ADD_FAILURE() << "MULTIHEAD_BACKWARD_HEADS=copy was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "MULTIHEAD_BACKWARD_HEADS: expected one of auto, views; got 'copy'");
  }
  unsetenv("MULTIHEAD_BACKWARD_HEADS");
}

// One training step gives the same bits with 1 and 2 threads (our loops and
// BLAS), for every kernel the float32 module can run, so a seeded trainer's
// losses do not depend on the thread count. Shapes with enough tokens for
// BLAS and the kernels to split their work.
TEST(MhaBackward, SameBitsForOneAndTwoThreads_Float32) {
  const int before = threads();
  // E = 128: blocks of 32 × 384 × 128 multiply-adds, above OpenBLAS's
  // single-thread ("direct") sgemm size when it may use 2 threads, so an
  // OpenBLAS build differs unless its thread count is held (gemm.cpp).
  for (const auto& [base, E] : {std::pair{kFiniteDifferenceCases[2], int64_t{32}}, {kFiniteDifferenceCases[6], int64_t{32}},
                                {kFiniteDifferenceCases[6], int64_t{128}}}) {
    BackwardCase c = base;
    c.E = E;
    c.H = 4;
    c.B = 2;
    c.L = c.S = 80;
    c.mask = c.mask <= 2 ? c.mask : 0;
    for (AttentionKernel kernel : {AttentionKernel::Reference, AttentionKernel::Materialized, AttentionKernel::Flash}) {
      MultiheadAttentionGradients<float> g[2];
      Tensor<float> out[2];
      for (int t = 0; t < 2; ++t) {
        set_threads(t + 1);
        std::mt19937_64 rng(9);
        Problem<float> p = make_problem<float>(c, rng);
        p.options.attention.kernel = kernel;
        BasicMultiheadAttention<float> m(p.config, 3);
        ForwardContext<float> ctx;
        out[t] = m.forward(p.q, key_of(p), value_of(p), p.options, ctx).output;
        m.backward(ctx, random_tensor<float>(out[t].shape(), rng), g[t]);
      }
      const std::string label = c.name() + " " + to_string(kernel);
      EXPECT_EQ(0, std::memcmp(out[0].data(), out[1].data(), sizeof(float) * out[0].numel())) << label;
      EXPECT_EQ(0, std::memcmp(g[0].query.data(), g[1].query.data(), sizeof(float) * g[0].query.numel())) << label;
      for (const auto& [name, t] : g[0].parameters)
        EXPECT_EQ(0, std::memcmp(t.data(), g[1].parameters.at(name).data(), sizeof(float) * t.numel()))
            << label << " " << name;
    }
  }
  set_threads(before);
}

}  // namespace
}  // namespace multihead
