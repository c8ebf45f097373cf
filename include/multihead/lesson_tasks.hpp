// multihead/lesson_tasks.hpp: the two tasks of `multihead experiment`, each
// a multihead::Task (train.hpp) with a fixed held-out test set.
//
//  - "lesson" (LessonTask): the lesson's sentence made a task.
//      the ⟨subject⟩ didn't ⟨verb⟩ the ⟨object⟩ because it was too ⟨adjective⟩
//    in seven templates (a fronted "yesterday", a relative clause "that the
//    ⟨distractor⟩ saw" whose noun is never the referent, a fronted "because"
//    clause in which "it" comes before both nouns, "want to"). The adjective
//    decides the referent: an animate one (tired, scared, …) names the
//    subject, an inanimate one (wide, busy, …) the object. The loss counts
//    one position, "it", whose target is the referent noun's own id (not a
//    subject/object bit): the model has to fetch the noun, so attention
//    from "it" to the referent is what the answer is made of.
//    Held out: every sentence whose (referent, adjective) pair is one of a
//    quarter of all pairs (held_out_pair), among them (animal, tired), so
//    "the animal didn't cross the street because it was too tired" is a
//    test sentence that no training batch contains.
//  - "lookup2" (TwoLookupsTask): two lookups at once. Four facts, one per key,
//    token F(key, value), sit at random positions among distractor tokens;
//    the last token is a query Q(a, b) naming two of the keys; the answer,
//    at the query position, is the ordered pair (value(a), value(b)), one
//    of 64 answer tokens. Order matters, so averaging the two facts' values
//    is not enough: the query must fetch both and know which is which.
//    Held out: every sequence whose
//    hash puts it in the test share (1 in 8); training batches skip them.
//
// Both tasks fix their own vocabulary and sequence length.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "multihead/train.hpp"

namespace multihead {

// A task whose held-out sequences never appear in training batches.
class HeldOutTask : public Task {
 public:
  // The held-out test set, the same for every seed.
  virtual Batch test_set() const = 0;
  // The accuracy of a guess that ignores what the task tests (stated with
  // the task: see chance_reason()).
  virtual double chance() const = 0;
  virtual std::string chance_reason() const = 0;
  // The word of token id `id` ("<pad>" for padding).
  virtual std::string token(int32_t id) const = 0;
};

// ---- Task A ------------------------------------------------------------------------
// One sentence of the lesson task, its words and the positions that matter.
struct LessonSentence {
  std::vector<std::string> words;  // without padding
  int templ = 0;                   // index into LessonTask::templates()
  int64_t it = -1;                 // position of "it"
  int64_t subject = -1, object = -1, adjective = -1;
  int64_t distractor = -1;         // the relative clause's noun, -1 when none
  bool refers_to_subject = false;  // the referent rule, from the adjective's class
  int64_t referent() const { return refers_to_subject ? subject : object; }
  std::string text() const;        // words joined by single spaces
};

// The choices that make one sentence (indices into the word lists).
struct LessonChoice {
  int templ = 0;
  int subject = 0, verb = 0, object = 0;
  bool subject_adjective = true;  // which list `adjective` indexes
  int adjective = 0;
  int distractor = 0;             // a subject-list noun, used by templates with a relative clause
};

class LessonTask : public HeldOutTask {
 public:
  static constexpr int64_t kLength = 16;  // the longest template, 16 words
  static constexpr int32_t kPad = 0;

  LessonTask();
  std::string name() const override { return "lesson"; }
  int64_t vocabulary() const override { return static_cast<int64_t>(vocab_.size()); }
  int64_t sequence_length() const override { return kLength; }
  Batch batch(uint64_t seed, int64_t step, int64_t batch_size) const override;
  Batch test_set() const override { return encode(test_sentences()); }
  double chance() const override { return 0.5; }
  std::string chance_reason() const override {
    return "a guess between the subject and the object (half the sentences name each)";
  }
  std::string token(int32_t id) const override;

  // The word lists. Subjects are animate, objects are not.
  static const std::vector<std::string>& subjects();
  static const std::vector<std::string>& verbs();
  static const std::vector<std::string>& objects();
  static const std::vector<std::string>& subject_adjectives();  // "it" = the subject
  static const std::vector<std::string>& object_adjectives();   // "it" = the object
  // Templates as words with slots S, V, O, A, D (distractor).
  static const std::vector<std::vector<std::string>>& templates();

