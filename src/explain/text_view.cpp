// src/explain/text_view.cpp: one query token's attention, head by head, for
// a terminal. A row per head: for each key a shade and the weight in percent,
// then the key the head attends to most; the head average last (what
// need_weights returns by default); then the model's answer and the
// per-head measures of this layer, when the report has them.
//
//   head        The animal   ...
//   1         ░   3 ▓  41    ...   animal
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "multihead/error.hpp"
#include "multihead/explain.hpp"

namespace multihead::explain {
namespace {

// Shades by weight: below 5%, 15%, 30%, 50%, and above. Absolute, not
// relative to the row: a shade means the same probability in every row.
constexpr double kThresholds[] = {0.05, 0.15, 0.30, 0.50};
const char* const kUnicodeShades[] = {" ", "\u2591", "\u2592", "\u2593", "\u2588"};  // ░▒▓█
const char* const kAsciiShades[] = {" ", ".", ":", "+", "#"};
// ANSI foreground colours, one per head, in the order of the page's palette
// (blue, orange, red, cyan, green, yellow, purple, pink, brown, grey).
const int kHeadColours[] = {34, 33, 31, 36, 32, 93, 35, 95, 91, 37};

int shade_of(double w) {
  int level = 0;
  for (const double t : kThresholds) level += w >= t ? 1 : 0;
  return level;
}

// Terminal columns of a UTF-8 label: its code points (continuation bytes
// 10xxxxxx take no column).
int columns(const std::string& s) {
  int n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

std::string pad_left(const std::string& s, int width) {
  return std::string(static_cast<std::size_t>(std::max(0, width - columns(s))), ' ') + s;
}

std::string pad_right(const std::string& s, int width) {
  return s + std::string(static_cast<std::size_t>(std::max(0, width - columns(s))), ' ');
}

std::string percent(double w) {
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "%3.0f", 100.0 * w);
  return buffer;
}

std::string quote_input(const std::string& s) { return "\"" + escape_control_bytes(s) + "\""; }

// A report's free text in the text view's alphabet: in ASCII mode the
// measure names' arrow "→" becomes "->" (the rest of the view is ASCII
// there; tokens are the caller's).
std::string in_alphabet(std::string s, bool unicode) {
  if (unicode) return s;
  for (std::size_t at; (at = s.find("\u2192")) != std::string::npos;) s.replace(at, 3, "->");
  return s;
}

}  // namespace

std::string text_view(const Report& r, const TextOptions& o) {
  validate(r);
  if (o.layer < 0 || o.layer >= static_cast<int64_t>(r.layers.size()))
    throw Error(Error::Kind::Value, "layer: expected 0 to " + std::to_string(r.layers.size() - 1) + ", got " +
                                        std::to_string(o.layer));
  const LayerAttention& layer = r.layers[static_cast<std::size_t>(o.layer)];
  const int64_t H = layer.heads, S = layer.keys, i = o.token;
  if (i < 0 || i >= layer.queries)
    throw Error(Error::Kind::Value, "token: expected a query token 0 to " + std::to_string(layer.queries - 1) +
                                        ", got " + std::to_string(i));
  const char* const* shades = o.unicode ? kUnicodeShades : kAsciiShades;
  auto paint = [&](const std::string& text, int64_t head) {
    if (!o.colour) return text;
    return "\x1b[" + std::to_string(kHeadColours[head % 10]) + "m" + text + "\x1b[0m";
  };

  std::vector<std::string> keys;
  for (const std::string& k : r.key_tokens) keys.push_back(escape_control_bytes(k));
  std::vector<int> width(static_cast<std::size_t>(S));
  for (int64_t j = 0; j < S; ++j) width[static_cast<std::size_t>(j)] = std::max(5, columns(keys[static_cast<std::size_t>(j)]));

  std::string out;
  if (!r.title.empty()) out += escape_control_bytes(r.title) + "\n";
  if (!r.source.empty()) out += escape_control_bytes(r.source) + "\n";
  out += layer.name.empty() ? std::string() : escape_control_bytes(layer.name) + " of " + std::to_string(r.layers.size()) + ", ";
  out += "query token " + std::to_string(i) + " " + quote_input(r.query_tokens[static_cast<std::size_t>(i)]) +
         ": its attention over the keys, in percent (each row sums to 100)\n\n";

  const int label = 6;
  out += pad_right("head", label);
  for (int64_t j = 0; j < S; ++j) out += "  " + pad_left(keys[static_cast<std::size_t>(j)], width[static_cast<std::size_t>(j)]);
  out += "   strongest\n";

  auto row = [&](const std::string& name, auto weight_of, int64_t head) {
    std::string line = head >= 0 ? paint(pad_right(name, label), head) : pad_right(name, label);
    int64_t best = 0;
    for (int64_t j = 0; j < S; ++j) {
      const double w = weight_of(j);
      if (w > weight_of(best)) best = j;
      // "  ▓  41": the shade sits left of the number, inside the column.
      const std::string cell = shades[shade_of(w)] + std::string(" ") + percent(w);
      const int pad = width[static_cast<std::size_t>(j)] - 5;
      const std::string painted = head >= 0 ? paint(cell, head) : cell;
      line += "  " + std::string(static_cast<std::size_t>(pad), ' ') + painted;
    }
    return line + "   " + keys[static_cast<std::size_t>(best)] + "\n";
  };
  for (int64_t h = 0; h < H; ++h) out += row(std::to_string(h + 1), [&](int64_t j) { return layer.at(h, i, j); }, h);
  const std::vector<double> mean = head_average(layer);
  out += row("mean", [&](int64_t j) { return mean[static_cast<std::size_t>(i * S + j)]; }, -1);

  out += "\nshades: '" + std::string(shades[0]) + "' below 5%, '" + shades[1] + "' from 5%, '" + shades[2] +
         "' from 15%, '" + shades[3] + "' from 30%, '" + shades[4] + "' from 50%\n";
  out += "mean: the average over heads, what need_weights returns by default; it hides which head looks where.\n";
  if (r.answer) {
    out += "\nanswer: " + escape_control_bytes(r.answer->question) + " " + quote_input(r.answer->answer);
    if (r.answer->confidence) {
      char buf[32];
      std::snprintf(buf, sizeof buf, " (%.0f%%)", 100.0 * *r.answer->confidence);
      out += buf;
    }
    out += "\n";
  }
  bool first = true;
  for (const HeadMeasure& m : r.measures) {
    if (m.layer != o.layer) continue;
    if (first) out += "\n";
    first = false;
    out += in_alphabet(escape_control_bytes(m.name), o.unicode) + ", per head:";
    for (std::size_t h = 0; h < m.per_head.size(); ++h) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "  %zu: %.2f", h + 1, m.per_head[h]);
      out += buf;
      if (m.picked && static_cast<std::size_t>(*m.picked) == h) out += " <- picked";
    }
    out += "\n";
  }
  if (!first && !r.measures.empty()) out += in_alphabet(escape_control_bytes(r.measures[0].description), o.unicode) + "\n";
  return out;
}

}  // namespace multihead::explain
