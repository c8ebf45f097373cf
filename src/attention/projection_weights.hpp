// src/attention/projection_weights.hpp: the projection weights laid out as
// the fused form multiplies them.
//
// nn.Linear stores W as (out, in) and computes y = x·Wᵀ. The fused form keeps
// a transposed copy Wᵀ, (in, out) row-major, built once per module, because
// oneDNN's sgemm runs y = x·Wᵀ much faster from that layout when the product
// has few rows. Measured on a 2-core AVX-512 (Zen 5) machine, 2 threads,
// rows × out × in:
//   128 × 1536 × 512:  0.92 ms from W (out, in), 0.58 ms from Wᵀ (in, out)
//   128 ×  512 × 512:  0.30 ms,                  0.20 ms
//   682 × 3072 × 1024 and larger: within 5% either way.
// The cost is one more copy of the projection weights (4·E² numbers with
// packed weights). The textbook form and state_dict() use the originals.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "multihead/multihead_attention.hpp"

namespace multihead::detail {

template <class T>
struct ProjectionWeights {
  // Packed (kdim = vdim = E): (E, 3E); columns [0, E) are W_qᵀ, [E, 2E) W_kᵀ
  // and [2E, 3E) W_vᵀ, so the row stride of each part is 3E.
  Tensor<T> in_proj_t;
  // Separate: W_qᵀ (E, E), W_kᵀ (Ek, E), W_vᵀ (Ev, E).
  Tensor<T> q_proj_t, k_proj_t, v_proj_t;
  Tensor<T> out_proj_t;  // (E, E)

  static std::shared_ptr<const ProjectionWeights> from(const MultiheadAttentionConfig& config,
                                                       const MultiheadAttentionParameters<T>& p);
};

// Bytes of projected rows per block when the fused form projects long
// sequences block by block into head-major buffers (multihead_attention_forward.cpp,
// in_projection_split_heads); 8 MiB by default. Tests lower it to run many
// blocks on small inputs. Read once per projection.
std::atomic<int64_t>& projection_block_bytes();

}  // namespace multihead::detail
