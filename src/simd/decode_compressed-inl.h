// src/simd/decode_compressed-inl.h: attention of a few query rows over a
// KV cache of any dtype (float32, or compressed: bf16, f16, int8 with
// per-block scales), compiled once per Highway target by
// src/simd/decode_compressed.cpp. One kernel decodes every cache dtype; only
// the widening (WidenF32 … WidenInt8 below) differs, and, for the bf16
// module over a bf16 cache, the products (bf16's pair way, below).
//
// Legend (decode_compressed.hpp): G query heads per K/V head, L queries, S
// keys, D head width, N float lanes of the target.
//
// The cache is read where it lies and widened in registers: each K row is
// loaded D/N vectors at a time in its own type, widened to float32 (core/narrow_lanes-inl.h)
// (float32: as loaded; int8: converted, times its block's scale) and multiplied into the rows'
// dot products at once, so a K/V head is read once for all the query rows
// of its group that share the call (in chunks of kDecodeMaxRows, each block
// of keys taken by every chunk while it is in L1/L2). Nothing of the
// cache is written back as float32. Softmax is FlashAttention's online form
// (Dao et al. 2022) over blocks of kKeyBlock keys, all in float32: the
// block's scores, the running max m and sum l per row, the output
// accumulator rescaled by exp(m_old − m_new) when the max grows. The score
// rules are src/contract/score_rule.hpp's: each row's visible keys from
// visible_key_range, soft-cap and ALiBi through modified_score.
//
// Columns D − D mod N … D − 1 (when N does not divide D) go through the
// scalar widening of narrow_types.hpp, which equals the vector one.
//
// A bf16 module over a bf16 cache has a second way, bf16's pair way
// (PairsBf16, chosen by kernels/decode_compressed.cpp as the flash kernel
// chooses its Bf16Way::Dot): QKᵀ and PV on bf16 pairs with vdpbf16ps
// (bf16_compute-inl.h's PairDot), two products per float32 lane per
// instruction, on the cache's rows as they lie. A score pairs columns 2c and
// 2c + 1 of q (rounded to bf16: exact, as the module's q is bf16) and of the
// K row, which is how both lie in memory (2N columns a step, N float lanes:
// the way is taken only where 2N divides D). PV pairs keys j and j + 1: the
// probabilities are rounded to bf16 and paired down the keys, V's two rows
// interleaved in registers (InterleaveLower/Upper, per 128-bit block), so
// that each row's accumulator holds its columns in the order PairColumn
// gives, put back in place when the row is written. What it changes from the
// widening way: the summation order (pairs), P rounded to bf16 before PV
// (the sum l keeps P in float32, as the flash kernel's pair way does), and
// vdpbf16ps's flush of denormal inputs to zero. At 32 query rows per K/V
// head the decode is bound by arithmetic, not bytes, and this halves the
// multiply-add instructions (docs/decoding.md, "bf16's pair way").

// Per-target include guard (Highway's pattern for -inl.h files).
#if defined(MULTIHEAD_SIMD_DECODE_COMPRESSED_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MULTIHEAD_SIMD_DECODE_COMPRESSED_INL_H_
#undef MULTIHEAD_SIMD_DECODE_COMPRESSED_INL_H_
#else
#define MULTIHEAD_SIMD_DECODE_COMPRESSED_INL_H_
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "contract/score_rule.hpp"
#include "hwy/cache_control.h"
#include "core/narrow_lanes-inl.h"
#include "hwy/highway.h"
#include "simd/bf16_compute-inl.h"
#include "simd/decode_compressed.hpp"
#include "simd/exp2-inl.h"
#include "simd/narrow_types.hpp"
#include "simd/targets.hpp"

HWY_BEFORE_NAMESPACE();
namespace multihead::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Keys per online-softmax block: the block's scores of 8 rows are 2 KiB, and
// its K and V rows (64·D narrow values) stay in L1/L2 between the two passes.
inline constexpr int64_t kKeyBlock = 64;

// The widening of each cache dtype: Vector(df, row, c, scales) is columns
// c … c + N − 1 of a K/V row (c a multiple of N), Scalar(row, c, scales)
// column c. `scales` is the row's int8 block scales (unused otherwise).
// float32 (the native cache): a plain load.
struct WidenF32 {
  using Elem = float;
  static constexpr bool kPairWay = false;
  static VF32 Vector(DF32 df, const Elem* row, int64_t c, const float*) { return hn::LoadU(df, row + c); }
  static float Scalar(const Elem* row, int64_t c, const float*) { return row[c]; }
};
struct WidenBf16 {
  using Elem = uint16_t;
  static constexpr bool kPairWay = false;
  static VF32 Vector(DF32 df, const Elem* row, int64_t c, const float*) {
    return LoadWidenBf16(df, reinterpret_cast<const bfloat16*>(row + c));
  }
  static float Scalar(const Elem* row, int64_t c, const float*) { return bfloat16_bits_to_float(row[c]); }
};
struct WidenF16 {
  using Elem = uint16_t;
  static constexpr bool kPairWay = false;
  static VF32 Vector(DF32 df, const Elem* row, int64_t c, const float*) {
    return LoadWidenF16(df, reinterpret_cast<const float16*>(row + c));
  }
  static float Scalar(const Elem* row, int64_t c, const float*) { return float16_bits_to_float(row[c]); }
};
// N divides the block of 32 on every target (N = 1, 4, 8 or 16 floats), so
// the N columns from c all lie in block c / 32.
struct WidenInt8 {
  using Elem = int8_t;
  static constexpr bool kPairWay = false;
  static VF32 Vector(DF32 df, const Elem* row, int64_t c, const float* scales) {
    const hn::Rebind<int8_t, DF32> d8;
    const hn::Rebind<int32_t, DF32> d32;
    const VF32 q = hn::ConvertTo(df, hn::PromoteTo(d32, hn::LoadU(d8, row + c)));
    return hn::Mul(q, hn::Set(df, scales[c / kInt8Block]));
  }
  static float Scalar(const Elem* row, int64_t c, const float* scales) {
    return static_cast<float>(row[c]) * scales[c / kInt8Block];
  }
};

