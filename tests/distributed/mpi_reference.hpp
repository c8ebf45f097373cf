// tests/distributed/mpi_reference.hpp: one row of a MultiheadAttention table
// (every option the distributed modes take) and its one-process reference:
// the module with randomised parameters, the inputs, masks and options, the
// forward and backward every distributed case compares against. The head
// and sequence tables (mpi_head_cases.cpp, mpi_sequence_cases.cpp) share it.
#pragma once

#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "mpi_inputs.hpp"
#include "mpi_test.hpp"
#include "multihead/grouped_query_attention.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/positions.hpp"

namespace multihead::mpi_test {

struct ModuleRow {
  int64_t E = 12, H = 4, kdim = 0, vdim = 0;
  bool bias = true, bias_kv = false, zero_attn = false, batch_first = false, batched = true;
  int64_t B = 2, L = 5, S = 5;
  MaskKind mask = MaskKind::None;
  int padding = 0;  // 0 none, 1 bool, 2 float
  int causal = 0;   // 0 off, 1 top-left, 2 bottom-right
  std::optional<int64_t> window;
  std::optional<double> softcap;
  bool alibi = false, need_weights = false, average = true, self = true;
  MaskedRowPolicy masked = MaskedRowPolicy::Zeros;

  std::string name() const {
    std::string s = "E=" + std::to_string(E) + ",H=" + std::to_string(H);
    if (kdim) s += ",kdim=" + std::to_string(kdim);
    if (vdim) s += ",vdim=" + std::to_string(vdim);
    s += std::string(",bias=") + (bias ? "1" : "0");
    if (bias_kv) s += ",bias_kv";
    if (zero_attn) s += ",zero_attn";
    if (batch_first) s += ",batch_first";
    if (!batched) s += ",unbatched";
    s += ",B=" + std::to_string(B) + ",L=" + std::to_string(L) + ",S=" + std::to_string(S);
    s += std::string(",mask=") + mask_name(mask);
    if (padding) s += padding == 1 ? ",kpm=bool" : ",kpm=float";
    if (causal) s += causal == 1 ? ",causal=top-left" : ",causal=bottom-right";
    if (window) s += ",window=" + std::to_string(*window);
    if (softcap) s += ",softcap";
    if (alibi) s += ",alibi";
    if (need_weights) s += average ? ",weights=mean" : ",weights=per-head";
    if (masked == MaskedRowPolicy::NaN) s += ",masked_rows=nan";
    return s + (self ? ",self" : ",cross");
  }
};

// Randomised parameters (PyTorch's init leaves the biases zero, which would
// hide a bias handled wrongly).
template <class M>
void randomise(M& module, uint64_t seed) {
  auto sd = module.state_dict();
  for (auto& [name, t] : sd)
    t = random_tensor<typename std::remove_reference_t<decltype(t)>::value_type>(t.shape(), seed++, 0.3);
  module.load_state_dict(sd);
}

// The row's module, inputs and one-process forward and backward (d_out
// random). Not movable: `options` points at its masks.
template <class T>
struct Reference {
  MultiheadAttentionConfig config;
  std::optional<BasicMultiheadAttention<T>> whole;
  Tensor<T> q, k, v, d_out;
  bool self = false;
  std::optional<Mask<T>> mask, padding;
  ForwardOptions<T> options;
  ForwardResult<T> want;
  MultiheadAttentionGradients<T> want_g;

