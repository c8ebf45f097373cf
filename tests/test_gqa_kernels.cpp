// tests/test_gqa_kernels.cpp: grouped-query attention at the kernel level.
//
// Every kernel (reference, materialized, flash, and decoding's: the decode
// kernel of every KV-cache dtype, on a float32 cache), on every SIMD target this
// machine runs, at 1 and 2 threads, called with kv_heads K/V heads
// (AttentionArgs::kv_heads, the mapping kv_slice() in
// src/contract/attention_args.hpp), is checked two ways:
//  - against an independent float64 loop written here, over K/V with every
//    head repeated heads / kv_heads times (Llama's repeat_kv, the
//    "same model with its K/V heads repeated");
//  - for reference and flash, bit for bit against the same kernel called
//    on those repeated K/V as ordinary multi-head attention: the arithmetic
//    is the same, only where the K/V rows are read from differs.
// Legend: B batch, H query heads, Hkv K/V heads, L queries, S keys,
// D query/key width, Dv value width.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/kernel.hpp"
#include "multihead/error.hpp"
#include "multihead/runtime.hpp"
#include "simd/decode_compressed.hpp"
#include "simd/narrow_types.hpp"
#include "simd/targets.hpp"
#include "test_util.hpp"

namespace multihead {
namespace {

using test::fmt;

using detail::AttentionArgs;
using detail::SliceLayout;

constexpr double kUnitRoundoff = 0x1.0p-24;

struct GqaCase {
  int64_t B, H, Hkv, L, S, D, Dv;
  bool causal = false;   // bottom-right: the last query sees every key (decoding)
  bool strided = false;  // K/V as views into (B, S, Hkv·width), Q/out into (B, L, H·width)
  int64_t window = 0;    // sliding window; query i at position i + cols − L either way
  int64_t cols = 0;      // keys with a position (0: all S); keys j >= cols have none and are always seen
};

std::string case_name(const GqaCase& c) {
  std::string n = "B" + std::to_string(c.B) + "_H" + std::to_string(c.H) + "_Hkv" + std::to_string(c.Hkv) + "_L" +
                  std::to_string(c.L) + "_S" + std::to_string(c.S) + "_D" + std::to_string(c.D) + "_Dv" +
                  std::to_string(c.Dv);
  if (c.causal) n += "_causalBR";
  if (c.strided) n += "_strided";
  if (c.window) n += "_window" + std::to_string(c.window);
  if (c.cols) n += "_cols" + std::to_string(c.cols);
  return n;
}

// The cases: MQA (Hkv 1), groups of 2 and 4, MHA (Hkv = H) as the control;
// L = 1 (one decoded token), S across the flash key tile (126 keys on AVX3,
// 120 on 16-register targets, up to a quarter more in the last tile), odd
// widths for the SIMD remainders.
const GqaCase kCases[] = {
    {2, 4, 1, 5, 9, 8, 8},
    {2, 4, 2, 17, 33, 16, 12, false, true},
    {1, 8, 2, 1, 130, 16, 16, true},
    {1, 8, 2, 1, 130, 16, 16, true, true},
    {2, 6, 3, 20, 20, 7, 9, true},
    {1, 4, 4, 9, 40, 8, 8, true},
    {1, 8, 1, 70, 170, 8, 8, true, true},
    {3, 2, 1, 3, 1, 4, 4},
    // One decoded token (L = 1) with groups: the flash kernel packs each
    // group's query heads into one slice (src/kernels/flash.cpp,
    // grouped_decode_args), with the window as a key range.
    {1, 32, 1, 1, 300, 64, 64, true},
    {2, 8, 2, 1, 200, 32, 32, true, true, 50},
    {1, 8, 4, 1, 90, 16, 16, false, false, 30},
    {1, 4, 2, 1, 40, 8, 8, true, false, 100},
    // Groups the decode kernel cuts into chunks of up to 8 rows
    // (src/simd/decode_compressed-inl.h): 6 rows over 150 keys (a last
    // block of 22); 3 queries x 8 heads (24 rows with their own causal ends,
    // D 8: no full vector on AVX-512); 2 x 5 rows with a window and 10 keys
    // without a position (the [rest, S) range); 4 x 8 rows, causal, 10 such
    // keys.
    {1, 6, 1, 1, 150, 16, 16, true},
    {1, 16, 2, 3, 77, 8, 8, true},
    {2, 10, 2, 2, 100, 24, 24, true, false, 40, 90},
    {1, 8, 1, 4, 70, 20, 20, true, false, 0, 60},
};

// Decode: the decode kernel of every KV-cache dtype, on a float32 cache
// (attention_forward_compressed with KVCacheDType::Native); it reads K/V as
// [B·Hkv][S][D], so only contiguous cases with Dv = D.
// DecodeBf16: the same kernel on a bf16 cache holding K/V's bits rounded
// (callers pass K/V that bf16 represents exactly, so the oracle holds).
// DecodeBf16Pairs: a bf16 cache as the bf16 module reads it (CompressedKV::
// bf16_module), bf16's pair way forced (MULTIHEAD_BF16_DOT=dpbf16's setting:
// vdpbf16ps where the target and CPU have it, Highway's widening of the
// same pairs elsewhere); callers pass q, K and V that bf16 represents, and
// its bound has the weights' rounding to bf16 (pairs_bound).
// DecodeOneCall: the per-target decode kernel called once per K/V slice with
// the slice's whole group of rows (more than kDecodeMaxCallChunks chunks for
// a large group: the kernel's own passes), not attention_forward_compressed's
// cut into calls.
enum class Kernel { Reference, Materialized, Flash, Decode, DecodeBf16, DecodeBf16Pairs, DecodeOneCall };
const char* kernel_name(Kernel k) {
  return k == Kernel::Reference      ? "reference"
         : k == Kernel::Materialized ? "materialized"
         : k == Kernel::Flash        ? "flash"
         : k == Kernel::Decode       ? "decode"
         : k == Kernel::DecodeBf16   ? "decode_bf16"
         : k == Kernel::DecodeBf16Pairs ? "decode_bf16_pairs"
                                     : "decode_one_call";
}
bool decode_serves(const GqaCase& c) { return !c.strided && c.D == c.Dv; }

struct Param {
  GqaCase c;
  Kernel kernel;
  int threads;
  std::string target;
};
std::string param_name(const Param& p) {
  return case_name(p.c) + "_" + kernel_name(p.kernel) + "_t" + std::to_string(p.threads) + "_" + p.target;
}
void PrintTo(const Param& p, std::ostream* os) { *os << param_name(p); }

// bf16_dot_force(name) for a scope ("" leaves the setting as it is), with
// the flash kernel forced for bf16 (narrow_attention_force); the setting
// before it is restored on the way out, an exception's too.
class ScopedBf16Dot {
 public:
  explicit ScopedBf16Dot(const std::string& name) : before_(detail::bf16_dot_setting()), forced_(!name.empty()) {
    if (!forced_) return;
    detail::bf16_dot_force(name);
    narrow_attention_force("flash");  // the flash kernel's way, not the matmul way's
  }
  ~ScopedBf16Dot() {
    if (!forced_) return;
    narrow_attention_force("");
    switch (before_) {
      case detail::Bf16Dot::Fma: detail::bf16_dot_force("fma"); break;
      case detail::Bf16Dot::Dpbf16: detail::bf16_dot_force("dpbf16"); break;
      case detail::Bf16Dot::Measure: detail::bf16_dot_force("measure"); break;
      case detail::Bf16Dot::Auto: detail::bf16_dot_force(""); break;
    }
  }
  ScopedBf16Dot(const ScopedBf16Dot&) = delete;
  ScopedBf16Dot& operator=(const ScopedBf16Dot&) = delete;

