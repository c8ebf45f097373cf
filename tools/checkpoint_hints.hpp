// tools/checkpoint_hints.hpp: what `multihead forward` tells a user whose
// weights came from PyTorch without a configuration, or whose inputs are in
// the other layout. The library reports the facts (LoadedWeights::assumed, a
// Shape error); the words and the flags to pass are the program's.
#pragma once

#include <optional>
#include <string>

#include "multihead/multihead_attention.hpp"
#include "multihead/weights.hpp"

namespace multihead::cli {

// "assumed batch_first=false, dropout=0 (not in W.safetensors's __metadata__;
// set them with --batch-first, --dropout)", or "" when nothing was assumed.
std::string assumed_settings_note(const std::vector<AssumedSetting>& assumed, const std::string& weights_path);

struct InputShapes {
  Shape query, key, value;
  std::optional<Shape> key_padding_mask, attn_mask;
};

// For a Shape error: "; these shapes fit batch_first=true: pass --batch-first"
// (or false / --no-batch-first) when the inputs are consistent only under the
// other layout, else "".
std::string layout_hint(const MultiheadAttentionConfig& config, const InputShapes& shapes);

}  // namespace multihead::cli
