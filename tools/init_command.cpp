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

#include "commands.hpp"
#include "file_flags.hpp"
#include "validators.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/weights.hpp"

namespace multihead::cli {

Runner add_init_command(CLI::App& app) {
  struct Args {
    MultiheadAttentionConfig config;
    bool no_bias = false;
    uint64_t seed = 0;
    std::string out;
    bool verbose = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand("init", "Write freshly initialised weights (PyTorch's scheme) as safetensors");
  c->add_option("--embed-dim", a->config.embed_dim, "embed_dim")->required()->check(positive_integer());
  c->add_option("--num-heads", a->config.num_heads, "num_heads")->required()->check(positive_integer());
  c->add_option("--kdim", a->config.kdim, "Key width")->check(positive_integer())->default_str("embed_dim");
  c->add_option("--vdim", a->config.vdim, "Value width")->check(positive_integer())->default_str("embed_dim");
  c->add_option("--dropout", a->config.dropout, "Dropout probability stored in the metadata")
      ->check(probability());
  c->add_flag("--no-bias", a->no_bias, "bias=False");
  c->add_flag("--add-bias-kv", a->config.add_bias_kv, "add_bias_kv=True");
  c->add_flag("--add-zero-attn", a->config.add_zero_attn, "add_zero_attn=True");
  c->add_flag("--batch-first", a->config.batch_first, "batch_first=True");
  c->add_option("--seed", a->seed, "Seed of the initialisation");
  c->add_option("--out", a->out, "Output .safetensors ('-' = standard output; a symlink is written through)")
      ->required()
      ->check(path());
  c->add_flag("--verbose", a->verbose, "Print a one-line summary on stderr");
  return [a] {
    check_files({}, {{"--out", a->out}});
    const auto t0 = std::chrono::steady_clock::now();
    MultiheadAttentionConfig config = a->config;
    config.bias = !a->no_bias;
    const BasicMultiheadAttention<float> mha(config, a->seed);
    std::string bytes = serialize_weights(mha);
    const std::size_t size = bytes.size();
    write_outputs({{{"--out", a->out}, std::move(bytes)}});
    if (a->verbose) {
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "multihead init: wrote %s: %zu tensors, %zu bytes, float32; embed_dim %lld, num_heads %lld, seed %llu; %.3f ms\n",
                   a->out == "-" ? "standard output" : a->out.c_str(), mha.state_dict().size(), size, static_cast<long long>(config.embed_dim),
                   static_cast<long long>(config.num_heads), static_cast<unsigned long long>(a->seed), ms);
    }
  };
}

}  // namespace multihead::cli
