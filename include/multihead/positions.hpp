// multihead/positions.hpp: telling attention where each token is.
//
// Attention by itself is blind to order: permuting the keys (with their
// values) permutes nothing in the output. A Transformer therefore adds
// position information, the lesson's next topic.
//
// Legend: L positions (rows), E width (columns), D head width.
#pragma once

#include <cstdint>
#include <string>

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

// Rotary position embedding (RoPE, Su et al. 2021, RoFormer §3.4.2): the
// query and key of position p are rotated, pair by pair, by the angles
//   p·θ^(−2i/D),   i = 0 … D/2 − 1,
// so that <rope(q, p), rope(k, p′)> depends on p − p′ only. Which elements
// form pair i is the convention:
//  - Interleaved: (2i, 2i + 1), the paper's and GPT-J's / Meta's original
//    Llama code (x viewed as D/2 complex numbers, times e^{i·p·θ_i});
//  - HalfSplit: (i, i + D/2), Hugging Face Llama / GPT-NeoX
//    (x·cos + rotate_half(x)·sin).
// Weights trained with one convention need the other's permutation of the
// q/k projection rows; the two are not interchangeable.
enum class RopeConvention { Interleaved, HalfSplit };

struct RopeOptions {
  RopeConvention convention = RopeConvention::HalfSplit;
  double theta = 10000.0;       // base θ > 0 (Llama 3 uses 500000)
  int64_t position_offset = 0;  // position of row 0 (a KV cache's length), >= 0
};

// "interleaved" / "half-split"; parse throws multihead::Error naming `what`.
std::string to_string(RopeConvention convention);
RopeConvention parse_rope_convention(const std::string& name, const std::string& what = "rope");

// Throws multihead::Error naming the field: `width` (the head width's name,
// e.g. head_dim) if head_dim is odd or < 2, `what`.theta if theta is not
// finite and > 0, `what`.position_offset outside [0, 2^40] (`what` empty:
// theta, position_offset).
void validate_rope(const RopeOptions& options, int64_t head_dim, const std::string& what = "rope",
                   const std::string& width = "head_dim");

// x (..., L, D): row l of every leading index is at position
// options.position_offset + l. Angles and their cos/sin are computed in
// double and rounded once to T (Hugging Face computes the angles in
// float32, which differs by about p·2^-24 radians at position p).
template <class T>
Tensor<T> rotary_embedding(const Tensor<T>& x, const RopeOptions& options = {});

extern template Tensor<float> rotary_embedding<float>(const Tensor<float>&, const RopeOptions&);
extern template Tensor<double> rotary_embedding<double>(const Tensor<double>&, const RopeOptions&);

// The backward of rotary_embedding: given d_y = dℓ/dy (..., L, D), returns
// dℓ/dx. Each pair's rotation R is orthogonal, so d_x = Rᵀ d_y: rotation
// by the negated angles (the forward's angles, the same computation).
template <class T>
Tensor<T> rotary_embedding_backward(const Tensor<T>& d_y, const RopeOptions& options = {});

extern template Tensor<float> rotary_embedding_backward<float>(const Tensor<float>&, const RopeOptions&);
extern template Tensor<double> rotary_embedding_backward<double>(const Tensor<double>&, const RopeOptions&);

}  // namespace multihead