  Reference(const ModuleRow& row, uint64_t module_seed, uint64_t parameter_seed) {
    config.embed_dim = row.E;
    config.num_heads = row.H;
    config.kdim = row.kdim;
    config.vdim = row.vdim;
    config.bias = row.bias;
    config.add_bias_kv = row.bias_kv;
    config.add_zero_attn = row.zero_attn;
    config.batch_first = row.batch_first;
    whole.emplace(config, module_seed);
    randomise(*whole, parameter_seed);
    const auto shape = [&](int64_t len, int64_t width) {
      if (!row.batched) return Shape{len, width};
      return row.batch_first ? Shape{row.B, len, width} : Shape{len, row.B, width};
    };
    q = random_tensor<T>(shape(row.L, row.E), 1);
    k = random_tensor<T>(shape(row.S, config.key_dim()), 2);
    v = random_tensor<T>(shape(row.S, config.value_dim()), 3);
    self = row.self && row.L == row.S && config.same_embed_dim();
    const int64_t B = row.batched ? row.B : 1;
    mask = make_mask<T>(row.mask, B * row.H, row.L, row.S, 4);
    padding = make_key_padding<T>(row.padding, row.B, row.S, row.batched, 5);
    options.attn_mask = mask ? &*mask : nullptr;
    options.key_padding_mask = padding ? &*padding : nullptr;
    options.need_weights = row.need_weights;
    options.average_attn_weights = row.average;
    options.attention.is_causal = row.causal != 0;
    options.attention.causal_alignment = row.causal == 2 ? CausalAlignment::BottomRight : CausalAlignment::TopLeft;
    options.attention.window = row.window;
    options.attention.softcap = row.softcap;
    options.attention.masked_rows = row.masked;
    options.alibi = row.alibi;
    options.attention.num_threads = 1;
    ForwardContext<T> ctx;
    want = whole->forward(q, key(), value(), options, ctx);
    d_out = random_tensor<T>(want.output.shape(), 6);
    want_g = whole->backward(ctx, d_out);
  }
  Reference(const Reference&) = delete;
  const Tensor<T>& key() const { return self ? q : k; }
  const Tensor<T>& value() const { return self ? q : v; }
};

// A GroupedQueryAttention row (self-attention, batch first) and its
// one-process reference.
struct GqaRow {
  int64_t E = 16, H = 8, Hkv = 4, D = 0;
  bool bias = true, causal = true, alibi = false;
  std::optional<RopeConvention> rope;
  std::optional<int64_t> window;
  int64_t B = 2, L = 6;
  std::string name() const {
    std::string s = "E=" + std::to_string(E) + ",H=" + std::to_string(H) + ",Hkv=" + std::to_string(Hkv);
    if (D) s += ",D=" + std::to_string(D);
    s += std::string(",bias=") + (bias ? "1" : "0") + (causal ? ",causal" : ",full");
    if (rope) s += ",rope=" + to_string(*rope);
    if (window) s += ",window=" + std::to_string(*window);
    if (alibi) s += ",alibi";
    return s + ",B=" + std::to_string(B) + ",L=" + std::to_string(L);
  }
};

// The table's rows: grouped (uneven groups on 3 or 4 ranks), RoPE in both
// conventions, window, ALiBi, multi-head (Hkv = H).
inline std::vector<GqaRow> gqa_rows() {
  std::vector<GqaRow> rows;
  const auto add = [&](auto edit) {
    GqaRow r;
    edit(r);
    rows.push_back(r);
  };
  add([](GqaRow&) {});
  add([](GqaRow& r) { r.Hkv = 4; r.H = 12; r.E = 24; r.bias = false; r.causal = false; });
  add([](GqaRow& r) { r.Hkv = 5; r.H = 10; r.E = 20; r.rope = RopeConvention::HalfSplit; });  // uneven groups
  add([](GqaRow& r) { r.D = 6; r.rope = RopeConvention::Interleaved; r.window = 3; r.alibi = true; });
  add([](GqaRow& r) { r.Hkv = 8; r.alibi = true; r.causal = false; });  // multi-head: Hkv = H
  return rows;
}

template <class T>
struct GqaReference {
  GroupedQueryAttentionConfig config;
  std::optional<GroupedQueryAttention<T>> whole;
  Tensor<T> x, want, d_out;
  AttentionOptions options;
  GroupedQueryAttentionGradients<T> want_g;
  explicit GqaReference(const GqaRow& row) {
    config.embed_dim = row.E;
    config.num_heads = row.H;
    config.num_kv_heads = row.Hkv;
    config.head_dim = row.D;
    config.bias = row.bias;
    config.causal = row.causal;
    if (row.rope) config.rope = RopeOptions{*row.rope, 10000.0, 0};
    whole.emplace(config, 3);
    randomise(*whole, 200);
    x = random_tensor<T>({row.B, row.L, row.E}, 1);
    options.window = row.window;
    if (row.alibi) options.alibi_slopes = alibi_slopes(row.H);
    options.num_threads = 1;
    GroupedQueryForwardContext<T> ctx;
    want = whole->forward(x, options, ctx);
    d_out = random_tensor<T>(want.shape(), 6);
    want_g = whole->backward(ctx, d_out);
  }
  GqaReference(const GqaReference&) = delete;
};

// got against want, and each of want_g's parameters against got_g's of the
// same name (expected(name, want's tensor) gives what got should hold: the
// whole tensor, or the rank's slice of it), within tolerance<T>().
template <class G, class Expected>
void expect_gradients(Report& report, const G& got_g, const G& want_g, Expected expected) {
  const double tol = tolerance<typename std::decay_t<decltype(want_g.parameters.begin()->second)>::value_type>();
  for (const auto& [name, t] : want_g.parameters) {
    auto it = got_g.parameters.find(name);
    if (it == got_g.parameters.end()) report.fail("d " + name + ": missing");
    else expect_close(report, "d " + name, it->second, expected(name, t), tol);
  }
}

}  // namespace multihead::mpi_test
