// src/train/tasks_reverse.cpp: the held-out reverse task
// (multihead/lesson_tasks.hpp, HeldOutReverseTask).
#include "multihead/lesson_tasks.hpp"
#include "train/seeds.hpp"

namespace multihead {
namespace {

constexpr int64_t L = HeldOutReverseTask::kLength;

// One sequence: attempt `attempt` of row b of (seed, step), tokens by the
// top 32 bits scaled to [0, kSymbols) (Lemire's multiply-shift).
void draw(uint64_t seed, int64_t step, int64_t b, uint64_t attempt, int32_t* out) {
  for (int64_t l = 0; l < L; ++l) {
    const uint64_t h = train::stream_value(seed ^ (attempt * 0x9E3779B97F4A7C15ULL), train::Stream::Data,
                                           static_cast<uint64_t>(step), static_cast<uint64_t>(b * L + l));
    out[l] = static_cast<int32_t>(((h >> 32) * static_cast<uint64_t>(HeldOutReverseTask::kSymbols)) >> 32);
  }
}

Batch rows(const std::vector<std::vector<int32_t>>& seqs) {
  Batch out;
  out.batch = static_cast<int64_t>(seqs.size());
  out.length = L;
  for (const auto& s : seqs) {
    out.tokens.insert(out.tokens.end(), s.begin(), s.end());
    for (int64_t l = 0; l < L; ++l) out.targets.push_back(s[static_cast<std::size_t>(L - 1 - l)]);
  }
  out.mask.assign(out.tokens.size(), 1);
  return out;
}

}  // namespace

bool HeldOutReverseTask::held_out(const int32_t* tokens) {
  uint64_t h = 0x7265766572736531ULL;  // "reverse1"
  for (int64_t l = 0; l < L; ++l) h = detail::mix64(h ^ static_cast<uint64_t>(tokens[l] + 1));
  return h % 8 == 0;
}

Batch HeldOutReverseTask::batch(uint64_t seed, int64_t step, int64_t batch_size) const {
  std::vector<std::vector<int32_t>> seqs(static_cast<std::size_t>(batch_size), std::vector<int32_t>(L));
  for (int64_t b = 0; b < batch_size; ++b)
    for (uint64_t attempt = 0;; ++attempt) {
      draw(seed, step, b, attempt, seqs[static_cast<std::size_t>(b)].data());
      if (!held_out(seqs[static_cast<std::size_t>(b)].data())) break;
    }
  return rows(seqs);
}

Batch HeldOutReverseTask::test_set() const {
  // From a stream no run's seed reaches through batch(): seed ~0, step −1.
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int32_t> s(L);
  for (uint64_t k = 0; seqs.size() < 512; ++k) {
    draw(~0ULL, -1, static_cast<int64_t>(k), 0, s.data());
    if (held_out(s.data())) seqs.push_back(s);
  }
  return rows(seqs);
}

}  // namespace multihead
