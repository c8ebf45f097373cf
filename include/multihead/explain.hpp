// multihead/explain.hpp: what each head attends to, as a report.
//
// A Report holds the tokens and, for each layer, every head's attention
// weights (H, L, S): the probabilities softmax(QKᵀ/√D) of step 2 of the
// lesson, one distribution over the S keys for each of the L queries and
// each of the H heads. Optionally it holds the model's answer to a question
// and per-head measures of what the heads specialise in. Three writers turn
// it into:
//  - html_report(): one self-contained page (inline CSS, JavaScript and data,
//    no network) with a head view, per-head heatmaps beside the head-averaged
//    map, and an explanation tied to the lesson's four steps;
//  - text_view(): per-head rows for one query token, for a terminal;
//  - bertviz_json(): bertviz's layout (a list of layers, each (1, H, L, S)).
//
// Where the weights come from is one function, attention_weights_per_head():
// the module's forward with need_weights=true and average_attn_weights=false,
// on the flash kernel, whose weights are recomputed from each row's
// log-sum-exp (no materialized fallback). Anything that fills a
// LayerAttention (a trained model's layers) plugs into the same writers.
//
// Legend: H heads, L query tokens, S key tokens (S = L for self-attention,
// plus one for bias_k and one for the zero-attention key when present).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "multihead/multihead_attention.hpp"

namespace multihead {
class TrainedModel;
}

