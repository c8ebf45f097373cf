// tests/test_gqa_backward.cpp: the grouped-query module's backward pass
// (GroupedQueryAttention::forward with a GroupedQueryForwardContext, then
// backward; multihead/grouped_query_attention.hpp), in float64 against
// central differences of its own forward, for every option: RoPE in both
// conventions, grouped-query and multi-query K/V, causal, window, soft-cap,
// ALiBi, biases, and the reference and materialized kernels.
//
// ℓ(θ) = Σ out ⊙ G (G a fixed random d_output), g = dℓ/dθ by backward,
// fd(h) = (ℓ(θ + h) − ℓ(θ − h)) / 2h with h = 2^-14 (θ ± h exact). Its error
// is truncation h²/6·ℓ''' + O(h⁴), measured (fd(2h) − fd(h) = 3·h²/6·ℓ'''
// + O(h⁴)), plus rounding <= ε_ℓ/h per evaluation, with
//   ε_ℓ = u·(4·(E + H·D + S + D) + 32)·M,  M = Σ |G|·(|out| + 1)
// (u = 2^-53; each stage — the E-long projections, the D-long scores, the
// S-long softmax and value sums, the H·D-long out-projection — rounds
// relative to magnitudes of order |out| + 1 with these weights, |x| ~ 1).
// Bound: |g − fd(h)| <= |fd(2h) − fd(h)| + 3·ε_ℓ/h. A wrong gradient is off
// by O(|g|) ≫ this (GqaBackwardChecker plants 1e-5).
//
// GqaBackwardTorch (at the end): against PyTorch float64 autograd, on files
// tests/parity/gqa_backward_torch.py writes (ctest gqa_backward_torch).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "multihead/error.hpp"
#include "multihead/grouped_query_attention.hpp"
#include "multihead/io.hpp"
#include "multihead/runtime.hpp"

