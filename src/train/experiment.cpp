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
#include <tuple>

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
  throw Error(Error::Kind::Value, field + ": expected " + expected + ", got " + got);
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

// The model one run trains (the task fills in vocabulary and length).
ModelConfig run_model(const RunSpec& spec, const ExperimentOptions& o) {
  ModelConfig m;
  m.d_model = o.d_model;
  m.heads = spec.heads;
  m.layers = spec.layers;
  m.ff = o.ff;
  m.positions = spec.positions;
  return m;
}

}  // namespace

// A list flag names each value once: a repeated one would train its runs
// twice and count each seed twice in the paired tests.
template <class V, class Text>
void each_once(const char* field, const std::vector<V>& values, Text text) {
  for (std::size_t i = 0; i < values.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (values[i] == values[j]) bad(field, "each at most once", text(values[i]) + " twice");
}

std::shared_ptr<const HeldOutTask> held_out_task(const std::string& name) {
  if (name == "reverse") return std::make_shared<HeldOutReverseTask>();
  if (name == "lesson" || name == "lookup2")
    return std::dynamic_pointer_cast<const HeldOutTask>(std::shared_ptr<const Task>(make_task(name, 2, 1)));
  bad("tasks", "lesson, lookup2 or reverse (the tasks with a held-out test set)", quote_input(name));
}

void ExperimentOptions::validate() const {
  auto number = [](int64_t v) { return std::to_string(v); };
  if (tasks.empty()) bad("tasks", "at least one", "none");
  each_once("tasks", tasks, [](const std::string& t) { return quote_input(t); });
  each_once("heads", heads, number);
  each_once("layers", layers, number);
  for (const auto& t : tasks) held_out_task(t);
  if (heads.empty()) bad("heads", "at least one", "none");
  for (int64_t h : heads)
    if (h < 1 || d_model % h != 0)
      bad("heads", "divisors of d_model " + std::to_string(d_model), std::to_string(h));
  if (layers.empty()) bad("layers", "at least one", "none");
  if (positions.empty()) bad("positions", "at least one", "none");
  each_once("positions", positions, [](Positions p) { return to_string(p); });
  for (int64_t l : layers)
    if (l < 1 || l > 16) bad("layers", "1 to 16", std::to_string(l));
  if (seeds < 2) bad("seeds", "at least 2 (a standard deviation needs two)", std::to_string(seeds));
  if (curve_points < 1) bad("curve_points", "at least 1", std::to_string(curve_points));
  if (workers < 1) bad("workers", "at least 1", std::to_string(workers));
  train.validate();
  if (train.steps < 1) bad("steps", "at least 1", std::to_string(train.steps));
  // Every head count and encoding of the grid makes a model the trainer
  // takes (RoPE wants an even head width, for one; the layer count changes
  // nothing there), so no run fails after the others have trained.
  for (const auto& t : tasks) {
    const std::shared_ptr<const HeldOutTask> task = held_out_task(t);
    for (int64_t h : heads)
      for (Positions p : positions) {
        ModelConfig m = run_model({t, h, layers.front(), first_seed, p}, *this);
        m.vocabulary = task->vocabulary();
        m.sequence_length = task->sequence_length();
        m.validate();
      }
  }
}

void ExperimentOptions::check_fits(const std::string& hint) const {
  validate();  // non-empty lists, each value in range
  const int64_t most_layers = *std::max_element(layers.begin(), layers.end());
  for (const auto& t : tasks) {
    const std::shared_ptr<const HeldOutTask> task = held_out_task(t);
    ModelConfig m = run_model({t, heads.front(), most_layers, first_seed, positions.front()}, *this);
    m.vocabulary = task->vocabulary();
    m.sequence_length = task->sequence_length();
    check_training_fits(m, train, hint);
  }
}

HeadRole head_role(const HeadFocus& f) {
  if (f.referent_score() >= kRoleThreshold) return HeadRole::Referent;
  if (f.subject_preference() >= kRoleThreshold) return HeadRole::Subject;
  if (-f.subject_preference() >= kRoleThreshold) return HeadRole::Object;
  return HeadRole::None;
}

bool is_adjective_head(const HeadFocus& f) { return f.adjective_selectivity >= kRoleThreshold; }

std::string to_string(HeadRole role) {
  switch (role) {
    case HeadRole::Referent: return "referent";
    case HeadRole::Subject: return "subject";
    case HeadRole::Object: return "object";
    case HeadRole::None: return "none";
  }
  return "none";
}

std::string head_name(int64_t layer, int64_t head) {
  if (layer < 0 || head < 0) return "none";
  return std::to_string(layer + 1) + "." + std::to_string(head + 1);
}

HeadRoles head_roles(const std::vector<HeadFocus>& focus) {
  HeadRoles r;
  const double lowest = -std::numeric_limits<double>::infinity();
  r.referent = r.adjective = r.subject = lowest;
  double best_referent = lowest, best_subject = lowest, best_object = lowest, best_adjective = lowest;
  for (const HeadFocus& f : focus) {
    r.referent = std::max(r.referent, f.referent_score());
    r.adjective = std::max(r.adjective, f.adjective_selectivity);
    r.subject = std::max(r.subject, f.subject_preference());
    const HeadRole role = head_role(f);
    if (role == HeadRole::Referent) {
      ++r.referent_heads;
      if (f.referent_score() > best_referent) {
        best_referent = f.referent_score();
        r.referent_layer = f.layer;
        r.referent_head = f.head;
      }
    } else if (role == HeadRole::Subject) {
      ++r.subject_heads;
      if (f.subject_preference() > best_subject) {
        best_subject = f.subject_preference();
        r.subject_layer = f.layer;
        r.subject_head = f.head;
      }
    } else if (role == HeadRole::Object) {
      ++r.object_heads;
      if (-f.subject_preference() > best_object) {
        best_object = -f.subject_preference();
        r.object_layer = f.layer;
        r.object_head = f.head;
      }
    }
    if (is_adjective_head(f)) {
      ++r.adjective_heads;
      if (f.adjective_selectivity > best_adjective) {
        best_adjective = f.adjective_selectivity;
        r.adjective_layer = f.layer;
        r.adjective_head = f.head;
      }
    }
  }
  if (focus.empty()) r.referent = r.adjective = r.subject = 0;
  return r;
}

std::vector<HeadFocus> head_focus(const std::vector<Tensor<float>>& attention,
                                  const std::vector<LessonSentence>& sentences) {
  std::vector<HeadFocus> out;
  const int64_t B = static_cast<int64_t>(sentences.size());
  for (std::size_t layer = 0; layer < attention.size(); ++layer) {
    const Tensor<float>& w = attention[layer];  // (B, H, L, L)
    if (w.dim() != 4 || w.size(0) != B || w.size(2) != w.size(3))
      throw Error(Error::Kind::Shape, "head_focus attention[" + std::to_string(layer) + "]: expected (" +
                                          std::to_string(B) + ", H, L, L), got " + shape_to_string(w.shape()));
    const int64_t H = w.size(1), L = w.size(2);
    for (int64_t h = 0; h < H; ++h) {
      HeadFocus f;
      f.layer = static_cast<int64_t>(layer);
      f.head = h;
      int64_t on_subject = 0, on_object = 0;
      for (int64_t b = 0; b < B; ++b) {
        const LessonSentence& s = sentences[static_cast<std::size_t>(b)];
        const float* row = w.data() + ((b * H + h) * L + s.it) * L;
        f.referent += row[s.referent()];
        f.adjective += row[s.adjective];
        f.subject += row[s.subject];
        f.object += row[s.object];
        if (s.refers_to_subject) {
          f.on_subject += double(row[s.subject]) - double(row[s.object]);
          ++on_subject;
        } else {
          f.on_object += double(row[s.object]) - double(row[s.subject]);
          ++on_object;
        }
        // The adjective above the mean of the sentence's other words.
        const int64_t n = static_cast<int64_t>(s.words.size());
        double others = 0;
        for (int64_t j = 0; j < n; ++j)
          if (j != s.adjective) others += row[j];
        f.adjective_selectivity += double(row[s.adjective]) - others / double(n - 1);
      }
      const double count = double(B);
      f.referent /= count;
      f.adjective /= count;
      f.subject /= count;
      f.object /= count;
      f.adjective_selectivity /= count;
      if (on_subject > 0) f.on_subject /= double(on_subject);
      if (on_object > 0) f.on_object /= double(on_object);
      out.push_back(f);
    }
  }
  return out;
}

std::vector<HeadFocus> lesson_head_focus(const TrainedModel& model) {
  const LessonTask task;
  const std::vector<LessonSentence> sentences = task.test_sentences();
  return head_focus(model.evaluate(task.encode(sentences), true).attention, sentences);
}

std::vector<HeadFocus> lesson_head_focus_permuted(const TrainedModel& model, uint64_t seed) {
  const LessonTask task;
  std::vector<LessonSentence> sentences = task.test_sentences();
  const Evaluation e = model.evaluate(task.encode(sentences), true);
  train::SplitMix64 rng{seed};
  const auto below = [&](uint64_t n) { return static_cast<int64_t>(((rng.next() >> 32) * n) >> 32); };
  for (std::size_t i = sentences.size() - 1; i >= 1; --i)
    std::swap(sentences[i].refers_to_subject, sentences[static_cast<std::size_t>(below(i + 1))].refers_to_subject);
  // The adjective's position: one of the sentence's words other than "it",
  // drawn uniformly (sentence by sentence, after the shuffle).
  for (LessonSentence& s : sentences) {
    const int64_t k = below(s.words.size() - 1);
    s.adjective = k < s.it ? k : k + 1;
  }
  return head_focus(e.attention, sentences);
}

namespace {

HeadMeasures measures(std::vector<HeadFocus> focus) {
  HeadMeasures m;
  m.roles = head_roles(focus);
  m.focus = std::move(focus);
  return m;
}

}  // namespace

RunResult run_one(const RunSpec& spec, const ExperimentOptions& o, std::optional<TrainedModel>* model_out) {
  const auto start = std::chrono::steady_clock::now();
  const OneThread one_thread;
  const std::shared_ptr<const HeldOutTask> task = held_out_task(spec.task);
  TrainOptions t = o.train;
  t.seed = spec.seed;
  t.threads = 1;
  Trainer trainer(task, run_model(spec, o), t);
  const Batch test = task->test_set();

  RunResult r;
  r.spec = spec;
  r.has_heads = spec.task == "lesson" && spec.positions != Positions::Rope;
  // Inference on the held-out set with the parameters as they stand (no
  // update, no dropout; the optimiser state is untouched).
  auto test_accuracy = [&] { return TrainedModel::of(trainer, spec.task).evaluate(test, false, 1).accuracy; };
  {
    // The untrained baseline: the same model at step 0.
    const TrainedModel untrained = TrainedModel::of(trainer, spec.task);
    r.untrained_accuracy = untrained.evaluate(test, false, 1).accuracy;
    if (r.has_heads) r.untrained = measures(lesson_head_focus(untrained));
  }
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
  TrainedModel model = TrainedModel::of(trainer, spec.task);
  const Evaluation e = model.evaluate(test, false, 1);
  r.test_loss = e.loss;
  r.test_accuracy = e.accuracy;
  if (!r.curve_test_accuracy.empty()) r.curve_test_accuracy.back() = e.accuracy;
  r.accuracy_area = train::curve_area(r.untrained_accuracy, r.curve_steps, r.curve_test_accuracy);
  r.steps_to_90 = train::steps_to_fraction(r.untrained_accuracy, r.curve_steps, r.curve_test_accuracy, 0.9);
  r.parameters = model.parameter_count();
  if (r.has_heads) {
    r.trained = measures(lesson_head_focus(model));
    r.permuted = measures(lesson_head_focus_permuted(model, kPermutationSeed));
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
         number(o.train.lr) + " --warmup " + std::to_string(o.train.warmup) +
         (spec.positions == Positions::Sinusoidal ? "" : " --positions " + to_string(spec.positions));
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
  if (r.has_heads) {
    const HeadRoles& roles = r.trained.roles;
    extra["referent_head"] = head_name(roles.referent_layer, roles.referent_head);
    extra["subject_head"] = head_name(roles.subject_layer, roles.subject_head);
    extra["object_head"] = head_name(roles.object_layer, roles.object_head);
    extra["adjective_head"] = head_name(roles.adjective_layer, roles.adjective_head);
  }
  return model.serialize(extra);
}

namespace {

// One planned comparison of a against b (paired over seeds); Holm is
// applied per family afterwards.
Comparison compare(const std::string& family, const std::string& task, int64_t layers, const std::string& a,
                   const std::string& b, const std::vector<double>& av, const std::vector<double>& bv, bool tost) {
  Comparison c;
  c.family = family;
  c.task = task;
  c.layers = layers;
  c.a = a;
  c.b = b;
  c.a_values = av;
  c.b_values = bv;
  c.a_mean = train::mean(av);
  c.b_mean = train::mean(bv);
  const train::PairedResult p = train::paired_t_test(av, bv);
  c.mean_difference = p.mean_difference;
  c.sd_difference = p.sd_difference;
  c.t = p.t;
  c.df = p.df;
  c.p = p.p;
  c.dz = p.dz;
  std::vector<double> d(av.size());
  for (std::size_t i = 0; i < av.size(); ++i) d[i] = av[i] - bv[i];
  const train::BootstrapCI ci = train::bootstrap_mean_ci(d, kBootstrapSeed, kBootstrapResamples, 0.95);
  c.ci_lower = ci.lower;
  c.ci_upper = ci.upper;
  if (tost) {
    c.has_tost = true;
    c.tost_margin = kEquivalenceMargin;
    c.tost_p = train::paired_tost(av, bv, kEquivalenceMargin).p;
  }
  return c;
}

void apply_holm(std::vector<Comparison>& all) {
  std::map<std::string, std::vector<std::size_t>> families;
  for (std::size_t i = 0; i < all.size(); ++i) families[all[i].family].push_back(i);
  for (const auto& [family, members] : families) {
    std::vector<double> p, tost;
    for (std::size_t i : members) {
      p.push_back(all[i].p);
      if (all[i].has_tost) tost.push_back(all[i].tost_p);
    }
    const std::vector<double> hp = train::holm(p), ht = train::holm(tost);
    std::size_t k = 0, kt = 0;
    for (std::size_t i : members) {
      all[i].p_holm = hp[k++];
      if (all[i].has_tost) all[i].tost_p_holm = ht[kt++];
    }
  }
}

}  // namespace

ExperimentReport run_experiment(const ExperimentOptions& o, const std::string& command,
                                const std::function<void(const RunResult&, int64_t, int64_t)>& progress) {
  o.validate();
  o.check_fits();
  const auto start = std::chrono::steady_clock::now();
  std::vector<RunSpec> specs;
  for (const auto& task : o.tasks)
    for (int64_t layers : o.layers)
      for (Positions positions : o.positions)
        for (int64_t h : o.heads)
          for (int64_t s = 0; s < o.seeds; ++s)
            specs.push_back({task, h, layers, o.first_seed + uint64_t(s), positions});
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
  // The runs of one cell, in seed order (specs are).
  const auto cell_runs = [&](const std::string& task, int64_t layers, Positions positions, int64_t h) {
    std::vector<const RunResult*> out;
    for (const RunResult& r : rep.runs)
      if (r.spec.task == task && r.spec.layers == layers && r.spec.positions == positions && r.spec.heads == h)
        out.push_back(&r);
    return out;
  };
  using Get = std::function<double(const RunResult&)>;
  const auto values = [](const std::vector<const RunResult*>& rs, const Get& get) {
    std::vector<double> v;
    for (const RunResult* r : rs) v.push_back(get(*r));
    return v;
  };
  const Get accuracy = [](const RunResult& r) { return r.test_accuracy; };
  const Get area = [](const RunResult& r) { return r.accuracy_area; };
  const Get steps90 = [](const RunResult& r) { return double(r.steps_to_90); };
  const bool heads_family = o.heads.size() > 1 && std::count(o.heads.begin(), o.heads.end(), int64_t(1)) > 0;
  for (const auto& task : o.tasks) {
    rep.chance.push_back({task, held_out_task(task)->chance()});
    for (int64_t layers : o.layers)
      for (Positions positions : o.positions)
        for (int64_t h : o.heads) {
          const auto rs = cell_runs(task, layers, positions, h);
          CellSummary c;
          c.task = task;
          c.heads = h;
          c.layers = layers;
          c.positions = positions;
          c.parameters = rs.front()->parameters;
          c.n = static_cast<int64_t>(rs.size());
          const std::vector<double> acc = values(rs, accuracy);
          c.accuracy_mean = train::mean(acc);
          c.accuracy_std = train::stddev(acc);
          c.untrained_accuracy_mean = train::mean(values(rs, [](const RunResult& r) { return r.untrained_accuracy; }));
          c.area_mean = train::mean(values(rs, area));
          c.steps_to_90_mean = train::mean(values(rs, steps90));
          c.final_loss_mean = train::mean(values(rs, [](const RunResult& r) { return r.final_loss; }));
          c.has_heads = rs.front()->has_heads;
          if (c.has_heads) {
            const Get ref = [](const RunResult& r) { return r.trained.roles.referent; };
            const Get ref0 = [](const RunResult& r) { return r.untrained.roles.referent; };
            const Get refp = [](const RunResult& r) { return r.permuted.roles.referent; };
            const Get adj = [](const RunResult& r) { return r.trained.roles.adjective; };
            const Get adj0 = [](const RunResult& r) { return r.untrained.roles.adjective; };
            const Get adjp = [](const RunResult& r) { return r.permuted.roles.adjective; };
            c.referent_mean = train::mean(values(rs, ref));
            c.referent_untrained_mean = train::mean(values(rs, ref0));
            c.referent_permuted_mean = train::mean(values(rs, refp));
            c.adjective_mean = train::mean(values(rs, adj));
            c.adjective_untrained_mean = train::mean(values(rs, adj0));
            c.adjective_permuted_mean = train::mean(values(rs, adjp));
            for (const RunResult* r : rs) {
              c.runs_with_referent_head += r->trained.roles.referent_heads > 0;
              c.runs_with_subject_head += r->trained.roles.subject_heads > 0;
              c.runs_with_object_head += r->trained.roles.object_heads > 0;
            }
            for (auto [family, get, base, base_name] :
                 {std::tuple{"referent_selectivity", ref, ref0, "untrained"},
                  std::tuple{"referent_selectivity", ref, refp, "permuted"},
                  std::tuple{"adjective_selectivity", adj, adj0, "untrained"},
                  std::tuple{"adjective_selectivity", adj, adjp, "permuted"}}) {
              Comparison cmp = compare(family, task, layers, "trained", base_name, values(rs, get), values(rs, base),
                                       false);
              cmp.heads = h;
              cmp.positions = to_string(positions);
              rep.comparisons.push_back(std::move(cmp));
            }
          }
          rep.cells.push_back(c);
          // Every h against h = 1 (same positions).
          if (heads_family && h != 1) {
            const auto one = cell_runs(task, layers, positions, 1);
            const std::string prefix = o.positions.size() > 1 ? to_string(positions) + " " : "";
            for (auto [family, get, tost] : {std::tuple{"final_accuracy", accuracy, true},
                                             std::tuple{"accuracy_area", area, true},
                                             std::tuple{"steps_to_90", steps90, false}}) {
              Comparison cmp = compare(family, task, layers, prefix + "h=" + std::to_string(h), prefix + "h=1",
                                       values(rs, get), values(one, get), tost);
              cmp.positions = to_string(positions);
              rep.comparisons.push_back(std::move(cmp));
            }
          }
          // Every encoding against the first listed (same h).
          if (o.positions.size() > 1 && positions != o.positions.front()) {
            const auto first = cell_runs(task, layers, o.positions.front(), h);
            for (auto [family, get, tost] : {std::tuple{"positions_final_accuracy", accuracy, true},
                                             std::tuple{"positions_accuracy_area", area, true}}) {
              Comparison cmp = compare(family, task, layers, to_string(positions), to_string(o.positions.front()),
                                       values(rs, get), values(first, get), tost);
              cmp.heads = h;
              rep.comparisons.push_back(std::move(cmp));
            }
          }
        }
  }
  apply_holm(rep.comparisons);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return rep;
}

}  // namespace multihead
