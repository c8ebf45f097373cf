// src/simd/flash_attention_backward-inl.h: the fused ("flash") attention
// backward in float32, written once against Highway and compiled once per
// SIMD target by src/simd/flash_attention_backward.cpp.
//
// Legend (as in src/contract/attention_args.hpp): N slices, L queries, S keys,
// D query/key width, Dv value width; `lanes` floats per vector; bq queries
// per query tile (NVQ·lanes), keys per key tile as the forward's KeyTile.
//
// What it computes: the backward contract (AttentionBackwardArgs in
// src/contract/attention_args.hpp), FlashAttention-2's Algorithm 2 (Dao 2023):
// the L×S weights are never stored; each (query tile, key tile) pair
// recomputes its scores from q, k and the forward's saved lse:
//   st[j][q]  = scale·<q_q, k_j>, shaped by the forward's own vector twins
//               (ApplyScoreModifiers' parts, flash_attention-inl.h)
//   p[j][q]   = exp(st[j][q] − lse_q)            (the forward's softmax)
//   dp'[j][q] = <d_out_q, v_j>
//   dp, p'    = dropout's keep decision (dropout_keep, regenerated), ·1/(1−p)
//   ds[j][q]  = scale · p (dp − delta_q) · soft_cap_slope   (delta_q = <d_out_q, out_q>)
//   d_v_j    += Σ_q p'[j][q] d_out_q      d_k_j += Σ_q ds[j][q] q_q
//   d_q_q    += Σ_j ds[j][q] k_j
// Same layout as the forward: queries in lanes (st [keys][bq]), so the
// score and dp' products are the forward's ScoresBlock and the d_q product
// its AccumulateBlock (with alpha = 1); d_k and d_v, sums over the queries
// of the tile, are an outer-product micro-kernel (OuterBlock) accumulating
// straight into the d_k and d_v rows, which read the query rows and the
// d_out rows in place.
//
// Order: query tiles outer (in increasing i0), key tiles inner (the tiles
// the forward visits, VisitKeyTiles: causal and window skip the same
// tiles). d_q of a query tile lives in scratch (dqt [D][bq]) until its key
// tiles are done; d_k and d_v of a K/V slice accumulate in the output over
// the query tiles of each query slice reading it (grouped-query: the
// group's slices in increasing n), in a fixed order. One call handles one
// whole group (FlashAttentionBackwardGroupF32), or, split in two passes, a
// range of keys (their d_k, d_v) or a range of query rows (their d_q); both ways
// every element gets the same operations in the same order, so each
// d_q/d_k/d_v row has one writer and the same bits whatever the thread
// count (src/kernels/flash.cpp, attention_backward_flash, says which
// split runs when).
// Memory beyond the inputs and outputs: the scratch of one query tile,
// O((D + Dv + key tile)·bq) floats (BackwardScratchFloats).

// Per-target include guard (Highway's pattern for -inl.h files).
#if defined(MULTIHEAD_SIMD_FLASH_ATTENTION_BACKWARD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MULTIHEAD_SIMD_FLASH_ATTENTION_BACKWARD_INL_H_
#undef MULTIHEAD_SIMD_FLASH_ATTENTION_BACKWARD_INL_H_
#else
#define MULTIHEAD_SIMD_FLASH_ATTENTION_BACKWARD_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "contract/score_rule.hpp"
#include "hwy/highway.h"
#include "simd/exp2-inl.h"
#include "simd/flash_attention-inl.h"
#include "simd/flash_attention.hpp"

HWY_BEFORE_NAMESPACE();
namespace multihead::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Floats of scratch for a query tile of nvq vectors: qt, dqt [D][bq],
// dot [Dv][bq], st, dst, slope, pd [MaxKeyTile][bq], and lse, fill, delta,
// ones, tmax [bq].
inline size_t BackwardScratchFloats(size_t nvq, size_t head_dim, size_t value_dim) {
  return (2 * head_dim + value_dim + 4 * MaxKeyTile(nvq) + 5) * nvq * hn::Lanes(DF32());
}

// The bf16 pair way's regions after those (PairRegions carves them; each
// starts on a vector): qc [ceil(bq/2)][D↑] and oc [ceil(bq/2)][Dv↑] (↑: up
// to a multiple of the lanes), pr and dr [MaxKeyTile][bq] bf16, dsp
// [ceil(MaxKeyTile/2)][bq] and kc [ceil(MaxKeyTile/2)][D] pairs.
struct PairRegionSizes {
  size_t qc, oc, pr, dsp, kc, ldq, ldo;
};
inline PairRegionSizes PairRegionFloats(size_t nvq, size_t head_dim, size_t value_dim) {
  const size_t lanes = hn::Lanes(DF32()), bq = nvq * lanes;
  const auto up = [lanes](size_t n) { return (n + lanes - 1) / lanes * lanes; };
  const size_t half_bq = (bq + 1) / 2, half_keys = (MaxKeyTile(nvq) + 1) / 2;
  PairRegionSizes r;
  r.ldq = up(head_dim);
  r.ldo = up(value_dim);
  r.qc = up(half_bq * r.ldq);
  r.oc = up(half_bq * r.ldo);
  r.pr = up((MaxKeyTile(nvq) * bq + 1) / 2);  // bf16: two per float
  r.dsp = up(half_keys * bq);
  r.kc = up(half_keys * head_dim);
  return r;
}
inline size_t BackwardPairScratchFloats(size_t nvq, size_t head_dim, size_t value_dim) {
  const PairRegionSizes r = PairRegionFloats(nvq, head_dim, value_dim);
  return BackwardScratchFloats(nvq, head_dim, value_dim) + r.qc + r.oc + 2 * r.pr + r.dsp + r.kc;
}

// ---- the d_k / d_v micro-kernel --------------------------------------------

// acc[r][v] = c[r·ldc + v·lanes …] and back: the R×CV block of d_k (or
// d_v) rows that OuterBlock and OuterBlockDot accumulate into.
template <size_t R, size_t CV>
HWY_INLINE void LoadBlock(DF32 df, const float* HWY_RESTRICT c, size_t ldc, VF32 (&acc)[R][CV]) {
  const size_t lanes = hn::Lanes(df);
  HWY_UNROLL(8)
  for (size_t r = 0; r < R; ++r) {
    HWY_UNROLL(4)
    for (size_t v = 0; v < CV; ++v) acc[r][v] = hn::LoadU(df, c + r * ldc + v * lanes);
  }
}
template <size_t R, size_t CV>
HWY_INLINE void StoreBlock(DF32 df, const VF32 (&acc)[R][CV], float* HWY_RESTRICT c, size_t ldc) {
  const size_t lanes = hn::Lanes(df);
  HWY_UNROLL(8)
  for (size_t r = 0; r < R; ++r) {
    HWY_UNROLL(4)
    for (size_t v = 0; v < CV; ++v) hn::StoreU(acc[r][v], df, c + r * ldc + v * lanes);
  }
}

