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

// `text` with every control byte (and DEL) written as \xNN, so a path or a
// name quoted from a file or the command line can neither add a line nor
// send a terminal escape. Error messages use it; so does `multihead inspect`.
inline std::string escape_control_bytes(const std::string& text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (const char ch : text) {
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