 private:
  detail::Bf16Dot before_;
  bool forced_;
};

class ScopedTarget {
 public:
  explicit ScopedTarget(const std::string& name) { detail::simd_target_force(name); }
  ~ScopedTarget() { detail::simd_target_force(""); }
  ScopedTarget(const ScopedTarget&) = delete;
  ScopedTarget& operator=(const ScopedTarget&) = delete;
};

// Logical tensors, always stored as q [B][H][L][D], k [B][Hkv][S][D],
// v [B][Hkv][S][Dv]; the kernels see them contiguous or, for strided cases,
// packed into (B, len, heads·width) buffers.
struct Inputs {
  GqaCase c;
  std::vector<float> q, k, v;
  float scale;
};

Inputs make_inputs(const GqaCase& c) {
  Inputs in{c, {}, {}, {}, static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.D)))};
  std::mt19937_64 rng(std::hash<std::string>{}(case_name(c)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto fill = [&](std::vector<float>& x, int64_t count) {
    x.resize(static_cast<std::size_t>(count));
    for (float& e : x) e = normal(rng);
  };
  fill(in.q, c.B * c.H * c.L * c.D);
  fill(in.k, c.B * c.Hkv * c.S * c.D);
  fill(in.v, c.B * c.Hkv * c.S * c.Dv);
  return in;
}

// (B, heads, len, width) -> (B, len, heads·width), the projection layout.
std::vector<float> pack(const std::vector<float>& x, int64_t B, int64_t heads, int64_t len, int64_t width) {
  std::vector<float> y(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < len; ++i)
        for (int64_t d = 0; d < width; ++d)
          y[((b * len + i) * heads + h) * width + d] = x[((b * heads + h) * len + i) * width + d];
  return y;
}
std::vector<float> unpack(const std::vector<float>& y, int64_t B, int64_t heads, int64_t len, int64_t width) {
  std::vector<float> x(y.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < len; ++i)
        for (int64_t d = 0; d < width; ++d)
          x[((b * heads + h) * len + i) * width + d] = y[((b * len + i) * heads + h) * width + d];
  return x;
}
SliceLayout packed_layout(int64_t heads, int64_t len, int64_t width) {
  return SliceLayout{len * heads * width, width, heads * width};
}

// K/V with each head repeated: head h of the result is K/V head
// h / (H / Hkv) (or, for the checker's check, h % Hkv).
std::vector<float> repeat_kv(const std::vector<float>& x, const GqaCase& c, int64_t width, bool interleaved = false) {
  std::vector<float> y(static_cast<std::size_t>(c.B * c.H * c.S * width));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t g = interleaved ? h % c.Hkv : h / (c.H / c.Hkv);
      std::copy_n(x.begin() + (b * c.Hkv + g) * c.S * width, c.S * width, y.begin() + (b * c.H + h) * c.S * width);
    }
  return y;
}

