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
// again); per item thread, R × C float32 scores and bf16 weights, 2 R × Dv
// float32 sums and R × D bf16 queries.
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

Way parse_way(const std::string& name, const std::string& what) {
  if (name.empty() || name == "auto") return Way::Auto;
  if (name == "flash") return Way::Flash;
  if (name == "matmul") return Way::Matmul;
  throw Error(Error::Kind::Value, what + ": expected auto, flash or matmul, got " + quote_input(name));
}

Way env_way() {
  static const Way way = [] {
    const char* env = std::getenv("MULTIHEAD_NARROW_ATTENTION");
    return parse_way(env == nullptr ? "" : env, "MULTIHEAD_NARROW_ATTENTION");
  }();
  return way;
}

std::atomic<int> g_forced{static_cast<int>(Way::Auto)};

Way way_setting() {
  const auto forced = static_cast<Way>(g_forced.load(std::memory_order_relaxed));
  return forced != Way::Auto ? forced : env_way();
}

// ---- the operands ----------------------------------------------------------

const bfloat16* slice_rows(const void* base, const SliceLayout& l, int64_t n, int64_t heads) {
  return static_cast<const bfloat16*>(base) + (n / heads) * l.batch + (n % heads) * l.head;
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
    parallel_items(kv_slices, threads, S * width, [&](int64_t g) {
      const bfloat16* from = slice_rows(src, l, g, Hkv);
      for (int64_t j = 0; j < S; ++j)
        std::memcpy(copy + (g * S + j) * width, from + j * l.row, static_cast<std::size_t>(width) * sizeof(bfloat16));
    });
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
    // A: the block's Q rows, dense (oneDNN's AMX matmul takes only dense
    // rows of A; strided ones ran on its gemm:jit at a quarter of the speed).
    const bfloat16* q_rows = slice_rows(a.narrow.q, ql, n, H) + i0 * ql.row;
    bfloat16* q = q_scratch.take(static_cast<std::size_t>(rows * D));
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(q + r * D, q_rows + r * ql.row, static_cast<std::size_t>(D) * sizeof(bfloat16));
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
        float sum = 0.0f;
        if (m_new == neg_inf) {  // no key of the row seen yet
          std::fill_n(row, kc, 0.0f);
          alpha[r] = 1.0f;
        } else {
          alpha[r] = m[r] == neg_inf ? 0.0f : std::exp(m[r] - m_new);
          sum = exp_row(row, static_cast<std::size_t>(kc), m_new);
          m[r] = m_new;
        }
        l[r] = l[r] * alpha[r] + sum;
        if (dropout)
          for (int64_t j = 0; j < kc; ++j) row[j] = dropout_weight(a.dropout, n, i, c + j, row[j], keep_scale);
      }
      // P rounded to bf16, then sums = P V over the chunk, acc = acc·alpha + sums.
      round_rows(scores, rows, kc, kc, static_cast<const bfloat16*>(nullptr), p, kc, 1);
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
         " query rows: oneDNN's bf16 matmul runs on AMX (" + impl + "))";
}

void check_narrow_attention_environment() { (void)env_way(); }

}  // namespace multihead::detail
