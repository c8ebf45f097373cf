// src/distributed/sequence_layout.hpp: the sequence modes' layouts (ring and
// Ulysses, MultiheadAttention and GroupedQueryAttention): tokens of a rank's
// rows, split into heads and merged back, and Ulysses' all-to-alls between a
// split by rows and a split by heads.
//
// Legend: P ranks, B batch, H heads (or K/V heads), w head width, n rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "attention/attention_call.hpp"
#include "kernels/kernel.hpp"
#include "multihead/distributed.hpp"

namespace multihead::distributed::detail {

// Where token (b, l) of a (len, B, ·) / (B, len, ·) / (len, ·) tensor is.
struct Rows {
  bool batch_first = false;
  int64_t B = 1, len = 0;
  int64_t row(int64_t b, int64_t l) const { return batch_first ? b * len + l : l * B + b; }
};

// split_heads: X (rows × H·w, token layout) -> [B·H][len][w].
template <class T>
std::vector<T> split_heads(const T* x, const Rows& rows, int64_t H, int64_t w) {
  std::vector<T> out(static_cast<std::size_t>(rows.B * H * rows.len * w));
  for (int64_t b = 0; b < rows.B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < rows.len; ++l) {
        const T* src = x + rows.row(b, l) * H * w + h * w;
        std::copy(src, src + w, out.data() + ((b * H + h) * rows.len + l) * w);
      }
  return out;
}

// merge_heads: [B·H][len][w] -> (rows × H·w) in the token layout.
template <class T>
void merge_heads(const T* heads, const Rows& rows, int64_t H, int64_t w, T* x) {
  for (int64_t b = 0; b < rows.B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < rows.len; ++l) {
        const T* src = heads + ((b * H + h) * rows.len + l) * w;
        std::copy(src, src + w, x + rows.row(b, l) * H * w + h * w);
      }
}

// Ulysses' all-to-all, rows -> heads: [B·H][n_r][w], the rank's contiguous
// rows of every head, to [B·Hp][n][w], every row of heads [r·Hp, (r+1)·Hp).
// Blocks are padded to ⌈n/P⌉ rows, as MPI_Alltoall wants equal blocks.
template <class T>
std::vector<T> rows_to_heads(Communicator& comm, const std::vector<T>& local, int64_t B, int64_t H, int64_t n,
                             int64_t w) {
  const int P = comm.size(), r = comm.rank();
  const int64_t Hp = H / P, pad = (n + P - 1) / P, mine = share_of(n, P, r).count;
  const int64_t block = B * Hp * pad * w;
  std::vector<T> send(static_cast<std::size_t>(block * P), T(0)), recv(send.size());
  for (int j = 0; j < P; ++j)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hp; ++h)
        std::copy(local.data() + ((b * H + j * Hp + h) * mine) * w, local.data() + ((b * H + j * Hp + h) * mine + mine) * w,
                  send.data() + j * block + ((b * Hp + h) * pad) * w);
  comm.all_to_all(send.data(), recv.data(), block);
  std::vector<T> out(static_cast<std::size_t>(B * Hp * n * w));
  for (int j = 0; j < P; ++j) {
    const Share s = share_of(n, P, j);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hp; ++h)
        std::copy(recv.data() + j * block + ((b * Hp + h) * pad) * w,
                  recv.data() + j * block + ((b * Hp + h) * pad + s.count) * w,
                  out.data() + ((b * Hp + h) * n + s.begin) * w);
  }
  return out;
}

// The inverse: [B·Hp][n][w] of the rank's heads -> [B·H][n_r][w] of its rows.
template <class T>
std::vector<T> heads_to_rows(Communicator& comm, const T* heads, int64_t B, int64_t H, int64_t n, int64_t w) {
  const int P = comm.size(), r = comm.rank();
  const int64_t Hp = H / P, pad = (n + P - 1) / P, mine = share_of(n, P, r).count;
  const int64_t block = B * Hp * pad * w;
  std::vector<T> send(static_cast<std::size_t>(block * P), T(0)), recv(send.size());
  for (int j = 0; j < P; ++j) {
    const Share s = share_of(n, P, j);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hp; ++h)
        std::copy(heads + ((b * Hp + h) * n + s.begin) * w, heads + ((b * Hp + h) * n + s.end()) * w,
                  send.data() + j * block + ((b * Hp + h) * pad) * w);
  }
  comm.all_to_all(send.data(), recv.data(), block);
  std::vector<T> out(static_cast<std::size_t>(B * H * mine * w));
  for (int j = 0; j < P; ++j)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hp; ++h)
        std::copy(recv.data() + j * block + ((b * Hp + h) * pad) * w,
                  recv.data() + j * block + ((b * Hp + h) * pad + mine) * w,
                  out.data() + ((b * H + j * Hp + h) * mine) * w);
  return out;
}

// The ring's inputs for the heads q [B·H][L_r][D] and k, v [B·Hkv][S_r][D]
// (Hkv = H: multi-head), no masks or extra keys (the caller adds its own).
template <class T>
RingAttentionInputs<T> ring_heads(int64_t B, int64_t H, int64_t Hkv, int64_t L, int64_t S, int64_t D,
                                  RingOrder order, const std::vector<T>& q, const std::vector<T>& k,
                                  const std::vector<T>& v) {
  RingAttentionInputs<T> in;
  in.batch = B;
  in.heads = H;
  in.kv_heads = Hkv == H ? 0 : Hkv;
  in.q_len = L;
  in.kv_len = S;
  in.head_dim = D;
  in.value_dim = D;
  in.order = order;
  in.q = q.data();
  in.k = k.data();
  in.v = v.data();
  return in;
}

// Ulysses' kernel backward on the rank's heads: `forward` the forward call's
// arguments, lse its rows' log-sum-exp.
template <class T>
void ulysses_backward(multihead::detail::AttentionArgs<T> forward, const T* lse, const T* d_out, T* d_q, T* d_k,
                      T* d_v, AttentionKernel kernel) {
  multihead::detail::AttentionBackwardArgs<T> b;
  b.forward = forward;
  b.lse = lse;
  b.d_out = d_out;
  b.d_q = d_q;
  b.d_k = d_k;
  b.d_v = d_v;
  multihead::detail::run_attention_backward(b, multihead::detail::resolve_forward_kernel<T>(kernel, false));
}

// Every gradient of the map summed over the ranks: one message, rank order
// (Communicator::all_reduce_sum), the same bits on every rank.
template <class T>
void sum_over_ranks(Communicator& comm, std::map<std::string, Tensor<T>>& grads) {
  std::vector<T> all;
  for (auto& [name, t] : grads) all.insert(all.end(), t.data(), t.data() + t.numel());
  comm.all_reduce_sum(all.data(), static_cast<int64_t>(all.size()));
  std::size_t at = 0;
  for (auto& [name, t] : grads) {
    std::copy(all.data() + at, all.data() + at + t.numel(), t.data());
    at += static_cast<std::size_t>(t.numel());
  }
}

}  // namespace multihead::distributed::detail
