// tools/cli_manners.hpp: what every subcommand gets without asking, so that a
// subcommand registered later behaves like the others:
//  - enum values in any case (one_of), named in one wording on error;
//  - defaults shown in --help (HelpFormatter, set on the app before any
//    subcommand is added, which then inherits it);
//  - a parse error as one line, with "did you mean" for an unknown flag or
//    subcommand and a pointer to the help of the subcommand that failed;
//  - a short usage for `multihead` alone;
//  - the library's field names said as the flags that set them (as_flags).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

namespace multihead::cli {

// A transform: accepts one of `names` in any case ("NaN", "Flash") and
// passes on the spelling given here. Otherwise: "expected one of zeros, nan;
// got 'bogus'" (CLI11 puts the flag in front).
CLI::Validator one_of(const std::vector<std::string>& names);

// Help lines read "--seed UINT  Seed of the initialisation [default: 0]",
// with the rest of CLI11's line (REQUIRED, Needs, Excludes) kept.
// The default is left out for flags and for required options, whose
// captured value is only a placeholder.
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_opts(const CLI::Option* opt) const override;
  std::string make_option_desc(const CLI::Option* opt) const override;
};

// Makes every option registered from now on capture its default for --help,
// and installs HelpFormatter. Call before adding subcommands.
void show_defaults(CLI::App& app);

// The one stderr line for a parse error, without the "multihead: error: "
// prefix: CLI11's message, a suggestion for a mistyped flag or subcommand,
// and "(run 'multihead forward --help')" naming the subcommand that failed.
std::string describe_parse_error(CLI::App& app, const CLI::ParseError& e);

// `message` with every run of non-space bytes longer than 2 x kQuoteLimit
// cut by multihead::shortened: the backstop for text that CLI11 quotes itself
// ("--seed: Value ... could not be converted") or that reaches a message
// uncut. main() passes every error line through it.
std::string cut_long_words(const std::string& message);

// What `multihead` alone prints: one line per subcommand and where to go next.
std::string usage(CLI::App& app);

// The closest of `candidates` to `word` by edit distance (a swap of two
// neighbouring letters counts 1), or "" when none is close enough to be a
// likely typo.
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

// A library field and the flag of this command that sets it; `set`: the
// flag gave the field its value in this run (not a file).
struct FieldFlag {
  std::string field, flag;
  bool set = true;
};

// `message` with the library's field names said as flags:
//  - the leading "field:" (what the message is about), where `set`;
//  - "field=" before ')' or the end (the library's way to name an option to
//    pass in a hint: "(pass one as prefix=)"): "(pass one as --prefix)";
//  - elsewhere, where `set`, a field whose name holds an underscore
//    (embed_dim, d_model: never an English word) standing as a whole word,
// never inside quoted input ('...'), a dotted key (enc.attn.num_heads), a
// path (runs/num_heads.st) or an expression (d_model/heads).
// "num_heads: expected a divisor of embed_dim 10, got 3" -> "--num-heads:
// expected a divisor of --embed-dim 10, got 3". A message that names no
// field comes back as it is.
std::string said_as_flags(std::string_view message, std::span<const FieldFlag> names);

// The fields of a subcommand: each long option --x-y for the field x_y
// (not the tensors it reads: query, key_padding_mask, ...), and `extra` for
// the fields whose flag has another name (vocabulary for --symbols). `set`
// for the flags given, and for all with `defaults_too`: where a file may set
// a field (forward's num_heads from the weights' metadata) a flag not given
// did not set it, and the message names the field as it is.
std::vector<FieldFlag> fields_of(const CLI::App& command, bool defaults_too, std::vector<FieldFlag> extra = {});

// Runs f(); a multihead::Error it throws comes out said_as_flags (its kind,
// and under MPI its agreement, kept: throw_reworded).
template <class F>
decltype(auto) as_flags(std::span<const FieldFlag> names, F&& f);

}  // namespace multihead::cli

#include "mpi_session.hpp"

namespace multihead::cli {

template <class F>
decltype(auto) as_flags(std::span<const FieldFlag> names, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    const std::string said = said_as_flags(e.what(), names);
    if (said == e.what()) throw;
    throw_reworded(e, e.kind(), said);
  }
}

}  // namespace multihead::cli
