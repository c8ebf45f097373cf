// src/kernels/flash.cpp: the fused (flash) attention forward, float32,
// and its backward (attention_backward_flash, at the end).
//
// Legend (src/contract/attention_args.hpp): N slices (B·H), L queries, S keys, D head width,
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
// Inputs and output may be strided views (SliceLayout in src/contract/attention_args.hpp), e.g.
// the heads of a (L, B, E) projection read in place: K and V rows are read
// where they are, Q rows are packed per query tile anyway, and output rows
// are written where the layout puts them.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "contract/score_rule.hpp"
#include "core/narrow_rows.hpp"
#include "core/parallel.hpp"
#include "core/thread_scratch.hpp"
#include "kernels/kernel.hpp"
#include "kernels/narrow_matmul.hpp"
#include "multihead/error.hpp"
#include "simd/bf16_pairs.hpp"
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
  check_kv_heads(a);
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
  const bool narrow = a.narrow.dtype != ComputeDtype::F32;
  const void* q = narrow ? a.narrow.q : a.q;
  const void* k = narrow ? a.narrow.k : a.k;
  const void* v = narrow ? a.narrow.v : a.v;
  const void* out = narrow ? a.narrow.out : a.out;
  if (work && (q == nullptr || out == nullptr || (a.kv_len > 0 && (k == nullptr || v == nullptr)))) {
    fail(std::string(narrow ? "narrow." : "") + "q, k, v and out must not be nullptr");
  }
}

// Decoding one token with grouped-query attention (q_len 1, heads / kv_heads
// = G > 1): the G query heads of a group read the same K/V rows, so they are
// handed to the kernel as the G query rows of one slice (slice b·kv_heads + g,
// row r = query head g·G + r): K and V are then read once per group, not
// once per query head, and the G queries fill the vector lanes that a lone
// query would leave empty. Only where every row of the packed slice sees the
// same keys: no per-slice mask, padding, ALiBi slope or dropout, and the
// positions of the one query (p = causal_shift) turn causal and window into
// one key range [lo, hi), visible_key_range (score_rule.hpp) for that query
// when every key has a position (cols >= S). nullopt when the call does not qualify.
std::optional<AttentionArgs<float>> grouped_decode_args(const AttentionArgs<float>& a) {
  const int64_t Hkv = a.kv_heads_or_heads(), S = a.kv_len;
  const ScoreModifiers<float>& m = a.modifiers;
  const bool positional = m.causal.enabled || m.window > 0;
  if (a.q_len != 1 || Hkv == a.heads || a.slices % a.heads != 0 || m.attn_mask || m.key_padding ||
      m.alibi_slopes || a.dropout.p > 0.0 || a.weights || a.lse || (positional && m.causal.cols < S))
    return std::nullopt;
  // The one query's keys (visible_key_range; rest = S, as cols >= S).
  const VisibleKeys keys = visible_key_range(m.causal, m.window, causal_shift(m.causal, 1), S, 0, 1);
  const int64_t lo = keys.begin, hi = keys.end;
  const int64_t G = a.heads / Hkv;
  const SliceLayout ql = resolve_layout(a.q_layout, a.heads, 1, a.head_dim);
  const SliceLayout ol = resolve_layout(a.out_layout, a.heads, 1, a.value_dim);
  const SliceLayout kl = resolve_layout(a.k_layout, Hkv, S, a.head_dim);
  const SliceLayout vl = resolve_layout(a.v_layout, Hkv, S, a.value_dim);
  AttentionArgs<float> g = a;
  g.slices = a.slices / G;
  g.heads = g.kv_heads = Hkv;
  g.q_len = G;
  g.kv_len = hi - lo;
  // Row r of packed slice (b, g) is query head g·G + r of batch b.
  g.q_layout = SliceLayout{ql.batch, G * ql.head, ql.head};
  g.out_layout = SliceLayout{ol.batch, G * ol.head, ol.head};
  g.k = a.k ? a.k + lo * kl.row : nullptr;
  g.v = a.v ? a.v + lo * vl.row : nullptr;
  if (a.narrow.k) g.narrow.k = static_cast<const uint16_t*>(a.narrow.k) + lo * kl.row;
  if (a.narrow.v) g.narrow.v = static_cast<const uint16_t*>(a.narrow.v) + lo * vl.row;
  g.k_layout = kl;
  g.v_layout = vl;
  g.modifiers = ScoreModifiers<float>{};
  g.modifiers.softcap = m.softcap;  // the same function of the score in every row
  return g;
}

}  // namespace

