// src/explain/json_text.hpp: the pieces of JSON the report writers print.
// Numbers are the shortest decimal that reads back as the same float32 (or
// float64) value (std::to_chars), so a file holds exactly what the forward
// pass computed and no more digits than that needs.
#pragma once

#include <string>

#include "multihead/explain.hpp"

namespace multihead::explain::detail {

// A JSON string literal, quotes included. Invalid UTF-8 becomes U+FFFD, and
// '<', '>' and '&' are \u escapes, so the text can sit inside an HTML
// <script> element (a token "</script>" cannot end it).
std::string json_string(const std::string& text);

// `value` rounded to `precision`, shortest round-trip form.
std::string json_number(double value, Precision precision);

// [H][L][S] nested arrays of one layer's weights.
std::string json_weights(const LayerAttention& layer, Precision precision);

}  // namespace multihead::explain::detail
