// src/train/tasks_lookup.cpp: Task B, two lookups at once
// (multihead/lesson_tasks.hpp: TwoLookupsTask).
//
// Token ids: 0 <pad>; 1 + 8·key + value the facts F(key, value); then 8
// noise tokens; then the 12 queries Q(a, b), a != b; then the 64 answers
// A(v_a, v_b) = 8·v_a + v_b.
//   position:  0 … 14                                   15
//   tokens:    the 4 keys' facts, 11 noise           Q(a, b)   -> answer A(v_a, v_b)
// Each fact decides half the answer, so one lookup done right already
// lowers the loss (an answer such as (v_a − v_b) mod 8 gives no signal
// until both are right, and did not train in our budget).
#include <array>
#include <string>

#include "multihead/error.hpp"
#include "multihead/lesson_tasks.hpp"
#include "train/seeds.hpp"

namespace multihead {
namespace {

constexpr int32_t kFirstFact = 1;
constexpr int32_t kFirstNoise = kFirstFact + TwoLookupsTask::kKeys * TwoLookupsTask::kValues;
constexpr int32_t kFirstQuery = kFirstNoise + TwoLookupsTask::kNoise;
constexpr int32_t kFirstAnswer = kFirstQuery + TwoLookupsTask::kKeys * (TwoLookupsTask::kKeys - 1);
constexpr int32_t kVocabulary = kFirstAnswer + TwoLookupsTask::kValues * TwoLookupsTask::kValues;
constexpr int64_t kQueryAt = TwoLookupsTask::kLength - 1;
constexpr uint64_t kTestSeed = 0x100c'0b2ull;
constexpr int64_t kTestSize = 512;

int uniform(uint64_t bits, int n) {
  return static_cast<int>(((bits >> 32) * static_cast<uint64_t>(n)) >> 32);
}

// One sequence from a stream of random words (draws(k) the k-th).
template <class Draw>
std::array<int32_t, TwoLookupsTask::kLength> draw_sequence(Draw&& draws) {
  using T = TwoLookupsTask;
  uint64_t k = 0;
  // 4 distinct keys and 4 distinct positions in [0, 15): partial Fisher–Yates.
  std::array<int, T::kKeys> keys{};
  for (int i = 0; i < T::kKeys; ++i) keys[i] = i;
  std::array<int, T::kLength - 1> slots{};
  for (int i = 0; i < T::kLength - 1; ++i) slots[i] = i;
  for (int i = 0; i < T::kFacts; ++i) {
    std::swap(keys[i], keys[i + uniform(draws(k++), T::kKeys - i)]);
    std::swap(slots[i], slots[i + uniform(draws(k++), T::kLength - 1 - i)]);
  }
  std::array<int32_t, T::kLength> seq{};
  for (int i = 0; i < T::kLength - 1; ++i) seq[i] = T::noise(uniform(draws(k++), T::kNoise));
  for (int i = 0; i < T::kFacts; ++i) seq[slots[i]] = T::fact(keys[i], uniform(draws(k++), T::kValues));
  // Two of the four facts, in order.
  const int a = uniform(draws(k++), T::kFacts);
  int b = uniform(draws(k++), T::kFacts - 1);
  if (b >= a) ++b;
  seq[kQueryAt] = T::query(keys[a], keys[b]);
  return seq;
}

Batch encode(const std::vector<std::array<int32_t, TwoLookupsTask::kLength>>& rows) {
  Batch out;
  out.batch = static_cast<int64_t>(rows.size());
  out.length = TwoLookupsTask::kLength;
  out.tokens.reserve(rows.size() * TwoLookupsTask::kLength);
  out.targets.assign(rows.size() * TwoLookupsTask::kLength, TwoLookupsTask::kPad);
  out.mask.assign(rows.size() * TwoLookupsTask::kLength, 0);
  for (std::size_t b = 0; b < rows.size(); ++b) {
    out.tokens.insert(out.tokens.end(), rows[b].begin(), rows[b].end());
    const std::size_t at = b * TwoLookupsTask::kLength + kQueryAt;
    out.targets[at] = TwoLookupsTask::answer(TwoLookupsTask::answer_of(rows[b].data()));
    out.mask[at] = 1;
  }
  return out;
}

}  // namespace

int64_t TwoLookupsTask::vocabulary() const { return kVocabulary; }
int32_t TwoLookupsTask::fact(int key, int value) { return kFirstFact + key * kValues + value; }
int32_t TwoLookupsTask::noise(int i) { return kFirstNoise + i; }
int32_t TwoLookupsTask::query(int a, int b) { return kFirstQuery + a * (kKeys - 1) + (b < a ? b : b - 1); }
int32_t TwoLookupsTask::answer(int r) { return kFirstAnswer + r; }

std::string TwoLookupsTask::token(int32_t id) const {
  if (id == kPad) return "<pad>";
  if (id >= kFirstFact && id < kFirstNoise)
    return std::string(1, char('a' + (id - kFirstFact) / kValues)) + "=" + std::to_string((id - kFirstFact) % kValues);
  if (id >= kFirstNoise && id < kFirstQuery) return "~" + std::to_string(id - kFirstNoise);
  if (id >= kFirstQuery && id < kFirstAnswer) {
    const int a = (id - kFirstQuery) / (kKeys - 1), r = (id - kFirstQuery) % (kKeys - 1);
    const int b = r < a ? r : r + 1;
    return std::string("?") + char('a' + a) + "-" + char('a' + b);
  }
  if (id >= kFirstAnswer && id < kVocabulary)
    return "=" + std::to_string((id - kFirstAnswer) / kValues) + std::to_string((id - kFirstAnswer) % kValues);
  throw Error(Error::Kind::Value, "lookup2 token: expected an id in [0, " + std::to_string(kVocabulary) +
                                      "), got " + std::to_string(id));
}

int TwoLookupsTask::answer_of(const int32_t* tokens) {
  const int32_t q = tokens[kQueryAt];
  if (q < kFirstQuery || q >= kFirstAnswer) return -1;
  const int a = (q - kFirstQuery) / (kKeys - 1), r = (q - kFirstQuery) % (kKeys - 1);
  const int b = r < a ? r : r + 1;
  int va = -1, vb = -1;
  for (int64_t l = 0; l < kQueryAt; ++l) {
    const int32_t t = tokens[l];
    if (t < kFirstFact || t >= kFirstNoise) continue;
    const int key = (t - kFirstFact) / kValues, value = (t - kFirstFact) % kValues;
    if (key == a) va = value;
    if (key == b) vb = value;
  }
  if (va < 0 || vb < 0) return -1;
  return va * kValues + vb;
}

bool TwoLookupsTask::held_out(const int32_t* tokens) {
  uint64_t h = 0x9e37'79b9'7f4a'7c15ull;
  for (int64_t l = 0; l < kLength; ++l) h = detail::mix64(h ^ static_cast<uint64_t>(tokens[l]));
  return (h >> 61) == 0;  // the top 3 bits: 1 in 8
}

Batch TwoLookupsTask::batch(uint64_t seed, int64_t step, int64_t batch_size) const {
  std::vector<std::array<int32_t, kLength>> rows;
  rows.reserve(static_cast<std::size_t>(batch_size));
  for (int64_t b = 0; b < batch_size; ++b)
    // Attempt r of row b; a held-out sequence is drawn again.
    for (uint64_t r = 0;; ++r) {
      const auto seq = draw_sequence([&](uint64_t k) {
        return train::stream_value(seed, train::Stream::Data, static_cast<uint64_t>(step),
                                   (static_cast<uint64_t>(b) << 24) | (r << 6) | k);
      });
      if (!held_out(seq.data())) {
        rows.push_back(seq);
        break;
      }
    }
  return encode(rows);
}

Batch TwoLookupsTask::test_set() const {
  std::vector<std::array<int32_t, kLength>> rows;
  for (uint64_t item = 0; static_cast<int64_t>(rows.size()) < kTestSize; ++item) {
    const auto seq = draw_sequence([&](uint64_t k) { return train::stream_value(kTestSeed, train::Stream::Data, item, k); });
    if (held_out(seq.data())) rows.push_back(seq);
  }
  return encode(rows);
}

}  // namespace multihead
