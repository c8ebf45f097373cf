// tools/cli_manners.cpp: see cli_manners.hpp.
#include "cli_manners.hpp"

#include <algorithm>
#include <cctype>
#include <memory>

#include "multihead/error.hpp"

namespace multihead::cli {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : sep) + item;
  return out;
}

// Optimal string alignment distance: insertions, deletions, substitutions
// and swaps of neighbours ("casual" -> "causal" is one swap).
std::size_t edit_distance(const std::string& a, const std::string& b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

// The subcommand the parse was in when it failed (the app itself if none).
CLI::App* failed_in(CLI::App& app) {
  const std::vector<CLI::App*> entered = app.get_subcommands();
  return entered.empty() ? &app : failed_in(*entered.front());
}

// What could have been meant by an unexpected argument: an option of the
// subcommand that failed, or, at the top level, a subcommand.
std::vector<std::string> candidates_for(CLI::App& where, const std::string& arg) {
  std::vector<std::string> names;
  if (arg.rfind("-", 0) == 0) {
    for (const CLI::Option* opt : where.get_options()) {
      for (const auto& n : opt->get_lnames()) names.push_back("--" + n);
      for (const auto& n : opt->get_snames()) names.push_back("-" + n);
    }
  } else {
    for (const CLI::App* sub : where.get_subcommands([](CLI::App*) { return true; }))
      names.push_back(sub->get_name());
  }
  return names;
}

// At the top level, a flag typed before its command ("multihead --query q.npy
// forward"): the commands that have it, e.g. "forward" or "forward, init".
std::string commands_with(CLI::App& app, const std::string& arg) {
  std::vector<std::string> owners;
  const std::string bare = arg.substr(0, arg.find('='));
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    for (const CLI::Option* opt : sub->get_options())
      if (opt->check_name(bare)) owners.push_back(sub->get_name());
  return join(owners, ", ");
}

std::string command_path(const CLI::App* where) {
  std::string path;
  for (const CLI::App* a = where; a != nullptr; a = a->get_parent()) path = a->get_name() + (path.empty() ? "" : " ") + path;
  return path;
}

}  // namespace

CLI::Validator one_of(const std::vector<std::string>& names) {
  const std::string description = "{" + join(names, ",") + "}";
  return CLI::Validator(
      [names](std::string& text) -> std::string {
        for (const auto& n : names) {
          if (lower(n) == lower(text)) {
            text = n;
            return "";
          }
        }
        return "expected one of " + join(names, ", ") + "; got " + quote_input(text);
      },
      description);
}

// CLI11's own line, less the "=default" it glues to the type name: the
// default moves to the end of the description, where it is read.
std::string HelpFormatter::make_option_opts(const CLI::Option* opt) const {
  std::string out = CLI::Formatter::make_option_opts(opt);
  const std::string glued = "=" + opt->get_default_str();
  if (!opt->get_default_str().empty())
    if (const auto at = out.find(glued); at != std::string::npos) out.erase(at, glued.size());
  return out;
}

std::string HelpFormatter::make_option_desc(const CLI::Option* opt) const {
  std::string desc = opt->get_description();
  if (opt->get_type_size() != 0 && !opt->get_required() && !opt->get_default_str().empty())
    desc += " [default: " + opt->get_default_str() + "]";
  return desc;
}

void show_defaults(CLI::App& app) {
  app.option_defaults()->always_capture_default();
  app.formatter(std::make_shared<HelpFormatter>());
}

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string bare = word.substr(0, word.find('='));
  // About one typo per three letters: "--querry" and "forwrd" are caught,
  // "--bogus" is not matched to "--form".
  const std::size_t letters = bare.size() - std::min(bare.find_first_not_of('-'), bare.size());
  const std::size_t allowed = std::clamp<std::size_t>(letters / 3, 1, 3);
  std::string best;
  std::size_t best_distance = allowed + 1;
  for (const auto& c : candidates) {
    const std::size_t dist = edit_distance(lower(bare), lower(c));
    if (dist < best_distance) {
      best = c;
      best_distance = dist;
    }
  }
  return best;
}

namespace {

// "unknown argument '--querry'; did you mean '--query'?"
std::string unknown_argument(CLI::App& app, CLI::App& where, const std::string& arg) {
  std::string msg = (&where == &app ? "unknown command or argument " : "unknown argument ") + quote_input(arg);
  if (const std::string guess = closest(arg, candidates_for(where, arg)); !guess.empty())
    return msg + "; did you mean '" + guess + "'?";
  if (const std::string owners = &where == &app ? commands_with(app, arg) : ""; !owners.empty())
    return msg + "; it is an option of " + owners + ": put it after the command";
  return msg;
}

}  // namespace

