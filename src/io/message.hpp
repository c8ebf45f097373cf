// src/io/message.hpp: quoting text that came from a file (tensor names,
// dtype strings) into an error message, which must stay one readable line
// however hostile the file is.
#pragma once

#include <string>
#include <string_view>

#include "multihead/error.hpp"

namespace multihead::detail {

// Control bytes and bytes outside well-formed UTF-8 become \xNN
// (escape_control_bytes), and text past `max_len` bytes is cut as every
// quoted input is (shortened, multihead/error.hpp): "abc... (N bytes)".
inline std::string printable(std::string_view text, std::size_t max_len = 120) {
  return shortened(text, max_len);
}

}  // namespace multihead::detail