// bf16's pair way over a bf16 cache (header): the cache's rows read as bf16
// pairs; Scalar (the tail columns) is the widening's. kNative: vdpbf16ps,
// else Highway's widening of the same pairs (PairDot).
template <bool kNativeDot>
struct PairsBf16 : WidenBf16 {
  static constexpr bool kPairWay = true;
  static constexpr bool kNative = kNativeDot;
};

// One query row's view and its online-softmax state.
struct DecodeRow {
  const float* q;
  const uint16_t* qb;  // the pair way: q rounded to bf16 (its bits), else nullptr
  float* out;
  float* acc;  // [D], the unnormalised output
  float* lse;  // or nullptr
  SliceModifiers<float> modifiers;
  int64_t i;                  // query index
  int64_t begin, end, rest;   // visible keys: [begin, end) ∪ [rest, S)
  bool plain;                 // no soft-cap or ALiBi: the score is the scaled dot
  float m, l;                 // running max and sum
};

// The K side of a score, one way for every W: ScoreColumns(df) columns of q
// and of a K row at a time (N, or 2N as bf16 pairs), QueryVector and
// KeyVector load them, ScoreStep multiplies them into a float32
// accumulator, QueryAt is column c of q for the scalar tail.
template <class W>
HWY_INLINE int64_t ScoreColumns(DF32 df) {
  return static_cast<int64_t>(hn::Lanes(df)) * (W::kPairWay ? 2 : 1);
}
template <class W>
HWY_INLINE auto QueryVector(DF32 df, const DecodeRow& row, int64_t c) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (W::kPairWay) {
    return hn::BitCast(hn::RebindToUnsigned<DF32>(), hn::LoadU(hn::Repartition<uint16_t, DF32>(), row.qb + c));
  } else
#endif
  {
    return hn::LoadU(df, row.q + c);
  }
}
template <class W>
HWY_INLINE auto KeyVector(DF32 df, const typename W::Elem* krow, int64_t c, const float* scales) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (W::kPairWay) {
    return hn::BitCast(hn::RebindToUnsigned<DF32>(), hn::LoadU(hn::Repartition<uint16_t, DF32>(), krow + c));
  } else
#endif
  {
    return W::Vector(df, krow, c, scales);
  }
}
template <class W, class VQ, class VK>
HWY_INLINE VF32 ScoreStep(DF32 df, VQ q, VK k, VF32 acc) {
  if constexpr (W::kPairWay) {
    return PairDot<W::kNative>(df, q, k, acc);
  } else {
    return hn::MulAdd(q, k, acc);
  }
}
template <class W>
HWY_INLINE float QueryAt(const DecodeRow& row, int64_t c) {
  if constexpr (W::kPairWay) {
    return bfloat16_bits_to_float(row.qb[c]);
  } else {
    return row.q[c];
  }
}

// Where the pair way keeps column c of a row's accumulator: position p of a
// block of 2N (the block's first column c0 = p − p mod 2N) holds column
// c0 + 8·(l / 4) + 4·h + l mod 4, l = p mod N, h = 1 for the upper half
// (InterleaveLower/Upper of 16-bit lanes pair the low/high four columns of
// each 128-bit block). N is a multiple of 4 on every target that pairs.
inline int64_t PairColumn(int64_t p, int64_t N) {
  const int64_t step = 2 * N;
  const int64_t c0 = p / step * step, w = p % step, h = w / N, l = w % N;
  return c0 + 8 * (l / 4) + 4 * h + l % 4;
}

// Independent accumulators per row, so that few rows still keep enough
// multiply-adds in flight (an FMA's latency is ~4 cycles, and one row's
// chain alone would wait on it): R·kSplit <= 8 registers. (DotBlock's
// four-key path has its own count, kFourKeyRows.)
template <int R>
inline constexpr int kSplit = R >= 4 ? 1 : (R >= 2 ? 2 : 4);