namespace {

std::atomic<bool>& narrow_widen_once_enabled() {
  static std::atomic<bool> enabled{true};
  return enabled;
}

// Slice by slice, `len` rows of `width` 16-bit values from `src` under the
// resolved layout `l` (slices of `heads` per batch entry) widened into the
// contiguous [slices][len][width] floats of `dst`: head-major, as the
// float32 module's split_heads copies are. (Widening in the caller's
// token-major layout kept rows E floats apart, 4 KiB at E = 1024, and the
// float32 kernel reading K/V rows that far apart ran (1, 8192, 1024, 16)
// at half its head-major speed.)
void widen_slices(const void* src, ComputeDtype dtype, const SliceLayout& l, int64_t slices, int64_t heads,
                  int64_t len, int64_t width, float* dst, int threads) {
  parallel_items(slices, threads, /*item_cost=*/len * width, [&](int64_t n) {
    const int64_t offset = (n / heads) * l.batch + (n % heads) * l.head;
    float* out = dst + n * len * width;
    if (dtype == ComputeDtype::BF16) {
      widen_rows(static_cast<const bfloat16*>(src) + offset, len, width, l.row, out, width, 1);
    } else {
      widen_rows(static_cast<const float16*>(src) + offset, len, width, l.row, out, width, 1);
    }
  });
}

void run_flash(const AttentionArgs<float>& args);

// 16-bit operands where the kernel would widen them tile by tile (the f16
// kernel, and the bf16 kernel's fma way): Q, K and V widened once each, the
// float32 kernel, and each output row rounded once. The 16-bit kernel's
// fma way widens every key tile's K and V rows again for every query tile
// (bq = 16 queries on AVX2), so on a host without 16-bit arithmetic it ran
// its whole flash part ~25% slower than float32 (perf samples, (1, 1024,
// 768, 12), AMD EPYC AVX2). The arithmetic is the same: the tile way's
// micro-kernels are the float32 kernel's on the same widened values, and
// its output is rounded once as it is stored, so the bits are the same
// (NarrowRows.FlashWidenOnceMatchesTileWay). Memory: head-major float32
// copies of Q, K, V and out, per calling thread, kept
// (core/thread_scratch.hpp).
void run_flash_on_widened(const AttentionArgs<float>& a) {
  thread_local ThreadScratch sq, sk, sv, so;
  const int threads = requested_threads(a.num_threads);
  const int64_t H = a.heads, Hkv = a.kv_heads_or_heads(), kv_slices = kv_slice_count(a.slices, H, Hkv);
  const int64_t L = a.q_len, S = a.kv_len, D = a.head_dim, Dv = a.value_dim;
  const SliceLayout ql = resolve_layout(a.q_layout, H, L, D);
  const SliceLayout kl = resolve_layout(a.k_layout, Hkv, S, D);
  const SliceLayout vl = resolve_layout(a.v_layout, Hkv, S, Dv);
  const SliceLayout ol = resolve_layout(a.out_layout, H, L, Dv);
  const ComputeDtype dtype = a.narrow.dtype;
  AttentionArgs<float> f = a;
  f.narrow = NarrowOperands{};
  f.q_layout = f.k_layout = f.v_layout = f.out_layout = SliceLayout{};  // contiguous [slices][len][width]
  const auto copy = [&](const void* src, const SliceLayout& l, int64_t slices, int64_t heads, int64_t len,
                        int64_t width, ThreadScratch& scratch) -> float* {
    if (src == nullptr || slices * len * width == 0) return nullptr;
    float* dst = scratch.take(static_cast<std::size_t>(slices * len * width));
    widen_slices(src, dtype, l, slices, heads, len, width, dst, threads);
    return dst;
  };
  f.q = copy(a.narrow.q, ql, a.slices, H, L, D, sq);
  f.k = copy(a.narrow.k, kl, kv_slices, Hkv, S, D, sk);
  f.v = copy(a.narrow.v, vl, kv_slices, Hkv, S, Dv, sv);
  f.out = a.slices * L * Dv > 0 ? so.take(static_cast<std::size_t>(a.slices * L * Dv)) : nullptr;
  run_flash(f);
  if (f.out == nullptr) return;
  // Only the rows the kernel wrote: a strided output's gaps are the
  // caller's. One slice per work item, in one parallel region.
  parallel_items(a.slices, threads, /*item_cost=*/L * Dv, [&](int64_t n) {
    const int64_t offset = (n / H) * ol.batch + (n % H) * ol.head;
    const float* rows = f.out + n * L * Dv;
    if (dtype == ComputeDtype::BF16) {
      round_rows(rows, L, Dv, Dv, static_cast<const bfloat16*>(nullptr), static_cast<bfloat16*>(a.narrow.out) + offset,
                 ol.row, 1);
    } else {
      round_rows(rows, L, Dv, Dv, static_cast<const float16*>(nullptr), static_cast<float16*>(a.narrow.out) + offset,
                 ol.row, 1);
    }
  });
}

// bf16's pair way (Bf16Way::Dot) with at least a work item's rows of
// queries: K's rows and V's pairs down the keys packed once per call into
// head-major copies (NarrowOperands::k_pairs, v_pairs), which the kernel
// reads in place of packing every key tile again for every query tile
// (64 queries on AVX-512). Measured before this (perf, (1, 4096, 1024, 16)
// bf16, AMD Zen 5): the two per-tile packings were ~15% of the kernel's
// samples. Same pairs (simd/bf16_pairs.hpp, both ways), same products, so
// the same bits (NarrowRows.FlashWidenOnceMatchesTileWay). Memory: K and
// V's own bytes again, per calling thread, kept (core/thread_scratch.hpp).
void run_flash_on_pairs(const AttentionArgs<float>& a) {
  thread_local ThreadScratch sk, sv;
  const int threads = requested_threads(a.num_threads);
  const int64_t H = a.heads, Hkv = a.kv_heads_or_heads(), kv_slices = kv_slice_count(a.slices, H, Hkv);
  const int64_t S = a.kv_len, D = a.head_dim, Dv = a.value_dim;
  const int64_t key_pairs = (D + 1) / 2, value_pairs = (S + 1) / 2;
  const SliceLayout kl = resolve_layout(a.k_layout, Hkv, S, D);
  const SliceLayout vl = resolve_layout(a.v_layout, Hkv, S, Dv);
  // ThreadScratch holds floats; the pairs are 32-bit words of the same size.
  static_assert(sizeof(float) == sizeof(uint32_t));
  uint32_t* kp = reinterpret_cast<uint32_t*>(sk.take(static_cast<std::size_t>(std::max<int64_t>(1, kv_slices * S * key_pairs))));
  uint32_t* vp = reinterpret_cast<uint32_t*>(sv.take(static_cast<std::size_t>(std::max<int64_t>(1, kv_slices * value_pairs * Dv))));
  const auto* k = static_cast<const bfloat16*>(a.narrow.k);
  const auto* v = static_cast<const bfloat16*>(a.narrow.v);
  parallel_items(kv_slices, threads, /*item_cost=*/S * (D + Dv), [&](int64_t g) {
    const int64_t b = g / Hkv, h = g % Hkv;
    PackRowPairs(k + b * kl.batch + h * kl.head, static_cast<size_t>(kl.row), static_cast<size_t>(S),
                 static_cast<size_t>(D), kp + g * S * key_pairs);
    PackColumnPairs(v + b * vl.batch + h * vl.head, static_cast<size_t>(vl.row), static_cast<size_t>(S),
                    static_cast<size_t>(Dv), vp + g * value_pairs * Dv);
  });
  AttentionArgs<float> f = a;
  f.narrow.k_pairs = kp;
  f.narrow.v_pairs = vp;
  run_flash(f);
}

}  // namespace

