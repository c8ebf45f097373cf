// tools/gqa_cli.hpp: what `multihead forward --num-kv-heads`, `multihead
// decode` and `multihead init --num-kv-heads` share about the grouped-query
// module (multihead/grouped_query_attention.hpp): its flags, the weights
// read with them, and the checks that name the flag.
//
// The weights' format and its reader are the library's
// (multihead/weights.hpp, "grouped-query attention"); here the flags are
// turned into its options, and its messages name the flag that set a value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "multihead/grouped_query_attention.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"
#include "multihead/narrow_grouped_query_attention.hpp"

namespace multihead::cli {

// The flags that shape the module.
struct GqaFlags {
  std::optional<int64_t> num_kv_heads;
  std::string rope;          // "" = none, interleaved, half-split
  double rope_theta = 10000.0;
  CLI::Option* rope_theta_option = nullptr;
};

// Registers --num-kv-heads (with `kv_help`) and, with `rope`, --rope and
// --rope-theta (init writes weights only: RoPE is chosen when running).
void add_gqa_flags(CLI::App& c, GqaFlags& flags, const std::string& kv_help, bool rope = true);

// Throws a one-line Error naming the flag: --num-kv-heads not dividing
// --num-heads, --rope with an odd head width, --rope-theta without --rope.
void check_gqa_flags(const GqaFlags& flags, int64_t num_heads, int64_t head_dim);

// The module from a safetensors file (float64 or float32 weights as T):
// load_gqa_weights with --prefix, --num-heads and --num-kv-heads (else the
// file's num_kv_heads), then --rope. `stored`, if given, receives the
// parameters' dtype on disk (LoadedGqaWeights::parameter_dtype), for the
// notes of checkpoint_hints.hpp.
template <class T>
GroupedQueryAttention<T> load_gqa(const std::string& path, const std::string& prefix,
                                  std::optional<int64_t> num_heads, const GqaFlags& flags, bool causal,
                                  std::optional<DType>* stored = nullptr);

// The same, straight into the 16-bit module E (bfloat16, float16):
// load_gqa_weights_narrow, no float64 or float32 copy; tensors of E taken as
// they are, others rounded once (a value beyond float16's range refused,
// named with the --prefix and the file).
template <class E>
NarrowGroupedQueryAttention<E> load_gqa_narrow(const std::string& path, const std::string& prefix,
                                               std::optional<int64_t> num_heads, const GqaFlags& flags, bool causal,
                                               std::optional<DType>* stored = nullptr);

// The configuration the flags describe (RoPE included).
GroupedQueryAttentionConfig gqa_config(int64_t embed_dim, int64_t num_heads, int64_t head_dim,
                                       const GqaFlags& flags, bool bias, bool causal);

}  // namespace multihead::cli
