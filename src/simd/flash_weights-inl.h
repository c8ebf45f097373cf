// src/simd/flash_weights-inl.h: the attention weights of a flash forward,
// recomputed from its saved row log-sum-exps, in float32, written once
// against Highway and compiled once per SIMD target by
// src/simd/flash_weights.cpp.
//
// Legend (as in src/contract/attention_args.hpp): N slices, L queries, S keys,
// D query/key width; `lanes` floats per vector; bq = NVQ·lanes queries per
// query tile.
//
// What it computes: the contract of src/contract/attention_weights_args.hpp,
//   weights[i][j] = dropout(exp(s_ij − lse_i))
// for the query rows of one slice, one query tile at a time and one key tile
// at a time, as the forward (flash_attention-inl.h) and the backward
// (flash_attention_backward-inl.h) walk them:
//   st[j][q] = scale·<q_q, k_j>           the forward's TileScores
//   st       = score rules                 the forward's ApplyScoreModifiers
//                                          (soft-cap, ALiBi, masks, padding,
//                                          causal, window: the vector twins
//                                          of src/contract/score_rule.hpp)
//   st[j][q] = exp(min(st − lse_q, 0))     the backward's recompute
//   st       = keep ? st/(1 − p) : 0       the forward's DropoutTile
// and each tile is stored transposed into the caller's [rows][S] rows. Key
// tiles that causal masking or the window hide from the whole query tile
// are skipped (VisitKeyTiles): their weights are the 0 the rows start with.
// Memory beyond the inputs and the caller's rows: the scratch of one query
// tile, (D + MaxKeyTile + 2)·bq floats; never an L×S buffer.

// Per-target include guard (Highway's pattern for -inl.h files).
#if defined(MULTIHEAD_SIMD_FLASH_WEIGHTS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MULTIHEAD_SIMD_FLASH_WEIGHTS_INL_H_
#undef MULTIHEAD_SIMD_FLASH_WEIGHTS_INL_H_
#else
#define MULTIHEAD_SIMD_FLASH_WEIGHTS_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "contract/attention_weights_args.hpp"
#include "contract/score_rule.hpp"
#include "hwy/highway.h"
#include "simd/exp2-inl.h"
#include "simd/flash_attention-inl.h"
#include "simd/flash_attention.hpp"

HWY_BEFORE_NAMESPACE();
namespace multihead::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Floats of scratch for a query tile of nvq vectors: qt [D][bq],
// st [MaxKeyTile][bq], lse and tmax [bq].
inline size_t WeightsScratchFloats(size_t nvq, size_t head_dim) {
  return (head_dim + MaxKeyTile(nvq) + 2) * nvq * hn::Lanes(DF32());
}

// Weights of query rows [i0, i0 + rows) of slice `slice` (rows <= bq) into
// out [rows][S] (rows S apart).
template <size_t NVQ>
HWY_NOINLINE void WeightsQueryTile(const AttentionWeightsArgs& w, int64_t slice, int64_t i0, size_t rows,
                                   float* HWY_RESTRICT out, FlashScratch& scratch) {
  const AttentionArgs<float>& a = w.forward;
  const DF32 df;
  const size_t lanes = hn::Lanes(df);
  const size_t bq = NVQ * lanes;
  const size_t head_dim = static_cast<size_t>(a.head_dim);
  const size_t S = static_cast<size_t>(a.kv_len);
  float* HWY_RESTRICT qt = scratch.floats(WeightsScratchFloats(NVQ, head_dim));
  TileState t;
  t.slice = slice;
  t.i0 = i0;
  t.rows = rows;
  t.qt = qt;
  t.st = qt + head_dim * bq;
  float* HWY_RESTRICT lse = t.st + MaxKeyTile(NVQ) * bq;
  t.tmax = lse + bq;
  t.ot = t.m = t.l = t.alpha = nullptr;  // no output: the forward's accumulators are not needed

  // Each row starts as what the skipped key tiles hold: 0, or the fill of a
  // fully masked row (NaN policy), or NaN for a NaN row. Only rows with a
  // finite lse are computed; the others' lanes (and the padding lanes) get
  // lse = +inf, so that their p is 0 and never stored.
  const float inf = std::numeric_limits<float>::infinity();
  std::fill(lse, lse + bq, inf);
  bool any = false;
  for (size_t r = 0; r < rows; ++r) {
    const float l = w.lse[slice * a.q_len + i0 + static_cast<int64_t>(r)];
    float* HWY_RESTRICT row = out + r * S;
    if (l == -inf) {
      std::fill(row, row + S, masked_row_fill<float>(a.masked_rows));
    } else if (std::isnan(l)) {
      std::fill(row, row + S, std::numeric_limits<float>::quiet_NaN());
    } else {
      std::fill(row, row + S, 0.0f);
      lse[r] = l;
      any = true;
    }
  }
  if (!any || S == 0) return;

  PackQueryTile<NVQ>(a, slice, i0, rows, qt);  // as the forward's

  // Dropout's 1/(1 − p), and 0 when every weight is dropped (p >= 1).
  const bool dropout = a.dropout.p > 0.0;
  const float keep_scale = !dropout ? 1.0f : a.dropout.p >= 1.0 ? 0.0f : static_cast<float>(1.0 / (1.0 - a.dropout.p));
  const QueryTileInputs in = TileInputs(a, slice);
  const VF32 log2e = hn::Set(df, 1.442695040888963407359924681f);
  const VF32 zero = hn::Zero(df);
  VisitKeyTiles<NVQ>(a, in, i0, rows, [&](int64_t j0, size_t keys) {
    TileScores<NVQ>(a, in, t, j0, keys);
    ApplyScoreModifiers<NVQ>(a, in, t, j0, keys);
    // The backward's recompute: p = exp(s − lse), the argument clamped at 0
    // by compare and select (a recomputed score may exceed the lse by
    // rounding; NaN stays NaN).
    for (size_t j = 0; j < keys; ++j) {
      float* HWY_RESTRICT srow = t.st + j * bq;
      HWY_UNROLL(4)
      for (size_t v = 0; v < NVQ; ++v) {
        VF32 x = hn::Sub(hn::Load(df, srow + v * lanes), hn::Load(df, lse + v * lanes));
        x = hn::IfThenElse(hn::Gt(x, zero), zero, x);
        hn::Store(Exp2NonPositive(df, hn::Mul(x, log2e)), df, srow + v * lanes);
      }
    }
    if (dropout) DropoutTile<NVQ>(a, t, j0, keys);
    // st [keys][bq] → out [rows][S], transposed (the forward's layout has
    // queries in lanes; the caller's rows are row-major).
    for (size_t r = 0; r < rows; ++r) {
      if (lse[r] == inf) continue;
      float* HWY_RESTRICT dst = out + r * S + static_cast<size_t>(j0);
      for (size_t j = 0; j < keys; ++j) dst[j] = t.st[j * bq + r] * keep_scale;
    }
  });
}

// Rows [row_begin, row_end) of slice `slice` into out [row_end − row_begin][S],
// cut by the forward's driver (ForEachQueryTile).
inline void FlashWeightsRowsF32(const AttentionWeightsArgs& w, int64_t slice, int64_t row_begin, int64_t row_end,
                                float* out, FlashScratch& scratch) {
  const size_t S = static_cast<size_t>(w.forward.kv_len);
  ForEachQueryTile(row_begin, row_end, [&]<size_t NVQ>(int64_t i0, size_t rows) {
    WeightsQueryTile<NVQ>(w, slice, i0, rows, out + static_cast<size_t>(i0 - row_begin) * S, scratch);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace multihead::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
