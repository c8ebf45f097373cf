// src/attention/flash.cpp: the fused (flash) attention forward, float32,
// and its backward (attention_backward_flash, at the end).
//
// Legend (src/kernel/attention_args.hpp): N slices (B·H), L queries, S keys, D head width,
// Dv value width.
//
// This file validates the call, splits it into work items of
// (slice, query tile) and runs them on OpenMP threads; the arithmetic is the
// Highway kernel in src/simd/flash_attention-inl.h (tiled online softmax,
// Rabe & Staats 2021; Dao et al. 2022), chosen once per call for the SIMD
// target that src/simd/targets.cpp selects (best supported, or forced by
// MULTIHEAD_SIMD_TARGET).
//
// Threads: each output row belongs to exactly one work item and the items
// do not depend on the thread count, so outputs are bit-identical for any
// num_threads. No BLAS is called here, so nothing is oversubscribed against
// BLAS threads. Memory beyond the inputs and the output: one grow-only
// scratch of O(tile·(D + Dv + key tile)) floats per thread, kept across calls.
//
// Inputs and output may be strided views (SliceLayout in src/kernel/attention_args.hpp), e.g.
// the heads of a (L, B, E) projection read in place: K and V rows are read
// where they are, Q rows are packed per query tile anyway, and output rows
// are written where the layout puts them.
#include <algorithm>
#include <exception>
#include <limits>
#include <mutex>
#include <string>

#include <omp.h>

#include "attention/kernel.hpp"
#include "multihead/error.hpp"
#include "simd/flash_attention.hpp"
#include "simd/flash_attention_backward.hpp"
#include "simd/targets.hpp"

