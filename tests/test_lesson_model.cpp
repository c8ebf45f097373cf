// tests/test_lesson_model.cpp: the shipped model, models/lesson-heads.safetensors.
//  - retraining it with the command recorded in its metadata gives the
//    same bytes (the whole file: parameters, metadata, every step's loss);
//  - a 200-step prefix of that run gives the recorded losses to the last
//    bit (the check that also runs under the sanitizers, where the whole
//    run is too slow for a unit test).
//  Both hold where the arithmetic is the recorded one ("arithmetic": the
//  compiler and the SIMD target, e.g. gcc's Release build on AVX2). Another
//  compiler (the clang sanitizer build) may contract a·b + c into an FMA
//  where gcc does not, which legitimately changes the last bits: there the
//  bytes are not compared and the prefix is held to 1e-3 relative per
//  step instead (a wrong model, data stream or schedule is off by far more:
//  step 0 alone depends on every initial weight).
//  - what the demo says about it holds: the lesson's sentence is answered
//    "animal", and the marked heads are what the specialisation measure
//    picks on the test set.
#include <gtest/gtest.h>

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "multihead/error.hpp"
#include "multihead/experiment.hpp"
#include "multihead/io.hpp"
#include "multihead/lesson_tasks.hpp"
#include "multihead/trained_model.hpp"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MULTIHEAD_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define MULTIHEAD_TEST_SANITIZED 1
#endif
#endif

