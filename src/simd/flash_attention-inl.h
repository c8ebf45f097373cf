// src/simd/flash_attention-inl.h: the fused ("flash") attention forward in
// float32, written once against Highway and compiled once per SIMD target by
// src/simd/flash_attention.cpp.
//
// Legend (as in src/contract/attention_args.hpp): N slices, L queries, S keys,
// D query/key width, Dv value width; `lanes` floats per vector (16 on AVX3).
//
// What it computes (attention_args.hpp, for slice n and query row i):
//   s_ij  = softcap(scale·<q_i, k_j>) + alibi_ij + attn_mask[i,j] + key_padding[b,j]
//           (+ causal and window -inf)
//   out_i = Σ_j softmax_j(s_ij)·keep_ij/(1-p) · v_j
// without ever storing the L×S scores: a tile of queries walks over tiles of
// keys and keeps, per query, the running max m, the running sum
// l = Σ_j exp(s_ij - m) and the running numerator acc = Σ_j exp(s_ij - m)·v_j,
// rescaling l and acc by exp(m_old - m_new) when the max grows (the online
// softmax of Milakov & Gimelshein 2018, used for attention by Rabe & Staats
// 2021 and by FlashAttention, Dao et al. 2022). At the end out_i = acc_i / l_i.
//
// Layout: queries in lanes. Rather than reduce each score row across keys
// (horizontal sums and maxima, costly in SIMD), the query tile is transposed
// (qt [D][bq], bq = nvq·lanes queries) so that every softmax step is
// vertical:
//   st[j][q]  = Σ_d k[j][d] · qt[d][q]         QKᵀ: broadcast k, load qt
//   m[q]      = max(m[q], max_j st[j][q])      elementwise over key rows
//   st[j][q]  = exp(st[j][q] - m[q])           elementwise
//   ot[c][q]  = alpha[q]·ot[c][q] + Σ_j v[j][c]·st[j][q]   PV: broadcast v, load st
// so there are no horizontal reductions, K and V are read in place (row-major,
// as the caller stores them; only the query tile is transposed, once per
// tile), and both products are register-blocked micro-kernels of
// rows × nvq vectors (see BlockRows). Measured choice, recorded here: these
// micro-kernels instead of cblas_sgemm on tiles. On a 2-core Zen 5 (AVX-512),
// per CPU-second, one thread (bench/bench_kernels.cpp, SgemmTiles vs Flash):
//   cblas_sgemm, a 64-query × 128-key tile's two products, D = 64, BLAS
//   single-threaded (as it must be inside our OpenMP region), no softmax:
//     OPENBLAS_CORETYPE=Haswell (that machine's default)      84 GFLOP/s
//     OPENBLAS_CORETYPE unset (AVX-512 kernels)               144 GFLOP/s
//   this kernel, the whole attention including the softmax:   ~180 GFLOP/s
// BLAS pays packing and dispatch on every small call and would make our
// speed depend on OPENBLAS_CORETYPE.
//
// Exp is computed as 2^x on (s - m)·log2(e) with our own polynomial
// (Exp2NonPositive, src/simd/exp2-inl.h).
//
// The score rules (masks, causal, window, soft-cap, ALiBi, fully masked rows)
// are the vector twins of src/contract/score_rule.hpp, each behind a branch
// taken once per key tile, so that a call without them runs the loops it
// ran before they existed; dropout calls its scalar dropout_keep per
// element, so every kernel drops the same elements.
//
// 16-bit storage (AttentionArgs::narrow: the bf16 and f16 modules): the
// same kernel with E = bfloat16 or float16. Q is widened as the query tile
// is packed; each key tile's K rows and V rows are widened once into a
// packed float tile (MaxKeyTile × D and × Dv floats, 40 KiB each at D = 64,
// in L1/L2) by WidenRows (bf16_compute-inl.h), then the float micro-kernels
// run on them unchanged: the widening costs keys·(D + Dv) conversions per
// query tile, against bq·keys·(D + Dv) FMAs (1/64 at bq = 64). Scores,
// softmax, running max, sums and the accumulators stay float32; each output
// row is rounded to E once (to nearest even) as it is stored.
//
// bf16 has a second way (Bf16Way::Dot), chosen per host by measured rate
// (flash_attention.cpp, docs/precision.md "The two bf16 dot ways"): QKᵀ and
// PV on bf16 pairs with vdpbf16ps (bf16_compute-inl.h's PairDot), two
// products per float32 lane per instruction. The query tile is packed as
// pairs along D (qp [ceil(D/2)][bq], unscaled: the scale multiplies the
// scores), each key tile's K rows as pairs along D (kp [keys][ceil(D/2)]),
// its V rows as pairs down the keys (vp [ceil(keys/2)][Dv]), and the
// probabilities, rounded to bf16 once, as pairs down the keys (pp
// [ceil(keys/2)][bq]); the micro-kernels are the float ones with PairDot
// for MulAdd over half the steps. What it changes: the summation order
// (pairs), and P rounded to bf16 before PV (the float way keeps it float32).

// Per-target include guard (Highway's pattern for -inl.h files).
#if defined(MULTIHEAD_SIMD_FLASH_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MULTIHEAD_SIMD_FLASH_ATTENTION_INL_H_
#undef MULTIHEAD_SIMD_FLASH_ATTENTION_INL_H_
#else
#define MULTIHEAD_SIMD_FLASH_ATTENTION_INL_H_
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "contract/score_rule.hpp"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "simd/bf16_compute-inl.h"
#include "simd/exp2-inl.h"
#include "simd/flash_attention.hpp"
#include "simd/targets.hpp"

HWY_BEFORE_NAMESPACE();
namespace multihead::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Vector registers of the target: the register blocks below are sized so
// that accumulators + operands fit without spilling.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
inline constexpr size_t kVectorRegisters = 32;
#else
inline constexpr size_t kVectorRegisters = 16;
#endif

// Widest query tile, in vectors (bq = nvq·lanes queries): 4 with 32
// registers (64 queries on AVX-512), 2 with 16 (16 queries on AVX2).
// Measured (1 thread, L = S = 2048, D = 64, AVX3): 4 vectors 70.3 ms,
// 3 vectors 71.5 ms, 2 vectors 72.9 ms (best of 5, interleaved; run-to-run
// noise on the shared machine ~3%). 4 halves the K/V re-reads of 2.
inline constexpr size_t kMaxQueryVectors = kVectorRegisters >= 32 ? 4 : 2;

// Rows (keys in QKᵀ, value columns in PV) of a register block with nvq query
// vectors: rows·nvq accumulators + nvq operands + 1 broadcast must fit in the
// registers; at least 12 accumulators keep both FMA pipes busy across the
// 4-cycle FMA latency. AVX-512: 6×4 = 24 accumulators; AVX2: 6×2 = 12.
constexpr size_t BlockRows(size_t nvq) {
  const size_t rows = (kVectorRegisters - nvq - 2) / nvq;
  return rows > 8 ? 8 : rows;
}

// Keys per tile: a multiple of the block rows near 128, so the score tile
// st [keys][bq] (32 KiB at bq = 64) and the K and V rows it touches stay
// in L1/L2 between the QKᵀ, softmax and PV passes. Measured as above:
// 64 keys 82.8 ms, 128 keys 75.3 ms, 192 keys 83.4 ms.
constexpr size_t KeyTile(size_t nvq) { return (128 / BlockRows(nvq)) * BlockRows(nvq); }
// The last tile of a key range may take up to a quarter more keys rather than
// leave a sliver: S = 128 runs as one tile of 128, not 126 + 2 (a tile costs
// a rescale of the accumulators however few keys it has).
constexpr size_t MaxKeyTile(size_t nvq) { return KeyTile(nvq) + KeyTile(nvq) / 4; }

