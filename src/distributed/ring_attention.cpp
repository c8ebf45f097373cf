// src/distributed/ring_attention.cpp: ring attention (Liu, Zaharia and Abbeel
// 2023), forward and backward, on the library's kernels.
//
// Rank r holds its query rows and its K/V rows (ring_segments). At step t it
// holds the K/V block of rank src = r − t (mod P) and, while the kernel
// computes its queries against that block, already sends the block on to
// r + 1 and receives the next one from r − 1 (non-blocking; double buffer).
// Each (query segment, key segment) pair is one kernel call whose positions
// are the global ones: query i of a segment starting at position a, against
// keys of a segment starting at c, sits at p_i = i + (a − c + shift), where
// shift is the whole call's (causal_query_offset, plus S − L bottom-right),
// so the one causal / window / ALiBi rule (score_rule.hpp) applies unchanged
// with causal_query_offset = a − c + shift, top-left. A pair the causal mask
// (or the window) hides entirely is skipped.
//
// Every kernel call returns its rows' log-sum-exp (the contract's lse), and
// the partial results merge as FlashAttention's online softmax does, one
// block at a time:
//   m = logaddexp(lse, lse_b);  out = out·e^(lse − m) + out_b·e^(lse_b − m);  lse = m
// Fully masked rows are zeros per block (MaskedRowPolicy::Zeros); a row
// masked in every block gets the caller's policy at the end.
//
// The backward (FlashAttention-2's, per block): with the merged out and lse,
// p_ij = exp(s_ij − lse_i) is the whole row's softmax, so each block's
// kernel backward gives that block's share of dQ (summed here) and of dK/dV
// for the block's keys, added to the accumulator that travels with the block
// and reaches its owner after a full turn.
//
// Legend: P ranks, B batch, N = B·H slices, Hkv K/V heads, L / S the whole
// query / key lengths, L_r / S_r this rank's rows, D, Dv head widths.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attention/attention_call.hpp"
#include "kernels/kernel.hpp"
#include "multihead/distributed.hpp"
#include "multihead/error.hpp"

namespace multihead::distributed {

std::vector<Share> ring_segments(int64_t length, int ranks, int rank, RingOrder order) {
  std::vector<Share> out;
  const auto keep = [&](Share s) {
    if (s.count > 0) out.push_back(s);
  };
  if (order == RingOrder::Contiguous) {
    keep(share_of(length, ranks, rank));
  } else {
    keep(share_of(length, 2 * ranks, rank));
    keep(share_of(length, 2 * ranks, 2 * ranks - 1 - rank));
  }
  return out;
}

int64_t ring_rows(int64_t length, int ranks, int rank, RingOrder order) {
  int64_t n = 0;
  for (const Share& s : ring_segments(length, ranks, rank, order)) n += s.count;
  return n;
}

namespace {

using multihead::detail::AttentionArgs;
using multihead::detail::AttentionBackwardArgs;
using multihead::detail::SliceLayout;

// A segment and where its rows start among the rank's rows.
struct Segment {
  Share positions;
  int64_t row = 0;
};
std::vector<Segment> segments_of(int64_t length, int P, int rank, RingOrder order) {
  std::vector<Segment> out;
  int64_t row = 0;
  for (const Share& s : ring_segments(length, P, rank, order)) {
    out.push_back({s, row});
    row += s.count;
  }
  return out;
}

// Whether causal masking or the window hides every key of `k` from every
// query of `q` (global positions: query p = position + shift).
bool hidden(const Share& q, const Share& k, int64_t shift, const AttentionOptions& o) {
  const int64_t p_first = q.begin + shift, p_last = q.end() - 1 + shift;
  const int64_t j_first = k.begin, j_last = k.end() - 1;
  if (o.is_causal && j_first > p_last) return true;
  if (o.window) {
    const int64_t w = *o.window;
    if (o.is_causal) return j_last <= p_first - w;
    return j_first - p_last >= w || p_first - j_last >= w;
  }
  return false;
}

template <class T>
struct Ring {
  const RingAttentionInputs<T>& in;
  const AttentionOptions& options;
  int P, r;
  int64_t N, Nkv, D, Dv, L_r, S_r, shift;
  std::vector<Segment> q_segments;
  AttentionKernel kernel;
  std::vector<T> slopes;

