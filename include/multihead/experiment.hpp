// multihead/experiment.hpp: what several heads gain over one, measured
// (`multihead experiment`).
//
// For each task (multihead/lesson_tasks.hpp), each head count h and layer
// count at one d_model (so every h has the same parameters), and each seed:
// train the encoder of multihead/train.hpp with the same budget, then
// measure accuracy on the task's held-out test set. Per cell: mean and
// sample std over seeds; per task and layer count: Welch's t-test between
// h = 1 and the h with the best mean. For the lesson task, the head
// specialisation: per layer and head, the attention mass from "it" to the
// referent noun and to the adjective, averaged over the test set.
//
// Every run is a pure function of its settings and seed (train.hpp), so the
// whole report is too; runs go to `workers` threads of one thread each.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "multihead/train.hpp"
#include "multihead/trained_model.hpp"

namespace multihead {

struct ExperimentOptions {
  std::vector<std::string> tasks = {"lesson", "lookup2"};
  std::vector<int64_t> heads = {1, 2, 4, 8};
  std::vector<int64_t> layers = {1, 2};
  int64_t seeds = 5;
  uint64_t first_seed = 1;        // seeds first_seed … first_seed + seeds − 1
  int64_t d_model = 32;
  int64_t ff = 64;
  TrainOptions train;             // the budget of every run (train.seed is the run's)
  int64_t curve_points = 10;      // test accuracy measured this many times during a run
  int workers = 2;                // runs at once, each on one thread
  void validate() const;          // throws multihead::Error naming the bad field
};

// One head's mean attention from "it" (lesson task, test set).
struct HeadFocus {
  int64_t layer = 0, head = 0;
  double referent = 0;   // mass on the referent noun
  double adjective = 0;  // mass on the adjective
  double subject = 0, object = 0;  // mass on the subject and on the object, whichever is the referent
};

// Which heads the specialisation measure picks: the (layer, head) with the
// most mass on the referent, and the one with the most on the adjective.
struct HeadRoles {
  int64_t referent_layer = 0, referent_head = 0;
  int64_t adjective_layer = 0, adjective_head = 0;
  double referent = 0, adjective = 0;  // their masses
  bool split() const { return referent_layer != adjective_layer || referent_head != adjective_head; }
};
HeadRoles head_roles(const std::vector<HeadFocus>& focus);

// Per layer, per head, the mean attention mass from "it" to the referent
// and to the adjective over the lesson task's test sentences.
std::vector<HeadFocus> lesson_head_focus(const TrainedModel& model);

struct RunSpec {
  std::string task;
  int64_t heads = 1, layers = 1;
  uint64_t seed = 0;
};

struct RunResult {
  RunSpec spec;
  int64_t parameters = 0;
  double first_loss = 0;          // step 0's training loss
  double final_loss = 0;          // mean training loss of the last tenth of the steps
  double test_loss = 0, test_accuracy = 0;
  // Test accuracy early in the run: at the first curve point at or after a
  // fifth of the steps (how fast, beside how far).
  int64_t early_step = 0;
  double early_accuracy = 0;
  double seconds = 0;
  std::vector<int64_t> curve_steps;         // steps done when measured
  std::vector<double> curve_train_loss;     // mean training loss since the previous point
  std::vector<double> curve_test_accuracy;
  std::vector<double> losses;               // every step's training loss (not in the JSON)
  std::vector<HeadFocus> focus;             // lesson task only
  HeadRoles roles;                          // lesson task only
};

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
// it ("arithmetic") and, for the lesson task, the heads the
// specialisation measure picked ("referent_head", "adjective_head":
// layer.head, both counted from 1).
std::string model_file(const RunResult& run, const TrainedModel& model, const std::string& command);

struct CellSummary {
  std::string task;
  int64_t heads = 0, layers = 0, parameters = 0, n = 0;
  double accuracy_mean = 0, accuracy_std = 0;
  double early_mean = 0, early_std = 0;  // RunResult::early_accuracy
  double final_loss_mean = 0;
  // lesson task: seeds whose referent and adjective heads differ, and the
  // mean masses of the heads picked for each role
  int64_t split_runs = 0;
  double referent_mass_mean = 0, adjective_mass_mean = 0;
};

struct Comparison {
  std::string metric;  // "final" (test accuracy at the end) or "early" (RunResult::early_accuracy)
  std::string task;
  int64_t layers = 0, best_heads = 0;
  double one_head_mean = 0, best_mean = 0;
  double t = 0, df = 0, p = 1;  // Welch, best h vs h = 1 (p = 1 and t = 0 when the best is h = 1)
};

struct ExperimentReport {
  ExperimentOptions options;
  std::string command;            // reproduces it
  std::vector<RunResult> runs;
  std::vector<CellSummary> cells;
  std::vector<Comparison> comparisons;
  std::vector<std::pair<std::string, double>> chance;  // per task, with its reason in markdown
  double seconds = 0;
};

// Runs every (task, layers, heads, seed); progress(run, done, total) is
// called from the calling thread's team as runs finish (serialised).
ExperimentReport run_experiment(const ExperimentOptions& options, const std::string& command,
                                const std::function<void(const RunResult&, int64_t, int64_t)>& progress = {});
std::string experiment_markdown(const ExperimentReport& report);
std::string experiment_json(const ExperimentReport& report);

}  // namespace multihead