// Floats of scratch for a query tile of nvq vectors: qt [D][bq], ot [Dv][bq],
// st [MaxKeyTile][bq], and m, l, alpha, tmax [bq].
inline size_t ScratchFloats(size_t nvq, size_t head_dim, size_t value_dim) {
  return (head_dim + value_dim + MaxKeyTile(nvq) + 4) * nvq * hn::Lanes(DF32());
}
// With 16-bit K and V: also the widened key tile kw [MaxKeyTile][D] and
// value tile vw [MaxKeyTile][Dv].
inline size_t NarrowScratchFloats(size_t nvq, size_t head_dim, size_t value_dim) {
  return ScratchFloats(nvq, head_dim, value_dim) + MaxKeyTile(nvq) * (head_dim + value_dim);
}
// With Bf16Way::Dot: also pp [ceil(MaxKeyTile/2)][bq], before kw (kp, vp
// and qp fit where kw, vw and qt were: ceil(n/2) <= n).
inline size_t DotScratchFloats(size_t nvq, size_t head_dim, size_t value_dim) {
  return NarrowScratchFloats(nvq, head_dim, value_dim) + (MaxKeyTile(nvq) + 1) / 2 * nvq * hn::Lanes(DF32());
}

// ---- micro-kernels --------------------------------------------------------

// QKᵀ for a block of KR keys and the bq = NVQ·lanes queries of the tile:
//   st[r][q] = Σ_d k[r][d] · qt[d][q]   (r < KR; k rows ldk apart)
//   tmax[q]  = max(tmax[q], max_r st[r][q])   (the tile's row max, for free)
// KR·NVQ accumulators; per d: NVQ loads of qt, KR broadcasts of k.
template <size_t NVQ, size_t KR>
HWY_INLINE void ScoresBlock(DF32 df, const float* HWY_RESTRICT k, size_t ldk, size_t head_dim,
                            const float* HWY_RESTRICT qt, size_t bq, float* HWY_RESTRICT st,
                            float* HWY_RESTRICT tmax) {
  const size_t lanes = hn::Lanes(df);
  VF32 acc[KR][NVQ];
  HWY_UNROLL(8)
  for (size_t r = 0; r < KR; ++r) {
    HWY_UNROLL(4)
    for (size_t v = 0; v < NVQ; ++v) acc[r][v] = hn::Zero(df);
  }
  for (size_t d = 0; d < head_dim; ++d) {
    VF32 q[NVQ];
    HWY_UNROLL(4)
    for (size_t v = 0; v < NVQ; ++v) q[v] = hn::Load(df, qt + d * bq + v * lanes);
    HWY_UNROLL(8)
    for (size_t r = 0; r < KR; ++r) {
      const VF32 kb = hn::Set(df, k[r * ldk + d]);
      HWY_UNROLL(4)
      for (size_t v = 0; v < NVQ; ++v) acc[r][v] = hn::MulAdd(kb, q[v], acc[r][v]);
    }
  }
  HWY_UNROLL(8)
  for (size_t r = 0; r < KR; ++r) {
    HWY_UNROLL(4)
    for (size_t v = 0; v < NVQ; ++v) hn::Store(acc[r][v], df, st + r * bq + v * lanes);
  }
  HWY_UNROLL(4)
  for (size_t v = 0; v < NVQ; ++v) {
    VF32 block_max = hn::Load(df, tmax + v * lanes);
    HWY_UNROLL(8)
    for (size_t r = 0; r < KR; ++r) block_max = hn::Max(block_max, acc[r][v]);
    hn::Store(block_max, df, tmax + v * lanes);
  }
}

// The last keys % KR of a tile: one block of `rows` (< KR) keys.
template <size_t NVQ, size_t R>
HWY_INLINE void ScoresRemainder(size_t rows, DF32 df, const float* HWY_RESTRICT k, size_t ldk,
                                size_t head_dim, const float* HWY_RESTRICT qt, size_t bq,
                                float* HWY_RESTRICT st, float* HWY_RESTRICT tmax) {
  if constexpr (R > 0) {
    if (rows == R) return ScoresBlock<NVQ, R>(df, k, ldk, head_dim, qt, bq, st, tmax);
    ScoresRemainder<NVQ, R - 1>(rows, df, k, ldk, head_dim, qt, bq, st, tmax);
  }
}

// PV for a block of RV value columns and the bq queries, over `keys` keys:
//   ot[c][q] = alpha[q]·ot[c][q] + Σ_j v[j][c] · p[j][q]   (c < RV)
// where v points at column c0 of key row 0 (rows ldv apart) and ot at row
// c0. The online-softmax rescale rides on the accumulator load.
template <size_t NVQ, size_t RV>
HWY_INLINE void AccumulateBlock(DF32 df, const float* HWY_RESTRICT v, size_t ldv, size_t keys,
                                const float* HWY_RESTRICT p, size_t bq,
                                const float* HWY_RESTRICT alpha, float* HWY_RESTRICT ot) {
  const size_t lanes = hn::Lanes(df);
  VF32 acc[RV][NVQ];
  VF32 a[NVQ];
  HWY_UNROLL(4)
  for (size_t w = 0; w < NVQ; ++w) a[w] = hn::Load(df, alpha + w * lanes);
  HWY_UNROLL(8)
  for (size_t c = 0; c < RV; ++c) {
    HWY_UNROLL(4)
    for (size_t w = 0; w < NVQ; ++w) {
      acc[c][w] = hn::Mul(hn::Load(df, ot + c * bq + w * lanes), a[w]);
    }
  }
  for (size_t j = 0; j < keys; ++j) {
    VF32 pj[NVQ];
    HWY_UNROLL(4)
    for (size_t w = 0; w < NVQ; ++w) pj[w] = hn::Load(df, p + j * bq + w * lanes);
    HWY_UNROLL(8)
    for (size_t c = 0; c < RV; ++c) {
      const VF32 vb = hn::Set(df, v[j * ldv + c]);
      HWY_UNROLL(4)
      for (size_t w = 0; w < NVQ; ++w) acc[c][w] = hn::MulAdd(vb, pj[w], acc[c][w]);
    }
  }
  HWY_UNROLL(8)
  for (size_t c = 0; c < RV; ++c) {
    HWY_UNROLL(4)
    for (size_t w = 0; w < NVQ; ++w) hn::Store(acc[c][w], df, ot + c * bq + w * lanes);
  }
}

template <size_t NVQ, size_t R>
HWY_INLINE void AccumulateRemainder(size_t cols, DF32 df, const float* HWY_RESTRICT v, size_t ldv,
                                    size_t keys, const float* HWY_RESTRICT p, size_t bq,
                                    const float* HWY_RESTRICT alpha, float* HWY_RESTRICT ot) {
  if constexpr (R > 0) {
    if (cols == R) return AccumulateBlock<NVQ, R>(df, v, ldv, keys, p, bq, alpha, ot);
    AccumulateRemainder<NVQ, R - 1>(cols, df, v, ldv, keys, p, bq, alpha, ot);
  }
}

// ---- micro-kernels of the bf16 pair way (Bf16Way::Dot) -----------------------

// The pair way's inner tile, shared by QKᵀ and PV: for p < pairs,
// acc[r][v] += PairDot(b[r·row_step + p·pair_step], x[p·bx + v·lanes]): R
// rows of b (one bf16 pair each, broadcast) against NVQ vectors of x (pairs
// of the query tile, bx apart per pair). QKᵀ walks K's rows (row_step ldk,
// pair_step 1), PV V's columns (row_step 1, pair_step ldv).
template <size_t NVQ, size_t R, bool kNative>
HWY_INLINE void PairDotTile(DF32 df, const uint32_t* HWY_RESTRICT b, size_t row_step, size_t pair_step,
                            size_t pairs, const uint32_t* HWY_RESTRICT x, size_t bx, VF32 (&acc)[R][NVQ]) {
  const hn::RebindToUnsigned<DF32> du;
  const size_t lanes = hn::Lanes(df);
  for (size_t p = 0; p < pairs; ++p) {
    hn::Vec<decltype(du)> xv[NVQ];
    HWY_UNROLL(4)
    for (size_t v = 0; v < NVQ; ++v) xv[v] = hn::Load(du, x + p * bx + v * lanes);
    HWY_UNROLL(8)
    for (size_t r = 0; r < R; ++r) {
      const auto br = hn::Set(du, b[r * row_step + p * pair_step]);
      HWY_UNROLL(4)
      for (size_t v = 0; v < NVQ; ++v) acc[r][v] = PairDot<kNative>(df, br, xv[v], acc[r][v]);
    }
  }
}