namespace multihead {
namespace {

struct GqaBwdCase {
  int64_t B = 2, L = 5, E = 8, H = 4, Hkv = 2, D = 4;
  bool bias = false, causal = true;
  std::optional<RopeConvention> rope;
  int64_t window = 0;
  double softcap = 0;
  bool alibi = false;
  AttentionKernel kernel = AttentionKernel::Auto;
  std::string name() const {
    std::ostringstream os;
    os << "B" << B << "_L" << L << "_E" << E << "_H" << H << "_Hkv" << Hkv << "_D" << D << (bias ? "_bias" : "_nobias")
       << (causal ? "_causal" : "_nocausal") << "_rope"
       << (rope ? (*rope == RopeConvention::Interleaved ? "interleaved" : "halfsplit") : "none") << "_win" << window
       << "_cap" << static_cast<int>(softcap) << (alibi ? "_alibi" : "_noalibi") << "_" << to_string(kernel);
    return os.str();
  }
};
void PrintTo(const GqaBwdCase& c, std::ostream* os) { *os << c.name(); }

GroupedQueryAttentionConfig config_for(const GqaBwdCase& c) {
  GroupedQueryAttentionConfig cfg;
  cfg.embed_dim = c.E, cfg.num_heads = c.H, cfg.num_kv_heads = c.Hkv, cfg.head_dim = c.D;
  cfg.bias = c.bias, cfg.causal = c.causal;
  if (c.rope) {
    RopeOptions r;
    r.convention = *c.rope;
    cfg.rope = r;
  }
  return cfg;
}

AttentionOptions options_for(const GqaBwdCase& c) {
  AttentionOptions o;
  if (c.window > 0) o.window = c.window;
  if (c.softcap > 0) o.softcap = c.softcap;
  if (c.alibi) o.alibi_slopes = alibi_slopes(c.H);
  o.kernel = c.kernel;
  return o;
}

Tensor<double> random_tensor(const Shape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Tensor<double> t(shape);
  for (int64_t e = 0; e < t.numel(); ++e) t[e] = normal(rng);
  return t;
}

struct Problem {
  GqaBwdCase c;
  std::map<std::string, Tensor<double>> weights;
  Tensor<double> x, G;
};

Problem make_problem(const GqaBwdCase& c) {
  Problem p;
  p.c = c;
  const GroupedQueryAttention<double> init(config_for(c), 7);
  p.weights = init.state_dict();
  p.x = random_tensor(Shape{c.B, c.L, c.E}, 8);
  p.G = random_tensor(Shape{c.B, c.L, c.E}, 9);
  return p;
}

// ℓ = Σ out ⊙ G, and M = Σ |G|·(|out| + 1) when asked.
double loss(const Problem& p, const std::map<std::string, Tensor<double>>& weights, const Tensor<double>& x,
            double* magnitude = nullptr) {
  const auto m = GroupedQueryAttention<double>::from_tensors(config_for(p.c), weights);
  const Tensor<double> out = m.forward(x, options_for(p.c));
  double l = 0;
  for (int64_t e = 0; e < out.numel(); ++e) {
    l += out[e] * p.G[e];
    if (magnitude) *magnitude += std::abs(p.G[e]) * (std::abs(out[e]) + 1);
  }
  return l;
}

struct Gradients {
  Tensor<double> out;
  GroupedQueryAttentionGradients<double> g;
};

Gradients backward_of(const Problem& p) {
  const auto m = GroupedQueryAttention<double>::from_tensors(config_for(p.c), p.weights);
  GroupedQueryForwardContext<double> ctx;
  Gradients r;
  r.out = m.forward(p.x, options_for(p.c), ctx);
  r.g = m.backward(ctx, p.G);
  return r;
}

// "" or the first element outside its bound; worst gets max |g − fd| / bound.
std::string check(const Problem& p, const GroupedQueryAttentionGradients<double>& g, double* worst_err,
                  double* worst_ratio) {
  const double h = 0x1.0p-14, u = 0x1.0p-53;
  double M = 0;
  loss(p, p.weights, p.x, &M);
  const GqaBwdCase& c = p.c;
  const double eps = u * (4 * (c.E + c.H * c.D + c.L + c.D) + 32) * M;
  std::map<std::string, Tensor<double>> w = p.weights;
  Tensor<double> x = p.x;
  const auto one = [&](const std::string& name, Tensor<double>& t, const Tensor<double>& grad) -> std::string {
    if (grad.shape() != t.shape()) return name + ": gradient shape " + shape_to_string(grad.shape());
    for (int64_t e = 0; e < t.numel(); ++e) {
      const double x0 = t[e];
      const auto central = [&](double step) {
        t[e] = x0 + step;
        const double up = loss(p, w, x);
        t[e] = x0 - step;
        const double down = loss(p, w, x);
        t[e] = x0;
        return (up - down) / (2 * step);
      };
      const double fd = central(h), fd2 = central(2 * h);
      const double bound = std::abs(fd2 - fd) + 3 * eps / h;
      const double err = std::abs(grad[e] - fd);
      if (!(err <= bound)) {
        std::ostringstream os;
        os.precision(12);
        os << name << "[" << e << "]: backward " << grad[e] << ", central difference " << fd << ", |error| " << err
           << " > bound " << bound;
        return os.str();
      }
      *worst_err = std::max(*worst_err, err);
      *worst_ratio = std::max(*worst_ratio, err / bound);
    }
    return "";
  };
  std::string f = one("d_x", x, g.x);
  for (auto& [name, t] : w) {
    if (!f.empty()) break;
    const auto it = g.parameters.find(name);
    if (it == g.parameters.end()) return name + ": no gradient";
    f = one(name, t, it->second);
  }
  if (f.empty() && g.parameters.size() != w.size())
    f = "parameters: " + std::to_string(g.parameters.size()) + " gradients for " + std::to_string(w.size()) +
        " weights";
  return f;
}

class GqaBackward : public ::testing::TestWithParam<GqaBwdCase> {};

TEST_P(GqaBackward, CentralDifferencesInDouble) {
  const Problem p = make_problem(GetParam());
  const Gradients r = backward_of(p);
  // The training forward is the forward.
  const auto m = GroupedQueryAttention<double>::from_tensors(config_for(p.c), p.weights);
  const Tensor<double> plain = m.forward(p.x, options_for(p.c));
  for (int64_t e = 0; e < plain.numel(); ++e) ASSERT_EQ(plain[e], r.out[e]) << "output " << e;
  double err = 0, ratio = 0;
  EXPECT_EQ(check(p, r.g, &err, &ratio), "");
  std::cout << "  worst |g − fd| " << err << " (" << ratio << " of its bound)\n";
}

std::vector<GqaBwdCase> gqa_backward_cases() {
  std::vector<GqaBwdCase> cases;
  const auto add = [&](auto edit) {
    GqaBwdCase c;
    edit(c);
    cases.push_back(c);
  };
  add([](GqaBwdCase&) {});
  add([](GqaBwdCase& c) { c.Hkv = 1, c.rope = RopeConvention::HalfSplit; });
  add([](GqaBwdCase& c) { c.rope = RopeConvention::Interleaved, c.bias = true; });
  add([](GqaBwdCase& c) { c.causal = false, c.Hkv = 4, c.rope = RopeConvention::HalfSplit; });
  add([](GqaBwdCase& c) { c.window = 2, c.rope = RopeConvention::HalfSplit; });
  add([](GqaBwdCase& c) { c.softcap = 2, c.Hkv = 1, c.bias = true; });
  add([](GqaBwdCase& c) { c.alibi = true, c.causal = false, c.rope = RopeConvention::Interleaved; });
  add([](GqaBwdCase& c) {
    c.B = 1, c.L = 6, c.H = 6, c.Hkv = 2, c.D = 2, c.E = 6, c.bias = true, c.rope = RopeConvention::Interleaved,
    c.window = 3, c.softcap = 2, c.alibi = true, c.kernel = AttentionKernel::Reference;
  });
  add([](GqaBwdCase& c) {
    c.Hkv = 1, c.rope = RopeConvention::HalfSplit, c.window = 2, c.softcap = 2, c.alibi = true, c.bias = true,
    c.kernel = AttentionKernel::Materialized;
  });
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, GqaBackward, ::testing::ValuesIn(gqa_backward_cases()),
                         [](const auto& info) { return info.param.name(); });

// The check can fail: a gradient off by 1e-5 in one element of k_proj.weight
// (the grouped sum's weight) or of d_x.
TEST(GqaBackwardChecker, CatchesPlantedErrors) {
  GqaBwdCase c;
  c.B = 1, c.L = 3, c.rope = RopeConvention::HalfSplit;
  const Problem p = make_problem(c);
  Gradients r = backward_of(p);
  double err = 0, ratio = 0;
  ASSERT_EQ(check(p, r.g, &err, &ratio), "");
  GroupedQueryAttentionGradients<double> planted = r.g;
  planted.parameters["k_proj.weight"][3] += 1e-5;
  EXPECT_NE(check(p, planted, &err, &ratio), "");
  planted = r.g;
  planted.x[1] -= 1e-5;
  EXPECT_NE(check(p, planted, &err, &ratio), "");
}

TEST(GqaBackwardValidation, EmptyContextAndWrongShapeNameTheArgument) {
  GqaBwdCase c;
  const GroupedQueryAttention<double> m(config_for(c), 1);
  GroupedQueryForwardContext<double> ctx;
  try {
    m.backward(ctx, Tensor<double>(Shape{c.B, c.L, c.E}));
    ADD_FAILURE() << "accepted an empty context";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("context: ", 0), 0u) << e.what();
  }
  m.forward(random_tensor(Shape{c.B, c.L, c.E}, 3), AttentionOptions{}, ctx);
  try {
    m.backward(ctx, Tensor<double>(Shape{c.B, c.L + 1, c.E}));
    ADD_FAILURE() << "accepted a misshapen d_output";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("d_output"), std::string::npos) << e.what();
  }
}

