// tools/validators.hpp: option checks whose messages say what was expected
// and what was given ("expected a positive integer, got 0"), instead of
// CLI11's generic ranges.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "multihead/error.hpp"

namespace multihead::cli {

// Whether an integer's text starts with a 0 before other digits ("010",
// "-07"): CLI11 converts integers with base 0, so it would read "010" as
// octal 8 and fail on "08"; such a value is refused instead.
inline bool leading_zero(const std::string& text) {
  const std::size_t digits = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  return text.size() > digits + 1 && text[digits] == '0';
}

inline CLI::Validator integer_in(long long minimum, long long maximum, const std::string& description) {
  return CLI::Validator(
      [minimum, maximum, description](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || v < minimum || v > maximum ||
            leading_zero(text))
          return "expected " + description + ", got " + quote_input(text);
        return "";
      },
      description);
}

inline CLI::Validator integer_at_least(long long minimum, const std::string& description) {
  return integer_in(minimum, std::numeric_limits<long long>::max(), description);
}
// A seed or other unsigned 64-bit value: digits only, 0 to 2^64 - 1 (strtoull
// alone would take "-1" as 2^64 - 1 and "" as 0).
inline CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        (void)std::strtoull(text.c_str(), &end, 10);
        if (!digits || end != text.c_str() + text.size() || errno == ERANGE || leading_zero(text))
          return "expected an integer 0 to 18446744073709551615, got " + quote_input(text);
        return "";
      },
      "an integer 0 to 2^64-1");
}

inline CLI::Validator positive_integer() { return integer_at_least(1, "a positive integer"); }
inline CLI::Validator non_negative_integer() { return integer_at_least(0, "an integer >= 0"); }

// The one reading of a real-valued flag: the whole text a finite number
// (strtod's syntax), or nullopt. An underflow to a subnormal or zero (1e-320)
// is a number; an overflow (1e999), NaN, inf or trailing text is not.
inline std::optional<double> finite_number(const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  const bool overflow = errno == ERANGE && std::abs(v) > 1.0;
  if (text.empty() || end != text.c_str() + text.size() || overflow || !std::isfinite(v)) return std::nullopt;
  return v;
}

// A number that `accept` takes, else "expected <description>, got '<text>'".
template <class Accept>
CLI::Validator number_where(const std::string& description, const std::string& short_name, Accept accept) {
  return CLI::Validator(
      [description, accept](std::string& text) -> std::string {
        const std::optional<double> v = finite_number(text);
        return v && accept(*v) ? "" : "expected " + description + ", got " + quote_input(text);
      },
      short_name);
}

inline CLI::Validator probability() {
  return number_where("a probability in [0, 1]", "probability in [0, 1]",
                      [](double v) { return v >= 0.0 && v <= 1.0; });
}

// [0, 1) for Adam's betas and the dropout rate of training.
inline CLI::Validator unit_interval_open(const std::string& what) {
  return number_where(what + " in [0, 1)", "in [0, 1)", [](double v) { return v >= 0.0 && v < 1.0; });
}

// A finite number > 0 (e.g. --softcap).
inline CLI::Validator positive_number() {
  return number_where("a finite number > 0", "number > 0", [](double v) { return v > 0.0; });
}

// A finite number >= 0 (weight decay, clip).
inline CLI::Validator non_negative_number() {
  return number_where("a finite number >= 0", "number >= 0", [](double v) { return v >= 0.0; });
}

// A file flag: an empty value is a mistake (an unset shell variable), not
// "no file", and is named as such before anything else runs.
inline CLI::Validator path() {
  return CLI::Validator(
      [](std::string& text) -> std::string { return text.empty() ? "expected a path, got ''" : ""; }, "");
}

}  // namespace multihead::cli