void flash_narrow_widen_once(bool enabled) { narrow_widen_once_enabled().store(enabled); }

bool narrow_flash_is_float32_kernel(ComputeDtype dtype) {
  return dtype == ComputeDtype::F16 || (dtype == ComputeDtype::BF16 && !bf16_dot_choice(simd_target_bit()).dpbf16);
}

void attention_forward_flash(const AttentionArgs<float>& args_in) {
  validate(args_in);
  // value_dim = 0 still has log-sum-exps to write when they are asked for.
  if (args_in.slices == 0 || args_in.q_len == 0 || (args_in.value_dim == 0 && args_in.lse == nullptr)) return;
  // A prompt's bf16 attention on oneDNN's bf16 matmul where that is AMX
  // (kernels/narrow_matmul.hpp); this kernel is its reference. Decided on
  // the call as made: a decoding step's grouped query heads (below) are
  // not a prompt.
  if (narrow_matmul_serves(args_in)) return attention_forward_narrow_matmul(args_in);
  const std::optional<AttentionArgs<float>> grouped = grouped_decode_args(args_in);
  const AttentionArgs<float>& args = grouped ? *grouped : args_in;
  const ComputeDtype dtype = args.narrow.dtype;
  if (dtype != ComputeDtype::F32 && narrow_widen_once_enabled().load()) {
    const int64_t target = simd_target_bit();
    const bool tile_widening = dtype == ComputeDtype::F16 || !bf16_dot_choice(target).dpbf16;
    // With fewer queries than a work item's rows (decoding), the tile way
    // widens (packs) each K/V row about once anyway: the copies would only
    // add a pass.
    if (args.q_len >= flash_attention_kernel_for(target).row_tile) {
      return tile_widening ? run_flash_on_widened(args) : run_flash_on_pairs(args);
    }
  }
  run_flash(args);
}

