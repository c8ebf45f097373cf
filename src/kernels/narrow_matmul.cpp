// src/kernels/narrow_matmul.cpp: the 16-bit attention forward on oneDNN's
// bf16 matmul (narrow_matmul.hpp says when it runs).
//
// Legend (src/contract/attention_args.hpp): N slices (B·H), L queries, S keys,
// D head width, Dv value width; R query rows per block, C keys per chunk.
//
// bf16 only: an f16 value needs two bf16 pieces, so f16's QKᵀ and PV would
// be three products each (core/gemm.cpp's bf16x3), and measured that way
// (Intel Xeon with AMX, (1, 4096, 1024, 16), 2 threads, alternated) the f16
// forward took 352-355 ms against the flash kernel's 308-312. f16 keeps
// the flash kernel.
//
// The work item is (slice n, a block of R query rows), one thread each,
// whose products oneDNN runs on that thread (as core/gemm.cpp's blocks).
// The block walks the keys in chunks of C with the online softmax of the
// flash kernel (Rabe & Staats 2021; Dao et al. 2022), its tiles now whole
// products:
//   scores (R × C, float32) = scale · Q_block K_chunkᵀ      one bf16 matmul
//   each row: the score rule, the running max m, alpha = exp(m_old − m),
//             p = exp(s − m) (float32), l = l·alpha + Σ p, dropout
//   P rounded to bf16; sums (R × Dv) = P V_chunk            one bf16 matmul
//   acc = acc·alpha + sums
// then out = acc / l, rounded once to bf16, and lse = m + log l. Only the
// chunks that hold a key some row of the block sees (visible_key_range,
// rounded out to kKeyAlign keys) are computed.
//
// Precision: Q, K and V are bf16 numbers, so every product is exact and
// the sums are float32 (the flash kernel's arithmetic, in another order).
// P is rounded to bf16 before PV, while l keeps the float32 sum, as the
// flash kernel's pair way does (docs/precision.md, "The two bf16 dot
// ways"): u·Σ_j p_ij|V_j| more in the bound, at most the output's own
// rounding to bf16. AMX flushes a denormal bf16 input or product to zero,
// as vdpbf16ps does: the same 2^-126 terms.
//
// Every row of every item runs the same instructions whatever the thread
// count (an item is one thread's), so the bits do not depend on it.
//
// Memory beyond the inputs and output, per calling thread and kept
// (core/thread_scratch.hpp): dense bf16 copies of K and V (their bytes
// again) where their rows are not dense already; per item thread, R × C
// float32 scores and bf16 weights, 2 R × Dv float32 sums and R × D bf16
// queries.
#include "kernels/narrow_matmul.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "contract/score_rule.hpp"
#include "core/gemm.hpp"
#include "core/narrow_rows.hpp"
#include "core/parallel.hpp"
#include "core/switches.hpp"
#include "core/thread_scratch.hpp"
#include "kernels/score_rows.hpp"
#include "multihead/error.hpp"

