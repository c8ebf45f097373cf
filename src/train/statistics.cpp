// src/train/statistics.cpp: see statistics.hpp.
#include "train/statistics.hpp"

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

}  // namespace multihead::train
