// tests/distributed/mpi_head_cases.cpp: head parallel against the one-process
// module, forward and backward, for every row of the tables below (each
// name says all its parameters), in float32 and float64.
#include <unistd.h>

#include <cstdio>
#include <map>

#include "mpi_inputs.hpp"
#include "mpi_test.hpp"
#include "multihead/distributed.hpp"
#include "multihead/grouped_query_attention.hpp"
#include "multihead/io.hpp"
#include "multihead/multihead_attention.hpp"

namespace multihead::mpi_test {
namespace {

using distributed::Communicator;

struct MhaRow {
  int64_t E = 12, H = 4, kdim = 0, vdim = 0;
  bool bias = true, bias_kv = false, zero_attn = false, batch_first = false, batched = true;
  int64_t B = 2, L = 5, S = 5;
  MaskKind mask = MaskKind::None;
  int padding = 0;  // 0 none, 1 bool, 2 float
  int causal = 0;   // 0 off, 1 top-left, 2 bottom-right
  std::optional<int64_t> window;
  bool alibi = false, need_weights = false, average = true, self = true;

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
    if (alibi) s += ",alibi";
    if (need_weights) s += average ? ",weights=mean" : ",weights=per-head";
    s += self ? ",self" : ",cross";
    return s;
  }
};

// Randomised parameters (PyTorch's init leaves the biases zero, which would
// hide a bias handled wrongly).
template <class M>
void randomise(M& module, uint64_t seed) {
  auto sd = module.state_dict();
  for (auto& [name, t] : sd) t = random_tensor<typename std::remove_reference_t<decltype(t)>::value_type>(t.shape(), seed++, 0.3);
  module.load_state_dict(sd);
}

// Rows [r0, r0 + n) of a matrix with `cols` columns (a vector: cols = 1).
template <class T>
Tensor<T> rows_of(const Tensor<T>& t, int64_t cols, std::vector<std::pair<int64_t, int64_t>> blocks, Shape shape) {
  Tensor<T> out(std::move(shape));
  int64_t at = 0;
  for (auto [r0, n] : blocks)
    for (int64_t x = r0 * cols; x < (r0 + n) * cols; ++x) out.data()[at++] = t.data()[x];
  return out;
}
template <class T>
Tensor<T> cols_of(const Tensor<T>& t, int64_t c0, int64_t n) {
  const int64_t R = t.size(0), C = t.size(1);
  Tensor<T> out(Shape{R, n});
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < n; ++c) out.data()[r * n + c] = t.data()[r * C + c0 + c];
  return out;
}

