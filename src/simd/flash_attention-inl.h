// src/simd/flash_attention-inl.h: the fused ("flash") attention forward in
// float32, written once against Highway and compiled once per SIMD target by
// src/simd/flash_attention.cpp.
//
// Legend (as in src/attention/kernel.hpp): N slices, L queries, S keys,
// D query/key width, Dv value width; `lanes` floats per vector (16 on AVX3).
//
// What it computes (kernel.hpp, for slice n and query row i):
//   s_ij  = scale·<q_i, k_j> + attn_mask[i,j] + key_padding[b,j]  (+ causal -inf)
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
// micro-kernels instead of cblas_sgemm on tiles. On this Zen 5 machine,
// per CPU-second, one thread (bench/bench_kernels.cpp, SgemmTiles vs Flash):
//   cblas_sgemm, a 64-query × 128-key tile's two products, D = 64, BLAS
//   single-threaded (as it must be inside our OpenMP region), no softmax:
//     OPENBLAS_CORETYPE=Haswell (this environment's default)   84 GFLOP/s
//     OPENBLAS_CORETYPE unset (AVX-512 kernels)               144 GFLOP/s
//   this kernel, the whole attention including the softmax:   ~180 GFLOP/s
// BLAS pays packing and dispatch on every small call and would make our
// speed depend on OPENBLAS_CORETYPE.
//
// Exp is computed as 2^x on (s - m)·log2(e) with our own polynomial
// (Exp2NonPositive): the arguments are never positive, -inf must give exactly
// 0, and it costs 13 operations against ~22 for hwy::Exp.
//
// Dropout draws its keep/drop decision per element with the scalar
// counter-based hash of kernel.hpp (dropout_keep), so every kernel drops the
// same elements; that path is scalar and meant for training, not speed.

// Per-target include guard (Highway's pattern for -inl.h files).
#if defined(MULTIHEAD_SIMD_FLASH_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MULTIHEAD_SIMD_FLASH_ATTENTION_INL_H_
#undef MULTIHEAD_SIMD_FLASH_ATTENTION_INL_H_
#else
#define MULTIHEAD_SIMD_FLASH_ATTENTION_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "attention/kernel.hpp"
#include "hwy/highway.h"
#include "simd/flash_attention.hpp"

HWY_BEFORE_NAMESPACE();
namespace multihead::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF32 = hn::ScalableTag<float>;
using VF32 = hn::Vec<DF32>;

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

