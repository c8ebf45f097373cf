// src/core/parallel.hpp: the one parallel loop over independent work items,
// for the kernels (flash forward, backward, weights recompute, materialized
// rows) and the experiment's runs.
//
// Each item is run by exactly one thread, and what an item computes must
// not depend on which thread runs it or on the thread count; results are
// then identical for any count (the kernels' tests check it at 1 and 2).
// The first exception an item throws is rethrown on the caller's thread
// after the loop (one must never cross an OpenMP region); the items not yet
// started then are skipped.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>

namespace multihead::detail {

// The threads a call asks for: `requested` if > 0, else OpenMP's current
// maximum (multihead::set_threads, OMP_NUM_THREADS).
inline int requested_threads(int requested) { return requested > 0 ? requested : omp_get_max_threads(); }

// Runs fn(item) for every item in [0, items) on up to `threads` OpenMP
// threads (never more than there are items), handing out one item at a
// time (schedule(dynamic, 1): items of unequal cost still end together).
// Returns the number of threads the loop was given.
template <class Fn>
int parallel_items(int64_t items, int threads, const Fn& fn) {
  if (items <= 0) return 0;
  const int team = static_cast<int>(std::clamp<int64_t>(items, 1, std::max(threads, 1)));
  std::exception_ptr error;
  std::mutex error_mutex;
  std::atomic<bool> failed{false};
#pragma omp parallel for schedule(dynamic, 1) num_threads(team) if (team > 1)
  for (int64_t it = 0; it < items; ++it) {
    if (failed.load(std::memory_order_relaxed)) continue;
    try {
      fn(it);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      failed.store(true, std::memory_order_relaxed);
    }
  }
  if (error) std::rethrow_exception(error);
  return team;
}

}  // namespace multihead::detail