  Ring(Communicator& comm, const RingAttentionInputs<T>& inputs, const AttentionOptions& o)
      : in(inputs), options(o), P(comm.size()), r(comm.rank()) {
    N = in.batch * in.heads;
    const int64_t kvh = in.kv_heads > 0 ? in.kv_heads : in.heads;
    Nkv = in.batch * kvh;
    D = in.head_dim;
    Dv = in.value_dim;
    L_r = ring_rows(in.q_len, P, r, in.order);
    S_r = ring_rows(in.kv_len, P, r, in.order);
    shift = o.causal_query_offset + (o.causal_alignment == CausalAlignment::BottomRight ? in.kv_len - in.q_len : 0);
    q_segments = segments_of(in.q_len, P, r, in.order);
    kernel = multihead::detail::resolve_forward_kernel<T>(o.kernel, false);
    for (double s : o.alibi_slopes) slopes.push_back(static_cast<T>(s));
  }

  int64_t block_values(int src) const {
    const int64_t S_src = ring_rows(in.kv_len, P, src, in.order);
    return Nkv * S_src * (D + Dv);
  }

  // The kernel arguments for query segment qs against key segment ks of
  // block `src` (K then V, [Nkv][S_src][·] each, in `block`). Masks are
  // copied into `mask` and `padding` as the call's [M][Lq][Sk] and [B][Sk].
  // positionless: the extra keys (in.extra_len of them, ks = {{kv_len,
  // extra_len}, 0}): no mask column, no causal or window or ALiBi position,
  // as the one-process module pads its masks with zeros for them.
  AttentionArgs<T> args(const Segment& qs, const Segment& ks, int64_t S_src, const T* block, std::vector<T>& mask,
                        std::vector<T>& padding, bool positionless = false) const {
    const int64_t Lq = qs.positions.count, Sk = ks.positions.count;
    multihead::detail::AttentionShape shape;
    shape.slices = N;
    shape.heads = in.heads;
    shape.q_len = Lq;
    shape.kv_len = Sk;
    shape.head_dim = D;
    shape.value_dim = Dv;
    shape.causal_cols = positionless ? 0 : Sk;
    multihead::detail::AttentionTensors<T> t;
    t.q = in.q + qs.row * D;
    t.q_layout = SliceLayout{in.heads * L_r * D, L_r * D, D};
    const T* k = block;
    const T* v = block + Nkv * S_src * D;
    const int64_t kvh = Nkv / in.batch;
    t.k = k + ks.row * D;
    t.k_layout = SliceLayout{kvh * S_src * D, S_src * D, D};
    t.v = v + ks.row * Dv;
    t.v_layout = SliceLayout{kvh * S_src * Dv, S_src * Dv, Dv};
    if (in.attn_mask && !positionless) {
      const int64_t M = in.attn_mask_slices;
      mask.resize(static_cast<std::size_t>(M * Lq * Sk));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t i = 0; i < Lq; ++i) {
          const T* src = in.attn_mask + (m * L_r + qs.row + i) * in.kv_len + ks.positions.begin;
          std::copy(src, src + Sk, mask.data() + (m * Lq + i) * Sk);
        }
      t.attn_mask = mask.data();
      t.attn_mask_slice_stride = M == 1 ? 0 : Lq * Sk;
    }
    if (in.key_padding && !positionless) {
      padding.resize(static_cast<std::size_t>(in.batch * Sk));
      for (int64_t b = 0; b < in.batch; ++b)
        std::copy(in.key_padding + b * in.kv_len + ks.positions.begin,
                  in.key_padding + b * in.kv_len + ks.positions.end(), padding.data() + b * Sk);
      t.key_padding = padding.data();
    }
    t.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
    AttentionOptions o = options;
    o.causal_alignment = CausalAlignment::TopLeft;
    o.causal_query_offset = qs.positions.begin - ks.positions.begin + shift;
    o.masked_rows = MaskedRowPolicy::Zeros;
    AttentionArgs<T> a = multihead::detail::make_attention_args(shape, t, o);
    a.kv_heads = kvh == in.heads ? 0 : kvh;
    return a;
  }
};

template <class T>
void validate(Communicator& comm, const RingAttentionInputs<T>& in, const AttentionOptions& o) {
  comm.agree([&] {
    multihead::detail::validate_attention_options(o);
    const auto fail = [](const std::string& m) { throw Error(Error::Kind::Value, m); };
    if (o.dropout_p != 0) fail("dropout_p: expected 0 in ring attention, got " + std::to_string(o.dropout_p));
    if (in.batch < 1 || in.heads < 1 || in.head_dim < 1 || in.value_dim < 1 || in.kv_len < 1)
      fail("ring attention: expected batch, heads, head_dim, value_dim and kv_len >= 1");
    if (in.kv_heads < 0 || (in.kv_heads > 0 && in.heads % in.kv_heads != 0))
      fail("kv_heads: expected 0 or a divisor of heads " + std::to_string(in.heads) + ", got " +
           std::to_string(in.kv_heads));
    if (comm.size() > in.q_len)
      fail("ranks: expected at most L = " + std::to_string(in.q_len) +
           " ranks in ring attention (each rank needs a query row), got " + std::to_string(comm.size()));
    if (!o.alibi_slopes.empty() && static_cast<int64_t>(o.alibi_slopes.size()) != in.batch * in.heads)
      fail("alibi_slopes: expected N = " + std::to_string(in.batch * in.heads) + " slopes, got " +
           std::to_string(o.alibi_slopes.size()));
    if (in.attn_mask && in.attn_mask_slices != 1 && in.attn_mask_slices != in.batch * in.heads)
      fail("attn_mask: expected 1 or N = " + std::to_string(in.batch * in.heads) + " slices, got " +
           std::to_string(in.attn_mask_slices));
    if (in.extra_len < 0 || (in.extra_len > 0 && (!in.extra_k || !in.extra_v)))
      fail("extra_len: expected 0, or extra_k and extra_v with extra_len >= 1 keys, got " +
           std::to_string(in.extra_len));
    if (o.kernel == AttentionKernel::Flash && sizeof(T) != 4)
      fail("kernel: the flash kernel runs float32 only, got float64");
  });
}

// The rank's own K/V, packed as one message: K [Nkv][S_r][D], then V.
template <class T>
std::vector<T> own_block(const Ring<T>& ring, std::size_t capacity) {
  std::vector<T> b(capacity);
  const int64_t nk = ring.Nkv * ring.S_r * ring.D, nv = ring.Nkv * ring.S_r * ring.Dv;
  std::copy(ring.in.k, ring.in.k + nk, b.data());
  std::copy(ring.in.v, ring.in.v + nv, b.data() + nk);
  return b;
}

template <class T>
std::size_t largest_block(const Ring<T>& ring) {
  int64_t m = 0;
  for (int j = 0; j < ring.P; ++j) m = std::max(m, ring.block_values(j));
  return static_cast<std::size_t>(m);
}

// The extra keys packed as a block (K [Nkv][extra][D], then V), and their segment.
template <class T>
std::vector<T> extra_block(const Ring<T>& ring) {
  const int64_t nk = ring.Nkv * ring.in.extra_len * ring.D, nv = ring.Nkv * ring.in.extra_len * ring.Dv;
  std::vector<T> b(static_cast<std::size_t>(nk + nv));
  std::copy(ring.in.extra_k, ring.in.extra_k + nk, b.data());
  std::copy(ring.in.extra_v, ring.in.extra_v + nv, b.data() + nk);
  return b;
}
template <class T>
Segment extra_segment(const Ring<T>& ring) {
  return {{ring.in.kv_len, ring.in.extra_len}, 0};
}

// Merges a block's rows (block_out [N][Lq][Dv], block_lse [N][Lq]) into the
// running out / lse rows of query segment qs, by log-sum-exp.
template <class T>
void merge_block(const Ring<T>& ring, const Segment& qs, const std::vector<T>& block_out,
                 const std::vector<T>& block_lse, T* out, T* lse) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const int64_t Lq = qs.positions.count, Dv = ring.Dv, L_r = ring.L_r;
  for (int64_t n = 0; n < ring.N; ++n)
    for (int64_t i = 0; i < Lq; ++i) {
      const T lb = block_lse[static_cast<std::size_t>(n * Lq + i)];
      if (lb == kNegInf) continue;
      T& l = lse[n * L_r + qs.row + i];
      T* o = out + (n * L_r + qs.row + i) * Dv;
      const T* ob = block_out.data() + (n * Lq + i) * Dv;
      if (l == kNegInf) {
        std::copy(ob, ob + Dv, o);
        l = lb;
        continue;
      }
      const T m = std::max(l, lb);
      const T merged = m + std::log1p(std::exp(std::min(l, lb) - m));
      const T a_old = std::exp(l - merged), a_new = std::exp(lb - merged);
      for (int64_t d = 0; d < Dv; ++d) o[d] = o[d] * a_old + ob[d] * a_new;
      l = merged;
    }
}

