// tests/test_lesson_tasks.cpp: the experiment's task generators
// (multihead/lesson_tasks.hpp) and its statistics (src/train/statistics.hpp).
//  - the templates, labels and referent rule against hand-written sentences,
//    the lesson's own among them;
//  - held-out combinations never appear in 19,200 training sentences (3
//    seeds × 200 steps × 32), and the test set holds nothing else;
//  - Welch's t-test and the t distribution against values computed apart
//    (a closed form, and Simpson's rule on the t density in Python).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "multihead/error.hpp"
#include "multihead/lesson_tasks.hpp"
#include "train/statistics.hpp"

namespace multihead {
namespace {

int index_of(const std::vector<std::string>& list, const std::string& word) {
  const auto it = std::find(list.begin(), list.end(), word);
  EXPECT_NE(it, list.end()) << "'" << word << "' is not in the list";
  return static_cast<int>(it - list.begin());
}

// One hand-written row: the words that fill the slots, the sentence they
// must make, and what the rule must say about it.
struct Row {
  int templ;
  std::string subject, verb, object, adjective, distractor;
  std::string text;
  std::string referent;
  bool held_out;
};

LessonChoice choice_of(const Row& r) {
  LessonChoice c;
  c.templ = r.templ;
  c.subject = index_of(LessonTask::subjects(), r.subject);
  c.verb = index_of(LessonTask::verbs(), r.verb);
  c.object = index_of(LessonTask::objects(), r.object);
  const auto& sa = LessonTask::subject_adjectives();
  c.subject_adjective = std::find(sa.begin(), sa.end(), r.adjective) != sa.end();
  c.adjective = index_of(c.subject_adjective ? sa : LessonTask::object_adjectives(), r.adjective);
  c.distractor = r.distractor.empty() ? (c.subject + 1) % 16 : index_of(LessonTask::subjects(), r.distractor);
  return c;
}

// Written by hand from the templates' wording, not from the generator.
const std::vector<Row> kRows = {
    {0, "animal", "cross", "street", "tired", "", "the animal didn't cross the street because it was too tired",
     "animal", true},
    {0, "animal", "cross", "street", "wide", "", "the animal didn't cross the street because it was too wide",
     "street", true},
    {1, "dog", "climb", "hill", "scared", "", "yesterday the dog didn't climb the hill because it was too scared",
     "dog", false},
    {2, "cat", "carry", "box", "heavy", "horse",
     "the cat that the horse saw didn't carry the box because it was too heavy", "box", false},
    {2, "cat", "carry", "box", "weak", "horse",
     "the cat that the horse saw didn't carry the box because it was too weak", "cat", true},
    {3, "fox", "enter", "river", "deep", "", "because it was too deep , the fox didn't enter the river", "river",
     false},
    {3, "fox", "enter", "river", "nervous", "", "because it was too nervous , the fox didn't enter the river", "fox",
     false},
    {4, "cow", "pass", "bridge", "tired", "dog",
     "yesterday the cow that the dog saw didn't pass the bridge because it was too tired", "cow", true},
    {5, "goat", "reach", "wall", "high", "", "the goat didn't want to reach the wall because it was too high",
     "wall", true},
    {6, "bird", "cross", "road", "lazy", "wolf",
     "because it was too lazy , the bird that the wolf saw didn't cross the road", "bird", false},
    {6, "bird", "cross", "road", "busy", "wolf",
     "because it was too busy , the bird that the wolf saw didn't cross the road", "road", false},
};

TEST(LessonTask, HandWrittenSentencesTemplatesLabelsAndReferentRule) {
  const LessonTask task;
  std::vector<LessonSentence> sentences;
  for (const Row& r : kRows) {
    SCOPED_TRACE(r.text);
    const LessonChoice c = choice_of(r);
    const LessonSentence s = task.sentence(c);
    EXPECT_EQ(s.text(), r.text);
    ASSERT_GE(s.it, 0);
    EXPECT_EQ(s.words[static_cast<std::size_t>(s.it)], "it");
    EXPECT_EQ(s.words[static_cast<std::size_t>(s.adjective)], r.adjective);
    EXPECT_EQ(s.words[static_cast<std::size_t>(s.subject)], r.subject);
    EXPECT_EQ(s.words[static_cast<std::size_t>(s.object)], r.object);
    EXPECT_EQ(s.words[static_cast<std::size_t>(s.referent())], r.referent);
    if (!r.distractor.empty()) {
      EXPECT_EQ(s.words[static_cast<std::size_t>(s.distractor)], r.distractor);
    } else {
      EXPECT_EQ(s.distractor, -1);
    }
    EXPECT_EQ(LessonTask::held_out(c), r.held_out);
    sentences.push_back(s);
  }
  // The encoded batch: the words' ids then padding, one counted position
  // ("it") per row, its target the referent's id.
  const Batch b = task.encode(sentences);
  ASSERT_EQ(b.batch, static_cast<int64_t>(kRows.size()));
  ASSERT_EQ(b.length, LessonTask::kLength);
  for (std::size_t i = 0; i < kRows.size(); ++i) {
    SCOPED_TRACE(kRows[i].text);
    const std::size_t row = i * LessonTask::kLength;
    int counted = 0;
    std::string decoded;
    for (int64_t l = 0; l < LessonTask::kLength; ++l) {
      const int32_t t = b.tokens[row + static_cast<std::size_t>(l)];
      if (t != LessonTask::kPad) decoded += (decoded.empty() ? "" : " ") + task.token(t);
      if (l >= static_cast<int64_t>(sentences[i].words.size())) {
        EXPECT_EQ(t, LessonTask::kPad) << "position " << l;
      }
      if (b.mask[row + static_cast<std::size_t>(l)]) {
        ++counted;
        EXPECT_EQ(task.token(t), "it");
        EXPECT_EQ(task.token(b.targets[row + static_cast<std::size_t>(l)]), kRows[i].referent);
      }
    }
    EXPECT_EQ(decoded, kRows[i].text);
    EXPECT_EQ(counted, 1);
  }
}

TEST(LessonTask, TestSetStartsWithTheLessonsSentenceAndHoldsOnlyHeldOutPairs) {
  const LessonTask task;
  const std::vector<LessonSentence> test = task.test_sentences();
  ASSERT_EQ(test.size(), 513u);  // the lesson's + 8 for each of 64 held-out pairs
  EXPECT_EQ(test[0].text(), "the animal didn't cross the street because it was too tired");
  EXPECT_EQ(test[0].words[static_cast<std::size_t>(test[0].referent())], "animal");
  std::set<std::pair<std::string, std::string>> pairs;
  for (const LessonSentence& s : test) {
    const std::string referent = s.words[static_cast<std::size_t>(s.referent())];
    const std::string adjective = s.words[static_cast<std::size_t>(s.adjective)];
    const int n = index_of(s.refers_to_subject ? LessonTask::subjects() : LessonTask::objects(), referent);
    const int a = index_of(s.refers_to_subject ? LessonTask::subject_adjectives() : LessonTask::object_adjectives(),
                           adjective);
    EXPECT_TRUE(LessonTask::held_out_pair(n, a)) << s.text();
    EXPECT_NE(s.distractor >= 0 ? s.words[static_cast<std::size_t>(s.distractor)] : "", s.words[static_cast<std::size_t>(s.subject)]);
    pairs.insert({referent, adjective});
  }
  EXPECT_EQ(pairs.size(), 64u);  // every held-out pair is tested
  // Same set every time (it depends on no run's seed).
  EXPECT_EQ(task.test_set().tokens, task.test_set().tokens);
}

TEST(LessonTask, HeldOutPairsNeverAppearInTrainingSeeds0_1_7Steps200Batch32) {
  const LessonTask task;
  const std::vector<int32_t> lesson = task.ids(task.test_sentences()[0].words);
  std::set<std::pair<std::string, std::string>> seen;
  int64_t subject_rows = 0, rows = 0;
  for (uint64_t seed : {0ull, 1ull, 7ull})
    for (int64_t step = 0; step < 200; ++step) {
      const Batch b = task.batch(seed, step, 32);
      for (int64_t r = 0; r < b.batch; ++r) {
        const int32_t* t = b.tokens.data() + r * b.length;
        std::vector<std::string> w;
        int64_t it = -1;
        for (int64_t l = 0; l < b.length; ++l) {
          if (t[l] != LessonTask::kPad) w.push_back(task.token(t[l]));
          if (b.mask[static_cast<std::size_t>(r * b.length + l)]) it = l;
        }
        ASSERT_GE(it, 0);
        const std::string referent = task.token(b.targets[static_cast<std::size_t>(r * b.length + it)]);
        // The adjective follows "too".
        const auto too = std::find(w.begin(), w.end(), "too");
        ASSERT_NE(too, w.end());
        const std::string adjective = *(too + 1);
        const auto& sa = LessonTask::subject_adjectives();
        const bool subject_role = std::find(sa.begin(), sa.end(), adjective) != sa.end();
        const int n = index_of(subject_role ? LessonTask::subjects() : LessonTask::objects(), referent);
        const int a = index_of(subject_role ? sa : LessonTask::object_adjectives(), adjective);
        ASSERT_FALSE(LessonTask::held_out_pair(n, a))
            << "seed " << seed << " step " << step << " row " << r << ": held-out pair (" << referent << ", "
            << adjective << ")";
        ASSERT_FALSE(std::equal(lesson.begin(), lesson.end(), t) && t[lesson.size()] == LessonTask::kPad)
            << "the lesson's sentence is in a training batch";
        seen.insert({referent, adjective});
        subject_rows += subject_role;
        ++rows;
      }
    }
  // Every training pair shows up (192 of the 256), and the two roles are
  // balanced: 9,600 of 19,200 expected, binomial sd ~69, bound 5 sd.
  EXPECT_EQ(seen.size(), 192u);
  EXPECT_NEAR(double(subject_rows), double(rows) / 2, 350.0);
}

TEST(LessonTask, BatchIsAPureFunctionOfSeedAndStep) {
  const LessonTask task;
  EXPECT_EQ(task.batch(3, 5, 16).tokens, task.batch(3, 5, 16).tokens);
  EXPECT_NE(task.batch(3, 5, 16).tokens, task.batch(3, 6, 16).tokens);
  EXPECT_NE(task.batch(3, 5, 16).tokens, task.batch(4, 5, 16).tokens);
}

TEST(LessonTask, RefusesChoicesOutOfRangeNamingTheField) {
  const LessonTask task;
  LessonChoice c;
  c.verb = 12;
  try {
    task.sentence(c);
    FAIL() << "verb 12 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("verb: expected an index in [0, 12), got 12"), std::string::npos) << e.what();
  }
  c = LessonChoice{};
  c.templ = 2;
  c.distractor = c.subject;
  EXPECT_THROW(task.sentence(c), Error);
  EXPECT_THROW(task.ids({"the", "unicorn"}), Error);
}

// ---- Task B ----------------------------------------------------------------------
TEST(TwoLookupsTask, HandWrittenSequencesAnswerIsTheOrderedPairOfValues) {
  using T = TwoLookupsTask;
  struct Case {
    std::vector<std::pair<int, int>> facts;  // (position, fact) pairs as (key, value)
    int a, b, answer;
  };
  // keys 0..3 with values, at positions 0, 5, 9, 14; query (a, b).
  const std::vector<Case> cases = {
      {{{0, 0}, {1, 7}, {2, 3}, {3, 5}}, 1, 2, 7 * 8 + 3},
      {{{0, 0}, {1, 7}, {2, 3}, {3, 5}}, 2, 1, 3 * 8 + 7},
      {{{0, 6}, {1, 6}, {2, 1}, {3, 0}}, 0, 3, 6 * 8 + 0},
      {{{0, 2}, {1, 4}, {2, 4}, {3, 2}}, 3, 0, 2 * 8 + 2},
  };
  const int positions[4] = {0, 5, 9, 14};
  for (const Case& c : cases) {
    std::vector<int32_t> seq(T::kLength, T::noise(3));
    for (int i = 0; i < 4; ++i) seq[positions[i]] = T::fact(c.facts[i].first, c.facts[i].second);
    seq[T::kLength - 1] = T::query(c.a, c.b);
    EXPECT_EQ(T::answer_of(seq.data()), c.answer) << "query " << c.a << "," << c.b;
  }
  const TwoLookupsTask task;
  EXPECT_EQ(task.token(T::fact(1, 7)), "b=7");
  EXPECT_EQ(task.token(T::query(2, 1)), "?c-b");
  EXPECT_EQ(task.token(T::answer(3 * 8 + 7)), "=37");
  // Every id has a distinct name (the id layout has no overlap).
  std::set<std::string> names;
  for (int32_t id = 0; id < task.vocabulary(); ++id) names.insert(task.token(id));
  EXPECT_EQ(static_cast<int64_t>(names.size()), task.vocabulary());
}

TEST(TwoLookupsTask, HeldOutSequencesNeverInTrainingSeeds0_1Steps300Batch32AndTargetsFollowTheRule) {
  const TwoLookupsTask task;
  int64_t rows = 0;
  for (uint64_t seed : {0ull, 1ull})
    for (int64_t step = 0; step < 300; ++step) {
      const Batch b = task.batch(seed, step, 32);
      for (int64_t r = 0; r < b.batch; ++r, ++rows) {
        const int32_t* t = b.tokens.data() + r * b.length;
        ASSERT_FALSE(TwoLookupsTask::held_out(t)) << "seed " << seed << " step " << step << " row " << r;
        const int answer = TwoLookupsTask::answer_of(t);
        ASSERT_GE(answer, 0);
        for (int64_t l = 0; l < b.length; ++l) {
          const std::size_t at = static_cast<std::size_t>(r * b.length + l);
          ASSERT_EQ(b.mask[at], l == b.length - 1 ? 1 : 0);
          if (b.mask[at]) {
            ASSERT_EQ(b.targets[at], TwoLookupsTask::answer(answer));
          }
        }
      }
    }
  const Batch test = task.test_set();
  EXPECT_EQ(test.batch, 512);
  for (int64_t r = 0; r < test.batch; ++r) EXPECT_TRUE(TwoLookupsTask::held_out(test.tokens.data() + r * test.length));
  EXPECT_EQ(rows, 19200);
}

// ---- statistics ------------------------------------------------------------------
// I_x(a, b) closed forms: I_x(1, 1) = x; I_x(2, 3) = Σ_{j=2}^{4} C(4, j) x^j (1−x)^(4−j),
// 11/16 at x = 1/2. Bound 1e-13: the continued fraction stops at 1e-16
// relative per term, lgamma is accurate to a few ulps.
TEST(Statistics, RegularizedIncompleteBetaMatchesClosedForms) {
  for (double x : {0.0, 0.1, 0.37, 0.5, 0.9, 1.0}) EXPECT_NEAR(train::regularized_incomplete_beta(1, 1, x), x, 1e-13);
  EXPECT_NEAR(train::regularized_incomplete_beta(2, 3, 0.5), 11.0 / 16.0, 1e-13);
  for (double x : {0.05, 0.3, 0.8}) {
    const double closed = 6 * x * x * (1 - x) * (1 - x) + 4 * x * x * x * (1 - x) + x * x * x * x;
    EXPECT_NEAR(train::regularized_incomplete_beta(2, 3, x), closed, 1e-13) << "x " << x;
  }
  EXPECT_THROW(train::regularized_incomplete_beta(0, 1, 0.5), Error);
}

// Two-sided p-values of Student's t: t = 1, ν = 1 is the Cauchy
// distribution, p = 1 − 2·atan(1)/π = 0.5 exactly; the others are
// Simpson's rule (200,000 intervals) on the t density in Python, good to
// ~1e-12. Bound 1e-9.
TEST(Statistics, StudentTTwoSidedPMatchesIndependentValues) {
  EXPECT_NEAR(train::student_t_two_sided_p(1.0, 1.0), 0.5, 1e-12);
  EXPECT_NEAR(train::student_t_two_sided_p(2.0, 10.0), 0.07338803477074052, 1e-9);
  EXPECT_NEAR(train::student_t_two_sided_p(-2.0, 10.0), 0.07338803477074052, 1e-9);
  EXPECT_NEAR(train::student_t_two_sided_p(3.5, 4.3), 0.022127097432049436, 1e-9);
  EXPECT_NEAR(train::student_t_two_sided_p(0.5, 2.7), 0.6549470619957616, 1e-9);
  EXPECT_NEAR(train::student_t_two_sided_p(8.33, 1.2), 0.052278564882333955, 1e-9);
  EXPECT_EQ(train::student_t_two_sided_p(0.0, 3.0), 1.0);
}

// Welch on two samples of five accuracies; t, df and p recomputed in
// Python (numpy var(ddof=1), the Welch–Satterthwaite df, Simpson's rule).
TEST(Statistics, WelchTTestMatchesAnIndependentComputation) {
  const std::vector<double> a = {0.92, 0.95, 0.90, 0.97, 0.93}, b = {0.70, 0.75, 0.60, 0.81, 0.66};
  const train::WelchResult w = train::welch_t_test(a, b);
  EXPECT_NEAR(w.t, 6.035934632436995, 1e-12);
  EXPECT_NEAR(w.df, 4.883294961295968, 1e-12);
  EXPECT_NEAR(w.p, 0.0019509565741969714, 1e-9);
  const train::WelchResult swapped = train::welch_t_test(b, a);
  EXPECT_DOUBLE_EQ(swapped.t, -w.t);
  EXPECT_DOUBLE_EQ(swapped.p, w.p);
  // Constant samples: p = 0 when the means differ, 1 when they do not.
  EXPECT_EQ(train::welch_t_test({1, 1, 1}, {0.5, 0.5}).p, 0.0);
  EXPECT_EQ(train::welch_t_test({1, 1, 1}, {1, 1}).p, 1.0);
  EXPECT_THROW(train::welch_t_test({1}, {1, 2}), Error);
}

}  // namespace
}  // namespace multihead