namespace {

// Rows per work item: the kernel's widest tile, unless the slices are fewer
// than the threads and each holds at most kernel.same_bits_rows rows. That
// is a decoding step with few K/V heads, where grouped_decode_args makes
// each K/V head's H/Hkv query rows one slice (32 rows on one slice at
// H = 32, Hkv = 1: one item, so one thread computed the step's attention
// while the other waited). Then each slice's rows are cut into whole
// vectors, up to threads / slices items, which leaves every row's key
// tiling and so its bits unchanged (FlashAttentionKernel::same_bits_rows):
// the outputs are the same for any thread count. Each item reads its
// slice's K/V, so the threads read them side by side.
int64_t item_rows(const FlashAttentionKernel& kernel, int64_t slices, int64_t q_len, int threads) {
  if (slices >= threads || q_len > kernel.same_bits_rows) return kernel.row_tile;
  const int64_t parts = (threads + slices - 1) / slices;
  const int64_t per = (q_len + parts - 1) / parts;
  return std::max(kernel.vector_rows, (per + kernel.vector_rows - 1) / kernel.vector_rows * kernel.vector_rows);
}

void run_flash(const AttentionArgs<float>& args) {
  // Dispatch once per call: the target's kernel, and its query tile height.
  const FlashAttentionKernel kernel = flash_attention_kernel_for(simd_target_bit());
  const auto rows = args.narrow.dtype == ComputeDtype::BF16  ? kernel.rows_bf16
                    : args.narrow.dtype == ComputeDtype::F16 ? kernel.rows_f16
                                                             : kernel.rows;
  const int threads = requested_threads(args.num_threads);
  const int64_t tile_rows = item_rows(kernel, args.slices, args.q_len, threads);
  const int64_t tiles_per_slice = (args.q_len + tile_rows - 1) / tile_rows;
  const int64_t items = args.slices * tiles_per_slice;

  // Work item `it` = (slice, query tile), slice-major so that consecutive
  // items share K and V in cache. With causal masking a query tile's cost
  // grows with its index; within a slice the tiles go heaviest first so
  // that the dynamic schedule ends on small items.
  // An item's work: its rows' scores and values, tile_rows·S·(D + Dv).
  const int64_t item_cost = std::min(args.q_len, tile_rows) * args.kv_len * (args.head_dim + args.value_dim);
  parallel_items(items, threads, item_cost, [&](int64_t it) {
    // Per-thread scratch, grown on demand and kept for the next call.
    thread_local FlashScratch scratch;
    const int64_t slice = it / tiles_per_slice;
    int64_t tile = it % tiles_per_slice;
    if (args.modifiers.causal.enabled) tile = tiles_per_slice - 1 - tile;
    const int64_t row_begin = tile * tile_rows;
    const int64_t row_end = std::min(args.q_len, row_begin + tile_rows);
    rows(args, slice, row_begin, row_end, scratch);
  });
}

}  // namespace