constexpr int kTagKV = 11, kTagGrad = 12;

}  // namespace

template <class T>
void ring_attention_forward(Communicator& comm, const RingAttentionInputs<T>& in, const AttentionOptions& options,
                            T* out, T* lse) {
  validate(comm, in, options);
  const Ring<T> ring(comm, in, options);
  const int P = ring.P, r = ring.r;
  const int64_t N = ring.N, L_r = ring.L_r, Dv = ring.Dv;
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  std::fill(out, out + N * L_r * Dv, T(0));
  std::fill(lse, lse + N * L_r, kNegInf);
  const std::size_t capacity = largest_block(ring);
  std::vector<T> cur = own_block(ring, capacity), next(capacity);
  std::vector<T> mask, padding, block_out, block_lse;
  // One kernel call for query segment qs, merged into out / lse.
  const auto block = [&](const Segment& qs, AttentionArgs<T> a) {
    const int64_t Lq = qs.positions.count;
    block_out.assign(static_cast<std::size_t>(N * Lq * Dv), T(0));
    block_lse.assign(static_cast<std::size_t>(N * Lq), kNegInf);
    a.out = block_out.data();
    a.out_layout = {};
    a.lse = block_lse.data();
    multihead::detail::run_attention_forward(a, ring.kernel);
    merge_block(ring, qs, block_out, block_lse, out, lse);
  };
  for (int t = 0; t < P; ++t) {
    const int src = (r - t + P) % P;
    Request send, recv;
    if (t + 1 < P) {  // the next block is on its way while this one is computed
      recv = comm.irecv(next.data(), ring.block_values((src - 1 + P) % P), (r - 1 + P) % P, kTagKV);
      send = comm.isend(cur.data(), ring.block_values(src), (r + 1) % P, kTagKV);
    }
    const int64_t S_src = ring_rows(in.kv_len, P, src, in.order);
    for (const Segment& ks : segments_of(in.kv_len, P, src, in.order))
      for (const Segment& qs : ring.q_segments) {
        if (hidden(qs.positions, ks.positions, ring.shift, options)) continue;
        block(qs, ring.args(qs, ks, S_src, cur.data(), mask, padding));
      }
    comm.wait(recv);
    comm.wait(send);
    std::swap(cur, next);
  }
  // The extra keys every rank holds: one more block, never sent.
  if (in.extra_len > 0) {
    const std::vector<T> extra = extra_block(ring);
    for (const Segment& qs : ring.q_segments)
      block(qs, ring.args(qs, extra_segment(ring), in.extra_len, extra.data(), mask, padding, true));
  }
  if (options.masked_rows == MaskedRowPolicy::NaN)
    for (int64_t x = 0; x < N * L_r; ++x)
      if (lse[x] == kNegInf) std::fill(out + x * Dv, out + (x + 1) * Dv, std::numeric_limits<T>::quiet_NaN());
}

