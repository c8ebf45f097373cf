// tests/test_head_roles.cpp: the head measures and the role rule of
// multihead/experiment.hpp on hand-made attention over real lesson
// sentences (a subject head is never called a referent head), the
// role rule's table, and the paired statistics of src/train/statistics.hpp
// against values scipy 1.10 computed apart (the values are in the tests).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "multihead/experiment.hpp"
#include "multihead/lesson_tasks.hpp"
#include "train/statistics.hpp"

namespace multihead {
namespace {

// Six test sentences, half with the subject as the referent.
std::vector<LessonSentence> table_sentences() {
  const LessonTask task;
  std::vector<LessonSentence> out;
  for (int k = 0; k < 6; ++k) {
    LessonChoice c;
    c.templ = k % 3;
    c.subject = k;
    c.verb = k % 4;
    c.object = (k + 2) % 8;
    c.subject_adjective = k % 2 == 0;
    c.adjective = k;
    c.distractor = k + 1;
    out.push_back(task.sentence(c));
  }
  return out;
}

// Hand-made weights: head 0 looks from "it" at the subject, head 1 at the
// referent, head 2 at the object, head 3 at every word alike, head 4 at the
// adjective (each with `mass`, the rest spread over the sentence's words).
std::vector<Tensor<float>> table_attention(const std::vector<LessonSentence>& s, float mass) {
  const int64_t B = static_cast<int64_t>(s.size()), H = 5, L = LessonTask::kLength;
  Tensor<float> w({B, H, L, L}, 0.0f);
  for (int64_t b = 0; b < B; ++b) {
    const LessonSentence& x = s[static_cast<std::size_t>(b)];
    const int64_t n = static_cast<int64_t>(x.words.size());
    const int64_t target[H] = {x.subject, x.referent(), x.object, -1, x.adjective};
    for (int64_t h = 0; h < H; ++h) {
      float* row = w.data() + ((b * H + h) * L + x.it) * L;
      for (int64_t j = 0; j < n; ++j) row[j] = target[h] < 0 ? 1.0f / float(n) : (1 - mass) / float(n);
      if (target[h] >= 0) row[target[h]] += mass;
    }
  }
  return {w};
}

TEST(HeadRoles, HandMadeHeadsGetTheirRolesAndASubjectHeadIsNeverAReferentHead) {
  const std::vector<LessonSentence> s = table_sentences();
  ASSERT_EQ(std::count_if(s.begin(), s.end(), [](const LessonSentence& x) { return x.refers_to_subject; }), 3);
  for (float mass : {0.15f, 0.3f, 0.6f, 0.99f}) {
    const std::vector<HeadFocus> f = head_focus(table_attention(s, mass), s);
    ASSERT_EQ(f.size(), 5u);
    SCOPED_TRACE("mass " + std::to_string(mass));
    // The subject head: +mass where the subject is meant, −mass elsewhere.
    EXPECT_NEAR(f[0].on_subject, mass, 1e-6);
    EXPECT_NEAR(f[0].on_object, -mass, 1e-6);
    EXPECT_EQ(head_role(f[0]), HeadRole::Subject);
    EXPECT_EQ(head_role(f[1]), HeadRole::Referent);
    EXPECT_NEAR(f[1].referent_score(), mass, 1e-6);
    EXPECT_EQ(head_role(f[2]), HeadRole::Object);
    EXPECT_EQ(head_role(f[3]), HeadRole::None);
    EXPECT_FALSE(is_adjective_head(f[3]));
    EXPECT_TRUE(is_adjective_head(f[4]));
    const HeadRoles r = head_roles(f);
    EXPECT_EQ(r.referent_head, 1);
    EXPECT_EQ(r.subject_head, 0);
    EXPECT_EQ(r.object_head, 2);
    EXPECT_EQ(r.adjective_head, 4);
    EXPECT_EQ(r.referent_heads, 1);
  }
  // Without the referent head, no head is the referent head, however
  // strongly the subject head attends (the old measure picked it).
  std::vector<HeadFocus> f = head_focus(table_attention(s, 0.99f), s);
  f.erase(f.begin() + 1);
  const HeadRoles r = head_roles(f);
  EXPECT_EQ(r.referent_layer, -1);
  EXPECT_EQ(r.referent_head, -1);
  EXPECT_EQ(head_name(r.referent_layer, r.referent_head), "none");
  EXPECT_EQ(head_name(r.subject_layer, r.subject_head), "1.1");
}

// The rule's table: (on_subject, on_object) → role, kRoleThreshold 0.1.
TEST(HeadRoles, RuleTable) {
  struct Row {
    double on_subject, on_object;
    HeadRole role;
  };
  const Row rows[] = {
      {0.5, 0.5, HeadRole::Referent},   {0.1, 0.1, HeadRole::Referent},  {0.6, 0.0, HeadRole::Subject},
      {0.6, -0.6, HeadRole::Subject},   {0.99, 0.09, HeadRole::Subject}, {0.0, 0.6, HeadRole::Object},
      {-0.6, 0.6, HeadRole::Object},    {0.05, 0.05, HeadRole::None},    {0.15, -0.04, HeadRole::None},
      {-0.3, -0.3, HeadRole::None},
  };
  for (const Row& row : rows) {
    HeadFocus f;
    f.on_subject = row.on_subject;
    f.on_object = row.on_object;
    EXPECT_EQ(to_string(head_role(f)), to_string(row.role)) << row.on_subject << ", " << row.on_object;
  }
  // Every head that prefers the subject on object sentences (on_object < 0.1)
  // is not a referent head, however selective on subject sentences.
  for (double s = -1; s <= 1; s += 0.05)
    for (double o = -1; o < 0.1 - 1e-9; o += 0.05) {
      HeadFocus f;
      f.on_subject = s;
      f.on_object = o;
      EXPECT_NE(head_role(f), HeadRole::Referent) << s << ", " << o;
    }
}

// scipy 1.10: ttest_rel(a, b) and the TOST p from t.sf / t.cdf.
TEST(Statistics, PairedTAndTostMatchScipy) {
  const std::vector<double> a = {0.91, 0.88, 0.95, 0.90, 0.93, 0.87}, b = {0.85, 0.86, 0.90, 0.91, 0.88, 0.80};
  const train::PairedResult p = train::paired_t_test(a, b);
  EXPECT_NEAR(p.t, 3.3028912953790823, 1e-12);
  EXPECT_NEAR(p.p, 0.02140723301526655, 1e-12);
  EXPECT_EQ(p.df, 5);
  EXPECT_NEAR(train::paired_tost(a, b, 0.02).p, 0.9202209272948666, 1e-12);
  EXPECT_EQ(train::paired_t_test({1, 2, 3}, {0, 1, 2}).p, 0.0);  // every difference 1
}

// Holm by hand: m = 4, sorted 0.01, 0.02, 0.03, 0.5 → 0.04, 0.06, 0.06, 0.5.
TEST(Statistics, HolmStepDown) {
  const std::vector<double> h = train::holm({0.03, 0.5, 0.01, 0.02});
  const std::vector<double> want = {0.06, 0.5, 0.04, 0.06};
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(h[i], want[i], 1e-15) << i;
  EXPECT_EQ(train::holm({0.9, 0.8})[0], 1.0);  // capped at 1
}

// scipy's noncentral t gives 0.660 (n = 20) and 2.128 (n = 4); the normal
// approximation is within 0.005 and 0.15 of them.
TEST(Statistics, DetectableEffectOfTwentyPairs) {
  EXPECT_NEAR(train::paired_detectable_effect(20, 0.05), 0.660, 0.005);
  EXPECT_NEAR(train::paired_detectable_effect(4, 0.05), 2.128, 0.15);
}

// SplitMix64's first output from state 0 (Vigna's reference:
// 0xE220A8397B1DCDAF); the learning-speed measures on a small curve.
TEST(Statistics, SplitMixAndCurveMeasures) {
  train::SplitMix64 r{0};
  EXPECT_EQ(r.next(), 0xE220A8397B1DCDAFULL);
  // (0, 0.1) (100, 0.5) (200, 0.9) (400, 1.0): area (30 + 70 + 190)/400.
  EXPECT_NEAR(train::curve_area(0.1, {100, 200, 400}, {0.5, 0.9, 1.0}), 290.0 / 400, 1e-15);
  EXPECT_EQ(train::steps_to_fraction(0.1, {100, 200, 400}, {0.5, 0.9, 1.0}, 0.9), 200);
  const train::BootstrapCI ci = train::bootstrap_mean_ci({1, 1, 1}, 7, 100, 0.95);
  EXPECT_EQ(ci.lower, 1.0);
  EXPECT_EQ(ci.upper, 1.0);
}

}  // namespace
}  // namespace multihead