// Against PyTorch autograd in float64: tests/parity/gqa_backward_torch.py
// writes one safetensors file per case (weights, x, G, ALiBi slopes,
// torch's gradients "grad.<name>", the configuration in the metadata) into
// $MULTIHEAD_GQA_BACKWARD_TORCH_DIR and runs this test (ctest
// gqa_backward_torch); skipped when the variable is unset. Both sides are
// float64 sums of the same products in other orders, each within
// u·(E + H·D + L + D)·(magnitudes, O(10) here) ≈ 1e-13 of the exact, so
// |ours − torch| <= 1e-11·(1 + |torch|) holds with a margin of 100.
TEST(GqaBackwardTorch, MatchesAutogradFloat64) {
  const char* dir = std::getenv("MULTIHEAD_GQA_BACKWARD_TORCH_DIR");
  if (dir == nullptr) GTEST_SKIP() << "MULTIHEAD_GQA_BACKWARD_TORCH_DIR unset (ctest gqa_backward_torch sets it)";
  int files = 0;
  for (int n = 0;; ++n) {
    const std::string path = std::string(dir) + "/case" + std::to_string(n) + ".safetensors";
    if (!std::ifstream(path)) break;
    ++files;
    const SafetensorsFile f = read_safetensors(path);
    const auto meta = [&](const char* key) { return f.metadata.at(key); };
    const auto integer = [&](const char* key) { return static_cast<int64_t>(std::stoll(meta(key))); };
    GroupedQueryAttentionConfig cfg;
    cfg.embed_dim = integer("E"), cfg.num_heads = integer("H"), cfg.num_kv_heads = integer("Hkv");
    cfg.head_dim = integer("D"), cfg.bias = meta("bias") == "True", cfg.causal = meta("causal") == "True";
    if (meta("rope") != "none") {
      RopeOptions r;
      r.convention = parse_rope_convention(meta("rope"));
      r.theta = std::stod(meta("theta"));
      cfg.rope = r;
    }
    AttentionOptions o;
    if (integer("window") > 0) o.window = integer("window");
    if (std::stod(meta("softcap")) > 0) o.softcap = std::stod(meta("softcap"));
    const Tensor<double>& slopes = f.tensors.at("alibi_slopes").values;
    if (meta("alibi") == "True") o.alibi_slopes.assign(slopes.data(), slopes.data() + slopes.numel());
    std::map<std::string, Tensor<double>> weights;
    for (const auto& [name, t] : f.tensors)
      if (name.find("_proj.") != std::string::npos && name.rfind("grad.", 0) != 0) weights[name] = t.values;
    const auto m = GroupedQueryAttention<double>::from_tensors(cfg, weights);
    GroupedQueryForwardContext<double> ctx;
    m.forward(f.tensors.at("x").values, o, ctx);
    const GroupedQueryAttentionGradients<double> g = m.backward(ctx, f.tensors.at("G").values);
    double worst = 0;
    const auto compare = [&](const std::string& name, const Tensor<double>& got) {
      const Tensor<double>& want = f.tensors.at("grad." + name).values;
      ASSERT_EQ(got.shape(), want.shape()) << path << " " << name;
      for (int64_t e = 0; e < got.numel(); ++e) {
        const double err = std::abs(got[e] - want[e]);
        worst = std::max(worst, err);
        ASSERT_LE(err, 1e-11 * (1 + std::abs(want[e]))) << path << " " << name << "[" << e << "]: ours " << got[e]
                                                        << ", torch " << want[e];
      }
    };
    compare("x", g.x);
    EXPECT_EQ(g.parameters.size(), weights.size()) << path;
    for (const auto& [name, t] : g.parameters) compare(name, t);
    std::cout << "  " << path << ": worst |ours − torch| " << worst << "\n";
  }
  EXPECT_GT(files, 0) << "no case*.safetensors in " << dir;
}

}  // namespace
}  // namespace multihead

