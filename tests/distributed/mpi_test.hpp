// tests/distributed/mpi_test.hpp: cases of the MPI test binary
// (mpi_test_main.cpp). A table file registers its cases:
//   MULTIHEAD_MPI_CASES(ring, make_ring_cases)  // std::vector<Case> make_ring_cases()
// Each case's name carries all its parameters, so `mpirun -np 3
// multihead_mpi_tests ring/causal` reruns it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "multihead/distributed.hpp"
#include "multihead/tensor.hpp"

namespace multihead::mpi_test {

struct Report {
  std::vector<std::string> lines;
  void fail(const std::string& line) { lines.push_back(line); }
  bool ok() const { return lines.empty(); }
};

struct Case {
  std::string name;
  std::function<void(distributed::Communicator&, Report&)> run;
  int min_ranks = 1;
};

std::vector<Case>& registry();
struct Register {
  Register(const char* table, std::vector<Case> (*make)());
};
#define MULTIHEAD_MPI_CASES(table, make) \
  static const ::multihead::mpi_test::Register multihead_mpi_register_##table(#table, make)

// max|got − want| <= bound · max(1, max|want|): the error relative to the
// reference's largest magnitude (NaN matches NaN only). Fails once, naming
// the tensor, the worst index, both values, the error and the bound.
template <class T>
void expect_close(Report& report, const std::string& what, const Tensor<T>& got, const Tensor<T>& want,
                  double bound) {
  if (got.shape() != want.shape()) {
    report.fail(what + ": shape " + shape_to_string(got.shape()) + ", expected " + shape_to_string(want.shape()));
    return;
  }
  double scale = 1.0;
  for (int64_t i = 0; i < want.numel(); ++i)
    if (std::isfinite(static_cast<double>(want.data()[i]))) scale = std::max(scale, std::fabs(double(want.data()[i])));
  double worst = 0;
  int64_t at = -1;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double a = got.data()[i], b = want.data()[i];
    if (std::isnan(a) && std::isnan(b)) continue;
    const double e = std::isnan(a) || std::isnan(b) ? INFINITY : (a == b ? 0.0 : std::fabs(a - b));
    if (!(e <= worst)) {
      worst = e;
      at = i;
    }
  }
  if (at >= 0 && worst > bound * scale) {
    char line[512];
    std::snprintf(line, sizeof line, "%s: index %lld: got %.17g, expected %.17g, error %.3g > bound %.3g (%.3g x %.3g)",
                  what.c_str(), static_cast<long long>(at), double(got.data()[at]), double(want.data()[at]), worst,
                  bound * scale, bound, scale);
    report.fail(line);
  }
}

}  // namespace multihead::mpi_test
