// src/attention/attention_call.hpp: the one place where a call's options
// become the kernel contract's arguments (src/contract/attention_args.hpp),
// and the one validation of AttentionOptions.
//
// Legend: N slices, L queries, S keys, D query/key width, Dv value width.
#pragma once

#include <cstdint>

#include "contract/attention_args.hpp"
#include "multihead/attention.hpp"

namespace multihead::detail {

// The sizes of a kernel call. Slices [first_slice, first_slice + slices)
// of a larger call (first_slice keeps dropout's decisions those of the
// larger call); causal masking applies to keys j < causal_cols.
struct AttentionShape {
  int64_t slices = 0, heads = 1, q_len = 0, kv_len = 0, head_dim = 0, value_dim = 0;
  int64_t causal_cols = 0;
  int64_t first_slice = 0;
};

// The tensors of a kernel call, as attention_args.hpp lays them out.
template <class T>
struct AttentionTensors {
  const T *q = nullptr, *k = nullptr, *v = nullptr;
  SliceLayout q_layout, k_layout, v_layout, out_layout;
  const T* attn_mask = nullptr;
  int64_t attn_mask_slice_stride = 0;
  const T* key_padding = nullptr;
  // ALiBi: [slices] one slope per slice of this call, or nullptr. The caller
  // converts AttentionOptions::alibi_slopes (or the module's head slopes).
  const T* alibi_slopes = nullptr;
  T* out = nullptr;
  T* weights = nullptr;
};

// Throws multihead::Error naming the field: dropout_p outside [0, 1], a
// non-finite scale, num_threads < 0, |causal_query_offset| > 2^40, a window
// outside [1, 2^40], a softcap outside [2^-126, 2^126] (float32's normal
// range for the cap and 1/cap), a non-finite ALiBi slope.
// (The number of slopes is the caller's to check: it knows N.)
void validate_attention_options(const AttentionOptions& options);

// The arguments for `options` (validated): scale defaults to 1/√D.
template <class T>
AttentionArgs<T> make_attention_args(const AttentionShape& shape, const AttentionTensors<T>& tensors,
                                     const AttentionOptions& options);

}  // namespace multihead::detail
