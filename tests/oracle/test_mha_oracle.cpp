// tests/oracle/test_mha_oracle.cpp: the library's MultiheadAttention forward
// (the textbook form, and the fused form on every kernel, chosen by the
// option, by kernel_force() and by MULTIHEAD_KERNEL) against the independent
// oracle of tests/oracle/mha_oracle.hpp, which shares none of the library's
// planning: not its strides, not its mask expansion or padding, not its
// default scale, not its weights' average or selection. (The library's two
// forms share all of these, so tests/test_multihead_attention.cpp's
// FormsAgree cannot see an error in them; this test can.) tests/CMakeLists.txt
// builds this binary with the public headers only: it cannot include
// src/attention/mha_plan.hpp.
//
// Cases: masked (attn_mask bool and float, 2-D (L, S) and 3-D (B·H, L, S),
// with a fully masked row), batched, padded (key_padding_mask bool and float,
// with a fully padded batch entry under both fully-masked-row policies),
// cross-attention (kdim, vdim, S != L), bias_k and the zero-attention key,
// batch_first, unbatched, causal, an explicit scale, weights averaged, per
// head, selected and not asked for, one head, long keys (S >= 2048: the
// fused form's head-major copies). Every parameter is in the test's name.
//
// Bound, per element: |library − oracle| <= rtol · max_k |oracle_k| over the
// tensor (the output or the weights; NaN must sit in the same places), with
//   rtol = 10 · √N · (u_T + u_64),   N = Ek + D + 2·S' + E,
// derived per case (rtol_of below) and printed with any failure. Each value
// ends a chain of accumulations: the in-projection over Ek terms, the dot
// over D, the softmax sum and the weighted sum over S', the out-projection
// over E: N roundings in all, on each side (u_T on the library's, u_64 =
// 1.1e-16 on the oracle's; u_32 = 6e-8). Rounding errors of random sign
// grow as √N · u · Σ|terms|, and with unit-normal inputs and weights of
// size 0.3, Σ|terms| stays within 10 · max|value| (the factor 10). So
// rtol runs from 7e-15 (N = 11) to 1.4e-13 (N = 4140, S = 2050) in float64,
// from 2e-6 to 3.9e-5 in float32, where the library's inputs are the
// oracle's float64 inputs rounded to float (the same numbers on both
// sides). Observed: at most 1/20 of the bound in float64 and 1/10 in
// float32 (each case records its error in units of max|oracle| as the
// property "worst", and "bound"). The worst-case bound N · u · Σ|terms|
// (Higham's γ_N) would be √N times looser and catch less.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <ostream>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "library_side.hpp"
#include "mha_oracle.hpp"
#include "multihead/attention.hpp"
#include "multihead/error.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/runtime.hpp"

