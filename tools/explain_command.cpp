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
#include <sstream>
#include <string>
#include <vector>

#include "cli_manners.hpp"
#include "commands.hpp"
#include "file_flags.hpp"
#include "validators.hpp"
#include "multihead/error.hpp"
#include "multihead/explain.hpp"
#include "multihead/io.hpp"
#include "multihead/weights.hpp"

namespace multihead::cli {
namespace {

struct ExplainArgs {
  std::string weights, prefix, input, out, format = "html", token, tokens;
  int64_t batch = 0;
  bool ascii = false, verbose = false;
};

std::string default_out(const std::string& format) {
  if (format == "html") return "report.html";
  if (format == "bertviz") return "bertviz.json";
  return "-";  // text: the terminal
}

std::vector<std::string> split_tokens(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> tokens;
  for (std::string t; in >> t;) tokens.push_back(t);
  return tokens;
}

// --token: a position (0, 1, …) or, failing that, a label of --tokens.
int64_t resolve_token(const std::string& text, const std::vector<std::string>& labels) {
  const auto L = static_cast<int64_t>(labels.size());
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (!text.empty() && end == text.c_str() + text.size()) {
    if (v < 0 || v >= L)
      throw Error(Error::Kind::Value, "--token: expected a position 0 to " + std::to_string(L - 1) +
                                          " (the input has " + std::to_string(L) + " tokens), got " + text);
    return v;
  }
  for (int64_t i = 0; i < L; ++i)
    if (labels[static_cast<std::size_t>(i)] == text) return i;
  throw Error(Error::Kind::Value, "--token: expected a position 0 to " + std::to_string(L - 1) +
                                      " or one of the --tokens labels, got '" + text + "'");
}

template <class T>
explain::Report build_report(const ExplainArgs& a, const LoadedWeights& w, const LoadedTensor& input) {
  const BasicMultiheadAttention<T> module(w.config, cast_parameters<T>(w.parameters));
  explain::Report r;
  try {
    r.layers.push_back(explain::attention_weights_per_head(module, tensor_cast<T>(input.values), a.batch));
  } catch (const Error& e) {
    if (e.kind() != Error::Kind::Shape) throw;
    throw Error(e.kind(), "--input (the query, key and value of self-attention): " + std::string(e.what()));
  }
  const int64_t L = r.layers[0].queries;
  if (a.tokens.empty()) {
    r.query_tokens = explain::position_labels(L);
  } else {
    r.query_tokens = split_tokens(a.tokens);
    if (static_cast<int64_t>(r.query_tokens.size()) != L)
      throw Error(Error::Kind::Value, "--tokens: expected " + std::to_string(L) + " labels (the input's length L), got " +
                                          std::to_string(r.query_tokens.size()));
  }
  r.key_tokens = explain::key_labels(w.config, r.query_tokens);
  r.precision = sizeof(T) == 8 ? explain::Precision::Float64 : explain::Precision::Float32;
  r.title = "What each head attends to";
  r.source = "weights " + a.weights + (a.prefix.empty() ? "" : " (" + a.prefix + ")") + ", input " + a.input +
             (a.batch ? " entry " + std::to_string(a.batch) : "") + "; " + std::to_string(w.config.num_heads) +
             " heads, embed_dim " + std::to_string(w.config.embed_dim) + ", " + (sizeof(T) == 8 ? "float64" : "float32") +
             "; self-attention";
  if (!a.token.empty()) r.focus = resolve_token(a.token, r.query_tokens);
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
  CLI::App* c = app.add_subcommand("explain", "What each head attends to: an HTML report, a text view or bertviz JSON");
  c->add_option("--weights", a->weights, "safetensors state_dict of a torch.nn.MultiheadAttention (required)")
      ->check(path());
  c->add_option("--prefix", a->prefix, "Module to read from a whole model's state_dict (`multihead inspect` lists them)");
  c->add_option("--input", a->input,
                ".npy input, attended to itself: (L, E), or (L, B, E) / (B, L, E) as the weights' batch_first says "
                "(required)")
      ->check(path());
  c->add_option("--batch", a->batch, "Which entry of a batched input to show")->check(non_negative_integer());
  c->add_option("--tokens", a->tokens, "Token labels, separated by spaces (default: the positions 0, 1, ...)");
  c->add_option("--token", a->token,
                "The query token to show (text) or to focus first (html): a position or a --tokens label "
                "(default: 0 for text, none for html)");
  c->add_option("--format", a->format, "html, text or bertviz")->transform(one_of({"html", "text", "bertviz"}));
  c->add_option("--out", a->out,
                "Output file; default report.html (html), bertviz.json (bertviz), standard output (text); '-' = "
                "standard output")
      ->check(path());
  c->add_flag("--ascii", a->ascii, "Text view in plain ASCII, no colour (also when standard output is no terminal)");
  c->add_flag("--verbose", a->verbose, "Print a one-line summary on stderr");

  return [a] {
    if (a->weights.empty() || a->input.empty())
      throw Error(Error::Kind::Missing,
                  std::string(a->weights.empty() ? "--weights" : "--input") +
                      ": required: explain needs --weights M.safetensors (a torch.nn.MultiheadAttention) and "
                      "--input X.npy (its input)");
    const std::string out = a->out.empty() ? default_out(a->format) : a->out;
    const bool to_terminal = a->format == "text" && is_stdout(out);
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
    const explain::Report report =
        input.dtype == DType::F64 ? build_report<double>(*a, w, input) : build_report<float>(*a, w, input);

    std::string bytes;
    if (a->format == "html") {
      bytes = explain::html_report(report);
    } else if (a->format == "bertviz") {
      bytes = explain::bertviz_json(report);
    } else {
      explain::TextOptions o;
      o.token = report.focus >= 0 ? report.focus : 0;
      const bool terminal = to_terminal && isatty(STDOUT_FILENO) == 1;
      o.unicode = terminal && !a->ascii;
      o.colour = o.unicode && colour_allowed();
      bytes = explain::text_view(report, o);
    }
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
    }
  };
}

}  // namespace multihead::cli
