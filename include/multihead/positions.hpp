// multihead/positions.hpp: telling attention where each token is.
//
// Attention by itself is blind to order: permuting the keys (with their
// values) permutes nothing in the output. A Transformer therefore adds
// position information, the lesson's next topic.
//
// Legend: L positions (rows), E width (columns).
#pragma once

#include <cstdint>

#include "multihead/tensor.hpp"

namespace multihead {

// Sinusoidal (absolute) positional encoding, Vaswani et al. 2017, §3.5:
//   PE[p, 2i]     = sin((p + offset) / 10000^(2i / E))
//   PE[p, 2i + 1] = cos((p + offset) / 10000^(2i / E))
// for p = 0 … length − 1, as an (length, E) tensor to add to the token
// embeddings. An odd E ends with a sine column. Computed in double and
// rounded once to T. Throws multihead::Error, naming the argument, if
// length < 0, width < 1 or offset < 0.
template <class T>
Tensor<T> sinusoidal_positions(int64_t length, int64_t width, int64_t offset = 0);

extern template Tensor<float> sinusoidal_positions<float>(int64_t, int64_t, int64_t);
extern template Tensor<double> sinusoidal_positions<double>(int64_t, int64_t, int64_t);

}  // namespace multihead