template <class T>
void mha_case(const MhaRow& row, Communicator& comm, Report& report) {
  MultiheadAttentionConfig c;
  c.embed_dim = row.E;
  c.num_heads = row.H;
  c.kdim = row.kdim;
  c.vdim = row.vdim;
  c.bias = row.bias;
  c.add_bias_kv = row.bias_kv;
  c.add_zero_attn = row.zero_attn;
  c.batch_first = row.batch_first;
  BasicMultiheadAttention<T> whole(c, 11);
  randomise(whole, 100);
  const auto shape = [&](int64_t len, int64_t width) {
    if (!row.batched) return Shape{len, width};
    return row.batch_first ? Shape{row.B, len, width} : Shape{len, row.B, width};
  };
  const Tensor<T> q = random_tensor<T>(shape(row.L, row.E), 1);
  const Tensor<T> k = random_tensor<T>(shape(row.S, c.key_dim()), 2);
  const Tensor<T> v = random_tensor<T>(shape(row.S, c.value_dim()), 3);
  const bool self = row.self && row.L == row.S && c.same_embed_dim();
  const Tensor<T>& key = self ? q : k;
  const Tensor<T>& value = self ? q : v;
  const int64_t B = row.batched ? row.B : 1;
  const auto mask = make_mask<T>(row.mask, B * row.H, row.L, row.S, 4);
  const auto padding = make_key_padding<T>(row.padding, row.B, row.S, row.batched, 5);
  ForwardOptions<T> o;
  o.attn_mask = mask ? &*mask : nullptr;
  o.key_padding_mask = padding ? &*padding : nullptr;
  o.need_weights = row.need_weights;
  o.average_attn_weights = row.average;
  o.attention.is_causal = row.causal != 0;
  o.attention.causal_alignment = row.causal == 2 ? CausalAlignment::BottomRight : CausalAlignment::TopLeft;
  o.attention.window = row.window;
  o.alibi = row.alibi;
  o.attention.num_threads = 1;

  ForwardContext<T> ctx;
  const ForwardResult<T> want = whole.forward(q, key, value, o, ctx);
  const Tensor<T> d_out = random_tensor<T>(want.output.shape(), 6);
  const MultiheadAttentionGradients<T> want_g = whole.backward(ctx, d_out);

  const distributed::HeadParallelMultiheadAttention<T> hp(comm, c, whole.parameters());
  distributed::HeadParallelContext<T> hctx;
  const ForwardResult<T> got = hp.forward(q, key, value, o, hctx);
  const MultiheadAttentionGradients<T> got_g = hp.backward(hctx, d_out);

  const double tol = tolerance<T>();
  expect_close(report, "output", got.output, want.output, tol);
  if (row.need_weights) {
    if (!got.attn_weights) report.fail("attn_weights: missing");
    else expect_close(report, "attn_weights", *got.attn_weights, *want.attn_weights, tol);
  }
  expect_close(report, "d_query", got_g.query, want_g.query, tol);
  expect_close(report, "d_key", got_g.key, want_g.key, tol);
  expect_close(report, "d_value", got_g.value, want_g.value, tol);
  const int64_t E = row.E, D = c.head_dim(), r0 = hp.heads().begin * D, n = hp.heads().count * D;
  const auto& wp = want_g.parameters;
  const auto& gp = got_g.parameters;
  const auto param = [&](const std::string& name, const Tensor<T>& expected) {
    auto it = gp.find(name);
    if (it == gp.end()) report.fail("d " + name + ": missing");
    else expect_close(report, "d " + name, it->second, expected, tol);
  };
  if (c.same_embed_dim()) {
    param("in_proj_weight", rows_of(wp.at("in_proj_weight"), E, {{r0, n}, {E + r0, n}, {2 * E + r0, n}}, {3 * n, E}));
  } else {
    param("q_proj_weight", rows_of(wp.at("q_proj_weight"), E, {{r0, n}}, {n, E}));
    param("k_proj_weight", rows_of(wp.at("k_proj_weight"), c.key_dim(), {{r0, n}}, {n, c.key_dim()}));
    param("v_proj_weight", rows_of(wp.at("v_proj_weight"), c.value_dim(), {{r0, n}}, {n, c.value_dim()}));
  }
  param("out_proj.weight", cols_of(wp.at("out_proj.weight"), r0, n));
  if (row.bias) {
    param("in_proj_bias", rows_of(wp.at("in_proj_bias"), 1, {{r0, n}, {E + r0, n}, {2 * E + r0, n}}, {3 * n}));
    param("out_proj.bias", wp.at("out_proj.bias"));
  }
  if (row.bias_kv) {
    param("bias_k", rows_of(wp.at("bias_k"), 1, {{r0, n}}, {1, 1, n}));
    param("bias_v", rows_of(wp.at("bias_v"), 1, {{r0, n}}, {1, 1, n}));
  }
}