// One kernel call; kv_heads = the heads K/V have (Hkv, or H for repeated).
std::vector<float> run(Kernel kernel, const GqaCase& c, const std::vector<float>& q, const std::vector<float>& k,
                       const std::vector<float>& v, int64_t kv_heads, float scale, int threads) {
  AttentionArgs<float> a;
  a.slices = c.B * c.H;
  a.heads = c.H;
  a.kv_heads = kv_heads;
  a.q_len = c.L;
  a.kv_len = c.S;
  a.head_dim = c.D;
  a.value_dim = c.Dv;
  a.scale = scale;
  a.num_threads = threads;
  a.modifiers.causal = detail::CausalRule{c.causal, CausalAlignment::BottomRight, 0, c.cols ? c.cols : c.S};
  a.modifiers.window = c.window;
  std::vector<float> qs = q, ks = k, vs = v;
  if (c.strided) {
    qs = pack(q, c.B, c.H, c.L, c.D);
    ks = pack(k, c.B, kv_heads, c.S, c.D);
    vs = pack(v, c.B, kv_heads, c.S, c.Dv);
    a.q_layout = packed_layout(c.H, c.L, c.D);
    a.k_layout = packed_layout(kv_heads, c.S, c.D);
    a.v_layout = packed_layout(kv_heads, c.S, c.Dv);
    a.out_layout = packed_layout(c.H, c.L, c.Dv);
  }
  a.q = qs.data();
  a.k = ks.data();
  a.v = vs.data();
  std::vector<float> out(static_cast<std::size_t>(c.B * c.H * c.L * c.Dv), -1.0f);
  a.out = out.data();
  switch (kernel) {
    case Kernel::Reference:
      detail::attention_forward_reference(a);
      break;
    case Kernel::Materialized:
      detail::attention_forward_materialized(a);
      break;
    case Kernel::Flash:
      detail::attention_forward_flash(a);
      break;
    case Kernel::Decode:
      detail::attention_forward_compressed(
          a, detail::CompressedKV{KVCacheDType::Native, ks.data(), vs.data(), nullptr, nullptr, c.S});
      break;
    case Kernel::DecodeOneCall: {
      a.q_layout = detail::resolve_layout(a.q_layout, c.H, c.L, c.D);
      a.out_layout = detail::resolve_layout(a.out_layout, c.H, c.L, c.Dv);
      const detail::DecodeCompressedKernel k = detail::decode_compressed_kernel_for(detail::simd_target_bit());
      const detail::CompressedKV kv{KVCacheDType::Native, ks.data(), vs.data(), nullptr, nullptr, c.S};
      for (int64_t slice = 0; slice < c.B * kv_heads; ++slice) k.rows(a, kv, slice, 0, c.H / kv_heads * c.L, detail::DecodeWay::Widen);
      break;
    }
    case Kernel::DecodeBf16:
    case Kernel::DecodeBf16Pairs: {
      std::vector<uint16_t> kb(ks.size()), vb(vs.size());
      for (std::size_t e = 0; e < ks.size(); ++e) kb[e] = detail::float_to_bfloat16_bits(ks[e]);
      for (std::size_t e = 0; e < vs.size(); ++e) vb[e] = detail::float_to_bfloat16_bits(vs[e]);
      detail::CompressedKV kv{KVCacheDType::BFloat16, kb.data(), vb.data(), nullptr, nullptr, c.S};
      kv.bf16_module = kernel == Kernel::DecodeBf16Pairs;
      const ScopedBf16Dot way(kv.bf16_module ? "dpbf16" : "");
      detail::attention_forward_compressed(a, kv);
      break;
    }
  }
  return c.strided ? unpack(out, c.B, c.H, c.L, c.Dv) : out;
}