// ---- backward -----------------------------------------------------------------
//
// FlashAttention-2's backward (Dao 2023, Algorithm 2) in
// src/simd/flash_attention_backward-inl.h; here the checks and the threads.
//
// The split, and why. The unit is a group: K/V slice g and the query
// slices that read it (n with kv_slice(n) = g; just n = g without
// grouped-query), since g's d_k and d_v rows sum over them. Two ways,
// chosen by the number of groups G = B·kv_heads against the thread count,
// and giving the same bits (so the gradients are bit-identical for any
// thread count either way):
//  - G >= threads: one work item is one whole group, run by one thread in
//    one pass, which writes its d_k and d_v rows and its query slices' d_q
//    rows: the query slices in increasing n, each one's query tiles in
//    increasing order, key tiles inside, 5 tile products per (query tile,
//    key tile). The groups alone keep the threads busy (G = 16 at B = 1,
//    H = 16 on the 2-core target machine).
//  - G < threads (G = 1 on 2 cores, e.g. multi-query): two passes over the
//    same tiles, as independent work items: (group, key tile) items write
//    d_k and d_v of their keys from the group's query slices in increasing
//    n, each from every query tile in increasing order (4 products), and
//    (query slice, query tile) items write d_q of their rows (3 products:
//    the scores and dp' are recomputed). 7 products for 5, but all threads work.
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
  check_kv_heads(a);
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
  // The bf16 operands themselves (d_out_bf16) in place of the float ones.
  const bool bf16 = b.d_out_bf16 != nullptr;
  // bf16 operands alone are read by the pair way or, on any host, by the
  // matmul way (attention_backward_flash takes it for them where the pair
  // way does not run, whatever the switch says by then).
  if (bf16 && (!b.bf16_operands || a.narrow.dtype != ComputeDtype::BF16))
    fail("d_out_bf16 needs bf16_operands and forward.narrow in bf16");
  if (!bf16 && a.narrow.dtype != ComputeDtype::F32) fail("forward.narrow is read only with d_out_bf16");
  const void* q = bf16 ? a.narrow.q : a.q;
  const void* out = bf16 ? a.narrow.out : a.out;
  const void* d_out = bf16 ? static_cast<const void*>(b.d_out_bf16) : b.d_out;
  if (a.q_len > 0 && (q == nullptr || b.lse == nullptr || b.d_q == nullptr || d_out == nullptr ||
                      (a.value_dim > 0 && out == nullptr)))
    fail("q, out, lse, d_out and d_q must not be nullptr");
  const void* k = bf16 ? a.narrow.k : a.k;
  const void* v = bf16 ? a.narrow.v : a.v;
  if (a.kv_len > 0 && (k == nullptr || v == nullptr || b.d_k == nullptr || b.d_v == nullptr))
    fail("k, v, d_k and d_v must not be nullptr");
}

}  // namespace