std::vector<MhaRow> mha_rows() {
  std::vector<MhaRow> rows;
  const auto add = [&](auto edit) {
    MhaRow r;
    edit(r);
    rows.push_back(r);
  };
  add([](MhaRow&) {});
  add([](MhaRow& r) { r.H = 5; r.E = 10; });  // uneven: 2,1,1,1 heads on 4 ranks
  add([](MhaRow& r) { r.H = 6; r.E = 12; r.batch_first = true; r.L = 3; r.S = 7; r.self = false; });
  add([](MhaRow& r) { r.batched = false; r.mask = MaskKind::Bool3D; r.L = 4; r.S = 6; r.self = false; });
  add([](MhaRow& r) { r.mask = MaskKind::Bool2D; r.padding = 1; });
  add([](MhaRow& r) { r.mask = MaskKind::Float3D; r.padding = 2; r.H = 5; r.E = 10; });
  add([](MhaRow& r) { r.mask = MaskKind::Float2D; r.bias = false; });
  add([](MhaRow& r) { r.mask = MaskKind::Bool3D; r.padding = 1; r.bias_kv = true; r.zero_attn = true; });
  add([](MhaRow& r) { r.kdim = 7; r.vdim = 9; r.L = 4; r.S = 6; r.self = false; r.padding = 1; });
  add([](MhaRow& r) { r.kdim = 3; r.vdim = 3; r.H = 4; r.E = 12; r.self = false; });  // local kdim = vdim = H_r·D on 4 ranks
  add([](MhaRow& r) { r.causal = 1; r.L = 4; r.S = 7; r.self = false; });
  add([](MhaRow& r) { r.causal = 2; r.L = 4; r.S = 7; r.self = false; r.mask = MaskKind::Bool2D; });
  add([](MhaRow& r) { r.causal = 1; r.window = 2; r.alibi = true; r.H = 5; r.E = 10; });
  add([](MhaRow& r) { r.alibi = true; r.causal = 2; r.L = 3; r.S = 6; r.self = false; r.H = 6; r.E = 12; });
  add([](MhaRow& r) { r.window = 3; r.padding = 2; });
  add([](MhaRow& r) { r.need_weights = true; r.mask = MaskKind::Bool2D; r.H = 5; r.E = 10; });
  add([](MhaRow& r) { r.need_weights = true; r.average = false; r.bias_kv = true; r.causal = 1; });
  return rows;
}

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

template <class T>
void gqa_case(const GqaRow& row, Communicator& comm, Report& report) {
  GroupedQueryAttentionConfig c;
  c.embed_dim = row.E;
  c.num_heads = row.H;
  c.num_kv_heads = row.Hkv;
  c.head_dim = row.D;
  c.bias = row.bias;
  c.causal = row.causal;
  if (row.rope) c.rope = RopeOptions{*row.rope, 10000.0, 0};
  GroupedQueryAttention<T> whole(c, 3);
  randomise(whole, 200);
  const Tensor<T> x = random_tensor<T>({row.B, row.L, row.E}, 1);
  AttentionOptions o;
  o.window = row.window;
  if (row.alibi) o.alibi_slopes = alibi_slopes(row.H);
  o.num_threads = 1;
  GroupedQueryForwardContext<T> ctx;
  const Tensor<T> want = whole.forward(x, o, ctx);
  const Tensor<T> d_out = random_tensor<T>(want.shape(), 6);
  const auto want_g = whole.backward(ctx, d_out);
  const distributed::HeadParallelGroupedQueryAttention<T> hp(comm, c, whole.parameters());
  GroupedQueryForwardContext<T> hctx;
  const Tensor<T> got = hp.forward(x, o, hctx);
  const auto got_g = hp.backward(hctx, d_out);
  const double tol = tolerance<T>();
  expect_close(report, "output", got, want, tol);
  expect_close(report, "d_x", got_g.x, want_g.x, tol);
  const int64_t D = c.resolved_head_dim(), E = row.E;
  const int64_t q0 = hp.heads().begin * D, nq = hp.heads().count * D;
  const int64_t k0 = hp.groups().begin * D, nk = hp.groups().count * D;
  const auto& wp = want_g.parameters;
  const auto param = [&](const std::string& name, const Tensor<T>& expected) {
    auto it = got_g.parameters.find(name);
    if (it == got_g.parameters.end()) report.fail("d " + name + ": missing");
    else expect_close(report, "d " + name, it->second, expected, tol);
  };
  param("q_proj.weight", rows_of(wp.at("q_proj.weight"), E, {{q0, nq}}, {nq, E}));
  param("k_proj.weight", rows_of(wp.at("k_proj.weight"), E, {{k0, nk}}, {nk, E}));
  param("v_proj.weight", rows_of(wp.at("v_proj.weight"), E, {{k0, nk}}, {nk, E}));
  param("o_proj.weight", cols_of(wp.at("o_proj.weight"), q0, nq));
  if (row.bias) {
    param("q_proj.bias", rows_of(wp.at("q_proj.bias"), 1, {{q0, nq}}, {nq}));
    param("k_proj.bias", rows_of(wp.at("k_proj.bias"), 1, {{k0, nk}}, {nk}));
    param("v_proj.bias", rows_of(wp.at("v_proj.bias"), 1, {{k0, nk}}, {nk}));
    param("o_proj.bias", wp.at("o_proj.bias"));
  }
}

