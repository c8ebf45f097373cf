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

// The grain: below this much work (multiply-adds, or their equivalent) a
// loop runs on the calling thread alone. An OpenMP team costs its fork and
// join, and on a loaded machine a woken thread may wait a time slice for a
// core, which dwarfs a small call (issue 22, defect 8: a tiny decode step
// took 12-26 ms on 2 threads against 0.003-0.008 ms on one). The value and
// the measurement that chose it: docs/threads.md.
inline constexpr int64_t kParallelGrain = int64_t{1} << 17;

// The team a loop of `items` items of `item_cost` each gets when `threads`
// are asked for: never more than the items, and 1 when the whole loop is
// under the grain (CTranslate2's parallel_for has the same rule).
inline int parallel_team(int64_t items, int threads, int64_t item_cost) {
  if (items <= 1 || threads <= 1) return 1;
  const int64_t cost = std::max<int64_t>(item_cost, 1);
  if (items < kParallelGrain / cost) return 1;  // items · cost < grain, without overflow
  return static_cast<int>(std::min<int64_t>(items, threads));
}

// Runs fn(item) for every item in [0, items) on up to `threads` OpenMP
// threads, as parallel_team decides from `item_cost` (the work of one item,
// in multiply-adds), handing out one item at a time (schedule(dynamic, 1):
// items of unequal cost still end together). Returns the team size used.
template <class Fn>
int parallel_items(int64_t items, int threads, int64_t item_cost, const Fn& fn) {
  if (items <= 0) return 0;
  const int team = parallel_team(items, threads, item_cost);
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