// 2^x for x <= 0, in float: x = n + f with n = round(x), f in [-1/2, 1/2];
// 2^f by a degree-6 polynomial (relative error 2e-9 in exact arithmetic,
// ~1.6 ulp in float: fitted by bench/fit_exp2.py), 2^n by building the
// exponent bits. Rounding uses the 1.5·2^23 trick: t = x + 1.5·2^23 holds
// round(x) in its low mantissa bits, so n = t - 1.5·2^23 and the bits of t
// plus 127, shifted into the exponent field, are 2^n (3 operations fewer than
// Round + ConvertTo, whose overflow fix-up we do not need). x is clamped at
// -127, whose exponent bits are 0, so x <= -126.5 (and -inf) gives exactly +0
// (results below FLT_MIN flush to 0). 2^0 is exactly 1. NaN stays NaN on
// every target: the clamp is a compare and select (x < -127 is false for
// NaN), not Max, whose NaN result Highway leaves to the target.
HWY_INLINE VF32 Exp2NonPositive(DF32 df, VF32 x) {
  const hn::RebindToSigned<DF32> di;
  const VF32 magic = hn::Set(df, 12582912.0f);  // 1.5·2^23
  const VF32 lowest = hn::Set(df, -127.0f);
  x = hn::IfThenElse(hn::Lt(x, lowest), lowest, x);
  const VF32 t = hn::Add(x, magic);
  const VF32 n = hn::Sub(t, magic);
  const VF32 f = hn::Sub(x, n);
  VF32 p = hn::Set(df, 1.535336196e-04f);
  p = hn::MulAdd(p, f, hn::Set(df, 1.339887502e-03f));
  p = hn::MulAdd(p, f, hn::Set(df, 9.618436918e-03f));
  p = hn::MulAdd(p, f, hn::Set(df, 5.550332367e-02f));
  p = hn::MulAdd(p, f, hn::Set(df, 2.402264774e-01f));
  p = hn::MulAdd(p, f, hn::Set(df, 6.931471825e-01f));
  p = hn::MulAdd(p, f, hn::Set(df, 1.0f));
  const auto bits = hn::ShiftLeft<23>(hn::Add(hn::BitCast(di, t), hn::Set(di, 127)));
  return hn::Mul(p, hn::BitCast(df, bits));
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

// ---- one query tile -------------------------------------------------------

// What a query tile [i0, i0 + rows) of slice n reads, hoisted out of the
// key loop.
struct QueryTileInputs {
  const float* k;            // [S][D] of slice n, rows k_row apart
  const float* v;            // [S][Dv] of slice n, rows v_row apart
  size_t k_row, v_row;
  const float* attn_mask;    // [L][S] of slice n, or nullptr
  const float* key_padding;  // [S] of batch entry n / heads, or nullptr
  int64_t causal_cols;       // keys j < causal_cols are causally masked (0 = none)
};

// One key tile [j0, j0 + keys) for the query tile: scores, masks, online
// softmax update, PV. m, l, alpha, tmax, ot and st live in the scratch.
template <size_t NVQ>
HWY_INLINE void KeyTileStep(const AttentionArgs<float>& a, const QueryTileInputs& in, int64_t slice,
                            int64_t i0, size_t rows, int64_t j0, size_t keys,
                            const float* HWY_RESTRICT qt, float* HWY_RESTRICT st,
                            float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                            float* HWY_RESTRICT alpha, float* HWY_RESTRICT tmax,
                            float* HWY_RESTRICT ot) {
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  const size_t bq = NVQ * lanes;
  constexpr size_t KR = BlockRows(NVQ);
  const size_t head_dim = static_cast<size_t>(a.head_dim);
  const size_t value_dim = static_cast<size_t>(a.value_dim);
  const int64_t S = a.kv_len;

  const VF32 neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());

  // st [keys][bq] = scale·Q Kᵀ (the scale is folded into qt), and
  // tmax [bq] = the tile's max score per query.
  {
    for (size_t w = 0; w < NVQ; ++w) hn::Store(neg_inf, df, tmax + w * lanes);
    const float* kt = in.k + static_cast<size_t>(j0) * in.k_row;
    size_t j = 0;
    for (; j + KR <= keys; j += KR) {
      ScoresBlock<NVQ, KR>(df, kt + j * in.k_row, in.k_row, head_dim, qt, bq, st + j * bq, tmax);
    }
    ScoresRemainder<NVQ, KR - 1>(keys - j, df, kt + j * in.k_row, in.k_row, head_dim, qt, bq,
                                 st + j * bq, tmax);
  }

  // + attn_mask[i][j]: stored row-major [L][S], so added transposed, by
  // element (only when a mask is given).
  if (in.attn_mask != nullptr) {
    for (size_t r = 0; r < rows; ++r) {
      const float* HWY_RESTRICT mask_row = in.attn_mask + (i0 + static_cast<int64_t>(r)) * S + j0;
      for (size_t j = 0; j < keys; ++j) st[j * bq + r] += mask_row[j];
    }
  }
  // + key_padding[b][j]: one value per key row of st.
  if (in.key_padding != nullptr) {
    for (size_t j = 0; j < keys; ++j) {
      const VF32 pad = hn::Set(df, in.key_padding[j0 + static_cast<int64_t>(j)]);
      float* HWY_RESTRICT row = st + j * bq;
      for (size_t w = 0; w < NVQ; ++w) {
        hn::Store(hn::Add(hn::Load(df, row + w * lanes), pad), df, row + w * lanes);
      }
    }
  }
  // Causal: -inf where j > i (and j < causal_cols). Only tiles that cross
  // the diagonal get here; the caller skips tiles that are entirely above it.
  const int64_t causal_end = std::min<int64_t>(j0 + static_cast<int64_t>(keys), in.causal_cols);
  const bool causal_diagonal = causal_end - 1 > i0;
  if (causal_diagonal) {
    const hn::RebindToSigned<DF32> di;
    for (int64_t j = std::max(j0, i0 + 1); j < causal_end; ++j) {
      float* HWY_RESTRICT row = st + static_cast<size_t>(j - j0) * bq;
      const auto key = hn::Set(di, static_cast<int32_t>(j));
      for (size_t w = 0; w < NVQ; ++w) {
        const auto query = hn::Iota(di, static_cast<int32_t>(i0 + static_cast<int64_t>(w * lanes)));
        const auto masked = hn::RebindMask(df, hn::Lt(query, key));
        hn::Store(hn::IfThenElse(masked, neg_inf, hn::Load(df, row + w * lanes)), df,
                  row + w * lanes);
      }
    }
  }

  // Online softmax: m_new = max(m, max_j s_j); alpha = exp(m - m_new);
  // p_j = exp(s_j - m_new); l = alpha·l + Σ_j p_j. A query with no finite
  // score yet has m_new = -inf: it uses 0 instead, so that s - m is -inf
  // (p = 0) and never (-inf) - (-inf) = NaN. A NaN score (NaN input) may or
  // may not win the max, depending on the target; either way its p is NaN,
  // so l and the row's output are NaN, as in the reference and PyTorch.
  // Without masks in this tile the QKᵀ epilogue already has the max.
  const bool masked = in.attn_mask != nullptr || in.key_padding != nullptr || causal_diagonal;
  const VF32 log2e = hn::Set(df, 1.442695040888963407359924681f);
  VF32 m_use[NVQ];
  VF32 sum[NVQ];
  for (size_t w = 0; w < NVQ; ++w) {
    const VF32 m_old = hn::Load(df, m + w * lanes);
    VF32 m_new = m_old;
    if (masked) {
      for (size_t j = 0; j < keys; ++j) m_new = hn::Max(m_new, hn::Load(df, st + j * bq + w * lanes));
    } else {
      m_new = hn::Max(m_new, hn::Load(df, tmax + w * lanes));
    }
    m_use[w] = hn::IfThenZeroElse(hn::Eq(m_new, neg_inf), m_new);
    hn::Store(m_new, df, m + w * lanes);
    hn::Store(Exp2NonPositive(df, hn::Mul(hn::Sub(m_old, m_use[w]), log2e)), df, alpha + w * lanes);
    sum[w] = hn::Zero(df);
  }
  for (size_t j = 0; j < keys; ++j) {
    float* HWY_RESTRICT row = st + j * bq;
    HWY_UNROLL(4)
    for (size_t w = 0; w < NVQ; ++w) {
      const VF32 s = hn::Load(df, row + w * lanes);
      const VF32 p = Exp2NonPositive(df, hn::Mul(hn::Sub(s, m_use[w]), log2e));
      sum[w] = hn::Add(sum[w], p);
      hn::Store(p, df, row + w * lanes);
    }
  }
  for (size_t w = 0; w < NVQ; ++w) {
    const VF32 lw = hn::Load(df, l + w * lanes);
    hn::Store(hn::MulAdd(lw, hn::Load(df, alpha + w * lanes), sum[w]), df, l + w * lanes);
  }

  // Dropout: a dropped weight contributes nothing to acc, while l keeps the
  // undropped sum (softmax first, then dropout, as PyTorch).
  if (a.dropout_p > 0.0) {
    for (size_t j = 0; j < keys; ++j) {
      for (size_t r = 0; r < rows; ++r) {
        if (!dropout_keep(a.dropout_seed, slice + a.dropout_slice_offset, i0 + static_cast<int64_t>(r),
                          j0 + static_cast<int64_t>(j), a.dropout_p)) {
          st[j * bq + r] = 0.0f;
        }
      }
    }
  }

  // ot = alpha·ot + Pᵀ-weighted sum of the value rows.
  {
    const float* vt = in.v + static_cast<size_t>(j0) * in.v_row;
    size_t c = 0;
    for (; c + KR <= value_dim; c += KR) {
      AccumulateBlock<NVQ, KR>(df, vt + c, in.v_row, keys, st, bq, alpha, ot + c * bq);
    }
    AccumulateRemainder<NVQ, KR - 1>(value_dim - c, df, vt + c, in.v_row, keys, st, bq, alpha,
                                     ot + c * bq);
  }
}

