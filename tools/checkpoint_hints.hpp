// tools/checkpoint_hints.hpp: what `multihead forward` tells a user whose
// weights came from PyTorch without a configuration, or whose inputs are in
// the other layout. The library reports the facts (LoadedWeights::assumed, a
// Shape error); the words and the flags to pass are the program's.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "multihead/multihead_attention.hpp"
#include "multihead/narrow.hpp"
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

// The line a run prints (after its outputs are written, so that a failed
// run prints one line) when --weights' stored dtype is not the compute type:
//  - widened: 16-bit parameters computed in `computed_in` ("float32",
//    "float64") from their exact values, naming the --dtype that computes
//    in their type; "" for any other stored dtype;
//  - rounded: parameters of another dtype (or of mixed dtypes) rounded once
//    into the 16-bit module `own` (BF16 or F16) of --dtype `dtype_flag`; ""
//    when they were stored as `own`.
std::string widened_weights_note(std::optional<DType> stored, const std::string& computed_in);
std::string rounded_weights_note(std::optional<DType> stored, DType own, const std::string& dtype_flag);

// The notes of a run's types, in the order it prints them: for a 16-bit run
// (`compute` BF16 or F16, asked as --dtype `dtype_flag`) the compute path
// (compute_dtype_note), then --weights' parameters rounded to it; for a
// float32 or float64 run (`compute` F32, `wide` "float32" or "float64")
// 16-bit parameters widened. `stored`: the parameters' dtype on disk
// (nullopt: mixed); `from_file` false when no --weights was read (the
// parameters were drawn), which says nothing of them.
std::vector<std::string> dtype_notes(ComputeDtype compute, const std::string& dtype_flag,
                                     std::optional<DType> stored, const std::string& wide = "float32",
                                     bool from_file = true);

// Each non-empty note as one "multihead: note: ..." line on stderr. A run
// prints them after its outputs are written, so that a failed run prints
// exactly one line.
void print_notes(const std::vector<std::string>& notes);

}  // namespace multihead::cli