// The lane sums of a0 … a3, stored to out[0 … 3]. One key's reduction alone
// (SumOfLanes, a shuffle and an add per halving, then a broadcast) cost a
// third of DotBlock's time at one query row per K/V head (perf, int8 cache);
// four at once share the shuffles: interleaving pairs of vectors adds their
// lanes crosswise, so that each 128-bit block ends with [a0, a1, a2, a3]'s
// partial sums, and the blocks are then added by halves.
#if HWY_TARGET != HWY_SCALAR
template <class D>
HWY_INLINE void StoreBlockSums(D d, hn::Vec<D> t, float* HWY_RESTRICT out) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    StoreBlockSums(dh, hn::Add(hn::LowerHalf(dh, t), hn::UpperHalf(dh, t)), out);
  } else {
    hn::StoreU(t, d, out);
  }
}
#endif
HWY_INLINE void StoreSumsOfFour(VF32 a0, VF32 a1, VF32 a2, VF32 a3, float* HWY_RESTRICT out) {
#if HWY_TARGET == HWY_SCALAR
  out[0] = hn::GetLane(a0), out[1] = hn::GetLane(a1), out[2] = hn::GetLane(a2), out[3] = hn::GetLane(a3);
#else
  const DF32 df;
  const hn::Repartition<uint64_t, DF32> dd;  // pairs of lanes, moved as one
  // Per 128-bit block: s01 = [a0₀+a0₂, a1₀+a1₂, a0₁+a0₃, a1₁+a1₃], s23 alike.
  const VF32 s01 = hn::Add(hn::InterleaveLower(df, a0, a1), hn::InterleaveUpper(df, a0, a1));
  const VF32 s23 = hn::Add(hn::InterleaveLower(df, a2, a3), hn::InterleaveUpper(df, a2, a3));
  const auto e01 = hn::BitCast(dd, s01), e23 = hn::BitCast(dd, s23);
  // Per block: [Σ a0, Σ a1, Σ a2, Σ a3] over the block's four lanes.
  const VF32 t = hn::Add(hn::BitCast(df, hn::InterleaveLower(dd, e01, e23)),
                         hn::BitCast(df, hn::InterleaveUpper(dd, e01, e23)));
  StoreBlockSums(df, t, out);
#endif
}

// For a float32 or 16-bit cache the prefetches ask for L2 (prefetcht2 on
// x86), not L1 (hwy::Prefetch, prefetcht0): a line on its way to L1 holds
// one of the core's few L1 miss buffers for the whole trip from DRAM (perf,
// one thread, int8 cache: a third of the dot products' samples sat on
// prefetcht0 instructions). With two threads L2 took float32, bf16 and f16
// caches 8-30% faster; the int8 cache keeps L1, where L2 measured no faster
// at 32 K/V heads and 6% slower at 8. docs/decoding.md has the A/B runs.
template <class W>
HWY_INLINE void PrefetchRow(const void* p) {
#if defined(__GNUC__) || defined(__clang__)
  if constexpr (sizeof(typename W::Elem) > 1) {
    __builtin_prefetch(p, 0, 1);  // read, locality 1: prefetcht2 on x86
    return;
  }
#endif
  hwy::Prefetch(p);
}

// Prefetches for key j: its V row (and scales), read column by column by
// AccumulateBlock (64 rows D elements apart: left to the hardware, those
// loads waited on memory for 80% of the time, perf, 32 query rows on one K/V
// head), and the K row (and scales) one block ahead, key j + kKeyBlock, below
// k_end. Without the K prefetch the int8 cache's K loads stalled on memory
// for half of DotBlock's samples at one row per K/V head (docs/decoding.md
// has the measurements).
template <class W>
HWY_INLINE void PrefetchKey(const typename W::Elem* k, const float* k_scales, const typename W::Elem* v,
                            const float* v_scales, int64_t blocks, int64_t D, int64_t j, int64_t k_end) {
  constexpr int64_t kLine = 64;  // bytes of a cache line
  const int64_t row_bytes = D * static_cast<int64_t>(sizeof(typename W::Elem));
  const char* v_row = reinterpret_cast<const char*>(v + j * D);
  for (int64_t b = 0; b < row_bytes; b += kLine) PrefetchRow<W>(v_row + b);
  if (v_scales) PrefetchRow<W>(v_scales + j * blocks);
  if (j + kKeyBlock < k_end) {
    const char* k_row = reinterpret_cast<const char*>(k + (j + kKeyBlock) * D);
    for (int64_t b = 0; b < row_bytes; b += kLine) PrefetchRow<W>(k_row + b);
    if (k_scales) PrefetchRow<W>(k_scales + (j + kKeyBlock) * blocks);
  }
}

// Query rows DotFourKeys takes at once: 4·R accumulators, R query vectors
// and a K vector must fit the registers, 32 on AVX-512 (21 at R = 4), 16 on
// AVX2 and SSE4 (11 at R = 2). With R = 4 on AVX2 (spilling), the int8 and
// bf16 caches at 8 of 32 K/V heads took 3.6 and 3.7 ms a step against 3.3 and
// 3.3 one key at a time (MULTIHEAD_SIMD_TARGET=AVX2, Zen 5, median of 3
// alternated rounds).
inline constexpr int kFourKeyRows = HWY_TARGET <= HWY_AVX3 ? 4 : 2;

// Groups of kFourKeyRows up to which DotBlock takes four keys at a time,
// per cache element type W: a chunk of R rows runs DotFourKeys on
// ceil(R / kFourKeyRows) groups of rows, each re-reading the four K rows
// (from L1). On AVX-512 with a 16-bit or int8 cache, 8 rows one key at a
// time spent about as many instructions on the 8 lane sums per key
// (SumOfLanes: a shuffle and an add per halving) as on the multiply-adds;
// two groups of four share the sums' shuffles. 32 query rows on one K/V
// head, S 16384, one thread (multihead_bench_kernels DecodeCompressed,
// kv_heads:1, AMD Zen 4, median of 3 alternated rounds, the vector softmax
// below on both sides): bf16 3.63 ms against 4.35 in one group, f16 3.75
// against 4.12, int8 3.85 against 4.18. With a float32 cache two groups
// measured slower (7.6-8.4 against 4.5-6.6 ms), so float32 keeps one; so do
// the 16-register targets, where more groups re-read K too often.
template <class W>
inline constexpr int kFourKeyGroups = HWY_TARGET <= HWY_AVX3 && sizeof(typename W::Elem) < 4 ? 2 : 1;