// ScoresBlock on pairs: st[r][q] = scale · Σ_p PairDot(kp[r][p], qp[p][q])
// over `pairs` pairs (kp rows ldk pairs apart), and the tile's row max.
template <size_t NVQ, size_t KR, bool kNative>
HWY_INLINE void ScoresBlockDot(DF32 df, const uint32_t* HWY_RESTRICT kp, size_t ldk, size_t pairs,
                               const uint32_t* HWY_RESTRICT qp, size_t bq, float scale, float* HWY_RESTRICT st,
                               float* HWY_RESTRICT tmax) {
  const size_t lanes = hn::Lanes(df);
  VF32 acc[KR][NVQ];
  HWY_UNROLL(8)
  for (size_t r = 0; r < KR; ++r) {
    HWY_UNROLL(4)
    for (size_t v = 0; v < NVQ; ++v) acc[r][v] = hn::Zero(df);
  }
  PairDotTile<NVQ, KR, kNative>(df, kp, ldk, 1, pairs, qp, bq, acc);
  const VF32 s = hn::Set(df, scale);
  HWY_UNROLL(4)
  for (size_t v = 0; v < NVQ; ++v) {
    VF32 block_max = hn::Load(df, tmax + v * lanes);
    HWY_UNROLL(8)
    for (size_t r = 0; r < KR; ++r) {
      acc[r][v] = hn::Mul(acc[r][v], s);
      hn::Store(acc[r][v], df, st + r * bq + v * lanes);
      block_max = hn::Max(block_max, acc[r][v]);
    }
    hn::Store(block_max, df, tmax + v * lanes);
  }
}

template <size_t NVQ, size_t R, bool kNative>
HWY_INLINE void ScoresRemainderDot(size_t rows, DF32 df, const uint32_t* HWY_RESTRICT kp, size_t ldk, size_t pairs,
                                   const uint32_t* HWY_RESTRICT qp, size_t bq, float scale, float* HWY_RESTRICT st,
                                   float* HWY_RESTRICT tmax) {
  if constexpr (R > 0) {
    if (rows == R) return ScoresBlockDot<NVQ, R, kNative>(df, kp, ldk, pairs, qp, bq, scale, st, tmax);
    ScoresRemainderDot<NVQ, R - 1, kNative>(rows, df, kp, ldk, pairs, qp, bq, scale, st, tmax);
  }
}

// AccumulateBlock on pairs of keys: ot[c][q] = alpha[q]·ot[c][q] +
// Σ_p PairDot(vp[p][c], pp[p][q]) over `pairs` key pairs (vp rows ldv apart,
// at column c0; ot at row c0).
template <size_t NVQ, size_t RV, bool kNative>
HWY_INLINE void AccumulateBlockDot(DF32 df, const uint32_t* HWY_RESTRICT vp, size_t ldv, size_t pairs,
                                   const uint32_t* HWY_RESTRICT pp, size_t bq, const float* HWY_RESTRICT alpha,
                                   float* HWY_RESTRICT ot) {
  const size_t lanes = hn::Lanes(df);
  VF32 acc[RV][NVQ];
  VF32 a[NVQ];
  HWY_UNROLL(4)
  for (size_t w = 0; w < NVQ; ++w) a[w] = hn::Load(df, alpha + w * lanes);
  HWY_UNROLL(8)
  for (size_t c = 0; c < RV; ++c) {
    HWY_UNROLL(4)
    for (size_t w = 0; w < NVQ; ++w) acc[c][w] = hn::Mul(hn::Load(df, ot + c * bq + w * lanes), a[w]);
  }
  PairDotTile<NVQ, RV, kNative>(df, vp, 1, ldv, pairs, pp, bq, acc);
  HWY_UNROLL(8)
  for (size_t c = 0; c < RV; ++c) {
    HWY_UNROLL(4)
    for (size_t w = 0; w < NVQ; ++w) hn::Store(acc[c][w], df, ot + c * bq + w * lanes);
  }
}

template <size_t NVQ, size_t R, bool kNative>
HWY_INLINE void AccumulateRemainderDot(size_t cols, DF32 df, const uint32_t* HWY_RESTRICT vp, size_t ldv,
                                       size_t pairs, const uint32_t* HWY_RESTRICT pp, size_t bq,
                                       const float* HWY_RESTRICT alpha, float* HWY_RESTRICT ot) {
  if constexpr (R > 0) {
    if (cols == R) return AccumulateBlockDot<NVQ, R, kNative>(df, vp, ldv, pairs, pp, bq, alpha, ot);
    AccumulateRemainderDot<NVQ, R - 1, kNative>(cols, df, vp, ldv, pairs, pp, bq, alpha, ot);
  }
}

// ---- one query tile -------------------------------------------------------

// What a query tile [i0, i0 + rows) of slice n reads, hoisted out of the
// key loop.
struct QueryTileInputs {
  const float* k;  // [S][D] of slice n, rows k_row apart
  const float* v;  // [S][Dv] of slice n, rows v_row apart
  // With 16-bit storage (AttentionArgs::narrow) k and v are nullptr and
  // these point at slice n's rows, of the kernel's E.
  const void* k_narrow = nullptr;
  const void* v_narrow = nullptr;
  // bf16's pair way, where the call packed K and V once
  // (NarrowOperands::k_pairs, v_pairs): slice n's packed rows, else nullptr.
  const uint32_t* k_pairs = nullptr;
  const uint32_t* v_pairs = nullptr;
  size_t k_row, v_row;
  SliceModifiers<float> mods;  // score_rule.hpp: masks of slice n, causal rule
  int64_t causal_cols;         // keys j < causal_cols take part in causal masking (0 = none)
  int64_t causal_shift;        // mods.shift clamped to [-L, S]: same visibility, fits int32
  int64_t position_cols;       // keys j < position_cols have a position (window, ALiBi)
};

// The query tile's scratch (QueryTile carves it out of FlashScratch):
// qt [D][bq] scaled queries, st [MaxKeyTile][bq] scores, ot [Dv][bq] the
// running numerators, and per query m (running max), l (running sum),
// alpha (this tile's rescale) and tmax (this tile's max).
struct TileState {
  int64_t slice, i0;
  size_t rows;
  const float* HWY_RESTRICT qt;
  float* HWY_RESTRICT st;
  float* HWY_RESTRICT ot;
  float* HWY_RESTRICT m;
  float* HWY_RESTRICT l;
  float* HWY_RESTRICT alpha;
  float* HWY_RESTRICT tmax;
  // 16-bit K/V only: the key tile's widened K and V rows (packed); with
  // Bf16Way::Dot, the same space holds kp and vp, qt holds qp, and pp the
  // paired probabilities.
  float* HWY_RESTRICT kw = nullptr;
  float* HWY_RESTRICT vw = nullptr;
  uint32_t* HWY_RESTRICT pp = nullptr;
};

// The bf16 kernel's two ways (header): Fma widens to float32; Dot runs on
// bf16 pairs, kNative with vdpbf16ps, else with Highway's widening.
enum class Bf16Way { Fma, Dot, DotNative };