namespace multihead {
namespace {

// As MHA's (MhaBackward.BackwardRunsTheForwardsKernel): the backward runs
// the kernel the forward ran, whatever kernel_force says by then. float32,
// where flash serves Auto; the reference and flash backwards are first
// shown to differ in their last bits, so the comparison can tell them apart.
TEST(GqaBackward, BackwardRunsTheForwardsKernel_Float32_E64_H4_Kv2_L70) {
  GroupedQueryAttentionConfig config;
  config.embed_dim = 64;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  const GroupedQueryAttention<float> m(config, 7);
  Tensor<float> x(Shape{2, 70, 64}), G(Shape{2, 70, 64});
  std::mt19937_64 rng(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int64_t i = 0; i < x.numel(); ++i) x[i] = n(rng), G[i] = n(rng);
  const auto step = [&](AttentionKernel before_forward, AttentionKernel before_backward) {
    GroupedQueryForwardContext<float> ctx;
    kernel_force(before_forward);
    m.forward(x, AttentionOptions{}, ctx);
    kernel_force(before_backward);
    GroupedQueryAttentionGradients<float> g = m.backward(ctx, G);
    kernel_force(AttentionKernel::Auto);
    return g;
  };
  const auto same = [](const GroupedQueryAttentionGradients<float>& a, const GroupedQueryAttentionGradients<float>& b) {
    if (std::memcmp(a.x.data(), b.x.data(), sizeof(float) * a.x.numel()) != 0) return false;
    for (const auto& [name, t] : a.parameters)
      if (std::memcmp(t.data(), b.parameters.at(name).data(), sizeof(float) * t.numel()) != 0) return false;
    return true;
  };
  const GroupedQueryAttentionGradients<float> flash = step(AttentionKernel::Auto, AttentionKernel::Auto);
  const GroupedQueryAttentionGradients<float> reference = step(AttentionKernel::Reference, AttentionKernel::Reference);
  ASSERT_FALSE(same(flash, reference)) << "the two kernels agree to the bit here: the test could not tell them apart";
  EXPECT_TRUE(same(flash, step(AttentionKernel::Auto, AttentionKernel::Reference)));
  EXPECT_TRUE(same(reference, step(AttentionKernel::Reference, AttentionKernel::Flash)));
}

}  // namespace
}  // namespace multihead