// c[r][x] += Σ_{i < n} a[r·lda + i] · b[i·ldb + x]   for r < R, x < CV·lanes:
// R rows of d_k (or d_v) for the keys of a block, over the n queries of the
// tile (a = ds or p' [keys][bq], b = the query or d_out rows in place).
// R·CV accumulators + CV loads + 1 broadcast.
template <size_t R, size_t CV>
HWY_INLINE void OuterBlock(DF32 df, const float* HWY_RESTRICT a, size_t lda, const float* HWY_RESTRICT b,
                           size_t ldb, size_t n, float* HWY_RESTRICT c, size_t ldc) {
  const size_t lanes = hn::Lanes(df);
  VF32 acc[R][CV];
  LoadBlock(df, c, ldc, acc);
  for (size_t i = 0; i < n; ++i) {
    VF32 bv[CV];
    HWY_UNROLL(4)
    for (size_t v = 0; v < CV; ++v) bv[v] = hn::LoadU(df, b + i * ldb + v * lanes);
    HWY_UNROLL(8)
    for (size_t r = 0; r < R; ++r) {
      const VF32 ab = hn::Set(df, a[r * lda + i]);
      HWY_UNROLL(4)
      for (size_t v = 0; v < CV; ++v) acc[r][v] = hn::MulAdd(ab, bv[v], acc[r][v]);
    }
  }
  StoreBlock(df, acc, c, ldc);
}

// All `width` columns of R rows: blocks of CV vectors, then single vectors,
// then the last width % lanes columns in scalar code (same sum order).
template <size_t R, size_t CV>
HWY_INLINE void OuterRows(const float* HWY_RESTRICT a, size_t lda, const float* HWY_RESTRICT b, size_t ldb,
                          size_t n, float* HWY_RESTRICT c, size_t ldc, size_t width) {
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  size_t x = 0;
  for (; x + CV * lanes <= width; x += CV * lanes) OuterBlock<R, CV>(df, a, lda, b + x, ldb, n, c + x, ldc);
  for (; x + lanes <= width; x += lanes) OuterBlock<R, 1>(df, a, lda, b + x, ldb, n, c + x, ldc);
  for (; x < width; ++x) {
    for (size_t r = 0; r < R; ++r) {
      float sum = c[r * ldc + x];
      for (size_t i = 0; i < n; ++i) sum += a[r * lda + i] * b[i * ldb + x];
      c[r * ldc + x] = sum;
    }
  }
}

template <size_t R, size_t CV>
HWY_INLINE void OuterRemainder(size_t rows, const float* HWY_RESTRICT a, size_t lda, const float* HWY_RESTRICT b,
                               size_t ldb, size_t n, float* HWY_RESTRICT c, size_t ldc, size_t width) {
  if constexpr (R > 0) {
    if (rows == R) return OuterRows<R, CV>(a, lda, b, ldb, n, c, ldc, width);
    OuterRemainder<R - 1, CV>(rows, a, lda, b, ldb, n, c, ldc, width);
  }
}

// c[j][x] += Σ_{i < n} a[j][i] · b[i][x] for j < keys: blocks of the
// forward's BlockRows keys, widest column blocks the registers allow.
HWY_INLINE void OuterAccumulate(const float* HWY_RESTRICT a, size_t lda, size_t keys, const float* HWY_RESTRICT b,
                                size_t ldb, size_t n, float* HWY_RESTRICT c, size_t ldc, size_t width) {
  constexpr size_t CV = kMaxQueryVectors;
  constexpr size_t R = BlockRows(CV);
  size_t j = 0;
  for (; j + R <= keys; j += R) OuterRows<R, CV>(a + j * lda, lda, b, ldb, n, c + j * ldc, ldc, width);
  OuterRemainder<R - 1, CV>(keys - j, a + j * lda, lda, b, ldb, n, c + j * ldc, ldc, width);
}

// ---- the d_k / d_v micro-kernel on bf16 pairs --------------------------------

// OuterBlock on pairs of queries: c[r][x] += Σ_{p < pairs} PairDot(a[r·lda + p],
// b[p·ldb + x]): a the rounded p' or ds of R keys, as bf16 pairs of
// adjacent queries (lda pairs apart); b the tile's query or d_out rows
// paired down the queries (ldb a multiple of the lanes, b aligned).
template <size_t R, size_t CV, bool kNative>
HWY_INLINE void OuterBlockDot(DF32 df, const uint32_t* HWY_RESTRICT a, size_t lda, const uint32_t* HWY_RESTRICT b,
                              size_t ldb, size_t pairs, float* HWY_RESTRICT c, size_t ldc) {
  VF32 acc[R][CV];
  LoadBlock(df, c, ldc, acc);
  PairDotTile<CV, R, kNative>(df, a, lda, 1, pairs, b, ldb, acc);
  StoreBlock(df, acc, c, ldc);
}

// All `width` columns of R rows: blocks of CV vectors, single vectors, and
// the last width % lanes columns through a vector-wide copy (b's padding
// columns are zero), so every column gets the same vector arithmetic.
template <size_t R, size_t CV, bool kNative>
HWY_INLINE void OuterRowsDot(const uint32_t* HWY_RESTRICT a, size_t lda, const uint32_t* HWY_RESTRICT b, size_t ldb,
                             size_t pairs, float* HWY_RESTRICT c, size_t ldc, size_t width) {
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  size_t x = 0;
  for (; x + CV * lanes <= width; x += CV * lanes) OuterBlockDot<R, CV, kNative>(df, a, lda, b + x, ldb, pairs, c + x, ldc);
  for (; x + lanes <= width; x += lanes) OuterBlockDot<R, 1, kNative>(df, a, lda, b + x, ldb, pairs, c + x, ldc);
  if (x == width) return;
  constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);
  HWY_ALIGN float tail[R * kMaxLanes];
  for (size_t r = 0; r < R; ++r)
    for (size_t k = 0; k < lanes; ++k) tail[r * lanes + k] = x + k < width ? c[r * ldc + x + k] : 0.0f;
  OuterBlockDot<R, 1, kNative>(df, a, lda, b + x, ldb, pairs, tail, lanes);
  for (size_t r = 0; r < R; ++r)
    for (size_t k = 0; x + k < width; ++k) c[r * ldc + x + k] = tail[r * lanes + k];
}

