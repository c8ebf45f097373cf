// tests/train_gradcheck.hpp: central finite differences for the trainer's
// layer tests (tests/test_train_layers.cpp, tests/test_train_model.cpp).
//
// Every check differentiates a scalar f(θ) = Σ_k w_k · y_k(θ), a fixed
// random linear functional of the layer's outputs, so the analytic gradient
// is the layer's backward with d_y = w. For each element θ_i:
//   fd_i = (f(θ + h e_i) − f(θ − h e_i)) / (2h)
// In double, with h = 1e-6 and inputs of order 1, the truncation error is
// h²/6 · |f'''| ~ 1e-12 and the rounding error is ~ε·|f|/h ~ 1e-10·|f|; the
// bound |fd_i − g_i| <= 1e-7 · (1 + |g_i|) holds with three orders to spare
// for smooth layers and fails for any wrong term (an error of one
// contribution is of order 1e-1 … 1).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

namespace multihead::test {

constexpr double kFdStep = 1e-6;
constexpr double kFdBound = 1e-7;

struct FdWorst {
  double error = 0;        // max_i |fd_i − g_i| / (1 + |g_i|)
  int64_t index = -1;
  double fd = 0, analytic = 0;
  int64_t checked = 0;
  std::string describe() const {
    return "worst at " + std::to_string(index) + ": finite difference " + std::to_string(fd) + ", backward " +
           std::to_string(analytic) + ", error " + std::to_string(error) + " (bound " + std::to_string(kFdBound) +
           ", " + std::to_string(checked) + " elements)";
  }
};

// theta: count elements perturbed in place; f evaluates the functional;
// analytic: the backward's gradient for those elements.
inline FdWorst finite_difference(double* theta, int64_t count, const std::function<double()>& f,
                                 const double* analytic) {
  FdWorst w;
  for (int64_t i = 0; i < count; ++i) {
    const double keep = theta[i];
    theta[i] = keep + kFdStep;
    const double plus = f();
    theta[i] = keep - kFdStep;
    const double minus = f();
    theta[i] = keep;
    const double fd = (plus - minus) / (2 * kFdStep);
    const double err = std::abs(fd - analytic[i]) / (1 + std::abs(analytic[i]));
    ++w.checked;
    if (err > w.error || w.index < 0) w = {err, i, fd, analytic[i], w.checked};
  }
  return w;
}

}  // namespace multihead::test
