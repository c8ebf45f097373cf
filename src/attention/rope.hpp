// src/attention/rope.hpp: rotary embedding in place on a strided block, the
// one implementation behind rotary_embedding (multihead/positions.hpp) and
// the grouped-query module's q/k (src/attention/grouped_query_attention.cpp).
//
// Legend: L positions, D head width.
#pragma once

#include <cstdint>

#include "multihead/positions.hpp"

namespace multihead::detail {

// x is [outer][L][inner][D] contiguous; every (outer, inner) head vector at
// index l is rotated for position options.position_offset + l. Validates
// (validate_rope, naming `what`) before touching x.
template <class T>
void rope_in_place(T* x, int64_t outer, int64_t L, int64_t inner, int64_t D, const RopeOptions& options,
                   const char* what = "rope");

// Its backward: d (the gradient of the rotated x, same layout) becomes the
// gradient of x, rotated by −angle (Rᵀ; the same angles).
template <class T>
void rope_backward_in_place(T* d, int64_t outer, int64_t L, int64_t inner, int64_t D, const RopeOptions& options,
                            const char* what = "rope");

}  // namespace multihead::detail
