// src/explain/json_text.cpp: see json_text.hpp.
#include "explain/json_text.hpp"

#include <charconv>
#include <cmath>
#include <system_error>

#include <nlohmann/json.hpp>

namespace multihead::explain::detail {

std::string json_string(const std::string& text) {
  // nlohmann does the JSON escaping and replaces invalid UTF-8; the three
  // HTML characters can only occur inside strings, so replacing them in the
  // dump changes no structure.
  const std::string dumped = nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(dumped.size());
  for (const char c : dumped) {
    if (c == '<') out += "\\u003c";
    else if (c == '>') out += "\\u003e";
    else if (c == '&') out += "\\u0026";
    else out += c;
  }
  return out;
}

std::string json_number(double value, Precision precision) {
  if (!std::isfinite(value)) return "null";  // validate() refuses these; JSON has no NaN
  char buffer[64];
  const std::to_chars_result r = precision == Precision::Float32
                                     ? std::to_chars(buffer, buffer + sizeof buffer, static_cast<float>(value))
                                     : std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, r.ptr);
}

std::string json_weights(const LayerAttention& layer, Precision precision) {
  std::string out = "[";
  for (int64_t h = 0; h < layer.heads; ++h) {
    out += h ? ",[" : "[";
    for (int64_t i = 0; i < layer.queries; ++i) {
      out += i ? ",[" : "[";
      for (int64_t j = 0; j < layer.keys; ++j) {
        if (j) out += ',';
        out += json_number(layer.at(h, i, j), precision);
      }
      out += ']';
    }
    out += ']';
  }
  return out + "]";
}

}  // namespace multihead::explain::detail
