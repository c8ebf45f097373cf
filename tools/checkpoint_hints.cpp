// tools/checkpoint_hints.cpp: see checkpoint_hints.hpp.
#include "checkpoint_hints.hpp"

#include <cstdio>
#include <map>

namespace multihead::cli {

std::string assumed_settings_note(const std::vector<AssumedSetting>& assumed, const std::string& weights_path) {
  static const std::map<std::string, std::string> kFlag = {
      {"batch_first", "--batch-first"}, {"add_zero_attn", "--add-zero-attn"}, {"dropout", "--dropout"}};
  if (assumed.empty()) return "";
  std::string values, flags;
  for (const AssumedSetting& a : assumed) {
    values += (values.empty() ? "" : ", ") + a.key + "=" + a.value;
    flags += (flags.empty() ? "" : ", ") + kFlag.at(a.key);
  }
  return "assumed " + values + " (not in " + weights_path + "'s __metadata__; set them with " + flags + ")";
}

namespace {

// The shape rules of MultiheadAttention.forward for batched inputs, in one
// layout. (The library checks them for real; this only asks whether the
// other layout would have passed.)
bool shapes_fit(const MultiheadAttentionConfig& c, bool batch_first, const InputShapes& s) {
  if (s.query.size() != 3 || s.key.size() != 3 || s.value.size() != 3) return false;
  const int b = batch_first ? 0 : 1, l = batch_first ? 1 : 0;
  const int64_t B = s.query[b], L = s.query[l], S = s.key[l];
  if (s.query[2] != c.embed_dim) return false;
  if (s.key[b] != B || s.key[2] != c.key_dim()) return false;
  if (s.value[b] != B || s.value[l] != S || s.value[2] != c.value_dim()) return false;
  if (s.key_padding_mask && *s.key_padding_mask != Shape{B, S}) return false;
  if (s.attn_mask && *s.attn_mask != Shape{L, S} && *s.attn_mask != Shape{B * c.num_heads, L, S}) return false;
  return true;
}

}  // namespace

std::string layout_hint(const MultiheadAttentionConfig& config, const InputShapes& shapes) {
  const bool other = !config.batch_first;
  if (shapes_fit(config, config.batch_first, shapes) || !shapes_fit(config, other, shapes)) return "";
  return other ? "; these shapes fit the batch-first layout (B, L, E): pass --batch-first"
               : "; these shapes fit the sequence-first layout (L, B, E): pass --no-batch-first";
}

std::string widened_weights_note(std::optional<DType> stored, const std::string& computed_in) {
  if (!stored || (*stored != DType::BF16 && *stored != DType::F16)) return "";
  return "--weights holds " + to_string(*stored) + " parameters; computed in " + computed_in +
         " from their exact values (--dtype " + (*stored == DType::BF16 ? "bf16" : "f16") + " computes in " +
         to_string(*stored) + ")";
}

std::string rounded_weights_note(std::optional<DType> stored, DType own, const std::string& dtype_flag) {
  if (stored == own) return "";
  return "--weights holds " + (stored ? to_string(*stored) : std::string("mixed-dtype")) + " parameters; rounded once to " +
         to_string(own) + " (nearest even) for --dtype " + dtype_flag;
}

std::vector<std::string> dtype_notes(ComputeDtype compute, const std::string& dtype_flag,
                                     std::optional<DType> stored, const std::string& wide, bool from_file) {
  if (compute == ComputeDtype::F32) return {from_file ? widened_weights_note(stored, wide) : ""};
  std::vector<std::string> notes;
  if (const std::string path = compute_dtype_note(compute); !path.empty())
    notes.push_back("--dtype " + dtype_flag + ": " + path);
  if (from_file)
    notes.push_back(rounded_weights_note(stored, compute == ComputeDtype::BF16 ? DType::BF16 : DType::F16, dtype_flag));
  return notes;
}

void print_notes(const std::vector<std::string>& notes) {
  for (const std::string& note : notes)
    if (!note.empty()) std::fprintf(stderr, "multihead: note: %s\n", note.c_str());
}

}  // namespace multihead::cli
