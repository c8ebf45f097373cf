// tools/init_command.cpp: `multihead init`, weights initialised as
// torch.nn.MultiheadAttention initialises them, written as a safetensors
// state_dict that PyTorch loads with load_state_dict(strict=True).
//
// `--out -` writes the safetensors bytes to standard output, as forward does
// for .npy (`multihead init … --out - > w.safetensors`, or into a pipe).
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli_manners.hpp"
#include "commands.hpp"
#include "file_flags.hpp"
#include "gqa_cli.hpp"
#include "validators.hpp"
#include "multihead/error.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/weights.hpp"

namespace multihead::cli {

namespace {

template <class Args>
void write_gqa(const Args& a, ComputeDtype dtype) {
  for (const auto& [flag, given] : {std::pair{"--kdim", a.config.kdim != 0}, {"--vdim", a.config.vdim != 0},
                                    {"--add-bias-kv", a.config.add_bias_kv}, {"--add-zero-attn", a.config.add_zero_attn},
                                    {"--batch-first", a.config.batch_first}, {"--dropout", a.dropout_given}})
    if (given)
      throw multihead::Error(multihead::Error::Kind::Value, std::string(flag) + ": not used with --num-kv-heads (the grouped-query module has "
                                                          "no such setting)");
  const int64_t E = a.config.embed_dim, H = a.config.num_heads;
  if (!a.head_dim && E % H != 0)
    throw multihead::Error(multihead::Error::Kind::Value, "--num-heads: " + std::to_string(H) + " does not divide --embed-dim " +
                                        std::to_string(E) + " (or give --head-dim)");
  const GroupedQueryAttention<float> m(gqa_config(E, H, a.head_dim.value_or(E / H), a.gqa, !a.no_bias, true), a.seed);
  // --dtype bf16 / f16: the float32 initialisation rounded to nearest even.
  std::string bytes = dtype == ComputeDtype::BF16
                          ? serialize_gqa_weights(NarrowGroupedQueryAttention<bfloat16>::rounded(m.config(), m.parameters()))
                      : dtype == ComputeDtype::F16
                          ? serialize_gqa_weights(NarrowGroupedQueryAttention<float16>::rounded(m.config(), m.parameters()))
                          : serialize_gqa_weights(m);
  const std::size_t size = bytes.size();
  write_outputs({{{"--out", a.out}, std::move(bytes)}});
  if (a.verbose)
    std::fprintf(stderr, "multihead init: wrote %s: grouped-query, %zu bytes, %s; embed_dim %lld, num_heads %lld, "
                 "num_kv_heads %lld, head_dim %lld, seed %llu\n",
                 a.out == "-" ? "standard output" : a.out.c_str(), size,
                 dtype == ComputeDtype::F32 ? "float32" : to_string(dtype).c_str(), static_cast<long long>(E),
                 static_cast<long long>(H), static_cast<long long>(m.kv_heads()), static_cast<long long>(m.head_dim()),
                 static_cast<unsigned long long>(a.seed));
}

}  // namespace

Runner add_init_command(CLI::App& app) {
  struct Args {
    MultiheadAttentionConfig config;
    bool no_bias = false;
    uint64_t seed = 0;
    std::string out;
    bool verbose = false;
    GqaFlags gqa;  // --num-kv-heads: the grouped-query module's weights instead (write_gqa below)
    std::optional<int64_t> head_dim;
    bool dropout_given = false;
    std::string dtype = "f32";
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand("init", "Write freshly initialised weights (PyTorch's scheme) as safetensors");
  c->add_option("--embed-dim", a->config.embed_dim, "embed_dim")->required()->check(positive_integer());
  c->add_option("--num-heads", a->config.num_heads, "num_heads")->required()->check(positive_integer());
  c->add_option("--kdim", a->config.kdim, "Key width")->check(positive_integer())->default_str("embed_dim");
  c->add_option("--vdim", a->config.vdim, "Value width")->check(positive_integer())->default_str("embed_dim");
  CLI::Option* dropout = c->add_option("--dropout", a->config.dropout, "Dropout probability stored in the metadata")
                             ->check(probability());
  c->add_flag("--no-bias", a->no_bias, "bias=False");
  c->add_flag("--add-bias-kv", a->config.add_bias_kv, "add_bias_kv=True");
  c->add_flag("--add-zero-attn", a->config.add_zero_attn, "add_zero_attn=True");
  c->add_flag("--batch-first", a->config.batch_first, "batch_first=True");
  c->add_option("--seed", a->seed, "Seed of the initialisation")->check(unsigned_integer());
  c->add_option("--out", a->out, "Output .safetensors ('-' = standard output; a symlink is written through)")
      ->required()
      ->check(path());
  c->add_flag("--verbose", a->verbose, "Print a one-line summary on stderr");
  c->add_option("--dtype", a->dtype,
                "Tensor dtype of the file: f32, bf16 or f16 (the float32 initialisation rounded to nearest even)")
      ->transform(one_of({"f32", "bf16", "f16"}));
  // No --rope here: the weights do not depend on it (forward and decode
  // take --rope when running the module).
  add_gqa_flags(*c, a->gqa,
                "Write a grouped-query module with N K/V heads instead: q_proj/k_proj/v_proj/o_proj.weight "
                "(+ .bias unless --no-bias), nn.Linear's initialisation, num_heads/num_kv_heads/head_dim in the "
                "metadata (for `multihead forward --num-kv-heads` and `multihead decode`)",
                false);
  c->add_option("--head-dim", a->head_dim, "With --num-kv-heads: head width (default embed_dim / num_heads)")
      ->check(positive_integer());
  return [a, dropout] {
    a->dropout_given = dropout->count() > 0;
    if (a->head_dim && !a->gqa.num_kv_heads)
      throw multihead::Error(multihead::Error::Kind::Value,
                             "--head-dim: needs --num-kv-heads (multi-head attention's head width is embed_dim / "
                             "num_heads)");
    const ComputeDtype dtype = parse_compute_dtype(a->dtype, "--dtype");
    check_files({}, {{"--out", a->out}});
    if (a->gqa.num_kv_heads) return write_gqa(*a, dtype);
    const auto t0 = std::chrono::steady_clock::now();
    MultiheadAttentionConfig config = a->config;
    config.bias = !a->no_bias;
    const BasicMultiheadAttention<float> mha(config, a->seed);
    std::string bytes = dtype == ComputeDtype::BF16
                            ? serialize_weights(NarrowMultiheadAttention<bfloat16>::rounded(config, mha.parameters()))
                        : dtype == ComputeDtype::F16
                            ? serialize_weights(NarrowMultiheadAttention<float16>::rounded(config, mha.parameters()))
                            : serialize_weights(mha);
    const std::size_t size = bytes.size();
    write_outputs({{{"--out", a->out}, std::move(bytes)}});
    if (a->verbose) {
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "multihead init: wrote %s: %zu tensors, %zu bytes, %s; embed_dim %lld, num_heads %lld, seed %llu; %.3f ms\n",
                   a->out == "-" ? "standard output" : a->out.c_str(), mha.state_dict().size(), size,
                   dtype == ComputeDtype::F32 ? "float32" : to_string(dtype).c_str(), static_cast<long long>(config.embed_dim),
                   static_cast<long long>(config.num_heads), static_cast<unsigned long long>(a->seed), ms);
    }
  };
}

}  // namespace multihead::cli
