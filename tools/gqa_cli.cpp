// tools/gqa_cli.cpp: the grouped-query module's flags and weight files (gqa_cli.hpp).
#include "gqa_cli.hpp"

#include <map>
#include <string>

#include "cli_manners.hpp"
#include "validators.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"

namespace multihead::cli {

void add_gqa_flags(CLI::App& c, GqaFlags& flags, const std::string& kv_help, bool rope) {
  c.add_option("--num-kv-heads", flags.num_kv_heads, kv_help)->check(positive_integer());
  if (!rope) return;
  c.add_option("--rope", flags.rope,
               "Rotary position embedding of q and k (Su et al. 2021): interleaved (pairs 2i, 2i+1: the "
               "paper, GPT-J, Meta's Llama code) or half-split (pairs i, i+D/2: Hugging Face Llama, NeoX). "
               "Needs an even head width")
      ->transform(one_of({"interleaved", "half-split"}));
  flags.rope_theta_option =
      c.add_option("--rope-theta", flags.rope_theta, "RoPE base theta (Llama 3: 500000)")
          ->check(positive_number());
}

void check_gqa_flags(const GqaFlags& flags, int64_t num_heads, int64_t head_dim) {
  const int64_t kv = flags.num_kv_heads.value_or(num_heads);
  if (num_heads % kv != 0)
    throw Error(Error::Kind::Value, "--num-kv-heads: expected a divisor of num_heads " + std::to_string(num_heads) +
                                        " (each K/V head serves num_heads / num_kv_heads query heads), got " +
                                        std::to_string(kv));
  if (!flags.rope.empty() && head_dim % 2 != 0)
    throw Error(Error::Kind::Value, "--rope: rotary embedding rotates pairs, so the head width must be even, got " +
                                        std::to_string(head_dim));
  if (flags.rope.empty() && flags.rope_theta_option && flags.rope_theta_option->count() > 0)
    throw Error(Error::Kind::Value, "--rope-theta: needs --rope (interleaved or half-split)");
}

GroupedQueryAttentionConfig gqa_config(int64_t embed_dim, int64_t num_heads, int64_t head_dim,
                                       const GqaFlags& flags, bool bias, bool causal) {
  check_gqa_flags(flags, num_heads, head_dim);
  GroupedQueryAttentionConfig cfg;
  cfg.embed_dim = embed_dim;
  cfg.num_heads = num_heads;
  cfg.num_kv_heads = flags.num_kv_heads.value_or(num_heads);
  cfg.head_dim = head_dim;
  cfg.bias = bias;
  cfg.causal = causal;
  if (!flags.rope.empty()) cfg.rope = RopeOptions{parse_rope_convention(flags.rope, "--rope"), flags.rope_theta, 0};
  return cfg;
}

template <class T>
GroupedQueryAttention<T> load_gqa(const std::string& path, const std::string& prefix,
                                  std::optional<int64_t> num_heads, const GqaFlags& flags, bool causal) {
  const SafetensorsFile file = read_safetensors(path);
  const auto q = file.tensors.find(prefix + "q_proj.weight");
  if (q == file.tensors.end())
    throw Error(Error::Kind::Value, "--weights: " + path + " has no " + prefix +
                                        "q_proj.weight (the grouped-query module reads q_proj/k_proj/v_proj/"
                                        "o_proj.weight; write one with `multihead init --num-kv-heads`)");
  if (q->second.values.dim() != 2)
    throw Error(Error::Kind::Shape, prefix + "q_proj.weight: expected (num_heads*head_dim, embed_dim), got " +
                                        shape_to_string(q->second.values.shape()));
  if (!num_heads) {
    const auto m = file.metadata.find("num_heads");
    if (m == file.metadata.end())
      throw Error(Error::Kind::Value, "--num-heads: needed (the weights' metadata has no num_heads)");
    try {
      num_heads = std::stoll(m->second);
    } catch (const std::exception&) {
      throw Error(Error::Kind::Value, "num_heads: the weights' metadata holds '" + m->second + "', not a number");
    }
    if (*num_heads < 1) throw Error(Error::Kind::Value, "num_heads: the weights' metadata holds " + m->second);
  }
  const int64_t rows = q->second.values.size(0), E = q->second.values.size(1);
  if (rows % *num_heads != 0)
    throw Error(Error::Kind::Shape, prefix + "q_proj.weight: " + std::to_string(rows) +
                                        " rows are not num_heads " + std::to_string(*num_heads) + " heads of equal width");
  const int64_t D = rows / *num_heads;
  std::map<std::string, Tensor<T>> tensors;
  bool bias = false;
  for (const char* name : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "q_proj.bias",
                           "k_proj.bias", "v_proj.bias", "o_proj.bias"}) {
    const auto it = file.tensors.find(prefix + name);
    if (it == file.tensors.end()) continue;
    tensors[prefix + name] = tensor_cast<T>(it->second.values);
    bias = bias || std::string(name).find("bias") != std::string::npos;
  }
  const GroupedQueryAttentionConfig cfg = gqa_config(E, *num_heads, D, flags, bias, causal);
  // The K/V head count is a flag, the file's shapes must agree with it.
  const auto k = file.tensors.find(prefix + "k_proj.weight");
  if (k != file.tensors.end() && k->second.values.shape() != Shape{cfg.num_kv_heads * D, E})
    throw Error(Error::Kind::Shape, "--num-kv-heads: " + std::to_string(cfg.num_kv_heads) + " K/V heads of width " +
                                        std::to_string(D) + " need " + prefix + "k_proj.weight " +
                                        shape_to_string({cfg.num_kv_heads * D, E}) + ", the file's is " +
                                        shape_to_string(k->second.values.shape()));
  return GroupedQueryAttention<T>::from_tensors(cfg, tensors, prefix);
}

template GroupedQueryAttention<float> load_gqa<float>(const std::string&, const std::string&, std::optional<int64_t>,
                                                      const GqaFlags&, bool);
template GroupedQueryAttention<double> load_gqa<double>(const std::string&, const std::string&,
                                                        std::optional<int64_t>, const GqaFlags&, bool);

std::string serialize_gqa(const GroupedQueryAttention<float>& module) {
  const GroupedQueryAttentionConfig& c = module.config();
  return serialize_safetensors(module.named_tensors(),
                               {{"module", "grouped_query_attention"},
                                {"num_heads", std::to_string(c.num_heads)},
                                {"num_kv_heads", std::to_string(module.kv_heads())},
                                {"head_dim", std::to_string(module.head_dim())}});
}

}  // namespace multihead::cli