// Output rows [i0, i0 + rows) of slice n, rows <= NVQ·lanes.
template <size_t NVQ>
HWY_NOINLINE void QueryTile(const AttentionArgs<float>& a, int64_t slice, int64_t i0, size_t rows,
                            FlashScratch& scratch) {
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  const size_t bq = NVQ * lanes;
  constexpr size_t kKeys = KeyTile(NVQ);
  const size_t head_dim = static_cast<size_t>(a.head_dim);
  const size_t value_dim = static_cast<size_t>(a.value_dim);
  const int64_t L = a.q_len;
  const int64_t S = a.kv_len;

  float* HWY_RESTRICT qt = scratch.floats(ScratchFloats(NVQ, head_dim, value_dim));
  float* HWY_RESTRICT ot = qt + head_dim * bq;
  float* HWY_RESTRICT st = ot + value_dim * bq;
  float* HWY_RESTRICT m = st + MaxKeyTile(NVQ) * bq;
  float* HWY_RESTRICT l = m + bq;
  float* HWY_RESTRICT alpha = l + bq;
  float* HWY_RESTRICT tmax = alpha + bq;

  // qt [D][bq] = scale · q[i0 + q][d]; padding queries (q >= rows) are 0 and
  // their results are never stored.
  // Tensors may be strided views (SliceLayout): slice n starts at
  // slice_start(), its rows are `row` elements apart.
  const SliceLayout q_layout = resolve_layout(a.q_layout, a.heads, L, a.head_dim);
  const SliceLayout k_layout = resolve_layout(a.k_layout, a.heads, S, a.head_dim);
  const SliceLayout v_layout = resolve_layout(a.v_layout, a.heads, S, a.value_dim);
  const SliceLayout out_layout = resolve_layout(a.out_layout, a.heads, L, a.value_dim);
  const float* HWY_RESTRICT q = slice_start(a.q, q_layout, slice, a.heads) + i0 * q_layout.row;
  std::fill(qt, qt + head_dim * bq, 0.0f);
  for (size_t r = 0; r < rows; ++r) {
    const float* HWY_RESTRICT q_row = q + static_cast<int64_t>(r) * q_layout.row;
    for (size_t d = 0; d < head_dim; ++d) qt[d * bq + r] = a.scale * q_row[d];
  }
  std::fill(ot, ot + value_dim * bq, 0.0f);
  std::fill(m, m + bq, -std::numeric_limits<float>::infinity());
  std::fill(l, l + bq, 0.0f);

  QueryTileInputs in;
  in.k = slice_start(a.k, k_layout, slice, a.heads);
  in.v = slice_start(a.v, v_layout, slice, a.heads);
  in.k_row = static_cast<size_t>(k_layout.row);
  in.v_row = static_cast<size_t>(v_layout.row);
  in.attn_mask = a.attn_mask != nullptr ? a.attn_mask + slice * a.attn_mask_slice_stride : nullptr;
  in.key_padding = a.key_padding != nullptr ? a.key_padding + (slice / a.heads) * S : nullptr;
  in.causal_cols = a.is_causal ? std::min(a.causal_cols, S) : 0;

  auto key_range = [&](int64_t begin, int64_t end) HWY_ATTR {
    for (int64_t j0 = begin; j0 < end;) {
      const int64_t left = end - j0;
      const size_t keys = static_cast<size_t>(left <= static_cast<int64_t>(MaxKeyTile(NVQ)) ? left : kKeys);
      KeyTileStep<NVQ>(a, in, slice, i0, rows, j0, keys, qt, st, m, l, alpha, tmax, ot);
      j0 += static_cast<int64_t>(keys);
    }
  };
  if (in.causal_cols > 0) {
    // Keys j < causal_cols are visible to row i only if j <= i: the tile
    // needs [0, min(causal_cols, i0 + rows)); tiles past it are skipped
    // whole (the causal saving). Keys from causal_cols on are never masked.
    key_range(0, std::min<int64_t>(in.causal_cols, i0 + static_cast<int64_t>(rows)));
    key_range(in.causal_cols, S);
  } else {
    key_range(0, S);
  }

  // out_i = acc_i / l_i · 1/(1-p). l_i = 0 means every score was -inf.
  const bool all_dropped = a.dropout_p >= 1.0;
  const float drop_scale = a.dropout_p > 0.0 && !all_dropped ? static_cast<float>(1.0 / (1.0 - a.dropout_p)) : 1.0f;
  for (size_t r = 0; r < rows; ++r) {
    float* HWY_RESTRICT out =
        slice_start(a.out, out_layout, slice, a.heads) + (i0 + static_cast<int64_t>(r)) * out_layout.row;
    if (l[r] == 0.0f) {
      const float fill = a.masked_rows == MaskedRowPolicy::NaN ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
      std::fill(out, out + value_dim, fill);
      continue;
    }
    const float inv = all_dropped ? 0.0f : drop_scale / l[r];
    for (size_t c = 0; c < value_dim; ++c) out[c] = ot[c * bq + r] * inv;
  }
}

