// tests/distributed/mpi_sequence_cases.cpp: ring attention (both row orders)
// and Ulysses against the one-process module, forward and backward, for
// every row of the table (each name says all its parameters), f32 and f64.
#include "mpi_inputs.hpp"
#include "mpi_reference.hpp"
#include "mpi_test.hpp"
#include "multihead/distributed.hpp"
#include "multihead/grouped_query_attention.hpp"
#include "multihead/multihead_attention.hpp"

namespace multihead::mpi_test {
namespace {

using distributed::Communicator;
using distributed::RingOrder;
using distributed::SequenceMode;

// L = S = 9 unless a row says otherwise.
struct SeqRow : ModuleRow {
  SeqRow() { L = S = 9; }
};

// The rows of positions `segments` of a (len, B, w) / (B, len, w) / (len, w) tensor.
template <class T>
Tensor<T> take_rows(const Tensor<T>& t, bool batch_first, const std::vector<distributed::Share>& segments) {
  const bool batched = t.dim() == 3;
  const int64_t w = t.size(-1), B = batched ? t.size(batch_first ? 0 : 1) : 1;
  const int64_t len = t.size(batched && batch_first ? 1 : 0);
  int64_t n = 0;
  for (const auto& s : segments) n += s.count;
  Shape shape = t.shape();
  shape[batched && batch_first ? 1 : 0] = n;
  Tensor<T> out(shape);
  int64_t l2 = 0;
  for (const auto& s : segments)
    for (int64_t l = s.begin; l < s.end(); ++l, ++l2)
      for (int64_t b = 0; b < B; ++b) {
        const int64_t from = batched ? (batch_first ? b * len + l : l * B + b) : l;
        const int64_t to = batched ? (batch_first ? b * n + l2 : l2 * B + b) : l2;
        for (int64_t e = 0; e < w; ++e) out.data()[to * w + e] = t.data()[from * w + e];
      }
  return out;
}

template <class T>
void sequence_case(const SeqRow& row, SequenceMode mode, bool balance, Communicator& comm, Report& report) {
  const Reference<T> ref(row, 5, 300);
  const distributed::SequenceParallelMultiheadAttention<T> sp(comm, ref.config, ref.whole->parameters(), mode,
                                                              balance);
  const auto q_seg = distributed::ring_segments(row.L, comm.size(), comm.rank(), sp.order());
  const auto k_seg = distributed::ring_segments(row.S, comm.size(), comm.rank(), sp.order());
  const Tensor<T> q_r = take_rows(ref.q, row.batch_first, q_seg);
  const Tensor<T> k_r = take_rows(ref.key(), row.batch_first, k_seg);
  const Tensor<T> v_r = take_rows(ref.value(), row.batch_first, k_seg);
  distributed::SequenceParallelContext<T> sctx;
  const ForwardResult<T> got =
      sp.forward(q_r, ref.self ? q_r : k_r, ref.self ? q_r : v_r, row.L, row.S, ref.options, sctx);
  const MultiheadAttentionGradients<T> got_g = sp.backward(sctx, take_rows(ref.d_out, row.batch_first, q_seg));
  const double tol = tolerance<T>();
  expect_close(report, "output", got.output, take_rows(ref.want.output, row.batch_first, q_seg), tol);
  expect_close(report, "d_query", got_g.query, take_rows(ref.want_g.query, row.batch_first, q_seg), tol);
  expect_close(report, "d_key", got_g.key, take_rows(ref.want_g.key, row.batch_first, k_seg), tol);
  expect_close(report, "d_value", got_g.value, take_rows(ref.want_g.value, row.batch_first, k_seg), tol);
  // Every rank holds the whole module's parameter gradients.
  expect_gradients(report, got_g, ref.want_g, [](const std::string&, const Tensor<T>& w) { return w; });
}

// The grouped-query module in sequence parallel (self-attention, batch first).
template <class T>
void gqa_sequence_case(const GqaRow& row, SequenceMode mode, bool balance, Communicator& comm, Report& report) {
  const GqaReference<T> ref(row);
  const distributed::SequenceParallelGroupedQueryAttention<T> sp(comm, ref.config, ref.whole->parameters(), mode,
                                                                 balance);
  const auto seg = distributed::ring_segments(row.L, comm.size(), comm.rank(), sp.order());
  distributed::SequenceParallelGqaContext<T> sctx;
  const Tensor<T> got = sp.forward(take_rows(ref.x, true, seg), row.L, ref.options, sctx);
  const GroupedQueryAttentionGradients<T> got_g = sp.backward(sctx, take_rows(ref.d_out, true, seg));
  const double tol = tolerance<T>();
  expect_close(report, "output", got, take_rows(ref.want, true, seg), tol);
  expect_close(report, "d_x", got_g.x, take_rows(ref.want_g.x, true, seg), tol);
  expect_gradients(report, got_g, ref.want_g, [](const std::string&, const Tensor<T>& w) { return w; });
}

std::vector<SeqRow> rows() {
  std::vector<SeqRow> out;
  const auto add = [&](auto edit) {
    SeqRow r;
    edit(r);
    out.push_back(r);
  };
  add([](SeqRow&) {});
  add([](SeqRow& r) { r.causal = 1; });
  add([](SeqRow& r) { r.causal = 1; r.L = 7; r.S = 11; r.self = false; r.mask = MaskKind::Bool2D; });  // L != S, uneven rows
  add([](SeqRow& r) { r.causal = 2; r.L = 6; r.S = 10; r.self = false; r.padding = 1; });
  add([](SeqRow& r) { r.causal = 2; r.L = 10; r.S = 5; r.self = false; });  // L > S: early queries see no key
  add([](SeqRow& r) { r.mask = MaskKind::Float3D; r.padding = 2; r.batch_first = true; });
  add([](SeqRow& r) { r.mask = MaskKind::Bool3D; r.batched = false; r.L = 5; r.S = 8; r.self = false; });
  add([](SeqRow& r) { r.mask = MaskKind::Float2D; r.kdim = 5; r.vdim = 7; r.self = false; r.bias = false; });
  add([](SeqRow& r) { r.causal = 1; r.window = 3; r.alibi = true; });
  add([](SeqRow& r) { r.window = 2; r.softcap = 5.0; r.padding = 1; });
  add([](SeqRow& r) { r.alibi = true; r.causal = 2; r.L = 5; r.S = 9; r.self = false; });
  // bias_k / bias_v and the zero key: keys without a position after the S keys.
  add([](SeqRow& r) { r.bias_kv = true; r.causal = 1; r.mask = MaskKind::Float3D; r.padding = 1; });
  add([](SeqRow& r) { r.zero_attn = true; r.window = 2; r.alibi = true; r.batch_first = true; });
  add([](SeqRow& r) {
    r.bias_kv = r.zero_attn = true; r.causal = 2; r.L = 7; r.S = 11; r.self = false; r.mask = MaskKind::Bool2D;
    r.kdim = 5; r.vdim = 7;
  });
  return out;
}

std::vector<Case> make_cases() {
  std::vector<Case> cases;
  struct Mode {
    const char* name;
    SequenceMode mode;
    bool balance;
  };
  const Mode modes[] = {{"ring-zigzag", SequenceMode::Ring, true},
                        {"ring-contiguous", SequenceMode::Ring, false},
                        {"ulysses", SequenceMode::Ulysses, false}};
  for (const Mode& m : modes)
    for (const SeqRow& row : rows()) {
      const int max_ranks_heads = m.mode == SequenceMode::Ulysses ? 4 : 1 << 20;  // H = 4: P in {1, 2, 4}
      Case f64{std::string(m.name) + "/f64/" + row.name(), [row, m](Communicator& comm, Report& r) {
                 if (m.mode == SequenceMode::Ulysses && row.H % comm.size() != 0) return;
                 sequence_case<double>(row, m.mode, m.balance, comm, r);
               }};
      Case f32{std::string(m.name) + "/f32/" + row.name(), [row, m](Communicator& comm, Report& r) {
                 if (m.mode == SequenceMode::Ulysses && row.H % comm.size() != 0) return;
                 sequence_case<float>(row, m.mode, m.balance, comm, r);
               }};
      (void)max_ranks_heads;
      cases.push_back(f64);
      cases.push_back(f32);
    }
  for (const Mode& m : modes)
    for (GqaRow row : gqa_rows()) {
      row.L = 9;  // uneven rows on 2 and 4 ranks, zig-zag chunks on 3
      for (int f64 = 1; f64 >= 0; --f64)
        cases.push_back({std::string(m.name) + "/gqa/" + (f64 ? "f64/" : "f32/") + row.name(),
                         [row, m, f64](Communicator& comm, Report& r) {
                           if (m.mode == SequenceMode::Ulysses && row.Hkv % comm.size() != 0) return;
                           if (f64) gqa_sequence_case<double>(row, m.mode, m.balance, comm, r);
                           else gqa_sequence_case<float>(row, m.mode, m.balance, comm, r);
                         }});
    }
  cases.push_back({"ulysses/gqa/ranks_not_dividing_kv_heads", [](Communicator& comm, Report& report) {
                     if (comm.size() < 2) return;
                     GroupedQueryAttentionConfig c;
                     c.num_kv_heads = comm.size() + 1;
                     c.num_heads = 2 * c.num_kv_heads;
                     c.embed_dim = 2 * c.num_heads;
                     const GroupedQueryAttention<float> whole(c, 1);
                     try {
                       distributed::SequenceParallelGroupedQueryAttention<float> sp(comm, c, whole.parameters(),
                                                                                   SequenceMode::Ulysses);
                       report.fail("no error");
                     } catch (const AgreedError& e) {
                       const std::string want = "ranks: expected a divisor of num_kv_heads = " +
                                                std::to_string(c.num_kv_heads) +
                                                " in Ulysses (each rank takes Hkv/P K/V heads with their query "
                                                "heads), got " + std::to_string(comm.size());
                       if (e.what() != want) report.fail(std::string("got '") + e.what() + "'");
                     }
                   }});
  // Ulysses when P does not divide H, and more ranks than query rows: one
  // agreed error naming both numbers.
  cases.push_back({"ulysses/ranks_not_dividing_heads", [](Communicator& comm, Report& report) {
                     if (comm.size() < 2) return;
                     MultiheadAttentionConfig c;
                     c.embed_dim = 2 * (comm.size() + 1);
                     c.num_heads = comm.size() + 1;
                     const MultiheadAttention whole(c, 1);
                     try {
                       distributed::SequenceParallelMultiheadAttention<float> sp(comm, c, whole.parameters(),
                                                                                SequenceMode::Ulysses);
                       report.fail("no error");
                     } catch (const AgreedError& e) {
                       const std::string want = "ranks: expected a divisor of num_heads = " +
                                                std::to_string(comm.size() + 1) +
                                                " in Ulysses (each rank takes H/P heads), got " +
                                                std::to_string(comm.size());
                       if (e.what() != want) report.fail(std::string("got '") + e.what() + "'");
                     }
                   }});
  cases.push_back({"ring/ranks_above_query_rows", [](Communicator& comm, Report& report) {
                     if (comm.size() < 2) return;
                     MultiheadAttentionConfig c;
                     c.embed_dim = 4;
                     c.num_heads = 2;
                     const MultiheadAttention whole(c, 1);
                     distributed::SequenceParallelMultiheadAttention<float> sp(comm, c, whole.parameters(),
                                                                              SequenceMode::Ring);
                     const int64_t L = comm.size() - 1;
                     const int64_t L_r = distributed::ring_rows(L, comm.size(), comm.rank(), sp.order());
                     const Tensor<float> x(Shape{L_r, 1, 4}, 0.5f);
                     try {
                       (void)sp.forward(x, x, x, L, L);
                       report.fail("no error");
                     } catch (const AgreedError& e) {
                       const std::string want = "ranks: expected at most L = " + std::to_string(L) +
                                                " ranks in sequence parallel (each rank needs a query row), got " +
                                                std::to_string(comm.size());
                       if (e.what() != want) report.fail(std::string("got '") + e.what() + "'");
                     }
                   }});
  return cases;
}

}  // namespace

MULTIHEAD_MPI_CASES(sequence, make_cases);

}  // namespace multihead::mpi_test