std::vector<GqaRow> gqa_rows() {
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

template <class Row, class Fn>
void add_typed(std::vector<Case>& cases, const std::string& what, const Row& row, Fn fn, int max_ranks) {
  (void)max_ranks;
  cases.push_back({what + "/f64/" + row.name(), [row, fn](Communicator& c, Report& r) { fn.template operator()<double>(row, c, r); }});
  cases.push_back({what + "/f32/" + row.name(), [row, fn](Communicator& c, Report& r) { fn.template operator()<float>(row, c, r); }});
}

std::vector<Case> make_cases() {
  std::vector<Case> cases;
  for (const MhaRow& row : mha_rows())
    add_typed(cases, "mha", row, []<class T>(const MhaRow& r, Communicator& c, Report& rep) { mha_case<T>(r, c, rep); }, 0);
  for (const GqaRow& row : gqa_rows())
    add_typed(cases, "gqa", row, []<class T>(const GqaRow& r, Communicator& c, Report& rep) { gqa_case<T>(r, c, rep); }, 0);
  // P larger than the work: every rank throws the same error, naming both.
  cases.push_back({"mha/ranks_above_heads", [](Communicator& comm, Report& report) {
                     MultiheadAttentionConfig c;
                     c.embed_dim = 4;
                     c.num_heads = 1;
                     const MultiheadAttention whole(c, 1);
                     try {
                       distributed::HeadParallelMultiheadAttention<float> hp(comm, c, whole.parameters());
                       report.fail("no error with 1 head on " + std::to_string(comm.size()) + " ranks");
                     } catch (const AgreedError& e) {
                       const std::string want = "ranks: expected at most num_heads = 1 ranks in head parallel "
                                                "(each rank needs one), got " + std::to_string(comm.size());
                       if (e.what() != want) report.fail(std::string("got '") + e.what() + "', expected '" + want + "'");
                     }
                   }, 2});
  return cases;
}

}  // namespace

MULTIHEAD_MPI_CASES(head, make_cases);

}  // namespace multihead::mpi_test

// HeadParallelMultiheadAttention::load reads only the rank's blocks from a
// safetensors file: the same slices as from the whole parameters, bit for bit.
namespace multihead::mpi_test {
namespace {

std::vector<Case> make_load_cases() {
  std::vector<Case> cases;
  for (bool packed : {true, false})
    cases.push_back({std::string("load_slices_from_safetensors/") + (packed ? "packed" : "kdim=5,vdim=3,bias_kv"),
                     [packed](Communicator& comm, Report& report) {
                       MultiheadAttentionConfig c;
                       c.embed_dim = 20;
                       c.num_heads = 5;
                       if (!packed) {
                         c.kdim = 5;
                         c.vdim = 3;
                         c.add_bias_kv = true;
                       }
                       MultiheadAttention whole(c, 9);
                       randomise(whole, 40);
                       int64_t pid = ::getpid();  // rank 0's names the file
                       comm.broadcast(&pid, 1, 0);
                       const std::string path = "/tmp/multihead-mpi-load-" + std::to_string(pid) + ".safetensors";
                       // Rank 0 writes; the barrier orders the reads after it.
                       if (comm.rank() == 0) {
                         std::map<std::string, Tensor<float>> sd;
                         for (auto& [n, t] : whole.state_dict()) sd["layer.attn." + n] = t;
                         write_safetensors(path, sd);
                       }
                       comm.barrier();
                       const auto from_file =
                           distributed::HeadParallelMultiheadAttention<float>::load(comm, path, c, "layer.attn");
                       const distributed::HeadParallelMultiheadAttention<float> from_whole(comm, c, whole.parameters());
                       const auto a = from_file.state_dict(), b = from_whole.state_dict();
                       for (const auto& [name, t] : b) {
                         auto it = a.find(name);
                         if (it == a.end()) report.fail(name + ": missing");
                         else expect_close(report, name, it->second, t, 0.0);
                       }
                       comm.barrier();
                       if (comm.rank() == 0) std::remove(path.c_str());
                     }});
  return cases;
}

}  // namespace

MULTIHEAD_MPI_CASES(head_load, make_load_cases);

}  // namespace multihead::mpi_test