template <size_t R, size_t CV, bool kNative>
HWY_INLINE void OuterRemainderDot(size_t rows, const uint32_t* HWY_RESTRICT a, size_t lda,
                                  const uint32_t* HWY_RESTRICT b, size_t ldb, size_t pairs, float* HWY_RESTRICT c,
                                  size_t ldc, size_t width) {
  if constexpr (R > 0) {
    if (rows == R) return OuterRowsDot<R, CV, kNative>(a, lda, b, ldb, pairs, c, ldc, width);
    OuterRemainderDot<R - 1, CV, kNative>(rows, a, lda, b, ldb, pairs, c, ldc, width);
  }
}

// OuterAccumulate on pairs of queries: c[j][x] += Σ_p PairDot(a[j][p], b[p][x]).
template <bool kNative>
HWY_INLINE void OuterAccumulateDot(const uint32_t* HWY_RESTRICT a, size_t lda, size_t keys,
                                   const uint32_t* HWY_RESTRICT b, size_t ldb, size_t pairs, float* HWY_RESTRICT c,
                                   size_t ldc, size_t width) {
  constexpr size_t CV = kMaxQueryVectors;
  constexpr size_t R = BlockRows(CV);
  size_t j = 0;
  for (; j + R <= keys; j += R) OuterRowsDot<R, CV, kNative>(a + j * lda, lda, b, ldb, pairs, c + j * ldc, ldc, width);
  OuterRemainderDot<R - 1, CV, kNative>(keys - j, a + j * lda, lda, b, ldb, pairs, c + j * ldc, ldc, width);
}

// dst [keys][bq] bf16 = src [keys][bq] rounded (RoundToBf16Bits: to_bfloat16's
// vector twin), so adjacent queries' values form the pairs OuterBlockDot
// reads; with `rows` odd, lane `rows` (a padding query, which pairs with
// the last row) is set to 0.
template <size_t NVQ>
HWY_INLINE void RoundQueryRows(const float* HWY_RESTRICT src, size_t keys, size_t rows, uint16_t* HWY_RESTRICT dst) {
  const DF32 df;
  const hn::RebindToSigned<DF32> di;
  const hn::Rebind<uint16_t, DF32> d16;
  const size_t lanes = hn::Lanes(df), bq = NVQ * lanes;
  for (size_t x = 0; x < keys * NVQ; ++x) {
    const auto bits = hn::BitCast(di, RoundToBf16Bits(df, hn::Load(df, src + x * lanes)));
    hn::StoreU(hn::DemoteTo(d16, bits), d16, dst + x * lanes);  // values <= 0xFFFF: exact
  }
  if (rows % 2 != 0 && rows < bq)
    for (size_t j = 0; j < keys; ++j) dst[j * bq + rows] = 0;
}

// ---- one query tile ---------------------------------------------------------

// The tile's scratch and rows, beside the forward's TileState (whose st,
// qt, i0 and rows the shared score twins read).
struct BackwardTile {
  TileState t;                     // t.qt scaled queries, t.st scores → p, t.tmax unused
  float* HWY_RESTRICT dqt;         // [D][bq] d_q of the tile, transposed
  float* HWY_RESTRICT dot;         // [Dv][bq] d_out of the tile, transposed
  float* HWY_RESTRICT dst;         // [MaxKeyTile][bq] dp' → ds
  float* HWY_RESTRICT slope;       // [MaxKeyTile][bq] soft_cap_slope, when capped
  float* HWY_RESTRICT pd;          // [MaxKeyTile][bq] p', when dropout
  float* HWY_RESTRICT lse;         // [bq] lse; +inf for fully masked rows and padding lanes (p = 0)
  float* HWY_RESTRICT fill;        // [bq] NaN for fully masked rows under MaskedRowPolicy::NaN, else 0
  float* HWY_RESTRICT delta;       // [bq] <d_out_q, out_q>, 0 for padding lanes
  float* HWY_RESTRICT ones;        // [bq] 1: AccumulateBlock's alpha
  bool nan_rows;                   // some row of the tile has fill NaN
  const float* q;                  // query row i0, rows q_row apart (unscaled)
  const float* d_out;              // d_out row i0, rows out_row apart
  // The pair way on the bf16 operands themselves (AttentionBackwardArgs::
  // d_out_bf16; q and d_out above are then nullptr): their bits, the same rows.
  const uint16_t* q16 = nullptr;
  const uint16_t* d_out16 = nullptr;
  size_t q_row, out_row;
  // The bf16 pair way only (Bf16Way::Dot; BackwardQueryTile fills them):
  // t.qt holds qp [ceil(D/2)][bq] (the forward's PackQueryPairs layout),
  // dot holds dop [ceil(Dv/2)][bq], d_out's pairs the same way; qc and oc
  // the query and d_out rows paired down the queries (ldq, ldo apart,
  // zero padded); pr and dr p' and ds rounded to bf16 [keys][bq]; dsp ds
  // rounded and paired down the keys; kc a key tile's K paired down the
  // keys, where the call's pairs do not fit the tile; k_columns and
  // v_rows the call's pairs of this slice's K/V
  // (AttentionBackwardArgs::k_column_pairs, v_row_pairs).
  uint32_t* HWY_RESTRICT qc = nullptr;
  uint32_t* HWY_RESTRICT oc = nullptr;
  uint16_t* HWY_RESTRICT pr = nullptr;
  uint16_t* HWY_RESTRICT dr = nullptr;
  uint32_t* HWY_RESTRICT dsp = nullptr;
  uint32_t* HWY_RESTRICT kc = nullptr;
  size_t ldq = 0, ldo = 0;
  const uint32_t* k_columns = nullptr;
  const uint32_t* v_rows = nullptr;
};

// dst [keys][bq] = Σ_c rows[j][c] · xt[c][q]: the forward's ScoresBlock on
// other operands (v and d_outᵀ for dp').
template <size_t NVQ>
HWY_INLINE void ProductTile(const float* HWY_RESTRICT rows, size_t ld, size_t width, const float* HWY_RESTRICT xt,
                            size_t keys, float* HWY_RESTRICT dst, float* HWY_RESTRICT tmax) {
  const DF32 df;
  const size_t bq = NVQ * hn::Lanes(df);
  constexpr size_t KR = BlockRows(NVQ);
  size_t j = 0;
  for (; j + KR <= keys; j += KR) ScoresBlock<NVQ, KR>(df, rows + j * ld, ld, width, xt, bq, dst + j * bq, tmax);
  ScoresRemainder<NVQ, KR - 1>(keys - j, df, rows + j * ld, ld, width, xt, bq, dst + j * bq, tmax);
}