// tail[r] = Σ_{Dv <= c < D} q_r[c] · k[c], in column order: the scalar tail
// of a score (columns D − D mod N …, none when N divides D), the same sum
// whichever way (DotFourKeys or one key at a time) the key takes.
template <int R, class W>
HWY_INLINE void TailDots(const DecodeRow* rows, const typename W::Elem* krow, const float* kscales, int64_t Dv,
                         int64_t D, float* HWY_RESTRICT tail) {
  for (int r = 0; r < R; ++r) tail[r] = 0.0f;
  for (int64_t c = Dv; c < D; ++c) {
    const float kc = W::Scalar(krow, c, kscales);
    for (int r = 0; r < R; ++r) tail[r] += QueryAt<W>(rows[r], c) * kc;
  }
}

// scores[r][jj … jj + 3] = <q_r, k_t> for the four K rows k_t = krow[t], r <
// R <= kFourKeyRows: one accumulator per row and key (the keys' chains are
// independent), the lanes summed by StoreSumsOfFour, then the scalar tail's
// columns (D − D mod ScoreColumns …) added. The same for every way W:
// QueryVector, KeyVector and ScoreStep are W's.
template <int R, class W>
HWY_INLINE void DotFourKeys(const DecodeRow* rows, const typename W::Elem* const krow[4], const float* const kscales[4],
                            int64_t D, int64_t jj, float (*scores)[kKeyBlock]) {
  const DF32 df;
  const int64_t N = ScoreColumns<W>(df), Dv = D / N * N;
  VF32 d[R][4];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < 4; ++t) d[r][t] = hn::Zero(df);
  for (int64_t c = 0; c < Dv; c += N) {
    decltype(QueryVector<W>(df, rows[0], 0)) q[R];
    for (int r = 0; r < R; ++r) q[r] = QueryVector<W>(df, rows[r], c);
    for (int t = 0; t < 4; ++t) {
      const auto kv = KeyVector<W>(df, krow[t], c, kscales[t]);
      for (int r = 0; r < R; ++r) d[r][t] = ScoreStep<W>(df, q[r], kv, d[r][t]);
    }
  }
  float tail[4][R];
  for (int t = 0; t < 4; ++t) TailDots<R, W>(rows, krow[t], kscales[t], Dv, D, tail[t]);
  for (int r = 0; r < R; ++r) {
    StoreSumsOfFour(d[r][0], d[r][1], d[r][2], d[r][3], scores[r] + jj);
    for (int t = 0; t < 4; ++t) scores[r][jj + t] += tail[t][r];
  }
}

// DotFourKeys over rows 0 … R − 1 in groups of kFourKeyRows (the last one
// shorter).
template <int R, class W>
HWY_INLINE void DotFourKeysGrouped(const DecodeRow* rows, const typename W::Elem* const krow[4],
                                   const float* const kscales[4], int64_t D, int64_t jj,
                                   float (*scores)[kKeyBlock]) {
  constexpr int G = R < kFourKeyRows ? R : kFourKeyRows;
  DotFourKeys<G, W>(rows, krow, kscales, D, jj, scores);
  if constexpr (R > G) DotFourKeysGrouped<R - G, W>(rows + G, krow, kscales, D, jj, scores + G);
}

// scores[r][jj] = <q_r, k_{j0 + jj}> for jj < jn. Up to kFourKeyRows ·
// kFourKeyGroups<W> rows: four keys at a time (DotFourKeysGrouped); more rows,
// or the last jn mod 4 keys: one key at a time, kSplit<R> accumulators per
// row. Either way a score is its vector lanes' sum plus the scalar tail's
// (columns D − D mod N …), the tail summed first; the two ways add the lanes
// in different orders, so a key's score may differ in its last bits between
// them. Which way a key takes depends on R, jn, W and the target only, so
// the bits do not depend on the thread count (chunks are cut by shape;
// DecodeRowsW).
template <int R, class W>
HWY_NOINLINE void DotBlock(const DecodeRow* rows, const typename W::Elem* k, const float* k_scales,
                           const typename W::Elem* v, const float* v_scales, int64_t blocks, int64_t D, int64_t j0,
                           int64_t jn, int64_t k_end, float (*scores)[kKeyBlock]) {
  const DF32 df;
  constexpr int A = kSplit<R>;
  const int64_t N = ScoreColumns<W>(df), Dv = D / N * N;
  int64_t jj = 0;
  if constexpr (R <= kFourKeyRows * kFourKeyGroups<W>) {
    for (; jj + 4 <= jn; jj += 4) {
      const typename W::Elem* krow[4];
      const float* kscales[4];
      for (int t = 0; t < 4; ++t) {
        const int64_t j = j0 + jj + t;
        PrefetchKey<W>(k, k_scales, v, v_scales, blocks, D, j, k_end);
        krow[t] = k + j * D;
        kscales[t] = k_scales ? k_scales + j * blocks : nullptr;
      }
      DotFourKeysGrouped<R, W>(rows, krow, kscales, D, jj, scores);
    }
  }
  for (; jj < jn; ++jj) {
    const int64_t j = j0 + jj;
    PrefetchKey<W>(k, k_scales, v, v_scales, blocks, D, j, k_end);
    const typename W::Elem* row = k + j * D;
    const float* scales = k_scales ? k_scales + j * blocks : nullptr;
    VF32 d[R][A];
    for (int r = 0; r < R; ++r)
      for (int s = 0; s < A; ++s) d[r][s] = hn::Zero(df);
    int64_t c = 0;
    for (; c + A * N <= Dv; c += A * N)
      for (int s = 0; s < A; ++s) {
        const auto kv = KeyVector<W>(df, row, c + s * N, scales);
        for (int r = 0; r < R; ++r) d[r][s] = ScoreStep<W>(df, QueryVector<W>(df, rows[r], c + s * N), kv, d[r][s]);
      }
    for (; c < Dv; c += N) {
      const auto kv = KeyVector<W>(df, row, c, scales);
      for (int r = 0; r < R; ++r) d[r][0] = ScoreStep<W>(df, QueryVector<W>(df, rows[r], c), kv, d[r][0]);
    }
    float tail[R];
    TailDots<R, W>(rows, row, scales, Dv, D, tail);
    for (int r = 0; r < R; ++r) {
      for (int s = 1; s < A; ++s) d[r][0] = hn::Add(d[r][0], d[r][s]);
      scores[r][jj] = hn::GetLane(hn::SumOfLanes(df, d[r][0])) + tail[r];
    }
  }
}

