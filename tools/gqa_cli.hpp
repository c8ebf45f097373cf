// tools/gqa_cli.hpp: what `multihead forward --num-kv-heads`, `multihead
// decode` and `multihead init --num-kv-heads` share about the grouped-query
// module (multihead/grouped_query_attention.hpp): its flags, how its
// weights are read from and written to safetensors, and the checks that
// name the flag.
//
// Weights: a safetensors with q_proj.weight (H·D, E), k_proj.weight and
// v_proj.weight (Hkv·D, E), o_proj.weight (E, H·D) and, all or none, the
// four *.bias, under an optional --prefix (Hugging Face Llama's names:
// model.layers.0.self_attn.). num_heads comes from --num-heads or the
// file's metadata ("num_heads", written by `multihead init`); D = rows of
// q_proj.weight / num_heads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "multihead/grouped_query_attention.hpp"

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

// The module from a safetensors file (float64 or float32 weights as T).
template <class T>
GroupedQueryAttention<T> load_gqa(const std::string& path, const std::string& prefix,
                                  std::optional<int64_t> num_heads, const GqaFlags& flags, bool causal);

// The module's weights as safetensors bytes, with num_heads, num_kv_heads
// and head_dim in the metadata.
std::string serialize_gqa(const GroupedQueryAttention<float>& module);

// The configuration the flags describe (RoPE included).
GroupedQueryAttentionConfig gqa_config(int64_t embed_dim, int64_t num_heads, int64_t head_dim,
                                       const GqaFlags& flags, bool bias, bool causal);

}  // namespace multihead::cli
