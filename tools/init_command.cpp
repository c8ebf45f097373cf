// tools/init_command.cpp: `multihead init`, weights initialised as
// torch.nn.MultiheadAttention initialises them, written as a safetensors
// state_dict that PyTorch loads with load_state_dict(strict=True).
#include <memory>
#include <string>

#include "commands.hpp"
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
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand("init", "Write freshly initialised weights (PyTorch's scheme) as safetensors");
  c->add_option("--embed-dim", a->config.embed_dim, "embed_dim")->required()->check(positive_integer());
  c->add_option("--num-heads", a->config.num_heads, "num_heads")->required()->check(positive_integer());
  c->add_option("--kdim", a->config.kdim, "Key width (default embed_dim)")->check(positive_integer());
  c->add_option("--vdim", a->config.vdim, "Value width (default embed_dim)")->check(positive_integer());
  c->add_option("--dropout", a->config.dropout, "Dropout probability stored in the metadata")
      ->check(probability());
  c->add_flag("--no-bias", a->no_bias, "bias=False");
  c->add_flag("--add-bias-kv", a->config.add_bias_kv, "add_bias_kv=True");
  c->add_flag("--add-zero-attn", a->config.add_zero_attn, "add_zero_attn=True");
  c->add_flag("--batch-first", a->config.batch_first, "batch_first=True");
  c->add_option("--seed", a->seed, "Seed of the initialisation");
  c->add_option("--out", a->out, "Output .safetensors")->required();
  return [a] {
    MultiheadAttentionConfig config = a->config;
    config.bias = !a->no_bias;
    const BasicMultiheadAttention<float> mha(config, a->seed);
    save_weights(a->out, mha);
  };
}

}  // namespace multihead::cli
