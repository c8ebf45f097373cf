// src/train/statistics.hpp: what `multihead experiment` reports about a set
// of runs: mean, sample standard deviation, and Welch's t-test with its
// two-sided p-value, computed here (no statistics library in the build).
//
// The p-value is P(|T| >= |t|) for Student's t with ν degrees of freedom:
//   p = I_{ν/(ν+t²)}(ν/2, 1/2)
// with I_x(a, b) the regularized incomplete beta function (Numerical
// Recipes 3rd ed. §6.4: the continued fraction, evaluated by Lentz's
// method, on the side of x where it converges fast).
#pragma once

#include <vector>

namespace multihead::train {

double mean(const std::vector<double>& x);
// Sample standard deviation (n − 1 in the denominator); 0 for n < 2.
double stddev(const std::vector<double>& x);

// I_x(a, b) for a, b > 0, x in [0, 1]; relative accuracy ~1e-14.
double regularized_incomplete_beta(double a, double b, double x);
// P(|T| >= |t|), T ~ Student's t with nu > 0 degrees of freedom.
double student_t_two_sided_p(double t, double nu);

struct WelchResult {
  double t = 0;    // (mean(a) − mean(b)) / √(s_a²/n_a + s_b²/n_b)
  double df = 0;   // Welch–Satterthwaite degrees of freedom
  double p = 1;    // two-sided
};
// Welch's unequal-variance t-test. Needs n >= 2 in each sample. When both
// samples have zero variance, t is ±inf and p = 0 if the means differ, and
// t = 0, p = 1 if they are equal (df is then reported as n_a + n_b − 2).
WelchResult welch_t_test(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace multihead::train