namespace multihead {
namespace {

const std::string kModelPath = std::string(MULTIHEAD_TEST_DATA_DIR) + "/../../models/lesson-heads.safetensors";

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The recorded command ("multihead experiment --save-model PATH --tasks lesson
// --heads 4 …") as the options it sets, parsed here flag by flag; a flag
// this parser does not know fails the test (the command grew a setting the
// test would silently ignore).
struct Recorded {
  ExperimentOptions options;
  RunSpec spec;
};

Recorded parse_command(const std::string& command) {
  Recorded r;
  std::istringstream in(command);
  std::string word, program, sub;
  in >> program >> sub;
  EXPECT_EQ(program + " " + sub, "multihead experiment");
  while (in >> word) {
    std::string value;
    in >> value;
    ExperimentOptions& o = r.options;
    if (word == "--save-model") continue;
    else if (word == "--tasks") o.tasks = {value};
    else if (word == "--heads") o.heads = {std::atoll(value.c_str())};
    else if (word == "--layers") o.layers = {std::atoll(value.c_str())};
    else if (word == "--first-seed") o.first_seed = std::strtoull(value.c_str(), nullptr, 10);
    else if (word == "--d-model") o.d_model = std::atoll(value.c_str());
    else if (word == "--ff") o.ff = std::atoll(value.c_str());
    else if (word == "--steps") o.train.steps = std::atoll(value.c_str());
    else if (word == "--batch") o.train.batch = std::atoll(value.c_str());
    else if (word == "--lr") o.train.lr = std::strtod(value.c_str(), nullptr);
    else if (word == "--warmup") o.train.warmup = std::atoll(value.c_str());
    else if (word == "--positions") o.positions = {parse_positions(value)};
    else ADD_FAILURE() << "the recorded command has a flag this test does not know: " << word;
  }
  r.spec = {r.options.tasks[0], r.options.heads[0], r.options.layers[0], r.options.first_seed,
            r.options.positions[0]};
  return r;
}

const SafetensorsFile& shipped() {
  static const SafetensorsFile f = read_safetensors(kModelPath);
  return f;
}

TEST(LessonModel, ShippedFileIsSmallAndRecordsItsCommand) {
  const std::string bytes = file_bytes(kModelPath);
  EXPECT_LT(bytes.size(), 300u * 1024u) << "the shipped model should stay a few hundred KB at most";
  ASSERT_TRUE(shipped().metadata.count("command"));
  EXPECT_EQ(shipped().metadata.at("format"), "multihead-model-1");
  EXPECT_EQ(shipped().metadata.at("task"), "lesson");
}

bool same_arithmetic() { return shipped().metadata.at("arithmetic") == arithmetic_identity(); }

TEST(LessonModel, RetrainingWithTheRecordedCommandGivesTheSameBytes) {
#ifdef MULTIHEAD_TEST_SANITIZED
  GTEST_SKIP() << "the whole run (1500 steps) is too slow under the sanitizers; "
                  "LessonModel.PrefixOf200StepsGivesTheRecordedLossesToTheLastBit checks its start";
#endif
  if (!same_arithmetic())
    GTEST_SKIP() << "trained with '" << shipped().metadata.at("arithmetic") << "', this build is '"
                 << arithmetic_identity() << "': the bytes may legitimately differ (the prefix test still runs)";
  const std::string command = shipped().metadata.at("command");
  const Recorded rec = parse_command(command);
  std::optional<TrainedModel> model;
  const RunResult r = run_one(rec.spec, rec.options, &model);
  ASSERT_TRUE(model.has_value());
  const std::string again = model_file(r, *model, command), stored = file_bytes(kModelPath);
  ASSERT_EQ(again.size(), stored.size()) << "retrained file size differs";
  std::size_t first = 0;
  while (first < again.size() && again[first] == stored[first]) ++first;
  EXPECT_EQ(first, again.size()) << "retrained bytes differ from byte " << first << " of " << again.size()
                                 << " (command: " << command << ")";
}

TEST(LessonModel, PrefixOf200StepsGivesTheRecordedLossesToTheLastBit) {
  const std::string command = shipped().metadata.at("command");
  const Recorded rec = parse_command(command);
  std::istringstream recorded(shipped().metadata.at("losses"));
  ModelConfig m;
  m.d_model = rec.options.d_model;
  m.heads = rec.spec.heads;
  m.layers = rec.spec.layers;
  m.ff = rec.options.ff;
  TrainOptions t = rec.options.train;
  t.seed = rec.spec.seed;
  t.threads = 1;
  // As run_one trains: one thread, BLAS included.
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  Trainer trainer(make_task(rec.spec.task, 2, 1), m, t);
  const bool exact = same_arithmetic();
  double worst = 0;
  for (int64_t step = 0; step < 200; ++step) {
    std::string want;
    ASSERT_TRUE(static_cast<bool>(recorded >> want)) << "the file records fewer than 200 losses";
    const StepStats s = trainer.train_step();
    char got[64];
    std::snprintf(got, sizeof got, "%a", s.loss);
    const double w = std::strtod(want.c_str(), nullptr);
    worst = std::max(worst, std::fabs(s.loss - w) / std::fabs(w));
    if (exact) {
      ASSERT_EQ(std::string(got), want) << "step " << step << ": loss " << s.loss << " vs recorded " << w;
    } else {
      ASSERT_NEAR(s.loss, w, 1e-3 * std::fabs(w)) << "step " << step << " (arithmetic '" << arithmetic_identity()
                                                  << "', recorded '" << shipped().metadata.at("arithmetic") << "')";
    }
  }
  std::printf("200 steps: %s; worst relative difference %.3g\n", exact ? "bit-identical" : "within 1e-3", worst);
  omp_set_num_threads(saved);
}

TEST(LessonModel, AnswersTheLessonsSentenceAndItsMarkedHeadsAreTheMeasuresPicks) {
  const TrainedModel model = TrainedModel::load(kModelPath);
  const LessonTask task;
  const LessonSentence lesson = task.test_sentences()[0];
  const Evaluation e = model.evaluate(task.encode({lesson}));
  EXPECT_EQ(task.token(e.predictions[static_cast<std::size_t>(lesson.it)]), "animal");
  const HeadRoles roles = head_roles(lesson_head_focus(model));
  EXPECT_EQ(model.metadata().at("referent_head"), head_name(roles.referent_layer, roles.referent_head));
  EXPECT_EQ(model.metadata().at("subject_head"), head_name(roles.subject_layer, roles.subject_head));
  EXPECT_EQ(model.metadata().at("object_head"), head_name(roles.object_layer, roles.object_head));
  EXPECT_EQ(model.metadata().at("adjective_head"), head_name(roles.adjective_layer, roles.adjective_head));
  // The whole held-out test set: the recorded accuracy, recomputed.
  EXPECT_EQ(model.evaluate(task.test_set()).accuracy, std::strtod(model.metadata().at("test_accuracy").c_str(), nullptr));
}

}  // namespace
}  // namespace multihead

// ---- TrainedModel itself ------------------------------------------------------------
namespace multihead {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("multihead-test-" + std::to_string(::getpid()) + "-" + name))
      .string();
}

