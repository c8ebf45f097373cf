// src/train/statistics.cpp: see statistics.hpp.
#include "train/statistics.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "multihead/error.hpp"

namespace multihead::train {
namespace {

// The continued fraction of I_x(a, b) (Numerical Recipes' betacf), by
// the modified Lentz method.
double beta_continued_fraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300, kEps = 1e-16;
  const double qab = a + b, qap = a + 1, qam = a - 1;
  double c = 1, d = 1 - qab * x / qap;
  if (std::fabs(d) < kTiny) d = kTiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 10000; ++m) {
    const int m2 = 2 * m;
    double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
    d = 1 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    h *= d * c;
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
    d = 1 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < kEps) break;
  }
  return h;
}

}  // namespace

double mean(const std::vector<double>& x) {
  if (x.empty()) return std::numeric_limits<double>::quiet_NaN();
  double s = 0;
  for (double v : x) s += v;
  return s / double(x.size());
}

double stddev(const std::vector<double>& x) {
  if (x.size() < 2) return 0;
  const double m = mean(x);
  double s = 0;
  for (double v : x) s += (v - m) * (v - m);
  return std::sqrt(s / double(x.size() - 1));
}

double regularized_incomplete_beta(double a, double b, double x) {
  if (!(a > 0) || !(b > 0) || !(x >= 0 && x <= 1))
    throw Error(Error::Kind::Value, "regularized_incomplete_beta: expected a > 0, b > 0, x in [0, 1], got a = " +
                                        std::to_string(a) + ", b = " + std::to_string(b) + ", x = " +
                                        std::to_string(x));
  if (x == 0 || x == 1) return x;
  // x^a (1 − x)^b / (a B(a, b)), through lgamma.
  const double front =
      std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x));
  // The fraction converges fast for x < (a + 1)/(a + b + 2); else use
  // I_x(a, b) = 1 − I_{1−x}(b, a).
  if (x < (a + 1) / (a + b + 2)) return front * beta_continued_fraction(a, b, x) / a;
  return 1 - front * beta_continued_fraction(b, a, 1 - x) / b;
}

double student_t_two_sided_p(double t, double nu) {
  if (!(nu > 0)) throw Error(Error::Kind::Value, "student_t_two_sided_p: expected nu > 0, got " + std::to_string(nu));
  if (std::isinf(t)) return 0;
  return regularized_incomplete_beta(nu / 2, 0.5, nu / (nu + t * t));
}

WelchResult welch_t_test(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() < 2 || b.size() < 2)
    throw Error(Error::Kind::Value, "welch_t_test: expected at least 2 values in each sample, got " +
                                        std::to_string(a.size()) + " and " + std::to_string(b.size()));
  const double na = double(a.size()), nb = double(b.size());
  const double va = stddev(a) * stddev(a) / na, vb = stddev(b) * stddev(b) / nb;
  const double diff = mean(a) - mean(b);
  WelchResult r;
  if (va + vb == 0) {
    r.df = na + nb - 2;
    r.t = diff == 0 ? 0 : std::copysign(std::numeric_limits<double>::infinity(), diff);
    r.p = diff == 0 ? 1 : 0;
    return r;
  }
  r.t = diff / std::sqrt(va + vb);
  r.df = (va + vb) * (va + vb) / (va * va / (na - 1) + vb * vb / (nb - 1));
  r.p = student_t_two_sided_p(r.t, r.df);
  return r;
}

PairedResult paired_t_test(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.size() < 2)
    throw Error(Error::Kind::Value, "paired_t_test: expected two samples of one length >= 2, got " +
                                        std::to_string(a.size()) + " and " + std::to_string(b.size()));
  std::vector<double> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  PairedResult r;
  r.n = static_cast<int64_t>(d.size());
  r.mean_difference = mean(d);
  r.sd_difference = stddev(d);
  r.df = double(r.n - 1);
  if (r.sd_difference == 0) {
    const double inf = std::numeric_limits<double>::infinity();
    r.t = r.dz = r.mean_difference == 0 ? 0 : std::copysign(inf, r.mean_difference);
    r.p = r.mean_difference == 0 ? 1 : 0;
    return r;
  }
  r.t = r.mean_difference / (r.sd_difference / std::sqrt(double(r.n)));
  r.dz = r.mean_difference / r.sd_difference;
  r.p = student_t_two_sided_p(r.t, r.df);
  return r;
}

double student_t_upper_p(double t, double nu) {
  if (std::isinf(t)) return t > 0 ? 0 : 1;
  const double two = student_t_two_sided_p(t, nu);
  return t >= 0 ? two / 2 : 1 - two / 2;
}

