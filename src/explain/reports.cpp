// src/explain/reports.cpp: the reports `multihead explain` writes and the
// Python module returns (explain.hpp, "reports"): one module's
// self-attention over an input, the lesson task's trained model on a
// sentence, and the choice of writer.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "multihead/error.hpp"
#include "multihead/experiment.hpp"
#include "multihead/explain.hpp"
#include "multihead/lesson_tasks.hpp"
#include "multihead/trained_model.hpp"

namespace multihead::explain {
namespace {

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> tokens;
  for (std::string t; in >> t;) tokens.push_back(t);
  return tokens;
}

// The ids of the words; a word outside the vocabulary is one line naming
// it and a few words the model knows.
std::vector<int32_t> lesson_ids(const LessonTask& task, const std::vector<std::string>& words, const std::string& what) {
  for (const std::string& w : words) {
    try {
      (void)task.ids({w});
    } catch (const Error&) {
      std::string known;
      for (const auto* list : {&LessonTask::subjects(), &LessonTask::objects(), &LessonTask::subject_adjectives(),
                               &LessonTask::object_adjectives()})
        for (std::size_t i = 0; i < std::min<std::size_t>(2, list->size()); ++i) known += (*list)[i] + ", ";
      throw Error(Error::Kind::Value, what + ": expected words of the model's vocabulary (" +
                                          std::to_string(task.vocabulary()) + " ids, e.g. the, didn't, " + known +
                                          "because, it, was, too), got " + quote_input(w));
    }
  }
  return task.ids(words);
}

}  // namespace

std::vector<std::string> split_tokens(const std::string& text) { return split_words(text); }

std::vector<std::string> lesson_words(const std::string& text) {
  std::vector<std::string> words = split_words(text);
  for (std::string& w : words)
    for (char& ch : w)
      if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
  return words;
}

int64_t resolve_token(const std::string& text, const std::vector<std::string>& labels, const std::string& what) {
  const auto L = static_cast<int64_t>(labels.size());
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (!text.empty() && end == text.c_str() + text.size()) {
    if (v < 0 || v >= L)
      throw Error(Error::Kind::Value, what + ": expected a position 0 to " + std::to_string(L - 1) +
                                          " (the input has " + std::to_string(L) + " tokens), got " + text);
    return v;
  }
  for (int64_t i = 0; i < L; ++i)
    if (labels[static_cast<std::size_t>(i)] == text) return i;
  throw Error(Error::Kind::Value, what + ": expected a position 0 to " + std::to_string(L - 1) +
                                      " or one of the token labels, got " + quote_input(text));
}

template <class T>
Report module_report(const BasicMultiheadAttention<T>& module, const Tensor<T>& input, int64_t batch,
                     const std::vector<std::string>& tokens, const std::string& source, const std::string& tokens_what,
                     const std::string& input_what) {
  Report r;
  r.layers.push_back(attention_weights_per_head(module, input, batch, input_what));
  const int64_t L = r.layers[0].queries;
  if (tokens.empty()) {
    r.query_tokens = position_labels(L);
  } else {
    r.query_tokens = tokens;
    if (static_cast<int64_t>(r.query_tokens.size()) != L)
      throw Error(Error::Kind::Value, tokens_what + ": expected " + std::to_string(L) +
                                          " labels (the input's length L), got " + std::to_string(r.query_tokens.size()));
  }
  r.key_tokens = key_labels(module.config(), r.query_tokens);
  r.precision = sizeof(T) == 8 ? Precision::Float64 : Precision::Float32;
  r.title = "What each head attends to";
  r.source = source;
  return r;
}

template Report module_report<float>(const BasicMultiheadAttention<float>&, const Tensor<float>&, int64_t,
                                     const std::vector<std::string>&, const std::string&, const std::string&,
                                     const std::string&);
template Report module_report<double>(const BasicMultiheadAttention<double>&, const Tensor<double>&, int64_t,
                                      const std::vector<std::string>&, const std::string&, const std::string&,
                                      const std::string&);

std::vector<std::string> lesson_default_sentence() { return LessonTask().test_sentences()[0].words; }

