// multihead/error.hpp: the one exception type the library throws.
//
// The library never aborts its host and never prints: every bad input becomes
// a multihead::Error whose what() is one line that names the tensor (or file)
// and gives the expected and the actual value, e.g.
//   "key_padding_mask: expected shape (2, 7), got (7, 2)".
// Only the command-line tool turns an Error into an exit code (2).
#pragma once

#include <stdexcept>
#include <string>

namespace multihead {

class Error : public std::runtime_error {
 public:
  enum class Kind {
    Shape,    // a tensor has the wrong rank or size
    Value,    // an option or element is out of range (e.g. dropout 1.5, NaN)
    Format,   // a file is malformed, truncated or lies about its sizes
    Missing,  // a required tensor or file is absent
    IO        // the operating system refused a read or a write
  };
  Error(Kind kind, const std::string& message) : std::runtime_error(one_line(message)), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  // A message quotes paths and names as given, and a path may hold a
  // newline: control bytes become \xNN, so what() is always one line.
  static std::string one_line(const std::string& message) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out;
    for (const char ch : message) {
      const auto c = static_cast<unsigned char>(ch);
      if (c >= 0x20 && c != 0x7f) {
        out += ch;
        continue;
      }
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
    return out;
  }
  Kind kind_;
};

}  // namespace multihead