TostResult paired_tost(const std::vector<double>& a, const std::vector<double>& b, double margin) {
  if (!(margin > 0)) throw Error(Error::Kind::Value, "paired_tost margin: expected > 0, got " + std::to_string(margin));
  const PairedResult d = paired_t_test(a, b);
  TostResult r;
  r.margin = margin;
  if (d.sd_difference == 0) {
    r.p_lower = r.p_upper = r.p = std::fabs(d.mean_difference) < margin ? 0 : 1;
    const double inf = std::numeric_limits<double>::infinity();
    r.t_lower = std::copysign(inf, d.mean_difference + margin);
    r.t_upper = std::copysign(inf, d.mean_difference - margin);
    return r;
  }
  const double se = d.sd_difference / std::sqrt(double(d.n));
  r.t_lower = (d.mean_difference + margin) / se;
  r.t_upper = (d.mean_difference - margin) / se;
  r.p_lower = student_t_upper_p(r.t_lower, d.df);       // H0: mean <= −margin
  r.p_upper = 1 - student_t_upper_p(r.t_upper, d.df);   // H0: mean >= +margin
  r.p = std::max(r.p_lower, r.p_upper);
  return r;
}

std::vector<double> holm(const std::vector<double>& p) {
  const std::size_t m = p.size();
  std::vector<std::size_t> order(m);
  for (std::size_t i = 0; i < m; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return p[x] < p[y]; });
  std::vector<double> out(m);
  double running = 0;
  for (std::size_t j = 0; j < m; ++j) {
    running = std::max(running, std::min(1.0, double(m - j) * p[order[j]]));
    out[order[j]] = running;
  }
  return out;
}

uint64_t SplitMix64::next() {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

BootstrapCI bootstrap_mean_ci(const std::vector<double>& x, uint64_t seed, int64_t resamples, double level) {
  if (x.empty() || resamples < 1 || !(level > 0 && level < 1))
    throw Error(Error::Kind::Value, "bootstrap_mean_ci: expected values, resamples >= 1 and level in (0, 1), got " +
                                        std::to_string(x.size()) + " values, " + std::to_string(resamples) +
                                        " resamples, level " + std::to_string(level));
  const uint64_t n = x.size();
  SplitMix64 rng{seed};
  std::vector<double> means(static_cast<std::size_t>(resamples));
  for (auto& m : means) {
    double s = 0;
    for (uint64_t k = 0; k < n; ++k) s += x[static_cast<std::size_t>(((rng.next() >> 32) * n) >> 32)];
    m = s / double(n);
  }
  std::sort(means.begin(), means.end());
  const auto k = static_cast<std::size_t>(std::floor(double(resamples) * (1 - level) / 2));
  return {means[k], means[means.size() - 1 - k]};
}

double paired_detectable_effect(int64_t n, double alpha) {
  if (n < 2 || !(alpha > 0 && alpha < 1))
    throw Error(Error::Kind::Value, "paired_detectable_effect: expected n >= 2 and alpha in (0, 1), got n = " +
                                        std::to_string(n) + ", alpha = " + std::to_string(alpha));
  double lo = 0, hi = 1e6;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (student_t_two_sided_p(mid, double(n - 1)) > alpha ? lo : hi) = mid;
  }
  return (lo + 0.8416212335729143) / std::sqrt(double(n));
}

double curve_area(double a0, const std::vector<int64_t>& steps, const std::vector<double>& acc) {
  if (steps.empty() || steps.size() != acc.size())
    throw Error(Error::Kind::Value, "curve_area: expected as many accuracies as steps (>= 1), got " +
                                        std::to_string(acc.size()) + " and " + std::to_string(steps.size()));
  double area = 0, prev_s = 0, prev_a = a0;
  for (std::size_t k = 0; k < steps.size(); ++k) {
    area += (double(steps[k]) - prev_s) * (prev_a + acc[k]) / 2;
    prev_s = double(steps[k]);
    prev_a = acc[k];
  }
  return area / double(steps.back());
}

int64_t steps_to_fraction(double a0, const std::vector<int64_t>& steps, const std::vector<double>& acc,
                          double fraction) {
  if (steps.empty() || steps.size() != acc.size())
    throw Error(Error::Kind::Value, "steps_to_fraction: expected as many accuracies as steps (>= 1), got " +
                                        std::to_string(acc.size()) + " and " + std::to_string(steps.size()));
  const double target = fraction * acc.back();
  if (a0 >= target) return 0;
  for (std::size_t k = 0; k < steps.size(); ++k)
    if (acc[k] >= target) return steps[k];
  return steps.back();
}

}  // namespace multihead::train
