// src/explain/json_export.cpp: the report as JSON, in our layout (what the
// HTML page embeds) and in bertviz's.
#include <string>
#include <vector>

#include "explain/json_text.hpp"
#include "multihead/explain.hpp"

namespace multihead::explain {
namespace {

using detail::json_number;
using detail::json_string;
using detail::json_weights;

std::string string_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t k = 0; k < items.size(); ++k) out += (k ? "," : "") + json_string(items[k]);
  return out + "]";
}

std::string matrix(const std::vector<double>& values, int64_t rows, int64_t cols, Precision precision) {
  std::string out = "[";
  for (int64_t i = 0; i < rows; ++i) {
    out += i ? ",[" : "[";
    for (int64_t j = 0; j < cols; ++j)
      out += (j ? "," : "") + json_number(values[static_cast<std::size_t>(i * cols + j)], precision);
    out += ']';
  }
  return out + "]";
}

}  // namespace

std::string report_json(const Report& r) {
  validate(r);
  std::string out = "{\"title\":" + json_string(r.title) + ",\"source\":" + json_string(r.source) +
                    ",\"query_tokens\":" + string_list(r.query_tokens) +
                    ",\"key_tokens\":" + string_list(r.key_tokens) + ",\"layers\":[";
  for (std::size_t n = 0; n < r.layers.size(); ++n) {
    const LayerAttention& layer = r.layers[n];
    out += (n ? ",{" : "{");
    out += "\"name\":" + json_string(layer.name) + ",\"heads\":" + std::to_string(layer.heads) +
           ",\"queries\":" + std::to_string(layer.queries) + ",\"keys\":" + std::to_string(layer.keys) +
           ",\"weights\":" + json_weights(layer, r.precision) + ",\"average\":" +
           matrix(head_average(layer), layer.queries, layer.keys, r.precision) + "}";
  }
  out += "],\"answer\":";
  if (r.answer) {
    out += "{\"question\":" + json_string(r.answer->question) + ",\"answer\":" + json_string(r.answer->answer) +
           ",\"confidence\":" +
           (r.answer->confidence ? json_number(*r.answer->confidence, Precision::Float64) : std::string("null")) +
           "}";
  } else {
    out += "null";
  }
  out += ",\"measures\":[";
  for (std::size_t m = 0; m < r.measures.size(); ++m) {
    const HeadMeasure& measure = r.measures[m];
    out += (m ? ",{" : "{");
    out += "\"name\":" + json_string(measure.name) + ",\"description\":" + json_string(measure.description) +
           ",\"layer\":" + std::to_string(measure.layer) + ",\"per_head\":[";
    for (std::size_t h = 0; h < measure.per_head.size(); ++h)
      out += (h ? "," : "") + json_number(measure.per_head[h], Precision::Float64);
    out += "],\"picked\":" + (measure.picked ? std::to_string(*measure.picked) : std::string("null")) + "}";
  }
  out += "],\"focus\":" + std::to_string(r.focus) + "}";
  return out;
}

std::string bertviz_json(const Report& r) {
  validate(r);
  // bertviz's head_view(attention, tokens): attention is one tensor per
  // layer of shape (batch, heads, queries, keys); we write batch = 1.
  std::string out = "{\"tokens\":" + string_list(r.query_tokens);
  if (r.key_tokens != r.query_tokens) out += ",\"key_tokens\":" + string_list(r.key_tokens);
  out += ",\"attention\":[";
  for (std::size_t n = 0; n < r.layers.size(); ++n)
    out += (n ? ",[" : "[") + json_weights(r.layers[n], r.precision) + "]";
  return out + "]}\n";
}

}  // namespace multihead::explain
