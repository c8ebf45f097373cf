// tests/distributed/mpi_sequence_cases.cpp: ring attention (both row orders)
// and Ulysses against the one-process module, forward and backward, for
// every row of the table (each name says all its parameters), f32 and f64.
#include "mpi_inputs.hpp"
#include "mpi_test.hpp"
#include "multihead/distributed.hpp"
#include "multihead/multihead_attention.hpp"

namespace multihead::mpi_test {
namespace {

using distributed::Communicator;
using distributed::RingOrder;
using distributed::SequenceMode;

struct SeqRow {
  int64_t E = 12, H = 4, kdim = 0, vdim = 0;
  bool bias = true, batch_first = false, batched = true;
  int64_t B = 2, L = 9, S = 9;
  MaskKind mask = MaskKind::None;
  int padding = 0;
  int causal = 0;  // 0 off, 1 top-left, 2 bottom-right
  std::optional<int64_t> window;
  std::optional<double> softcap;
  bool alibi = false, self = true;
  MaskedRowPolicy masked = MaskedRowPolicy::Zeros;
  std::string name() const {
    std::string s = "E=" + std::to_string(E) + ",H=" + std::to_string(H);
    if (kdim) s += ",kdim=" + std::to_string(kdim) + ",vdim=" + std::to_string(vdim);
    s += std::string(",bias=") + (bias ? "1" : "0");
    if (batch_first) s += ",batch_first";
    if (!batched) s += ",unbatched";
    s += ",B=" + std::to_string(B) + ",L=" + std::to_string(L) + ",S=" + std::to_string(S);
    s += std::string(",mask=") + mask_name(mask);
    if (padding) s += padding == 1 ? ",kpm=bool" : ",kpm=float";
    if (causal) s += causal == 1 ? ",causal=top-left" : ",causal=bottom-right";
    if (window) s += ",window=" + std::to_string(*window);
    if (softcap) s += ",softcap";
    if (alibi) s += ",alibi";
    if (masked == MaskedRowPolicy::NaN) s += ",masked_rows=nan";
    return s + (self ? ",self" : ",cross");
  }
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
  MultiheadAttentionConfig c;
  c.embed_dim = row.E;
  c.num_heads = row.H;
  c.kdim = row.kdim;
  c.vdim = row.vdim;
  c.bias = row.bias;
  c.batch_first = row.batch_first;
  BasicMultiheadAttention<T> whole(c, 5);
  {
    auto sd = whole.state_dict();
    uint64_t seed = 300;
    for (auto& [name, t] : sd) t = random_tensor<T>(t.shape(), seed++, 0.3);
    whole.load_state_dict(sd);
  }
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
  o.need_weights = false;
  o.attention.is_causal = row.causal != 0;
  o.attention.causal_alignment = row.causal == 2 ? CausalAlignment::BottomRight : CausalAlignment::TopLeft;
  o.attention.window = row.window;
  o.attention.softcap = row.softcap;
  o.attention.masked_rows = row.masked;
  o.alibi = row.alibi;
  o.attention.num_threads = 1;
  ForwardContext<T> ctx;
  const ForwardResult<T> want = whole.forward(q, key, value, o, ctx);
  const Tensor<T> d_out = random_tensor<T>(want.output.shape(), 6);
  const MultiheadAttentionGradients<T> want_g = whole.backward(ctx, d_out);

  const distributed::SequenceParallelMultiheadAttention<T> sp(comm, c, whole.parameters(), mode, balance);
  const auto q_seg = distributed::ring_segments(row.L, comm.size(), comm.rank(), sp.order());
  const auto k_seg = distributed::ring_segments(row.S, comm.size(), comm.rank(), sp.order());
  const Tensor<T> q_r = take_rows(q, row.batch_first, q_seg);
  const Tensor<T> k_r = take_rows(key, row.batch_first, k_seg);
  const Tensor<T> v_r = take_rows(value, row.batch_first, k_seg);
  distributed::SequenceParallelContext<T> sctx;
  const ForwardResult<T> got = sp.forward(q_r, self ? q_r : k_r, self ? q_r : v_r, row.L, row.S, o, sctx);
  const MultiheadAttentionGradients<T> got_g = sp.backward(sctx, take_rows(d_out, row.batch_first, q_seg));
  const double tol = tolerance<T>();
  expect_close(report, "output", got.output, take_rows(want.output, row.batch_first, q_seg), tol);
  expect_close(report, "d_query", got_g.query, take_rows(want_g.query, row.batch_first, q_seg), tol);
  expect_close(report, "d_key", got_g.key, take_rows(want_g.key, row.batch_first, k_seg), tol);
  expect_close(report, "d_value", got_g.value, take_rows(want_g.value, row.batch_first, k_seg), tol);
  for (const auto& [name, t] : want_g.parameters) {
    auto it = got_g.parameters.find(name);
    if (it == got_g.parameters.end()) report.fail("d " + name + ": missing");
    else expect_close(report, "d " + name, it->second, t, tol);
  }
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