// dqt [D][bq] += Σ_j k[j][d] · ds[j][q]: the forward's AccumulateBlock with
// alpha = 1 (exact), k rows in place.
template <size_t NVQ>
HWY_INLINE void AccumulateQueryGradient(const AttentionArgs<float>& a, const QueryTileInputs& in,
                                        const BackwardTile& bt, int64_t j0, size_t keys) {
  const DF32 df;
  const size_t bq = NVQ * hn::Lanes(df);
  constexpr size_t KR = BlockRows(NVQ);
  const size_t head_dim = static_cast<size_t>(a.head_dim);
  const float* kt = in.k + static_cast<size_t>(j0) * in.k_row;
  size_t d = 0;
  for (; d + KR <= head_dim; d += KR)
    AccumulateBlock<NVQ, KR>(df, kt + d, in.k_row, keys, bt.dst, bq, bt.ones, bt.dqt + d * bq);
  AccumulateRemainder<NVQ, KR - 1>(head_dim - d, df, kt + d, in.k_row, keys, bt.dst, bq, bt.ones,
                                   bt.dqt + d * bq);
}

// ProductTile on pairs: dst [keys][bq] = <v_j, d_out_q> from V's row
// pairs (the call's, from key j0) and dop, the forward's ScoresBlockDot
// with scale 1 (exact).
template <size_t NVQ, bool kNative>
HWY_INLINE void ProductTileDot(const AttentionArgs<float>& a, const BackwardTile& bt, int64_t j0, size_t keys) {
  const DF32 df;
  const size_t bq = NVQ * hn::Lanes(df);
  constexpr size_t KR = BlockRows(NVQ);
  const size_t pairs = (static_cast<size_t>(a.value_dim) + 1) / 2;
  const uint32_t* HWY_RESTRICT vp = bt.v_rows + static_cast<size_t>(j0) * pairs;
  const uint32_t* HWY_RESTRICT dop = reinterpret_cast<const uint32_t*>(bt.dot);
  size_t j = 0;
  for (; j + KR <= keys; j += KR)
    ScoresBlockDot<NVQ, KR, kNative>(df, vp + j * pairs, pairs, pairs, dop, bq, 1.0f, bt.dst + j * bq, bt.t.tmax);
  ScoresRemainderDot<NVQ, KR - 1, kNative>(keys - j, df, vp + j * pairs, pairs, pairs, dop, bq, 1.0f, bt.dst + j * bq,
                                           bt.t.tmax);
}

// AccumulateQueryGradient on pairs of keys: dqt [D][bq] += Σ_p
// PairDot(kc[p][d], dsp[p][q]), the forward's AccumulateBlockDot with
// alpha = 1 (exact). K's pairs down the keys are the call's where they fit
// the tile (CallPairsFitTile, as the forward's V pairs), else packed here
// from the float rows.
template <size_t NVQ, bool kNative>
HWY_INLINE void AccumulateQueryGradientDot(const AttentionArgs<float>& a, const QueryTileInputs& in,
                                           const BackwardTile& bt, int64_t j0, size_t keys) {
  const DF32 df;
  const size_t bq = NVQ * hn::Lanes(df);
  constexpr size_t KR = BlockRows(NVQ);
  const size_t head_dim = static_cast<size_t>(a.head_dim);
  const size_t pairs = (keys + 1) / 2;
  const uint32_t* HWY_RESTRICT kc;
  if (CallPairsFitTile(j0, keys, a.kv_len)) {
    kc = bt.k_columns + static_cast<size_t>(j0 / 2) * head_dim;
  } else if (in.k != nullptr) {
    PackColumnPairs(in.k + static_cast<size_t>(j0) * in.k_row, in.k_row, keys, head_dim, bt.kc, head_dim);
    kc = bt.kc;
  } else {  // the bf16 operands themselves (AttentionBackwardArgs::d_out_bf16)
    PackColumnPairs(static_cast<const bfloat16*>(in.k_narrow) + static_cast<size_t>(j0) * in.k_row, in.k_row, keys,
                    head_dim, bt.kc);
    kc = bt.kc;
  }
  PackRoundedColumnPairs(df, bt.dst, keys, bq, bt.dsp);
  size_t d = 0;
  for (; d + KR <= head_dim; d += KR)
    AccumulateBlockDot<NVQ, KR, kNative>(df, kc + d, head_dim, pairs, bt.dsp, bq, bt.ones, bt.dqt + d * bq);
  AccumulateRemainderDot<NVQ, KR - 1, kNative>(head_dim - d, df, kc + d, head_dim, pairs, bt.dsp, bq, bt.ones,
                                               bt.dqt + d * bq);
}

// Which gradients a pass adds: d_k and d_v (key_grads), d_q (query_grad).
struct BackwardParts {
  bool key_grads, query_grad;
};

