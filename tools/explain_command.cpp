// tools/explain_command.cpp: `multihead explain`, what each head attends to,
// for a torch.nn.MultiheadAttention safetensors file and an input .npy
// (self-attention: the input is query, key and value).
//
//   --format html     one self-contained page (head view, heatmaps, average)
//   --format text     one token's attention, head by head, for a terminal
//   --format bertviz  JSON that bertviz's head_view opens (docs/bertviz.md)
//
// The report model and its writers are the library's (multihead/explain.hpp);
// this file reads the files, names the tokens and picks the writer. Files
// are checked before any work and written all or nothing (file_flags), as
// `forward` does.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cli_manners.hpp"
#include "commands.hpp"
#include "file_flags.hpp"
#include "lesson_model.hpp"
#include "validators.hpp"
#include "multihead/error.hpp"
#include "multihead/explain.hpp"
#include "multihead/io.hpp"
#include "multihead/lesson_tasks.hpp"
#include "multihead/trained_model.hpp"
#include "multihead/weights.hpp"

namespace multihead::cli {

namespace {

struct ExplainArgs {
  std::string text, model;  // trained-model mode
  bool text_given = false;  // TEXT on the command line, even "" (refused then, not the default sentence)
  std::string weights, prefix, input, out, format = "html", token, tokens;
  int64_t batch = 0;
  bool ascii = false, verbose = false;
};

std::string default_out(const std::string& format) {
  if (format == "html") return "report.html";
  if (format == "bertviz") return "bertviz.json";
  return "-";  // text: the terminal
}

template <class T>
explain::Report build_report(const ExplainArgs& a, const LoadedWeights& w, const LoadedTensor& input) {
  const BasicMultiheadAttention<T> module(w.config, cast_parameters<T>(w.parameters));
  const std::string source = "weights " + a.weights + (a.prefix.empty() ? "" : " (" + a.prefix + ")") + ", input " +
                             a.input + (a.batch ? " entry " + std::to_string(a.batch) : "") + "; " +
                             std::to_string(w.config.num_heads) + " heads, embed_dim " +
                             std::to_string(w.config.embed_dim) + ", " + (sizeof(T) == 8 ? "float64" : "float32") +
                             "; self-attention";
  explain::Report r;
  try {
    r = explain::module_report(module, tensor_cast<T>(input.values), a.batch, explain::split_tokens(a.tokens), source,
                               "--tokens", "--input " + a.input);
  } catch (const Error& e) {
    if (e.kind() != Error::Kind::Shape) throw;
    throw Error(e.kind(), "--input (the query, key and value of self-attention): " + std::string(e.what()));
  }
  if (!a.token.empty()) r.focus = explain::resolve_token(a.token, r.query_tokens, "--token");
  return r;
}

// ---- a trained model of the lesson task -------------------------------------------
// `ids` receives the token ids (padding included), which --verbose prints so
// a check can rebuild the model's input (tests/cli/explain.py does).
// `padding_keys`: keep the padding's keys (the page and the text view, where
// each row sums to 1) or drop them (bertviz, whose head_view needs as many
// keys as tokens: "Attention has 16 positions, while number of tokens is 11").
explain::Report build_trained_report(const ExplainArgs& a, bool padding_keys, std::vector<int32_t>& ids_out) {
  const LessonTask task;
  const TrainedModel model = load_lesson_model(a.model, task);
  const ModelConfig& c = model.config();
  const std::string source = std::string(a.model.empty() ? "models/lesson-heads.safetensors (shipped)" : a.model) +
                             ", trained on the lesson task: " + std::to_string(c.layers) + " layer" +
                             (c.layers > 1 ? "s" : "") + ", " + std::to_string(c.heads) + " heads, d_model " +
                             std::to_string(c.d_model) + "; input padded to " + std::to_string(LessonTask::kLength) +
                             " tokens" + (padding_keys ? "" : " (the padding's keys left out)") +
                             (a.text_given ? "" : "; a held-out test sentence");
  const std::vector<std::string> words =
      a.text_given ? explain::lesson_words(a.text) : explain::lesson_default_sentence();
  explain::Report r = explain::lesson_report(model, words, source, &ids_out, "TEXT", padding_keys);
  if (!a.token.empty()) r.focus = explain::resolve_token(a.token, r.query_tokens, "--token");
  return r;
}

bool colour_allowed() {
  // https://no-color.org: any non-empty NO_COLOR turns colour off.
  const char* no_colour = std::getenv("NO_COLOR");
  return no_colour == nullptr || *no_colour == '\0';
}

}  // namespace

Runner add_explain_command(CLI::App& app) {
  auto a = std::make_shared<ExplainArgs>();
  CLI::App* c = app.add_subcommand(
      "explain",
      "What each head attends to: an HTML report, a text view or bertviz JSON. By default the shipped trained "
      "model on the lesson's sentence (`multihead explain --out report.html`); --weights/--input for a plain "
      "torch.nn.MultiheadAttention");
  CLI::Option* text = c->add_option("TEXT", a->text,
                "A sentence in the lesson task's words for the trained model (default: \"The animal didn't cross "
                "the street because it was too tired\")");
  c->add_option("--model", a->model,
                "A lesson-task model file (multihead experiment --save-model) instead of the shipped one")
      ->check(path());
  c->add_option("--weights", a->weights,
                "safetensors state_dict of a torch.nn.MultiheadAttention, with --input (instead of a trained model)")
      ->check(path());
  c->add_option("--prefix", a->prefix, "Module to read from a whole model's state_dict (`multihead inspect` lists them)");
  c->add_option("--input", a->input,
                ".npy input of --weights, attended to itself: (L, E), or (L, B, E) / (B, L, E) as the weights' "
                "batch_first says")
      ->check(path());
  c->add_option("--batch", a->batch, "Which entry of a batched --input to show")->check(non_negative_integer());
  c->add_option("--tokens", a->tokens,
                "Token labels of --input, separated by spaces (default: the positions 0, 1, ...)");
  c->add_option("--token", a->token,
                "The query token to show (text) or to focus first (html): a position or a token label "
                "(default: \"it\" for a trained model; 0 for text, none for html with --weights)");
  c->add_option("--format", a->format, "html, text or bertviz")->transform(one_of({"html", "text", "bertviz"}));
  c->add_option("--out", a->out,
                "Output file; default report.html (html), bertviz.json (bertviz), standard output (text); '-' = "
                "standard output")
      ->check(path());
  c->add_flag("--ascii", a->ascii, "Text view in plain ASCII, no colour (also when standard output is no terminal)");
  c->add_flag("--verbose", a->verbose, "Print a one-line summary on stderr (for a trained model also its 16 token ids)");

  return [a, text] {
    a->text_given = text->count() > 0;
    if (a->ascii && a->format != "text")
      throw Error(Error::Kind::Value, "--ascii: applies to --format text only, got --format " + a->format);
    const bool plain = !a->weights.empty() || !a->input.empty();
    if (plain && (a->weights.empty() || a->input.empty()))
      throw Error(Error::Kind::Missing,
                  std::string(a->weights.empty() ? "--weights" : "--input") + ": required with " +
                      (a->weights.empty() ? "--input" : "--weights") +
                      ": explain of a plain module needs --weights M.safetensors (a torch.nn.MultiheadAttention) "
                      "and --input X.npy (its input)");
    if (plain && (a->text_given || !a->model.empty()))
      throw Error(Error::Kind::Value, std::string(a->text_given ? "TEXT" : "--model") +
                                          ": expected either a trained model (TEXT, --model) or --weights/--input, "
                                          "got both");
    if (!plain && (a->batch != 0 || !a->tokens.empty() || !a->prefix.empty()))
      throw Error(Error::Kind::Value,
                  std::string(a->batch != 0 ? "--batch" : !a->tokens.empty() ? "--tokens" : "--prefix") +
                      ": applies to --weights/--input only (a trained model's tokens are its words)");
    const std::string out = a->out.empty() ? default_out(a->format) : a->out;
    const bool to_terminal = a->format == "text" && is_stdout(out);
    explain::Report report;
    std::vector<int32_t> ids;
    if (!plain) {
      check_files(a->model.empty() ? std::vector<FileFlag>{} : std::vector<FileFlag>{{"--model", a->model}},
                  to_terminal ? std::vector<FileFlag>{} : std::vector<FileFlag>{{"--out", out}});
      report = build_trained_report(*a, a->format != "bertviz", ids);
    } else {
      check_files({{"--weights", a->weights}, {"--input", a->input}},
                  to_terminal ? std::vector<FileFlag>{} : std::vector<FileFlag>{{"--out", out}});
      LoadOptions load;
      load.prefix = a->prefix;
      const LoadedWeights w = load_weights(a->weights, load);
      if (!w.config.same_embed_dim())
        throw Error(Error::Kind::Value, "--weights: explain runs self-attention, which needs kdim = vdim = embed_dim " +
                                            std::to_string(w.config.embed_dim) + "; this module has kdim " +
                                            std::to_string(w.config.key_dim()) + ", vdim " +
                                            std::to_string(w.config.value_dim()));
      LoadedTensor input = read_npy(a->input, "input");
      if (input.dtype == DType::Bool)
        throw Error(Error::Kind::Value, "input: expected dtype float32 or float64, got bool (" + a->input + ")");
      const int64_t B = input.values.dim() == 3 ? input.values.size(w.config.batch_first ? 0 : 1) : 1;
      if (a->batch >= B)
        throw Error(Error::Kind::Value, "--batch: expected an entry 0 to " + std::to_string(B - 1) +
                                            " of the input's batch of " + std::to_string(B) + ", got " +
                                            std::to_string(a->batch));
      report = input.dtype == DType::F64 ? build_report<double>(*a, w, input) : build_report<float>(*a, w, input);
    }

    const bool unicode = to_terminal && isatty(STDOUT_FILENO) == 1 && !a->ascii;
    std::string bytes = explain::write_report(report, a->format, unicode, unicode && colour_allowed());
    if (to_terminal) {
      if (std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size())
        throw Error(Error::Kind::IO, "cannot write standard output");
    } else {
      write_outputs({{{"--out", out}, std::move(bytes)}});
    }
    if (a->verbose) {
      const explain::LayerAttention& l = report.layers[0];
      std::fprintf(stderr, "multihead explain: wrote %s (%s): %lld query and %lld key tokens, %lld heads, %zu layer%s\n",
                   is_stdout(out) ? "standard output" : out.c_str(), a->format.c_str(),
                   static_cast<long long>(l.queries), static_cast<long long>(l.keys), static_cast<long long>(l.heads),
                   report.layers.size(), report.layers.size() == 1 ? "" : "s");
      if (!ids.empty()) {
        std::string line = "multihead explain: token ids (the model's input, padding included):";
        for (int32_t id : ids) line += " " + std::to_string(id);
        std::fprintf(stderr, "%s\n", line.c_str());
      }
    }
  };
}

}  // namespace multihead::cli
