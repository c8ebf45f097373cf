// src/io/bytes.hpp: fixed-width integers in a stated byte order, independent
// of the host's. Both formats store little-endian; .npy may also say '>'.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace multihead::detail {

template <class U>
U load_le(const uint8_t* p) {
  U v = 0;
  for (std::size_t i = 0; i < sizeof(U); ++i) v |= static_cast<U>(static_cast<U>(p[i]) << (8 * i));
  return v;
}

template <class U>
U load_be(const uint8_t* p) {
  U v = 0;
  for (std::size_t i = 0; i < sizeof(U); ++i) v = static_cast<U>((v << 8) | p[i]);
  return v;
}

template <class U>
void append_le(std::string& out, U v) {
  for (std::size_t i = 0; i < sizeof(U); ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace multihead::detail