// One key tile [j0, j0 + keys) of the query tile. Every value it computes
// is a function of its own (i, j) alone, whatever the tile's bounds, so a
// key tile cut in two pieces adds exactly the same numbers in the same order.
//
// W, the bf16 pair way (Dot, DotNative; the bf16 module's backward where
// its forward ran that way): the scores as that forward computed them
// (TileScoresDot, the same pairs), dp' on V's row pairs, p' and ds
// rounded to bf16, then d_v, d_k and d_q on pairs; the rest as below.
template <size_t NVQ, Bf16Way W = Bf16Way::Fma>
HWY_INLINE void BackwardKeyTileStep(const AttentionBackwardArgs<float>& b, const QueryTileInputs& in,
                                    const BackwardTile& bt, BackwardParts parts, float* d_k, float* d_v,
                                    size_t dk_row, size_t dv_row, int64_t j0, size_t keys) {
  constexpr bool kDot = W != Bf16Way::Fma, kNative = W == Bf16Way::DotNative;
  const AttentionArgs<float>& a = b.forward;
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  const size_t bq = NVQ * lanes;
  const TileState& t = bt.t;
  // Forward (KeyTileStep): TileScores, then ApplyScoreModifiers, here with
  // the cap's slope 1 − tanh²(x/cap) = 1 − (capped/cap)² taken in between.
  if constexpr (kDot) {
    TileScoresDot<NVQ, kNative>(a, in, t, j0, keys);
  } else {
    TileScores<NVQ>(a, in, t, j0, keys);
  }
  const bool softcap = a.modifiers.softcap > 0.0f;
  if (softcap) {
    SoftCapTile<NVQ>(a, t, keys);
    const VF32 inv_cap = hn::Set(df, 1.0f / a.modifiers.softcap);
    const VF32 one = hn::Set(df, 1.0f);
    for (size_t x = 0; x < keys * NVQ; ++x) {
      const VF32 tanh = hn::Mul(hn::Load(df, t.st + x * lanes), inv_cap);
      hn::Store(hn::NegMulAdd(tanh, tanh, one), df, bt.slope + x * lanes);
    }
  }
  ApplyScoreModifiersAfterCap<NVQ>(a, in, t, j0, keys);
  // Forward (OnlineSoftmax): p = exp(s − m)/l, which is exp(s − lse). The
  // argument is clamped at 0 by compare and select (a recomputed score may
  // exceed the lse by rounding; NaN stays NaN); fill adds NaN to the rows
  // that the forward filled with NaN.
  {
    const VF32 log2e = hn::Set(df, 1.442695040888963407359924681f);
    const VF32 zero = hn::Zero(df);
    for (size_t j = 0; j < keys; ++j) {
      float* HWY_RESTRICT row = t.st + j * bq;
      HWY_UNROLL(4)
      for (size_t w = 0; w < NVQ; ++w) {
        VF32 x = hn::Sub(hn::Load(df, row + w * lanes), hn::Load(df, bt.lse + w * lanes));
        x = hn::IfThenElse(hn::Gt(x, zero), zero, x);
        VF32 p = Exp2NonPositive(df, hn::Mul(x, log2e));
        if (bt.nan_rows) p = hn::Add(p, hn::Load(df, bt.fill + w * lanes));
        hn::Store(p, df, row + w * lanes);
      }
    }
  }
  // Forward: out = Σ_j p'_j v_j, so dp'[j][q] = <v_j, d_out_q>.
  if constexpr (kDot) {
    ProductTileDot<NVQ, kNative>(a, bt, j0, keys);
  } else {
    ProductTile<NVQ>(in.v + static_cast<size_t>(j0) * in.v_row, in.v_row, static_cast<size_t>(a.value_dim), bt.dot,
                     keys, bt.dst, t.tmax);
  }
  // Forward (DropoutTile): p' = keep·p/(1 − p_drop); the same keep decision
  // scales dp' into dp, and p' feeds d_v. Scalar, as the forward's.
  const bool dropout = a.dropout.p > 0.0;
  const float* p_kept = t.st;
  if (dropout) {
    const float keep_scale = static_cast<float>(1.0 / (1.0 - a.dropout.p));
    for (size_t j = 0; j < keys; ++j) {
      for (size_t r = 0; r < bq; ++r) {
        const size_t x = j * bq + r;
        const bool keep = r < t.rows && dropout_keep(a.dropout, t.slice, t.i0 + static_cast<int64_t>(r),
                                                     j0 + static_cast<int64_t>(j));
        bt.dst[x] = keep ? bt.dst[x] * keep_scale : 0.0f;
        bt.pd[x] = keep ? t.st[x] * keep_scale : 0.0f;
      }
    }
    p_kept = bt.pd;
  }
  // ds = scale · p (dp − delta) · slope: softmax's Jacobian, the cap's
  // derivative, and the forward's qt = scale·q.
  {
    const VF32 scale = hn::Set(df, a.scale);
    for (size_t j = 0; j < keys; ++j) {
      HWY_UNROLL(4)
      for (size_t w = 0; w < NVQ; ++w) {
        const size_t x = j * bq + w * lanes;
        VF32 ds = hn::Mul(hn::Load(df, t.st + x), hn::Sub(hn::Load(df, bt.dst + x), hn::Load(df, bt.delta + w * lanes)));
        if (softcap) ds = hn::Mul(ds, hn::Load(df, bt.slope + x));
        hn::Store(hn::Mul(ds, scale), df, bt.dst + x);
      }
    }
  }
  // d_v_j += Σ_q p'[j][q] d_out_q;  d_k_j += Σ_q ds[j][q] q_q  (rows < t.rows only).
  if constexpr (kDot) {
    if (parts.key_grads) {
      // Pairs of adjacent queries: ceil(rows/2) of them; an odd last
      // pair's other half is a zeroed padding lane.
      const size_t pairs = (t.rows + 1) / 2, half = bq / 2;
      RoundQueryRows<NVQ>(p_kept, keys, t.rows, bt.pr);
      RoundQueryRows<NVQ>(bt.dst, keys, t.rows, bt.dr);
      OuterAccumulateDot<kNative>(reinterpret_cast<const uint32_t*>(bt.pr), half, keys, bt.oc, bt.ldo, pairs,
                                  d_v + static_cast<size_t>(j0) * dv_row, dv_row, static_cast<size_t>(a.value_dim));
      OuterAccumulateDot<kNative>(reinterpret_cast<const uint32_t*>(bt.dr), half, keys, bt.qc, bt.ldq, pairs,
                                  d_k + static_cast<size_t>(j0) * dk_row, dk_row, static_cast<size_t>(a.head_dim));
    }
    if (parts.query_grad) AccumulateQueryGradientDot<NVQ, kNative>(a, in, bt, j0, keys);
    return;
  }
  if (parts.key_grads) {
    OuterAccumulate(p_kept, bq, keys, bt.d_out, bt.out_row, t.rows, d_v + static_cast<size_t>(j0) * dv_row, dv_row,
                    static_cast<size_t>(a.value_dim));
    OuterAccumulate(bt.dst, bq, keys, bt.q, bt.q_row, t.rows, d_k + static_cast<size_t>(j0) * dk_row, dk_row,
                    static_cast<size_t>(a.head_dim));
  }
  // d_q_q += Σ_j ds[j][q] k_j
  if (parts.query_grad) AccumulateQueryGradient<NVQ>(a, in, bt, j0, keys);
}

// The pair way's regions, after the float scratch (PairRegionFloats).
inline float* scratch_pairs(float* base, size_t nvq, size_t head_dim, size_t value_dim) {
  return base + BackwardScratchFloats(nvq, head_dim, value_dim);
}

