// src/train/tasks.cpp: the built-in tasks (multihead/train.hpp, make_task).
#include <string>

#include "multihead/error.hpp"
#include "multihead/lesson_tasks.hpp"
#include "multihead/train.hpp"
#include "train/seeds.hpp"

namespace multihead {
namespace {

// A random sequence of `symbols` ids and a target that is a fixed
// permutation of it: copy (identity) or reverse. Every position counts.
class PermutationTask : public Task {
 public:
  PermutationTask(std::string name, int64_t symbols, int64_t length, bool reverse)
      : name_(std::move(name)), symbols_(symbols), length_(length), reverse_(reverse) {}
  std::string name() const override { return name_; }
  int64_t vocabulary() const override { return symbols_; }
  int64_t sequence_length() const override { return length_; }
  Batch batch(uint64_t seed, int64_t step, int64_t batch_size) const override {
    Batch out;
    out.batch = batch_size;
    out.length = length_;
    const auto count = static_cast<std::size_t>(batch_size * length_);
    out.tokens.resize(count);
    out.targets.resize(count);
    out.mask.assign(count, 1);
    for (int64_t b = 0; b < batch_size; ++b) {
      for (int64_t l = 0; l < length_; ++l) {
        const uint64_t h = train::stream_value(seed, train::Stream::Data, static_cast<uint64_t>(step),
                                               static_cast<uint64_t>(b * length_ + l));
        // The top 32 bits scaled to [0, symbols) (Lemire's multiply-shift):
        // no modulo bias worth the name for symbols < 2^16.
        out.tokens[static_cast<std::size_t>(b * length_ + l)] =
            static_cast<int32_t>(((h >> 32) * static_cast<uint64_t>(symbols_)) >> 32);
      }
      for (int64_t l = 0; l < length_; ++l)
        out.targets[static_cast<std::size_t>(b * length_ + l)] =
            out.tokens[static_cast<std::size_t>(b * length_ + (reverse_ ? length_ - 1 - l : l))];
    }
    return out;
  }

 private:
  std::string name_;
  int64_t symbols_, length_;
  bool reverse_;
};

}  // namespace

std::vector<std::string> task_names() { return {"copy", "reverse", "lesson", "lookup2"}; }

std::unique_ptr<Task> make_task(const std::string& name, int64_t symbols, int64_t length) {
  if (symbols < 2 || symbols > 65536)
    throw Error(Error::Kind::Value, "task symbols: expected 2 to 65536, got " + std::to_string(symbols));
  if (length < 1 || length > 65536)
    throw Error(Error::Kind::Value, "task length: expected 1 to 65536, got " + std::to_string(length));
  if (name == "copy" || name == "reverse")
    return std::make_unique<PermutationTask>(name, symbols, length, name == "reverse");
  // These fix their own vocabulary and length (multihead/lesson_tasks.hpp).
  if (name == "lesson") return std::make_unique<LessonTask>();
  if (name == "lookup2") return std::make_unique<TwoLookupsTask>();
  throw Error(Error::Kind::Value, "task: expected one of copy, reverse, lesson, lookup2; got " + quote_input(name));
}

}  // namespace multihead
