// multihead/error.hpp: the one exception type the library throws.
//
// The library never aborts its host and never prints: every bad input becomes
// a multihead::Error whose what() is one line that names the tensor (or file)
// and gives the expected and the actual value, e.g.
//   "key_padding_mask: expected shape (2, 7), got (7, 2)".
// Only the command-line tool turns an Error into an exit code (2).
#pragma once

#include <cctype>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace multihead {

// The length of the well-formed UTF-8 character at text[i] (1 to 4), or 0
// when the bytes there are not one (a stray continuation byte, a truncated
// or overlong sequence, a surrogate, past U+10FFFF).
inline std::size_t utf8_char_length(std::string_view text, std::size_t i) {
  const auto at = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = at(i);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  else if (c == 0xe0) n = 3, lo = 0xa0;
  else if (c == 0xed) n = 3, hi = 0x9f;
  else if (c >= 0xe1 && c <= 0xef) n = 3;
  else if (c == 0xf0) n = 4, lo = 0x90;
  else if (c == 0xf4) n = 4, hi = 0x8f;
  else if (c >= 0xf1 && c <= 0xf3) n = 4;
  else return 0;
  if (i + n > text.size() || at(i + 1) < lo || at(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if ((at(i + k) & 0xc0) != 0x80) return 0;
  return n;
}

// `text` with every control byte (C0, DEL and the C1 controls U+0080 to
// U+009F, whose CSI and NEL terminals and Python read as escapes and line
// breaks), the line and paragraph separators U+2028/U+2029, and every byte
// that is not part of well-formed UTF-8 written as \xNN, byte by byte. So a
// path or a name quoted from a file or the command line can neither add a
// line nor send a terminal escape, and the message is valid text (Python's
// str, a terminal). Error messages use it; so does `multihead inspect`.
// Applying it twice changes nothing.
inline std::string escape_control_bytes(std::string_view text_view) {
  static constexpr char kHex[] = "0123456789abcdef";
  const std::string text(text_view);
  const auto at = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const unsigned char c = at(i);
    const std::size_t n = utf8_char_length(text, i);
    const bool c1 = n == 2 && c == 0xc2 && at(i + 1) < 0xa0;
    const bool separator = n == 3 && c == 0xe2 && at(i + 1) == 0x80 && (at(i + 2) == 0xa8 || at(i + 2) == 0xa9);
    if (n > 0 && c >= 0x20 && c != 0x7f && !c1 && !separator) {
      out.append(text, i, n);
      i += n;
      continue;
    }
    out += "\\x";
    out += kHex[c >> 4];
    out += kHex[c & 15];
    ++i;
  }
  return out;
}

// The most of a quoted value a message shows: a word, a flag value, a path
// or a tensor name from a file can be any length (a 100,000-character word
// made a 100,178-byte "one-line" error). 256 bytes holds any file name
// (NAME_MAX is 255) and the usual path whole; past it the start is enough
// to recognise the value.
inline constexpr std::size_t kQuoteLimit = 256;

namespace detail {
// Where to cut escaped text to at most `limit` bytes: not inside a UTF-8
// character, nor inside a \xNN escape.
inline std::size_t quote_cut(const std::string& escaped, std::size_t limit) {
  std::size_t cut = limit;
  while (cut > 0 && (static_cast<unsigned char>(escaped[cut]) & 0xc0) == 0x80) --cut;
  for (std::size_t back = 1; back <= 3 && back <= cut; ++back)
    if (escaped[cut - back] == '\\' && cut - back + 1 < escaped.size() && escaped[cut - back + 1] == 'x') {
      cut -= back;  // the escape would straddle the cut
      break;
    }
  return cut;
}
}  // namespace detail

// `text` escaped (escape_control_bytes) and cut to at most `limit` bytes, on
// a character and escape boundary, with "..." and the original length when
// it was longer: "abc... (100000 bytes)". Escaping first keeps a message
// short however many bytes need \xNN. Every message that quotes input goes
// through it (or through quote_input()).
inline std::string shortened(std::string_view text, std::size_t limit = kQuoteLimit) {
  std::string escaped = escape_control_bytes(text);
  if (escaped.size() <= limit) return escaped;
  return escaped.substr(0, detail::quote_cut(escaped, limit)) + "... (" + std::to_string(text.size()) + " bytes)";
}

// `text` in single quotes for a message, escaped and cut as shortened()
// does, the length outside the quotes: 'abc' or 'abc...' (100000 bytes).
// A quote inside that could be read as the closing one (one at the end or
// before a byte that is not a letter, digit or '_') is written \x27, so the
// quotes show where the value ends: "a' b" is 'a\x27 b', not 'a' b', while
// "didn't" stays 'didn't'.
inline std::string quote_input(std::string_view text, std::size_t limit = kQuoteLimit) {
  const std::string plain = escape_control_bytes(text);
  std::string escaped;
  for (std::size_t i = 0; i < plain.size(); ++i) {
    const bool closes = i + 1 == plain.size() ||
                        !(std::isalnum(static_cast<unsigned char>(plain[i + 1])) != 0 || plain[i + 1] == '_');
    if (plain[i] == '\'' && closes) escaped += "\\x27";
    else escaped += plain[i];
  }
  if (escaped.size() <= limit) return "'" + escaped + "'";
  return "'" + escaped.substr(0, detail::quote_cut(escaped, limit)) + "...' (" + std::to_string(text.size()) +
         " bytes)";
}

class Error : public std::runtime_error {
 public:
  enum class Kind {
    Shape,    // a tensor has the wrong rank or size
    Value,    // an option or element is out of range (e.g. dropout 1.5, NaN)
    Format,   // a file is malformed, truncated or lies about its sizes
    Missing,  // a required tensor or file is absent
    IO        // the operating system refused a read or a write
  };
  Error(Kind kind, const std::string& message) : std::runtime_error(escape_control_bytes(message)), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

}  // namespace multihead
