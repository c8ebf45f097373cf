// tools/demo_command.cpp: the lesson's sentence through multi-head
// attention, and where each head sends the word "it".
//
// "The animal didn't cross the street because it was too tired": one head
// may link "it" to "animal", another to "tired". By default the demo runs
// the trained model that ships in models/lesson-heads.safetensors
// (compiled into the program; `multihead experiment --save-model` retrains
// it, the command is in its metadata): head by head, where "it" attends,
// the heads the specialisation measure picked, and the model's answer for
// "it"; then the same heads on "…because it was too wide", where "it" is
// the street, so a head that tracks the referent shows apart from one that
// stays on the subject. The sentence is a test sentence of the lesson task, never trained
// on. --random keeps the first demo: one layer of seeded random weights,
// the mechanics (each head its own distribution) without linguistics.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "commands.hpp"
#include "validators.hpp"
#include "file_flags.hpp"
#include "lesson_model.hpp"
#include "multihead/error.hpp"
#include "multihead/experiment.hpp"
#include "multihead/lesson_tasks.hpp"
#include "multihead/multihead_attention.hpp"
#include "multihead/trained_model.hpp"

namespace multihead::cli {

namespace {

struct DemoArgs {
  int64_t embed_dim = 64;
  int64_t num_heads = 8;
  uint64_t seed = 7;
  std::string focus = "it";
  bool random = false;
  std::string model;     // a lesson-task model file instead of the shipped one
  std::string sentence;  // another sentence of the task's vocabulary
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

void run_random_demo(const DemoArgs& a) {
  const int64_t L = static_cast<int64_t>(kSentence.size()), E = a.embed_dim, H = a.num_heads;
  int64_t focus = -1;
  for (int64_t i = 0; i < L; ++i)
    if (kSentence[i] == a.focus) focus = i;
  if (focus < 0)
    throw Error(Error::Kind::Value, "--focus: expected a word of the sentence, got " + quote_input(a.focus));
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
              "             multihead demo (without --random) shows the trained model's heads.\n\n",
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

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::string w;
  for (char ch : text) {
    if (ch == ' ' || ch == '\t') {
      if (!w.empty()) words.push_back(w);
      w.clear();
    } else {
      w += static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
    }
  }
  if (!w.empty()) words.push_back(w);
  return words;
}

// "1.3" (layer.head counted from 1, as --save-model writes it) -> {0, 2},
// counted from 0; {-1, -1} if absent.
std::pair<int64_t, int64_t> head_of(const std::map<std::string, std::string>& meta, const std::string& key) {
  const auto it = meta.find(key);
  if (it == meta.end()) return {-1, -1};
  const auto dot = it->second.find('.');
  if (dot == std::string::npos) return {-1, -1};
  return {std::atoll(it->second.substr(0, dot).c_str()) - 1, std::atoll(it->second.substr(dot + 1).c_str()) - 1};
}

// The lesson's sentence with the other kind of adjective: "…because it was
// too wide", where "it" is the street (the object). Per head, how much "it"
// puts on each noun in both sentences: a head that tracks the referent
// moves from the subject to the object; one that stays put follows the
// subject (or the object) whatever the sentence says.
void print_contrast(const TrainedModel& model, const LessonTask& task, const LessonSentence& lesson) {
  std::vector<std::string> wide = lesson.words;
  wide[static_cast<std::size_t>(lesson.adjective)] = "wide";
  bool held_out = false;
  for (const LessonSentence& s : task.test_sentences()) held_out = held_out || s.words == wide;
  const int64_t L = LessonTask::kLength, n = static_cast<int64_t>(wide.size()), it = lesson.it;
  const Evaluation tired = model.evaluate(task.sentence_batch(task.ids(lesson.words)), true);
  const Evaluation other = model.evaluate(task.sentence_batch(task.ids(wide)), true);
  const std::string& subject = wide[static_cast<std::size_t>(lesson.subject)];
  const std::string& object = wide[static_cast<std::size_t>(lesson.object)];
  const std::string& adjective = lesson.words[static_cast<std::size_t>(lesson.adjective)];
  std::printf("\n  the same heads when \"it\" is the %s: ", object.c_str());
  for (const auto& w : wide) std::printf("%s ", w.c_str());
  std::printf("\n  (%s)\n\n",
              held_out ? "also a held-out test sentence" : "not held out: training batches may contain it");
  const int w = static_cast<int>(std::max<std::size_t>({subject.size(), object.size(), 4})) + 2;
  std::printf("  %-8s%*s%*s\n", "", 2 * w, ("too " + adjective).c_str(), 2 * w, "too wide");
  std::printf("  %-8s%*s%*s%*s%*s   strongest (too wide)\n", "head", w, subject.c_str(), w, object.c_str(), w,
              subject.c_str(), w, object.c_str());
  const ModelConfig& c = model.config();
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    const float* a = tired.attention[static_cast<std::size_t>(layer)].data();  // (1, H, L, L)
    const float* b = other.attention[static_cast<std::size_t>(layer)].data();
    for (int64_t h = 0; h < c.heads; ++h) {
      const float* ra = a + (h * L + it) * L;
      const float* rb = b + (h * L + it) * L;
      int64_t best = 0;
      for (int64_t j = 0; j < n; ++j)
        if (rb[j] > rb[best]) best = j;
      std::printf("  %-8s%*.0f%*.0f%*.0f%*.0f   %s\n", (std::to_string(layer + 1) + "." + std::to_string(h + 1)).c_str(),
                  w, 100.0 * ra[lesson.subject], w, 100.0 * ra[lesson.object], w, 100.0 * rb[lesson.subject], w,
                  100.0 * rb[lesson.object], wide[static_cast<std::size_t>(best)].c_str());
    }
  }
  const int64_t V = c.vocabulary;
  const float* z = other.logits.data() + it * V;
  int64_t best = 0;
  double sum = 0;
  for (int64_t v = 1; v < V; ++v)
    if (z[v] > z[best]) best = v;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(double(z[v]) - double(z[best]));
  std::printf("\n  the model's answer for \"it\" (too wide): %s (%.0f%%)\n", task.token(static_cast<int32_t>(best)).c_str(),
              100.0 / sum);
  std::printf("  A head that tracks the referent moves from \"%s\" to \"%s\"; one that stays put follows a\n"
              "  position in the sentence (the subject or the object), not what \"it\" means.\n",
              subject.c_str(), object.c_str());
}

void run_trained_demo(const DemoArgs& a) {
  const LessonTask task;
  const TrainedModel model = load_lesson_model(a.model, task);
  const std::vector<std::string> words =
      a.sentence.empty() ? task.test_sentences()[0].words : split_words(a.sentence);
  const int64_t n = static_cast<int64_t>(words.size()), L = LessonTask::kLength;
  if (n < 1 || n > L)
    throw Error(Error::Kind::Value, "--sentence: expected 1 to " + std::to_string(L) + " words, got " +
                                        std::to_string(n));
  std::vector<int32_t> ids;
  try {
    ids = task.ids(words);
  } catch (const Error& e) {
    throw Error(Error::Kind::Value, std::string("--sentence: ") + e.what());
  }
  int64_t focus = -1;
  for (int64_t i = 0; i < n; ++i)
    if (words[static_cast<std::size_t>(i)] == a.focus) focus = i;
  if (focus < 0) throw Error(Error::Kind::Value, "--focus: expected a word of the sentence, got " + quote_input(a.focus));
  const Batch b = task.sentence_batch(ids);
  const Evaluation e = model.evaluate(b, true);

  const ModelConfig& c = model.config();
  const auto& meta = model.metadata();
  // The roles head_role gave the heads when the model was trained
  // (multihead/experiment.hpp; "none" when no head has the role).
  const std::pair<const char*, std::pair<int64_t, int64_t>> role_heads[] = {
      {"referent head", head_of(meta, "referent_head")},
      {"subject head", head_of(meta, "subject_head")},
      {"object head", head_of(meta, "object_head")},
      {"adjective head", head_of(meta, "adjective_head")}};
  std::printf("multihead demo: where does \"%s\" attend, head by head?\n\n", a.focus.c_str());
  std::printf("  sentence : ");
  for (const auto& w : words) std::printf("%s ", w.c_str());
  std::printf("\n  model    : %s (trained on the lesson task: %lld layer%s, d_model %lld, %lld heads of width %lld)\n",
              a.model.empty() ? "models/lesson-heads.safetensors" : a.model.c_str(),
              static_cast<long long>(c.layers), c.layers > 1 ? "s" : "", static_cast<long long>(c.d_model),
              static_cast<long long>(c.heads), static_cast<long long>(c.d_model / c.heads));
  if (a.sentence.empty())
    std::printf("             This sentence is in the task's held-out test set: no training batch had it.\n");
  if (meta.count("command")) std::printf("  retrain  : %s\n", meta.at("command").c_str());
  std::printf("\n  attention of \"%s\" over the tokens, in percent (padding after the sentence takes the rest):\n\n",
              a.focus.c_str());
  std::vector<int> width(words.size());
  std::printf("  %-8s", "head");
  for (std::size_t j = 0; j < words.size(); ++j) {
    width[j] = std::max<int>(4, static_cast<int>(words[j].size())) + 1;
    std::printf("%*s", width[j], words[j].c_str());
  }
  std::printf("   strongest\n");
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    const Tensor<float>& w = e.attention[static_cast<std::size_t>(layer)];  // (1, H, L, L)
    for (int64_t h = 0; h < c.heads; ++h) {
      const float* row = w.data() + (h * L + focus) * L;
      std::printf("  %-8s", (std::to_string(layer + 1) + "." + std::to_string(h + 1)).c_str());
      int64_t best = 0;
      for (int64_t j = 0; j < n; ++j) {
        if (row[j] > row[best]) best = j;
        std::printf("%*.0f", width[static_cast<std::size_t>(j)], 100.0 * row[j]);
      }
      std::string mark;
      for (const auto& [role, head] : role_heads)
        if (head == std::pair<int64_t, int64_t>{layer, h}) mark += std::string("  <- ") + role;
      std::printf("   %-9s%s\n", words[static_cast<std::size_t>(best)].c_str(), mark.c_str());
    }
  }
  if (meta.count("adjective_head"))
    std::printf("\n  Marked: each head's role over the 513 test sentences (multihead experiment's head measures):\n"
                "  a referent head attends from \"it\" to the referent both where it is the subject and where it\n"
                "  is the object; a subject (object) head prefers the subject (object) whichever is meant.\n"
                "  Referent head: %s. Heads are numbered layer.head, from 1.\n",
                meta.count("referent_head") ? meta.at("referent_head").c_str() : "none");