namespace multihead::detail {
namespace {

// The checks the forward and the backward share; `who` names the caller.
void validate_sizes(const AttentionArgs<float>& a, const char* who) {
  const auto fail = [who](const std::string& what) { throw Error(Error::Kind::Value, std::string(who) + ": " + what); };
  if (a.slices < 0 || a.q_len < 0 || a.kv_len < 0 || a.head_dim < 0 || a.value_dim < 0) {
    fail("negative size: slices=" + std::to_string(a.slices) + " q_len=" + std::to_string(a.q_len) +
         " kv_len=" + std::to_string(a.kv_len) + " head_dim=" + std::to_string(a.head_dim) +
         " value_dim=" + std::to_string(a.value_dim));
  }
  // The kernel compares query positions (i + shift, shift clamped to
  // [-L, S]) and key indices in int32 lanes.
  constexpr int64_t kMaxLen = std::numeric_limits<int32_t>::max() / 2 - 1024;
  if (a.q_len > kMaxLen || a.kv_len > kMaxLen) {
    fail("q_len " + std::to_string(a.q_len) + " / kv_len " + std::to_string(a.kv_len) +
         " exceed the supported maximum " + std::to_string(kMaxLen));
  }
  if (a.heads < 1) fail("heads must be >= 1, got " + std::to_string(a.heads));
}

void validate(const AttentionArgs<float>& a) {
  const auto fail = [](const std::string& what) {
    throw Error(Error::Kind::Value, "attention_forward_flash: " + what);
  };
  validate_sizes(a, "attention_forward_flash");
  if (a.weights != nullptr) {
    fail("weights must be nullptr (the flash kernel never materialises the L×S attention weights; "
         "use the materialized kernel to get them)");
  }
  // Each output row is written by one thread: rows must not overlap.
  if (!a.out_layout.contiguous() && a.out_layout.row < a.value_dim) {
    fail("out_layout.row " + std::to_string(a.out_layout.row) + " < value_dim " +
         std::to_string(a.value_dim) + ": output rows would overlap");
  }
  const bool work = a.slices > 0 && a.q_len > 0 && a.value_dim > 0;
  if (work && (a.q == nullptr || a.out == nullptr || (a.kv_len > 0 && (a.k == nullptr || a.v == nullptr)))) {
    fail("q, k, v and out must not be nullptr");
  }
}

}  // namespace

void attention_forward_flash(const AttentionArgs<float>& args) {
  validate(args);
  // value_dim = 0 still has log-sum-exps to write when they are asked for.
  if (args.slices == 0 || args.q_len == 0 || (args.value_dim == 0 && args.lse == nullptr)) return;

  // Dispatch once per call: the target's kernel, and its query tile height.
  const FlashAttentionKernel kernel = flash_attention_kernel_for(simd_target_bit());
  const int64_t tiles_per_slice = (args.q_len + kernel.row_tile - 1) / kernel.row_tile;
  const int64_t items = args.slices * tiles_per_slice;
  const int threads = static_cast<int>(
      std::min<int64_t>(items, args.num_threads > 0 ? args.num_threads : omp_get_max_threads()));

  // Work item `it` = (slice, query tile), slice-major so that consecutive
  // items share K and V in cache. With causal masking a query tile's cost
  // grows with its index; within a slice the tiles go heaviest first so
  // that the dynamic schedule ends on small items.
  std::exception_ptr error;
  std::mutex error_mutex;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
  for (int64_t it = 0; it < items; ++it) {
    // Per-thread scratch, grown on demand and kept for the next call.
    thread_local FlashScratch scratch;
    const int64_t slice = it / tiles_per_slice;
    int64_t tile = it % tiles_per_slice;
    if (args.modifiers.causal.enabled) tile = tiles_per_slice - 1 - tile;
    const int64_t row_begin = tile * kernel.row_tile;
    const int64_t row_end = std::min(args.q_len, row_begin + kernel.row_tile);
    try {
      kernel.rows(args, slice, row_begin, row_end, scratch);
    } catch (...) {  // only allocation can throw; never let it cross OpenMP
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

// ---- backward -----------------------------------------------------------------
//
// FlashAttention-2's backward (Dao 2023, Algorithm 2) in
// src/simd/flash_attention_backward-inl.h; here the checks and the threads.
//
// The split, and why. Two ways, chosen by the number of slices N against
// the thread count, and giving the same bits (so the gradients are
// bit-identical for any thread count either way):
//  - N >= threads: one work item is one whole slice (n = b·heads + h), run
//    by one thread in one pass, which writes that slice's d_q, d_k and d_v
//    rows: query tiles in increasing order, key tiles inside, 5 tile
//    products per (query tile, key tile). The slices alone keep the threads
//    busy (N = 16 at B = 1, H = 16 on the 2-core target machine).
//  - N < threads (N = 1 on 2 cores): two passes over the same tiles, as
//    independent work items: (slice, key tile) items write d_k and d_v of
//    their keys from every query tile in increasing order (4 products), and
//    (slice, query tile) items write d_q of their rows (3 products: the
//    scores and dp' are recomputed). 7 products for 5, but all threads work.
// Every gradient element gets the same operations in the same order in
// both (flash_attention_backward-inl.h, BackwardKeyTileStep), and each row
// has exactly one writer. FlashAttention-2 itself gives a thread a key tile
// and adds d_q with atomics, which is not deterministic.
// Memory beyond the inputs and gradients: one grow-only scratch of
// O((D + Dv + key tile)·query tile) floats per thread, never L×S.

namespace {

void validate_backward(const AttentionBackwardArgs<float>& b) {
  const char* who = "attention_backward_flash";
  const auto fail = [who](const std::string& what) { throw Error(Error::Kind::Value, std::string(who) + ": " + what); };
  const AttentionArgs<float>& a = b.forward;
  validate_sizes(a, who);
  // Each gradient row is written by one thread: rows must not overlap.
  const auto rows_apart = [&](const SliceLayout& l, int64_t width, const char* name) {
    if (!l.contiguous() && l.row < width)
      fail(std::string(name) + " row stride " + std::to_string(l.row) + " < its width " + std::to_string(width) +
           ": gradient rows would overlap");
  };
  rows_apart(a.q_layout, a.head_dim, "d_q (q_layout)");
  rows_apart(a.k_layout, a.head_dim, "d_k (k_layout)");
  rows_apart(a.v_layout, a.value_dim, "d_v (v_layout)");
  if (a.slices == 0) return;
  if (a.q_len > 0 && (a.q == nullptr || b.lse == nullptr || b.d_q == nullptr || b.d_out == nullptr ||
                      (a.value_dim > 0 && a.out == nullptr)))
    fail("q, out, lse, d_out and d_q must not be nullptr");
  if (a.kv_len > 0 && (a.k == nullptr || a.v == nullptr || b.d_k == nullptr || b.d_v == nullptr))
    fail("k, v, d_k and d_v must not be nullptr");
}

}  // namespace

void attention_backward_flash(const AttentionBackwardArgs<float>& args) {
  validate_backward(args);
  const AttentionArgs<float>& a = args.forward;
  if (a.slices == 0) return;
  const FlashBackwardKernel kernel = flash_backward_kernel_for(simd_target_bit());
  const int max_threads = a.num_threads > 0 ? a.num_threads : omp_get_max_threads();
  // Work items: whole slices, or (N < threads) each slice's key tiles
  // (d_k, d_v; the heavier items, first) then its query tiles (d_q).
  const bool two_pass = a.slices < max_threads;
  const int64_t key_items = two_pass ? (a.kv_len + kernel.key_tile - 1) / kernel.key_tile : 0;
  const int64_t query_items = two_pass ? (a.q_len + kernel.row_tile - 1) / kernel.row_tile : 0;
  const int64_t items = two_pass ? a.slices * (key_items + query_items) : a.slices;
  const int threads = static_cast<int>(std::min<int64_t>(items, max_threads));
  std::exception_ptr error;
  std::mutex error_mutex;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
  for (int64_t it = 0; it < items; ++it) {
    thread_local FlashScratch scratch;  // grown on demand, kept for the next call
    try {
      if (!two_pass) {
        kernel.slice(args, it, scratch);
      } else if (it < a.slices * key_items) {
        const int64_t n = it / key_items, j0 = (it % key_items) * kernel.key_tile;
        kernel.keys(args, n, j0, std::min(a.kv_len, j0 + kernel.key_tile), scratch);
      } else {
        const int64_t q = it - a.slices * key_items;
        const int64_t n = q / query_items, i0 = (q % query_items) * kernel.row_tile;
        kernel.queries(args, n, i0, std::min(a.q_len, i0 + kernel.row_tile), scratch);
      }
    } catch (...) {  // only allocation can throw; never let it cross OpenMP
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace multihead::detail