namespace {

// The bf16 pair way of the backward (AttentionBackwardArgs::bf16_operands,
// where this host's bf16 forward runs its pair way): K's rows as pairs
// along D (as the forward's k_pairs, so the recomputed scores are the
// forward's bits), K's pairs down the keys (d_q's product) and V's rows as
// pairs along Dv (dp'), packed once per call from the float32 copies
// (exact: they hold bf16 values) into this thread's kept buffers. Returns
// the arguments that point at them.
AttentionBackwardArgs<float> with_bf16_pairs(const AttentionBackwardArgs<float>& b) {
  thread_local ThreadScratch sk, skc, sv;
  const AttentionArgs<float>& a = b.forward;
  const int threads = requested_threads(a.num_threads);
  const int64_t H = a.heads, Hkv = a.kv_heads_or_heads(), kv_slices = kv_slice_count(a.slices, H, Hkv);
  const int64_t S = a.kv_len, D = a.head_dim, Dv = a.value_dim;
  const int64_t key_pairs = (D + 1) / 2, value_pairs = (Dv + 1) / 2, key_row_pairs = (S + 1) / 2;
  const SliceLayout kl = resolve_layout(a.k_layout, Hkv, S, D);
  const SliceLayout vl = resolve_layout(a.v_layout, Hkv, S, Dv);
  static_assert(sizeof(float) == sizeof(uint32_t));
  const auto words = [](ThreadScratch& scratch, int64_t n) {
    return reinterpret_cast<uint32_t*>(scratch.take(static_cast<std::size_t>(std::max<int64_t>(1, n))));
  };
  uint32_t* kp = words(sk, kv_slices * S * key_pairs);
  uint32_t* kc = words(skc, kv_slices * key_row_pairs * D);
  uint32_t* vp = words(sv, kv_slices * S * value_pairs);
  // Each slice's rows rounded to bf16 by round_rows (to_bfloat16's vector
  // form; scalar rounding here was ~1% of a bf16 training step at
  // (8, 128, 512, 8)) into this thread's bf16 rows, padded to whole pairs
  // (an odd width's pad zero), which on a little-endian CPU are the pairs'
  // words; K's column pairs are packed from those rows.
  parallel_items(kv_slices, threads, /*item_cost=*/S * (2 * D + Dv), [&](int64_t g) {
    thread_local std::vector<bfloat16> rows;
    const auto n = [](int64_t x) { return static_cast<size_t>(x); };
    if (b.d_out_bf16 != nullptr) {  // the bf16 rows themselves: no rounding
      const auto* k16 = static_cast<const bfloat16*>(a.narrow.k) + (g / Hkv) * kl.batch + (g % Hkv) * kl.head;
      const auto* v16 = static_cast<const bfloat16*>(a.narrow.v) + (g / Hkv) * vl.batch + (g % Hkv) * vl.head;
      PackRowPairs(k16, n(kl.row), n(S), n(D), kp + g * S * key_pairs);
      PackColumnPairs(k16, n(kl.row), n(S), n(D), kc + g * key_row_pairs * D);
      PackRowPairs(v16, n(vl.row), n(S), n(Dv), vp + g * S * value_pairs);
      return;
    }
    const float* k = a.k + (g / Hkv) * kl.batch + (g % Hkv) * kl.head;
    const float* v = a.v + (g / Hkv) * vl.batch + (g % Hkv) * vl.head;
    const auto row_pairs = [&](const float* src, int64_t ld, int64_t width, int64_t pairs, uint32_t* dst) {
      if constexpr (std::endian::native != std::endian::little) {
        PackRowPairs(src, n(ld), n(S), n(width), dst);
        return;
      }
      rows.resize(n(S * 2 * pairs));
      round_rows(src, S, width, ld, static_cast<const bfloat16*>(nullptr), rows.data(), 2 * pairs, 1);
      if (width % 2 != 0)
        for (int64_t r = 0; r < S; ++r) rows[n(r * 2 * pairs + width)] = bfloat16{};
      std::memcpy(dst, rows.data(), n(S * pairs) * sizeof(uint32_t));
    };
    row_pairs(k, kl.row, D, key_pairs, kp + g * S * key_pairs);
    if constexpr (std::endian::native != std::endian::little) {
      PackColumnPairs(k, n(kl.row), n(S), n(D), kc + g * key_row_pairs * D, n(D));
    } else {
      PackColumnPairs(rows.data(), n(2 * key_pairs), n(S), n(D), kc + g * key_row_pairs * D);
    }
    row_pairs(v, vl.row, Dv, value_pairs, vp + g * S * value_pairs);
  });
  AttentionBackwardArgs<float> p = b;
  p.forward.narrow.k_pairs = kp;
  p.k_column_pairs = kc;
  p.v_row_pairs = vp;
  return p;
}

}  // namespace

