// src/core/switches.hpp: one rule for the library's named switches. A
// switch forces a fast path or its reference for a whole process, so that
// one binary can be checked (and timed) both ways: an environment variable
// (MULTIHEAD_NARROW_ATTENTION, MULTIHEAD_F16_GEMM, MULTIHEAD_BF16_DOT,
// MULTIHEAD_FUSED_PATHS, MULTIHEAD_NARROW_GEMV, MULTIHEAD_BACKWARD_HEADS,
// MULTIHEAD_BF16_BACKWARD) or a *_force() call of multihead/runtime.hpp.
// (MULTIHEAD_KERNEL and MULTIHEAD_SIMD_TARGET name a kernel or a target by
// their own parsers, parse_attention_kernel and simd_target_parse, whose
// messages list the same way.) Each reads its value by switch_choice: "" is the
// first name (auto), a name its index, anything else a one-line error with
// the names and the value quoted (escaped: an environment value may hold any
// byte).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "multihead/error.hpp"

namespace multihead::detail {

// The index of `value` among `names` ("" is names[0]); else throws
// multihead::Error (Value): "what: expected one of a, b, c; got 'value'".
inline std::size_t switch_choice(std::string_view what, std::string_view value, std::span<const std::string_view> names) {
  if (value.empty()) return 0;
  for (std::size_t i = 0; i < names.size(); ++i)
    if (value == names[i]) return i;
  std::string list;
  for (const std::string_view name : names) (list += list.empty() ? "" : ", ") += name;
  throw Error(Error::Kind::Value, std::string(what) + ": expected one of " + list + "; got " + quote_input(value));
}
inline std::size_t switch_choice(std::string_view what, std::string_view value,
                                 std::initializer_list<std::string_view> names) {
  return switch_choice(what, value, std::span<const std::string_view>(names.begin(), names.size()));
}

// The environment variable `var` by switch_choice (unset is names[0]); the
// message names the variable. Read when called: a caller that parses once
// keeps the result in a function-local static.
inline std::size_t env_switch(const char* var, std::span<const std::string_view> names) {
  const char* value = std::getenv(var);
  return switch_choice(var, value == nullptr ? std::string_view() : std::string_view(value), names);
}
inline std::size_t env_switch(const char* var, std::initializer_list<std::string_view> names) {
  return env_switch(var, std::span<const std::string_view>(names.begin(), names.size()));
}

}  // namespace multihead::detail
