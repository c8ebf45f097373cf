// src/train/loss_scale.hpp: dynamic loss scaling for float16 training, as
// torch.cuda.amp.GradScaler does it (PyTorch 1.13, torch/cuda/amp/grad_scaler.py,
// _amp_update_scale_), with its defaults except the growth interval:
//  - the loss gradient is multiplied by `scale` before the backward, so
//    small gradients stay above f16's smallest normal (2^-14) instead of
//    flushing to its subnormals or 0;
//  - the float32 master gradients are divided by `scale` afterwards;
//  - a step whose unscaled gradient holds an inf or a NaN (some f16 value
//    overflowed, |x| > 65504) is skipped: no update, the scale halves;
//  - after kGrowthInterval clean steps in a row, the scale doubles.
// Start 2^16 and factors 2 and 1/2 as GradScaler; the interval is 2000
// steps, GradScaler's default. The scale stays a power of two, so scaling
// and unscaling are exact (no rounding) while nothing overflows.
// bfloat16 has float32's exponent range and needs none of this: its
// scaler is disabled (scale 1, never skips).
// Internal: not part of the public API.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>

#include "multihead/tensor.hpp"

namespace multihead::train {

class LossScaler {
 public:
  static constexpr double kInitialScale = 65536.0;  // 2^16
  static constexpr int64_t kGrowthInterval = 2000;
  static constexpr double kMaxScale = 16777216.0 * 16777216.0;  // 2^48: far below float32's range

  LossScaler() = default;  // disabled: scale 1, every step clean
  // enabled: start at `scale`, double after `growth_interval` clean steps.
  LossScaler(bool enabled, double scale = kInitialScale, int64_t clean_steps = 0,
             int64_t growth_interval = kGrowthInterval)
      : enabled_(enabled), scale_(enabled ? scale : 1.0), clean_(enabled ? clean_steps : 0),
        interval_(growth_interval) {}

  bool enabled() const { return enabled_; }
  double scale() const { return scale_; }
  int64_t clean_steps() const { return clean_; }  // clean steps since the last change of scale

  // After a step's backward: whether its gradient was finite. Returns
  // whether the step is applied (false: skipped) and updates the scale.
  bool update(bool finite) {
    if (!enabled_) return true;
    if (!finite) {
      scale_ *= 0.5;
      clean_ = 0;
      return false;
    }
    if (++clean_ >= interval_) {
      if (scale_ * 2.0 <= kMaxScale) scale_ *= 2.0;
      clean_ = 0;
    }
    return true;
  }

 private:
  bool enabled_ = false;
  double scale_ = 1.0;
  int64_t clean_ = 0;
  int64_t interval_ = kGrowthInterval;
};

// Divides every gradient by `scale` (in double, rounded once to T: exact
// for a power of two unless the quotient is subnormal) and returns whether
// every value is finite, checked before the division, as
// _amp_foreach_non_finite_check_and_unscale_ does.
template <class T>
bool unscale_gradients(std::map<std::string, Tensor<T>>& grads, double scale) {
  bool finite = true;
  const double inverse = 1.0 / scale;
  for (auto& [name, g] : grads)
    for (int64_t i = 0; i < g.numel(); ++i) {
      if (!std::isfinite(double(g[i]))) finite = false;
      g[i] = T(double(g[i]) * inverse);
    }
  return finite;
}

}  // namespace multihead::train
