// src/io/metadata.cpp: io/metadata.hpp, and multihead/io.hpp's to_exact_string.
#include "io/metadata.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <system_error>

#include "io/message.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"

namespace multihead::detail {

namespace {

[[noreturn]] void refuse(const std::string& name, const std::string& expected, const std::string& text) {
  throw Error(Error::Kind::Format, name + ": expected " + expected + ", got " + quote_input(text, 60));
}

// std::from_chars over the whole string: no leading space or '+' (from_chars
// takes neither), no trailing characters. The error code tells syntax
// (invalid_argument) from range (result_out_of_range).
template <class T>
std::errc parse_whole(const std::string& text, T& value) {
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc() && stop != end) return std::errc::invalid_argument;
  return ec;
}

}  // namespace

int64_t metadata_integer(const std::string& name, const std::string& text, int64_t min, int64_t max) {
  int64_t v = 0;
  const std::errc ec = parse_whole(text, v);
  if (ec == std::errc::invalid_argument) refuse(name, "an integer", text);
  if (ec != std::errc() || v < min || v > max)
    refuse(name, "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]", text);
  return v;
}

uint64_t metadata_unsigned(const std::string& name, const std::string& text) {
  uint64_t v = 0;
  // from_chars reads "-1" as invalid for an unsigned type: the message says
  // "unsigned" either way.
  const std::errc ec = parse_whole(text, v);
  if (ec == std::errc::invalid_argument) refuse(name, "an unsigned integer", text);
  if (ec != std::errc()) refuse(name, "an unsigned integer below 2^64", text);
  return v;
}

double metadata_number(const std::string& name, const std::string& text) {
  double v = 0;
  // chars_format::general: decimal and exponent forms, not hex; from_chars
  // also reads "nan" and "inf", which the finiteness check refuses.
  const std::errc ec = parse_whole(text, v);
  if (ec != std::errc() || !std::isfinite(v)) refuse(name, "a finite number", text);
  return v;
}

bool metadata_boolean(const std::string& name, const std::string& text) {
  if (text == "true") return true;
  if (text == "false") return false;
  refuse(name, "true or false", text);
}

}  // namespace multihead::detail

namespace multihead {

std::string to_exact_string(double v) {
  char buf[32];  // "-1.2345678901234567e-308": 24 characters
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace multihead