namespace multihead::detail {
namespace {

// Query rows per block and keys per chunk of the online softmax. Measured
// (oneDNN 2.6's bf16 matmul, one thread, Intel Xeon with AMX, D = Dv = 64,
// a noisy host): QKᵀ of 256 rows against 512 keys ran at 630-880 GFLOP/s,
// against 4096 keys at 280-460 (its 4 MiB of float32 scores leave the
// core's L2); PV over 512 keys at 1300-1480. A block's scores, weights and
// sums then stay in L2 (512 + 256 + 64 KiB), and oneDNN packs each chunk
// of K and V once for the block's 256 rows.
constexpr int64_t kBlockRows = 256;
constexpr int64_t kKeyBlock = 512;
// The unit causal and window ends are rounded to, so that a causal call
// makes few product shapes (each a oneDNN primitive, kept per thread).
constexpr int64_t kKeyAlign = 64;

int64_t round_up(int64_t x, int64_t unit) { return (x + unit - 1) / unit * unit; }

// ---- the switch ------------------------------------------------------------

enum class Way { Auto, Flash, Matmul };

// In Way's order.
constexpr std::string_view kWayNames[] = {"auto", "flash", "matmul"};

Way parse_way(const std::string& name, const std::string& what) {
  return static_cast<Way>(switch_choice(what, name, kWayNames));
}

Way env_way() {
  static const Way way = static_cast<Way>(env_switch("MULTIHEAD_NARROW_ATTENTION", kWayNames));
  return way;
}

std::atomic<int> g_forced{static_cast<int>(Way::Auto)};

Way way_setting() {
  const auto forced = static_cast<Way>(g_forced.load(std::memory_order_relaxed));
  return forced != Way::Auto ? forced : env_way();
}

// ---- the operands ----------------------------------------------------------

// Where slice n of a resolved layout starts, in elements.
int64_t slice_offset(const SliceLayout& l, int64_t n, int64_t heads) {
  return (n / heads) * l.batch + (n % heads) * l.head;
}

const bfloat16* slice_rows(const void* base, const SliceLayout& l, int64_t n, int64_t heads) {
  return static_cast<const bfloat16*>(base) + slice_offset(l, n, heads);
}

// Rows [first, first + rows) of slice `slice`, `width` wide, as dense bf16
// rows at dst: from the bf16 operand (memcpy) or from its float32 widening
// (round_rows: exact, the values were bf16). The one copy every product's
// A or B goes through where the operand's rows are not dense: oneDNN's AMX
// matmul takes only dense rows (strided ones ran on its gemm:jit at a
// quarter of the speed).
void dense_bf16_rows(const void* base, bool bf16, const SliceLayout& l, int64_t slice, int64_t heads, int64_t first,
                     int64_t rows, int64_t width, bfloat16* dst) {
  const int64_t offset = slice_offset(l, slice, heads) + first * l.row;
  if (bf16) {
    const bfloat16* src = static_cast<const bfloat16*>(base) + offset;
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * width, src + r * l.row, static_cast<std::size_t>(width) * sizeof(bfloat16));
  } else {
    round_rows(static_cast<const float*>(base) + offset, rows, width, l.row, static_cast<const bfloat16*>(nullptr),
               dst, width, 1);
  }
}

// K and V of every K/V slice as dense rows ([kv slices][S][D] and
// [S][Dv]): read in place where they are laid out so (a contiguous call),
// else copied once per call with all threads (the module's heads, rows of
// its projection buffer, E or 3E apart) into this thread's kept buffers
// (K's and V's bytes again): oneDNN reads a dense B faster, and each
// block's products read a chunk of them.
struct Operands {
  const bfloat16* k = nullptr;
  const bfloat16* v = nullptr;
};

// Whether slice g of a resolved layout starts at g·len·width with rows
// width apart, for every g (kv_slice_count of them).
bool dense(const SliceLayout& l, int64_t heads, int64_t len, int64_t width) {
  return l.row == width && l.head == len * width && l.batch == heads * len * width;
}

Operands prepare(const AttentionArgs<float>& a, int threads) {
  thread_local BasicThreadScratch<bfloat16> sk, sv;
  const int64_t Hkv = a.kv_heads_or_heads(), kv_slices = kv_slice_count(a.slices, a.heads, Hkv);
  const int64_t S = a.kv_len, D = a.head_dim, Dv = a.value_dim;
  const SliceLayout kl = resolve_layout(a.k_layout, Hkv, S, D);
  const SliceLayout vl = resolve_layout(a.v_layout, Hkv, S, Dv);
  const auto rows = [&](const void* src, const SliceLayout& l, int64_t width,
                        BasicThreadScratch<bfloat16>& scratch) -> const bfloat16* {
    if (dense(l, Hkv, S, width)) return static_cast<const bfloat16*>(src);
    bfloat16* copy = scratch.take(static_cast<std::size_t>(kv_slices * S * width));
    parallel_items(kv_slices, threads, S * width,
                   [&](int64_t g) { dense_bf16_rows(src, true, l, g, Hkv, 0, S, width, copy + g * S * width); });
    return copy;
  };
  return {rows(a.narrow.k, kl, D, sk), rows(a.narrow.v, vl, Dv, sv)};
}

}  // namespace