bool flash_backward_reads_bf16() { return bf16_dot_choice(simd_target_bit()).dpbf16; }

void attention_backward_flash(const AttentionBackwardArgs<float>& args_in) {
  validate_backward(args_in);
  if (args_in.forward.slices == 0) return;
  // bf16 operands on oneDNN's bf16 matmul (kernels/narrow_matmul.hpp), as
  // the forward; this kernel is its reference.
  // bf16 operands alone (d_out_bf16) where the pair way does not run are
  // the matmul way's: a module asked narrow_matmul_backward_serves_bf16
  // before it built them, and a switch forced since then does not strand
  // them.
  if (narrow_matmul_backward_serves(args_in) || (args_in.d_out_bf16 != nullptr && !flash_backward_reads_bf16()))
    return attention_backward_narrow_matmul(args_in);
  const int64_t target = simd_target_bit();
  BackwardProducts products = BackwardProducts::Float32;
  if (args_in.bf16_operands && args_in.forward.kv_len > 0) {
    const Bf16DotChoice choice = bf16_dot_choice(target);
    if (choice.dpbf16) products = choice.native ? BackwardProducts::Bf16PairsNative : BackwardProducts::Bf16Pairs;
  }
  const AttentionBackwardArgs<float> args = products == BackwardProducts::Float32 ? args_in : with_bf16_pairs(args_in);
  const AttentionArgs<float>& a = args.forward;
  const FlashBackwardKernel kernel = flash_backward_kernel_for(target, products);
  const int max_threads = requested_threads(a.num_threads);
  // Work items: whole groups, or (groups < threads) each group's key tiles
  // (d_k, d_v; the heavier items, first) then each query slice's query
  // tiles (d_q).
  const int64_t groups = kv_slice_count(a.slices, a.heads, a.kv_heads_or_heads());
  const bool two_pass = groups < max_threads;
  const int64_t key_items = two_pass ? (a.kv_len + kernel.key_tile - 1) / kernel.key_tile : 0;
  const int64_t query_items = two_pass ? (a.q_len + kernel.row_tile - 1) / kernel.row_tile : 0;
  const int64_t items = two_pass ? groups * key_items + a.slices * query_items : groups;
  // An item's work, on average: the 5 tile products of every (query,
  // key) pair, (5/2)·L·S·(D + Dv) per query slice, spread over the items.
  const int64_t item_cost = 5 * a.slices * a.q_len * a.kv_len * (a.head_dim + a.value_dim) / (2 * std::max<int64_t>(items, 1));
  parallel_items(items, max_threads, item_cost, [&](int64_t it) {
    thread_local FlashScratch scratch;  // grown on demand, kept for the next call
    if (!two_pass) {
      kernel.group(args, it, scratch);
    } else if (it < groups * key_items) {
      const int64_t g = it / key_items, j0 = (it % key_items) * kernel.key_tile;
      kernel.keys(args, g, j0, std::min(a.kv_len, j0 + kernel.key_tile), scratch);
    } else {
      const int64_t q = it - groups * key_items;
      const int64_t n = q / query_items, i0 = (q % query_items) * kernel.row_tile;
      kernel.queries(args, n, i0, std::min(a.q_len, i0 + kernel.row_tile), scratch);
    }
  });
}

}  // namespace multihead::detail