// The oracle: float64 loops over the repeated K/V (no kernel code), and
// per output row the bound below.
struct Oracle {
  std::vector<double> out;
  std::vector<double> bound;  // per row (n, i)
};

// Bound per row, derived: each score s_ij = scale·<q_i, k_j> is off by at
// most γ_D·scale·Σ_d|q_d k_d| (γ_D ≈ D·u, float dot product), the softmax
// and the weighted sum add (S + 8)·u relative (exp within a few ulp, sums of
// S terms), and |Δout| <= (max_j |Δs_ij| + (S + 8)·u)·max_j ‖v_j‖∞ since a
// weight change Δs in the exponent changes p by at most a factor e^Δs ≈ 1 + Δs.
// Doubled for the rounding of the bound's own terms.
Oracle oracle(const Inputs& in, const std::vector<float>& k_rep, const std::vector<float>& v_rep) {
  const GqaCase& c = in.c;
  Oracle o;
  o.out.assign(static_cast<std::size_t>(c.B * c.H * c.L * c.Dv), 0.0);
  o.bound.assign(static_cast<std::size_t>(c.B * c.H * c.L), 0.0);
  const double scale = in.scale;
  for (int64_t n = 0; n < c.B * c.H; ++n) {
    const float* K = k_rep.data() + n * c.S * c.D;
    const float* V = v_rep.data() + n * c.S * c.Dv;
    for (int64_t i = 0; i < c.L; ++i) {
      const float* qi = in.q.data() + (n * c.L + i) * c.D;
      std::vector<double> s(static_cast<std::size_t>(c.S));
      double m = -INFINITY, max_abs_dot = 0, max_v = 0;
      for (int64_t j = 0; j < c.S; ++j) {
        double dot = 0, abs_dot = 0;
        for (int64_t d = 0; d < c.D; ++d) {
          dot += static_cast<double>(qi[d]) * K[j * c.D + d];
          abs_dot += std::abs(static_cast<double>(qi[d]) * K[j * c.D + d]);
        }
        const int64_t cols = c.cols ? c.cols : c.S;
        const int64_t p = i + (cols - c.L);  // the query's position
        const bool visible = j >= cols || ((!c.causal || j <= p) &&
                                           (c.window == 0 || (j > p - c.window && (c.causal || j < p + c.window))));
        s[j] = visible ? dot * scale : -INFINITY;
        if (visible) {
          m = std::max(m, s[j]);
          max_abs_dot = std::max(max_abs_dot, abs_dot * scale);
          for (int64_t d = 0; d < c.Dv; ++d) max_v = std::max(max_v, std::abs(static_cast<double>(V[j * c.Dv + d])));
        }
      }
      double* out = o.out.data() + (n * c.L + i) * c.Dv;
      if (m == -INFINITY) continue;  // no visible key: zeros (MaskedRowPolicy::Zeros)
      double sum = 0;
      for (int64_t j = 0; j < c.S; ++j) sum += (s[j] = std::exp(s[j] - m));
      for (int64_t j = 0; j < c.S; ++j)
        for (int64_t d = 0; d < c.Dv; ++d) out[d] += s[j] / sum * V[j * c.Dv + d];
      const double u = kUnitRoundoff;
      o.bound[n * c.L + i] = 2.0 * (c.D * u * max_abs_dot + (c.S + 8) * u) * max_v;
    }
  }
  return o;
}

// The pair way's own rounding (DecodeBf16Pairs): each weight p_j rounded to
// bf16 before PV, |Δp_j| <= u_bf16·p_j (u_bf16 = 2^-8), so the row moves by
// at most u_bf16·Σ_j p_j·|v_jd| <= u_bf16·max_j ‖v_j‖∞ (Σ p_j = 1; the sum
// l keeps p in float32), doubled as the oracle's terms are. A weight below
// bf16's normal range that vdpbf16ps flushes to zero changes the row by
// less than 2^-126·S·max‖v‖∞ relative, far inside this.
Oracle pairs_bound(Oracle o, const Inputs& in, const std::vector<float>& v_rep) {
  const GqaCase& c = in.c;
  for (int64_t n = 0; n < c.B * c.H; ++n) {
    double max_v = 0;
    for (int64_t e = 0; e < c.S * c.Dv; ++e) max_v = std::max(max_v, std::abs(static_cast<double>(v_rep[n * c.S * c.Dv + e])));
    for (int64_t i = 0; i < c.L; ++i) o.bound[n * c.L + i] += 2.0 * 0x1.0p-8 * max_v;
  }
  return o;
}

// q, K and V rounded to bf16 in place (the DecodeBf16* kernels' inputs).
void round_to_bf16(Inputs& in, bool with_q) {
  for (std::vector<float>* x : {&in.q, &in.k, &in.v}) {
    if (x == &in.q && !with_q) continue;
    for (float& e : *x) e = detail::bfloat16_bits_to_float(detail::float_to_bfloat16_bits(e));
  }
}