// st [keys][bq] = scale·Q Kᵀ for keys [j0, j0 + keys) (the scale is folded
// into qt), and tmax [bq] = the tile's max score per query. E: K's storage.
template <size_t NVQ, class E = float>
HWY_INLINE void TileScores(const AttentionArgs<float>& a, const QueryTileInputs& in, const TileState& t,
                           int64_t j0, size_t keys) {
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  const size_t bq = NVQ * lanes;
  constexpr size_t KR = BlockRows(NVQ);
  const size_t head_dim = static_cast<size_t>(a.head_dim);
  const VF32 neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
  for (size_t w = 0; w < NVQ; ++w) hn::Store(neg_inf, df, t.tmax + w * lanes);
  // 16-bit storage: in.k is null (the rows are in k_narrow), so no offset
  // may be applied to it.
  const float* kt = std::is_same_v<E, float> ? in.k + static_cast<size_t>(j0) * in.k_row : nullptr;
  size_t ldk = in.k_row;
  if constexpr (!std::is_same_v<E, float>) {
    WidenRows(static_cast<const E*>(in.k_narrow) + static_cast<size_t>(j0) * in.k_row, in.k_row, keys, head_dim,
              t.kw);
    kt = t.kw;
    ldk = head_dim;
  }
  size_t j = 0;
  for (; j + KR <= keys; j += KR) {
    ScoresBlock<NVQ, KR>(df, kt + j * ldk, ldk, head_dim, t.qt, bq, t.st + j * bq, t.tmax);
  }
  ScoresRemainder<NVQ, KR - 1>(keys - j, df, kt + j * ldk, ldk, head_dim, t.qt, bq, t.st + j * bq, t.tmax);
}

// Vector twin of causal_visible (score_rule.hpp): -inf where key j < cols
// is past query i's diagonal, j > i + shift. Only tiles that cross the
// diagonal get here (the caller skips tiles entirely past it); returns
// whether this one did.
template <size_t NVQ>
HWY_INLINE bool CausalMaskTile(const QueryTileInputs& in, const TileState& t, int64_t j0, size_t keys) {
  const DF32 df;
  const hn::RebindToSigned<DF32> di;
  const size_t lanes = hn::Lanes(df);
  const size_t bq = NVQ * lanes;
  const int64_t causal_end = std::min<int64_t>(j0 + static_cast<int64_t>(keys), in.causal_cols);
  const int64_t first_hidden = t.i0 + in.causal_shift + 1;  // for the tile's first query
  if (causal_end <= first_hidden) return false;
  const VF32 neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
  for (int64_t j = std::max(j0, first_hidden); j < causal_end; ++j) {
    float* HWY_RESTRICT row = t.st + static_cast<size_t>(j - j0) * bq;
    const auto key = hn::Set(di, static_cast<int32_t>(j));
    for (size_t w = 0; w < NVQ; ++w) {
      const auto diagonal =
          hn::Iota(di, static_cast<int32_t>(t.i0 + in.causal_shift + static_cast<int64_t>(w * lanes)));
      const auto hidden = hn::RebindMask(df, hn::Lt(diagonal, key));
      hn::Store(hn::IfThenElse(hidden, neg_inf, hn::Load(df, row + w * lanes)), df, row + w * lanes);
    }
  }
  return true;
}

// Vector twin of window_visible (score_rule.hpp): -inf where key j <
// position_cols is outside query i's window. Query lane r sits at position
// p = i0 + shift + r; key j is hidden from the lanes r >= j + w − (i0 +
// shift) (j <= p − w) and, without causal, from r <= j − w − (i0 + shift)
// (j >= p + w). Those lane bounds are found in int64 and clamped to the
// tile, so only small numbers reach the int32 lanes. The caller skips the
// key tiles wholly outside every window of the query tile.
template <size_t NVQ>
HWY_INLINE void WindowMaskTile(const QueryTileInputs& in, const TileState& t, int64_t j0, size_t keys) {
  const DF32 df;
  const hn::RebindToSigned<DF32> di;
  const size_t lanes = hn::Lanes(df);
  const int64_t bq = static_cast<int64_t>(NVQ * lanes);
  const int64_t w = in.mods.window, p0 = t.i0 + in.mods.shift;
  const int64_t end = std::min<int64_t>(j0 + static_cast<int64_t>(keys), in.position_cols);
  const VF32 neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
  for (int64_t j = j0; j < end; ++j) {
    const int64_t from = std::clamp<int64_t>(j + w - p0, 0, bq);  // lanes >= from: too far behind
    const int64_t upto = in.mods.causal.enabled ? -1 : std::clamp<int64_t>(j - w - p0, -1, bq - 1);
    if (from >= bq && upto < 0) continue;
    float* HWY_RESTRICT row = t.st + static_cast<size_t>(j - j0) * static_cast<size_t>(bq);
    // lane >= from and lane <= upto, as Gt and Lt (x86 has no signed Ge).
    const auto below_from = hn::Set(di, static_cast<int32_t>(from - 1));
    const auto past_upto = hn::Set(di, static_cast<int32_t>(upto + 1));
    for (size_t v = 0; v < NVQ; ++v) {
      const auto lane = hn::Iota(di, static_cast<int32_t>(v * lanes));
      const auto hidden = hn::RebindMask(df, hn::Or(hn::Gt(lane, below_from), hn::Lt(lane, past_upto)));
      hn::Store(hn::IfThenElse(hidden, neg_inf, hn::Load(df, row + v * lanes)), df, row + v * lanes);
    }
  }
}

// Vector twin of soft_cap (score_rule.hpp): s = cap·tanh(s / cap) on every
// score of the tile (Highway's Tanh, <= 4 ulp).
template <size_t NVQ>
HWY_INLINE void SoftCapTile(const AttentionArgs<float>& a, const TileState& t, size_t keys) {
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  const VF32 cap = hn::Set(df, a.modifiers.softcap);
  const VF32 inv_cap = hn::Set(df, 1.0f / a.modifiers.softcap);
  for (size_t x = 0; x < keys * NVQ; ++x) {
    float* HWY_RESTRICT s = t.st + x * lanes;
    hn::Store(hn::Mul(cap, hn::Tanh(df, hn::Mul(hn::Load(df, s), inv_cap))), df, s);
  }
}

// Vector twin of alibi_bias (score_rule.hpp): st[j][r] −= slope·|p_r − j|
// for keys j < position_cols, p_r = i0 + shift + r. The distance is
// formed as float((i0 + shift) − j) + r, exact below 2^24 as the scalar's.
template <size_t NVQ>
HWY_INLINE void AlibiTile(const QueryTileInputs& in, const TileState& t, int64_t j0, size_t keys) {
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  const size_t bq = NVQ * lanes;
  const int64_t p0 = t.i0 + in.mods.shift;
  const VF32 neg_slope = hn::Set(df, -in.mods.alibi_slope);
  const int64_t end = std::min<int64_t>(j0 + static_cast<int64_t>(keys), in.position_cols);
  for (int64_t j = j0; j < end; ++j) {
    float* HWY_RESTRICT row = t.st + static_cast<size_t>(j - j0) * bq;
    const VF32 base = hn::Set(df, static_cast<float>(p0 - j));
    for (size_t v = 0; v < NVQ; ++v) {
      const VF32 distance = hn::Abs(hn::Add(base, hn::Iota(df, static_cast<float>(v * lanes))));
      hn::Store(hn::Add(hn::Load(df, row + v * lanes), hn::Mul(neg_slope, distance)), df, row + v * lanes);
    }
  }
}

