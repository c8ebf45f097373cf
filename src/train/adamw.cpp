// src/train/adamw.cpp: which parameters AdamW decays (adamw.hpp says why).
#include "train/adamw.hpp"

namespace multihead::train {

bool decays(const std::string& name) {
  // The matrices of linear maps: "…attn.in_proj_weight", "…attn.out_proj.weight",
  // "…ff.0.weight", "…ff.2.weight", "readout.weight". Not "embedding.weight",
  // "…norm1.weight" / "norm2" / "norm_f" (layer-norm gains), nor any bias.
  if (name.ends_with("in_proj_weight")) return true;
  if (!name.ends_with(".weight") || name == "embedding.weight") return false;
  const std::size_t last = name.rfind('.', name.size() - sizeof(".weight"));
  const std::string module = name.substr(last == std::string::npos ? 0 : last + 1);
  return module.rfind("norm", 0) != 0;
}

}  // namespace multihead::train
