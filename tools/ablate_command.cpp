// tools/ablate_command.cpp: `multihead ablate`, which heads a trained model
// needs (multihead/head_ablation.hpp: Michel, Levy & Neubig 2019): each
// head's importance E|∂L/∂ξ_h|, the test accuracy with each head masked
// alone, and the accuracy as heads are pruned least important first.
//
//   multihead ablate [--model FILE]        one model (default: the shipped one)
//   multihead ablate --grid [...]          train the experiment's grid
//                                          (multihead/experiment.hpp run_one)
//                                          and ablate every run
//
// Standard output: one line per model. --json writes every number (schema
// in docs/experiment.md, "Head ablation"); tools/plot_ablation.py draws it.
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "file_flags.hpp"
#include "lesson_model.hpp"
#include "validators.hpp"
#include "multihead/error.hpp"
#include "multihead/experiment.hpp"
#include "multihead/head_ablation.hpp"
#include "multihead/io.hpp"
#include "multihead/lesson_tasks.hpp"

namespace multihead::cli {
namespace {

struct AblateArgs {
  std::string model, json;
  bool grid = false;
  ExperimentOptions options;
};

// One ablated model and what it is.
struct Ablated {
  std::string source;              // the file, or empty for a grid run
  RunSpec spec;                    // task (and for a grid run heads, layers, seed)
  double trained_accuracy = -1;    // the run's own test accuracy (grid), to cross-check
  HeadAblation a;
};

std::string head_name(int64_t k, int64_t H) { return std::to_string(k / H + 1) + "." + std::to_string(k % H + 1); }

std::string json_number(double v) { return to_exact_string(v); }

template <class T, class F>
std::string json_list(const std::vector<T>& v, F item) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + item(v[i]);
  return s + "]";
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

std::string model_json(const Ablated& m) {
  const HeadAblation& a = m.a;
  const int64_t K = a.layers * a.heads;
  std::vector<std::string> names;
  for (int64_t k = 0; k < K; ++k) names.push_back(head_name(k, a.heads));
  const auto num = [](double v) { return json_number(v); };
  const auto str = [](const std::string& v) { return json_string(v); };
  std::string s = "    {\"task\": " + json_string(m.spec.task) + ", \"heads\": " + std::to_string(a.heads) +
                  ", \"layers\": " + std::to_string(a.layers);
  if (m.source.empty()) s += ", \"seed\": " + std::to_string(m.spec.seed);
  else s += ", \"source\": " + json_string(m.source);
  s += ",\n     \"accuracy\": " + num(a.accuracy) + ", \"no_attention_accuracy\": " + num(a.no_attention_accuracy) +
       ", \"sequences\": " + std::to_string(a.sequences) + ",\n     \"head_names\": " + json_list(names, str) +
       ",\n     \"importance\": " + json_list(a.importance, num) +
       ",\n     \"masked_alone\": " + json_list(a.masked_alone, num) +
       ",\n     \"prune_order\": " + json_list(a.prune_order, [&](int64_t k) { return json_string(head_name(k, a.heads)); }) +
       ",\n     \"pruned_accuracy\": " + json_list(a.pruned_accuracy, num) + "}";
  return s;
}

void print_model(const Ablated& m) {
  const HeadAblation& a = m.a;
  const int64_t K = a.layers * a.heads;
  std::printf("%s h=%lld layers=%lld%s: accuracy %.1f%%, no attention %.1f%%\n", m.spec.task.c_str(),
              static_cast<long long>(a.heads), static_cast<long long>(a.layers),
              m.source.empty() ? (" seed=" + std::to_string(m.spec.seed)).c_str() : (" (" + m.source + ")").c_str(),
              100 * a.accuracy, 100 * a.no_attention_accuracy);
  std::printf("  %-6s %12s %14s\n", "head", "importance", "masked alone");
  for (int64_t k = 0; k < K; ++k)
    std::printf("  %-6s %12.4f %13.1f%%\n", head_name(k, a.heads).c_str(), a.importance[static_cast<std::size_t>(k)],
                100 * a.masked_alone[static_cast<std::size_t>(k)]);
  std::printf("  pruned, least important first:");
  for (int64_t k = 0; k <= K; ++k)
    std::printf(" %s%.1f%%", k ? (head_name(a.prune_order[static_cast<std::size_t>(k - 1)], a.heads) + " ").c_str() : "",
                100 * a.pruned_accuracy[static_cast<std::size_t>(k)]);
  std::printf("\n");
}

std::shared_ptr<const HeldOutTask> held_out(const std::string& name, const TrainedModel& model, const char* flag) {
  std::shared_ptr<const Task> t;
  try {
    t = make_task(name, model.config().vocabulary, model.config().sequence_length);
  } catch (const Error&) {
  }
  auto h = std::dynamic_pointer_cast<const HeldOutTask>(t);
  if (!h || h->vocabulary() != model.config().vocabulary)
    throw Error(Error::Kind::Value, std::string(flag) + ": expected a model of a task with a held-out test set "
                                    "(lesson, lookup2), got task " + quote_input(name) + " with vocabulary " +
                                    std::to_string(model.config().vocabulary));
  return h;
}

template <class T>
std::string join(const std::vector<T>& v) {
  std::string s;
  for (const auto& x : v) {
    if (!s.empty()) s += ",";
    if constexpr (std::is_same_v<T, std::string>) s += x;
    else s += std::to_string(x);
  }
  return s;
}

std::string grid_command(const AblateArgs& a) {
  const ExperimentOptions& o = a.options;
  return "multihead ablate --grid --tasks " + join(o.tasks) + " --heads " + join(o.heads) + " --layers " +
         join(o.layers) + " --seeds " + std::to_string(o.seeds) + " --first-seed " + std::to_string(o.first_seed) +
         " --d-model " + std::to_string(o.d_model) + " --ff " + std::to_string(o.ff) + " --steps " +
         std::to_string(o.train.steps) + " --batch " + std::to_string(o.train.batch) + " --lr " +
         json_number(o.train.lr) + " --warmup " + std::to_string(o.train.warmup);
}

std::vector<Ablated> run_grid(const AblateArgs& a) {
  const ExperimentOptions& o = a.options;
  std::vector<RunSpec> specs;
  for (const auto& task : o.tasks)
    for (int64_t layers : o.layers)
      for (int64_t h : o.heads)
        for (int64_t s = 0; s < o.seeds; ++s) specs.push_back({task, h, layers, o.first_seed + uint64_t(s)});
  std::vector<Ablated> out(specs.size());
  std::atomic<std::size_t> next{0};
  std::mutex lock;
  std::size_t done = 0;
  std::optional<Error> failure;
  apply_threads(1);  // each worker one thread, BLAS included: the numbers do not depend on --workers
  const auto work = [&] {
    for (std::size_t i; (i = next++) < specs.size();) {
      try {
        std::optional<TrainedModel> model;
        const RunResult r = run_one(specs[i], o, &model);
        Ablated m{"", specs[i], r.test_accuracy, ablate_heads(*model, held_out_task(specs[i].task)->test_set())};
        const std::lock_guard<std::mutex> g(lock);
        out[i] = std::move(m);
        ++done;
        std::printf("[%zu/%zu] ", done, specs.size());
        print_model(out[i]);
        std::fflush(stdout);
      } catch (const Error& e) {
        const std::lock_guard<std::mutex> g(lock);
        if (!failure) failure = e;
        next = specs.size();
      }
    }
  };
  std::vector<std::thread> workers;
  for (int w = 0; w < o.workers; ++w) workers.emplace_back(work);
  for (std::thread& t : workers) t.join();
  if (failure) throw *failure;
  return out;
}

void run_ablate(AblateArgs& a, CLI::App* c) {
  const auto given = [c](const char* flag) { return c->get_option(flag)->count() > 0; };
  if (!a.grid) {
    for (const char* flag : {"--tasks", "--heads", "--layers", "--seeds", "--first-seed", "--d-model", "--ff", "--steps",
                             "--batch", "--lr", "--warmup", "--workers"})
      if (given(flag)) throw Error(Error::Kind::Value, std::string(flag) + ": needs --grid (a model file has its own)");
  } else if (!a.model.empty()) {
    throw Error(Error::Kind::Value, "--model: not used with --grid (the grid trains its own models)");
  }
  if (is_stdout(a.json)) throw Error(Error::Kind::Value, "--json: expected a file path, got '-' (standard output carries the summary)");
  std::vector<FileFlag> outputs;
  if (!a.json.empty()) outputs.push_back({"--json", a.json});
  check_files(a.model.empty() ? std::vector<FileFlag>{} : std::vector<FileFlag>{{"--model", a.model}}, outputs);

  std::vector<Ablated> models;
  std::string command;
  if (a.grid) {
    ExperimentOptions check = a.options;
    check.seeds = std::max<int64_t>(2, check.seeds);  // validate() wants two; one seed is an ablation too
    check.validate();
    check.check_fits(kTrainingMemoryHint);
    command = grid_command(a);
    std::printf("reproduce: %s%s\n", command.c_str(), a.json.empty() ? "" : (" --json " + a.json).c_str());
    std::fflush(stdout);
    models = run_grid(a);
  } else {
    const LessonTask lesson;
    const TrainedModel model = a.model.empty() ? load_lesson_model("", lesson) : TrainedModel::load(a.model);
    const std::shared_ptr<const HeldOutTask> task = held_out(model.task(), model, "--model");
    command = "multihead ablate" + (a.model.empty() ? std::string() : " --model " + a.model);
    models.push_back({a.model.empty() ? "models/lesson-heads.safetensors (shipped)" : a.model,
                      {model.task(), model.config().heads, model.config().layers, 0}, -1,
                      ablate_heads(model, task->test_set())});
    print_model(models.back());
  }
  if (a.json.empty()) return;
  std::string j = "{\"command\": " + json_string(command) +
                  ",\n \"method\": \"Michel, Levy and Neubig 2019: importance = mean over the test set's sequences "
                  "of |dL/dxi_h| for a gate xi_h = 1 on head h's output; masked = xi_h = 0; pruning order = "
                  "importance divided by its layer's l2 norm, ascending, computed once\",\n \"models\": [\n";
  for (std::size_t i = 0; i < models.size(); ++i) j += (i ? ",\n" : "") + model_json(models[i]);
  j += "\n ]}\n";
  write_outputs({{{"--json", a.json}, std::move(j)}});
}

}  // namespace

Runner add_ablate_command(CLI::App& app) {
  auto a = std::make_shared<AblateArgs>();
  ExperimentOptions& o = a->options;
  // `multihead experiment`'s default budget (tools/experiment_command.cpp), and 3 seeds.
  o.seeds = 3;
  o.train.steps = 1500;
  o.train.batch = 32;
  o.train.lr = 2e-3;
  o.train.warmup = 50;
  CLI::App* c = app.add_subcommand("ablate", "Which heads a trained model needs: importance, each head masked "
                                             "alone, pruning (Michel et al. 2019)");
  c->add_option("--model", a->model, "A model file (multihead experiment --save-model; default: the shipped one)")
      ->check(path());
  c->add_flag("--grid", a->grid, "Train the experiment's grid (--tasks × --layers × --heads × --seeds) and ablate "
                                 "every run");
  c->add_option("--tasks", o.tasks, "Tasks, comma-separated (--grid)")->delimiter(',');
  c->add_option("--heads", o.heads, "Head counts, comma-separated (--grid)")->delimiter(',');
  c->add_option("--layers", o.layers, "Layer counts, comma-separated (--grid)")->delimiter(',');
  c->add_option("--seeds", o.seeds, "Seeds per cell (--grid)")->check(integer_in(1, 1000, "1 to 1000 seeds"));
  c->add_option("--first-seed", o.first_seed, "The first seed (--grid)")->check(unsigned_integer());
  c->add_option("--d-model", o.d_model, "Model width (--grid)")->check(integer_in(1, 4096, "a width of 1 to 4096"));
  c->add_option("--ff", o.ff, "Feed-forward width per block; 0 = none (--grid)")
      ->check(integer_in(0, 65536, "0 to 65536"));
  c->add_option("--steps", o.train.steps, "Training steps per run (--grid)")->check(positive_integer());
  c->add_option("--batch", o.train.batch, "Sequences per step (--grid)")->check(positive_integer());
  c->add_option("--lr", o.train.lr, "Peak learning rate (--grid)")->check(positive_number());
  c->add_option("--warmup", o.train.warmup, "Linear warm-up steps (--grid)")->check(non_negative_integer());
  c->add_option("--workers", o.workers, "Runs at once, one thread each (--grid; the numbers do not depend on it)")
      ->check(integer_in(1, 64, "1 to 64 workers"));
  c->add_option("--json", a->json, "Write every number here (tools/plot_ablation.py draws it)")->check(path());
  return [a, c] { run_ablate(*a, c); };
}

}  // namespace multihead::cli
