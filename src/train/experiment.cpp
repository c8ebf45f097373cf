// src/train/experiment.cpp: the runs of `multihead experiment`
// (multihead/experiment.hpp); experiment_report.cpp writes them up.
#include "multihead/experiment.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>

#include <omp.h>

#include "core/parallel.hpp"
#include "multihead/error.hpp"
#include "multihead/io.hpp"
#include "multihead/lesson_tasks.hpp"
#include "multihead/runtime.hpp"
#include "train/statistics.hpp"

namespace multihead {
namespace {

[[noreturn]] void bad(const std::string& field, const std::string& expected, const std::string& got) {
  throw Error(Error::Kind::Value, "experiment " + field + ": expected " + expected + ", got " + got);
}

// For one run: this thread's OpenMP team size (which BLAS reads) held to
// one, then put back, so a run does the same arithmetic whoever calls it
// (a worker here, `--save-model`, the shipped model's test).
class OneThread {
 public:
  OneThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(saved_); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int saved_;
};

std::shared_ptr<const HeldOutTask> held_out_task(const std::string& name) {
  std::shared_ptr<const Task> t = make_task(name, 2, 1);
  auto h = std::dynamic_pointer_cast<const HeldOutTask>(t);
  if (!h) bad("task", "a task with a held-out test set (lesson, lookup2)", quote_input(name));
  return h;
}

}  // namespace

void ExperimentOptions::validate() const {
  if (tasks.empty()) bad("tasks", "at least one", "none");
  for (const auto& t : tasks) held_out_task(t);
  if (heads.empty()) bad("heads", "at least one", "none");
  for (int64_t h : heads)
    if (h < 1 || d_model % h != 0)
      bad("heads", "divisors of d_model " + std::to_string(d_model), std::to_string(h));
  if (layers.empty()) bad("layers", "at least one", "none");
  for (int64_t l : layers)
    if (l < 1 || l > 16) bad("layers", "1 to 16", std::to_string(l));
  if (seeds < 2) bad("seeds", "at least 2 (a standard deviation needs two)", std::to_string(seeds));
  if (curve_points < 1) bad("curve_points", "at least 1", std::to_string(curve_points));
  if (workers < 1) bad("workers", "at least 1", std::to_string(workers));
  train.validate();
  if (train.steps < 1) bad("steps", "at least 1", std::to_string(train.steps));
}

HeadRoles head_roles(const std::vector<HeadFocus>& focus) {
  HeadRoles r;
  r.referent = r.adjective = -1;
  for (const HeadFocus& f : focus) {
    if (f.referent > r.referent) {
      r.referent = f.referent;
      r.referent_layer = f.layer;
      r.referent_head = f.head;
    }
    if (f.adjective > r.adjective) {
      r.adjective = f.adjective;
      r.adjective_layer = f.layer;
      r.adjective_head = f.head;
    }
  }
  return r;
}

std::vector<HeadFocus> lesson_head_focus(const TrainedModel& model) {
  const LessonTask task;
  const std::vector<LessonSentence> sentences = task.test_sentences();
  const Evaluation e = model.evaluate(task.encode(sentences), true);
  const int64_t H = model.config().heads, L = LessonTask::kLength;
  std::vector<HeadFocus> out;
  for (std::size_t layer = 0; layer < e.attention.size(); ++layer) {
    const Tensor<float>& w = e.attention[layer];  // (B, H, L, L)
    for (int64_t h = 0; h < H; ++h) {
      HeadFocus f;
      f.layer = static_cast<int64_t>(layer);
      f.head = h;
      for (std::size_t b = 0; b < sentences.size(); ++b) {
        const LessonSentence& s = sentences[b];
        const float* row = w.data() + ((static_cast<int64_t>(b) * H + h) * L + s.it) * L;
        f.referent += row[s.referent()];
        f.adjective += row[s.adjective];
        f.subject += row[s.subject];
        f.object += row[s.object];
      }
      const double count = double(sentences.size());
      f.referent /= count;
      f.adjective /= count;
      f.subject /= count;
      f.object /= count;
      out.push_back(f);
    }
  }
  return out;
}

RunResult run_one(const RunSpec& spec, const ExperimentOptions& o, std::optional<TrainedModel>* model_out) {
  const auto start = std::chrono::steady_clock::now();
  const OneThread one_thread;
  const std::shared_ptr<const HeldOutTask> task = held_out_task(spec.task);
  ModelConfig m;
  m.d_model = o.d_model;
  m.heads = spec.heads;
  m.layers = spec.layers;
  m.ff = o.ff;
  TrainOptions t = o.train;
  t.seed = spec.seed;
  t.threads = 1;
  Trainer trainer(task, m, t);
  const Batch test = task->test_set();

  RunResult r;
  r.spec = spec;
  // Inference on the held-out set with the parameters as they stand (no
  // update, no dropout; the optimiser state is untouched).
  auto test_accuracy = [&] { return TrainedModel::of(trainer, spec.task).evaluate(test, false, 1).accuracy; };
  const int64_t steps = t.steps;
  const int64_t tail = std::max<int64_t>(1, steps / 10);
  double window = 0, tail_sum = 0;
  int64_t in_window = 0, next_point = 1;
  for (int64_t step = 0; step < steps; ++step) {
    const StepStats s = trainer.train_step();
    if (!std::isfinite(s.loss))
      throw Error(Error::Kind::Value, "experiment run " + spec.task + " h=" + std::to_string(spec.heads) +
                                          " layers=" + std::to_string(spec.layers) + " seed=" +
                                          std::to_string(spec.seed) + ": loss " + std::to_string(s.loss) +
                                          " at step " + std::to_string(step + 1) + " (try a smaller lr)");
    if (step == 0) r.first_loss = s.loss;
    r.losses.push_back(s.loss);
    if (step >= steps - tail) tail_sum += s.loss;
    window += s.loss;
    ++in_window;
    // Point k of curve_points at step ⌈k·steps/points⌉, the last at `steps`.
    if (step + 1 == (next_point * steps + o.curve_points - 1) / o.curve_points) {
      r.curve_steps.push_back(step + 1);
      r.curve_train_loss.push_back(window / double(in_window));
      r.curve_test_accuracy.push_back(step + 1 == steps ? -1.0 : test_accuracy());
      window = 0;
      in_window = 0;
      ++next_point;
    }
  }
  r.final_loss = tail_sum / double(tail);
  for (std::size_t k = 0; k < r.curve_steps.size(); ++k)
    if (r.curve_steps[k] * 5 >= steps) {
      r.early_step = r.curve_steps[k];
      r.early_accuracy = r.curve_test_accuracy[k];  // the last point is filled in below
      break;
    }
  TrainedModel model = TrainedModel::of(trainer, spec.task);
  const Evaluation e = model.evaluate(test, false, 1);
  r.test_loss = e.loss;
  r.test_accuracy = e.accuracy;
  if (!r.curve_test_accuracy.empty()) r.curve_test_accuracy.back() = e.accuracy;
  if (r.early_step == steps) r.early_accuracy = e.accuracy;
  r.parameters = model.parameter_count();
  if (spec.task == "lesson") {
    r.focus = lesson_head_focus(model);
    r.roles = head_roles(r.focus);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (model_out) model_out->emplace(std::move(model));
  return r;
}

namespace {

std::string number(double v) { return to_exact_string(v); }

std::string exact_list(const std::vector<double>& v) {
  std::string s;
  char buf[64];
  for (double x : v) {
    std::snprintf(buf, sizeof buf, "%a", x);
    s += (s.empty() ? "" : " ") + std::string(buf);
  }
  return s;
}

}  // namespace

std::string run_command(const RunSpec& spec, const ExperimentOptions& o, const std::string& model_path) {
  return "multihead experiment --save-model " + model_path + " --tasks " + spec.task + " --heads " +
         std::to_string(spec.heads) + " --layers " + std::to_string(spec.layers) + " --first-seed " +
         std::to_string(spec.seed) + " --d-model " + std::to_string(o.d_model) + " --ff " + std::to_string(o.ff) +
         " --steps " + std::to_string(o.train.steps) + " --batch " + std::to_string(o.train.batch) + " --lr " +
         number(o.train.lr) + " --warmup " + std::to_string(o.train.warmup);
}

std::string arithmetic_identity() {
#if defined(__clang__)
  const std::string compiler = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  const std::string compiler = std::string("gcc ") + __VERSION__;
#else
  const std::string compiler = "unknown compiler";
#endif
  return compiler + "; simd " + simd_target_current();
}

std::string model_file(const RunResult& r, const TrainedModel& model, const std::string& command) {
  std::map<std::string, std::string> extra = {{"command", command},
                                              {"arithmetic", arithmetic_identity()},
                                              {"test_accuracy", number(r.test_accuracy)},
                                              {"first_loss", number(r.first_loss)},
                                              {"final_loss", number(r.final_loss)},
                                              {"losses", exact_list(r.losses)}};
  if (r.spec.task == "lesson") {
    extra["referent_head"] =
        std::to_string(r.roles.referent_layer + 1) + "." + std::to_string(r.roles.referent_head + 1);
    extra["adjective_head"] =
        std::to_string(r.roles.adjective_layer + 1) + "." + std::to_string(r.roles.adjective_head + 1);
  }
  return model.serialize(extra);
}

ExperimentReport run_experiment(const ExperimentOptions& o, const std::string& command,
                                const std::function<void(const RunResult&, int64_t, int64_t)>& progress) {
  o.validate();
  const auto start = std::chrono::steady_clock::now();
  std::vector<RunSpec> specs;
  for (const auto& task : o.tasks)
    for (int64_t layers : o.layers)
      for (int64_t h : o.heads)
        for (int64_t s = 0; s < o.seeds; ++s) specs.push_back({task, h, layers, o.first_seed + uint64_t(s)});
  // The longest runs first (more layers), so the workers finish together.
  std::vector<std::size_t> order(specs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return specs[a].layers > specs[b].layers; });

  std::vector<RunResult> runs(specs.size());
  std::mutex lock;
  int64_t done = 0;
  const int64_t total = static_cast<int64_t>(specs.size());
  // A run is a whole training: far above any grain.
  detail::parallel_items(total, o.workers, std::numeric_limits<int64_t>::max(), [&](int64_t k) {
    // Each run on this one thread (run_one holds it there).
    const std::size_t i = order[static_cast<std::size_t>(k)];
    RunResult r = run_one(specs[i], o);
    std::lock_guard<std::mutex> g(lock);
    runs[i] = std::move(r);
    ++done;
    if (progress) progress(runs[i], done, total);
  });

  ExperimentReport rep;
  rep.options = o;
  rep.command = command;
  rep.runs = std::move(runs);
  for (const auto& task : o.tasks) {
    rep.chance.push_back({task, held_out_task(task)->chance()});
    for (int64_t layers : o.layers) {
      std::map<int64_t, std::vector<double>> accuracy, early_accuracy;
      for (int64_t h : o.heads) {
        CellSummary c;
        c.task = task;
        c.heads = h;
        c.layers = layers;
        std::vector<double> acc, early, loss, ref, adj;
        for (const RunResult& r : rep.runs) {
          if (r.spec.task != task || r.spec.heads != h || r.spec.layers != layers) continue;
          c.parameters = r.parameters;
          acc.push_back(r.test_accuracy);
          early.push_back(r.early_accuracy);
          loss.push_back(r.final_loss);
          ref.push_back(r.roles.referent);
          adj.push_back(r.roles.adjective);
          if (r.roles.split()) ++c.split_runs;
        }
        c.n = static_cast<int64_t>(acc.size());
        c.accuracy_mean = train::mean(acc);
        c.accuracy_std = train::stddev(acc);
        c.early_mean = train::mean(early);
        c.early_std = train::stddev(early);
        c.final_loss_mean = train::mean(loss);
        if (task == "lesson") {
          c.referent_mass_mean = train::mean(ref);
          c.adjective_mass_mean = train::mean(adj);
        }
        accuracy[h] = acc;
        early_accuracy[h] = early;
        rep.cells.push_back(c);
      }
      if (accuracy.count(1) == 0) continue;  // nothing to compare with
      for (const char* metric : {"final", "early"}) {
        auto& by_heads = std::string(metric) == "final" ? accuracy : early_accuracy;
        Comparison cmp;
        cmp.metric = metric;
        cmp.task = task;
        cmp.layers = layers;
        cmp.best_heads = 1;
        cmp.one_head_mean = train::mean(by_heads[1]);
        cmp.best_mean = cmp.one_head_mean;
        for (const auto& [h, acc] : by_heads)
          if (train::mean(acc) > cmp.best_mean) {
            cmp.best_mean = train::mean(acc);
            cmp.best_heads = h;
          }
        if (cmp.best_heads != 1) {
          const train::WelchResult w = train::welch_t_test(by_heads[cmp.best_heads], by_heads[1]);
          cmp.t = w.t;
          cmp.df = w.df;
          cmp.p = w.p;
        }
        rep.comparisons.push_back(cmp);
      }
    }
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return rep;
}

}  // namespace multihead