bool narrow_matmul_serves(const AttentionArgs<float>& a) {
  if (a.narrow.dtype != ComputeDtype::BF16 || a.weights != nullptr || a.q_len == 0 || a.kv_len == 0 ||
      a.head_dim == 0 || a.value_dim == 0)
    return false;
  const Way w = way_setting();
  if (w != Way::Auto) return w == Way::Matmul;
  return a.q_len >= kNarrowMatmulMinRows && bf16_matmul_on_amx();
}

void attention_forward_narrow_matmul(const AttentionArgs<float>& a) {
  const int threads = requested_threads(a.num_threads);
  const Operands ops = prepare(a, threads);
  const int64_t H = a.heads, Hkv = a.kv_heads_or_heads();
  const int64_t L = a.q_len, S = a.kv_len, D = a.head_dim, Dv = a.value_dim;
  const SliceLayout ql = resolve_layout(a.q_layout, H, L, D);
  const SliceLayout ol = resolve_layout(a.out_layout, H, L, Dv);
  const int64_t R = std::min(kBlockRows, L), blocks = (L + R - 1) / R, items = a.slices * blocks;
  const ExpRow<float> exp_row = exp_row_for_current_target<float>();
  const ExpRowBf16Fn exp_row_bf16 = softmax_exp_row_bf16_for(simd_target_bit());
  const bool positional = a.modifiers.causal.enabled || a.modifiers.window > 0;
  const int64_t shift = causal_shift(a.modifiers.causal, L);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const bool dropout = a.dropout.p > 0.0;
  const float keep_scale = dropout ? static_cast<float>(1.0 / (1.0 - a.dropout.p)) : 1.0f;
  parallel_items(items, threads, R * S * (D + Dv), [&](int64_t it) {
    // This implicit task's own nthreads ICV: oneDNN runs the item's
    // products on this one thread (core/gemm.cpp's blocks do the same).
    omp_set_num_threads(1);
    thread_local ThreadScratch scores_scratch, sums_scratch, acc_scratch, rows_scratch;
    thread_local BasicThreadScratch<bfloat16> weights_scratch, q_scratch;
    const int64_t n = it / blocks;
    int64_t b = it % blocks;
    if (a.modifiers.causal.enabled) b = blocks - 1 - b;  // heaviest first, as the flash kernel
    const int64_t i0 = b * R, rows = std::min(R, L - i0), g = kv_slice(n, H, Hkv);
    // The keys some row of the block sees: [first, last), in whole
    // kKeyAlign units (visible_key_range; all of them when some key has
    // no position).
    int64_t first = 0, last = S;
    if (positional) {
      const VisibleKeys vk = visible_key_range(a.modifiers.causal, a.modifiers.window, shift, S, i0, i0 + rows);
      if (vk.rest == S) {  // every key has a position: [begin, end) is all a row may see
        first = vk.begin / kKeyAlign * kKeyAlign;
        last = std::min(S, round_up(vk.end, kKeyAlign));
        if (vk.end <= vk.begin) first = last = 0;  // none: every row fully masked, below
      }
    }
    // A: the block's Q rows, dense.
    bfloat16* q = q_scratch.take(static_cast<std::size_t>(rows * D));
    dense_bf16_rows(a.narrow.q, true, ql, n, H, i0, rows, D, q);
    float* scores = scores_scratch.take(static_cast<std::size_t>(rows * kKeyBlock));
    bfloat16* p = weights_scratch.take(static_cast<std::size_t>(rows * kKeyBlock));
    float* sums = sums_scratch.take(static_cast<std::size_t>(rows * Dv));  // one chunk's P V
    float* acc = acc_scratch.take(static_cast<std::size_t>(rows * Dv));    // the running output
    float* state = rows_scratch.take(static_cast<std::size_t>(3 * rows));  // per row: m, l, alpha
    float *m = state, *l = state + rows, *alpha = state + 2 * rows;
    std::fill_n(acc, rows * Dv, 0.0f);
    std::fill_n(m, rows, neg_inf);
    std::fill_n(l, rows, 0.0f);
    const SliceModifiers<float> mods = slice_modifiers(a.modifiers, n, H, L, S);
    const bfloat16* k = ops.k + g * S * D;
    const bfloat16* v = ops.v + g * S * Dv;
    for (int64_t c = first; c < last; c += kKeyBlock) {
      const int64_t kc = std::min(kKeyBlock, last - c);
      // scores = scale · Q Kᵀ over the chunk's keys
      gemm(Trans::No, Trans::Yes, rows, kc, D, a.scale, q, D, k + c * D, D, 0.0f, scores, kc);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        float* row = scores + r * kc;
        float m_new = std::max(m[r], shape_scores(mods, S, i, c, row, kc));
        // A NaN score is not a hidden one: it makes the row NaN.
        if (m_new == neg_inf && !all_hidden(row, kc)) m_new = std::numeric_limits<float>::quiet_NaN();
        // The online softmax (the flash kernel's, chunk by chunk): the
        // running sum and output rescaled by alpha = exp(m_old − m_new).
        // P rounded to bf16 as it is made (without dropout), else after.
        float sum = 0.0f;
        bfloat16* pr = p + r * kc;
        if (m_new == neg_inf) {  // no key of the row seen yet
          std::fill_n(pr, kc, bfloat16{});
          alpha[r] = 1.0f;
        } else {
          alpha[r] = m[r] == neg_inf ? 0.0f : std::exp(m[r] - m_new);
          sum = dropout ? exp_row(row, static_cast<std::size_t>(kc), m_new)
                        : exp_row_bf16(row, static_cast<std::size_t>(kc), m_new, pr);
          m[r] = m_new;
          if (dropout) {
            for (int64_t j = 0; j < kc; ++j) row[j] = dropout_weight(a.dropout, n, i, c + j, row[j], keep_scale);
            round_rows(row, 1, kc, kc, static_cast<const bfloat16*>(nullptr), pr, kc, 1);
          }
        }
        l[r] = l[r] * alpha[r] + sum;
      }
      // sums = P V over the chunk, acc = acc·alpha + sums.
      gemm(Trans::No, Trans::No, rows, Dv, kc, 1.0f, p, kc, v + c * Dv, Dv, 0.0f, sums, Dv);
      for (int64_t r = 0; r < rows; ++r) {
        float* o = acc + r * Dv;
        const float* add = sums + r * Dv;
        const float s = alpha[r];
        for (int64_t d = 0; d < Dv; ++d) o[d] = o[d] * s + add[d];
      }
    }
    // out = acc / l, rounded once; lse = m + log l. A row that saw no key
    // is fully masked: masked_row_fill, lse −inf.
    for (int64_t r = 0; r < rows; ++r) {
      float* o = acc + r * Dv;
      const bool masked = m[r] == neg_inf;
      if (a.lse) a.lse[n * L + i0 + r] = masked ? neg_inf : m[r] + std::log(l[r]);
      if (masked) {
        std::fill_n(o, Dv, masked_row_fill<float>(a.masked_rows));
      } else {
        const float inv = 1.0f / l[r];
        for (int64_t d = 0; d < Dv; ++d) o[d] *= inv;
      }
    }
    round_rows(acc, rows, Dv, Dv, static_cast<const bfloat16*>(nullptr),
               static_cast<bfloat16*>(a.narrow.out) + (n / H) * ol.batch + (n % H) * ol.head + i0 * ol.row, ol.row, 1);
  });
}