template <class T>
void ring_attention_backward(Communicator& comm, const RingAttentionInputs<T>& in, const AttentionOptions& options,
                             const T* out, const T* lse, const T* d_out, T* d_q, T* d_k, T* d_v, T* d_extra_k,
                             T* d_extra_v) {
  validate(comm, in, options);
  const Ring<T> ring(comm, in, options);
  const int P = ring.P, r = ring.r;
  const int64_t N = ring.N, Nkv = ring.Nkv, L_r = ring.L_r, D = ring.D, Dv = ring.Dv;
  std::fill(d_q, d_q + N * L_r * D, T(0));
  const std::size_t capacity = largest_block(ring);
  std::vector<T> cur = own_block(ring, capacity), next(capacity);
  // dK then dV of the block at hand, [Nkv][S_src][D] and [Nkv][S_src][Dv].
  std::vector<T> acc(capacity, T(0)), acc_next(capacity);
  std::vector<T> mask, padding, seg_lse, tmp_dq(static_cast<std::size_t>(N * L_r * D)), tmp_dkv(capacity);
  // One block's backward for query segment qs: its share of dQ into d_q,
  // of the block's dK then dV ([Nkv][S_src][·]) into `into`.
  const auto block = [&](const Segment& qs, const Segment& ks, int64_t S_src, AttentionArgs<T> forward, T* into) {
    const int64_t Lq = qs.positions.count, Sk = ks.positions.count, nk = Nkv * S_src * D;
    if (tmp_dkv.size() < static_cast<std::size_t>(nk + Nkv * S_src * Dv))
      tmp_dkv.resize(static_cast<std::size_t>(nk + Nkv * S_src * Dv));
    AttentionBackwardArgs<T> b;
    b.forward = forward;
    b.forward.masked_rows = options.masked_rows;
    b.forward.out = const_cast<T*>(out) + qs.row * Dv;
    b.forward.out_layout = SliceLayout{in.heads * L_r * Dv, L_r * Dv, Dv};
    seg_lse.resize(static_cast<std::size_t>(N * Lq));
    for (int64_t n = 0; n < N; ++n)
      std::copy(lse + n * L_r + qs.row, lse + n * L_r + qs.row + Lq, seg_lse.data() + n * Lq);
    b.lse = seg_lse.data();
    b.d_out = d_out + qs.row * Dv;
    b.d_q = tmp_dq.data() + qs.row * D;
    b.d_k = tmp_dkv.data() + ks.row * D;
    b.d_v = tmp_dkv.data() + nk + ks.row * Dv;
    multihead::detail::run_attention_backward(b, ring.kernel);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t x = (n * L_r + qs.row) * D; x < (n * L_r + qs.row + Lq) * D; ++x) d_q[x] += tmp_dq[x];
    for (int64_t g = 0; g < Nkv; ++g) {
      for (int64_t x = (g * S_src + ks.row) * D; x < (g * S_src + ks.row + Sk) * D; ++x) into[x] += tmp_dkv[x];
      for (int64_t x = nk + (g * S_src + ks.row) * Dv; x < nk + (g * S_src + ks.row + Sk) * Dv; ++x)
        into[x] += tmp_dkv[x];
    }
  };
  // At step t, acc holds what ranks r − t … r − 1 added to block src's dK/dV.
  for (int t = 0; t < P; ++t) {
    const int src = (r - t + P) % P;
    const int64_t S_src = ring_rows(in.kv_len, P, src, in.order);
    Request send, recv;
    if (t + 1 < P) {
      recv = comm.irecv(next.data(), ring.block_values((src - 1 + P) % P), (r - 1 + P) % P, kTagKV);
      send = comm.isend(cur.data(), ring.block_values(src), (r + 1) % P, kTagKV);
    }
    for (const Segment& ks : segments_of(in.kv_len, P, src, in.order))
      for (const Segment& qs : ring.q_segments) {
        if (hidden(qs.positions, ks.positions, ring.shift, options)) continue;
        block(qs, ks, S_src, ring.args(qs, ks, S_src, cur.data(), mask, padding), acc.data());
      }
    comm.wait(recv);
    comm.wait(send);
    // The accumulator follows its block; after the last step it goes home.
    if (P > 1) {
      const int from = (r - 1 + P) % P;
      const int64_t arriving = t + 1 < P ? ring.block_values((src - 1 + P) % P) : ring.block_values(r);
      Request ar = comm.irecv(acc_next.data(), arriving, from, kTagGrad);
      Request as = comm.isend(acc.data(), ring.block_values(src), (r + 1) % P, kTagGrad);
      comm.wait(ar);
      comm.wait(as);
      std::swap(acc, acc_next);
    }
    std::swap(cur, next);
  }
  // acc now holds this rank's own block's dK, dV.
  const int64_t nk = Nkv * ring.S_r * D, nv = Nkv * ring.S_r * Dv;
  std::copy(acc.data(), acc.data() + nk, d_k);
  std::copy(acc.data() + nk, acc.data() + nk + nv, d_v);
  // The extra keys: this rank's queries' share of their gradients.
  if (in.extra_len > 0) {
    const std::vector<T> extra = extra_block(ring);
    std::vector<T> d_extra(extra.size(), T(0));
    const Segment es = extra_segment(ring);
    for (const Segment& qs : ring.q_segments)
      block(qs, es, in.extra_len, ring.args(qs, es, in.extra_len, extra.data(), mask, padding, true), d_extra.data());
    const int64_t ek = Nkv * in.extra_len * D;
    if (d_extra_k) std::copy(d_extra.data(), d_extra.data() + ek, d_extra_k);
    if (d_extra_v) std::copy(d_extra.data() + ek, d_extra.data() + d_extra.size(), d_extra_v);
  }
}

template void ring_attention_forward<float>(Communicator&, const RingAttentionInputs<float>&,
                                            const AttentionOptions&, float*, float*);
template void ring_attention_forward<double>(Communicator&, const RingAttentionInputs<double>&,
                                             const AttentionOptions&, double*, double*);
template void ring_attention_backward<float>(Communicator&, const RingAttentionInputs<float>&,
                                             const AttentionOptions&, const float*, const float*, const float*,
                                             float*, float*, float*, float*, float*);
template void ring_attention_backward<double>(Communicator&, const RingAttentionInputs<double>&,
                                              const AttentionOptions&, const double*, const double*, const double*,
                                              double*, double*, double*, double*, double*);

}  // namespace multihead::distributed