Report lesson_report(const TrainedModel& model, const std::vector<std::string>& words, const std::string& source,
                     std::vector<int32_t>* ids_out, const std::string& what, bool padding_keys) {
  const LessonTask task;
  if (model.task() != task.name() || model.config().vocabulary != task.vocabulary())
    throw Error(Error::Kind::Value, "model: expected a model of the lesson task (vocabulary " +
                                        std::to_string(task.vocabulary()) + "), got task '" + model.task() +
                                        "' with vocabulary " + std::to_string(model.config().vocabulary));
  const int64_t n = static_cast<int64_t>(words.size()), L = LessonTask::kLength;
  if (n < 1 || n > L)
    throw Error(Error::Kind::Value, what + ": expected 1 to " + std::to_string(L) + " words (the model's sequence "
                                    "length), got " + std::to_string(n));
  const std::vector<int32_t> ids = lesson_ids(task, words, what);

  // The sentence padded to the task's length, as the model was trained.
  const Batch b = task.sentence_batch(ids);
  const Evaluation e = model.evaluate(b, true);
  if (ids_out) *ids_out = b.tokens;
  const ModelConfig& c = model.config();
  const int64_t H = c.heads;

  Report r;
  r.query_tokens = words;
  // The padding is attended to as well (the model has no padding mask):
  // with padding_keys its keys stay in the picture, so each row still sums
  // to 1; without (bertviz) only the words' keys are kept.
  const int64_t S = padding_keys ? L : n;
  r.key_tokens = words;
  for (int64_t j = n; j < S; ++j) r.key_tokens.push_back("<pad>");
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    const Tensor<float>& w = e.attention[static_cast<std::size_t>(layer)];  // (1, H, L, L)
    LayerAttention la;
    la.name = "layer " + std::to_string(layer + 1);
    la.heads = H;
    la.queries = n;  // the words' rows; the padding's queries answer nothing
    la.keys = S;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < S; ++j) la.weights.push_back(w[(h * L + i) * L + j]);
    r.layers.push_back(std::move(la));
  }

  // The answer at "it": the model's softmax over the vocabulary there.
  const auto it = std::find(words.begin(), words.end(), "it");
  if (it != words.end()) {
    const int64_t at = it - words.begin(), V = c.vocabulary;
    const float* z = e.logits.data() + at * V;
    double max = z[0], sum = 0;
    for (int64_t v = 1; v < V; ++v) max = std::max<double>(max, z[v]);
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(z[v]) - max);
    const int32_t best = e.predictions[static_cast<std::size_t>(at)];
    r.answer = Answer{"What does \"it\" refer to?", task.token(best), std::exp(double(z[best]) - max) / sum};
    r.focus = at;
  }

  // The experiment's specialisation measure, over the task's 513 test
  // sentences (not only this one): per layer, two measures.
  const std::vector<HeadFocus> focus = lesson_head_focus(model);
  const HeadRoles roles = head_roles(focus);
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    HeadMeasure ref, adj;
    ref.name = "\"it\" \u2192 referent noun";
    ref.description = "Referent selectivity of the attention from \"it\" over the lesson task's " +
                      std::to_string(task.test_sentences().size()) +
                      " held-out test sentences: the smaller of w(referent) \u2212 w(other noun) where the referent "
                      "is the subject and where it is the object (multihead experiment's head measures). The marked "
                      "head is the referent head (selective on both); a head that prefers the subject whichever is "
                      "meant scores below 0 and is not marked.";
    adj.name = "\"it\" \u2192 adjective";
    adj.description = "Adjective selectivity: mean attention from \"it\" to the adjective that decides the referent, "
                      "above the mean over the sentence's other words; the marked head is the adjective head.";
    ref.layer = adj.layer = layer;
    for (const HeadFocus& f : focus)
      if (f.layer == layer) {
        ref.per_head.push_back(f.referent_score());
        adj.per_head.push_back(f.adjective_selectivity);
      }
    if (roles.referent_layer == layer) ref.picked = roles.referent_head;
    if (roles.adjective_layer == layer) adj.picked = roles.adjective_head;
    r.measures.push_back(std::move(ref));
    r.measures.push_back(std::move(adj));
  }

  r.precision = Precision::Float32;
  r.title = "What each head attends to";
  r.source = source;
  return r;
}

std::string write_report(const Report& report, const std::string& format, bool unicode, bool colour) {
  if (format == "html") return html_report(report);
  if (format == "bertviz") return bertviz_json(report);
  if (format == "text") {
    TextOptions o;
    o.token = report.focus >= 0 ? report.focus : 0;
    o.unicode = unicode;
    o.colour = colour;
    return text_view(report, o);
  }
  throw Error(Error::Kind::Value, "format: expected 'html', 'text' or 'bertviz', got " + quote_input(format));
}

}  // namespace multihead::explain