  // Whether (referent noun, adjective) is held out of training: noun index
  // n of its list and adjective index a of its list, held out when
  // (n + a) % 4 == 0. Each noun keeps 6 of its 8 adjectives for training
  // and each adjective 12 of its 16 nouns.
  static bool held_out_pair(int noun, int adjective);
  static bool held_out(const LessonChoice& c);

  // The sentence of a choice. Throws multihead::Error naming the field
  // that is out of range (or a distractor equal to the subject).
  LessonSentence sentence(const LessonChoice& c) const;
  // Training sentence b of a step: uniform choices, a pair that is held out
  // drawn again.
  LessonSentence training_sentence(uint64_t seed, int64_t step, int64_t b) const;
  // The test set: the lesson's sentence first, then 8 sentences for each
  // held-out pair (contexts drawn from a fixed stream), 513 in all.
  std::vector<LessonSentence> test_sentences() const;
  // Ids of the words (throws multihead::Error for a word not in the
  // vocabulary), and the batch of sentences: tokens padded with kPad, the
  // mask 1 at "it" only, its target the referent's id (others kPad).
  std::vector<int32_t> ids(const std::vector<std::string>& words) const;
  Batch encode(const std::vector<LessonSentence>& sentences) const;
  // One sentence of ids (1 to kLength, each a word of the vocabulary) as the
  // model reads it: padded with kPad to kLength, nothing scored (targets
  // kPad, mask 0). What `multihead demo` and `multihead explain` evaluate.
  Batch sentence_batch(const std::vector<int32_t>& ids) const;

 private:
  std::vector<std::string> vocab_;
};

// ---- Task B ------------------------------------------------------------------------
class TwoLookupsTask : public HeldOutTask {
 public:
  static constexpr int kKeys = 4, kValues = 8, kFacts = 4, kNoise = 8;
  static constexpr int64_t kLength = 16;
  static constexpr int32_t kPad = 0;

  std::string name() const override { return "lookup2"; }
  int64_t vocabulary() const override;
  int64_t sequence_length() const override { return kLength; }
  Batch batch(uint64_t seed, int64_t step, int64_t batch_size) const override;
  Batch test_set() const override;  // 512 held-out sequences
  double chance() const override { return 1.0 / (kValues * kValues); }
  std::string chance_reason() const override { return "a guess among the 64 answers"; }
  std::string token(int32_t id) const override;

  // Token ids.
  static int32_t fact(int key, int value);  // F(key, value)
  static int32_t noise(int i);
  static int32_t query(int a, int b);       // Q(a, b), a != b
  static int32_t answer(int r);             // r = 8·value(a) + value(b)
  // The answer of a sequence (its last token the query), or -1 if the
  // sequence has no such query or lacks a queried key.
  static int answer_of(const int32_t* tokens);
  // Whether a sequence is held out (a hash of its tokens, 1 in 8).
  static bool held_out(const int32_t* tokens);
};

// ---- Task C ------------------------------------------------------------------------
// "reverse" with a held-out test set (the positional-encoding experiment's
// order-sensitive task): kLength tokens drawn uniformly from kSymbols, the
// target at position l the token at kLength − 1 − l, every position
// scored. Without positions attention sees a set, so an output can only
// guess the mirrored token (chance 1/kSymbols). Held out: every sequence
// whose hash puts it in the test share (1 in 8); training batches draw
// such a sequence again.
class HeldOutReverseTask : public HeldOutTask {
 public:
  static constexpr int64_t kSymbols = 8, kLength = 8;
  std::string name() const override { return "reverse"; }
  int64_t vocabulary() const override { return kSymbols; }
  int64_t sequence_length() const override { return kLength; }
  Batch batch(uint64_t seed, int64_t step, int64_t batch_size) const override;
  Batch test_set() const override;  // 512 held-out sequences
  double chance() const override { return 1.0 / kSymbols; }
  std::string chance_reason() const override { return "a guess among the 8 symbols"; }
  std::string token(int32_t id) const override { return "s" + std::to_string(id); }
  static bool held_out(const int32_t* tokens);
};

}  // namespace multihead