template <size_t NVQ>
HWY_INLINE void QueryTileDispatch(size_t nvq, const AttentionArgs<float>& a, int64_t slice,
                                  int64_t i0, size_t rows, FlashScratch& scratch) {
  if constexpr (NVQ > 0) {
    if (nvq == NVQ) return QueryTile<NVQ>(a, slice, i0, rows, scratch);
    QueryTileDispatch<NVQ - 1>(nvq, a, slice, i0, rows, scratch);
  }
}

// Rows [row_begin, row_end) of slice n, in query tiles of up to
// kMaxQueryVectors vectors; the last tile takes as few vectors as cover it.
inline void FlashAttentionRowsF32(const AttentionArgs<float>& a, int64_t slice, int64_t row_begin,
                                  int64_t row_end, FlashScratch& scratch) {
  const size_t lanes = hn::Lanes(DF32());
  for (int64_t i0 = row_begin; i0 < row_end;) {
    const size_t remaining = static_cast<size_t>(row_end - i0);
    const size_t nvq = std::min(kMaxQueryVectors, (remaining + lanes - 1) / lanes);
    const size_t rows = std::min(remaining, nvq * lanes);
    QueryTileDispatch<kMaxQueryVectors>(nvq, a, slice, i0, rows, scratch);
    i0 += static_cast<int64_t>(rows);
  }
}

