// src/kernels/flash_weights.cpp: the attention weights of a flash forward,
// recomputed from its saved row log-sum-exps (the contract:
// src/contract/attention_weights_args.hpp), for only the slices and rows asked
// for.
//
// Legend (src/contract/attention_args.hpp): N slices (B·H), L queries, S keys.
//
// This file validates the call, cuts the selected rows into runs of
// consecutive rows and the runs into query tiles, and runs the
// (slice, tile) work items on OpenMP threads; the arithmetic is the Highway
// kernel in src/simd/flash_weights-inl.h, chosen once per call for the SIMD
// target src/simd/targets.cpp selects.
//
// Threads: each output row belongs to exactly one work item, and a row's
// weights do not depend on the tile it shares, so the weights are
// bit-identical for any num_threads and any selection (a selected row gets
// the bits it gets when every row is selected).
// Memory beyond the inputs and the caller's slice_count × row_count × S
// floats: the list of work items and one grow-only scratch of
// O(tile·(D + key tile)) floats per thread.
#include <algorithm>
#include <string>
#include <vector>

#include "core/parallel.hpp"
#include "kernels/kernel.hpp"
#include "multihead/error.hpp"
#include "simd/flash_weights.hpp"
#include "simd/targets.hpp"

namespace multihead::detail {
namespace {

void validate(const AttentionWeightsArgs& w) {
  const auto fail = [](const std::string& what) {
    throw Error(Error::Kind::Value, "attention_weights_flash: " + what);
  };
  const AttentionArgs<float>& a = w.forward;
  if (a.slices < 0 || a.q_len < 0 || a.kv_len < 0 || a.head_dim < 0)
    fail("negative size: slices=" + std::to_string(a.slices) + " q_len=" + std::to_string(a.q_len) +
         " kv_len=" + std::to_string(a.kv_len) + " head_dim=" + std::to_string(a.head_dim));
  if (a.heads < 1) fail("heads must be >= 1, got " + std::to_string(a.heads));
  if (w.slices != nullptr && w.slice_count < 0) fail("slice_count must be >= 0, got " + std::to_string(w.slice_count));
  if (w.rows != nullptr && w.row_count < 0) fail("row_count must be >= 0, got " + std::to_string(w.row_count));
  for (int64_t x = 0; w.slices != nullptr && x < w.slice_count; ++x)
    if (w.slices[x] < 0 || w.slices[x] >= a.slices)
      fail("slices[" + std::to_string(x) + "] = " + std::to_string(w.slices[x]) + " is outside [0, " +
           std::to_string(a.slices) + ")");
  for (int64_t x = 0; w.rows != nullptr && x < w.row_count; ++x)
    if (w.rows[x] < 0 || w.rows[x] >= a.q_len)
      fail("rows[" + std::to_string(x) + "] = " + std::to_string(w.rows[x]) + " is outside [0, " +
           std::to_string(a.q_len) + ")");
  const int64_t slices = w.slices ? w.slice_count : a.slices, rows = w.rows ? w.row_count : a.q_len;
  if (slices > 0 && rows > 0) {
    if (w.lse == nullptr) fail("lse must not be nullptr (run the forward with AttentionArgs::lse set)");
    if (a.kv_len > 0 && (w.weights == nullptr || a.q == nullptr || a.k == nullptr))
      fail("q, k and weights must not be nullptr");
  }
}

// One work item: rows [row_begin, row_begin + count) of slice `slice`, into
// output row `out_row` of selected slice `selected`.
struct Item {
  int64_t selected, slice, out_row, row_begin, count;
};

}  // namespace

void attention_weights_flash(const AttentionWeightsArgs& args) {
  validate(args);
  const AttentionArgs<float>& a = args.forward;
  const int64_t slices = args.slices ? args.slice_count : a.slices;
  const int64_t rows = args.rows ? args.row_count : a.q_len;
  if (slices == 0 || rows == 0 || a.kv_len == 0) return;
  const FlashWeightsKernel kernel = flash_weights_kernel_for(simd_target_bit());

  // Runs of consecutive rows (rows[r + 1] = rows[r] + 1), cut at the tile
  // height, for every selected slice.
  const auto row_at = [&](int64_t r) { return args.rows ? args.rows[r] : r; };
  std::vector<Item> items;
  for (int64_t s = 0; s < slices; ++s) {
    const int64_t n = args.slices ? args.slices[s] : s;
    for (int64_t r = 0; r < rows;) {
      int64_t end = r + 1;
      while (end < rows && end - r < kernel.row_tile && row_at(end) == row_at(end - 1) + 1) ++end;
      items.push_back({s, n, r, row_at(r), end - r});
      r = end;
    }
  }
  const int64_t count = static_cast<int64_t>(items.size());
  // An item's work: at most row_tile rows of S scores, D each.
  const int64_t item_cost = std::min(rows, kernel.row_tile) * a.kv_len * std::max<int64_t>(a.head_dim, 1);
  parallel_items(count, requested_threads(a.num_threads), item_cost, [&](int64_t it) {
    thread_local FlashScratch scratch;  // grown on demand, kept for the next call
    const Item& item = items[static_cast<std::size_t>(it)];
    float* out = args.weights + (item.selected * rows + item.out_row) * a.kv_len;
    kernel.rows(args, item.slice, item.row_begin, item.row_begin + item.count, out, scratch);
  });
}

}  // namespace multihead::detail