// Vector twin of modified_score (score_rule.hpp) after the soft-cap, in its
// order: + ALiBi, + attn_mask[i][j], + key_padding[j], then causal and
// window -inf. Returns whether any of them touched the tile. Split from the
// cap so that the backward (flash_attention_backward-inl.h) can take the
// cap's slope in between.
template <size_t NVQ>
HWY_INLINE bool ApplyScoreModifiersAfterCap(const AttentionArgs<float>& a, const QueryTileInputs& in,
                                            const TileState& t, int64_t j0, size_t keys) {
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  const size_t bq = NVQ * lanes;
  if (in.mods.alibi) AlibiTile<NVQ>(in, t, j0, keys);
  // attn_mask is stored row-major [L][S], so it is added transposed, by element.
  if (in.mods.attn_mask != nullptr) {
    for (size_t r = 0; r < t.rows; ++r) {
      const float* HWY_RESTRICT mask_row = in.mods.attn_mask + (t.i0 + static_cast<int64_t>(r)) * a.kv_len + j0;
      for (size_t j = 0; j < keys; ++j) t.st[j * bq + r] += mask_row[j];
    }
  }
  // key_padding: one value per key row of st.
  if (in.mods.key_padding != nullptr) {
    for (size_t j = 0; j < keys; ++j) {
      const VF32 pad = hn::Set(df, in.mods.key_padding[j0 + static_cast<int64_t>(j)]);
      float* HWY_RESTRICT row = t.st + j * bq;
      for (size_t w = 0; w < NVQ; ++w) {
        hn::Store(hn::Add(hn::Load(df, row + w * lanes), pad), df, row + w * lanes);
      }
    }
  }
  const bool causal = CausalMaskTile<NVQ>(in, t, j0, keys);
  const bool window = in.mods.window > 0;
  if (window) WindowMaskTile<NVQ>(in, t, j0, keys);
  return causal || window || in.mods.alibi || in.mods.attn_mask != nullptr || in.mods.key_padding != nullptr;
}

// Vector twin of modified_score (score_rule.hpp) on the tile's scores, in
// its order: soft-cap, + ALiBi, + attn_mask[i][j], + key_padding[j], then
// causal and window -inf. Returns whether any modifier touched the tile
// (then tmax no longer holds its max).
template <size_t NVQ>
HWY_INLINE bool ApplyScoreModifiers(const AttentionArgs<float>& a, const QueryTileInputs& in,
                                    const TileState& t, int64_t j0, size_t keys) {
  const bool softcap = a.modifiers.softcap > 0.0f;
  if (softcap) SoftCapTile<NVQ>(a, t, keys);
  const bool modified = ApplyScoreModifiersAfterCap<NVQ>(a, in, t, j0, keys);
  return softcap || modified;
}

// Online softmax: m_new = max(m, max_j s_j); alpha = exp(m - m_new);
// p_j = exp(s_j - m_new); l = alpha·l + Σ_j p_j. A query with no finite
// score yet has m_new = -inf: it uses 0 instead, so that s - m is -inf
// (p = 0) and never (-inf) - (-inf) = NaN. A NaN score (NaN input) may or
// may not win the max, depending on the target; either way its p is NaN,
// so l and the row's output are NaN, as in the reference and PyTorch.
// Unmodified scores take their max from the QKᵀ epilogue (tmax).
template <size_t NVQ>
HWY_INLINE void OnlineSoftmax(const TileState& t, size_t keys, bool modified) {
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  const size_t bq = NVQ * lanes;
  const VF32 neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
  const VF32 log2e = hn::Set(df, 1.442695040888963407359924681f);
  VF32 m_use[NVQ];
  VF32 sum[NVQ];
  for (size_t w = 0; w < NVQ; ++w) {
    const VF32 m_old = hn::Load(df, t.m + w * lanes);
    VF32 m_new = m_old;
    if (modified) {
      for (size_t j = 0; j < keys; ++j) m_new = hn::Max(m_new, hn::Load(df, t.st + j * bq + w * lanes));
    } else {
      m_new = hn::Max(m_new, hn::Load(df, t.tmax + w * lanes));
    }
    m_use[w] = hn::IfThenZeroElse(hn::Eq(m_new, neg_inf), m_new);
    hn::Store(m_new, df, t.m + w * lanes);
    hn::Store(Exp2NonPositive(df, hn::Mul(hn::Sub(m_old, m_use[w]), log2e)), df, t.alpha + w * lanes);
    sum[w] = hn::Zero(df);
  }
  for (size_t j = 0; j < keys; ++j) {
    float* HWY_RESTRICT row = t.st + j * bq;
    HWY_UNROLL(4)
    for (size_t w = 0; w < NVQ; ++w) {
      const VF32 s = hn::Load(df, row + w * lanes);
      const VF32 p = Exp2NonPositive(df, hn::Mul(hn::Sub(s, m_use[w]), log2e));
      sum[w] = hn::Add(sum[w], p);
      hn::Store(p, df, row + w * lanes);
    }
  }
  for (size_t w = 0; w < NVQ; ++w) {
    const VF32 lw = hn::Load(df, t.l + w * lanes);
    hn::Store(hn::MulAdd(lw, hn::Load(df, t.alpha + w * lanes), sum[w]), df, t.l + w * lanes);
  }
}

// Dropout (dropout_keep, score_rule.hpp): a dropped weight contributes
// nothing to acc, while l keeps the undropped sum (softmax first, then
// dropout, as PyTorch). Scalar: meant for training, not speed.
template <size_t NVQ>
HWY_INLINE void DropoutTile(const AttentionArgs<float>& a, const TileState& t, int64_t j0, size_t keys) {
  const size_t bq = NVQ * hn::Lanes(DF32());
  for (size_t j = 0; j < keys; ++j) {
    for (size_t r = 0; r < t.rows; ++r) {
      if (!dropout_keep(a.dropout, t.slice, t.i0 + static_cast<int64_t>(r), j0 + static_cast<int64_t>(j))) {
        t.st[j * bq + r] = 0.0f;
      }
    }
  }
}

// ot = alpha·ot + Pᵀ-weighted sum of the value rows [j0, j0 + keys).
// E: V's storage.
template <size_t NVQ, class E = float>
HWY_INLINE void AccumulateValues(const AttentionArgs<float>& a, const QueryTileInputs& in, const TileState& t,
                                 int64_t j0, size_t keys) {
  const DF32 df;
  const size_t bq = NVQ * hn::Lanes(df);
  constexpr size_t KR = BlockRows(NVQ);
  const size_t value_dim = static_cast<size_t>(a.value_dim);
  const float* vt = std::is_same_v<E, float> ? in.v + static_cast<size_t>(j0) * in.v_row : nullptr;  // as kt
  size_t ldv = in.v_row;
  if constexpr (!std::is_same_v<E, float>) {
    WidenRows(static_cast<const E*>(in.v_narrow) + static_cast<size_t>(j0) * in.v_row, in.v_row, keys, value_dim,
              t.vw);
    vt = t.vw;
    ldv = value_dim;
  }
  size_t c = 0;
  for (; c + KR <= value_dim; c += KR) {
    AccumulateBlock<NVQ, KR>(df, vt + c, ldv, keys, t.st, bq, t.alpha, t.ot + c * bq);
  }
  AccumulateRemainder<NVQ, KR - 1>(value_dim - c, df, vt + c, ldv, keys, t.st, bq, t.alpha, t.ot + c * bq);
}