// Number of elements outside the bound, and the first one described.
struct Check {
  int64_t failures = 0;
  double worst_ratio = 0;
  std::string first;
};
Check check(const GqaCase& c, const std::vector<float>& got, const Oracle& o) {
  Check r;
  for (std::size_t e = 0; e < got.size(); ++e) {
    const std::size_t row = e / static_cast<std::size_t>(c.Dv);
    const double err = std::abs(static_cast<double>(got[e]) - o.out[e]);
    const double bound = o.bound[row];
    r.worst_ratio = std::max(r.worst_ratio, bound > 0 ? err / bound : (err > 0 ? INFINITY : 0));
    if (!(err <= bound)) {
      if (r.failures++ == 0) {
        std::ostringstream s;
        s << "element " << e << " (slice " << row / c.L << ", row " << row % c.L << "): got " << got[e]
          << ", want " << o.out[e] << ", error " << err << " > bound " << bound;
        r.first = s.str();
      }
    }
  }
  return r;
}

std::vector<Param> params() {
  std::vector<Param> p;
  for (const std::string& target : detail::simd_targets_available())
    for (const GqaCase& c : kCases)
      for (Kernel k : {Kernel::Reference, Kernel::Materialized, Kernel::Flash, Kernel::Decode})
        if (k != Kernel::Decode || decode_serves(c))
          for (int threads : {1, 2}) p.push_back({c, k, threads, target});
  return p;
}

class GqaKernel : public ::testing::TestWithParam<Param> {};

TEST_P(GqaKernel, EqualsRepeatedKvHeads) {
  const Param& p = GetParam();
  const ScopedTarget target(p.target);
  ASSERT_EQ(detail::simd_target_current(), p.target);
  const GqaCase& c = p.c;
  const Inputs in = make_inputs(c);
  const std::vector<float> k_rep = repeat_kv(in.k, c, c.D), v_rep = repeat_kv(in.v, c, c.Dv);
  const std::vector<float> got = run(p.kernel, c, in.q, in.k, in.v, c.Hkv, in.scale, p.threads);
  const Check r = check(c, got, oracle(in, k_rep, v_rep));
  EXPECT_EQ(r.failures, 0) << r.first;
  RecordProperty("worst_error_over_bound", fmt(r.worst_ratio));
  // Flash packs a decoded token's query heads per group (L = 1), which
  // changes its key tiling, and the decode kernel takes a group's rows
  // together (four keys at a time for up to 4 rows on AVX-512, 2 on AVX2,
  // else one at a time), which changes the order of a dot product's lane
  // sums: only the bound above holds there.
  const bool packed = (p.kernel == Kernel::Flash && c.L == 1 && c.Hkv != c.H) || p.kernel == Kernel::Decode;
  if (p.kernel != Kernel::Materialized && !packed) {
    // Same arithmetic on the same values; only the K/V addresses differ.
    // (Materialized goes through BLAS, whose blocking we do not own.)
    const std::vector<float> repeated = run(p.kernel, c, in.q, k_rep, v_rep, c.H, in.scale, p.threads);
    EXPECT_EQ(0, std::memcmp(got.data(), repeated.data(), got.size() * sizeof(float)))
        << "kv_heads=" << c.Hkv << " differs from the call on repeated K/V heads";
  }
}

INSTANTIATE_TEST_SUITE_P(Table, GqaKernel, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) { return param_name(info.param); });

