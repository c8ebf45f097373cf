// tests/distributed/mpi_head_cases.cpp: head parallel against the one-process
// module, forward and backward, for every row of the tables below (each
// name says all its parameters), in float32 and float64.
#include <unistd.h>

#include <cstdio>
#include <map>

#include "mpi_inputs.hpp"
#include "mpi_reference.hpp"
#include "mpi_test.hpp"
#include "multihead/distributed.hpp"
#include "multihead/grouped_query_attention.hpp"
#include "multihead/io.hpp"
#include "multihead/multihead_attention.hpp"

namespace multihead::mpi_test {
namespace {

using distributed::Communicator;

using MhaRow = ModuleRow;

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
  const Reference<T> ref(row, 11, 100);
  const MultiheadAttentionConfig& c = ref.config;
  const distributed::HeadParallelMultiheadAttention<T> hp(comm, c, ref.whole->parameters());
  distributed::HeadParallelContext<T> hctx;
  const ForwardResult<T> got = hp.forward(ref.q, ref.key(), ref.value(), ref.options, hctx);
  const MultiheadAttentionGradients<T> got_g = hp.backward(hctx, ref.d_out);

  const double tol = tolerance<T>();
  expect_close(report, "output", got.output, ref.want.output, tol);
  if (row.need_weights) {
    if (!got.attn_weights) report.fail("attn_weights: missing");
    else expect_close(report, "attn_weights", *got.attn_weights, *ref.want.attn_weights, tol);
  }
  expect_close(report, "d_query", got_g.query, ref.want_g.query, tol);
  expect_close(report, "d_key", got_g.key, ref.want_g.key, tol);
  expect_close(report, "d_value", got_g.value, ref.want_g.value, tol);
  // Each rank's parameter gradients are its slices of the whole module's.
  const int64_t E = row.E, D = c.head_dim(), r0 = hp.heads().begin * D, n = hp.heads().count * D;
  expect_gradients(report, got_g, ref.want_g, [&](const std::string& name, const Tensor<T>& w) {
    if (name == "in_proj_weight") return rows_of(w, E, {{r0, n}, {E + r0, n}, {2 * E + r0, n}}, {3 * n, E});
    if (name == "q_proj_weight") return rows_of(w, E, {{r0, n}}, {n, E});
    if (name == "k_proj_weight") return rows_of(w, c.key_dim(), {{r0, n}}, {n, c.key_dim()});
    if (name == "v_proj_weight") return rows_of(w, c.value_dim(), {{r0, n}}, {n, c.value_dim()});
    if (name == "out_proj.weight") return cols_of(w, r0, n);
    if (name == "in_proj_bias") return rows_of(w, 1, {{r0, n}, {E + r0, n}, {2 * E + r0, n}}, {3 * n});
    if (name == "bias_k" || name == "bias_v") return rows_of(w, 1, {{r0, n}}, {1, 1, n});
    return w;  // out_proj.bias: whole on every rank
  });
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

template <class T>
void gqa_case(const GqaRow& row, Communicator& comm, Report& report) {
  const GqaReference<T> ref(row);
  const GroupedQueryAttentionConfig& c = ref.config;
  const Tensor<T>& x = ref.x;
  const AttentionOptions& o = ref.options;
  const Tensor<T>& want = ref.want;
  const Tensor<T>& d_out = ref.d_out;
  const auto& want_g = ref.want_g;
  const distributed::HeadParallelGroupedQueryAttention<T> hp(comm, c, ref.whole->parameters());
  GroupedQueryForwardContext<T> hctx;
  const Tensor<T> got = hp.forward(x, o, hctx);
  const auto got_g = hp.backward(hctx, d_out);
  const double tol = tolerance<T>();
  expect_close(report, "output", got, want, tol);
  expect_close(report, "d_x", got_g.x, want_g.x, tol);
  const int64_t D = c.resolved_head_dim(), E = row.E;
  const int64_t q0 = hp.heads().begin * D, nq = hp.heads().count * D;
  const int64_t k0 = hp.groups().begin * D, nk = hp.groups().count * D;
  // Each rank's parameter gradients are its slices of the whole module's.
  expect_gradients(report, got_g, want_g, [&](const std::string& name, const Tensor<T>& w) {
    if (name == "q_proj.weight") return rows_of(w, E, {{q0, nq}}, {nq, E});
    if (name == "k_proj.weight" || name == "v_proj.weight") return rows_of(w, E, {{k0, nk}}, {nk, E});
    if (name == "o_proj.weight") return cols_of(w, q0, nq);
    if (name == "q_proj.bias") return rows_of(w, 1, {{q0, nq}}, {nq});
    if (name == "k_proj.bias" || name == "v_proj.bias") return rows_of(w, 1, {{k0, nk}}, {nk});
    return w;  // o_proj.bias: whole on every rank
  });
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
  // check_finite names a parameter at the whole tensor's index, whichever
  // rank holds the slice (the local module named its slice's index): an
  // Inf in the last row of each projection (the last rank's, for any P up
  // to Hkv) and in o_proj.weight's last column; a NaN in x.
  cases.push_back({"gqa/check_finite_names_the_whole_index", [](Communicator& comm, Report& report) {
                     GroupedQueryAttentionConfig c;
                     c.embed_dim = 16;
                     c.num_heads = 8;
                     c.num_kv_heads = 4;
                     c.bias = true;
                     const GroupedQueryAttention<float> whole(c, 3);
                     Tensor<float> x(Shape{2, 5, 16}, 0.5f);
                     AttentionOptions o;
                     o.check_finite = true;
                     const auto expect = [&](const std::string& what, const GroupedQueryAttentionParameters<float>& p,
                                             const Tensor<float>& input, const std::string& want) {
                       const distributed::HeadParallelGroupedQueryAttention<float> hp(comm, c, p);
                       try {
                         (void)hp.forward(input, o);
                         report.fail(what + ": no error");
                       } catch (const AgreedError& e) {
                         const std::string full = want + " (check_finite rejects NaN and Inf)";
                         if (e.what() != full) report.fail(what + ": got '" + e.what() + "', expected '" + full + "'");
                       }
                     };
                     const std::pair<const char*, Tensor<float> GroupedQueryAttentionParameters<float>::*> rows[] = {
                         {"q_proj.weight", &GroupedQueryAttentionParameters<float>::q_proj_weight},
                         {"k_proj.weight", &GroupedQueryAttentionParameters<float>::k_proj_weight},
                         {"v_proj.weight", &GroupedQueryAttentionParameters<float>::v_proj_weight},
                         {"v_proj.bias", &GroupedQueryAttentionParameters<float>::v_proj_bias}};
                     for (const auto& [name, member] : rows) {
                       GroupedQueryAttentionParameters<float> p = whole.parameters();
                       Tensor<float>& t = p.*member;
                       const int64_t last = t.shape()[0] - 1;
                       t[t.numel() - 1 - (t.shape().size() == 2 ? 12 : 0)] = INFINITY;  // (last, 3) or (last)
                       expect(name, p, x,
                              std::string(name) + ": non-finite value inf at index (" + std::to_string(last) +
                                  (t.shape().size() == 2 ? ", 3)" : ")"));
                     }
                     GroupedQueryAttentionParameters<float> p = whole.parameters();
                     p.o_proj_weight[2 * 16 + 15] = -INFINITY;  // (2, 15): the last query head's column
                     expect("o_proj.weight", p, x, "o_proj.weight: non-finite value -inf at index (2, 15)");
                     Tensor<float> xn = x;
                     xn[1 * 5 * 16 + 4 * 16 + 7] = NAN;
                     expect("x", whole.parameters(), xn, "x: non-finite value nan at index (1, 4, 7)");
                   }, 2});
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
                         write_safetensors(path, sd, config_metadata(c));
                       }
                       comm.barrier();
                       const auto from_file =
                           distributed::HeadParallelMultiheadAttention<float>::load(comm, path, c, "layer.attn");
                       // The configuration from the header too (what `forward --parallel heads` does).
                       LoadedWeights header;
                       const auto from_header = distributed::HeadParallelMultiheadAttention<float>::load(
                           comm, path, LoadOptions{"layer.attn", {}}, &header);
                       if (header.config.embed_dim != c.embed_dim || header.config.num_heads != c.num_heads ||
                           header.config.key_dim() != c.key_dim() || header.config.value_dim() != c.value_dim() ||
                           header.config.add_bias_kv != c.add_bias_kv || header.config.bias != c.bias)
                         report.fail("load(LoadOptions): the header's configuration differs from the module's");
                       const distributed::HeadParallelMultiheadAttention<float> from_whole(comm, c, whole.parameters());
                       const auto a = from_file.state_dict(), h = from_header.state_dict(), b = from_whole.state_dict();
                       // The counted read: the rank's slices (bias_k / bias_v are read whole, E values
                       // each, and sliced), never the rest of the file.
                       uint64_t slices = 0, all = 0;
                       for (const auto& [name, t] : b) {
                         slices += static_cast<uint64_t>(t.numel());
                         auto it = a.find(name);
                         if (it == a.end()) report.fail(name + ": missing");
                         else expect_close(report, name, it->second, t, 0.0);
                         auto ih = h.find(name);
                         if (ih == h.end()) report.fail(name + ": missing (load(LoadOptions))");
                         else expect_close(report, name + " (load(LoadOptions))", ih->second, t, 0.0);
                       }
                       for (const auto& [name, t] : whole.state_dict()) all += static_cast<uint64_t>(t.numel());
                       const int64_t n = from_whole.heads().count * c.head_dim();
                       const uint64_t want = slices + (c.add_bias_kv ? 2 * static_cast<uint64_t>(c.embed_dim - n) : 0);
                       for (const auto* m : {&from_file, &from_header})
                         if (m->values_read() != want)
                           report.fail("values_read: expected " + std::to_string(want) + " (this rank's slices of " +
                                       std::to_string(all) + "), got " + std::to_string(m->values_read()));
                       if (from_whole.values_read() != 0) report.fail("values_read: expected 0 when built from parameters");
                       comm.barrier();
                       if (comm.rank() == 0) std::remove(path.c_str());
                     }});
  return cases;
}

}  // namespace

MULTIHEAD_MPI_CASES(head_load, make_load_cases);

}  // namespace multihead::mpi_test
