// src/weights/gqa_format.hpp: what the MultiheadAttention loader
// (weights.cpp) needs to know of the grouped-query format (gqa_weights.cpp):
// whether a file holds such a module, to say so instead of "unexpected
// tensor". Internal: not part of the public API.
#pragma once

#include <optional>
#include <string>

#include "multihead/io.hpp"

namespace multihead::detail {

// When `file` holds a grouped-query module under `prefix` (its
// prefix + "q_proj.weight" and prefix + "o_proj.weight"), the one-line
// message that says so and how to read it (load_gqa_weights, or
// --num-kv-heads N with N from the metadata when it has num_kv_heads);
// else nothing. `path` names the file.
std::optional<std::string> gqa_module_message(const SafetensorsFile& file, const std::string& prefix,
                                              const std::string& path);

}  // namespace multihead::detail