// A decoded token's attention with fewer K/V heads than threads: the flash
// kernel cuts each group's query rows into items of whole vectors so that
// the threads share the lone slice (src/kernels/flash.cpp, item_rows), but
// only as far as every row keeps its key tiling. So the bits are the same
// for any thread count, on every target: groups of 32 (cut on AVX-512: two
// one-vector tiles instead of one of two vectors), 48 and 64 (one tile of
// four vectors on AVX-512, whose key tile differs: not cut), and 2 K/V
// heads for 3 and 4 threads. S = 300 spans several key tiles. The decode
// kernel cuts a group into chunks of 8 rows by shape and the chunks into
// calls by the thread count; a row's bits depend on its chunk alone, so they
// are the same too: the contiguous cases above, and groups whose rows are
// not a multiple of 8, with several queries and a window (chunks that skip
// different key blocks) and with position-less keys, on a float32 and on a
// bf16 cache (where up to 8 rows take four keys at a time on AVX-512).
TEST(GqaDecodeThreads, SameBitsForOneToFourThreads) {
  const GqaCase cases[] = {
      {1, 32, 1, 1, 300, 64, 64, true},  {1, 48, 1, 1, 300, 16, 16, true},
      {1, 64, 1, 1, 300, 16, 8, true},   {1, 32, 2, 1, 300, 32, 32, true, true},
      {2, 24, 1, 1, 257, 8, 8, false},
  };
  for (const std::string& target : detail::simd_targets_available()) {
    const ScopedTarget scoped(target);
    for (const GqaCase& c : cases)
      for (Kernel kernel : {Kernel::Flash, Kernel::Decode}) {
        if (kernel == Kernel::Decode && !decode_serves(c)) continue;
        const std::string name = case_name(c) + "_" + kernel_name(kernel);
        const Inputs in = make_inputs(c);
        const std::vector<float> one = run(kernel, c, in.q, in.k, in.v, c.Hkv, in.scale, 1);
        ASSERT_EQ(one.size(), static_cast<std::size_t>(c.B * c.H * c.L * c.Dv));
        const std::vector<float> k_rep = repeat_kv(in.k, c, c.D), v_rep = repeat_kv(in.v, c, c.Dv);
        const Check r = check(c, one, oracle(in, k_rep, v_rep));
        EXPECT_EQ(r.failures, 0) << target << " " << name << ": " << r.first;
        for (int threads : {2, 3, 4}) {
          const std::vector<float> got = run(kernel, c, in.q, in.k, in.v, c.Hkv, in.scale, threads);
          EXPECT_EQ(0, std::memcmp(got.data(), one.data(), got.size() * sizeof(float)))
              << target << " " << name << ": " << threads << " threads differ from 1";
        }
      }
    const GqaCase decode_cases[] = {
        {1, 20, 1, 3, 300, 16, 16, true, false, 50},  // 60 rows: 7 chunks and a half
        {1, 2, 1, 16, 300, 16, 16, true, false, 100},  // 4 chunks, each with its own first key
        {2, 12, 2, 2, 257, 24, 24, true, false, 0, 240},
        {1, 32, 1, 1, 300, 64, 64, true},
        {1, 6, 1, 1, 150, 16, 16, true},
        {1, 36, 1, 4, 300, 16, 16, true, false, 80},  // 144 rows: 18 chunks, more than one call's 8
    };
    for (const GqaCase& c : decode_cases)
      for (Kernel kernel : {Kernel::Decode, Kernel::DecodeBf16, Kernel::DecodeBf16Pairs}) {
        const std::string name = case_name(c) + "_" + kernel_name(kernel);
        Inputs in = make_inputs(c);
        if (kernel != Kernel::Decode) round_to_bf16(in, /*with_q=*/kernel == Kernel::DecodeBf16Pairs);
        const std::vector<float> one = run(kernel, c, in.q, in.k, in.v, c.Hkv, in.scale, 1);
        const std::vector<float> v_rep = repeat_kv(in.v, c, c.Dv);
        Oracle o = oracle(in, repeat_kv(in.k, c, c.D), v_rep);
        if (kernel == Kernel::DecodeBf16Pairs) o = pairs_bound(std::move(o), in, v_rep);
        const Check r = check(c, one, o);
        EXPECT_EQ(r.failures, 0) << target << " " << name << ": " << r.first;
        for (int threads : {2, 3, 4}) {
          const std::vector<float> got = run(kernel, c, in.q, in.k, in.v, c.Hkv, in.scale, threads);
          EXPECT_EQ(0, std::memcmp(got.data(), one.data(), got.size() * sizeof(float)))
              << target << " " << name << ": " << threads << " threads differ from 1";
        }
        if (kernel == Kernel::Decode) {  // one call per slice: the same bits as the driver's cut
          const std::vector<float> whole = run(Kernel::DecodeOneCall, c, in.q, in.k, in.v, c.Hkv, in.scale, 1);
          EXPECT_EQ(0, std::memcmp(whole.data(), one.data(), whole.size() * sizeof(float)))
              << target << " " << name << ": one call per K/V slice differs from the driver's calls";
        }
      }
  }
}