// TileScores on bf16 pairs (Bf16Way::Dot): the key tile's K rows packed
// as pairs (kp, in kw's space), qp the packed query tile (in qt's space).
template <size_t NVQ, bool kNative>
HWY_INLINE void TileScoresDot(const AttentionArgs<float>& a, const QueryTileInputs& in, const TileState& t,
                              int64_t j0, size_t keys) {
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  const size_t bq = NVQ * lanes;
  constexpr size_t KR = BlockRows(NVQ);
  const size_t pairs = (static_cast<size_t>(a.head_dim) + 1) / 2;
  const VF32 neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
  for (size_t w = 0; w < NVQ; ++w) hn::Store(neg_inf, df, t.tmax + w * lanes);
  const uint32_t* HWY_RESTRICT qp = reinterpret_cast<const uint32_t*>(t.qt);
  const uint32_t* HWY_RESTRICT kp;
  if (in.k_pairs != nullptr) {
    kp = in.k_pairs + static_cast<size_t>(j0) * pairs;  // packed once per call
  } else {
    uint32_t* HWY_RESTRICT packed = reinterpret_cast<uint32_t*>(t.kw);
    PackRowPairs(static_cast<const bfloat16*>(in.k_narrow) + static_cast<size_t>(j0) * in.k_row, in.k_row, keys,
                 static_cast<size_t>(a.head_dim), packed);
    kp = packed;
  }
  size_t j = 0;
  for (; j + KR <= keys; j += KR)
    ScoresBlockDot<NVQ, KR, kNative>(df, kp + j * pairs, pairs, pairs, qp, bq, a.scale, t.st + j * bq, t.tmax);
  ScoresRemainderDot<NVQ, KR - 1, kNative>(keys - j, df, kp + j * pairs, pairs, pairs, qp, bq, a.scale,
                                           t.st + j * bq, t.tmax);
}

// Whether a call's pairs down the keys (pairing keys 2p and 2p + 1 from
// key 0) are a key tile [j0, j0 + keys)'s own pairs: the tile starts on an
// even key and ends on one, or ends at S (an odd S's last pair has the
// zero high that packing the tile gives). Otherwise (a window's or the
// causal range's odd edge) the tile packs its own. The forward's V pairs
// and the backward's K pairs (d_q) follow it.
HWY_INLINE bool CallPairsFitTile(int64_t j0, size_t keys, int64_t kv_len) {
  return j0 % 2 == 0 && (keys % 2 == 0 || j0 + static_cast<int64_t>(keys) == kv_len);
}

// AccumulateValues on bf16 pairs of keys: the probabilities rounded to bf16
// and paired (pp), the key tile's V rows paired (vp, in vw's space).
template <size_t NVQ, bool kNative>
HWY_INLINE void AccumulateValuesDot(const AttentionArgs<float>& a, const QueryTileInputs& in, const TileState& t,
                                    int64_t j0, size_t keys) {
  const DF32 df;
  const size_t bq = NVQ * hn::Lanes(df);
  constexpr size_t KR = BlockRows(NVQ);
  const size_t value_dim = static_cast<size_t>(a.value_dim);
  const size_t pairs = (keys + 1) / 2;
  // The call's pairs (in.v_pairs) where they fit the tile (CallPairsFitTile).
  const uint32_t* HWY_RESTRICT vp;
  if (in.v_pairs != nullptr && CallPairsFitTile(j0, keys, a.kv_len)) {
    vp = in.v_pairs + static_cast<size_t>(j0 / 2) * value_dim;
  } else {
    uint32_t* HWY_RESTRICT packed = reinterpret_cast<uint32_t*>(t.vw);
    PackColumnPairs(static_cast<const bfloat16*>(in.v_narrow) + static_cast<size_t>(j0) * in.v_row, in.v_row,
                    keys, value_dim, packed);
    vp = packed;
  }
  PackRoundedColumnPairs(df, t.st, keys, bq, t.pp);
  size_t c = 0;
  for (; c + KR <= value_dim; c += KR)
    AccumulateBlockDot<NVQ, KR, kNative>(df, vp + c, value_dim, pairs, t.pp, bq, t.alpha, t.ot + c * bq);
  AccumulateRemainderDot<NVQ, KR - 1, kNative>(value_dim - c, df, vp + c, value_dim, pairs, t.pp, bq, t.alpha,
                                               t.ot + c * bq);
}

// One key tile [j0, j0 + keys) for the query tile: scores, score modifiers,
// online softmax update, dropout, PV. W: the bf16 way (Fma for every other E).
template <size_t NVQ, class E = float, Bf16Way W = Bf16Way::Fma>
HWY_INLINE void KeyTileStep(const AttentionArgs<float>& a, const QueryTileInputs& in, const TileState& t,
                            int64_t j0, size_t keys) {
  constexpr bool kDot = W != Bf16Way::Fma;
  if constexpr (kDot) TileScoresDot<NVQ, W == Bf16Way::DotNative>(a, in, t, j0, keys);
  else TileScores<NVQ, E>(a, in, t, j0, keys);
  const bool modified = ApplyScoreModifiers<NVQ>(a, in, t, j0, keys);
  OnlineSoftmax<NVQ>(t, keys, modified);
  if (a.dropout.p > 0.0) DropoutTile<NVQ>(a, t, j0, keys);
  if constexpr (kDot) AccumulateValuesDot<NVQ, W == Bf16Way::DotNative>(a, in, t, j0, keys);
  else AccumulateValues<NVQ, E>(a, in, t, j0, keys);
}

// Keys [begin, end) in tiles of KeyTile(NVQ), step(j0, keys) for each; the
// last tile may take up to MaxKeyTile(NVQ) keys rather than leave a sliver.
template <size_t NVQ, class Step>
HWY_INLINE void KeyRange(int64_t begin, int64_t end, const Step& step) {
  for (int64_t j0 = begin; j0 < end;) {
    const int64_t left = end - j0;
    const size_t keys =
        static_cast<size_t>(left <= static_cast<int64_t>(MaxKeyTile(NVQ)) ? left : KeyTile(NVQ));
    step(j0, keys);
    j0 += static_cast<int64_t>(keys);
  }
}

// The key tiles that query rows [i0, i0 + rows) must visit, step(j0, keys)
// for each, in increasing j0: tiles that the causal rule or the window hide
// from every row of the query tile are skipped whole (the rule:
// visible_key_range, score_rule.hpp). The forward, the backward
// (flash_attention_backward-inl.h) and the weights recompute
// (flash_weights-inl.h) visit the same tiles.
template <size_t NVQ, class Step>
HWY_INLINE void VisitKeyTiles(const AttentionArgs<float>& a, const QueryTileInputs& in, int64_t i0, size_t rows,
                              const Step& step) {
  const VisibleKeys keys = visible_key_range(in.mods.causal, in.mods.window, in.mods.shift, a.kv_len, i0,
                                             i0 + static_cast<int64_t>(rows));
  KeyRange<NVQ>(keys.begin, keys.end, step);
  KeyRange<NVQ>(keys.rest, a.kv_len, step);
}

// Slice n's inputs for a query tile, with the causal rule resolved.
inline QueryTileInputs TileInputs(const AttentionArgs<float>& a, int64_t slice) {
  const int64_t L = a.q_len, S = a.kv_len;
  const int64_t Hkv = a.kv_heads_or_heads();  // grouped-query: kv_slice (attention_args.hpp)
  const SliceLayout k_layout = resolve_layout(a.k_layout, Hkv, S, a.head_dim);
  const SliceLayout v_layout = resolve_layout(a.v_layout, Hkv, S, a.value_dim);
  QueryTileInputs in;
  in.k = kv_slice_start(a.k, k_layout, slice, a.heads, Hkv);
  in.v = kv_slice_start(a.v, v_layout, slice, a.heads, Hkv);
  if (a.narrow.dtype != ComputeDtype::F32) {
    // 16-bit elements: the same offsets, in units of 2 bytes.
    in.k_narrow = kv_slice_start(static_cast<const uint16_t*>(a.narrow.k), k_layout, slice, a.heads, Hkv);
    in.v_narrow = kv_slice_start(static_cast<const uint16_t*>(a.narrow.v), v_layout, slice, a.heads, Hkv);
  }
  // bf16 pairs packed once per call: contiguous per K/V slice (attention_args.hpp).
  if (a.narrow.k_pairs != nullptr)
    in.k_pairs = kv_slice_start(a.narrow.k_pairs, resolve_layout(SliceLayout{}, Hkv, S, (a.head_dim + 1) / 2), slice,
                                a.heads, Hkv);
  if (a.narrow.v_pairs != nullptr)
    in.v_pairs = kv_slice_start(a.narrow.v_pairs, resolve_layout(SliceLayout{}, Hkv, (S + 1) / 2, a.value_dim),
                                slice, a.heads, Hkv);
  in.k_row = static_cast<size_t>(k_layout.row);
  in.v_row = static_cast<size_t>(v_layout.row);
  in.mods = slice_modifiers(a.modifiers, slice, a.heads, L, S);
  in.causal_cols = in.mods.causal.enabled ? std::min(in.mods.causal.cols, S) : 0;
  in.causal_shift = std::clamp<int64_t>(in.mods.shift, -L, S);
  in.position_cols = std::clamp<int64_t>(in.mods.causal.cols, 0, S);
  return in;
}

