// src/core/max_threads.cpp: multihead::max_threads() (multihead/runtime.hpp),
// the one bound on thread counts. Counted from the CPUs this process may run
// on (its affinity mask, as taskset or a container limits it), without
// OpenMP, so that code built without it (the textbook oracle) validates
// options by the same rule.
#include <sched.h>

#include <algorithm>

#include "multihead/runtime.hpp"

namespace multihead {

int max_threads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return 8 * std::max(1, cpus);
}

}  // namespace multihead
