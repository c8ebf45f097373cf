// src/distributed/sequence_layout.hpp: the sequence modes' layouts (ring and
// Ulysses, MultiheadAttention and GroupedQueryAttention): tokens of a rank's
// rows, split into heads and merged back, and Ulysses' all-to-alls between a
// split by rows and a split by heads.
//
// Legend: P ranks, B batch, H heads (or K/V heads), w head width, n rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

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

}  // namespace multihead::distributed::detail
