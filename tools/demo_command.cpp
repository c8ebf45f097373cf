// tools/demo_command.cpp: the lesson's sentence through a multi-head
// attention layer, and where each head sends the word "it".
//
// "The animal didn't cross the street because it was too tired": one head
// may link "it" to "animal", another to "tired". This demo shows the
// mechanics — one row per head, H different distributions over the same
// tokens — on seeded random weights, and says so: until a trained model
// ships, the pattern is arbitrary, not linguistic.
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "commands.hpp"
#include "validators.hpp"
#include "multihead/error.hpp"
#include "multihead/multihead_attention.hpp"

namespace multihead::cli {
namespace {

struct DemoArgs {
  int64_t embed_dim = 64;
  int64_t num_heads = 8;
  uint64_t seed = 7;
  std::string focus = "it";
};

const std::vector<std::string> kSentence = {"The", "animal", "didn't", "cross", "the", "street",
                                            "because", "it", "was", "too", "tired"};

// A token's embedding: a fixed random vector drawn from a generator seeded
// by the word itself, so the same word always gets the same vector.
std::vector<float> embed(const std::string& word, int64_t E, uint64_t seed) {
  std::mt19937_64 rng(std::hash<std::string>{}(word) ^ seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(E));
  for (float& v : x) v = n(rng);
  return x;
}

void run_demo(const DemoArgs& a) {
  const int64_t L = static_cast<int64_t>(kSentence.size()), E = a.embed_dim, H = a.num_heads;
  int64_t focus = -1;
  for (int64_t i = 0; i < L; ++i)
    if (kSentence[i] == a.focus) focus = i;
  if (focus < 0)
    throw Error(Error::Kind::Value, "--focus: expected a word of the sentence, got '" + a.focus + "'");
  MultiheadAttentionConfig config;
  config.embed_dim = E;
  config.num_heads = H;
  const MultiheadAttention mha(config, a.seed);

  Tensor<float> x({L, E});  // unbatched (L, E)
  for (int64_t i = 0; i < L; ++i) {
    const std::vector<float> e = embed(kSentence[i], E, a.seed);
    std::copy(e.begin(), e.end(), x.data() + i * E);
  }
  ForwardOptions<float> o;
  o.need_weights = true;
  o.average_attn_weights = false;  // (H, L, S): one distribution per head
  const ForwardResult<float> r = mha.forward(x, x, x, o);
  const Tensor<float>& w = *r.attn_weights;

  std::printf("multihead demo: where does \"%s\" attend, head by head?\n\n", a.focus.c_str());
  std::printf("  sentence : ");
  for (const auto& t : kSentence) std::printf("%s ", t.c_str());
  std::printf("\n  layer    : embed_dim %lld, %lld heads of width %lld, self-attention\n",
              static_cast<long long>(E), static_cast<long long>(H), static_cast<long long>(E / H));
  std::printf("  weights  : SEEDED RANDOM (seed %llu), NOT TRAINED. The pattern below shows the\n"
              "             mechanics (each head its own distribution), not linguistics.\n"
              "             Training is planned; until then the weights are random.\n\n",
              static_cast<unsigned long long>(a.seed));
  std::printf("  attention of \"%s\" over the tokens, in percent (each row sums to 100):\n\n", a.focus.c_str());
  std::vector<int> width(kSentence.size());
  std::printf("  %-6s", "head");
  for (std::size_t j = 0; j < kSentence.size(); ++j) {
    width[j] = std::max<int>(4, static_cast<int>(kSentence[j].size())) + 1;
    std::printf("%*s", width[j], kSentence[j].c_str());
  }
  std::printf("   strongest\n");
  std::vector<double> mean(kSentence.size(), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    std::printf("  %-6lld", static_cast<long long>(h + 1));
    int64_t best = 0;
    for (int64_t j = 0; j < L; ++j) {
      const float p = w[(h * L + focus) * L + j];
      mean[j] += p / static_cast<double>(H);
      if (p > w[(h * L + focus) * L + best]) best = j;
      std::printf("%*.0f", width[j], 100.0 * p);
    }
    std::printf("   %s\n", kSentence[best].c_str());
  }
  std::printf("  %-6s", "mean");
  for (std::size_t j = 0; j < kSentence.size(); ++j) std::printf("%*.0f", width[j], 100.0 * mean[j]);
  std::printf("\n\n  Attention alone ignores word order; positional encoding (the next lesson) adds it.\n");
}

}  // namespace

Runner add_demo_command(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* c = app.add_subcommand("demo", "The lesson's sentence: where each head sends \"it\"");
  c->add_option("--embed-dim", args->embed_dim, "Embedding width")->check(integer_in(1, 4096, "an integer in [1, 4096]"));
  c->add_option("--num-heads", args->num_heads, "Heads (must divide the embedding width)")->check(integer_in(1, 4096, "an integer in [1, 4096]"));
  c->add_option("--seed", args->seed, "Seed of the random weights and embeddings");
  c->add_option("--focus", args->focus, "The word whose attention is shown");
  return [args] { run_demo(*args); };
}

}  // namespace multihead::cli