// acc_r += Σ_jj p[r][jj] · v_{j0 + jj}.
template <int R, class W>
HWY_NOINLINE void AccumulateBlock(DecodeRow* rows, const typename W::Elem* v, const float* v_scales, int64_t blocks,
                                  int64_t D, int64_t j0, int64_t jn, const float (*p)[kKeyBlock]) {
  const DF32 df;
  constexpr int A = kSplit<R>;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), Dv = D / N * N;
  const auto v_at = [&](int64_t jj, int64_t c) {
    return W::Vector(df, v + (j0 + jj) * D, c, v_scales ? v_scales + (j0 + jj) * blocks : nullptr);
  };
  for (int64_t c = 0; c < Dv; c += N) {
    VF32 a[R][A];
    for (int r = 0; r < R; ++r) {
      a[r][0] = hn::LoadU(df, rows[r].acc + c);
      for (int s = 1; s < A; ++s) a[r][s] = hn::Zero(df);
    }
    int64_t jj = 0;
    for (; jj + A <= jn; jj += A)
      for (int s = 0; s < A; ++s) {
        const VF32 vv = v_at(jj + s, c);
        for (int r = 0; r < R; ++r) a[r][s] = hn::MulAdd(hn::Set(df, p[r][jj + s]), vv, a[r][s]);
      }
    for (; jj < jn; ++jj) {
      const VF32 vv = v_at(jj, c);
      for (int r = 0; r < R; ++r) a[r][0] = hn::MulAdd(hn::Set(df, p[r][jj]), vv, a[r][0]);
    }
    for (int r = 0; r < R; ++r) {
      for (int s = 1; s < A; ++s) a[r][0] = hn::Add(a[r][0], a[r][s]);
      hn::StoreU(a[r][0], df, rows[r].acc + c);
    }
  }
  for (int64_t c = Dv; c < D; ++c)
    for (int64_t jj = 0; jj < jn; ++jj) {
      const float vc = W::Scalar(v + (j0 + jj) * D, c, v_scales ? v_scales + (j0 + jj) * blocks : nullptr);
      for (int r = 0; r < R; ++r) rows[r].acc[c] += p[r][jj] * vc;
    }
}

#if HWY_TARGET != HWY_SCALAR  // (one lane: no 16-bit pairs)
// bf16's pair way: acc_r += Σ_jj p̂[r][jj] · v_{j0 + jj}, p̂ the weights
// rounded to bf16 (pb, PackWeights), keys jj and jj + 1 paired: V's two rows
// interleaved in registers, each pair's two products and sums in one
// PairDot, the row's accumulator in PairColumn's order; with fewer than 4
// rows, kSplit<R> chains per row take the pairs in turn (one chain alone
// waits on each PairDot's latency: at one row per K/V head that made the pair
// way slower than the widening). A last odd key
// pairs with zeros (pb's entry past jn is 0, and the row past the block,
// possibly past the cache, is not read). D is a multiple of 2N
// (DecodeCompressedRows takes the pair way only then).
template <int R, class W>
HWY_NOINLINE void AccumulateBlockPairs(DecodeRow* rows, const uint16_t* v, int64_t D, int64_t j0, int64_t jn,
                                       const uint16_t (*pb)[kKeyBlock]) {
  const DF32 df;
  const hn::RebindToUnsigned<DF32> du;
  const hn::Repartition<uint16_t, DF32> d16;
  constexpr int A = kSplit<R>;  // chains per row and half: consecutive pairs of keys take turns
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), step = 2 * N;
  // Pair jj (keys jj, jj + 1) of the block into chain s of every row.
  const auto take = [&](int64_t c, int64_t jj, int s, VF32 (*lo)[A], VF32 (*hi)[A]) {
    const uint16_t* v0 = v + (j0 + jj) * D + c;
    const auto a = hn::LoadU(d16, v0);
    const auto b = jj + 1 < jn ? hn::LoadU(d16, v0 + D) : hn::Zero(d16);
    const auto pair_lo = hn::BitCast(du, hn::InterleaveLower(d16, a, b));
    const auto pair_hi = hn::BitCast(du, hn::InterleaveUpper(d16, a, b));
    for (int r = 0; r < R; ++r) {
      uint32_t p2;
      std::memcpy(&p2, pb[r] + jj, sizeof p2);  // p̂_jj low, p̂_jj+1 high
      const auto pp = hn::Set(du, p2);
      lo[r][s] = PairDot<W::kNative>(df, pp, pair_lo, lo[r][s]);
      hi[r][s] = PairDot<W::kNative>(df, pp, pair_hi, hi[r][s]);
    }
  };
  for (int64_t c = 0; c < D; c += step) {
    VF32 lo[R][A], hi[R][A];
    for (int r = 0; r < R; ++r) {
      lo[r][0] = hn::LoadU(df, rows[r].acc + c);
      hi[r][0] = hn::LoadU(df, rows[r].acc + c + N);
      for (int s = 1; s < A; ++s) lo[r][s] = hi[r][s] = hn::Zero(df);
    }
    int64_t jj = 0;
    for (; jj + 2 * A <= jn; jj += 2 * A)
      for (int s = 0; s < A; ++s) take(c, jj + 2 * s, s, lo, hi);
    for (; jj < jn; jj += 2) take(c, jj, 0, lo, hi);
    for (int r = 0; r < R; ++r) {
      for (int s = 1; s < A; ++s) {
        lo[r][0] = hn::Add(lo[r][0], lo[r][s]);
        hi[r][0] = hn::Add(hi[r][0], hi[r][s]);
      }
      hn::StoreU(lo[r][0], df, rows[r].acc + c);
      hn::StoreU(hi[r][0], df, rows[r].acc + c + N);
    }
  }
}

