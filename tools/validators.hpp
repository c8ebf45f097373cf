// tools/validators.hpp: option checks whose messages say what was expected
// and what was given ("expected a positive integer, got 0"), instead of
// CLI11's generic ranges.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <string>

#include <CLI/CLI.hpp>

#include "multihead/error.hpp"

namespace multihead::cli {

inline CLI::Validator integer_in(long long minimum, long long maximum, const std::string& description) {
  return CLI::Validator(
      [minimum, maximum, description](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || v < minimum || v > maximum)
          return "expected " + description + ", got " + quote_input(text);
        return "";
      },
      description);
}

inline CLI::Validator integer_at_least(long long minimum, const std::string& description) {
  return integer_in(minimum, std::numeric_limits<long long>::max(), description);
}
inline CLI::Validator positive_integer() { return integer_at_least(1, "a positive integer"); }
inline CLI::Validator non_negative_integer() { return integer_at_least(0, "an integer >= 0"); }

inline CLI::Validator probability() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !(v >= 0.0 && v <= 1.0))
          return "expected a probability in [0, 1], got " + quote_input(text);
        return "";
      },
      "probability in [0, 1]");
}

// A finite number > 0 (e.g. --softcap).
inline CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !(v > 0.0) ||
            v > std::numeric_limits<double>::max())
          return "expected a finite number > 0, got " + quote_input(text);
        return "";
      },
      "number > 0");
}

// A file flag: an empty value is a mistake (an unset shell variable), not
// "no file", and is named as such before anything else runs.
inline CLI::Validator path() {
  return CLI::Validator(
      [](std::string& text) -> std::string { return text.empty() ? "expected a path, got ''" : ""; }, "");
}

}  // namespace multihead::cli