// The pair way's per-tile operands (BackwardTile's pair fields): the
// query and d_out rows of the tile as pairs along their widths (qp in
// qt's space, dop in dot's) and down the queries (qc, oc), each float
// rounded to bf16 (exact: they hold bf16 values); and where this slice's
// call-level pairs start.
template <size_t NVQ>
HWY_INLINE void PairTile(const AttentionBackwardArgs<float>& b, int64_t slice, BackwardTile& bt,
                         float* HWY_RESTRICT qt, float* HWY_RESTRICT regions) {
  const AttentionArgs<float>& a = b.forward;
  const size_t bq = NVQ * hn::Lanes(DF32());
  const size_t head_dim = static_cast<size_t>(a.head_dim), value_dim = static_cast<size_t>(a.value_dim);
  const size_t rows = bt.t.rows;
  const PairRegionSizes r = PairRegionFloats(NVQ, head_dim, value_dim);
  bt.qc = reinterpret_cast<uint32_t*>(regions);
  bt.oc = reinterpret_cast<uint32_t*>(regions + r.qc);
  bt.pr = reinterpret_cast<uint16_t*>(regions + r.qc + r.oc);
  bt.dr = reinterpret_cast<uint16_t*>(regions + r.qc + r.oc + r.pr);
  bt.dsp = reinterpret_cast<uint32_t*>(regions + r.qc + r.oc + 2 * r.pr);
  bt.kc = reinterpret_cast<uint32_t*>(regions + r.qc + r.oc + 2 * r.pr + r.dsp);
  bt.ldq = r.ldq;
  bt.ldo = r.ldo;
  // Each of the tile's query and d_out rows rounded once (RoundToBf16Bits,
  // to_bfloat16's vector twin) into bf16 bits, [rows][width↑2] (an odd
  // width's pad 0), then both pair layouts taken from those bits by integer
  // moves: along the widths, transposed, [pair][query] (padding queries
  // 0), and down the queries, [ceil(rows/2)][ld] (padding columns 0). The
  // scalar rounding of every element twice here was ~a fifth of this
  // kernel at 128 keys (FlashBackwardBf16/slices:64/L:128, AMD Zen 5).
  thread_local std::vector<uint16_t> bits;
  const auto pair_layouts = [&](const float* src, const uint16_t* src16, size_t ld, size_t width,
                                uint32_t* HWY_RESTRICT along, uint32_t* HWY_RESTRICT down, size_t ld_down) {
    const DF32 df;
    const hn::RebindToSigned<DF32> di;
    const hn::Rebind<uint16_t, DF32> d16;
    const size_t lanes = hn::Lanes(df), pairs = (width + 1) / 2, row_bits = 2 * pairs;
    bits.resize(std::max<size_t>(1, rows * row_bits));
    for (size_t q = 0; q < rows; ++q) {
      uint16_t* HWY_RESTRICT out = bits.data() + q * row_bits;
      if (src16 != nullptr) {  // bf16 rows: their bits as they are
        std::copy_n(src16 + q * ld, width, out);
        if (width % 2 != 0) out[width] = 0;
        continue;
      }
      const float* HWY_RESTRICT row = src + q * ld;
      size_t c = 0;
      for (; c + lanes <= width; c += lanes) {
        const auto b16 = hn::BitCast(di, RoundToBf16Bits(df, hn::LoadU(df, row + c)));
        hn::StoreU(hn::DemoteTo(d16, b16), d16, out + c);  // values <= 0xFFFF: exact
      }
      for (; c < width; ++c) out[c] = to_bfloat16(row[c]).bits;
      if (width % 2 != 0) out[width] = 0;
    }
    std::fill(along, along + pairs * bq, 0u);
    for (size_t q = 0; q < rows; ++q) {
      const uint16_t* HWY_RESTRICT in = bits.data() + q * row_bits;
      for (size_t p = 0; p < pairs; ++p) along[p * bq + q] = PackPair(in[2 * p], in[2 * p + 1]);
    }
    for (size_t p = 0; p < (rows + 1) / 2; ++p) {
      const uint16_t* HWY_RESTRICT even = bits.data() + 2 * p * row_bits;
      uint32_t* HWY_RESTRICT d = down + p * ld_down;
      if (2 * p + 1 < rows) {
        const uint16_t* HWY_RESTRICT odd = even + row_bits;
        for (size_t c = 0; c < width; ++c) d[c] = PackPair(even[c], odd[c]);
      } else {
        for (size_t c = 0; c < width; ++c) d[c] = PackPair(even[c], 0);
      }
      for (size_t c = width; c < ld_down; ++c) d[c] = 0;
    }
  };
  pair_layouts(bt.q, bt.q16, bt.q_row, head_dim, reinterpret_cast<uint32_t*>(qt), bt.qc, bt.ldq);
  pair_layouts(bt.d_out, bt.d_out16, bt.out_row, value_dim, reinterpret_cast<uint32_t*>(bt.dot), bt.oc, bt.ldo);
  const int64_t Hkv = a.kv_heads_or_heads(), S = a.kv_len;
  const SliceLayout kc_layout = resolve_layout(SliceLayout{}, Hkv, (S + 1) / 2, a.head_dim);
  const SliceLayout vr_layout = resolve_layout(SliceLayout{}, Hkv, S, (a.value_dim + 1) / 2);
  bt.k_columns = kv_slice_start(b.k_column_pairs, kc_layout, slice, a.heads, Hkv);
  bt.v_rows = kv_slice_start(b.v_row_pairs, vr_layout, slice, a.heads, Hkv);
}

