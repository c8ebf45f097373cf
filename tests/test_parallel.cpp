// tests/test_parallel.cpp: parallel_items (src/core/parallel.hpp), the one
// parallel loop: its grain (a loop under kParallelGrain multiply-adds runs
// on the calling thread alone; issue 22, defect 8), its team, and its
// errors. The kernels' results at 1 and 2 threads are compared bit for bit
// in tests/test_flash.cpp, test_attention_backward.cpp and
// test_score_rule.cpp; FlashThreadsGrain below checks both sides of the grain.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/parallel.hpp"
#include "kernels/kernel.hpp"

namespace multihead::detail {
namespace {

// The team size each item saw (omp_get_num_threads() inside the loop) and
// the distinct threads that ran items.
struct Seen {
  int team = 0, max_team = 0;
  int distinct = 0;
};
Seen run_items(int64_t items, int threads, int64_t cost) {
  std::vector<int> team_of(static_cast<std::size_t>(items), 0);
  std::vector<std::atomic<int>> ran(64);
  Seen s;
  s.team = parallel_items(items, threads, cost, [&](int64_t it) {
    team_of[static_cast<std::size_t>(it)] = omp_get_num_threads();
    ran[static_cast<std::size_t>(omp_get_thread_num())].store(1);
  });
  for (int t : team_of) s.max_team = std::max(s.max_team, t);
  for (auto& r : ran) s.distinct += r.load();
  return s;
}

TEST(ParallelItems, TinyLoopWithTwoThreadsRunsOnOne_items4_costGrainOver64) {
  const Seen s = run_items(4, 2, kParallelGrain / 64);  // 4·grain/64 < grain
  EXPECT_EQ(s.team, 1);
  EXPECT_EQ(s.max_team, 1) << "omp_get_num_threads() inside an item of a loop under the grain";
}

TEST(ParallelItems, LoopAtTheGrainWithTwoThreadsGetsTwo_items4_costGrainOver4) {
  const Seen s = run_items(4, 2, kParallelGrain / 4);  // 4·grain/4 = grain
  EXPECT_EQ(s.team, 2);
  EXPECT_EQ(s.max_team, 2) << "omp_get_num_threads() inside an item of a loop at the grain";
}

TEST(ParallelItems, TeamNeverExceedsItemsOrRequest) {
  EXPECT_EQ(parallel_team(1, 8, kParallelGrain), 1);
  EXPECT_EQ(parallel_team(3, 8, kParallelGrain), 3);
  EXPECT_EQ(parallel_team(100, 2, kParallelGrain), 2);
  EXPECT_EQ(parallel_team(100, 0, kParallelGrain), 1);
  // items · cost overflowing int64 still counts as large.
  EXPECT_EQ(parallel_team(int64_t{1} << 40, 2, int64_t{1} << 40), 2);
}

TEST(ParallelItems, FirstErrorIsRethrownOnTheCaller_items64_threads2) {
  EXPECT_THROW(parallel_items(64, 2, kParallelGrain, [](int64_t it) {
                 if (it == 5) throw std::runtime_error("item 5");
               }),
               std::runtime_error);
}

// The flash forward below and above the grain, at 1 and 2 threads: the
// same bits either way. L = S = 8, D = 4 is 8·8·8 = 512 multiply-adds per
// slice; 2 slices are far under the grain. L = S = 256, D = Dv = 64 with 4
// slices is 4 tiles · rows·256·128 per slice, above it.
std::vector<float> flash_out(int64_t slices, int64_t L, int64_t D, int threads) {
  std::vector<float> q(static_cast<std::size_t>(slices * L * D)), out(q.size());
  for (std::size_t x = 0; x < q.size(); ++x) q[x] = static_cast<float>((x * 7919) % 257) / 257.0f - 0.5f;
  AttentionArgs<float> a;
  a.q = a.k = a.v = q.data();
  a.out = out.data();
  a.slices = slices;
  a.heads = 1;
  a.q_len = a.kv_len = L;
  a.head_dim = a.value_dim = D;
  a.scale = 0.125f;
  a.modifiers.causal.enabled = true;
  a.modifiers.causal.cols = L;
  a.num_threads = threads;
  attention_forward_flash(a);
  return out;
}

TEST(FlashThreadsGrain, SameBitsAtOneAndTwoThreadsBelowAndAboveTheGrain) {
  for (const auto& [slices, L, D] : {std::tuple<int64_t, int64_t, int64_t>{2, 8, 4}, {4, 256, 64}}) {
    const std::vector<float> one = flash_out(slices, L, D, 1), two = flash_out(slices, L, D, 2);
    EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0)
        << "slices=" << slices << " L=S=" << L << " D=" << D;
  }
}

}  // namespace
}  // namespace multihead::detail