// pb[jj] = the bits of to_bfloat16(p[jj]) for the block's kKeyBlock weights
// (nearest even; 0 stays 0, so the keys past jn keep weight 0).
HWY_INLINE void PackWeights(const float* HWY_RESTRICT p, uint16_t* HWY_RESTRICT pb) {
  const DF32 df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const hn::Rebind<uint16_t, DF32> d16;
  const hn::RebindToSigned<DF32> di;
  for (int64_t jj = 0; jj < kKeyBlock; jj += N)
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, RoundToBf16Bits(df, hn::LoadU(df, p + jj)))), d16, pb + jj);
}

#endif  // HWY_TARGET != HWY_SCALAR

// The scores of one block become its weights exp(s − m_new) in place; m, l
// and acc are rescaled to the new max. A row that has seen only hidden keys
// so far keeps m = −inf and gets weights 0.
HWY_INLINE void SoftmaxBlock(DecodeRow& row, float scale, int64_t S, int64_t j0, int64_t jn, float* s, int64_t D) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const DF32 df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  float block_max = kNegInf;
  if (row.plain) {
    // score = scale · dot where visible, −inf elsewhere, N keys at a time:
    // the block's visible keys are [a, b) ∪ [c, jn) relative to j0 (the same
    // products and the same max, NaN included, as the scalar form below: 32
    // rows per K/V head spent a quarter of the decode kernel's time in that
    // loop, perf). Lanes from jn on are read but not used (BlockOfRows
    // zeroes them).
    const hn::RebindToSigned<DF32> di;
    const auto at = [&](int64_t x) { return static_cast<int32_t>(std::clamp<int64_t>(x - j0, 0, jn)); };
    // (x >= a as x > a − 1: Highway 1.0 has no signed-integer Ge on x86.)
    const auto a1 = hn::Set(di, at(row.begin) - 1), b = hn::Set(di, at(row.end));
    const auto c1 = hn::Set(di, at(row.rest) - 1), n = hn::Set(di, static_cast<int32_t>(jn));
    const VF32 vscale = hn::Set(df, scale), neg_inf = hn::Set(df, kNegInf);
    VF32 vmax = neg_inf;
    for (int64_t jj = 0; jj < kKeyBlock; jj += N) {
      const auto x = hn::Iota(di, static_cast<int32_t>(jj));
      const auto visible = hn::And(hn::Lt(x, n), hn::Or(hn::And(hn::Gt(x, a1), hn::Lt(x, b)), hn::Gt(x, c1)));
      const VF32 score = hn::IfThenElse(hn::RebindMask(df, visible), hn::Mul(vscale, hn::LoadU(df, s + jj)), neg_inf);
      hn::StoreU(score, df, s + jj);
      // fmax's rule: a NaN score does not become the max (Highway's Max
      // keeps or drops it by lane order); its weight exp(NaN) = NaN then
      // makes the row NaN, as with the scalar form.
      vmax = hn::Max(vmax, hn::IfThenElse(hn::IsNaN(score), neg_inf, score));
    }
    block_max = hn::GetLane(hn::MaxOfLanes(df, vmax));
  } else {
    for (int64_t jj = 0; jj < jn; ++jj) {
      s[jj] = modified_score(row.modifiers, S, row.i, j0 + jj, scale * s[jj]);
      block_max = std::fmax(block_max, s[jj]);
    }
    for (int64_t jj = jn; jj < kKeyBlock; ++jj) s[jj] = kNegInf;
  }
  const float m_new = std::fmax(row.m, block_max);
  if (m_new == kNegInf) {
    for (int64_t jj = 0; jj < kKeyBlock; ++jj) s[jj] = 0.0f;
    return;
  }
  if (m_new != row.m) {
    const float alpha = row.m == kNegInf ? 0.0f : std::exp(row.m - m_new);
    row.l *= alpha;
    for (int64_t c = 0; c < D; ++c) row.acc[c] *= alpha;
    row.m = m_new;
  }
  const VF32 log2e = hn::Set(df, 1.44269504088896341f), vm = hn::Set(df, m_new);
  VF32 sum = hn::Zero(df);
  for (int64_t jj = 0; jj < kKeyBlock; jj += N) {
    const VF32 p = Exp2NonPositive(df, hn::Mul(hn::Sub(hn::LoadU(df, s + jj), vm), log2e));
    hn::StoreU(p, df, s + jj);
    sum = hn::Add(sum, p);
  }
  row.l += hn::GetLane(hn::SumOfLanes(df, sum));
}