// A checkpoint loads as a model (optimiser state ignored) and evaluates
// exactly as the trainer's own parameters do; per-head weights come back as
// layers × (B, H, L, L), each row a distribution (sum 1 within 1e-5: float
// softmax over 16 keys).
TEST(TrainedModel, LoadsACheckpointAndReturnsPerHeadWeightsLayers2Heads2) {
  ModelConfig m;
  m.d_model = 16;
  m.heads = 2;
  m.layers = 2;
  m.ff = 8;
  TrainOptions t;
  t.steps = 3;
  t.batch = 4;
  t.threads = 1;
  Trainer trainer(make_task("lesson", 2, 1), m, t);
  for (int i = 0; i < 3; ++i) trainer.train_step();
  const std::string path = temp_path("ck.safetensors");
  trainer.save_checkpoint(path);
  const TrainedModel loaded = TrainedModel::load(path);
  std::filesystem::remove(path);
  const TrainedModel direct = TrainedModel::of(trainer, "lesson");
  const LessonTask task;
  const Batch b = task.encode({task.test_sentences()[0], task.test_sentences()[1]});
  const Evaluation x = loaded.evaluate(b, true), y = direct.evaluate(b, true);
  EXPECT_EQ(loaded.task(), "lesson");
  EXPECT_EQ(x.loss, y.loss);
  EXPECT_EQ(x.predictions, y.predictions);
  ASSERT_EQ(x.attention.size(), 2u);
  for (const Tensor<float>& w : x.attention) {
    ASSERT_EQ(w.shape(), (Shape{2, 2, 16, 16}));
    for (int64_t row = 0; row < 2 * 2 * 16; ++row) {
      double sum = 0;
      for (int64_t j = 0; j < 16; ++j) sum += w[row * 16 + j];
      EXPECT_NEAR(sum, 1.0, 1e-5) << "row " << row;
    }
  }
  // No update happened: evaluating twice gives the same bits.
  EXPECT_EQ(loaded.evaluate(b).loss, x.loss);
}

TEST(TrainedModel, RefusesAFileThatIsNotAModelNamingItAndTheFormat) {
  const std::string path = temp_path("other.safetensors");
  write_safetensors(path, {{"w", Tensor<float>({2}, 1.0f)}}, {{"format", "something-else"}});
  try {
    TrainedModel::load(path);
    ADD_FAILURE() << "loaded a file that is not a model";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("not a multihead model"), std::string::npos) << m;
    EXPECT_NE(m.find("'something-else'"), std::string::npos) << m;
  }
  std::filesystem::remove(path);
  // A model's metadata override is refused by serialize.
  const TrainedModel model = TrainedModel::load(kModelPath);
  EXPECT_THROW(model.serialize({{"heads", "8"}}), Error);
}

// The model file's metadata is read by the checkpoint's rules
// (src/train/checkpoint_metadata.cpp): each value must parse completely, and
// the message names the file, the key, expected and actual.
TEST(TrainedModel, RejectsMetadataThatDoesNotParseNamingKeyAndValue) {
  const SafetensorsFile shipped = read_safetensors(kModelPath);
  std::map<std::string, Tensor<float>> tensors;
  for (const auto& [name, t] : shipped.tensors) tensors[name] = tensor_cast<float>(t.values);
  auto message = [&](const std::string& key, const std::string* value) {
    std::map<std::string, std::string> meta = shipped.metadata;
    if (value) meta[key] = *value;
    else meta.erase(key);
    const std::string bytes = serialize_safetensors(tensors, meta);
    try {
      TrainedModel::parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "m.safetensors");
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), Error::Kind::Format);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string maybe = "maybe", abc = "abc", x32 = "32x";
  EXPECT_EQ(message("heads", nullptr), "'m.safetensors': model metadata lacks 'heads'");
  EXPECT_EQ(message("causal", &maybe), "'m.safetensors': model metadata 'causal': expected true or false, got 'maybe'");
  EXPECT_EQ(message("dropout", &abc), "'m.safetensors': model metadata 'dropout': expected a finite number, got 'abc'");
  EXPECT_EQ(message("d_model", &x32), "'m.safetensors': model metadata 'd_model': expected an integer, got '32x'");
}

// One sentence padded to kLength, nothing scored; sizes and ids outside
// the task are Value errors.
TEST(LessonTask, SentenceBatchPadsToTheTaskLengthAndScoresNothing) {
  const LessonTask task;
  const std::vector<int32_t> ids = task.ids({"the", "animal", "was", "tired"});
  const Batch b = task.sentence_batch(ids);
  EXPECT_EQ(b.batch, 1);
  EXPECT_EQ(b.length, LessonTask::kLength);
  ASSERT_EQ(b.tokens.size(), static_cast<std::size_t>(LessonTask::kLength));
  for (std::size_t i = 0; i < b.tokens.size(); ++i) {
    EXPECT_EQ(b.tokens[i], i < ids.size() ? ids[i] : LessonTask::kPad) << "position " << i;
    EXPECT_EQ(b.targets[i], LessonTask::kPad);
    EXPECT_EQ(b.mask[i], 0);
  }
  EXPECT_THROW(task.sentence_batch({}), Error);
  EXPECT_THROW(task.sentence_batch(std::vector<int32_t>(LessonTask::kLength + 1, ids[0])), Error);
  EXPECT_THROW(task.sentence_batch({ids[0], LessonTask::kPad}), Error);
  EXPECT_THROW(task.sentence_batch({static_cast<int32_t>(task.vocabulary())}), Error);
}

}  // namespace
}  // namespace multihead