inline int64_t FlashAttentionRowTileF32() {
  return static_cast<int64_t>(kMaxQueryVectors * hn::Lanes(DF32()));
}

// Softmax numerators of one row in place, for the materialized kernel:
// row[j] = exp(row[j] - row_max) through the same Exp2NonPositive as the
// flash kernel; returns Σ_j row[j]. row_max must be the row's maximum and
// finite, so every argument is <= 0 (masked entries, -inf, give exactly 0).
// The sum is kept in one vector of lane partial sums, then reduced.
inline float ExpRowF32(float* row, size_t count, float row_max) {
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  const VF32 log2e = hn::Set(df, 1.4426950408889634f);
  const VF32 m = hn::Set(df, row_max);
  VF32 sum = hn::Zero(df);
  size_t j = 0;
  for (; j + lanes <= count; j += lanes) {
    // Subtract first: s·log2(e) - m·log2(e) would lose the difference when
    // the scores are large (|s| ~ 1e4 leaves ~1e-3 of absolute error).
    const VF32 p = Exp2NonPositive(df, hn::Mul(hn::Sub(hn::LoadU(df, row + j), m), log2e));
    hn::StoreU(p, df, row + j);
    sum = hn::Add(sum, p);
  }
  if (j < count) {  // the last count % lanes through a padded buffer
    const size_t rest = count - j;
    HWY_ALIGN float buf[hn::MaxLanes(DF32())] = {};
    std::copy(row + j, row + count, buf);
    const VF32 p = hn::IfThenElseZero(hn::FirstN(df, rest),
                                      Exp2NonPositive(df, hn::Mul(hn::Sub(hn::Load(df, buf), m), log2e)));
    hn::Store(p, df, buf);
    std::copy(buf, buf + rest, row + j);
    sum = hn::Add(sum, p);
  }
  return hn::GetLane(hn::SumOfLanes(df, sum));
}

inline void Exp2NonPositiveArrayF32(const float* in, float* out, size_t count) {
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  size_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    hn::StoreU(Exp2NonPositive(df, hn::LoadU(df, in + i)), df, out + i);
  }
  // Remainder through a full vector in a padded buffer.
  if (i < count) {
    HWY_ALIGN float buf[hn::MaxLanes(DF32())] = {};
    std::copy(in + i, in + count, buf);
    hn::Store(Exp2NonPositive(df, hn::Load(df, buf)), df, buf);
    std::copy(buf, buf + (count - i), out + i);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
