// tests/test_fuzz_regressions.cpp: fuzz_forward's inputs replayed through the
// fuzzer's own harness (fuzz/forward_harness.hpp), in every build of the
// suite, the ASan + UBSan one included.
//  - tests/data/fuzz-regressions/forward-*: inputs that once crashed or hung
//    fuzz_forward. Each must run or be rejected with multihead::Error; not
//    std::bad_alloc, which from inputs this small means an allocation that
//    the input does not bound (the Release build sees those only this way:
//    ASan reports them itself).
//  - fuzz/corpus/forward/: the seed corpus (fuzz/make_forward_corpus.py).
//    valid_* seeds must run and meet forward's contract, near_* seeds must be
//    rejected, so the seeds keep reaching the code they were written for.
// (The npy-* and safetensors-* regressions are replayed by test_io.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "../fuzz/forward_harness.hpp"
#include "../fuzz/shape_arithmetic.hpp"

namespace multihead {
namespace {

namespace fs = std::filesystem;
using fuzz::Outcome;

const fs::path kDataDir = MULTIHEAD_TEST_DATA_DIR;
const fs::path kCorpusDir = kDataDir / ".." / ".." / "fuzz" / "corpus" / "forward";

std::string slurp(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

namespace fuzz {
// How GoogleTest prints an Outcome in a failed expectation.
void PrintTo(Outcome o, std::ostream* os) {
  switch (o) {
    case Outcome::Ran: *os << "ran"; return;
    case Outcome::Rejected: *os << "rejected with multihead::Error"; return;
    case Outcome::OutOfMemory: *os << "std::bad_alloc (an unbounded allocation)"; return;
    case Outcome::Skipped: *os << "skipped by the harness (too short or too costly)"; return;
  }
}
}  // namespace fuzz

namespace {

// Runs one input; a broken contract or an unexpected exception fails the
// test. `why` receives the error message (or why the input was skipped).
Outcome replay(const fs::path& path, std::string& why) {
  const std::string bytes = slurp(path);
  try {
    return fuzz::run_forward_input(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &why);
  } catch (const fuzz::HarnessFailure& e) {
    ADD_FAILURE() << path.filename() << ": contract broken: " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << path.filename() << ": unexpected exception: " << e.what();
  }
  return Outcome::Skipped;
}

std::vector<fs::path> files_with_prefix(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().rfind(prefix, 0) == 0) out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(FuzzRegressions, ForwardInputsRunOrFailCleanly) {
  for (const fs::path& path : files_with_prefix(kDataDir / "fuzz-regressions", "forward-")) {
    std::string why;
    const Outcome o = replay(path, why);
    EXPECT_TRUE(o == Outcome::Ran || o == Outcome::Rejected)
        << path.filename() << ": " << testing::PrintToString(o) << " " << why;
  }
}

TEST(FuzzForwardCorpus, ValidSeedsRunNearSeedsAreRejected) {
  const std::vector<fs::path> valid = files_with_prefix(kCorpusDir, "valid_");
  const std::vector<fs::path> near = files_with_prefix(kCorpusDir, "near_");
  ASSERT_FALSE(valid.empty()) << "no valid_* seeds in " << kCorpusDir;
  ASSERT_FALSE(near.empty()) << "no near_* seeds in " << kCorpusDir;
  for (const fs::path& path : valid) {
    std::string why;
    const Outcome o = replay(path, why);
    EXPECT_EQ(o, Outcome::Ran) << path.filename() << ": " << why;
  }
  for (const fs::path& path : near) {
    std::string why;
    const Outcome o = replay(path, why);
    EXPECT_EQ(o, Outcome::Rejected) << path.filename() << ": " << why;
  }
}

// The mutator's dimension arithmetic at the extremes a parsed file may
// legally claim (a 15-minute fuzz_forward run once stopped on
// INT64_MAX + 1 in the mutator itself).
TEST(FuzzShapeArithmetic, NudgeDimSaturatesAtZeroAndInt64Max) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  struct Case { int64_t d; bool up; int64_t expected; };
  const Case cases[] = {{0, false, 0}, {0, true, 1}, {5, false, 4}, {5, true, 6},
                        {kMax, true, kMax}, {kMax, false, kMax - 1}};
  for (const Case& c : cases)
    EXPECT_EQ(fuzz::nudge_dim(c.d, c.up), c.expected) << "d=" << c.d << " up=" << c.up;
}

TEST(FuzzShapeArithmetic, SmallEnoughRefusesOverflowingAndLargeShapes) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE(fuzz::small_enough({kMax, 0}, 4096));     // no bytes
  EXPECT_FALSE(fuzz::small_enough({kMax, 1}, 4096));    // a nudged 0
  EXPECT_FALSE(fuzz::small_enough({kMax, 2}, 4096));    // product overflows
  EXPECT_FALSE(fuzz::small_enough({1 << 20, 1 << 20, 1 << 20}, 4096));
  EXPECT_TRUE(fuzz::small_enough({64, 64}, 4096));
  EXPECT_FALSE(fuzz::small_enough({64, 65}, 4096));
  EXPECT_TRUE(fuzz::small_enough({}, 1));               // a scalar
}

}  // namespace
}  // namespace multihead