// Query rows [i0, i0 + rows) of slice `slice`, over the keys in
// [key_begin, key_end) that the forward visits for them: with
// parts.query_grad their d_q rows (then the key range is all keys), with
// parts.key_grads their contributions added into the d_k and d_v rows.
template <size_t NVQ, Bf16Way W = Bf16Way::Fma>
HWY_NOINLINE void BackwardQueryTile(const AttentionBackwardArgs<float>& b, int64_t slice, int64_t i0, size_t rows,
                                    int64_t key_begin, int64_t key_end, BackwardParts parts, FlashScratch& scratch) {
  constexpr bool kDot = W != Bf16Way::Fma;
  const AttentionArgs<float>& a = b.forward;
  const size_t bq = NVQ * hn::Lanes(DF32());
  const size_t head_dim = static_cast<size_t>(a.head_dim);
  const size_t value_dim = static_cast<size_t>(a.value_dim);
  float* HWY_RESTRICT base = scratch.floats(kDot ? BackwardPairScratchFloats(NVQ, head_dim, value_dim)
                                                 : BackwardScratchFloats(NVQ, head_dim, value_dim));
  const SliceLayout ql = resolve_layout(a.q_layout, a.heads, a.q_len, a.head_dim);
  const int64_t Hkv = a.kv_heads_or_heads();
  const SliceLayout kl = resolve_layout(a.k_layout, Hkv, a.kv_len, a.head_dim);
  const SliceLayout vl = resolve_layout(a.v_layout, Hkv, a.kv_len, a.value_dim);
  const SliceLayout ol = resolve_layout(a.out_layout, a.heads, a.q_len, a.value_dim);

  BackwardTile bt;
  float* qt = base;
  bt.dqt = qt + head_dim * bq;
  bt.dot = bt.dqt + head_dim * bq;
  bt.t.st = bt.dot + value_dim * bq;
  bt.dst = bt.t.st + MaxKeyTile(NVQ) * bq;
  bt.slope = bt.dst + MaxKeyTile(NVQ) * bq;
  bt.pd = bt.slope + MaxKeyTile(NVQ) * bq;
  bt.lse = bt.pd + MaxKeyTile(NVQ) * bq;
  bt.fill = bt.lse + bq;
  bt.delta = bt.fill + bq;
  bt.ones = bt.delta + bq;
  bt.t.tmax = bt.ones + bq;
  bt.t.slice = slice;
  bt.t.i0 = i0;
  bt.t.rows = rows;
  bt.t.qt = qt;
  bt.t.ot = nullptr;
  bt.t.m = bt.t.l = bt.t.alpha = nullptr;
  // Row i0 of slice `slice` in a layout, or nullptr for a tensor this call
  // does not have (the float ones, on bf16 operands).
  const auto row_i0 = [&](auto* base, const SliceLayout& l) -> decltype(base) {
    return base == nullptr ? nullptr : slice_start(base, l, slice, a.heads) + i0 * l.row;
  };
  const bool bf16_in = kDot && b.d_out_bf16 != nullptr;
  bt.q = row_i0(a.q, ql);
  bt.q_row = static_cast<size_t>(ql.row);
  bt.d_out = row_i0(b.d_out, ol);
  bt.out_row = static_cast<size_t>(ol.row);
  const float* out = row_i0(a.out, ol);
  const uint16_t* out16 = nullptr;
  if (bf16_in) {
    bt.q16 = row_i0(static_cast<const uint16_t*>(a.narrow.q), ql);
    bt.d_out16 = row_i0(reinterpret_cast<const uint16_t*>(b.d_out_bf16), ol);
    out16 = row_i0(static_cast<const uint16_t*>(a.narrow.out), ol);
  }

  // qt as the forward's (PackQueryTile); dot [Dv][bq] = d_outᵀ, delta, lse
  // and fill per lane.
  if constexpr (!kDot) PackQueryTile<NVQ>(a, slice, i0, rows, qt);
  std::fill(bt.dqt, bt.dqt + head_dim * bq, 0.0f);
  if constexpr (!kDot) std::fill(bt.dot, bt.dot + value_dim * bq, 0.0f);
  const float inf = std::numeric_limits<float>::infinity();
  std::fill(bt.lse, bt.lse + bq, inf);
  std::fill(bt.fill, bt.fill + bq, 0.0f);
  std::fill(bt.delta, bt.delta + bq, 0.0f);
  std::fill(bt.ones, bt.ones + bq, 1.0f);
  bt.nan_rows = false;
  const auto widened = [](uint16_t bits) { return to_float(bfloat16{bits}); };
  for (size_t r = 0; r < rows; ++r) {
    // delta = <d_out, out> (the contract's form; = Σ_j p dp), summed in
    // this order on every target; from bf16 operands, of their exact
    // widenings (the values the float copies would hold).
    float delta = 0.0f;
    if (bf16_in) {
      const uint16_t* HWY_RESTRICT g = bt.d_out16 + r * bt.out_row;
      const uint16_t* HWY_RESTRICT o = out16 + r * bt.out_row;
      for (size_t c = 0; c < value_dim; ++c) delta += widened(g[c]) * widened(o[c]);
    } else {
      const float* HWY_RESTRICT g = bt.d_out + r * bt.out_row;
      const float* HWY_RESTRICT o = out + r * bt.out_row;
      for (size_t c = 0; c < value_dim; ++c) delta += g[c] * o[c];
      if constexpr (!kDot) {  // the pair way's dot holds d_out's pairs (PairTile)
        for (size_t c = 0; c < value_dim; ++c) bt.dot[c * bq + r] = g[c];
      }
    }
    bt.delta[r] = delta;
    const float lse = b.lse[slice * a.q_len + i0 + static_cast<int64_t>(r)];
    if (lse == -inf) {
      // A fully masked row: p = 0 (lse = +inf), or the NaN fill.
      if (a.masked_rows == MaskedRowPolicy::NaN) {
        bt.fill[r] = std::numeric_limits<float>::quiet_NaN();
        bt.nan_rows = true;
      }
    } else {
      bt.lse[r] = lse;
    }
  }

  const QueryTileInputs in = TileInputs(a, slice);
  if constexpr (kDot) PairTile<NVQ>(b, slice, bt, qt, scratch_pairs(base, NVQ, head_dim, value_dim));
  // The K/V slice this query slice reads (kv_slice): its d_k, d_v rows.
  float* d_k = kv_slice_start(b.d_k, kl, slice, a.heads, Hkv);
  float* d_v = kv_slice_start(b.d_v, vl, slice, a.heads, Hkv);
  VisitKeyTiles<NVQ>(a, in, i0, rows, [&](int64_t j0, size_t keys) {
    const int64_t begin = std::max(j0, key_begin), end = std::min(j0 + static_cast<int64_t>(keys), key_end);
    if (begin >= end) return;
    BackwardKeyTileStep<NVQ, W>(b, in, bt, parts, d_k, d_v, static_cast<size_t>(kl.row),
                                static_cast<size_t>(vl.row), begin, static_cast<size_t>(end - begin));
  });

  if (!parts.query_grad) return;
  float* d_q = slice_start(b.d_q, ql, slice, a.heads) + i0 * ql.row;
  for (size_t r = 0; r < rows; ++r)
    for (size_t d = 0; d < head_dim; ++d) d_q[r * bt.q_row + d] = bt.dqt[d * bq + r];
}

// Query rows [row_begin, row_end) of a slice, cut by the forward's driver
// (ForEachQueryTile). row_begin is 0 or a multiple of
// FlashAttentionBackwardRowTileF32(), so every pass tiles the rows alike.
template <Bf16Way W>
void BackwardRows(const AttentionBackwardArgs<float>& b, int64_t slice, int64_t row_begin, int64_t row_end,
                  int64_t key_begin, int64_t key_end, BackwardParts parts, FlashScratch& scratch) {
  ForEachQueryTile(row_begin, row_end, [&]<size_t NVQ>(int64_t i0, size_t rows) {
    BackwardQueryTile<NVQ, W>(b, slice, i0, rows, key_begin, key_end, parts, scratch);
  });
}