// bf16's pair way of the decode kernel (a bf16 module over a bf16 cache),
// on every target this machine runs: within the oracle's bound plus the
// weights' rounding (pairs_bound), and, on each target, vdpbf16ps
// (DecodeWay::PairsNative, where the CPU has AVX512_BF16) the same bits as
// Highway's widening of the same pairs (DecodeWay::Pairs): the emulation
// does vdpbf16ps's two products and two roundings in its order, and differs
// only where an input is below bf16's normal range (vdpbf16ps flushes it).
// The shapes: D 64, 96, 128 (multiples of 2N on every target, N float
// lanes: the pair way), D 40 and 8 (the pair way on the 4-lane targets only,
// 2N = 8; the widening on AVX2 and AVX-512, where 2N does not divide D); an
// odd number of keys (the last key paired with zeros), a window, causal
// rows over several queries, keys without a position, groups of 1 to 32
// rows. And one case whose scores span more than 87 (q scaled up): weights
// below 2^-126, which vdpbf16ps flushes to zero and its emulation keeps, so
// there only the bound is required of each.
TEST(GqaDecodePairs, WithinBoundAndNativeEqualsEmulated) {
  const GqaCase cases[] = {
      {1, 32, 1, 1, 1001, 128, 128, true},
      {1, 8, 2, 1, 257, 64, 64, true, false, 100},
      {2, 12, 3, 2, 131, 40, 40, true, false, 0, 120},
      {1, 4, 4, 3, 97, 96, 96, true},
      {1, 6, 1, 1, 65, 8, 8, true},
      {1, 8, 1, 1, 300, 64, 64, true},  // q scaled: weights below 2^-126
  };
  for (const std::string& target : detail::simd_targets_available()) {
    const ScopedTarget scoped(target);
    for (const GqaCase& c : cases) {
      const bool tiny_weights = &c == &cases[std::size(cases) - 1];
      const std::string name = target + " " + case_name(c) + (tiny_weights ? " tiny weights" : "");
      Inputs in = make_inputs(c);
      if (tiny_weights)
        for (float& e : in.q) e *= 24.0f;
      round_to_bf16(in, /*with_q=*/true);
      const std::vector<float> got = run(Kernel::DecodeBf16Pairs, c, in.q, in.k, in.v, c.Hkv, in.scale, 2);
      const std::vector<float> v_rep = repeat_kv(in.v, c, c.Dv);
      const Check r = check(c, got, pairs_bound(oracle(in, repeat_kv(in.k, c, c.D), v_rep), in, v_rep));
      EXPECT_EQ(r.failures, 0) << name << ": " << r.first;
      // The two pair ways, each kernel called once per K/V slice.
      AttentionArgs<float> a;
      a.slices = c.B * c.H;
      a.heads = c.H;
      a.kv_heads = c.Hkv;
      a.q_len = c.L;
      a.kv_len = c.S;
      a.head_dim = a.value_dim = c.D;
      a.scale = in.scale;
      a.modifiers.causal = detail::CausalRule{c.causal, CausalAlignment::BottomRight, 0, c.cols ? c.cols : c.S};
      a.modifiers.window = c.window;
      a.q = in.q.data();
      a.q_layout = detail::resolve_layout(a.q_layout, c.H, c.L, c.D);
      a.out_layout = detail::resolve_layout(a.out_layout, c.H, c.L, c.Dv);
      std::vector<uint16_t> kb(in.k.size()), vb(in.v.size());
      for (std::size_t e = 0; e < kb.size(); ++e) kb[e] = detail::float_to_bfloat16_bits(in.k[e]);
      for (std::size_t e = 0; e < vb.size(); ++e) vb[e] = detail::float_to_bfloat16_bits(in.v[e]);
      const detail::CompressedKV kv{KVCacheDType::BFloat16, kb.data(), vb.data(), nullptr, nullptr, c.S};
      const detail::DecodeCompressedKernel k = detail::decode_compressed_kernel_for(detail::simd_target_bit());
      const auto call = [&](detail::DecodeWay way) {
        std::vector<float> out(got.size(), -1.0f);
        a.out = out.data();
        for (int64_t slice = 0; slice < c.B * c.Hkv; ++slice) k.rows(a, kv, slice, 0, c.H / c.Hkv * c.L, way);
        return out;
      };
      // The driver's rows (two threads, its cut into calls) are the one
      // call's; the way it took is vdpbf16ps where the CPU has it.
      const std::vector<float> emulated = call(detail::DecodeWay::Pairs);
      const std::vector<float> native = detail::cpu_has_avx512_bf16() ? call(detail::DecodeWay::PairsNative) : emulated;
      if (!tiny_weights) {
        EXPECT_EQ(0, std::memcmp(native.data(), emulated.data(), got.size() * sizeof(float)))
            << name << ": vdpbf16ps differs from its emulation";
      }
      EXPECT_EQ(0, std::memcmp(native.data(), got.data(), got.size() * sizeof(float)))
          << name << ": the driver's calls differ from one call per K/V slice";
      const Check re = check(c, emulated, pairs_bound(oracle(in, repeat_kv(in.k, c, c.D), v_rep), in, v_rep));
      EXPECT_EQ(re.failures, 0) << name << " emulated: " << re.first;
      // The pair way is not the widening way: the weights' rounding shows.
      // It runs where 2N divides D, so D 64, 96, 128 on every target but
      // HWY_SCALAR (one lane: no pairs, it widens).
      if (target != "SCALAR" && c.D % 32 == 0) {
        const std::vector<float> widened = run(Kernel::DecodeBf16, c, in.q, in.k, in.v, c.Hkv, in.scale, 2);
        EXPECT_NE(0, std::memcmp(widened.data(), got.data(), got.size() * sizeof(float))) << name;
      }
    }
  }
}

