// src/io/message.hpp: quoting text that came from a file (tensor names,
// dtype strings) into an error message, which must stay one readable line
// however hostile the file is.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "multihead/error.hpp"

namespace multihead::detail {

// Control bytes become \xNN, and text past `max_len` bytes is cut as every
// quoted input is (shortened, multihead/error.hpp): "abc... (N bytes)".
inline std::string printable(std::string_view text, std::size_t max_len = 120) {
  static constexpr char kHex[] = "0123456789abcdef";
  const std::string s = shortened(text, max_len);
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace multihead::detail