// qt [D][bq] = scale · q[i0 + r][d] of slice `slice`, for rows r < rows;
// padding queries (r >= rows) are 0 and their results are never stored.
// The query tile of the forward, the backward and the weights recompute.
// E: Q's storage (float: a.q; 16-bit: a.narrow.q, widened here).
template <size_t NVQ, class E = float>
HWY_INLINE void PackQueryTile(const AttentionArgs<float>& a, int64_t slice, int64_t i0, size_t rows,
                              float* HWY_RESTRICT qt) {
  const size_t bq = NVQ * hn::Lanes(DF32());
  const size_t head_dim = static_cast<size_t>(a.head_dim);
  const SliceLayout q_layout = resolve_layout(a.q_layout, a.heads, a.q_len, a.head_dim);
  const E* q_base;
  if constexpr (std::is_same_v<E, float>) {
    q_base = a.q;
  } else {
    q_base = static_cast<const E*>(a.narrow.q);
  }
  const E* HWY_RESTRICT q = slice_start(q_base, q_layout, slice, a.heads) + i0 * q_layout.row;
  std::fill(qt, qt + head_dim * bq, 0.0f);
  for (size_t r = 0; r < rows; ++r) {
    const E* HWY_RESTRICT q_row = q + static_cast<int64_t>(r) * q_layout.row;
    for (size_t d = 0; d < head_dim; ++d) {
      if constexpr (std::is_same_v<E, float>) {
        qt[d * bq + r] = a.scale * q_row[d];
      } else {
        qt[d * bq + r] = a.scale * to_float(q_row[d]);
      }
    }
  }
}

// PackQueryTile on bf16 pairs (Bf16Way::Dot): qp [ceil(D/2)][bq] =
// the pairs of q[i0 + r][2p], q[i0 + r][2p + 1], unscaled (ScoresBlockDot
// scales the scores); padding queries and an odd D's last high half are 0.
template <size_t NVQ>
HWY_INLINE void PackQueryPairs(const AttentionArgs<float>& a, int64_t slice, int64_t i0, size_t rows,
                               uint32_t* HWY_RESTRICT qp) {
  const size_t bq = NVQ * hn::Lanes(DF32());
  const size_t head_dim = static_cast<size_t>(a.head_dim);
  const size_t pairs = (head_dim + 1) / 2;
  const SliceLayout q_layout = resolve_layout(a.q_layout, a.heads, a.q_len, a.head_dim);
  const bfloat16* HWY_RESTRICT q =
      slice_start(static_cast<const bfloat16*>(a.narrow.q), q_layout, slice, a.heads) + i0 * q_layout.row;
  std::fill(qp, qp + pairs * bq, 0u);
  for (size_t r = 0; r < rows; ++r) {
    const bfloat16* HWY_RESTRICT q_row = q + static_cast<int64_t>(r) * q_layout.row;
    for (size_t p = 0; p < pairs; ++p)
      qp[p * bq + r] = PackPair(q_row[2 * p].bits, 2 * p + 1 < head_dim ? q_row[2 * p + 1].bits : uint16_t{0});
  }
}

// qt as PackQueryTile (or qp as PackQueryPairs); ot = 0, m = -inf, l = 0.
template <size_t NVQ, class E = float, Bf16Way W = Bf16Way::Fma>
HWY_INLINE void StartTile(const AttentionArgs<float>& a, const TileState& t, float* HWY_RESTRICT qt) {
  const size_t bq = NVQ * hn::Lanes(DF32());
  if constexpr (W != Bf16Way::Fma) PackQueryPairs<NVQ>(a, t.slice, t.i0, t.rows, reinterpret_cast<uint32_t*>(qt));
  else PackQueryTile<NVQ, E>(a, t.slice, t.i0, t.rows, qt);
  std::fill(t.ot, t.ot + static_cast<size_t>(a.value_dim) * bq, 0.0f);
  std::fill(t.m, t.m + bq, -std::numeric_limits<float>::infinity());
  std::fill(t.l, t.l + bq, 0.0f);
}

// out_i = acc_i / l_i · 1/(1-p). l_i = 0 means every score was -inf: the
// vector twin of the fully-masked-row rule (masked_row_fill, score_rule.hpp).
// When a.lse: lse_i = m_i + log(l_i), the row's log-sum-exp (natural log,
// as the scores), −inf for a fully masked row; the backward recomputes
// p_ij = exp(s_ij − lse_i) from it.
// E: the output's storage (16-bit: each element rounded to nearest even).
template <size_t NVQ, class E = float>
HWY_INLINE void StoreTile(const AttentionArgs<float>& a, const TileState& t) {
  const size_t bq = NVQ * hn::Lanes(DF32());
  const size_t value_dim = static_cast<size_t>(a.value_dim);
  const SliceLayout out_layout = resolve_layout(a.out_layout, a.heads, a.q_len, a.value_dim);
  const bool all_dropped = a.dropout.p >= 1.0;
  const float drop_scale = a.dropout.p > 0.0 && !all_dropped ? static_cast<float>(1.0 / (1.0 - a.dropout.p)) : 1.0f;
  if (a.lse != nullptr) {
    float* HWY_RESTRICT lse = a.lse + t.slice * a.q_len + t.i0;
    for (size_t r = 0; r < t.rows; ++r)
      lse[r] = t.l[r] == 0.0f ? -std::numeric_limits<float>::infinity() : t.m[r] + std::log(t.l[r]);
  }
  E* out_base;
  if constexpr (std::is_same_v<E, float>) {
    out_base = a.out;
  } else {
    out_base = static_cast<E*>(a.narrow.out);
  }
  const auto store = [](float x) {
    if constexpr (std::is_same_v<E, float>) {
      return x;
    } else {
      return narrow_from_float<E>(x);
    }
  };
  // 16-bit: ot · inv rounded in lanes (RoundStore, the vector twin of
  // narrow_from_float<E>: the same bits) into the tile's own rows of ot, as
  // E [Dv][bq], which the row loop below moves out as 16-bit values. The
  // scalar rounding of each element, read down ot's columns, cost about as
  // much as a 128-key tile's products (perf, (8, 128, 512, 8) bf16, AMD
  // Zen 5).
  [[maybe_unused]] const E* HWY_RESTRICT rounded = nullptr;
  if constexpr (!std::is_same_v<E, float>) {
    const DF32 df;
    const size_t lanes = hn::Lanes(df);
    float* HWY_RESTRICT inv = t.alpha;  // free now: the key loop is done
    for (size_t r = 0; r < bq; ++r)
      inv[r] = r >= t.rows || t.l[r] == 0.0f || all_dropped ? 0.0f : drop_scale / t.l[r];
    E* HWY_RESTRICT row = reinterpret_cast<E*>(t.ot);  // row c at c·bq of E, behind the floats read
    for (size_t c = 0; c < value_dim; ++c)
      for (size_t w = 0; w < bq; w += lanes)
        RoundStore(df, hn::Mul(hn::Load(df, t.ot + c * bq + w), hn::Load(df, inv + w)), row + c * bq + w);
    rounded = row;
  }
  for (size_t r = 0; r < t.rows; ++r) {
    E* HWY_RESTRICT out =
        slice_start(out_base, out_layout, t.slice, a.heads) + (t.i0 + static_cast<int64_t>(r)) * out_layout.row;
    if (t.l[r] == 0.0f) {
      std::fill(out, out + value_dim, store(masked_row_fill<float>(a.masked_rows)));
      continue;
    }
    if constexpr (std::is_same_v<E, float>) {
      const float inv = all_dropped ? 0.0f : drop_scale / t.l[r];
      for (size_t c = 0; c < value_dim; ++c) out[c] = t.ot[c * bq + r] * inv;
    } else {
      for (size_t c = 0; c < value_dim; ++c) out[c] = rounded[c * bq + r];
    }
  }
}

