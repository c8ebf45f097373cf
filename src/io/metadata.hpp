// src/io/metadata.hpp: the one rule for reading a safetensors __metadata__
// value, which the format makes a string, as an integer, a number or a
// boolean. Every metadata reader uses it: the weights loader
// (src/weights/weights.cpp, MHA and GQA), the training checkpoint and the
// trained model (src/train/checkpoint_metadata.cpp). The rule:
//  - integer: the whole string is an optional '-' and decimal digits, as
//    std::to_string and Python's str(int) write it, and lies in [min, max]
//    ("12abc", " 12", "+12", "1e3", "12.0" and "" are refused);
//  - number: the whole string is a decimal (or "1e-05") floating-point
//    number, as "%.17g" and Python's repr(float) write it, and is finite
//    ("nan", "inf", "1e999", "0x1p3", " 1" and "" are refused);
//  - boolean: exactly "true" or "false", the JSON spelling every multihead
//    writer and README's export script (str(x).lower()) use. Python's
//    str(True) ("True"), "1" and "yes" are refused: the weights loader once
//    took "True" and "1", for no writer of ours, while the checkpoint reader
//    did not; one rule now holds for both.
// Doubles are written by to_exact_string (multihead/io.hpp), which this
// number rule reads back exactly.
// Internal: not part of the public API.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

namespace multihead::detail {

// `name` is how the caller's messages call the key: "__metadata__.num_heads"
// or "checkpoint metadata 'step'". Each throws Error(Kind::Format)
// "NAME: expected WHAT, got 'TEXT'", with TEXT quoted printably.
int64_t metadata_integer(const std::string& name, const std::string& text,
                         int64_t min = std::numeric_limits<int64_t>::min(),
                         int64_t max = std::numeric_limits<int64_t>::max());
uint64_t metadata_unsigned(const std::string& name, const std::string& text);
double metadata_number(const std::string& name, const std::string& text);
bool metadata_boolean(const std::string& name, const std::string& text);

}  // namespace multihead::detail