namespace multihead {
namespace {

enum class Layout { SeqFirst, BatchFirst, Unbatched };
enum class AttnMask { None, Bool2D, Float2D, Bool3D, Float3D };
enum class Weights { None, Average, PerHead };

struct Case {
  int64_t E, H, B, L, S, kdim, vdim;
  bool bias, bias_kv, zero_attn;
  Layout layout;
  bool causal;
  AttnMask mask;
  oracle::MaskKind kpm;
  bool masked_row;  // attn_mask hides every given key from the last query row (slice 0)
  bool padded_row;  // key_padding_mask hides every given key of the last batch entry
  bool nan_rows;    // MaskedRowPolicy::NaN (else Zeros)
  Weights weights;
  double scale;     // 0 = unset (1/√D)
  bool select;      // weights_heads = {H−1, 0}, weights_rows = {L−1, 0}
  bool self;        // one tensor as query, key and value
  std::string name() const {
    static const char* layouts[] = {"seqfirst", "batchfirst", "unbatched"};
    static const char* masks[] = {"masknone", "mask2dbool", "mask2dfloat", "mask3dbool", "mask3dfloat"};
    static const char* kpms[] = {"kpmnone", "kpmbool", "kpmfloat"};
    static const char* weights_names[] = {"noweights", "average", "perhead"};
    auto n = [](int64_t x) { return std::to_string(x); };
    std::string s = "E" + n(E) + "_H" + n(H) + "_B" + n(B) + "_L" + n(L) + "_S" + n(S) + "_k" + n(kdim) + "_v" +
                    n(vdim) + (bias ? "_bias" : "_nobias") + (bias_kv ? "_biaskv" : "") +
                    (zero_attn ? "_zeroattn" : "") + "_" + layouts[static_cast<int>(layout)] +
                    (causal ? "_causal" : "") + "_" + masks[static_cast<int>(mask)] + "_" +
                    kpms[static_cast<int>(kpm)] + (masked_row ? "_maskedrow" : "") +
                    (padded_row ? "_paddedrow" : "") + (nan_rows ? "_nanrows" : "_zerorows") + "_" +
                    weights_names[static_cast<int>(weights)];
    if (scale != 0) {  // scale0p45 = 0.45
      char b[16];
      std::snprintf(b, sizeof b, "_scale0p%02d", static_cast<int>(std::lround(scale * 100)));
      s += b;
    }
    if (select) s += "_selectheadsrows";
    if (self) s += "_selfsametensor";
    return s;
  }
};

// gtest prints a failing case's parameters with these (not as bytes).
void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

using oracle::MaskKind;
constexpr Layout SF = Layout::SeqFirst, BF = Layout::BatchFirst, UB = Layout::Unbatched;
constexpr MaskKind KN = MaskKind::None, KB = MaskKind::Bool, KF = MaskKind::Float;
constexpr Weights WN = Weights::None, WA = Weights::Average, WP = Weights::PerHead;

// E H B L S kdim vdim | bias bias_kv zero_attn | layout causal mask kpm |
// masked_row padded_row nan_rows | weights scale select self
const Case kCases[] = {
    // batched
    {8, 2, 3, 4, 6, 0, 0, true, false, false, SF, false, AttnMask::None, KN, false, false, false, WA, 0, false, false},
    {8, 2, 2, 5, 5, 0, 0, true, false, false, SF, false, AttnMask::None, KN, false, false, false, WP, 0, false, true},
    // masked: each mask kind, with a fully masked row under each policy
    {12, 3, 2, 5, 7, 0, 0, true, false, false, SF, false, AttnMask::Bool2D, KN, true, false, false, WP, 0, false, false},
    {8, 4, 2, 3, 5, 0, 0, true, false, false, SF, false, AttnMask::Float2D, KN, true, false, true, WA, 0, false, false},
    {12, 3, 2, 4, 6, 0, 0, true, false, false, SF, false, AttnMask::Bool3D, KN, true, false, true, WP, 0, false, false},
    {8, 2, 3, 5, 4, 0, 0, true, false, false, SF, true, AttnMask::Float3D, KN, false, false, false, WA, 0, false, false},
    // padded: bool and float key padding, a fully padded batch entry
    {8, 2, 3, 4, 5, 0, 0, true, false, false, SF, false, AttnMask::None, KB, false, true, false, WP, 0, false, false},
    {8, 2, 2, 3, 6, 0, 0, true, false, false, BF, false, AttnMask::None, KF, false, true, true, WA, 0, false, false},
    {12, 3, 2, 4, 5, 0, 0, true, true, true, SF, false, AttnMask::Bool2D, KB, true, true, false, WP, 0, false, false},
    // cross-attention: kdim, vdim, S != L
    {12, 3, 2, 3, 7, 5, 9, true, false, false, SF, false, AttnMask::Float3D, KF, false, false, false, WP, 0, false, false},
    {8, 2, 2, 5, 3, 6, 0, false, false, false, BF, false, AttnMask::Bool2D, KB, false, false, false, WA, 0, false, false},
    // bias_k and the zero-attention key
    {16, 4, 2, 6, 6, 0, 0, true, true, true, BF, true, AttnMask::Bool3D, KN, false, false, false, WP, 0, false, true},
    {8, 2, 3, 4, 5, 0, 0, true, true, false, SF, false, AttnMask::Float2D, KF, false, false, false, WA, 0, false, false},
    {8, 4, 2, 3, 4, 0, 0, false, false, true, BF, true, AttnMask::None, KB, false, true, false, WP, 0, false, false},
    // unbatched
    {8, 2, 1, 5, 4, 0, 0, true, false, false, UB, false, AttnMask::Bool3D, KB, false, false, false, WA, 0, false, false},
    {12, 3, 1, 3, 6, 7, 4, true, true, true, UB, true, AttnMask::Float2D, KF, false, true, true, WP, 0.3, false, false},
    {8, 2, 1, 4, 4, 0, 0, true, false, false, UB, true, AttnMask::None, KN, false, false, false, WP, 0, false, true},
    // an explicit scale, a weights selection, no weights
    {12, 3, 2, 4, 5, 0, 0, true, false, false, SF, true, AttnMask::Float2D, KB, false, false, false, WA, 0.45, true, false},
    {12, 3, 2, 4, 5, 0, 6, true, true, false, BF, false, AttnMask::Bool3D, KF, false, false, false, WP, 0, true, false},
    {8, 2, 2, 5, 5, 0, 0, true, false, false, BF, true, AttnMask::None, KN, false, false, false, WN, 0, false, true},
    // one head of width 1, one query, one key
    {4, 4, 2, 1, 1, 0, 0, true, false, false, SF, false, AttnMask::None, KB, false, false, false, WP, 0, false, false},
    // one head of width 6
    {6, 1, 2, 3, 4, 0, 0, true, false, false, BF, true, AttnMask::Float3D, KN, false, false, false, WA, 0, false, false},
    // S >= 2048: the fused form projects K and V into head-major copies
    // (multihead_attention_forward.cpp, kHeadMajorFromKeys), not views
    {8, 2, 2, 3, 2050, 0, 0, true, false, false, SF, false, AttnMask::Bool2D, KB, true, true, false, WP, 0, false, false},
    {8, 4, 2, 4, 2048, 5, 7, true, false, true, BF, true, AttnMask::Float3D, KF, false, false, false, WA, 0, false, false},
};

// Which path of the library computes the case, and how its kernel is chosen.
enum class Form { Textbook, Fused };
enum class Via { Option, KernelForce, Environment };
struct Target {
  const char* name;
  Form form;
  AttentionKernel kernel;
  Via via;
  bool plain_paths;  // MULTIHEAD_FUSED_PATHS=plain
};
void PrintTo(const Target& t, std::ostream* os) { *os << t.name; }
const Target kTargets64[] = {
    {"textbook", Form::Textbook, AttentionKernel::Auto, Via::Option, false},
    {"fused_auto", Form::Fused, AttentionKernel::Auto, Via::Option, false},
    {"fused_reference_option", Form::Fused, AttentionKernel::Reference, Via::Option, false},
    {"fused_reference_kernelforce", Form::Fused, AttentionKernel::Reference, Via::KernelForce, false},
    {"fused_reference_env", Form::Fused, AttentionKernel::Reference, Via::Environment, false},
    {"fused_materialized_option", Form::Fused, AttentionKernel::Materialized, Via::Option, false},
    {"fused_materialized_kernelforce", Form::Fused, AttentionKernel::Materialized, Via::KernelForce, false},
    {"fused_materialized_env", Form::Fused, AttentionKernel::Materialized, Via::Environment, false},
    {"fused_materialized_plainpaths", Form::Fused, AttentionKernel::Materialized, Via::Option, true},
};
// Flash runs in float32 only: the same cases in float32 against the same
// float64 oracle (on the float-rounded inputs), with the float32 bound.
const Target kTargets32[] = {
    {"textbook", Form::Textbook, AttentionKernel::Auto, Via::Option, false},
    {"fused_auto", Form::Fused, AttentionKernel::Auto, Via::Option, false},
    {"fused_flash_option", Form::Fused, AttentionKernel::Flash, Via::Option, false},
    {"fused_flash_env", Form::Fused, AttentionKernel::Flash, Via::Environment, false},
    {"fused_flash_plainpaths", Form::Fused, AttentionKernel::Flash, Via::Option, true},
    {"fused_materialized_kernelforce", Form::Fused, AttentionKernel::Materialized, Via::KernelForce, false},
    {"fused_reference_option", Form::Fused, AttentionKernel::Reference, Via::Option, false},
};

// The per-element bound of a case in units of max|oracle| (top of file).
template <class T>
double rtol_of(const Case& c) {
  // The longest chain of accumulations an output element goes through: the
  // query/key projection (Ek, or E) and their dot product (D), or the value
  // projection (Ev, or E); then the softmax and PV (2·S'), then W^O (E).
  const int64_t Ek = c.kdim ? c.kdim : c.E, Ev = c.vdim ? c.vdim : c.E, St = c.S + c.bias_kv + c.zero_attn;
  const double n = static_cast<double>(std::max(Ek + c.E / c.H, Ev) + 2 * St + c.E);
  const double u = std::numeric_limits<T>::epsilon() / 2 + std::numeric_limits<double>::epsilon() / 2;
  return 10 * std::sqrt(n) * u;
}

// The oracle's inputs for a case: parameters, inputs and masks as float64
// arrays (rounded to float when the library runs in float32, so both see
// the same numbers).
struct Problem {
  oracle::Config config;
  oracle::Params<double> params;
  oracle::Call<double> call;
};

template <class T>
Problem make_problem(const Case& c) {
  std::mt19937_64 rng(20261201);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto fill = [&](std::vector<int64_t> shape, double sd) {
    oracle::Array<double> a(std::move(shape));
    for (double& x : a.v) x = static_cast<double>(static_cast<T>(sd * normal(rng)));
    return a;
  };
  Problem p;
  p.config = {c.E, c.H, c.kdim, c.vdim, c.bias, c.bias_kv, c.zero_attn, c.layout == BF};
  const int64_t E = c.E, Ek = p.config.Ek(), Ev = p.config.Ev();
  if (Ek == E && Ev == E) {
    p.params.in_proj_weight = fill({3 * E, E}, 0.3);
  } else {
    p.params.q_proj_weight = fill({E, E}, 0.3);
    p.params.k_proj_weight = fill({E, Ek}, 0.3);
    p.params.v_proj_weight = fill({E, Ev}, 0.3);
  }
  p.params.out_proj_weight = fill({E, E}, 0.3);
  if (c.bias) {
    p.params.in_proj_bias = fill({3 * E}, 1.0);
    p.params.out_proj_bias = fill({E}, 1.0);
  }
  if (c.bias_kv) {
    p.params.bias_k = fill({1, 1, E}, 1.0);
    p.params.bias_v = fill({1, 1, E}, 1.0);
  }
  auto input = [&](int64_t len, int64_t width) {
    if (c.layout == UB) return fill({len, width}, 1.0);
    return c.layout == BF ? fill({c.B, len, width}, 1.0) : fill({len, c.B, width}, 1.0);
  };
  oracle::Call<double>& call = p.call;
  call.query = input(c.L, E);
  call.key = c.self ? call.query : input(c.S, Ek);
  call.value = c.self ? call.query : input(c.S, Ev);
  const int64_t B = c.layout == UB ? 1 : c.B;
  std::bernoulli_distribution hide(0.3);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  if (c.mask != AttnMask::None) {
    const bool three = c.mask == AttnMask::Bool3D || c.mask == AttnMask::Float3D;
    const std::vector<int64_t> shape = three ? std::vector<int64_t>{B * c.H, c.L, c.S} : std::vector<int64_t>{c.L, c.S};
    const bool boolean = c.mask == AttnMask::Bool2D || c.mask == AttnMask::Bool3D;
    call.attn_mask.kind = boolean ? KB : KF;
    if (boolean) {
      call.attn_mask.bools = oracle::Array<uint8_t>(shape);
      std::vector<uint8_t>& m = call.attn_mask.bools.v;
      for (uint8_t& x : m) x = hide(rng);
      for (std::size_t r = 0; r < m.size(); r += static_cast<std::size_t>(c.S)) m[r] = 0;  // key 0 visible
      if (c.masked_row)  // the last query row of slice 0: every given key hidden
        for (int64_t j = 0; j < c.S; ++j) m[static_cast<std::size_t>((c.L - 1) * c.S + j)] = 1;
    } else {
      call.attn_mask.floats = fill(shape, 1.0);
      std::vector<double>& m = call.attn_mask.floats.v;
      m[1 % m.size()] = neg_inf;  // one -inf entry among the finite ones
      if (c.masked_row)
        for (int64_t j = 0; j < c.S; ++j) m[static_cast<std::size_t>((c.L - 1) * c.S + j)] = neg_inf;
    }
  }
  if (c.kpm != KN) {
    const std::vector<int64_t> shape = c.layout == UB ? std::vector<int64_t>{c.S} : std::vector<int64_t>{B, c.S};
    call.key_padding_mask.kind = c.kpm;
    if (c.kpm == KB) {
      call.key_padding_mask.bools = oracle::Array<uint8_t>(shape);
      std::vector<uint8_t>& m = call.key_padding_mask.bools.v;
      for (uint8_t& x : m) x = hide(rng);
      for (int64_t b = 0; b < B; ++b) m[static_cast<std::size_t>(b * c.S)] = 0;
      if (c.padded_row)
        for (int64_t j = 0; j < c.S; ++j) m[static_cast<std::size_t>((B - 1) * c.S + j)] = 1;
    } else {
      call.key_padding_mask.floats = fill(shape, 1.0);
      std::vector<double>& m = call.key_padding_mask.floats.v;
      if (c.padded_row)
        for (int64_t j = 0; j < c.S; ++j) m[static_cast<std::size_t>((B - 1) * c.S + j)] = neg_inf;
    }
  }
  call.is_causal = c.causal;
  if (c.scale != 0) call.scale = c.scale;
  call.nan_rows = c.nan_rows;
  call.need_weights = c.weights != WN;
  call.average_attn_weights = c.weights == WA;
  if (c.select) {
    call.weights_heads = {c.H - 1, 0};
    call.weights_rows = {c.L - 1, 0};
  }
  return p;
}

// ---- the library's side: its own types, filled from the oracle's arrays ----

using library_side::mask_of;
using library_side::tensor_of;

template <class T>
BasicMultiheadAttention<T> module_of(const Problem& p) {
  return BasicMultiheadAttention<T>(library_side::config_of(p.config), library_side::parameters_of<T>(p.params));
}

// Sets an environment variable (or kernel_force) for one scope.
class ScopedSwitch {
 public:
  ScopedSwitch(const Target& t) {
    if (t.via == Via::KernelForce) {
      kernel_force(t.kernel);
      forced_ = true;
    }
    if (t.via == Via::Environment) set("MULTIHEAD_KERNEL", to_string(t.kernel));
    if (t.plain_paths) set("MULTIHEAD_FUSED_PATHS", "plain");
  }
  ~ScopedSwitch() {
    if (forced_) kernel_force(AttentionKernel::Auto);
    for (const std::string& name : set_) unsetenv(name.c_str());
  }
  ScopedSwitch(const ScopedSwitch&) = delete;
  ScopedSwitch& operator=(const ScopedSwitch&) = delete;

