// tools/gqa_cli.cpp: the grouped-query module's flags and weight files (gqa_cli.hpp).
#include "gqa_cli.hpp"

#include <string>
#include <tuple>

#include "cli_manners.hpp"
#include "validators.hpp"
#include "multihead/error.hpp"
#include "multihead/weights.hpp"

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

namespace {

// load_gqa and load_gqa_narrow: the flags into the loader's options, its
// messages about an option said as the flag that set it, then --rope.
// `load` is load_gqa_weights or load_gqa_weights_narrow<E>.
template <class Load>
auto load_with_flags(const std::string& path, const std::string& prefix, std::optional<int64_t> num_heads,
                     const GqaFlags& flags, bool causal, std::optional<DType>* stored, Load&& load) {
  GqaLoadOptions options;
  options.prefix = prefix;
  options.num_heads = num_heads;
  options.num_kv_heads = flags.num_kv_heads;
  options.causal = causal;
  try {
    auto w = load(path, options);
    check_gqa_flags(flags, w.config.num_heads, w.config.head_dim);
    if (!flags.rope.empty())
      w.config.rope = RopeOptions{parse_rope_convention(flags.rope, "--rope"), flags.rope_theta, 0};
    if (stored != nullptr) *stored = w.parameter_dtype;
    return w;
  } catch (const Error& e) {
    // The library names the option a message is about; say which flag set it.
    const std::string what = e.what();
    for (const auto& [option, flag, given] : {std::tuple{"num_kv_heads: ", "--num-kv-heads: ", flags.num_kv_heads.has_value()},
                                              std::tuple{"num_heads: ", "--num-heads: ", num_heads.has_value()}})
      if (given && what.starts_with(option)) throw Error(e.kind(), flag + what.substr(std::string(option).size()));
    throw;
  }
}

}  // namespace

template <class T>
GroupedQueryAttention<T> load_gqa(const std::string& path, const std::string& prefix,
                                  std::optional<int64_t> num_heads, const GqaFlags& flags, bool causal,
                                  std::optional<DType>* stored) {
  return load_with_flags(path, prefix, num_heads, flags, causal, stored,
                         [](const std::string& p, const GqaLoadOptions& o) { return load_gqa_weights(p, o); })
      .template module<T>();
}

template <class E>
NarrowGroupedQueryAttention<E> load_gqa_narrow(const std::string& path, const std::string& prefix,
                                               std::optional<int64_t> num_heads, const GqaFlags& flags, bool causal,
                                               std::optional<DType>* stored) {
  const NarrowLoadedGqaWeights<E> w =
      load_with_flags(path, prefix, num_heads, flags, causal, stored,
                      [](const std::string& p, const GqaLoadOptions& o) { return load_gqa_weights_narrow<E>(p, o); });
  try {
    return w.module();
  } catch (const Error& e) {
    throw Error(e.kind(), std::string(e.what()) + " (in " + path + ")");
  }
}

template GroupedQueryAttention<float> load_gqa<float>(const std::string&, const std::string&, std::optional<int64_t>,
                                                      const GqaFlags&, bool, std::optional<DType>*);
template GroupedQueryAttention<double> load_gqa<double>(const std::string&, const std::string&,
                                                        std::optional<int64_t>, const GqaFlags&, bool,
                                                        std::optional<DType>*);
template NarrowGroupedQueryAttention<bfloat16> load_gqa_narrow<bfloat16>(const std::string&, const std::string&,
                                                                         std::optional<int64_t>, const GqaFlags&,
                                                                         bool, std::optional<DType>*);
template NarrowGroupedQueryAttention<float16> load_gqa_narrow<float16>(const std::string&, const std::string&,
                                                                       std::optional<int64_t>, const GqaFlags&, bool,
                                                                       std::optional<DType>*);

}  // namespace multihead::cli