// ---- the backward ----------------------------------------------------------
//
// The backward contract (AttentionBackwardArgs, src/contract/attention_args.hpp)
// on bf16 operands (bf16_operands: the float q, k, v, out and d_out hold bf16
// values, or d_out_bf16 and forward.narrow hold them) with its five products
// on oneDNN's bf16 matmul, in one pass over each (key chunk, query block):
//   x  (R × C, float32) = scale · Q_block K_chunkᵀ      the scores, recomputed
//   dp'(R × C, float32) = dO_block V_chunkᵀ
//   each row: the score rule, p = exp(s − lse) (float32), dropout's keep
//             decision, dx = p (dp − delta) · soft_cap_slope(x)
//   P' and dX rounded to bf16
//   d_vᵀ_chunk (Dv × C) += dO_blockᵀ P'          (dOᵀ kept per block, dense)
//   d_kᵀ_chunk (D × C)  += Q_blockᵀ dX           (Qᵀ kept per block, dense)
//   d_q_block  (R × D)  += dX K_chunk
// d_k and d_v are kept transposed so that every product's A and C are dense
// rows (oneDNN 2.6's AMX kernel takes no other; a transposed A ran on its
// gemm:jit), and are written out, d_k and d_q scaled by `scale`, when the
// chunk (d_k, d_v) or the group (d_q) is done.
//
// The work item is a whole K/V group (the K/V slice and the query slices
// that read it, in increasing n), on one thread: its d_k and d_v have one
// writer and its d_q rows too, so every gradient gets the same operations
// in the same order whatever the thread count, and the bits do not depend
// on it. The chunk-outer order keeps a chunk's d_kᵀ and d_vᵀ (2 · 128 KiB at
// D = 64) and its K, V rows in the core's L2 across the blocks.
//
// Precision: the products are exact and their sums float32, as the
// forward's. P' and dX are rounded to bf16 before the products that read
// them, as the flash backward's pair way does (the bound of
// docs/precision.md, "The two bf16 dot ways"); delta_i = <d_out_i, out_i>
// is a float32 sum of exact products, as there.
//
// Only the chunks a block sees are computed (visible_key_range, in
// kKeyAlign units), except under MaskedRowPolicy::NaN: a fully masked
// row's NaN reaches every key, as the contract says, so no chunk is
// skipped.
//
// Memory beyond the inputs and gradients, per item thread, kept (grown,
// never shrunk): dense bf16 copies of the group's K and V where their
// rows are not dense bf16 already, 2·S·(D + Dv) bytes, and, per query slice of the group (G = heads / kv_heads of them),
// Q, dO and their block transposes in bf16 and d_q in float32,
// G·L·(8·D + 4·Dv) bytes; R × C float32 scores and dp' and their bf16
// roundings (3 MiB), and the chunk's d_kᵀ, d_vᵀ. At G·D <= E that is at
// most about three of the module's (L, E) float32 copies per thread, and
// the modules make none of those copies for this way (they hand it their
// bf16 rows).

