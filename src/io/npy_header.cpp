// src/io/npy_header.cpp: a small recursive-descent parser for the .npy
// header dict (NEP 1, "A Simple File Format for NumPy Arrays"; NumPy's
// numpy/lib/format.py). Grammar accepted, with Python whitespace anywhere
// between tokens:
//   dict  := '{' [ entry (',' entry)* [','] ] '}'
//   entry := string ':' value
//   value := string | 'True' | 'False' | tuple
//   tuple := '(' [ int (',' int)* [','] ] ')'
//           "(5)" is read as shape (5): Python would read the int 5, which
//           NumPy then rejects; we take the writer's evident meaning.
//   int   := ['-'] digits ['L']        ('L' from Python 2 writers, as NumPy
//                                       filters it for versions 1.0 and 2.0)
// Strings are '...' or "..." without escapes (no valid key or descr needs one).
#include "io/npy_header.hpp"

#include <cstdint>

#include "io/message.hpp"
#include "multihead/error.hpp"

namespace multihead::detail {

namespace {

class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& name) : s_(text), name_(name) {}

  NpyHeader parse() {
    NpyHeader h;
    bool have_descr = false, have_fortran = false, have_shape = false;
    expect('{', "'{' opening the header dict");
    skip_ws();
    while (peek() != '}') {
      const std::string key = parse_string("a quoted key");
      expect(':', "':' after key " + quote_input(key, 120));
      skip_ws();
      if (key == "descr") {
        mark(have_descr, key);
        if (peek() != '\'' && peek() != '"') {
          fail("'descr' is not a string (structured dtypes are not supported)");
        }
        h.descr = parse_string("the descr string");
      } else if (key == "fortran_order") {
        mark(have_fortran, key);
        h.fortran_order = parse_bool();
      } else if (key == "shape") {
        mark(have_shape, key);
        h.shape = parse_tuple();
      } else {
        fail("unknown key " + quote_input(key, 120) + " (accepted: 'descr', 'fortran_order', 'shape')");
      }
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        skip_ws();
      } else if (peek() != '}') {
        fail_at("',' or '}' after the value of " + quote_input(key, 120));
      }
    }
    ++pos_;
    skip_ws();
    if (pos_ != s_.size()) fail_at("only whitespace after the closing '}'");
    if (!have_descr) fail("missing key 'descr'");
    if (!have_fortran) fail("missing key 'fortran_order'");
    if (!have_shape) fail("missing key 'shape'");
    return h;
  }

 private:
  // -1 at the end, so a truncated header fails where it ends.
  int peek() const { return pos_ < s_.size() ? static_cast<unsigned char>(s_[pos_]) : -1; }

  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(Error::Kind::Format, name_ + ": bad .npy header: " + what);
  }

  [[noreturn]] void fail_at(const std::string& expected) const {
    const std::string found = pos_ < s_.size() ? quote_input(s_.substr(pos_, 1), 120) : "the end";
    fail("expected " + expected + " at header byte " + std::to_string(pos_) + ", found " + found);
  }

  void mark(bool& seen, const std::string& key) const {
    if (seen) fail("key '" + key + "' appears twice");
    seen = true;
  }

  void expect(char c, const std::string& what) {
    skip_ws();
    if (peek() != static_cast<unsigned char>(c)) fail_at(what);
    ++pos_;
  }

  std::string parse_string(const std::string& what) {
    skip_ws();
    const int quote = peek();
    if (quote != '\'' && quote != '"') fail_at(what);
    const std::size_t start = ++pos_;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      if (s_[pos_] == '\\' || s_[pos_] == '\n')
        fail_at("a plain string (escapes and newlines are not supported)");
      ++pos_;
    }
    if (pos_ == s_.size()) fail_at("the closing quote of a string");
    return std::string(s_.substr(start, pos_++ - start));
  }

  bool parse_bool() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    fail_at("True or False for 'fortran_order'");
  }

  int64_t parse_int() {
    const bool negative = peek() == '-';
    if (negative) ++pos_;
    if (peek() < '0' || peek() > '9') fail_at("a dimension (an integer)");
    // Accumulate negatively so INT64_MIN is representable; report overflow
    // as such rather than wrapping into a plausible size.
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int digit = peek() - '0';
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_sub_overflow(v, digit, &v)) {
        fail("dimension at header byte " + std::to_string(pos_) + " does not fit in int64");
      }
      ++pos_;
    }
    if (peek() == 'L') ++pos_;
    if (!negative) {
      if (v == INT64_MIN) fail("dimension at header byte " + std::to_string(pos_) + " does not fit in int64");
      v = -v;
    }
    return v;
  }

  Shape parse_tuple() {
    if (peek() != '(') fail_at("a tuple '(...)' for 'shape'");
    ++pos_;
    Shape shape;
    skip_ws();
    while (peek() != ')') {
      if (shape.size() == kMaxDims)
        fail("'shape' has more than " + std::to_string(kMaxDims) + " dimensions (NumPy's limit)");
      shape.push_back(parse_int());
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        skip_ws();
      } else if (peek() != ')') {
        fail_at("',' or ')' in 'shape'");
      }
    }
    ++pos_;
    return shape;
  }

  std::string_view s_;
  const std::string& name_;
  std::size_t pos_ = 0;
};

}  // namespace

NpyHeader parse_npy_header(std::string_view text, const std::string& name) {
  return HeaderParser(text, name).parse();
}

}  // namespace multihead::detail
