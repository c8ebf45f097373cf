// src/train/tasks_lesson.cpp: Task A, the lesson's sentence made a task
// (multihead/lesson_tasks.hpp: LessonTask).
#include <algorithm>
#include <map>
#include <string>

#include "multihead/error.hpp"
#include "multihead/lesson_tasks.hpp"
#include "train/seeds.hpp"

namespace multihead {
namespace {

// Words that are not slots, in vocabulary order after <pad>.
const std::vector<std::string> kFunctionWords = {"the",  "didn't", "because",   "it", "was", "too",
                                                 "that", "saw",    "yesterday", ",",  "want", "to"};

// A uniform index in [0, n) from 64 random bits (Lemire's multiply-shift on
// the top 32 bits, as tasks.cpp).
int uniform(uint64_t bits, int n) {
  return static_cast<int>(((bits >> 32) * static_cast<uint64_t>(n)) >> 32);
}

// The test set's contexts come from this seed, apart from every run's.
constexpr uint64_t kTestSeed = 0x7e57'5e7e'17ull;

// A choice from a stream of random words: draws(k) is the k-th.
template <class Draw>
LessonChoice draw_choice(Draw&& draws) {
  LessonChoice c;
  c.templ = uniform(draws(0), static_cast<int>(LessonTask::templates().size()));
  c.subject = uniform(draws(1), static_cast<int>(LessonTask::subjects().size()));
  c.verb = uniform(draws(2), static_cast<int>(LessonTask::verbs().size()));
  c.object = uniform(draws(3), static_cast<int>(LessonTask::objects().size()));
  c.subject_adjective = (draws(4) >> 63) != 0;
  c.adjective = uniform(draws(5), static_cast<int>(c.subject_adjective ? LessonTask::subject_adjectives().size()
                                                                       : LessonTask::object_adjectives().size()));
  // A distractor other than the subject: one of the other 15 animate nouns.
  const int others = static_cast<int>(LessonTask::subjects().size()) - 1;
  c.distractor = uniform(draws(6), others);
  if (c.distractor >= c.subject) ++c.distractor;
  return c;
}

[[noreturn]] void out_of_range(const char* field, int value, std::size_t size) {
  throw Error(Error::Kind::Value, std::string("lesson sentence ") + field + ": expected an index in [0, " +
                                      std::to_string(size) + "), got " + std::to_string(value));
}

}  // namespace

std::string LessonSentence::text() const {
  std::string s;
  for (const auto& w : words) s += (s.empty() ? "" : " ") + w;
  return s;
}

const std::vector<std::string>& LessonTask::subjects() {
  // Animals, so that "it" is natural for every one of them.
  static const std::vector<std::string> v = {"animal", "dog",  "cat",  "horse", "cow",  "fox",  "goat", "sheep",
                                             "bird",   "mouse", "rabbit", "pig", "duck", "deer", "wolf", "bear"};
  return v;
}
const std::vector<std::string>& LessonTask::verbs() {
  static const std::vector<std::string> v = {"cross", "climb", "enter", "carry", "lift", "move",
                                             "pull",  "push",  "reach", "pass",  "clean", "paint"};
  return v;
}
const std::vector<std::string>& LessonTask::objects() {
  static const std::vector<std::string> v = {"street", "river", "road",  "bridge", "wall", "box",
                                             "table",  "door",  "hill",  "fence",  "rope", "bag",
                                             "rock",   "tree",  "car",   "tower"};
  return v;
}
const std::vector<std::string>& LessonTask::subject_adjectives() {
  static const std::vector<std::string> v = {"tired", "scared", "weak",   "lazy",
                                             "sleepy", "afraid", "nervous", "hungry"};
  return v;
}
const std::vector<std::string>& LessonTask::object_adjectives() {
  static const std::vector<std::string> v = {"wide", "busy", "heavy", "long", "high", "deep", "steep", "slippery"};
  return v;
}
const std::vector<std::vector<std::string>>& LessonTask::templates() {
  static const std::vector<std::vector<std::string>> t = {
      {"the", "S", "didn't", "V", "the", "O", "because", "it", "was", "too", "A"},
      {"yesterday", "the", "S", "didn't", "V", "the", "O", "because", "it", "was", "too", "A"},
      {"the", "S", "that", "the", "D", "saw", "didn't", "V", "the", "O", "because", "it", "was", "too", "A"},
      {"because", "it", "was", "too", "A", ",", "the", "S", "didn't", "V", "the", "O"},
      {"yesterday", "the", "S", "that", "the", "D", "saw", "didn't", "V", "the", "O", "because", "it", "was",
       "too", "A"},
      {"the", "S", "didn't", "want", "to", "V", "the", "O", "because", "it", "was", "too", "A"},
      {"because", "it", "was", "too", "A", ",", "the", "S", "that", "the", "D", "saw", "didn't", "V", "the", "O"},
  };
  return t;
}

LessonTask::LessonTask() {
  vocab_.push_back("<pad>");
  for (const auto* list : {&kFunctionWords, &subjects(), &verbs(), &objects(), &subject_adjectives(),
                           &object_adjectives()})
    vocab_.insert(vocab_.end(), list->begin(), list->end());
}

std::string LessonTask::token(int32_t id) const {
  if (id < 0 || id >= vocabulary())
    throw Error(Error::Kind::Value, "lesson token: expected an id in [0, " + std::to_string(vocabulary()) +
                                        "), got " + std::to_string(id));
  return vocab_[static_cast<std::size_t>(id)];
}

bool LessonTask::held_out_pair(int noun, int adjective) { return (noun + adjective) % 4 == 0; }

bool LessonTask::held_out(const LessonChoice& c) {
  return held_out_pair(c.subject_adjective ? c.subject : c.object, c.adjective);
}

LessonSentence LessonTask::sentence(const LessonChoice& c) const {
  const auto& T = templates();
  if (c.templ < 0 || c.templ >= static_cast<int>(T.size())) out_of_range("template", c.templ, T.size());
  if (c.subject < 0 || c.subject >= static_cast<int>(subjects().size()))
    out_of_range("subject", c.subject, subjects().size());
  if (c.verb < 0 || c.verb >= static_cast<int>(verbs().size())) out_of_range("verb", c.verb, verbs().size());
  if (c.object < 0 || c.object >= static_cast<int>(objects().size()))
    out_of_range("object", c.object, objects().size());
  const auto& adjectives = c.subject_adjective ? subject_adjectives() : object_adjectives();
  if (c.adjective < 0 || c.adjective >= static_cast<int>(adjectives.size()))
    out_of_range("adjective", c.adjective, adjectives.size());
  LessonSentence s;
  s.templ = c.templ;
  s.refers_to_subject = c.subject_adjective;
  const auto& words = T[static_cast<std::size_t>(c.templ)];
  for (const std::string& w : words) {
    const int64_t at = static_cast<int64_t>(s.words.size());
    if (w == "S") {
      s.subject = at;
      s.words.push_back(subjects()[static_cast<std::size_t>(c.subject)]);
    } else if (w == "V") {
      s.words.push_back(verbs()[static_cast<std::size_t>(c.verb)]);
    } else if (w == "O") {
      s.object = at;
      s.words.push_back(objects()[static_cast<std::size_t>(c.object)]);
    } else if (w == "A") {
      s.adjective = at;
      s.words.push_back(adjectives[static_cast<std::size_t>(c.adjective)]);
    } else if (w == "D") {
      if (c.distractor < 0 || c.distractor >= static_cast<int>(subjects().size()))
        out_of_range("distractor", c.distractor, subjects().size());
      if (c.distractor == c.subject)
        throw Error(Error::Kind::Value, "lesson sentence distractor: expected a noun other than the subject '" +
                                            subjects()[static_cast<std::size_t>(c.subject)] + "'");
      s.distractor = at;
      s.words.push_back(subjects()[static_cast<std::size_t>(c.distractor)]);
    } else {
      if (w == "it") s.it = at;
      s.words.push_back(w);
    }
  }
  return s;
}

LessonSentence LessonTask::training_sentence(uint64_t seed, int64_t step, int64_t b) const {
  // Attempt r of sentence b draws its words from counters (b, r, k); a held-out
  // pair (a quarter of the draws) is drawn again, so the accepted sentences
  // are uniform over the training pairs.
  for (uint64_t r = 0;; ++r) {
    const LessonChoice c = draw_choice([&](uint64_t k) {
      return train::stream_value(seed, train::Stream::Data, static_cast<uint64_t>(step),
                                 (static_cast<uint64_t>(b) << 20) | (r << 4) | k);
    });
    if (!held_out(c)) return sentence(c);
  }
}

std::vector<LessonSentence> LessonTask::test_sentences() const {
  std::vector<LessonSentence> out;
  // The lesson's own sentence: template 0, animal, cross, street, tired.
  LessonChoice lesson;
  lesson.templ = 0;
  lesson.subject = 0;
  lesson.verb = 0;
  lesson.object = 0;
  lesson.subject_adjective = true;
  lesson.adjective = 0;
  out.push_back(sentence(lesson));
  uint64_t item = 0;
  for (const bool subject_role : {true, false}) {
    const int nouns = static_cast<int>((subject_role ? subjects() : objects()).size());
    const int adjectives = static_cast<int>((subject_role ? subject_adjectives() : object_adjectives()).size());
    for (int n = 0; n < nouns; ++n)
      for (int a = 0; a < adjectives; ++a) {
        if (!held_out_pair(n, a)) continue;
        for (int k = 0; k < 8; ++k, ++item) {
          // The context (template, verb, other noun, distractor) from the
          // test stream; the held-out pair itself set by hand.
          LessonChoice c = draw_choice([&](uint64_t j) {
            return train::stream_value(kTestSeed, train::Stream::Data, item, j);
          });
          c.subject_adjective = subject_role;
          c.adjective = a;
          (subject_role ? c.subject : c.object) = n;
          if (c.distractor == c.subject) c.distractor = (c.subject + 1) % static_cast<int>(subjects().size());
          out.push_back(sentence(c));
        }
      }
  }
  return out;
}

std::vector<int32_t> LessonTask::ids(const std::vector<std::string>& words) const {
  std::vector<int32_t> out;
  for (const auto& w : words) {
    const auto it = std::find(vocab_.begin(), vocab_.end(), w);
    if (it == vocab_.end() || it == vocab_.begin())
      throw Error(Error::Kind::Value, "lesson sentence: " + quote_input(w) + " is not a word of the task's vocabulary");
    out.push_back(static_cast<int32_t>(it - vocab_.begin()));
  }
  return out;
}

Batch LessonTask::sentence_batch(const std::vector<int32_t>& ids) const {
  const auto n = static_cast<int64_t>(ids.size());
  if (n < 1 || n > kLength)
    throw Error(Error::Kind::Value, "lesson sentence ids: expected 1 to " + std::to_string(kLength) + " ids, got " +
                                        std::to_string(n));
  for (const int32_t id : ids)
    if (id < 1 || id >= vocabulary())
      throw Error(Error::Kind::Value, "lesson sentence ids: expected ids in [1, " + std::to_string(vocabulary()) +
                                          "), got " + std::to_string(id));
  Batch b;
  b.batch = 1;
  b.length = kLength;
  b.tokens.assign(static_cast<std::size_t>(kLength), kPad);
  std::copy(ids.begin(), ids.end(), b.tokens.begin());
  b.targets.assign(static_cast<std::size_t>(kLength), kPad);
  b.mask.assign(static_cast<std::size_t>(kLength), 0);
  return b;
}

Batch LessonTask::encode(const std::vector<LessonSentence>& sentences) const {
  Batch out;
  out.batch = static_cast<int64_t>(sentences.size());
  out.length = kLength;
  const auto count = static_cast<std::size_t>(out.batch * kLength);
  out.tokens.assign(count, kPad);
  out.targets.assign(count, kPad);
  out.mask.assign(count, 0);
  for (std::size_t b = 0; b < sentences.size(); ++b) {
    const LessonSentence& s = sentences[b];
    if (static_cast<int64_t>(s.words.size()) > kLength || s.it < 0 || s.referent() < 0)
      throw Error(Error::Kind::Value, "lesson sentence " + quote_input(s.text()) + ": expected at most " +
                                          std::to_string(kLength) + " words with \"it\" and a referent");
    const std::vector<int32_t> w = ids(s.words);
    const std::size_t row = b * static_cast<std::size_t>(kLength);
    std::copy(w.begin(), w.end(), out.tokens.begin() + static_cast<std::ptrdiff_t>(row));
    out.targets[row + static_cast<std::size_t>(s.it)] = w[static_cast<std::size_t>(s.referent())];
    out.mask[row + static_cast<std::size_t>(s.it)] = 1;
  }
  return out;
}

Batch LessonTask::batch(uint64_t seed, int64_t step, int64_t batch_size) const {
  std::vector<LessonSentence> s;
  s.reserve(static_cast<std::size_t>(batch_size));
  for (int64_t b = 0; b < batch_size; ++b) s.push_back(training_sentence(seed, step, b));
  return encode(s);
}

}  // namespace multihead
