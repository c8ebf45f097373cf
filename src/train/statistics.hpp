// src/train/statistics.hpp: what `multihead experiment` reports about a set
// of runs: mean, sample standard deviation, Welch's and the paired t-test
// with their two-sided p-values, TOST equivalence, Holm's correction, a
// percentile bootstrap with a fixed seed, and the learning-speed measures,
// computed here (no statistics library in the build; tests/cli recomputes
// each with scipy from the experiment's JSON).
//
// The p-value is P(|T| >= |t|) for Student's t with ν degrees of freedom:
//   p = I_{ν/(ν+t²)}(ν/2, 1/2)
// with I_x(a, b) the regularized incomplete beta function (Numerical
// Recipes 3rd ed. §6.4: the continued fraction, evaluated by Lentz's
// method, on the side of x where it converges fast).
#pragma once

#include <cstdint>
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

struct PairedResult {
  int64_t n = 0;
  double mean_difference = 0;  // mean(a − b)
  double sd_difference = 0;    // sample std of a − b
  double t = 0, df = 0, p = 1; // paired t (df = n − 1), two-sided
  double dz = 0;               // Cohen's d_z = mean / sd (±inf when sd = 0 and the mean is not 0; 0 if both 0)
};
// Paired t-test on a_i − b_i (a and b the same length >= 2). When every
// difference is equal: t = ±inf, p = 0 (mean ≠ 0), or t = 0, p = 1.
PairedResult paired_t_test(const std::vector<double>& a, const std::vector<double>& b);

// P(T > t), T ~ Student's t with nu degrees of freedom (one-sided).
double student_t_upper_p(double t, double nu);

// Two one-sided tests (Schuirmann 1987) on the paired differences a − b
// with equivalence margin ±margin: p = max(P(T > t_lower), P(T < t_upper)),
// t_lower = (mean + margin)/se, t_upper = (mean − margin)/se, df = n − 1.
// Equivalence is claimed when p < α. sd = 0: p = 0 if |mean| < margin, else 1.
struct TostResult {
  double margin = 0, t_lower = 0, t_upper = 0, p_lower = 1, p_upper = 1, p = 1;
};
TostResult paired_tost(const std::vector<double>& a, const std::vector<double>& b, double margin);

// Holm's step-down correction (Holm 1979): p sorted ascending, p_(i)
// becomes max_{j<=i} min(1, (m − j + 1)·p_(j)) (j from 1); returned in the
// input order. Ties keep their input order.
std::vector<double> holm(const std::vector<double>& p);

// SplitMix64 (Steele, Lea, Flood 2014): state += 0x9E3779B97F4A7C15, then
// z = state; z = (z ^ z>>30)·0xBF58476D1CE4E5B9; z = (z ^ z>>27)·0x94D049BB133111EB;
// z ^ z>>31.
struct SplitMix64 {
  uint64_t state;
  uint64_t next();
};

// Percentile bootstrap of the mean of x (docs/experiment.md, "Bootstrap"):
// a SplitMix64 from `seed`; resample r = 0 … resamples − 1 draws n indices
// i_k = ((z >> 32)·n) >> 32 in turn and sums x[i_k] from k = 0 (double, in
// that order), divided by n. The means sorted ascending; with
// k = floor(resamples·(1 − level)/2): lower = sorted[k], upper =
// sorted[resamples − 1 − k].
struct BootstrapCI {
  double lower = 0, upper = 0;
};
BootstrapCI bootstrap_mean_ci(const std::vector<double>& x, uint64_t seed, int64_t resamples, double level);

// The effect a paired t-test on n pairs detects with 80% power at
// two-sided level alpha, by the normal approximation to the noncentral t:
// d_z ≈ (t_{1−alpha/2, n−1} + z_0.8) / √n, z_0.8 = 0.8416 (n = 20, alpha
// 0.05: 0.656; the exact noncentral value is 0.660). t from bisection on
// student_t_two_sided_p.
double paired_detectable_effect(int64_t n, double alpha);

// Learning speed from a test-accuracy curve measured at steps s_1 < … < s_K
// (the last the run's end), with a_0 the accuracy before training (step 0):
//  - area: the trapezoid rule over (0, a_0), (s_1, a_1), …, (s_K, a_K),
//    divided by s_K: the mean accuracy over the run, in [0, 1];
//  - steps_to_fraction: the first s_k with a_k >= fraction·a_K (s_K if none
//    before; 0 if a_0 already is).
double curve_area(double accuracy_at_0, const std::vector<int64_t>& steps, const std::vector<double>& accuracy);
int64_t steps_to_fraction(double accuracy_at_0, const std::vector<int64_t>& steps, const std::vector<double>& accuracy,
                          double fraction);

}  // namespace multihead::train