// Output rows [i0, i0 + rows) of slice n, rows <= NVQ·lanes. E: the
// storage of q, k, v and out (float: a.q…; 16-bit: a.narrow). W: the bf16
// way (E = bfloat16 only, for Dot).
template <size_t NVQ, class E = float, Bf16Way W = Bf16Way::Fma>
HWY_NOINLINE void QueryTile(const AttentionArgs<float>& a, int64_t slice, int64_t i0, size_t rows,
                            FlashScratch& scratch) {
  constexpr bool kNarrow = !std::is_same_v<E, float>;
  constexpr bool kDot = W != Bf16Way::Fma;
  static_assert(!kDot || std::is_same_v<E, bfloat16>, "the pair way is bf16's");
  const size_t bq = NVQ * hn::Lanes(DF32());
  const size_t head_dim = static_cast<size_t>(a.head_dim);
  const size_t value_dim = static_cast<size_t>(a.value_dim);
  float* HWY_RESTRICT qt = scratch.floats(kDot      ? DotScratchFloats(NVQ, head_dim, value_dim)
                                          : kNarrow ? NarrowScratchFloats(NVQ, head_dim, value_dim)
                                                    : ScratchFloats(NVQ, head_dim, value_dim));
  TileState t;
  t.slice = slice;
  t.i0 = i0;
  t.rows = rows;
  t.qt = qt;
  t.ot = qt + head_dim * bq;
  t.st = t.ot + value_dim * bq;
  t.m = t.st + MaxKeyTile(NVQ) * bq;
  t.l = t.m + bq;
  t.alpha = t.l + bq;
  t.tmax = t.alpha + bq;
  if constexpr (kNarrow) {
    // pp first, where the vector alignment of bq-float rows still holds.
    float* after = t.tmax + bq;
    if constexpr (kDot) {
      t.pp = reinterpret_cast<uint32_t*>(after);
      after += (MaxKeyTile(NVQ) + 1) / 2 * bq;
    }
    t.kw = after;
    t.vw = t.kw + MaxKeyTile(NVQ) * head_dim;
  }
  StartTile<NVQ, E, W>(a, t, qt);

  const QueryTileInputs in = TileInputs(a, slice);
  VisitKeyTiles<NVQ>(a, in, i0, rows,
                     [&](int64_t j0, size_t keys) { KeyTileStep<NVQ, E, W>(a, in, t, j0, keys); });
  StoreTile<NVQ, E>(a, t);
}

// The one query-tile driver: rows [row_begin, row_end) in query tiles of
// up to kMaxQueryVectors vectors, the last taking as few vectors as cover it,
// tile.template operator()<NVQ>(i0, rows) for each (NVQ a compile-time
// constant, so each tile size has its own unrolled code). The forward, the
// backward and the weights recompute all cut their rows here.
template <size_t NVQ, class Tile>
HWY_INLINE void DispatchQueryVectors(size_t nvq, const Tile& tile, int64_t i0, size_t rows) {
  if constexpr (NVQ > 0) {
    if (nvq == NVQ) return tile.template operator()<NVQ>(i0, rows);
    DispatchQueryVectors<NVQ - 1>(nvq, tile, i0, rows);
  }
}
template <class Tile>
HWY_INLINE void ForEachQueryTile(int64_t row_begin, int64_t row_end, const Tile& tile) {
  const size_t lanes = hn::Lanes(DF32());
  for (int64_t i0 = row_begin; i0 < row_end;) {
    const size_t remaining = static_cast<size_t>(row_end - i0);
    const size_t nvq = std::min(kMaxQueryVectors, (remaining + lanes - 1) / lanes);
    const size_t rows = std::min(remaining, nvq * lanes);
    DispatchQueryVectors<kMaxQueryVectors>(nvq, tile, i0, rows);
    i0 += static_cast<int64_t>(rows);
  }
}

// Rows [row_begin, row_end) of slice n.
inline void FlashAttentionRowsF32(const AttentionArgs<float>& a, int64_t slice, int64_t row_begin,
                                  int64_t row_end, FlashScratch& scratch) {
  ForEachQueryTile(row_begin, row_end, [&]<size_t NVQ>(int64_t i0, size_t rows) {
    QueryTile<NVQ>(a, slice, i0, rows, scratch);
  });
}

// The same rows with 16-bit q, k, v and out (a.narrow; E its type; W the
// bf16 way).
template <class E, Bf16Way W = Bf16Way::Fma>
void FlashAttentionRowsNarrow(const AttentionArgs<float>& a, int64_t slice, int64_t row_begin, int64_t row_end,
                              FlashScratch& scratch) {
  ForEachQueryTile(row_begin, row_end, [&]<size_t NVQ>(int64_t i0, size_t rows) {
    QueryTile<NVQ, E, W>(a, slice, i0, rows, scratch);
  });
}

// vdpbf16ps's FLOP rate over the float32 FMA's on this core, from
// register-resident chains (bench/fma_peak.cpp's method, a few microseconds:
// 16 independent chains of 2048 instructions each, best of 5); 0 where this
// target cannot issue vdpbf16ps or the CPU lacks AVX512_BF16. Counted as
// FLOPs: an FMA is 2 per lane, a vdpbf16ps 4 (two products, two additions).
inline double Bf16DotRateRatio() {
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
  if (!cpu_has_avx512_bf16()) return 0.0;
  const DF32 df;
  const hn::RebindToUnsigned<DF32> du;
  constexpr int kChains = 16;
  constexpr long kSteps = 2048;
  auto time_chains = [&](auto step) {
    VF32 acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = hn::Set(df, static_cast<float>(c));
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < kSteps; ++i) {
      HWY_UNROLL(16)
      for (int c = 0; c < kChains; ++c) acc[c] = step(acc[c]);
    }
    const auto t1 = std::chrono::steady_clock::now();
    VF32 sum = acc[0];
    for (int c = 1; c < kChains; ++c) sum = hn::Add(sum, acc[c]);
    volatile float sink = hn::GetLane(sum);
    (void)sink;
    return std::chrono::duration<double>(t1 - t0).count();
  };
  const VF32 fa = hn::Set(df, 0.999999f), fb = hn::Set(df, 1e-7f);
  const auto pa = hn::Set(du, 0x3f7f3f7fu), pb = hn::Set(du, 0x33d633d6u);  // bf16 pairs (0.996, 1e-7)
  double fma = 1e30, dot = 1e30;
  for (int round = 0; round < 5; ++round) {
    fma = std::min(fma, time_chains([&](VF32 x) { return hn::MulAdd(x, fa, fb); }));
    dot = std::min(dot, time_chains([&](VF32 x) { return PairDot<true>(df, pa, pb, x); }));
  }
  return dot > 0.0 ? (4.0 / dot) / (2.0 / fma) : 0.0;
#else
  return 0.0;
#endif
}

inline int64_t FlashAttentionRowTileF32() {
  return static_cast<int64_t>(kMaxQueryVectors * hn::Lanes(DF32()));
}

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