std::string cut_long_words(const std::string& message) {
  std::string out;
  std::size_t at = 0;
  while (at < message.size()) {
    const std::size_t end = std::min(message.find(' ', at), message.size());
    const std::string_view word(message.data() + at, end - at);
    out += word.size() > 2 * kQuoteLimit ? shortened(word) : std::string(word);
    if (end < message.size()) out += ' ';
    at = end + 1;
  }
  return out;
}

std::string describe_parse_error(CLI::App& app, const CLI::ParseError& e) {
  CLI::App* where = failed_in(app);
  std::string msg = e.what();
  std::replace(msg.begin(), msg.end(), '\n', ' ');
  // An unknown argument is named even when CLI11 stopped at another error
  // first (a missing --weights): the typo is usually the cause of both.
  if (const std::vector<std::string> extras = where->remaining(); !extras.empty())
    msg = unknown_argument(app, *where, extras.front());
  return msg + " (run '" + command_path(where) + " --help')";
}

std::string usage(CLI::App& app) {
  std::string out = app.get_description() + "\n\nUsage: " + app.get_name() + " <command> [options]\n\nCommands:\n";
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    std::string name = sub->get_name();
    name.resize(std::max<std::size_t>(name.size() + 2, 10), ' ');
    out += "  " + name + sub->get_description() + "\n";
  }
  out += "\nStart with '" + app.get_name() + " demo' (the lesson's sentence, head by head).\n";
  out += "'" + app.get_name() + " <command> --help' lists a command's options; '" + app.get_name() +
         " --help-all' lists them all; '" + app.get_name() + " --version' prints the version.\n";
  return out;
}

namespace {

bool word_byte(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The tensors a command reads, named as tensors (key: expected shape ...),
// not as the flags of their files: --key may not have been given (the key
// is then the query).
bool tensor(const std::string& field) {
  for (const char* name : {"query", "key", "value", "key_padding_mask", "attn_mask", "prompt", "input"})
    if (field == name) return true;
  return false;
}

}  // namespace

std::string said_as_flags(std::string_view message, std::span<const FieldFlag> names) {
  std::string out;
  std::size_t i = 0;
  for (const FieldFlag& n : names) {
    if (n.set && message.starts_with(n.field) && message.substr(n.field.size()).starts_with(":")) {
      out = n.flag;
      i = n.field.size();
      break;
    }
  }
  // Quoted input ('...', quote_input) opens at a quote after a non-word
  // byte and closes at a quote before one ("machine's" opens nothing).
  bool quoted = false;
  while (i < message.size()) {
    const char c = message[i];
    const char before = i == 0 ? ' ' : message[i - 1];
    const bool starts_word = !word_byte(before);
    if (c == '\'') {
      if (!quoted && starts_word) quoted = true;
      else if (quoted && (i + 1 == message.size() || !word_byte(message[i + 1]))) quoted = false;
      out += c;
      ++i;
      continue;
    }
    if (quoted || !starts_word || !word_byte(c)) {
      out += c;
      ++i;
      continue;
    }
    std::size_t end = i;
    while (end < message.size() && word_byte(message[end])) ++end;
    const std::string_view word = message.substr(i, end - i);
    const char after = end < message.size() ? message[end] : ' ';
    // Part of a dotted key (enc.attn.num_heads), a path (runs/num_heads.st)
    // or an expression (d_model/heads): a name, not the field.
    const bool dotted = before == '.' || before == '/' || before == '-' || after == '/' ||
                        (after == '.' && end + 1 < message.size() && word_byte(message[end + 1]));
    const FieldFlag* field = nullptr;
    for (const FieldFlag& n : names)
      if (word == n.field) field = &n;
    // A hint naming an option to pass, "(pass one as prefix=)": the '='
    // closes the parenthesis or the message (kernel=flash or h=1 elsewhere
    // is a value, and stays).
    const bool hint = after == '=' && (end + 1 == message.size() || message[end + 1] == ')');
    if (field != nullptr && !dotted && hint) {
      out += field->flag;
      i = end + 1;  // past the '='
      continue;
    }
    out += field != nullptr && field->set && !dotted && word.find('_') != std::string_view::npos
               ? std::string_view(field->flag)
               : word;
    i = end;
  }
  return out;
}

std::vector<FieldFlag> fields_of(const CLI::App& command, bool defaults_too, std::vector<FieldFlag> extra) {
  std::vector<FieldFlag> fields;
  for (FieldFlag& f : extra) {
    f.set = defaults_too || command.get_option(f.flag)->count() > 0;
    fields.push_back(std::move(f));
  }
  for (const CLI::Option* option : command.get_options()) {
    for (const std::string& name : option->get_lnames()) {
      std::string field = name;
      std::replace(field.begin(), field.end(), '-', '_');
      bool known = false;
      for (const FieldFlag& f : fields) known = known || f.field == field;
      if (!known && !tensor(field) && name != "help" && name != "help-all")
        fields.push_back({field, "--" + name, defaults_too || option->count() > 0});
    }
  }
  return fields;
}

}  // namespace multihead::cli
