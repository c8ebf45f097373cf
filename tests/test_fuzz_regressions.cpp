// tests/test_fuzz_regressions.cpp: fuzz_forward's inputs replayed through the
// fuzzer's own harness (fuzz/forward_harness.hpp), in every build of the
// suite, the ASan + UBSan one included.
//  - tests/data/fuzz-regressions/forward-*: inputs that once crashed or hung
//    fuzz_forward. Each must run or be rejected with multihead::Error.
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
#include <ostream>
#include <string>
#include <vector>

#include "../fuzz/forward_harness.hpp"

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
    case Outcome::Skipped: *os << "skipped by the harness (too short or too costly)"; return;
  }
}
}  // namespace fuzz

namespace {

// Runs one input; a broken contract or an unexpected exception fails the test.
Outcome replay(const fs::path& path) {
  const std::string bytes = slurp(path);
  try {
    return fuzz::run_forward_input(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
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
    SCOPED_TRACE(path.filename().string());
    replay(path);
  }
}

TEST(FuzzForwardCorpus, ValidSeedsRunNearSeedsAreRejected) {
  const std::vector<fs::path> valid = files_with_prefix(kCorpusDir, "valid_");
  const std::vector<fs::path> near = files_with_prefix(kCorpusDir, "near_");
  ASSERT_FALSE(valid.empty()) << "no valid_* seeds in " << kCorpusDir;
  ASSERT_FALSE(near.empty()) << "no near_* seeds in " << kCorpusDir;
  for (const fs::path& path : valid) {
    const Outcome o = replay(path);
    EXPECT_EQ(o, Outcome::Ran) << path.filename();
  }
  for (const fs::path& path : near) {
    const Outcome o = replay(path);
    EXPECT_EQ(o, Outcome::Rejected) << path.filename();
  }
}

}  // namespace
}  // namespace multihead