// A NaN in the cache makes NaN the output of every row that sees it, on
// the decode kernel as on the reference (fmax's rule for the block max: the
// NaN score is not the max, its weight exp(NaN) is NaN); rows that do not
// see it stay finite. The NaN sits at every key in turn (every lane of
// every vector of the blocks, where a lane-order max would keep or drop
// it), on a float32 and a bf16 cache, for 1 and 8 rows.
TEST(GqaDecodeNaN, PropagatesToTheRowsThatSeeIt) {
  for (const std::string& target : detail::simd_targets_available()) {
    const ScopedTarget scoped(target);
    for (const GqaCase& c : {GqaCase{1, 8, 1, 2, 150, 32, 32, true, false, 40}, GqaCase{1, 1, 1, 1, 150, 32, 32, true}})
      for (int64_t key = 0; key < c.S; ++key)
        for (Kernel kernel : {Kernel::Decode, Kernel::DecodeBf16, Kernel::DecodeBf16Pairs}) {
          Inputs in = make_inputs(c);
          if (kernel == Kernel::DecodeBf16Pairs) round_to_bf16(in, /*with_q=*/true);
          in.k[static_cast<std::size_t>(key * c.D + c.D - 1)] = std::numeric_limits<float>::quiet_NaN();
          const std::vector<float> got = run(kernel, c, in.q, in.k, in.v, c.Hkv, in.scale, 1);
          const std::vector<float> ref = run(Kernel::Reference, c, in.q, in.k, in.v, c.Hkv, in.scale, 1);
          for (std::size_t e = 0; e < got.size(); ++e) {
            const int64_t i = static_cast<int64_t>(e / c.Dv) % c.L, p = i + c.S - c.L;  // the query's position
            const bool sees = key <= p && key > p - (c.window ? c.window : p + 1);
            ASSERT_EQ(std::isnan(got[e]), sees) << target << " " << case_name(c) << " " << kernel_name(kernel)
                                                << " NaN at key " << key << ", element " << e << ": " << got[e];
            ASSERT_EQ(std::isnan(ref[e]), sees) << "reference, element " << e;
          }
        }
  }
}

// The check can fail: one perturbed element, and the wrong grouping
// (query head h reading K/V head h % Hkv instead of h / (H / Hkv)).
TEST(GqaKernelChecker, CatchesPerturbationAndWrongGrouping) {
  const GqaCase c{2, 4, 2, 17, 33, 16, 12};
  const Inputs in = make_inputs(c);
  const std::vector<float> got = run(Kernel::Reference, c, in.q, in.k, in.v, c.Hkv, in.scale, 1);
  const Oracle good = oracle(in, repeat_kv(in.k, c, c.D), repeat_kv(in.v, c, c.Dv));
  ASSERT_EQ(check(c, got, good).failures, 0);
  std::vector<float> bad = got;
  bad[got.size() / 2] += 1e-3f;  // ~10x the bound here
  EXPECT_EQ(check(c, bad, good).failures, 1);
  const Oracle wrong = oracle(in, repeat_kv(in.k, c, c.D, true), repeat_kv(in.v, c, c.Dv, true));
  EXPECT_GT(check(c, got, wrong).failures, 0);
}

// kv_heads must divide heads: one line naming num_kv_heads with both values.
TEST(GqaKernelValidation, KvHeadsMustDivideHeads) {
  const GqaCase c{1, 4, 3, 2, 2, 4, 4};
  std::vector<float> q(32, 0.5f), k(24, 0.5f), v(24, 0.5f);
  for (Kernel kernel : {Kernel::Reference, Kernel::Materialized, Kernel::Flash}) {
    try {
      run(kernel, c, q, k, v, 3, 0.5f, 1);
      ADD_FAILURE() << kernel_name(kernel) << " accepted kv_heads 3 with 4 heads";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("num_kv_heads"), std::string::npos) << m;
      EXPECT_NE(m.find("4"), std::string::npos) << m;
      EXPECT_NE(m.find("got 3"), std::string::npos) << m;
    }
  }
}

}  // namespace
}  // namespace multihead

namespace multihead {
namespace {

// The backward kernels sum d_k and d_v over each group
// (test_attention_backward.cpp, Grouped/…); a kv_heads that does not divide
// heads is refused (naming num_kv_heads) before any pointer is read.
TEST(GqaKernelValidation, BackwardRefusesKvHeadsNotDividingHeads) {
  detail::AttentionBackwardArgs<float> b;
  b.forward.slices = 4;
  b.forward.heads = 4;
  b.forward.kv_heads = 3;
  for (AttentionKernel k : {AttentionKernel::Reference, AttentionKernel::Materialized, AttentionKernel::Flash}) {
    try {
      detail::attention_backward(b, k);
      ADD_FAILURE() << to_string(k) << " accepted kv_heads 3 with 4 heads";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find("num_kv_heads:"), 0u) << to_string(k) << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace multihead