namespace multihead::explain {

// One layer's attention: weights[(h·L + i)·S + j] is how much query i of
// head h attends to key j. Each row (h, i, ·) sums to 1, or is all zeros for
// a query whose every key is masked.
struct LayerAttention {
  std::string name;  // shown in the layer selector, e.g. "layer 1"
  int64_t heads = 0, queries = 0, keys = 0;  // H, L, S
  std::vector<double> weights;               // (H, L, S), row-major
  double at(int64_t h, int64_t i, int64_t j) const {
    return weights[static_cast<std::size_t>((h * queries + i) * keys + j)];
  }
};

// (L, S): the mean over heads, what need_weights returns by default
// (average_attn_weights=true).
std::vector<double> head_average(const LayerAttention& layer);

// The model's answer to a question about the input, e.g. which word "it"
// refers to.
struct Answer {
  std::string question;             // "What does \"it\" refer to?"
  std::string answer;               // "animal"
  std::optional<double> confidence; // the model's probability for it, in [0, 1]
};

// A number per head of one layer that says what the head does, e.g. the
// attention mass from "it" to the referent noun averaged over a test set.
struct HeadMeasure {
  std::string name;         // "it → referent"
  std::string description;  // one sentence: how it was measured
  int64_t layer = 0;        // index into Report::layers
  std::vector<double> per_head;   // H values
  std::optional<int64_t> picked;  // the head the measure singles out
};

// How many digits the writers keep: the shortest decimal that reads back as
// the same float32 (or float64) value, so the files hold exactly what the
// forward pass computed.
enum class Precision { Float32, Float64 };

struct Report {
  std::string title;                     // first line of the page
  std::string source;                    // what was run, e.g. "mha.safetensors on x.npy"
  std::vector<std::string> query_tokens; // L labels
  std::vector<std::string> key_tokens;   // S labels
  std::vector<LayerAttention> layers;    // at least one
  std::optional<Answer> answer;
  std::vector<HeadMeasure> measures;
  Precision precision = Precision::Float32;
  int64_t focus = -1;  // query token the page focuses first; -1 = none
};

// Throws multihead::Error naming the field, with expected and actual values:
// no layer, no token, token counts that differ from a layer's L or S, a weights vector
// of the wrong size, a weight that is not finite or outside [0, 1], a
// measure whose layer or head count does not match.
void validate(const Report& report);

// Labels "0", "1", …, "n-1": positions, for inputs that carry no words.
std::vector<std::string> position_labels(int64_t n);

// ---- where the weights come from ---------------------------------------------
// One batch entry's per-head weights of self-attention over `input`
// ((L, E), or (L, B, E) / (B, L, E) as the module's batch_first says):
// forward(input, input, input) with need_weights=true and
// average_attn_weights=false (float: kernel = Flash, the weights recomputed
// from its lse), batch entry `batch` of the (B, H, L, S') result.
// This is the one place the reports take weights from the module.
// NaN or Inf in `input` (named `input_what`) or in the module's parameters,
// and weights that overflow (a finite input too large for T), are Errors.
template <class T>
LayerAttention attention_weights_per_head(const BasicMultiheadAttention<T>& module, const Tensor<T>& input,
                                          int64_t batch = 0, const std::string& input_what = "input");

// The key labels for a module over query labels: the labels themselves, then
// "bias_k" when add_bias_kv, then "zero_attn" when add_zero_attn (the keys
// PyTorch appends, in its order).
std::vector<std::string> key_labels(const MultiheadAttentionConfig& config, const std::vector<std::string>& tokens);

// ---- writers -------------------------------------------------------------------
// The report's data as JSON (what the page embeds): {"title", "source",
// "query_tokens", "key_tokens", "layers": [{"name", "heads", "queries",
// "keys", "weights": [H][L][S], "average": [L][S]}], "answer", "measures",
// "focus"}.
std::string report_json(const Report& report);

// One HTML page, self-contained: the data sits in a
// <script type="application/json" id="report-data"> element, with every '<',
// '>' and '&' written as a \u escape so no token can end the element.
std::string html_report(const Report& report);

// {"tokens": [...], "attention": [layer][1][H][L][S]} (the query tokens;
// "key_tokens" too when they differ), as bertviz's head_view takes them
// after torch.tensor() of each layer.
std::string bertviz_json(const Report& report);

struct TextOptions {
  int64_t layer = 0;
  int64_t token = 0;     // the query token whose rows are shown
  bool unicode = false;  // shading ░▒▓█ instead of ASCII .:+#
  bool colour = false;   // ANSI colour per head (a terminal)
};
// Per-head rows for one query token: a shade and a percentage per key, the
// strongest key, then the head average. Throws multihead::Error for a layer
// or token out of range.
std::string text_view(const Report& report, const TextOptions& options);

// ---- the reports `multihead explain` writes (and Python's multihead.explain) ----
// Labels split at white space; lesson_words also lower-cases them (the
// lesson task's spelling, as `multihead demo --sentence` reads them).
std::vector<std::string> split_tokens(const std::string& text);
std::vector<std::string> lesson_words(const std::string& text);

// A query token given as a position ("3") or, failing that, one of the
// labels; throws multihead::Error naming `what` (e.g. "--token").
int64_t resolve_token(const std::string& text, const std::vector<std::string>& labels,
                      const std::string& what = "token");

// One module's self-attention over `input` (attention_weights_per_head's
// batch entry `batch`), its query tokens labelled `tokens` (L labels, or
// none: the positions), the keys key_labels(); float32 or float64 precision
// as T; `source` is the page's line on what was run. A wrong label count is
// an Error naming `tokens_what`; a non-finite or overflowing input one naming
// `input_what`.
template <class T>
Report module_report(const BasicMultiheadAttention<T>& module, const Tensor<T>& input, int64_t batch,
                     const std::vector<std::string>& tokens, const std::string& source,
                     const std::string& tokens_what = "tokens", const std::string& input_what = "input");

// The held-out test sentence "the animal didn't cross the street because it
// was too tired", the default of `multihead explain` and multihead.explain.
std::vector<std::string> lesson_default_sentence();

// The lesson task's trained model (multihead/lesson_tasks.hpp) on a
// sentence of its words (1 to the model's length; none is an Error naming
// `what`), padded to its length:
// every layer's weights for the words' rows, the answer at "it" and its
// probability (focused), and per layer the experiment's two specialisation
// measures over the task's test sentences. `ids`, when given, receives the
// model's input ids (padding included). `padding_keys`: keep the padding's
// keys (the page and the text view, where each row sums to 1) or drop them
// (bertviz, whose head_view needs as many keys as tokens: "Attention has 16
// positions, while number of tokens is 11"). Throws multihead::Error naming
// "model" for a model of another task, `what` for a word outside the
// vocabulary or a sentence of the wrong length.
Report lesson_report(const TrainedModel& model, const std::vector<std::string>& words, const std::string& source,
                     std::vector<int32_t>* ids = nullptr, const std::string& what = "TEXT", bool padding_keys = true);

// The report as "html" (html_report), "bertviz" (bertviz_json) or "text"
// (text_view of layer 0 at the focused query, or query 0 without a focus);
// another format is an Error naming "format".
std::string write_report(const Report& report, const std::string& format, bool unicode = false,
                         bool colour = false);

}  // namespace multihead::explain