 private:
  void set(const std::string& name, const std::string& value) {
    ASSERT_EQ(std::getenv(name.c_str()), nullptr) << name << " is set outside the test";
    setenv(name.c_str(), value.c_str(), 1);
    set_.push_back(name);
  }
  bool forced_ = false;
  std::vector<std::string> set_;
};

template <class T>
struct LibraryRun {
  Tensor<T> output;
  std::optional<Tensor<T>> weights;
};

template <class T>
LibraryRun<T> run_library(const Problem& p, const Target& t) {
  const BasicMultiheadAttention<T> mha = module_of<T>(p);
  const Tensor<T> q = tensor_of<T>(p.call.query);
  const bool self = p.call.key.v == p.call.query.v && p.call.value.v == p.call.query.v &&
                    p.call.key.shape == p.call.query.shape && p.call.value.shape == p.call.query.shape;
  const Tensor<T> k = self ? Tensor<T>() : tensor_of<T>(p.call.key);
  const Tensor<T> v = self ? Tensor<T>() : tensor_of<T>(p.call.value);
  const std::unique_ptr<Mask<T>> attn = mask_of<T>(p.call.attn_mask), kpm = mask_of<T>(p.call.key_padding_mask);
  ForwardOptions<T> o;
  o.attn_mask = attn.get();
  o.key_padding_mask = kpm.get();
  o.need_weights = p.call.need_weights;
  o.average_attn_weights = p.call.average_attn_weights;
  o.attention.is_causal = p.call.is_causal;
  o.attention.scale = p.call.scale;
  o.attention.masked_rows = p.call.nan_rows ? MaskedRowPolicy::NaN : MaskedRowPolicy::Zeros;
  o.weights_heads = p.call.weights_heads;
  o.weights_rows = p.call.weights_rows;
  if (t.via == Via::Option) o.attention.kernel = t.kernel;
  const ScopedSwitch scoped(t);
  const Tensor<T>& key = self ? q : k;  // the same object: the packed self-attention product
  const Tensor<T>& value = self ? q : v;
  ForwardResult<T> r = t.form == Form::Textbook ? mha.forward_textbook(q, key, value, o) : mha.forward(q, key, value, o);
  return {std::move(r.output), std::move(r.attn_weights)};
}

// ---- the checker ----

struct Verdict {
  bool ok = true;
  std::string message;  // the first violation: index, both values, error, bound
  double worst = 0;     // max |got − want| / (rtol · scale)
};

// |got_i − want_i| <= rtol · max_k |want_k| for every i; NaN in the same places.
template <class T>
Verdict compare(const char* what, const Tensor<T>& got, const oracle::Array<double>& want, double rtol) {
  Verdict v;
  const Shape want_shape(want.shape.begin(), want.shape.end());
  if (got.shape() != want_shape) {
    v.ok = false;
    v.message = std::string(what) + ": shape " + shape_to_string(got.shape()) + ", oracle " + shape_to_string(want_shape);
    return v;
  }
  double scale = 0;
  for (double x : want.v)
    if (std::isfinite(x)) scale = std::max(scale, std::abs(x));
  const double bound = rtol * (scale > 0 ? scale : 1.0);
  for (std::size_t i = 0; i < want.v.size(); ++i) {
    const double g = static_cast<double>(got[static_cast<int64_t>(i)]), w = want.v[i];
    const bool nan_g = std::isnan(g), nan_w = std::isnan(w);
    const double err = nan_g || nan_w ? (nan_g == nan_w ? 0.0 : INFINITY) : std::abs(g - w);
    v.worst = std::max(v.worst, err / bound);
    if (err > bound && v.ok) {
      v.ok = false;
      char b[256];
      std::snprintf(b, sizeof b, "%s[%zu]: library %.17g, oracle %.17g, error %.3g > bound %.3g (%.0e x %.3g)", what, i,
                    g, w, err, bound, rtol, scale);
      v.message = b;
    }
  }
  return v;
}

template <class T>
Verdict compare_run(const LibraryRun<T>& got, const oracle::Result<double>& want, double rtol) {
  Verdict v = compare("output", got.output, want.output, rtol);
  if (got.weights.has_value() != want.weights.has_value()) {
    v.ok = false;
    v.message += std::string(" attn_weights: library ") + (got.weights ? "has" : "has none") + ", oracle " +
                 (want.weights ? "has" : "has none");
    return v;
  }
  if (got.weights) {
    const Verdict w = compare("attn_weights", *got.weights, *want.weights, rtol);
    if (v.ok && !w.ok) v.message = w.message;
    v.ok = v.ok && w.ok;
    v.worst = std::max(v.worst, w.worst);
  }
  return v;
}

template <class T>
void check_case(const Case& c, const Target& t) {
  const double rtol = rtol_of<T>(c);
  const Problem p = make_problem<T>(c);
  const oracle::Result<double> want = oracle::multi_head_attention_forward(p.config, p.params, p.call);
  const LibraryRun<T> got = run_library<T>(p, t);
  const Verdict v = compare_run(got, want, rtol);
  char worst[32], bound[32];
  std::snprintf(worst, sizeof worst, "%.3g", v.worst * rtol);
  std::snprintf(bound, sizeof bound, "%.3g", rtol);
  ::testing::Test::RecordProperty("worst", worst);  // the worst error, in units of max|oracle|
  ::testing::Test::RecordProperty("bound", bound);
  EXPECT_TRUE(v.ok) << v.message << " (" << t.name << ")";
}

class OracleFloat64 : public ::testing::TestWithParam<std::tuple<Case, Target>> {};
TEST_P(OracleFloat64, MatchesWithinDerivedBound) { check_case<double>(std::get<0>(GetParam()), std::get<1>(GetParam())); }
INSTANTIATE_TEST_SUITE_P(Table, OracleFloat64, ::testing::Combine(::testing::ValuesIn(kCases), ::testing::ValuesIn(kTargets64)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name() + "_" + std::get<1>(info.param).name;
                         });

class OracleFloat32 : public ::testing::TestWithParam<std::tuple<Case, Target>> {};
TEST_P(OracleFloat32, MatchesWithinDerivedBound) { check_case<float>(std::get<0>(GetParam()), std::get<1>(GetParam())); }
INSTANTIATE_TEST_SUITE_P(Table, OracleFloat32, ::testing::Combine(::testing::ValuesIn(kCases), ::testing::ValuesIn(kTargets32)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name() + "_" + std::get<1>(info.param).name;
                         });

// The switches reach the kernel: flash, forced by kernel_force() or by
// MULTIHEAD_KERNEL on a float64 call, is refused (flash runs in float32
// only), where the call alone would run the materialized kernel.
TEST(OracleSwitches, KernelForceAndEnvironmentReachTheKernel_Float64FlashRefused) {
  const Problem p = make_problem<double>(kCases[0]);
  for (Via via : {Via::KernelForce, Via::Environment}) {
    const Target t{"fused_flash", Form::Fused, AttentionKernel::Flash, via, false};
    EXPECT_THROW(run_library<double>(p, t), Error) << (via == Via::KernelForce ? "kernel_force" : "MULTIHEAD_KERNEL");
  }
  EXPECT_EQ(kernel_forced(), AttentionKernel::Auto);  // the scope lifted the force
  EXPECT_EQ(std::getenv("MULTIHEAD_KERNEL"), nullptr);
}

// ---- the checker can fail ----

// One element of the oracle's output or weights moved by 3 bounds fails the
// comparison at that index; moved by half a bound it passes; NaN fails.
TEST(OracleChecker, OnePerturbedElementFails_Output_Weights_NaN) {
  const Case& c = kCases[2];  // mask2dbool, maskedrow, per-head weights
  const double rtol = rtol_of<double>(c);
  const Problem p = make_problem<double>(c);
  const oracle::Result<double> want = oracle::multi_head_attention_forward(p.config, p.params, p.call);
  const LibraryRun<double> got = run_library<double>(p, kTargets64[5]);
  ASSERT_TRUE(compare_run(got, want, rtol).ok) << compare_run(got, want, rtol).message;
  double scale = 0;
  for (double x : want.output.v) scale = std::max(scale, std::abs(x));
  for (std::size_t index : {std::size_t{0}, want.output.v.size() / 2, want.output.v.size() - 1}) {
    oracle::Result<double> bad = want;
    bad.output.v[index] += 3 * rtol * scale;
    const Verdict v = compare_run(got, bad, rtol);
    EXPECT_FALSE(v.ok) << "output index " << index;
    EXPECT_NE(v.message.find("output[" + std::to_string(index) + "]"), std::string::npos) << v.message;
    bad = want;
    bad.output.v[index] += 0.5 * rtol * scale;
    EXPECT_TRUE(compare_run(got, bad, rtol).ok) << "half a bound at " << index;
    bad = want;
    bad.output.v[index] = std::numeric_limits<double>::quiet_NaN();
    EXPECT_FALSE(compare_run(got, bad, rtol).ok) << "NaN at " << index;
  }
  oracle::Result<double> bad = want;
  double wscale = 0;
  for (double x : want.weights->v) wscale = std::max(wscale, std::abs(x));
  bad.weights->v[7] += 3 * rtol * wscale;
  const Verdict v = compare_run(got, bad, rtol);
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.message.find("attn_weights[7]"), std::string::npos) << v.message;
  bad = want;
  bad.weights.reset();
  EXPECT_FALSE(compare_run(got, bad, rtol).ok) << "weights missing on one side";
}

// Each case's feature moves the result: the oracle with that feature taken
// away (the mask, the padding, causal, bias_k, the zero key, the scale, the
// NaN policy, batch_first read as seq-first) disagrees with the library, far
// beyond the bound, so the table's cases can fail.
struct Ablation {
  const char* name;
  std::size_t case_index;
  bool (*has)(const Case&);  // the case has the feature (checked: a reordered table fails loudly)
  void (*apply)(Problem&);
};
const Ablation kAblations[] = {
    {"attn_mask_2dbool", 2, [](const Case& c) { return c.mask == AttnMask::Bool2D; },
     [](Problem& p) { p.call.attn_mask.kind = KN; }},
    {"attn_mask_3dfloat", 5, [](const Case& c) { return c.mask == AttnMask::Float3D; },
     [](Problem& p) { p.call.attn_mask.kind = KN; }},
    {"key_padding_bool", 6, [](const Case& c) { return c.kpm == oracle::MaskKind::Bool; },
     [](Problem& p) { p.call.key_padding_mask.kind = KN; }},
    {"key_padding_float", 12, [](const Case& c) { return c.kpm == oracle::MaskKind::Float; },
     [](Problem& p) { p.call.key_padding_mask.kind = KN; }},
    {"causal", 5, [](const Case& c) { return c.causal; }, [](Problem& p) { p.call.is_causal = false; }},
    {"bias_kv", 12, [](const Case& c) { return c.bias_kv; }, [](Problem& p) { p.config.add_bias_kv = false; }},
    {"zero_attn", 13, [](const Case& c) { return c.zero_attn; }, [](Problem& p) { p.config.add_zero_attn = false; }},
    {"scale", 17, [](const Case& c) { return c.scale != 0; }, [](Problem& p) { p.call.scale.reset(); }},
    {"nan_rows", 4, [](const Case& c) { return c.nan_rows && (c.masked_row || c.padded_row); },
     [](Problem& p) { p.call.nan_rows = false; }},
    {"batch_first", 19, [](const Case& c) { return c.layout == Layout::BatchFirst; }, [](Problem& p) {
       // The same numbers read as (L, B, ·) instead of (B, L, ·).
       p.config.batch_first = false;
       for (oracle::Array<double>* a : {&p.call.query, &p.call.key, &p.call.value})
         a->shape = {a->size(1), a->size(0), a->size(2)};
     }},
};
std::vector<int64_t> want_shape(const Tensor<double>& t) { return {t.shape().begin(), t.shape().end()}; }
class OracleSensitivity : public ::testing::TestWithParam<Ablation> {};
TEST_P(OracleSensitivity, OracleWithoutTheFeatureDisagrees) {
  const Ablation& a = GetParam();
  const Case& c = kCases[a.case_index];
  ASSERT_TRUE(a.has(c)) << c.name() << " lacks the feature " << a.name << ": the ablation table points at the wrong case";
  const double rtol = rtol_of<double>(c);
  Problem p = make_problem<double>(c);
  const LibraryRun<double> got = run_library<double>(p, kTargets64[5]);
  ASSERT_TRUE(compare_run(got, oracle::multi_head_attention_forward(p.config, p.params, p.call), rtol).ok);
  a.apply(p);
  oracle::Result<double> ablated = oracle::multi_head_attention_forward(p.config, p.params, p.call);
  ablated.output.shape = want_shape(got.output);  // a relabelled layout keeps its elements
  const Verdict v = compare("output", got.output, ablated.output, rtol);
  EXPECT_FALSE(v.ok) << c.name() << " without " << a.name;
  EXPECT_GT(v.worst, 1e3) << c.name() << " without " << a.name << ": the feature hardly moves the output";
}
INSTANTIATE_TEST_SUITE_P(Table, OracleSensitivity, ::testing::ValuesIn(kAblations),
                         [](const auto& info) { return std::string(info.param.name) + "_case" + std::to_string(info.param.case_index); });

}  // namespace
}  // namespace multihead
