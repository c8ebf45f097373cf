// tools/cli_manners.hpp: what every subcommand gets without asking, so that a
// subcommand registered later behaves like the others:
//  - enum values in any case (one_of), named in one wording on error;
//  - defaults shown in --help (HelpFormatter, set on the app before any
//    subcommand is added, which then inherits it);
//  - a parse error as one line, with "did you mean" for an unknown flag or
//    subcommand and a pointer to the help of the subcommand that failed;
//  - a short usage for `multihead` alone.
#pragma once

#include <string>
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

}  // namespace multihead::cli