namespace {

// The transposes of a slice's dense rows (L × width), block by block: block
// b (rows i0 = b·R on, `rows` of them) at dst + i0·width as width × rows.
void block_transposes(const bfloat16* src, int64_t L, int64_t width, int64_t R, bfloat16* dst) {
  for (int64_t i0 = 0; i0 < L; i0 += R) {
    const int64_t rows = std::min(R, L - i0);
    bfloat16* t = dst + i0 * width;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t d = 0; d < width; ++d) t[d * rows + r] = src[(i0 + r) * width + d];
  }
}

}  // namespace

bool narrow_matmul_backward_serves_bf16(const AttentionArgs<float>& a) {
  if (a.weights != nullptr || a.q_len == 0 || a.kv_len == 0 || a.head_dim == 0 || a.value_dim == 0 || a.slices == 0)
    return false;
  const Way w = way_setting();
  if (w != Way::Auto) return w == Way::Matmul;
  return a.q_len >= kNarrowMatmulMinRows &&
         kv_slice_count(a.slices, a.heads, a.kv_heads_or_heads()) >= kNarrowMatmulBackwardMinGroups &&
         bf16_matmul_on_amx();
}

bool narrow_matmul_backward_serves(const AttentionBackwardArgs<float>& b) {
  const ComputeDtype dtype = b.forward.narrow.dtype;
  return b.bf16_operands && (dtype == ComputeDtype::F32 || dtype == ComputeDtype::BF16) &&
         narrow_matmul_backward_serves_bf16(b.forward);
}

