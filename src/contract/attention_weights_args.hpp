// src/contract/attention_weights_args.hpp: the contract of the weights
// recompute, beside the forward's (attention_args.hpp). A forward that ran
// without weights (the flash kernel, weights == nullptr) but saved each
// row's log-sum-exp can give back the exact weights of any slices and rows
// afterwards, without ever holding the whole N×L×S:
//
// For each selected slice n = slices[a] and query row i = rows[r]
// (a < slice_count, r < row_count) and every key j < S:
//   s_ij  = score_rule(scale · <q[n,i,:], k[n,j,:]>)   as the forward shaped it
//   p_ij  = exp(s_ij − lse[n,i])                        the forward's softmax
//   p'_ij = dropout_weight(p_ij)                        when dropout.p > 0
//   weights[a][r][j] = p'_ij
// A fully masked row (lse = −inf) gets masked_row_fill for every j (0, or
// NaN under MaskedRowPolicy::NaN), as the forward's weights would; a NaN
// lse (NaN scores) gives NaN for every j, as a softmax over a NaN row does.
// These are the weights attention_forward would have stored in
// args.weights[n][i][j] (same rules, same keep decisions), to the float
// rounding of exp(s − lse) against exp(s − m)/Σ.
//
// Legend (attention_args.hpp): N slices, L queries, S keys.
#pragma once

#include <cstdint>

#include "contract/attention_args.hpp"

namespace multihead::detail {

struct AttentionWeightsArgs {
  // As the forward was called; its out, weights and lse are not read.
  AttentionArgs<float> forward;
  const float* lse = nullptr;  // [N][L], as the forward wrote it
  // The slices n, each in [0, N); nullptr = all N in order (slice_count is
  // then ignored). Any order; repeats allowed.
  const int64_t* slices = nullptr;
  int64_t slice_count = 0;
  // The query rows i, each in [0, L); nullptr = all L in order. Any order,
  // repeats allowed; runs of consecutive rows are computed as query tiles.
  const int64_t* rows = nullptr;
  int64_t row_count = 0;
  // [slice_count][row_count][S], written whole (every element).
  float* weights = nullptr;
};

}  // namespace multihead::detail