// One K/V slice's cache, as the kernel reads it.
template <class W>
struct SliceCache {
  const typename W::Elem *k, *v;
  const float *k_scales, *v_scales;  // int8 only
  int64_t blocks, D, S;
};

// Key block [j0, j0 + jn) for R rows: their scores, the online-softmax step
// and the weighted sum of V.
template <int R, class W>
void BlockOfRows(const SliceCache<W>& c, float scale, int64_t j0, int64_t jn, DecodeRow* rows) {
  HWY_ALIGN float s[R][kKeyBlock];
  if (jn < kKeyBlock)  // the scores past the last key: defined, never used
    for (int r = 0; r < R; ++r) std::fill(s[r] + jn, s[r] + kKeyBlock, 0.0f);
  DotBlock<R, W>(rows, c.k, c.k_scales, c.v, c.v_scales, c.blocks, c.D, j0, jn, c.S, s);
  for (int r = 0; r < R; ++r) SoftmaxBlock(rows[r], scale, c.S, j0, jn, s[r], c.D);
#if HWY_TARGET != HWY_SCALAR
  if constexpr (W::kPairWay) {
    HWY_ALIGN uint16_t pb[R][kKeyBlock];
    for (int r = 0; r < R; ++r) PackWeights(s[r], pb[r]);
    AccumulateBlockPairs<R, W>(rows, c.v, c.D, j0, jn, pb);
  } else
#endif
  {
    AccumulateBlock<R, W>(rows, c.v, c.v_scales, c.blocks, c.D, j0, jn, s);
  }
}

template <class W>
void BlockOf(int64_t count, const SliceCache<W>& c, float scale, int64_t j0, int64_t jn, DecodeRow* rows) {
  switch (count) {
    case 1: return BlockOfRows<1, W>(c, scale, j0, jn, rows);
    case 2: return BlockOfRows<2, W>(c, scale, j0, jn, rows);
    case 3: return BlockOfRows<3, W>(c, scale, j0, jn, rows);
    case 4: return BlockOfRows<4, W>(c, scale, j0, jn, rows);
    case 5: return BlockOfRows<5, W>(c, scale, j0, jn, rows);
    case 6: return BlockOfRows<6, W>(c, scale, j0, jn, rows);
    case 7: return BlockOfRows<7, W>(c, scale, j0, jn, rows);
    default: return BlockOfRows<8, W>(c, scale, j0, jn, rows);
  }
}

// The call's rows, cut from the first into chunks of kDecodeMaxRows (the
// last one shorter), over one grid of key blocks [64·b, 64·b + 64) ∩ [0, S):
// for each block that some row of the call sees, every chunk that sees it
// takes it (BlockOf) while its K/V rows are in L1/L2. So a group of 32 rows
// reads the cache once, not once per chunk, and a row's arithmetic depends
// only on its chunk and the grid, never on which chunks share the call:
// attention_forward_compressed may cut a group's chunks into calls by the
// thread count and the bits stay the same. A chunk's keys outside a row's
// range, inside a block it takes, get weight 0 (SoftmaxBlock's mask).
template <class W>
void DecodeRowsW(const AttentionArgs<float>& args, const CompressedKV& kv, int64_t kv_slice, DecodeRow* rows,
                 int64_t count) {
  using Elem = typename W::Elem;
  const int64_t D = args.head_dim, S = args.kv_len, blocks = int8_blocks(D);
  const SliceCache<W> c{static_cast<const Elem*>(kv.k) + kv_slice * kv.capacity * D,
                        static_cast<const Elem*>(kv.v) + kv_slice * kv.capacity * D,
                        kv.k_scales ? kv.k_scales + kv_slice * kv.capacity * blocks : nullptr,
                        kv.v_scales ? kv.v_scales + kv_slice * kv.capacity * blocks : nullptr,
                        blocks,
                        D,
                        S};
  // Each chunk's keys: [lo, hi) ∪ [rest, S) (rest, the position-less keys,
  // is the same for every row); a pass's, their union. A call of more than
  // kDecodeMaxCallChunks chunks (which attention_forward_compressed never
  // makes) runs as several passes, with the same bits.
  struct Chunk {
    int64_t first, count, lo, hi;
  };
  const int64_t rest = count > 0 ? rows[0].rest : S;
  for (int64_t pass_first = 0; pass_first < count; pass_first += kDecodeMaxCallChunks * kDecodeMaxRows) {
    const int64_t pass_end = std::min(count, pass_first + kDecodeMaxCallChunks * kDecodeMaxRows);
    std::array<Chunk, kDecodeMaxCallChunks> chunks;
    int64_t n_chunks = 0, lo = S, hi = 0;
    for (int64_t first = pass_first; first < pass_end; first += kDecodeMaxRows) {
      Chunk ch{first, std::min(kDecodeMaxRows, pass_end - first), S, 0};
      for (int64_t r = first; r < first + ch.count; ++r) {
        ch.lo = std::min(ch.lo, rows[r].begin);
        ch.hi = std::max(ch.hi, rows[r].end);
      }
      lo = std::min(lo, ch.lo);
      hi = std::max(hi, ch.hi);
      chunks[static_cast<std::size_t>(n_chunks++)] = ch;
    }
    const auto visit = [&](int64_t b) {
      const int64_t j0 = b * kKeyBlock, j1 = std::min(j0 + kKeyBlock, S);
      for (int64_t i = 0; i < n_chunks; ++i) {
        const Chunk& ch = chunks[static_cast<std::size_t>(i)];
        if ((ch.lo < j1 && j0 < ch.hi) || rest < j1) BlockOf<W>(ch.count, c, args.scale, j0, j1 - j0, rows + ch.first);
      }
    };
    const int64_t block_hi = lo < hi ? (hi + kKeyBlock - 1) / kKeyBlock : 0;
    if (lo < hi)
      for (int64_t b = lo / kKeyBlock; b < block_hi; ++b) visit(b);
    for (int64_t b = std::max(rest / kKeyBlock, block_hi); b < (S + kKeyBlock - 1) / kKeyBlock; ++b) visit(b);
  }
}