void attention_backward_narrow_matmul(const AttentionBackwardArgs<float>& b) {
  const AttentionArgs<float>& a = b.forward;
  const int threads = requested_threads(a.num_threads);
  const bool bf16 = b.d_out_bf16 != nullptr;  // else the float32 widenings
  const int64_t H = a.heads, Hkv = a.kv_heads_or_heads(), groups = kv_slice_count(a.slices, H, Hkv);
  const int64_t G = a.slices / groups;  // query slices per K/V slice
  const int64_t L = a.q_len, S = a.kv_len, D = a.head_dim, Dv = a.value_dim;
  const SliceLayout ql = resolve_layout(a.q_layout, H, L, D);
  const SliceLayout kl = resolve_layout(a.k_layout, Hkv, S, D);
  const SliceLayout vl = resolve_layout(a.v_layout, Hkv, S, Dv);
  const SliceLayout ol = resolve_layout(a.out_layout, H, L, Dv);
  const int64_t R = std::min(kBlockRows, L), C = std::min(kKeyBlock, S);
  const ExpRow<float> exp_row = exp_row_for_current_target<float>();
  const BackwardRowBf16Fn backward_row = backward_row_bf16_for(simd_target_bit());
  const bool positional = (a.modifiers.causal.enabled || a.modifiers.window > 0) &&
                          a.masked_rows != MaskedRowPolicy::NaN;
  const int64_t shift = causal_shift(a.modifiers.causal, L);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const bool dropout = a.dropout.p > 0.0;
  const float keep_scale = dropout ? static_cast<float>(1.0 / (1.0 - a.dropout.p)) : 1.0f;
  const bool capped = a.modifiers.softcap > 0.0f;
  const void* q_src = bf16 ? a.narrow.q : a.q;
  const void* k_src = bf16 ? a.narrow.k : a.k;
  const void* v_src = bf16 ? a.narrow.v : a.v;
  const void* o_src = bf16 ? a.narrow.out : a.out;
  const void* do_src = bf16 ? static_cast<const void*>(b.d_out_bf16) : b.d_out;
  parallel_items(groups, threads, 5 * G * L * S * (D + Dv) / 2, [&](int64_t g) {
    omp_set_num_threads(1);  // oneDNN runs the item's products on this thread
    thread_local BasicThreadScratch<bfloat16> k_scratch, v_scratch, q_scratch, do_scratch, qt_scratch, dot_scratch,
        p_scratch, dx_scratch;
    thread_local ThreadScratch dq_scratch, delta_scratch, x_scratch, dp_scratch, slope_scratch, dkt_scratch,
        dvt_scratch;
    const auto n_ = [](int64_t x) { return static_cast<std::size_t>(x); };
    // The group's K and V as dense bf16 rows: in place where the bf16
    // operand's rows are dense already (a contiguous call), else copied.
    const auto kv_rows = [&](const void* src, const SliceLayout& l, int64_t width,
                             BasicThreadScratch<bfloat16>& scratch) -> const bfloat16* {
      if (bf16 && l.row == width) return slice_rows(src, l, g, Hkv);
      bfloat16* copy = scratch.take(n_(S * width));
      dense_bf16_rows(src, bf16, l, g, Hkv, 0, S, width, copy);
      return copy;
    };
    const bfloat16* k = kv_rows(k_src, kl, D, k_scratch);
    const bfloat16* v = kv_rows(v_src, vl, Dv, v_scratch);
    // Per query slice t of the group: Q and dO as dense rows and as block
    // transposes, delta, and d_q's float32 sums.
    bfloat16* q = q_scratch.take(n_(G * L * D));
    bfloat16* d_o = do_scratch.take(n_(G * L * Dv));
    bfloat16* qt = qt_scratch.take(n_(G * L * D));
    bfloat16* dot = dot_scratch.take(n_(G * L * Dv));
    float* dq = dq_scratch.take(n_(G * L * D));
    float* delta = delta_scratch.take(n_(G * L));
    std::fill_n(dq, G * L * D, 0.0f);
    for (int64_t t = 0; t < G; ++t) {
      const int64_t n = group_query_slice(g, t, H, Hkv);
      dense_bf16_rows(q_src, bf16, ql, n, H, 0, L, D, q + t * L * D);
      dense_bf16_rows(do_src, bf16, ol, n, H, 0, L, Dv, d_o + t * L * Dv);
      block_transposes(q + t * L * D, L, D, R, qt + t * L * D);
      block_transposes(d_o + t * L * Dv, L, Dv, R, dot + t * L * Dv);
      // delta_i = <d_out_i, out_i> in float32 (the forward's out, rounded).
      const int64_t offset = slice_offset(ol, n, H);
      for (int64_t i = 0; i < L; ++i) {
        const bfloat16* dor = d_o + (t * L + i) * Dv;
        float sum = 0.0f;
        if (bf16) {
          const bfloat16* o = static_cast<const bfloat16*>(o_src) + offset + i * ol.row;
          for (int64_t d = 0; d < Dv; ++d) sum += to_float(dor[d]) * to_float(o[d]);
        } else {
          const float* o = static_cast<const float*>(o_src) + offset + i * ol.row;
          for (int64_t d = 0; d < Dv; ++d) sum += to_float(dor[d]) * o[d];
        }
        delta[t * L + i] = sum;
      }
    }
    float* x = x_scratch.take(n_(R * C));
    float* dp = dp_scratch.take(n_(R * C));
    float* slope = capped ? slope_scratch.take(n_(C)) : nullptr;
    bfloat16* p16 = p_scratch.take(n_(R * C));
    bfloat16* dx16 = dx_scratch.take(n_(R * C));
    float* dkt = dkt_scratch.take(n_(D * C));
    float* dvt = dvt_scratch.take(n_(Dv * C));
    for (int64_t c0 = 0; c0 < S; c0 += C) {
      const int64_t c1 = std::min(S, c0 + C);
      std::fill_n(dkt, D * (c1 - c0), 0.0f);
      std::fill_n(dvt, Dv * (c1 - c0), 0.0f);
      for (int64_t t = 0; t < G; ++t) {
        const int64_t n = group_query_slice(g, t, H, Hkv);
        const SliceModifiers<float> mods = slice_modifiers(a.modifiers, n, H, L, S);
        for (int64_t i0 = 0; i0 < L; i0 += R) {
          const int64_t rows = std::min(R, L - i0);
          // A block that sees no key of the chunk skips it; one that sees
          // some computes the whole chunk (its hidden keys' p and dx are 0),
          // so that d_kᵀ and d_vᵀ are dense C (oneDNN's AMX kernel takes no
          // column view of C; measured, a causal call's diagonal chunks
          // cost less so than on gemm:jit).
          if (positional) {
            const VisibleKeys vk = visible_key_range(a.modifiers.causal, a.modifiers.window, shift, S, i0, i0 + rows);
            if (vk.rest == S && (vk.end <= vk.begin || vk.end <= c0 || vk.begin >= c1)) continue;
          }
          const int64_t j0 = c0, kc = c1 - c0;
          const bfloat16* qb = q + (t * L + i0) * D;
          const bfloat16* dob = d_o + (t * L + i0) * Dv;
          // x = scale · Q Kᵀ and dp' = dO Vᵀ over the chunk
          gemm(Trans::No, Trans::Yes, rows, kc, D, a.scale, qb, D, k + j0 * D, D, 0.0f, x, kc);
          gemm(Trans::No, Trans::Yes, rows, kc, Dv, 1.0f, dob, Dv, v + j0 * Dv, Dv, 0.0f, dp, kc);
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = i0 + r;
            float* xr = x + r * kc;
            float* dpr = dp + r * kc;
            const float lse = b.lse[n * L + i];
            const float dl = delta[t * L + i];
            if (capped)
              for (int64_t j = 0; j < kc; ++j) slope[j] = soft_cap_slope(a.modifiers.softcap, xr[j]);
            // p = exp(s − lse): the forward's softmax; a fully masked row
            // was filled with masked_row_fill. s − lse is clamped at 0, as
            // the flash backward does: recomputed in another order than the
            // forward's sum, a score may pass lse by a rounding, and the
            // exp's argument must not (a NaN stays NaN, −inf gives 0).
            if (lse != neg_inf) apply_score_rule(mods, S, i, j0, xr, kc);
            if (lse != neg_inf && !dropout && !capped) {
              // P' = p and dX = p (dp − delta), rounded to bf16, in one pass.
              backward_row(xr, dpr, n_(kc), lse, dl, p16 + r * kc, dx16 + r * kc);
              continue;
            }
            if (lse == neg_inf) {
              std::fill_n(xr, kc, masked_row_fill<float>(a.masked_rows));
            } else {
              for (int64_t j = 0; j < kc; ++j) xr[j] = std::min(xr[j] - lse, 0.0f);
              (void)exp_row(xr, n_(kc), 0.0f);
            }
            for (int64_t j = 0; j < kc; ++j) {
              const float pj = xr[j];
              const bool keep = !dropout || dropout_keep(a.dropout, n, i, j0 + j);
              const float dpj = keep ? dpr[j] * keep_scale : 0.0f;
              xr[j] = keep ? pj * keep_scale : 0.0f;
              dpr[j] = pj * (dpj - dl) * (capped ? slope[j] : 1.0f);
            }
            // P' and dX rounded to bf16.
            round_rows(xr, 1, kc, kc, static_cast<const bfloat16*>(nullptr), p16 + r * kc, kc, 1);
            round_rows(dpr, 1, kc, kc, static_cast<const bfloat16*>(nullptr), dx16 + r * kc, kc, 1);
          }
          // The three products that read P' and dX.
          gemm(Trans::No, Trans::No, Dv, kc, rows, 1.0f, dot + (t * L + i0) * Dv, rows, p16, kc, 1.0f,
               dvt, kc);
          gemm(Trans::No, Trans::No, D, kc, rows, 1.0f, qt + (t * L + i0) * D, rows, dx16, kc, 1.0f,
               dkt, kc);
          gemm(Trans::No, Trans::No, rows, D, kc, 1.0f, dx16, kc, k + j0 * D, D, 1.0f, dq + (t * L + i0) * D, D);
        }
      }
      // The chunk's d_k (scaled) and d_v rows, transposed back.
      const int64_t ldt = c1 - c0;
      float* dk = b.d_k + (g / Hkv) * kl.batch + (g % Hkv) * kl.head;
      float* dv = b.d_v + (g / Hkv) * vl.batch + (g % Hkv) * vl.head;
      for (int64_t j = c0; j < c1; ++j) {
        for (int64_t d = 0; d < D; ++d) dk[j * kl.row + d] = a.scale * dkt[d * ldt + (j - c0)];
        for (int64_t d = 0; d < Dv; ++d) dv[j * vl.row + d] = dvt[d * ldt + (j - c0)];
      }
    }
    for (int64_t t = 0; t < G; ++t) {
      const int64_t n = group_query_slice(g, t, H, Hkv);
      float* dqo = b.d_q + (n / H) * ql.batch + (n % H) * ql.head;
      for (int64_t i = 0; i < L; ++i)
        for (int64_t d = 0; d < D; ++d) dqo[i * ql.row + d] = a.scale * dq[(t * L + i) * D + d];
    }
  });
}

void narrow_attention_force(const std::string& name) {
  g_forced.store(static_cast<int>(parse_way(name, "narrow_attention_force")), std::memory_order_relaxed);
}

std::string narrow_attention_current() {
  const Way w = way_setting();
  const std::string impl = bf16_matmul_implementation();
  if (w == Way::Flash) return "flash (forced)";
  if (w == Way::Matmul)
    return "matmul (forced; " +
           (impl.empty() ? std::string("oneDNN has no bf16 matmul on this CPU: the products widen to float32")
                         : "oneDNN's bf16 matmul: " + impl) +
           ")";
  if (impl.empty()) return "flash (auto: oneDNN has no bf16 matmul on this CPU)";
  if (!bf16_matmul_on_amx()) return "flash (auto: oneDNN's bf16 matmul is " + impl + ", not AMX)";
  return "matmul (auto, for bf16 calls of at least " + std::to_string(kNarrowMatmulMinRows) +
         " query rows, a backward also over at least " + std::to_string(kNarrowMatmulBackwardMinGroups) +
         " K/V slices: oneDNN's bf16 matmul runs on AMX (" + impl + "))";
}

void check_narrow_attention_environment() { (void)env_way(); }

}  // namespace multihead::detail