// MaskedRowPolicy::NaN: a fully masked row's p is NaN for every key, also
// in the key tiles that causal masking or the window let the tile skip;
// its d_q row, every d_k row and the d_v rows of the keys dropout keeps for
// it are NaN in the reference (and in PyTorch's autograd). Rather than
// visit the skipped tiles, those rows are set to NaN after the pass: d_q
// rows [row_begin, row_end) and d_k, d_v rows [key_begin, key_end).
inline void BackwardNaNRows(const AttentionBackwardArgs<float>& b, int64_t slice, int64_t row_begin,
                            int64_t row_end, int64_t key_begin, int64_t key_end) {
  const AttentionArgs<float>& a = b.forward;
  const int64_t L = a.q_len, S = a.kv_len, D = a.head_dim, Dv = a.value_dim;
  if (a.masked_rows != MaskedRowPolicy::NaN || S == 0) return;
  const float nan = std::numeric_limits<float>::quiet_NaN(), neg_inf = -std::numeric_limits<float>::infinity();
  const float* lse = b.lse + slice * L;
  const SliceLayout ql = resolve_layout(a.q_layout, a.heads, L, D);
  float* d_q = slice_start(b.d_q, ql, slice, a.heads);
  for (int64_t i = row_begin; i < row_end; ++i)
    if (lse[i] == neg_inf) std::fill(d_q + i * ql.row, d_q + i * ql.row + D, nan);
  if (key_begin >= key_end) return;
  bool any_masked = false;
  for (int64_t i = 0; i < L && !any_masked; ++i) any_masked = lse[i] == neg_inf;
  if (!any_masked) return;
  const int64_t Hkv = a.kv_heads_or_heads();
  const SliceLayout kl = resolve_layout(a.k_layout, Hkv, S, D);
  const SliceLayout vl = resolve_layout(a.v_layout, Hkv, S, Dv);
  float* d_k = kv_slice_start(b.d_k, kl, slice, a.heads, Hkv);
  float* d_v = kv_slice_start(b.d_v, vl, slice, a.heads, Hkv);
  const bool dropout = a.dropout.p > 0.0;
  for (int64_t j = key_begin; j < key_end; ++j) {
    std::fill(d_k + j * kl.row, d_k + j * kl.row + D, nan);
    // d_v_j += p'_ij d_out_i: NaN unless dropout drops (i, j) for every such row i.
    bool reached = !dropout;
    for (int64_t i = 0; i < L && !reached; ++i) reached = lse[i] == neg_inf && dropout_keep(a.dropout, slice, i, j);
    if (reached) std::fill(d_v + j * vl.row, d_v + j * vl.row + Dv, nan);
  }
}

// Zero d_k and d_v rows [key_begin, key_end) of K/V slice `kv`.
inline void ZeroKeyGradients(const AttentionBackwardArgs<float>& b, int64_t kv, int64_t key_begin,
                             int64_t key_end) {
  const AttentionArgs<float>& a = b.forward;
  const int64_t Hkv = a.kv_heads_or_heads();
  const SliceLayout kl = resolve_layout(a.k_layout, Hkv, a.kv_len, a.head_dim);
  const SliceLayout vl = resolve_layout(a.v_layout, Hkv, a.kv_len, a.value_dim);
  float* d_k = slice_start(b.d_k, kl, kv, Hkv);
  float* d_v = slice_start(b.d_v, vl, kv, Hkv);
  for (int64_t j = key_begin; j < key_end; ++j) {
    std::fill(d_k + j * kl.row, d_k + j * kl.row + a.head_dim, 0.0f);
    std::fill(d_v + j * vl.row, d_v + j * vl.row + a.value_dim, 0.0f);
  }
}

// The whole backward of K/V slice `kv` and the query slices that read it
// (its group: one slice without grouped-query) in one pass: d_k and d_v
// zeroed, then the group's query slices in increasing n, each one's query
// tiles in increasing order, adding d_k, d_v and writing its d_q.
// W: the bf16 pair way (BackwardKeyTileStep), or Fma for float32 products.
template <Bf16Way W = Bf16Way::Fma>
void FlashAttentionBackwardGroupF32(const AttentionBackwardArgs<float>& b, int64_t kv, FlashScratch& scratch) {
  const AttentionArgs<float>& a = b.forward;
  const int64_t Hkv = a.kv_heads_or_heads();
  ZeroKeyGradients(b, kv, 0, a.kv_len);
  for (int64_t r = 0; r < a.heads / Hkv; ++r) {
    const int64_t slice = group_query_slice(kv, r, a.heads, Hkv);
    BackwardRows<W>(b, slice, 0, a.q_len, 0, a.kv_len, BackwardParts{true, true}, scratch);
    BackwardNaNRows(b, slice, 0, a.q_len, 0, a.kv_len);
  }
}

// The two-pass split of one group (src/kernels/flash.cpp says when):
// d_k and d_v rows [key_begin, key_end) of K/V slice `kv`, from the
// group's query slices in increasing n, each from every query tile in
// increasing order; and d_q rows [row_begin, row_end) of query slice
// `slice`. Each element gets exactly the operations, in the same order,
// that the one-pass FlashAttentionBackwardGroupF32 gives it, so both give
// the same bits.
template <Bf16Way W = Bf16Way::Fma>
void FlashAttentionBackwardKeysF32(const AttentionBackwardArgs<float>& b, int64_t kv, int64_t key_begin,
                                   int64_t key_end, FlashScratch& scratch) {
  const AttentionArgs<float>& a = b.forward;
  const int64_t Hkv = a.kv_heads_or_heads();
  ZeroKeyGradients(b, kv, key_begin, key_end);
  for (int64_t r = 0; r < a.heads / Hkv; ++r) {
    const int64_t slice = group_query_slice(kv, r, a.heads, Hkv);
    BackwardRows<W>(b, slice, 0, a.q_len, key_begin, key_end, BackwardParts{true, false}, scratch);
    BackwardNaNRows(b, slice, 0, 0, key_begin, key_end);
  }
}
template <Bf16Way W = Bf16Way::Fma>
void FlashAttentionBackwardQueriesF32(const AttentionBackwardArgs<float>& b, int64_t slice, int64_t row_begin,
                                      int64_t row_end, FlashScratch& scratch) {
  BackwardRows<W>(b, slice, row_begin, row_end, 0, b.forward.kv_len, BackwardParts{false, true}, scratch);
  BackwardNaNRows(b, slice, row_begin, row_end, 0, 0);
}

inline int64_t FlashAttentionBackwardRowTileF32() {
  return static_cast<int64_t>(kMaxQueryVectors * hn::Lanes(DF32()));
}
inline int64_t FlashAttentionBackwardKeyTileF32() { return static_cast<int64_t>(KeyTile(kMaxQueryVectors)); }

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