  // The answer at "it": the model's distribution over the vocabulary.
  const int64_t V = c.vocabulary;
  const float* z = e.logits.data() + focus * V;
  std::vector<std::pair<double, int32_t>> p;
  double max = z[0], sum = 0;
  for (int64_t v = 1; v < V; ++v) max = std::max<double>(max, z[v]);
  for (int64_t v = 0; v < V; ++v) sum += std::exp(double(z[v]) - max);
  for (int64_t v = 0; v < V; ++v) p.push_back({std::exp(double(z[v]) - max) / sum, static_cast<int32_t>(v)});
  std::sort(p.begin(), p.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  std::printf("\n  the model's answer for \"%s\": %s (%.0f%%)", a.focus.c_str(), task.token(p[0].second).c_str(),
              100.0 * p[0].first);
  std::printf("; then %s (%.0f%%), %s (%.0f%%)\n", task.token(p[1].second).c_str(), 100.0 * p[1].first,
              task.token(p[2].second).c_str(), 100.0 * p[2].first);
  if (a.focus != "it")
    std::printf("  (the model was trained to answer at \"it\" only; at \"%s\" its answer means nothing)\n",
                a.focus.c_str());
  if (a.sentence.empty() && a.focus == "it") print_contrast(model, task, task.test_sentences()[0]);
  std::printf("\n  multihead demo --random shows untrained (seeded random) weights instead.\n");
}

void run_demo(const DemoArgs& a) {
  if (a.random) return run_random_demo(a);
  return run_trained_demo(a);
}

}  // namespace

Runner add_demo_command(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* c = app.add_subcommand("demo", "The lesson's sentence: where each head sends \"it\"");
  c->add_flag("--random", args->random,
              "Seeded random weights (one layer, --embed-dim, --num-heads, --seed) instead of the trained model");
  c->add_option("--model", args->model, "A lesson-task model file (multihead experiment --save-model) instead of "
                                        "the shipped one")
      ->check(path());
  c->add_option("--sentence", args->sentence,
                "Another sentence in the lesson task's words (trained model only), e.g. \"the dog didn't cross the "
                "road because it was too wide\"");
  c->add_option("--embed-dim", args->embed_dim, "Embedding width (--random)")->check(integer_in(1, 4096, "an integer in [1, 4096]"));
  c->add_option("--num-heads", args->num_heads, "Heads (must divide the embedding width; --random)")->check(integer_in(1, 4096, "an integer in [1, 4096]"));
  c->add_option("--seed", args->seed, "Seed of the random weights and embeddings (--random)")->check(unsigned_integer());
  c->add_option("--focus", args->focus, "The word whose attention is shown");
  return [args, c] {
    // Flags that would change nothing in this combination (issue 22).
    const auto given = [c](const char* flag) { return c->get_option(flag)->count() > 0; };
    for (const char* flag : {"--embed-dim", "--num-heads", "--seed"})
      if (!args->random && given(flag))
        throw Error(Error::Kind::Value, std::string(flag) + ": needs --random (the trained model has its own)");
    for (const char* flag : {"--model", "--sentence"})
      if (args->random && given(flag))
        throw Error(Error::Kind::Value, std::string(flag) + ": not used with --random (it shows the lesson's "
                                                            "sentence through seeded random weights)");
    if (!args->model.empty()) check_files({{"--model", args->model}}, {});
    run_demo(*args);
  };
}

}  // namespace multihead::cli
