// tools/experiment_command.cpp: `multihead experiment`, what several heads
// gain over one (multihead/experiment.hpp), and `--save-model`, which
// trains one run of it and writes the model file `multihead demo` shows.
//
// Standard output: the command that reproduces the run, one line per
// finished run, then the Markdown table. --json writes every number;
// --markdown the table; tools/plot_experiment.py draws the plots from the
// JSON (the command prints how).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "file_flags.hpp"
#include "cli_manners.hpp"
#include "validators.hpp"
#include "multihead/error.hpp"
#include "multihead/experiment.hpp"
#include "multihead/io.hpp"
#include "multihead/lesson_tasks.hpp"

namespace multihead::cli {
namespace {

struct ExperimentArgs {
  ExperimentOptions options;
  std::vector<std::string> positions;  // --positions, parsed into options.positions
  bool quick = false;
  std::string json, markdown, save_model;
};

// --quick: the CI run (tests/cli/experiment_quick.py), well under a minute
// on two cores: the tasks given, 1 and 4 heads, one layer, 4 seeds (the
// fewest that give the statistics something to test), 600 steps.
void apply_quick(ExperimentOptions& o) {
  o.heads = {1, 4};
  o.layers = {1};
  o.seeds = 4;
  o.train.steps = 600;
  o.curve_points = 5;
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

std::string number(double v) { return to_exact_string(v); }

// Every setting that decides the numbers, spelled out (--workers and the
// output paths do not change them).
std::string reproduce(const ExperimentArgs& a) {
  const ExperimentOptions& o = a.options;
  std::string s = "multihead experiment --tasks " + join(o.tasks) + " --heads " + join(o.heads) + " --layers " +
                  join(o.layers) + " --seeds " + std::to_string(o.seeds) + " --first-seed " +
                  std::to_string(o.first_seed) + " --d-model " + std::to_string(o.d_model) + " --ff " +
                  std::to_string(o.ff) + " --steps " + std::to_string(o.train.steps) + " --batch " +
                  std::to_string(o.train.batch) + " --lr " + number(o.train.lr) + " --warmup " +
                  std::to_string(o.train.warmup) + " --curve-points " + std::to_string(o.curve_points);
  if (o.positions.size() != 1 || o.positions[0] != Positions::Sinusoidal) {
    std::vector<std::string> names;
    for (Positions p : o.positions) names.push_back(to_string(p));
    s += " --positions " + join(names);
  }
  if (!a.json.empty()) s += " --json " + a.json;
  if (!a.markdown.empty()) s += " --markdown " + a.markdown;
  return s;
}

void run_save_model(ExperimentArgs& a) {
  ExperimentOptions& o = a.options;
  if (o.tasks.size() != 1 || o.heads.size() != 1 || o.layers.size() != 1)
    throw Error(Error::Kind::Value, "--save-model: expected one --tasks, one --heads and one --layers value, got " +
                                        std::to_string(o.tasks.size()) + ", " + std::to_string(o.heads.size()) +
                                        " and " + std::to_string(o.layers.size()));
  o.seeds = 2;  // validate() wants two; one run is trained
  o.validate();
  o.check_fits(kTrainingMemoryHint);
  check_files({}, {{"--save-model", a.save_model}});
  if (o.positions.size() != 1)
    throw Error(Error::Kind::Value, "--save-model: expected one --positions value, got " +
                                        std::to_string(o.positions.size()));
  const RunSpec spec{o.tasks[0], o.heads[0], o.layers[0], o.first_seed, o.positions[0]};
  std::printf("reproduce: %s\n", run_command(spec, o, a.save_model).c_str());
  // The file records the command with the JSON's placeholder path, not
  // --save-model's: its bytes do not depend on where it is written.
  const std::string command = run_command(spec, o, "run.safetensors");
  std::fflush(stdout);
  std::optional<TrainedModel> model;
  const RunResult r = run_one(spec, o, &model);
  write_outputs({{{"--save-model", a.save_model}, model_file(r, *model, command)}});
  std::printf("saved %s: %s, %lld layer(s), %lld heads, %lld parameters; test accuracy %.1f%%, loss %.4f -> %.4f",
              a.save_model.c_str(), o.tasks[0].c_str(), static_cast<long long>(o.layers[0]),
              static_cast<long long>(o.heads[0]), static_cast<long long>(r.parameters), 100.0 * r.test_accuracy,
              r.first_loss, r.final_loss);
  if (r.has_heads) {
    const HeadRoles& h = r.trained.roles;
    std::printf("; heads: referent %s, subject %s, object %s, adjective %s (best referent selectivity %.2f, "
                "untrained %.2f)",
                head_name(h.referent_layer, h.referent_head).c_str(), head_name(h.subject_layer, h.subject_head).c_str(),
                head_name(h.object_layer, h.object_head).c_str(), head_name(h.adjective_layer, h.adjective_head).c_str(),
                h.referent, r.untrained.roles.referent);
  }
  std::printf("\n");
}

void run_experiment_command(ExperimentArgs& a) {
  for (const auto& [flag, path] : {std::pair<const char*, std::string&>{"--json", a.json},
                                   {"--markdown", a.markdown},
                                   {"--save-model", a.save_model}})
    if (is_stdout(path))
      throw Error(Error::Kind::Value, std::string(flag) +
                                          ": expected a file path, got '-' (standard output carries the progress)");
  a.options.positions.clear();
  for (const std::string& p : a.positions) a.options.positions.push_back(parse_positions(p, "--positions"));
  if (!a.save_model.empty()) return run_save_model(a);
  if (a.quick) apply_quick(a.options);
  a.options.validate();
  a.options.check_fits(kTrainingMemoryHint);
  check_files({}, {{"--json", a.json}, {"--markdown", a.markdown}});
  const std::string command = reproduce(a);
  std::printf("reproduce: %s\n", command.c_str());
  std::fflush(stdout);
  const ExperimentReport rep = run_experiment(a.options, command, [](const RunResult& r, int64_t done, int64_t total) {
    std::printf("[%3lld/%lld] %-7s layers=%lld heads=%lld seed=%llu: test accuracy %5.1f%%, train loss %.3f -> %.3f, "
                "%.1f s\n",
                static_cast<long long>(done), static_cast<long long>(total), r.spec.task.c_str(),
                static_cast<long long>(r.spec.layers), static_cast<long long>(r.spec.heads),
                static_cast<unsigned long long>(r.spec.seed), 100.0 * r.test_accuracy, r.first_loss, r.final_loss,
                r.seconds);
    std::fflush(stdout);
  });
  const std::string md = experiment_markdown(rep);
  std::printf("\n%s\nall %zu runs in %.1f s\n", md.c_str(), rep.runs.size(), rep.seconds);
  std::vector<Output> outputs;
  if (!a.json.empty()) outputs.push_back({{"--json", a.json}, experiment_json(rep)});
  if (!a.markdown.empty()) outputs.push_back({{"--markdown", a.markdown}, md});
  write_outputs(std::move(outputs));
  if (!a.json.empty())
    std::printf("plots: /usr/bin/python3 tools/plot_experiment.py %s --out-dir DIR\n", a.json.c_str());
}

}  // namespace

Runner add_experiment_command(CLI::App& app) {
  auto a = std::make_shared<ExperimentArgs>();
  ExperimentOptions& o = a->options;
  // The default budget (measured on the two-core machine: README).
  o.train.steps = 1500;
  o.train.batch = 32;
  o.train.lr = 2e-3;
  o.train.warmup = 50;
  a->positions = {"sinusoidal"};
  CLI::App* c = app.add_subcommand("experiment", "Measure what several heads gain over one (held-out accuracy, "
                                                 "paired tests with Holm's correction, head selectivity beside "
                                                 "its baselines)");
  c->add_option("--tasks", o.tasks,
                "Tasks, comma-separated: lesson (the lesson's sentence), lookup2 (two lookups), reverse (order)")
      ->delimiter(',');
  c->add_option("--positions", a->positions,
                "Positional encodings, comma-separated (none, sinusoidal, rope, alibi); with several, each is "
                "compared with the first")
      ->delimiter(',')
      ->transform(one_of({"none", "sinusoidal", "rope", "alibi"}));
  c->add_option("--heads", o.heads, "Head counts, comma-separated (each divides --d-model)")->delimiter(',');
  c->add_option("--layers", o.layers, "Layer counts, comma-separated")->delimiter(',');
  c->add_option("--seeds", o.seeds, "Seeds per cell")->check(integer_in(2, 1000, "2 to 1000 seeds"));
  c->add_option("--first-seed", o.first_seed, "The first seed (then +1, +2, ...)")->check(unsigned_integer());
  c->add_option("--d-model", o.d_model, "Model width, the same for every head count")
      ->check(integer_in(1, 4096, "a width of 1 to 4096"));
  c->add_option("--ff", o.ff, "Feed-forward width per block; 0 = none")->check(integer_in(0, 65536, "0 to 65536"));
  c->add_option("--steps", o.train.steps, "Training steps per run")->check(positive_integer());
  c->add_option("--batch", o.train.batch, "Sequences per step")->check(positive_integer());
  c->add_option("--lr", o.train.lr, "Peak learning rate (AdamW, cosine schedule)")->check(positive_number());
  c->add_option("--warmup", o.train.warmup, "Linear warm-up steps")->check(non_negative_integer());
  c->add_option("--curve-points", o.curve_points, "Test accuracy measured this many times per run")
      ->check(integer_in(1, 1000, "1 to 1000"));
  c->add_option("--workers", o.workers, "Runs trained at once, one thread each (the numbers do not depend on it)")
      ->check(integer_in(1, 64, "1 to 64 workers"));
  c->add_flag("--quick", a->quick,
              "The CI run: heads 1,4, one layer, 4 seeds, 600 steps, 5 curve points (replaces those flags; well "
              "under a minute)");
  c->add_option("--json", a->json, "Write every number here (every run's per-seed numbers, curves, head measures, cells, comparisons: "
              "docs/experiment.md)")->check(path());
  c->add_option("--markdown", a->markdown, "Write the Markdown table here")->check(path());
  c->add_option("--save-model", a->save_model,
                "Train one run (one --tasks, --heads, --layers value; seed --first-seed) and write the model file "
                "(safetensors, settings and the command in __metadata__) here")
      ->check(path());
  return [a, c] {
    // Flags that would change nothing in this combination (issue 22).
    const auto given = [c](const char* flag) { return c->get_option(flag)->count() > 0; };
    if (a->quick)
      for (const char* flag : {"--heads", "--layers", "--seeds", "--steps", "--curve-points", "--save-model"})
        if (given(flag))
          throw Error(Error::Kind::Value, std::string(flag) + ": not used with --quick (which sets the heads, layers, "
                                                              "seeds, steps and curve points, and saves no model)");
    if (!a->save_model.empty())
      for (const char* flag : {"--seeds", "--curve-points", "--workers", "--json", "--markdown"})
        if (given(flag))
          throw Error(Error::Kind::Value, std::string(flag) + ": not used with --save-model (one run, seed "
                                                              "--first-seed, is trained and saved)");
    run_experiment_command(*a);
  };
}

}  // namespace multihead::cli