// decode_compressed.hpp's DecodeCompressedKernel::rows. The pair way runs
// on a bf16 cache where this target can pair 16-bit lanes (not HWY_SCALAR,
// whose one lane cannot); vdpbf16ps only on the AVX-512 targets.
inline void DecodeCompressedRows(const AttentionArgs<float>& args, const CompressedKV& kv, int64_t kv_slice,
                                 int64_t row_begin, int64_t row_end, DecodeWay way) {
  const int64_t H = args.heads, Hkv = args.kv_heads_or_heads(), L = args.q_len, S = args.kv_len;
  const int64_t D = args.head_dim, count = row_end - row_begin;
  // vdpbf16ps only on a target that can issue it and a CPU that runs it,
  // whatever the caller asked; the pair way only where 2N divides D (else
  // the columns past the last 2N would go one at a time for every key: D 80
  // on AVX-512 would leave 16 of them, where the widening has none).
  if (way == DecodeWay::PairsNative && !(kHasDpbf16 && cpu_has_avx512_bf16())) way = DecodeWay::Pairs;
  if (D % (2 * static_cast<int64_t>(hn::Lanes(DF32()))) != 0) way = DecodeWay::Widen;
#if HWY_TARGET == HWY_SCALAR
  way = DecodeWay::Widen;
#endif
  const bool pairs = kv.dtype == KVCacheDType::BFloat16 && way != DecodeWay::Widen;
  std::vector<float> acc(static_cast<std::size_t>(count * D), 0.0f);
  std::vector<uint16_t> qb(pairs ? static_cast<std::size_t>(count * D) : 0);
  std::vector<DecodeRow> rows(static_cast<std::size_t>(count));
  const ScoreModifiers<float>& mod = args.modifiers;
  for (int64_t r = 0; r < count; ++r) {
    const int64_t rho = row_begin + r, i = rho % L, n = group_query_slice(kv_slice, rho / L, H, Hkv);
    DecodeRow& row = rows[r];
    row.q = slice_start(args.q, args.q_layout, n, H) + i * args.q_layout.row;
    row.out = slice_start(args.out, args.out_layout, n, H) + i * args.out_layout.row;
    row.acc = acc.data() + r * D;
    row.qb = nullptr;
    if (pairs) {
      uint16_t* qr = qb.data() + r * D;
      for (int64_t c = 0; c < D; ++c) qr[c] = float_to_bfloat16_bits(row.q[c]);
      row.qb = qr;
    }
    row.lse = args.lse ? args.lse + n * L + i : nullptr;
    row.modifiers = slice_modifiers(mod, n, H, L, S);
    row.i = i;
    const VisibleKeys keys = visible_key_range(mod.causal, mod.window, row.modifiers.shift, S, i, i + 1);
    row.begin = keys.begin;
    row.end = keys.end;
    row.rest = keys.rest;
    row.plain = !(mod.softcap > 0.0f) && mod.alibi_slopes == nullptr;
    row.m = -std::numeric_limits<float>::infinity();
    row.l = 0.0f;
  }
  switch (kv.dtype) {
    case KVCacheDType::Native: DecodeRowsW<WidenF32>(args, kv, kv_slice, rows.data(), count); break;
    case KVCacheDType::BFloat16:
#if HWY_TARGET != HWY_SCALAR
      if (way == DecodeWay::Pairs) {
        DecodeRowsW<PairsBf16<false>>(args, kv, kv_slice, rows.data(), count);
        break;
      }
      if constexpr (kHasDpbf16) {
        if (way == DecodeWay::PairsNative) {
          DecodeRowsW<PairsBf16<kHasDpbf16>>(args, kv, kv_slice, rows.data(), count);
          break;
        }
      }
#endif
      DecodeRowsW<WidenBf16>(args, kv, kv_slice, rows.data(), count);
      break;
    case KVCacheDType::Float16: DecodeRowsW<WidenF16>(args, kv, kv_slice, rows.data(), count); break;
    case KVCacheDType::Int8: DecodeRowsW<WidenInt8>(args, kv, kv_slice, rows.data(), count); break;
  }
  for (int64_t r = 0; r < count; ++r) {
    const DecodeRow& row = rows[r];
    if (row.l == 0.0f) {  // every key hidden: the masked-row rule
      const float fill = masked_row_fill<float>(args.masked_rows);
      for (int64_t c = 0; c < D; ++c) row.out[c] = fill;
      if (row.lse) *row.lse = -std::numeric_limits<float>::infinity();
      continue;
    }
    const float inv = 1.0f / row.l;
    if (pairs) {
      const int64_t N = static_cast<int64_t>(hn::Lanes(DF32()));
      for (int64_t c = 0; c < D; ++c) row.out[PairColumn(c, N)] = row.acc[c] * inv;
    } else {
      for (int64_t c = 0; c < D; ++c) row.out[c] = row.acc[c] * inv;
    }
    if (row.lse) *row.lse = row.m + std::log(row.l);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
