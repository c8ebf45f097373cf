// multihead/experiment.hpp: what several heads gain over one, measured
// (`multihead experiment`).
//
// For each task (multihead/lesson_tasks.hpp), each head count h and layer
// count at one d_model (so every h has the same parameters), and each seed:
// train the encoder of multihead/train.hpp with the same budget, then
// measure accuracy on the task's held-out test set (and, as a baseline, the
// same model untrained). Per cell: mean and sample std over seeds. The
// comparisons are fixed in advance: every h against h = 1 (and, with several
// --positions, every encoding against the first) per task and layer count,
// paired over seeds, Holm-corrected per family, with bootstrap CIs and TOST
// (docs/experiment.md). For the lesson task, the head measures: per layer
// and head, the selectivity of the attention from "it" for the referent and
// for the adjective, beside the untrained and label-permuted baselines, and
// the role each head gets from them (head_role).
//
// Every run is a pure function of its settings and seed (train.hpp), so the
// whole report is too; runs go to `workers` threads of one thread each.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "multihead/lesson_tasks.hpp"
#include "multihead/train.hpp"
#include "multihead/trained_model.hpp"

namespace multihead {

struct ExperimentOptions {
  std::vector<std::string> tasks = {"lesson", "lookup2"};
  std::vector<int64_t> heads = {1, 2, 4, 8};
  std::vector<int64_t> layers = {1};  // 2 too: --layers 1,2 (twice the CPU: docs/experiment.md)
  // Positional encodings (ModelConfig::positions); with more than one, each
  // is compared with the first.
  std::vector<Positions> positions = {Positions::Sinusoidal};
  int64_t seeds = 20;
  uint64_t first_seed = 1;        // seeds first_seed … first_seed + seeds − 1
  int64_t d_model = 32;
  int64_t ff = 64;
  TrainOptions train;             // the budget of every run (train.seed is the run's)
  int64_t curve_points = 20;      // test accuracy measured this many times during a run
  int workers = 2;                // runs at once, each on one thread
  void validate() const;          // throws multihead::Error naming the bad field
  // Each task's largest run fits in this machine's memory
  // (check_training_fits, with `hint` at the end of its message);
  // run_experiment checks it before the first run.
  void check_fits(const std::string& hint = "a lower bound; lower batch, d_model or layers") const;
};

// One head's attention from "it" over the lesson task's test sentences.
// The selectivities (docs/experiment.md, "Head measures"):
//  - on_subject: over the sentences whose referent is the subject, the mean
//    of w(subject) − w(object); on_object: over those whose referent is the
//    object, the mean of w(object) − w(subject). A head that tracks the
//    referent is positive on both; a head that always looks at the subject
//    is positive on the first and negative on the second.
//  - adjective: the mean of w(adjective) − the mean w over the sentence's
//    other words (mass on the adjective above a uniform spread).
struct HeadFocus {
  int64_t layer = 0, head = 0;
  double referent = 0;   // mean mass on the referent noun
  double adjective = 0;  // mean mass on the adjective
  double subject = 0, object = 0;  // mean mass on the subject and on the object, whichever is the referent
  double on_subject = 0, on_object = 0;  // referent selectivity on each kind of sentence
  double adjective_selectivity = 0;
  // The referent score: min(on_subject, on_object), as selective as its
  // weaker kind. The subject preference: (on_subject − on_object)/2, the
  // mean of w(subject) − w(object) over both kinds (equal weight).
  double referent_score() const { return on_subject < on_object ? on_subject : on_object; }
  double subject_preference() const { return (on_subject - on_object) / 2; }
};

// A head's role, from its selectivities, the rule in one place (head_role):
//  - Referent: referent_score() >= kRoleThreshold (selective for the
//    referent where it is the subject AND where it is the object);
//  - otherwise Subject: subject_preference() >= kRoleThreshold;
//  - otherwise Object: −subject_preference() >= kRoleThreshold;
//  - otherwise None.
// A head is also an adjective head when adjective_selectivity >= kRoleThreshold.
enum class HeadRole { None, Referent, Subject, Object };
inline constexpr double kRoleThreshold = 0.1;  // attention mass
HeadRole head_role(const HeadFocus& focus);
bool is_adjective_head(const HeadFocus& focus);
std::string to_string(HeadRole role);  // "none", "referent", "subject", "object"

// A run's heads summarised: per role the head with the largest score for it
// (layer and head −1 when no head has the role), the largest scores over
// all heads (the continuous measures reported beside their baselines), and
// how many heads have each role.
struct HeadRoles {
  int64_t referent_layer = -1, referent_head = -1;    // the best Referent head
  int64_t subject_layer = -1, subject_head = -1;      // the best Subject head
  int64_t object_layer = -1, object_head = -1;        // the best Object head
  int64_t adjective_layer = -1, adjective_head = -1;  // the best adjective head
  double referent = 0, adjective = 0;  // max over heads of referent_score() and adjective_selectivity
  double subject = 0;                  // max over heads of subject_preference()
  int64_t referent_heads = 0, subject_heads = 0, object_heads = 0, adjective_heads = 0;
};
HeadRoles head_roles(const std::vector<HeadFocus>& focus);
// "layer.head" counted from 1, or "none".
std::string head_name(int64_t layer, int64_t head);

// The measures from attention weights: per layer (B, H, L, L) over the
// sentences (row b of the batch is sentence b); what lesson_head_focus and
// the tests' hand-made tables use.
std::vector<HeadFocus> head_focus(const std::vector<Tensor<float>>& attention,
                                  const std::vector<LessonSentence>& sentences);
// Per layer, per head, over the lesson task's test sentences.
std::vector<HeadFocus> lesson_head_focus(const TrainedModel& model);
// The label-permutation baseline: the same model and sentences, with the
// sentences' labels permuted: the referent labels (subject or object)
// shuffled among them by a Fisher–Yates shuffle from SplitMix64(seed)
// (j = ((z >> 32)·(i + 1)) >> 32 for i = n − 1 … 1), then in each sentence
// the adjective's position replaced by a word drawn uniformly from the
// others than "it" (k = ((z >> 32)·(n − 1)) >> 32, skipping "it"). A measure
// that does not follow the labels gives the same value as with them.
std::vector<HeadFocus> lesson_head_focus_permuted(const TrainedModel& model, uint64_t seed);
inline constexpr uint64_t kPermutationSeed = 0x5EED0001;

struct RunSpec {
  std::string task;
  int64_t heads = 1, layers = 1;
  uint64_t seed = 0;
  Positions positions = Positions::Sinusoidal;
};

// The head measures of one lesson model, and of its two null baselines.
struct HeadMeasures {
  std::vector<HeadFocus> focus;  // per layer and head
  HeadRoles roles;
};

struct RunResult {
  RunSpec spec;
  int64_t parameters = 0;
  double first_loss = 0;          // step 0's training loss
  double final_loss = 0;          // mean training loss of the last tenth of the steps
  double test_loss = 0, test_accuracy = 0;
  double untrained_accuracy = 0;  // the same model at step 0 (its initial parameters)
  // Learning speed (statistics.hpp): the area under the test-accuracy
  // curve from (0, untrained_accuracy) to the end, divided by the steps,
  // and the first curve step at which the test accuracy reaches 90% of
  // the final one.
  double accuracy_area = 0;
  int64_t steps_to_90 = 0;
  double seconds = 0;
  std::vector<int64_t> curve_steps;         // steps done when measured
  std::vector<double> curve_train_loss;     // mean training loss since the previous point
  std::vector<double> curve_test_accuracy;
  std::vector<double> losses;               // every step's training loss (not in the JSON)
  // Lesson task only (and not with RoPE, whose module returns no weights):
  // the trained model, the same model untrained (step 0, same seed), and
  // the trained model with the test sentences' labels permuted.
  bool has_heads = false;
  HeadMeasures trained, untrained, permuted;
};

// The task an experiment trains and tests by this name: lesson, lookup2,
// or reverse (HeldOutReverseTask: the training command's "reverse" has no
// test set). Throws multihead::Error naming `tasks` for any other name.
std::shared_ptr<const HeldOutTask> held_out_task(const std::string& name);

// One run. When `model` is given it receives the trained model.
RunResult run_one(const RunSpec& spec, const ExperimentOptions& options, std::optional<TrainedModel>* model = nullptr);

// The command that retrains one run by itself and writes its model file
// to `model_path`: "multihead experiment --save-model PATH --tasks … --heads
// … --layers … --first-seed SEED" and the budget's flags.
std::string run_command(const RunSpec& spec, const ExperimentOptions& options, const std::string& model_path);

// What decides a run's last bits besides its settings: the compiler that
// built the library and the SIMD target the kernels dispatch to (e.g.
// "gcc 12.2.0; simd AVX2"). A model file records it: retraining gives the
// same bytes where it is the same.
std::string arithmetic_identity();

// The model file of a run (`multihead experiment --save-model`): the
// parameters, the configuration, and in __metadata__ the command that
// retrains it, its test accuracy, first and final loss, every step's loss
// ("losses": C99 hex floats, exact), the arithmetic_identity() that trained
// it ("arithmetic") and, for the lesson task, the heads head_roles picked
// for each role ("referent_head", "subject_head", "object_head",
// "adjective_head": layer.head counted from 1, or "none").
std::string model_file(const RunResult& run, const TrainedModel& model, const std::string& command);

struct CellSummary {
  std::string task;
  int64_t heads = 0, layers = 0, parameters = 0, n = 0;
  Positions positions = Positions::Sinusoidal;
  double accuracy_mean = 0, accuracy_std = 0;
  double untrained_accuracy_mean = 0;
  double area_mean = 0, steps_to_90_mean = 0;
  double final_loss_mean = 0;
  // Lesson task: the means over seeds of HeadRoles::referent and
  // ::adjective for the trained models and both baselines, and the runs
  // with at least one head of each role (trained).
  bool has_heads = false;
  double referent_mean = 0, referent_untrained_mean = 0, referent_permuted_mean = 0;
  double adjective_mean = 0, adjective_untrained_mean = 0, adjective_permuted_mean = 0;
  int64_t runs_with_referent_head = 0, runs_with_subject_head = 0, runs_with_object_head = 0;
};

// One planned comparison (docs/experiment.md, "Statistics"): a paired test
// of a against b over the seeds (the same seed gives both the same batches
// and, for equal shapes, the same initial parameters' streams), in a family
// whose p-values are Holm-corrected together.
struct Comparison {
  std::string family;   // "final_accuracy", "accuracy_area", "steps_to_90", "referent_selectivity", …
  std::string task;
  int64_t layers = 0;
  int64_t heads = 0;        // the cell's h (0 in the heads families, where a and b name it)
  std::string positions;    // the cell's encoding ("" in the positions families, where a and b name it)
  std::string a, b;     // what is compared, e.g. "h=4" and "h=1", "rope" and "none", "trained" and "untrained"
  double a_mean = 0, b_mean = 0;
  double mean_difference = 0, sd_difference = 0, t = 0, df = 0, p = 1, dz = 0;
  double p_holm = 1;    // Holm over the family
  double ci_lower = 0, ci_upper = 0;  // 95% percentile bootstrap of the mean difference
  bool has_tost = false;
  double tost_margin = 0, tost_p = 1, tost_p_holm = 1;  // equivalence within ±margin, Holm over the family
  std::vector<double> a_values, b_values;  // per seed, in seed order
};

inline constexpr uint64_t kBootstrapSeed = 20261202;
inline constexpr int64_t kBootstrapResamples = 10000;
inline constexpr double kEquivalenceMargin = 0.02;  // two accuracy points

struct ExperimentReport {
  ExperimentOptions options;
  std::string command;            // reproduces it
  std::vector<RunResult> runs;
  std::vector<CellSummary> cells;
  std::vector<Comparison> comparisons;
  std::vector<std::pair<std::string, double>> chance;  // per task, with its reason in markdown
  double seconds = 0;
};

// Runs every (task, layers, heads, positions, seed); progress(run, done,
// total) is called from the calling thread's team as runs finish
// (serialised).
ExperimentReport run_experiment(const ExperimentOptions& options, const std::string& command,
                                const std::function<void(const RunResult&, int64_t, int64_t)>& progress = {});
std::string experiment_markdown(const ExperimentReport& report);
std::string experiment_json(const ExperimentReport& report);

}  // namespace multihead
